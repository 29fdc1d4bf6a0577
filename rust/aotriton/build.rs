//! Produces the kernel archives the crate embeds, one per target arch, and the tables
//! src/images.rs reads. Where they come from, first match wins:
//! * `DOCS_RS` set (docs.rs, `DOCS_RS=1 cargo doc`): nothing, and nothing is run or fetched.
//! * feature `no-images`: nothing; the runtime reads archives at run time from
//!   `AOTRITON_IMAGE_DIR`, or else from the `AOTRITON_DEFAULT_IMAGE_DIR` given here at build time
//!   (recorded with `option_env!`; the CMake runtime-only build passes its install directory).
//! * `AOTRITON_TARGET_ARCH=none`: nothing (for archive-format work without kernels).
//! * `AOTRITON_KERNEL_DIR` names a compile-driver output directory (`<dir>/<arch>/manifest.json`
//!   plus images) for the archs of `AOTRITON_TARGET_ARCH` (default `sm_90`; several separated by
//!   `;`): the images are packed as they are. The CMake superbuild and test.sh pass their own.
//! * feature `build-kernels`: the top-level CMake project is configured with
//!   `AOTRITON_GENERATE_ONLY=ON` inside OUT_DIR and only its `aotriton_kernels` target is built:
//!   a private venv with the pinned Triton (network to PyPI), then `python/compile.py`
//!   (content-addressed cache, so rebuilds compile nothing). Each step is announced with a
//!   `cargo:warning`; `cargo build -vv` streams its output.
//! * otherwise the image crates of the enabled arch features (`sm90` → `aotriton-images-sm90`,
//!   ...): their archives, whose paths and SHA-256 they publish as `links` metadata
//!   (`DEP_AOTRITON_IMAGES_<ARCH>_PARTS`/`_SHA256`), are checked and read here; the library
//!   embeds them through the crates' `PARTS` statics.
//!
//! Packed archives are copied to `AOTRITON_ARCHIVE_OUT_DIR` when set (the superbuild installs
//! them from there) together with their SHA-256 manifest (`aotriton-images.sha256`, sha256sum
//! format).
//!
//! Generated for src/images.rs (OUT_DIR/embedded_archives.rs): the archives (in parts), their
//! SHA-256 digests (the images the library trusts in `AOTRITON_IMAGE_DIR`), and every compiled
//! value of each functional axis per kernel family, over all archs (what validation checks
//! against before the device, and so its archive, is known).
use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
#[cfg(feature = "build-kernels")]
use std::process::Command;

use sha2::{Digest, Sha256};

#[path = "src/archive.rs"]
#[allow(dead_code)]
mod archive;

/// Image crates by feature: (feature, crate name, arch).
const IMAGE_CRATES: &[(&str, &str, &str)] = &[
    ("sm90", "aotriton_images_sm90", "sm_90"),
    ("sm80", "aotriton_images_sm80", "sm_80"),
    ("gfx942", "aotriton_images_gfx942", "gfx942"),
    ("gfx90a", "aotriton_images_gfx90a", "gfx90a"),
    ("gfx950", "aotriton_images_gfx950", "gfx950"),
];

/// One archive to embed: its arch, the Rust expression of its parts (`&[&[u8]]`), its bytes.
struct Embedded {
    arch: String,
    parts_expr: String,
    bytes: Vec<u8>,
}

