//! `attn_fwd`: O = dropout(softmax(cap(sm_scale · Q·Kᵀ) + alibi + bias + mask)) · V, and optionally
//! the LSE (`cap`: the identity, or logit soft-capping with [`FwdParams::softcap`]; `alibi`: 0, or
//! the linear bias of [`FwdParams::alibi_slopes`]).
use super::gluon;
use super::{
    ATTENTION_INPUTS, AttnShape, Backend, Dropout, Mask, MaskArgs, ScoreModifiers, Varlen, axes, bias_args, check_qkv, check_rows,
    check_scalars, check_tensor, common_args, dropout_args, dropout_regions, mask_args, optional_input, strides3, strides4, varlen_regions,
};
use crate::archive::{Functional, MaskKind};
use crate::dispatch::{
    ArgList, ArgValue, Axes, KernelSet, Launcher, Request, TuningKey, config, heuristic_pool, preferred_variant,
};
use crate::driver::Stream;
use crate::driver::DeviceInfo;
use crate::error::Result;
use crate::tensor::{DType, Region, TensorView, check_no_aliasing};

/// Parameters of [`attn_fwd`]. Marked non-exhaustive so later versions can add fields: build it
/// with [`FwdParams::new`] and set the public fields you need.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct FwdParams<'a> {
    /// B×Hq×Sq×D, fp16, bf16 or fp32.
    pub q: TensorView<4>,
    /// B×Hk×Sk×D, same dtype as `q`; Hq must be a multiple of Hk.
    pub k: TensorView<4>,
    /// B×Hk×Sk×D, same dtype as `q`.
    pub v: TensorView<4>,
    /// B×Hq×Sq×D output, same dtype as `q`.
    pub o: TensorView<4>,
    /// B×Hq×Sq fp32 output, the log-sum-exp per query row (see the module docs); `None` when not
    /// wanted (the backward needs it).
    pub lse: Option<TensorView<3>>,
    /// Scale applied to Q·Kᵀ; `new` sets 1/√D.
    pub sm_scale: f32,
    /// Logit soft-capping (Gemma 2, Grok): each score s = sm_scale · q·k becomes
    /// `softcap · tanh(s / softcap)` before bias and mask. 0 (what `new` sets) is off; otherwise
    /// finite and positive, fp16/bf16 inputs without dropout, bias or ALiBi. The backward needs the
    /// same.
    pub softcap: f32,
    /// ALiBi (BLOOM, MPT): fp32 slopes, sizes [B or 1, Hq] (B: sequences of a packed batch; 1: the
    /// same slopes for every sequence). Query head h adds `-slope[h] · |i + off - j|` to score
    /// (i, j), after `softcap` and before the mask, with `off` the mask's diagonal: 0 when
    /// `mask.align` is top-left (as in [`Mask::NONE`]), Sk − Sq when bottom-right. FlashAttention
    /// measures from the bottom-right diagonal whether or not it masks: give such callers a
    /// bottom-right mask (unbounded windows for none). fp16/bf16 inputs without dropout, bias or
    /// softcap; the backward needs the same slopes (they get no gradient).
    pub alibi_slopes: Option<TensorView<2>>,
    /// Attention sinks (gpt-oss): fp32 logits, one per query head (sizes = Hq). Each row's softmax normaliser also
    /// counts `exp(sinks[h])` (a "key" with no value, compared with the scaled scores), so the
    /// row's probabilities sum to less than 1, and the LSE includes it; a row that sees no key
    /// gets O = 0 and LSE = `sinks[h]`. fp16/bf16 inputs without dropout, bias, softcap or ALiBi.
    /// The backward takes the same sinks and can return their gradient.
    pub sinks: Option<TensorView<1>>,
    /// Which keys each query sees; `new` sets [`Mask::NONE`].
    pub mask: Mask,
    /// Additive attention bias in the input dtype, sizes [B or 1, Hq or 1, Sq or 1, Sk]: a size
    /// of 1 broadcasts that dimension.
    pub bias: Option<TensorView<4>>,
    /// Dropout on the attention probabilities; the backward needs the same.
    pub dropout: Option<Dropout>,
    /// A packed batch of variable-length sequences.
    pub varlen: Option<Varlen<'a>>,
    /// fp32 inputs only: let the matrix products use TF32 (faster, ~10-bit mantissa). Off by
    /// default: fp32 is computed in IEEE fp32.
    pub allow_tf32: bool,
    /// Which kernel family serves the call; `new` sets [`Backend::Auto`] (see the module docs).
    pub backend: Backend,
}

impl<'a> FwdParams<'a> {
    /// Attention of `q` over `k`, `v` into `o` (and `lse` when given), with scale 1/√D, no mask,
    /// bias, dropout or packing, TF32 off and `Backend::Auto`.
    pub fn new(q: TensorView<4>, k: TensorView<4>, v: TensorView<4>, o: TensorView<4>, lse: Option<TensorView<3>>) -> Self {
        let head_dim = q.sizes[3].max(1) as f32;
        FwdParams {
            q,
            k,
            v,
            o,
            lse,
            sm_scale: 1.0 / head_dim.sqrt(),
            softcap: 0.0,
            alibi_slopes: None,
            sinks: None,
            mask: Mask::NONE,
            bias: None,
            dropout: None,
            varlen: None,
            allow_tf32: false,
            backend: Backend::Auto,
        }
    }
}

/// Enqueues the forward attention on `stream` (the device is the stream's). Returns once the
/// kernel is launched; nothing is launched when an argument is invalid, or when the forced
/// backend cannot serve the call (`UnsupportedByBackend`). After the first call with a given
/// configuration, a call allocates no host memory and never waits on the device.
pub fn attn_fwd(params: &FwdParams, stream: Stream) -> Result<()> {
    let (shape, mask) = validate(params)?;
    let key = super::tuning_key(&shape, &mask);
    let axes = functional_axes(params, &shape);
    let args = kernel_args(params, &shape, &mask)?;
    let request = Request { family: "attn_fwd", axes: axes.as_slice()?, args: args.args()? };
    let backend = params.backend;
    let gluon_inputs = gluon::select_by_inputs(backend, || gluon::fwd_inputs(params, &shape))
        .map_err(|why| why.error("attn_fwd", None))?;
    let launcher = Launcher::new(stream)?;
    if let Some(g) = gluon_inputs {
        let call = gluon::FwdCall::new(params, &shape, &mask, &g)?;
        let gluon_request = call.request()?;
        let ready = gluon::device_ready(&launcher, &[&gluon_request], key);
        if gluon::select_by_device(backend, ready).map_err(|why| why.error("attn_fwd", Some(launcher.device())))? {
            return gluon::launch_fwd(&launcher, &gluon_request, &shape, key);
        }
    }
    let kernel = launcher.prepare(
        &request,
        |functional, fitting, device| choose_kernel(functional, fitting, &shape, key, device),
        |meta| Ok([super::bwd::kernel_blocks(meta)(shape.seqlen_q, "BLOCK_M"), shape.heads_q, shape.batch]),
    )?;
    launcher.launch(&kernel)
}

