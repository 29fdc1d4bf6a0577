"""Backward of the additive bias: ``attn_bwd_dbias``.

``dBias = dS = P * (dP - delta)`` (the gradient of ``s = sm_scale * q.k + bias``,
i.e. before ``sm_scale``), summed over the bias's broadcast dimensions,
deterministically (fixed loop order, no atomics): the output ``DBIAS`` (input
dtype) has sizes ``[Bb, Hb, Sqb, N_CTX_K]`` with ``Bb`` in ``{1, B}`` (``BIAS_BATCHES``),
``Hb`` in ``{1, Hq}`` (``BIAS_HEADS``), ``Sqb`` in ``{1, N_CTX_Q}`` (``BIAS_ROWS``) and
element strides ``(stride_dbz, stride_dbh, stride_dbm, 1)``.  ``P``, ``dP`` (dropout
included) and ``s`` (bias and masks included) are recomputed exactly as in
``attn_bwd_dq``.

Arguments, in order: pointers ``Q, K, V, DO, LSE, DELTA, BIAS, DBIAS``;
``sm_scale``; strides (q, k, v, do: z/h/row; lse, delta: z/h; bias: z/h/row;
dbias: z/h/row); ``N_BATCH, BIAS_BATCHES, BIAS_HEADS, BIAS_ROWS, N_HEADS_Q``;
the attention group ``N_CTX_Q, N_CTX_K, D_HEAD, GQA_GROUP, WINDOW_LEFT,
WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, IS_VARLEN, CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q,
N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS``; the
dropout group ``DROPOUT_THRESHOLD, dropout_scale, PHILOX_SEED, PHILOX_OFFSET,
philox_offset_base``; constexprs ``HEAD_DIM, BLOCK_M, BLOCK_N, DROPOUT, ALLOW_TF32``.

Grid: ``(1 if BIAS_ROWS == 1 else cdiv(N_CTX_Q, BLOCK_M), cdiv(N_CTX_K, BLOCK_N),
BIAS_BATCHES * BIAS_HEADS)``.  Program ``(x, y, z)`` owns the dBias tile of key
block ``y``, ``bb = z // BIAS_HEADS``, ``hb = z % BIAS_HEADS`` and query block ``x``
(every query row, summed, when ``BIAS_ROWS == 1``: the tile is reduced over its
rows at the end and written to row 0).  It sums over batches ``b`` (all
``N_BATCH`` when ``BIAS_BATCHES == 1``, else ``bb``), query heads ``h`` (all
``N_HEADS_Q`` when ``BIAS_HEADS == 1``, else ``hb``) and, when ``BIAS_ROWS == 1``,
the query blocks that can see key block ``y``, in that fixed order, and writes
its tile once (zeros where nothing contributes, e.g. past a varlen sequence).
"""
import triton
import triton.language as tl

