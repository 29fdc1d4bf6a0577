"""FlashAttention-2 backward, step 3: ``attn_bwd_dq``.

For one block of query rows of one query head::

    dQ = sm_scale * sum_j dS K,   dS = P * (dP - delta),   dP = (dO V^T) * M * scale,   P = exp(s - lse)

with ``s = cap(sm_scale * q.k) + alibi + bias`` (``cap``: ``softcap.py``, with ``SOFTCAP``; ``alibi``:
``alibi.py``, with ``HAS_ALIBI``;
P recomputed from the forward's LSE in the exp2 form), ``M``/``scale`` the dropout keep mask and ``dropout_scale`` (1
without dropout), ``delta`` from ``attn_bwd_preprocess``; dS cast to the input
dtype for the dot, fp32 accumulator.  ``DQ`` is overwritten.  Rows that see no
key (LSE = +inf) get P = 0, hence dQ = 0.

Arguments, in order: pointers ``Q, K, V, DO, LSE, DELTA, DQ, BIAS, ALIBI_SLOPES``;
``sm_scale, softcap``; strides (q, k, v, do: z/h/row; lse, delta: z/h; dq: z/h/row;
bias: z/h/row; alibi slopes: z); the attention group ``N_CTX_Q, N_CTX_K, D_HEAD, GQA_GROUP,
WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, IS_VARLEN, CU_SEQLENS_Q,
CU_SEQLENS_K, N_TOKENS_Q,
N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS``; the dropout group ``DROPOUT_THRESHOLD, dropout_scale,
PHILOX_SEED, PHILOX_OFFSET, philox_offset_base``; ``D_HEAD_V`` (last, as in ``fwd.py``); constexprs ``HEAD_DIM,
BLOCK_M, BLOCK_N, DROPOUT, HAS_BIAS, ALLOW_TF32, SOFTCAP, HAS_ALIBI, HEAD_DIM_V`` (V and dO at V's
own head dim when > 0: ``fwd.py``).

Tensors as in ``fwd.py`` (GQA: query head ``h`` reads K/V head ``h // GQA_GROUP``;
varlen, bias, dropout: ``varlen.py``, ``bias.py``, ``dropout.py``).
Grid: ``(cdiv(N_CTX_Q, BLOCK_M), Hq, B)`` (query blocks in reverse order, as the
forward).  Masks and key-block loop bounds are the forward's (``mask.py``).
"""
import triton
import triton.language as tl

