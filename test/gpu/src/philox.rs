//! Philox4x32-10 on the host and the dropout keep-mask model of `aotriton::flash` (module docs):
//!
//! ```text
//!   key     = seed (lo, hi 32-bit words)
//!   q(i)    = 8·⌊i/16⌋ + i mod 8,   Q(n) = 8·⌈n/16⌉,   U(n) = 4·⌈n/16⌉
//!   counter = *offset + offset_base + ((b·Hq + h)·Q(Sq) + q(i))·U(Sk) + ⌊q(j)/2⌋   (u64, wrapping;
//!             lo, hi as counter words 0, 1; words 2, 3 zero)
//!   word    = Philox4x32-10(counter, key)[2·(⌊i/8⌋ mod 2) + ⌊j/8⌋ mod 2]
//!   keep    = (word >> 16·(j mod 2)) & 0xFFFF ≥ ⌊p·2¹⁶⌋
//! ```
//!
//! For packed (varlen) batches b is the sequence, i, j local positions, Sq, Sk the max lengths.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32 with 10 rounds (Random123's `philox4x32_R(10, ctr, key)`).
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = M0 as u64 * c[0] as u64;
        let p1 = M1 as u64 * c[2] as u64;
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The threshold the runtime derives from p (an f32): ⌊p·2¹⁶⌋.
pub fn threshold(p: f32) -> u32 {
    (p as f64 * 65_536.0).floor() as u32
}

/// 1/(1−p) as the kernels get it (computed in f64, passed as f32).
pub fn scale(p: f32) -> f32 {
    (1.0 / (1.0 - p as f64)) as f32
}

/// The dropout of one call, on the host.
#[derive(Debug, Clone, Copy)]
pub struct HostDropout {
    pub p: f32,
    pub seed: u64,
    /// `*offset + offset_base` (wrapping).
    pub offset: u64,
}

impl HostDropout {
    /// Keep-mask of a B×H×Sq×Sk score matrix, row-major, 1 = kept.
    pub fn mask(&self, b: usize, h: usize, sq: usize, sk: usize) -> Vec<u8> {
        let mut out = vec![0u8; b * h * sq * sk];
        let th = threshold(self.p);
        let key = [self.seed as u32, (self.seed >> 32) as u32];
        let (quads_q, units_k) = (sq.div_ceil(16) * 8, sk.div_ceil(16) * 4);
        for head in 0..b * h {
            for i in 0..sq {
                for j in 0..sk {
                    let unit = ((head * quads_q + quad(i)) * units_k + quad(j) / 2) as u64;
                    let c = self.offset.wrapping_add(unit);
                    let word = philox4x32_10([c as u32, (c >> 32) as u32, 0, 0], key)[2 * (i / 8 % 2) + j / 8 % 2];
                    out[(head * sq + i) * sk + j] = (half(word, j) >= th) as u8;
                }
            }
        }
        out
    }
}

/// The quad row (column) of row (column) `i`: `8·⌊i/16⌋ + i mod 8`.
fn quad(i: usize) -> usize {
    i / 16 * 8 + i % 8
}

/// Column `j`'s 16 bits of its word: the low half for even columns, the high half for odd ones.
fn half(word: u32, j: usize) -> u32 {
    (word >> (16 * (j % 2))) & 0xFFFF
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known-answer vectors of Random123 (kat_vectors, philox4x32 10 rounds).
    #[test]
    fn random123_vectors() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    /// The mask layout: element (b, h, i, j) reads the (j mod 2) half of word 2·(⌊i/8⌋ mod 2) +
    /// ⌊j/8⌋ mod 2 of counter (head·Q(Sq) + q(i))·U(Sk) + ⌊q(j)/2⌋, and a shifted offset shifts
    /// the stream.
    #[test]
    fn mask_layout() {
        let d = HostDropout {
            p: 0.5,
            seed: 0x1234_5678_9abc_def0,
            offset: 7,
        };
        let (b, h, sq, sk) = (2, 3, 21, 40);
        let m = d.mask(b, h, sq, sk);
        let (quads_q, units_k) = (16u64, 12u64); // 8·⌈21/16⌉, 4·⌈40/16⌉
        // (b, h, i, j) -> (quad row, unit column, word, half), worked by hand.
        for (bi, hi, i, j, qi, uj, w, e) in [
            (0, 0, 0, 0, 0, 0, 0, 0),
            (0, 0, 8, 0, 0, 0, 2, 0),
            (0, 0, 0, 8, 0, 0, 1, 0),
            (0, 0, 0, 1, 0, 0, 0, 1),
            (0, 0, 9, 13, 1, 2, 3, 1),
            (1, 2, 20, 39, 12, 11, 0, 1),
            (0, 1, 17, 25, 9, 4, 1, 1),
        ] {
            let head = (bi * h + hi) as u64;
            let c = 7 + (head * quads_q + qi) * units_k + uj;
            let word = philox4x32_10([c as u32, (c >> 32) as u32, 0, 0], [0x9abc_def0, 0x1234_5678])[w];
            let bits = (word >> (16 * e)) & 0xFFFF;
            assert_eq!(m[((bi * h + hi) * sq + i) * sk + j], (bits >= 1 << 15) as u8, "({bi}, {hi}, {i}, {j})");
        }
        // Counter words carry across the 32-bit boundary: the first unit of offset 2³²−1 + 1.
        let hi = HostDropout {
            offset: u32::MAX as u64,
            ..d
        }
        .mask(1, 1, 1, 16);
        let c1 = philox4x32_10([0, 1, 0, 0], [0x9abc_def0, 0x1234_5678]);
        assert_eq!(hi[2], (c1[0] & 0xFFFF >= 1 << 15) as u8);
        assert_eq!(hi[3], (c1[0] >> 16 >= 1 << 15) as u8);
        assert_eq!(hi[10], (c1[1] & 0xFFFF >= 1 << 15) as u8);
        // p = 0 keeps everything; the threshold of p is ⌊p·2¹⁶⌋.
        assert!(HostDropout { p: 0.0, ..d }.mask(1, 2, 3, 5).iter().all(|&k| k == 1));
        assert_eq!(threshold(0.5), 1 << 15);
        assert_eq!(threshold(0.1), 6553);
        // Keep rate near 1 − p.
        let kept = HostDropout { p: 0.25, ..d }
            .mask(4, 4, 64, 64)
            .iter()
            .filter(|&&k| k == 1)
            .count();
        let n = 4 * 4 * 64 * 64;
        assert!((kept as f64 / n as f64 - 0.75).abs() < 5.0 * (0.25f64 * 0.75 / n as f64).sqrt());
    }
}
