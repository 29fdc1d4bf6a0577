"""Gluon backward, step 3 of 3: ``attn_bwd_gluon_dq_convert`` (plain ``triton.language``; ``ABI.md``).

``dQ = dq_acc * sm_scale`` cast to the input dtype: ``dq_acc`` is the fp32 workspace the main
kernel (``bwd.py``) reduce-added ``dS K`` into (unscaled, so the scale is applied once here).
Only rows ``< Sq`` and columns ``< D_HEAD`` are written.  Workspace row of (b, h, i):
``(b * N_HEADS_Q + h) * SQ_PAD + i``, ``HEAD_DIM`` columns.  A packed (varlen) batch: ``b`` is the
sequence, ``Sq`` its own length, its dQ rows ``start + i`` of the packed tensor (``bwd_preprocess.py``).

Arguments, in order: ``DQ_ACC`` (``*fp32``), ``DQ`` (``*dtype``, ``[B, Hq, Sq, D_HEAD]``, last dim
contiguous), ``stride_dqz, stride_dqh, stride_dqm``, ``sm_scale`` (fp32), ``N_CTX_Q, SQ_PAD,
D_HEAD, N_HEADS_Q`` (i32), then the packing group ``IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q,
VARLEN_STATUS, STORE_VARLEN_STATUS``; constexprs ``HEAD_DIM`` (bucket), ``BLOCK_M``.
Grid ``(cdiv(Sq, BLOCK_M), Hq, B)``.
"""
import triton
import triton.language as tl

from ..flash.varlen import sequence


# No JIT specialization of the integers (the runtime launches one generic AOT image; see bwd.py).
@triton.jit(do_not_specialize=["stride_dqz", "stride_dqh", "stride_dqm", "N_CTX_Q", "SQ_PAD", "D_HEAD", "N_HEADS_Q",
                               "IS_VARLEN", "N_TOKENS_Q", "STORE_VARLEN_STATUS"])
def attn_bwd_gluon_dq_convert(DQ_ACC, DQ, stride_dqz, stride_dqh, stride_dqm, sm_scale, N_CTX_Q, SQ_PAD, D_HEAD,
                              N_HEADS_Q, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS, STORE_VARLEN_STATUS,
                              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    pid_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    off_z = tl.program_id(2).to(tl.int64)
    q_start, seqlen_q = sequence(tl.program_id(2), N_CTX_Q, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS,
                                 STORE_VARLEN_STATUS)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    ws_row = (off_z * N_HEADS_Q + off_h) * SQ_PAD + offs_m  # int64; < SQ_PAD per head, no mask needed
    acc = tl.load(DQ_ACC + ws_row[:, None] * HEAD_DIM + offs_d[None, :])
    out_mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < D_HEAD)
    dq_rows = DQ + off_z * stride_dqz + off_h * stride_dqh + q_start.to(tl.int64) * stride_dqm
    tl.store(dq_rows + offs_m[:, None] * stride_dqm + offs_d[None, :], (acc * sm_scale).to(DQ.dtype.element_ty),
             mask=out_mask)
