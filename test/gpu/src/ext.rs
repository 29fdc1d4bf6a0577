//! The third milestone's features through the Rust API: dropout (Philox, device seed/offset),
//! additive bias and dBias with broadcast, packed variable-length batches, fp32 (IEEE) and TF32,
//! the deterministic backward, CUDA-graph replay with a new dropout offset, and the new
//! validations on a live device.
//!
//! * `Ext` cases: forward + backward against the float64 reference (reference.rs) with the bias
//!   and the host dropout mask (philox.rs); packed batches are checked against the reference run
//!   per sequence. Bounds as in the main suite (k = 3 for O, 5 for dQ/dK/dV/dBias, floor 1e-3,
//!   × max(1, max|ref|) for gradients); fp32: same k, floor 1e-5 (× max(1, max|ref|) for every
//!   tensor, LSE 1e-5·max(1,|lse|)); TF32: naive reference with the inputs of every product
//!   truncated to TF32 as the tensor cores do, k doubled (6 / 10, LSE 6: the kernels' products
//!   and the reference's truncate differently ordered sums), floor 1e-5. Every dropout case first checks the GPU's
//!   `debug_dropout_mask` of its (B, Hq, Sq, Sk) bit for bit against the host model, and that
//!   the forward wrote seed_out / offset_out.
//! * Mask reveal: V = identity (Sk ≤ D) makes O[i, j] = P_ij·M_ij/(1−p) and dO = shifted
//!   identities (G·Sq ≤ D; query head g of a group owns columns g·Sq..) make
//!   dV[j, g·Sq + i] = P_ij·M_ij/(1−p): (O ≠ 0) and (dV ≠ 0) must equal the debug mask exactly.
//! * Debug mask vs host model over several shapes / offsets; keep-rate statistics (≥ 10⁶
//!   elements, |kept/n − (1−p)| ≤ 5σ).
//! * CUDA graph: forward + backward with dropout captured once, replayed after a new offset is
//!   written into the offset buffer; bitwise equal to an eager run with that offset.
//! * Logit soft-capping (`softcap`): the same checks against the capped reference, dense and
//!   packed, and refused by a forced Gluon backend.
//! * ALiBi (`alibi_slopes`, [B or 1, Hq]): against the reference with the linear bias
//!   `-slope · |i + off - j|` as an additive bias (off: the mask's diagonal, per sequence when
//!   packed), with every mask alignment, GQA, a packed batch; refused by a forced Gluon backend.
//! * Attention sinks (`sinks`, [Hq], and their gradient `dsinks`): against the reference with the
//!   sink in every row's normaliser, rows without keys (O = 0, LSE = the sink), GQA, a packed
//!   batch with an empty sequence; refused by a forced Gluon backend.
use super::*;
use crate::philox::HostDropout;
use crate::reference::{Outputs, Precision};
use aotriton::flash::{Dropout, Varlen};

/// Extra tokens after the last sequence of a packed tensor: poison that must stay untouched.
const TAIL: usize = 3;

/// Element storage of a dtype: u16 bits for fp16/bf16, u32 bits for fp32.
pub(crate) trait Elem: Copy + PartialEq + Send + Sync + 'static {
    const POISON: Self;
    fn enc(p: Precision, x: f32) -> Self;
    fn dec(p: Precision, b: Self) -> f32;
}

impl Elem for u16 {
    const POISON: Self = POISON16;
    fn enc(p: Precision, x: f32) -> Self {
        match p {
            Precision::Half(t) => t.encode(x),
            _ => unreachable!("fp32 is stored as u32"),
        }
    }
    fn dec(p: Precision, b: Self) -> f32 {
        match p {
            Precision::Half(t) => t.decode(b),
            _ => unreachable!("fp32 is stored as u32"),
        }
    }
}

impl Elem for u32 {
    const POISON: Self = POISON32;
    fn enc(_: Precision, x: f32) -> Self {
        x.to_bits()
    }
    fn dec(_: Precision, b: Self) -> f32 {
        f32::from_bits(b)
    }
}

fn api_dtype(p: Precision) -> DType {
    match p {
        Precision::Half(t) => dtype_of(t),
        Precision::F32 | Precision::Tf32 => DType::F32,
    }
}

/// A random value representable in the precision, never zero.
fn draw(p: Precision, rng: &mut SplitMix64) -> f32 {
    match p {
        Precision::Half(t) => rng.normal_in(t),
        _ => loop {
            let v = rng.normal() as f32;
            if v != 0.0 {
                return v;
            }
        },
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Ext {
    pub prec: Precision,
    pub d: usize,
    pub hq: usize,
    pub hk: usize,
    /// Batch, or the number of sequences of a packed batch.
    pub b: usize,
    /// Lengths, or the max lengths of a packed batch.
    pub sq: usize,
    pub sk: usize,
    pub mask: MaskSpec,
    pub bshd: bool,
    /// Bias broadcast flags of dims B, Hq, Sq (true = size 1).
    pub bias: Option<[bool; 3]>,
    pub dropout: Option<f32>,
    /// Packed batch: per-sequence q and k lengths, and whether the host copies are passed.
    pub varlen: Option<(Vec<usize>, Vec<usize>, bool)>,
    pub deterministic: bool,
    /// Logit soft-capping (0 = off) and the sm_scale to use instead of 1/√D (larger scores reach
    /// the cap's saturated range).
    pub softcap: f32,
    pub sm_scale: Option<f32>,
    /// ALiBi slopes: `Some(true)` one row per sequence ([B, Hq]), `Some(false)` one shared row.
    pub alibi: Option<bool>,
    /// Attention sinks, one logit per query head.
    pub sinks: Option<Vec<f32>>,
    /// V's head dim (also O's, dO's, dV's): `d` unless the case gives V its own.
    pub dv: usize,
}

#[allow(clippy::too_many_arguments)]
fn ext(prec: Precision, d: usize, hq: usize, hk: usize, b: usize, sq: usize, sk: usize, mask: MaskSpec) -> Ext {
    Ext {
        prec,
        d,
        hq,
        hk,
        b,
        sq,
        sk,
        mask,
        bshd: false,
        bias: None,
        dropout: None,
        varlen: None,
        deterministic: false,
        softcap: 0.0,
        sinks: None,
        sm_scale: None,
        alibi: None,
        dv: d,
    }
}

#[allow(clippy::too_many_arguments)]
fn packed(
    prec: Precision,
    d: usize,
    hq: usize,
    hk: usize,
    lq: &[usize],
    lk: &[usize],
    mask: MaskSpec,
    host: bool,
) -> Ext {
    assert_eq!(lq.len(), lk.len());
    let (sq, sk) = (*lq.iter().max().unwrap(), *lk.iter().max().unwrap());
    Ext {
        varlen: Some((lq.to_vec(), lk.to_vec(), host)),
        ..ext(prec, d, hq, hk, lq.len(), sq, sk, mask)
    }
}

impl Ext {
    fn bias(mut self, broadcast: [bool; 3]) -> Self {
        self.bias = Some(broadcast);
        self
    }
    fn dropout(mut self, p: f32) -> Self {
        self.dropout = Some(p);
        self
    }
    fn bshd(mut self) -> Self {
        self.bshd = true;
        self
    }
    fn det(mut self) -> Self {
        self.deterministic = true;
        self
    }
    fn softcap(mut self, cap: f32, sm_scale: Option<f32>) -> Self {
        self.softcap = cap;
        self.sm_scale = sm_scale;
        self
    }
    fn sinks(mut self, logits: &[f32]) -> Self {
        assert_eq!(logits.len(), self.hq, "one sink per query head");
        self.sinks = Some(logits.to_vec());
        self
    }
    fn alibi(mut self, per_sequence: bool) -> Self {
        self.alibi = Some(per_sequence);
        self
    }
    fn head_dim_v(mut self, dv: usize) -> Self {
        self.dv = dv;
        self
    }
    pub fn group(&self) -> usize {
        self.hq / self.hk
    }
    /// The ALiBi slopes, [B or 1, Hq] row-major: BLOOM's geometric series 2^(-8(h+1)/Hq), scaled
    /// per sequence when each has its own row (so a wrong row is seen).
    fn alibi_slopes(&self) -> Option<(usize, Vec<f32>)> {
        self.alibi.map(|per_sequence| {
            let rows = if per_sequence { self.b } else { 1 };
            let slope = |z: usize, h: usize| (-8.0 * (h + 1) as f32 / self.hq as f32).exp2() * (1.0 + 0.5 * z as f32);
            (rows, (0..rows).flat_map(|z| (0..self.hq).map(move |h| slope(z, h))).collect())
        })
    }
    fn bias_sizes(&self) -> Option<[usize; 4]> {
        self.bias.map(|[z, h, m]| {
            [
                if z { 1 } else { self.b },
                if h { 1 } else { self.hq },
                if m { 1 } else { self.sq },
                self.sk,
            ]
        })
    }
    /// Per-sequence offsets (B+1) of q and k, for packed batches.
    fn cu(&self) -> Option<(Vec<usize>, Vec<usize>)> {
        self.varlen.as_ref().map(|(lq, lk, _)| {
            let scan = |l: &[usize]| {
                std::iter::once(0)
                    .chain(l.iter().scan(0, |acc, &x| {
                        *acc += x;
                        Some(*acc)
                    }))
                    .collect::<Vec<usize>>()
            };
            (scan(lq), scan(lk))
        })
    }
    /// Tokens of the packed q / k tensors (sequences + tail), or the plain lengths.
    fn tokens(&self) -> (usize, usize) {
        match self.cu() {
            Some((cq, ck)) => (cq[self.b] + TAIL, ck[self.b] + TAIL),
            None => (self.sq, self.sk),
        }
    }
    pub fn cost(&self) -> usize {
        match &self.varlen {
            Some((lq, lk, _)) => lq.iter().zip(lk).map(|(q, k)| q * k).sum::<usize>() * self.hq * self.d,
            None => self.b * self.hq * self.sq * self.sk * self.d,
        }
    }
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} D={:<3} G={} Hq={:<2} Hk={} B={} Sq={:<4} Sk={:<4} mask={}",
            self.prec.name(),
            self.d,
            self.group(),
            self.hq,
            self.hk,
            self.b,
            self.sq,
            self.sk,
            mask_name(&self.mask)
        );
        if let Some([z, h, m]) = self.bias {
            let n = |one: bool, name: &'static str| if one { "1" } else { name };
            let _ = write!(s, " bias=[{},{},{},Sk]", n(z, "B"), n(h, "Hq"), n(m, "Sq"));
        }
        if let Some(p) = self.dropout {
            let _ = write!(s, " dropout={p}");
        }
        if let Some((lq, lk, host)) = &self.varlen {
            let _ = write!(s, " varlen q{lq:?} k{lk:?}{}", if *host { " +host" } else { "" });
        }
        if self.bshd {
            s.push_str(" bshd");
        }
        if self.deterministic {
            let _ = write!(s, " deterministic ×{REPEATS} +2nd stream");
        }
        if self.softcap > 0.0 {
            let _ = write!(s, " softcap={}", self.softcap);
        }
        if let Some(scale) = self.sm_scale {
            let _ = write!(s, " scale={scale}");
        }
        if let Some(per_sequence) = self.alibi {
            let _ = write!(s, " alibi=[{},Hq]", if per_sequence { "B" } else { "1" });
        }
        if let Some(sinks) = &self.sinks {
            let _ = write!(s, " sinks={sinks:?}");
        }
        if self.dv != self.d {
            let _ = write!(s, " Dv={}", self.dv);
        }
        s
    }
}

