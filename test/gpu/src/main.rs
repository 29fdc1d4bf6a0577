//! GPU correctness test of the aotriton Rust API: `flash::attn_fwd` and `flash::attn_bwd`.
//!
//! A fixed, deterministic list of cases (see `cases()`; `--list` prints it with a coverage table)
//! covers head dims 8..512, GQA ratios 1/2/4/8 and MQA, Sq ≠ Sk both ways with lengths 1 and odd
//! primes, every mask kind (none, causal top-left / bottom-right, sliding windows of both
//! alignments, windows wider than the sequence, rows that see no key), fp16 and bf16, contiguous,
//! B×S×H×D-as-B×H×S×D, padded-row and 2-byte-misaligned layouts, and forwards without LSE.
//! Each case runs on a non-default stream of device 0:
//!   1. (some cases) the forward with `lse: None`: the LSE buffer must stay untouched;
//!   2. the forward with LSE into NaN-poisoned O / LSE;
//!   3. the backward with random dO (never 0) into NaN-poisoned dQ / dK / dV / delta;
//!   4. (6 cases) the backward 9 more times: dQ / dK / dV must be bitwise identical each time.
//!
//! Every output element is compared against a float64 CPU reference (reference.rs). The error
//! allowed per tensor is scaled by the error of the same math done naively in the input precision:
//!
//! ```text
//!     max|out − ref64| ≤ k · max|naive − ref64| + floor
//! ```
//!
//! k = 3 for O, 5 for dQ / dK / dV; floor 1e-3, for a gradient multiplied by max|ref| of that
//! tensor when that is above 1 (the line then shows `f×<factor>`). LSE: every finite reference
//! row within 3 · max|naive − ref64| + 1e-3 · max(1, |lse_i|), and +inf exactly where the
//! reference is +inf. Rows that see no key must hold exact zeros in O and dQ. The delta workspace
//! must hold rowsum(dO ∘ O) (fp32 accumulation: 1e-4 relative). Nothing outside the views may be
//! written (guard and padding keep their poison), the inputs (q, k, v, o, dO, lse) must come back
//! unchanged from the backward, and NaN never passes.
//!
//! Then the third milestone (ext.rs): the GPU's `debug_dropout_mask` against a host
//! Philox4x32-10 model (philox.rs) bit for bit, keep-rate statistics, the masks the forward and
//! backward actually use revealed through identity V / dO and compared to the debug mask exactly,
//! forward + backward with dropout, additive bias with dBias (every broadcast pattern, masks),
//! packed variable-length batches (per-sequence reference, sequences of length 0 and 1), fp32
//! (IEEE) and TF32, the deterministic backward (10 runs + a second stream), CUDA-graph replay
//! with a new dropout offset, and invalid calls for the new validations.
//!
//! Usage: aotriton-gpu-tests [--log PATH] [--seed N] [--require-gpu] [--list] [--backend B] [--quick]
//!        aotriton-gpu-tests --stress concurrency|large|memory|multi-device [--log PATH] [--seed N] [--require-gpu] [--backend B]
//! `--backend auto|portable|gluon` forces every call onto one backend (backend.rs: a case the
//! Gluon backend does not serve must then be refused with `UnsupportedByBackend`).
//! Without a driver or a device it prints `skipped: no GPU` and exits 0 (2 with --require-gpu).
//! `--seed` changes the input values, not the case list. `--quick` runs a reduced list for slow
//! tools such as compute-sanitizer (`quick_cases`, `ext::quick`; no stability case).
//! `--stress` runs one of the stress modes instead (stress.rs); `--backend` limits the large and
//! memory modes to one backend (concurrency mixes all three by case).
mod backend;
mod concurrency;
mod decode;
mod ext;
mod fp8;
mod growth;
mod large;
mod lowp;
mod philox;
mod reference;
mod stability;
mod stress;
mod tuning;

/// Counts host allocations (stability.rs checks the launch path makes none after warm-up).
#[global_allocator]
static GLOBAL: stability::CountingAlloc = stability::CountingAlloc;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Instant;

use aotriton::flash::{self, Mask, MaskAlign};
use aotriton::{DType, ErrorKind, Stream, TensorView};
use cudarc::driver::{result, sys};
use lowp::{Lowp, POISON16, POISON32, SplitMix64};
use reference::MaskSpec;

/// Elements of poison kept after every buffer, to catch writes (outputs) or unmasked reads
/// (inputs are followed by NaNs too) past the end of a view.
const GUARD: usize = 256;

/// Largest B·Hq·Sq·Sk·D of a case: keeps the CPU reference of the whole suite to seconds.
const MAX_COST: usize = 150_000_000;

/// Backward runs of a determinism case.
const REPEATS: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layout {
    /// Contiguous B×H×S×D.
    Bhsd,
    /// B×S×H×D memory viewed as B×H×S×D: strides [S·H·D, D, H·D, 1].
    Bshd,
    /// B×H×S×D with a row pitch of D+1 elements (rows not 16-byte aligned), LSE and delta with a
    /// row pitch of Sq+3; the padding holds NaNs that must be neither read nor written.
    Padded,
    /// Contiguous, but q, dO and dQ start 2 bytes past a 16-byte boundary (unaligned variants).
    QMisaligned,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Bhsd => "bhsd",
            Layout::Bshd => "bshd",
            Layout::Padded => "padded",
            Layout::QMisaligned => "q+2B",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Case {
    dtype: Lowp,
    head_dim: usize,
    batch: usize,
    heads_q: usize,
    heads_k: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    mask: MaskSpec,
    layout: Layout,
    /// Run the forward with `lse: None` first (then again with LSE for the backward).
    fwd_without_lse: bool,
    /// Run the backward `REPEATS` times and require identical bits.
    repeat_bwd: bool,
}

fn mask_name(m: &MaskSpec) -> String {
    let align = if m.bottom_right { "BR" } else { "TL" };
    match (m.left, m.right) {
        (-1, -1) if m.bottom_right => "none-BR".to_string(),
        (-1, -1) => "none".to_string(),
        (-1, 0) => format!("causal-{align}"),
        (l, r) => format!("win({l},{r})-{align}"),
    }
}

/// The mask kind, for the coverage table.
fn mask_kind(m: &MaskSpec, sq: usize, sk: usize) -> &'static str {
    let wide = |w: i64| w >= (sq + sk) as i64;
    match (m.left, m.right, m.bottom_right) {
        (-1, -1, _) => "none",
        (-1, 0, false) => "causal TL",
        (-1, 0, true) => "causal BR",
        (0, 0, _) => "window (0,0)",
        (l, r, _) if (l < 0 || wide(l)) && (r < 0 || wide(r)) => "window wider than seq",
        (-1, _, _) => "window (-1,r)",
        (_, -1, _) => "window (l,-1)",
        _ => "window (l,r)",
    }
}

impl Case {
    fn group(&self) -> usize {
        self.heads_q / self.heads_k
    }
    fn cost(&self) -> usize {
        self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim
    }
    /// Query rows (per head) that see no key.
    fn empty_rows(&self) -> usize {
        let (sq, sk) = (self.seqlen_q, self.seqlen_k);
        (0..sq)
            .filter(|&i| !(0..sk).any(|j| self.mask.visible(i, j, sq, sk)))
            .count()
    }
    /// What the Gluon backend's dispatch rule looks at: padded rows (D+1 elements) and a q
    /// shifted by 2 bytes break TMA's 16-byte rules; the contiguous and B×S×H×D layouts keep them.
    fn traits(&self) -> backend::Traits {
        backend::Traits {
            dtype: dtype_of(self.dtype),
            head_dim: self.head_dim,
            tma_layout: matches!(self.layout, Layout::Bhsd | Layout::Bshd),
            features: false,
        }
    }
    fn describe(&self) -> String {
        let gqa = if self.heads_k == 1 && self.heads_q > 1 {
            "MQA"
        } else {
            "GQA"
        };
        let mut s = format!(
            "{} D={:<3} {gqa} G={} Hq={:<2} Hk={} B={} Sq={:<4} Sk={:<4} mask={:<18} layout={:<6}",
            self.dtype.name(),
            self.head_dim,
            self.group(),
            self.heads_q,
            self.heads_k,
            self.batch,
            self.seqlen_q,
            self.seqlen_k,
            mask_name(&self.mask),
            self.layout.name()
        );
        if self.fwd_without_lse {
            s.push_str(" +fwd-no-lse");
        }
        if self.repeat_bwd {
            let _ = write!(s, " +bwd×{REPEATS}");
        }
        s
    }
}

const HEAD_DIMS: [usize; 12] = [8, 24, 40, 64, 72, 80, 96, 128, 160, 192, 224, 256];
/// (Hq, Hk): ratios 1, 2, 4, 8; MQA (Hk = 1) with Hq 2, 4, 8.
const GQA: [(usize, usize); 12] = [
    (1, 1),
    (2, 2),
    (3, 3),
    (4, 2),
    (6, 3),
    (2, 1),
    (8, 2),
    (4, 1),
    (12, 3),
    (16, 2),
    (8, 1),
    (4, 4),
];
const fn m(left: i64, right: i64, bottom_right: bool) -> MaskSpec {
    MaskSpec {
        left,
        right,
        bottom_right,
    }
}
const MASKS: [MaskSpec; 16] = [
    m(-1, -1, false),
    m(-1, 0, false),
    m(-1, 0, true),
    m(0, 0, false),
    m(0, 0, true),
    m(7, 3, false),
    m(16, 5, true),
    m(100, 37, false),
    m(-1, 9, false),
    m(-1, 2, true),
    m(20, -1, false),
    m(0, -1, true),
    m(31, 0, true),
    m(64, 0, false),
    m(5000, 5000, false),
    m(3000, 2000, true),
];
/// (Sq, Sk): 1, odd primes, a few even lengths; both orders.
const PAIRS: [(usize, usize); 30] = [
    (1, 1),
    (1, 13),
    (13, 1),
    (1, 509),
    (509, 1),
    (13, 13),
    (13, 31),
    (31, 13),
    (31, 97),
    (97, 31),
    (97, 97),
    (13, 251),
    (251, 13),
    (97, 251),
    (251, 97),
    (251, 251),
    (509, 97),
    (97, 509),
    (509, 509),
    (251, 1021),
    (1021, 251),
    (1021, 1021),
    (64, 128),
    (128, 64),
    (200, 333),
    (333, 200),
    (1021, 31),
    (31, 1021),
    (128, 128),
    (256, 256),
];

