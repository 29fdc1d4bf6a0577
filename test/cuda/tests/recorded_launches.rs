//! The CUDA launch path without an NVIDIA GPU: one process driving two sm_90 devices of the
//! recording CUDA driver double (`cuda-double/`, `libcuda.so.1` on `LD_LIBRARY_PATH` of a child
//! process, so the test runs itself again as that child).
//!
//! Threads issue forward and backward calls (the Gluon kernels, with their TMA descriptors, and the
//! portable ones) on streams of both devices at once, so the first loads of every kernel race on
//! both. Then the double's records must show:
//! - one `cuModuleLoadData` per (image, device), the same images on both devices;
//! - every launch on its stream's device with its context current and a function loaded there,
//!   its dynamic shared memory above 48 KiB opted in, its parameters laid out from the cubin's own
//!   parameter table (the double refuses any other launch, and a descriptor the driver would
//!   refuse);
//! - the same launches (kernel, grid, block, shared memory, parameter bytes, descriptors included)
//!   on either device for the same call;
//! - the calling thread's context stack as it was after each call, the null stream on the current
//!   context, and a stream of no device refused before anything is loaded or launched;
//! - a driver call made to fail (module load, function lookup, shared-memory opt-in, descriptor
//!   encode, launch) returned as a Driver error naming it, nothing launched, the next call fine.
//!
//! A second test, on one device, calls the other features (dropout, packed batches, bias, fp32,
//! soft-capping, the debug mask) and checks each launched kernel's parameters likewise.
//!
//! This proves what the runtime sends to the driver; it does not prove the kernels run (the GPU
//! suites do, and `aotriton-gpu-tests --stress multi-device` on two GPUs).
use std::collections::HashMap;

use aotriton::flash::{self, Backend, BwdParams, Dropout, FwdParams, Varlen, Workspace};
use aotriton::{DType, Stream, TensorView};
use aotriton_cuda_tests::{
    ADDRESSES, call, check_injected_failures, check_two_devices, child_log, device_of, fwd_hd128, params, params_of,
    race_on_two_devices, run_child, stream_handle,
};
use serde_json::Value;

const DEVICES: usize = 2;
const THREADS: usize = 8;
/// Calls per thread, alternating devices (even: as many calls on either device).
const ROUNDS: usize = 4;
/// A stream of `device`, distinct per `tag`.
fn stream_of(device: usize, tag: usize) -> Stream {
    Stream::cuda(stream_handle(device, tag))
}

/// One round of calls on `stream`: the forward (Gluon, the default on sm_90), the backward with a
/// workspace (Gluon) and the forward on the portable kernels.
fn calls(fwd: &FwdParams, bwd: &BwdParams, stream: Stream) -> aotriton::Result<()> {
    flash::attn_fwd(fwd, stream)?;
    let mut bwd = *bwd;
    let bytes = flash::attn_bwd_workspace_bytes(&bwd, stream)?;
    bwd.workspace = Some(Workspace { ptr: 0xb000_0000, bytes });
    flash::attn_bwd(&bwd, stream)?;
    let mut portable = *fwd;
    portable.backend = Backend::Portable;
    flash::attn_fwd(&portable, stream)
}

/// Bytes of a kernel parameter of Triton type `ty`, where it has a fixed size.
fn type_bytes(ty: &str) -> Option<usize> {
    Some(match ty {
        t if t.starts_with('*') => 8,
        "i1" | "i8" | "u8" => 1,
        "fp16" | "bf16" | "i16" => 2,
        "i32" | "u32" | "fp32" => 4,
        "i64" | "u64" | "fp64" => 8,
        _ => return None,
    })
}

