//! `--stress concurrency`: 64 threads on 8 non-blocking streams call `attn_fwd` + `attn_bwd` on
//! 16 mixed cases (fp16 and bf16, head dims 64 and 128, no mask, causal of both alignments and
//! windows, MHA / GQA / MQA, odd lengths and Sq = 1, B×H×S×D and B×S×H×D views) on the portable,
//! Gluon and Auto backends. Every thread allocates and uploads its inputs first, then all wait at
//! a barrier in a process that has not called the library yet: the archive read and every
//! kernel's first load race among the callers released together. Each thread runs 4 cases (each
//! case 16 times over all threads, on 4 different streams at once), enqueuing all its calls
//! before it syncs.
//!
//! Each of the 256 results (O, LSE, dQ, dK, dV: whole buffers, their poisoned guards included)
//! must equal, bitwise,
//!   1. the same case run single-threaded in this process afterwards (caches warm), and
//!   2. the same case run by a separate process of this binary started before the concurrent
//!      phase (`--stress concurrency-ref`): single-threaded from its own cold start. A wrong
//!      module or argument plan that a first-load race left in a cache would be reused by (1) and
//!      agree with the concurrent results; (2) never saw a race.
//!
//! and (1) must equal (2). The reference runs must have written every output element (no NaN
//! poison left; LSE +inf only on rows without keys) and nothing outside the views.
//!
//! The Gluon backward with `deterministic: false` adds dQ partials with TMA reduce-adds in no
//! fixed order, so that dQ is not bitwise reproducible. Most Gluon and Auto cases therefore run
//! the backward with `deterministic: true` (Gluon dK/dV, the portable dQ kernel: bitwise
//! reproducible); four cases keep `deterministic: false`, so the reduce-add path and its dQ
//! conversion kernel take part in the first-load race too: their dQ must be within max|dQ|/128
//! of the reference element by element (one bf16 rounding step at the tensor's scale; a lost or
//! doubled partial moves elements much further), everything else bitwise.
//!
//! The workspace of the Gluon backward is sized from its documented formula, not with
//! `attn_bwd_workspace_bytes`: that query reads the archive and would warm the caches before
//! the barrier. The single-threaded phase checks the query against what was allocated.
use std::io::{BufReader, BufWriter, Read, Write as _};
use std::sync::Barrier;

use aotriton::flash::Backend;

use super::stress::{Log, Tally, download_into, nonblocking_stream, poison, upload};
use super::*;

const THREADS: usize = 64;
const STREAMS: usize = 8;
/// Cases run by each thread (each case: THREADS · PER_THREAD / CASES.len() = 16 instances).
const PER_THREAD: usize = 4;

#[derive(Debug, Clone, Copy)]
struct CCase {
    dtype: Lowp,
    d: usize,
    b: usize,
    hq: usize,
    hk: usize,
    sq: usize,
    sk: usize,
    mask: MaskSpec,
    /// B×S×H×D memory viewed as B×H×S×D (else contiguous B×H×S×D).
    bshd: bool,
    backend: Backend,
    deterministic: bool,
}

#[allow(clippy::too_many_arguments)]
const fn cc(
    dtype: Lowp,
    d: usize,
    b: usize,
    hq: usize,
    hk: usize,
    sq: usize,
    sk: usize,
    mask: MaskSpec,
    bshd: bool,
    backend: Backend,
    deterministic: bool,
) -> CCase {
    CCase { dtype, d, b, hq, hk, sq, sk, mask, bshd, backend, deterministic }
}

const NONE: MaskSpec = m(-1, -1, false);
const CAUSAL_TL: MaskSpec = m(-1, 0, false);
const CAUSAL_BR: MaskSpec = m(-1, 0, true);

/// 6 portable, 6 Gluon, 4 Auto cases; `deterministic: false` on 2 Gluon and 2 Auto cases.
const CASES: [CCase; 16] = {
    use Backend::{Auto, Gluon, Portable};
    use Lowp::{BF16, F16};
    let (t, f) = (true, false);
    [
        cc(BF16, 128, 2, 8, 2, 1000, 1000, CAUSAL_TL, f, Gluon, t),
        cc(F16, 64, 1, 4, 4, 513, 777, NONE, f, Portable, f),
        cc(BF16, 64, 1, 6, 2, 251, 1021, CAUSAL_BR, f, Auto, f),
        cc(F16, 128, 1, 4, 1, 1021, 509, m(64, 0, false), f, Gluon, f),
        cc(BF16, 128, 1, 8, 8, 97, 2048, NONE, f, Portable, f),
        cc(F16, 64, 3, 2, 1, 333, 333, CAUSAL_TL, f, Auto, t),
        cc(BF16, 64, 1, 16, 2, 1, 1021, NONE, f, Gluon, t),
        // Rows without keys (window BR with Sq > Sk): O = 0, LSE = +inf there.
        cc(F16, 128, 2, 2, 2, 1021, 13, m(16, 5, true), f, Portable, f),
        cc(BF16, 128, 1, 4, 2, 640, 640, CAUSAL_BR, f, Gluon, f),
        cc(F16, 64, 1, 8, 4, 129, 4099, NONE, f, Auto, f),
        cc(BF16, 64, 1, 4, 4, 1500, 1500, m(128, 128, false), f, Portable, f),
        cc(F16, 128, 1, 12, 3, 257, 257, CAUSAL_TL, f, Gluon, t),
        cc(BF16, 128, 1, 2, 1, 2000, 3001, CAUSAL_BR, f, Auto, t),
        cc(F16, 64, 2, 4, 2, 61, 61, NONE, t, Portable, f),
        cc(BF16, 128, 1, 8, 2, 777, 513, NONE, t, Gluon, t),
        cc(F16, 128, 1, 8, 8, 1024, 1024, m(200, 31, false), t, Portable, f),
    ]
};

