//! `attn_bwd`: dQ, dK, dV from Q, K, V, O, dO and the forward's log-sum-exp.
//!
//! Three kernels on the caller's stream: `attn_bwd_preprocess` writes delta = rowsum(dO ∘ O)
//! into the caller's `delta` buffer; `attn_bwd_dkdv` computes dK and dV, one program per K/V
//! block and K/V head, summing over the query heads of its GQA group inside the program;
//! `attn_bwd_dq` computes dQ, one program per query block and head. No atomics: the results are
//! bitwise reproducible run to run and stream to stream.
use super::{
    AttnShape, Mask, MaskArgs, axes, blocks, check_qkv, check_rows, check_tensor, common_args, mask_args, strides3,
    strides4,
};
use crate::archive::Functional;
use crate::dispatch::{ArgValue, Launcher, Request, preferred_variant};
use crate::driver::Stream;
use crate::driver::cuda::DeviceInfo;
use crate::error::{Result, bail};
use crate::tensor::{DType, TensorView};

/// Parameters of [`attn_bwd`]. Non-exhaustive: build it with [`BwdParams::new`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct BwdParams {
    /// The forward's inputs: q B×Hq×Sq×D, k and v B×Hk×Sk×D (fp16 or bf16).
    pub q: TensorView<4>,
    pub k: TensorView<4>,
    pub v: TensorView<4>,
    /// The forward's output, B×Hq×Sq×D.
    pub o: TensorView<4>,
    /// The gradient of the loss with respect to `o`, B×Hq×Sq×D.
    pub d_o: TensorView<4>,
    /// The forward's log-sum-exp, B×Hq×Sq fp32. Required.
    pub lse: TensorView<3>,
    /// Workspace, B×Hq×Sq fp32: overwritten with rowsum(dO ∘ O). Its contents on entry do not
    /// matter; it must not alias any other tensor of the call.
    pub delta: TensorView<3>,
    /// Gradient outputs, overwritten: dq like q, dk like k, dv like v.
    pub dq: TensorView<4>,
    pub dk: TensorView<4>,
    pub dv: TensorView<4>,
    /// The forward's scale and mask.
    pub sm_scale: f32,
    pub mask: Mask,
}

impl BwdParams {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        q: TensorView<4>,
        k: TensorView<4>,
        v: TensorView<4>,
        o: TensorView<4>,
        d_o: TensorView<4>,
        lse: TensorView<3>,
        delta: TensorView<3>,
        dq: TensorView<4>,
        dk: TensorView<4>,
        dv: TensorView<4>,
    ) -> Self {
        let head_dim = q.sizes[3].max(1) as f32;
        BwdParams { q, k, v, o, d_o, lse, delta, dq, dk, dv, sm_scale: 1.0 / head_dim.sqrt(), mask: Mask::NONE }
    }
}

/// Enqueues the backward pass on `stream`. All three kernels are chosen and loaded before the
/// first is enqueued, so an error leaves nothing half-done.
pub fn attn_bwd(params: &BwdParams, stream: Stream) -> Result<()> {
    let (shape, mask) = validate(params)?;
    let dtype = params.q.dtype;
    let preprocess_axes = axes(dtype, &shape, None);
    let masked_axes = axes(dtype, &shape, Some(mask.windowed));
    let preprocess_args = preprocess_args(params, &shape);
    let args = kernel_args(params, &shape, &mask);
    let preprocess = Request { family: "attn_bwd_preprocess", axes: &preprocess_axes, args: &preprocess_args };
    let dkdv = Request { family: "attn_bwd_dkdv", axes: &masked_axes, args: &args };
    let dq = Request { family: "attn_bwd_dq", axes: &masked_axes, args: &args };

    let launcher = Launcher::new(stream)?;
    let (b, hq, hk) = (shape.batch as u32, shape.heads_q as u32, shape.heads_k as u32);
    let kernels = [
        launcher.prepare(&preprocess, choose_kernel, |m| [blocks(shape.seqlen_q, m, "BLOCK_M"), hq, b])?,
        launcher.prepare(&dkdv, choose_kernel, |m| [blocks(shape.seqlen_k, m, "BLOCK_N"), hk, b])?,
        launcher.prepare(&dq, choose_kernel, |m| [blocks(shape.seqlen_q, m, "BLOCK_M"), hq, b])?,
    ];
    for kernel in &kernels {
        launcher.launch(kernel)?;
    }
    Ok(())
}

/// The backward families compile one config per variant: the aligned one when its hints fit.
fn choose_kernel(functional: &Functional, fitting: &[usize], _device: &DeviceInfo) -> usize {
    preferred_variant(functional, fitting)[0]
}

