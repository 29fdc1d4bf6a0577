"""Philox4x32-10: Triton's generator and a numpy model against the Random123 known-answer vectors,
and ``debug_dropout_mask`` against the documented counter layout, bit for bit (TRITON_INTERPRET=1)."""
import os

os.environ["TRITON_INTERPRET"] = "1"

import unittest  # noqa: E402

import numpy as np  # noqa: E402

import _paths  # noqa: E402,F401
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from kernels.flash.debug_dropout import debug_dropout_mask  # noqa: E402
from philox_model import counters_consumed, keep_mask, philox4x32_10, quads, threshold, units  # noqa: E402
from kernels.flash.dropout import (dropout_head_offset, dropout_keep, dropout_quad_keep, dropout_rows_offset,  # noqa: E402
                                   dropout_unit_keep, philox4x32, quad_index, quad_view, tile_of_quads, tile_of_units,
                                   unit_view)
from test_interpreter import NpTensor, _quiet_interpreter  # noqa: E402

#: Random123 kat_vectors, philox4x32_10: counter[4], key[2] -> output[4].
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff),
     (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
]


def setUpModule():
    _quiet_interpreter()


@triton.jit
def _philox_probe(C, K, OUT, N: tl.constexpr):
    """Explicit counters and keys through ``tl.philox`` (key = seed: lo word k0, hi word k1)."""
    i = tl.arange(0, N)
    c0 = tl.load(C + i * 4 + 0)
    c1 = tl.load(C + i * 4 + 1)
    c2 = tl.load(C + i * 4 + 2)
    c3 = tl.load(C + i * 4 + 3)
    k0 = tl.load(K + 0).to(tl.uint64)
    k1 = tl.load(K + 1).to(tl.uint64)
    seed = (k1 << 32) | k0
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, c2, c3)
    tl.store(OUT + i * 4 + 0, r0)
    tl.store(OUT + i * 4 + 1, r1)
    tl.store(OUT + i * 4 + 2, r2)
    tl.store(OUT + i * 4 + 3, r3)


class PhiloxKnownAnswerTest(unittest.TestCase):
    def test_numpy_model(self):
        for ctr, key, want in KAT:
            got = philox4x32_10(*ctr, *key)
            self.assertEqual(tuple(int(x) for x in got), want, f"ctr {ctr} key {key}")

    def test_triton_philox(self):
        for ctr, key, want in KAT:
            c = np.array([ctr, ctr], np.uint32)   # N = 2 (a block of two identical counters)
            k = np.array(key, np.uint32)
            out = np.zeros((2, 4), np.uint32)
            _philox_probe[(1,)](NpTensor(c), NpTensor(k), NpTensor(out), N=2)
            self.assertEqual(tuple(int(x) for x in out[0]), want, f"ctr {ctr} key {key}")
            self.assertEqual(tuple(int(x) for x in out[1]), want)

    def test_randint4x_is_the_documented_counter(self):
        # tl.randint4x(seed, n) == philox(counter (lo32(n), hi32(n), 0, 0), key (lo32(seed), hi32(seed))).
        seed = 0x0123456789ABCDEF
        n = np.array([0, 1, 2**32 - 1, 2**32, 2**40 + 12345, 2**62 + 7, 99, 5], np.int64)
        out = np.zeros((8, 4), np.uint32)
        _randint_probe[(1,)](NpTensor(np.array([seed], np.int64)), NpTensor(n), NpTensor(out), N=8)
        nu = n.astype(np.uint64)
        want = philox4x32_10(nu & np.uint64(0xFFFFFFFF), nu >> np.uint64(32), 0, 0, seed & 0xFFFFFFFF, seed >> 32)
        np.testing.assert_array_equal(out, np.stack(want, 1))

    def test_philox4x32_both_ways(self):
        # dropout.philox4x32: the rounds unrolled (Triton's randint4x) or as a loop, the same words.
        n = np.array([0, 1, 2**32 - 1, 2**32, 2**40 + 12345, 2**62 + 7, -1, -2**63], np.int64)
        nu = n.astype(np.uint64)
        for seed in (0x0123456789ABCDEF, -1, 0, 2**63 - 1):
            want = philox4x32_10(nu & np.uint64(0xFFFFFFFF), nu >> np.uint64(32), 0, 0, seed & 0xFFFFFFFF,
                                 (seed >> 32) & 0xFFFFFFFF)
            for rounds_loop in (0, 1):
                out = np.zeros((8, 4), np.uint32)
                _randint_probe[(1,)](NpTensor(np.array([seed], np.int64)), NpTensor(n), NpTensor(out), N=8,
                                     ROUNDS_LOOP=rounds_loop, OURS=True)
                np.testing.assert_array_equal(out, np.stack(want, 1), f"seed {seed:#x} ROUNDS_LOOP {rounds_loop}")


