"""The registered flash-attention implementation's plumbing, on the CPU (no GPU, no extension).

aotriton.flash_impl puts its functions behind torch's aten flash ops. This test installs them at
the CPU dispatch key with a float64 stand-in for the two extension ops (``aotriton::fwd/bwd``), so
that what the functions send the kernels (layouts, windows, alignment, packed offsets, scale) and
what they hand back to torch (strides as the ops' meta functions promise, LSE shapes, the rng
pair, gradients through aten's own derivative formulas, varlen_attn, opcheck, torch.compile) is
checked wherever torch is installed. The stand-in checks the arguments; it proves no kernel: the
GPU tests (test_registered.py, test_flash_attn_compat.py) run the real ones against float64. It also
checks what aotriton.flash_attn (FlashAttention-2's functions) hands aotriton.torch.

    PYTHONPATH=bindings/torch/python:test/torch python test/torch/test_flash_impl_plumbing.py
"""
import math
import sys

import torch

from harness import Runner, attention_ref, gqa_kwargs, lse_ref, max_err, visible

import aotriton.torch as aot
from aotriton import flash_impl


def alloc_like(t):
    """The C++ ops' alloc_like: t's strides when dense with a unit last stride, else B,S,H,D memory."""
    if aot._keeps_layout(t):
        return t.new_empty_strided(t.shape, t.stride())
    b, h, s, d = t.shape
    return t.new_empty((b, s, h, d)).transpose(1, 2)


