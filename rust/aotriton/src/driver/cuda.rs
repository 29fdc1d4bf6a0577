//! The CUDA driver, loaded at run time through cudarc (`dynamic-loading`): the crate builds with
//! no CUDA installed and, with no driver present, every entry point returns `NoDriver`.
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;

use super::Stream;
use crate::error::{Error, ErrorKind, Result};

/// Turns a raw driver status into a Result naming the call (`what`) and the driver's error.
pub(crate) fn check(rc: sys::CUresult, what: impl FnOnce() -> String) -> Result<()> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::Driver, format!("{} failed: {rc:?}", what())))
    }
}

/// Loads the driver library and runs `cuInit` once per process. cudarc panics when libcuda is
/// missing, so its presence is probed first; the outcome (success or the error) is remembered.
pub(crate) fn init() -> Result<()> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: only tries to dlopen the candidate library names.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::new(
                ErrorKind::NoDriver,
                "the CUDA driver library (libcuda.so.1) was not found: this machine has no NVIDIA driver",
            ));
        }
        // SAFETY: plain driver calls with valid out-pointers.
        unsafe {
            let mut version = 0;
            check(sys::cuDriverGetVersion(&mut version), || "cuDriverGetVersion".into())?;
            check(sys::cuInit(0), || format!("cuInit (driver API {version})"))
        }
    })
    .clone()
}

/// What the runtime needs to know about a device, read once per device.
#[derive(Debug, Clone)]
pub(crate) struct DeviceInfo {
    pub ordinal: i32,
    /// `sm_90`, `sm_80`, ...: the key of the device's kernel archive.
    pub arch: String,
    pub multiprocessors: u32,
    /// Largest dynamic shared memory a block may opt in to.
    pub max_shared_optin: u32,
}

/// The stream's context made current for the guard's lifetime, so that module loads and
/// launches happen on the stream's device whatever the calling thread had current.
pub(crate) struct StreamContext {
    pub context: sys::CUcontext,
    pub device: Arc<DeviceInfo>,
    _pushed: PushedContext,
}

impl StreamContext {
    pub fn enter(stream: Stream) -> Result<StreamContext> {
        init()?;
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the driver checks the caller's stream handle.
        unsafe {
            check(sys::cuStreamGetCtx(stream.raw() as sys::CUstream, &mut context), || {
                format!(
                    "cuStreamGetCtx(stream {:#x}) (is the stream valid, and for the null stream, is a context current?)",
                    stream.raw()
                )
            })?;
        }
        let pushed = PushedContext::push(context)?;
        let mut ordinal = 0;
        // SAFETY: a context is current (pushed above).
        unsafe { check(sys::cuCtxGetDevice(&mut ordinal), || "cuCtxGetDevice".into())? };
        Ok(StreamContext { context, device: device_info(ordinal)?, _pushed: pushed })
    }
}

struct PushedContext;

impl PushedContext {
    fn push(context: sys::CUcontext) -> Result<PushedContext> {
        // SAFETY: the context came from the driver for the caller's stream.
        unsafe { check(sys::cuCtxPushCurrent_v2(context), || "cuCtxPushCurrent".into())? };
        Ok(PushedContext)
    }
}

