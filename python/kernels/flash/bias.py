"""Additive attention bias: ``s = sm_scale * q.k + bias`` (natural-log units), before the masks.

The bias is a ``[B, Hq, N_CTX_Q, N_CTX_K]`` view in the input dtype with element
strides ``(stride_bz, stride_bh, stride_bm, 1)`` (i64), 0 in a broadcast dimension
(batch, heads, rows), indexed by ``(b, h, local i, local j)``.  The kernels work
in the exp2 domain, so the loaded bias is multiplied by ``log2(e)``.
"""
import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def load_bias_log2(bias_base, offs_q, offs_k, stride_bm, mask):
    """``bias[i, j] * log2(e)`` in fp32 for broadcastable ``offs_q``/``offs_k`` (``[M,1]``/``[1,N]`` or
    transposed), 0 where ``mask`` is False."""
    b = tl.load(bias_base + offs_q * stride_bm + offs_k, mask=mask, other=0.0)
    return b.to(tl.float32) * LOG2E