/// Each kernel launched, checked against the archive's metadata: the cubin's parameters are the
/// metadata's arguments, each of its type's size (a TMA descriptor: the 128-byte map, then its
/// rank's 4-byte sizes and 8-byte strides, as Triton lowers it), then Triton's two scratch
/// pointers; the tensors' pointers and descriptors hold those tensors' addresses (a descriptor of
/// the double starts with its address), `sm_scale` 1/8. The kernels are of head dim 64 (or of
/// none). Returns the kernels checked.
fn check_arguments(launches: &[&Value]) -> usize {
    let dir = std::env::var_os("AOTRITON_ARCHIVE_DIR").map(std::path::PathBuf::from);
    let path = dir.unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/images"));
    let archive = aotriton::archive::Archive::open(&path.join("aotriton-sm_90.images"))
        .unwrap_or_else(|e| panic!("the sm_90 archive in {} (AOTRITON_ARCHIVE_DIR): {e}", path.display()));
    let launched: std::collections::BTreeSet<&str> = launches.iter().map(|r| r["image_fnv1a"].as_str().unwrap()).collect();
    let mut metas = HashMap::new();
    for (index, f) in archive.functionals().iter().enumerate() {
        let ours = f.axes.get("head_dim").is_none_or(|d| d == "64");
        if !ours || !launches.iter().any(|r| r["symbol"] == f.family.as_str()) {
            continue;
        }
        for (image, meta) in archive.load_images(index).unwrap().iter().zip(&f.kernels) {
            let hash = format!("{:016x}", image.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3)));
            if launched.contains(hash.as_str()) {
                metas.insert(hash, meta.clone());
            }
        }
    }
    let mut checked = std::collections::BTreeSet::new();
    for r in launches {
        let hash = r["image_fnv1a"].as_str().unwrap();
        let meta = metas.get(hash).unwrap_or_else(|| panic!("launched image {hash} is in no hd64 functional: {r}"));
        let layout: Vec<(usize, usize)> =
            r["param_layout"].as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap() as usize, p[1].as_u64().unwrap() as usize)).collect();
        let params = r["params"].as_str().unwrap();
        let bytes: Vec<u8> = (0..params.len()).step_by(2).map(|i| u8::from_str_radix(&params[i..i + 2], 16).unwrap()).collect();
        let id = &meta.id;
        // The parameter sizes the metadata implies, argument by argument (None: not fixed).
        let mut sizes: Vec<(&str, Option<usize>)> = Vec::new();
        for arg in &meta.args {
            match &arg.tensordesc {
                Some(desc) => {
                    sizes.push((&arg.name, Some(128)));
                    sizes.extend(std::iter::repeat_n((arg.name.as_str(), Some(4)), desc.rank()));
                    sizes.extend(std::iter::repeat_n((arg.name.as_str(), Some(8)), desc.rank()));
                }
                None => sizes.push((&arg.name, type_bytes(&arg.ty))),
            }
        }
        sizes.extend([("global scratch", Some(8)), ("profile scratch", Some(8))]);
        let got: Vec<usize> = layout.iter().map(|&(_, size)| size).collect();
        assert_eq!(got.len(), sizes.len(), "{id}: cubin parameters {got:?} vs the metadata's {sizes:?}");
        for (&(name, want), size) in sizes.iter().zip(&got) {
            assert!(want.is_none_or(|w| w == *size), "{id}: a parameter of {name} is {size} bytes, expected {want:?}");
        }
        let mut at = 0;
        for arg in &meta.args {
            let (offset, size) = layout[at];
            at += arg.tensordesc.as_ref().map_or(1, |d| 1 + 2 * d.rank());
            let value = &bytes[offset..offset + size];
            let name = arg.name.strip_prefix("desc_").map(str::to_uppercase).unwrap_or_else(|| arg.name.clone());
            let name = if name == "D_O" { "DO".to_string() } else { name };
            if let Some((_, address)) = ADDRESSES.iter().find(|(n, _)| *n == name) {
                let got = u64::from_le_bytes(value[..8].try_into().unwrap());
                assert_eq!(got, *address, "{id}: {} holds {got:#x}, the tensor is at {address:#x}", arg.name);
            }
            if arg.name == "sm_scale" {
                assert_eq!(f32::from_le_bytes(value.try_into().unwrap()), 0.125, "{id}: sm_scale");
            }
        }
        checked.insert(id.clone());
    }
    checked.len()
}

