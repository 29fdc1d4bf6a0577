"""FlashAttention-2 backward, step 3: ``attn_bwd_dq``.

For one block of query rows of one query head::

    dQ = sm_scale * sum_j dS K,   dS = P * (dO V^T - delta),   P = exp(sm_scale * q.k - lse)

(P recomputed from the forward's LSE in the exp2 form, ``delta`` from
``attn_bwd_preprocess``; dS cast to the input dtype for the dot, fp32
accumulator).  ``DQ`` is overwritten.  Rows that see no key (LSE = +inf) get
P = 0, hence dQ = 0.

Tensors as in ``fwd.py`` (GQA: query head ``h`` reads K/V head ``h // GQA_GROUP``).
Grid: ``(cdiv(N_CTX_Q, BLOCK_M), Hq, B)``.  Masks and key-block loop bounds are
the forward's (``mask.py``).
"""
import triton
import triton.language as tl

from .mask import block_walk, block_walk_start, key_block_bounds, score_mask
from .softmax import softmax_backward, softmax_recompute
from .tiles import load_row_vector, load_tile, load_tile_t, store_tile

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _attn_bwd_dq_kv_loop(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_vn,
                         offs_m, offs_d, lo, hi, skip_lo, skip_hi, qk_scale,
                         N_CTX_Q, N_CTX_K, D_HEAD, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET,
                         BLOCK_N: tl.constexpr, MASKED: tl.constexpr, WINDOWED: tl.constexpr):
    """Accumulate the key blocks of ``[lo, hi)`` outside ``[skip_lo, skip_hi)`` into ``dq`` (``mask.block_walk``)."""
    offs_n = tl.arange(0, BLOCK_N)
    n_lead, n_blocks = block_walk(lo, hi, skip_lo, skip_hi, BLOCK_N)
    for it in range(0, n_blocks):
        start_n = tl.multiple_of(block_walk_start(it, lo, n_lead, skip_hi, BLOCK_N), BLOCK_N)
        cols = start_n + offs_n
        k_t = load_tile_t(k_base, cols, stride_kn, offs_d, D_HEAD, N_CTX_K, MASKED)   # [HEAD_DIM, BLOCK_N]
        v_t = load_tile_t(v_base, cols, stride_vn, offs_d, D_HEAD, N_CTX_K, MASKED)
        s = tl.dot(q, k_t) * qk_scale
        p = softmax_recompute(s, lse_log2[:, None])
        if MASKED:
            visible = score_mask(offs_m[:, None], cols[None, :], N_CTX_Q, N_CTX_K,
                                 WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET, WINDOWED)
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, v_t)
        ds = softmax_backward(p, dp, delta[:, None])
        dq = tl.dot(ds.to(k_t.dtype), tl.trans(k_t), dq)
    return dq


@triton.jit
def attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, sm_scale,
                stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn,
                stride_vz, stride_vh, stride_vn, stride_doz, stride_doh, stride_dom,
                stride_lz, stride_lh, stride_deltaz, stride_deltah,
                stride_dqz, stride_dqh, stride_dqm,
                N_CTX_Q, N_CTX_K, D_HEAD, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr):
    if WINDOWED:
        start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest query blocks first, as the forward
    else:
        start_m = tl.program_id(0)
    off_h = tl.program_id(1)
    off_hk = (off_h // GQA_GROUP).to(tl.int64)
    off_h = off_h.to(tl.int64)
    off_z = tl.program_id(2).to(tl.int64)

    k_base = K + off_z * stride_kz + off_hk * stride_kh
    v_base = V + off_z * stride_vz + off_hk * stride_vh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = load_tile(Q + off_z * stride_qz + off_h * stride_qh, offs_m, stride_qm, offs_d, D_HEAD, N_CTX_Q, True)
    do = load_tile(DO + off_z * stride_doz + off_h * stride_doh, offs_m, stride_dom, offs_d, D_HEAD, N_CTX_Q,
                   True)
    lse = load_row_vector(LSE + off_z * stride_lz + off_h * stride_lh, offs_m, N_CTX_Q, float("inf"))
    lse_log2 = lse * LOG2E
    delta = load_row_vector(DELTA + off_z * stride_deltaz + off_h * stride_deltah, offs_m, N_CTX_Q, 0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E

    start, full_lo, full_hi, end = key_block_bounds(start_m, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
                                                    DIAG_OFFSET, BLOCK_M, BLOCK_N, WINDOWED)
    # Key blocks visible in full to the whole tile: no mask code.
    dq = _attn_bwd_dq_kv_loop(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_vn,
                              offs_m, offs_d, full_lo, full_hi, full_hi, full_hi, qk_scale,
                              N_CTX_Q, N_CTX_K, D_HEAD, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET,
                              BLOCK_N, False, WINDOWED)
    # Boundary blocks, leading [start, full_lo) and trailing [full_hi, end), in one masked loop.
    dq = _attn_bwd_dq_kv_loop(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_vn,
                              offs_m, offs_d, start, end, full_lo, full_hi, qk_scale,
                              N_CTX_Q, N_CTX_K, D_HEAD, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET,
                              BLOCK_N, True, WINDOWED)

    store_tile(DQ + off_z * stride_dqz + off_h * stride_dqh, offs_m, stride_dqm, offs_d, dq * sm_scale,
               D_HEAD, N_CTX_Q)
