//! A recording HIP double: a stand-in for `libamdhip64.so` that aotriton loads through
//! `AOTRITON_HIP_LIBRARY`. It implements exactly the HIP entry points `driver/hip.rs` resolves,
//! with HIP's C ABI, reports one gfx942 device (`gfx942:sramecc+:xnack-`, 304 compute units,
//! 64 KiB of LDS per block, wave64; `AOTRITON_HIP_DOUBLE_DEVICES=N` reports N alike, 1 to 8), and
//! records every call as one JSON object per line in the file named by `AOTRITON_HIP_DOUBLE_LOG`
//! (appended and flushed per record; nothing is recorded when the variable is unset).
//!
//! Devices: the current device is per thread (0 at first), as in HIP. A non-null stream handle
//! belongs to device `(handle >> 28) & 0xf` (so `0x5000` is a stream of device 0 and
//! `0x1000_5000` one of device 1), the null stream to the calling thread's current device. A module
//! belongs to the device current when it was loaded, and a launch of one of its functions on a
//! stream of another device is refused (`hipErrorInvalidHandle`), as HIP refuses it.
//!
//! Fault injection: while `AOTRITON_HIP_DOUBLE_FAIL` names `hipModuleLoadData`,
//! `hipModuleGetFunction` or `hipModuleLaunchKernel` (read at each call), that entry point fails
//! with `hipErrorInvalidValue` and does nothing else; its record says `"injected": true`.
//!
//! Modules are real code objects: `hipModuleLoadData` copies the image (its length read from the
//! ELF headers, as HIP does), checks it is an AMDGPU code object for gfx942 with compatible
//! xnack/sramecc settings, and reads its kernels' metadata with the ROCm code-object manager
//! (`libamd_comgr`, the reader of `../src/comgr.rs`). `hipModuleLaunchKernel` validates the launch
//! the way HIP does and lays out the kernarg segment as HIP does from `kernelParams`: explicit
//! argument `i` (metadata order, hidden arguments skipped) gets `size` bytes copied from
//! `kernelParams[i]` to its `offset`; hidden arguments stay zero here. Nothing runs: the record
//! (grid, block, LDS, stream, symbol, the image's FNV-1a 64 hash and length, the kernarg bytes
//! in hex) is the whole effect.
use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

use serde_json::{Value, json};

#[allow(dead_code)]
#[path = "../../src/comgr.rs"]
mod comgr;
#[path = "../../../doubles/recording.rs"]
mod recording;
use recording::{fnv1a64, hex, put, u16_at, u32_at, u64_at};

type HipError = c_int;

const HIP_SUCCESS: HipError = 0;
const HIP_ERROR_INVALID_VALUE: HipError = 1;
const HIP_ERROR_INVALID_DEVICE: HipError = 101;
const HIP_ERROR_INVALID_IMAGE: HipError = 200;
const HIP_ERROR_NO_BINARY_FOR_GPU: HipError = 209;
const HIP_ERROR_SHARED_OBJECT_INIT_FAILED: HipError = 303;
const HIP_ERROR_INVALID_HANDLE: HipError = 400;
const HIP_ERROR_NOT_FOUND: HipError = 500;

/// What the device reports.
const TARGET_ID: &str = "gfx942:sramecc+:xnack-";
const DEVICE_NAME: &str = "AMD Instinct MI300X (aotriton recording HIP double)";
const MULTIPROCESSORS: c_int = 304;
const MAX_SHARED_PER_BLOCK: u32 = 65536;
const WARP_SIZE: c_int = 64;
const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// ROCm 6.3.42134 (`HIP_VERSION` = major·10⁷ + minor·10⁵ + patch).
const RUNTIME_VERSION: c_int = 60342134;

/// `hipDeviceProp_tR0600`: its size and where `gcnArchName` (char[256]) sits.
const PROPS_R0600_BYTES: usize = 1472;
const PROPS_GCN_ARCH_NAME: usize = 1160;

/// ELF: `EM_AMDGPU`, `ELFOSABI_AMDGPU_HSA`, and the `e_flags` fields of AMDGPU code objects v4+.
const EM_AMDGPU: u16 = 224;
const ELFOSABI_AMDGPU_HSA: u8 = 64;
const EF_AMDGPU_MACH: u32 = 0xff;
const EF_AMDGPU_MACH_GFX942: u32 = 0x4c;
const EF_AMDGPU_FEATURE_XNACK: u32 = 0x300;
const EF_AMDGPU_FEATURE_XNACK_ON: u32 = 0x300;
const EF_AMDGPU_FEATURE_SRAMECC: u32 = 0xc00;
const EF_AMDGPU_FEATURE_SRAMECC_OFF: u32 = 0x800;
/// A code object larger than this is taken for garbage rather than read.
const MAX_IMAGE_BYTES: u64 = 1 << 30;