const fn mk(left: i64, right: i64, bottom_right: bool) -> MaskSpec {
    MaskSpec {
        left,
        right,
        bottom_right,
    }
}

/// The feature cases: dropout, bias (every broadcast pattern), packed batches with empty and
/// length-1 sequences, fp32 / TF32, deterministic mode.
pub(crate) fn ext_cases() -> Vec<Ext> {
    use Lowp::{BF16, F16};
    let (h16, b16) = (Precision::Half(F16), Precision::Half(BF16));
    let (f32_, tf32) = (Precision::F32, Precision::Tf32);
    let none = mk(-1, -1, false);
    let causal_tl = mk(-1, 0, false);
    let causal_br = mk(-1, 0, true);
    let (t, f) = (true, false);
    vec![
        // Dropout.
        ext(b16, 64, 4, 2, 2, 97, 131, none).dropout(0.2),
        ext(h16, 128, 8, 2, 1, 251, 509, causal_br).dropout(0.5),
        ext(b16, 40, 3, 3, 2, 333, 200, mk(16, 5, false)).dropout(0.1).bshd(),
        ext(h16, 256, 2, 1, 1, 64, 61, none).dropout(0.9),
        ext(b16, 72, 4, 4, 1, 509, 97, causal_br).dropout(0.3), // 412 rows without keys
        // The Gluon backward's GQA head split with dropout (G 8, G·Sq 24632: each part draws its heads).
        ext(b16, 72, 8, 1, 1, 3079, 83, causal_br).dropout(0.2),
        // Bias, every broadcast pattern, with masks.
        ext(h16, 64, 4, 2, 2, 97, 131, none).bias([f, f, f]),
        ext(b16, 128, 4, 4, 2, 200, 200, causal_tl).bias([t, f, f]),
        ext(h16, 64, 6, 2, 2, 131, 251, mk(32, 8, true)).bias([f, t, f]),
        ext(b16, 96, 4, 2, 3, 61, 257, none).bias([f, t, t]), // key padding [B,1,1,Sk]
        ext(h16, 32, 4, 1, 2, 257, 61, causal_br).bias([t, t, t]),
        ext(b16, 64, 4, 2, 2, 128, 130, mk(0, 0, false)).bias([t, t, f]).bshd(),
        ext(h16, 128, 4, 2, 2, 77, 99, none).bias([f, f, t]),
        ext(b16, 64, 4, 2, 2, 200, 173, causal_tl).bias([f, t, t]).dropout(0.25),
        ext(h16, 128, 8, 4, 1, 131, 131, mk(20, -1, true))
            .bias([f, f, f])
            .dropout(0.4),
        // Packed batches (sequences of length 0 and 1 in q and k).
        packed(b16, 64, 4, 2, &[5, 0, 37, 1, 64], &[7, 9, 1, 0, 64], none, true),
        packed(h16, 128, 8, 2, &[100, 1, 0, 77], &[130, 33, 5, 1], causal_br, false),
        packed(
            b16,
            64,
            4,
            4,
            &[64, 13, 0, 200],
            &[0, 50, 8, 190],
            mk(16, 4, false),
            true,
        )
        .dropout(0.3),
        packed(h16, 96, 6, 3, &[31, 97, 1], &[45, 0, 97], causal_tl, true)
            .bias([f, t, t])
            .dropout(0.2),
        packed(b16, 64, 4, 2, &[128, 3, 60], &[128, 250, 1], causal_br, false).bias([f, f, f]),
        // Packed batches the Gluon backend serves (ragged descriptors): hd256 (64-key blocks) with
        // tails around them and a window, a padded head dim with GQA 6/3, deterministic hd128.
        packed(b16, 256, 4, 1, &[130, 1, 0, 257], &[200, 65, 3, 129], mk(64, 16, true), false),
        packed(h16, 72, 6, 3, &[31, 97, 1], &[45, 0, 97], causal_tl, true),
        packed(b16, 128, 8, 2, &[100, 1, 0, 77], &[130, 33, 5, 1], causal_br, false).det(),
        packed(f32_, 64, 2, 1, &[40, 0, 17], &[33, 12, 0], none, true)
            .bias([t, f, f])
            .dropout(0.1),
        // fp32 (IEEE) and TF32.
        ext(f32_, 64, 4, 2, 2, 97, 131, none),
        ext(f32_, 128, 4, 1, 1, 200, 251, causal_br),
        ext(f32_, 256, 2, 2, 1, 61, 130, mk(8, 8, false))
            .bias([t, t, f])
            .dropout(0.3),
        ext(f32_, 40, 3, 3, 1, 509, 31, none).bshd(),
        ext(tf32, 64, 4, 2, 2, 97, 131, none),
        ext(tf32, 128, 4, 2, 1, 200, 251, causal_tl)
            .bias([f, t, t])
            .dropout(0.2),
        // Deterministic: GQA + broadcast bias + dropout, 10 runs and a second stream.
        ext(b16, 128, 8, 2, 2, 251, 251, causal_br)
            .bias([f, t, f])
            .dropout(0.2)
            .det(),
        packed(h16, 64, 4, 2, &[90, 0, 33], &[120, 7, 33], none, true)
            .bias([t, f, t])
            .dropout(0.15)
            .det(),
        // Logit soft-capping: saturating caps (scores far beyond them at sm_scale 0.5-1) to Gemma 2's
        // 50; GQA, masks, (B, S, H, D), hd256 and a padded head dim, a packed batch, deterministic.
        ext(b16, 128, 8, 2, 2, 251, 251, causal_br).softcap(5.0, Some(0.5)),
        ext(h16, 64, 4, 4, 1, 200, 173, mk(16, 5, false)).softcap(1.0, Some(1.0)).bshd(),
        ext(b16, 256, 2, 1, 1, 97, 131, none).softcap(30.0, None),
        ext(h16, 72, 6, 3, 2, 131, 77, causal_tl).softcap(2.0, Some(0.7)),
        packed(b16, 96, 6, 3, &[31, 97, 1], &[45, 0, 97], causal_tl, true).softcap(3.0, Some(0.5)),
        ext(h16, 128, 4, 2, 1, 129, 250, none).softcap(50.0, Some(1.0)).det(),
        // ALiBi: BLOOM's slopes (distances up to 250: biases to -125), per sequence or shared,
        // every alignment (FlashAttention's bottom-right with no window too), GQA, (B, S, H, D),
        // hd256 and a padded head dim, a packed batch with empty and length-1 sequences,
        // deterministic.
        ext(b16, 128, 8, 2, 2, 251, 251, causal_br).alibi(true),
        ext(h16, 64, 4, 4, 1, 200, 173, mk(-1, -1, true)).alibi(false).bshd(),
        ext(b16, 256, 2, 1, 2, 97, 131, mk(16, 5, false)).alibi(true),
        ext(h16, 72, 6, 3, 2, 131, 77, causal_tl).alibi(false),
        packed(b16, 96, 6, 3, &[31, 97, 1], &[45, 0, 97], causal_br, true).alibi(true),
        ext(h16, 128, 4, 2, 2, 129, 250, none).alibi(true).det(),
        // Attention sinks: from negligible (-30) to dominant (8), rows without keys (bottom-right
        // causal, Sq > Sk), GQA, (B, S, H, D), hd256, a padded head dim, a packed batch with an
        // empty sequence, deterministic.
        ext(b16, 128, 8, 2, 2, 251, 200, causal_br).sinks(&[0.5, -1.0, 3.0, -30.0, 8.0, 0.0, 1.5, -2.0]),
        ext(h16, 64, 4, 4, 1, 200, 173, mk(16, 5, false)).sinks(&[2.0, -0.5, 1.0, 4.0]).bshd(),
        ext(b16, 256, 2, 1, 2, 97, 131, none).sinks(&[1.0, -1.0]),
        ext(h16, 72, 6, 3, 2, 131, 77, causal_tl).sinks(&[0.25, 0.5, 1.0, 2.0, 4.0, 8.0]),
        packed(b16, 96, 6, 3, &[31, 97, 1], &[45, 0, 97], causal_br, true).sinks(&[0.0, 1.0, -1.0, 2.0, -2.0, 3.0]),
        ext(h16, 128, 4, 2, 1, 129, 250, none).sinks(&[3.0, 3.0, -3.0, 0.0]).det(),
        // Head dims 264..512 (bucket 512, fp16/bf16): dropout, bias patterns with masks, a packed
        // batch with dropout and bias, deterministic.
        ext(b16, 512, 4, 2, 1, 97, 131, causal_br).dropout(0.2),
        ext(h16, 264, 4, 2, 2, 131, 97, mk(16, 5, false)).bias([f, t, t]).bshd(),
        ext(b16, 384, 2, 1, 1, 61, 200, none).bias([t, t, f]).dropout(0.3),
        packed(h16, 512, 4, 2, &[31, 0, 97, 1], &[45, 13, 97, 0], causal_tl, true),
        packed(b16, 320, 2, 1, &[61, 1, 40], &[97, 30, 0], none, false).bias([f, f, f]).dropout(0.1),
        ext(b16, 512, 4, 2, 1, 129, 131, none).det(),
        // V's own head dim (the compiled pairs 256/128 and 128/64): DeepSeek MLA prefill's 192/128
        // with GQA and causal, padded dims in both buckets, (B, S, H, D), a packed batch with
        // empty sequences, deterministic.
        ext(b16, 192, 4, 2, 2, 131, 251, causal_br).head_dim_v(128),
        ext(h16, 128, 4, 4, 1, 200, 173, mk(16, 5, false)).head_dim_v(64).bshd(),
        ext(b16, 136, 2, 1, 1, 97, 61, none).head_dim_v(120),
        ext(h16, 96, 6, 3, 2, 131, 77, causal_tl).head_dim_v(40),
        packed(b16, 192, 4, 2, &[31, 97, 0, 1], &[45, 0, 97, 13], causal_br, true).head_dim_v(128),
        ext(h16, 192, 4, 2, 1, 129, 250, none).head_dim_v(128).det(),
    ]
}

