#!/usr/bin/env python3
"""Before/after table of bench_attn.py runs: aotriton's TFLOP/s per cell, best of the runs given
for each side, with cuDNN's own before/after ratio beside it as the noise yardstick (cuDNN's code
is the same in both, so its spread is what the GPU and the timer give).

    python3 bench/compare_runs.py --before old-1.json old-2.json --after new-1.json new-2.json
"""
import argparse
import json
import math


def _cases(paths):
    return [{c["case"]: c for c in json.load(open(p))["cases"]} for p in paths]


def _best(runs, case, pas, who):
    return max(r[case][f"tflops_{pas}"][who] for r in runs)


def _geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", nargs="+", required=True, help="bench_attn.py --json files, before")
    ap.add_argument("--after", nargs="+", required=True, help="bench_attn.py --json files, after")
    args = ap.parse_args()
    before, after = _cases(args.before), _cases(args.after)
    print(f"{'case':36s} {'pass':4s} {'before':>7s} {'after':>7s} {'ratio':>6s} {'cuDNN ratio':>11s}")
    ours, peer = [], []
    for case in before[0]:
        for pas in ("fwd", "bwd"):
            b, a = _best(before, case, pas, "aotriton"), _best(after, case, pas, "aotriton")
            cb, ca = _best(before, case, pas, "cudnn"), _best(after, case, pas, "cudnn")
            ours.append(a / b)
            peer.append(ca / cb)
            print(f"{case:36s} {pas:4s} {b:7.1f} {a:7.1f} {a / b:6.3f} {ca / cb:11.3f}")
    print(f"aotriton after/before: geomean {_geomean(ours):.3f} (min {min(ours):.3f}, max {max(ours):.3f}); "
          f"cuDNN's: geomean {_geomean(peer):.3f} (min {min(peer):.3f}, max {max(peer):.3f})")


if __name__ == "__main__":
    main()
