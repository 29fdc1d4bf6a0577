"""The KV-cache decode kernels (kvcache_append, attn_decode, attn_decode_combine) under the Triton
interpreter, numpy only, no GPU: dense and paged caches, appends, GQA packing, windows, split-KV,
and the bounds on the device words (cache_seqlens, page ids) with their status bits.

fp16 only (the interpreter has no bf16 dot; bf16 is the GPU suite's).  Bound as
test_interpreter.py: ``max|out - ref64| <= 3 * max|naive - ref64| + 1e-3 * max(1, max|ref64|)``,
``naive`` the same attention with fp16 inputs, fp32 scores and P rounded to fp16; LSE within
``1e-3 * max(1, |lse|)``; rows that see no key: O 0 and LSE +inf exactly.
"""
import math
import unittest

import numpy as np

import test_interpreter as ti  # noqa: F401  (sets TRITON_INTERPRET=1 before triton is imported)
from test_interpreter import NpTensor, dummy
import triton  # noqa: E402
from kernels.decode.decode import attn_decode  # noqa: E402
from kernels.decode.decode_combine import attn_decode_combine  # noqa: E402
from kernels.decode.kvcache_append import kvcache_append  # noqa: E402

UNBOUNDED = ti.UNBOUNDED


def setUpModule():
    ti.setUpModule()


