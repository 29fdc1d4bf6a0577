"""Times candidate configs of the attention kernels (attn_fwd, attn_bwd_dkdv, attn_bwd_dq) on the
GPU through Triton's JIT, on the same sources the build compiles ahead of time. Prints the best
config per (kernel, head dim) and writes every timing to --json. The picks go into
python/rules.py by hand.

    python3 bench/tune.py --kernels fwd,dkdv,dq --json /tmp/out/tune.json   # needs torch, triton, a GPU

Shapes: bf16, B·S = 16k tokens at S = 4096, H·D = 2048, no mask (the common training case);
median of triton.testing.do_bench.
"""
import argparse
import itertools
import json
import math
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kernels.flash.bwd_dkdv import attn_bwd_dkdv  # noqa: E402
from kernels.flash.bwd_dq import attn_bwd_dq  # noqa: E402
from kernels.flash.fwd import attn_fwd  # noqa: E402

KERNELS = {"fwd": attn_fwd, "dkdv": attn_bwd_dkdv, "dq": attn_bwd_dq}


def problem(d, seqlen=4096, tokens=16384):
    b, h = tokens // seqlen, 2048 // d
    g = torch.Generator(device="cuda").manual_seed(d)
    t = lambda: torch.randn(b, h, seqlen, d, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v, do = t(), t(), t(), t()
    lse = torch.full((b, h, seqlen), 8.0, device="cuda")
    delta = torch.randn(b, h, seqlen, device="cuda", generator=g)
    return dict(b=b, h=h, s=seqlen, d=d, q=q, k=k, v=v, do=do, lse=lse, delta=delta,
                o=torch.empty_like(q), dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v),
                cu=torch.zeros(8, device="cuda", dtype=torch.int32),
                philox=torch.zeros(8, device="cuda", dtype=torch.int64))


def args_for(p, cfg):
    """Every argument of the two kernels by name (each takes the ones it declares)."""
    s4 = lambda name, t: {f"stride_{name}z": t.stride(0), f"stride_{name}h": t.stride(1),  # noqa: E731
                          f"stride_{name}{'m' if name in ('q', 'o', 'do', 'dq') else 'n'}": t.stride(2)}
    a = dict(Q=p["q"], K=p["k"], V=p["v"], O=p["o"], DO=p["do"], LSE=p["lse"], DELTA=p["delta"], DQ=p["dq"], DK=p["dk"],
             DV=p["dv"], BIAS=p["q"], sm_scale=1 / math.sqrt(p["d"]))
    for name in ("q", "k", "v", "o", "do", "dq", "dk", "dv"):
        a.update(s4(name, p[name]))
    a.update(stride_lz=p["lse"].stride(0), stride_lh=p["lse"].stride(1), stride_deltaz=p["delta"].stride(0),
             stride_deltah=p["delta"].stride(1), stride_bz=0, stride_bh=0, stride_bm=0)
    n = p["s"]
    a.update(N_CTX_Q=n, N_CTX_K=n, D_HEAD=p["d"], GQA_GROUP=1, WINDOW_LEFT=2 * n, WINDOW_RIGHT=2 * n,
             ALIGN_BOTTOM_RIGHT=0, IS_VARLEN=0, CU_SEQLENS_Q=p["cu"], CU_SEQLENS_K=p["cu"],
             DROPOUT_THRESHOLD=0, dropout_scale=1.0, PHILOX_SEED=p["philox"], PHILOX_OFFSET=p["philox"],
             philox_offset_base=0, PHILOX_SEED_OUT=p["philox"], PHILOX_OFFSET_OUT=p["philox"], STORE_PHILOX=0,
             STORE_LSE=1, HEAD_DIM=p["d"], BLOCK_M=cfg[0], BLOCK_N=cfg[1], DROPOUT=False,
             HAS_BIAS=False, ALLOW_TF32=False)
    return a


def run(kernel, p, cfg):
    fn = KERNELS[kernel]
    a = {k: v for k, v in args_for(p, cfg).items() if k in fn.arg_names}
    grid = ((triton.cdiv(p["s"], cfg[1]) if kernel == "dkdv" else triton.cdiv(p["s"], cfg[0])), p["h"], p["b"])
    call = lambda: fn[grid](**a, num_warps=cfg[2], num_stages=cfg[3])  # noqa: E731
    call()
    torch.cuda.synchronize()
    return triton.testing.do_bench(call, warmup=10, rep=40, return_mode="median")


def candidates(kernel, d):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages); the owned dimension (BLOCK_N for dK/dV, BLOCK_M
    for dQ and the forward) shrinks with the head dim so the accumulators fit in registers."""
    if kernel == "fwd":
        stages = (2, 3) if d <= 128 else (1, 2)
        return list(itertools.product((64, 128), (64, 128) if d <= 128 else (32, 64), (4, 8), stages))
    owned = {64: (64, 128), 128: (64, 128), 256: (32, 64)}[d]
    step = {64: (32, 64), 128: (32, 64), 256: (16, 32)}[d]
    warps, stages = (4, 8), ((2,) if d < 256 else (1,))
    out = []
    for o, s_, w, st in itertools.product(owned, step, warps, stages):
        out.append((s_, o, w, st) if kernel == "dkdv" else (o, s_, w, st))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--kernels", default="fwd,dkdv,dq")
    args = ap.parse_args()
    results = []
    for d in [int(x) for x in args.head_dims.split(",")]:
        p = problem(d)
        flops = 4.0 * p["b"] * p["h"] * p["s"] * p["s"] * d  # one forward's worth
        for kernel in args.kernels.split(","):
            best = None
            for cfg in candidates(kernel, d):
                try:
                    ms = run(kernel, p, cfg)
                except Exception as e:  # out of resources etc.: skip the config
                    print(f"hd{d} {kernel} {cfg}: {type(e).__name__}: {' | '.join(str(e).splitlines()[:6])[:300]}",
                          flush=True)
                    continue
                results.append(dict(kernel=kernel, head_dim=d, config=cfg, ms=ms))
                print(f"hd{d} {kernel} BM{cfg[0]} BN{cfg[1]} w{cfg[2]} s{cfg[3]}: {ms:.3f} ms", flush=True)
                if best is None or ms < best[1]:
                    best = (cfg, ms)
            if best:
                share = 1.0 if kernel == "fwd" else 1.25  # the backward's 2.5x split over two kernels
                print(f"BEST hd{d} {kernel}: BM{best[0][0]} BN{best[0][1]} w{best[0][2]} s{best[0][3]} "
                      f"{best[1]:.3f} ms ({share * flops / best[1] / 1e9:.0f} TFLOP/s-equivalent of its share)",
                      flush=True)
        del p
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
