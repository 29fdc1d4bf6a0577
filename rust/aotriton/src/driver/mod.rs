//! The driver seam: everything the runtime asks of a GPU vendor's driver, behind one interface.
//!
//! Dispatch and the operators see only this module's types: a [`Stream`] that says which runtime
//! it belongs to, the [`StreamContext`] of a call (the stream's device made current, its
//! [`DeviceInfo`] and a module-cache key), and the context's four operations: load a kernel from
//! an image (with its dynamic shared memory set up), launch it with a parameter array, encode a
//! TMA descriptor (CUDA only), and nothing else. Each vendor lives in its own module, layered as
//! raw entry points → checked results naming the call → this safe surface:
//!
//! - [`cuda`]: the CUDA driver API through libloading (`libcuda.so.1`; cudarc provides the types).
//! - [`hip`]: the HIP runtime through libloading (`libamdhip64.so`, `.so.7`, `.so.6`, `.so.5`, or
//!   the file named by `AOTRITON_HIP_LIBRARY`).
//!
//! - [`cudarc_interop`] (feature `cudarc-adapters`, public as `aotriton::interop`): cudarc's
//!   streams and device memory as [`Stream`] and [`TensorView`](crate::TensorView).
//!
//! No CUDA or HIP name appears outside these files. Neither library is needed to build the
//! crate; without one, every call on a stream of that runtime returns
//! [`ErrorKind::NoDriver`](crate::ErrorKind::NoDriver), and with the library but no device,
//! [`ErrorKind::NoDevice`](crate::ErrorKind::NoDevice). Each library is opened once per process
//! and every entry point the runtime calls is resolved then: a missing required one is `NoDriver`
//! naming it (never a panic on first use); a missing optional one disables only what needs it
//! (CUDA before 12.0: no TMA descriptors, hence no Gluon kernels; no context ids, see below).
//!
//! Loaded modules and their lifetime: a kernel is loaded once per [`ModuleScope`] and kept for
//! the life of the process (modules are never unloaded; aotriton has no reset API).
//! - CUDA: the scope is the stream's context, named by `cuCtxGetId` (CUDA 12.0+), an id the
//!   driver never hands out twice in a process. A context destroyed and re-created (a
//!   `cudaDeviceReset`, `cuDevicePrimaryCtxReset`, `cuCtxDestroy` + `cuCtxCreate`) is a new scope
//!   and its kernels are loaded again, even when it gets the old context's address. The entries of
//!   destroyed contexts stay in the cache (a few hundred bytes per kernel), never used again.
//!   Drivers before 12.0 have no context id: there the scope is the context's address, which the
//!   driver may reuse for a new context, and the cached functions of the destroyed one would be
//!   launched in it (an error at best). Do not destroy and re-create contexts that aotriton has
//!   launched in on such drivers.
//! - HIP: the scope is the device ordinal. HIP exposes nothing that identifies a lifetime of a
//!   device's primary context (`hipDevicePrimaryCtxGetState` says only whether it is active), so
//!   a `hipDeviceReset` (or `hipDevicePrimaryCtxReset`), which unloads the device's modules,
//!   leaves stale functions in the cache: do not reset a device that aotriton has launched on.
mod cuda;
#[cfg(feature = "cudarc-adapters")]
pub mod cudarc_interop;
mod hip;

use std::ffi::c_void;
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};
use crate::tma::TmaEncode;

/// The entry points of a vendor library opened at `path`: a missing required one is `NoDriver`
/// naming the library, the entry point and what the library should have been (`expected`, e.g.
/// "the NVIDIA driver").
struct Symbols<'a> {
    library: &'a libloading::Library,
    path: &'a str,
    expected: &'static str,
}

impl Symbols<'_> {
    /// Entry point `name` as the function type `F`.
    ///
    /// # Safety
    /// `F` must be the vendor header's declaration of `name`.
    unsafe fn required<F: Copy>(&self, name: &str) -> Result<F> {
        // SAFETY: the caller vouches for the type; libloading appends the NUL.
        match unsafe { self.library.get::<F>(name.as_bytes()) } {
            Ok(symbol) => Ok(*symbol),
            Err(e) => Err(Error::new(
                ErrorKind::NoDriver,
                format!("{} lacks {name} (not {}, or an older one): {e}", self.path, self.expected),
            )),
        }
    }

    /// Entry point `name` as `F`, or `None` where this version of the library lacks it.
    ///
    /// # Safety
    /// As [`Symbols::required`].
    unsafe fn optional<F: Copy>(&self, name: &str) -> Option<F> {
        // SAFETY: as above.
        unsafe { self.library.get::<F>(name.as_bytes()) }.ok().map(|symbol| *symbol)
    }
}