/// `--quick`: the cheapest case of each feature: dropout, bias, bias with dropout, a packed
/// batch, fp32, TF32, the deterministic backward.
pub(crate) fn quick(all: Vec<Ext>) -> Vec<Ext> {
    let half = |c: &Ext| matches!(c.prec, Precision::Half(_));
    let plain = |c: &Ext| half(c) && c.varlen.is_none() && !c.deterministic;
    let picks: [&dyn Fn(&Ext) -> bool; 10] = [
        &|c| plain(c) && c.dropout.is_some() && c.bias.is_none(),
        &|c| plain(c) && c.bias.is_some() && c.dropout.is_none(),
        &|c| plain(c) && c.bias.is_some() && c.dropout.is_some(),
        &|c| c.varlen.is_some() && !c.deterministic,
        &|c| c.prec == Precision::F32 && c.varlen.is_none(),
        &|c| c.prec == Precision::Tf32,
        &|c| c.deterministic,
        &|c| c.softcap > 0.0,
        &|c| c.alibi.is_some(),
        &|c| c.sinks.is_some(),
    ];
    let mut chosen: Vec<usize> = picks
        .iter()
        .filter_map(|pick| (0..all.len()).filter(|&i| pick(&all[i])).min_by_key(|&i| all[i].cost()))
        .collect();
    chosen.sort_unstable();
    chosen.dedup();
    chosen.into_iter().map(|i| all[i].clone()).collect()
}

/// Where the tensors of a case live.
/// Where each tensor lies: Q/dQ (`q`), O/dO (`o`: V's head dim), K/dK (`kv`), V/dV (`v`), and
/// the LSE/delta rows.
struct Places {
    q: Placement<4>,
    o: Placement<4>,
    kv: Placement<4>,
    v: Placement<4>,
    rows: Placement<3>,
}

/// Forced Gluon on a call outside its rule: both calls refused with `UnsupportedByBackend`, and
/// `untouched` confirms nothing was written.
fn gluon_refusal(
    label: &str,
    fp: &flash::FwdParams,
    bp: &flash::BwdParams,
    s: Stream,
    untouched: impl Fn() -> Result<bool, String>,
) -> Result<Outcome, String> {
    let refused = backend::expect_refusal("attn_fwd", flash::attn_fwd(fp, s))
        .and_then(|f| backend::expect_refusal("attn_bwd", flash::attn_bwd(bp, s)).map(|_| f));
    let clean = untouched()?;
    let pass = refused.is_ok() && clean;
    let note = match refused {
        Ok(note) => note,
        Err(e) => e,
    };
    Ok(Outcome {
        pass,
        line: format!(
            "{label}  {note}{}  {}",
            if clean { "" } else { " [outputs written]!" },
            if pass { "PASS" } else { "FAIL" }
        ),
    })
}

fn places(c: &Ext) -> Places {
    let (tq, tk) = c.tokens();
    let packed4 = |h: usize, t: usize, d: usize| Placement::new([1, h, t, d], [t * h * d, d, h * d, 1], 0);
    let plain4 = |h: usize, s: usize, d: usize| {
        if c.bshd {
            Placement::new([c.b, h, s, d], [s * h * d, d, h * d, 1], 0)
        } else {
            Placement::new([c.b, h, s, d], [h * s * d, s * d, d, 1], 0)
        }
    };
    if c.varlen.is_some() {
        Places {
            q: packed4(c.hq, tq, c.d),
            o: packed4(c.hq, tq, c.dv),
            kv: packed4(c.hk, tk, c.d),
            v: packed4(c.hk, tk, c.dv),
            rows: Placement::new([1, c.hq, tq], [c.hq * tq, tq, 1], 0),
        }
    } else {
        Places {
            q: plain4(c.hq, tq, c.d),
            o: plain4(c.hq, tq, c.dv),
            kv: plain4(c.hk, tk, c.d),
            v: plain4(c.hk, tk, c.dv),
            rows: Placement::new([c.b, c.hq, tq], [c.hq * tq, tq, 1], 0),
        }
    }
}

/// Seed and offset buffers of a dropout (u64 each), plus the seed_out/offset_out pair.
struct DropoutBufs {
    p: f32,
    seed: u64,
    offset: u64,
    base: u64,
    seed_buf: DevBuf,
    offset_buf: DevBuf,
    out_buf: DevBuf,
}

impl DropoutBufs {
    fn new(p: f32, rng: &mut SplitMix64, stream: sys::CUstream) -> Result<Self, String> {
        let seed = rng.next_u64();
        let offset = rng.next_u64() >> 4;
        let base = rng.next_u64() >> 40;
        let bufs = DropoutBufs {
            p,
            seed,
            offset,
            base,
            seed_buf: DevBuf::new(8)?,
            offset_buf: DevBuf::new(8)?,
            out_buf: DevBuf::new(16)?,
        };
        upload(bufs.seed_buf.0, &[seed], stream)?;
        upload(bufs.offset_buf.0, &[offset], stream)?;
        upload(bufs.out_buf.0, &[u64::MAX, u64::MAX], stream)?;
        Ok(bufs)
    }
    fn api(&self, with_out: bool) -> Dropout {
        Dropout {
            p: self.p,
            seed: self.seed_buf.0,
            offset: self.offset_buf.0,
            offset_base: self.base,
            seed_out: if with_out { self.out_buf.0 } else { 0 },
            offset_out: if with_out { self.out_buf.0 + 8 } else { 0 },
        }
    }
    fn host(&self) -> HostDropout {
        HostDropout {
            p: self.p,
            seed: self.seed,
            offset: self.offset.wrapping_add(self.base),
        }
    }
}

fn upload<T: Copy>(ptr: sys::CUdeviceptr, host: &[T], stream: sys::CUstream) -> Result<(), String> {
    unsafe { result::memcpy_htod_async(ptr, host, stream) }.map_err(|e| format!("cuMemcpyHtoDAsync: {e:?}"))?;
    sync(stream)
}

fn download<T: Copy + Default>(ptr: sys::CUdeviceptr, n: usize, stream: sys::CUstream) -> Result<Vec<T>, String> {
    let mut out = vec![T::default(); n];
    unsafe { result::memcpy_dtoh_async(&mut out, ptr, stream) }.map_err(|e| format!("cuMemcpyDtoHAsync: {e:?}"))?;
    sync(stream)?;
    Ok(out)
}

/// Runs `debug_dropout_mask` into a poisoned fp32 B×H×Sq×Sk buffer (row pitch Sk + `pad`) and
/// returns (mask as 0/1, elements that are neither 0.0 nor 1.0, writes outside the view).
fn gpu_mask(
    d: &Dropout,
    sizes: [usize; 4],
    pad: usize,
    stream: sys::CUstream,
) -> Result<(Vec<u8>, usize, usize), String> {
    let [b, h, sq, sk] = sizes;
    let pitch = sk + pad;
    let place = Placement::new(sizes, [h * sq * pitch, sq * pitch, pitch, 1], 0);
    let out = DevTensor::new(place, None, POISON32, stream)?;
    flash::debug_dropout_mask(&out.view(DType::F32), d, Stream::from_raw(stream as usize))
        .map_err(|e| format!("debug_dropout_mask returned {e}"))?;
    let bits = out.read(stream)?;
    let logical = out.logical(&bits);
    let bad = logical.iter().filter(|&&x| x != 0 && x != 1f32.to_bits()).count();
    let mask = logical.iter().map(|&x| (x == 1f32.to_bits()) as u8).collect();
    let _ = (b, h);
    Ok((mask, bad, out.stray(&bits)))
}

/// Runs one feature case in its element type.
pub(crate) fn run_ext(c: &Ext, rng: &mut SplitMix64, stream: sys::CUstream) -> Result<Outcome, String> {
    match c.prec {
        Precision::Half(_) => run_typed::<u16>(c, rng, stream),
        _ => run_typed::<u32>(c, rng, stream),
    }
}

/// The float64 (exact) and naive references of a case on the device tensors' logical layouts,
/// and the full dS (B×Hq×Sq×Sk, max lengths for packed batches) of both. Packed batches: the
/// reference runs per sequence; tail tokens hold NaN.
struct Refs {
    exact: Outputs,
    naive: Outputs,
}

