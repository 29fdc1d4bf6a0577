"""One Gluon backward and one cuDNN backward of a FlashAttention-3 grid cell, for Nsight Compute.

usage: ncu --clock-control none --profile-from-start off --set full -o REPORT \\
           python test/gluon/profile_bwd.py [--hd 128] [--seq 4096] [--causal] [--variant product] [--dropout 0.1]

Builds the cell (``check_bwd.bench_cell``, B*S = 16k, H*D = 2048), compiles and warms up both
backwards outside the profiled range, then runs each once between ``cudaProfilerStart`` and ``cudaProfilerStop``: the report holds
our three launches (preprocess, main kernel, dQ convert) and cuDNN's, each replayed by ncu for its
counters (tensor-pipe and shared-memory utilisation, stall reasons), side by side. ``--dropout P``:
both backwards with dropout (ours with the shipped kernels' Philox rule, cuDNN's its own), the
question being where the Gluon dropout backward's time goes (0.77-0.85x cuDNN where the plain one
is at par).
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
    ap.add_argument("--dropout", type=float, default=0.0)
    args = ap.parse_args()
    d, s = args.hd, args.seq
    c = cb.bench_cell(max(1, 16384 // s), 2048 // d, 2048 // d, s, d, args.causal, dropout_p=args.dropout)
    dropout = None
    if args.dropout:
        import check_bwd_dropout
        dropout = check_bwd_dropout.dropout_group(args.dropout)
    g = cb.GluonBwd(c.q, c.k, c.v, c.o, c.do, c.lse, d ** -0.5, *c.window, variant=args.variant, dropout=dropout)
    profile_once(g.run, c.cudnn)
    print(f"profiled: hd{d} S{s} B{c.b} H{c.h} {'causal' if args.causal else 'full'} "
          f"variant {args.variant} dropout {args.dropout}")


if __name__ == "__main__":
    main()
