//! The CUDA driver API (NVIDIA GPUs), opened at run time with libloading: the crate builds with
//! no CUDA installed. The library is `libcuda.so.1`; without it every call on a CUDA stream
//! returns `NoDriver`; with it but no GPU, `NoDevice`; a missing required entry point is a
//! `NoDriver` error naming it. Only `driver/mod.rs` calls into this module.
//!
//! Why not cudarc's own loader (cudarc 0.19.10, `dynamic-loading`; its `sys` types and constants
//! are still used here): `sys::culib()` opens the first of `get_lib_name_candidates("cuda")` that
//! dlopen accepts, `libcuda.so` first and `libcuda.so.1` near the end, and cannot be pointed at a
//! file; each `sys::cu*` function resolves its symbol on its first call and panics when the
//! library lacks it. So a CUDA toolkit's stub `libcuda.so` on `LD_LIBRARY_PATH` would be taken for
//! the driver (cuInit: CUDA_ERROR_STUB_LIBRARY), and on a driver before 12.0 the first TMA encode
//! would panic in `cuTensorMapEncodeTiled`, mid-call, with the message lost behind the C++ API's
//! guard. The smallest fix that removes both is to do what cudarc's loader does ourselves, with
//! our choices: open the name the driver installs (`libcuda.so.1`, as Triton's launcher does;
//! toolkits ship their stub only as `libcuda.so`), and resolve every entry point this module calls
//! once, when the library is opened. A missing required one fails that, naming it; a missing
//! optional one (`cuCtxGetId`, `cuTensorMapEncodeTiled`, both CUDA 12.0+) disables only what needs
//! it. No cudarc function is called, so nothing on this path can panic inside cudarc.
//!
//! Statuses are read as raw integers, not as cudarc's `CUresult` enum: a newer driver may return
//! a code the enum lacks, and such a value in a Rust enum would be undefined behaviour.
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;
use libloading::Library;

use super::{DeviceInfo, LaunchDims, ModuleScope, Runtime, TensorMap};
use crate::error::{Error, ErrorKind, Result};
use crate::lock;
use crate::tma::TmaEncode;

// The vendor-neutral descriptor storage is passed to the driver as a `CUtensorMap`.
const _: () = assert!(
    size_of::<TensorMap>() == size_of::<sys::CUtensorMap>() && align_of::<TensorMap>() >= align_of::<sys::CUtensorMap>()
);

/// A raw `CUresult`.
type CuResult = c_uint;
const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_NO_DEVICE: CuResult = 100;

/// The driver library: the name the NVIDIA driver installs (see the module comment).
const LIBRARY_NAME: &str = "libcuda.so.1";

#[allow(clippy::type_complexity)]
type EncodeTiled = unsafe extern "C" fn(
    *mut sys::CUtensorMap,
    sys::CUtensorMapDataType,
    u32,
    *mut c_void,
    *const u64,
    *const u64,
    *const u32,
    *const u32,
    sys::CUtensorMapInterleave,
    sys::CUtensorMapSwizzle,
    sys::CUtensorMapL2promotion,
    sys::CUtensorMapFloatOOBfill,
) -> CuResult;

#[allow(clippy::type_complexity)]
type LaunchKernel = unsafe extern "C" fn(
    sys::CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    sys::CUstream,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;

/// The resolved entry points of the driver library (types as in CUDA's `cuda.h`).
struct Api {
    path: String,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    stream_get_ctx: unsafe extern "C" fn(sys::CUstream, *mut sys::CUcontext) -> CuResult,
    ctx_push_current: unsafe extern "C" fn(sys::CUcontext) -> CuResult,
    ctx_pop_current: unsafe extern "C" fn(*mut sys::CUcontext) -> CuResult,
    ctx_get_device: unsafe extern "C" fn(*mut sys::CUdevice) -> CuResult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, sys::CUdevice_attribute, sys::CUdevice) -> CuResult,
    module_load_data: unsafe extern "C" fn(*mut sys::CUmodule, *const c_void) -> CuResult,
    module_get_function: unsafe extern "C" fn(*mut sys::CUfunction, sys::CUmodule, *const c_char) -> CuResult,
    func_set_attribute: unsafe extern "C" fn(sys::CUfunction, sys::CUfunction_attribute, c_int) -> CuResult,
    launch_kernel: LaunchKernel,
    /// CUDA 12.0+: a context's process-unique id (the module cache's key; see [`module_scope`]).
    ctx_get_id: Option<unsafe extern "C" fn(sys::CUcontext, *mut c_ulonglong) -> CuResult>,
    /// CUDA 12.0+: TMA descriptors (the Gluon kernels).
    tensor_map_encode_tiled: Option<EncodeTiled>,
    /// Keeps the entry points above valid.
    _library: Library,
}

