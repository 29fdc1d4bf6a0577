//! FlashAttention operators: [`attn_fwd`] and [`attn_bwd`].
//!
//! Layouts: Q is B×Hq×Sq×D, K and V are B×Hk×Sk×D, with Hq a multiple of Hk (GQA; Hk = 1 is
//! MQA, Hk = Hq plain multi-head). Any element strides whose last stride is 1 work, so both
//! B×H×S×D and B×S×H×D memory can be passed as views. D is any multiple of 8 up to 256.
//!
//! The log-sum-exp (`lse`, B×Hq×Sq fp32, unit last stride) holds, per query row, the natural-log
//! `ln Σ_j exp(sm_scale · q·k_j)` over the keys the row sees; a row that sees no key gets `+inf`
//! (and an all-zero output row). The forward writes it when asked; the backward requires it.
//!
//! Masks ([`Mask`]): none; causal, aligned top-left (query i sees keys j ≤ i) or bottom-right
//! (j ≤ i + Sk − Sq, torch's `causal_lower_right`); a sliding window `(left, right)` around the
//! aligned diagonal (`−1` = unbounded on that side). Causal is the window `(−1, 0)`.
mod bwd;
mod fwd;

pub use bwd::{BwdParams, attn_bwd};
pub use fwd::{FwdParams, attn_fwd};

use crate::dispatch::{self, ArgValue};
use crate::error::{Result, bail};
use crate::images;
use crate::tensor::{DType, TensorView};

/// Where the mask's diagonal sits when Sq ≠ Sk.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MaskAlign {
    /// Query i's diagonal key is j = i.
    #[default]
    TopLeft = 0,
    /// Query i's diagonal key is j = i + Sk − Sq (the last query sees the last key).
    BottomRight = 1,
}

/// Which keys each query row sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mask {
    /// Keys more than `window_left` before the diagonal are hidden; −1 = unbounded.
    pub window_left: i32,
    /// Keys more than `window_right` after the diagonal are hidden; −1 = unbounded.
    pub window_right: i32,
    pub align: MaskAlign,
}

impl Mask {
    /// Every query sees every key.
    pub const NONE: Mask = Mask { window_left: -1, window_right: -1, align: MaskAlign::TopLeft };

    /// Causal: keys after the diagonal are hidden.
    pub fn causal(align: MaskAlign) -> Mask {
        Mask { window_left: -1, window_right: 0, align }
    }

    /// A sliding window of `left` keys before and `right` keys after the diagonal (−1 = unbounded).
    pub fn window(left: i32, right: i32, align: MaskAlign) -> Mask {
        Mask { window_left: left, window_right: right, align }
    }

    pub fn is_none(&self) -> bool {
        self.window_left < 0 && self.window_right < 0
    }
}

impl Default for Mask {
    fn default() -> Self {
        Mask::NONE
    }
}

/// The checked shape shared by the forward and backward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttnShape {
    pub batch: u64,
    pub heads_q: u64,
    pub heads_k: u64,
    pub seqlen_q: u64,
    pub seqlen_k: u64,
    pub head_dim: u64,
    /// The compiled head-dim bucket serving `head_dim` (the smallest ≥ it).
    pub head_dim_bucket: u64,
}

impl AttnShape {
    pub fn gqa_group(&self) -> u64 {
        self.heads_q / self.heads_k
    }
}

/// Checks q, k, v and returns the shape: dtypes, layouts, GQA head counts, head dim, sizes.
/// `family` names the kernel family whose compiled head dims bound D.
pub(crate) fn check_qkv(q: &TensorView<4>, k: &TensorView<4>, v: &TensorView<4>, family: &str) -> Result<AttnShape> {
    for (name, t) in [("q", q), ("k", k), ("v", v)] {
        t.check_layout(name)?;
    }
    if !matches!(q.dtype, DType::F16 | DType::BF16) {
        bail!(UnsupportedDType, "q: attention takes fp16 or bf16 inputs, got {}", q.dtype.triton_name());
    }
    let [batch, heads_q, seqlen_q, head_dim] = q.sizes;
    let [_, heads_k, seqlen_k, _] = k.sizes;
    check_tensor("k", k, [batch, heads_k, seqlen_k, head_dim], q.dtype)?;
    check_tensor("v", v, k.sizes, q.dtype)?;
    for (what, n) in [("batch", batch), ("heads", heads_q), ("Sq", seqlen_q), ("Sk", seqlen_k), ("Hk", heads_k)] {
        if n == 0 {
            bail!(EmptyInput, "{what} is 0: nothing to attend (q {:?}, k {:?})", q.sizes, k.sizes);
        }
    }
    if heads_q % heads_k != 0 {
        bail!(ShapeMismatch, "q has {heads_q} heads, not a multiple of k's {heads_k} (GQA needs Hq = G·Hk)");
    }
    let head_dim_bucket = head_dim_bucket(family, head_dim)?;
    // Grid: (blocks, heads, batch); the y and z extents are limited to 65535.
    if heads_q > 65535 || batch > 65535 {
        bail!(TooLarge, "heads ({heads_q}) and batch ({batch}) must each be at most 65535");
    }
    // Window bounds and the bottom-right offset are computed in int32 from Sq + Sk.
    if seqlen_q > 1 << 30 || seqlen_k > 1 << 30 {
        bail!(TooLarge, "sequence lengths must be at most 2^30 (Sq {seqlen_q}, Sk {seqlen_k})");
    }
    let shape = AttnShape { batch, heads_q, heads_k, seqlen_q, seqlen_k, head_dim, head_dim_bucket };
    check_rows("q", q, seqlen_q, head_dim)?;
    check_rows("k", k, seqlen_k, head_dim)?;
    check_rows("v", v, seqlen_k, head_dim)?;
    Ok(shape)
}

