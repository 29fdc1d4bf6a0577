"""FlashAttention-2 forward: ``attn_fwd``.

Computes ``O = dropout(softmax(cap(sm_scale * Q K^T) + alibi + bias + mask)) V`` per (batch, query
head), ``cap`` the identity, or ``softcap * tanh(x / softcap)`` with ``SOFTCAP`` (``softcap.py``);
``alibi`` 0, or ``-slope_h * |i + diag - j|`` with ``HAS_ALIBI`` (``alibi.py``).  With ``HAS_SINKS``
each row's softmax normaliser also counts the head's sink logit (``sinks.py``).

Arguments, in order: pointers ``Q, K, V, O, LSE, BIAS, ALIBI_SLOPES, SINKS``; ``sm_scale, softcap``; strides
(q, k, v, o: z/h/row; lse: z/h; bias: z/h/row; alibi slopes: z); ``STORE_LSE``; the attention
group ``N_CTX_Q, N_CTX_K, D_HEAD, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT,
ALIGN_BOTTOM_RIGHT, IS_VARLEN, CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q,
N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS``; the dropout group
``DROPOUT_THRESHOLD, dropout_scale, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base``
and the forward-only ``PHILOX_SEED_OUT, PHILOX_OFFSET_OUT, STORE_PHILOX``; ``D_HEAD_V`` (last:
the kernels without V's own head dim keep their machine code);
constexprs ``HEAD_DIM, BLOCK_M, BLOCK_N, DROPOUT, HAS_BIAS, ALLOW_TF32, SOFTCAP, HAS_ALIBI, HAS_SINKS,
HEAD_DIM_V``.
Unused groups (bias without ``HAS_BIAS``, dropout without ``DROPOUT``, cu_seqlens
without ``IS_VARLEN``) may be null pointers / zeros.

Tensors (element strides; the last dimension always has stride 1 and is not passed):

* ``Q``: ``[B, Hq, N_CTX_Q, D_HEAD]``; ``K``, ``V``: ``[B, Hk, N_CTX_K, D_HEAD]``
  with ``Hq = GQA_GROUP * Hk`` (query head ``h`` reads K/V head ``h // GQA_GROUP``);
  ``O``: like ``Q``.  Q, K, V, O and BIAS share one dtype (fp16, bf16 or fp32;
  fp32 dots are IEEE unless ``ALLOW_TF32``).  Any layout whose last dimension is
  contiguous works.  Varlen (``IS_VARLEN`` 1): packed, see ``varlen.py``.
* ``D_HEAD`` (runtime, a multiple of 8) is the real head dimension,
  ``HEAD_DIM`` (constexpr) the power-of-two bucket ``>= D_HEAD``; head-dim
  padding is masked (``tiles.py``).  V (and O) may have their own head dim:
  with ``HEAD_DIM_V`` > 0, ``V`` is ``[B, Hk, N_CTX_K, D_HEAD_V]`` and ``O``
  ``[B, Hq, N_CTX_Q, D_HEAD_V]`` in that bucket; ``HEAD_DIM_V`` 0 means Q/K's
  (``D_HEAD_V`` unread).
* ``LSE``: fp32 ``[B, Hq, N_CTX_Q]`` with strides ``(stride_lz, stride_lh, 1)``
  (varlen: ``[1, Hq, total_q]``), written only when ``STORE_LSE`` is 1;
  ``LSE = ln(sum_j exp(s_ij))`` over the keys row ``i`` sees, *without* dropout
  (``+inf`` for a row that sees no key, whose O row is 0); with sinks the sum also has
  ``exp(SINKS[h])``.
* ``SINKS``: fp32 ``[Hq]`` (read only with ``HAS_SINKS``).
* ``BIAS``: ``bias.py``.  Dropout: ``dropout.py`` (the counter layout); with
  ``STORE_PHILOX`` 1 program (0, 0, 0) writes the seed and the offset it used
  (``*PHILOX_OFFSET + philox_offset_base``) to ``PHILOX_SEED_OUT``/``PHILOX_OFFSET_OUT``
  (only when ``DROPOUT``).

Grid: ``(cdiv(N_CTX_Q, BLOCK_M), Hq, B)``; the query blocks run in reverse
order (for causal masks the last blocks see the most keys, so the heaviest
programs start first).  Masks (``mask.py``) are runtime only: per program the
key blocks split into fully visible ones (no mask code) and boundary ones
(leading and trailing, one masked loop).

Offsets: batch, head and sequence-start offsets in int64; row offsets inside a
sequence ``row * stride_?m`` in int32 (the caller guarantees ``N_CTX * row stride`` fits).

Numerics: scores in fp32, online softmax in the exp2 domain with
``sm_scale * log2(e)`` folded into one multiply, fp32 accumulator, P cast to the
input dtype for the PV product, ``dropout_scale`` applied once in the epilogue.
"""
import triton
import triton.language as tl

