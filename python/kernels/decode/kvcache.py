"""The KV cache of the decode kernels: where key ``j`` of sequence ``z`` lives, and how long it is.

A cache is dense (``PAGED`` 0: ``[B, CACHE_CAPACITY, Hk, D]`` with strides ``(stride_?z,
stride_?n, stride_?h)``) or paged (``PAGED`` 1: a pool ``[N_PAGES, 2**PAGE_SIZE_LOG2, Hk, D]``
whose page ``p`` has stride ``stride_?z``; sequence ``z``'s key ``j`` is row ``j % page size`` of
page ``PAGE_TABLE[z, j // page size]``).  The decode kernel walks a paged cache a block of
``BLOCK_N`` keys at a time (``block_page_ids``, ``page_rows``); a kernel with ``SMALL_PAGE`` 0 serves
pages of at least ``BLOCK_N`` keys (one page per block), one with ``SMALL_PAGE`` 16 or 32 pages of
exactly that many keys, smaller than ``BLOCK_N`` (the runtime picks the kernel by the page size).
Contract: ``ABI.md``.

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
def block_page_ids(page_table, first, end, n_slots, PAGE_SIZE_LOG2, SMALL_PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """The page ids of keys ``[first, first + BLOCK_N)`` (``first`` a multiple of ``BLOCK_N``) from
    one sequence's ``page_table`` row of ``n_slots`` entries: a scalar, the block's one page
    (``SMALL_PAGE`` 0), or the ``BLOCK_N // SMALL_PAGE`` pages it spans.  Slots of keys at or past
    ``end`` read as 0 and are never followed (``page_rows`` leaves their keys out of range); none
    lies past the row, whatever the run-time page size (``n_slots >= 1`` wherever ``end > 0``).
    The scalar's slot is clamped rather than masked: a mask there costs the AMD hd256 kernel a
    36-byte stack object."""
    if SMALL_PAGE == 0:
        slot = first >> PAGE_SIZE_LOG2
        return tl.load(page_table + tl.minimum(slot, n_slots - 1), mask=first < end, other=0)
    else:
        slots = first // SMALL_PAGE + tl.arange(0, BLOCK_N // SMALL_PAGE)
        return tl.load(page_table + slots, mask=(slots * SMALL_PAGE < end) & (slots < n_slots), other=0)


@triton.jit
def page_rows(keys, in_range, ids, PAGE_SIZE_LOG2, N_PAGES, SMALL_PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(block, row, ok)`` per key of a block (as ``key_rows``) from its page ids (``block_page_ids``):
    the page holding it (int64; a scalar with ``SMALL_PAGE`` 0), its row there (masked by the
    run-time page size, so inside a page whatever kernel runs) and whether it may be read."""
    ids_ok = (ids >= 0) & (ids < N_PAGES)
    ids = tl.where(ids_ok, ids, 0)
    if SMALL_PAGE != 0:
        # Each id repeated over its page's SMALL_PAGE keys.
        n_ids: tl.constexpr = BLOCK_N // SMALL_PAGE
        ids = tl.reshape(tl.broadcast_to(ids[:, None], (n_ids, SMALL_PAGE)), (BLOCK_N,))
        ids_ok = tl.reshape(tl.broadcast_to(ids_ok[:, None], (n_ids, SMALL_PAGE)), (BLOCK_N,))
    return ids.to(tl.int64), keys & ((1 << PAGE_SIZE_LOG2) - 1), in_range & ids_ok


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
