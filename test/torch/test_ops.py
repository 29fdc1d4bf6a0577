#!/usr/bin/env python3
"""Op-level tests of aotriton.torch against float64 references (on a CUDA GPU).

Every case computes the output and all gradients three ways: aotriton in the input dtype, the
plain reference (harness.attention_ref) in float64, and the same plain reference in the input
dtype. Bounds: forward max|err| <= 3 * (input-dtype reference's max|err|) + 1e-3, gradients
5 * (...) + 1e-3; NaN never passes. The float64 reference itself is cross-checked against torch's
math SDPA. Dropout cases take the keep-mask of the very call (aotriton.torch.dropout_mask on the
returned rng_state) into the reference.

Under AOTRITON_BACKEND=gluon (every call forced onto the sm_90 Gluon kernels) a case whose calls
Gluon serves (harness.gluon_refusal: fp16/bf16, head dim <= 256, no dropout, no mask/bias, not
varlen) runs as above; a case it cannot serve must instead raise RuntimeError naming
kUnsupportedByBackend and the reason (`PASS refused by gluon: <case>`); a forward it serves whose
backward it does not checks the forward and the backward's refusal. The dropout RNG-stream checks are skipped there (Gluon has no dropout).

    PYTHONPATH=bindings/torch/python python test/torch/test_ops.py [-k substring]
Last line: `torch-ops: N passed, M failed`; exit status 1 on any failure.
"""
import argparse
import math
import os
import re

import torch

from harness import Runner, attention_ref, forced_backend, gluon_refuses, lse_ref, max_err, visible

import aotriton.torch as A

DEV = "cuda"
F64 = torch.float64
R = Runner("ops")
ARGS = None


def rnd(*shape):
    return torch.randn(*shape, device=DEV, dtype=F64)


def wanted(name):
    return ARGS.k is None or ARGS.k in name


def compare(name, dtype, inputs, fn_ours, fn_ref, grad_names, fwd_factor=3.0, grad_factor=5.0, atol=1e-3,
            dropout=False, bias=False, varlen=False, sm_scale=None, softcap=False, alibi=False):
    """inputs: name -> float64 tensor. Runs fn_ours on dtype copies and fn_ref on float64 and dtype
    copies, backpropagates one random dout, and checks output + gradients of grad_names.
    dropout/bias/varlen/sm_scale describe fn_ours's call (its head dim is inputs["q"]'s last) for
    the Gluon rule: under AOTRITON_BACKEND=gluon a forward Gluon cannot serve must be refused
    instead, and a backward it cannot serve (after a served forward) likewise, the output alone
    then being checked."""
    if not wanted(name):
        return
    head_dim = next(iter(inputs.values())).shape[-1]
    head_dim_v = inputs["v"].shape[-1] if "v" in inputs else None
    why_fwd = gluon_refuses(dtype, head_dim, False, dropout, bias, varlen, sm_scale, softcap, alibi, head_dim_v)
    why_bwd = gluon_refuses(dtype, head_dim, True, dropout, bias, varlen, sm_scale, softcap, alibi, head_dim_v)

    def leaves(dt):
        return {n: t.to(dt).detach().requires_grad_(n in grad_names) for n, t in inputs.items()}

    if why_fwd:
        R.refused(name, why_fwd, lambda: fn_ours(**leaves(dtype)))
        return
    checked = [] if why_bwd else grad_names  # the gradients compared

    def body():
        ours_in = leaves(dtype)
        out = fn_ours(**ours_in)
        dout64 = torch.randn(out.shape, device=DEV, dtype=F64).to(dtype).to(F64)
        if why_bwd:
            R.refused(f"{name} (backward)", why_bwd, torch.autograd.grad, out, [ours_in[n] for n in grad_names],
                      dout64.to(dtype))
        ours_g = torch.autograd.grad(out, [ours_in[n] for n in checked], dout64.to(dtype)) if checked else []
        ref_in = leaves(F64)
        ref = fn_ref(**ref_in)
        ref_g = torch.autograd.grad(ref, [ref_in[n] for n in checked], dout64) if checked else []
        low_in = leaves(dtype)
        low = fn_ref(**low_in)
        low_g = torch.autograd.grad(low, [low_in[n] for n in checked], dout64.to(dtype)) if checked else []
        results = [("out", out, ref, low, fwd_factor)]
        results += [(f"d{n}", o, r, l, grad_factor) for n, o, r, l in zip(checked, ours_g, ref_g, low_g)]
        details, ok = [], True
        for what, o, r, l, factor in results:
            e = max_err(o, r)
            bound = factor * max_err(l, r) + atol
            if o.shape != r.shape:
                ok = False
                details.append(f"{what} shape {tuple(o.shape)} != {tuple(r.shape)}")
                continue
            ok &= e <= bound
            details.append(f"{what} {e:.2e}/{bound:.2e}" + ("" if e <= bound else " <-- over"))
        R.check(f"{name} (forward)" if why_bwd else name, ok, " ".join(details))

    R.run(name, body)


def tag(dtype):
    return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]


# ---------------------------------------------------------------- padded SDPA cases
def sdpa_case(dtype, b, hq, hk, sq, sk, d, causal=False, scale=None, label="", dv=None):
    """dv: V's own head dim (the output's), Q/K's when None."""
    sc = 1.0 / math.sqrt(d) if scale is None else scale
    vis = visible(sq, sk, causal=True) if causal else None
    name = (f"sdpa {tag(dtype)} B{b} Hq{hq} Hk{hk} Sq{sq} Sk{sk} D{d}" + (f" Dv{dv}" if dv else "")
            + (" causal" if causal else "") + (f" scale{scale}" if scale is not None else "") + label)
    compare(name, dtype, dict(q=rnd(b, hq, sq, d), k=rnd(b, hk, sk, d), v=rnd(b, hk, sk, dv or d)),
            lambda q, k, v: A.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                           enable_gqa=hq != hk),
            lambda q, k, v: attention_ref(q, k, v, sc, vis=vis), ["q", "k", "v"], sm_scale=sc)


