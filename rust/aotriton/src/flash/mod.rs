//! FlashAttention operators: [`attn_fwd`], [`attn_bwd`] and the [`debug_dropout_mask`] entry;
//! [`attn_fwd_fp8`] (fp8 inputs, sm_90) and [`attn_fwd_kvcache`] (a decode step over a dense or
//! paged KV cache, with its own layouts: see [`KvCacheParams`]).
//!
//! Layouts: Q is B×Hq×Sq×D, K and V are B×Hk×Sk×D, with Hq a multiple of Hk (GQA; Hk = 1 is
//! MQA). Any element strides whose last stride is 1 work, so both B×H×S×D and B×S×H×D memory can
//! be passed as views. D is any multiple of 8 up to 256, and up to 512 in fp16/bf16 (above 256
//! on the portable kernels, without softcap, ALiBi or sinks). Inputs are fp16, bf16 or fp32 (fp32
//! matrix products are IEEE fp32 unless `allow_tf32` asks for TF32).
//!
//! The log-sum-exp (`lse`, B×Hq×Sq fp32, unit last stride) holds, per query row, the natural-log
//! `ln Σ_j exp(sm_scale · q·k_j + bias_ij)` over the keys the row sees; a row that sees no key
//! gets `+inf` (and an all-zero output row). The forward writes it when asked; the backward
//! requires it. Dropout does not change it.
//!
//! Masks ([`Mask`]): none; causal, aligned top-left (query i sees keys j ≤ i) or bottom-right
//! (j ≤ i + Sk − Sq, torch's `causal_lower_right`); a sliding window `(left, right)` around the
//! aligned diagonal (`−1` = unbounded on that side). Causal is the window `(−1, 0)`.
//!
//! Variable-length batches ([`Varlen`]): the B sequences are packed along the token axis. Q, O,
//! dO and dQ are passed as `[1, Hq, total_q, D]` views (e.g. a `total_q × Hq × D` tensor with
//! strides `[0, D, Hq·D, 1]`), K/V/dK/dV as `[1, Hk, total_k, D]`; sequence b owns tokens
//! `cu_seqlens[b] .. cu_seqlens[b+1]`. The LSE and delta of a packed batch are `[1, Hq, total_q]`
//! fp32 (element (h, token) at `h·stride + token`). Bias, dropout and masks use each sequence's
//! own lengths and local positions; the bias is `B×Hq×max_seqlen_q×max_seqlen_k`.
//! The offsets are read by the kernels from device memory. With host copies
//! ([`Varlen::host_cu_seqlens`]) they are checked before anything is launched; without, the
//! kernels clamp them to the packed tensors (nothing outside the tensors is read or written
//! whatever they hold) and can record what they clamped in a status word ([`Varlen::status`]).
//!
//! Dropout ([`Dropout`]): Philox4x32-10, keyed by the 64-bit seed, counter = the 64-bit offset
//! (`*offset + offset_base`) plus `((b·Hq + h)·Q(Sq) + q(i))·U(Sk) + ⌊q(j)/2⌋`, output word
//! `2·(⌊i/8⌋ mod 2) + ⌊j/8⌋ mod 2`, its bits `[16e, 16e + 16)` with `e = j mod 2`, where
//! `q(i) = 8·⌊i/16⌋ + i mod 8`, `Q(n) = 8·⌈n/16⌉` and `U(n) = 4·⌈n/16⌉`: one counter per eight
//! elements (rows `r, r + 8`, columns `c, c + 1, c + 8, c + 9`), which is what one GPU thread holds
//! of an MMA tile (python/kernels/flash/dropout.py); element (b, h, i, j) is kept iff its 16 bits
//! are ≥ ⌊p·2¹⁶⌋. One call consumes
//! [`dropout_offsets_consumed`] counters (Sq, Sk the max lengths for packed batches): advance
//! the generator's offset by that much between calls. Seed and offset are read from device
//! memory, so a captured CUDA graph can be replayed with a new offset.
//!
//! Logit soft-capping ([`FwdParams::softcap`], Gemma 2, Grok): each score `s = sm_scale · q·k`
//! becomes `softcap · tanh(s / softcap)` before bias and mask, and the LSE is of the capped
//! scores; the backward takes the same `softcap`. fp16/bf16 without dropout or bias.
//!
//! # Backends
//!
//! Each operator has two kernel families ([`Backend`]): the portable `triton.language` family,
//! which serves every arch and every feature above, and the Gluon family for sm_90 (TMA,
//! wgmma, warp specialization; contract: `python/kernels/flash_gluon/ABI.md`). The caller sets
//! `FwdParams::backend` / `BwdParams::backend`; the default [`Backend::Auto`] picks Gluon when
//! **all** of these hold, and Portable otherwise:
//!
//! - the stream's device is sm_90 and its archive holds the Gluon functionals of the call
//!   (families `attn_fwd_gluon`; `attn_bwd_gluon_preprocess`, `attn_bwd_gluon`, and the dQ
//!   conversion `attn_bwd_gluon_dq_convert` or, where dQ has its own kernel, `attn_bwd_gluon_dq`
//!   or the portable `attn_bwd_dq`; after a head split also `attn_bwd_gluon_dkdv_convert`; each
//!   for the dtype and head-dim bucket), and the tuning database did not measure the portable
//!   kernels faster in the call's cell;
//! - the dtype is fp16 or bf16;
//! - the head dim is at most 256; it is served by the bucket 64, 128 or 256 at or above it, and V's
//!   head dim is Q/K's;
//! - no bias (nor dbias), no `softcap`, ALiBi or sinks; forward: `sm_scale > 0`;
//! - dropout is served with the portable kernels' Philox counters (a mask is the same whichever
//!   backend drew it);
//! - packed (varlen) batches of at most 2^30 tokens are served through ragged descriptors
//!   (`python/kernels/flash_gluon/ragged.py`);
//! - every tensor the Gluon kernels address with TMA (q, k, v, o; and d_o, dq, dk, dv in the
//!   backward) has a 16-byte aligned address, a unit last stride, and other strides that are
//!   positive multiples of 16 bytes below 2^40 (dimensions of size 1 excepted), sizes < 2^32;
//!   the `lse` (and `delta`) pointers are 16-byte aligned, and a compiled Gluon kernel accepts
//!   the arguments (its alignment hints hold);
//! - backward only: a [`Workspace`] of at least [`attn_bwd_workspace_bytes`] bytes is given.
//!
//! A forced backend that cannot serve the call fails with
//! [`ErrorKind::UnsupportedByBackend`](crate::ErrorKind::UnsupportedByBackend) and a message
//! naming the reason; nothing is launched. The input conditions are checked before the driver
//! is touched; the device conditions after the stream's device is known.
//!
//! The Gluon backward accumulates dQ with TMA reduce-adds in the workspace (the order of the
//! adds varies from run to run) up to the head-dim bucket 128; with `deterministic` set, and at
//! the bucket 256, it skips that and computes dQ with a kernel of its own instead
//! (`attn_bwd_gluon_dq` where the archive holds it, today at the bucket 256, else the portable
//! `attn_bwd_dq`), so every result stays bitwise reproducible. A GQA call with a long walk per key
//! block (groups of at least 4 query heads, `G·Sq` ≥ 24576, bucket 128, fixed-length) splits each
//! group's query heads over two CTAs per key block; their fp32 dK/dV partials are summed in a
//! fixed order (bitwise reproducible too) by `attn_bwd_gluon_dkdv_convert`.
mod bwd;
mod debug;
mod fwd;
mod fwd_fp8;
mod gluon;
mod kvcache;

