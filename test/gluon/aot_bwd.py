"""CPU AOT compile check of the Gluon backward (sm_90, no GPU needed).

usage: build/venv/bin/python test/gluon/aot_bwd.py [--stages 2,3] [--mask-modes 0,1,2] [--regs 240,232]
       [--dkss 0,1] [--pers 0,1,2] [--dq-shapes 32:3:3,64:2:1] [--keep DIR] [substring ...]

Compiles every functional of the three launches of ``ABI.md`` ("attn_bwd on the Gluon backend")
with ``triton.compile(GluonASTSource | ASTSource, target=GPUTarget("cuda", 90, 32))`` and the
ABI signatures: ``attn_bwd_gluon`` for fp16/bf16 x HEAD_DIM 64/128 x COMPUTE_DQ 0/1 (x STAGES x the
performance constexprs MASK_MODE / CONS_REGS / DK_SS given; DK_SS only with COMPUTE_DQ),
``attn_bwd_gluon_preprocess`` and ``attn_bwd_gluon_dq_convert`` for fp16/bf16 x 64/128, and
``attn_bwd_gluon_dq`` (``bwd_dq.py``; in the archive at hd256 only) for fp16/bf16 x 64/128/256 at
``rules.GLUON_DQ_CONFIGS`` or the ``--dq-shapes`` given (``BLOCK_N:K_STAGES:V_STAGES``; signature from
``rules.ATTN_BWD_GLUON_DQ``).  Prints per
kernel: compile seconds, num_warps, shared bytes, maxnreg, tensordesc_meta and the registers /
stack / local bytes of ``cuobjdump -res-usage`` (shipped in the triton wheel): a non-zero stack or
local size means spills (reported as WARN).  Exit status 1 if anything fails to compile, exceeds
the shared-memory limit of sm_90 (232448 B) or (COMPUTE_DQ=1) lacks the TMA reduce-add.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="aot-bwd-cache-"))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from kernels.flash_gluon.bwd import attn_bwd_gluon  # noqa: E402
from kernels.flash_gluon.bwd_dq import attn_bwd_gluon_dq  # noqa: E402
import rules  # noqa: E402
from kernels.flash_gluon.bwd_dq_convert import attn_bwd_gluon_dq_convert  # noqa: E402
from kernels.flash_gluon.bwd_preprocess import attn_bwd_gluon_preprocess  # noqa: E402

sys.path.insert(0, HERE)
from aot_fwd import compile_or_fail, write_asm  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
SMEM_LIMIT = 232448
GL_DTYPES = {"fp16": gl.float16, "bf16": gl.bfloat16, "fp32": gl.float32}
#: Recommended launch options of attn_bwd_gluon (384 threads: 65536 / 384 = 170 -> 168).
MAXNREG = 168
#: Rows per program of the preprocess and convert kernels (divides 128): 4096 / HEAD_DIM keeps them
#: spill-free for fp16 and bf16 (8192 / HEAD_DIM spills 184-192 B in the fp16 preprocess).
AUX_ROWS = int(os.environ.get("AUX_ROWS", "4096"))
#: Their num_warps (check_bwd's ``_aux_warps``), and rows per program overriding AUX_ROWS (``_aux_rows``).
AUX_WARPS = int(os.environ.get("AUX_WARPS", "4"))
AUX_M = int(os.environ.get("AUX_M", "0"))


def desc_sig(dtype, block, layout=None):
    """Signature string of a Gluon tensordesc argument (the layout repr, as the JIT spells it)."""
    layout = layout or gl.NVMMASharedLayout.get_default_for(block, GL_DTYPES[dtype])
    return f"tensordesc<{dtype}[{', '.join(str(b) for b in block)}],{layout!r}>"


def vec_desc_sig():
    """lse2 / delta2: rank 2 over [rows / 64, 64] fp32, block [1, 64], no swizzle."""
    return desc_sig("fp32", [1, 64], gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))


#: The packing group (kernels/flash/varlen.py) after the kernels' other runtime arguments: all of it
#: in attn_bwd_gluon, its query side in the preprocess and the dQ conversion (ABI.md).
PACKING_Q = {"IS_VARLEN": "i32", "CU_SEQLENS_Q": "*i32", "N_TOKENS_Q": "i32", "VARLEN_STATUS": "*i32",
             "STORE_VARLEN_STATUS": "i32"}
PACKING = {**PACKING_Q, "CU_SEQLENS_K": "*i32", "N_TOKENS_K": "i32"}


def bwd_signature(dtype, hd):
    q = desc_sig(dtype, [1, 1, 64, hd])
    kv = desc_sig(dtype, [1, 1, 128, hd])
    return {"desc_q": q, "desc_k": kv, "desc_v": kv, "desc_do": q, "desc_dk": q, "desc_dv": q,
            # one dQ column strip, unswizzled (bwd.py's module docstring)
            "desc_dq_acc": desc_sig("fp32", [64, 8], gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32,
                                                                        rank=2)),
            "desc_lse2": vec_desc_sig(), "desc_delta2": vec_desc_sig(),
            "sm_scale": "fp32", "N_CTX_Q": "i32", "N_CTX_K": "i32", "SQ_PAD": "i32", "N_HEADS_Q": "i32",
            "GQA_GROUP": "i32", "WINDOW_LEFT": "i32", "WINDOW_RIGHT": "i32", "ALIGN_BOTTOM_RIGHT": "i32", **PACKING,
            "DROPOUT_THRESHOLD": "u32", "dropout_scale": "fp32", "PHILOX_SEED": "*i64", "PHILOX_OFFSET": "*i64",
            "philox_offset_base": "i64"}


def preprocess_signature(dtype):
    return {"O": f"*{dtype}", "DO": f"*{dtype}", "stride_oz": "i64", "stride_oh": "i64", "stride_om": "i32",
            "stride_doz": "i64", "stride_doh": "i64", "stride_dom": "i32", "LSE": "*fp32", "stride_lz": "i64",
            "stride_lh": "i64", "DELTA": "*fp32", "stride_deltaz": "i64", "stride_deltah": "i64",
            "LSE2": "*fp32", "DELTA2": "*fp32", "DQ_ACC": "*fp32", "N_CTX_Q": "i32", "SQ_PAD": "i32",
            "D_HEAD": "i32", "ZERO_DQ_ACC": "i32", **PACKING_Q}


def convert_signature(dtype):
    return {"DQ_ACC": "*fp32", "DQ": f"*{dtype}", "stride_dqz": "i64", "stride_dqh": "i64", "stride_dqm": "i32",
            "sm_scale": "fp32", "N_CTX_Q": "i32", "SQ_PAD": "i32", "D_HEAD": "i32", "N_HEADS_Q": "i32", **PACKING_Q}


#: Performance options of attn_bwd_gluon (constexprs after COMPUTE_DQ, see bwd.py): tag -> values.
#: ``--opts`` picks combinations, e.g. ``--opts m0,m1,m2 --regs 240,232 --dkss 0,1``.
def opt_tag(mask_mode, regs, dk_ss, pers=0):
    return f"m{mask_mode}-r{regs}" + ("-ss" if dk_ss else "") + (f"-p{pers}" if pers else "")


def dq_variants(shapes=None):
    """``attn_bwd_gluon_dq`` per dtype x bucket: ``rules.GLUON_DQ_CONFIGS``' shape, or each of ``shapes``
    (``(BLOCK_N, K_STAGES, V_STAGES)``)."""
    fam = rules.ATTN_BWD_GLUON_DQ
    out = {}
    for dtype in ("fp16", "bf16"):
        for hd in (64, 128, 256):
            functional = {"dtype": dtype, "head_dim": hd}
            (base, ) = fam.configs("sm_90", functional)
            for bn, ks, vs in shapes or [rules.GLUON_DQ_CONFIGS[hd]]:
                config = {**base, "BLOCK_N": bn, "K_STAGES": ks, "V_STAGES": vs}
                spec = rules._spec(fam, "sm_90", functional, config, "aligned")
                sig = {n: ty for n, ty in spec.signature.items() if ty != "constexpr"}
                out[f"attn_bwd_gluon_dq-{dtype}-hd{hd}-n{bn}k{ks}v{vs}"] = (
                    attn_bwd_gluon_dq, sig, dict(spec.constexprs), dict(spec.options), True)
    return out


def variants(stages_list, mask_modes=(0, ), regs_list=(240, ), dkss_list=(0, ), pers_list=(0, ), dq_shapes=None):
    """name -> (fn, signature, constexprs, options, gluon?)"""
    out = dq_variants(dq_shapes)
    for dtype in ("fp16", "bf16"):
        for hd in (64, 128):
            for dq in (1, 0):
                for st in stages_list:
                    for mm in mask_modes:
                        for regs in regs_list:
                            for ss in dkss_list:
                                if ss and not dq:
                                    continue  # DK_SS reads the shared dS^T tile, which exists with COMPUTE_DQ only
                                for pe in pers_list:
                                    out[f"attn_bwd_gluon-{dtype}-hd{hd}-dq{dq}-s{st}-{opt_tag(mm, regs, ss, pe)}"] = (
                                        attn_bwd_gluon, bwd_signature(dtype, hd),
                                        {"HEAD_DIM": hd, "BLOCK_M": 64, "BLOCK_N": 128, "STAGES": st,
                                         "COMPUTE_DQ": dq, "MASK_MODE": mm, "CONS_REGS": regs, "DK_SS": ss,
                                         "PERSISTENT": pe, "DESC_PER_STEP": 0, "WALK": 0},
                                        {"num_warps": 4, "maxnreg": MAXNREG}, True)
            out[f"attn_bwd_gluon_preprocess-{dtype}-hd{hd}"] = (
                attn_bwd_gluon_preprocess, preprocess_signature(dtype), {"HEAD_DIM": hd, "BLOCK_M": AUX_M or AUX_ROWS // hd},
                {"num_warps": AUX_WARPS}, False)
            out[f"attn_bwd_gluon_dq_convert-{dtype}-hd{hd}"] = (
                attn_bwd_gluon_dq_convert, convert_signature(dtype), {"HEAD_DIM": hd, "BLOCK_M": AUX_M or AUX_ROWS // hd},
                {"num_warps": AUX_WARPS}, False)
    return out


def res_usage(cubin):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    return dict(reg=int(m[1]), stack=int(m[2]), local=int(m[4])) if m else dict(reg=-1, stack=-1, local=-1)


def compile_one(fn, signature, constexprs, opts, is_gluon, keep=None, name=None):
    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    assert list(sig)[:len(fn.arg_names)] and set(sig) == set(fn.arg_names), (set(sig) ^ set(fn.arg_names))
    sig = {a: sig[a] for a in fn.arg_names}
    attrs = {(fn.arg_names.index(a), ): [["tt.divisibility", 16]] for a, t in sig.items() if t.startswith("*")}
    src = (GluonASTSource if is_gluon else ASTSource)(fn=fn, signature=sig, constexprs=dict(constexprs), attrs=attrs)
    options = make_backend(TARGET).parse_options(dict(opts))
    t0 = time.time()
    cc = triton.compile(src, target=TARGET, options=options.__dict__)
    secs = time.time() - t0
    md = cc.metadata
    info = dict(secs=secs, num_warps=md.num_warps, shared=md.shared, maxnreg=getattr(md, "maxnreg", None),
                scratch=md.global_scratch_size, tensordesc_meta=getattr(md, "tensordesc_meta", None),
                ptx=cc.asm["ptx"])
    info.update(res_usage(cc.asm["cubin"]))
    if keep:
        write_asm(cc, keep, name)
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", default="2,3")
    ap.add_argument("--mask-modes", default="0", help="MASK_MODE values of attn_bwd_gluon (0,1,2)")
    ap.add_argument("--regs", default="240", help="CONS_REGS values")
    ap.add_argument("--dkss", default="0", help="DK_SS values (0,1)")
    ap.add_argument("--pers", default="0", help="PERSISTENT values (0 one CTA per key block, 1 head-major, 2 LPT)")
    ap.add_argument("--dq-shapes", default=None,
                    help="attn_bwd_gluon_dq shapes BLOCK_N:K_STAGES:V_STAGES,... (default rules.GLUON_DQ_CONFIGS)")
    ap.add_argument("--keep", default=None, help="write ttgir/ptx/cubin here")
    ap.add_argument("only", nargs="*")
    args = ap.parse_args()
    ints = lambda t: [int(x) for x in t.split(",")]  # noqa: E731
    stages = ints(args.stages)
    bad = spills = 0
    dq_shapes = [tuple(int(x) for x in s.split(":")) for s in args.dq_shapes.split(",")] if args.dq_shapes else None
    for name, (fn, sig, cx, opts, is_gluon) in variants(stages, ints(args.mask_modes), ints(args.regs),
                                                        ints(args.dkss), ints(args.pers), dq_shapes).items():
        if args.only and not any(s in name for s in args.only):
            continue
        info = compile_or_fail(name, lambda: compile_one(fn, sig, cx, opts, is_gluon, args.keep, name))
        if info is None:
            bad += 1
            continue
        problems = []
        warn = "SPILLS" if info["stack"] or info["local"] else ""
        spills += bool(warn)
        if info["shared"] > SMEM_LIMIT:
            problems.append("SHARED>LIMIT")
        if is_gluon and cx.get("COMPUTE_DQ") and "cp.reduce.async.bulk.tensor" not in info["ptx"]:
            problems.append("NO-TMA-REDUCE")
        if is_gluon and not cx.get("COMPUTE_DQ") and "cp.reduce.async.bulk" in info["ptx"]:
            problems.append("UNEXPECTED-REDUCE")
        bad += bool(problems)
        meta = info["tensordesc_meta"]
        meta_s = ""
        if meta:
            meta_s = " tdmeta=[" + "; ".join(
                f"{m.get('block_size')} sw{m.get('swizzle')} t{m.get('elem_type')}" for m in meta) + "]"
        print(f"{'BAD ' if problems else 'WARN' if warn else 'OK  '} {name}: {info['secs']:.1f}s warps={info['num_warps']} "
              f"shared={info['shared']} maxnreg={info['maxnreg']} reg={info['reg']} stack={info['stack']} "
              f"local={info['local']} scratch={info['scratch']}{meta_s} {' '.join(problems + [warn])}", flush=True)
    print(f"aot_bwd: {'all compiled' if not bad else f'{bad} problem(s)'}; {spills} kernel(s) with spills "
          "(stack/local > 0: see the docstring of bwd.py)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
