"""FlashAttention kernels written in Gluon for Hopper (sm_90): the fast path of ``attn_fwd``/``attn_bwd``.

Warp-specialized (a TMA loader warp feeding two consumer warpgroups through mbarrier rings),
wgmma for both products, host-side rank-4 TMA descriptors for Q/K/V/O.  The contract with the
build rules and the Rust runtime (arguments, descriptor blocks, grid, semantics) is ``ABI.md``;
the mask semantics and loop bounds are those of the portable family (``kernels/flash/mask.py``),
whose scalar helpers these kernels call directly.

* ``softmax.py`` -- the online-softmax step and epilogue on Gluon register tensors;
* ``fwd.py``     -- ``attn_fwd_gluon``: O and (optionally) LSE.
"""
