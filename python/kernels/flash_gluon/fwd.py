"""FlashAttention forward for Hopper (sm_90) in Gluon: ``attn_fwd_gluon``.

Computes ``O = softmax(sm_scale * Q K^T + mask) V`` and the natural-log LSE per
(batch, query head, ``BLOCK_M``-row query block).  The contract (argument order and types,
descriptor blocks, grid, semantics) is ``ABI.md``; the mask and its loop bounds are the
portable family's (``kernels/flash/mask.py``), called directly.

Structure (FlashAttention-3's forward, warp-specialized with ``gl.warp_specialize``):

* the **loader** (one warp, ``LOADER_REGS`` registers) issues every TMA load of the CTA:
  the ``NUM_CONSUMERS`` 64-row Q tiles once, then K and V block by block into a
  ``STAGES``-deep ring.  Each ring slot has a ``ready`` barrier (TMA transaction count)
  and an ``empty`` barrier (count ``NUM_CONSUMERS``: one arrive per consumer once its
  wgmma has read the slot);
* ``NUM_CONSUMERS`` (1, 2 or 3) **consumers** (one warpgroup each, ``CONSUMER_REGS``
  registers): consumer 0 is the default partition (it gets the registers the workers leave),
  the others workers.  Each owns 64 of
  the CTA's ``BLOCK_M = 64 * NUM_CONSUMERS`` query rows and walks *every* key block the
  loader loads, so the K/V traffic is shared by all the CTA's rows.  In the
  loop a consumer issues ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}`` as async wgmmas
  and runs softmax ``j`` while the PV product is still on the tensor cores
  (FA3's intra-warpgroup overlap: +10-18 % over the serial order on H200).  In the SASS,
  though, ptxas places the wait for ``PV_{j-1}`` right after the one for ``S_j``, ahead of the
  softmax's exponentials (hd128 and hd256, with dropout and without): the gain comes from the
  two products going out together, and a softmax that really runs under the PV product is
  still to be had;
* the **epilogue** normalises O, writes it through the (now idle) Q tile with a TMA
  store (rows past ``N_CTX_Q`` are clipped by TMA) and stores the LSE.

Key blocks (per CTA, from ``mask.key_block_bounds`` for the CTA's ``BLOCK_M`` rows): the blocks
visible in full to every row come first and carry no mask code; the leading and trailing
boundary blocks (window edges, the key tail ``>= N_CTX_K``) follow in one masked loop.
Loader and consumers map the walk index to a key column with the same helper
(``_key_block_col``), so both sides agree on the order by construction.  The first block
of the walk is peeled (it has no PV partner); it is masked unless ``PEEL_FULL`` is set and
the CTA has a full block (then step 0 is that full block and needs no mask).  The mask is
the identity on a full block, so correctness never depends on which kind step 0 is.

Tails and head-dim padding cost no code: TMA zero-fills Q/K/V rows past the sequence and
columns past the real head dim, and clips the O store.  Zero-filled keys are excluded by
the masked loop's key-tail mask (``full_hi <= N_CTX_K``), zero-filled V rows meet P = 0.
A CTA whose rows see no key at all walks zero blocks and writes O = 0, LSE = +inf.

Performance options (constexprs after ``STAGES``, defaults = the original kernel):

* ``NUM_CONSUMERS`` 2 (default), 3, or 1 consumer warpgroups, ``BLOCK_M = 64 * NUM_CONSUMERS`` (1: two
  CTAs per SM with 232 registers each, whose products and softmaxes the SM interleaves);
* ``CONSUMER_REGS`` / ``LOADER_REGS`` (default 240 / 24): the ``setmaxnreg`` split; the
  compile option ``maxnreg`` must satisfy ``(4 * NUM_CONSUMERS + 4) * 32 * maxnreg <= 65536 /
  CTAs per SM`` (168 for 2 consumers, 128 for 3, 80 for two 2-consumer CTAs per SM);
* ``PEEL_FULL`` 0 (default) / 1: the peeled walk step 0 runs unmasked when it is a full block;
* ``OVERLAP`` 1 (default) / 0: FA3's intra-warpgroup overlap, or the serial order
  ``S_j``, softmax ``j``, ``PV_j`` (fewer live registers: for 3 consumers at hd128);
* ``SCHED`` 0 (default) / 1: the program-to-tile map.  0: ``start_m`` reversed along grid x
  (heaviest query block first within each head).  1: the same grid linearised with the
  query block slowest, so *all* heads' heaviest (causal) blocks run first (LPT order).
* ``PERSISTENT`` 0 (default) / 1: the persistent kernel.  Grid ``(G, 1, 1)`` with
  ``G = min(#tiles, #SMs * CTAs per SM)``, ``#tiles = cdiv(Sq, BLOCK_M) * Hq * B`` (any ``G >= 1``
  is correct; grid y/z must be 1).  ``B`` and ``Hq`` come from Q's/O's descriptor shape (the
  descriptor ABI already passes it), so the argument list is unchanged.  CTA ``pid`` walks the
  work units ``pid, pid + G, ...``; a unit is one query block, or, when exactly one window edge
  cuts the key range (causal in either alignment), the pair of query blocks ``n_m - 1 - p`` and
  ``p`` of one head (equal cost per unit: the static round-robin is balanced).  Units are
  head-major (``m`` fastest, then ``h``, then ``z``), so the CTAs running together share the
  K/V of a few heads in L2.  Loader and consumers walk the same units (``_pers_unit``); the K/V
  ring's step counter runs on across tiles, so the loader prefetches the next tile's blocks
  while the consumers finish the current one, and the next tile's Q goes into a second Q buffer
  set (``Q_BUFS``) while the current tile's O store drains.  The partitions derive everything
  from kernel parameters themselves (``_opaque_i32``, ``_ctaid_x``): values computed once before
  the ``warp_specialize`` split would stay live across ``setmaxnreg`` and spill;
* ``Q_BUFS`` 2 (default) / 1, persistent only: Q/O buffer sets.  2: Q of tile ``i + 1`` is loaded
  while tile ``i`` runs; tile ``i``'s O store (through its Q buffer) is waited for during
  tile ``i + 1``'s first QK product, then the buffer goes back to the loader (``q_empty``).
  1 (hd256: no room for two): the buffer goes back right after the O store has read it.

Scores use only the key-tail and window parts of the mask: rows past ``N_CTX_Q`` are
never stored (TMA clips O, the LSE store is masked), so they need no mask.

Numerics: fp32 scores and accumulator, exp2 online softmax (``softmax.py``, scale folded
into the exponent's FMA; requires ``sm_scale > 0``), P cast to the input dtype for PV.
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
from ..flash.dropout import philox_state
from .dropout import dropout_state_fwd, drop_probs
from .ragged import is_ragged, query_block_sequence, row_coords, row_offset
from .softmax import online_softmax_step, softmax_epilogue

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
#: How the dropout forward walks the key blocks after the peeled first one.  0: a loop over the
#: blocks every row sees in full (no mask code), then a masked loop over the boundary blocks.
#: 1: one loop, every block masked (the mask is exact on a full block).  2: one loop, the mask behind
#: a run-time branch from the first boundary block on.  3 (default): 2 in a CTA that walks a boundary
#: block (a causal or windowed call, a key tail), 0 in one that walks full blocks only.
#: Why: with dropout's Philox rounds the step's code is large, and a CTA that runs both loops of 0
#: misses the instruction cache (Nsight Compute, H100, hd128 S2k p 0.1: the causal forward's warps
#: stalled 3.16 cycles per issued instruction on "no instruction", the unmasked one 0.21; in one
#: loop 1.24, and the kernel took 849 -> 616 us).  One loop costs the unmasked rows (hd128
#: S2k/4k/8k 0.90/0.97/1.00 -> 0.80/0.96/0.98 of cuDNN), hence 3; it lifted the causal rows from
#: 0.46-0.53/0.68/0.83 to 0.59-0.70/0.76-0.85/0.96 (bench/results/h200_gluon_dropout_varlen_issue17.md).
#: test/gluon/check_fwd_dropout.py --one-loop patches it.
DROPOUT_ONE_LOOP: gl.constexpr = gl.constexpr(3)
#: The head dim whose dropout forward runs Philox's rounds as a loop (``dropout.ROUNDS_LOOP``: at
#: hd128 17 % fewer SASS instructions and up to 11 % faster, never clearly slower; hd64 and hd256
#: looked 1-3 % slower).  0: none;
#: test/gluon/check_fwd_dropout.py --rounds-loop patches it.  With ``DROPOUT_ONE_LOOP`` 3 the hd128 kernel
#: keeps 128 bytes of stack (119 spill instructions; unrolled rounds: none, 2 % more SASS); timed only
#: with the rounds loop so far (run_all.sh GLUON_CHECKS=dropout-bench times both).
DROPOUT_ROUNDS_LOOP_HEAD_DIM: gl.constexpr = gl.constexpr(128)


@gluon.constexpr_function
def _opt(value, default):
    """An option constexpr's value: an AOT compile (``GluonASTSource``) that does not name an
    option passes ``None``, not the signature's default; map that to the default."""
    return default if value is None else value


