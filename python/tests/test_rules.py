"""Kernel enumeration in rules.py (no Triton needed)."""
import ast
import os
import unittest
from unittest import mock

import _paths  # noqa: F401
import rules

FAMILY_COUNTS_SM90 = {
    # dtype x head_dim x windowed x (2 aligned + 1 generic)
    "attn_fwd": 2 * 5 * 2 * 3,
    # dtype x head_dim x (1 aligned + 1 generic)
    "attn_bwd_preprocess": 2 * 5 * 2,
    # dtype x head_dim x windowed x (1 aligned + 1 generic)
    "attn_bwd_dkdv": 2 * 5 * 2 * 2,
    "attn_bwd_dq": 2 * 5 * 2 * 2,
}

CONTRACT = {
    "attn_fwd": [
        "Q", "K", "V", "O", "LSE", "sm_scale",
        "stride_qz", "stride_qh", "stride_qm", "stride_kz", "stride_kh", "stride_kn",
        "stride_vz", "stride_vh", "stride_vn", "stride_oz", "stride_oh", "stride_om",
        "stride_lz", "stride_lh",
        "N_CTX_Q", "N_CTX_K", "D_HEAD", "GQA_GROUP", "WINDOW_LEFT", "WINDOW_RIGHT", "DIAG_OFFSET", "STORE_LSE",
        "HEAD_DIM", "BLOCK_M", "BLOCK_N", "WINDOWED"],
    "attn_bwd_preprocess": [
        "O", "DO", "DELTA",
        "stride_oz", "stride_oh", "stride_om", "stride_doz", "stride_doh", "stride_dom",
        "stride_deltaz", "stride_deltah",
        "N_CTX_Q", "D_HEAD",
        "HEAD_DIM", "BLOCK_M"],
    "attn_bwd_dkdv": [
        "Q", "K", "V", "DO", "LSE", "DELTA", "DK", "DV", "sm_scale",
        "stride_qz", "stride_qh", "stride_qm", "stride_kz", "stride_kh", "stride_kn",
        "stride_vz", "stride_vh", "stride_vn", "stride_doz", "stride_doh", "stride_dom",
        "stride_lz", "stride_lh", "stride_deltaz", "stride_deltah",
        "stride_dkz", "stride_dkh", "stride_dkn", "stride_dvz", "stride_dvh", "stride_dvn",
        "N_CTX_Q", "N_CTX_K", "D_HEAD", "GQA_GROUP", "WINDOW_LEFT", "WINDOW_RIGHT", "DIAG_OFFSET",
        "HEAD_DIM", "BLOCK_M", "BLOCK_N", "WINDOWED"],
    "attn_bwd_dq": [
        "Q", "K", "V", "DO", "LSE", "DELTA", "DQ", "sm_scale",
        "stride_qz", "stride_qh", "stride_qm", "stride_kz", "stride_kh", "stride_kn",
        "stride_vz", "stride_vh", "stride_vn", "stride_doz", "stride_doh", "stride_dom",
        "stride_lz", "stride_lh", "stride_deltaz", "stride_deltah",
        "stride_dqz", "stride_dqh", "stride_dqm",
        "N_CTX_Q", "N_CTX_K", "D_HEAD", "GQA_GROUP", "WINDOW_LEFT", "WINDOW_RIGHT", "DIAG_OFFSET",
        "HEAD_DIM", "BLOCK_M", "BLOCK_N", "WINDOWED"],
}
CONSTEXPRS = {"HEAD_DIM", "BLOCK_M", "BLOCK_N", "WINDOWED"}
DATA_TENSORS = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}
ROW_STRIDES = {"stride_qm", "stride_kn", "stride_vn", "stride_om", "stride_dom", "stride_dqm", "stride_dkn",
               "stride_dvn"}


def _functional_key(spec):
    return spec.family, tuple(sorted(spec.functional.items()))


