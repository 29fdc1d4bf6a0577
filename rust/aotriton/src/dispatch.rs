//! From a request to a launch: the functional key picks the functional in the device's archive;
//! the divisibility hints each kernel was compiled with are checked against the real argument
//! values; the operator's heuristic picks one of the kernels that fit; the kernel is loaded once
//! per context; its arguments are laid out in the order its metadata gives.
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use crate::archive::{Functional, KernelMeta};
use crate::driver::Stream;
use crate::driver::cuda::{self, DeviceInfo, LaunchDims, LoadedFunction, StreamContext, lock};
use crate::error::{Error, ErrorKind, Result};
use crate::images::{self, LoadedArchive};

/// One kernel argument value. Pointers are device addresses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ArgValue {
    Ptr(u64),
    I32(i32),
    U32(u32),
    I64(i64),
    F32(f32),
}

impl ArgValue {
    /// Whether the value satisfies a `tt.divisibility` hint (pointers: byte address).
    fn divisible_by(self, d: u32) -> bool {
        let d = d.max(1) as i64;
        match self {
            ArgValue::Ptr(p) => p % d as u64 == 0,
            ArgValue::I32(v) => v as i64 % d == 0,
            ArgValue::U32(v) => v as i64 % d == 0,
            ArgValue::I64(v) => v % d == 0,
            ArgValue::F32(_) => d == 1,
        }
    }

    /// Whether this value can be passed for an argument of Triton signature type `ty`.
    fn fits_type(self, ty: &str) -> bool {
        match self {
            ArgValue::Ptr(_) => ty.starts_with('*'),
            ArgValue::I32(_) => ty == "i32",
            ArgValue::U32(_) => ty == "u32",
            ArgValue::I64(_) => ty == "i64",
            ArgValue::F32(_) => ty == "fp32",
        }
    }

    /// The value's bytes in a 64-bit slot; the driver reads the argument's own size from the
    /// slot's start (little-endian), so 4-byte values occupy the low half.
    fn to_slot(self) -> u64 {
        match self {
            ArgValue::Ptr(p) => p,
            ArgValue::I32(v) => v as u32 as u64,
            ArgValue::U32(v) => v as u64,
            ArgValue::I64(v) => v as u64,
            ArgValue::F32(v) => v.to_bits() as u64,
        }
    }
}

/// Named argument values of one call, in the operator's own (fixed) order.
pub(crate) type Args<'a> = &'a [(&'static str, ArgValue)];

/// The most arguments a kernel may take (its own plus Triton's two scratch pointers).
const MAX_ARGS: usize = 64;

/// A request to run one operator: which functional, with which arguments.
pub(crate) struct Request<'a> {
    pub family: &'static str,
    /// Functional axes and their canonical values, e.g. `[("dtype", "fp16"), ("head_dim", "64")]`.
    pub axes: &'a [(&'static str, String)],
    pub args: Args<'a>,
}

impl Request<'_> {
    /// `attn_fwd{dtype=fp16, head_dim=64, causal=false}`, for messages.
    pub fn describe(&self) -> String {
        let axes: Vec<String> = self.axes.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{}{{{}}}", self.family, axes.join(", "))
    }
}

/// Finds the functional of `request` in `archive`.
pub(crate) fn find_functional(loaded: &LoadedArchive, request: &Request) -> Result<usize> {
    let axes: Vec<(&str, &str)> = request.axes.iter().map(|(k, v)| (*k, v.as_str())).collect();
    loaded.archive.find(request.family, &axes).ok_or_else(|| {
        Error::new(
            ErrorKind::KernelNotFound,
            format!("{} is not compiled into {}", request.describe(), loaded.archive.name()),
        )
    })
}

/// The kernels of `functional` whose compiled divisibility hints hold for `args`, as indices.
pub(crate) fn fitting_kernels(functional: &Functional, args: Args) -> Result<Vec<usize>> {
    let mut fitting = Vec::new();
    'kernels: for (index, kernel) in functional.kernels.iter().enumerate() {
        for arg in &kernel.args {
            let value = lookup(args, &arg.name, kernel)?;
            if !value.divisible_by(arg.divisibility) {
                continue 'kernels;
            }
        }
        fitting.push(index);
    }
    Ok(fitting)
}

fn lookup(args: Args, name: &str, kernel: &KernelMeta) -> Result<ArgValue> {
    args.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).ok_or_else(|| {
        Error::new(
            ErrorKind::BadArchive,
            format!("kernel {} takes an argument '{name}' that this runtime does not provide", kernel.id),
        )
    })
}

/// Launches on one stream: holds the stream's context current while kernels are prepared and
/// launched. Operators that launch several kernels prepare all of them first, so an error
/// (a missing functional, a failed load) stops the call before anything is enqueued.
pub(crate) struct Launcher {
    context: StreamContext,
    stream: Stream,
}

/// A kernel chosen, loaded and given its launch geometry, ready to enqueue.
pub(crate) struct Prepared<'a> {
    kernel: Arc<LoadedKernel>,
    args: Args<'a>,
    dims: LaunchDims,
}

impl Launcher {
    pub fn new(stream: Stream) -> Result<Launcher> {
        Ok(Launcher { context: StreamContext::enter(stream)?, stream })
    }

