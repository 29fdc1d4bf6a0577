//! `--stress large`: `attn_fwd` + `attn_bwd` on tensors of more than 2^32 elements (B·H·S·D),
//! on each backend (`--backend` picks one; default portable, then Gluon), checked
//!
//! * on slices against the float64 reference (reference.rs, the main suite's bounds): whole GQA
//!   groups (their query heads' O, LSE, dQ and their K/V head's dK, dV, every row), chosen where
//!   32-bit offsets would wrap: the heads around element 2^31 and 2^32 and the last one (B×H×S×D),
//!   or the heads whose last rows lie past 2^31 and 2^32 (B×S×H×D, where the row stride H·D is
//!   large);
//! * in full for what the slices cannot see: no output element left NaN (every buffer is
//!   poisoned before each backend's run; LSE must be finite, no row here is without keys), and
//!   the poisoned guards before and after every buffer untouched.
//!
//! The kernels offset rows within a head in int32, and validation refuses a row stride × rows
//! past 2^31 − 1 with `TooLarge` (flash/mod.rs `check_rows`). The second case sits just under
//! that limit (its last row offset is 2^31 − 32641); the third is past it (rows up to 4.3e9
//! elements apart): it passes either refused with `TooLarge` by both calls and every output left
//! untouched (full scan), or run and correct like the others, should the limit be lifted.
//!
//! Inputs are a counter-based hash of each element's index (uniform in [-2, 2), rounded to the
//! dtype), so the host regenerates any slice without keeping 8 GiB copies. The reference runs in
//! a host thread while the GPU works. About 87 GB of device memory at most (the Gluon backward's
//! workspace included).
use super::stress::{Log, Tally, download_into, gib, poison, upload};
use super::*;

struct LCase {
    dtype: Lowp,
    b: usize,
    hq: usize,
    hk: usize,
    sq: usize,
    sk: usize,
    d: usize,
    mask: MaskSpec,
    bshd: bool,
    /// The K/V heads (b, h) whose GQA groups are checked against the reference.
    groups: &'static [(usize, usize)],
    /// Row offsets past int32: `TooLarge` from both calls, nothing written, also passes.
    may_refuse: bool,
}

const CASES: [LCase; 3] = [
    // Heads of 2^17 elements: head 16384 starts at element 2^31, head 32768 (b = 1, h = 16368)
    // at 2^32.
    LCase {
        dtype: Lowp::BF16,
        b: 2,
        hq: 16400,
        hk: 16400,
        sq: 1024,
        sk: 1024,
        d: 128,
        mask: m(-1, -1, false),
        bshd: false,
        groups: &[(0, 0), (0, 16384), (1, 16367), (1, 16368), (1, 16399)],
        may_refuse: false,
    },
    // Rows of H·D = 2105344 elements: the last row offset within a head, 1020 · H·D + 127, is
    // just under 2^31; from head 256 on, batch 0's last row lies past element 2^31; batch 1 starts
    // past 2^31 and its last rows lie past 2^32.
    LCase {
        dtype: Lowp::F16,
        b: 2,
        hq: 16448,
        hk: 8224,
        sq: 1021,
        sk: 1024,
        d: 128,
        mask: m(-1, 0, false),
        bshd: true,
        groups: &[(0, 0), (0, 8223), (1, 4111), (1, 8223)],
        may_refuse: false,
    },
    // Rows of H·D = 4.2e6 elements: row offsets within a head pass 2^31 from row 511 and 2^32 at
    // the last head's last row.
    LCase {
        dtype: Lowp::F16,
        b: 1,
        hq: 32896,
        hk: 16448,
        sq: 1021,
        sk: 1024,
        d: 128,
        mask: m(-1, 0, false),
        bshd: true,
        groups: &[(0, 0), (0, 8224), (0, 16447)],
        may_refuse: true,
    },
];

/// Tags of the input tensors in the value hash.
const TAG_Q: u64 = 1;
const TAG_K: u64 = 2;
const TAG_V: u64 = 3;
const TAG_DO: u64 = 4;

/// Elements generated and uploaded (or downloaded and scanned) per step: 128 MiB of 16-bit values.
const CHUNK: usize = 1 << 26;

