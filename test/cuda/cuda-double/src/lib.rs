//! A recording CUDA driver double: a stand-in for `libcuda.so.1` (the runtime opens the driver by
//! that name, so a folder holding this library under that name goes first on `LD_LIBRARY_PATH`).
//! It implements exactly the entry points `driver/cuda.rs` resolves, with the driver's C ABI,
//! reports `AOTRITON_CUDA_DOUBLE_DEVICES` (1 to 8, default 1) sm_90 devices (132 multiprocessors,
//! 227 KiB of opt-in shared memory per block, warps of 32), and records every call as one JSON
//! object per line in the file named by `AOTRITON_CUDA_DOUBLE_LOG` (appended and flushed per
//! record; nothing is recorded when the variable is unset).
//!
//! Contexts: one primary context per device, current per thread through a stack (push/pop), as
//! in the driver. A non-null stream handle belongs to device `(handle >> 28) & 0xf` (so `0x5000`
//! is a stream of device 0 and `0x1000_5000` one of device 1); the null stream to the current
//! context. `cuCtxGetId` gives each context an id of its own.
//!
//! Modules are real cubins: `cuModuleLoadData` reads the image's ELF headers (its length from
//! them, as the driver does), checks it is a CUDA ELF for sm_90, and reads each kernel's
//! parameters (ordinal, offset, size) from its `.nv.info.<kernel>` section
//! (`EIATTR_KPARAM_INFO`). A module belongs to the current context's device. `cuLaunchKernel`
//! validates the launch as the driver does (grid and block limits; dynamic shared memory above 48
//! KiB only after `cuFuncSetAttribute` opted the function in; the stream's context current; the
//! function loaded on the stream's device) and lays the parameters out from `kernelParams` the way
//! the driver builds the parameter buffer (recorded with each parameter's offset and size). `cuTensorMapEncodeTiled` checks what the driver checks
//! of a tiled descriptor (rank, alignment, strides, box) and writes a descriptor that names its
//! inputs (the address, then a hash of every argument). Nothing runs: the records (grid, block,
//! shared memory, stream, device, symbol, the image's FNV-1a 64 hash, the parameter bytes in hex)
//! are the whole effect.
//!
//! Fault injection: while `AOTRITON_CUDA_DOUBLE_FAIL` names one of `cuModuleLoadData`,
//! `cuModuleGetFunction`, `cuFuncSetAttribute`, `cuLaunchKernel` or `cuTensorMapEncodeTiled`
//! (read at each call), that entry point fails with `CUDA_ERROR_INVALID_VALUE` and does nothing
//! else; its record says `"injected": true`.
use std::cell::RefCell;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::{Mutex, OnceLock};

use serde_json::{Value, json};

#[path = "../../../doubles/recording.rs"]
mod recording;
use recording::{fnv1a64, hex, put, u16_at, u32_at, u64_at};

type CuResult = c_uint;

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
const CUDA_ERROR_INVALID_DEVICE: CuResult = 101;
const CUDA_ERROR_INVALID_IMAGE: CuResult = 200;
const CUDA_ERROR_INVALID_CONTEXT: CuResult = 201;
const CUDA_ERROR_NO_BINARY_FOR_GPU: CuResult = 209;
const CUDA_ERROR_INVALID_HANDLE: CuResult = 400;
const CUDA_ERROR_NOT_FOUND: CuResult = 500;

/// What each device reports.
const ARCH: u32 = 90;
const MULTIPROCESSORS: c_int = 132;
const MAX_SHARED_OPTIN: c_int = 232448;
const DEFAULT_SHARED: u32 = 48 * 1024;
const WARP_SIZE: c_int = 32;
/// CUDA 12.8.
const DRIVER_VERSION: c_int = 12080;

/// `CUdevice_attribute` values the runtime reads.
const ATTR_WARP_SIZE: c_int = 10;
const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
const ATTR_CC_MAJOR: c_int = 75;
const ATTR_CC_MINOR: c_int = 76;
const ATTR_MAX_SHARED_OPTIN: c_int = 97;
/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
const FUNC_ATTR_MAX_DYNAMIC_SHARED: c_int = 8;

