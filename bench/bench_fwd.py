#!/usr/bin/env python3
"""Forward attention benchmark: aotriton vs torch SDPA (FLASH_ATTENTION and CUDNN_ATTENTION
backends), same process, same inputs, same timer.

aotriton is called through bench/shim.cpp (a C ABI over aotriton::v2::flash::attn_fwd) with
ctypes. For every case its output is first checked against torch's math SDPA in float32 (O and
LSE, max abs error printed; the peers' errors are printed too as a yardstick), then each backend
is timed with triton.testing.do_bench(warmup=25, rep=100, return_mode="median").

Default cases (DESIGN.md "Peers"): B*S = 16384 tokens, H*D = 2048, bf16, hd128 (H=16),
S in {4096 (B=4), 16384 (B=1)}, causal off and on. FLOPs = 4*B*H*Sq*Sk*D, x0.5 when causal.

    python3 bench/bench_fwd.py --shim /tmp/bench/libaotriton_shim.so --json /tmp/out/bench_fwd.json
Exit status: 0 when every aotriton output was right, 1 otherwise.
"""
import argparse
import ctypes
import json
import math
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
AOTRITON_DTYPE = {torch.float16: 1, torch.bfloat16: 2}  # aotriton::DType


class Aotriton:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        i64p = ctypes.POINTER(ctypes.c_int64)
        f = self.lib.aotriton_shim_attn_fwd
        f.argtypes = [ctypes.c_uint64] * 5 + [i64p] * 4 + [ctypes.c_int, ctypes.c_float, ctypes.c_int, ctypes.c_uint64]
        f.restype = ctypes.c_int
        self.lib.aotriton_shim_last_error.restype = ctypes.c_char_p
        self.lib.aotriton_shim_version.restype = ctypes.c_char_p
        self.version = self.lib.aotriton_shim_version().decode()

    def bind(self, q, k, v, o, lse, sm_scale, causal):
        """A no-argument callable launching attn_fwd on torch's current stream."""
        for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse)):
            assert t.is_cuda and t.stride(-1) == 1, f"{name} must be a CUDA tensor with a unit last stride"
        arr = lambda xs: (ctypes.c_int64 * len(xs))(*xs)
        sizes4 = arr([n for t in (q, k, v, o) for n in t.shape])
        strides4 = arr([s for t in (q, k, v, o) for s in t.stride()])
        lse_sizes, lse_strides = arr(list(lse.shape)), arr(list(lse.stride()))
        stream = torch.cuda.current_stream().cuda_stream
        args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), sizes4, strides4,
                lse_sizes, lse_strides, AOTRITON_DTYPE[q.dtype], float(sm_scale), int(causal), stream)
        fn = self.lib.aotriton_shim_attn_fwd
        last_error = self.lib.aotriton_shim_last_error

        def run():
            rc = fn(*args)
            if rc != 0:
                raise RuntimeError(f"aotriton attn_fwd failed (status {rc}): {last_error().decode()}")

        run._keepalive = (sizes4, strides4, lse_sizes, lse_strides)
        return run


def randn_nonzero(shape, dtype, gen, layout):
    b, h, s, d = shape
    if layout == "bshd":  # B x S x H x D memory viewed as B x H x S x D
        t = torch.randn((b, s, h, d), generator=gen, device="cuda", dtype=torch.float32).to(dtype).transpose(1, 2)
    else:
        t = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    t.masked_fill_(t == 0, 1.0)  # never zeros
    return t


