"""FlashAttention-2 backward, step 2: ``attn_bwd_dkdv``.

For one block of keys of one K/V head::

    dV = sum_h sum_i P^T dO        dK = sm_scale * sum_h sum_i dS^T Q

with ``P = exp(sm_scale * q.k - lse)`` (recomputed from the forward's LSE, exp2
form), ``dS = P * (dO V^T - delta)`` (``delta`` from ``attn_bwd_preprocess``),
``h`` over the ``GQA_GROUP`` query heads that share this K/V head and ``i``
over the query blocks that can see the key block.  The group sum happens
inside one program (no atomics): dK/dV are written once, overwritten (not
accumulated), and bitwise reproducible run to run.

Tensors as in ``fwd.py``: ``Q``, ``DO`` ``[B, Hq, N_CTX_Q, D_HEAD]``; ``K``,
``V``, ``DK``, ``DV`` ``[B, Hk, N_CTX_K, D_HEAD]`` with ``Hq = GQA_GROUP * Hk``;
``LSE`` (the forward's, natural log, ``+inf`` for rows without keys) and
``DELTA`` fp32 ``[B, Hq, N_CTX_Q]``.  P and dS are cast to the input dtype for
the dots; accumulators are fp32.

Grid: ``(cdiv(N_CTX_K, BLOCK_N), Hk, B)``.  Masks and loop bounds: ``mask.py``
(the window seen from the key side: leading masked, full and trailing masked
query-block ranges, computed once per program).
"""
import triton
import triton.language as tl

from .mask import block_walk, block_walk_start, query_block_bounds, score_mask
from .softmax import softmax_backward, softmax_recompute
from .tiles import load_row_vector, load_tile, load_tile_t, store_tile

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _attn_bwd_dkdv_q_loop(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                          offs_n, offs_d, lo, hi, skip_lo, skip_hi, qk_scale,
                          N_CTX_Q, N_CTX_K, D_HEAD, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET,
                          BLOCK_M: tl.constexpr, MASKED: tl.constexpr, WINDOWED: tl.constexpr):
    """Accumulate the query blocks of ``[lo, hi)`` outside ``[skip_lo, skip_hi)`` into ``(dk, dv)`` (``mask.block_walk``).

    Works in the transposed orientation: scores ``[BLOCK_N, BLOCK_M]`` (keys x queries).
    """
    offs_m0 = tl.arange(0, BLOCK_M)
    n_lead, n_blocks = block_walk(lo, hi, skip_lo, skip_hi, BLOCK_M)
    for it in range(0, n_blocks):
        start_m = tl.multiple_of(block_walk_start(it, lo, n_lead, skip_hi, BLOCK_M), BLOCK_M)
        rows = start_m + offs_m0
        q_t = load_tile_t(q_base, rows, stride_qm, offs_d, D_HEAD, N_CTX_Q, MASKED)   # [HEAD_DIM, BLOCK_M]
        lse = load_row_vector(lse_base, rows, N_CTX_Q, float("inf"))
        s_t = tl.dot(k, q_t) * qk_scale                                                # [BLOCK_N, BLOCK_M]
        p_t = softmax_recompute(s_t, lse[None, :] * LOG2E)
        if MASKED:
            visible = score_mask(rows[None, :], offs_n[:, None], N_CTX_Q, N_CTX_K,
                                 WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET, WINDOWED)
            p_t = tl.where(visible, p_t, 0.0)
        do = load_tile(do_base, rows, stride_dom, offs_d, D_HEAD, N_CTX_Q, MASKED)      # [BLOCK_M, HEAD_DIM]
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        delta = load_row_vector(delta_base, rows, N_CTX_Q, 0.0)
        dp_t = tl.dot(v, tl.trans(do))                                                 # [BLOCK_N, BLOCK_M]
        ds_t = softmax_backward(p_t, dp_t, delta[None, :])
        dk = tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk)
    return dk, dv


@triton.jit
def attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale,
                  stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn,
                  stride_vz, stride_vh, stride_vn, stride_doz, stride_doh, stride_dom,
                  stride_lz, stride_lh, stride_deltaz, stride_deltah,
                  stride_dkz, stride_dkh, stride_dkn, stride_dvz, stride_dvh, stride_dvn,
                  N_CTX_Q, N_CTX_K, D_HEAD, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr):
    start_n = tl.program_id(0)
    off_hk = tl.program_id(1).to(tl.int64)
    off_z = tl.program_id(2).to(tl.int64)

    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k = load_tile(K + off_z * stride_kz + off_hk * stride_kh, offs_n, stride_kn, offs_d, D_HEAD, N_CTX_K, True)
    v = load_tile(V + off_z * stride_vz + off_hk * stride_vh, offs_n, stride_vn, offs_d, D_HEAD, N_CTX_K, True)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E

    start, full_lo, full_hi, end = query_block_bounds(start_n, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
                                                      DIAG_OFFSET, BLOCK_M, BLOCK_N, WINDOWED)
    # The group's query heads in a fixed order: deterministic sums, no atomics.
    h_first = off_hk * GQA_GROUP
    for off_h in range(h_first, h_first + GQA_GROUP):
        q_base = Q + off_z * stride_qz + off_h * stride_qh
        do_base = DO + off_z * stride_doz + off_h * stride_doh
        lse_base = LSE + off_z * stride_lz + off_h * stride_lh
        delta_base = DELTA + off_z * stride_deltaz + off_h * stride_deltah
        # Query blocks that see the whole key block: no mask code.
        dk, dv = _attn_bwd_dkdv_q_loop(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                                       offs_n, offs_d, full_lo, full_hi, full_hi, full_hi, qk_scale,
                                       N_CTX_Q, N_CTX_K, D_HEAD, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET,
                                       BLOCK_M, False, WINDOWED)
        # Boundary blocks, leading [start, full_lo) and trailing [full_hi, end), in one masked loop.
        dk, dv = _attn_bwd_dkdv_q_loop(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                                       offs_n, offs_d, start, end, full_lo, full_hi, qk_scale,
                                       N_CTX_Q, N_CTX_K, D_HEAD, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET,
                                       BLOCK_M, True, WINDOWED)

    store_tile(DK + off_z * stride_dkz + off_hk * stride_dkh, offs_n, stride_dkn, offs_d, dk * sm_scale,
               D_HEAD, N_CTX_K)
    store_tile(DV + off_z * stride_dvz + off_hk * stride_dvh, offs_n, stride_dvn, offs_d, dv, D_HEAD, N_CTX_K)