impl LCase {
    fn place(&self, h: usize, s: usize) -> Placement<4> {
        let (b, d) = (self.b, self.d);
        let strides = if self.bshd { [s * h * d, d, h * d, 1] } else { [h * s * d, s * d, d, 1] };
        Placement::new([b, h, s, d], strides, GUARD)
    }
    fn rows(&self) -> Placement<3> {
        Placement::new([self.b, self.hq, self.sq], [self.hq * self.sq, self.sq, 1], GUARD)
    }
    fn group(&self) -> usize {
        self.hq / self.hk
    }
    /// The last row's offset within a head plus the head dim: what `check_rows` bounds by 2^31 − 1.
    fn row_extent(&self) -> usize {
        let (pq, pk) = (self.place(self.hq, self.sq), self.place(self.hk, self.sk));
        ((self.sq - 1) * pq.strides[2]).max((self.sk - 1) * pk.strides[2]) + self.d
    }
    fn describe(&self) -> String {
        format!(
            "{} B={} Hq={} Hk={} Sq={} Sk={} D={} mask={} {} (q {:.3e} elements, k {:.3e})",
            self.dtype.name(),
            self.b,
            self.hq,
            self.hk,
            self.sq,
            self.sk,
            self.d,
            mask_name(&self.mask),
            if self.bshd { "bshd" } else { "bhsd" },
            (self.b * self.hq * self.sq * self.d) as f64,
            (self.b * self.hk * self.sk * self.d) as f64
        )
    }
    /// Device bytes of the tensors (the workspace apart).
    fn tensor_bytes(&self) -> usize {
        (4 * self.place(self.hq, self.sq).len + 4 * self.place(self.hk, self.sk).len) * 2 + 2 * self.rows().len * 4
    }
    /// The Gluon backward's workspace (its documented formula: the head-dim bucket 64, 128 or 256).
    fn workspace_bytes(&self) -> usize {
        self.b * self.hq * self.sq.div_ceil(128) * 128 * (self.d.next_power_of_two().max(64) + 2) * 4
    }
}

/// The value of input `tag` at element `at` of its buffer's data (a splitmix64 hash of both,
/// uniform in [-2, 2), rounded to `t`).
fn value(t: Lowp, seed: u64, tag: u64, at: u64) -> u16 {
    let mut z = seed ^ tag.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ at.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let u = (z >> 40) as f32 * (1.0 / 16_777_216.0);
    t.encode(4.0 * u - 2.0)
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}

/// `f` over `out` (element i gets f(i)), split over all cores.
fn par_fill(out: &mut [u16], f: impl Fn(usize) -> u16 + Sync) {
    let per = out.len().div_ceil(threads()).max(1);
    std::thread::scope(|s| {
        for (n, part) in out.chunks_mut(per).enumerate() {
            let f = &f;
            s.spawn(move || {
                for (i, x) in part.iter_mut().enumerate() {
                    *x = f(n * per + i);
                }
            });
        }
    });
}

/// Count of the elements of `xs` for which `bad` holds, over all cores.
fn par_count<T: Sync>(xs: &[T], bad: impl Fn(&T) -> bool + Sync) -> usize {
    let per = xs.len().div_ceil(threads()).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = xs
            .chunks(per)
            .map(|part| {
                let bad = &bad;
                s.spawn(move || part.iter().filter(|x| bad(x)).count())
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("count thread")).sum()
    })
}

/// Page-locked host memory for the chunked copies: pageable copies go through the driver's
/// staging buffers at a fraction of the bandwidth, and the full scans move ~100 GB per case.
struct Pinned {
    ptr: *mut u8,
    bytes: usize,
}

impl Pinned {
    fn new(bytes: usize) -> Result<Self, String> {
        let ptr = unsafe { result::malloc_host(bytes, 0) }.map_err(|e| format!("cuMemHostAlloc({bytes}): {e:?}"))?;
        // Zeroed once, so the slices handed out never view uninitialized memory.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes) };
        Ok(Pinned { ptr: ptr as *mut u8, bytes })
    }
    /// The first `n` elements of type `T` (u16 or u32: the allocation is page-aligned).
    fn slice<T: Copy>(&mut self, n: usize) -> &mut [T] {
        assert!(n * size_of::<T>() <= self.bytes, "pinned buffer of {} bytes", self.bytes);
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, n) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
    }
}