/// ELF: `EM_CUDA`; `.nv.info` attribute formats and the kernel-parameter attribute.
const EM_CUDA: u16 = 190;
const EIFMT_NVAL: u8 = 1;
const EIFMT_BVAL: u8 = 2;
const EIFMT_HVAL: u8 = 3;
const EIFMT_SVAL: u8 = 4;
const EIATTR_KPARAM_INFO: u8 = 0x17;
/// A cubin larger than this is taken for garbage rather than read.
const MAX_IMAGE_BYTES: u64 = 1 << 30;

/// Fake handles: a tag in the high bits, index + 1 below.
const CONTEXT_TAG: usize = 0x0c0c_7000_0000;
const MODULE_TAG: usize = 0x0d0b_1e00_0000;
const FUNCTION_TAG: usize = 0x0f00_c000_0000;

/// One parameter of a kernel, from `EIATTR_KPARAM_INFO`.
#[derive(Clone, Copy)]
struct Param {
    ordinal: usize,
    offset: usize,
    size: usize,
}

struct Kernel {
    name: String,
    params: Vec<Param>,
}

/// A loaded cubin.
struct Module {
    hash: u64,
    len: usize,
    kernels: Vec<Kernel>,
    device: c_int,
}

#[derive(Clone, Copy)]
struct Function {
    module: usize,
    kernel: usize,
    /// Dynamic shared memory the function was opted in to (`cuFuncSetAttribute`).
    max_dynamic_shared: u32,
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

thread_local! {
    /// The calling thread's context stack (devices, top last).
    static CONTEXTS: RefCell<Vec<c_int>> = const { RefCell::new(Vec::new()) };
}

/// The environment variables' prefix (`_LOG`, `_DEVICES`, `_FAIL`: ../../../doubles/recording.rs).
const PREFIX: &str = "AOTRITON_CUDA_DOUBLE";

/// Appends one record (with the call's name and status) to the log and returns the status.
fn record(call: &str, rc: CuResult, fields: Value) -> CuResult {
    recording::record(PREFIX, call, rc as i64, fields);
    rc
}

/// Whether the test asked this entry point to fail (module docs); records the failure.
fn injected(call: &str) -> Option<CuResult> {
    recording::fail_asked(PREFIX, call).then(|| record(call, CUDA_ERROR_INVALID_VALUE, json!({"injected": true})))
}

fn devices() -> c_int {
    recording::devices(PREFIX)
}

fn context_of(device: c_int) -> usize {
    CONTEXT_TAG + device as usize + 1
}

fn device_of_context(context: *mut c_void) -> Option<c_int> {
    let device = (context as usize).wrapping_sub(CONTEXT_TAG).wrapping_sub(1);
    (device < devices() as usize).then_some(device as c_int)
}

fn current_device() -> Option<c_int> {
    CONTEXTS.with(|stack| stack.borrow().last().copied())
}

/// The device of a stream handle (module docs), or None: a handle of no device, or the null
/// stream with no context current.
fn stream_device(stream: *mut c_void) -> Option<c_int> {
    if stream.is_null() {
        return current_device();
    }
    recording::stream_handle_device(PREFIX, stream as usize)
}

// ---------------------------------------------------------------------------------------------
// Driver, devices and contexts
// ---------------------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CuResult {
    let rc = if flags == 0 { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE };
    record("cuInit", rc, json!({"flags": flags}))
}

/// # Safety
/// `version` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CuResult {
    // SAFETY: the caller's out-pointer.
    let rc = if unsafe { put(version, DRIVER_VERSION) } { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE };
    record("cuDriverGetVersion", rc, json!({"version": DRIVER_VERSION}))
}

