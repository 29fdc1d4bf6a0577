"""AOT compile check of the Gluon forward (``attn_fwd_gluon``) for sm_90, no GPU needed.

Compiles the six functionals (fp16/bf16 x HEAD_DIM 64/128/256) exactly as the signature
table of ``python/kernels/flash_gluon/ABI.md`` says, and prints per kernel: compile seconds,
metadata (num_warps, shared, tensordesc_meta) and register / spill usage (ptxas ``-v`` on
the PTX, plus local-memory instructions counted in the SASS).

usage: build/venv/bin/python test/gluon/aot_fwd.py [--stages N] [--maxnreg N] [--out DIR] [filter ...]
       build/venv/bin/python test/gluon/aot_fwd.py --variant NAME [--variant NAME ...] | --all-variants
  --variant / --all-variants compile the named configurations of ``fwd_variants.py`` (every
  applicable head dim, fp16 and bf16) and also print the setmaxnreg values found in the PTX and
  the CTAs per SM that registers and shared memory allow.
Exit status 1 if a kernel fails to compile or spills.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="aot_fwd_cache_"))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import make_backend  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from kernels.flash_gluon.fwd import attn_fwd_gluon  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fwd_variants  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def write_asm(cc, outdir, name):
    """The ttgir, ptx and cubin of compiled kernel ``cc`` as ``outdir/name.*`` (also used by aot_bwd.py)."""
    os.makedirs(outdir, exist_ok=True)
    for ext in ("ttgir", "ptx"):
        with open(os.path.join(outdir, f"{name}.{ext}"), "w") as f:
            f.write(cc.asm[ext])
    with open(os.path.join(outdir, f"{name}.cubin"), "wb") as f:
        f.write(cc.asm["cubin"])


def compile_or_fail(tag, compile_fn):
    """``compile_fn()``, or None after a ``FAIL`` line with the end of the error: the scripts report
    every kernel, then fail (also used by aot_bwd.py)."""
    try:
        return compile_fn()
    except Exception as e:  # noqa: BLE001
        lines = str(e).strip().splitlines()
        print(f"FAIL {tag}: {type(e).__name__}: {' | '.join(lines[-8:])[:2000]}", flush=True)
        return None
NV_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
GL_DTYPES = {"fp16": gl.float16, "bf16": gl.bfloat16}

# Recommended configuration per head-dim bucket: (BLOCK_N, STAGES).  Shared memory:
# Q 2 x 64 x HD x 2 B + K/V STAGES x 2 x BLOCK_N x HD x 2 B (hd256: 64 + 128 KiB).
CONFIGS = {64: (128, 2), 128: (128, 2), 256: (64, 2)}
MAXNREG = 168  # 12 warps x 32 x 168 <= 64 K registers; setmaxnreg 240 / 240 / 24 inside


def tensordesc(dtype, block):
    layout = gl.NVMMASharedLayout.get_default_for(block, GL_DTYPES[dtype])
    return f"tensordesc<{dtype}[{', '.join(str(b) for b in block)}],{layout!r}>"


def signature(dtype, head_dim, block_n):
    q_block, kv_block = [1, 1, 64, head_dim], [1, 1, block_n, head_dim]
    return {
        "desc_q": tensordesc(dtype, q_block), "desc_k": tensordesc(dtype, kv_block),
        "desc_v": tensordesc(dtype, kv_block), "desc_o": tensordesc(dtype, q_block),
        "LSE": "*fp32", "stride_lz": "i64", "stride_lh": "i64", "sm_scale": "fp32", "STORE_LSE": "i32",
        "N_CTX_Q": "i32", "N_CTX_K": "i32", "GQA_GROUP": "i32",
        "WINDOW_LEFT": "i32", "WINDOW_RIGHT": "i32", "ALIGN_BOTTOM_RIGHT": "i32",
        "IS_VARLEN": "i32", "CU_SEQLENS_Q": "*i32", "CU_SEQLENS_K": "*i32", "N_TOKENS_Q": "i32", "N_TOKENS_K": "i32",
        "VARLEN_STATUS": "*i32", "STORE_VARLEN_STATUS": "i32",
        "DROPOUT_THRESHOLD": "u32", "dropout_scale": "fp32", "PHILOX_SEED": "*i64", "PHILOX_OFFSET": "*i64",
        "philox_offset_base": "i64", "PHILOX_SEED_OUT": "*i64", "PHILOX_OFFSET_OUT": "*i64", "STORE_PHILOX": "i32",
        "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "STAGES": "constexpr",
    }


def ptxas_usage(ptx, tmpdir, name):
    """(registers, spill stores, spill loads, stack bytes) from ``ptxas -v`` on the kernel's PTX."""
    path = os.path.join(tmpdir, f"{name}.ptx")
    with open(path, "w") as f:
        f.write(ptx)
    out = subprocess.run([os.path.join(NV_BIN, "ptxas"), "-arch=sm_90a", "-v", path, "-o", os.devnull],
                         capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    stores, loads = (int(x) for x in re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out).groups())
    stack = int(re.search(r"(\d+) bytes stack frame", out).group(1))
    return regs, stores, loads, stack


