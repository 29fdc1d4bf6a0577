"""Dropout: the Philox4x32-10 random stream shared by every kernel (and ``debug_dropout_mask``).

Random-number layout.  The score matrix of one (batch, query head) is cut into 16 x 16 blocks,
and each block into 64 *quads*: quad ``(r, c)`` (``r, c < 8``) of block ``(a, b)`` is the four
elements ``(16a + 8y + r, 16b + 8x + c)``, ``y, x in {0, 1}``.  Elements 8 rows and 8 columns apart
form a quad because that is what one thread of an NVIDIA MMA accumulator holds (rows ``r, r + 8``
and columns ``c, c + 8`` of every 16 x 16 block, wgmma and mma.sync alike), and the thread holds
the quads of columns ``c`` and ``c + 1`` (``c`` even) together.  So the two quads of such a column
pair -- a *unit*, eight elements -- share one Philox call: word ``2y + x`` for both, its low 16 bits
for column ``c`` and its high 16 bits for column ``c + 1``.  A kernel whose tiles have the queries as
rows (forward, dQ, ``debug_dropout_mask``) draws each call once, in the thread that uses it, with no
data movement.  Tiles with the keys as rows hold a unit's two quads in two threads: the portable
dK/dV draws the call per quad (``dropout_quad_keep``: what a call per quad costs), the Gluon
backward has the two lanes draw one unit each and swap the halves (``flash_gluon/dropout.py``).

* key ``(k0, k1) = (lo32(seed), hi32(seed))`` with ``seed = *PHILOX_SEED`` (i64);
* element ``(b, h, i, j)`` (``h`` the *query* head, ``i``/``j`` row/column local to the sequence)
  uses the counter ``(lo32(n), hi32(n), 0, 0)`` with::

      quad(i) = 8 * floor(i / 16) + i mod 8,      unit(j) = floor(quad(j) / 2),
      QUADS_Q = 8 * ceil(N_CTX_Q / 16),           UNITS_K = 4 * ceil(N_CTX_K / 16),
      n = *PHILOX_OFFSET + philox_offset_base
          + ((b * Hq + h) * QUADS_Q + quad(i)) * UNITS_K + unit(j)

  and bits ``[16e, 16e + 16)``, ``e = j mod 2``, of the output word
  ``2 * (floor(i / 8) mod 2) + floor(j / 8) mod 2`` (``philox4x32(seed, n)``, Triton's ``tl.randint4x``,
  returns the four words in that order);
* the element is kept iff those 16 bits ``>= DROPOUT_THRESHOLD`` (the runtime passes
  ``floor(p * 2**16)``), and kept values are scaled by ``dropout_scale = 1 / (1 - p)``.

One call of the forward or backward consumes ``B * Hq * QUADS_Q * UNITS_K`` counters (the maximum
lengths for varlen batches); a caller that runs several dropout calls with one seed advances
``*PHILOX_OFFSET`` (or ``philox_offset_base``) by that count between them.  Forward, dK/dV, dQ,
dBias and ``debug_dropout_mask`` all call ``dropout_keep``, the Gluon kernels ``dropout_unit_keep``
on their register tiles (``unit_view``, ``quad_view`` and their inverses; ``flash_gluon/dropout.py``),
so the streams cannot drift apart.
"""
import triton
import triton.language as tl