#[allow(clippy::too_many_arguments)]
fn references(
    c: &Ext,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d_o: &[f32],
    bias_full: Option<&[f32]>,
    keep: Option<&[u8]>,
    sm_scale: f32,
) -> Refs {
    let r = c.dropout.map_or(1.0, crate::philox::scale);
    let Some((cq, ck)) = c.cu() else {
        let problem = reference::Problem {
            head_dim_v: c.dv,
            bias: bias_full,
            dropout: keep.map(|m| (m, r)),
            softcap: c.softcap,
            sinks: c.sinks.as_deref(),
            ..reference::Problem::plain(c.prec, [c.b, c.hq, c.hk, c.sq, c.sk, c.d], c.mask, sm_scale, [q, k, v, d_o])
        };
        let (exact, naive) = reference::compute(&problem);
        return Refs { exact, naive };
    };
    let (tq, tk) = c.tokens();
    let (hq, hk, d, dv, msq, msk) = (c.hq, c.hk, c.d, c.dv, c.sq, c.sk);
    let blank = |with_ds: bool| Outputs {
        o: vec![f64::NAN; hq * tq * dv],
        lse: vec![f64::NAN; hq * tq],
        dq: vec![f64::NAN; hq * tq * d],
        dk: vec![f64::NAN; hk * tk * d],
        dv: vec![f64::NAN; hk * tk * dv],
        ds: if with_ds {
            vec![0.0; c.b * hq * msq * msk]
        } else {
            Vec::new()
        },
        dsinks: if c.sinks.is_some() { vec![0.0; hq] } else { Vec::new() },
    };
    let mut refs = Refs {
        exact: blank(bias_full.is_some()),
        naive: blank(bias_full.is_some()),
    };
    for s in 0..c.b {
        let (q0, lq, k0, lk) = (cq[s], cq[s + 1] - cq[s], ck[s], ck[s + 1] - ck[s]);
        // Gather one sequence as B=1 row-major tensors.
        let take = |x: &[f32], h: usize, t: usize, at: usize, len: usize, d: usize| {
            let mut out = Vec::with_capacity(h * len * d);
            for hh in 0..h {
                out.extend_from_slice(&x[(hh * t + at) * d..(hh * t + at + len) * d]);
            }
            out
        };
        let take_sk = |x: &[f32]| {
            let mut out = Vec::with_capacity(hq * lq * lk);
            for hh in 0..hq {
                for i in 0..lq {
                    let row = ((s * hq + hh) * msq + i) * msk;
                    out.extend_from_slice(&x[row..row + lk]);
                }
            }
            out
        };
        let (qs, dos) = (take(q, hq, tq, q0, lq, d), take(d_o, hq, tq, q0, lq, dv));
        let (ks, vs) = (take(k, hk, tk, k0, lk, d), take(v, hk, tk, k0, lk, dv));
        let bias_s = bias_full.map(take_sk);
        let keep_s: Option<Vec<u8>> = keep.map(|m| {
            let mut out = Vec::with_capacity(hq * lq * lk);
            for hh in 0..hq {
                for i in 0..lq {
                    let row = ((s * hq + hh) * msq + i) * msk;
                    out.extend_from_slice(&m[row..row + lk]);
                }
            }
            out
        });
        let seq_out: (Outputs, Outputs) = if lq == 0 || lk == 0 {
            // No queries: nothing (dK = dV = 0). No keys: O = 0, LSE = +inf (with sinks: the
            // head's sink), dQ = 0; the sinks' gradient gets nothing (O = 0, so delta = 0).
            let lse_of = |h: usize| c.sinks.as_ref().map_or(f64::INFINITY, |t| f64::from(t[h]));
            let zeros = || Outputs {
                o: vec![0.0; hq * lq * dv],
                lse: (0..hq).flat_map(|h| std::iter::repeat_n(lse_of(h), lq)).collect(),
                dq: vec![0.0; hq * lq * d],
                dk: vec![0.0; hk * lk * d],
                dv: vec![0.0; hk * lk * dv],
                ds: vec![0.0; hq * lq * lk],
                dsinks: if c.sinks.is_some() { vec![0.0; hq] } else { Vec::new() },
            };
            (zeros(), zeros())
        } else {
            let problem = reference::Problem {
                head_dim_v: dv,
                bias: bias_s.as_deref(),
                dropout: keep_s.as_deref().map(|m| (m, r)),
                softcap: c.softcap,
                sinks: c.sinks.as_deref(),
                ..reference::Problem::plain(c.prec, [1, hq, hk, lq, lk, d], c.mask, sm_scale, [&qs, &ks, &vs, &dos])
            };
            reference::compute(&problem)
        };
        for (dst, src) in [(&mut refs.exact, &seq_out.0), (&mut refs.naive, &seq_out.1)] {
            for (acc, part) in dst.dsinks.iter_mut().zip(&src.dsinks) {
                *acc += part;
            }
            for hh in 0..hq {
                let (at, n) = ((hh * tq + q0) * dv, lq * dv);
                dst.o[at..at + n].copy_from_slice(&src.o[hh * n..(hh + 1) * n]);
                let (at, n) = ((hh * tq + q0) * d, lq * d);
                dst.dq[at..at + n].copy_from_slice(&src.dq[hh * n..(hh + 1) * n]);
                dst.lse[hh * tq + q0..hh * tq + q0 + lq].copy_from_slice(&src.lse[hh * lq..(hh + 1) * lq]);
                if !dst.ds.is_empty() {
                    for i in 0..lq {
                        let row = ((s * hq + hh) * msq + i) * msk;
                        dst.ds[row..row + lk].copy_from_slice(&src.ds[(hh * lq + i) * lk..(hh * lq + i + 1) * lk]);
                    }
                }
            }
            for hh in 0..hk {
                let (at, n) = ((hh * tk + k0) * d, lk * d);
                dst.dk[at..at + n].copy_from_slice(&src.dk[hh * n..(hh + 1) * n]);
                let (at, n) = ((hh * tk + k0) * dv, lk * dv);
                dst.dv[at..at + n].copy_from_slice(&src.dv[hh * n..(hh + 1) * n]);
            }
        }
    }
    refs
}

/// ALiBi as the reference's additive bias, B×Hq×Sq×Sk (Sq, Sk: the longest sequences when
/// packed): `-slope · |i + off - j|` at positions inside each sequence, off = Sk - Sq of that
/// sequence for a bottom-right mask, else 0.
fn alibi_bias(c: &Ext, rows: usize, slopes: &[f32]) -> Vec<f32> {
    let (b, hq, sq, sk) = (c.b, c.hq, c.sq, c.sk);
    let lengths: Vec<(usize, usize)> = match c.cu() {
        Some((cq, ck)) => (0..b).map(|z| (cq[z + 1] - cq[z], ck[z + 1] - ck[z])).collect(),
        None => vec![(sq, sk); b],
    };
    let mut full = Vec::with_capacity(b * hq * sq * sk);
    for (z, &(lq, lk)) in lengths.iter().enumerate() {
        let off = if c.mask.bottom_right { lk as i64 - lq as i64 } else { 0 };
        for h in 0..hq {
            let slope = slopes[if rows == 1 { 0 } else { z } * hq + h];
            for i in 0..sq {
                full.extend((0..sk).map(|j| -slope * (i as i64 + off - j as i64).abs() as f32));
            }
        }
    }
    full
}

/// Keeps the elements whose reference is not NaN (tail tokens of packed tensors).
fn live(got: &[f64], exact: &[f64], naive: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let idx: Vec<usize> = (0..exact.len()).filter(|&i| !exact[i].is_nan()).collect();
    let pick = |x: &[f64]| idx.iter().map(|&i| x[i]).collect::<Vec<f64>>();
    (pick(got), pick(exact), pick(naive))
}