/// The case thread `t` runs in its `j`-th turn: the 4 threads 4k..4k+3 start on the same case,
/// on 4 different streams.
fn case_of(t: usize, j: usize) -> usize {
    (t / 4 + 5 * j) % CASES.len()
}

impl CCase {
    fn exact_dq(&self) -> bool {
        self.backend == Backend::Portable || self.deterministic
    }
    /// The Gluon backward's workspace (`attn_bwd_workspace_bytes`' documented formula, its dQ
    /// accumulator counted even where dQ has its own kernel: an upper bound there):
    /// B·Hq·SQ_PAD·(HEAD_DIM + 2)·4, SQ_PAD = Sq rounded up to 128, HEAD_DIM the bucket (64 or 128).
    fn workspace_bytes(&self) -> usize {
        if self.backend == Backend::Portable {
            return 0;
        }
        let bucket = if self.d <= 64 { 64 } else { 128 };
        self.b * self.hq * self.sq.div_ceil(128) * 128 * (bucket + 2) * 4
    }
    fn place(&self, h: usize, s: usize) -> Placement<4> {
        let (b, d) = (self.b, self.d);
        let strides = if self.bshd { [s * h * d, d, h * d, 1] } else { [h * s * d, s * d, d, 1] };
        Placement::new([b, h, s, d], strides, 0)
    }
    fn rows(&self) -> Placement<3> {
        Placement::new([self.b, self.hq, self.sq], [self.hq * self.sq, self.sq, 1], 0)
    }
    fn describe(&self) -> String {
        let kind = if self.hk == 1 && self.hq > 1 {
            "MQA"
        } else if self.hq > self.hk {
            "GQA"
        } else {
            "MHA"
        };
        format!(
            "{} D={} {kind} B={} Hq={} Hk={} Sq={} Sk={} mask={} {} {}{}",
            self.dtype.name(),
            self.d,
            self.b,
            self.hq,
            self.hk,
            self.sq,
            self.sk,
            mask_name(&self.mask),
            if self.bshd { "bshd" } else { "bhsd" },
            backend::name(self.backend),
            if self.backend == Backend::Portable {
                ""
            } else if self.deterministic {
                " det"
            } else {
                " nondet"
            }
        )
    }
    /// Host bytes of one result; device bytes of one instance (all buffers).
    fn bytes(&self) -> (usize, usize) {
        let (q, kv, rows) = (self.place(self.hq, self.sq).len, self.place(self.hk, self.sk).len, self.rows().len);
        let result = (2 * q + 2 * kv) * 2 + rows * 4;
        (result, result + (q + 2 * kv) * 2 + rows * 4 + self.workspace_bytes())
    }
}

/// Host images of a case's input buffers (values inside the views, NaN poison around them).
struct Inputs {
    q: Vec<u16>,
    k: Vec<u16>,
    v: Vec<u16>,
    d_o: Vec<u16>,
}

