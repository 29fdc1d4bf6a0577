"""The compile driver end to end: one small sm_90 kernel, its JSON contract, the cache; one gfx942
kernel; the per-arch limits (shared memory / LDS, AMD scratch)."""
import json
import os
import re
import shutil
import tempfile
import unittest
from unittest import mock

import _paths  # noqa: F401
import compile as driver
import rules

ONLY = "attn_fwd-fp16-tf0-hd64-drop0-bias0-m64n64w4s3-generic"

CONTRACT_KEYS = {
    "id", "family", "functional", "config", "variant", "arch", "triton_version", "symbol", "image", "args",
    "constexprs", "shared", "num_warps", "warp_size", "num_ctas", "global_scratch_size", "global_scratch_align",
    "profile_scratch_size", "profile_scratch_align",
}


class OnlySelectionTest(unittest.TestCase):
    def test_alternatives_of_conjunctions(self):
        fp32_base = "attn_fwd-fp32-tf0-hd64-drop0-bias0-m64n32w4s2-aligned"
        fp32_drop = "attn_fwd-fp32-tf0-hd64-drop1-bias0-m64n32w4s2-aligned"
        pre = "attn_bwd_preprocess-fp32-tf0-hd64-m64-aligned"
        only = "-fp32-+-drop0-bias0-,attn_bwd_preprocess-fp32"
        self.assertTrue(driver.selected(fp32_base, only))
        self.assertFalse(driver.selected(fp32_drop, only))
        self.assertTrue(driver.selected(pre, only))
        self.assertTrue(driver.selected(fp32_drop, "drop1"))
        self.assertFalse(driver.selected(fp32_base, ","))  # empty alternatives select nothing


class CompileDriverTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="aotriton-test-compile-")
        cls.out = os.path.join(cls.tmp, "out")
        cls.cache = os.path.join(cls.tmp, "cache")
        cls.log = []
        cls.first = driver.build(["sm_90"], cls.out, cls.cache, jobs=1, only=ONLY, log=cls.log.append)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def arch_dir(self):
        return os.path.join(self.out, "sm_90")

    def test_first_build_compiled(self):
        (st,) = self.first
        self.assertEqual((st.arch, st.kernels, st.compiled, st.cached), ("sm_90", 1, 1, 0))
        self.assertTrue(any(line.startswith("[1/1] compiled " + ONLY + " sm_90") for line in self.log), self.log)
        self.assertTrue(self.log[-1].startswith("sm_90: 1 kernels, 1 compiled, 0 cached, "), self.log)

    def test_kernel_json_contract(self):
        with open(os.path.join(self.arch_dir(), ONLY + ".json")) as f:
            text = f.read()
        info = json.loads(text)
        self.assertEqual(text, json.dumps(info, indent=2, sort_keys=True) + "\n")
        self.assertEqual(set(info), CONTRACT_KEYS)
        self.assertEqual(info["id"], ONLY)
        self.assertEqual(info["family"], "attn_fwd")
        self.assertEqual(info["functional"], {"dtype": "fp16", "tf32": False, "head_dim": 64, "dropout": False,
                                              "bias": False})
        self.assertEqual(info["config"], {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3})
        self.assertEqual(info["variant"], "generic")
        self.assertEqual(info["arch"], "sm_90")
        self.assertEqual(info["triton_version"], driver.triton_version())
        self.assertEqual(info["symbol"], "attn_fwd")
        self.assertEqual(info["image"], ONLY + ".cubin")
        self.assertEqual(info["constexprs"], {"HEAD_DIM": 64, "BLOCK_M": 64, "BLOCK_N": 64, "DROPOUT": False,
                                              "HAS_BIAS": False, "ALLOW_TF32": False, "SOFTCAP": False,
                                              "HAS_ALIBI": False, "HAS_SINKS": False, "HEAD_DIM_V": 0})
        self.assertEqual(info["num_warps"], 4)
        self.assertEqual(info["warp_size"], 32)
        self.assertEqual(info["num_ctas"], 1)
        self.assertGreater(info["shared"], 0)
        for k in ("global_scratch_size", "profile_scratch_size"):
            self.assertIsInstance(info[k], int)
        args = info["args"]
        self.assertEqual([a["name"] for a in args], [n for n in rules.ATTN_FWD.args if n not in rules.ATTN_FWD.constexprs])
        self.assertEqual(args[0], {"name": "Q", "type": "*fp16", "divisibility": 1})
        self.assertEqual(args[4], {"name": "LSE", "type": "*fp32", "divisibility": 1})
        self.assertEqual(args[5], {"name": "BIAS", "type": "*fp16", "divisibility": 1})
        self.assertEqual(args[6], {"name": "ALIBI_SLOPES", "type": "*fp32", "divisibility": 1})
        self.assertEqual(args[7], {"name": "SINKS", "type": "*fp32", "divisibility": 1})
        self.assertEqual(args[8], {"name": "sm_scale", "type": "fp32", "divisibility": 1})
        self.assertEqual(args[9], {"name": "softcap", "type": "fp32", "divisibility": 1})
        self.assertEqual({a["divisibility"] for a in args}, {1})
        types = {a["name"]: a["type"] for a in args}
        for n in ("D_HEAD", "GQA_GROUP", "WINDOW_LEFT", "WINDOW_RIGHT", "ALIGN_BOTTOM_RIGHT", "IS_VARLEN",
                  "STORE_LSE", "STORE_PHILOX"):
            self.assertEqual(types[n], "i32", n)
        self.assertEqual(types["DROPOUT_THRESHOLD"], "u32")
        self.assertEqual(types["PHILOX_SEED"], "*i64")
        self.assertEqual(types["CU_SEQLENS_Q"], "*i32")

    def test_image_and_manifest(self):
        with open(os.path.join(self.arch_dir(), ONLY + ".cubin"), "rb") as f:
            image = f.read()
        self.assertEqual(image[:4], b"\x7fELF")
        self.assertNotIn(os.path.dirname(_paths.PYTHON_DIR).encode(), image, "build path leaked into the image")
        with open(os.path.join(self.arch_dir(), "manifest.json")) as f:
            manifest = json.load(f)
        digest = manifest.pop("digest")
        self.assertEqual(manifest, {"arch": "sm_90", "triton_version": driver.triton_version(),
                                    "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
                                    "kernels": [ONLY + ".json"]})
        self.assertRegex(digest, "^[0-9a-f]{64}$")
        self.assertEqual(sorted(os.listdir(self.arch_dir())), sorted([ONLY + ".json", ONLY + ".cubin", "manifest.json"]))

    def test_rebuild_is_cache_hit(self):
        paths = [os.path.join(self.arch_dir(), n) for n in os.listdir(self.arch_dir())]
        before = {p: os.stat(p).st_mtime_ns for p in paths}
        stale = os.path.join(self.arch_dir(), "attn_fwd-stale.json")
        with open(stale, "w") as f:
            f.write("{}")
        log = []
        (st,) = driver.build(["sm_90"], self.out, self.cache, jobs=1, only=ONLY, log=log.append)
        self.assertEqual((st.compiled, st.cached), (0, 1))
        self.assertEqual(log[-1], st.summary())  # after the tuning database's line, if the repo has one
        self.assertFalse(os.path.exists(stale), "stale file not removed")
        self.assertEqual({p: os.stat(p).st_mtime_ns for p in paths}, before, "a cache hit rewrote output files")

    def test_aligned_loads_are_vectorized(self):
        # The D_HEAD hint (8) keeps the head-dim mask constant over 8 fp16, so the aligned
        # hd128 forward (its main config, whatever rules.py picks) still moves Q/K/V in 16-byte
        # accesses (cp.async 16 / ld.global.v4).
        import subprocess
        import sys
        code = (
            "import sys; sys.path.insert(0, %r)\n"
            "import compile as d, rules\n"
            "d._setup_triton_env(%r)\n"
            "import importlib, triton\n"
            "from triton.backends.compiler import GPUTarget\n"
            "from triton.compiler import ASTSource, make_backend\n"
            "s = max((s for s in rules.enumerate_kernels('sm_90') if s.family == 'attn_fwd' and s.variant == 'aligned'\n"
            "         and s.functional['dtype'] == 'fp16' and s.functional['head_dim'] == 128\n"
            "         and not s.functional['dropout'] and not s.functional['bias']), key=lambda s: s.config['BLOCK_M'])\n"
            "fn = getattr(importlib.import_module(rules.module_name(rules.ATTN_FWD)), s.function)\n"
            "t = GPUTarget('cuda', 90, 32)\n"
            "o = make_backend(t).parse_options(dict(s.options))\n"
            "cc = triton.compile(ASTSource(fn=fn, signature=s.signature, constexprs=s.constexprs, attrs=s.attrs),"
            " target=t, options=o.__dict__)\n"
            "print(cc.asm['ptx'])\n"
        ) % (_paths.PYTHON_DIR, os.path.join(self.tmp, "home"))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        ptx = subprocess.run([sys.executable, "-B", "-c", code], capture_output=True, text=True, check=True,
                             env=env).stdout
        lines = [ln for ln in ptx.splitlines() if "ld.global" in ln or re.search(r"cp\.async\.c[ag]\.", ln)]
        self.assertTrue(lines)
        narrow = [ln for ln in lines if not ("ld.global.v4" in ln or ("cp.async" in ln and "0x10" in ln))]
        # The only scalar loads: CU_SEQLENS_Q[b], [b+1], CU_SEQLENS_K[b], [b+1] (varlen sequence bounds).
        scalar = [ln for ln in narrow if re.fullmatch(r"\s*ld\.global\.b32 \{ %r\d+ \}, \[ %rd\d+ \+ 0 \];", ln)]
        self.assertLessEqual(len(scalar), 4, scalar)
        self.assertEqual([ln for ln in narrow if ln not in scalar], [], "Q/K/V accesses narrower than 16 bytes")

    def test_unknown_arch(self):
        with self.assertRaises(rules.UnknownArchError):
            driver.build(["sm_1"], self.out, self.cache)