/// Which GPU runtime a stream belongs to.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Runtime {
    /// NVIDIA: the stream is a `CUstream` / `cudaStream_t`.
    #[default]
    Cuda = 0,
    /// AMD: the stream is a `hipStream_t`.
    Hip = 1,
}

impl Runtime {
    /// The runtime of a C API value (`0` CUDA, `1` HIP), `None` for any other.
    pub fn from_raw(raw: i32) -> Option<Runtime> {
        match raw {
            0 => Some(Runtime::Cuda),
            1 => Some(Runtime::Hip),
            _ => None,
        }
    }

    /// "CUDA" / "HIP", for messages.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Cuda => "CUDA",
            Runtime::Hip => "HIP",
        }
    }
}

/// A caller's GPU stream, passed through untouched, with the runtime it belongs to. The null
/// handle means that runtime's default (null) stream on the calling thread's current device or
/// context. The device is always taken from the stream.
///
/// # Safety contract
///
/// The constructors are safe functions, but the handle is given to the driver as it is and the
/// operators write through the device addresses in their parameters, which the runtime cannot
/// check. The caller guarantees, for every call that takes the stream:
/// - the handle is 0 or a live stream of that runtime (a `CUstream` / `cudaStream_t` for
///   [`Stream::cuda`] and [`Stream::from_raw`], a `hipStream_t` for [`Stream::hip`]), not destroyed
///   before the call returns; a dangling or foreign handle may crash the driver rather than
///   give an error;
/// - every pointer in the parameters is a device address of that stream's device (or one it can
///   access), valid for the whole extent the tensor views describe until the enqueued kernels
///   have finished; with unified or HMM memory a wrong address can be host memory, and the
///   kernels will write it.
///
/// Everything else (shapes, strides, dtypes, alignment, sizes against the kernels' limits) is
/// validated, and a bad value is an error before anything is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stream {
    runtime: Runtime,
    raw: usize,
}

impl Stream {
    /// A CUDA stream (`CUstream` / `cudaStream_t`, e.g. `torch.cuda.current_stream().cuda_stream`).
    pub fn cuda(raw: usize) -> Self {
        Stream {
            runtime: Runtime::Cuda,
            raw,
        }
    }
    /// A HIP stream (`hipStream_t`); 0 is HIP's null stream.
    pub fn hip(raw: usize) -> Self {
        Stream {
            runtime: Runtime::Hip,
            raw,
        }
    }
    /// A CUDA stream: the constructor of versions before HIP was wired up, kept as it was.
    pub fn from_raw(raw: usize) -> Self {
        Stream::cuda(raw)
    }
    /// The CUDA legacy default stream of the calling thread's current context.
    pub fn null() -> Self {
        Stream::cuda(0)
    }
    /// The stream handle as given (`CUstream`/`cudaStream_t` or `hipStream_t`).
    pub fn raw(self) -> usize {
        self.raw
    }
    /// The runtime the handle belongs to.
    pub fn runtime(self) -> Runtime {
        self.runtime
    }
}

/// What the runtime needs to know about a device, read once per device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceInfo {
    pub runtime: Runtime,
    pub ordinal: i32,
    /// `sm_90`, `gfx942`, ...: the key of the device's kernel archive.
    pub arch: String,
    /// The full target the device reports, e.g. `gfx942:sramecc+:xnack-` (= `arch` on CUDA).
    pub target_id: String,
    pub multiprocessors: u32,
    /// Largest dynamic shared memory (LDS on AMD) one block may use.
    pub max_shared: u32,
    /// Threads per warp (wavefront on AMD).
    pub warp_size: u32,
}

/// Launch geometry of one kernel call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaunchDims {
    pub grid: [u32; 3],
    pub threads: u32,
    pub shared: u32,
}

/// A host TMA descriptor (`CUtensorMap`: 128 bytes, 64-byte aligned), passed to kernels by value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
pub(crate) struct TensorMap {
    pub opaque: [u64; 16],
}

