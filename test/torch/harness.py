"""Shared helpers of the torch tests: a tiny case runner, float64 references, and the rule of
which calls the Gluon backend serves (for runs with AOTRITON_BACKEND=gluon)."""
import math
import os
import sys
import traceback

import torch

# The status name a forced backend's refusal carries (aotriton_torch.cpp's check_status: a
# RuntimeError "aotriton <op> failed (kUnsupportedByBackend): <reason>").
REFUSAL = "kUnsupportedByBackend"
GLUON_MAX_HEAD_DIM = 256  # both passes (the backward's bucket 256 is bwd_wide.py)


def gqa_kwargs(fn):
    """``{"enable_gqa": True}`` where ``fn`` (torch's ``varlen_attn``) has that switch (torch >= 2.15
    refuses Hq != Hk without it), else nothing (2.11 takes GQA as is)."""
    import inspect
    return {"enable_gqa": True} if "enable_gqa" in inspect.signature(fn).parameters else {}


def forced_backend():
    """AOTRITON_BACKEND as the extension reads it (backend_from_env): auto (default, also when
    empty), portable or gluon."""
    return os.environ.get("AOTRITON_BACKEND", "") or "auto"


def gluon_refusal(dtype, head_dim, backward=False, dropout=False, bias=False, varlen=False, sm_scale=None,
                  softcap=False, alibi=False, head_dim_v=None):
    """None when the Gluon (sm_90) backend serves such a call, else why not: a word its
    kUnsupportedByBackend message contains. The rule (include/aotriton/flash.h, Backend; the checks
    in the order rust/aotriton/src/flash/gluon.rs makes them): fp16/bf16; head dim <= 256; dropout
    served (the portable kernels' masks); no bias (the extension turns bool and float masks into one); packed (varlen) batches
    served; no logit soft-capping; no ALiBi; V's head dim Q/K's (head_dim_v None or equal); forward: sm_scale > 0
    (None = the default 1/sqrt(D)). It also needs
    TMA-addressable tensors (16-byte aligned data, last stride 1, other strides multiples of 16
    bytes), which every test input is once the wrapper has copied a non-unit last stride away."""
    if dtype not in (torch.float16, torch.bfloat16):
        return "fp16 or bf16"
    if head_dim > GLUON_MAX_HEAD_DIM:
        return "head dim"
    if bias:
        return "bias"
    if softcap:
        return "soft-capping"
    if alibi:
        return "ALiBi"
    if head_dim_v is not None and head_dim_v != head_dim:
        return "V's head dim"
    if not backward and sm_scale is not None and not sm_scale > 0:
        return "sm_scale"
    return None


def gluon_serves(dtype, head_dim, backward=False, dropout=False, bias=False, varlen=False, sm_scale=None):
    """Whether the Gluon backend serves such a call (gluon_refusal's rule)."""
    return gluon_refusal(dtype, head_dim, backward, dropout, bias, varlen, sm_scale) is None


def gluon_refuses(dtype, head_dim, backward=False, dropout=False, bias=False, varlen=False, sm_scale=None,
                  softcap=False, alibi=False, head_dim_v=None):
    """The reason (see gluon_refusal) when AOTRITON_BACKEND=gluon forces such a call onto a backend
    that cannot serve it, so the call must raise kUnsupportedByBackend; None otherwise (any other
    backend, or a call Gluon serves: the test runs as usual)."""
    if forced_backend() != "gluon":
        return None
    return gluon_refusal(dtype, head_dim, backward, dropout, bias, varlen, sm_scale, softcap, alibi, head_dim_v)


