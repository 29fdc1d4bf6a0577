"""Tile loads and stores shared by the FlashAttention kernels.

A tile is ``rows x HEAD_DIM`` of a ``[.., N_ROWS, D_HEAD]`` tensor whose
last dimension is contiguous.  ``HEAD_DIM`` is the power-of-two bucket the
kernel is compiled for, ``D_HEAD`` the real head dimension (runtime, a
multiple of 8, ``<= HEAD_DIM``): every access is masked with ``d < D_HEAD``
(loads fill 0), so the padding columns cost no accuracy.  In the ``aligned``
variant ``D_HEAD`` carries ``tt.divisibility=8``, which keeps the head-dim
mask constant over 8 elements, so 16-byte vector accesses survive the mask.

``ROW_MASK`` adds the sequence-tail mask ``row < N_ROWS``; loops over blocks
that lie inside the sequence pass ``False`` and carry only the head-dim mask.
"""
import triton
import triton.language as tl


@triton.jit
def load_tile(base, rows, stride_row, offs_d, D_HEAD, N_ROWS, ROW_MASK: tl.constexpr):
    """``[len(rows), HEAD_DIM]`` tile: ``base[rows[r] * stride_row + d]``, 0 outside."""
    ptrs = base + rows[:, None] * stride_row + offs_d[None, :]
    mask = offs_d[None, :] < D_HEAD
    if ROW_MASK:
        mask = mask & (rows[:, None] < N_ROWS)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def load_tile_t(base, rows, stride_row, offs_d, D_HEAD, N_ROWS, ROW_MASK: tl.constexpr):
    """The same tile loaded transposed, ``[HEAD_DIM, len(rows)]`` (so ``A @ tile`` is a plain dot)."""
    ptrs = base + rows[None, :] * stride_row + offs_d[:, None]
    mask = offs_d[:, None] < D_HEAD
    if ROW_MASK:
        mask = mask & (rows[None, :] < N_ROWS)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def store_tile(base, rows, stride_row, offs_d, value, D_HEAD, N_ROWS):
    """Store a ``[len(rows), HEAD_DIM]`` tile (cast to the pointer's dtype), tails masked."""
    ptrs = base + rows[:, None] * stride_row + offs_d[None, :]
    mask = (rows[:, None] < N_ROWS) & (offs_d[None, :] < D_HEAD)
    tl.store(ptrs, value.to(base.dtype.element_ty), mask=mask)


@triton.jit
def load_row_vector(base, rows, N_ROWS, other):
    """``[len(rows)]`` fp32 per-row values (LSE, delta), ``other`` past the tail."""
    return tl.load(base + rows, mask=rows < N_ROWS, other=other)


@triton.jit
def mma(a, b, acc, ALLOW_TF32: tl.constexpr):
    """``a @ b (+ acc)``; fp32 inputs in IEEE fp32 unless ``ALLOW_TF32`` (then TF32), 16-bit inputs as usual."""
    if a.dtype == tl.float32:
        if ALLOW_TF32:
            return tl.dot(a, b, acc, input_precision="tf32")
        else:
            return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)