/// Shrinks a case until B·Hq·Sq·Sk·D ≤ MAX_COST: batch first, then the longer sequence to the
/// next smaller prime of 1021, 509, 251, 97, 31, 13, 1.
fn fit(mut c: Case) -> Case {
    while c.cost() > MAX_COST {
        if c.batch > 1 {
            c.batch -= 1;
            continue;
        }
        let shrink = |s: usize| *[1021, 509, 251, 97, 31, 13, 1].iter().find(|&&p| p < s).unwrap_or(&1);
        if c.seqlen_q >= c.seqlen_k {
            c.seqlen_q = shrink(c.seqlen_q)
        } else {
            c.seqlen_k = shrink(c.seqlen_k)
        }
    }
    c
}

/// 108 regular cases (each head dim 9 times; mask, GQA and dtype cycled so each head dim meets
/// both dtypes and many masks and ratios; lengths, layout and batch from a fixed-seed RNG),
/// then hand-picked ones: rows without keys, determinism, extremes.
fn cases() -> Vec<Case> {
    const LAYOUTS: [Layout; 6] = [
        Layout::Bhsd,
        Layout::Bshd,
        Layout::Bhsd,
        Layout::Bshd,
        Layout::Padded,
        Layout::QMisaligned,
    ];
    let mut rng = SplitMix64::new(0xCA5E_1157);
    let mut out = Vec::new();
    for i in 0..108usize {
        let round = i / 12;
        let (heads_q, heads_k) = GQA[(5 * i + round) % GQA.len()];
        let (seqlen_q, seqlen_k) = PAIRS[rng.below(PAIRS.len())];
        out.push(fit(Case {
            dtype: if round % 2 == 0 { Lowp::F16 } else { Lowp::BF16 },
            head_dim: HEAD_DIMS[i % HEAD_DIMS.len()],
            batch: 1 + rng.below(2),
            heads_q,
            heads_k,
            seqlen_q,
            seqlen_k,
            mask: MASKS[(i + round) % MASKS.len()],
            layout: LAYOUTS[rng.below(LAYOUTS.len())],
            fwd_without_lse: i % 11 == 4,
            repeat_bwd: false,
        }));
    }
    #[allow(clippy::too_many_arguments)]
    let special = |dtype, head_dim, heads_q, heads_k, batch, seqlen_q, seqlen_k, mask, layout, repeat_bwd| Case {
        dtype,
        head_dim,
        batch,
        heads_q,
        heads_k,
        seqlen_q,
        seqlen_k,
        mask,
        layout,
        fwd_without_lse: false,
        repeat_bwd,
    };
    use Layout::*;
    use Lowp::{BF16, F16};
    // Determinism (and rows without keys in the first).
    out.push(special(BF16, 128, 8, 2, 1, 509, 97, m(-1, 0, true), Bhsd, true)); // G=4, 412 empty rows
    out.push(special(F16, 64, 16, 2, 1, 251, 509, m(16, 5, true), Bshd, true)); // G=8
    out.push(special(BF16, 256, 8, 1, 1, 97, 251, m(-1, -1, false), Bhsd, true)); // MQA 8
    out.push(special(F16, 72, 2, 2, 2, 333, 333, m(-1, 0, false), Padded, true));
    out.push(special(BF16, 24, 4, 1, 1, 1021, 1021, m(64, 0, false), Bshd, true)); // MQA 4
    // Rows without keys: window (0,0) BR with Sq > Sk; window TL with Sq > Sk; causal BR Sk = 1.
    out.push(special(F16, 80, 4, 2, 1, 251, 13, m(0, 0, true), QMisaligned, false));
    let mut c = special(BF16, 160, 6, 3, 1, 97, 31, m(0, 3, false), Bhsd, false);
    c.fwd_without_lse = true;
    out.push(c);
    out.push(special(F16, 8, 8, 1, 1, 1021, 1, m(-1, 0, true), Bhsd, false));
    // Windows wider than the sequences; Sq = 1 bottom-right; a large head dim at Sq = Sk = 509.
    out.push(special(F16, 192, 2, 1, 1, 13, 1021, m(5000, 5000, true), Bshd, false));
    out.push(special(BF16, 224, 4, 4, 1, 1, 1021, m(-1, 0, true), Padded, false));
    out.push(special(BF16, 256, 2, 1, 1, 509, 509, m(-1, -1, false), Padded, false));
    // The layout-generic kernels over long unmasked key loops (S = 1024, causal and full; each
    // at MAX_COST).
    out.push(special(BF16, 64, 2, 2, 1, 1024, 1024, m(-1, 0, false), QMisaligned, false));
    out.push(special(F16, 64, 2, 1, 1, 1024, 1024, m(-1, -1, false), Padded, false));
    out.push(special(BF16, 128, 1, 1, 1, 1024, 1024, m(-1, 0, false), Padded, false));
    // The Gluon backward's head split (flash/gluon.rs `head_split`: G ≥ 4, G·Sq ≥ 24576, the bucket
    // 128): two CTAs per key block, dK/dV summed from fp32 partials (bitwise the same every run).
    // Within MAX_COST a split call has one key block (test/gluon/check_bwd.py walks several).
    out.push(special(BF16, 72, 8, 1, 1, 3079, 83, m(-1, 0, true), Bshd, true)); // G=8
    out.push(special(F16, 128, 4, 1, 1, 6151, 37, m(-1, -1, false), Bhsd, false)); // G=4
    // Head dims above 256 (bucket 512, the portable kernels under every backend): the bucket's
    // ends and between, GQA and MQA, every layout, rows without keys, Sq = 1, determinism.
    out.push(special(BF16, 512, 4, 2, 1, 251, 251, m(-1, 0, true), Bshd, false));
    out.push(special(F16, 264, 3, 3, 1, 97, 97, m(16, 5, false), Padded, false));
    out.push(special(BF16, 320, 4, 1, 1, 509, 31, m(-1, 0, true), QMisaligned, false)); // MQA, empty rows
    out.push(special(F16, 512, 2, 2, 2, 1, 251, m(-1, 0, true), Bhsd, false));
    out.push(special(BF16, 448, 4, 2, 1, 131, 97, m(-1, -1, false), Bhsd, true));
    out
}

/// Largest B·Hq·Sq·Sk·D of a `--quick` case.
const QUICK_MAX_COST: usize = 30_000_000;

/// The head-dim bucket a case's kernels are compiled for.
fn bucket(head_dim: usize) -> usize {
    head_dim.next_power_of_two().max(16)
}

/// `--quick`: among the cases whose lengths both span several blocks (≥ 97) and that cost at
/// most `QUICK_MAX_COST`, cheapest first, a case is kept when it brings a head-dim bucket, mask
/// kind, alignment, layout, dtype or GQA ratio (MQA apart) not covered yet; then the cheapest
/// cases with Sq = 1, with Sk = 1, and of head-dim bucket 256 in a layout the Gluon forward
/// serves. The backward ×10 determinism cases are left out.
fn quick_cases(all: &[Case]) -> Vec<Case> {
    let eligible = |i: &usize| !all[*i].repeat_bwd && all[*i].cost() <= QUICK_MAX_COST;
    let mut order: Vec<usize> = (0..all.len())
        .filter(eligible)
        .filter(|&i| all[i].seqlen_q.min(all[i].seqlen_k) >= 97)
        .collect();
    order.sort_by_key(|&i| all[i].cost());
    let mut seen = std::collections::BTreeSet::new();
    let mut chosen = Vec::new();
    for &i in &order {
        let c = &all[i];
        let keys = [
            format!("bucket {}", bucket(c.head_dim)),
            format!("mask {}", mask_kind(&c.mask, c.seqlen_q, c.seqlen_k)),
            format!("align {}", c.mask.bottom_right),
            format!("layout {}", c.layout.name()),
            format!("dtype {}", c.dtype.name()),
            format!("ratio {} {}", c.group(), c.heads_k == 1 && c.heads_q > 1),
        ];
        let mut new = false;
        for k in keys {
            new |= seen.insert(k);
        }
        if new {
            chosen.push(i);
        }
    }
    let cheapest = |f: &dyn Fn(&Case) -> bool| {
        (0..all.len()).filter(eligible).filter(|&i| f(&all[i])).min_by_key(|&i| all[i].cost())
    };
    let tma = |c: &Case| matches!(c.layout, Layout::Bhsd | Layout::Bshd);
    for edge in [
        cheapest(&|c| c.seqlen_q == 1 && c.seqlen_k > 1),
        cheapest(&|c| c.seqlen_k == 1 && c.seqlen_q > 1),
        cheapest(&|c| bucket(c.head_dim) == 256 && tma(c) && c.seqlen_q.min(c.seqlen_k) >= 97),
    ]
    .into_iter()
    .flatten()
    {
        if !chosen.contains(&edge) {
            chosen.push(edge);
        }
    }
    chosen.into_iter().map(|i| all[i]).collect()
}

