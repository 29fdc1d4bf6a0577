"""The KV cache of the decode kernels: where key ``j`` of sequence ``z`` lives, and how long it is.

A cache is dense (``PAGED`` 0: ``[B, CACHE_CAPACITY, Hk, D]`` with strides ``(stride_?z,
stride_?n, stride_?h)``) or paged (``PAGED`` 1: a pool ``[N_PAGES, 2**PAGE_SIZE_LOG2, Hk, D]``
whose page ``p`` has stride ``stride_?z``; sequence ``z``'s key ``j`` is row ``j % page size`` of
page ``PAGE_TABLE[z, j // page size]``).  Contract: ``ABI.md``.

The caller's ``cache_seqlens`` and page ids live on the device and are never read on the host,
so these helpers bound them: every address the kernels form lies inside the caller's tensors,
whatever those words hold.  What they bound is OR-ed into ``*KV_STATUS`` when ``STORE_KV_STATUS``
is 1 (the Rust API's ``flash::KV_*`` constants carry the same values).
"""
import triton
import triton.language as tl

KV_SEQLEN_OUT_OF_RANGE: tl.constexpr = tl.constexpr(1)
KV_PAGE_OUT_OF_RANGE: tl.constexpr = tl.constexpr(2)


@triton.jit
def cache_length(CACHE_SEQLENS, z, N_NEW, CACHE_CAPACITY, KV_STATUS, STORE_KV_STATUS):
    """``(start, length)`` of sequence ``z``: its cached tokens before this step's ``N_NEW`` appended
    ones (``cache_seqlens[z]`` clamped to ``[0, CACHE_CAPACITY - N_NEW]``) and the keys attended over
    (``start + N_NEW``)."""
    raw = tl.load(CACHE_SEQLENS + z)
    start = tl.minimum(tl.maximum(raw, 0), CACHE_CAPACITY - N_NEW)
    if STORE_KV_STATUS != 0:
        if start != raw:
            tl.atomic_or(KV_STATUS, KV_SEQLEN_OUT_OF_RANGE)
    return start, start + N_NEW


@triton.jit
def key_rows(keys, in_range, z, PAGE_TABLE, stride_ptz, PAGE_SIZE_LOG2, N_PAGES, PAGED: tl.constexpr):
    """``(block, row, ok)`` per key of ``keys`` (positions in sequence ``z``): the cache's outer index
    holding it (dense: ``z``; paged: its page, int64), its row there, and whether it may be read:
    inside ``in_range`` and, paged, on a page id in ``[0, N_PAGES)``.  The element offset of its row
    in a cache is ``block * stride_?z + row * stride_?n`` (``row_offset``)."""
    if PAGED:
        slot = keys >> PAGE_SIZE_LOG2
        page = tl.load(PAGE_TABLE + z.to(tl.int64) * stride_ptz + slot, mask=in_range, other=0)
        ok = in_range & (page >= 0) & (page < N_PAGES)
        block = tl.where(ok, page, 0).to(tl.int64)
        row = keys & ((1 << PAGE_SIZE_LOG2) - 1)
    else:
        ok = in_range
        block = z.to(tl.int64)
        row = keys
    return block, row, ok


@triton.jit
def row_offset(block, row, stride_z, stride_n):
    """Element offset of a key's row in one cache (``key_rows``); the row part in int32 (the runtime
    guarantees ``CACHE_CAPACITY * stride_n`` fits)."""
    return block * stride_z + row * stride_n


@triton.jit
def report_bad_pages(n_bad, KV_STATUS, STORE_KV_STATUS, PAGED: tl.constexpr):
    """OR ``KV_PAGE_OUT_OF_RANGE`` into the status word when ``n_bad`` (the keys in range whose page id
    was not) is not 0."""
    if PAGED:
        if STORE_KV_STATUS != 0:
            if n_bad != 0:
                tl.atomic_or(KV_STATUS, KV_PAGE_OUT_OF_RANGE)
