"""KV-cache attention for decoding (flash-decoding): ``attn_decode``.

``O = softmax(sm_scale * Q K^T + mask) V`` for each sequence's ``N_CTX_Q`` (1-16) newest query
tokens over its cached keys, the cache dense or paged (``kvcache.py``).  Contract, shapes and
the argument list: ``ABI.md``.

Two things make it a kernel of its own rather than ``attn_fwd`` with a short Q:

* **GQA packing.**  One program serves every query row of a KV head: the ``GQA_GROUP * N_CTX_Q``
  rows (row ``r``: query head ``hk * GQA_GROUP + r // N_CTX_Q``, token ``r % N_CTX_Q``) form the M
  dimension of the dots, so each K/V element is read from memory once per group instead of once per
  query head.  The M tile is at least 16 rows (``tl.dot``'s minimum); the padding rows cost
  arithmetic, not memory, and decoding is bound by memory.
* **Split-KV.**  A decode step has few programs (``B * Hk``), too few to fill the GPU, and each
  streams a long cache: grid dimension 0 splits the keys into ``N_SPLITS`` chunks, each program
  writes a partial O (normalised over its chunk) and its LSE, and ``decode_combine.py`` merges them.
  With ``N_SPLITS`` 1 the program writes O and LSE itself.

* **Page ids ahead.**  A paged block's page ids (one per block where pages hold at least
  ``BLOCK_N`` keys, ``BLOCK_N // SMALL_PAGE`` where they are smaller; ``kvcache.py``) are loaded an
  iteration before the block, so the load that feeds the K/V addresses is not in the path of the
  pipeline's prefetch: loaded in the block's own iteration it held pages of 16-32 keys to 0.61-0.72
  of the dense cache's bandwidth on the H200 and pages of 64+ at Sq 16 to 0.90; ahead, 0.87-1.0.

Masks: query token ``t`` sits at position ``L - N_CTX_Q + t`` of its sequence of ``L`` keys
(bottom-right), and sees keys ``j < L`` with ``pos - WINDOW_LEFT <= j <= pos + WINDOW_RIGHT``
(-1: unbounded on that side; causal is ``WINDOW_RIGHT`` 0).  The chunks split the union of a
program's rows' visible ranges, so a windowed step reads only its window.

Grid ``(N_SPLITS, B * Hk, cdiv(GQA_GROUP * N_CTX_Q, BLOCK_M))``.  Numerics as ``fwd.py``: fp32
scores and accumulator, exp2 online softmax (``softmax.py``), P in the input dtype for the PV dot.
"""
import triton
import triton.language as tl

from .kvcache import block_page_ids, cache_length, key_rows, page_rows, report_bad_pages, row_offset
from ..flash.softmax import online_softmax_step, softmax_epilogue

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _visible_range(pos, length, WINDOW_LEFT, WINDOW_RIGHT):
    """``[lo, hi)``: the keys a query at ``pos`` of a sequence of ``length`` keys sees."""
    lo = tl.where(WINDOW_LEFT >= 0, tl.maximum(pos - WINDOW_LEFT, 0), 0)
    hi = tl.where(WINDOW_RIGHT >= 0, tl.minimum(pos + WINDOW_RIGHT + 1, length), length)
    return lo, hi


