"""Kernel enumeration in rules.py (no Triton needed)."""
import unittest
from unittest import mock

import _paths  # noqa: F401
import rules


class EnumerateKernelsTest(unittest.TestCase):
    def test_sm90_count_and_unique_ids(self):
        specs = rules.enumerate_kernels("sm_90")
        self.assertEqual(len(specs), 24)
        ids = [s.id for s in specs]
        self.assertEqual(len(set(ids)), len(ids))
        self.assertEqual(ids, sorted(ids))
        self.assertIn("attn_fwd-fp16-hd64-causal0-m128n64w4s3-aligned", ids)

    def test_every_arch(self):
        for arch in rules.TARGETS:
            with self.subTest(arch=arch):
                specs = rules.enumerate_kernels(arch)
                self.assertEqual(len(specs), 24)
                backend, target_arch, warp_size = rules.TARGETS[arch]
                for s in specs:
                    self.assertEqual(s.target, {"backend": backend, "arch": target_arch, "warp_size": warp_size})
                    self.assertTrue(s.id.startswith("attn_fwd-"))

    def test_every_functional_has_one_generic(self):
        for arch in rules.TARGETS:
            specs = rules.enumerate_kernels(arch)
            functionals = {tuple(sorted(s.functional.items())) for s in specs}
            self.assertEqual(len(functionals), 8)
            for f in functionals:
                generic = [s for s in specs if tuple(sorted(s.functional.items())) == f and s.variant == "generic"]
                self.assertEqual(len(generic), 1, f)
                aligned = [s for s in specs if tuple(sorted(s.functional.items())) == f and s.variant == "aligned"]
                smallest = min(c.config["BLOCK_M"] for c in aligned)
                self.assertEqual(generic[0].config["BLOCK_M"], smallest)

    def test_divisibility_hints(self):
        ptrs = {"Q", "K", "V", "O", "LSE"}
        for s in rules.enumerate_kernels("sm_90"):
            hinted = {n for n, d in s.divisibility.items() if d == 16}
            if s.variant == "aligned":
                expected = ptrs | {n for n in s.signature
                                          if n.startswith("stride_") and not n.startswith("stride_l")}
                self.assertEqual(hinted, expected, s.id)
                self.assertEqual(len(s.attrs), 5 + 12)  # 5 pointers, 12 Q/K/V/O strides (not LSE's)
            else:
                self.assertEqual(hinted, set(), s.id)
                self.assertEqual(s.attrs, {})
            self.assertEqual(set(s.divisibility.values()) - {1, 16}, set())

    def test_signature_contract(self):
        s = rules.enumerate_kernels("sm_90")[0]
        names = [a["name"] for a in s.args]
        self.assertEqual(names, [
            "Q", "K", "V", "O", "LSE", "sm_scale",
            "stride_qz", "stride_qh", "stride_qm", "stride_kz", "stride_kh", "stride_kn",
            "stride_vz", "stride_vh", "stride_vn", "stride_oz", "stride_oh", "stride_om",
            "stride_lz", "stride_lh", "N_CTX_Q", "N_CTX_K"])
        types = {a["name"]: a["type"] for a in s.args}
        self.assertEqual(types["Q"], "*" + s.functional["dtype"])
        self.assertEqual(types["LSE"], "*fp32")
        self.assertEqual(types["sm_scale"], "fp32")
        for n in ("stride_qz", "stride_qh", "stride_kz", "stride_kh", "stride_vz", "stride_vh",
                  "stride_oz", "stride_oh", "stride_lz", "stride_lh"):
            self.assertEqual(types[n], "i64", n)
        for n in ("stride_qm", "stride_kn", "stride_vn", "stride_om", "N_CTX_Q", "N_CTX_K"):
            self.assertEqual(types[n], "i32", n)
        self.assertEqual(list(s.constexprs), ["HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL"])

    def test_matches_kernel_source(self):
        # The argument list in rules.py must be the kernel's, in order (checked by parsing, no Triton import).
        import ast
        import os
        src = os.path.join(_paths.PYTHON_DIR, rules.ATTN_FWD.module)
        with open(src) as f:
            tree = ast.parse(f.read())
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == rules.ATTN_FWD.function)
        self.assertEqual([a.arg for a in fn.args.args], rules.ATTN_FWD_ARGS)

    def test_unknown_arch(self):
        with self.assertRaises(rules.UnknownArchError) as cm:
            rules.enumerate_kernels("sm_75")
        for known in ("sm_90", "sm_80", "gfx942", "gfx90a"):
            self.assertIn(known, str(cm.exception))
        with self.assertRaises(rules.UnknownArchError):
            rules.parse_arch_list("sm_90;gfx1100")
        self.assertEqual(rules.parse_arch_list("sm_90; sm_80;sm_90"), ["sm_90", "sm_80"])

    def test_head_dims_drive_count(self):
        with mock.patch.dict(rules.ATTN_FWD.axes, {"head_dim": [64, 128, 256]}):
            specs = rules.enumerate_kernels("sm_90")
        self.assertEqual(len(specs), 36)
        self.assertTrue(any("-hd256-" in s.id for s in specs))

    def test_amd_configs_fit(self):
        # AMD: wave64, LDS 64 KiB -> at most 2 stages; checked against the compiled `shared` by test_compile.
        for arch in ("gfx942", "gfx90a"):
            for s in rules.enumerate_kernels(arch):
                self.assertLessEqual(s.config["num_stages"], 2)

    def test_cheap_import(self):
        import subprocess
        import sys
        code = "import sys; sys.path.insert(0, %r); import rules; print('triton' in sys.modules)" % _paths.PYTHON_DIR
        out = subprocess.run([sys.executable, "-B", "-c", code], capture_output=True, text=True, check=True)
        self.assertEqual(out.stdout.strip(), "False")


if __name__ == "__main__":
    unittest.main()
