//! GPU correctness test of the aotriton Rust API (`aotriton::flash::attn_fwd`).
//!
//! Runs a deterministic set of forward cases (both dtypes, head dims 64/128, causal on/off,
//! ragged sequence lengths, Sq ≠ Sk both ways, B×S×H×D memory viewed as B×H×S×D, a Q pointer
//! that is only 2-byte aligned, padded rows) on a non-default stream of device 0, and compares
//! every output element against a float64 CPU reference. The error allowed is scaled by the
//! error of the same attention computed naively in the input precision (see reference.rs):
//!     max|out − ref64| ≤ 3 · max|naive − ref64| + floor
//! with floor 1e-3 for O and 1e-3·max(1, max|lse|) for LSE. Outputs are poisoned with NaN
//! before each run: an element left unwritten fails, and so does any write outside the views.
//!
//! Usage: aotriton-gpu-tests [--log PATH] [--seed N] [--require-gpu]
//! Without a driver or a device it prints `skipped: no GPU` and exits 0 (2 with --require-gpu).
mod lowp;
mod reference;

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Instant;

use aotriton::{DType, ErrorKind, Stream, TensorView, flash};
use cudarc::driver::{result, sys};
use lowp::{Lowp, POISON16, POISON32, SplitMix64};

/// Elements of poison kept after every buffer, to catch writes (O, LSE) or unmasked reads
/// (Q, K, V are followed by NaNs too) past the end of a view.
const GUARD: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Contiguous B×H×S×D.
    Bhsd,
    /// B×S×H×D memory viewed as B×H×S×D: strides [S·H·D, D, H·D, 1].
    Bshd,
    /// B×H×S×D with a row pitch of D+1 elements (rows not 16-byte aligned) and an LSE with a
    /// padded row pitch; the padding holds NaNs that must be neither read nor written.
    Padded,
    /// Contiguous, but Q starts 2 bytes past a 16-byte boundary (the runtime's unaligned variant).
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
    causal: bool,
    batch: usize,
    heads: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    layout: Layout,
}

impl Case {
    fn describe(&self) -> String {
        format!(
            "{} D={:<3} causal={} B={} H={} Sq={:<4} Sk={:<4} layout={:<6}",
            self.dtype.name(),
            self.head_dim,
            self.causal as u8,
            self.batch,
            self.heads,
            self.seqlen_q,
            self.seqlen_k,
            self.layout.name()
        )
    }
}

/// 32 regular cases: every combination of (dtype, head dim, causal, layout) twice, each of 16
/// (Sq, Sk) pairs twice with different combinations; then the special layouts.
fn cases() -> Vec<Case> {
    const PAIRS: [(usize, usize); 16] = [
        (1, 1),
        (17, 17),
        (127, 127),
        (1000, 1000),
        (1, 17),
        (17, 1),
        (1, 1000),
        (1000, 1),
        (17, 1000),
        (1000, 17),
        (127, 1000),
        (1000, 127),
        (17, 127),
        (127, 17),
        (64, 128),
        (256, 200),
    ];
    let mut out = Vec::new();
    for i in 0..32usize {
        let combo = i % 16;
        // 5 is coprime to 16, so each round visits every pair once; the +3 shift pairs each
        // (Sq, Sk) with a different combination in the second round.
        let pair = PAIRS[(5 * i + 3 * (i / 16)) % 16];
        out.push(Case {
            dtype: if combo & 1 == 0 { Lowp::F16 } else { Lowp::BF16 },
            head_dim: if combo & 2 == 0 { 64 } else { 128 },
            causal: combo & 4 != 0,
            layout: if combo & 8 == 0 { Layout::Bhsd } else { Layout::Bshd },
            batch: 1 + i % 3,
            heads: 1 + (i / 3) % 4,
            seqlen_q: pair.0,
            seqlen_k: pair.1,
        });
    }
    let special = |dtype, head_dim, causal, batch, heads, seqlen_q, seqlen_k, layout| Case {
        dtype,
        head_dim,
        causal,
        batch,
        heads,
        seqlen_q,
        seqlen_k,
        layout,
    };
    out.push(special(Lowp::F16, 64, false, 2, 3, 200, 333, Layout::QMisaligned));
    out.push(special(Lowp::BF16, 128, true, 1, 2, 1000, 127, Layout::QMisaligned));
    out.push(special(Lowp::BF16, 64, true, 2, 2, 130, 130, Layout::Padded));
    out.push(special(Lowp::F16, 128, false, 1, 3, 17, 300, Layout::Padded));
    out
}

