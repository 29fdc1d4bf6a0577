//! `attn_fwd_fp8`: the forward with fp8 (e4m3) Q, K and V on sm_90, FlashAttention-3's fp8 forward:
//! `O = softmax(sm_scale · dq · dk · Q·Kᵀ + mask) · (dv · V)` with `dq`, `dk`, `dv` the fp32
//! dequantisation factors of each (batch, KV head), O in bf16 and the natural-log LSE (of the
//! descaled scores) in fp32. The kernels are the Gluon ones of `python/kernels/flash_gluon/fwd_fp8.py`
//! (contract: its `ABI.md`).
//!
//! wgmma multiplies an 8-bit B operand only K-major, which V is not in `P·V`: each call first writes
//! Vᵀ (in the kernel's key order, keys padded to 32) into the caller's workspace
//! ([`attn_fwd_fp8_workspace_bytes`]), then runs the forward; both on the stream, nothing
//! launched unless both kernels are ready.
use super::gluon;
use super::{AttnShape, InputDTypes, Mask, MaskArgs, Workspace, check_qkv, check_scalars, check_tensor, mask_args};
use crate::dispatch::{ArgList, ArgValue, Axes, Launcher, Request, blocks, first_preferred};
use crate::driver::Stream;
use crate::error::{ErrorKind, Result, bail, checked_product};
use crate::tensor::{DType, Region, TensorView, check_no_aliasing};
use crate::tma::TensorArg;

/// The forward's kernel family (rules.ATTN_FWD_GLUON_FP8).
pub(crate) const FAMILY: &str = "attn_fwd_gluon_fp8";
/// The Vᵀ kernel's family (rules.TRANSPOSE_V_FP8).
pub(crate) const TRANSPOSE_FAMILY: &str = "transpose_v_fp8";
/// q, k, v: e4m3 only.
const FP8_INPUTS: InputDTypes = InputDTypes { dtypes: &[DType::F8E4M3], described: "the fp8 forward takes float8_e4m3fn inputs" };
/// Vᵀ's keys are permuted within groups of this many and padded to a whole group.
const KEY_GROUP: u64 = 32;

/// Parameters of [`attn_fwd_fp8`]. Marked non-exhaustive so later versions can add fields: build
/// it with [`Fp8FwdParams::new`] and set the public fields you need.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Fp8FwdParams {
    /// B×Hq×Sq×D, fp8 e4m3 (`DType::F8E4M3`); D a multiple of 16 up to 256.
    pub q: TensorView<4>,
    /// B×Hk×Sk×D, fp8 e4m3; Hq must be a multiple of Hk.
    pub k: TensorView<4>,
    /// B×Hk×Sk×D, fp8 e4m3.
    pub v: TensorView<4>,
    /// B×Hq×Sq×D output, bf16.
    pub o: TensorView<4>,
    /// B×Hq×Sq fp32 output, the LSE of the descaled scores; `None` when not wanted.
    pub lse: Option<TensorView<3>>,
    /// fp32 [B, Hk] dequantisation factors of Q (shared by a KV head's query heads), K and V;
    /// any strides (0 broadcasts). They must be positive: the kernel takes the row maximum of
    /// the raw scores (not checked: reading them would need the device).
    pub q_descale: TensorView<2>,
    /// fp32 [B, Hk] dequantisation factors of K (see `q_descale`).
    pub k_descale: TensorView<2>,
    /// fp32 [B, Hk] dequantisation factors of V; O is scaled by them.
    pub v_descale: TensorView<2>,
    /// Scale applied to Q·Kᵀ with the descales; `new` sets 1/√D. Must be positive.
    pub sm_scale: f32,
    /// Which keys each query sees; `new` sets [`Mask::NONE`].
    pub mask: Mask,
    /// Device memory for Vᵀ, at least [`attn_fwd_fp8_workspace_bytes`] bytes, 16-byte aligned.
    pub workspace: Option<Workspace>,
}