@triton.jit
def philox4x32(seed, counter, ROUNDS_LOOP: tl.constexpr = 0):
    """``tl.randint4x(seed, counter)``: Philox4x32-10 of the counter ``(lo32(counter), hi32(counter), 0,
    0)`` under the key ``(lo32(seed), hi32(seed))``.  ``ROUNDS_LOOP`` 0: Triton's, the ten rounds
    unrolled; 1: the same words from a loop over the rounds, which LLVM keeps rolled (ptxas still
    unrolls it about five rounds at a time: a PTX ``nounroll`` pragma from inline asm lands after
    the loop header's copies, where ptxas ignores it).  A kernel draws a tile's units in every step
    instance of its walk (peeled, full and masked steps, per consumer warpgroup), so the rounds
    multiply its code: the Gluon hd128 dropout forward is 14,320 SASS instructions unrolled, 11,824
    with the loop, against 7,544 without dropout (``kernels/flash_gluon/dropout.py``'s
    ``ROUNDS_LOOP``)."""
    if ROUNDS_LOOP == 0:
        r0, r1, r2, r3 = tl.randint4x(seed, counter)
    else:
        seed = seed.to(tl.uint64)
        k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
        k1 = (seed >> 32).to(tl.uint32)
        r0 = counter.to(tl.uint32)
        r1 = (counter >> 32).to(tl.uint32)
        r2 = r0 * 0
        r3 = r2
        for _ in tl.range(0, 10, loop_unroll_factor=1):
            _r0, _r2 = r0, r2
            r0 = tl.math.umulhi(0xCD9E8D57, _r2) ^ r1 ^ k0
            r2 = tl.math.umulhi(0xD2511F53, _r0) ^ r3 ^ k1
            r1 = tl.mul(_r2, 0xCD9E8D57, sanitize_overflow=False)
            r3 = tl.mul(_r0, 0xD2511F53, sanitize_overflow=False)
            k0 = tl.add(k0, 0x9E3779B9, sanitize_overflow=False)
            k1 = tl.add(k1, 0xBB67AE85, sanitize_overflow=False)
    return r0, r1, r2, r3


@triton.jit
def philox_state(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base):
    """``(seed, offset)`` (int64): ``*PHILOX_SEED`` and ``*PHILOX_OFFSET + philox_offset_base``."""
    seed = tl.load(PHILOX_SEED)
    offset = tl.load(PHILOX_OFFSET) + philox_offset_base
    return seed, offset


@triton.jit
def dropout_quads(n_ctx):
    """Quad rows of a sequence of ``n_ctx`` queries: ``8 * ceil(n_ctx / 16)``."""
    return (n_ctx + 15) // 16 * 8


@triton.jit
def dropout_units(n_ctx):
    """Unit columns of a sequence of ``n_ctx`` keys: ``4 * ceil(n_ctx / 16)``."""
    return (n_ctx + 15) // 16 * 4


@triton.jit
def dropout_head_offset(offset, b, h, N_HEADS_Q, N_CTX_Q, N_CTX_K):
    """Counter of unit ``(0, 0)`` of head ``(b, h)`` (int64)."""
    bh = tl.cast(b, tl.int64) * N_HEADS_Q + h
    return offset + bh * dropout_quads(N_CTX_Q) * dropout_units(N_CTX_K)