pub use bwd::{BwdParams, attn_bwd, attn_bwd_workspace_bytes};
pub use debug::debug_dropout_mask;
pub use fwd::{FwdParams, attn_fwd};
pub use fwd_fp8::{Fp8FwdParams, attn_fwd_fp8, attn_fwd_fp8_workspace_bytes};
pub use kvcache::{
    KV_PAGE_OUT_OF_RANGE, KV_SEQLEN_OUT_OF_RANGE, KVCACHE_MAX_QUERY_TOKENS, KVCACHE_MAX_SPLITS, KvCacheParams, attn_fwd_kvcache,
    attn_fwd_kvcache_num_splits, attn_fwd_kvcache_workspace_bytes,
};

use crate::archive::MaskKind;
use crate::dispatch::{ArgList, ArgValue, Axes, bool_axis};
use crate::error::{Result, bail, checked_product};
use crate::images;
use crate::tensor::{DType, Region, TensorView};

/// Which kernel family serves a call (see the module docs for the rule `Auto` follows).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Backend {
    /// Gluon where it can serve the call, else Portable.
    #[default]
    Auto = 0,
    /// The portable `triton.language` kernels (every arch, every feature).
    Portable = 1,
    /// The sm_90 Gluon kernels; a call they cannot serve is an `UnsupportedByBackend` error.
    Gluon = 2,
}

impl Backend {
    /// The backend of a C API value (`0` Auto, `1` Portable, `2` Gluon), `None` for any other.
    pub fn from_raw(raw: i32) -> Option<Backend> {
        match raw {
            0 => Some(Backend::Auto),
            1 => Some(Backend::Portable),
            2 => Some(Backend::Gluon),
            _ => None,
        }
    }
}

/// Caller-owned device scratch memory for the backward (the Gluon backend's dQ accumulator and
/// row statistics). Size it with [`attn_bwd_workspace_bytes`]; 16-byte aligned; its contents
/// on entry do not matter, and it must not alias any tensor of the call or be used by another
/// call running concurrently on another stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workspace {
    /// Device address.
    pub ptr: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

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
    /// Where the diagonal sits when the query and key lengths differ.
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

    /// Whether every query sees every key (both sides unbounded).
    pub fn is_none(&self) -> bool {
        self.window_left < 0 && self.window_right < 0
    }
}

impl Default for Mask {
    fn default() -> Self {
        Mask::NONE
    }
}

/// Dropout with drop probability `p` (kept values are scaled by 1/(1−p)). The seed and offset
/// live in device memory (8-byte aligned u64 each) so graphs can be replayed with new values.
///
/// Successive calls advance the offset by [`dropout_offsets_consumed`]; the seed and offset a
/// forward used are written back for its backward (a whole program: `examples/dropout.rs`):
///
/// ```no_run
/// use aotriton::flash::{self, Dropout, FwdParams};
/// use aotriton::{DType, Stream, TensorView};
/// # let (q, k, v, o, lse, philox, used) = (0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
/// let (b, h, s, d) = (4, 16, 1024, 64);
/// let t = |ptr| TensorView::contiguous(ptr, [b, h, s, d], DType::BF16);
/// let lse = TensorView::contiguous(lse, [b, h, s], DType::F32);
/// let mut host_offset = 0;
/// for _step in 0..10 {
///     // `philox` holds the u64 seed, then the u64 offset; `used` receives the pair used.
///     let mut dropout = Dropout::new(0.1, philox, philox + 8);
///     dropout.offset_base = host_offset;
///     (dropout.seed_out, dropout.offset_out) = (used, used + 8);
///     let mut params = FwdParams::new(t(q), t(k), t(v), t(o), Some(lse));
///     params.dropout = Some(dropout);
///     flash::attn_fwd(&params, Stream::null())?;
///     host_offset += flash::dropout_offsets_consumed(b, h, s, s)?;
/// }
/// # Ok::<(), aotriton::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// Drop probability, in [0, 1).
    pub p: f32,
    /// Device address of the u64 Philox seed.
    pub seed: u64,
    /// Device address of the u64 Philox offset.
    pub offset: u64,
    /// Added to `*offset` (lets a framework pass its generator state plus an increment).
    pub offset_base: u64,
    /// Forward only: device addresses where the seed and offset used are written (0 = not
    /// wanted), so a framework can hand them to the backward.
    pub seed_out: u64,
    /// Forward only: device address where the offset used (`*offset + offset_base`) is written
    /// (0 = not wanted).
    pub offset_out: u64,
}

