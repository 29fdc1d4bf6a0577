"""PyTorch front end of aotriton's FlashAttention (forward and backward, CUDA tensors).

Entry points (all differentiable through ``torch.autograd.Function``):

* :func:`scaled_dot_product_attention` -- a drop-in for ``torch.nn.functional.
  scaled_dot_product_attention`` (same arguments, layouts and semantics).
* :func:`flash_attention` -- the padded ``(B, H, S, D)`` (or ``(B, S, H, D)``) layout with sliding
  windows, bottom-right alignment, an additive bias and dropout.
* :func:`flash_attn_varlen` -- packed variable-length batches, ``(total, H, D)`` tensors plus
  ``cu_seqlens`` offsets (flash-attn's ``flash_attn_varlen_func`` layout).
* :func:`flash_attention_kvcache` -- a decode step over a dense or paged KV cache, appending the
  step's keys and values in place (forward only; FlashAttention's ``flash_attn_with_kvcache``).
* :func:`dropout_mask` -- the keep-mask a dropout call used, from its ``rng_state``.

The ops behind them are ``torch.ops.aotriton.{fwd,bwd,dropout_mask}`` (C++, library
``aotriton._C``), with fake (meta) implementations so ``torch.compile`` can trace them.

Dropout and torch's RNG: randomness comes from torch's default CUDA generator of the inputs'
device, so ``torch.manual_seed`` / ``torch.cuda.manual_seed`` make it reproducible. Each forward
call with ``dropout_p > 0`` takes the generator's current (seed, offset) and advances its Philox
offset by :func:`philox_increment` ``(B, Hq, Sq, Sk)`` =
``B * Hq * 8*ceil(Sq / 16) * 4*ceil(Sk / 16)`` rounded up to a multiple of 4 (for packed batches B is the number of
sequences and Sq, Sk the max lengths). The (seed, offset) actually used is written by the forward
kernel into an int64[2] ``rng_state`` tensor kept for the backward, which regenerates exactly the
forward's mask. Under CUDA graph capture the kernels read the generator's graph-safe seed/offset
slots (refreshed by every replay), so each replay draws a new mask and its backward still matches.

Importing this module registers "aotriton" as one of torch's flash-attention implementations
(torch >= 2.11; see :mod:`aotriton.flash_impl`): ``torch.nn.attention.activate_flash_attention_impl(
"aotriton")`` (or :func:`activate`) then makes torch's own SDPA flash backend, ``varlen_attn`` and
context parallel run aotriton, with no model change.

Importing this module needs neither a GPU nor the compiled extension; calls raise a clear error
when either is missing.
"""
import importlib
import math
import os
import warnings

import torch  # the real torch: this package's module is aotriton.torch (absolute import)

__all__ = [
    "scaled_dot_product_attention",
    "flash_attention",
    "flash_attn_varlen",
    "flash_attention_kvcache",
    "dropout_mask",
    "philox_increment",
    "is_available",
    "version",
    "activate",
    "deactivate",
]

# Torch's own SDPA, kept before anyone can monkeypatch it (used for empty inputs).
_torch_sdpa = torch.nn.functional.scaled_dot_product_attention

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: The largest head-dim bucket the library compiles (python/rules.py HEAD_DIMS); head dims above 256
#: run on the portable kernels under every backend.
_MAX_HEAD_DIM = 512
#: float32 stops at 256 (rules.FP32_MAX_HEAD_DIM: its backward's fp32 tiles do not fit above).
_FP32_MAX_HEAD_DIM = 256
_load_error = None


def _load():
    """Loads the C++ ops (``aotriton._C``, or the library named by ``$AOTRITON_TORCH_LIBRARY``)."""
    global _load_error
    try:
        path = os.environ.get("AOTRITON_TORCH_LIBRARY")
        if path:
            torch.ops.load_library(path)
        else:
            importlib.import_module("aotriton._C")
        _register_fakes()
    except Exception as e:  # keep import working: report at call time
        _load_error = e


def _keeps_layout(t):
    """Whether the C++ ops' alloc_like gives an output ``t``'s own strides (which is also what
    ``torch.empty_like(t)`` gives): ``t`` non-overlapping and dense (c10's test, written out
    because FakeTensor has no such method) with a unit last stride."""
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz >= 2):
        if stride != expected:
            return False
        expected *= size
    return t.stride(-1) == 1


def _fwd_kvcache_fake(q, k_cache, v_cache, cache_seqlens, k_new, v_new, page_table, sm_scale, causal, window_left,
                      window_right, num_splits, return_lse):
    """aotriton::fwd_kvcache's fake: out contiguous (B, Sq, Hq, D) in q's dtype, lse fp32 (B, Hq, Sq)
    (or (0,) without return_lse); the caches are mutated in place (the schema's (a!), (b!))."""
    b, s, h, _ = q.shape
    lse = q.new_empty((b, h, s) if return_lse else (0,), dtype=torch.float32)
    return q.new_empty(q.shape), lse


