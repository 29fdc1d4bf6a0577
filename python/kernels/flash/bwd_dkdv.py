"""FlashAttention-2 backward, step 2: ``attn_bwd_dkdv``.

For one block of keys of one K/V head::

    dV = sum_h sum_i (P * M * scale)^T dO        dK = sm_scale * sum_h sum_i dS^T Q

with ``P = exp(s - lse)``, ``s = cap(sm_scale * q.k) + alibi + bias`` (``cap``: ``softcap.py``, with
``SOFTCAP``; ``alibi``: ``alibi.py``, with ``HAS_ALIBI``; recomputed from the forward's LSE, exp2 form), ``dP = (dO V^T) * M * scale`` (``M`` the dropout keep
mask, ``scale = dropout_scale``; without dropout ``M = 1``, ``scale = 1``),
``dS = P * (dP - delta)`` (``delta`` from ``attn_bwd_preprocess``), ``h`` over
the ``GQA_GROUP`` query heads that share this K/V head and ``i`` over the query
blocks that can see the key block.  The group sum happens inside one program
(no atomics): dK/dV are written once, overwritten (not accumulated), and
bitwise reproducible run to run.

Arguments, in order: pointers ``Q, K, V, DO, LSE, DELTA, DK, DV, BIAS, ALIBI_SLOPES``;
``sm_scale, softcap``; strides (q, k, v, do: z/h/row; lse, delta: z/h; dk, dv: z/h/row;
bias: z/h/row; alibi slopes: z); the attention group ``N_CTX_Q, N_CTX_K, D_HEAD, GQA_GROUP,
WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, IS_VARLEN, CU_SEQLENS_Q,
CU_SEQLENS_K, N_TOKENS_Q,
N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS``; the dropout group ``DROPOUT_THRESHOLD, dropout_scale,
PHILOX_SEED, PHILOX_OFFSET, philox_offset_base``; ``D_HEAD_V`` (last, as in ``fwd.py``); constexprs ``HEAD_DIM,
BLOCK_M, BLOCK_N, DROPOUT, HAS_BIAS, ALLOW_TF32, SOFTCAP, HAS_ALIBI, HEAD_DIM_V`` (V, dO and dV
at V's own head dim when > 0: ``fwd.py``).

Tensors as in ``fwd.py`` (varlen: ``varlen.py``; bias: ``bias.py``; dropout:
``dropout.py``, the same stream as the forward).  ``LSE``/``DELTA`` fp32
``[B, Hq, N_CTX_Q]``.  P and dS are cast to the input dtype for the dots;
accumulators are fp32.  Key rows of a sequence whose query length is 0 get
dK = dV = 0.

Grid: ``(cdiv(N_CTX_K, BLOCK_N), Hk, B)``.  Masks and loop bounds: ``mask.py``
(the window seen from the key side: leading masked, full and trailing masked
query-block ranges, computed once per program).
"""
import triton
import triton.language as tl

