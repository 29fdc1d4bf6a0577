//! fp16 / bf16 <-> f32 conversions (round to nearest, ties to even) and a tiny deterministic RNG.
//! Written out here so the test depends on nothing but the runtime and the driver bindings.

/// Element types under test, with the bit conversions the host side needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lowp {
    F16,
    BF16,
}

impl Lowp {
    pub fn name(self) -> &'static str {
        match self {
            Lowp::F16 => "fp16",
            Lowp::BF16 => "bf16",
        }
    }
    pub fn encode(self, x: f32) -> u16 {
        match self {
            Lowp::F16 => f32_to_f16_bits(x),
            Lowp::BF16 => f32_to_bf16_bits(x),
        }
    }
    pub fn decode(self, b: u16) -> f32 {
        match self {
            Lowp::F16 => f16_bits_to_f32(b),
            Lowp::BF16 => bf16_bits_to_f32(b),
        }
    }
    /// Rounds an f32 to the nearest representable value of this type.
    pub fn round(self, x: f32) -> f32 {
        self.decode(self.encode(x))
    }
}

/// The poison bit pattern written into outputs before a run: NaN in both fp16 and bf16.
pub const POISON16: u16 = 0xFFFF;
/// The poison bit pattern of fp32 outputs (a NaN).
pub const POISON32: u32 = 0xFFFF_FFFF;

pub fn f32_to_f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        // Inf stays Inf; every NaN becomes a quiet NaN.
        return sign | 0x7c00 | if man != 0 { 0x0200 } else { 0 };
    }
    let e = exp - 127 + 15; // biased fp16 exponent
    if e >= 0x1f {
        return sign | 0x7c00; // overflow to Inf
    }
    if e <= 0 {
        // Subnormal fp16 (or zero): value = m · 2^-24 with m = M >> (14 - e), M the full f32 mantissa.
        let shift = (14 - e) as u32;
        if shift >= 25 {
            return sign; // below half of the smallest subnormal (f32 subnormals included)
        }
        let full = if exp == 0 { man } else { man | 0x80_0000 };
        let m = full >> shift;
        let rem = full & ((1u32 << shift) - 1);
        let half = 1u32 << (shift - 1);
        let m = if rem > half || (rem == half && (m & 1) == 1) {
            m + 1
        } else {
            m
        };
        return sign | m as u16; // m may carry into the smallest normal: still right
    }
    let m = man >> 13;
    let rem = man & 0x1fff;
    let mut h = ((e as u32) << 10) | m;
    if rem > 0x1000 || (rem == 0x1000 && (m & 1) == 1) {
        h += 1; // a carry into the exponent (up to Inf) is the right result
    }
    sign | h as u16
}

pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match exp {
        0 => {
            let v = man as f32 * (1.0 / 16_777_216.0); // man · 2^-24, exact
            return if sign != 0 { -v } else { v };
        }
        0x1f => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x0040;
    }
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    (rounded >> 16) as u16
}

pub fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// splitmix64: a deterministic stream of 64-bit values from a seed.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in 0..n (n > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in (0, 1].
    fn uniform_open0(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) * (1.0 / 9_007_199_254_740_992.0)
    }
    /// A standard normal sample (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform_open0();
        let u2 = self.uniform_open0();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    /// A ~N(0,1) value representable in `t`, never zero.
    pub fn normal_in(&mut self, t: Lowp) -> f32 {
        loop {
            let v = t.round(self.normal() as f32);
            if v != 0.0 && v.is_finite() {
                return v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip_all_bit_patterns() {
        for h in 0..=u16::MAX {
            let x = f16_bits_to_f32(h);
            if x.is_nan() {
                assert!(f16_bits_to_f32(f32_to_f16_bits(x)).is_nan());
            } else {
                assert_eq!(f32_to_f16_bits(x), h, "{h:#06x} -> {x}");
            }
        }
    }

    #[test]
    fn f16_rounding() {
        assert_eq!(f32_to_f16_bits(1.0), 0x3c00);
        assert_eq!(f32_to_f16_bits(65504.0), 0x7bff);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7c00); // ties to even -> overflow
        assert_eq!(f32_to_f16_bits(1.0 + 1.0 / 2048.0), 0x3c00); // tie -> even
        assert_eq!(f32_to_f16_bits(1.0 + 3.0 / 2048.0), 0x3c02); // tie -> even (up)
        assert_eq!(f32_to_f16_bits(2f32.powi(-25)), 0x0000); // tie -> even (zero)
        assert_eq!(f32_to_f16_bits(2f32.powi(-25) * 1.5), 0x0001);
        assert_eq!(f32_to_f16_bits(-2f32.powi(-24)), 0x8001);
        assert_eq!(f32_to_f16_bits(2f32.powi(-14) * (1.0 - 1.0 / 2048.0)), 0x0400); // carry into normal
    }

    #[test]
    fn bf16_rounding() {
        for h in 0..=u16::MAX {
            let x = bf16_bits_to_f32(h);
            if !x.is_nan() {
                assert_eq!(f32_to_bf16_bits(x), h);
            }
        }
        assert_eq!(f32_to_bf16_bits(1.0 + 1.0 / 256.0), 0x3f80); // tie -> even
        assert_eq!(f32_to_bf16_bits(1.0 + 3.0 / 256.0), 0x3f82);
        assert!(bf16_bits_to_f32(POISON16).is_nan() && f16_bits_to_f32(POISON16).is_nan());
    }
}