def _register_fakes():
    """Meta/fake implementations: output shapes, dtypes and strides exactly as the C++ ops make."""

    def like(t, d=None, dtype=None):  # alloc_like in the C++ ops: t's strides when dense with a unit last stride
        dtype = t.dtype if dtype is None else dtype
        if _keeps_layout(t) and d in (None, t.size(3)):
            return t.new_empty_strided(t.shape, t.stride(), dtype=dtype)
        b, h, s, d0 = t.shape
        d = d0 if d is None else d
        if _keeps_layout(t) and t.stride(1) >= t.stride(2):  # (B,H,S,D) memory
            return t.new_empty((b, h, s, d), dtype=dtype)
        return t.new_empty((b, s, h, d), dtype=dtype).transpose(1, 2)

    @torch.library.register_fake("aotriton::fwd")
    def _fwd_fake(q, k, v, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale, causal,
                  window_left, window_right, align, dropout_p, allow_tf32, check_cu_seqlens=False, varlen_status=None,
                  softcap=0.0, alibi_slopes=None, sinks=None):
        b, h, s, _ = q.shape
        out = like(q, v.size(3))  # O has V's head dim
        lse = q.new_empty((b, h, s), dtype=torch.float32)
        rng_state = q.new_empty((2,), dtype=torch.int64)
        return out, lse, rng_state

    @torch.library.register_fake("aotriton::bwd")
    def _bwd_fake(dout, q, k, v, out, lse, bias, bias_requires_grad, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                  max_seqlen_k, sm_scale, causal, window_left, window_right, align, dropout_p, rng_state,
                  allow_tf32, deterministic, check_cu_seqlens=False, varlen_status=None, softcap=0.0,
                  alibi_slopes=None, sinks=None, dsinks=None):
        dq = like(q)
        dk = like(k)
        dv = like(v)
        dbias = bias.new_empty(bias.shape) if bias_requires_grad else q.new_empty((0,))
        return dq, dk, dv, dbias

    @torch.library.register_fake("aotriton::fwd_fp8")
    def _fwd_fp8_fake(q, k, v, q_descale, k_descale, v_descale, sm_scale, causal, window_left, window_right, align):
        b, h, s, _ = q.shape
        return like(q, dtype=torch.bfloat16), q.new_empty((b, h, s), dtype=torch.float32)

    torch.library.register_fake("aotriton::fwd_kvcache")(_fwd_kvcache_fake)

    @torch.library.register_fake("aotriton::dropout_mask")
    def _mask_fake(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p):
        return rng_state.new_empty((batch, heads, seqlen_q, seqlen_k), dtype=torch.float32)


_load()


def is_available():
    """True when the C++ ops are loaded and a CUDA device is visible."""
    return _load_error is None and torch.cuda.is_available()


def _ops():
    if _load_error is not None:
        raise RuntimeError(
            "aotriton: the PyTorch extension (aotriton._C) could not be loaded: "
            f"{type(_load_error).__name__}: {_load_error}. Build it with "
            "`python bindings/torch/build.py --prefix <aotriton install>` and put bindings/torch/python "
            "on PYTHONPATH.") from _load_error
    return torch.ops.aotriton


def version():
    """The aotriton library's version string (e.g. ``0.1.0 (sm_90)``)."""
    return _ops().version()


def philox_increment(batch, heads_q, seqlen_q, seqlen_k):
    """How far one dropout call advances torch's CUDA generator offset:
    ``dropout_offsets_consumed(B, Hq, Sq, Sk)`` (= ``B*Hq*8*ceil(Sq/16)*4*ceil(Sk/16)``) rounded up to a multiple of 4."""
    n = int(_ops().dropout_offsets_consumed(batch, heads_q, seqlen_q, seqlen_k))
    return (n + 3) // 4 * 4


def dropout_mask(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p):
    """The keep-mask (fp32 ``B x H x Sq x Sk``, 1 = kept) of the dropout call whose forward wrote
    ``rng_state`` (returned by ``flash_attention(..., return_aux=True)``). Debugging/testing aid
    (calls ``flash::debug_dropout_mask``); kept values are scaled by ``1 / (1 - dropout_p)``."""
    if not rng_state.is_cuda:
        raise ValueError("aotriton: rng_state must be the CUDA int64[2] tensor a forward returned")
    return _ops().dropout_mask(rng_state, int(batch), int(heads), int(seqlen_q), int(seqlen_k), float(dropout_p))


