"""aotriton as torch's flash-attention implementation (torch >= 2.11's registry).

    import aotriton.torch                                          # registers "aotriton"
    torch.nn.attention.activate_flash_attention_impl("aotriton")   # aten's flash ops run aotriton
    torch.nn.attention.restore_flash_attention_impl()              # back to torch's own kernel

Activation puts this module's functions behind four aten ops at the CUDA dispatch key (the ops
torch's registry lets an implementation replace, as its FA3/FA4 modules do):

* ``_scaled_dot_product_flash_attention`` and its ``_backward``: the SDPA flash backend, so
  ``F.scaled_dot_product_attention`` (when torch picks the flash backend) and torch's context
  parallel run aotriton. Inputs (B, H, S, D).
* ``_flash_attention_forward`` and ``_flash_attention_backward``: dense (B, S, H, D) or packed
  (total, H, D) with ``cu_seq_q/k``; ``torch.nn.attention.varlen.varlen_attn`` calls these. Its
  KV-cache mode (torch versions whose op takes ``block_table``: a paged cache, ``seqused_k`` keys
  per sequence, inference only) runs aotriton's KV-cache attention (``_kvcache_forward``).

Semantics are the ops' own (those of the FlashAttention-2 kernel torch ships): output with the
query's strides (``empty_like``), gradients with q/k/v's; LSE fp32 (B, H, Sq) dense, (H, total_q)
packed; ``is_causal`` and the windows aligned bottom-right per sequence (``window_size_left/right``
None or -1 = unbounded; ``is_causal`` sets the right window to 0; torch only sends square causal
problems through SDPA, where both alignments agree); GQA by head counts; dropout drawn from torch's
CUDA generator, its (seed, offset) returned as the uint64[2] ``rng_state`` the backward reads
(inside CUDA graphs too). The backward takes ``out`` and ``logsumexp`` as given, so merged or
sliced ones (context parallel) are used as passed.

What aotriton does not serve raises ``NotImplementedError`` naming it (``return_debug_mask``,
``alibi_slopes``, ``seqused_k`` without a ``block_table``, head dims that are not multiples of 8 or above 512, dtypes other
than fp16/bf16/fp32), like torch's FA3/FA4 implementations; nothing is launched.
``restore_flash_attention_impl()`` brings torch's kernel back for such inputs. Activate before
the forward: a backward whose forward ran on torch's kernel with dropout would regenerate another
mask.
"""
import math

import torch  # the real torch (absolute import)

__all__ = ["IMPL_NAME", "register", "activate", "deactivate", "is_registered"]

IMPL_NAME = "aotriton"


def _aot():
    from aotriton import torch as aot  # late: aotriton.torch imports this module
    return aot


def _unsupported(op, what):
    raise NotImplementedError(f"aotriton flash attention ({op}): {what} is not supported; "
                              "torch.nn.attention.restore_flash_attention_impl() restores torch's kernel")


def _as_empty_like(result, like):
    """``result`` in the memory layout ``torch.empty_like(like)`` has, which is what the ops' meta
    functions promise (torch.compile plans with those strides). The kernels already write that
    layout when ``like`` is dense with a unit last stride; otherwise one copy."""
    if _aot()._keeps_layout(like) and result.stride() == like.stride():
        return result
    fixed = torch.empty_like(like)
    fixed.copy_(result)
    return fixed


def _window(is_causal, left, right):
    left = -1 if left is None else int(left)
    right = -1 if right is None else int(right)
    if is_causal:
        right = 0
    return left, right


def _check_inputs(op, query, key, value):
    for name, t in (("key", key), ("value", value)):
        if t.dtype != query.dtype:
            raise RuntimeError(f"aotriton flash attention ({op}): query and {name} dtypes differ "
                               f"({query.dtype}, {t.dtype})")
    d, largest = query.size(-1), _aot()._MAX_HEAD_DIM
    if d % 8 != 0 or d == 0 or d > largest:
        _unsupported(op, f"head dim {d} (multiples of 8 up to {largest} are)")
    if value.size(-1) != d or key.size(-1) != d:
        _unsupported(op, f"head dims {d}, {key.size(-1)}, {value.size(-1)} (they must be equal)")