/// Opens the driver library at `path` and resolves every entry point this module calls.
fn load_api(path: &str) -> Result<Api> {
    // SAFETY: loading the driver runs its initialisers, which is what using it means.
    let library = unsafe { Library::new(path) }.map_err(|e| {
        Error::new(
            ErrorKind::NoDriver,
            format!("the CUDA driver library ({path}) was not found: this machine has no NVIDIA driver ({e})"),
        )
    })?;
    let symbols = super::Symbols { library: &library, path, expected: "the NVIDIA driver" };
    // SAFETY (every entry point below): the field's type is the vendor header's declaration.
    macro_rules! symbol {
        ($name:literal) => {
            unsafe { symbols.required($name) }?
        };
    }
    macro_rules! optional {
        ($name:literal) => {
            unsafe { symbols.optional($name) }
        };
    }
    Ok(Api {
        driver_get_version: symbol!("cuDriverGetVersion"),
        init: symbol!("cuInit"),
        get_error_name: symbol!("cuGetErrorName"),
        stream_get_ctx: symbol!("cuStreamGetCtx"),
        ctx_push_current: symbol!("cuCtxPushCurrent_v2"),
        ctx_pop_current: symbol!("cuCtxPopCurrent_v2"),
        ctx_get_device: symbol!("cuCtxGetDevice"),
        device_get_attribute: symbol!("cuDeviceGetAttribute"),
        module_load_data: symbol!("cuModuleLoadData"),
        module_get_function: symbol!("cuModuleGetFunction"),
        func_set_attribute: symbol!("cuFuncSetAttribute"),
        launch_kernel: symbol!("cuLaunchKernel"),
        ctx_get_id: optional!("cuCtxGetId"),
        tensor_map_encode_tiled: optional!("cuTensorMapEncodeTiled"),
        path: path.to_string(),
        _library: library,
    })
}

impl Api {
    /// Turns a driver status into a Result naming the call (`what`) and the driver's error.
    fn check(&self, rc: CuResult, what: impl FnOnce() -> String) -> Result<()> {
        if rc == CUDA_SUCCESS {
            return Ok(());
        }
        Err(Error::new(ErrorKind::Driver, format!("{} failed: {} ({rc})", what(), self.error_name(rc))))
    }

    fn error_name(&self, rc: CuResult) -> String {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: valid out-pointer; the driver sets a static string, or fails for an unknown code.
        if unsafe { (self.get_error_name)(rc, &mut name) } != CUDA_SUCCESS || name.is_null() {
            return "unknown CUDA error".into();
        }
        // SAFETY: a NUL-terminated static string from the driver.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    }
}

/// The library, opened and resolved once per process (the outcome, success or error, is kept).
fn library() -> Result<&'static Api> {
    static LIBRARY: OnceLock<Result<Api>> = OnceLock::new();
    LIBRARY.get_or_init(|| load_api(LIBRARY_NAME)).as_ref().map_err(Clone::clone)
}

/// The library, with `cuInit` run once per process; the outcome, success or error, is
/// remembered. Returns the entry points and the driver's API version.
fn api() -> Result<(&'static Api, c_int)> {
    static INIT: OnceLock<Result<c_int>> = OnceLock::new();
    let api = library()?;
    let version = INIT
        .get_or_init(|| {
            let mut version = 0;
            // SAFETY: plain driver calls with valid out-pointers.
            unsafe {
                api.check((api.driver_get_version)(&mut version), || "cuDriverGetVersion".into())?;
                match (api.init)(0) {
                    CUDA_ERROR_NO_DEVICE => Err(Error::new(
                        ErrorKind::NoDevice,
                        format!("the CUDA driver (API {version}) found no NVIDIA GPU (cuInit: CUDA_ERROR_NO_DEVICE)"),
                    )),
                    rc => api.check(rc, || format!("cuInit (driver API {version})")),
                }?;
            }
            Ok(version)
        })
        .clone()?;
    Ok((api, version))
}

