"""One Gluon backward and one cuDNN backward of a FlashAttention-3 grid cell, for Nsight Compute.

usage: ncu --clock-control none --profile-from-start off --set full -o REPORT \\
           python test/gluon/profile_bwd.py [--hd 128] [--seq 4096] [--causal] [--variant product]

Builds the cell (``check_bwd.fa3_cell``), compiles and warms up both backwards outside the profiled
range, then runs each once between ``cudaProfilerStart`` and ``cudaProfilerStop``: the report holds
our three launches (preprocess, main kernel, dQ convert) and cuDNN's, each replayed by ncu for its
counters (tensor-pipe and shared-memory utilisation, stall reasons), side by side.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import check_bwd as cb  # noqa: E402


def profile_once(*launches):
    """Each of ``launches`` three times to compile and warm up, then once more each between
    ``cudaProfilerStart`` and ``cudaProfilerStop`` (ncu ``--profile-from-start off`` sees only those)."""
    for _ in range(3):
        for launch in launches:
            launch()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for launch in launches:
        launch()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hd", type=int, default=128)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--variant", default="product")
    args = ap.parse_args()
    c = cb.fa3_cell(args.hd, args.seq, args.causal)
    g = cb.GluonBwd(c.q, c.k, c.v, c.o, c.do, c.lse, args.hd ** -0.5, *c.window, variant=args.variant)
    profile_once(g.run, c.cudnn)
    print(f"profiled: hd{args.hd} S{args.seq} B{c.b} H{c.h} {'causal' if args.causal else 'full'} "
          f"variant {args.variant}")


if __name__ == "__main__":
    main()
