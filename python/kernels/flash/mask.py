"""Attention masks and the block-loop bounds that must agree with them.

One general mask covers every supported attention pattern, entirely at run time
(no constexpr).  Query row ``i`` (local to its sequence) sees key column ``j`` iff

    j < seqlen_k   and   i + off - WINDOW_LEFT  <=  j  <=  i + off + WINDOW_RIGHT

with ``off = seqlen_k - seqlen_q`` when ``ALIGN_BOTTOM_RIGHT`` is 1, else 0
(``diag_offset``), computed by the kernels from the per-sequence lengths
(``N_CTX_Q``/``N_CTX_K``, or the varlen lengths from ``CU_SEQLENS_*``).
``i < seqlen_q`` is implied: rows past the query tail do not exist.
Runtime arguments ``WINDOW_LEFT``, ``WINDOW_RIGHT`` >= 0:

* no mask               -- left = right = ``N_CTX_Q + N_CTX_K`` (every key visible: the
  bounds put every full block in the unmasked loop, only the sequence tail is masked);
* causal top-left       -- left = unbounded (``N_CTX_Q + N_CTX_K``), right = 0, ``ALIGN_BOTTOM_RIGHT`` 0;
* causal bottom-right   -- the same with ``ALIGN_BOTTOM_RIGHT`` 1;
* sliding window        -- any (left, right) in either alignment.

With a window (and with bottom-right alignment when ``seqlen_q > seqlen_k``) a
query row may see no key at all; the kernels give such rows O = 0, LSE = +inf
and zero gradients.  All window arithmetic is int32: the runtime keeps
``N_CTX_Q + N_CTX_K <= 2**29`` and each window side at most ``N_CTX_Q + N_CTX_K``, so
every bound (at most about ``2 * (N_CTX_Q + N_CTX_K)`` plus a block in magnitude) fits.

Loop bounds
-----------
A program owns a tile of *rows* (a query block in the forward and dQ kernels,
a key block in the dK/dV kernel) and walks blocks of *columns* (key blocks,
resp. query blocks).  ``block_loop_bounds`` returns four column positions
``start <= full_lo <= full_hi <= end``:

* ``[start, full_lo)``  leading boundary blocks  -- masked (window's left edge);
* ``[full_lo, full_hi)`` blocks visible in full to every row of the tile --
  no mask code at all (``full_lo``, ``full_hi`` multiples of the block size);
* ``[full_hi, end)``    trailing boundary blocks -- masked (window's right edge,
  sequence tail);
* columns outside ``[start, end)`` are invisible to the whole tile and are never loaded.

``start`` is a multiple of the block size, so every block is block-aligned.
The kernels run two loops: the full range without masks, then the leading and
trailing boundary blocks together in one masked loop (``block_walk``: one loop
body instead of two, which also keeps register pressure down).  Without a mask
the leading range is empty and the trailing range is just the sequence tail.
"""
import triton
import triton.language as tl


@triton.jit
def key_tail_mask(offs_n, N_CTX_K):
    """Bool: key column exists (``j < N_CTX_K``)."""
    return offs_n < N_CTX_K


@triton.jit
def query_tail_mask(offs_m, N_CTX_Q):
    """Bool: query row exists (``i < N_CTX_Q``)."""
    return offs_m < N_CTX_Q


@triton.jit
def window_mask(offs_q, offs_k, WINDOW_LEFT, WINDOW_RIGHT, diag):
    """Bool: key ``j`` inside query ``i``'s window, ``i + off - left <= j <= i + off + right``.

    ``offs_q`` and ``offs_k`` are broadcastable (``[M, 1]`` and ``[1, N]`` in the
    forward, transposed in the dK/dV kernel).
    """
    d = offs_q + diag
    return (offs_k >= d - WINDOW_LEFT) & (offs_k <= d + WINDOW_RIGHT)


@triton.jit
def score_mask(offs_q, offs_k, seqlen_q, seqlen_k, WINDOW_LEFT, WINDOW_RIGHT, diag):
    """Bool, broadcast of ``offs_q`` and ``offs_k``: every mask of the configuration combined.

    Used only on boundary blocks; both sequence tails are included so the same
    mask serves the forward, dQ (rows = queries) and dK/dV (rows = keys) kernels.
    """
    visible = query_tail_mask(offs_q, seqlen_q) & key_tail_mask(offs_k, seqlen_k)
    return visible & window_mask(offs_q, offs_k, WINDOW_LEFT, WINDOW_RIGHT, diag)