/// The driver's names of the statuses this double returns.
///
/// # Safety
/// `name` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CuResult, name: *mut *const c_char) -> CuResult {
    let text: &'static CStr = match error {
        CUDA_SUCCESS => c"CUDA_SUCCESS",
        CUDA_ERROR_INVALID_VALUE => c"CUDA_ERROR_INVALID_VALUE",
        CUDA_ERROR_INVALID_DEVICE => c"CUDA_ERROR_INVALID_DEVICE",
        CUDA_ERROR_INVALID_IMAGE => c"CUDA_ERROR_INVALID_IMAGE",
        CUDA_ERROR_INVALID_CONTEXT => c"CUDA_ERROR_INVALID_CONTEXT",
        CUDA_ERROR_NO_BINARY_FOR_GPU => c"CUDA_ERROR_NO_BINARY_FOR_GPU",
        CUDA_ERROR_INVALID_HANDLE => c"CUDA_ERROR_INVALID_HANDLE",
        CUDA_ERROR_NOT_FOUND => c"CUDA_ERROR_NOT_FOUND",
        _ => return CUDA_ERROR_INVALID_VALUE,
    };
    // SAFETY: the caller's out-pointer.
    if unsafe { put(name, text.as_ptr()) } { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
}

/// # Safety
/// `value` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: c_int) -> CuResult {
    let answer = match attribute {
        ATTR_WARP_SIZE => Some(WARP_SIZE),
        ATTR_MULTIPROCESSOR_COUNT => Some(MULTIPROCESSORS),
        ATTR_CC_MAJOR => Some(ARCH as c_int / 10),
        ATTR_CC_MINOR => Some(ARCH as c_int % 10),
        ATTR_MAX_SHARED_OPTIN => Some(MAX_SHARED_OPTIN),
        _ => None,
    };
    let rc = if !(0..devices()).contains(&device) {
        CUDA_ERROR_INVALID_DEVICE
    } else {
        // SAFETY: the caller's out-pointer.
        match answer {
            Some(v) if unsafe { put(value, v) } => CUDA_SUCCESS,
            _ => CUDA_ERROR_INVALID_VALUE,
        }
    };
    record("cuDeviceGetAttribute", rc, json!({"attribute": attribute, "device": device, "value": answer}))
}

/// # Safety
/// `context` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx(stream: *mut c_void, context: *mut *mut c_void) -> CuResult {
    let Some(device) = stream_device(stream) else {
        let why = if stream.is_null() { "the null stream with no context current" } else { "a stream of no device" };
        return record("cuStreamGetCtx", CUDA_ERROR_INVALID_HANDLE, json!({"stream": stream as usize, "error": why}));
    };
    let handle = context_of(device);
    // SAFETY: the caller's out-pointer.
    let rc = if unsafe { put(context, handle as *mut c_void) } { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE };
    record("cuStreamGetCtx", rc, json!({"stream": stream as usize, "context": handle, "device": device}))
}

/// # Safety
/// `id` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetId(context: *mut c_void, id: *mut c_ulonglong) -> CuResult {
    let Some(device) = device_of_context(context) else {
        return record("cuCtxGetId", CUDA_ERROR_INVALID_CONTEXT, json!({"context": context as usize}));
    };
    let value = 1000 + device as c_ulonglong;
    // SAFETY: the caller's out-pointer.
    let rc = if unsafe { put(id, value) } { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE };
    record("cuCtxGetId", rc, json!({"context": context as usize, "id": value}))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent_v2(context: *mut c_void) -> CuResult {
    let Some(device) = device_of_context(context) else {
        return record("cuCtxPushCurrent", CUDA_ERROR_INVALID_CONTEXT, json!({"context": context as usize}));
    };
    CONTEXTS.with(|stack| stack.borrow_mut().push(device));
    record("cuCtxPushCurrent", CUDA_SUCCESS, json!({"context": context as usize, "device": device}))
}

/// # Safety
/// `context` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(context: *mut *mut c_void) -> CuResult {
    let Some(device) = CONTEXTS.with(|stack| stack.borrow_mut().pop()) else {
        return record("cuCtxPopCurrent", CUDA_ERROR_INVALID_CONTEXT, json!({"error": "no context current"}));
    };
    // SAFETY: the caller's out-pointer (null: the driver does not write it).
    unsafe { put(context, context_of(device) as *mut c_void) };
    record("cuCtxPopCurrent", CUDA_SUCCESS, json!({"device": device}))
}

/// # Safety
/// `device` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut c_int) -> CuResult {
    let Some(current) = current_device() else {
        return record("cuCtxGetDevice", CUDA_ERROR_INVALID_CONTEXT, json!({"error": "no context current"}));
    };
    // SAFETY: the caller's out-pointer.
    let rc = if unsafe { put(device, current) } { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE };
    record("cuCtxGetDevice", rc, json!({"device": current}))
}