def sass_local_ops(cubin, tmpdir, name):
    """Number of local-memory instructions (LDL/STL) in the SASS: 0 means no spills anywhere."""
    path = os.path.join(tmpdir, f"{name}.cubin")
    with open(path, "wb") as f:
        f.write(cubin)
    sass = subprocess.run([os.path.join(NV_BIN, "cuobjdump"), "-sass", path], capture_output=True, text=True,
                          check=True).stdout
    return len(re.findall(r"\b(?:LDL|STL)(?:\.\w+)*\s", sass))


def compile_one(dtype, head_dim, block_n, stages, maxnreg, tmpdir, outdir=None, config=None, name=None):
    """Compile one kernel; ``config`` (a ``fwd_variants`` config) overrides block_n/stages/maxnreg
    and adds the option constexprs."""
    sig = signature(dtype, head_dim, block_n if config is None else config["BLOCK_N"])
    if config is None:
        constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": 128, "BLOCK_N": block_n, "STAGES": stages}
    else:
        constexprs = {"HEAD_DIM": head_dim, **fwd_variants.constexprs(config)}
        for k in fwd_variants.OPTION_CONSTEXPRS:
            sig[k] = "constexpr"
        maxnreg = config["maxnreg"]
    src = GluonASTSource(fn=attn_fwd_gluon, signature=sig, constexprs=constexprs)
    options = make_backend(TARGET).parse_options({"num_warps": 4, "maxnreg": maxnreg})
    t0 = time.time()
    cc = triton.compile(src, target=TARGET, options=options.__dict__)
    seconds = time.time() - t0
    md = cc.metadata._asdict()
    name = name or f"attn_fwd_gluon_{dtype}_hd{head_dim}_bn{block_n}_s{stages}"
    regs, spill_st, spill_ld, stack = ptxas_usage(cc.asm["ptx"], tmpdir, name)
    local_ops = sass_local_ops(cc.asm["cubin"], tmpdir, name)
    if outdir:
        write_asm(cc, outdir, name)
    setmaxnreg = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", cc.asm["ptx"])
    return dict(name=name, seconds=seconds, num_warps=md["num_warps"], shared=md["shared"],
                setmaxnreg=sorted({f"{op}{n}" for op, n in setmaxnreg}),
                global_scratch=md.get("global_scratch_size"), tensordesc_meta=md.get("tensordesc_meta"),
                regs=regs, spill_stores=spill_st, spill_loads=spill_ld, stack=stack, local_ops=local_ops)


def ctas_per_sm(r, maxnreg):
    """CTAs per SM that registers (maxnreg x threads, 256-register warp granules) and shared memory allow."""
    threads = r["num_warps"] * 32
    regs = 65536 // (((maxnreg * 32 + 255) // 256 * 256) * r["num_warps"])
    smem = 233472 // (r["shared"] + 1024)  # 228 KiB per SM, 1 KiB reserved per CTA
    del threads
    return min(regs, smem)