@torch.no_grad()
def reference_errors(q, k, v, sm_scale, causal, outputs, lse):
    """Max |out - ref| for each output in `outputs` (name -> B x H x S x D) and for `lse`, against
    math SDPA in float32, computed a few heads at a time to bound memory."""
    b, h, sq, d = q.shape
    sk = k.shape[2]
    errs = {name: 0.0 for name in outputs}
    lse_err, lse_mag = 0.0, 1.0
    nan = {name: 0 for name in outputs}
    hc = max(1, min(h, int(2**31 // (sq * sk * 4))))  # about 2 GiB of scores per chunk
    mask = torch.ones(sq, sk, device=q.device, dtype=torch.bool).tril() if causal else None
    for bi in range(b):
        for h0 in range(0, h, hc):
            sl = (slice(bi, bi + 1), slice(h0, h0 + hc))
            qf, kf, vf = q[sl].float(), k[sl].float(), v[sl].float()
            with sdpa_kernel([SDPBackend.MATH]):
                ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, scale=sm_scale)
            scores = torch.matmul(qf, kf.transpose(-1, -2)) * sm_scale
            if causal:
                scores.masked_fill_(~mask, float("-inf"))
            ref_lse = torch.logsumexp(scores, dim=-1)
            del scores
            for name, out in outputs.items():
                o = out[sl].float()
                nan[name] += int(torch.isnan(o).sum())
                errs[name] = max(errs[name], float((o - ref).abs().nan_to_num(0.0).max()))
            got = lse[sl]
            nan["lse"] = nan.get("lse", 0) + int(torch.isnan(got).sum())
            lse_err = max(lse_err, float((got - ref_lse).abs().nan_to_num(0.0).max()))
            lse_mag = max(lse_mag, float(ref_lse.abs().max()))
    return errs, lse_err, lse_mag, nan


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def run_case(aot, dtype, b, h, s, d, causal, layout, gen):
    shape = (b, h, s, d)
    q, k, v = (randn_nonzero(shape, dtype, gen, layout) for _ in range(3))
    o = torch.empty_like(q)
    lse = torch.empty((b, h, s), device="cuda", dtype=torch.float32)
    sm_scale = 1.0 / math.sqrt(d)
    aot_fn = aot.bind(q, k, v, o, lse, sm_scale, causal)
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    row = {"case": f"{'causal' if causal else 'full'} B{b} H{h} S{s} D{d}", "batch": b, "heads": h, "seqlen": s,
           "head_dim": d, "causal": causal, "dtype": str(dtype).replace("torch.", ""), "layout": layout,
           "flops": flops}

    # Correctness first, on NaN-poisoned outputs.
    o.fill_(float("nan"))
    lse.fill_(float("nan"))
    aot_fn()
    torch.cuda.synchronize()
    outputs = {"aotriton": o}
    peers = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    peer_fns = {}
    for name, backend in peers.items():
        def peer(backend=backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)
        try:
            with sdpa_kernel([backend]):
                outputs[name] = peer()
            peer_fns[name] = (backend, peer)
        except RuntimeError as e:
            row[f"{name}_error"] = str(e).splitlines()[0][:200]
    torch.cuda.synchronize()
    errs, lse_err, lse_mag, nan = reference_errors(q, k, v, sm_scale, causal, outputs, lse)
    peer_errs = [errs[n] for n in peer_fns]
    o_bound = 3.0 * max(peer_errs) + 1e-3 if peer_errs else 1e-2
    lse_bound = 1e-3 * lse_mag
    ok = nan["aotriton"] == 0 and nan["lse"] == 0 and errs["aotriton"] <= o_bound and lse_err <= lse_bound
    row.update({"err_o": errs, "o_bound": o_bound, "err_lse": lse_err, "lse_bound": lse_bound,
                "nan_o": nan["aotriton"], "nan_lse": nan["lse"], "correct": ok})
    print(f"  {row['case']}: max|O-ref| aotriton {errs['aotriton']:.2e} "
          + " ".join(f"{n} {errs[n]:.2e}" for n in peer_fns)
          + f" (bound {o_bound:.2e}); max|LSE-ref| {lse_err:.2e} (bound {lse_bound:.2e})"
          + (f"; NaN O {nan['aotriton']} LSE {nan['lse']}" if nan["aotriton"] or nan["lse"] else "")
          + ("  OK" if ok else "  WRONG"), flush=True)
    del outputs

    # Timing: each backend the same way, same inputs, same process.
    ms = {"aotriton": bench(aot_fn)}
    for name, (backend, peer) in peer_fns.items():
        with sdpa_kernel([backend]):
            ms[name] = bench(peer)
    row["ms"] = ms
    row["tflops"] = {n: flops / (t * 1e-3) / 1e12 for n, t in ms.items()}
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", required=True, help="path of libaotriton_shim.so")
    ap.add_argument("--json", help="write all numbers here")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=16384, help="B*S")
    ap.add_argument("--hidden", type=int, default=2048, help="H*D")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--causal", default="0,1", help="comma-separated 0/1")
    ap.add_argument("--layout", default="bhsd", choices=["bhsd", "bshd"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference must be float32
    aot = Aotriton(args.shim)
    dtype = DTYPES[args.dtype]
    d = args.head_dim
    h = args.hidden // d
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cudnn": torch.backends.cudnn.version(), "aotriton": aot.version,
           "timer": "triton.testing.do_bench(warmup=25, rep=100, return_mode='median')"}
    print(f"aotriton {aot.version} | {env['device']} | torch {env['torch']} | triton {env['triton']} "
          f"| cuDNN {env['cudnn']}", flush=True)
    rows = []
    failures = 0
    for s in (int(x) for x in args.seqlens.split(",")):
        b = max(1, args.tokens // s)
        for causal in (bool(int(x)) for x in args.causal.split(",")):
            t0 = time.time()
            try:
                row = run_case(aot, dtype, b, h, s, d, causal, args.layout, gen)
            except Exception as e:  # keep going: report the case as failed
                row = {"case": f"{'causal' if causal else 'full'} B{b} H{h} S{s} D{d}", "correct": False,
                       "exception": f"{type(e).__name__}: {e}"}
                print(f"  {row['case']}: {row['exception']}", flush=True)
            row["wall_s"] = round(time.time() - t0, 1)
            failures += not row["correct"]
            rows.append(row)
            torch.cuda.empty_cache()

    def fmt(x):
        return f"{x:9.1f}" if x is not None else f"{'-':>9}"

    print()
    print(f"forward, {args.dtype}, hd{d}, H={h}, B*S={args.tokens}, layout {args.layout}, TFLOP/s (median)")
    print(f"{'case':<28}{'aotriton':>9}{'flash':>9}{'cuDNN':>9}{'aot/cuDNN':>11}{'aot/flash':>11}  check")
    for r in rows:
        tf = r.get("tflops", {})
        a, fl, cu = tf.get("aotriton"), tf.get("flash"), tf.get("cudnn")
        ratio = lambda x, y: f"{x / y:11.3f}" if x and y else f"{'-':>11}"
        print(f"{r['case']:<28}{fmt(a)}{fmt(fl)}{fmt(cu)}{ratio(a, cu)}{ratio(a, fl)}  "
              f"{'ok' if r['correct'] else 'WRONG'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "args": vars(args), "cases": rows}, f, indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
