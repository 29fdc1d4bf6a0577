//! Shared pieces of aotriton's AMD checks (tests/): what no AMD GPU is needed for.
//!
//! - `tests/no_device.rs`: the runtime with the real HIP runtime library (Debian's ROCm 5.2
//!   `libamdhip64.so.5`) on a machine without an AMD GPU: every call on a HIP stream, through
//!   Rust and C++, returns `NoDevice`.
//! - `tests/code_objects.rs`: every hsaco of the AMD archives read with the real code-object
//!   manager ([`comgr`]) and checked against the runtime's argument plan.
//! - `tests/recorded_launches.rs`: `attn_fwd` / `attn_bwd` end to end on an AMD stream against a
//!   recording HIP double (`hip-double/`), through Rust and C++.
//! - `tests/multi_device.rs`: one process, two devices of the double: module loads per device,
//!   launches on their stream's device, the thread's current device restored.
//! - `tests/seed_api.rs`: the seed-compatible C++ API against the double.
//!
//! Where the ROCm libraries or the AMD archives are absent, the tests print `skipped: ...`;
//! under CI (`CI=true`) that is a failure instead: CI installs them (`.ci/run`).
use std::path::{Path, PathBuf};
use std::process::Command;

pub mod comgr;

/// Whether this run is CI's (`CI=true`), where nothing may be skipped.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Prints `skipped: <reason>` outside CI; fails the test under CI, where what is missing must
/// have been installed.
pub fn skip_or_fail(reason: &str) {
    if ci() {
        panic!("{reason}; CI must run this check (its packages and archives are installed by .ci/run and ./test.sh)");
    }
    eprintln!("skipped: {reason}");
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// Where the packed archives are: `AOTRITON_ARCHIVE_DIR`, else the superbuild's `build/images`.
pub fn archive_dir() -> PathBuf {
    std::env::var_os("AOTRITON_ARCHIVE_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("build/images"))
}

/// The installed tree (`./build.sh` installs into `install/`): `AOTRITON_INSTALL_DIR` overrides.
pub fn install_dir() -> PathBuf {
    std::env::var_os("AOTRITON_INSTALL_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("install"))
}

/// The archive file of `arch` in [`archive_dir`] (it may not exist).
pub fn archive_path(arch: &str) -> PathBuf {
    archive_dir().join(format!("aotriton-{arch}.images"))
}

/// Compiles a C++ test program against the installed C++ API (headers and `libaotriton.so`),
/// into `out_dir`. Returns the executable, or why it could not be built.
pub fn compile_cpp(source: &Path, out_dir: &Path) -> Result<PathBuf, String> {
    let install = install_dir();
    let (include, lib) = (install.join("include"), install.join("lib"));
    if !include.join("aotriton/flash.h").is_file() || !lib.join("libaotriton.so").exists() {
        return Err(format!("no installed C++ API in {} (run ./build.sh first)", install.display()));
    }
    std::fs::create_dir_all(out_dir).map_err(|e| e.to_string())?;
    let exe = out_dir.join(source.file_stem().unwrap());
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let output = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-Wall", "-Werror"])
        .arg(format!("-I{}", include.display()))
        .arg(source)
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-laotriton")
        .output()
        .map_err(|e| format!("cannot run {cxx}: {e}"))?;
    if !output.status.success() {
        return Err(format!("{cxx} {} failed:\n{}", source.display(), String::from_utf8_lossy(&output.stderr)));
    }
    Ok(exe)
}

#[path = "../../doubles/harness.rs"]
mod harness;

/// The recording HIP double (`hip-double/`): building it and reading what it recorded.
pub mod hip_double {
    use std::path::PathBuf;

    pub use super::harness::{
        Log, call, check_injected_failures, check_two_devices, device_of, fwd_hd128, params, race_on_two_devices, stream_handle,
        target_subdir,
    };

    /// Builds the double with cargo into `dir`. Returns the library, for `AOTRITON_HIP_LIBRARY`.
    pub fn build(dir: &std::path::Path) -> PathBuf {
        super::harness::build("aotriton-hip-double", dir)
    }

    /// Builds the double into `<target>/hip-double` and makes it this process's HIP runtime
    /// (`AOTRITON_HIP_LIBRARY`), reporting `devices` devices and recording into
    /// `<target>/hip-double/logs/<name>-<pid>.jsonl`. Returns the library and its log.
    ///
    /// # Safety
    /// Call it before the runtime's first HIP call (it resolves the library once per process),
    /// while no other thread reads or writes the environment.
    pub unsafe fn attach(name: &str, devices: u32) -> (PathBuf, Log) {
        let work = target_subdir("hip-double");
        let double = build(&work);
        std::fs::create_dir_all(work.join("logs")).unwrap();
        let path = work.join(format!("logs/{name}-{}.jsonl", std::process::id()));
        let log = Log::new(path.clone());
        // SAFETY: the caller's contract.
        unsafe {
            std::env::set_var("AOTRITON_HIP_LIBRARY", &double);
            std::env::set_var("AOTRITON_HIP_DOUBLE_LOG", &path);
            std::env::set_var("AOTRITON_HIP_DOUBLE_DEVICES", devices.to_string());
        }
        (double, log)
    }
}
