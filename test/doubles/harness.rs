//! The test side of the recording driver doubles (`test/amd/hip-double`, `test/cuda/cuda-double`),
//! shared by the test crates of both by path: building a double, reading its log (one JSON object
//! per line, each with the call's name and status) incrementally, the problem the tests call with,
//! and what a run on two devices must have recorded.
use std::path::PathBuf;

use aotriton::flash::{BwdParams, FwdParams, Mask, MaskAlign};
use aotriton::{DType, TensorView};
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

/// Where a stream handle's device sits, in both doubles' convention.
pub const DEVICE_SHIFT: u32 = 28;

/// A stream handle of `device` in the doubles' convention, distinct per `tag`.
pub fn stream_handle(device: usize, tag: usize) -> usize {
    (device << DEVICE_SHIFT) | 0x5000 | (tag << 4)
}

/// The device a record names.
pub fn device_of(r: &Value) -> usize {
    r["device"].as_u64().unwrap_or_else(|| panic!("record without a device: {r}")) as usize
}

/// What the same calls issued on two devices must have recorded (`load`, `launch`: the double's
/// module-load and launch entry points): no failed call; one load per (image, device), the same
/// images on both devices; every launch on its stream's device; the same launches on either
/// device (all but the function handle, stream and device). Returns the launches and the number
/// of images per device.
pub fn check_two_devices<'a>(records: &'a [Value], load: &str, launch: &str) -> (Vec<&'a Value>, usize) {
    let failed: Vec<&Value> = records.iter().filter(|r| r["rc"] != 0).collect();
    assert!(failed.is_empty(), "driver calls failed: {failed:?}");
    let mut loads: std::collections::HashMap<(String, usize), usize> = Default::default();
    for r in records.iter().filter(|r| call(r) == load) {
        *loads.entry((r["image_fnv1a"].as_str().unwrap().to_string(), device_of(r))).or_default() += 1;
    }
    let twice: Vec<_> = loads.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "images loaded more than once on a device: {twice:?}");
    let images = |device: usize| {
        let mut v: Vec<&str> = loads.keys().filter(|(_, d)| *d == device).map(|(h, _)| h.as_str()).collect();
        v.sort();
        v
    };
    assert!(!images(0).is_empty(), "nothing was loaded");
    assert_eq!(images(0), images(1), "the two devices loaded different images");

    let launches: Vec<&Value> = records.iter().filter(|r| call(r) == launch).collect();
    let mut per_device: [Vec<String>; 2] = Default::default();
    for r in &launches {
        let stream = r["stream"].as_u64().unwrap() as usize;
        assert_eq!(device_of(r), stream >> DEVICE_SHIFT, "a launch off its stream's device: {r}");
        let mut content = (*r).clone();
        for key in ["function", "stream", "device"] {
            content.as_object_mut().unwrap().remove(key);
        }
        per_device[device_of(r)].push(content.to_string());
    }
    for list in per_device.iter_mut() {
        list.sort();
    }
    assert!(per_device[0] == per_device[1], "the same calls launched differently on the two devices");
    (launches, images(0).len())
}

/// Where the tests' tensors lie, by the kernels' argument names: fake device addresses, never
/// dereferenced (the doubles run nothing).
pub const ADDRESSES: [(&str, u64); 10] = [
    ("Q", 0x1000_0000),
    ("K", 0x2000_0000),
    ("V", 0x3000_0000),
    ("O", 0x4000_0000),
    ("LSE", 0x5000_0000),
    ("DO", 0x6000_0000),
    ("DELTA", 0x7000_0000),
    ("DQ", 0x8000_0000),
    ("DK", 0x9000_0000),
    ("DV", 0xa000_0000),
];

/// The address of tensor `name` ([`ADDRESSES`]).
pub fn address(name: &str) -> u64 {
    ADDRESSES.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("no address for {name}")).1
}