def _kernels_forward(q4, k4, v4, cu_q, cu_k, max_q, max_k, dropout_p, causal, left, right, scale):
    """The aotriton forward over (B, H, S, D) views: (out view, lse, rng_state int64[2])."""
    aot = _aot()
    sm_scale = 1.0 / math.sqrt(q4.size(-1)) if scale is None else float(scale)
    return aot._ops().fwd(q4, k4, v4, None, cu_q, cu_k, int(max_q), int(max_k), sm_scale, bool(causal),
                          left, right, 1, float(dropout_p), aot._allow_tf32(q4.dtype), False, None)


def _kernels_backward(dout4, q4, k4, v4, out4, lse, cu_q, cu_k, max_q, max_k, dropout_p, causal, left, right,
                      rng_state, scale):
    aot = _aot()
    sm_scale = 1.0 / math.sqrt(q4.size(-1)) if scale is None else float(scale)
    if rng_state.dtype == torch.uint64:
        rng_state = rng_state.view(torch.int64)
    if dout4.stride(-1) != 1:
        dout4 = dout4.contiguous()
    if lse.stride(-1) != 1:
        lse = lse.contiguous()
    dq, dk, dv, _ = aot._ops().bwd(dout4, q4, k4, v4, out4, lse, None, False, cu_q, cu_k, int(max_q), int(max_k),
                                   sm_scale, bool(causal), left, right, 1, float(dropout_p), rng_state,
                                   aot._allow_tf32(q4.dtype), torch.are_deterministic_algorithms_enabled(), False,
                                   None)
    return dq, dk, dv


def _seed_offset(rng_state):
    """The (philox_seed, philox_offset) pair the ops return: torch's uint64[2] (seed, offset) and an
    unused uint64 scalar (its meta functions' dtypes and shapes)."""
    return rng_state.view(torch.uint64), torch.zeros((), dtype=torch.uint64, device=rng_state.device)


def _cu_seqlens(op, name, cu, device):
    if cu.device != device:
        raise RuntimeError(f"aotriton flash attention ({op}): {name} is on {cu.device}, query on {device}")
    if cu.dtype != torch.int32:
        raise RuntimeError(f"aotriton flash attention ({op}): {name} must be int32, got {cu.dtype}")
    return cu.contiguous()


def _no_work(query, key):
    """Nothing for the kernels to do: an empty query, or no key at all (rows then see no key)."""
    return query.numel() == 0 or key.numel() == 0


def flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                            return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None,
                            seqused_k=None, alibi_slopes=None, block_table=None, num_splits=None):
    """aten::_flash_attention_forward: dense (B, S, H, D) or packed (total, H, D) with cu_seq_q/k;
    with a ``block_table``, varlen_attn's KV-cache mode (``_kvcache_forward``)."""
    op = "_flash_attention_forward"
    if return_debug_mask:
        _unsupported(op, "return_debug_mask=True")
    if alibi_slopes is not None:
        _unsupported(op, "alibi_slopes")
    if block_table is not None:
        _check_inputs(op, query, key, value)
        return _kvcache_forward(op, query, key, value, cum_seq_q, cum_seq_k, max_q, dropout_p, is_causal, scale,
                                _window(is_causal, window_size_left, window_size_right), seqused_k, block_table,
                                num_splits)
    if seqused_k is not None:
        _unsupported(op, "seqused_k without a block_table")
    if num_splits not in (None, 0, 1):
        _unsupported(op, f"num_splits={num_splits} without a block_table")
    if (cum_seq_q is None) != (cum_seq_k is None):
        raise RuntimeError(f"aotriton flash attention ({op}): cum_seq_q and cum_seq_k must be given together")
    _check_inputs(op, query, key, value)
    packed = cum_seq_q is not None
    left, right = _window(is_causal, window_size_left, window_size_right)
    heads = query.size(-2)
    if packed:
        lse_shape = (heads, query.size(0))
    else:
        lse_shape = (query.size(0), heads, query.size(1))
    if _no_work(query, key):
        out = torch.empty_like(query).zero_()
        lse = torch.full(lse_shape, math.inf, dtype=torch.float32, device=query.device)
        rng = torch.zeros(2, dtype=torch.int64, device=query.device)
        return (out, lse) + _seed_offset(rng) + (query.new_empty(0),)
    if packed:
        cu_q = _cu_seqlens(op, "cum_seq_q", cum_seq_q, query.device)
        cu_k = _cu_seqlens(op, "cum_seq_k", cum_seq_k, query.device)
        q4, k4, v4 = (t.unsqueeze(0).transpose(1, 2) for t in (query, key, value))
        out4, lse, rng = _kernels_forward(q4, k4, v4, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, left, right,
                                          scale)
        out, lse = out4.transpose(1, 2).squeeze(0), lse.squeeze(0)
    else:
        q4, k4, v4 = (t.transpose(1, 2) for t in (query, key, value))
        out4, lse, rng = _kernels_forward(q4, k4, v4, None, None, 0, 0, dropout_p, is_causal, left, right, scale)
        out = out4.transpose(1, 2)
    return (_as_empty_like(out, query), lse) + _seed_offset(rng) + (query.new_empty(0),)