@triton.jit
def _randint_probe(SEED, NS, OUT, N: tl.constexpr, ROUNDS_LOOP: tl.constexpr = 0, OURS: tl.constexpr = False):
    """``tl.randint4x``, or with ``OURS`` ``dropout.philox4x32`` (``ROUNDS_LOOP``)."""
    i = tl.arange(0, N)
    if OURS:
        r0, r1, r2, r3 = philox4x32(tl.load(SEED), tl.load(NS + i), ROUNDS_LOOP)
    else:
        r0, r1, r2, r3 = tl.randint4x(tl.load(SEED), tl.load(NS + i))
    tl.store(OUT + i * 4 + 0, r0)
    tl.store(OUT + i * 4 + 1, r1)
    tl.store(OUT + i * 4 + 2, r2)
    tl.store(OUT + i * 4 + 3, r3)


def run_debug_mask(B, H, Sq, Sk, seed, offset, base, thr, block_m=32, block_n=64):
    out = np.full((B, H, Sq, Sk), np.nan, np.float32)
    t = NpTensor(out)
    grid = (triton.cdiv(Sq, block_m), H, B)
    debug_dropout_mask[grid](t, *t.stride()[:3], Sq, Sk, H, thr,
                             NpTensor(np.array([seed], np.int64)), NpTensor(np.array([offset], np.int64)), base,
                             BLOCK_M=block_m, BLOCK_N=block_n)
    return out


class DebugDropoutMaskTest(unittest.TestCase):
    def check(self, B, H, Sq, Sk, seed, offset, base, p, **blocks):
        out = run_debug_mask(B, H, Sq, Sk, seed, offset, base, threshold(p), **blocks)
        self.assertFalse(np.isnan(out).any(), "not fully written")
        want = keep_mask(B, H, Sq, Sk, seed, offset + base, p)
        np.testing.assert_array_equal(out, want.astype(np.float32), f"B{B} H{H} Sq{Sq} Sk{Sk} p{p}")
        return out

    def test_shapes(self):
        cases = [
            (1, 1, 5, 7, 1, 0, 0, 0.5),                        # Sk not a multiple of 4
            (2, 3, 37, 70, 0x1234_5678_9ABC, 3, 11, 0.2),      # several heads/batches, offsets
            (2, 2, 9, 130, -5, 2**33 + 1, 2**31, 0.9),         # negative seed, offset past 2**32
            (1, 2, 40, 13, 42, 0, 0, 0.5),
        ]
        for c in cases:
            with self.subTest(case=c):
                self.check(*c)
        self.check(1, 2, 40, 13, 42, 0, 0, 0.5, block_m=16, block_n=16)  # block sizes do not matter

    def test_p0_keeps_all_and_rate(self):
        out = self.check(1, 2, 17, 33, 7, 0, 0, 0.0)
        self.assertTrue(np.all(out == 1))
        out = self.check(2, 2, 64, 64, 9, 1, 0, 0.3)
        self.assertAlmostEqual(out.mean(), 0.7, delta=0.03)


