"""Dropout: the Philox4x32-10 random stream shared by every kernel (and ``debug_dropout_mask``).

Random-number layout (one call of the forward or backward consumes
``B * Hq * N_CTX_Q * ceil(N_CTX_K / 4)`` Philox counters, with the maximum
lengths for varlen batches):

* key  ``(k0, k1) = (lo32(seed), hi32(seed))`` with ``seed = *PHILOX_SEED`` (i64);
* element ``(b, h, i, j)`` (``h`` the *query* head, ``i``/``j`` row/column local to
  the sequence) uses the counter ``(lo32(n), hi32(n), 0, 0)`` with::

      n = *PHILOX_OFFSET + philox_offset_base
          + ((b * Hq + h) * N_CTX_Q + i) * ceil(N_CTX_K / 4) + floor(j / 4)

  and the output word ``j mod 4`` (``tl.randint4x(seed, n)`` is exactly this);
* the element is kept iff ``word >= DROPOUT_THRESHOLD`` (u32 compare; the runtime
  passes ``floor(p * 2**32)``), and kept values are scaled by
  ``dropout_scale = 1 / (1 - p)``.

A caller that runs several dropout calls with one seed advances ``*PHILOX_OFFSET``
(or ``philox_offset_base``) by that count between them.  The kernels generate
one ``randint4x`` per 4 columns (a ``[rows, BLOCK_N / 4]`` block) and spread the four
words over the tile with ``tl.join`` + ``tl.reshape``; forward, dK/dV, dQ, dBias and
``debug_dropout_mask`` all call ``dropout_keep`` so the streams cannot drift apart.
"""
import triton
import triton.language as tl


@triton.jit
def philox_state(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base):
    """``(seed, offset)`` (int64): ``*PHILOX_SEED`` and ``*PHILOX_OFFSET + philox_offset_base``."""
    seed = tl.load(PHILOX_SEED)
    offset = tl.load(PHILOX_OFFSET) + philox_offset_base
    return seed, offset


@triton.jit
def dropout_head_offset(offset, b, h, N_HEADS_Q, N_CTX_Q, N_CTX_K):
    """Counter of element ``(b, h, 0, 0)`` (int64)."""
    words_per_row = (N_CTX_K + 3) // 4
    bh = tl.cast(b, tl.int64) * N_HEADS_Q + h
    return offset + bh * N_CTX_Q * words_per_row


@triton.jit
def dropout_keep(seed, head_offset, rows, start_n, N_CTX_K, DROPOUT_THRESHOLD,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Bool ``[BLOCK_M, BLOCK_N]``: element ``(rows[r], start_n + c)`` kept (``start_n`` a multiple of 4).

    ``rows`` (``[BLOCK_M]``) and the columns are local to the sequence;
    ``head_offset`` from ``dropout_head_offset``.
    """
    words_per_row = (N_CTX_K + 3) // 4
    groups = start_n // 4 + tl.arange(0, BLOCK_N // 4)
    counter = head_offset + rows.to(tl.int64)[:, None] * words_per_row + groups[None, :]
    r0, r1, r2, r3 = tl.randint4x(seed, counter)
    # [M, N/4, 2, 2] with [.., y, x] = r_{2y + x}; row-major reshape puts word w at column 4c + w.
    words = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), [BLOCK_M, BLOCK_N])
    return words >= DROPOUT_THRESHOLD.to(tl.uint32)
