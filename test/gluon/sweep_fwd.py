"""GPU sweep of the Gluon forward's configurations (``fwd_variants.py``) against cuDNN SDPA.

For every variant (JIT, like ``check_fwd.py``; one compile per variant x head dim x dtype, reused
across the cells) this script

1. verifies the output on small ragged shapes against torch's math SDPA (fp32): non-causal
   Sq 333 / Sk 457 with GQA 4/2, and causal (top-left) Sq = Sk = 333; O within
   ``3 * |O_naive - O_ref| + 1e-3`` (``O_naive``: the same math in the input dtype), LSE within
   1e-3.  Persistent variants (``PERSISTENT=1``: grid ``min(#tiles, #SMs * CTAS_PER_SM)``, the SM count
   from torch) are verified a second time with the grid capped at 3 CTAs (each CTA walks many tiles).
   A wrong variant is reported loudly (``!!! WRONG``) and not timed;
2. times it with ``triton.testing.do_bench`` (warmup/rep 5/25 ms by default) on the cells of the
   target: B*S = 16k, H*D = 2048, S 1k..16k, causal and not, hd64 and hd128 (``--hd256``: also
   hd256; ``--fp16``: also fp16), next to cuDNN SDPA on the same inputs (timed before and after
   the variants, the faster of the two kept);
3. prints per cell every variant's TFLOP/s and ratio and the best variant, then per dtype a table:
   per variant the geomean ratio over the target cells (hd64 + hd128, S >= 1k) with its minimum,
   the best variant per (hd, causal) group, and the geomean / minimum of that combined choice
   (target: geomean >= 1.0, no cell < 0.9; hd256: >= 0.9).

usage: python test/gluon/sweep_fwd.py [--variants a,b,...] [--hd256] [--fp16] [--seqs 1024,2048,...]
                                      [--warmup MS] [--rep MS] [--json PATH]
"""
import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import triton  # noqa: E402

import check_fwd  # noqa: E402  (launch helpers, references; imports the kernel)
import fwd_variants  # noqa: E402

SEQS = (1024, 2048, 4096, 8192, 16384)
TOKENS = 16384
HIDDEN = 2048


