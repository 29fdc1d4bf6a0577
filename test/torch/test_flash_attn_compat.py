#!/usr/bin/env python3
"""aotriton.flash_attn (FlashAttention-2's functions) on a CUDA GPU, against float64.

Code written against flash_attn 2.x must work by swapping the import: (B, S, H, D) and packed
(total, H, D) layouts, bottom-right causal and windows, GQA, softmax_scale, head dims that are not
multiples of 8 (padded), deterministic backward, return_softmax_lse, the packed-qkv/kv variants,
softcap and alibi_slopes (dense and packed, forward and backward), and refusals naming
return_attn_probs and block_table. Bounds as
test_ops.py (compare: aotriton's error at most a few times the plain input-dtype computation's).

    PYTHONPATH=bindings/torch/python:test/torch python test/torch/test_flash_attn_compat.py
Last line: `torch-flash_attn_compat: N passed, M failed`.
"""
import argparse
import math

import torch

from harness import Runner, attention_ref, lse_ref, max_err, visible

import aotriton.flash_attn as FA
import test_ops as T

DEV = "cuda"
F64 = torch.float64
R = Runner("flash_attn_compat")
T.R, T.ARGS = R, argparse.Namespace(k=None)


def bshd_ref(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, bias=None):
    """Plain attention over (B, S, H, D) tensors, bottom-right aligned masks, capped scores, an
    additive (B or 1, Hq, Sq, Sk) bias (float64, taken in the inputs' dtype)."""
    sq, sk = q.size(1), k.size(1)
    vis = visible(sq, sk, window[0], window[1], align=1, causal=causal)
    return attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale, vis=vis, softcap=softcap,
                         bias=None if bias is None else bias.to(q.dtype)).transpose(1, 2)


def compare_packed(label, seq_ref, dv=None, **options):
    """flash_attn_varlen_func with `options` over a packed bf16 batch (an empty and short
    sequences, GQA 4/2, hd128 (V: dv when given), bottom-right causal, scale 0.5) against float64.
    seq_ref(i, q, k, v): the reference of sequence i, (1, S, H, D) tensors."""
    lens_q, lens_k, hq, hk, d = [37, 0, 200, 5], [64, 9, 180, 5], 4, 2, 128
    cq = [0] + [sum(lens_q[:i + 1]) for i in range(len(lens_q))]
    ck = [0] + [sum(lens_k[:i + 1]) for i in range(len(lens_k))]
    cu_q = torch.tensor(cq, device=DEV, dtype=torch.int32)
    cu_k = torch.tensor(ck, device=DEV, dtype=torch.int32)

    def ref(q, k, v):
        return torch.cat([seq_ref(i, q[cq[i]:cq[i + 1]][None], k[ck[i]:ck[i + 1]][None], v[ck[i]:ck[i + 1]][None])[0]
                          for i in range(len(lens_q))])
    T.compare(f"flash_attn_varlen_func {label} bf16 causal q{lens_q} k{lens_k}", torch.bfloat16,
              dict(q=T.rnd(cq[-1], hq, d), k=T.rnd(ck[-1], hk, d), v=T.rnd(ck[-1], hk, dv or d)),
              lambda q, k, v: FA.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                        softmax_scale=0.5, causal=True, **options),
              ref, ["q", "k", "v"], varlen=True, softcap=options.get("softcap", 0.0) > 0,
              alibi=options.get("alibi_slopes") is not None)


def compare_dense(dtype, b, hq, hk, sq, sk, d, causal, window, scale, cap=0.0, dv=None):
    """flash_attn_func over (B, S, H, D) inputs against float64 (cap > 0: logit soft-capping; dv: V's
    own head dim)."""
    name = (f"flash_attn_func {T.tag(dtype)} B{b} Hq{hq} Hk{hk} Sq{sq} Sk{sk} D{d}" + (f" Dv{dv}" if dv else "")
            + (" causal" if causal else "") + (f" window{window}" if window != (-1, -1) else "")
            + (f" scale{scale}" if scale else "") + (f" softcap{cap}" if cap else ""))
    sc = 1 / math.sqrt(d) if scale is None else scale
    T.compare(name, dtype, dict(q=T.rnd(b, sq, hq, d), k=T.rnd(b, sk, hk, d), v=T.rnd(b, sk, hk, dv or d)),
              lambda q, k, v: FA.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window,
                                                 softcap=cap),
              lambda q, k, v: bshd_ref(q, k, v, sc, causal, window, cap), ["q", "k", "v"], softcap=cap > 0)


