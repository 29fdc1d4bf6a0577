#!/usr/bin/env python3
"""aotriton as torch's registered flash-attention implementation, on a CUDA GPU, against float64.

After ``torch.nn.attention.activate_flash_attention_impl("aotriton")``, unchanged torch code must
run aotriton's kernels (counted at the extension ops) with torch's semantics:

1. F.scaled_dot_product_attention with the flash backend: forward and backward (fp16, bf16; causal,
   GQA, head dims 64-256, odd lengths), bounds as test_ops.py (aotriton's error at most a few times
   that of the same plain computation in the input dtype); gradients land in the leaves' own
   layouts, (B, H, S, D) and (B, S, H, D), with no copy.
2. Dropout through the aten op: the keep-mask of the very call (its returned seed pair, read back
   with aotriton.torch.dropout_mask) in the reference, forward and gradients.
3. torch.nn.attention.varlen.varlen_attn: packed ragged batches, GQA, causal and sliding windows.
4. A backward fed with another call's out and LSE, as context parallel does: keys split in two,
   each half's forward through the op, outputs merged by LSE, each half's backward with the merged
   (and sliced) out and LSE; summed gradients vs the whole problem's.
5. torch's context parallel (torch.distributed.tensor.experimental.context_parallel) on a
   one-process NCCL group: SDPA forward and backward through the ring code path.
6. CUDA graph capture and replay (with dropout), torch.compile(fullgraph=True), torch.library.opcheck
   of the replaced ops.
7. What it does not serve is refused by name; restore_flash_attention_impl() gives torch's kernel back.

    PYTHONPATH=bindings/torch/python:test/torch python test/torch/test_registered.py
Last line: `torch-registered: N passed, M failed`.
"""
import argparse
import math
import os
import re
import socket

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness import (Runner, attention_ref, count_ops, cp_forward_backward, gqa_kwargs, kvcache_ref, lse_ref, max_err,
                     visible)

import aotriton.torch as A
import test_ops as T  # its compare(): three-way (ours, float64, input-dtype reference) bounds

DEV = "cuda"
R = Runner("registered")
T.R, T.ARGS = R, argparse.Namespace(k=None)
FLASH = [SDPBackend.FLASH_ATTENTION]


COUNT = count_ops(A)


def test_activation():
    """Activates through the README's one-line activation (its first ```python block), verbatim."""
    R.check("'aotriton' is listed by torch's registry", "aotriton" in torch.nn.attention.list_flash_attention_impls(),
            str(torch.nn.attention.list_flash_attention_impls()))
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    line = re.findall(r"```python\n(.*?)```", readme, re.S)[0]
    R.check("README's first python block is the one-line activation", line.count("\n") == 1, repr(line))
    exec(compile(line, "README.md", "exec"), {})
    R.check("activated", torch.nn.attention.current_flash_attention_impl() == "aotriton")


def sdpa(q, k, v, **kw):
    with sdpa_kernel(FLASH):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def test_sdpa():
    for dtype in (torch.bfloat16, torch.float16):
        for b, hq, hk, sq, sk, d, causal in ((2, 8, 8, 1024, 1024, 128, True), (2, 8, 2, 333, 517, 64, False),
                                             (1, 4, 4, 128, 128, 256, True), (3, 6, 3, 77, 77, 96, True),
                                             (1, 2, 1, 1, 300, 64, False)):
            vis = visible(sq, sk, causal=True) if causal else None
            name = f"sdpa flash {T.tag(dtype)} B{b} Hq{hq} Hk{hk} Sq{sq} Sk{sk} D{d}" + (" causal" if causal else "")
            mark = COUNT.mark()
            T.compare(name, dtype, dict(q=T.rnd(b, hq, sq, d), k=T.rnd(b, hk, sk, d), v=T.rnd(b, hk, sk, d)),
                      lambda q, k, v: sdpa(q, k, v, is_causal=causal, enable_gqa=hq != hk),
                      lambda q, k, v: attention_ref(q, k, v, 1 / math.sqrt(d), vis=vis), ["q", "k", "v"])
            R.check(name + ": ran on aotriton (one forward, one backward)", COUNT.since(mark) == (1, 1),
                    f"calls {COUNT.since(mark)}")