/// Makes the stream's context current (pushed until the guard drops) and reads its device.
/// Returns the guard, the context's module scope and the device.
pub(super) fn enter(raw_stream: usize) -> Result<(PushedContext, ModuleScope, Arc<DeviceInfo>)> {
    let (api, _) = api()?;
    let mut context: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the driver checks the caller's stream handle.
    unsafe {
        api.check((api.stream_get_ctx)(raw_stream as sys::CUstream, &mut context), || {
            format!(
                "cuStreamGetCtx(stream {raw_stream:#x}) (is the stream valid, and for the null stream, is a context current?)"
            )
        })?;
    }
    let id = match api.ctx_get_id {
        Some(get_id) => {
            let mut id: c_ulonglong = 0;
            // SAFETY: valid out-pointer and a context the driver gave for the stream.
            unsafe { api.check(get_id(context, &mut id), || "cuCtxGetId".into())? };
            Some(id)
        }
        None => None,
    };
    let pushed = PushedContext::push(api, context)?;
    let mut ordinal = 0;
    // SAFETY: a context is current (pushed above).
    unsafe { api.check((api.ctx_get_device)(&mut ordinal), || "cuCtxGetDevice".into())? };
    Ok((pushed, module_scope(context as usize, id), device_info(api, ordinal)?))
}

/// Where modules loaded in a context live, for the module cache: the context's id when the
/// driver gives one (CUDA 12.0+: unique for the process's life, so a context destroyed and
/// re-created at the same address gets a new key and its modules are loaded again), else its
/// address (drivers before 12.0: a destroyed context's address may be handed out again, and
/// modules cached for it would be stale; see `driver/mod.rs`).
fn module_scope(context: usize, id: Option<u64>) -> ModuleScope {
    match id {
        Some(id) => ModuleScope::CudaContextId(id),
        None => ModuleScope::CudaContextAddress(context),
    }
}

/// A context pushed onto the calling thread, popped on drop.
pub(super) struct PushedContext;

impl PushedContext {
    fn push(api: &Api, context: sys::CUcontext) -> Result<PushedContext> {
        // SAFETY: the context came from the driver for the caller's stream.
        unsafe { api.check((api.ctx_push_current)(context), || "cuCtxPushCurrent".into())? };
        Ok(PushedContext)
    }
}

impl Drop for PushedContext {
    fn drop(&mut self) {
        if let Ok(api) = library() {
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: pops the context pushed in `push`. A failure cannot be reported from Drop
            // and leaves nothing to clean up.
            let _ = unsafe { (api.ctx_pop_current)(&mut popped) };
        }
    }
}