impl Drop for PushedContext {
    fn drop(&mut self) {
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context pushed in `push`. A failure cannot be reported from Drop and
        // leaves nothing to clean up.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    }
}

/// Read once per device; later calls share it (no allocation on the launch path).
fn device_info(ordinal: i32) -> Result<Arc<DeviceInfo>> {
    static DEVICES: OnceLock<Mutex<HashMap<i32, Arc<DeviceInfo>>>> = OnceLock::new();
    let devices = DEVICES.get_or_init(Default::default);
    if let Some(info) = lock(devices).get(&ordinal) {
        return Ok(info.clone());
    }
    let attr = |attribute: sys::CUdevice_attribute| -> Result<i32> {
        let mut value = 0;
        // SAFETY: valid out-pointer and device ordinal from the driver.
        unsafe {
            check(sys::cuDeviceGetAttribute(&mut value, attribute, ordinal), || {
                format!("cuDeviceGetAttribute({attribute:?}, device {ordinal})")
            })?
        };
        Ok(value)
    };
    use sys::CUdevice_attribute as A;
    let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let info = Arc::new(DeviceInfo {
        ordinal,
        arch: format!("sm_{major}{minor}"),
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
        max_shared_optin: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as u32,
    });
    lock(devices).insert(ordinal, info.clone());
    Ok(info)
}

/// A kernel loaded into one context. Modules are never unloaded: they live as long as the
/// process (or until the context is destroyed by its owner).
#[derive(Debug)]
pub(crate) struct LoadedFunction {
    pub function: sys::CUfunction,
}

// SAFETY: CUfunction handles may be used from any thread once loaded.
unsafe impl Send for LoadedFunction {}
unsafe impl Sync for LoadedFunction {}

/// Loads `image` into the current context and opts the function in to `shared` bytes of dynamic
/// shared memory when that exceeds the 48 KiB default. `label` names the kernel in errors.
pub(crate) fn load_function(
    image: &[u8],
    symbol: &str,
    shared: u32,
    device: &DeviceInfo,
    label: &str,
) -> Result<LoadedFunction> {
    if shared > device.max_shared_optin {
        return Err(Error::new(
            ErrorKind::KernelNotFound,
            format!(
                "kernel {label} needs {shared} bytes of shared memory; device {} ({}) allows {}",
                device.ordinal, device.arch, device.max_shared_optin
            ),
        ));
    }
    let symbol_c = CString::new(symbol)
        .map_err(|_| Error::new(ErrorKind::BadArchive, format!("kernel {label}: symbol has a NUL byte")))?;
    let mut module: sys::CUmodule = std::ptr::null_mut();
    let mut function: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: `image` is a complete cubin (checksummed by the archive); out-pointers are valid.
    unsafe {
        check(sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void), || {
            format!("cuModuleLoadData({label}) on device {} ({})", device.ordinal, device.arch)
        })?;
        check(sys::cuModuleGetFunction(&mut function, module, symbol_c.as_ptr()), || {
            format!("cuModuleGetFunction({label}, {symbol})")
        })?;
        if shared > 48 * 1024 {
            check(
                sys::cuFuncSetAttribute(
                    function,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared as i32,
                ),
                || format!("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={shared}, {label})"),
            )?;
        }
    }
    Ok(LoadedFunction { function })
}

/// Launch geometry of one kernel call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaunchDims {
    pub grid: [u32; 3],
    pub threads: u32,
    pub shared: u32,
}