class StandIn:
    """float64 attention with the extension ops' signatures; records every call's arguments."""

    def __init__(self):
        self.calls = []

    @staticmethod
    def _segments(q4, k4, cu_q, cu_k):
        """(batch index, q slice, k slice) per sequence: dense rows, or packed sequences."""
        if cu_q is None:
            return [(b, slice(0, q4.size(2)), slice(0, k4.size(2))) for b in range(q4.size(0))]
        cq, ck = cu_q.tolist(), cu_k.tolist()
        return [(0, slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])) for i in range(len(cq) - 1)]

    def _forward64(self, q4, k4, v4, cu_q, cu_k, sm_scale, causal, left, right, align):
        out = torch.zeros(q4.shape, dtype=torch.float64)
        lse = torch.full(q4.shape[:3], math.inf, dtype=torch.float64)
        for b, sq, sk in self._segments(q4, k4, cu_q, cu_k):
            q, k, v = (t[b:b + 1, :, s].double() for t, s in ((q4, sq), (k4, sk), (v4, sk)))
            vis = visible(q.size(2), k.size(2), left, right, align, causal, device="cpu")
            out[b:b + 1, :, sq] = attention_ref(q, k, v, sm_scale, vis=vis)
            lse[b:b + 1, :, sq] = lse_ref(q, k, sm_scale, vis=vis)
        return out, lse

    def _backward64(self, dout, q4, k4, v4, out4, lse, cu_q, cu_k, sm_scale, causal, left, right, align):
        """Attention's gradients as a flash backward computes them, from the out and LSE it is
        given (the kernels run below autograd, so no autograd here): P = exp(scale QK^T - LSE),
        dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q; GQA
        groups summed into their key head."""
        dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float64) for t in (q4, k4, v4))
        g = q4.size(1) // k4.size(1)
        for b, sq, sk in self._segments(q4, k4, cu_q, cu_k):
            q, k, v, do, o = (t[b, :, s].double() for t, s in ((q4, sq), (k4, sk), (v4, sk), (dout, sq), (out4, sq)))
            rows = lse[b, :, sq].double().unsqueeze(-1)
            k, v = k.repeat_interleave(g, dim=0), v.repeat_interleave(g, dim=0)
            vis = visible(q.size(1), k.size(1), left, right, align, causal, device="cpu")
            s_ = torch.matmul(q, k.transpose(-1, -2)) * sm_scale
            p = torch.where(vis & torch.isfinite(rows), torch.exp(s_ - rows), torch.zeros_like(s_))
            dp = torch.matmul(do, v.transpose(-1, -2))
            ds = p * (dp - (do * o).sum(-1, keepdim=True))
            dq[b, :, sq] = sm_scale * torch.matmul(ds, k)
            dk_full = sm_scale * torch.matmul(ds.transpose(-1, -2), q)
            dv_full = torch.matmul(p.transpose(-1, -2), do)
            dk[b, :, sk] = dk_full.reshape(k4.size(1), g, *dk_full.shape[1:]).sum(1)
            dv[b, :, sk] = dv_full.reshape(k4.size(1), g, *dv_full.shape[1:]).sum(1)
        return dq, dk, dv

    def fwd(self, q4, k4, v4, bias, cu_q, cu_k, max_q, max_k, sm_scale, causal, left, right, align, dropout_p,
            allow_tf32, check_cu_seqlens, varlen_status, softcap=0.0, alibi_slopes=None, sinks=None):
        self.calls.append(("fwd", dict(align=align, causal=causal, left=left, right=right, sm_scale=sm_scale,
                                       bias=bias, dropout_p=dropout_p, q_stride=q4.stride(), packed=cu_q is not None,
                                       max_q=max_q, max_k=max_k, softcap=softcap)))
        assert softcap == 0.0, "torch's flash ops have no softcap: the registered functions pass 0"
        assert alibi_slopes is None, "the registered functions refuse torch's alibi_slopes"
        assert sinks is None, "torch's flash ops have no sinks"
        assert q4.dim() == 4 and q4.stride(-1) == 1, "the kernels take (B, H, S, D) views with a unit last stride"
        out64, lse = self._forward64(q4, k4, v4, cu_q, cu_k, sm_scale, causal, left, right, align)
        out = alloc_like(q4)
        out.copy_(out64)
        return out, lse.float(), torch.tensor([1234, 5678], dtype=torch.int64)

    def bwd(self, dout, q4, k4, v4, out, lse, bias, bias_requires_grad, cu_q, cu_k, max_q, max_k, sm_scale, causal,
            left, right, align, dropout_p, rng_state, allow_tf32, deterministic, check_cu_seqlens, varlen_status,
            softcap=0.0, alibi_slopes=None, sinks=None, dsinks=None):
        self.calls.append(("bwd", dict(align=align, causal=causal, left=left, right=right, sm_scale=sm_scale,
                                       rng=rng_state.tolist(), lse_shape=tuple(lse.shape), dout_stride=dout.stride())))
        assert softcap == 0.0, "torch's flash ops have no softcap: the registered functions pass 0"
        assert alibi_slopes is None, "the registered functions refuse torch's alibi_slopes"
        assert lse.dim() == 3 and lse.shape == q4.shape[:3], "LSE must be (B, Hq, Sq) ((1, Hq, total) packed)"
        assert rng_state.dtype == torch.int64 and dout.stride(-1) == 1 and lse.stride(-1) == 1
        grads = self._backward64(dout, q4, k4, v4, out, lse, cu_q, cu_k, sm_scale, causal, left, right, align)
        result = []
        for g, t in zip(grads, (q4, k4, v4)):
            r = alloc_like(t)
            r.copy_(g)
            result.append(r)
        return (*result, q4.new_empty(0))