/// The current context's device, for the test that drives the double itself: `cuCtxGetDevice`
/// without a record, -1 with none current.
#[unsafe(no_mangle)]
pub extern "C" fn aotriton_cuda_double_current_device() -> c_int {
    current_device().unwrap_or(-1)
}

// ---------------------------------------------------------------------------------------------
// Modules
// ---------------------------------------------------------------------------------------------

/// The cubin at `image`: its bytes (the length from its ELF headers: the end of the furthest
/// header table or section), after checking it is a CUDA ELF for this device's arch.
///
/// # Safety
/// `image` points at a complete ELF file (what `cuModuleLoadData` requires of its caller).
unsafe fn cubin<'a>(image: *const u8) -> Result<&'a [u8], (CuResult, String)> {
    let invalid = |why: String| (CUDA_ERROR_INVALID_IMAGE, why);
    // SAFETY: every ELF file starts with its 64-byte header (ELF64).
    let header = unsafe { std::slice::from_raw_parts(image, 64) };
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Err(invalid("not a little-endian ELF64 file".into()));
    }
    if u16_at(header, 18) != EM_CUDA {
        return Err(invalid(format!("machine {} is not EM_CUDA", u16_at(header, 18))));
    }
    let arch = u32_at(header, 48) & 0xff;
    if arch != ARCH {
        return Err((CUDA_ERROR_NO_BINARY_FOR_GPU, format!("a cubin for sm_{arch}, the device is sm_{ARCH}")));
    }
    let (phoff, shoff) = (u64_at(header, 32), u64_at(header, 40));
    let (phentsize, phnum) = (u16_at(header, 54) as u64, u16_at(header, 56) as u64);
    let (shentsize, shnum) = (u16_at(header, 58) as u64, u16_at(header, 60) as u64);
    let mut end = (phoff + phentsize * phnum).max(shoff + shentsize * shnum);
    if end > MAX_IMAGE_BYTES {
        return Err(invalid(format!("header tables end at {end}")));
    }
    // SAFETY: the section headers lie inside the file (its own header says where).
    let sections = unsafe { std::slice::from_raw_parts(image.add(shoff as usize), (shentsize * shnum) as usize) };
    for i in 0..shnum as usize {
        let s = &sections[i * shentsize as usize..];
        let (kind, offset, size) = (u32_at(s, 4), u64_at(s, 24), u64_at(s, 32));
        if kind != 8 {
            // SHT_NOBITS occupies no file bytes.
            end = end.max(offset.saturating_add(size));
        }
    }
    if end > MAX_IMAGE_BYTES {
        return Err(invalid(format!("sections end at {end}")));
    }
    // SAFETY: the file extends to `end`.
    Ok(unsafe { std::slice::from_raw_parts(image, end as usize) })
}

/// The kernels of a cubin: each `.nv.info.<name>` section's parameters.
fn kernels(elf: &[u8]) -> Result<Vec<Kernel>, String> {
    let shoff = u64_at(elf, 40) as usize;
    let (shentsize, shnum, shstrndx) = (u16_at(elf, 58) as usize, u16_at(elf, 60) as usize, u16_at(elf, 62) as usize);
    let section = |i: usize| {
        let s = &elf[shoff + i * shentsize..];
        (u32_at(s, 0) as usize, u64_at(s, 24) as usize, u64_at(s, 32) as usize)
    };
    let (_, names_at, _) = section(shstrndx);
    let name = |at: usize| {
        let bytes = &elf[names_at + at..];
        let n = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..n]).into_owned()
    };
    let mut kernels = Vec::new();
    for i in 0..shnum {
        let (name_at, offset, size) = section(i);
        let Some(kernel) = name(name_at).strip_prefix(".nv.info.").map(str::to_string) else { continue };
        let info = &elf[offset..offset + size];
        let mut params = Vec::new();
        let mut at = 0;
        while at + 2 <= info.len() {
            let (format, attribute) = (info[at], info[at + 1]);
            at += 2;
            // Every record is 4-byte aligned: a byte or half-word value, or none, fills 2 bytes.
            let len = match format {
                EIFMT_NVAL | EIFMT_BVAL | EIFMT_HVAL => 2,
                EIFMT_SVAL => {
                    let n = u16_at(info, at) as usize;
                    at += 2;
                    n
                }
                other => return Err(format!("{kernel}: .nv.info attribute format {other:#x}")),
            };
            if attribute == EIATTR_KPARAM_INFO && format == EIFMT_SVAL && len >= 12 {
                let bits = u32_at(info, at + 8);
                params.push(Param {
                    ordinal: u16_at(info, at + 4) as usize,
                    offset: u16_at(info, at + 6) as usize,
                    size: ((bits >> 18) & 0x3fff) as usize,
                });
            }
            at += len;
        }
        params.sort_by_key(|p| p.ordinal);
        if params.iter().enumerate().any(|(i, p)| p.ordinal != i) {
            return Err(format!("{kernel}: parameter ordinals are not 0..{}", params.len()));
        }
        kernels.push(Kernel { name: kernel, params });
    }
    Ok(kernels)
}

