//! CPU references of attention forward and backward, on logical row-major tensors whose f32
//! values are already rounded to the input dtype: q, dO are B×Hq×Sq×D, k, v are B×Hk×Sk×D.
//!
//! Per query head h (K/V head h / G, G = Hq / Hk), with `vis(i, j)` the mask below:
//!
//! ```text
//!   S  = scale · Q Kᵀ                      (−inf where not vis)
//!   P  = softmax_rows(S)                   (a row with no visible key: P = 0, O = 0, LSE = +inf)
//!   O  = P V                LSE_i = ln Σ_j exp(S_ij)
//!   dV = Pᵀ dO              dP = dO Vᵀ       D_i = Σ_t dO_it O_it
//!   dS = P ∘ (dP − D)       dQ = scale · dS K        dK = scale · dSᵀ Q
//!   dK, dV of a K/V head = the sum of the dK, dV of the G query heads sharing it.
//! ```
//!
//! With an additive bias (B×Hq×Sq×Sk, already broadcast) and a dropout keep-mask M (same
//! sizes, scale r = 1/(1−p)):
//!
//! ```text
//!   S  = scale · Q Kᵀ + bias               P = softmax_rows(S)     (LSE ignores dropout)
//!   O  = (P∘M·r) V          dV = (P∘M·r)ᵀ dO
//!   dP = dO Vᵀ ∘ M·r        dS = P ∘ (dP − D)      dBias = dS (summed over broadcast dims)
//! ```
//!
//! The same function `head` computes this twice (one generic body, so both references are the
//! same math by construction):
//! * `exact`: in f64, nothing rounded;
//! * `naive`: in f32, every matrix product accumulated in f32 and its result rounded to the input
//!   dtype (S, P, O, dP, dS, dQ, dK, dV); softmax, LSE and D in f32. For fp32 inputs nothing is
//!   rounded (the same math in f32); for TF32 the inputs of every matrix product are rounded to
//!   TF32 (10-bit mantissa, truncated as the tensor cores do) and the products accumulated in f32.
//!
//! The naive error against `exact` sets the scale of the error a kernel is allowed.
//!
//! Mask: query i sees key j iff  i + off − left ≤ j ≤ i + off + right  (and j < Sk), where
//! off = 0 (top-left) or Sk − Sq (bottom-right) and −1 leaves a side unbounded.
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::lowp::Lowp;

/// A window mask; causal is `left = −1, right = 0`; no mask is `−1, −1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskSpec {
    pub left: i64,
    pub right: i64,
    pub bottom_right: bool,
}

impl MaskSpec {
    /// Whether query row `i` sees key `j` (0 ≤ j < sk).
    pub fn visible(&self, i: usize, j: usize, sq: usize, sk: usize) -> bool {
        let off = if self.bottom_right { sk as i64 - sq as i64 } else { 0 };
        let diag = i as i64 + off;
        let j = j as i64;
        (self.left < 0 || j >= diag - self.left) && (self.right < 0 || j <= diag + self.right)
    }
}

/// The precision the naive reference imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// fp16 / bf16 inputs: products rounded to the dtype.
    Half(Lowp),
    /// IEEE fp32: nothing rounded.
    F32,
    /// fp32 inputs with TF32 products: the inputs of each product rounded to a 10-bit mantissa.
    Tf32,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Half(t) => t.name(),
            Precision::F32 => "fp32",
            Precision::Tf32 => "tf32",
        }
    }
    /// Rounds a value to the storage type (identity for fp32).
    pub fn round(self, x: f32) -> f32 {
        match self {
            Precision::Half(t) => t.round(x),
            _ => x,
        }
    }
}

/// An f32 as the tensor cores read it in TF32 mode: the 13 low mantissa bits dropped (toward
/// zero; Hopper's TF32 matrix products truncate fp32 inputs, they do not round them).
pub fn round_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    f32::from_bits(x.to_bits() & !0x1fff)
}

pub struct Problem<'a> {
    pub dtype: Precision,
    pub batch: usize,
    pub heads_q: usize,
    pub heads_k: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub head_dim: usize,
    /// V's head dim (also O's, dO's and dV's); `head_dim` for the usual call.
    pub head_dim_v: usize,
    pub mask: MaskSpec,
    pub sm_scale: f32,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub d_o: &'a [f32],
    /// Additive bias B×Hq×Sq×Sk (broadcast already expanded), values in the input dtype.
    pub bias: Option<&'a [f32]>,
    /// Dropout: keep-mask B×Hq×Sq×Sk (1 kept) and the scale 1/(1−p).
    pub dropout: Option<(&'a [u8], f32)>,
    /// Logit soft-capping: scale·q·k becomes cap·tanh(scale·q·k / cap) before the bias; 0 = off.
    pub softcap: f32,
    /// Attention sinks, one logit per query head (Hq): each row's normaliser also counts
    /// exp(sink); a row without keys then has O = 0 and LSE = its sink.
    pub sinks: Option<&'a [f32]>,
}