def check_flash_attn_mapping(run):
    """aotriton.flash_attn (FlashAttention-2's functions) hands aotriton.torch what FA2 means:
    (B, S, H, D) layout, bottom-right causal and windows, the true head dim's scale with the head
    dim padded to a multiple of 8 (the output cut back), deterministic, the LSE on request."""
    import aotriton.flash_attn as fa

    seen = []

    def flash_attention(q, k, v, **kw):
        seen.append(("dense", q.shape, kw))
        out = torch.zeros(q.shape, dtype=q.dtype)
        return out, torch.full((q.size(0), q.size(2), q.size(1)), 0.5), torch.zeros(2, dtype=torch.int64)

    def flash_attn_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        seen.append(("varlen", q.shape, dict(kw, max_q=max_q, max_k=max_k)))
        return torch.zeros(q.shape, dtype=q.dtype), torch.full((q.size(1), q.size(0)), 0.5), torch.zeros(2)

    real = (aot.flash_attention, aot.flash_attn_varlen)
    aot.flash_attention, aot.flash_attn_varlen = flash_attention, flash_attn_varlen
    try:
        q = torch.randn(2, 7, 4, 100)
        k = torch.randn(2, 9, 2, 100)
        out = fa.flash_attn_func(q, k, k, causal=True, window_size=(5, -1), deterministic=True)
        kind, shape, kw = seen[-1]
        run.check("flash_attn_func: bshd layout, bottom-right, window, deterministic",
                  kw["layout"] == "bshd" and kw["align"] == "bottom_right" and kw["causal"] is True
                  and tuple(kw["window_size"]) == (5, -1) and kw["deterministic"] is True, str(kw))
        run.check("flash_attn_func: head dim 100 padded to 104, scale of 100, output cut back to 100",
                  shape[-1] == 104 and abs(kw["scale"] - 100 ** -0.5) < 1e-12 and out.shape == (2, 7, 4, 100),
                  f"{shape} {kw['scale']} {tuple(out.shape)}")
        out, lse = fa.flash_attn_func(q[..., :64], k[..., :64], k[..., :64], softmax_scale=0.3,
                                      return_softmax_lse=True)
        run.check("flash_attn_func: softmax_scale passed, LSE returned on request",
                  seen[-1][2]["scale"] == 0.3 and lse.shape == (2, 4, 7), str(tuple(lse.shape)))
        qkv = torch.randn(2, 7, 3, 4, 64)
        fa.flash_attn_qkvpacked_func(qkv, causal=True)
        run.check("flash_attn_qkvpacked_func: q, k, v split from dim 2", seen[-1][1] == (2, 7, 4, 64))
        cu = torch.tensor([0, 3, 10], dtype=torch.int32)
        fa.flash_attn_varlen_func(torch.randn(10, 4, 64), torch.randn(10, 2, 64), torch.randn(10, 2, 64), cu, cu, 7, 7,
                                  causal=True)
        kind, shape, kw = seen[-1]
        run.check("flash_attn_varlen_func: packed, bottom-right causal, max lengths",
                  kind == "varlen" and kw["align"] == "bottom_right" and kw["causal"] and kw["max_q"] == 7, str(kw))
        fa.flash_attn_func(q, k, k, softcap=30.0)
        run.check("flash_attn_func: softcap passed on", seen[-1][2]["softcap"] == 30.0, str(seen[-1][2]))
        fa.flash_attn_varlen_func(q[0], k[0], k[0], cu, cu, 7, 7, softcap=2.5)
        run.check("flash_attn_varlen_func: softcap passed on", seen[-1][2]["softcap"] == 2.5, str(seen[-1][2]))
        slopes = torch.rand(4)
        fa.flash_attn_func(q, k, k, alibi_slopes=slopes)
        run.check("flash_attn_func: alibi_slopes passed on, bottom-right", seen[-1][2]["alibi_slopes"] is slopes
                  and seen[-1][2]["align"] == "bottom_right", str(seen[-1][2]))
        fa.flash_attn_varlen_func(q[0], k[0], k[0], cu, cu, 7, 7, alibi_slopes=slopes[None].expand(2, 4))
        run.check("flash_attn_varlen_func: alibi_slopes passed on", seen[-1][2]["alibi_slopes"].shape == (2, 4),
                  str(seen[-1][2]))
        sinks = torch.rand(4)
        fa.flash_attn_func(q, k, k, sinks=sinks)
        run.check("flash_attn_func: sinks passed on", seen[-1][2]["sinks"] is sinks, str(seen[-1][2]))
        fa.flash_attn_varlen_func(q[0], k[0], k[0], cu, cu, 7, 7, sinks=sinks)
        run.check("flash_attn_varlen_func: sinks passed on", seen[-1][2]["sinks"] is sinks, str(seen[-1][2]))
        n = len(seen)
        for name, call in (("return_attn_probs", lambda: fa.flash_attn_func(q, k, k, return_attn_probs=True)),
                           ("block_table", lambda: fa.flash_attn_varlen_func(q[0], k[0], k[0], cu, cu, 7, 7,
                                                                             block_table=torch.zeros(1, 1)))):
            try:
                call()
                run.check(f"flash_attn refuses {name}", False, "no error")
            except NotImplementedError as e:
                run.check(f"flash_attn refuses {name}", name in str(e), str(e)[:120])
        run.check("flash_attn refusals reach no kernel", len(seen) == n)
    finally:
        aot.flash_attention, aot.flash_attn_varlen = real