/// # Safety
/// `module` is null or valid for a write; `image` is null or a complete cubin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> CuResult {
    let call = "cuModuleLoadData";
    if let Some(rc) = injected(call) {
        return rc;
    }
    if module.is_null() || image.is_null() {
        return record(call, CUDA_ERROR_INVALID_VALUE, json!({"error": "null module or image pointer"}));
    }
    let Some(device) = current_device() else {
        return record(call, CUDA_ERROR_INVALID_CONTEXT, json!({"error": "no context current"}));
    };
    // SAFETY: a non-null image pointer, complete by the caller's contract.
    let bytes = match unsafe { cubin(image.cast()) } {
        Ok(bytes) => bytes,
        Err((rc, why)) => return record(call, rc, json!({"error": why})),
    };
    let (hash, len) = (fnv1a64(bytes), bytes.len());
    let kernels = match kernels(bytes) {
        Ok(k) if !k.is_empty() => k,
        Ok(_) => return record(call, CUDA_ERROR_INVALID_IMAGE, json!({"error": "no kernel in the cubin"})),
        Err(why) => return record(call, CUDA_ERROR_INVALID_IMAGE, json!({"error": why})),
    };
    let names: Vec<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
    let fields = json!({"image_fnv1a": format!("{hash:016x}"), "image_len": len, "kernels": names, "device": device});
    let mut state = state();
    state.modules.push(Module { hash, len, kernels, device });
    let handle = MODULE_TAG + state.modules.len();
    // SAFETY: checked non-null above; the caller's out-pointer.
    unsafe { module.write(handle as *mut c_void) };
    let mut fields = fields;
    fields.as_object_mut().unwrap().insert("module".into(), handle.into());
    record(call, CUDA_SUCCESS, fields)
}

/// # Safety
/// `function` is null or valid for a write; `name` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(function: *mut *mut c_void, module: *mut c_void, name: *const c_char) -> CuResult {
    let call = "cuModuleGetFunction";
    if let Some(rc) = injected(call) {
        return rc;
    }
    if function.is_null() || name.is_null() {
        return record(call, CUDA_ERROR_INVALID_VALUE, json!({"module": module as usize, "error": "null function or name"}));
    }
    // SAFETY: a non-null C string by the caller's contract.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
    let mut state = state();
    let index = (module as usize).wrapping_sub(MODULE_TAG).wrapping_sub(1);
    let Some(loaded) = state.modules.get(index) else {
        return record(call, CUDA_ERROR_INVALID_HANDLE, json!({"module": module as usize, "name": name, "error": "unknown module"}));
    };
    let Some(kernel) = loaded.kernels.iter().position(|k| k.name == name) else {
        return record(call, CUDA_ERROR_NOT_FOUND, json!({"module": module as usize, "name": name, "error": "no such kernel"}));
    };
    state.functions.push(Function { module: index, kernel, max_dynamic_shared: DEFAULT_SHARED });
    let handle = FUNCTION_TAG + state.functions.len();
    // SAFETY: checked non-null above; the caller's out-pointer.
    unsafe { function.write(handle as *mut c_void) };
    record(call, CUDA_SUCCESS, json!({"module": module as usize, "name": name, "function": handle}))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetAttribute(function: *mut c_void, attribute: c_int, value: c_int) -> CuResult {
    if let Some(rc) = injected("cuFuncSetAttribute") {
        return rc;
    }
    let fields = json!({"function": function as usize, "attribute": attribute, "value": value});
    let mut state = state();
    let index = (function as usize).wrapping_sub(FUNCTION_TAG).wrapping_sub(1);
    let Some(f) = state.functions.get_mut(index) else {
        return record("cuFuncSetAttribute", CUDA_ERROR_INVALID_HANDLE, fields);
    };
    let rc = match attribute {
        FUNC_ATTR_MAX_DYNAMIC_SHARED if (0..=MAX_SHARED_OPTIN).contains(&value) => {
            f.max_dynamic_shared = value as u32;
            CUDA_SUCCESS
        }
        _ => CUDA_ERROR_INVALID_VALUE,
    };
    record("cuFuncSetAttribute", rc, fields)
}