from .alibi import alibi_bias_log2, alibi_slope_log2
from .bias import load_bias_log2
from .dropout import dropout_head_offset, dropout_keep, philox_state
from .mask import block_walk, block_walk_start, diag_offset, query_block_bounds, score_mask
from .softcap import soft_cap, softcap_grad
from .softmax import softmax_backward, softmax_recompute
from .tiles import load_row_vector, load_tile, load_tile_t, mma, store_tile
from .varlen import sequence

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _attn_bwd_dkdv_q_loop(dk, dv, k, v, q_base, do_base, lse_base, delta_base, bias_base,
                          stride_qm, stride_dom, stride_bm,
                          offs_n, offs_d, offs_dv, lo, hi, skip_lo, skip_hi, qk_scale, softcap, alibi_slope,
                          seqlen_q, seqlen_k, D_HEAD, d_head_v, WINDOW_LEFT, WINDOW_RIGHT, diag,
                          philox_seed, philox_head, N_CTX_K, DROPOUT_THRESHOLD, dropout_scale, start_n,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                          DROPOUT: tl.constexpr, HAS_BIAS: tl.constexpr, ALLOW_TF32: tl.constexpr,
                          SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Accumulate the query blocks of ``[lo, hi)`` outside ``[skip_lo, skip_hi)`` into ``(dk, dv)`` (``mask.block_walk``).

    Works in the transposed orientation: scores ``[BLOCK_N, BLOCK_M]`` (keys x queries).
    ``dv`` accumulates ``(P * M)^T dO``; the caller applies ``dropout_scale`` once.
    """
    offs_m0 = tl.arange(0, BLOCK_M)
    n_lead, n_blocks = block_walk(lo, hi, skip_lo, skip_hi, BLOCK_M)
    for it in range(0, n_blocks):
        start_m = tl.multiple_of(block_walk_start(it, lo, n_lead, skip_hi, BLOCK_M), BLOCK_M)
        rows = start_m + offs_m0
        q_t = load_tile_t(q_base, rows, stride_qm, offs_d, D_HEAD, seqlen_q, MASKED)  # [HEAD_DIM, BLOCK_M]
        lse = load_row_vector(lse_base, rows, seqlen_q, float("inf"))
        s_t = mma(k, q_t, None, ALLOW_TF32) * qk_scale                                 # [BLOCK_N, BLOCK_M]
        if SOFTCAP:
            s_t, tanh_t = soft_cap(s_t, softcap)
        if HAS_ALIBI:
            s_t += alibi_bias_log2(alibi_slope, rows[None, :], offs_n[:, None], diag)
        if MASKED:
            visible = score_mask(rows[None, :], offs_n[:, None], seqlen_q, seqlen_k,
                                 WINDOW_LEFT, WINDOW_RIGHT, diag)
            if HAS_BIAS:
                s_t += load_bias_log2(bias_base, rows[None, :], offs_n[:, None], stride_bm, visible)
            p_t = softmax_recompute(s_t, lse[None, :] * LOG2E)
            p_t = tl.where(visible, p_t, 0.0)
        else:
            if HAS_BIAS:
                s_t += load_bias_log2(bias_base, rows[None, :], offs_n[:, None], stride_bm,
                                      offs_n[:, None] < seqlen_k)
            p_t = softmax_recompute(s_t, lse[None, :] * LOG2E)
        do = load_tile(do_base, rows, stride_dom, offs_dv, d_head_v, seqlen_q, MASKED)  # [BLOCK_M, V_DIM]
        dp_t = mma(v, tl.trans(do), None, ALLOW_TF32)                                 # [BLOCK_N, BLOCK_M]
        if DROPOUT:
            keep_t = dropout_keep(philox_seed, philox_head, start_m, start_n, N_CTX_K, DROPOUT_THRESHOLD,
                                  BLOCK_M, BLOCK_N, KEYS_AS_ROWS=True)                    # [BLOCK_N, BLOCK_M]
            dv = mma(tl.where(keep_t, p_t, 0.0).to(do.dtype), do, dv, ALLOW_TF32)
            dp_t = tl.where(keep_t, dp_t * dropout_scale, 0.0)
        else:
            dv = mma(p_t.to(do.dtype), do, dv, ALLOW_TF32)
        delta = load_row_vector(delta_base, rows, seqlen_q, 0.0)
        ds_t = softmax_backward(p_t, dp_t, delta[None, :])
        if SOFTCAP:
            ds_t = softcap_grad(ds_t, tanh_t)
        dk = mma(ds_t.to(q_t.dtype), tl.trans(q_t), dk, ALLOW_TF32)
    return dk, dv


@triton.jit
def attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, BIAS, ALIBI_SLOPES, sm_scale, softcap,
                  stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn,
                  stride_vz, stride_vh, stride_vn, stride_doz, stride_doh, stride_dom,
                  stride_lz, stride_lh, stride_deltaz, stride_deltah,
                  stride_dkz, stride_dkh, stride_dkn, stride_dvz, stride_dvh, stride_dvn,
                  stride_bz, stride_bh, stride_bm, stride_az,
                  N_CTX_Q, N_CTX_K, D_HEAD, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, IS_VARLEN,
                  CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q, N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS,
                  DROPOUT_THRESHOLD, dropout_scale, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, D_HEAD_V,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  DROPOUT: tl.constexpr, HAS_BIAS: tl.constexpr, ALLOW_TF32: tl.constexpr,
                  SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HEAD_DIM_V: tl.constexpr):
    start_n = tl.program_id(0)
    off_hk = tl.program_id(1).to(tl.int64)
    off_z = tl.program_id(2)

    q_start, seqlen_q = sequence(off_z, N_CTX_Q, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS, STORE_VARLEN_STATUS)
    k_start, seqlen_k = sequence(off_z, N_CTX_K, IS_VARLEN, CU_SEQLENS_K, N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS)
    if start_n * BLOCK_N >= seqlen_k:
        return
    diag = diag_offset(seqlen_q, seqlen_k, ALIGN_BOTTOM_RIGHT)
    philox_seed = 0
    philox_offset = 0
    if DROPOUT:
        philox_seed, philox_offset = philox_state(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base)
    n_heads_q = tl.num_programs(1) * GQA_GROUP

    off_z64 = off_z.to(tl.int64)
    q_start64 = q_start.to(tl.int64)
    k_start64 = k_start.to(tl.int64)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    # V's head dim (and O's, dO's, dV's): Q/K's, or with HEAD_DIM_V > 0 its own bucket and real dim.
    V_DIM: tl.constexpr = HEAD_DIM if HEAD_DIM_V == 0 else HEAD_DIM_V
    d_head_v = D_HEAD if HEAD_DIM_V == 0 else D_HEAD_V
    offs_dv = offs_d if HEAD_DIM_V == 0 else tl.arange(0, V_DIM)  # the same value when V has Q/K's dim
    k = load_tile(K + off_z64 * stride_kz + off_hk * stride_kh + k_start64 * stride_kn, offs_n, stride_kn, offs_d,
                  D_HEAD, seqlen_k, True)
    v = load_tile(V + off_z64 * stride_vz + off_hk * stride_vh + k_start64 * stride_vn, offs_n, stride_vn, offs_dv,
                  d_head_v, seqlen_k, True)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, V_DIM], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E

    start, full_lo, full_hi, end = query_block_bounds(start_n, seqlen_q, seqlen_k, WINDOW_LEFT, WINDOW_RIGHT, diag,
                                                      BLOCK_M, BLOCK_N)
    # The group's query heads in a fixed order: deterministic sums, no atomics.
    h_first = off_hk * GQA_GROUP
    for off_h in range(h_first, h_first + GQA_GROUP):
        q_base = Q + off_z64 * stride_qz + off_h * stride_qh + q_start64 * stride_qm
        do_base = DO + off_z64 * stride_doz + off_h * stride_doh + q_start64 * stride_dom
        lse_base = LSE + off_z64 * stride_lz + off_h * stride_lh + q_start
        delta_base = DELTA + off_z64 * stride_deltaz + off_h * stride_deltah + q_start
        bias_base = BIAS + off_z64 * stride_bz + off_h * stride_bh
        alibi_slope = 0.0
        if HAS_ALIBI:
            alibi_slope = alibi_slope_log2(ALIBI_SLOPES, stride_az, off_z64, off_h)
        philox_head = 0
        if DROPOUT:
            philox_head = dropout_head_offset(philox_offset, off_z, off_h, n_heads_q, N_CTX_Q, N_CTX_K)
        # Query blocks that see the whole key block: no mask code.
        dk, dv = _attn_bwd_dkdv_q_loop(dk, dv, k, v, q_base, do_base, lse_base, delta_base, bias_base,
                                       stride_qm, stride_dom, stride_bm,
                                       offs_n, offs_d, offs_dv, full_lo, full_hi, full_hi, full_hi, qk_scale, softcap,
                                       alibi_slope, seqlen_q, seqlen_k, D_HEAD, d_head_v, WINDOW_LEFT, WINDOW_RIGHT, diag,
                                       philox_seed, philox_head, N_CTX_K, DROPOUT_THRESHOLD, dropout_scale,
                                       start_n * BLOCK_N,
                                       BLOCK_M, BLOCK_N, False, DROPOUT, HAS_BIAS, ALLOW_TF32, SOFTCAP, HAS_ALIBI)
        # Boundary blocks, leading [start, full_lo) and trailing [full_hi, end), in one masked loop.
        dk, dv = _attn_bwd_dkdv_q_loop(dk, dv, k, v, q_base, do_base, lse_base, delta_base, bias_base,
                                       stride_qm, stride_dom, stride_bm,
                                       offs_n, offs_d, offs_dv, start, end, full_lo, full_hi, qk_scale, softcap,
                                       alibi_slope, seqlen_q, seqlen_k, D_HEAD, d_head_v, WINDOW_LEFT, WINDOW_RIGHT, diag,
                                       philox_seed, philox_head, N_CTX_K, DROPOUT_THRESHOLD, dropout_scale,
                                       start_n * BLOCK_N,
                                       BLOCK_M, BLOCK_N, True, DROPOUT, HAS_BIAS, ALLOW_TF32, SOFTCAP, HAS_ALIBI)

    if DROPOUT:
        dv = dv * dropout_scale
    store_tile(DK + off_z64 * stride_dkz + off_hk * stride_dkh + k_start64 * stride_dkn, offs_n, stride_dkn, offs_d,
               dk * sm_scale, D_HEAD, seqlen_k)
    store_tile(DV + off_z64 * stride_dvz + off_hk * stride_dvh + k_start64 * stride_dvn, offs_n, stride_dvn, offs_dv,
               dv, d_head_v, seqlen_k)
