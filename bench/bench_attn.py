#!/usr/bin/env python3
"""Attention benchmark, forward and backward: aotriton vs torch SDPA (FLASH_ATTENTION and
CUDNN_ATTENTION backends), same process, same inputs, same timer.

aotriton is called through bench/shim.cpp (a C ABI over aotriton::v2::flash::attn_fwd/attn_bwd)
with ctypes (bench/aotriton_shim.py). For every shape, its outputs are first checked against
torch's math SDPA in float32 (O, LSE, dQ, dK, dV; max abs errors printed, the peers' errors too
as a yardstick), then each backend is timed with
triton.testing.do_bench(warmup, rep, return_mode="median") (CUDA events):
  forward   aotriton attn_fwd (with LSE); torch SDPA on tensors without autograd.
  backward  aotriton attn_bwd alone (delta + dK/dV + dQ kernels, O/LSE precomputed);
            torch: the forward is run once with q/k/v requiring grad, then only
            out.backward(dO, retain_graph=True) is timed, with q.grad = k.grad = v.grad = None
            before every call (do_bench's grad_to_none, outside the timed region), so no
            gradient accumulation is timed for one backend and not another.
A backend that refuses a shape (RuntimeError) shows "n/a" in its cell.

Default shapes (DESIGN.md "Peers"/"Measuring"): bf16, B*S = 16384 tokens, H*D = 2048, hd 64/128/256
(H = 32/16/8), S in 512..16384 (B = 16384 / S), causal off and on.
FLOPs: forward 4*B*H*Sq*Sk*D (x0.5 causal); backward 2.5x forward.

    python3 bench/bench_attn.py --shim /tmp/bench/libaotriton_shim.so --json /tmp/out/bench_attn.json
Exit status: 0 when every aotriton output was right, 1 otherwise.
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from aotriton_shim import Aotriton  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PEERS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
GRADS = ("dq", "dk", "dv")


def randn_nonzero(shape, dtype, gen, layout):
    b, h, s, d = shape
    if layout == "bshd":  # B x S x H x D memory viewed as B x H x S x D
        t = torch.randn((b, s, h, d), generator=gen, device="cuda", dtype=torch.float32).to(dtype).transpose(1, 2)
    else:
        t = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    t.masked_fill_(t == 0, 1.0)  # never zeros
    return t


def reference(q, k, v, d_o, sm_scale, causal, grads):
    """Math SDPA in float32 (TF32 off), a few heads at a time to bound memory: O, LSE and, when
    `grads`, dQ, dK, dV of L = sum(O * dO)."""
    b, h, sq, d = q.shape
    sk = k.shape[2]
    f32 = dict(device=q.device, dtype=torch.float32)
    ref = {"o": torch.empty(q.shape, **f32), "lse": torch.empty((b, h, sq), **f32)}
    if grads:
        ref.update(dq=torch.empty(q.shape, **f32), dk=torch.empty(k.shape, **f32), dv=torch.empty(v.shape, **f32))
    # About 2 GiB of scores per chunk (the backward keeps a few such tensors alive).
    hc = max(1, min(h, int(2**31 // (sq * sk * 4 * (3 if grads else 1)))))
    # Causal as torch's is_causal (top-left; the benchmark's shapes are square, where both alignments agree).
    mask = torch.ones(sq, sk, device=q.device, dtype=torch.bool).tril() if causal else None
    for bi in range(b):
        for h0 in range(0, h, hc):
            sl = (slice(bi, bi + 1), slice(h0, h0 + hc))
            qf, kf, vf = (t[sl].float().requires_grad_(grads) for t in (q, k, v))
            with torch.enable_grad(), sdpa_kernel([SDPBackend.MATH]):
                o = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=sm_scale)
                if grads:
                    o.backward(d_o[sl].float())
            with torch.no_grad():
                ref["o"][sl] = o
                scores = torch.matmul(qf, kf.transpose(-1, -2)) * sm_scale
                if causal:
                    scores.masked_fill_(~mask, float("-inf"))
                ref["lse"][sl] = torch.logsumexp(scores, dim=-1)
                del scores
                if grads:
                    ref["dq"][sl], ref["dk"][sl], ref["dv"][sl] = qf.grad, kf.grad, vf.grad
            del o, qf, kf, vf
    return ref


def max_err(out, ref):
    """(max |out - ref| ignoring NaNs, NaN count)."""
    diff = (out.float() - ref).abs()
    nan = int(torch.isnan(diff).sum())
    return float(diff.nan_to_num(0.0).max()), nan


def run_shape(aot, args, dtype, b, h, s, d, causal, gen):
    passes = args.passes
    shape = (b, h, s, d)
    q, k, v, d_o = (randn_nonzero(shape, dtype, gen, args.layout) for _ in range(4))
    sm_scale = 1.0 / math.sqrt(d)
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    label = f"hd{d:<3} S{s:<5} B{b:<2} H{h:<2} {'causal' if causal else 'full'}"
    row = {"case": label, "batch": b, "heads": h, "seqlen": s, "head_dim": d, "causal": causal,
           "dtype": str(dtype).replace("torch.", ""), "layout": args.layout, "flops_fwd": flops,
           "flops_bwd": 2.5 * flops, "na": {}}
    want_bwd = "bwd" in passes

    # aotriton: forward into NaN-poisoned outputs, then backward into NaN-poisoned gradients.
    o = torch.full_like(q, float("nan"))
    lse = torch.full((b, h, s), float("nan"), device="cuda", dtype=torch.float32)
    aot_fwd = aot.bind_fwd(q, k, v, o, lse, sm_scale, causal=causal, align="tl")
    aot_fwd()
    outs = {"aotriton": {"o": o}}
    aot_bwd = None
    if want_bwd:
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        delta = torch.full((b, h, s), float("nan"), device="cuda", dtype=torch.float32)
        aot_bwd = aot.bind_bwd(q, k, v, o, d_o, lse, delta, dq, dk, dv, sm_scale, causal=causal, align="tl")
        aot_bwd()
        outs["aotriton"].update(dq=dq, dk=dk, dv=dv)

    # Peers: outputs (and gradients) once, for the check; "n/a" when torch refuses.
    peer_grad_inputs = {}
    for name, backend in PEERS.items():
        try:
            with sdpa_kernel([backend]):
                outs[name] = {"o": F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)}
        except RuntimeError as e:
            row["na"][f"{name}_fwd"] = row["na"][f"{name}_bwd"] = str(e).splitlines()[0][:200]
            continue
        if want_bwd:
            try:
                leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=sm_scale)
                    out.backward(d_o, retain_graph=True)
                outs[name].update(dq=leaves[0].grad, dk=leaves[1].grad, dv=leaves[2].grad)
                peer_grad_inputs[name] = (leaves, out)
            except RuntimeError as e:
                row["na"][f"{name}_bwd"] = str(e).splitlines()[0][:200]
    torch.cuda.synchronize()

    ref = reference(q, k, v, d_o, sm_scale, causal, want_bwd)
    errs = {n: {t: max_err(x, ref[t]) for t, x in tensors.items()} for n, tensors in outs.items()}
    lse_err, lse_nan = max_err(lse, ref["lse"])
    lse_bound = 1e-3 * max(1.0, float(ref["lse"].abs().max()))
    # Bounds: k x the worst peer's error + floor (O: k=3, floor 1e-3; gradients: k=5, floor
    # 1e-3 x max(1, max|ref|)); with no peer for a tensor, 2e-2 x max(1, max|ref|).
    bounds, ok = {}, lse_nan == 0 and lse_err <= lse_bound
    for t in ["o"] + (list(GRADS) if want_bwd else []):
        mag = max(1.0, float(ref[t].abs().max()))
        peer = [errs[n][t][0] for n in PEERS if n in errs and t in errs[n]]
        k_t, floor = (3.0, 1e-3) if t == "o" else (5.0, 1e-3 * mag)
        bounds[t] = k_t * max(peer) + floor if peer else 2e-2 * mag
        err, nan = errs["aotriton"][t]
        ok &= nan == 0 and err <= bounds[t]
    row.update(errors={n: {t: e[0] for t, e in v.items()} for n, v in errs.items()},
               nan={t: e[1] for t, e in errs["aotriton"].items()}, bounds=bounds, err_lse=lse_err,
               lse_bound=lse_bound, nan_lse=lse_nan, correct=bool(ok))
    text = "  ".join(
        f"{t}: aot {errs['aotriton'][t][0]:.2e} "
        + " ".join(f"{n} {errs[n][t][0]:.2e}" for n in PEERS if n in errs and t in errs[n])
        + f" (bound {bounds[t]:.2e})" for t in bounds)
    nans = {t: n for t, n in row["nan"].items() if n} | ({"lse": lse_nan} if lse_nan else {})
    print(f"  {label}: max|x-ref| {text}  lse {lse_err:.2e} (bound {lse_bound:.2e})"
          + (f"  NaN {nans}" if nans else "") + ("  OK" if ok else "  WRONG"), flush=True)
    del ref, outs

    # Timing: every backend the same way, same inputs, same process.
    def bench(fn, grad_to_none=None):
        return triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, grad_to_none=grad_to_none,
                                       return_mode="median")

    ms_fwd, ms_bwd = {}, {}
    if "fwd" in passes:
        ms_fwd["aotriton"] = bench(aot_fwd)
        for name, backend in PEERS.items():
            if f"{name}_fwd" in row["na"]:
                continue
            with sdpa_kernel([backend]):
                ms_fwd[name] = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale))
    if want_bwd:
        ms_bwd["aotriton"] = bench(aot_bwd)
        for name, (leaves, out) in peer_grad_inputs.items():
            with sdpa_kernel([PEERS[name]]):
                ms_bwd[name] = bench(lambda: out.backward(d_o, retain_graph=True), grad_to_none=leaves)
    row["ms_fwd"], row["ms_bwd"] = ms_fwd, ms_bwd
    row["tflops_fwd"] = {n: flops / (t * 1e-3) / 1e12 for n, t in ms_fwd.items()}
    row["tflops_bwd"] = {n: 2.5 * flops / (t * 1e-3) / 1e12 for n, t in ms_bwd.items()}
    return row


def print_table(title, rows, key, na_key):
    def cell(x):
        return f"{x:9.1f}" if x is not None else f"{'n/a':>9}"

    def ratio(x, y):
        return f"{x / y:11.3f}" if x and y else f"{'-':>11}"

    print()
    print(title)
    print(f"{'case':<30}{'aotriton':>9}{'flash':>9}{'cuDNN':>9}{'aot/cuDNN':>11}{'aot/flash':>11}  check")
    for r in rows:
        tf = r.get(key, {})
        a, fl, cu = tf.get("aotriton"), tf.get("flash"), tf.get("cudnn")
        print(f"{r['case']:<30}{cell(a)}{cell(fl)}{cell(cu)}{ratio(a, cu)}{ratio(a, fl)}  "
              f"{'ok' if r.get('correct') else 'WRONG'}")
    notes = sorted({f"{k}: {v}" for r in rows for k, v in r.get("na", {}).items() if k.endswith(na_key)})
    for n in notes[:6]:
        print(f"  n/a {n}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", required=True, help="path of libaotriton_shim.so")
    ap.add_argument("--json", help="write all numbers here")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--tokens", type=int, default=16384, help="B*S")
    ap.add_argument("--hidden", type=int, default=2048, help="H*D")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--causal", default="0,1", help="comma-separated 0/1")
    ap.add_argument("--passes", default="fwd,bwd", help="fwd, bwd or fwd,bwd")
    ap.add_argument("--layout", default="bhsd", choices=["bhsd", "bshd"])
    ap.add_argument("--warmup", type=int, default=10, help="do_bench warmup, ms")
    ap.add_argument("--rep", type=int, default=40, help="do_bench rep, ms")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.passes = [p for p in args.passes.split(",") if p]
    assert set(args.passes) <= {"fwd", "bwd"} and args.passes, "--passes takes fwd and/or bwd"

    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference must be float32
    torch.backends.cudnn.allow_tf32 = False
    aot = Aotriton(args.shim)
    dtype = DTYPES[args.dtype]
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    timer = f"triton.testing.do_bench(warmup={args.warmup}, rep={args.rep}, return_mode='median')"
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cudnn": torch.backends.cudnn.version(), "aotriton": aot.version, "timer": timer}
    print(f"aotriton {aot.version} | {env['device']} | torch {env['torch']} | triton {env['triton']} "
          f"| cuDNN {env['cudnn']} | {timer}", flush=True)
    rows, failures = [], 0
    started = time.time()
    for d in (int(x) for x in args.head_dims.split(",")):
        h = args.hidden // d
        for s in (int(x) for x in args.seqlens.split(",")):
            b = max(1, args.tokens // s)
            for causal in (bool(int(x)) for x in args.causal.split(",")):
                t0 = time.time()
                try:
                    row = run_shape(aot, args, dtype, b, h, s, d, causal, gen)
                except Exception as e:  # keep going: report the shape as failed
                    row = {"case": f"hd{d:<3} S{s:<5} B{b:<2} H{h:<2} {'causal' if causal else 'full'}",
                           "correct": False, "exception": f"{type(e).__name__}: {e}"}
                    print(f"  {row['case']}: {row['exception']}", flush=True)
                row["wall_s"] = round(time.time() - t0, 1)
                failures += not row["correct"]
                rows.append(row)
                torch.cuda.empty_cache()

    common = f"{args.dtype}, B*S={args.tokens}, H*D={args.hidden}, layout {args.layout}, TFLOP/s (median)"
    if "fwd" in args.passes:
        print_table(f"forward, {common}", rows, "tflops_fwd", "_fwd")
    if "bwd" in args.passes:
        print_table(f"backward, {common}, FLOPs = 2.5 x forward", rows, "tflops_bwd", "_bwd")
    print(f"\n{len(rows)} shapes, {failures} with wrong aotriton outputs, {time.time() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "args": vars(args), "cases": rows}, f, indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
