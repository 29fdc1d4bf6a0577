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

Default shapes: the FlashAttention-3 paper's grid (DESIGN.md "Peers"/"Measuring"): bf16 and fp16,
B*S = 16384 tokens, H*D = 2048, hd 64/128/256 (H = 32/16/8), S in 512..16384 (B = 16384 / S),
causal off and on; plus a GQA row (64 query heads, 8 K/V heads, hd128, causal, B=1, S=16k).
Peers: torch SDPA's FLASH_ATTENTION (FA2) and CUDNN_ATTENTION backends and FlexAttention
(torch.compile'd flex_attention, a block mask for causal), each timed the same way.
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

from aotriton_shim import Aotriton, Dropout, Varlen, packed_view  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PEERS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
GRADS = ("dq", "dk", "dv")
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class Flex:
    """torch FlexAttention (torch.compile'd, block mask for causal) as a peer; absent if torch lacks it."""

    def __init__(self):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        self.create_block_mask = create_block_mask
        self.fn = torch.compile(flex_attention, dynamic=False)
        self.masks = {}

    def __call__(self, q, k, v, causal, sm_scale):
        key = (q.shape[2], k.shape[2], causal)
        if causal and key not in self.masks:
            self.masks[key] = self.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, q.shape[2],
                                                     k.shape[2], device=q.device)
        gqa = q.shape[1] != k.shape[1]
        return self.fn(q, k, v, block_mask=self.masks.get(key) if causal else None, scale=sm_scale, enable_gqa=gqa)


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
        # dK/dV per query head; GQA sums them over each K/V head's group at the end.
        ref.update(dq=torch.empty(q.shape, **f32), dk=torch.empty(q.shape[:3] + (k.shape[3],), **f32),
                   dv=torch.empty(q.shape[:3] + (v.shape[3],), **f32))
    group = h // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) if group > 1 else t for t in (k, v))
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
    if grads and group > 1:
        for t in ("dk", "dv"):
            ref[t] = ref[t].unflatten(1, (h // group, group)).sum(2)
    return ref


def max_err(out, ref):
    """(max |out - ref| ignoring NaNs, NaN count)."""
    diff = (out.float() - ref).abs()
    nan = int(torch.isnan(diff).sum())
    return float(diff.nan_to_num(0.0).max()), nan


def flex_wanted(args, dtype, s):
    """Whether FlexAttention is timed in this cell (``--flex-cells``)."""
    if args.flex_cells == "all":
        return True
    name, _, seqs = args.flex_cells.partition(":")
    return DTYPE_NAMES[dtype] == name and str(s) in seqs.split(",")


def run_shape(aot, args, dtype, b, h, s, d, causal, gen, hk=None):
    """One grid cell; ``hk`` < ``h`` makes it a GQA row (K/V with ``hk`` heads)."""
    passes = args.passes
    hk = hk or h
    shape = (b, h, s, d)
    q, d_o = (randn_nonzero(shape, dtype, gen, args.layout) for _ in range(2))
    k, v = (randn_nonzero((b, hk, s, d), dtype, gen, args.layout) for _ in range(2))
    gqa = dict(enable_gqa=True) if hk != h else {}
    sm_scale = 1.0 / math.sqrt(d)
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    heads = f"H{h:<2}" if hk == h else f"H{h}/{hk}"
    label = f"{DTYPE_NAMES[dtype]} hd{d:<3} S{s:<5} B{b:<2} {heads} {'causal' if causal else 'full'}"
    row = {"case": label, "batch": b, "heads": h, "heads_k": hk, "seqlen": s, "head_dim": d, "causal": causal,
           "dtype": str(dtype).replace("torch.", ""), "layout": args.layout, "deterministic": args.deterministic,
           "flops_fwd": flops, "flops_bwd": 2.5 * flops, "na": {}}
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
        aot_bwd = aot.bind_bwd(q, k, v, o, d_o, lse, delta, dq, dk, dv, sm_scale, causal=causal, align="tl",
                               deterministic=args.deterministic)
        aot_bwd()
        outs["aotriton"].update(dq=dq, dk=dk, dv=dv)

    # Peers: outputs (and gradients) once, for the check; "n/a" when torch refuses. A backend that
    # refuses GQA (enable_gqa) runs on K/V repeated to Hq heads (same FLOPs; noted in the row).
    peer_grad_inputs, peer_kv = {}, {}
    for name, backend in PEERS.items():
        kk, vv, kw = k, v, gqa
        try:
            try:
                with sdpa_kernel([backend]):
                    o_peer = F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, scale=sm_scale, **kw)
            except RuntimeError:
                if not gqa:
                    raise
                kk, vv, kw = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1), {}
                row.setdefault("notes", []).append(f"{name}: K/V repeated to {h} heads (no GQA kernel)")
                with sdpa_kernel([backend]):
                    o_peer = F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, scale=sm_scale)
            outs[name] = {"o": o_peer}
            peer_kv[name] = (kk, vv, kw)
        except RuntimeError as e:
            row["na"][f"{name}_fwd"] = row["na"][f"{name}_bwd"] = str(e).splitlines()[0][:200]
            continue
        if want_bwd:
            try:
                leaves = [t.detach().clone().requires_grad_(True) for t in (q, kk, vv)]
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=sm_scale, **kw)
                    out.backward(d_o, retain_graph=True)
                grads = [leaves[0].grad, leaves[1].grad, leaves[2].grad]
                if kk is not k:  # sum the repeated heads' gradients back to the K/V heads
                    grads[1:] = [g.unflatten(1, (hk, h // hk)).sum(2) for g in grads[1:]]
                outs[name].update(dq=grads[0], dk=grads[1], dv=grads[2])
                peer_grad_inputs[name] = (leaves, out)
            except RuntimeError as e:
                row["na"][f"{name}_bwd"] = str(e).splitlines()[0][:200]
    flex_leaves = None
    if args.flex is not None and flex_wanted(args, dtype, s):
        try:
            outs["flex"] = {"o": args.flex(q, k, v, causal, sm_scale)}
            if want_bwd:
                leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
                out = args.flex(*leaves, causal, sm_scale)
                out.backward(d_o, retain_graph=True)
                outs["flex"].update(dq=leaves[0].grad, dk=leaves[1].grad, dv=leaves[2].grad)
                flex_leaves = (leaves, out)
        except Exception as e:  # noqa: BLE001 -- a peer that cannot run this shape is "n/a"
            row["na"]["flex_fwd"] = row["na"]["flex_bwd"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            outs.pop("flex", None)
    torch.cuda.synchronize()

    if s > args.check_max_seqlen:
        # Timing-only cell: no float32 reference (the suites check correctness); NaN still fails.
        nan = {t: int(torch.isnan(x).sum()) for t, x in outs["aotriton"].items()} | {"lse": int(torch.isnan(lse).sum())}
        row.update(nan=nan, correct=not any(nan.values()), checked=False)
        print(f"  {label}: timing only (S > --check-max-seqlen {args.check_max_seqlen}), NaN {nan}"
              + ("" if row["correct"] else "  WRONG"), flush=True)
        del outs
        ref = None
    else:
        ref = reference(q, k, v, d_o, sm_scale, causal, want_bwd)
    errs = {n: {t: max_err(x, ref[t]) for t, x in tensors.items()} for n, tensors in outs.items()} if ref else {}
    if ref is None:
        return time_shape(aot, args, row, aot_fwd, aot_bwd, q, peer_kv, d_o, sm_scale, causal, peer_grad_inputs,
                          flex_leaves, flops, passes, want_bwd, kv=(k, v))
    lse_err, lse_nan = max_err(lse, ref["lse"])
    lse_bound = 1e-3 * max(1.0, float(ref["lse"].abs().max()))
    # Bounds: k x the worst peer's error + floor (O: k=3, floor 1e-3; gradients: k=5, floor
    # 1e-3 x max(1, max|ref|)); with no peer for a tensor, 2e-2 x max(1, max|ref|).
    bounds, ok = {}, lse_nan == 0 and lse_err <= lse_bound
    for t in ["o"] + (list(GRADS) if want_bwd else []):
        mag = max(1.0, float(ref[t].abs().max()))
        peer = [errs[n][t][0] for n in (*PEERS, "flex") if n in errs and t in errs[n]]
        k_t, floor = (3.0, 1e-3) if t == "o" else (5.0, 1e-3 * mag)
        bounds[t] = k_t * max(peer) + floor if peer else 2e-2 * mag
        err, nan = errs["aotriton"][t]
        ok &= nan == 0 and err <= bounds[t]
    row.update(errors={n: {t: e[0] for t, e in v.items()} for n, v in errs.items()},
               nan={t: e[1] for t, e in errs["aotriton"].items()}, bounds=bounds, err_lse=lse_err,
               lse_bound=lse_bound, nan_lse=lse_nan, correct=bool(ok))
    text = "  ".join(
        f"{t}: aot {errs['aotriton'][t][0]:.2e} "
        + " ".join(f"{n} {errs[n][t][0]:.2e}" for n in (*PEERS, "flex") if n in errs and t in errs[n])
        + f" (bound {bounds[t]:.2e})" for t in bounds)
    nans = {t: n for t, n in row["nan"].items() if n} | ({"lse": lse_nan} if lse_nan else {})
    print(f"  {label}: max|x-ref| {text}  lse {lse_err:.2e} (bound {lse_bound:.2e})"
          + (f"  NaN {nans}" if nans else "") + ("  OK" if ok else "  WRONG"), flush=True)
    flex_ran = "flex" in outs
    del ref, outs
    return time_shape(aot, args, row, aot_fwd, aot_bwd, q, peer_kv, d_o, sm_scale, causal, peer_grad_inputs,
                      flex_leaves if flex_ran else None, flops, passes, want_bwd, flex_fwd=flex_ran, kv=(k, v))


def time_shape(aot, args, row, aot_fwd, aot_bwd, q, peer_kv, d_o, sm_scale, causal, peer_grad_inputs, flex_leaves,
               flops, passes, want_bwd, flex_fwd=None, kv=None):
    """Times every backend of one cell the same way: same inputs, same process, median of events."""
    if flex_fwd is None:
        flex_fwd = flex_leaves is not None

    def bench(fn, grad_to_none=None):
        return triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, grad_to_none=grad_to_none,
                                       return_mode="median")

    def heuristic(fn):
        """`fn` timed with the tuning database switched off: the heuristic's pick."""
        aot.use_database(False)
        try:
            return bench(fn)
        finally:
            aot.use_database(True)

    ms_fwd, ms_bwd = {}, {}
    if "fwd" in passes:
        ms_fwd["aotriton"] = bench(aot_fwd)
        if args.heuristic:
            ms_fwd["heuristic"] = heuristic(aot_fwd)
        for name, backend in PEERS.items():
            if name not in peer_kv:
                continue
            kk, vv, kw = peer_kv[name]
            with sdpa_kernel([backend]):
                ms_fwd[name] = bench(lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, scale=sm_scale,
                                                                            **kw))
        if flex_fwd and kv is not None:
            ms_fwd["flex"] = bench(lambda: args.flex(q, kv[0], kv[1], causal, sm_scale))
    if want_bwd:
        ms_bwd["aotriton"] = bench(aot_bwd)
        if args.heuristic:
            ms_bwd["heuristic"] = heuristic(aot_bwd)
        for name, (leaves, out) in peer_grad_inputs.items():
            with sdpa_kernel([PEERS[name]]):
                ms_bwd[name] = bench(lambda: out.backward(d_o, retain_graph=True), grad_to_none=leaves)
        if flex_leaves is not None:
            leaves, out = flex_leaves
            ms_bwd["flex"] = bench(lambda: out.backward(d_o, retain_graph=True), grad_to_none=leaves)
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
    print(f"{'case':<36}{'aotriton':>9}{'flash':>9}{'cuDNN':>9}{'flex':>9}{'aot/cuDNN':>11}{'aot/flash':>11}"
          f"{'aot/flex':>10}  check")
    for r in rows:
        tf = r.get(key, {})
        a, fl, cu, fx = tf.get("aotriton"), tf.get("flash"), tf.get("cudnn"), tf.get("flex")
        check = ("ok" if r.get("checked", True) else "ok*") if r.get("correct") else "WRONG"
        print(f"{r['case']:<36}{cell(a)}{cell(fl)}{cell(cu)}{cell(fx)}{ratio(a, cu)}{ratio(a, fl)}{ratio(a, fx)[1:]}  "
              f"{check}")
    print("  ok = outputs within bounds of a float32 reference; ok* = timed only (no NaN), S above "
          "--check-max-seqlen")
    for note in sorted({n for r in rows for n in r.get("notes", [])}):
        print(f"  note: {note}")
    notes = sorted({f"{k}: {v}" for r in rows for k, v in r.get("na", {}).items() if k.endswith(na_key)})
    for n in notes[:6]:
        print(f"  n/a {n}")


def print_tuning(rows):
    """--heuristic: the tuning database's speedup per cell (heuristic's time / dispatch's time)."""
    print()
    print("tuning database: speedup over the heuristic (its time / dispatch's time; 1.000 = same kernel or noise)")
    for key in ("ms_fwd", "ms_bwd"):
        cells = [(r["case"], r[key]["heuristic"] / r[key]["aotriton"]) for r in rows
                 if "heuristic" in r.get(key, {}) and r[key].get("aotriton")]
        for case, x in cells:
            print(f"  {key[3:]} {case:<36}{x:7.3f}")
        if cells:
            geo = math.exp(sum(math.log(x) for _, x in cells) / len(cells))
            worst = min(cells, key=lambda c: c[1])
            print(f"  {key[3:]}: geomean {geo:.3f} over {len(cells)} cells, best {max(x for _, x in cells):.3f}, "
                  f"worst {worst[1]:.3f} ({worst[0]})")


def print_targets(rows):
    """The issue's acceptance figures: aotriton / cuDNN geomeans over the bf16 cells with S >= 1k."""
    def ratios(key, hds):
        out = []
        for r in rows:
            tf = r.get(key, {})
            if (r.get("dtype") == "bfloat16" and r.get("head_dim") in hds and r.get("seqlen", 0) >= 1024
                    and r.get("heads_k", r.get("heads")) == r.get("heads") and tf.get("aotriton") and tf.get("cudnn")):
                out.append((tf["aotriton"] / tf["cudnn"], r["case"]))
        return out

    def line(name, rs):
        if not rs:
            return f"  {name}: no cells"
        geo = math.exp(sum(math.log(x) for x, _ in rs) / len(rs))
        worst = min(rs)
        return f"  {name}: geomean {geo:.3f} over {len(rs)} cells, worst {worst[0]:.3f} ({worst[1].strip()})"

    print()
    print("aotriton / cuDNN, bf16, S >= 1k (the Hopper fast path's targets)")
    print(line("forward hd64+hd128 (target >= 1.0, no cell < 0.9)", ratios("tflops_fwd", (64, 128))))
    print(line("forward hd256 (target >= 0.9)", ratios("tflops_fwd", (256, ))))
    print(line("backward hd128 (target >= 1.0, no cell < 0.85)", ratios("tflops_bwd", (128, ))))
    print(line("backward hd64 (target >= 0.95)", ratios("tflops_bwd", (64, ))))
    print(line("backward hd256", ratios("tflops_bwd", (256, ))))


# ---- feature rows: dropout, additive bias, packed variable-length batches ------------------
FEATURE_PEERS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION}


def reference_ex(q, k, v, d_o, sm_scale, bias=None, keep=None, p=0.0):
    """float32 reference (TF32 off), a few heads at a time: O, LSE, dQ, dK, dV and, with a bias,
    dBias (summed over the bias's broadcast dims by autograd). `keep`: B x H x Sq x Sk 0/1 dropout
    mask (aotriton's debug mask); O = (softmax(S) * keep / (1 - p)) V, S = scale q.k + bias."""
    b, h, sq, d = q.shape
    sk = k.shape[2]
    f32 = dict(device=q.device, dtype=torch.float32)
    ref = {"o": torch.empty(q.shape, **f32), "lse": torch.empty((b, h, sq), **f32),
           "dq": torch.empty(q.shape, **f32), "dk": torch.empty(k.shape, **f32), "dv": torch.empty(v.shape, **f32)}
    if bias is not None:
        ref["dbias"] = torch.zeros(bias.shape, **f32)
    hc = max(1, min(h, int(2**31 // (sq * sk * 4 * 4))))
    for bi in range(b):
        for h0 in range(0, h, hc):
            sl = (slice(bi, bi + 1), slice(h0, h0 + hc))
            qf, kf, vf = (t[sl].float().requires_grad_(True) for t in (q, k, v))
            with torch.enable_grad():
                s = torch.matmul(qf, kf.transpose(-1, -2)) * sm_scale
                if bias is not None:
                    bsl = (slice(bi, bi + 1) if bias.shape[0] > 1 else slice(0, 1),
                           slice(h0, h0 + hc) if bias.shape[1] > 1 else slice(0, 1))
                    bf = bias[bsl].float().requires_grad_(True)
                    s = s + bf
                pm = torch.softmax(s, dim=-1)
                if keep is not None:
                    pm = pm * keep[sl] * (1.0 / (1.0 - p))
                o = torch.matmul(pm, vf)
                o.backward(d_o[sl].float())
            with torch.no_grad():
                ref["o"][sl] = o
                ref["lse"][sl] = torch.logsumexp(s, dim=-1)
                ref["dq"][sl], ref["dk"][sl], ref["dv"][sl] = qf.grad, kf.grad, vf.grad
                if bias is not None:
                    ref["dbias"][bsl] += bf.grad
            del s, pm, o, qf, kf, vf
    return ref


def _flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, sm_scale):
    """torch's flash varlen ops: (forward callable, backward callable, outputs)."""
    fwd_op, bwd_op = torch.ops.aten._flash_attention_forward, torch.ops.aten._flash_attention_backward

    def fwd():
        return fwd_op(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, False, False, scale=sm_scale)

    res = fwd()
    out, lse, seed, offset = res[0], res[1], res[2], res[3]

    def bwd(d_o):
        return bwd_op(d_o, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, 0.0, False, seed, offset, scale=sm_scale)

    return fwd, bwd, out


def run_feature(aot, args, kind, gen):
    """One feature row (bf16, hd128, H=16): 'dropout', 'bias-full', 'bias-keypad' or 'varlen'."""
    dtype, d, h = torch.bfloat16, 128, 16
    s = args.feature_seqlen
    b = max(1, args.tokens // s)
    sm_scale = 1.0 / math.sqrt(d)
    bench = lambda fn, grad_to_none=None: triton.testing.do_bench(  # noqa: E731
        fn, warmup=args.warmup, rep=args.rep, grad_to_none=grad_to_none, return_mode="median")
    row = {"kind": kind, "dtype": "bfloat16", "head_dim": d, "heads": h, "na": {}, "ms_fwd": {}, "ms_bwd": {}}
    nanlike = lambda t: torch.full_like(t, float("nan"))  # noqa: E731

    if kind == "varlen":
        # B = 8 sequences of random lengths summing to ~tokens, none longer than the feature S.
        g = torch.Generator().manual_seed(args.seed + 7)
        w = torch.rand(8, generator=g) + 0.25
        lens = [max(1, min(s, int(x))) for x in (w / w.sum() * args.tokens).tolist()]
        total = sum(lens)
        row.update(case=f"varlen B8 T{total} max{max(lens)}", batch=8, seqlen=max(lens), lengths=lens)
        flops = sum(4.0 * h * n * n * d for n in lens)
        qt, kt, vt, dot = (randn_nonzero((1, h, total, d), dtype, gen, "bshd")[0].transpose(0, 1).contiguous()
                           for _ in range(4))  # tokens x H x D
        vl = Varlen.from_lengths(lens, lens)
        view = packed_view
        o = nanlike(qt)
        lse = torch.full((1, h, total), float("nan"), device="cuda")
        delta = torch.full((1, h, total), float("nan"), device="cuda")
        dq, dk, dv = nanlike(qt), nanlike(kt), nanlike(vt)
        aot_fwd = aot.bind_fwd(view(qt), view(kt), view(vt), view(o), lse, sm_scale, varlen=vl)
        aot_bwd = aot.bind_bwd(view(qt), view(kt), view(vt), view(o), view(dot), lse, delta, view(dq), view(dk),
                               view(dv), sm_scale, varlen=vl)
        aot_fwd()
        aot_bwd()
        torch.cuda.synchronize()
        outs = {"aotriton": {"o": o, "dq": dq, "dk": dk, "dv": dv}}
        varlen_peer = None
        try:
            pf, pb, pout = _flash_varlen(qt, kt, vt, vl.cu_seqlens_q, vl.cu_seqlens_k, vl.max_seqlen_q,
                                         vl.max_seqlen_k, sm_scale)
            pdq, pdk, pdv = pb(dot)[:3]
            outs["flash"] = {"o": pout, "dq": pdq, "dk": pdk, "dv": pdv}
            varlen_peer = (pf, pb)
        except (RuntimeError, AttributeError, TypeError) as e:
            row["na"]["flash_fwd"] = row["na"]["flash_bwd"] = f"flash varlen: {str(e).splitlines()[0][:160]}"
        # Per-sequence float32 reference on the packed layout.
        ref = {t: torch.empty(qt.shape if t in ("o", "dq") else kt.shape, device="cuda") for t in ("o", "dq", "dk", "dv")}
        ref["lse"] = torch.empty((h, total), device="cuda")
        starts = [0] + torch.tensor(lens).cumsum(0).tolist()
        for i, n in enumerate(lens):
            sl = slice(starts[i], starts[i] + n)
            seq = lambda t: t[sl].transpose(0, 1).unsqueeze(0)  # noqa: E731
            r = reference_ex(seq(qt), seq(kt), seq(vt), seq(dot), sm_scale)
            for t in ("o", "dq", "dk", "dv"):
                ref[t][sl] = r[t][0].transpose(0, 1)
            ref["lse"][:, sl] = r["lse"][0]
        got_lse = lse[0]
    else:
        shape = (b, h, s, d)
        q, k, v, d_o = (randn_nonzero(shape, dtype, gen, "bhsd") for _ in range(4))
        flops = 4.0 * b * h * s * s * d
        bias = keep = dropout = None
        p = 0.0
        if kind == "dropout":
            p = args.dropout_p
            dropout = Dropout.make(p, seed=1234 + args.seed, offset=4096)
            row.update(case=f"dropout p={p} S{s} B{b}", p=p)
        elif kind == "bias-full":
            bias = randn_nonzero((b, h, s, s), dtype, gen, "bhsd")
            row.update(case=f"bias [B,H,S,S] S{s} B{b}")
        else:
            bias = randn_nonzero((b, 1, 1, s), dtype, gen, "bhsd")
            bias[..., s - s // 8:] = -1e4  # key padding: the last eighth of the keys masked off
            row.update(case=f"bias [B,1,1,S] S{s} B{b}")
        row.update(batch=b, seqlen=s)
        o = nanlike(q)
        lse = torch.full((b, h, s), float("nan"), device="cuda")
        delta = torch.full((b, h, s), float("nan"), device="cuda")
        dq, dk, dv = nanlike(q), nanlike(k), nanlike(v)
        dbias = nanlike(bias) if bias is not None else None
        aot_fwd = aot.bind_fwd(q, k, v, o, lse, sm_scale, bias=bias, dropout=dropout)
        aot_bwd = aot.bind_bwd(q, k, v, o, d_o, lse, delta, dq, dk, dv, sm_scale, bias=bias, dropout=dropout)
        aot_bwd_db = (aot.bind_bwd(q, k, v, o, d_o, lse, delta, dq, dk, dv, sm_scale, bias=bias, dbias=dbias)
                      if bias is not None else None)
        aot_fwd()
        (aot_bwd_db or aot_bwd)()
        torch.cuda.synchronize()
        outs = {"aotriton": {"o": o, "dq": dq, "dk": dk, "dv": dv}}
        if dbias is not None:
            outs["aotriton"]["dbias"] = dbias
        if dropout is not None:
            keep = aot.debug_dropout_mask((b, h, s, s), dropout)
            row["kept"] = float(keep.mean())
        # Peers: SDPA backends with the same dropout p / attn_mask. Their dropout masks are their
        # own, so with dropout their outputs are not compared (timing only).
        peers = {}
        names = ("flash", "cudnn") if kind == "dropout" else ("efficient", "cudnn")
        for name in names:
            backend = FEATURE_PEERS[name]
            try:
                leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(*leaves, attn_mask=bias, dropout_p=p, scale=sm_scale)
                    out.backward(d_o, retain_graph=True)
                torch.cuda.synchronize()
                peers[name] = (leaves, out)
                if kind != "dropout":
                    outs[name] = {"o": out.detach(), "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad}
            except RuntimeError as e:
                row["na"][f"{name}_fwd"] = row["na"][f"{name}_bwd"] = str(e).splitlines()[0][:200]
        ref = reference_ex(q, k, v, d_o, sm_scale, bias=bias, keep=keep, p=p)
        got_lse = lse

    # Check: k x the worst peer's error + floor where a peer computed the same thing, else
    # 2e-2 x max(1, max|ref|) (dropout rows, dBias).
    errs = {n: {t: max_err(x, ref[t]) for t, x in tensors.items()} for n, tensors in outs.items()}
    lse_err, lse_nan = max_err(got_lse, ref["lse"])
    ok = lse_nan == 0 and lse_err <= 1e-3 * max(1.0, float(ref["lse"].abs().max()))
    bounds = {}
    for t in outs["aotriton"]:
        mag = max(1.0, float(ref[t].abs().max()))
        peer_errs = [errs[n][t][0] for n in errs if n != "aotriton" and t in errs[n]]
        k_t, floor = (3.0, 1e-3) if t == "o" else (5.0, 1e-3 * mag)
        bounds[t] = k_t * max(peer_errs) + floor if peer_errs else 2e-2 * mag
        err, nan = errs["aotriton"][t]
        ok &= nan == 0 and err <= bounds[t]
    text = "  ".join(f"{t}: aot {errs['aotriton'][t][0]:.2e}"
                     + "".join(f" {n} {errs[n][t][0]:.2e}" for n in errs if n != "aotriton" and t in errs[n])
                     + f" (bound {bounds[t]:.2e})" for t in bounds)
    row.update(errors={n: {t: e[0] for t, e in v.items()} for n, v in errs.items()}, bounds=bounds, err_lse=lse_err,
               correct=bool(ok), flops_fwd=flops, flops_bwd=2.5 * flops)
    print(f"  {row['case']}: max|x-ref| {text}  lse {lse_err:.2e}" + ("  OK" if ok else "  WRONG"), flush=True)
    del ref, outs

    # Timing.
    row["ms_fwd"]["aotriton"] = bench(aot_fwd)
    row["ms_bwd"]["aotriton"] = bench(aot_bwd)
    if kind == "varlen":
        if varlen_peer is not None:
            row["ms_fwd"]["flash"] = bench(varlen_peer[0])
            row["ms_bwd"]["flash"] = bench(lambda: varlen_peer[1](dot))
    else:
        if aot_bwd_db is not None:
            row["ms_bwd_dbias_aotriton"] = bench(aot_bwd_db)
        for name, (leaves, out) in peers.items():
            with sdpa_kernel([FEATURE_PEERS[name]]):
                row["ms_fwd"][name] = bench(
                    lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p, scale=sm_scale))
                row["ms_bwd"][name] = bench(lambda: out.backward(d_o, retain_graph=True), grad_to_none=leaves)
    row["tflops_fwd"] = {n: flops / (t * 1e-3) / 1e12 for n, t in row["ms_fwd"].items()}
    row["tflops_bwd"] = {n: 2.5 * flops / (t * 1e-3) / 1e12 for n, t in row["ms_bwd"].items()}
    return row


def print_feature_table(rows):
    def cell(x):
        return f"{x:9.1f}" if x is not None else f"{'n/a':>9}"

    print()
    print("features (bf16, hd128, H=16), TF/s fwd | bwd (median); peers: SDPA backends with the same dropout p / "
          "attn_mask, torch flash varlen ops; aot+dB = aotriton backward with dBias")
    print(f"{'case':<30}{'pass':>5}{'aotriton':>9}{'flash':>9}{'cuDNN':>9}{'mem-eff':>9}{'aot/best':>10}"
          f"{'aot+dB':>9}  check")
    for r in rows:
        for pas, key in (("fwd", "tflops_fwd"), ("bwd", "tflops_bwd")):
            tf = r.get(key, {})
            a = tf.get("aotriton")
            peers = [tf.get(n) for n in ("flash", "cudnn", "efficient") if tf.get(n)]
            ratio = f"{a / max(peers):10.3f}" if a and peers else f"{'-':>10}"
            db = ""
            if pas == "bwd" and r.get("ms_bwd_dbias_aotriton"):
                db = f"{2.5 * r['flops_fwd'] / (r['ms_bwd_dbias_aotriton'] * 1e-3) / 1e12:9.1f}"
            print(f"{r['case']:<30}{pas:>5}{cell(a)}{cell(tf.get('flash'))}{cell(tf.get('cudnn'))}"
                  f"{cell(tf.get('efficient'))}{ratio}{db:>9}  {'ok' if r.get('correct') else 'WRONG'}")
    notes = sorted({f"{r['case'].split()[0]} {k}: {v}" for r in rows for k, v in r.get("na", {}).items()})
    for n in notes[:8]:
        print(f"  n/a {n}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", required=True, help="path of libaotriton_shim.so")
    ap.add_argument("--json", help="write all numbers here")
    ap.add_argument("--dtypes", default="bf16,fp16", help="comma-separated: bf16, fp16")
    ap.add_argument("--backend", default="auto", choices=["auto", "portable", "gluon"],
                    help="aotriton backend (auto = the dispatch rule; the others forced)")
    ap.add_argument("--no-flex", dest="flex", action="store_false", help="skip the FlexAttention peer")
    ap.add_argument("--flex-cells", default="bf16:1024,4096,16384",
                    help="where FlexAttention runs, DTYPE:S,S,... (torch.compile builds one kernel per shape, "
                         "10+ s each); 'all' = every cell")
    ap.add_argument("--gqa", default="64,8,128,16384", help="GQA row Hq,Hk,D,S (B=1, causal); '' = none")
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--tokens", type=int, default=16384, help="B*S")
    ap.add_argument("--hidden", type=int, default=2048, help="H*D")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--causal", default="0,1", help="comma-separated 0/1")
    ap.add_argument("--passes", default="fwd,bwd", help="fwd, bwd or fwd,bwd")
    ap.add_argument("--layout", default="bhsd", choices=["bhsd", "bshd"])
    ap.add_argument("--deterministic", action="store_true",
                    help="the grid's aotriton backward in the deterministic mode (bitwise-reproducible dQ)")
    ap.add_argument("--warmup", type=int, default=10, help="do_bench warmup, ms")
    ap.add_argument("--rep", type=int, default=40, help="do_bench rep, ms")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heuristic", action="store_true",
                    help="also time aotriton with its tuning database switched off (tuning::use_database)")
    ap.add_argument("--check-max-seqlen", type=int, default=4096,
                    help="cells with a longer S are timed without the float32 reference check")
    ap.add_argument("--features", default="dropout,bias-full,bias-keypad,varlen",
                    help="feature rows (bf16 hd128 H16): dropout, bias-full, bias-keypad, varlen; '' = none")
    ap.add_argument("--feature-seqlen", type=int, default=4096, help="S of the feature rows (max S for varlen)")
    ap.add_argument("--dropout-p", type=float, default=0.1)
    args = ap.parse_args()
    args.passes = [p for p in args.passes.split(",") if p]
    assert set(args.passes) <= {"fwd", "bwd"} and args.passes, "--passes takes fwd and/or bwd"

    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference must be float32
    torch.backends.cudnn.allow_tf32 = False
    aot = Aotriton(args.shim, backend=args.backend)
    dtypes = [DTYPES[x] for x in args.dtypes.split(",") if x]
    if args.flex:
        try:
            args.flex = Flex()
        except ImportError as e:
            print(f"FlexAttention unavailable: {e}")
            args.flex = None
    else:
        args.flex = None
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    timer = f"triton.testing.do_bench(warmup={args.warmup}, rep={args.rep}, return_mode='median')"
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cudnn": torch.backends.cudnn.version(), "aotriton": aot.version, "timer": timer}
    print(f"aotriton {aot.version} | {env['device']} | torch {env['torch']} | triton {env['triton']} "
          f"| cuDNN {env['cudnn']} | {timer}", flush=True)
    rows, failures = [], 0
    started = time.time()
    cells = [(dtype, d, args.hidden // d, s, max(1, args.tokens // s), causal, None)
             for dtype in dtypes for d in (int(x) for x in args.head_dims.split(","))
             for s in (int(x) for x in args.seqlens.split(",")) for causal in (bool(int(x)) for x in args.causal.split(","))]
    if args.gqa:
        hq, hk, d, s = (int(x) for x in args.gqa.split(","))
        cells.append((dtypes[0], d, hq, s, 1, True, hk))
    for dtype, d, h, s, b, causal, hk in cells:
        t0 = time.time()
        try:
            row = run_shape(aot, args, dtype, b, h, s, d, causal, gen, hk=hk)
        except Exception as e:  # keep going: report the shape as failed
            row = {"case": f"{DTYPE_NAMES[dtype]} hd{d:<3} S{s:<5} B{b:<2} H{h:<2} {'causal' if causal else 'full'}",
                   "correct": False, "exception": f"{type(e).__name__}: {e}"}
            print(f"  {row['case']}: {row['exception']}", flush=True)
        row["wall_s"] = round(time.time() - t0, 1)
        failures += not row["correct"]
        rows.append(row)
        torch.cuda.empty_cache()

    feature_rows = []
    for kind in (x for x in args.features.split(",") if x):
        t0 = time.time()
        try:
            row = run_feature(aot, args, kind, gen)
        except Exception as e:  # keep going: report the row as failed
            row = {"case": kind, "kind": kind, "correct": False, "exception": f"{type(e).__name__}: {e}"}
            print(f"  {kind}: {row['exception']}", flush=True)
        row["wall_s"] = round(time.time() - t0, 1)
        failures += not row["correct"]
        feature_rows.append(row)
        torch.cuda.empty_cache()

    common = (f"{args.dtypes}, B*S={args.tokens}, H*D={args.hidden}, layout {args.layout}, aotriton backend "
              f"{args.backend}, TFLOP/s (median)")
    if "fwd" in args.passes:
        print_table(f"forward, {common}", rows, "tflops_fwd", "_fwd")
    if "bwd" in args.passes:
        print_table(f"backward, {common}, FLOPs = 2.5 x forward", rows, "tflops_bwd", "_bwd")
    print_targets(rows)
    if args.heuristic:
        print_tuning(rows)
    if feature_rows:
        print_feature_table(feature_rows)
    print(f"\n{len(rows) + len(feature_rows)} shapes, {failures} with wrong aotriton outputs, "
          f"{time.time() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "args": {k: v for k, v in vars(args).items() if k != "flex"}, "cases": rows,
                       "features": feature_rows}, f, indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
