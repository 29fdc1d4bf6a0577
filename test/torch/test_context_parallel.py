#!/usr/bin/env python3
"""torch's context parallelism over NCCL with aotriton registered as torch's flash attention.

A torchrun program (issue 21): every rank holds the same random inputs, torch's
``context_parallel`` shards the sequence over a ``(world,)`` mesh, rotates K/V over NCCL and
calls the SDPA flash ops per step (forward with ``is_causal`` true, false or the step skipped;
backward with the merged out and LSE) -- those ops are aotriton's. For causal and full attention,
both rotate methods (all-gather, all-to-all) and the load balancer on and off, the unsharded out
and dq/dk/dv are compared on every rank with a float64 reference of the whole sequence, and every
rank must have run aotriton's forward and backward. Then a transformers Llama trained a few steps
with and without context parallelism (``test_training``). World size 1 runs the same code path on
one GPU.

    PYTHONPATH=bindings/torch/python:test/torch torchrun --nproc_per_node=2 test/torch/test_context_parallel.py
    ... --bench    also times forward + backward per GPU at 32k-256k tokens, beside cuDNN as torch's backend

Keep NCCL's multicast off (NCCL_NVLS_ENABLE=0, as the device notes say); run.sh sets it.
Last line (rank 0): ``torch-context_parallel: N passed, M failed``.
"""
import argparse
import datetime
import importlib.util
import math
import os
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental import _attention as cp_attention
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness import (Runner, attention_ref, count_ops, cp_cases, cp_configure, cp_forward_backward,
                     cp_llama_training, max_err, visible)

import aotriton.torch as A

R = Runner("context_parallel")
FLASH = [SDPBackend.FLASH_ATTENTION]


COUNT = count_ops(A)  # proves each rank's steps reached aotriton's kernels


