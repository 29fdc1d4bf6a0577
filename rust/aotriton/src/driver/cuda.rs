//! The CUDA driver, loaded at run time through cudarc (`dynamic-loading`): the crate builds with
//! no CUDA installed and, with no driver present, every entry point returns `NoDriver`. Only
//! `driver/mod.rs` calls into this module.
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;

use super::{DeviceInfo, LaunchDims, Runtime, TensorMap};
use crate::error::{Error, ErrorKind, Result};
use crate::lock;
use crate::tma::TmaEncode;

// The vendor-neutral descriptor storage is passed to the driver as a `CUtensorMap`.
const _: () = assert!(
    size_of::<TensorMap>() == size_of::<sys::CUtensorMap>() && align_of::<TensorMap>() >= align_of::<sys::CUtensorMap>()
);

/// Turns a raw driver status into a Result naming the call (`what`) and the driver's error.
fn check(rc: sys::CUresult, what: impl FnOnce() -> String) -> Result<()> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::Driver, format!("{} failed: {rc:?}", what())))
    }
}

/// Loads the driver library and runs `cuInit` once per process. cudarc panics when libcuda is
/// missing, so its presence is probed first; the outcome (success or the error) is remembered.
pub(super) fn init() -> Result<()> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    INIT.get_or_init(|| {
        if !library_present() {
            return Err(Error::new(
                ErrorKind::NoDriver,
                "the CUDA driver library (libcuda.so.1) was not found: this machine has no NVIDIA driver",
            ));
        }
        // SAFETY: plain driver calls with valid out-pointers.
        unsafe {
            let mut version = 0;
            check(sys::cuDriverGetVersion(&mut version), || "cuDriverGetVersion".into())?;
            match sys::cuInit(0) {
                sys::CUresult::CUDA_ERROR_NO_DEVICE => Err(Error::new(
                    ErrorKind::NoDevice,
                    format!("the CUDA driver (API {version}) found no NVIDIA GPU (cuInit: CUDA_ERROR_NO_DEVICE)"),
                )),
                rc => check(rc, || format!("cuInit (driver API {version})")),
            }
        }
    })
    .clone()
}

/// Makes the stream's context current (pushed until the guard drops) and reads its device.
/// Returns the guard, the context (the module cache's scope) and the device.
pub(super) fn enter(raw_stream: usize) -> Result<(PushedContext, usize, Arc<DeviceInfo>)> {
    init()?;
    let mut context: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the driver checks the caller's stream handle.
    unsafe {
        check(sys::cuStreamGetCtx(raw_stream as sys::CUstream, &mut context), || {
            format!(
                "cuStreamGetCtx(stream {raw_stream:#x}) (is the stream valid, and for the null stream, is a context current?)"
            )
        })?;
    }
    let pushed = PushedContext::push(context)?;
    let mut ordinal = 0;
    // SAFETY: a context is current (pushed above).
    unsafe { check(sys::cuCtxGetDevice(&mut ordinal), || "cuCtxGetDevice".into())? };
    Ok((pushed, context as usize, device_info(ordinal)?))
}

/// A context pushed onto the calling thread, popped on drop.
pub(super) struct PushedContext;

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
    let arch = format!("sm_{major}{minor}");
    let info = Arc::new(DeviceInfo {
        runtime: Runtime::Cuda,
        ordinal,
        target_id: arch.clone(),
        arch,
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
        max_shared: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as u32,
        warp_size: attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)? as u32,
    });
    lock(devices).insert(ordinal, info.clone());
    Ok(info)
}

/// Loads `image` into the current context and opts the function in to `shared` bytes of dynamic
/// shared memory when that exceeds the 48 KiB default (the caller checked it against the
/// device's limit). Returns the `CUfunction`. `label` names the kernel in errors.
pub(super) fn load_function(image: &[u8], symbol: &str, shared: u32, device: &DeviceInfo, label: &str) -> Result<usize> {
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
    Ok(function as usize)
}

/// Enqueues `function` (a `CUfunction` from [`load_function`]) on the stream. `params` points at
/// each argument's value in ABI order.
pub(super) fn launch(function: usize, dims: LaunchDims, raw_stream: usize, params: &mut [*mut c_void], label: &str) -> Result<()> {
    // SAFETY: the parameter list was built from the kernel's own metadata (count, order, sizes).
    unsafe {
        check(
            sys::cuLaunchKernel(
                function as sys::CUfunction,
                dims.grid[0],
                dims.grid[1],
                dims.grid[2],
                dims.threads,
                1,
                1,
                dims.shared,
                raw_stream as sys::CUstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
            || format!("cuLaunchKernel({label}, grid {:?}, {} threads, {} B shared)", dims.grid, dims.threads, dims.shared),
        )
    }
}

/// Whether libcuda can be opened (without it, cudarc panics on first use).
pub(super) fn library_present() -> bool {
    // SAFETY: only tries to dlopen the candidate library names.
    unsafe { sys::is_culib_present() }
}

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
pub(super) fn encode_tensor_map(map: &mut TensorMap, e: &TmaEncode, label: impl FnOnce() -> String) -> Result<()> {
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
            (map as *mut TensorMap).cast::<sys::CUtensorMap>(),
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
        let mut map = super::super::EMPTY_TENSOR_MAP;
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