fn inputs(c: &CCase, index: usize, seed: u64) -> Inputs {
    let mut rng = SplitMix64::new(seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut image = |place: Placement<4>| {
        let mut host = vec![POISON16; place.len];
        for i in place.indices() {
            host[i] = c.dtype.encode(rng.normal_in(c.dtype));
        }
        host
    };
    Inputs {
        q: image(c.place(c.hq, c.sq)),
        k: image(c.place(c.hk, c.sk)),
        v: image(c.place(c.hk, c.sk)),
        d_o: image(c.place(c.hq, c.sq)),
    }
}

/// One run's outputs, whole buffers.
#[derive(Clone, PartialEq)]
struct Results {
    o: Vec<u16>,
    lse: Vec<u32>,
    dq: Vec<u16>,
    dk: Vec<u16>,
    dv: Vec<u16>,
}

/// The device buffers of one run of a case.
struct Instance {
    case: CCase,
    q: DevBuf,
    k: DevBuf,
    v: DevBuf,
    d_o: DevBuf,
    o: DevBuf,
    lse: DevBuf,
    delta: DevBuf,
    dq: DevBuf,
    dk: DevBuf,
    dv: DevBuf,
    workspace: Option<DevBuf>,
}

impl Instance {
    /// Allocates, uploads the inputs and poisons every output (queued on `stream`).
    fn new(c: &CCase, inputs: &Inputs, stream: sys::CUstream) -> Result<Self, String> {
        let (q_len, kv_len, rows_len) = (c.place(c.hq, c.sq).len, c.place(c.hk, c.sk).len, c.rows().len);
        let input = |host: &[u16]| -> Result<DevBuf, String> {
            let buf = DevBuf::new(host.len() * 2)?;
            upload(buf.0, host, stream)?;
            Ok(buf)
        };
        let output = |bytes: usize| -> Result<DevBuf, String> {
            let buf = DevBuf::new(bytes)?;
            poison(buf.0, bytes, stream)?;
            Ok(buf)
        };
        let ws = c.workspace_bytes();
        Ok(Instance {
            case: *c,
            q: input(&inputs.q)?,
            k: input(&inputs.k)?,
            v: input(&inputs.v)?,
            d_o: input(&inputs.d_o)?,
            o: output(q_len * 2)?,
            lse: output(rows_len * 4)?,
            delta: output(rows_len * 4)?,
            dq: output(q_len * 2)?,
            dk: output(kv_len * 2)?,
            dv: output(kv_len * 2)?,
            workspace: if ws > 0 { Some(output(ws)?) } else { None },
        })
    }
    fn view4(&self, buf: &DevBuf, h: usize, s: usize) -> TensorView<4> {
        let p = self.case.place(h, s);
        TensorView::new(buf.0, p.sizes.map(|n| n as u64), p.strides.map(|n| n as i64), dtype_of(self.case.dtype))
    }
    fn rows_view(&self, buf: &DevBuf) -> TensorView<3> {
        let c = &self.case;
        TensorView::contiguous(buf.0, [c.b as u64, c.hq as u64, c.sq as u64], DType::F32)
    }
    fn bwd_params(&self) -> flash::BwdParams<'static> {
        let c = &self.case;
        let (q4, kv4) = (|b| self.view4(b, c.hq, c.sq), |b| self.view4(b, c.hk, c.sk));
        let mut p = flash::BwdParams::new(
            q4(&self.q),
            kv4(&self.k),
            kv4(&self.v),
            q4(&self.o),
            q4(&self.d_o),
            self.rows_view(&self.lse),
            self.rows_view(&self.delta),
            q4(&self.dq),
            kv4(&self.dk),
            kv4(&self.dv),
        );
        p.sm_scale = 1.0 / (c.d as f32).sqrt();
        p.mask = api_mask(&c.mask);
        p.backend = c.backend;
        p.deterministic = c.deterministic;
        p.workspace = self.workspace.as_ref().map(|w| flash::Workspace { ptr: w.0, bytes: c.workspace_bytes() as u64 });
        p
    }
    /// Enqueues the forward, then the backward.
    fn launch(&self, stream: sys::CUstream) -> Result<(), String> {
        self.fwd(stream)?;
        self.bwd(stream)
    }
    fn fwd(&self, stream: sys::CUstream) -> Result<(), String> {
        let c = &self.case;
        let s = Stream::cuda(stream as usize);
        let mut p = flash::FwdParams::new(
            self.view4(&self.q, c.hq, c.sq),
            self.view4(&self.k, c.hk, c.sk),
            self.view4(&self.v, c.hk, c.sk),
            self.view4(&self.o, c.hq, c.sq),
            Some(self.rows_view(&self.lse)),
        );
        p.sm_scale = 1.0 / (c.d as f32).sqrt();
        p.mask = api_mask(&c.mask);
        p.backend = c.backend;
        flash::attn_fwd(&p, s).map_err(|e| format!("attn_fwd: {e}"))
    }
    fn bwd(&self, stream: sys::CUstream) -> Result<(), String> {
        flash::attn_bwd(&self.bwd_params(), Stream::cuda(stream as usize)).map_err(|e| format!("attn_bwd: {e}"))
    }
    /// Queues the copies of every output; the vectors hold them after the stream is synced.
    fn download(&self, stream: sys::CUstream) -> Result<Results, String> {
        let c = &self.case;
        let (q_len, kv_len, rows_len) = (c.place(c.hq, c.sq).len, c.place(c.hk, c.sk).len, c.rows().len);
        let mut r = Results {
            o: vec![0; q_len],
            lse: vec![0; rows_len],
            dq: vec![0; q_len],
            dk: vec![0; kv_len],
            dv: vec![0; kv_len],
        };
        download_into(&mut r.o, self.o.0, stream)?;
        download_into(&mut r.lse, self.lse.0, stream)?;
        download_into(&mut r.dq, self.dq.0, stream)?;
        download_into(&mut r.dk, self.dk.0, stream)?;
        download_into(&mut r.dv, self.dv.0, stream)?;
        Ok(r)
    }
}