def test_dense():
    for dtype in (torch.bfloat16, torch.float16):
        for case in (
                (2, 8, 8, 512, 512, 128, True, (-1, -1), None),
                (2, 8, 2, 200, 555, 64, True, (-1, -1), None),      # bottom-right causal, Sq < Sk
                (1, 4, 4, 300, 300, 128, False, (64, 16), 0.1),     # sliding window both sides
                (1, 4, 1, 257, 257, 80, True, (100, -1), None),     # MQA, window with causal
                (2, 2, 2, 99, 131, 100, False, (-1, -1), None),     # head dim 100: padded to 104
                (1, 4, 2, 97, 130, 300, True, (-1, -1), None)):     # head dim 300: padded to 304, bucket 512
            compare_dense(dtype, *case)
        # V's own head dim (FlashAttention-3's hdim_v): DeepSeek MLA's 192/128, and 100/60 (padded to
        # 104/64, the 128/64 bucket pair).
        compare_dense(dtype, 2, 4, 2, 131, 200, 192, True, (-1, -1), None, dv=128)
        compare_dense(dtype, 1, 2, 2, 77, 61, 100, False, (16, 4), None, dv=60)
    compare_packed("Dv 64", lambda i, q, k, v: bshd_ref(q, k, v, 0.5, True), dv=64)


def test_softcap():
    # Caps from saturating (2 at a large scale) to Gemma 2's 50; GQA, windows, padded head dims, hd256.
    for dtype in (torch.bfloat16, torch.float16):
        for case in (
                (2, 8, 2, 300, 300, 128, True, (-1, -1), 0.5, 5.0),
                (1, 4, 4, 257, 513, 64, False, (64, 16), None, 30.0),
                (1, 2, 2, 200, 200, 256, True, (-1, -1), 1.0, 2.0),
                (2, 4, 1, 99, 131, 80, True, (-1, -1), None, 50.0)):
            compare_dense(dtype, *case)
    cap = 4.0
    compare_packed(f"softcap {cap}", lambda i, q, k, v: bshd_ref(q, k, v, 0.5, True, softcap=cap), softcap=cap)
    q = T.rnd(2, 64, 4, 64).to(torch.bfloat16)
    out, lse = FA.flash_attn_func(q, q, q, causal=True, softcap=3.0, return_softmax_lse=True)
    want = lse_ref(q.transpose(1, 2), q.transpose(1, 2), 1 / 8, vis=visible(64, 64, align=1, causal=True), softcap=3.0)
    R.check("softcap: the LSE is of the capped scores", max_err(lse, want) <= 1e-2, f"err {max_err(lse, want):.2e}")
    for name, fn in (("softcap with dropout", lambda: FA.flash_attn_func(q, q, q, dropout_p=0.1, softcap=3.0)),
                     ("softcap fp32", lambda: FA.flash_attn_func(q.float(), q.float(), q.float(), softcap=3.0)),
                     ("softcap negative", lambda: FA.flash_attn_func(q, q, q, softcap=-1.0))):
        try:
            fn()
            R.check(f"refuses {name}", False, "no error")
        except (RuntimeError, ValueError) as e:
            R.check(f"refuses {name}", "softcap" in str(e), str(e)[:160])


def alibi_bias(slopes, sq, sk):
    """FlashAttention's ALiBi as an additive bias (B or 1, Hq, Sq, Sk): -slope * |i + Sk - Sq - j|."""
    i = torch.arange(sq, device=DEV, dtype=F64)[:, None]
    j = torch.arange(sk, device=DEV, dtype=F64)[None, :]
    slopes = slopes.reshape(-1, slopes.shape[-1]).to(F64)
    return -slopes[:, :, None, None] * (i + sk - sq - j).abs()


def bloom_slopes(hq, rows=1):
    """BLOOM's slopes 2^(-8(h+1)/Hq), scaled per row (a wrong row shows), fp32 (rows, Hq)."""
    h = torch.arange(1, hq + 1, device=DEV, dtype=torch.float32)
    base = torch.exp2(-8.0 * h / hq)
    return torch.stack([base * (1 + 0.5 * r) for r in range(rows)])