impl Fp8FwdParams {
    /// Attention of `q` over `k`, `v` (with their descales) into `o` (and `lse` when given), scale
    /// 1/√D, no mask, no workspace yet.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        q: TensorView<4>,
        k: TensorView<4>,
        v: TensorView<4>,
        o: TensorView<4>,
        lse: Option<TensorView<3>>,
        q_descale: TensorView<2>,
        k_descale: TensorView<2>,
        v_descale: TensorView<2>,
    ) -> Self {
        let head_dim = q.sizes[3].max(1) as f32;
        Fp8FwdParams {
            q,
            k,
            v,
            o,
            lse,
            q_descale,
            k_descale,
            v_descale,
            sm_scale: 1.0 / head_dim.sqrt(),
            mask: Mask::NONE,
            workspace: None,
        }
    }
}

/// `KEYS_PAD`: Vᵀ's key columns, Sk rounded up to a whole permutation group.
fn keys_pad(seqlen_k: u64) -> u64 {
    seqlen_k.div_ceil(KEY_GROUP) * KEY_GROUP
}

/// Bytes of the workspace [`attn_fwd_fp8`] needs for `k`'s sizes (B×Hk×Sk×D): Vᵀ, one byte per
/// element of B×Hk×D×KEYS_PAD (KEYS_PAD = Sk rounded up to 32).
pub fn attn_fwd_fp8_workspace_bytes(k: &TensorView<4>) -> Result<u64> {
    let [b, hk, sk, d] = k.sizes;
    checked_product("fp8 forward workspace bytes", &[b, hk, d, keys_pad(sk)])
}

/// Vᵀ's view of the workspace: [B, Hk, D, KEYS_PAD] fp8, contiguous.
fn vt_view(ws: &Workspace, shape: &AttnShape) -> TensorView<4> {
    let kp = keys_pad(shape.seqlen_k);
    TensorView::contiguous(ws.ptr, [shape.batch, shape.heads_k, shape.head_dim, kp], DType::F8E4M3)
}

/// Checks every argument before anything touches the GPU: the shape, the mask and Vᵀ's view.
pub(crate) fn validate(p: &Fp8FwdParams) -> Result<(AttnShape, MaskArgs, TensorView<4>)> {
    let shape = check_qkv(&p.q, &p.k, &p.v, None, FAMILY, &FP8_INPUTS)?;
    if shape.splits_head_dims() {
        bail!(ShapeMismatch, "v: the fp8 forward takes V with Q/K's head dim ({}), got {}", shape.head_dim, shape.head_dim_v);
    }
    if !shape.head_dim.is_multiple_of(16) {
        bail!(UnsupportedHeadDim, "head dim {}: the fp8 forward takes multiples of 16 (TMA rows of 16 bytes)", shape.head_dim);
    }
    let [b, hq, sq, d] = p.q.sizes;
    check_tensor("o", &p.o, [b, hq, sq, d], DType::BF16)?;
    if let Some(lse) = &p.lse {
        check_tensor("lse", lse, [b, hq, sq], DType::F32)?;
    }
    for (name, t) in [("q_descale", &p.q_descale), ("k_descale", &p.k_descale), ("v_descale", &p.v_descale)] {
        check_tensor(name, t, [shape.batch, shape.heads_k], DType::F32)?;
    }
    check_scalars(&shape, None, p.sm_scale)?;
    if p.sm_scale.is_nan() || p.sm_scale <= 0.0 {
        bail!(InvalidArgument, "sm_scale is {}: the fp8 forward needs it positive", p.sm_scale);
    }
    // Every plain pointer is 16-byte aligned in the kernels' only variant (`aligned`).
    let lse_ptr = p.lse.map_or(0, |l| l.ptr);
    for (name, ptr) in [("lse", lse_ptr), ("q_descale", p.q_descale.ptr), ("k_descale", p.k_descale.ptr), ("v_descale", p.v_descale.ptr)] {
        if !ptr.is_multiple_of(16) {
            bail!(MisalignedPointer, "{name}: address {ptr:#x} is not 16-byte aligned (the fp8 forward assumes it)");
        }
    }
    let needed = attn_fwd_fp8_workspace_bytes(&p.k)?;
    let ws = match p.workspace {
        None => bail!(InvalidArgument, "the fp8 forward needs a workspace of {needed} bytes (attn_fwd_fp8_workspace_bytes); none was given"),
        Some(ws) if ws.bytes < needed => {
            bail!(InvalidArgument, "the fp8 forward needs a workspace of {needed} bytes (attn_fwd_fp8_workspace_bytes); {} were given", ws.bytes)
        }
        Some(ws) if ws.ptr == 0 || !ws.ptr.is_multiple_of(16) => {
            bail!(MisalignedPointer, "workspace: address {:#x} is not a 16-byte aligned device address", ws.ptr)
        }
        Some(ws) => ws,
    };
    let vt = vt_view(&ws, &shape);
    for (name, t) in [("q", TensorArg::from_view(&p.q)), ("k", TensorArg::from_view(&p.k)), ("o", TensorArg::from_view(&p.o)), ("workspace", TensorArg::from_view(&vt))] {
        crate::tma::check(&t).map_err(|problem| crate::Error::new(ErrorKind::BadStrides, format!("{name}: {problem}")))?;
    }
    let lse = match &p.lse {
        Some(lse) => Region::output("lse", lse)?,
        None => Region::NONE,
    };
    check_no_aliasing(
        &[Region::output("o", &p.o)?, lse, Region::raw("workspace", ws.ptr, needed)?],
        &[
            Region::input("q", &p.q)?,
            Region::input("k", &p.k)?,
            Region::input("v", &p.v)?,
            Region::input("q_descale", &p.q_descale)?,
            Region::input("k_descale", &p.k_descale)?,
            Region::input("v_descale", &p.v_descale)?,
        ],
    )?;
    Ok((shape, mask_args(&p.mask, &shape)?, vt))
}

