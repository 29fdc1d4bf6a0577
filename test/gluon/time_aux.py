"""GPU timing of the Gluon backward's two memory-bound launches (preprocess, dQ convert) per variant.

usage: python test/gluon/time_aux.py [--variants product,product_aux_w8,...] [--rep 200]

For the FA3-grid cell S4096, non-causal (check_bwd.fa3_cell; hd 128: B4 H16, hd 64: B4 H32), each
launch is timed alone (``triton.testing.do_bench`` median, same process) and reported as
microseconds and achieved bandwidth (bytes each launch must move: preprocess reads O and dO and
writes the zeroed fp32 dQ accumulator, lse2, delta2 and DELTA; convert reads the accumulator and
writes dQ).  The variants are check_bwd.VARIANTS (``_aux_rows`` / ``_aux_warps`` set the launch shape).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import triton  # noqa: E402

import check_bwd as cb  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="product,product_aux_w8,product_aux64_w8,product_aux128_w8")
    ap.add_argument("--rep", type=float, default=200)
    args = ap.parse_args()
    for hd in (128, 64):
        c = cb.fa3_cell(hd, 4096, False)
        rows = c.b * c.h * 4096
        pre_bytes = 2 * rows * hd * 2 + rows * hd * 4 + 3 * rows * 4
        conv_bytes = rows * hd * 4 + rows * hd * 2
        for name in args.variants.split(","):
            g = cb.GluonBwd(c.q, c.k, c.v, c.o, c.do, c.lse, hd ** -0.5, *c.window, variant=name)
            t_pre = triton.testing.do_bench(g.preprocess, warmup=20, rep=args.rep, return_mode="median") * 1e3
            t_conv = triton.testing.do_bench(g.convert, warmup=20, rep=args.rep, return_mode="median") * 1e3
            print(f"hd{hd:<4} {name:<20} preprocess {t_pre:6.1f} us ({pre_bytes / t_pre / 1e6:5.2f} TB/s)  "
                  f"convert {t_conv:6.1f} us ({conv_bytes / t_conv / 1e6:5.2f} TB/s)  sum {t_pre + t_conv:6.1f} us",
                  flush=True)


if __name__ == "__main__":
    main()