/// Counts per axis value, as printed at the start of the log and by `--list`.
fn coverage(all: &[Case]) -> String {
    let mut axes: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    let mut add = |axis: &'static str, value: String| *axes.entry(axis).or_default().entry(value).or_default() += 1;
    for c in all {
        add("1 head dim", format!("{:>3}", c.head_dim));
        let mqa = if c.heads_k == 1 && c.heads_q > 1 { " (MQA)" } else { "" };
        add("2 GQA ratio", format!("{}{mqa}", c.group()));
        add("3 mask", mask_kind(&c.mask, c.seqlen_q, c.seqlen_k).to_string());
        add(
            "4 align",
            if c.mask.left == -1 && c.mask.right == -1 {
                "-"
            } else if c.mask.bottom_right {
                "BR"
            } else {
                "TL"
            }
            .into(),
        );
        add("5 dtype", c.dtype.name().to_string());
        add("6 layout", c.layout.name().to_string());
        let order = match c.seqlen_q.cmp(&c.seqlen_k) {
            std::cmp::Ordering::Less => "Sq<Sk",
            std::cmp::Ordering::Equal => "Sq=Sk",
            std::cmp::Ordering::Greater => "Sq>Sk",
        };
        add("7 seqlens", order.to_string());
        for s in [c.seqlen_q, c.seqlen_k] {
            if [1, 13, 31, 97, 251, 509, 1021].contains(&s) {
                add("8 length (1 or prime)", format!("{s:>4}"));
            }
        }
        if c.empty_rows() > 0 {
            add("9 special", "rows without keys".into());
        }
        if c.fwd_without_lse {
            add("9 special", "fwd without LSE".into());
        }
        if c.repeat_bwd {
            add("9 special", format!("bwd ×{REPEATS} bitwise"));
        }
    }
    let mut s = String::from("coverage (cases per value):\n");
    for (axis, values) in axes {
        let _ = write!(s, "  {:<22}", &axis[2..]);
        for (v, n) in values {
            let _ = write!(s, " {v}:{n}");
        }
        s.push('\n');
    }
    let total: usize = all.iter().map(Case::cost).sum();
    let _ = write!(
        s,
        "  {} cases, Σ B·Hq·Sq·Sk·D = {:.2e}, largest {:.2e}",
        all.len(),
        total as f64,
        all.iter().map(Case::cost).max().unwrap_or(0) as f64
    );
    s
}

/// Where a logical tensor lives in its buffer.
#[derive(Clone)]
struct Placement<const R: usize> {
    sizes: [usize; R],
    strides: [usize; R],
    offset: usize, // elements before element [0,...]
    len: usize,    // whole buffer, guard included
}

impl<const R: usize> Placement<R> {
    fn new(sizes: [usize; R], strides: [usize; R], offset: usize) -> Self {
        let extent: usize = sizes.iter().zip(&strides).map(|(&n, &s)| (n - 1) * s).sum::<usize>() + 1;
        Placement {
            sizes,
            strides,
            offset,
            len: offset + extent + GUARD,
        }
    }
    /// Buffer index of each logical element, in logical row-major order.
    fn indices(&self) -> Vec<usize> {
        let total: usize = self.sizes.iter().product();
        let mut out = Vec::with_capacity(total);
        let mut idx = [0usize; R];
        for _ in 0..total {
            out.push(self.offset + idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum::<usize>());
            for d in (0..R).rev() {
                idx[d] += 1;
                if idx[d] < self.sizes[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out
    }
}

/// A B×H×S×D tensor of the case; `shifted`: q, dO, dQ (2 bytes off in the misaligned layout).
fn place4(c: &Case, h: usize, s: usize, shifted: bool) -> Placement<4> {
    let (b, d) = (c.batch, c.head_dim);
    let sizes = [b, h, s, d];
    match c.layout {
        Layout::Bhsd => Placement::new(sizes, [h * s * d, s * d, d, 1], 0),
        Layout::Bshd => Placement::new(sizes, [s * h * d, d, h * d, 1], 0),
        Layout::Padded => Placement::new(sizes, [h * s * (d + 1), s * (d + 1), d + 1, 1], 0),
        Layout::QMisaligned => Placement::new(sizes, [h * s * d, s * d, d, 1], shifted as usize),
    }
}

/// LSE and delta: B×Hq×Sq fp32.
fn place_rows(c: &Case) -> Placement<3> {
    let (b, h, s) = (c.batch, c.heads_q, c.seqlen_q);
    let pitch = if c.layout == Layout::Padded { s + 3 } else { s };
    Placement::new([b, h, s], [h * pitch, pitch, 1], 0)
}

/// A device allocation, freed on drop.
struct DevBuf(sys::CUdeviceptr);

impl DevBuf {
    fn new(bytes: usize) -> Result<Self, String> {
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(|e| format!("cuMemAlloc({bytes}): {e:?}"))?;
        Ok(DevBuf(ptr))
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let _ = unsafe { result::free_sync(self.0) };
    }
}

fn sync(stream: sys::CUstream) -> Result<(), String> {
    unsafe { result::stream::synchronize(stream) }.map_err(|e| format!("cuStreamSynchronize: {e:?}"))
}

/// Which of the backward's inputs its call changed: q, k, v and dO against what was uploaded, O and
/// the LSE against what the forward left in them (`o_bits`, `lse_bits`); stray writes into their
/// guards count.
fn backward_inputs_changed<T: Copy + PartialEq>(
    [q, k, v, d_o, o]: [&DevTensor<T, 4>; 5],
    o_bits: &[T],
    lse: &DevTensor<u32, 3>,
    lse_bits: &[u32],
    stream: sys::CUstream,
) -> Result<Vec<&'static str>, String> {
    let mut changed = Vec::new();
    for (name, dev, want) in [("q", q, &q.host[..]), ("k", k, &k.host[..]), ("v", v, &v.host[..]), ("dO", d_o, &d_o.host[..]), ("o", o, o_bits)] {
        if dev.read(stream)? != want {
            changed.push(name);
        }
    }
    if lse.read(stream)? != lse_bits {
        changed.push("lse");
    }
    Ok(changed)
}

/// A tensor on the device: its buffer, where the view lies in it, and the host copy of what was
/// uploaded (the values inside the view, poison everywhere else).
struct DevTensor<T: Copy + PartialEq, const R: usize> {
    buf: DevBuf,
    place: Placement<R>,
    host: Vec<T>,
}

impl<T: Copy + PartialEq, const R: usize> DevTensor<T, R> {
    /// Uploads `values` (logical order) into a buffer of `poison`; `None` = all poison.
    fn new(place: Placement<R>, values: Option<&[T]>, poison: T, stream: sys::CUstream) -> Result<Self, String> {
        let mut host = vec![poison; place.len];
        if let Some(values) = values {
            for (x, i) in values.iter().zip(place.indices()) {
                host[i] = *x;
            }
        }
        let t = DevTensor {
            buf: DevBuf::new(place.len * size_of::<T>())?,
            place,
            host,
        };
        t.restore(stream)?;
        Ok(t)
    }
    /// Uploads the host copy again (re-poisons an output).
    fn restore(&self, stream: sys::CUstream) -> Result<(), String> {
        unsafe { result::memcpy_htod_async(self.buf.0, &self.host, stream) }
            .map_err(|e| format!("cuMemcpyHtoDAsync: {e:?}"))
    }
    /// The whole buffer, after everything queued on `stream`.
    fn read(&self, stream: sys::CUstream) -> Result<Vec<T>, String> {
        let mut bits = self.host.clone();
        unsafe { result::memcpy_dtoh_async(&mut bits, self.buf.0, stream) }
            .map_err(|e| format!("cuMemcpyDtoHAsync: {e:?}"))?;
        sync(stream)?;
        Ok(bits)
    }
    fn view(&self, dtype: DType) -> TensorView<R> {
        TensorView::new(
            self.buf.0 + (self.place.offset * size_of::<T>()) as u64,
            self.place.sizes.map(|n| n as u64),
            self.place.strides.map(|s| s as i64),
            dtype,
        )
    }
    /// The view's elements of a downloaded buffer, in logical order.
    fn logical(&self, bits: &[T]) -> Vec<T> {
        self.place.indices().into_iter().map(|i| bits[i]).collect()
    }
    /// Elements outside the view that differ from what was uploaded (stray writes).
    fn stray(&self, bits: &[T]) -> usize {
        let mut inside = vec![false; self.place.len];
        self.place.indices().into_iter().for_each(|i| inside[i] = true);
        bits.iter()
            .zip(&self.host)
            .zip(&inside)
            .filter(|((b, h), inside)| !**inside && b != h)
            .count()
    }
}

/// A contiguous (row-major) placement of `sizes`, no offset.
fn contiguous<const R: usize>(sizes: [usize; R]) -> Placement<R> {
    let mut strides = [1usize; R];
    for d in (0..R.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * sizes[d + 1];
    }
    Placement::new(sizes, strides, 0)
}

/// The ten device tensors of one forward + backward call pair: q, k, v and dO uploaded,
/// O, dQ, dK, dV, LSE and delta all poison.
struct StepTensors<E: Copy + PartialEq> {
    q: DevTensor<E, 4>,
    k: DevTensor<E, 4>,
    v: DevTensor<E, 4>,
    d_o: DevTensor<E, 4>,
    o: DevTensor<E, 4>,
    dq: DevTensor<E, 4>,
    dk: DevTensor<E, 4>,
    dv: DevTensor<E, 4>,
    lse: DevTensor<u32, 3>,
    delta: DevTensor<u32, 3>,
}

impl<E: Copy + PartialEq> StepTensors<E> {
    /// Contiguous B×H×S×D tensors (Hq, Sq for q-shaped ones, Hk, Sk for k-shaped ones) and
    /// B×Hq×Sq rows; `[q, k, v, d_o]` in logical order.
    fn contiguous(
        [b, hq, hk, sq, sk, d]: [usize; 6],
        [q, k, v, d_o]: [&[E]; 4],
        poison: E,
        stream: sys::CUstream,
    ) -> Result<Self, String> {
        let (qs, ks) = (contiguous([b, hq, sq, d]), contiguous([b, hk, sk, d]));
        let upload = |place: &Placement<4>, values| DevTensor::new(place.clone(), values, poison, stream);
        Ok(StepTensors {
            q: upload(&qs, Some(q))?,
            k: upload(&ks, Some(k))?,
            v: upload(&ks, Some(v))?,
            d_o: upload(&qs, Some(d_o))?,
            o: upload(&qs, None)?,
            dq: upload(&qs, None)?,
            dk: upload(&ks, None)?,
            dv: upload(&ks, None)?,
            lse: DevTensor::new(contiguous([b, hq, sq]), None, POISON32, stream)?,
            delta: DevTensor::new(contiguous([b, hq, sq]), None, POISON32, stream)?,
        })
    }

    /// Forward parameters over these tensors (LSE stored), every option at its default.
    fn fwd_params(&self, dtype: DType) -> flash::FwdParams<'_> {
        flash::FwdParams::new(
            self.q.view(dtype),
            self.k.view(dtype),
            self.v.view(dtype),
            self.o.view(dtype),
            Some(self.lse.view(DType::F32)),
        )
    }

    /// Backward parameters over these tensors, every option at its default.
    fn bwd_params(&self, dtype: DType) -> flash::BwdParams<'_> {
        flash::BwdParams::new(
            self.q.view(dtype),
            self.k.view(dtype),
            self.v.view(dtype),
            self.o.view(dtype),
            self.d_o.view(dtype),
            self.lse.view(DType::F32),
            self.delta.view(DType::F32),
            self.dq.view(dtype),
            self.dk.view(dtype),
            self.dv.view(dtype),
        )
    }