def test_dtypes_and_head_dims():
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for d in (8, 40, 64, 72, 128, 256) + ((264, 512) if dtype != torch.float32 else ()):
            sdpa_case(dtype, 2, 3, 3, 67, 91, d)
        for d in (64, 128):
            sdpa_case(dtype, 2, 4, 4, 128, 128, d, causal=True)
    sdpa_case(torch.bfloat16, 1, 2, 2, 300, 1000, 64)  # long keys, several blocks
    sdpa_case(torch.float16, 3, 2, 2, 1, 77, 128)      # one query (decode-like)
    sdpa_case(torch.bfloat16, 2, 4, 2, 130, 200, 384, causal=True, label=" GQA")  # bucket 512
    # V's own head dim: DeepSeek MLA's 192/128 (GQA, causal), 128/64, and padded dims in both buckets.
    sdpa_case(torch.bfloat16, 2, 4, 2, 97, 130, 192, causal=True, label=" GQA MLA", dv=128)
    sdpa_case(torch.float16, 1, 3, 3, 61, 77, 128, dv=64)
    sdpa_case(torch.float16, 2, 2, 1, 45, 33, 96, causal=True, label=" MQA", dv=40)


def test_causal_scale_gqa():
    for sq, sk in ((50, 80), (80, 50)):
        sdpa_case(torch.float16, 2, 2, 2, sq, sk, 64, causal=True)  # top-left, as torch
    sdpa_case(torch.bfloat16, 2, 4, 4, 64, 64, 64, scale=0.3)
    sdpa_case(torch.float16, 2, 8, 2, 96, 96, 128, causal=True, label=" GQA")
    sdpa_case(torch.bfloat16, 2, 8, 1, 70, 90, 64, label=" MQA")
    sdpa_case(torch.float32, 1, 6, 3, 33, 65, 40, label=" GQA")


def test_layouts():
    b, h, s, d = 2, 4, 77, 64
    inputs = dict(q=rnd(b, h, s, d), k=rnd(b, h, s, d), v=rnd(b, h, s, d))
    sc = 1.0 / math.sqrt(d)

    def bshd_views(q, k, v):  # (B, S, H, D) memory seen as (B, H, S, D), as in most models
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        return A.scaled_dot_product_attention(q, k, v, is_causal=True)

    compare("sdpa layout bshd-views", torch.float16, inputs, bshd_views,
            lambda q, k, v: attention_ref(q, k, v, sc, vis=visible(s, s, causal=True)), ["q", "k", "v"])

    def strided_last(q, k, v):  # last stride 2: must be made contiguous by the wrapper
        k2 = torch.stack([k, k], dim=-1)[..., 0]
        return A.scaled_dot_product_attention(q, k2, v)

    compare("sdpa non-unit last stride", torch.bfloat16, inputs, strided_last,
            lambda q, k, v: attention_ref(q, k, v, sc), ["q", "k", "v"])
    compare("sdpa 3-D inputs", torch.float16, dict(q=rnd(h, s, d), k=rnd(h, 50, d), v=rnd(h, 50, d)),
            lambda q, k, v: A.scaled_dot_product_attention(q, k, v),
            lambda q, k, v: attention_ref(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), sc).squeeze(0),
            ["q", "k", "v"])


def test_caller_layouts():
    """Outputs and gradients come back in the caller's layout, so autograd copies nothing: out
    like q, dq/dk/dv like q/k/v, for (B, H, S, D) and (B, S, H, D) leaves alike."""
    b, hq, hk, s, d = 2, 4, 2, 64, 64
    for layout in ("bhsd", "bshd"):
        shape = (lambda h: (b, h, s, d)) if layout == "bhsd" else (lambda h: (b, s, h, d))
        q, k, v = (torch.randn(shape(h), device="cuda", dtype=torch.bfloat16).requires_grad_() for h in (hq, hk, hk))
        out = R.run(f"caller layout {layout}", A.flash_attention, q, k, v, causal=True, layout=layout)
        if out is None:
            continue
        out.backward(torch.randn_like(out))
        same = [(name, t.stride(), t.grad.stride()) for name, t in (("q", q), ("k", k), ("v", v))]
        ok = out.stride() == q.stride() and all(st == gst for _, st, gst in same)
        R.check(f"caller layout {layout}: out and dq/dk/dv keep the inputs' strides", ok,
                f"out {out.stride()} q {q.stride()}; " + ", ".join(f"{n} {st} grad {gst}" for n, st, gst in same))