/// Checks one more tensor of the call: layout, dtype and exact sizes.
pub(crate) fn check_tensor<const R: usize>(name: &str, t: &TensorView<R>, sizes: [u64; R], dtype: DType) -> Result<()> {
    t.check_layout(name)?;
    if t.dtype != dtype {
        bail!(DTypeMismatch, "{name} is {}, expected {}", t.dtype.triton_name(), dtype.triton_name());
    }
    if t.sizes != sizes {
        bail!(ShapeMismatch, "{name}.sizes is {:?}, expected {sizes:?}", t.sizes);
    }
    Ok(())
}

/// The kernels index rows in int32: the last row's offset must fit.
pub(crate) fn check_rows(name: &str, t: &TensorView<4>, rows: u64, head_dim: u64) -> Result<()> {
    let extent = (rows as i128 - 1) * t.strides[2] as i128 + head_dim as i128;
    if extent > i32::MAX as i128 || t.strides[2] > i32::MAX as i64 {
        bail!(TooLarge, "{name}: rows × row stride ({rows} × {}) overflows the kernel's 32-bit row offsets", t.strides[2]);
    }
    Ok(())
}

/// The smallest compiled head-dim bucket of `family` that holds `head_dim` (a multiple of 8).
pub(crate) fn head_dim_bucket(family: &str, head_dim: u64) -> Result<u64> {
    let mut buckets: Vec<u64> =
        images::compiled_axis_values(family, "head_dim")?.iter().filter_map(|v| v.parse().ok()).collect();
    buckets.sort_unstable();
    let largest = buckets.last().copied().unwrap_or(0);
    if head_dim == 0 || head_dim % 8 != 0 {
        bail!(UnsupportedHeadDim, "head dim {head_dim} is not a multiple of 8 (supported: multiples of 8 up to {largest})");
    }
    match buckets.iter().find(|&&b| b >= head_dim) {
        Some(&bucket) => Ok(bucket),
        None => bail!(UnsupportedHeadDim, "head dim {head_dim} is above the largest compiled one ({largest})"),
    }
}

/// The kernels' view of a mask: whether any masking beyond sequence tails applies, and the
/// window around the diagonal `i + diag_offset` with unbounded sides made finite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MaskArgs {
    pub windowed: bool,
    pub left: i32,
    pub right: i32,
    pub diag_offset: i32,
}

pub(crate) fn mask_args(mask: &Mask, shape: &AttnShape) -> Result<MaskArgs> {
    for (name, value) in [("window_left", mask.window_left), ("window_right", mask.window_right)] {
        if value < -1 {
            bail!(InvalidArgument, "{name} is {value}: use −1 for unbounded, or a key count ≥ 0");
        }
    }
    // No window reaches farther than Sq + Sk keys; clamping keeps the kernels' int32 bounds exact.
    let unbounded = (shape.seqlen_q + shape.seqlen_k) as i32;
    let side = |w: i32| if w < 0 { unbounded } else { w.min(unbounded) };
    let diag_offset = match mask.align {
        MaskAlign::TopLeft => 0,
        MaskAlign::BottomRight => shape.seqlen_k as i32 - shape.seqlen_q as i32,
    };
    Ok(MaskArgs { windowed: !mask.is_none(), left: side(mask.window_left), right: side(mask.window_right), diag_offset })
}

/// Axes shared by the attention families: dtype, head-dim bucket and, where masks matter,
/// whether a window applies.
pub(crate) fn axes(dtype: DType, shape: &AttnShape, windowed: Option<bool>) -> Vec<(&'static str, String)> {
    let mut axes = vec![("dtype", dtype.triton_name().to_string()), ("head_dim", shape.head_dim_bucket.to_string())];
    if let Some(windowed) = windowed {
        axes.push(("windowed", windowed.to_string()));
    }
    axes
}

/// The stride arguments of a B×H×S×D tensor, named `stride_<p>z/h/<row>` as in the kernels.
pub(crate) fn strides4(names: [&'static str; 3], t: &TensorView<4>) -> [(&'static str, ArgValue); 3] {
    [
        (names[0], ArgValue::I64(t.strides[0])),
        (names[1], ArgValue::I64(t.strides[1])),
        (names[2], ArgValue::I32(t.strides[2] as i32)),
    ]
}

/// The stride arguments of a B×H×S fp32 row-statistics tensor (lse, delta).
pub(crate) fn strides3(names: [&'static str; 2], t: &TensorView<3>) -> [(&'static str, ArgValue); 2] {
    [(names[0], ArgValue::I64(t.strides[0])), (names[1], ArgValue::I64(t.strides[1]))]
}

/// Sequence, head-dim, GQA and mask arguments shared by the attention kernels.
pub(crate) fn common_args(shape: &AttnShape, mask: &MaskArgs) -> [(&'static str, ArgValue); 7] {
    use ArgValue::I32;
    [
        ("N_CTX_Q", I32(shape.seqlen_q as i32)),
        ("N_CTX_K", I32(shape.seqlen_k as i32)),
        ("D_HEAD", I32(shape.head_dim as i32)),
        ("GQA_GROUP", I32(shape.gqa_group() as i32)),
        ("WINDOW_LEFT", I32(mask.left)),
        ("WINDOW_RIGHT", I32(mask.right)),
        ("DIAG_OFFSET", I32(mask.diag_offset)),
    ]
}

/// Blocks of `block` rows covering `len` rows, for a launch grid.
pub(crate) fn blocks(len: u64, meta: &crate::archive::KernelMeta, key: &str) -> u32 {
    len.div_ceil(dispatch::config(meta, key, 64).max(1) as u64) as u32
}