    /// The whole buffers of O, LSE, dQ, dK and dV after everything queued on `stream`.
    #[allow(clippy::type_complexity)]
    fn outputs(&self, stream: sys::CUstream) -> Result<(Vec<E>, Vec<u32>, Vec<E>, Vec<E>, Vec<E>), String> {
        Ok((self.o.read(stream)?, self.lse.read(stream)?, self.dq.read(stream)?, self.dk.read(stream)?, self.dv.read(stream)?))
    }
}

fn dtype_of(t: Lowp) -> DType {
    match t {
        Lowp::F16 => DType::F16,
        Lowp::BF16 => DType::BF16,
    }
}

fn api_mask(m: &MaskSpec) -> Mask {
    let align = if m.bottom_right {
        MaskAlign::BottomRight
    } else {
        MaskAlign::TopLeft
    };
    match (m.left, m.right) {
        // No window, but the diagonal (ALiBi measures from it) where the case puts it.
        (-1, -1) => Mask { align, ..Mask::NONE },
        (-1, 0) => Mask::causal(align),
        (l, r) => Mask::window(l as i32, r as i32, align),
    }
}

struct Outcome {
    pass: bool,
    line: String,
}

/// One bounded comparison: max|got − ref| ≤ bound; NaNs counted apart (they never pass).
struct Bounded {
    name: &'static str,
    err: f64,
    bound: f64,
    floor_factor: f64,
    nan: usize,
}

impl Bounded {
    /// `k` · max|naive − exact| + 1e-3 (× max(1, max|exact|) when `scale_floor`).
    fn new(name: &'static str, got: &[f64], exact: &[f64], naive: &[f64], k: f64, scale_floor: bool) -> Self {
        Self::with_floor(name, got, exact, naive, k, 1e-3, scale_floor)
    }
    /// `k` · max|naive − exact| + `floor` (× max(1, max|exact|) when `scale_floor`).
    fn with_floor(
        name: &'static str,
        got: &[f64],
        exact: &[f64],
        naive: &[f64],
        k: f64,
        floor: f64,
        scale_floor: bool,
    ) -> Self {
        let nan = got.iter().filter(|x| x.is_nan()).count();
        let err = max_err(got, exact);
        let naive_err = max_err(naive, exact);
        let floor_factor = if scale_floor {
            exact.iter().fold(1.0f64, |m, x| m.max(x.abs()))
        } else {
            1.0
        };
        Bounded {
            name,
            err,
            bound: k * naive_err + floor * floor_factor,
            floor_factor,
            nan,
        }
    }
    fn pass(&self) -> bool {
        self.nan == 0 && self.err <= self.bound
    }
    fn show(&self) -> String {
        let mut s = format!("{} {:.2e}/{:.2e}", self.name, self.err, self.bound);
        if self.floor_factor > 1.0 {
            let _ = write!(s, "(f×{:.1})", self.floor_factor);
        }
        if self.nan > 0 {
            let _ = write!(s, "[{} NaN]", self.nan);
        }
        if !self.pass() {
            s.push('!');
        }
        s
    }
}

/// Max |a − r| over elements where neither is NaN (NaNs are counted separately); an infinite
/// difference (inf vs finite) gives inf.
fn max_err(a: &[f64], r: &[f64]) -> f64 {
    a.iter()
        .zip(r)
        .map(|(x, y)| {
            if x.is_nan() || y.is_nan() || x == y {
                0.0
            } else {
                (x - y).abs()
            }
        })
        .fold(0.0, f64::max)
}

/// LSE: finite reference rows within 3·max|naive − ref| + 1e-3·max(1, |ref_i|); +inf exactly
/// where the reference is +inf. Returns (pass, text); the text shows the worst row by err/bound.
fn check_lse(got: &[f64], exact: &[f64], naive: &[f64]) -> (bool, String) {
    check_lse_floor(got, exact, naive, 3.0, 1e-3)
}

/// `check_lse` with the floor `floor` · max(1, |ref_i|).
fn check_lse_floor(got: &[f64], exact: &[f64], naive: &[f64], k: f64, floor: f64) -> (bool, String) {
    let finite = |x: &f64| x.is_finite();
    let naive_err = naive
        .iter()
        .zip(exact)
        .filter(|(n, e)| finite(n) && finite(e))
        .map(|(n, e)| (n - e).abs())
        .fold(0.0, f64::max);
    let (mut worst, mut worst_err, mut worst_bound) = (0.0f64, 0.0, k * naive_err + floor);
    let (mut bad_inf, mut bad) = (0usize, 0usize);
    for (&g, &e) in got.iter().zip(exact) {
        if e.is_infinite() {
            bad_inf += (g != f64::INFINITY) as usize;
            continue;
        }
        let bound = k * naive_err + floor * e.abs().max(1.0);
        let err = if g.is_finite() { (g - e).abs() } else { f64::INFINITY };
        bad += (err > bound) as usize; // NaN g: err is inf
        if err / bound > worst {
            (worst, worst_err, worst_bound) = (err / bound, err, bound);
        }
    }
    let mut s = format!("LSE {worst_err:.2e}/{worst_bound:.2e}");
    if bad > 0 {
        let _ = write!(s, "[{bad} rows out]!");
    }
    if bad_inf > 0 {
        let _ = write!(s, "[{bad_inf} rows not +inf]!");
    }
    (bad == 0 && bad_inf == 0, s)
}

