//! The recording driver doubles' log (`test/amd/hip-double`, `test/cuda/cuda-double`: one JSON
//! object per line, each with the call's name and status), read incrementally; shared by the
//! test crates of both by path.
use std::path::PathBuf;

use serde_json::Value;

/// Reads a double's log incrementally.
pub struct Log {
    path: PathBuf,
    consumed: usize,
}

impl Log {
    /// A log at `path`, emptied first.
    pub fn new(path: PathBuf) -> Log {
        let _ = std::fs::remove_file(&path);
        Log { path, consumed: 0 }
    }

    /// Records appended since the last call.
    pub fn take(&mut self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let parse = |l: &&str| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
        let new = lines[self.consumed..].iter().map(parse).collect();
        self.consumed = lines.len();
        new
    }
}

/// The entry point a record is of.
pub fn call(r: &Value) -> &str {
    r["call"].as_str().unwrap_or("")
}

/// Builds the double `package` with cargo into `dir` (its own target directory, so the nested
/// build never waits on the outer cargo's lock). Returns the library file.
pub fn build(package: &str, dir: &std::path::Path) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = std::process::Command::new(&cargo)
        .current_dir(root)
        .args(["build", "--quiet", "-p", package, "--target-dir"])
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", cargo.to_string_lossy()));
    assert!(output.status.success(), "building {package} failed:\n{}", String::from_utf8_lossy(&output.stderr));
    let library = dir.join(format!("debug/lib{}.so", package.replace('-', "_")));
    assert!(library.is_file(), "{} was not built", library.display());
    library
}

/// `<target>/<name>` of the cargo target directory the running test executable is in
/// (`<target>/<profile>/deps/<test>`).
pub fn target_subdir(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).expect("the test runs from a cargo target directory").join(name)
}