fn main() {
    for var in [
        "AOTRITON_TARGET_ARCH",
        "AOTRITON_KERNEL_DIR",
        "AOTRITON_ARCHIVE_OUT_DIR",
        "AOTRITON_KERNEL_CACHE",
        "AOTRITON_DEFAULT_IMAGE_DIR",
        "DOCS_RS",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let no_archive = env::var_os("DOCS_RS").is_some()
        || feature("no-images")
        || env::var("AOTRITON_TARGET_ARCH").is_ok_and(|a| a.trim() == "none");
    let embedded = if no_archive {
        Vec::new()
    } else if let Some(dir) = env::var_os("AOTRITON_KERNEL_DIR") {
        pack_kernel_dir(&PathBuf::from(dir), &target_archs(), true)
    } else if let Some(compiled) = compiled_from_source() {
        compiled
    } else {
        from_image_crates()
    };
    if feature("no-images")
        && let Ok(dir) = env::var("AOTRITON_DEFAULT_IMAGE_DIR")
        && !Path::new(&dir).is_absolute()
    {
        fail(&format!("AOTRITON_DEFAULT_IMAGE_DIR={dir}: must be an absolute path"));
    }
    let copy_to = env::var_os("AOTRITON_ARCHIVE_OUT_DIR").map(PathBuf::from);
    let mut axis_values = AxisValues::new();
    let mut manifest = String::new();
    let mut digests = Vec::new();
    for e in &embedded {
        let file = format!("aotriton-{}.images", e.arch);
        let digest = format!("{:x}", Sha256::digest(&e.bytes));
        manifest += &format!("{digest}  {file}\n");
        // Read back with the runtime's own reader: what validation accepts is what was packed.
        let parsed = archive::Archive::parse(&file, e.bytes.clone().into()).unwrap_or_else(|err| fail(&err.to_string()));
        if parsed.arch() != e.arch {
            fail(&format!("{file} holds {} kernels", parsed.arch()));
        }
        for f in parsed.functionals() {
            for (axis, value) in &f.axes {
                axis_values.entry((f.family.clone(), axis.clone())).or_default().insert(value.clone());
            }
        }
        if let Some(dir) = &copy_to {
            write_if_changed(&dir.join(&file), &e.bytes);
        }
        digests.push((e.arch.clone(), digest));
    }
    if let Some(dir) = &copy_to {
        write_if_changed(&dir.join(archive::DIGEST_MANIFEST), manifest.as_bytes());
    }
    write_embedded(&embedded, &digests, &axis_values);
}

/// Whether the package feature `name` is enabled.
fn feature(name: &str) -> bool {
    env::var_os(format!("CARGO_FEATURE_{}", name.to_uppercase().replace('-', "_"))).is_some()
}

/// Packs `<kernel_dir>/<arch>` for each arch into OUT_DIR.
fn pack_kernel_dir(kernel_dir: &Path, archs: &[String], watch: bool) -> Vec<Embedded> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut embedded = Vec::new();
    for arch in archs {
        if watch {
            // Only for a directory given from outside: in the build-kernels mode these files are
            // written during the script's own run and would make cargo rerun it every time.
            println!("cargo:rerun-if-changed={}", kernel_dir.join(arch).join("manifest.json").display());
        }
        let archive = out_dir.join(format!("aotriton-{arch}.images"));
        let summary = archive::pack_dir(&kernel_dir.join(arch), &archive).unwrap_or_else(|e| fail(&e.to_string()));
        println!(
            "cargo:warning=packed {arch}: {} kernels in {} functionals, {} -> {} bytes",
            summary.kernels, summary.functionals, summary.raw_bytes, summary.archive_bytes
        );
        let bytes = fs::read(&archive).unwrap_or_else(|e| fail(&format!("{}: {e}", archive.display())));
        let parts_expr = format!("&[include_bytes!({:?})]", archive.display().to_string());
        embedded.push(Embedded { arch: arch.clone(), parts_expr, bytes });
    }
    embedded
}