/// Poisons the whole buffer, then uploads the data region [GUARD, len − GUARD) in chunks.
fn fill(
    buf: &DevBuf,
    len: usize,
    (t, seed, tag): (Lowp, u64, u64),
    staging: &mut Pinned,
    stream: sys::CUstream,
) -> Result<(), String> {
    poison(buf.0, len * 2, stream)?;
    let n = len - 2 * GUARD;
    for start in (0..n).step_by(CHUNK) {
        let part = staging.slice::<u16>(CHUNK.min(n - start));
        par_fill(part, |i| value(t, seed, tag, (start + i) as u64));
        upload(buf.0 + ((GUARD + start) * 2) as u64, part, stream)?;
        sync(stream)?; // the staging chunk is refilled next
    }
    Ok(())
}

/// (elements of the data region for which `bad` holds, guard elements that are not poison).
fn scan<T: Copy + Default + PartialEq + Send + Sync>(
    buf: &DevBuf,
    len: usize,
    (poison, bad): (T, impl Fn(&T) -> bool + Sync),
    staging: &mut Pinned,
    stream: sys::CUstream,
) -> Result<(usize, usize), String> {
    let size = size_of::<T>();
    let n = len - 2 * GUARD;
    let guards = guard_damage(buf, len, poison, stream)?;
    let step = CHUNK * 2 / size;
    let mut bad_count = 0;
    for start in (0..n).step_by(step) {
        let part = staging.slice::<T>(step.min(n - start));
        download_into(part, buf.0 + ((GUARD + start) * size) as u64, stream)?;
        sync(stream)?;
        bad_count += par_count(part, &bad);
    }
    Ok((bad_count, guards))
}

/// One head's S×D elements (logical order) of a 16-bit tensor placed by `p`.
fn download_head(
    buf: &DevBuf,
    p: &Placement<4>,
    b: usize,
    h: usize,
    stream: sys::CUstream,
) -> Result<Vec<u16>, String> {
    let [_, _, s, d] = p.sizes;
    let start = p.offset + b * p.strides[0] + h * p.strides[1];
    let mut out = vec![0u16; s * d];
    if p.strides[2] == d {
        download_into(&mut out, buf.0 + (start * 2) as u64, stream)?;
    } else {
        for (i, row) in out.chunks_mut(d).enumerate() {
            download_into(row, buf.0 + ((start + i * p.strides[2]) * 2) as u64, stream)?;
        }
    }
    sync(stream)?;
    Ok(out)
}

/// One head's S×D input values (logical order), regenerated from the hash.
fn host_head(c: &LCase, p: &Placement<4>, tag: u64, seed: u64, b: usize, h: usize) -> Vec<f32> {
    let [_, _, s, d] = p.sizes;
    let mut out = Vec::with_capacity(s * d);
    for i in 0..s {
        for t in 0..d {
            let at = b * p.strides[0] + h * p.strides[1] + i * p.strides[2] + t;
            out.push(c.dtype.decode(value(c.dtype, seed, tag, at as u64)));
        }
    }
    out
}

/// The reference of the checked groups: a problem of `groups.len()` batches of one GQA group
/// each (Hq = G, Hk = 1).
fn reference(c: &LCase, seed: u64) -> (reference::Outputs, reference::Outputs) {
    let (pq, pk) = (c.place(c.hq, c.sq), c.place(c.hk, c.sk));
    let g = c.group();
    let (mut q, mut k, mut v, mut d_o) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for &(b, hk) in c.groups {
        for h in hk * g..(hk + 1) * g {
            q.extend(host_head(c, &pq, TAG_Q, seed, b, h));
            d_o.extend(host_head(c, &pq, TAG_DO, seed, b, h));
        }
        k.extend(host_head(c, &pk, TAG_K, seed, b, hk));
        v.extend(host_head(c, &pk, TAG_V, seed, b, hk));
    }
    let problem = reference::Problem::plain(
        reference::Precision::Half(c.dtype),
        [c.groups.len(), g, 1, c.sq, c.sk, c.d],
        c.mask,
        1.0 / (c.d as f32).sqrt(),
        [&q, &k, &v, &d_o],
    );
    reference::compute(&problem)
}

struct Bufs {
    q: DevBuf,
    k: DevBuf,
    v: DevBuf,
    d_o: DevBuf,
    o: DevBuf,
    dq: DevBuf,
    dk: DevBuf,
    dv: DevBuf,
    lse: DevBuf,
    delta: DevBuf,
}

pub(crate) fn run(args: &Args, stream: sys::CUstream, log: &mut Log, tally: &mut Tally) -> Result<(), String> {
    for c in &CASES {
        run_case(c, args.seed, stream, log, tally)?;
    }
    Ok(())
}

