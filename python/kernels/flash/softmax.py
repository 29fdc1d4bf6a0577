"""Online softmax (FlashAttention-2) in the exp2 domain.

Scores arrive already multiplied by ``sm_scale * log2(e)``, so
``exp(sm_scale * qk - m) == exp2(s - m')`` and the kernel pays one multiply per
score.  Running state per query row: ``m`` (max of the scaled scores seen so
far, log2 domain) and ``l`` (sum of ``exp2(s - m)``).

Rows that have seen no visible key keep ``m = -inf`` and ``l = 0``; both helpers
guard that case so it yields zeros, never NaN.
"""
import triton
import triton.language as tl

LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


@triton.jit
def online_softmax_step(m_i, l_i, s):
    """Fold one block of scaled scores ``s`` ([BLOCK_M, BLOCK_N], log2 domain, -inf = masked).

    Returns ``(p, alpha, m_new, l_new)``: ``p = exp2(s - m_new)`` (unnormalised
    probabilities for the PV product), ``alpha = exp2(m_i - m_new)`` the factor
    the caller must rescale its accumulator by, and the updated row state.
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row with every score masked so far has m_new = -inf: subtract 0 instead,
    # so p = exp2(-inf) = 0 and alpha = 0 rather than exp2(-inf - -inf) = NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new


@triton.jit
def softmax_epilogue(acc, m_i, l_i):
    """Normalise the accumulator and compute the log-sum-exp per row.

    Returns ``(o, lse)``: ``o = acc / l`` (fp32) and ``lse = ln(sum_j exp(sm_scale * q.k_j))``
    in natural log.  A row that saw no key gets ``o = 0`` and ``lse = +inf``
    (FlashAttention-2's convention: the backward's ``exp(s - lse)`` is then 0).
    """
    has_key = l_i > 0.0
    inv_l = tl.where(has_key, 1.0 / tl.where(has_key, l_i, 1.0), 0.0)
    o = acc * inv_l[:, None]
    lse = tl.where(has_key, (m_i + tl.math.log2(tl.where(has_key, l_i, 1.0))) * LN2, float("inf"))
    return o, lse


@triton.jit
def softmax_recompute(s, lse_log2):
    """Backward: the normalised probabilities ``P = exp2(s - lse * log2(e))`` from the forward's LSE.

    ``s`` are the scores scaled by ``sm_scale * log2(e)`` (the forward's domain),
    ``lse_log2`` the forward's natural-log LSE times ``log2(e)``, broadcast to
    ``s``.  A row that saw no key has ``lse = +inf``, so its P is
    ``exp2(finite - inf) = 0`` -- no NaN, and every gradient it feeds is 0.
    """
    return tl.math.exp2(s - lse_log2)


@triton.jit
def softmax_backward(p, dp, delta):
    """``dS = P * (dP - delta)`` with ``delta = rowsum(dO * O)`` (= rowsum(P * dP)), all fp32."""
    return p * (dp - delta)