fn run_case(c: &Case, rng: &mut SplitMix64, stream: sys::CUstream) -> Result<Outcome, String> {
    let dtype = dtype_of(c.dtype);
    let (b, hq, hk, sq, sk, d) = (c.batch, c.heads_q, c.heads_k, c.seqlen_q, c.seqlen_k, c.head_dim);
    let sm_scale = 1.0 / (d as f32).sqrt();
    let mut draw = |n: usize| (0..n).map(|_| rng.normal_in(c.dtype)).collect::<Vec<f32>>();
    let (q, k, v, d_o) = (
        draw(b * hq * sq * d),
        draw(b * hk * sk * d),
        draw(b * hk * sk * d),
        draw(b * hq * sq * d),
    );
    let enc = |x: &[f32]| x.iter().map(|&v| c.dtype.encode(v)).collect::<Vec<u16>>();
    let fail = |what: String| {
        Ok(Outcome {
            pass: false,
            line: format!("{}  {what}  FAIL", c.describe()),
        })
    };

    // Device tensors: inputs inside NaN guards, outputs all NaN.
    let q_dev = DevTensor::new(place4(c, hq, sq, true), Some(&enc(&q)), POISON16, stream)?;
    let k_dev = DevTensor::new(place4(c, hk, sk, false), Some(&enc(&k)), POISON16, stream)?;
    let v_dev = DevTensor::new(place4(c, hk, sk, false), Some(&enc(&v)), POISON16, stream)?;
    let do_dev = DevTensor::new(place4(c, hq, sq, true), Some(&enc(&d_o)), POISON16, stream)?;
    let o_dev = DevTensor::new(place4(c, hq, sq, false), None, POISON16, stream)?;
    let lse_dev = DevTensor::new(place_rows(c), None, POISON32, stream)?;
    let delta_dev = DevTensor::new(place_rows(c), None, POISON32, stream)?;
    let dq_dev = DevTensor::new(place4(c, hq, sq, true), None, POISON16, stream)?;
    let dk_dev = DevTensor::new(place4(c, hk, sk, false), None, POISON16, stream)?;
    let dv_dev = DevTensor::new(place4(c, hk, sk, false), None, POISON16, stream)?;
    let s = Stream::from_raw(stream as usize);
    let fwd = |lse: Option<TensorView<3>>| {
        let mut p = flash::FwdParams::new(
            q_dev.view(dtype),
            k_dev.view(dtype),
            v_dev.view(dtype),
            o_dev.view(dtype),
            lse,
        );
        p.sm_scale = sm_scale;
        p.mask = api_mask(&c.mask);
        p.backend = backend::get();
        flash::attn_fwd(&p, s)
    };
    let mut bwd_params = flash::BwdParams::new(
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
    bwd_params.sm_scale = sm_scale;
    bwd_params.mask = api_mask(&c.mask);
    bwd_params.backend = backend::get();

    // Forced Gluon: a case outside its rule must be refused (nothing written).
    if backend::forced_gluon() {
        let traits = c.traits();
        if !traits.gluon_serves() {
            let refused = backend::expect_refusal("attn_fwd", fwd(Some(lse_dev.view(DType::F32))))
                .and_then(|f| backend::expect_refusal("attn_bwd", flash::attn_bwd(&bwd_params, s)).map(|b| (f, b)));
            let untouched = o_dev.read(stream)? == o_dev.host && lse_dev.read(stream)? == lse_dev.host
                && dq_dev.read(stream)? == dq_dev.host;
            return Ok(Outcome {
                pass: refused.is_ok() && untouched,
                line: format!(
                    "{}  {}{}  {}",
                    c.describe(),
                    refused.as_ref().map_or_else(|e| e.clone(), |(f, _)| f.clone()),
                    if untouched { "" } else { " [outputs written]!" },
                    if refused.is_ok() && untouched { "PASS" } else { "FAIL" }
                ),
            });
        }
    }
    let _workspace = backend::attach_workspace(&mut bwd_params, stream)?;
    // The Gluon backward adds dQ partials with TMA reduce-adds in no fixed order: its reruns
    // are checked in deterministic mode (Gluon dK/dV + the portable dQ kernel), which must be
    // bitwise reproducible and as accurate.
    let gluon_bwd = bwd_params.backend == flash::Backend::Gluon
        || (bwd_params.backend == flash::Backend::Auto && bwd_params.workspace.is_some());

    let started = Instant::now();
    // 1. Forward without LSE: O is checked below, the LSE buffer must stay all poison.
    let mut no_lse = None;
    if c.fwd_without_lse {
        if let Err(e) = fwd(None) {
            return fail(format!("attn_fwd (lse None) returned {e}"));
        }
        let o_bits = o_dev.read(stream)?;
        let lse_untouched = lse_dev.read(stream)? == lse_dev.host;
        no_lse = Some((o_dev.logical(&o_bits), o_dev.stray(&o_bits), lse_untouched));
        o_dev.restore(stream)?;
    }
    // 2. Forward with LSE.
    if let Err(e) = fwd(Some(lse_dev.view(DType::F32))) {
        return fail(format!("attn_fwd returned {e}"));
    }
    let o_bits = o_dev.read(stream)?;
    let lse_bits = lse_dev.read(stream)?;
    // 3. Backward.
    if let Err(e) = flash::attn_bwd(&bwd_params, s) {
        return fail(format!("attn_bwd returned {e}"));
    }
    let dq_bits = dq_dev.read(stream)?;
    let dk_bits = dk_dev.read(stream)?;
    let dv_bits = dv_dev.read(stream)?;
    let delta_bits = delta_dev.read(stream)?;
    // The backward's inputs must come back unchanged (no writes into inputs or their guards).
    let inputs_changed = backward_inputs_changed([&q_dev, &k_dev, &v_dev, &do_dev, &o_dev], &o_bits, &lse_dev, &lse_bits, stream)?;
    // 4. Determinism: the same bits on every rerun (outputs re-poisoned before each).
    let mut nondeterministic = 0;
    let mut deterministic_dq = None;
    if c.repeat_bwd && gluon_bwd {
        bwd_params.deterministic = true;
        let _workspace = backend::attach_workspace(&mut bwd_params, stream)?;
        let mut first: Option<(Vec<u16>, Vec<u16>, Vec<u16>)> = None;
        for _ in 0..REPEATS {
            for t in [&dq_dev, &dk_dev, &dv_dev] {
                t.restore(stream)?;
            }
            if let Err(e) = flash::attn_bwd(&bwd_params, s) {
                return fail(format!("attn_bwd (deterministic) returned {e}"));
            }
            let run = (dq_dev.read(stream)?, dk_dev.read(stream)?, dv_dev.read(stream)?);
            match &first {
                None => first = Some(run),
                Some(f) => nondeterministic += (*f != run) as usize,
            }
        }
        let (dq_det, dk_det, dv_det) = first.expect("REPEATS > 0");
        // Gluon dK/dV do not depend on the mode; the deterministic dQ is checked below.
        nondeterministic += (dk_det != dk_bits || dv_det != dv_bits) as usize;
        deterministic_dq = Some(dq_dev.logical(&dq_det));
    } else if c.repeat_bwd {
        for _ in 1..REPEATS {
            for t in [&dq_dev, &dk_dev, &dv_dev] {
                t.restore(stream)?;
            }
            delta_dev.restore(stream)?;
            if let Err(e) = flash::attn_bwd(&bwd_params, s) {
                return fail(format!("attn_bwd (rerun) returned {e}"));
            }
            let same =
                dq_dev.read(stream)? == dq_bits && dk_dev.read(stream)? == dk_bits && dv_dev.read(stream)? == dv_bits;
            nondeterministic += !same as usize;
        }
    }
    let gpu_ms = started.elapsed().as_secs_f64() * 1e3;

    // References.
    let started = Instant::now();
    let problem = reference::Problem::plain(
        reference::Precision::Half(c.dtype),
        [b, hq, hk, sq, sk, d],
        c.mask,
        sm_scale,
        [&q, &k, &v, &d_o],
    );
    let (exact, naive) = reference::compute(&problem);
    let ref_ms = started.elapsed().as_secs_f64() * 1e3;

    // Checks.
    let dec = |bits: Vec<u16>| bits.into_iter().map(|x| c.dtype.decode(x) as f64).collect::<Vec<f64>>();
    let o = dec(o_dev.logical(&o_bits));
    let lse: Vec<f64> = lse_dev
        .logical(&lse_bits)
        .into_iter()
        .map(|x| f32::from_bits(x) as f64)
        .collect();
    let dq = dec(dq_dev.logical(&dq_bits));
    let dk = dec(dk_dev.logical(&dk_bits));
    let dv = dec(dv_dev.logical(&dv_bits));
    let delta: Vec<f64> = delta_dev
        .logical(&delta_bits)
        .into_iter()
        .map(|x| f32::from_bits(x) as f64)
        .collect();
    let dq_det = deterministic_dq.map(dec);
    let mut checks = vec![
        Bounded::new("O", &o, &exact.o, &naive.o, 3.0, false),
        Bounded::new("dQ", &dq, &exact.dq, &naive.dq, 5.0, true),
        Bounded::new("dK", &dk, &exact.dk, &naive.dk, 5.0, true),
        Bounded::new("dV", &dv, &exact.dv, &naive.dv, 5.0, true),
    ];
    if let Some(dq_det) = &dq_det {
        checks.push(Bounded::new("dQ(det)", dq_det, &exact.dq, &naive.dq, 5.0, true));
    }
    let (lse_ok, lse_text) = check_lse(&lse, &exact.lse, &naive.lse);
    // Rows without keys: O and dQ exactly 0.
    let mut empty_not_zero = 0;
    for (row, l) in exact.lse.iter().enumerate() {
        if l.is_infinite() {
            let r = row * d..(row + 1) * d;
            empty_not_zero += o[r.clone()].iter().chain(&dq[r]).filter(|&&x| x != 0.0).count();
        }
    }
    // delta = rowsum(dO ∘ O) with this run's O.
    let mut delta_bad = 0;
    for (row, &got) in delta.iter().enumerate() {
        let (mut want, mut mag) = (0.0f64, 0.0f64);
        for t in row * d..(row + 1) * d {
            want += d_o[t] as f64 * o[t];
            mag += (d_o[t] as f64 * o[t]).abs();
        }
        let ok = (got - want).abs() <= 1e-4 * (1.0 + mag); // false for NaN
        delta_bad += !ok as usize;
    }
    let stray = o_dev.stray(&o_bits)
        + lse_dev.stray(&lse_bits)
        + dq_dev.stray(&dq_bits)
        + dk_dev.stray(&dk_bits)
        + dv_dev.stray(&dv_bits)
        + delta_dev.stray(&delta_bits);

    let mut pass = checks.iter().all(Bounded::pass)
        && lse_ok
        && empty_not_zero == 0
        && delta_bad == 0
        && stray == 0
        && inputs_changed.is_empty()
        && nondeterministic == 0;
    let mut line = c.describe();
    let _ = write!(line, "  [{}]", backend::name(backend::get()));
    for ch in &checks[..1] {
        let _ = write!(line, "  {}", ch.show());
    }
    let _ = write!(line, "  {lse_text}");
    for ch in &checks[1..] {
        let _ = write!(line, "  {}", ch.show());
    }
    if let Some((o_first, stray_first, lse_untouched)) = no_lse {
        let first = Bounded::new("O(no-lse)", &dec(o_first), &exact.o, &naive.o, 3.0, false);
        let ok = first.pass() && stray_first == 0 && lse_untouched;
        pass &= ok;
        let _ = write!(line, "  {}", first.show());
        if !lse_untouched {
            line.push_str(" [LSE written though not asked]!");
        }
        if stray_first > 0 {
            let _ = write!(line, " [{stray_first} stray writes]!");
        }
    }
    let empty = c.empty_rows();
    if empty > 0 {
        let _ = write!(line, "  empty rows {empty}/{sq}");
    }
    if empty_not_zero > 0 {
        let _ = write!(line, " [{empty_not_zero} nonzero O/dQ in them]!");
    }
    if delta_bad > 0 {
        let _ = write!(line, "  delta: {delta_bad} rows wrong!");
    }
    if stray > 0 {
        let _ = write!(line, "  {stray} writes outside the views!");
    }
    if !inputs_changed.is_empty() {
        let _ = write!(line, "  inputs changed: {}!", inputs_changed.join(","));
    }
    if c.repeat_bwd {
        let _ = write!(
            line,
            "  determinism: {}/{} reruns identical",
            REPEATS - 1 - nondeterministic,
            REPEATS - 1
        );
    }
    let _ = write!(
        line,
        "  (gpu {gpu_ms:.0} ms, ref {ref_ms:.0} ms)  {}",
        if pass { "PASS" } else { "FAIL" }
    );
    Ok(Outcome { pass, line })
}

/// Live device buffers an invalid call may point at: a seed and an offset (u64), a bias-sized
/// fp16 buffer, and int32 offsets [0, 30, 64] of two packed sequences.
struct Live {
    seed: u64,
    offset: u64,
    bias: u64,
    cu: u64,
}

/// Host copies of `Live::cu`.
const CU_HOST: [i32; 3] = [0, 30, 64];

type FwdSpoil = Box<dyn for<'a> Fn(&mut flash::FwdParams<'a>, &Live)>;
type BwdSpoil = Box<dyn for<'a> Fn(&mut flash::BwdParams<'a>, &Live)>;

