"""The private Gluon / Triton API the Gluon backward needs -- the one place it is used from.

Triton 3.6.0 Gluon builds, but does not export, a TMA *reduce* (``cp.reduce.async.bulk.tensor``):
``gluon.language.nvidia.hopper.tma`` has loads and stores only.  The backward adds its fp32 dQ
partials to the workspace with it (``bwd.py``, the dQ reducer warp), so it is wrapped here:

* ``tma_reduce_add(desc, coord, src)``: ``global[desc @ coord] += src`` (shared memory), an
  asynchronous bulk tensor reduce in the TMA (async) proxy.  Like ``tma.async_copy_shared_to_global``
  it joins the thread's bulk group: ``tma.store_wait(n)`` waits for it (and after that ``src`` may be
  overwritten).  Callers publish ``src`` first (generic-proxy stores: ``fence_async_shared()``,
  then a barrier / mbarrier hand-off).  Built on ``GluonOpBuilder.create_async_tma_reduce(kind,
  desc, coord, smem)`` and ``ir.DESCRIPTOR_REDUCE_KIND.ADD``, both private (``triton._C.libtriton``).

Nothing else private is used: the per-row LSE/delta tiles are read through a public
``shared_memory_descriptor.reshape``.

On a Triton bump, re-check (``python/tests/test_gluon_private_api.py`` does it on the CPU: it
compiles a kernel using every entry below for sm_90 and looks for the reduce in the PTX):

1. ``triton._C.libtriton.ir.DESCRIPTOR_REDUCE_KIND.ADD`` still exists;
2. the Gluon builder still has ``create_async_tma_reduce(kind, desc_handle, coords, smem_handle)``
   with that argument order (it lowers to ``ttng.async_tma_reduce``);
3. ``triton.experimental.gluon.language._core.builtin`` and the ``_semantic`` keyword protocol of
   builtins (``_semantic._convert_to_ir_values``, ``_semantic.builder``) are unchanged;
4. whether upstream Gluon now exports a TMA reduce (``tma.async_reduce`` or similar): then switch
   ``bwd.py`` to it and delete this module.
"""
from triton._C.libtriton import ir as _ir
from triton.experimental.gluon.language._core import builtin

__all__ = ["tma_reduce_add"]


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """``global[tensor_desc @ coord] += src``: asynchronous TMA reduce-add from shared memory.

    ``src`` has the descriptor's block shape and layout.  Completes like a TMA store
    (``tma.store_wait``); elements outside the tensor are clipped.
    """
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)