/// The double's own entry points this test calls: the thread's context stack.
struct Contexts {
    _library: libloading::Library,
    current: unsafe extern "C" fn() -> i32,
    stream_ctx: unsafe extern "C" fn(*mut std::ffi::c_void, *mut *mut std::ffi::c_void) -> u32,
    push: unsafe extern "C" fn(*mut std::ffi::c_void) -> u32,
    pop: unsafe extern "C" fn(*mut *mut std::ffi::c_void) -> u32,
}

impl Contexts {
    fn open() -> Contexts {
        // SAFETY: the double (found on LD_LIBRARY_PATH) has no initialisers with preconditions;
        // the symbols have the driver's types.
        unsafe {
            let library = libloading::Library::new("libcuda.so.1").expect("the double as libcuda.so.1");
            Contexts {
                current: *library.get(b"aotriton_cuda_double_current_device").unwrap(),
                stream_ctx: *library.get(b"cuStreamGetCtx").unwrap(),
                push: *library.get(b"cuCtxPushCurrent_v2").unwrap(),
                pop: *library.get(b"cuCtxPopCurrent_v2").unwrap(),
                _library: library,
            }
        }
    }
    fn current(&self) -> i32 {
        // SAFETY: no arguments.
        unsafe { (self.current)() }
    }
    /// Makes `device`'s context current (pushes it).
    fn push(&self, device: usize) {
        let mut context = std::ptr::null_mut();
        // SAFETY: a stream handle of the double's convention and valid out-pointers.
        unsafe {
            assert_eq!((self.stream_ctx)(stream_handle(device, 0) as *mut _, &mut context), 0);
            assert_eq!((self.push)(context), 0);
        }
    }
    fn pop(&self) {
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { (self.pop)(&mut std::ptr::null_mut()) }, 0);
    }
}