fn run_case(c: &LCase, seed: u64, stream: sys::CUstream, log: &mut Log, tally: &mut Tally) -> Result<(), String> {
    let label = format!("large {}", c.describe());
    let (pq, pk, rows) = (c.place(c.hq, c.sq), c.place(c.hk, c.sk), c.rows());
    let backends = stress::backends();
    let workspace = if backends.iter().any(|&b| b != flash::Backend::Portable) { c.workspace_bytes() } else { 0 };
    let needed = c.tensor_bytes() + workspace;
    let (free, total) = stress::device_memory()?;
    log.line(format!(
        "{label}: last row offset within a head + D = {} ({} 2^31 - 1); needs {:.1} GiB ({:.1} GiB tensors + \
         {:.1} GiB Gluon workspace), {:.1} of {:.1} GiB free",
        c.row_extent(),
        if c.row_extent() > i32::MAX as usize { ">" } else { "<=" },
        gib(needed),
        gib(c.tensor_bytes()),
        gib(workspace),
        gib(free),
        gib(total)
    ));
    if needed + (1 << 30) > free {
        tally.record(log, false, format!("{label}: not enough device memory"));
        return Ok(());
    }
    let started = Instant::now();
    let mut staging = Pinned::new(CHUNK * 2)?;
    let bufs = Bufs {
        q: DevBuf::new(pq.len * 2)?,
        k: DevBuf::new(pk.len * 2)?,
        v: DevBuf::new(pk.len * 2)?,
        d_o: DevBuf::new(pq.len * 2)?,
        o: DevBuf::new(pq.len * 2)?,
        dq: DevBuf::new(pq.len * 2)?,
        dk: DevBuf::new(pk.len * 2)?,
        dv: DevBuf::new(pk.len * 2)?,
        lse: DevBuf::new(rows.len * 4)?,
        delta: DevBuf::new(rows.len * 4)?,
    };
    for (buf, len, tag) in
        [(&bufs.q, pq.len, TAG_Q), (&bufs.k, pk.len, TAG_K), (&bufs.v, pk.len, TAG_V), (&bufs.d_o, pq.len, TAG_DO)]
    {
        fill(buf, len, (c.dtype, seed, tag), &mut staging, stream)?;
    }
    log.line(format!("  inputs generated and uploaded in {:.1} s", started.elapsed().as_secs_f64()));
    // The reference runs on the host while the GPU works.
    let reference = std::thread::scope(|s| -> Result<_, String> {
        let handle = s.spawn(|| {
            let t0 = Instant::now();
            let refs = reference(c, seed);
            (refs, t0.elapsed().as_secs_f64())
        });
        let mut runs = Vec::new();
        for &backend in &backends {
            runs.push((backend, run_backend(c, &bufs, backend, &mut staging, stream)?));
        }
        let refs = handle.join().map_err(|_| "the reference thread panicked".to_string())?;
        Ok((runs, refs))
    });
    let (runs, ((exact, naive), ref_s)) = reference?;
    log.line(format!(
        "  float64 reference of {} group(s) of {} query head(s): {ref_s:.1} s",
        c.groups.len(),
        c.group()
    ));
    for (backend, got) in runs {
        let mut line = format!("{label} [{}]", backend::name(backend));
        let got = match got {
            Ok(got) => got,
            Err(e) => {
                tally.record(log, false, format!("{line}: {e}"));
                continue;
            }
        };
        if let Some(why) = &got.refused {
            let _ = write!(
                line,
                ": refused by attn_fwd and attn_bwd ({why}); full scan: {} output elements written, {} guard \
                 elements written (scan {:.1} s)",
                got.written, got.guards, got.scan_s
            );
            tally.record(log, got.written == 0 && got.guards == 0, line);
            continue;
        }
        let checks = [
            Bounded::new("O", &got.o, &exact.o, &naive.o, 3.0, false),
            Bounded::new("dQ", &got.dq, &exact.dq, &naive.dq, 5.0, true),
            Bounded::new("dK", &got.dk, &exact.dk, &naive.dk, 5.0, true),
            Bounded::new("dV", &got.dv, &exact.dv, &naive.dv, 5.0, true),
        ];
        let (lse_ok, lse_text) = check_lse(&got.lse, &exact.lse, &naive.lse);
        let _ = write!(
            line,
            ": fwd+bwd {:.2} s (workspace setup included); full scan: {} NaN in O/dQ/dK/dV, {} LSE not finite, \
             {} guard elements written (scan {:.1} s); groups {:?} (all rows): {}  {lse_text}",
            got.gpu_s,
            got.nan,
            got.lse_bad,
            got.guards,
            got.scan_s,
            c.groups,
            checks[0].show()
        );
        for ch in &checks[1..] {
            let _ = write!(line, "  {}", ch.show());
        }
        let pass = got.nan == 0 && got.lse_bad == 0 && got.guards == 0 && lse_ok && checks.iter().all(Bounded::pass);
        tally.record(log, pass, line);
    }
    Ok(())
}

