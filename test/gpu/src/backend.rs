//! The backend the suites run against (`--backend auto|portable|gluon`), what the Gluon backend
//! is expected to serve (the documented dispatch rule, restated here so a wrong refusal or a
//! wrong acceptance fails a case), and the backward workspace.
//!
//! With `--backend gluon` every call is forced onto the Gluon kernels: a case the rule says Gluon
//! serves must run there and pass the same checks as on the portable backend; a case it does not
//! serve must be refused with `UnsupportedByBackend`, leaving its outputs untouched.
use std::sync::OnceLock;

use aotriton::flash::{self, Backend, BwdParams, Workspace};
use aotriton::{DType, ErrorKind, Stream};
use cudarc::driver::{result, sys};

static BACKEND: OnceLock<Backend> = OnceLock::new();

pub(crate) fn set(backend: Backend) {
    let _ = BACKEND.set(backend);
}

/// The backend every call of this run asks for.
pub(crate) fn get() -> Backend {
    BACKEND.get().copied().unwrap_or(Backend::Auto)
}

/// The backend `--backend` named, if it was given.
pub(crate) fn explicit() -> Option<Backend> {
    BACKEND.get().copied()
}

pub(crate) fn forced_gluon() -> bool {
    get() == Backend::Gluon
}

pub(crate) fn parse(name: &str) -> Option<Backend> {
    match name {
        "auto" => Some(Backend::Auto),
        "portable" => Some(Backend::Portable),
        "gluon" => Some(Backend::Gluon),
        _ => None,
    }
}

pub(crate) fn name(backend: Backend) -> &'static str {
    match backend {
        Backend::Auto => "auto",
        Backend::Portable => "portable",
        Backend::Gluon => "gluon",
        _ => "unknown",
    }
}

/// What decides whether the Gluon backend serves a call (module docs of `aotriton::flash`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Traits {
    pub dtype: DType,
    pub head_dim: usize,
    /// Every tensor meets TMA's rules: 16-byte aligned base, strides of 16-byte multiples.
    pub tma_layout: bool,
    /// Bias, logit soft-capping, ALiBi, sinks or V's own head dim (packed batches are served:
    /// ragged descriptors; dropout: the portable kernels' masks).
    pub features: bool,
}

impl Traits {
    /// Both passes serve the head-dim buckets 64, 128 and 256.
    pub(crate) fn gluon_serves(&self) -> bool {
        matches!(self.dtype, DType::F16 | DType::BF16) && !self.features && self.tma_layout && self.head_dim <= 256
    }
}

/// A device allocation the backward uses as its workspace, poisoned (0xFF bytes = NaN) so a
/// kernel that reads what it did not write shows up.
pub(crate) struct WorkspaceBuf {
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl WorkspaceBuf {
    pub(crate) fn workspace(&self) -> Workspace {
        Workspace { ptr: self.ptr, bytes: self.bytes as u64 }
    }
}

impl Drop for WorkspaceBuf {
    fn drop(&mut self) {
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Asks `attn_bwd_workspace_bytes` what the call needs on this stream, allocates and poisons it,
/// and attaches it to `p`. `None` when the backend the call will use needs none.
pub(crate) fn attach_workspace(p: &mut BwdParams, stream: sys::CUstream) -> Result<Option<WorkspaceBuf>, String> {
    let bytes = flash::attn_bwd_workspace_bytes(p, Stream::from_raw(stream as usize))
        .map_err(|e| format!("attn_bwd_workspace_bytes: {e}"))? as usize;
    if bytes == 0 {
        p.workspace = None;
        return Ok(None);
    }
    let ptr = unsafe { result::malloc_sync(bytes) }.map_err(|e| format!("cuMemAlloc({bytes}): {e:?}"))?;
    let buf = WorkspaceBuf { ptr, bytes };
    unsafe { result::memset_d8_async(ptr, 0xFF, bytes, stream) }.map_err(|e| format!("cuMemsetD8Async: {e:?}"))?;
    p.workspace = Some(buf.workspace());
    Ok(Some(buf))
}

/// The check of a call the forced backend must refuse: `UnsupportedByBackend`, with a message.
/// Returns a note for the case line, or the problem.
pub(crate) fn expect_refusal(what: &str, got: aotriton::Result<()>) -> Result<String, String> {
    match got {
        Err(e) if e.kind() == ErrorKind::UnsupportedByBackend && !e.message().is_empty() => {
            Ok(format!("{what} refused by gluon ({})", e.message()))
        }
        Err(e) => Err(format!("{what}: expected UnsupportedByBackend, got {:?}: {e}", e.kind())),
        Ok(()) => Err(format!("{what}: gluon accepted a call the dispatch rule says it cannot serve")),
    }
}
