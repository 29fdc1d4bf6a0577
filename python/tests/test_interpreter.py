"""attn_fwd under the Triton interpreter (TRITON_INTERPRET=1), numpy only, no GPU, no torch.

Only fp16 is tested here: bf16 ``tl.dot`` is wrong in the Triton interpreter
(an upstream limitation, the interpreter has no bf16 matmul), so bf16 is
covered by the GPU tests.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import itertools  # noqa: E402
import unittest  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

import _paths  # noqa: E402,F401
import triton  # noqa: E402
from kernels.flash.fwd import attn_fwd  # noqa: E402

# The interpreter converts 1-element arrays to Python ints for loop bounds (upstream, Triton 3.6).
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"triton\.runtime\.interpreter")


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


def reference(q, k, v, causal, sm_scale, dtype=np.float64):
    """Attention computed in ``dtype``; float16 rounds scores, softmax and PV to fp16 (the naive low-precision error)."""
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    s = (np.einsum("bhqd,bhkd->bhqk", q, k) * dtype(sm_scale)).astype(dtype)
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.tril(np.ones((sq, sk), bool)), s, -np.inf).astype(dtype)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m).astype(dtype)
    l_sum = p.sum(-1, keepdims=True, dtype=np.float64)
    o = (p / l_sum.astype(dtype)).astype(dtype) @ v
    lse = (m.astype(np.float64) + np.log(l_sum))[..., 0]
    return o.astype(dtype), lse


def run_attn_fwd(q, k, v, causal, sm_scale, block_m, block_n):
    """Launch attn_fwd on [B, H, S, D] views; O and LSE are NaN-poisoned first."""
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    o = np.full(q.shape, np.nan, np.float16)
    lse = np.full((B, H, Sq), np.nan, np.float32)
    tq, tk, tv, to, tl_ = (NpTensor(x) for x in (q, k, v, o, lse))
    strides = [s for t in (tq, tk, tv, to) for s in t.stride()[:3]] + list(tl_.stride()[:2])
    grid = (triton.cdiv(Sq, block_m), H, B)
    attn_fwd[grid](tq, tk, tv, to, tl_, sm_scale, *strides, Sq, Sk,
                   HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal)
    return o, lse


class AttnFwdInterpreterTest(unittest.TestCase):
    def check(self, B, H, Sq, Sk, D, causal, block_m=32, block_n=16, bshd=False, seed=0):
        rng = np.random.default_rng(seed)
        if bshd:
            # B x S x H x D memory, viewed as B x H x S x D (non-contiguous head/seq strides).
            q = rng.standard_normal((B, Sq, H, D)).astype(np.float16).transpose(0, 2, 1, 3)
            k = rng.standard_normal((B, Sk, H, D)).astype(np.float16).transpose(0, 2, 1, 3)
            v = rng.standard_normal((B, Sk, H, D)).astype(np.float16).transpose(0, 2, 1, 3)
        else:
            q, k, v = (rng.standard_normal((B, H, s, D)).astype(np.float16) for s in (Sq, Sk, Sk))
        sm_scale = 1.0 / np.sqrt(D)
        o, lse = run_attn_fwd(q, k, v, causal, sm_scale, block_m, block_n)
        what = f"B{B} H{H} Sq{Sq} Sk{Sk} D{D} causal={causal} bm{block_m} bn{block_n} bshd={bshd}"
        self.assertFalse(np.isnan(o).any(), f"O not fully written / NaN: {what}")
        self.assertFalse(np.isnan(lse).any(), f"LSE not fully written / NaN: {what}")
        ref_o, ref_lse = reference(q, k, v, causal, sm_scale)
        naive_o, _ = reference(q, k, v, causal, sm_scale, dtype=np.float16)
        err = np.abs(o.astype(np.float64) - ref_o).max()
        naive_err = np.abs(naive_o.astype(np.float64) - ref_o).max()
        self.assertLessEqual(err, 3 * naive_err + 1e-3, f"O error {err:.3e} vs naive fp16 {naive_err:.3e}: {what}")
        lse_err = np.abs(lse.astype(np.float64) - ref_lse).max()
        self.assertLessEqual(lse_err, 1e-3, f"LSE error {lse_err:.3e}: {what}")

    def test_head_dims(self):
        for D, causal in itertools.product((64, 128), (False, True)):
            with self.subTest(D=D, causal=causal):
                self.check(1, 2, 64, 64, D, causal)

    def test_small_head_dim_any_power_of_two(self):
        for D in (16, 32):
            with self.subTest(D=D):
                self.check(1, 1, 40, 40, D, True)

    def test_ragged_lengths(self):
        for (Sq, Sk), causal in itertools.product([(1, 1), (17, 17), (33, 33), (1, 33), (33, 1), (17, 33),
                                                   (33, 17)], (False, True)):
            with self.subTest(Sq=Sq, Sk=Sk, causal=causal):
                self.check(2, 1, Sq, Sk, 32, causal)

    def test_sq_ne_sk(self):
        for (Sq, Sk), causal in itertools.product([(48, 80), (80, 48)], (False, True)):
            with self.subTest(Sq=Sq, Sk=Sk, causal=causal):
                self.check(1, 2, Sq, Sk, 64, causal)

    def test_block_shapes(self):
        # BLOCK_M > BLOCK_N (causal diagonal spans several key blocks), BLOCK_M < BLOCK_N, equal.
        for (bm, bn), causal in itertools.product([(64, 16), (16, 32), (32, 32)], (False, True)):
            with self.subTest(bm=bm, bn=bn, causal=causal):
                self.check(1, 1, 70, 70, 32, causal, block_m=bm, block_n=bn)

    def test_non_contiguous_bshd(self):
        for causal in (False, True):
            with self.subTest(causal=causal):
                self.check(2, 3, 33, 17, 64, causal, bshd=True)


if __name__ == "__main__":
    unittest.main()
