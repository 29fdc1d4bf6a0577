"""One Gluon dropout forward and one cuDNN dropout forward of a bench cell, for Nsight Compute.

usage: ncu --clock-control none --profile-from-start off --section WarpStateStats --section InstructionStats \\
           --section SchedulerStats -o REPORT \\
           python test/gluon/profile_fwd_dropout.py [--hd 128] [--seq 2048] [--causal] [--rounds-loop 0|1] [--one-loop 0|1|2]

The cell of ``check_fwd_dropout.py --bench`` (p 0.1, bf16, B*S = 16k, H*D = 2048). The question it
answers: the hd128 causal dropout forward runs at about half the rate of the unmasked one (0.41-0.53x
cuDNN at S2k where the unmasked one reaches 0.77-0.83x), and one masked loop lifts it; if the two
loops' code overflows the instruction cache, the warps stall on "no instruction" (WarpStateStats)
in the causal run and not in the unmasked one. Compiles and warms up both forwards outside the
profiled range, then runs each once between ``cudaProfilerStart`` and ``cudaProfilerStop``.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import check_fwd_dropout as cfd  # noqa: E402
from profile_bwd import profile_once  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hd", type=int, default=128)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds-loop", type=int, choices=(0, 1), default=None)
    ap.add_argument("--one-loop", type=int, choices=(0, 1, 2, 3), default=None)
    args = ap.parse_args()
    cfd.patch_switches(args.rounds_loop, args.one_loop)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    d, s = args.hd, args.seq
    case = cfd.Case("bf16", d, s, s, "causal" if args.causal else "none", p=0.1, hq=2048 // d, hk=2048 // d,
                    b=16384 // s)
    q, k, v, o, lse = cfd.inputs(case)
    wl, wr, align = cfd.cf.window(case.mask, s, s)

    def ours():
        cfd.launch(case, q, k, v, o, lse, d**-0.5, wl, wr, align)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=args.causal)

    profile_once(ours, cudnn)
    print(f"profiled: dropout forward hd{d} S{s} B{case.b} H{case.hq} {'causal' if args.causal else 'full'} "
          f"(rounds loop {args.rounds_loop}, one loop {args.one_loop}: None = the shipped switches)")


if __name__ == "__main__":
    main()
