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