/// What one backend's run gave: the slices (reference order, decoded) and the full-scan counts.
struct Got {
    /// `TooLarge` from both calls (a case that may be refused): the message.
    refused: Option<String>,
    /// When refused: output elements that are not poison any more.
    written: usize,
    o: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    nan: usize,
    lse_bad: usize,
    guards: usize,
    gpu_s: f64,
    scan_s: f64,
}

/// Poisons the outputs, runs forward + backward on `backend`, scans and slices the outputs. The
/// outer error is a driver failure (stops the mode); the inner one the call's.
fn run_backend(
    c: &LCase,
    bufs: &Bufs,
    backend: flash::Backend,
    staging: &mut Pinned,
    stream: sys::CUstream,
) -> Result<Result<Got, String>, String> {
    let (pq, pk, rows) = (c.place(c.hq, c.sq), c.place(c.hk, c.sk), c.rows());
    let dtype = dtype_of(c.dtype);
    for (buf, bytes) in [
        (&bufs.o, pq.len * 2),
        (&bufs.dq, pq.len * 2),
        (&bufs.dk, pk.len * 2),
        (&bufs.dv, pk.len * 2),
        (&bufs.lse, rows.len * 4),
        (&bufs.delta, rows.len * 4),
    ] {
        poison(buf.0, bytes, stream)?;
    }
    let view = |buf: &DevBuf, p: &Placement<4>| {
        TensorView::new(
            buf.0 + (p.offset * 2) as u64,
            p.sizes.map(|n| n as u64),
            p.strides.map(|n| n as i64),
            dtype,
        )
    };
    let rows_view = |buf: &DevBuf| {
        TensorView::new(
            buf.0 + (rows.offset * 4) as u64,
            rows.sizes.map(|n| n as u64),
            rows.strides.map(|n| n as i64),
            DType::F32,
        )
    };
    let mut fp = flash::FwdParams::new(
        view(&bufs.q, &pq),
        view(&bufs.k, &pk),
        view(&bufs.v, &pk),
        view(&bufs.o, &pq),
        Some(rows_view(&bufs.lse)),
    );
    fp.sm_scale = 1.0 / (c.d as f32).sqrt();
    fp.mask = api_mask(&c.mask);
    fp.backend = backend;
    let mut bp = flash::BwdParams::new(
        view(&bufs.q, &pq),
        view(&bufs.k, &pk),
        view(&bufs.v, &pk),
        view(&bufs.o, &pq),
        view(&bufs.d_o, &pq),
        rows_view(&bufs.lse),
        rows_view(&bufs.delta),
        view(&bufs.dq, &pq),
        view(&bufs.dk, &pk),
        view(&bufs.dv, &pk),
    );
    bp.sm_scale = fp.sm_scale;
    bp.mask = fp.mask;
    bp.backend = backend;
    sync(stream)?;
    let started = Instant::now();
    let st = Stream::cuda(stream as usize);
    match flash::attn_fwd(&fp, st) {
        Ok(()) => {}
        Err(e) if c.may_refuse && e.kind() == ErrorKind::TooLarge => return refused(c, bufs, &bp, e, staging, stream),
        Err(e) => return Ok(Err(format!("attn_fwd: {e}"))),
    }
    // After the forward: a case that may be refused asks for a workspace only once accepted.
    let _workspace = match backend::attach_workspace(&mut bp, stream) {
        Ok(w) => w,
        Err(e) => return Ok(Err(e)),
    };
    if let Err(e) = flash::attn_bwd(&bp, st) {
        return Ok(Err(format!("attn_bwd: {e}")));
    }
    sync(stream)?;
    let gpu_s = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let t = c.dtype;
    let (mut nan, mut guards) = (0, 0);
    for (buf, len) in [(&bufs.o, pq.len), (&bufs.dq, pq.len), (&bufs.dk, pk.len), (&bufs.dv, pk.len)] {
        let (n, g) = scan(buf, len, (POISON16, |&x: &u16| stress::is_nan16(t, x)), staging, stream)?;
        nan += n;
        guards += g;
    }
    let not_finite = |&x: &u32| !f32::from_bits(x).is_finite();
    let (lse_bad, g) = scan(&bufs.lse, rows.len, (POISON32, not_finite), staging, stream)?;
    guards += g;
    // The inputs' and delta's guards too (the data of delta is the backward's scratch).
    for (buf, len) in [(&bufs.q, pq.len), (&bufs.k, pk.len), (&bufs.v, pk.len), (&bufs.d_o, pq.len)] {
        guards += guard_damage::<u16>(buf, len, POISON16, stream)?;
    }
    guards += guard_damage::<u32>(&bufs.delta, rows.len, POISON32, stream)?;
    let scan_s = started.elapsed().as_secs_f64();

    let dec = |bits: Vec<u16>| bits.into_iter().map(|x| t.decode(x) as f64);
    let mut got = Got {
        refused: None,
        written: 0,
        o: vec![],
        lse: vec![],
        dq: vec![],
        dk: vec![],
        dv: vec![],
        nan,
        lse_bad,
        guards,
        gpu_s,
        scan_s,
    };
    let g = c.group();
    for &(b, hk) in c.groups {
        for h in hk * g..(hk + 1) * g {
            got.o.extend(dec(download_head(&bufs.o, &pq, b, h, stream)?));
            got.dq.extend(dec(download_head(&bufs.dq, &pq, b, h, stream)?));
            let mut lse = vec![0u32; c.sq];
            let at = rows.offset + b * rows.strides[0] + h * rows.strides[1];
            download_into(&mut lse, bufs.lse.0 + (at * 4) as u64, stream)?;
            sync(stream)?;
            got.lse.extend(lse.into_iter().map(|x| f32::from_bits(x) as f64));
        }
        got.dk.extend(dec(download_head(&bufs.dk, &pk, b, hk, stream)?));
        got.dv.extend(dec(download_head(&bufs.dv, &pk, b, hk, stream)?));
    }
    Ok(Ok(got))
}