def all_ranks(flag):
    """Whether `flag` holds on every rank."""
    t = torch.tensor([1 if flag else 0], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def run_cp(mesh, q, k, v, g, causal):
    """Forward + backward of SDPA under context_parallel; the unsharded (out, dq, dk, dv)."""
    return cp_attention.context_parallel_unshard(mesh, cp_forward_backward(mesh, q, k, v, g, causal), [2, 2, 2, 2])


def test_correctness(mesh, world):
    b, h, s, d = 2, 8, 1024 * world, 128
    for rotate, balance, causal in cp_cases():
        cp_configure(rotate, balance)
        gen = torch.Generator(device="cuda").manual_seed(1234)  # the same inputs on every rank
        q, k, v, g = (torch.randn(b, h, s, d, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(4))
        exact = [t.double() for t in (q, k, v, g)]
        mark = COUNT.mark()
        got = run_cp(mesh, q, k, v, g, causal)
        calls = COUNT.since(mark)
        leaves = [t.clone().requires_grad_() for t in exact[:3]]
        ref = attention_ref(*leaves, 1 / math.sqrt(d), vis=visible(s, s, causal=causal))
        want = [ref] + list(torch.autograd.grad(ref, leaves, exact[3]))
        errs = [max_err(a, w) for a, w in zip(got, want)]
        # Bounds of test_registered.py's one-process case: bf16 outputs and gradients.
        ok = calls[0] >= 1 and calls[1] >= 1 and errs[0] <= 2e-2 and max(errs[1:]) <= 6e-2
        R.check(f"world {world} rotate {rotate} load-balance {balance} {'causal' if causal else 'full'} "
                f"B{b} H{h} S{s} D{d}", all_ranks(ok),
                f"rank {dist.get_rank()}: aotriton calls fwd/bwd {calls}, errs out/dq/dk/dv "
                f"{[f'{e:.2e}' for e in errs]}")


def test_training(mesh, world, steps=3):
    """A transformers Llama (random init; 2 layers, hidden 512, 8 heads over 2 KV heads of dim 64,
    bf16) trained `steps` SGD steps with torch's context_parallel over the mesh and as one model of
    the whole sequence on this GPU, aotriton's kernels in both (harness.cp_llama_training): every
    step's loss and the first step's gradients agree within bf16's spread."""
    from transformers import LlamaConfig
    batch, seq = 2, 1024 * world
    cfg = LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=seq,
                      attention_dropout=0.0, tie_word_embeddings=False, attn_implementation="sdpa")
    ok, detail = cp_llama_training(mesh, cfg, batch, steps, COUNT, "cuda", torch.bfloat16,
                                   step_context=lambda: sdpa_kernel(FLASH))
    R.check(f"world {world} Llama training, {steps} steps, B{batch} S{seq}: context parallel vs one GPU", all_ranks(ok),
            f"rank {dist.get_rank()}: {detail}")


def median_ms(fn, reps=10):
    times = []
    for _ in range(3):
        fn()
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench(mesh, world):
    """Forward + backward per step, bf16, B1 H16 D128 causal, 32k-256k tokens over the mesh: tokens/s
    and attention TFLOP/s per GPU (4·S²·H·D·2.5 / 2 for causal, divided by the world), aotriton beside
    cuDNN as torch's backend (aotriton deactivated for it)."""
    cp_configure("allgather", True)
    rows = []
    for s in (32768, 65536, 131072, 262144):
        b, h, d = 1, 16, 128
        q, k, v, g = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        flops = 4 * b * h * s * s * d * 2.5 / 2 / world
        result = {}
        for name, backends in (("aotriton", FLASH), ("cuDNN", [SDPBackend.CUDNN_ATTENTION])):
            if name == "cuDNN":
                A.deactivate()
            try:
                def step():
                    with sdpa_kernel(backends), context_parallel(mesh, buffers=[q, k, v, g], buffer_seq_dims=[2] * 4):
                        for t in (q, k, v):
                            t.requires_grad_(True)
                        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
                        for t in (q, k, v):
                            t.requires_grad_(False)
                            t.grad = None
                result[name] = median_ms(step)
            except Exception as e:  # noqa: BLE001 -- a backend that cannot run this shape is "n/a"
                result[name] = None
                if dist.get_rank() == 0:
                    print(f"  n/a {name} S{s}: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
            finally:
                if name == "cuDNN":
                    A.activate()
        rows.append((s, result))
    if dist.get_rank() == 0:
        print(f"context parallel, world {world}, bf16 B1 H16 D128 causal, forward + backward per step (median)")
        print(f"{'tokens':>8} {'aot ms':>8} {'aot tok/s':>10} {'aot TF/s/GPU':>12} {'cuDNN ms':>9} {'cuDNN TF/s/GPU':>14} {'ratio':>6}")
        for s, r in rows:
            a, c = r.get("aotriton"), r.get("cuDNN")
            flops = 4 * s * s * 16 * 128 * 2.5 / 2 / world
            fmt = lambda ms: f"{flops / ms * 1e-9:.1f}" if ms else "n/a"  # noqa: E731
            print(f"{s:>8} {a or float('nan'):>8.2f} {(s / a * 1e3 if a else float('nan')):>10.0f} {fmt(a):>12} "
                  f"{c or float('nan'):>9.2f} {fmt(c):>14} {(c / a if a and c else float('nan')):>6.2f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", action="store_true")
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    # A short collective timeout: a rank that fails alone must not leave the others waiting 10 minutes.
    dist.init_process_group("nccl", device_id=torch.device("cuda", local), timeout=datetime.timedelta(seconds=120))
    world = dist.get_world_size()
    try:
        R.check("'aotriton' is listed by torch's registry", "aotriton" in torch.nn.attention.list_flash_attention_impls())
        A.activate()
        mesh = init_device_mesh("cuda", (world,))
        R.run("test_correctness", lambda: test_correctness(mesh, world))
        if importlib.util.find_spec("transformers") is not None:
            R.run("test_training", lambda: test_training(mesh, world))
        else:
            print("skipped: test_training (no transformers)", flush=True)
        if args.bench:
            bench(mesh, world)
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        R.finish()


if __name__ == "__main__":
    main()