/// An all-zero map, to fill fixed-size storage before encoding.
pub(crate) const EMPTY_TENSOR_MAP: TensorMap = TensorMap { opaque: [0; 16] };

/// A kernel loaded on one device (module and function handles of its runtime). Modules are never
/// unloaded: they live as long as the process (or until their context is destroyed by its owner).
#[derive(Debug)]
pub(crate) struct LoadedFunction {
    runtime: Runtime,
    handle: usize,
}

/// The vendor half of a [`StreamContext`]: what makes the stream's device current for the call
/// (held for its `Drop`, which restores the caller's).
enum Current {
    Cuda { _pushed: cuda::PushedContext },
    Hip { _device: hip::CurrentDevice },
}

/// Where a loaded module lives, as the module cache keys it (see the module docs: loaded
/// modules and their lifetime).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ModuleScope {
    /// A CUDA context by its `cuCtxGetId` id (CUDA 12.0+), never reused in a process.
    CudaContextId(u64),
    /// A CUDA context by its address, on drivers without `cuCtxGetId`.
    CudaContextAddress(usize),
    /// A HIP device by ordinal.
    HipDevice(i32),
}

/// The stream's device made current for the guard's lifetime, so that module loads and launches
/// happen on the stream's device whatever the calling thread had current.
pub(crate) struct StreamContext {
    pub device: Arc<DeviceInfo>,
    stream: Stream,
    module_scope: ModuleScope,
    _current: Current,
}

impl StreamContext {
    pub fn enter(stream: Stream) -> Result<StreamContext> {
        match stream.runtime {
            Runtime::Cuda => {
                let (current, scope, device) = cuda::enter(stream.raw)?;
                Ok(StreamContext {
                    device,
                    stream,
                    module_scope: scope,
                    _current: Current::Cuda { _pushed: current },
                })
            }
            Runtime::Hip => {
                let (current, device) = hip::enter(stream.raw)?;
                let scope = ModuleScope::HipDevice(device.ordinal);
                Ok(StreamContext {
                    device,
                    stream,
                    module_scope: scope,
                    _current: Current::Hip { _device: current },
                })
            }
        }
    }

    /// A key under which a kernel loaded in this context can be found again by later calls on
    /// the same device (CUDA: per context; HIP: per device).
    pub fn cache_key(&self) -> ModuleScope {
        self.module_scope
    }

    /// Whether [`encode_tensor_map`](Self::encode_tensor_map) can work here: a CUDA driver with
    /// `cuTensorMapEncodeTiled` (12.0+). Kernels that take TMA descriptors need it.
    pub fn tensor_maps_available(&self) -> bool {
        self.stream.runtime == Runtime::Cuda && cuda::tensor_maps_available()
    }

    /// Loads `image` (a cubin or hsaco) onto the stream's device, finds `symbol` in it and makes
    /// `shared` bytes of dynamic shared memory (LDS) available to its launches. `label` names the
    /// kernel in errors.
    pub fn load_function(
        &self,
        image: &[u8],
        symbol: &str,
        shared: u32,
        label: &str,
    ) -> Result<LoadedFunction> {
        let device = &self.device;
        if shared > device.max_shared {
            return Err(Error::new(
                ErrorKind::KernelNotFound,
                format!(
                    "kernel {label} needs {shared} bytes of shared memory; device {} ({}) allows {}",
                    device.ordinal, device.arch, device.max_shared
                ),
            ));
        }
        let handle = match self.stream.runtime {
            Runtime::Cuda => cuda::load_function(image, symbol, shared, device, label)?,
            Runtime::Hip => hip::load_function(image, symbol, device, label)?,
        };
        Ok(LoadedFunction {
            runtime: self.stream.runtime,
            handle,
        })
    }

    /// Enqueues `function` on the stream. `params` points at each kernel parameter's value in
    /// ABI order (the driver reads each one's size from the kernel's own metadata).
    pub fn launch(
        &self,
        function: &LoadedFunction,
        dims: LaunchDims,
        params: &mut [*mut c_void],
        label: &str,
    ) -> Result<()> {
        if function.runtime != self.stream.runtime {
            return Err(Error::new(
                ErrorKind::Internal,
                format!("kernel {label} was loaded by another runtime"),
            ));
        }
        match self.stream.runtime {
            Runtime::Cuda => cuda::launch(function.handle, dims, self.stream.raw, params, label),
            Runtime::Hip => hip::launch(function.handle, dims, self.stream.raw, params, label),
        }
    }