/// Forward and backward parameters of `[b, h, s, d]` views made by `view(address, heads)` and
/// `[b, hq, s]` fp32 rows made by `rows(address)`, at [`ADDRESSES`], causal aligned bottom-right.
pub fn params_of(
    view: impl Fn(u64, u64) -> TensorView<4>,
    rows: impl Fn(u64) -> TensorView<3>,
    hq: u64,
    hk: u64,
) -> (FwdParams<'static>, BwdParams<'static>) {
    let t = |name: &str, h: u64| view(address(name), h);
    let (q, k, v, o) = (t("Q", hq), t("K", hk), t("V", hk), t("O", hq));
    let mut fwd = FwdParams::new(q, k, v, o, Some(rows(address("LSE"))));
    fwd.mask = Mask::causal(MaskAlign::BottomRight);
    let (d_o, dq, dk, dv) = (t("DO", hq), t("DQ", hq), t("DK", hk), t("DV", hk));
    let mut bwd = BwdParams::new(q, k, v, o, d_o, rows(address("LSE")), rows(address("DELTA")), dq, dk, dv);
    bwd.mask = fwd.mask;
    (fwd, bwd)
}

/// Forward and backward parameters of one causal fp16 problem (B2 H4/2 S200 D64), contiguous
/// (B, H, S, D) tensors at [`ADDRESSES`].
pub fn params() -> (FwdParams<'static>, BwdParams<'static>) {
    let (b, hq, hk, s, d) = (2, 4, 2, 200, 64);
    let view = |base: u64, h: u64| TensorView::contiguous(base, [b, h, s, d], DType::F16);
    params_of(view, |base| TensorView::contiguous(base, [b, hq, s], DType::F32), hq, hk)
}

/// Runs `calls(device, tag)` from `threads` threads that start together, `rounds` times each,
/// alternating the two devices (thread `t`'s round `r` on device `(t + r) % 2`, tag `t`), so the
/// first loads of every kernel race on both; panics with the first error.
pub fn race_on_two_devices<F>(threads: usize, rounds: usize, calls: F)
where
    F: Fn(usize, usize) -> Result<(), String> + Send + Sync + 'static,
{
    let calls = std::sync::Arc::new(calls);
    let start = std::sync::Arc::new(std::sync::Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (start, calls) = (start.clone(), calls.clone());
            std::thread::spawn(move || {
                start.wait();
                (0..rounds).try_for_each(|round| calls((t + round) % 2, t).map_err(|e| format!("thread {t} round {round}: {e}")))
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker panicked").unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The head-dim-128 variant of [`params`]'s forward (kernels the head-dim-64 calls did not load).
pub fn fwd_hd128() -> FwdParams<'static> {
    let (mut fwd, _) = params();
    for t in [&mut fwd.q, &mut fwd.k, &mut fwd.v, &mut fwd.o] {
        *t = TensorView::contiguous(t.ptr, [t.sizes[0], t.sizes[1], t.sizes[2], 128], DType::F16);
    }
    fwd.sm_scale = 0.125;
    fwd
}

/// Makes each entry point of `entries` fail in turn (the double's `<prefix>_FAIL`) under
/// `call(i)`: the call must return a Driver error naming the entry point and the driver's `status`
/// name, the double must have recorded the injected failure and no successful `launch`; with the
/// failure lifted, the same call must succeed (a failed load is not cached). Call it when no other
/// thread of the test runs (it sets the environment).
pub fn check_injected_failures(
    prefix: &str,
    entries: &[&str],
    status: &str,
    launch: &str,
    log: &mut Log,
    call_with: impl Fn(usize) -> aotriton::Result<()>,
) {
    let variable = format!("{prefix}_FAIL");
    for (i, entry) in entries.iter().enumerate() {
        // SAFETY: the caller's contract: no other thread reads or writes the environment.
        unsafe { std::env::set_var(&variable, entry) };
        let e = call_with(i).expect_err(entry);
        assert!(e.kind() == aotriton::ErrorKind::Driver && e.message().contains(entry), "{entry}: {e}");
        assert!(e.message().contains(status), "{entry}: the driver's status {status} is not named: {e}");
        let records = log.take();
        assert!(records.iter().any(|r| call(r) == *entry && r["injected"] == true), "{entry} was not called: {records:?}");
        assert!(!records.iter().any(|r| call(r) == launch && r["rc"] == 0), "{entry}: a launch went ahead");
        // SAFETY: as above.
        unsafe { std::env::remove_var(&variable) };
        call_with(i).unwrap_or_else(|e| panic!("after a failed {entry}: {e}"));
        log.take();
    }
}