# ----------------------------------------------------------------------------
# The program-to-tile map and the key-block schedule shared by loader and consumers
# ----------------------------------------------------------------------------
@gluon.jit
def _tile_coords(SCHED: gl.constexpr):
    """``(start_m, off_h, off_z)`` of this program; the grid is ``(cdiv(Sq, BLOCK_M), Hq, B)``."""
    if SCHED == 0:
        start_m = gl.num_programs(0) - 1 - gl.program_id(0)  # heaviest query blocks first (causal)
        off_h = gl.program_id(1)
        off_z = gl.program_id(2)
    else:
        # Programs launch in linear order (x fastest): re-map so the query block is the
        # slowest index, heaviest first, over all heads and batches.
        n_m = gl.num_programs(0)
        n_h = gl.num_programs(1)
        n_hz = n_h.to(gl.int64) * gl.num_programs(2)
        pid = gl.program_id(0) + n_m.to(gl.int64) * (gl.program_id(1) + n_h.to(gl.int64) * gl.program_id(2))
        start_m = (n_m - 1 - pid // n_hz).to(gl.int32)
        rest = pid % n_hz
        off_h = (rest % n_h).to(gl.int32)
        off_z = (rest // n_h).to(gl.int32)
    return start_m, off_h, off_z


@gluon.jit
def _key_block_col(it, n_full, full_lo, start, n_lead, full_hi, BLOCK_N: gl.constexpr):
    """First key column of walk step ``it``: the full blocks ``[full_lo, full_hi)`` first,
    then the boundary blocks ``[start, full_lo)`` and ``[full_hi, end)`` (``mask.block_walk``)."""
    boundary_col = mask.block_walk_start(it - n_full, start, n_lead, full_hi, BLOCK_N)
    return gl.where(it < n_full, full_lo + it * BLOCK_N, boundary_col)


# ----------------------------------------------------------------------------
# Operand layouts by input type.  16-bit inputs: V tiles are [BLOCK_N, HEAD_DIM] as stored.  fp8
# (e4m3, ``fwd_fp8.py``): wgmma reads an 8-bit B operand only K-major, so V arrives as Vᵀ
# ([B, Hk, D, Sk], tiles [HEAD_DIM, BLOCK_N]) and the PV product views each tile transposed back.
# ----------------------------------------------------------------------------
@gluon.constexpr_function
def _wgmma_layout(n, operand_dtype):
    """Accumulator layout of one warpgroup's ``[64, n]`` wgmma; its K step is 32 bytes of operand."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                     instr_shape=[16, n, 256 // operand_dtype.primitive_bitwidth])


@gluon.constexpr_function
def _p_operand_layout(o_layout, operand_dtype):
    """Register layout of P as the PV product's A operand (32 bits of P per register)."""
    return gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=32 // operand_dtype.primitive_bitwidth)


@gluon.jit
def _load_v(desc_v, off_z, off_hk, col, k_end, k_len, bar, buf):
    """TMA load of the V block at key ``col`` (fp8: the ``[HEAD_DIM, BLOCK_N]`` column strip of Vᵀ).
    ``k_end``/``k_len``: the packed sequence (``ragged.row_coords``)."""
    if desc_v.dtype.is_fp8():
        tma.async_copy_global_to_shared(desc_v, [off_z, off_hk, 0, col], bar, buf)
    else:
        tma.async_copy_global_to_shared(desc_v, row_coords(desc_v, off_z, off_hk, col, 0, k_end, k_len), bar, buf)


@gluon.jit
def _p_to_operand(p, v_dtype, p_layout: gl.constexpr):
    """Probabilities ``p`` (fp32, score layout) as the PV product's A operand.

    fp8: the A operand holds 4 consecutive keys per register, the score layout 2 pairs 8 keys
    apart, so a plain conversion moves values between threads.  Instead P's keys are renamed
    within each 32-key group -- key ``c`` (bits ``i1 i0 t1 t0 e``) becomes ``k`` (bits
    ``i1 t1 t0 i0 e``) -- which is exactly where the operand layout expects what each thread
    already holds; Vᵀ's columns are stored in the same order (``fwd_fp8_vt.py``), so the
    product is unchanged.  (Every fp8 P operand is made here: Vᵀ's order is the contract.)"""
    if v_dtype.is_fp8():
        rows: gl.constexpr = p.shape[0]
        keys: gl.constexpr = p.shape[1]
        p8 = p.to(v_dtype).reshape([rows, keys // 32, 2, 2, 2, 2, 2]).permute((0, 1, 2, 4, 5, 3, 6))
        return gl.convert_layout(p8.reshape([rows, keys]), p_layout)
    else:
        return gl.convert_layout(p.to(v_dtype), p_layout)


@gluon.jit
def _carry_p(p, v_dtype, p_layout: gl.constexpr):
    """P of walk step j as the overlapped order carries it into step j + 1 (its PV product).

    16-bit: already the PV product's A operand (a register-only shuffle for this layout pair).
    fp8: as fp16 in the score layout, two per register; the e4m3 operand is made where it is
    used (``_p_operand``).  A loop-carried 8-bit tensor would sit one element per register and be
    re-packed with byte permutes every step (and spill)."""
    if v_dtype.is_fp8():
        return p.to(gl.float16)
    else:
        return _p_to_operand(p, v_dtype, p_layout)


@gluon.jit
def _p_operand(p_carried, v_dtype, p_layout: gl.constexpr):
    """The PV product's A operand from what ``_carry_p`` carried."""
    if v_dtype.is_fp8():
        return _p_to_operand(p_carried, v_dtype, p_layout)
    else:
        return p_carried


@gluon.jit
def _wait_pv(acc, p):
    """Wait for every wgmma in flight; the PV product's register operand ``p`` stays live until then.

    fp8: Triton 3.6 cannot list 8-bit registers as a wait's dependencies (its lowering knows
    16/32/64-bit ones), so only ``acc`` is listed; ptxas itself keeps a register that an
    in-flight wgmma reads from being reused."""
    if p.dtype.is_fp8():
        acc = warpgroup_mma_wait(0, deps=(acc, ))
    else:
        acc, p = warpgroup_mma_wait(0, deps=(acc, p))
    return acc


@gluon.jit
def _v_operand(v_bufs, slot):
    """Ring slot ``slot`` as the PV product's ``[BLOCK_N, HEAD_DIM]`` B operand."""
    tile = v_bufs.index(slot).reshape([v_bufs.shape[-2], v_bufs.shape[-1]])
    if v_bufs.dtype.is_fp8():
        tile = tile.permute((1, 0))
    return tile


# ----------------------------------------------------------------------------
# Loader partition (1 warp)
# ----------------------------------------------------------------------------
@gluon.jit
def _loader(desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_bars, k_ready, v_ready, k_empty, v_empty,
            off_z, off_h, off_hk, q_row0, q_end, q_len, k_end, k_len, n_full, full_lo, start, n_lead, full_hi,
            n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr):
    """``q_end``/``q_len``, ``k_end``/``k_len``: the packed sequences of a varlen batch (read with
    ragged descriptors only: ``ragged.row_coords``)."""
    q_rows: gl.constexpr = desc_q.block_type.shape[-2]
    # One barrier per Q tile, so each consumer starts as soon as its own rows have landed.
    for c in gl.static_range(NUM_CONSUMERS):
        mbarrier.expect(q_bars.index(c), desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, row_coords(desc_q, off_z, off_h, q_row0 + c * q_rows, 0, q_end, q_len),
                                        q_bars.index(c), q_bufs.index(c))
    for it in range(n_blocks):
        col = _key_block_col(it, n_full, full_lo, start, n_lead, full_hi, BLOCK_N)
        slot = it % STAGES
        phase = (it // STAGES) & 1
        # A fresh barrier is in phase 0, so waiting for phase 1 passes: the first round
        # of the ring needs no release.
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        mbarrier.expect(k_ready.index(slot), desc_k.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_k, row_coords(desc_k, off_z, off_hk, col, 0, k_end, k_len),
                                        k_ready.index(slot), k_bufs.index(slot))
        # V is released later than K (after the PV product): wait for it separately so
        # K_{j+1} can land while PV_j is still reading its V slot.
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), desc_v.block_type.nbytes)
        _load_v(desc_v, off_z, off_hk, col, k_end, k_len, v_ready.index(slot), v_bufs.index(slot))


# ----------------------------------------------------------------------------
# Consumer pieces (one warpgroup, 64 query rows)
# ----------------------------------------------------------------------------
@gluon.jit
def _mask_scores(s, rows, col, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, BLOCK_N: gl.constexpr):
    """Set the scores of invisible (query, key) pairs to -inf: the key tail and the window.

    No query-tail term: rows past ``N_CTX_Q`` are never stored."""
    cols = col + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout))
    cols2 = gl.expand_dims(cols, 0)
    visible = mask.key_tail_mask(cols2, N_CTX_K) & mask.window_mask(gl.expand_dims(rows, 1), cols2, WINDOW_LEFT,
                                                                     WINDOW_RIGHT, diag)
    return gl.where(visible, s, float("-inf"))


@gluon.jit
def _issue_qk(q_smem, k_bufs, slot, s_layout: gl.constexpr):
    """Start ``S = Q K^T`` on the tensor cores (async); the caller waits for it."""
    rows: gl.constexpr = q_smem.shape[0]
    block_n: gl.constexpr = k_bufs.shape[-2]
    head_dim: gl.constexpr = k_bufs.shape[-1]
    k_t = k_bufs.index(slot).reshape([block_n, head_dim]).permute((1, 0))
    s0 = gl.zeros([rows, block_n], gl.float32, s_layout)
    return warpgroup_mma(q_smem, k_t, s0, use_acc=False, is_async=True)


@gluon.jit
def _first_step(col, q_smem, k_bufs, v_bufs, k_ready, k_empty, m_i, l_i, qk_scale, rows, N_CTX_K, WINDOW_LEFT,
                WINDOW_RIGHT, diag, MASKED: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr,
                p_layout: gl.constexpr, TURN: gl.constexpr = -1, drop=None, DROPOUT: gl.constexpr = 0):
    """Walk step 0 (overlapped order): ``S_0`` and softmax 0 only; its PV goes out with ``S_1``.
    ``drop``: ``dropout.dropout_state_fwd`` (with ``DROPOUT``)."""
    mbarrier.wait(k_ready.index(0), 0)
    _take_turn(TURN, col)
    s = _issue_qk(q_smem, k_bufs, 0, s_layout)
    _hand_turn(TURN, col)
    s = warpgroup_mma_wait(0, deps=(s, ))
    mbarrier.arrive(k_empty.index(0), count=1)
    if MASKED:
        s = _mask_scores(s, rows, col, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, BLOCK_N)
    p, alpha, m_i, l_i = online_softmax_step(s, m_i, l_i, qk_scale)
    p = drop_probs(p, col, drop, DROPOUT)
    p_next = _carry_p(p, v_bufs.dtype, p_layout)
    return p_next, m_i, l_i


@gluon.constexpr_function
def _turn(cid, pingpong):
    """This consumer's ``TURN`` (``_take_turn``): its id with ``PINGPONG``, else -1 (no barrier)."""
    return cid if pingpong else -1


@gluon.jit
def _take_turn(TURN: gl.constexpr, dep):
    """FA3's warp-scheduler barrier, ``TURN`` = this consumer (0 or 1; -1: off): wait until the
    other consumer hands the tensor cores over (named barrier 14 + TURN, both consumers' 256
    threads), so one issues its products while the other runs its softmax.  ``dep``: any i32
    scalar (the asm needs an operand)."""
    if TURN == 0:
        gl.inline_asm_elementwise("bar.sync 14, 256;\n\tmov.b32 $0, $1;", "=r,r", [dep], dtype=gl.int32,
                                  is_pure=False, pack=1)
    elif TURN == 1:
        gl.inline_asm_elementwise("bar.sync 15, 256;\n\tmov.b32 $0, $1;", "=r,r", [dep], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _hand_turn(TURN: gl.constexpr, dep):
    """Hand the tensor cores to the other consumer (see ``_take_turn``)."""
    if TURN == 0:
        gl.inline_asm_elementwise("bar.arrive 15, 256;\n\tmov.b32 $0, $1;", "=r,r", [dep], dtype=gl.int32,
                                  is_pure=False, pack=1)
    elif TURN == 1:
        gl.inline_asm_elementwise("bar.arrive 14, 256;\n\tmov.b32 $0, $1;", "=r,r", [dep], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _overlap_step(j, col, q_smem, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, acc, m_i, l_i, p_prev,
                  qk_scale, rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag,
                  MASKED: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  s_layout: gl.constexpr, p_layout: gl.constexpr, TURN: gl.constexpr = -1, drop=None,
                  DROPOUT: gl.constexpr = 0, n_full=0):
    """Walk step ``j``: ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}`` in flight together,
    softmax ``j`` overlapping the PV product.  Returns the state with ``P_j`` pending.
    ``TURN``: this consumer's turn on the tensor cores for both products (``_take_turn``).
    ``col``: the key block's first column (read by the mask and by dropout: ``dropout.drop_probs``).
    ``MASKED``: 0 no mask, 1 the mask, 2 the mask at run time from step ``n_full`` on (``_key_block_col``'s
    order: the full blocks first)."""
    slot = j % STAGES
    phase = (j // STAGES) & 1
    prev_slot = (j - 1) % STAGES
    prev_phase = ((j - 1) // STAGES) & 1

    mbarrier.wait(k_ready.index(slot), phase)
    _take_turn(TURN, j)
    s = _issue_qk(q_smem, k_bufs, slot, s_layout)
    mbarrier.wait(v_ready.index(prev_slot), prev_phase)
    p_op = _p_operand(p_prev, v_bufs.dtype, p_layout)
    acc = warpgroup_mma(p_op, _v_operand(v_bufs, prev_slot), acc, is_async=True)
    _hand_turn(TURN, j)
    # wgmmas retire in order: waiting until one is outstanding means S_j is done, PV_{j-1} may not be.
    s = warpgroup_mma_wait(1, deps=(s, ))
    mbarrier.arrive(k_empty.index(slot), count=1)
    if MASKED == 1:
        s = _mask_scores(s, rows, col, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, BLOCK_N)
    elif MASKED == 2:
        if j >= n_full:
            s = _mask_scores(s, rows, col, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, BLOCK_N)
    p, alpha, m_i, l_i = online_softmax_step(s, m_i, l_i, qk_scale)
    p = drop_probs(p, col, drop, DROPOUT)
    p_next = _carry_p(p, v_bufs.dtype, p_layout)
    acc = _wait_pv(acc, p_op)
    mbarrier.arrive(v_empty.index(prev_slot), count=1)
    # acc now holds sum over blocks < j at the running max m_{j-1}: rescale to m_j.
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout)), 1)
    return acc, m_i, l_i, p_next


@gluon.jit
def _serial_step(j, col, q_smem, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, acc, m_i, l_i,
                 qk_scale, rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag,
                 MASKED: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                 s_layout: gl.constexpr, p_layout: gl.constexpr, TURN: gl.constexpr = -1, drop=None,
                 DROPOUT: gl.constexpr = 0):
    """Walk step ``j`` in the serial order (``OVERLAP=0``): ``S_j``, softmax ``j``, ``O += P_j V_j``.
    ``TURN``: the consumer holds the tensor cores from ``PV_{j-1}`` through ``S_j`` (``_take_turn``;
    the caller takes the first turn before the walk and hands the last one over after it)."""
    slot = j % STAGES
    phase = (j // STAGES) & 1

    mbarrier.wait(k_ready.index(slot), phase)
    s = _issue_qk(q_smem, k_bufs, slot, s_layout)
    _hand_turn(TURN, j)
    s = warpgroup_mma_wait(0, deps=(s, ))
    mbarrier.arrive(k_empty.index(slot), count=1)
    if MASKED:
        s = _mask_scores(s, rows, col, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, BLOCK_N)
    p, alpha, m_i, l_i = online_softmax_step(s, m_i, l_i, qk_scale)
    p = drop_probs(p, col, drop, DROPOUT)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout)), 1)
    p16 = _p_to_operand(p, v_bufs.dtype, p_layout)
    mbarrier.wait(v_ready.index(slot), phase)
    _take_turn(TURN, j)
    acc = warpgroup_mma(p16, _v_operand(v_bufs, slot), acc, is_async=True)
    acc = _wait_pv(acc, p16)
    mbarrier.arrive(v_empty.index(slot), count=1)
    return acc, m_i, l_i