def _kvcache_forward(op, query, key, value, cum_seq_q, cum_seq_k, max_q, dropout_p, is_causal, scale, window,
                     seqused_k, block_table, num_splits):
    """varlen_attn's KV-cache mode through aotriton's KV-cache attention (``flash_attention_kvcache``):
    query packed (total_q, Hq, D) with ``cum_seq_q``, every sequence holding ``max_q`` (1 to 16)
    tokens (total_q = B * max_q, since none has more); key/value the paged cache (num_blocks, page,
    Hk, D) with its int32 ``block_table`` (B, max_blocks); the keys per sequence ``seqused_k`` (else
    cum_seq_k's differences, computed on the device: nothing is read on the host, so a decode step
    stays graph-capturable). Masks bottom-right per sequence, as the op's. Inference only: no
    backward op takes a block table. Returns the op's outputs: out (total_q, Hq, D), lse (Hq, total_q)."""
    if dropout_p:
        _unsupported(op, "dropout with a block_table")
    if cum_seq_q is None:
        _unsupported(op, "a block_table with dense (B, S, H, D) queries")
    batch = cum_seq_q.numel() - 1
    total_q, heads, d = query.shape
    max_q = int(max_q)
    if not 1 <= max_q <= 16 or total_q != batch * max_q:
        _unsupported(op, f"a block_table with {total_q} query tokens over {batch} sequences of at most {max_q} "
                         "(aotriton's KV-cache attention takes the same 1 to 16 tokens in every sequence)")
    if seqused_k is not None:
        lens = _cu_seqlens(op, "seqused_k", seqused_k, query.device)
    elif cum_seq_k is not None:
        cu_k = _cu_seqlens(op, "cum_seq_k", cum_seq_k, query.device)
        lens = cu_k[1:] - cu_k[:-1]
    else:
        _unsupported(op, "a block_table without seqused_k or cum_seq_k")
    out, lse = _aot().flash_attention_kvcache(query.reshape(batch, max_q, heads, d), key, value, lens,
                                              page_table=block_table, scale=scale, causal=is_causal,
                                              window_size=window, num_splits=num_splits or 0, return_lse=True)
    out = out.reshape(total_q, heads, d)
    lse = lse.permute(1, 0, 2).reshape(heads, total_q)
    rng = torch.zeros(2, dtype=torch.int64, device=query.device)
    return (_as_empty_like(out, query), lse) + _seed_offset(rng) + (query.new_empty(0),)


def flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                             dropout_p, is_causal, rng_state, unused, *, scale=None, window_size_left=None,
                             window_size_right=None):
    """aten::_flash_attention_backward: gradients of flash_attention_forward's inputs."""
    op = "_flash_attention_backward"
    _check_inputs(op, query, key, value)
    packed = cum_seq_q is not None
    left, right = _window(is_causal, window_size_left, window_size_right)
    if _no_work(query, key):
        return tuple(torch.empty_like(t).zero_() for t in (query, key, value))
    if packed:
        cu_q = _cu_seqlens(op, "cum_seq_q", cum_seq_q, query.device)
        cu_k = _cu_seqlens(op, "cum_seq_k", cum_seq_k, query.device)
        views = [t.unsqueeze(0).transpose(1, 2) for t in (grad_out, query, key, value, out)]
        dq, dk, dv = _kernels_backward(*views, logsumexp.unsqueeze(0), cu_q, cu_k, max_q, max_k, dropout_p,
                                       is_causal, left, right, rng_state, scale)
        grads = [g.transpose(1, 2).squeeze(0) for g in (dq, dk, dv)]
    else:
        views = [t.transpose(1, 2) for t in (grad_out, query, key, value, out)]
        dq, dk, dv = _kernels_backward(*views, logsumexp, None, None, 0, 0, dropout_p, is_causal, left, right,
                                       rng_state, scale)
        grads = [g.transpose(1, 2) for g in (dq, dk, dv)]
    return tuple(_as_empty_like(g, t) for g, t in zip(grads, (query, key, value)))


