"""GPU check of attn_fwd through Triton's JIT (needs torch + a GPU; not part of the CPU suite).

    python -B python/tests/gpu_attn_fwd.py [--bench]

Runs the kernel source (same kernels/flash/ code the AOT build compiles) with
each sm_90 config of rules.py, fp16 and bf16, against a float64 reference with
the error bound of the CPU tests, and optionally times hd128 against SDPA.
"""
import argparse
import itertools
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402

import rules  # noqa: E402
from kernels.flash.fwd import attn_fwd  # noqa: E402

DT = {"fp16": torch.float16, "bf16": torch.bfloat16}


def launch(q, k, v, causal, cfg, sm_scale):
    """Causal here is top-left causal: WINDOWED with (left, right, offset) = (unbounded, 0, 0)."""
    B, H, Sq, D = q.shape
    o = torch.full_like(q, float("nan"))
    lse = torch.full((B, H, Sq), float("nan"), device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(Sq, cfg["BLOCK_M"]), H, B)
    attn_fwd[grid](q, k, v, o, lse, sm_scale, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                   *lse.stride()[:2], Sq, k.shape[2], D, H // k.shape[1], 2 ** 30, 0, 0, 1,
                   HEAD_DIM=D, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                   WINDOWED=causal, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return o, lse


def reference(q, k, v, causal, sm_scale, dtype):
    q, k, v = (x.to(dtype) for x in (q, k, v))
    s = (q @ k.transpose(-1, -2)) * sm_scale
    if causal:
        Sq, Sk = s.shape[-2:]
        s = s.masked_fill(~torch.ones(Sq, Sk, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    lse = torch.logsumexp(s.double(), -1)
    return (torch.softmax(s, -1) @ v), lse


def check():
    fails = 0
    for dtype, D, causal in itertools.product(DT, rules.HEAD_DIMS, (False, True)):
        for cfg in rules._attn_fwd_configs("sm_90", {"dtype": dtype, "head_dim": D, "windowed": causal}):
            for B, H, Sq, Sk, bshd in [(2, 3, 1, 1, False), (2, 3, 257, 129, False), (1, 4, 129, 300, True),
                                       (2, 2, 1000, 1000, False)]:
                g = torch.Generator(device="cuda").manual_seed(0)
                shp = lambda s: (B, s, H, D) if bshd else (B, H, s, D)  # noqa: E731
                q, k, v = (torch.randn(shp(s), device="cuda", dtype=DT[dtype], generator=g) for s in (Sq, Sk, Sk))
                if bshd:
                    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
                sm = D ** -0.5
                o, lse = launch(q, k, v, causal, cfg, sm)
                ref, ref_lse = reference(q, k, v, causal, sm, torch.float64)
                naive, _ = reference(q, k, v, causal, sm, DT[dtype])
                err = (o.double() - ref).abs().max().item()
                bound = 3 * (naive.double() - ref).abs().max().item() + 1e-3
                lerr = (lse.double() - ref_lse).abs().max().item()
                ok = not o.isnan().any() and not lse.isnan().any() and err <= bound and lerr <= 1e-3
                fails += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {dtype} hd{D} causal={causal} {cfg} B{B} H{H} Sq{Sq} Sk{Sk} "
                      f"bshd={bshd} err={err:.2e} bound={bound:.2e} lse_err={lerr:.1e}", flush=True)
    return fails


def bench():
    import torch.nn.functional as F
    for causal, cfg in itertools.product((False, True), rules._attn_fwd_configs("sm_90", {"head_dim": 128})):
        B, H, S, D = 4, 16, 4096, 128
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * B * H * S * S * D * (0.5 if causal else 1)
        t = triton.testing.do_bench(lambda: launch(q, k, v, causal, cfg, D ** -0.5))
        ts = triton.testing.do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        print(f"bf16 hd128 B{B} H{H} S{S} causal={causal} {cfg}: {flops / t * 1e-9:.0f} TFLOP/s "
              f"(sdpa {flops / ts * 1e-9:.0f})", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", action="store_true")
    a = ap.parse_args()
    n = check()
    if a.bench:
        bench()
    print(f"{n} failed")
    sys.exit(1 if n else 0)
