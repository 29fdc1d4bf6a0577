//! `attn_fwd`: O = softmax(sm_scale · Q·Kᵀ [+ causal mask]) · V, plus the log-sum-exp.
use crate::archive::Functional;
use crate::dispatch::{self, ArgValue, Request};
use crate::driver::Stream;
use crate::driver::cuda::DeviceInfo;
use crate::error::{Result, bail};
use crate::images;
use crate::tensor::{DType, TensorView};

/// Parameters of [`attn_fwd`]. Marked non-exhaustive so later versions can add fields: build it
/// with [`FwdParams::new`] and set the public fields you need.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct FwdParams {
    /// B×H×Sq×D, fp16 or bf16.
    pub q: TensorView<4>,
    /// B×H×Sk×D, same dtype as `q`.
    pub k: TensorView<4>,
    /// B×H×Sk×D, same dtype as `q`.
    pub v: TensorView<4>,
    /// B×H×Sq×D output, same dtype as `q`.
    pub o: TensorView<4>,
    /// B×H×Sq fp32 output: the natural-log log-sum-exp of each query row's scaled scores.
    pub lse: TensorView<3>,
    /// Scale applied to Q·Kᵀ; `new` sets 1/√D.
    pub sm_scale: f32,
    /// Causal mask aligned top-left: query i sees keys j ≤ i.
    pub causal: bool,
}

impl FwdParams {
    pub fn new(
        q: TensorView<4>,
        k: TensorView<4>,
        v: TensorView<4>,
        o: TensorView<4>,
        lse: TensorView<3>,
    ) -> Self {
        let head_dim = q.sizes[3].max(1) as f32;
        FwdParams { q, k, v, o, lse, sm_scale: 1.0 / head_dim.sqrt(), causal: false }
    }
}

/// The checked shape of a forward call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FwdShape {
    pub batch: u64,
    pub heads: u64,
    pub seqlen_q: u64,
    pub seqlen_k: u64,
    pub head_dim: u64,
}

/// Enqueues the forward attention on `stream` (the device is the stream's). Returns once the
/// kernel is launched; nothing is launched when an argument is invalid.
pub fn attn_fwd(params: &FwdParams, stream: Stream) -> Result<()> {
    let shape = validate(params)?;
    let axes = functional_axes(params, &shape);
    let args = kernel_args(params, &shape);
    let request = Request { family: "attn_fwd", axes: &axes, args: &args };
    dispatch::run(
        stream,
        &request,
        |functional, fitting, device| choose_kernel(functional, fitting, &shape, device),
        |meta| {
            let block_m = meta.config.get("BLOCK_M").copied().unwrap_or(128).max(1) as u64;
            [shape.seqlen_q.div_ceil(block_m) as u32, shape.heads as u32, shape.batch as u32]
        },
    )
}

