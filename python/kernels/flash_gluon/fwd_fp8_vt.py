"""Vᵀ for the fp8 forward (``fwd_fp8.py``), plain ``triton.language``: ``transpose_v_fp8``.

wgmma reads an 8-bit B operand only K-major, and in ``O += P V`` the K dimension is the key, so
the fp8 forward takes V transposed, ``VT[b, h, d, k]``, with its keys in the order the forward's
P operand uses (``fwd.py``, ``_p_to_operand``): within each group of 32 keys, column ``k`` (bits
``i1 t1 t0 i0 e``) holds key ``c`` (bits ``i1 i0 t1 t0 e``).  That order lets P go from the score
registers to the operand registers without moving values between threads.

The key dimension is padded to ``KEYS_PAD = cdiv(N_CTX_K, 32) * 32`` (the forward's descriptor
covers it: a permuted group can put a real key past ``N_CTX_K``); pad keys are written as zeros,
which meet P = 0.  Grid ``(cdiv(KEYS_PAD, BLOCK_N), Hk, B)``; each program writes a
``[HEAD_DIM, BLOCK_N]`` strip (``BLOCK_N`` a multiple of 32), rows past ``D_HEAD`` left alone.
"""
import triton
import triton.language as tl


@triton.jit
def _key_of_column(k):
    """The key stored in column ``k``: within its 32-key group, bits ``i1 t1 t0 i0 e`` -> ``i1 i0 t1 t0 e``
    (bits 1-3 move, the others stay)."""
    return (k - (k & 0b01110)) | ((k & 0b00010) << 2) | ((k & 0b01100) >> 1)


# No JIT specialization of the free integers (the runtime launches one generic AOT image; see bwd.py).
@triton.jit(do_not_specialize=["N_CTX_K", "KEYS_PAD"])
def transpose_v_fp8(V, stride_vz, stride_vh, stride_vn, VT, stride_vtz, stride_vth, stride_vtd,
                    N_CTX_K, KEYS_PAD, D_HEAD, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    tl.static_assert(BLOCK_N % 32 == 0, "whole 32-key groups")
    s0 = tl.program_id(0) * BLOCK_N
    off_h = tl.program_id(1).to(tl.int64)
    off_z = tl.program_id(2).to(tl.int64)
    cols = s0 + tl.arange(0, BLOCK_N)                     # destination columns
    keys = s0 + _key_of_column(tl.arange(0, BLOCK_N))     # the key each column holds
    offs_d = tl.arange(0, HEAD_DIM)
    d_ok = offs_d[None, :] < D_HEAD
    tile = tl.load(V + off_z * stride_vz + off_h * stride_vh + keys[:, None].to(tl.int64) * stride_vn + offs_d[None, :],
                   mask=(keys[:, None] < N_CTX_K) & d_ok, other=0.0)
    tl.store(VT + off_z * stride_vtz + off_h * stride_vth + offs_d[:, None].to(tl.int64) * stride_vtd + cols[None, :],
             tl.trans(tile), mask=tl.trans((cols[:, None] < KEYS_PAD) & d_ok))
