"""AOT compile check of the fp8 Gluon forward (``attn_fwd_gluon_fp8``) for sm_90, no GPU needed.

Compiles one kernel per (head dim, BLOCK_N, STAGES) given and prints its registers, spills,
shared memory and how the P conversion to the fp8 operand layout was lowered (warp shuffles
vs shared memory, counted in the SASS).

usage: build/venv/bin/python test/gluon/aot_fwd_fp8.py [--out DIR] HD:BLOCK_N:STAGES[:CONSUMER_REGS] ...
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aot_fwd import NV_BIN, TARGET, ptxas_usage, sass_local_ops, write_asm  # noqa: E402  (sets up sys.path)

import triton  # noqa: E402
from triton.compiler import make_backend  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from kernels.flash_gluon.fwd_fp8 import attn_fwd_gluon_fp8  # noqa: E402

GL = {"fp8e4nv": gl.float8e4nv, "bf16": gl.bfloat16}


def tensordesc(dtype, block):
    layout = gl.NVMMASharedLayout.get_default_for(block, GL[dtype])
    return f"tensordesc<{dtype}[{', '.join(str(b) for b in block)}],{layout!r}>"


def signature(head_dim, block_n):
    sig = {"desc_q": tensordesc("fp8e4nv", [1, 1, 64, head_dim]),
           "desc_k": tensordesc("fp8e4nv", [1, 1, block_n, head_dim]),
           "desc_vt": tensordesc("fp8e4nv", [1, 1, head_dim, block_n]),
           "desc_o": tensordesc("bf16", [1, 1, 64, head_dim]),
           "LSE": "*fp32", "stride_lz": "i64", "stride_lh": "i64", "sm_scale": "fp32", "STORE_LSE": "i32",
           "N_CTX_Q": "i32", "N_CTX_K": "i32", "GQA_GROUP": "i32",
           "WINDOW_LEFT": "i32", "WINDOW_RIGHT": "i32", "ALIGN_BOTTOM_RIGHT": "i32"}
    for t in "qkv":
        sig.update({f"DESCALE_{t.upper()}": "*fp32", f"stride_ds{t}z": "i64", f"stride_ds{t}h": "i64"})
    for c in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "STAGES", "NUM_CONSUMERS", "CONSUMER_REGS", "OVERLAP", "PINGPONG"):
        sig[c] = "constexpr"
    return sig


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--maxnreg", type=int, default=168)
    ap.add_argument("--serial", action="store_true", help="OVERLAP=0")
    ap.add_argument("--pingpong", action="store_true", help="PINGPONG=1")
    ap.add_argument("--consumers", type=int, default=2, help="NUM_CONSUMERS (3: BLOCK_M 192)")
    ap.add_argument("configs", nargs="+")
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmpdir:
        for spec in args.configs:
            hd, bn, st, *regs = (int(x) for x in spec.split(":"))
            cregs = regs[0] if regs else 240
            name = f"attn_fwd_gluon_fp8_hd{hd}_bn{bn}_s{st}_r{cregs}{'_serial' if args.serial else ''}{'_pp' if args.pingpong else ''}_n{args.consumers}"
            src = GluonASTSource(fn=attn_fwd_gluon_fp8, signature=signature(hd, bn),
                                 constexprs={"HEAD_DIM": hd, "BLOCK_M": 64 * args.consumers, "BLOCK_N": bn, "STAGES": st,
                                             "NUM_CONSUMERS": args.consumers,
                                             "CONSUMER_REGS": cregs, "OVERLAP": 0 if args.serial else 1,
                                             "PINGPONG": int(args.pingpong)})
            options = make_backend(TARGET).parse_options({"num_warps": 4, "maxnreg": args.maxnreg})
            try:
                cc = triton.compile(src, target=TARGET, options=options.__dict__)
            except Exception as e:  # noqa: BLE001
                print(f"FAIL {name}: {type(e).__name__}: {' | '.join(str(e).strip().splitlines()[-8:])[:3000]}")
                failures += 1
                continue
            if args.out:
                write_asm(cc, args.out, name)
            regs_used, st_b, ld_b, _ = ptxas_usage(cc.asm["ptx"], tmpdir, name)
            local_ops = sass_local_ops(cc.asm["cubin"], tmpdir, name)
            path = os.path.join(tmpdir, name + ".cubin")
            sass = subprocess.run([os.path.join(NV_BIN, "cuobjdump"), "-sass", path], capture_output=True,
                                  text=True, check=True).stdout
            counts = {op: len(re.findall(rf"\b{op}\b", sass)) for op in ("SHFL", "PRMT", "STS", "LDS", "F2FP")}
            print(f"{'OK' if st_b + ld_b + local_ops == 0 else 'SPILL'} {name}: shared {cc.metadata.shared} B, "
                  f"regs {regs_used}, spill {st_b}/{ld_b} B, LDL/STL {local_ops}, SASS {counts}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