/// Runs every case once on `stream`, one after the other (the single-threaded runs).
fn run_sequential(all_inputs: &[Inputs], stream: sys::CUstream) -> Vec<Result<Results, String>> {
    CASES
        .iter()
        .zip(all_inputs)
        .map(|(c, inputs)| {
            let inst = Instance::new(c, inputs, stream)?;
            inst.launch(stream)?;
            let r = inst.download(stream)?;
            sync(stream)?;
            Ok(r)
        })
        .collect()
}

/// How `got` differs from `want`, if it does: bitwise for everything but a non-deterministic
/// Gluon dQ, which must be within max|want dQ|/128 everywhere (guards bitwise: both poison).
/// Also returns the largest dQ difference seen.
fn differs(c: &CCase, got: &Results, want: &Results) -> (Option<String>, f32) {
    let mut what = Vec::new();
    for (name, same) in [
        ("O", got.o == want.o),
        ("LSE", got.lse == want.lse),
        ("dK", got.dk == want.dk),
        ("dV", got.dv == want.dv),
    ] {
        if !same {
            what.push(name.to_string());
        }
    }
    let mut worst = 0f32;
    if c.exact_dq() {
        if got.dq != want.dq {
            what.push("dQ".into());
        }
    } else {
        let t = c.dtype;
        let scale = want
            .dq
            .iter()
            .filter(|&&x| !stress::is_nan16(t, x))
            .map(|&x| t.decode(x).abs())
            .fold(0f32, f32::max);
        let tol = scale / 128.0;
        let mut far = 0usize;
        for (&x, &y) in got.dq.iter().zip(&want.dq) {
            if x == y {
                continue;
            }
            let diff = (t.decode(x) - t.decode(y)).abs(); // NaN when either is
            if diff.is_nan() || diff > tol {
                far += 1;
            }
            if !diff.is_nan() {
                worst = worst.max(diff);
            }
        }
        if far > 0 {
            what.push(format!("dQ ({far} elements beyond {tol:.2e})"));
        }
    }
    ((!what.is_empty()).then(|| what.join(", ")), worst)
}

/// What is wrong with a reference run by itself: poison left inside the views (NaN; LSE may be
/// +inf on rows without keys), or writes outside them.
fn problems(c: &CCase, r: &Results) -> Vec<String> {
    let mut out = Vec::new();
    let t = c.dtype;
    let check16 = |name: &str, bits: &[u16], place: Placement<4>, out: &mut Vec<String>| {
        let mut inside = vec![false; place.len];
        let (mut nan, mut stray) = (0, 0);
        for i in place.indices() {
            inside[i] = true;
            nan += stress::is_nan16(t, bits[i]) as usize;
        }
        for (i, &x) in bits.iter().enumerate() {
            stray += (!inside[i] && x != POISON16) as usize;
        }
        if nan > 0 {
            out.push(format!("{name}: {nan} NaN"));
        }
        if stray > 0 {
            out.push(format!("{name}: {stray} writes outside the view"));
        }
    };
    check16("O", &r.o, c.place(c.hq, c.sq), &mut out);
    check16("dQ", &r.dq, c.place(c.hq, c.sq), &mut out);
    check16("dK", &r.dk, c.place(c.hk, c.sk), &mut out);
    check16("dV", &r.dv, c.place(c.hk, c.sk), &mut out);
    let rows = c.rows();
    let n = rows.len - GUARD;
    let nan = r.lse[..n].iter().filter(|&&x| f32::from_bits(x).is_nan()).count();
    let stray = r.lse[n..].iter().filter(|&&x| x != POISON32).count();
    if nan > 0 {
        out.push(format!("LSE: {nan} NaN"));
    }
    if stray > 0 {
        out.push(format!("LSE: {stray} writes past the end"));
    }
    out
}

/// What one thread saw.
struct ThreadRun {
    /// (case index, results or the error of its calls)
    runs: Vec<(usize, Result<Results, String>)>,
    /// From the barrier to the return of the first forward, and of the first backward.
    first_fwd: Option<f64>,
    first_bwd: Option<f64>,
}

