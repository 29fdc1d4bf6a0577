//! The HIP runtime (AMD GPUs), loaded at run time with libloading: the crate builds with no ROCm
//! installed. The library is the file named by `AOTRITON_HIP_LIBRARY` when that is set, else the
//! first of `libamdhip64.so`, `.so.7`, `.so.6`, `.so.5` that opens. Without it every call on a
//! HIP stream returns `NoDriver`; with it but no AMD device, `NoDevice`; a missing symbol is a
//! `NoDriver` error naming the symbol and the library. Only `driver/mod.rs` calls into this module.
//!
//! ABI notes (checked against ROCm 5.2's and ROCm 6's `hip_runtime_api.h`):
//! - The `hipDeviceAttribute_t` values used here (multiprocessor count 63, max shared memory per
//!   block 74, warp size 87) are the same in ROCm 5 and 6, so `hipDeviceGetAttribute` serves them.
//! - `hipDeviceProp_t` changed layout in ROCm 6: ROCm 6+ exports `hipGetDevicePropertiesR0600`
//!   (1472 bytes, `gcnArchName` at byte 1160); ROCm 5 exports `hipGetDeviceProperties` with the
//!   older layout (792 bytes, `gcnArchName` at byte 396). The properties are read only for
//!   `gcnArchName`, into a zeroed buffer larger than either struct.
//! - `hipStreamGetDevice` exists from ROCm 6 on; with ROCm 5 the device of a stream is the
//!   calling thread's current device (the ROCm 5 runtime cannot say more).
//! - Kernels are loaded with `hipModuleLoadData` + `hipModuleGetFunction` once per device, and
//!   launched with `hipModuleLaunchKernel` and a kernelParams array (the runtime lays the
//!   arguments out from the code object's own kernarg metadata), as Triton's own AMD launcher does.
//!   Dynamic LDS needs no opt-in on AMD: any launch may use up to the device's per-block limit.
//! - Loaded modules are cached per device ordinal for the life of the process. HIP has no
//!   counterpart of CUDA's `cuCtxGetId`: nothing names one lifetime of a device's primary context
//!   (`hipDevicePrimaryCtxGetState` gives only its flags and whether it is active), so the cache
//!   cannot tell that a `hipDeviceReset` (or `hipDevicePrimaryCtxReset`) unloaded the device's
//!   modules, and later calls would launch the stale `hipFunction_t`s. A program must not reset a
//!   device that aotriton has launched on (see `driver/mod.rs`, loaded modules and their lifetime).
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use libloading::Library;

use super::{DeviceInfo, LaunchDims, Runtime, base_arch};
use crate::error::{Error, ErrorKind, Result};
use crate::lock;

type HipError = c_int;
type HipModule = *mut c_void;
type HipFunction = *mut c_void;
type HipStream = *mut c_void;

const HIP_SUCCESS: HipError = 0;
const HIP_ERROR_NO_DEVICE: HipError = 100;

const ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 63;
const ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: c_int = 74;
const ATTRIBUTE_WARP_SIZE: c_int = 87;

/// The environment variable that names the HIP runtime library to load.
pub(crate) const LIBRARY_ENV: &str = "AOTRITON_HIP_LIBRARY";
/// Library names tried in order when `AOTRITON_HIP_LIBRARY` is not set.
const LIBRARY_NAMES: [&str; 4] = [
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];

/// Which `hipDeviceProp_t` layout the library's properties call fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PropsLayout {
    /// ROCm 6+: `hipGetDevicePropertiesR0600`.
    R0600,
    /// ROCm 5: `hipGetDeviceProperties`.
    R0000,
}

impl PropsLayout {
    fn gcn_arch_name_offset(self) -> usize {
        match self {
            PropsLayout::R0600 => 1160,
            PropsLayout::R0000 => 396,
        }
    }
}

/// Bytes handed to the properties call: more than either layout needs (1472 and 792).
const PROPS_BUFFER_BYTES: usize = 4096;
/// `gcnArchName` is a `char[256]`.
const GCN_ARCH_NAME_BYTES: usize = 256;

