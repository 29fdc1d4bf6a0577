//! The seed-compatible C++ API (`test/seed/seed_api.cpp`) on an AMD stream against the recording
//! HIP double: the program is compiled against the installed tree the way the seed's consumers
//! link it (`-laotriton_v2`, `<prefix>/include`), run with `AOTRITON_HIP_LIBRARY` naming the
//! double, and must pass every check, its HIP part included: check_gpu on the double's gfx942,
//! and each seed call (v2 and v3, forward, backward, compact varlen, dropout with outputs, the
//! encoded softmax, windows with sentinels) launching exactly what the library's own API
//! launches for the same problem (those launches are checked against the archive's metadata by
//! `recorded_launches.rs`).
//!
//! Needs the installed C++ API built with gfx942 kernels (`AOTRITON_INSTALL_DIR`, default
//! `install/`) and ROCm's comgr (the double reads the code objects with it).
use std::path::{Path, PathBuf};
use std::process::Command;

use aotriton_amd_tests::comgr::Comgr;
use aotriton_amd_tests::hip_double;
use aotriton_amd_tests::{install_dir, repo_root, skip_or_fail};

/// Compiles the seed-API test against the installed tree, linked as PyTorch links the seed.
fn compile_seed_test(out_dir: &Path) -> Result<PathBuf, String> {
    let install = install_dir();
    let (include, lib) = (install.join("include"), install.join("lib"));
    let library = lib.join("libaotriton_v2.so");
    if !include.join("aotriton/config.h").is_file() || !library.exists() {
        return Err(format!("no installed seed-compatible API in {} (run ./build.sh first)", install.display()));
    }
    std::fs::create_dir_all(out_dir).map_err(|e| e.to_string())?;
    let exe = out_dir.join("seed_api");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let output = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-I{}", include.display()))
        .arg(repo_root().join("test/seed/seed_api.cpp"))
        .arg("-o")
        .arg(&exe)
        .arg(&library)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-ldl")
        .output()
        .map_err(|e| format!("cannot run {cxx}: {e}"))?;
    if !output.status.success() {
        return Err(format!("{cxx} test/seed/seed_api.cpp failed:\n{}", String::from_utf8_lossy(&output.stderr)));
    }
    Ok(exe)
}

#[test]
fn seed_api_on_the_recording_double() {
    if let Err(e) = Comgr::load() {
        return skip_or_fail(&e);
    }
    // <target>/<profile>/deps/<this test>: the work goes to <target>/seed-api.
    let work = hip_double::target_subdir("seed-api");
    let program = match compile_seed_test(&work) {
        Ok(p) => p,
        Err(e) => return skip_or_fail(&e),
    };
    let double = hip_double::build(&work.join("hip-double"));
    let log = work.join(format!("hip-double-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let output = Command::new(&program)
        .env("AOTRITON_HIP_LIBRARY", &double)
        .env("AOTRITON_HIP_DOUBLE_LOG", &log)
        .env_remove("AOTRITON_IMAGE_DIR")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    print!("{printed}");
    if printed.contains("HIP: skipped: this build has no kernels") {
        return skip_or_fail("the installed library carries no gfx942 kernels (AOTRITON_TARGET_ARCH)");
    }
    assert!(output.status.success() && printed.contains("seed API: ok"), "{} failed ({})", program.display(), output.status);
    assert!(!printed.contains("HIP: skipped"), "the HIP part did not run against the double");
    let launches = printed.lines().filter(|l| l.starts_with("PASS HIP") && l.contains("the same as the own API's")).count();
    assert_eq!(launches, 9, "seed calls compared with the own API's launches");
}