class EnumerateKernelsTest(unittest.TestCase):
    def test_sm90_counts_and_unique_ids(self):
        specs = rules.enumerate_kernels("sm_90")
        counts = {}
        for s in specs:
            counts[s.family] = counts.get(s.family, 0) + 1
        self.assertEqual(counts, FAMILY_COUNTS_SM90)
        ids = [s.id for s in specs]
        self.assertEqual(len(set(ids)), len(ids))
        self.assertEqual(ids, sorted(ids))
        for example in ("attn_fwd-fp16-hd64-win0-m128n64w4s3-aligned",
                        "attn_fwd-bf16-hd16-win1-m64n64w4s3-generic",
                        "attn_bwd_preprocess-fp16-hd256-m32w4s1-aligned",
                        "attn_bwd_dkdv-bf16-hd128-win1-m32n64w8s2-aligned",
                        "attn_bwd_dq-fp16-hd32-win0-m64n64w4s3-generic"):
            self.assertIn(example, ids)

    def test_families_and_axes(self):
        self.assertEqual([f.name for f in rules.FAMILIES],
                         ["attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"])
        self.assertEqual(rules.HEAD_DIMS, [16, 32, 64, 128, 256])
        axes = {f.name: f.axes for f in rules.FAMILIES}
        full = {"dtype": ["fp16", "bf16"], "head_dim": [16, 32, 64, 128, 256], "windowed": [False, True]}
        for name in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"):
            self.assertEqual(list(axes[name]), ["dtype", "head_dim", "windowed"], name)
            self.assertEqual(axes[name], full, name)
        self.assertEqual(list(axes["attn_bwd_preprocess"]), ["dtype", "head_dim"])
        for f in rules.FAMILIES:
            self.assertEqual(f.module, f"kernels/flash/{ {'attn_fwd': 'fwd'}.get(f.name, f.name[5:]) }.py")

    def test_every_arch(self):
        for arch in rules.TARGETS:
            with self.subTest(arch=arch):
                specs = rules.enumerate_kernels(arch)
                self.assertEqual(len(specs), sum(FAMILY_COUNTS_SM90.values()))
                backend, target_arch, warp_size = rules.TARGETS[arch]
                for s in specs:
                    self.assertEqual(s.target, {"backend": backend, "arch": target_arch, "warp_size": warp_size})

    def test_every_functional_has_one_generic(self):
        for arch in rules.TARGETS:
            specs = rules.enumerate_kernels(arch)
            keys = {_functional_key(s) for s in specs}
            self.assertEqual(len(keys), 20 + 10 + 20 + 20)
            for key in keys:
                mine = [s for s in specs if _functional_key(s) == key]
                generic = [s for s in mine if s.variant == "generic"]
                aligned = [s for s in mine if s.variant == "aligned"]
                self.assertEqual(len(generic), 1, key)
                self.assertEqual(len(aligned), 2 if key[0] == "attn_fwd" else 1, key)
                self.assertEqual(generic[0].config["BLOCK_M"], min(s.config["BLOCK_M"] for s in aligned))
                if key[0] == "attn_fwd":  # largest BLOCK_M first
                    cfgs = rules.family(key[0]).configs(arch, dict(key[1]))
                    self.assertGreater(cfgs[0]["BLOCK_M"], cfgs[1]["BLOCK_M"])

    def test_divisibility_hints(self):
        for s in rules.enumerate_kernels("sm_90"):
            if s.variant == "generic":
                self.assertEqual(set(s.divisibility.values()), {1}, s.id)
                self.assertEqual(s.attrs, {})
                continue
            for name, d in s.divisibility.items():
                if s.signature[name].startswith("*"):
                    want = 16                                  # pointers, LSE and DELTA included
                elif name.startswith("stride_") and name.rstrip("zhmn").replace("stride_", "").upper() in DATA_TENSORS:
                    want = 8                                   # 16 bytes of fp16 / bf16
                elif name == "D_HEAD":
                    want = 8
                else:
                    want = 1                                   # LSE/DELTA strides, seqlens, window, ...
                self.assertEqual(d, want, f"{s.id}: {name}")
            self.assertEqual(len(s.attrs), sum(d != 1 for d in s.divisibility.values()))

    def test_stride_hint_follows_element_size(self):
        sig = {"Q": "*fp32", "stride_qz": "i64", "stride_qm": "i32", "stride_lz": "i64", "LSE": "*fp32",
               "D_HEAD": "i32", "N_CTX_Q": "i32", "HEAD_DIM": "constexpr"}
        self.assertEqual(rules.aligned_hints(sig), {"Q": 16, "stride_qz": 4, "stride_qm": 4, "stride_lz": 1,
                                                    "LSE": 16, "D_HEAD": 8, "N_CTX_Q": 1})

    def test_signature_contract(self):
        specs = rules.enumerate_kernels("sm_90")
        for fam, names in CONTRACT.items():
            for s in (s for s in specs if s.family == fam):
                with self.subTest(kernel=s.id):
                    self.assertEqual(list(s.signature), names)
                    self.assertEqual([a["name"] for a in s.args], [n for n in names if n not in CONSTEXPRS])
                    self.assertEqual(list(s.constexprs), [n for n in names if n in CONSTEXPRS])
                    self.assertEqual(s.constexprs["HEAD_DIM"], s.functional["head_dim"])
                    if "WINDOWED" in s.constexprs:
                        self.assertIs(s.constexprs["WINDOWED"], s.functional["windowed"])
                    for a in s.args:
                        n, t = a["name"], a["type"]
                        if n in DATA_TENSORS:
                            want = "*" + s.functional["dtype"]
                        elif n in ("LSE", "DELTA"):
                            want = "*fp32"
                        elif n == "sm_scale":
                            want = "fp32"
                        elif n in ROW_STRIDES:
                            want = "i32"
                        elif n.startswith("stride_"):
                            want = "i64"
                        else:
                            want = "i32"
                        self.assertEqual(t, want, n)
                break  # one kernel per family is enough: the signature depends only on the dtype

    def test_matches_kernel_source(self):
        # The argument list in rules.py must be the kernel's, in order (checked by parsing, no Triton import).
        for fam in rules.FAMILIES:
            with self.subTest(family=fam.name):
                with open(os.path.join(_paths.PYTHON_DIR, fam.module)) as f:
                    tree = ast.parse(f.read())
                fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fam.function)
                self.assertEqual([a.arg for a in fn.args.args], fam.args)
                self.assertEqual(fam.args, CONTRACT[fam.name])

    def test_unknown_arch(self):
        with self.assertRaises(rules.UnknownArchError) as cm:
            rules.enumerate_kernels("sm_75")
        for known in ("sm_90", "sm_80", "gfx942", "gfx90a"):
            self.assertIn(known, str(cm.exception))
        with self.assertRaises(rules.UnknownArchError):
            rules.parse_arch_list("sm_90;gfx1100")
        self.assertEqual(rules.parse_arch_list("sm_90; sm_80;sm_90"), ["sm_90", "sm_80"])

    def test_head_dims_drive_count(self):
        patches = [mock.patch.dict(f.axes, {"head_dim": [64, 128]}) for f in rules.FAMILIES]
        for p in patches:
            p.start()
        try:
            specs = rules.enumerate_kernels("sm_90")
        finally:
            for p in patches:
                p.stop()
        self.assertEqual(len(specs), sum(FAMILY_COUNTS_SM90.values()) * 2 // 5)
        self.assertFalse(any("-hd256-" in s.id for s in specs))

    def test_amd_configs_fit(self):
        # AMD: wave64, LDS 64 KiB -> at most 2 stages; checked against the compiled `shared` by the build.
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