fn run_typed<E: Elem>(c: &Ext, rng: &mut SplitMix64, stream: sys::CUstream) -> Result<Outcome, String> {
    let prec = c.prec;
    let dtype = api_dtype(prec);
    let (hq, hk, d, dv) = (c.hq, c.hk, c.d, c.dv);
    let sm_scale = c.sm_scale.unwrap_or(1.0 / (d as f32).sqrt());
    let pl = places(c);
    let fail = |what: String| {
        Ok(Outcome {
            pass: false,
            line: format!("{}  {what}  FAIL", c.describe()),
        })
    };
    let mut make = |n: usize| (0..n).map(|_| draw(prec, rng)).collect::<Vec<f32>>();
    let size = |p: &Placement<4>| p.sizes.iter().product::<usize>();
    let (q, k, v, d_o) = (make(size(&pl.q)), make(size(&pl.kv)), make(size(&pl.v)), make(size(&pl.o)));
    let bias_sizes = c.bias_sizes();
    let bias_vals = bias_sizes.map(|sz| make(sz.iter().product()));
    let enc = |x: &[f32]| x.iter().map(|&y| E::enc(prec, y)).collect::<Vec<E>>();

    let q_dev = DevTensor::new(pl.q.clone(), Some(&enc(&q)), E::POISON, stream)?;
    let k_dev = DevTensor::new(pl.kv.clone(), Some(&enc(&k)), E::POISON, stream)?;
    let v_dev = DevTensor::new(pl.v.clone(), Some(&enc(&v)), E::POISON, stream)?;
    let do_dev = DevTensor::new(pl.o.clone(), Some(&enc(&d_o)), E::POISON, stream)?;
    let o_dev = DevTensor::new(pl.o.clone(), None, E::POISON, stream)?;
    let dq_dev = DevTensor::new(pl.q.clone(), None, E::POISON, stream)?;
    let dk_dev = DevTensor::new(pl.kv.clone(), None, E::POISON, stream)?;
    let dv_dev = DevTensor::new(pl.v.clone(), None, E::POISON, stream)?;
    let lse_dev = DevTensor::new(pl.rows.clone(), None, POISON32, stream)?;
    let delta_dev = DevTensor::new(pl.rows.clone(), None, POISON32, stream)?;
    let bias_dev = match (bias_sizes, &bias_vals) {
        (Some(sz), Some(vals)) => Some(DevTensor::new(contiguous(sz), Some(&enc(vals)), E::POISON, stream)?),
        _ => None,
    };
    // fp32 inputs travel as their bits, like every other tensor here: NaN poison compares unequal
    // to itself, bits do not.
    let f32_bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let slopes = c.alibi_slopes();
    let alibi_dev = match &slopes {
        Some((rows, vals)) => Some(DevTensor::new(contiguous([*rows, hq]), Some(&f32_bits(vals)), POISON32, stream)?),
        None => None,
    };
    let sinks_dev = match &c.sinks {
        Some(logits) => Some(DevTensor::new(contiguous([hq]), Some(&f32_bits(logits)), POISON32, stream)?),
        None => None,
    };
    let dsinks_dev = match &c.sinks {
        Some(_) => Some(DevTensor::new(contiguous([hq]), None, POISON32, stream)?),
        None => None,
    };
    let dbias_dev = match bias_sizes {
        Some(sz) => Some(DevTensor::new(contiguous(sz), None, E::POISON, stream)?),
        None => None,
    };
    let cu = c.cu();
    let cu_i32 = cu.as_ref().map(|(a, b)| {
        let f = |x: &[usize]| x.iter().map(|&v| v as i32).collect::<Vec<i32>>();
        (f(a), f(b))
    });
    let cu_dev = match &cu_i32 {
        Some((a, b)) => Some((
            DevTensor::new(contiguous([a.len()]), Some(a), -1i32, stream)?,
            DevTensor::new(contiguous([b.len()]), Some(b), -1i32, stream)?,
        )),
        None => None,
    };
    let drop = match c.dropout {
        Some(p) => Some(DropoutBufs::new(p, rng, stream)?),
        None => None,
    };
    let varlen = cu_dev.as_ref().map(|(cq, ck)| Varlen {
        cu_seqlens_q: cq.view(DType::I32),
        cu_seqlens_k: ck.view(DType::I32),
        max_seqlen_q: c.sq as u64,
        max_seqlen_k: c.sk as u64,
        host_cu_seqlens: match (&c.varlen, &cu_i32) {
            (Some((_, _, true)), Some((a, b))) => Some((a.as_slice(), b.as_slice())),
            _ => None,
        },
        status: 0,
    });
    let s = Stream::from_raw(stream as usize);
    let mut fp = flash::FwdParams::new(
        q_dev.view(dtype),
        k_dev.view(dtype),
        v_dev.view(dtype),
        o_dev.view(dtype),
        Some(lse_dev.view(DType::F32)),
    );
    fp.sm_scale = sm_scale;
    fp.softcap = c.softcap;
    fp.alibi_slopes = alibi_dev.as_ref().map(|t| t.view(DType::F32));
    fp.sinks = sinks_dev.as_ref().map(|t| t.view(DType::F32));
    fp.mask = api_mask(&c.mask);
    fp.bias = bias_dev.as_ref().map(|t| t.view(dtype));
    fp.dropout = drop.as_ref().map(|dr| dr.api(true));
    fp.varlen = varlen;
    fp.allow_tf32 = prec == Precision::Tf32;
    let mut bp = flash::BwdParams::new(
        q_dev.view(dtype),
        k_dev.view(dtype),
        v_dev.view(dtype),
        o_dev.view(dtype),
        do_dev.view(dtype),
        lse_dev.view(DType::F32),
        delta_dev.view(DType::F32),
        dq_dev.view(dtype),
        dk_dev.view(dtype),
        dv_dev.view(dtype),
    );
    bp.sm_scale = sm_scale;
    bp.softcap = c.softcap;
    bp.alibi_slopes = fp.alibi_slopes;
    bp.sinks = fp.sinks;
    bp.dsinks = dsinks_dev.as_ref().map(|t| t.view(DType::F32));
    bp.mask = fp.mask;
    bp.bias = fp.bias;
    bp.dbias = dbias_dev.as_ref().map(|t| t.view(dtype));
    bp.dropout = drop.as_ref().map(|dr| dr.api(false));
    bp.varlen = varlen;
    bp.allow_tf32 = fp.allow_tf32;
    bp.deterministic = c.deterministic;
    fp.backend = backend::get();
    bp.backend = backend::get();
    // Dropout is served by both backends (the same masks: both are held to the host model below).
    let traits = backend::Traits {
        dtype,
        head_dim: d,
        tma_layout: true,
        features: c.bias.is_some() || c.softcap > 0.0 || c.alibi.is_some() || c.sinks.is_some() || c.dv != c.d,
    };
    if backend::forced_gluon() && !traits.gluon_serves() {
        let untouched = || Ok(o_dev.read(stream)? == o_dev.host && dq_dev.read(stream)? == dq_dev.host);
        return gluon_refusal(&c.describe(), &fp, &bp, s, untouched);
    }
    let _workspace = backend::attach_workspace(&mut bp, stream)?;

    let started = Instant::now();
    let mut notes: Vec<String> = Vec::new();
    let mut pass = true;
    // The host mask, and the GPU's debug mask of the same (B, Hq, Sq, Sk) bit for bit.
    let keep = drop.as_ref().map(|dr| dr.host().mask(c.b, hq, c.sq, c.sk));
    if let (Some(dr), Some(keep)) = (&drop, &keep) {
        let (gpu, bad, stray) = gpu_mask(&dr.api(false), [c.b, hq, c.sq, c.sk], 0, stream)?;
        let diff = gpu.iter().zip(keep).filter(|(a, b)| a != b).count();
        let ok = diff == 0 && bad == 0 && stray == 0;
        pass &= ok;
        let kept = keep.iter().filter(|&&x| x == 1).count() as f64 / keep.len() as f64;
        notes.push(format!(
            "debug mask {}{}",
            if ok {
                "= host model".to_string()
            } else {
                format!("{diff} differ, {bad} not 0/1, {stray} stray!")
            },
            format_args!(" (kept {kept:.3})")
        ));
    }
    // Forward.
    if let Err(e) = flash::attn_fwd(&fp, s) {
        return fail(format!("attn_fwd returned {e}"));
    }
    let o_bits = o_dev.read(stream)?;
    let lse_bits = lse_dev.read(stream)?;
    if let Some(dr) = &drop {
        let got: Vec<u64> = download(dr.out_buf.0, 2, stream)?;
        let want = [dr.seed, dr.offset.wrapping_add(dr.base)];
        if got != want {
            pass = false;
            notes.push(format!("seed_out/offset_out {got:x?}, expected {want:x?}!"));
        }
    }
    // Backward.
    if let Err(e) = flash::attn_bwd(&bp, s) {
        return fail(format!("attn_bwd returned {e}"));
    }
    let dq_bits = dq_dev.read(stream)?;
    let dk_bits = dk_dev.read(stream)?;
    let dv_bits = dv_dev.read(stream)?;
    let delta_bits = delta_dev.read(stream)?;
    let dbias_bits = match &dbias_dev {
        Some(t) => t.read(stream)?,
        None => Vec::new(),
    };
    let dsinks_bits = match &dsinks_dev {
        Some(t) => t.read(stream)?,
        None => Vec::new(),
    };
    // Inputs of the backward unchanged.
    let mut changed = backward_inputs_changed([&q_dev, &k_dev, &v_dev, &do_dev, &o_dev], &o_bits, &lse_dev, &lse_bits, stream)?;
    if let Some(b) = &bias_dev
        && b.read(stream)? != b.host
    {
        changed.push("bias");
    }
    if let Some((a, b)) = &cu_dev
        && (a.read(stream)? != a.host || b.read(stream)? != b.host)
    {
        changed.push("cu_seqlens");
    }
    if let Some(t) = &alibi_dev
        && t.read(stream)? != t.host
    {
        changed.push("alibi_slopes");
    }
    if let Some(t) = &sinks_dev
        && t.read(stream)? != t.host
    {
        changed.push("sinks");
    }
    if !changed.is_empty() {
        pass = false;
        notes.push(format!("inputs changed: {}!", changed.join(",")));
    }
    // Deterministic: the same bits on every rerun and on a second stream.
    if c.deterministic {
        let outs: [(&DevTensor<E, 4>, &Vec<E>); 3] = [(&dq_dev, &dq_bits), (&dk_dev, &dk_bits), (&dv_dev, &dv_bits)];
        let mut differing = 0;
        let second = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| format!("cuStreamCreate: {e:?}"))?;
        for run in 1..=REPEATS {
            // Runs 1..REPEATS-1 on the case's stream, the last on the second stream.
            let st = if run == REPEATS { second } else { stream };
            for (t, _) in outs {
                t.restore(st)?;
            }
            delta_dev.restore(st)?;
            if let Some(t) = &dbias_dev {
                t.restore(st)?;
            }
            if let Some(t) = &dsinks_dev {
                t.restore(st)?;
            }
            if let Err(e) = flash::attn_bwd(&bp, Stream::from_raw(st as usize)) {
                let _ = unsafe { result::stream::destroy(second) };
                return fail(format!("attn_bwd (rerun {run}) returned {e}"));
            }
            let mut same = true;
            for (t, want) in outs {
                same &= t.read(st)? == *want;
            }
            if let Some(t) = &dbias_dev {
                same &= t.read(st)? == dbias_bits;
            }
            if let Some(t) = &dsinks_dev {
                same &= t.read(st)? == dsinks_bits;
            }
            differing += !same as usize;
        }
        let _ = unsafe { result::stream::destroy(second) };
        pass &= differing == 0;
        notes.push(format!(
            "determinism: {}/{} reruns identical (last on a 2nd stream){}",
            REPEATS - differing,
            REPEATS,
            if differing > 0 { "!" } else { "" }
        ));
    }
    let gpu_ms = started.elapsed().as_secs_f64() * 1e3;

    // References.
    let started = Instant::now();
    let bias_full = bias_sizes.zip(bias_vals.as_ref()).map(|(sz, vals)| {
        let (b, sq, sk) = (c.b, c.sq, c.sk);
        let mut full = Vec::with_capacity(b * hq * sq * sk);
        for z in 0..b {
            for h in 0..hq {
                for i in 0..sq {
                    let pick = |x: usize, n: usize| if n == 1 { 0 } else { x };
                    let row = ((pick(z, sz[0]) * sz[1] + pick(h, sz[1])) * sz[2] + pick(i, sz[2])) * sk;
                    full.extend_from_slice(&vals[row..row + sk]);
                }
            }
        }
        full
    });
    let bias_full = bias_full.or_else(|| slopes.as_ref().map(|(rows, vals)| alibi_bias(c, *rows, vals)));
    let refs = references(c, &q, &k, &v, &d_o, bias_full.as_deref(), keep.as_deref(), sm_scale);
    let ref_ms = started.elapsed().as_secs_f64() * 1e3;

    // Checks.
    let dec = |bits: Vec<E>| bits.into_iter().map(|x| E::dec(prec, x) as f64).collect::<Vec<f64>>();
    let o = dec(o_dev.logical(&o_bits));
    let dq = dec(dq_dev.logical(&dq_bits));
    let dk = dec(dk_dev.logical(&dk_bits));
    let dv_got = dec(dv_dev.logical(&dv_bits));
    let f32s = |bits: Vec<u32>| bits.into_iter().map(|x| f32::from_bits(x) as f64).collect::<Vec<f64>>();
    let lse = f32s(lse_dev.logical(&lse_bits));
    let delta = f32s(delta_dev.logical(&delta_bits));
    let (ex, nv) = (&refs.exact, &refs.naive);
    let fp32 = !matches!(prec, Precision::Half(_));
    let (k_o, k_g) = if prec == Precision::Tf32 {
        (6.0, 10.0)
    } else {
        (3.0, 5.0)
    };
    let floor = if fp32 { 1e-5 } else { 1e-3 };
    let bounded = |name, got: &[f64], e: &[f64], n: &[f64], k, grad: bool| {
        let (g, e, n) = live(got, e, n);
        Bounded::with_floor(name, &g, &e, &n, k, floor, grad || fp32)
    };
    let mut checks = vec![
        bounded("O", &o, &ex.o, &nv.o, k_o, false),
        bounded("dQ", &dq, &ex.dq, &nv.dq, k_g, true),
        bounded("dK", &dk, &ex.dk, &nv.dk, k_g, true),
        bounded("dV", &dv_got, &ex.dv, &nv.dv, k_g, true),
    ];
    if let (Some(sz), Some(dbias_dev)) = (bias_sizes, &dbias_dev) {
        let full = [c.b, hq, c.sq, c.sk];
        let want = reference::reduce_dbias(&ex.ds, full, sz, None);
        let naive = reference::reduce_dbias(&nv.ds, full, sz, Some(prec));
        let got = dec(dbias_dev.logical(&dbias_bits));
        checks.push(Bounded::with_floor("dBias", &got, &want, &naive, k_g, floor, true));
    }
    if let Some(t) = &dsinks_dev {
        let got: Vec<f64> = t.logical(&dsinks_bits).into_iter().map(|b| f64::from(f32::from_bits(b))).collect();
        checks.push(Bounded::with_floor("dSinks", &got, &ex.dsinks, &nv.dsinks, k_g, floor, true));
    }
    let (lg, le, ln) = live(&lse, &ex.lse, &nv.lse);
    let (lse_ok, lse_text) = check_lse_floor(&lg, &le, &ln, k_o, floor);
    pass &= checks.iter().all(Bounded::pass) && lse_ok;
    let mut line = c.describe();
    let _ = write!(line, "  {}  {lse_text}", checks[0].show());
    for ch in &checks[1..] {
        let _ = write!(line, "  {}", ch.show());
    }
    // Rows without keys: O = dQ = 0 exactly; keys of sequences without queries: dK = dV = 0.
    let mut empty_rows = 0;
    let mut nonzero = 0;
    for (row, l) in ex.lse.iter().enumerate() {
        if *l == f64::INFINITY {
            empty_rows += 1;
            let (r, r_v) = (row * d..(row + 1) * d, row * dv..(row + 1) * dv);
            nonzero += o[r_v].iter().chain(&dq[r]).filter(|&&x| x != 0.0).count();
        }
    }
    let mut idle_keys = 0;
    if let (Some((cq, ck)), Some(_)) = (&cu, &c.varlen) {
        let tk = c.tokens().1;
        for s in 0..c.b {
            if cq[s + 1] == cq[s] {
                for h in 0..hk {
                    for t in ck[s]..ck[s + 1] {
                        idle_keys += 1;
                        let r = (h * tk + t) * d..(h * tk + t + 1) * d;
                        let r_v = (h * tk + t) * dv..(h * tk + t + 1) * dv;
                        nonzero += dk[r].iter().chain(&dv_got[r_v]).filter(|&&x| x != 0.0).count();
                    }
                }
            }
        }
    }
    if empty_rows > 0 {
        let _ = write!(line, "  rows w/o keys {empty_rows}");
    }
    if idle_keys > 0 {
        let _ = write!(line, "  keys w/o queries {idle_keys}");
    }
    if nonzero > 0 {
        pass = false;
        let _ = write!(line, " [{nonzero} nonzero O/dQ/dK/dV in them]!");
    }
    // delta = rowsum(dO ∘ O) with this run's O, on live rows.
    let mut delta_bad = 0;
    for (row, &got) in delta.iter().enumerate() {
        if ex.lse[row].is_nan() {
            continue; // tail token
        }
        let (mut want, mut mag) = (0.0f64, 0.0f64);
        for t in row * dv..(row + 1) * dv {
            want += d_o[t] as f64 * o[t];
            mag += (d_o[t] as f64 * o[t]).abs();
        }
        let ok = (got - want).abs() <= 1e-4 * (1.0 + mag); // false for NaN
        delta_bad += !ok as usize;
    }
    if delta_bad > 0 {
        pass = false;
        let _ = write!(line, "  delta: {delta_bad} rows wrong!");
    }
    // Nothing written outside the views, nor into the tail tokens of packed tensors.
    let mut stray = o_dev.stray(&o_bits)
        + dq_dev.stray(&dq_bits)
        + dk_dev.stray(&dk_bits)
        + dv_dev.stray(&dv_bits)
        + lse_dev.stray(&lse_bits)
        + delta_dev.stray(&delta_bits);
    if let Some(t) = &dbias_dev {
        stray += t.stray(&dbias_bits);
    }
    if let Some(t) = &dsinks_dev {
        stray += t.stray(&dsinks_bits);
    }
    if c.varlen.is_some() {
        let tail = |logical: Vec<E>, exact: &[f64]| {
            logical
                .iter()
                .zip(exact)
                .filter(|(b, e)| e.is_nan() && **b != E::POISON)
                .count()
        };
        stray += tail(o_dev.logical(&o_bits), &ex.o)
            + tail(dq_dev.logical(&dq_bits), &ex.dq)
            + tail(dk_dev.logical(&dk_bits), &ex.dk)
            + tail(dv_dev.logical(&dv_bits), &ex.dv);
        let tail32 = |logical: Vec<u32>| {
            logical
                .iter()
                .zip(&ex.lse)
                .filter(|(b, e)| e.is_nan() && **b != POISON32)
                .count()
        };
        stray += tail32(lse_dev.logical(&lse_bits)) + tail32(delta_dev.logical(&delta_bits));
    }
    if stray > 0 {
        pass = false;
        let _ = write!(line, "  {stray} writes outside the views / sequences!");
    }
    for n in notes {
        let _ = write!(line, "  {n}");
    }
    let _ = write!(
        line,
        "  (gpu {gpu_ms:.0} ms, ref {ref_ms:.0} ms)  {}",
        if pass { "PASS" } else { "FAIL" }
    );
    Ok(Outcome { pass, line })
}