from .alibi import alibi_bias_log2, alibi_slope_log2
from .bias import load_bias_log2
from .dropout import dropout_head_offset, dropout_keep, dropout_rows_offset, philox_state
from .mask import block_walk, block_walk_start, diag_offset, key_block_bounds, score_mask
from .softcap import soft_cap, softcap_grad
from .softmax import softmax_backward, softmax_recompute
from .tiles import load_row_vector, load_tile, load_tile_t, mma, store_tile
from .varlen import sequence

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _attn_bwd_dq_kv_loop(dq, q, do, lse_log2, delta, k_base, v_base, bias_base, stride_kn, stride_vn, stride_bm,
                         offs_m, offs_d, offs_dv, lo, hi, skip_lo, skip_hi, qk_scale, softcap, alibi_slope,
                         seqlen_q, seqlen_k, D_HEAD, d_head_v, WINDOW_LEFT, WINDOW_RIGHT, diag,
                         philox_seed, philox_tile, N_CTX_K, DROPOUT_THRESHOLD, dropout_scale,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                         DROPOUT: tl.constexpr, HAS_BIAS: tl.constexpr, ALLOW_TF32: tl.constexpr,
                         SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Accumulate the key blocks of ``[lo, hi)`` outside ``[skip_lo, skip_hi)`` into ``dq`` (``mask.block_walk``)."""
    offs_n = tl.arange(0, BLOCK_N)
    n_lead, n_blocks = block_walk(lo, hi, skip_lo, skip_hi, BLOCK_N)
    for it in range(0, n_blocks):
        start_n = tl.multiple_of(block_walk_start(it, lo, n_lead, skip_hi, BLOCK_N), BLOCK_N)
        cols = start_n + offs_n
        k_t = load_tile_t(k_base, cols, stride_kn, offs_d, D_HEAD, seqlen_k, MASKED)   # [HEAD_DIM, BLOCK_N]
        v_t = load_tile_t(v_base, cols, stride_vn, offs_dv, d_head_v, seqlen_k, MASKED)  # [V_DIM, BLOCK_N]
        s = mma(q, k_t, None, ALLOW_TF32) * qk_scale
        if SOFTCAP:
            s, tanh_s = soft_cap(s, softcap)
        if HAS_ALIBI:
            s += alibi_bias_log2(alibi_slope, offs_m[:, None], cols[None, :], diag)
        if MASKED:
            visible = score_mask(offs_m[:, None], cols[None, :], seqlen_q, seqlen_k,
                                 WINDOW_LEFT, WINDOW_RIGHT, diag)
            if HAS_BIAS:
                s += load_bias_log2(bias_base, offs_m[:, None], cols[None, :], stride_bm, visible)
            p = softmax_recompute(s, lse_log2[:, None])
            p = tl.where(visible, p, 0.0)
        else:
            if HAS_BIAS:
                s += load_bias_log2(bias_base, offs_m[:, None], cols[None, :], stride_bm,
                                    offs_m[:, None] < seqlen_q)
            p = softmax_recompute(s, lse_log2[:, None])
        dp = mma(do, v_t, None, ALLOW_TF32)
        if DROPOUT:
            keep = dropout_keep(philox_seed, philox_tile, 0, start_n, N_CTX_K, DROPOUT_THRESHOLD,
                                BLOCK_M, BLOCK_N)
            dp = tl.where(keep, dp * dropout_scale, 0.0)
        ds = softmax_backward(p, dp, delta[:, None])
        if SOFTCAP:
            ds = softcap_grad(ds, tanh_s)
        dq = mma(ds.to(k_t.dtype), tl.trans(k_t), dq, ALLOW_TF32)
    return dq


@triton.jit
def attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, BIAS, ALIBI_SLOPES, sm_scale, softcap,
                stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn,
                stride_vz, stride_vh, stride_vn, stride_doz, stride_doh, stride_dom,
                stride_lz, stride_lh, stride_deltaz, stride_deltah,
                stride_dqz, stride_dqh, stride_dqm,
                stride_bz, stride_bh, stride_bm, stride_az,
                N_CTX_Q, N_CTX_K, D_HEAD, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, IS_VARLEN,
                CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q, N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS,
                DROPOUT_THRESHOLD, dropout_scale, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, D_HEAD_V,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                DROPOUT: tl.constexpr, HAS_BIAS: tl.constexpr, ALLOW_TF32: tl.constexpr,
                SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HEAD_DIM_V: tl.constexpr):
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest query blocks first, as the forward
    off_h = tl.program_id(1)
    off_hk = (off_h // GQA_GROUP).to(tl.int64)
    off_h = off_h.to(tl.int64)
    off_z = tl.program_id(2)

    q_start, seqlen_q = sequence(off_z, N_CTX_Q, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS, STORE_VARLEN_STATUS)
    k_start, seqlen_k = sequence(off_z, N_CTX_K, IS_VARLEN, CU_SEQLENS_K, N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS)
    if start_m * BLOCK_M >= seqlen_q:
        return
    diag = diag_offset(seqlen_q, seqlen_k, ALIGN_BOTTOM_RIGHT)
    philox_seed = 0
    philox_tile = 0  # the counter of this tile's first quad row (dropout.py)
    if DROPOUT:
        philox_seed, philox_offset = philox_state(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base)
        philox_head = dropout_head_offset(philox_offset, off_z, off_h, tl.num_programs(1), N_CTX_Q, N_CTX_K)
        philox_tile = dropout_rows_offset(philox_head, start_m * BLOCK_M, N_CTX_K)

    off_z = off_z.to(tl.int64)
    q_start64 = q_start.to(tl.int64)
    k_start64 = k_start.to(tl.int64)
    k_base = K + off_z * stride_kz + off_hk * stride_kh + k_start64 * stride_kn
    v_base = V + off_z * stride_vz + off_hk * stride_vh + k_start64 * stride_vn
    bias_base = BIAS + off_z * stride_bz + off_h * stride_bh
    alibi_slope = 0.0
    if HAS_ALIBI:
        alibi_slope = alibi_slope_log2(ALIBI_SLOPES, stride_az, off_z, off_h)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    # V's head dim (and O's, dO's, dV's): Q/K's, or with HEAD_DIM_V > 0 its own bucket and real dim.
    V_DIM: tl.constexpr = HEAD_DIM if HEAD_DIM_V == 0 else HEAD_DIM_V
    d_head_v = D_HEAD if HEAD_DIM_V == 0 else D_HEAD_V
    offs_dv = offs_d if HEAD_DIM_V == 0 else tl.arange(0, V_DIM)  # the same value when V has Q/K's dim
    q = load_tile(Q + off_z * stride_qz + off_h * stride_qh + q_start64 * stride_qm, offs_m, stride_qm, offs_d,
                  D_HEAD, seqlen_q, True)
    do = load_tile(DO + off_z * stride_doz + off_h * stride_doh + q_start64 * stride_dom, offs_m, stride_dom, offs_dv,
                   d_head_v, seqlen_q, True)
    lse = load_row_vector(LSE + off_z * stride_lz + off_h * stride_lh + q_start, offs_m, seqlen_q, float("inf"))
    lse_log2 = lse * LOG2E
    delta = load_row_vector(DELTA + off_z * stride_deltaz + off_h * stride_deltah + q_start, offs_m, seqlen_q, 0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E

    start, full_lo, full_hi, end = key_block_bounds(start_m, seqlen_q, seqlen_k, WINDOW_LEFT, WINDOW_RIGHT, diag,
                                                    BLOCK_M, BLOCK_N)
    # Key blocks visible in full to the whole tile: no mask code.
    dq = _attn_bwd_dq_kv_loop(dq, q, do, lse_log2, delta, k_base, v_base, bias_base, stride_kn, stride_vn, stride_bm,
                              offs_m, offs_d, offs_dv, full_lo, full_hi, full_hi, full_hi, qk_scale, softcap,
                              alibi_slope, seqlen_q, seqlen_k, D_HEAD, d_head_v, WINDOW_LEFT, WINDOW_RIGHT, diag,
                              philox_seed, philox_tile, N_CTX_K, DROPOUT_THRESHOLD, dropout_scale,
                              BLOCK_M, BLOCK_N, False, DROPOUT, HAS_BIAS, ALLOW_TF32, SOFTCAP, HAS_ALIBI)
    # Boundary blocks, leading [start, full_lo) and trailing [full_hi, end), in one masked loop.
    dq = _attn_bwd_dq_kv_loop(dq, q, do, lse_log2, delta, k_base, v_base, bias_base, stride_kn, stride_vn, stride_bm,
                              offs_m, offs_d, offs_dv, start, end, full_lo, full_hi, qk_scale, softcap,
                              alibi_slope, seqlen_q, seqlen_k, D_HEAD, d_head_v, WINDOW_LEFT, WINDOW_RIGHT, diag,
                              philox_seed, philox_tile, N_CTX_K, DROPOUT_THRESHOLD, dropout_scale,
                              BLOCK_M, BLOCK_N, True, DROPOUT, HAS_BIAS, ALLOW_TF32, SOFTCAP, HAS_ALIBI)

    store_tile(DQ + off_z * stride_dqz + off_h * stride_dqh + q_start64 * stride_dqm, offs_m, stride_dqm, offs_d,
               dq * sm_scale, D_HEAD, seqlen_q)
