"""ALiBi (BLOOM, MPT): a linear bias ``-slope_h * |i + diag - j|`` per query head, added after the cap
and before the additive bias and the masks.

``i``, ``j`` are positions inside the sequence (packed batches: local to each sequence) and ``diag``
the mask's alignment offset (``mask.diag_offset``: 0 top-left, ``Sk - Sq`` bottom-right), so the bias
is 0 on the diagonal the mask in use is aligned to (FlashAttention's convention for bottom-right).
The slopes are fp32, ``[Hq]`` or ``[B, Hq]`` (``stride_az`` = 0 or Hq): one load per program and
query head.  The kernels work in the exp2 domain, so the slope is taken times ``log2(e)``.
The slopes are constants of the model: no gradient flows to them.
"""
import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def alibi_slope_log2(ALIBI_SLOPES, stride_az, off_z, off_h):
    """Sequence ``off_z``'s slope of query head ``off_h`` times log2(e)."""
    return tl.load(ALIBI_SLOPES + off_z * stride_az + off_h).to(tl.float32) * LOG2E


@triton.jit
def alibi_bias_log2(slope_log2, offs_q, offs_k, diag):
    """``-slope * |i + diag - j|`` (log2 units) for broadcastable query / key positions."""
    return -slope_log2 * tl.abs(offs_q + diag - offs_k).to(tl.float32)
