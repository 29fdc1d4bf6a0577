//! What the recording driver doubles (`test/amd/hip-double`, `test/cuda/cuda-double`) share, each
//! including this file by path: the log they append to, what the test asks of them through the
//! environment (`<PREFIX>_LOG`, `<PREFIX>_DEVICES`, `<PREFIX>_FAIL`), and byte helpers.
use std::ffi::c_int;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

/// Appends one record (the call's name and status added to `fields`) to the file named by
/// `<prefix>_LOG`, flushed; nothing when it is unset.
pub fn record(prefix: &str, call: &str, rc: i64, mut fields: Value) {
    static LOG: Mutex<()> = Mutex::new(());
    let Some(path) = std::env::var_os(format!("{prefix}_LOG")).filter(|p| !p.is_empty()) else { return };
    let object = fields.as_object_mut().expect("records are JSON objects");
    object.insert("call".into(), call.into());
    object.insert("rc".into(), rc.into());
    let line = format!("{fields}\n");
    let _serialised = LOG.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()).and_then(|()| file.flush()));
    if let Err(e) = written {
        eprintln!("aotriton driver double: cannot write {}: {e}", path.to_string_lossy());
    }
}

/// Whether the test asked entry point `call` to fail: `<prefix>_FAIL` names it (read at each call).
pub fn fail_asked(prefix: &str, call: &str) -> bool {
    std::env::var(format!("{prefix}_FAIL")).is_ok_and(|v| v == call)
}

/// How many devices the double reports: `<prefix>_DEVICES` (1 to 8), else 1; read once.
pub fn devices(prefix: &str) -> c_int {
    static DEVICES: OnceLock<c_int> = OnceLock::new();
    *DEVICES.get_or_init(|| {
        let asked = std::env::var(format!("{prefix}_DEVICES")).ok();
        asked.and_then(|n| n.trim().parse().ok()).filter(|n| (1..=8).contains(n)).unwrap_or(1)
    })
}

/// The device a non-null stream handle belongs to: its bits 28-31 (the doubles' convention; the
/// tests' `stream_handle` makes such handles), or None when the double has no such device.
pub fn stream_handle_device(prefix: &str, stream: usize) -> Option<c_int> {
    let device = ((stream >> 28) & 0xf) as c_int;
    (device < devices(prefix)).then_some(device)
}

pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `value` through an out-pointer the caller gave; false if it is null.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
pub unsafe fn put<T>(out: *mut T, value: T) -> bool {
    if out.is_null() {
        return false;
    }
    // SAFETY: non-null, and valid by the caller's contract.
    unsafe { out.write(value) };
    true
}

pub fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