def main():
    torch.manual_seed(0)
    run = Runner("flash_impl_plumbing")
    stand_in = StandIn()
    aot._ops = lambda: stand_in  # the extension ops -> the float64 stand-in (this process only)

    run.check("import aotriton.torch registers 'aotriton' in torch's registry",
              flash_impl.is_registered(), str(torch.nn.attention.list_flash_attention_impls()))
    handle = flash_impl.install("CPU")
    tol = {torch.float32: 2e-5, torch.bfloat16: 3e-2}

    def rand(*shape, dtype):
        return torch.randn(*shape, dtype=dtype)

    # SDPA's flash op: (B, H, S, D), torch's own layouts; bhsd and bshd memory and a non-dense view.
    for dtype in (torch.float32, torch.bfloat16):
        for layout in ("bhsd", "bshd", "sliced"):
            for causal, (hq, hk), (sq, sk) in ((False, (4, 4), (37, 53)), (True, (4, 2), (45, 45)),
                                               (False, (6, 1), (16, 9))):
                b, d = 2, 32
                if layout == "bhsd":
                    q, k, v = rand(b, hq, sq, d, dtype=dtype), rand(b, hk, sk, d, dtype=dtype), rand(b, hk, sk, d, dtype=dtype)
                elif layout == "bshd":
                    q, k, v = (rand(b, s, h, d, dtype=dtype).transpose(1, 2) for h, s in ((hq, sq), (hk, sk), (hk, sk)))
                else:  # every other head of a bigger tensor: not dense, empty_like is contiguous
                    q, k, v = (rand(b, 2 * h, s, d, dtype=dtype)[:, ::2] for h, s in ((hq, sq), (hk, sk), (hk, sk)))
                case = f"sdpa-op {dtype} {layout} causal={causal} H{hq}/{hk} S{sq}/{sk}"
                q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
                scale = 0.3
                res = run.run(case, torch.ops.aten._scaled_dot_product_flash_attention, q, k, v, 0.0, causal, False,
                              scale=scale)
                if res is None:
                    continue
                out, lse = res[0], res[1]
                vis = visible(sq, sk, causal=causal, device="cpu")
                ref = attention_ref(q.double(), k.double(), v.double(), scale, vis=vis)
                run.check(case + " out vs float64", max_err(out, ref) <= tol[dtype], f"err {max_err(out, ref):.2e}")
                run.check(case + " out strides = empty_like(query)", out.stride() == torch.empty_like(q).stride(),
                          f"{out.stride()} vs {torch.empty_like(q).stride()}")
                run.check(case + " lse (B, H, Sq) fp32 vs float64",
                          lse.shape == (b, hq, sq) and lse.dtype == torch.float32
                          and max_err(lse, lse_ref(q, k, scale, vis=vis)) <= 1e-4)
                run.check(case + " rng pair uint64[2] + uint64 scalar",
                          res[6].dtype == torch.uint64 and res[6].shape == (2,) and res[7].dtype == torch.uint64
                          and res[7].dim() == 0)
                # Backward through aten's own derivative formula (-> the registered backward op).
                g = rand(*out.shape, dtype=dtype)
                got = torch.autograd.grad(out, (q, k, v), g)
                leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
                want = torch.autograd.grad(attention_ref(*leaves, scale, vis=vis), leaves, g.double())
                errs = [max_err(a, w) for a, w in zip(got, want)]
                run.check(case + " dq dk dv vs float64", max(errs) <= 4 * tol[dtype], f"errs {errs}")
                run.check(case + " grads have q/k/v's empty_like strides",
                          all(a.stride() == torch.empty_like(t).stride() for a, t in zip(got, (q, k, v))))
                last_bwd = [c for c in stand_in.calls if c[0] == "bwd"][-1][1]
                run.check(case + " backward got the forward's rng_state and bottom-right alignment",
                          last_bwd["rng"] == [1234, 5678] and last_bwd["align"] == 1, str(last_bwd))

    # _flash_attention_forward, dense (B, S, H, D) with windows: bottom-right, is_causal -> right 0.
    for (left, right, causal) in ((5, 3, False), (7, None, True), (None, None, True)):
        b, sq, sk, h, d = 2, 19, 31, 3, 16
        q, k, v = (rand(b, s, h, d, dtype=torch.float32).requires_grad_() for s in (sq, sk, sk))
        case = f"flash-op dense window=({left}, {right}) causal={causal} S{sq}/{sk}"
        res = run.run(case, torch.ops.aten._flash_attention_forward, q, k, v, None, None, sq, sk, 0.0, causal, False,
                      scale=None, window_size_left=left, window_size_right=right)
        if res is None:
            continue
        vis = visible(sq, sk, -1 if left is None else left, 0 if causal else (-1 if right is None else right), 1,
                      device="cpu")
        ref = attention_ref(*(t.double().transpose(1, 2) for t in (q, k, v)), 1 / math.sqrt(d), vis=vis).transpose(1, 2)
        run.check(case + " out vs float64", max_err(res[0], ref) <= 2e-5, f"err {max_err(res[0], ref):.2e}")
        run.check(case + " lse (B, H, Sq)", res[1].shape == (b, h, sq))
        g = rand(*res[0].shape, dtype=torch.float32)
        got = torch.autograd.grad(res[0], (q, k, v), g)
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        want = torch.autograd.grad(
            attention_ref(*(t.transpose(1, 2) for t in leaves), 1 / math.sqrt(d), vis=vis).transpose(1, 2), leaves,
            g.double())
        run.check(case + " grads vs float64 (aten derivative with the windows)",
                  max(max_err(a, w) for a, w in zip(got, want)) <= 1e-4)

    # torch.nn.attention.varlen.varlen_attn: packed (total, H, D), LSE (H, total), causal = (-1, 0).
    from torch.nn.attention.varlen import varlen_attn
    lens_q, lens_k = [5, 17, 1, 12], [9, 17, 4, 12]
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    h, hk, d = 4, 2, 24
    q = rand(sum(lens_q), h, d, dtype=torch.float32).requires_grad_()
    k = rand(sum(lens_k), hk, d, dtype=torch.float32).requires_grad_()
    v = rand(sum(lens_k), hk, d, dtype=torch.float32).requires_grad_()
    for window in ((-1, 0), (-1, -1), (3, 0)):
        case = f"varlen_attn window={window}"
        res = run.run(case, varlen_attn, q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), window_size=window,
                      **gqa_kwargs(varlen_attn))
        if res is None:
            continue
        g = rand(*res.shape, dtype=torch.float32)
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        parts = []
        for i in range(len(lens_q)):
            sq_, sk_ = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
            vis = visible(lens_q[i], lens_k[i], window[0], window[1], 1, device="cpu")
            seq = [t[s].transpose(0, 1).unsqueeze(0) for t, s in ((leaves[0], sq_), (leaves[1], sk_), (leaves[2], sk_))]
            parts.append(attention_ref(*seq, 1 / math.sqrt(d), vis=vis).squeeze(0).transpose(0, 1))
        ref = torch.cat(parts)
        run.check(case + " out vs float64", max_err(res, ref) <= 2e-5, f"err {max_err(res, ref):.2e}")
        got = torch.autograd.grad(res, (q, k, v), g)
        want = torch.autograd.grad(ref, leaves, g.double())
        run.check(case + " grads vs float64", max(max_err(a, w) for a, w in zip(got, want)) <= 1e-4)
        fwd = [c for c in stand_in.calls if c[0] == "fwd"][-1][1]
        run.check(case + " sent packed, bottom-right, causal as right window 0",
                  fwd["packed"] and fwd["align"] == 1 and fwd["right"] == window[1] and fwd["left"] == window[0],
                  str(fwd))
    out, lse = varlen_attn(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                           return_aux=torch.nn.attention.varlen.AuxRequest(lse=True), **gqa_kwargs(varlen_attn))
    run.check("varlen_attn lse", tuple(lse.shape) in ((sum(lens_q), h), (h, sum(lens_q))), str(tuple(lse.shape)))

    # What the implementation refuses, by name, with nothing sent.
    q, k, v = (rand(1, 2, 8, 16, dtype=torch.float32) for _ in range(3))
    n = len(stand_in.calls)
    for case, fn, word in (
            ("return_debug_mask", lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, True),
             "return_debug_mask"),
            ("alibi_slopes", lambda: torch.ops.aten._flash_attention_forward(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, None, 8, 8, 0.0, False, False,
                alibi_slopes=torch.ones(2)), "alibi_slopes"),
            ("head dim 12", lambda: torch.ops.aten._scaled_dot_product_flash_attention(
                *(rand(1, 2, 8, 12, dtype=torch.float32) for _ in range(3))), "head dim 12")):
        try:
            fn()
            run.check(f"refuses {case}", False, "no error")
        except NotImplementedError as e:
            run.check(f"refuses {case}", word in str(e), str(e)[:160])
    run.check("refusals sent nothing to the kernels", len(stand_in.calls) == n)

    # opcheck: the registered kernels against the ops' schema, fake (meta) functions and autograd.
    q, k, v = (rand(2, 3, 24, 16, dtype=torch.float32).requires_grad_() for _ in range(3))
    for case, args, kwargs in (("opcheck sdpa flash op", (q, k, v, 0.0, True), {"scale": 0.25}),):
        try:
            torch.library.opcheck(torch.ops.aten._scaled_dot_product_flash_attention.default, args, kwargs)
            run.check(case, True)
        except Exception as e:  # noqa: BLE001
            run.check(case, False, f"{type(e).__name__}: {str(e)[:300]}")

    # torch.compile (fullgraph) plans the op's outputs with its meta strides; the registered
    # kernel then runs. bshd memory makes a stride mismatch visible.
    if "--no-compile" not in sys.argv:
        def attn(q, k, v):
            return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0].sum(dim=1) * 2

        qs, ks, vs = (rand(2, 24, 3, 16, dtype=torch.float32).transpose(1, 2) for _ in range(3))
        try:
            got = torch.compile(attn, fullgraph=True)(qs, ks, vs)
            ref = attention_ref(qs.double(), ks.double(), vs.double(), 0.25, vis=visible(24, 24, causal=True,
                                                                                       device="cpu")).sum(dim=1) * 2
            run.check("torch.compile(fullgraph) over the registered op", max_err(got, ref) <= 1e-4)
        except Exception as e:  # noqa: BLE001
            run.check("torch.compile(fullgraph) over the registered op", False, f"{type(e).__name__}: {str(e)[:300]}")

    check_flash_attn_mapping(run)

    handle.remove()
    try:
        torch.ops.aten._scaled_dot_product_flash_attention(q.detach(), k.detach(), v.detach())
        run.check("remove() takes the kernels out again", False, "the CPU call still ran")
    except (NotImplementedError, RuntimeError) as e:
        run.check("remove() takes the kernels out again", "CPU" in str(e), str(e).splitlines()[0][:120])
    run.finish()


if __name__ == "__main__":
    main()
