"""Logit soft-capping (Gemma 2, Grok): ``s = cap * tanh(sm_scale * q.k / cap)``, before bias and masks.

Scores are held in the exp2 domain (``s2 = s * log2(e)``, ``softmax.py``), and capping commutes
with that scale: ``cap * tanh(u / cap) * log2(e) = cap2 * tanh(s2 / cap2)`` with
``cap2 = cap * log2(e)``.  ``tanh(x) = 1 - 2 / (exp(2x) + 1)`` is written with ``exp2`` (no
libdevice call, so the same code serves every arch); it saturates to +-1 without NaN when
``exp2`` overflows or underflows.  ``cap`` is the runtime ``softcap`` argument (> 0; the runtime
checks it).

Backward: ``d s / d(sm_scale * q.k) = 1 - tanh^2``, so ``dS`` is multiplied by ``1 - t * t`` where
``t`` is the tanh the scores were capped with (``softcap_grad``).  The forward's LSE is of the
capped scores, so P recomputes exactly.
"""
import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def soft_cap(s, softcap):
    """Capped scores and the tanh they came from: ``(cap2 * t, t)``, ``t = tanh(s / cap2)``, where ``s``
    is ``sm_scale * q.k`` in the exp2 domain and ``cap2 = softcap * log2(e)``.  The tanh's
    ``exp(2 * s / cap2)`` is ``exp2(2 * s / softcap)``."""
    t = 1.0 - 2.0 / (tl.math.exp2(s * (2.0 / softcap)) + 1.0)
    return t * (softcap * LOG2E), t


@triton.jit
def softcap_grad(ds, t):
    """The gradient through the cap: ``dS_raw = dS * (1 - t^2)``."""
    return ds * (1.0 - t * t)