impl<'a> Problem<'a> {
    /// The plain call: shape `[batch, heads_q, heads_k, seqlen_q, seqlen_k, head_dim]` (V's head dim
    /// the same), inputs `[q, k, v, d_o]`, no bias, dropout, softcap or sinks; a variant sets its
    /// fields over it (`Problem { sinks: Some(..), ..Problem::plain(..) }`).
    pub fn plain(dtype: Precision, shape: [usize; 6], mask: MaskSpec, sm_scale: f32, inputs: [&'a [f32]; 4]) -> Self {
        let [batch, heads_q, heads_k, seqlen_q, seqlen_k, head_dim] = shape;
        let [q, k, v, d_o] = inputs;
        Problem {
            dtype,
            batch,
            heads_q,
            heads_k,
            seqlen_q,
            seqlen_k,
            head_dim,
            head_dim_v: head_dim,
            mask,
            sm_scale,
            q,
            k,
            v,
            d_o,
            bias: None,
            dropout: None,
            softcap: 0.0,
            sinks: None,
        }
    }
}

/// Outputs in logical order: O B×Hq×Sq×Dv, dQ B×Hq×Sq×D; LSE B×Hq×Sq (+inf for rows with no
/// key); dK B×Hk×Sk×D, dV B×Hk×Sk×Dv.
pub struct Outputs {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
    /// dS = ∂L/∂S, B×Hq×Sq×Sk (the bias gradient before summing over broadcast dims); only
    /// computed when the problem has a bias.
    pub ds: Vec<f64>,
    /// The sinks' gradient, Hq: −Σ_{b,i} exp(sink − LSE) · rowsum(dO ∘ O); empty without sinks.
    pub dsinks: Vec<f64>,
}

/// The arithmetic the generic `head` needs, for f64 (exact) and f32 (naive).
pub trait Real:
    Copy
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + std::ops::AddAssign
    + Send
    + Sync
{
    const ZERO: Self;
    const INF: Self;
    fn of(x: f32) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn tanh(self) -> Self;
    fn to_f64(self) -> f64;
}

impl Real for f64 {
    const ZERO: Self = 0.0;
    const INF: Self = f64::INFINITY;
    fn of(x: f32) -> Self {
        x as f64
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn ln(self) -> Self {
        f64::ln(self)
    }
    fn tanh(self) -> Self {
        f64::tanh(self)
    }
    fn to_f64(self) -> f64 {
        self
    }
}

impl Real for f32 {
    const ZERO: Self = 0.0;
    const INF: Self = f32::INFINITY;
    fn of(x: f32) -> Self {
        x
    }
    fn exp(self) -> Self {
        f32::exp(self)
    }
    fn ln(self) -> Self {
        f32::ln(self)
    }
    fn tanh(self) -> Self {
        f32::tanh(self)
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

/// C = A·B for row-major A (m×n_inner) and B (n_inner×n), accumulated in T.
fn matmul<T: Real>(a: &[T], b: &[T], m: usize, n_inner: usize, n: usize) -> Vec<T> {
    let mut c = vec![T::ZERO; m * n];
    for i in 0..m {
        let ci = &mut c[i * n..(i + 1) * n];
        for p in 0..n_inner {
            let aip = a[i * n_inner + p];
            if aip == T::ZERO {
                continue; // adds exactly nothing (inputs are finite); masked P and dS are mostly 0
            }
            for (c, &b) in ci.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *c += aip * b;
            }
        }
    }
    c
}

/// `matmul` with the inputs first rounded by `round_in` (TF32), if any.
fn mm<T: Real>(a: &[T], b: &[T], m: usize, n_inner: usize, n: usize, round_in: Option<&dyn Fn(T) -> T>) -> Vec<T> {
    match round_in {
        None => matmul(a, b, m, n_inner, n),
        Some(r) => {
            let ra: Vec<T> = a.iter().map(|&x| r(x)).collect();
            let rb: Vec<T> = b.iter().map(|&x| r(x)).collect();
            matmul(&ra, &rb, m, n_inner, n)
        }
    }
}

/// Transpose of a row-major rows×cols matrix.
fn transpose<T: Real>(a: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut t = vec![T::ZERO; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = a[r * cols + c];
        }
    }
    t
}

/// One query head's results; dK and dV are this head's contribution, not yet summed or rounded.
struct HeadOut<T> {
    o: Vec<T>,
    lse: Vec<T>,
    dq: Vec<T>,
    dk: Vec<T>,
    dv: Vec<T>,
    ds: Vec<T>,
    /// This head's (one sequence's) share of its sink's gradient.
    dsink: T,
}

/// The formulas of the module docs for query head `bh` (= b·Hq + h). `round` is the identity
/// for the exact reference and rounding to the dtype for the naive one.
fn head<T: Real>(p: &Problem, bh: usize, round: &dyn Fn(T) -> T, round_in: Option<&dyn Fn(T) -> T>) -> HeadOut<T> {
    let (sq, sk, d, dv) = (p.seqlen_q, p.seqlen_k, p.head_dim, p.head_dim_v);
    let group = p.heads_q / p.heads_k;
    let (b, h) = (bh / p.heads_q, bh % p.heads_q);
    let bhk = b * p.heads_k + h / group; // the K/V head this query head reads
    let load = |x: &[f32], at: usize, len: usize| x[at..at + len].iter().map(|&v| T::of(v)).collect::<Vec<T>>();
    let q = load(p.q, bh * sq * d, sq * d);
    let d_o = load(p.d_o, bh * sq * dv, sq * dv);
    let k = load(p.k, bhk * sk * d, sk * d);
    let v = load(p.v, bhk * sk * dv, sk * dv);
    let scale = T::of(p.sm_scale);
    let bias = p.bias.map(|b| load(b, bh * sq * sk, sq * sk));
    // Dropout factor per element: M·r (0 or r); 1 without dropout.
    let keep = p.dropout.map(|(m, r)| {
        m[bh * sq * sk..(bh + 1) * sq * sk]
            .iter()
            .map(|&kept| if kept != 0 { T::of(r) } else { T::ZERO })
            .collect::<Vec<T>>()
    });

    // S = cap(scale · Q Kᵀ) + bias (Sq×Sk), then P = softmax over visible keys, LSE. With
    // soft-capping cap(x) = c·tanh(x / c), and `tanh` keeps the tanh for the backward.
    let cap = T::of(p.softcap);
    let mut tanh = Vec::new();
    let scores: Vec<T> = mm(&q, &transpose(&k, sk, d), sq, d, sk, round_in)
        .into_iter()
        .map(|x| round(x * scale))
        .collect();
    let capped: Vec<T> = if p.softcap > 0.0 {
        tanh = scores.iter().map(|&x| round((x / cap).tanh())).collect();
        tanh.iter().map(|&t| round(cap * t)).collect()
    } else {
        scores
    };
    let s: Vec<T> = capped
        .into_iter()
        .enumerate()
        .map(|(at, x)| match &bias {
            Some(bias) => round(x + bias[at]),
            None => x,
        })
        .collect();
    let mut pr = vec![T::ZERO; sq * sk]; // P before rounding
    let mut lse = vec![T::INF; sq];
    let sink = p.sinks.map(|t| T::of(t[h]));
    for i in 0..sq {
        let row = &s[i * sk..(i + 1) * sk];
        let vis = |j: usize| p.mask.visible(i, j, sq, sk);
        let mut m = sink.unwrap_or(-T::INF);
        for j in (0..sk).filter(|&j| vis(j)) {
            if row[j] > m {
                m = row[j];
            }
        }
        if m == -T::INF {
            continue; // no visible key (and no sink): P row 0, LSE +inf
        }
        // The sink is one more term of the normaliser, with no value.
        let mut l = sink.map_or(T::ZERO, |t| (t - m).exp());
        for j in (0..sk).filter(|&j| vis(j)) {
            l += (row[j] - m).exp();
        }
        for j in (0..sk).filter(|&j| vis(j)) {
            pr[i * sk + j] = (row[j] - m).exp() / l;
        }
        lse[i] = m + l.ln();
    }
    let pm: Vec<T> = pr.iter().map(|&x| round(x)).collect();
    // The P that multiplies V: P∘M·r with dropout.
    let pd: Vec<T> = match &keep {
        Some(keep) => pr.iter().zip(keep).map(|(&x, &f)| round(x * f)).collect(),
        None => pm.clone(),
    };

    // O = Pd V; dV = Pdᵀ dO; dP = dO Vᵀ ∘ M·r; D = rowsum(dO ∘ O); dS = P ∘ (dP − D).
    let o: Vec<T> = mm(&pd, &v, sq, sk, dv, round_in).into_iter().map(round).collect();
    let d_v = mm(&transpose(&pd, sq, sk), &d_o, sk, sq, dv, round_in);
    let dp: Vec<T> = mm(&d_o, &transpose(&v, sk, dv), sq, dv, sk, round_in)
        .into_iter()
        .enumerate()
        .map(|(at, x)| match &keep {
            Some(keep) => round(x * keep[at]),
            None => round(x),
        })
        .collect();
    let mut ds = vec![T::ZERO; sq * sk];
    let mut dsink = T::ZERO;
    for i in 0..sq {
        let mut delta = T::ZERO;
        for t in 0..dv {
            delta += d_o[i * dv + t] * o[i * dv + t];
        }
        if let Some(t) = sink {
            dsink += -((t - lse[i]).exp() * delta);
        }
        for j in 0..sk {
            ds[i * sk + j] = round(pm[i * sk + j] * (dp[i * sk + j] - delta));
        }
    }
    // Through the cap: ∂cap(x)/∂x = 1 − tanh²; dBias is the gradient after it (`ds` above).
    let ds_scores: Vec<T> = if tanh.is_empty() {
        ds.clone()
    } else {
        ds.iter().zip(&tanh).map(|(&g, &t)| round(g * (T::of(1.0) - t * t))).collect()
    };
    // dQ = scale · dS K; dK = scale · dSᵀ Q.
    let dq: Vec<T> = mm(&ds_scores, &k, sq, sk, d, round_in)
        .into_iter()
        .map(|x| round(scale * x))
        .collect();
    let dk: Vec<T> = mm(&transpose(&ds_scores, sq, sk), &q, sk, sq, d, round_in)
        .into_iter()
        .map(|x| scale * x)
        .collect();
    let ds = if p.bias.is_some() { ds } else { Vec::new() };
    HeadOut { o, lse, dq, dk, dv: d_v, ds, dsink }
}

/// Assembles per-head results: O, LSE, dQ per query head; dK, dV summed over each GQA group,
/// then (naive) rounded.
fn assemble<T: Real>(p: &Problem, heads: Vec<HeadOut<T>>, round: &dyn Fn(T) -> T) -> Outputs {
    let (sk, d, d_v) = (p.seqlen_k, p.head_dim, p.head_dim_v);
    let group = p.heads_q / p.heads_k;
    let n_kv = p.batch * p.heads_k;
    let mut dk = vec![T::ZERO; n_kv * sk * d];
    let mut dv = vec![T::ZERO; n_kv * sk * d_v];
    let (mut o, mut lse, mut dq, mut ds) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut dsinks = if p.sinks.is_some() { vec![T::ZERO; p.heads_q] } else { Vec::new() };
    for (bh, hd) in heads.into_iter().enumerate() {
        if let Some(acc) = dsinks.get_mut(bh % p.heads_q) {
            *acc += hd.dsink;
        }
        let bhk = (bh / p.heads_q) * p.heads_k + (bh % p.heads_q) / group;
        for (acc, part, width) in [(&mut dk, &hd.dk, d), (&mut dv, &hd.dv, d_v)] {
            for (a, &x) in acc[bhk * sk * width..(bhk + 1) * sk * width].iter_mut().zip(part) {
                *a += x;
            }
        }
        o.extend(hd.o.iter().map(|x| x.to_f64()));
        lse.extend(hd.lse.iter().map(|x| x.to_f64()));
        dq.extend(hd.dq.iter().map(|x| x.to_f64()));
        ds.extend(hd.ds.iter().map(|x| x.to_f64()));
    }
    let fin = |x: Vec<T>| x.into_iter().map(|x| round(x).to_f64()).collect();
    Outputs {
        o,
        lse,
        dq,
        dk: fin(dk),
        dv: fin(dv),
        ds,
        dsinks: dsinks.into_iter().map(|x| x.to_f64()).collect(),
    }
}

/// dBias of a bias with `sizes` [B or 1, Hq or 1, Sq or 1, Sk] from the full dS (B×Hq×Sq×Sk):
/// the sum over the broadcast dims. `naive`: summed in f32 and rounded to the dtype.
pub fn reduce_dbias(ds: &[f64], full: [usize; 4], sizes: [usize; 4], naive: Option<Precision>) -> Vec<f64> {
    let [b, h, sq, sk] = full;
    let n: usize = sizes.iter().product();
    let mut acc64 = vec![0.0f64; n];
    let mut acc32 = vec![0.0f32; n];
    let at = |z: usize, hh: usize, i: usize, j: usize| {
        let pick = |x: usize, size: usize| if size == 1 { 0 } else { x };
        ((pick(z, sizes[0]) * sizes[1] + pick(hh, sizes[1])) * sizes[2] + pick(i, sizes[2])) * sizes[3] + j
    };
    for z in 0..b {
        for hh in 0..h {
            for i in 0..sq {
                for j in 0..sk {
                    let x = ds[((z * h + hh) * sq + i) * sk + j];
                    let t = at(z, hh, i, j);
                    acc64[t] += x;
                    acc32[t] += x as f32;
                }
            }
        }
    }
    match naive {
        None => acc64,
        Some(prec) => acc32.into_iter().map(|x| prec.round(x) as f64).collect(),
    }
}

/// Both references, (exact, naive). Work items (query head × precision) are shared by all cores.
pub fn compute(p: &Problem) -> (Outputs, Outputs) {
    let bh = p.batch * p.heads_q;
    let dtype = p.dtype;
    let round_lowp = move |x: f32| dtype.round(x);
    let tf32 = |x: f32| round_tf32(x);
    let round_in: Option<&(dyn Fn(f32) -> f32 + Sync)> = if dtype == Precision::Tf32 { Some(&tf32) } else { None };
    let exact_parts: Mutex<Vec<Option<HeadOut<f64>>>> = Mutex::new((0..bh).map(|_| None).collect());
    let naive_parts: Mutex<Vec<Option<HeadOut<f32>>>> = Mutex::new((0..bh).map(|_| None).collect());
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .clamp(1, 64)
        .min(2 * bh);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let item = next.fetch_add(1, Ordering::Relaxed);
                    if item >= 2 * bh {
                        break;
                    }
                    // Larger items first would balance better; interleaving precisions suffices.
                    let (head_index, naive) = (item / 2, item % 2 == 1);
                    if naive {
                        let round_in = round_in.map(|r| r as &dyn Fn(f32) -> f32);
                        let out = head::<f32>(p, head_index, &round_lowp, round_in);
                        naive_parts.lock().unwrap()[head_index] = Some(out);
                    } else {
                        let out = head::<f64>(p, head_index, &|x| x, None);
                        exact_parts.lock().unwrap()[head_index] = Some(out);
                    }
                }
            });
        }
    });
    let exact_heads = exact_parts
        .into_inner()
        .unwrap()
        .into_iter()
        .map(Option::unwrap)
        .collect();
    let naive_heads = naive_parts
        .into_inner()
        .unwrap()
        .into_iter()
        .map(Option::unwrap)
        .collect();
    (
        assemble(p, exact_heads, &|x: f64| x),
        assemble(p, naive_heads, &round_lowp),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lowp::SplitMix64;

    /// Loss L = Σ O ∘ dO computed independently (row by row, f64, no matrices), for finite
    /// differences; `bias` (full B×Hq×Sq×Sk) and the problem's dropout mask are applied.
    fn loss_with(p: &Problem, q: &[f32], k: &[f32], v: &[f32], bias: Option<&[f32]>) -> f64 {
        let (sq, sk, d, dv, g) = (p.seqlen_q, p.seqlen_k, p.head_dim, p.head_dim_v, p.heads_q / p.heads_k);
        let mut total = 0.0;
        for b in 0..p.batch {
            for h in 0..p.heads_q {
                let qb = (b * p.heads_q + h) * sq * d;
                let kb = (b * p.heads_k + h / g) * sk * d;
                let (ob, vb) = ((b * p.heads_q + h) * sq * dv, (b * p.heads_k + h / g) * sk * dv);
                for i in 0..sq {
                    let at = |j: usize| ((b * p.heads_q + h) * sq + i) * sk + j;
                    let scores: Vec<(usize, f64)> = (0..sk)
                        .filter(|&j| p.mask.visible(i, j, sq, sk))
                        .map(|j| {
                            let dot: f64 = (0..d)
                                .map(|t| q[qb + i * d + t] as f64 * k[kb + j * d + t] as f64)
                                .sum();
                            let x = dot * p.sm_scale as f64;
                            let c = p.softcap as f64;
                            let x = if c > 0.0 { c * (x / c).tanh() } else { x };
                            (j, x + bias.map_or(0.0, |b| b[at(j)] as f64))
                        })
                        .collect();
                    let sink = p.sinks.map_or(0.0, |t| (t[h] as f64).exp());
                    let z: f64 = scores.iter().map(|(_, s)| s.exp()).sum::<f64>() + sink;
                    for (j, s) in &scores {
                        let factor = p.dropout.map_or(1.0, |(m, r)| m[at(*j)] as f64 * r as f64);
                        for t in 0..dv {
                            total += s.exp() / z * factor * v[vb + j * dv + t] as f64 * p.d_o[ob + i * dv + t] as f64;
                        }
                    }
                }
            }
        }
        total
    }

    fn loss(p: &Problem, q: &[f32], k: &[f32], v: &[f32]) -> f64 {
        loss_with(p, q, k, v, p.bias)
    }

    fn random(n: usize, rng: &mut SplitMix64) -> Vec<f32> {
        (0..n).map(|_| rng.normal() as f32).collect()
    }

    /// The analytic gradients match central finite differences of L = Σ O ∘ dO, for GQA, each
    /// mask kind (two of them with soft-capping, the other two with V's own head dim), and a row
    /// with no visible key; O and LSE match a direct evaluation.
    #[test]
    fn gradients_match_finite_differences() {
        let masks = [
            MaskSpec {
                left: -1,
                right: -1,
                bottom_right: false,
            },
            MaskSpec {
                left: -1,
                right: 0,
                bottom_right: true,
            },
            MaskSpec {
                left: 1,
                right: 0,
                bottom_right: false,
            },
            MaskSpec {
                left: 0,
                right: 1,
                bottom_right: true,
            },
        ];
        for (mi, mask) in masks.into_iter().enumerate() {
            let (batch, heads_q, heads_k, sq, sk, d) = (2, 4, 2, 5, 3, 4);
            // V's own head dim in every other mask (O, dO, dV follow it).
            let dv = if mi % 2 == 0 { d + 2 } else { d };
            let mut rng = SplitMix64::new(11 + mi as u64);
            let q = random(batch * heads_q * sq * d, &mut rng);
            let k = random(batch * heads_k * sk * d, &mut rng);
            let v = random(batch * heads_k * sk * dv, &mut rng);
            let d_o = random(batch * heads_q * sq * dv, &mut rng);
            let p = Problem {
                head_dim_v: dv,
                softcap: if mi % 2 == 1 { 1.5 } else { 0.0 },
                ..Problem::plain(Precision::Half(Lowp::BF16), [batch, heads_q, heads_k, sq, sk, d], mask, 0.7, [&q, &k, &v, &d_o])
            };
            let (exact, _) = compute(&p);
            // Sq > Sk bottom-right causal: rows 0 and 1 see nothing.
            if mi == 1 {
                assert!(exact.lse[0].is_infinite() && exact.lse[1].is_infinite() && exact.lse[2].is_finite());
                assert!(exact.o[..2 * dv].iter().chain(&exact.dq[..2 * d]).all(|&x| x == 0.0));
            }
            let h = 1e-3f32;
            let check = |name: &str, grad: &[f64], which: usize| {
                for idx in 0..grad.len() {
                    let mut plus = [q.clone(), k.clone(), v.clone()];
                    plus[which][idx] += h;
                    let mut minus = [q.clone(), k.clone(), v.clone()];
                    minus[which][idx] -= h;
                    let step = plus[which][idx] as f64 - minus[which][idx] as f64; // the step taken in f32
                    let fd =
                        (loss(&p, &plus[0], &plus[1], &plus[2]) - loss(&p, &minus[0], &minus[1], &minus[2])) / step;
                    assert!(
                        (fd - grad[idx]).abs() < 2e-3 * (1.0 + fd.abs()),
                        "mask {mi} {name}[{idx}]: fd {fd} vs {}",
                        grad[idx]
                    );
                }
            };
            check("dq", &exact.dq, 0);
            check("dk", &exact.dk, 1);
            check("dv", &exact.dv, 2);
            // O = ∂L/∂dO: L is linear in dO, so O_idx = L(dO = e_idx).
            let base = loss(&p, &q, &k, &v);
            let mut d_o2 = d_o.clone();
            d_o2[7] += 1.0;
            let p2 = Problem { d_o: &d_o2, ..p };
            let o7 = (loss(&p2, &q, &k, &v) - base) / (d_o2[7] as f64 - d_o[7] as f64);
            assert!((o7 - exact.o[7]).abs() < 1e-9, "O[7] {o7} vs {}", exact.o[7]);
        }
    }

    /// With attention sinks: dQ, dK, dV and the sinks' gradient match central finite differences
    /// of L = Σ O ∘ dO (the sink in each row's normaliser), and rows without keys get O = 0 and
    /// LSE = their sink.
    #[test]
    fn sinks_gradients_match_finite_differences() {
        let (batch, heads_q, heads_k, sq, sk, d) = (2, 4, 2, 5, 3, 4);
        // Bottom-right causal with Sq > Sk: rows 0 and 1 see no key.
        let mask = MaskSpec { left: -1, right: 0, bottom_right: true };
        let mut rng = SplitMix64::new(211);
        let q = random(batch * heads_q * sq * d, &mut rng);
        let k = random(batch * heads_k * sk * d, &mut rng);
        let v = random(batch * heads_k * sk * d, &mut rng);
        let d_o = random(batch * heads_q * sq * d, &mut rng);
        let sinks = [0.5f32, -1.0, 2.0, 0.0];
        let p = Problem {
            sinks: Some(&sinks),
            ..Problem::plain(Precision::Half(Lowp::BF16), [batch, heads_q, heads_k, sq, sk, d], mask, 0.7, [&q, &k, &v, &d_o])
        };
        let (exact, _) = compute(&p);
        assert!(exact.lse[0] == 0.5 && exact.lse[1] == 0.5 && exact.lse[sq] == -1.0, "{:?}", &exact.lse[..2 * sq]);
        assert!(exact.o[..2 * d].iter().chain(&exact.dq[..2 * d]).all(|&x| x == 0.0));
        let h = 1e-3f32;
        for (name, which, grad) in [("dq", 0, &exact.dq), ("dk", 1, &exact.dk), ("dv", 2, &exact.dv)] {
            for idx in 0..grad.len() {
                let mut plus = [q.clone(), k.clone(), v.clone()];
                plus[which][idx] += h;
                let mut minus = [q.clone(), k.clone(), v.clone()];
                minus[which][idx] -= h;
                let step = plus[which][idx] as f64 - minus[which][idx] as f64;
                let fd = (loss(&p, &plus[0], &plus[1], &plus[2]) - loss(&p, &minus[0], &minus[1], &minus[2])) / step;
                assert!((fd - grad[idx]).abs() < 2e-3 * (1.0 + fd.abs()), "{name}[{idx}]: fd {fd} vs {}", grad[idx]);
            }
        }
        for hh in 0..heads_q {
            let (mut plus, mut minus) = (sinks, sinks);
            plus[hh] += h;
            minus[hh] -= h;
            let step = plus[hh] as f64 - minus[hh] as f64;
            let at = |t: &[f32; 4]| loss(&Problem { sinks: Some(t), ..p }, &q, &k, &v);
            let fd = (at(&plus) - at(&minus)) / step;
            let got = exact.dsinks[hh];
            assert!((fd - got).abs() < 2e-3 * (1.0 + fd.abs()), "dsinks[{hh}]: fd {fd} vs {got}");
            assert!(got.abs() > 1e-3, "dsinks[{hh}] = {got}: too small to tell");
        }
    }

    /// With a bias and a dropout mask: dQ, dK, dV, dS (= dBias of a full bias) match central
    /// finite differences of L = Σ O ∘ dO, and dBias of broadcast biases is dS summed.
    #[test]
    fn bias_and_dropout_gradients_match_finite_differences() {
        let (batch, heads_q, heads_k, sq, sk, d) = (2, 4, 2, 5, 6, 4);
        for (mi, mask) in [
            MaskSpec {
                left: -1,
                right: -1,
                bottom_right: false,
            },
            MaskSpec {
                left: -1,
                right: 0,
                bottom_right: true,
            },
        ]
        .into_iter()
        .enumerate()
        {
            let mut rng = SplitMix64::new(101 + mi as u64);
            let q = random(batch * heads_q * sq * d, &mut rng);
            let k = random(batch * heads_k * sk * d, &mut rng);
            let v = random(batch * heads_k * sk * d, &mut rng);
            let d_o = random(batch * heads_q * sq * d, &mut rng);
            let bias = random(batch * heads_q * sq * sk, &mut rng);
            let keep: Vec<u8> = (0..batch * heads_q * sq * sk)
                .map(|_| (rng.below(10) >= 3) as u8)
                .collect();
            let p = Problem {
                bias: Some(&bias),
                dropout: Some((&keep, 1.0 / 0.7)),
                ..Problem::plain(Precision::F32, [batch, heads_q, heads_k, sq, sk, d], mask, 0.6, [&q, &k, &v, &d_o])
            };
            let (exact, naive) = compute(&p);
            assert_eq!(exact.ds.len(), bias.len());
            let h = 1e-3f32;
            let fd = |which: usize, idx: usize| {
                let mut plus = [q.clone(), k.clone(), v.clone(), bias.clone()];
                let mut minus = plus.clone();
                plus[which][idx] += h;
                minus[which][idx] -= h;
                let step = plus[which][idx] as f64 - minus[which][idx] as f64;
                (loss_with(&p, &plus[0], &plus[1], &plus[2], Some(&plus[3]))
                    - loss_with(&p, &minus[0], &minus[1], &minus[2], Some(&minus[3])))
                    / step
            };
            for (name, grad, which) in [
                ("dq", &exact.dq, 0),
                ("dk", &exact.dk, 1),
                ("dv", &exact.dv, 2),
                ("dbias", &exact.ds, 3),
            ] {
                for (idx, &g) in grad.iter().enumerate() {
                    let f = fd(which, idx);
                    assert!(
                        (f - g).abs() < 2e-3 * (1.0 + f.abs()),
                        "mask {mi} {name}[{idx}]: fd {f} vs {g}"
                    );
                }
            }
            // O with dropout: linear in dO.
            let base = loss(&p, &q, &k, &v);
            let mut d_o2 = d_o.clone();
            d_o2[9] += 1.0;
            let p2 = Problem { d_o: &d_o2, ..p };
            let o9 = (loss(&p2, &q, &k, &v) - base) / (d_o2[9] as f64 - d_o[9] as f64);
            assert!((o9 - exact.o[9]).abs() < 1e-9, "O[9] {o9} vs {}", exact.o[9]);
            // The f32 naive reference is the same math: close.
            for (a, b) in naive.o.iter().zip(&exact.o).chain(naive.ds.iter().zip(&exact.ds)) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
            // Broadcast dBias = dS summed over the broadcast dims.
            let full = [batch, heads_q, sq, sk];
            let db = reduce_dbias(&exact.ds, full, [batch, 1, 1, sk], None);
            for z in 0..batch {
                for j in 0..sk {
                    let want: f64 = (0..heads_q * sq)
                        .map(|r| exact.ds[(z * heads_q * sq + r) * sk + j])
                        .sum();
                    assert!((db[z * sk + j] - want).abs() < 1e-12);
                }
            }
            assert_eq!(reduce_dbias(&exact.ds, full, full, None), exact.ds);
        }
    }

    #[test]
    fn tf32_rounding() {
        assert_eq!(round_tf32(1.0), 1.0);
        assert_eq!(round_tf32(1.0 + 2f32.powi(-11)), 1.0); // below the last kept bit: dropped
        assert_eq!(round_tf32(1.0 + 3.0 * 2f32.powi(-11)), 1.0 + 2f32.powi(-10)); // truncated, not rounded up
        assert_eq!(round_tf32(1.0 + 2f32.powi(-10)), 1.0 + 2f32.powi(-10));
        assert_eq!(round_tf32(-1.0 - 3.0 * 2f32.powi(-11)), -1.0 - 2f32.powi(-10)); // toward zero
        assert_eq!(round_tf32(-1.5), -1.5);
        assert!(round_tf32(f32::NAN).is_nan());
    }

    /// The naive reference is close to the exact one (it is the same math, rounded).
    #[test]
    fn naive_tracks_exact() {
        let (batch, heads_q, heads_k, sq, sk, d) = (1, 8, 1, 33, 47, 24);
        let mut rng = SplitMix64::new(5);
        let draw = |n, rng: &mut SplitMix64| (0..n).map(|_| rng.normal_in(Lowp::F16)).collect::<Vec<f32>>();
        let (q, k, v, d_o) = (
            draw(batch * heads_q * sq * d, &mut rng),
            draw(batch * heads_k * sk * d, &mut rng),
            draw(batch * heads_k * sk * d, &mut rng),
            draw(batch * heads_q * sq * d, &mut rng),
        );
        let mask = MaskSpec {
            left: 5,
            right: 3,
            bottom_right: true,
        };
        let scale = 1.0 / (d as f32).sqrt();
        let p = Problem::plain(Precision::Half(Lowp::F16), [batch, heads_q, heads_k, sq, sk, d], mask, scale, [&q, &k, &v, &d_o]);
        let (e, n) = compute(&p);
        let err = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        let mag = |a: &[f64]| a.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        for (name, a, b) in [
            ("o", &n.o, &e.o),
            ("dq", &n.dq, &e.dq),
            ("dk", &n.dk, &e.dk),
            ("dv", &n.dv, &e.dv),
        ] {
            let (er, m) = (err(a, b), mag(b));
            assert!(er > 0.0 && er < 2e-2 * m.max(1.0), "{name}: err {er} mag {m}");
        }
    }

    #[test]
    fn mask_semantics() {
        let tl = |l, r| MaskSpec {
            left: l,
            right: r,
            bottom_right: false,
        };
        let br = |l, r| MaskSpec {
            left: l,
            right: r,
            bottom_right: true,
        };
        assert!(tl(-1, 0).visible(3, 3, 10, 10) && !tl(-1, 0).visible(3, 4, 10, 10));
        // Sq 4, Sk 10 bottom-right causal: row 0 sees keys 0..=6.
        assert!(br(-1, 0).visible(0, 6, 4, 10) && !br(-1, 0).visible(0, 7, 4, 10));
        // Sq 10, Sk 4 bottom-right causal: rows 0..=5 see nothing, row 6 sees key 0.
        assert!((0..4).all(|j| !br(-1, 0).visible(5, j, 10, 4)) && br(-1, 0).visible(6, 0, 10, 4));
        // Window (2, 1) top-left: row 5 sees 3..=6.
        let w = tl(2, 1);
        assert_eq!(
            (0..10).filter(|&j| w.visible(5, j, 10, 10)).collect::<Vec<_>>(),
            vec![3, 4, 5, 6]
        );
        assert!((0..10).all(|j| tl(-1, -1).visible(0, j, 1, 10)));
    }
}