pub(crate) fn functional_axes(p: &FwdParams, shape: &AttnShape) -> Axes {
    let mut axes = axes(p.q.dtype, p.allow_tf32, shape, &[("dropout", p.dropout.is_some()), ("bias", p.bias.is_some())]);
    score_modifiers(p).push_axes(&mut axes);
    // The sinks are the forward's axis only (the backward's kernels see them through the LSE).
    if p.sinks.is_some() {
        axes.push("sinks", crate::dispatch::bool_axis(true));
    }
    shape.push_head_dim_v(&mut axes);
    axes
}

pub(crate) fn score_modifiers<'p>(p: &'p FwdParams) -> ScoreModifiers<'p> {
    ScoreModifiers { softcap: p.softcap, alibi_slopes: p.alibi_slopes.as_ref(), sinks: p.sinks.as_ref() }
}

/// The kernel's arguments by name (python/kernels/flash/fwd.py). Order and types of the launch
/// come from each kernel's metadata, not from this list.
pub(crate) fn kernel_args(p: &FwdParams, shape: &AttnShape, mask: &MaskArgs) -> Result<ArgList> {
    use ArgValue::{F32, I32, Ptr};
    // An absent LSE is a null pointer the kernel never writes through (STORE_LSE = 0).
    let lse = p.lse.unwrap_or(TensorView::new(0, [0; 3], [0; 3], DType::F32));
    let mut args = ArgList::new();
    args.extend([
        ("Q", Ptr(p.q.ptr)),
        ("K", Ptr(p.k.ptr)),
        ("V", Ptr(p.v.ptr)),
        ("O", Ptr(p.o.ptr)),
        ("LSE", Ptr(lse.ptr)),
        ("sm_scale", F32(p.sm_scale)),
        ("STORE_LSE", I32(p.lse.is_some() as i32)),
    ]);
    args.extend(score_modifiers(p).args());
    args.extend([("SINKS", Ptr(p.sinks.map_or(0, |s| s.ptr)))]);
    args.extend(strides4(["stride_qz", "stride_qh", "stride_qm"], &p.q, shape));
    args.extend(strides4(["stride_kz", "stride_kh", "stride_kn"], &p.k, shape));
    args.extend(strides4(["stride_vz", "stride_vh", "stride_vn"], &p.v, shape));
    args.extend(strides4(["stride_oz", "stride_oh", "stride_om"], &p.o, shape));
    args.extend(strides3(["stride_lz", "stride_lh"], &lse, shape));
    bias_args(&mut args, p.bias.as_ref(), shape, p.q.dtype)?;
    args.extend(common_args(shape, mask));
    dropout_args(&mut args, p.dropout.as_ref(), true)?;
    Ok(args)
}

/// The config key of a kernel that serves only causal (or windowed) calls with at most this many
/// keys (python/rules.py `SHORT_CAUSAL_MAX_SEQLEN_K`: the Gluon forward's short causal kernel).
pub(crate) const SHORT_CAUSAL_KEY: &str = "SHORT_CAUSAL_MAX_SEQLEN_K";

/// The forward's config choice (python/rules.py, "Runtime choice"): among the kernels whose
/// alignment hints fit, prefer the `aligned` variant; then the kernel the tuning database picked
/// for the call's cell ([`TuningKey::tuned`]); then a kernel for short causal calls
/// ([`SHORT_CAUSAL_KEY`]) where the call is one, such kernels being left out otherwise; else the
/// documented heuristic: the largest BLOCK_M whose grid cdiv(Sq, BLOCK_M)·Hq·B gives every
/// multiprocessor at least one program, or else the smallest BLOCK_M (more, smaller programs for
/// small problems).
pub(crate) fn choose_kernel(
    functional: &Functional,
    fitting: KernelSet,
    shape: &AttnShape,
    key: TuningKey,
    device: &DeviceInfo,
) -> usize {
    let block_m = |i: usize| config(&functional.kernels[i], "BLOCK_M", 1).max(1) as u64;
    let pool = preferred_variant(functional, fitting);
    if let Some(tuned) = key.tuned(functional, &pool) {
        return tuned;
    }
    let mut pool = heuristic_pool(functional, pool);
    let short_causal_limit = |i: usize| config(&functional.kernels[i], SHORT_CAUSAL_KEY, 0).max(0) as u64;
    if key.mask == MaskKind::Causal {
        if let Some(short) = pool.iter().find(|&i| short_causal_limit(i) > 0 && key.seqlen_k <= short_causal_limit(i)) {
            return short;
        }
    }
    let mut general = pool;
    general.retain(|i| short_causal_limit(i) == 0);
    if !general.is_empty() {
        pool = general;
    }
    let programs = |i: usize| shape.seqlen_q.div_ceil(block_m(i)) * shape.heads_q * shape.batch;
    let filling = pool.iter().filter(|&i| programs(i) >= device.multiprocessors as u64);
    filling
        .max_by_key(|&i| (block_m(i), std::cmp::Reverse(i)))
        .or_else(|| pool.iter().min_by_key(|&i| (block_m(i), i)))
        .unwrap_or(0)
}