pub(crate) fn functional_axes(params: &FwdParams, shape: &FwdShape) -> [(&'static str, String); 3] {
    [
        ("dtype", params.q.dtype.triton_name().to_string()),
        ("head_dim", shape.head_dim.to_string()),
        ("causal", params.causal.to_string()),
    ]
}

/// The kernel's arguments by name (see python/kernels/flash/fwd.py). Order and types of the
/// launch come from each kernel's metadata, not from this list.
pub(crate) fn kernel_args(params: &FwdParams, shape: &FwdShape) -> [(&'static str, ArgValue); 22] {
    use ArgValue::{F32, I32, I64, Ptr};
    let (q, k, v, o, lse) = (&params.q, &params.k, &params.v, &params.o, &params.lse);
    // Row strides are i32 in the kernel; `validate` checked that they and every row offset fit.
    [
        ("Q", Ptr(q.ptr)),
        ("K", Ptr(k.ptr)),
        ("V", Ptr(v.ptr)),
        ("O", Ptr(o.ptr)),
        ("LSE", Ptr(lse.ptr)),
        ("sm_scale", F32(params.sm_scale)),
        ("stride_qz", I64(q.strides[0])),
        ("stride_qh", I64(q.strides[1])),
        ("stride_qm", I32(q.strides[2] as i32)),
        ("stride_kz", I64(k.strides[0])),
        ("stride_kh", I64(k.strides[1])),
        ("stride_kn", I32(k.strides[2] as i32)),
        ("stride_vz", I64(v.strides[0])),
        ("stride_vh", I64(v.strides[1])),
        ("stride_vn", I32(v.strides[2] as i32)),
        ("stride_oz", I64(o.strides[0])),
        ("stride_oh", I64(o.strides[1])),
        ("stride_om", I32(o.strides[2] as i32)),
        ("stride_lz", I64(lse.strides[0])),
        ("stride_lh", I64(lse.strides[1])),
        ("N_CTX_Q", I32(shape.seqlen_q as i32)),
        ("N_CTX_K", I32(shape.seqlen_k as i32)),
    ]
}

/// The documented config heuristic (python/rules.py): among the kernels whose alignment hints
/// fit, prefer the `aligned` variant; then take the largest BLOCK_M whose grid
/// cdiv(Sq, BLOCK_M)·H·B gives every multiprocessor at least one program, or else the smallest
/// BLOCK_M (more, smaller programs for small problems).
pub(crate) fn choose_kernel(
    functional: &Functional,
    fitting: &[usize],
    shape: &FwdShape,
    device: &DeviceInfo,
) -> usize {
    let block_m = |i: usize| functional.kernels[i].config.get("BLOCK_M").copied().unwrap_or(0).max(1) as u64;
    let aligned: Vec<usize> =
        fitting.iter().copied().filter(|&i| functional.kernels[i].variant == "aligned").collect();
    let pool = if aligned.is_empty() { fitting.to_vec() } else { aligned };
    let programs = |i: usize| shape.seqlen_q.div_ceil(block_m(i)) * shape.heads * shape.batch;
    let filling = pool.iter().copied().filter(|&i| programs(i) >= device.multiprocessors as u64);
    filling
        .max_by_key(|&i| (block_m(i), std::cmp::Reverse(i)))
        .or_else(|| pool.iter().copied().min_by_key(|&i| (block_m(i), i)))
        .expect("dispatch passes at least one fitting kernel")
}

/// Checks every argument before anything touches the GPU. Each problem has its own error kind.
pub(crate) fn validate(p: &FwdParams) -> Result<FwdShape> {
    for (name, t) in [("q", &p.q), ("k", &p.k), ("v", &p.v), ("o", &p.o)] {
        t.check_layout(name)?;
    }
    p.lse.check_layout("lse")?;

    let dtype = p.q.dtype;
    if !matches!(dtype, DType::F16 | DType::BF16) {
        bail!(UnsupportedDType, "q: attn_fwd takes fp16 or bf16 inputs, got {}", dtype.triton_name());
    }
    for (name, t) in [("k", &p.k), ("v", &p.v), ("o", &p.o)] {
        if t.dtype != dtype {
            bail!(DTypeMismatch, "{name} is {} but q is {}", t.dtype.triton_name(), dtype.triton_name());
        }
    }
    if p.lse.dtype != DType::F32 {
        bail!(DTypeMismatch, "lse must be fp32, got {}", p.lse.dtype.triton_name());
    }

    let [batch, heads, seqlen_q, head_dim] = p.q.sizes;
    let seqlen_k = p.k.sizes[2];
    let expect = [
        ("k", p.k.sizes, [batch, heads, seqlen_k, head_dim]),
        ("v", p.v.sizes, [batch, heads, seqlen_k, head_dim]),
        ("o", p.o.sizes, [batch, heads, seqlen_q, head_dim]),
    ];
    for (name, got, want) in expect {
        if got != want {
            bail!(ShapeMismatch, "{name}.sizes is {got:?}, expected {want:?} (from q {:?} and k)", p.q.sizes);
        }
    }
    if p.lse.sizes != [batch, heads, seqlen_q] {
        bail!(ShapeMismatch, "lse.sizes is {:?}, expected [B, H, Sq] = {:?}", p.lse.sizes, [batch, heads, seqlen_q]);
    }
    for (what, n) in [("batch", batch), ("heads", heads), ("Sq", seqlen_q), ("Sk", seqlen_k)] {
        if n == 0 {
            bail!(EmptyInput, "{what} is 0: nothing to attend (q {:?}, k {:?})", p.q.sizes, p.k.sizes);
        }
    }

    let compiled = images::compiled_axis_values("attn_fwd", "head_dim")?;
    if !compiled.contains(&head_dim.to_string()) {
        bail!(UnsupportedHeadDim, "head dim {head_dim} is not compiled (this build has: {})", compiled.join(", "));
    }
    if !p.sm_scale.is_finite() {
        bail!(InvalidArgument, "sm_scale must be finite, got {}", p.sm_scale);
    }

    // Grid: (cdiv(Sq, BLOCK_M), H, B); the y and z extents are limited to 65535.
    if heads > 65535 || batch > 65535 {
        bail!(TooLarge, "heads ({heads}) and batch ({batch}) must each be at most 65535");
    }
    // The kernel indexes rows in int32: the last row's offset must fit.
    for (name, t, rows) in [("q", &p.q, seqlen_q), ("k", &p.k, seqlen_k), ("v", &p.v, seqlen_k), ("o", &p.o, seqlen_q)] {
        let row_extent = (rows as i128 - 1) * t.strides[2] as i128 + head_dim as i128;
        if row_extent > i32::MAX as i128 {
            bail!(TooLarge, "{name}: rows × row stride ({rows} × {}) overflows the kernel's 32-bit row offsets", t.strides[2]);
        }
    }
    if seqlen_q > i32::MAX as u64 || seqlen_k > i32::MAX as u64 {
        bail!(TooLarge, "sequence lengths must be below 2^31");
    }
    Ok(FwdShape { batch, heads, seqlen_q, seqlen_k, head_dim })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use crate::dispatch::fitting_kernels;

    const B: u64 = 2;
    const H: u64 = 3;
    const SQ: u64 = 17;
    const SK: u64 = 33;
    const D: u64 = 64;

    /// A well-formed call on fake, 256-byte aligned device addresses (never dereferenced here).
    fn valid() -> FwdParams {
        let t = |ptr, s| TensorView::contiguous(ptr, [B, H, s, D], DType::F16);
        FwdParams::new(
            t(0x10000, SQ),
            t(0x20000, SK),
            t(0x30000, SK),
            t(0x40000, SQ),
            TensorView::contiguous(0x50000, [B, H, SQ], DType::F32),
        )
    }

    /// Sets size `dim` (0 = batch, 1 = heads) of every tensor, so the shapes stay consistent.
    fn set_outer_size(p: &mut FwdParams, dim: usize, size: u64) {
        for t in [&mut p.q, &mut p.k, &mut p.v, &mut p.o] {
            t.sizes[dim] = size;
        }
        p.lse.sizes[dim] = size;
    }

    #[test]
    fn valid_params_pass_validation() {
        let shape = validate(&valid()).unwrap();
        assert_eq!(shape, FwdShape { batch: B, heads: H, seqlen_q: SQ, seqlen_k: SK, head_dim: D });
    }

    #[test]
    fn every_validation_error_has_its_kind() {
        let cases: Vec<(&str, Box<dyn Fn(&mut FwdParams)>, ErrorKind)> = vec![
            ("k dtype", Box::new(|p| p.k.dtype = DType::BF16), ErrorKind::DTypeMismatch),
            ("o dtype", Box::new(|p| p.o.dtype = DType::BF16), ErrorKind::DTypeMismatch),
            ("lse dtype", Box::new(|p| p.lse.dtype = DType::F16), ErrorKind::DTypeMismatch),
            (
                "fp32 inputs",
                Box::new(|p| {
                    for t in [&mut p.q, &mut p.k, &mut p.v, &mut p.o] {
                        t.dtype = DType::F32;
                    }
                }),
                ErrorKind::UnsupportedDType,
            ),
            ("v seqlen", Box::new(|p| p.v.sizes[2] = SK + 1), ErrorKind::ShapeMismatch),
            ("k batch", Box::new(|p| p.k.sizes[0] = B + 1), ErrorKind::ShapeMismatch),
            ("o heads", Box::new(|p| p.o.sizes[1] = H + 1), ErrorKind::ShapeMismatch),
            ("lse seqlen", Box::new(|p| p.lse.sizes[2] = SQ + 1), ErrorKind::ShapeMismatch),
            ("k head dim", Box::new(|p| p.k.sizes[3] = 128), ErrorKind::ShapeMismatch),
            ("negative stride", Box::new(|p| p.k.strides[1] = -64), ErrorKind::BadStrides),
            ("last stride", Box::new(|p| p.q.strides[3] = 2), ErrorKind::BadStrides),
            ("lse last stride", Box::new(|p| p.lse.strides[2] = 2), ErrorKind::BadStrides),
            (
                "head dim 80",
                Box::new(|p| {
                    for t in [&mut p.q, &mut p.k, &mut p.v, &mut p.o] {
                        *t = TensorView::contiguous(t.ptr, [t.sizes[0], t.sizes[1], t.sizes[2], 80], t.dtype);
                    }
                }),
                ErrorKind::UnsupportedHeadDim,
            ),
            ("q null", Box::new(|p| p.q.ptr = 0), ErrorKind::NullPointer),
            ("lse null", Box::new(|p| p.lse.ptr = 0), ErrorKind::NullPointer),
            ("v misaligned", Box::new(|p| p.v.ptr += 1), ErrorKind::MisalignedPointer),
            ("lse misaligned", Box::new(|p| p.lse.ptr += 2), ErrorKind::MisalignedPointer),
            (
                "Sq 0",
                Box::new(|p| {
                    p.q.sizes[2] = 0;
                    p.o.sizes[2] = 0;
                    p.lse.sizes[2] = 0;
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
            ("heads above grid limit", Box::new(|p| set_outer_size(p, 1, 70_000)), ErrorKind::TooLarge),
            ("row offsets overflow i32", Box::new(|p| p.k.strides[2] = 1 << 27), ErrorKind::TooLarge),
        ];
        for (name, mutate, want) in cases {
            let mut p = valid();
            mutate(&mut p);
            let err = validate(&p).expect_err(name);
            assert_eq!(err.kind(), want, "{name}: {err}");
            assert!(!err.message().is_empty(), "{name}");
        }
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
    }

    #[test]
    fn non_contiguous_bshd_layout_is_accepted() {
        // B×S×H×D memory viewed as B×H×S×D.
        let t = |ptr, s: u64| {
            TensorView::new(ptr, [B, H, s, D], [(s * H * D) as i64, D as i64, (H * D) as i64, 1], DType::BF16)
        };
        let lse = TensorView::contiguous(0x50000, [B, H, SQ], DType::F32);
        let p = FwdParams::new(t(0x10000, SQ), t(0x20000, SK), t(0x30000, SK), t(0x40000, SQ), lse);
        assert!(validate(&p).is_ok());
    }

    #[test]
    fn without_a_driver_a_valid_call_reports_no_driver() {
        // SAFETY: only probes whether the driver library can be opened.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
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

    fn h100_like() -> DeviceInfo {
        DeviceInfo { ordinal: 0, arch: "sm_90".into(), multiprocessors: 132, max_shared_optin: 232_448 }
    }

    /// Picks a kernel the way `attn_fwd` does, on the archive embedded for the first built arch.
    fn pick(p: &FwdParams) -> crate::archive::KernelMeta {
        let shape = validate(p).unwrap();
        let arch = images::built_archs()[0];
        let loaded = images::archive_for(arch).unwrap();
        let axes = functional_axes(p, &shape);
        let args = kernel_args(p, &shape);
        let request = Request { family: "attn_fwd", axes: &axes, args: &args };
        let index = dispatch::find_functional(&loaded, &request).unwrap();
        let functional = &loaded.archive.functionals()[index];
        let fitting = fitting_kernels(functional, &args).unwrap();
        assert!(!fitting.is_empty());
        functional.kernels[choose_kernel(functional, &fitting, &shape, &h100_like())].clone()
    }

    fn sized(b: u64, h: u64, s: u64, d: u64) -> FwdParams {
        let t = |ptr| TensorView::contiguous(ptr, [b, h, s, d], DType::BF16);
        FwdParams::new(t(0x100000), t(0x200000), t(0x300000), t(0x400000), TensorView::contiguous(0x500000, [b, h, s], DType::F32))
    }

    #[test]
    fn every_compiled_functional_is_found() {
        let arch = images::built_archs()[0];
        let loaded = images::archive_for(arch).unwrap();
        for dtype in [DType::F16, DType::BF16] {
            for d in [64, 128] {
                for causal in [false, true] {
                    let mut p = sized(1, 1, 16, d);
                    for t in [&mut p.q, &mut p.k, &mut p.v, &mut p.o] {
                        t.dtype = dtype;
                    }
                    p.causal = causal;
                    let shape = validate(&p).unwrap();
                    let axes = functional_axes(&p, &shape);
                    let request = Request { family: "attn_fwd", axes: &axes, args: &[] };
                    dispatch::find_functional(&loaded, &request).unwrap();
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
        // So does a row stride that is not a multiple of 16 elements.
        let mut p = sized(1, 2, 100, 64);
        p.k.strides = [2 * 100 * 88, 100 * 88, 88, 1];
        assert_eq!(pick(&p).variant, "generic");
    }
}