impl Dropout {
    /// Drop probability `p` with the device addresses of the seed and offset; no offset base,
    /// nothing written back.
    pub fn new(p: f32, seed: u64, offset: u64) -> Dropout {
        Dropout { p, seed, offset, offset_base: 0, seed_out: 0, offset_out: 0 }
    }
}

/// Philox counters one call consumes: `batch · heads_q · 8⌈seqlen_q / 16⌉ · 4⌈seqlen_k / 16⌉`
/// (max lengths for packed batches; an eighth of the elements, each length rounded up to 16).
/// Advance the generator's offset by this between calls. `TooLarge` when the count does not fit
/// 64 bits (such a call is refused too: its counters would wrap and masks repeat).
pub fn dropout_offsets_consumed(batch: u64, heads_q: u64, seqlen_q: u64, seqlen_k: u64) -> Result<u64> {
    // 8·⌈n/16⌉ ≤ n/2 + 8 cannot overflow.
    let quad_rows = seqlen_q.div_ceil(16) * 8;
    let unit_cols = seqlen_k.div_ceil(16) * 4;
    checked_product("dropout counters (batch · heads · 8⌈Sq/16⌉ · 4⌈Sk/16⌉)", &[batch, heads_q, quad_rows, unit_cols])
}

/// Bits of a [`Varlen::status`] word: an offset was outside `[0, tokens]` of its packed tensor.
pub const VARLEN_OFFSET_OUT_OF_RANGE: i32 = 1;
/// Bits of a [`Varlen::status`] word: offsets decrease (that sequence was taken as empty).
pub const VARLEN_DECREASING: i32 = 2;
/// Bits of a [`Varlen::status`] word: a sequence is longer than its max length (only its first
/// `max_seqlen` rows were computed).
pub const VARLEN_TOO_LONG: i32 = 4;

/// A packed batch of variable-length sequences (see the module docs for the layouts).
///
/// Three sequences of 100, 256 and 44 tokens stored token-major (`total × H × D`), the offsets
/// on the device and, to have them checked before launching, on the host (a whole program:
/// `examples/varlen.rs`):
///
/// ```no_run
/// use aotriton::flash::{self, FwdParams, Varlen};
/// use aotriton::{DType, Stream, TensorView};
/// # let (q, k, v, o, cu_seqlens_device) = (0u64, 0u64, 0u64, 0u64, 0u64);
/// let cu_seqlens = [0, 100, 356, 400];
/// let (h, d, total) = (8, 64, 400);
/// let packed = |ptr| TensorView::new(ptr, [1, h, total, d], [0, d as i64, (h * d) as i64, 1], DType::F16);
/// let offsets = TensorView::contiguous(cu_seqlens_device, [4], DType::I32);
/// let mut varlen = Varlen::new(offsets, offsets, 256, 256);
/// varlen.host_cu_seqlens = Some((&cu_seqlens, &cu_seqlens));
/// let mut params = FwdParams::new(packed(q), packed(k), packed(v), packed(o), None);
/// params.varlen = Some(varlen);
/// flash::attn_fwd(&params, Stream::null())?;
/// # Ok::<(), aotriton::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Varlen<'a> {
    /// int32 device tensors of B+1 offsets: sequence b's tokens are `cu[b] .. cu[b+1]`.
    pub cu_seqlens_q: TensorView<1>,
    /// As `cu_seqlens_q`, for the keys and values.
    pub cu_seqlens_k: TensorView<1>,
    /// The longest query and key sequence: the launch grid covers them.
    pub max_seqlen_q: u64,
    /// The longest key sequence.
    pub max_seqlen_k: u64,
    /// Host copies of the two offset arrays, when the caller has them: then the offsets are
    /// checked (start at 0, non-decreasing, within the tensors, no sequence longer than the
    /// max lengths) and a violation is an error before anything is launched. Without them the
    /// kernels clamp each sequence to `0 ≤ start ≤ end ≤ tokens` and `length ≤ max_seqlen`:
    /// memory outside the tensors is never touched, but a wrong offset gives a wrong (clamped)
    /// result, which only `status` reports.
    pub host_cu_seqlens: Option<(&'a [i32], &'a [i32])>,
    /// Device address of an int32 word (4-byte aligned; 0 = none) into which the kernels OR
    /// [`VARLEN_OFFSET_OUT_OF_RANGE`], [`VARLEN_DECREASING`] or [`VARLEN_TOO_LONG`] when they
    /// had to clamp an offset. The caller zeroes it beforehand and reads it after the call (in
    /// stream order); it is written only on a violation.
    pub status: u64,
}

impl<'a> Varlen<'a> {
    /// A packed batch without host copies and without a status word.
    pub fn new(cu_seqlens_q: TensorView<1>, cu_seqlens_k: TensorView<1>, max_seqlen_q: u64, max_seqlen_k: u64) -> Self {
        Varlen { cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, host_cu_seqlens: None, status: 0 }
    }
}

