//! `--stress memory`: no host or device memory growth over 10^5 calls. Per backend
//! (`--backend` picks one; default portable, then Gluon): 10^5 `attn_fwd` + `attn_bwd` pairs on
//! one small problem (bf16, B=1, Hq=4, Hk=2, S=197, D=64, causal), with 10^4 rejected calls
//! (error messages made and dropped) and 10^4 `attn_bwd_workspace_bytes` queries among them.
//! Then 1000 short-lived threads that make one pair each (per-thread state must go with its
//! thread). Sampled after a warm-up (1000 pairs, 100 threads) and at every quarter:
//!
//! * Rust heap, live bytes (the suite's counting allocator): no growth at all. After the first
//!   call of a configuration the launch path allocates nothing, and what an error path
//!   allocates is freed with the error;
//! * host RSS (`VmRSS` of /proc/self/status, what /proc/self/statm gives in pages): at most
//!   4 MiB. It moves by whole pages as the C allocator and the driver reuse their pools;
//!   a leak of 42 bytes per call pair over 10^5 pairs would exceed it;
//! * device memory (`cuMemGetInfo`'s free bytes): at most 2 MiB less, one allocation granule
//!   of the driver; a leak of one allocation per call (at least 512 bytes) would show as
//!   tens of MB.
//!
//! The last pair's outputs must equal the first's after warm-up: O, LSE, dK, dV bitwise, and
//! dQ bitwise on the portable backend, within max|dQ|/128 on the Gluon one (unordered
//! reduce-adds, see stability.rs).
use super::stress::{Log, Tally, gib};
use super::*;

const PAIRS: usize = 100_000;
const WARMUP: usize = 1_000;
/// One rejected call and one workspace query every this many pairs.
const ASIDE_EVERY: usize = 10;
/// A device sync every this many pairs, so the launch queue never fills (a full queue only makes
/// the host wait, but a sync bounds how far the host runs ahead).
const SYNC_EVERY: usize = 1_000;
const CHURN_THREADS: usize = 1_000;
const CHURN_WARMUP: usize = 100;

const RSS_TOLERANCE: i64 = 4 << 20;
const DEVICE_TOLERANCE: i64 = 2 << 20;
const HEAP_TOLERANCE: i64 = 0;

#[derive(Clone, Copy)]
struct Sample {
    heap: i64,
    rss: i64,
    device_free: i64,
}

/// The Rust heap first (reading the RSS allocates and frees a buffer), then RSS and device.
fn sample() -> Result<Sample, String> {
    let heap = stability::live_heap_bytes();
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| format!("/proc/self/status: {e}"))?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<i64>().ok())
        .ok_or("no VmRSS in /proc/self/status")?;
    let (free, _) = stress::device_memory()?;
    Ok(Sample { heap, rss: kib * 1024, device_free: free as i64 })
}

/// Growth from `a` to `b`: (heap, rss, device) in bytes (device: free memory lost).
fn growth(a: &Sample, b: &Sample) -> (i64, i64, i64) {
    (b.heap - a.heap, b.rss - a.rss, a.device_free - b.device_free)
}

fn within(g: (i64, i64, i64)) -> bool {
    g.0 <= HEAP_TOLERANCE && g.1 <= RSS_TOLERANCE && g.2 <= DEVICE_TOLERANCE
}

fn show(g: (i64, i64, i64)) -> String {
    format!("heap {:+} B, RSS {:+} KiB, device {:+} KiB", g.0, g.1 / 1024, g.2 / 1024)
}

pub(crate) fn run(stream: sys::CUstream, log: &mut Log, tally: &mut Tally) -> Result<(), String> {
    log.line(format!(
        "tolerances: Rust heap {HEAP_TOLERANCE} B, host RSS {} MiB, device {} MiB (growth from after warm-up to \
         the end)",
        RSS_TOLERANCE >> 20,
        DEVICE_TOLERANCE >> 20
    ));
    for backend in stress::backends() {
        run_backend(backend, stream, log, tally)?;
    }
    Ok(())
}

