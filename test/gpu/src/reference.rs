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
//! The same function `head` computes this twice (one generic body, so both references are the
//! same math by construction):
//! * `exact`: in f64, nothing rounded;
//! * `naive`: in f32, every matrix product accumulated in f32 and its result rounded to the input
//!   dtype (S, P, O, dP, dS, dQ, dK, dV); softmax, LSE and D in f32.
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

pub struct Problem<'a> {
    pub dtype: Lowp,
    pub batch: usize,
    pub heads_q: usize,
    pub heads_k: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub head_dim: usize,
    pub mask: MaskSpec,
    pub sm_scale: f32,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub d_o: &'a [f32],
}

/// Outputs in logical order: O, dQ B×Hq×Sq×D; LSE B×Hq×Sq (+inf for rows with no key);
/// dK, dV B×Hk×Sk×D.
pub struct Outputs {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
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
}

/// The formulas of the module docs for query head `bh` (= b·Hq + h). `round` is the identity
/// for the exact reference and rounding to the dtype for the naive one.
fn head<T: Real>(p: &Problem, bh: usize, round: &dyn Fn(T) -> T) -> HeadOut<T> {
    let (sq, sk, d) = (p.seqlen_q, p.seqlen_k, p.head_dim);
    let group = p.heads_q / p.heads_k;
    let (b, h) = (bh / p.heads_q, bh % p.heads_q);
    let bhk = b * p.heads_k + h / group; // the K/V head this query head reads
    let load = |x: &[f32], at: usize, len: usize| x[at..at + len].iter().map(|&v| T::of(v)).collect::<Vec<T>>();
    let q = load(p.q, bh * sq * d, sq * d);
    let d_o = load(p.d_o, bh * sq * d, sq * d);
    let k = load(p.k, bhk * sk * d, sk * d);
    let v = load(p.v, bhk * sk * d, sk * d);
    let scale = T::of(p.sm_scale);

    // S = scale · Q Kᵀ (Sq×Sk), then P = softmax over visible keys, LSE.
    let s: Vec<T> = matmul(&q, &transpose(&k, sk, d), sq, d, sk)
        .into_iter()
        .map(|x| round(x * scale))
        .collect();
    let mut pm = vec![T::ZERO; sq * sk];
    let mut lse = vec![T::INF; sq];
    for i in 0..sq {
        let row = &s[i * sk..(i + 1) * sk];
        let vis = |j: usize| p.mask.visible(i, j, sq, sk);
        let mut m = -T::INF;
        for j in (0..sk).filter(|&j| vis(j)) {
            if row[j] > m {
                m = row[j];
            }
        }
        if m == -T::INF {
            continue; // no visible key: P row 0, LSE +inf
        }
        let mut l = T::ZERO;
        for j in (0..sk).filter(|&j| vis(j)) {
            l += (row[j] - m).exp();
        }
        for j in (0..sk).filter(|&j| vis(j)) {
            pm[i * sk + j] = round((row[j] - m).exp() / l);
        }
        lse[i] = m + l.ln();
    }

    // O = P V; dV = Pᵀ dO; dP = dO Vᵀ; D = rowsum(dO ∘ O); dS = P ∘ (dP − D).
    let o: Vec<T> = matmul(&pm, &v, sq, sk, d).into_iter().map(round).collect();
    let dv = matmul(&transpose(&pm, sq, sk), &d_o, sk, sq, d);
    let dp: Vec<T> = matmul(&d_o, &transpose(&v, sk, d), sq, d, sk)
        .into_iter()
        .map(round)
        .collect();
    let mut ds = vec![T::ZERO; sq * sk];
    for i in 0..sq {
        let mut delta = T::ZERO;
        for t in 0..d {
            delta += d_o[i * d + t] * o[i * d + t];
        }
        for j in 0..sk {
            ds[i * sk + j] = round(pm[i * sk + j] * (dp[i * sk + j] - delta));
        }
    }
    // dQ = scale · dS K; dK = scale · dSᵀ Q.
    let dq: Vec<T> = matmul(&ds, &k, sq, sk, d)
        .into_iter()
        .map(|x| round(scale * x))
        .collect();
    let dk: Vec<T> = matmul(&transpose(&ds, sq, sk), &q, sk, sq, d)
        .into_iter()
        .map(|x| scale * x)
        .collect();
    HeadOut { o, lse, dq, dk, dv }
}

