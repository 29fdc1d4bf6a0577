"""``kvcache_append``: this step's new keys and values written into the KV cache.

Token ``t`` of ``K_NEW``/``V_NEW`` (``[B, N_NEW, Hk, D]``) of sequence ``z`` goes to key position
``start + t`` of the cache, ``start`` the sequence's cached length (``kvcache.cache_length``).  Rows
on a page id outside ``[0, N_PAGES)`` are skipped (and reported).  Contract: ``ABI.md``.

Grid ``(cdiv(N_NEW, BLOCK_M), B * N_HEADS_K)``; one program copies ``BLOCK_M`` tokens of one KV
head, keys and values.
"""
import triton
import triton.language as tl

from .kvcache import cache_length, key_rows, report_bad_pages, row_offset


@triton.jit
def kvcache_append(K_NEW, V_NEW, K, V, PAGE_TABLE, CACHE_SEQLENS, KV_STATUS,
                   stride_xkz, stride_xkh, stride_xkm, stride_xvz, stride_xvh, stride_xvm,
                   stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn, stride_ptz,
                   N_NEW, N_HEADS_K, D_HEAD, CACHE_CAPACITY, PAGE_SIZE_LOG2, N_PAGES, STORE_KV_STATUS,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, PAGED: tl.constexpr):
    zh = tl.program_id(1)
    z = zh // N_HEADS_K
    hk = zh % N_HEADS_K
    start, _ = cache_length(CACHE_SEQLENS, z, N_NEW, CACHE_CAPACITY, KV_STATUS, STORE_KV_STATUS)
    tokens = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    in_range = tokens < N_NEW
    block, row, ok = key_rows(start + tokens, in_range, z, PAGE_TABLE, stride_ptz, PAGE_SIZE_LOG2, N_PAGES, PAGED)
    k_off = row_offset(block, row, stride_kz, stride_kn)
    v_off = row_offset(block, row, stride_vz, stride_vn)
    d_ok = offs_d[None, :] < D_HEAD
    src = z.to(tl.int64) * stride_xkz + hk.to(tl.int64) * stride_xkh + tokens[:, None] * stride_xkm + offs_d[None, :]
    k = tl.load(K_NEW + src, mask=in_range[:, None] & d_ok)
    tl.store(K + hk.to(tl.int64) * stride_kh + k_off[:, None] + offs_d[None, :], k, mask=ok[:, None] & d_ok)
    src = z.to(tl.int64) * stride_xvz + hk.to(tl.int64) * stride_xvh + tokens[:, None] * stride_xvm + offs_d[None, :]
    v = tl.load(V_NEW + src, mask=in_range[:, None] & d_ok)
    tl.store(V + hk.to(tl.int64) * stride_vh + v_off[:, None] + offs_d[None, :], v, mask=ok[:, None] & d_ok)
    report_bad_pages(tl.sum((in_range & ~ok).to(tl.int32), 0), KV_STATUS, STORE_KV_STATUS, PAGED)