def test_alibi():
    # Slopes shared (Hq,) or per sequence (B, Hq); causal, no mask (FlashAttention measures from the
    # bottom-right diagonal regardless), windows, GQA, Sq != Sk both ways, padded head dims, hd256.
    for dtype in (torch.bfloat16, torch.float16):
        for b, hq, hk, sq, sk, d, causal, window, per_seq in (
                (2, 8, 2, 300, 300, 128, True, (-1, -1), True),
                (1, 4, 4, 257, 513, 64, False, (-1, -1), False),
                (2, 4, 2, 200, 150, 96, False, (64, 16), True),
                (1, 2, 1, 129, 200, 256, True, (-1, -1), False),
                (2, 4, 4, 99, 131, 80, True, (32, -1), True)):
            slopes = bloom_slopes(hq, b if per_seq else 1)
            arg = slopes if per_seq else slopes[0]
            name = (f"flash_attn_func alibi{list(slopes.shape)} {T.tag(dtype)} B{b} Hq{hq} Hk{hk} Sq{sq} Sk{sk} D{d}"
                    + (" causal" if causal else "") + (f" window{window}" if window != (-1, -1) else ""))
            bias = alibi_bias(slopes, sq, sk)
            T.compare(name, dtype, dict(q=T.rnd(b, sq, hq, d), k=T.rnd(b, sk, hk, d), v=T.rnd(b, sk, hk, d)),
                      lambda q, k, v, arg=arg, causal=causal, window=window: FA.flash_attn_func(
                          q, k, v, causal=causal, window_size=window, alibi_slopes=arg),
                      lambda q, k, v, bias=bias, causal=causal, window=window, d=d: bshd_ref(
                          q, k, v, 1 / math.sqrt(d), causal, window, bias=bias),
                      ["q", "k", "v"], alibi=True)
    # A packed batch: positions and the diagonal are each sequence's own; one row of slopes each.
    slopes = bloom_slopes(4, 4)
    compare_packed("alibi[4, 4]", lambda i, q, k, v: bshd_ref(q, k, v, 0.5, True,
                                                                bias=alibi_bias(slopes[i], q.size(1), k.size(1))),
                   alibi_slopes=slopes)
    q = T.rnd(2, 64, 4, 64).to(torch.bfloat16)
    slopes = bloom_slopes(4)
    for name, fn, words in (
            ("alibi with dropout", lambda: FA.flash_attn_func(q, q, q, dropout_p=0.1, alibi_slopes=slopes[0]),
             ("alibi", "dropout")),
            ("alibi with softcap", lambda: FA.flash_attn_func(q, q, q, softcap=3.0, alibi_slopes=slopes[0]),
             ("alibi", "softcap")),
            ("alibi fp32 inputs", lambda: FA.flash_attn_func(q.float(), q.float(), q.float(), alibi_slopes=slopes[0]),
             ("alibi",)),
            ("alibi slopes per key head", lambda: FA.flash_attn_func(q, q[:, :, :2], q[:, :, :2],
                                                                     alibi_slopes=slopes[0, :2]), ("alibi",)),
            ("alibi fp16 slopes", lambda: FA.flash_attn_func(q, q, q, alibi_slopes=slopes[0].half()), ("alibi",))):
        try:
            fn()
            R.check(f"refuses {name}", False, "no error")
        except (RuntimeError, ValueError, TypeError) as e:
            R.check(f"refuses {name}", all(w in str(e) for w in words), str(e)[:160])


def test_lse_and_deterministic():
    b, h, s, d = 2, 4, 333, 64
    q, k, v = (T.rnd(b, s, h, d).to(torch.bfloat16).requires_grad_() for _ in range(3))
    out, lse = FA.flash_attn_func(q, k, v, causal=True, return_softmax_lse=True)
    want = lse_ref(q.transpose(1, 2), k.transpose(1, 2), 1 / math.sqrt(d), vis=visible(s, s, align=1, causal=True))
    R.check("return_softmax_lse: (B, H, Sq) fp32 vs float64", lse.shape == (b, h, s) and lse.dtype == torch.float32
            and max_err(lse, want) <= 1e-2, f"shape {tuple(lse.shape)} err {max_err(lse, want):.2e}")
    g = torch.randn_like(out)
    runs = []
    for _ in range(2):
        o = FA.flash_attn_func(q, k, v, causal=True, deterministic=True)
        runs.append(torch.autograd.grad(o, (q, k, v), g))
    R.check("deterministic=True: two backwards are bitwise equal",
            all(torch.equal(a, b_) for a, b_ in zip(runs[0], runs[1])))


def test_packed_variants():
    b, s, h, d = 2, 130, 4, 64
    qkv = T.rnd(b, s, 3, h, d)
    T.compare("flash_attn_qkvpacked_func bf16 causal", torch.bfloat16, dict(qkv=qkv),
              lambda qkv: FA.flash_attn_qkvpacked_func(qkv, causal=True),
              lambda qkv: bshd_ref(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], 1 / math.sqrt(d), True), ["qkv"])
    T.compare("flash_attn_kvpacked_func bf16 GQA", torch.bfloat16, dict(q=T.rnd(b, 70, 4, d), kv=T.rnd(b, s, 2, 2, d)),
              lambda q, kv: FA.flash_attn_kvpacked_func(q, kv),
              lambda q, kv: bshd_ref(q, kv[:, :, 0], kv[:, :, 1], 1 / math.sqrt(d)), ["q", "kv"])


