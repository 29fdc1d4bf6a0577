"""attn_fwd and the backward kernels under the Triton interpreter (TRITON_INTERPRET=1), numpy only, no GPU.

fp16 and fp32 are tested here: bf16 ``tl.dot`` is wrong in the Triton
interpreter (an upstream limitation, the interpreter has no bf16 matmul), so
bf16 is covered by the GPU tests.  The interpreter ignores ``input_precision``
(fp32 dots are plain fp32 matmuls), so TF32 is a GPU-test matter too.

Error bounds: ``max|out - ref64| <= k * max|naive - ref64| + floor`` where
``ref64`` is float64 numpy, ``naive`` the same math in the input dtype with
fp32 accumulation (P, dS and every product rounded to the input dtype), ``k = 3``
for O and ``k = 5`` for the gradients (and dBias), and
``floor = tol * max(1, max|ref64|)`` with ``tol`` 1e-3 for fp16, 1e-5 for fp32.
Dropout references use the numpy Philox model of the documented counter layout
(``philox_model.py``).
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import unittest  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

import _paths  # noqa: E402,F401
import rules  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from kernels.flash.bwd_dbias import attn_bwd_dbias  # noqa: E402
from kernels.flash.bwd_dkdv import attn_bwd_dkdv  # noqa: E402
from kernels.flash.bwd_dq import attn_bwd_dq  # noqa: E402
from kernels.flash.bwd_dsink import attn_bwd_dsink  # noqa: E402
from kernels.flash.bwd_preprocess import attn_bwd_preprocess  # noqa: E402
from kernels.flash.fwd import attn_fwd  # noqa: E402
from kernels.flash.mask import key_block_bounds, query_block_bounds  # noqa: E402
from philox_model import keep_mask, threshold  # noqa: E402


def _quiet_interpreter():
    # The interpreter converts 1-element arrays to Python ints for loop bounds (upstream, Triton 3.6).
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"triton\.runtime\.interpreter")


_quiet_interpreter()


def setUpModule():
    _quiet_interpreter()  # again inside the unittest runner, which resets the warning filters


#: "Unbounded" window side, as the runtime passes it.
UNBOUNDED = 2 ** 30
#: Bucket for a real head dim: the smallest compiled one (a power of two) >= max(D, 16).
BUCKETS = rules.HEAD_DIMS


def bucket(d):
    return next(b for b in BUCKETS if b >= d)


class _DType:
    """What the interpreter reads off ``tensor.dtype``: ``str()`` must end in a Triton-known name.

    Instances are interned (one per name, never freed): Triton's native argument
    specialisation caches the type string per dtype *object*, so a dtype object
    freed and another allocated at the same address would inherit a stale type
    (e.g. an fp16 tensor read as fp32 -- wrong results and heap corruption).
    """

    _interned = {}

    def __new__(cls, name):
        if name not in cls._interned:
            obj = super().__new__(cls)
            obj.name = name
            cls._interned[name] = obj
        return cls._interned[name]

    def __str__(self):
        return "torch." + self.name

    __repr__ = __str__


class NpTensor:
    """Minimal torch.Tensor look-alike over a numpy array (host memory is 'device' memory in the interpreter).

    The array may be a strided view: data_ptr() is the address of its first element
    and the kernel receives its element strides explicitly.
    """

    def __init__(self, array):
        self.a = array
        self.dtype = _DType(array.dtype.name)
        self.device = "cpu"

    def data_ptr(self):
        return self.a.__array_interface__["data"][0]

    def untyped_storage(self):
        return self

    def cpu(self):
        return self

    def new_empty(self, *args, **kwargs):
        return self

    def set_(self, *args, **kwargs):
        return self

    def storage_offset(self):
        return 0

    def size(self):
        return self.a.shape

    def stride(self):
        return tuple(s // self.a.itemsize for s in self.a.strides)

    def copy_(self, other):
        return self




class Mask:
    """A mask as the runtime encodes it: (WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT); no mask = N_CTX_Q + N_CTX_K."""

    def __init__(self, kind="none", left=UNBOUNDED, right=UNBOUNDED, align="tl"):
        self.kind, self.left, self.right, self.align = kind, left, right, align
        if kind == "causal":
            self.left, self.right = UNBOUNDED, 0

    def args(self, n_ctx_q, n_ctx_k):
        """``(WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT)`` for a launch with these (max) lengths."""
        if self.kind == "none":
            return n_ctx_q + n_ctx_k, n_ctx_q + n_ctx_k, 0
        return self.left, self.right, int(self.align == "br")

    def visible(self, sq, sk):
        """``[sq, sk]`` bool for one sequence of these lengths."""
        i = np.arange(sq)[:, None]
        j = np.arange(sk)[None, :]
        if self.kind == "none":
            return np.ones((sq, sk), bool)
        diag = sk - sq if self.align == "br" else 0
        return (j >= i + diag - self.left) & (j <= i + diag + self.right)

    def __repr__(self):
        if self.kind == "none":
            return "none"
        if self.kind == "causal":
            return f"causal-{self.align}"
        return f"window({self.left},{self.right})-{self.align}"


class Dropout:
    """Dropout arguments: drop probability, seed, ``*PHILOX_OFFSET`` and ``philox_offset_base``."""

    def __init__(self, p, seed=1234, offset=5, base=7):
        self.p, self.seed, self.offset, self.base = p, seed, offset, base
        self.seed_t = NpTensor(np.array([seed], np.int64))
        self.offset_t = NpTensor(np.array([offset], np.int64))

    @property
    def scale(self):
        return 1.0 / (1.0 - self.p)

    def args(self):
        return (threshold(self.p), self.scale, self.seed_t, self.offset_t, self.base)

    def keep(self, B, Hq, n_ctx_q, n_ctx_k):
        return keep_mask(B, Hq, n_ctx_q, n_ctx_k, self.seed, self.offset + self.base, self.p)

    def __repr__(self):
        return f"dropout(p={self.p})"


_DUMMY = {}


def dummy(dtype=np.float32):
    """A small valid buffer for an unused pointer argument (the runtime passes null)."""
    if dtype not in _DUMMY:
        _DUMMY[dtype] = NpTensor(np.zeros(16, dtype))
    return _DUMMY[dtype]


NO_DROPOUT = (0, 1.0, None, None, 0)


def _expand(x, group):
    """K/V ``[B, Hk, S, D]`` -> ``[B, Hk * group, S, D]`` (query head h reads K/V head h // group)."""
    return np.repeat(x, group, axis=1)


def _mm(a, b, dt, naive):
    """Matrix product: float64, or ``dt`` inputs with fp32 accumulation rounded to ``dt``."""
    if naive:
        return (a.astype(np.float32) @ b.astype(np.float32)).astype(dt)
    return a @ b


def reference(q, k, v, do, vis, sm_scale, bias=None, keep=None, dscale=1.0, naive=False, softcap=0.0, sinks=None):
    """Forward and backward of one (non-packed) batch ``[B, H, S, D]``; ``vis`` ``[Sq, Sk]`` bool,
    ``bias`` broadcastable to ``[B, Hq, Sq, Sk]``, ``keep`` ``[B, Hq, Sq, Sk]`` bool (dropout).
    ``naive``: input-dtype math with fp32 accumulation, else float64.  ``softcap`` > 0 caps the scaled
    scores at ``softcap * tanh(s / softcap)`` before bias and mask.  ``sinks``: fp32 ``[Hq]`` sink
    logits in every row's normaliser (a row without keys: O = 0, LSE = its sink).

    Returns ``o, lse, dq, dk, dv, ds`` (float64; dk/dv summed over each GQA group; ds = dBias unreduced).
    """
    dt = q.dtype.type if naive else np.float64
    group = q.shape[1] // k.shape[1]
    q, do = q.astype(dt), do.astype(dt)
    ke, ve = _expand(k, group).astype(dt), _expand(v, group).astype(dt)
    sq, sk = q.shape[2], k.shape[2]
    s = (_mm(q, ke.swapaxes(-1, -2), dt, naive) * dt(sm_scale)).astype(dt)
    tanh = None
    if softcap:
        tanh = np.tanh(s / dt(softcap)).astype(dt)
        s = (dt(softcap) * tanh).astype(dt)
    if bias is not None:
        s = (s + bias.astype(dt)).astype(dt)
    s = np.where(vis, s, -np.inf).astype(dt)
    has_key = np.broadcast_to(vis.any(-1)[:, None], s.shape[:-1] + (1,))
    m = np.where(has_key, s.max(-1, keepdims=True, initial=-np.inf), 0).astype(dt)
    if sinks is not None:
        t = np.asarray(sinks, np.float32).astype(dt).reshape(1, -1, 1, 1)
        m = np.where(has_key, np.maximum(m, t), t).astype(dt)
    e = np.where(vis, np.exp(s - m), 0).astype(dt)
    l_sum = e.sum(-1, keepdims=True, dtype=np.float32 if naive else np.float64)
    if sinks is not None:
        l_sum = l_sum + np.exp(t - m).astype(l_sum.dtype)
        has_key = np.ones_like(has_key)  # the sink is in every row
    p = np.where(has_key, e / np.where(has_key, l_sum, 1).astype(dt), 0).astype(dt)
    lse = np.where(has_key, m.astype(np.float64) + np.log(np.where(has_key, l_sum, 1).astype(np.float64)),
                   np.inf)[..., 0]
    pd = p if keep is None else np.where(keep, p * dt(dscale), 0).astype(dt)
    o = _mm(pd, ve, dt, naive)
    dv = _mm(pd.swapaxes(-1, -2), do, dt, naive)
    dp = _mm(do, ve.swapaxes(-1, -2), dt, naive)
    if keep is not None:
        dp = np.where(keep, dp * dt(dscale), 0).astype(dt)
    delta = (do.astype(np.float64) * o.astype(np.float64)).sum(-1, keepdims=True).astype(dt)
    ds = (p * (dp - delta)).astype(dt)
    if softcap:
        ds = (ds * (1 - tanh * tanh)).astype(dt)
    dq = (_mm(ds, ke, dt, naive) * dt(sm_scale)).astype(dt)
    dk = (_mm(ds.swapaxes(-1, -2), q, dt, naive) * dt(sm_scale)).astype(dt)
    B, Hk = k.shape[:2]
    dk = dk.astype(np.float64).reshape(B, Hk, group, sk, k.shape[-1]).sum(2)
    dv = dv.astype(np.float64).reshape(B, Hk, group, sk, v.shape[-1]).sum(2)
    return [x.astype(np.float64) for x in (o, lse, dq, dk, dv, ds)]


def sink_grad(sinks, lse, delta):
    """The sinks' gradient ``-sum_{z,i} exp(sink_h - LSE_zhi) * delta_zhi`` (float64, ``[Hq]``)."""
    t = np.asarray(sinks, np.float64).reshape(1, -1, 1)
    return -(np.exp(t - lse.astype(np.float64)) * delta.astype(np.float64)).sum(axis=(0, 2))


def alibi_bias(slopes, B, Hq, sq, sk, mask):
    """ALiBi as a float64 additive bias ``[B, Hq, sq, sk]``: ``-slope * |i + diag - j|`` with the mask's
    alignment offset (bottom-right: ``sk - sq``; top-left and no mask: 0, as the runtime passes it)."""
    diag = sk - sq if (mask.kind != "none" and mask.align == "br") else 0
    dist = np.abs(np.arange(sq)[:, None] + diag - np.arange(sk)[None, :]).astype(np.float64)
    s = np.broadcast_to(np.asarray(slopes, np.float64).reshape(-1, Hq), (B, Hq))
    return -s[:, :, None, None] * dist


def _strides(*tensors, n=3):
    return [s for t in tensors for s in t.stride()[:n]]


class Launch:
    """One problem in the kernels' terms: ``[B?, H, S, D]`` views (packed when varlen), lengths, groups."""

    def __init__(self, q, k, v, mask, sm_scale, bias=None, dropout=None, cu_q=None, cu_k=None, max_lens=None,
                 softcap=0.0, alibi=None, sinks=None):
        self.q, self.k, self.v = q, k, v
        # Attention sinks, fp32 [Hq].
        self.sinks = sinks
        self.tsinks = NpTensor(np.ascontiguousarray(sinks, np.float32)) if sinks is not None else dummy()
        self.softcap = softcap
        # ALiBi slopes, fp32 [Hq] or [B, Hq]: the pointer and its batch stride (0 for [Hq]).
        self.alibi = alibi
        self.talibi = NpTensor(np.ascontiguousarray(alibi, np.float32)) if alibi is not None else dummy()
        self.stride_az = (alibi.shape[-1] if alibi.ndim == 2 else 0) if alibi is not None else 0
        self.dtype = q.dtype
        self.mask, self.sm_scale, self.dropout = mask, sm_scale, dropout
        self.varlen = cu_q is not None
        # The status word the kernels OR clamped offsets into (varlen.py), zeroed per launch.
        self.status = np.zeros(1, np.int32)
        if self.varlen:
            self.B = len(cu_q) - 1
            self.sq = np.diff(cu_q)
            self.sk = np.diff(cu_k)
            self.n_ctx_q, self.n_ctx_k = max_lens or (int(self.sq.max()), int(self.sk.max()))
            self.cu = (NpTensor(np.asarray(cu_q, np.int32)), NpTensor(np.asarray(cu_k, np.int32)))
            self.packing = (q.shape[2], k.shape[2], NpTensor(self.status), 1)
        else:
            self.B = q.shape[0]
            self.n_ctx_q, self.n_ctx_k = q.shape[2], k.shape[2]
            self.cu = (dummy(np.int32), dummy(np.int32))
            self.packing = (0, 0, dummy(np.int32), 0)
        self.Hq, self.Hk, self.D = q.shape[1], k.shape[1], q.shape[3]
        # V's head dim; where it differs from Q/K's the kernels take its bucket (HEAD_DIM_V), as the
        # runtime names the optional axis head_dim_v.
        self.Dv = v.shape[3]
        self.head_dim_v = bucket(self.Dv) if self.Dv != self.D else 0
        self.bias = bias
        self.tbias = NpTensor(bias) if bias is not None else dummy(self.dtype)

    def st(self, *tensors):
        """z/h/row strides; a packed (varlen) batch has batch stride 0, as the runtime passes it."""
        out = _strides(*tensors)
        if self.varlen:
            out[0::3] = [0] * len(tensors)
        return out

    def attention_args(self):
        return (self.n_ctx_q, self.n_ctx_k, self.D, self.Hq // self.Hk, *self.mask.args(self.n_ctx_q, self.n_ctx_k),
                int(self.varlen), *self.cu, *self.packing)

    def dropout_args(self):
        return self.dropout.args() if self.dropout else (0, 1.0, dummy(np.int64), dummy(np.int64), 0)

    def bias_strides(self):
        return _strides(self.tbias) if self.bias is not None else [0, 0, 0]

    def constexprs(self, **blocks):
        return dict(HEAD_DIM=bucket(self.D), DROPOUT=self.dropout is not None, ALLOW_TF32=False, **blocks)

    def score_constexprs(self, **blocks):
        """The constexprs of the kernels that compute scores (fwd, dK/dV, dQ): plus ``SOFTCAP``, ``HAS_ALIBI``,
        ``HEAD_DIM_V``."""
        return dict(self.constexprs(**blocks), SOFTCAP=self.softcap > 0, HAS_ALIBI=self.alibi is not None,
                    HEAD_DIM_V=self.head_dim_v)

    def fwd_constexprs(self, **blocks):
        """``attn_fwd``'s constexprs: the score ones plus ``HAS_SINKS``."""
        return dict(self.score_constexprs(**blocks), HAS_SINKS=self.sinks is not None)

    def lse_shape(self):
        return (1, self.Hq, self.q.shape[2]) if self.varlen else (self.B, self.Hq, self.n_ctx_q)

    def lse_strides(self, t):
        s = t.stride()[:2]
        return (0, s[1]) if self.varlen else s

    def fwd(self, block_m, block_n, store_lse=1, store_philox=0):
        o = np.full(self.q.shape[:3] + (self.Dv,), np.nan, self.dtype)
        lse = np.full(self.lse_shape(), np.nan, np.float32)
        self.philox_out = (np.full(1, -1, np.int64), np.full(1, -1, np.int64))
        tq, tk, tv, to, tlse = (NpTensor(x) for x in (self.q, self.k, self.v, o, lse))
        grid = (triton.cdiv(self.n_ctx_q, block_m), self.Hq, self.B)
        attn_fwd[grid](tq, tk, tv, to, tlse, self.tbias, self.talibi, self.tsinks, self.sm_scale, self.softcap,
                       *self.st(tq, tk, tv, to), *self.lse_strides(tlse), *self.bias_strides(), self.stride_az,
                       store_lse,
                       *self.attention_args(), *self.dropout_args(),
                       NpTensor(self.philox_out[0]), NpTensor(self.philox_out[1]), store_philox, self.Dv,
                       HAS_BIAS=self.bias is not None, **self.fwd_constexprs(BLOCK_M=block_m, BLOCK_N=block_n))
        return o, lse

    def bwd(self, o, lse, do, blocks_dkdv, blocks_dq, block_pre=16):
        """preprocess + dkdv + dq; DELTA, DQ, DK, DV are NaN-poisoned first."""
        delta = np.full(self.lse_shape(), np.nan, np.float32)
        dq = np.full(self.q.shape, np.nan, self.dtype)
        dk = np.full(self.k.shape, np.nan, self.dtype)
        dv = np.full(self.v.shape, np.nan, self.dtype)
        tq, tk, tv, to, tlse, tdo, tdelta, tdq, tdk, tdv = (
            NpTensor(x) for x in (self.q, self.k, self.v, o, lse, do, delta, dq, dk, dv))
        hd = bucket(self.Dv)  # O and dO have V's head dim
        attn_bwd_preprocess[(triton.cdiv(self.n_ctx_q, block_pre), self.Hq, self.B)](
            to, tdo, tdelta, *self.st(to, tdo), *self.lse_strides(tdelta), self.n_ctx_q, self.Dv,
            int(self.varlen), self.cu[0], self.packing[0], *self.packing[2:], HEAD_DIM=hd, BLOCK_M=block_pre)
        common = (*self.st(tq, tk, tv, tdo), *self.lse_strides(tlse), *self.lse_strides(tdelta))
        tail = (*self.attention_args(), *self.dropout_args(), self.Dv)
        bm, bn = blocks_dkdv
        attn_bwd_dkdv[(triton.cdiv(self.n_ctx_k, bn), self.Hk, self.B)](
            tq, tk, tv, tdo, tlse, tdelta, tdk, tdv, self.tbias, self.talibi, self.sm_scale, self.softcap, *common,
            *self.st(tdk, tdv), *self.bias_strides(), self.stride_az, *tail, HAS_BIAS=self.bias is not None,
            **self.score_constexprs(BLOCK_M=bm, BLOCK_N=bn))
        bm, bn = blocks_dq
        attn_bwd_dq[(triton.cdiv(self.n_ctx_q, bm), self.Hq, self.B)](
            tq, tk, tv, tdo, tlse, tdelta, tdq, self.tbias, self.talibi, self.sm_scale, self.softcap, *common,
            *self.st(tdq), *self.bias_strides(), self.stride_az, *tail, HAS_BIAS=self.bias is not None,
            **self.score_constexprs(BLOCK_M=bm, BLOCK_N=bn))
        return delta, dq, dk, dv

    def dsink(self, lse, delta, block_m=16):
        """attn_bwd_dsink into a NaN-poisoned fp32 ``[Hq]``."""
        dsink = np.full(self.Hq, np.nan, np.float32)
        tlse, tdelta = NpTensor(lse), NpTensor(delta)
        attn_bwd_dsink[(self.Hq,)](tlse, tdelta, self.tsinks, NpTensor(dsink), *self.lse_strides(tlse),
                                   *self.lse_strides(tdelta), self.B, self.n_ctx_q, int(self.varlen), self.cu[0],
                                   self.packing[0], *self.packing[2:], BLOCK_M=block_m)
        return dsink

    def dbias(self, o, lse, do, delta, dbias_shape, block_m, block_n):
        """attn_bwd_dbias into a NaN-poisoned ``dbias_shape`` = (Bb, Hb, Sqb, N_CTX_K) output."""
        db = np.full(dbias_shape, np.nan, self.dtype)
        tq, tk, tv, tlse, tdo, tdelta, tdb = (NpTensor(x) for x in (self.q, self.k, self.v, lse, do, delta, db))
        Bb, Hb, Sqb, _ = dbias_shape
        grid = (1 if Sqb == 1 else triton.cdiv(self.n_ctx_q, block_m), triton.cdiv(self.n_ctx_k, block_n), Bb * Hb)
        attn_bwd_dbias[grid](
            tq, tk, tv, tdo, tlse, tdelta, self.tbias, tdb, self.sm_scale,
            *self.st(tq, tk, tv, tdo), *self.lse_strides(tlse), *self.lse_strides(tdelta),
            *self.bias_strides(), *_strides(tdb), self.B, Bb, Hb, Sqb, self.Hq,
            *self.attention_args(), *self.dropout_args(), **self.constexprs(BLOCK_M=block_m, BLOCK_N=block_n))
        return db


def _rand(rng, shape, bshd, dtype=np.float16):
    if bshd:  # B x S x H x D memory viewed as B x H x S x D (non-contiguous head/seq strides)
        B, H, S, D = shape
        return rng.standard_normal((B, S, H, D)).astype(dtype).transpose(0, 2, 1, 3)
    return rng.standard_normal(shape).astype(dtype)


def make_bias(rng, B, Hq, Sq, Sk, dtype, broadcast=""):
    """Bias ``[B, Hq, Sq, Sk]`` view with stride 0 in the dimensions named by ``broadcast`` ("b", "h", "m")."""
    shape = (1 if "b" in broadcast else B, 1 if "h" in broadcast else Hq, 1 if "m" in broadcast else Sq, Sk)
    storage = rng.standard_normal(shape).astype(dtype)
    return storage, np.broadcast_to(storage, (B, Hq, Sq, Sk))


class AttnInterpreterTest(unittest.TestCase):
    def assert_close(self, name, out, ref, naive, k, what, tol=1e-3):
        self.assertFalse(np.isnan(out).any(), f"{name} not fully written / NaN: {what}")
        err = np.abs(out.astype(np.float64) - ref).max(initial=0)
        naive_err = np.abs(naive - ref).max(initial=0)
        floor = tol * max(1.0, np.abs(ref).max(initial=0))
        self.assertLessEqual(err, k * naive_err + floor,
                             f"{name} error {err:.3e} vs naive {naive_err:.3e} (floor {floor:.1e}): {what}")

    def check(self, B, Hq, Hk, Sq, Sk, D, mask, fwd_blocks=(32, 16), dkdv_blocks=(16, 32), dq_blocks=(32, 16),
              backward=True, bshd=False, seed=0, dtype=np.float16, dropout=None, bias=None,
              dbias_blocks=(16, 32), pre_block=16, softcap=0.0, scale=None, alibi=None, sinks=None, dsink_block=16,
              Dv=None):
        """``bias``: None or the broadcast spec ("" = full, "b", "h", "m" or combinations);
        ``pre_block``: BLOCK_M of ``attn_bwd_preprocess``; ``softcap`` > 0: capped scores;
        ``scale``: ``sm_scale`` instead of ``1 / sqrt(D)`` (larger scores reach the cap's saturated range);
        ``alibi``: None, or fp32 ALiBi slopes ``[Hq]`` / ``[B, Hq]`` (checked as a float64 additive bias);
        ``sinks``: None, or fp32 sink logits ``[Hq]`` (their gradient checked too, ``attn_bwd_dsink`` with
        BLOCK_M ``dsink_block``); ``Dv``: V's head dim (O, dO, dV too), Q/K's when None."""
        rng = np.random.default_rng(seed)
        Dv = D if Dv is None else Dv
        tol = 1e-3 if dtype == np.float16 else 1e-5
        q = _rand(rng, (B, Hq, Sq, D), bshd, dtype)
        k = _rand(rng, (B, Hk, Sk, D), bshd, dtype)
        v = _rand(rng, (B, Hk, Sk, Dv), bshd, dtype)
        do = _rand(rng, (B, Hq, Sq, Dv), bshd, dtype)
        bias_storage = bias_view = None
        if bias is not None:
            bias_storage, bias_view = make_bias(rng, B, Hq, Sq, Sk, dtype, bias)
        sm_scale = scale if scale is not None else 1.0 / np.sqrt(D)
        what = (f"{np.dtype(dtype).name} B{B} Hq{Hq} Hk{Hk} Sq{Sq} Sk{Sk} D{D} (bucket {bucket(D)}) Dv{Dv} {mask} "
                f"{dropout} bias={bias!r} fwd{fwd_blocks} dkdv{dkdv_blocks} dq{dq_blocks} bshd={bshd} softcap={softcap} sm_scale={sm_scale:.3f}")
        vis = mask.visible(Sq, Sk)
        keep = dropout.keep(B, Hq, Sq, Sk) if dropout else None
        dscale = dropout.scale if dropout else 1.0
        ref_bias = bias_view
        if alibi is not None:
            what += f" alibi{tuple(alibi.shape)}"
            extra = alibi_bias(alibi, B, Hq, Sq, Sk, mask)
            ref_bias = extra if bias_view is None else bias_view.astype(np.float64) + extra
        if sinks is not None:
            what += f" sinks{np.round(sinks, 2).tolist()}"
        ref = reference(q, k, v, do, vis, sm_scale, ref_bias, keep, dscale, softcap=softcap, sinks=sinks)
        naive = reference(q, k, v, do, vis, sm_scale, ref_bias, keep, dscale, naive=True, softcap=softcap, sinks=sinks)
        run = Launch(q, k, v, mask, sm_scale, bias=bias_view, dropout=dropout, softcap=softcap, alibi=alibi,
                     sinks=sinks)
        o, lse = run.fwd(*fwd_blocks, store_philox=1)
        self.assert_close("O", o, ref[0], naive[0], 3, what, tol)
        self.assertFalse(np.isnan(lse).any(), f"LSE not fully written / NaN: {what}")
        no_key = ~vis.any(-1)
        if sinks is None:
            self.assertTrue(np.all(np.isposinf(lse[:, :, no_key])), f"LSE of rows without keys not +inf: {what}")
        self.assertTrue(np.all(o[:, :, no_key] == 0), f"O of rows without keys not 0: {what}")
        fin = np.isfinite(ref[1])
        lse_err = np.abs(lse[fin].astype(np.float64) - ref[1][fin]).max(initial=0)
        self.assertLessEqual(lse_err, 1e-3, f"LSE error {lse_err:.3e}: {what}")
        if dropout:
            self.assertEqual((int(run.philox_out[0][0]), int(run.philox_out[1][0])),
                             (dropout.seed, dropout.offset + dropout.base), what)
        if not backward:
            return
        if bshd:
            o = np.ascontiguousarray(o.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        delta, dq, dk, dv = run.bwd(o, lse, do, dkdv_blocks, dq_blocks, pre_block)
        ref_delta = (do.astype(np.float64) * o.astype(np.float64)).sum(-1)
        self.assertLessEqual(np.abs(delta - ref_delta).max(), 1e-3 * max(1.0, np.abs(ref_delta).max()), what)
        self.assertTrue(np.all(dq[:, :, no_key] == 0), f"dQ of rows without keys not 0: {what}")
        for name, out, r, n in (("dQ", dq, ref[2], naive[2]), ("dK", dk, ref[3], naive[3]),
                                ("dV", dv, ref[4], naive[4])):
            self.assert_close(name, out, r, n, 5, what, tol)
        if sinks is not None:
            ref_delta64 = (do.astype(np.float64) * ref[0]).sum(-1)
            naive_delta = (do.astype(np.float64) * naive[0]).sum(-1)
            self.assert_close("dSink", run.dsink(lse, delta, dsink_block), sink_grad(sinks, ref[1], ref_delta64),
                              sink_grad(sinks, naive[1], naive_delta), 5, what, tol)
        if bias is not None:
            axes = tuple(a for a, c in zip((0, 1, 2), "bhm") if c in bias)
            db = run.dbias(o, lse, do, delta, bias_storage.shape, *dbias_blocks)
            ref_db = ref[5].sum(axis=axes, keepdims=True)
            naive_db = naive[5].astype(np.float64).sum(axis=axes, keepdims=True)
            self.assert_close("dBias", db, ref_db, naive_db, 5, what, tol)

    # -- head dims (buckets 16, 32, 64 and a power of two), GQA / MQA, masks ---------------------

    def test_head_dims_and_gqa(self):
        cases = [
            (1, 2, 2, 13, 13, 8, Mask()),                       # hd 8 -> bucket 16, MHA
            (1, 4, 2, 31, 13, 24, Mask("causal")),              # hd 24 -> 32, GQA 2, Sq > Sk top-left
            (1, 3, 1, 13, 31, 40, Mask("causal", align="br")),  # hd 40 -> 64, MQA, Sq < Sk bottom-right
            (2, 2, 1, 17, 17, 32, Mask("window", 3, 5)),        # hd 32 exact bucket, MQA, B 2
        ]
        for c in cases:
            with self.subTest(case=c):
                self.check(*c)

    def test_causal_bottom_right_rows_without_keys(self):
        # Sq > Sk bottom-right: the first Sq - Sk rows see no key (O = 0, LSE = +inf, dQ = 0).
        self.check(1, 2, 1, 31, 13, 16, Mask("causal", align="br"))

    def test_sliding_windows(self):
        cases = [
            (1, 2, 2, 31, 31, 16, Mask("window", 0, 0)),              # the diagonal only
            (1, 2, 2, 31, 31, 16, Mask("window", 0, 0, align="br")),
            (1, 2, 1, 13, 31, 8, Mask("window", 3, 5)),
            (1, 2, 1, 31, 13, 8, Mask("window", 3, 5, align="br")),   # rows before the window see nothing
            (1, 1, 1, 13, 31, 8, Mask("window", 100, 100)),           # larger than the sequence
            (1, 1, 1, 31, 13, 8, Mask("window", 3, UNBOUNDED)),       # left-bounded only
        ]
        for c in cases:
            with self.subTest(case=c):
                self.check(*c)

    def test_seqlen_one(self):
        cases = [
            (1, 2, 1, 1, 1, 16, Mask()),
            (1, 2, 1, 1, 31, 16, Mask("causal", align="br")),   # the single row sees every key
            (1, 2, 1, 1, 31, 16, Mask("causal")),                # the single row sees key 0 only
            (1, 2, 1, 31, 1, 16, Mask("causal")),
        ]
        for c in cases:
            with self.subTest(case=c):
                self.check(*c)

    def test_full_blocks_inside_window(self):
        # Long enough for leading masked, full and trailing masked blocks in every kernel,
        # with BLOCK_M > BLOCK_N and BLOCK_M < BLOCK_N.
        blocks = dict(fwd_blocks=(16, 16), dkdv_blocks=(16, 16), dq_blocks=(16, 16))
        self.check(1, 1, 1, 97, 97, 16, Mask("window", 40, 23), **blocks)
        self.check(1, 1, 1, 70, 83, 16, Mask("causal", align="br"), **blocks)
        self.check(1, 1, 1, 70, 70, 16, Mask(), fwd_blocks=(32, 16), dkdv_blocks=(16, 32), dq_blocks=(16, 32))
        self.check(1, 1, 1, 90, 90, 16, Mask("window", 33, 17, align="br"), fwd_blocks=(16, 32),
                   dkdv_blocks=(32, 16), dq_blocks=(32, 16))

    def test_non_contiguous_bshd(self):
        self.check(2, 4, 2, 17, 13, 24, Mask("causal", align="br"), bshd=True)

    def test_store_lse_off(self):
        rng = np.random.default_rng(1)
        q, k, v = (rng.standard_normal((1, 2, 13, 16)).astype(np.float16) for _ in range(3))
        run = Launch(q, k, v, Mask("causal"), 0.25)
        o, lse = run.fwd(16, 16, store_lse=0)
        self.assertTrue(np.isnan(lse).all(), "STORE_LSE=0 wrote LSE")
        self.assertFalse(np.isnan(o).any())
        o1, _ = run.fwd(16, 16, store_lse=1)
        np.testing.assert_array_equal(o, o1)

    # -- fp32 (IEEE) ----------------------------------------------------------------------------------

    def test_fp32(self):
        self.check(1, 2, 1, 37, 29, 24, Mask("causal", align="br"), dtype=np.float32)
        self.check(2, 2, 2, 17, 40, 16, Mask(), dtype=np.float32, fwd_blocks=(16, 16), dq_blocks=(16, 16))

    # -- softcap ----------------------------------------------------------------------------------------

    def test_softcap(self):
        # Caps from saturating (2: most scores beyond it at sm_scale 1) to Gemma 2's 50 (hardly active);
        # masks, GQA, head-dim padding, (B, S, H, D) strides, fp32.
        cases = [
            dict(args=(1, 2, 1, 37, 29, 24, Mask("causal", align="br")), softcap=2.0, scale=1.0),
            dict(args=(2, 4, 2, 31, 45, 16, Mask()), softcap=5.0, scale=0.5, bshd=True),
            dict(args=(1, 2, 2, 33, 33, 40, Mask("window", 5, 3)), softcap=50.0),
            dict(args=(1, 2, 1, 29, 41, 16, Mask("causal")), softcap=1.5, scale=2.0, dtype=np.float32),
        ]
        for c in cases:
            with self.subTest(case=c):
                self.check(*c["args"], softcap=c["softcap"], scale=c.get("scale"), bshd=c.get("bshd", False),
                           dtype=c.get("dtype", np.float16))

    def test_softcap_changes_the_result(self):
        # The cap is applied: a tight cap gives another O than none (guards a SOFTCAP switch that does nothing).
        rng = np.random.default_rng(5)
        q, k, v = (rng.standard_normal((1, 2, 21, 16)).astype(np.float32) for _ in range(3))
        o0, _ = Launch(q, k, v, Mask(), 1.0).fwd(16, 16)
        o1, _ = Launch(q, k, v, Mask(), 1.0, softcap=1.0).fwd(16, 16)
        self.assertGreater(np.abs(o0 - o1).max(), 0.1)

    # -- ALiBi ------------------------------------------------------------------------------------------

    def test_alibi(self):
        # Slopes per head ([Hq]) and per sequence and head ([B, Hq]); masks of either alignment (the
        # bias is 0 on the mask's diagonal), GQA, (B, S, H, D) strides, fp32, with softcap.
        rng = np.random.default_rng(9)
        slopes = lambda *shape: rng.uniform(0.05, 1.0, shape).astype(np.float32)  # noqa: E731
        cases = [
            dict(args=(1, 4, 2, 37, 29, 24, Mask("causal", align="br")), alibi=slopes(4)),
            dict(args=(2, 2, 2, 31, 45, 16, Mask()), alibi=slopes(2, 2), bshd=True),
            dict(args=(1, 2, 1, 33, 33, 40, Mask("window", 5, 3)), alibi=slopes(2)),
            dict(args=(2, 2, 1, 29, 41, 16, Mask("causal")), alibi=slopes(2, 2), dtype=np.float32),
            dict(args=(1, 2, 2, 40, 40, 16, Mask("causal", align="br")), alibi=slopes(2), softcap=3.0, scale=0.5),
        ]
        for c in cases:
            with self.subTest(case=c):
                self.check(*c["args"], alibi=c["alibi"], bshd=c.get("bshd", False), dtype=c.get("dtype", np.float16),
                           softcap=c.get("softcap", 0.0), scale=c.get("scale"))

    def test_alibi_changes_the_result(self):
        rng = np.random.default_rng(6)
        q, k, v = (rng.standard_normal((1, 2, 21, 16)).astype(np.float32) for _ in range(3))
        o0, _ = Launch(q, k, v, Mask(), 0.25).fwd(16, 16)
        o1, _ = Launch(q, k, v, Mask(), 0.25, alibi=np.array([0.5, 1.0], np.float32)).fwd(16, 16)
        self.assertGreater(np.abs(o0 - o1).max(), 0.1)

    # -- attention sinks ------------------------------------------------------------------------------

    def test_sinks(self):
        # Sinks from negligible (-30) to dominant (8: most of each row's mass), rows without keys
        # (causal bottom-right with Sq > Sk: O = 0, LSE = the sink), GQA, (B, S, H, D), windows.
        cases = [
            dict(args=(1, 4, 2, 37, 29, 24, Mask("causal", align="br")), sinks=[0.5, -1.0, 3.0, -30.0]),
            dict(args=(2, 2, 2, 31, 45, 16, Mask()), sinks=[2.0, 8.0], bshd=True),
            dict(args=(1, 2, 1, 33, 33, 40, Mask("window", 5, 3)), sinks=[-0.25, 1.5]),
            dict(args=(2, 2, 1, 29, 41, 16, Mask("causal")), sinks=[1.0, -2.0], dtype=np.float32),
        ]
        for c in cases:
            with self.subTest(**{k: v for k, v in c.items() if k != "sinks"}):
                self.check(*c["args"], sinks=np.array(c["sinks"], np.float32), bshd=c.get("bshd", False),
                           dtype=c.get("dtype", np.float16))

    def test_sinks_change_the_result(self):
        """A guard against a test that cannot fail: with a sink the output differs from without."""
        rng = np.random.default_rng(3)
        q, k, v = (_rand(rng, (1, 2, 16, 16), False) for _ in range(3))
        o0, lse0 = Launch(q, k, v, Mask(), 0.25).fwd(16, 16)
        o1, lse1 = Launch(q, k, v, Mask(), 0.25, sinks=np.array([1.0, 2.0], np.float32)).fwd(16, 16)
        self.assertGreater(np.abs(o0.astype(np.float64) - o1).max(), 1e-2)
        self.assertTrue(np.all(lse1 > lse0))

    def test_sinks_varlen(self):
        self.check_varlen([7, 20, 1, 0], [20, 7, 3, 5], 4, 2, 24, Mask("causal", align="br"),
                          sinks=np.array([0.5, 2.0, -1.0, 4.0], np.float32))

    # -- V's own head dim (the optional head_dim_v axis: rules.HEAD_DIM_V_PAIRS) -------------------------

    def test_head_dim_v(self):
        # The compiled pairs (Q/K bucket 256 / V 128: DeepSeek MLA's 192/128; 128/64), V's dims padded
        # inside their bucket, GQA/MQA, masks both alignments, rows without keys, B x S x H x D, fp32.
        cases = [
            dict(args=(1, 2, 1, 23, 37, 192, Mask("causal", align="br")), Dv=128),   # MLA prefill's dims
            dict(args=(2, 4, 2, 31, 17, 128, Mask("causal")), Dv=64),
            dict(args=(1, 3, 3, 29, 13, 96, Mask("window", 4, 2, align="br")), Dv=40, bshd=True),
            dict(args=(1, 2, 2, 19, 21, 136, Mask()), Dv=120, dtype=np.float32),
        ]
        for c in cases:
            with self.subTest(case=c):
                self.check(*c["args"], Dv=c["Dv"], bshd=c.get("bshd", False), dtype=c.get("dtype", np.float16),
                           fwd_blocks=(16, 16), dkdv_blocks=(16, 16), dq_blocks=(16, 16))

    def test_head_dim_v_varlen(self):
        self.check_varlen([7, 20, 0, 1], [20, 7, 3, 0], 4, 2, 72, Mask("causal", align="br"), Dv=48)

    def test_softcap_varlen(self):
        self.check_varlen([7, 20, 1], [20, 7, 3], 4, 2, 24, Mask("causal", align="br"), softcap=3.0)

    def test_alibi_varlen(self):
        slopes = np.array([[0.1, 0.7, 0.3, 1.0], [0.5, 0.2, 0.9, 0.05], [0.3, 0.3, 0.6, 0.6]], np.float32)
        self.check_varlen([7, 20, 1], [20, 7, 3], 4, 2, 24, Mask("causal", align="br"), alibi=slopes)
        self.check_varlen([13, 0, 6], [17, 21, 0], 4, 2, 16, Mask(), alibi=slopes[0])

    # -- dropout ----------------------------------------------------------------------------------------

    def test_dropout(self):
        cases = [
            dict(args=(2, 2, 1, 37, 29, 16, Mask()), dropout=Dropout(0.3)),             # Sk not a multiple of 4
            dict(args=(1, 4, 2, 31, 45, 24, Mask("causal", align="br")), dropout=Dropout(0.5, seed=-77,
                                                                                         offset=2**33, base=3)),
            dict(args=(1, 2, 2, 33, 33, 16, Mask("window", 5, 3)), dropout=Dropout(0.2), dtype=np.float32),
            dict(args=(1, 2, 1, 20, 20, 16, Mask()), dropout=Dropout(0.0)),              # p = 0 keeps all
        ]
        for c in cases:
            with self.subTest(case=c):
                self.check(*c["args"], dropout=c["dropout"], dtype=c.get("dtype", np.float16))

    def test_dropout_p0_matches_no_dropout(self):
        rng = np.random.default_rng(3)
        q, k, v = (rng.standard_normal((1, 2, 21, 16)).astype(np.float32) for _ in range(3))
        o0, lse0 = Launch(q, k, v, Mask(), 0.25).fwd(16, 16)
        o1, lse1 = Launch(q, k, v, Mask(), 0.25, dropout=Dropout(0.0)).fwd(16, 16)
        np.testing.assert_array_equal(o0, o1)
        np.testing.assert_array_equal(lse0, lse1)

    # -- bias and dBias -----------------------------------------------------------------------------

    def test_bias(self):
        cases = [
            dict(args=(2, 2, 1, 23, 37, 16, Mask()), bias=""),                          # full
            dict(args=(2, 3, 3, 29, 19, 16, Mask("causal", align="br")), bias="b"),     # over batch
            dict(args=(2, 4, 2, 19, 29, 8, Mask("causal")), bias="h"),                  # over heads, GQA
            dict(args=(2, 2, 2, 37, 23, 16, Mask("window", 4, 9)), bias="m"),           # over rows
            dict(args=(3, 2, 1, 21, 21, 16, Mask()), bias="bhm"),                       # a single row
            dict(args=(2, 2, 2, 25, 33, 16, Mask("causal")), bias="bh", dropout=Dropout(0.25)),
            dict(args=(2, 2, 1, 19, 27, 16, Mask("causal", align="br")), bias="", dtype=np.float32,
                 dropout=Dropout(0.4)),
            dict(args=(1, 2, 2, 33, 30, 16, Mask()), bias="m", dtype=np.float32),
        ]
        for c in cases:
            with self.subTest(case={k: v for k, v in c.items()}):
                self.check(*c["args"], bias=c["bias"], dropout=c.get("dropout"), dtype=c.get("dtype", np.float16))

    # -- varlen -------------------------------------------------------------------------------------------

    def check_varlen(self, lens_q, lens_k, Hq, Hk, D, mask, dtype=np.float16, dropout=None, bias=None, seed=0,
                     fwd_blocks=(16, 16), dkdv_blocks=(16, 16), dq_blocks=(16, 16), dbias_blocks=(16, 16), softcap=0.0,
                     alibi=None, sinks=None, Dv=None):
        rng = np.random.default_rng(seed)
        tol = 1e-3 if dtype == np.float16 else 1e-5
        cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
        cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
        B, tq, tk = len(lens_q), int(cu_q[-1]), int(cu_k[-1])
        nq, nk = max(lens_q), max(lens_k)
        # Packed [total, H, D] viewed as [1, H, total, D] (batch stride irrelevant, the runtime passes 0).
        q = rng.standard_normal((tq, Hq, D)).astype(dtype).transpose(1, 0, 2)[None]
        k = rng.standard_normal((tk, Hk, D)).astype(dtype).transpose(1, 0, 2)[None]
        Dv = D if Dv is None else Dv
        v = rng.standard_normal((tk, Hk, Dv)).astype(dtype).transpose(1, 0, 2)[None]
        do = rng.standard_normal((tq, Hq, Dv)).astype(dtype).transpose(1, 0, 2)[None]
        bias_storage = bias_view = None
        if bias is not None:
            bias_storage, bias_view = make_bias(rng, B, Hq, nq, nk, dtype, bias)
        keep = dropout.keep(B, Hq, nq, nk) if dropout else None
        sm_scale = 1.0 / np.sqrt(D)
        what = (f"varlen q{lens_q} k{lens_k} Hq{Hq} Hk{Hk} D{D} Dv{Dv} {mask} {dropout} bias={bias!r} "
                f"{np.dtype(dtype).name} softcap={softcap} alibi={None if alibi is None else alibi.shape} "
                f"sinks={sinks}")
        run = Launch(q, k, v, mask, sm_scale, bias=bias_view, dropout=dropout, cu_q=cu_q, cu_k=cu_k, softcap=softcap,
                     alibi=alibi, sinks=sinks)
        o, lse = run.fwd(*fwd_blocks)
        delta, dq, dk, dv = run.bwd(o, lse, do, dkdv_blocks, dq_blocks)
        for name, arr in (("O", o), ("LSE", lse), ("DELTA", delta), ("dQ", dq), ("dK", dk), ("dV", dv)):
            self.assertFalse(np.isnan(arr).any(), f"{name} not fully written / NaN: {what}")
        ds_sum = np.zeros((B, Hq, nq, nk))
        dsink_ref, dsink_naive = np.zeros(Hq), np.zeros(Hq)
        for b in range(B):
            qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
            sq, sk = qe - qs, ke - ks
            sub = lambda x, s, e: x[:, :, s:e]  # noqa: E731
            seq_bias = None if bias is None else bias_view[b:b + 1, :, :sq, :sk].astype(np.float64)
            if alibi is not None:  # sequence b's slopes ([B, Hq]) or the heads' ([Hq])
                extra = alibi_bias(alibi[b] if alibi.ndim == 2 else alibi, 1, Hq, sq, sk, mask)
                seq_bias = extra if seq_bias is None else seq_bias + extra
            args = (sub(q, qs, qe), sub(k, ks, ke), sub(v, ks, ke), sub(do, qs, qe), mask.visible(sq, sk), sm_scale,
                    seq_bias,
                    None if keep is None else keep[b:b + 1, :, :sq, :sk], dropout.scale if dropout else 1.0)
            ref = reference(*args, softcap=softcap, sinks=sinks)
            naive = reference(*args, naive=True, softcap=softcap, sinks=sinks)
            w = f"{what} seq {b} (sq {sq}, sk {sk})"
            self.assert_close("O", sub(o, qs, qe), ref[0], naive[0], 3, w, tol)
            if sinks is not None:
                do_s = sub(do, qs, qe).astype(np.float64)
                dsink_ref += sink_grad(sinks, ref[1], (do_s * ref[0]).sum(-1))
                dsink_naive += sink_grad(sinks, naive[1], (do_s * naive[0]).sum(-1))
            fin = np.isfinite(ref[1])
            self.assertTrue(np.all(np.isposinf(sub(lse, qs, qe)[~fin])), f"LSE of rows without keys: {w}")
            lse_err = np.abs(sub(lse, qs, qe)[fin] - ref[1][fin]).max(initial=0)
            self.assertLessEqual(lse_err, 1e-3, f"LSE error {lse_err:.3e}: {w}")
            for name, out, r, n in (("dQ", sub(dq, qs, qe), ref[2], naive[2]), ("dK", sub(dk, ks, ke), ref[3], naive[3]),
                                    ("dV", sub(dv, ks, ke), ref[4], naive[4])):
                self.assert_close(name, out, r, n, 5, w, tol)
            if sk == 0:
                self.assertTrue(np.all(sub(o, qs, qe) == 0) and np.all(sub(dq, qs, qe) == 0), w)
            if sq == 0:
                self.assertTrue(np.all(sub(dk, ks, ke) == 0) and np.all(sub(dv, ks, ke) == 0), w)
            ds_sum[b, :, :sq, :sk] = ref[5][0]
        if sinks is not None:
            self.assert_close("dSink", run.dsink(lse, delta), dsink_ref, dsink_naive, 5, what, tol)
        if bias is not None:
            axes = tuple(a for a, c in zip((0, 1, 2), "bhm") if c in bias)
            db = run.dbias(o, lse, do, delta, bias_storage.shape, *dbias_blocks)
            ref_db = ds_sum.sum(axis=axes, keepdims=True)
            self.assertFalse(np.isnan(db).any(), f"dBias not fully written: {what}")
            err = np.abs(db.astype(np.float64) - ref_db).max()
            self.assertLessEqual(err, 20 * tol * max(1.0, np.abs(ref_db).max()), f"dBias error {err:.3e}: {what}")

    def test_varlen(self):
        self.check_varlen([5, 0, 17, 1, 33], [9, 4, 17, 1, 0], 2, 1, 16, Mask())
        self.check_varlen([7, 20, 1], [20, 7, 3], 4, 2, 24, Mask("causal", align="br"))
        self.check_varlen([0, 3], [0, 0], 1, 1, 16, Mask("causal"))                     # all-empty keys
        self.check_varlen([19, 2, 0], [31, 0, 5], 2, 2, 16, Mask("window", 3, 6), dtype=np.float32)

    def test_varlen_offsets_are_clamped_to_the_tensors(self):
        """Offsets from device memory that are wrong (out of range, decreasing, longer than the max
        length) are clamped: nothing outside the packed tensors is read or written, every bit of
        the poisoned guards around them survives, and the status word names each violation."""
        rng = np.random.default_rng(7)
        H, D, tq, tk, guard = 2, 16, 20, 24, 8
        cu_q = np.array([0, 8, 5, 30], np.int32)    # seq 1 decreases; seq 2 ends past the 20 tokens
        cu_k = np.array([-4, 10, 10, 24], np.int32)  # seq 0 starts before token 0
        max_q, max_k = 12, 14                        # seq 2 (clamped to 15 tokens) is still too long

        def packed(tokens, fill):
            """A [1, H, tokens, D] view into [tokens + 2·guard, H, D] storage, the guards = fill."""
            storage = np.full((tokens + 2 * guard, H, D), fill, np.float16)
            storage[guard:guard + tokens] = rng.standard_normal((tokens, H, D))
            return storage, storage[guard:guard + tokens].transpose(1, 0, 2)[None]

        (_, q), (_, k), (_, v), (_, do) = packed(tq, 7.0), packed(tk, 7.0), packed(tk, 7.0), packed(tq, 7.0)
        run = Launch(q, k, v, Mask(), 1 / np.sqrt(D), cu_q=cu_q, cu_k=cu_k, max_lens=(max_q, max_k))
        o_storage, o = packed(tq, np.nan)
        lse_storage = np.full((H, tq + 2 * guard), np.nan, np.float32)
        lse = lse_storage[:, guard:guard + tq][None]
        to, tlse = NpTensor(o), NpTensor(lse)
        tq_, tk_, tv_ = NpTensor(q), NpTensor(k), NpTensor(v)
        attn_fwd[(triton.cdiv(max_q, 16), H, run.B)](
            tq_, tk_, tv_, to, tlse, run.tbias, run.talibi, run.tsinks, run.sm_scale, run.softcap,
            *run.st(tq_, tk_, tv_, to),
            *run.lse_strides(tlse), 0, 0, 0, 0, 1, *run.attention_args(), *run.dropout_args(), dummy(np.int64),
            dummy(np.int64), 0, run.Dv, HAS_BIAS=False, **run.fwd_constexprs(BLOCK_M=16, BLOCK_N=16))
        want = 1 | 2 | 4  # VARLEN_OFFSET_OUT_OF_RANGE | VARLEN_DECREASING | VARLEN_TOO_LONG
        self.assertEqual(int(run.status[0]), want)
        for name, storage in (("O", o_storage), ("LSE", lse_storage.transpose(1, 0))):
            self.assertTrue(np.isnan(storage[:guard]).all() and np.isnan(storage[guard + tq:]).all(),
                            f"{name}: a guard was written")
        # Sequence 0 is q [0, 8) against the clamped keys [0, 10), sequence 2 the first 12 rows of
        # q [5, 20) against keys [10, 24) (14 = max_k keys); it overlaps sequence 0's rows 5-7,
        # which either may write (in bounds: clamping keeps memory safe, not offsets consistent).
        for qs, qe, ks, ke in ((0, 5, 0, 10), (5, 17, 10, 24)):
            ref = reference(q[:, :, qs:qe], k[:, :, ks:ke], v[:, :, ks:ke], do[:, :, qs:qe],
                            Mask().visible(qe - qs, ke - ks), run.sm_scale)
            err = np.abs(o[:, :, qs:qe].astype(np.float64) - ref[0]).max()
            self.assertLessEqual(err, 1e-2, f"O of q [{qs}, {qe}) k [{ks}, {ke})")
        # The backward clamps the same way: the guards of dQ, dK, dV and delta stay intact.
        run.status[0] = 0
        o_valid = np.nan_to_num(o)
        lse_valid = np.nan_to_num(lse, nan=0.0, posinf=0.0)
        delta, dq, dk, dv = run.bwd(o_valid, lse_valid, do, (16, 16), (16, 16))
        self.assertEqual(int(run.status[0]), want)

    def test_varlen_dropout_bias(self):
        self.check_varlen([5, 0, 18, 1], [9, 3, 17, 6], 2, 1, 16, Mask("causal"), dropout=Dropout(0.3), bias="")
        self.check_varlen([13, 6], [4, 21], 2, 2, 16, Mask(), dropout=Dropout(0.5, seed=99), bias="h",
                          dtype=np.float32)
        self.check_varlen([13, 0, 6], [17, 21, 0], 2, 2, 16, Mask("causal", align="br"), bias="bm")


# -- loop bounds, checked exhaustively against the mask -------------------------------------------

@triton.jit
def _bounds_probe(OUT, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KEY_SIDE: tl.constexpr):
    pid = tl.program_id(0)
    if KEY_SIDE:
        start, full_lo, full_hi, end = query_block_bounds(pid, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
                                                          DIAG_OFFSET, BLOCK_M, BLOCK_N)
    else:
        start, full_lo, full_hi, end = key_block_bounds(pid, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
                                                        DIAG_OFFSET, BLOCK_M, BLOCK_N)
    tl.store(OUT + pid * 4 + 0, start)
    tl.store(OUT + pid * 4 + 1, full_lo)
    tl.store(OUT + pid * 4 + 2, full_hi)
    tl.store(OUT + pid * 4 + 3, end)


class LoopBoundsTest(unittest.TestCase):
    """Every visible (row, column) pair lies in a walked block; the unmasked range is fully visible."""

    def check(self, sq, sk, left, right, diag, bm, bn, key_side):
        rows, cols, brow, bcol = (sk, sq, bn, bm) if key_side else (sq, sk, bm, bn)
        n_prog = triton.cdiv(rows, brow)
        out = np.full((n_prog, 4), -7, np.int32)
        _bounds_probe[(n_prog,)](NpTensor(out), sq, sk, left, right, diag,
                                 BLOCK_M=bm, BLOCK_N=bn, KEY_SIDE=key_side)
        i = np.arange(sq)[:, None]
        j = np.arange(sk)[None, :]
        vis = (j >= i + diag - left) & (j <= i + diag + right)
        if key_side:
            vis = vis.T
        what = f"Sq{sq} Sk{sk} left{left} right{right} diag{diag} bm{bm} bn{bn} key_side={key_side}"
        for p, (start, full_lo, full_hi, end) in enumerate(out):
            tile = vis[p * brow:(p + 1) * brow]
            self.assertTrue(start <= full_lo <= full_hi <= max(end, full_hi) and start % bcol == 0
                            and full_lo % bcol == 0 and full_hi % bcol == 0, f"{what} prog {p}: {out[p]}")
            self.assertTrue(full_hi <= end or full_hi == full_lo, f"{what} prog {p}: {out[p]}")
            walked = np.zeros(cols, bool)
            n_end = -(-end // bcol) * bcol
            walked[start:n_end] = True
            self.assertTrue(np.all(walked[tile.any(0)]), f"{what} prog {p}: visible column outside {out[p]}")
            self.assertTrue(np.all(tile[:, full_lo:full_hi]), f"{what} prog {p}: masked column in full range")
            self.assertLessEqual(n_end - start, (-(-cols // bcol) + 1) * bcol)
            if not tile.any():
                self.assertEqual(end, start, f"{what} prog {p}: blocks walked for a tile that sees nothing")

    def test_random_windows(self):
        rng = np.random.default_rng(7)
        for _ in range(60):
            sq, sk = (int(x) for x in rng.integers(1, 80, 2))
            left = int(rng.choice([0, 1, 5, 17, 100, UNBOUNDED]))
            right = int(rng.choice([0, 2, 9, 40, UNBOUNDED]))
            diag = int(rng.choice([0, sk - sq, int(rng.integers(-90, 90))]))
            bm, bn = (int(x) for x in rng.choice([16, 32, 64], 2))
            for key_side in (False, True):
                self.check(sq, sk, left, right, diag, bm, bn, key_side)

    def test_no_mask_window(self):
        # No mask = left = right = Sq + Sk: every block but the sequence tail unmasked, nothing leading.
        for sq, sk, bm, bn in ((70, 83, 16, 32), (13, 100, 32, 16), (64, 64, 16, 16), (1, 1, 16, 16)):
            for align_br in (False, True):
                diag = sk - sq if align_br else 0
                self.check(sq, sk, sq + sk, sq + sk, diag, bm, bn, False)
                self.check(sq, sk, sq + sk, sq + sk, diag, bm, bn, True)
                out = np.zeros((triton.cdiv(sq, bm), 4), np.int32)
                _bounds_probe[(out.shape[0],)](NpTensor(out), sq, sk, sq + sk, sq + sk, diag,
                                               BLOCK_M=bm, BLOCK_N=bn, KEY_SIDE=False)
                for start, full_lo, full_hi, end in out:
                    self.assertEqual((start, full_lo, full_hi, end), (0, 0, sk // bn * bn, sk))


if __name__ == "__main__":
    unittest.main()
