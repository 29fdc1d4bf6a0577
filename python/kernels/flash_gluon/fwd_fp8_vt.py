"""Vᵀ for the fp8 forward (``fwd_fp8.py``): ``VT[b, h, d, s] = V[b, h, s, d]``, plain ``triton.language``.

wgmma reads an 8-bit B operand only K-major, and in ``O += P V`` the K dimension is the key, so
the fp8 forward takes V transposed.  This kernel writes it into a caller buffer whose key rows
are padded (the row stride ``stride_vts`` a multiple of 16 bytes, as TMA needs); the pad columns
are never read (the forward's descriptor ends at ``N_CTX_K``).  Grid ``(cdiv(N_CTX_K, BLOCK_S),
Hk, B)``; each program moves a ``[BLOCK_S, HEAD_DIM]`` tile, masked at the key tail and at the
real head dim ``D_HEAD``.
"""
import triton
import triton.language as tl


@triton.jit
def transpose_v_fp8(V, stride_vz, stride_vh, stride_vs, VT, stride_vtz, stride_vth, stride_vtd,
                    N_CTX_K, D_HEAD, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    s0 = tl.program_id(0) * BLOCK_S
    off_h = tl.program_id(1).to(tl.int64)
    off_z = tl.program_id(2).to(tl.int64)
    offs_s = s0 + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    inside = (offs_s[:, None] < N_CTX_K) & (offs_d[None, :] < D_HEAD)
    tile = tl.load(V + off_z * stride_vz + off_h * stride_vh + offs_s[:, None].to(tl.int64) * stride_vs
                   + offs_d[None, :], mask=inside)
    tl.store(VT + off_z * stride_vtz + off_h * stride_vth + offs_d[:, None].to(tl.int64) * stride_vtd
             + offs_s[None, :], tl.trans(tile), mask=tl.trans(inside))
