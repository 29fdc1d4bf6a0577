//! The Gluon (sm_90) backend of `attn_fwd` and `attn_bwd`: which calls it can serve (pure
//! checks, unit-tested without a GPU), the backward's workspace, and its launches. The kernel
//! contract is `python/kernels/flash_gluon/ABI.md`; the rule `Backend::Auto` follows is in the
//! module docs of `flash`.
use std::fmt;

use super::{AttnShape, Backend, BwdParams, FwdParams, MaskArgs, Workspace, dropout_args, seq_mask_args, strides3, strides4, varlen_args};
use crate::archive::KernelMeta;
use crate::dispatch::{ArgList, ArgValue, Axes, Launcher, Request, Serves, TuningKey, blocks, bool_axis, config, first_preferred};
use crate::driver::DeviceInfo;
use super::bwd::{dq_grid, int32_args, kernel_blocks};
use crate::error::{Error, ErrorKind, Result, bail, checked_product, checked_sum};
use crate::tensor::{DType, TensorView};
use crate::tma::{self, TensorArg, TmaProblem};

pub(crate) const FWD_FAMILY: &str = "attn_fwd_gluon";
pub(crate) const BWD_PREPROCESS_FAMILY: &str = "attn_bwd_gluon_preprocess";
pub(crate) const BWD_FAMILY: &str = "attn_bwd_gluon";
pub(crate) const BWD_DQ_CONVERT_FAMILY: &str = "attn_bwd_gluon_dq_convert";
/// dQ in a Gluon kernel of its own (python/kernels/flash_gluon/bwd_dq.py): taken where dQ has its
/// own kernel and the archive holds it ([`dq_request`]).
pub(crate) const BWD_DQ_FAMILY: &str = "attn_bwd_gluon_dq";
/// A head split's dK/dV partials summed and cast (python/kernels/flash_gluon/bwd_dkdv_convert.py).
pub(crate) const BWD_DKDV_CONVERT_FAMILY: &str = "attn_bwd_gluon_dkdv_convert";
/// The only arch the Gluon kernels are built for.
pub(crate) const ARCH: &str = "sm_90";

/// Head-dim buckets of the Gluon families (the `head_dim` axis), smallest first.
const FWD_BUCKETS: [(u64, &str); 3] = [(64, "64"), (128, "128"), (256, "256")];
const BWD_BUCKETS: [(u64, &str); 3] = [(64, "64"), (128, "128"), (256, "256")];
/// Query rows of the backward workspace are padded to a multiple of this (`SQ_PAD`).
const SQ_PAD_MULTIPLE: u64 = 128;
/// `lse2` and `delta2` are viewed as rows of this many fp32 values.
const STAT_ROW: u64 = 64;

/// Why the Gluon backend cannot serve a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unsupported {
    DType(DType),
    HeadDim { head_dim: u64, max: u64 },
    Bias,
    /// Logit soft-capping (`softcap` > 0).
    Softcap,
    /// ALiBi slopes.
    Alibi,
    /// Attention sinks.
    Sinks,
    /// V's head dim differs from Q/K's.
    HeadDimV { head_dim: u64, head_dim_v: u64 },
    /// The forward takes the row maximum before scaling, so it needs `sm_scale > 0`.
    NonPositiveScale,
    /// A tensor TMA cannot address (`"workspace"`: the workspace views would be too large).
    Tma { tensor: &'static str, problem: TmaProblem },
    /// A plain pointer the kernels assume 16-byte aligned (lse, delta) is not.
    Misaligned { tensor: &'static str, ptr: u64 },
    NoWorkspace { needed: u64 },
    WorkspaceTooSmall { needed: u64, given: u64 },
    /// The workspace's size does not fit 64 bits.
    WorkspaceTooLarge,
    /// The device is not sm_90 (the error message names the device).
    Arch,
    /// The device's archive lacks a functional the call needs.
    NotCompiled { family: &'static str },
    /// No compiled kernel of the functional accepts these arguments (its alignment hints).
    NoKernelFits { family: &'static str },
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Unsupported::DType(dtype) => write!(f, "it takes fp16 or bf16 inputs, not {}", dtype.triton_name()),
            Unsupported::HeadDim { head_dim, max } => write!(f, "head dim {head_dim} is above its largest ({max})"),
            Unsupported::Bias => write!(f, "it has no attention bias (use the portable backend)"),
            Unsupported::Softcap => write!(f, "it has no logit soft-capping (use the portable backend)"),
            Unsupported::Alibi => write!(f, "it has no ALiBi (use the portable backend)"),
            Unsupported::Sinks => write!(f, "it has no attention sinks (use the portable backend)"),
            Unsupported::HeadDimV { head_dim, head_dim_v } => {
                write!(f, "V's head dim {head_dim_v} differs from Q/K's {head_dim} (use the portable backend)")
            }
            Unsupported::NonPositiveScale => write!(f, "its forward needs sm_scale > 0"),
            Unsupported::Tma { tensor, problem } => write!(f, "{tensor}: {problem}"),
            Unsupported::Misaligned { tensor, ptr } => {
                write!(f, "{tensor}: address {ptr:#x} is not 16-byte aligned (its kernels assume it)")
            }
            Unsupported::NoWorkspace { needed } => {
                write!(f, "the backward needs a workspace of {needed} bytes (attn_bwd_workspace_bytes); none was given")
            }
            Unsupported::WorkspaceTooSmall { needed, given } => {
                write!(f, "the backward needs a workspace of {needed} bytes (attn_bwd_workspace_bytes); {given} were given")
            }
            Unsupported::WorkspaceTooLarge => {
                write!(f, "its workspace (B·Hq·SQ_PAD·(W + 2)·4 bytes) overflows 64 bits")
            }
            Unsupported::Arch => write!(f, "its kernels run on {ARCH} only"),
            Unsupported::NotCompiled { family } => {
                write!(f, "this build's archive has no {family} kernels for this dtype and head dim")
            }
            Unsupported::NoKernelFits { family } => {
                write!(f, "no compiled {family} kernel accepts these pointer alignments and strides")
            }
        }
    }
}

impl Unsupported {
    /// The error a forced Gluon call reports. `device` names the device for `Arch`.
    pub fn error(self, op: &str, device: Option<&DeviceInfo>) -> Error {
        let on = match (self, device) {
            (Unsupported::Arch, Some(d)) => format!(" (device {} is {})", d.ordinal, d.arch),
            _ => String::new(),
        };
        Error::new(ErrorKind::UnsupportedByBackend, format!("{op}: the Gluon backend cannot serve this call: {self}{on}"))
    }
}

/// What the Gluon kernels of one call are compiled for, from the inputs alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GluonShape {
    pub dtype: DType,
    /// The `head_dim` bucket (`HEAD_DIM` of the kernels) and its axis value.
    pub bucket: u64,
    pub bucket_axis: &'static str,
    /// Backward: `SQ_PAD` = Sq rounded up to 128, the rows of the workspace (`B·Hq·SQ_PAD`), and
    /// the workspace's size.
    pub sq_pad: u64,
    pub workspace_rows: u64,
    pub workspace_bytes: u64,
    /// Backward: dQ comes from its own kernel after the dK/dV-only Gluon kernel ([`dq_request`]: the
    /// Gluon `attn_bwd_gluon_dq` or the portable `attn_bwd_dq`; no dQ accumulator in the workspace,
    /// no dQ conversion): in the deterministic mode (no reduce-adds in a run-dependent order), and
    /// above [`FUSED_DQ_MAX_BUCKET`].
    pub separate_dq: bool,
    /// Backward: CTAs per key block, each walking one part of the GQA group's query heads ([`head_split`]);
    /// 1 = none.
    pub head_split: u64,
}

impl GluonShape {
    fn axes(&self) -> Axes {
        Axes::of(&[("dtype", self.dtype.triton_name()), ("head_dim", self.bucket_axis)])
    }

    /// Columns of the workspace's fp32 dQ accumulator: the bucket, or 0 when dQ has its own kernel.
    fn dq_acc_width(&self) -> u64 {
        if self.separate_dq { 0 } else { self.bucket }
    }
}