/// `extra` keys of `hipModuleLaunchKernel`.
const HIP_LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
const HIP_LAUNCH_PARAM_BUFFER_SIZE: usize = 2;
const HIP_LAUNCH_PARAM_END: usize = 3;

/// Fake handles: a tag in the high bits, index + 1 below.
const MODULE_TAG: usize = 0x0d0b_1e00_0000;
const FUNCTION_TAG: usize = 0x0f00_c000_0000;

/// A loaded code object.
struct Module {
    hash: u64,
    len: usize,
    kernels: Vec<comgr::Kernel>,
    /// The device current when it was loaded: its functions run there only.
    device: c_int,
}

/// A function handle: a kernel of a module.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Function {
    module: usize,
    kernel: usize,
}

#[derive(Default)]
struct State {
    modules: Vec<Module>,
    functions: Vec<Function>,
}

fn state() -> std::sync::MutexGuard<'static, State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE.get_or_init(Default::default).lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn comgr() -> Result<&'static comgr::Comgr, String> {
    static COMGR: OnceLock<Result<comgr::Comgr, String>> = OnceLock::new();
    COMGR.get_or_init(comgr::Comgr::load).as_ref().map_err(Clone::clone)
}

thread_local! {
    /// HIP's current device is per thread.
    static CURRENT_DEVICE: Cell<c_int> = const { Cell::new(0) };
}

/// The environment variables' prefix (`_LOG`, `_DEVICES`, `_FAIL`: ../../doubles/recording.rs).
const PREFIX: &str = "AOTRITON_HIP_DOUBLE";

/// Appends one record (with the call's name and status) to the log and returns the status.
fn record(call: &str, rc: HipError, fields: Value) -> HipError {
    recording::record(PREFIX, call, rc as i64, fields);
    rc
}

/// Whether the test asked this entry point to fail (module docs); records the failure.
fn injected(call: &str) -> Option<HipError> {
    recording::fail_asked(PREFIX, call).then(|| record(call, HIP_ERROR_INVALID_VALUE, json!({"injected": true})))
}

fn devices() -> c_int {
    recording::devices(PREFIX)
}

fn check_device(device: c_int) -> HipError {
    if (0..devices()).contains(&device) { HIP_SUCCESS } else { HIP_ERROR_INVALID_DEVICE }
}

/// The device of a stream handle (module docs), or None for a handle of no device the double has.
fn stream_device(stream: *mut c_void) -> Option<c_int> {
    if stream.is_null() {
        return Some(CURRENT_DEVICE.get());
    }
    recording::stream_handle_device(PREFIX, stream as usize)
}

// ---------------------------------------------------------------------------------------------
// Runtime and device queries
// ---------------------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub extern "C" fn hipInit(flags: c_uint) -> HipError {
    let rc = if flags == 0 { HIP_SUCCESS } else { HIP_ERROR_INVALID_VALUE };
    record("hipInit", rc, json!({"flags": flags}))
}

/// # Safety
/// `version` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipRuntimeGetVersion(version: *mut c_int) -> HipError {
    // SAFETY: the caller's out-pointer.
    let rc = if unsafe { put(version, RUNTIME_VERSION) } { HIP_SUCCESS } else { HIP_ERROR_INVALID_VALUE };
    record("hipRuntimeGetVersion", rc, json!({"version": RUNTIME_VERSION}))
}

/// # Safety
/// `count` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipGetDeviceCount(count: *mut c_int) -> HipError {
    // SAFETY: the caller's out-pointer.
    let rc = if unsafe { put(count, devices()) } { HIP_SUCCESS } else { HIP_ERROR_INVALID_VALUE };
    record("hipGetDeviceCount", rc, json!({"count": devices()}))
}

/// # Safety
/// `device` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipGetDevice(device: *mut c_int) -> HipError {
    let current = CURRENT_DEVICE.get();
    // SAFETY: the caller's out-pointer.
    let rc = if unsafe { put(device, current) } { HIP_SUCCESS } else { HIP_ERROR_INVALID_VALUE };
    record("hipGetDevice", rc, json!({"device": current}))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipSetDevice(device: c_int) -> HipError {
    let rc = check_device(device);
    if rc == HIP_SUCCESS {
        CURRENT_DEVICE.set(device);
    }
    record("hipSetDevice", rc, json!({"device": device}))
}

