"""attn_fwd and the backward kernels under the Triton interpreter (TRITON_INTERPRET=1), numpy only, no GPU.

Only fp16 is tested here: bf16 ``tl.dot`` is wrong in the Triton interpreter
(an upstream limitation, the interpreter has no bf16 matmul), so bf16 is
covered by the GPU tests.

Error bounds: ``max|out - ref64| <= k * max|naive - ref64| + floor`` where
``ref64`` is float64 numpy, ``naive`` the same math in fp16 numpy with fp32
accumulation (P, dS and every product rounded to fp16), ``k = 3`` for O and
``k = 5`` for the gradients, and ``floor = 1e-3 * max(1, max|ref64|)`` (the
floor scales with the tensor's magnitude: gradients of unit-variance inputs
reach magnitudes of 10 and more, where one fp16 ulp alone exceeds 1e-3).
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import unittest  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

import _paths  # noqa: E402,F401
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from kernels.flash.bwd_dkdv import attn_bwd_dkdv  # noqa: E402
from kernels.flash.bwd_dq import attn_bwd_dq  # noqa: E402
from kernels.flash.bwd_preprocess import attn_bwd_preprocess  # noqa: E402
from kernels.flash.fwd import attn_fwd  # noqa: E402
from kernels.flash.mask import key_block_bounds, query_block_bounds  # noqa: E402


def _quiet_interpreter():
    # The interpreter converts 1-element arrays to Python ints for loop bounds (upstream, Triton 3.6).
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"triton\.runtime\.interpreter")


_quiet_interpreter()


def setUpModule():
    _quiet_interpreter()  # again inside the unittest runner, which resets the warning filters


#: "Unbounded" window side, as the runtime passes it.
UNBOUNDED = 2 ** 30
#: Bucket for a real head dim: the smallest power of two >= max(D, 16).
BUCKETS = [16, 32, 64, 128, 256]


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
    """A mask as the runtime encodes it: ``windowed`` + (left, right, diag offset)."""

    def __init__(self, kind="none", left=UNBOUNDED, right=UNBOUNDED, align="tl"):
        self.kind, self.left, self.right, self.align = kind, left, right, align
        if kind == "causal":
            self.left, self.right = UNBOUNDED, 0

    @property
    def windowed(self):
        return self.kind != "none"

    def args(self, sq, sk):
        """``(WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET)``."""
        diag = sk - sq if self.align == "br" else 0
        return self.left, self.right, diag

    def visible(self, sq, sk):
        """``[sq, sk]`` bool."""
        i = np.arange(sq)[:, None]
        j = np.arange(sk)[None, :]
        if not self.windowed:
            return np.ones((sq, sk), bool)
        left, right, diag = self.args(sq, sk)
        return (j >= i + diag - left) & (j <= i + diag + right)

    def __repr__(self):
        if self.kind == "none":
            return "none"
        if self.kind == "causal":
            return f"causal-{self.align}"
        return f"window({self.left},{self.right})-{self.align}"


def _expand(x, group):
    """K/V ``[B, Hk, S, D]`` -> ``[B, Hk * group, S, D]`` (query head h reads K/V head h // group)."""
    return np.repeat(x, group, axis=1)


def _mm(a, b, naive):
    """Matrix product: float64, or fp16 inputs with fp32 accumulation rounded to fp16."""
    if naive:
        return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    return a @ b


def reference(q, k, v, do, mask, sm_scale, naive=False):
    """Forward and backward; ``naive``: fp16 math with fp32 accumulation, else float64.

    Returns ``o, lse, dq, dk, dv`` (float64 arrays; dk/dv summed over each GQA group).
    """
    dt = np.float16 if naive else np.float64
    group = q.shape[1] // k.shape[1]
    q, do = q.astype(dt), do.astype(dt)
    ke, ve = _expand(k, group).astype(dt), _expand(v, group).astype(dt)
    sq, sk = q.shape[2], k.shape[2]
    vis = mask.visible(sq, sk)
    s = (_mm(q, ke.swapaxes(-1, -2), naive) * dt(sm_scale)).astype(dt)
    s = np.where(vis, s, -np.inf).astype(dt)
    has_key = vis.any(-1)[:, None]
    m = np.where(has_key, s.max(-1, keepdims=True), 0).astype(dt)
    e = np.where(vis, np.exp(s - m), 0).astype(dt)
    l_sum = e.sum(-1, keepdims=True, dtype=np.float64 if not naive else np.float32)
    p = np.where(has_key, e / np.where(has_key, l_sum, 1).astype(dt), 0).astype(dt)
    o = _mm(p, ve, naive)
    lse = np.where(has_key, m.astype(np.float64) + np.log(np.where(has_key, l_sum, 1).astype(np.float64)),
                   np.inf)[..., 0]
    dv = _mm(p.swapaxes(-1, -2), do, naive)
    dp = _mm(do, ve.swapaxes(-1, -2), naive)
    delta = (do.astype(np.float64) * o.astype(np.float64)).sum(-1, keepdims=True).astype(dt)
    ds = (p * (dp - delta)).astype(dt)
    dq = (_mm(ds, ke, naive) * dt(sm_scale)).astype(dt)
    dk = (_mm(ds.swapaxes(-1, -2), q, naive) * dt(sm_scale)).astype(dt)
    B, Hk = k.shape[:2]
    dk = dk.astype(np.float64).reshape(B, Hk, group, sk, -1).sum(2)
    dv = dv.astype(np.float64).reshape(B, Hk, group, sk, -1).sum(2)
    return [x.astype(np.float64) for x in (o, lse, dq, dk, dv)]


def _strides(*tensors, n=3):
    return [s for t in tensors for s in t.stride()[:n]]


def run_fwd(q, k, v, mask, sm_scale, block_m, block_n, store_lse=1):
    """Launch attn_fwd on ``[B, H, S, D]`` views; O and LSE are NaN-poisoned first."""
    B, Hq, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    o = np.full(q.shape, np.nan, np.float16)
    lse = np.full((B, Hq, Sq), np.nan, np.float32)
    tq, tk, tv, to, tlse = (NpTensor(x) for x in (q, k, v, o, lse))
    grid = (triton.cdiv(Sq, block_m), Hq, B)
    attn_fwd[grid](tq, tk, tv, to, tlse, sm_scale, *_strides(tq, tk, tv, to), *_strides(tlse, n=2),
                   Sq, Sk, D, Hq // Hk, *mask.args(Sq, Sk), store_lse,
                   HEAD_DIM=bucket(D), BLOCK_M=block_m, BLOCK_N=block_n, WINDOWED=mask.windowed)
    return o, lse


def run_bwd(q, k, v, o, lse, do, mask, sm_scale, blocks_dkdv, blocks_dq, block_pre=16):
    """preprocess + dkdv + dq; DELTA, DQ, DK, DV are NaN-poisoned first."""
    B, Hq, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    hd = bucket(D)
    delta = np.full((B, Hq, Sq), np.nan, np.float32)
    dq = np.full(q.shape, np.nan, np.float16)
    dk = np.full(k.shape, np.nan, np.float16)
    dv = np.full(v.shape, np.nan, np.float16)
    tq, tk, tv, to, tlse, tdo, tdelta, tdq, tdk, tdv = (NpTensor(x) for x in (q, k, v, o, lse, do, delta, dq, dk, dv))
    attn_bwd_preprocess[(triton.cdiv(Sq, block_pre), Hq, B)](
        to, tdo, tdelta, *_strides(to, tdo), *_strides(tdelta, n=2), Sq, D, HEAD_DIM=hd, BLOCK_M=block_pre)
    common = (*_strides(tq, tk, tv, tdo), *_strides(tlse, tdelta, n=2))
    window = (Sq, Sk, D, Hq // Hk, *mask.args(Sq, Sk))
    bm, bn = blocks_dkdv
    attn_bwd_dkdv[(triton.cdiv(Sk, bn), Hk, B)](
        tq, tk, tv, tdo, tlse, tdelta, tdk, tdv, sm_scale, *common, *_strides(tdk, tdv), *window,
        HEAD_DIM=hd, BLOCK_M=bm, BLOCK_N=bn, WINDOWED=mask.windowed)
    bm, bn = blocks_dq
    attn_bwd_dq[(triton.cdiv(Sq, bm), Hq, B)](
        tq, tk, tv, tdo, tlse, tdelta, tdq, sm_scale, *common, *_strides(tdq), *window,
        HEAD_DIM=hd, BLOCK_M=bm, BLOCK_N=bn, WINDOWED=mask.windowed)
    return delta, dq, dk, dv


def _rand(rng, shape, bshd):
    if bshd:  # B x S x H x D memory viewed as B x H x S x D (non-contiguous head/seq strides)
        B, H, S, D = shape
        return rng.standard_normal((B, S, H, D)).astype(np.float16).transpose(0, 2, 1, 3)
    return rng.standard_normal(shape).astype(np.float16)


class AttnInterpreterTest(unittest.TestCase):
    def assert_close(self, name, out, ref, naive, k, what):
        self.assertFalse(np.isnan(out).any(), f"{name} not fully written / NaN: {what}")
        err = np.abs(out.astype(np.float64) - ref).max()
        naive_err = np.abs(naive - ref).max()
        floor = 1e-3 * max(1.0, np.abs(ref).max())
        self.assertLessEqual(err, k * naive_err + floor,
                             f"{name} error {err:.3e} vs naive fp16 {naive_err:.3e} (floor {floor:.1e}): {what}")

    def check(self, B, Hq, Hk, Sq, Sk, D, mask, fwd_blocks=(32, 16), dkdv_blocks=(16, 32), dq_blocks=(32, 16),
              backward=True, bshd=False, seed=0):
        rng = np.random.default_rng(seed)
        q = _rand(rng, (B, Hq, Sq, D), bshd)
        k = _rand(rng, (B, Hk, Sk, D), bshd)
        v = _rand(rng, (B, Hk, Sk, D), bshd)
        do = _rand(rng, (B, Hq, Sq, D), bshd)
        sm_scale = 1.0 / np.sqrt(D)
        what = (f"B{B} Hq{Hq} Hk{Hk} Sq{Sq} Sk{Sk} D{D} (bucket {bucket(D)}) {mask} fwd{fwd_blocks} "
                f"dkdv{dkdv_blocks} dq{dq_blocks} bshd={bshd}")
        ref = reference(q, k, v, do, mask, sm_scale)
        naive = reference(q, k, v, do, mask, sm_scale, naive=True)
        o, lse = run_fwd(q, k, v, mask, sm_scale, *fwd_blocks)
        self.assert_close("O", o, ref[0], naive[0], 3, what)
        self.assertFalse(np.isnan(lse).any(), f"LSE not fully written / NaN: {what}")
        no_key = ~mask.visible(Sq, Sk).any(-1)
        self.assertTrue(np.all(np.isposinf(lse[:, :, no_key])), f"LSE of rows without keys not +inf: {what}")
        self.assertTrue(np.all(o[:, :, no_key] == 0), f"O of rows without keys not 0: {what}")
        fin = ~no_key
        lse_err = np.abs(lse[:, :, fin].astype(np.float64) - ref[1][:, :, fin]).max(initial=0)
        self.assertLessEqual(lse_err, 1e-3, f"LSE error {lse_err:.3e}: {what}")
        if not backward:
            return
        if bshd:
            o = np.ascontiguousarray(o.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        delta, dq, dk, dv = run_bwd(q, k, v, o, lse, do, mask, sm_scale, dkdv_blocks, dq_blocks)
        ref_delta = (do.astype(np.float64) * o.astype(np.float64)).sum(-1)
        self.assertLessEqual(np.abs(delta - ref_delta).max(), 1e-3 * max(1.0, np.abs(ref_delta).max()), what)
        self.assertTrue(np.all(dq[:, :, no_key] == 0), f"dQ of rows without keys not 0: {what}")
        for name, out, r, n in (("dQ", dq, ref[2], naive[2]), ("dK", dk, ref[3], naive[3]),
                                ("dV", dv, ref[4], naive[4])):
            self.assert_close(name, out, r, n, 5, what)

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
        o, lse = run_fwd(q, k, v, Mask("causal"), 0.25, 16, 16, store_lse=0)
        self.assertTrue(np.isnan(lse).all(), "STORE_LSE=0 wrote LSE")
        self.assertFalse(np.isnan(o).any())
        o1, _ = run_fwd(q, k, v, Mask("causal"), 0.25, 16, 16, store_lse=1)
        np.testing.assert_array_equal(o, o1)


# -- loop bounds, checked exhaustively against the mask -------------------------------------------

@triton.jit
def _bounds_probe(OUT, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, DIAG_OFFSET,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KEY_SIDE: tl.constexpr):
    pid = tl.program_id(0)
    if KEY_SIDE:
        start, full_lo, full_hi, end = query_block_bounds(pid, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
                                                          DIAG_OFFSET, BLOCK_M, BLOCK_N, True)
    else:
        start, full_lo, full_hi, end = key_block_bounds(pid, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
                                                        DIAG_OFFSET, BLOCK_M, BLOCK_N, True)
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


if __name__ == "__main__":
    unittest.main()
