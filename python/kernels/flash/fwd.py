"""FlashAttention-2 forward: ``attn_fwd``.

Computes ``O = softmax(sm_scale * Q K^T + mask) V`` per (batch, head).

Tensors (element strides; the last dimension always has stride 1 and is not passed):

* ``Q``: ``[B, H, N_CTX_Q, HEAD_DIM]``; ``K``, ``V``: ``[B, H, N_CTX_K, HEAD_DIM]``;
  ``O``: like ``Q``.  Q, K, V and O share one dtype (fp16 or bf16).  Any layout
  whose last dimension is contiguous works, e.g. ``[B, S, H, D]`` memory viewed
  as ``[B, H, S, D]``.
* ``LSE``: fp32 ``[B, H, N_CTX_Q]`` with strides ``(stride_lz, stride_lh, 1)``;
  ``LSE[z, h, i] = ln(sum_j exp(sm_scale * q_i . k_j))`` over the keys row ``i``
  sees (natural log; ``+inf`` for a row that sees no key, whose O row is 0).

Grid: ``(cdiv(N_CTX_Q, BLOCK_M), H, B)``.  ``program_id(0)`` is the query block,
``program_id(1)`` the head, ``program_id(2)`` the batch.  With ``CAUSAL`` the
query blocks run in reverse order, so the heaviest blocks (those that see
the most keys) start first and the short ones fill the tail of the wave.

Masks: key tail (any ``N_CTX_K >= 1``), query tail (any ``N_CTX_Q >= 1``), and
with ``CAUSAL`` top-left causal (query ``i`` sees keys ``j <= i``).

Offsets: batch and head offsets are computed in int64 (``stride_?z`` and
``stride_?h`` are i64 and may exceed 2**31); row offsets ``row * stride_?m`` are
int32 -- the caller guarantees ``N_CTX * row stride`` fits.

Numerics: scores in fp32, online softmax in the exp2 domain with
``sm_scale * log2(e)`` folded into one multiply, fp32 accumulator, P cast to the
input dtype for the PV product.
"""
import triton
import triton.language as tl

from .mask import kv_loop_bounds, key_tail_mask, query_tail_mask, score_mask
from .softmax import online_softmax_step, softmax_epilogue

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _attn_fwd_kv_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                      offs_m, offs_d, lo, hi, qk_scale, N_CTX_K,
                      BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Accumulate key blocks ``[lo, hi)`` into ``(acc, l_i, m_i)``.

    ``MASKED=False`` is the hot path: every key of every block is inside the
    sequence and visible to every query row, so it carries no mask at all.
    ``MASKED=True`` handles the boundary blocks (causal diagonal, key tail).
    """
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        # K is loaded transposed, [HEAD_DIM, BLOCK_N], so QK^T is a plain dot.
        k_ptrs = k_base + cols[None, :] * stride_kn + offs_d[:, None]
        v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :]
        if MASKED:
            key_valid = key_tail_mask(cols, N_CTX_K)
            k = tl.load(k_ptrs, mask=key_valid[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs)
        s = tl.dot(q, k) * qk_scale
        if MASKED:
            s = tl.where(score_mask(offs_m, cols, N_CTX_K, CAUSAL), s, float("-inf"))
        p, alpha, m_i, l_i = online_softmax_step(m_i, l_i, s)
        acc = acc * alpha[:, None]
        if MASKED:
            v = tl.load(v_ptrs, mask=key_valid[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit
def attn_fwd(Q, K, V, O, LSE, sm_scale,
             stride_qz, stride_qh, stride_qm,
             stride_kz, stride_kh, stride_kn,
             stride_vz, stride_vh, stride_vn,
             stride_oz, stride_oh, stride_om,
             stride_lz, stride_lh,
             N_CTX_Q, N_CTX_K,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # -- program scheduling ------------------------------------------------
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest query blocks first
    else:
        start_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    off_z = tl.program_id(2).to(tl.int64)

    q_base = Q + off_z * stride_qz + off_h * stride_qh
    k_base = K + off_z * stride_kz + off_h * stride_kh
    v_base = V + off_z * stride_vz + off_h * stride_vh
    o_base = O + off_z * stride_oz + off_h * stride_oh
    lse_base = LSE + off_z * stride_lz + off_h * stride_lh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_valid = query_tail_mask(offs_m, N_CTX_Q)

    # -- main loop -----------------------------------------------------------
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], mask=row_valid[:, None], other=0.0)
    qk_scale = sm_scale * LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    full_end, masked_end = kv_loop_bounds(start_m, N_CTX_K, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _attn_fwd_kv_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                      offs_m, offs_d, 0, full_end, qk_scale, N_CTX_K,
                                      BLOCK_N, False, CAUSAL)
    acc, l_i, m_i = _attn_fwd_kv_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                      offs_m, offs_d, full_end, masked_end, qk_scale, N_CTX_K,
                                      BLOCK_N, True, CAUSAL)

    # -- epilogue ------------------------------------------------------------
    o, lse = softmax_epilogue(acc, m_i, l_i)
    tl.store(lse_base + offs_m, lse, mask=row_valid)
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=row_valid[:, None])