@triton.jit
def dropout_rows_offset(head_offset, row0, N_CTX_K):
    """Counter of unit ``(row0 / 2, 0)``: the first of the rows from ``row0`` (a multiple of 16) on;
    keys from ``k0`` (a multiple of 16) start ``k0 / 4`` units further.
    ``dropout_keep(seed, dropout_rows_offset(h, row0, ..), 0, ..)`` is ``dropout_keep(seed, h, row0, ..)``."""
    return head_offset + (row0 // 2).to(tl.int64) * dropout_units(N_CTX_K)


@triton.jit
def _half_keep(word, shift, threshold):
    """Bits ``[shift, shift + 16)`` of ``word`` (u32) ``>= threshold``."""
    return ((word >> shift) & 0xFFFF) >= threshold


@triton.jit
def dropout_unit_words(seed, head_offset, quad_rows, unit_cols, N_CTX_K, ROUNDS_LOOP: tl.constexpr = 0):
    """The four Philox words of the units ``(quad_rows, unit_cols)`` (broadcast against each other), one
    call each: word ``2y + x`` holds the element ``8y`` rows and ``8x`` columns from the unit's first,
    its even column in the low 16 bits and its odd column in the high 16 bits."""
    # Both factors are >= 0 and below 2^31: zero-extended, the product is one 32 x 32 -> 64-bit multiply.
    rows = quad_rows.to(tl.uint32).to(tl.uint64) * dropout_units(N_CTX_K).to(tl.uint32).to(tl.uint64)
    counter = head_offset + rows.to(tl.int64) + unit_cols
    return philox4x32(seed, counter, ROUNDS_LOOP)


@triton.jit
def dropout_unit_keep(seed, head_offset, quad_rows, unit_cols, N_CTX_K, DROPOUT_THRESHOLD,
                      ROUNDS_LOOP: tl.constexpr = 0):
    """The eight keep bits of the units ``(quad_rows, unit_cols)`` (broadcast against each other), one
    Philox call each: ``(k0l, k0h, k1l, k1h, k2l, k2h, k3l, k3h)``, ``k{2y + x}{l|h}`` for the element
    ``8y`` rows and ``8x`` columns from the unit's first, in its even (l) or odd (h) column."""
    r0, r1, r2, r3 = dropout_unit_words(seed, head_offset, quad_rows, unit_cols, N_CTX_K, ROUNDS_LOOP)
    t = DROPOUT_THRESHOLD.to(tl.uint32)
    return (_half_keep(r0, 0, t), _half_keep(r0, 16, t), _half_keep(r1, 0, t), _half_keep(r1, 16, t),
            _half_keep(r2, 0, t), _half_keep(r2, 16, t), _half_keep(r3, 0, t), _half_keep(r3, 16, t))


@triton.jit
def dropout_quad_keep(seed, head_offset, quad_rows, quad_cols, N_CTX_K, DROPOUT_THRESHOLD):
    """The four keep bits of the quads ``(quad_rows, quad_cols)`` (broadcast against each other), one
    Philox call per quad (its unit's, half of it used: for tiles that hold a unit's two quads in two
    threads): ``(k0, k1, k2, k3)``, ``k_{2y + x}`` for the element ``8y`` rows and ``8x`` columns from
    the quad's first."""
    counter = head_offset + quad_rows.to(tl.int64) * dropout_units(N_CTX_K) + quad_cols // 2
    r0, r1, r2, r3 = philox4x32(seed, counter)
    t = DROPOUT_THRESHOLD.to(tl.uint32)
    shift = ((quad_cols % 2) * 16).to(tl.uint32)
    return _half_keep(r0, shift, t), _half_keep(r1, shift, t), _half_keep(r2, shift, t), _half_keep(r3, shift, t)


@triton.jit
def dropout_keep(seed, head_offset, row0, col0, N_CTX_K, DROPOUT_THRESHOLD,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KEYS_AS_ROWS: tl.constexpr = False):
    """Bool ``[BLOCK_M, BLOCK_N]``: element ``(row0 + r, col0 + c)`` kept (rows and columns local to
    the sequence, ``row0`` and ``col0`` multiples of 16); with ``KEYS_AS_ROWS`` the transposed tile
    ``[BLOCK_N, BLOCK_M]``, keys ``col0 + ..`` as its rows, drawn per quad (``dropout_quad_keep``: a
    unit's two quads are in two threads there).  ``head_offset`` from ``dropout_head_offset``."""
    tl.static_assert(BLOCK_M % 16 == 0 and BLOCK_N % 16 == 0, "dropout tiles are whole 16 x 16 blocks")
    # A 16-aligned run of rows holds the quad rows row0 / 2 + [0, BLOCK_M / 2), in order; of
    # columns, the quad columns col0 / 2 + [0, BLOCK_N / 2) and the units col0 / 4 + [0, BLOCK_N / 4).
    quad_rows = row0 // 2 + tl.arange(0, BLOCK_M // 2)
    if KEYS_AS_ROWS:
        quad_cols = col0 // 2 + tl.arange(0, BLOCK_N // 2)
        k0, k1, k2, k3 = dropout_quad_keep(seed, head_offset, quad_rows[:, None], quad_cols[None, :], N_CTX_K,
                                           DROPOUT_THRESHOLD)
        # [M/2, N/2, x, y] -> [a, r, b, c, x, y] (row 16a + 8y + r, column 16b + 8x + c).
        keep = tl.join(tl.join(k0, k1), tl.join(k2, k3))
        keep = tl.reshape(keep, [BLOCK_M // 16, 8, BLOCK_N // 16, 8, 2, 2])
        return tl.reshape(tl.permute(keep, (2, 4, 3, 0, 5, 1)), [BLOCK_N, BLOCK_M])
    else:
        # [a, r, 1, 1] and [1, 1, b, c]: the unit grid as tile_of_units reads it.
        quad_rows = tl.reshape(quad_rows, [BLOCK_M // 16, 8, 1, 1])
        unit_cols = tl.reshape(col0 // 4 + tl.arange(0, BLOCK_N // 4), [1, 1, BLOCK_N // 16, 4])
        return tile_of_units(*dropout_unit_keep(seed, head_offset, quad_rows, unit_cols, N_CTX_K, DROPOUT_THRESHOLD))


@triton.jit
def quad_view(x):
    """``[R, C]`` -> ``[R/16, 8, C/16, 8]``: each quad's first element (0 rows and 0 columns in), from
    ``[a, y, r, b, x, c]`` (row ``16a + 8y + r``, column ``16b + 8x + c``).  Shape operations only:
    in an MMA accumulator layout, where a thread holds whole quads, a register renaming."""
    R: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1]
    x = tl.permute(tl.reshape(x, [R // 16, 2, 8, C // 16, 2, 8]), (0, 2, 3, 5, 1, 4))  # [a, r, b, c, y, x]
    first_y, _ = tl.split(x)  # x = 0
    first, _ = tl.split(first_y)  # y = 0
    return first


@triton.jit
def tile_of_quads(k00, k01, k10, k11):
    """The inverse of ``quad_view`` for four ``[R/16, 8, C/16, 8]`` tensors, ``kyx`` the element ``8y``
    rows and ``8x`` columns from each quad's first: the ``[R, C]`` tile."""
    t = tl.join(tl.join(k00, k01), tl.join(k10, k11))  # [a, r, b, c, x, y]
    R16: tl.constexpr = t.shape[0]
    C16: tl.constexpr = t.shape[2]
    return tl.reshape(tl.permute(t, (0, 5, 1, 2, 4, 3)), [R16 * 16, C16 * 16])  # [a, y, r, b, x, c]


@triton.jit
def unit_view(x):
    """``[R, C]`` -> ``[R/16, 8, C/16, 4]``: each unit's first element (0 rows and 0 columns in, even
    column), from ``[a, y, r, b, x, c, e]`` (row ``16a + 8y + r``, column ``16b + 8x + 2c + e``).
    Shape operations only: in an MMA accumulator layout, where a thread holds whole units, a
    register renaming."""
    R: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1]
    x = tl.permute(tl.reshape(x, [R // 16, 2, 8, C // 16, 2, 4, 2]), (0, 2, 3, 5, 1, 4, 6))  # [a, r, b, c, y, x, e]
    first_ye, _ = tl.split(x)  # e = 0
    first_y, _ = tl.split(first_ye)  # x = 0
    first, _ = tl.split(first_y)  # y = 0
    return first


@triton.jit
def tile_of_units(k0l, k0h, k1l, k1h, k2l, k2h, k3l, k3h):
    """The inverse of ``unit_view`` for eight ``[R/16, 8, C/16, 4]`` tensors in ``dropout_unit_keep``'s
    order (``k{2y + x}{l|h}``: ``8y`` rows and ``8x`` columns from each unit's first, even or odd
    column): the ``[R, C]`` tile."""
    t = tl.join(tl.join(tl.join(k0l, k0h), tl.join(k1l, k1h)),
                tl.join(tl.join(k2l, k2h), tl.join(k3l, k3h)))  # [a, r, b, c, e, x, y]
    R16: tl.constexpr = t.shape[0]
    C16: tl.constexpr = t.shape[2]
    return tl.reshape(tl.permute(t, (0, 6, 1, 2, 5, 3, 4)), [R16 * 16, C16 * 16])  # [a, y, r, b, x, c, e]


@triton.jit
def quad_index(i):
    """The quad row (column) of local row (column) ``i >= 0`` of a 16-aligned tile: ``8 * (i // 16) + i % 8``
    (in shifts and masks: the compiler cannot see that ``i`` is not negative)."""
    return ((i >> 4) << 3) | (i & 7)
