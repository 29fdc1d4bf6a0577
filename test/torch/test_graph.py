#!/usr/bin/env python3
"""CUDA graphs and torch.compile with aotriton.torch (on a CUDA GPU).

1. CUDA graph: forward + backward with dropout captured once (torch.cuda.graph), replayed twice.
   What is checked, per replay:
   - the generator moved between replays, so the two replays used different (seed, offset) and
     their dropout masks and outputs differ;
   - bitwise equality with an eager run from the same generator state: before each replay we save
     torch.cuda.get_rng_state(); afterwards we restore it and run the same step eagerly. A replay
     reads the generator's offset at replay time (graph-safe Philox slots) and the eager call
     takes the same offset, so out, rng_state, dq, dk and dv must match bit for bit;
   - the replayed output equals a float64 reference built with that replay's own keep-mask
     (aotriton.torch.dropout_mask on the captured rng_state).
2. torch.compile of a small attention module (backends aot_eager and inductor): outputs and
   gradients equal eager (aot_eager: bitwise; inductor: fp32 tolerance, since it may fuse the
   surrounding linear layers differently). fullgraph=True is tried first; a graph break is
   reported, not failed. With dropout under the same seed, aot_eager must match eager bitwise.
3. torch.library.opcheck (schema + fake-tensor checks) of the custom ops.

Under AOTRITON_BACKEND=gluon (every call forced onto the sm_90 Gluon kernels; rule:
harness.gluon_refusal) a case whose calls Gluon cannot serve checks instead that they raise
RuntimeError naming kUnsupportedByBackend and the reason (`PASS refused by gluon: <case>`): the
CUDA-graph test (dropout: its eager step), the fp32 and masked compile cases and the dropout one
(their eager run), and the opchecks of calls with a bias or a packed batch (the op itself:
opcheck's schema and fake-tensor checks run the real op too). The rest runs as above: the bf16
causal compile cases and the dropout_mask opcheck (no backend involved).

    PYTHONPATH=bindings/torch/python python test/torch/test_graph.py
Last line: `torch-graph: N passed, M failed`.
"""
import math

import torch

from harness import Runner, attention_ref, gluon_refuses, max_err

import aotriton.torch as A

DEV = "cuda"
R = Runner("graph")


def cuda_graph_dropout():
    torch.manual_seed(0)
    b, hq, hk, s, d, p = 2, 8, 2, 256, 64, 0.3
    q = torch.randn(b, hq, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, hk, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, hk, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(b, hq, s, d, device=DEV, dtype=torch.bfloat16)

    def step():
        out, _, rng = A.flash_attention(q, k, v, causal=True, dropout_p=p, return_aux=True)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
        return out, rng, dq, dk, dv

    why = gluon_refuses(torch.bfloat16, d, backward=True, dropout=True)
    if why:  # forced Gluon: the step's dropout backward is refused (eagerly; nothing to capture)
        R.refused("cuda graph dropout: eager step", why, step)
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: loads the kernels before capture
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    names = ("out", "rng_state", "dq", "dk", "dv")
    replays = []
    for r in range(2):
        state = torch.cuda.get_rng_state()
        graph.replay()
        torch.cuda.synchronize()
        snap = [t.clone() for t in static]
        replays.append(snap)
        torch.cuda.set_rng_state(state)
        eager = step()
        torch.cuda.synchronize()
        same = [torch.equal(a, e) for a, e in zip(snap, eager)]
        R.check(f"graph replay {r + 1} == eager from the same rng state (bitwise)", all(same),
                " ".join(f"{n}={'ok' if ok else 'DIFF'}" for n, ok in zip(names, same))
                + f" rng {snap[1].tolist()} vs {eager[1].tolist()}")
        keep = A.dropout_mask(snap[1], b, hq, s, s, p)
        i = torch.arange(s, device=DEV)
        vis = i[None, :] <= i[:, None]
        ref = attention_ref(q.double(), k.double(), v.double(), 1 / math.sqrt(d), vis=vis, keep=keep, p=p)
        low = attention_ref(q, k, v, 1 / math.sqrt(d), vis=vis, keep=keep, p=p)
        e, bound = max_err(snap[0], ref), 3 * max_err(low, ref) + 1e-3
        R.check(f"graph replay {r + 1} output == float64 reference with its own mask", e <= bound,
                f"{e:.2e}/{bound:.2e}")
    r0, r1 = replays
    R.check("graph replays use different rng states", r0[1].tolist() != r1[1].tolist(),
            f"{r0[1].tolist()} then {r1[1].tolist()}")
    m0 = A.dropout_mask(r0[1], b, hq, s, s, p)
    m1 = A.dropout_mask(r1[1], b, hq, s, s, p)
    R.check("graph replays draw different masks and outputs", not torch.equal(m0, m1) and not torch.equal(r0[0], r1[0]))
    inc = A.philox_increment(b, hq, s, s)
    # Replay 1 ran at offset O; the eager check restored O and advanced it by one call, so replay 2
    # ran at O + philox_increment.
    R.check("graph replay advances the offset by philox_increment", r1[1][1].item() - r0[1][1].item() == inc,
            f"{r1[1][1].item() - r0[1][1].item()} vs {inc}")


class Attn(torch.nn.Module):
    def __init__(self, dim=256, heads=4, kv_heads=2, p=0.0):
        super().__init__()
        self.h, self.hk, self.d, self.p = heads, kv_heads, dim // heads, p
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.d)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.h, self.d).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.hk, self.d).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        y = A.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, dropout_p=self.p,
                                           enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