/// The call an invalid case makes, after spoiling valid parameters.
enum Spoiled {
    Fwd(FwdSpoil),
    Bwd(BwdSpoil),
}

fn fwd_spoil(f: impl for<'a> Fn(&mut flash::FwdParams<'a>, &Live) + 'static) -> Spoiled {
    Spoiled::Fwd(Box::new(f))
}

fn bwd_spoil(f: impl for<'a> Fn(&mut flash::BwdParams<'a>, &Live) + 'static) -> Spoiled {
    Spoiled::Bwd(Box::new(f))
}

/// A packed batch over the invalid calls' [1, H, 64, D] tensors, sequences of 30 and 34 tokens.
fn live_varlen<'a>(live: &Live, dtype: DType, max_q: u64, host: bool) -> flash::Varlen<'a> {
    let cu = TensorView::contiguous(live.cu, [3], dtype);
    flash::Varlen {
        cu_seqlens_q: cu,
        cu_seqlens_k: cu,
        max_seqlen_q: max_q,
        max_seqlen_k: 34,
        host_cu_seqlens: host.then_some((&CU_HOST[..], &CU_HOST[..])),
        status: 0,
    }
}

/// An invalid call on a live device must fail with `want` and write nothing.
fn invalid_case(what: &str, want: ErrorKind, spoil: Spoiled, stream: sys::CUstream) -> Result<Outcome, String> {
    let (b, hq, hk, s, d) = (1usize, 4usize, 2usize, 64usize, 64usize);
    let ones = |h: usize| vec![lowp::f32_to_f16_bits(1.0); b * h * s * d];
    let t = |h: usize, ptr| TensorView::contiguous(ptr, [b as u64, h as u64, s as u64, d as u64], DType::F16);
    let inputs: Vec<DevBuf> = (0..4)
        .map(|i| DevBuf::new(b * [hq, hk, hk, hq][i] * s * d * 2))
        .collect::<Result<_, _>>()?;
    for (buf, h) in inputs.iter().zip([hq, hk, hk, hq]) {
        unsafe { result::memcpy_htod_async(buf.0, &ones(h), stream) }.map_err(|e| format!("upload: {e:?}"))?;
    }
    let outs = [hq, hq, hk, hk].map(|h| vec![POISON16; b * h * s * d]);
    let out_bufs: Vec<DevBuf> = outs
        .iter()
        .map(|o| DevBuf::new(o.len() * 2))
        .collect::<Result<_, _>>()?;
    for (buf, host) in out_bufs.iter().zip(&outs) {
        unsafe { result::memcpy_htod_async(buf.0, host, stream) }.map_err(|e| format!("upload: {e:?}"))?;
    }
    // lse holds +inf-free valid values for the backward; delta is poison.
    let rows = vec![0u32; b * hq * s];
    let row_bufs = [DevBuf::new(rows.len() * 4)?, DevBuf::new(rows.len() * 4)?];
    for buf in &row_bufs {
        unsafe { result::memcpy_htod_async(buf.0, &rows, stream) }.map_err(|e| format!("upload: {e:?}"))?;
    }
    let row_view = |ptr| TensorView::contiguous(ptr, [b as u64, hq as u64, s as u64], DType::F32);
    let live_bufs = [
        DevBuf::new(8)?,
        DevBuf::new(8)?,
        DevBuf::new(b * hq * s * s * 2)?,
        DevBuf::new(12)?,
    ];
    unsafe { result::memcpy_htod_async(live_bufs[0].0, &[7u64], stream) }.map_err(|e| format!("upload: {e:?}"))?;
    unsafe { result::memcpy_htod_async(live_bufs[3].0, &CU_HOST, stream) }.map_err(|e| format!("upload: {e:?}"))?;
    let live = Live {
        seed: live_bufs[0].0,
        offset: live_bufs[1].0,
        bias: live_bufs[2].0,
        cu: live_bufs[3].0,
    };
    let (q, k, v, d_o) = (
        t(hq, inputs[0].0),
        t(hk, inputs[1].0),
        t(hk, inputs[2].0),
        t(hq, inputs[3].0),
    );
    let (o, dq, dk, dv) = (
        t(hq, out_bufs[0].0),
        t(hq, out_bufs[1].0),
        t(hk, out_bufs[2].0),
        t(hk, out_bufs[3].0),
    );
    let got = match spoil {
        Spoiled::Fwd(spoil) => {
            let mut p = flash::FwdParams::new(q, k, v, o, Some(row_view(row_bufs[0].0)));
            spoil(&mut p, &live);
            flash::attn_fwd(&p, Stream::from_raw(stream as usize))
        }
        Spoiled::Bwd(spoil) => {
            // o (all poison) is an input here: the call must fail before reading anything.
            let mut p = flash::BwdParams::new(
                q,
                k,
                v,
                o,
                d_o,
                row_view(row_bufs[0].0),
                row_view(row_bufs[1].0),
                dq,
                dk,
                dv,
            );
            spoil(&mut p, &live);
            flash::attn_bwd(&p, Stream::from_raw(stream as usize))
        }
    };
    let mut untouched = true;
    for (buf, host) in out_bufs.iter().zip(&outs) {
        let mut bits = vec![0u16; host.len()];
        unsafe { result::memcpy_dtoh_async(&mut bits, buf.0, stream) }.map_err(|e| format!("download: {e:?}"))?;
        sync(stream)?;
        untouched &= bits == *host;
    }
    let (pass, result) = match &got {
        Err(e) if e.kind() == want && untouched => (true, format!("{:?}: {}", e.kind(), e.message())),
        Err(e) if e.kind() == want => (false, format!("{:?}, but an output was written", e.kind())),
        Err(e) => (false, format!("expected {want:?}, got {e}")),
        Ok(()) => (false, format!("expected {want:?}, got Ok")),
    };
    Ok(Outcome {
        pass,
        line: format!(
            "invalid call ({what}) -> {result}  {}",
            if pass { "PASS" } else { "FAIL" }
        ),
    })
}

fn invalid_calls() -> Vec<(&'static str, ErrorKind, Spoiled)> {
    use ErrorKind::*;
    vec![
        ("fwd: q null", NullPointer, fwd_spoil(|p, _| p.q.ptr = 0)),
        ("bwd: lse null", NullPointer, bwd_spoil(|p, _| p.lse.ptr = 0)),
        (
            "fwd: Hq 3, Hk 2",
            ShapeMismatch,
            fwd_spoil(|p, _| {
                p.q.sizes[1] = 3;
                p.o.sizes[1] = 3;
                p.lse = p.lse.map(|mut l| {
                    l.sizes[1] = 3;
                    l
                });
            }),
        ),
        (
            "bwd: Hq 3, Hk 2",
            ShapeMismatch,
            bwd_spoil(|p, _| {
                for t in [&mut p.q, &mut p.o, &mut p.d_o, &mut p.dq] {
                    t.sizes[1] = 3;
                }
                p.lse.sizes[1] = 3;
                p.delta.sizes[1] = 3;
            }),
        ),
        (
            "bwd: head dim 12",
            UnsupportedHeadDim,
            bwd_spoil(|p, _| {
                for t in [
                    &mut p.q, &mut p.k, &mut p.v, &mut p.o, &mut p.d_o, &mut p.dq, &mut p.dk, &mut p.dv,
                ] {
                    t.sizes[3] = 12;
                }
            }),
        ),
        (
            "bwd: window_left -2",
            InvalidArgument,
            bwd_spoil(|p, _| p.mask = Mask::window(-2, 0, MaskAlign::TopLeft)),
        ),
        (
            "fwd: dropout p = 1",
            InvalidArgument,
            fwd_spoil(|p, l| p.dropout = Some(flash::Dropout::new(1.0, l.seed, l.offset))),
        ),
        (
            "bwd: dropout p = 1",
            InvalidArgument,
            bwd_spoil(|p, l| p.dropout = Some(flash::Dropout::new(1.0, l.seed, l.offset))),
        ),
        (
            "fwd: dropout offset misaligned",
            MisalignedPointer,
            fwd_spoil(|p, l| p.dropout = Some(flash::Dropout::new(0.5, l.seed, l.offset + 4))),
        ),
        (
            "fwd: bias [1,3,64,64] with Hq 4",
            ShapeMismatch,
            fwd_spoil(|p, l| p.bias = Some(TensorView::contiguous(l.bias, [1, 3, 64, 64], DType::F16))),
        ),
        (
            "bwd: bias [1,4,64,32] (Sk 64)",
            ShapeMismatch,
            bwd_spoil(|p, l| p.bias = Some(TensorView::contiguous(l.bias, [1, 4, 64, 32], DType::F16))),
        ),
        (
            "bwd: dbias without bias",
            InvalidArgument,
            bwd_spoil(|p, l| p.dbias = Some(TensorView::contiguous(l.bias, [1, 1, 1, 64], DType::F16))),
        ),
        (
            "bwd: dbias sizes != bias sizes",
            ShapeMismatch,
            bwd_spoil(|p, l| {
                p.bias = Some(TensorView::contiguous(l.bias, [1, 1, 1, 64], DType::F16));
                p.dbias = Some(TensorView::contiguous(l.bias, [1, 4, 1, 64], DType::F16));
            }),
        ),
        (
            "fwd: cu_seqlens fp32",
            DTypeMismatch,
            fwd_spoil(|p, l| {
                p.varlen = Some(live_varlen(l, DType::F32, 34, false));
                p.lse = p.lse.map(|mut t| {
                    t.sizes = [1, 4, 64];
                    t
                });
            }),
        ),
        (
            "bwd: cu_seqlens fp32",
            DTypeMismatch,
            bwd_spoil(|p, l| p.varlen = Some(live_varlen(l, DType::F32, 34, false))),
        ),
        (
            "fwd: max_seqlen_q 20 < sequence of 30 (host copies)",
            InvalidArgument,
            fwd_spoil(|p, l| p.varlen = Some(live_varlen(l, DType::I32, 20, true))),
        ),
        (
            "bwd: max_seqlen_q 20 < sequence of 30 (host copies)",
            InvalidArgument,
            bwd_spoil(|p, l| p.varlen = Some(live_varlen(l, DType::I32, 20, true))),
        ),
    ]
}

