//! From a request to a launch: the functional key picks the functional in the device's archive;
//! the divisibility hints each kernel was compiled with (for TMA descriptor arguments: the TMA
//! rules) are checked against the real argument values; the operator's heuristic picks one of
//! the kernels that fit; the kernel is loaded once per device (CUDA: per context) through the
//! stream's driver; its descriptors are encoded and its arguments laid out in the order its
//! metadata gives (the same plan for every vendor: [`kernarg_layout`] is the byte layout it
//! implies, which the AMD tests check against each code object's own metadata). Everything per call lives in
//! fixed-capacity storage: after a kernel's first launch, nothing here allocates.
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::archive::{Functional, KernelArg, KernelMeta, MaskKind};
use crate::driver::{
    DeviceInfo, EMPTY_TENSOR_MAP, LaunchDims, LoadedFunction, ModuleScope, Runtime, Stream, StreamContext, TensorMap,
};
use crate::error::{Error, ErrorKind, Result, bail};
use crate::images::{self, LoadedArchive};
use crate::lock;
use crate::tma::{self, MAX_RANK, TensorArg};

/// One kernel argument value. Pointers are device addresses; a tensor goes to a host-side TMA
/// descriptor argument (the runtime encodes the `CUtensorMap`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ArgValue {
    Ptr(u64),
    I32(i32),
    U32(u32),
    I64(i64),
    F32(f32),
    Tensor(TensorArg),
}

impl ArgValue {
    /// Whether the value satisfies what kernel argument `arg` was compiled to assume: its
    /// `tt.divisibility` hint (pointers: byte address), or for a descriptor argument the TMA
    /// rules (`tma::check`).
    fn fits(&self, arg: &KernelArg) -> bool {
        let d = arg.divisibility.max(1) as i64;
        match *self {
            ArgValue::Tensor(t) => arg.tensordesc.is_some() && tma::check(&t).is_ok(),
            ArgValue::Ptr(p) => p % d as u64 == 0,
            ArgValue::I32(v) => v as i64 % d == 0,
            ArgValue::U32(v) => v as i64 % d == 0,
            ArgValue::I64(v) => v % d == 0,
            ArgValue::F32(_) => d == 1,
        }
    }

    /// Whether this value can be passed for an argument of Triton signature type `ty`, and
    /// whether it must be widened to do so (an i32 value for an i64 argument).
    fn fits_type(&self, ty: &str) -> Option<bool> {
        match self {
            ArgValue::Ptr(_) => ty.starts_with('*').then_some(false),
            ArgValue::I32(_) => match ty {
                "i32" => Some(false),
                "i64" => Some(true),
                _ => None,
            },
            ArgValue::U32(_) => (ty == "u32").then_some(false),
            ArgValue::I64(_) => (ty == "i64").then_some(false),
            ArgValue::F32(_) => (ty == "fp32").then_some(false),
            ArgValue::Tensor(_) => ty.starts_with("tensordesc").then_some(false),
        }
    }

    /// The value's bytes in a 64-bit slot; the driver reads the argument's own size from the
    /// slot's start (little-endian), so 4-byte values occupy the low half. `widen`: an i32 value
    /// passed as i64 (sign-extended).
    fn to_slot(self, widen: bool) -> u64 {
        match self {
            ArgValue::Ptr(p) => p,
            ArgValue::I32(v) if widen => v as i64 as u64,
            ArgValue::I32(v) => v as u32 as u64,
            ArgValue::U32(v) => v as u64,
            ArgValue::I64(v) => v as u64,
            ArgValue::F32(v) => v.to_bits() as u64,
            ArgValue::Tensor(_) => 0,
        }
    }
}

/// Named argument values of one call, in the operator's own (fixed) order.
pub(crate) type Args<'a> = &'a [(&'static str, ArgValue)];

/// The most named values one operator passes to one kernel family.
pub(crate) const MAX_NAMED_ARGS: usize = 80;

/// A fixed-capacity list of named argument values, built on the stack per call (no heap).
pub(crate) struct ArgList {
    items: [(&'static str, ArgValue); MAX_NAMED_ARGS],
    len: usize,
    overflow: bool,
}

impl ArgList {
    pub fn new() -> ArgList {
        ArgList { items: [("", ArgValue::Ptr(0)); MAX_NAMED_ARGS], len: 0, overflow: false }
    }

    pub fn push(&mut self, name: &'static str, value: ArgValue) {
        match self.items.get_mut(self.len) {
            Some(item) => {
                *item = (name, value);
                self.len += 1;
            }
            None => self.overflow = true,
        }
    }

    pub fn extend(&mut self, values: impl IntoIterator<Item = (&'static str, ArgValue)>) {
        for (name, value) in values {
            self.push(name, value);
        }
    }

    /// The values, or an internal error if more were pushed than fit.
    pub fn args(&self) -> Result<Args<'_>> {
        if self.overflow {
            return Err(Error::new(ErrorKind::Internal, format!("more than {MAX_NAMED_ARGS} kernel arguments in one call")));
        }
        Ok(&self.items[..self.len])
    }
}

/// The most functional axes of one family.
const MAX_AXES: usize = 8;

/// A functional key: axes and their canonical values, e.g. `[("dtype", "fp16"), ("head_dim",
/// "64")]`, fixed capacity and `'static` text, so building one allocates nothing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Axes {
    items: [(&'static str, &'static str); MAX_AXES],
    len: usize,
    overflow: bool,
}

impl Axes {
    pub fn new() -> Axes {
        Axes { items: [("", ""); MAX_AXES], len: 0, overflow: false }
    }

    pub fn of(axes: &[(&'static str, &'static str)]) -> Axes {
        let mut a = Axes::new();
        for &(k, v) in axes {
            a.push(k, v);
        }
        a
    }

    pub fn push(&mut self, axis: &'static str, value: &'static str) {
        match self.items.get_mut(self.len) {
            Some(item) => {
                *item = (axis, value);
                self.len += 1;
            }
            None => self.overflow = true,
        }
    }

    pub fn as_slice(&self) -> Result<&[(&'static str, &'static str)]> {
        if self.overflow {
            return Err(Error::new(ErrorKind::Internal, format!("more than {MAX_AXES} functional axes")));
        }
        Ok(&self.items[..self.len])
    }
}

/// The canonical text of a boolean axis value.
pub(crate) fn bool_axis(on: bool) -> &'static str {
    if on { "true" } else { "false" }
}

/// A set of kernel indices within one functional (a bitmask: no allocation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KernelSet(u128);

impl KernelSet {
    /// Most kernels a functional may have.
    pub const CAPACITY: usize = 128;

    pub fn insert(&mut self, index: usize) {
        debug_assert!(index < Self::CAPACITY);
        self.0 |= 1 << index;
    }
    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }
    pub fn first(&self) -> Option<usize> {
        (self.0 != 0).then(|| self.0.trailing_zeros() as usize)
    }
    /// Keeps the indices `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(usize) -> bool) {
        let bits = self.0;
        for index in (0..Self::CAPACITY).filter(|&i| bits & (1 << i) != 0) {
            if !keep(index) {
                self.0 &= !(1 << index);
            }
        }
    }
    /// Indices in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let bits = self.0;
        (0..Self::CAPACITY).filter(move |&i| bits & (1 << i) != 0)
    }
}