def _tf32_flag():
    """torch's matmul TF32 switch (read without its deprecation warnings)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return bool(torch.backends.cuda.matmul.allow_tf32)
        except Exception:
            return torch.get_float32_matmul_precision() != "highest"


try:  # torch.compile: read the flag at trace time instead of tracing the warnings machinery
    _tf32_flag = torch._dynamo.assume_constant_result(_tf32_flag)
except Exception:
    pass


def _allow_tf32(dtype):
    return dtype == torch.float32 and _tf32_flag()


class _FlashAttnFunction(torch.autograd.Function):
    """out, lse, rng_state = attention(q, k, v, bias); lse and rng_state are not differentiable.
    Packed batches: check_cu_seqlens checks the offsets once, in the forward (the backward takes the
    same saved tensors, which autograd guarantees unchanged); varlen_status records in both."""

    @staticmethod
    def forward(ctx, q, k, v, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale, causal,
                window_left, window_right, align, dropout_p, allow_tf32, check_cu_seqlens=False, varlen_status=None,
                deterministic=False, softcap=0.0, alibi_slopes=None, sinks=None):
        out, lse, rng_state = _ops().fwd(q, k, v, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                         sm_scale, causal, window_left, window_right, align, dropout_p, allow_tf32,
                                         check_cu_seqlens, varlen_status, softcap, alibi_slopes, sinks)
        ctx.save_for_backward(q, k, v, out, lse, rng_state, bias, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks)
        ctx.args = (max_seqlen_q, max_seqlen_k, sm_scale, causal, window_left, window_right, align, dropout_p,
                    allow_tf32)
        ctx.varlen_status = varlen_status
        ctx.deterministic = deterministic
        ctx.softcap = softcap
        ctx.mark_non_differentiable(lse, rng_state)
        return out, lse, rng_state

    @staticmethod
    def backward(ctx, dout, _dlse, _drng):
        q, k, v, out, lse, rng_state, bias, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks = ctx.saved_tensors
        (max_seqlen_q, max_seqlen_k, sm_scale, causal, window_left, window_right, align, dropout_p,
         allow_tf32) = ctx.args
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        bias_grad = bool(ctx.needs_input_grad[3]) and bias is not None
        # The sinks (the last input) have a gradient when they require one.
        dsinks = torch.empty_like(sinks) if sinks is not None and ctx.needs_input_grad[-1] else None
        dq, dk, dv, dbias = _ops().bwd(dout, q, k, v, out, lse, bias, bias_grad, cu_seqlens_q, cu_seqlens_k,
                                       max_seqlen_q, max_seqlen_k, sm_scale, causal, window_left, window_right,
                                       align, dropout_p, rng_state, allow_tf32,
                                       ctx.deterministic or torch.are_deterministic_algorithms_enabled(), False,
                                       ctx.varlen_status, ctx.softcap, alibi_slopes, sinks, dsinks)
        # The ALiBi slopes are constants of the model: no gradient.
        return (dq, dk, dv, dbias if bias_grad else None) + (None,) * 16 + (dsinks,)


def _unit_last_stride(t):
    return t if t.stride(-1) == 1 or t.size(-1) <= 1 else t.contiguous()


def _align_code(align):
    if align in ("top_left", 0):
        return 0
    if align in ("bottom_right", 1):
        return 1
    raise ValueError(f"aotriton: align must be 'top_left' or 'bottom_right', got {align!r}")


def _window(window_size):
    try:
        left, right = (int(w) for w in window_size)
    except Exception:
        raise ValueError(f"aotriton: window_size must be a pair (left, right), got {window_size!r}") from None
    for w in (left, right):
        if w < -1:
            raise ValueError(f"aotriton: window sizes are -1 (unbounded) or >= 0, got {window_size!r}")
    return left, right


def _check_common(q, k, v, what):
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"aotriton: {name} must be a tensor, got {type(t).__name__}")
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError(f"aotriton: expected query, key and value to have the same dtype, got "
                           f"{q.dtype}, {k.dtype} and {v.dtype}")
    if q.dtype not in _SUPPORTED_DTYPES:
        raise NotImplementedError(f"aotriton: dtype {q.dtype} is not supported (float16, bfloat16, float32)")
    if not (q.device == k.device == v.device):
        raise RuntimeError(f"aotriton: query, key and value are on different devices ({q.device}, {k.device}, "
                           f"{v.device})")
    if q.device.type != "cuda":
        raise NotImplementedError(f"aotriton: {what} runs on CUDA tensors only, got device {q.device}")
    d, dk, dv = q.size(-1), k.size(-1), v.size(-1)
    if dk != d:
        raise RuntimeError(f"aotriton: query head dim {d} differs from key head dim {dk}")
    for name, n in (("head dim", d), ("value head dim", dv)):
        if n % 8 != 0 or n == 0:
            raise NotImplementedError(f"aotriton: {name} {n} is not a multiple of 8")
        if n > _MAX_HEAD_DIM:
            raise NotImplementedError(f"aotriton: {name} {n} is above {_MAX_HEAD_DIM}")
        if q.dtype == torch.float32 and n > _FP32_MAX_HEAD_DIM:
            raise NotImplementedError(f"aotriton: {name} {n} is above {_FP32_MAX_HEAD_DIM} for float32 "
                                      f"(float16 and bfloat16 go to {_MAX_HEAD_DIM})")
    # V's own head dim (O and its gradient follow it): the library compiles it for fp16/bf16 in
    # the bucket pairs 256/128 (DeepSeek MLA's 192/128) and 128/64, and names what it lacks.
    if dv != d and q.dtype == torch.float32:
        raise NotImplementedError(f"aotriton: value head dim {dv} differs from query head dim {d}: float16 and "
                                  "bfloat16 only")


def _check_dropout(dropout_p):
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"aotriton: dropout_p must be in [0, 1), got {dropout_p}")
    return p


def _check_softcap(softcap):
    """softcap as a float: 0 (off) or finite and positive (the library checks the dtype and the
    options it combines with)."""
    value = float(softcap)
    if not (value == 0.0 or (math.isfinite(value) and value > 0.0)):
        raise ValueError(f"aotriton: softcap must be 0 (off) or finite and positive, got {softcap}")
    return value


def _fp32_argument(t, name, shapes, described):
    """A float32 tensor argument (ALiBi slopes, sinks) whose shape is one of ``shapes``
    (``described`` names them in the error)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"aotriton: {name} must be a tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"aotriton: {name} must be float32, got {t.dtype}")
    if tuple(t.shape) not in shapes:
        raise ValueError(f"aotriton: {name} must have shape {described}, got {tuple(t.shape)}")
    return t