/// One of the 64 threads: set up, wait at the barrier, enqueue every call, sync, download.
fn worker(t: usize, ctx: usize, stream: usize, all_inputs: &[Inputs], barrier: &Barrier) -> ThreadRun {
    let stream = stream as sys::CUstream;
    let cases: Vec<usize> = (0..PER_THREAD).map(|j| case_of(t, j)).collect();
    let mut run = ThreadRun { runs: Vec::new(), first_fwd: None, first_bwd: None };
    // Setup errors are reported only after the barrier: every thread must reach it.
    let setup: Result<Vec<Instance>, String> = unsafe { result::ctx::set_current(ctx as sys::CUcontext) }
        .map_err(|e| format!("cuCtxSetCurrent: {e:?}"))
        .and_then(|()| {
            let made = cases.iter().map(|&i| Instance::new(&CASES[i], &all_inputs[i], stream)).collect();
            sync(stream)?;
            made
        });
    barrier.wait();
    let started = Instant::now();
    let instances = match setup {
        Ok(instances) => instances,
        Err(e) => {
            run.runs = cases.iter().map(|&i| (i, Err(format!("thread {t} setup: {e}")))).collect();
            return run;
        }
    };
    let mut launched = Vec::new();
    for inst in &instances {
        let fwd = inst.fwd(stream);
        if run.first_fwd.is_none() {
            run.first_fwd = Some(started.elapsed().as_secs_f64());
        }
        let result = fwd.and_then(|()| inst.bwd(stream));
        if run.first_bwd.is_none() {
            run.first_bwd = Some(started.elapsed().as_secs_f64());
        }
        launched.push(result);
    }
    let downloads: Vec<Result<Results, String>> = instances
        .iter()
        .zip(launched)
        .map(|(inst, launched)| launched.and_then(|()| inst.download(stream)))
        .collect();
    let synced = sync(stream);
    run.runs = cases
        .iter()
        .zip(downloads)
        .map(|(&i, r)| (i, r.and_then(|r| synced.clone().map(|()| r))))
        .collect();
    run
}

/// The parent process: starts the cold reference process, then the concurrent phase, then the
/// single-threaded phase, and compares.
pub(crate) fn run(args: &Args, log: &mut Log, tally: &mut Tally) -> Result<(), String> {
    run_on(args, log, tally, 1)
}

/// `--stress multi-device` (issue 21): the same phases with the threads spread over `devices`
/// GPUs of one process (thread t on device t mod `devices`, its streams made in that device's
/// primary context), so the first loads race on every device at once; every instance must equal
/// the single-device references bitwise as above, and each device's module cache must hold the
/// same number of kernels (one load per kernel per device: `aotriton::diagnostics::kernels_loaded`).
pub(crate) fn run_multi_device(args: &Args, log: &mut Log, tally: &mut Tally) -> Result<(), String> {
    let count = result::device::get_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))? as usize;
    if count < 2 {
        log.line(format!("skipped: multi-device needs two GPUs, this machine has {count}"));
        return Ok(());
    }
    run_on(args, log, tally, 2)?;
    let loads: Vec<u64> = (0..2).map(|d| aotriton::diagnostics::kernels_loaded(aotriton::Runtime::Cuda, d)).collect();
    tally.record(
        log,
        loads[0] > 0 && loads[0] == loads[1],
        format!("module cache: kernels loaded on device 0 / 1: {} / {} (each kernel once per device)", loads[0], loads[1]),
    );
    Ok(())
}