@gluon.jit
def _store_outputs(o, lse, o_tile, o_smem, desc_o, LSE, stride_lz, stride_lh, STORE_LSE, off_z, off_h, row0, rows,
                   N_CTX_Q, q_end):
    """O through a shared tile (16-bit: the Q tile, whose last reader, S = Q K^T, has retired) and a
    TMA store; LSE by plain stores (a packed batch's at its sequence's rows: ``stride_lz`` is 0)."""
    o_smem.store(o.to(desc_o.dtype))
    fence_async_shared()  # order the generic-proxy smem writes before the async-proxy (TMA) read
    tma.async_copy_shared_to_global(desc_o, row_coords(desc_o, off_z, off_h, row0, 0, q_end, N_CTX_Q), o_tile)
    if STORE_LSE != 0:
        lse_ptrs = (LSE + off_z.to(gl.int64) * stride_lz + off_h.to(gl.int64) * stride_lh
                    + row_offset(desc_o, q_end, N_CTX_Q) + rows)
        gl.store(lse_ptrs, lse, mask=rows < N_CTX_Q)
    tma.store_wait(0)


@gluon.jit
def _walk_one_loop(n_blocks, n_full, full_lo, start, n_lead, full_hi, q_smem, k_bufs, v_bufs, k_ready, v_ready,
                   k_empty, v_empty, acc, m_i, l_i, p_prev, qk_scale, rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag,
                   MASKED: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, s_layout: gl.constexpr,
                   p_layout: gl.constexpr, TURN: gl.constexpr, drop, DROPOUT: gl.constexpr):
    """Steps ``1 .. n_blocks`` after the peeled one in one loop (``DROPOUT_ONE_LOOP``): every block masked
    (``MASKED`` 1: the mask is exact on a full block), or from the first boundary block on behind a
    run-time branch (2)."""
    for j in range(1, n_blocks):
        col = _key_block_col(j, n_full, full_lo, start, n_lead, full_hi, BLOCK_N)
        acc, m_i, l_i, p_prev = _overlap_step(j, col, q_smem, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, acc,
                                              m_i, l_i, p_prev, qk_scale, rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
                                              diag, MASKED, BLOCK_N, STAGES, s_layout, p_layout, TURN, drop, DROPOUT,
                                              n_full)
    return acc, m_i, l_i, p_prev