/// Read once per device; later calls share it (no allocation on the launch path).
fn device_info(api: &Api, ordinal: sys::CUdevice) -> Result<Arc<DeviceInfo>> {
    static DEVICES: OnceLock<Mutex<HashMap<i32, Arc<DeviceInfo>>>> = OnceLock::new();
    let devices = DEVICES.get_or_init(Default::default);
    if let Some(info) = lock(devices).get(&ordinal) {
        return Ok(info.clone());
    }
    let attr = |attribute: sys::CUdevice_attribute| -> Result<i32> {
        let mut value = 0;
        // SAFETY: valid out-pointer and device ordinal from the driver.
        unsafe {
            api.check((api.device_get_attribute)(&mut value, attribute, ordinal), || {
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
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(0) as u32,
        max_shared: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?.max(0) as u32,
        warp_size: attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?.max(0) as u32,
    });
    lock(devices).insert(ordinal, info.clone());
    Ok(info)
}

/// Loads `image` into the current context and opts the function in to `shared` bytes of dynamic
/// shared memory when that exceeds the 48 KiB default (the caller checked it against the
/// device's limit). Returns the `CUfunction`. `label` names the kernel in errors.
pub(super) fn load_function(image: &[u8], symbol: &str, shared: u32, device: &DeviceInfo, label: &str) -> Result<usize> {
    let (api, _) = api()?;
    let symbol_c = CString::new(symbol)
        .map_err(|_| Error::new(ErrorKind::BadArchive, format!("kernel {label}: symbol has a NUL byte")))?;
    let shared_bytes = c_int::try_from(shared).map_err(|_| {
        Error::new(ErrorKind::BadArchive, format!("kernel {label}: {shared} bytes of shared memory"))
    })?;
    let mut module: sys::CUmodule = std::ptr::null_mut();
    let mut function: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: `image` is a complete cubin (checksummed by the archive); out-pointers are valid.
    unsafe {
        api.check((api.module_load_data)(&mut module, image.as_ptr() as *const c_void), || {
            format!("cuModuleLoadData({label}) on device {} ({})", device.ordinal, device.arch)
        })?;
        api.check((api.module_get_function)(&mut function, module, symbol_c.as_ptr()), || {
            format!("cuModuleGetFunction({label}, {symbol})")
        })?;
        if shared > 48 * 1024 {
            api.check(
                (api.func_set_attribute)(
                    function,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared_bytes,
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
    let (api, _) = api()?;
    // SAFETY: the parameter list was built from the kernel's own metadata (count, order, sizes).
    let rc = unsafe {
        (api.launch_kernel)(
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
        )
    };
    api.check(rc, || format!("cuLaunchKernel({label}, grid {:?}, {} threads, {} B shared)", dims.grid, dims.threads, dims.shared))
}

/// Whether the driver library can be opened and has every entry point this module needs.
pub(super) fn library_present() -> bool {
    library().is_ok()
}

/// Whether the driver can encode TMA descriptors (`cuTensorMapEncodeTiled`, CUDA 12.0+).
pub(super) fn tensor_maps_available() -> bool {
    library().is_ok_and(|api| api.tensor_map_encode_tiled.is_some())
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
    let (api, version) = api()?;
    encode_with(api, version, map, e, label)
}

fn encode_with(api: &Api, version: c_int, map: &mut TensorMap, e: &TmaEncode, label: impl FnOnce() -> String) -> Result<()> {
    let Some(encode) = api.tensor_map_encode_tiled else {
        return Err(Error::new(
            ErrorKind::UnsupportedByBackend,
            format!(
                "{}: the CUDA driver (API {version}, {}) lacks cuTensorMapEncodeTiled (drivers before 12.0 do): no TMA descriptors, so no Gluon kernels",
                label(),
                api.path
            ),
        ));
    };
    let (Some(data_type), Some(swizzle)) = (tensor_map_data_type(e.data_type), tensor_map_swizzle(e.swizzle)) else {
        return Err(Error::new(
            ErrorKind::BadArchive,
            format!("{}: TMA data type {} / swizzle {} unknown to this runtime", label(), e.data_type, e.swizzle),
        ));
    };
    // SAFETY: every array holds at least `rank` entries (rank ≤ 5, checked by the archive
    // reader), `map` is a 64-byte aligned 128-byte CUtensorMap, and the driver only writes it.
    let rc = unsafe {
        encode(
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
    api.check(rc, || {
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
        let (api, _) = match api() {
            Ok(found) => found,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        type Retain = unsafe extern "C" fn(*mut sys::CUcontext, sys::CUdevice) -> CuResult;
        // SAFETY: `cuda.h`'s declaration of the entry point.
        let retain: Retain = unsafe { *api._library.get(b"cuDevicePrimaryCtxRetain\0").unwrap() };
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; device 0.
        unsafe { api.check(retain(&mut context, 0), || "cuDevicePrimaryCtxRetain".into()).unwrap() };
        let _pushed = PushedContext::push(api, context).unwrap();
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

    /// F4 on a real driver: a primary context reset and retained again is a new module scope,
    /// whatever address the driver gives it. Needs a GPU, and resets device 0's primary context,
    /// so run it alone: `cargo test -p aotriton --lib -- --ignored a_reset_context --nocapture`.
    #[test]
    #[ignore = "needs the CUDA driver and a GPU; resets device 0's primary context"]
    fn a_reset_context_is_a_new_module_scope() {
        let (api, version) = match api() {
            Ok(found) => found,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        type Retain = unsafe extern "C" fn(*mut sys::CUcontext, sys::CUdevice) -> CuResult;
        type OnDevice = unsafe extern "C" fn(sys::CUdevice) -> CuResult;
        // SAFETY: `cuda.h`'s declarations of these entry points.
        let (retain, release, reset) = unsafe {
            let retain: Retain = *api._library.get(b"cuDevicePrimaryCtxRetain\0").unwrap();
            let release: OnDevice = *api._library.get(b"cuDevicePrimaryCtxRelease_v2\0").unwrap();
            let reset: OnDevice = *api._library.get(b"cuDevicePrimaryCtxReset_v2\0").unwrap();
            (retain, release, reset)
        };
        let scope_of_a_fresh_primary_context = || {
            let mut context: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: valid out-pointer; device 0.
            unsafe { api.check(retain(&mut context, 0), || "cuDevicePrimaryCtxRetain".into()).unwrap() };
            let pushed = PushedContext::push(api, context).unwrap();
            let (entered, scope, _) = enter(0).unwrap();
            drop((entered, pushed));
            // SAFETY: releases the retain above, then destroys the context.
            unsafe {
                api.check(release(0), || "cuDevicePrimaryCtxRelease".into()).unwrap();
                api.check(reset(0), || "cuDevicePrimaryCtxReset".into()).unwrap();
            }
            (context as usize, scope)
        };
        let (first_address, first) = scope_of_a_fresh_primary_context();
        let (second_address, second) = scope_of_a_fresh_primary_context();
        eprintln!("driver API {version}: {first_address:#x} -> {first:?}, then {second_address:#x} -> {second:?}");
        if api.ctx_get_id.is_some() {
            assert_ne!(first, second, "a re-created context kept its module scope");
        }
    }

    /// A fake driver library built for one test; its directory is removed when the test drops it
    /// (a library already opened stays mapped).
    struct FakeDriver {
        dir: std::path::PathBuf,
        path: String,
    }

    impl Drop for FakeDriver {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A stand-in for libcuda with the entry points this module resolves, built with the system C
    /// compiler: `REQUIRED_BUT_LAUNCH` leaves out cuLaunchKernel, `CUDA_12` adds the 12.0 entry
    /// points. None when no C compiler is found (the tests then say they are skipped).
    fn fake_driver(name: &str, defines: &[&str]) -> Option<FakeDriver> {
        const SOURCE: &str = r#"
typedef unsigned int CUresult;
CUresult cuDriverGetVersion(int *v) { *v = DRIVER_VERSION; return 0; }
CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuGetErrorName(CUresult rc, const char **name) {
    if (rc == 999) { *name = "CUDA_ERROR_UNKNOWN"; return 0; }
    return 1;
}
CUresult cuStreamGetCtx(void *stream, void **ctx) { (void)stream; *ctx = (void *)0x1000; return 0; }
CUresult cuCtxPushCurrent_v2(void *ctx) { (void)ctx; return 0; }
CUresult cuCtxPopCurrent_v2(void **ctx) { *ctx = 0; return 0; }
CUresult cuCtxGetDevice(int *device) { *device = 0; return 0; }
CUresult cuDeviceGetAttribute(int *value, int attribute, int device) { (void)attribute; (void)device; *value = 0; return 0; }
CUresult cuModuleLoadData(void **module, const void *image) { (void)image; *module = 0; return 0; }
CUresult cuModuleGetFunction(void **f, void *module, const char *name) { (void)module; (void)name; *f = 0; return 0; }
CUresult cuFuncSetAttribute(void *f, int attribute, int value) { (void)f; (void)attribute; (void)value; return 0; }
#ifndef REQUIRED_BUT_LAUNCH
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **params, void **extra) { return 0; }
#endif
#ifdef CUDA_12
CUresult cuCtxGetId(void *ctx, unsigned long long *id) { *id = 7 + (unsigned long long)ctx; return 0; }
CUresult cuTensorMapEncodeTiled(unsigned long long *map, int type, unsigned rank, void *address,
                                const unsigned long long *dims, const unsigned long long *strides,
                                const unsigned *box, const unsigned *element_strides, int interleave,
                                int swizzle, int l2, int fill) {
    map[0] = rank; map[1] = dims[0]; map[2] = box[0];
    return 0;
}
#endif
"#;
        let dir = std::env::temp_dir().join(format!("aotriton-fake-libcuda-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let source = dir.join("fake.c");
        std::fs::write(&source, SOURCE).ok()?;
        let library = dir.join(format!("{name}.so"));
        let mut cc = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
        cc.args(["-shared", "-fPIC", "-o"]).arg(&library).arg(&source);
        for define in defines {
            cc.arg(format!("-D{define}"));
        }
        match cc.status() {
            Ok(status) if status.success() => Some(FakeDriver { path: library.to_string_lossy().into_owned(), dir }),
            outcome => {
                eprintln!("skipped: no C compiler to build a fake libcuda ({outcome:?})");
                let _ = std::fs::remove_dir_all(&dir);
                None
            }
        }
    }

    #[test]
    fn a_driver_missing_a_required_entry_point_is_no_driver() {
        let Some(fake) = fake_driver("no-launch", &["DRIVER_VERSION=12080", "REQUIRED_BUT_LAUNCH"]) else { return };
        let path = fake.path.clone();
        let e = load_api(&path).err().expect("a driver without cuLaunchKernel was accepted");
        assert_eq!(e.kind(), ErrorKind::NoDriver, "{e}");
        assert!(e.message().contains("cuLaunchKernel") && e.message().contains(&path), "{e}");
        let e = load_api("/nonexistent/libcuda.so.1").err().unwrap();
        assert_eq!(e.kind(), ErrorKind::NoDriver, "{e}");
    }

    /// A driver before 12.0 has neither cuTensorMapEncodeTiled nor cuCtxGetId: it loads, and only
    /// a TMA encode fails, with an error that says why (not a panic).
    #[test]
    fn a_driver_before_12_lacks_only_tma_and_context_ids() {
        let Some(fake) = fake_driver("cuda-11.8", &["DRIVER_VERSION=11080"]) else { return };
        let path = fake.path.clone();
        let api = load_api(&path).unwrap();
        assert!(api.ctx_get_id.is_none() && api.tensor_map_encode_tiled.is_none());
        let meta = crate::archive::TensorDescMeta { block_size: vec![64, 64], swizzle: 3, elem_type: 6, elem_size: 2, fp4_padded: false };
        let e = encode_params(&TensorArg::matrix(0x10000, 128, 64, DType::F16), &meta).unwrap();
        let mut map = super::super::EMPTY_TENSOR_MAP;
        let err = encode_with(&api, 11080, &mut map, &e, || "k desc_q".into()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnsupportedByBackend, "{err}");
        assert!(err.message().contains("cuTensorMapEncodeTiled") && err.message().contains("11080"), "{err}");
        // Statuses are named by the driver, and a code nobody knows is still a clean error.
        let err = api.check(999, || "cuInit".into()).unwrap_err();
        assert!(err.message().contains("CUDA_ERROR_UNKNOWN (999)"), "{err}");
        let err = api.check(123_456, || "cuInit".into()).unwrap_err();
        assert!(err.message().contains("unknown CUDA error (123456)"), "{err}");
    }

    #[test]
    fn a_12_driver_encodes_tensor_maps_and_names_contexts() {
        let Some(fake) = fake_driver("cuda-12.8", &["DRIVER_VERSION=12080", "CUDA_12"]) else { return };
        let path = fake.path.clone();
        let api = load_api(&path).unwrap();
        let meta = crate::archive::TensorDescMeta { block_size: vec![64, 64], swizzle: 3, elem_type: 6, elem_size: 2, fp4_padded: false };
        let e = encode_params(&TensorArg::matrix(0x10000, 128, 64, DType::F16), &meta).unwrap();
        let mut map = super::super::EMPTY_TENSOR_MAP;
        encode_with(&api, 12080, &mut map, &e, || "k desc_q".into()).unwrap();
        assert_eq!(&map.opaque[..3], &[2, e.global_dim[0], e.box_dim[0] as u64]);
        let mut id = 0;
        // SAFETY: the fake's entry point, with a valid out-pointer.
        unsafe { api.check(api.ctx_get_id.unwrap()(0x1000 as sys::CUcontext, &mut id), || "cuCtxGetId".into()).unwrap() };
        assert_eq!(id, 0x1007);
    }

    /// The module cache's key: a context re-created at the address of a destroyed one has another
    /// id, hence another key, so the modules of the destroyed one are never handed out for it.
    #[test]
    fn contexts_are_keyed_by_id_when_the_driver_gives_one() {
        assert_ne!(module_scope(0x5000, Some(1)), module_scope(0x5000, Some(2)));
        assert_eq!(module_scope(0x5000, Some(1)), module_scope(0x6000, Some(1)), "the id alone names the context");
        assert_eq!(module_scope(0x5000, None), ModuleScope::CudaContextAddress(0x5000));
        assert_ne!(module_scope(0x5000, None), module_scope(0x5000, Some(0x5000)));
    }
}
