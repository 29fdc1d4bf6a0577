"""Gluon backward after a head split: ``attn_bwd_gluon_dkdv_convert`` (plain ``triton.language``; ``ABI.md``).

With ``HEAD_SPLIT`` > 1 the main kernel (``bwd.py``, "Head split") leaves each key block's dK and dV as
``HEAD_SPLIT`` fp32 partials, one per part of the GQA group's query heads, in the workspace:
``[HEAD_SPLIT, 2 (dK, dV), B, Hk, Sk, HEAD_DIM]`` (dK already scaled by ``sm_scale``).  This kernel sums
them in part order (so the result does not depend on which CTA finished first) and casts the sums to
the input dtype.  Only keys ``< Sk`` and columns ``< D_HEAD`` are written.  Fixed-length batches only.

Arguments, in order: ``DKV_PARTIALS`` (``*fp32``), ``DK, DV`` (``*dtype``, ``[B, Hk, Sk, D_HEAD]``, last dim
contiguous), ``stride_dkz, stride_dkh, stride_dkn, stride_dvz, stride_dvh, stride_dvn``, ``N_CTX_K, D_HEAD,
HEAD_SPLIT`` (i32); constexprs ``HEAD_DIM`` (bucket), ``BLOCK_N``.  Grid ``(cdiv(Sk, BLOCK_N), Hk, B)``.
"""
import triton
import triton.language as tl


# No JIT specialization of the integers (the runtime launches one generic AOT image; see bwd.py).
@triton.jit(do_not_specialize=["stride_dkz", "stride_dkh", "stride_dkn", "stride_dvz", "stride_dvh", "stride_dvn",
                               "N_CTX_K", "D_HEAD", "HEAD_SPLIT"])
def attn_bwd_gluon_dkdv_convert(DKV_PARTIALS, DK, DV, stride_dkz, stride_dkh, stride_dkn, stride_dvz, stride_dvh,
                                stride_dvn, N_CTX_K, D_HEAD, HEAD_SPLIT,
                                HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_n = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    off_z = tl.program_id(2).to(tl.int64)
    n_hk = tl.num_programs(1).to(tl.int64)
    n_b = tl.num_programs(2).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    in_seq = offs_n < N_CTX_K
    per_head = N_CTX_K.to(tl.int64) * HEAD_DIM
    tile = offs_n.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
    head = off_z * n_hk + off_h  # (b, hk) among one tensor's B * Hk heads
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    for part in range(HEAD_SPLIT):  # in part order: the same sum every run
        dk_part = DKV_PARTIALS + ((part * 2) * n_b * n_hk + head) * per_head
        dv_part = DKV_PARTIALS + ((part * 2 + 1) * n_b * n_hk + head) * per_head
        dk += tl.load(dk_part + tile, mask=in_seq[:, None], other=0.0)
        dv += tl.load(dv_part + tile, mask=in_seq[:, None], other=0.0)
    out_mask = in_seq[:, None] & (offs_d[None, :] < D_HEAD)
    dk_rows = DK + off_z * stride_dkz + off_h * stride_dkh
    dv_rows = DV + off_z * stride_dvz + off_h * stride_dvh
    rows = offs_n.to(tl.int64)[:, None]
    tl.store(dk_rows + rows * stride_dkn + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=out_mask)
    tl.store(dv_rows + rows * stride_dvn + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=out_mask)
