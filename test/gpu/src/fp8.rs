//! The fp8 (e4m3) forward, `flash::attn_fwd_fp8`, on the GPU against float64.
//!
//! Inputs: normal values with a different magnitude per head, quantised on the host to e4m3 with
//! FlashAttention-3's descales (one per batch and KV head: amax / 448), so a wrong descale index
//! shows. The reference is float64 attention of the *dequantised* inputs (the values the kernel
//! multiplies). Bounds, as elsewhere in this suite, from a naive computation in the kernel's
//! precision: float64 scores, `p = exp(s − rowmax)` rounded to e4m3 for `P·V` (the kernel casts its
//! unnormalised P so), the float64 row sum, `dv`, O rounded to bf16:
//!
//! ```text
//!     O:   max|o − ref| ≤ 3 · max|naive − ref| + 2⁻⁸ · max|ref|          (bf16 output)
//!     LSE: |lse_i − ref_i| ≤ 2⁻⁹ · scale_i · max_j Σ_d |q_id · k_jd| + 1e-3
//! ```
//!
//! The LSE term is the tensor cores' own: they keep only about 14 bits of an fp8 product chain's
//! running sum (DeepSeek-V3, §3.3.2), which no float64 naive computation shows (the probe
//! test/gluon/check_fwd_fp8.py measures it with cuBLAS's fp8 GEMM: ~1e-2 at hd128); 2⁻⁹ of the
//! absolute sum leaves room for a chain of up to 2⁵ such roundings. Rows that see no key: O = 0 and
//! LSE = +inf. Outputs are poisoned with NaN, stray writes outside the views are counted, and the
//! workspace (Vᵀ) is checked bit for bit against the key permutation of ABI.md.
use super::*;

/// e4m3 (`float8_e4m3fn`) bits of `x`: round to nearest even, saturating at ±448 (no infinities).
pub(crate) fn e4m3_encode(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs().min(448.0);
    if a == 0.0 || a.is_nan() {
        return if a.is_nan() { 0x7f } else { sign };
    }
    // Subnormals step by 2^-9 below 2^-6; normals have 3 mantissa bits.
    let e = a.log2().floor().max(-6.0) as i32;
    let step = 2f32.powi(e - 3);
    let q = (a / step).round_ties_even() * step;
    let (e, q) = if q >= 2f32.powi(e + 1) { (e + 1, q) } else { (e, q) };
    if e < -6 || q < 2f32.powi(-6) {
        return sign | (q / 2f32.powi(-9)) as u8; // subnormal: exponent field 0
    }
    let mantissa = ((q / 2f32.powi(e) - 1.0) * 8.0) as u8;
    sign | (((e + 7) as u8) << 3) | mantissa
}