/// A request to run one operator: which functional, with which arguments.
pub(crate) struct Request<'a> {
    pub family: &'static str,
    /// Functional axes and their canonical values, e.g. `[("dtype", "fp16"), ("head_dim", "64")]`.
    pub axes: &'a [(&'static str, &'static str)],
    pub args: Args<'a>,
}

impl Request<'_> {
    /// `attn_fwd{dtype=fp16, head_dim=64, causal=false}`, for messages (error paths only).
    pub fn describe(&self) -> String {
        let axes: Vec<String> = self.axes.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{}{{{}}}", self.family, axes.join(", "))
    }
}

/// Finds the functional of `request` in `archive`.
pub(crate) fn find_functional(loaded: &LoadedArchive, request: &Request) -> Result<usize> {
    loaded.archive.find(request.family, request.axes).ok_or_else(|| {
        Error::new(
            ErrorKind::KernelNotFound,
            format!("{} is not compiled into {}", request.describe(), loaded.archive.name()),
        )
    })
}

/// The kernels of `functional` whose compiled assumptions (divisibility hints, TMA rules) hold
/// for `args`.
pub(crate) fn fitting_kernels(functional: &Functional, args: Args) -> Result<KernelSet> {
    if functional.kernels.len() > KernelSet::CAPACITY {
        return Err(Error::new(
            ErrorKind::BadArchive,
            format!(
                "functional {} has {} kernels, more than the {} the dispatcher handles",
                functional.display_name(),
                functional.kernels.len(),
                KernelSet::CAPACITY
            ),
        ));
    }
    let mut fitting = KernelSet::default();
    'kernels: for (index, kernel) in functional.kernels.iter().enumerate() {
        for arg in &kernel.args {
            let value = lookup(args, &arg.name, kernel)?;
            if !value.fits(arg) {
                continue 'kernels;
            }
        }
        fitting.insert(index);
    }
    Ok(fitting)
}

/// Whether `kernel` can launch on `device`: its shared memory fits (a binary-compatible arch's
/// images, e.g. sm_80's on an sm_86, may need more than it has).
fn fits_device(kernel: &KernelMeta, device: &DeviceInfo) -> bool {
    kernel.shared <= device.max_shared
}

fn lookup(args: Args, name: &str, kernel: &KernelMeta) -> Result<ArgValue> {
    args.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).ok_or_else(|| {
        Error::new(
            ErrorKind::BadArchive,
            format!("kernel {} takes an argument '{name}' that this runtime does not provide", kernel.id),
        )
    })
}

/// The launch limits of CUDA and HIP: up to 2^31 − 1 blocks along x, 65535 along y and z.
const GRID_LIMITS: [u64; 3] = [(1 << 31) - 1, 65535, 65535];

/// `grid` as launch dimensions, or `TooLarge` naming `kernel` and the extent above its limit.
pub(crate) fn check_grid(kernel: &str, grid: [u64; 3]) -> Result<[u32; 3]> {
    for (axis, (&extent, &limit)) in ["x", "y", "z"].into_iter().zip(grid.iter().zip(&GRID_LIMITS)) {
        if extent > limit {
            bail!(TooLarge, "{kernel}: launch grid {grid:?}: {axis} = {extent} is above the limit of {limit} blocks");
        }
    }
    Ok(grid.map(|extent| extent as u32))
}

/// Blocks of `key` (BLOCK_M, BLOCK_N; `default` where the kernel's config does not say) covering
/// `len` rows.
pub(crate) fn blocks(len: u64, meta: &KernelMeta, key: &str, default: i64) -> u64 {
    len.div_ceil(config(meta, key, default).max(1) as u64)
}

/// Most kernel parameters of one launch (a descriptor argument of rank r takes 1 + 2r), with
/// Triton's two scratch pointers.
const MAX_PARAMS: usize = 192;
/// Most descriptor arguments of one kernel.
pub(crate) const MAX_DESCS: usize = 12;

/// Launches on one stream: holds the stream's context current while kernels are prepared and
/// launched. Operators that launch several kernels prepare all of them first, so an error
/// (a missing functional, a failed load) stops the call before anything is enqueued.
pub(crate) struct Launcher {
    context: StreamContext,
}

/// One encoded descriptor argument: the map and the kernel parameters that follow it.
#[derive(Clone, Copy)]
#[repr(C)]
struct EncodedDesc {
    map: TensorMap,
    shape: [u32; MAX_RANK],
    strides: [u64; MAX_RANK],
}

const EMPTY_DESC: EncodedDesc = EncodedDesc { map: EMPTY_TENSOR_MAP, shape: [0; MAX_RANK], strides: [0; MAX_RANK] };

/// A kernel chosen, loaded and given its launch geometry and encoded descriptors, ready to
/// enqueue. Fixed-size: preparing allocates nothing once the kernel is loaded.
pub(crate) struct Prepared<'a> {
    kernel: Arc<LoadedKernel>,
    args: Args<'a>,
    dims: LaunchDims,
    descs: [EncodedDesc; MAX_DESCS],
}

impl Launcher {
    pub fn new(stream: Stream) -> Result<Launcher> {
        Ok(Launcher { context: StreamContext::enter(stream)? })
    }

    /// The stream's device.
    pub fn device(&self) -> &DeviceInfo {
        &self.context.device
    }

