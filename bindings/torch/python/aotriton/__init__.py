"""aotriton: ahead-of-time compiled Triton FlashAttention.

Python bindings for PyTorch live in :mod:`aotriton.torch` (``import aotriton.torch``; importing it
also registers "aotriton" as one of torch's flash-attention implementations, see
:mod:`aotriton.flash_impl`); FlashAttention-2's functions in :mod:`aotriton.flash_attn`; the
Hugging Face transformers integration in :mod:`aotriton.hf`. Importing this package loads nothing.
"""
__all__ = ["torch", "flash_attn", "flash_impl", "hf"]
