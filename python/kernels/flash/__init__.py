"""FlashAttention kernels written in ``triton.language`` (the portable family).

One kernel family per file, shared pieces as ``@triton.jit`` helpers used by
forward and backward alike (split by concern, like FlashAttention-3's ``hopper/``):

* ``mask.py``           -- which (query, key) pairs are visible (tails, the general window), and the
  block-loop bounds (leading masked / full / trailing masked) that must agree with the mask;
* ``softmax.py``        -- the online-softmax step and epilogue (forward), P recomputation and
  ``dS = P * (dP - delta)`` (backward);
* ``tiles.py``          -- tile loads/stores with the head-dim mask ``d < D_HEAD``;
* ``fwd.py``            -- ``attn_fwd``: O and (optionally) LSE;
* ``bwd_preprocess.py`` -- ``attn_bwd_preprocess``: ``delta = rowsum(dO * O)``;
* ``bwd_dkdv.py``       -- ``attn_bwd_dkdv``: dK, dV per K/V block, summed over the GQA group in-program;
* ``bwd_dq.py``         -- ``attn_bwd_dq``: dQ per query block.
"""