class Cache:
    """A dense ``[B, cap, Hk, D]`` or paged ``[n_pages, page, Hk, D]`` cache with guard rows around it."""

    def __init__(self, rng, b, hk, d, dtype, capacity=None, page=None, table=None, n_pages=None):
        self.paged = page is not None
        self.page = page
        if self.paged:
            self.table = np.ascontiguousarray(table, np.int32)
            self.capacity = self.table.shape[1] * page
            shape = (n_pages, page, hk, d)
        else:
            self.capacity = capacity
            shape = (b, capacity, hk, d)
        self.n_pages = n_pages or 0
        # One poisoned guard element on each side of each buffer: written only by a stray store.
        self.buf = {}
        for name in ("k", "v"):
            flat = rng.standard_normal(int(np.prod(shape)) + 2).astype(dtype)
            flat[0] = flat[-1] = 12345.0
            self.buf[name] = flat
        self.k = self.buf["k"][1:-1].reshape(shape)
        self.v = self.buf["v"][1:-1].reshape(shape)

    def guards_intact(self):
        return all(b[0] == 12345.0 and b[-1] == 12345.0 for b in self.buf.values())

    def rows(self, x, z, n):
        """Keys 0..n-1 of sequence z: [n, Hk, D]."""
        if not self.paged:
            return x[z, :n]
        j = np.arange(n)
        return x[self.table[z, j // self.page], j % self.page]

    def strides(self, x):
        s = NpTensor(x).stride()
        return s[0], s[2], s[1]  # (z or page, head, row)


def run_decode(q, cache, seqlens, k_new=None, v_new=None, window=(UNBOUNDED, UNBOUNDED), splits=1, sm_scale=None,
               block_m=16, block_n=32, status=None, append_block=16, combine_block=2):
    """The operator as the runtime runs it: append (when new tokens), decode, combine (splits > 1),
    the decode kernel the one for the cache's pages (``SMALL_PAGE``: the page size where it is below
    ``block_n``, else 0; the runtime's ``DecodeTile::serves``). Returns (o, lse)."""
    b, sq, hq, d = q.shape
    hk = cache.k.shape[2]
    group = hq // hk
    head_dim = ti.bucket(d)
    n_new = 0 if k_new is None else k_new.shape[1]
    sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    seq_t = NpTensor(np.ascontiguousarray(seqlens, np.int32))
    table = NpTensor(cache.table) if cache.paged else dummy(np.int32)
    stride_ptz = cache.table.shape[1] if cache.paged else 0
    log2_page = int(math.log2(cache.page)) if cache.paged else 0
    small_page = cache.page if cache.paged and cache.page < block_n else 0
    st = NpTensor(status) if status is not None else dummy(np.int32)
    store_status = int(status is not None)
    kt, vt = NpTensor(cache.k), NpTensor(cache.v)
    if n_new:
        xk, xv = NpTensor(k_new), NpTensor(v_new)
        sk, sv = xk.stride(), xv.stride()
        kvcache_append[(triton.cdiv(n_new, append_block), b * hk)](
            xk, xv, kt, vt, table, seq_t, st,
            sk[0], sk[2], sk[1], sv[0], sv[2], sv[1],
            *cache.strides(cache.k), *cache.strides(cache.v), stride_ptz,
            n_new, hk, d, cache.capacity, log2_page, cache.n_pages, store_status,
            HEAD_DIM=head_dim, BLOCK_M=append_block, PAGED=cache.paged)
    o = np.full(q.shape, np.nan, q.dtype)
    lse = np.full((b, hq, sq), np.nan, np.float32)
    o_part = np.full((splits, b, hq, sq, head_dim), np.nan, np.float32)
    lse_part = np.full((splits, b, hq, sq), np.nan, np.float32)
    qs, os_ = NpTensor(q).stride(), NpTensor(o).stride()
    ot, lt = NpTensor(o), NpTensor(lse)
    grid = (splits, b * hk, triton.cdiv(group * sq, block_m))
    attn_decode[grid](NpTensor(q), kt, vt, ot, lt, NpTensor(o_part), NpTensor(lse_part), table, seq_t, st, sm_scale,
                      qs[0], qs[2], qs[1], *cache.strides(cache.k), *cache.strides(cache.v),
                      os_[0], os_[2], os_[1], hq * sq, sq, stride_ptz,
                      sq, n_new, d, group, hq, window[0], window[1], cache.capacity, log2_page, cache.n_pages,
                      splits, 1, store_status,
                      HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, PAGED=cache.paged,
                      SMALL_PAGE=small_page)
    if splits > 1:
        attn_decode_combine[(b * hq * sq,)](NpTensor(o_part), NpTensor(lse_part), ot, lt, os_[0], os_[2], os_[1],
                                       hq * sq, sq, b, hq, sq, d, splits, 1, HEAD_DIM=head_dim, BLOCK_M=combine_block)
    return o, lse


def reference(q, cache_k, cache_v, cache, seqlens, window, sm_scale, naive=False):
    """float64 (or the naive fp16 computation) per sequence from the cache's contents."""
    b, sq, hq, d = q.shape
    hk = cache_k.shape[2]
    group = hq // hk
    o = np.zeros((b, sq, hq, d))
    lse = np.full((b, hq, sq), np.inf)
    for z in range(b):
        n = seqlens[z]
        k = cache.rows(cache_k, z, n).astype(np.float64)
        v = cache.rows(cache_v, z, n).astype(np.float64)
        pos = n - sq + np.arange(sq)
        j = np.arange(n)
        vis = (j[None, :] >= pos[:, None] - window[0]) & (j[None, :] <= pos[:, None] + window[1])
        for h in range(hq):
            qh = q[z, :, h].astype(np.float64)
            kh, vh = k[:, h // group], v[:, h // group]
            if naive:
                s = (q[z, :, h].astype(np.float32) @ cache.rows(cache_k, z, n)[:, h // group].astype(np.float32).T)
                s = s.astype(np.float64) * sm_scale
            else:
                s = qh @ kh.T * sm_scale
            s = np.where(vis, s, -np.inf)
            for t in range(sq):
                if not vis[t].any():
                    continue
                m = s[t].max()
                p = np.exp(s[t] - m)
                l_ = p.sum()
                if naive:
                    p = p.astype(np.float16).astype(np.float64)
                o[z, t, h] = p @ vh / l_
                lse[z, h, t] = m + math.log(l_)
    return o, lse


class DecodeTest(unittest.TestCase):
    def check(self, name, q, cache, seqlens_before, k_new=None, v_new=None, window=(UNBOUNDED, UNBOUNDED),
              splits=1, block_m=16, block_n=32, append_block=16, combine_block=2):
        n_new = 0 if k_new is None else k_new.shape[1]
        lengths = [min(max(s, 0), cache.capacity - n_new) + n_new for s in seqlens_before]
        k_before, v_before = cache.k.copy(), cache.v.copy()
        o, lse = run_decode(q, cache, seqlens_before, k_new, v_new, window, splits, block_m=block_m, block_n=block_n,
                            append_block=append_block, combine_block=combine_block)
        sm_scale = 1.0 / math.sqrt(q.shape[3])
        # The appended rows, and nothing else, changed.
        want_k, want_v = k_before.copy(), v_before.copy()
        for z in range(q.shape[0]):
            start = lengths[z] - n_new
            for t in range(n_new):
                j = start + t
                if cache.paged:
                    idx = (cache.table[z, j // cache.page], j % cache.page)
                else:
                    idx = (z, j)
                want_k[idx] = k_new[z, t]
                want_v[idx] = v_new[z, t]
        self.assertTrue(np.array_equal(cache.k, want_k) and np.array_equal(cache.v, want_v),
                        f"{name}: cache contents after the append")
        self.assertTrue(cache.guards_intact(), f"{name}: a store outside the cache")
        ref, ref_lse = reference(q, cache.k, cache.v, cache, lengths, window, sm_scale)
        naive, _ = reference(q, cache.k, cache.v, cache, lengths, window, sm_scale, naive=True)
        self.assertFalse(np.isnan(o).any(), f"{name}: NaN in O")
        err = np.abs(o.astype(np.float64) - ref).max()
        bound = 3 * np.abs(naive - ref).max() + 1e-3 * max(1.0, np.abs(ref).max())
        self.assertLessEqual(err, bound, f"{name}: O error {err:.3e} > {bound:.3e}")
        empty = np.isinf(ref_lse)
        self.assertTrue(np.array_equal(np.isinf(lse) & (lse > 0), empty), f"{name}: LSE +inf where no key")
        fin = ~empty
        lse_err = np.abs(lse[fin] - ref_lse[fin]).max() if fin.any() else 0.0
        self.assertLessEqual(lse_err, 1e-3 * max(1.0, np.abs(ref_lse[fin]).max() if fin.any() else 1.0),
                             f"{name}: LSE error {lse_err:.3e}")
        o_rows = np.transpose(o, (0, 2, 1, 3))  # [B, Hq, Sq, D]
        self.assertTrue((o_rows[empty] == 0).all(), f"{name}: O 0 where no key")
        return err, bound

    def test_dense(self):
        rng = np.random.default_rng(1)
        for splits in (1, 3):
            for sq, hq, hk, d in ((1, 8, 2, 64), (4, 4, 4, 40), (16, 8, 1, 32)):
                b = 3
                cache = Cache(rng, b, hk, d, np.float16, capacity=100)
                q = rng.standard_normal((b, sq, hq, d)).astype(np.float16)
                seqlens = [0, 1, 77]
                with self.subTest(splits=splits, sq=sq, hq=hq, hk=hk, d=d):
                    # GQA 8 x Sq 16 = 128 rows: two 64-row tiles.
                    bm = 64 if hq // hk * sq > 16 else 16
                    self.check("dense", q, cache, seqlens, splits=splits, block_m=bm)

    def test_dense_append_and_windows(self):
        rng = np.random.default_rng(2)
        b, sq, hq, hk, d = 2, 3, 4, 2, 64
        for window in ((UNBOUNDED, 0), (5, 0), (7, 2), (UNBOUNDED, UNBOUNDED)):
            for splits in (1, 4):
                cache = Cache(rng, b, hk, d, np.float16, capacity=90)
                q = rng.standard_normal((b, sq, hq, d)).astype(np.float16)
                k_new = rng.standard_normal((b, sq, hk, d)).astype(np.float16)
                v_new = rng.standard_normal((b, sq, hk, d)).astype(np.float16)
                with self.subTest(window=window, splits=splits):
                    self.check("append", q, cache, [40, 0], k_new, v_new, window, splits)

    def test_paged(self):
        rng = np.random.default_rng(3)
        b, sq, hq, hk, d = 3, 2, 8, 2, 64
        for page in (16, 32):
            n_pages = 12
            # Sequence 2 shares sequence 0's first page (read only: it appends nothing there).
            table = np.array([[5, 2, 9, 0], [1, 7, 3, 11], [5, 4, 6, 8]], np.int32)
            # BLOCK_N 32: pages of 16 two to a block (SMALL_PAGE 16), of 32 one; BLOCK_N 64: pages of
            # 16 four to a block, of 32 two (SMALL_PAGE 32).
            for splits, block_n in ((1, 32), (3, 32), (1, 64), (3, 64)):
                cache = Cache(rng, b, hk, d, np.float16, page=page, table=table, n_pages=n_pages)
                q = rng.standard_normal((b, sq, hq, d)).astype(np.float16)
                k_new = rng.standard_normal((b, 2, hk, d)).astype(np.float16)
                v_new = rng.standard_normal((b, 2, hk, d)).astype(np.float16)
                # The appends cross a page boundary (15, 16 with page 16) and land mid-page.
                seqlens = [page - 1, 2 * page + 3, page + 5]
                with self.subTest(page=page, splits=splits, block_n=block_n):
                    self.check("paged", q, cache, seqlens, k_new, v_new, (UNBOUNDED, 0), splits, block_n=block_n)

    def test_bounds_and_status(self):
        rng = np.random.default_rng(4)
        b, sq, hq, hk, d = 2, 1, 2, 1, 32
        cache = Cache(rng, b, hk, d, np.float16, capacity=40)
        q = rng.standard_normal((b, sq, hq, d)).astype(np.float16)
        k_new = rng.standard_normal((b, 1, hk, d)).astype(np.float16)
        v_new = rng.standard_normal((b, 1, hk, d)).astype(np.float16)
        status = np.zeros(1, np.int32)
        run_decode(q, cache, [-3, 1000], k_new, v_new, splits=2, status=status)
        self.assertEqual(status[0], 1, "cache_seqlens out of range: bit 1")
        self.assertTrue(cache.guards_intact())
        # The clamped lengths: the append went to rows 0 and 39, the attention over 1 and 40 keys.
        self.check("clamped", q, Cache(rng, b, hk, d, np.float16, capacity=40), [-3, 1000], k_new, v_new)

        # BLOCK_N 64 and 32 > page 16: four and two page ids per block (SMALL_PAGE 16); BLOCK_N 16: one.
        for block_n in (64, 32, 16):
            table = np.array([[0, 99], [1, -1]], np.int32)
            cache = Cache(rng, b, hk, d, np.float16, page=16, table=table, n_pages=2)
            status = np.zeros(1, np.int32)
            o, lse = run_decode(q, cache, [20, 20], k_new, v_new, status=status, block_n=block_n)
            self.assertEqual(status[0], 2, "page id out of range: bit 2")
            self.assertTrue(cache.guards_intact())
            # Keys on the bad pages are left out: the rows see keys 0..15 of their first page.
            good = Cache(rng, b, hk, d, np.float16, page=16, table=np.array([[0, 0], [1, 1]], np.int32), n_pages=2)
            good.k[...] = cache.k
            good.v[...] = cache.v
            ref, _ = reference(q, good.k, good.v, good, [16, 16], (UNBOUNDED, UNBOUNDED), 1.0 / math.sqrt(d))
            self.assertLessEqual(np.abs(o.astype(np.float64) - ref).max(), 5e-3, f"BLOCK_N {block_n}")


if __name__ == "__main__":
    unittest.main()