    /// Whether the device's archive holds the functional of `request` (false too when the
    /// device has no archive), and whether one of its kernels fits the arguments (a kernel that
    /// takes TMA descriptors fits only where the driver can encode them). When it does, also
    /// whether the tuning database measured the portable backend faster than this (second)
    /// backend in `key`'s cell: the functional's kernels carry those cells (`portable_for`).
    pub fn serves(&self, request: &Request, key: TuningKey) -> Serves {
        let Ok(loaded) = images::archive_for_device(&self.context.device) else { return Serves::NotCompiled };
        let Some(index) = loaded.archive.find(request.family, request.axes) else { return Serves::NotCompiled };
        let functional = &loaded.archive.functionals()[index];
        let encodable = |kernel: usize| {
            self.context.tensor_maps_available() || functional.kernels[kernel].args.iter().all(|a| a.tensordesc.is_none())
        };
        match fitting_kernels(functional, request.args) {
            Ok(fitting) if fitting.iter().any(|k| encodable(k) && fits_device(&functional.kernels[k], &self.context.device)) => {
                let portable_faster = database_in_use()
                    && functional
                        .kernels
                        .iter()
                        .any(|k| k.portable_for.iter().any(|cell| cell.contains(key.mask, key.seqlen_q, key.seqlen_k)));
                Serves::Yes { portable_faster }
            }
            _ => Serves::NoKernelFits,
        }
    }

    /// Finds the functional of `request` in the device's archive, keeps the kernels whose
    /// compiled hints fit the arguments, lets `choose` pick one (given the set of fitting
    /// kernels, never empty), loads it once per context, encodes its TMA descriptors and lays
    /// out its launch with the grid that `grid` computes from the kernel's config, checked by
    /// [`check_grid`]: operators prepare all their kernels before the first launch, so a grid
    /// over the limits stops the call before anything is enqueued.
    pub fn prepare<'a>(
        &self,
        request: &Request<'a>,
        choose: impl FnOnce(&Functional, KernelSet, &DeviceInfo) -> usize,
        grid: impl FnOnce(&KernelMeta) -> Result<[u64; 3]>,
    ) -> Result<Prepared<'a>> {
        let loaded = images::archive_for_device(&self.context.device)?;
        let functional_index = find_functional(&loaded, request)?;
        let functional = &loaded.archive.functionals()[functional_index];
        let mut fitting = fitting_kernels(functional, request.args)?;
        if fitting.is_empty() {
            return Err(Error::new(
                ErrorKind::KernelNotFound,
                format!(
                    "no compiled variant of {} accepts these pointer alignments and strides",
                    request.describe()
                ),
            ));
        }
        fitting.retain(|k| fits_device(&functional.kernels[k], &self.context.device));
        if fitting.is_empty() {
            return Err(Error::new(
                ErrorKind::KernelNotFound,
                format!(
                    "every compiled kernel of {} needs more shared memory than device {} ({}) has: {} bytes",
                    request.describe(),
                    self.context.device.ordinal,
                    self.context.device.arch,
                    self.context.device.max_shared
                ),
            ));
        }
        let kernel_index = match forced_in(functional, fitting) {
            Some(forced) => forced,
            None => choose(functional, fitting, &self.context.device),
        };
        let kernel = load(&self.context, &loaded, functional_index, kernel_index)?;
        let meta = &kernel.meta;
        let plan = kernel.plan.get_or_init(|| plan_slots(meta, request.args)).as_ref().map_err(Clone::clone)?;
        let mut descs = [EMPTY_DESC; MAX_DESCS];
        for (slot, arg) in plan.slots.iter().zip(&meta.args) {
            // The plan was made from the first call's list; operators always build it in the
            // same order, which this re-checks cheaply.
            let (name, value) = request.args.get(slot.value()).copied().unwrap_or(("", ArgValue::Ptr(0)));
            if name != arg.name {
                return Err(Error::new(
                    ErrorKind::Internal,
                    format!("kernel {}: argument '{}' moved in the runtime's list (found '{name}')", meta.id, arg.name),
                ));
            }
            if let Slot::Desc { desc, .. } = *slot {
                let (ArgValue::Tensor(tensor), Some(desc_meta)) = (value, &arg.tensordesc) else {
                    return Err(Error::new(ErrorKind::Internal, format!("kernel {}: '{}' planned as a descriptor", meta.id, arg.name)));
                };
                let encode = tma::encode_params(&tensor, desc_meta).map_err(|problem| {
                    Error::new(ErrorKind::UnsupportedByBackend, format!("kernel {}, argument {}: {problem}", meta.id, arg.name))
                })?;
                let out = &mut descs[desc];
                self.context.encode_tensor_map(&mut out.map, &encode, || format!("{} {}", meta.id, arg.name))?;
                out.shape = encode.shape;
                out.strides = encode.strides;
            }
        }
        let grid = check_grid(request.family, grid(meta)?)?;
        let dims = LaunchDims { grid, threads: kernel.threads, shared: meta.shared };
        Ok(Prepared { kernel, args: request.args, dims, descs })
    }

    /// Enqueues a prepared kernel on the stream.
    pub fn launch(&self, prepared: &Prepared) -> Result<()> {
        let plan = match prepared.kernel.plan.get() {
            Some(Ok(plan)) => plan,
            _ => return Err(Error::new(ErrorKind::Internal, "launch of a kernel that was not prepared")),
        };
        // Scalars by value in 64-bit slots, indexed by parameter position; descriptors point
        // into the prepared storage. Triton's two trailing scratch pointers (global, profile)
        // stay 0: `load` refused kernels that need scratch memory.
        let mut values = [0u64; MAX_PARAMS];
        let mut position = 0;
        for slot in &plan.slots {
            match *slot {
                Slot::Scalar { value, widen } => {
                    values[position] = prepared.args[value].1.to_slot(widen);
                    position += 1;
                }
                Slot::Desc { rank, .. } => position += 1 + 2 * rank,
            }
        }
        let count = plan.params;
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_PARAMS];
        let base = values.as_mut_ptr();
        let mut position = 0;
        for slot in &plan.slots {
            match *slot {
                Slot::Scalar { .. } => {
                    // SAFETY: position < count ≤ MAX_PARAMS (checked by plan_slots).
                    params[position] = unsafe { base.add(position) } as *mut c_void;
                    position += 1;
                }
                Slot::Desc { desc, rank, .. } => {
                    let d = &prepared.descs[desc];
                    params[position] = &d.map as *const TensorMap as *mut c_void;
                    for i in 0..rank {
                        params[position + 1 + i] = &d.shape[i] as *const u32 as *mut c_void;
                        params[position + 1 + rank + i] = &d.strides[i] as *const u64 as *mut c_void;
                    }
                    position += 1 + 2 * rank;
                }
            }
        }
        for (scratch, param) in params.iter_mut().enumerate().take(count).skip(position) {
            // SAFETY: as above.
            *param = unsafe { base.add(scratch) } as *mut c_void;
        }
        self.context.launch(&prepared.kernel.function, prepared.dims, &mut params[..count], &prepared.kernel.meta.id)
    }
}

