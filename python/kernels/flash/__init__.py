"""FlashAttention kernels written in ``triton.language`` (the portable family).

One kernel family per file, shared pieces as ``@triton.jit`` helpers used by
forward and backward alike (split by concern, like FlashAttention-3's ``hopper/``):

* ``mask.py``           -- which (query, key) pairs are visible (tails, the general runtime window),
  and the block-loop bounds (leading masked / full / trailing masked) that must agree with the mask;
* ``softmax.py``        -- the online-softmax step and epilogue (forward), P recomputation and
  ``dS = P * (dP - delta)`` (backward);
* ``tiles.py``          -- tile loads/stores with the head-dim mask ``d < D_HEAD``; ``mma`` (IEEE/TF32 fp32 dots);
* ``varlen.py``         -- where sequence ``b`` of a (packed) batch lives;
* ``dropout.py``        -- the Philox dropout stream and its counter layout;
* ``bias.py``           -- the additive bias load;
* ``softcap.py``        -- logit soft-capping ``cap * tanh(s / cap)`` and its gradient;
* ``alibi.py``          -- ALiBi's linear bias ``-slope * |i + diag - j|``;
* ``sinks.py``          -- attention sinks: a logit per head in each row's softmax normaliser;
* ``fwd.py``            -- ``attn_fwd``: O and (optionally) LSE;
* ``bwd_preprocess.py`` -- ``attn_bwd_preprocess``: ``delta = rowsum(dO * O)``;
* ``bwd_dkdv.py``       -- ``attn_bwd_dkdv``: dK, dV per K/V block, summed over the GQA group in-program;
* ``bwd_dq.py``         -- ``attn_bwd_dq``: dQ per query block;
* ``bwd_dbias.py``      -- ``attn_bwd_dbias``: dBias, reduced over the bias's broadcast dimensions;
* ``bwd_dsink.py``      -- ``attn_bwd_dsink``: the sinks' gradient, summed per head in a fixed order;
* ``debug_dropout.py``  -- ``debug_dropout_mask``: the dropout keep mask, for tests and debugging.

Argument order of every attention kernel: pointers (BIAS last, DBIAS after it),
``sm_scale``, strides (bias, then dbias strides last), kernel-specific integers,
the attention group, the dropout group (forward: plus its Philox outputs), constexprs.
"""
