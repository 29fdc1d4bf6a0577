"""Hugging Face transformers integration: attention through aotriton.

    import aotriton.hf
    name = aotriton.hf.register()          # "aotriton"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name)
    # or, for an existing model: aotriton.hf.use(model)

``register`` adds :func:`attention_forward` to transformers' ``AttentionInterface`` (transformers
>= 4.48; older versions expose the same table as ``modeling_utils.ALL_ATTENTION_FUNCTIONS``) with
the masks of the ``flash_attention_2`` implementation: none when no token is padding, else the 2-D
padding mask. The attention then runs as FlashAttention-2 does under transformers, on aotriton's
FlashAttention-2-compatible functions (:mod:`aotriton.flash_attn`): no padding -> one call over
(B, S, H, D) views; padding -> the real tokens packed into a variable-length batch and the output
scattered back (padding rows get zeros); ``is_causal`` bottom-right aligned (so decoding one
token against a longer cache is causal too); ``sliding_window`` W (Mistral, Qwen2 with
``use_sliding_window``, ...) as the window ``(W - 1, 0)``: query i sees keys i - W + 1 .. i, as
transformers' sliding-window mask; padding-free packed batches (one row whose ``position_ids``
restart, as transformers' ``DataCollatorWithFlattening`` makes them) as one packed batch of those
sequences. ``softcap`` (Gemma 2's attention logit soft-capping) and ``s_aux`` (gpt-oss's attention
sinks, taken in fp32 with their gradient) are passed on. Not served (``NotImplementedError`` naming
it): ``position_bias``. Where transformers has no registry, :func:`patch_sdpa` swaps
``torch.nn.functional.scaled_dot_product_attention`` for aotriton's while a model runs.
"""
import contextlib

import torch  # the real torch (absolute import)

from aotriton import flash_attn as fa
from aotriton import torch as aot

__all__ = ["attention_forward", "register", "use", "patch_sdpa"]


def _unpad(x, mask):
    """x (B, S, H, D), mask (B, S) bool -> (the real tokens (total, H, D), int32 offsets (B+1), the
    longest sequence). One host read of the longest length, as transformers' own unpadding does."""
    lengths = mask.sum(dim=1, dtype=torch.int32)
    cu = torch.nn.functional.pad(torch.cumsum(lengths, dim=0, dtype=torch.int32), (1, 0))
    return x[mask], cu, int(lengths.max().item())


def _packed_offsets(position_ids, batch, q_len, kv_len):
    """The sequence offsets of a padding-free packed row (one row whose position ids restart at
    their minimum), or None: more than one row, a decoding step, or one sequence."""
    if position_ids is None or batch != 1 or q_len != kv_len or position_ids.shape[-1] != q_len:
        return None
    ids = position_ids.reshape(-1)
    starts = (ids == ids.min()).nonzero().view(-1)
    if starts.numel() < 2:
        return None
    cu = torch.cat([starts, torch.tensor([ids.numel()], device=ids.device)]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max().item())


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, is_causal=None, **kwargs):
    """transformers' attention-function signature: query (B, Hq, Sq, D), key/value (B, Hk, Sk, D),
    ``attention_mask`` None or the (B, Sk) padding mask (``flash_attention_mask``); returns
    ``(output (B, Sq, Hq, D), None)``."""
    cap = float(softcap or 0.0)
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError("aotriton.hf: position_bias is not supported")
    # gpt-oss's sinks: one logit per query head, in the model's dtype; the cast keeps autograd.
    sinks = kwargs.get("s_aux")
    extra = {} if sinks is None else {"sinks": sinks.float().reshape(-1)}
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    window = (-1, -1) if not sliding_window else (int(sliding_window) - 1, -1)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (B, S, H, D) views, no copy
    if attention_mask is not None and attention_mask.dim() == 4:
        raise NotImplementedError("aotriton.hf: a 4-D attention mask (register() gives transformers the "
                                  "flash_attention_2 masks: none, or the 2-D padding mask)")
    if attention_mask is None:  # flash_attention_mask: no padding token
        packed = _packed_offsets(kwargs.get("position_ids"), q.shape[0], q.shape[1], k.shape[1])
        if packed is not None:
            cu, longest = packed
            out = fa.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, longest, longest, dropout_p=dropout,
                                            softmax_scale=scaling, causal=causal, window_size=window, softcap=cap,
                                            **extra)
            return out.unsqueeze(0), None
        out = fa.flash_attn_func(q, k, v, dropout_p=dropout, softmax_scale=scaling, causal=causal, window_size=window,
                                 softcap=cap, **extra)
        return out, None
    kv_mask = attention_mask[:, -k.shape[1]:].bool()
    q_mask = kv_mask[:, -q.shape[1]:]
    q_packed, cu_q, max_q = _unpad(q, q_mask)
    k_packed, cu_k, max_k = _unpad(k, kv_mask)
    v_packed = v[kv_mask]
    out_packed = fa.flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_q, cu_k, max(max_q, 1), max(max_k, 1),
                                           dropout_p=dropout, softmax_scale=scaling, causal=causal,
                                           window_size=window, softcap=cap, **extra)
    out = out_packed.new_zeros(q.shape)
    out[q_mask] = out_packed
    return out, None


def _interfaces():
    """(attention table, mask table or None): the registries this transformers version has."""
    try:
        import transformers
    except ImportError:
        return None, None
    attn = getattr(transformers, "AttentionInterface", None)
    if attn is None:
        try:
            from transformers.modeling_utils import AttentionInterface as attn
        except ImportError:
            attn = None
    if attn is None:
        try:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as attn
        except ImportError:
            attn = None
    mask = getattr(transformers, "AttentionMaskInterface", None)
    if mask is None:
        try:
            from transformers.masking_utils import AttentionMaskInterface as mask
        except ImportError:
            mask = None
    return attn, mask


def register(name="aotriton", fn=None):
    """Registers ``name`` as a transformers attention implementation (``fn``, default
    :func:`attention_forward`); returns the name, or None if this transformers has no attention
    registry (use :func:`patch_sdpa` then)."""
    fn = attention_forward if fn is None else fn
    attn, mask = _interfaces()
    if attn is None:
        return None
    if hasattr(attn, "register"):
        attn.register(name, fn)
    else:  # a plain dict-like table
        attn[name] = fn
    if mask is not None:
        try:
            from transformers.masking_utils import flash_attention_mask
            mask.register(name, flash_attention_mask)
        except Exception:
            pass  # no mask registry: transformers then passes no mask (causal is still applied)
    return name


def use(model, name="aotriton", fn=None):
    """Switches an existing model to aotriton attention (registering it first)."""
    if register(name, fn) is None:
        raise RuntimeError("aotriton: this transformers version has no AttentionInterface; use patch_sdpa()")
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name
    return model


@contextlib.contextmanager
def patch_sdpa():
    """While active, ``torch.nn.functional.scaled_dot_product_attention`` is aotriton's (for models
    that call it directly, e.g. transformers' ``sdpa`` implementation)."""
    original = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = aot.scaled_dot_product_attention
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