/// What [`Launcher::serves`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Serves {
    Yes { portable_faster: bool },
    NotCompiled,
    NoKernelFits,
}

/// The tuner's override (python/tune.py): while set, every functional that holds a fitting
/// kernel with this id launches it instead of dispatch's choice; other functionals (the other
/// kernels of an operator) choose as usual. The flag keeps the steady-state path to one atomic
/// load when no override is set.
static FORCED_ACTIVE: AtomicBool = AtomicBool::new(false);
static FORCED_KERNEL: Mutex<String> = Mutex::new(String::new());
/// Kernels prepared under the override (the tuner checks each candidate really ran).
static FORCED_PREPARED: AtomicU64 = AtomicU64::new(0);

/// Sets (or with None clears) the kernel id the tuner forces; see [`FORCED_ACTIVE`]. Meant for
/// timing candidates, not for production calls: it is process-wide.
pub fn force_kernel(id: Option<&str>) {
    let mut forced = lock(&FORCED_KERNEL);
    forced.clear();
    forced.push_str(id.unwrap_or(""));
    FORCED_ACTIVE.store(id.is_some(), Ordering::Release);
}

/// How many kernels the override has put in place of dispatch's choice so far (process-wide):
/// the tuner reads it around a candidate's call to know the candidate itself ran.
pub fn forced_count() -> u64 {
    FORCED_PREPARED.load(Ordering::Acquire)
}

/// The kernel id the tuner forces, if any.
pub fn forced_kernel() -> Option<String> {
    if !FORCED_ACTIVE.load(Ordering::Acquire) {
        return None;
    }
    Some(lock(&FORCED_KERNEL).clone())
}

/// Set while dispatch ignores the tuning database (see [`use_database`]).
static DATABASE_OFF: AtomicBool = AtomicBool::new(false);

/// Whether dispatch follows the tuning database compiled into the archive (`true`, the default)
/// or only the documented heuristic, as a build without a database would (`false`): the
/// benchmark times both in one process, and a user can rule the database out when chasing a
/// difference. Process-wide; takes effect at the next call.
pub fn use_database(on: bool) {
    DATABASE_OFF.store(!on, Ordering::Release);
}

/// Whether dispatch follows the tuning database (see [`use_database`]).
pub fn database_in_use() -> bool {
    !DATABASE_OFF.load(Ordering::Acquire)
}

/// The forced kernel's index when it belongs to `functional` and fits the call.
fn forced_in(functional: &Functional, fitting: KernelSet) -> Option<usize> {
    if !FORCED_ACTIVE.load(Ordering::Acquire) {
        return None;
    }
    let forced = lock(&FORCED_KERNEL);
    let index = fitting.iter().find(|&i| functional.kernels[i].id == *forced);
    if index.is_some() {
        FORCED_PREPARED.fetch_add(1, Ordering::AcqRel);
    }
    index
}

#[cfg(test)]
pub(crate) fn forced_in_for_tests(functional: &Functional, fitting: KernelSet) -> Option<usize> {
    forced_in(functional, fitting)
}

/// A call's cell in the tuning grid (python/tuning.py): its mask kind and sequence lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TuningKey {
    pub mask: MaskKind,
    pub seqlen_q: u64,
    pub seqlen_k: u64,
}

impl TuningKey {
    /// The kernel of `pool` that the tuning database picked for this call (kernels carry the
    /// cells they won: `tuned_for`), if any; the operators' heuristics decide otherwise.
    pub fn tuned(&self, functional: &Functional, pool: &KernelSet) -> Option<usize> {
        if !database_in_use() {
            return None;
        }
        pool.iter().find(|&i| {
            functional.kernels[i].tuned_for.iter().any(|cell| cell.contains(self.mask, self.seqlen_q, self.seqlen_k))
        })
    }
}

/// The kernels of `pool` the heuristic chooses among: all but those compiled only for the tuning
/// database (`tuned_only`), so an untuned cell gets exactly the heuristic's pick.
pub(crate) fn heuristic_pool(functional: &Functional, pool: KernelSet) -> KernelSet {
    let mut own = pool;
    own.retain(|i| !functional.kernels[i].tuned_only);
    if own.is_empty() { pool } else { own }
}

/// Chooses among fitting kernels by variant: the `aligned` ones when any fits (they carry the
/// divisibility hints), else the rest. Operators then pick a config among these.
pub(crate) fn preferred_variant(functional: &Functional, fitting: KernelSet) -> KernelSet {
    let mut aligned = KernelSet::default();
    for i in fitting.iter().filter(|&i| functional.kernels[i].variant == "aligned") {
        aligned.insert(i);
    }
    if aligned.is_empty() { fitting } else { aligned }
}

/// The first kernel of the preferred variant (families with one config per variant).
pub(crate) fn first_preferred(functional: &Functional, fitting: KernelSet, _device: &DeviceInfo) -> usize {
    preferred_variant(functional, fitting).first().unwrap_or(0)
}

/// A config value of a kernel (`BLOCK_M`, ...), or `default` if the kernel has none.
pub(crate) fn config(meta: &KernelMeta, key: &str, default: i64) -> i64 {
    meta.config.get(key).copied().unwrap_or(default)
}

/// Where one kernel argument's value comes from (an index into the request's list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// One parameter by value.
    Scalar { value: usize, widen: bool },
    /// A TMA descriptor: the map, then rank sizes and rank strides (1 + 2·rank parameters);
    /// `desc` indexes the prepared storage.
    Desc { value: usize, desc: usize, rank: usize },
}

impl Slot {
    fn value(&self) -> usize {
        match *self {
            Slot::Scalar { value, .. } | Slot::Desc { value, .. } => value,
        }
    }
}

/// A kernel's launch layout: one slot per metadata argument (ABI order) and the total number of
/// driver parameters, scratch pointers included.
#[derive(Debug)]
pub(crate) struct Plan {
    slots: Vec<Slot>,
    params: usize,
}

