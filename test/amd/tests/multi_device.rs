//! One process, two AMD devices: the runtime's module cache per device and its switching of the
//! calling thread's current device, against the recording HIP double reporting two gfx942 devices
//! (`AOTRITON_HIP_DOUBLE_DEVICES=2`; a stream handle's device is its bits 28-31, see
//! `hip-double/`).
//!
//! Threads issue forward and backward calls on streams of both devices at once, so the first loads
//! of every kernel race on both. Then the double's records must show:
//! - one `hipModuleLoadData` per (image, device), the same images on both devices;
//! - every launch on its stream's device with a function loaded there (the double refuses any
//!   other launch, so a module cached for the wrong device fails the call);
//! - the same launches (kernel, grid, block, LDS, argument bytes) on either device for the same call;
//! - each call leaving the thread's current device as it found it, the null stream running on the
//!   current device, and a stream of no device refused before anything is loaded or launched;
//! - a HIP call made to fail (module load, function lookup, launch) returned as a Driver error
//!   naming it, nothing launched, the next call fine.
//!
//! This proves the runtime's multi-device bookkeeping on HIP without an AMD GPU; it does not prove
//! the kernels run. On NVIDIA, `aotriton-gpu-tests --stress multi-device` does the same on two GPUs.
//!
//! Needs `libamd_comgr` (the double reads the code objects with it) and the gfx942 kernels
//! embedded in `aotriton` (`AOTRITON_TARGET_ARCH` including gfx942); `./test.sh` sets both.

use aotriton::flash;
use aotriton::Stream;
use aotriton_amd_tests::comgr::Comgr;
use aotriton_amd_tests::hip_double::{
    self, call, check_injected_failures, check_two_devices, device_of, fwd_hd128, params, race_on_two_devices, stream_handle,
};
use aotriton_amd_tests::skip_or_fail;

const DEVICES: usize = 2;
const THREADS: usize = 8;
/// Calls per thread, alternating devices (even: as many calls on either device).
const ROUNDS: usize = 4;
/// The HIP entry points of the double this test calls itself: the calling thread's current device.
struct CurrentDevice {
    _library: libloading::Library,
    get: unsafe extern "C" fn(*mut i32) -> i32,
    set: unsafe extern "C" fn(i32) -> i32,
}

impl CurrentDevice {
    fn open(double: &std::path::Path) -> CurrentDevice {
        // SAFETY: the double's initialisers have no preconditions; the symbols have HIP's types.
        unsafe {
            let library = libloading::Library::new(double).expect("open the HIP double");
            let get = *library.get::<unsafe extern "C" fn(*mut i32) -> i32>(b"hipGetDevice").unwrap();
            let set = *library.get::<unsafe extern "C" fn(i32) -> i32>(b"hipSetDevice").unwrap();
            CurrentDevice { _library: library, get, set }
        }
    }
    fn get(&self) -> i32 {
        let mut device = -1;
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { (self.get)(&mut device) }, 0, "hipGetDevice");
        device
    }
    fn set(&self, device: i32) {
        // SAFETY: plain value argument.
        assert_eq!(unsafe { (self.set)(device) }, 0, "hipSetDevice({device})");
    }
}

#[test]
fn two_devices_from_one_process() {
    // Kept loaded: the double loads the same library, and LLVM inside it cannot be loaded twice.
    let _comgr = match Comgr::load() {
        Ok(c) => c,
        Err(e) => return skip_or_fail(&e),
    };
    if !aotriton::built_archs().contains(&"gfx942") {
        return skip_or_fail("the build carries no gfx942 kernels (AOTRITON_TARGET_ARCH)");
    }
    // SAFETY: before the runtime's first HIP call; this file's one test is the only thread.
    let (double, mut log) = unsafe { hip_double::attach("multi-device", DEVICES as u32) };
    let (fwd, bwd) = params();

    // 1. Every thread's first call comes at once, half of them on each device.
    race_on_two_devices(THREADS, ROUNDS, move |device, tag| {
        let stream = Stream::hip(stream_handle(device, tag));
        flash::attn_fwd(&fwd, stream).map_err(|e| format!("attn_fwd: {e}"))?;
        flash::attn_bwd(&bwd, stream).map_err(|e| format!("attn_bwd: {e}"))
    });
    let records = log.take();
    let (launches, images) = check_two_devices(&records, "hipModuleLoadData", "hipModuleLaunchKernel");
    assert!(!launches.is_empty() && launches.len().is_multiple_of(THREADS * ROUNDS), "{} launches", launches.len());
    let per_call = launches.len() / (THREADS * ROUNDS);
    println!(
        "{THREADS} threads x {ROUNDS} rounds over {DEVICES} devices: {} launches ({per_call} per forward + backward), \
         {} images loaded once per device",
        launches.len(),
        images
    );

    // 2. The calling thread's current device: switched for the call, then restored.
    let current = CurrentDevice::open(&double);
    current.set(1);
    log.take(); // the test's own hipSetDevice
    flash::attn_fwd(&fwd, Stream::hip(stream_handle(0, 99))).expect("attn_fwd on device 0 from device 1");
    assert_eq!(current.get(), 1, "the call did not restore the thread's current device");
    let records = log.take();
    let switches: Vec<i64> =
        records.iter().filter(|r| call(r) == "hipSetDevice").map(|r| r["device"].as_i64().unwrap()).collect();
    assert_eq!(switches.first(), Some(&0), "the stream's device was not made current: {switches:?}");
    assert_eq!(switches.last(), Some(&1), "the thread's device was not restored: {switches:?}");
    assert!(!records.iter().any(|r| call(r) == "hipModuleLoadData"), "modules loaded again");

    // 3. The null stream runs on the current device (1 here), with that device's modules.
    flash::attn_fwd(&fwd, Stream::hip(0)).expect("attn_fwd on the null stream");
    let records = log.take();
    let on: Vec<usize> = records.iter().filter(|r| call(r) == "hipModuleLaunchKernel").map(device_of).collect();
    assert!(!on.is_empty() && on.iter().all(|&d| d == 1), "null-stream launches on devices {on:?}");
    assert!(!records.iter().any(|r| call(r) == "hipModuleLoadData"), "modules loaded again");
    current.set(0);

    // 4. A stream of a device the process does not have: an error, nothing loaded or launched.
    let e = flash::attn_fwd(&fwd, Stream::hip(stream_handle(DEVICES, 1))).expect_err("a stream of no device");
    assert!(e.message().contains("hipStreamGetDevice"), "{e}");
    let records = log.take();
    assert!(
        !records.iter().any(|r| matches!(call(r), "hipModuleLoadData" | "hipModuleLaunchKernel")),
        "{records:?}"
    );

    // 5. A HIP call that fails: the call returns a Driver error naming it (none swallowed, no
    //    panic), nothing is launched, and the next call succeeds (a failed load is not cached).
    //    Head dim 128: kernels not loaded yet (device 0, then device 1 for the lookup).
    let fwd128 = fwd_hd128();
    let entries = [("hipModuleLoadData", 0), ("hipModuleLaunchKernel", 0), ("hipModuleGetFunction", 1)];
    let names = entries.map(|(entry, _)| entry);
    check_injected_failures("AOTRITON_HIP_DOUBLE", &names, "hipErrorInvalidValue", "hipModuleLaunchKernel", &mut log, |i| {
        flash::attn_fwd(&fwd128, Stream::hip(stream_handle(entries[i].1, 7)))
    });
}