/// Assembles per-head results: O, LSE, dQ per query head; dK, dV summed over each GQA group,
/// then (naive) rounded.
fn assemble<T: Real>(p: &Problem, heads: Vec<HeadOut<T>>, round: &dyn Fn(T) -> T) -> Outputs {
    let (sk, d) = (p.seqlen_k, p.head_dim);
    let group = p.heads_q / p.heads_k;
    let n_kv = p.batch * p.heads_k;
    let mut dk = vec![T::ZERO; n_kv * sk * d];
    let mut dv = vec![T::ZERO; n_kv * sk * d];
    let (mut o, mut lse, mut dq) = (Vec::new(), Vec::new(), Vec::new());
    for (bh, hd) in heads.into_iter().enumerate() {
        let bhk = (bh / p.heads_q) * p.heads_k + (bh % p.heads_q) / group;
        for (acc, part) in [(&mut dk, &hd.dk), (&mut dv, &hd.dv)] {
            for (a, &x) in acc[bhk * sk * d..(bhk + 1) * sk * d].iter_mut().zip(part) {
                *a += x;
            }
        }
        o.extend(hd.o.iter().map(|x| x.to_f64()));
        lse.extend(hd.lse.iter().map(|x| x.to_f64()));
        dq.extend(hd.dq.iter().map(|x| x.to_f64()));
    }
    let fin = |x: Vec<T>| x.into_iter().map(|x| round(x).to_f64()).collect();
    Outputs {
        o,
        lse,
        dq,
        dk: fin(dk),
        dv: fin(dv),
    }
}

/// Both references, (exact, naive). Work items (query head × precision) are shared by all cores.
pub fn compute(p: &Problem) -> (Outputs, Outputs) {
    let bh = p.batch * p.heads_q;
    let dtype = p.dtype;
    let round_lowp = move |x: f32| dtype.round(x);
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
                        let out = head::<f32>(p, head_index, &round_lowp);
                        naive_parts.lock().unwrap()[head_index] = Some(out);
                    } else {
                        let out = head::<f64>(p, head_index, &|x| x);
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
    /// differences.
    fn loss(p: &Problem, q: &[f32], k: &[f32], v: &[f32]) -> f64 {
        let (sq, sk, d, g) = (p.seqlen_q, p.seqlen_k, p.head_dim, p.heads_q / p.heads_k);
        let mut total = 0.0;
        for b in 0..p.batch {
            for h in 0..p.heads_q {
                let qb = (b * p.heads_q + h) * sq * d;
                let kb = (b * p.heads_k + h / g) * sk * d;
                for i in 0..sq {
                    let scores: Vec<(usize, f64)> = (0..sk)
                        .filter(|&j| p.mask.visible(i, j, sq, sk))
                        .map(|j| {
                            let dot: f64 = (0..d)
                                .map(|t| q[qb + i * d + t] as f64 * k[kb + j * d + t] as f64)
                                .sum();
                            (j, dot * p.sm_scale as f64)
                        })
                        .collect();
                    let z: f64 = scores.iter().map(|(_, s)| s.exp()).sum();
                    for (j, s) in &scores {
                        for t in 0..d {
                            total += s.exp() / z * v[kb + j * d + t] as f64 * p.d_o[qb + i * d + t] as f64;
                        }
                    }
                }
            }
        }
        total
    }

    fn random(n: usize, rng: &mut SplitMix64) -> Vec<f32> {
        (0..n).map(|_| rng.normal() as f32).collect()
    }

    /// The analytic gradients match central finite differences of L = Σ O ∘ dO, for GQA, each
    /// mask kind, and a row with no visible key; O and LSE match a direct evaluation.
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
            let mut rng = SplitMix64::new(11 + mi as u64);
            let q = random(batch * heads_q * sq * d, &mut rng);
            let k = random(batch * heads_k * sk * d, &mut rng);
            let v = random(batch * heads_k * sk * d, &mut rng);
            let d_o = random(batch * heads_q * sq * d, &mut rng);
            let p = Problem {
                dtype: Lowp::BF16,
                batch,
                heads_q,
                heads_k,
                seqlen_q: sq,
                seqlen_k: sk,
                head_dim: d,
                mask,
                sm_scale: 0.7,
                q: &q,
                k: &k,
                v: &v,
                d_o: &d_o,
            };
            let (exact, _) = compute(&p);
            // Sq > Sk bottom-right causal: rows 0 and 1 see nothing.
            if mi == 1 {
                assert!(exact.lse[0].is_infinite() && exact.lse[1].is_infinite() && exact.lse[2].is_finite());
                assert!(exact.o[..2 * d].iter().chain(&exact.dq[..2 * d]).all(|&x| x == 0.0));
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
        let p = Problem {
            dtype: Lowp::F16,
            batch,
            heads_q,
            heads_k,
            seqlen_q: sq,
            seqlen_k: sk,
            head_dim: d,
            mask: MaskSpec {
                left: 5,
                right: 3,
                bottom_right: true,
            },
            sm_scale: 1.0 / (d as f32).sqrt(),
            q: &q,
            k: &k,
            v: &v,
            d_o: &d_o,
        };
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