from .bias import load_bias_log2
from .dropout import dropout_head_offset, dropout_keep, philox_state
from .mask import diag_offset, query_block_bounds, score_mask
from .softmax import softmax_backward, softmax_recompute
from .tiles import load_row_vector, load_tile, load_tile_t, mma
from .varlen import sequence

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def attn_bwd_dbias(Q, K, V, DO, LSE, DELTA, BIAS, DBIAS, sm_scale,
                   stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn,
                   stride_vz, stride_vh, stride_vn, stride_doz, stride_doh, stride_dom,
                   stride_lz, stride_lh, stride_deltaz, stride_deltah,
                   stride_bz, stride_bh, stride_bm, stride_dbz, stride_dbh, stride_dbm,
                   N_BATCH, BIAS_BATCHES, BIAS_HEADS, BIAS_ROWS, N_HEADS_Q,
                   N_CTX_Q, N_CTX_K, D_HEAD, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, IS_VARLEN,
                   CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q, N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS,
                   DROPOUT_THRESHOLD, dropout_scale, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   DROPOUT: tl.constexpr, ALLOW_TF32: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_z = tl.program_id(2)
    bb = pid_z // BIAS_HEADS
    hb = pid_z % BIAS_HEADS
    all_rows = BIAS_ROWS == 1
    b_lo = tl.where(BIAS_BATCHES == 1, 0, bb)
    b_hi = tl.where(BIAS_BATCHES == 1, N_BATCH, bb + 1)
    h_lo = tl.where(BIAS_HEADS == 1, 0, hb)
    h_hi = tl.where(BIAS_HEADS == 1, N_HEADS_Q, hb + 1)

    philox_seed = 0
    philox_offset = 0
    if DROPOUT:
        philox_seed, philox_offset = philox_state(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base)

    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    qk_scale = sm_scale * LOG2E
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)

    for b in range(b_lo, b_hi):
        q_start, seqlen_q = sequence(b, N_CTX_Q, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS, STORE_VARLEN_STATUS)
        k_start, seqlen_k = sequence(b, N_CTX_K, IS_VARLEN, CU_SEQLENS_K, N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS)
        diag = diag_offset(seqlen_q, seqlen_k, ALIGN_BOTTOM_RIGHT)
        # Query blocks to visit: those that see key block y (all rows), or block x alone.
        q_lo, _, _, q_hi = query_block_bounds(pid_n, seqlen_q, seqlen_k, WINDOW_LEFT, WINDOW_RIGHT, diag,
                                              BLOCK_M, BLOCK_N)
        m_lo = tl.where(all_rows, q_lo, pid_m * BLOCK_M)
        m_hi = tl.where(all_rows, q_hi, tl.minimum(pid_m * BLOCK_M + BLOCK_M, seqlen_q))
        m_hi = tl.where(start_n < seqlen_k, m_hi, m_lo)  # key block past this sequence: nothing to add
        b64 = tl.cast(b, tl.int64)
        q_start64 = q_start.to(tl.int64)
        k_start64 = k_start.to(tl.int64)
        for h in range(h_lo, h_hi):
            hk = tl.cast(h // GQA_GROUP, tl.int64)
            h64 = tl.cast(h, tl.int64)
            k_t = load_tile_t(K + b64 * stride_kz + hk * stride_kh + k_start64 * stride_kn, offs_n, stride_kn,
                              offs_d, D_HEAD, seqlen_k, True)                             # [HEAD_DIM, BLOCK_N]
            v_t = load_tile_t(V + b64 * stride_vz + hk * stride_vh + k_start64 * stride_vn, offs_n, stride_vn,
                              offs_d, D_HEAD, seqlen_k, True)
            q_base = Q + b64 * stride_qz + h64 * stride_qh + q_start64 * stride_qm
            do_base = DO + b64 * stride_doz + h64 * stride_doh + q_start64 * stride_dom
            lse_base = LSE + b64 * stride_lz + h64 * stride_lh + q_start
            delta_base = DELTA + b64 * stride_deltaz + h64 * stride_deltah + q_start
            bias_base = BIAS + b64 * stride_bz + h64 * stride_bh
            philox_head = 0
            if DROPOUT:
                philox_head = dropout_head_offset(philox_offset, b, h, N_HEADS_Q, N_CTX_Q, N_CTX_K)
            for start_m in range(m_lo, m_hi, BLOCK_M):
                rows = start_m + offs_m0
                q = load_tile(q_base, rows, stride_qm, offs_d, D_HEAD, seqlen_q, True)
                do = load_tile(do_base, rows, stride_dom, offs_d, D_HEAD, seqlen_q, True)
                lse = load_row_vector(lse_base, rows, seqlen_q, float("inf"))
                delta = load_row_vector(delta_base, rows, seqlen_q, 0.0)
                visible = score_mask(rows[:, None], offs_n[None, :], seqlen_q, seqlen_k,
                                     WINDOW_LEFT, WINDOW_RIGHT, diag)
                s = mma(q, k_t, None, ALLOW_TF32) * qk_scale
                s += load_bias_log2(bias_base, rows[:, None], offs_n[None, :], stride_bm, visible)
                p = tl.where(visible, softmax_recompute(s, lse[:, None] * LOG2E), 0.0)
                dp = mma(do, v_t, None, ALLOW_TF32)
                if DROPOUT:
                    keep = dropout_keep(philox_seed, philox_head, start_m, start_n, N_CTX_K, DROPOUT_THRESHOLD,
                                        BLOCK_M, BLOCK_N)
                    dp = tl.where(keep, dp * dropout_scale, 0.0)
                acc += softmax_backward(p, dp, delta[:, None])

    db_base = DBIAS + bb.to(tl.int64) * stride_dbz + hb.to(tl.int64) * stride_dbh
    if all_rows:
        tl.store(db_base + offs_n, tl.sum(acc, 0).to(DBIAS.dtype.element_ty), mask=offs_n < N_CTX_K)
    else:
        rows = pid_m * BLOCK_M + offs_m0
        tl.store(db_base + rows[:, None] * stride_dbm + offs_n[None, :], acc.to(DBIAS.dtype.element_ty),
                 mask=(rows[:, None] < N_CTX_Q) & (offs_n[None, :] < N_CTX_K))