class GluonCompileTest(unittest.TestCase):
    """A Gluon kernel through the same driver: GluonASTSource, and the TMA box of every descriptor
    argument in its JSON (the runtime encodes its CUtensorMaps from these)."""

    ONLY = "attn_fwd_gluon-bf16-hd64-"  # [B, H, S, D] and packed-batch (varlen1) kernels, with dropout and without

    def test_descriptor_meta_in_json(self):
        tmp = tempfile.mkdtemp(prefix="aotriton-test-gluon-")
        try:
            (st,) = driver.build(["sm_90"], os.path.join(tmp, "out"), os.path.join(tmp, "cache"), jobs=1,
                                 only=self.ONLY, log=lambda _: None)
            self.assertEqual(st.kernels, 4)
            arch_dir = os.path.join(tmp, "out", "sm_90")
            infos = {}
            for name in os.listdir(arch_dir):
                if name.startswith(self.ONLY) and name.endswith(".json"):
                    with open(os.path.join(arch_dir, name)) as f:
                        infos["varlen1" in name, "drop1" in name] = json.load(f)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.assertEqual(set(infos), {(False, False), (True, False), (False, True), (True, True)})
        for (varlen, _), info in infos.items():
            self.assertIn("PHILOX_SEED", [a["name"] for a in info["args"]])  # the dropout group: always passed
            self.assertEqual(info["family"], "attn_fwd_gluon")
            self.assertEqual(info["num_warps"], 12, "two consumer warpgroups and the loader warp")
            self.assertEqual(info["global_scratch_size"], 0)
            descs = [a for a in info["args"] if a["type"].startswith("tensordesc")]
            self.assertEqual([a["name"] for a in descs], ["desc_q", "desc_k", "desc_v", "desc_o"])
            # packed batches: rank-5 ragged descriptors (kernels/flash_gluon/ragged.py)
            lead = [1, 1, 1] if varlen else [1, 1]
            for a in descs:
                meta = a["tensordesc"]
                self.assertEqual(set(meta), set(driver.TENSORDESC_FIELDS))
                self.assertEqual((meta["swizzle"], meta["elem_size"], meta["elem_type"]), (3, 2, 10))  # 128 B, bf16
                self.assertEqual(len(meta["block_size"]), len(lead) + 2)
            self.assertEqual(descs[0]["tensordesc"]["block_size"], lead + [64, 64])
            for a in info["args"]:
                if not a["type"].startswith("tensordesc"):
                    self.assertNotIn("tensordesc", a)


if __name__ == "__main__":
    unittest.main()


