#!/usr/bin/env python3
"""Attention through the PyTorch binding, where users call it: aotriton.torch.flash_attention with
autograd, and torch's own F.scaled_dot_product_attention with aotriton activated as torch's flash
implementation ("registered": torch.nn.attention.activate_flash_attention_impl("aotriton"),
activated only around its own timings), vs torch SDPA (cuDNN and FA2 backends) on the same
tensors, same process, same timer. "kernel-level": the binding's two ops called directly, without
autograd (the figure the user path is held to: the script prints user/kernel per row).

Each implementation is timed twice with triton.testing.do_bench (CUDA events, median):
  fwd        the training forward: inputs require grad, so autograd records the graph
             (aotriton: its custom op and autograd.Function; torch: SDPA's);
  fwd+bwd    out = attention(q, k, v); out.backward(dO), with q.grad = k.grad = v.grad = None
             before every call (do_bench's grad_to_none, outside the timed region).
Both layouts users have: "bhsd" tensors (B, H, S, D) contiguous, and "bshd" tensors (B, S, H, D)
contiguous (flash-attn's and most models' layout) passed as aotriton's layout="bshd" and to SDPA
as the (B, H, S, D) transposed views a model passes. Before timing, each shape's aotriton O and
dQ/dK/dV are compared with cuDNN's (max abs difference printed; a difference above 5e-2 x
max|ref| marks the row WRONG and the exit status 1).
FLOPs: forward 4*B*Hq*Sq*Sk*D (x0.5 causal); forward + backward 3.5x that.

--grid fa3: FlashAttention-3's benchmark grid instead (bf16, B*S = 16k tokens, H*D = 2048, head
dims 64/128/256, S 512..16k, causal and not). --grid gqa: the GQA rows (Hq/Hk 28/4, 32/8, 64/8, hd128,
causal, S 2k..16k, B*S = 16k).

--dropout P: every call with dropout probability P (aotriton's dropout_p, SDPA's dropout_p; cuDNN and FA2
draw other random numbers, so the agreement check is skipped and only the times compare).

--varlen: instead, the packed batch of bench/packed_batch.py (16 sequences, ~42k tokens, Hq/Hk 32/8,
hd128, bf16; (tokens, H, D) tensors) through aotriton.torch.flash_attn_varlen with autograd, beside
the fixed-length aotriton call on the same token count (B 16 of the mean length, (B, S, H, D)
tensors) and torch's varlen_attn; FLOPs summed per sequence.

    PYTHONPATH=bindings/torch/python:bench python3 bench/bench_torch.py [--json out.json] [--quick]
        [--grid fa3 | --varlen] [--dropout P] [--only PREFIX]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

import aotriton.torch as aot
import packed_batch

PEERS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}
# (name, B, Hq, Hk, S, D, causal)
SHAPES = [
    ("hd64 S4096", 4, 32, 32, 4096, 64, False),
    ("hd64 S4096 causal", 4, 32, 32, 4096, 64, True),
    ("hd128 S4096", 4, 16, 16, 4096, 128, False),
    ("hd128 S4096 causal", 4, 16, 16, 4096, 128, True),
    ("hd128 S16384 causal", 1, 16, 16, 16384, 128, True),
    ("GQA 64/8 hd128 S16384 causal", 1, 64, 8, 16384, 128, True),
]
QUICK = {"hd128 S4096", "hd128 S4096 causal"}


def fa3_grid():
    """FlashAttention-3's benchmark grid: 16k tokens per batch, hidden 2048."""
    shapes = []
    for d in (64, 128, 256):
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            for causal in (False, True):
                h = 2048 // d
                shapes.append((f"hd{d} S{s}" + (" causal" if causal else ""), 16384 // s, h, h, s, d, causal))
    return shapes


def gqa_grid():
    """The training-speed issue's GQA rows: Hq/Hk 28/4 (Qwen2-7B), 32/8, 64/8 at hd128, causal, S 2k-16k, 16k tokens."""
    return [(f"GQA {hq}/{hk} hd128 S{s} causal", 16384 // s, hq, hk, s, 128, True)
            for hq, hk in ((28, 4), (32, 8), (64, 8)) for s in (2048, 4096, 8192, 16384)]


GRIDS = {"default": lambda: SHAPES, "fa3": fa3_grid, "gqa": gqa_grid}


def make(b, h, s, d, layout, dtype, gen):
    """A (B, H, S, D) view of `layout`-contiguous random values (never zeros), requiring grad."""
    shape = (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
    t = torch.randn(shape, dtype=torch.float32, device="cuda", generator=gen).add_(0.01).to(dtype)
    t.requires_grad_(True)
    return t


#: Dropout probability of every timed call (--dropout).
DROPOUT_P = 0.0


def call_aotriton(q, k, v, causal, layout):
    return aot.flash_attention(q, k, v, causal=causal, layout=layout, dropout_p=DROPOUT_P)


class _KernelLevel:
    """The binding's two ops called directly, without autograd: the kernel-level figure the user
    path is compared with (labelled "kernel" in the tables). ``backward(d_o)`` runs the backward op
    on the last forward's out and LSE, as autograd would."""

    def __init__(self, q, k, v, causal, layout):
        self.args = [t.transpose(1, 2) if layout == "bshd" else t for t in (q, k, v)]
        self.causal = causal
        self.layout = layout

    def forward(self):
        q, k, v = (t.detach() for t in self.args)
        scale = q.size(-1) ** -0.5
        self.out, self.lse, self.rng = torch.ops.aotriton.fwd(q, k, v, None, None, None, 0, 0, scale, self.causal,
                                                              -1, -1, 0, DROPOUT_P, False, False, None)
        return self

    def backward(self, d_o):
        q, k, v = (t.detach() for t in self.args)
        if self.layout == "bshd":
            d_o = d_o.transpose(1, 2)
        torch.ops.aotriton.bwd(d_o, q, k, v, self.out, self.lse, None, False, None, None, 0, 0, q.size(-1) ** -0.5,
                               self.causal, -1, -1, 0, DROPOUT_P, self.rng, False, False, False, None)


def call_kernel_level(q, k, v, causal, layout):
    return _KernelLevel(q, k, v, causal, layout).forward()


def call_sdpa(backend):
    def call(q, k, v, causal, layout):
        if layout == "bshd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.size(1) != k.size(1),
                                                 dropout_p=DROPOUT_P)
        return out.transpose(1, 2) if layout == "bshd" else out
    return call


def time_pair(fn, q, k, v, d_o, causal, layout, warmup, rep):
    fwd = triton.testing.do_bench(lambda: fn(q, k, v, causal, layout), warmup=warmup, rep=rep, return_mode="median")
    both = triton.testing.do_bench(lambda: fn(q, k, v, causal, layout).backward(d_o), warmup=warmup, rep=rep,
                                   grad_to_none=[q, k, v], return_mode="median")
    return fwd, both


def run(args):
    dtype = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(1234)
    impls = {"aotriton": call_aotriton, "kernel": call_kernel_level,
             **{name: call_sdpa(b) for name, b in PEERS.items()}}
    if hasattr(torch.nn.attention, "activate_flash_attention_impl"):
        impls["registered"] = call_sdpa(SDPBackend.FLASH_ATTENTION)  # timed with aotriton activated
    rows, wrong = [], 0
    for name, b, hq, hk, s, d, causal in GRIDS[args.grid]():
        if (args.quick and name not in QUICK) or (args.only and not name.startswith(args.only)):
            continue
        for layout in ("bhsd", "bshd"):
            q = make(b, hq, s, d, layout, dtype, gen)
            k = make(b, hk, s, d, layout, dtype, gen)
            v = make(b, hk, s, d, layout, dtype, gen)
            d_o = make(b, hq, s, d, layout, dtype, gen).detach()
            flops = 4 * b * hq * s * s * d * (0.5 if causal else 1.0)
            row = {"shape": name, "layout": layout, "B": b, "Hq": hq, "Hk": hk, "S": s, "D": d, "causal": causal}
            # Agreement with cuDNN first (a yardstick, not the correctness test: test/torch does that).
            outs = {}
            for impl in ("aotriton", "cudnn"):
                try:
                    out = impls[impl](q, k, v, causal, layout)
                    out.backward(d_o)
                    outs[impl] = [out.detach().float()] + [t.grad.detach().float() for t in (q, k, v)]
                except RuntimeError as e:
                    outs[impl] = None
                    row[f"{impl}_error"] = str(e).splitlines()[0][:200]
                for t in (q, k, v):
                    t.grad = None
            if outs.get("aotriton") and outs.get("cudnn") and not DROPOUT_P:
                diffs = [(a - r).abs().max().item() / max(r.abs().max().item(), 1e-6)
                         for a, r in zip(outs["aotriton"], outs["cudnn"])]
                row["rel_diff_vs_cudnn"] = max(diffs)
                if max(diffs) > 5e-2:
                    row["wrong"] = True
                    wrong += 1
            for impl, fn in impls.items():
                if impl == "registered":
                    aot.activate()
                try:
                    fwd, both = time_pair(fn, q, k, v, d_o, causal, layout, args.warmup, args.rep)
                except RuntimeError as e:
                    row[f"{impl}_error"] = str(e).splitlines()[0][:200]
                    continue
                finally:
                    if impl == "registered":
                        aot.deactivate()
                row[f"{impl}_fwd_ms"], row[f"{impl}_fwdbwd_ms"] = fwd, both
                row[f"{impl}_fwd_tflops"] = flops / fwd / 1e9
                row[f"{impl}_fwdbwd_tflops"] = 3.5 * flops / both / 1e9
            rows.append(row)
            print_row(row, flush=True)
            del q, k, v, d_o, outs
            torch.cuda.empty_cache()
    return rows, wrong


def run_varlen(args):
    """The packed-batch rows (--varlen): fwd and fwd+bwd TFLOP/s of aotriton's varlen call, the
    fixed-length call on the same tokens and torch's varlen_attn, causal and not."""
    dtype, gen = torch.bfloat16, torch.Generator(device="cuda").manual_seed(1234)
    hq, hk, d = packed_batch.HEADS_Q, packed_batch.HEADS_K, packed_batch.HEAD_DIM
    lens = packed_batch.lengths()
    total, max_len = sum(lens), max(lens)
    cu = torch.tensor(packed_batch.offsets(lens), dtype=torch.int32, device="cuda")
    b_fixed, s_fixed = len(lens), total // len(lens)

    def packed(h):
        return (torch.randn((total, h, d), device="cuda", generator=gen).add_(0.01).to(dtype)
                .requires_grad_(True))

    q, k, v = packed(hq), packed(hk), packed(hk)
    d_o = torch.randn((total, hq, d), device="cuda", generator=gen).to(dtype)
    qf, kf, vf = (make(b_fixed, h, s_fixed, d, "bshd", dtype, gen) for h in (hq, hk, hk))
    d_of = make(b_fixed, hq, s_fixed, d, "bshd", dtype, gen).detach()
    print(f"packed batch: {len(lens)} sequences, {total} tokens (lengths {min(lens)}..{max_len}), Hq/Hk {hq}/{hk}, "
          f"hd{d}, bf16; fixed length: B{b_fixed} S{s_fixed} (B, S, H, D)")
    print("| mask | impl | fwd TFLOP/s | fwd+bwd TFLOP/s |")
    print("|---|---|---|---|")
    rows = []
    for causal in (False, True):
        row = {"shape": f"varlen {len(lens)} seqs T{total}", "causal": causal, "tokens": total}
        flops = packed_batch.flops(lens, hq, d, causal)
        flops_fixed = packed_batch.flops([s_fixed] * b_fixed, hq, d, causal)
        impls = {
            "aotriton": (lambda: aot.flash_attn_varlen(q, k, v, cu, cu, max_len, max_len, causal=causal),
                         (q, k, v), flops),
            "aotriton_fixed": (lambda: aot.flash_attention(qf, kf, vf, causal=causal, layout="bshd"), (qf, kf, vf),
                               flops_fixed),
        }
        peer = packed_batch.torch_varlen_attn(q, k, v, cu, max_len, causal)
        if peer is not None:
            impls["varlen_attn"] = (peer, (q, k, v), flops)
        for impl, (fn, leaves, fl) in impls.items():
            grad = d_of if impl == "aotriton_fixed" else d_o
            try:
                fwd = triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")
                both = triton.testing.do_bench(lambda: fn().backward(grad), warmup=args.warmup, rep=args.rep,
                                               grad_to_none=list(leaves), return_mode="median")
            except RuntimeError as e:
                row[f"{impl}_error"] = str(e).splitlines()[0][:200]
                print(f"| {'causal' if causal else 'full'} | {impl} | error: {row[f'{impl}_error']} | |")
                continue
            row[f"{impl}_fwd_tflops"], row[f"{impl}_fwdbwd_tflops"] = fl / fwd / 1e9, 3.5 * fl / both / 1e9
            print(f"| {'causal' if causal else 'full'} | {impl} | {row[f'{impl}_fwd_tflops']:.1f} | "
                  f"{row[f'{impl}_fwdbwd_tflops']:.1f} |", flush=True)
        for mode in ("fwd", "fwdbwd"):
            ours = row.get(f"aotriton_{mode}_tflops")
            for ref in ("aotriton_fixed", "varlen_attn"):
                other = row.get(f"{ref}_{mode}_tflops")
                if ours and other:
                    row[f"{mode}_over_{ref}"] = ours / other
                    print(f"bench-torch varlen {'causal' if causal else 'full'} {mode}: aotriton / {ref} "
                          f"{ours / other:.3f}")
        rows.append(row)
    return rows


def cell(row, impl, mode):
    x = row.get(f"{impl}_{mode}_tflops")
    if x is None:
        return "n/a"
    if impl in ("aotriton", "registered"):
        peer = row.get(f"cudnn_{mode}_tflops")
        return f"{x:.1f} ({x / peer:.2f}x)" if peer else f"{x:.1f}"
    return f"{x:.1f}"


def print_row(row, flush=False):
    mark = "  WRONG" if row.get("wrong") else ""
    diff = row.get("rel_diff_vs_cudnn")
    print(f"| {row['shape']} | {row['layout']} | {cell(row, 'aotriton', 'fwd')} | {cell(row, 'registered', 'fwd')} | "
          f"{cell(row, 'cudnn', 'fwd')} | {cell(row, 'fa2', 'fwd')} | {cell(row, 'aotriton', 'fwdbwd')} | "
          f"{cell(row, 'registered', 'fwdbwd')} | {cell(row, 'kernel', 'fwdbwd')} | {cell(row, 'cudnn', 'fwdbwd')} | "
          f"{cell(row, 'fa2', 'fwdbwd')} | {'' if diff is None else f'{diff:.1e}'}{mark} |", flush=flush)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--quick", action="store_true", help="only " + ", ".join(sorted(QUICK)))
    ap.add_argument("--only", help="rows whose name starts with this (e.g. 'hd256 ' with --grid fa3)")
    ap.add_argument("--warmup", type=int, default=25)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--grid", choices=sorted(GRIDS), default="default",
                    help="fa3: FlashAttention-3's benchmark grid (36 shapes x 2 layouts); gqa: the GQA rows")
    ap.add_argument("--varlen", action="store_true", help="the packed-batch rows instead (bench/packed_batch.py)")
    ap.add_argument("--dropout", type=float, default=0.0, help="dropout probability of every call (default 0)")
    args = ap.parse_args()
    global DROPOUT_P
    DROPOUT_P = args.dropout
    if args.varlen:
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, aotriton {aot.version()}")
        rows = run_varlen(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, aotriton {aot.version()}, bf16; "
          "TFLOP/s (aotriton / cuDNN in parentheses); fwd: training forward, fwd+bwd: with backward"
          + (f"; dropout p = {DROPOUT_P} in every call" if DROPOUT_P else ""))
    print("| shape | layout | fwd aotriton | fwd registered | fwd cuDNN | fwd FA2 | fwd+bwd aotriton | "
          "fwd+bwd registered | fwd+bwd kernel-level | fwd+bwd cuDNN | fwd+bwd FA2 | rel. diff vs cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows, wrong = run(args)
    for impl in ("aotriton", "registered"):
        for mode in ("fwd", "fwdbwd"):
            ratios = [r[f"{impl}_{mode}_tflops"] / r[f"cudnn_{mode}_tflops"] for r in rows
                      if r.get(f"{impl}_{mode}_tflops") and r.get(f"cudnn_{mode}_tflops")]
            if ratios:
                geo = 1.0
                for x in ratios:
                    geo *= x
                geo **= 1 / len(ratios)
                print(f"bench-torch {impl} {mode}: /cuDNN geomean {geo:.3f} over {len(ratios)} rows, "
                      f"worst {min(ratios):.3f}")
    # The user path against the kernel level (the binding's ops without autograd, same tensors).
    for r in rows:
        user, kernel = r.get("aotriton_fwdbwd_ms"), r.get("kernel_fwdbwd_ms")
        if user and kernel:
            r["user_over_kernel_fwdbwd"] = user / kernel
            flag = "  <- issue 16's 5 % cells" if r["D"] == 128 and r["S"] in (1024, 4096) else ""
            print(f"user/kernel fwd+bwd time {r['shape']} {r['layout']}: {user / kernel:.3f}{flag}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"bench-torch: {len(rows)} rows, {wrong} with outputs far from cuDNN's")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