def run_model(model, x, mask, seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    xx = x.detach().clone().requires_grad_()
    y = model(xx, mask)
    (y.float().square().mean()).backward()
    return [y.detach(), xx.grad] + [prm.grad for prm in model.parameters()]


def compile_case(backend, dtype, with_mask, p=0.0):
    name = f"torch.compile {backend} {str(dtype)[6:]}" + (" mask" if with_mask else " causal") + (f" dropout{p}" if p else "")
    torch.manual_seed(0)
    model = Attn(p=p).to(DEV, dtype)
    x = torch.randn(2, 128, 256, device=DEV, dtype=dtype)
    mask = torch.randn(2, 1, 128, 128, device=DEV, dtype=dtype) if with_mask else None
    why = gluon_refuses(dtype, model.d, backward=p > 0, dropout=p > 0, bias=with_mask)  # run_model trains
    if why:  # forced Gluon: the model's attention call is refused (checked eagerly; tracing launches nothing)
        R.refused(name + " (eager run)", why, run_model, model, x, mask, seed=5 if p else None)
        return
    eager = run_model(model, x, mask, seed=5 if p else None)
    torch._dynamo.reset()
    note = "fullgraph"
    try:
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        got = run_model(compiled, x, mask, seed=5 if p else None)
    except Exception as e:  # a graph break is acceptable: retry without fullgraph
        note = f"graph break ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend)
        got = run_model(compiled, x, mask, seed=5 if p else None)
    if backend == "aot_eager":
        ok = all(torch.equal(a, b) for a, b in zip(eager, got))
        worst = max(max_err(a, b) for a, b in zip(eager, got))
    else:
        worst = max(max_err(a, b) / (b.double().abs().max().item() + 1e-12) for a, b in zip(eager, got))
        ok = worst <= (1e-4 if dtype == torch.float32 else 2e-2)
    R.check(name, ok, f"worst {'abs' if backend == 'aot_eager' else 'rel'} diff {worst:.2e}; {note}")


def opcheck():
    q = torch.randn(2, 4, 64, 64, device=DEV, dtype=torch.float16)
    k = torch.randn(2, 2, 80, 64, device=DEV, dtype=torch.float16)
    bias = torch.randn(2, 1, 64, 80, device=DEV, dtype=torch.float16)
    utils = ("test_schema", "test_faketensor")
    # opcheck runs the real op as well (the schema check, and the fake-tensor check's cross-reference),
    # so under a forced Gluon backend a call it cannot serve (a bias, a packed batch) is checked to be
    # refused instead.
    fwd_args = (q, k, k, bias, None, None, 0, 0, 0.125, False, -1, -1, 0, 0.0, False)
    why = gluon_refuses(torch.float16, 64, bias=True)
    if why:
        R.refused("opcheck aotriton::fwd", why, torch.ops.aotriton.fwd, *fwd_args)
        # What this forward returns elsewhere: out (B x S x H x D memory), lse, and the rng_state of
        # a call without dropout, (0, 0).
        out = torch.zeros(2, 64, 4, 64, device=DEV, dtype=torch.float16).transpose(1, 2)
        lse = torch.zeros(2, 4, 64, device=DEV, dtype=torch.float32)
        rng = torch.zeros(2, device=DEV, dtype=torch.int64)
    else:
        res = torch.library.opcheck(torch.ops.aotriton.fwd.default, fwd_args, test_utils=utils)
        R.check("opcheck aotriton::fwd", all(v == "SUCCESS" for v in res.values()), str(res))
        out, lse, rng = torch.ops.aotriton.fwd(*fwd_args)
    bwd_args = (torch.randn_like(out), q, k, k, out, lse, bias, True, None, None, 0, 0, 0.125, False, -1, -1, 0, 0.0,
                rng, False, False)
    why = gluon_refuses(torch.float16, 64, backward=True, bias=True)
    if why:
        R.refused("opcheck aotriton::bwd", why, torch.ops.aotriton.bwd, *bwd_args)
    else:
        res = torch.library.opcheck(torch.ops.aotriton.bwd.default, bwd_args, test_utils=utils)
        R.check("opcheck aotriton::bwd", all(v == "SUCCESS" for v in res.values()), str(res))
    res = torch.library.opcheck(torch.ops.aotriton.dropout_mask.default, (rng, 2, 4, 64, 80, 0.5), test_utils=utils)
    R.check("opcheck aotriton::dropout_mask", all(v == "SUCCESS" for v in res.values()), str(res))
    # varlen fwd
    qv = torch.randn(1, 4, 50, 64, device=DEV, dtype=torch.bfloat16)
    cu = torch.tensor([0, 20, 50], device=DEV, dtype=torch.int32)
    varlen_args = (qv, qv, qv, None, cu, cu, 30, 30, 0.125, True, -1, -1, 0, 0.0, False)
    why = gluon_refuses(torch.bfloat16, 64, varlen=True)
    if why:
        R.refused("opcheck aotriton::fwd varlen", why, torch.ops.aotriton.fwd, *varlen_args)
    else:
        res = torch.library.opcheck(torch.ops.aotriton.fwd.default, varlen_args, test_utils=utils)
        R.check("opcheck aotriton::fwd varlen", all(v == "SUCCESS" for v in res.values()), str(res))


def main():
    if not torch.cuda.is_available():
        R.check("CUDA device present", False)
        R.finish()
    print("torch", torch.__version__, "| aotriton", A.version(), "|", torch.cuda.get_device_name())
    R.run("cuda graph dropout", cuda_graph_dropout)
    R.run("opcheck", opcheck)
    for backend in ("aot_eager", "inductor"):
        for dtype in (torch.float32, torch.bfloat16):
            for with_mask in (False, True):
                R.run(f"compile {backend}", compile_case, backend, dtype, with_mask)
    R.run("compile dropout", compile_case, "aot_eager", torch.bfloat16, False, 0.2)
    R.finish()


if __name__ == "__main__":
    main()