fn preprocess_args(p: &BwdParams, shape: &AttnShape) -> Vec<(&'static str, ArgValue)> {
    use ArgValue::{I32, Ptr};
    let mut args = vec![("O", Ptr(p.o.ptr)), ("DO", Ptr(p.d_o.ptr)), ("DELTA", Ptr(p.delta.ptr))];
    args.extend(strides4(["stride_oz", "stride_oh", "stride_om"], &p.o));
    args.extend(strides4(["stride_doz", "stride_doh", "stride_dom"], &p.d_o));
    args.extend(strides3(["stride_deltaz", "stride_deltah"], &p.delta));
    args.extend([("N_CTX_Q", I32(shape.seqlen_q as i32)), ("D_HEAD", I32(shape.head_dim as i32))]);
    args
}

/// Arguments of `attn_bwd_dkdv` and `attn_bwd_dq` by name (each takes the ones it declares).
fn kernel_args(p: &BwdParams, shape: &AttnShape, mask: &MaskArgs) -> Vec<(&'static str, ArgValue)> {
    use ArgValue::{F32, Ptr};
    let mut args = vec![
        ("Q", Ptr(p.q.ptr)),
        ("K", Ptr(p.k.ptr)),
        ("V", Ptr(p.v.ptr)),
        ("DO", Ptr(p.d_o.ptr)),
        ("LSE", Ptr(p.lse.ptr)),
        ("DELTA", Ptr(p.delta.ptr)),
        ("DQ", Ptr(p.dq.ptr)),
        ("DK", Ptr(p.dk.ptr)),
        ("DV", Ptr(p.dv.ptr)),
        ("sm_scale", F32(p.sm_scale)),
    ];
    args.extend(strides4(["stride_qz", "stride_qh", "stride_qm"], &p.q));
    args.extend(strides4(["stride_kz", "stride_kh", "stride_kn"], &p.k));
    args.extend(strides4(["stride_vz", "stride_vh", "stride_vn"], &p.v));
    args.extend(strides4(["stride_doz", "stride_doh", "stride_dom"], &p.d_o));
    args.extend(strides4(["stride_dqz", "stride_dqh", "stride_dqm"], &p.dq));
    args.extend(strides4(["stride_dkz", "stride_dkh", "stride_dkn"], &p.dk));
    args.extend(strides4(["stride_dvz", "stride_dvh", "stride_dvn"], &p.dv));
    args.extend(strides3(["stride_lz", "stride_lh"], &p.lse));
    args.extend(strides3(["stride_deltaz", "stride_deltah"], &p.delta));
    args.extend(common_args(shape, mask));
    args
}