/// The forward was refused with `TooLarge`: the backward must be too (before its workspace is
/// looked at), and no output element or guard may have changed.
fn refused(
    c: &LCase,
    bufs: &Bufs,
    bp: &flash::BwdParams,
    fwd_error: aotriton::Error,
    staging: &mut Pinned,
    stream: sys::CUstream,
) -> Result<Result<Got, String>, String> {
    match flash::attn_bwd(bp, Stream::cuda(stream as usize)) {
        Err(e) if e.kind() == ErrorKind::TooLarge => {}
        Err(e) => return Ok(Err(format!("attn_fwd refused ({fwd_error}), attn_bwd: {e}"))),
        Ok(()) => return Ok(Err(format!("attn_fwd refused ({fwd_error}), attn_bwd accepted"))),
    }
    let started = Instant::now();
    let (pq, pk, rows) = (c.place(c.hq, c.sq), c.place(c.hk, c.sk), c.rows());
    let (mut written, mut guards) = (0, 0);
    for (buf, len) in [(&bufs.o, pq.len), (&bufs.dq, pq.len), (&bufs.dk, pk.len), (&bufs.dv, pk.len)] {
        let (n, g) = scan(buf, len, (POISON16, |&x: &u16| x != POISON16), staging, stream)?;
        written += n;
        guards += g;
    }
    for buf in [&bufs.lse, &bufs.delta] {
        let (n, g) = scan(buf, rows.len, (POISON32, |&x: &u32| x != POISON32), staging, stream)?;
        written += n;
        guards += g;
    }
    Ok(Ok(Got {
        refused: Some(fwd_error.to_string()),
        written,
        o: vec![],
        lse: vec![],
        dq: vec![],
        dk: vec![],
        dv: vec![],
        nan: 0,
        lse_bad: 0,
        guards,
        gpu_s: 0.0,
        scan_s: started.elapsed().as_secs_f64(),
    }))
}