/// Checks every argument before anything touches the GPU. Each problem has its own error kind.
pub(crate) fn validate(p: &FwdParams) -> Result<(AttnShape, MaskArgs)> {
    let shape = check_qkv(&p.q, &p.k, &p.v, p.varlen.as_ref(), "attn_fwd", &ATTENTION_INPUTS)?;
    // O has V's head dim.
    let [b, hq, tokens_q, _] = p.q.sizes;
    check_tensor("o", &p.o, [b, hq, tokens_q, shape.head_dim_v], p.q.dtype)?;
    check_rows("o", &p.o, tokens_q, shape.head_dim_v)?;
    if let Some(lse) = &p.lse {
        check_tensor("lse", lse, [p.q.sizes[0], shape.heads_q, p.q.sizes[2]], DType::F32)?;
    }
    check_scalars(&shape, p.dropout.as_ref(), p.sm_scale)?;
    score_modifiers(p).check(&shape, p.q.dtype, p.dropout.is_some(), p.bias.is_some())?;
    let ([seed, offset], [seed_out, offset_out]) = dropout_regions(p.dropout.as_ref())?;
    let ([cu_q, cu_k], status) = varlen_regions(p.varlen.as_ref())?;
    let lse = match &p.lse {
        Some(lse) => Region::output("lse", lse)?,
        None => Region::NONE,
    };
    let [slopes, sinks] = score_modifiers(p).regions()?;
    check_no_aliasing(
        &[Region::output("o", &p.o)?, lse, seed_out, offset_out, status],
        &[
            Region::input("q", &p.q)?,
            Region::input("k", &p.k)?,
            Region::input("v", &p.v)?,
            optional_input("bias", p.bias.as_ref())?,
            slopes,
            sinks,
            seed,
            offset,
            cu_q,
            cu_k,
        ],
    )?;
    // Bias and dropout are checked where their arguments are built (`kernel_args`, which
    // `attn_fwd` runs before touching the GPU).
    Ok((shape, mask_args(&p.mask, &shape)?))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ErrorKind;
    use crate::dispatch::{self, fitting_kernels};
    use crate::driver::Runtime;
    use crate::flash::{MaskAlign, Varlen};
    use crate::images;

    pub(crate) const B: u64 = 2;
    pub(crate) const HQ: u64 = 4;
    pub(crate) const HK: u64 = 2;
    pub(crate) const SQ: u64 = 17;
    pub(crate) const SK: u64 = 33;
    pub(crate) const D: u64 = 64;

    /// Everything `attn_fwd` checks before touching the GPU.
    fn check(p: &FwdParams) -> Result<(AttnShape, MaskArgs)> {
        let (shape, mask) = validate(p)?;
        kernel_args(p, &shape, &mask)?;
        Ok((shape, mask))
    }

    /// A well-formed GQA call on fake, aligned device addresses (never dereferenced here).
    fn valid() -> FwdParams<'static> {
        // 2^32 bytes apart: no two overlap whatever sizes a test gives them.
        let t = |i: u64, h, s| TensorView::contiguous(i << 32, [B, h, s, D], DType::F16);
        let lse = TensorView::contiguous(5 << 32, [B, HQ, SQ], DType::F32);
        FwdParams::new(t(1, HQ, SQ), t(2, HK, SK), t(3, HK, SK), t(4, HQ, SQ), Some(lse))
    }

    /// Gives every tensor head dim `d` (contiguous strides), keeping the call consistent.
    fn with_head_dim<'a>(mut p: FwdParams<'a>, d: u64) -> FwdParams<'a> {
        for t in [&mut p.q, &mut p.k, &mut p.v, &mut p.o] {
            *t = TensorView::contiguous(t.ptr, [t.sizes[0], t.sizes[1], t.sizes[2], d], t.dtype);
        }
        p
    }

    /// Sets size `dim` (0 = batch, 1 = heads) of every tensor, so the shapes stay consistent.
    fn set_outer_size(p: &mut FwdParams, dim: usize, size: u64) {
        for t in [&mut p.q, &mut p.k, &mut p.v, &mut p.o] {
            t.sizes[dim] = size;
        }
        if let Some(lse) = &mut p.lse {
            lse.sizes[dim] = size;
        }
    }

    #[test]
    fn valid_params_pass_validation() {
        let (shape, mask) = check(&valid()).unwrap();
        assert_eq!((shape.batch, shape.heads_q, shape.heads_k, shape.seqlen_q, shape.seqlen_k), (B, HQ, HK, SQ, SK));
        assert_eq!((shape.head_dim, shape.head_dim_bucket, shape.gqa_group()), (D, 64, 2));
        assert_eq!((mask.left, mask.right, mask.bottom_right), ((SQ + SK) as i32, (SQ + SK) as i32, false));
        let mut p = valid();
        p.lse = None;
        assert!(check(&p).is_ok(), "lse is optional in the forward");
    }

    #[test]
    fn every_validation_error_has_its_kind() {
        type Mutation = Box<dyn Fn(&mut FwdParams<'static>)>;
        let cases: Vec<(&str, Mutation, ErrorKind)> = vec![
            ("k dtype", Box::new(|p| p.k.dtype = DType::BF16), ErrorKind::DTypeMismatch),
            ("o dtype", Box::new(|p| p.o.dtype = DType::BF16), ErrorKind::DTypeMismatch),
            ("lse dtype", Box::new(|p| p.lse.as_mut().unwrap().dtype = DType::F16), ErrorKind::DTypeMismatch),
            (
                "int32 inputs",
                Box::new(|p| {
                    for t in [&mut p.q, &mut p.k, &mut p.v, &mut p.o] {
                        t.dtype = DType::I32;
                    }
                }),
                ErrorKind::UnsupportedDType,
            ),
            ("dropout p 1", Box::new(|p| p.dropout = Some(Dropout::new(1.0, 0x1000, 0x2000))), ErrorKind::InvalidArgument),
            ("dropout p -0.1", Box::new(|p| p.dropout = Some(Dropout::new(-0.1, 0x1000, 0x2000))), ErrorKind::InvalidArgument),
            ("dropout seed null", Box::new(|p| p.dropout = Some(Dropout::new(0.1, 0, 0x2000))), ErrorKind::NullPointer),
            ("dropout offset misaligned", Box::new(|p| p.dropout = Some(Dropout::new(0.1, 0x1000, 0x2004))), ErrorKind::MisalignedPointer),
            (
                "dropout seed_out without offset_out",
                Box::new(|p| p.dropout = Some(Dropout { seed_out: 0x3000, ..Dropout::new(0.1, 0x1000, 0x2000) })),
                ErrorKind::InvalidArgument,
            ),
            ("bias not broadcastable", Box::new(|p| p.bias = Some(bias([B, 3, SQ, SK]))), ErrorKind::ShapeMismatch),
            ("bias last dim broadcast", Box::new(|p| p.bias = Some(bias([B, HQ, SQ, 1]))), ErrorKind::ShapeMismatch),
            ("bias dtype", Box::new(|p| p.bias = Some(TensorView { dtype: DType::BF16, ..bias([B, HQ, SQ, SK]) })), ErrorKind::DTypeMismatch),
            ("v seqlen", Box::new(|p| p.v.sizes[2] = SK + 1), ErrorKind::ShapeMismatch),
            ("k batch", Box::new(|p| p.k.sizes[0] = B + 1), ErrorKind::ShapeMismatch),
            ("o heads", Box::new(|p| p.o.sizes[1] = HQ + 1), ErrorKind::ShapeMismatch),
            ("lse seqlen", Box::new(|p| p.lse.as_mut().unwrap().sizes[2] = SQ + 1), ErrorKind::ShapeMismatch),
            ("k head dim", Box::new(|p| p.k.sizes[3] = 128), ErrorKind::ShapeMismatch),
            (
                "Hq not a multiple of Hk",
                Box::new(|p| {
                    p.k.sizes[1] = 3;
                    p.v.sizes[1] = 3;
                }),
                ErrorKind::ShapeMismatch,
            ),
            ("negative stride", Box::new(|p| p.k.strides[1] = -64), ErrorKind::BadStrides),
            ("last stride", Box::new(|p| p.q.strides[3] = 2), ErrorKind::BadStrides),
            ("lse last stride", Box::new(|p| p.lse.as_mut().unwrap().strides[2] = 2), ErrorKind::BadStrides),
            ("head dim 20", Box::new(|p| *p = with_head_dim(*p, 20)), ErrorKind::UnsupportedHeadDim),
            ("head dim 520", Box::new(|p| *p = with_head_dim(*p, 520)), ErrorKind::UnsupportedHeadDim),
            ("q null", Box::new(|p| p.q.ptr = 0), ErrorKind::NullPointer),
            ("lse null", Box::new(|p| p.lse.as_mut().unwrap().ptr = 0), ErrorKind::NullPointer),
            ("v misaligned", Box::new(|p| p.v.ptr += 1), ErrorKind::MisalignedPointer),
            ("lse misaligned", Box::new(|p| p.lse.as_mut().unwrap().ptr += 2), ErrorKind::MisalignedPointer),
            (
                "Sq 0",
                Box::new(|p| {
                    p.q.sizes[2] = 0;
                    p.o.sizes[2] = 0;
                    p.lse.as_mut().unwrap().sizes[2] = 0;
                }),
                ErrorKind::EmptyInput,
            ),
            (
                "Sk 0",
                Box::new(|p| {
                    p.k.sizes[2] = 0;
                    p.v.sizes[2] = 0;
                }),
                ErrorKind::EmptyInput,
            ),
            ("batch 0", Box::new(|p| set_outer_size(p, 0, 0)), ErrorKind::EmptyInput),
            ("scale NaN", Box::new(|p| p.sm_scale = f32::NAN), ErrorKind::InvalidArgument),
            ("scale inf", Box::new(|p| p.sm_scale = f32::INFINITY), ErrorKind::InvalidArgument),
            ("softcap NaN", Box::new(|p| p.softcap = f32::NAN), ErrorKind::InvalidArgument),
            ("softcap negative", Box::new(|p| p.softcap = -30.0), ErrorKind::InvalidArgument),
            ("softcap inf", Box::new(|p| p.softcap = f32::INFINITY), ErrorKind::InvalidArgument),
            (
                "softcap with dropout",
                Box::new(|p| {
                    p.softcap = 30.0;
                    p.dropout = Some(Dropout::new(0.1, 0x1000, 0x2000));
                }),
                ErrorKind::InvalidArgument,
            ),
            (
                "softcap with bias",
                Box::new(|p| {
                    p.softcap = 30.0;
                    p.bias = Some(bias([B, HQ, SQ, SK]));
                }),
                ErrorKind::InvalidArgument,
            ),
            (
                "softcap fp32",
                Box::new(|p| {
                    p.softcap = 30.0;
                    for t in [&mut p.q, &mut p.k, &mut p.v, &mut p.o] {
                        t.dtype = DType::F32;
                    }
                }),
                ErrorKind::UnsupportedDType,
            ),
            ("alibi fp16 slopes", Box::new(|p| p.alibi_slopes = Some(TensorView::contiguous(6 << 32, [1, HQ], DType::F16))), ErrorKind::DTypeMismatch),
            ("alibi slopes per key head", Box::new(|p| p.alibi_slopes = Some(slopes([1, HK]))), ErrorKind::ShapeMismatch),
            ("alibi slopes batch 3", Box::new(|p| p.alibi_slopes = Some(slopes([3, HQ]))), ErrorKind::ShapeMismatch),
            ("alibi slopes null", Box::new(|p| p.alibi_slopes = Some(TensorView::contiguous(0, [1, HQ], DType::F32))), ErrorKind::NullPointer),
            (
                "alibi slopes strided heads",
                Box::new(|p| p.alibi_slopes = Some(TensorView::new(6 << 32, [B, HQ], [1, 2], DType::F32))),
                ErrorKind::BadStrides,
            ),
            (
                "alibi slopes inside o",
                Box::new(|p| p.alibi_slopes = Some(TensorView::contiguous(p.o.ptr + 64, [1, HQ], DType::F32))),
                ErrorKind::InvalidArgument,
            ),
            (
                "alibi with softcap",
                Box::new(|p| {
                    p.alibi_slopes = Some(slopes([B, HQ]));
                    p.softcap = 30.0;
                }),
                ErrorKind::InvalidArgument,
            ),
            (
                "alibi with dropout",
                Box::new(|p| {
                    p.alibi_slopes = Some(slopes([1, HQ]));
                    p.dropout = Some(Dropout::new(0.1, 0x1000, 0x2000));
                }),
                ErrorKind::InvalidArgument,
            ),
            (
                "alibi fp32",
                Box::new(|p| {
                    p.alibi_slopes = Some(slopes([1, HQ]));
                    for t in [&mut p.q, &mut p.k, &mut p.v, &mut p.o] {
                        t.dtype = DType::F32;
                    }
                }),
                ErrorKind::UnsupportedDType,
            ),
            ("sinks per key head", Box::new(|p| p.sinks = Some(TensorView::contiguous(7 << 32, [HK], DType::F32))), ErrorKind::ShapeMismatch),
            ("sinks bf16", Box::new(|p| p.sinks = Some(TensorView::contiguous(7 << 32, [HQ], DType::BF16))), ErrorKind::DTypeMismatch),
            (
                "sinks with alibi",
                Box::new(|p| {
                    p.sinks = Some(TensorView::contiguous(7 << 32, [HQ], DType::F32));
                    p.alibi_slopes = Some(slopes([1, HQ]));
                }),
                ErrorKind::InvalidArgument,
            ),
            (
                "sinks with bias",
                Box::new(|p| {
                    p.sinks = Some(TensorView::contiguous(7 << 32, [HQ], DType::F32));
                    p.bias = Some(bias([B, HQ, SQ, SK]));
                }),
                ErrorKind::InvalidArgument,
            ),
            (
                "sinks inside lse",
                Box::new(|p| p.sinks = Some(TensorView::contiguous(p.lse.unwrap().ptr + 8, [HQ], DType::F32))),
                ErrorKind::InvalidArgument,
            ),
            ("window left -2", Box::new(|p| p.mask = Mask::window(-2, 4, MaskAlign::TopLeft)), ErrorKind::InvalidArgument),
            ("window right -5", Box::new(|p| p.mask = Mask::window(3, -5, MaskAlign::BottomRight)), ErrorKind::InvalidArgument),
            (
                "heads above grid limit",
                Box::new(|p| set_outer_size(p, 1, 70_000)),
                ErrorKind::TooLarge,
            ),
            ("row offsets overflow i32", Box::new(|p| p.k.strides[2] = 1 << 27), ErrorKind::TooLarge),
        ];
        for (name, mutate, want) in cases {
            let mut p = valid();
            mutate(&mut p);
            let err = check(&p).expect_err(name);
            assert_eq!(err.kind(), want, "{name}: {err}");
            assert!(!err.message().is_empty(), "{name}");
        }
    }

    fn bias(sizes: [u64; 4]) -> TensorView<4> {
        TensorView::contiguous(0x70000, sizes, DType::F16)
    }

    /// The value an argument list gives `name`, if any.
    fn arg_of(args: &ArgList, name: &str) -> Option<ArgValue> {
        args.args().unwrap().iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    /// fp32 ALiBi slopes on their own fake address.
    fn slopes(sizes: [u64; 2]) -> TensorView<2> {
        TensorView::contiguous(6 << 32, sizes, DType::F32)
    }

    #[test]
    fn alibi_is_an_optional_axis_and_arguments() {
        let mut p = valid();
        let (shape, mask) = check(&p).unwrap();
        assert!(functional_axes(&p, &shape).as_slice().unwrap().iter().all(|(name, _)| *name != "alibi"), "off: no alibi axis");
        let args = kernel_args(&p, &shape, &mask).unwrap();
        assert_eq!((arg_of(&args, "ALIBI_SLOPES"), arg_of(&args, "stride_az")), (Some(ArgValue::Ptr(0)), Some(ArgValue::I64(0))));
        // One row of slopes for every sequence: batch stride 0; one row per sequence: its stride.
        for (sizes, stride_az) in [([1, HQ], 0), ([B, HQ], HQ as i64)] {
            p.alibi_slopes = Some(slopes(sizes));
            let (shape, mask) = check(&p).unwrap();
            assert!(functional_axes(&p, &shape).as_slice().unwrap().contains(&("alibi", "true")));
            let args = kernel_args(&p, &shape, &mask).unwrap();
            assert_eq!(arg_of(&args, "ALIBI_SLOPES"), Some(ArgValue::Ptr(6 << 32)));
            assert_eq!(arg_of(&args, "stride_az"), Some(ArgValue::I64(stride_az)));
        }
    }

    #[test]
    fn sinks_are_an_optional_axis_and_an_argument() {
        let mut p = valid();
        let (shape, mask) = check(&p).unwrap();
        assert!(functional_axes(&p, &shape).as_slice().unwrap().iter().all(|(name, _)| *name != "sinks"), "off: no sinks axis");
        assert_eq!(arg_of(&kernel_args(&p, &shape, &mask).unwrap(), "SINKS"), Some(ArgValue::Ptr(0)));
        p.sinks = Some(TensorView::contiguous(7 << 32, [HQ], DType::F32));
        let (shape, mask) = check(&p).unwrap();
        assert!(functional_axes(&p, &shape).as_slice().unwrap().contains(&("sinks", "true")));
        assert_eq!(arg_of(&kernel_args(&p, &shape, &mask).unwrap(), "SINKS"), Some(ArgValue::Ptr(7 << 32)));
    }

    /// A call whose V (and O) has head dim `dv`, Q/K keeping `D`.
    fn with_head_dim_v(mut p: FwdParams<'static>, dv: u64) -> FwdParams<'static> {
        p.v = TensorView::contiguous(p.v.ptr, [B, HK, SK, dv], p.v.dtype);
        p.o = TensorView::contiguous(p.o.ptr, [B, HQ, SQ, dv], p.o.dtype);
        p
    }

    #[test]
    fn head_dim_v_is_an_optional_axis_and_an_argument() {
        let axis = |p: &FwdParams, shape: &AttnShape| {
            functional_axes(p, shape).as_slice().unwrap().iter().find(|(n, _)| *n == "head_dim_v").map(|(_, v)| *v)
        };
        let p = valid();
        let (shape, mask) = check(&p).unwrap();
        assert_eq!(axis(&p, &shape), None, "equal head dims: no head_dim_v axis");
        assert_eq!(arg_of(&kernel_args(&p, &shape, &mask).unwrap(), "D_HEAD_V"), Some(ArgValue::I32(D as i32)));
        // V's own head dim: its bucket is the axis, its size the argument; O follows V.
        for (dv, bucket) in [(32, "32"), (40, "64"), (128, "128")] {
            let p = with_head_dim_v(valid(), dv);
            let (shape, mask) = check(&p).unwrap();
            assert_eq!((shape.head_dim, shape.head_dim_v), (D, dv));
            assert_eq!(axis(&p, &shape), Some(bucket), "dv {dv}");
            assert_eq!(arg_of(&kernel_args(&p, &shape, &mask).unwrap(), "D_HEAD_V"), Some(ArgValue::I32(dv as i32)));
        }
        // O must have V's head dim, not Q's.
        let mut p = with_head_dim_v(valid(), 32);
        p.o.sizes[3] = D;
        let err = check(&p).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ShapeMismatch, "{err}");
        assert!(err.message().starts_with("o.sizes"), "{err}");
        // V's head dim is bounded like Q's, and named.
        let err = check(&with_head_dim_v(valid(), 20)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnsupportedHeadDim, "{err}");
        assert!(err.message().starts_with("v: head dim 20"), "{err}");
    }

    #[test]
    fn softcap_is_an_optional_axis_and_an_argument() {
        let mut p = valid();
        let (shape, mask) = check(&p).unwrap();
        let axes = functional_axes(&p, &shape);
        assert!(axes.as_slice().unwrap().iter().all(|(name, _)| *name != "softcap"), "off: no softcap axis");
        assert_eq!(arg_of(&kernel_args(&p, &shape, &mask).unwrap(), "softcap"), Some(ArgValue::F32(0.0)));
        p.softcap = 30.0;
        let (shape, mask) = check(&p).unwrap();
        let axes = functional_axes(&p, &shape);
        assert!(axes.as_slice().unwrap().contains(&("softcap", "true")));
        assert_eq!(arg_of(&kernel_args(&p, &shape, &mask).unwrap(), "softcap"), Some(ArgValue::F32(30.0)));
    }

    #[test]
    fn broadcast_bias_dropout_and_fp32_are_accepted() {
        for sizes in [[B, HQ, SQ, SK], [1, HQ, SQ, SK], [B, 1, SQ, SK], [1, 1, 1, SK], [B, 1, 1, SK]] {
            let mut p = valid();
            p.bias = Some(bias(sizes));
            check(&p).unwrap_or_else(|e| panic!("{sizes:?}: {e}"));
        }
        let mut p = valid();
        p.dropout = Some(Dropout { offset_base: 7, seed_out: 0x3000, offset_out: 0x3008, ..Dropout::new(0.25, 0x1000, 0x2000) });
        check(&p).unwrap();
        for t in [&mut p.q, &mut p.k, &mut p.v, &mut p.o] {
            t.dtype = DType::F32;
        }
        p.allow_tf32 = true;
        check(&p).unwrap();
        assert_eq!(crate::flash::dropout_offsets_consumed(B, HQ, SQ, SK), Ok(B * HQ * SQ.div_ceil(16) * 8 * SK.div_ceil(16) * 4));
    }

    /// A packed batch of 3 sequences (lengths q 5, 0, 12 and k 7, 9, 1) as [1, H, tokens, D] views.
    fn packed(host: Option<(&'static [i32], &'static [i32])>) -> FwdParams<'static> {
        let t = |ptr, h, tokens| TensorView::new(ptr, [1, h, tokens, D], [0, D as i64, (h * D) as i64, 1], DType::F16);
        let cu = |ptr| TensorView::contiguous(ptr, [4], DType::I32);
        let lse = TensorView::contiguous(0x50000, [1, HQ, 17], DType::F32);
        let mut p = FwdParams::new(t(0x10000, HQ, 17), t(0x20000, HK, 17), t(0x30000, HK, 17), t(0x40000, HQ, 17), Some(lse));
        p.varlen = Some(Varlen { cu_seqlens_q: cu(0x60000), cu_seqlens_k: cu(0x61000), max_seqlen_q: 12, max_seqlen_k: 9, host_cu_seqlens: host, status: 0 });
        p
    }

    const CU_Q: &[i32] = &[0, 5, 5, 17];
    const CU_K: &[i32] = &[0, 7, 16, 17];

    #[test]
    fn packed_batches_are_checked() {
        let (shape, _) = check(&packed(Some((CU_Q, CU_K)))).unwrap();
        assert_eq!((shape.batch, shape.seqlen_q, shape.seqlen_k), (3, 12, 9));
        check(&packed(None)).unwrap();
        let kind = |p: FwdParams| check(&p).unwrap_err().kind();
        let mut p = packed(None);
        p.varlen.as_mut().unwrap().cu_seqlens_k.dtype = DType::F32;
        assert_eq!(kind(p), ErrorKind::DTypeMismatch);
        let mut p = packed(None);
        p.varlen.as_mut().unwrap().cu_seqlens_k.sizes = [3];
        assert_eq!(kind(p), ErrorKind::ShapeMismatch, "cu_seqlens of different lengths");
        let mut p = packed(Some((CU_Q, CU_K)));
        p.varlen.as_mut().unwrap().max_seqlen_q = 11;
        let err = check(&p).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(err.message().contains("sequence 2") && err.message().contains("12"), "{err}");
        assert_eq!(kind(packed(Some((&[0, 5, 4, 17], CU_K)))), ErrorKind::InvalidArgument, "decreasing offsets");
        assert_eq!(kind(packed(Some((&[0, 5, 17], CU_K)))), ErrorKind::ShapeMismatch, "host copy of the wrong length");
        assert_eq!(kind(packed(Some((&[0, 5, 6, 18], CU_K)))), ErrorKind::ShapeMismatch, "past the packed tensor");
        let mut p = packed(None);
        p.q.sizes[0] = 2;
        p.o.sizes[0] = 2;
        assert_eq!(kind(p), ErrorKind::ShapeMismatch, "packed tensors have batch 1");
        let mut p = packed(None);
        p.varlen.as_mut().unwrap().max_seqlen_k = 0;
        assert_eq!(kind(p), ErrorKind::EmptyInput);
    }

    #[test]
    fn window_bounds_cannot_wrap_int32() {
        // Review F3: max lengths of 2^30 each passed, and the kernels' int32 window bounds
        // wrapped (every row saw no key: O = 0, LSE = +inf, no error).
        let mut p = packed(None);
        p.varlen.as_mut().unwrap().max_seqlen_q = 1 << 30;
        p.varlen.as_mut().unwrap().max_seqlen_k = 1 << 30;
        assert_eq!(check(&p).unwrap_err().kind(), ErrorKind::TooLarge);
        p.mask = Mask::causal(MaskAlign::BottomRight);
        assert_eq!(check(&p).unwrap_err().kind(), ErrorKind::TooLarge);
        // At the limit the unbounded side is Sq + Sk = 2^29, and every bound stays below 2^31.
        p.varlen.as_mut().unwrap().max_seqlen_q = (1 << 29) - 1000;
        p.varlen.as_mut().unwrap().max_seqlen_k = 1000;
        let (_, m) = check(&p).unwrap();
        assert_eq!((m.left, m.right), (1 << 29, 0));
        p.varlen.as_mut().unwrap().max_seqlen_k = 1001;
        assert_eq!(check(&p).unwrap_err().kind(), ErrorKind::TooLarge);
    }

    #[test]
    fn packed_batches_pass_their_bounds_and_status_word() {
        let mut p = packed(None);
        let (shape, mask) = check(&p).unwrap();
        let args = kernel_args(&p, &shape, &mask).unwrap();
        assert_eq!(arg_of(&args, "N_TOKENS_Q"), Some(ArgValue::I32(17)));
        assert_eq!(arg_of(&args, "N_TOKENS_K"), Some(ArgValue::I32(17)));
        assert_eq!(arg_of(&args, "STORE_VARLEN_STATUS"), Some(ArgValue::I32(0)));
        p.varlen.as_mut().unwrap().status = 0x62000;
        let (shape, mask) = check(&p).unwrap();
        let args = kernel_args(&p, &shape, &mask).unwrap();
        assert_eq!(arg_of(&args, "VARLEN_STATUS"), Some(ArgValue::Ptr(0x62000)));
        assert_eq!(arg_of(&args, "STORE_VARLEN_STATUS"), Some(ArgValue::I32(1)));
        p.varlen.as_mut().unwrap().status = 0x62002;
        assert_eq!(check(&p).unwrap_err().kind(), ErrorKind::MisalignedPointer);
        // The status word is written: it must not lie in an input (here cu_seqlens_q).
        p.varlen.as_mut().unwrap().status = 0x60004;
        assert_eq!(check(&p).unwrap_err().kind(), ErrorKind::InvalidArgument);
        // Fixed-length batches pass neutral values.
        let (shape, mask) = check(&valid()).unwrap();
        let args = kernel_args(&valid(), &shape, &mask).unwrap();
        assert_eq!(arg_of(&args, "IS_VARLEN"), Some(ArgValue::I32(0)));
        assert_eq!(arg_of(&args, "VARLEN_STATUS"), Some(ArgValue::Ptr(0)));
    }

    #[test]
    fn outputs_must_not_alias_inputs_or_each_other() {
        // Review F9: each of these passed validation.
        type Mutation = Box<dyn Fn(&mut FwdParams<'static>)>;
        let cases: Vec<(&str, Mutation, ErrorKind)> = vec![
            ("o = q", Box::new(|p| p.o.ptr = p.q.ptr), ErrorKind::InvalidArgument),
            ("o inside k", Box::new(|p| p.o.ptr = p.k.ptr + 256), ErrorKind::InvalidArgument),
            ("lse inside o", Box::new(|p| p.lse.as_mut().unwrap().ptr = p.o.ptr + 64), ErrorKind::InvalidArgument),
            (
                "seed_out = offset",
                Box::new(|p| p.dropout = Some(Dropout { seed_out: 0x2000, offset_out: 0x3008, ..Dropout::new(0.1, 0x1000, 0x2000) })),
                ErrorKind::InvalidArgument,
            ),
            (
                "offset_out inside o",
                Box::new(|p| p.dropout = Some(Dropout { seed_out: 0x3000, offset_out: p.o.ptr + 8, ..Dropout::new(0.1, 0x1000, 0x2000) })),
                ErrorKind::InvalidArgument,
            ),
            ("o with a zero head stride", Box::new(|p| p.o.strides[1] = 0), ErrorKind::BadStrides),
            ("o rows overlapping", Box::new(|p| p.o.strides[2] = 32), ErrorKind::BadStrides),
            ("lse with a zero row stride", Box::new(|p| p.lse.as_mut().unwrap().strides[1] = 0), ErrorKind::BadStrides),
            ("q extent wraps", Box::new(|p| p.q.strides[0] = i64::MAX), ErrorKind::TooLarge),
            ("o at the end of the address space", Box::new(|p| p.o.ptr = u64::MAX - 1), ErrorKind::TooLarge),
            ("sm_scale · log2(e) overflows", Box::new(|p| p.sm_scale = f32::MAX), ErrorKind::InvalidArgument),
        ];
        for (name, mutate, want) in cases {
            let mut p = valid();
            mutate(&mut p);
            let err = check(&p).expect_err(name);
            assert_eq!(err.kind(), want, "{name}: {err}");
        }
        // Inputs may share memory and repeat elements: q = k = v (self-attention on one tensor,
        // Hq = Hk here) and a k broadcast over heads with a zero stride.
        let qkv = TensorView::contiguous(1 << 32, [B, HK, SK, D], DType::F16);
        let o = TensorView::contiguous(2 << 32, [B, HK, SK, D], DType::F16);
        check(&FwdParams::new(qkv, qkv, qkv, o, Some(TensorView::contiguous(3 << 32, [B, HK, SK], DType::F32)))).unwrap();
        let mut p = valid();
        p.k.strides[1] = 0;
        check(&p).unwrap();
    }

    #[test]
    fn dropout_counter_ranges_that_overflow_are_refused() {
        // Review F6: the counter count wrapped (release) or panicked (overflow checks).
        assert_eq!(crate::flash::dropout_offsets_consumed(65535, 65535, 1 << 30, 1 << 30).unwrap_err().kind(), ErrorKind::TooLarge);
        assert_eq!(crate::flash::dropout_offsets_consumed(1 << 62, 8, 1, 4).unwrap_err().kind(), ErrorKind::TooLarge);
        // A packed batch of 65535 sequences with max lengths 2^28 passes every size check but
        // needs 2^16 · 4 · 2^28 · 2^26 counters: refused before anything is launched.
        let mut p = packed(None);
        let v = p.varlen.as_mut().unwrap();
        v.cu_seqlens_q.sizes = [65536];
        v.cu_seqlens_k.sizes = [65536];
        v.max_seqlen_q = 1 << 28;
        v.max_seqlen_k = 1 << 28;
        check(&p).unwrap();
        p.dropout = Some(Dropout::new(0.1, 0x1000, 0x2000));
        assert_eq!(check(&p).unwrap_err().kind(), ErrorKind::TooLarge);
    }

    #[test]
    fn messages_name_the_argument() {
        let mut p = valid();
        p.v.sizes[2] = 5;
        assert!(validate(&p).unwrap_err().message().starts_with("v.sizes"));
        let mut p = valid();
        p.o.ptr = 0;
        assert!(validate(&p).unwrap_err().message().starts_with("o:"));
        let mut p = valid();
        p.q.ptr = 0x10001;
        assert!(validate(&p).unwrap_err().message().contains("0x10001"));
        let err = validate(&with_head_dim(valid(), 520)).unwrap_err();
        assert!(err.message().contains("520") && err.message().contains("512"), "{err}");
    }

    #[test]
    fn head_dims_map_to_the_smallest_bucket() {
        for (d, bucket) in [(8, 16), (16, 16), (24, 32), (40, 64), (64, 64), (72, 128), (128, 128), (136, 256), (256, 256), (264, 512), (512, 512)] {
            let (shape, _) = validate(&with_head_dim(valid(), d)).unwrap();
            assert_eq!(shape.head_dim_bucket, bucket, "head dim {d}");
        }
    }

    #[test]
    fn masks_become_kernel_window_arguments() {
        let mut p = valid();
        let unbounded = (SQ + SK) as i32;
        p.mask = Mask::causal(MaskAlign::TopLeft);
        let (_, m) = validate(&p).unwrap();
        assert_eq!((m.left, m.right, m.bottom_right), (unbounded, 0, false));
        p.mask = Mask::causal(MaskAlign::BottomRight);
        let (_, m) = validate(&p).unwrap();
        assert_eq!((m.left, m.right, m.bottom_right), (unbounded, 0, true));
        p.mask = Mask::window(0, 1000, MaskAlign::TopLeft);
        let (_, m) = validate(&p).unwrap();
        assert_eq!((m.left, m.right), (0, unbounded), "a window past the sequence is clamped");
    }

    #[test]
    fn non_contiguous_bshd_layout_is_accepted() {
        // B×S×H×D memory viewed as B×H×S×D.
        let t = |ptr, h: u64, s: u64| {
            TensorView::new(ptr, [B, h, s, D], [(s * h * D) as i64, D as i64, (h * D) as i64, 1], DType::BF16)
        };
        let lse = TensorView::contiguous(0x50000, [B, HQ, SQ], DType::F32);
        let p = FwdParams::new(t(0x10000, HQ, SQ), t(0x20000, HK, SK), t(0x30000, HK, SK), t(0x40000, HQ, SQ), Some(lse));
        assert!(validate(&p).is_ok());
    }

    #[test]
    fn without_a_driver_a_valid_call_reports_no_driver() {
        // SAFETY: only probes whether the driver library can be opened.
        if crate::driver::library_present(Runtime::Cuda) {
            eprintln!("skipped: a CUDA driver is present, so the no-driver path cannot be exercised");
            return;
        }
        let err = attn_fwd(&valid(), Stream::null()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NoDriver, "{err}");
        // Validation still comes first: an invalid call says what is invalid.
        let mut p = valid();
        p.q.ptr = 0;
        assert_eq!(attn_fwd(&p, Stream::null()).unwrap_err().kind(), ErrorKind::NullPointer);
    }

    pub(crate) fn h100_like() -> DeviceInfo {
        DeviceInfo {
            runtime: Runtime::Cuda,
            ordinal: 0,
            arch: "sm_90".into(),
            target_id: "sm_90".into(),
            multiprocessors: 132,
            max_shared: 232_448,
            warp_size: 32,
        }
    }

    /// Picks a kernel the way `attn_fwd` does, on the archive embedded for the first built arch,
    /// with its tuning cells left out: these tests check the heuristic whether or not the build
    /// carries a database.
    fn pick(p: &FwdParams) -> crate::archive::KernelMeta {
        let (shape, mask) = validate(p).unwrap();
        let loaded = images::archive_for(images::built_archs()[0]).unwrap();
        let axes = functional_axes(p, &shape);
        let args = kernel_args(p, &shape, &mask).unwrap();
        let request = Request { family: "attn_fwd", axes: axes.as_slice().unwrap(), args: args.args().unwrap() };
        let index = dispatch::find_functional(&loaded, &request).unwrap();
        let functional = untuned(&loaded.archive.functionals()[index]);
        let fitting = fitting_kernels(&functional, args.args().unwrap()).unwrap();
        assert!(!fitting.is_empty());
        functional.kernels[choose_kernel(&functional, fitting, &shape, crate::flash::tuning_key(&shape, &mask), &h100_like())].clone()
    }

    /// `functional` as a build without a database dispatches it: no cell won; kernels compiled
    /// only for the database stay out of the heuristic's pool.
    fn untuned(functional: &crate::archive::Functional) -> crate::archive::Functional {
        let mut f = functional.clone();
        for k in &mut f.kernels {
            k.tuned_for.clear();
        }
        f
    }

    fn sized(b: u64, h: u64, s: u64, d: u64) -> FwdParams<'static> {
        let t = |i: u64| TensorView::contiguous(i << 36, [b, h, s, d], DType::BF16);
        let lse = TensorView::contiguous(5 << 36, [b, h, s], DType::F32);
        FwdParams::new(t(1), t(2), t(3), t(4), Some(lse))
    }

    #[test]
    fn every_compiled_functional_is_found() {
        let loaded = images::archive_for(images::built_archs()[0]).unwrap();
        for (dtype, tf32) in [(DType::F16, false), (DType::BF16, false), (DType::F32, false), (DType::F32, true)] {
            for d in [8, 24, 40, 64, 72, 128, 160, 256, 264, 512] {
                for (dropout, with_bias) in [(false, false), (true, false), (false, true), (true, true)] {
                    let mut p = sized(1, 1, 16, d);
                    for t in [&mut p.q, &mut p.k, &mut p.v, &mut p.o] {
                        t.dtype = dtype;
                    }
                    p.allow_tf32 = tf32;
                    p.dropout = dropout.then(|| Dropout::new(0.5, 0x1000, 0x2000));
                    p.bias = with_bias.then(|| TensorView::contiguous(0x700000, [1, 1, 16, 16], dtype));
                    let (shape, _) = validate(&p).unwrap();
                    let axes = functional_axes(&p, &shape);
                    let request = Request { family: "attn_fwd", axes: axes.as_slice().unwrap(), args: &[] };
                    let found = dispatch::find_functional(&loaded, &request);
                    if dtype == DType::F32 && d > 256 {
                        // fp32 stops at head dim 256 (rules.FP32_MAX_HEAD_DIM): the error names the call.
                        let err = found.err().unwrap_or_else(|| panic!("fp32 head dim {d} found"));
                        assert!(err.message().contains("fp32") && err.message().contains("512"), "{err}");
                    } else {
                        found.unwrap_or_else(|e| panic!("{e}"));
                    }
                }
            }
        }
    }

    #[test]
    fn selection_follows_the_heuristic_and_alignment() {
        // A grid that fills 132 SMs with the largest block: take it, and the aligned variant.
        let big = pick(&sized(4, 16, 4096, 128));
        assert_eq!(big.variant, "aligned");
        let largest = big.config["BLOCK_M"];
        // A tiny problem: every candidate under-fills the GPU, so the smallest block wins.
        let small = pick(&sized(1, 1, 64, 128));
        assert_eq!(small.variant, "aligned");
        assert!(small.config["BLOCK_M"] < largest, "{small:?} vs {big:?}");
        // A pointer that breaks the 16-byte hint: only the generic variant fits.
        let mut p = sized(4, 16, 4096, 128);
        p.q.ptr += 2;
        assert_eq!(pick(&p).variant, "generic");
        // So does a row stride that is not a multiple of 8 elements (16 bytes).
        let mut p = sized(1, 2, 100, 64);
        p.k.strides = [2 * 100 * 68, 100 * 68, 68, 1];
        assert_eq!(pick(&p).variant, "generic");
        // A head dim of 24 keeps 16-byte rows: the aligned bucket-32 kernel serves it.
        assert_eq!(pick(&sized(4, 16, 512, 24)).variant, "aligned");
        // Dropout with torch's rng_state layout, int64[2] = (seed, offset): the offset word 8 bytes
        // in (not 16-byte aligned). Scalar words are hinted at their own size: still aligned.
        let mut p = sized(4, 16, 4096, 128);
        let mut dropout = Dropout::new(0.1, 0x7000_0000, 0x7000_0008);
        dropout.seed_out = 0x7100_0000;
        dropout.offset_out = 0x7100_0008;
        p.dropout = Some(dropout);
        assert_eq!(pick(&p).variant, "aligned");
        // Packed batches: offsets sliced 4 bytes into a tensor, a status word likewise.
        let packed = |ptr| TensorView::new(ptr, [1, 4, 300, 128], [0, 128, 4 * 128, 1], DType::BF16);
        let mut p = FwdParams::new(packed(1 << 36), packed(2 << 36), packed(3 << 36), packed(4 << 36), None);
        let cu = |ptr| TensorView::contiguous(ptr, [3], DType::I32);
        let mut varlen = Varlen::new(cu(0x6000_0004), cu(0x6100_0004), 200, 200);
        varlen.status = 0x6200_0004;
        p.varlen = Some(varlen);
        assert_eq!(pick(&p).variant, "aligned");
    }

    #[test]
    fn tuned_cells_decide_where_they_apply_and_the_heuristic_elsewhere() {
        use crate::archive::{LengthBin, MaskKind, TunedCell};
        let p = sized(4, 16, 4096, 128);
        let (shape, mask) = validate(&p).unwrap();
        let loaded = images::archive_for(images::built_archs()[0]).unwrap();
        let axes = functional_axes(&p, &shape);
        let args = kernel_args(&p, &shape, &mask).unwrap();
        let request = Request { family: "attn_fwd", axes: axes.as_slice().unwrap(), args: args.args().unwrap() };
        let mut functional = untuned(&loaded.archive.functionals()[dispatch::find_functional(&loaded, &request).unwrap()]);
        let fitting = fitting_kernels(&functional, args.args().unwrap()).unwrap();
        let unmasked = crate::flash::tuning_key(&shape, &mask);
        let heuristic = choose_kernel(&functional, fitting, &shape, unmasked, &h100_like());
        let other = fitting
            .iter()
            .find(|&i| i != heuristic && functional.kernels[i].variant == "aligned" && !functional.kernels[i].tuned_only)
            .expect("bf16 hd128 has two aligned configs");
        // The other config wins the cell of this call (no mask, both lengths in [2048, 8192)).
        let bin = LengthBin { lo: 2048, hi: Some(8192) };
        functional.kernels[other].tuned_for = vec![TunedCell { mask: MaskKind::None, seqlen_q: bin, seqlen_k: bin }];
        assert_eq!(choose_kernel(&functional, fitting, &shape, unmasked, &h100_like()), other);
        // With the database switched off (process-wide; no other test tunes a cell): the
        // heuristic's pick, and the cell's winner again once it is back on.
        crate::tuning::use_database(false);
        let off = choose_kernel(&functional, fitting, &shape, unmasked, &h100_like());
        crate::tuning::use_database(true);
        assert_eq!(off, heuristic);
        assert_eq!(choose_kernel(&functional, fitting, &shape, unmasked, &h100_like()), other);
        // Outside the cell (a causal call, a longer one): the heuristic's pick again.
        let causal = dispatch::TuningKey { mask: MaskKind::Causal, ..unmasked };
        assert_eq!(choose_kernel(&functional, fitting, &shape, causal, &h100_like()), heuristic);
        let long = dispatch::TuningKey { seqlen_q: 8192, ..unmasked };
        assert_eq!(choose_kernel(&functional, fitting, &shape, long, &h100_like()), heuristic);
        // The mask kind comes from the call: unbounded windows are no mask, causal is.
        let mut causal_call = p;
        causal_call.mask = super::Mask::causal(crate::flash::MaskAlign::TopLeft);
        let (cshape, cmask) = validate(&causal_call).unwrap();
        assert_eq!(unmasked.mask, MaskKind::None);
        assert_eq!(crate::flash::tuning_key(&cshape, &cmask).mask, MaskKind::Causal);
        // The tuner's override wins over both, only for the functional holding that id.
        crate::tuning::force_kernel(Some(&functional.kernels[heuristic].id));
        let before = crate::tuning::forced_count();
        assert_eq!(dispatch::forced_in_for_tests(&functional, fitting), Some(heuristic));
        assert!(crate::tuning::forced_count() > before, "a forced pick is counted");
        crate::tuning::force_kernel(Some("attn_bwd_dq-some-other-kernel"));
        assert_eq!(dispatch::forced_in_for_tests(&functional, fitting), None);
        crate::tuning::force_kernel(None);
        assert_eq!((crate::tuning::forced_kernel(), dispatch::forced_in_for_tests(&functional, fitting)), (None, None));
        // A kernel compiled only for the database is never the heuristic's pick.
        functional.kernels[heuristic].tuned_only = true;
        functional.kernels[other].tuned_for.clear();
        assert_eq!(choose_kernel(&functional, fitting, &shape, unmasked, &h100_like()), other);
    }
}