def test_varlen():
    lens_q, lens_k = [17, 300, 1, 64], [40, 300, 5, 64]
    hq, hk, d = 8, 2, 128
    cq, ck = [0], [0]
    for a, c in zip(lens_q, lens_k):
        cq.append(cq[-1] + a)
        ck.append(ck[-1] + c)
    cu_q = torch.tensor(cq, device=DEV, dtype=torch.int32)
    cu_k = torch.tensor(ck, device=DEV, dtype=torch.int32)

    def ref(q, k, v, causal, window):
        outs = []
        for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
            outs.append(bshd_ref(q[cq[i]:cq[i + 1]].unsqueeze(0), k[ck[i]:ck[i + 1]].unsqueeze(0),
                                 v[ck[i]:ck[i + 1]].unsqueeze(0), 1 / math.sqrt(d), causal, window).squeeze(0))
        return torch.cat(outs, 0)

    for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (True, (32, -1))):
        name = f"flash_attn_varlen_func bf16 q{lens_q} k{lens_k} Hq{hq} Hk{hk}" + (" causal" if causal else "") + (
            f" window{window}" if window != (-1, -1) else "")
        T.compare(name, torch.bfloat16, dict(q=T.rnd(cq[-1], hq, d), k=T.rnd(ck[-1], hk, d), v=T.rnd(ck[-1], hk, d)),
                  lambda q, k, v: FA.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                            causal=causal, window_size=window),
                  lambda q, k, v: ref(q, k, v, causal, window), ["q", "k", "v"], varlen=True)
    q, k, v = (T.rnd(cq[-1], hq, d).to(torch.bfloat16), T.rnd(ck[-1], hk, d).to(torch.bfloat16),
               T.rnd(ck[-1], hk, d).to(torch.bfloat16))
    out, lse = FA.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), return_softmax_lse=True)
    R.check("flash_attn_varlen_func return_softmax_lse: (H, total_q)", lse.shape == (hq, cq[-1]), str(lse.shape))


def test_refusals():
    q = torch.randn(1, 16, 2, 64, device=DEV, dtype=torch.bfloat16)
    cu = torch.tensor([0, 16], device=DEV, dtype=torch.int32)
    for name, fn in (
            ("return_attn_probs", lambda: FA.flash_attn_func(q, q, q, return_attn_probs=True)),
            ("block_table", lambda: FA.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 16, 16,
                                                              block_table=torch.zeros(1, 1, device=DEV,
                                                                                      dtype=torch.int32)))):
        try:
            fn()
            R.check(f"refuses {name}", False, "no error")
        except NotImplementedError as e:
            R.check(f"refuses {name}", name in str(e), str(e)[:160])


