"""Variable-length (packed) batches: where sequence ``b`` lives.

With ``IS_VARLEN`` 1 the runtime packs the sequences of a batch along the token
dimension: sequence ``b`` has rows ``[CU_SEQLENS_Q[b], CU_SEQLENS_Q[b+1])`` of the
packed Q/O/dO/dQ and rows ``[CU_SEQLENS_K[b], CU_SEQLENS_K[b+1])`` of K/V/dK/dV,
passed as 4-D views with batch stride 0; ``N_CTX_Q``/``N_CTX_K`` are then the
*maximum* lengths (the grid covers them) and programs past a sequence's length
exit early.  LSE/DELTA of a packed batch: element ``(h, token)`` at
``h * stride_lh + token`` (``stride_lz`` = 0).  Every per-sequence quantity
(masks, bias, dropout) uses the local row/column index inside the sequence.
Rows are addressed as ``(start + local row) * row_stride`` with the start
offset in int64 (``start * stride`` is added to the base pointer).

With ``IS_VARLEN`` 0 every sequence starts at row 0 and has length ``N_CTX``.
"""
import triton
import triton.language as tl


@triton.jit
def sequence(b, N_CTX, IS_VARLEN, CU_SEQLENS):
    """``(start, length)`` (int32) of sequence ``b``: ``(CU[b], CU[b+1] - CU[b])``, or ``(0, N_CTX)``."""
    if IS_VARLEN != 0:
        start = tl.load(CU_SEQLENS + b)
        length = tl.load(CU_SEQLENS + b + 1) - start
    else:
        start = N_CTX * 0
        length = N_CTX + 0
    return start, length
