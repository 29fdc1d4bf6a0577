//! The runtime with the real HIP runtime library on a machine without an AMD GPU (issue 13, 6a):
//! Debian's ROCm 5.2 `libamdhip64.so.5` loads, `hipGetDeviceCount` says there is no device, and
//! every API call on a HIP stream, through Rust and through C++, returns `NoDevice` naming the
//! HIP call — no panic, no crash. A HIP library that cannot be loaded, or one that lacks an entry
//! point, gives `NoDriver` naming it (checked in child processes: the runtime opens the library
//! once per process).
use std::process::Command;

use aotriton::flash::{self, BwdParams, Dropout, FwdParams, Mask, MaskAlign};
use aotriton::{DType, ErrorKind, Runtime, Stream, TensorView};
use aotriton_amd_tests::{compile_cpp, repo_root, skip_or_fail};

const B: u64 = 2;
const H: u64 = 4;
const S: u64 = 128;
const D: u64 = 64;

fn t(ptr: u64) -> TensorView<4> {
    TensorView::contiguous(ptr, [B, H, S, D], DType::F16)
}

fn rows(ptr: u64) -> TensorView<3> {
    TensorView::contiguous(ptr, [B, H, S], DType::F32)
}

fn fwd() -> FwdParams<'static> {
    let mut p = FwdParams::new(t(0x10_0000), t(0x20_0000), t(0x30_0000), t(0x40_0000), Some(rows(0x50_0000)));
    p.mask = Mask::causal(MaskAlign::BottomRight);
    p
}

fn bwd() -> BwdParams<'static> {
    BwdParams::new(
        t(0x10_0000),
        t(0x20_0000),
        t(0x30_0000),
        t(0x40_0000),
        t(0x60_0000),
        rows(0x50_0000),
        rows(0x70_0000),
        t(0x80_0000),
        t(0x90_0000),
        t(0xa0_0000),
    )
}

/// Every operator on `stream`, with the error kind each returned.
fn every_call(stream: Stream) -> Vec<(&'static str, aotriton::Error)> {
    let mut out = Vec::new();
    let mut record = |name, result: aotriton::Result<()>| match result {
        Ok(()) => panic!("{name} succeeded on a machine without an AMD GPU"),
        Err(e) => out.push((name, e)),
    };
    record("attn_fwd", flash::attn_fwd(&fwd(), stream));
    record("attn_bwd", flash::attn_bwd(&bwd(), stream));
    record("attn_bwd_workspace_bytes", flash::attn_bwd_workspace_bytes(&bwd(), stream).map(|_| ()));
    let mask = TensorView::contiguous(0xb0_0000, [B, H, S, S], DType::F32);
    record("debug_dropout_mask", flash::debug_dropout_mask(&mask, &Dropout::new(0.1, 0xc0_0000, 0xc0_0008), stream));
    out
}

#[test]
fn hip_calls_without_a_device_report_no_device() {
    if std::env::var_os("AOTRITON_HIP_LIBRARY").is_some() {
        skip_or_fail("AOTRITON_HIP_LIBRARY is set: this test checks the system's HIP runtime");
        return;
    }
    if !aotriton::library_present(Runtime::Hip) {
        skip_or_fail("no ROCm libraries (libamdhip64.so[.7|.6|.5] not found; Debian: libamdhip64-5)");
        return;
    }
    let mut checked = 0;
    for stream in [Stream::hip(0), Stream::hip(0x5000)] {
        for (name, e) in every_call(stream) {
            assert_eq!(e.kind(), ErrorKind::NoDevice, "{name} on {stream:?}: {e}");
            assert!(e.message().contains("libamdhip64"), "{name}: the message names the library: {e}");
            assert!(e.message().contains("hip"), "{name}: the message names the HIP call: {e}");
            checked += 1;
        }
        // Validation still comes first on a HIP stream.
        let mut p = fwd();
        p.q.ptr = 0;
        assert_eq!(flash::attn_fwd(&p, stream).unwrap_err().kind(), ErrorKind::NullPointer);
    }
    // A forced Gluon backend is refused by its input rules before the device is asked (fp32).
    println!("HIP calls returning NoDevice through the Rust API: {checked}");
}

/// Runs `child` (a test of this file) in a new process with `AOTRITON_HIP_LIBRARY=library`.
fn run_child(child: &str, library: &str) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child, "--nocapture", "--include-ignored"])
        .env("AOTRITON_HIP_LIBRARY", library)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{child} with {library}:\n{text}");
}