def test_masks():
    b, hq, hk, sq, sk, d = 2, 4, 2, 61, 83, 64
    sc = 1.0 / math.sqrt(d)
    qkv = dict(q=rnd(b, hq, sq, d), k=rnd(b, hk, sk, d), v=rnd(b, hk, sk, d))
    gen = torch.Generator(device=DEV).manual_seed(7)
    # Bool masks (True = take part), broadcast from several shapes; a few fully-masked rows.
    for shape in ((sq, sk), (b, 1, 1, sk), (b, hq, sq, sk), (1, hq, sq, 1), (sk,)):
        mask = torch.rand(shape, device=DEV, generator=gen) > 0.3
        if mask.dim() >= 2 and mask.size(-2) == sq and mask.size(-1) == sk:
            mask[..., 3, :] = False  # a row that sees nothing: zeros out, like torch's math SDPA
        compare(f"sdpa bool mask {tuple(shape)} GQA", torch.float16, qkv,
                lambda q, k, v, m=mask: A.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
                lambda q, k, v, m=mask: attention_ref(q, k, v, sc, vis=m), ["q", "k", "v"], bias=True)
    # Float masks (additive), with and without a gradient of their own, broadcast.
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for shape, grad in (((b, hq, sq, sk), True), ((1, hq, 1, sk), True), ((sq, 1), True), ((b, 1, sq, sk), False)):
            inputs = dict(qkv, m=rnd(*shape))
            names = ["q", "k", "v"] + (["m"] if grad else [])
            compare(f"sdpa float mask {tag(dtype)} {tuple(shape)}" + (" +grad" if grad else ""), dtype, inputs,
                    lambda q, k, v, m: A.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
                    lambda q, k, v, m: attention_ref(q, k, v, sc, bias=m), names, bias=True)
    # A float mask of another dtype than the inputs (cast like torch).
    compare("sdpa fp32 mask on bf16 inputs", torch.bfloat16, qkv,
            lambda q, k, v: A.scaled_dot_product_attention(q, k, v, attn_mask=MASK32, enable_gqa=True),
            lambda q, k, v: attention_ref(q, k, v, sc, bias=MASK32.to(q.dtype)), ["q", "k", "v"], bias=True)


MASK32 = None


def test_reference_vs_torch_math():
    """The float64 reference agrees with torch's math SDPA (GQA, mask, causal, scale)."""
    if not wanted("reference"):
        return

    def body():
        b, hq, hk, sq, sk, d = 2, 4, 2, 40, 56, 32
        q, k, v = rnd(b, hq, sq, d), rnd(b, hk, sk, d), rnd(b, hk, sk, d)
        m = rnd(1, hq, sq, sk)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.MATH):
            t1 = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.2, enable_gqa=True)
            t2 = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        r1 = attention_ref(q, k, v, 0.2, bias=m)
        r2 = attention_ref(q, k, v, 1 / math.sqrt(d), vis=visible(sq, sk, causal=True))
        e = max(max_err(t1, r1), max_err(t2, r2))
        R.check("reference == torch math SDPA (float64)", e < 1e-10, f"{e:.1e}")

    R.run("reference == torch math SDPA (float64)", body)


# ---------------------------------------------------------------- flash_attention: windows, bottom-right, bias
def test_windows():
    cases = [  # (sq, sk, window, align, causal, dtype, hq, hk)
        (64, 100, (8, 4), "top_left", False, torch.float16, 2, 2),
        (64, 100, (16, 0), "bottom_right", False, torch.bfloat16, 4, 2),
        (64, 100, (-1, 3), "bottom_right", False, torch.float16, 2, 1),
        (100, 64, (-1, -1), "bottom_right", True, torch.float16, 2, 2),  # rows with no key: zeros
        (90, 90, (20, -1), "top_left", True, torch.float32, 2, 2),
        (37, 200, (0, 0), "top_left", False, torch.bfloat16, 2, 2),
    ]
    for sq, sk, win, align, causal, dtype, hq, hk in cases:
        d = 64
        code = 0 if align == "top_left" else 1
        vis = visible(sq, sk, win[0], win[1], code, causal)
        compare(f"flash window {win} {align}{' causal' if causal else ''} {tag(dtype)} Sq{sq} Sk{sk} Hq{hq} Hk{hk}",
                dtype, dict(q=rnd(2, hq, sq, d), k=rnd(2, hk, sk, d), v=rnd(2, hk, sk, d)),
                lambda q, k, v, w=win, a=align, c=causal: A.flash_attention(q, k, v, causal=c, window_size=w, align=a),
                lambda q, k, v, m=vis: attention_ref(q, k, v, 1 / math.sqrt(d), vis=m), ["q", "k", "v"])
    # bshd layout + bias (with grad) + window
    sq, sk, d = 48, 72, 128
    vis = visible(sq, sk, 10, 10, 1)
    compare("flash bshd bias+grad window (10,10) bottom_right bf16", torch.bfloat16,
            dict(q=rnd(2, sq, 4, d), k=rnd(2, sk, 2, d), v=rnd(2, sk, 2, d), m=rnd(2, 1, sq, sk)),
            lambda q, k, v, m: A.flash_attention(q, k, v, window_size=(10, 10), align="bottom_right", bias=m,
                                                 layout="bshd"),
            lambda q, k, v, m: attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 1 / math.sqrt(d),
                                             bias=m, vis=vis).transpose(1, 2), ["q", "k", "v", "m"], bias=True)
    # LSE (natural log; +inf for rows that see no key)
    if wanted("flash lse"):
        def body():
            q, k = rnd(1, 2, 100, 64), rnd(1, 2, 64, 64)
            v = rnd(1, 2, 64, 64)
            _, lse, _ = A.flash_attention(q.half(), k.half(), v.half(), causal=True, align="bottom_right",
                                          return_aux=True)
            ref = lse_ref(q.half().double(), k.half().double(), 1 / 8, vis=visible(100, 64, causal=True, align=1))
            e = max_err(lse, ref)
            R.check("flash lse (natural log, +inf rows)", e < 1e-2 and torch.isinf(lse[0, 0, :36]).all(), f"{e:.2e}")
        R.run("flash lse (natural log, +inf rows)", body)


