//! aotriton: FlashAttention kernels written in Triton, compiled ahead of time into GPU images
//! that are packed into archives and launched through the GPU driver. Users need only a driver.
//!
//! Data flow: `python/rules.py` (what to compile) → `python/compile.py` (images + metadata) →
//! [`archive`] (packed by the build script) → [`images`] (embedded, loaded lazily) →
//! `dispatch` (functional, divisibility, heuristic) → `driver` (the stream's runtime, CUDA or HIP:
//! load once per device, launch).
//!
//! ```no_run
//! use aotriton::flash::{self, Mask, MaskAlign};
//! use aotriton::{DType, Stream, TensorView};
//! # let (q, k, v, o, lse) = (0u64, 0u64, 0u64, 0u64, 0u64);
//! let (b, hq, hk, s, d) = (2, 32, 8, 1024, 128); // GQA: 4 query heads per K/V head
//! let t = |ptr, h| TensorView::contiguous(ptr, [b, h, s, d], DType::BF16);
//! let lse = TensorView::contiguous(lse, [b, hq, s], DType::F32);
//! let mut params = flash::FwdParams::new(t(q, hq), t(k, hk), t(v, hk), t(o, hq), Some(lse));
//! params.mask = Mask::causal(MaskAlign::BottomRight);
//! flash::attn_fwd(&params, Stream::null())?;
//! # Ok::<(), aotriton::Error>(())
//! ```
pub mod archive;
mod dispatch;
mod driver;
mod error;
pub mod flash;
mod images;
mod tensor;
mod tma;

/// The kernarg layout of the runtime's argument plan, for the AMD code-object checks
/// (`test/amd/tests/code_objects.rs`); not a stable API.
#[doc(hidden)]
pub mod abi {
    pub use crate::dispatch::{KernargLayout, KernargSlot, kernarg_layout};
}

pub use driver::{Runtime, Stream, library_present};
pub use error::{Error, ErrorKind, Result};
pub use images::built_archs;
pub use tensor::{DType, TensorView};

/// Locks a cache mutex. A panic while the lock was held cannot leave these maps half-updated
/// (inserts are single calls), so a poisoned lock is still safe to use.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Counts heap allocations per thread in this crate's unit tests (the launch path's host side
/// must allocate nothing after warm-up).
#[cfg(test)]
pub(crate) mod alloc_count {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static COUNT: Cell<u64> = const { Cell::new(0) };
    }

    struct Counting;

    fn bump() {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
    }

    // SAFETY: forwards to the system allocator unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            bump();
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            bump();
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            bump();
            unsafe { System.realloc(ptr, layout, new_size) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    /// Allocations made by the calling thread so far.
    pub fn allocations() -> u64 {
        COUNT.with(|c| c.get())
    }
}
