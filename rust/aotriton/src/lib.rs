//! aotriton: FlashAttention kernels written in Triton, compiled ahead of time into GPU images
//! that are packed into archives and launched through the GPU driver. Users need only a driver.
//!
//! Data flow: `python/rules.py` (what to compile) → `python/compile.py` (images + metadata) →
//! [`archive`] (packed by the build script) → [`images`] (embedded, loaded lazily) →
//! `dispatch` (functional, divisibility, heuristic) → `driver` (load once per context, launch).
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

pub use driver::Stream;
pub use error::{Error, ErrorKind, Result};
pub use images::built_archs;
pub use tensor::{DType, TensorView};