/// What the kernels need of a packed batch: the offsets, the packed tensors' token counts that
/// bound them, and the status word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Packed {
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub tokens_q: u64,
    pub tokens_k: u64,
    pub status: u64,
}

/// The checked shape shared by the forward and backward passes. For packed batches, `batch` is
/// the number of sequences and the lengths are the max lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttnShape {
    pub batch: u64,
    pub heads_q: u64,
    pub heads_k: u64,
    pub seqlen_q: u64,
    pub seqlen_k: u64,
    pub head_dim: u64,
    /// The compiled head-dim bucket serving `head_dim` (the smallest ≥ it) in the portable
    /// family, and its axis value.
    pub head_dim_bucket: u64,
    pub head_dim_axis: &'static str,
    /// V's head dim (also O's, dO's and dV's): `head_dim` unless the call gives V its own, with
    /// its bucket's axis value (the optional axis `head_dim_v`, named only when the dims differ).
    pub head_dim_v: u64,
    pub head_dim_v_axis: &'static str,
    /// Packed batch: where its offsets are and what bounds them.
    pub varlen: Option<Packed>,
}

impl AttnShape {
    pub fn gqa_group(&self) -> u64 {
        self.heads_q / self.heads_k
    }

    /// Whether V's head dim differs from Q/K's (the kernels then take V's bucket as `head_dim_v`).
    pub fn splits_head_dims(&self) -> bool {
        self.head_dim_v != self.head_dim
    }

    /// The functional axis `head_dim_v`, pushed only when the head dims differ (an optional axis:
    /// absent means V's head dim is Q/K's).
    pub fn push_head_dim_v(&self, axes: &mut Axes) {
        if self.splits_head_dims() {
            axes.push("head_dim_v", self.head_dim_v_axis);
        }
    }
}

/// The input dtypes an operator takes, and the sentence its refusal of another one starts with.
pub(crate) struct InputDTypes {
    pub dtypes: &'static [DType],
    pub described: &'static str,
}

/// `attn_fwd` and `attn_bwd` (the fp8 forward has its own: `fwd_fp8.rs`).
pub(crate) const ATTENTION_INPUTS: InputDTypes =
    InputDTypes { dtypes: &[DType::F16, DType::BF16, DType::F32], described: "attention takes fp16, bf16 or fp32 inputs" };

/// Checks q, k, v (and the packing, if any) and returns the shape. `family` names the kernel
/// family whose compiled head dims bound D; `inputs` the dtypes q may have.
pub(crate) fn check_qkv(
    q: &TensorView<4>,
    k: &TensorView<4>,
    v: &TensorView<4>,
    varlen: Option<&Varlen>,
    family: &'static str,
    inputs: &InputDTypes,
) -> Result<AttnShape> {
    for (name, t) in [("q", q), ("k", k), ("v", v)] {
        t.check_layout(name)?;
    }
    if !inputs.dtypes.contains(&q.dtype) {
        bail!(UnsupportedDType, "q: {}, got {}", inputs.described, q.dtype.triton_name());
    }
    let [batch, heads_q, tokens_q, head_dim] = q.sizes;
    let [_, heads_k, tokens_k, _] = k.sizes;
    check_tensor("k", k, [batch, heads_k, tokens_k, head_dim], q.dtype)?;
    // V may have its own head dim (DeepSeek-style MLA: Q/K 192, V 128); O and dO follow it.
    let head_dim_v = v.sizes[3];
    check_tensor("v", v, [batch, heads_k, tokens_k, head_dim_v], q.dtype)?;
    let (batch, seqlen_q, seqlen_k, packed) = match varlen {
        None => (batch, tokens_q, tokens_k, None),
        Some(varlen) => {
            let sequences = check_varlen(varlen, batch, tokens_q, tokens_k)?;
            let packed = Packed {
                cu_seqlens_q: varlen.cu_seqlens_q.ptr,
                cu_seqlens_k: varlen.cu_seqlens_k.ptr,
                tokens_q,
                tokens_k,
                status: varlen.status,
            };
            (sequences, varlen.max_seqlen_q, varlen.max_seqlen_k, Some(packed))
        }
    };
    for (what, n) in [("batch", batch), ("heads", heads_q), ("Sq", seqlen_q), ("Sk", seqlen_k), ("Hk", heads_k)] {
        if n == 0 {
            bail!(EmptyInput, "{what} is 0: nothing to attend (q {:?}, k {:?})", q.sizes, k.sizes);
        }
    }
    if heads_q % heads_k != 0 {
        bail!(ShapeMismatch, "q has {heads_q} heads, not a multiple of k's {heads_k} (GQA needs Hq = G·Hk)");
    }
    let (bucket, head_dim_axis) = head_dim_bucket(family, head_dim)?;
    let (_, head_dim_v_axis) =
        head_dim_bucket(family, head_dim_v).map_err(|e| crate::Error::new(e.kind(), format!("v: {}", e.message())))?;
    // Grid: (blocks, heads, batch); the y and z extents are limited to 65535.
    if heads_q > 65535 || batch > 65535 {
        bail!(TooLarge, "heads ({heads_q}) and batch ({batch}) must each be at most 65535");
    }
    // The kernels compute window bounds in int32 from Sq + Sk (kernels/flash/mask.py): up to
    // about 2·(Sq + Sk) in magnitude, which fits while Sq + Sk ≤ 2^29. Token counts and offsets
    // of packed batches are int32 too.
    if seqlen_q.saturating_add(seqlen_k) > MAX_SEQLEN_SUM {
        bail!(TooLarge, "Sq + Sk must be at most 2^29 = {MAX_SEQLEN_SUM} (Sq {seqlen_q}, Sk {seqlen_k})");
    }
    if tokens_q > i32::MAX as u64 || tokens_k > i32::MAX as u64 {
        bail!(TooLarge, "q and k have {tokens_q} and {tokens_k} rows; the kernels index rows in int32 (at most 2^31 − 1)");
    }
    let shape = AttnShape {
        batch,
        heads_q,
        heads_k,
        seqlen_q,
        seqlen_k,
        head_dim,
        head_dim_bucket: bucket,
        head_dim_axis,
        head_dim_v,
        head_dim_v_axis,
        varlen: packed,
    };
    check_rows("q", q, tokens_q, head_dim)?;
    check_rows("k", k, tokens_k, head_dim)?;
    check_rows("v", v, tokens_k, head_dim_v)?;
    Ok(shape)
}