def _check_alibi(alibi_slopes, batch, heads_q):
    """FlashAttention's ALiBi slopes, fp32 ``(Hq,)`` or ``(B, Hq)``, as the ``(1 or B, Hq)`` view
    the ops take (unit last stride); None stays None. The library checks the rest (dtype of the
    inputs, the options it combines with)."""
    if alibi_slopes is None:
        return None
    _fp32_argument(alibi_slopes, "alibi_slopes", ((heads_q,), (1, heads_q), (batch, heads_q)),
                   f"(Hq,) or (B, Hq) = ({heads_q},) or ({batch}, {heads_q})")
    return _unit_last_stride(alibi_slopes.reshape(-1, heads_q))


def _check_sinks(sinks, heads_q):
    """Attention sinks: a float32 tensor of shape (Hq,) (unit stride), or None."""
    if sinks is None:
        return None
    return _unit_last_stride(_fp32_argument(sinks, "sinks", ((heads_q,),), f"(Hq,) = ({heads_q},)"))


def _bias_from_mask(mask, shape, dtype, name):
    """An additive bias [B or 1, Hq or 1, Sq or 1, Sk] (unit last stride) from a bool mask (True =
    take part; -> 0 / -inf) or a float mask, broadcast like torch SDPA. Autograd flows through the
    views and casts, so a float mask's gradient comes back in its own shape."""
    if mask is None:
        return None
    b, h, sq, sk = shape
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"aotriton: {name} must be a tensor or None, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask.logical_not(),
                                                                                       float("-inf"))
    elif mask.is_floating_point():
        if mask.dtype != dtype:
            mask = mask.to(dtype)
    else:
        raise TypeError(f"aotriton: {name} must be bool or floating point, got {mask.dtype}")
    if mask.dim() > 4:
        raise RuntimeError(f"aotriton: {name} has {mask.dim()} dims; it must broadcast to (B, Hq, Sq, Sk)")
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    full = (b, h, sq, sk)
    if any(mask.size(i) not in (1, full[i]) for i in range(4)):
        raise RuntimeError(f"aotriton: {name} of shape {tuple(mask.shape)} is not broadcastable to "
                           f"(B, Hq, Sq, Sk) = {full}")
    if mask.size(3) != sk:
        mask = mask.expand(mask.size(0), mask.size(1), mask.size(2), sk)
    if mask.device.type != "cuda":
        raise RuntimeError(f"aotriton: {name} must be on the inputs' CUDA device, got {mask.device}")
    return _unit_last_stride(mask)