/// The functional key of both kernels: fp8, Q/K's head-dim bucket.
fn axes(shape: &AttnShape) -> Axes {
    Axes::of(&[("dtype", DType::F8E4M3.triton_name()), ("head_dim", shape.head_dim_axis)])
}

fn i32_arg(name: &'static str, value: u64) -> Result<(&'static str, ArgValue)> {
    match i32::try_from(value) {
        Ok(v) => Ok((name, ArgValue::I32(v))),
        Err(_) => bail!(TooLarge, "{name} = {value} does not fit the kernel's int32"),
    }
}

/// Arguments of `transpose_v_fp8` (fwd_fp8_vt.py).
fn transpose_args(p: &Fp8FwdParams, shape: &AttnShape, vt: &TensorView<4>) -> Result<ArgList> {
    use ArgValue::{I64, Ptr};
    let mut args = ArgList::new();
    args.extend([
        ("V", Ptr(p.v.ptr)),
        ("stride_vz", I64(p.v.strides[0])),
        ("stride_vh", I64(p.v.strides[1])),
        i32_arg("stride_vn", p.v.strides[2] as u64)?,
        ("VT", Ptr(vt.ptr)),
        ("stride_vtz", I64(vt.strides[0])),
        ("stride_vth", I64(vt.strides[1])),
        ("stride_vtd", I64(vt.strides[2])),
        i32_arg("N_CTX_K", shape.seqlen_k)?,
        i32_arg("KEYS_PAD", vt.sizes[3])?,
        i32_arg("D_HEAD", shape.head_dim)?,
    ]);
    Ok(args)
}

/// Arguments of `attn_fwd_gluon_fp8` (ABI.md).
fn fwd_args(p: &Fp8FwdParams, shape: &AttnShape, mask: &MaskArgs, vt: &TensorView<4>) -> ArgList {
    use ArgValue::{I64, Ptr, Tensor};
    let mut args = ArgList::new();
    args.extend([
        ("desc_q", Tensor(TensorArg::from_view(&p.q))),
        ("desc_k", Tensor(TensorArg::from_view(&p.k))),
        ("desc_vt", Tensor(TensorArg::from_view(vt))),
        ("desc_o", Tensor(TensorArg::from_view(&p.o))),
    ]);
    gluon::push_fwd_common_args(&mut args, p.lse.as_ref(), p.sm_scale, shape, mask);
    args.extend([
        ("DESCALE_Q", Ptr(p.q_descale.ptr)),
        ("stride_dsqz", I64(p.q_descale.strides[0])),
        ("stride_dsqh", I64(p.q_descale.strides[1])),
        ("DESCALE_K", Ptr(p.k_descale.ptr)),
        ("stride_dskz", I64(p.k_descale.strides[0])),
        ("stride_dskh", I64(p.k_descale.strides[1])),
        ("DESCALE_V", Ptr(p.v_descale.ptr)),
        ("stride_dsvz", I64(p.v_descale.strides[0])),
        ("stride_dsvh", I64(p.v_descale.strides[1])),
    ]);
    args
}