/// The archives of the enabled image crates, each checked against the SHA-256 its crate states
/// (parts of different crate versions would not match).
fn from_image_crates() -> Vec<Embedded> {
    let enabled: Vec<_> = IMAGE_CRATES.iter().filter(|(f, _, _)| feature(f)).collect();
    if enabled.is_empty() {
        fail(
            "no kernels selected: enable an arch feature (sm90, sm80, gfx942, gfx90a, gfx950), `no-images` \
             (archives read at run time), or `build-kernels` (compile from source), or set AOTRITON_KERNEL_DIR",
        );
    }
    let mut embedded = Vec::new();
    for (feature, krate, arch) in enabled {
        let meta = |key: &str| env::var(format!("DEP_{}_{}", krate.to_uppercase(), key.to_uppercase())).unwrap_or_default();
        let parts = meta("parts");
        if parts.is_empty() {
            fail(&format!(
                "feature `{feature}`: the crate {} carries no {arch} archive. In a source checkout, copy the built \
                 archives in with scripts/package-crates.sh, or set AOTRITON_KERNEL_DIR to compiled kernels, or \
                 enable `build-kernels`",
                krate.replace('_', "-")
            ));
        }
        let mut bytes = Vec::new();
        for part in parts.split(';') {
            println!("cargo:rerun-if-changed={part}");
            bytes.extend(fs::read(part).unwrap_or_else(|e| fail(&format!("{part}: {e}"))));
        }
        let stated = meta("sha256");
        let digest = format!("{:x}", Sha256::digest(&bytes));
        if digest != stated {
            fail(&format!("{} ({arch}): its parts have SHA-256 {digest}, the crate states {stated:?}", krate.replace('_', "-")));
        }
        embedded.push(Embedded { arch: arch.to_string(), parts_expr: format!("{krate}::PARTS"), bytes });
    }
    embedded
}

/// (family, axis) -> every value compiled, over all archs.
type AxisValues = BTreeMap<(String, String), BTreeSet<String>>;

/// OUT_DIR/embedded_archives.rs, which src/images.rs includes: the (arch, archive parts) table,
/// the (arch, SHA-256) table and the (family, axis, values) table, values sorted numerically.
fn write_embedded(archives: &[Embedded], digests: &[(String, String)], axis_values: &AxisValues) {
    let mut code = String::from("// Generated by rust/aotriton/build.rs. Do not edit.\npub static ARCHIVES: &[(&str, &[&[u8]])] = &[\n");
    for e in archives {
        code += &format!("    ({:?}, {}),\n", e.arch, e.parts_expr);
    }
    code += "];\npub static DIGESTS: &[(&str, &str)] = &[\n";
    for (arch, digest) in digests {
        code += &format!("    ({arch:?}, {digest:?}),\n");
    }
    code += "];\npub static AXIS_VALUES: &[(&str, &str, &[&str])] = &[\n";
    for ((family, axis), values) in axis_values {
        let mut values: Vec<&String> = values.iter().collect();
        values.sort_by_key(|v| (v.parse::<i64>().unwrap_or(i64::MAX), *v));
        code += &format!("    ({family:?}, {axis:?}, &{values:?}),\n");
    }
    code += "];\n";
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    write_if_changed(&out_dir.join("embedded_archives.rs"), code.as_bytes());
}

fn target_archs() -> Vec<String> {
    let spec = env::var("AOTRITON_TARGET_ARCH").unwrap_or_else(|_| "sm_90".into());
    let archs: Vec<String> =
        spec.split([';', ',']).map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect();
    if archs.is_empty() {
        fail("AOTRITON_TARGET_ARCH is empty; name at least one arch (e.g. sm_90), or `none`");
    }
    archs
}

/// The `build-kernels` mode (None without the feature): compile with CMake into OUT_DIR, then pack.
#[cfg(feature = "build-kernels")]
fn compiled_from_source() -> Option<Vec<Embedded>> {
    let archs = target_archs();
    let kernel_dir = compile_with_cmake(&archs);
    println!("cargo:warning=aotriton build-kernels 3/3: packing the archives");
    Some(pack_kernel_dir(&kernel_dir, &archs, false))
}

#[cfg(not(feature = "build-kernels"))]
fn compiled_from_source() -> Option<Vec<Embedded>> {
    None
}

