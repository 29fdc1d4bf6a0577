"""The packed (varlen) batch the benchmarks time (issue 17's varlen row): 16 sequences of random
lengths, about 42k tokens, Hq/Hk 32/8, head dim 128, bf16. One draw, shared by the kernel-level
check (test/gluon/check_fwd_varlen.py --bench) and the binding benchmark (bench_torch.py --varlen),
with their common peer, torch's varlen_attn. Importing it needs no torch."""

SEQUENCES = 16
TOKENS = 42_000
HEADS_Q, HEADS_K, HEAD_DIM = 32, 8, 128


def lengths(n=SEQUENCES, total=TOKENS, seed=0):
    """``n`` lengths uniform in [mean/2, 3·mean/2] (mean = total/n), a fixed draw (no torch needed)."""
    import random
    rng = random.Random(seed)
    mean = total // n
    return [rng.randint(mean // 2, mean + mean // 2) for _ in range(n)]


def offsets(lens):
    """cu_seqlens: ``[0, l0, l0 + l1, ...]``."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def flops(lens, heads_q, head_dim, causal):
    """Forward FLOPs of attention over each sequence alone: sum of 4·Hq·s²·D (halved when causal)."""
    return sum(4 * heads_q * s * s * head_dim // (2 if causal else 1) for s in lens)


def torch_varlen_attn(q, k, v, cu, max_len, causal):
    """torch's ``varlen_attn`` on the packed tensors as a zero-argument callable (None where this
    torch has none), across its versions' keywords: causal as ``is_causal`` or a ``(-1, 0)`` window;
    GQA as ``enable_gqa``, else K/V heads repeated (differentiably: gradients reach k and v)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    import inspect
    params = inspect.signature(varlen_attn).parameters
    kw = {}
    if "enable_gqa" in params:
        kw["enable_gqa"] = True
    elif q.shape[1] != k.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if "is_causal" in params:
        kw["is_causal"] = causal
    elif causal:
        kw["window_size"] = (-1, 0)
    return lambda: varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)