fn run_on(args: &Args, log: &mut Log, tally: &mut Tally, devices: usize) -> Result<(), String> {
    let (mut host_bytes, mut device_bytes) = (0, 0);
    for c in &CASES {
        let (h, d) = c.bytes();
        host_bytes += h * THREADS * PER_THREAD / CASES.len();
        device_bytes += d * THREADS * PER_THREAD / CASES.len();
    }
    log.line(format!(
        "{THREADS} threads on {STREAMS} non-blocking streams, {PER_THREAD} cases each, released by one barrier \
         before any library call (cold caches); {} cases x {} instances; {:.2} GiB on the device, {:.2} GiB of \
         results on the host",
        CASES.len(),
        THREADS * PER_THREAD / CASES.len(),
        stress::gib(device_bytes),
        stress::gib(host_bytes)
    ));
    for (i, c) in CASES.iter().enumerate() {
        log.line(format!("  case {i:2}: {}", c.describe()));
    }
    let started = Instant::now();
    let all_inputs: Vec<Inputs> = CASES.iter().enumerate().map(|(i, c)| inputs(c, i, args.seed)).collect();
    log.line(format!("inputs generated in {:.1} s", started.elapsed().as_secs_f64()));

    // 1. The cold single-threaded reference process.
    let started = Instant::now();
    let cold = cold_reference(args, log);
    log.line(format!("cold single-threaded process: {:.1} s", started.elapsed().as_secs_f64()));
    let cold = match cold {
        Ok(cold) => cold,
        Err(e) => {
            tally.record(log, false, format!("cold single-threaded reference process: {e}"));
            return Ok(());
        }
    };

    // 2. The concurrent phase: nothing of the library has run in this process yet. Device 0's
    // context is current (open_device); the others' primary contexts are retained here, each
    // with its own streams, and device 0's is made current again afterwards.
    let ctx0 = result::ctx::get_current()
        .map_err(|e| format!("cuCtxGetCurrent: {e:?}"))?
        .ok_or("no current context")?;
    let mut contexts = vec![ctx0 as usize];
    for d in 1..devices {
        let dev = result::device::get(d as i32).map_err(|e| format!("cuDeviceGet({d}): {e:?}"))?;
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(|e| format!("cuDevicePrimaryCtxRetain({d}): {e:?}"))?;
        contexts.push(ctx as usize);
    }
    let mut device_streams: Vec<Vec<usize>> = Vec::new();
    for &ctx in &contexts {
        unsafe { result::ctx::set_current(ctx as sys::CUcontext) }.map_err(|e| format!("cuCtxSetCurrent: {e:?}"))?;
        device_streams.push((0..STREAMS).map(|_| nonblocking_stream().map(|s| s as usize)).collect::<Result<_, _>>()?);
    }
    unsafe { result::ctx::set_current(ctx0) }.map_err(|e| format!("cuCtxSetCurrent: {e:?}"))?;
    let streams = device_streams[0].clone();
    let barrier = Barrier::new(THREADS);
    let started = Instant::now();
    let threads: Vec<ThreadRun> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let device = t % devices;
                let (inputs, barrier) = (&all_inputs, &barrier);
                let (ctx, stream) = (contexts[device], device_streams[device][(t / devices) % STREAMS]);
                s.spawn(move || worker(t, ctx, stream, inputs, barrier))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a worker thread panicked")).collect()
    });
    let concurrent_s = started.elapsed().as_secs_f64();
    // When each thread's first forward, and its first backward, returned after the barrier: how
    // long the first callers waited for the archive read and the first loads (reported, not checked).
    let spread = |times: Vec<f64>| {
        let mut times: Vec<f64> = times.into_iter().map(|x| x * 1e3).collect();
        times.sort_by(f64::total_cmp);
        let at = |q: f64| times.get(((times.len().max(1) - 1) as f64 * q) as usize).copied().unwrap_or(f64::NAN);
        format!("min {:.0} / median {:.0} / max {:.0} ms", at(0.0), at(0.5), at(1.0))
    };
    log.line(format!(
        "concurrent phase: {concurrent_s:.1} s (setup included); after the barrier the first attn_fwd of each \
         thread returned at {}, its first attn_bwd at {}",
        spread(threads.iter().filter_map(|t| t.first_fwd).collect()),
        spread(threads.iter().filter_map(|t| t.first_bwd).collect())
    ));

    // 3. The single-threaded phase in this process (warm).
    let stream = streams[0] as sys::CUstream;
    let warm = run_sequential(&all_inputs, stream);
    let mut ws_notes = Vec::new();
    for (i, c) in CASES.iter().enumerate() {
        ws_notes.push(workspace_check(c, &all_inputs[i], stream));
    }

    // 4. Compare, per case.
    let mut concurrent: Vec<Vec<&Result<Results, String>>> = vec![Vec::new(); CASES.len()];
    for t in &threads {
        for (i, r) in &t.runs {
            concurrent[*i].push(r);
        }
    }
    for (i, c) in CASES.iter().enumerate() {
        let mut faults = Vec::new();
        let warm = match &warm[i] {
            Ok(r) => Some(r),
            Err(e) => {
                faults.push(format!("warm single-threaded run: {e}"));
                None
            }
        };
        let cold = &cold[i];
        faults.extend(problems(c, cold).into_iter().map(|p| format!("cold run: {p}")));
        let mut worst = 0f32;
        if let Some(warm) = warm {
            faults.extend(problems(c, warm).into_iter().map(|p| format!("warm run: {p}")));
            let (d, w) = differs(c, warm, cold);
            worst = worst.max(w);
            if let Some(d) = d {
                faults.push(format!("warm run differs from the cold process in {d}"));
            }
        }
        let (mut same_warm, mut same_cold) = (0, 0);
        for (n, r) in concurrent[i].iter().enumerate() {
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    faults.push(format!("instance {n}: {e}"));
                    continue;
                }
            };
            if let Some(warm) = warm {
                let (d, w) = differs(c, r, warm);
                worst = worst.max(w);
                match d {
                    None => same_warm += 1,
                    Some(d) => faults.push(format!("instance {n} differs from the warm run in {d}")),
                }
            }
            let (d, w) = differs(c, r, cold);
            worst = worst.max(w);
            match d {
                None => same_cold += 1,
                Some(d) => faults.push(format!("instance {n} differs from the cold process in {d}")),
            }
        }
        if let Err(e) = &ws_notes[i] {
            faults.push(e.clone());
        }
        let total = concurrent[i].len();
        let mut line = format!(
            "case {i:2} {}: {same_warm}/{total} concurrent = warm 1-thread run, \
             {same_cold}/{total} = cold 1-thread process",
            c.describe()
        );
        if !c.exact_dq() {
            let _ = write!(line, "; dQ within max|dQ|/128 (largest difference {worst:.2e})");
        }
        if let Ok(Some(note)) = &ws_notes[i] {
            let _ = write!(line, "; {note}");
        }
        faults.truncate(6);
        for f in &faults {
            let _ = write!(line, "; {f}!");
        }
        tally.record(log, faults.is_empty() && same_warm == total && same_cold == total && total > 0, line);
    }
    Ok(())
}