def sdpa_flash_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """aten::_scaled_dot_product_flash_attention: (B, H, S, D) inputs, SDPA's flash backend."""
    op = "_scaled_dot_product_flash_attention"
    if return_debug_mask:
        _unsupported(op, "return_debug_mask=True")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise RuntimeError(f"aotriton flash attention ({op}): query, key and value must be 4-D (B, H, S, D)")
    _check_inputs(op, query, key, value)
    sq, sk = query.size(2), key.size(2)
    if _no_work(query, key):
        out = torch.empty_like(query).zero_()
        lse = torch.full((query.size(0), query.size(1), sq), math.inf, dtype=torch.float32, device=query.device)
        rng = torch.zeros(2, dtype=torch.int64, device=query.device)
    else:
        out, lse, rng = _kernels_forward(query, key, value, None, None, 0, 0, dropout_p, is_causal, -1,
                                         0 if is_causal else -1, scale)
        out = _as_empty_like(out, query)
    seed, offset = _seed_offset(rng)
    return out, lse, None, None, sq, sk, seed, offset, query.new_empty(0)


def sdpa_flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                        is_causal, philox_seed, philox_offset, *, scale=None):
    """aten::_scaled_dot_product_flash_attention_backward: dq, dk, dv with q/k/v's strides."""
    op = "_scaled_dot_product_flash_attention_backward"
    _check_inputs(op, query, key, value)
    if _no_work(query, key):
        return tuple(torch.empty_like(t).zero_() for t in (query, key, value))
    dq, dk, dv = _kernels_backward(grad_out, query, key, value, out, logsumexp, None, None, 0, 0, dropout_p,
                                   is_causal, -1, 0 if is_causal else -1, philox_seed, scale)
    return tuple(_as_empty_like(g, t) for g, t in zip((dq, dk, dv), (query, key, value)))


# aten op -> this module's function: the ops torch's registry lets an implementation replace.
KERNELS = {
    "_flash_attention_forward": flash_attention_forward,
    "_flash_attention_backward": flash_attention_backward,
    "_scaled_dot_product_flash_attention": sdpa_flash_forward,
    "_scaled_dot_product_flash_attention_backward": sdpa_flash_backward,
}


class Handle:
    """What activation returns to torch's registry: ``remove()`` takes the kernels out of the
    dispatcher again (torch's own come back)."""

    def __init__(self, library):
        self.library = library

    def remove(self):
        if self.library is not None:
            self.library._destroy()
            self.library = None


def install(dispatch_key="CUDA"):
    """Puts KERNELS behind the aten ops at ``dispatch_key`` (the default overloads; the fp8
    ``quantized`` ones stay torch's) and returns the Handle that undoes it. The registry's
    ``activate_flash_attention_impl("aotriton")`` calls this; tests may name another key."""
    _aot()._ops()  # the extension must be loaded: raises naming why not, before anything changes
    lib = torch.library.Library("aten", "IMPL", dispatch_key)  # noqa: TOR901 (replacing aten kernels is the point)
    try:
        for name, fn in KERNELS.items():
            lib.impl(name, fn, dispatch_key)
    except Exception:
        lib._destroy()
        raise
    return Handle(lib)


def _registry():
    return getattr(torch.nn.attention, "register_flash_attention_impl", None)


def register():
    """Makes "aotriton" one of torch's flash-attention implementations (``import aotriton.torch``
    does this); returns False where this torch has no registry (torch < 2.11)."""
    reg = _registry()
    if reg is None:
        return False
    reg(IMPL_NAME, register_fn=install)
    return True


def is_registered():
    lister = getattr(torch.nn.attention, "list_flash_attention_impls", None)
    return lister is not None and IMPL_NAME in lister()


def activate():
    """``torch.nn.attention.activate_flash_attention_impl("aotriton")`` (registering it first)."""
    if not register():
        raise RuntimeError(f"aotriton: torch {torch.__version__} has no flash-attention registry "
                           "(torch.nn.attention.register_flash_attention_impl, torch >= 2.11)")
    torch.nn.attention.activate_flash_attention_impl(IMPL_NAME)


def deactivate():
    """``torch.nn.attention.restore_flash_attention_impl()``: torch's own kernel again."""
    restore = getattr(torch.nn.attention, "restore_flash_attention_impl", None)
    if restore is not None:
        restore()
