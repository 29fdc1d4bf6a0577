//! The stress modes (`--stress NAME`), each run on its own so each fits one device call:
//!
//! * `concurrency` (concurrency.rs): 64 threads × 8 streams, first loads racing, results equal
//!   to single-threaded runs bitwise;
//! * `large` (large.rs): forward and backward on tensors of more than 2^32 elements, checked on
//!   slices against the float64 reference, on both backends;
//! * `memory` (growth.rs): 10^5 forward + backward calls per backend, host RSS, Rust heap and
//!   device memory sampled after warm-up and at the end;
//! * `multi-device` (concurrency.rs): the concurrency mode with its threads spread over two GPUs
//!   of one process, and one load per kernel per device (skipped with a line on one GPU).
//!
//! Each prints `stress-<name>: N passed, M failed` last (what run_all.sh's summary picks up),
//! writes its lines to `--log PATH` too, and exits 1 when anything failed. Without a GPU it prints
//! `skipped: no GPU` and exits 0 (2 with `--require-gpu`), as the main suite does.
use std::io::Write as _;

use super::*;

/// The lines of a run: printed as they come (flushed, so a run killed at a time limit still shows
/// how far it got) and kept for `--log`.
pub(crate) struct Log {
    text: String,
}

impl Log {
    pub(crate) fn new() -> Self {
        Log { text: String::new() }
    }
    pub(crate) fn line(&mut self, line: impl AsRef<str>) {
        let line = line.as_ref();
        println!("{line}");
        let _ = std::io::stdout().flush();
        self.text.push_str(line);
        self.text.push('\n');
    }
}

/// Pass/fail lines of a mode.
pub(crate) struct Tally {
    pub passed: usize,
    pub failed: usize,
}

impl Tally {
    pub(crate) fn new() -> Self {
        Tally { passed: 0, failed: 0 }
    }
    /// Records one check and logs its line with PASS / FAIL appended.
    pub(crate) fn record(&mut self, log: &mut Log, pass: bool, line: String) {
        if pass {
            self.passed += 1
        } else {
            self.failed += 1
        }
        log.line(format!("{line}  {}", if pass { "PASS" } else { "FAIL" }));
    }
}

/// Runs `--stress <mode>` and returns the exit code.
pub(crate) fn run(mode: &str, args: &Args) -> i32 {
    // The cold single-threaded reference process of the concurrency mode (started by it).
    if mode == "concurrency-ref" {
        return concurrency::reference_process(args);
    }
    let name = match mode {
        "concurrency" | "large" | "memory" | "multi-device" => format!("stress-{mode}"),
        _ => usage(),
    };
    let stream = match open_device() {
        Ok(Some(s)) => s,
        Ok(None) => {
            println!("skipped: no GPU");
            return if args.require_gpu { 2 } else { 0 };
        }
        Err(e) => {
            println!("{name}: setup failed: {e}");
            return 1;
        }
    };
    let device = result::device::get(0)
        .and_then(result::device::get_name)
        .unwrap_or_default();
    let mut log = Log::new();
    log.line(format!(
        "aotriton {name}: device 0 = {device}, seed {:#x}, built archs {:?}",
        args.seed,
        aotriton::built_archs()
    ));
    let started = Instant::now();
    let mut tally = Tally::new();
    let outcome = match mode {
        "concurrency" => concurrency::run(args, &mut log, &mut tally),
        "multi-device" => concurrency::run_multi_device(args, &mut log, &mut tally),
        "large" => large::run(args, stream, &mut log, &mut tally),
        _ => growth::run(stream, &mut log, &mut tally),
    };
    if let Err(e) = outcome {
        tally.record(&mut log, false, format!("{name}: stopped: {e}"));
    }
    log.line(format!("total {:.1} s", started.elapsed().as_secs_f64()));
    log.line(format!("{name}: {} passed, {} failed", tally.passed, tally.failed));
    let mut failed = tally.failed;
    if let Some(path) = &args.log
        && let Err(e) = std::fs::write(path, &log.text)
    {
        eprintln!("cannot write {path}: {e}");
        failed += 1;
    }
    if failed == 0 { 0 } else { 1 }
}

/// The backends a mode runs: the one `--backend` names, else portable and Gluon.
pub(crate) fn backends() -> Vec<flash::Backend> {
    match backend::explicit() {
        Some(b) => vec![b],
        None => vec![flash::Backend::Portable, flash::Backend::Gluon],
    }
}

/// A stream that does not synchronize with the legacy default stream.
pub(crate) fn nonblocking_stream() -> Result<sys::CUstream, String> {
    result::stream::create(result::stream::StreamKind::NonBlocking).map_err(|e| format!("cuStreamCreate: {e:?}"))
}

/// Fills `bytes` bytes at `ptr` with 0xFF: NaN in fp16, bf16 and fp32.
pub(crate) fn poison(ptr: sys::CUdeviceptr, bytes: usize, stream: sys::CUstream) -> Result<(), String> {
    unsafe { result::memset_d8_async(ptr, 0xFF, bytes, stream) }.map_err(|e| format!("cuMemsetD8Async: {e:?}"))
}

/// Copies `out.len()` elements from `ptr` (asynchronously; sync the stream before reading).
pub(crate) fn download_into<T>(out: &mut [T], ptr: sys::CUdeviceptr, stream: sys::CUstream) -> Result<(), String> {
    unsafe { result::memcpy_dtoh_async(out, ptr, stream) }.map_err(|e| format!("cuMemcpyDtoHAsync: {e:?}"))
}

pub(crate) fn upload<T>(ptr: sys::CUdeviceptr, host: &[T], stream: sys::CUstream) -> Result<(), String> {
    unsafe { result::memcpy_htod_async(ptr, host, stream) }.map_err(|e| format!("cuMemcpyHtoDAsync: {e:?}"))
}

/// (free, total) device memory of the current context.
pub(crate) fn device_memory() -> Result<(usize, usize), String> {
    result::mem_get_info().map_err(|e| format!("cuMemGetInfo: {e:?}"))
}

/// bf16 / fp16 bits that are NaN (the poison pattern 0xFFFF among them).
pub(crate) fn is_nan16(t: Lowp, bits: u16) -> bool {
    match t {
        Lowp::F16 => bits & 0x7FFF > 0x7C00,
        Lowp::BF16 => bits & 0x7FFF > 0x7F80,
    }
}

pub(crate) fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}