/// The stream's device (`stream_device`: the null stream's is the current device).
///
/// # Safety
/// `device` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipStreamGetDevice(stream: *mut c_void, device: *mut c_int) -> HipError {
    let Some(ordinal) = stream_device(stream) else {
        let fields = json!({"stream": stream as usize, "error": "a stream of no device"});
        return record("hipStreamGetDevice", HIP_ERROR_INVALID_HANDLE, fields);
    };
    // SAFETY: the caller's out-pointer.
    let rc = if unsafe { put(device, ordinal) } { HIP_SUCCESS } else { HIP_ERROR_INVALID_VALUE };
    record("hipStreamGetDevice", rc, json!({"stream": stream as usize, "device": ordinal}))
}

/// Serves the three attributes the runtime reads (ROCm 5 and 6 share their values); any other
/// is refused, so a new query shows up as a failed record.
///
/// # Safety
/// `value` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: c_int) -> HipError {
    let answer = match attribute {
        63 => Some(MULTIPROCESSORS),                     // hipDeviceAttributeMultiprocessorCount
        74 => Some(MAX_SHARED_PER_BLOCK as c_int),       // hipDeviceAttributeMaxSharedMemoryPerBlock
        87 => Some(WARP_SIZE),                           // hipDeviceAttributeWarpSize
        _ => None,
    };
    let rc = match (check_device(device), answer) {
        (HIP_SUCCESS, Some(v)) => {
            // SAFETY: the caller's out-pointer.
            if unsafe { put(value, v) } { HIP_SUCCESS } else { HIP_ERROR_INVALID_VALUE }
        }
        (HIP_SUCCESS, None) => HIP_ERROR_INVALID_VALUE,
        (rc, _) => rc,
    };
    record("hipDeviceGetAttribute", rc, json!({"attribute": attribute, "device": device, "value": answer}))
}

/// Fills a ROCm 6 `hipDeviceProp_tR0600` (1472 bytes): `name` and `gcnArchName`, zeros elsewhere.
///
/// # Safety
/// `props` is null or valid for writes of 1472 bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipGetDevicePropertiesR0600(props: *mut c_void, device: c_int) -> HipError {
    let mut rc = check_device(device);
    if props.is_null() {
        rc = HIP_ERROR_INVALID_VALUE;
    }
    if rc == HIP_SUCCESS {
        let mut bytes = [0u8; PROPS_R0600_BYTES];
        bytes[..DEVICE_NAME.len()].copy_from_slice(DEVICE_NAME.as_bytes());
        bytes[PROPS_GCN_ARCH_NAME..PROPS_GCN_ARCH_NAME + TARGET_ID.len()].copy_from_slice(TARGET_ID.as_bytes());
        // SAFETY: the caller's buffer holds the struct.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), props.cast::<u8>(), PROPS_R0600_BYTES) };
    }
    record("hipGetDevicePropertiesR0600", rc, json!({"device": device, "gcnArchName": TARGET_ID}))
}

/// HIP's names of the status codes this double returns.
#[unsafe(no_mangle)]
pub extern "C" fn hipGetErrorName(error: HipError) -> *const c_char {
    let name: &'static CStr = match error {
        HIP_SUCCESS => c"hipSuccess",
        HIP_ERROR_INVALID_VALUE => c"hipErrorInvalidValue",
        HIP_ERROR_INVALID_DEVICE => c"hipErrorInvalidDevice",
        HIP_ERROR_INVALID_IMAGE => c"hipErrorInvalidImage",
        HIP_ERROR_NO_BINARY_FOR_GPU => c"hipErrorNoBinaryForGpu",
        HIP_ERROR_SHARED_OBJECT_INIT_FAILED => c"hipErrorSharedObjectInitFailed",
        HIP_ERROR_INVALID_HANDLE => c"hipErrorInvalidHandle",
        HIP_ERROR_NOT_FOUND => c"hipErrorNotFound",
        _ => c"hipErrorUnknown",
    };
    record("hipGetErrorName", HIP_SUCCESS, json!({"error": error, "name": name.to_str().unwrap_or("")}));
    name.as_ptr()
}

// ---------------------------------------------------------------------------------------------
// Modules
// ---------------------------------------------------------------------------------------------