struct Args {
    log: Option<String>,
    seed: u64,
    require_gpu: bool,
    list: bool,
    quick: bool,
    stress: Option<String>,
}

fn parse_args() -> Args {
    let mut args = Args {
        log: None,
        seed: 0x5EED_A07E,
        require_gpu: false,
        list: false,
        quick: false,
        stress: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--log" => args.log = it.next(),
            "--seed" => args.seed = it.next().and_then(|s| parse_u64(&s)).unwrap_or_else(|| usage()),
            "--require-gpu" => args.require_gpu = true,
            "--list" => args.list = true,
            "--quick" => args.quick = true,
            "--stress" => args.stress = Some(it.next().unwrap_or_else(|| usage())),
            "--backend" => backend::set(it.next().as_deref().and_then(backend::parse).unwrap_or_else(|| usage())),
            _ => usage(),
        }
    }
    args
}

fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: aotriton-gpu-tests [--log PATH] [--seed N] [--require-gpu] [--list] [--backend auto|portable|gluon] [--quick]\n       \
         aotriton-gpu-tests --stress concurrency|large|memory|multi-device [--log PATH] [--seed N] [--require-gpu] [--backend B]"
    );
    std::process::exit(2)
}

/// Device 0's primary context made current, and a new stream on it; None when there is no GPU.
fn open_device() -> Result<Option<sys::CUstream>, String> {
    // cudarc panics on any call when the driver library is missing: check first.
    if !unsafe { sys::is_culib_present() } {
        return Ok(None);
    }
    if let Err(e) = result::init() {
        eprintln!("cuInit: {e:?}");
        return Ok(None);
    }
    match result::device::get_count() {
        Ok(n) if n > 0 => {}
        _ => return Ok(None),
    }
    let dev = result::device::get(0).map_err(|e| format!("cuDeviceGet: {e:?}"))?;
    let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(|e| format!("cuDevicePrimaryCtxRetain: {e:?}"))?;
    unsafe { result::ctx::set_current(ctx) }.map_err(|e| format!("cuCtxSetCurrent: {e:?}"))?;
    // A blocking (default-flag) stream that is not the legacy default stream.
    let stream =
        result::stream::create(result::stream::StreamKind::Default).map_err(|e| format!("cuStreamCreate: {e:?}"))?;
    Ok(Some(stream))
}

const RULES: &str = "bounds: max|out-ref64| <= k*max|naive-ref64| + floor; k=3 (O), 5 (dQ,dK,dV); floor 1e-3, \
for gradients x max|ref| when that is > 1 (shown as f×N); LSE per row 3*naive + 1e-3*max(1,|lse|), +inf exactly \
where ref is +inf; shown as err/bound, '!' marks a failed check";

const EXT_RULES: &str = "feature cases (dropout, bias/dBias, varlen, fp32/tf32, deterministic): same rule with the \
f64 reference using the host Philox mask and the expanded bias (dBias k=5, scaled floor); varlen reference per sequence; \
fp32: floor 1e-5 x max(1,max|ref|) on every tensor, LSE 1e-5; tf32: naive with TF32-truncated product inputs, k=6 (O, LSE) / \
10 (grads), floor 1e-5";

/// `aotriton::device_support` on the test's stream: the device's arch as the driver names it, and
/// the archive serving it (this build's own arch on an sm_90 machine).
fn device_support_case(stream: sys::CUstream) -> Outcome {
    let expected = result::device::get(0)
        .and_then(|d| {
            use sys::CUdevice_attribute::*;
            // SAFETY: a device handle from cuDeviceGet and attributes every device has.
            let major = unsafe { result::device::get_attribute(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) }?;
            let minor = unsafe { result::device::get_attribute(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) }?;
            Ok(format!("sm_{major}{minor}"))
        })
        .unwrap_or_default();
    match aotriton::device_support(Stream::cuda(stream as usize)) {
        Ok(s) => {
            let served = s.served_by.as_deref();
            let pass = s.arch == expected
                && s.runtime == aotriton::Runtime::Cuda
                && s.multiprocessors > 0
                && (served == Some(s.arch.as_str()) || !aotriton::built_archs().contains(&s.arch.as_str()))
                && served.is_some() == s.unsupported.is_none();
            Outcome {
                pass,
                line: format!(
                    "device_support: arch {} (driver says {expected}), {} SMs, served by {served:?}{}  {}",
                    s.arch,
                    s.multiprocessors,
                    s.unsupported.as_deref().map(|u| format!(" ({u})")).unwrap_or_default(),
                    if pass { "PASS" } else { "FAIL" }
                ),
            }
        }
        Err(e) => Outcome { pass: false, line: format!("device_support: {e}  FAIL") },
    }
}