/// Guard elements (before and after the data) that are not poison.
fn guard_damage<T: Copy + Default + PartialEq>(
    buf: &DevBuf,
    len: usize,
    poison: T,
    stream: sys::CUstream,
) -> Result<usize, String> {
    let (mut front, mut back) = (vec![T::default(); GUARD], vec![T::default(); GUARD]);
    download_into(&mut front, buf.0, stream)?;
    download_into(&mut back, buf.0 + ((len - GUARD) * size_of::<T>()) as u64, stream)?;
    sync(stream)?;
    Ok(front.iter().chain(&back).filter(|&&x| x != poison).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tensor has more than 2^31 elements, Q more than 2^32; the checked groups reach past
    /// both; the whole case fits the H200 (139 GiB) with room to spare; grid dims stay < 65536.
    #[test]
    fn shapes() {
        for c in &CASES {
            let q = c.b * c.hq * c.sq * c.d;
            let k = c.b * c.hk * c.sk * c.d;
            assert!(q > 1 << 32 && k > 1 << 31, "{}", c.describe());
            assert!(c.tensor_bytes() + c.workspace_bytes() < 100 << 30, "{}", c.describe());
            assert!(c.hq % c.hk == 0 && c.b * c.hq < 65536);
            let pq = c.place(c.hq, c.sq);
            let last =
                |b: usize, h: usize| b * pq.strides[0] + h * pq.strides[1] + (c.sq - 1) * pq.strides[2] + c.d - 1;
            let g = c.group();
            let reach = c.groups.iter().map(|&(b, hk)| last(b, hk * g + g - 1)).max().unwrap();
            assert!(reach >= 1 << 32, "{}", c.describe());
            assert_eq!(pq.len - 2 * GUARD, q);
            for &(b, hk) in c.groups {
                assert!(b < c.b && hk < c.hk);
            }
            // What validation accepts (flash/mod.rs check_rows): only a case that may be refused
            // passes the int32 row limit.
            assert_eq!(c.row_extent() > i32::MAX as usize, c.may_refuse, "{}", c.describe());
        }
        // The second case's last q row offset (+ D) is just under 2^31.
        assert!(CASES[1].row_extent() > (1 << 31) - (1 << 16));
        // The first case's groups sit on both sides of 2^31 and 2^32.
        let c = &CASES[0];
        let start = |(b, h): (usize, usize)| (b * c.hq + h) * c.sq * c.d;
        assert_eq!(start(c.groups[1]), 1 << 31);
        assert_eq!(start(c.groups[2]) + c.sq * c.d, 1 << 32);
        assert_eq!(start(c.groups[3]), 1 << 32);
    }

    /// Host time of the float64 reference of each case's groups (run with --ignored --nocapture,
    /// release): it runs beside the GPU work, and must stay well inside the mode's time.
    #[test]
    #[ignore]
    fn reference_time() {
        for c in &CASES {
            let t0 = Instant::now();
            let (exact, _) = reference(c, 1);
            assert!(exact.lse.iter().all(|x| x.is_finite()));
            println!("{:6.1} s  {}", t0.elapsed().as_secs_f64(), c.describe());
        }
        // And the input generation: one chunk, all cores.
        let mut chunk = vec![0u16; CHUNK];
        let t0 = Instant::now();
        par_fill(&mut chunk, |i| value(Lowp::F16, 1, TAG_Q, i as u64));
        let per = t0.elapsed().as_secs_f64() / CHUNK as f64;
        println!("input values: {:.2} ns each on {} threads", per * 1e9, threads());
    }

    #[test]
    fn values_are_spread_and_reproducible() {
        let xs: Vec<f32> = (0..10_000u64).map(|i| Lowp::BF16.decode(value(Lowp::BF16, 7, TAG_Q, i))).collect();
        assert!(xs.iter().all(|x| (-2.0..=2.0).contains(x)));
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        assert!(mean.abs() < 0.05, "{mean}");
        assert_eq!(value(Lowp::F16, 7, TAG_K, 123), value(Lowp::F16, 7, TAG_K, 123));
        assert_ne!(value(Lowp::F16, 7, TAG_K, 123), value(Lowp::F16, 7, TAG_V, 123));
        let mut out = vec![0u16; 1000];
        par_fill(&mut out, |i| value(Lowp::F16, 1, TAG_Q, i as u64));
        assert!(out.iter().enumerate().all(|(i, &x)| x == value(Lowp::F16, 1, TAG_Q, i as u64)));
        assert_eq!(par_count(&out, |&x| x == out[3]), out.iter().filter(|&&x| x == out[3]).count());
    }
}