# ---------------------------------------------------------------- dropout
def test_dropout():
    for dtype, (b, hq, hk, sq, sk, d), causal, p in (
        (torch.float16, (2, 4, 4, 70, 90, 64), False, 0.2),
        (torch.bfloat16, (2, 8, 2, 128, 128, 128), True, 0.5),
        (torch.float32, (1, 2, 2, 33, 47, 40), False, 0.1),
    ):
        state = {}
        vis = visible(sq, sk, causal=True) if causal else None

        def ours(q, k, v, causal=causal, p=p, dims=(b, hq, sq, sk)):
            out, _, rng = A.flash_attention(q, k, v, causal=causal, dropout_p=p, return_aux=True)
            state["keep"] = A.dropout_mask(rng, *dims, p)
            return out

        compare(f"dropout p{p} {tag(dtype)} B{b} Hq{hq} Hk{hk} Sq{sq} Sk{sk} D{d}" + (" causal" if causal else ""),
                dtype, dict(q=rnd(b, hq, sq, d), k=rnd(b, hk, sk, d), v=rnd(b, hk, sk, d)), ours,
                lambda q, k, v, vis=vis, p=p: attention_ref(q, k, v, 1 / math.sqrt(q.shape[-1]), vis=vis,
                                                            keep=state["keep"], p=p), ["q", "k", "v"],
                dropout=True)
    # dropout + float mask with its gradient
    state = {}

    def ours_mask(q, k, v, m):
        out, _, rng = A.flash_attention(q, k, v, bias=m, dropout_p=0.3, return_aux=True)
        state["keep"] = A.dropout_mask(rng, 2, 2, 40, 60, 0.3)
        return out

    compare("dropout p0.3 + float mask grad fp16", torch.float16,
            dict(q=rnd(2, 2, 40, 64), k=rnd(2, 2, 60, 64), v=rnd(2, 2, 60, 64), m=rnd(1, 2, 40, 60)), ours_mask,
            lambda q, k, v, m: attention_ref(q, k, v, 1 / 8, bias=m, keep=state["keep"], p=0.3), ["q", "k", "v", "m"],
            dropout=True, bias=True)
    if wanted("dropout rng"):
        if forced_backend() == "gluon":  # about the generator and rng_state of calls Gluon refuses
            R.skip("dropout rng", "Gluon has no dropout: no call to check the RNG stream of; the dropout cases "
                                  "above check its refusal")
        else:
            R.run("dropout rng", dropout_rng)


def gen_offset(gen):
    if hasattr(gen, "get_offset"):
        return int(gen.get_offset())
    state = torch.cuda.get_rng_state()  # seed (8 bytes) then offset (8 bytes)
    return int(state[8:16].view(torch.int64).item())


def dropout_rng():
    b, hq, hk, sq, sk, d, p = 2, 4, 2, 100, 130, 64, 0.25
    q, k, v = (rnd(*s).half() for s in ((b, hq, sq, d), (b, hk, sk, d), (b, hk, sk, d)))
    gen = torch.cuda.default_generators[torch.cuda.current_device()]
    torch.manual_seed(1234)
    seed = gen.initial_seed()
    off0 = gen_offset(gen)
    o1, _, rng1 = A.flash_attention(q, k, v, dropout_p=p, return_aux=True)
    off1 = gen_offset(gen)
    o2, _, rng2 = A.flash_attention(q, k, v, dropout_p=p, return_aux=True)
    off2 = gen_offset(gen)
    inc = A.philox_increment(b, hq, sq, sk)
    expect_inc = (b * hq * 8 * math.ceil(sq / 16) * 4 * math.ceil(sk / 16) + 3) // 4 * 4
    R.check("dropout rng: generator advances by philox_increment", off1 - off0 == inc == expect_inc and off2 - off1 == inc,
            f"advances {off1 - off0}, {off2 - off1}; documented {expect_inc}")
    r1, r2 = rng1.tolist(), rng2.tolist()
    R.check("dropout rng: rng_state = (seed, offset before the call)",
            r1 == [seed, off0] and r2 == [seed, off1], f"{r1} {r2} seed {seed} offsets {off0} {off1}")
    m1, m2 = A.dropout_mask(rng1, b, hq, sq, sk, p), A.dropout_mask(rng2, b, hq, sq, sk, p)
    frac = m1.mean().item()
    R.check("dropout rng: two calls give different masks and outputs",
            not torch.equal(m1, m2) and not torch.equal(o1, o2), f"mask differences {(m1 != m2).sum().item()}")
    R.check("dropout rng: kept fraction ~ 1 - p", abs(frac - (1 - p)) < 0.01, f"{frac:.4f}")
    torch.manual_seed(1234)
    o1b = A.scaled_dot_product_attention(q, k, v, dropout_p=p, enable_gqa=True)
    o2b = A.scaled_dot_product_attention(q, k, v, dropout_p=p, enable_gqa=True)
    R.check("dropout rng: manual_seed reproduces (sdpa == flash_attention, bitwise)",
            torch.equal(o1, o1b) and torch.equal(o2, o2b))
    torch.cuda.manual_seed(99)
    o3 = A.scaled_dot_product_attention(q, k, v, dropout_p=p, enable_gqa=True)
    R.check("dropout rng: another seed gives another mask", not torch.equal(o3, o1))