def _attention(q, k, v, bias, sm_scale, causal, window_left, window_right, align, dropout_p,
               cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, check_cu_seqlens=False,
               varlen_status=None, deterministic=False, softcap=0.0, alibi_slopes=None, sinks=None):
    q, k, v = _unit_last_stride(q), _unit_last_stride(k), _unit_last_stride(v)
    return _FlashAttnFunction.apply(q, k, v, bias, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                                    float(sm_scale), bool(causal), int(window_left), int(window_right), int(align),
                                    float(dropout_p), _allow_tf32(q.dtype), bool(check_cu_seqlens), varlen_status,
                                    bool(deterministic), float(softcap), alibi_slopes, sinks)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """``torch.nn.functional.scaled_dot_product_attention`` computed by aotriton.

    query ``(B, Hq, Sq, D)``, key/value ``(B, Hk, Sk, D)`` (or 3-D without the batch), any strides
    (a non-unit last stride costs a copy); fp16, bf16 or fp32; D a multiple of 8 up to 512 (fp32: 256).
    ``attn_mask``: bool (True = take part) or float (added to the scores), broadcastable to
    ``(B, Hq, Sq, Sk)``; a float mask that requires grad gets its gradient in its own shape.
    ``is_causal``: query i sees keys j <= i (top-left, as torch). ``scale``: default 1/sqrt(D).
    ``enable_gqa``: Hq a multiple of Hk (without it Hq must equal Hk, or Hk be 1 as torch's
    broadcasting allows). ``dropout_p`` applies whenever it is > 0 (like torch's functional);
    it advances torch's CUDA generator by ``philox_increment(B, Hq, Sq, Sk)`` (module docs).
    Unsupported inputs raise ``NotImplementedError`` naming the feature.
    """
    squeeze = False
    if query.dim() == 3 and key.dim() == 3 and value.dim() == 3:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
        squeeze = True
    elif not (query.dim() == 4 and key.dim() == 4 and value.dim() == 4):
        raise NotImplementedError(f"aotriton: scaled_dot_product_attention takes 3-D or 4-D query/key/value, got "
                                  f"{query.dim()}-D, {key.dim()}-D and {value.dim()}-D")
    _check_common(query, key, value, "scaled_dot_product_attention")
    p = _check_dropout(dropout_p)
    b, hq, sq, d = query.shape
    bk, hk, sk, _ = key.shape
    bv, hv, sv, _ = value.shape
    if not (b == bk == bv):
        raise RuntimeError(f"aotriton: query, key and value batch sizes differ ({b}, {bk}, {bv})")
    if sk != sv:
        raise RuntimeError(f"aotriton: key and value sequence lengths differ ({sk}, {sv})")
    if is_causal and attn_mask is not None:
        raise RuntimeError("aotriton: _scaled_dot_product_attention: Explicit attn_mask should not be set when "
                           "is_causal=True")
    if enable_gqa:
        if hk == 0 or hq % hk != 0 or hv == 0 or hq % hv != 0:
            raise RuntimeError(f"aotriton: number of heads in key and value must divide the number of heads in "
                               f"query (query {hq}, key {hk}, value {hv})")
    elif not (hq == hk == hv or (hk == hv == 1)):
        raise RuntimeError(f"aotriton: query has {hq} heads but key has {hk} and value {hv}; torch requires equal "
                           "head counts unless enable_gqa=True")
    if hk != hv:
        raise NotImplementedError(f"aotriton: key and value must have the same number of heads ({hk} vs {hv})")
    if b == 0 or hq == 0 or sq == 0 or sk == 0:  # nothing for the kernels to do: torch's semantics
        out = _torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=p, is_causal=is_causal, scale=scale,
                          enable_gqa=enable_gqa)
        return out.squeeze(0) if squeeze else out
    sm_scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    bias = _bias_from_mask(attn_mask, (b, hq, sq, sk), query.dtype, "attn_mask")
    out, _, _ = _attention(query, key, value, bias, sm_scale, is_causal, -1, -1, 0, p)
    return out.squeeze(0) if squeeze else out


