"""GPU sweep of the performance variants of the Gluon backward (``check_bwd.VARIANTS``) against cuDNN.

usage: python test/gluon/sweep_bwd.py [--dtype bf16|fp16] [--variants NAME,...|all] [--hd 64,128]
                                      [--seqs 1024,2048,4096,8192,16384] [--warmup 5] [--rep 25] [--jobs 8]

Needs an sm_90 GPU, torch (cuDNN SDPA) and triton 3.6.0.  Three phases:

1. check (parallel, one subprocess per variant, ``--jobs`` at a time, one shared TRITON_CACHE_DIR): each
   variant runs the three launches of ``ABI.md`` through the JIT on small ragged GQA/MQA shapes per
   head dim (causal bottom-right, no mask, a sliding window; Sq, Sk not multiples of 128) against
   float64 autograd (``check_bwd.check_case``: dQ, dK, dV and DELTA).  This also compiles every
   variant into the cache, so phase 2 compiles nothing.  A variant that fails, crashes or hangs
   is reported as ``EXCLUDED`` (loudly) and not timed.
2. bench: the cells bf16 (or ``--dtype fp16``), B*S = 16k, H*D = 2048, head dims 64/128, S = 1k..16k,
   causal and not; TFLOP/s = 2.5 * 4 * B * H * S^2 * D (/2 causal), ours including the preprocess
   and dQ-convert launches; cuDNN = torch SDPA's cuDNN backward (``o.backward`` with retain_graph).
   ``triton.testing.do_bench`` median, warmup/rep in ms.  Per cell: cuDNN, every variant's ratio,
   the best, and the share of the preprocess + convert in the default variant's time.
3. summary: per variant the geomean ratio (gluon / cuDNN) over the hd128 cells and the hd64 cells
   (targets: >= 1.0 at hd128, >= 0.95 at hd64, no cell < 0.85), its worst cell; then per
   (head dim, causal) the variant with the best geomean, and the per-cell oracle.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="sweep-bwd-cache-"))

#: The variants timed by default (``--variants all``: every entry of check_bwd.VARIANTS).  The
#: shipped config ("product", python/rules.py) is s2_m0_r240 for both head dims.
DEFAULT_VARIANTS = ["s2_m0_r240", "s3_m0_r240", "s2_m1_r240", "s3_m1_r240", "s2_m2_r240", "s3_m2_r240",
                    "s2_m0_r232", "s3_m0_r232", "s2_m1_r232", "s3_m1_r232", "s3_m2_r232", "s3_m1_r240_ss",
                    "s4_m1_r240", "s4_m2_r240",
                    # the shipped configs (python/rules.py) and the variants on top of them (check_bwd.DERIVED):
                    # persistent schedules (PERSISTENT 1 head-major + causal pairs, 2 LPT key-block major) and
                    # wider preprocess / dQ-convert programs
                    "product", "product_p1", "product_p2", "s2_m1_r240_p1", "s2_m1_r240_p2", "s2_m0_r232_p1",
                    "s2_m2_r240_p1", "product_aux_w8", "product_aux64_w8", "product_aux128_w8", "product_p1_aux_w8"]
TARGETS = {128: 1.0, 64: 0.95}
FLOOR = 0.85


def small_cases(dtype, hd):
    """(args, kwargs) of check_bwd.check_case: ragged GQA/MQA shapes, one per mask family."""
    d = hd if hd == 128 else 64
    return [((dtype, 1, 4, 2, 300, 333, d, "causal_br"), {}),
            ((dtype, 2, 6, 2, 257, 200, d, "none"), {}),
            ((dtype, 1, 4, 1, 333, 300, d - 24, "win_64_32_tl"), {})]


# --------------------------------------------------------------------------------------------
# phase 1: check child
# --------------------------------------------------------------------------------------------
def check_child(variant, dtype, hds):
    import check_bwd as cb
    out = {"variant": variant, "ok": {}, "msg": {}}
    for hd in hds:
        if cb.variant_kwargs(variant, hd) is None:
            continue
        ok_all, msgs = True, []
        caps = (None, 3) if cb.variant_kwargs(variant, hd)[1].get("PERSISTENT", 0) else (None, )
        for a, kw in small_cases(dtype, hd):
            for cap in caps:  # persistent variants: also a grid of 3 CTAs (each walks many tiles)
                try:
                    ok, msg = cb.check_case(a, kw, variant, grid_cap=cap)
                except Exception as e:  # noqa: BLE001
                    ok, msg = False, f"{type(e).__name__}: {' | '.join(str(e).strip().splitlines()[-3:])[:400]}"
                ok_all &= ok
                msgs.append(f"[{cb.case_name(a, kw)}{'' if cap is None else f' grid<={cap}'}] {msg}")
        out["ok"][hd] = ok_all
        out["msg"][hd] = " ; ".join(msgs)
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def run_checks(variants, dtype, hds, jobs):
    def one(v):
        t0 = time.time()
        try:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--check-child", v, "--dtype", dtype,
                                "--hd", ",".join(map(str, hds))], capture_output=True, text=True, timeout=300)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
            if not lines:
                tail = " | ".join((r.stdout + r.stderr).strip().splitlines()[-5:])[:600]
                return v, None, f"child exit {r.returncode}: {tail}", time.time() - t0
            return v, json.loads(lines[-1][7:]), "", time.time() - t0
        except subprocess.TimeoutExpired:
            return v, None, "TIMEOUT (hang?)", time.time() - t0

    good = {hd: [] for hd in hds}
    with ThreadPoolExecutor(max_workers=jobs) as ex:
        for v, res, err, secs in ex.map(one, variants):
            if res is None:
                print(f"EXCLUDED {v} (all head dims): {err}", flush=True)
                continue
            for hd_s, ok in res["ok"].items():
                hd = int(hd_s)
                if ok:
                    good[hd].append(v)
                    print(f"ok       {v} hd{hd} ({secs:.0f}s)", flush=True)
                else:
                    print(f"EXCLUDED {v} hd{hd}: WRONG RESULTS: {res['msg'][hd_s]}", flush=True)
    for hd in hds:  # keep the requested order
        good[hd] = [v for v in variants if v in good[hd]]
    return good


# --------------------------------------------------------------------------------------------
# phase 2: bench
# --------------------------------------------------------------------------------------------
def bench(good, dtype, hds, seqs, warmup, rep):
    import torch
    from triton.testing import do_bench

    import check_bwd as cb
    tdt = cb.TORCH_DTYPES[dtype]
    bench_ms = lambda fn: do_bench(fn, warmup=warmup, rep=rep, return_mode="median")  # noqa: E731
    results = {}  # (hd, s, causal) -> {"cudnn": tf, variant: tf}
    for d in hds:
        for s in seqs:
            for causal in (False, True):
                c = cb.fa3_cell(d, s, causal, tdt)
                b, h, flops = c.b, c.h, c.flops
                row = {"cudnn": flops / bench_ms(c.cudnn) * 1e-9}
                aux_share = None
                for var in good[d]:
                    bwd = cb.GluonBwd(c.q, c.k, c.v, c.o, c.do, c.lse, d**-0.5, *c.window, variant=var)
                    t = bench_ms(bwd.run)
                    row[var] = flops / t * 1e-9
                    if aux_share is None:
                        t_aux = bench_ms(bwd.run_aux)
                        aux_share = (t_aux / t, t_aux)
                    del bwd
                results[(d, s, causal)] = row
                ref = row["cudnn"]
                ratios = sorted(((row[v] / ref, v) for v in good[d]), reverse=True)
                best = ratios[0] if ratios else (float("nan"), "-")
                aux = f"pre+conv {aux_share[1] * 1e3:.0f}us ({aux_share[0] * 100:.0f}%)" if aux_share else ""
                print(f"hd{d} S{s:5d} B{b:2d} H{h} {'causal' if causal else 'full  '}: cudnn {ref:6.1f}  best "
                      f"{best[1]} {row.get(best[1], 0):6.1f} ({best[0]:.3f})  {aux}", flush=True)
                print("    " + "  ".join(f"{v} {r:.3f}" for r, v in ratios), flush=True)
                del c
                torch.cuda.empty_cache()
    return results


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summary(results, good, hds):
    print("\n== per variant: geomean gluon/cuDNN over the target cells (hd128 target >= 1.00, hd64 >= 0.95; "
          f"floor {FLOOR} per cell) ==")
    allv = [v for v in dict.fromkeys(v for hd in hds for v in good[hd])]
    hdr = "variant".ljust(16) + "".join(f"  hd{hd}:geo  full  causal  worst".ljust(38) for hd in hds)
    print(hdr)
    for v in allv:
        line = v.ljust(16)
        for hd in hds:
            cells = {key: row[v] / row["cudnn"] for key, row in results.items() if key[0] == hd and v in row}
            if not cells:
                line += "  -".ljust(38)
                continue
            full = [r for (h, s, c), r in cells.items() if not c]
            caus = [r for (h, s, c), r in cells.items() if c]
            worst_key = min(cells, key=cells.get)
            ok = geomean(list(cells.values())) >= TARGETS.get(hd, 1.0) and cells[worst_key] >= FLOOR
            line += (f"  {geomean(list(cells.values())):.3f}{'*' if ok else ' '} {geomean(full):.3f} "
                     f"{geomean(caus):.3f}  {cells[worst_key]:.3f}@S{worst_key[1]}{'c' if worst_key[2] else ''}"
                     ).ljust(38)
        print(line)
    print("(* = meets the head dim's target and the floor)")
    print("\n== best variant per (head dim, causal): highest geomean over that group's cells ==")
    choice = {}
    for hd in hds:
        for causal in (False, True):
            keys = [k for k in results if k[0] == hd and k[2] == causal]
            cand = [(geomean([results[k][v] / results[k]["cudnn"] for k in keys]), v) for v in good[hd]
                    if all(v in results[k] for k in keys)]
            if not cand:
                continue
            cand.sort(reverse=True)
            g, v = cand[0]
            choice[(hd, causal)] = v
            runner = ", ".join(f"{vv} {gg:.3f}" for gg, vv in cand[1:4])
            print(f"hd{hd} {'causal' if causal else 'full  '}: {v} geomean {g:.3f}   (next: {runner})")
    for hd in hds:
        keys = [k for k in results if k[0] == hd]
        if not keys:
            continue
        chosen = [results[k][choice[(hd, k[2])]] / results[k]["cudnn"] for k in keys if (hd, k[2]) in choice]
        oracle = [max(results[k][v] for v in good[hd] if v in results[k]) / results[k]["cudnn"] for k in keys]
        print(f"hd{hd}: with the per-(hd, causal) choice geomean {geomean(chosen):.3f} (worst {min(chosen):.3f}); "
              f"per-cell oracle geomean {geomean(oracle):.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="comma list, or 'all'")
    ap.add_argument("--hd", default="64,128")
    ap.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--rep", type=float, default=25)
    ap.add_argument("--jobs", type=int, default=8, help="parallel check/compile subprocesses")
    ap.add_argument("--skip-check", action="store_true", help="time every variant without the check phase")
    ap.add_argument("--check-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    hds = [int(x) for x in args.hd.split(",")]
    if args.check_child:
        return check_child(args.check_child, args.dtype, hds)
    import check_bwd as cb
    variants = list(cb.VARIANTS) if args.variants == "all" else args.variants.split(",")
    unknown = [v for v in variants if v not in cb.VARIANTS]
    assert not unknown, f"unknown variants {unknown}; known: {list(cb.VARIANTS)}"
    import torch
    assert torch.cuda.get_device_capability() == (9, 0), "needs an sm_90 GPU"
    t0 = time.time()
    print(f"sweep_bwd: {args.dtype}, variants {variants}, TRITON_CACHE_DIR={os.environ['TRITON_CACHE_DIR']}",
          flush=True)
    if args.skip_check:
        good = {hd: [v for v in variants if cb.variant_kwargs(v, hd) is not None] for hd in hds}
    else:
        good = run_checks(variants, args.dtype, hds, args.jobs)
    print(f"check phase: {time.time() - t0:.0f}s", flush=True)
    results = bench(good, args.dtype, hds, [int(s) for s in args.seqs.split(",")], args.warmup, args.rep)
    summary(results, good, hds)
    print(f"sweep_bwd: {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