class ArchLimitsTest(unittest.TestCase):
    """The driver refuses kernels that do not fit their arch: shared memory (LDS) above the limit, or
    (AMD) scratch memory, i.e. spilled registers."""

    AMD_TEXT = """
    .amdhsa_kernel attn_bwd_preprocess
        .amdhsa_private_segment_fixed_size {scratch}
        .amdhsa_uses_dynamic_stack 0
    .end_amdhsa_kernel
amdhsa.kernels:
  - .agpr_count:     4
    .private_segment_fixed_size: {scratch}
    .sgpr_count:     95
    .sgpr_spill_count: 3
    .vgpr_count:     80
    .vgpr_spill_count: {spill}
"""

    def spec(self, arch, only):
        (spec,) = [s for s in rules.enumerate_kernels(arch) if only in s.id]
        return spec

    def test_amdgpu_resources(self):
        self.assertEqual(driver.amdgpu_resources(self.AMD_TEXT.format(scratch=16, spill=4)),
                         {"scratch": 16, "dynamic_stack": 0, "vgpr": 80, "agpr": 4, "sgpr": 95, "vgpr_spill": 4,
                          "sgpr_spill": 3})
        with self.assertRaises(driver.BuildError):
            driver.amdgpu_resources("no kernel here")

    def test_check_kernel(self):
        amd = self.spec("gfx942", "attn_bwd_preprocess-fp16-hd64-m128w4s1e2-aligned")
        cuda = self.spec("sm_90", "attn_bwd_preprocess-fp16-hd64-m128w4s1-aligned")
        fine = {"shared": 65536, "amdgpu": driver.amdgpu_resources(self.AMD_TEXT.format(scratch=0, spill=0))}
        self.assertIsNone(driver.check_kernel(amd, fine))
        self.assertIsNone(driver.check_kernel(cuda, {"shared": 232448}))
        why = driver.check_kernel(amd, dict(fine, shared=65537))
        for part in (amd.id, "gfx942", "65537 bytes", "65536-byte limit"):
            self.assertIn(part, why)
        why = driver.check_kernel(self.spec("gfx950", amd.id.split("-m")[0] + "-m128w4s1e2-aligned"),
                                  dict(fine, shared=65537))
        self.assertIsNone(why)  # gfx950: 160 KiB of LDS
        why = driver.check_kernel(cuda, {"shared": 232449})
        self.assertIn("above the 232448-byte limit of sm_90", why)
        spilled = dict(fine, amdgpu=driver.amdgpu_resources(self.AMD_TEXT.format(scratch=16, spill=4)))
        why = driver.check_kernel(amd, spilled)
        for part in (amd.id, "gfx942", "scratch memory (16 bytes per work-item, 4 VGPRs spilled"):
            self.assertIn(part, why)


class AmdCompileTest(unittest.TestCase):
    """One small gfx942 kernel through the driver: hsaco, wave64, waves_per_eu in id, config and options,
    its resource usage in the cache entry; the LDS limit enforced on cache hits too."""

    ONLY = "attn_bwd_preprocess-fp16-hd16-"

    def test_gfx942_kernel(self):
        tmp = tempfile.mkdtemp(prefix="aotriton-test-amd-")
        try:
            out, cache = os.path.join(tmp, "out"), os.path.join(tmp, "cache")
            (st,) = driver.build(["gfx942"], out, cache, jobs=1, only=self.ONLY + "m128w4s1e2-aligned",
                                 log=lambda _: None)
            self.assertEqual((st.kernels, st.compiled), (1, 1))
            arch_dir = os.path.join(out, "gfx942")
            (name,) = [n for n in os.listdir(arch_dir) if n.startswith(self.ONLY) and n.endswith(".json")]
            with open(os.path.join(arch_dir, name)) as f:
                info = json.load(f)
            self.assertEqual(set(info), CONTRACT_KEYS)
            self.assertEqual(info["config"], {"BLOCK_M": 128, "num_warps": 4, "num_stages": 1, "waves_per_eu": 2})
            self.assertEqual((info["warp_size"], info["num_warps"]), (64, 4))
            with open(os.path.join(arch_dir, info["image"]), "rb") as f:
                self.assertEqual(f.read()[:4], b"\x7fELF")
            (meta,) = [os.path.join(r, n) for r, _, ns in os.walk(cache) for n in ns
                       if n.endswith(".json") and not n.startswith(".")]
            with open(meta) as f:
                amd = json.load(f)["metadata"]["amdgpu"]
            self.assertEqual((amd["scratch"], amd["vgpr_spill"], amd["dynamic_stack"]), (0, 0, 0))
            self.assertGreater(amd["vgpr"], 0)
            # The limit applies to cached kernels too: lower it below this kernel's `shared` and rebuild.
            with mock.patch.dict(rules.SHARED_MEMORY_LIMIT, {"gfx942": info["shared"] - 1}):
                with self.assertRaises(driver.BuildError) as cm:
                    driver.build(["gfx942"], out, cache, jobs=1, only=info["id"], log=lambda _: None)
            self.assertIn(info["id"] + " (gfx942)", str(cm.exception))
            self.assertIn(f"{info['shared']} bytes of shared memory", str(cm.exception))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
