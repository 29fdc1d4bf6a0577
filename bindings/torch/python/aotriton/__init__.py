"""aotriton: ahead-of-time compiled Triton FlashAttention.

Python bindings for PyTorch live in :mod:`aotriton.torch` (``import aotriton.torch``); the
Hugging Face transformers integration in :mod:`aotriton.hf`. Importing this package loads nothing.
"""
__all__ = ["torch", "hf"]
