"""FlashAttention forward for Hopper (sm_90) with fp8 (e4m3) inputs, in Gluon: ``attn_fwd_gluon_fp8``.

``O = softmax(sm_scale * dq * dk * Q K^T + mask) (dv * V)`` with Q, K, V in ``float8_e4m3fn``,
``dq, dk, dv`` their fp32 dequantisation factors per (batch, KV head) (FlashAttention-3's
``q_descale``/``k_descale``/``v_descale``, shape ``[B, Hk]``, any strides), O in bf16 and the
natural-log LSE in fp32.  The tensor cores multiply fp8 at twice the 16-bit rate.

The kernel is ``fwd.py``'s one-CTA-per-tile program (loader + consumer warpgroups, the same
mask and walk); what differs follows from the input type, inside the shared helpers:

* wgmma reads an 8-bit B operand only K-major.  K's rows are K-major for ``S = Q K^T``; V is
  not for ``O += P V`` (its K dimension is the key), so V comes as **Vᵀ**: a ``[B, Hk, D,
  KEYS_PAD]`` tensor written by ``fwd_fp8_vt.py`` (keys padded to 32 with zeros, permuted within
  each 32-key group), loaded in ``[HEAD_DIM, BLOCK_N]`` tiles and viewed transposed as the B operand;
* P is cast to e4m3 (its values are in ``[0, 1]``) and fed from registers with 4 elements per
  32-bit register, its keys renamed in the same permutation so no value crosses threads;
* O is stored through tiles of its own (the Q tiles hold 8-bit elements), scaled by ``dv``.

Contract (argument order, descriptor blocks, grid): ``ABI.md``.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .fwd import _opt, _tile_program


@gluon.jit
def attn_fwd_gluon_fp8(desc_q, desc_k, desc_vt, desc_o, LSE, stride_lz, stride_lh, sm_scale, STORE_LSE,
                       N_CTX_Q, N_CTX_K, GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT,
                       DESCALE_Q, stride_dsqz, stride_dsqh, DESCALE_K, stride_dskz, stride_dskh,
                       DESCALE_V, stride_dsvz, stride_dsvh,
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                       NUM_CONSUMERS: gl.constexpr = 2, CONSUMER_REGS: gl.constexpr = 240,
                       LOADER_REGS: gl.constexpr = 24, PEEL_FULL: gl.constexpr = 0, OVERLAP: gl.constexpr = 1,
                       SCHED: gl.constexpr = 0, PINGPONG: gl.constexpr = 0):
    N_CONS: gl.constexpr = _opt(NUM_CONSUMERS, 2)
    gl.static_assert(desc_q.dtype.is_fp8() and desc_k.dtype.is_fp8() and desc_vt.dtype.is_fp8(), "fp8 Q, K, Vᵀ")
    gl.static_assert(BLOCK_M == 64 * N_CONS, "BLOCK_M = 64 query rows per consumer warpgroup")
    gl.static_assert(desc_q.block_type.shape[2] == 64, "Q/O descriptor block: [1, 1, 64, HEAD_DIM]")
    gl.static_assert(desc_o.block_type.shape[2] == 64, "Q/O descriptor block: [1, 1, 64, HEAD_DIM]")
    gl.static_assert(desc_k.block_type.shape[2] == BLOCK_N, "K descriptor block: [1, 1, BLOCK_N, HEAD_DIM]")
    gl.static_assert(desc_vt.block_type.shape[2] == HEAD_DIM, "Vᵀ descriptor block: [1, 1, HEAD_DIM, BLOCK_N]")
    gl.static_assert(desc_vt.block_type.shape[3] == BLOCK_N, "Vᵀ descriptor block: [1, 1, HEAD_DIM, BLOCK_N]")
    _tile_program(desc_q, desc_k, desc_vt, desc_o, LSE, stride_lz, stride_lh, sm_scale, STORE_LSE, N_CTX_Q, N_CTX_K,
                  GQA_GROUP, WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT, 0, None, None, 0, 0, None, 0,
                  0, 1.0, None, None, 0, None, None, 0,
                  DESCALE_Q, stride_dsqz, stride_dsqh, DESCALE_K, stride_dskz, stride_dskh, DESCALE_V, stride_dsvz, stride_dsvh,
                  HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, N_CONS, _opt(CONSUMER_REGS, 240), _opt(LOADER_REGS, 24),
                  _opt(PEEL_FULL, 0), _opt(OVERLAP, 1), _opt(SCHED, 0), _opt(PINGPONG, 0))
