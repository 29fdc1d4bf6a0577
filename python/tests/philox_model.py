"""Pure-numpy Philox4x32-10 and the dropout counter layout of kernels/flash/dropout.py (test oracle)."""
import numpy as np

M0, M1 = 0xD2511F53, 0xCD9E8D57          # round multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85          # Weyl key increments
MASK32 = 0xFFFFFFFF


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Random123 Philox4x32 with 10 rounds on broadcastable uint32-valued arrays; returns 4 uint32 arrays."""
    c0, c1, c2, c3 = (np.asarray(x, dtype=np.uint64) for x in (c0, c1, c2, c3))
    k0, k1 = (np.asarray(x, dtype=np.uint64) for x in (k0, k1))
    for _ in range(10):
        p0 = np.uint64(M0) * c0
        p1 = np.uint64(M1) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & np.uint64(MASK32)
        hi1, lo1 = p1 >> np.uint64(32), p1 & np.uint64(MASK32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + np.uint64(W0)) & np.uint64(MASK32)
        k1 = (k1 + np.uint64(W1)) & np.uint64(MASK32)
    return tuple(x.astype(np.uint32) for x in (c0, c1, c2, c3))


def threshold(p):
    """``DROPOUT_THRESHOLD`` for drop probability ``p``: ``floor(p * 2**16)``."""
    return min(int(np.floor(p * 2.0 ** 16)), 1 << 16)


def quads(n):
    """Quad rows of ``n`` query rows: ``8 * ceil(n / 16)``."""
    return 8 * -(-n // 16)


def units(n):
    """Unit columns of ``n`` key columns: ``4 * ceil(n / 16)``."""
    return 4 * -(-n // 16)


def counters_consumed(B, H, Sq, Sk):
    """Philox counters one call consumes: ``B * H * quads(Sq) * units(Sk)``."""
    return B * H * quads(Sq) * units(Sk)


def keep_mask(B, H, Sq, Sk, seed, offset, p_or_threshold, as_threshold=False):
    """Bool ``[B, H, Sq, Sk]``: the documented layout (kernels/flash/dropout.py)
    ``n = offset + ((b*H + h)*quads(Sq) + quad(i))*units(Sk) + quad(j)//2``, ``quad(i) = 8*(i//16) + i%8``,
    bits ``[16*(j%2), 16*(j%2) + 16)`` of word ``2*((i//8)%2) + (j//8)%2``, kept iff ``>= threshold``.
    ``offset`` = ``*PHILOX_OFFSET + philox_offset_base``."""
    thr = p_or_threshold if as_threshold else threshold(p_or_threshold)
    b, h, i, j = np.meshgrid(np.arange(B), np.arange(H), np.arange(Sq), np.arange(Sk), indexing="ij")
    quad_i = 8 * (i // 16) + i % 8
    unit_j = (8 * (j // 16) + j % 8) // 2
    n = (np.int64(offset) + ((b * H + h) * quads(Sq) + quad_i).astype(np.int64) * units(Sk) + unit_j).astype(np.uint64)
    seed = np.uint64(np.int64(seed).view(np.uint64))
    words = philox4x32_10(n & np.uint64(MASK32), n >> np.uint64(32), 0, 0,
                          seed & np.uint64(MASK32), seed >> np.uint64(32))
    w = np.choose(2 * ((i // 8) % 2) + (j // 8) % 2, words)
    half = (w >> (16 * (j % 2)).astype(np.uint32)) & np.uint32(0xFFFF)
    return half >= np.uint32(thr)
