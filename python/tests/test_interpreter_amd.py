"""The portable kernels in the Triton interpreter with the block sizes of the AMD configs (rules.py).

For every AMD arch of ``rules.TARGETS``, the BLOCK_M/BLOCK_N of every portable kernel it compiles
(``aligned`` and ``generic``) are collected from ``rules.enumerate_kernels``; bf16 functionals run
with fp16 data (the interpreter has no bf16 dot; the blocks are what is under test) and TF32 ones
as IEEE fp32 (the interpreter ignores ``input_precision``).  Combinations are deduplicated across
archs, so each distinct (dtype, head-dim bucket, dropout, bias, blocks) runs once: forward,
backward (preprocess, dK/dV, dQ), dBias where the functional has a bias, against the float64
reference with the bounds of ``test_interpreter``.  Shapes have odd Sq and Sk (a tail in every
block), head dims inside each bucket, and masks, GQA, dropout and bias broadcasts rotate over the
cases.  ``debug_dropout_mask`` runs with its AMD blocks against the Philox model.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import sys  # noqa: E402
import time  # noqa: E402
import unittest  # noqa: E402

import numpy as np  # noqa: E402

import _paths  # noqa: E402,F401
import rules  # noqa: E402
import test_interpreter as ti  # noqa: E402  (module import: its TestCase classes are not re-collected here)
import test_interpreter_decode as tid  # noqa: E402
import test_philox as tp  # noqa: E402
from philox_model import keep_mask, threshold  # noqa: E402

HIP_ARCHS = [a for a, (backend, _, _) in rules.TARGETS.items() if backend == "hip"]
#: A real head dim inside each bucket (a multiple of 8, below the bucket where one exists: padding masked).
HEAD_DIM_IN_BUCKET = {16: 8, 32: 24, 64: 40, 128: 96, 256: 200, 512: 392}
MASKS = [ti.Mask("causal"), ti.Mask("window", 13, 7, align="br"), ti.Mask(), ti.Mask("causal", align="br"),
         ti.Mask("window", 40, 0)]
BIAS_BROADCASTS = ["", "h", "m", "bhm"]
DECODE_FAMILIES = ("attn_decode", "attn_decode_combine", "kvcache_append")


def _blocks(spec):
    return spec.config["BLOCK_M"], spec.config.get("BLOCK_N")


def amd_blocks():
    """``{family: {key: sorted block tuples}}`` over every AMD arch; key = (dtype, head_dim, dropout, bias)
    with the axes the family lacks as None, dtype "fp16" for fp16/bf16."""
    out = {}
    for arch in HIP_ARCHS:
        for s in rules.enumerate_kernels(arch, rules.PORTABLE_FAMILIES):
            f = s.functional
            key = ("fp32" if f["dtype"] == "fp32" else "fp16", f.get("head_dim"), f.get("dropout"), f.get("bias"))
            out.setdefault(s.family, {}).setdefault(key, set()).add(_blocks(s))
    return {fam: {k: sorted(v) for k, v in keys.items()} for fam, keys in out.items()}


def attention_cases(blocks=None):
    """One dict per interpreter run: every AMD block size of attn_fwd / preprocess / dkdv / dq / dbias
    appears in at least one run of its functional (the families' lists are walked in step)."""
    blocks = blocks or amd_blocks()
    cases = []
    for key in sorted(blocks["attn_fwd"], key=repr):
        dt, hd, dropout, bias = key
        fwd, dkdv, dq = blocks["attn_fwd"][key], blocks["attn_bwd_dkdv"][key], blocks["attn_bwd_dq"][key]
        pre = [bm for bm, _ in blocks["attn_bwd_preprocess"][(dt, hd, None, None)]]
        dbias = blocks["attn_bwd_dbias"][(dt, hd, dropout, None)] if bias else [None]
        for i in range(max(len(fwd), len(dkdv), len(dq), len(pre), len(dbias))):
            n = len(cases)
            c = dict(dtype=dt, head_dim=hd, dropout=dropout, bias=bias, fwd=fwd[i % len(fwd)],
                     dkdv=dkdv[i % len(dkdv)], dq=dq[i % len(dq)], pre=pre[i % len(pre)],
                     dbias=dbias[i % len(dbias)], mask=MASKS[n % len(MASKS)], hk=1 + n % 2,
                     bias_broadcast=BIAS_BROADCASTS[n % len(BIAS_BROADCASTS)] if bias else None)
            ms = [c["fwd"][0], c["dkdv"][0], c["dq"][0], c["pre"]] + ([c["dbias"][0]] if bias else [])
            ns = [c["fwd"][1], c["dkdv"][1], c["dq"][1]] + ([c["dbias"][1]] if bias else [])
            # Odd lengths: a partial last block for every block size, and more than one block of the largest.
            c["sq"], c["sk"] = max(ms) + 11, max(ns) + 21
            cases.append(c)
    return cases


class AmdConfigInterpreterTest(unittest.TestCase):
    check = ti.AttnInterpreterTest.check
    assert_close = ti.AttnInterpreterTest.assert_close
    ran = 0

    @classmethod
    def tearDownClass(cls):
        print(f"\namd interpreter cases: {cls.ran} (archs {', '.join(HIP_ARCHS)})", file=sys.stderr, flush=True)

    def test_cases_cover_every_amd_kernel(self):
        cases = attention_cases()
        seen = {(fam, c["dtype"], c["head_dim"], c["dropout"], c["bias"], b) for c in cases
                for fam, b in (("attn_fwd", c["fwd"]), ("attn_bwd_dkdv", c["dkdv"]), ("attn_bwd_dq", c["dq"]))}
        seen |= {("attn_bwd_preprocess", c["dtype"], c["head_dim"], None, None, (c["pre"], None)) for c in cases}
        seen |= {("attn_bwd_dbias", c["dtype"], c["head_dim"], c["dropout"], None, c["dbias"]) for c in cases
                 if c["bias"]}
        self.assertTrue(HIP_ARCHS)
        for arch in HIP_ARCHS:
            for s in rules.enumerate_kernels(arch, rules.PORTABLE_FAMILIES):
                if s.family in ("debug_dropout_mask", "attn_bwd_dsink") + DECODE_FAMILIES:  # their own tests below
                    continue
                f = s.functional
                want = (s.family, "fp32" if f["dtype"] == "fp32" else "fp16", f.get("head_dim"), f.get("dropout"),
                        f.get("bias"), _blocks(s))
                self.assertIn(want, seen, s.id)
        for c in cases:
            for bm in (c["fwd"][0], c["dkdv"][0], c["dq"][0], c["pre"]):
                self.assertNotEqual(c["sq"] % bm, 0)
            for bn in (c["fwd"][1], c["dkdv"][1], c["dq"][1]):
                self.assertNotEqual(c["sk"] % bn, 0)
        # Every feature occurs: GQA, a causal and a window mask, dropout, bias, both dtypes, every bucket.
        self.assertTrue(any(c["hk"] == 1 for c in cases) and any(c["dropout"] for c in cases))
        self.assertTrue(any(c["bias"] for c in cases))
        self.assertEqual({c["mask"].kind for c in cases}, {"none", "causal", "window"})
        self.assertEqual({c["dtype"] for c in cases}, {"fp16", "fp32"})
        self.assertEqual({c["head_dim"] for c in cases}, set(rules.HEAD_DIMS))

    def test_attention_with_amd_blocks(self):
        cases = attention_cases()
        t0 = time.monotonic()
        for i, c in enumerate(cases):
            dtype = np.float32 if c["dtype"] == "fp32" else np.float16
            dropout = ti.Dropout(0.2, seed=11 + i, offset=3, base=i) if c["dropout"] else None
            with self.subTest(case={k: v for k, v in c.items()}):
                self.check(1, 2, c["hk"], c["sq"], c["sk"], HEAD_DIM_IN_BUCKET[c["head_dim"]], c["mask"],
                           fwd_blocks=c["fwd"], dkdv_blocks=c["dkdv"], dq_blocks=c["dq"], pre_block=c["pre"],
                           dbias_blocks=c["dbias"], seed=i, dtype=dtype, dropout=dropout, bias=c["bias_broadcast"])
            type(self).ran += 1
        print(f"\namd attention interpreter cases: {len(cases)} in {time.monotonic() - t0:.0f} s",
              file=sys.stderr, flush=True)

    def test_dsink_with_amd_blocks(self):
        """``attn_bwd_dsink`` with each AMD BLOCK_M, more rows than one block (a partial last one),
        after a forward and backward with sinks (fp16, GQA, causal)."""
        blocks = sorted({_blocks(s)[0] for arch in HIP_ARCHS for s in rules.enumerate_kernels(arch, [rules.ATTN_BWD_DSINK])})
        self.assertTrue(blocks)
        for bm in blocks:
            with self.subTest(block_m=bm):
                self.check(2, 2, 1, bm + 11, 21, 8, ti.Mask("causal", align="br"), fwd_blocks=(64, 32),
                           dkdv_blocks=(32, 32), dq_blocks=(64, 32), pre_block=64,
                           sinks=np.array([1.0, -2.0], np.float32), dsink_block=bm)
            type(self).ran += 1

    def test_decode_with_amd_blocks(self):
        """The KV-cache kernels with every AMD block size: each (head-dim bucket, dense|paged, BLOCK_M,
        BLOCK_N) of ``attn_decode`` once, with the append's and the combine's AMD blocks, an append,
        GQA packing rows past BLOCK_M (a second row tile), three splits and a causal window."""
        blocks = {}
        for arch in HIP_ARCHS:
            for s in rules.enumerate_kernels(arch, [rules.ATTN_DECODE, rules.ATTN_DECODE_COMBINE, rules.KVCACHE_APPEND]):
                blocks.setdefault(s.family, set()).add((s.functional["head_dim"], s.functional.get("paged"), _blocks(s)))
        combine = sorted({b[2][0] for b in blocks["attn_decode_combine"]})
        append = sorted({b[2][0] for b in blocks["kvcache_append"]})
        self.assertEqual(len(combine), 1)
        self.assertEqual(len(append), 1)
        rng = np.random.default_rng(5)
        for hd, paged, (bm, bn) in sorted(blocks["attn_decode"]):
            b, hq, hk, d = 2, 8, 2, HEAD_DIM_IN_BUCKET[hd]
            sq = bm // (hq // hk) + 1  # group x Sq rows: one more than BLOCK_M
            if paged:
                cache = tid.Cache(rng, b, hk, d, np.float16, page=16, table=np.array([[3, 0, 5, 1], [2, 4, 6, 7]], np.int32),
                                  n_pages=8)
            else:
                cache = tid.Cache(rng, b, hk, d, np.float16, capacity=64)
            q = rng.standard_normal((b, sq, hq, d)).astype(np.float16)
            k_new = rng.standard_normal((b, 2, hk, d)).astype(np.float16)
            v_new = rng.standard_normal((b, 2, hk, d)).astype(np.float16)
            with self.subTest(head_dim=hd, paged=paged, blocks=(bm, bn)):
                tid.DecodeTest.check(self, "amd blocks", q, cache, [15, 40], k_new, v_new, (30, 0), splits=3,
                                     block_m=bm, block_n=bn, append_block=append[0], combine_block=combine[0])
            type(self).ran += 1

    def test_debug_dropout_mask_with_amd_blocks(self):
        blocks = sorted({_blocks(s) for arch in HIP_ARCHS
                         for s in rules.enumerate_kernels(arch, [rules.DEBUG_DROPOUT_MASK])})
        self.assertTrue(blocks)
        for bm, bn in blocks:
            B, H, sq, sk, seed, offset, base, p = 2, 2, bm + 5, bn + 7, 77, 9, 4, 0.3
            out = tp.run_debug_mask(B, H, sq, sk, seed, offset, base, threshold(p), block_m=bm, block_n=bn)
            self.assertFalse(np.isnan(out).any(), "not fully written")
            np.testing.assert_array_equal(out, keep_mask(B, H, sq, sk, seed, offset + base, p).astype(np.float32),
                                          f"blocks {bm}x{bn}")
            type(self).ran += 1


def setUpModule():
    ti._quiet_interpreter()


if __name__ == "__main__":
    unittest.main()
