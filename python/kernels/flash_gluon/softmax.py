"""Online softmax (FlashAttention-2) in the exp2 domain, on Gluon register tensors.

Same numerics and the same no-key convention as the portable ``kernels/flash/softmax.py``,
with one difference in where the scale is applied: the raw scores ``s = Q K^T`` arrive
*unscaled*, and ``qk_scale = sm_scale * log2(e)`` is folded into the row max
(``max(s) * qk_scale``, valid because ``qk_scale > 0``) and into the exponent
(``exp2(s * qk_scale - m)``, one FMA per score).  That saves a full multiply pass over the
``[64, BLOCK_N]`` score tile, which matters on Hopper where the softmax, not the tensor
cores, bounds the forward.

Running state per query row: ``m`` (max of the scaled scores seen so far, log2 domain) and
``l`` (sum of ``exp2(s * qk_scale - m)``).  Rows that have seen no visible key keep
``m = -inf`` and ``l = 0``; both helpers guard that case so it yields zeros, never NaN.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

LN2: gl.constexpr = gl.constexpr(0.6931471805599453)


@gluon.jit
def online_softmax_step(s, m_i, l_i, qk_scale):
    """Fold one block of raw scores ``s`` ([rows, BLOCK_N] fp32, -inf = masked) into ``(m_i, l_i)``.

    Returns ``(p, alpha, m_new, l_new)``: ``p = exp2(s * qk_scale - m_new)`` (unnormalised
    probabilities for the PV product), ``alpha = exp2(m_i - m_new)`` the factor the caller
    must rescale its accumulator by, and the updated row state.
    """
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    # A row with every score masked so far has m_new = -inf: subtract 0 instead, so
    # p = exp2(-inf) = 0 and alpha = 0 rather than exp2(-inf - -inf) = NaN.
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_safe, 1))
    alpha = gl.exp2(m_i - m_safe)
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@gluon.jit
def softmax_epilogue(acc, m_i, l_i):
    """Normalise the accumulator and compute the natural-log LSE per row.

    ``acc`` is ``[rows, HEAD_DIM]`` in its MMA layout, ``m_i``/``l_i`` are ``[rows]`` in the
    row layout of the score tile (the same rows per thread, so the conversion to the
    accumulator's row layout is free).  Returns ``(o, lse)``: ``o = acc / l`` (fp32) and
    ``lse = ln(sum_j exp(sm_scale * q.k_j))``.  A row that saw no key gets ``o = 0`` and
    ``lse = +inf`` (FlashAttention-2's convention: the backward's ``exp(s - lse)`` is then 0).
    """
    has_key = l_i > 0.0
    l_safe = gl.where(has_key, l_i, 1.0)
    inv_l = gl.where(has_key, 1.0 / l_safe, 0.0)
    row_layout: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    o = acc * gl.expand_dims(gl.convert_layout(inv_l, row_layout), 1)
    lse = gl.where(has_key, (m_i + gl.log2(l_safe)) * LN2, float("inf"))
    return o, lse