/// Where a logical B×H×S×D (or B×H×S for LSE) tensor lives in its buffer.
struct Placement<const R: usize> {
    offset: usize, // elements before element [0,...]
    strides: [usize; R],
    len: usize, // whole buffer, guard included
}

impl<const R: usize> Placement<R> {
    fn new(sizes: [usize; R], strides: [usize; R], offset: usize) -> Self {
        let extent: usize = sizes.iter().zip(&strides).map(|(&n, &s)| (n - 1) * s).sum::<usize>() + 1;
        Placement { offset, strides, len: offset + extent + GUARD }
    }
    /// Buffer index of each logical element, in logical row-major order.
    fn indices(&self, sizes: [usize; R]) -> Vec<usize> {
        let total: usize = sizes.iter().product();
        let mut out = Vec::with_capacity(total);
        let mut idx = [0usize; R];
        for _ in 0..total {
            out.push(self.offset + idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum::<usize>());
            for d in (0..R).rev() {
                idx[d] += 1;
                if idx[d] < sizes[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out
    }
}

fn place4(c: &Case, seqlen: usize, is_q: bool) -> Placement<4> {
    let (b, h, s, d) = (c.batch, c.heads, seqlen, c.head_dim);
    let sizes = [b, h, s, d];
    match c.layout {
        Layout::Bhsd => Placement::new(sizes, [h * s * d, s * d, d, 1], 0),
        Layout::Bshd => Placement::new(sizes, [s * h * d, d, h * d, 1], 0),
        Layout::Padded => Placement::new(sizes, [h * s * (d + 1), s * (d + 1), d + 1, 1], 0),
        Layout::QMisaligned => Placement::new(sizes, [h * s * d, s * d, d, 1], if is_q { 1 } else { 0 }),
    }
}

fn place_lse(c: &Case) -> Placement<3> {
    let (b, h, s) = (c.batch, c.heads, c.seqlen_q);
    match c.layout {
        Layout::Padded => Placement::new([b, h, s], [h * (s + 3), s + 3, 1], 0),
        _ => Placement::new([b, h, s], [h * s, s, 1], 0),
    }
}

/// A device allocation, freed on drop.
struct DevBuf(sys::CUdeviceptr);

impl DevBuf {
    fn new(bytes: usize) -> Result<Self, String> {
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(|e| format!("cuMemAlloc({bytes}): {e:?}"))?;
        Ok(DevBuf(ptr))
    }
    fn upload<T>(&self, host: &[T], stream: sys::CUstream) -> Result<(), String> {
        unsafe { result::memcpy_htod_async(self.0, host, stream) }.map_err(|e| format!("cuMemcpyHtoDAsync: {e:?}"))
    }
    fn download<T>(&self, host: &mut [T], stream: sys::CUstream) -> Result<(), String> {
        unsafe { result::memcpy_dtoh_async(host, self.0, stream) }.map_err(|e| format!("cuMemcpyDtoHAsync: {e:?}"))
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

fn dtype_of(t: Lowp) -> DType {
    match t {
        Lowp::F16 => DType::F16,
        Lowp::BF16 => DType::BF16,
    }
}

fn view4(base: &DevBuf, p: &Placement<4>, sizes: [usize; 4], dtype: DType) -> TensorView<4> {
    TensorView::new(
        base.0 + (p.offset as u64) * dtype.size_bytes(),
        sizes.map(|n| n as u64),
        p.strides.map(|s| s as i64),
        dtype,
    )
}

fn view3(base: &DevBuf, p: &Placement<3>, sizes: [usize; 3]) -> TensorView<3> {
    TensorView::new(base.0 + (p.offset as u64) * 4, sizes.map(|n| n as u64), p.strides.map(|s| s as i64), DType::F32)
}

/// Inputs of one case: logical values (rounded to the dtype) and the device-layout buffers.
struct Inputs {
    logical: [Vec<f32>; 3],
    buffers: [Vec<u16>; 3],
    places: [Placement<4>; 3],
}

fn make_inputs(c: &Case, rng: &mut SplitMix64) -> Inputs {
    let mk = |rng: &mut SplitMix64, seqlen: usize, is_q: bool| {
        let sizes = [c.batch, c.heads, seqlen, c.head_dim];
        let place = place4(c, seqlen, is_q);
        let logical: Vec<f32> = (0..sizes.iter().product::<usize>()).map(|_| rng.normal_in(c.dtype)).collect();
        let mut buf = vec![POISON16; place.len];
        for (x, i) in logical.iter().zip(place.indices(sizes)) {
            buf[i] = c.dtype.encode(*x);
        }
        (logical, buf, place)
    };
    let (q, qb, qp) = mk(rng, c.seqlen_q, true);
    let (k, kb, kp) = mk(rng, c.seqlen_k, false);
    let (v, vb, vp) = mk(rng, c.seqlen_k, false);
    Inputs { logical: [q, k, v], buffers: [qb, kb, vb], places: [qp, kp, vp] }
}

struct Outcome {
    pass: bool,
    line: String,
}

/// Max |a − ref| over all elements (NaN-free inputs assumed; NaNs are counted separately).
fn max_err(a: &[f64], r: &[f64]) -> f64 {
    a.iter().zip(r).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

fn run_case(c: &Case, rng: &mut SplitMix64, stream: sys::CUstream) -> Result<Outcome, String> {
    let dtype = dtype_of(c.dtype);
    let inputs = make_inputs(c, rng);
    let sm_scale = 1.0 / (c.head_dim as f32).sqrt();
    let o_sizes = [c.batch, c.heads, c.seqlen_q, c.head_dim];
    let lse_sizes = [c.batch, c.heads, c.seqlen_q];
    let o_place = place4(c, c.seqlen_q, false);
    let lse_place = place_lse(c);

    // Device side: inputs, poisoned outputs, one launch, copy back, all on `stream`.
    let dev_in: Vec<DevBuf> = inputs.buffers.iter().map(|b| DevBuf::new(b.len() * 2)).collect::<Result<_, _>>()?;
    for (d, h) in dev_in.iter().zip(&inputs.buffers) {
        d.upload(h, stream)?;
    }
    let o_poison = vec![POISON16; o_place.len];
    let lse_poison = vec![POISON32; lse_place.len];
    let dev_o = DevBuf::new(o_place.len * 2)?;
    let dev_lse = DevBuf::new(lse_place.len * 4)?;
    dev_o.upload(&o_poison, stream)?;
    dev_lse.upload(&lse_poison, stream)?;
    let [pq, pk, pv] = &inputs.places;
    let mut params = flash::FwdParams::new(
        view4(&dev_in[0], pq, o_sizes, dtype),
        view4(&dev_in[1], pk, [c.batch, c.heads, c.seqlen_k, c.head_dim], dtype),
        view4(&dev_in[2], pv, [c.batch, c.heads, c.seqlen_k, c.head_dim], dtype),
        view4(&dev_o, &o_place, o_sizes, dtype),
        view3(&dev_lse, &lse_place, lse_sizes),
    );
    params.sm_scale = sm_scale;
    params.causal = c.causal;
    let started = Instant::now();
    let launched = flash::attn_fwd(&params, Stream::from_raw(stream as usize));
    let mut o_bits = vec![0u16; o_place.len];
    let mut lse_bits = vec![0u32; lse_place.len];
    dev_o.download(&mut o_bits, stream)?;
    dev_lse.download(&mut lse_bits, stream)?;
    sync(stream)?;
    let gpu_ms = started.elapsed().as_secs_f64() * 1e3;
    if let Err(e) = launched {
        return Ok(Outcome { pass: false, line: format!("{}  attn_fwd returned {e}  FAIL", c.describe()) });
    }

    // References.
    let problem = reference::Problem {
        dtype: c.dtype,
        batch: c.batch,
        heads: c.heads,
        seqlen_q: c.seqlen_q,
        seqlen_k: c.seqlen_k,
        head_dim: c.head_dim,
        causal: c.causal,
        sm_scale,
        q: &inputs.logical[0],
        k: &inputs.logical[1],
        v: &inputs.logical[2],
    };
    let (exact, naive) = reference::compute(&problem);

    // Gather outputs in logical order; count NaNs (unwritten or broken) and out-of-view writes.
    let o_idx = o_place.indices(o_sizes);
    let lse_idx = lse_place.indices(lse_sizes);
    let o: Vec<f64> = o_idx.iter().map(|&i| c.dtype.decode(o_bits[i]) as f64).collect();
    let lse: Vec<f64> = lse_idx.iter().map(|&i| f32::from_bits(lse_bits[i]) as f64).collect();
    let nan_o = o.iter().filter(|x| x.is_nan()).count();
    let nan_lse = lse.iter().filter(|x| x.is_nan()).count();
    let mut in_view_o = vec![false; o_place.len];
    o_idx.iter().for_each(|&i| in_view_o[i] = true);
    let mut in_view_l = vec![false; lse_place.len];
    lse_idx.iter().for_each(|&i| in_view_l[i] = true);
    let stray = o_bits.iter().zip(&in_view_o).filter(|(b, v)| !**v && **b != POISON16).count()
        + lse_bits.iter().zip(&in_view_l).filter(|(b, v)| !**v && **b != POISON32).count();

    let err_o = max_err(&o, &exact.o);
    let naive_o = max_err(&naive.o, &exact.o);
    let bound_o = 3.0 * naive_o + 1e-3;
    let err_l = max_err(&lse, &exact.lse);
    let naive_l = max_err(&naive.lse, &exact.lse);
    let lse_mag = exact.lse.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    let bound_l = 3.0 * naive_l + 1e-3 * lse_mag;
    let pass = nan_o == 0 && nan_lse == 0 && stray == 0 && err_o <= bound_o && err_l <= bound_l;
    let mut line = format!(
        "{}  O err {:.3e} bound {:.3e}  LSE err {:.3e} bound {:.3e}",
        c.describe(),
        err_o,
        bound_o,
        err_l,
        bound_l
    );
    if nan_o + nan_lse > 0 {
        let _ = write!(line, "  NaN/unwritten O {nan_o} LSE {nan_lse}");
    }
    if stray > 0 {
        let _ = write!(line, "  {stray} writes outside the views");
    }
    let _ = write!(line, "  ({gpu_ms:.1} ms)  {}", if pass { "PASS" } else { "FAIL" });
    Ok(Outcome { pass, line })
}

/// An invalid call on a live device (q null) must fail with NullPointer and launch nothing.
fn null_pointer_case(stream: sys::CUstream) -> Result<Outcome, String> {
    let (b, h, s, d) = (1usize, 2usize, 64usize, 64usize);
    let elems = b * h * s * d;
    let bufs: Vec<DevBuf> = (0..3).map(|_| DevBuf::new(elems * 2)).collect::<Result<_, _>>()?;
    let ones = vec![lowp::f32_to_f16_bits(1.0); elems];
    for buf in &bufs {
        buf.upload(&ones, stream)?;
    }
    let dev_o = DevBuf::new(elems * 2)?;
    let dev_lse = DevBuf::new(b * h * s * 4)?;
    let o_poison = vec![POISON16; elems];
    let lse_poison = vec![POISON32; b * h * s];
    dev_o.upload(&o_poison, stream)?;
    dev_lse.upload(&lse_poison, stream)?;
    let t = |ptr| TensorView::contiguous(ptr, [b as u64, h as u64, s as u64, d as u64], DType::F16);
    let lse = TensorView::contiguous(dev_lse.0, [b as u64, h as u64, s as u64], DType::F32);
    let params = flash::FwdParams::new(t(0), t(bufs[1].0), t(bufs[2].0), t(dev_o.0), lse);
    let got = flash::attn_fwd(&params, Stream::from_raw(stream as usize));
    let mut o_bits = vec![0u16; elems];
    dev_o.download(&mut o_bits, stream)?;
    sync(stream)?;
    let untouched = o_bits.iter().all(|&x| x == POISON16);
    let (pass, what) = match &got {
        Err(e) if e.kind() == ErrorKind::NullPointer && untouched => (true, format!("NullPointer: {}", e.message())),
        Err(e) if e.kind() == ErrorKind::NullPointer => (false, "NullPointer, but O was written".to_string()),
        Err(e) => (false, format!("expected NullPointer, got {e}")),
        Ok(()) => (false, "expected NullPointer, got Ok".to_string()),
    };
    Ok(Outcome { pass, line: format!("invalid call (q null) -> {what}  {}", if pass { "PASS" } else { "FAIL" }) })
}

struct Args {
    log: Option<String>,
    seed: u64,
    require_gpu: bool,
}

fn parse_args() -> Args {
    let mut args = Args { log: None, seed: 0x5EED_A07E, require_gpu: false };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--log" => args.log = it.next(),
            "--seed" => args.seed = it.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| usage()),
            "--require-gpu" => args.require_gpu = true,
            _ => usage(),
        }
    }
    args
}

fn usage() -> ! {
    eprintln!("usage: aotriton-gpu-tests [--log PATH] [--seed N] [--require-gpu]");
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
    let stream = result::stream::create(result::stream::StreamKind::Default)
        .map_err(|e| format!("cuStreamCreate: {e:?}"))?;
    Ok(Some(stream))
}

fn main() {
    let args = parse_args();
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
    let name = result::device::get(0).and_then(result::device::get_name).unwrap_or_default();
    let mut log = String::new();
    let emit = |line: String, log: &mut String| {
        println!("{line}");
        let _ = std::io::stdout().flush();
        log.push_str(&line);
        log.push('\n');
    };
    emit(
        format!("aotriton Rust API GPU test: device 0 = {name}, seed {:#x}, built archs {:?}", args.seed, aotriton::built_archs()),
        &mut log,
    );
    let mut rng = SplitMix64::new(args.seed);
    let (mut passed, mut failed) = (0usize, 0usize);
    let all = cases();
    for (i, c) in all.iter().enumerate() {
        let outcome = run_case(c, &mut rng, stream).unwrap_or_else(|e| Outcome {
            pass: false,
            line: format!("{}  driver error: {e}  FAIL", c.describe()),
        });
        if outcome.pass { passed += 1 } else { failed += 1 }
        emit(format!("[{:2}] {}", i + 1, outcome.line), &mut log);
    }
    let outcome = null_pointer_case(stream)
        .unwrap_or_else(|e| Outcome { pass: false, line: format!("invalid call: driver error: {e}  FAIL") });
    if outcome.pass { passed += 1 } else { failed += 1 }
    emit(format!("[{:2}] {}", all.len() + 1, outcome.line), &mut log);
    emit(format!("rust-api: {passed} passed, {failed} failed"), &mut log);
    if let Some(path) = &args.log
        && let Err(e) = std::fs::write(path, &log)
    {
        eprintln!("cannot write {path}: {e}");
        failed += 1;
    }
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
