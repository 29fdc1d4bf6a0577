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
from philox_model import keep_mask, philox4x32_10, threshold  # noqa: E402
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


@triton.jit
def _randint_probe(SEED, NS, OUT, N: tl.constexpr):
    i = tl.arange(0, N)
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


if __name__ == "__main__":
    unittest.main()