# ---------------------------------------------------------------- varlen
def varlen_case(dtype, lens_q, lens_k, hq, hk, d, causal=False, window=(-1, -1), align="top_left", p=0.0,
                pad_q=0, pad_k=0):
    name = (f"varlen {tag(dtype)} q{lens_q}+{pad_q} k{lens_k}+{pad_k} Hq{hq} Hk{hk} D{d}"
            + (" causal" if causal else "") + (f" window{window}" if window != (-1, -1) else "")
            + f" {align}" + (f" p{p}" if p else ""))
    cq = [0]
    for n in lens_q:
        cq.append(cq[-1] + n)
    ck = [0]
    for n in lens_k:
        ck.append(ck[-1] + n)
    cu_q = torch.tensor(cq, device=DEV, dtype=torch.int32)
    cu_k = torch.tensor(ck, device=DEV, dtype=torch.int32)
    mq, mk = max(lens_q), max(max(lens_k), 1)
    code = 0 if align == "top_left" else 1
    state = {}

    def ours(q, k, v):
        out, _, rng = A.flash_attn_varlen(q, k, v, cu_q, cu_k, mq, mk, dropout_p=p, causal=causal, window_size=window,
                                          align=align, return_aux=True)
        if p:
            state["keep"] = A.dropout_mask(rng, len(lens_q), hq, mq, mk, p)
        return out

    def ref(q, k, v):
        outs = []
        for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
            qb = q[cq[i]:cq[i + 1]].transpose(0, 1).unsqueeze(0)
            kb = k[ck[i]:ck[i + 1]].transpose(0, 1).unsqueeze(0)
            vb = v[ck[i]:ck[i + 1]].transpose(0, 1).unsqueeze(0)
            if lk == 0:
                outs.append(torch.zeros_like(q[cq[i]:cq[i + 1]]) + 0 * q[cq[i]:cq[i + 1]])
                continue
            vis = visible(lq, lk, window[0], window[1], code, causal)
            keep = state["keep"][i:i + 1, :, :lq, :lk] if p else None
            ob = attention_ref(qb, kb, vb, 1 / math.sqrt(d), vis=vis, keep=keep, p=p)
            outs.append(ob.squeeze(0).transpose(0, 1))
        if pad_q:
            outs.append(torch.zeros(pad_q, hq, d, device=DEV, dtype=q.dtype) + 0 * q[cq[-1]:])
        return torch.cat(outs, 0) + 0 * k.sum() + 0 * v.sum()  # keeps every input in the graph

    tq, tk = cq[-1] + pad_q, ck[-1] + pad_k
    compare(name, dtype, dict(q=rnd(tq, hq, d), k=rnd(tk, hk, d), v=rnd(tk, hk, d)), ours, ref, ["q", "k", "v"],
            dropout=bool(p), varlen=True)


def test_varlen():
    varlen_case(torch.float16, (17, 64, 5), (30, 64, 9), 4, 4, 64)
    varlen_case(torch.bfloat16, (17, 64, 5), (30, 64, 9), 8, 2, 128, causal=True)
    varlen_case(torch.float16, (17, 64, 5), (30, 64, 9), 4, 2, 64, causal=True, align="bottom_right")
    varlen_case(torch.bfloat16, (100, 33), (80, 200), 2, 2, 64, window=(16, 8), align="bottom_right")
    varlen_case(torch.float32, (31, 7, 64), (31, 7, 64), 2, 1, 40, causal=True, window=(8, -1))
    varlen_case(torch.float16, (40, 12), (50, 20), 4, 4, 64, pad_q=6, pad_k=5)  # padding tokens: zeros
    varlen_case(torch.float16, (40, 60), (50, 70), 4, 2, 64, causal=True, p=0.2)
    varlen_case(torch.float16, (9, 20), (0, 25), 2, 2, 64)  # a sequence without keys: zeros


# ---------------------------------------------------------------- varlen offsets: clamped or checked
POISON = -0x2F2F2F30  # an int32 pattern no kernel writes


def nan_fenced(total, h, d, pad=64):
    """A (total, h, d) fp16 leaf inside a buffer whose `pad` tokens on each side are NaN: a read
    outside the tensor brings NaN into the results."""
    buf = torch.full((pad + total + pad, h, d), float("nan"), device=DEV, dtype=torch.float16)
    t = buf[pad:pad + total]
    t.copy_(torch.randn(total, h, d, device=DEV, dtype=torch.float16))
    return t.requires_grad_()


def fenced_allocations(fn):
    """Runs fn() with its allocations (the op's outputs and workspaces) carved from a private memory
    pool whose memory was filled with POISON, right after a POISON guard; returns (fn's result,
    the number of changed guard words, a bool mask of the pool words after fn's allocations that
    lost the poison). A write past an output changes them; so do fn's own temporaries, freed and
    then reused by the tail: compare the mask with a valid call's (`same_tail`). Only this
    thread's allocations go to the pool: fn calls the ops itself (autograd's backward would run on
    its device thread)."""
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        # Two 1 MiB requests fill one 2 MiB segment; freed, it stays in the pool, poisoned.
        fill = [torch.full((1 << 18,), POISON, device=DEV, dtype=torch.int32) for _ in range(2)]
        del fill
        guard = torch.full((1 << 12,), POISON, device=DEV, dtype=torch.int32)
        result = fn()
        tail = torch.empty((1 << 17,), device=DEV, dtype=torch.int32)  # the pool memory after fn's
        torch.cuda.synchronize()
        bad_guard = int((guard != POISON).sum())
        changed_tail = tail != POISON
    return result, bad_guard, changed_tail