/// For each argument of the kernel (ABI order), the index of its value in the request's
/// argument list, with the types checked (descriptors: a tensor of the descriptor's rank and
/// element size). Computed once per loaded kernel: an operator always lists its arguments in
/// the same order.
pub(crate) fn plan_slots(meta: &KernelMeta, args: Args) -> Result<Plan> {
    let bad = |message: String| Error::new(ErrorKind::BadArchive, message);
    let mut slots = Vec::with_capacity(meta.args.len());
    let mut params = 2; // the scratch pointers
    let mut descs = 0;
    for arg in &meta.args {
        let value = args
            .iter()
            .position(|(n, _)| *n == arg.name)
            .ok_or_else(|| bad(format!("kernel {} takes unknown argument '{}'", meta.id, arg.name)))?;
        let given = args[value].1;
        let Some(widen) = given.fits_type(&arg.ty) else {
            return Err(bad(format!("kernel {} declares '{}' as {}, but the runtime passes {given:?}", meta.id, arg.name, arg.ty)));
        };
        match (&arg.tensordesc, given) {
            (Some(desc), ArgValue::Tensor(tensor)) => {
                if desc.rank() != tensor.rank || desc.elem_size as u64 != tensor.dtype.size_bytes() {
                    return Err(bad(format!(
                        "kernel {} declares '{}' as a rank-{} descriptor of {}-byte elements, but the runtime passes a rank-{} {} tensor",
                        meta.id,
                        arg.name,
                        desc.rank(),
                        desc.elem_size,
                        tensor.rank,
                        tensor.dtype.triton_name()
                    )));
                }
                if descs == MAX_DESCS {
                    return Err(bad(format!("kernel {} takes more than {MAX_DESCS} descriptor arguments", meta.id)));
                }
                slots.push(Slot::Desc { value, desc: descs, rank: tensor.rank });
                descs += 1;
                params += 1 + 2 * tensor.rank;
            }
            (None, ArgValue::Tensor(_)) | (Some(_), _) => {
                return Err(bad(format!(
                    "kernel {}: '{}' ({}) and the runtime's {given:?} disagree on being a TMA descriptor",
                    meta.id, arg.name, arg.ty
                )));
            }
            (None, _) => {
                slots.push(Slot::Scalar { value, widen });
                params += 1;
            }
        }
    }
    if params > MAX_PARAMS {
        return Err(bad(format!("kernel {} takes {params} launch parameters, more than {MAX_PARAMS}", meta.id)));
    }
    Ok(Plan { slots, params })
}

/// A kernel loaded into one context, with its argument layout once known.
struct LoadedKernel {
    function: LoadedFunction,
    plan: OnceLock<Result<Plan>>,
    /// Copied once at load, so a launch reads it without cloning.
    meta: KernelMeta,
    /// Threads per block (`num_warps` × warp size), checked at load.
    threads: u32,
}

/// Where a loaded kernel lives and which one it is: the driver's module scope (the CUDA context
/// or the HIP device), the archive (its address stands for its arch: archives are cached for the
/// life of the process), the functional and the kernel. Building one allocates nothing.
type KernelKey = (ModuleScope, usize, usize, usize);

/// One kernel's slot in a [`LoadCache`]: empty until its first load succeeds.
type CacheSlot<V> = Arc<Mutex<Option<Arc<V>>>>;

/// Kernels loaded once per key and shared by every later call. The map's lock is held only to
/// find or insert a key's slot; the load itself (decompressing the functional's images, the
/// driver's module load) runs under that slot's own lock. So a first load makes only callers
/// of the same kernel wait (they need its result anyway, and it is loaded once), callers of
/// every other kernel go on, and a hit takes two short, uncontended locks and allocates
/// nothing. No lock is held while taking another (the map's is released before a slot's), so
/// there is no lock order to get wrong. A failed load leaves its slot empty: the next caller
/// tries again.
struct LoadCache<V> {
    slots: Mutex<HashMap<KernelKey, CacheSlot<V>>>,
}

impl<V> LoadCache<V> {
    fn new() -> LoadCache<V> {
        LoadCache { slots: Mutex::new(HashMap::new()) }
    }

    /// The value of `key`, loaded by `load` on first use.
    fn get_or_load(&self, key: KernelKey, load: impl FnOnce() -> Result<V>) -> Result<Arc<V>> {
        let slot = lock(&self.slots).entry(key).or_default().clone();
        let mut slot = lock(&slot);
        if let Some(found) = &*slot {
            return Ok(found.clone());
        }
        let value = Arc::new(load()?);
        *slot = Some(value.clone());
        Ok(value)
    }
}

/// Loads a kernel onto the stream's device once (CUDA: per context); later calls find it in the
/// cache.
fn load(
    context: &StreamContext,
    loaded: &LoadedArchive,
    functional: usize,
    kernel: usize,
) -> Result<Arc<LoadedKernel>> {
    static CACHE: OnceLock<LoadCache<LoadedKernel>> = OnceLock::new();
    let key = (context.cache_key(), loaded as *const LoadedArchive as usize, functional, kernel);
    CACHE.get_or_init(LoadCache::new).get_or_load(key, || load_kernel(context, loaded, functional, kernel))
}

/// Checks a kernel's metadata against the device and the launch this runtime does, then loads its
/// image through the stream's driver.
fn load_kernel(context: &StreamContext, loaded: &LoadedArchive, functional: usize, kernel: usize) -> Result<LoadedKernel> {
    let meta = &loaded.archive.functionals()[functional].kernels[kernel];
    let threads = launch_threads(meta, &context.device)?;
    let images = loaded.images(functional)?;
    let function = context.load_function(&images[kernel], &meta.symbol, meta.shared, &meta.id)?;
    count_load(context.device.runtime, context.device.ordinal);
    Ok(LoadedKernel { function, plan: OnceLock::new(), meta: meta.clone(), threads })
}

/// Kernel loads per (runtime, device ordinal) since the process started: the module cache's misses.
static DEVICE_LOADS: Mutex<Vec<((Runtime, i32), u64)>> = Mutex::new(Vec::new());

fn count_load(runtime: Runtime, ordinal: i32) {
    let mut loads = lock(&DEVICE_LOADS);
    match loads.iter_mut().find(|(device, _)| *device == (runtime, ordinal)) {
        Some((_, n)) => *n += 1,
        None => loads.push(((runtime, ordinal), 1)),
    }
}

/// How many kernels this process has loaded onto device `ordinal` of `runtime` so far. The module
/// cache loads each kernel once per device (CUDA: per context) whatever the number of threads and
/// streams that call it, so after a warm-up this stops moving; a multi-device test reads it to
/// see one load per kernel per device.
pub fn kernels_loaded(runtime: Runtime, ordinal: i32) -> u64 {
    lock(&DEVICE_LOADS).iter().find(|(device, _)| *device == (runtime, ordinal)).map_or(0, |(_, n)| *n)
}

