"""Kernel enumeration in rules.py (no Triton needed)."""
import ast
import os
import unittest
from unittest import mock

import _paths  # noqa: F401
import rules

#: (dtype, tf32) pairs: fp16, bf16, fp32-ieee, fp32-tf32.
_DT = 4
#: Head-dim buckets: 16..256 for every (dtype, tf32), and 512 for fp16/bf16 (``_DT * 5 + 2``
#: (dtype, tf32, head_dim) triples); the optional axes stop at 256.
_DTHD = _DT * 5 + 2
#: Softcap and ALiBi functionals (each): 16-bit without dropout and bias, head dims up to 256.
_SOFTCAP = 2 * 5 * 2
#: Attention-sink functionals (attn_fwd only): 16-bit without dropout and bias, head dims up to 256.
_SINKS = 2 * 5
#: V's own head dim (attn_fwd, dK/dV, dQ): 16-bit without dropout and bias, the two HEAD_DIM_V_PAIRS.
_HDV = 2 * 2
FAMILY_COUNTS_SM90 = {
    # (dtype, tf32) x head_dim x dropout x bias x configs: 16-bit without dropout/bias up to hd256
    # 2 aligned + 1 generic, everything else (the optional axes and hd512 too) 1 aligned + 1 generic
    "attn_fwd": 2 * 5 * 3 + (_DTHD * 4 - 2 * 5 + _SOFTCAP + _SINKS + _HDV) * 2,
    # dtype x head_dim x (1 aligned + 1 generic)
    "attn_bwd_preprocess": (3 * 5 + 2) * 2,
    # (dtype, tf32) x head_dim x dropout x bias (+ softcap) x (1 aligned + 1 generic)
    "attn_bwd_dkdv": (_DTHD * 4 + _SOFTCAP + _HDV) * 2,
    "attn_bwd_dq": (_DTHD * 4 + _SOFTCAP + _HDV) * 2,
    # (dtype, tf32) x head_dim x dropout x (1 aligned + 1 generic)
    "attn_bwd_dbias": _DTHD * 2 * 2,
    # one fp32 functional (1 aligned + 1 generic)
    "attn_bwd_dsink": 2,
    "debug_dropout_mask": 2,
    # KV-cache decoding: 16-bit x hd 64/128/256 x dense/paged; three row tiles aligned (two on AMD:
    # AMD_DECODE_FEWER below) + one generic; paged, each tile and the generic also once per page size
    # below BLOCK_N (SMALL_PAGE 16, 32 at BLOCK_N 64 (hd 64/128), 16 at BLOCK_N 32 (hd 256))
    "attn_decode": 2 * (3 * 4 + 2 * 4 * 3 + 4 * 2),
    # 16-bit x hd 64/128/256, one aligned + one generic
    "attn_decode_combine": 2 * 3 * 2,
    "kvcache_append": 2 * 3 * 2 * 2,
}
#: AMD compiles two row tiles of attn_decode (no BLOCK_M 32), all at BLOCK_N 32, SMALL_PAGE 16 on the
#: 16-row tile only: 3 kernels per dense functional, 5 per paged one.
AMD_DECODE_FEWER = 2 * (3 * 4 + 2 * 4 * 3 + 4 * 2) - 2 * 3 * (3 + 5)
#: The Gluon backend (sm_90 only): one aligned kernel per functional, and the forward's short causal
#: kernel beside the main one at hd128 without packing or dropout (one per dtype).
#: attn_bwd_gluon: dtype x (hd64, hd128 with and without dQ; hd256 without) x varlen x dropout.
GLUON_COUNTS_SM90 = {"attn_fwd_gluon": 2 * 3 * 2 * 2 + 2, "attn_bwd_gluon_preprocess": 2 * 3, "attn_bwd_gluon": 2 * 5 * 2 * 2,
                     "attn_bwd_gluon_dq": 2 * 1 * 2 * 2, "attn_bwd_gluon_dq_convert": 2 * 3,
                     "attn_bwd_gluon_dkdv_convert": 2 * 3, "attn_fwd_gluon_fp8": 3,
                     "transpose_v_fp8": 3}
FUNCTIONALS = {"attn_fwd": _DTHD * 4 + _SOFTCAP + _SINKS + _HDV, "attn_bwd_preprocess": 3 * 5 + 2,
               "attn_bwd_dkdv": _DTHD * 4 + _SOFTCAP + _HDV, "attn_bwd_dq": _DTHD * 4 + _SOFTCAP + _HDV,
               "attn_bwd_dbias": _DTHD * 2, "attn_bwd_dsink": 1, "debug_dropout_mask": 1,
               "attn_decode": 12, "attn_decode_combine": 6, "kvcache_append": 12}

ATTENTION_GROUP = ["N_CTX_Q", "N_CTX_K", "D_HEAD", "GQA_GROUP", "WINDOW_LEFT", "WINDOW_RIGHT", "ALIGN_BOTTOM_RIGHT",
                   "IS_VARLEN", "CU_SEQLENS_Q", "CU_SEQLENS_K", "N_TOKENS_Q", "N_TOKENS_K", "VARLEN_STATUS",
                   "STORE_VARLEN_STATUS"]
DROPOUT_GROUP = ["DROPOUT_THRESHOLD", "dropout_scale", "PHILOX_SEED", "PHILOX_OFFSET", "philox_offset_base"]
ATTN_CONSTEXPRS = ["HEAD_DIM", "BLOCK_M", "BLOCK_N", "DROPOUT", "HAS_BIAS", "ALLOW_TF32", "SOFTCAP", "HAS_ALIBI"]
BWD_STRIDES = ["stride_qz", "stride_qh", "stride_qm", "stride_kz", "stride_kh", "stride_kn",
               "stride_vz", "stride_vh", "stride_vn", "stride_doz", "stride_doh", "stride_dom",
               "stride_lz", "stride_lh", "stride_deltaz", "stride_deltah"]