def test_layouts():
    """Leaves in (B, H, S, D) and (B, S, H, D) memory: gradients come back in the same strides."""
    b, h, s, d = 2, 8, 512, 128
    for layout in ("bhsd", "bshd"):
        shape = (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
        leaves = [torch.randn(shape, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
        q, k, v = leaves if layout == "bhsd" else [t.transpose(1, 2) for t in leaves]
        out = sdpa(q, k, v, is_causal=True)
        out.backward(torch.randn_like(out))
        R.check(f"sdpa flash {layout} leaves: grads in the leaves' strides",
                all(t.grad.stride() == t.stride() for t in leaves),
                str([(t.grad.stride(), t.stride()) for t in leaves]))
        R.check(f"sdpa flash {layout}: out has query's strides", out.stride() == q.stride(), str(out.stride()))


def test_dropout():
    b, hq, hk, sq, sk, d, p = 2, 4, 2, 200, 317, 64, 0.2
    for causal in (False, True):
        if causal:
            sk = sq
        name = f"aten flash op dropout p{p} Hq{hq} Hk{hk} Sq{sq} Sk{sk}" + (" causal" if causal else "")
        state = {}

        def ours(q, k, v):
            res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, p, causal, False)
            state["keep"] = A.dropout_mask(res[6].view(torch.int64), b, hq, sq, sk, p)
            return res[0]

        def ref(q, k, v):
            return attention_ref(q, k, v, 1 / math.sqrt(d), vis=visible(sq, sk, causal=True) if causal else None,
                                 keep=state["keep"], p=p)

        T.compare(name, torch.bfloat16, dict(q=T.rnd(b, hq, sq, d), k=T.rnd(b, hk, sk, d), v=T.rnd(b, hk, sk, d)), ours,
                  ref, ["q", "k", "v"], dropout=True)


def test_varlen():
    from torch.nn.attention.varlen import varlen_attn

    lens_q, lens_k = [300, 1, 517, 64], [300, 9, 517, 200]
    hq, hk, d = 8, 2, 128
    cq, ck = [0], [0]
    for a, c in zip(lens_q, lens_k):
        cq.append(cq[-1] + a)
        ck.append(ck[-1] + c)
    cu_q = torch.tensor(cq, device=DEV, dtype=torch.int32)
    cu_k = torch.tensor(ck, device=DEV, dtype=torch.int32)
    for window in ((-1, 0), (-1, -1), (128, 0)):
        name = f"varlen_attn bf16 q{lens_q} k{lens_k} Hq{hq} Hk{hk} D{d} window{window}"

        def ours(q, k, v):
            return varlen_attn(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), window_size=window,
                               **gqa_kwargs(varlen_attn))

        def ref(q, k, v):
            outs = []
            for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
                seq = [t[o[i]:o[i + 1]].transpose(0, 1).unsqueeze(0) for t, o in ((q, cq), (k, ck), (v, ck))]
                vis = visible(lq, lk, window[0], window[1], align=1)
                outs.append(attention_ref(*seq, 1 / math.sqrt(d), vis=vis).squeeze(0).transpose(0, 1))
            return torch.cat(outs, 0)

        mark = COUNT.mark()
        T.compare(name, torch.bfloat16, dict(q=T.rnd(cq[-1], hq, d), k=T.rnd(ck[-1], hk, d), v=T.rnd(ck[-1], hk, d)), ours,
                  ref, ["q", "k", "v"], varlen=True)
        R.check(name + ": ran on aotriton", COUNT.since(mark) == (1, 1), f"calls {COUNT.since(mark)}")


def test_varlen_kvcache():
    """varlen_attn's KV-cache mode (a paged cache, block_table and seqused_k; torch versions whose
    aten::_flash_attention_forward takes a block_table) through aotriton's KV-cache attention:
    packed decode queries (2 per sequence), GQA, causal, lengths 0 to 70 (one sequence's pages
    shared), out against float64."""
    from torch.nn.attention.varlen import varlen_attn
    if "block_table" not in str(torch.ops.aten._flash_attention_forward.default._schema):
        print(f"skipped: varlen_attn KV-cache mode (torch {torch.__version__}'s flash op takes no block_table)",
              flush=True)
        return
    b, sq, hq, hk, d, page = 3, 2, 8, 2, 128, 16
    q = torch.randn(b, sq, hq, d, device=DEV, dtype=torch.bfloat16)
    k_pool, v_pool = (torch.randn(12, page, hk, d, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    table = torch.tensor([[3, 7, 1, 9, 0], [3, 7, 2, 4, 5], [11, 10, 8, 6, 2]], device=DEV, dtype=torch.int32)
    lens = torch.tensor([33, 0, 70], device=DEV, dtype=torch.int32)
    cu_q = torch.arange(0, b * sq + 1, sq, device=DEV, dtype=torch.int32)
    before = COUNT.kvcache_calls
    out = varlen_attn(q.reshape(b * sq, hq, d), k_pool, v_pool, cu_q, None, sq, 5 * page, seqused_k=lens,
                      block_table=table, window_size=(-1, 0), **gqa_kwargs(varlen_attn))
    ref, _ = kvcache_ref(q, k_pool, v_pool, lens, None, None, table, 1 / math.sqrt(d), True)
    err = max_err(out.reshape(b, sq, hq, d), ref)
    bound = 2 ** -6 * ref.abs().max().item()  # O rounded to bf16 (2^-8) and P in bf16 for the PV product
    R.check(f"varlen_attn KV-cache mode bf16 B{b} Sq{sq} Hq{hq} Hk{hk} D{d} page {page} lens {lens.tolist()}",
            err <= bound and COUNT.kvcache_calls == before + 1,
            f"out {err:.2e}/{bound:.2e}, aotriton KV-cache calls {COUNT.kvcache_calls - before}")


def test_foreign_out_lse():
    """Context parallel's backward: out and LSE merged over key chunks, each chunk's backward with
    them; gradients summed (dq) or concatenated (dk, dv) equal the whole problem's."""
    b, h, sq, sk, d = 2, 4, 384, 640, 128
    scale = 1 / math.sqrt(d)
    q64, k64, v64, g64 = T.rnd(b, h, sq, d), T.rnd(b, h, sk, d), T.rnd(b, h, sk, d), T.rnd(b, h, sq, d)
    q, k, v, g = (t.to(torch.bfloat16) for t in (q64, k64, v64, g64))
    halves = (slice(0, 256), slice(256, sk))
    parts = [torch.ops.aten._scaled_dot_product_flash_attention(q, k[:, :, s], v[:, :, s], 0.0, False, False,
                                                               scale=scale) for s in halves]
    lse = torch.logaddexp(parts[0][1], parts[1][1])
    out = sum(p[0].double() * torch.exp(p[1] - lse).unsqueeze(-1).double() for p in parts).to(torch.bfloat16)
    # The merged out and LSE as slices of bigger buffers (as context parallel hands them over).
    out_buf = torch.empty(b, h, sq + 64, d, device=DEV, dtype=torch.bfloat16)
    out_buf[:, :, 32:32 + sq] = out
    lse_buf = torch.empty(b, h, sq + 64, device=DEV, dtype=torch.float32)
    lse_buf[:, :, 32:32 + sq] = lse
    out_v, lse_v = out_buf[:, :, 32:32 + sq], lse_buf[:, :, 32:32 + sq]
    grads = [torch.ops.aten._scaled_dot_product_flash_attention_backward(
        g, q, k[:, :, s], v[:, :, s], out_v, lse_v, None, None, sq, s.stop - s.start, 0.0, False, p[6], p[7],
        scale=scale) for s, p in zip(halves, parts)]
    dq = grads[0][0].double() + grads[1][0].double()
    dk = torch.cat([grads[0][1], grads[1][1]], dim=2)
    dv = torch.cat([grads[0][2], grads[1][2]], dim=2)
    leaves = [t.clone().requires_grad_() for t in (q64, k64, v64)]
    want = torch.autograd.grad(attention_ref(*leaves, scale), leaves, g.double())
    low_leaves = [t.to(torch.bfloat16).detach().requires_grad_() for t in (q64, k64, v64)]
    low_g = torch.autograd.grad(attention_ref(*low_leaves, scale), low_leaves, g)
    details, ok = [], True
    for name, got, w, l in zip(("dq", "dk", "dv"), (dq, dk, dv), want, low_g):
        e, bound = max_err(got, w), 5 * max_err(l, w) + 1e-3
        ok &= e <= bound
        details.append(f"{name} {e:.2e}/{bound:.2e}")
    e_lse = max_err(lse, lse_ref(q, k, scale))
    R.check("backward with merged (foreign, sliced) out and LSE, keys in two chunks", ok and e_lse <= 1e-2,
            " ".join(details) + f" merged-lse {e_lse:.2e}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_context_parallel():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device(DEV, torch.cuda.current_device()))
    try:
        mesh = init_device_mesh(DEV, (1,))
        b, h, s, d = 2, 8, 1024, 128
        q, k, v, g = (T.rnd(b, h, s, d).to(torch.bfloat16) for _ in range(4))
        exact = [t.double() for t in (q, k, v, g)]  # the rounded inputs, kept before sharding
        mark = COUNT.mark()
        got = cp_forward_backward(mesh, q, k, v, g, True)  # one rank: its shards are the whole tensors
        calls = COUNT.since(mark)
        leaves = [t.clone().requires_grad_() for t in exact[:3]]
        ref = attention_ref(*leaves, 1 / math.sqrt(d), vis=visible(s, s, causal=True))
        want = [ref] + list(torch.autograd.grad(ref, leaves, exact[3]))
        errs = [max_err(a, w) for a, w in zip(got, want)]
        R.check("context_parallel (1 process, NCCL): SDPA forward + backward through aotriton",
                calls[0] >= 1 and calls[1] >= 1 and errs[0] <= 2e-2 and max(errs[1:]) <= 6e-2,
                f"calls {calls} errs out/dq/dk/dv {[f'{e:.2e}' for e in errs]}")
    finally:
        dist.destroy_process_group()


def test_cuda_graph():
    b, h, s, d, p = 2, 4, 256, 64, 0.25
    q, k, v = (torch.randn(b, h, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(b, h, s, d, device=DEV, dtype=torch.bfloat16)

    def step():
        res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, p, True, False)
        dq, dk, dv = torch.autograd.grad(res[0], (q, k, v), do)
        return res[0], res[6], dq, dk, dv

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    seeds = []
    for r in range(2):
        with torch.no_grad():
            for t in (q, k, v):
                t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        out, seed = static[0], static[1].view(torch.int64).clone()
        seeds.append(tuple(seed.tolist()))
        keep = A.dropout_mask(seed, b, h, s, s, p)
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        ref = attention_ref(*leaves, 1 / math.sqrt(d), vis=visible(s, s, causal=True), keep=keep, p=p)
        want = torch.autograd.grad(ref, leaves, do.double())
        errs = [max_err(out, ref)] + [max_err(a, w) for a, w in zip(static[2:], want)]
        R.check(f"CUDA graph replay {r} (dropout, causal): out and grads vs float64 with the replay's mask",
                errs[0] <= 2e-2 and max(errs[1:]) <= 6e-2, f"errs {[f'{e:.2e}' for e in errs]}")
    R.check("CUDA graph replays draw new masks", seeds[0] != seeds[1], str(seeds))


def test_compile():
    b, h, s, d = 2, 8, 512, 128

    def attn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2

    ins = [torch.randn(b, s, h, d, device=DEV, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3)]
    g = torch.randn(b, h, s, d, device=DEV, dtype=torch.bfloat16)
    results = []
    for fn in (attn, torch.compile(attn, fullgraph=True)):
        leaves = [t.detach().clone().requires_grad_() for t in ins]
        mark = COUNT.mark()
        with sdpa_kernel(FLASH):
            out = fn(*leaves)
            out.backward(g)
        results.append(([out.detach()] + [t.grad for t in leaves], COUNT.since(mark)))
    errs = [max_err(a, b_) for a, b_ in zip(results[0][0], results[1][0])]
    R.check("torch.compile(fullgraph) SDPA: ran on aotriton, equals eager", results[1][1] == (1, 1)
            and max(errs) <= 1e-2, f"calls {results[1][1]} errs {[f'{e:.1e}' for e in errs]}")


def test_opcheck():
    q, k, v = (torch.randn(2, 4, 128, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    cases = [("sdpa flash op", torch.ops.aten._scaled_dot_product_flash_attention.default, (q, k, v, 0.0, True),
              {"scale": 0.125})]
    qs, ks, vs = (torch.randn(300, 4, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 100, 101, 300], device=DEV, dtype=torch.int32)
    cases.append(("flash op (packed)", torch.ops.aten._flash_attention_forward.default,
                  (qs, ks, vs, cu, cu, 199, 199, 0.0, True, False), {"window_size_left": 32, "window_size_right": 0}))
    for name, op, args, kwargs in cases:
        try:
            torch.library.opcheck(op, args, kwargs)
            R.check(f"opcheck {name}", True)
        except Exception as e:  # noqa: BLE001
            R.check(f"opcheck {name}", False, f"{type(e).__name__}: {str(e)[:400]}")


def test_refusals_and_restore():
    q, k, v = (torch.randn(1, 2, 64, 64, device=DEV, dtype=torch.bfloat16) for _ in range(3))
    for name, fn, word in (
            ("return_debug_mask", lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False,
                                                                                             True),
             "return_debug_mask"),
            ("alibi_slopes", lambda: torch.ops.aten._flash_attention_forward(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, None, 64, 64, 0.0, False, False,
                alibi_slopes=torch.ones(2, device=DEV)), "alibi_slopes")):
        mark = COUNT.mark()
        try:
            fn()
            R.check(f"refuses {name}", False, "no error")
        except NotImplementedError as e:
            R.check(f"refuses {name}, nothing launched", word in str(e) and COUNT.since(mark) == (0, 0), str(e)[:200])
    torch.nn.attention.restore_flash_attention_impl()
    mark = COUNT.mark()
    out = sdpa(q, k, v, is_causal=True)
    ref = attention_ref(q.double(), k.double(), v.double(), 1 / math.sqrt(64), vis=visible(64, 64, causal=True))
    R.check("restore_flash_attention_impl(): torch's own kernel again", COUNT.since(mark) == (0, 0)
            and max_err(out, ref) <= 2e-2 and torch.nn.attention.current_flash_attention_impl() is None)


def main():
    if not torch.cuda.is_available():
        R.check("CUDA device present", False)
        R.finish()
    print("torch", torch.__version__, "| aotriton", A.version(), "|", torch.cuda.get_device_name(), flush=True)
    torch.manual_seed(0)
    test_activation()
    for t in (test_sdpa, test_layouts, test_dropout, test_varlen, test_varlen_kvcache, test_foreign_out_lse,
              test_context_parallel,
              test_cuda_graph, test_compile, test_opcheck):
        R.run(t.__name__, t)
    R.run("test_refusals_and_restore", test_refusals_and_restore)
    R.finish()


if __name__ == "__main__":
    main()
