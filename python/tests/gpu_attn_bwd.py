"""GPU check of attn_fwd + the backward kernels through Triton's JIT (needs torch + a GPU; not part of the CPU suite).

    python -B python/tests/gpu_attn_bwd.py

Runs the kernel sources (the code the AOT build compiles) with the sm_90 configs
of rules.py, fp16 and bf16, real head dims that are not powers of two, GQA/MQA,
every mask kind, against float64 torch autograd, with the bound of the CPU
tests: ``max|out - ref64| <= k * max|naive - ref64| + 1e-3 * max(1, max|ref64|)``,
``k = 3`` for O and 5 for dQ/dK/dV (naive: the same math in the input dtype).
Also checks rows without keys (O = 0, LSE = +inf, dQ = 0) and that dK/dV are
bitwise reproducible run to run.
"""
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402

import rules  # noqa: E402
from kernels.flash.bwd_dkdv import attn_bwd_dkdv  # noqa: E402
from kernels.flash.bwd_dq import attn_bwd_dq  # noqa: E402
from kernels.flash.bwd_preprocess import attn_bwd_preprocess  # noqa: E402
from kernels.flash.fwd import attn_fwd  # noqa: E402

DT = {"fp16": torch.float16, "bf16": torch.bfloat16}
UNBOUNDED = 2 ** 30
MASKS = {  # name -> (windowed, left, right, bottom_right)
    "none": (False, UNBOUNDED, UNBOUNDED, False),
    "causal-tl": (True, UNBOUNDED, 0, False),
    "causal-br": (True, UNBOUNDED, 0, True),
    "window(3,5)-tl": (True, 3, 5, False),
    "window(128,0)-br": (True, 128, 0, True),
}


def bucket(d):
    return next(b for b in rules.HEAD_DIMS if b >= d)


def cfg_kw(c):
    return dict(num_warps=c["num_warps"], num_stages=c["num_stages"])


def run(q, k, v, do, mask, sm_scale, dtype):
    windowed, left, right, br = MASKS[mask]
    B, Hq, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    hd = bucket(D)
    f = {"dtype": dtype, "head_dim": hd, "windowed": windowed}
    window = (Sq, Sk, D, Hq // Hk, left, right, Sk - Sq if br else 0)
    nan = float("nan")
    o = torch.full_like(q, nan)
    lse = torch.full((B, Hq, Sq), nan, device=q.device, dtype=torch.float32)
    c = rules._attn_fwd_configs("sm_90", f)[0]
    attn_fwd[(triton.cdiv(Sq, c["BLOCK_M"]), Hq, B)](
        q, k, v, o, lse, sm_scale, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
        *lse.stride()[:2], *window, 1, HEAD_DIM=hd, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"],
        WINDOWED=windowed, **cfg_kw(c))
    delta = torch.full_like(lse, nan)
    c = rules._attn_bwd_preprocess_configs("sm_90", f)[0]
    attn_bwd_preprocess[(triton.cdiv(Sq, c["BLOCK_M"]), Hq, B)](
        o, do, delta, *o.stride()[:3], *do.stride()[:3], *delta.stride()[:2], Sq, D,
        HEAD_DIM=hd, BLOCK_M=c["BLOCK_M"], **cfg_kw(c))
    common = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *lse.stride()[:2],
              *delta.stride()[:2])
    grads = []
    for _ in range(2):  # twice: dK/dV must be bitwise reproducible
        dq, dk, dv = torch.full_like(q, nan), torch.full_like(k, nan), torch.full_like(v, nan)
        c = rules._attn_bwd_dkdv_configs("sm_90", f)[0]
        attn_bwd_dkdv[(triton.cdiv(Sk, c["BLOCK_N"]), Hk, B)](
            q, k, v, do, lse, delta, dk, dv, sm_scale, *common, *dk.stride()[:3], *dv.stride()[:3], *window,
            HEAD_DIM=hd, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], WINDOWED=windowed, **cfg_kw(c))
        c = rules._attn_bwd_dq_configs("sm_90", f)[0]
        attn_bwd_dq[(triton.cdiv(Sq, c["BLOCK_M"]), Hq, B)](
            q, k, v, do, lse, delta, dq, sm_scale, *common, *dq.stride()[:3], *window,
            HEAD_DIM=hd, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], WINDOWED=windowed, **cfg_kw(c))
        grads.append((dq, dk, dv))
    same = all(torch.equal(a, b) for a, b in zip(grads[0], grads[1]))
    return o, lse, *grads[0], same


