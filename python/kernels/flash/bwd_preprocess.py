"""FlashAttention-2 backward, step 1: ``attn_bwd_preprocess``.

``DELTA[z, h, i] = sum_d DO[z, h, i, d] * O[z, h, i, d]`` in fp32 -- the row
term of the softmax gradient (``rowsum(P * dP) = rowsum(dO * O)``), computed
once per query row instead of once per (row, key block) in the main kernels.

Tensors: ``O``, ``DO`` ``[B, Hq, N_CTX_Q, D_HEAD]`` (fp16/bf16, last dimension
contiguous); ``DELTA`` fp32 ``[B, Hq, N_CTX_Q]`` with strides
``(stride_deltaz, stride_deltah, 1)``.

Grid: ``(cdiv(N_CTX_Q, BLOCK_M), Hq, B)``.
"""
import triton
import triton.language as tl

from .tiles import load_tile


@triton.jit
def attn_bwd_preprocess(O, DO, DELTA,
                        stride_oz, stride_oh, stride_om, stride_doz, stride_doh, stride_dom,
                        stride_deltaz, stride_deltah,
                        N_CTX_Q, D_HEAD,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    start_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    off_z = tl.program_id(2).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    o = load_tile(O + off_z * stride_oz + off_h * stride_oh, offs_m, stride_om, offs_d, D_HEAD, N_CTX_Q, True)
    do = load_tile(DO + off_z * stride_doz + off_h * stride_doh, offs_m, stride_dom, offs_d, D_HEAD, N_CTX_Q,
                   True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + off_z * stride_deltaz + off_h * stride_deltah + offs_m, delta, mask=offs_m < N_CTX_Q)