BIAS_STRIDES = ["stride_bz", "stride_bh", "stride_bm"]

CONTRACT = {
    "attn_fwd": [
        "Q", "K", "V", "O", "LSE", "BIAS", "ALIBI_SLOPES", "SINKS", "sm_scale", "softcap",
        "stride_qz", "stride_qh", "stride_qm", "stride_kz", "stride_kh", "stride_kn",
        "stride_vz", "stride_vh", "stride_vn", "stride_oz", "stride_oh", "stride_om",
        "stride_lz", "stride_lh", *BIAS_STRIDES, "stride_az",
        "STORE_LSE", *ATTENTION_GROUP, *DROPOUT_GROUP, "PHILOX_SEED_OUT", "PHILOX_OFFSET_OUT", "STORE_PHILOX",
        "D_HEAD_V", *ATTN_CONSTEXPRS, "HAS_SINKS", "HEAD_DIM_V"],
    "attn_bwd_dsink": [
        "LSE", "DELTA", "SINKS", "DSINK", "stride_lz", "stride_lh", "stride_deltaz", "stride_deltah",
        "N_BATCH", "N_CTX_Q", "IS_VARLEN", "CU_SEQLENS_Q", "N_TOKENS_Q", "VARLEN_STATUS", "STORE_VARLEN_STATUS",
        "BLOCK_M"],
    "attn_bwd_preprocess": [
        "O", "DO", "DELTA",
        "stride_oz", "stride_oh", "stride_om", "stride_doz", "stride_doh", "stride_dom",
        "stride_deltaz", "stride_deltah",
        "N_CTX_Q", "D_HEAD", "IS_VARLEN", "CU_SEQLENS_Q", "N_TOKENS_Q", "VARLEN_STATUS", "STORE_VARLEN_STATUS",
        "HEAD_DIM", "BLOCK_M"],
    "attn_bwd_dkdv": [
        "Q", "K", "V", "DO", "LSE", "DELTA", "DK", "DV", "BIAS", "ALIBI_SLOPES", "sm_scale", "softcap", *BWD_STRIDES,
        "stride_dkz", "stride_dkh", "stride_dkn", "stride_dvz", "stride_dvh", "stride_dvn", *BIAS_STRIDES, "stride_az",
        *ATTENTION_GROUP, *DROPOUT_GROUP, "D_HEAD_V", *ATTN_CONSTEXPRS, "HEAD_DIM_V"],
    "attn_bwd_dq": [
        "Q", "K", "V", "DO", "LSE", "DELTA", "DQ", "BIAS", "ALIBI_SLOPES", "sm_scale", "softcap", *BWD_STRIDES,
        "stride_dqz", "stride_dqh", "stride_dqm", *BIAS_STRIDES, "stride_az",
        *ATTENTION_GROUP, *DROPOUT_GROUP, "D_HEAD_V", *ATTN_CONSTEXPRS, "HEAD_DIM_V"],
    "attn_bwd_dbias": [
        "Q", "K", "V", "DO", "LSE", "DELTA", "BIAS", "DBIAS", "sm_scale", *BWD_STRIDES,
        *BIAS_STRIDES, "stride_dbz", "stride_dbh", "stride_dbm",
        "N_BATCH", "BIAS_BATCHES", "BIAS_HEADS", "BIAS_ROWS", "N_HEADS_Q",
        *ATTENTION_GROUP, *DROPOUT_GROUP, "HEAD_DIM", "BLOCK_M", "BLOCK_N", "DROPOUT", "ALLOW_TF32"],
    "debug_dropout_mask": [
        "OUT", "stride_oz", "stride_oh", "stride_om", "N_CTX_Q", "N_CTX_K", "N_HEADS",
        "DROPOUT_THRESHOLD", "PHILOX_SEED", "PHILOX_OFFSET", "philox_offset_base", "BLOCK_M", "BLOCK_N"],
    # kernels/decode/ABI.md
    "attn_decode": [
        "Q", "K", "V", "O", "LSE", "O_PART", "LSE_PART", "PAGE_TABLE", "CACHE_SEQLENS", "KV_STATUS", "sm_scale",
        "stride_qz", "stride_qh", "stride_qm", "stride_kz", "stride_kh", "stride_kn",
        "stride_vz", "stride_vh", "stride_vn", "stride_oz", "stride_oh", "stride_om", "stride_lz", "stride_lh",
        "stride_ptz", "N_CTX_Q", "N_NEW", "D_HEAD", "GQA_GROUP", "N_HEADS_Q", "WINDOW_LEFT", "WINDOW_RIGHT",
        "CACHE_CAPACITY", "PAGE_SIZE_LOG2", "N_PAGES", "N_SPLITS", "STORE_LSE", "STORE_KV_STATUS",
        "HEAD_DIM", "BLOCK_M", "BLOCK_N", "PAGED", "SMALL_PAGE"],
    "attn_decode_combine": [
        "O_PART", "LSE_PART", "O", "LSE", "stride_oz", "stride_oh", "stride_om", "stride_lz", "stride_lh",
        "N_BATCH", "N_HEADS_Q", "N_CTX_Q", "D_HEAD", "N_SPLITS", "STORE_LSE", "HEAD_DIM", "BLOCK_M"],
    "kvcache_append": [
        "K_NEW", "V_NEW", "K", "V", "PAGE_TABLE", "CACHE_SEQLENS", "KV_STATUS",
        "stride_xkz", "stride_xkh", "stride_xkm", "stride_xvz", "stride_xvh", "stride_xvm",
        "stride_kz", "stride_kh", "stride_kn", "stride_vz", "stride_vh", "stride_vn", "stride_ptz",
        "N_NEW", "N_HEADS_K", "D_HEAD", "CACHE_CAPACITY", "PAGE_SIZE_LOG2", "N_PAGES", "STORE_KV_STATUS",
        "HEAD_DIM", "BLOCK_M", "PAGED"],
}
CONSTEXPRS = {"HEAD_DIM", "HEAD_DIM_V", "BLOCK_M", "BLOCK_N", "DROPOUT", "HAS_BIAS", "ALLOW_TF32", "SOFTCAP", "HAS_ALIBI",
              "HAS_SINKS", "PAGED", "SMALL_PAGE"}
