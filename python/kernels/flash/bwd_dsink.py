"""Attention-sink gradient: ``attn_bwd_dsink``.

``DSINK[h] = -sum_{z, i} exp(SINKS[h] - LSE[z, h, i]) * DELTA[z, h, i]`` (``sinks.py``), in fp32,
one program per query head walking every sequence's rows in order, so the sum is the same from
run to run.  It reads what the forward (LSE) and ``attn_bwd_preprocess`` (DELTA) wrote: 8 bytes
per query row and head.

Arguments, in order: ``LSE, DELTA, SINKS, DSINK``; strides (lse: z/h; delta: z/h); ``N_BATCH,
N_CTX_Q, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS, STORE_VARLEN_STATUS``; constexpr
``BLOCK_M``.

Tensors: ``LSE``, ``DELTA`` fp32 ``[B, Hq, N_CTX_Q]`` (varlen: ``[1, Hq, total_q]``, ``varlen.py``);
``SINKS``, ``DSINK`` fp32 ``[Hq]`` (DSINK is overwritten).  Rows with ``LSE = +inf`` (no key and no
sink: not produced with sinks) contribute 0.

Grid: ``(Hq,)``.
"""
import triton
import triton.language as tl

from .varlen import sequence


@triton.jit
def attn_bwd_dsink(LSE, DELTA, SINKS, DSINK,
                   stride_lz, stride_lh, stride_deltaz, stride_deltah,
                   N_BATCH, N_CTX_Q, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS, STORE_VARLEN_STATUS,
                   BLOCK_M: tl.constexpr):
    off_h = tl.program_id(0).to(tl.int64)
    sink = tl.load(SINKS + off_h).to(tl.float32)
    offs = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    for z in range(0, N_BATCH):
        q_start, seqlen_q = sequence(z, N_CTX_Q, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS,
                                     STORE_VARLEN_STATUS)
        lse_base = LSE + z * stride_lz + off_h * stride_lh + q_start
        delta_base = DELTA + z * stride_deltaz + off_h * stride_deltah + q_start
        for start in range(0, seqlen_q, BLOCK_M):
            rows = start + offs
            inside = rows < seqlen_q
            lse = tl.load(lse_base + rows, mask=inside, other=float("inf"))
            delta = tl.load(delta_base + rows, mask=inside, other=0.0)
            acc += tl.where(inside, tl.exp(sink - lse) * delta, 0.0)
    tl.store(DSINK + off_h, -tl.sum(acc, 0))