#[test]
fn two_devices_from_one_process() {
    let Some(mut log) = child_log() else {
        return run_child("two_devices_from_one_process", DEVICES as u32);
    };
    if !aotriton::built_archs().contains(&"sm_90") {
        println!("skipped: the build carries no sm_90 kernels (AOTRITON_TARGET_ARCH)");
        return;
    }
    let (fwd, bwd) = params();

    // 1. Every thread's first call comes at once, half of them on each device.
    race_on_two_devices(THREADS, ROUNDS, move |device, tag| calls(&fwd, &bwd, stream_of(device, tag)).map_err(|e| e.to_string()));
    let records = log.take();
    let (launches, images) = check_two_devices(&records, "cuModuleLoadData", "cuLaunchKernel");
    assert!(!launches.is_empty() && launches.len().is_multiple_of(THREADS * ROUNDS), "{} launches", launches.len());
    let symbols: std::collections::BTreeSet<&str> = launches.iter().map(|r| r["symbol"].as_str().unwrap()).collect();
    let descriptors = records.iter().filter(|r| call(r) == "cuTensorMapEncodeTiled").count();
    assert!(descriptors > 0, "no TMA descriptor encoded: the Gluon kernels did not run");
    let opted_in = records.iter().filter(|r| call(r) == "cuFuncSetAttribute").count();
    let kernels = check_arguments(&launches);
    println!(
        "{THREADS} threads x {ROUNDS} rounds over {DEVICES} devices: {} launches of {symbols:?}, {} images loaded once per \
         device, {descriptors} TMA descriptors encoded, {opted_in} functions opted in to more shared memory, the \
         arguments of {kernels} kernels checked against the archive",
        launches.len(),
        images
    );

    // 2. The thread's context stack: what the call pushed, it popped.
    let contexts = Contexts::open();
    assert_eq!(contexts.current(), -1, "a context left current on this thread");
    contexts.push(1);
    log.take(); // the test's own push
    calls(&fwd, &bwd, stream_of(0, 99)).expect("calls on device 0 with device 1's context current");
    assert_eq!(contexts.current(), 1, "the calls did not restore the thread's context");
    let records = log.take();
    assert!(!records.iter().any(|r| call(r) == "cuModuleLoadData"), "modules loaded again");
    let pushes = records.iter().filter(|r| call(r) == "cuCtxPushCurrent").count();
    let pops = records.iter().filter(|r| call(r) == "cuCtxPopCurrent").count();
    assert!(pushes > 0 && pushes == pops, "{pushes} pushes, {pops} pops");

    // 3. The null stream runs in the current context (device 1 here), with that device's modules.
    flash::attn_fwd(&fwd, Stream::cuda(0)).expect("attn_fwd on the null stream");
    let records = log.take();
    let on: Vec<usize> = records.iter().filter(|r| call(r) == "cuLaunchKernel").map(device_of).collect();
    assert!(!on.is_empty() && on.iter().all(|&d| d == 1), "null-stream launches on devices {on:?}");
    assert!(!records.iter().any(|r| call(r) == "cuModuleLoadData"), "modules loaded again");
    contexts.pop();

    // 4. A stream of a device the process does not have: an error, nothing loaded or launched.
    let e = flash::attn_fwd(&fwd, stream_of(DEVICES, 1)).expect_err("a stream of no device");
    assert!(e.message().contains("cuStreamGetCtx"), "{e}");
    let records = log.take();
    assert!(!records.iter().any(|r| matches!(call(r), "cuModuleLoadData" | "cuLaunchKernel")), "{records:?}");

    // 5. A driver call that fails: the call returns a Driver error naming it (none swallowed,
    //    no panic), and the next call succeeds (a failed load is not cached). Head dim 128: kernels
    //    not loaded yet (the Gluon forward on device 0, then on device 1 for the opt-in; the
    //    portable forward on device 1 for the lookup).
    let entries = [
        ("cuModuleLoadData", 0, Backend::Gluon),
        ("cuTensorMapEncodeTiled", 0, Backend::Gluon),
        ("cuLaunchKernel", 0, Backend::Gluon),
        ("cuFuncSetAttribute", 1, Backend::Gluon),
        ("cuModuleGetFunction", 1, Backend::Portable),
    ];
    let names = entries.map(|(entry, _, _)| entry);
    check_injected_failures("AOTRITON_CUDA_DOUBLE", &names, "CUDA_ERROR_INVALID_VALUE", "cuLaunchKernel", &mut log, |i| {
        let (_, device, backend) = entries[i];
        let mut fwd = fwd_hd128();
        fwd.backend = backend;
        flash::attn_fwd(&fwd, stream_of(device, 7))
    });
}

