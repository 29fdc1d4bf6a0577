"""The private Gluon/Triton API of the Gluon backward still works (CPU only: compile for sm_90, read PTX).

``kernels/flash_gluon/private_api.py`` wraps builder entry points that Triton does not export
(the TMA reduce-add behind the dQ reducer of ``bwd.py``).  A Triton bump can rename or drop
them silently; this test compiles a tiny Gluon kernel that uses every entry of
``private_api.__all__`` for sm_90 (``triton.compile``, no GPU needed) and checks the PTX has the
bulk tensor reduce-add.  If it fails, read the docstring of ``private_api.py`` ("On a Triton
bump, re-check") before touching ``bwd.py``.
"""
import os
import shutil
import tempfile
import unittest

import _paths  # noqa: F401


class GluonPrivateApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cache = tempfile.mkdtemp(prefix="aotriton-test-gluon-private-")
        cls._old_cache = os.environ.get("TRITON_CACHE_DIR")
        os.environ["TRITON_CACHE_DIR"] = cls.cache

    @classmethod
    def tearDownClass(cls):
        if cls._old_cache is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = cls._old_cache
        shutil.rmtree(cls.cache, ignore_errors=True)

    def compile_probe(self):
        try:
            import triton
            from triton.backends.compiler import GPUTarget
            from triton.compiler import make_backend
            from triton.experimental import gluon
            from triton.experimental.gluon import language as gl
            from triton.experimental.gluon._runtime import GluonASTSource
            from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

            from kernels.flash_gluon import private_api
        except Exception as e:  # noqa: BLE001
            self.fail(f"importing Gluon or kernels/flash_gluon/private_api.py failed after a Triton change? "
                      f"{type(e).__name__}: {e}")
        self.assertEqual(sorted(private_api.__all__), ["tma_reduce_add"],
                         "private_api.py gained or lost an entry: extend this test to use every entry")

        @gluon.jit
        def probe(desc):
            # fp32 tile of the descriptor's block, zeroed, then reduce-added into global memory.
            layout: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0])
            smem = gl.allocate_shared_memory(gl.float32, desc.block_type.shape, desc.layout)
            smem.store(gl.zeros([64, 64], gl.float32, layout))
            fence_async_shared()
            private_api.tma_reduce_add(desc, [64, 0], smem)
            tma.store_wait(0)

        target = GPUTarget("cuda", 90, 32)
        layout = gl.NVMMASharedLayout.get_default_for([64, 64], gl.float32)
        signature = {"desc": f"tensordesc<fp32[64, 64],{layout!r}>"}
        src = GluonASTSource(fn=probe, signature=signature, constexprs={}, attrs={})
        options = make_backend(target).parse_options({"num_warps": 4})
        try:
            return triton.compile(src, target=target, options=options.__dict__)
        except Exception as e:  # noqa: BLE001
            self.fail("compiling a Gluon kernel that uses kernels/flash_gluon/private_api.py failed; if the error "
                      "points into private_api.py, the private Triton API it wraps "
                      "(GluonOpBuilder.create_async_tma_reduce, DESCRIPTOR_REDUCE_KIND.ADD) changed: see its "
                      f"docstring.  {type(e).__name__}: "
                      f"{' | '.join(str(e).strip().splitlines()[-6:])}")

    def test_tma_reduce_add_lowers_to_bulk_tensor_reduce_add(self):
        ptx = self.compile_probe().asm["ptx"]
        reduces = [line.strip() for line in ptx.splitlines() if "cp.reduce.async.bulk.tensor" in line]
        self.assertTrue(reduces, "private_api.tma_reduce_add no longer emits cp.reduce.async.bulk.tensor on sm_90")
        self.assertTrue(all(".add" in line for line in reduces),
                        f"private_api.tma_reduce_add emits a reduce that is not an add: {reduces}")


if __name__ == "__main__":
    unittest.main()