/// The largest Sq + Sk (max lengths for packed batches) the kernels' int32 window bounds allow.
pub(crate) const MAX_SEQLEN_SUM: u64 = 1 << 29;

/// Checks a packed batch against its tensors; returns the number of sequences.
fn check_varlen(varlen: &Varlen, batch: u64, tokens_q: u64, tokens_k: u64) -> Result<u64> {
    if batch != 1 {
        bail!(ShapeMismatch, "packed (varlen) tensors are passed as [1, H, tokens, D] views; q has batch {batch}");
    }
    for (name, cu) in [("cu_seqlens_q", &varlen.cu_seqlens_q), ("cu_seqlens_k", &varlen.cu_seqlens_k)] {
        cu.check_layout(name)?;
        if cu.dtype != DType::I32 {
            bail!(DTypeMismatch, "{name} must be int32, got {}", cu.dtype.triton_name());
        }
        if cu.sizes[0] < 2 {
            bail!(ShapeMismatch, "{name} has {} entries; it needs B+1 ≥ 2 (offsets of B ≥ 1 sequences)", cu.sizes[0]);
        }
    }
    if varlen.cu_seqlens_q.sizes != varlen.cu_seqlens_k.sizes {
        bail!(
            ShapeMismatch,
            "cu_seqlens_q has {} entries but cu_seqlens_k has {}: both are B+1 offsets",
            varlen.cu_seqlens_q.sizes[0],
            varlen.cu_seqlens_k.sizes[0]
        );
    }
    let sequences = varlen.cu_seqlens_q.sizes[0] - 1;
    if !varlen.status.is_multiple_of(4) {
        bail!(MisalignedPointer, "varlen status: address {:#x} is not 4-byte aligned (it holds an int32)", varlen.status);
    }
    if let Some((host_q, host_k)) = varlen.host_cu_seqlens {
        for (name, host, tokens, max) in
            [("cu_seqlens_q", host_q, tokens_q, varlen.max_seqlen_q), ("cu_seqlens_k", host_k, tokens_k, varlen.max_seqlen_k)]
        {
            if host.len() as u64 != sequences + 1 {
                bail!(ShapeMismatch, "{name}: the host copy has {} entries, the device tensor {}", host.len(), sequences + 1);
            }
            if host[0] != 0 {
                bail!(InvalidArgument, "{name}[0] is {}, must be 0", host[0]);
            }
            for (b, pair) in host.windows(2).enumerate() {
                let length = pair[1] as i64 - pair[0] as i64;
                if length < 0 {
                    bail!(InvalidArgument, "{name} decreases at sequence {b} ({} then {})", pair[0], pair[1]);
                }
                if length as u64 > max {
                    bail!(InvalidArgument, "sequence {b} has {length} tokens ({name}), more than the max length {max}");
                }
            }
            let last = *host.last().unwrap() as u64;
            if last > tokens {
                bail!(ShapeMismatch, "{name} ends at token {last}, but the packed tensor holds {tokens}");
            }
        }
    }
    Ok(sequences)
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

/// The kernels index rows of one sequence in int32: the last row's offset must fit.
pub(crate) fn check_rows(name: &str, t: &TensorView<4>, rows: u64, head_dim: u64) -> Result<()> {
    let extent = (rows as i128 - 1) * t.strides[2] as i128 + head_dim as i128;
    if extent > i32::MAX as i128 || t.strides[2] > i32::MAX as i64 {
        bail!(TooLarge, "{name}: rows × row stride ({rows} × {}) overflows the kernel's 32-bit row offsets", t.strides[2]);
    }
    Ok(())
}

/// The smallest compiled head-dim bucket of `family` that holds `head_dim` (a multiple of 8),
/// with its axis value. Allocates nothing after the first call per family.
pub(crate) fn head_dim_bucket(family: &'static str, head_dim: u64) -> Result<(u64, &'static str)> {
    let buckets = || images::compiled_axis_values(family, "head_dim").map(|values| values.iter().filter_map(|v| Some((v.parse::<u64>().ok()?, *v))));
    let largest = buckets()?.map(|(b, _)| b).max().unwrap_or(0);
    if head_dim == 0 || !head_dim.is_multiple_of(8) {
        bail!(UnsupportedHeadDim, "head dim {head_dim} is not a multiple of 8 (supported: multiples of 8 up to {largest})");
    }
    match buckets()?.filter(|&(b, _)| b >= head_dim).min_by_key(|&(b, _)| b) {
        Some(bucket) => Ok(bucket),
        None => bail!(UnsupportedHeadDim, "head dim {head_dim} is above the largest compiled one ({largest})"),
    }
}

/// The kernels' view of a mask: the window around the diagonal with unbounded sides made finite,
/// and the alignment (the kernels compute the diagonal offset per sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MaskArgs {
    pub left: i32,
    pub right: i32,
    pub bottom_right: bool,
}