/// `debug_dropout_mask` equals the host model bit for bit: several shapes (Sk not a multiple of
/// 4), offsets with a nonzero base, a carry into the counter's high word, a padded row pitch.
pub(crate) fn debug_mask_cases() -> Vec<([usize; 4], f32, u64, u64, u64, usize)> {
    // (sizes, p, seed, *offset, offset_base, row padding)
    vec![
        ([1, 1, 1, 1], 0.5, 1, 0, 0, 0),
        ([2, 3, 37, 61], 0.2, 0x0123_4567_89ab_cdef, 12345, 678, 0),
        ([3, 2, 5, 130], 0.7, 0xdead_beef_0000_0001, 0xffff_fff0, 0x20, 3),
        ([1, 4, 128, 7], 0.05, u64::MAX, 1 << 40, 1, 0),
        ([2, 1, 333, 258], 0.5, 42, 99, 0, 1),
    ]
}

pub(crate) fn debug_mask_case(
    case: ([usize; 4], f32, u64, u64, u64, usize),
    stream: sys::CUstream,
) -> Result<Outcome, String> {
    let (sizes, p, seed, offset, base, pad) = case;
    let seed_buf = DevBuf::new(8)?;
    let offset_buf = DevBuf::new(8)?;
    upload(seed_buf.0, &[seed], stream)?;
    upload(offset_buf.0, &[offset], stream)?;
    let dropout = Dropout {
        offset_base: base,
        ..Dropout::new(p, seed_buf.0, offset_buf.0)
    };
    let (gpu, bad, stray) = gpu_mask(&dropout, sizes, pad, stream)?;
    let host = HostDropout {
        p,
        seed,
        offset: offset.wrapping_add(base),
    }
    .mask(sizes[0], sizes[1], sizes[2], sizes[3]);
    let diff = gpu.iter().zip(&host).filter(|(a, b)| a != b).count();
    let pass = diff == 0 && bad == 0 && stray == 0;
    Ok(Outcome {
        pass,
        line: format!(
            "debug_dropout_mask {sizes:?} p={p} seed={seed:#x} offset={offset:#x}+{base:#x} pad={pad}: {} of {} differ from \
             the host Philox model, {bad} not 0/1, {stray} stray  {}",
            diff,
            host.len(),
            if pass { "PASS" } else { "FAIL" }
        ),
    })
}