# ----------------------------------------------------------------------------
# Verification against torch math SDPA
# ----------------------------------------------------------------------------
def sdpa_math_ref(q, k, v, sm_scale, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention
    group = q.shape[1] // k.shape[1]
    qf, kf, vf = q.float(), check_fwd.expand_kv(k, group).float(), check_fwd.expand_kv(v, group).float()
    with sdpa_kernel(SDPBackend.MATH):
        o = scaled_dot_product_attention(qf, kf, vf, is_causal=causal, scale=sm_scale)
    s = (qf @ kf.transpose(-1, -2)) * sm_scale
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        s = s.masked_fill(~check_fwd.visible_mask(sq, sk, check_fwd.UNBOUNDED, 0, 0, q.device), float("-inf"))
    return o, torch.logsumexp(s, dim=-1)


def verify(variant, head_dim, dtype):
    """``(ok, message)`` for one variant, head-dim bucket and dtype on two small ragged shapes."""
    dt = check_fwd.TORCH_DTYPES[dtype]
    msgs, ok = [], True
    gen = torch.Generator(device="cuda").manual_seed(1234 + head_dim)
    shapes = [(False, (2, 4, 2, 333, 457), 0), (True, (2, 2, 2, 333, 333), 0)]
    if fwd_variants.config(variant, head_dim)["PERSISTENT"]:
        shapes += [(c, shape, 3) for c, shape, _ in shapes]  # 3 CTAs: every CTA walks several tiles
    for causal, (b, hq, hk, sq, sk), pers_grid in shapes:
        q = torch.randn(b, hq, sq, head_dim, device="cuda", generator=gen).to(dt)
        k = torch.randn(b, hk, sk, head_dim, device="cuda", generator=gen).to(dt)
        v = torch.randn(b, hk, sk, head_dim, device="cuda", generator=gen).to(dt)
        o = torch.full_like(q, float("nan"))
        lse = torch.full((b, hq, sq), float("nan"), device="cuda", dtype=torch.float32)
        sm_scale = head_dim ** -0.5
        wl, wr, align = check_fwd.window("causal" if causal else "none", sq, sk)
        check_fwd.prepare(q, k, v, o, lse, dtype, sm_scale, wl, wr, align, variant=variant, pers_grid=pers_grid)()
        torch.cuda.synchronize()
        o_ref, lse_ref = sdpa_math_ref(q, k, v, sm_scale, causal)
        visible = check_fwd.visible_mask(sq, sk, wl, wr, align, q.device)
        naive = check_fwd.reference_naive(q, k, v, sm_scale, visible).float()
        bound = 3 * (naive - o_ref).abs().max().item() + 1e-3
        o_err = (o.float() - o_ref).abs().max().item()  # NaN (unwritten) compares False below
        lse_err = (lse - lse_ref).abs().max().item()
        this_ok = o_err <= bound and lse_err <= 1e-3
        ok = ok and this_ok
        msgs.append(f"{'causal' if causal else 'none'}{f' grid{pers_grid}' if pers_grid else ''} o_err {o_err:.2e} (bound {bound:.2e}) lse_err {lse_err:.2e}")
    return ok, "; ".join(msgs)


# ----------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------
def cudnn_fn(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    def fn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return scaled_dot_product_attention(q, k, v, is_causal=causal)
    return fn


def bench_ms(fn, warmup, rep):
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep)


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="", help="comma-separated names (default: all of fwd_variants.VARIANTS)")
    ap.add_argument("--hd256", action="store_true", help="also time hd256 (target >= 0.9x cuDNN)")
    ap.add_argument("--fp16", action="store_true", help="also time fp16")
    ap.add_argument("--seqs", default=",".join(map(str, SEQS)))
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rep", type=int, default=25)
    ap.add_argument("--json", default=None, help="write the raw results here")
    args = ap.parse_args()

    t_start = time.time()
    variants = [v for v in (args.variants.split(",") if args.variants else fwd_variants.VARIANTS) if v]
    for v in variants:
        if v not in fwd_variants.VARIANTS:
            sys.exit(f"unknown variant {v}; known: {', '.join(fwd_variants.VARIANTS)}")
    head_dims = [64, 128] + ([256] if args.hd256 else [])
    dtypes = ["bf16"] + (["fp16"] if args.fp16 else [])
    seqs = [int(s) for s in args.seqs.split(",")]

    print(f"device: {torch.cuda.get_device_name()}, {check_fwd.num_sms('cuda')} SMs (persistent grid = "
          f"min(#tiles, SMs * CTAS_PER_SM))")
    print("variants:")
    for v in variants:
        print(f"  {v:<20} " + " | ".join(f"hd{hd}: {fwd_variants.describe(fwd_variants.config(v, hd))}"
                                         for hd in head_dims))

    # 1. Verify (this also compiles every kernel the timing uses).
    good = {}  # (variant, hd, dtype) -> bool
    for dtype in dtypes:
        for hd in head_dims:
            for v in variants:
                if fwd_variants.config(v, hd) is None:
                    continue
                t0 = time.time()
                try:
                    ok, msg = verify(v, hd, dtype)
                except Exception as e:  # noqa: BLE001 -- a variant that fails to compile or launch is dropped
                    ok, msg = False, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1][:300]}"
                good[(v, hd, dtype)] = ok
                tag = "ok " if ok else "!!! WRONG"
                print(f"verify {tag} {v} {dtype} hd{hd} ({time.time() - t0:.1f} s): {msg}", flush=True)
    wrong = [k for k, ok in good.items() if not ok]
    if wrong:
        print("!!! WRONG VARIANTS (not timed): " + ", ".join(f"{v}/{dt}/hd{hd}" for v, hd, dt in wrong), flush=True)

    # 2. Time.
    results = []  # dicts: dtype, hd, s, causal, cudnn, {variant: tflops}
    for dtype in dtypes:
        tdt = check_fwd.TORCH_DTYPES[dtype]
        for hd in head_dims:
            h = HIDDEN // hd
            for s in seqs:
                b = max(1, TOKENS // s)
                for causal in (False, True):
                    q, k, v_ = (torch.randn(b, h, s, hd, device="cuda", dtype=tdt) for _ in range(3))
                    o = torch.empty_like(q)
                    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
                    wl, wr, align = check_fwd.window("causal" if causal else "none", s, s)
                    flops = 4 * b * h * s * s * hd * (0.5 if causal else 1.0)
                    tf = lambda ms: flops / ms * 1e-9  # noqa: E731
                    try:
                        t_cudnn = bench_ms(cudnn_fn(q, k, v_, causal), args.warmup, args.rep)
                    except Exception as e:  # noqa: BLE001
                        print(f"cuDNN failed for {dtype} hd{hd} s{s}: {e}", flush=True)
                        t_cudnn = float("nan")
                    row = {"dtype": dtype, "hd": hd, "s": s, "b": b, "h": h, "causal": causal, "variants": {}}
                    for var in variants:
                        if not good.get((var, hd, dtype)):
                            continue
                        launch = check_fwd.prepare(q, k, v_, o, lse, dtype, hd ** -0.5, wl, wr, align, variant=var)
                        launch()
                        row["variants"][var] = tf(bench_ms(launch, args.warmup, args.rep))
                    if not math.isnan(t_cudnn):
                        t_cudnn = min(t_cudnn, bench_ms(cudnn_fn(q, k, v_, causal), args.warmup, args.rep))
                    row["cudnn"] = tf(t_cudnn)
                    results.append(row)
                    name = f"{dtype} hd{hd} b{b} h{h} s{s}{' causal' if causal else ''}"
                    if row["variants"]:
                        best = max(row["variants"], key=row["variants"].get)
                        cells = "  ".join(f"{var}={t:.0f}({t / row['cudnn']:.2f})" for var, t in row["variants"].items())
                        print(f"{name:<30} cuDNN {row['cudnn']:.0f} | best {best} {row['variants'][best]:.0f} "
                              f"({row['variants'][best] / row['cudnn']:.3f}) | {cells}", flush=True)
                    del q, k, v_, o, lse

    # 3. Tables.
    for dtype in dtypes:
        rows = [r for r in results if r["dtype"] == dtype]
        for hd_set, target_geo, target_min, label in (((64, 128), 1.0, 0.9, "hd64+hd128"), ((256,), 0.9, 0.9, "hd256")):
            cells = [r for r in rows if r["hd"] in hd_set and r["s"] >= 1024 and math.isfinite(r["cudnn"])]
            if not cells:
                continue
            print(f"\n=== {dtype} {label}: ratio vs cuDNN over {len(cells)} cells (target geomean >= {target_geo}, "
                  f"min >= {target_min}) ===")
            print(f"{'variant':<20} {'geomean':>8} {'min':>6} {'<0.9':>5} {'cells':>6}  "
                  + " ".join(f"hd{hd}{'c' if c else 'n'}" .rjust(7) for hd in hd_set for c in (False, True)))
            for var in variants:
                ratios = [r["variants"][var] / r["cudnn"] for r in cells if var in r["variants"]]
                if not ratios:
                    continue
                groups = []
                for hd in hd_set:
                    for c in (False, True):
                        g = [r["variants"][var] / r["cudnn"] for r in cells
                             if r["hd"] == hd and r["causal"] == c and var in r["variants"]]
                        groups.append(f"{geomean(g):7.3f}" if g else "    n/a")
                full = "" if len(ratios) == len(cells) else " (partial)"
                print(f"{var:<20} {geomean(ratios):8.3f} {min(ratios):6.3f} {sum(x < 0.9 for x in ratios):5d} "
                      f"{len(ratios):6d}  " + " ".join(groups) + full)
            # Best variant per (hd, causal) group, by the group's geomean.
            print(f"best per (hd, causal):")
            combined = []
            for hd in hd_set:
                for c in (False, True):
                    g_cells = [r for r in cells if r["hd"] == hd and r["causal"] == c]
                    cand = {}
                    for var in variants:
                        rs = [r["variants"][var] / r["cudnn"] for r in g_cells if var in r["variants"]]
                        if len(rs) == len(g_cells) and rs:
                            cand[var] = rs
                    if not cand:
                        continue
                    best = max(cand, key=lambda var: geomean(cand[var]))
                    combined += cand[best]
                    per_s = " ".join(f"s{r['s'] // 1024}k {x:.3f}" for r, x in zip(g_cells, cand[best]))
                    print(f"  hd{hd} {'causal' if c else 'non-causal':<10} -> {best:<20} geomean "
                          f"{geomean(cand[best]):.3f} min {min(cand[best]):.3f}   [{per_s}]")
            if combined:
                verdict = "MEETS" if geomean(combined) >= target_geo and min(combined) >= target_min else "misses"
                print(f"  combined best choice: geomean {geomean(combined):.3f}, min {min(combined):.3f} "
                      f"-> {verdict} the target")
            # Per-cell best, for reference.
            print("best per cell:")
            for r in cells:
                if r["variants"]:
                    best = max(r["variants"], key=r["variants"].get)
                    print(f"  hd{r['hd']} s{r['s']:<6} {'causal' if r['causal'] else 'none  '} {best:<20} "
                          f"{r['variants'][best]:.0f} / cuDNN {r['cudnn']:.0f} = {r['variants'][best] / r['cudnn']:.3f}")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"variants": {v: {hd: fwd_variants.config(v, hd) for hd in head_dims} for v in variants},
                       "verified": {f"{v}/{hd}/{dt}": ok for (v, hd, dt), ok in good.items()},
                       "results": results}, f, indent=1)
    print(f"\nsweep_fwd: {time.time() - t_start:.0f} s total")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
