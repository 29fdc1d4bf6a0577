"""FlashAttention-2's Python functions, computed by aotriton: swap the import and nothing else.

    from aotriton.flash_attn import flash_attn_func, flash_attn_varlen_func   # was: from flash_attn import ...

Names, argument order, defaults, layouts and results are FlashAttention-2's (``flash_attn``
2.x, ``flash_attn_interface``): q ``(B, Sq, Hq, D)``, k/v ``(B, Sk, Hk, D)`` (Hq a multiple of Hk);
packed ``(total, H, D)`` with int32 ``cu_seqlens``; fp16 or bf16 (fp32 too); any head dim up to
512 (dims that are not multiples of 8 are zero-padded, as FlashAttention does); v may have its own
head dim Dv (the output's, as FlashAttention-3's ``hdim_v``: DeepSeek MLA's 192/128, 128/64). ``causal`` and
``window_size=(left, right)`` are aligned bottom-right (query i of Sq sees key j iff
``i + Sk - Sq - left <= j <= i + Sk - Sq + right``, -1 unbounded; ``causal`` sets right to 0).
``softmax_scale`` defaults to ``1/sqrt(D)``; ``dropout_p`` draws from torch's CUDA generator;
``deterministic=True`` makes the backward's dq summation order fixed.

Results: ``out`` in q's layout. FlashAttention's ``return_attn_probs=True`` (out, softmax_lse,
S_dmask) needs the attention probabilities, which these kernels never materialize: it raises
``NotImplementedError`` naming it. ``return_softmax_lse=True`` (the name FlashAttention's
``flash_attn_with_kvcache`` uses) returns ``(out, softmax_lse)``: fp32 natural-log LSE,
``(B, Hq, Sq)`` or, packed, ``(Hq, total_q)``. ``softcap`` > 0 caps the scores (fp16/bf16,
without dropout). ``alibi_slopes`` (fp32 ``(Hq,)`` or ``(B, Hq)``) adds FlashAttention's ALiBi,
``-slope * |i + Sk - Sq - j|`` (fp16/bf16, without dropout or softcap). An option aotriton does
not have (``block_table`` of ``flash_attn_varlen_func``) raises ``NotImplementedError`` naming it; nothing is launched.
``flash_attn_with_kvcache`` (a decode step over a dense or paged KV cache, the step's k/v appended
in place, ``block_table`` for pages) runs aotriton's KV-cache attention (fp16/bf16, Sq <= 16).
``float8_e4m3fn`` q, k, v (sm_90) run FlashAttention-3's fp8 forward with its ``q_descale``,
``k_descale``, ``v_descale`` (fp32 ``(B, Hk)``): bf16 out, forward only, head dims multiples of 16.
"""
import math

import torch  # the real torch (absolute import)

from aotriton import torch as aot

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]


def _refuse(return_attn_probs, block_table=None):
    if return_attn_probs:
        raise NotImplementedError("aotriton.flash_attn: return_attn_probs=True is not supported (the attention "
                                  "probabilities are never materialized); return_softmax_lse=True returns "
                                  "(out, softmax_lse)")
    if block_table is not None:
        raise NotImplementedError("aotriton.flash_attn: block_table (paged KV) is not supported by the varlen "
                                  "functions; flash_attn_with_kvcache takes it")


def _padded(q, k, v, softmax_scale):
    """q, k, v with each head dim (Q/K's, V's) zero-padded to a multiple of 8 (the padded lanes
    add nothing to q.k and give output lanes that are cut off again), the scale of Q/K's true head
    dim, and V's true head dim (the output's)."""
    d, dv = q.size(-1), v.size(-1)
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)

    def pad(t):
        n = t.size(-1)
        return t if n % 8 == 0 or n > aot._MAX_HEAD_DIM else torch.nn.functional.pad(t, (0, 8 - n % 8))
    return pad(q), pad(k), pad(v), scale, dv


