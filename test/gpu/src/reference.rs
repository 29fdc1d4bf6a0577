//! CPU references of the forward attention, on logical B×H×S×D tensors (row-major, f32 values
//! already rounded to the input dtype):
//! * `exact`: float64 throughout;
//! * `naive`: the same computation done naively in the input precision — scores accumulated in
//!   f32 then rounded to the dtype, softmax in f32 with P rounded to the dtype, P·V accumulated in
//!   f32 then rounded to the dtype; LSE in f32 from the rounded scores.
//!
//! The naive error against `exact` sets the scale of the error a kernel is allowed.
use crate::lowp::Lowp;

pub struct Problem<'a> {
    pub dtype: Lowp,
    pub batch: usize,
    pub heads: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub sm_scale: f32,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
}

/// Outputs in logical order: O is B×H×Sq×D, LSE is B×H×Sq.
pub struct Outputs {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
}

/// Both references, computed in parallel over (batch, head).
pub fn compute(p: &Problem) -> (Outputs, Outputs) {
    let (sq, d) = (p.seqlen_q, p.head_dim);
    let bh = p.batch * p.heads;
    let mut exact = Outputs { o: vec![0.0; bh * sq * d], lse: vec![0.0; bh * sq] };
    let mut naive = Outputs { o: vec![0.0; bh * sq * d], lse: vec![0.0; bh * sq] };
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(1, 64);
    // Hand out (b,h) slices round-robin so threads get similar work.
    type Job<'s> = (usize, &'s mut [f64], &'s mut [f64], &'s mut [f64], &'s mut [f64]);
    let mut jobs: Vec<Vec<Job>> = (0..threads).map(|_| Vec::new()).collect();
    let slices = exact
        .o
        .chunks_mut(sq * d)
        .zip(exact.lse.chunks_mut(sq))
        .zip(naive.o.chunks_mut(sq * d).zip(naive.lse.chunks_mut(sq)))
        .enumerate();
    for (i, ((eo, el), (no, nl))) in slices {
        jobs[i % threads].push((i, eo, el, no, nl));
    }
    std::thread::scope(|s| {
        for job in jobs {
            s.spawn(move || {
                for (i, eo, el, no, nl) in job {
                    head(p, i, eo, el, no, nl);
                }
            });
        }
    });
    (exact, naive)
}

/// Number of keys query row `i` sees (top-left causal: keys j <= i).
pub fn visible_keys(causal: bool, i: usize, seqlen_k: usize) -> usize {
    if causal { (i + 1).min(seqlen_k) } else { seqlen_k }
}

fn head(p: &Problem, bh: usize, eo: &mut [f64], el: &mut [f64], no: &mut [f64], nl: &mut [f64]) {
    let (sq, sk, d) = (p.seqlen_q, p.seqlen_k, p.head_dim);
    let q = &p.q[bh * sq * d..(bh + 1) * sq * d];
    let k = &p.k[bh * sk * d..(bh + 1) * sk * d];
    let v = &p.v[bh * sk * d..(bh + 1) * sk * d];
    let scale64 = p.sm_scale as f64;
    let mut s64 = vec![0f64; sk];
    let mut s32 = vec![0f32; sk];
    let mut acc64 = vec![0f64; d];
    let mut acc32 = vec![0f32; d];
    for i in 0..sq {
        let n = visible_keys(p.causal, i, sk);
        let qi = &q[i * d..(i + 1) * d];
        for j in 0..n {
            let kj = &k[j * d..(j + 1) * d];
            let (mut a64, mut a32) = (0f64, 0f32);
            for t in 0..d {
                a64 += qi[t] as f64 * kj[t] as f64;
                a32 += qi[t] * kj[t];
            }
            s64[j] = a64 * scale64;
            s32[j] = p.dtype.round(a32 * p.sm_scale);
        }
        // float64
        let m64 = s64[..n].iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut l64 = 0f64;
        acc64.iter_mut().for_each(|a| *a = 0.0);
        for j in 0..n {
            let e = (s64[j] - m64).exp();
            l64 += e;
            let vj = &v[j * d..(j + 1) * d];
            for t in 0..d {
                acc64[t] += e * vj[t] as f64;
            }
        }
        for t in 0..d {
            eo[i * d + t] = acc64[t] / l64;
        }
        el[i] = m64 + l64.ln();
        // naive low precision
        let m32 = s32[..n].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut l32 = 0f32;
        for s in &mut s32[..n] {
            *s = (*s - m32).exp();
            l32 += *s;
        }
        acc32.iter_mut().for_each(|a| *a = 0.0);
        for j in 0..n {
            let pj = p.dtype.round(s32[j] / l32);
            let vj = &v[j * d..(j + 1) * d];
            for t in 0..d {
                acc32[t] += pj * vj[t];
            }
        }
        for t in 0..d {
            no[i * d + t] = p.dtype.round(acc32[t]) as f64;
        }
        nl[i] = (m32 + l32.ln()) as f64;
    }
}
