//! aotriton: FlashAttention kernels written in Triton, compiled ahead of time into GPU images
//! that are packed into archives and launched through the GPU driver. Users need only a driver.
//!
//! Data flow: `python/rules.py` (what to compile) → `python/compile.py` (images + metadata) →
//! [`archive`] (packed by the build script) → [`images`] (embedded, loaded lazily) →
//! `dispatch` (functional, divisibility, heuristic) → `driver` (load once per context, launch).
//!
//! ```no_run
//! use aotriton::{DType, Stream, TensorView, flash};
//! # let (q, k, v, o, lse) = (0u64, 0u64, 0u64, 0u64, 0u64);
//! let (b, h, s, d) = (2, 8, 1024, 128);
//! let t = |ptr| TensorView::contiguous(ptr, [b, h, s, d], DType::BF16);
//! let lse = TensorView::contiguous(lse, [b, h, s], DType::F32);
//! let mut params = flash::FwdParams::new(t(q), t(k), t(v), t(o), lse);
//! params.causal = true;
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

pub use driver::Stream;
pub use error::{Error, ErrorKind, Result};
pub use images::built_archs;
pub use tensor::{DType, TensorView};
