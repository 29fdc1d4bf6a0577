#!/usr/bin/env python3
"""torch's context parallelism on the CPU: two gloo ranks through aotriton's registered flash ops,
with a float64 stand-in for the kernels (the CPU part of the two-GPU issue).

torch's ``context_parallel`` runs here as it does on GPUs: the sequence sharded over a ``(2,)``
mesh (with and without its load balancer's chunk order), K/V rotated by all-gather or all-to-all,
each step's attention op called with ``is_causal`` true, false or skipped, the partial outputs
merged by their LSE, the backward run per step from the merged out and LSE. Two things differ:
the process group is gloo over a file store (no GPU, no network), and the attention op is called
directly on DTensors. On CPU tensors SDPA picks torch's own CPU flash op, which the ring does not
take; on CUDA tensors it picks ``aten._scaled_dot_product_flash_attention``, the op the ring calls
per step -- aotriton's registered functions, installed here at the CPU key over
test_flash_impl_plumbing's float64 ``StandIn``. So this proves the glue between the two: what the
registered functions hand torch's merge (LSE units and shape, the layout of a shard's outputs) and
what they take back from it (the merged out and LSE, each step's causal flag, GQA's heads), against
a float64 reference of the whole sequence. Then a transformers Llama trained a few steps with and
without context parallelism (``harness.cp_llama_training``), SDPA routed to that flash op (on
CUDA tensors torch's own choice). It proves no kernel: test_context_parallel.py runs the same
cases and training on two GPUs over NCCL.

    PYTHONPATH=bindings/torch/python:test/torch python test/torch/test_context_parallel_cpu.py

Last line (rank 0): ``torch-context_parallel_cpu: N passed, M failed``.
"""
import datetime
import importlib.util
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

WORLD = 2
# (dtype, Hq, Hk, S, D) of each case: the sequence a multiple of 2 * WORLD (the load balancer's
# chunks); GQA in bf16 with the GPU run's bounds, MHA in fp32 with tight ones.
SHAPES = ((torch.float32, 4, 4, 128, 32), (torch.bfloat16, 4, 2, 96, 64))
TOLERANCE = {torch.float32: (1e-5, 2e-5), torch.bfloat16: (2e-2, 6e-2)}  # out and LSE, gradients


def run_case(mesh, stand_in, dtype, hq, hk, s, d, causal):
    """Forward + backward of one (B, H, S, D) problem under context_parallel; the unsharded out, LSE,
    dq, dk, dv, their float64 references, and the causal flags of this rank's stand-in calls."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    from harness import attention_ref, lse_ref, visible

    b, scale = 2, d ** -0.5
    gen = torch.Generator().manual_seed(1234)  # the same inputs on every rank
    q, g = (torch.randn(b, hq, s, d, generator=gen).to(dtype) for _ in range(2))
    k, v = (torch.randn(b, hk, s, d, generator=gen).to(dtype) for _ in range(2))
    exact = [t.double() for t in (q, k, v, g)]
    first = len(stand_in.calls)
    with context_parallel(mesh, buffers=[q, k, v, g], buffer_seq_dims=[2, 2, 2, 2]):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        qd, kd, vd = (DTensor.from_local(t, mesh, [Shard(2)], run_check=False) for t in leaves)
        res = torch.ops.aten._scaled_dot_product_flash_attention(qd, kd, vd, 0.0, causal, False, scale=scale)
        out, lse = res[0], res[1]
        out.backward(DTensor.from_local(g, mesh, [Shard(2)], run_check=False))
        shards = [out.to_local().detach(), lse.to_local().detach()] + [t.grad for t in leaves]
    got = context_parallel_unshard(mesh, shards, [2, 2, 2, 2, 2])
    vis = visible(s, s, causal=causal, device="cpu")
    refs = [t.clone().requires_grad_() for t in exact[:3]]
    ref = attention_ref(*refs, scale, vis=vis)
    want = [ref, lse_ref(*exact[:2], scale, vis=vis)] + list(torch.autograd.grad(ref, refs, exact[3]))
    kinds = [c[0] for c in stand_in.calls[first:]]
    flags = {c[1]["causal"] for c in stand_in.calls[first:]}
    return got, want, kinds, flags


def sdpa_as_flash_op(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    """SDPA as CUDA tensors would run it under torch's flash backend: the flash op (which takes GQA
    as it comes). context_parallel patches ``F`` by the function's name, hence the rename below."""
    assert attn_mask is None, "the flash op takes no mask"
    return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                              scale=scale)[0]


sdpa_as_flash_op.__name__ = "scaled_dot_product_attention"