def compile_variants(names, out):
    failures = 0
    with tempfile.TemporaryDirectory() as tmpdir:
        for vname in names:
            for head_dim in fwd_variants.HEAD_DIMS:
                c = fwd_variants.config(vname, head_dim)
                if c is None:
                    print(f"n/a  {vname} hd{head_dim}", flush=True)
                    continue
                for dtype in ("fp16", "bf16"):
                    tag = f"{vname}_{dtype}_hd{head_dim}"
                    r = compile_or_fail(tag, lambda: compile_one(dtype, head_dim, None, None, None, tmpdir, out,
                                                                 config=c, name=tag))
                    if r is None:
                        failures += 1
                        continue
                    spills = r["spill_stores"] + r["spill_loads"] + r["local_ops"]
                    failures += spills > 0
                    print(f"{'OK  ' if spills == 0 else 'SPILL'} {tag}: {r['seconds']:.1f} s, "
                          f"num_warps {r['num_warps']}, shared {r['shared']} B, regs {r['regs']} "
                          f"(maxnreg {c['maxnreg']}), setmaxnreg {' '.join(r['setmaxnreg'])}, spill stores/loads "
                          f"{r['spill_stores']}/{r['spill_loads']} B, LDL/STL {r['local_ops']}, "
                          f"CTAs/SM {ctas_per_sm(r, c['maxnreg'])} [{fwd_variants.describe(c)}]", flush=True)
    print(f"aot_fwd: {'all compiled without spills' if failures == 0 else f'{failures} failed or spilled'}")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", default=[], choices=sorted(fwd_variants.VARIANTS),
                    help="compile this fwd_variants.py configuration (repeatable)")
    ap.add_argument("--all-variants", action="store_true", help="compile every fwd_variants.py configuration")
    ap.add_argument("--stages", type=int, default=None, help="override STAGES for every head dim")
    ap.add_argument("--block-n", type=int, default=None, help="override BLOCK_N for every head dim")
    ap.add_argument("--maxnreg", type=int, default=MAXNREG)
    ap.add_argument("--out", default=None, help="also write ttgir/ptx/cubin here")
    ap.add_argument("filter", nargs="*", help="substrings of kernel names to compile (default: all)")
    args = ap.parse_args()
    if args.variant or args.all_variants:
        return compile_variants(list(fwd_variants.VARIANTS) if args.all_variants else args.variant, args.out)

    failures = 0
    with tempfile.TemporaryDirectory() as tmpdir:
        for dtype in ("fp16", "bf16"):
            for head_dim, (block_n, stages) in CONFIGS.items():
                block_n = args.block_n or block_n
                stages = args.stages or stages
                tag = f"attn_fwd_gluon_{dtype}_hd{head_dim}_bn{block_n}_s{stages}"
                if args.filter and not any(f in tag for f in args.filter):
                    continue
                r = compile_or_fail(tag, lambda: compile_one(dtype, head_dim, block_n, stages, args.maxnreg, tmpdir,
                                                             args.out))
                if r is None:
                    failures += 1
                    continue
                spills = r["spill_stores"] + r["spill_loads"] + r["local_ops"]
                failures += spills > 0
                print(f"{'OK  ' if spills == 0 else 'SPILL'} {r['name']}: {r['seconds']:.1f} s, "
                      f"num_warps {r['num_warps']}, shared {r['shared']} B, global_scratch {r['global_scratch']}, "
                      f"regs {r['regs']} (maxnreg {args.maxnreg}), spill stores/loads {r['spill_stores']}/"
                      f"{r['spill_loads']} B, stack {r['stack']} B, LDL/STL {r['local_ops']}", flush=True)
                print(f"      tensordesc_meta {r['tensordesc_meta']}", flush=True)
    print(f"aot_fwd: {'all compiled without spills' if failures == 0 else f'{failures} failed or spilled'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
