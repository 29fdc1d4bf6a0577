//! GPU driver access. Layered like cudarc: the raw `sys` bindings (cudarc's, loaded at run time),
//! `cuda::check` turning each raw call into a `Result` that names the call, and the small safe
//! surface the rest of the runtime uses (device of a stream, modules, launches).
//!
//! Only NVIDIA's driver is wired up so far; AMD images are compiled and packed but not launched.
pub mod cuda;

/// A caller's GPU stream (`CUstream`), passed through untouched. The null stream means the
/// legacy default stream of the current context. The device is always taken from the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stream(usize);

impl Stream {
    /// Wraps a raw `CUstream` handle (e.g. `torch.cuda.current_stream().cuda_stream`).
    pub fn from_raw(raw: usize) -> Self {
        Stream(raw)
    }
    /// The legacy default stream of the calling thread's current context.
    pub fn null() -> Self {
        Stream(0)
    }
    pub fn raw(self) -> usize {
        self.0
    }
}