/// The input conditions shared by both passes: dtype, head dim, features, TMA-addressable
/// tensors.
fn common_inputs(
    dtype: DType,
    shape: &AttnShape,
    buckets: &[(u64, &'static str)],
    features: &[(bool, Unsupported)],
    tensors: &[(&'static str, Result<TensorArg, TmaProblem>)],
) -> Result<GluonShape, Unsupported> {
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(Unsupported::DType(dtype));
    }
    let max = buckets.last().map_or(0, |b| b.0);
    let Some(&(bucket, bucket_axis)) = buckets.iter().find(|b| b.0 >= shape.head_dim) else {
        return Err(Unsupported::HeadDim { head_dim: shape.head_dim, max });
    };
    if let Some((_, why)) = features.iter().find(|(on, _)| *on) {
        return Err(*why);
    }
    if shape.splits_head_dims() {
        return Err(Unsupported::HeadDimV { head_dim: shape.head_dim, head_dim_v: shape.head_dim_v });
    }
    for &(tensor, t) in tensors {
        t.and_then(|t| tma::check(&t)).map_err(|problem| Unsupported::Tma { tensor, problem })?;
    }
    Ok(GluonShape { dtype, bucket, bucket_axis, sq_pad: 0, workspace_rows: 0, workspace_bytes: 0, separate_dq: false, head_split: 1 })
}

/// Whether the Gluon forward can serve `p` (inputs only; the device is checked by
/// [`device_ready`]). Packed (varlen) batches are served through ragged descriptors
/// ([`TensorArg::ragged`]), dropout with the portable kernels' Philox counters (a mask is the same
/// whichever backend drew it).
pub(crate) fn fwd_inputs(p: &FwdParams, shape: &AttnShape) -> Result<GluonShape, Unsupported> {
    let features = [
        (p.bias.is_some(), Unsupported::Bias),
        (p.softcap != 0.0, Unsupported::Softcap),
        (p.alibi_slopes.is_some(), Unsupported::Alibi),
        (p.sinks.is_some(), Unsupported::Sinks),
    ];
    let tensors = [("q", &p.q), ("k", &p.k), ("v", &p.v), ("o", &p.o)].map(|(n, t)| (n, tma_tensor(t, shape)));
    let g = common_inputs(p.q.dtype, shape, &FWD_BUCKETS, &features, &tensors)?;
    if p.sm_scale.is_nan() || p.sm_scale <= 0.0 {
        return Err(Unsupported::NonPositiveScale);
    }
    aligned16(&[("lse", p.lse.map_or(0, |l| l.ptr))])?;
    Ok(g)
}

/// The plain pointers the Gluon kernels' `aligned` variant assumes 16-byte aligned.
fn aligned16(pointers: &[(&'static str, u64)]) -> Result<(), Unsupported> {
    match pointers.iter().find(|(_, ptr)| !ptr.is_multiple_of(16)) {
        Some(&(tensor, ptr)) => Err(Unsupported::Misaligned { tensor, ptr }),
        None => Ok(()),
    }
}

/// Whether the Gluon backward can serve `p` (inputs only, the workspace aside: see
/// [`check_workspace`]). The result carries the workspace size. Packed (varlen) batches and
/// dropout are served as in the forward.
pub(crate) fn bwd_inputs(p: &BwdParams, shape: &AttnShape) -> Result<GluonShape, Unsupported> {
    let features = [
        (p.bias.is_some() || p.dbias.is_some(), Unsupported::Bias),
        (p.softcap != 0.0, Unsupported::Softcap),
        (p.alibi_slopes.is_some(), Unsupported::Alibi),
        (p.sinks.is_some(), Unsupported::Sinks),
    ];
    let tensors = [("q", &p.q), ("k", &p.k), ("v", &p.v), ("o", &p.o), ("d_o", &p.d_o), ("dq", &p.dq), ("dk", &p.dk), ("dv", &p.dv)]
        .map(|(n, t)| (n, tma_tensor(t, shape)));
    let mut g = common_inputs(p.q.dtype, shape, &BWD_BUCKETS, &features, &tensors)?;
    aligned16(&[("lse", p.lse.ptr), ("delta", p.delta.ptr)])?;
    g.sq_pad = sq_pad(shape.seqlen_q);
    g.workspace_rows = workspace_rows(shape)?;
    // The workspace views must be addressable by TMA too (their rows below 2^32).
    let rows = g.workspace_rows;
    for t in [TensorArg::matrix(0, rows, g.bucket, DType::F32), TensorArg::matrix(0, rows / STAT_ROW, STAT_ROW, DType::F32)] {
        tma::check(&t).map_err(|problem| Unsupported::Tma { tensor: "workspace", problem })?;
    }
    g.separate_dq = p.deterministic || g.bucket > FUSED_DQ_MAX_BUCKET;
    g.head_split = head_split(shape, g.bucket);
    g.workspace_bytes = checked_sum("workspace bytes", workspace_bytes(shape, g.dq_acc_width())?, partials_bytes(shape, &g)?)
        .map_err(|_| Unsupported::WorkspaceTooLarge)?;
    Ok(g)
}

/// The GQA head split of the Gluon backward (python/kernels/flash_gluon/bwd.py, "Head split"): one CTA
/// per key block walks `G · ⌈Sq / 64⌉` query steps, and when `G · Sq` is large the CTAs of a K/V head drift
/// apart in that walk until their Q/dO/dQ tiles no longer share L2 (hd128 causal, B·S = 16k, on the H100:
/// Hq/Hk 64/8 S16k 0.73 of cuDNN, 28/4 0.82). Splitting the group's heads over [`HEAD_SPLIT`] CTAs per key
/// block halves each walk; their fp32 dK/dV partials are summed in a fixed order by
/// `attn_bwd_gluon_dkdv_convert`, so the result does not depend on the run (the deterministic mode keeps it).
/// `test/gluon/check_bwd.py --bench-gqa --head-split 2,4,7,8` on the H100 (bench/results/h200_gluon_bwd_issue17.md):
/// 2 was the best split on every row it helped; it gained from `G · Sq` = 28k up (28/4 S4k +2.5 %, 32/8
/// S8k +6 %, 28/4 S16k +28 %, 64/8 S16k +32 %) and lost below 16k (-0.5 to -7 %). Measured at the bucket
/// 128 only; packed batches are not split. Dropout calls split as the others (each part draws its own
/// heads' masks: test/gluon/check_bwd_dropout.py's head-split cases, 49 passed on an H100).
pub(crate) const HEAD_SPLIT: u64 = 2;
/// The split is taken from this `G · Sq` (query heads per K/V head times query rows) up.
pub(crate) const HEAD_SPLIT_MIN_GROUP_ROWS: u64 = 24576;
/// ... for groups of at least this many query heads, at this head-dim bucket.
pub(crate) const HEAD_SPLIT_MIN_GROUP: u64 = 4;
pub(crate) const HEAD_SPLIT_BUCKET: u64 = 128;

/// CTAs per key block of the Gluon backward ([`HEAD_SPLIT`]): 1 or `HEAD_SPLIT`.
pub(crate) fn head_split(shape: &AttnShape, bucket: u64) -> u64 {
    let group = shape.gqa_group();
    let long_walk = group.saturating_mul(shape.seqlen_q) >= HEAD_SPLIT_MIN_GROUP_ROWS;
    if shape.varlen.is_none() && bucket == HEAD_SPLIT_BUCKET && group >= HEAD_SPLIT_MIN_GROUP && long_walk {
        HEAD_SPLIT
    } else {
        1
    }
}

/// A head split's fp32 dK/dV partials at the end of the workspace, `[HEAD_SPLIT, 2, B, Hk, Sk, bucket]`
/// (`HEAD_SPLIT·2·B·Hk·Sk·bucket·4` bytes; none without a split).
fn partials_bytes(shape: &AttnShape, g: &GluonShape) -> Result<u64, Unsupported> {
    if g.head_split < 2 {
        return Ok(0);
    }
    checked_product("workspace partials", &[g.head_split, 2, shape.batch, shape.heads_k, shape.seqlen_k, g.bucket, 4])
        .map_err(|_| Unsupported::WorkspaceTooLarge)
}

/// `B·Hq·SQ_PAD`: rows of the workspace (one per query row of every head, pad rows included).
fn workspace_rows(shape: &AttnShape) -> Result<u64, Unsupported> {
    checked_product("workspace rows", &[shape.batch, shape.heads_q, sq_pad(shape.seqlen_q)])
        .map_err(|_| Unsupported::WorkspaceTooLarge)
}

/// The backward's workspace before a head split's partials ([`partials_bytes`]): `B·Hq·SQ_PAD·(DQ_ACC + 2)·4`
/// bytes (dq_acc, lse2, delta2; fp32), `SQ_PAD` = Sq rounded up to 128, `DQ_ACC` the dQ accumulator's width
/// ([`GluonShape::dq_acc_width`]: the Gluon bucket, or 0).
pub(crate) fn workspace_bytes(shape: &AttnShape, dq_acc_width: u64) -> Result<u64, Unsupported> {
    checked_product("workspace bytes", &[workspace_rows(shape)?, dq_acc_width + 2, 4])
        .map_err(|_| Unsupported::WorkspaceTooLarge)
}

/// `SQ_PAD`: the query rows of one head in the workspace, Sq rounded up to 128.
fn sq_pad(seqlen_q: u64) -> u64 {
    seqlen_q.div_ceil(SQ_PAD_MULTIPLE) * SQ_PAD_MULTIPLE
}

/// Whether the caller's workspace is large enough for `g`.
pub(crate) fn check_workspace(workspace: Option<Workspace>, g: &GluonShape) -> Result<(), Unsupported> {
    match workspace {
        None => Err(Unsupported::NoWorkspace { needed: g.workspace_bytes }),
        Some(ws) if ws.bytes < g.workspace_bytes => Err(Unsupported::WorkspaceTooSmall { needed: g.workspace_bytes, given: ws.bytes }),
        Some(_) => Ok(()),
    }
}

/// Whether the device can run Gluon kernels at all.
pub(crate) fn device_supported(arch: &str) -> Result<(), Unsupported> {
    if arch == ARCH { Ok(()) } else { Err(Unsupported::Arch) }
}

/// The backend rule, before the driver is touched: `Portable` → no Gluon; `Auto` → Gluon if the
/// inputs allow it; `Gluon` → the inputs must allow it, else the error.
pub(crate) fn select_by_inputs(backend: Backend, inputs: impl FnOnce() -> Result<GluonShape, Unsupported>) -> Result<Option<GluonShape>, Unsupported> {
    match backend {
        Backend::Portable => Ok(None),
        Backend::Auto => Ok(inputs().ok()),
        Backend::Gluon => inputs().map(Some),
    }
}

/// The backend rule, once the device is known: whether to launch Gluon (`device` is the
/// result of [`device_ready`]: ready, and whether the tuning database measured the portable
/// backend faster in the call's cell, which `Auto` follows). A forced Gluon call gets the
/// device's reason as its error.
pub(crate) fn select_by_device(backend: Backend, device: Result<bool, Unsupported>) -> Result<bool, Unsupported> {
    match (backend, device) {
        (Backend::Auto, Ok(portable_faster)) => Ok(!portable_faster),
        (_, Ok(_)) => Ok(true),
        (Backend::Gluon, Err(why)) => Err(why),
        (_, Err(_)) => Ok(false),
    }
}

/// The device conditions: sm_90, and for every request of the call its functional is in the
/// device's archive and one of its kernels fits the arguments. Ready: whether the tuning
/// database measured the portable backend faster for the call (`key`'s cell) in any of them.
pub(crate) fn device_ready(launcher: &Launcher, requests: &[&Request], key: TuningKey) -> Result<bool, Unsupported> {
    device_supported(&launcher.device().arch)?;
    let mut portable_faster = false;
    for request in requests {
        match launcher.serves(request, key) {
            Serves::Yes { portable_faster: faster } => portable_faster |= faster,
            Serves::NotCompiled => return Err(Unsupported::NotCompiled { family: request.family }),
            Serves::NoKernelFits => return Err(Unsupported::NoKernelFits { family: request.family }),
        }
    }
    Ok(portable_faster)
}

/// What a descriptor over `t` (Q, K, V, O, dO, dK or dV) covers: the `[B, H, S, D]` tensor, or for
/// a packed batch its ragged view (python/kernels/flash_gluon/ragged.py).
fn tma_tensor(t: &TensorView<4>, shape: &AttnShape) -> Result<TensorArg, TmaProblem> {
    if shape.varlen.is_some() { TensorArg::ragged(t) } else { Ok(TensorArg::from_view(t)) }
}

/// The descriptor arguments `(name, tensor)` of one call ([`tma_tensor`]); a tensor TMA cannot
/// address is the backend's refusal (`op` names the operator).
fn push_descs(args: &mut ArgList, descs: &[(&'static str, &TensorView<4>)], shape: &AttnShape, op: &str) -> Result<()> {
    for &(name, t) in descs {
        let tensor = name.trim_start_matches("desc_");
        let arg = tma_tensor(t, shape).map_err(|problem| Unsupported::Tma { tensor, problem }.error(op, None))?;
        args.push(name, ArgValue::Tensor(arg));
    }
    Ok(())
}

/// The forward's functional key: dtype, head dim, `varlen` and `dropout` (optional axes, named
/// only when on: the packed-batch kernels take ragged descriptors, the dropout kernels draw a mask).
pub(crate) fn fwd_axes(g: &GluonShape, shape: &AttnShape, dropout: bool) -> Axes {
    let mut axes = g.axes();
    push_optional_axes(&mut axes, shape, dropout);
    axes
}


/// The optional functional axes of the Gluon forward and main backward kernels, pushed only when
/// on: `varlen` (ragged descriptors for a packed batch) and `dropout`.
fn push_optional_axes(axes: &mut Axes, shape: &AttnShape, dropout: bool) {
    if shape.varlen.is_some() {
        axes.push("varlen", bool_axis(true));
    }
    if dropout {
        axes.push("dropout", bool_axis(true));
    }
}

/// The Gluon forward's functional key and arguments, built before the backend is decided.
pub(crate) struct FwdCall {
    axes: Axes,
    args: ArgList,
}

impl FwdCall {
    pub fn new(p: &FwdParams, shape: &AttnShape, mask: &MaskArgs, g: &GluonShape) -> Result<FwdCall> {
        Ok(FwdCall { axes: fwd_axes(g, shape, p.dropout.is_some()), args: fwd_args(p, shape, mask)? })
    }
    pub fn request(&self) -> Result<Request<'_>> {
        Ok(Request { family: FWD_FAMILY, axes: self.axes.as_slice()?, args: self.args.args()? })
    }
}

/// Arguments of `attn_fwd_gluon` by name (ABI.md).
fn fwd_args(p: &FwdParams, shape: &AttnShape, mask: &MaskArgs) -> Result<ArgList> {
    let mut args = ArgList::new();
    push_descs(&mut args, &[("desc_q", &p.q), ("desc_k", &p.k), ("desc_v", &p.v), ("desc_o", &p.o)], shape, "attn_fwd")?;
    push_fwd_common_args(&mut args, p.lse.as_ref(), p.sm_scale, shape, mask);
    args.extend(varlen_args(shape));
    dropout_args(&mut args, p.dropout.as_ref(), true)?;
    Ok(args)
}

/// The arguments the Gluon forwards (`attn_fwd_gluon`, `attn_fwd_gluon_fp8`) take after their
/// four descriptors (ABI.md): the LSE and its strides, `sm_scale`, `STORE_LSE`, lengths, window.
pub(crate) fn push_fwd_common_args(args: &mut ArgList, lse: Option<&TensorView<3>>, sm_scale: f32, shape: &AttnShape, mask: &MaskArgs) {
    use ArgValue::{F32, I32, I64, Ptr};
    match lse {
        // strides3: a packed batch's LSE ([1, Hq, tokens]) has batch stride 0.
        Some(l) => {
            args.push("LSE", Ptr(l.ptr));
            args.extend(strides3(["stride_lz", "stride_lh"], l, shape));
        }
        None => args.extend([("LSE", Ptr(0)), ("stride_lz", I64(0)), ("stride_lh", I64(0))]),
    }
    args.extend([
        ("sm_scale", F32(sm_scale)),
        ("STORE_LSE", I32(lse.is_some() as i32)),
    ]);
    args.extend(seq_mask_args(shape, mask));
}

/// A Gluon main kernel's grid over `tiles_per_head` blocks of each of `heads` × `batch` heads:
/// one CTA per tile, `(tiles_per_head, heads, batch)`; or, for a persistent kernel (config
/// `PERSISTENT` ≠ 0), one CTA per SM slot, `(min(tiles, SMs · CTAS_PER_SM), 1, 1)`, each walking
/// the tiles `pid, pid + grid, …` (ABI.md).
pub(crate) fn tile_grid(
    meta: &KernelMeta,
    tiles_per_head: u64,
    heads: u64,
    batch: u64,
    multiprocessors: u32,
) -> Result<[u64; 3]> {
    if config(meta, "PERSISTENT", 0) == 0 {
        return Ok([tiles_per_head, heads, batch]);
    }
    let tiles = checked_product("tiles (blocks · heads · batch)", &[tiles_per_head, heads, batch])?;
    // CTAS_PER_SM is archive metadata: slots past u64 are still more slots than tiles.
    let slots = u64::from(multiprocessors).saturating_mul(config(meta, "CTAS_PER_SM", 1).max(1) as u64);
    Ok([tiles.min(slots).max(1), 1, 1])
}

/// The Gluon forward's grid: query blocks of `BLOCK_M` rows per query head ([`tile_grid`]).
pub(crate) fn fwd_grid(meta: &KernelMeta, shape: &AttnShape, multiprocessors: u32) -> Result<[u64; 3]> {
    tile_grid(meta, blocks(shape.seqlen_q, meta, "BLOCK_M", 128), shape.heads_q, shape.batch, multiprocessors)
}

/// Enqueues the Gluon forward (grid: [`fwd_grid`]).
pub(crate) fn launch_fwd(launcher: &Launcher, request: &Request, shape: &AttnShape, key: TuningKey) -> Result<()> {
    let multiprocessors = launcher.device().multiprocessors;
    let kernel = launcher.prepare(
        request,
        |functional, fitting, device| super::fwd::choose_kernel(functional, fitting, shape, key, device),
        |meta| fwd_grid(meta, shape, multiprocessors),
    )?;
    launcher.launch(&kernel)
}

/// The widest head-dim bucket whose Gluon backward computes dQ itself (fp32 reduce-adds into the
/// workspace, then `attn_bwd_gluon_dq_convert`). Above it dQ always comes from its own kernel
/// ([`dq_request`]) after the Gluon dK/dV kernel: at hd256 the fused kernel's per-step
/// 64 KiB reduce-add costs it nearly half its time (H100, bf16 S 512-16k, FA3 grid, cuDNN beside
/// it: fused 0.77 of cuDNN, split 0.97; bench/results/h200_gluon_bwd_issue17.md). python/rules.py
/// compiles the fused kernels up to the same bucket (`GLUON_FUSED_DQ_MAX_HEAD_DIM`); the
/// `compiled_gluon_kernels_take_the_runtime_arguments` test holds the two together.
pub(crate) const FUSED_DQ_MAX_BUCKET: u64 = 128;

/// The backward's functional keys: (preprocess and dq_convert, main kernel). The main kernel's
/// `dq` axis is off when dQ has its own kernel ([`GluonShape::separate_dq`]); its `varlen` axis (optional,
/// named only when on) picks its ragged-descriptor kernels; the preprocess and the dQ conversion
/// take packing at run time.
pub(crate) fn bwd_axes(g: &GluonShape, shape: &AttnShape, separate_dq: bool, dropout: bool) -> (Axes, Axes) {
    let common = g.axes();
    let mut main = common;
    main.push("dq", bool_axis(!separate_dq));
    push_optional_axes(&mut main, shape, dropout);
    (common, main)
}

/// Device addresses of the workspace's four arrays (ABI.md): dq_acc (none, 0 bytes, when dQ has
/// its own kernel), lse2, delta2, and a head split's dK/dV partials (none, 0 bytes, without one).
fn workspace_views(ws: &Workspace, g: &GluonShape) -> Result<(u64, u64, u64, u64)> {
    let rows = g.workspace_rows;
    let dq_acc = ws.ptr;
    let lse2 = checked_sum("workspace lse2", dq_acc, checked_product("workspace dq_acc bytes", &[rows, g.dq_acc_width(), 4])?)?;
    let row_bytes = checked_product("workspace lse2 bytes", &[rows, 4])?;
    let delta2 = checked_sum("workspace delta2", lse2, row_bytes)?;
    Ok((dq_acc, lse2, delta2, checked_sum("workspace partials", delta2, row_bytes)?))
}

/// Arguments of the Gluon backward kernels (each takes the ones it declares).
struct BwdArgs {
    pre: ArgList,
    main: ArgList,
    convert: ArgList,
    /// `attn_bwd_gluon_dq`'s, used where dQ has its own kernel.
    dq: ArgList,
    /// `attn_bwd_gluon_dkdv_convert`'s, used after a head split.
    dkdv: ArgList,
}

fn bwd_args(p: &BwdParams, shape: &AttnShape, mask: &MaskArgs, g: &GluonShape, ws: &Workspace) -> Result<BwdArgs> {
    use ArgValue::{F32, Ptr, Tensor};
    let (dq_acc, lse2, delta2, partials) = workspace_views(ws, g)?;
    let rows = g.workspace_rows;
    let [seqlen_q, sq_pad, head_dim, heads_q, head_split, seqlen_k] = int32_args([
        ("N_CTX_Q", shape.seqlen_q),
        ("SQ_PAD", g.sq_pad),
        ("D_HEAD", shape.head_dim),
        ("N_HEADS_Q", shape.heads_q),
        ("HEAD_SPLIT", g.head_split),
        ("N_CTX_K", shape.seqlen_k),
    ])?;

    let mut pre = ArgList::new();
    pre.extend([("O", Ptr(p.o.ptr)), ("DO", Ptr(p.d_o.ptr))]);
    pre.extend(strides4(["stride_oz", "stride_oh", "stride_om"], &p.o, shape));
    pre.extend(strides4(["stride_doz", "stride_doh", "stride_dom"], &p.d_o, shape));
    pre.push("LSE", Ptr(p.lse.ptr));
    pre.extend(strides3(["stride_lz", "stride_lh"], &p.lse, shape));
    pre.push("DELTA", Ptr(p.delta.ptr));
    pre.extend(strides3(["stride_deltaz", "stride_deltah"], &p.delta, shape));
    pre.extend([
        ("LSE2", Ptr(lse2)),
        ("DELTA2", Ptr(delta2)),
        ("DQ_ACC", Ptr(dq_acc)),
        seqlen_q,
        sq_pad,
        head_dim,
        ("ZERO_DQ_ACC", ArgValue::I32(!g.separate_dq as i32)),
    ]);
    // The packing group: the preprocess and the conversion take its query side (each kernel
    // takes the arguments it declares).
    let packing = varlen_args(shape);
    pre.extend(packing);

    let mut main = ArgList::new();
    let descs = [("desc_q", &p.q), ("desc_k", &p.k), ("desc_v", &p.v), ("desc_do", &p.d_o), ("desc_dk", &p.dk), ("desc_dv", &p.dv)];
    push_descs(&mut main, &descs, shape, "attn_bwd")?;
    // Without a dQ accumulator the dK/dV-only kernel never touches its descriptor; it then spans
    // the workspace itself (lse2 and delta2 as [2·rows / bucket, bucket]: SQ_PAD is a multiple of
    // 128, so the bucket divides 2·rows), never memory past it.
    let dq_acc_view = if g.separate_dq {
        TensorArg::matrix(ws.ptr, rows * 2 / g.bucket, g.bucket, DType::F32)
    } else {
        TensorArg::matrix(dq_acc, rows, g.bucket, DType::F32)
    };
    main.extend([
        ("desc_dq_acc", Tensor(dq_acc_view)),
        ("desc_lse2", Tensor(TensorArg::matrix(lse2, rows / STAT_ROW, STAT_ROW, DType::F32))),
        ("desc_delta2", Tensor(TensorArg::matrix(delta2, rows / STAT_ROW, STAT_ROW, DType::F32))),
        ("sm_scale", F32(p.sm_scale)),
        sq_pad,
        heads_q,
    ]);
    main.extend(seq_mask_args(shape, mask));
    main.extend(packing);
    dropout_args(&mut main, p.dropout.as_ref(), false)?;
    // Without a split the kernel never reads DKV_PARTIALS (an address past the workspace's end, 0 bytes).
    main.extend([head_split, ("DKV_PARTIALS", Ptr(partials))]);

    let mut dkdv = ArgList::new();
    dkdv.extend([("DKV_PARTIALS", Ptr(partials)), ("DK", Ptr(p.dk.ptr)), ("DV", Ptr(p.dv.ptr))]);
    dkdv.extend(strides4(["stride_dkz", "stride_dkh", "stride_dkn"], &p.dk, shape));
    dkdv.extend(strides4(["stride_dvz", "stride_dvh", "stride_dvn"], &p.dv, shape));
    dkdv.extend([seqlen_k, head_dim, head_split]);

    let mut convert = ArgList::new();
    convert.extend([("DQ_ACC", Ptr(dq_acc)), ("DQ", Ptr(p.dq.ptr))]);
    convert.extend(strides4(["stride_dqz", "stride_dqh", "stride_dqm"], &p.dq, shape));
    convert.extend([("sm_scale", F32(p.sm_scale)), seqlen_q, sq_pad, head_dim, heads_q]);
    convert.extend(packing);

    // attn_bwd_gluon_dq: dQ goes out through the Q tile, so its descriptor has Q's block.
    let mut dq = ArgList::new();
    let descs = [("desc_q", &p.q), ("desc_k", &p.k), ("desc_v", &p.v), ("desc_do", &p.d_o), ("desc_dq", &p.dq)];
    push_descs(&mut dq, &descs, shape, "attn_bwd")?;
    dq.extend([("LSE2", Ptr(lse2)), ("DELTA2", Ptr(delta2)), ("sm_scale", F32(p.sm_scale)), sq_pad]);
    dq.extend(seq_mask_args(shape, mask));
    dq.extend(packing);
    dropout_args(&mut dq, p.dropout.as_ref(), false)?;
    Ok(BwdArgs { pre, main, convert, dq, dkdv })
}

/// The Gluon backward's functional keys and arguments, built before the backend is decided.
pub(crate) struct BwdCall {
    common: Axes,
    main_axes: Axes,
    /// `attn_bwd_gluon_dq`'s key: the main kernel's without its `dq` axis.
    dq_axes: Axes,
    args: BwdArgs,
}

impl BwdCall {
    /// `workspace`: the caller's, or any 16-byte aligned stand-in when only asking whether the
    /// kernels would serve the call.
    pub fn new(p: &BwdParams, shape: &AttnShape, mask: &MaskArgs, g: &GluonShape, workspace: &Workspace) -> Result<BwdCall> {
        let (common, main_axes) = bwd_axes(g, shape, g.separate_dq, p.dropout.is_some());
        let mut dq_axes = common;
        push_optional_axes(&mut dq_axes, shape, p.dropout.is_some());
        Ok(BwdCall { common, main_axes, dq_axes, args: bwd_args(p, shape, mask, g, workspace)? })
    }

    /// The requests of the preprocess, the main kernel, the dQ conversion, `attn_bwd_gluon_dq`
    /// (these two are alternatives: [`dq_request`]) and the dK/dV partials' conversion (after a head
    /// split only: [`bwd_kernels`]).
    pub fn requests(&self) -> Result<[Request<'_>; 5]> {
        let common = self.common.as_slice()?;
        Ok([
            Request { family: BWD_PREPROCESS_FAMILY, axes: common, args: self.args.pre.args()? },
            Request { family: BWD_FAMILY, axes: self.main_axes.as_slice()?, args: self.args.main.args()? },
            Request { family: BWD_DQ_CONVERT_FAMILY, axes: common, args: self.args.convert.args()? },
            Request { family: BWD_DQ_FAMILY, axes: self.dq_axes.as_slice()?, args: self.args.dq.args()? },
            Request { family: BWD_DKDV_CONVERT_FAMILY, axes: common, args: self.args.dkdv.args()? },
        ])
    }
}

/// The kernels the Gluon backward launches, in order, from `[preprocess, main, dQ kernel ([`dq_request`]),
/// dK/dV conversion]`: the last one only after a head split.
pub(crate) fn bwd_kernels<'a, 'r>(g: &GluonShape, all: &'a [&'a Request<'r>; 4]) -> &'a [&'a Request<'r>] {
    if g.head_split > 1 { &all[..] } else { &all[..3] }
}

/// The Gluon backward's last kernel: the dQ conversion after a main kernel that computed dQ;
/// where dQ has its own kernel ([`GluonShape::separate_dq`]), `attn_bwd_gluon_dq` where the
/// device's archive holds it for the call (python/rules.py decides: `ATTN_BWD_GLUON_DQ` in
/// `GLUON_FAMILIES`), else the portable `attn_bwd_dq` (`portable_dq`).
pub(crate) fn dq_request<'a, 'r>(
    launcher: &Launcher,
    g: &GluonShape,
    [convert, gluon_dq, portable_dq]: [&'a Request<'r>; 3],
    key: TuningKey,
) -> &'a Request<'r> {
    if !g.separate_dq {
        convert
    } else if matches!(launcher.serves(gluon_dq, key), Serves::Yes { .. }) {
        gluon_dq
    } else {
        portable_dq
    }
}

/// Enqueues the Gluon backward ([`bwd_kernels`]): `pre` (grid `(SQ_PAD / BLOCK_M, Hq, B)`), `main` (grid
/// `(cdiv(Sk, BLOCK_N), Hk · HEAD_SPLIT, B)`, or SM-sized when persistent: [`tile_grid`]), then `dq`
/// ([`dq_request`]): the dQ conversion or `attn_bwd_gluon_dq` (grid `(cdiv(Sq, BLOCK_M), Hq, B)`), or the
/// portable `attn_bwd_dq`; after a head split the dK/dV conversion (grid `(cdiv(Sk, BLOCK_N), Hk, B)`).
/// All kernels are chosen, loaded, their descriptors encoded and their grids checked before the first
/// launch.
pub(crate) fn launch_bwd(launcher: &Launcher, requests: &[&Request], shape: &AttnShape, g: &GluonShape, key: TuningKey) -> Result<()> {
    let (b, hq) = (shape.batch, shape.heads_q);
    let &[pre, main, dq, ref dkdv @ ..] = requests else {
        bail!(Internal, "the Gluon backward takes 3 or 4 kernels, not {}", requests.len());
    };
    let multiprocessors = launcher.device().multiprocessors;
    let split_heads = checked_product("K/V heads × HEAD_SPLIT", &[shape.heads_k, g.head_split])?;
    let dkdv_kernel = match dkdv {
        [] => None,
        [convert] => Some(launcher.prepare(convert, first_preferred, |m| Ok([blocks(shape.seqlen_k, m, "BLOCK_N", 128), shape.heads_k, b]))?),
        more => bail!(Internal, "the Gluon backward takes 3 or 4 kernels, not {}", 3 + more.len()),
    };
    let kernels = [
        launcher.prepare(pre, first_preferred, |m| Ok([blocks(g.sq_pad, m, "BLOCK_M", 128), hq, b]))?,
        // Key blocks of BLOCK_N keys per K/V head (per part of its group's heads after a split).
        launcher.prepare(main, first_preferred, |m| {
            if g.head_split > 1 && config(m, "PERSISTENT", 0) != 0 {
                bail!(Internal, "{BWD_FAMILY}: a head split runs the non-persistent kernel, the archive's is persistent");
            }
            tile_grid(m, blocks(shape.seqlen_k, m, "BLOCK_N", 128), split_heads, shape.batch, multiprocessors)
        })?,
        // Query blocks of BLOCK_M rows per query head, Gluon or portable.
        if dq.family == BWD_DQ_CONVERT_FAMILY || dq.family == BWD_DQ_FAMILY {
            launcher.prepare(dq, first_preferred, |m| Ok([blocks(shape.seqlen_q, m, "BLOCK_M", 128), hq, b]))?
        } else {
            launcher.prepare(dq, |f, k, _| super::bwd::choose_kernel(f, k, key), |m| Ok(dq_grid(shape, kernel_blocks(m))))?
        },
    ];
    for kernel in kernels.iter().chain(&dkdv_kernel) {
        launcher.launch(kernel)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::check_grid;

    fn grid_of(config: &[(&str, i64)], sq: u64, heads_q: u64, batch: u64) -> Result<[u32; 3]> {
        let meta = KernelMeta {
            config: config.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
            ..KernelMeta::for_tests("k", Vec::new(), 12)
        };
        let shape = AttnShape {
            batch,
            heads_q,
            heads_k: 1,
            seqlen_q: sq,
            seqlen_k: sq,
            head_dim: 128,
            head_dim_bucket: 128,
            head_dim_axis: "128",
            head_dim_v: 128,
            head_dim_v_axis: "128",
            varlen: None,
        };
        fwd_grid(&meta, &shape, 132).and_then(|grid| check_grid(FWD_FAMILY, grid))
    }

    #[test]
    fn forward_grid_per_tile_or_persistent() {
        assert_eq!(grid_of(&[("BLOCK_M", 128)], 1000, 16, 4), Ok([8, 16, 4]));
        // Persistent: one CTA per SM slot, never more CTAs than tiles, never none.
        let pers = [("BLOCK_M", 128), ("PERSISTENT", 1), ("CTAS_PER_SM", 1)];
        assert_eq!(grid_of(&pers, 4096, 16, 4), Ok([132, 1, 1]));
        assert_eq!(grid_of(&pers, 100, 2, 1), Ok([2, 1, 1]));
        assert_eq!(grid_of(&[("BLOCK_M", 128), ("PERSISTENT", 1), ("CTAS_PER_SM", 2)], 4096, 16, 4), Ok([264, 1, 1]));
        assert_eq!(grid_of(&[("BLOCK_M", 128), ("PERSISTENT", 2)], 4096, 16, 4), Ok([132, 1, 1]), "any PERSISTENT mode");
    }
    use crate::driver::Runtime;
    use crate::flash::{Dropout, Mask, MaskAlign, Varlen};
    use crate::tensor::TensorView;

    const B: u64 = 2;
    const HQ: u64 = 8;
    const HK: u64 = 2;
    const SQ: u64 = 300;
    const SK: u64 = 500;

    /// Fake device address `i`: tensors 2^32 bytes apart never overlap.
    const fn at(i: u64) -> u64 {
        i << 32
    }

    fn fwd(d: u64, dtype: DType) -> FwdParams<'static> {
        let t = |i, h, s| TensorView::contiguous(at(i), [B, h, s, d], dtype);
        let lse = TensorView::contiguous(at(5), [B, HQ, SQ], DType::F32);
        FwdParams::new(t(1, HQ, SQ), t(2, HK, SK), t(3, HK, SK), t(4, HQ, SQ), Some(lse))
    }

    fn bwd(d: u64, dtype: DType) -> BwdParams<'static> {
        let t = |i, h, s| TensorView::contiguous(at(i), [B, h, s, d], dtype);
        let rows = |i| TensorView::contiguous(at(i), [B, HQ, SQ], DType::F32);
        let (q, kv) = (|i| t(i, HQ, SQ), |i| t(i, HK, SK));
        BwdParams::new(q(1), kv(2), kv(3), q(4), q(5), rows(6), rows(7), q(8), kv(9), kv(10))
    }

    fn fwd_check(p: &FwdParams) -> Result<GluonShape, Unsupported> {
        let (shape, _) = super::super::fwd::validate(p).unwrap();
        fwd_inputs(p, &shape)
    }

    fn bwd_check(p: &BwdParams) -> Result<GluonShape, Unsupported> {
        let (shape, _) = super::super::bwd::validate(p).unwrap();
        bwd_inputs(p, &shape).and_then(|g| check_workspace(p.workspace, &g).map(|()| g))
    }

    #[test]
    fn forward_inputs_the_rule_accepts() {
        for (d, bucket) in [(8, 64), (40, 64), (64, 64), (72, 128), (128, 128), (136, 256), (256, 256)] {
            for dtype in [DType::F16, DType::BF16] {
                let g = fwd_check(&fwd(d, dtype)).unwrap_or_else(|e| panic!("d {d}: {e}"));
                assert_eq!((g.bucket, g.bucket_axis.to_string()), (bucket, bucket.to_string()));
                assert_eq!(g.dtype, dtype);
            }
        }
        // Masks, GQA and a B×S×H×D layout are all served.
        let mut p = fwd(128, DType::BF16);
        p.mask = Mask::causal(MaskAlign::BottomRight);
        p.lse = None;
        let bshd = |ptr, h: u64, s: u64| {
            TensorView::new(ptr, [B, h, s, 128], [(s * h * 128) as i64, 128, (h * 128) as i64, 1], DType::BF16)
        };
        p.q = bshd(at(1), HQ, SQ);
        p.k = bshd(at(2), HK, SK);
        assert!(fwd_check(&p).is_ok());
    }

    #[test]
    fn forward_inputs_the_rule_refuses() {
        let reason = |f: &dyn Fn(&mut FwdParams)| {
            let mut p = fwd(128, DType::BF16);
            f(&mut p);
            fwd_check(&p).unwrap_err()
        };
        assert_eq!(fwd_check(&fwd(64, DType::F32)), Err(Unsupported::DType(DType::F32)));
        assert_eq!(reason(&|p| p.bias = Some(TensorView::contiguous(0x1000, [B, HQ, SQ, SK], DType::BF16))), Unsupported::Bias);
        assert_eq!(reason(&|p| p.softcap = 30.0), Unsupported::Softcap);
        assert_eq!(reason(&|p| p.alibi_slopes = Some(TensorView::contiguous(0x1000, [1, HQ], DType::F32))), Unsupported::Alibi);
        assert_eq!(reason(&|p| p.sinks = Some(TensorView::contiguous(0x1000, [HQ], DType::F32))), Unsupported::Sinks);
        let head_dim_v = |p: &mut FwdParams| {
            p.v = TensorView::contiguous(p.v.ptr, [B, HK, SK, 64], DType::BF16);
            p.o = TensorView::contiguous(p.o.ptr, [B, HQ, SQ, 64], DType::BF16);
        };
        assert_eq!(reason(&head_dim_v), Unsupported::HeadDimV { head_dim: 128, head_dim_v: 64 });
        assert_eq!(reason(&|p| p.lse.as_mut().unwrap().ptr += 4), Unsupported::Misaligned { tensor: "lse", ptr: at(5) + 4 });
        assert_eq!(reason(&|p| p.sm_scale = -0.125), Unsupported::NonPositiveScale);
        assert_eq!(reason(&|p| p.sm_scale = 0.0), Unsupported::NonPositiveScale);
        assert_eq!(
            reason(&|p| p.q.ptr += 8),
            Unsupported::Tma { tensor: "q", problem: TmaProblem::BaseMisaligned { ptr: at(1) + 8 } }
        );
        // A head dim of 40 with rows 40 elements apart (80 bytes) is fine; a row stride of 44
        // elements (88 bytes) is not.
        let mut p = fwd(40, DType::F16);
        p.v = TensorView::new(at(3), [B, HK, SK, 40], [(HK * SK * 44) as i64, (SK * 44) as i64, 44, 1], DType::F16);
        assert_eq!(
            fwd_check(&p),
            Err(Unsupported::Tma { tensor: "v", problem: TmaProblem::StrideNotMultiple16 { dim: 2, bytes: 88 } })
        );
    }

    /// A packed batch of 3 sequences: q/o [1, HQ, 17, d], k/v [1, HK, 13, d] (rows H·d apart).
    fn packed_fwd(d: u64, dtype: DType) -> FwdParams<'static> {
        let t = |ptr, h: u64, tokens| TensorView::new(ptr, [1, h, tokens, d], [0, d as i64, (h * d) as i64, 1], dtype);
        let cu = |ptr| TensorView::contiguous(ptr, [4], DType::I32);
        let lse = TensorView::new(at(5), [1, HQ, 17], [0, 32, 1], DType::F32);
        let mut p = FwdParams::new(t(at(1), HQ, 17), t(at(2), HK, 13), t(at(3), HK, 13), t(at(4), HQ, 17), Some(lse));
        p.varlen = Some(Varlen::new(cu(at(6)), cu(at(7)), 12, 9));
        p
    }

    /// The backward of [`packed_fwd`]'s batch.
    fn packed_bwd(d: u64, dtype: DType) -> BwdParams<'static> {
        let t = |ptr, h: u64, tokens| TensorView::new(ptr, [1, h, tokens, d], [0, d as i64, (h * d) as i64, 1], dtype);
        let rows = |ptr| TensorView::new(ptr, [1, HQ, 17], [0, 32, 1], DType::F32);
        let (q, kv) = (|i| t(at(i), HQ, 17), |i| t(at(i), HK, 13));
        let mut b = BwdParams::new(q(1), kv(2), kv(3), q(4), q(5), rows(at(6)), rows(at(7)), q(8), kv(9), kv(10));
        let cu = |ptr| TensorView::contiguous(ptr, [4], DType::I32);
        b.varlen = Some(Varlen::new(cu(at(11)), cu(at(12)), 12, 9));
        b
    }

    #[test]
    fn packed_batches_take_ragged_descriptors() {
        let p = packed_fwd(64, DType::F16);
        let (shape, mask) = super::super::fwd::validate(&p).unwrap();
        let g = fwd_check(&p).unwrap();
        assert_eq!(fwd_axes(&g, &shape, false).as_slice().unwrap(), &[("dtype", "fp16"), ("head_dim", "64"), ("varlen", "true")]);
        let args = fwd_args(&p, &shape, &mask).unwrap();
        let value = |n: &str| args.args().unwrap().iter().find(|(k, _)| *k == n).unwrap().1;
        for (name, t) in [("desc_q", &p.q), ("desc_k", &p.k), ("desc_v", &p.v), ("desc_o", &p.o)] {
            assert_eq!(value(name), ArgValue::Tensor(TensorArg::ragged(t).unwrap()), "{name}");
        }
        let ArgValue::Tensor(q) = value("desc_q") else { panic!() };
        assert_eq!((q.rank, q.sizes()[2..].to_vec()), (5, vec![HQ, tma::RAGGED_ROWS, 64]));
        // Lengths are the max ones (the grid covers them), LSE rows come from the offsets.
        assert_eq!((value("N_CTX_Q"), value("N_CTX_K")), (ArgValue::I32(12), ArgValue::I32(9)));
        assert_eq!((value("stride_lz"), value("stride_lh")), (ArgValue::I64(0), ArgValue::I64(32)));
        assert_eq!(value("IS_VARLEN"), ArgValue::I32(1));
        assert_eq!((value("CU_SEQLENS_Q"), value("CU_SEQLENS_K")), (ArgValue::Ptr(at(6)), ArgValue::Ptr(at(7))));
        assert_eq!((value("N_TOKENS_Q"), value("N_TOKENS_K")), (ArgValue::I32(17), ArgValue::I32(13)));
        // A fixed-length batch passes the neutral packing group, a [B, H, S, D] descriptor, no varlen axis.
        let f = fwd(64, DType::F16);
        let (shape, mask) = super::super::fwd::validate(&f).unwrap();
        let g = fwd_check(&f).unwrap();
        assert_eq!(fwd_axes(&g, &shape, false).as_slice().unwrap(), &[("dtype", "fp16"), ("head_dim", "64")]);
        let args = fwd_args(&f, &shape, &mask).unwrap();
        let value = |n: &str| args.args().unwrap().iter().find(|(k, _)| *k == n).unwrap().1;
        assert_eq!(value("desc_q"), ArgValue::Tensor(TensorArg::from_view(&f.q)));
        assert_eq!((value("IS_VARLEN"), value("CU_SEQLENS_Q")), (ArgValue::I32(0), ArgValue::Ptr(0)));
        assert_eq!(value("stride_lz"), ArgValue::I64((HQ * SQ) as i64));
        // The backward: ragged descriptors too, the main kernel's varlen axis, the packing group in
        // all three kernels' lists, the workspace sized by the sequences and the longest one.
        let mut b = packed_bwd(64, DType::F16);
        let (shape, mask) = super::super::bwd::validate(&b).unwrap();
        let g = bwd_inputs(&b, &shape).unwrap();
        assert_eq!((g.sq_pad, g.workspace_rows), (128, 3 * HQ * 128), "3 sequences, the longest 12 queries");
        let (common, main_axes) = bwd_axes(&g, &shape, false, false);
        assert_eq!(common.as_slice().unwrap(), &[("dtype", "fp16"), ("head_dim", "64")]);
        assert_eq!(main_axes.as_slice().unwrap(), &[("dtype", "fp16"), ("head_dim", "64"), ("dq", "true"), ("varlen", "true")]);
        b.workspace = Some(Workspace { ptr: 0x10000000, bytes: g.workspace_bytes });
        let BwdArgs { pre, main, convert, .. } = bwd_args(&b, &shape, &mask, &g, &b.workspace.unwrap()).unwrap();
        let value = |l: &ArgList, n: &str| l.args().unwrap().iter().find(|(k, _)| *k == n).unwrap().1;
        for (name, t) in [("desc_q", &b.q), ("desc_k", &b.k), ("desc_v", &b.v), ("desc_do", &b.d_o), ("desc_dk", &b.dk), ("desc_dv", &b.dv)] {
            assert_eq!(value(&main, name), ArgValue::Tensor(TensorArg::ragged(t).unwrap()), "{name}");
        }
        for list in [&pre, &main, &convert] {
            assert_eq!(value(list, "IS_VARLEN"), ArgValue::I32(1));
            assert_eq!(value(list, "CU_SEQLENS_Q"), ArgValue::Ptr(at(11)));
            assert_eq!(value(list, "N_TOKENS_Q"), ArgValue::I32(17));
        }
        assert_eq!(value(&main, "CU_SEQLENS_K"), ArgValue::Ptr(at(12)));
        assert_eq!((value(&pre, "stride_oz"), value(&pre, "stride_lz")), (ArgValue::I64(0), ArgValue::I64(0)));
        assert_eq!(value(&convert, "stride_dqz"), ArgValue::I64(0));
        // More rows than a ragged descriptor addresses: the backend's refusal, not a launch.
        let mut huge = packed_bwd(64, DType::F16);
        huge.q.sizes[2] = tma::RAGGED_ROWS + 1;
        let shape = AttnShape { varlen: shape.varlen, ..super::super::bwd::validate(&b).unwrap().0 };
        assert_eq!(
            bwd_inputs(&huge, &shape),
            Err(Unsupported::Tma { tensor: "q", problem: TmaProblem::TooManyTokens { tokens: tma::RAGGED_ROWS + 1 } })
        );
    }

    #[test]
    fn backward_inputs_and_workspace() {
        let mut p = bwd(128, DType::BF16);
        let (shape, _) = super::super::bwd::validate(&p).unwrap();
        let g = bwd_inputs(&p, &shape).unwrap();
        // SQ_PAD = 384; B·Hq·SQ_PAD·(128 + 2)·4.
        assert_eq!(g.sq_pad, 384);
        assert_eq!(g.workspace_bytes, B * HQ * 384 * 130 * 4);
        assert_eq!(g.workspace_rows, B * HQ * 384);
        assert_eq!(workspace_bytes(&shape, 64), Ok(B * HQ * 384 * 66 * 4));
        assert_eq!(workspace_bytes(&shape, 0), Ok(B * HQ * 384 * 2 * 4), "no dQ accumulator");
        assert_eq!(bwd_check(&p), Err(Unsupported::NoWorkspace { needed: g.workspace_bytes }));
        p.workspace = Some(Workspace { ptr: 0x10000000, bytes: g.workspace_bytes - 1 });
        assert_eq!(bwd_check(&p), Err(Unsupported::WorkspaceTooSmall { needed: g.workspace_bytes, given: g.workspace_bytes - 1 }));
        p.workspace = Some(Workspace { ptr: 0x10000000, bytes: g.workspace_bytes });
        assert_eq!(bwd_check(&p), Ok(g));
        // The workspace layout: dq_acc, then lse2, then delta2.
        let ws = p.workspace.unwrap();
        let rows = B * HQ * 384;
        let delta2 = ws.ptr + rows * 128 * 4 + rows * 4;
        assert_eq!(workspace_views(&ws, &g), Ok((ws.ptr, ws.ptr + rows * 128 * 4, delta2, delta2 + rows * 4)));
        // Head dims above 128: the bucket 256 (bwd_wide.py), whose dQ has its own kernel, so the
        // workspace holds no dQ accumulator (above 256 the Gluon backend refuses the call: the
        // portable kernels serve it).
        let p = bwd(200, DType::BF16);
        let (shape, _) = super::super::bwd::validate(&p).unwrap();
        let g = bwd_inputs(&p, &shape).unwrap();
        assert_eq!((g.bucket, g.bucket_axis, g.separate_dq), (256, "256", true));
        assert_eq!(g.workspace_bytes, B * HQ * 384 * 2 * 4);
        let mut p = bwd(128, DType::BF16);
        p.dk.strides[2] = 136;
        p.dk.strides[1] = 136 * SK as i64;
        p.dk.strides[0] = 136 * SK as i64 * HK as i64;
        let (shape, _) = super::super::bwd::validate(&p).unwrap();
        assert!(bwd_inputs(&p, &shape).is_ok(), "a padded row stride of 272 bytes is fine");
        p.dk.strides[2] = 132;
        p.dk.strides[1] = 132 * SK as i64;
        p.dk.strides[0] = 132 * SK as i64 * HK as i64;
        let (shape, _) = super::super::bwd::validate(&p).unwrap();
        assert!(matches!(bwd_inputs(&p, &shape), Err(Unsupported::Tma { tensor: "dk", .. })));
        let mut p = bwd(64, DType::F16);
        p.delta.ptr += 4;
        let (shape, _) = super::super::bwd::validate(&p).unwrap();
        assert_eq!(bwd_inputs(&p, &shape), Err(Unsupported::Misaligned { tensor: "delta", ptr: at(7) + 4 }));
        // Dropout is served, the main kernel's dropout axis and group follow the packing group.
        let mut p = bwd(64, DType::F16);
        p.dropout = Some(Dropout::new(0.2, 0x1000, 0x2000));
        let (shape, mask) = super::super::bwd::validate(&p).unwrap();
        let g = bwd_inputs(&p, &shape).unwrap();
        assert_eq!(bwd_axes(&g, &shape, false, true).1.as_slice().unwrap()[3], ("dropout", "true"));
        p.workspace = Some(Workspace { ptr: 0x10000000, bytes: g.workspace_bytes });
        let BwdArgs { main, .. } = bwd_args(&p, &shape, &mask, &g, &p.workspace.unwrap()).unwrap();
        let names: Vec<_> = main.args().unwrap().iter().map(|(n, _)| *n).collect();
        let at = names.iter().position(|n| *n == "STORE_VARLEN_STATUS").unwrap();
        assert_eq!(
            names[at + 1..],
            ["DROPOUT_THRESHOLD", "dropout_scale", "PHILOX_SEED", "PHILOX_OFFSET", "philox_offset_base", "HEAD_SPLIT", "DKV_PARTIALS"]
        );
    }

    #[test]
    fn long_gqa_walks_split_the_group_and_size_the_partials() {
        let (shape, _) = super::super::bwd::validate(&bwd(128, DType::BF16)).unwrap();
        let gqa = |hq: u64, hk: u64, sq: u64| AttnShape { heads_q: hq, heads_k: hk, seqlen_q: sq, seqlen_k: sq, ..shape };
        // G · Sq from HEAD_SPLIT_MIN_GROUP_ROWS up, G >= 4, the bucket 128, fixed-length batches.
        assert_eq!(head_split(&gqa(64, 8, 8192), 128), HEAD_SPLIT);
        assert_eq!(head_split(&gqa(28, 4, 16384), 128), HEAD_SPLIT, "an odd group splits 4 + 3");
        assert_eq!(head_split(&gqa(32, 8, 16384), 128), HEAD_SPLIT);
        assert_eq!(head_split(&gqa(32, 8, 8192), 128), HEAD_SPLIT);
        assert_eq!(head_split(&gqa(28, 4, 4096), 128), HEAD_SPLIT, "G · Sq = 28672");
        assert_eq!(head_split(&gqa(32, 8, 4096), 128), 1, "G · Sq = 16384: below the threshold");
        assert_eq!(head_split(&gqa(28, 4, 2048), 128), 1);
        assert_eq!(head_split(&gqa(16, 8, 1 << 20), 128), 1, "groups of 2 are not split");
        assert_eq!(head_split(&gqa(64, 8, 16384), 64), 1, "measured at the bucket 128 only");
        assert_eq!(head_split(&gqa(64, 8, u64::MAX), 128), HEAD_SPLIT, "G · Sq saturates");
        // The workspace grows by the partials, which follow delta2.
        let mut p = bwd(128, DType::BF16);
        let (hq, hk, s) = (64, 8, 8192);
        let t = |i, h| TensorView::contiguous(at(i), [1, h, s, 128], DType::BF16);
        let rows = |i| TensorView::contiguous(at(i), [1, hq, s], DType::F32);
        p = BwdParams { q: t(1, hq), k: t(2, hk), v: t(3, hk), o: t(4, hq), d_o: t(5, hq), lse: rows(6), delta: rows(7), dq: t(8, hq), dk: t(9, hk), dv: t(10, hk), ..p };
        let (shape, mask) = super::super::bwd::validate(&p).unwrap();
        let g = bwd_inputs(&p, &shape).unwrap();
        assert_eq!(g.head_split, HEAD_SPLIT);
        let rows = hq * s;
        let partials = HEAD_SPLIT * 2 * hk * s * 128 * 4;
        assert_eq!(g.workspace_bytes, rows * 130 * 4 + partials);
        let ws = Workspace { ptr: 0x10000000, bytes: g.workspace_bytes };
        let (_, _, delta2, at_partials) = workspace_views(&ws, &g).unwrap();
        assert_eq!((delta2 + rows * 4, at_partials + partials), (at_partials, ws.ptr + ws.bytes));
        let BwdArgs { main, dkdv, .. } = bwd_args(&p, &shape, &mask, &g, &ws).unwrap();
        let value = |list: &ArgList, name: &str| list.args().unwrap().iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        assert_eq!(value(&main, "HEAD_SPLIT"), Some(ArgValue::I32(HEAD_SPLIT as i32)));
        assert_eq!(value(&main, "DKV_PARTIALS"), Some(ArgValue::Ptr(at_partials)));
        assert_eq!(value(&dkdv, "DKV_PARTIALS"), Some(ArgValue::Ptr(at_partials)));
        assert_eq!(value(&dkdv, "N_CTX_K"), Some(ArgValue::I32(s as i32)));
        assert_eq!(value(&dkdv, "stride_dkn"), Some(ArgValue::I32(128)));
        // Four kernels with the split, three without.
        let call = BwdCall::new(&p, &shape, &mask, &g, &ws).unwrap();
        let [pre, main, convert, _, dkdv] = call.requests().unwrap();
        assert_eq!(bwd_kernels(&g, &[&pre, &main, &convert, &dkdv]).len(), 4);
        assert_eq!(bwd_kernels(&GluonShape { head_split: 1, ..g }, &[&pre, &main, &convert, &dkdv]).len(), 3);
        // A packed batch is not split.
        let (packed, _) = super::super::bwd::validate(&packed_bwd(128, DType::BF16)).unwrap();
        assert!(packed.varlen.is_some());
        assert_eq!(head_split(&AttnShape { heads_q: 64, heads_k: 8, seqlen_q: 1 << 16, ..packed }, 128), 1);
    }

    /// The review's F5 call: B = Hq = 65535, Sq = 2^24, 16-byte strides; every tensor TMA can
    /// address, the workspace cannot.
    fn huge_workspace() -> BwdParams<'static> {
        let (b, hq, sq, sk) = (65535, 65535, 1 << 24, 128);
        let t = |i, h, s| TensorView::new(at(i), [b, h, s, 8], [8, 8, 8, 1], DType::F16);
        let rows = |i| TensorView::new(at(i), [b, hq, sq], [4, 4, 1], DType::F32);
        let (q, kv) = (|i| t(i, hq, sq), |i| t(i, 1, sk));
        BwdParams::new(q(1), kv(2), kv(3), q(4), q(5), rows(6), rows(7), q(8), kv(9), kv(10))
    }

    #[test]
    fn a_workspace_too_large_to_size_is_a_reason_not_a_panic() {
        use crate::driver::Stream;
        use crate::flash::{attn_bwd, attn_bwd_workspace_bytes};
        // Through the API (validation may refuse these overlapping outputs first; either way
        // an error, no panic; forced, so that nothing could be launched).
        let mut p = huge_workspace();
        p.backend = Backend::Gluon;
        assert!(attn_bwd(&p, Stream::null()).is_err());
        assert!(attn_bwd_workspace_bytes(&p, Stream::null()).is_err());
        // The same sizes given to the backend rule directly.
        let p = bwd(64, DType::F16);
        let (shape, _) = super::super::bwd::validate(&p).unwrap();
        let huge = AttnShape { batch: 65535, heads_q: 65535, seqlen_q: 1 << 24, ..shape };
        assert!(matches!(bwd_inputs(&p, &huge), Err(Unsupported::Tma { tensor: "workspace", .. })));
        let err = select_by_inputs(Backend::Gluon, || bwd_inputs(&p, &huge)).unwrap_err().error("attn_bwd", None);
        assert_eq!(err.kind(), ErrorKind::UnsupportedByBackend);
        assert_eq!(select_by_inputs(Backend::Auto, || bwd_inputs(&p, &huge)), Ok(None), "Auto falls back");
        // Past the rows' TMA bound, the size itself overflows 64 bits.
        assert_eq!(workspace_bytes(&huge, 64), Err(Unsupported::WorkspaceTooLarge));
        let end = AttnShape { batch: 65535, heads_q: 65535, seqlen_q: 1 << 29, ..shape };
        assert_eq!(workspace_bytes(&end, 128), Err(Unsupported::WorkspaceTooLarge));
    }

    #[test]
    fn a_workspace_that_wraps_the_address_space_is_refused() {
        use crate::driver::Stream;
        use crate::flash::attn_bwd;
        let mut p = bwd(64, DType::F16);
        p.backend = Backend::Gluon;
        p.workspace = Some(Workspace { ptr: u64::MAX - 15, bytes: 1 << 30 });
        let err = attn_bwd(&p, Stream::null()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
        assert!(err.message().starts_with("workspace"), "{err}");
        // The views' addresses, should a workspace reach them unvalidated.
        let (shape, _) = super::super::bwd::validate(&bwd(64, DType::F16)).unwrap();
        let g = bwd_inputs(&p, &shape).unwrap();
        let err = workspace_views(&Workspace { ptr: u64::MAX - 15, bytes: g.workspace_bytes }, &g).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
    }

    #[test]
    fn kernel_metadata_cannot_overflow_a_grid() {
        // CTAS_PER_SM is archive metadata: SMs × CTAS_PER_SM saturates (more slots than tiles).
        let greedy = [("BLOCK_M", 128), ("PERSISTENT", 1), ("CTAS_PER_SM", i64::MAX)];
        assert_eq!(grid_of(&greedy, 4096, 16, 4), Ok([2048, 1, 1]));
        // One-row blocks over 2^30 rows of 65535 × 65535 heads: 2^62 tiles, past the x limit.
        let err = grid_of(&[("BLOCK_M", 1), ("PERSISTENT", 1), ("CTAS_PER_SM", i64::MAX)], 1 << 30, 65535, 65535).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TooLarge);
        assert!(err.message().starts_with("attn_fwd_gluon: launch grid"), "{err}");
        let err = grid_of(&[("BLOCK_M", 1)], 1 << 30, 65536, 1).unwrap_err();
        assert!(err.message().contains("y = 65536"), "{err}");
    }

    #[test]
    fn the_auto_rule_and_forced_backends() {
        let good = || fwd_check(&fwd(128, DType::BF16));
        let bad = || fwd_check(&fwd(128, DType::F32));
        assert_eq!(select_by_inputs(Backend::Portable, good), Ok(None));
        assert!(select_by_inputs(Backend::Auto, good).unwrap().is_some());
        assert_eq!(select_by_inputs(Backend::Auto, bad), Ok(None));
        assert!(select_by_inputs(Backend::Gluon, good).unwrap().is_some());
        assert_eq!(select_by_inputs(Backend::Gluon, bad), Err(Unsupported::DType(DType::F32)));
        // The device: sm_90 with the functionals, else Portable (Auto) or an error (forced).
        assert_eq!(device_supported("sm_90"), Ok(()));
        assert_eq!(device_supported("sm_80"), Err(Unsupported::Arch));
        assert_eq!(device_supported("gfx942"), Err(Unsupported::Arch));
        let ready = |arch, portable_faster| device_supported(arch).map(|()| portable_faster);
        assert_eq!(select_by_device(Backend::Auto, ready("sm_90", false)), Ok(true));
        assert_eq!(select_by_device(Backend::Auto, ready("sm_80", false)), Ok(false));
        assert_eq!(select_by_device(Backend::Gluon, ready("sm_80", false)), Err(Unsupported::Arch));
        // The tuning database's portable cells move Auto, never a forced backend.
        assert_eq!(select_by_device(Backend::Auto, ready("sm_90", true)), Ok(false));
        assert_eq!(select_by_device(Backend::Gluon, ready("sm_90", true)), Ok(true));
        let missing = Err(Unsupported::NotCompiled { family: FWD_FAMILY });
        assert_eq!(select_by_device(Backend::Auto, missing), Ok(false));
        assert_eq!(select_by_device(Backend::Gluon, missing), missing.map(|_| false));
    }

    #[test]
    fn forced_errors_name_the_reason() {
        let device = DeviceInfo {
            runtime: Runtime::Cuda,
            ordinal: 1,
            arch: "sm_80".into(),
            target_id: "sm_80".into(),
            multiprocessors: 108,
            max_shared: 166_912,
            warp_size: 32,
        };
        let err = Unsupported::Arch.error("attn_fwd", Some(&device));
        assert_eq!(err.kind(), ErrorKind::UnsupportedByBackend);
        assert!(err.message().contains("sm_90") && err.message().contains("device 1 is sm_80"), "{err}");
        let err = Unsupported::WorkspaceTooSmall { needed: 100, given: 50 }.error("attn_bwd", None);
        assert!(err.message().contains("100 bytes") && err.message().contains("50 were given"), "{err}");
        let err = Unsupported::Tma { tensor: "k", problem: TmaProblem::StrideNotMultiple16 { dim: 2, bytes: 72 } }.error("attn_fwd", None);
        assert!(err.message().starts_with("attn_fwd: the Gluon backend cannot serve this call: k: strides[2] is 72 bytes"), "{err}");
        for why in [
            Unsupported::Bias,
            Unsupported::HeadDim { head_dim: 264, max: 256 },
            Unsupported::HeadDimV { head_dim: 192, head_dim_v: 128 },
        ] {
            assert!(!why.to_string().is_empty());
        }
    }

    fn no_driver() -> bool {
        // SAFETY: only probes whether the driver library can be opened.
        !crate::driver::library_present(Runtime::Cuda)
    }

    #[test]
    fn forced_backends_fail_before_the_driver() {
        use crate::driver::Stream;
        use crate::flash::{attn_bwd, attn_bwd_workspace_bytes, attn_fwd};
        let kind = |r: Result<()>| r.unwrap_err().kind();
        let mut p = fwd(64, DType::F32);
        p.backend = Backend::Gluon;
        let err = attn_fwd(&p, Stream::null()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnsupportedByBackend);
        assert!(err.message().contains("fp16 or bf16") && err.message().contains("fp32"), "{err}");
        let mut p = fwd(64, DType::F16);
        p.backend = Backend::Gluon;
        p.bias = Some(TensorView::contiguous(0x1000, [B, HQ, SQ, SK], DType::F16));
        assert_eq!(kind(attn_fwd(&p, Stream::null())), ErrorKind::UnsupportedByBackend);
        // Validation still comes first.
        p.q.ptr = 0;
        assert_eq!(kind(attn_fwd(&p, Stream::null())), ErrorKind::NullPointer);

        let mut g = bwd(64, DType::BF16);
        g.backend = Backend::Gluon;
        let err = attn_bwd(&g, Stream::null()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnsupportedByBackend);
        assert!(err.message().contains("workspace"), "{err}");
        g.workspace = Some(Workspace { ptr: 0x10000000, bytes: 100 });
        assert!(attn_bwd(&g, Stream::null()).unwrap_err().message().contains("100 were given"));
        g.workspace = Some(Workspace { ptr: 0, bytes: 1 << 30 });
        assert_eq!(kind(attn_bwd(&g, Stream::null())), ErrorKind::NullPointer);
        g.workspace = Some(Workspace { ptr: 0x10000008, bytes: 1 << 30 });
        assert_eq!(kind(attn_bwd(&g, Stream::null())), ErrorKind::MisalignedPointer);
        let mut g = bwd(128, DType::F32);
        g.backend = Backend::Gluon;
        assert_eq!(attn_bwd_workspace_bytes(&g, Stream::null()).unwrap_err().kind(), ErrorKind::UnsupportedByBackend);
        // Calls that need no device answer without one.
        g.backend = Backend::Portable;
        assert_eq!(attn_bwd_workspace_bytes(&g, Stream::null()), Ok(0));
        g.backend = Backend::Auto;
        assert_eq!(attn_bwd_workspace_bytes(&g, Stream::null()), Ok(0), "fp32 is portable-only");
        if no_driver() {
            let g = bwd(64, DType::BF16);
            assert_eq!(attn_bwd_workspace_bytes(&g, Stream::null()).unwrap_err().kind(), ErrorKind::NoDriver);
            let mut p = fwd(64, DType::F16);
            p.backend = Backend::Gluon;
            assert_eq!(kind(attn_fwd(&p, Stream::null())), ErrorKind::NoDriver, "eligible inputs reach the driver");
        }
    }

    #[test]
    fn axes_match_the_rules() {
        let g = fwd_check(&fwd(96, DType::BF16)).unwrap();
        let (shape, _) = super::super::fwd::validate(&fwd(96, DType::BF16)).unwrap();
        assert_eq!(fwd_axes(&g, &shape, false).as_slice().unwrap(), &[("dtype", "bf16"), ("head_dim", "128")]);
        assert_eq!(fwd_axes(&g, &shape, true).as_slice().unwrap(), &[("dtype", "bf16"), ("head_dim", "128"), ("dropout", "true")]);
        let (common, main) = bwd_axes(&g, &shape, true, false);
        assert_eq!(common.as_slice().unwrap(), &[("dtype", "bf16"), ("head_dim", "128")]);
        assert_eq!(main.as_slice().unwrap(), &[("dtype", "bf16"), ("head_dim", "128"), ("dq", "false")]);
        assert_eq!(bwd_axes(&g, &shape, false, false).1.as_slice().unwrap()[2], ("dq", "true"));
    }

    #[test]
    fn dropout_forward_is_served_when_forced() {
        let mut p = fwd(128, DType::BF16);
        p.dropout = Some(Dropout { offset_base: 5, seed_out: 0x3000, offset_out: 0x3008, ..Dropout::new(0.25, 0x1000, 0x2000) });
        // Served by the inputs, masked or not (Auto takes it too: since the causal dropout forward runs
        // one loop where a CTA meets the diagonal, it measured faster than the portable one).
        assert!(fwd_check(&p).is_ok());
        p.mask = Mask::causal(MaskAlign::BottomRight);
        assert!(fwd_check(&p).is_ok());
        // The portable forward's dropout group, after the packing group (ABI.md).
        let (shape, mask) = super::super::fwd::validate(&p).unwrap();
        let args = fwd_args(&p, &shape, &mask).unwrap();
        let names: Vec<_> = args.args().unwrap().iter().map(|(n, _)| *n).collect();
        let at = names.iter().position(|n| *n == "STORE_VARLEN_STATUS").unwrap();
        assert_eq!(
            names[at + 1..],
            ["DROPOUT_THRESHOLD", "dropout_scale", "PHILOX_SEED", "PHILOX_OFFSET", "philox_offset_base", "PHILOX_SEED_OUT", "PHILOX_OFFSET_OUT", "STORE_PHILOX"]
        );
        let value = |n: &str| args.args().unwrap().iter().find(|(k, _)| *k == n).unwrap().1;
        assert_eq!(value("DROPOUT_THRESHOLD"), ArgValue::U32(1 << 14)); // ⌊0.25·2¹⁶⌋
        assert_eq!((value("PHILOX_SEED"), value("philox_offset_base"), value("STORE_PHILOX")), (ArgValue::Ptr(0x1000), ArgValue::I64(5), ArgValue::I32(1)));
        // Without dropout the group is neutral.
        p.dropout = None;
        let args = fwd_args(&p, &shape, &mask).unwrap();
        let value = |n: &str| args.args().unwrap().iter().find(|(k, _)| *k == n).unwrap().1;
        assert_eq!((value("DROPOUT_THRESHOLD"), value("PHILOX_SEED"), value("STORE_PHILOX")), (ArgValue::U32(0), ArgValue::Ptr(0), ArgValue::I32(0)));
    }

    #[test]
    fn argument_lists_follow_the_abi() {
        let mut p = bwd(64, DType::F16);
        let (shape, mask) = super::super::bwd::validate(&p).unwrap();
        let g = bwd_inputs(&p, &shape).unwrap();
        p.workspace = Some(Workspace { ptr: 0x10000000, bytes: g.workspace_bytes });
        let BwdArgs { pre, main, convert, .. } = bwd_args(&p, &shape, &mask, &g, &p.workspace.unwrap()).unwrap();
        let names = |l: &ArgList| l.args().unwrap().iter().map(|(n, _)| *n).collect::<Vec<_>>();
        assert_eq!(names(&main)[..9], ["desc_q", "desc_k", "desc_v", "desc_do", "desc_dk", "desc_dv", "desc_dq_acc", "desc_lse2", "desc_delta2"]);
        let value = |l: &ArgList, n: &str| l.args().unwrap().iter().find(|(k, _)| *k == n).unwrap().1;
        let rows = B * HQ * 384;
        let ArgValue::Tensor(acc) = value(&main, "desc_dq_acc") else { panic!() };
        assert_eq!((acc.rank, acc.sizes(), acc.dtype), (2, &[rows, 64][..], DType::F32));
        let ArgValue::Tensor(lse2) = value(&main, "desc_lse2") else { panic!() };
        assert_eq!((lse2.ptr, lse2.sizes()), (0x10000000 + rows * 64 * 4, &[rows / 64, 64][..]));
        assert_eq!(value(&pre, "ZERO_DQ_ACC"), ArgValue::I32(1));
        assert_eq!(value(&pre, "SQ_PAD"), ArgValue::I32(384));
        assert_eq!(value(&convert, "DQ"), ArgValue::Ptr(p.dq.ptr));
        // Deterministic: no dQ accumulator; lse2 first, the unused dQ descriptor over the
        // workspace itself ([2·rows / 64, 64] fp32 = the rows·2·4 bytes of lse2 and delta2).
        p.deterministic = true;
        let g = bwd_inputs(&p, &shape).unwrap();
        assert_eq!((g.separate_dq, g.workspace_bytes), (true, rows * 2 * 4));
        let ws = Workspace { ptr: 0x10000000, bytes: g.workspace_bytes };
        let BwdArgs { pre, main, dq, .. } = bwd_args(&p, &shape, &mask, &g, &ws).unwrap();
        assert_eq!(value(&pre, "ZERO_DQ_ACC"), ArgValue::I32(0));
        assert_eq!(value(&pre, "LSE2"), ArgValue::Ptr(ws.ptr));
        // attn_bwd_gluon_dq (ABI.md): Q's, K's, V's, dO's and dQ's descriptors, the workspace's lse2
        // and delta2 rows, then the forward's scalars.
        assert_eq!(names(&dq)[..8], ["desc_q", "desc_k", "desc_v", "desc_do", "desc_dq", "LSE2", "DELTA2", "sm_scale"]);
        assert_eq!(value(&dq, "desc_dq"), ArgValue::Tensor(TensorArg::from_view(&p.dq)));
        assert_eq!((value(&dq, "LSE2"), value(&dq, "DELTA2")), (ArgValue::Ptr(ws.ptr), ArgValue::Ptr(ws.ptr + rows * 4)));
        assert_eq!((value(&dq, "SQ_PAD"), value(&dq, "GQA_GROUP")), (ArgValue::I32(384), ArgValue::I32((HQ / HK) as i32)));
        assert_eq!((value(&dq, "IS_VARLEN"), value(&dq, "DROPOUT_THRESHOLD")), (ArgValue::I32(0), ArgValue::U32(0)));
        let ArgValue::Tensor(acc) = value(&main, "desc_dq_acc") else { panic!() };
        assert_eq!((acc.ptr, acc.sizes()), (ws.ptr, &[rows * 2 / 64, 64][..]));
        assert_eq!(rows * 2 / 64 * 64 * 4, ws.bytes, "the descriptor covers the workspace exactly");
        let ArgValue::Tensor(delta2) = value(&main, "desc_delta2") else { panic!() };
        assert_eq!(delta2.ptr + rows * 4, ws.ptr + ws.bytes, "delta2 ends the workspace");
        let f = fwd(128, DType::BF16);
        let (shape, mask) = super::super::fwd::validate(&f).unwrap();
        let args = fwd_args(&f, &shape, &mask).unwrap();
        assert_eq!(names(&args)[..4], ["desc_q", "desc_k", "desc_v", "desc_o"]);
        assert_eq!(value(&args, "GQA_GROUP"), ArgValue::I32(4));
    }

    /// The host side of the launch path of both operators and both backends, up to the driver:
    /// validation, functional keys, argument lists, the archive lookup, the kernel choice.
    fn host_side(arch: &str) {
        use crate::dispatch::{find_functional, fitting_kernels};
        let loaded = crate::images::archive_for(arch).unwrap();
        let mut p = fwd(128, DType::BF16);
        p.mask = Mask::causal(MaskAlign::TopLeft);
        let (shape, mask) = super::super::fwd::validate(&p).unwrap();
        let axes = super::super::fwd::functional_axes(&p, &shape);
        let args = super::super::fwd::kernel_args(&p, &shape, &mask).unwrap();
        let request = Request { family: "attn_fwd", axes: axes.as_slice().unwrap(), args: args.args().unwrap() };
        let functional = &loaded.archive.functionals()[find_functional(&loaded, &request).unwrap()];
        let fitting = fitting_kernels(functional, request.args).unwrap();
        let device = DeviceInfo {
            runtime: Runtime::Cuda,
            ordinal: 0,
            arch: String::new(),
            target_id: String::new(),
            multiprocessors: 132,
            max_shared: 232_448,
            warp_size: 32,
        };
        super::super::fwd::choose_kernel(functional, fitting, &shape, super::super::tuning_key(&shape, &mask), &device);
        let g = select_by_inputs(Backend::Auto, || fwd_inputs(&p, &shape)).unwrap().unwrap();
        fwd_args(&p, &shape, &mask).unwrap().args().unwrap();
        let _ = loaded.archive.find(FWD_FAMILY, fwd_axes(&g, &shape, false).as_slice().unwrap());

        let mut p = bwd(64, DType::F16);
        p.workspace = Some(Workspace { ptr: 0x10000000, bytes: 1 << 30 });
        let (shape, mask) = super::super::bwd::validate(&p).unwrap();
        super::super::bwd::preprocess_args(&p, &shape).unwrap().args().unwrap();
        let args = super::super::bwd::kernel_args(&p, &shape, &mask).unwrap();
        let features = [("dropout", false), ("bias", false)];
        let axes = crate::flash::axes(p.q.dtype, false, &shape, &features);
        let request = Request { family: "attn_bwd_dkdv", axes: axes.as_slice().unwrap(), args: args.args().unwrap() };
        let functional = &loaded.archive.functionals()[find_functional(&loaded, &request).unwrap()];
        super::super::bwd::choose_kernel(
            functional,
            fitting_kernels(functional, request.args).unwrap(),
            super::super::tuning_key(&shape, &mask),
        );
        let g = bwd_inputs(&p, &shape).unwrap();
        check_workspace(p.workspace, &g).unwrap();
        let BwdArgs { pre, main, convert, .. } = bwd_args(&p, &shape, &mask, &g, &p.workspace.unwrap()).unwrap();
        for list in [&pre, &main, &convert] {
            list.args().unwrap();
        }
        let (common, main) = bwd_axes(&g, &shape, false, false);
        common.as_slice().unwrap();
        main.as_slice().unwrap();
    }

    #[test]
    fn the_host_side_of_a_launch_allocates_nothing_after_warm_up() {
        let Some(arch) = crate::images::built_archs().first().copied() else {
            eprintln!("skipped: this build carries no kernels (AOTRITON_TARGET_ARCH=none)");
            return;
        };
        host_side(arch);
        let before = crate::alloc_count::allocations();
        for _ in 0..100 {
            host_side(arch);
        }
        assert_eq!(crate::alloc_count::allocations() - before, 0, "heap allocations on the launch path");
        let counted = Vec::<u8>::with_capacity(8);
        assert!(crate::alloc_count::allocations() > before, "the counter counts");
        drop(counted);
    }

    /// The short causal kernel (python/rules.py `SHORT_CAUSAL_MAX_SEQLEN_K`): compiled for hd128
    /// without dropout or packing, taken by a causal call with at most that many keys and by no other.
    #[test]
    fn short_causal_calls_take_the_one_consumer_forward() {
        use crate::dispatch::{TuningKey, fitting_kernels};
        use crate::archive::MaskKind;
        let Some(loaded) = built_archive() else { return };
        let p = fwd(128, DType::BF16);
        let (shape, mask) = super::super::fwd::validate(&p).unwrap();
        let g = fwd_inputs(&p, &shape).unwrap();
        let axes = fwd_axes(&g, &shape, false);
        let functional = &loaded.archive.functionals()[loaded.archive.find(FWD_FAMILY, axes.as_slice().unwrap()).unwrap()];
        let list = fwd_args(&p, &shape, &mask).unwrap();
        let fitting = fitting_kernels(functional, list.args().unwrap()).unwrap();
        let limits: Vec<i64> = fitting.iter().map(|i| config(&functional.kernels[i], super::super::fwd::SHORT_CAUSAL_KEY, 0)).collect();
        let limit = *limits.iter().max().unwrap();
        assert!(limit > 0 && limits.contains(&0), "bf16 hd128: a short causal kernel beside the main one ({limits:?})");
        let device = super::super::fwd::tests::h100_like();
        let pick = |mask, seqlen| {
            let key = TuningKey { mask, seqlen_q: seqlen, seqlen_k: seqlen };
            let i = super::super::fwd::choose_kernel(functional, fitting, &shape, key, &device);
            config(&functional.kernels[i], super::super::fwd::SHORT_CAUSAL_KEY, 0)
        };
        assert_eq!(pick(MaskKind::Causal, 512), limit);
        assert_eq!(pick(MaskKind::Causal, limit as u64), limit);
        assert_eq!(pick(MaskKind::Causal, limit as u64 + 1), 0);
        assert_eq!(pick(MaskKind::None, 512), 0);
    }

    /// This build's sm_90 archive, or None with a visible "skipped" line.
    fn built_archive() -> Option<std::sync::Arc<crate::images::LoadedArchive>> {
        let Some(arch) = crate::images::built_archs().into_iter().find(|a| *a == ARCH) else {
            eprintln!("skipped: this build carries no {ARCH} kernels");
            return None;
        };
        Some(crate::images::archive_for(arch).unwrap())
    }

    /// Builds every Gluon functional's argument list the way `attn_fwd`/`attn_bwd` do and checks
    /// it against the compiled kernels' metadata (names, types, descriptor ranks and element
    /// sizes, the TMA encode parameters): the ABI contract, checked without a GPU.
    #[test]
    fn compiled_gluon_kernels_take_the_runtime_arguments() {
        use crate::dispatch::{fitting_kernels, plan_slots};
        let Some(loaded) = built_archive() else { return };
        let families = [FWD_FAMILY, BWD_PREPROCESS_FAMILY, BWD_FAMILY, BWD_DQ_CONVERT_FAMILY, BWD_DQ_FAMILY, BWD_DKDV_CONVERT_FAMILY];
        let functionals: Vec<_> = loaded.archive.functionals().iter().filter(|f| families.contains(&f.family.as_str())).collect();
        if functionals.is_empty() {
            eprintln!("skipped: the {ARCH} archive has no Gluon functionals ({families:?}) yet; add them to python/rules.py");
            return;
        }
        // The fused-dQ main kernels are compiled exactly where the dispatch asks for them
        // (python/rules.py's GLUON_FUSED_DQ_MAX_HEAD_DIM is FUSED_DQ_MAX_BUCKET): each dK/dV-only
        // kernel has its fused twin up to that bucket, none above it.
        let main_kernels: Vec<_> = functionals.iter().filter(|f| f.family == BWD_FAMILY).collect();
        for f in &main_kernels {
            let bucket: u64 = f.axes["head_dim"].parse().unwrap();
            let fused = f.axes["dq"] == "true";
            assert!(!fused || bucket <= FUSED_DQ_MAX_BUCKET, "{}: compiled but never launched", f.display_name());
            let twin = main_kernels.iter().any(|t| {
                t.axes.iter().all(|(k, v)| if k == "dq" { *v == "true" } else { f.axes.get(k) == Some(v) })
            });
            assert!(fused || twin == (bucket <= FUSED_DQ_MAX_BUCKET), "{}: fused twin {twin}", f.display_name());
        }
        for f in functionals {
            let dtype = match f.axes["dtype"].as_str() {
                "fp16" => DType::F16,
                "bf16" => DType::BF16,
                other => panic!("{}: dtype {other}", f.display_name()),
            };
            let d: u64 = f.axes["head_dim"].parse().unwrap();
            // attn_bwd_gluon_dq serves the calls whose dQ has its own kernel: the deterministic mode at any bucket.
            let deterministic = f.axes.get("dq").is_some_and(|v| v == "false") || f.family == BWD_DQ_FAMILY;
            let packed = f.axes.get("varlen").is_some_and(|v| v == "true");
            let dropout = f.axes.get("dropout").is_some_and(|v| v == "true");
            let mut fp = if packed { packed_fwd(d, dtype) } else { fwd(d, dtype) };
            fp.mask = Mask::causal(MaskAlign::BottomRight);
            if dropout {
                fp.dropout = Some(Dropout { seed_out: 0x3000, offset_out: 0x3008, ..Dropout::new(0.1, 0x1000, 0x2000) });
            }
            let mut bp = if packed { packed_bwd(d, dtype) } else { bwd(d, dtype) };
            bp.deterministic = deterministic;
            if dropout {
                bp.dropout = Some(Dropout::new(0.1, 0x1000, 0x2000));
            }
            let list = if f.family == FWD_FAMILY {
                let (shape, mask) = super::super::fwd::validate(&fp).unwrap();
                let g = fwd_inputs(&fp, &shape).unwrap();
                assert_eq!(g.bucket_axis, f.axes["head_dim"]);
                let mut ours = fwd_axes(&g, &shape, dropout).as_slice().unwrap().to_vec();
                ours.sort();
                assert_eq!(ours, f.axes.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect::<Vec<_>>(), "{}", f.display_name());
                fwd_args(&fp, &shape, &mask).unwrap()
            } else {
                let (shape, mask) = super::super::bwd::validate(&bp).unwrap();
                let g = bwd_inputs(&bp, &shape).unwrap();
                assert_eq!(g.bucket_axis, f.axes["head_dim"]);
                bp.workspace = Some(Workspace { ptr: 0x10000000, bytes: g.workspace_bytes });
                if f.family == BWD_FAMILY {
                    let (_, main_axes) = bwd_axes(&g, &shape, deterministic, dropout);
                    let mut ours = main_axes.as_slice().unwrap().to_vec();
                    ours.sort();
                    assert_eq!(ours, f.axes.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect::<Vec<_>>(), "{}", f.display_name());
                }
                if f.family == BWD_DQ_FAMILY {
                    let call = BwdCall::new(&bp, &shape, &mask, &g, &bp.workspace.unwrap()).unwrap();
                    let mut ours = call.requests().unwrap()[3].axes.to_vec();
                    ours.sort();
                    assert_eq!(ours, f.axes.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect::<Vec<_>>(), "{}", f.display_name());
                }
                let BwdArgs { pre, main, convert, dq, dkdv } = bwd_args(&bp, &shape, &mask, &g, &bp.workspace.unwrap()).unwrap();
                match f.family.as_str() {
                    BWD_PREPROCESS_FAMILY => pre,
                    BWD_FAMILY => main,
                    BWD_DQ_FAMILY => dq,
                    BWD_DKDV_CONVERT_FAMILY => dkdv,
                    _ => convert,
                }
            };
            let args = list.args().unwrap();
            let fitting = fitting_kernels(f, args).unwrap_or_else(|e| panic!("{}: {e}", f.display_name()));
            assert!(!fitting.is_empty(), "{}: no kernel fits aligned inputs", f.display_name());
            for kernel in &f.kernels {
                plan_slots(kernel, args).unwrap_or_else(|e| panic!("{}: {e}", f.display_name()));
                for a in &kernel.args {
                    if let Some(meta) = &a.tensordesc {
                        let (_, ArgValue::Tensor(t)) = args.iter().find(|(n, _)| *n == a.name).unwrap() else { unreachable!() };
                        tma::encode_params(t, meta).unwrap_or_else(|e| panic!("{} {}: {e}", kernel.id, a.name));
                    }
                }
            }
        }
    }
}
