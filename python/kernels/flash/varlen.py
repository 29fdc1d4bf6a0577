"""Variable-length (packed) batches: where sequence ``b`` lives.

With ``IS_VARLEN`` 1 the runtime packs the sequences of a batch along the token
dimension: sequence ``b`` has rows ``[CU_SEQLENS_Q[b], CU_SEQLENS_Q[b+1])`` of the
packed Q/O/dO/dQ and rows ``[CU_SEQLENS_K[b], CU_SEQLENS_K[b+1])`` of K/V/dK/dV,
passed as 4-D views with batch stride 0; ``N_CTX_Q``/``N_CTX_K`` are then the
*maximum* lengths (the grid covers them) and programs past a sequence's length
exit early.  ``N_TOKENS_Q``/``N_TOKENS_K`` are the packed tensors' token counts,
which bound every offset (``sequence``).  LSE/DELTA of a packed batch: element ``(h, token)`` at
``h * stride_lh + token`` (``stride_lz`` = 0).  Every per-sequence quantity
(masks, bias, dropout) uses the local row/column index inside the sequence.
Rows are addressed as ``(start + local row) * row_stride`` with the start
offset in int64 (``start * stride`` is added to the base pointer).

With ``IS_VARLEN`` 0 every sequence starts at row 0 and has length ``N_CTX``.
"""
import triton
import triton.language as tl

#: Bits of ``*VARLEN_STATUS`` (the Rust API's ``flash::VARLEN_*`` constants carry the same values).
VARLEN_OFFSET_OUT_OF_RANGE: tl.constexpr = tl.constexpr(1)
VARLEN_DECREASING: tl.constexpr = tl.constexpr(2)
VARLEN_TOO_LONG: tl.constexpr = tl.constexpr(4)


@triton.jit
def sequence(b, N_CTX, IS_VARLEN, CU_SEQLENS, N_TOKENS, VARLEN_STATUS, STORE_VARLEN_STATUS):
    """``(start, length)`` (int32) of sequence ``b``: ``(CU[b], CU[b+1] - CU[b])``, or ``(0, N_CTX)``.

    The offsets come from the caller's device memory, checked on the host only when the caller
    gave host copies, so they are clamped here to ``0 <= start <= end <= N_TOKENS`` (the packed
    tensor's token count) and ``length <= N_CTX``: whatever the offsets hold, every row a kernel
    reads or writes lies inside the tensors (and inside the grid, which covers ``N_CTX``).  A
    clamp that changed something ORs its reason into ``*VARLEN_STATUS`` when
    ``STORE_VARLEN_STATUS`` is 1: ``VARLEN_OFFSET_OUT_OF_RANGE`` (an offset outside
    ``[0, N_TOKENS]``), ``VARLEN_DECREASING`` (``CU[b+1] < CU[b]``: the sequence is empty),
    ``VARLEN_TOO_LONG`` (longer than ``N_CTX``: only its first ``N_CTX`` rows are computed).
    """
    if IS_VARLEN != 0:
        first = tl.load(CU_SEQLENS + b)
        last = tl.load(CU_SEQLENS + b + 1)
        start = tl.minimum(tl.maximum(first, 0), N_TOKENS)
        end = tl.maximum(tl.minimum(tl.maximum(last, 0), N_TOKENS), start)
        length = tl.minimum(end - start, N_CTX)
        if STORE_VARLEN_STATUS != 0:
            # int64: last - first of two arbitrary int32 values does not fit int32.
            span = last.to(tl.int64) - first.to(tl.int64)
            out_of_range = (first < 0) | (first > N_TOKENS) | (last < 0) | (last > N_TOKENS)
            status = (out_of_range.to(tl.int32) * VARLEN_OFFSET_OUT_OF_RANGE
                      | (span < 0).to(tl.int32) * VARLEN_DECREASING
                      | (span > N_CTX).to(tl.int32) * VARLEN_TOO_LONG)
            if status != 0:
                tl.atomic_or(VARLEN_STATUS, status)
    else:
        start = N_CTX * 0
        length = N_CTX + 0
    return start, length