def _e4m3_quantised(x, hk):
    """(x8 float8_e4m3fn, descale fp32 (B, Hk)): FlashAttention-3's per-(batch, KV head) factors,
    amax / 448, for x (B, S, H, D) whose H heads group onto hk KV heads."""
    b, s, h, d = x.shape
    amax = x.float().abs().reshape(b, s, hk, h // hk, d).amax(dim=(1, 3, 4)).clamp(min=1e-6)
    descale = (amax / 448.0).contiguous()
    per_head = descale.repeat_interleave(h // hk, dim=1)[:, None, :, None]
    return (x.float() / per_head).to(torch.float8_e4m3fn), descale


def test_fp8():
    """flash_attn_func with float8_e4m3fn q/k/v and q/k/v_descale (FlashAttention-3's fp8 forward):
    float64 of the dequantised inputs; O within 3x a naive fp8 computation (float64 scores, P rounded
    to e4m3 as the kernel does, O to bf16) + 2^-8 max|ref|; LSE within 2^-9 * scale * max sum|q.k|
    + 1e-3 (the tensor cores' fp8 accumulation: see test/gpu/src/fp8.rs)."""
    for b, sq, sk, hq, hk, d, causal, window in ((2, 200, 300, 4, 2, 128, False, (-1, -1)),
                                                   (1, 257, 129, 8, 1, 256, True, (-1, -1)),
                                                   (2, 61, 77, 2, 2, 64, False, (16, 4))):
        mag = torch.linspace(0.5, 3.0, hq, device=DEV)[None, None, :, None]
        q8, dq = _e4m3_quantised(torch.randn(b, sq, hq, d, device=DEV) * mag, hk)
        k8, dk = _e4m3_quantised(torch.randn(b, sk, hk, d, device=DEV) * mag[:, :, :hk], hk)
        v8, dv = _e4m3_quantised(torch.randn(b, sk, hk, d, device=DEV) * mag[:, :, :hk].flip(2), hk)
        name = f"fp8 B{b} Hq{hq} Hk{hk} Sq{sq} Sk{sk} D{d}" + (" causal" if causal else "") + (
            f" window{window}" if window != (-1, -1) else "")
        out, lse = FA.flash_attn_func(q8, k8, v8, causal=causal, window_size=window, q_descale=dq, k_descale=dk,
                                      v_descale=dv, return_softmax_lse=True)
        g = hq // hk
        deq = lambda x8, ds, h: x8.to(F64) * ds.to(F64).repeat_interleave(h // hk, dim=1)[:, None, :, None]  # noqa: E731
        qd, kd, vd = deq(q8, dq, hq), deq(k8, dk, hk), deq(v8, dv, hk)
        scale = 1.0 / math.sqrt(d)
        vis = visible(sq, sk, window[0], window[1], align=1, causal=causal)
        qh, kh, vh = qd.transpose(1, 2), kd.transpose(1, 2).repeat_interleave(g, 1), vd.transpose(1, 2).repeat_interleave(g, 1)
        s_ = (qh @ kh.transpose(-1, -2)) * scale
        # Rows that see no key (bottom-right causal with Sq > Sk): O 0 and LSE +inf, as FlashAttention.
        seen = vis.any(-1)
        s_ = s_.masked_fill(~vis, float("-inf"))
        m = s_.amax(-1, keepdim=True).masked_fill(~seen[:, None], 0)
        p = torch.exp(s_ - m)
        l_ = p.sum(-1, keepdim=True).masked_fill(~seen[:, None], 1)
        ref = (p @ vh) / l_
        naive = ((p.to(torch.float8_e4m3fn).to(F64) @ vh) / l_).to(torch.bfloat16).to(F64)
        lse_ref = (m + l_.log()).squeeze(-1)
        abs_sum = (qh.abs() @ kh.abs().transpose(-1, -2)).masked_fill(~vis, 0).amax(-1)
        o = out.transpose(1, 2)
        o_err, n_err = max_err(o, ref), max_err(naive, ref)
        o_bound = 3 * n_err + 2 ** -8 * ref.abs().max().item()
        lse_excess = ((lse.to(F64) - lse_ref).abs() / (2 ** -9 * scale * abs_sum + 1e-3))[..., seen].max().item()
        empty_ok = bool((lse[..., ~seen] == math.inf).all()) and bool((o[..., ~seen, :] == 0).all())
        ok = (out.dtype == torch.bfloat16 and o_err <= o_bound and lse_excess <= 1.0 and not out.isnan().any()
              and empty_ok)
        R.check(name, ok, f"out {o_err:.2e}/{o_bound:.2e} (naive {n_err:.2e}) lse {lse_excess:.2f} of its bound"
                f"  empty rows {int((~seen).sum())} {'ok' if empty_ok else 'WRONG'}")
    q8 = torch.randn(1, 64, 2, 64, device=DEV).to(torch.float8_e4m3fn)
    for what, fn, want in (("fp8 with dropout", lambda: FA.flash_attn_func(q8, q8, q8, dropout_p=0.1), "dropout_p"),
                           ("fp8 head dim 72", lambda: FA.flash_attn_func(*(torch.randn(1, 64, 2, 72, device=DEV)
                                                                            .to(torch.float8_e4m3fn),) * 3), "16"),
                           ("fp8 descale shape", lambda: FA.flash_attn_func(q8, q8, q8, q_descale=torch.ones(2, device=DEV)),
                            "q_descale")):
        try:
            fn()
            R.check(f"refuses {what}", False, "no error")
        except (RuntimeError, ValueError, NotImplementedError) as e:
            R.check(f"refuses {what}", want in str(e), str(e)[:160])


def main():
    if not torch.cuda.is_available():
        R.check("CUDA device present", False)
        R.finish()
    torch.manual_seed(0)
    for t in (test_dense, test_softcap, test_alibi, test_lse_and_deterministic, test_packed_variants, test_varlen,
              test_refusals, test_fp8):
        R.run(t.__name__, t)
    R.finish()


if __name__ == "__main__":
    main()