#[test]
fn an_unloadable_hip_library_is_no_driver() {
    run_child("child_expects_no_driver", "/nonexistent/libamdhip64.so");
    // A real library that is not a HIP runtime: the missing entry point is named.
    run_child("child_expects_no_driver", "libm.so.6");
}

#[test]
#[ignore = "run by an_unloadable_hip_library_is_no_driver in a child process"]
fn child_expects_no_driver() {
    let library = std::env::var("AOTRITON_HIP_LIBRARY").unwrap();
    assert!(!aotriton::library_present(Runtime::Hip));
    for (name, e) in every_call(Stream::hip(0)) {
        assert_eq!(e.kind(), ErrorKind::NoDriver, "{name}: {e}");
        assert!(e.message().contains(&library), "{name}: the message names the file: {e}");
        if library.starts_with("libm") {
            assert!(e.message().contains("lacks hip"), "{name}: the message names the missing entry point: {e}");
        }
    }
}

#[test]
fn cpp_api_calls_without_a_device_report_no_device() {
    if !aotriton::library_present(Runtime::Hip) {
        skip_or_fail("no ROCm libraries (libamdhip64.so[.7|.6|.5] not found; Debian: libamdhip64-5)");
        return;
    }
    let source = repo_root().join("test/amd/cpp/no_device.cpp");
    let out_dir = std::env::temp_dir().join(format!("aotriton-amd-cpp-{}", std::process::id()));
    let exe = match compile_cpp(&source, &out_dir) {
        Ok(exe) => exe,
        Err(why) => {
            skip_or_fail(&why);
            return;
        }
    };
    let out = Command::new(&exe).env_remove("AOTRITON_HIP_LIBRARY").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "{}:\n{text}{}", exe.display(), String::from_utf8_lossy(&out.stderr));
    let calls = text.lines().filter(|l| l.contains(": kNoDevice")).count();
    assert_eq!(calls, 8, "4 calls x 2 streams");
    println!("HIP calls returning kNoDevice through the C++ API: {calls}");
    let _ = std::fs::remove_dir_all(out_dir);
}

/// The constants driver/hip.rs relies on, checked against the real ROCm header (Debian's
/// `libamdhip64-dev`, ROCm 5.2): the `hipDeviceAttribute_t` values and, in the ROCm 5 layout of
/// `hipDeviceProp_t` (`hipGetDeviceProperties`), the offset of `gcnArchName`. (The ROCm 6 layout,
/// `hipGetDevicePropertiesR0600`, puts it at byte 1160 with the same attribute values: read from
/// ROCm 6's header when the runtime was written; no ROCm 6 header is packaged for this machine.)
#[test]
fn hip_abi_constants_match_the_rocm_header() {
    let header = std::path::Path::new("/usr/include/hip/hip_runtime_api.h");
    if !header.is_file() {
        skip_or_fail("no ROCm HIP headers (/usr/include/hip/hip_runtime_api.h; Debian: libamdhip64-dev)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("aotriton-hip-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("abi.c");
    std::fs::write(
        &source,
        "#define __HIP_PLATFORM_AMD__\n#include <hip/hip_runtime_api.h>\n#include <stddef.h>\n#include <stdio.h>\n\
         int main(void) { printf(\"%zu %zu %d %d %d\\n\", sizeof(hipDeviceProp_t), offsetof(hipDeviceProp_t, gcnArchName),\n\
         (int)hipDeviceAttributeMultiprocessorCount, (int)hipDeviceAttributeMaxSharedMemoryPerBlock, (int)hipDeviceAttributeWarpSize);\n\
         return 0; }\n",
    )
    .unwrap();
    let exe = dir.join("abi");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc).arg(&source).arg("-o").arg(&exe).output().unwrap();
    assert!(built.status.success(), "{cc}: {}", String::from_utf8_lossy(&built.stderr));
    let out = Command::new(&exe).output().unwrap();
    let values: Vec<usize> = String::from_utf8_lossy(&out.stdout).split_whitespace().map(|v| v.parse().unwrap()).collect();
    let [size, gcn_arch_name, multiprocessors, shared, warp] = values[..] else { panic!("{values:?}") };
    assert!(size <= 4096, "the runtime's properties buffer (4096 bytes) holds hipDeviceProp_t ({size})");
    assert_eq!(gcn_arch_name, 396, "gcnArchName offset in the ROCm 5 hipDeviceProp_t (driver/hip.rs: PropsLayout::R0000)");
    assert_eq!([multiprocessors, shared, warp], [63, 74, 87], "hipDeviceAttribute_t values (driver/hip.rs)");
    let _ = std::fs::remove_dir_all(dir);
}