/// `attn_bwd_workspace_bytes` must not ask for more than the formula allocated. For an Auto case
/// it also tells whether the Gluon backward served it (a note).
fn workspace_check(c: &CCase, inputs: &Inputs, stream: sys::CUstream) -> Result<Option<String>, String> {
    if c.backend == Backend::Portable {
        return Ok(None);
    }
    let inst = Instance::new(c, inputs, stream)?;
    let asked = flash::attn_bwd_workspace_bytes(&inst.bwd_params(), Stream::cuda(stream as usize))
        .map_err(|e| format!("attn_bwd_workspace_bytes: {e}"))? as usize;
    if asked > c.workspace_bytes() {
        return Err(format!("attn_bwd_workspace_bytes {asked} > {} allocated", c.workspace_bytes()));
    }
    Ok((c.backend == Backend::Auto).then(|| {
        if asked > 0 { "auto: Gluon backward".to_string() } else { "auto: portable backward".to_string() }
    }))
}

/// Starts `--stress concurrency-ref` and reads what it wrote.
fn cold_reference(args: &Args, log: &mut Log) -> Result<Vec<Results>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let path = std::env::temp_dir().join(format!("aotriton-concurrency-ref-{}.bin", std::process::id()));
    let out = std::process::Command::new(&exe)
        .args(["--stress", "concurrency-ref", "--seed", &args.seed.to_string(), "--log"])
        .arg(&path)
        .output()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    for line in String::from_utf8_lossy(&out.stdout).lines().chain(String::from_utf8_lossy(&out.stderr).lines()) {
        log.line(format!("  [cold process] {line}"));
    }
    let read = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display())).and_then(read_results);
    let _ = std::fs::remove_file(&path);
    if !out.status.success() {
        return Err(format!("exited with {}", out.status));
    }
    read
}

/// `--stress concurrency-ref --log PATH`: the cases single-threaded from a cold start; writes
/// their results to PATH (not a log: the parent passes a temporary file).
pub(crate) fn reference_process(args: &Args) -> i32 {
    let Some(path) = &args.log else {
        eprintln!("concurrency-ref needs --log PATH (where the results go)");
        return 2;
    };
    let stream = match open_device() {
        Ok(Some(_)) => match nonblocking_stream() {
            Ok(s) => s,
            Err(e) => {
                println!("{e}");
                return 1;
            }
        },
        Ok(None) => {
            println!("no GPU");
            return 1;
        }
        Err(e) => {
            println!("setup failed: {e}");
            return 1;
        }
    };
    let all_inputs: Vec<Inputs> = CASES.iter().enumerate().map(|(i, c)| inputs(c, i, args.seed)).collect();
    let started = Instant::now();
    let runs = run_sequential(&all_inputs, stream);
    println!(
        "{} cases run one after the other in {:.1} s (kernel loads included)",
        CASES.len(),
        started.elapsed().as_secs_f64()
    );
    let mut all = Vec::new();
    for (i, r) in runs.into_iter().enumerate() {
        match r {
            Ok(r) => all.push(r),
            Err(e) => {
                println!("case {i}: {e}");
                return 1;
            }
        }
    }
    let written = std::fs::File::create(path).map_err(|e| e.to_string()).and_then(|f| write_results(f, &all));
    if let Err(e) = written {
        println!("cannot write {path}: {e}");
        return 1;
    }
    0
}