/// Whether the runtime can launch the kernel `meta` describes on `device`, and with how many
/// threads per block.
fn launch_threads(meta: &KernelMeta, device: &DeviceInfo) -> Result<u32> {
    if meta.global_scratch_size > 0 || meta.profile_scratch_size > 0 {
        return Err(Error::new(
            ErrorKind::KernelNotFound,
            format!(
                "kernel {} needs scratch memory (global {} B, profile {} B per program), which this runtime does not provide yet",
                meta.id, meta.global_scratch_size, meta.profile_scratch_size
            ),
        ));
    }
    if meta.warp_size != device.warp_size {
        return Err(Error::new(
            ErrorKind::UnsupportedGpu,
            format!(
                "kernel {} is compiled for {}-thread warps; device {} ({}) runs {}-thread warps",
                meta.id, meta.warp_size, device.ordinal, device.target_id, device.warp_size
            ),
        ));
    }
    if device.runtime == Runtime::Hip {
        // HIP packs the kernelParams by the code object's kernarg metadata; a kernel whose
        // argument types the plan cannot size is refused (CUDA's TMA descriptors have none).
        kernarg_layout(meta)?;
    }
    // Metadata is checked for layout when the archive is read, not for sense: the product must
    // fit a launch's block, and the launch has no cluster dims, so only single-CTA kernels run.
    let bad = |message: String| Error::new(ErrorKind::BadArchive, message);
    if meta.num_ctas != 1 {
        return Err(bad(format!(
            "kernel {} is compiled for num_ctas = {} (thread block clusters); this runtime launches single-CTA kernels only",
            meta.id, meta.num_ctas
        )));
    }
    match meta.num_warps.checked_mul(meta.warp_size) {
        Some(threads) if threads > 0 && threads <= MAX_BLOCK_THREADS => Ok(threads),
        _ => Err(bad(format!(
            "kernel {} takes {} warps of {} threads, not a block of 1 to {MAX_BLOCK_THREADS} threads",
            meta.id, meta.num_warps, meta.warp_size
        ))),
    }
}

/// The most threads one block may have on every GPU this runtime launches on (NVIDIA and AMD).
const MAX_BLOCK_THREADS: u32 = 1024;

/// One explicit kernel argument in the kernarg segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernargSlot {
    /// The argument's name, or `global_scratch` / `profile_scratch` for Triton's two trailing
    /// scratch pointers.
    pub name: String,
    /// Byte offset in the kernarg segment (aligned to the size).
    pub offset: u32,
    /// Bytes the driver copies from the parameter's pointer.
    pub size: u32,
    /// A pointer to global memory (`*fp16`, ..., the scratch pointers) rather than a value.
    pub pointer: bool,
}

/// The kernarg layout the runtime's argument plan implies for a kernel: each runtime argument of
/// the metadata in order, sized by its Triton type (pointers, i64, u64 and fp64 8 bytes; i32,
/// u32 and fp32 4; 16-bit scalars 2; i1 and 8-bit scalars 1), each at the next offset aligned to
/// its size, then Triton's two 8-byte scratch pointers; `size` is the end of the last one. The
/// launch passes one parameter pointer per slot in this order. A type without a known size (a
/// TMA descriptor, which exists on NVIDIA only) has no layout: such a kernel is not loaded on AMD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernargLayout {
    /// One slot per argument, then the two scratch pointers.
    pub slots: Vec<KernargSlot>,
    /// Bytes up to the end of the last slot.
    pub size: u32,
}