// ---------------------------------------------------------------------------------------------
// Launches and TMA descriptors
// ---------------------------------------------------------------------------------------------

/// A launch the driver would refuse: the status and why.
type Refusal = (CuResult, String);

fn refuse<T>(rc: CuResult, why: impl Into<String>) -> Result<T, Refusal> {
    Err((rc, why.into()))
}

/// # Safety
/// `kernel_params` holds one valid pointer per kernel parameter (the driver's contract).
#[allow(clippy::too_many_arguments)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
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
) -> CuResult {
    if let Some(rc) = injected("cuLaunchKernel") {
        return rc;
    }
    let (grid, block) = ([grid_x, grid_y, grid_z], [block_x, block_y, block_z]);
    let mut fields = json!({"function": function as usize, "grid": grid, "block": block, "shared": shared,
                            "stream": stream as usize});
    let launched = (|| {
        let state = state();
        let index = (function as usize).wrapping_sub(FUNCTION_TAG).wrapping_sub(1);
        let Some(&Function { module, kernel, max_dynamic_shared }) = state.functions.get(index) else {
            return refuse(CUDA_ERROR_INVALID_HANDLE, "null or unknown function handle");
        };
        let module = &state.modules[module];
        let kernel = &module.kernels[kernel];
        let object = fields.as_object_mut().unwrap();
        object.insert("symbol".into(), kernel.name.clone().into());
        object.insert("image_fnv1a".into(), format!("{:016x}", module.hash).into());
        object.insert("image_len".into(), module.len.into());
        let Some(device) = stream_device(stream) else {
            return refuse(CUDA_ERROR_INVALID_HANDLE, "a stream of no device");
        };
        object.insert("device".into(), device.into());
        if current_device() != Some(device) {
            return refuse(CUDA_ERROR_INVALID_CONTEXT, format!("the stream's context (device {device}) is not current"));
        }
        if module.device != device {
            let why = format!("a function of a module loaded on device {} launched on device {device}", module.device);
            return refuse(CUDA_ERROR_INVALID_HANDLE, why);
        }
        if grid.contains(&0) || block.contains(&0) {
            return refuse(CUDA_ERROR_INVALID_VALUE, format!("a zero grid {grid:?} or block {block:?} dimension"));
        }
        if grid_y > 65535 || grid_z > 65535 || grid_x > i32::MAX as u32 {
            return refuse(CUDA_ERROR_INVALID_VALUE, format!("grid {grid:?} beyond the limits"));
        }
        if block.iter().map(|&b| b as u64).product::<u64>() > 1024 {
            return refuse(CUDA_ERROR_INVALID_VALUE, format!("block {block:?}: more than 1024 threads"));
        }
        if shared > max_dynamic_shared {
            let why = format!("{shared} bytes of dynamic shared memory; the function is opted in to {max_dynamic_shared}");
            return refuse(CUDA_ERROR_INVALID_VALUE, why);
        }
        if !extra.is_null() || (kernel_params.is_null() && !kernel.params.is_empty()) {
            return refuse(CUDA_ERROR_INVALID_VALUE, "the parameters must come as kernelParams");
        }
        let layout: Vec<[usize; 2]> = kernel.params.iter().map(|p| [p.offset, p.size]).collect();
        fields.as_object_mut().unwrap().insert("param_layout".into(), json!(layout));
        let mut buffer = vec![0u8; kernel.params.iter().map(|p| p.offset + p.size).max().unwrap_or(0)];
        for p in &kernel.params {
            // SAFETY: kernelParams has one entry per parameter (the caller's contract).
            let value = unsafe { *kernel_params.add(p.ordinal) };
            if value.is_null() {
                return refuse(CUDA_ERROR_INVALID_VALUE, format!("kernelParams[{}] is null", p.ordinal));
            }
            // SAFETY: the entry points at the parameter's `size` bytes.
            let bytes = unsafe { std::slice::from_raw_parts(value.cast::<u8>(), p.size) };
            buffer[p.offset..p.offset + p.size].copy_from_slice(bytes);
        }
        Ok(hex(&buffer))
    })();
    let object = fields.as_object_mut().unwrap();
    let rc = match launched {
        Ok(params) => {
            object.insert("params".into(), params.into());
            CUDA_SUCCESS
        }
        Err((rc, why)) => {
            object.insert("error".into(), why.into());
            rc
        }
    };
    record("cuLaunchKernel", rc, fields)
}