def test_training(mesh, count, R, rank, all_ranks):
    """A small transformers Llama (fp32; 2 layers, 4 heads over 2 KV heads of dim 16, 2 x 128 tokens)
    trained 3 SGD steps with context parallelism over the two ranks and as one model, per rotate
    method (all-gather with the load balancer, all-to-all without): the same losses and gradients
    to fp32 rounding."""
    from transformers import LlamaConfig

    from harness import cp_configure, cp_llama_training

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=128, attention_dropout=0.0,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    sdpa = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = sdpa_as_flash_op
    try:
        for rotate, balance in (("allgather", True), ("alltoall", False)):
            cp_configure(rotate, balance)
            case = f"world {WORLD} rotate {rotate} load-balance {balance} Llama training, 3 steps, B2 S128, fp32"
            try:
                ok, detail = cp_llama_training(mesh, cfg, 2, 3, count, "cpu", torch.float32)
            except Exception as e:  # noqa: BLE001 -- fails the case on every rank
                ok, detail = False, f"raised {type(e).__name__}: {str(e)[:300]}"
            ok = all_ranks(ok)
            if rank == 0:
                R.check(case, ok, f"rank {rank}: {detail}")
    finally:
        F.scaled_dot_product_attention = sdpa


def worker(rank, store_path):
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    from torch.distributed.device_mesh import init_device_mesh

    from harness import Runner, count_ops, cp_cases, cp_configure, max_err
    from test_flash_impl_plumbing import StandIn

    import aotriton.torch as aot
    from aotriton import flash_impl

    stand_in = StandIn()
    aot._ops = lambda: stand_in  # the extension ops -> the float64 stand-in (this process only)
    count = count_ops(aot)
    handle = flash_impl.install("CPU")  # held to the end: dropping it takes the kernels out
    mesh = init_device_mesh("cpu", (WORLD,))
    R = Runner("context_parallel_cpu")

    def all_ranks(flag):
        t = torch.tensor([1 if flag else 0])
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item())

    for rotate, balance, causal in cp_cases():
        cp_configure(rotate, balance)
        for dtype, hq, hk, s, d in SHAPES:
            case = (f"world {WORLD} rotate {rotate} load-balance {balance} {'causal' if causal else 'full'} "
                    f"{str(dtype)[6:]} B2 H{hq}/{hk} S{s} D{d}")
            try:
                got, want, kinds, flags = run_case(mesh, stand_in, dtype, hq, hk, s, d, causal)
                errs = [max_err(a, w) for a, w in zip(got, want)]
                tol_out, tol_grad = TOLERANCE[dtype]
                # Every rank runs a forward and a backward step at least; a full case never a causal
                # one; a causal case its diagonal step causal (the other steps full or skipped).
                ok = (errs[0] <= tol_out and errs[1] <= tol_out and max(errs[2:]) <= tol_grad
                      and "fwd" in kinds and "bwd" in kinds and (True in flags) == causal)
                detail = (f"rank {rank}: stand-in calls {len(kinds)} (causal flags {sorted(flags)}), errs "
                          f"out/lse/dq/dk/dv {[f'{e:.1e}' for e in errs]}")
            except Exception as e:  # noqa: BLE001 -- one case's error fails that case on every rank
                ok, detail = False, f"rank {rank}: raised {type(e).__name__}: {str(e)[:300]}"
            ok = all_ranks(ok)
            if rank == 0:
                R.check(case, ok, detail)
    if importlib.util.find_spec("transformers") is not None:
        test_training(mesh, count, R, rank, all_ranks)
    elif rank == 0:
        print("skipped: test_training (no transformers)", flush=True)
    failed = not all_ranks(rank != 0 or (R.passed > 0 and R.failed == 0))  # rank 0 holds the checks
    dist.barrier()
    dist.destroy_process_group()
    handle.remove()
    if rank == 0:
        try:
            R.finish()  # the summary line
        except SystemExit:  # its exit status is the one below
            pass
    # os._exit: gloo's threads can abort a normal interpreter exit ("terminate called without an
    # active exception") once in a while; the outcome is settled here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failed else 0)


def main():
    if not (dist.is_available() and dist.is_gloo_available()):
        print("torch-context_parallel_cpu: skipped: this torch has no gloo backend")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.spawn(worker, args=(os.path.join(tmp, "store"),), nprocs=WORLD)
        except mp.ProcessExitedException:
            return 1  # a rank exited 1: rank 0 has printed the failed cases and the summary
        except mp.ProcessRaisedException as e:
            print(e, file=sys.stderr)
            print(f"torch-context_parallel_cpu: 0 passed, 1 failed (a rank raised: {str(e).strip().splitlines()[-1]})")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
