"""Attention sinks (gpt-oss): a learned logit per query head that joins every row's softmax
normaliser as one more "key" with no value.

With sink logit ``t_h`` (fp32, the scaled-score domain: compared with ``sm_scale * q.k``), row i of
head h has ``P_ij = exp(s_ij - LSE_i)`` over its visible keys and ``LSE_i = ln(exp(t_h) +
sum_j exp(s_ij))``: the probabilities sum to ``1 - exp(t_h - LSE_i)``, the part the sink absorbs.
A row that sees no key gets O = 0 and LSE = t_h.

Forward: ``fold_sink`` adds the sink to the online-softmax state after the key loops.  Backward:
dQ, dK, dV need nothing more than the LSE (which includes the sink); the sink's own gradient,
``dt_h = -sum_{z,i} exp(t_h - LSE_zhi) * delta_zhi`` (``delta = rowsum(dO * O)``, the softmax
gradient of a column whose dP is 0), is summed by ``attn_bwd_dsink`` (``bwd_dsink.py``) in a fixed
order: no atomics.
"""
import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def sink_log2(SINKS, off_h):
    """Query head ``off_h``'s sink logit times log2(e) (the kernels' exp2 domain)."""
    return tl.load(SINKS + off_h).to(tl.float32) * LOG2E


@triton.jit
def fold_sink(acc, m_i, l_i, sink):
    """One more key of score ``sink`` (log2 domain) and value 0 into ``(acc, m_i, l_i)``.

    Returns the rescaled ``(acc, m_new, l_new)``.  A ``-inf`` sink leaves the state as it was (an
    empty row stays empty: ``m = -inf``, ``l = 0``)."""
    m_new = tl.maximum(m_i, sink)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)
    l_new = l_i * alpha + tl.math.exp2(sink - m_safe)
    return acc * alpha[:, None], m_new, l_new