@triton.jit
def _attend_block(q, K_head, V_head, k_off, v_off, ok, keys, row_lo, row_hi, offs_d, d_ok, qk_scale, m_i, l_i, acc):
    """One block of keys folded into the rows' softmax state and accumulator: K^T and V tiles at the
    keys' row offsets (``ok``: may be read), the rows' visible ranges ``[row_lo, row_hi)``."""
    kt = tl.load(K_head + k_off[None, :] + offs_d[:, None], mask=ok[None, :] & d_ok[:, None], other=0.0)
    s = tl.dot(q, kt) * qk_scale
    visible = ok[None, :] & (keys[None, :] >= row_lo[:, None]) & (keys[None, :] < row_hi[:, None])
    s = tl.where(visible, s, float("-inf"))
    p, alpha, m_i, l_i = online_softmax_step(m_i, l_i, s)
    v = tl.load(V_head + v_off[:, None] + offs_d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_i, l_i, acc


@triton.jit
def attn_decode(Q, K, V, O, LSE, O_PART, LSE_PART, PAGE_TABLE, CACHE_SEQLENS, KV_STATUS, sm_scale,
                stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn,
                stride_oz, stride_oh, stride_om, stride_lz, stride_lh, stride_ptz,
                N_CTX_Q, N_NEW, D_HEAD, GQA_GROUP, N_HEADS_Q, WINDOW_LEFT, WINDOW_RIGHT, CACHE_CAPACITY,
                PAGE_SIZE_LOG2, N_PAGES, N_SPLITS, STORE_LSE, STORE_KV_STATUS,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr,
                SMALL_PAGE: tl.constexpr):
    split = tl.program_id(0)
    n_heads_k = N_HEADS_Q // GQA_GROUP
    z = tl.program_id(1) // n_heads_k
    hk = tl.program_id(1) % n_heads_k
    _, length = cache_length(CACHE_SEQLENS, z, N_NEW, CACHE_CAPACITY, KV_STATUS, STORE_KV_STATUS)

    # This program's query rows: a GQA group's heads x the step's tokens.
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < GQA_GROUP * N_CTX_Q
    head = hk * GQA_GROUP + rows // N_CTX_Q
    token = rows % N_CTX_Q
    row_lo, row_hi = _visible_range(length - N_CTX_Q + token, length, WINDOW_LEFT, WINDOW_RIGHT)
    row_hi = tl.where(row_ok, row_hi, 0)
    row_lo = tl.where(row_ok, row_lo, length)
    # The chunk of the keys this split covers: whole BLOCK_N blocks, aligned to BLOCK_N (the keys
    # below the rows' union are masked), from the union of the rows' ranges.
    lo = tl.min(row_lo, 0) // BLOCK_N * BLOCK_N
    hi = tl.max(row_hi, 0)
    chunk = tl.cdiv(tl.cdiv(tl.maximum(hi - lo, 0), N_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(hi, start + chunk)

    offs_d = tl.arange(0, HEAD_DIM)
    d_ok = offs_d < D_HEAD
    q_ptrs = (Q + z.to(tl.int64) * stride_qz + head.to(tl.int64)[:, None] * stride_qh
              + token[:, None] * stride_qm + offs_d[None, :])
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    qk_scale = sm_scale * LOG2E
    K_head = K + hk.to(tl.int64) * stride_kh
    V_head = V + hk.to(tl.int64) * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if PAGED:
        page_table = PAGE_TABLE + z.to(tl.int64) * stride_ptz
        n_slots = CACHE_CAPACITY >> PAGE_SIZE_LOG2
        n_bad = 0  # keys in range left out for their page id
        next_ids = block_page_ids(page_table, start, end, n_slots, PAGE_SIZE_LOG2, SMALL_PAGE, BLOCK_N)
        for first in range(start, end, BLOCK_N):
            keys = first + tl.arange(0, BLOCK_N)
            in_range = keys < end
            ids = next_ids
            next_ids = block_page_ids(page_table, first + BLOCK_N, end, n_slots, PAGE_SIZE_LOG2,
                                      SMALL_PAGE, BLOCK_N)
            block, row, ok = page_rows(keys, in_range, ids, PAGE_SIZE_LOG2, N_PAGES, SMALL_PAGE, BLOCK_N)
            n_bad += tl.sum((in_range & ~ok).to(tl.int32), 0)
            m_i, l_i, acc = _attend_block(q, K_head, V_head, row_offset(block, row, stride_kz, stride_kn),
                                          row_offset(block, row, stride_vz, stride_vn), ok, keys,
                                          row_lo, row_hi, offs_d, d_ok, qk_scale, m_i, l_i, acc)
        report_bad_pages(n_bad, KV_STATUS, STORE_KV_STATUS, PAGED)
    else:
        for first in range(start, end, BLOCK_N):
            keys = first + tl.arange(0, BLOCK_N)
            in_range = keys < end
            block, row, ok = key_rows(keys, in_range, z, PAGE_TABLE, stride_ptz, PAGE_SIZE_LOG2, N_PAGES, PAGED)
            m_i, l_i, acc = _attend_block(q, K_head, V_head, row_offset(block, row, stride_kz, stride_kn),
                                          row_offset(block, row, stride_vz, stride_vn), ok, keys,
                                          row_lo, row_hi, offs_d, d_ok, qk_scale, m_i, l_i, acc)

    o, lse = softmax_epilogue(acc, m_i, l_i)
    if N_SPLITS == 1:
        o_ptrs = (O + z.to(tl.int64) * stride_oz + head.to(tl.int64)[:, None] * stride_oh
                  + token[:, None] * stride_om + offs_d[None, :])
        tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        if STORE_LSE != 0:
            tl.store(LSE + z.to(tl.int64) * stride_lz + head.to(tl.int64) * stride_lh + token, lse, mask=row_ok)
    else:
        # Partials: [N_SPLITS, B, Hq, N_CTX_Q] rows, HEAD_DIM wide; a chunk with no visible key has
        # LSE -inf (its weight in the merge is 0), not softmax_epilogue's +inf.
        n_batch = tl.num_programs(1) // n_heads_k
        part = ((split * n_batch + z).to(tl.int64) * N_HEADS_Q + head) * N_CTX_Q + token
        tl.store(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :], o, mask=row_ok[:, None])
        tl.store(LSE_PART + part, tl.where(l_i > 0.0, lse, float("-inf")), mask=row_ok)