fn main() {
    let args = parse_args();
    if let Some(mode) = &args.stress {
        std::process::exit(stress::run(mode, &args));
    }
    let all = if args.quick { quick_cases(&cases()) } else { cases() };
    let ext_all = if args.quick { ext::quick(ext::ext_cases()) } else { ext::ext_cases() };
    let debug_masks = if args.quick { ext::debug_mask_cases()[1..2].to_vec() } else { ext::debug_mask_cases() };
    let keep_rates: &[f32] = if args.quick { &[0.5] } else { &[0.1, 0.5, 0.9] };
    let reveals = if args.quick { ext::reveal_cases()[..1].to_vec() } else { ext::reveal_cases() };
    if args.list {
        for (i, c) in all.iter().enumerate() {
            println!(
                "[{:3}] {}  cost {:.1e}  empty rows {}",
                i + 1,
                c.describe(),
                c.cost() as f64,
                c.empty_rows()
            );
        }
        println!("{}", coverage(&all));
        for (i, c) in ext_all.iter().enumerate() {
            println!("[ext {:2}] {}  cost {:.1e}", i + 1, c.describe(), c.cost() as f64);
        }
        for (i, c) in decode::cases().iter().enumerate() {
            println!("[decode {:2}] {}", i + 1, c.describe());
        }
        println!(
            "plus {} debug-mask shapes, {} keep-rate checks, {} mask-reveal cases, 1 CUDA-graph case, \
             {} invalid calls{}",
            debug_masks.len(),
            keep_rates.len(),
            reveals.len(),
            invalid_calls().len(),
            if args.quick { " (--quick: no stability case)" } else { ", 1 stability case" }
        );
        return;
    }
    let stream = match open_device() {
        Ok(Some(s)) => s,
        Ok(None) => {
            println!("skipped: no GPU");
            std::process::exit(if args.require_gpu { 2 } else { 0 });
        }
        Err(e) => {
            println!("rust-api: setup failed: {e}");
            std::process::exit(1);
        }
    };
    let name = result::device::get(0)
        .and_then(result::device::get_name)
        .unwrap_or_default();
    let mut log = String::new();
    let emit = |line: String, log: &mut String| {
        println!("{line}");
        let _ = std::io::stdout().flush();
        log.push_str(&line);
        log.push('\n');
    };
    emit(
        format!(
            "aotriton Rust API GPU test: device 0 = {name}, seed {:#x}, backend {}, built archs {:?}{}",
            args.seed,
            backend::name(backend::get()),
            aotriton::built_archs(),
            if args.quick { ", --quick (reduced case list)" } else { "" }
        ),
        &mut log,
    );
    emit(coverage(&all), &mut log);
    emit(RULES.to_string(), &mut log);
    emit(EXT_RULES.to_string(), &mut log);
    let started = Instant::now();
    let mut rng = SplitMix64::new(args.seed);
    let (mut passed, mut failed) = (0usize, 0usize);
    let mut n = 0;
    let mut record = |outcome: Outcome, log: &mut String| {
        if outcome.pass {
            passed += 1
        } else {
            failed += 1
        }
        n += 1;
        emit(format!("[{n:3}] {}", outcome.line), log);
    };
    record(device_support_case(stream), &mut log);
    record(
        tuning::override_case(stream).unwrap_or_else(|e| Outcome { pass: false, line: format!("tuning override: {e}  FAIL") }),
        &mut log,
    );
    // The fp8 forward (one backend: Gluon on sm_90) whatever --backend says.
    for c in fp8::cases() {
        record(fp8::run(&c, &mut rng, stream).unwrap_or_else(|e| Outcome { pass: false, line: format!("{c:?}: {e}  FAIL") }), &mut log);
    }
    // The KV-cache decode attention (portable kernels only) whatever --backend says. A build
    // whose archive lacks its kernels fails once, not once per case.
    for c in decode::cases() {
        match decode::run(&c, &mut rng, stream) {
            Ok(outcome) => record(outcome, &mut log),
            Err(e) => {
                let missing = e.contains("KernelNotFound");
                let rest = if missing { " (the other decode cases are skipped)" } else { "" };
                record(Outcome { pass: false, line: format!("{}: {e}{rest}  FAIL", c.describe()) }, &mut log);
                if missing {
                    break;
                }
            }
        }
    }
    record(
        decode::short_workspace_case(&mut rng, stream)
            .unwrap_or_else(|e| Outcome { pass: false, line: format!("decode workspace: {e}  FAIL") }),
        &mut log,
    );
    for c in &all {
        let outcome = run_case(c, &mut rng, stream).unwrap_or_else(|e| Outcome {
            pass: false,
            line: format!("{}  driver error: {e}  FAIL", c.describe()),
        });
        record(outcome, &mut log);
    }
    // The module cache: every kernel those cases need is loaded by now, so running the first
    // case again loads nothing (one load per kernel per device).
    if let Some(c) = all.first() {
        let loaded = || aotriton::diagnostics::kernels_loaded(aotriton::Runtime::Cuda, 0);
        let before = loaded();
        let again = run_case(c, &mut rng, stream).map(|o| o.pass).unwrap_or(false);
        let after = loaded();
        record(
            Outcome {
                pass: again && before > 0 && after == before,
                line: format!(
                    "module cache: {before} kernels loaded on device 0; the first case again ({}) loaded {}  {}",
                    if again { "passed" } else { "FAILED" },
                    after - before,
                    if again && before > 0 && after == before { "PASS" } else { "FAIL" }
                ),
            },
            &mut log,
        );
    }
    let guarded = |what: String, r: Result<Outcome, String>| {
        r.unwrap_or_else(|e| Outcome {
            pass: false,
            line: format!("{what}  driver error: {e}  FAIL"),
        })
    };
    if !args.quick {
        record(
            guarded("stability".into(), stability::stability_case(&mut rng, stream)),
            &mut log,
        );
    }
    // The third milestone: debug mask vs host Philox, keep rates, mask reveal, feature cases,
    // CUDA graph replay.
    for case in debug_masks {
        record(
            guarded(format!("debug mask {:?}", case.0), ext::debug_mask_case(case, stream)),
            &mut log,
        );
    }
    for &p in keep_rates {
        record(
            guarded(format!("keep rate p={p}"), ext::keep_rate_case(p, stream)),
            &mut log,
        );
    }
    for case in reveals {
        record(
            guarded(
                format!("mask reveal {case:?}"),
                ext::reveal_case(case, &mut rng, stream),
            ),
            &mut log,
        );
    }
    for c in &ext_all {
        record(guarded(c.describe(), ext::run_ext(c, &mut rng, stream)), &mut log);
    }
    record(
        guarded("CUDA graph".into(), ext::graph_case(&mut rng, stream)),
        &mut log,
    );
    for (what, want, spoil) in invalid_calls() {
        let outcome = invalid_case(what, want, spoil, stream).unwrap_or_else(|e| Outcome {
            pass: false,
            line: format!("invalid call ({what}): driver error: {e}  FAIL"),
        });
        record(outcome, &mut log);
    }
    emit(format!("total {:.1} s", started.elapsed().as_secs_f64()), &mut log);
    emit(format!("rust-api: {passed} passed, {failed} failed"), &mut log);
    if let Some(path) = &args.log
        && let Err(e) = std::fs::write(path, &log)
    {
        eprintln!("cannot write {path}: {e}");
        failed += 1;
    }
    std::process::exit(if failed == 0 { 0 } else { 1 });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value the brief asks for appears in the case list, several times where it matters.
    #[test]
    fn case_list_covers_the_axes() {
        let all = cases();
        assert!(all.len() >= 100);
        let count = |f: &dyn Fn(&Case) -> bool| all.iter().filter(|c| f(c)).count();
        for d in HEAD_DIMS {
            assert!(count(&|c| c.head_dim == d) >= 5, "head dim {d}");
            for t in [Lowp::F16, Lowp::BF16] {
                assert!(count(&|c| c.head_dim == d && c.dtype == t) >= 2, "head dim {d} {t:?}");
            }
        }
        for g in [1, 2, 4, 8] {
            assert!(count(&|c| c.group() == g) >= 8, "ratio {g}");
        }
        for hq in [2, 4, 8] {
            assert!(count(&|c| c.heads_k == 1 && c.heads_q == hq) >= 3, "MQA Hq {hq}");
        }
        for mk in MASKS {
            assert!(count(&|c| c.mask == mk) >= 4, "mask {}", mask_name(&mk));
            for t in [Lowp::F16, Lowp::BF16] {
                assert!(
                    count(&|c| c.mask == mk && c.dtype == t) >= 1,
                    "mask {} {t:?}",
                    mask_name(&mk)
                );
            }
        }
        for s in [1, 13, 31, 97, 251, 509, 1021] {
            assert!(
                count(&|c| c.seqlen_q == s) >= 2 && count(&|c| c.seqlen_k == s) >= 2,
                "length {s}"
            );
        }
        assert!(count(&|c| c.seqlen_q < c.seqlen_k) >= 20 && count(&|c| c.seqlen_q > c.seqlen_k) >= 20);
        assert!(count(&|c| c.mask.bottom_right && c.seqlen_q > c.seqlen_k && c.empty_rows() > 0) >= 4);
        assert!(count(&|c| !c.mask.bottom_right && c.empty_rows() > 0) >= 2);
        for l in [Layout::Bhsd, Layout::Bshd, Layout::Padded, Layout::QMisaligned] {
            assert!(count(&|c| c.layout == l) >= 8, "layout {l:?}");
        }
        assert!(count(&|c| c.fwd_without_lse) >= 5);
        assert!(count(&|c| c.repeat_bwd && c.group() == 4) >= 1 && count(&|c| c.repeat_bwd && c.group() == 8) >= 1);
        assert!(
            all.iter()
                .all(|c| c.cost() <= MAX_COST && c.heads_q % c.heads_k == 0 && c.head_dim % 8 == 0)
        );
    }

    /// `--quick` keeps a short list that still meets every head-dim bucket, both dtypes, every
    /// layout, lengths of 1 on either side, and a Gluon-served case of each Gluon bucket.
    #[test]
    fn quick_list_covers_the_kernels() {
        let quick = quick_cases(&cases());
        assert!(quick.len() <= 20, "{}", quick.len());
        for b in [16, 32, 64, 128, 256, 512] {
            assert!(quick.iter().any(|c| bucket(c.head_dim) == b), "bucket {b}");
        }
        for l in [Layout::Bhsd, Layout::Bshd, Layout::Padded, Layout::QMisaligned] {
            assert!(quick.iter().any(|c| c.layout == l), "{l:?}");
        }
        assert!(quick.iter().any(|c| c.dtype == Lowp::F16) && quick.iter().any(|c| c.dtype == Lowp::BF16));
        assert!(quick.iter().any(|c| c.seqlen_q == 1) && quick.iter().any(|c| c.seqlen_k == 1));
        assert!(quick.iter().any(|c| c.empty_rows() > 0));
        for b in [64, 128, 256] {
            let served = |c: &Case| c.traits().gluon_serves() && bucket(c.head_dim).max(64) == b;
            assert!(quick.iter().any(served), "gluon {b}");
        }
        assert!(quick.iter().all(|c| !c.repeat_bwd));
        let ext = ext::quick(ext::ext_cases());
        assert!(ext.len() >= 6 && ext.iter().all(|c| c.cost() <= MAX_COST / 4));
    }

    /// Time of the CPU reference over the whole list (run with --ignored --nocapture, release).
    #[test]
    #[ignore]
    fn reference_time() {
        let started = Instant::now();
        let mut rng = SplitMix64::new(1);
        for c in cases() {
            let (b, hq, hk, sq, sk, d) = (c.batch, c.heads_q, c.heads_k, c.seqlen_q, c.seqlen_k, c.head_dim);
            let mut draw = |n: usize| (0..n).map(|_| rng.normal_in(c.dtype)).collect::<Vec<f32>>();
            let (q, k, v, d_o) = (
                draw(b * hq * sq * d),
                draw(b * hk * sk * d),
                draw(b * hk * sk * d),
                draw(b * hq * sq * d),
            );
            let t = Instant::now();
            let problem = reference::Problem::plain(
                reference::Precision::Half(c.dtype),
                [b, hq, hk, sq, sk, d],
                c.mask,
                1.0 / (d as f32).sqrt(),
                [&q, &k, &v, &d_o],
            );
            let _ = reference::compute(&problem);
            println!("{:8.0} ms  {}", t.elapsed().as_secs_f64() * 1e3, c.describe());
        }
        println!("total {:.1} s", started.elapsed().as_secs_f64());
    }
}