@gluon.jit
def _walk_two_loops(n_blocks, n_full, full_lo, start, n_lead, full_hi, q_smem, k_bufs, v_bufs, k_ready, v_ready,
                    k_empty, v_empty, acc, m_i, l_i, p_prev, qk_scale, rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
                    TURN: gl.constexpr, drop, DROPOUT: gl.constexpr):
    """Steps ``1 .. n_blocks`` after the peeled one: the key blocks visible in full to all the CTA's rows
    (no mask code), then the boundary blocks (leading, then trailing), masked."""
    for j in range(1, n_full):
        acc, m_i, l_i, p_prev = _overlap_step(j, full_lo + j * BLOCK_N, q_smem, k_bufs, v_bufs, k_ready, v_ready,
                                              k_empty, v_empty, acc, m_i, l_i, p_prev, qk_scale, rows, N_CTX_K,
                                              WINDOW_LEFT, WINDOW_RIGHT, diag, False, BLOCK_N, STAGES, s_layout,
                                              p_layout, TURN, drop, DROPOUT)
    for j in range(gl.maximum(n_full, 1), n_blocks):
        col = mask.block_walk_start(j - n_full, start, n_lead, full_hi, BLOCK_N)
        acc, m_i, l_i, p_prev = _overlap_step(j, col, q_smem, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, acc,
                                              m_i, l_i, p_prev, qk_scale, rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
                                              diag, True, BLOCK_N, STAGES, s_layout, p_layout, TURN, drop, DROPOUT)
    return acc, m_i, l_i, p_prev