class Runner:
    """Collects pass/fail per case; prints `torch-<name>: N passed, M failed` at the end."""

    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.failures = []

    def check(self, case, ok, detail=""):
        ok = bool(ok)
        print(f"{'PASS' if ok else 'FAIL'} {case}" + (f"  {detail}" if detail else ""), flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.failures.append(case)
        return ok

    def run(self, case, fn, *args, **kwargs):
        """Runs fn(*args) and counts an exception as a failure of `case`."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            self.check(case, False, f"raised {type(e).__name__}: {str(e)[:400]}")
            return None

    def refused(self, case, reason, fn, *args, **kwargs):
        """The forced backend must refuse fn(*args): RuntimeError naming kUnsupportedByBackend and
        `reason` (a word of the refusal's message, from gluon_refusal). Counts one case, printed
        `PASS refused by <backend>: <case>`; anything else (no error, another error) fails it."""
        label = f"refused by {forced_backend()}: {case}"
        try:
            fn(*args, **kwargs)
        except RuntimeError as e:
            msg = str(e)
            first = msg.strip().splitlines()[0][:300] if msg.strip() else ""
            # The status and the reason stand on one line of the message (not in a C++ backtrace).
            hits = [line for line in msg.splitlines() if REFUSAL in line and (not reason or reason in line)]
            if hits:
                return self.check(label, True, hits[0].strip()[:300])
            traceback.print_exc()
            want = REFUSAL + (f" naming {reason!r}" if reason else "")
            return self.check(label, False, f"raised {type(e).__name__} but not {want}: {first}")
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            return self.check(label, False, f"raised {type(e).__name__} instead of RuntimeError ({REFUSAL}): "
                                            f"{str(e)[:300]}")
        return self.check(label, False, f"no error raised: expected {REFUSAL} ({reason})")

    def skip(self, case, reason):
        """A case that does not apply to this run (counted apart from passes and failures)."""
        print(f"SKIP {case}  ({reason})", flush=True)
        self.skipped += 1

    def finish(self):
        if self.skipped:
            print(f"skipped cases: {self.skipped} (lines starting SKIP)")
        if self.failures:
            print("failed cases:", ", ".join(self.failures[:40]))
        print(f"torch-{self.name}: {self.passed} passed, {self.failed} failed", flush=True)
        sys.exit(1 if self.failed or not self.passed else 0)


def max_err(a, r):
    """max |a - r| in float64; NaN anywhere (or inf mismatches) gives inf, so NaN never passes."""
    a = a.detach().double()
    r = r.detach().double()
    if a.shape != r.shape:
        return math.inf
    if torch.isnan(a).any() or torch.isnan(r).any():
        return math.inf
    fin = torch.isfinite(r)
    if not torch.equal(torch.isfinite(a), fin) or not torch.equal(a[~fin], r[~fin]):
        return math.inf
    if a.numel() == 0:
        return 0.0
    return (a[fin] - r[fin]).abs().max().item() if fin.any() else 0.0


def cp_cases():
    """(rotate method, load balancer, causal) of every context-parallel case, the same for the NCCL
    run on GPUs (test_context_parallel.py) and the gloo run on the CPU (test_context_parallel_cpu.py):
    each rotate method with the load balancer on (causal only: torch balances causal attention
    alone) and off. Set them with ``cp_configure``."""
    for rotate in ("allgather", "alltoall"):
        for balance in (True, False):
            for causal in ((True, False) if not balance else (True,)):
                yield rotate, balance, causal


def cp_configure(rotate, balance):
    """torch's context-parallel options for the cases that follow (process-wide)."""
    from torch.distributed.tensor.experimental import _attention as cp_attention
    cp_attention.set_rotate_method(rotate)
    cp_attention._cp_options.enable_load_balance = balance


def cp_forward_backward(mesh, q, k, v, g, causal):
    """SDPA forward + backward of (B, H, S, D) q, k, v with output gradient g under torch's
    context_parallel over `mesh` (the flash backend: aotriton's ops when activated); this rank's
    shards of (out, dq, dk, dv). q, k, v, g are restored in place on exit, gradients dropped."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), context_parallel(mesh, buffers=[q, k, v, g],
                                                                      buffer_seq_dims=[2, 2, 2, 2]):
        for t in (q, k, v):
            t.requires_grad_(True)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.backward(g)
        shards = [out.detach().clone()] + [t.grad.clone() for t in (q, k, v)]
        # On exit context_parallel restores the buffers in place (resize_ + copy_), which autograd
        # refuses on leaves that require grad (torch's own CP tests do the same).
        for t in (q, k, v):
            t.requires_grad_(False)
            t.grad = None
    return shards


def cp_llama_training(mesh, cfg, batch, steps, count, device, dtype, step_context=None):
    """A transformers LlamaForCausalLM (config ``cfg``, random init, ``dtype`` on ``device``) trained
    ``steps`` SGD steps on one token stream (batches of ``batch`` x ``cfg.max_position_embeddings``
    tokens, the same on every rank), first as one model of the whole sequence, then with torch's
    context_parallel over ``mesh`` (input ids, labels and position ids sharded along the sequence;
    every attention call goes through the ring to the registered flash ops). Under context
    parallelism each rank's loss is its tokens' sum over the global token count and the gradients
    are summed over the ranks, so each update is the one-model update. ``step_context()`` is entered
    around each step (the GPU run: torch's flash backend); ``count`` (a :class:`Counting`) counts
    the context-parallel run's calls. Returns ``(ok, detail)``: ok when that run reached the ops at
    every layer of every step and its losses and first-step gradients agree with the one-model
    run's within ``dtype``'s spread."""
    import contextlib

    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import context_parallel
    from transformers import LlamaForCausalLM

    seq = cfg.max_position_embeddings
    torch.manual_seed(0)
    init = {k: v.detach().clone() for k, v in LlamaForCausalLM(cfg).to(device, dtype).state_dict().items()}
    gen = torch.Generator(device=device).manual_seed(7)  # the same tokens on every rank
    data = [torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device, generator=gen) for _ in range(steps)]

    def train(cp):
        model = LlamaForCausalLM(cfg).to(device, dtype)
        model.load_state_dict(init)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        losses, first_grads = [], None
        for tokens in data:
            ids, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
            pos = torch.arange(seq, device=device).expand(batch, seq).contiguous()
            opt.zero_grad(set_to_none=True)
            with step_context() if step_context else contextlib.nullcontext():
                if cp:
                    with context_parallel(mesh, buffers=[ids, labels, pos], buffer_seq_dims=[1, 1, 1]):
                        logits = model(input_ids=ids, position_ids=pos).logits
                        local = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="sum")
                        (local / (batch * seq)).backward()
                    total = local.detach().clone()
                    dist.all_reduce(total)
                    for p in model.parameters():
                        dist.all_reduce(p.grad)
                    loss = total / (batch * seq)
                else:
                    logits = model(input_ids=ids, position_ids=pos).logits
                    loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
                    loss.backward()
            if first_grads is None:
                first_grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
            losses.append(loss.item())
            opt.step()
        return losses, first_grads

    plain, plain_grads = train(False)
    mark = count.mark()
    sharded, sharded_grads = train(True)
    calls = count.since(mark)
    worst = max(((rel_l2(sharded_grads[n], plain_grads[n]), n) for n in plain_grads), default=(float("inf"), ""))
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(sharded, plain))
    # bf16 spreads apart by rounding alone; fp32 agrees to rounding of the merge.
    grad_tol, loss_tol = (3e-2, 1e-2) if dtype == torch.bfloat16 else (1e-4, 1e-5)
    ok = min(calls) >= steps * cfg.num_hidden_layers and worst[0] <= grad_tol and loss_err <= loss_tol
    detail = (f"losses {[f'{x:.5f}' for x in sharded]} vs {[f'{x:.5f}' for x in plain]} (worst {loss_err:.1e}); "
              f"first-step gradients worst rel L2 {worst[0]:.2e} ({worst[1]}); aotriton calls fwd/bwd {calls}")
    return ok, detail


def rel_l2(a, b):
    """||a - b|| / ||b|| in float64; inf when a holds a non-finite value."""
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def visible(sq, sk, left=-1, right=-1, align=0, causal=False, device="cuda"):
    """Bool [Sq, Sk]: query i sees key j iff i+off-left <= j <= i+off+right (-1 = unbounded)."""
    if causal:
        right = 0
    off = 0 if align == 0 else sk - sq
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        vis &= j >= i + off - left
    if right >= 0:
        vis &= j <= i + off + right
    return vis


def attention_ref(q, k, v, scale, bias=None, vis=None, keep=None, p=0.0, softcap=0.0):
    """Plain attention in the inputs' dtype: q (B,Hq,Sq,D), k/v (B,Hk,Sk,D) (GQA by repeat).
    softcap > 0: scores capped at softcap * tanh(s / softcap) before bias and mask.
    bias: additive, broadcastable; vis: bool, broadcastable (False = hidden); keep: dropout keep
    mask (1/0), kept values scaled by 1/(1-p). Rows that see no key give 0 (no NaN, no NaN grads)."""
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    if vis is not None:
        vis = vis.expand(s.shape)
        has = vis.any(-1, keepdim=True)
        s = torch.where(vis, s, torch.full_like(s, -math.inf))
        s = torch.where(has, s, torch.zeros_like(s))
        pr = torch.softmax(s, dim=-1) * has
    else:
        pr = torch.softmax(s, dim=-1)
    if keep is not None:
        pr = pr * keep.to(pr.dtype) / (1.0 - p)
    return torch.matmul(pr, v)


def lse_ref(q, k, scale, bias=None, vis=None, softcap=0.0):
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k = k.repeat_interleave(g, dim=1)
    s = torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.double()
    if vis is not None:
        s = s.masked_fill(~vis.expand(s.shape), -math.inf)
    out = torch.logsumexp(s, dim=-1)
    return torch.where(torch.isneginf(out), torch.full_like(out, math.inf), out)


class Counting:
    """The extension ops, counted: proves a call really reached aotriton's kernels."""

    def __init__(self, ops):
        self.ops, self.fwd_calls, self.bwd_calls, self.kvcache_calls = ops, 0, 0, 0

    def fwd(self, *args):
        self.fwd_calls += 1
        return self.ops.fwd(*args)

    def bwd(self, *args):
        self.bwd_calls += 1
        return self.ops.bwd(*args)

    def fwd_kvcache(self, *args):
        self.kvcache_calls += 1
        return self.ops.fwd_kvcache(*args)

    def __getattr__(self, name):
        return getattr(self.ops, name)

    def mark(self):
        return self.fwd_calls, self.bwd_calls

    def since(self, mark):
        return self.fwd_calls - mark[0], self.bwd_calls - mark[1]


def count_ops(aot):
    """Routes every call of ``aot`` (aotriton.torch) to its ops through a :class:`Counting`, which
    it returns."""
    count = Counting(aot._ops())
    aot._ops = lambda: count
    return count


def kvcache_append_ref(k_cache, v_cache, cache_seqlens, k_new, v_new, page_table=None):
    """Writes k_new/v_new (B, N_NEW, Hk, D) into the caches in place at rows cache_seqlens[b] ..
    (dense (B, S, Hk, D), or pages (N_PAGES, PAGE, Hk, D) through page_table (B, MAX_PAGES)), as
    attn_fwd_kvcache's append does for lengths in range."""
    if k_new is None:
        return
    lens = [int(x) for x in cache_seqlens.tolist()]
    for b, start in enumerate(lens):
        for t in range(k_new.size(1)):
            j = start + t
            if page_table is None:
                page, row = b, j
            else:
                page, row = int(page_table[b, j // k_cache.size(1)]), j % k_cache.size(1)
            k_cache[page, row] = k_new[b, t].to(k_cache.dtype)
            v_cache[page, row] = v_new[b, t].to(v_cache.dtype)


def kvcache_ref(q, k_cache, v_cache, cache_seqlens, k_new=None, v_new=None, page_table=None, scale=None,
                causal=False, window=(-1, -1)):
    """float64 (out (B, Sq, Hq, D), lse (B, Hq, Sq)) of a KV-cache decode step (flash.h
    KvCacheParams), computed from the caches as they are *before* the step: sequence b attends over
    its cache_seqlens[b] cached keys then the N_NEW new ones; query t sits at L - Sq + t (bottom-right);
    a row that sees no key gives out 0 and lse +inf. The inputs are taken in their own dtype."""
    b_, sq, hq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(b_, sq, hq, d, dtype=torch.float64, device=q.device)
    lse = torch.full((b_, hq, sq), math.inf, dtype=torch.float64, device=q.device)
    lens = [int(x) for x in cache_seqlens.tolist()]
    for b, n in enumerate(lens):
        if page_table is None:
            keys, vals = k_cache[b, :n], v_cache[b, :n]
        else:
            page = k_cache.size(1)
            rows = [(int(page_table[b, j // page]), j % page) for j in range(n)]
            keys = torch.stack([k_cache[p, r] for p, r in rows]) if rows else k_cache[0, :0]
            vals = torch.stack([v_cache[p, r] for p, r in rows]) if rows else v_cache[0, :0]
        if k_new is not None:
            keys = torch.cat([keys, k_new[b].to(keys.dtype)])
            vals = torch.cat([vals, v_new[b].to(vals.dtype)])
        if keys.size(0) == 0:
            continue
        qh = q[b].transpose(0, 1)[None].double()            # (1, Hq, Sq, D)
        kh = keys.transpose(0, 1)[None].double()            # (1, Hk, L, D)
        vh = vals.transpose(0, 1)[None].double()
        vis = visible(sq, keys.size(0), window[0], window[1], align=1, causal=causal, device=q.device)
        out[b] = attention_ref(qh, kh, vh, scale, vis=vis)[0].transpose(0, 1)
        lse[b] = lse_ref(qh, kh, scale, vis=vis)[0]
    return out, lse