from .alibi import alibi_bias_log2, alibi_slope_log2
from .bias import load_bias_log2
from .dropout import dropout_head_offset, dropout_keep, dropout_rows_offset, philox_state
from .mask import block_walk, block_walk_start, diag_offset, key_block_bounds, score_mask
from .sinks import fold_sink, sink_log2
from .softcap import soft_cap
from .softmax import online_softmax_step, softmax_epilogue
from .tiles import load_tile, load_tile_t, mma, store_tile
from .varlen import sequence

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _attn_fwd_kv_loop(acc, l_i, m_i, q, k_base, v_base, bias_base, stride_kn, stride_vn, stride_bm,
                      offs_m, offs_d, offs_dv, lo, hi, skip_lo, skip_hi, qk_scale, softcap, alibi_slope,
                      seqlen_q, seqlen_k, D_HEAD, d_head_v, WINDOW_LEFT, WINDOW_RIGHT, diag,
                      philox_seed, philox_tile, N_CTX_K, DROPOUT_THRESHOLD,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                      DROPOUT: tl.constexpr, HAS_BIAS: tl.constexpr, ALLOW_TF32: tl.constexpr,
                      SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Accumulate the key blocks of ``[lo, hi)`` outside ``[skip_lo, skip_hi)`` into ``(acc, l_i, m_i)``.

    ``MASKED=False`` is the hot path: every key of every block is inside the
    sequence and visible to every query row, so it carries no mask but the
    head-dim one (and the query tail for the bias load).  ``MASKED=True`` walks
    the boundary blocks: leading ``[lo, skip_lo)`` and trailing ``[skip_hi, hi)``.
    """
    offs_n = tl.arange(0, BLOCK_N)
    n_lead, n_blocks = block_walk(lo, hi, skip_lo, skip_hi, BLOCK_N)
    for it in range(0, n_blocks):
        start_n = tl.multiple_of(block_walk_start(it, lo, n_lead, skip_hi, BLOCK_N), BLOCK_N)
        cols = start_n + offs_n
        k = load_tile_t(k_base, cols, stride_kn, offs_d, D_HEAD, seqlen_k, MASKED)  # [HEAD_DIM, BLOCK_N]
        s = mma(q, k, None, ALLOW_TF32) * qk_scale
        if SOFTCAP:
            s, _ = soft_cap(s, softcap)
        if HAS_ALIBI:
            s += alibi_bias_log2(alibi_slope, offs_m[:, None], cols[None, :], diag)
        if MASKED:
            visible = score_mask(offs_m[:, None], cols[None, :], seqlen_q, seqlen_k,
                                 WINDOW_LEFT, WINDOW_RIGHT, diag)
            if HAS_BIAS:
                s += load_bias_log2(bias_base, offs_m[:, None], cols[None, :], stride_bm, visible)
            s = tl.where(visible, s, float("-inf"))
        else:
            if HAS_BIAS:
                s += load_bias_log2(bias_base, offs_m[:, None], cols[None, :], stride_bm,
                                    offs_m[:, None] < seqlen_q)
        p, alpha, m_i, l_i = online_softmax_step(m_i, l_i, s)
        acc = acc * alpha[:, None]
        if DROPOUT:
            keep = dropout_keep(philox_seed, philox_tile, 0, start_n, N_CTX_K, DROPOUT_THRESHOLD,
                                BLOCK_M, BLOCK_N)
            p = tl.where(keep, p, 0.0)
        v = load_tile(v_base, cols, stride_vn, offs_dv, d_head_v, seqlen_k, MASKED)      # [BLOCK_N, V_DIM]
        acc = mma(p.to(v.dtype), v, acc, ALLOW_TF32)
    return acc, l_i, m_i


@triton.jit
def attn_fwd(Q, K, V, O, LSE, BIAS, ALIBI_SLOPES, SINKS, sm_scale, softcap,
             stride_qz, stride_qh, stride_qm,
             stride_kz, stride_kh, stride_kn,
             stride_vz, stride_vh, stride_vn,
             stride_oz, stride_oh, stride_om,
             stride_lz, stride_lh,
             stride_bz, stride_bh, stride_bm, stride_az,
             STORE_LSE,
             N_CTX_Q, N_CTX_K, D_HEAD, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, IS_VARLEN,
             CU_SEQLENS_Q, CU_SEQLENS_K, N_TOKENS_Q, N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS,
             DROPOUT_THRESHOLD, dropout_scale, PHILOX_SEED, PHILOX_OFFSET, philox_offset_base,
             PHILOX_SEED_OUT, PHILOX_OFFSET_OUT, STORE_PHILOX, D_HEAD_V,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             DROPOUT: tl.constexpr, HAS_BIAS: tl.constexpr, ALLOW_TF32: tl.constexpr, SOFTCAP: tl.constexpr,
             HAS_ALIBI: tl.constexpr, HAS_SINKS: tl.constexpr, HEAD_DIM_V: tl.constexpr):
    # -- program scheduling ------------------------------------------------
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest query blocks first (causal)
    off_h = tl.program_id(1)
    off_hk = (off_h // GQA_GROUP).to(tl.int64)
    off_h = off_h.to(tl.int64)
    off_z = tl.program_id(2)

    philox_seed = 0
    philox_tile = 0  # the counter of this tile's first quad row (dropout.py)
    if DROPOUT:
        philox_seed, philox_offset = philox_state(PHILOX_SEED, PHILOX_OFFSET, philox_offset_base)
        if STORE_PHILOX != 0:
            if (tl.program_id(0) == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0):
                tl.store(PHILOX_SEED_OUT, philox_seed)
                tl.store(PHILOX_OFFSET_OUT, philox_offset)
        philox_head = dropout_head_offset(philox_offset, off_z, off_h, tl.num_programs(1), N_CTX_Q, N_CTX_K)
        philox_tile = dropout_rows_offset(philox_head, start_m * BLOCK_M, N_CTX_K)

    q_start, seqlen_q = sequence(off_z, N_CTX_Q, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS, STORE_VARLEN_STATUS)
    k_start, seqlen_k = sequence(off_z, N_CTX_K, IS_VARLEN, CU_SEQLENS_K, N_TOKENS_K, VARLEN_STATUS, STORE_VARLEN_STATUS)
    if start_m * BLOCK_M >= seqlen_q:
        return
    diag = diag_offset(seqlen_q, seqlen_k, ALIGN_BOTTOM_RIGHT)

    off_z = off_z.to(tl.int64)
    q_base = Q + off_z * stride_qz + off_h * stride_qh + q_start.to(tl.int64) * stride_qm
    k_base = K + off_z * stride_kz + off_hk * stride_kh + k_start.to(tl.int64) * stride_kn
    v_base = V + off_z * stride_vz + off_hk * stride_vh + k_start.to(tl.int64) * stride_vn
    o_base = O + off_z * stride_oz + off_h * stride_oh + q_start.to(tl.int64) * stride_om
    bias_base = BIAS + off_z * stride_bz + off_h * stride_bh
    alibi_slope = 0.0
    if HAS_ALIBI:
        alibi_slope = alibi_slope_log2(ALIBI_SLOPES, stride_az, off_z, off_h)

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    # V's head dim (and O's, dO's, dV's): Q/K's, or with HEAD_DIM_V > 0 its own bucket and real dim.
    V_DIM: tl.constexpr = HEAD_DIM if HEAD_DIM_V == 0 else HEAD_DIM_V
    d_head_v = D_HEAD if HEAD_DIM_V == 0 else D_HEAD_V
    offs_dv = offs_d if HEAD_DIM_V == 0 else tl.arange(0, V_DIM)  # the same value when V has Q/K's dim

    # -- main loops ----------------------------------------------------------
    q = load_tile(q_base, offs_m, stride_qm, offs_d, D_HEAD, seqlen_q, True)
    qk_scale = sm_scale * LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, V_DIM], dtype=tl.float32)

    start, full_lo, full_hi, end = key_block_bounds(start_m, seqlen_q, seqlen_k, WINDOW_LEFT, WINDOW_RIGHT, diag,
                                                    BLOCK_M, BLOCK_N)
    # Key blocks visible in full to the whole tile: no mask code.
    acc, l_i, m_i = _attn_fwd_kv_loop(acc, l_i, m_i, q, k_base, v_base, bias_base, stride_kn, stride_vn, stride_bm,
                                      offs_m, offs_d, offs_dv, full_lo, full_hi, full_hi, full_hi, qk_scale, softcap,
                                      alibi_slope, seqlen_q, seqlen_k, D_HEAD, d_head_v, WINDOW_LEFT, WINDOW_RIGHT, diag,
                                      philox_seed, philox_tile, N_CTX_K, DROPOUT_THRESHOLD,
                                      BLOCK_M, BLOCK_N, False, DROPOUT, HAS_BIAS, ALLOW_TF32, SOFTCAP, HAS_ALIBI)
    # Boundary blocks, leading [start, full_lo) and trailing [full_hi, end), in one masked loop.
    acc, l_i, m_i = _attn_fwd_kv_loop(acc, l_i, m_i, q, k_base, v_base, bias_base, stride_kn, stride_vn, stride_bm,
                                      offs_m, offs_d, offs_dv, start, end, full_lo, full_hi, qk_scale, softcap,
                                      alibi_slope, seqlen_q, seqlen_k, D_HEAD, d_head_v, WINDOW_LEFT, WINDOW_RIGHT, diag,
                                      philox_seed, philox_tile, N_CTX_K, DROPOUT_THRESHOLD,
                                      BLOCK_M, BLOCK_N, True, DROPOUT, HAS_BIAS, ALLOW_TF32, SOFTCAP, HAS_ALIBI)

    # -- epilogue ------------------------------------------------------------
    if HAS_SINKS:
        acc, m_i, l_i = fold_sink(acc, m_i, l_i, sink_log2(SINKS, off_h))
    o, lse = softmax_epilogue(acc, m_i, l_i)
    if DROPOUT:
        o = o * dropout_scale
    if STORE_LSE != 0:
        lse_base = LSE + off_z * stride_lz + off_h * stride_lh + q_start
        tl.store(lse_base + offs_m, lse, mask=offs_m < seqlen_q)
    store_tile(o_base, offs_m, stride_om, offs_dv, o, d_head_v, seqlen_q)