    /// Finds the functional of `request` in the device's archive, keeps the kernels whose
    /// compiled hints fit the arguments, lets `choose` pick one (given indices into the
    /// functional's kernels, never empty), loads it once per context, and lays out its launch.
    pub fn prepare<'a>(
        &self,
        request: &Request<'a>,
        choose: impl FnOnce(&Functional, &[usize], &DeviceInfo) -> usize,
        grid: impl FnOnce(&KernelMeta) -> [u32; 3],
    ) -> Result<Prepared<'a>> {
        let loaded = images::archive_for(&self.context.device.arch)?;
        let functional_index = find_functional(&loaded, request)?;
        let functional = &loaded.archive.functionals()[functional_index];
        let fitting = fitting_kernels(functional, request.args)?;
        if fitting.is_empty() {
            return Err(Error::new(
                ErrorKind::KernelNotFound,
                format!(
                    "no compiled variant of {} accepts these pointer alignments and strides",
                    request.describe()
                ),
            ));
        }
        let kernel_index = choose(functional, &fitting, &self.context.device);
        let kernel = load(&self.context, &loaded, functional_index, kernel_index)?;
        let meta = &kernel.meta;
        kernel.slots.get_or_init(|| plan_slots(meta, request.args)).as_ref().map_err(Clone::clone)?;
        let dims = LaunchDims { grid: grid(meta), threads: meta.num_warps * meta.warp_size, shared: meta.shared };
        Ok(Prepared { kernel, args: request.args, dims })
    }

    /// Enqueues a prepared kernel on the stream.
    pub fn launch(&self, prepared: &Prepared) -> Result<()> {
        let slots = match prepared.kernel.slots.get() {
            Some(Ok(slots)) => slots,
            _ => return Err(Error::new(ErrorKind::Internal, "launch of a kernel that was not prepared")),
        };
        let mut values = [0u64; MAX_ARGS];
        for (value, &slot) in values.iter_mut().zip(slots.iter()) {
            *value = prepared.args[slot].1.to_slot();
        }
        // Triton's two trailing scratch pointers (global, profile) stay 0: `load` refused kernels
        // that need scratch memory.
        let count = slots.len() + 2;
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (param, value) in params.iter_mut().zip(values.iter_mut()).take(count) {
            *param = value as *mut u64 as *mut c_void;
        }
        cuda::launch(&prepared.kernel.function, prepared.dims, self.stream, &mut params[..count], &prepared.kernel.meta.id)
    }
}

/// Chooses among fitting kernels by variant: the `aligned` ones when any fits (they carry the
/// divisibility hints), else the rest. Operators then pick a config among these.
pub(crate) fn preferred_variant(functional: &Functional, fitting: &[usize]) -> Vec<usize> {
    let aligned: Vec<usize> =
        fitting.iter().copied().filter(|&i| functional.kernels[i].variant == "aligned").collect();
    if aligned.is_empty() { fitting.to_vec() } else { aligned }
}

/// A config value of a kernel (`BLOCK_M`, ...), or `default` if the kernel has none.
pub(crate) fn config(meta: &KernelMeta, key: &str, default: i64) -> i64 {
    meta.config.get(key).copied().unwrap_or(default)
}

/// For each argument of the kernel (ABI order), the index of its value in the request's
/// argument list, with the types checked. Computed once per loaded kernel: an operator always
/// lists its arguments in the same order.
fn plan_slots(meta: &KernelMeta, args: Args) -> Result<Vec<usize>> {
    if meta.args.len() + 2 > MAX_ARGS {
        return Err(Error::new(
            ErrorKind::BadArchive,
            format!("kernel {} takes {} arguments, more than {MAX_ARGS}", meta.id, meta.args.len()),
        ));
    }
    meta.args
        .iter()
        .map(|arg| {
            let slot = args.iter().position(|(n, _)| *n == arg.name).ok_or_else(|| {
                Error::new(ErrorKind::BadArchive, format!("kernel {} takes unknown argument '{}'", meta.id, arg.name))
            })?;
            if !args[slot].1.fits_type(&arg.ty) {
                return Err(Error::new(
                    ErrorKind::BadArchive,
                    format!(
                        "kernel {} declares '{}' as {}, but the runtime passes {:?}",
                        meta.id, arg.name, arg.ty, args[slot].1
                    ),
                ));
            }
            Ok(slot)
        })
        .collect()
}

/// A kernel loaded into one context, with its argument layout once known.
struct LoadedKernel {
    function: LoadedFunction,
    slots: OnceLock<Result<Vec<usize>>>,
    /// Copied once at load, so a launch reads it without cloning.
    meta: KernelMeta,
}

/// Loads a kernel into the stream's context once; later calls find it in the cache. Loading
/// holds the cache lock, so two threads never load the same kernel twice.
fn load(
    context: &StreamContext,
    loaded: &LoadedArchive,
    functional: usize,
    kernel: usize,
) -> Result<Arc<LoadedKernel>> {
    // (context, archive, functional, kernel): the archive's address stands for its arch (archives
    // are cached for the life of the process), so the lookup allocates nothing.
    type Key = (usize, usize, usize, usize);
    static CACHE: OnceLock<Mutex<HashMap<Key, Arc<LoadedKernel>>>> = OnceLock::new();
    let key = (context.context as usize, loaded as *const LoadedArchive as usize, functional, kernel);
    let mut cache = lock(CACHE.get_or_init(Default::default));
    if let Some(found) = cache.get(&key) {
        return Ok(found.clone());
    }
    let meta = &loaded.archive.functionals()[functional].kernels[kernel];
    if meta.global_scratch_size > 0 || meta.profile_scratch_size > 0 {
        return Err(Error::new(
            ErrorKind::KernelNotFound,
            format!(
                "kernel {} needs scratch memory (global {} B, profile {} B per program), which this runtime does not provide yet",
                meta.id, meta.global_scratch_size, meta.profile_scratch_size
            ),
        ));
    }
    let images = loaded.images(functional)?;
    let function = cuda::load_function(&images[kernel], &meta.symbol, meta.shared, &context.device, &meta.id)?;
    let entry = Arc::new(LoadedKernel { function, slots: OnceLock::new(), meta: meta.clone() });
    cache.insert(key, entry.clone());
    Ok(entry)
}