def _result(out, lse, d, return_softmax_lse):
    if out.size(-1) != d:
        out = out[..., :d]
    return (out, lse) if return_softmax_lse else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, return_softmax_lse=False,
                    sinks=None, q_descale=None, k_descale=None, v_descale=None):
    """q (B, Sq, Hq, D), k/v (B, Sk, Hk, D) -> out (B, Sq, Hq, D) (module docs). ``sinks`` (an aotriton
    extension): attention sinks, fp32 (Hq,) (aotriton.torch.flash_attention). float8_e4m3fn q, k, v
    take FlashAttention-3's fp8 forward: ``q/k/v_descale`` fp32 (B, Hk) (None: ones), out bf16,
    forward only (aotriton.torch.flash_attention_fp8)."""
    _refuse(return_attn_probs)
    if q.dtype == torch.float8_e4m3fn:
        unsupported = [name for name, on in (("dropout_p", dropout_p != 0.0), ("softcap", softcap != 0.0),
                                             ("alibi_slopes", alibi_slopes is not None), ("sinks", sinks is not None))
                       if on]
        if unsupported:
            raise NotImplementedError(f"aotriton.flash_attn: the fp8 forward has no {', '.join(unsupported)}")
        out, lse = aot.flash_attention_fp8(q, k, v, q_descale, k_descale, v_descale, causal=causal,
                                           window_size=window_size, align="bottom_right", scale=softmax_scale,
                                           layout="bshd", return_lse=True)
        return (out, lse) if return_softmax_lse else out
    q, k, v, scale, d = _padded(q, k, v, softmax_scale)
    out, lse, _ = aot.flash_attention(q, k, v, causal=causal, window_size=window_size, align="bottom_right",
                                      dropout_p=dropout_p, scale=scale, layout="bshd", return_aux=True,
                                      deterministic=deterministic, softcap=softcap, alibi_slopes=alibi_slopes,
                                      sinks=sinks)
    return _result(out, lse, d, return_softmax_lse)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                             return_softmax_lse=False):
    """q (B, Sq, Hq, D), kv (B, Sk, 2, Hk, D)."""
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, return_softmax_lse=return_softmax_lse)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                              return_softmax_lse=False):
    """qkv (B, S, 3, H, D)."""
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size,
                           softcap, alibi_slopes, deterministic, return_attn_probs,
                           return_softmax_lse=return_softmax_lse)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           return_softmax_lse=False, sinks=None):
    """q (total_q, Hq, D), k/v (total_k, Hk, D), cu_seqlens int32 (B+1) -> out (total_q, Hq, D).
    Offsets are read on the device and clamped to the tensors (aotriton.torch.flash_attn_varlen).
    ``sinks``: as :func:`flash_attn_func`'s."""
    _refuse(return_attn_probs, block_table)
    q, k, v, scale, d = _padded(q, k, v, softmax_scale)
    out, lse, _ = aot.flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                        dropout_p=dropout_p, softmax_scale=scale, causal=causal,
                                        window_size=window_size, align="bottom_right", return_aux=True,
                                        deterministic=deterministic, softcap=softcap,
                                        alibi_slopes=alibi_slopes, sinks=sinks)
    return _result(out, lse, d, return_softmax_lse)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                                    return_softmax_lse=False):
    """q (total_q, Hq, D), kv (total_k, 2, Hk, D)."""
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, return_softmax_lse=return_softmax_lse)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, return_softmax_lse=False):
    """qkv (total, 3, H, D)."""
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, return_softmax_lse=return_softmax_lse)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                            cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """FlashAttention-2's decode call over a KV cache (aotriton.torch.flash_attention_kvcache).

    q ``(B, Sq, Hq, D)`` (Sq <= 16); k_cache/v_cache ``(B, S_cache, Hk, D)``, or with ``block_table``
    (int32 ``(B, max_blocks)``) paged ``(num_blocks, page_block_size, Hk, D)`` (page_block_size a power
    of two in 16..256); ``cache_seqlens``: int32 ``(B,)`` tensor or a Python int, the cached lengths
    (None: the caches are full, ``S_cache`` or ``max_blocks * page_block_size`` keys per sequence;
    not allowed with k/v). ``k``/``v`` ``(B, N_NEW, Hk, D)`` are written into the caches in place at
    ``cache_seqlens`` first, and attended to. ``causal`` and ``window_size`` are bottom-right aligned
    (query t of Sq at position ``cache_seqlens + N_NEW - Sq + t``). Returns out ``(B, Sq, Hq, D)``, or
    ``(out, softmax_lse)`` with ``return_softmax_lse`` (fp32 ``(B, Hq, Sq)``). Not supported (raise
    ``NotImplementedError`` naming them, nothing launched): rotary_cos/rotary_sin, cache_batch_idx,
    cache_leftpad, softcap, alibi_slopes; ``rotary_interleaved`` is only read with rotary.
    """
    unsupported = [name for name, on in (("rotary_cos", rotary_cos is not None), ("rotary_sin", rotary_sin is not None),
                                         ("cache_batch_idx", cache_batch_idx is not None),
                                         ("cache_leftpad", cache_leftpad is not None),
                                         ("softcap", softcap != 0.0), ("alibi_slopes", alibi_slopes is not None))
                   if on]
    if unsupported:
        raise NotImplementedError(f"aotriton.flash_attn.flash_attn_with_kvcache: {', '.join(unsupported)} "
                                  "not supported")
    if (k is None) != (v is None):
        raise ValueError("aotriton.flash_attn.flash_attn_with_kvcache: give k and v together, or neither")
    batch = q.size(0)
    if cache_seqlens is None:
        if k is not None:
            raise ValueError("aotriton.flash_attn.flash_attn_with_kvcache: k and v are appended at cache_seqlens; "
                             "give cache_seqlens with them")
        full = k_cache.size(1) * (block_table.size(1) if block_table is not None else 1)
        cache_seqlens = torch.full((batch,), full, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    return aot.flash_attention_kvcache(q, k_cache, v_cache, cache_seqlens, k_new=k, v_new=v, page_table=block_table,
                                       scale=softmax_scale, causal=causal, window_size=window_size,
                                       num_splits=num_splits, return_lse=return_softmax_lse)