/// Keep rate of the debug mask over 2·4·509·257 ≈ 1.05·10⁶ elements within 5σ of 1 − p, and
/// equal to the host model.
pub(crate) fn keep_rate_case(p: f32, stream: sys::CUstream) -> Result<Outcome, String> {
    let sizes = [2, 4, 509, 257];
    let seed_buf = DevBuf::new(8)?;
    let offset_buf = DevBuf::new(8)?;
    let (seed, offset) = (0x5eed_0000_0000_0000 | (p.to_bits() as u64), 1000);
    upload(seed_buf.0, &[seed], stream)?;
    upload(offset_buf.0, &[offset], stream)?;
    let dropout = Dropout::new(p, seed_buf.0, offset_buf.0);
    let (gpu, bad, stray) = gpu_mask(&dropout, sizes, 0, stream)?;
    let n = gpu.len() as f64;
    let kept = gpu.iter().filter(|&&x| x == 1).count() as f64;
    let pd = p as f64;
    let sigma = (pd * (1.0 - pd) / n).sqrt();
    let z = (kept / n - (1.0 - pd)) / sigma;
    let host = HostDropout { p, seed, offset }.mask(sizes[0], sizes[1], sizes[2], sizes[3]);
    let same = host == gpu;
    let pass = z.abs() <= 5.0 && bad == 0 && stray == 0 && same;
    Ok(Outcome {
        pass,
        line: format!(
            "keep rate p={p}: {kept}/{n} kept = {:.5} (1-p = {:.2}, z = {z:+.2}, |z| <= 5){}  {}",
            kept / n,
            1.0 - pd,
            if same {
                ", = host model"
            } else {
                ", differs from the host model!"
            },
            if pass { "PASS" } else { "FAIL" }
        ),
    })
}

/// The mask the forward and backward use is the debug mask, bit for bit: V = identity gives
/// O[i, j] = P_ij·M_ij·r, dO = shifted identities give dV[j, g·Sq + i] = P_ij·M_ij·r for query
/// head g of each group. Q, K moderate (N(0, 0.25)): P has no underflow.
/// (precision, D, B, Hq, Hk, Sq, Sk, p)
pub(crate) type RevealCase = (Precision, usize, usize, usize, usize, usize, usize, f32);

pub(crate) fn reveal_cases() -> Vec<RevealCase> {
    use Lowp::{BF16, F16};
    // (precision, D, B, Hq, Hk, Sq, Sk, p)
    vec![
        (Precision::Half(BF16), 128, 2, 4, 2, 64, 127, 0.3),
        (Precision::Half(F16), 256, 1, 8, 2, 61, 250, 0.6),
        (Precision::Half(BF16), 128, 3, 2, 2, 128, 128, 0.5),
        (Precision::Half(F16), 64, 2, 3, 1, 21, 61, 0.1),
        (Precision::F32, 64, 1, 2, 1, 32, 61, 0.5),
    ]
}

pub(crate) fn reveal_case(case: RevealCase, rng: &mut SplitMix64, stream: sys::CUstream) -> Result<Outcome, String> {
    match case.0 {
        Precision::Half(_) => reveal_typed::<u16>(case, rng, stream),
        _ => reveal_typed::<u32>(case, rng, stream),
    }
}

fn reveal_typed<E: Elem>(case: RevealCase, rng: &mut SplitMix64, stream: sys::CUstream) -> Result<Outcome, String> {
    let (prec, d, b, hq, hk, sq, sk, p) = case;
    let g = hq / hk;
    assert!(sk <= d && g * sq <= d);
    let dtype = api_dtype(prec);
    let label = format!(
        "mask reveal {} D={d} B={b} Hq={hq} Hk={hk} Sq={sq} Sk={sk} p={p}",
        prec.name()
    );
    let small = |rng: &mut SplitMix64| prec.round(0.5 * draw(prec, rng));
    let q: Vec<f32> = (0..b * hq * sq * d).map(|_| small(rng)).collect();
    let k: Vec<f32> = (0..b * hk * sk * d).map(|_| small(rng)).collect();
    let v: Vec<f32> = (0..b * hk * sk * d)
        .map(|x| ((x / d) % sk == x % d) as u8 as f32)
        .collect();
    let d_o: Vec<f32> = (0..b * hq * sq * d)
        .map(|x| {
            let (h, i, t) = ((x / (sq * d)) % hq, (x / d) % sq, x % d);
            (t == (h % g) * sq + i) as u8 as f32
        })
        .collect();
    let enc = |x: &[f32]| x.iter().map(|&y| E::enc(prec, y)).collect::<Vec<E>>();
    let dev = StepTensors::contiguous([b, hq, hk, sq, sk, d], [&enc(&q), &enc(&k), &enc(&v), &enc(&d_o)], E::POISON, stream)?;
    let drop = DropoutBufs::new(p, rng, stream)?;
    let s = Stream::from_raw(stream as usize);
    let mut fp = dev.fwd_params(dtype);
    fp.dropout = Some(drop.api(false));
    let mut bp = dev.bwd_params(dtype);
    bp.dropout = fp.dropout;
    // Forced Gluon: the masks its kernels draw are revealed the same way (fp32 is refused).
    fp.backend = backend::get();
    bp.backend = backend::get();
    let traits = backend::Traits { dtype, head_dim: d, tma_layout: true, features: false };
    if backend::forced_gluon() && !traits.gluon_serves() {
        let untouched = || Ok(dev.o.read(stream)? == dev.o.host && dev.dq.read(stream)? == dev.dq.host);
        return gluon_refusal(&label, &fp, &bp, s, untouched);
    }
    let _workspace = backend::attach_workspace(&mut bp, stream)?;
    let fail = |what: String| {
        Ok(Outcome {
            pass: false,
            line: format!("{label}  {what}  FAIL"),
        })
    };
    if let Err(e) = flash::attn_fwd(&fp, s) {
        return fail(format!("attn_fwd returned {e}"));
    }
    if let Err(e) = flash::attn_bwd(&bp, s) {
        return fail(format!("attn_bwd returned {e}"));
    }
    let o = dev.o.logical(&dev.o.read(stream)?);
    let dv = dev.dv.logical(&dev.dv.read(stream)?);
    let (gpu, bad, _) = gpu_mask(&drop.api(false), [b, hq, sq, sk], 0, stream)?;
    let host = drop.host().mask(b, hq, sq, sk);
    // Nonzero and written (NaN poison counts as a mismatch either way).
    let kept_in = |x: E| E::dec(prec, x) != 0.0 && !E::dec(prec, x).is_nan();
    let written = |x: E| !E::dec(prec, x).is_nan();
    let (mut o_diff, mut dv_diff, mut o_extra) = (0usize, 0usize, 0usize);
    for z in 0..b {
        for h in 0..hq {
            let hkv = h / g;
            for i in 0..sq {
                for j in 0..sk {
                    let m = gpu[((z * hq + h) * sq + i) * sk + j] == 1;
                    let ob = o[((z * hq + h) * sq + i) * d + j];
                    o_diff += (kept_in(ob) != m || !written(ob)) as usize;
                    let vb = dv[((z * hk + hkv) * sk + j) * d + (h % g) * sq + i];
                    dv_diff += (kept_in(vb) != m || !written(vb)) as usize;
                }
                // Columns past Sk of O: V has no such rows, so exactly 0.
                o_extra += (sk..d)
                    .filter(|&t| E::dec(prec, o[((z * hq + h) * sq + i) * d + t]) != 0.0)
                    .count();
            }
        }
    }
    let host_diff = gpu.iter().zip(&host).filter(|(a, b)| a != b).count();
    let pass = o_diff == 0 && dv_diff == 0 && o_extra == 0 && bad == 0 && host_diff == 0;
    let kept = gpu.iter().filter(|&&x| x == 1).count();
    Ok(Outcome {
        pass,
        line: format!(
            "{label}: {} elements, {kept} kept; (O≠0) vs debug mask {o_diff} differ, (dV≠0) vs debug mask {dv_diff} differ, \
             O past Sk nonzero {o_extra}, debug vs host {host_diff} differ  {}",
            gpu.len(),
            if pass { "PASS" } else { "FAIL" }
        ),
    })
}

