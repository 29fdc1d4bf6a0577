"""dQ of the attention backward for Hopper (sm_90) in Gluon: ``attn_bwd_gluon_dq``.

For one block of ``BLOCK_M`` query rows of one query head::

    dQ = sm_scale * sum_j dS_j K_j,   dS_j = P_j * (dP_j - delta),   dP_j = dO V_j^T,
    P_j = exp2(Q K_j^T * sm_scale * log2(e) - lse2)

with ``lse2`` (the forward's LSE in log2 units) and ``delta = rowsum(dO * O)`` from the backward's
preprocess (``bwd_preprocess.py``, in the workspace).  The same product as the portable
``attn_bwd_dq`` (``kernels/flash/bwd_dq.py``), shaped like this package's forward (``fwd.py``):
the query rows are the CTA's, the key blocks stream past them, so dQ is written once, without
atomics (deterministic), and no fp32 dQ accumulator leaves the registers.  It pairs with the
main backward kernel built without dQ (``bwd.py``/``bwd_wide.py``, ``COMPUTE_DQ`` 0), where the
fused dQ reduce-add costs the most: at head dim 256 the per-step 64 KiB fp32 reduce is nearly
half of the fused kernel's time.

Structure (warp-specialized, ``gl.warp_specialize``):

* the **loader** (one warp) issues every TMA load: each consumer's Q and dO tiles once (one
  barrier per consumer), then K and V block by block into two rings of their own depths
  (``K_STAGES``, ``V_STAGES``): V is free once dP is done, K only after the dQ product;
* two **consumers** (one warpgroup, 64 query rows each) walk every key block of the CTA in the
  forward's order (full blocks, then the masked boundary blocks: ``mask.py``).  Step ``j`` issues
  ``S_j = Q K_j^T`` and ``dP_j = dO V_j^T`` (operands in shared memory) and the previous step's
  ``dQ += dS_{j-1} K_{j-1}`` (dS from registers), computes ``P_j`` and ``dS_j`` while they run
  (wgmmas retire in order), and releases K's slot ``j - 1`` once that product has retired;
* the **epilogue** scales dQ by ``sm_scale`` and writes it through the (idle) Q tile with a TMA
  store, clipped to the sequence and the real head dim.

In the SASS (ptxas, Triton 3.6) the wait for ``dP_j`` lands right after the one for ``S_j``, ahead
of ``P_j``'s exponentials, whatever the order of the source (neither passing ``P`` as a dependency
of the wait nor moving V's release after ``dS_j`` moves it; the forward's overlapped order compiles
the same way): ``P_j`` and ``dS_j`` overlap the previous step's dQ product only.

Registers per consumer thread: the ``[64, HEAD_DIM]`` fp32 dQ accumulator (128 at hd256), S and
dP (``BLOCK_N / 2`` each) and the dS operand.  Shared memory: Q and dO ``2 * 2 * 64 * HEAD_DIM *
2`` bytes (128 KiB at hd256) plus the rings ``(K_STAGES + V_STAGES) * BLOCK_N * HEAD_DIM * 2``: at
hd256 ``BLOCK_N`` 64 takes ``K_STAGES`` 2 and ``V_STAGES`` 1 (224 KiB), ``BLOCK_N`` 32 takes 3
and 3.  The configs checked on the GPU are ``rules.GLUON_DQ_CONFIGS``.

Masks, tails and packing are the forward's: TMA zero-fills rows and head-dim columns past the
tensor (or the packed sequence: ``ragged.py``) and clips the dQ store; the scores of invisible
(query, key) pairs are set to -inf before the exponent, so they contribute nothing.  Query rows
past the sequence read the workspace's pad rows and are never stored.  A CTA whose rows see no
key walks no block and writes dQ = 0.  Dropout (``DROPOUT``): the forward's keep mask on the same
``[64, BLOCK_N]`` tiles (``dropout.py``, queries as rows), ``dP`` kept times ``dropout_scale``.

The contract (arguments, grid, workspace) is ``ABI.md``.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..flash import mask
from .dropout import dropout_keep_tile, dropout_state_fwd
from .fwd import (LOG2E, _issue_qk, _key_block_col, _mask_scores, _opaque_i32, _opt, _p_operand_layout, _tile_coords,
                  _tile_walk, _wgmma_layout)
from .ragged import query_block_sequence, row_coords


# ----------------------------------------------------------------------------
# Loader partition (1 warp)
# ----------------------------------------------------------------------------
@gluon.jit
def _loader(desc_q, desc_k, desc_v, desc_do, q_bufs, do_bufs, k_bufs, v_bufs, q_bars, k_ready, v_ready, k_empty,
            v_empty, off_z, off_h, off_hk, q_row0, q_end, q_len, k_end, k_len, n_full, full_lo, start, n_lead, full_hi,
            n_blocks, BLOCK_N: gl.constexpr, K_STAGES: gl.constexpr, V_STAGES: gl.constexpr,
            NUM_CONSUMERS: gl.constexpr):
    """Q and dO of every consumer, then the walk's K and V blocks (``fwd.py``'s ``_key_block_col`` order)."""
    q_rows: gl.constexpr = desc_q.block_type.shape[-2]
    for c in gl.static_range(NUM_CONSUMERS):
        row = q_row0 + c * q_rows
        mbarrier.expect(q_bars.index(c), desc_q.block_type.nbytes + desc_do.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, row_coords(desc_q, off_z, off_h, row, 0, q_end, q_len),
                                        q_bars.index(c), q_bufs.index(c))
        tma.async_copy_global_to_shared(desc_do, row_coords(desc_do, off_z, off_h, row, 0, q_end, q_len),
                                        q_bars.index(c), do_bufs.index(c))
    for it in range(n_blocks):
        col = _key_block_col(it, n_full, full_lo, start, n_lead, full_hi, BLOCK_N)
        # A fresh barrier is in phase 0, so waiting for phase 1 passes: the first round of each ring
        # needs no release.
        ks = it % K_STAGES
        mbarrier.wait(k_empty.index(ks), ((it // K_STAGES) & 1) ^ 1)
        mbarrier.expect(k_ready.index(ks), desc_k.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_k, row_coords(desc_k, off_z, off_hk, col, 0, k_end, k_len),
                                        k_ready.index(ks), k_bufs.index(ks))
        vs = it % V_STAGES
        mbarrier.wait(v_empty.index(vs), ((it // V_STAGES) & 1) ^ 1)
        mbarrier.expect(v_ready.index(vs), desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_v, row_coords(desc_v, off_z, off_hk, col, 0, k_end, k_len),
                                        v_ready.index(vs), v_bufs.index(vs))


# ----------------------------------------------------------------------------
# Consumer (one warpgroup, 64 query rows)
# ----------------------------------------------------------------------------
@gluon.jit
def _k_operand(k_bufs, slot):
    """K's ring slot ``slot`` as the dQ product's ``[BLOCK_N, HEAD_DIM]`` B operand."""
    return k_bufs.index(slot).reshape([k_bufs.shape[-2], k_bufs.shape[-1]])


@gluon.jit
def _dq_step(j, col, cid: gl.constexpr, q_bufs, do_bufs, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, dq,
             ds_prev, lse2, delta, qk_scale, rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, drop, MASKED: gl.constexpr,
             BLOCK_N: gl.constexpr, K_STAGES: gl.constexpr, V_STAGES: gl.constexpr, s_layout: gl.constexpr,
             DROPOUT: gl.constexpr):
    """Walk step ``j`` (key block at column ``col``): ``S_j``, ``dP_j`` and the previous step's
    ``dQ += dS_{j-1} K_{j-1}`` in flight together, ``P_j`` and ``dS_j`` computed while they run.
    Returns ``(dq, dS_j)``: dS_j's product goes out with step ``j + 1`` (or after the walk).  At
    ``j = 0`` there is no previous product: ``ds_prev`` is zero and meets K_0 (finite, loaded),
    which adds nothing."""
    ks = j % K_STAGES
    vs = j % V_STAGES
    # The Q/dO tiles through an opaque index: their wgmma descriptors are rebuilt each step (a few
    # integer ops) instead of being hoisted out of the walk, where they would hold 4 registers per
    # 16 columns of the head dim and spill (bwd.py's DESC_PER_STEP).
    qi = _opaque_i32(j * 0 + cid)
    q_smem = q_bufs.index(qi).reshape([q_bufs.shape[-2], q_bufs.shape[-1]])
    do_smem = do_bufs.index(qi).reshape([do_bufs.shape[-2], do_bufs.shape[-1]])
    prev_ks = gl.where(j > 0, (j + K_STAGES - 1) % K_STAGES, ks)
    mbarrier.wait(k_ready.index(ks), (j // K_STAGES) & 1)
    s = _issue_qk(q_smem, k_bufs, ks, s_layout)
    mbarrier.wait(v_ready.index(vs), (j // V_STAGES) & 1)
    dp = _issue_qk(do_smem, v_bufs, vs, s_layout)
    dq = warpgroup_mma(ds_prev, _k_operand(k_bufs, prev_ks), dq, is_async=True)
    # wgmmas retire in order: S_j first, then dP_j, then the dQ product.
    s = warpgroup_mma_wait(2, deps=(s, ))
    if MASKED:
        s = _mask_scores(s, rows, col, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, BLOCK_N)
    # Invisible scores are -inf and rows that see no key have lse2 = +inf: P = 0 either way.
    p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 1))
    dp = warpgroup_mma_wait(1, deps=(dp, ))
    mbarrier.arrive(v_empty.index(vs), count=1)
    if DROPOUT:
        seed, rows_counter, n_ctx_k_max, threshold, dropout_scale = drop
        ROWS: gl.constexpr = p.shape[0]
        keep = dropout_keep_tile(seed, rows_counter + col // 4, n_ctx_k_max, threshold, s_layout, ROWS, BLOCK_N,
                                 False, True)
        dp = gl.where(keep, dp * dropout_scale, 0.0)
    ds = p * (dp - gl.expand_dims(delta, 1))
    # The previous dS operand's registers are free only once its product has retired: wait before
    # making the next one (both live at once spill at hd256).
    dq, ds_prev = warpgroup_mma_wait(0, deps=(dq, ds_prev))
    ds_op = gl.convert_layout(ds.to(k_bufs.dtype), ds_prev.type.layout)
    if j > 0:
        mbarrier.arrive(k_empty.index(prev_ks), count=1)  # K_{j-1}: its dQ product has read it
    return dq, ds_op


@gluon.jit
def _consumer(cid: gl.constexpr, desc_dq, LSE2, DELTA2, q_bufs, do_bufs, k_bufs, v_bufs, q_bars, k_ready, v_ready,
              k_empty, v_empty, off_z, off_h, start_m, ws_row0, n_full, full_lo, start, n_lead, full_hi, n_blocks,
              sm_scale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, q_end, PHILOX_SEED, PHILOX_OFFSET,
              philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, N_CTX_Q_MAX, N_CTX_K_MAX,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, K_STAGES: gl.constexpr,
              V_STAGES: gl.constexpr, DROPOUT: gl.constexpr):
    """Rows ``cid * 64 ..`` of the CTA's block; ``ws_row0``: the workspace row of the CTA's first query."""
    QB: gl.constexpr = q_bufs.shape[-2]
    s_layout: gl.constexpr = _wgmma_layout(BLOCK_N, k_bufs.dtype)
    dq_layout: gl.constexpr = _wgmma_layout(HEAD_DIM, k_bufs.dtype)
    ds_layout: gl.constexpr = _p_operand_layout(dq_layout, k_bufs.dtype)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    q_tile = q_bufs.index(cid)
    q_smem = q_tile.reshape([QB, HEAD_DIM])
    row0 = start_m * BLOCK_M + cid * QB
    rows = row0 + gl.arange(0, QB, layout=row_layout)
    # The workspace holds SQ_PAD rows per head (pad rows: lse2 +inf, delta 0): no mask needed.
    ws_rows = ws_row0 + cid * QB + gl.arange(0, QB, layout=row_layout)
    lse2 = gl.load(LSE2 + ws_rows)
    delta = gl.load(DELTA2 + ws_rows)
    qk_scale = sm_scale * LOG2E
    drop = None
    if DROPOUT:
        seed, rows_counter, n_ctx_k_max, threshold = dropout_state_fwd(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base,
                                                                       DROPOUT_THRESHOLD, off_z, off_h, row0,
                                                                       N_CTX_Q_MAX, N_CTX_K_MAX)
        drop = (seed, rows_counter, n_ctx_k_max, threshold, dropout_scale)

    dq = gl.zeros([QB, HEAD_DIM], gl.float32, dq_layout)
    ds_prev = gl.zeros([QB, BLOCK_N], k_bufs.dtype, ds_layout)
    # Wait for Q even when there is no key block: the dQ store below reuses its buffer.
    mbarrier.wait(q_bars.index(cid), 0)
    # Key blocks visible in full to all the CTA's rows: no mask code; then the boundary blocks.
    for j in range(0, n_full):
        dq, ds_prev = _dq_step(j, full_lo + j * BLOCK_N, cid, q_bufs, do_bufs, k_bufs, v_bufs, k_ready, v_ready,
                               k_empty, v_empty, dq, ds_prev, lse2, delta, qk_scale, rows, N_CTX_K, WINDOW_LEFT,
                               WINDOW_RIGHT, diag, drop, False, BLOCK_N, K_STAGES, V_STAGES, s_layout, DROPOUT)
    for j in range(n_full, n_blocks):
        col = mask.block_walk_start(j - n_full, start, n_lead, full_hi, BLOCK_N)
        dq, ds_prev = _dq_step(j, col, cid, q_bufs, do_bufs, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, dq,
                               ds_prev, lse2, delta, qk_scale, rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, drop,
                               True, BLOCK_N, K_STAGES, V_STAGES, s_layout, DROPOUT)
    if n_blocks > 0:  # the last step's dQ product has no partner
        last_ks = (n_blocks - 1) % K_STAGES
        dq = warpgroup_mma(ds_prev, _k_operand(k_bufs, last_ks), dq, is_async=True)
        dq, ds_prev = warpgroup_mma_wait(0, deps=(dq, ds_prev))
        mbarrier.arrive(k_empty.index(last_ks), count=1)

    # dQ through the Q tile (every product that read Q has retired) and a TMA store.
    q_smem.store((dq * sm_scale).to(desc_dq.dtype))
    fence_async_shared()  # order the generic-proxy smem writes before the async-proxy (TMA) read
    tma.async_copy_shared_to_global(desc_dq, row_coords(desc_dq, off_z, off_h, row0, 0, q_end, N_CTX_Q), q_tile)
    tma.store_wait(0)


# ----------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------
# No JIT specialization of the integers (the runtime launches one generic AOT image; see bwd.py).
@gluon.jit(do_not_specialize=["N_CTX_Q", "N_CTX_K", "SQ_PAD", "GQA_GROUP", "WINDOW_LEFT", "WINDOW_RIGHT",
                              "ALIGN_BOTTOM_RIGHT", "IS_VARLEN", "N_TOKENS_Q", "N_TOKENS_K", "STORE_VARLEN_STATUS",
                              "DROPOUT_THRESHOLD", "dropout_scale", "philox_offset_base"])
def attn_bwd_gluon_dq(desc_q, desc_k, desc_v, desc_do, desc_dq, LSE2, DELTA2, sm_scale, N_CTX_Q, N_CTX_K, SQ_PAD,
                      GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT,
                      IS_VARLEN, CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q, N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS,
                      DROPOUT_THRESHOLD, dropout_scale, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      K_STAGES: gl.constexpr, V_STAGES: gl.constexpr, DROPOUT: gl.constexpr = 0,
                      CONSUMER_REGS: gl.constexpr = 240, LOADER_REGS: gl.constexpr = 24):
    # Options left out of an AOT compile arrive as None: the defaults above.
    C_REGS: gl.constexpr = _opt(CONSUMER_REGS, 240)
    L_REGS: gl.constexpr = _opt(LOADER_REGS, 24)
    DROP: gl.constexpr = _opt(DROPOUT, 0)
    gl.static_assert(BLOCK_M == 128, "two consumer warpgroups of 64 query rows")
    gl.static_assert(desc_q.block_type.shape[-2] == 64, "Q/dO/dQ descriptor block: [.., 64, HEAD_DIM]")
    gl.static_assert(desc_q.block_type.shape[-1] == HEAD_DIM, "Q/dO/dQ descriptor block: [.., 64, HEAD_DIM]")
    gl.static_assert(desc_k.block_type.shape[-2] == BLOCK_N, "K/V descriptor block: [.., BLOCK_N, HEAD_DIM]")
    gl.static_assert(desc_k.block_type.shape[-1] == HEAD_DIM, "K/V descriptor block: [.., BLOCK_N, HEAD_DIM]")

    start_m, off_h, off_z = _tile_coords(0)  # heaviest query blocks first (causal), as the forward
    off_hk = off_h // GQA_GROUP
    # Workspace rows (and dropout's counters) are laid out for the kernel's (maximum) lengths.
    N_CTX_Q_MAX = N_CTX_Q
    N_CTX_K_MAX = N_CTX_K
    N_CTX_Q, N_CTX_K, q_end, k_end, empty = query_block_sequence(desc_q, off_z, start_m * BLOCK_M, N_CTX_Q, N_CTX_K,
                                                                 IS_VARLEN, CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q,
                                                                 N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS)
    if empty:  # a shorter sequence of a packed batch: no rows here
        return
    ws_row0 = (off_z.to(gl.int64) * gl.num_programs(1) + off_h) * SQ_PAD + start_m * BLOCK_M

    # -- the CTA's key blocks: full ones, then the boundary walk (mask.py) ---------
    diag = mask.diag_offset(N_CTX_Q, N_CTX_K, ALIGN_BOTTOM_RIGHT)
    n_full, full_lo, start, n_lead, full_hi, n_blocks = _tile_walk(start_m, N_CTX_Q, N_CTX_K, WINDOW_LEFT,
                                                                   WINDOW_RIGHT, diag, BLOCK_M, BLOCK_N)

    # -- shared memory: Q (later dQ) and dO per consumer, the K and V rings, barriers --
    q_bufs = gl.allocate_shared_memory(desc_q.dtype, [2] + desc_q.block_type.shape, desc_q.layout)
    do_bufs = gl.allocate_shared_memory(desc_do.dtype, [2] + desc_do.block_type.shape, desc_do.layout)
    k_bufs = gl.allocate_shared_memory(desc_k.dtype, [K_STAGES] + desc_k.block_type.shape, desc_k.layout)
    v_bufs = gl.allocate_shared_memory(desc_v.dtype, [V_STAGES] + desc_v.block_type.shape, desc_v.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2):
        mbarrier.init(q_bars.index(c), count=1)
    for i in gl.static_range(K_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # released by both consumers
    for i in gl.static_range(V_STAGES):
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=2)

    # Argument tuples inline (see fwd.py): each consumer's id stays a constexpr.
    gl.warp_specialize([
        (_consumer, (0, desc_dq, LSE2, DELTA2, q_bufs, do_bufs, k_bufs, v_bufs, q_bars, k_ready, v_ready, k_empty,
                     v_empty, off_z, off_h, start_m, ws_row0, n_full, full_lo, start, n_lead, full_hi, n_blocks,
                     sm_scale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, q_end, PHILOX_SEED, PHILOX_OFFSET,
                     philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_DIM,
                     BLOCK_M, BLOCK_N, K_STAGES, V_STAGES, DROP)),
        (_consumer, (1, desc_dq, LSE2, DELTA2, q_bufs, do_bufs, k_bufs, v_bufs, q_bars, k_ready, v_ready, k_empty,
                     v_empty, off_z, off_h, start_m, ws_row0, n_full, full_lo, start, n_lead, full_hi, n_blocks,
                     sm_scale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, q_end, PHILOX_SEED, PHILOX_OFFSET,
                     philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_DIM,
                     BLOCK_M, BLOCK_N, K_STAGES, V_STAGES, DROP)),
        (_loader, (desc_q, desc_k, desc_v, desc_do, q_bufs, do_bufs, k_bufs, v_bufs, q_bars, k_ready, v_ready, k_empty,
                   v_empty, off_z, off_h, off_hk, start_m * BLOCK_M, q_end, N_CTX_Q, k_end, N_CTX_K, n_full, full_lo,
                   start, n_lead, full_hi, n_blocks, BLOCK_N, K_STAGES, V_STAGES, 2)),
    ], [4, 1], [C_REGS, L_REGS])