    /// Encodes a tiled TMA descriptor (a host-only call). TMA is an NVIDIA (sm_90) feature: on
    /// another runtime this is an error (the Gluon backend, its only user, is sm_90-only).
    pub fn encode_tensor_map(
        &self,
        map: &mut TensorMap,
        e: &TmaEncode,
        label: impl FnOnce() -> String,
    ) -> Result<()> {
        match self.stream.runtime {
            Runtime::Cuda => cuda::encode_tensor_map(map, e, label),
            Runtime::Hip => Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "{}: TMA descriptors exist on NVIDIA GPUs only, not on {}",
                    label(),
                    self.device.arch
                ),
            )),
        }
    }
}

/// Whether the driver library of `runtime` can be loaded on this machine (tests use it to know
/// which error a call without a device should give).
pub fn library_present(runtime: Runtime) -> bool {
    match runtime {
        Runtime::Cuda => cuda::library_present(),
        Runtime::Hip => hip::library_present(),
    }
}

/// Whether a device target (`gfx942:sramecc+:xnack-`) can run images compiled for `image`
/// (`gfx942`, or `gfx942:xnack+` when built for one setting). The processor must be the same;
/// each target feature the image was built for (`+`/`-`) must match the device's setting, and a
/// feature the image leaves unspecified runs under either. Returns the reason when not.
pub(crate) fn target_compatible(device: &str, image: &str) -> Result<(), String> {
    // Allocation-free unless refusing: the launch path calls this on every call.
    let mut image_parts = image.split(':');
    let (device_arch, image_arch) = (base_arch(device), image_parts.next().unwrap_or(""));
    if device_arch != image_arch {
        return Err(format!("the device is {device_arch}, the images are for {image_arch}"));
    }
    for feature in image_parts {
        let name = feature.trim_end_matches(['+', '-']);
        let on_device = device.split(':').skip(1).find(|f| f.trim_end_matches(['+', '-']) == name);
        match on_device {
            Some(setting) if setting == feature => {}
            Some(setting) => {
                return Err(format!("the images are built for {feature}, the device runs with {setting} ({device})"));
            }
            None => return Err(format!("the images are built for {feature}, the device ({device}) does not say")),
        }
    }
    Ok(())
}

/// `gfx942:sramecc+:xnack-` → `gfx942`.
pub(crate) fn base_arch(target_id: &str) -> &str {
    target_id.split(':').next().unwrap_or(target_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_carry_their_runtime() {
        assert_eq!(Stream::from_raw(0x10).runtime(), Runtime::Cuda);
        assert_eq!(Stream::from_raw(0x10), Stream::cuda(0x10));
        assert_eq!(Stream::null(), Stream::cuda(0));
        let hip = Stream::hip(0x10);
        assert_eq!((hip.runtime(), hip.raw()), (Runtime::Hip, 0x10));
        assert_ne!(
            hip,
            Stream::cuda(0x10),
            "the same handle of two runtimes is two streams"
        );
        assert_eq!(Runtime::from_raw(1), Some(Runtime::Hip));
        assert_eq!(Runtime::from_raw(2), None);
    }

    #[test]
    fn target_ids() {
        assert_eq!(base_arch("gfx942:sramecc+:xnack-"), "gfx942");
        assert_eq!(base_arch("gfx90a"), "gfx90a");
        assert!(
            target_compatible("gfx942:sramecc+:xnack-", "gfx942").is_ok(),
            "images for any setting"
        );
        assert!(target_compatible("gfx942", "gfx942").is_ok());
        assert!(target_compatible("gfx942:sramecc+:xnack-", "gfx942:xnack-").is_ok());
        let e = target_compatible("gfx942:sramecc+:xnack-", "gfx942:xnack+").unwrap_err();
        assert!(e.contains("xnack+") && e.contains("xnack-"), "{e}");
        let e = target_compatible("gfx90a:sramecc-:xnack-", "gfx942").unwrap_err();
        assert!(e.contains("gfx90a") && e.contains("gfx942"), "{e}");
        assert!(
            target_compatible("gfx942", "gfx942:sramecc+").is_err(),
            "a device that does not report the feature"
        );
        assert!(target_compatible("gfx9420", "gfx942").is_err());
    }
}