def flash_attention(q, k, v, causal=False, window_size=(-1, -1), align="top_left", bias=None, dropout_p=0.0,
                    scale=None, layout="bhsd", return_aux=False, deterministic=False, softcap=0.0, alibi_slopes=None,
                    sinks=None):
    """Attention over padded batches with every aotriton option.

    ``layout="bhsd"``: q ``(B, Hq, Sq, D)``, k/v ``(B, Hk, Sk, D)``; ``"bshd"``: ``(B, S, H, D)``
    (flash-attn's layout; the output follows the same layout). Hq a multiple of Hk (GQA/MQA).
    Query i sees key j iff ``i + off - left <= j <= i + off + right`` with ``(left, right) =
    window_size`` (-1 = unbounded) and ``off = 0`` (``align="top_left"``) or ``Sk - Sq``
    (``"bottom_right"``, torch's ``causal_lower_right`` and flash-attn's causal); ``causal=True``
    sets right to 0. A query row that sees no key gets zeros. ``bias``: bool or float mask like
    :func:`scaled_dot_product_attention`'s ``attn_mask`` (differentiable). ``scale`` default 1/sqrt(D).
    ``return_aux=True`` returns ``(out, lse, rng_state)``: the natural-log log-sum-exp fp32
    ``(B, Hq, Sq)`` (+inf for rows with no key) and the int64[2] (seed, offset) of the dropout.
    ``deterministic=True``: the backward sums dq in a fixed order (as under
    ``torch.use_deterministic_algorithms``). ``softcap`` > 0: logit soft-capping (Gemma 2), each
    scaled score s becomes ``softcap * tanh(s / softcap)`` before bias and mask; fp16/bf16 without
    dropout or bias (0, the default, is off). ``alibi_slopes``: ALiBi, fp32 ``(Hq,)`` or
    ``(B, Hq)``; query head h adds ``-slope[h] * |i + off - j|`` to score (i, j), ``off`` = 0 with
    ``align="top_left"``, Sk - Sq with ``"bottom_right"`` (FlashAttention's convention, also without
    a mask); fp16/bf16 without dropout, bias or softcap. The slopes get no gradient.
    ``sinks``: attention sinks (gpt-oss), float32 ``(Hq,)`` logits that join each row's softmax
    normaliser with no value; the LSE includes them and they get a gradient when they require one;
    fp16/bf16 without dropout, bias, softcap or ALiBi.
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"aotriton: layout must be 'bhsd' or 'bshd', got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"aotriton: flash_attention takes 4-D q, k, v; {name} is "
                             f"{t.dim() if isinstance(t, torch.Tensor) else type(t).__name__}-D")
    if layout == "bshd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    _check_common(q, k, v, "flash_attention")
    p = _check_dropout(dropout_p)
    left, right = _window(window_size)
    code = _align_code(align)
    b, hq, sq, d = q.shape
    _, hk, sk, _ = k.shape
    # V's head dim may differ from K's (checked by _check_common); the other dims must agree.
    if k.shape[:3] != v.shape[:3] or k.size(0) != b:
        raise RuntimeError(f"aotriton: k and v must be (B, Hk, Sk, D) and (B, Hk, Sk, Dv) with q's batch; "
                           f"got q {tuple(q.shape)}, "
                           f"k {tuple(k.shape)}, v {tuple(v.shape)} (layout {layout})")
    if hk == 0 or hq % hk != 0:
        raise RuntimeError(f"aotriton: q has {hq} heads, not a multiple of k's {hk}")
    if b == 0 or hq == 0 or sq == 0 or sk == 0:
        raise ValueError(f"aotriton: empty input (B {b}, Hq {hq}, Sq {sq}, Sk {sk})")
    sm_scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    bias = _bias_from_mask(bias, (b, hq, sq, sk), q.dtype, "bias")
    out, lse, rng_state = _attention(q, k, v, bias, sm_scale, causal, left, right, code, p,
                                     deterministic=deterministic, softcap=_check_softcap(softcap),
                                     alibi_slopes=_check_alibi(alibi_slopes, b, hq), sinks=_check_sinks(sinks, hq))
    if layout == "bshd":
        out = out.transpose(1, 2)
    return (out, lse, rng_state) if return_aux else out


def flash_attention_fp8(q, k, v, q_descale=None, k_descale=None, v_descale=None, causal=False, window_size=(-1, -1),
                        align="top_left", scale=None, layout="bhsd", return_lse=False):
    """The fp8 (e4m3) forward on sm_90 (FlashAttention-3's): q, k, v ``torch.float8_e4m3fn`` in
    ``layout`` (``"bhsd"``: ``(B, H, S, D)``, ``"bshd"``: ``(B, S, H, D)``), head dim a multiple of 16
    up to 256, Hq a multiple of Hk; ``q/k/v_descale``: fp32 ``(B, Hk)`` dequantisation factors
    (positive; None: ones), so the scores are ``scale * q_descale * k_descale * q.k`` and the output
    is scaled by ``v_descale``. Returns ``out`` (bfloat16, q's layout) and with ``return_lse`` the
    fp32 LSE ``(B, Hq, Sq)`` of the descaled scores. Forward only (no autograd); masks as
    :func:`flash_attention`'s. V is transposed into a workspace from torch's allocator first."""
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"aotriton: layout must be 'bhsd' or 'bshd', got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"aotriton: flash_attention_fp8 takes 4-D q, k, v; {name} is not")
        if t.dtype != torch.float8_e4m3fn:
            raise NotImplementedError(f"aotriton: flash_attention_fp8 takes float8_e4m3fn q, k, v; {name} is {t.dtype}")
    if layout == "bshd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    left, right = _window(window_size)
    b, hk = k.size(0), k.size(1)
    descales = []
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            t = torch.ones((b, hk), device=q.device, dtype=torch.float32)
        elif not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != (b, hk):
            raise ValueError(f"aotriton: {name} must be a float32 tensor of shape (B, Hk) = ({b}, {hk}), got "
                             f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
        descales.append(t)
    sm_scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)
    out, lse = _ops().fwd_fp8(_unit_last_stride(q), _unit_last_stride(k), _unit_last_stride(v), *descales, sm_scale,
                              bool(causal), left, right, _align_code(align))
    if layout == "bshd":
        out = out.transpose(1, 2)
    return (out, lse) if return_lse else out


#: The most query tokens per sequence of one KV-cache call (flash.h kKvCacheMaxQueryTokens).
_KVCACHE_MAX_QUERY_TOKENS = 16
#: The most splits of the cache (flash.h kKvCacheMaxSplits).
_KVCACHE_MAX_SPLITS = 128


def flash_attention_kvcache(q, k_cache, v_cache, cache_seqlens, k_new=None, v_new=None, page_table=None, scale=None,
                            causal=False, window_size=(-1, -1), num_splits=0, return_lse=False):
    """Attention of a decode step's query tokens over a KV cache (flash.h ``attn_fwd_kvcache``).

    Token-major layouts: q ``(B, Sq, Hq, D)`` with 1 <= Sq <= 16, fp16 or bf16, D a multiple of 8 up
    to 256; a dense cache ``(B, S_cache, Hk, D)``, or with ``page_table`` (int32 ``(B, MAX_PAGES)``)
    a pool of pages ``(N_PAGES, PAGE_SIZE, Hk, D)`` (PAGE_SIZE a power of two in 16..256), where key
    j of sequence b is row ``j % PAGE_SIZE`` of page ``page_table[b, j // PAGE_SIZE]``; Hq a multiple
    of Hk. The caches need a unit last stride (they are written in place: never copied here).
    ``cache_seqlens``: int32 ``(B,)`` CUDA tensor (other integer dtypes are converted), each
    sequence's cached length before this step; read by the kernels only, so the call can be
    captured in a CUDA graph and replayed with new lengths. ``k_new``/``v_new`` ``(B, N_NEW, Hk, D)``:
    written into the caches at rows ``cache_seqlens[b] ..`` before attending (both or neither).

    Sequence b attends over ``L = cache_seqlens[b] + N_NEW`` keys; query token t sits at position
    ``L - Sq + t`` (masks always bottom-right: ``causal`` sees keys up to its own position,
    ``window_size=(left, right)`` counts from there, -1 unbounded). ``scale`` default 1/sqrt(D).
    ``num_splits``: 0 lets the library split the cache (flash-decoding), else at most 128 chunks.
    Returns out ``(B, Sq, Hq, D)`` (contiguous) and with ``return_lse`` the fp32 natural-log LSE
    ``(B, Hq, Sq)`` (+inf for a row that sees no key, whose out is 0). Lengths outside
    ``[0, capacity - N_NEW]`` are clamped and page ids outside ``[0, N_PAGES)`` skipped, on the device
    (nothing outside the tensors is touched). Forward only (no autograd).
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"aotriton: flash_attention_kvcache takes 4-D q, k_cache, v_cache; {name} is "
                             f"{t.dim() if isinstance(t, torch.Tensor) else type(t).__name__}-D")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1 and t.size(-1) > 1:
            raise ValueError(f"aotriton: {name} must have a unit last stride (it is written in place, never copied)")
    if (k_new is None) != (v_new is None):
        raise ValueError("aotriton: k_new and v_new go together: give both or neither")
    if not 1 <= q.size(1) <= _KVCACHE_MAX_QUERY_TOKENS:
        raise ValueError(f"aotriton: flash_attention_kvcache takes 1..{_KVCACHE_MAX_QUERY_TOKENS} query tokens per "
                         f"sequence, got Sq {q.size(1)} (use flash_attention for a longer prefill)")
    left, right = _window(window_size)
    splits = int(num_splits)
    if not 0 <= splits <= _KVCACHE_MAX_SPLITS:
        raise ValueError(f"aotriton: num_splits must be in 0..{_KVCACHE_MAX_SPLITS} (0: the library's rule), "
                         f"got {num_splits}")
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dim() != 1:
        raise ValueError("aotriton: cache_seqlens must be a 1-D (B,) integer tensor")
    if cache_seqlens.dtype != torch.int32:
        if cache_seqlens.dtype.is_floating_point or cache_seqlens.dtype == torch.bool:
            raise TypeError(f"aotriton: cache_seqlens must be int32, got {cache_seqlens.dtype}")
        cache_seqlens = cache_seqlens.to(torch.int32)
    cache_seqlens = cache_seqlens.contiguous()
    if page_table is not None:
        if not isinstance(page_table, torch.Tensor) or page_table.dim() != 2:
            raise ValueError("aotriton: page_table must be a 2-D (B, MAX_PAGES) int32 tensor")
        if page_table.dtype != torch.int32:
            raise TypeError(f"aotriton: page_table must be int32, got {page_table.dtype}")
        page_table = _unit_last_stride(page_table)
    if k_new is not None:
        k_new, v_new = _unit_last_stride(k_new), _unit_last_stride(v_new)
    sm_scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)
    out, lse = _ops().fwd_kvcache(_unit_last_stride(q), k_cache, v_cache, cache_seqlens, k_new, v_new, page_table,
                                  sm_scale, bool(causal), left, right, splits, bool(return_lse))
    return (out, lse) if return_lse else out


def flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                      softmax_scale=None, causal=False, window_size=(-1, -1), align="top_left", return_aux=False,
                      check_cu_seqlens=False, varlen_status=None, deterministic=False, softcap=0.0,
                      alibi_slopes=None, sinks=None):
    """Attention over a packed batch of variable-length sequences (flash-attn's varlen layout).

    q ``(total_q, Hq, D)``, k/v ``(total_k, Hk, D)``; sequence b owns query tokens
    ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and key tokens ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``
    (int32 CUDA tensors of B+1 offsets starting at 0, B <= 65535; other integer dtypes are
    converted). ``max_seqlen_q/k`` (Python ints) must bound every sequence's length. Masks use each
    sequence's own lengths: ``align="top_left"`` (default, torch's causal) or ``"bottom_right"``
    (flash-attn's causal). Output ``(total_q, Hq, D)``; tokens past ``cu_seqlens_q[-1]`` get zeros.
    Dropout advances the generator by ``philox_increment(B, Hq, max_seqlen_q, max_seqlen_k)``.
    ``return_aux=True`` adds the LSE ``(Hq, total_q)`` and the int64[2] rng_state.

    The offsets are read by the kernels on the device. ``check_cu_seqlens=False`` (default): they
    are not checked, but the kernels clamp every sequence to the packed tensors (start and end
    within ``[0, total]``, length at most the max length), so nothing outside q, k, v and the
    outputs is read or written; invalid offsets give *clamped results, not an error*.
    ``varlen_status``: an int32 one-element CUDA tensor, zeroed by the caller, into which the
    forward and backward OR 1 (an offset outside ``[0, total]``), 2 (offsets decrease) or 4 (a
    sequence longer than its max length) when they clamped; read it after the call.
    ``check_cu_seqlens=True``: the forward copies the offsets to the host first (one
    device-to-host copy that waits for the stream: a sync per call, and not allowed under CUDA
    graph capture) and checks them (start at 0, non-decreasing, within the tensors, no sequence
    above the max lengths); invalid offsets raise ``ValueError`` naming the problem and nothing is
    launched. ``deterministic=True``: the backward sums dq in a fixed order. ``softcap``: as
    :func:`flash_attention`'s; ``alibi_slopes`` too, with B the number of sequences and positions
    counted inside each sequence; ``sinks`` too.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"aotriton: flash_attn_varlen takes (total, H, D) tensors; {name} is not 3-D")
    _check_common(q, k, v, "flash_attn_varlen")
    p = _check_dropout(dropout_p)
    left, right = _window(window_size)
    code = _align_code(align)
    if k.shape[:2] != v.shape[:2]:
        raise RuntimeError(f"aotriton: k and v differ in tokens or heads ({tuple(k.shape)} vs {tuple(v.shape)})")
    hq, hk, d = q.size(1), k.size(1), q.size(2)
    if hk == 0 or hq % hk != 0:
        raise RuntimeError(f"aotriton: q has {hq} heads, not a multiple of k's {hk}")
    cus = []
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2:
            raise ValueError(f"aotriton: {name} must be a 1-D tensor of B+1 >= 2 offsets")
        if cu.device != q.device:
            raise RuntimeError(f"aotriton: {name} is on {cu.device}, q on {q.device}")
        cus.append(cu.to(torch.int32).contiguous() if cu.dtype != torch.int32 else cu.contiguous())
    if cus[0].numel() != cus[1].numel():
        raise ValueError("aotriton: cu_seqlens_q and cu_seqlens_k must have the same length (B+1)")
    max_q, max_k = int(max_seqlen_q), int(max_seqlen_k)
    if max_q <= 0 or max_k <= 0:
        raise ValueError(f"aotriton: max_seqlen_q/k must be > 0, got {max_q}, {max_k}")
    sm_scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    q4 = _unit_last_stride(q).unsqueeze(0).transpose(1, 2)  # [1, Hq, total_q, D]
    k4 = _unit_last_stride(k).unsqueeze(0).transpose(1, 2)
    v4 = _unit_last_stride(v).unsqueeze(0).transpose(1, 2)
    if varlen_status is not None and not (isinstance(varlen_status, torch.Tensor) and
                                          varlen_status.dtype == torch.int32 and varlen_status.numel() == 1):
        raise ValueError("aotriton: varlen_status must be a one-element int32 CUDA tensor (zeroed by the caller)")
    out, lse, rng_state = _attention(q4, k4, v4, None, sm_scale, causal, left, right, code, p,
                                     cus[0], cus[1], max_q, max_k, check_cu_seqlens, varlen_status, deterministic,
                                     _check_softcap(softcap), _check_alibi(alibi_slopes, cus[0].numel() - 1, q.shape[1]),
                                     _check_sinks(sinks, q.shape[1]))
    out = out.transpose(1, 2).squeeze(0)
    return (out, lse.squeeze(0), rng_state) if return_aux else out


# torch's flash-attention registry (torch >= 2.11): registered at import, activated by the user.
from aotriton import flash_impl as _flash_impl  # noqa: E402  (needs the helpers above)

_flash_impl.register()
activate = _flash_impl.activate
deactivate = _flash_impl.deactivate
