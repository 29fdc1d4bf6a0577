//! Generates and compiles the C++ half of the bridge (bundled into this staticlib). When CMake
//! asks through AOTRITON_CXXBRIDGE_DIR, also publishes the generated headers there: OUT_DIR is
//! hashed, so CMake could not find them otherwise.
use std::env;
use std::fs;
use std::path::{Path, PathBuf};

fn main() {
    cxx_build::bridge("src/lib.rs").std("c++17").compile("aotriton-cxx-bridge");
    println!("cargo:rerun-if-changed=src/lib.rs");
    println!("cargo:rerun-if-env-changed=AOTRITON_CXXBRIDGE_DIR");
    if let Some(dest) = env::var_os("AOTRITON_CXXBRIDGE_DIR") {
        let include = PathBuf::from(env::var_os("OUT_DIR").unwrap()).join("cxxbridge/include");
        for header in ["rust/cxx.h", "aotriton-cxx/src/lib.rs.h"] {
            copy_if_changed(&include.join(header), &Path::new(&dest).join(header));
        }
    }
}

/// Keeps the destination's mtime when the content is unchanged (no needless C++ rebuilds).
fn copy_if_changed(src: &Path, dst: &Path) {
    let data = fs::read(src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    if fs::read(dst).ok().as_deref() != Some(&data[..]) {
        fs::create_dir_all(dst.parent().unwrap()).unwrap();
        fs::write(dst, &data).unwrap_or_else(|e| panic!("{}: {e}", dst.display()));
    }
}
