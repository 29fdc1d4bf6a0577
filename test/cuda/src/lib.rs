//! aotriton's CUDA launch path checked on a machine without an NVIDIA GPU, against the recording
//! CUDA driver double (`cuda-double/`, installed as `libcuda.so.1` in a folder on
//! `LD_LIBRARY_PATH`): `tests/recorded_launches.rs`.
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

#[path = "../../doubles/harness.rs"]
mod harness;
pub use harness::{
    ADDRESSES, Log, call, check_injected_failures, check_two_devices, device_of, fwd_hd128, params, params_of,
    race_on_two_devices, stream_handle, target_subdir,
};

/// Builds the double into `<target>/cuda-double` and lays it out as the driver library,
/// `<target>/cuda-double/driver/libcuda.so.1`, once per process (tests run in parallel, and a child
/// may have the library mapped: it is replaced by a rename, never rewritten in place). Returns that
/// folder (for `LD_LIBRARY_PATH`).
fn driver_folder() -> PathBuf {
    static FOLDER: OnceLock<PathBuf> = OnceLock::new();
    FOLDER
        .get_or_init(|| {
            let work = target_subdir("cuda-double");
            let library = harness::build("aotriton-cuda-double", &work);
            let folder = work.join("driver");
            std::fs::create_dir_all(&folder).unwrap();
            let staged = folder.join(format!("libcuda.so.1.{}", std::process::id()));
            std::fs::copy(&library, &staged).expect("copy the double");
            std::fs::rename(&staged, folder.join("libcuda.so.1")).expect("install the double as libcuda.so.1");
            folder
        })
        .clone()
}

/// Runs the test `name` of the running test executable again in a child process whose driver is
/// the double (the runtime opens `libcuda.so.1` once per process, by name, so only a process
/// started with the folder on `LD_LIBRARY_PATH` finds it), reporting `devices` devices and
/// recording into the file the child finds in `AOTRITON_CUDA_DOUBLE_LOG`. Panics, with the
/// child's output, unless the child passed.
pub fn run_child(name: &str, devices: u32) {
    let folder = driver_folder();
    let logs = target_subdir("cuda-double").join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let log = logs.join(format!("{name}-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let exe = std::env::current_exe().unwrap();
    let output = Command::new(&exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("LD_LIBRARY_PATH", &folder)
        .env("AOTRITON_CUDA_DOUBLE_LOG", &log)
        .env("AOTRITON_CUDA_DOUBLE_DEVICES", devices.to_string())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
    let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    print!("{printed}");
    assert!(output.status.success() && printed.contains("1 passed"), "the child run of {name} failed ({})", output.status);
}

/// Whether this process is the child of [`run_child`] (its log is set), and its log.
pub fn child_log() -> Option<Log> {
    std::env::var_os("AOTRITON_CUDA_DOUBLE_LOG").map(|p| Log::new(PathBuf::from(p)))
}