def test_varlen_offsets():
    """flash_attn_varlen with invalid cu_seqlens. Default: the kernels clamp (the result is that of
    the clamped offsets, bitwise), set varlen_status's bits, read nothing outside q/k/v (NaN guards)
    and write nothing outside the outputs (poisoned guard memory). check_cu_seqlens=True: ValueError
    naming the problem, and nothing launched (varlen_status stays 0)."""
    if not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
        R.skip("varlen offsets", f"torch {torch.__version__} has no torch.cuda.MemPool/use_mem_pool")
        return
    hq, d, total = 2, 64, 24
    q, k, v = (nan_fenced(total, hq, d) for _ in range(3))
    dout = torch.randn(total, hq, d, device=DEV, dtype=torch.float16)

    def cu(*offsets):
        return torch.tensor(offsets, device=DEV, dtype=torch.int32)

    good = cu(0, 8, 24)

    # The comparisons below are bitwise: deterministic backwards (the Gluon backward's dQ reduce-adds
    # would otherwise sum in a different order on every call).
    def call(cu_q, cu_k, max_q, max_k, **kw):  # through the Python wrapper and autograd
        out = A.flash_attn_varlen(q, k, v, cu_q, cu_k, max_q, max_k, deterministic=True, **kw)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    def ops(cu_q, cu_k, max_q, max_k, status=None):  # the ops themselves, forward then backward
        q4, k4, v4, dout4 = (t.detach().unsqueeze(0).transpose(1, 2) for t in (q, k, v, dout))
        scale = 1 / math.sqrt(d)
        out, lse, rng = torch.ops.aotriton.fwd(q4, k4, v4, None, cu_q, cu_k, max_q, max_k, scale, False, -1, -1, 0,
                                               0.0, False, False, status)
        dq, dk, dv, _ = torch.ops.aotriton.bwd(dout4, q4, k4, v4, out, lse, None, False, cu_q, cu_k, max_q, max_k,
                                               scale, False, -1, -1, 0, 0.0, rng, False, True, False, status)
        return out, dq, dk, dv

    # (name, cu_q, cu_k, max_q, max_k, status bits, the valid call the clamped one must equal, error needle)
    cases = [
        ("q offset past the tensor", cu(0, 8, 88), good, 80, 16, 1, (good, good, 80, 16), "ends at token 88"),
        ("k offset past the tensor", good, cu(0, 8, 88), 16, 80, 1, (good, good, 16, 80), "ends at token 88"),
        ("negative first offset", cu(-64, 8, 24), good, 80, 16, 1, (good, good, 80, 16), "must be 0"),
        ("decreasing offsets", cu(0, 16, 8), good, 16, 16, 2, (cu(0, 16, 16), good, 16, 16), "decreases"),
        ("sequence above max_seqlen_q", good, good, 8, 16, 4, (cu(0, 8, 16), good, 8, 16), "max length"),
    ]
    for name, cu_q, cu_k, max_q, max_k, bits, same_as, needle in cases:
        label = f"varlen offsets: {name}"
        if not wanted(label):
            continue

        def clamped():
            status = torch.zeros(1, device=DEV, dtype=torch.int32)
            (got, bad_guard, changed) = fenced_allocations(lambda: ops(cu_q, cu_k, max_q, max_k, status))
            # The valid call with the clamped offsets: same shapes, so the same temporaries.
            (want, valid_guard, valid_changed) = fenced_allocations(lambda: ops(*same_as))
            extra = int((changed & ~valid_changed).sum())
            differ = [what for what, a, b in zip(("out", "dq", "dk", "dv"), got, want) if not torch.equal(a, b)]
            R.check(f"{label}: clamped, status {bits}, nothing touched outside the tensors",
                    bad_guard == 0 and extra == 0 and not differ and int(status.item()) == bits,
                    f"changed words: guard {bad_guard}, after the outputs {int(changed.sum())} of which {extra} "
                    f"not also changed by the valid call's temporaries ({int(valid_changed.sum())}); "
                    f"differ from the clamped offsets' call: {differ or 'none'}; status {int(status.item())}")

        R.run(label, clamped)
        status = torch.zeros(1, device=DEV, dtype=torch.int32)
        expect_error(f"{label}: check_cu_seqlens raises",
                     lambda: A.flash_attn_varlen(q, k, v, cu_q, cu_k, max_q, max_k, check_cu_seqlens=True,
                                                 varlen_status=status), ValueError, needle)
        R.check(f"{label}: check_cu_seqlens launched nothing", int(status.item()) == 0, f"status {int(status.item())}")

    if wanted("varlen offsets: valid"):
        def valid():
            status = torch.zeros(1, device=DEV, dtype=torch.int32)
            checked = call(good, good, 16, 16, check_cu_seqlens=True, varlen_status=status)
            plain = call(good, good, 16, 16)
            R.check("varlen offsets: valid offsets, checked = unchecked (bitwise), status 0",
                    all(torch.equal(a, b) for a, b in zip(checked, plain)) and int(status.item()) == 0,
                    f"status {int(status.item())}")
        R.run("varlen offsets: valid", valid)


# ---------------------------------------------------------------- errors and edges
def expect_error(name, fn, exc, needle):
    if not wanted(name):
        return
    try:
        fn()
    except exc as e:
        R.check(name, needle in str(e), f"{type(e).__name__}: {str(e)[:200]}")
        return
    except Exception as e:  # noqa: BLE001
        R.check(name, False, f"raised {type(e).__name__} instead of {exc}: {str(e)[:200]}")
        return
    R.check(name, False, "no error raised")