/// The resolved entry points of one HIP runtime library.
struct Api {
    path: String,
    init: unsafe extern "C" fn(c_uint) -> HipError,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    get_device: unsafe extern "C" fn(*mut c_int) -> HipError,
    set_device: unsafe extern "C" fn(c_int) -> HipError,
    stream_get_device: Option<unsafe extern "C" fn(HipStream, *mut c_int) -> HipError>,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipError,
    get_device_properties: unsafe extern "C" fn(*mut c_void, c_int) -> HipError,
    props_layout: PropsLayout,
    module_load_data: unsafe extern "C" fn(*mut HipModule, *const c_void) -> HipError,
    module_get_function:
        unsafe extern "C" fn(*mut HipFunction, HipModule, *const c_char) -> HipError,
    #[allow(clippy::type_complexity)]
    module_launch_kernel: unsafe extern "C" fn(
        HipFunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        HipStream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
    get_error_name: unsafe extern "C" fn(HipError) -> *const c_char,
    runtime_get_version: unsafe extern "C" fn(*mut c_int) -> HipError,
    /// Keeps the entry points above valid.
    _library: Library,
}

/// Opens the library (once per process) and resolves every entry point the runtime uses.
fn load_api() -> Result<Api> {
    let chosen = std::env::var_os(LIBRARY_ENV).filter(|v| !v.is_empty());
    let candidates: Vec<std::ffi::OsString> = match &chosen {
        Some(path) => vec![path.clone()],
        None => LIBRARY_NAMES.iter().map(Into::into).collect(),
    };
    let mut last_error = String::new();
    let mut opened = None;
    for name in &candidates {
        // SAFETY: loading the HIP runtime runs its initialisers, which is what using it means.
        match unsafe { Library::new(name) } {
            Ok(library) => {
                opened = Some((library, name.to_string_lossy().into_owned()));
                break;
            }
            Err(e) => last_error = e.to_string(),
        }
    }
    let Some((library, path)) = opened else {
        let message = match &chosen {
            Some(path) => format!(
                "the HIP runtime library {LIBRARY_ENV}={} could not be loaded: {last_error}",
                path.to_string_lossy()
            ),
            None => format!(
                "the HIP runtime library was not found (tried {}): this machine has no ROCm ({last_error})",
                LIBRARY_NAMES.join(", ")
            ),
        };
        return Err(Error::new(ErrorKind::NoDriver, message));
    };
    let symbols = super::Symbols { library: &library, path: &path, expected: "a HIP runtime" };
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
    let (get_device_properties, props_layout) = match optional!("hipGetDevicePropertiesR0600") {
        Some(f) => (f, PropsLayout::R0600),
        None => (symbol!("hipGetDeviceProperties"), PropsLayout::R0000),
    };
    Ok(Api {
        init: symbol!("hipInit"),
        get_device_count: symbol!("hipGetDeviceCount"),
        get_device: symbol!("hipGetDevice"),
        set_device: symbol!("hipSetDevice"),
        stream_get_device: optional!("hipStreamGetDevice"),
        device_get_attribute: symbol!("hipDeviceGetAttribute"),
        get_device_properties,
        props_layout,
        module_load_data: symbol!("hipModuleLoadData"),
        module_get_function: symbol!("hipModuleGetFunction"),
        module_launch_kernel: symbol!("hipModuleLaunchKernel"),
        get_error_name: symbol!("hipGetErrorName"),
        runtime_get_version: symbol!("hipRuntimeGetVersion"),
        path,
        _library: library,
    })
}

impl Api {
    /// Turns a HIP status into a Result naming the call (`what`) and HIP's name of the error.
    fn check(&self, rc: HipError, what: impl FnOnce() -> String) -> Result<()> {
        if rc == HIP_SUCCESS {
            return Ok(());
        }
        let kind = if rc == HIP_ERROR_NO_DEVICE {
            ErrorKind::NoDevice
        } else {
            ErrorKind::Driver
        };
        Err(Error::new(
            kind,
            format!(
                "{} failed: {} ({rc}) [{}]",
                what(),
                self.error_name(rc),
                self.path
            ),
        ))
    }