/// Checks every argument before anything touches the GPU.
pub(crate) fn validate(p: &BwdParams) -> Result<(AttnShape, MaskArgs)> {
    let shape = check_qkv(&p.q, &p.k, &p.v, "attn_bwd_dq")?;
    let dtype = p.q.dtype;
    if p.lse.is_null() {
        bail!(NullPointer, "lse: the backward needs the forward's log-sum-exp (ask attn_fwd for it)");
    }
    let rows = [shape.batch, shape.heads_q, shape.seqlen_q];
    for (name, t, sizes, seqlen) in [
        ("o", &p.o, p.q.sizes, shape.seqlen_q),
        ("d_o", &p.d_o, p.q.sizes, shape.seqlen_q),
        ("dq", &p.dq, p.q.sizes, shape.seqlen_q),
        ("dk", &p.dk, p.k.sizes, shape.seqlen_k),
        ("dv", &p.dv, p.v.sizes, shape.seqlen_k),
    ] {
        check_tensor(name, t, sizes, dtype)?;
        check_rows(name, t, seqlen, shape.head_dim)?;
    }
    check_tensor("lse", &p.lse, rows, DType::F32)?;
    check_tensor("delta", &p.delta, rows, DType::F32)?;
    if !p.sm_scale.is_finite() {
        bail!(InvalidArgument, "sm_scale must be finite, got {}", p.sm_scale);
    }
    let mask = mask_args(&p.mask, &shape)?;
    Ok((shape, mask))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use crate::dispatch::{self, fitting_kernels};
    use crate::flash::MaskAlign;
    use crate::images;

    const B: u64 = 2;
    const HQ: u64 = 8;
    const HK: u64 = 2;
    const SQ: u64 = 31;
    const SK: u64 = 13;

    fn params(d: u64, dtype: DType) -> BwdParams {
        let mut next = 0x100000u64;
        let mut t4 = |h, s| {
            next += 0x100000;
            TensorView::contiguous(next, [B, h, s, d], dtype)
        };
        let (q, k, v, o, d_o) = (t4(HQ, SQ), t4(HK, SK), t4(HK, SK), t4(HQ, SQ), t4(HQ, SQ));
        let (dq, dk, dv) = (t4(HQ, SQ), t4(HK, SK), t4(HK, SK));
        let lse = TensorView::contiguous(0x9000000, [B, HQ, SQ], DType::F32);
        let delta = TensorView::contiguous(0xa000000, [B, HQ, SQ], DType::F32);
        BwdParams::new(q, k, v, o, d_o, lse, delta, dq, dk, dv)
    }

    fn valid() -> BwdParams {
        params(64, DType::BF16)
    }

    #[test]
    fn valid_params_pass_validation() {
        let (shape, _) = validate(&valid()).unwrap();
        assert_eq!(shape.gqa_group(), 4);
    }

    #[test]
    fn every_validation_error_has_its_kind() {
        type Mutation = Box<dyn Fn(&mut BwdParams)>;
        let cases: Vec<(&str, Mutation, ErrorKind)> = vec![
            ("lse missing", Box::new(|p| p.lse.ptr = 0), ErrorKind::NullPointer),
            ("delta missing", Box::new(|p| p.delta.ptr = 0), ErrorKind::NullPointer),
            ("d_o seqlen", Box::new(|p| p.d_o.sizes[2] = SQ + 1), ErrorKind::ShapeMismatch),
            ("d_o heads", Box::new(|p| p.d_o.sizes[1] = HK), ErrorKind::ShapeMismatch),
            ("dk shaped like q", Box::new(|p| p.dk.sizes = p.q.sizes), ErrorKind::ShapeMismatch),
            ("dv seqlen", Box::new(|p| p.dv.sizes[2] = SK + 1), ErrorKind::ShapeMismatch),
            ("dq dtype", Box::new(|p| p.dq.dtype = DType::F16), ErrorKind::DTypeMismatch),
            ("d_o dtype", Box::new(|p| p.d_o.dtype = DType::F16), ErrorKind::DTypeMismatch),
            ("delta dtype", Box::new(|p| p.delta.dtype = DType::BF16), ErrorKind::DTypeMismatch),
            ("lse rows", Box::new(|p| p.lse.sizes[2] = SK), ErrorKind::ShapeMismatch),
            (
                "Hq not a multiple of Hk",
                Box::new(|p| {
                    for t in [&mut p.k, &mut p.v, &mut p.dk, &mut p.dv] {
                        t.sizes[1] = 3;
                    }
                }),
                ErrorKind::ShapeMismatch,
            ),
            ("dv misaligned", Box::new(|p| p.dv.ptr += 1), ErrorKind::MisalignedPointer),
            ("dq last stride", Box::new(|p| p.dq.strides[3] = 3), ErrorKind::BadStrides),
            ("window left -3", Box::new(|p| p.mask = Mask::window(-3, 0, MaskAlign::TopLeft)), ErrorKind::InvalidArgument),
            ("scale NaN", Box::new(|p| p.sm_scale = f32::NAN), ErrorKind::InvalidArgument),
        ];
        for (name, mutate, want) in cases {
            let mut p = valid();
            mutate(&mut p);
            let err = validate(&p).expect_err(name);
            assert_eq!(err.kind(), want, "{name}: {err}");
        }
        let err = {
            let mut p = valid();
            p.lse.ptr = 0;
            validate(&p).unwrap_err()
        };
        assert!(err.message().contains("log-sum-exp"), "{err}");
        for d in [4, 20, 264] {
            assert_eq!(validate(&params(d, DType::F16)).unwrap_err().kind(), ErrorKind::UnsupportedHeadDim, "d={d}");
        }
    }

    /// The three kernels `attn_bwd` would choose on the first built arch's archive.
    fn picks(p: &BwdParams) -> Vec<crate::archive::KernelMeta> {
        let (shape, mask) = validate(p).unwrap();
        let loaded = images::archive_for(images::built_archs()[0]).unwrap();
        let pre_axes = axes(p.q.dtype, &shape, None);
        let masked_axes = axes(p.q.dtype, &shape, Some(mask.windowed));
        let (pre_args, args) = (preprocess_args(p, &shape), kernel_args(p, &shape, &mask));
        [("attn_bwd_preprocess", &pre_axes, &pre_args), ("attn_bwd_dkdv", &masked_axes, &args), ("attn_bwd_dq", &masked_axes, &args)]
            .into_iter()
            .map(|(family, axes, args)| {
                let request = Request { family, axes, args };
                let functional = &loaded.archive.functionals()[dispatch::find_functional(&loaded, &request).unwrap()];
                let fitting = fitting_kernels(functional, args).unwrap();
                let device = crate::flash::fwd::tests::h100_like();
                functional.kernels[choose_kernel(functional, &fitting, &device)].clone()
            })
            .collect()
    }

    #[test]
    fn every_head_dim_and_mask_finds_its_kernels() {
        for d in [8, 24, 40, 64, 72, 80, 96, 128, 160, 192, 224, 256] {
            for mask in [Mask::NONE, Mask::causal(MaskAlign::BottomRight), Mask::window(0, 0, MaskAlign::TopLeft)] {
                let mut p = params(d, DType::F16);
                p.mask = mask;
                let chosen = picks(&p);
                assert!(chosen.iter().all(|k| k.variant == "aligned"), "d={d}: {chosen:?}");
            }
        }
        let mut p = valid();
        p.d_o.ptr += 2;
        let chosen = picks(&p);
        assert_eq!(chosen[0].variant, "generic", "preprocess reads dO");
        assert_eq!(chosen[1].variant, "generic", "dkdv reads dO");
    }
}
