"""Packed (varlen) batches through TMA: ragged descriptors.

A packed tensor holds the rows of every sequence of a batch back to back (``[H, tokens, D]`` for
Q/K/V/O: head stride, row stride, contiguous head dim).  A plain TMA descriptor over it would
read the next sequence's rows past a sequence's end and write into them.  A *ragged* descriptor
makes the hardware's bounds check end at the sequence instead: it is rank 5 with two leading
dimensions that only move the address,

    sizes   [RAGGED_SPAN, RAGGED_SPAN, H, RAGGED_ROWS, D]
    strides [2**34 - rs,  rs,          hs, rs,         1]        (elements; rs = row stride)

and row ``r`` of the sequence ``[start, start + len)`` of head ``h`` is addressed as
``[RAGGED_ROWS, start + len, h, RAGGED_ROWS - len + r, 0]``:

* address: ``RAGGED_ROWS·(2**34 - rs) + (start + len)·rs + (RAGGED_ROWS - len + r)·rs`` elements
  = ``2**64 + (start + r)·rs`` elements; in bytes the ``2**64·elem`` term vanishes (addresses wrap
  modulo ``2**64``), so the row read is ``start + r``;
* bounds: the fourth coordinate is in range exactly while ``r < len``, so TMA zero-fills loaded
  rows past the sequence and drops stored ones, as it does at the end of a fixed-length tensor.

The runtime builds these descriptors (``rust/aotriton/src/tma.rs``, ``TensorArg::ragged``); a
kernel knows it was compiled for them by the rank of its descriptor blocks
(``[1, 1, 1, rows, HEAD_DIM]``).  It needs ``tokens <= RAGGED_ROWS`` and ``start + len`` below
``RAGGED_SPAN`` (the runtime checks the token counts; ``kernels/flash/varlen.py``'s ``sequence``
clamps the offsets to them).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..flash.varlen import sequence

#: Size of the ragged row dimension (2**30): the most tokens a packed tensor may hold.
RAGGED_ROWS: gl.constexpr = gl.constexpr(2**30)


@gluon.constexpr_function
def is_ragged(block_shape):
    """Whether a descriptor with this block shape is ragged (rank 5) rather than ``[B, H, S, D]``."""
    return len(block_shape) == 5


@gluon.constexpr_function
def row_dim(shape):
    """The row dimension of a tile of this shape (a TMA box, or a buffer ring of them): the one
    before the last (``[.., rows, HEAD_DIM]``), whatever the descriptor's rank."""
    return len(shape) - 2


@gluon.constexpr_function
def col_dim(shape):
    """The column (head-dim) dimension of a tile of this shape: the last."""
    return len(shape) - 1


@gluon.jit
def row_coords(desc, z, h, row, col, seq_end, seq_len):
    """TMA coordinates of element ``(row, col)`` of head ``h`` of sequence ``z``.

    ``seq_end``/``seq_len`` (the sequence's end offset in the packed tensor and its length) are
    read by ragged descriptors only; a ``[B, H, S, D]`` descriptor takes ``[z, h, row, col]``."""
    if is_ragged(desc.block_type.shape):
        return [RAGGED_ROWS, seq_end, h, RAGGED_ROWS - seq_len + row, col]
    else:
        return [z, h, row, col]


@gluon.jit
def row_offset(desc, seq_end, seq_len):
    """Index of the sequence's first row among the packed rows (0 for a ``[B, H, S, D]`` descriptor):
    where its per-row statistics (LSE) start."""
    if is_ragged(desc.block_type.shape):
        return seq_end - seq_len
    else:
        return 0


@gluon.jit
def sequence_bounds(desc, b, N_CTX_Q, N_CTX_K, IS_VARLEN, CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q, N_TOKENS_K,
                    VARLEN_STATUS, STORE_VARLEN_STATUS):
    """``(N_CTX_Q, N_CTX_K, q_end, k_end)`` of sequence ``b``: with ragged descriptors (``desc`` any of
    the kernel's Q/K/V/O ones) its own lengths and where its query and key rows end among the
    packed rows (``kernels/flash/varlen.py``'s ``sequence``: offsets clamped, clamps reported);
    otherwise the lengths unchanged (``q_end``/``k_end`` then unread by ``row_coords``)."""
    if is_ragged(desc.block_type.shape):
        q_start, seqlen_q = sequence(b, N_CTX_Q, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS,
                                     STORE_VARLEN_STATUS)
        k_start, seqlen_k = sequence(b, N_CTX_K, IS_VARLEN, CU_SEQLENS_K, N_TOKENS_K, VARLEN_STATUS,
                                     STORE_VARLEN_STATUS)
        return seqlen_q, seqlen_k, q_start + seqlen_q, k_start + seqlen_k
    else:
        return N_CTX_Q, N_CTX_K, b, b


@gluon.jit
def query_block_sequence(desc_q, b, row0, N_CTX_Q, N_CTX_K, IS_VARLEN, CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q,
                         N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS):
    """``sequence_bounds`` for a CTA of query rows from ``row0``, and whether it holds none of
    the sequence's rows (a shorter sequence of a packed batch, whose grid covers the longest: the
    CTA then returns at once)."""
    N_CTX_Q, N_CTX_K, q_end, k_end = sequence_bounds(desc_q, b, N_CTX_Q, N_CTX_K, IS_VARLEN, CU_SEQLENS_Q,
                                                     CU_SEQLENS_K, N_TOKENS_Q, N_TOKENS_K, VARLEN_STATUS,
                                                     STORE_VARLEN_STATUS)
    empty = False
    if is_ragged(desc_q.block_type.shape):
        empty = row0 >= N_CTX_Q
    return N_CTX_Q, N_CTX_K, q_end, k_end, empty