#[cfg(feature = "build-kernels")]
fn compile_with_cmake(archs: &[String]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for input in ["CMakeLists.txt", "cmake", "python", "third_party"] {
        println!("cargo:rerun-if-changed={}", root.join(input).display());
    }
    println!("cargo:warning=aotriton build-kernels 1/3: build tools (cmake >= 3.26 and ninja, else pip-installed into OUT_DIR)");
    let (cmake, ninja) = build_tools(root);
    let out = env::var("OUT_DIR").unwrap_or_default();
    println!(
        "cargo:warning=aotriton build-kernels 2/3: compiling the kernels for {} (pip installs the pinned Triton, then \
         python/compile.py; ~10 min per arch on 2 cores; `cargo build -vv` streams it; build tree {out}/build)",
        archs.join(";")
    );
    let python = which::which("python3").unwrap_or_else(|_| fail("python3 not found on PATH; it is needed to compile the kernels"));
    // SAFETY: build scripts are single-threaded; the cmake crate reads $CMAKE to pick the binary.
    unsafe { env::set_var("CMAKE", &cmake) };
    let mut config = cmake::Config::new(root);
    config
        .generator("Ninja")
        .configure_arg("--no-warn-unused-cli")
        .define("CMAKE_MAKE_PROGRAM", &ninja)
        .define("Python3_EXECUTABLE", &python)
        .define("AOTRITON_GENERATE_ONLY", "ON")
        .define("AOTRITON_TARGET_ARCH", archs.join(";"))
        .build_target("aotriton_kernels");
    if let Some(cache) = env::var_os("AOTRITON_KERNEL_CACHE") {
        config.define("AOTRITON_KERNEL_CACHE", cache);
    }
    config.build().join("build/kernels")
}

/// cmake >= 3.26 with ninja from $CMAKE or PATH when good enough; otherwise a venv in OUT_DIR with
/// the pinned tools of third_party/tools/requirements.txt.
#[cfg(feature = "build-kernels")]
fn build_tools(root: &Path) -> (PathBuf, PathBuf) {
    println!("cargo:rerun-if-env-changed=CMAKE");
    let cmake = env::var_os("CMAKE").map(PathBuf::from).or_else(|| which::which("cmake").ok());
    if let Some(cmake) = cmake.filter(|c| cmake_at_least(c, (3, 26))) {
        let sibling = cmake.with_file_name("ninja");
        let ninja = if sibling.is_file() { Ok(sibling) } else { which::which("ninja") };
        if let Ok(ninja) = ninja {
            return (cmake, ninja);
        }
    }
    let venv = PathBuf::from(env::var_os("OUT_DIR").unwrap()).join("tools");
    let bin = venv.join("bin");
    if !bin.join("cmake").exists() || !bin.join("ninja").exists() {
        let python = which::which("python3").unwrap_or_else(|_| fail("python3 not found on PATH"));
        run(Command::new(python).args(["-m", "venv", "--clear"]).arg(&venv));
        run(Command::new(bin.join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", "--require-hashes", "--only-binary=:all:", "-r"])
            .arg(root.join("third_party/tools/requirements.txt")));
    }
    (bin.join("cmake"), bin.join("ninja"))
}

#[cfg(feature = "build-kernels")]
fn cmake_at_least(cmake: &Path, min: (u32, u32)) -> bool {
    let Ok(out) = Command::new(cmake).arg("--version").output() else { return false };
    let text = String::from_utf8_lossy(&out.stdout); // "cmake version 3.25.1"
    let mut parts = text.split_whitespace().nth(2).unwrap_or("").split('.').map(str::parse::<u32>);
    matches!((parts.next(), parts.next()), (Some(Ok(major)), Some(Ok(minor))) if (major, minor) >= min)
}

#[cfg(feature = "build-kernels")]
fn run(cmd: &mut Command) {
    match cmd.status() {
        Ok(status) if status.success() => {}
        Ok(status) => fail(&format!("{cmd:?} failed: {status}")),
        Err(e) => fail(&format!("cannot run {cmd:?}: {e}")),
    }
}

/// Leaves the destination untouched (and its mtime, for ninja) when the content is the same.
fn write_if_changed(dst: &Path, data: &[u8]) {
    if fs::read(dst).ok().as_deref() != Some(data) {
        fs::create_dir_all(dst.parent().unwrap()).unwrap_or_else(|e| fail(&format!("{}: {e}", dst.display())));
        fs::write(dst, data).unwrap_or_else(|e| fail(&format!("{}: {e}", dst.display())));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1);
}
