"""Attention masks for the FlashAttention kernels.

Every mask here answers "may query row ``i`` attend to key column ``j``?" for a
tile of rows ``offs_m`` and columns ``offs_n`` (absolute positions in the
sequence).  The kernels apply masks only on the *boundary* key blocks; the
loop bounds that tell boundary blocks from full blocks live here too, next to
the masks they must agree with.

Masks implemented:

* key tail          -- ``j < N_CTX_K``: the last key block may run past the sequence;
* causal top-left   -- ``j <= i``: query ``i`` sees keys ``0..i`` (the usual
  convention when ``N_CTX_Q == N_CTX_K``; with ``N_CTX_Q > N_CTX_K`` the rows
  past ``N_CTX_K`` see every key).

Planned additions keep the same naming scheme: ``causal_bottom_right_mask``
(``j <= i + N_CTX_K - N_CTX_Q``) and ``sliding_window_mask`` (``i - left <= j <=
i + right``).  Those can leave a query row with no visible key, and add a
leading masked key range ``[lo, full_start)`` to ``kv_loop_bounds``; the
softmax epilogue already handles such rows (O = 0).
"""
import triton
import triton.language as tl


@triton.jit
def key_tail_mask(offs_n, N_CTX_K):
    """``[BLOCK_N]`` bool: key column exists (``j < N_CTX_K``)."""
    return offs_n < N_CTX_K


@triton.jit
def query_tail_mask(offs_m, N_CTX_Q):
    """``[BLOCK_M]`` bool: query row exists (``i < N_CTX_Q``)."""
    return offs_m < N_CTX_Q


@triton.jit
def causal_top_left_mask(offs_m, offs_n):
    """``[BLOCK_M, BLOCK_N]`` bool: top-left aligned causal, key ``j`` visible to query ``i`` iff ``j <= i``."""
    return offs_m[:, None] >= offs_n[None, :]


@triton.jit
def score_mask(offs_m, offs_n, N_CTX_K, CAUSAL: tl.constexpr):
    """``[BLOCK_M, BLOCK_N]`` bool: every mask of this kernel configuration combined."""
    visible = key_tail_mask(offs_n, N_CTX_K)[None, :]
    if CAUSAL:
        visible = visible & causal_top_left_mask(offs_m, offs_n)
    return visible


@triton.jit
def kv_loop_bounds(start_m, N_CTX_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Key ranges for query block ``start_m``: ``(full_end, masked_end)``.

    * ``[0, full_end)``: key blocks that every row of the query block sees in
      full -- no mask needed (``full_end`` is a multiple of ``BLOCK_N``);
    * ``[full_end, masked_end)``: boundary key blocks (causal diagonal and/or
      key tail) that need ``score_mask``;
    * keys at or past ``masked_end`` are invisible to the whole query block and
      are never loaded.

    A key block ``[n, n + BLOCK_N)`` is full when it lies inside the sequence
    and, for causal, when its last key is visible to the block's first query
    row ``m0``: ``n + BLOCK_N - 1 <= m0``.
    """
    m0 = start_m * BLOCK_M
    if CAUSAL:
        masked_end = tl.minimum(m0 + BLOCK_M, N_CTX_K)
        full_end = (tl.minimum(m0 + 1, N_CTX_K) // BLOCK_N) * BLOCK_N
    else:
        masked_end = N_CTX_K
        full_end = (N_CTX_K // BLOCK_N) * BLOCK_N
    return full_end, masked_end