/// CUDA graph: forward + backward with dropout captured on the stream (kernels loaded by a warm-up
/// run first), replayed twice after writing a new offset into the offset buffer with
/// cuMemcpyHtoD; each replay's O, LSE, dQ, dK, dV must equal an eager run with that offset bit for
/// bit (and differ from the run with the old offset).
pub(crate) fn graph_case(rng: &mut SplitMix64, stream: sys::CUstream) -> Result<Outcome, String> {
    let prec = Precision::Half(Lowp::BF16);
    let (b, hq, hk, sq, sk, d) = (2usize, 4usize, 2usize, 200usize, 173usize, 64usize);
    let dtype = api_dtype(prec);
    let label =
        format!("CUDA graph bf16 D={d} B={b} Hq={hq} Hk={hk} Sq={sq} Sk={sk} dropout=0.3 bias=[B,1,1,Sk] causal-BR");
    let mut make = |n: usize| {
        (0..n)
            .map(|_| <u16 as Elem>::enc(prec, draw(prec, rng)))
            .collect::<Vec<u16>>()
    };
    let (nq, nk) = (b * hq * sq * d, b * hk * sk * d);
    let dev = StepTensors::contiguous([b, hq, hk, sq, sk, d], [&make(nq), &make(nk), &make(nk), &make(nq)], POISON16, stream)?;
    let bias_dev = DevTensor::new(contiguous([b, 1, 1, sk]), Some(&make(b * sk)), POISON16, stream)?;
    let dbias_dev = DevTensor::new(contiguous([b, 1, 1, sk]), None, POISON16, stream)?;
    let drop = DropoutBufs::new(0.3, rng, stream)?;
    let s = Stream::from_raw(stream as usize);
    let mut fp = dev.fwd_params(dtype);
    fp.mask = Mask::causal(MaskAlign::BottomRight);
    fp.bias = Some(bias_dev.view(dtype));
    fp.dropout = Some(drop.api(false));
    let mut bp = dev.bwd_params(dtype);
    bp.mask = fp.mask;
    bp.bias = fp.bias;
    bp.dbias = Some(dbias_dev.view(dtype));
    bp.dropout = fp.dropout;
    if backend::forced_gluon() {
        fp.backend = backend::get();
        bp.backend = backend::get();
        let untouched = || Ok(dev.o.read(stream)? == dev.o.host && dev.dq.read(stream)? == dev.dq.host);
        return gluon_refusal(&label, &fp, &bp, s, untouched);
    }
    let fail = |what: String| {
        Ok(Outcome {
            pass: false,
            line: format!("{label}  {what}  FAIL"),
        })
    };
    let poison = || -> Result<(), String> {
        for t in [&dev.o, &dev.dq, &dev.dk, &dev.dv, &dbias_dev] {
            t.restore(stream)?;
        }
        dev.lse.restore(stream)?;
        dev.delta.restore(stream)?;
        sync(stream)
    };
    type Snap = (Vec<u16>, Vec<u32>, Vec<u16>, Vec<u16>, Vec<u16>, Vec<u16>);
    let snapshot = || -> Result<Snap, String> {
        Ok((
            dev.o.read(stream)?,
            dev.lse.read(stream)?,
            dev.dq.read(stream)?,
            dev.dk.read(stream)?,
            dev.dv.read(stream)?,
            dbias_dev.read(stream)?,
        ))
    };
    let eager = |offset: u64| -> Result<Result<Snap, String>, String> {
        upload(drop.offset_buf.0, &[offset], stream)?;
        poison()?;
        if let Err(e) = flash::attn_fwd(&fp, s) {
            return Ok(Err(format!("eager attn_fwd returned {e}")));
        }
        if let Err(e) = flash::attn_bwd(&bp, s) {
            return Ok(Err(format!("eager attn_bwd returned {e}")));
        }
        Ok(Ok(snapshot()?))
    };
    // Warm-up (loads every kernel) with the first offset.
    let first = match eager(drop.offset)? {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    // Capture.
    unsafe { result::stream::begin_capture(stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL) }
        .map_err(|e| format!("cuStreamBeginCapture: {e:?}"))?;
    let fwd = flash::attn_fwd(&fp, s);
    let bwd = flash::attn_bwd(&bp, s);
    let graph = unsafe { result::stream::end_capture(stream) }.map_err(|e| format!("cuStreamEndCapture: {e:?}"))?;
    if let Err(e) = fwd.and(bwd) {
        let _ = unsafe { result::graph::destroy(graph) };
        return fail(format!("attn_fwd/attn_bwd under capture returned {e}"));
    }
    let exec = unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
    let exec = match exec {
        Ok(x) => x,
        Err(e) => {
            let _ = unsafe { result::graph::destroy(graph) };
            return fail(format!("cuGraphInstantiate: {e:?}"));
        }
    };
    let mut notes = Vec::new();
    let mut pass = true;
    let offsets = [
        drop.offset + flash::dropout_offsets_consumed(b as u64, hq as u64, sq as u64, sk as u64).expect("small sizes"),
        0x1234_5678_9abc,
    ];
    for (n, &offset) in offsets.iter().enumerate() {
        // A new offset, written outside the graph; outputs poisoned; replay.
        let replay = (|| -> Result<Snap, String> {
            poison()?;
            unsafe { result::memcpy_htod_sync(drop.offset_buf.0, &[offset]) }
                .map_err(|e| format!("cuMemcpyHtoD: {e:?}"))?;
            unsafe { result::graph::launch(exec, stream) }.map_err(|e| format!("cuGraphLaunch: {e:?}"))?;
            sync(stream)?;
            snapshot()
        })();
        let replay = match replay {
            Ok(x) => x,
            Err(e) => {
                pass = false;
                notes.push(format!("replay {n}: {e}!"));
                continue;
            }
        };
        let want = match eager(offset)? {
            Ok(x) => x,
            Err(e) => {
                pass = false;
                notes.push(e);
                continue;
            }
        };
        let same = replay == want;
        let moved = replay.0 != first.0 && replay.2 != first.2;
        let nan = replay
            .0
            .iter()
            .chain(&replay.2)
            .chain(&replay.3)
            .chain(&replay.4)
            .filter(|&&x| x == POISON16)
            .count();
        pass &= same && moved;
        notes.push(format!(
            "replay {n} (offset {offset:#x}): {} eager, {} the first offset's{}",
            if same {
                "=="
            } else {
                "!= (O/LSE/dQ/dK/dV/dBias differ)!"
            },
            if moved { "differs from" } else { "SAME AS!" },
            if nan > 0 {
                format!(" [{nan} poison left]")
            } else {
                String::new()
            }
        ));
    }
    unsafe {
        let _ = result::graph::exec_destroy(exec);
        let _ = result::graph::destroy(graph);
    }
    Ok(Outcome {
        pass,
        line: format!("{label}: {}  {}", notes.join("; "), if pass { "PASS" } else { "FAIL" }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ext_cases_are_consistent() {
        let all = ext_cases();
        for c in &all {
            assert!(
                c.hq % c.hk == 0 && c.d % 8 == 0 && c.cost() <= MAX_COST,
                "{}",
                c.describe()
            );
            if let Some((lq, lk, _)) = &c.varlen {
                assert_eq!((c.sq, c.sk), (*lq.iter().max().unwrap(), *lk.iter().max().unwrap()));
            }
        }
        let count = |f: &dyn Fn(&Ext) -> bool| all.iter().filter(|c| f(c)).count();
        // Every bias broadcast pattern that matters, with and without masks and dropout.
        for pattern in [
            [false; 3],
            [true, false, false],
            [false, true, false],
            [false, true, true],
            [true, true, true],
            [true, true, false],
            [false, false, true],
        ] {
            assert!(count(&|c| c.bias == Some(pattern)) >= 1, "{pattern:?}");
        }
        assert!(count(&|c| c.bias.is_some() && c.dropout.is_some()) >= 3);
        assert!(count(&|c| c.bias.is_some() && (c.mask.left, c.mask.right) != (-1, -1)) >= 5);
        assert!(count(&|c| c.varlen.is_some()) >= 5);
        assert!(
            count(&|c| c
                .varlen
                .as_ref()
                .is_some_and(|(q, k, _)| q.contains(&0) && k.contains(&0)))
                >= 2
        );
        assert!(
            count(&|c| c
                .varlen
                .as_ref()
                .is_some_and(|(q, k, _)| q.contains(&1) || k.contains(&1)))
                >= 3
        );
        assert!(count(&|c| c.varlen.is_some() && c.mask.bottom_right) >= 2);
        assert!(count(&|c| c.prec == Precision::F32) >= 4 && count(&|c| c.prec == Precision::Tf32) >= 2);
        assert!(count(&|c| c.deterministic && c.group() > 1 && c.bias.is_some() && c.dropout.is_some()) >= 2);
        for (prec, d, _, hq, hk, sq, sk, _) in reveal_cases() {
            let _ = prec;
            assert!(sk <= d && (hq / hk) * sq <= d);
        }
    }

    /// The per-sequence reference of a packed batch equals the batched reference when every
    /// sequence has the same lengths (checks the gathering and scattering of `references`).
    #[test]
    fn packed_reference_matches_batched() {
        let (b, hq, hk, s_q, s_k, d) = (3, 4, 2, 6, 9, 8);
        let none = mk(-1, 0, true);
        let mut pc = packed(Precision::Half(Lowp::BF16), d, hq, hk, &[s_q; 3], &[s_k; 3], none, true);
        pc.bias = Some([false; 3]);
        pc.dropout = Some(0.3);
        let bc = Ext {
            varlen: None,
            ..pc.clone()
        };
        let (tq, tk) = pc.tokens();
        assert_eq!((tq, tk), (b * s_q + TAIL, b * s_k + TAIL));
        let mut rng = SplitMix64::new(3);
        let mut make = |n: usize| (0..n).map(|_| rng.normal_in(Lowp::BF16)).collect::<Vec<f32>>();
        let (q, k, v, d_o) = (
            make(hq * tq * d),
            make(hk * tk * d),
            make(hk * tk * d),
            make(hq * tq * d),
        );
        let bias = make(b * hq * s_q * s_k);
        let keep = HostDropout {
            p: 0.3,
            seed: 9,
            offset: 4,
        }
        .mask(b, hq, s_q, s_k);
        // Packed [H, T, D] -> batched [B, H, S, D].
        let unpack = |x: &[f32], h: usize, t: usize, s: usize| {
            let mut out = Vec::new();
            for z in 0..b {
                for hh in 0..h {
                    for i in 0..s {
                        let at = (hh * t + z * s + i) * d;
                        out.extend_from_slice(&x[at..at + d]);
                    }
                }
            }
            out
        };
        let pr = references(&pc, &q, &k, &v, &d_o, Some(&bias), Some(&keep), 0.35);
        let br = references(
            &bc,
            &unpack(&q, hq, tq, s_q),
            &unpack(&k, hk, tk, s_k),
            &unpack(&v, hk, tk, s_k),
            &unpack(&d_o, hq, tq, s_q),
            Some(&bias),
            Some(&keep),
            0.35,
        );
        let unpack64 = |x: &[f64], h: usize, t: usize, s: usize, w: usize| {
            let mut out = Vec::new();
            for z in 0..b {
                for hh in 0..h {
                    for i in 0..s {
                        let at = (hh * t + z * s + i) * w;
                        out.extend_from_slice(&x[at..at + w]);
                    }
                }
            }
            out
        };
        for (name, a, bb) in [
            ("o", unpack64(&pr.exact.o, hq, tq, s_q, d), &br.exact.o),
            ("dq", unpack64(&pr.exact.dq, hq, tq, s_q, d), &br.exact.dq),
            ("dk", unpack64(&pr.exact.dk, hk, tk, s_k, d), &br.exact.dk),
            ("dv", unpack64(&pr.exact.dv, hk, tk, s_k, d), &br.exact.dv),
            ("lse", unpack64(&pr.exact.lse, hq, tq, s_q, 1), &br.exact.lse),
            ("ds", pr.exact.ds.clone(), &br.exact.ds),
            ("naive o", unpack64(&pr.naive.o, hq, tq, s_q, d), &br.naive.o),
        ] {
            assert_eq!(a.len(), bb.len(), "{name}");
            for (x, y) in a.iter().zip(bb.iter()) {
                assert!(x == y || (x - y).abs() < 1e-12, "{name}: {x} vs {y}");
            }
        }
        // Tail tokens are NaN (excluded from comparisons, checked for poison).
        assert!(pr.exact.o[(tq - 1) * d].is_nan() && pr.exact.lse[tq - 1].is_nan());
    }
}