def visible(mask, Sq, Sk, device):
    windowed, left, right, br = MASKS[mask]
    i = torch.arange(Sq, device=device)[:, None]
    j = torch.arange(Sk, device=device)[None, :]
    if not windowed:
        return torch.ones(Sq, Sk, dtype=torch.bool, device=device)
    d = i + (Sk - Sq if br else 0)
    return (j >= d - left) & (j <= d + right)


def reference(q, k, v, do, vis, sm_scale, dtype):
    G = q.shape[1] // k.shape[1]
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    ke, ve = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    has_key = vis.any(-1)[:, None]
    s = (q @ ke.transpose(-1, -2)) * sm_scale
    s = s.masked_fill(~vis, float("-inf")).masked_fill(~has_key, 0.0)
    p = torch.softmax(s, -1) * has_key
    o = p @ ve
    lse = torch.logsumexp(s.double(), -1).masked_fill(~has_key[:, 0], float("inf"))
    o.backward(do.to(dtype))
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def main():
    fails = 0
    shapes = [(2, 8, 2, 1000, 1000, False), (1, 4, 1, 257, 129, False), (1, 6, 3, 129, 300, True),
              (1, 2, 2, 1, 77, False)]
    for dtype, D, mask, (B, Hq, Hk, Sq, Sk, bshd) in itertools.product(
            DT, (8, 40, 64, 128, 256), MASKS, shapes):
        g = torch.Generator(device="cuda").manual_seed(0)

        def rnd(h, s):
            shp = (B, s, h, D) if bshd else (B, h, s, D)
            x = torch.randn(shp, device="cuda", dtype=DT[dtype], generator=g)
            return x.transpose(1, 2) if bshd else x

        q, k, v, do = rnd(Hq, Sq), rnd(Hk, Sk), rnd(Hk, Sk), rnd(Hq, Sq)
        sm = D ** -0.5
        o, lse, dq, dk, dv, same = run(q, k, v, do, mask, sm, dtype)
        vis = visible(mask, Sq, Sk, q.device)
        ref = reference(q, k, v, do, vis, sm, torch.float64)
        naive = reference(q, k, v, do, vis, sm, DT[dtype])
        no_key = ~vis.any(-1)
        ok = same and bool(torch.isposinf(lse[:, :, no_key]).all()) and bool((o[:, :, no_key] == 0).all()) \
            and bool((dq[:, :, no_key] == 0).all())
        fin = ~no_key
        lerr = (lse[:, :, fin].double() - ref[1][:, :, fin]).abs().max().item() if fin.any() else 0.0
        ok &= lerr <= 1e-3 and not lse[:, :, fin].isnan().any()
        msg = []
        for name, out, r, n, kk in (("O", o, ref[0], naive[0], 3), ("dQ", dq, ref[2], naive[2], 5),
                                    ("dK", dk, ref[3], naive[3], 5), ("dV", dv, ref[4], naive[4], 5)):
            err = (out.double() - r).abs().max().item()
            bound = kk * (n.double() - r).abs().max().item() + 1e-3 * max(1.0, r.abs().max().item())
            ok &= (not out.isnan().any().item()) and err <= bound
            msg.append(f"{name} {err:.1e}/{bound:.1e}")
        fails += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {dtype} D{D} {mask} B{B} Hq{Hq} Hk{Hk} Sq{Sq} Sk{Sk} bshd={bshd} "
              f"{' '.join(msg)} lse {lerr:.1e} reproducible={same}", flush=True)
    print(f"{fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