@triton.jit
def diag_offset(seqlen_q, seqlen_k, ALIGN_BOTTOM_RIGHT):
    """The window's diagonal offset: ``seqlen_k - seqlen_q`` for bottom-right alignment, else 0."""
    return (seqlen_k - seqlen_q) * (ALIGN_BOTTOM_RIGHT != 0).to(tl.int32)


@triton.jit
def block_loop_bounds(first, last, N_COLS, lo_off, hi_off, BLOCK: tl.constexpr):
    """Column loop bounds ``(start, full_lo, full_hi, end)`` for the row tile ``[first, last]``.

    ``last`` is the tile's last *existing* row.  Column ``c`` is visible to row
    ``r`` iff ``0 <= c < N_COLS`` and ``r + lo_off <= c <= r + hi_off``.

    * visible at all: ``[max(0, first + lo_off), min(N_COLS, last + hi_off + 1))``;
    * a block ``[c, c + BLOCK)`` is full iff ``c >= last + lo_off`` (its first
      column is visible to the last row) and ``c + BLOCK <= min(N_COLS, first + hi_off + 1)``
      (its last column exists and is visible to the first row).
    """
    lo = tl.maximum(first + lo_off, 0)
    hi = tl.minimum(last + hi_off + 1, N_COLS)
    start = (lo // BLOCK) * BLOCK                                   # lo >= 0: floor division is exact
    block_end = ((hi + BLOCK - 1) // BLOCK) * BLOCK
    full_lo = tl.maximum(last + lo_off, lo)                         # >= 0
    full_lo = tl.minimum(((full_lo + BLOCK - 1) // BLOCK) * BLOCK, block_end)
    full_lo = tl.maximum(full_lo, start)
    full_hi = tl.maximum(tl.minimum(first + hi_off + 1, N_COLS), 0)
    full_hi = tl.maximum(tl.minimum((full_hi // BLOCK) * BLOCK, block_end), full_lo)
    # No visible column at all (or no row): every range empty (not a masked walk over nothing).
    empty = (hi <= lo) | (last < first)
    start = tl.where(empty, 0, start)
    full_lo = tl.where(empty, 0, full_lo)
    full_hi = tl.where(empty, 0, full_hi)
    end = tl.where(empty, 0, hi)
    return start, full_lo, full_hi, end


@triton.jit
def key_block_bounds(start_m, seqlen_q, seqlen_k, WINDOW_LEFT, WINDOW_RIGHT, diag,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key loop bounds (forward, dQ) for query block ``start_m``: see ``block_loop_bounds``."""
    first = start_m * BLOCK_M
    last = tl.minimum(first + BLOCK_M, seqlen_q) - 1
    return block_loop_bounds(first, last, seqlen_k, diag - WINDOW_LEFT, diag + WINDOW_RIGHT, BLOCK_N)


@triton.jit
def query_block_bounds(start_n, seqlen_q, seqlen_k, WINDOW_LEFT, WINDOW_RIGHT, diag,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query loop bounds (dK/dV, dBias) for key block ``start_n``: the window seen from the key side,

    key ``j`` is seen by query ``i`` iff ``j - off - right <= i <= j - off + left`` (and ``i < seqlen_q``).
    """
    first = start_n * BLOCK_N
    last = tl.minimum(first + BLOCK_N, seqlen_k) - 1
    return block_loop_bounds(first, last, seqlen_q, -(diag + WINDOW_RIGHT), WINDOW_LEFT - diag, BLOCK_M)


@triton.jit
def block_walk(lo, hi, skip_lo, skip_hi, BLOCK: tl.constexpr):
    """One loop over the blocks of ``[lo, hi)`` outside ``[skip_lo, skip_hi)``: ``(n_lead, n_blocks)``.

    ``lo <= skip_lo <= skip_hi <= hi``, ``lo``, ``skip_lo``, ``skip_hi``
    multiples of ``BLOCK``.  Iteration ``it`` of ``range(0, n_blocks)`` handles the
    block starting at ``block_walk_start(it, lo, n_lead, skip_hi, BLOCK)``.
    The masked loops walk the leading ``[start, full_lo)`` and trailing
    ``[full_hi, end)`` boundary blocks this way (one loop body, not two), the
    unmasked loop a contiguous range (``skip_lo = skip_hi = hi``).
    """
    n_lead = (skip_lo - lo) // BLOCK
    return n_lead, n_lead + tl.cdiv(hi - skip_hi, BLOCK)


@triton.jit
def block_walk_start(it, lo, n_lead, skip_hi, BLOCK: tl.constexpr):
    """First column of the ``it``-th block of ``block_walk``."""
    return tl.where(it < n_lead, lo + it * BLOCK, skip_hi + (it - n_lead) * BLOCK)