/// The call's cell in the tuning grid: a causal or windowed mask skips key blocks, which the
/// database times apart from unmasked calls.
/// No window reaches farther than Sq + Sk keys; clamping to that keeps the kernels' int32 bounds
/// exact, and with both sides at the clamp every key is visible (no mask).
fn unbounded_window(shape: &AttnShape) -> i32 {
    (shape.seqlen_q + shape.seqlen_k) as i32
}

pub(crate) fn tuning_key(shape: &AttnShape, mask: &MaskArgs) -> crate::dispatch::TuningKey {
    let unbounded = unbounded_window(shape);
    let kind = if mask.left < unbounded || mask.right < unbounded { MaskKind::Causal } else { MaskKind::None };
    crate::dispatch::TuningKey { mask: kind, seqlen_q: shape.seqlen_q, seqlen_k: shape.seqlen_k }
}

pub(crate) fn mask_args(mask: &Mask, shape: &AttnShape) -> Result<MaskArgs> {
    for (name, value) in [("window_left", mask.window_left), ("window_right", mask.window_right)] {
        if value < -1 {
            bail!(InvalidArgument, "{name} is {value}: use −1 for unbounded, or a key count ≥ 0");
        }
    }
    let unbounded = unbounded_window(shape);
    let side = |w: i32| if w < 0 { unbounded } else { w.min(unbounded) };
    Ok(MaskArgs { left: side(mask.window_left), right: side(mask.window_right), bottom_right: mask.align == MaskAlign::BottomRight })
}

/// Checks what the call's sizes imply for scalars the kernels derive from them: the dropout
/// counter range must fit 64 bits ([`dropout_offsets_consumed`]), and `sm_scale · log2(e)` (the
/// kernels' exp2 scale) must be finite.
pub(crate) fn check_scalars(shape: &AttnShape, dropout: Option<&Dropout>, sm_scale: f32) -> Result<()> {
    if !sm_scale.is_finite() || !(sm_scale * std::f32::consts::LOG2_E).is_finite() {
        bail!(InvalidArgument, "sm_scale is {sm_scale}: it must be finite and |sm_scale| · log2(e) must be too");
    }
    if dropout.is_some() {
        dropout_offsets_consumed(shape.batch, shape.heads_q, shape.seqlen_q, shape.seqlen_k)?;
    }
    Ok(())
}

/// The score modifiers of a call (python/kernels/flash/softcap.py, alibi.py, sinks.py): logit
/// soft-capping, ALiBi and attention sinks. Each is an optional functional axis compiled for
/// fp16/bf16 only, without dropout, bias or another modifier (python/rules.py, `functionals`), so
/// anything else is refused here with its reason rather than as a missing kernel.
#[derive(Clone, Copy)]
pub(crate) struct ScoreModifiers<'p> {
    /// 0: off.
    pub softcap: f32,
    /// fp32 slopes, [B or 1, Hq].
    pub alibi_slopes: Option<&'p TensorView<2>>,
    /// fp32 sink logits, one per query head.
    pub sinks: Option<&'p TensorView<1>>,
}

impl ScoreModifiers<'_> {
    /// Checks the values and the combination (`shape`: the call's, for the slopes' sizes).
    pub(crate) fn check(&self, shape: &AttnShape, dtype: DType, dropout: bool, bias: bool) -> Result<()> {
        let softcap = self.softcap;
        if softcap != 0.0 && (!softcap.is_finite() || softcap < 0.0) {
            bail!(InvalidArgument, "softcap is {softcap}: it must be 0 (off) or finite and positive");
        }
        if let Some(slopes) = self.alibi_slopes {
            slopes.check_layout("alibi_slopes")?;
            if slopes.dtype != DType::F32 {
                bail!(DTypeMismatch, "alibi_slopes is {}, expected fp32", slopes.dtype.triton_name());
            }
            if !(slopes.sizes[0] == 1 || slopes.sizes[0] == shape.batch) || slopes.sizes[1] != shape.heads_q {
                bail!(
                    ShapeMismatch,
                    "alibi_slopes.sizes is {:?}: it must be [B or 1, Hq] = [{} or 1, {}] (one slope per query head)",
                    slopes.sizes,
                    shape.batch,
                    shape.heads_q
                );
            }
        }
        if let Some(sinks) = self.sinks {
            check_tensor("sinks", sinks, [shape.heads_q], DType::F32)?;
        }
        // The modifiers that are on, without allocating (this runs on every launch).
        let mut on = [("softcap", softcap != 0.0), ("alibi_slopes", self.alibi_slopes.is_some()), ("sinks", self.sinks.is_some())]
            .into_iter()
            .filter_map(|(name, on)| on.then_some(name));
        let Some(what) = on.next() else { return Ok(()) };
        if let Some(other) = on.next() {
            bail!(InvalidArgument, "{what} and {other} are not built together: pass one or the other");
        }
        if !matches!(dtype, DType::F16 | DType::BF16) {
            bail!(UnsupportedDType, "{what} takes fp16 or bf16 inputs, not {}", dtype.triton_name());
        }
        if dropout || bias {
            let other = if dropout { "dropout" } else { "an attention bias" };
            bail!(InvalidArgument, "{what} is not built with {other}: pass one or the other");
        }
        Ok(())
    }

    /// Adds the optional functional axes that are on (python/rules.py, `OPTIONAL_AXES`: the
    /// functionals without one do not name it).
    pub(crate) fn push_axes(&self, axes: &mut Axes) {
        if self.softcap != 0.0 {
            axes.push("softcap", bool_axis(true));
        }
        if self.alibi_slopes.is_some() {
            axes.push("alibi", bool_axis(true));
        }
    }

    /// The kernels' arguments: `softcap`, and the slopes with their batch stride (0 when one row
    /// of slopes serves every sequence; a null pointer when off, which those kernels never read).
    pub(crate) fn args(&self) -> [(&'static str, ArgValue); 3] {
        let (ptr, stride_az) = match self.alibi_slopes {
            None => (0, 0),
            Some(s) => (s.ptr, if s.sizes[0] == 1 { 0 } else { s.strides[0] }),
        };
        [("softcap", ArgValue::F32(self.softcap)), ("ALIBI_SLOPES", ArgValue::Ptr(ptr)), ("stride_az", ArgValue::I64(stride_az))]
    }

    /// The slopes' and the sinks' device memory (inputs), for the aliasing check.
    pub(crate) fn regions(&self) -> Result<[Region<'static>; 2]> {
        Ok([optional_input("alibi_slopes", self.alibi_slopes)?, optional_input("sinks", self.sinks)?])
    }
}

