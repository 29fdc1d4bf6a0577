"""FlashAttention-2 backward, step 1: ``attn_bwd_preprocess``.

``DELTA[z, h, i] = sum_d DO[z, h, i, d] * O[z, h, i, d]`` in fp32 -- the row
term of the softmax gradient (``rowsum(P * dP) = rowsum(dO * O)``, dropout
included: O is the dropped output), computed once per query row instead of once
per (row, key block) in the main kernels.

Arguments, in order: ``O, DO, DELTA``; strides (o, do: z/h/row; delta: z/h);
``N_CTX_Q, D_HEAD, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS,
STORE_VARLEN_STATUS``; constexprs ``HEAD_DIM, BLOCK_M``.

Tensors: ``O``, ``DO`` ``[B, Hq, N_CTX_Q, D_HEAD]`` (fp16/bf16/fp32, last
dimension contiguous); ``DELTA`` fp32 ``[B, Hq, N_CTX_Q]`` with strides
``(stride_deltaz, stride_deltah, 1)``.  Varlen (``IS_VARLEN`` 1): packed rows and
``DELTA`` element ``(h, token)`` at ``h * stride_deltah + token`` (``varlen.py``).

Grid: ``(cdiv(N_CTX_Q, BLOCK_M), Hq, B)``.
"""
import triton
import triton.language as tl

from .tiles import load_tile
from .varlen import sequence


@triton.jit
def attn_bwd_preprocess(O, DO, DELTA,
                        stride_oz, stride_oh, stride_om, stride_doz, stride_doh, stride_dom,
                        stride_deltaz, stride_deltah,
                        N_CTX_Q, D_HEAD, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS, STORE_VARLEN_STATUS,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    start_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    off_z = tl.program_id(2)
    q_start, seqlen_q = sequence(off_z, N_CTX_Q, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS, STORE_VARLEN_STATUS)
    if start_m * BLOCK_M >= seqlen_q:
        return
    off_z = off_z.to(tl.int64)
    q_start64 = q_start.to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    o = load_tile(O + off_z * stride_oz + off_h * stride_oh + q_start64 * stride_om, offs_m, stride_om, offs_d,
                  D_HEAD, seqlen_q, True)
    do = load_tile(DO + off_z * stride_doz + off_h * stride_doh + q_start64 * stride_dom, offs_m, stride_dom, offs_d,
                   D_HEAD, seqlen_q, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + off_z * stride_deltaz + off_h * stride_deltah + q_start + offs_m, delta, mask=offs_m < seqlen_q)