/// Enqueues Vᵀ into the workspace, then the fp8 forward, on `stream` (the device is the
/// stream's; sm_90 only). Nothing is launched when an argument is invalid, the device is not
/// sm_90 or the archive lacks either kernel.
pub fn attn_fwd_fp8(params: &Fp8FwdParams, stream: Stream) -> Result<()> {
    let (shape, mask, vt) = validate(params)?;
    let axes = axes(&shape);
    let t_args = transpose_args(params, &shape, &vt)?;
    let f_args = fwd_args(params, &shape, &mask, &vt);
    let t_request = Request { family: TRANSPOSE_FAMILY, axes: axes.as_slice()?, args: t_args.args()? };
    let f_request = Request { family: FAMILY, axes: axes.as_slice()?, args: f_args.args()? };
    let launcher = Launcher::new(stream)?;
    let device = launcher.device();
    gluon::device_supported(&device.arch).map_err(|why| why.error("attn_fwd_fp8", Some(device)))?;
    let (keys, heads_k, batch) = (vt.sizes[3], shape.heads_k, shape.batch);
    let transpose = launcher.prepare(&t_request, first_preferred, |meta| Ok([blocks(keys, meta, "BLOCK_N", 64), heads_k, batch]))?;
    let multiprocessors = device.multiprocessors;
    let forward = launcher.prepare(&f_request, first_preferred, |meta| gluon::fwd_grid(meta, &shape, multiprocessors))?;
    launcher.launch(&transpose)?;
    launcher.launch(&forward)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::fitting_kernels;
    use crate::images;

    const B: u64 = 2;
    const HQ: u64 = 4;
    const HK: u64 = 2;
    const SQ: u64 = 17;
    const SK: u64 = 33;
    const D: u64 = 128;

    /// A well-formed GQA call on fake, aligned device addresses (never dereferenced here).
    fn valid() -> Fp8FwdParams {
        // 2^32 bytes apart: no two overlap whatever sizes a test gives them.
        let t = |i: u64, h, s, dtype| TensorView::contiguous(i << 32, [B, h, s, D], dtype);
        let descale = |i: u64| TensorView::contiguous(i << 32, [B, HK], DType::F32);
        let lse = TensorView::contiguous(5 << 32, [B, HQ, SQ], DType::F32);
        let mut p = Fp8FwdParams::new(
            t(1, HQ, SQ, DType::F8E4M3),
            t(2, HK, SK, DType::F8E4M3),
            t(3, HK, SK, DType::F8E4M3),
            t(4, HQ, SQ, DType::BF16),
            Some(lse),
            descale(6),
            descale(7),
            descale(8),
        );
        p.workspace = Some(Workspace { ptr: 9 << 32, bytes: attn_fwd_fp8_workspace_bytes(&p.k).unwrap() });
        p
    }

    #[test]
    fn workspace_holds_vt_with_keys_padded_to_32() {
        // Sk 33 -> 64 key columns, one byte each.
        assert_eq!(attn_fwd_fp8_workspace_bytes(&valid().k).unwrap(), B * HK * D * 64);
        let (shape, _, vt) = validate(&valid()).unwrap();
        assert_eq!(vt.sizes, [B, HK, D, 64]);
        assert_eq!((shape.head_dim_axis, shape.gqa_group()), ("128", 2));
        let huge = TensorView::contiguous(1 << 32, [u64::MAX / 2, 2, 33, D], DType::F8E4M3);
        assert_eq!(attn_fwd_fp8_workspace_bytes(&huge).unwrap_err().kind(), ErrorKind::TooLarge);
    }

    #[test]
    fn every_validation_error_has_its_kind() {
        type Mutation = Box<dyn Fn(&mut Fp8FwdParams)>;
        let head_dim = |d: u64| -> Mutation {
            Box::new(move |p: &mut Fp8FwdParams| {
                for t in [&mut p.q, &mut p.k, &mut p.v, &mut p.o] {
                    *t = TensorView::contiguous(t.ptr, [t.sizes[0], t.sizes[1], t.sizes[2], d], t.dtype);
                }
            })
        };
        let cases: Vec<(&str, Mutation, ErrorKind)> = vec![
            ("q fp16", Box::new(|p| p.q.dtype = DType::F16), ErrorKind::UnsupportedDType),
            ("k bf16", Box::new(|p| p.k.dtype = DType::BF16), ErrorKind::DTypeMismatch),
            ("o fp16", Box::new(|p| p.o.dtype = DType::F16), ErrorKind::DTypeMismatch),
            ("o fp8", Box::new(|p| p.o.dtype = DType::F8E4M3), ErrorKind::DTypeMismatch),
            ("head dim 72 (not a multiple of 16)", head_dim(72), ErrorKind::UnsupportedHeadDim),
            ("head dim 512 (not compiled)", head_dim(512), ErrorKind::UnsupportedHeadDim),
            ("v with its own head dim", Box::new(|p| p.v = TensorView::contiguous(p.v.ptr, [B, HK, SK, 64], DType::F8E4M3)), ErrorKind::ShapeMismatch),
            ("q_descale per query head", Box::new(|p| p.q_descale.sizes = [B, HQ]), ErrorKind::ShapeMismatch),
            ("v_descale fp16", Box::new(|p| p.v_descale.dtype = DType::F16), ErrorKind::DTypeMismatch),
            ("k_descale misaligned", Box::new(|p| p.k_descale.ptr += 4), ErrorKind::MisalignedPointer),
            ("sm_scale 0", Box::new(|p| p.sm_scale = 0.0), ErrorKind::InvalidArgument),
            ("sm_scale negative", Box::new(|p| p.sm_scale = -0.1), ErrorKind::InvalidArgument),
            ("no workspace", Box::new(|p| p.workspace = None), ErrorKind::InvalidArgument),
            ("workspace a byte short", Box::new(|p| p.workspace.as_mut().unwrap().bytes -= 1), ErrorKind::InvalidArgument),
            ("workspace misaligned", Box::new(|p| p.workspace.as_mut().unwrap().ptr += 8), ErrorKind::MisalignedPointer),
            ("workspace over q", Box::new(|p| p.workspace.as_mut().unwrap().ptr = p.q.ptr), ErrorKind::InvalidArgument),
            ("o over k", Box::new(|p| p.o.ptr = p.k.ptr), ErrorKind::InvalidArgument),
            ("q rows not 16-byte aligned for TMA", Box::new(|p| p.q.strides[2] = 136), ErrorKind::BadStrides),
        ];
        for (name, mutate, kind) in cases {
            let mut p = valid();
            mutate(&mut p);
            match validate(&p) {
                Ok(_) => panic!("{name}: accepted"),
                Err(e) => assert_eq!(e.kind(), kind, "{name}: {e}"),
            }
        }
    }

    #[test]
    fn arguments_fit_the_compiled_kernels() {
        // Both kernels of the call exist in the sm_90 archive, and one of each accepts the
        // arguments as built (names, types, alignment hints).
        if !images::built_archs().contains(&"sm_90") {
            println!("skipped: this build embeds no sm_90 archive");
            return;
        }
        let loaded = images::archive_for("sm_90").unwrap();
        let p = valid();
        let (shape, mask, vt) = validate(&p).unwrap();
        let axes = axes(&shape);
        for (family, args) in [(TRANSPOSE_FAMILY, transpose_args(&p, &shape, &vt).unwrap()), (FAMILY, fwd_args(&p, &shape, &mask, &vt))] {
            let request = Request { family, axes: axes.as_slice().unwrap(), args: args.args().unwrap() };
            let index = crate::dispatch::find_functional(&loaded, &request).unwrap_or_else(|e| panic!("{family}: {e}"));
            let functional = &loaded.archive.functionals()[index];
            assert!(!fitting_kernels(functional, request.args).unwrap().is_empty(), "{family}: no kernel fits");
        }
    }
}