def sinks_ref(q, k, v, sinks, scale, vis):
    """Attention with sinks (gpt-oss's eager form): the sink logit as one more column of the scaled
    scores, softmax, the column dropped. q (B, Hq, Sq, D), k/v (B, Hk, Sk, D), sinks (Hq,), vis
    (Sq, Sk) bool. Returns (out, lse)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = torch.where(vis, s, torch.full_like(s, -math.inf))
    t = sinks.to(s.dtype).reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)
    full = torch.cat([s, t], -1)
    p = torch.softmax(full, -1)[..., :-1]
    return torch.matmul(p, v), torch.logsumexp(full.double(), -1)


def test_sinks():
    # Sinks from negligible to dominant, GQA, windows, rows without keys (bottom-right causal with
    # Sq > Sk: O = 0, LSE = the sink), (B, S, H, D) inputs; gradients of q, k, v and the sinks.
    sinks_of = {4: [0.5, -30.0, 3.0, 8.0], 8: [0.5, -1.0, 3.0, -30.0, 8.0, 0.0, 1.5, -2.0], 2: [1.0, -1.0]}
    for dtype in (torch.bfloat16, torch.float16):
        for b, hq, hk, sq, sk, d, causal, window, align, layout in (
                (2, 8, 2, 300, 300, 128, True, (-1, -1), "top_left", "bhsd"),
                (1, 4, 4, 257, 513, 64, False, (64, 16), "top_left", "bhsd"),
                (2, 4, 2, 200, 150, 96, True, (-1, -1), "bottom_right", "bshd"),
                (1, 2, 1, 129, 200, 256, False, (-1, -1), "top_left", "bhsd")):
            name = (f"sinks {tag(dtype)} B{b} Hq{hq} Hk{hk} Sq{sq} Sk{sk} D{d} {layout}" + (" causal" if causal else "")
                    + (f" window{window}" if window != (-1, -1) else "") + f" {align}")
            if not wanted(name):
                continue
            sinks64 = torch.tensor(sinks_of[hq], device=DEV, dtype=F64)
            left, right = window if not causal else (window[0], 0)
            vis = visible(sq, sk, left, right, align=1 if align == "bottom_right" else 0, causal=causal)
            scale = 1 / math.sqrt(d)
            q64, k64, v64 = rnd(b, hq, sq, d), rnd(b, hk, sk, d), rnd(b, hk, sk, d)
            dout64 = rnd(b, hq, sq, d).to(dtype).to(F64)

            def ours():
                q, k, v = (t.to(dtype).requires_grad_() for t in (q64, k64, v64))
                sinks = sinks64.float().requires_grad_()
                args = (q, k, v) if layout == "bhsd" else tuple(t.transpose(1, 2) for t in (q, k, v))
                out, lse, _ = A.flash_attention(*args, causal=causal, window_size=window, align=align, layout=layout,
                                                sinks=sinks, return_aux=True)
                out = out if layout == "bhsd" else out.transpose(1, 2)
                return out, lse, (q, k, v, sinks)

            if forced_backend() == "gluon":
                R.refused(name, "sinks", ours)
                continue

            def body():
                out, lse, leaves = ours()
                grads = torch.autograd.grad(out, leaves, dout64.to(dtype))
                refs = []
                for dt in (F64, dtype):
                    leaves_r = [t.to(dt).detach().requires_grad_() for t in (q64, k64, v64)]
                    sinks_r = sinks64.to(F64 if dt == F64 else torch.float32).detach().requires_grad_()
                    o, l = sinks_ref(*leaves_r, sinks_r, scale, vis)
                    refs.append((o, l, torch.autograd.grad(o, [*leaves_r, sinks_r], dout64.to(dt))))
                (ro, rl, rg), (lo, _, lg) = refs
                details, ok = [], True
                for what, o, r, l, k in [("out", out, ro, lo, 3.0)] + [
                        (f"d{n}", g, rr, ll, 5.0) for n, g, rr, ll in zip(("q", "k", "v", "sinks"), grads, rg, lg)]:
                    e, bound = max_err(o, r), k * max_err(l, r) + 1e-3
                    ok &= e <= bound
                    details.append(f"{what} {e:.2e}/{bound:.2e}" + ("" if e <= bound else " <-- over"))
                e = max_err(lse, rl)
                ok &= e <= 1e-2
                details.append(f"lse {e:.2e}")
                R.check(name, ok, " ".join(details))
            R.run(name, body)
    q = rnd(1, 4, 64, 64).to(torch.bfloat16)
    sinks = torch.zeros(4, device=DEV)
    for name, fn, words in (
            ("sinks with dropout", lambda: A.flash_attention(q, q, q, dropout_p=0.1, sinks=sinks), ("sinks", "dropout")),
            ("sinks with alibi", lambda: A.flash_attention(q, q, q, sinks=sinks, alibi_slopes=sinks), ("sinks",)),
            ("sinks fp32 inputs", lambda: A.flash_attention(q.float(), q.float(), q.float(), sinks=sinks), ("sinks",)),
            ("sinks per key head", lambda: A.flash_attention(q, q[:, :2], q[:, :2], sinks=sinks[:2]), ("sinks",)),
            ("sinks bf16", lambda: A.flash_attention(q, q, q, sinks=sinks.bfloat16()), ("sinks",))):
        try:
            fn()
            R.check(f"refuses {name}", False, "no error")
        except (RuntimeError, ValueError, TypeError) as e:
            R.check(f"refuses {name}", all(w in str(e) for w in words), str(e)[:160])


def test_errors():
    def t(*shape, dtype=torch.float16, dev=DEV):
        return torch.randn(*shape, device=dev, dtype=dtype)

    sdpa = A.scaled_dot_product_attention
    expect_error("error: head dim 100", lambda: sdpa(t(1, 2, 8, 100), t(1, 2, 8, 100), t(1, 2, 8, 100)),
                 NotImplementedError, "aotriton: head dim 100 is not a multiple of 8")
    expect_error("error: head dim 520", lambda: sdpa(t(1, 2, 8, 520), t(1, 2, 8, 520), t(1, 2, 8, 520)),
                 NotImplementedError, "head dim 520 is above 512")
    expect_error("error: fp32 head dim 264",
                 lambda: sdpa(*(t(1, 2, 8, 264, dtype=torch.float32) for _ in range(3))),
                 NotImplementedError, "head dim 264 is above 256 for float32")
    expect_error("error: float64", lambda: sdpa(*(t(1, 2, 8, 64, dtype=F64) for _ in range(3))),
                 NotImplementedError, "float64")
    expect_error("error: cpu tensors", lambda: sdpa(*(t(1, 2, 8, 64, dtype=torch.float32, dev="cpu") for _ in range(3))),
                 NotImplementedError, "CUDA")
    # V's own head dim: a bucket pair the library does not compile (64/32) is named by it (a forced
    # Gluon backend refuses V's own head dim first); float32 is refused up front.
    expect_error("error: head dims 64/32 not compiled",
                 lambda: sdpa(t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 32)), (NotImplementedError, RuntimeError),
                 "V's head dim 32" if forced_backend() == "gluon" else "head_dim_v=32")
    expect_error("error: fp32 value head dim differs",
                 lambda: sdpa(*(t(1, 2, 8, n, dtype=torch.float32) for n in (128, 128, 64))),
                 NotImplementedError, "value head dim 64 differs from query head dim 128")
    expect_error("error: GQA heads without enable_gqa", lambda: sdpa(t(1, 8, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64)),
                 RuntimeError, "enable_gqa")
    expect_error("error: GQA heads not a divisor",
                 lambda: sdpa(t(1, 6, 8, 64), t(1, 4, 8, 64), t(1, 4, 8, 64), enable_gqa=True), RuntimeError, "divide")
    expect_error("error: mask with is_causal",
                 lambda: sdpa(t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64), attn_mask=t(8, 8), is_causal=True),
                 RuntimeError, "is_causal")
    expect_error("error: mask not broadcastable",
                 lambda: sdpa(t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64), attn_mask=t(3, 8, 8)),
                 RuntimeError, "broadcastable")
    expect_error("error: dropout_p 1", lambda: sdpa(t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64), dropout_p=1.0),
                 ValueError, "dropout_p")
    expect_error("error: bad align", lambda: A.flash_attention(t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64),
                                                               align="middle"), ValueError, "align")
    # The library's own checks surface as Python exceptions carrying aotriton's message.
    q = t(1, 2, 8, 64)
    expect_error("error: op-level dtype mismatch (kDTypeMismatch)",
                 lambda: torch.ops.aotriton.fwd(q, t(1, 2, 8, 64, dtype=torch.bfloat16), t(1, 2, 8, 64, dtype=torch.bfloat16),
                                                None, None, None, 0, 0, 0.125, False, -1, -1, 0, 0.0, False),
                 TypeError, "kDTypeMismatch")
    for p in (float("nan"), -0.1, 1.0):  # the op itself refuses them (NaN and -0.1 once meant "no dropout")
        expect_error(f"error: op-level dropout_p {p}",
                     lambda: torch.ops.aotriton.fwd(q, q, q, None, None, None, 0, 0, 0.125, False, -1, -1, 0, p, False),
                     ValueError, "dropout_p")
    expect_error("error: dropout counters overflow 64 bits (never wrap)",
                 lambda: A.philox_increment(65535, 65535, 1 << 30, 1 << 30), ValueError, "kTooLarge")
    expect_error("error: op-level last stride 2 (kBadStrides)",
                 lambda: torch.ops.aotriton.fwd(t(1, 2, 8, 128)[..., ::2], q, q, None, None, None, 0, 0, 0.125, False,
                                                -1, -1, 0, 0.0, False), ValueError, "kBadStrides")
    if wanted("empty"):
        out = R.run("empty query", lambda: sdpa(t(1, 2, 0, 64), t(1, 2, 8, 64), t(1, 2, 8, 64)))
        if out is not None:
            R.check("empty query", out.shape == (1, 2, 0, 64))


def test_readme_example():
    """Runs the PyTorch example of the top-level README.md (its ```python block that imports
    aotriton.torch as aot; the one-line activation block is test_registered.py's). Under a
    forced Gluon backend the example must run up to its dropout call (bf16, D 128), which must be
    refused: the refusal naming dropout shows the SDPA forward + backward before it ran and passed
    its assert."""
    if not wanted("readme"):
        return
    path = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")

    def body():
        text = open(path).read()
        code = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "import aotriton.torch as aot" in b][0]
        scope = {}
        why = gluon_refuses(torch.bfloat16, 128, backward=True, dropout=True)  # the example trains
        if why:
            R.refused("README PyTorch example, at its dropout call", why, exec, compile(code, "README.md", "exec"),
                      scope)
            return
        exec(compile(code, "README.md", "exec"), scope)
        R.check("README PyTorch example runs", True)

    R.run("README PyTorch example runs", body)


def main():
    global ARGS, MASK32
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", help="only cases whose name contains this")
    ARGS = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device")
        R.check("CUDA device present", False)
        R.finish()
    torch.manual_seed(0)
    print("torch", torch.__version__, "| aotriton", A.version(), "|", torch.cuda.get_device_name())
    MASK32 = torch.randn(2, 1, 61, 83, device=DEV, dtype=torch.float32)
    for test in (test_reference_vs_torch_math, test_dtypes_and_head_dims, test_causal_scale_gqa, test_layouts,
                 test_caller_layouts,
                 test_masks, test_windows, test_dropout, test_varlen, test_varlen_offsets, test_sinks, test_errors,
                 test_readme_example):
        R.run(test.__name__, test)
    R.finish()


if __name__ == "__main__":
    main()
