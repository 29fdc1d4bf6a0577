//! Steady state of the launch path, per backend: 100 forward + backward launches of one problem
//! give the same results every time (bitwise for O, LSE, dK, dV, and for dQ where the backward
//! is deterministic; where the Gluon backward adds dQ partials in no fixed order, every element
//! within max|dQ|/128, at most one bf16 rounding step at the tensor's scale: a lost or doubled
//! partial moves elements by far more), and after the first call no launch allocates host memory
//! (counted by the suite's global allocator).
use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

/// The suite's global allocator: `System`, counting every allocation and the bytes allocated
/// and freed (growth.rs reads the live bytes).
pub(crate) struct CountingAlloc;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES_ALLOCATED: AtomicU64 = AtomicU64::new(0);
static BYTES_FREED: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            BYTES_ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        ptr
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        BYTES_FREED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            BYTES_ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        ptr
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            BYTES_FREED.fetch_add(layout.size() as u64, Ordering::Relaxed);
            BYTES_ALLOCATED.fetch_add(new_size as u64, Ordering::Relaxed);
        }
        new
    }
}

fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Bytes of Rust heap allocated and not yet freed, process-wide.
pub(crate) fn live_heap_bytes() -> i64 {
    // Freed first: a concurrent allocation then only makes the figure larger, never negative.
    let freed = BYTES_FREED.load(Ordering::Relaxed);
    BYTES_ALLOCATED.load(Ordering::Relaxed) as i64 - freed as i64
}

const LAUNCHES: usize = 100;
/// Back-to-back call pairs timed for the host cost (see `stability_case`).
const BURST: usize = 50;

/// bf16, B=2, Hq=8, Hk=2 (GQA), Sq=Sk=1000, D=128, causal: 100 forward + backward launches.
pub(crate) fn stability_case(rng: &mut SplitMix64, stream: sys::CUstream) -> Result<Outcome, String> {
    let t = Lowp::BF16;
    let dtype = dtype_of(t);
    let (b, hq, hk, s, d) = (2usize, 8usize, 2usize, 1000usize, 128usize);
    let label = format!(
        "stability [{}] bf16 D={d} B={b} Hq={hq} Hk={hk} S={s} causal-TL x{LAUNCHES}",
        backend::name(backend::get())
    );
    let mut draw = |n: usize| (0..n).map(|_| t.encode(rng.normal_in(t))).collect::<Vec<u16>>();
    let (nq, nk) = (b * hq * s * d, b * hk * s * d);
    let dev = StepTensors::contiguous([b, hq, hk, s, s, d], [&draw(nq), &draw(nk), &draw(nk), &draw(nq)], POISON16, stream)?;
    let st = Stream::from_raw(stream as usize);
    let mut fp = dev.fwd_params(dtype);
    fp.mask = Mask::causal(MaskAlign::TopLeft);
    fp.backend = backend::get();
    let mut bp = dev.bwd_params(dtype);
    bp.mask = fp.mask;
    bp.backend = backend::get();
    let _workspace = backend::attach_workspace(&mut bp, stream)?;
    let exact_dq = !backend::forced_gluon() && bp.workspace.is_none();
    let fail = |what: String| Ok(Outcome { pass: false, line: format!("{label}  {what}  FAIL") });

    // Warm-up: loads the kernels, plans the arguments, resolves driver symbols.
    if let Err(e) = flash::attn_fwd(&fp, st).and_then(|_| flash::attn_bwd(&bp, st)) {
        return fail(format!("warm-up returned {e}"));
    }
    let first = dev.outputs(stream)?;
    let (mut differing, mut dq_far, mut allocated) = (0usize, 0usize, 0u64);
    // Host time of the two API calls (validation, dispatch, descriptor encoding, cuLaunchKernel),
    // measured after a sync so the launch queue is empty.
    let mut host = std::time::Duration::ZERO;
    // The view's elements only: the buffer's guard holds NaN poison.
    let dq_first = dev.dq.logical(&first.2);
    let dq_scale = dq_first.iter().map(|&x| t.decode(x).abs()).fold(0f32, f32::max);
    let dq_tol = dq_scale / 128.0;
    let mut dq_worst = 0f32;
    for _ in 0..LAUNCHES {
        let before = allocations();
        let t0 = Instant::now();
        let launched = flash::attn_fwd(&fp, st).and_then(|_| flash::attn_bwd(&bp, st));
        host += t0.elapsed();
        allocated += allocations() - before;
        if let Err(e) = launched {
            return fail(format!("launch returned {e}"));
        }
        let (o, lse, dq, dk, dv) = dev.outputs(stream)?;
        differing += (o != first.0 || lse != first.1 || dk != first.3 || dv != first.4) as usize;
        if exact_dq {
            differing += (dq != first.2) as usize;
        } else {
            let worst = dev.dq.logical(&dq).iter().zip(&dq_first).map(|(&x, &y)| (t.decode(x) - t.decode(y)).abs()).fold(0f32, |a, b| {
                if b.is_nan() || a.is_nan() { f32::NAN } else { a.max(b) }
            });
            dq_far += (worst.is_nan() || worst > dq_tol) as usize;
            dq_worst = if worst.is_nan() { f32::NAN } else { dq_worst.max(worst) };
        }
    }
    // Host time of back-to-back calls, no sync in between: the API's own cost per call pair while the
    // GPU runs behind (BURST pairs launch at most 5 * BURST kernels, well under the driver's launch
    // queue, so the host never waits for the device). The loop above syncs before every pair, and a
    // call right after a sync also pays for the idle device's wake-up.
    let t0 = Instant::now();
    for _ in 0..BURST {
        if let Err(e) = flash::attn_fwd(&fp, st).and_then(|_| flash::attn_bwd(&bp, st)) {
            return fail(format!("back-to-back launch returned {e}"));
        }
    }
    let burst = t0.elapsed();
    sync(stream)?;
    let pass = differing == 0 && dq_far == 0 && allocated == 0;
    let dq_rule = if exact_dq {
        "dQ bitwise".to_string()
    } else {
        format!("dQ max|dQ_i - dQ_1| {dq_worst:.2e} <= max|dQ|/128 = {dq_tol:.2e} (unordered reduce-adds)")
    };
    Ok(Outcome {
        pass,
        line: format!(
            "{label}  O/LSE/dK/dV bitwise, {dq_rule}: {differing} runs differ, {dq_far} dQ beyond the bound; \
             host allocations during {LAUNCHES} fwd+bwd calls after warm-up: {allocated}; host time per \
             fwd+bwd call pair {:.1} us after a sync, {:.1} us back-to-back (x{BURST})  {}",
            host.as_secs_f64() * 1e6 / LAUNCHES as f64,
            burst.as_secs_f64() * 1e6 / BURST as f64,
            if pass { "PASS" } else { "FAIL" }
        ),
    })
}