/// The features beside the base case, on one device: dropout, packed batches and their host
/// offsets on the Gluon kernels; bias with its gradient, fp32, soft-capping and the debug mask on
/// the portable ones. Every driver call must succeed and every launched kernel's parameters match
/// its archive metadata (`check_arguments`).
#[test]
fn features_on_one_device() {
    let Some(mut log) = child_log() else {
        return run_child("features_on_one_device", 1);
    };
    if !aotriton::built_archs().contains(&"sm_90") {
        println!("skipped: the build carries no sm_90 kernels (AOTRITON_TARGET_ARCH)");
        return;
    }
    let stream = stream_of(0, 1);
    let (fwd, bwd) = params();
    let with_workspace = |p: &BwdParams<'static>| -> aotriton::Result<BwdParams<'static>> {
        let mut p = *p;
        p.workspace = Some(Workspace { ptr: 0xb000_0000, bytes: flash::attn_bwd_workspace_bytes(&p, stream)? });
        Ok(p)
    };
    let run = |what: &str, f: &dyn Fn() -> aotriton::Result<()>| f().unwrap_or_else(|e| panic!("{what}: {e}"));

    // Dropout on the Gluon kernels, the forward writing the seed and offset it used.
    let mut dropout = Dropout::new(0.2, 0xd000_0000, 0xd000_0010);
    dropout.offset_base = 7;
    let (mut f, mut b) = (fwd, bwd);
    f.dropout = Some(Dropout { seed_out: 0xd000_0020, offset_out: 0xd000_0030, ..dropout });
    b.dropout = Some(dropout);
    run("dropout attn_fwd", &|| flash::attn_fwd(&f, stream));
    run("dropout attn_bwd", &|| flash::attn_bwd(&with_workspace(&b)?, stream));

    // A packed batch of three sequences ((total, H, D) memory), host offsets given.
    static CU: [i32; 4] = [0, 70, 200, 333];
    let (hq, hk, total, d) = (4u64, 2u64, 333u64, 64u64);
    let packed = |base: u64, h: u64| TensorView::new(base, [1, h, total, d], [(total * h * d) as i64, d as i64, (h * d) as i64, 1], DType::F16);
    let rows = |base: u64| TensorView::contiguous(base, [1, hq, total], DType::F32);
    let cu = |base: u64| TensorView::contiguous(base, [4], DType::I32);
    let varlen = Varlen { host_cu_seqlens: Some((&CU, &CU)), ..Varlen::new(cu(0xe000_0000), cu(0xe000_1000), 133, 133) };
    let (mut f, mut b) = params_of(packed, rows, hq, hk);
    f.varlen = Some(varlen);
    b.varlen = Some(varlen);
    run("varlen attn_fwd", &|| flash::attn_fwd(&f, stream));
    run("varlen attn_bwd", &|| flash::attn_bwd(&with_workspace(&b)?, stream));

    // A bias broadcast over the batch, with its gradient (the portable kernels).
    let bias = TensorView::contiguous(0xc000_0000, [1, 4, 200, 200], DType::F16);
    let dbias = TensorView::contiguous(0xc800_0000, [1, 4, 200, 200], DType::F16);
    let (mut f, mut b) = (fwd, bwd);
    f.bias = Some(bias);
    b.bias = Some(bias);
    b.dbias = Some(dbias);
    run("bias attn_fwd", &|| flash::attn_fwd(&f, stream));
    run("bias attn_bwd", &|| flash::attn_bwd(&b, stream));

    // fp32 and soft-capping (the portable kernels).
    let to_f32 = |t: TensorView<4>| TensorView::contiguous(t.ptr, t.sizes, DType::F32);
    let mut f = fwd;
    (f.q, f.k, f.v, f.o) = (to_f32(f.q), to_f32(f.k), to_f32(f.v), to_f32(f.o));
    run("fp32 attn_fwd", &|| flash::attn_fwd(&f, stream));
    let mut f = fwd;
    f.softcap = 30.0;
    run("softcap attn_fwd", &|| flash::attn_fwd(&f, stream));

    // The debug mask of the dropout above.
    let mask = TensorView::contiguous(0xf000_0000, [2, 4, 200, 200], DType::F32);
    run("debug_dropout_mask", &|| flash::debug_dropout_mask(&mask, &dropout, stream));

    let records = log.take();
    let failed: Vec<&Value> = records.iter().filter(|r| r["rc"] != 0).collect();
    assert!(failed.is_empty(), "driver calls failed: {failed:?}");
    let launches: Vec<&Value> = records.iter().filter(|r| call(r) == "cuLaunchKernel").collect();
    let symbols: std::collections::BTreeSet<&str> = launches.iter().map(|r| r["symbol"].as_str().unwrap()).collect();
    let kernels = check_arguments(&launches);
    println!("{} launches of {symbols:?}: the arguments of {kernels} kernels checked against the archive", launches.len());
}