DATA_TENSORS = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV", "BIAS", "DBIAS", "OUT", "K_NEW", "V_NEW"}
ROW_STRIDES = {"stride_qm", "stride_kn", "stride_vn", "stride_om", "stride_dom", "stride_dqm", "stride_dkn",
               "stride_dvn", "stride_xkm", "stride_xvm"}
#: Non-default argument types (everything else not a pointer/stride is i32).
SPECIAL_TYPES = {"sm_scale": "fp32", "softcap": "fp32", "dropout_scale": "fp32", "DROPOUT_THRESHOLD": "u32", "philox_offset_base": "i64",
                 "PHILOX_SEED": "*i64", "PHILOX_OFFSET": "*i64", "PHILOX_SEED_OUT": "*i64",
                 "PHILOX_OFFSET_OUT": "*i64", "CU_SEQLENS_Q": "*i32", "CU_SEQLENS_K": "*i32",
                 "VARLEN_STATUS": "*i32", "LSE": "*fp32", "DELTA": "*fp32", "ALIBI_SLOPES": "*fp32",
                 "SINKS": "*fp32", "DSINK": "*fp32", "O_PART": "*fp32", "LSE_PART": "*fp32", "PAGE_TABLE": "*i32",
                 "CACHE_SEQLENS": "*i32", "KV_STATUS": "*i32"}
STRIDE_TENSOR = {"q": "Q", "k": "K", "v": "V", "o": "O", "do": "DO", "dq": "DQ", "dk": "DK", "dv": "DV", "b": "BIAS",
                 "db": "DBIAS", "l": "LSE", "delta": "DELTA", "a": "ALIBI_SLOPES", "xk": "K_NEW", "xv": "V_NEW",
                 "pt": "PAGE_TABLE"}


_WINDOW = ["WINDOW_LEFT", "WINDOW_RIGHT", "ALIGN_BOTTOM_RIGHT"]
#: The packing group (kernels/flash/varlen.py), and its query side (the backward's row kernels).
_PACKING = ["IS_VARLEN", "CU_SEQLENS_Q", "CU_SEQLENS_K", "N_TOKENS_Q", "N_TOKENS_K", "VARLEN_STATUS",
            "STORE_VARLEN_STATUS"]
_PACKING_Q = ["IS_VARLEN", "CU_SEQLENS_Q", "N_TOKENS_Q", "VARLEN_STATUS", "STORE_VARLEN_STATUS"]
#: The Gluon backend's argument lists (kernels/flash_gluon/ABI.md).
GLUON_CONTRACT = {
    "attn_fwd_gluon": ["desc_q", "desc_k", "desc_v", "desc_o", "LSE", "stride_lz", "stride_lh", "sm_scale",
                       "STORE_LSE", "N_CTX_Q", "N_CTX_K", "GQA_GROUP", *_WINDOW, *_PACKING,
                       "DROPOUT_THRESHOLD", "dropout_scale", "PHILOX_SEED", "PHILOX_OFFSET", "philox_offset_base",
                       "PHILOX_SEED_OUT", "PHILOX_OFFSET_OUT", "STORE_PHILOX",
                       "HEAD_DIM", "BLOCK_M", "BLOCK_N", "STAGES", "DROPOUT", "NUM_CONSUMERS", "CONSUMER_REGS", "LOADER_REGS",
                       "PEEL_FULL", "OVERLAP", "SCHED", "PERSISTENT", "Q_BUFS"],
    "attn_bwd_gluon_preprocess": ["O", "DO", "stride_oz", "stride_oh", "stride_om", "stride_doz", "stride_doh",
                                  "stride_dom", "LSE", "stride_lz", "stride_lh", "DELTA", "stride_deltaz",
                                  "stride_deltah", "LSE2", "DELTA2", "DQ_ACC", "N_CTX_Q", "SQ_PAD", "D_HEAD",
                                  "ZERO_DQ_ACC", *_PACKING_Q, "HEAD_DIM", "BLOCK_M"],
    "attn_bwd_gluon": ["desc_q", "desc_k", "desc_v", "desc_do", "desc_dk", "desc_dv", "desc_dq_acc", "desc_lse2",
                       "desc_delta2", "sm_scale", "N_CTX_Q", "N_CTX_K", "SQ_PAD", "N_HEADS_Q", "GQA_GROUP",
                       *_WINDOW, *_PACKING, "DROPOUT_THRESHOLD", "dropout_scale", "PHILOX_SEED", "PHILOX_OFFSET",
                       "philox_offset_base", "HEAD_SPLIT", "DKV_PARTIALS", "HEAD_DIM", "BLOCK_M", "BLOCK_N",
                       "STAGES", "COMPUTE_DQ", "DROPOUT", "MASK_MODE", "CONS_REGS",
                       "DK_SS", "PERSISTENT", "DESC_PER_STEP", "WALK", "DQ_IN_RING"],
    "attn_bwd_gluon_dq_convert": ["DQ_ACC", "DQ", "stride_dqz", "stride_dqh", "stride_dqm", "sm_scale", "N_CTX_Q",
                                  "SQ_PAD", "D_HEAD", "N_HEADS_Q", *_PACKING_Q, "HEAD_DIM", "BLOCK_M"],
    "attn_bwd_gluon_dkdv_convert": ["DKV_PARTIALS", "DK", "DV", "stride_dkz", "stride_dkh", "stride_dkn",
                                    "stride_dvz", "stride_dvh", "stride_dvn", "N_CTX_K", "D_HEAD", "HEAD_SPLIT",
                                    "HEAD_DIM", "BLOCK_N"],
    "attn_fwd_gluon_fp8": ["desc_q", "desc_k", "desc_vt", "desc_o", "LSE", "stride_lz", "stride_lh", "sm_scale",
                           "STORE_LSE", "N_CTX_Q", "N_CTX_K", "GQA_GROUP", *_WINDOW,
                           "DESCALE_Q", "stride_dsqz", "stride_dsqh", "DESCALE_K", "stride_dskz", "stride_dskh",
                           "DESCALE_V", "stride_dsvz", "stride_dsvh",
                           "HEAD_DIM", "BLOCK_M", "BLOCK_N", "STAGES", "NUM_CONSUMERS", "CONSUMER_REGS",
                           "LOADER_REGS", "PEEL_FULL", "OVERLAP", "SCHED", "PINGPONG"],
    "transpose_v_fp8": ["V", "stride_vz", "stride_vh", "stride_vn", "VT", "stride_vtz", "stride_vth", "stride_vtd",
                        "N_CTX_K", "KEYS_PAD", "D_HEAD", "HEAD_DIM", "BLOCK_N"],
    "attn_bwd_gluon_dq": ["desc_q", "desc_k", "desc_v", "desc_do", "desc_dq", "LSE2", "DELTA2", "sm_scale", "N_CTX_Q",
                          "N_CTX_K", "SQ_PAD", "GQA_GROUP", *_WINDOW, *_PACKING, "DROPOUT_THRESHOLD", "dropout_scale",
                          "PHILOX_SEED", "PHILOX_OFFSET", "philox_offset_base", "HEAD_DIM", "BLOCK_M", "BLOCK_N",
                          "K_STAGES", "V_STAGES", "DROPOUT", "CONSUMER_REGS", "LOADER_REGS"],
}


