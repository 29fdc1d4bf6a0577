"""Debug entry: ``debug_dropout_mask`` writes the dropout keep mask of the attention kernels.

``OUT[b, h, i, j] = 1.0`` where element ``(b, h, i, j)`` is kept, ``0.0`` where it is
dropped (fp32 ``[B, N_HEADS, N_CTX_Q, N_CTX_K]``, element strides
``(stride_oz, stride_oh, stride_om, 1)``), from exactly the forward's random
stream: the same ``dropout.dropout_keep`` helper with ``Hq = N_HEADS`` (layout:
``dropout.py``).

Arguments, in order: ``OUT, stride_oz, stride_oh, stride_om, N_CTX_Q, N_CTX_K,
N_HEADS, DROPOUT_THRESHOLD, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base``;
constexprs ``BLOCK_M, BLOCK_N``.  Grid: ``(cdiv(N_CTX_Q, BLOCK_M), N_HEADS, B)``.
"""
import triton
import triton.language as tl

from .dropout import dropout_head_offset, dropout_keep, philox_state


@triton.jit
def debug_dropout_mask(OUT, stride_oz, stride_oh, stride_om, N_CTX_Q, N_CTX_K, N_HEADS,
                       DROPOUT_THRESHOLD, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    off_h = tl.program_id(1)
    off_z = tl.program_id(2)
    seed, offset = philox_state(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base)
    head = dropout_head_offset(offset, off_z, off_h, N_HEADS, N_CTX_Q, N_CTX_K)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_base = OUT + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
    for start_n in range(0, N_CTX_K, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        keep = dropout_keep(seed, head, start_m * BLOCK_M, start_n, N_CTX_K, DROPOUT_THRESHOLD, BLOCK_M, BLOCK_N)
        tl.store(out_base + rows[:, None] * stride_om + cols[None, :], keep.to(tl.float32),
                 mask=(rows[:, None] < N_CTX_Q) & (cols[None, :] < N_CTX_K))