/// The code object at `image`: its bytes (the length from its ELF headers: the end of the
/// furthest header table, segment or section), after checking it is an AMDGPU code object that
/// runs on this device. Errors: the HIP status and why.
///
/// # Safety
/// `image` points at a complete ELF file (what `hipModuleLoadData` requires of its caller).
unsafe fn code_object<'a>(image: *const u8) -> Result<&'a [u8], (HipError, String)> {
    let invalid = |why: String| (HIP_ERROR_INVALID_IMAGE, why);
    // SAFETY: every ELF file starts with its 64-byte header (ELF64).
    let header = unsafe { std::slice::from_raw_parts(image, 64) };
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Err(invalid("not a little-endian ELF64 file".into()));
    }
    let (machine, os_abi, flags) = (u16_at(header, 18), header[7], u32_at(header, 48));
    if machine != EM_AMDGPU || os_abi != ELFOSABI_AMDGPU_HSA {
        return Err(invalid(format!("ELF machine {machine}, OS/ABI {os_abi}: not an AMDGPU HSA code object")));
    }
    let (phoff, shoff) = (u64_at(header, 32), u64_at(header, 40));
    let (phentsize, phnum) = (u16_at(header, 54) as u64, u16_at(header, 56) as u64);
    let (shentsize, shnum) = (u16_at(header, 58) as u64, u16_at(header, 60) as u64);
    if (phnum > 0 && phentsize < 56) || (shnum > 0 && shentsize < 64) {
        return Err(invalid(format!("ELF header entries of {phentsize} and {shentsize} bytes")));
    }
    let mut end = 64u64.max(phoff.saturating_add(phentsize * phnum)).max(shoff.saturating_add(shentsize * shnum));
    if end > MAX_IMAGE_BYTES {
        return Err(invalid(format!("ELF header tables end at byte {end}")));
    }
    // SAFETY: the header tables lie inside the file.
    let tables = unsafe { std::slice::from_raw_parts(image, end as usize) };
    for i in 0..phnum {
        let ph = &tables[(phoff + i * phentsize) as usize..];
        end = end.max(u64_at(ph, 8).saturating_add(u64_at(ph, 32))); // p_offset + p_filesz
    }
    for i in 0..shnum {
        let sh = &tables[(shoff + i * shentsize) as usize..];
        if u32_at(sh, 4) != 8 {
            end = end.max(u64_at(sh, 24).saturating_add(u64_at(sh, 32))); // sh_offset + sh_size, unless SHT_NOBITS
        }
    }
    if end > MAX_IMAGE_BYTES {
        return Err(invalid(format!("ELF contents end at byte {end}")));
    }
    let mach = flags & EF_AMDGPU_MACH;
    if mach != EF_AMDGPU_MACH_GFX942 {
        let why = format!("code object for EF_AMDGPU_MACH {mach:#x}, the device is {TARGET_ID}");
        return Err((HIP_ERROR_NO_BINARY_FOR_GPU, why));
    }
    if flags & EF_AMDGPU_FEATURE_XNACK == EF_AMDGPU_FEATURE_XNACK_ON {
        return Err((HIP_ERROR_NO_BINARY_FOR_GPU, format!("code object built for xnack+, the device is {TARGET_ID}")));
    }
    if flags & EF_AMDGPU_FEATURE_SRAMECC == EF_AMDGPU_FEATURE_SRAMECC_OFF {
        return Err((HIP_ERROR_NO_BINARY_FOR_GPU, format!("code object built for sramecc-, the device is {TARGET_ID}")));
    }
    // SAFETY: the file extends to `end`.
    Ok(unsafe { std::slice::from_raw_parts(image, end as usize) })
}

/// # Safety
/// `module` is null or valid for a write; `image` is null or a complete code object.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> HipError {
    if let Some(rc) = injected("hipModuleLoadData") {
        return rc;
    }
    if module.is_null() || image.is_null() {
        return record("hipModuleLoadData", HIP_ERROR_INVALID_VALUE, json!({"error": "null module or image pointer"}));
    }
    // SAFETY: a non-null image pointer, complete by the caller's contract.
    let bytes = match unsafe { code_object(image.cast()) } {
        Ok(bytes) => bytes,
        Err((rc, why)) => return record("hipModuleLoadData", rc, json!({"error": why})),
    };
    let (hash, len) = (fnv1a64(bytes), bytes.len());
    let kernels = match comgr().and_then(|c| c.read(bytes)) {
        Ok(object) => object.kernels,
        Err(why) => {
            let rc = if comgr().is_err() { HIP_ERROR_SHARED_OBJECT_INIT_FAILED } else { HIP_ERROR_INVALID_IMAGE };
            let fields = json!({"error": why, "image_fnv1a": format!("{hash:016x}"), "image_len": len});
            return record("hipModuleLoadData", rc, fields);
        }
    };
    let names: Vec<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
    let names = json!(names);
    let device = CURRENT_DEVICE.get();
    let mut state = state();
    state.modules.push(Module { hash, len, kernels, device });
    let handle = MODULE_TAG + state.modules.len();
    // SAFETY: checked non-null above; the caller's out-pointer.
    unsafe { module.write(handle as *mut c_void) };
    let fields =
        json!({"module": handle, "image_fnv1a": format!("{hash:016x}"), "image_len": len, "kernels": names, "device": device});
    record("hipModuleLoadData", HIP_SUCCESS, fields)
}

