"""The compute partition of ``attn_bwd_gluon`` for the head-dim bucket 256 (``bwd.py`` has the rest).

At hd256 the layout of ``bwd.py`` (each compute warpgroup owns 64 keys and all head-dim columns
of their dK and dV) needs 2 x 64 x 256 fp32 accumulators per warpgroup: 256 registers per thread,
more than a thread has.  Here, as in FlashAttention-3's hd256 backward, a CTA owns ``BLOCK_N`` = 64
keys and the two compute warpgroups split the *head dim* of everything that has one:

* S^T = K Q^T and dP^T = V dO^T: warpgroup ``cid`` computes the 64 keys x its ``BLOCK_M / 2`` = 32
  queries (columns ``cid * 32 ..``), over the whole head dim (SS wgmma);
* both warpgroups publish their halves of P^T and dS^T into shared ``[64 keys, 64 queries]`` tiles
  (double-buffered, ``pds_full`` / ``pds_empty``);
* dV[:, half] += P^T dO[:, half] and dK[:, half] += dS^T Q[:, half] (SS wgmma, A = the shared
  tile): warpgroup ``cid`` owns head-dim columns ``cid * 128 ..`` of its keys' dK and dV
  (2 x 64 x 128 fp32 = 128 registers per thread);
* dQ[:, half] = dS K[:, half] (``COMPUTE_DQ``): the same columns of dQ, into the fp32 dQ tile's
  strips, which the dQ reducer adds to ``dq_acc`` (as in ``bwd.py``).

Loader, dQ reducer, step order, masks, workspace and barriers' meaning are ``bwd.py``'s.  Shared
memory (bytes): K, V ``2 * 64 * 256 * 2`` = 65536; Q, dO ``2 * 64 * 256 * 2`` = 65536 per stage;
P^T, dS^T ``2 * 2 * 64 * 64 * 2`` = 32768; a separate fp32 dQ tile would take ``64 * 256 * 4`` =
65536 more, which leaves room for one stage only (230528 bytes with barriers and the lse2/delta2
rows, under sm_90's 232448), and a one-stage ring exposes every step's 64 KiB Q/dO load.  With
``DQ_IN_RING`` (bwd.py) the fp32 dQ tile is not allocated: each warpgroup writes its half over the
step's own Q (warpgroup 0) or dO (warpgroup 1) ring slot, 32 KiB each, once both warpgroups' dV/dK
products have read it, and the ring takes 2 stages (230,992 bytes; ptxas, bf16: spill instructions
115 -> 59; 0.65 -> 0.78 of cuDNN, H100).  Even so the per-step 64 KiB reduce-add costs the kernel
nearly half its time, so the archive holds only the kernel without dQ (``COMPUTE_DQ`` 0, a 2-stage
ring, no dQ tile), and the runtime takes dQ from the portable ``attn_bwd_dq`` after it (0.96 of
cuDNN, H100; python/rules.py ``GLUON_FUSED_DQ_MAX_HEAD_DIM``).  The fused path stays for
test/gluon/check_bwd.py's hd256 dQ cases.
ptxas: the default partition (compute warpgroup 0, which also holds the kernel's prologue values)
spills the most, mostly wgmma descriptors hoisted out of the step loop (fewer with
``DESC_PER_STEP``, bwd.py); the worker does not spill.
The P^T / dS^T tiles use a 64-byte swizzle so that each warpgroup's 32 query columns are whole
swizzle panels (a 128-byte swizzle would interleave the two halves of a row).
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

from .bwd_steps import full_coords, key_bounds, mask_boundary, masked_coords, store_partials
from .fwd import LOG2E, _opaque_i32
from .dropout import dpt_init, dropout_ds, dropout_state_bwd, dropped_probs, sign_dropped
from .ragged import col_dim, row_coords


@gluon.jit
def _wide_step(j, start_m, masked, cid: gl.constexpr, k_all, v_all, k_cols, q_bufs, do_bufs, lse_bufs, dlt_bufs,
               pt_bufs, ds_bufs, dq_smem, q_ready, q_empty, pds_full, pds_empty, dq_full, dq_empty, dk, dv,
               key_lo, key_hi, qk_scale, MASK: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, STAGES: gl.constexpr, COMPUTE_DQ: gl.constexpr, DESC_PER_STEP: gl.constexpr,
               h_off=0, k0=0, drop=None, DROPOUT: gl.constexpr = 0, DQ_IN_RING: gl.constexpr = 0):
    """One step of ``BLOCK_M`` queries; ``MASK``: 0 none, 1 always, 2 when the runtime ``masked`` is true.
    Dropout as in ``bwd.py``'s ``_compute_step`` (the CTA's keys from ``k0``).  ``dq_empty``: the
    barrier after which the dQ tile's memory may be written (``DQ_IN_RING``: ``slot_read``, one per
    ring slot, both warpgroups arrive; else the reducer's)."""
    QH: gl.constexpr = BLOCK_M // 2  # queries of this warpgroup's S^T / dP^T
    DH: gl.constexpr = HEAD_DIM // 2  # dK / dV / dQ columns of this warpgroup
    dtype: gl.constexpr = k_all.dtype
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, QH, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DH, 16])
    col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)  # per query (columns of S^T)

    idx = j % STAGES
    if DESC_PER_STEP:  # bwd.py: keeps the Q/dO descriptors from being hoisted out of the loop
        idx = _opaque_i32(idx)
    mbarrier.wait(q_ready.index(idx), (j // STAGES) & 1)
    q = q_bufs.index(idx).reshape([BLOCK_M, HEAD_DIM])
    do = do_bufs.index(idx).reshape([BLOCK_M, HEAD_DIM])
    s0 = gl.zeros([BLOCK_N, QH], gl.float32, st_layout)
    st = warpgroup_mma(k_all, q.slice(cid * QH, QH, dim=0).permute((1, 0)), s0, use_acc=False, is_async=True)
    # dP^T - delta with the accumulator started at -delta (dropout: -delta (1 - p)), as in bwd.py.
    delta = dlt_bufs.index(idx).reshape([BLOCK_M]).slice(cid * QH, QH).load(col_layout)
    lse2 = lse_bufs.index(idx).reshape([BLOCK_M]).slice(cid * QH, QH).load(col_layout)
    dpt = warpgroup_mma(v_all, do.slice(cid * QH, QH, dim=0).permute((1, 0)), dpt_init(s0, delta, drop, DROPOUT),
                        is_async=True)
    st = warpgroup_mma_wait(1, deps=(st, ))
    pt = gl.exp2(st * qk_scale - gl.expand_dims(lse2, 0))
    if MASK == 1:
        pt = mask_boundary(pt, start_m + cid * QH, key_lo, key_hi, QH, col_layout)
    elif MASK == 2:
        if masked:
            pt = mask_boundary(pt, start_m + cid * QH, key_lo, key_hi, QH, col_layout)
    dpt = warpgroup_mma_wait(0, deps=(dpt, ))
    if DROPOUT:
        pt = sign_dropped(pt, drop, h_off, start_m + cid * QH, k0, HEAD_DIM)
        # delta read again from the ring slot (still held): not live across the wgmmas.
        delta_again = dlt_bufs.index(idx).reshape([BLOCK_M]).slice(cid * QH, QH).load(col_layout)
        dst = dropout_ds(pt, dpt, delta_again, drop)
        pt_lp = dropped_probs(pt, dtype)
    else:
        dst = pt * dpt
        pt_lp = pt.to(dtype)

    # Publish this warpgroup's query columns of P^T and dS^T; then both tiles are the A operands.
    pb = j % 2
    pph = (j // 2) & 1
    pt_tile = pt_bufs.index(pb)
    ds_tile = ds_bufs.index(pb)
    mbarrier.wait(pds_empty.index(pb), pph ^ 1)
    pt_tile.slice(cid * QH, QH, dim=1).store(pt_lp)
    ds_tile.slice(cid * QH, QH, dim=1).store(dst.to(dtype))
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(pds_full.index(pb), count=1)
    mbarrier.wait(pds_full.index(pb), pph)
    dv = warpgroup_mma(pt_tile, do.slice(cid * DH, DH, dim=1), dv, is_async=True)
    dk = warpgroup_mma(ds_tile, q.slice(cid * DH, DH, dim=1), dk, is_async=True)
    if COMPUTE_DQ:
        dq = warpgroup_mma(ds_tile.permute((1, 0)), k_cols, gl.zeros([BLOCK_M, DH], gl.float32, dq_layout),
                           use_acc=False, is_async=True)
        dv, dk, dq = warpgroup_mma_wait(0, deps=(dv, dk, dq))
    else:
        dv, dk = warpgroup_mma_wait(0, deps=(dv, dk))
    gl.thread_barrier()  # every warp's wgmmas on slot idx and on the P^T / dS^T tiles are complete
    mbarrier.arrive(pds_empty.index(pb), count=1)
    if DQ_IN_RING:
        # Both warpgroups' dV / dK products have read Q and dO of slot idx: this warpgroup's half of
        # the fp32 dQ tile overwrites the slot's Q (cid 0) or dO (cid 1); the reducer frees the slot.
        mbarrier.arrive(dq_empty.index(idx), count=1)
        mbarrier.wait(dq_empty.index(idx), (j // STAGES) & 1)
        if cid == 0:
            dq_half = dq_smem.index(idx)
        else:
            dq_half = ring_like(do_bufs, dq_smem).index(idx)
        dq_half.store(_dq_strips(dq, BLOCK_M, DH, dq_half.shape[1]))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(dq_full.index(idx), count=1)
    else:
        mbarrier.arrive(q_empty.index(idx), count=1)
        if COMPUTE_DQ:
            mbarrier.wait(dq_empty, (j & 1) ^ 1)  # the reducer has read the previous tile
            W: gl.constexpr = dq_smem.shape[1]
            dq_smem.slice(cid * (DH // W * BLOCK_M), DH // W * BLOCK_M, dim=0).store(_dq_strips(dq, BLOCK_M, DH, W))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(dq_full, count=1)
    return dk, dv


@gluon.jit
def _dq_strips(dq, BLOCK_M: gl.constexpr, DH: gl.constexpr, W: gl.constexpr):
    """A warpgroup's ``[BLOCK_M, DH]`` dQ accumulator as ``DH / W`` column strips ``[BLOCK_M, W]``, one under the other."""
    return dq.reshape([BLOCK_M, DH // W, W]).permute((1, 0, 2)).reshape([DH // W * BLOCK_M, W])


@gluon.jit
def ring_like(bufs, like):
    """A ring of 16-bit Q or dO slots seen as ``like`` (``DQ_IN_RING``: the Q ring as fp32 dQ column strips,
    ``[STAGES, HEAD_DIM / 2 / 8 * 64, 8]``: a 32 KiB ``[64, 256]`` slot holds half of a step's dQ tile)."""
    gl.static_assert(bufs.dtype.primitive_bitwidth == 16, "DQ_IN_RING: a 16-bit Q/dO ring")
    return bufs._reinterpret(like.dtype, like.shape, like.layout)


@gluon.jit
def compute_wide(cid: gl.constexpr, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs, pt_bufs,
                 ds_bufs, dq_smem, kv_bar, done_bar, q_ready, q_empty, pds_full, pds_empty, dq_full, dq_empty,
                 sm_scale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, k_end,
                 b, hk, start_n, start, full_lo, full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps,
                 PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, h_first, N_HEADS_Q,
                 N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                 COMPUTE_DQ: gl.constexpr, MASK_MODE: gl.constexpr, DESC_PER_STEP: gl.constexpr, WALK: gl.constexpr,
                 DROPOUT: gl.constexpr = 0, DQ_IN_RING: gl.constexpr = 0):
    """One compute warpgroup: the ``BLOCK_N`` keys from ``start_n``, head-dim columns ``cid * HEAD_DIM / 2 ..``.
    ``k_end``: where sequence ``b``'s keys end among a packed batch's rows (ragged descriptors only).
    Dropout: as ``bwd.py``'s ``_compute``."""
    QH: gl.constexpr = BLOCK_M // 2
    DH: gl.constexpr = HEAD_DIM // 2
    dtype: gl.constexpr = k_smem.dtype
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, QH, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, DH, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, st_layout)  # per key (rows of S^T)

    k_all = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v_all = v_smem.reshape([BLOCK_N, HEAD_DIM])
    k_cols = k_all.slice(cid * DH, DH, dim=1)  # B operand of dQ = dS K for this warpgroup's columns
    qk_scale = sm_scale * LOG2E
    # The mask solved per key row (bwd.py's _compute): visible to queries [key_lo, key_hi].
    offs_k = start_n + gl.arange(0, BLOCK_N, layout=row_layout)
    key_lo, key_hi = key_bounds(offs_k, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag)
    key_tail = start_n + BLOCK_N > N_CTX_K

    dk = gl.zeros([BLOCK_N, DH], gl.float32, acc_layout)
    dv = gl.zeros([BLOCK_N, DH], gl.float32, acc_layout)
    drop = None
    if DROPOUT:
        drop = dropout_state_bwd(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, b,
                                 h_first, N_HEADS_Q, N_CTX_Q_MAX, N_CTX_K_MAX)
    mbarrier.wait(kv_bar, 0)
    for j in range(n_mask_steps):  # MASK_MODE 2: the boundary steps first, masked
        h_off, start_m = masked_coords(j, n_mblk, n_lead, start, f_gap, BLOCK_M)
        dk, dv = _wide_step(j, start_m, True, cid, k_all, v_all, k_cols, q_bufs, do_bufs, lse_bufs, dlt_bufs,
                            pt_bufs, ds_bufs, dq_smem, q_ready, q_empty, pds_full, pds_empty, dq_full, dq_empty,
                            dk, dv, key_lo, key_hi, qk_scale, 1, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ,
                            DESC_PER_STEP, h_off, start_n, drop, DROPOUT, DQ_IN_RING)
    STEP_MASK: gl.constexpr = 2 if MASK_MODE == 0 else (1 if MASK_MODE == 1 else 0)
    for j in range(n_mask_steps, n_steps):
        h_off, start_m = full_coords(j, n_mask_steps, n_fblk, f_lo, n_steps, BLOCK_M, WALK)
        masked = key_tail | (start_m < full_lo) | (start_m >= full_hi)
        dk, dv = _wide_step(j, start_m, masked, cid, k_all, v_all, k_cols, q_bufs, do_bufs, lse_bufs, dlt_bufs,
                            pt_bufs, ds_bufs, dq_smem, q_ready, q_empty, pds_full, pds_empty, dq_full, dq_empty,
                            dk, dv, key_lo, key_hi, qk_scale, STEP_MASK, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                            COMPUTE_DQ, DESC_PER_STEP, h_off, start_n, drop, DROPOUT, DQ_IN_RING)
    if DROPOUT:
        dv = dv * dropout_scale

    # Epilogue: K and V are dead once both warpgroups' last wgmmas (dQ reads all of K, and each
    # warpgroup's S^T / dP^T read all of K and V) are done; dK and dV go out through them.
    mbarrier.arrive(done_bar, count=1)
    mbarrier.wait(done_bar, 0)
    if HEAD_SPLIT > 1:
        store_partials(DKV_PARTIALS, HEAD_SPLIT, dk * sm_scale, dv, desc_dk, b, hk, N_CTX_K, start_n, cid * DH,
                       HEAD_DIM)
    else:
        k_out = k_smem.slice(cid * DH, DH, dim=col_dim(k_smem.shape))
        v_out = v_smem.slice(cid * DH, DH, dim=col_dim(v_smem.shape))
        v_all.slice(cid * DH, DH, dim=1).store(dv.to(dtype))
        k_all.slice(cid * DH, DH, dim=1).store((dk * sm_scale).to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(desc_dv, row_coords(desc_dv, b, hk, start_n, cid * DH, k_end, N_CTX_K), v_out)
        tma.async_copy_shared_to_global(desc_dk, row_coords(desc_dk, b, hk, start_n, cid * DH, k_end, N_CTX_K), k_out)
        tma.store_wait(0)