class CounterLayoutTest(unittest.TestCase):
    """The unit layout itself (philox_model mirrors dropout.py's docstring)."""

    def test_every_half_word_is_used_once_and_the_count_is_exact(self):
        # Every element of a padded (16-multiple) head reads a distinct (counter, word, half), and
        # the counters of all heads fill [offset, offset + counters_consumed) exactly.
        B, H, Sq, Sk = 2, 3, 32, 48
        i, j = np.meshgrid(np.arange(Sq), np.arange(Sk), indexing="ij")
        unit = (8 * (i // 16) + i % 8) * units(Sk) + (8 * (j // 16) + j % 8) // 2
        word = 2 * ((i // 8) % 2) + (j // 8) % 2
        half = j % 2
        slots = set(((unit * 4 + word) * 2 + half).ravel().tolist())
        self.assertEqual(len(slots), Sq * Sk)
        self.assertEqual(unit.max() + 1, quads(Sq) * units(Sk))
        self.assertEqual(counters_consumed(B, H, Sq, Sk), B * H * Sq * Sk // 8)
        self.assertEqual(counters_consumed(1, 1, 1, 1), 32)  # a 1 x 1 head still spans one 16 x 16 block

    def test_threshold_resolution(self):
        # 16-bit slices: p to 2^-16, p = 1 drops everything (no slice reaches 2^16).
        self.assertEqual(threshold(0.1), 6553)
        self.assertEqual(threshold(0.0), 0)
        self.assertEqual(threshold(1.0), 1 << 16)
        self.assertFalse(keep_mask(1, 1, 16, 16, 3, 0, 1.0).any())

    def test_a_head_is_the_corner_of_its_padded_matrix(self):
        # Lengths only set the strides: a shorter head reads the same words as the top-left
        # corner of a longer one with the same quads() (so varlen sequences use max lengths).
        a = keep_mask(1, 1, 20, 23, 5, 0, 0.5)
        b = keep_mask(1, 1, 32, 32, 5, 0, 0.5)
        np.testing.assert_array_equal(a, b[:, :, :20, :23])


@triton.jit
def _keep_probe(OUT, SEED, OFFSET, row0, col0, N_CTX_Q, N_CTX_K, THRESHOLD,
                BM: tl.constexpr, BN: tl.constexpr, KEYS_AS_ROWS: tl.constexpr):
    head = dropout_head_offset(tl.load(OFFSET), 0, 0, 1, N_CTX_Q, N_CTX_K)
    keep = dropout_keep(tl.load(SEED), head, row0, col0, N_CTX_K, THRESHOLD, BM, BN, KEYS_AS_ROWS)
    if KEYS_AS_ROWS:
        tl.store(OUT + tl.arange(0, BN)[:, None] * BM + tl.arange(0, BM)[None, :], keep.to(tl.int8))
    else:
        tl.store(OUT + tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :], keep.to(tl.int8))


@triton.jit
def _gluon_tile_probe(OUT, SEED, OFFSET, row0, col0, N_CTX_Q, N_CTX_K, THRESHOLD,
                      R: tl.constexpr, C: tl.constexpr, KEYS_AS_ROWS: tl.constexpr):
    """``flash_gluon/dropout.dropout_keep_tile`` without its layouts: the same unit view (queries as
    rows) or quad view (``KEYS_AS_ROWS``), draw and reassembly of an ``[R, C]`` tile (queries from
    ``row0``, keys from ``col0``; transposed with ``KEYS_AS_ROWS``)."""
    head = dropout_head_offset(tl.load(OFFSET), 0, 0, 1, N_CTX_Q, N_CTX_K)
    base = dropout_rows_offset(head, row0, N_CTX_K) + col0 // 4
    rows = tl.arange(0, R)
    cols = tl.arange(0, C)
    zero = tl.zeros([R, C], tl.int32)
    if KEYS_AS_ROWS:
        quad_r = quad_view(quad_index(rows)[:, None] + zero)
        quad_c = quad_view(quad_index(cols)[None, :] + zero)
        k0, k1, k2, k3 = dropout_quad_keep(tl.load(SEED), base, quad_c, quad_r, N_CTX_K, THRESHOLD)
        keep = tile_of_quads(k0, k2, k1, k3)
    else:
        quad_r = unit_view(quad_index(rows)[:, None] + zero)
        unit_c = unit_view(quad_index(cols)[None, :] // 2 + zero)
        keep = tile_of_units(*dropout_unit_keep(tl.load(SEED), base, quad_r, unit_c, N_CTX_K, THRESHOLD))
    tl.store(OUT + rows[:, None] * C + cols[None, :], keep.to(tl.int8))


class DropoutKeepTest(unittest.TestCase):
    def test_gluon_tile_path(self):
        # The Gluon kernels' path (unit or quad view of the tile's own index grid, one draw per
        # unit or quad, reassembly) gives the model's bits, with queries as rows and as columns.
        seed, offset, Sq, Sk = -3, 2**32 - 5, 80, 64
        want = keep_mask(1, 1, Sq, Sk, seed, offset, 0.4)[0, 0]
        for r, c, q0, k0, keys_as_rows in [(64, 128, 16, 0, False), (64, 32, 0, 32, False), (64, 64, 0, 16, True),
                                           (32, 64, 16, 16, True)]:
            if keys_as_rows:
                bq, bk = c, r
            else:
                bq, bk = r, c
            out = np.full((r, c), 7, np.int8)
            # Lay the counters out for (Sq, Sk), as the kernels do; tiles past them read other
            # heads' counters, so compare within the matrix only.
            _gluon_tile_probe[(1,)](NpTensor(out), NpTensor(np.array([seed], np.int64)),
                                   NpTensor(np.array([offset], np.int64)), q0, k0, Sq, Sk, threshold(0.4),
                                   R=r, C=c, KEYS_AS_ROWS=keys_as_rows)
            tile = want[q0:q0 + bq, k0:k0 + bk]
            got = out.T if keys_as_rows else out
            with self.subTest(r=r, c=c, q0=q0, k0=k0, keys_as_rows=keys_as_rows):
                np.testing.assert_array_equal(got[:tile.shape[0], :tile.shape[1]], tile.astype(np.int8))

    def test_tiles_in_both_orientations(self):
        seed, offset, Sq, Sk = 77, 5, 64, 96
        want = keep_mask(1, 1, Sq, Sk, seed, offset, 0.5)[0, 0]
        for bm, bn, row0, col0 in [(32, 64, 32, 32), (16, 16, 48, 80), (64, 32, 0, 64)]:
            for keys_as_rows in (False, True):
                shape = (bn, bm) if keys_as_rows else (bm, bn)
                out = np.full(shape, 7, np.int8)
                _keep_probe[(1,)](NpTensor(out), NpTensor(np.array([seed], np.int64)),
                                  NpTensor(np.array([offset], np.int64)), row0, col0, Sq, Sk, threshold(0.5),
                                  BM=bm, BN=bn, KEYS_AS_ROWS=keys_as_rows)
                tile = want[row0:row0 + bm, col0:col0 + bn]
                with self.subTest(bm=bm, bn=bn, row0=row0, col0=col0, keys_as_rows=keys_as_rows):
                    np.testing.assert_array_equal(out, (tile.T if keys_as_rows else tile).astype(np.int8))


if __name__ == "__main__":
    unittest.main()
