"""Gluon backward, step 1 of 3: ``attn_bwd_gluon_preprocess`` (plain ``triton.language``; ``ABI.md``).

Per query row (b, h, i), in fp32:

* ``delta = sum_d dO * O`` -> the caller's ``DELTA [B, Hq, Sq]`` (what the portable
  ``attn_bwd_dq`` reads in deterministic mode) and the workspace ``delta2`` (0 on pad rows);
* ``lse2 = LSE * log2(e)`` -> the workspace (+inf on the pad rows ``Sq <= i < SQ_PAD`` and where
  the forward's LSE is +inf, i.e. rows that saw no key: the main kernel's P = exp2(s - lse2) is
  then exactly 0, so those rows get zero gradients);
* with ``ZERO_DQ_ACC`` (runtime, i32): zeroes ``dq_acc`` rows (all ``SQ_PAD`` rows, all
  ``HEAD_DIM`` columns), the fp32 accumulator the main kernel reduce-adds into.

Workspace row of (b, h, i): ``(b * Hq + h) * SQ_PAD + i`` (``Hq`` = the grid's second dimension).
A packed (varlen) batch (``IS_VARLEN`` 1, ``kernels/flash/varlen.py``): ``b`` is the sequence, ``i``
its local row, ``Sq`` its own length (``N_CTX_Q`` the longest); O, dO rows ``start + i`` of the packed
tensors (batch strides 0), LSE/DELTA elements ``(h, start + i)``.

Arguments, in order: ``O, DO`` (``*dtype``, ``[B, Hq, Sq, D_HEAD]``, last dim contiguous),
``stride_oz, stride_oh, stride_om, stride_doz, stride_doh, stride_dom``, ``LSE`` (``*fp32``),
``stride_lz, stride_lh``, ``DELTA`` (``*fp32``), ``stride_deltaz, stride_deltah``, ``LSE2, DELTA2,
DQ_ACC`` (``*fp32`` workspace), ``N_CTX_Q, SQ_PAD, D_HEAD, ZERO_DQ_ACC`` (i32), then the packing
group ``IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS, STORE_VARLEN_STATUS``; constexprs
``HEAD_DIM`` (bucket), ``BLOCK_M`` (divides 128).  Grid ``(SQ_PAD / BLOCK_M, Hq, B)``.
"""
import triton
import triton.language as tl

from ..flash.varlen import sequence

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


# No JIT specialization of the integers (the runtime launches one generic AOT image; see bwd.py).
@triton.jit(do_not_specialize=["stride_oz", "stride_oh", "stride_om", "stride_doz", "stride_doh", "stride_dom",
                               "stride_lz", "stride_lh", "stride_deltaz", "stride_deltah", "N_CTX_Q", "SQ_PAD",
                               "D_HEAD", "ZERO_DQ_ACC", "IS_VARLEN", "N_TOKENS_Q", "STORE_VARLEN_STATUS"])
def attn_bwd_gluon_preprocess(O, DO, stride_oz, stride_oh, stride_om, stride_doz, stride_doh, stride_dom,
                              LSE, stride_lz, stride_lh, DELTA, stride_deltaz, stride_deltah,
                              LSE2, DELTA2, DQ_ACC, N_CTX_Q, SQ_PAD, D_HEAD, ZERO_DQ_ACC,
                              IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS, STORE_VARLEN_STATUS,
                              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    pid_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    off_z = tl.program_id(2).to(tl.int64)
    q_start, seqlen_q = sequence(tl.program_id(2), N_CTX_Q, IS_VARLEN, CU_SEQLENS_Q, N_TOKENS_Q, VARLEN_STATUS,
                                 STORE_VARLEN_STATUS)
    start = q_start.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    in_seq = offs_m < seqlen_q
    tile_mask = in_seq[:, None] & (offs_d[None, :] < D_HEAD)

    o_rows = O + off_z * stride_oz + off_h * stride_oh + start * stride_om
    do_rows = DO + off_z * stride_doz + off_h * stride_doh + start * stride_dom
    o = tl.load(o_rows + offs_m[:, None] * stride_om + offs_d[None, :], mask=tile_mask, other=0.0)
    do = tl.load(do_rows + offs_m[:, None] * stride_dom + offs_d[None, :], mask=tile_mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # 0 on pad rows (zero-filled loads)
    tl.store(DELTA + off_z * stride_deltaz + off_h * stride_deltah + start + offs_m, delta, mask=in_seq)
    lse = tl.load(LSE + off_z * stride_lz + off_h * stride_lh + start + offs_m, mask=in_seq, other=float("inf"))

    ws_row = (off_z * tl.num_programs(1) + off_h) * SQ_PAD + offs_m  # int64
    tl.store(DELTA2 + ws_row, delta)
    tl.store(LSE2 + ws_row, lse * LOG2E)  # +inf stays +inf
    if ZERO_DQ_ACC != 0:
        tl.store(DQ_ACC + ws_row[:, None] * HEAD_DIM + offs_d[None, :], tl.zeros([BLOCK_M, HEAD_DIM], tl.float32))