/// Bytes per element of `CUtensorMapDataType` values 0-12.
fn element_bytes(data_type: c_uint) -> Option<u64> {
    Some(match data_type {
        0 => 1,
        1 | 6 | 9 => 2,
        2 | 3 | 7 | 10 | 11 | 12 => 4,
        4 | 5 | 8 => 8,
        _ => return None,
    })
}

/// Checks a tiled descriptor as the driver does; on success writes its address and a hash of
/// every argument into `map` (128 bytes).
///
/// # Safety
/// `map` is valid for 128 bytes; the arrays hold `rank` entries (`strides`: rank - 1).
#[allow(clippy::too_many_arguments)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTensorMapEncodeTiled(
    map: *mut c_void,
    data_type: c_uint,
    rank: c_uint,
    address: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    box_dims: *const u32,
    element_strides: *const u32,
    interleave: c_uint,
    swizzle: c_uint,
    l2_promotion: c_uint,
    oob_fill: c_uint,
) -> CuResult {
    let call = "cuTensorMapEncodeTiled";
    if let Some(rc) = injected(call) {
        return rc;
    }
    if map.is_null() || dims.is_null() || box_dims.is_null() || element_strides.is_null() || !(1..=5).contains(&rank) {
        return record(call, CUDA_ERROR_INVALID_VALUE, json!({"rank": rank, "error": "null pointer or rank outside 1..5"}));
    }
    let r = rank as usize;
    // SAFETY: the caller's arrays of `rank` (`rank - 1`) entries.
    let (dims, boxes, steps) = unsafe {
        (
            std::slice::from_raw_parts(dims, r).to_vec(),
            std::slice::from_raw_parts(box_dims, r).to_vec(),
            std::slice::from_raw_parts(element_strides, r).to_vec(),
        )
    };
    // SAFETY: as above; no strides for rank 1.
    let strides = if r > 1 && !strides.is_null() { unsafe { std::slice::from_raw_parts(strides, r - 1) }.to_vec() } else { vec![] };
    let fields = json!({"address": address as usize, "data_type": data_type, "rank": rank, "dims": dims,
                        "strides": strides, "box": boxes, "element_strides": steps, "interleave": interleave,
                        "swizzle": swizzle, "l2_promotion": l2_promotion, "oob_fill": oob_fill});
    let check = || -> Result<(), String> {
        let elem = element_bytes(data_type).ok_or(format!("data type {data_type}"))?;
        if !(address as usize).is_multiple_of(16) {
            return Err(format!("address {:#x} not 16-byte aligned", address as usize));
        }
        if r > 1 && strides.len() != r - 1 {
            return Err("no strides".into());
        }
        if let Some(d) = dims.iter().find(|&&d| d == 0 || d > 1 << 32) {
            return Err(format!("a dimension of {d}"));
        }
        if let Some(s) = strides.iter().find(|&&s| s % 16 != 0 || s >= 1 << 40) {
            return Err(format!("a stride of {s} bytes (a multiple of 16 below 2^40)"));
        }
        if let Some(b) = boxes.iter().find(|&&b| b == 0 || b > 256) {
            return Err(format!("a box dimension of {b} (1..256)"));
        }
        if !(boxes[0] as u64 * elem).is_multiple_of(16) {
            return Err(format!("an inner box of {} bytes (a multiple of 16)", boxes[0] as u64 * elem));
        }
        if let Some(e) = steps.iter().find(|&&e| e == 0 || e > 8) {
            return Err(format!("an element stride of {e} (1..8)"));
        }
        let span = match swizzle {
            0 => u64::MAX,
            1 => 32,
            2 => 64,
            3 => 128,
            other => return Err(format!("swizzle {other}")),
        };
        if interleave == 0 && boxes[0] as u64 * elem > span {
            return Err(format!("an inner box of {} bytes beyond the {span}-byte swizzle", boxes[0] as u64 * elem));
        }
        Ok(())
    };
    if let Err(why) = check() {
        let mut fields = fields;
        fields.as_object_mut().unwrap().insert("error".into(), why.into());
        return record(call, CUDA_ERROR_INVALID_VALUE, fields);
    }
    let mut bytes = [0u8; 128];
    bytes[..8].copy_from_slice(&(address as u64).to_le_bytes());
    bytes[8..16].copy_from_slice(&fnv1a64(fields.to_string().as_bytes()).to_le_bytes());
    // SAFETY: the caller's 128-byte descriptor.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), map.cast::<u8>(), 128) };
    record(call, CUDA_SUCCESS, fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_follow_the_thread() {
        let mut device = -1;
        // SAFETY: valid out-pointers; the handles are never dereferenced.
        unsafe {
            assert_eq!(cuCtxGetDevice(&mut device), CUDA_ERROR_INVALID_CONTEXT, "none current at first");
            let mut context = std::ptr::null_mut();
            assert_eq!(cuStreamGetCtx(0x5000 as *mut c_void, &mut context), CUDA_SUCCESS);
            assert_eq!(cuStreamGetCtx(0x1000_5000 as *mut c_void, &mut context), CUDA_ERROR_INVALID_HANDLE);
            assert_eq!(cuStreamGetCtx(std::ptr::null_mut(), &mut context), CUDA_ERROR_INVALID_HANDLE);
            assert_eq!(cuStreamGetCtx(0x5000 as *mut c_void, &mut context), CUDA_SUCCESS);
            assert_eq!(cuCtxPushCurrent_v2(context), CUDA_SUCCESS);
            assert_eq!(cuCtxGetDevice(&mut device), CUDA_SUCCESS);
            assert_eq!(device, 0);
            let mut popped = std::ptr::null_mut();
            assert_eq!(cuCtxPopCurrent_v2(&mut popped), CUDA_SUCCESS);
            assert_eq!(popped, context);
            assert_eq!(cuCtxPopCurrent_v2(&mut popped), CUDA_ERROR_INVALID_CONTEXT);
        }
    }

    #[test]
    fn tensor_maps_are_checked() {
        let mut map = [0u8; 128];
        let (dims, strides, boxes, steps) = ([128u64, 4096, 16], [256u64, 256 * 4096], [64u32, 128, 1], [1u32, 1, 1]);
        // SAFETY: arrays of `rank` entries and a 128-byte map.
        let mut encode = |address: usize, swizzle: c_uint, boxes: &[u32; 3]| unsafe {
            cuTensorMapEncodeTiled(map.as_mut_ptr().cast(), 9, 3, address as *mut c_void, dims.as_ptr(), strides.as_ptr(),
                                   boxes.as_ptr(), steps.as_ptr(), 0, swizzle, 2, 0)
        };
        assert_eq!(encode(0x7f00_0000_0000, 3, &boxes), CUDA_SUCCESS);
        assert_eq!(encode(0x7f00_0000_0008, 3, &boxes), CUDA_ERROR_INVALID_VALUE, "misaligned");
        assert_eq!(encode(0x7f00_0000_0000, 3, &[128, 128, 1]), CUDA_ERROR_INVALID_VALUE, "256 B inner box > 128 B swizzle");
        assert_eq!(encode(0x7f00_0000_0000, 0, &[300, 1, 1]), CUDA_ERROR_INVALID_VALUE, "box above 256");
    }
}