@gluon.jit
def _consumer(cid: gl.constexpr, desc_o, LSE, stride_lz, stride_lh, STORE_LSE,
              q_bufs, o_bufs, k_bufs, v_bufs, q_bars, k_ready, v_ready, k_empty, v_empty,
              off_z, off_h, start_m, n_full, full_lo, start, n_lead, full_hi, n_blocks,
              qk_scale, v_descale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, q_end,
              PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, N_CTX_Q_MAX,
              N_CTX_K_MAX,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              PEEL_FULL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr = 0,
              DROPOUT: gl.constexpr = 0):
    """``N_CTX_Q``/``N_CTX_K``: the lengths of this CTA's sequence; ``q_end``: where it ends among
    a packed batch's rows (ragged descriptors only).  Dropout (``DROPOUT``): the Philox group and
    the kernel's (maximum) lengths ``N_CTX_Q_MAX``/``N_CTX_K_MAX`` the counters are laid out for."""
    QB: gl.constexpr = q_bufs.shape[-2]
    # Dropout's mode for drop_probs: the mask's invariants recomputed per step, except at hd64 (its
    # 104-register consumers spill more recomputing them than keeping them: dropout.py); Philox's
    # rounds as a loop at DROPOUT_ROUNDS_LOOP_HEAD_DIM.
    DROP: gl.constexpr = 0 if not DROPOUT else (
        1 if HEAD_DIM <= 64 else (3 if HEAD_DIM == DROPOUT_ROUNDS_LOOP_HEAD_DIM else 2))
    TURN: gl.constexpr = _turn(cid, PINGPONG)
    # wgmma accumulator layouts of one warpgroup; P feeds the PV product from registers.
    s_layout: gl.constexpr = _wgmma_layout(BLOCK_N, k_bufs.dtype)
    o_layout: gl.constexpr = _wgmma_layout(HEAD_DIM, v_bufs.dtype)
    p_layout: gl.constexpr = _p_operand_layout(o_layout, v_bufs.dtype)

    q_tile = q_bufs.index(cid)  # [1, 1, QB, HEAD_DIM]: the TMA view
    q_smem = q_tile.reshape([QB, HEAD_DIM])  # the same bytes as the wgmma operand
    row0 = start_m * BLOCK_M + cid * QB
    rows = row0 + gl.arange(0, QB, layout=gl.SliceLayout(1, s_layout))

    m_i = gl.full([QB], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.full([QB], 0.0, gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([QB, HEAD_DIM], gl.float32, o_layout)
    drop = None
    if DROPOUT:
        drop = dropout_state_fwd(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, off_z, off_h, row0,
                                 N_CTX_Q_MAX, N_CTX_K_MAX)
    # Wait for Q even when there is no key block: the O store below reuses its buffer.
    mbarrier.wait(q_bars.index(cid), 0)

    if n_blocks > 0:
        if TURN == 1:
            _hand_turn(TURN, n_blocks)  # consumer 0 takes the first turn
        if OVERLAP:
            # Walk step 0, peeled: S_0 and softmax_0 only (its PV goes out with S_1).
            if PEEL_FULL:
                if n_full > 0:  # step 0 is the first full block: no mask
                    p_prev, m_i, l_i = _first_step(full_lo, q_smem, k_bufs, v_bufs, k_ready, k_empty, m_i, l_i,
                                                   qk_scale, rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, False,
                                                   BLOCK_N, s_layout, p_layout, TURN, drop, DROP)
                else:  # step 0 is the first boundary block
                    col = mask.block_walk_start(0, start, n_lead, full_hi, BLOCK_N)
                    p_prev, m_i, l_i = _first_step(col, q_smem, k_bufs, v_bufs, k_ready, k_empty, m_i, l_i,
                                                   qk_scale, rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, True,
                                                   BLOCK_N, s_layout, p_layout, TURN, drop, DROP)
            else:
                # Always masked: it may be a boundary block, and the mask is exact on a full one.
                col = _key_block_col(0, n_full, full_lo, start, n_lead, full_hi, BLOCK_N)
                p_prev, m_i, l_i = _first_step(col, q_smem, k_bufs, v_bufs, k_ready, k_empty, m_i, l_i, qk_scale,
                                               rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, True, BLOCK_N,
                                               s_layout, p_layout, TURN, drop, DROP)

            if DROPOUT and (DROPOUT_ONE_LOOP == 3):
                # One loop in a CTA that walks a boundary block (a causal or windowed call, a key
                # tail), the two loops in one that walks full blocks only.
                if n_blocks > n_full:
                    acc, m_i, l_i, p_prev = _walk_one_loop(n_blocks, n_full, full_lo, start, n_lead, full_hi, q_smem,
                                                           k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, acc,
                                                           m_i, l_i, p_prev, qk_scale, rows, N_CTX_K, WINDOW_LEFT,
                                                           WINDOW_RIGHT, diag, 2, BLOCK_N, STAGES, s_layout, p_layout,
                                                           TURN, drop, DROP)
                else:
                    acc, m_i, l_i, p_prev = _walk_two_loops(n_blocks, n_full, full_lo, start, n_lead, full_hi, q_smem,
                                                            k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, acc,
                                                            m_i, l_i, p_prev, qk_scale, rows, N_CTX_K, WINDOW_LEFT,
                                                            WINDOW_RIGHT, diag, BLOCK_N, STAGES, s_layout, p_layout,
                                                            TURN, drop, DROP)
            elif DROPOUT and DROPOUT_ONE_LOOP:
                acc, m_i, l_i, p_prev = _walk_one_loop(n_blocks, n_full, full_lo, start, n_lead, full_hi, q_smem,
                                                       k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, acc, m_i,
                                                       l_i, p_prev, qk_scale, rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
                                                       diag, DROPOUT_ONE_LOOP, BLOCK_N, STAGES, s_layout, p_layout,
                                                       TURN, drop, DROP)
            else:
                acc, m_i, l_i, p_prev = _walk_two_loops(n_blocks, n_full, full_lo, start, n_lead, full_hi, q_smem,
                                                        k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, acc, m_i,
                                                        l_i, p_prev, qk_scale, rows, N_CTX_K, WINDOW_LEFT,
                                                        WINDOW_RIGHT, diag, BLOCK_N, STAGES, s_layout, p_layout, TURN,
                                                        drop, DROP)

            # The last PV product has no S partner.
            last = n_blocks - 1
            last_slot = last % STAGES
            mbarrier.wait(v_ready.index(last_slot), (last // STAGES) & 1)
            p_op = _p_operand(p_prev, v_bufs.dtype, p_layout)
            acc = warpgroup_mma(p_op, _v_operand(v_bufs, last_slot), acc, is_async=True)
            acc = _wait_pv(acc, p_op)
            mbarrier.arrive(v_empty.index(last_slot), count=1)
        else:
            _take_turn(TURN, n_blocks)
            for j in range(0, n_full):
                acc, m_i, l_i = _serial_step(j, full_lo + j * BLOCK_N, q_smem, k_bufs, v_bufs, k_ready, v_ready,
                                             k_empty, v_empty, acc, m_i, l_i, qk_scale, rows, N_CTX_K, WINDOW_LEFT,
                                             WINDOW_RIGHT, diag, False, BLOCK_N, STAGES, s_layout, p_layout, TURN,
                                             drop, DROP)
            for j in range(n_full, n_blocks):
                col = mask.block_walk_start(j - n_full, start, n_lead, full_hi, BLOCK_N)
                acc, m_i, l_i = _serial_step(j, col, q_smem, k_bufs, v_bufs, k_ready, v_ready, k_empty, v_empty, acc,
                                             m_i, l_i, qk_scale, rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag,
                                             True, BLOCK_N, STAGES, s_layout, p_layout, TURN, drop, DROP)
            _hand_turn(TURN, n_blocks)

    o, lse = softmax_epilogue(acc, m_i, l_i)
    if DROPOUT:
        o = o * dropout_scale
    if q_bufs.dtype.is_fp8():
        o = o * v_descale
    # 16-bit: O goes out through the Q tile (o_bufs is q_bufs); fp8: through its own 16-bit tile.
    o_tile = o_bufs.index(cid)
    _store_outputs(o, lse, o_tile, o_tile.reshape([QB, HEAD_DIM]), desc_o, LSE, stride_lz, stride_lh, STORE_LSE, off_z,
                   off_h, row0, rows, N_CTX_Q, q_end)




# ----------------------------------------------------------------------------
# Persistent variant (PERSISTENT=1): grid (min(#tiles, #SMs * CTAs/SM), 1, 1), each CTA walks
# the work units u = pid, pid + G, ... (G = num_programs(0)).
# ----------------------------------------------------------------------------
@gluon.jit
def _opaque_i32(x):
    """``x`` through a non-pure ``mov``: LLVM cannot hoist what is derived from it out of the
    partition (values the partitions compute alike from kernel parameters otherwise end up
    computed once before the warp_specialize split, live across ``setmaxnreg``, and spill)."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _opaque_f32(x):
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=False, pack=1)


@gluon.jit
def _ctaid_x(dep):
    """``program_id(0)``, read in place (non-pure, like ``_opaque_i32``; ``dep`` only gives the asm an operand)."""
    return gl.inline_asm_elementwise("mov.u32 $0, %ctaid.x;", "=r,r", [dep], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _nctaid_x(dep):
    """``num_programs(0)``, read in place (see ``_ctaid_x``)."""
    return gl.inline_asm_elementwise("mov.u32 $0, %nctaid.x;", "=r,r", [dep], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _pers_schedule(N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, BLOCK_M: gl.constexpr):
    """``(n_m, pair, n_per)`` of the persistent walk: ``n_per`` work units per (batch, head), in
    all ``n_per * Hq * B``.

    A work unit is one query block, or -- when exactly one edge of the window cuts the key range
    (causal in either alignment: the cost of a query block is linear in its index) -- the *pair*
    of query blocks ``(n_m - 1 - p, p)`` of one head, whose costs add up to the same total for
    every ``p``: the static round-robin over units is then balanced.  Units are head-major (the
    CTAs that run at the same time share the K/V of a few heads in L2)."""
    n_m = gl.cdiv(N_CTX_Q, BLOCK_M)
    left_cuts = (N_CTX_Q - 1 + diag - WINDOW_LEFT) > 0  # the last row does not see key 0
    right_cuts = (diag + WINDOW_RIGHT) < (N_CTX_K - 1)  # the first row does not see the last key
    pair = (left_cuts != right_cuts).to(gl.int32)
    n_per = n_m - pair * (n_m // 2)  # query blocks (or pairs) per head
    return n_m, pair, n_per


@gluon.jit
def _pers_unit(u, n_m, pair, n_per, n_heads):
    """``(m0, p, n_sub, off_h, off_z)`` of work unit ``u``: its query blocks are ``m0`` (the
    heavier) then, when ``n_sub == 2``, ``p``."""
    hz = u // n_per
    p = u - hz * n_per
    m0 = n_m - 1 - p
    n_sub = 1 + pair * (p != m0).to(gl.int32)
    off_h = hz % n_heads
    off_z = hz // n_heads
    return m0, p, n_sub, off_h, off_z


@gluon.jit
def _tile_walk(start_m, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr):
    """The key-block walk of query block ``start_m`` (as the non-persistent kernel computes it)."""
    start, full_lo, full_hi, end = mask.key_block_bounds(start_m, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag,
                                                         BLOCK_M, BLOCK_N)
    n_full = (full_hi - full_lo) // BLOCK_N
    n_lead, n_boundary = mask.block_walk(start, end, full_lo, full_hi, BLOCK_N)
    return n_full, full_lo, start, n_lead, full_hi, n_full + n_boundary


@gluon.jit
def _loader_pers(desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                 N_CTX_Q, N_CTX_K, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr,
                 Q_BUFS: gl.constexpr):
    """The loader of the persistent kernel: per tile the Q tiles into Q buffer set ``i % Q_BUFS``
    (once the consumers have released it: its previous O store has drained), then the tile's K/V
    blocks into the ring, whose step counter ``kv0 + it`` runs on across tiles."""
    q_rows: gl.constexpr = desc_q.block_type.shape[2]
    # Everything from kernel parameters, inside the partition (values computed before the
    # warp_specialize split stay live across setmaxnreg and spill).
    N_CTX_Q = _opaque_i32(N_CTX_Q)
    N_CTX_K = _opaque_i32(N_CTX_K)
    n_heads = _opaque_i32(desc_q.shape[1])
    diag = mask.diag_offset(N_CTX_Q, N_CTX_K, ALIGN_BOTTOM_RIGHT)
    n_m, pair, n_per = _pers_schedule(N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, BLOCK_M)
    kv0 = 0
    i = 0
    # Units u = pid, pid + G, ... while u < n_per * Hq * B, tested as "batch of u < B" against the
    # kernel parameter (no live bound: it would spill where registers are tight).
    u = _ctaid_x(n_per)
    off_z = (u // n_per) // n_heads
    while off_z < desc_q.shape[0]:
        m0, p, n_sub, off_h, off_z = _pers_unit(u, n_m, pair, n_per, n_heads)
        off_hk = off_h // GQA_GROUP
        for s in range(n_sub):
            start_m = m0 + s * (p - m0)
            n_full, full_lo, start, n_lead, full_hi, n_blocks = _tile_walk(start_m, N_CTX_Q, N_CTX_K, WINDOW_LEFT,
                                                                           WINDOW_RIGHT, diag, BLOCK_M, BLOCK_N)
            qb = (i % Q_BUFS) * NUM_CONSUMERS
            q_phase = ((i // Q_BUFS) & 1) ^ 1  # the first use of a buffer set needs no release
            for c in gl.static_range(NUM_CONSUMERS):
                mbarrier.wait(q_empty.index(qb + c), q_phase)
                mbarrier.expect(q_ready.index(qb + c), desc_q.block_type.nbytes)
                tma.async_copy_global_to_shared(desc_q, [off_z, off_h, start_m * BLOCK_M + c * q_rows, 0],
                                                q_ready.index(qb + c), q_bufs.index(qb + c))
            for it in range(n_blocks):
                col = _key_block_col(it, n_full, full_lo, start, n_lead, full_hi, BLOCK_N)
                g = kv0 + it
                slot = g % STAGES
                phase = (g // STAGES) & 1
                mbarrier.wait(k_empty.index(slot), phase ^ 1)
                mbarrier.expect(k_ready.index(slot), desc_k.block_type.nbytes)
                tma.async_copy_global_to_shared(desc_k, [off_z, off_hk, col, 0], k_ready.index(slot),
                                                k_bufs.index(slot))
                mbarrier.wait(v_empty.index(slot), phase ^ 1)
                mbarrier.expect(v_ready.index(slot), desc_v.block_type.nbytes)
                _load_v(desc_v, off_z, off_hk, col, 0, 0, v_ready.index(slot), v_bufs.index(slot))
            kv0 += n_blocks
            i += 1
        u += _nctaid_x(u)
        off_z = (u // n_per) // n_heads


@gluon.jit
def _release_q(bar):
    """Hand a Q buffer back to the loader once this warpgroup's O store from it has read shared
    memory (``store_wait`` of the issuing thread, then a partition barrier: the arrive is thread 0's)."""
    tma.store_wait(0)
    gl.thread_barrier()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _first_step_at(g, col, q_smem, k_bufs, v_bufs, k_ready, k_empty, m_i, l_i, qk_scale, rows, N_CTX_K, WINDOW_LEFT,
                   WINDOW_RIGHT, diag, release, rel_bar, MASKED: gl.constexpr, BLOCK_N: gl.constexpr,
                   STAGES: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr, RELEASE: gl.constexpr):
    """``_first_step`` at ring step ``g``; while ``S_0`` is on the tensor cores, the previous
    tile's Q buffer is released (``_release_q``) when ``RELEASE`` and ``release``."""
    slot = g % STAGES
    mbarrier.wait(k_ready.index(slot), (g // STAGES) & 1)
    s = _issue_qk(q_smem, k_bufs, slot, s_layout)
    if RELEASE:
        if release:
            _release_q(rel_bar)
    s = warpgroup_mma_wait(0, deps=(s, ))
    mbarrier.arrive(k_empty.index(slot), count=1)
    if MASKED:
        s = _mask_scores(s, rows, col, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, BLOCK_N)
    p, alpha, m_i, l_i = online_softmax_step(s, m_i, l_i, qk_scale)
    p_next = _carry_p(p, v_bufs.dtype, p_layout)
    return p_next, m_i, l_i


@gluon.jit
def _consumer_pers(cid: gl.constexpr, desc_o, LSE, stride_lz, stride_lh, STORE_LSE,
                   q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                   sm_scale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   NUM_CONSUMERS: gl.constexpr, PEEL_FULL: gl.constexpr, OVERLAP: gl.constexpr,
                   Q_BUFS: gl.constexpr):
    """The persistent consumer: ``_consumer``'s tile body in a loop over the CTA's tiles.  Its O
    store of tile ``i`` drains while tile ``i + 1`` runs (with two Q buffer sets the buffer is
    released during tile ``i + 1``'s first QK product, with one right after the store)."""
    QB: gl.constexpr = q_bufs.shape[3]
    s_layout: gl.constexpr = _wgmma_layout(BLOCK_N, k_bufs.dtype)
    o_layout: gl.constexpr = _wgmma_layout(HEAD_DIM, v_bufs.dtype)
    p_layout: gl.constexpr = _p_operand_layout(o_layout, v_bufs.dtype)

    N_CTX_Q = _opaque_i32(N_CTX_Q)
    N_CTX_K = _opaque_i32(N_CTX_K)
    n_heads = _opaque_i32(desc_o.shape[1])  # O is [B, Hq, Sq, D] like Q
    diag = mask.diag_offset(N_CTX_Q, N_CTX_K, ALIGN_BOTTOM_RIGHT)
    qk_scale = _opaque_f32(sm_scale) * LOG2E
    n_m, pair, n_per = _pers_schedule(N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, BLOCK_M)
    kv0 = 0
    i = 0
    # Units u = pid, pid + G, ... while u < n_per * Hq * B, tested as "batch of u < B" against the
    # kernel parameter (no live bound: it would spill where registers are tight).
    u = _ctaid_x(n_per)
    off_z = (u // n_per) // n_heads
    while off_z < desc_o.shape[0]:
        m0, p, n_sub, off_h, off_z = _pers_unit(u, n_m, pair, n_per, n_heads)
        for s in range(n_sub):
            start_m = m0 + s * (p - m0)
            n_full, full_lo, start, n_lead, full_hi, n_blocks = _tile_walk(start_m, N_CTX_Q, N_CTX_K, WINDOW_LEFT,
                                                                           WINDOW_RIGHT, diag, BLOCK_M, BLOCK_N)
            qi = (i % Q_BUFS) * NUM_CONSUMERS + cid
            q_tile = q_bufs.index(qi)
            q_smem = q_tile.reshape([QB, HEAD_DIM])
            # Two buffer sets: release the previous tile's (its O store was issued last iteration).
            release = i > 0
            rel_bar = q_empty.index(((i + 1) % Q_BUFS) * NUM_CONSUMERS + cid)
            row0 = start_m * BLOCK_M + cid * QB
            rows = row0 + gl.arange(0, QB, layout=gl.SliceLayout(1, s_layout))

            m_i = gl.full([QB], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
            l_i = gl.full([QB], 0.0, gl.float32, gl.SliceLayout(1, s_layout))
            acc = gl.zeros([QB, HEAD_DIM], gl.float32, o_layout)
            mbarrier.wait(q_ready.index(qi), (i // Q_BUFS) & 1)

            if n_blocks > 0:
                if OVERLAP:
                    if PEEL_FULL:
                        if n_full > 0:
                            p_prev, m_i, l_i = _first_step_at(kv0, full_lo, q_smem, k_bufs, v_bufs, k_ready, k_empty,
                                                              m_i, l_i, qk_scale, rows, N_CTX_K, WINDOW_LEFT,
                                                              WINDOW_RIGHT, diag, release, rel_bar, False, BLOCK_N,
                                                              STAGES, s_layout, p_layout, Q_BUFS == 2)
                        else:
                            col = mask.block_walk_start(0, start, n_lead, full_hi, BLOCK_N)
                            p_prev, m_i, l_i = _first_step_at(kv0, col, q_smem, k_bufs, v_bufs, k_ready, k_empty,
                                                              m_i, l_i, qk_scale, rows, N_CTX_K, WINDOW_LEFT,
                                                              WINDOW_RIGHT, diag, release, rel_bar, True, BLOCK_N,
                                                              STAGES, s_layout, p_layout, Q_BUFS == 2)
                    else:
                        col = _key_block_col(0, n_full, full_lo, start, n_lead, full_hi, BLOCK_N)
                        p_prev, m_i, l_i = _first_step_at(kv0, col, q_smem, k_bufs, v_bufs, k_ready, k_empty, m_i,
                                                          l_i, qk_scale, rows, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
                                                          diag, release, rel_bar, True, BLOCK_N, STAGES, s_layout,
                                                          p_layout, Q_BUFS == 2)
                    for j in range(1, n_full):
                        acc, m_i, l_i, p_prev = _overlap_step(kv0 + j, 0, q_smem, k_bufs, v_bufs, k_ready, v_ready,
                                                              k_empty, v_empty, acc, m_i, l_i, p_prev, qk_scale, rows,
                                                              N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, False,
                                                              BLOCK_N, STAGES, s_layout, p_layout)
                    for j in range(gl.maximum(n_full, 1), n_blocks):
                        col = mask.block_walk_start(j - n_full, start, n_lead, full_hi, BLOCK_N)
                        acc, m_i, l_i, p_prev = _overlap_step(kv0 + j, col, q_smem, k_bufs, v_bufs, k_ready, v_ready,
                                                              k_empty, v_empty, acc, m_i, l_i, p_prev, qk_scale, rows,
                                                              N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, True,
                                                              BLOCK_N, STAGES, s_layout, p_layout)
                    last = kv0 + n_blocks - 1
                    last_slot = last % STAGES
                    mbarrier.wait(v_ready.index(last_slot), (last // STAGES) & 1)
                    p_op = _p_operand(p_prev, v_bufs.dtype, p_layout)
                    acc = warpgroup_mma(p_op, _v_operand(v_bufs, last_slot), acc, is_async=True)
                    acc = _wait_pv(acc, p_op)
                    mbarrier.arrive(v_empty.index(last_slot), count=1)
                else:
                    if Q_BUFS == 2:
                        if release:
                            _release_q(rel_bar)
                    for j in range(0, n_full):
                        acc, m_i, l_i = _serial_step(kv0 + j, 0, q_smem, k_bufs, v_bufs, k_ready, v_ready, k_empty,
                                                     v_empty, acc, m_i, l_i, qk_scale, rows, N_CTX_K, WINDOW_LEFT,
                                                     WINDOW_RIGHT, diag, False, BLOCK_N, STAGES, s_layout, p_layout)
                    for j in range(n_full, n_blocks):
                        col = mask.block_walk_start(j - n_full, start, n_lead, full_hi, BLOCK_N)
                        acc, m_i, l_i = _serial_step(kv0 + j, col, q_smem, k_bufs, v_bufs, k_ready, v_ready, k_empty,
                                                     v_empty, acc, m_i, l_i, qk_scale, rows, N_CTX_K, WINDOW_LEFT,
                                                     WINDOW_RIGHT, diag, True, BLOCK_N, STAGES, s_layout, p_layout)
            else:
                if Q_BUFS == 2:
                    if release:
                        _release_q(rel_bar)

            o, lse = softmax_epilogue(acc, m_i, l_i)
            q_smem.store(o.to(desc_o.dtype))
            fence_async_shared()
            gl.thread_barrier()  # every warp's O rows are in shared memory before the TMA store
            tma.async_copy_shared_to_global(desc_o, [off_z, off_h, row0, 0], q_tile)
            if STORE_LSE != 0:
                lse_ptrs = LSE + off_z.to(gl.int64) * stride_lz + off_h.to(gl.int64) * stride_lh + rows
                gl.store(lse_ptrs, lse, mask=rows < N_CTX_Q)
            # One buffer set: release it right away (the loader waits for it before the next Q).
            if Q_BUFS == 1:
                _release_q(q_empty.index(qi))
            kv0 += n_blocks
            i += 1
        u += _nctaid_x(u)
        off_z = (u // n_per) // n_heads
    tma.store_wait(0)


# ----------------------------------------------------------------------------
# One CTA per query tile (PERSISTENT=0): the body shared by the 16-bit and the fp8 kernels
# ----------------------------------------------------------------------------
@gluon.jit
def _tile_program(desc_q, desc_k, desc_v, desc_o, LSE, stride_lz, stride_lh, sm_scale, STORE_LSE, N_CTX_Q, N_CTX_K,
                  GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT,
                  IS_VARLEN, CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q, N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS,
                  DROPOUT_THRESHOLD, dropout_scale, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, PHILOX_SEED_OUT,
                  PHILOX_OFFSET_OUT, STORE_PHILOX,
                  DESCALE_Q, stride_dsqz, stride_dsqh, DESCALE_K, stride_dskz, stride_dskh, DESCALE_V, stride_dsvz, stride_dsvh,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  N_CONS: gl.constexpr, C_REGS: gl.constexpr, L_REGS: gl.constexpr, PEEL: gl.constexpr,
                  OVL: gl.constexpr, SCHEDULE: gl.constexpr, PINGPONG: gl.constexpr = 0, DROP: gl.constexpr = 0):
    """The query tile ``_tile_coords`` names: loader and consumers over warp_specialize.  The
    ``DESCALE_*`` pointers and their strides are read for fp8 inputs only (16-bit: None); the
    packing group (``IS_VARLEN`` .. ``STORE_VARLEN_STATUS``, ``kernels/flash/varlen.py``) with
    ragged descriptors only (``ragged.py``); the dropout group (``DROPOUT_THRESHOLD`` ..
    ``STORE_PHILOX``, the portable forward's) with ``DROP`` only.  ``PINGPONG``: the two consumers
    take turns on the tensor cores (``_take_turn``)."""
    gl.static_assert(PINGPONG == 0 or N_CONS == 2, "PINGPONG alternates two consumers")
    # -- program scheduling --------------------------------------------------------
    start_m, off_h, off_z = _tile_coords(SCHEDULE)
    off_hk = off_h // GQA_GROUP
    if DROP:
        if STORE_PHILOX != 0:
            # The (seed, offset) this call used, for its backward (one program writes it).
            if (gl.program_id(0) == 0) & (gl.program_id(1) == 0) & (gl.program_id(2) == 0):
                seed, offset = philox_state(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base)
                gl.store(PHILOX_SEED_OUT, seed)
                gl.store(PHILOX_OFFSET_OUT, offset)
    # Dropout's counters are laid out for the kernel's lengths (a packed batch's maximum ones).
    N_CTX_Q_MAX = N_CTX_Q
    N_CTX_K_MAX = N_CTX_K
    # A packed batch: the grid covers the longest sequence; this one's own lengths from here on.
    N_CTX_Q, N_CTX_K, q_end, k_end, empty = query_block_sequence(desc_q, off_z, start_m * BLOCK_M, N_CTX_Q, N_CTX_K,
                                                                 IS_VARLEN, CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q,
                                                                 N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS)
    if empty:
        return
    _tile_body(desc_q, desc_k, desc_v, desc_o, LSE, stride_lz, stride_lh, sm_scale, STORE_LSE, N_CTX_Q, N_CTX_K,
               WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, start_m, off_h, off_z, off_hk, q_end, k_end,
               DESCALE_Q, stride_dsqz, stride_dsqh, DESCALE_K, stride_dskz, stride_dskh, DESCALE_V, stride_dsvz,
               stride_dsvh, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale,
               N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, N_CONS, C_REGS, L_REGS, PEEL, OVL,
               PINGPONG, DROP)


@gluon.jit
def _tile_body(desc_q, desc_k, desc_v, desc_o, LSE, stride_lz, stride_lh, sm_scale, STORE_LSE, N_CTX_Q, N_CTX_K,
               WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, start_m, off_h, off_z, off_hk, q_end, k_end,
               DESCALE_Q, stride_dsqz, stride_dsqh, DESCALE_K, stride_dskz, stride_dskh, DESCALE_V, stride_dsvz,
               stride_dsvh, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale,
               N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               STAGES: gl.constexpr, N_CONS: gl.constexpr, C_REGS: gl.constexpr, L_REGS: gl.constexpr,
               PEEL: gl.constexpr, OVL: gl.constexpr, PINGPONG: gl.constexpr, DROP: gl.constexpr):
    """Query block ``start_m`` of head ``off_h`` of sequence ``off_z`` (lengths ``N_CTX_Q``/``N_CTX_K``;
    ``q_end``/``k_end`` where a packed sequence ends; ``N_CTX_Q_MAX``/``N_CTX_K_MAX`` the kernel's)."""

    # -- the CTA's key blocks: full ones, then the boundary walk (mask.py) ---------
    diag = mask.diag_offset(N_CTX_Q, N_CTX_K, ALIGN_BOTTOM_RIGHT)
    n_full, full_lo, start, n_lead, full_hi, n_blocks = _tile_walk(start_m, N_CTX_Q, N_CTX_K, WINDOW_LEFT,
                                                                   WINDOW_RIGHT, diag, BLOCK_M, BLOCK_N)
    if desc_q.dtype.is_fp8():
        # fp8 inputs carry per-(batch, KV head) dequantisation factors (FA3's q/k/v_descale):
        # Q's and K's fold into the score scale, V's into O.  They must be positive (see softmax.py).
        z = off_z.to(gl.int64)
        hk = off_hk.to(gl.int64)
        q_descale = gl.load(DESCALE_Q + z * stride_dsqz + hk * stride_dsqh)
        k_descale = gl.load(DESCALE_K + z * stride_dskz + hk * stride_dskh)
        v_descale = gl.load(DESCALE_V + z * stride_dsvz + hk * stride_dsvh)
        qk_scale = sm_scale * q_descale * k_descale * LOG2E
        # O leaves in 16 bits: it needs tiles of its own (the Q tiles hold 8-bit elements).
        o_bufs = gl.allocate_shared_memory(desc_o.dtype, [N_CONS] + desc_o.block_type.shape, desc_o.layout)
    else:
        qk_scale = sm_scale * LOG2E
        v_descale = 1.0

    # -- shared memory: Q (later O) per consumer, the K/V ring, barriers ----------
    q_bufs = gl.allocate_shared_memory(desc_q.dtype, [N_CONS] + desc_q.block_type.shape, desc_q.layout)
    if not desc_q.dtype.is_fp8():
        o_bufs = q_bufs
    k_bufs = gl.allocate_shared_memory(desc_k.dtype, [STAGES] + desc_k.block_type.shape, desc_k.layout)
    v_bufs = gl.allocate_shared_memory(desc_v.dtype, [STAGES] + desc_v.block_type.shape, desc_v.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [N_CONS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(N_CONS):
        mbarrier.init(q_bars.index(c), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=N_CONS)  # released by every consumer
        mbarrier.init(v_empty.index(i), count=N_CONS)

    # The argument tuples are written inline: in 3.6.0 a tuple bound to a name first turns
    # its constexpr members into tensors. Each consumer's first argument is its id, a literal,
    # so it stays a constexpr (it picks the Q buffer and barriers statically).
    if N_CONS == 1:
        gl.warp_specialize([
            (_consumer, (0, desc_o, LSE, stride_lz, stride_lh, STORE_LSE, q_bufs, o_bufs, k_bufs, v_bufs, q_bars, k_ready,
                          v_ready, k_empty, v_empty, off_z, off_h, start_m, n_full, full_lo, start, n_lead, full_hi,
                          n_blocks, qk_scale, v_descale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, q_end,
                          PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale,
                          N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, PEEL, OVL, PINGPONG, DROP)),
            (_loader, (desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_bars, k_ready, v_ready, k_empty, v_empty,
                       off_z, off_h, off_hk, start_m * BLOCK_M, q_end, N_CTX_Q, k_end, N_CTX_K, n_full, full_lo,
                       start, n_lead, full_hi, n_blocks, BLOCK_N, STAGES, N_CONS)),
        ], [1], [L_REGS])
    elif N_CONS == 2:
        gl.warp_specialize([
            (_consumer, (0, desc_o, LSE, stride_lz, stride_lh, STORE_LSE, q_bufs, o_bufs, k_bufs, v_bufs, q_bars, k_ready,
                          v_ready, k_empty, v_empty, off_z, off_h, start_m, n_full, full_lo, start, n_lead, full_hi,
                          n_blocks, qk_scale, v_descale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, q_end,
                          PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale,
                          N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, PEEL, OVL, PINGPONG, DROP)),
            (_consumer, (1, desc_o, LSE, stride_lz, stride_lh, STORE_LSE, q_bufs, o_bufs, k_bufs, v_bufs, q_bars, k_ready,
                          v_ready, k_empty, v_empty, off_z, off_h, start_m, n_full, full_lo, start, n_lead, full_hi,
                          n_blocks, qk_scale, v_descale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, q_end,
                          PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale,
                          N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, PEEL, OVL, PINGPONG, DROP)),
            (_loader, (desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_bars, k_ready, v_ready, k_empty, v_empty,
                       off_z, off_h, off_hk, start_m * BLOCK_M, q_end, N_CTX_Q, k_end, N_CTX_K, n_full, full_lo,
                       start, n_lead, full_hi, n_blocks, BLOCK_N, STAGES, N_CONS)),
        ], [4, 1], [C_REGS, L_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (0, desc_o, LSE, stride_lz, stride_lh, STORE_LSE, q_bufs, o_bufs, k_bufs, v_bufs, q_bars, k_ready,
                          v_ready, k_empty, v_empty, off_z, off_h, start_m, n_full, full_lo, start, n_lead, full_hi,
                          n_blocks, qk_scale, v_descale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, q_end,
                          PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale,
                          N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, PEEL, OVL, PINGPONG, DROP)),
            (_consumer, (1, desc_o, LSE, stride_lz, stride_lh, STORE_LSE, q_bufs, o_bufs, k_bufs, v_bufs, q_bars, k_ready,
                          v_ready, k_empty, v_empty, off_z, off_h, start_m, n_full, full_lo, start, n_lead, full_hi,
                          n_blocks, qk_scale, v_descale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, q_end,
                          PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale,
                          N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, PEEL, OVL, PINGPONG, DROP)),
            (_consumer, (2, desc_o, LSE, stride_lz, stride_lh, STORE_LSE, q_bufs, o_bufs, k_bufs, v_bufs, q_bars, k_ready,
                          v_ready, k_empty, v_empty, off_z, off_h, start_m, n_full, full_lo, start, n_lead, full_hi,
                          n_blocks, qk_scale, v_descale, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag, q_end,
                          PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale,
                          N_CTX_Q_MAX, N_CTX_K_MAX, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, PEEL, OVL, PINGPONG, DROP)),
            (_loader, (desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_bars, k_ready, v_ready, k_empty, v_empty,
                       off_z, off_h, off_hk, start_m * BLOCK_M, q_end, N_CTX_Q, k_end, N_CTX_K, n_full, full_lo,
                       start, n_lead, full_hi, n_blocks, BLOCK_N, STAGES, N_CONS)),
        ], [4, 4, 1], [C_REGS, C_REGS, L_REGS])


# ----------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------
@gluon.jit
def attn_fwd_gluon(desc_q, desc_k, desc_v, desc_o, LSE, stride_lz, stride_lh, sm_scale, STORE_LSE,
                   N_CTX_Q, N_CTX_K, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT,
                   IS_VARLEN, CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q, N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS,
                   DROPOUT_THRESHOLD, dropout_scale, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, PHILOX_SEED_OUT,
                   PHILOX_OFFSET_OUT, STORE_PHILOX,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   DROPOUT: gl.constexpr = 0, NUM_CONSUMERS: gl.constexpr = 2, CONSUMER_REGS: gl.constexpr = 240,
                   LOADER_REGS: gl.constexpr = 24, PEEL_FULL: gl.constexpr = 0, OVERLAP: gl.constexpr = 1,
                   SCHED: gl.constexpr = 0, PERSISTENT: gl.constexpr = 0, Q_BUFS: gl.constexpr = 2):
    # Options left out of an AOT compile arrive as None: the defaults above (= the original kernel).
    N_CONS: gl.constexpr = _opt(NUM_CONSUMERS, 2)
    C_REGS: gl.constexpr = _opt(CONSUMER_REGS, 240)
    L_REGS: gl.constexpr = _opt(LOADER_REGS, 24)
    PEEL: gl.constexpr = _opt(PEEL_FULL, 0)
    OVL: gl.constexpr = _opt(OVERLAP, 1)
    SCHEDULE: gl.constexpr = _opt(SCHED, 0)
    PERS: gl.constexpr = _opt(PERSISTENT, 0)
    QBUFS: gl.constexpr = _opt(Q_BUFS, 2)
    DROP: gl.constexpr = _opt(DROPOUT, 0)
    gl.static_assert(N_CONS >= 1 and N_CONS <= 3, "one to three consumer warpgroups")
    gl.static_assert(BLOCK_M == 64 * N_CONS, "BLOCK_M = 64 query rows per consumer warpgroup")
    # Blocks [1, 1, rows, HEAD_DIM] over [B, H, S, D], or ragged ones [1, 1, 1, rows, HEAD_DIM] (ragged.py).
    gl.static_assert(desc_q.block_type.shape[-2] == 64, "Q/O descriptor block: [.., 64, HEAD_DIM]")
    gl.static_assert(desc_q.block_type.shape[-1] == HEAD_DIM, "Q/O descriptor block: [.., 64, HEAD_DIM]")
    gl.static_assert(desc_k.block_type.shape[-2] == BLOCK_N, "K/V descriptor block: [.., BLOCK_N, HEAD_DIM]")
    gl.static_assert(desc_k.block_type.shape[-1] == HEAD_DIM, "K/V descriptor block: [.., BLOCK_N, HEAD_DIM]")

    if PERS:
        gl.static_assert(not is_ragged(desc_q.block_type.shape), "packed (varlen) batches: one CTA per tile")
        gl.static_assert(not DROP, "dropout: one CTA per tile")
        gl.static_assert(QBUFS == 1 or QBUFS == 2, "one or two Q buffer sets")
        # -- persistent: grid (G, 1, 1), G = num_programs(0); B and Hq from Q's/O's descriptor shape.
        # The partitions derive everything from kernel parameters themselves (no computed captures).
        q_bufs = gl.allocate_shared_memory(desc_q.dtype, [QBUFS * N_CONS] + desc_q.block_type.shape, desc_q.layout)
        k_bufs = gl.allocate_shared_memory(desc_k.dtype, [STAGES] + desc_k.block_type.shape, desc_k.layout)
        v_bufs = gl.allocate_shared_memory(desc_v.dtype, [STAGES] + desc_v.block_type.shape, desc_v.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [QBUFS * N_CONS, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [QBUFS * N_CONS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(QBUFS * N_CONS):
            mbarrier.init(q_ready.index(c), count=1)
            mbarrier.init(q_empty.index(c), count=1)  # one consumer per Q tile
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=N_CONS)
            mbarrier.init(v_empty.index(i), count=N_CONS)
        if N_CONS == 1:
            gl.warp_specialize([
                (_consumer_pers, (0, desc_o, LSE, stride_lz, stride_lh, STORE_LSE, q_bufs, k_bufs, v_bufs, q_ready, q_empty,
                               k_ready, v_ready, k_empty, v_empty, sm_scale, N_CTX_Q, N_CTX_K,
                               WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, N_CONS, PEEL, OVL,
                               QBUFS)),
                (_loader_pers, (desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready,
                                k_empty, v_empty, N_CTX_Q, N_CTX_K, GQA_GROUP, WINDOW_LEFT,
                                WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, BLOCK_M, BLOCK_N, STAGES, N_CONS, QBUFS)),
            ], [1], [L_REGS])
        elif N_CONS == 2:
            gl.warp_specialize([
                (_consumer_pers, (0, desc_o, LSE, stride_lz, stride_lh, STORE_LSE, q_bufs, k_bufs, v_bufs, q_ready, q_empty,
                               k_ready, v_ready, k_empty, v_empty, sm_scale, N_CTX_Q, N_CTX_K,
                               WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, N_CONS, PEEL, OVL,
                               QBUFS)),
                (_consumer_pers, (1, desc_o, LSE, stride_lz, stride_lh, STORE_LSE, q_bufs, k_bufs, v_bufs, q_ready, q_empty,
                               k_ready, v_ready, k_empty, v_empty, sm_scale, N_CTX_Q, N_CTX_K,
                               WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, N_CONS, PEEL, OVL,
                               QBUFS)),
                (_loader_pers, (desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready,
                                k_empty, v_empty, N_CTX_Q, N_CTX_K, GQA_GROUP, WINDOW_LEFT,
                                WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, BLOCK_M, BLOCK_N, STAGES, N_CONS, QBUFS)),
            ], [4, 1], [C_REGS, L_REGS])
        else:
            gl.warp_specialize([
                (_consumer_pers, (0, desc_o, LSE, stride_lz, stride_lh, STORE_LSE, q_bufs, k_bufs, v_bufs, q_ready, q_empty,
                               k_ready, v_ready, k_empty, v_empty, sm_scale, N_CTX_Q, N_CTX_K,
                               WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, N_CONS, PEEL, OVL,
                               QBUFS)),
                (_consumer_pers, (1, desc_o, LSE, stride_lz, stride_lh, STORE_LSE, q_bufs, k_bufs, v_bufs, q_ready, q_empty,
                               k_ready, v_ready, k_empty, v_empty, sm_scale, N_CTX_Q, N_CTX_K,
                               WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, N_CONS, PEEL, OVL,
                               QBUFS)),
                (_consumer_pers, (2, desc_o, LSE, stride_lz, stride_lh, STORE_LSE, q_bufs, k_bufs, v_bufs, q_ready, q_empty,
                               k_ready, v_ready, k_empty, v_empty, sm_scale, N_CTX_Q, N_CTX_K,
                               WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, N_CONS, PEEL, OVL,
                               QBUFS)),
                (_loader_pers, (desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready,
                                k_empty, v_empty, N_CTX_Q, N_CTX_K, GQA_GROUP, WINDOW_LEFT,
                                WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, BLOCK_M, BLOCK_N, STAGES, N_CONS, QBUFS)),
            ], [4, 4, 1], [C_REGS, C_REGS, L_REGS])
    else:
        _tile_program(desc_q, desc_k, desc_v, desc_o, LSE, stride_lz, stride_lh, sm_scale, STORE_LSE, N_CTX_Q, N_CTX_K,
                      GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, IS_VARLEN, CU_SEQLENS_Q,
                      CU_SEQLENS_K, N_TOKENS_Q, N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS,
                      DROPOUT_THRESHOLD, dropout_scale, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base,
                      PHILOX_SEED_OUT, PHILOX_OFFSET_OUT, STORE_PHILOX,
                      None, 0, 0, None, 0, 0, None, 0, 0,
                      HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, N_CONS, C_REGS, L_REGS, PEEL, OVL, SCHEDULE, 0, DROP)
