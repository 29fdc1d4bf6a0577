//! aotriton: FlashAttention kernels written in Triton, compiled ahead of time into GPU images
//! that are packed into archives and launched through the GPU driver. Users need only a driver:
//! no Triton, no Python, no CUDA toolkit or ROCm at build or run time.
//!
//! Data flow: `python/rules.py` (what to compile) → `python/compile.py` (images + metadata) →
//! [`archive`] (packed by the build script) → embedded, or read from `AOTRITON_IMAGE_DIR` and
//! loaded lazily → dispatch (functional, divisibility, heuristic) → the stream's runtime, CUDA or
//! HIP (load once per device, launch).
//!
//! # Kernels and cargo features
//!
//! The kernels come in per-arch image crates, embedded into the library by cargo feature:
//!
//! | feature | crate | GPUs |
//! |---|---|---|
//! | `sm90` (default) | `aotriton-images-sm90` (+ `-part2`) | H100, H200 |
//! | `sm80` | `aotriton-images-sm80` (+ `-part2`) | A100, and sm_86/sm_87/sm_89 (binary compatible) |
//! | `gfx942` | `aotriton-images-gfx942` | MI300X, MI300A |
//! | `gfx90a` | `aotriton-images-gfx90a` | MI200 |
//! | `gfx950` | `aotriton-images-gfx950` | MI350 |
//!
//! So `cargo add aotriton` gives working kernels on an H100/H200 with nothing but crates.io.
//! Other choices: `no-images` embeds nothing (archives are read at run time from
//! `AOTRITON_IMAGE_DIR`, or else from the directory `AOTRITON_DEFAULT_IMAGE_DIR` named at build
//! time, each checked as README "Security" says); `build-kernels` compiles the kernels from
//! source instead (CMake, Python, the pinned Triton from PyPI; ~10 min per arch, steps shown as
//! cargo warnings); `cudarc-adapters` adds [`interop`]; `cli` builds the `aotriton-info` tool.
//! [`available_archs`], [`image_source`] and [`device_support`] say at run time what a build
//! carries and whether it serves a device.
//!
//! # Raw device addresses
//!
//! Tensors are [`TensorView`]s: device addresses with sizes and strides, which the operators
//! read and write on the caller's stream. The library checks what it can (shapes, strides,
//! alignment, overlaps between the call's own tensors, sizes against 32-bit kernel offsets) but
//! cannot know whether an address range is memory the caller owns: the caller vouches that each
//! view's range is device memory of the stream's device, live until the call's work on the
//! stream has finished, and that outputs are not read or written by anything else meanwhile.
//! A wrong address is a GPU memory fault or, worse, a silent write into other memory of the
//! process. The entry points are safe `fn`s today; making them `unsafe fn` with this contract as
//! their `# Safety` section is planned for the next breaking release, with the safe
//! [`interop`] constructors as the checked path.
//!
//! # Examples
//!
//! A causal GQA forward (the GPU runnable examples are in `examples/`: `attn_fwd`, `attn_bwd`
//! with its workspace, `varlen`, `dropout`):
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
#![warn(missing_docs)]
pub mod archive;
mod dispatch;
mod driver;
mod error;
pub mod flash;
mod images;
mod support;
mod tensor;
mod tma;

/// The kernarg layout of the runtime's argument plan, for the AMD code-object checks
/// (`test/amd/tests/code_objects.rs`); not a stable API.
#[doc(hidden)]
pub mod abi {
    pub use crate::dispatch::{KernargLayout, KernargSlot, kernarg_layout};
}

// The adapters live behind the driver seam with the rest of what names a vendor.
#[cfg(feature = "cudarc-adapters")]
pub use driver::cudarc_interop as interop;

/// The tuning database's switches. For the tuner (python/tune.py, through the C++ API's
/// `aotriton::tuning::force_kernel`): force one compiled kernel, by id, while timing the
/// candidates of a tuning build (process-wide; not for production calls). For the benchmark and
/// for users: `use_database(false)` makes dispatch take the heuristic's pick everywhere.
pub mod tuning {
    pub use crate::dispatch::{database_in_use, force_kernel, forced_count, forced_kernel, use_database};
}
/// What the runtime has done so far, for tests and diagnostics.
pub mod diagnostics {
    pub use crate::dispatch::kernels_loaded;
}
pub use driver::{Runtime, Stream, library_present};
pub use error::{Error, ErrorKind, Result};
pub use images::{ImageSource, available_archs, built_archs, image_source, with_archive};
pub use support::{DeviceSupport, device_support};
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