/// Enqueues `function` on `stream`. `params` points at each argument's value in ABI order.
pub(crate) fn launch(
    function: &LoadedFunction,
    dims: LaunchDims,
    stream: Stream,
    params: &mut [*mut c_void],
    label: &str,
) -> Result<()> {
    // SAFETY: the parameter list was built from the kernel's own metadata (count, order, sizes).
    unsafe {
        check(
            sys::cuLaunchKernel(
                function.function,
                dims.grid[0],
                dims.grid[1],
                dims.grid[2],
                dims.threads,
                1,
                1,
                dims.shared,
                stream.raw() as sys::CUstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
            || format!("cuLaunchKernel({label}, grid {:?}, {} threads, {} B shared)", dims.grid, dims.threads, dims.shared),
        )
    }
}

/// Locks a cache mutex. A panic while the lock was held cannot leave these maps half-updated
/// (inserts are single calls), so a poisoned lock is still safe to use.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A `CUtensorMap` (128 bytes, 64-byte aligned), passed to kernels by value.
pub(crate) type TensorMap = sys::CUtensorMap;

/// An all-zero map, to fill fixed-size storage before encoding.
pub(crate) const EMPTY_TENSOR_MAP: TensorMap = sys::CUtensorMap { opaque: [0; 16] };

fn tensor_map_data_type(raw: u32) -> Option<sys::CUtensorMapDataType> {
    use sys::CUtensorMapDataType as T;
    Some(match raw {
        0 => T::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        1 => T::CU_TENSOR_MAP_DATA_TYPE_UINT16,
        2 => T::CU_TENSOR_MAP_DATA_TYPE_UINT32,
        3 => T::CU_TENSOR_MAP_DATA_TYPE_INT32,
        4 => T::CU_TENSOR_MAP_DATA_TYPE_UINT64,
        5 => T::CU_TENSOR_MAP_DATA_TYPE_INT64,
        6 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        7 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        8 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
        9 => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        10 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ,
        11 => T::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
        12 => T::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ,
        _ => return None,
    })
}

fn tensor_map_swizzle(raw: u32) -> Option<sys::CUtensorMapSwizzle> {
    use sys::CUtensorMapSwizzle as S;
    Some(match raw {
        0 => S::CU_TENSOR_MAP_SWIZZLE_NONE,
        1 => S::CU_TENSOR_MAP_SWIZZLE_32B,
        2 => S::CU_TENSOR_MAP_SWIZZLE_64B,
        3 => S::CU_TENSOR_MAP_SWIZZLE_128B,
        _ => return None,
    })
}

/// Encodes a tiled TMA descriptor into `map` with `cuTensorMapEncodeTiled` (a host-only call:
/// no device work, no allocation, no sync). Interleave none, L2 promotion 128 B, out-of-bounds
/// elements read as zeros. `label` names the kernel and argument in errors.
pub(crate) fn encode_tensor_map(map: &mut TensorMap, e: &crate::tma::TmaEncode, label: impl FnOnce() -> String) -> Result<()> {
    let (Some(data_type), Some(swizzle)) = (tensor_map_data_type(e.data_type), tensor_map_swizzle(e.swizzle)) else {
        return Err(Error::new(
            ErrorKind::BadArchive,
            format!("{}: TMA data type {} / swizzle {} unknown to this runtime", label(), e.data_type, e.swizzle),
        ));
    };
    // SAFETY: every array holds at least `rank` entries (rank ≤ 5, checked by the archive
    // reader), `map` is a 64-byte aligned 128-byte CUtensorMap, and the driver only writes it.
    let rc = unsafe {
        sys::cuTensorMapEncodeTiled(
            map,
            data_type,
            e.rank,
            e.address as *mut c_void,
            e.global_dim.as_ptr(),
            e.global_strides.as_ptr(),
            e.box_dim.as_ptr(),
            e.element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    check(rc, || {
        format!(
            "cuTensorMapEncodeTiled({}: rank {}, dims {:?}, byte strides {:?}, box {:?}, swizzle {})",
            label(),
            e.rank,
            &e.global_dim[..e.rank as usize],
            &e.global_strides[..(e.rank as usize).saturating_sub(1)],
            &e.box_dim[..e.rank as usize],
            e.swizzle
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{DType, TensorView};
    use crate::tma::{TensorArg, encode_params};

    /// The cost of one descriptor encode (a Gluon forward encodes 4 per call, the backward 9).
    /// Needs a driver and a GPU:
    /// `cargo test -p aotriton --release -- --ignored tensor_map_encode_cost --nocapture`.
    #[test]
    #[ignore = "needs the CUDA driver and a GPU"]
    fn tensor_map_encode_cost() {
        if let Err(e) = init() {
            eprintln!("skipped: {e}");
            return;
        }
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; device 0.
        unsafe { check(sys::cuDevicePrimaryCtxRetain(&mut context, 0), || "cuDevicePrimaryCtxRetain".into()).unwrap() };
        let _pushed = PushedContext::push(context).unwrap();
        let meta = crate::archive::TensorDescMeta { block_size: vec![1, 1, 128, 64], swizzle: 3, elem_type: 10, elem_size: 2, fp4_padded: false };
        let t = TensorArg::from_view(&TensorView::contiguous(0x7f00_0000_0000, [4, 16, 4096, 128], DType::BF16));
        let mut map = EMPTY_TENSOR_MAP;
        let n = 100_000;
        let start = std::time::Instant::now();
        for _ in 0..n {
            let e = encode_params(std::hint::black_box(&t), &meta).unwrap();
            encode_tensor_map(&mut map, &e, || "bench".into()).unwrap();
        }
        let per = start.elapsed().as_nanos() as f64 / n as f64;
        eprintln!("cuTensorMapEncodeTiled + parameter computation: {per:.0} ns per descriptor");
    }
}