/// The results file: per case, O, LSE, dQ, dK, dV, each as an element count (u64 LE) and the
/// elements (LE).
fn write_results(file: std::fs::File, all: &[Results]) -> Result<(), String> {
    let mut w = BufWriter::new(file);
    let mut put = |bytes: &[u8]| w.write_all(bytes).map_err(|e| e.to_string());
    for r in all {
        for t in [&r.o, &r.dq, &r.dk, &r.dv] {
            put(&(t.len() as u64).to_le_bytes())?;
            put(&t.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
        }
        put(&(r.lse.len() as u64).to_le_bytes())?;
        put(&r.lse.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
    }
    w.flush().map_err(|e| e.to_string())
}

fn read_results(file: std::fs::File) -> Result<Vec<Results>, String> {
    let mut r = BufReader::new(file);
    let mut take = |n: usize| -> Result<Vec<u8>, String> {
        let mut buf = vec![0u8; n];
        r.read_exact(&mut buf).map_err(|e| format!("results file: {e}"))?;
        Ok(buf)
    };
    let mut all = Vec::new();
    for c in &CASES {
        let (q_len, kv_len, rows_len) = (c.place(c.hq, c.sq).len, c.place(c.hk, c.sk).len, c.rows().len);
        let mut array = |want: usize, size: usize| -> Result<Vec<u8>, String> {
            let n = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes")) as usize;
            if n != want {
                return Err(format!("results file: {n} elements where {want} were expected"));
            }
            take(n * size)
        };
        let u16s = |b: Vec<u8>| b.chunks_exact(2).map(|x| u16::from_le_bytes([x[0], x[1]])).collect::<Vec<u16>>();
        let o = u16s(array(q_len, 2)?);
        let dq = u16s(array(q_len, 2)?);
        let dk = u16s(array(kv_len, 2)?);
        let dv = u16s(array(kv_len, 2)?);
        let lse = array(rows_len, 4)?
            .chunks_exact(4)
            .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
            .collect();
        all.push(Results { o, lse, dq, dk, dv });
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every case runs 16 times, 4 threads start on each case on 4 different streams, and the
    /// whole phase fits easily on the device and the host.
    #[test]
    fn schedule_and_sizes() {
        let mut runs = vec![0; CASES.len()];
        for t in 0..THREADS {
            for j in 0..PER_THREAD {
                runs[case_of(t, j)] += 1;
            }
        }
        assert!(runs.iter().all(|&n| n == THREADS * PER_THREAD / CASES.len()), "{runs:?}");
        for k in 0..THREADS / 4 {
            let streams: std::collections::BTreeSet<usize> = (4 * k..4 * k + 4).map(|t| t % STREAMS).collect();
            assert_eq!(streams.len(), 4);
            assert!((4 * k..4 * k + 4).all(|t| case_of(t, 0) == k));
        }
        let (mut host, mut device) = (0, 0);
        for c in &CASES {
            assert!(c.hq % c.hk == 0 && (c.d == 64 || c.d == 128));
            let (h, d) = c.bytes();
            host += h * 16;
            device += d * 16;
        }
        assert!(host < 2 << 30 && device < 4 << 30, "host {host}, device {device}");
        // Every backend, both dtypes, and both backward modes of the Gluon path are there.
        for b in [Backend::Portable, Backend::Gluon, Backend::Auto] {
            assert!(CASES.iter().filter(|c| c.backend == b).count() >= 4);
        }
        for b in [Backend::Gluon, Backend::Auto] {
            assert!(CASES.iter().any(|c| c.backend == b && !c.deterministic));
            assert!(CASES.iter().any(|c| c.backend == b && c.deterministic));
        }
    }

    #[test]
    fn results_file_round_trip() {
        let all: Vec<Results> = CASES
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let (q_len, kv_len, rows_len) = (c.place(c.hq, c.sq).len, c.place(c.hk, c.sk).len, c.rows().len);
                let fill16 = |n: usize, k: usize| (0..n).map(|x| (x * 31 + k + i) as u16).collect::<Vec<u16>>();
                Results {
                    o: fill16(q_len, 1),
                    lse: (0..rows_len).map(|x| (x * 7 + i) as u32 | 0x8000_0000).collect(),
                    dq: fill16(q_len, 2),
                    dk: fill16(kv_len, 3),
                    dv: fill16(kv_len, 4),
                }
            })
            .collect();
        let path = std::env::temp_dir().join(format!("aotriton-results-test-{}.bin", std::process::id()));
        write_results(std::fs::File::create(&path).unwrap(), &all).unwrap();
        let back = read_results(std::fs::File::open(&path).unwrap()).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(back == all);
    }

    /// The dQ rule of the non-deterministic cases: bitwise elsewhere, NaN never passes.
    #[test]
    fn dq_tolerance() {
        let c = CASES.iter().find(|c| !c.exact_dq()).copied().unwrap();
        let t = c.dtype;
        let base = Results {
            o: vec![1; 4],
            lse: vec![2; 4],
            dq: [1.0f32, -2.0, 0.5, 0.0].map(|x| t.encode(x)).to_vec(),
            dk: vec![3; 4],
            dv: vec![4; 4],
        };
        let mut near = base.clone();
        near.dq[1] = t.encode(-2.0 + 1.0 / 128.0);
        assert!(differs(&c, &near, &base).0.is_none());
        let mut far = base.clone();
        far.dq[0] = t.encode(1.0 + 2.0 / 64.0);
        assert!(differs(&c, &far, &base).0.is_some());
        let mut nan = base.clone();
        nan.dq[2] = POISON16;
        assert!(differs(&c, &nan, &base).0.is_some());
        let mut lse = base.clone();
        lse.lse[0] = 3;
        assert!(differs(&c, &lse, &base).0.unwrap().contains("LSE"));
        let exact = CASES.iter().find(|c| c.exact_dq()).copied().unwrap();
        assert!(differs(&exact, &near, &base).0.unwrap().contains("dQ"));
    }
}