/// The device memory of the dropout state, for the aliasing check: the inputs `[seed, offset]`
/// and the outputs `[seed_out, offset_out]` (u64 each; absent ones empty).
pub(crate) fn dropout_regions(dropout: Option<&Dropout>) -> Result<([Region<'static>; 2], [Region<'static>; 2])> {
    let u64_at = |name, ptr: u64| if ptr == 0 { Ok(Region::NONE) } else { Region::raw(name, ptr, 8) };
    Ok(match dropout {
        None => ([Region::NONE; 2], [Region::NONE; 2]),
        Some(d) => (
            [u64_at("dropout seed", d.seed)?, u64_at("dropout offset", d.offset)?],
            [u64_at("dropout seed_out", d.seed_out)?, u64_at("dropout offset_out", d.offset_out)?],
        ),
    })
}

/// The device memory of a packed batch: the inputs `[cu_seqlens_q, cu_seqlens_k]` and the
/// output status word (absent ones empty).
pub(crate) fn varlen_regions(varlen: Option<&Varlen>) -> Result<([Region<'static>; 2], Region<'static>)> {
    Ok(match varlen {
        None => ([Region::NONE; 2], Region::NONE),
        Some(v) => (
            [Region::input("cu_seqlens_q", &v.cu_seqlens_q)?, Region::input("cu_seqlens_k", &v.cu_seqlens_k)?],
            if v.status == 0 { Region::NONE } else { Region::raw("varlen status", v.status, 4)? },
        ),
    })
}

/// An optional input tensor's memory (`Region::NONE` when absent).
pub(crate) fn optional_input<const R: usize>(name: &'static str, t: Option<&TensorView<R>>) -> Result<Region<'static>> {
    t.map_or(Ok(Region::NONE), |t| Region::input(name, t))
}

/// The dropout arguments of the kernels, checked, appended to `args`. `None` gives the neutral
/// values (the kernels compiled without dropout never read them).
pub(crate) fn dropout_args(args: &mut ArgList, dropout: Option<&Dropout>, forward: bool) -> Result<()> {
    use ArgValue::{F32, I32, I64, Ptr, U32};
    let d = match dropout {
        None => Dropout::new(0.0, 0, 0),
        Some(d) => {
            if !(0.0..1.0).contains(&d.p) {
                bail!(InvalidArgument, "dropout p is {}: it must be in [0, 1)", d.p);
            }
            for (name, ptr, required) in
                [("dropout seed", d.seed, true), ("dropout offset", d.offset, true), ("dropout seed_out", d.seed_out, false), ("dropout offset_out", d.offset_out, false)]
            {
                if ptr == 0 && required {
                    bail!(NullPointer, "{name}: device address of a u64 is null");
                }
                if ptr % 8 != 0 {
                    bail!(MisalignedPointer, "{name}: address {ptr:#x} is not 8-byte aligned (it holds a u64)");
                }
            }
            if (d.seed_out == 0) != (d.offset_out == 0) {
                bail!(InvalidArgument, "dropout seed_out and offset_out go together: give both or neither");
            }
            *d
        }
    };
    // Kept iff the element's 16 bits of its Philox word are ≥ ⌊p·2¹⁶⌋ (p < 1: at most 2¹⁶ - 1).
    let threshold = (d.p as f64 * 65_536.0).floor() as u32;
    args.extend([
        ("DROPOUT_THRESHOLD", U32(threshold)),
        ("dropout_scale", F32((1.0 / (1.0 - d.p as f64)) as f32)),
        ("PHILOX_SEED", Ptr(d.seed)),
        ("PHILOX_OFFSET", Ptr(d.offset)),
        ("philox_offset_base", I64(d.offset_base as i64)),
    ]);
    if forward {
        args.extend([
            ("PHILOX_SEED_OUT", Ptr(d.seed_out)),
            ("PHILOX_OFFSET_OUT", Ptr(d.offset_out)),
            ("STORE_PHILOX", I32((d.seed_out != 0) as i32)),
        ]);
    }
    Ok(())
}

/// Checks an additive bias: the input dtype, sizes [B or 1, Hq or 1, Sq or 1, Sk] (max lengths
/// for packed batches), unit last stride. Returns its kernel arguments (stride 0 where a size
/// is 1, i.e. broadcast), appended to `args`.
pub(crate) fn bias_args(args: &mut ArgList, bias: Option<&TensorView<4>>, shape: &AttnShape, dtype: DType) -> Result<()> {
    let (ptr, [z, h, m]) = match bias {
        None => (0, [0; 3]),
        Some(b) => {
            check_broadcastable("bias", b, shape, dtype)?;
            (b.ptr, broadcast_strides(b))
        }
    };
    args.extend([("BIAS", ArgValue::Ptr(ptr)), ("stride_bz", ArgValue::I64(z)), ("stride_bh", ArgValue::I64(h)), ("stride_bm", ArgValue::I64(m))]);
    Ok(())
}

/// Bias-like tensors: sizes [B or 1, Hq or 1, Sq or 1, Sk].
pub(crate) fn check_broadcastable(name: &str, t: &TensorView<4>, shape: &AttnShape, dtype: DType) -> Result<()> {
    t.check_layout(name)?;
    if t.dtype != dtype {
        bail!(DTypeMismatch, "{name} is {}, expected the inputs' {}", t.dtype.triton_name(), dtype.triton_name());
    }
    let full = [shape.batch, shape.heads_q, shape.seqlen_q, shape.seqlen_k];
    let fits = (0..4).all(|d| t.sizes[d] == full[d] || (d < 3 && t.sizes[d] == 1));
    if !fits {
        bail!(
            ShapeMismatch,
            "{name}.sizes is {:?}: it must broadcast to [B, Hq, Sq, Sk] = {full:?} (each of the first three sizes full or 1, the last {})",
            t.sizes,
            shape.seqlen_k
        );
    }
    Ok(())
}

/// Element strides of the first three dims, 0 where the size is 1 (broadcast).
pub(crate) fn broadcast_strides(t: &TensorView<4>) -> [i64; 3] {
    [0, 1, 2].map(|d| if t.sizes[d] == 1 { 0 } else { t.strides[d] })
}

/// The functional axes of the attention families: dtype, TF32, head-dim bucket and the
/// constexpr features (`dropout`, `bias`), as the family declares them.
pub(crate) fn axes(dtype: DType, tf32: bool, shape: &AttnShape, features: &[(&'static str, bool)]) -> Axes {
    let mut axes = Axes::new();
    axes.push("dtype", dtype.triton_name());
    if !features.is_empty() || tf32 {
        axes.push("tf32", bool_axis(tf32 && dtype == DType::F32));
    }
    axes.push("head_dim", shape.head_dim_axis);
    for &(name, on) in features {
        axes.push(name, bool_axis(on));
    }
    axes
}

/// The stride arguments of a B×H×S×D tensor, named `stride_<p>z/h/<row>` as in the kernels.
/// Packed batches address sequences through cu_seqlens, so their batch stride is 0.
pub(crate) fn strides4(names: [&'static str; 3], t: &TensorView<4>, shape: &AttnShape) -> [(&'static str, ArgValue); 3] {
    let batch_stride = if shape.varlen.is_some() { 0 } else { t.strides[0] };
    [(names[0], ArgValue::I64(batch_stride)), (names[1], ArgValue::I64(t.strides[1])), (names[2], ArgValue::I32(t.strides[2] as i32))]
}

/// The stride arguments of a B×H×S fp32 row-statistics tensor (lse, delta).
pub(crate) fn strides3(names: [&'static str; 2], t: &TensorView<3>, shape: &AttnShape) -> [(&'static str, ArgValue); 2] {
    let batch_stride = if shape.varlen.is_some() { 0 } else { t.strides[0] };
    [(names[0], ArgValue::I64(batch_stride)), (names[1], ArgValue::I64(t.strides[1]))]
}

/// Sequence-length, GQA and mask arguments every attention kernel takes, portable and Gluon alike.
pub(crate) fn seq_mask_args(shape: &AttnShape, mask: &MaskArgs) -> [(&'static str, ArgValue); 6] {
    use ArgValue::I32;
    [
        ("N_CTX_Q", I32(shape.seqlen_q as i32)),
        ("N_CTX_K", I32(shape.seqlen_k as i32)),
        ("GQA_GROUP", I32(shape.gqa_group() as i32)),
        ("WINDOW_LEFT", I32(mask.left)),
        ("WINDOW_RIGHT", I32(mask.right)),
        ("ALIGN_BOTTOM_RIGHT", I32(mask.bottom_right as i32)),
    ]
}

/// `seq_mask_args` plus the head-dim and packing arguments of the portable attention kernels.
pub(crate) fn common_args(shape: &AttnShape, mask: &MaskArgs) -> impl Iterator<Item = (&'static str, ArgValue)> {
    let dims = [("D_HEAD", ArgValue::I32(shape.head_dim as i32)), ("D_HEAD_V", ArgValue::I32(shape.head_dim_v as i32))];
    seq_mask_args(shape, mask).into_iter().chain(dims).chain(varlen_args(shape))
}

/// The packing arguments (kernels/flash/varlen.py); neutral values for a fixed-length batch.
pub(crate) fn varlen_args(shape: &AttnShape) -> [(&'static str, ArgValue); 7] {
    use ArgValue::{I32, Ptr};
    let p = shape.varlen.unwrap_or(Packed { cu_seqlens_q: 0, cu_seqlens_k: 0, tokens_q: 0, tokens_k: 0, status: 0 });
    [
        ("IS_VARLEN", I32(shape.varlen.is_some() as i32)),
        ("CU_SEQLENS_Q", Ptr(p.cu_seqlens_q)),
        ("CU_SEQLENS_K", Ptr(p.cu_seqlens_k)),
        // Validated ≤ i32::MAX (check_qkv).
        ("N_TOKENS_Q", I32(p.tokens_q as i32)),
        ("N_TOKENS_K", I32(p.tokens_k as i32)),
        ("VARLEN_STATUS", Ptr(p.status)),
        ("STORE_VARLEN_STATUS", I32((p.status != 0) as i32)),
    ]
}
