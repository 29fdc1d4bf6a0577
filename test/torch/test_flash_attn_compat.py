#!/usr/bin/env python3
"""aotriton.flash_attn (FlashAttention-2's functions) on a CUDA GPU, against float64.

Code written against flash_attn 2.x must work by swapping the import: (B, S, H, D) and packed
(total, H, D) layouts, bottom-right causal and windows, GQA, softmax_scale, head dims that are not
multiples of 8 (padded), deterministic backward, return_softmax_lse, the packed-qkv/kv variants,
softcap and alibi_slopes (dense and packed, forward and backward), refusals naming
return_attn_probs and block_table, the fp8 forward, and flash_attn_with_kvcache (test_kvcache: dense
and paged caches, appends across a page boundary, a CUDA graph replayed with new lengths). Bounds as
test_ops.py (compare: aotriton's error at most a few times the plain input-dtype computation's).

    PYTHONPATH=bindings/torch/python:test/torch python test/torch/test_flash_attn_compat.py
Last line: `torch-flash_attn_compat: N passed, M failed`.
"""
import argparse
import math

import torch

from harness import Runner, attention_ref, kvcache_append_ref, kvcache_ref, lse_ref, max_err, visible

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


def _kv_same(a, b):
    """Bitwise equal, NaN where NaN (poisoned pages must stay poisoned)."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _kv_case(dtype, b, hq, hk, d, sq, page, capacity, lens, n_new, seed=0):
    """q, caches and new tokens of a KV-cache step. Paged: the sequences' pages shuffled over a pool
    with spare pages poisoned with NaN (never to be read or written); every cache row past a
    sequence's length + n_new holds 1e4 (finite: a kernel that let it into the softmax would be
    far off; multiplied by a zero probability it stays 0)."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, device=DEV, generator=gen).to(dtype)  # noqa: E731
    q = rnd(b, sq, hq, d)
    if page is None:
        kc, vc, table = rnd(b, capacity, hk, d), rnd(b, capacity, hk, d), None
        for i, n in enumerate(lens):
            kc[i, n + n_new:] = 1e4
            vc[i, n + n_new:] = 1e4
    else:
        per = capacity // page
        pool = b * per + 2
        kc, vc = rnd(pool, page, hk, d), rnd(pool, page, hk, d)
        perm = torch.randperm(pool, device=DEV, generator=gen)
        table = perm[:b * per].reshape(b, per).to(torch.int32).contiguous()
        for spare in perm[b * per:].tolist():
            kc[spare] = float("nan")
            vc[spare] = float("nan")
        for i, n in enumerate(lens):
            for j in range(n + n_new, capacity):
                kc[table[i, j // page], j % page] = 1e4
                vc[table[i, j // page], j % page] = 1e4
    k_new = rnd(b, n_new, hk, d) if n_new else None
    v_new = rnd(b, n_new, hk, d) if n_new else None
    return q, kc, vc, table, k_new, v_new


def _kv_check(name, out, lse, ref, lse64, dtype):
    """out within 4x its own rounding of the float64 reference + 1e-3; LSE within 1e-3 * max(1, |lse|),
    +inf exactly where the reference's is (a row that sees no key: out 0)."""
    o_err, rounding = max_err(out, ref), max_err(ref.to(dtype), ref)
    o_bound = 4 * rounding + 1e-3
    fin = torch.isfinite(lse64)
    inf_ok = torch.equal(torch.isfinite(lse), fin) and bool((out.transpose(1, 2)[~fin] == 0).all())
    l_err = ((lse.double() - lse64).abs() / lse64.abs().clamp(min=1))[fin].max().item() if fin.any() else 0.0
    ok = o_err <= o_bound and l_err <= 1e-3 and inf_ok and not out.isnan().any()
    return R.check(name, ok, f"out {o_err:.2e}/{o_bound:.2e} lse {l_err:.2e} empty rows {int((~fin).sum())} "
                             f"{'ok' if inf_ok else 'WRONG'}")


def test_kvcache():
    """flash_attn_with_kvcache against float64 (harness.kvcache_ref, from the caches as they were
    before the step): dense and paged (16, 256) caches, appends crossing a page boundary with the
    whole cache buffers checked bitwise afterwards, GQA/MQA, Sq 1/4/16, causal and windows, lengths
    0 and full, num_splits forced and automatic, LSE, an int cache_seqlens; a CUDA graph captured
    once and replayed with new lengths and new tokens; refusals."""
    bf, fp = torch.bfloat16, torch.float16
    cases = (  # dtype, B, Hq, Hk, D, Sq, page, capacity, lens, n_new, causal, window, num_splits
        (bf, 3, 8, 2, 128, 1, None, 300, [0, 17, 300], 0, False, (-1, -1), 0),
        (fp, 2, 4, 4, 64, 4, None, 512, [100, 300], 4, True, (-1, -1), 0),
        (bf, 1, 8, 2, 128, 1, None, 4096, [4000], 0, False, (-1, -1), 0),      # long: the auto rule splits
        (bf, 1, 8, 2, 128, 1, None, 4096, [4000], 0, False, (-1, -1), 1),      # forced one split
        (bf, 3, 8, 1, 128, 1, 16, 320, [13, 0, 150], 5, True, (-1, -1), 0),    # 13 + 5 crosses 16
        (bf, 2, 16, 2, 128, 16, 256, 768, [250, 500], 16, True, (64, 0), 0),   # 250 + 16 crosses 256
        (fp, 2, 8, 4, 256, 4, 16, 256, [30, 7], 4, False, (20, 2), 4),
        (bf, 2, 4, 2, 64, 16, 16, 64, [0, 48], 16, True, (-1, -1), 3),          # Sq 16 at length 0: all append
    )
    for i, (dtype, b, hq, hk, d, sq, page, cap, lens, n_new, causal, window, splits) in enumerate(cases):
        name = (f"with_kvcache {T.tag(dtype)} B{b} Hq{hq} Hk{hk} D{d} Sq{sq} " + ("dense" if page is None else f"page{page}")
                + f" cap{cap} lens{lens} new{n_new}" + (" causal" if causal else "")
                + (f" window{window}" if window != (-1, -1) else "") + (f" splits{splits}" if splits else ""))
        q, kc, vc, table, k_new, v_new = _kv_case(dtype, b, hq, hk, d, sq, page, cap, lens, n_new, seed=i)
        seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)
        k0, v0 = kc.clone(), vc.clone()
        ref, lse64 = kvcache_ref(q, k0, v0, seqlens, k_new, v_new, table, None, causal, window)
        kvcache_append_ref(k0, v0, seqlens, k_new, v_new, table)
        out, lse = FA.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=seqlens, block_table=table,
                                              causal=causal, window_size=window, num_splits=splits,
                                              return_softmax_lse=True)
        torch.cuda.synchronize()
        _kv_check(name, out, lse, ref, lse64, dtype)
        R.check(name + " caches after the step (whole buffers, bitwise)", _kv_same(kc, k0) and _kv_same(vc, v0))
    # cache_seqlens as a Python int, no LSE.
    q, kc, vc, table, _, _ = _kv_case(bf, 2, 8, 2, 128, 1, 16, 128, [70, 70], 0, seed=50)
    ref, _ = kvcache_ref(q, kc, vc, torch.tensor([70, 70]), None, None, table)
    out = FA.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=70, block_table=table)
    R.check("with_kvcache cache_seqlens=70 (int), out alone", isinstance(out, torch.Tensor)
            and max_err(out, ref) <= 4 * max_err(ref.to(bf), ref) + 1e-3)

    # A CUDA graph captured once, replayed with new lengths and new tokens written into its inputs.
    b, hq, hk, d, page, cap, n_new = 3, 8, 2, 128, 16, 512, 1
    q, kc, vc, table, k_new, v_new = _kv_case(bf, b, hq, hk, d, 1, page, cap, [0, 0, 0], n_new, seed=60)
    gen = torch.Generator(device=DEV).manual_seed(61)
    for t in (kc, vc):  # plain random caches: the replays' growing lengths read rows the case filled with 1e4
        t.copy_(torch.randn(t.shape, device=DEV, generator=gen))
    seqlens = torch.zeros(b, dtype=torch.int32, device=DEV)
    static = dict(k=k_new, v=v_new, cache_seqlens=seqlens, block_table=table, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (loads the kernels) outside the capture
        FA.flash_attn_with_kvcache(q, kc, vc, return_softmax_lse=True, **static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_lse = FA.flash_attn_with_kvcache(q, kc, vc, return_softmax_lse=True, **static)
    for step, lens in enumerate(([5, 0, 31], [6, 15, 32], [300, 16, 511])):
        q.copy_(torch.randn(q.shape, device=DEV, generator=gen))
        k_new.copy_(torch.randn(k_new.shape, device=DEV, generator=gen))
        v_new.copy_(torch.randn(v_new.shape, device=DEV, generator=gen))
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        k0, v0 = kc.clone(), vc.clone()
        ref, lse64 = kvcache_ref(q, k0, v0, seqlens, k_new, v_new, table, None, True)
        kvcache_append_ref(k0, v0, seqlens, k_new, v_new, table)
        graph.replay()
        torch.cuda.synchronize()
        _kv_check(f"with_kvcache CUDA graph replay {step} lens {lens} (+{n_new} appended)", g_out, g_lse, ref, lse64, bf)
        R.check(f"with_kvcache CUDA graph replay {step}: caches appended at the new lengths",
                _kv_same(kc, k0) and _kv_same(vc, v0))

    q, kc, vc, table, _, _ = _kv_case(bf, 2, 8, 2, 64, 1, 16, 64, [3, 3], 0, seed=70)
    lens = torch.tensor([3, 3], dtype=torch.int32, device=DEV)
    kc3 = torch.zeros(kc.size(0), 16, 3, 64, device=DEV, dtype=bf)
    for what, fn, want in (
            ("rotary", lambda: FA.flash_attn_with_kvcache(q, kc, vc, rotary_cos=torch.zeros(64, 32, device=DEV),
                                                          cache_seqlens=lens, block_table=table), "rotary_cos"),
            ("softcap", lambda: FA.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, softcap=5.0), "softcap"),
            ("Sq 17", lambda: FA.flash_attn_with_kvcache(q.expand(2, 17, 8, 64), kc, vc, cache_seqlens=lens,
                                                         block_table=table), "1..16"),
            ("fp32", lambda: FA.flash_attn_with_kvcache(q.float(), kc.float(), vc.float(), cache_seqlens=lens,
                                                        block_table=table), "fp16 or bf16"),
            ("head dim 60", lambda: FA.flash_attn_with_kvcache(q[..., :60], kc[..., :60], vc[..., :60],
                                                               cache_seqlens=lens, block_table=table), "head dim"),
            ("page size 8", lambda: FA.flash_attn_with_kvcache(q, kc[:, :8], vc[:, :8], cache_seqlens=lens,
                                                               block_table=table), "page size"),
            ("Hq 8 over Hk 3", lambda: FA.flash_attn_with_kvcache(q, kc3, kc3.clone(), cache_seqlens=lens,
                                                                  block_table=table), "multiple")):
        try:
            fn()
            R.check(f"with_kvcache refuses {what}", False, "no error")
        except (RuntimeError, ValueError, NotImplementedError, TypeError) as e:
            R.check(f"with_kvcache refuses {what}", want in str(e), str(e)[:160])


def main():
    if not torch.cuda.is_available():
        R.check("CUDA device present", False)
        R.finish()
    torch.manual_seed(0)
    for t in (test_dense, test_softcap, test_alibi, test_lse_and_deterministic, test_packed_variants, test_varlen,
              test_refusals, test_fp8, test_kvcache):
        R.run(t.__name__, t)
    R.finish()


if __name__ == "__main__":
    main()