/// The value of e4m3 bits.
pub(crate) fn e4m3_decode(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (((b >> 3) & 0xf) as i32, (b & 7) as f32);
    if e == 0xf && b & 7 == 7 {
        return f32::NAN;
    }
    sign * if e == 0 { m * 2f32.powi(-9) } else { (1.0 + m / 8.0) * 2f32.powi(e - 7) }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Fp8Case {
    b: usize,
    hq: usize,
    hk: usize,
    sq: usize,
    sk: usize,
    d: usize,
    mask: MaskSpec,
}

const NONE: MaskSpec = MaskSpec { left: -1, right: -1, bottom_right: false };
const CAUSAL_BR: MaskSpec = MaskSpec { left: -1, right: 0, bottom_right: true };

pub(crate) fn cases() -> Vec<Fp8Case> {
    let c = |b, hq, hk, sq, sk, d, mask| Fp8Case { b, hq, hk, sq, sk, d, mask };
    vec![
        c(2, 2, 2, 200, 300, 128, NONE),
        c(2, 8, 2, 257, 129, 128, CAUSAL_BR),
        c(1, 4, 1, 100, 333, 256, CAUSAL_BR),
        c(2, 2, 2, 77, 61, 64, MaskSpec { left: 16, right: 4, bottom_right: false }),
        c(1, 2, 1, 1, 1000, 96, NONE),
        c(1, 2, 2, 130, 40, 128, MaskSpec { left: 0, right: 0, bottom_right: false }), // rows ≥ 40 see no key
    ]
}

/// Values with a per-head magnitude (0.5..3), quantised per (batch, KV head): (bits, descales).
fn quantised(rng: &mut SplitMix64, b: usize, h: usize, hk: usize, s: usize, d: usize, flip: bool) -> (Vec<u8>, Vec<f32>) {
    let per_head = s * d;
    let mut x = vec![0f32; b * h * per_head];
    for (i, v) in x.iter_mut().enumerate() {
        let head = (i / per_head) % h;
        let head = if flip { h - 1 - head } else { head };
        *v = (rng.normal() * (0.5 + 2.5 * head as f64 / (h.max(2) - 1) as f64)) as f32;
    }
    let g = h / hk;
    let mut descale = vec![0f32; b * hk];
    for z in 0..b {
        for kh in 0..hk {
            let group = &x[(z * h + kh * g) * per_head..(z * h + (kh + 1) * g) * per_head];
            let amax = group.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
            descale[z * hk + kh] = amax / 448.0;
        }
    }
    let bits = x.iter().enumerate().map(|(i, v)| {
        let head = (i / per_head) % h;
        e4m3_encode(v / descale[(i / (h * per_head)) * hk + head / g])
    });
    (bits.collect(), descale)
}

pub(crate) fn run(c: &Fp8Case, rng: &mut SplitMix64, stream: sys::CUstream) -> Result<Outcome, String> {
    let Fp8Case { b, hq, hk, sq, sk, d, mask } = *c;
    let name = format!(
        "fp8 D={d} Hq={hq} Hk={hk} B={b} Sq={sq} Sk={sk} mask=({}, {}{})",
        mask.left,
        mask.right,
        if mask.bottom_right { ", BR" } else { "" }
    );
    let (qb, dq) = quantised(rng, b, hq, hk, sq, d, false);
    let (kb, dk) = quantised(rng, b, hk, hk, sk, d, false);
    let (vb, dv) = quantised(rng, b, hk, hk, sk, d, true);
    let q = DevTensor::new(contiguous([b, hq, sq, d]), Some(&qb), 0u8, stream)?;
    let k = DevTensor::new(contiguous([b, hk, sk, d]), Some(&kb), 0u8, stream)?;
    let v = DevTensor::new(contiguous([b, hk, sk, d]), Some(&vb), 0u8, stream)?;
    // Outputs inside a guard of poison (NaN bits), so a stray write shows.
    let guarded = |sizes: [usize; 4]| Placement::new(sizes, contiguous(sizes).strides, 64);
    let o = DevTensor::<u16, 4>::new(guarded([b, hq, sq, d]), None, 0x7fc0, stream)?;
    let lse_place = Placement::new([b, hq, sq], contiguous([b, hq, sq]).strides, 16);
    let lse = DevTensor::<u32, 3>::new(lse_place, None, f32::NAN.to_bits(), stream)?;
    let descales = [&dq, &dk, &dv].map(|x| DevTensor::new(contiguous([b, hk]), Some(x.as_slice()), f32::NAN, stream));
    let [dq_t, dk_t, dv_t] = descales;
    let (dq_t, dk_t, dv_t) = (dq_t?, dk_t?, dv_t?);
    let mut p = flash::Fp8FwdParams::new(
        q.view(DType::F8E4M3),
        k.view(DType::F8E4M3),
        v.view(DType::F8E4M3),
        o.view(DType::BF16),
        Some(lse.view(DType::F32)),
        dq_t.view(DType::F32),
        dk_t.view(DType::F32),
        dv_t.view(DType::F32),
    );
    p.mask = api_mask(&mask);
    let ws_bytes = flash::attn_fwd_fp8_workspace_bytes(&p.k).map_err(|e| e.to_string())? as usize;
    let ws = DevTensor::<u8, 1>::new(contiguous([ws_bytes]), None, 0xAAu8, stream)?;
    p.workspace = Some(flash::Workspace { ptr: ws.buf.0, bytes: ws_bytes as u64 });
    flash::attn_fwd_fp8(&p, Stream::cuda(stream as usize)).map_err(|e| format!("attn_fwd_fp8: {e}"))?;
    let (o_bits, lse_bits, ws_bits) = (o.read(stream)?, lse.read(stream)?, ws.read(stream)?);

    // Vᵀ: column k of each 32-key group holds key (k & 17) | (k & 2) << 2 | (k & 12) >> 1; pad 0.
    let keys_pad = sk.div_ceil(32) * 32;
    let mut vt_bad = 0usize;
    for z in 0..b * hk {
        for dd in 0..d {
            for col in 0..keys_pad {
                let key = (col & !31) | (col & 17) | ((col & 2) << 2) | ((col & 12) >> 1);
                let want = if key < sk { vb[(z * sk + key) * d + dd] } else { 0 };
                vt_bad += (ws_bits[(z * d + dd) * keys_pad + col] != want) as usize;
            }
        }
    }

    // Reference and naive, row by row.
    let sm_scale = 1.0 / (d as f64).sqrt();
    let deq = |bits: &[u8], ds: &[f32], h: usize, s: usize, i: usize| {
        let (z, head) = (i / (h * s * d), (i / (s * d)) % h);
        e4m3_decode(bits[i]) as f64 * ds[z * hk + head * hk / h] as f64
    };
    let (g, got_o, got_lse) = (hq / hk, o.logical(&o_bits), lse.logical(&lse_bits));
    let (mut o_err, mut naive_err, mut o_max, mut lse_excess, mut nan) = (0f64, 0f64, 0f64, 0f64, 0usize);
    let mut empty_ok = true;
    for z in 0..b {
        for h in 0..hq {
            let kh = h / g;
            for i in 0..sq {
                let qi = |dd: usize| deq(&qb, &dq, hq, sq, ((z * hq + h) * sq + i) * d + dd);
                let kj = |j: usize, dd: usize| deq(&kb, &dk, hk, sk, ((z * hk + kh) * sk + j) * d + dd);
                let vj = |j: usize, dd: usize| deq(&vb, &dv, hk, sk, ((z * hk + kh) * sk + j) * d + dd);
                let seen: Vec<usize> = (0..sk).filter(|&j| mask.visible(i, j, sq, sk)).collect();
                let row = (z * hq + h) * sq + i;
                let lse_got = f32::from_bits(got_lse[row]) as f64;
                if seen.is_empty() {
                    empty_ok &= lse_got == f64::INFINITY && (0..d).all(|dd| got_o[row * d + dd] == 0);
                    continue;
                }
                let s: Vec<f64> = seen.iter().map(|&j| (0..d).map(|dd| qi(dd) * kj(j, dd)).sum::<f64>() * sm_scale).collect();
                let abs_sum = seen.iter().map(|&j| (0..d).map(|dd| (qi(dd) * kj(j, dd)).abs()).sum::<f64>()).fold(0f64, f64::max);
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = p.iter().sum();
                let lse_ref = m + l.ln();
                // The naive computation's P, rounded to e4m3 (the kernel's unnormalised P).
                let p8: Vec<f64> = p.iter().map(|&x| e4m3_decode(e4m3_encode(x as f32)) as f64).collect();
                // abs_sum is of the dequantised products: dq·dk·Σ|q8·k8|, so this is 2⁻⁹·scale·Σ|q8·k8|.
                let lse_bound = 2f64.powi(-9) * abs_sum * sm_scale + 1e-3;
                if lse_got.is_nan() {
                    nan += 1;
                } else {
                    lse_excess = lse_excess.max((lse_got - lse_ref).abs() / lse_bound);
                }
                for dd in 0..d {
                    let r = seen.iter().zip(&p).map(|(&j, pj)| pj * vj(j, dd)).sum::<f64>() / l;
                    let naive = seen.iter().zip(&p8).map(|(&j, pj)| pj * vj(j, dd)).sum::<f64>() / l;
                    let naive = lowp::bf16_bits_to_f32(lowp::f32_to_bf16_bits(naive as f32)) as f64;
                    let got = lowp::bf16_bits_to_f32(got_o[row * d + dd]) as f64;
                    if got.is_nan() {
                        nan += 1;
                    }
                    o_err = o_err.max((got - r).abs());
                    naive_err = naive_err.max((naive - r).abs());
                    o_max = o_max.max(r.abs());
                }
            }
        }
    }
    let o_bound = 3.0 * naive_err + 2f64.powi(-8) * o_max;
    let (stray_o, stray_lse) = (o.stray(&o_bits), lse.stray(&lse_bits));
    let pass = o_err <= o_bound && lse_excess <= 1.0 && nan == 0 && empty_ok && vt_bad == 0 && stray_o + stray_lse == 0;
    Ok(Outcome {
        pass,
        line: format!(
            "{name}  O {o_err:.2e}/{o_bound:.2e} (naive {naive_err:.2e})  LSE {lse_excess:.2} of its bound  NaN {nan}  \
             empty rows {}  Vᵀ mismatches {vt_bad}  stray {stray_o}+{stray_lse}  {}",
            if empty_ok { "ok" } else { "WRONG" },
            if pass { "PASS" } else { "FAIL" }
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_round_trips_and_rounds_to_nearest_even() {
        for b in 0..=255u8 {
            let x = e4m3_decode(b);
            if x.is_nan() {
                continue;
            }
            // -0 encodes as 0x80, +0 as 0.
            assert_eq!(e4m3_encode(x), b, "{b:#x} = {x}");
        }
        assert_eq!(e4m3_decode(e4m3_encode(1000.0)), 448.0);
        assert_eq!(e4m3_decode(e4m3_encode(1.0625)), 1.0); // halfway 1 and 1.125: even mantissa
        assert_eq!(e4m3_decode(e4m3_encode(1.1875)), 1.25); // halfway 1.125 and 1.25: even
        assert_eq!(e4m3_decode(e4m3_encode(2f32.powi(-10))), 0.0); // half the smallest subnormal: even (0)
        assert_eq!(e4m3_decode(e4m3_encode(3.0 * 2f32.powi(-10))), 2f32.powi(-8));
    }
}
