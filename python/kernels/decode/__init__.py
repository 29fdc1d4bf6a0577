"""KV-cache attention for decoding, in ``triton.language`` (every arch): a package of its own so that
editing it leaves the training kernels' compile cache (keyed by ``kernels/flash/``) untouched.

* ``kvcache.py``        -- where key ``j`` of a sequence lives in a dense or paged cache, its length,
  and the bounds on the device words (``cache_seqlens``, page ids) with their status bits;
* ``kvcache_append.py`` -- ``kvcache_append``: this step's new K/V written into the cache;
* ``decode.py``         -- ``attn_decode``: split-KV attention with the GQA group packed into the rows;
* ``decode_combine.py`` -- ``attn_decode_combine``: the splits merged by their LSE.

Contract: ``ABI.md``.  Shared with the training kernels: ``kernels/flash/softmax.py``.
"""