/// # Safety
/// `function` is null or valid for a write; `name` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipModuleGetFunction(
    function: *mut *mut c_void,
    module: *mut c_void,
    name: *const c_char,
) -> HipError {
    let call = "hipModuleGetFunction";
    if let Some(rc) = injected(call) {
        return rc;
    }
    if function.is_null() || name.is_null() {
        let fields = json!({"module": module as usize, "error": "null function or name"});
        return record(call, HIP_ERROR_INVALID_VALUE, fields);
    }
    // SAFETY: a non-null C string by the caller's contract.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
    let mut state = state();
    let index = (module as usize).wrapping_sub(MODULE_TAG).wrapping_sub(1);
    let Some(loaded) = state.modules.get(index) else {
        let fields = json!({"module": module as usize, "name": name, "error": "unknown module"});
        return record(call, HIP_ERROR_INVALID_HANDLE, fields);
    };
    let Some(kernel) = loaded.kernels.iter().position(|k| k.name == name) else {
        let fields = json!({"module": module as usize, "name": name, "error": "no such kernel"});
        return record(call, HIP_ERROR_NOT_FOUND, fields);
    };
    let wanted = Function { module: index, kernel };
    let slot = match state.functions.iter().position(|f| *f == wanted) {
        Some(slot) => slot,
        None => {
            state.functions.push(wanted);
            state.functions.len() - 1
        }
    };
    let handle = FUNCTION_TAG + slot + 1;
    // SAFETY: checked non-null above; the caller's out-pointer.
    unsafe { function.write(handle as *mut c_void) };
    record(call, HIP_SUCCESS, json!({"module": module as usize, "name": name, "function": handle}))
}

// ---------------------------------------------------------------------------------------------
// Launches
// ---------------------------------------------------------------------------------------------

/// A launch HIP would refuse: the status and why.
type Refusal = (HipError, String);

fn refuse<T>(rc: HipError, why: impl Into<String>) -> Result<T, Refusal> {
    Err((rc, why.into()))
}

/// Checks the geometry and resources of a launch of `kernel` as HIP does.
fn check_geometry(kernel: &comgr::Kernel, grid: [c_uint; 3], block: [c_uint; 3], shared: c_uint) -> Result<(), Refusal> {
    if grid.contains(&0) || block.contains(&0) {
        return refuse(HIP_ERROR_INVALID_VALUE, format!("a zero grid {grid:?} or block {block:?} dimension"));
    }
    let threads = block.iter().map(|&b| b as u64).product::<u64>();
    if threads > MAX_THREADS_PER_BLOCK as u64 {
        return refuse(HIP_ERROR_INVALID_VALUE, format!("{threads} threads per block, above {MAX_THREADS_PER_BLOCK}"));
    }
    if kernel.max_flat_workgroup_size != 0 && threads > kernel.max_flat_workgroup_size as u64 {
        return refuse(
            HIP_ERROR_INVALID_VALUE,
            format!("{threads} threads per block, above the kernel's {}", kernel.max_flat_workgroup_size),
        );
    }
    // HIP's global work size (grid · block per dimension) is a 32-bit quantity.
    if (0..3).any(|d| grid[d] as u64 * block[d] as u64 > u32::MAX as u64) {
        return refuse(HIP_ERROR_INVALID_VALUE, format!("grid {grid:?} × block {block:?} overflows 32 bits"));
    }
    let lds = shared as u64 + kernel.group_segment_fixed_size as u64;
    if lds > MAX_SHARED_PER_BLOCK as u64 {
        let why = format!("{lds} bytes of LDS (dynamic {shared}), above {MAX_SHARED_PER_BLOCK}");
        return refuse(HIP_ERROR_INVALID_VALUE, why);
    }
    Ok(())
}