/// See [`KernargLayout`].
pub fn kernarg_layout(meta: &KernelMeta) -> Result<KernargLayout> {
    // Bounds the offsets below (at most 8 bytes per argument) far inside u32.
    if meta.args.len() > MAX_PARAMS {
        return Err(Error::new(
            ErrorKind::BadArchive,
            format!("kernel {} takes {} arguments, more than the {MAX_PARAMS} a launch passes", meta.id, meta.args.len()),
        ));
    }
    let mut slots = Vec::with_capacity(meta.args.len() + 2);
    let mut offset = 0u32;
    let mut place = |name: &str, size: u32, pointer: bool| {
        offset = offset.div_ceil(size) * size;
        slots.push(KernargSlot { name: name.to_string(), offset, size, pointer });
        offset += size;
    };
    for arg in &meta.args {
        let (size, pointer) = match arg.ty.as_str() {
            ty if ty.starts_with('*') => (8, true),
            "i64" | "u64" | "fp64" => (8, false),
            "i32" | "u32" | "fp32" => (4, false),
            "i16" | "u16" | "fp16" | "bf16" => (2, false),
            "i1" | "i8" | "u8" => (1, false),
            other => {
                return Err(Error::new(
                    ErrorKind::BadArchive,
                    format!("kernel {}: argument '{}' has type {other}, which has no kernarg layout", meta.id, arg.name),
                ));
            }
        };
        place(&arg.name, size, pointer);
    }
    place("global_scratch", 8, true);
    place("profile_scratch", 8, true);
    Ok(KernargLayout { slots, size: offset })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_loads_are_counted_per_device() {
        // Ordinals no machine has: the counter starts at 0 and counts each device apart.
        let (a, b) = (Runtime::Hip, 1_000_001);
        assert_eq!(kernels_loaded(a, b), 0);
        count_load(a, b);
        count_load(a, b);
        count_load(a, b + 1);
        assert_eq!((kernels_loaded(a, b), kernels_loaded(a, b + 1), kernels_loaded(Runtime::Cuda, b)), (2, 1, 0));
    }
    use crate::archive::TensorDescMeta;
    use crate::tensor::{DType, TensorView};

    fn arg(name: &str, ty: &str, divisibility: u32, tensordesc: Option<TensorDescMeta>) -> KernelArg {
        KernelArg { name: name.into(), ty: ty.into(), divisibility, tensordesc }
    }

    fn desc(block_size: &[u32], elem_size: u32) -> Option<TensorDescMeta> {
        Some(TensorDescMeta { block_size: block_size.to_vec(), swizzle: 3, elem_type: 10, elem_size, fp4_padded: false })
    }

    fn meta(args: Vec<KernelArg>) -> KernelMeta {
        KernelMeta::for_tests("k", args, 12)
    }

    fn q() -> ArgValue {
        ArgValue::Tensor(TensorArg::from_view(&TensorView::contiguous(0x10000, [2, 4, 100, 64], DType::BF16)))
    }

    #[test]
    fn descriptors_take_one_plus_two_rank_parameters() {
        let m = meta(vec![
            arg("desc_q", "tensordesc<bf16[1, 1, 64, 64],...>", 1, desc(&[1, 1, 64, 64], 2)),
            arg("sm_scale", "fp32", 1, None),
            arg("N", "i64", 1, None),
        ]);
        let args = [("N", ArgValue::I32(-3)), ("desc_q", q()), ("sm_scale", ArgValue::F32(0.5))];
        let plan = plan_slots(&m, &args).unwrap();
        assert_eq!(plan.params, 9 + 1 + 1 + 2);
        assert_eq!(
            plan.slots,
            [Slot::Desc { value: 1, desc: 0, rank: 4 }, Slot::Scalar { value: 2, widen: false }, Slot::Scalar { value: 0, widen: true }]
        );
        // An i32 value widened to an i64 argument keeps its sign.
        assert_eq!(ArgValue::I32(-3).to_slot(true), u64::MAX - 2);
        assert_eq!(ArgValue::I32(-3).to_slot(false), 0xffff_fffd);
    }

    #[test]
    fn descriptor_mismatches_are_refused() {
        let bf16_q = [("desc_q", q())];
        let kind = |m: KernelMeta, args: &[(&'static str, ArgValue)]| plan_slots(&m, args).unwrap_err();
        let e = kind(meta(vec![arg("desc_q", "tensordesc<...>", 1, desc(&[64, 64], 2))]), &bf16_q);
        assert!(e.message().contains("rank-2") && e.message().contains("rank-4"), "{e}");
        let e = kind(meta(vec![arg("desc_q", "tensordesc<...>", 1, desc(&[1, 1, 64, 64], 4))]), &bf16_q);
        assert!(e.message().contains("4-byte"), "{e}");
        let e = kind(meta(vec![arg("desc_q", "*bf16", 16, None)]), &bf16_q);
        assert_eq!(e.kind(), ErrorKind::BadArchive, "{e}");
        let e = kind(meta(vec![arg("desc_q", "tensordesc<...>", 1, desc(&[1, 1, 64, 64], 2))]), &[("desc_q", ArgValue::Ptr(0x1000))]);
        assert_eq!(e.kind(), ErrorKind::BadArchive, "{e}");
        let e = kind(meta(vec![arg("N", "i32", 1, None)]), &[("N", ArgValue::I64(1))]);
        assert!(e.message().contains("declares 'N' as i32"), "{e}");
        let many: Vec<KernelArg> = (0..13)
            .map(|i| arg(["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m"][i], "tensordesc<...>", 1, desc(&[64, 64], 2)))
            .collect();
        let t = ArgValue::Tensor(TensorArg::matrix(0x1000, 64, 64, DType::F16));
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m"];
        let args: Vec<(&'static str, ArgValue)> = names.iter().map(|n| (*n, t)).collect();
        assert!(kind(meta(many), &args).message().contains("more than 12 descriptor"));
    }

    #[test]
    fn descriptors_fit_by_the_tma_rules() {
        let a = arg("desc_q", "tensordesc<...>", 1, desc(&[1, 1, 64, 64], 2));
        assert!(q().fits(&a));
        let ArgValue::Tensor(mut t) = q() else { unreachable!() };
        t.ptr += 2;
        assert!(!ArgValue::Tensor(t).fits(&a), "TMA needs 16-byte aligned bases");
        assert!(!q().fits(&arg("Q", "*bf16", 16, None)), "a tensor only fits a descriptor argument");
        assert!(ArgValue::Ptr(0x1000).fits(&arg("Q", "*bf16", 16, None)));
        assert!(!ArgValue::Ptr(0x1008).fits(&arg("Q", "*bf16", 16, None)));
    }

    #[test]
    fn kernarg_layout_aligns_each_argument() {
        let m = meta(vec![
            arg("Q", "*fp16", 16, None),
            arg("sm_scale", "fp32", 1, None),
            arg("stride_qz", "i64", 1, None),
            arg("N", "i32", 1, None),
        ]);
        let layout = kernarg_layout(&m).unwrap();
        let placed: Vec<(&str, u32, u32, bool)> =
            layout.slots.iter().map(|s| (s.name.as_str(), s.offset, s.size, s.pointer)).collect();
        assert_eq!(
            placed,
            [
                ("Q", 0, 8, true),
                ("sm_scale", 8, 4, false),
                ("stride_qz", 16, 8, false),
                ("N", 24, 4, false),
                ("global_scratch", 32, 8, true),
                ("profile_scratch", 40, 8, true)
            ]
        );
        assert_eq!(layout.size, 48);
        let e = kernarg_layout(&meta(vec![arg("desc_q", "tensordesc<bf16[64, 64]>", 1, desc(&[64, 64], 2))])).unwrap_err();
        assert!(e.message().contains("desc_q") && e.message().contains("no kernarg layout"), "{e}");
        let many = (0..=MAX_PARAMS).map(|_| arg("x", "i64", 1, None)).collect();
        assert_eq!(kernarg_layout(&meta(many)).unwrap_err().kind(), ErrorKind::BadArchive);
    }

    fn key(kernel: usize) -> KernelKey {
        (ModuleScope::CudaContextId(1), 0x2000, 3, kernel)
    }

    /// While kernel A's first load is under way (slow: decompression and the driver's module
    /// load), kernel B loads and is found again without waiting for it.
    #[test]
    fn a_slow_first_load_blocks_only_callers_of_that_kernel() {
        use std::sync::mpsc::channel;
        use std::time::Duration;
        let cache = LoadCache::<u32>::new();
        let (started, a_started) = channel();
        let (release, a_released) = channel::<()>();
        let (b_done, b_result) = channel();
        let b_in_time = std::thread::scope(|s| {
            let cache = &cache;
            s.spawn(move || {
                cache.get_or_load(key(0), || {
                    started.send(()).unwrap();
                    a_released.recv().unwrap();
                    Ok(1)
                })
            });
            a_started.recv().unwrap();
            s.spawn(move || {
                let loaded = cache.get_or_load(key(1), || Ok(2)).map(|v| *v);
                let found = cache.get_or_load(key(1), || Ok(99)).map(|v| *v);
                b_done.send((loaded, found)).unwrap();
            });
            let b = b_result.recv_timeout(Duration::from_secs(10));
            release.send(()).unwrap();
            b
        });
        let (loaded, found) = b_in_time.expect("kernel B waited for kernel A's load");
        assert_eq!((loaded.unwrap(), found.unwrap()), (2, 2));
        assert_eq!(*cache.get_or_load(key(0), || Ok(99)).unwrap(), 1);
    }

    #[test]
    fn concurrent_first_loads_of_one_kernel_load_it_once() {
        use std::sync::Barrier;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let cache = LoadCache::<u32>::new();
        let loads = AtomicUsize::new(0);
        let start = Barrier::new(32);
        let results: Vec<Arc<u32>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..32)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        cache
                            .get_or_load(key(0), || {
                                loads.fetch_add(1, Ordering::SeqCst);
                                std::thread::sleep(std::time::Duration::from_millis(20));
                                Ok(7)
                            })
                            .unwrap()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert_eq!(loads.load(Ordering::SeqCst), 1);
        assert!(results.iter().all(|r| Arc::ptr_eq(r, &results[0])));
    }

    /// The same kernel in two module scopes (two CUDA contexts) is two loads.
    #[test]
    fn each_module_scope_loads_its_own_kernels() {
        let cache = LoadCache::<u32>::new();
        let (mut a, mut b) = (key(0), key(0));
        a.0 = ModuleScope::CudaContextId(1);
        b.0 = ModuleScope::CudaContextId(2);
        assert_eq!(*cache.get_or_load(a, || Ok(1)).unwrap(), 1);
        assert_eq!(*cache.get_or_load(b, || Ok(2)).unwrap(), 2);
        assert_eq!(*cache.get_or_load(a, || Ok(3)).unwrap(), 1);
    }

    /// A failed load is not remembered: the next call tries again (the environment may have
    /// been fixed, e.g. shared memory freed by another context).
    #[test]
    fn a_failed_load_is_tried_again() {
        let cache = LoadCache::<u32>::new();
        let e = cache.get_or_load(key(0), || Err(Error::new(ErrorKind::Driver, "cuModuleLoadData failed"))).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Driver);
        assert_eq!(*cache.get_or_load(key(0), || Ok(5)).unwrap(), 5);
    }

    #[test]
    fn a_cache_hit_allocates_nothing() {
        let cache = LoadCache::<u32>::new();
        cache.get_or_load(key(0), || Ok(1)).unwrap();
        let before = crate::alloc_count::allocations();
        for _ in 0..100 {
            cache.get_or_load(key(0), || Ok(2)).unwrap();
        }
        assert_eq!(crate::alloc_count::allocations(), before);
    }

    fn device(runtime: Runtime, warp_size: u32) -> DeviceInfo {
        DeviceInfo {
            runtime,
            ordinal: 0,
            arch: "sm_90".into(),
            target_id: "sm_90".into(),
            multiprocessors: 132,
            max_shared: 232_448,
            warp_size,
        }
    }

    /// The launch geometry comes from archive metadata, which is checked for layout, not sense:
    /// a product that does not fit, a block above the hardware's limit or a cluster launch this
    /// runtime does not make is refused before anything is loaded.
    #[test]
    fn launch_metadata_is_checked() {
        let cuda = device(Runtime::Cuda, 32);
        assert_eq!(launch_threads(&meta(vec![]), &cuda).unwrap(), 12 * 32);
        for num_warps in [1 << 31, u32::MAX, 33, 0] {
            let e = launch_threads(&KernelMeta::for_tests("k", vec![], num_warps), &cuda).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::BadArchive, "{num_warps} warps: {e}");
            assert!(e.message().contains("warps"), "{e}");
        }
        assert_eq!(launch_threads(&KernelMeta::for_tests("k", vec![], 32), &cuda).unwrap(), 1024);
        for num_ctas in [0, 2, u32::MAX] {
            let mut m = meta(vec![]);
            m.num_ctas = num_ctas;
            let e = launch_threads(&m, &cuda).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::BadArchive, "num_ctas {num_ctas}: {e}");
            assert!(e.message().contains("num_ctas"), "{e}");
        }
        let mut m = meta(vec![]);
        m.warp_size = 64;
        assert_eq!(launch_threads(&m, &cuda).unwrap_err().kind(), ErrorKind::UnsupportedGpu);
        let mut m = meta(vec![]);
        m.global_scratch_size = 16;
        assert_eq!(launch_threads(&m, &cuda).unwrap_err().kind(), ErrorKind::KernelNotFound);
    }

    #[test]
    fn fixed_capacity_lists() {
        let mut list = ArgList::new();
        for _ in 0..MAX_NAMED_ARGS {
            list.push("x", ArgValue::I32(1));
        }
        assert_eq!(list.args().unwrap().len(), MAX_NAMED_ARGS);
        list.push("overflow", ArgValue::I32(1));
        assert_eq!(list.args().unwrap_err().kind(), ErrorKind::Internal);
        let mut axes = Axes::of(&[("dtype", "fp16"), ("head_dim", "64")]);
        assert_eq!(axes.as_slice().unwrap(), &[("dtype", "fp16"), ("head_dim", "64")]);
        for _ in 0..MAX_AXES {
            axes.push("x", "y");
        }
        assert_eq!(axes.as_slice().unwrap_err().kind(), ErrorKind::Internal);
        let mut set = KernelSet::default();
        assert_eq!(set.first(), None);
        for i in [127, 3, 64] {
            set.insert(i);
        }
        assert_eq!(set.iter().collect::<Vec<_>>(), [3, 64, 127]);
        assert_eq!(set.first(), Some(3));
    }

    #[test]
    fn kernels_needing_more_shared_memory_than_the_device_are_dropped() {
        // sm_80 images on an sm_86 (99 KiB per block): a 160 KiB config cannot launch there.
        let mut ampere = device(Runtime::Cuda, 32);
        ampere.max_shared = 101_376;
        let mut big = meta(vec![]);
        big.shared = 163_840;
        let mut small = meta(vec![]);
        small.shared = 98_304;
        assert!(!fits_device(&big, &ampere) && fits_device(&small, &ampere));
        let mut set = KernelSet::default();
        [0, 3, 5, 127].into_iter().for_each(|i| set.insert(i));
        set.retain(|i| i != 3 && i != 127);
        assert_eq!(set.iter().collect::<Vec<_>>(), [0, 5]);
    }

    #[test]
    fn grids_are_checked_against_the_launch_limits() {
        assert_eq!(check_grid("k", [(1 << 31) - 1, 65535, 65535]), Ok([(1 << 31) - 1, 65535, 65535]));
        for (grid, axis) in [([1 << 31, 1, 1], "x"), ([1, 65536, 1], "y"), ([1, 1, 65536], "z"), ([1, 1, u64::MAX], "z")] {
            let err = check_grid("attn_bwd_dq", grid).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::TooLarge);
            let message = err.message();
            assert!(message.starts_with("attn_bwd_dq: launch grid") && message.contains(&format!("{axis} = ")), "{err}");
        }
    }
}
