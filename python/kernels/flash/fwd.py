"""FlashAttention-2 forward: ``attn_fwd``.

Computes ``O = softmax(sm_scale * Q K^T + mask) V`` per (batch, query head).

Tensors (element strides; the last dimension always has stride 1 and is not passed):

* ``Q``: ``[B, Hq, N_CTX_Q, D_HEAD]``; ``K``, ``V``: ``[B, Hk, N_CTX_K, D_HEAD]``
  with ``Hq = GQA_GROUP * Hk`` (query head ``h`` reads K/V head ``h // GQA_GROUP``:
  MHA ``GQA_GROUP = 1``, MQA ``Hk = 1``); ``O``: like ``Q``.  Q, K, V and O share
  one dtype (fp16 or bf16).  Any layout whose last dimension is contiguous
  works, e.g. ``[B, S, H, D]`` memory viewed as ``[B, H, S, D]``.
* ``D_HEAD`` (runtime, a multiple of 8) is the real head dimension,
  ``HEAD_DIM`` (constexpr) the power-of-two bucket ``>= D_HEAD`` the kernel is
  compiled for; head-dim padding is masked (``tiles.py``).
* ``LSE``: fp32 ``[B, Hq, N_CTX_Q]`` with strides ``(stride_lz, stride_lh, 1)``,
  written only when ``STORE_LSE`` is 1 (otherwise it may be a null pointer);
  ``LSE[z, h, i] = ln(sum_j exp(sm_scale * q_i . k_j))`` over the keys row ``i``
  sees (natural log; ``+inf`` for a row that sees no key, whose O row is 0).
  This LSE is what the backward kernels read.

Grid: ``(cdiv(N_CTX_Q, BLOCK_M), Hq, B)``.  ``program_id(0)`` is the query
block, ``program_id(1)`` the query head, ``program_id(2)`` the batch.  With
``WINDOWED`` the query blocks run in reverse order: for causal masks the last
blocks see the most keys, so the heaviest programs start first and the short
ones fill the tail of the wave.

Masks (``mask.py``): key and query tails always; with ``WINDOWED`` the general
window ``(WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET)`` -- causal in either
alignment and sliding windows.  Per program the key blocks split into leading
masked, fully visible (no mask code) and trailing masked ranges; the fully
visible ones run in one loop without masks, the boundary ones (leading and
trailing) in one masked loop.

Offsets: batch and head offsets are computed in int64 (``stride_?z`` and
``stride_?h`` are i64 and may exceed 2**31); row offsets ``row * stride_?m`` are
int32 -- the caller guarantees ``N_CTX * row stride`` fits.

Numerics: scores in fp32, online softmax in the exp2 domain with
``sm_scale * log2(e)`` folded into one multiply, fp32 accumulator, P cast to the
input dtype for the PV product.
"""
import triton
import triton.language as tl

from .mask import block_walk, block_walk_start, key_block_bounds, score_mask
from .softmax import online_softmax_step, softmax_epilogue
from .tiles import load_tile, load_tile_t, store_tile

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _attn_fwd_kv_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                      offs_m, offs_d, lo, hi, skip_lo, skip_hi, qk_scale,
                      N_CTX_Q, N_CTX_K, D_HEAD, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET,
                      BLOCK_N: tl.constexpr, MASKED: tl.constexpr, WINDOWED: tl.constexpr):
    """Accumulate the key blocks of ``[lo, hi)`` outside ``[skip_lo, skip_hi)`` into ``(acc, l_i, m_i)``.

    ``MASKED=False`` is the hot path: every key of every block is inside the
    sequence and visible to every query row, so it carries no mask but the
    head-dim one (its range is contiguous: pass no skip).  ``MASKED=True``
    walks the boundary blocks: the leading ones ``[lo, skip_lo)`` and the
    trailing ones ``[skip_hi, hi)`` in one loop (see ``mask.block_loop_bounds``).
    """
    offs_n = tl.arange(0, BLOCK_N)
    n_lead, n_blocks = block_walk(lo, hi, skip_lo, skip_hi, BLOCK_N)
    for it in range(0, n_blocks):
        start_n = tl.multiple_of(block_walk_start(it, lo, n_lead, skip_hi, BLOCK_N), BLOCK_N)
        cols = start_n + offs_n
        k = load_tile_t(k_base, cols, stride_kn, offs_d, D_HEAD, N_CTX_K, MASKED)  # [HEAD_DIM, BLOCK_N]
        s = tl.dot(q, k) * qk_scale
        if MASKED:
            visible = score_mask(offs_m[:, None], cols[None, :], N_CTX_Q, N_CTX_K,
                                 WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET, WINDOWED)
            s = tl.where(visible, s, float("-inf"))
        p, alpha, m_i, l_i = online_softmax_step(m_i, l_i, s)
        acc = acc * alpha[:, None]
        v = load_tile(v_base, cols, stride_vn, offs_d, D_HEAD, N_CTX_K, MASKED)
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit
def attn_fwd(Q, K, V, O, LSE, sm_scale,
             stride_qz, stride_qh, stride_qm,
             stride_kz, stride_kh, stride_kn,
             stride_vz, stride_vh, stride_vn,
             stride_oz, stride_oh, stride_om,
             stride_lz, stride_lh,
             N_CTX_Q, N_CTX_K, D_HEAD, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET, STORE_LSE,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr):
    # -- program scheduling ------------------------------------------------
    if WINDOWED:
        start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest query blocks first
    else:
        start_m = tl.program_id(0)
    off_h = tl.program_id(1)
    off_hk = (off_h // GQA_GROUP).to(tl.int64)
    off_h = off_h.to(tl.int64)
    off_z = tl.program_id(2).to(tl.int64)

    q_base = Q + off_z * stride_qz + off_h * stride_qh
    k_base = K + off_z * stride_kz + off_hk * stride_kh
    v_base = V + off_z * stride_vz + off_hk * stride_vh
    o_base = O + off_z * stride_oz + off_h * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)

    # -- main loops ----------------------------------------------------------
    q = load_tile(q_base, offs_m, stride_qm, offs_d, D_HEAD, N_CTX_Q, True)
    qk_scale = sm_scale * LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    start, full_lo, full_hi, end = key_block_bounds(start_m, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
                                                    DIAG_OFFSET, BLOCK_M, BLOCK_N, WINDOWED)
    # Key blocks visible in full to the whole tile: no mask code.
    acc, l_i, m_i = _attn_fwd_kv_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                      offs_m, offs_d, full_lo, full_hi, full_hi, full_hi, qk_scale,
                                      N_CTX_Q, N_CTX_K, D_HEAD, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET,
                                      BLOCK_N, False, WINDOWED)
    # Boundary blocks, leading [start, full_lo) and trailing [full_hi, end), in one masked loop.
    acc, l_i, m_i = _attn_fwd_kv_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                      offs_m, offs_d, start, end, full_lo, full_hi, qk_scale,
                                      N_CTX_Q, N_CTX_K, D_HEAD, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET,
                                      BLOCK_N, True, WINDOWED)

    # -- epilogue ------------------------------------------------------------
    o, lse = softmax_epilogue(acc, m_i, l_i)
    if STORE_LSE != 0:
        lse_base = LSE + off_z * stride_lz + off_h * stride_lh
        tl.store(lse_base + offs_m, lse, mask=offs_m < N_CTX_Q)
    store_tile(o_base, offs_m, stride_om, offs_d, o, D_HEAD, N_CTX_Q)