/// The kernarg segment HIP builds for `kernel`: from `kernel_params` (one pointer per explicit
/// argument) or from an `extra` buffer; hidden arguments zero.
///
/// # Safety
/// As `hipModuleLaunchKernel`'s: each pointer the kernel's metadata says is there is valid.
unsafe fn kernarg_segment(
    kernel: &comgr::Kernel,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<Vec<u8>, Refusal> {
    let mut segment = vec![0u8; kernel.kernarg_segment_size as usize];
    let explicit: Vec<&comgr::Arg> = kernel.args.iter().filter(|a| !a.is_hidden()).collect();
    let explicit_end = explicit.iter().map(|a| (a.offset + a.size) as usize).max().unwrap_or(0);
    if explicit_end > segment.len() {
        let why = format!("arguments end at {explicit_end}, past the {}-byte segment", segment.len());
        return refuse(HIP_ERROR_INVALID_IMAGE, why);
    }
    match (params.is_null(), extra.is_null()) {
        (false, false) => refuse(HIP_ERROR_INVALID_VALUE, "both kernelParams and extra are given"),
        (true, true) if !explicit.is_empty() => {
            refuse(HIP_ERROR_INVALID_VALUE, "neither kernelParams nor extra is given")
        }
        (true, true) => Ok(segment),
        (false, true) => {
            for (i, arg) in explicit.iter().enumerate() {
                // SAFETY: kernelParams has one entry per explicit argument (the caller's contract).
                let value = unsafe { *params.add(i) };
                if value.is_null() {
                    return refuse(HIP_ERROR_INVALID_VALUE, format!("kernelParams[{i}] is null"));
                }
                let at = arg.offset as usize;
                // SAFETY: the entry points at the argument's `size` bytes.
                let bytes = unsafe { std::slice::from_raw_parts(value.cast::<u8>(), arg.size as usize) };
                segment[at..at + bytes.len()].copy_from_slice(bytes);
            }
            Ok(segment)
        }
        (true, false) => {
            // {HIP_LAUNCH_PARAM_BUFFER_POINTER, buf, HIP_LAUNCH_PARAM_BUFFER_SIZE, &size, HIP_LAUNCH_PARAM_END}
            let (mut buffer, mut size) = (std::ptr::null::<u8>(), None);
            let mut i = 0;
            loop {
                // SAFETY: `extra` is a key/value list ending with HIP_LAUNCH_PARAM_END.
                let key = unsafe { *extra.add(i) } as usize;
                match key {
                    HIP_LAUNCH_PARAM_END => break,
                    HIP_LAUNCH_PARAM_BUFFER_POINTER => buffer = unsafe { *extra.add(i + 1) }.cast(),
                    // SAFETY: the value points at a size_t.
                    HIP_LAUNCH_PARAM_BUFFER_SIZE => size = Some(unsafe { *(*extra.add(i + 1)).cast::<usize>() }),
                    other => return refuse(HIP_ERROR_INVALID_VALUE, format!("unknown extra key {other:#x}")),
                }
                i += 2;
            }
            let (false, Some(size)) = (buffer.is_null(), size) else {
                return refuse(HIP_ERROR_INVALID_VALUE, "extra lacks the argument buffer or its size");
            };
            if size < explicit_end {
                let why = format!("an extra buffer of {size} bytes; the arguments need {explicit_end}");
                return refuse(HIP_ERROR_INVALID_VALUE, why);
            }
            let n = size.min(segment.len());
            // SAFETY: the buffer holds `size` bytes.
            segment[..n].copy_from_slice(unsafe { std::slice::from_raw_parts(buffer, n) });
            Ok(segment)
        }
    }
}

/// # Safety
/// `kernel_params` and `extra` as HIP requires: null, or one valid pointer per explicit kernel
/// argument (resp. a terminated key/value list).
#[allow(clippy::too_many_arguments)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipModuleLaunchKernel(
    function: *mut c_void,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared: c_uint,
    stream: *mut c_void,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> HipError {
    if let Some(rc) = injected("hipModuleLaunchKernel") {
        return rc;
    }
    let (grid, block) = ([grid_x, grid_y, grid_z], [block_x, block_y, block_z]);
    let mut fields = json!({
        "function": function as usize,
        "grid": grid,
        "block": block,
        "shared": shared,
        "stream": stream as usize,
    });
    let launched = (|| {
        let state = state();
        let index = (function as usize).wrapping_sub(FUNCTION_TAG).wrapping_sub(1);
        let Some(&Function { module, kernel }) = state.functions.get(index) else {
            return refuse(HIP_ERROR_INVALID_HANDLE, "null or unknown function handle");
        };
        let module = &state.modules[module];
        let kernel = &module.kernels[kernel];
        let object = fields.as_object_mut().unwrap();
        object.insert("symbol".into(), kernel.name.clone().into());
        object.insert("image_fnv1a".into(), format!("{:016x}", module.hash).into());
        object.insert("image_len".into(), module.len.into());
        let Some(device) = stream_device(stream) else {
            return refuse(HIP_ERROR_INVALID_HANDLE, "a stream of no device");
        };
        object.insert("device".into(), device.into());
        if device != module.device {
            let why = format!("a function of a module loaded on device {} launched on device {device}", module.device);
            return refuse(HIP_ERROR_INVALID_HANDLE, why);
        }
        check_geometry(kernel, grid, block, shared)?;
        // SAFETY: the caller's contract.
        let segment = unsafe { kernarg_segment(kernel, kernel_params, extra) }?;
        Ok(hex(&segment))
    })();
    let object = fields.as_object_mut().unwrap();
    let rc = match launched {
        Ok(kernarg) => {
            object.insert("kernarg".into(), kernarg.into());
            HIP_SUCCESS
        }
        Err((rc, why)) => {
            object.insert("error".into(), why.into());
            rc
        }
    };
    record("hipModuleLaunchKernel", rc, fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_queries() {
        let mut props = vec![0xffu8; 4096];
        // SAFETY: a buffer larger than the struct.
        assert_eq!(unsafe { hipGetDevicePropertiesR0600(props.as_mut_ptr().cast(), 0) }, HIP_SUCCESS);
        let name = &props[PROPS_GCN_ARCH_NAME..PROPS_GCN_ARCH_NAME + 256];
        assert_eq!(&name[..TARGET_ID.len() + 1], b"gfx942:sramecc+:xnack-\0");
        assert_eq!(props[PROPS_R0600_BYTES], 0xff, "nothing written past the struct");
        // SAFETY: as above.
        assert_eq!(unsafe { hipGetDevicePropertiesR0600(props.as_mut_ptr().cast(), 1) }, HIP_ERROR_INVALID_DEVICE);
        let mut value = 0;
        for (attribute, want) in [(63, 304), (74, 65536), (87, 64)] {
            // SAFETY: a valid out-pointer.
            assert_eq!(unsafe { hipDeviceGetAttribute(&mut value, attribute, 0) }, HIP_SUCCESS);
            assert_eq!(value, want);
        }
        // SAFETY: as above.
        assert_eq!(unsafe { hipDeviceGetAttribute(&mut value, 5, 0) }, HIP_ERROR_INVALID_VALUE);
        assert_eq!(hipSetDevice(1), HIP_ERROR_INVALID_DEVICE);
        // One device (AOTRITON_HIP_DOUBLE_DEVICES unset): streams of device 0 only.
        let mut device = -1;
        // SAFETY: valid out-pointers; the handles are never dereferenced.
        unsafe {
            assert_eq!(hipStreamGetDevice(0x5000 as *mut c_void, &mut device), HIP_SUCCESS);
            assert_eq!(device, 0);
            assert_eq!(hipStreamGetDevice(0x1000_5000 as *mut c_void, &mut device), HIP_ERROR_INVALID_HANDLE);
        }
        // SAFETY: null out-pointers are refused.
        assert_eq!(unsafe { hipGetDeviceCount(std::ptr::null_mut()) }, HIP_ERROR_INVALID_VALUE);
        // SAFETY: hipGetErrorName returns static strings.
        let name = unsafe { CStr::from_ptr(hipGetErrorName(HIP_ERROR_NOT_FOUND)) };
        assert_eq!(name, c"hipErrorNotFound");
    }

    #[test]
    fn bad_images_and_launches_are_refused() {
        let mut module = std::ptr::null_mut();
        let not_elf = [0u8; 64];
        // SAFETY: 64 readable bytes.
        assert_eq!(unsafe { hipModuleLoadData(&mut module, not_elf.as_ptr().cast()) }, HIP_ERROR_INVALID_IMAGE);
        let mut elf = [0u8; 64];
        elf[..8].copy_from_slice(b"\x7fELF\x02\x01\x01\x40");
        elf[18..20].copy_from_slice(&EM_AMDGPU.to_le_bytes());
        elf[48..52].copy_from_slice(&0x54au32.to_le_bytes()); // gfx942's neighbour 0x4a
        // SAFETY: a 64-byte ELF header with no tables.
        assert_eq!(unsafe { hipModuleLoadData(&mut module, elf.as_ptr().cast()) }, HIP_ERROR_NO_BINARY_FOR_GPU);
        elf[48..52].copy_from_slice(&0x34cu32.to_le_bytes()); // gfx942, xnack+
        // SAFETY: as above.
        assert_eq!(unsafe { hipModuleLoadData(&mut module, elf.as_ptr().cast()) }, HIP_ERROR_NO_BINARY_FOR_GPU);
        let launch = |function: usize| {
            // SAFETY: no parameters are read for an unknown function.
            unsafe {
                let null = std::ptr::null_mut();
                hipModuleLaunchKernel(function as *mut c_void, 1, 1, 1, 64, 1, 1, 0, null, null.cast(), null.cast())
            }
        };
        assert_eq!(launch(0), HIP_ERROR_INVALID_HANDLE);
        assert_eq!(launch(FUNCTION_TAG + 1000), HIP_ERROR_INVALID_HANDLE);
        let mut function = std::ptr::null_mut();
        // SAFETY: valid pointers; the module is unknown.
        let rc = unsafe { hipModuleGetFunction(&mut function, (MODULE_TAG + 77) as *mut c_void, c"attn_fwd".as_ptr()) };
        assert_eq!(rc, HIP_ERROR_INVALID_HANDLE);
    }

    #[test]
    fn geometry_is_checked_as_hip_does() {
        let kernel = comgr::Kernel {
            name: "k".into(),
            symbol: "k.kd".into(),
            kernarg_segment_size: 16,
            kernarg_segment_align: 8,
            group_segment_fixed_size: 1024,
            private_segment_fixed_size: 0,
            wavefront_size: 64,
            sgpr_count: 0,
            vgpr_count: 0,
            agpr_count: 0,
            sgpr_spill_count: 0,
            vgpr_spill_count: 0,
            max_flat_workgroup_size: 256,
            args: vec![comgr::Arg { name: String::new(), offset: 8, size: 4, value_kind: "by_value".into() }],
        };
        assert!(check_geometry(&kernel, [3, 2, 1], [256, 1, 1], 64512).is_ok());
        for (grid, block, shared) in [
            ([0, 1, 1], [256, 1, 1], 0),
            ([1, 1, 1], [0, 1, 1], 0),
            ([1, 1, 1], [512, 1, 1], 0),         // above the kernel's max_flat_workgroup_size
            ([1, 1, 1], [64, 32, 1], 0),         // 2048 threads
            ([1, 1, 1], [256, 1, 1], 64513),     // LDS: dynamic + the kernel's static 1024
            ([1 << 24, 1, 1], [256, 1, 1], 0),   // 2^32 work-items in x
        ] {
            let refused = check_geometry(&kernel, grid, block, shared).unwrap_err();
            assert_eq!(refused.0, HIP_ERROR_INVALID_VALUE, "{grid:?} {block:?} {shared}");
        }
        let mut value = 0x1122_3344u32;
        let mut params = [(&mut value as *mut u32).cast::<c_void>()];
        // SAFETY: one parameter for the kernel's one explicit argument.
        let segment = unsafe { kernarg_segment(&kernel, params.as_mut_ptr(), std::ptr::null_mut()) }.unwrap();
        assert_eq!(segment, [0, 0, 0, 0, 0, 0, 0, 0, 0x44, 0x33, 0x22, 0x11, 0, 0, 0, 0]);
        let mut extra = [std::ptr::null_mut::<c_void>(); 1];
        // SAFETY: both are given: refused before either is read.
        let both = unsafe { kernarg_segment(&kernel, params.as_mut_ptr(), extra.as_mut_ptr()) };
        assert_eq!(both.unwrap_err().0, HIP_ERROR_INVALID_VALUE);
        let mut buffer = [7u8; 12];
        let mut size = buffer.len();
        let mut extra = [
            HIP_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            buffer.as_mut_ptr().cast(),
            HIP_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast(),
            HIP_LAUNCH_PARAM_END as *mut c_void,
        ];
        // SAFETY: a terminated extra list over a 12-byte buffer.
        let segment = unsafe { kernarg_segment(&kernel, std::ptr::null_mut(), extra.as_mut_ptr()) }.unwrap();
        assert_eq!(segment, [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0, 0, 0, 0]);
    }
}
