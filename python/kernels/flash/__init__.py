"""FlashAttention kernels written in ``triton.language`` (the portable family).

Split by concern, like FlashAttention-3's ``hopper/`` directory:

* ``mask.py``    -- which (query, key) pairs are visible, and the key-block loop bounds;
* ``softmax.py`` -- the online-softmax update and the epilogue (normalisation, LSE);
* ``fwd.py``     -- the ``attn_fwd`` kernel: program scheduling, main loop, epilogue.
"""
