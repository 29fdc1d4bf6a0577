"""Dropout on Gluon register tiles: the keep mask of a ``[rows, cols]`` MMA tile with the portable
kernels' counters (``kernels/flash/dropout.py``: one Philox call per unit, the eight elements of two
quads in adjacent columns), drawn where the tile lives.

In a wgmma accumulator layout every thread holds whole units (rows ``r, r + 8``, columns ``c, c + 1,
c + 8, c + 9`` of each 16 x 16 block, ``c`` even), so with the queries as rows (the forward) the unit
view (``dropout.unit_view``: a reshape that splits out the 8-offsets and the column parity, a split
that keeps one element per unit) and the way back (``dropout.tile_of_units``) are register
renamings: no data moves between threads, and each Philox call is made once, by the thread that
uses it (checked on the compiled kernels: no shuffle, no shared memory).  With the keys as rows (the
backward's ``S^T``, ``KEYS_AS_ROWS``) a thread holds half of two units and the lane four apart the
other halves: each of the two draws one unit and they swap the four bits the other needs (one
``shfl.sync`` per 16 x 16 block, ``_swapped_unit_quads``), so the backward also makes one call per
eight elements (sm_90 bf16 hd128: ``IMAD.HI`` 316 -> 164, spill instructions 140 -> 153, no shared
memory added).  With ``SIGNS_FROM_WORDS`` they swap the 16-bit halves instead (two shuffles per block,
``_swapped_unit_signs``) and the backward applies them as sign bits (``dropout_sign_tile``).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..flash.dropout import (dropout_head_offset, dropout_rows_offset, dropout_unit_keep, dropout_unit_words,
                             philox_state, quad_index, quad_view, tile_of_quads, tile_of_units, unit_view)

#: How the Gluon kernels run Philox's ten rounds (``dropout.philox4x32``): 0 unrolled (Triton's
#: ``randint4x``), 1 as a loop everywhere; the forward also loops at ``fwd.DROPOUT_ROUNDS_LOOP_HEAD_DIM``
#: (``drop_probs``' mode 3).  The loop cuts the hd128 dropout forward from 14,320 to 11,824 SASS
#: instructions (ptxas, bf16; the backward 4,840 -> 4,784, spill bytes 160 -> 120), the same bits by
#: construction (python/tests/test_philox.py holds both to the Random123 model).  Timed on H100s
#: (2026-12-06, test/gluon/check_fwd_dropout.py --bench [--rounds-loop 0|1], p 0.1, /cuDNN, same
#: process per pair): the hd128 forward (S2k-8k, full and causal) gained 6-11 % in a first pair
#: (0.831/0.485/0.901/0.700/0.936/0.877 -> 0.885/0.534/0.971/0.779/1.034/0.942); two alternating
#: pairs on another machine gave -4..+5 % and +1..+5 % (run-to-run spread about 5 %); hd64 and hd256
#: looked 1-3 % slower (within that spread).  So only the hd128 forward loops; the backward loops up
#: to ``BWD_ROUNDS_LOOP_MAX_HEAD_DIM``.  (The forward's walk, one loop or two, is ``fwd.DROPOUT_ONE_LOOP``.)
ROUNDS_LOOP: gl.constexpr = gl.constexpr(0)

#: The head dims up to which the backward (``sign_dropped``) runs Philox's rounds as a loop
#: (``ROUNDS_LOOP`` above them; 0: nowhere).  check_bwd_dropout.py --bench on an H100 (p 0.1, bf16,
#: three alternating pairs in one process, medians, /cuDNN): hd128 S2k-8k full 0.868/0.847/0.856 -> 0.940/0.914/0.917,
#: causal 0.802/0.810/0.848 -> 0.871/0.903/0.875; hd64 0.810/0.865 -> 0.858/0.909; hd256 (dK/dV
#: kernel) full 334 -> 323 TFLOP/s, causal 296 -> 300 (so not there).  ptxas still unrolls most of the
#: loop, but schedules it with fewer live registers: sm_90 bf16 with dQ, the step loop's code hd128
#: 1,269 -> 1,150 SASS instructions and the kernel's spill instructions 170 -> 98; hd64 1,096 -> 1,022.
#: (Each round's two products as one ``mul.wide.u32`` instead, unrolled or looped, cut the hd128 loop
#: to 1,173 but spilled more and timed 3-5 % slower than without: H100, 2026-12-07.)
#: test/gluon/check_bwd_dropout.py --rounds-loop patches it.
BWD_ROUNDS_LOOP_MAX_HEAD_DIM: gl.constexpr = gl.constexpr(128)

#: The head dims up to which the backward leaves the seed's round keys and the tile's unit indices to
#: the compiler (``dropout_keep_tile``'s ``REFRESH`` off: hoisted out of the step loop and kept live),
#: above which every step recomputes them.  ptxas, sm_90 bf16 with dQ: hd64's step loop 994 -> 950
#: SASS instructions, no spill in it (4 spill instructions in the epilogue); at hd128 the kernel's
#: spill instructions 110 -> 228.  H100, bf16 hd64 S4096 p 0.1, two alternating pairs, /cuDNN:
#: full 0.873 / 0.893 hoisted vs 0.870 / 0.864, causal 0.936 / 0.947 vs 0.918 / 0.927 (2026-12-07).
#: test/gluon/check_bwd_dropout.py --hoist-max-hd patches it.
BWD_HOIST_MAX_HEAD_DIM: gl.constexpr = gl.constexpr(64)

#: How the backward turns its keys-as-rows draws into ``P^T``'s signs (``sign_dropped``): 1 on the
#: Philox words (each lane packs the 16-bit halves its partner needs with one ``prmt`` per word pair,
#: two shuffles per block, then ``half - threshold``'s sign bit is XORed into ``P^T``: no predicate
#: and no bool tile); 0 through ``dropout_keep_tile``'s bool tile (compares, four bits packed and
#: shuffled, selects; ptxas packed the bools into a register bit by bit).  The same bits either way
#: (test/gluon/check_bwd_dropout.py [--signs-from-words 0|1] holds both to the portable rule).
#: ptxas, sm_90 bf16 hd128 with dQ: an interior step 1,307 -> 1,119 SASS instructions (21 -> 26 spill
#: instructions; the kernel 5,512 -> 5,232, 130 -> 170); hd64 4,552 -> 4,152, hd256 (dK/dV) 4,232 ->
#: 3,944 (47 -> 43 spill).  check_bwd_dropout.py --bench on an H100 (p 0.1, bf16, cuDNN beside it, two
#: runs against one): /cuDNN geomean 0.801 -> 0.881 / 0.865, hd128 rows +6-10 %, hd64 +18 %, hd256 +5 %.
SIGNS_FROM_WORDS: gl.constexpr = gl.constexpr(1)


@gluon.jit
def _per_call(seed, dep):
    """``(seed, 0)`` through non-pure ``mov``s (``dep``: any i32, an operand for the asm): what is
    derived from them is computed at every call instead of being hoisted out of the caller's loop
    and kept live (``REFRESH``)."""
    seed = gl.inline_asm_elementwise("mov.b64 $0, $1;", "=l,l", [seed], dtype=gl.int64, is_pure=False, pack=1)
    zero = gl.inline_asm_elementwise("mov.b32 $0, 0;", "=r,r", [dep], dtype=gl.int32, is_pure=False, pack=1)
    return seed, zero


@gluon.jit
def dropout_keep_tile(seed, base, N_CTX_K, DROPOUT_THRESHOLD, layout: gl.constexpr, ROWS: gl.constexpr,
                      COLS: gl.constexpr, KEYS_AS_ROWS: gl.constexpr, REFRESH: gl.constexpr = True,
                      ROUNDS: gl.constexpr = -1):
    """Bool ``[ROWS, COLS]`` in ``layout`` (an MMA accumulator layout): the tile's keep bits.

    ``base``: the counter of the tile's first unit, ``dropout_rows_offset(head, q0, N_CTX_K) + k0 // 4``
    for queries from ``q0`` and keys from ``k0`` (multiples of 16); ``N_CTX_K`` the key length the
    counters are laid out for (the maximum of a packed batch).  Queries are the rows, or with
    ``KEYS_AS_ROWS`` the columns.  ``REFRESH``: the seed's round keys and the tile's quad indices are
    recomputed at every call; left to the compiler they are hoisted out of the caller's loop and
    stay live (ptxas, sm_90 bf16: the hd128 backward's spill instructions 192/168 -> 74/66, the
    hd256 forward's 11/19 -> 0; but the hd64 forward's, at 104 registers, 2/2 -> 41/40).  ``ROUNDS``:
    Philox's rounds unrolled (0) or as a loop (1); -1: ``ROUNDS_LOOP``."""
    gl.static_assert(ROWS % 16 == 0 and COLS % 16 == 0, "dropout tiles are whole 16 x 16 blocks")
    LOOP: gl.constexpr = ROUNDS_LOOP if ROUNDS < 0 else ROUNDS
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    if REFRESH:
        seed, zero = _per_call(seed, N_CTX_K)
        rows += zero
        cols += zero
    zero = gl.zeros([ROWS, COLS], gl.int32, layout)
    if KEYS_AS_ROWS:
        k0, k1, k2, k3 = _swapped_unit_quads(seed, base, rows, cols, zero, N_CTX_K, DROPOUT_THRESHOLD, LOOP)
        # Word 2y + x: y the query's 8-offset (here the column's), x the key's (the row's).
        keep = tile_of_quads(k0, k2, k1, k3)
    else:
        quad_r = unit_view(gl.expand_dims(quad_index(rows), 1) + zero)
        unit_c = unit_view(gl.expand_dims(quad_index(cols) // 2, 0) + zero)
        keep = tile_of_units(*dropout_unit_keep(seed, base, quad_r, unit_c, N_CTX_K, DROPOUT_THRESHOLD, LOOP))
    return gl.convert_layout(keep, layout)


@gluon.jit
def _shfl_xor4(x):
    """``x`` (i32) of lane ``lane ^ 4``: in a wgmma accumulator the thread of the next (or previous)
    row of the same columns."""
    return gl.inline_asm_elementwise("shfl.sync.bfly.b32 $0, $1, 4, 31, -1;", "=r,r", [x], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _drawn_unit(rows, cols, zero):
    """The unit this lane draws in each 16 x 16 block of a keys-as-rows tile (``rows``: the keys,
    ``cols``: the queries, ``zero``: an i32 zero tile), as ``[R/16, 8, C/16, 4]`` tensors: ``(query quad,
    key unit, odd)``.  The lane holds key quad ``r`` and query quads ``2c``, ``2c + 1``; it draws query
    quad ``2c + odd`` of key unit ``r // 2``, ``odd = r mod 2`` being also the half of each word it keeps."""
    quad_r = quad_view(gl.expand_dims(quad_index(rows), 1) + zero)  # [R/16, 8, C/16, 8]: key quads
    quad_c = quad_view(gl.expand_dims(quad_index(cols), 0) + zero)  # query quads
    R16: gl.constexpr = quad_r.shape[0]
    C16: gl.constexpr = quad_r.shape[2]
    key_quad, _ = gl.split(gl.reshape(quad_r, [R16, 8, C16, 4, 2]))  # the even query column's (f = 0)
    query_even, _ = gl.split(gl.reshape(quad_c, [R16, 8, C16, 4, 2]))
    odd = key_quad & 1
    return query_even + odd, key_quad >> 1, odd


@gluon.jit
def _swapped_unit_quads(seed, base, rows, cols, zero, N_CTX_K, DROPOUT_THRESHOLD, ROUNDS: gl.constexpr):
    """A keys-as-rows tile's four quad tensors (``dropout.quad_view`` order, ``dropout_quad_keep``'s
    words) from one Philox call per thread per 16 x 16 block.

    A thread holds key rows ``r, r + 8`` and query columns ``2c, 2c + 1`` (+ 8): the quads of key quad
    ``r`` and query quads ``2c`` and ``2c + 1``, which lie in two units (units pair key quads ``r`` and
    ``r ^ 1``).  Its partner, lane ``lane ^ 4``, holds key quad ``r ^ 1`` of the same two units.  So
    each draws one of them (query quad ``2c + r mod 2``), keeps the four bits of its own key quad and
    hands the partner the other four (one shuffle of a packed word)."""
    query_quad, key_unit, odd = _drawn_unit(rows, cols, zero)
    R16: gl.constexpr = odd.shape[0]
    C16: gl.constexpr = odd.shape[2]
    k0l, k0h, k1l, k1h, k2l, k2h, k3l, k3h = dropout_unit_keep(seed, base, query_quad, key_unit, N_CTX_K,
                                                               DROPOUT_THRESHOLD, ROUNDS)
    mine0 = gl.where(odd != 0, k0h, k0l)
    mine1 = gl.where(odd != 0, k1h, k1l)
    mine2 = gl.where(odd != 0, k2h, k2l)
    mine3 = gl.where(odd != 0, k3h, k3l)
    theirs = (gl.where(odd != 0, k0l, k0h).to(gl.int32) | (gl.where(odd != 0, k1l, k1h).to(gl.int32) << 1)
              | (gl.where(odd != 0, k2l, k2h).to(gl.int32) << 2) | (gl.where(odd != 0, k3l, k3h).to(gl.int32) << 3))
    got = _shfl_xor4(theirs)  # the partner's draw: the bits of this thread's other query quad
    other0 = (got & 1) != 0
    other1 = (got & 2) != 0
    other2 = (got & 4) != 0
    other3 = (got & 8) != 0
    # Query quad 2c is this thread's own draw on even key quads, the partner's on odd ones.
    q0 = gl.reshape(gl.join(gl.where(odd != 0, other0, mine0), gl.where(odd != 0, mine0, other0)), [R16, 8, C16, 8])
    q1 = gl.reshape(gl.join(gl.where(odd != 0, other1, mine1), gl.where(odd != 0, mine1, other1)), [R16, 8, C16, 8])
    q2 = gl.reshape(gl.join(gl.where(odd != 0, other2, mine2), gl.where(odd != 0, mine2, other2)), [R16, 8, C16, 8])
    q3 = gl.reshape(gl.join(gl.where(odd != 0, other3, mine3), gl.where(odd != 0, mine3, other3)), [R16, 8, C16, 8])
    return q0, q1, q2, q3


@gluon.jit
def _prmt(a, b, sel):
    """``prmt.b32``: the bytes of ``(b, a)`` that the nibbles of ``sel`` pick (0x5410: the low halves of
    ``a`` and ``b``, 0x7632: their high halves), one instruction."""
    return gl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, sel], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _swapped_unit_signs(seed, base, rows, cols, zero, N_CTX_K, DROPOUT_THRESHOLD, ROUNDS: gl.constexpr):
    """``_swapped_unit_quads`` on the Philox words: the four quad tensors of ``half - DROPOUT_THRESHOLD``
    (i32, negative where the element is dropped) of a keys-as-rows tile.

    Each lane draws one unit (as ``_swapped_unit_quads``), keeps the 16-bit halves of its own key quad
    (low for an even one) and hands the other halves to lane ``lane ^ 4`` packed two per word (one
    ``prmt`` per word pair, two shuffles per 16 x 16 block): its query quads ``2c`` and ``2c + 1`` then
    take its own halves and the partner's (which first depends on the key quad's parity, one select
    per word pair)."""
    query_quad, key_unit, odd = _drawn_unit(rows, cols, zero)
    R16: gl.constexpr = odd.shape[0]
    C16: gl.constexpr = odd.shape[2]
    r0, r1, r2, r3 = dropout_unit_words(seed, base, query_quad, key_unit, N_CTX_K, ROUNDS)
    r0 = r0.to(gl.int32, bitcast=True)
    r1 = r1.to(gl.int32, bitcast=True)
    r2 = r2.to(gl.int32, bitcast=True)
    r3 = r3.to(gl.int32, bitcast=True)
    sel_mine = gl.where(odd != 0, 0x7632, 0x5410)
    sel_theirs = gl.where(odd != 0, 0x5410, 0x7632)
    got01 = _shfl_xor4(_prmt(r0, r1, sel_theirs))  # the partner's draw: this lane's other query quad
    got23 = _shfl_xor4(_prmt(r2, r3, sel_theirs))
    mine01 = _prmt(r0, r1, sel_mine)
    mine23 = _prmt(r2, r3, sel_mine)
    # Query quad 2c is this lane's own draw on even key quads, the partner's on odd ones.
    even01 = gl.where(odd != 0, got01, mine01)
    even23 = gl.where(odd != 0, got23, mine23)
    odd01 = gl.where(odd != 0, mine01, got01)
    odd23 = gl.where(odd != 0, mine23, got23)
    t = DROPOUT_THRESHOLD.to(gl.int32)
    q0 = gl.reshape(gl.join((even01 & 0xFFFF) - t, (odd01 & 0xFFFF) - t), [R16, 8, C16, 8])
    q1 = gl.reshape(gl.join(((even01 >> 16) & 0xFFFF) - t, ((odd01 >> 16) & 0xFFFF) - t), [R16, 8, C16, 8])
    q2 = gl.reshape(gl.join((even23 & 0xFFFF) - t, (odd23 & 0xFFFF) - t), [R16, 8, C16, 8])
    q3 = gl.reshape(gl.join(((even23 >> 16) & 0xFFFF) - t, ((odd23 >> 16) & 0xFFFF) - t), [R16, 8, C16, 8])
    return q0, q1, q2, q3


@gluon.jit
def dropout_sign_tile(seed, base, N_CTX_K, DROPOUT_THRESHOLD, layout: gl.constexpr, ROWS: gl.constexpr,
                      COLS: gl.constexpr, ROUNDS: gl.constexpr, REFRESH: gl.constexpr):
    """I32 ``[ROWS, COLS]`` in ``layout`` (an MMA accumulator layout) of a keys-as-rows tile: the sign bit
    (``0x80000000``) where the element is dropped, 0 where it is kept (``dropout_keep_tile``'s
    arguments; ``ROUNDS`` 0 or 1)."""
    gl.static_assert(ROWS % 16 == 0 and COLS % 16 == 0, "dropout tiles are whole 16 x 16 blocks")
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    if REFRESH:
        seed, zero = _per_call(seed, N_CTX_K)
        rows += zero
        cols += zero
    zero = gl.zeros([ROWS, COLS], gl.int32, layout)
    d0, d1, d2, d3 = _swapped_unit_signs(seed, base, rows, cols, zero, N_CTX_K, DROPOUT_THRESHOLD, ROUNDS)
    # Word 2y + x: y the query's 8-offset (here the column's), x the key's (the row's).
    d = tile_of_quads(d0, d2, d1, d3)
    return gl.convert_layout(d & -0x80000000, layout)


# ----------------------------------------------------------------------------
# The forward's score tiles (queries as rows)
# ----------------------------------------------------------------------------
@gluon.jit
def dropout_state_fwd(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, off_z, off_h, row0,
                      N_CTX_Q_MAX, N_CTX_K_MAX):
    """``(seed, rows counter, N_CTX_K_MAX, threshold)`` of a forward consumer's rows from ``row0`` of
    head ``(off_z, off_h)`` (grid y: the query heads): what ``drop_probs`` reads.  The counters are laid
    out for the kernel's (maximum) lengths, rows local to the sequence, as the portable kernels do."""
    seed, offset = philox_state(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base)
    head = dropout_head_offset(offset, off_z, off_h, gl.num_programs(1), N_CTX_Q_MAX, N_CTX_K_MAX)
    return seed, dropout_rows_offset(head, row0, N_CTX_K_MAX), N_CTX_K_MAX, DROPOUT_THRESHOLD


@gluon.jit
def drop_probs(p, col, drop, DROPOUT: gl.constexpr):
    """``p`` (``[rows, keys]``) with the dropped probabilities of the key block from ``col`` zeroed
    (``DROPOUT``: 0 off, 1 on, 2 on with ``dropout_keep_tile``'s ``REFRESH``, 3 as 2 with Philox's
    rounds as a loop whatever ``ROUNDS_LOOP`` says; ``drop``:
    ``dropout_state_fwd``).  The row sum ``l`` keeps them: the output is ``dropout(P) V / l``, scaled
    by ``1 / (1 - p)`` in the epilogue."""
    if DROPOUT:
        seed, rows_counter, n_ctx_k_max, threshold = drop
        layout: gl.constexpr = p.type.layout
        ROWS: gl.constexpr = p.shape[0]
        COLS: gl.constexpr = p.shape[1]
        keep = dropout_keep_tile(seed, rows_counter + col // 4, n_ctx_k_max, threshold, layout, ROWS, COLS, False,
                                 DROPOUT >= 2, 1 if DROPOUT == 3 else -1)
        p = gl.where(keep, p, 0.0)
    return p


# ----------------------------------------------------------------------------
# The backward's tiles (keys as rows): the mask rides in the sign of P^T
# ----------------------------------------------------------------------------
@gluon.jit
def dropout_state_bwd(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base, DROPOUT_THRESHOLD, dropout_scale, b, h_first,
                      N_HEADS_Q, N_CTX_Q_MAX, N_CTX_K_MAX):
    """What ``sign_dropped`` needs for every step of a backward CTA (a tuple)."""
    seed, offset = philox_state(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base)
    keep_prob = 1.0 / dropout_scale
    return (seed, offset, b, h_first, N_HEADS_Q, N_CTX_Q_MAX, N_CTX_K_MAX, DROPOUT_THRESHOLD, dropout_scale,
            keep_prob)


@gluon.jit
def dpt_init(s0, delta, drop, DROPOUT: gl.constexpr):
    """The ``dP^T`` accumulator's start (``s0``: a zero tile, ``delta`` per query, the tile's columns):
    ``-delta``, so that no delta vector is live where ``dS^T`` is formed; with dropout ``-delta (1 - p)``
    (``drop``: ``dropout_state_bwd``), so that ``dropout_ds`` takes one multiply per kept element where
    ``(acc + delta) / (1 - p) - delta`` took an add and an FMA (sm_90 bf16 hd128 step loop 1,150 -> 1,120
    SASS instructions; check_bwd_dropout.py --bench on an H100, three alternating pairs: /cuDNN
    geomean 0.942-0.952 -> 0.950-0.959)."""
    d = gl.expand_dims(delta, 0)
    if DROPOUT:
        _seed, _offset, _b, _h_first, _n_heads_q, _n_q, _n_k, _threshold, _scale, keep_prob = drop
        d = d * keep_prob
    return s0 - d


@gluon.jit
def sign_dropped(pt, drop, h_off, q0, k0, HEAD_DIM: gl.constexpr):
    """``P^T`` (``[keys, queries]``, an MMA accumulator, probabilities >= 0) with its dropped elements
    negated: the keep mask of query head ``h_first + h_off`` (``drop``: ``dropout_state_bwd``), queries
    from ``q0`` and keys from ``k0`` (multiples of 16), carried in the sign bit so that no mask
    register stays live between the dV product and dS^T (``dropped_probs``, ``dropout_ds``).  ``HEAD_DIM``
    picks how Philox's rounds run (``BWD_ROUNDS_LOOP_MAX_HEAD_DIM``)."""
    ROUNDS: gl.constexpr = 1 if HEAD_DIM <= BWD_ROUNDS_LOOP_MAX_HEAD_DIM else ROUNDS_LOOP
    REFRESH: gl.constexpr = HEAD_DIM > BWD_HOIST_MAX_HEAD_DIM
    seed, offset, b, h_first, n_heads_q, n_ctx_q_max, n_ctx_k_max, threshold, _scale, _keep_prob = drop
    head = dropout_head_offset(offset, b, h_first + h_off, n_heads_q, n_ctx_q_max, n_ctx_k_max)
    base = dropout_rows_offset(head, q0, n_ctx_k_max) + k0 // 4
    layout: gl.constexpr = pt.type.layout
    ROWS: gl.constexpr = pt.shape[0]
    COLS: gl.constexpr = pt.shape[1]
    if SIGNS_FROM_WORDS:
        sign = dropout_sign_tile(seed, base, n_ctx_k_max, threshold, layout, ROWS, COLS, ROUNDS, REFRESH)
        return (pt.to(gl.int32, bitcast=True) ^ sign).to(gl.float32, bitcast=True)
    keep = dropout_keep_tile(seed, base, n_ctx_k_max, threshold, layout, ROWS, COLS, REFRESH, ROUNDS)
    return gl.where(keep, pt, -pt)


@gluon.jit
def dropped_probs(pt_signed, dtype: gl.constexpr):
    """``P^T`` times the keep mask in ``dtype`` (fp16 or bf16: the dV product's operand; ``dropout_scale``
    applied to dV once): the negative (dropped) elements to zero in the conversion itself
    (``cvt.rn.relu``, two elements per instruction; the same bits as rounding ``max(pt, 0)`` for every
    ``pt`` but NaN, which stays NaN as in the backward without dropout; one ``FMNMX`` per element
    fewer)."""
    gl.static_assert(dtype.primitive_bitwidth == 16, "a 16-bit MMA operand (fp16 or bf16)")
    # cvt's first source goes to the high half: the second element of each pair ($2).
    if dtype.is_bf16():
        return gl.inline_asm_elementwise("cvt.rn.relu.bf16x2.f32 $0, $2, $1;", "=r,f,f", [pt_signed],
                                         dtype=gl.bfloat16, is_pure=True, pack=2)
    else:
        return gl.inline_asm_elementwise("cvt.rn.relu.f16x2.f32 $0, $2, $1;", "=r,f,f", [pt_signed],
                                         dtype=gl.float16, is_pure=True, pack=2)


@gluon.jit
def dropout_ds(pt_signed, dpt_acc, delta, drop):
    """``dS^T = P^T (Z dP^T / (1 - p) - delta)``, ``Z`` the keep mask in ``pt_signed``'s sign, from the
    ``dP^T - delta (1 - p)`` accumulator (``dpt_init``): kept elements take ``acc / (1 - p)``, dropped
    ones ``-delta`` (``pt_signed = -P^T``: ``+delta``).  A dropped zero (-0.0) counts as kept: its
    product is 0 either way.  ``delta``: per query (the tile's columns); ``drop``: ``dropout_state_bwd``
    (its ``dropout_scale``)."""
    _seed, _offset, _b, _h_first, _n_heads_q, _n_ctx_q_max, _n_ctx_k_max, _threshold, dropout_scale, _kp = drop
    d = gl.expand_dims(delta, 0)
    dp_term = gl.where(pt_signed >= 0.0, dpt_acc * dropout_scale, d)
    return pt_signed * dp_term