fn run_backend(backend: flash::Backend, stream: sys::CUstream, log: &mut Log, tally: &mut Tally) -> Result<(), String> {
    let t = Lowp::BF16;
    let dtype = dtype_of(t);
    let (b, hq, hk, s, d) = (1usize, 4usize, 2usize, 197usize, 64usize);
    let label = format!("memory [{}] bf16 B={b} Hq={hq} Hk={hk} S={s} D={d} causal-TL", backend::name(backend));
    let mut rng = SplitMix64::new(0x3E3_0000 + backend as u64);
    let mut draw = |n: usize| (0..n).map(|_| t.encode(rng.normal_in(t))).collect::<Vec<u16>>();
    let (nq, nk) = (b * hq * s * d, b * hk * s * d);
    let dev = StepTensors::contiguous([b, hq, hk, s, s, d], [&draw(nq), &draw(nk), &draw(nk), &draw(nq)], POISON16, stream)?;
    let st = Stream::cuda(stream as usize);
    let mut fp = dev.fwd_params(dtype);
    fp.mask = Mask::causal(MaskAlign::TopLeft);
    fp.backend = backend;
    let mut bp = dev.bwd_params(dtype);
    bp.mask = fp.mask;
    bp.backend = backend;
    let _workspace = backend::attach_workspace(&mut bp, stream)?;
    let exact_dq = backend == flash::Backend::Portable || bp.workspace.is_none();
    // Rejected before the driver is touched: a null q (forward), a null lse (backward).
    let mut bad_fwd = fp;
    bad_fwd.q.ptr = 0;
    let mut bad_bwd = bp;
    bad_bwd.lse.ptr = 0;
    let (fp, bp) = (&fp, &bp);
    // The churn threads call this too: the stream travels as an address (a raw pointer is not Sync).
    let stream_addr = stream as usize;
    let pair = |i: usize| -> Result<(), String> {
        let stream = stream_addr as sys::CUstream;
        flash::attn_fwd(fp, st).map_err(|e| format!("attn_fwd: {e}"))?;
        flash::attn_bwd(bp, st).map_err(|e| format!("attn_bwd: {e}"))?;
        if i.is_multiple_of(ASIDE_EVERY) {
            let rejected = if i.is_multiple_of(2 * ASIDE_EVERY) {
                flash::attn_fwd(&bad_fwd, st)
            } else {
                flash::attn_bwd(&bad_bwd, st)
            };
            if rejected.as_ref().map_err(|e| e.kind()) != Err(ErrorKind::NullPointer) {
                return Err(format!("a null pointer gave {rejected:?}, not NullPointer"));
            }
            flash::attn_bwd_workspace_bytes(bp, st).map_err(|e| format!("attn_bwd_workspace_bytes: {e}"))?;
        }
        if i % SYNC_EVERY == SYNC_EVERY - 1 {
            sync(stream)?;
        }
        Ok(())
    };
    let outputs = || -> Result<_, String> {
        dev.outputs(stream)
    };

    // Warm-up, then the first outputs and the baseline.
    for i in 0..WARMUP {
        pair(i)?;
    }
    sync(stream)?;
    let first = outputs()?;
    let mut samples: Vec<Sample> = Vec::with_capacity(8);
    samples.push(sample()?);
    let started = Instant::now();
    for i in 0..PAIRS {
        if let Err(e) = pair(i) {
            tally.record(log, false, format!("{label}: call {i}: {e}"));
            return Ok(());
        }
        if (i + 1).is_multiple_of(PAIRS / 4) {
            sync(stream)?;
            samples.push(sample()?);
        }
    }
    let loop_s = started.elapsed().as_secs_f64();
    let last = outputs()?;

    let mut same = first.0 == last.0 && first.1 == last.1 && first.3 == last.3 && first.4 == last.4;
    let mut dq_note = "dQ bitwise".to_string();
    if exact_dq {
        same &= first.2 == last.2;
    } else {
        let (a, z) = (dev.dq.logical(&first.2), dev.dq.logical(&last.2));
        let scale = a.iter().map(|&x| t.decode(x).abs()).fold(0f32, f32::max);
        let worst = a.iter().zip(&z).map(|(&x, &y)| (t.decode(x) - t.decode(y)).abs()).fold(0f32, |m, x| {
            if m.is_nan() || x.is_nan() { f32::NAN } else { m.max(x) }
        });
        same &= worst <= scale / 128.0; // false for NaN
        dq_note = format!("dQ within {worst:.1e} <= max|dQ|/128 = {:.1e}", scale / 128.0);
    }
    let total = growth(&samples[0], &samples[samples.len() - 1]);
    let steps: Vec<String> = samples.windows(2).map(|w| show(growth(&samples[0], &w[1]))).collect();
    tally.record(
        log,
        within(total) && same,
        format!(
            "{label}: {PAIRS} fwd+bwd pairs + {} rejected calls + {} workspace queries in {loop_s:.1} s \
             ({:.1} us per pair); growth after warm-up at 25/50/75/100 %: [{}]; last outputs {} the first ({dq_note})",
            PAIRS / ASIDE_EVERY,
            PAIRS / ASIDE_EVERY,
            loop_s * 1e6 / PAIRS as f64,
            steps.join("; "),
            if same { "=" } else { "differ from" }
        ),
    );

    // Thread churn: each thread makes one pair on the shared stream and exits.
    let churn = |n: usize| -> Result<(), String> {
        for _ in 0..n {
            std::thread::scope(|s| s.spawn(|| pair(1)).join().map_err(|_| "a churn thread panicked".to_string()))??;
        }
        sync(stream)
    };
    churn(CHURN_WARMUP)?;
    let before = sample()?;
    let started = Instant::now();
    churn(CHURN_THREADS)?;
    let after = sample()?;
    let g = growth(&before, &after);
    tally.record(
        log,
        within(g),
        format!(
            "{label}: {CHURN_THREADS} threads one fwd+bwd pair each, in {:.1} s; growth after {CHURN_WARMUP} \
             warm-up threads: {}",
            started.elapsed().as_secs_f64(),
            show(g)
        ),
    );
    let (free, total) = stress::device_memory()?;
    log.line(format!("  device memory free {:.2} of {:.2} GiB", gib(free), gib(total)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_accounting_sees_a_leak_and_its_absence() {
        let before = stability::live_heap_bytes();
        let kept: Vec<u8> = Vec::with_capacity(1 << 20);
        let mid = stability::live_heap_bytes();
        drop(kept);
        let after = stability::live_heap_bytes();
        // Other tests run concurrently: only a lower bound holds for the leak.
        assert!(mid - before >= 1 << 20);
        assert!(after - before < 1 << 20);
    }

    #[test]
    fn tolerances() {
        assert!(within((0, RSS_TOLERANCE, DEVICE_TOLERANCE)));
        assert!(!within((1, 0, 0)));
        assert!(!within((0, RSS_TOLERANCE + 1, 0)));
        assert!(!within((0, 0, DEVICE_TOLERANCE + 1)));
        let a = Sample { heap: 10, rss: 1000, device_free: 5000 };
        let b = Sample { heap: 10, rss: 5096, device_free: 4000 };
        assert_eq!(growth(&a, &b), (0, 4096, 1000));
    }
}