    fn error_name(&self, rc: HipError) -> String {
        // SAFETY: hipGetErrorName returns a static string (or null) for any value.
        let name = unsafe { (self.get_error_name)(rc) };
        if name.is_null() {
            return "unknown HIP error".into();
        }
        // SAFETY: a NUL-terminated static string from the runtime.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The library, opened and resolved once per process (the outcome, success or error, is kept).
fn library() -> Result<&'static Api> {
    static LIBRARY: OnceLock<Result<Api>> = OnceLock::new();
    LIBRARY.get_or_init(load_api).as_ref().map_err(Clone::clone)
}

/// The library, initialised once per process (at least one device, then `hipInit`); the outcome,
/// success or error, is remembered.
fn api() -> Result<&'static Api> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    let api = library()?;
    INIT.get_or_init(|| {
        let mut version = 0;
        // SAFETY: valid out-pointers; hipInit takes flags 0.
        unsafe {
            api.check((api.runtime_get_version)(&mut version), || "hipRuntimeGetVersion".into())?;
            // The device count first: on a machine without an AMD GPU, ROCm 5.2's hipInit
            // fails with hipErrorInvalidDevice, while hipGetDeviceCount says hipErrorNoDevice.
            let mut count = 0;
            api.check((api.get_device_count)(&mut count), || format!("hipGetDeviceCount (HIP runtime {version})"))?;
            if count <= 0 {
                return Err(Error::new(
                    ErrorKind::NoDevice,
                    format!("the HIP runtime {} (version {version}) reports no AMD GPU", api.path),
                ));
            }
            api.check((api.init)(0), || format!("hipInit (HIP runtime {version})"))
        }
    })
    .clone()?;
    Ok(api)
}

/// Whether a HIP runtime library can be opened (the variable or the default names).
pub(super) fn library_present() -> bool {
    library().is_ok()
}

/// The calling thread's current device while a call runs on another one; restored on drop.
pub(super) struct CurrentDevice {
    restore: Option<c_int>,
}

impl Drop for CurrentDevice {
    fn drop(&mut self) {
        if let (Some(previous), Ok(api)) = (self.restore, api()) {
            // SAFETY: restores a device ordinal the runtime itself reported. A failure cannot be
            // reported from Drop and leaves nothing to clean up.
            let _ = unsafe { (api.set_device)(previous) };
        }
    }
}

/// Makes the stream's device current for the call and reads it.
pub(super) fn enter(raw_stream: usize) -> Result<(CurrentDevice, Arc<DeviceInfo>)> {
    let api = api()?;
    let mut current = 0;
    // SAFETY: valid out-pointer.
    unsafe { api.check((api.get_device)(&mut current), || "hipGetDevice".into())? };
    let mut device = current;
    if let (Some(stream_get_device), true) = (api.stream_get_device, raw_stream != 0) {
        // SAFETY: valid out-pointer; the runtime checks the caller's stream handle.
        unsafe {
            api.check(
                stream_get_device(raw_stream as HipStream, &mut device),
                || format!("hipStreamGetDevice(stream {raw_stream:#x}) (is the stream valid?)"),
            )?
        };
    }
    let mut guard = CurrentDevice { restore: None };
    if device != current {
        // SAFETY: an ordinal the runtime reported for the stream.
        unsafe {
            api.check((api.set_device)(device), || {
                format!("hipSetDevice({device})")
            })?
        };
        guard.restore = Some(current);
    }
    Ok((guard, device_info(api, device)?))
}

/// Read once per device; later calls share it (no allocation on the launch path).
fn device_info(api: &Api, ordinal: c_int) -> Result<Arc<DeviceInfo>> {
    static DEVICES: OnceLock<Mutex<HashMap<c_int, Arc<DeviceInfo>>>> = OnceLock::new();
    let devices = DEVICES.get_or_init(Default::default);
    if let Some(info) = lock(devices).get(&ordinal) {
        return Ok(info.clone());
    }
    let attribute = |attribute: c_int, name: &str| -> Result<u32> {
        let mut value = 0;
        // SAFETY: valid out-pointer and a device ordinal from the runtime.
        unsafe {
            api.check(
                (api.device_get_attribute)(&mut value, attribute, ordinal),
                || format!("hipDeviceGetAttribute({name}, device {ordinal})"),
            )?
        };
        Ok(value.max(0) as u32)
    };
    let target_id = gcn_arch_name(api, ordinal)?;
    let info = Arc::new(DeviceInfo {
        runtime: Runtime::Hip,
        ordinal,
        arch: base_arch(&target_id).to_string(),
        target_id,
        multiprocessors: attribute(
            ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "hipDeviceAttributeMultiprocessorCount",
        )?,
        max_shared: attribute(
            ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
            "hipDeviceAttributeMaxSharedMemoryPerBlock",
        )?,
        warp_size: attribute(ATTRIBUTE_WARP_SIZE, "hipDeviceAttributeWarpSize")?,
    });
    lock(devices).insert(ordinal, info.clone());
    Ok(info)
}

/// The device's `gcnArchName` (`gfx942:sramecc+:xnack-`).
fn gcn_arch_name(api: &Api, ordinal: c_int) -> Result<String> {
    // u64 elements: the struct's alignment.
    let mut props = vec![0u64; PROPS_BUFFER_BYTES / 8];
    let call = match api.props_layout {
        PropsLayout::R0600 => "hipGetDevicePropertiesR0600",
        PropsLayout::R0000 => "hipGetDeviceProperties",
    };
    // SAFETY: the buffer is larger than the struct of either layout and suitably aligned.
    unsafe {
        api.check(
            (api.get_device_properties)(props.as_mut_ptr().cast(), ordinal),
            || format!("{call}(device {ordinal})"),
        )?
    };
    // SAFETY: plain bytes of the buffer just filled.
    let bytes =
        unsafe { std::slice::from_raw_parts(props.as_ptr().cast::<u8>(), PROPS_BUFFER_BYTES) };
    let offset = api.props_layout.gcn_arch_name_offset();
    let field = &bytes[offset..offset + GCN_ARCH_NAME_BYTES];
    let name = &field[..field.iter().position(|&b| b == 0).unwrap_or(field.len())];
    let name = String::from_utf8_lossy(name).into_owned();
    if !name.starts_with("gfx") {
        return Err(Error::new(
            ErrorKind::Driver,
            format!(
                "{call}(device {ordinal}) gave gcnArchName {name:?}, not a gfx target [{}]",
                api.path
            ),
        ));
    }
    Ok(name)
}

/// Loads `image` (a code object) onto the current device and finds `symbol` in it. Returns the
/// `hipFunction_t`.
pub(super) fn load_function(
    image: &[u8],
    symbol: &str,
    device: &DeviceInfo,
    label: &str,
) -> Result<usize> {
    let api = api()?;
    let symbol_c = CString::new(symbol).map_err(|_| {
        Error::new(
            ErrorKind::BadArchive,
            format!("kernel {label}: symbol has a NUL byte"),
        )
    })?;
    let mut module: HipModule = std::ptr::null_mut();
    let mut function: HipFunction = std::ptr::null_mut();
    // SAFETY: `image` is a complete code object (checksummed by the archive); out-pointers are valid.
    unsafe {
        api.check(
            (api.module_load_data)(&mut module, image.as_ptr().cast()),
            || {
                format!(
                    "hipModuleLoadData({label}) on device {} ({})",
                    device.ordinal, device.target_id
                )
            },
        )?;
        api.check(
            (api.module_get_function)(&mut function, module, symbol_c.as_ptr()),
            || format!("hipModuleGetFunction({label}, {symbol})"),
        )?;
    }
    Ok(function as usize)
}

/// Enqueues `function` (a `hipFunction_t` from [`load_function`]) on the stream. `params` points
/// at each argument's value in ABI order.
pub(super) fn launch(
    function: usize,
    dims: LaunchDims,
    raw_stream: usize,
    params: &mut [*mut c_void],
    label: &str,
) -> Result<()> {
    let api = api()?;
    // SAFETY: the parameter list was built from the kernel's own metadata (count, order, sizes).
    let rc = unsafe {
        (api.module_launch_kernel)(
            function as HipFunction,
            dims.grid[0],
            dims.grid[1],
            dims.grid[2],
            dims.threads,
            1,
            1,
            dims.shared,
            raw_stream as HipStream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    api.check(rc, || {
        format!(
            "hipModuleLaunchKernel({label}, grid {:?}, {} threads, {} B LDS)",
            dims.grid, dims.threads, dims.shared
        )
    })
}
