#!/usr/bin/env python3
"""Forward-only benchmark with the first milestone's defaults (bf16, hd128, H=16, B*S=16384,
S in {4096, 16384}, causal off and on, do_bench warmup=25 rep=100): a thin wrapper over
bench_attn.py, which now measures forward and backward. Takes the old options:

    python3 bench/bench_fwd.py --shim /tmp/bench/libaotriton_shim.so --json /tmp/out/bench_fwd.json
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_attn  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--json")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--layout", default="bhsd")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    argv = ["--shim", a.shim, "--dtype", a.dtype, "--head-dims", str(a.head_dim), "--tokens", str(a.tokens),
            "--hidden", str(a.hidden), "--seqlens", a.seqlens, "--causal", a.causal, "--layout", a.layout,
            "--seed", str(a.seed), "--passes", "fwd", "--warmup", "25", "--rep", "100"]
    if a.json:
        argv += ["--json", a.json]
    sys.argv = [sys.argv[0]] + argv
    return bench_attn.main()


if __name__ == "__main__":
    sys.exit(main())