def _functional_key(spec):
    return spec.family, tuple(sorted(spec.functional.items()))


#: Gluon families whose GPU check re-wraps the kernel with its own ``do_not_specialize`` list.
JIT_WRAPPED_BY_HARNESS = {"attn_fwd_gluon": "test/gluon/check_fwd.py", "attn_fwd_gluon_fp8": "test/gluon/check_fwd_fp8.py"}


class EnumerateKernelsTest(unittest.TestCase):
    def test_sm90_counts_and_unique_ids(self):
        specs = rules.enumerate_kernels("sm_90")
        counts = {}
        for s in specs:
            counts[s.family] = counts.get(s.family, 0) + 1
        self.assertEqual(counts, {**FAMILY_COUNTS_SM90, **GLUON_COUNTS_SM90})
        ids = [s.id for s in specs]
        self.assertEqual(len(set(ids)), len(ids))
        self.assertEqual(ids, sorted(ids))
        for example in ("attn_fwd-fp16-tf0-hd64-drop0-bias0-m128n64w4s3-aligned",
                        "attn_fwd-bf16-tf0-hd16-drop0-bias0-m64n64w4s3-generic",
                        "attn_fwd-fp32-tf1-hd128-drop1-bias1-m64n32w4s2-aligned",
                        "attn_bwd_preprocess-fp32-hd256-m32w4s1-aligned",
                        "attn_bwd_dkdv-bf16-tf0-hd128-drop1-bias0-m32n64w8s2-aligned",
                        "attn_bwd_dq-fp16-tf0-hd32-drop0-bias1-m64n64w4s3-generic",
                        "attn_bwd_dbias-fp32-tf0-hd64-drop1-m32n32w4s2-aligned",
                        "debug_dropout_mask-fp32-m32n64w4s1-generic",
                        "attn_fwd_gluon-bf16-hd128-m128n128st2r168-aligned", "attn_fwd_gluon-fp16-hd64-m128n64st2r80-aligned",
                        "attn_bwd_gluon-fp16-hd64-dq0-m64n128st2r168-aligned",
                        "attn_bwd_gluon_preprocess-bf16-hd128-m32w4s1-aligned",
                        "attn_fwd-bf16-tf0-hd128-drop0-bias0-softcap1-m64n64w4s2-aligned",
                        "attn_fwd-fp16-tf0-hd64-drop0-bias0-alibi1-m64n64w4s3-generic",
                        "attn_bwd_dkdv-fp16-tf0-hd64-drop0-bias0-softcap1-m32n128w8s3-generic"):
            self.assertIn(example, ids)

    def test_families_and_axes(self):
        self.assertEqual([f.name for f in rules.PORTABLE_FAMILIES],
                         ["attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq", "attn_bwd_dbias",
                          "attn_bwd_dsink", "debug_dropout_mask", "attn_decode", "attn_decode_combine",
                          "kvcache_append"])
        self.assertEqual(rules.FAMILIES, rules.PORTABLE_FAMILIES + rules.GLUON_FAMILIES)
        self.assertEqual(rules.HEAD_DIMS, [16, 32, 64, 128, 256, 512])
        axes = {f.name: f.axes for f in rules.FAMILIES}
        full = {"dtype": ["fp16", "bf16", "fp32"], "tf32": [False, True], "head_dim": [16, 32, 64, 128, 256, 512],
                "dropout": [False, True], "bias": [False, True], "softcap": [False, True], "alibi": [False, True]}
        for name in ("attn_bwd_dkdv", "attn_bwd_dq"):
            self.assertEqual(list(axes[name]),
                             ["dtype", "tf32", "head_dim", "dropout", "bias", "softcap", "alibi", "head_dim_v"], name)
            self.assertEqual(axes[name], dict(full, head_dim_v=[0, 64, 128]), name)
        # Sinks: the forward's only (the backward's kernels see them through the LSE).
        self.assertEqual(axes["attn_fwd"], dict(full, sinks=[False, True], head_dim_v=[0, 64, 128]))
        self.assertEqual(axes["attn_bwd_dsink"], {"dtype": ["fp32"]})
        self.assertEqual(list(axes["attn_bwd_dbias"]), ["dtype", "tf32", "head_dim", "dropout"])
        self.assertEqual(list(axes["attn_bwd_preprocess"]), ["dtype", "head_dim"])
        self.assertEqual(axes["debug_dropout_mask"], {"dtype": ["fp32"]})
        decode = {"dtype": ["fp16", "bf16"], "head_dim": [64, 128, 256]}
        self.assertEqual(axes["attn_decode"], dict(decode, paged=[False, True]))
        self.assertEqual(axes["attn_decode_combine"], decode)
        self.assertEqual(axes["kvcache_append"], dict(decode, paged=[False, True]))
        modules = {"attn_fwd": "flash/fwd", "debug_dropout_mask": "flash/debug_dropout",
                   "attn_decode": "decode/decode", "attn_decode_combine": "decode/decode_combine",
                   "kvcache_append": "decode/kvcache_append"}
        for f in rules.PORTABLE_FAMILIES:
            self.assertEqual(f.module, f"kernels/{modules.get(f.name, 'flash/' + f.name[5:])}.py")
        for f in rules.FAMILIES:
            for fn in rules.functionals(f):
                self.assertFalse(fn.get("tf32") and fn["dtype"] != "fp32", fn)  # tf32 only for fp32
                # softcap: an optional axis, named only when on, and only 16-bit without dropout and bias
                self.assertNotIn(False, [fn.get(a, True) for a in rules.OPTIONAL_AXES], fn)
                if fn.get("softcap"):
                    self.assertTrue(fn["dtype"] != "fp32" and not fn["dropout"] and not fn["bias"], fn)

    def test_every_arch(self):
        for arch in rules.TARGETS:
            with self.subTest(arch=arch):
                specs = rules.enumerate_kernels(arch)
                gluon = sum(GLUON_COUNTS_SM90.values()) if arch == "sm_90" else 0
                amd = AMD_DECODE_FEWER if rules.TARGETS[arch][0] == "hip" else 0
                self.assertEqual(len(specs), sum(FAMILY_COUNTS_SM90.values()) + gluon - amd)
                backend, target_arch, warp_size = rules.TARGETS[arch]
                for s in specs:
                    self.assertEqual(s.target, {"backend": backend, "arch": target_arch, "warp_size": warp_size})

    def test_every_functional_has_one_generic(self):
        # One per functional; the paged decode functionals one per page class (SERVING_KEYS).
        for arch in rules.TARGETS:
            specs = rules.enumerate_kernels(arch, rules.PORTABLE_FAMILIES)
            keys = {_functional_key(s) for s in specs}
            self.assertEqual(len(keys), sum(FUNCTIONALS.values()))
            for key in keys:
                mine = [s for s in specs if _functional_key(s) == key]
                fn = dict(key[1])
                two = key[0] == "attn_decode" or (
                    key[0] == "attn_fwd" and fn["dtype"] != "fp32" and not fn["dropout"] and not fn["bias"]
                    and not any(fn.get(a) for a in rules.OPTIONAL_AXES) and fn["head_dim"] <= 256)
                classes = {s.config.get("SMALL_PAGE", 0) for s in mine}
                if key[0] == "attn_decode":
                    block_n = 32 if fn["head_dim"] > 128 or rules.TARGETS[arch][0] == "hip" else 64
                    self.assertEqual(classes, {0} | ({16, 32} - {block_n} if fn["paged"] else set()), key)
                for page in classes:
                    generic = [s for s in mine if s.variant == "generic" and s.config.get("SMALL_PAGE", 0) == page]
                    aligned = [s for s in mine if s.variant == "aligned" and s.config.get("SMALL_PAGE", 0) == page]
                    self.assertEqual(len(generic), 1, (key, page))
                    if key[0] == "attn_decode" and rules.TARGETS[arch][0] == "cuda":
                        self.assertEqual(len(aligned), 3, (key, page))
                    elif key[0] == "attn_decode" and page:  # AMD: the 16-row tile only
                        self.assertEqual(len(aligned), 1, (key, page))
                    else:
                        self.assertEqual(len(aligned), 2 if two else 1, (key, page))
                    self.assertEqual(generic[0].config["BLOCK_M"], min(s.config["BLOCK_M"] for s in aligned))
                if two:  # largest BLOCK_M first
                    cfgs = rules.family(key[0]).configs(arch, dict(key[1]))
                    self.assertEqual([c["BLOCK_M"] for c in cfgs], sorted((c["BLOCK_M"] for c in cfgs), reverse=True))
                    self.assertEqual(len({(c["BLOCK_M"], c["BLOCK_N"], c.get("SMALL_PAGE")) for c in cfgs}), len(cfgs))

    def test_divisibility_hints(self):
        for s in rules.enumerate_kernels("sm_90", rules.PORTABLE_FAMILIES):
            if s.variant == "generic":
                self.assertEqual(set(s.divisibility.values()), {1}, s.id)
                self.assertEqual(s.attrs, {})
                continue
            for name, d in s.divisibility.items():
                tensor = STRIDE_TENSOR.get(name[len("stride_"):-1]) if name.startswith("stride_") else None
                if tensor == "O" and s.family == "debug_dropout_mask":
                    tensor = "OUT"
                if name.startswith("PHILOX_"):
                    want = 8                                   # one u64 word (torch: rng_state[1] is 8 bytes in)
                elif name in ("CU_SEQLENS_Q", "CU_SEQLENS_K", "VARLEN_STATUS"):
                    want = 4                                   # scalar int32 words
                elif s.signature[name].startswith("*"):
                    want = 16                                  # every other pointer (LSE, DELTA, BIAS, ...)
                elif tensor in DATA_TENSORS:
                    want = 4 if s.functional["dtype"] == "fp32" else 8   # 16 bytes
                elif name in ("D_HEAD", "D_HEAD_V"):
                    want = 8
                else:
                    want = 1                                   # LSE/DELTA strides, seqlens, window, dropout
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
                    if "HEAD_DIM" in s.constexprs:
                        self.assertEqual(s.constexprs["HEAD_DIM"], s.functional["head_dim"])
                    if "DROPOUT" in s.constexprs:
                        self.assertIs(s.constexprs["DROPOUT"], s.functional["dropout"])
                        self.assertIs(s.constexprs["ALLOW_TF32"], s.functional["tf32"])
                    if "HAS_BIAS" in s.constexprs:
                        self.assertIs(s.constexprs["HAS_BIAS"], s.functional["bias"])
                    if "SOFTCAP" in s.constexprs:
                        self.assertIs(s.constexprs["SOFTCAP"], s.functional.get("softcap", False))
                        self.assertEqual("-softcap1-" in s.id, s.constexprs["SOFTCAP"], s.id)
                    if "HAS_ALIBI" in s.constexprs:
                        self.assertIs(s.constexprs["HAS_ALIBI"], s.functional.get("alibi", False))
                        self.assertEqual("-alibi1-" in s.id, s.constexprs["HAS_ALIBI"], s.id)
                    if "HAS_SINKS" in s.constexprs:
                        self.assertIs(s.constexprs["HAS_SINKS"], s.functional.get("sinks", False))
                        self.assertEqual("-sinks1-" in s.id, s.constexprs["HAS_SINKS"], s.id)
                    for a in s.args:
                        n, t = a["name"], a["type"]
                        if n in DATA_TENSORS:
                            want = "*" + s.functional["dtype"]
                        elif n in SPECIAL_TYPES:
                            want = SPECIAL_TYPES[n]
                        elif n in ROW_STRIDES:
                            want = "i32"
                        elif n.startswith("stride_"):
                            want = "i64"
                        else:
                            want = "i32"
                        self.assertEqual(t, want, n)
                    if s.functional["dtype"] == "fp32":
                        break  # one kernel per dtype is enough: the signature depends only on the dtype

    def test_matches_kernel_source(self):
        # The argument list in rules.py must be the kernel's, in order (checked by parsing, no Triton import).
        for fam in rules.PORTABLE_FAMILIES:
            with self.subTest(family=fam.name):
                with open(os.path.join(_paths.PYTHON_DIR, fam.module)) as f:
                    tree = ast.parse(f.read())
                fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fam.function)
                self.assertEqual([a.arg for a in fn.args.args], fam.args)
                self.assertEqual(fam.args, CONTRACT[fam.name])

    def test_unknown_arch(self):
        with self.assertRaises(rules.UnknownArchError) as cm:
            rules.enumerate_kernels("sm_75")
        for known in ("sm_90", "sm_80", "gfx942", "gfx90a", "gfx950"):
            self.assertIn(known, str(cm.exception))
        with self.assertRaises(rules.UnknownArchError):
            rules.parse_arch_list("sm_90;gfx1100")
        self.assertEqual(rules.parse_arch_list("sm_90; sm_80;sm_90"), ["sm_90", "sm_80"])

    def test_head_dim_v_pairs(self):
        # V's own head dim: the HEAD_DIM_V_PAIRS only, fp16/bf16, in attn_fwd / dK/dV / dQ; the
        # constexpr HEAD_DIM_V is the axis (0 where the functional has none).
        self.assertEqual(rules.HEAD_DIM_V_PAIRS, {256: 128, 128: 64})
        for arch in rules.TARGETS:
            for s in rules.enumerate_kernels(arch, rules.PORTABLE_FAMILIES):
                v = s.functional.get("head_dim_v")
                if "HEAD_DIM_V" in s.constexprs:
                    self.assertEqual(s.constexprs["HEAD_DIM_V"], v or 0, s.id)
                if v is None:
                    continue
                self.assertIn(s.family, ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"), s.id)
                self.assertEqual(rules.HEAD_DIM_V_PAIRS[s.functional["head_dim"]], v, s.id)
                self.assertIn(f"-hd{s.functional['head_dim']}-", s.id)
                self.assertIn(f"-hdv{v}-", s.id)
                self.assertIn(s.functional["dtype"], ("fp16", "bf16"), s.id)

    def test_head_dim_512(self):
        # fp16/bf16 only, without the optional axes, one HD512 config (aligned + generic) per functional.
        for arch in rules.TARGETS:
            specs = [s for s in rules.enumerate_kernels(arch, rules.PORTABLE_FAMILIES) if "-hd512-" in s.id]
            self.assertEqual(len(specs), 2 * sum(1 for f in rules.PORTABLE_FAMILIES for fn in rules.functionals(f)
                                                 if fn.get("head_dim") == 512), arch)
            for s in specs:
                self.assertNotIn("fp32", s.id)
                self.assertFalse(any(f"-{a}1-" in s.id for a in rules.OPTIONAL_AXES), s.id)
                if s.family != "attn_bwd_preprocess":
                    want = rules.HD512[rules.TARGETS[arch][0]][s.family]
                    self.assertEqual({k: s.config[k] for k in want}, want, s.id)
        self.assertEqual(rules.FP32_MAX_HEAD_DIM, 256)

    def test_head_dims_drive_count(self):
        full = rules.enumerate_kernels("sm_90", rules.PORTABLE_FAMILIES)
        patches = [mock.patch.dict(f.axes, {"head_dim": [64, 128]}) for f in rules.PORTABLE_FAMILIES
                   if "head_dim" in f.axes]
        for p in patches:
            p.start()
        try:
            specs = rules.enumerate_kernels("sm_90", rules.PORTABLE_FAMILIES)
        finally:
            for p in patches:
                p.stop()
        fixed = FAMILY_COUNTS_SM90["debug_dropout_mask"] + FAMILY_COUNTS_SM90["attn_bwd_dsink"]  # no head_dim axis
        # Exactly the kernels of those two buckets, and those without a head-dim axis.
        kept = [s for s in full if "-hd64-" in s.id or "-hd128-" in s.id]
        self.assertEqual(len(specs), len(kept) + fixed)
        self.assertEqual(sorted(s.id for s in specs if "-hd" in s.id), sorted(s.id for s in kept))
        self.assertFalse(any("-hd256-" in s.id for s in specs))

    def test_tf32_off_where_unsupported(self):
        # Triton 3.6 has a TF32 (xf32) dot on gfx942 only among the AMD archs.
        self.assertEqual(rules.NO_TF32_ARCHS, {"gfx90a", "gfx950"})
        for arch in rules.TARGETS:
            for s in rules.enumerate_kernels(arch):
                if "ALLOW_TF32" in s.constexprs:
                    self.assertIs(s.constexprs["ALLOW_TF32"], s.functional["tf32"] and arch not in rules.NO_TF32_ARCHS,
                                  s.id)

    def test_targets(self):
        self.assertEqual(rules.TARGETS["gfx950"], ("hip", "gfx950", 64))
        self.assertEqual(rules.parse_arch_list("sm_90;gfx942;gfx90a;gfx950"), ["sm_90", "gfx942", "gfx90a", "gfx950"])
        # One shared-memory (LDS) limit per arch, checked by the compile driver against the compiled kernels.
        self.assertEqual(set(rules.SHARED_MEMORY_LIMIT), set(rules.TARGETS))
        self.assertEqual({a: rules.SHARED_MEMORY_LIMIT[a] for a in ("gfx90a", "gfx942", "gfx950")},
                         {"gfx90a": 65536, "gfx942": 65536, "gfx950": 163840})

    def test_amd_configs(self):
        # wave64 configs with waves_per_eu (1-4), one pipeline stage; the option and the id carry it.
        hip = [a for a, t in rules.TARGETS.items() if t[0] == "hip"]
        self.assertEqual(sorted(hip), ["gfx90a", "gfx942", "gfx950"])
        for arch in hip:
            for s in rules.enumerate_kernels(arch, rules.PORTABLE_FAMILIES):
                e = s.config["waves_per_eu"]
                self.assertIn(e, (1, 2, 3, 4), s.id)
                self.assertEqual(s.config["num_stages"], 1, s.id)
                self.assertIn(s.config["num_warps"], (2, 4, 8), s.id)
                self.assertEqual(s.options, {"num_warps": s.config["num_warps"], "num_stages": 1, "waves_per_eu": e})
                self.assertIn(f"w{s.config['num_warps']}s1e{e}-{s.variant}", s.id)
        self.assertIn("attn_fwd-fp16-tf0-hd64-drop0-bias0-m128n64w4s1e2-aligned",
                      [s.id for s in rules.enumerate_kernels("gfx942")])

    def test_cuda_configs_have_no_waves_per_eu(self):
        # The CUDA specs (ids, options, hence compile-cache keys) do not know waves_per_eu.
        for arch in ("sm_90", "sm_80"):
            for s in rules.enumerate_kernels(arch):
                self.assertNotIn("waves_per_eu", s.config, s.id)
                self.assertNotIn("waves_per_eu", s.options, s.id)
                self.assertNotIn("waves_per_eu", s.canonical(), s.id)
                # transpose_v_fp8 has no query block: its tag starts at n
                self.assertRegex(s.id, r"-(m\d+)?(n\d+(p\d+)?)?(w\d+s\d+|st\d+r\d+|k\d+v\d+r\d+)-(aligned|generic)$")
        # A config given waves_per_eu by mistake still compiles for CUDA without the option.
        spec = rules._spec(rules.ATTN_FWD, "sm_90", rules.functionals(rules.ATTN_FWD)[0],
                           rules._cfg(64, 64, 4, 2, waves_per_eu=2), "aligned")
        self.assertEqual(spec.options, {"num_warps": 4, "num_stages": 2})

    def test_gluon_backend(self):
        # sm_90 only; every descriptor argument typed with the block of ABI.md and Triton's default layout.
        for arch in ("sm_80", "gfx942"):
            self.assertFalse([s for s in rules.enumerate_kernels(arch) if "gluon" in s.family])
        specs = [s for s in rules.enumerate_kernels("sm_90") if s.family in GLUON_CONTRACT]
        self.assertEqual(len(specs), sum(GLUON_COUNTS_SM90.values()))
        for s in specs:
            with self.subTest(kernel=s.id):
                self.assertEqual(list(s.signature), GLUON_CONTRACT[s.family])
                self.assertEqual(s.variant, "aligned")
                self.assertEqual(s.sources, ("flash", "flash_gluon"))
                hd, dt = s.functional["head_dim"], s.functional["dtype"]
                # packed batches: ragged descriptors, one more leading dimension (flash_gluon/ragged.py)
                lead = "1, 1, 1" if s.functional.get("varlen") else "1, 1"
                for name, ty in s.signature.items():
                    if name.startswith("desc_"):
                        self.assertTrue(ty.startswith("tensordesc<"), ty)
                        self.assertEqual(s.divisibility[name], 1)
                        if name in ("desc_q", "desc_o", "desc_do"):
                            # the fp8 forward writes O in bf16
                            odt = "bf16" if (s.family, name) == ("attn_fwd_gluon_fp8", "desc_o") else dt
                            self.assertIn(f"{odt}[{lead}, 64, {hd}]", ty)
                if s.family == "attn_fwd_gluon":
                    self.assertEqual("varlen" in s.functional, "varlen1" in s.id)  # absent when off
                    self.assertEqual("dropout" in s.functional, "drop1" in s.id)  # absent when off
                    self.assertEqual(s.constexprs["DROPOUT"], bool(s.functional.get("dropout")))
                    if s.functional.get("dropout"):
                        self.assertEqual(s.constexprs["PERSISTENT"], 0, "dropout: one CTA per tile")
                        self.assertEqual(s.signature["PHILOX_SEED"], "*i64")
                    if s.functional.get("varlen"):
                        self.assertIn(f"{dt}[{lead}, {s.config['BLOCK_N']}, {hd}]", s.signature["desc_k"])
                        self.assertEqual(s.constexprs["PERSISTENT"], 0, "packed batches: one CTA per tile")
                        for name in ("CU_SEQLENS_Q", "CU_SEQLENS_K", "VARLEN_STATUS"):
                            self.assertEqual(s.signature[name], "*i32")
                if s.family == "attn_fwd_gluon_fp8":  # Vᵀ in [HEAD_DIM, BLOCK_N] tiles (ABI.md)
                    self.assertIn(f"fp8e4nv[1, 1, {hd}, {s.config['BLOCK_N']}]", s.signature["desc_vt"])
                    self.assertEqual(s.constexprs["PINGPONG"], 1)
                if s.family == "attn_bwd_gluon":
                    self.assertIs(s.constexprs["COMPUTE_DQ"], s.functional["dq"])
                    self.assertIn("fp32[64, 8],NVMMASharedLayout(swizzle_byte_width=0", s.signature["desc_dq_acc"])
                    self.assertIn("fp32[1, 64],NVMMASharedLayout(swizzle_byte_width=0", s.signature["desc_lse2"])
                    # dK/dV: one compute warpgroup's share (bwd.py: 64 keys; bwd_wide.py: half the columns)
                    n = s.config["BLOCK_N"]
                    dkv = f"[{lead}, {n}, {hd // 2}]" if hd > 128 else f"[{lead}, {n // 2}, {hd}]"
                    # 2-stage Q/dO ring everywhere; hd256 compiles only its dK/dV kernel
                    self.assertEqual((n, s.config["STAGES"]), (64, 2) if hd > 128 else (128, 2))
                    self.assertFalse(hd > rules.GLUON_FUSED_DQ_MAX_HEAD_DIM and s.functional["dq"])
                    self.assertEqual(s.constexprs["DQ_IN_RING"], 0)
                    self.assertIn(f"{dt}{dkv}", s.signature["desc_dk"])
                    self.assertIn(f"{dt}[{lead}, {n}, {hd}]", s.signature["desc_k"])
                    self.assertEqual("varlen" in s.functional, "varlen1" in s.id)
                    if s.functional.get("varlen"):
                        self.assertEqual(s.constexprs["PERSISTENT"], 0, "packed batches: one CTA per key block")
                    self.assertEqual("dropout" in s.functional, "drop1" in s.id)  # absent when off
                    self.assertEqual(s.constexprs["DROPOUT"], bool(s.functional.get("dropout")))
                    if s.functional.get("dropout"):
                        self.assertEqual(s.constexprs["PERSISTENT"], 0, "dropout: one CTA per key block")
                if "maxnreg" in s.config:
                    self.assertEqual(s.options, {"num_warps": 4, "maxnreg": s.config["maxnreg"]})

    def test_nvmma_layout_matches_triton(self):
        try:
            from triton.experimental.gluon import language as gl
        except ImportError:
            self.skipTest("triton is not installed in this interpreter")
        dtypes = {16: gl.bfloat16, 32: gl.float32}
        for block, bits in [([1, 1, 64, 128], 16), ([1, 1, 128, 64], 16), ([1, 1, 64, 256], 16), ([64, 128], 32),
                            ([1, 64], 32), ([64, 64], 32), ([1, 1, 64, 16], 16), ([1, 1, 64, 32], 16)]:
            want = repr(gl.NVMMASharedLayout.get_default_for(block, dtypes[bits]))
            self.assertEqual(rules.nvmma_layout_repr(block, bits), want, block)

    def test_gluon_matches_kernel_source(self):
        for fam in rules.GLUON_FAMILIES:
            with self.subTest(family=fam.name):
                path = os.path.join(_paths.PYTHON_DIR, fam.module)
                with open(path) as f:
                    tree = ast.parse(f.read())
                fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fam.function)
                self.assertEqual([a.arg for a in fn.args.args if a.arg != "num_warps"], fam.args)
                self.assertEqual(fam.args, GLUON_CONTRACT[fam.name])

    def test_gluon_jit_specializes_no_free_integer(self):
        """The GPU checks (test/gluon) launch the sm_90 kernels through Triton's JIT, which makes an
        integer argument equal to 1 a constexpr and hints one divisible by 16; the AOT images are
        generic in every integer ``rules.aligned_hints`` leaves free. So each kernel's
        ``do_not_specialize`` names those (a Gluon kernel without it failed to compile on the GPU:
        ``ALIGN_BOTTOM_RIGHT`` = 1 became a constexpr), or the harness in ``JIT_WRAPPED_BY_HARNESS``
        re-wraps it with its own list."""
        for fam in rules.GLUON_FAMILIES:
            if fam.name in JIT_WRAPPED_BY_HARNESS:
                continue
            with self.subTest(family=fam.name):
                free = set(rules.jit_free_integers(fam))
                with open(os.path.join(_paths.PYTHON_DIR, fam.module)) as f:
                    tree = ast.parse(f.read())
                fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fam.function)
                listed = {name for dec in fn.decorator_list if isinstance(dec, ast.Call)
                          for kw in dec.keywords if kw.arg == "do_not_specialize"
                          for name in ast.literal_eval(kw.value)}
                self.assertEqual(free - listed, set(), "integers the JIT would specialize")

    def test_cheap_import(self):
        import subprocess
        import sys
        code = "import sys; sys.path.insert(0, %r); import rules; print('triton' in sys.modules)" % _paths.PYTHON_DIR
        out = subprocess.run([sys.executable, "-B", "-c", code], capture_output=True, text=True, check=True)
        self.assertEqual(out.stdout.strip(), "False")


if __name__ == "__main__":
    unittest.main()
