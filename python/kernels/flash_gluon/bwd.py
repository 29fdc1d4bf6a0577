"""FlashAttention backward for Hopper (sm_90) in Gluon: ``attn_bwd_gluon``, step 2 of 3 (``ABI.md``).

One CTA per (block of ``BLOCK_N`` = 128 keys (64 at hd256: ``bwd_wide.py``), K/V head ``hk``, batch ``b``); grid
``(cdiv(Sk, 128), Hk, B)``.  Per CTA, dK and dV of its 128 keys accumulate in registers over
every query head of the GQA group and every query block the window lets the key block see,
then are written once (TMA, clipped to ``Sk`` and to the real head dim): no atomics, bitwise
reproducible.  dQ partials ``dS K`` go to the fp32 workspace ``dq_acc`` by TMA reduce-add when
``COMPUTE_DQ`` (the order of the adds varies run to run); ``bwd_dq_convert.py`` scales and
casts them.  ``bwd_preprocess.py`` has already written ``lse2 = LSE * log2(e)`` and
``delta2 = rowsum(dO * O)`` (per padded row) and zeroed ``dq_acc``.

Warp specialization (FA3 style; 4 partitions, 10 warps padded to 12 = 384 threads):

* compute warpgroup 0 (the default partition) and compute warpgroup 1 (a worker): each owns 64
  of the 128 keys and keeps their dK, dV in registers.  Per step of ``BLOCK_M`` = 64 queries,
  in the transposed orientation (keys x queries, so P^T and dS^T are register A operands):

      S^T = K Q^T, dP^T - delta = V dO^T - delta  (SS wgmma, async; the accumulator starts at -delta)
      P^T = exp2(S^T * sm_scale * log2e - lse2)   (masked only on boundary blocks)
      dV += P^T dO                                (RS)
      dS^T = P^T (dP^T - delta)
      dK += dS^T Q                                (RS)
      dQ[:, half d] = dS K[:, half d]             (COMPUTE_DQ: A = the shared dS^T of BOTH
                                                   warpgroups, transposed; each warpgroup
                                                   computes one half of the head dim)

* loader (1 warp): TMA of Q, dO (rank-4 ``[1, 1, 64, HEAD_DIM]`` boxes) and the 64-element
  lse2 and delta2 rows into a ``STAGES``-deep ring;
* dQ reducer (1 warp, ``COMPUTE_DQ`` only): TMA reduce-add of the fp32 dQ tile into ``dq_acc``.

The fp32 dQ tile is kept in shared memory as ``HEAD_DIM / 8`` column strips of ``[64, 8]`` (32 bytes
per row, unswizzled, one under the other; ``desc_dq_acc``'s block is one strip, the reducer issues one
reduce per strip): a warp's 8-byte stores of its wgmma accumulator then fill whole 128-byte lines,
where a 128-byte-swizzled ``[64, HEAD_DIM]`` tile took twice the shared-memory wavefronts (Nsight
Compute on the H200: 9 % of all shared wavefronts were bank-conflict excess).

Every hand-off between partitions is an mbarrier (no CTA-wide ``bar.sync`` in the loop):
``q_ready``/``q_empty`` (ring), ``ds_full``/``ds_empty`` (double-buffered dS^T tile),
``dq_full``/``dq_empty`` (the fp32 dQ tile), ``kv_bar`` (K, V landed), ``done_bar`` (both
warpgroups' dQ wgmmas, which read all of K, are finished before K is overwritten by dK).  A Gluon
``mbarrier.arrive`` is one arrive by thread 0 of the partition, so an arrive that publishes
shared-memory stores (or the end of wgmmas) follows ``fence_async_shared()`` (stores only) and
``gl.thread_barrier()`` (a named barrier of the partition's own warps).

Every partition walks the same sequence of (query head, query block) steps, ``_step_coords``:
step ``j`` of ``GQA_GROUP * n_blocks`` is head ``hk * GQA_GROUP + j // n_blocks``, query block
``start + (j % n_blocks) * 64``, with ``[start, end)`` from ``kernels/flash/mask.py``'s
``query_block_bounds`` (the same bounds and window semantics as the portable backward).

Tails and padding cost no code: TMA zero-fills Q/dO rows past ``Sq`` (and their lse2 = +inf, so
P = 0, and delta2 = 0) and K/V rows past ``Sk`` and the head-dim columns past ``D``; the dK/dV
stores clip them.  Masking: a step is *masked* when its query block straddles an edge of the
window (``[start, full_lo)``, ``[full_hi, end)`` of ``query_block_bounds``) or the key block holds
the key tail (zero K rows give P = exp2(-lse2), finite but not 0: masked so that no inf/NaN can
reach dQ).  The mask is solved per key row before the loop (``key_lo``/``key_hi``: the query range a
key sees) and costs two compares and a select per element where applied.

Dropout (constexpr ``DROPOUT``, one CTA per key block): each step draws the keep bits of its
``[64 keys, 64 queries]`` tile with the forward's counters (``dropout.py``), in the registers that hold
P^T; the bit rides in P^T's sign until dS^T is formed (no mask register live across the dV product),
dV = (P^T * Z) dO is scaled by ``1 / (1 - p)`` once at the end, dS^T = P^T (Z dP^T / (1 - p) - delta)
re-reads delta from the ring slot.  The keep bits go into P^T's sign bits straight from the Philox
words (``dropout.SIGNS_FROM_WORDS``), Philox's rounds as a loop up to hd128
(``dropout.BWD_ROUNDS_LOOP_MAX_HEAD_DIM``).  SASS (sm_90, bf16, hd128, ``COMPUTE_DQ``, 2026-12-07):
the step loop's code 1,120 instructions, 31 of them local loads/stores, 110 spill instructions in
the whole kernel; none at hd64.

Performance options (constexprs after ``COMPUTE_DQ`` and ``DROPOUT``, all with defaults; every value is fully general,
the results differ only in fp32 summation order; ``test/gluon/sweep_bwd.py`` times them):

* ``MASK_MODE`` (default 0): where the mask is applied.  0: one uniform branch per step (masked
  steps as above); 1: on every step (no branch; a no-op on interior steps; the simplest register
  allocation); 2: the walk is split, every partition first walks the boundary steps of all heads
  (masked, ``bwd_steps.masked_coords``) then the interior steps (no mask code, ``full_coords``).
* ``CONS_REGS`` (default 240): ``setmaxnreg`` of the compute worker warpgroup (multiple of 8).
* ``DK_SS`` (default 0): dK += dS^T Q reads dS^T from the shared tile (SS wgmma) instead of
  registers; only with ``COMPUTE_DQ`` (ignored otherwise).

* ``DESC_PER_STEP`` (default 0; hd256 only): 1 passes the ring slot index through an opaque ``mov``
  each step, so the wgmma descriptors of the Q/dO tiles are rebuilt per step instead of being
  hoisted out of the step loop, where the default partition spills them (ptxas: 368 -> 152 bytes of
  spill stores at hd256).

* ``DQ_IN_RING`` (default 0; hd256 with ``COMPUTE_DQ`` only, ``bwd_wide.py``): a step's fp32 dQ tile is
  written over its own ring slot's Q and dO once both compute warpgroups' dV / dK products have read
  them (per-slot ``slot_read``), and the dQ reducer, not the warpgroups, gives the slot back to the
  loader; the separate 64 KiB dQ tile goes, so the ring can hold 2 stages (230,992 B of shared memory).

* ``WALK`` (default 0): the order of the (query head, query block) steps of the contiguous walk
  (``bwd_steps.full_coords``).  0 head-major; 1 block-major with the group's heads innermost, from the
  last query block down (under a causal mask every key block's walk ends at the last query block, so
  the CTAs of one K/V head then read the same Q/dO tiles at the same time); 2 block-major, heads
  innermost, from the first block up.

* ``PERSISTENT`` (default 0): 0 one CTA per key block, grid ``(cdiv(Sk, 128), Hk, B)``; 1 / 2 the
  persistent kernel, grid ``(max(1, min(cdiv(Sk, 128) * Hk * B, #SMs)), 1, 1)`` (any grid >= 1 is
  correct), each CTA walking work units ``pid, pid + G, ...``: 1 head-major, a unit = the key-block
  pair ``(p, n_kb - 1 - p)`` of one head under a one-sided window (causal), else one key block; 2
  key-block major (LPT under causal).  See "Persistent variant" below.

An AOT signature that omits them (passes None) gets the defaults.

Head split (runtime ``HEAD_SPLIT`` > 1, fixed-length batches, ``PERSISTENT`` 0): the grid's second dimension
is ``Hk * HEAD_SPLIT`` and CTA ``(n, hk * HEAD_SPLIT + p, b)`` walks part ``p`` of the GQA group's query
heads (``ceil(G / HEAD_SPLIT)`` of them, the last part fewer or none).  When ``G * Sq`` is large, one CTA
per key block walks so many steps that the CTAs of a K/V head drift apart and their Q/dO/dQ tiles stop
sharing L2 (hd128 causal, Hq/Hk 64/8 S16k: 0.73 of cuDNN on the H100, 0.97 split in two).  Each part's
fp32 dK (scaled) and dV go to the workspace's partials with plain stores (``bwd_steps.store_partials``)
and ``bwd_dkdv_convert.py`` sums them in part order: no atomics, the same bits every run.

Shared memory (bytes): K, V ``2 * 128 * HEAD_DIM * 2``; ring ``STAGES * (2 * 64 * HEAD_DIM * 2 +
512)``; with ``COMPUTE_DQ`` a double-buffered dS^T tile ``2 * 128 * 64 * 2`` and the fp32 dQ tile
``64 * HEAD_DIM * 4``.  hd128: 231504 B (STAGES 3) / 198192 B (STAGES 2), under sm_90's 232448.

Registers: ``maxnreg`` 168 (65536 / 384); the compute worker gets ``CONS_REGS`` (240), the
loader/reducer warpgroup ``LOAD_REGS`` (24), the default partition the rest.  At hd128 the compute
partitions sit at the limit.  Starting dP^T's accumulator at -delta keeps the delta vector out of
the registers live where dS^T is formed; with it the interior steps of both compute loops spill
nothing at hd128 (bf16, COMPUTE_DQ, STAGES 2; checked in the SASS for MASK_MODE 0 with CONS_REGS 240
and MASK_MODE 1 with 232): what ptxas still saves and restores sits in the masked branch of
MASK_MODE 0 (boundary steps only) and around the loops.  Nsight Compute counted 9.1 M local-memory requests per hd128 S4096 backward before
(delta subtracted after dP^T), 0.1 M after.  hd64 does not spill.  hd256 does not fit this layout
(dK + dV of 64 keys x 256 would take 256 accumulator registers per thread): the bucket 256 runs
``bwd_wide.py``'s compute partitions instead (64 keys per CTA, the head dim split between the
warpgroups), with this file's loader, dQ reducer, walk and workspace.
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
from .fwd import LOG2E, _ctaid_x, _nctaid_x, _opaque_f32, _opaque_i32
from .ragged import is_ragged, row_coords, row_dim, sequence_bounds
from .bwd_steps import full_coords, key_bounds, mask_boundary, masked_coords, store_partials
from .bwd_wide import compute_wide, ring_like
from .dropout import dpt_init, dropout_ds, dropout_state_bwd, dropped_probs, sign_dropped
from .private_api import tma_reduce_add

#: Registers per thread of the loader/reducer warpgroup (setmaxnreg); the compute worker gets the
#: constexpr ``CONS_REGS`` (default 240), the default partition (compute warpgroup 0) what remains.
LOAD_REGS: gl.constexpr = gl.constexpr(24)
#: The same for the persistent kernel (its loader and reducer walk the tile schedule themselves).
PERS_LOAD_REGS: gl.constexpr = gl.constexpr(24)


@gluon.jit
def _row_vector(bufs, idx, BLOCK_M: gl.constexpr, layout: gl.constexpr):
    """The 64 fp32 values of ring slot ``idx`` of an lse2/delta2 ring (``[STAGES, 1, 64]``) in ``layout``."""
    return bufs.index(idx).reshape([BLOCK_M]).load(layout)


# ---------------------------------------------------------------------------------------------
# partitions
# ---------------------------------------------------------------------------------------------
@gluon.jit
def _load_step(j, h_off, start_m, desc_q, desc_do, desc_lse2, desc_delta2, q_bufs, do_bufs, lse_bufs, dlt_bufs,
               q_ready, q_empty, b, q_end, q_len, h_first, b_row, SQ_PAD, BLOCK_M: gl.constexpr,
               STAGES: gl.constexpr):
    nbytes: gl.constexpr = 2 * desc_q.block_type.nbytes + 2 * desc_lse2.block_type.nbytes
    h = h_first + h_off
    row = (b_row + h) * SQ_PAD + start_m  # workspace row of (b, h, start_m)
    idx = j % STAGES
    mbarrier.wait(q_empty.index(idx), ((j // STAGES) & 1) ^ 1)  # slot released by both warpgroups
    bar = q_ready.index(idx)
    mbarrier.expect(bar, nbytes)
    tma.async_copy_global_to_shared(desc_q, row_coords(desc_q, b, h, start_m, 0, q_end, q_len), bar, q_bufs.index(idx))
    tma.async_copy_global_to_shared(desc_do, row_coords(desc_do, b, h, start_m, 0, q_end, q_len), bar,
                                    do_bufs.index(idx))
    tma.async_copy_global_to_shared(desc_lse2, [row // BLOCK_M, 0], bar, lse_bufs.index(idx))
    tma.async_copy_global_to_shared(desc_delta2, [row // BLOCK_M, 0], bar, dlt_bufs.index(idx))


@gluon.jit
def _loader(desc_q, desc_do, desc_lse2, desc_delta2, q_bufs, do_bufs, lse_bufs, dlt_bufs, q_ready, q_empty,
            b, q_end, q_len, h_first, b_row, start, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps, SQ_PAD,
            BLOCK_M: gl.constexpr, STAGES: gl.constexpr, WALK: gl.constexpr):
    """``q_end``/``q_len``: where the packed sequence ``b`` ends and its query count (read with ragged
    descriptors only: ``ragged.row_coords``)."""
    for j in range(n_mask_steps):
        h_off, start_m = masked_coords(j, n_mblk, n_lead, start, f_gap, BLOCK_M)
        _load_step(j, h_off, start_m, desc_q, desc_do, desc_lse2, desc_delta2, q_bufs, do_bufs, lse_bufs, dlt_bufs,
                   q_ready, q_empty, b, q_end, q_len, h_first, b_row, SQ_PAD, BLOCK_M, STAGES)
    for j in range(n_mask_steps, n_steps):
        h_off, start_m = full_coords(j, n_mask_steps, n_fblk, f_lo, n_steps, BLOCK_M, WALK)
        _load_step(j, h_off, start_m, desc_q, desc_do, desc_lse2, desc_delta2, q_bufs, do_bufs, lse_bufs, dlt_bufs,
                   q_ready, q_empty, b, q_end, q_len, h_first, b_row, SQ_PAD, BLOCK_M, STAGES)


@gluon.jit
def _reduce_step(j, h_off, start_m, desc_dq_acc, dq_smem, dq_full, dq_empty, h_first, b_row, SQ_PAD, do_bufs=None,
                 DQ_IN_RING: gl.constexpr = 0):
    """``DQ_IN_RING`` (bwd_wide.py): the tile's column halves are ring slot ``j % STAGES``'s Q (``dq_smem``, the
    Q ring as fp32 strips) and dO; ``dq_full`` is per slot and ``dq_empty`` is the ring's ``q_empty``."""
    row = (b_row + h_first + h_off) * SQ_PAD + start_m
    ROWS: gl.constexpr = desc_dq_acc.block_type.shape[0]
    WIDTH: gl.constexpr = desc_dq_acc.block_type.shape[1]
    if DQ_IN_RING:
        STAGES: gl.constexpr = dq_smem.shape[0]
        HALF: gl.constexpr = dq_smem.shape[1] // ROWS  # column strips per half
        idx = j % STAGES
        mbarrier.wait(dq_full.index(idx), (j // STAGES) & 1)  # both halves are in the slot
        lo = dq_smem.index(idx)
        hi = ring_like(do_bufs, dq_smem).index(idx)
        for g in gl.static_range(HALF):
            tma_reduce_add(desc_dq_acc, [row, g * WIDTH], lo.slice(g * ROWS, ROWS, dim=0))
        for g in gl.static_range(HALF):
            tma_reduce_add(desc_dq_acc, [row, (HALF + g) * WIDTH], hi.slice(g * ROWS, ROWS, dim=0))
        tma.store_wait(0)  # the reduces have read the slot: the loader may refill it
        mbarrier.arrive(dq_empty.index(idx), count=2)  # the two arrivals the compute warpgroups make otherwise
    else:
        mbarrier.wait(dq_full, j & 1)  # both warpgroups' halves of the tile are in shared memory
        for g in gl.static_range(dq_smem.shape[0] // ROWS):  # one reduce per column strip
            tma_reduce_add(desc_dq_acc, [row, g * WIDTH], dq_smem.slice(g * ROWS, ROWS, dim=0))
        tma.store_wait(0)  # the reduce has read dq_smem: the warpgroups may overwrite it
        mbarrier.arrive(dq_empty, count=1)


@gluon.jit
def _dq_reducer(desc_dq_acc, dq_smem, dq_full, dq_empty, h_first, b_row, start, n_mask_steps, n_mblk, n_lead, f_gap,
                f_lo, n_fblk, n_steps, SQ_PAD, BLOCK_M: gl.constexpr, WALK: gl.constexpr, do_bufs=None,
                DQ_IN_RING: gl.constexpr = 0):
    for j in range(n_mask_steps):
        h_off, start_m = masked_coords(j, n_mblk, n_lead, start, f_gap, BLOCK_M)
        _reduce_step(j, h_off, start_m, desc_dq_acc, dq_smem, dq_full, dq_empty, h_first, b_row, SQ_PAD, do_bufs,
                     DQ_IN_RING)
    for j in range(n_mask_steps, n_steps):
        h_off, start_m = full_coords(j, n_mask_steps, n_fblk, f_lo, n_steps, BLOCK_M, WALK)
        _reduce_step(j, h_off, start_m, desc_dq_acc, dq_smem, dq_full, dq_empty, h_first, b_row, SQ_PAD, do_bufs,
                     DQ_IN_RING)


@gluon.jit
def _compute_step(j, start_m, masked, cid: gl.constexpr, k_wg, v_wg, k_dh, q_bufs, do_bufs, lse_bufs, dlt_bufs,
                  ds_bufs, dq_smem, q_ready, q_empty, ds_full, ds_empty, dq_full, dq_empty, dk, dv, key_lo, key_hi,
                  qk_scale, MASK: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, COMPUTE_DQ: gl.constexpr, DK_SS: gl.constexpr,
                  h_off=0, k0=0, drop=None, DROPOUT: gl.constexpr = 0):
    """One step of ``BLOCK_M`` queries; ``MASK``: 0 none, 1 always, 2 when the runtime ``masked`` is true.
    Dropout (``DROPOUT``): query head ``h_off`` of the group, this warpgroup's keys from ``k0``, ``drop``
    from ``dropout.dropout_state_bwd``; dV is left unscaled (the caller scales it once)."""
    KB: gl.constexpr = BLOCK_N // 2  # keys of this warpgroup
    DH: gl.constexpr = HEAD_DIM // 2  # dQ columns of this warpgroup
    dtype: gl.constexpr = k_wg.dtype
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DH, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)  # per query (columns of S^T)

    idx = j % STAGES
    mbarrier.wait(q_ready.index(idx), (j // STAGES) & 1)
    q = q_bufs.index(idx).reshape([BLOCK_M, HEAD_DIM])
    do = do_bufs.index(idx).reshape([BLOCK_M, HEAD_DIM])
    s0 = gl.zeros([KB, BLOCK_M], gl.float32, st_layout)
    st = warpgroup_mma(k_wg, q.permute((1, 0)), s0, use_acc=False, is_async=True)
    # dP^T - delta: the accumulator starts at -delta (with dropout -delta (1 - p): dropout.dpt_init), so
    # no delta vector is live where dS^T is formed (subtracting it after the wgmma made the worker
    # spill on every step at hd128).  lse2 is read
    # here too, before the dP^T wgmmas are issued: read after them, it waited behind their operand
    # reads (sweep_bwd.py: hd128 0.963 -> 0.991 of cuDNN in one run).
    delta = _row_vector(dlt_bufs, idx, BLOCK_M, col_layout)
    lse2 = _row_vector(lse_bufs, idx, BLOCK_M, col_layout)
    dpt = warpgroup_mma(v_wg, do.permute((1, 0)), dpt_init(s0, delta, drop, DROPOUT), is_async=True)
    st = warpgroup_mma_wait(1, deps=(st, ))
    # lse2 = +inf (pad rows, rows that see no key): P = exp2(finite - inf) = 0.
    pt = gl.exp2(st * qk_scale - gl.expand_dims(lse2, 0))
    if MASK == 1:
        pt = mask_boundary(pt, start_m, key_lo, key_hi, BLOCK_M, col_layout)
    elif MASK == 2:
        if masked:
            pt = mask_boundary(pt, start_m, key_lo, key_hi, BLOCK_M, col_layout)
    if DROPOUT:
        pt = sign_dropped(pt, drop, h_off, start_m, k0, HEAD_DIM)
        pt_a = gl.convert_layout(dropped_probs(pt, dtype), a_layout)
    else:
        pt_a = gl.convert_layout(pt.to(dtype), a_layout)
    dv = warpgroup_mma(pt_a, do, dv, is_async=True)
    dpt = warpgroup_mma_wait(1, deps=(dpt, ))
    if DROPOUT:
        # delta read again from the ring slot (still held): not live across the wgmmas.
        dst = dropout_ds(pt, dpt, _row_vector(dlt_bufs, idx, BLOCK_M, col_layout), drop).to(dtype)
    else:
        dst = (pt * dpt).to(dtype)
    if COMPUTE_DQ:
        # Publish this warpgroup's 64 rows of dS^T for both warpgroups' dQ wgmmas.
        dsb = j % 2
        dph = (j // 2) & 1
        ds_buf = ds_bufs.index(dsb)
        ds_wg = ds_buf.slice(cid * KB, KB, dim=0)
        mbarrier.wait(ds_empty.index(dsb), dph ^ 1)
        ds_wg.store(dst)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ds_full.index(dsb), count=1)
        if DK_SS:  # dK += dS^T Q from shared memory (SS): dS^T needs no A-operand registers
            dk = warpgroup_mma(ds_wg, q, dk, is_async=True)
            mbarrier.wait(ds_full.index(dsb), dph)
            dq = warpgroup_mma(ds_buf.permute((1, 0)), k_dh, gl.zeros([BLOCK_M, DH], gl.float32, dq_layout),
                               use_acc=False, is_async=True)
            dv, dk, dq, pt_a = warpgroup_mma_wait(0, deps=(dv, dk, dq, pt_a))
        else:
            dst_a = gl.convert_layout(dst, a_layout)
            dk = warpgroup_mma(dst_a, q, dk, is_async=True)
            mbarrier.wait(ds_full.index(dsb), dph)
            dq = warpgroup_mma(ds_buf.permute((1, 0)), k_dh, gl.zeros([BLOCK_M, DH], gl.float32, dq_layout),
                               use_acc=False, is_async=True)
            dv, dk, dq, pt_a, dst_a = warpgroup_mma_wait(0, deps=(dv, dk, dq, pt_a, dst_a))
        gl.thread_barrier()  # every warp's wgmmas on slot idx and ds_buf are complete
        mbarrier.arrive(q_empty.index(idx), count=1)
        mbarrier.arrive(ds_empty.index(dsb), count=1)
        mbarrier.wait(dq_empty, (j & 1) ^ 1)  # the reducer has read the previous tile
        # Into this warpgroup's DH / 8 column strips: [64, DH] -> [DH / 8 * 64, 8] relabels registers only.
        W: gl.constexpr = dq_smem.shape[1]
        dq_strips = dq.reshape([BLOCK_M, DH // W, W]).permute((1, 0, 2)).reshape([DH // W * BLOCK_M, W])
        dq_smem.slice(cid * (DH // W * BLOCK_M), DH // W * BLOCK_M, dim=0).store(dq_strips)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(dq_full, count=1)
    else:
        dst_a = gl.convert_layout(dst, a_layout)
        dk = warpgroup_mma(dst_a, q, dk, is_async=True)
        dv, dk, pt_a, dst_a = warpgroup_mma_wait(0, deps=(dv, dk, pt_a, dst_a))
        gl.thread_barrier()
        mbarrier.arrive(q_empty.index(idx), count=1)
    return dk, dv


@gluon.jit
def _compute(cid: gl.constexpr, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs, ds_bufs,
             dq_smem, kv_bar, done_bar, q_ready, q_empty, ds_full, ds_empty, dq_full, dq_empty,
             sm_scale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, k_end,
             b, hk, start_n, start, full_lo, full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps,
             PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, h_first, N_HEADS_Q,
             N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS,
             HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
             COMPUTE_DQ: gl.constexpr, MASK_MODE: gl.constexpr, DK_SS: gl.constexpr, WALK: gl.constexpr,
             DROPOUT: gl.constexpr = 0):
    """One compute warpgroup: keys ``start_n + cid * 64 ..+64`` (dK/dV), dQ columns ``cid * HEAD_DIM / 2 ..``.
    ``N_CTX_Q``/``N_CTX_K``: the lengths of sequence ``b``; ``k_end``: where its keys end among a packed
    batch's rows (ragged descriptors only).  Dropout (``DROPOUT``): the dropout group, the group's first
    query head ``h_first`` and the kernel's (maximum) lengths the counters are laid out for."""
    KB: gl.constexpr = BLOCK_N // 2  # keys of this warpgroup
    DH: gl.constexpr = HEAD_DIM // 2  # dQ columns of this warpgroup
    dtype: gl.constexpr = k_smem.dtype
    # wgmma accumulator layouts of one warpgroup: S^T/dP^T [64 keys, 64 queries], dK/dV [64, HEAD_DIM],
    # dQ [64 queries, HEAD_DIM / 2]; P^T and dS^T enter dV/dK as register A operands.
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, st_layout)  # per key (rows of S^T)

    k_all = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v_all = v_smem.reshape([BLOCK_N, HEAD_DIM])
    k_wg = k_all.slice(cid * KB, KB, dim=0)
    v_wg = v_all.slice(cid * KB, KB, dim=0)
    k_dh = k_all.slice(cid * DH, DH, dim=1)  # B operand of dQ = dS K for this warpgroup's columns
    start_n_wg = start_n + cid * KB
    qk_scale = sm_scale * LOG2E
    # The mask solved per key row j (mask.score_mask): visible to queries [key_lo, key_hi] (none past Sk).
    offs_k = start_n_wg + gl.arange(0, KB, layout=row_layout)
    key_lo, key_hi = key_bounds(offs_k, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag)
    # MASK_MODE 0: a step needs the mask when its query block straddles an edge of the window or the
    # key block holds the key tail (see the module docstring).
    key_tail = start_n + BLOCK_N > N_CTX_K

    dk = gl.zeros([KB, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([KB, HEAD_DIM], gl.float32, kv_layout)
    drop = None
    if DROPOUT:
        drop = dropout_state_bwd(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, b,
                                 h_first, N_HEADS_Q, N_CTX_Q_MAX, N_CTX_K_MAX)
    mbarrier.wait(kv_bar, 0)
    # MASK_MODE 2: the boundary steps first, masked; n_mask_steps = 0 otherwise.
    for j in range(n_mask_steps):
        h_off, start_m = masked_coords(j, n_mblk, n_lead, start, f_gap, BLOCK_M)
        dk, dv = _compute_step(j, start_m, True, cid, k_wg, v_wg, k_dh, q_bufs, do_bufs, lse_bufs, dlt_bufs,
                               ds_bufs, dq_smem, q_ready, q_empty, ds_full, ds_empty, dq_full, dq_empty, dk, dv,
                               key_lo, key_hi, qk_scale, 1, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, DK_SS,
                               h_off, start_n_wg, drop, DROPOUT)
    # The contiguous walk: MASK_MODE 0 masks per step (branch), 1 every step, 2 none (interior steps only).
    STEP_MASK: gl.constexpr = 2 if MASK_MODE == 0 else (1 if MASK_MODE == 1 else 0)
    for j in range(n_mask_steps, n_steps):
        h_off, start_m = full_coords(j, n_mask_steps, n_fblk, f_lo, n_steps, BLOCK_M, WALK)
        masked = key_tail | (start_m < full_lo) | (start_m >= full_hi)
        dk, dv = _compute_step(j, start_m, masked, cid, k_wg, v_wg, k_dh, q_bufs, do_bufs, lse_bufs, dlt_bufs,
                               ds_bufs, dq_smem, q_ready, q_empty, ds_full, ds_empty, dq_full, dq_empty, dk, dv,
                               key_lo, key_hi, qk_scale, STEP_MASK, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ,
                               DK_SS, h_off, start_n_wg, drop, DROPOUT)
    if DROPOUT:
        dv = dv * dropout_scale

    # Epilogue: this warpgroup's K and V rows are dead once both warpgroups' dQ wgmmas (which read
    # every K row) are done: dK and dV go out through them.
    if COMPUTE_DQ:
        mbarrier.arrive(done_bar, count=1)
        mbarrier.wait(done_bar, 0)
    if HEAD_SPLIT > 1:
        store_partials(DKV_PARTIALS, HEAD_SPLIT, dk * sm_scale, dv, desc_dk, b, hk, N_CTX_K, start_n_wg, 0, HEAD_DIM)
    else:
        v_out = v_smem.slice(cid * KB, KB, dim=row_dim(v_smem.shape))
        k_out = k_smem.slice(cid * KB, KB, dim=row_dim(k_smem.shape))
        v_wg.store(dv.to(dtype))
        k_wg.store((dk * sm_scale).to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(desc_dv, row_coords(desc_dv, b, hk, start_n_wg, 0, k_end, N_CTX_K), v_out)
        tma.async_copy_shared_to_global(desc_dk, row_coords(desc_dk, b, hk, start_n_wg, 0, k_end, N_CTX_K), k_out)
        tma.store_wait(0)


# ---------------------------------------------------------------------------------------------
# Persistent variant (PERSISTENT = 1 or 2): grid (G, 1, 1), G = min(#tiles, #SMs) with #tiles =
# cdiv(Sk, BLOCK_N) * Hk * B (ABI.md's rule for persistent kernels; any G >= 1 is correct).  Each
# CTA walks the work units u = pid, pid + G, ...; a unit is one key block of one (batch, K/V head),
# or with PERSISTENT 1 under a one-sided window (causal in either alignment) the pair of key
# blocks (p, n_kb - 1 - p) of one head, whose costs add up to about the same for every p.
# PERSISTENT 1: units head-major (CTAs that run together share one head's Q/dO in L2);
# PERSISTENT 2: key-block major (LPT: every head's key block 0, the heaviest under causal, first).
# The Q/dO ring's step counter, the dS^T double buffer and the dQ tile run on across tiles, so the
# loader prefetches the next tile's first Q/dO steps while the compute warpgroups finish the
# current tile; K/V of the next tile are loaded by the loader once both compute warpgroups have
# drained their dK/dV stores (which go out through the K/V tiles): ``kv_empty``.
# ---------------------------------------------------------------------------------------------
@gluon.jit
def _bwd_schedule(N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, BLOCK_N: gl.constexpr, PERS: gl.constexpr):
    """``(n_kb, pair, n_per)``: key blocks per head, whether units are pairs (0/1), units per (batch, head)."""
    n_kb = gl.cdiv(N_CTX_K, BLOCK_N)
    left_cuts = (N_CTX_Q - 1 + diag - WINDOW_LEFT) > 0  # the last query does not see key 0
    right_cuts = (diag + WINDOW_RIGHT) < (N_CTX_K - 1)  # the first query does not see the last key
    pair = (left_cuts != right_cuts).to(gl.int32) * (PERS == 1)
    n_per = n_kb - pair * (n_kb // 2)
    return n_kb, pair, n_per


@gluon.jit
def _pers_prologue(N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, desc_k, BLOCK_N: gl.constexpr,
                   PERS: gl.constexpr):
    """What every persistent partition derives for its tile walk, computed by each partition itself
    (through ``_opaque_i32``: shared values would be hoisted before the split and spill):
    ``(N_CTX_Q, N_CTX_K, n_hk, n_b, diag, n_kb, pair, n_per)``."""
    N_CTX_Q = _opaque_i32(N_CTX_Q)
    N_CTX_K = _opaque_i32(N_CTX_K)
    n_hk = _opaque_i32(desc_k.shape[1])
    n_b = desc_k.shape[0]
    diag = mask.diag_offset(N_CTX_Q, N_CTX_K, ALIGN_BOTTOM_RIGHT)
    n_kb, pair, n_per = _bwd_schedule(N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, BLOCK_N, PERS)
    return N_CTX_Q, N_CTX_K, n_hk, n_b, diag, n_kb, pair, n_per


@gluon.jit
def _bwd_unit(u, n_kb, pair, n_per, n_hk, n_b, PERS: gl.constexpr):
    """``(n0, n1, n_sub, hk, b, valid)`` of unit ``u``: key block ``n0`` then, when ``n_sub == 2``, ``n1``."""
    if PERS == 1:
        hz = u // n_per
        n0 = u - hz * n_per
        n1 = n_kb - 1 - n0
        n_sub = 1 + pair * (n0 != n1).to(gl.int32)
        hk = hz % n_hk
        b = hz // n_hk
        valid = b < n_b
    else:
        nhz = n_hk * n_b
        n0 = u // nhz
        hz = u - n0 * nhz
        n1 = n0
        n_sub = 1
        hk = hz % n_hk
        b = hz // n_hk
        valid = n0 < n_kb
    return n0, n1, n_sub, hk, b, valid


@gluon.jit
def _bwd_walk(pid_n, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, GQA_GROUP, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, MMODE: gl.constexpr):
    """The query walk of key block ``pid_n``, as the non-persistent kernel computes it:
    ``(start, full_lo, full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps)``."""
    start, full_lo, full_hi, end = mask.query_block_bounds(pid_n, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag,
                                                           BLOCK_M, BLOCK_N)
    n_blocks = (end - start + BLOCK_M - 1) // BLOCK_M
    n_steps = GQA_GROUP * n_blocks
    if MMODE == 2:
        key_tail = pid_n * BLOCK_N + BLOCK_N > N_CTX_K
        f_lo = gl.where(key_tail, start, full_lo)
        f_gap = gl.where(key_tail, 0, full_hi - full_lo)
        n_lead = (f_lo - start) // BLOCK_M
        n_fblk = f_gap // BLOCK_M
        n_mblk = n_blocks - n_fblk
        n_mask_steps = GQA_GROUP * n_mblk
    else:
        f_lo = start
        f_gap = n_steps * 0
        n_lead = n_steps * 0
        n_fblk = n_blocks
        n_mblk = n_steps * 0
        n_mask_steps = n_steps * 0
    return start, full_lo, full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps


@gluon.jit
def _load_kv(desc_k, desc_v, k_smem, v_smem, kv_bar, kv_empty, i, b, hk, start_n):
    mbarrier.wait(kv_empty, (i & 1) ^ 1)  # both warpgroups' dK/dV stores of the previous tile have drained
    mbarrier.expect(kv_bar, desc_k.block_type.nbytes + desc_v.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_k, [b, hk, start_n, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(desc_v, [b, hk, start_n, 0], kv_bar, v_smem)


@gluon.jit
def _loader_pers(desc_q, desc_k, desc_v, desc_do, desc_lse2, desc_delta2, k_smem, v_smem, q_bufs, do_bufs, lse_bufs,
                 dlt_bufs, kv_bar, kv_empty, q_ready, q_empty, N_CTX_Q, N_CTX_K, SQ_PAD, N_HEADS_Q, GQA_GROUP,
                 WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, MMODE: gl.constexpr, PERS: gl.constexpr, WALK: gl.constexpr):
    """Per tile: the first ``min(STAGES, n_steps)`` Q/dO steps (the ring runs on across tiles, so
    they are prefetched while the previous tile finishes), then K/V (after ``kv_empty``), then the rest."""
    N_CTX_Q, N_CTX_K, n_hk, n_b, diag, n_kb, pair, n_per = _pers_prologue(
        N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, desc_k, BLOCK_N, PERS)
    j0 = 0
    i = 0
    u = _ctaid_x(n_per)
    n0, n1, n_sub, hk, b, valid = _bwd_unit(u, n_kb, pair, n_per, n_hk, n_b, PERS)
    while valid:
        h_first = hk * GQA_GROUP
        b_row = b * N_HEADS_Q
        for s in range(n_sub):
            pid_n = n0 + s * (n1 - n0)
            start, full_lo, full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps = _bwd_walk(
                pid_n, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, GQA_GROUP, BLOCK_M, BLOCK_N, MMODE)
            kv_at = gl.minimum(n_steps, STAGES) - 1
            if n_steps == 0:
                _load_kv(desc_k, desc_v, k_smem, v_smem, kv_bar, kv_empty, i, b, hk, pid_n * BLOCK_N)
            for j in range(n_steps):
                mh, mm = masked_coords(j, gl.maximum(n_mblk, 1), n_lead, start, f_gap, BLOCK_M)
                fh, fm = full_coords(j, n_mask_steps, gl.maximum(n_fblk, 1), f_lo, n_steps, BLOCK_M, WALK)
                is_m = j < n_mask_steps
                h_off = gl.where(is_m, mh, fh)
                start_m = gl.where(is_m, mm, fm)
                _load_step(j0 + j, h_off, start_m, desc_q, desc_do, desc_lse2, desc_delta2, q_bufs, do_bufs,
                           lse_bufs, dlt_bufs, q_ready, q_empty, b, 0, 0, h_first, b_row, SQ_PAD, BLOCK_M, STAGES)
                if j == kv_at:
                    _load_kv(desc_k, desc_v, k_smem, v_smem, kv_bar, kv_empty, i, b, hk, pid_n * BLOCK_N)
            j0 += n_steps
            i += 1
        u += _nctaid_x(u)
        n0, n1, n_sub, hk, b, valid = _bwd_unit(u, n_kb, pair, n_per, n_hk, n_b, PERS)


@gluon.jit
def _dq_reducer_pers(desc_k, desc_dq_acc, dq_smem, dq_full, dq_empty, N_CTX_Q, N_CTX_K, SQ_PAD, N_HEADS_Q, GQA_GROUP,
                     WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     MMODE: gl.constexpr, PERS: gl.constexpr, WALK: gl.constexpr):
    N_CTX_Q, N_CTX_K, n_hk, n_b, diag, n_kb, pair, n_per = _pers_prologue(
        N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, desc_k, BLOCK_N, PERS)
    j0 = 0
    u = _ctaid_x(n_per)
    n0, n1, n_sub, hk, b, valid = _bwd_unit(u, n_kb, pair, n_per, n_hk, n_b, PERS)
    while valid:
        h_first = hk * GQA_GROUP
        b_row = b * N_HEADS_Q
        for s in range(n_sub):
            pid_n = n0 + s * (n1 - n0)
            start, full_lo, full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps = _bwd_walk(
                pid_n, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, GQA_GROUP, BLOCK_M, BLOCK_N, MMODE)
            for j in range(n_mask_steps):
                h_off, start_m = masked_coords(j, n_mblk, n_lead, start, f_gap, BLOCK_M)
                _reduce_step(j0 + j, h_off, start_m, desc_dq_acc, dq_smem, dq_full, dq_empty, h_first, b_row, SQ_PAD)
            for j in range(n_mask_steps, n_steps):
                h_off, start_m = full_coords(j, n_mask_steps, n_fblk, f_lo, n_steps, BLOCK_M, WALK)
                _reduce_step(j0 + j, h_off, start_m, desc_dq_acc, dq_smem, dq_full, dq_empty, h_first, b_row, SQ_PAD)
            j0 += n_steps
        u += _nctaid_x(u)
        n0, n1, n_sub, hk, b, valid = _bwd_unit(u, n_kb, pair, n_per, n_hk, n_b, PERS)


@gluon.jit
def _compute_pers(cid: gl.constexpr, desc_k, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs,
                  ds_bufs, dq_smem, kv_bar, kv_empty, done_bar, q_ready, q_empty, ds_full, ds_empty, dq_full,
                  dq_empty, sm_scale, N_CTX_Q, N_CTX_K, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  COMPUTE_DQ: gl.constexpr, MASK_MODE: gl.constexpr, DK_SS: gl.constexpr, PERS: gl.constexpr,
                  WALK: gl.constexpr):
    """``_compute`` in a loop over the CTA's tiles (step counters global, K/V per tile from the loader)."""
    KB: gl.constexpr = BLOCK_N // 2
    DH: gl.constexpr = HEAD_DIM // 2
    dtype: gl.constexpr = k_smem.dtype
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, st_layout)
    STEP_MASK: gl.constexpr = 2 if MASK_MODE == 0 else (1 if MASK_MODE == 1 else 0)

    N_CTX_Q, N_CTX_K, n_hk, n_b, diag, n_kb, pair, n_per = _pers_prologue(
        N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, desc_k, BLOCK_N, PERS)
    qk_scale = _opaque_f32(sm_scale) * LOG2E

    k_all = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v_all = v_smem.reshape([BLOCK_N, HEAD_DIM])
    k_wg = k_all.slice(cid * KB, KB, dim=0)
    v_wg = v_all.slice(cid * KB, KB, dim=0)
    k_dh = k_all.slice(cid * DH, DH, dim=1)
    v_out = v_smem.slice(cid * KB, KB, dim=2)
    k_out = k_smem.slice(cid * KB, KB, dim=2)

    j0 = 0
    i = 0
    u = _ctaid_x(n_per)
    n0, n1, n_sub, hk, b, valid = _bwd_unit(u, n_kb, pair, n_per, n_hk, n_b, PERS)
    while valid:
        for s in range(n_sub):
            pid_n = n0 + s * (n1 - n0)
            start_n = pid_n * BLOCK_N
            start, full_lo, full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps = _bwd_walk(
                pid_n, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, GQA_GROUP, BLOCK_M, BLOCK_N, MASK_MODE)
            start_n_wg = start_n + cid * KB
            offs_k = start_n_wg + gl.arange(0, KB, layout=row_layout)
            key_lo, key_hi = key_bounds(offs_k, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag)
            key_tail = start_n + BLOCK_N > N_CTX_K

            dk = gl.zeros([KB, HEAD_DIM], gl.float32, kv_layout)
            dv = gl.zeros([KB, HEAD_DIM], gl.float32, kv_layout)
            mbarrier.wait(kv_bar, i & 1)
            for j in range(n_mask_steps):
                h_off, start_m = masked_coords(j, n_mblk, n_lead, start, f_gap, BLOCK_M)
                dk, dv = _compute_step(j0 + j, start_m, True, cid, k_wg, v_wg, k_dh, q_bufs, do_bufs, lse_bufs,
                                       dlt_bufs, ds_bufs, dq_smem, q_ready, q_empty, ds_full, ds_empty, dq_full,
                                       dq_empty, dk, dv, key_lo, key_hi, qk_scale, 1, HEAD_DIM, BLOCK_M, BLOCK_N,
                                       STAGES, COMPUTE_DQ, DK_SS)
            for j in range(n_mask_steps, n_steps):
                h_off, start_m = full_coords(j, n_mask_steps, n_fblk, f_lo, n_steps, BLOCK_M, WALK)
                masked = key_tail | (start_m < full_lo) | (start_m >= full_hi)
                dk, dv = _compute_step(j0 + j, start_m, masked, cid, k_wg, v_wg, k_dh, q_bufs, do_bufs, lse_bufs,
                                       dlt_bufs, ds_bufs, dq_smem, q_ready, q_empty, ds_full, ds_empty, dq_full,
                                       dq_empty, dk, dv, key_lo, key_hi, qk_scale, STEP_MASK, HEAD_DIM, BLOCK_M,
                                       BLOCK_N, STAGES, COMPUTE_DQ, DK_SS)
            if COMPUTE_DQ:  # both warpgroups' dQ wgmmas (which read all of K) are done
                mbarrier.arrive(done_bar, count=1)
                mbarrier.wait(done_bar, i & 1)
            v_wg.store(dv.to(dtype))
            k_wg.store((dk * sm_scale).to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(desc_dv, [b, hk, start_n_wg, 0], v_out)
            tma.async_copy_shared_to_global(desc_dk, [b, hk, start_n_wg, 0], k_out)
            tma.store_wait(0)
            gl.thread_barrier()  # every thread's view: the stores have read K/V: the loader may refill them
            mbarrier.arrive(kv_empty, count=1)
            j0 += n_steps
            i += 1
        u += _nctaid_x(u)
        n0, n1, n_sub, hk, b, valid = _bwd_unit(u, n_kb, pair, n_per, n_hk, n_b, PERS)


# ---------------------------------------------------------------------------------------------
# head dims 64 and 128: shared memory, barriers and partitions
# ---------------------------------------------------------------------------------------------
@gluon.jit
def _attn_bwd_narrow(desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, desc_dq_acc, desc_lse2, desc_delta2, k_smem,
                     v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs, kv_bar, q_ready, q_empty, sm_scale, N_CTX_Q,
                     N_CTX_K, SQ_PAD, N_HEADS_Q, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, diag, b,
                     q_end, k_end, hk, start_n, start, full_lo, full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo,
                     n_fblk, n_steps, h_first, b_row, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base,
                     DROPOUT_THRESHOLD, dropout_scale, N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS,
                     HEAD_DIM: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, COMPUTE_DQ: gl.constexpr,
                     MMODE: gl.constexpr, CREGS: gl.constexpr, DKSS: gl.constexpr, PERS: gl.constexpr, WLK: gl.constexpr,
                     DROP: gl.constexpr):
    dtype: gl.constexpr = desc_q.dtype
    if COMPUTE_DQ:
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
        ds_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], ds_layout)
        # The fp32 dQ tile as HEAD_DIM / 8 column strips [64, 8], one under the other (module docstring).
        dq_smem = gl.allocate_shared_memory(gl.float32, [HEAD_DIM // 8 * BLOCK_M, 8], desc_dq_acc.layout)
        done_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        dq_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        dq_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ds_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(done_bar, count=2)
        mbarrier.init(dq_full, count=2)
        mbarrier.init(dq_empty, count=1)
        for i in gl.static_range(2):
            mbarrier.init(ds_full.index(i), count=2)
            mbarrier.init(ds_empty.index(i), count=2)
    else:  # no dS^T tile, no dQ tile: placeholders the compute partitions never touch
        ds_bufs = kv_bar
        dq_smem = kv_bar
        done_bar = kv_bar
        dq_full = kv_bar
        dq_empty = kv_bar
        ds_full = q_ready
        ds_empty = q_ready

    if PERS != 0:
        # Persistent: every partition walks the CTA's tiles itself (from the kernel parameters); the
        # loader brings K/V per tile once both compute warpgroups have drained the previous tile's stores.
        kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_empty, count=2)
        if COMPUTE_DQ:
            gl.warp_specialize([
                (_compute_pers, (0, desc_k, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs,
                                  ds_bufs, dq_smem, kv_bar, kv_empty, done_bar, q_ready, q_empty, ds_full, ds_empty,
                                  dq_full, dq_empty, sm_scale, N_CTX_Q, N_CTX_K, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT,
                                  ALIGN_BOTTOM_RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, MMODE, DKSS,
                                  PERS, WLK)),
                (_compute_pers, (1, desc_k, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs,
                                  ds_bufs, dq_smem, kv_bar, kv_empty, done_bar, q_ready, q_empty, ds_full, ds_empty,
                                  dq_full, dq_empty, sm_scale, N_CTX_Q, N_CTX_K, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT,
                                  ALIGN_BOTTOM_RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, MMODE, DKSS,
                                  PERS, WLK)),
                (_loader_pers, (desc_q, desc_k, desc_v, desc_do, desc_lse2, desc_delta2, k_smem, v_smem, q_bufs,
                                do_bufs, lse_bufs, dlt_bufs, kv_bar, kv_empty, q_ready, q_empty, N_CTX_Q, N_CTX_K,
                                SQ_PAD, N_HEADS_Q, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, BLOCK_M,
                                BLOCK_N, STAGES, MMODE, PERS, WLK)),
                (_dq_reducer_pers, (desc_k, desc_dq_acc, dq_smem, dq_full, dq_empty, N_CTX_Q, N_CTX_K, SQ_PAD,
                                    N_HEADS_Q, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, BLOCK_M,
                                    BLOCK_N, MMODE, PERS, WLK)),
            ], [4, 1, 1], [CREGS, PERS_LOAD_REGS, PERS_LOAD_REGS])
        else:
            gl.warp_specialize([
                (_compute_pers, (0, desc_k, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs,
                                  ds_bufs, dq_smem, kv_bar, kv_empty, done_bar, q_ready, q_empty, ds_full, ds_empty,
                                  dq_full, dq_empty, sm_scale, N_CTX_Q, N_CTX_K, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT,
                                  ALIGN_BOTTOM_RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, MMODE, DKSS,
                                  PERS, WLK)),
                (_compute_pers, (1, desc_k, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs,
                                  ds_bufs, dq_smem, kv_bar, kv_empty, done_bar, q_ready, q_empty, ds_full, ds_empty,
                                  dq_full, dq_empty, sm_scale, N_CTX_Q, N_CTX_K, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT,
                                  ALIGN_BOTTOM_RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, MMODE, DKSS,
                                  PERS, WLK)),
                (_loader_pers, (desc_q, desc_k, desc_v, desc_do, desc_lse2, desc_delta2, k_smem, v_smem, q_bufs,
                                do_bufs, lse_bufs, dlt_bufs, kv_bar, kv_empty, q_ready, q_empty, N_CTX_Q, N_CTX_K,
                                SQ_PAD, N_HEADS_Q, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, BLOCK_M,
                                BLOCK_N, STAGES, MMODE, PERS, WLK)),
            ], [4, 1], [CREGS, PERS_LOAD_REGS])
    else:
        mbarrier.expect(kv_bar, desc_k.block_type.nbytes + desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_k, row_coords(desc_k, b, hk, start_n, 0, k_end, N_CTX_K), kv_bar, k_smem)
        tma.async_copy_global_to_shared(desc_v, row_coords(desc_v, b, hk, start_n, 0, k_end, N_CTX_K), kv_bar, v_smem)

        # The argument tuples must be written inline in the warp_specialize call (Gluon 3.6); each
        # compute warpgroup's first argument is its id, a literal, so it stays a constexpr.
        if COMPUTE_DQ:
            gl.warp_specialize([
                (_compute, (0, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs, ds_bufs, dq_smem,
                             kv_bar, done_bar, q_ready, q_empty, ds_full, ds_empty, dq_full, dq_empty, sm_scale, N_CTX_Q,
                             N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, k_end, b, hk, start_n, start, full_lo,
                             full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps, PHILOX_SEED,
                             PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, h_first, N_HEADS_Q,
                             N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS,
                             HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, MMODE, DKSS,
                             WLK, DROP)),
                (_compute, (1, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs, ds_bufs, dq_smem,
                             kv_bar, done_bar, q_ready, q_empty, ds_full, ds_empty, dq_full, dq_empty, sm_scale, N_CTX_Q,
                             N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, k_end, b, hk, start_n, start, full_lo,
                             full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps, PHILOX_SEED,
                             PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, h_first, N_HEADS_Q,
                             N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS,
                             HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, MMODE, DKSS,
                             WLK, DROP)),
                (_loader, (desc_q, desc_do, desc_lse2, desc_delta2, q_bufs, do_bufs, lse_bufs, dlt_bufs, q_ready, q_empty,
                           b, q_end, N_CTX_Q, h_first, b_row, start, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk,
                           n_steps, SQ_PAD, BLOCK_M, STAGES, WLK)),
                (_dq_reducer, (desc_dq_acc, dq_smem, dq_full, dq_empty, h_first, b_row, start, n_mask_steps, n_mblk,
                               n_lead, f_gap, f_lo, n_fblk, n_steps, SQ_PAD, BLOCK_M, WLK)),
            ], [4, 1, 1], [CREGS, LOAD_REGS, LOAD_REGS])
        else:
            gl.warp_specialize([
                (_compute, (0, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs, ds_bufs, dq_smem,
                             kv_bar, done_bar, q_ready, q_empty, ds_full, ds_empty, dq_full, dq_empty, sm_scale, N_CTX_Q,
                             N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, k_end, b, hk, start_n, start, full_lo,
                             full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps, PHILOX_SEED,
                             PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, h_first, N_HEADS_Q,
                             N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS,
                             HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, MMODE, DKSS,
                             WLK, DROP)),
                (_compute, (1, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs, ds_bufs, dq_smem,
                             kv_bar, done_bar, q_ready, q_empty, ds_full, ds_empty, dq_full, dq_empty, sm_scale, N_CTX_Q,
                             N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, k_end, b, hk, start_n, start, full_lo,
                             full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps, PHILOX_SEED,
                             PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, h_first, N_HEADS_Q,
                             N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS,
                             HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, MMODE, DKSS,
                             WLK, DROP)),
                (_loader, (desc_q, desc_do, desc_lse2, desc_delta2, q_bufs, do_bufs, lse_bufs, dlt_bufs, q_ready, q_empty,
                           b, q_end, N_CTX_Q, h_first, b_row, start, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk,
                           n_steps, SQ_PAD, BLOCK_M, STAGES, WLK)),
            ], [4, 1], [CREGS, LOAD_REGS])


# ---------------------------------------------------------------------------------------------
# hd256 (bwd_wide.py): shared memory, barriers and partitions
# ---------------------------------------------------------------------------------------------
@gluon.jit
def _attn_bwd_wide(desc_k, desc_v, desc_dk, desc_dv, desc_dq_acc, k_smem, v_smem, q_bufs, do_bufs, lse_bufs,
                   dlt_bufs, kv_bar, q_ready, q_empty, desc_q, desc_do, desc_lse2, desc_delta2, sm_scale, N_CTX_Q,
                   N_CTX_K, SQ_PAD, WINDOW_LEFT, WINDOW_RIGHT, diag, b, q_end, k_end, hk, start_n, start, full_lo,
                   full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps, h_first, b_row, N_HEADS_Q,
                   PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, N_CTX_Q_MAX,
                   N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS, HEAD_DIM: gl.constexpr,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, COMPUTE_DQ: gl.constexpr,
                   MMODE: gl.constexpr, CREGS: gl.constexpr, DPS: gl.constexpr, WLK: gl.constexpr, DROP: gl.constexpr,
                   DQR: gl.constexpr):
    dtype: gl.constexpr = desc_q.dtype
    # P^T and dS^T [keys, queries], double-buffered; a 64-byte swizzle makes each warpgroup's
    # BLOCK_M / 2 query columns whole swizzle panels (bwd_wide.py).
    pds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    pt_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], pds_layout)
    ds_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], pds_layout)
    pds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    pds_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    done_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(pds_full.index(i), count=2)
        mbarrier.init(pds_empty.index(i), count=2)
    mbarrier.init(done_bar, count=2)
    if DQR:
        # DQ_IN_RING: a step's fp32 dQ tile takes the Q and dO of its own ring slot, which both
        # warpgroups have read by then (``slot_read``); the reducer gives the slot back to the loader.
        W: gl.constexpr = desc_dq_acc.block_type.shape[1]  # a column strip's width
        gl.static_assert(dtype.primitive_bitwidth == 16, "DQ_IN_RING: a 16-bit slot holds half the fp32 dQ tile")
        dq_smem = q_bufs._reinterpret(gl.float32, [STAGES, HEAD_DIM // 2 // W * BLOCK_M, W], desc_dq_acc.layout)
        dq_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        slot_read = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(dq_full.index(i), count=2)
            mbarrier.init(slot_read.index(i), count=2)
        dq_empty = slot_read  # the compute side: the tile's memory may be written
        dq_freed = q_empty  # the reducer side: what it arrives on once the reduces have read the tile
    elif COMPUTE_DQ:
        dq_smem = gl.allocate_shared_memory(gl.float32, [HEAD_DIM // 8 * BLOCK_M, 8], desc_dq_acc.layout)
        dq_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        dq_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(dq_full, count=2)
        mbarrier.init(dq_empty, count=1)
        dq_freed = dq_empty
    else:  # placeholders the compute partitions never touch
        dq_smem = kv_bar
        dq_full = kv_bar
        dq_empty = kv_bar
        dq_freed = kv_bar
    mbarrier.expect(kv_bar, desc_k.block_type.nbytes + desc_v.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_k, row_coords(desc_k, b, hk, start_n, 0, k_end, N_CTX_K), kv_bar, k_smem)
    tma.async_copy_global_to_shared(desc_v, row_coords(desc_v, b, hk, start_n, 0, k_end, N_CTX_K), kv_bar, v_smem)
    if COMPUTE_DQ:
        gl.warp_specialize([
            (compute_wide, (0, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs, pt_bufs, ds_bufs,
                            dq_smem, kv_bar, done_bar, q_ready, q_empty, pds_full, pds_empty, dq_full, dq_empty,
                            sm_scale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, k_end, b, hk, start_n,
                            start, full_lo, full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps,
                            PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, h_first,
                            N_HEADS_Q, N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS,
                            HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, MMODE,
                            DPS, WLK, DROP, DQR)),
            (compute_wide, (1, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs, pt_bufs, ds_bufs,
                            dq_smem, kv_bar, done_bar, q_ready, q_empty, pds_full, pds_empty, dq_full, dq_empty,
                            sm_scale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, k_end, b, hk, start_n,
                            start, full_lo, full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps,
                            PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, h_first,
                            N_HEADS_Q, N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS,
                            HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, MMODE,
                            DPS, WLK, DROP, DQR)),
            (_loader, (desc_q, desc_do, desc_lse2, desc_delta2, q_bufs, do_bufs, lse_bufs, dlt_bufs, q_ready, q_empty,
                       b, q_end, N_CTX_Q, h_first, b_row, start, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk,
                       n_steps, SQ_PAD, BLOCK_M, STAGES, WLK)),
            (_dq_reducer, (desc_dq_acc, dq_smem, dq_full, dq_freed, h_first, b_row, start, n_mask_steps, n_mblk,
                           n_lead, f_gap, f_lo, n_fblk, n_steps, SQ_PAD, BLOCK_M, WLK, do_bufs, DQR)),
        ], [4, 1, 1], [CREGS, LOAD_REGS, LOAD_REGS])
    else:
        gl.warp_specialize([
            (compute_wide, (0, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs, pt_bufs, ds_bufs,
                            dq_smem, kv_bar, done_bar, q_ready, q_empty, pds_full, pds_empty, dq_full, dq_empty,
                            sm_scale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, k_end, b, hk, start_n,
                            start, full_lo, full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps,
                            PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, h_first,
                            N_HEADS_Q, N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS,
                            HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, MMODE,
                            DPS, WLK, DROP, DQR)),
            (compute_wide, (1, desc_dk, desc_dv, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs, pt_bufs, ds_bufs,
                            dq_smem, kv_bar, done_bar, q_ready, q_empty, pds_full, pds_empty, dq_full, dq_empty,
                            sm_scale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, k_end, b, hk, start_n,
                            start, full_lo, full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps,
                            PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, h_first,
                            N_HEADS_Q, N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS,
                            HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, MMODE,
                            DPS, WLK, DROP, DQR)),
            (_loader, (desc_q, desc_do, desc_lse2, desc_delta2, q_bufs, do_bufs, lse_bufs, dlt_bufs, q_ready, q_empty,
                       b, q_end, N_CTX_Q, h_first, b_row, start, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk,
                       n_steps, SQ_PAD, BLOCK_M, STAGES, WLK)),
        ], [4, 1], [CREGS, LOAD_REGS])


# ---------------------------------------------------------------------------------------------
# kernel
# ---------------------------------------------------------------------------------------------
# The JIT would specialize integers equal to 1 or divisible by 16 (and recompile per class); the
# runtime launches one generic AOT image, so the JIT (test/gluon/check_bwd.py) must not either.
@gluon.jit(do_not_specialize=["N_CTX_Q", "N_CTX_K", "SQ_PAD", "N_HEADS_Q", "GQA_GROUP", "WINDOW_LEFT", "WINDOW_RIGHT",
                              "ALIGN_BOTTOM_RIGHT", "IS_VARLEN", "N_TOKENS_Q", "N_TOKENS_K", "STORE_VARLEN_STATUS",
                              "DROPOUT_THRESHOLD", "dropout_scale", "philox_offset_base", "HEAD_SPLIT"])
def attn_bwd_gluon(desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, desc_dq_acc, desc_lse2, desc_delta2,
                   sm_scale, N_CTX_Q, N_CTX_K, SQ_PAD, N_HEADS_Q, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT,
                   ALIGN_BOTTOM_RIGHT, IS_VARLEN, CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q, N_TOKENS_K, VARLEN_STATUS,
                   STORE_VARLEN_STATUS, DROPOUT_THRESHOLD, dropout_scale, PHILOX_SEED, PHILOX_OFFSET,
                   philox_offset_base, HEAD_SPLIT, DKV_PARTIALS,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   COMPUTE_DQ: gl.constexpr, DROPOUT: gl.constexpr = 0, MASK_MODE: gl.constexpr = 0, CONS_REGS: gl.constexpr = 240,
                   DK_SS: gl.constexpr = 0, PERSISTENT: gl.constexpr = 0, DESC_PER_STEP: gl.constexpr = 0,
                   WALK: gl.constexpr = 0, DQ_IN_RING: gl.constexpr = 0):
    gl.static_assert(gl.num_warps() == 4, "num_warps 4: the default partition is compute warpgroup 0")
    # WIDE (the bucket 256): bwd_wide.py's layout, 64 keys per CTA, the head dim split between the
    # two compute warpgroups; otherwise 128 keys per CTA, 64 per warpgroup.
    WIDE: gl.constexpr = HEAD_DIM > 128
    gl.static_assert(BLOCK_M == 64, "64 queries per step (a wgmma M of dQ is >= 64)")
    gl.static_assert((HEAD_DIM == 64) or (HEAD_DIM == 128) or (HEAD_DIM == 256), "head-dim buckets 64, 128, 256")
    gl.static_assert(BLOCK_N == (64 if WIDE else 128), "keys per CTA: 64 (hd256), else two warpgroups of 64")
    # Blocks [1, 1, rows, cols] over [B, H, S, D], or ragged ones [1, 1, 1, rows, cols] (ragged.py).
    gl.static_assert(desc_q.block_type.shape[-2] == BLOCK_M, "Q block [.., BLOCK_M, HEAD_DIM]")
    gl.static_assert(desc_k.block_type.shape[-2] == BLOCK_N, "K block [.., BLOCK_N, HEAD_DIM]")
    if WIDE:
        gl.static_assert((desc_dk.block_type.shape[-2] == BLOCK_N) and (desc_dk.block_type.shape[-1] == HEAD_DIM // 2),
                         "dK block [.., BLOCK_N, HEAD_DIM / 2]: one warpgroup's columns")
    else:
        gl.static_assert(desc_dk.block_type.shape[-2] == BLOCK_N // 2, "dK block [.., BLOCK_N / 2, HEAD_DIM]")
    gl.static_assert(desc_q.block_type.shape[-1] == HEAD_DIM, "descriptor boxes span the head-dim bucket")
    gl.static_assert(desc_lse2.block_type.shape[1] == BLOCK_M, "lse2/delta2 block [1, BLOCK_M]")
    gl.static_assert((desc_dq_acc.block_type.shape[0] == BLOCK_M) and (desc_dq_acc.block_type.shape[1] == 8),
                     "dq_acc block [BLOCK_M, 8]: one column strip of the dQ tile")
    pid_n = gl.program_id(0)
    # A head split (HEAD_SPLIT > 1): the HEAD_SPLIT CTAs of a key block each walk one part of the group's
    # query heads and write fp32 dK/dV partials (module docstring, "Head split").
    hk = gl.program_id(1) // HEAD_SPLIT
    part = gl.program_id(1) - hk * HEAD_SPLIT
    b = gl.program_id(2)
    start_n = pid_n * BLOCK_N
    # Dropout's counters are laid out for the kernel's lengths (a packed batch's maximum ones).
    N_CTX_Q_MAX = N_CTX_Q
    N_CTX_K_MAX = N_CTX_K
    # A packed batch: the grid covers the longest sequence; this one's own lengths from here on.
    N_CTX_Q, N_CTX_K, q_end, k_end = sequence_bounds(desc_q, b, N_CTX_Q, N_CTX_K, IS_VARLEN, CU_SEQLENS_Q,
                                                     CU_SEQLENS_K, N_TOKENS_Q, N_TOKENS_K, VARLEN_STATUS,
                                                     STORE_VARLEN_STATUS)
    if is_ragged(desc_q.block_type.shape):
        if start_n >= N_CTX_K:  # a shorter sequence of the batch: no keys here
            return
    diag = mask.diag_offset(N_CTX_Q, N_CTX_K, ALIGN_BOTTOM_RIGHT)
    # Query blocks that may see this key block (the same for every head of the group):
    # [start, full_lo) and [full_hi, end) straddle the window's edges, [full_lo, full_hi) is interior.
    start, full_lo, full_hi, end = mask.query_block_bounds(pid_n, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag,
                                                           BLOCK_M, BLOCK_N)
    # An AOT signature that predates the performance constexprs passes them as None: the defaults.
    MMODE: gl.constexpr = 0 if MASK_MODE is None else MASK_MODE
    CREGS: gl.constexpr = 240 if CONS_REGS is None else CONS_REGS
    DKSS: gl.constexpr = 0 if DK_SS is None else DK_SS
    DPS: gl.constexpr = 0 if DESC_PER_STEP is None else DESC_PER_STEP
    PERS: gl.constexpr = 0 if PERSISTENT is None else PERSISTENT
    WLK: gl.constexpr = 0 if WALK is None else WALK
    DROP: gl.constexpr = 0 if DROPOUT is None else DROPOUT
    DQR: gl.constexpr = 0 if DQ_IN_RING is None else DQ_IN_RING
    gl.static_assert((PERS == 0) or not DROP, "dropout: PERSISTENT 0")
    gl.static_assert((WLK >= 0) and (WLK <= 2), "WALK 0 (head-major), 1 (heads inner, last block first), 2 (heads "
                     "inner, first block first)")
    gl.static_assert((PERS >= 0) and (PERS <= 2), "PERSISTENT 0 (one CTA per key block), 1 (head-major), 2 (LPT)")
    gl.static_assert((not WIDE) or ((PERS == 0) and (DKSS == 0)), "hd256: PERSISTENT 0 and DK_SS 0 only")
    gl.static_assert((PERS == 0) or not is_ragged(desc_q.block_type.shape), "packed (varlen) batches: PERSISTENT 0")
    gl.static_assert(WIDE or (DPS == 0), "DESC_PER_STEP: hd256 only")
    # COMPUTE_DQ may come as an int: compare, so the condition is a bool (static_assert takes no int)
    gl.static_assert((DQR == 0) or (WIDE and (COMPUTE_DQ != 0)), "DQ_IN_RING: hd256 with COMPUTE_DQ only")
    gl.static_assert((MMODE >= 0) and (MMODE <= 2), "MASK_MODE 0 (branch), 1 (every step), 2 (split walk)")
    gl.static_assert((CREGS % 8 == 0) and (CREGS <= 256), "CONS_REGS (setmaxnreg): a multiple of 8, at most 256")
    n_blocks = (end - start + BLOCK_M - 1) // BLOCK_M
    part_heads = gl.cdiv(GQA_GROUP, HEAD_SPLIT)  # the last part may hold fewer (28/4 split 2: 4 + 3)
    h_first = hk * GQA_GROUP + part * part_heads
    n_heads = gl.maximum(gl.minimum(part_heads, GQA_GROUP - part * part_heads), 0)
    n_steps = n_heads * n_blocks
    b_row = b * N_HEADS_Q
    # The walk: n_mask_steps boundary steps (MASK_MODE 2 only: n_mblk blocks per head, the n_lead leading
    # ones then the trailing ones), then the contiguous walk of n_fblk blocks per head from f_lo.
    if MMODE == 2:
        # A key block holding the key tail is masked on every step: no interior blocks.
        key_tail = start_n + BLOCK_N > N_CTX_K
        f_lo = gl.where(key_tail, start, full_lo)
        f_gap = gl.where(key_tail, 0, full_hi - full_lo)
        n_lead = (f_lo - start) // BLOCK_M
        n_fblk = f_gap // BLOCK_M
        n_mblk = n_blocks - n_fblk
        n_mask_steps = n_heads * n_mblk
    else:
        f_lo = start
        f_gap = 0
        n_lead = 0
        n_fblk = n_blocks
        n_mblk = 0
        n_mask_steps = 0

    dtype: gl.constexpr = desc_q.dtype
    k_smem = gl.allocate_shared_memory(dtype, desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, desc_v.block_type.shape, desc_v.layout)
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES] + desc_q.block_type.shape, desc_q.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES] + desc_do.block_type.shape, desc_do.layout)
    lse_bufs = gl.allocate_shared_memory(gl.float32, [STAGES] + desc_lse2.block_type.shape, desc_lse2.layout)
    dlt_bufs = gl.allocate_shared_memory(gl.float32, [STAGES] + desc_delta2.block_type.shape, desc_delta2.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)  # both compute warpgroups release a slot
    if WIDE:
        _attn_bwd_wide(desc_k, desc_v, desc_dk, desc_dv, desc_dq_acc, k_smem, v_smem, q_bufs, do_bufs, lse_bufs,
                       dlt_bufs, kv_bar, q_ready, q_empty, desc_q, desc_do, desc_lse2, desc_delta2, sm_scale, N_CTX_Q,
                       N_CTX_K, SQ_PAD, WINDOW_LEFT, WINDOW_RIGHT, diag, b, q_end, k_end, hk, start_n, start, full_lo,
                       full_hi, n_mask_steps, n_mblk, n_lead, f_gap, f_lo, n_fblk, n_steps, h_first, b_row, N_HEADS_Q,
                       PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, N_CTX_Q_MAX,
                       N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS,
                       HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, COMPUTE_DQ, MMODE, CREGS, DPS, WLK, DROP, DQR)
    else:
        _attn_bwd_narrow(desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, desc_dq_acc, desc_lse2, desc_delta2, k_smem,
                         v_smem, q_bufs, do_bufs, lse_bufs, dlt_bufs, kv_bar, q_ready, q_empty, sm_scale, N_CTX_Q,
                         N_CTX_K, SQ_PAD, N_HEADS_Q, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, diag, b,
                         q_end, k_end, hk, start_n, start, full_lo, full_hi, n_mask_steps, n_mblk, n_lead, f_gap,
                         f_lo, n_fblk, n_steps, h_first, b_row, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base,
                         DROPOUT_THRESHOLD, dropout_scale, N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_SPLIT, DKV_PARTIALS,
                         HEAD_DIM, BLOCK_M, BLOCK_N,
                         STAGES, COMPUTE_DQ, MMODE, CREGS, DKSS, PERS, WLK, DROP)
