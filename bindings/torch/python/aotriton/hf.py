"""Hugging Face transformers integration: attention through aotriton.

    import aotriton.hf
    name = aotriton.hf.register()          # "aotriton"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name)
    # or, for an existing model: aotriton.hf.use(model)

``register`` adds :func:`attention_forward` to transformers' ``AttentionInterface`` (transformers
>= 4.48; older versions expose the same table as ``modeling_utils.ALL_ATTENTION_FUNCTIONS``) and
gives it the masks of the ``sdpa`` implementation. Where neither exists, :func:`patch_sdpa` swaps
``torch.nn.functional.scaled_dot_product_attention`` for aotriton's while a model runs.
"""
import contextlib

import torch  # the real torch (absolute import)

from aotriton import torch as aot

__all__ = ["attention_forward", "register", "use", "patch_sdpa"]


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """transformers' attention-function signature: query (B, Hq, S, D), key/value (B, Hk, S, D);
    returns ``(output (B, S, Hq, D), None)``. Mirrors transformers' ``sdpa_attention_forward``:
    causal via ``is_causal`` when no mask is given (and more than one query), else the mask."""
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("aotriton: attention softcap is not supported")
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError("aotriton: position_bias is not supported by this integration")
    q_len = query.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    is_causal = bool(q_len > 1 and attention_mask is None and is_causal)
    if attention_mask is not None and attention_mask.dim() == 4:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    if is_causal and key.shape[2] > q_len:  # prefill into a longer static cache: keys past Sq are empty
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out = aot.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                           scale=scaling, is_causal=is_causal,
                                           enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


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
            from transformers.masking_utils import sdpa_mask
            mask.register(name, sdpa_mask)
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
