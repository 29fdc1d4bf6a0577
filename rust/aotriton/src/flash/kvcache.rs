//! `attn_fwd_kvcache`: attention of a decode step's 1..=16 query tokens over a KV cache, dense or
//! paged, optionally appending this step's new keys and values to the cache first
//! (FlashAttention's `flash_attn_with_kvcache`). The kernels are the portable ones of
//! `python/kernels/flash/{kvcache_append,decode,decode_combine}.py`; their contract is
//! `python/kernels/flash/kernels/decode/ABI.md`.
//!
//! Up to three launches on the caller's stream, all chosen and loaded before the first is
//! enqueued: `kvcache_append` (only with `k_new`/`v_new`), `attn_decode` (the cache split into
//! `N_SPLITS` chunks, flash-decoding) and `attn_decode_combine` (only when `N_SPLITS > 1`, merging
//! the chunks' partial outputs, which live in the caller's [`Workspace`]). Nothing is read from
//! device memory on the host, so a step can be captured in a CUDA graph.
//!
//! # Layouts
//!
//! Token-major, as FlashAttention's KV-cache call: Q and O `[B, Sq, Hq, D]`; a dense cache
//! `[B, S_cache, Hk, D]` (a `[B, Hk, S_cache, D]` buffer passes as its permuted view); a paged
//! cache a pool of pages `[N_PAGES, PAGE_SIZE, Hk, D]` with an int32 page table `[B, MAX_PAGES]`:
//! key `j` of sequence `b` is row `j % PAGE_SIZE` of page `page_table[b][j / PAGE_SIZE]`. Any
//! strides with the head dim contiguous. Pages may be shared between sequences for reading
//! (a common prefix); appending into a shared page is the caller's business.
//!
//! # Semantics
//!
//! Sequence `b` attends over `L = cache_seqlens[b] + N_NEW` keys: its cached ones, then the
//! `N_NEW` appended this step (written at positions `cache_seqlens[b] ..`). Query token `t` sits
//! at position `L − Sq + t` (bottom-right alignment, always): the mask's window counts from
//! there ([`Mask::causal`] / [`Mask::window`] with [`MaskAlign::BottomRight`]; [`Mask::NONE`]
//! sees all `L` keys). A row that sees no key gets O = 0 and LSE = +inf.
//!
//! `cache_seqlens` and the page ids are read by the kernels only. A length outside
//! `[0, capacity − N_NEW]` is clamped into it and a page id outside `[0, N_PAGES)` is never
//! followed (its keys are left out, its appended rows skipped), so nothing outside the caller's
//! tensors is read or written whatever those words hold; with a status word
//! ([`KvCacheParams::status`]) the kernels report what they clamped: [`KV_SEQLEN_OUT_OF_RANGE`],
//! [`KV_PAGE_OUT_OF_RANGE`].
//!
//! # Split rule
//!
//! `N_SPLITS`, from host-known values only (shapes, `num_splits`, the device's multiprocessor
//! count `SMs`, the compiled tiles), never from the device's `cache_seqlens`:
//!
//! ```text
//!     G        = Hq / Hk,  rows = G · Sq
//!     BLOCK_M  = the smallest compiled BLOCK_M ≥ rows, else the largest, among the kernels
//!                for the call's pages (dense; pages of ≥ BLOCK_N keys; SMALL_PAGE = the page)
//!     programs = B · Hk · cdiv(rows, BLOCK_M)
//!     C        = the cache capacity: S_cache (dense) or MAX_PAGES · PAGE_SIZE (paged)
//!     num_splits = 0:  N_SPLITS = clamp(floor(2 · SMs / programs), 1, min(128, cdiv(C, 256)))
//!     num_splits > 0:  N_SPLITS = min(num_splits, cdiv(C, BLOCK_N))
//! ```
//!
//! [`attn_fwd_kvcache_num_splits`] tells the count a call will use, and
//! [`attn_fwd_kvcache_workspace_bytes`] the workspace it needs (0 when `N_SPLITS` is 1): both take
//! the stream, as [`attn_bwd_workspace_bytes`](super::attn_bwd_workspace_bytes) does, since the
//! count depends on its device.
use super::{Mask, MaskAlign, Workspace, check_tensor, head_dim_bucket};
use crate::archive::{Functional, KernelMeta};
use crate::dispatch::{
    ArgList, ArgValue, Axes, KernelSet, Launcher, Request, blocks, bool_axis, config, find_functional, fitting_kernels, preferred_variant,
};
use crate::driver::Stream;
use crate::error::{Error, ErrorKind, Result, bail, checked_product};
use crate::images;
use crate::tensor::{DType, Region, TensorView, check_no_aliasing};

/// The append kernel's family (`kvcache_append.py`).
pub(crate) const APPEND_FAMILY: &str = "kvcache_append";
/// The split-KV attention kernel's family (`decode.py`).
pub(crate) const DECODE_FAMILY: &str = "attn_decode";
/// The merge of the splits' partials (`decode_combine.py`).
pub(crate) const COMBINE_FAMILY: &str = "attn_decode_combine";

/// Bits of a [`KvCacheParams::status`] word: a `cache_seqlens` value was outside
/// `[0, capacity − N_NEW]` (it was clamped into that range).
pub const KV_SEQLEN_OUT_OF_RANGE: i32 = 1;
/// Bits of a [`KvCacheParams::status`] word: a page id of a key in range was outside
/// `[0, N_PAGES)` (its keys were left out of the softmax, its appended rows not written).
pub const KV_PAGE_OUT_OF_RANGE: i32 = 2;

/// The most splits of the cache one call takes ([`KvCacheParams::num_splits`]).
pub const KVCACHE_MAX_SPLITS: u32 = 128;
/// The most query tokens per sequence (Sq) of one call: a longer prefill goes to `attn_fwd`.
pub const KVCACHE_MAX_QUERY_TOKENS: u64 = 16;
/// The largest cache capacity (S_cache or MAX_PAGES · PAGE_SIZE): key positions and the window
/// bounds `pos ± window + 1` are int32 in the kernels, so 2 · capacity + Sq must fit.
const MAX_CAPACITY: u64 = 1 << 30;
/// The auto rule gives each split at least this many keys of capacity.
const KEYS_PER_SPLIT: u64 = 256;

/// Parameters of [`attn_fwd_kvcache`] (see the module docs for layouts and semantics). Marked
/// non-exhaustive so later versions can add fields: build it with [`KvCacheParams::new`] and set
/// the public fields you need.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct KvCacheParams {
    /// `[B, Sq, Hq, D]`, fp16 or bf16, 1 ≤ Sq ≤ 16; D a multiple of 8 up to 256.
    pub q: TensorView<4>,
    /// The key cache, Q's dtype: dense `[B, S_cache, Hk, D]`, or with `page_table` a page pool
    /// `[N_PAGES, PAGE_SIZE, Hk, D]`, PAGE_SIZE a power of two in 16..=256. Hq must be a
    /// multiple of Hk. Written (rows `cache_seqlens[b] ..`) when `k_new` is given.
    pub k_cache: TensorView<4>,
    /// The value cache, the sizes of `k_cache`. It may interleave with `k_cache` in one buffer
    /// (e.g. `[N_PAGES, 2, PAGE_SIZE, Hk, D]`) as long as no element is shared.
    pub v_cache: TensorView<4>,
    /// int32 `[B, MAX_PAGES]` page ids (unit column stride): present for a paged cache, `None`
    /// for a dense one.
    pub page_table: Option<TensorView<2>>,
    /// int32 `[B]`, contiguous: each sequence's cached length before this step's appended keys.
    pub cache_seqlens: TensorView<1>,
    /// `[B, N_NEW, Hk, D]` keys to append before attending (with `v_new`; both or neither).
    pub k_new: Option<TensorView<4>>,
    /// `[B, N_NEW, Hk, D]` values to append, the sizes of `k_new`.
    pub v_new: Option<TensorView<4>>,
    /// `[B, Sq, Hq, D]` output, Q's dtype.
    pub o: TensorView<4>,
    /// fp32 `[B, Hq, Sq]` output, unit stride along Sq: the natural-log LSE of each row's scaled
    /// scores (+inf for a row that sees no key); `None` when not wanted.
    pub lse: Option<TensorView<3>>,
    /// Scale applied to Q·Kᵀ; `new` sets 1/√D. Finite and positive.
    pub sm_scale: f32,
    /// Which keys each query sees; `new` sets [`Mask::NONE`]. Windows count from the query's
    /// bottom-right aligned position: a mask with a bounded side must say
    /// [`MaskAlign::BottomRight`] (top-left is refused rather than silently re-aligned).
    pub mask: Mask,
    /// How many chunks the cache is split into: 0 (what `new` sets) lets the split rule decide
    /// (module docs); otherwise at most [`KVCACHE_MAX_SPLITS`], capped at the cache's BLOCK_N
    /// chunks.
    pub num_splits: u32,
    /// fp32 scratch for the splits' partial outputs, at least
    /// [`attn_fwd_kvcache_workspace_bytes`] bytes, 16-byte aligned; needed only when the call
    /// splits the cache (a too-small one is an error, never a silent fallback to one split).
    pub workspace: Option<Workspace>,
    /// Device address of an int32 word (4-byte aligned; 0 = none) into which the kernels OR
    /// [`KV_SEQLEN_OUT_OF_RANGE`] or [`KV_PAGE_OUT_OF_RANGE`] when they had to clamp a length or
    /// skip a page id. The caller zeroes it beforehand and reads it after the call (in stream
    /// order); it is written only on a violation.
    pub status: u64,
}

impl KvCacheParams {
    /// Attention of `q` over the caches (dense when `page_table` is `None`) into `o` (and `lse`
    /// when given), scale 1/√D, no mask, no append, the split rule's count, no workspace, no
    /// status word.
    pub fn new(
        q: TensorView<4>,
        k_cache: TensorView<4>,
        v_cache: TensorView<4>,
        page_table: Option<TensorView<2>>,
        cache_seqlens: TensorView<1>,
        o: TensorView<4>,
        lse: Option<TensorView<3>>,
    ) -> Self {
        let head_dim = q.sizes[3].max(1) as f32;
        KvCacheParams {
            q,
            k_cache,
            v_cache,
            page_table,
            cache_seqlens,
            k_new: None,
            v_new: None,
            o,
            lse,
            sm_scale: 1.0 / head_dim.sqrt(),
            mask: Mask::NONE,
            num_splits: 0,
            workspace: None,
            status: 0,
        }
    }
}

/// The checked shape of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DecodeShape {
    pub batch: u64,
    pub heads_q: u64,
    pub heads_k: u64,
    pub seqlen_q: u64,
    pub head_dim: u64,
    /// The compiled bucket (`HEAD_DIM`) and its axis value.
    pub bucket: u64,
    pub bucket_axis: &'static str,
    pub paged: bool,
    /// Keys the cache holds per sequence: S_cache, or MAX_PAGES · PAGE_SIZE.
    pub capacity: u64,
    /// 0 for a dense cache.
    pub page_size_log2: u32,
    /// The pool's pages (paged), else B.
    pub pages: u64,
    pub n_new: u64,
    /// The kernels' window sides: −1 unbounded, else at most the capacity.
    pub window_left: i32,
    pub window_right: i32,
}

impl DecodeShape {
    /// Keys per page (`None`: a dense cache).
    pub fn page(&self) -> Option<u64> {
        self.paged.then(|| 1u64 << self.page_size_log2)
    }

    pub fn gqa_group(&self) -> u64 {
        self.heads_q / self.heads_k
    }

    /// Query rows one KV head serves: the GQA group's heads × the step's tokens.
    pub fn rows(&self) -> u64 {
        self.gqa_group() * self.seqlen_q
    }
}

/// The kernels index a row of `name` as `row · stride` in int32 (row < `rows`): the last row's
/// extent must fit.
fn check_row_stride(name: &str, stride: i64, rows: u64, head_dim: u64) -> Result<()> {
    let extent = (rows.max(1) as i128 - 1) * stride as i128 + head_dim as i128;
    if stride > i32::MAX as i64 || extent > i32::MAX as i128 {
        bail!(TooLarge, "{name}: {rows} rows × row stride {stride} overflow the kernels' 32-bit row offsets");
    }
    Ok(())
}

/// Checks every argument that does not depend on the device, before anything touches the GPU.
/// (The workspace's size depends on the split count, hence on the device: `check_workspace`.)
pub(crate) fn validate(p: &KvCacheParams) -> Result<DecodeShape> {
    p.q.check_layout("q")?;
    let dtype = p.q.dtype;
    if !matches!(dtype, DType::F16 | DType::BF16) {
        bail!(UnsupportedDType, "q: the KV-cache attention takes fp16 or bf16, got {}", dtype.triton_name());
    }
    let [batch, seqlen_q, heads_q, head_dim] = p.q.sizes;
    for (what, n) in [("batch", batch), ("Sq", seqlen_q), ("Hq", heads_q)] {
        if n == 0 {
            bail!(EmptyInput, "q: {what} is 0 (q.sizes {:?} = [B, Sq, Hq, D])", p.q.sizes);
        }
    }
    if seqlen_q > KVCACHE_MAX_QUERY_TOKENS {
        bail!(
            InvalidArgument,
            "q: Sq = {seqlen_q} query tokens; the KV-cache attention takes 1..={KVCACHE_MAX_QUERY_TOKENS} (use attn_fwd for a longer prefill)"
        );
    }
    // The decode families share their buckets (rules.DECODE_HEAD_DIMS): the compiled ones.
    let (bucket, bucket_axis) = head_dim_bucket(DECODE_FAMILY, head_dim)?;

    // The caches: dense [B, S_cache, Hk, D] or a pool of pages [N_PAGES, PAGE_SIZE, Hk, D].
    p.k_cache.check_layout("k_cache")?;
    let [outer, rows_per_block, heads_k, _] = p.k_cache.sizes;
    check_tensor("k_cache", &p.k_cache, [outer, rows_per_block, heads_k, head_dim], dtype)?;
    check_tensor("v_cache", &p.v_cache, p.k_cache.sizes, dtype)?;
    if heads_k == 0 {
        bail!(EmptyInput, "k_cache: Hk is 0 (k_cache.sizes {:?})", p.k_cache.sizes);
    }
    if heads_q % heads_k != 0 {
        bail!(ShapeMismatch, "q has {heads_q} heads, not a multiple of the caches' {heads_k} (GQA needs Hq = G·Hk)");
    }
    if heads_q > 65535 || batch.saturating_mul(heads_k) > 65535 {
        bail!(TooLarge, "Hq ({heads_q}) and B · Hk ({batch} · {heads_k}) must each be at most 65535 (launch grid)");
    }
    let (paged, capacity, page_size_log2, pages) = match &p.page_table {
        None => {
            if outer != batch {
                bail!(ShapeMismatch, "k_cache.sizes[0] is {outer}, expected q's batch {batch} (a dense cache is [B, S_cache, Hk, D])");
            }
            if rows_per_block == 0 {
                bail!(EmptyInput, "k_cache: S_cache is 0 (the cache holds no key)");
            }
            (false, rows_per_block, 0, batch)
        }
        Some(table) => {
            table.check_layout("page_table")?;
            let max_pages = table.sizes[1];
            check_tensor("page_table", table, [batch, max_pages], DType::I32)?;
            let page_size = rows_per_block;
            if !(16..=256).contains(&page_size) || !page_size.is_power_of_two() {
                bail!(InvalidArgument, "k_cache: page size {page_size} (k_cache.sizes[1]); pages hold a power of two of 16..=256 rows");
            }
            if outer == 0 || max_pages == 0 {
                bail!(EmptyInput, "k_cache has {outer} pages and page_table {max_pages} columns: the cache holds no key");
            }
            if outer > i32::MAX as u64 {
                bail!(TooLarge, "k_cache has {outer} pages; the kernels take page ids as int32");
            }
            let capacity = checked_product("page_table columns × page size", &[max_pages, page_size])?;
            (true, capacity, page_size.trailing_zeros(), outer)
        }
    };
    if capacity > MAX_CAPACITY {
        bail!(TooLarge, "the cache holds {capacity} keys per sequence; the kernels' int32 positions allow at most {MAX_CAPACITY}");
    }
    let rows_indexed = if paged { rows_per_block } else { capacity };
    check_row_stride("k_cache", p.k_cache.strides[1], rows_indexed, head_dim)?;
    check_row_stride("v_cache", p.v_cache.strides[1], rows_indexed, head_dim)?;
    check_row_stride("q", p.q.strides[1], seqlen_q, head_dim)?;

    check_tensor("cache_seqlens", &p.cache_seqlens, [batch], DType::I32)?;
    check_tensor("o", &p.o, p.q.sizes, dtype)?;
    check_row_stride("o", p.o.strides[1], seqlen_q, head_dim)?;
    if let Some(lse) = &p.lse {
        check_tensor("lse", lse, [batch, heads_q, seqlen_q], DType::F32)?;
    }

    let n_new = match (&p.k_new, &p.v_new) {
        (None, None) => 0,
        (Some(k_new), Some(v_new)) => {
            k_new.check_layout("k_new")?;
            let n_new = k_new.sizes[1];
            check_tensor("k_new", k_new, [batch, n_new, heads_k, head_dim], dtype)?;
            check_tensor("v_new", v_new, k_new.sizes, dtype)?;
            check_row_stride("k_new", k_new.strides[1], n_new, head_dim)?;
            check_row_stride("v_new", v_new.strides[1], n_new, head_dim)?;
            if n_new > capacity {
                bail!(ShapeMismatch, "k_new has {n_new} tokens per sequence, more than the cache holds ({capacity})");
            }
            n_new
        }
        _ => bail!(InvalidArgument, "k_new and v_new go together: give both or neither"),
    };

    if !p.sm_scale.is_finite() || p.sm_scale <= 0.0 || !(p.sm_scale * std::f32::consts::LOG2_E).is_finite() {
        bail!(InvalidArgument, "sm_scale is {}: it must be finite and positive", p.sm_scale);
    }
    for (name, value) in [("window_left", p.mask.window_left), ("window_right", p.mask.window_right)] {
        if value < -1 {
            bail!(InvalidArgument, "mask.{name} is {value}: use −1 for unbounded, or a key count ≥ 0");
        }
    }
    if !p.mask.is_none() && p.mask.align != MaskAlign::BottomRight {
        bail!(
            InvalidArgument,
            "mask: the KV-cache attention aligns windows bottom-right (the last query token sees the last key); \
             give Mask::causal(MaskAlign::BottomRight) or Mask::window(left, right, MaskAlign::BottomRight)"
        );
    }
    // A side wider than the cache hides nothing; clamping keeps `pos ± window + 1` in int32.
    let side = |w: i32| if w < 0 { -1 } else { (w as u64).min(capacity) as i32 };
    if p.num_splits > KVCACHE_MAX_SPLITS {
        bail!(InvalidArgument, "num_splits is {}: at most {KVCACHE_MAX_SPLITS} (0 lets the split rule decide)", p.num_splits);
    }
    if let Some(ws) = &p.workspace
        && (ws.ptr == 0 || !ws.ptr.is_multiple_of(16))
    {
        bail!(MisalignedPointer, "workspace: address {:#x} is not a 16-byte aligned device address", ws.ptr);
    }
    if !p.status.is_multiple_of(4) {
        bail!(MisalignedPointer, "status: address {:#x} is not 4-byte aligned (it holds an int32)", p.status);
    }
    let shape = DecodeShape {
        batch,
        heads_q,
        heads_k,
        seqlen_q,
        head_dim,
        bucket,
        bucket_axis,
        paged,
        capacity,
        page_size_log2,
        pages,
        n_new,
        window_left: side(p.mask.window_left),
        window_right: side(p.mask.window_right),
    };
    check_memory(p, &shape, Region::NONE)?;
    Ok(shape)
}

/// No output may share memory with an input or another output. The caches are outputs when the
/// call appends (then they may interleave with each other without sharing an element), inputs
/// otherwise. `workspace`: the part of the workspace the call uses (or `Region::NONE`).
fn check_memory(p: &KvCacheParams, shape: &DecodeShape, workspace: Region) -> Result<()> {
    let optional_input = |name, t: Option<&TensorView<4>>| t.map_or(Ok(Region::NONE), |t| Region::input(name, t));
    let lse = match &p.lse {
        Some(lse) => Region::output("lse", lse)?,
        None => Region::NONE,
    };
    let status = if p.status == 0 { Region::NONE } else { Region::raw("status", p.status, 4)? };
    let page_table = match &p.page_table {
        Some(t) => Region::input("page_table", t)?,
        None => Region::NONE,
    };
    let inputs = [
        Region::input("q", &p.q)?,
        Region::input("cache_seqlens", &p.cache_seqlens)?,
        page_table,
        optional_input("k_new", p.k_new.as_ref())?,
        optional_input("v_new", p.v_new.as_ref())?,
    ];
    let outputs = [Region::output("o", &p.o)?, lse, status, workspace];
    if shape.n_new == 0 {
        let caches = [Region::input("k_cache", &p.k_cache)?, Region::input("v_cache", &p.v_cache)?];
        let all: [Region; 7] = [inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], caches[0], caches[1]];
        return check_no_aliasing(&outputs, &all);
    }
    let (k, v) = (Region::output("k_cache", &p.k_cache)?, Region::output("v_cache", &p.v_cache)?);
    // k_cache against everything but v_cache, then v_cache likewise, then the pair.
    check_no_aliasing(&[outputs[0], outputs[1], outputs[2], outputs[3], k], &inputs)?;
    check_no_aliasing(&[v], &[inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], outputs[0], outputs[1], outputs[2], outputs[3]])?;
    if k.bytes.0 < v.bytes.1 && v.bytes.0 < k.bytes.1 && !element_disjoint(&p.k_cache, &p.v_cache) {
        bail!(
            InvalidArgument,
            "k_cache [{:#x}, {:#x}) and v_cache [{:#x}, {:#x}) share elements: the append writes both",
            k.bytes.0,
            k.bytes.1,
            v.bytes.0,
            v.bytes.1
        );
    }
    Ok(())
}

/// Whether two views of the same sizes and strides (each without self-overlap) provably share
/// no element: their offset `δ` (in elements) leaves a gap. With the dims (size > 1) sorted by
/// stride, split into inner ones spanning `E` elements and outer ones whose strides are all
/// multiples of `G`, every element is `outer · G + x` with `0 ≤ x < E`; the views are disjoint
/// when `E ≤ δ mod G ≤ G − E`. This admits K and V interleaved in one buffer, e.g. views
/// `kv[:, 0]` and `kv[:, 1]` of a `[N_PAGES, 2, PAGE_SIZE, Hk, D]` pool.
fn element_disjoint<const R: usize>(a: &TensorView<R>, b: &TensorView<R>) -> bool {
    if a.sizes != b.sizes || a.strides != b.strides || a.dtype != b.dtype {
        return false;
    }
    let elem = a.dtype.size_bytes();
    let delta_bytes = a.ptr.abs_diff(b.ptr);
    if delta_bytes == 0 || !delta_bytes.is_multiple_of(elem) {
        return false;
    }
    let delta = (delta_bytes / elem) as u128;
    let mut dims: [(u128, u128); R] = [(0, 0); R];
    let mut n = 0;
    for d in 0..R {
        if a.sizes[d] > 1 {
            dims[n] = (a.strides[d].max(0) as u128, a.sizes[d] as u128);
            n += 1;
        }
    }
    let dims = &mut dims[..n];
    dims.sort_unstable();
    let gcd = |mut x: u128, mut y: u128| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    for split in 0..=n {
        let Some(extent) = dims[..split].iter().try_fold(1u128, |e, &(s, size)| e.checked_add((size - 1).checked_mul(s)?)) else {
            return false;
        };
        let g = dims[split..].iter().fold(0u128, |g, &(s, _)| gcd(g, s));
        if g == 0 {
            if delta >= extent {
                return true; // only inner dims: one block each, δ past its end
            }
            continue;
        }
        let r = delta % g;
        if extent <= r && r + extent <= g {
            return true;
        }
    }
    false
}

/// The functional axes of `family`: dtype, head-dim bucket and (not the combine) `paged`.
fn family_axes(family: &str, dtype: DType, shape: &DecodeShape) -> Axes {
    let mut axes = Axes::new();
    axes.push("dtype", dtype.triton_name());
    axes.push("head_dim", shape.bucket_axis);
    if family != COMBINE_FAMILY {
        axes.push("paged", bool_axis(shape.paged));
    }
    axes
}

fn i32_of(name: &'static str, value: u64) -> Result<(&'static str, ArgValue)> {
    match i32::try_from(value) {
        Ok(v) => Ok((name, ArgValue::I32(v))),
        Err(_) => bail!(TooLarge, "{name} = {value} does not fit the kernels' int32"),
    }
}

/// The caches', page table's, length's and status arguments the append and the decode share.
fn cache_args(p: &KvCacheParams, args: &mut ArgList) {
    use ArgValue::{I32, I64, Ptr};
    // [B or N_PAGES, rows, Hk, D]: (z, h, n) = (outer, head, row).
    let [kc, vc] = [&p.k_cache, &p.v_cache];
    args.extend([
        ("K", Ptr(kc.ptr)),
        ("V", Ptr(vc.ptr)),
        ("PAGE_TABLE", Ptr(p.page_table.map_or(0, |t| t.ptr))),
        ("CACHE_SEQLENS", Ptr(p.cache_seqlens.ptr)),
        ("KV_STATUS", Ptr(p.status)),
        ("STORE_KV_STATUS", I32((p.status != 0) as i32)),
        ("stride_kz", I64(kc.strides[0])),
        ("stride_kh", I64(kc.strides[2])),
        // Row strides: checked to fit int32 in `validate`.
        ("stride_kn", I32(kc.strides[1] as i32)),
        ("stride_vz", I64(vc.strides[0])),
        ("stride_vh", I64(vc.strides[2])),
        ("stride_vn", I32(vc.strides[1] as i32)),
        ("stride_ptz", I64(p.page_table.map_or(0, |t| t.strides[0]))),
    ]);
}

/// The scalars the append and the decode share.
fn cache_scalars(shape: &DecodeShape) -> Result<[(&'static str, ArgValue); 6]> {
    Ok([
        i32_of("N_NEW", shape.n_new)?,
        i32_of("D_HEAD", shape.head_dim)?,
        i32_of("CACHE_CAPACITY", shape.capacity)?,
        ("PAGE_SIZE_LOG2", ArgValue::I32(shape.page_size_log2 as i32)),
        i32_of("N_PAGES", shape.pages)?,
        // Not in the ABI's list of the append (its grid's B · Hk needs it); the decode derives
        // Hk from N_HEADS_Q / GQA_GROUP. A kernel that does not take it ignores it.
        i32_of("N_HEADS_K", shape.heads_k)?,
    ])
}

/// Arguments of `kvcache_append` (kernels/decode/ABI.md).
fn append_args(p: &KvCacheParams, shape: &DecodeShape) -> Result<ArgList> {
    use ArgValue::{I32, I64, Ptr};
    let mut args = ArgList::new();
    let (Some(kn), Some(vn)) = (p.k_new, p.v_new) else {
        return Err(Error::new(ErrorKind::Internal, "kvcache_append without k_new / v_new"));
    };
    args.extend([("K_NEW", Ptr(kn.ptr)), ("V_NEW", Ptr(vn.ptr))]);
    cache_args(p, &mut args);
    // [B, N_NEW, Hk, D]: (z, h, m) = (batch, head, token); the token stride i32 (checked), the others
    // i64 (kernels/decode/ABI.md).
    args.extend([
        ("stride_xkz", I64(kn.strides[0])),
        ("stride_xkh", I64(kn.strides[2])),
        ("stride_xkm", I32(kn.strides[1] as i32)),
        ("stride_xvz", I64(vn.strides[0])),
        ("stride_xvh", I64(vn.strides[2])),
        ("stride_xvm", I32(vn.strides[1] as i32)),
    ]);
    args.extend(cache_scalars(shape)?);
    Ok(args)
}

/// Where the splits' partials lie in the workspace: fp32 `O_PART [splits, B, Hq, Sq, HEAD_DIM]`
/// (HEAD_DIM the compiled bucket) then `LSE_PART [splits, B, Hq, Sq]`, each starting 16-byte
/// aligned. All zero for one split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WorkspaceLayout {
    pub splits: u32,
    /// Byte offset of LSE_PART.
    pub lse_offset: u64,
    pub bytes: u64,
}

fn round16(what: &str, bytes: u64) -> Result<u64> {
    Ok(crate::error::checked_sum(what, bytes, 15)? / 16 * 16)
}

pub(crate) fn workspace_layout(shape: &DecodeShape, splits: u32) -> Result<WorkspaceLayout> {
    if splits <= 1 {
        return Ok(WorkspaceLayout { splits: 1, lse_offset: 0, bytes: 0 });
    }
    let rows = checked_product("KV-cache workspace rows (splits · B · Hq · Sq)", &[splits as u64, shape.batch, shape.heads_q, shape.seqlen_q])?;
    let o_part = round16("KV-cache workspace", checked_product("KV-cache workspace O_PART bytes", &[rows, shape.bucket, 4])?)?;
    let lse_part = round16("KV-cache workspace", checked_product("KV-cache workspace LSE_PART bytes", &[rows, 4])?)?;
    Ok(WorkspaceLayout { splits, lse_offset: o_part, bytes: crate::error::checked_sum("KV-cache workspace bytes", o_part, lse_part)? })
}

/// Arguments of `attn_decode` (kernels/decode/ABI.md): `o_part` / `lse_part` the workspace's partials
/// (0 with one split).
fn decode_args(p: &KvCacheParams, shape: &DecodeShape, splits: u32, o_part: u64, lse_part: u64) -> Result<ArgList> {
    use ArgValue::{F32, I32, I64, Ptr};
    let mut args = ArgList::new();
    let lse = p.lse.map_or((0, [0i64; 3]), |l| (l.ptr, l.strides));
    args.extend([
        ("Q", Ptr(p.q.ptr)),
        ("O", Ptr(p.o.ptr)),
        ("LSE", Ptr(lse.0)),
        ("O_PART", Ptr(o_part)),
        ("LSE_PART", Ptr(lse_part)),
        ("sm_scale", F32(p.sm_scale)),
        // [B, Sq, Hq, D]: (z, h, m) = (batch, head, token).
        ("stride_qz", I64(p.q.strides[0])),
        ("stride_qh", I64(p.q.strides[2])),
        ("stride_qm", I32(p.q.strides[1] as i32)),
        ("stride_oz", I64(p.o.strides[0])),
        ("stride_oh", I64(p.o.strides[2])),
        ("stride_om", I32(p.o.strides[1] as i32)),
        ("stride_lz", I64(lse.1[0])),
        ("stride_lh", I64(lse.1[1])),
    ]);
    cache_args(p, &mut args);
    args.extend(cache_scalars(shape)?);
    args.extend([
        i32_of("N_CTX_Q", shape.seqlen_q)?,
        i32_of("GQA_GROUP", shape.gqa_group())?,
        i32_of("N_HEADS_Q", shape.heads_q)?,
        ("WINDOW_LEFT", I32(shape.window_left)),
        ("WINDOW_RIGHT", I32(shape.window_right)),
        ("N_SPLITS", I32(splits as i32)),
        ("STORE_LSE", I32(p.lse.is_some() as i32)),
    ]);
    Ok(args)
}

/// Arguments of `attn_decode_combine` (kernels/decode/ABI.md).
fn combine_args(p: &KvCacheParams, shape: &DecodeShape, splits: u32, o_part: u64, lse_part: u64) -> Result<ArgList> {
    use ArgValue::{I32, I64, Ptr};
    let mut args = ArgList::new();
    let lse = p.lse.map_or((0, [0i64; 3]), |l| (l.ptr, l.strides));
    args.extend([
        ("O_PART", Ptr(o_part)),
        ("LSE_PART", Ptr(lse_part)),
        ("O", Ptr(p.o.ptr)),
        ("LSE", Ptr(lse.0)),
        ("stride_oz", I64(p.o.strides[0])),
        ("stride_oh", I64(p.o.strides[2])),
        ("stride_om", I32(p.o.strides[1] as i32)),
        ("stride_lz", I64(lse.1[0])),
        ("stride_lh", I64(lse.1[1])),
        i32_of("N_BATCH", shape.batch)?,
        i32_of("N_HEADS_Q", shape.heads_q)?,
        i32_of("N_CTX_Q", shape.seqlen_q)?,
        i32_of("D_HEAD", shape.head_dim)?,
        ("N_SPLITS", I32(splits as i32)),
        ("STORE_LSE", I32(p.lse.is_some() as i32)),
    ]);
    Ok(args)
}

fn block_m(meta: &KernelMeta) -> u64 {
    config(meta, "BLOCK_M", 16).max(1) as u64
}

fn block_n(meta: &KernelMeta) -> u64 {
    config(meta, "BLOCK_N", 64).max(1) as u64
}

/// A decode kernel's tiles and the pages it walks: `SMALL_PAGE` 0, pages of at least BLOCK_N
/// keys (one page per block); 16 or 32, pages of exactly that many keys (kernels/decode/kvcache.py).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DecodeTile {
    block_m: u64,
    block_n: u64,
    small_page: u64,
}

impl DecodeTile {
    fn of(meta: &KernelMeta) -> Self {
        Self { block_m: block_m(meta), block_n: block_n(meta), small_page: config(meta, "SMALL_PAGE", 0).max(0) as u64 }
    }

    /// Whether the kernel reads a cache of `page`-key pages (`None`: dense) right.
    fn serves(&self, page: Option<u64>) -> bool {
        match page {
            None => self.small_page == 0,
            Some(page) if self.small_page == 0 => self.block_n <= page,
            Some(page) => self.small_page == page,
        }
    }
}

/// The decode kernel of a call: among the fitting kernels of the preferred variant (`aligned`
/// where it fits), the tile by [`pick_tile`]'s rule. With none that serves the call's pages it
/// returns a kernel that does not, which [`check_serves`] refuses before anything is launched.
fn choose_decode(functional: &Functional, fitting: KernelSet, shape: &DecodeShape) -> usize {
    let pool = preferred_variant(functional, fitting);
    let tiles = || pool.iter().map(|i| (i, DecodeTile::of(&functional.kernels[i])));
    pick_tile(tiles, shape.rows(), shape.page()).unwrap_or(0)
}

/// The error for a chosen kernel that does not serve the call's pages (an archive without the
/// kernel of that page size).
fn check_serves(meta: &KernelMeta, shape: &DecodeShape) -> Result<()> {
    if !DecodeTile::of(meta).serves(shape.page()) {
        bail!(
            KernelNotFound,
            "no compiled {} kernel that fits this call reads pages of {} keys (kernel {} is for SMALL_PAGE {})",
            DECODE_FAMILY,
            shape.page().unwrap_or(0),
            meta.id,
            config(meta, "SMALL_PAGE", 0)
        );
    }
    Ok(())
}

/// Of `(kernel, tile)` candidates, those that serve the pages ([`DecodeTile::serves`]); among
/// them BLOCK_M the smallest ≥ `rows`, else the largest; then the largest BLOCK_N; the lowest index
/// among equals. `None` when no candidate serves the pages.
fn pick_tile<I: Iterator<Item = (usize, DecodeTile)>>(candidates: impl Fn() -> I, rows: u64, page: Option<u64>) -> Option<usize> {
    let serving = || candidates().filter(|(_, t)| t.serves(page));
    let bm = serving()
        .map(|(_, t)| t.block_m)
        .filter(|&bm| bm >= rows)
        .min()
        .or_else(|| serving().map(|(_, t)| t.block_m).max())?;
    serving()
        .filter(|(_, t)| t.block_m == bm)
        .max_by_key(|&(i, t)| (t.block_n, std::cmp::Reverse(i)))
        .map(|(i, _)| i)
}

/// The inputs of the split rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SplitInputs {
    pub batch: u64,
    pub heads_k: u64,
    /// G · Sq.
    pub rows: u64,
    pub capacity: u64,
    pub block_m: u64,
    pub block_n: u64,
    pub multiprocessors: u64,
    /// `num_splits` (0: the rule decides).
    pub requested: u32,
}

/// The split rule (module docs).
pub(crate) fn split_count(s: SplitInputs) -> u32 {
    let chunks = s.capacity.div_ceil(s.block_n.max(1)).max(1);
    if s.requested > 0 {
        return (s.requested as u64).min(chunks) as u32;
    }
    let programs = s.batch.saturating_mul(s.heads_k).saturating_mul(s.rows.div_ceil(s.block_m.max(1))).max(1);
    // Whole waves: a program that starts after the first wave leaves the GPU idle but for
    // itself while it runs, so as many splits as fit two programs per multiprocessor at once.
    let wanted = s.multiprocessors.saturating_mul(2) / programs;
    let most = (KVCACHE_MAX_SPLITS as u64).min(s.capacity.div_ceil(KEYS_PER_SPLIT)).max(1);
    wanted.clamp(1, most) as u32
}

/// The split count of a call on the launcher's device: the tiles of the decode kernel the call
/// will run (BLOCK_M by the rule of `choose_decode`, BLOCK_N from its config) and the split rule.
fn splits_on(launcher: &Launcher, p: &KvCacheParams, shape: &DecodeShape) -> Result<u32> {
    // Which kernels fit does not depend on the split count: the partials' pointers are 0 or
    // the (16-byte aligned) workspace's; a stand-in gives the same answer.
    let args = decode_args(p, shape, 1, 0, 0)?;
    let axes = family_axes(DECODE_FAMILY, p.q.dtype, shape);
    let request = Request { family: DECODE_FAMILY, axes: axes.as_slice()?, args: args.args()? };
    let loaded = images::archive_for_device(launcher.device())?;
    let functional = &loaded.archive.functionals()[find_functional(&loaded, &request)?];
    let mut fitting = fitting_kernels(functional, request.args)?;
    if fitting.is_empty() {
        // `prepare` reports it; any kernel's tiles do meanwhile.
        (0..functional.kernels.len().min(KernelSet::CAPACITY)).for_each(|i| fitting.insert(i));
    }
    let meta = &functional.kernels[choose_decode(functional, fitting, shape)];
    check_serves(meta, shape)?;
    Ok(split_count(SplitInputs {
        batch: shape.batch,
        heads_k: shape.heads_k,
        rows: shape.rows(),
        capacity: shape.capacity,
        block_m: block_m(meta),
        block_n: block_n(meta),
        multiprocessors: launcher.device().multiprocessors as u64,
        requested: p.num_splits,
    }))
}

/// How many chunks [`attn_fwd_kvcache`] splits the cache into for `params` on `stream`'s device
/// (the split rule of the module docs). `params.workspace` is not looked at.
pub fn attn_fwd_kvcache_num_splits(params: &KvCacheParams, stream: Stream) -> Result<u32> {
    let shape = validate(params)?;
    let launcher = Launcher::new(stream)?;
    splits_on(&launcher, params, &shape)
}

/// Bytes of the workspace [`attn_fwd_kvcache`] needs for `params` on `stream`'s device: with
/// `N_SPLITS` = [`attn_fwd_kvcache_num_splits`] > 1, fp32 `O_PART [N_SPLITS, B, Hq, Sq, HEAD_DIM]`
/// (HEAD_DIM: D rounded up to the compiled bucket 64, 128 or 256) and `LSE_PART
/// [N_SPLITS, B, Hq, Sq]`, each rounded up to 16 bytes; 0 when the call does not split.
/// `params.workspace` is not looked at.
pub fn attn_fwd_kvcache_workspace_bytes(params: &KvCacheParams, stream: Stream) -> Result<u64> {
    let shape = validate(params)?;
    let launcher = Launcher::new(stream)?;
    let splits = splits_on(&launcher, params, &shape)?;
    Ok(workspace_layout(&shape, splits)?.bytes)
}

/// The partials' addresses `(O_PART, LSE_PART)` in the caller's workspace (0, 0 for one split),
/// after checking its size and that it shares no memory with the call's tensors.
fn check_workspace(p: &KvCacheParams, shape: &DecodeShape, layout: &WorkspaceLayout) -> Result<(u64, u64)> {
    if layout.bytes == 0 {
        return Ok((0, 0));
    }
    let needed = layout.bytes;
    let splits = layout.splits;
    let ws = match p.workspace {
        None => bail!(
            InvalidArgument,
            "the call splits the cache in {splits} and needs a workspace of {needed} bytes (attn_fwd_kvcache_workspace_bytes); none was given"
        ),
        Some(ws) if ws.bytes < needed => bail!(
            InvalidArgument,
            "the call splits the cache in {splits} and needs a workspace of {needed} bytes (attn_fwd_kvcache_workspace_bytes); {} were given",
            ws.bytes
        ),
        Some(ws) => ws,
    };
    // Alignment was checked by `validate`.
    check_memory(p, shape, Region::raw("workspace", ws.ptr, needed)?)?;
    Ok((ws.ptr, crate::error::checked_sum("workspace LSE_PART address", ws.ptr, layout.lse_offset)?))
}

/// Enqueues the step on `stream` (the device is the stream's): the append of `k_new`/`v_new`
/// into the caches when given, the split-KV attention, and the merge of the splits when there
/// is more than one. Nothing is launched when an argument is invalid, the workspace is missing
/// or short for the split count, or a kernel is missing from the device's archive.
pub fn attn_fwd_kvcache(params: &KvCacheParams, stream: Stream) -> Result<()> {
    let shape = validate(params)?;
    let dtype = params.q.dtype;
    // The append's list does not depend on the device: built (and checked) before the driver.
    let a_args = if shape.n_new > 0 { Some(append_args(params, &shape)?) } else { None };
    let launcher = Launcher::new(stream)?;
    let splits = splits_on(&launcher, params, &shape)?;
    let layout = workspace_layout(&shape, splits)?;
    let (o_part, lse_part) = check_workspace(params, &shape, &layout)?;
    let d_args = decode_args(params, &shape, splits, o_part, lse_part)?;
    let c_args = combine_args(params, &shape, splits, o_part, lse_part)?;
    let (a_axes, d_axes, c_axes) =
        (family_axes(APPEND_FAMILY, dtype, &shape), family_axes(DECODE_FAMILY, dtype, &shape), family_axes(COMBINE_FAMILY, dtype, &shape));
    let programs_bh = shape.batch * shape.heads_k;
    let append = match &a_args {
        Some(args) => {
            let request = Request { family: APPEND_FAMILY, axes: a_axes.as_slice()?, args: args.args()? };
            let n_new = shape.n_new;
            Some(launcher.prepare(&request, crate::dispatch::first_preferred, |meta| {
                // BLOCK_M: the append's tokens per program.
                let tile = config(meta, "BLOCK_M", 16);
                Ok([n_new.div_ceil(tile.max(1) as u64), programs_bh, 1])
            })?)
        }
        None => None,
    };
    let d_request = Request { family: DECODE_FAMILY, axes: d_axes.as_slice()?, args: d_args.args()? };
    let rows = shape.rows();
    let decode = launcher.prepare(
        &d_request,
        |functional, fitting, _| choose_decode(functional, fitting, &shape),
        |meta| {
            check_serves(meta, &shape)?;
            Ok([splits as u64, programs_bh, blocks(rows, meta, "BLOCK_M", 16)])
        },
    )?;
    let combine = if splits > 1 {
        let request = Request { family: COMBINE_FAMILY, axes: c_axes.as_slice()?, args: c_args.args()? };
        Some(launcher.prepare(&request, crate::dispatch::first_preferred, |_| {
            // One program per query row.
            Ok([checked_product("KV-cache combine programs (B · Hq · Sq)", &[shape.batch, shape.heads_q, shape.seqlen_q])?, 1, 1])
        })?)
    } else {
        None
    };
    if let Some(append) = &append {
        launcher.launch(append)?;
    }
    launcher.launch(&decode)?;
    if let Some(combine) = &combine {
        launcher.launch(combine)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = 2;
    const SQ: u64 = 4;
    const HQ: u64 = 8;
    const HK: u64 = 2;
    const D: u64 = 64;
    const S_CACHE: u64 = 300;
    const N_PAGES: u64 = 10;
    const PAGE: u64 = 32;
    const MAX_PAGES: u64 = 5;
    const N_NEW: u64 = 3;

    /// A well-formed dense GQA call on fake, aligned device addresses (never dereferenced here),
    /// 2^32 bytes apart so no two overlap whatever sizes a test gives them.
    fn dense() -> KvCacheParams {
        let t = |i: u64, sizes| TensorView::contiguous(i << 32, sizes, DType::F16);
        let mut p = KvCacheParams::new(
            t(1, [B, SQ, HQ, D]),
            t(2, [B, S_CACHE, HK, D]),
            t(3, [B, S_CACHE, HK, D]),
            None,
            TensorView::contiguous(4 << 32, [B], DType::I32),
            t(5, [B, SQ, HQ, D]),
            Some(TensorView::contiguous(6 << 32, [B, HQ, SQ], DType::F32)),
        );
        p.status = 7 << 32;
        p
    }

    /// The same call on a paged cache (10 pages of 32 rows, 5 pages per sequence), appending 3
    /// tokens.
    fn paged() -> KvCacheParams {
        let mut p = dense();
        p.k_cache = TensorView::contiguous(2 << 32, [N_PAGES, PAGE, HK, D], DType::F16);
        p.v_cache = TensorView::contiguous(3 << 32, [N_PAGES, PAGE, HK, D], DType::F16);
        p.page_table = Some(TensorView::contiguous(8 << 32, [B, MAX_PAGES], DType::I32));
        p.k_new = Some(TensorView::contiguous(9 << 32, [B, N_NEW, HK, D], DType::F16));
        p.v_new = Some(TensorView::contiguous(10 << 32, [B, N_NEW, HK, D], DType::F16));
        p
    }

    fn arg_of(args: &ArgList, name: &str) -> Option<ArgValue> {
        args.args().unwrap().iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    #[test]
    fn valid_calls_give_their_shapes() {
        let s = validate(&dense()).unwrap();
        assert_eq!((s.batch, s.heads_q, s.heads_k, s.seqlen_q, s.head_dim, s.bucket, s.bucket_axis), (B, HQ, HK, SQ, D, 64, "64"));
        assert_eq!((s.paged, s.capacity, s.page_size_log2, s.pages, s.n_new), (false, S_CACHE, 0, B, 0));
        assert_eq!((s.gqa_group(), s.rows(), s.window_left, s.window_right), (4, 16, -1, -1));
        let s = validate(&paged()).unwrap();
        assert_eq!((s.paged, s.capacity, s.page_size_log2, s.pages, s.n_new), (true, MAX_PAGES * PAGE, 5, N_PAGES, N_NEW));
        let mut p = dense();
        (p.lse, p.status) = (None, 0);
        p.mask = Mask::causal(MaskAlign::BottomRight);
        let s = validate(&p).unwrap();
        assert_eq!((s.window_left, s.window_right), (-1, 0));
        // A side wider than the cache is clamped to it (same keys; int32-safe bounds).
        p.mask = Mask::window(1 << 30, 7, MaskAlign::BottomRight);
        let s = validate(&p).unwrap();
        assert_eq!((s.window_left, s.window_right), (S_CACHE as i32, 7));
        // Head-dim buckets.
        for (d, bucket) in [(8, 64), (16, 64), (24, 64), (72, 128), (136, 256), (256, 256)] {
            assert_eq!(head_dim_bucket(DECODE_FAMILY, d).unwrap().0, bucket, "D {d}");
        }
    }

    #[test]
    fn every_refusal_has_its_kind() {
        type Mutation = Box<dyn Fn(&mut KvCacheParams)>;
        let head_dim = |d: u64| -> Mutation {
            Box::new(move |p: &mut KvCacheParams| {
                for t in [&mut p.q, &mut p.k_cache, &mut p.v_cache, &mut p.o] {
                    *t = TensorView::contiguous(t.ptr, [t.sizes[0], t.sizes[1], t.sizes[2], d], t.dtype);
                }
            })
        };
        let all_dtype = |dtype: DType| -> Mutation {
            Box::new(move |p: &mut KvCacheParams| {
                for t in [&mut p.q, &mut p.k_cache, &mut p.v_cache, &mut p.o] {
                    t.dtype = dtype;
                }
            })
        };
        let sq = |n: u64| -> Mutation {
            Box::new(move |p: &mut KvCacheParams| {
                p.q = TensorView::contiguous(p.q.ptr, [B, n, HQ, D], DType::F16);
                p.o = TensorView::contiguous(p.o.ptr, [B, n, HQ, D], DType::F16);
                p.lse = Some(TensorView::contiguous(6 << 32, [B, HQ, n], DType::F32));
            })
        };
        let page_size = |n: u64| -> Mutation {
            Box::new(move |p: &mut KvCacheParams| {
                p.k_cache = TensorView::contiguous(p.k_cache.ptr, [N_PAGES, n, HK, D], DType::F16);
                p.v_cache = TensorView::contiguous(p.v_cache.ptr, [N_PAGES, n, HK, D], DType::F16);
            })
        };
        use ErrorKind::*;
        // (name, paged base?, mutation, kind)
        let cases: Vec<(&str, bool, Mutation, ErrorKind)> = vec![
            ("q fp32", false, all_dtype(DType::F32), UnsupportedDType),
            ("q int32", false, all_dtype(DType::I32), UnsupportedDType),
            ("k_cache bf16", false, Box::new(|p| p.k_cache.dtype = DType::BF16), DTypeMismatch),
            ("v_cache bf16", false, Box::new(|p| p.v_cache.dtype = DType::BF16), DTypeMismatch),
            ("o bf16", false, Box::new(|p| p.o.dtype = DType::BF16), DTypeMismatch),
            ("k_new bf16", true, Box::new(|p| p.k_new.as_mut().unwrap().dtype = DType::BF16), DTypeMismatch),
            ("lse fp16", false, Box::new(|p| p.lse.as_mut().unwrap().dtype = DType::F16), DTypeMismatch),
            ("cache_seqlens fp32", false, Box::new(|p| p.cache_seqlens.dtype = DType::F32), DTypeMismatch),
            ("page_table fp32", true, Box::new(|p| p.page_table.as_mut().unwrap().dtype = DType::F32), DTypeMismatch),
            ("Sq 0", false, sq(0), EmptyInput),
            ("Sq 17", false, sq(17), InvalidArgument),
            ("batch 0", false, Box::new(|p| p.q.sizes[0] = 0), EmptyInput),
            ("Hk 0", false, Box::new(|p| (p.k_cache.sizes[2], p.v_cache.sizes[2]) = (0, 0)), EmptyInput),
            ("S_cache 0", false, Box::new(|p| (p.k_cache.sizes[1], p.v_cache.sizes[1]) = (0, 0)), EmptyInput),
            ("no pages", true, Box::new(|p| (p.k_cache.sizes[0], p.v_cache.sizes[0]) = (0, 0)), EmptyInput),
            ("page table without columns", true, Box::new(|p| p.page_table.as_mut().unwrap().sizes[1] = 0), EmptyInput),
            ("head dim 20", false, head_dim(20), UnsupportedHeadDim),
            ("head dim 264", false, head_dim(264), UnsupportedHeadDim),
            ("head dim 0", false, head_dim(0), UnsupportedHeadDim),
            ("k_cache head dim", false, Box::new(|p| p.k_cache.sizes[3] = 32), ShapeMismatch),
            ("v_cache rows", false, Box::new(|p| p.v_cache.sizes[1] = S_CACHE - 1), ShapeMismatch),
            ("dense cache batch", false, Box::new(|p| (p.k_cache.sizes[0], p.v_cache.sizes[0]) = (B + 1, B + 1)), ShapeMismatch),
            ("Hq not a multiple of Hk", false, Box::new(|p| (p.k_cache.sizes[2], p.v_cache.sizes[2]) = (3, 3)), ShapeMismatch),
            ("o heads", false, Box::new(|p| p.o.sizes[2] = HQ / 2), ShapeMismatch),
            ("lse tokens", false, Box::new(|p| p.lse.as_mut().unwrap().sizes[2] = SQ + 1), ShapeMismatch),
            ("cache_seqlens of B+1", false, Box::new(|p| p.cache_seqlens.sizes[0] = B + 1), ShapeMismatch),
            ("page_table batch", true, Box::new(|p| p.page_table.as_mut().unwrap().sizes[0] = B + 1), ShapeMismatch),
            ("k_new heads", true, Box::new(|p| p.k_new.as_mut().unwrap().sizes[2] = HQ), ShapeMismatch),
            ("v_new tokens", true, Box::new(|p| p.v_new.as_mut().unwrap().sizes[1] = N_NEW + 1), ShapeMismatch),
            (
                "k_new beyond the capacity",
                true,
                Box::new(|p| {
                    let n = MAX_PAGES * PAGE + 1;
                    p.k_new = Some(TensorView::contiguous(9 << 32, [B, n, HK, D], DType::F16));
                    p.v_new = Some(TensorView::contiguous(10 << 32, [B, n, HK, D], DType::F16));
                }),
                ShapeMismatch,
            ),
            ("k_new without v_new", true, Box::new(|p| p.v_new = None), InvalidArgument),
            ("v_new without k_new", true, Box::new(|p| p.k_new = None), InvalidArgument),
            ("page size 8", true, page_size(8), InvalidArgument),
            ("page size 48", true, page_size(48), InvalidArgument),
            ("page size 512", true, page_size(512), InvalidArgument),
            ("capacity above 2^30", true, Box::new(|p| p.page_table.as_mut().unwrap().sizes[1] = (1 << 25) + 1), TooLarge),
            ("capacity product overflows", true, Box::new(|p| p.page_table.as_mut().unwrap().sizes[1] = u64::MAX / 4), TooLarge),
            ("pages above int32", true, Box::new(|p| (p.k_cache.sizes[0], p.v_cache.sizes[0]) = (1 << 31, 1 << 31)), TooLarge),
            ("cache row offsets overflow int32", false, Box::new(|p| p.k_cache.strides[1] = 1 << 23), TooLarge),
            ("paged row stride overflows int32", true, Box::new(|p| p.v_cache.strides[1] = 1 << 27), TooLarge),
            ("q row stride above int32", false, Box::new(|p| p.q.strides[1] = 1 << 31), TooLarge),
            ("o row stride above int32", false, Box::new(|p| p.o.strides[1] = 1 << 31), TooLarge),
            ("B · Hk above the grid", false, Box::new(|p| {
                for t in [&mut p.q, &mut p.o, &mut p.k_cache, &mut p.v_cache] {
                    t.sizes[0] = 40_000;
                }
                p.cache_seqlens.sizes[0] = 40_000;
                p.lse.as_mut().unwrap().sizes[0] = 40_000;
            }), TooLarge),
            ("q null", false, Box::new(|p| p.q.ptr = 0), NullPointer),
            ("cache_seqlens null", false, Box::new(|p| p.cache_seqlens.ptr = 0), NullPointer),
            ("page_table null", true, Box::new(|p| p.page_table.as_mut().unwrap().ptr = 0), NullPointer),
            ("k_cache misaligned", false, Box::new(|p| p.k_cache.ptr += 1), MisalignedPointer),
            ("lse misaligned", false, Box::new(|p| p.lse.as_mut().unwrap().ptr += 2), MisalignedPointer),
            ("status misaligned", false, Box::new(|p| p.status += 2), MisalignedPointer),
            ("workspace misaligned", false, Box::new(|p| p.workspace = Some(Workspace { ptr: (11 << 32) + 8, bytes: 1 << 20 })), MisalignedPointer),
            ("workspace null", false, Box::new(|p| p.workspace = Some(Workspace { ptr: 0, bytes: 1 << 20 })), MisalignedPointer),
            ("q head dim strided", false, Box::new(|p| p.q.strides[3] = 2), BadStrides),
            ("cache_seqlens strided", false, Box::new(|p| p.cache_seqlens.strides[0] = 2), BadStrides),
            ("page_table columns strided", true, Box::new(|p| p.page_table.as_mut().unwrap().strides[1] = 2), BadStrides),
            ("lse strided along Sq", false, Box::new(|p| p.lse.as_mut().unwrap().strides[2] = 2), BadStrides),
            ("negative cache stride", false, Box::new(|p| p.k_cache.strides[0] = -1), BadStrides),
            ("o with overlapping rows", false, Box::new(|p| p.o.strides[1] = 0), BadStrides),
            ("sm_scale 0", false, Box::new(|p| p.sm_scale = 0.0), InvalidArgument),
            ("sm_scale negative", false, Box::new(|p| p.sm_scale = -0.125), InvalidArgument),
            ("sm_scale NaN", false, Box::new(|p| p.sm_scale = f32::NAN), InvalidArgument),
            ("sm_scale inf", false, Box::new(|p| p.sm_scale = f32::INFINITY), InvalidArgument),
            ("sm_scale · log2(e) inf", false, Box::new(|p| p.sm_scale = f32::MAX), InvalidArgument),
            ("window left -2", false, Box::new(|p| p.mask = Mask::window(-2, 0, MaskAlign::BottomRight)), InvalidArgument),
            ("top-left causal", false, Box::new(|p| p.mask = Mask::causal(MaskAlign::TopLeft)), InvalidArgument),
            ("top-left window", false, Box::new(|p| p.mask = Mask::window(16, -1, MaskAlign::TopLeft)), InvalidArgument),
            ("num_splits 129", false, Box::new(|p| p.num_splits = KVCACHE_MAX_SPLITS + 1), InvalidArgument),
            ("o over q", false, Box::new(|p| p.o.ptr = p.q.ptr), InvalidArgument),
            ("o over k_cache", false, Box::new(|p| p.o.ptr = p.k_cache.ptr + 128), InvalidArgument),
            ("lse over cache_seqlens", false, Box::new(|p| p.lse.as_mut().unwrap().ptr = p.cache_seqlens.ptr), InvalidArgument),
            ("status inside o", false, Box::new(|p| p.status = p.o.ptr + 64), InvalidArgument),
            ("status inside the page table", true, Box::new(|p| p.status = p.page_table.unwrap().ptr), InvalidArgument),
            ("appending k_cache over q", true, Box::new(|p| p.k_cache.ptr = p.q.ptr), InvalidArgument),
            ("appending v_cache over k_new", true, Box::new(|p| p.v_cache.ptr = p.k_new.unwrap().ptr), InvalidArgument),
            ("appending v_cache over o", true, Box::new(|p| p.o.ptr = p.v_cache.ptr + 2 * D), InvalidArgument),
            ("appending k_cache over the page table", true, Box::new(|p| p.page_table.as_mut().unwrap().ptr = p.k_cache.ptr), InvalidArgument),
            ("appending k_cache = v_cache", true, Box::new(|p| p.v_cache.ptr = p.k_cache.ptr), InvalidArgument),
            ("appending v_cache one row after k_cache", true, Box::new(|p| p.v_cache.ptr = p.k_cache.ptr + 2 * HK * D), InvalidArgument),
        ];
        for (name, is_paged, mutate, kind) in cases {
            let mut p = if is_paged { paged() } else { dense() };
            mutate(&mut p);
            match validate(&p) {
                Ok(_) => panic!("{name}: accepted"),
                Err(e) => {
                    assert_eq!(e.kind(), kind, "{name}: {e}");
                    assert!(!e.message().is_empty(), "{name}");
                }
            }
        }
    }

    #[test]
    fn caches_may_interleave_and_be_read_together() {
        // A pool [N_PAGES, 2, PAGE, Hk, D] holding K and V of each page: views kv[:, 0], kv[:, 1].
        let mut p = paged();
        let strides = [(2 * PAGE * HK * D) as i64, (HK * D) as i64, D as i64, 1];
        p.k_cache = TensorView::new(2 << 32, [N_PAGES, PAGE, HK, D], strides, DType::F16);
        p.v_cache = TensorView::new((2 << 32) + 2 * PAGE * HK * D, [N_PAGES, PAGE, HK, D], strides, DType::F16);
        assert!(validate(&p).is_ok(), "interleaved pages, appending");
        // A dense [B, S, 2, Hk, D] buffer: K and V interleaved per token.
        let mut p = dense();
        p.k_new = Some(TensorView::contiguous(9 << 32, [B, 1, HK, D], DType::F16));
        p.v_new = Some(TensorView::contiguous(10 << 32, [B, 1, HK, D], DType::F16));
        let strides = [(S_CACHE * 2 * HK * D) as i64, (2 * HK * D) as i64, D as i64, 1];
        p.k_cache = TensorView::new(2 << 32, [B, S_CACHE, HK, D], strides, DType::F16);
        p.v_cache = TensorView::new((2 << 32) + 2 * HK * D, [B, S_CACHE, HK, D], strides, DType::F16);
        assert!(validate(&p).is_ok(), "interleaved tokens, appending");
        // Shifted by half a token's K: elements shared.
        p.v_cache.ptr = (2 << 32) + HK * D;
        assert_eq!(validate(&p).unwrap_err().kind(), ErrorKind::InvalidArgument);
        // Without an append the caches are inputs: any overlap is fine.
        (p.k_new, p.v_new) = (None, None);
        p.v_cache = p.k_cache;
        assert!(validate(&p).is_ok(), "read-only caches may be one tensor");
        // Element-level test on its own.
        let a = TensorView::new(0x1000, [4, 8], [16, 1], DType::F16);
        assert!(element_disjoint(&a, &TensorView { ptr: 0x1000 + 16, ..a }));
        assert!(!element_disjoint(&a, &TensorView { ptr: 0x1000 + 8, ..a }));
        assert!(!element_disjoint(&a, &a));
        assert!(!element_disjoint(&a, &TensorView { ptr: 0x1000 + 17, ..a }), "not a whole element apart");
        assert!(!element_disjoint(&a, &TensorView { strides: [8, 1], ..a }), "other strides");
    }

    #[test]
    fn split_rule() {
        let base = SplitInputs { batch: 1, heads_k: 8, rows: 4, capacity: 4096, block_m: 16, block_n: 64, multiprocessors: 132, requested: 0 };
        let with = |f: &dyn Fn(&mut SplitInputs)| {
            let mut s = base;
            f(&mut s);
            split_count(s)
        };
        // 8 programs on 132 SMs: 264 / 8 = 33, under min(128, 4096/256 = 16) → 16.
        assert_eq!(split_count(base), 16);
        assert_eq!(with(&|s| s.capacity = 100_000), 33);
        assert_eq!(with(&|s| (s.capacity, s.heads_k) = (1 << 20, 1)), 128, "capped at 128");
        assert_eq!(with(&|s| s.batch = 64), 1, "512 programs fill the device");
        assert_eq!(with(&|s| s.batch = 16), 2, "264 / 128: 256 programs, one wave");
        assert_eq!(with(&|s| s.batch = 8), 4, "264 / 64 = 4: 256 programs (5 would leave a wave of 56)");
        assert_eq!(with(&|s| s.batch = 33), 1, "264 programs already");
        assert_eq!(with(&|s| s.capacity = 200), 1, "a short cache: one split of ≥ 256 keys");
        assert_eq!(with(&|s| s.capacity = 257), 2);
        // GQA rows above BLOCK_M add programs along grid dim 2.
        assert_eq!(with(&|s| (s.rows, s.capacity) = (128, 1 << 20)), 4, "8 · cdiv(128, 16) = 64 programs: 264 / 64");
        assert_eq!(with(&|s| (s.rows, s.block_m, s.capacity) = (128, 64, 1 << 20)), 16, "8 · 2 = 16 programs: 264 / 16");
        // Forced: as asked, capped at the BLOCK_N chunks of the capacity.
        assert_eq!(with(&|s| s.requested = 1), 1);
        assert_eq!(with(&|s| s.requested = 7), 7);
        assert_eq!(with(&|s| (s.requested, s.capacity) = (100, 300)), 5, "cdiv(300, 64)");
        assert_eq!(with(&|s| (s.requested, s.capacity) = (128, 1)), 1);
        // Never 0, whatever the inputs.
        assert_eq!(with(&|s| (s.multiprocessors, s.capacity) = (0, 1)), 1);
    }

    #[test]
    fn tile_rule() {
        // (kernel, tile): row tiles 16 and 64 at BLOCK_N 64, each for big pages (SMALL_PAGE 0) and
        // pages of 16 and 32; a BLOCK_N 32 tile of 16 rows; a duplicate of kernel 0.
        let t = |block_m, block_n, small_page| DecodeTile { block_m, block_n, small_page };
        let compiled = [
            (0, t(16, 64, 0)),
            (1, t(64, 64, 0)),
            (2, t(16, 64, 16)),
            (3, t(64, 64, 16)),
            (4, t(16, 64, 32)),
            (5, t(64, 64, 32)),
            (6, t(16, 32, 0)),
            (7, t(16, 64, 0)),
        ];
        let pick = |rows, page| pick_tile(|| compiled.iter().copied(), rows, page);
        assert_eq!(pick(1, None), Some(0), "dense: the largest BLOCK_N, the lowest index among equals");
        assert_eq!(pick(16, None), Some(0));
        assert_eq!(pick(17, None), Some(1));
        assert_eq!(pick(128, None), Some(1), "above every tile: the largest");
        assert_eq!(pick(4, Some(256)), Some(0), "pages of 256: a BLOCK_N 64 block on one page");
        assert_eq!(pick(4, Some(64)), Some(0));
        assert_eq!(pick(4, Some(32)), Some(4), "pages of 32: the SMALL_PAGE 32 kernel, not BLOCK_N 32");
        assert_eq!(pick(40, Some(32)), Some(5));
        assert_eq!(pick(4, Some(16)), Some(2));
        assert_eq!(pick(128, Some(16)), Some(3));
        // Only kernels for other pages: none (check_serves refuses the call).
        let big_only = [(0, t(16, 64, 0)), (1, t(16, 64, 32))];
        assert_eq!(pick_tile(|| big_only.iter().copied(), 4, Some(16)), None);
        assert_eq!(pick_tile(|| big_only.iter().copied(), 4, Some(32)), Some(1));
        assert_eq!(pick_tile(std::iter::empty, 4, None), None);
        // What each tile serves.
        assert!(t(16, 64, 0).serves(None) && !t(16, 64, 16).serves(None));
        assert!(!t(16, 64, 0).serves(Some(32)) && t(16, 32, 0).serves(Some(32)) && !t(16, 64, 32).serves(Some(64)));
    }

    #[test]
    fn workspace_holds_the_partials() {
        let s = validate(&dense()).unwrap();
        assert_eq!(workspace_layout(&s, 1).unwrap(), WorkspaceLayout { splits: 1, lse_offset: 0, bytes: 0 });
        // 3 splits · B 2 · Hq 8 · Sq 4 = 192 rows: O_PART 192 · 64 · 4, LSE_PART 192 · 4.
        let l = workspace_layout(&s, 3).unwrap();
        assert_eq!((l.lse_offset, l.bytes), (192 * 64 * 4, 192 * 64 * 4 + 192 * 4));
        // O_PART is as wide as the bucket (HEAD_DIM), not D; LSE_PART rounded up to 16 bytes.
        let mut p = dense();
        p.q = TensorView::contiguous(1 << 32, [1, 1, 3, 72], DType::F16);
        p.o = TensorView::contiguous(5 << 32, [1, 1, 3, 72], DType::F16);
        p.k_cache = TensorView::contiguous(2 << 32, [1, 64, 1, 72], DType::F16);
        p.v_cache = TensorView::contiguous(3 << 32, [1, 64, 1, 72], DType::F16);
        p.cache_seqlens.sizes = [1];
        p.lse = None;
        let s = validate(&p).unwrap();
        let l = workspace_layout(&s, 5).unwrap();
        assert_eq!((l.lse_offset, l.bytes), (15 * 128 * 4, 15 * 128 * 4 + 64));
        let huge = DecodeShape { batch: u64::MAX / 2, ..s };
        assert_eq!(workspace_layout(&huge, 2).unwrap_err().kind(), ErrorKind::TooLarge);
    }

    #[test]
    fn the_workspace_is_checked_against_the_split_count() {
        let mut p = dense();
        let s = validate(&p).unwrap();
        let l = workspace_layout(&s, 4).unwrap();
        assert_eq!(check_workspace(&p, &s, &workspace_layout(&s, 1).unwrap()).unwrap(), (0, 0), "one split: none needed");
        assert_eq!(check_workspace(&p, &s, &l).unwrap_err().kind(), ErrorKind::InvalidArgument, "none given");
        p.workspace = Some(Workspace { ptr: 11 << 32, bytes: l.bytes - 1 });
        assert_eq!(check_workspace(&p, &s, &l).unwrap_err().kind(), ErrorKind::InvalidArgument, "a byte short");
        p.workspace = Some(Workspace { ptr: 11 << 32, bytes: l.bytes });
        assert_eq!(check_workspace(&p, &s, &l).unwrap(), (11 << 32, (11 << 32) + l.lse_offset));
        p.workspace = Some(Workspace { ptr: p.o.ptr, bytes: l.bytes });
        assert_eq!(check_workspace(&p, &s, &l).unwrap_err().kind(), ErrorKind::InvalidArgument, "over o");
        p.workspace = Some(Workspace { ptr: p.k_cache.ptr + 4096, bytes: l.bytes });
        assert_eq!(check_workspace(&p, &s, &l).unwrap_err().kind(), ErrorKind::InvalidArgument, "over k_cache");
    }

    /// The runtime arguments of each kernel in kernels/decode/ABI.md's order (its constexprs left out),
    /// with the ABI's types: `p` pointer, `f` fp32, `w` i64, `i` i32.
    const DECODE_ABI: &[(&str, char)] = &[
        ("Q", 'p'), ("K", 'p'), ("V", 'p'), ("O", 'p'), ("LSE", 'p'), ("O_PART", 'p'), ("LSE_PART", 'p'), ("PAGE_TABLE", 'p'),
        ("CACHE_SEQLENS", 'p'), ("KV_STATUS", 'p'), ("sm_scale", 'f'), ("stride_qz", 'w'), ("stride_qh", 'w'), ("stride_qm", 'i'),
        ("stride_kz", 'w'), ("stride_kh", 'w'), ("stride_kn", 'i'), ("stride_vz", 'w'), ("stride_vh", 'w'), ("stride_vn", 'i'),
        ("stride_oz", 'w'), ("stride_oh", 'w'), ("stride_om", 'i'), ("stride_lz", 'w'), ("stride_lh", 'w'), ("stride_ptz", 'w'),
        ("N_CTX_Q", 'i'), ("N_NEW", 'i'), ("D_HEAD", 'i'), ("GQA_GROUP", 'i'), ("N_HEADS_Q", 'i'), ("WINDOW_LEFT", 'i'),
        ("WINDOW_RIGHT", 'i'), ("CACHE_CAPACITY", 'i'), ("PAGE_SIZE_LOG2", 'i'), ("N_PAGES", 'i'), ("N_SPLITS", 'i'),
        ("STORE_LSE", 'i'), ("STORE_KV_STATUS", 'i'),
    ];
    const COMBINE_ABI: &[(&str, char)] = &[
        ("O_PART", 'p'), ("LSE_PART", 'p'), ("O", 'p'), ("LSE", 'p'), ("stride_oz", 'w'), ("stride_oh", 'w'), ("stride_om", 'i'),
        ("stride_lz", 'w'), ("stride_lh", 'w'), ("N_BATCH", 'i'), ("N_HEADS_Q", 'i'), ("N_CTX_Q", 'i'), ("D_HEAD", 'i'),
        ("N_SPLITS", 'i'), ("STORE_LSE", 'i'),
    ];
    const APPEND_ABI: &[(&str, char)] = &[
        ("K_NEW", 'p'), ("V_NEW", 'p'), ("K", 'p'), ("V", 'p'), ("PAGE_TABLE", 'p'), ("CACHE_SEQLENS", 'p'), ("KV_STATUS", 'p'),
        ("stride_xkz", 'w'), ("stride_xkh", 'w'), ("stride_xkm", 'i'), ("stride_xvz", 'w'), ("stride_xvh", 'w'), ("stride_xvm", 'i'),
        ("stride_kz", 'w'), ("stride_kh", 'w'), ("stride_kn", 'i'), ("stride_vz", 'w'), ("stride_vh", 'w'), ("stride_vn", 'i'),
        ("stride_ptz", 'w'), ("N_NEW", 'i'), ("D_HEAD", 'i'), ("CACHE_CAPACITY", 'i'), ("PAGE_SIZE_LOG2", 'i'), ("N_PAGES", 'i'),
        ("STORE_KV_STATUS", 'i'),
    ];

    fn assert_abi(kernel: &str, args: &ArgList, abi: &[(&str, char)]) {
        let list = args.args().unwrap();
        for (i, (name, _)) in list.iter().enumerate() {
            assert!(list[i + 1..].iter().all(|(n, _)| n != name), "{kernel}: '{name}' given twice");
        }
        for &(name, ty) in abi {
            let value = arg_of(args, name).unwrap_or_else(|| panic!("{kernel}: no '{name}'"));
            let fits = match value {
                ArgValue::Ptr(_) => ty == 'p',
                ArgValue::F32(_) => ty == 'f',
                ArgValue::I64(_) => ty == 'w',
                ArgValue::I32(_) => ty == 'i' || ty == 'w', // widened where the kernel takes i64
                _ => false,
            };
            assert!(fits, "{kernel}: '{name}' is {value:?}, the ABI says {ty}");
        }
    }

    #[test]
    fn arguments_by_name_follow_the_abi() {
        use ArgValue::{F32, I32, I64, Ptr};
        // Paged, appending, causal, no status word, 3 splits.
        let mut p = paged();
        p.status = 0;
        p.mask = Mask::causal(MaskAlign::BottomRight);
        // Token-major q with a padded head pitch: (z, h, m) = (strides[0], strides[2], strides[1]).
        p.q = TensorView::new(1 << 32, [B, SQ, HQ, D], [(SQ * HQ * 72) as i64, (HQ * 72) as i64, 72, 1], DType::F16);
        let s = validate(&p).unwrap();
        let d = decode_args(&p, &s, 3, 0x5000_0000, 0x5010_0000).unwrap();
        assert_abi("attn_decode", &d, DECODE_ABI);
        let expect = [
            ("Q", Ptr(1 << 32)),
            ("K", Ptr(2 << 32)),
            ("V", Ptr(3 << 32)),
            ("O", Ptr(5 << 32)),
            ("LSE", Ptr(6 << 32)),
            ("O_PART", Ptr(0x5000_0000)),
            ("LSE_PART", Ptr(0x5010_0000)),
            ("PAGE_TABLE", Ptr(8 << 32)),
            ("CACHE_SEQLENS", Ptr(4 << 32)),
            ("KV_STATUS", Ptr(0)),
            ("STORE_KV_STATUS", I32(0)),
            ("sm_scale", F32(0.125)),
            ("stride_qz", I64((SQ * HQ * 72) as i64)),
            ("stride_qh", I64(72)),
            ("stride_qm", I32((HQ * 72) as i32)),
            ("stride_kz", I64((PAGE * HK * D) as i64)),
            ("stride_kh", I64(D as i64)),
            ("stride_kn", I32((HK * D) as i32)),
            ("stride_vn", I32((HK * D) as i32)),
            ("stride_oh", I64(D as i64)),
            ("stride_om", I32((HQ * D) as i32)),
            ("stride_lz", I64((HQ * SQ) as i64)),
            ("stride_lh", I64(SQ as i64)),
            ("stride_ptz", I64(MAX_PAGES as i64)),
            ("N_CTX_Q", I32(SQ as i32)),
            ("N_NEW", I32(N_NEW as i32)),
            ("D_HEAD", I32(D as i32)),
            ("GQA_GROUP", I32(4)),
            ("N_HEADS_Q", I32(HQ as i32)),
            ("WINDOW_LEFT", I32(-1)),
            ("WINDOW_RIGHT", I32(0)),
            ("CACHE_CAPACITY", I32((MAX_PAGES * PAGE) as i32)),
            ("PAGE_SIZE_LOG2", I32(5)),
            ("N_PAGES", I32(N_PAGES as i32)),
            ("N_SPLITS", I32(3)),
            ("STORE_LSE", I32(1)),
        ];
        for (name, value) in expect {
            assert_eq!(arg_of(&d, name), Some(value), "attn_decode {name}");
        }

        let c = combine_args(&p, &s, 3, 0x5000_0000, 0x5010_0000).unwrap();
        assert_abi("attn_decode_combine", &c, COMBINE_ABI);
        for (name, value) in [("N_BATCH", I32(B as i32)), ("N_SPLITS", I32(3)), ("O_PART", Ptr(0x5000_0000)), ("stride_om", I32((HQ * D) as i32))] {
            assert_eq!(arg_of(&c, name), Some(value), "attn_decode_combine {name}");
        }

        let a = append_args(&p, &s).unwrap();
        assert_abi("kvcache_append", &a, APPEND_ABI);
        for (name, value) in [
            ("K_NEW", Ptr(9 << 32)),
            ("V_NEW", Ptr(10 << 32)),
            ("stride_xkz", I64((N_NEW * HK * D) as i64)),
            ("stride_xkh", I64(D as i64)),
            ("stride_xkm", I32((HK * D) as i32)),
            ("N_HEADS_K", I32(HK as i32)),
        ] {
            assert_eq!(arg_of(&a, name), Some(value), "kvcache_append {name}");
        }

        // Dense, one split, no LSE, a status word, a sliding window.
        let mut p = dense();
        p.lse = None;
        p.mask = Mask::window(100, 0, MaskAlign::BottomRight);
        let s = validate(&p).unwrap();
        let d = decode_args(&p, &s, 1, 0, 0).unwrap();
        assert_abi("attn_decode", &d, DECODE_ABI);
        for (name, value) in [
            ("LSE", Ptr(0)),
            ("STORE_LSE", I32(0)),
            ("O_PART", Ptr(0)),
            ("PAGE_TABLE", Ptr(0)),
            ("stride_ptz", I64(0)),
            ("PAGE_SIZE_LOG2", I32(0)),
            ("CACHE_CAPACITY", I32(S_CACHE as i32)),
            ("N_PAGES", I32(B as i32)),
            ("N_NEW", I32(0)),
            ("stride_kz", I64((S_CACHE * HK * D) as i64)),
            ("KV_STATUS", Ptr(7 << 32)),
            ("STORE_KV_STATUS", I32(1)),
            ("WINDOW_LEFT", I32(100)),
            ("WINDOW_RIGHT", I32(0)),
            ("N_SPLITS", I32(1)),
        ] {
            assert_eq!(arg_of(&d, name), Some(value), "dense attn_decode {name}");
        }
    }

    #[test]
    fn axes_name_the_functionals() {
        let s = validate(&paged()).unwrap();
        let axes = |family| family_axes(family, DType::BF16, &s).as_slice().unwrap().to_vec();
        assert_eq!(axes(DECODE_FAMILY), [("dtype", "bf16"), ("head_dim", "64"), ("paged", "true")]);
        assert_eq!(axes(APPEND_FAMILY), [("dtype", "bf16"), ("head_dim", "64"), ("paged", "true")]);
        assert_eq!(axes(COMBINE_FAMILY), [("dtype", "bf16"), ("head_dim", "64")]);
        let s = validate(&dense()).unwrap();
        assert_eq!(family_axes(DECODE_FAMILY, DType::F16, &s).as_slice().unwrap()[2], ("paged", "false"));
    }

    #[test]
    fn refusals_come_before_the_driver() {
        // No GPU is needed to be told an argument is wrong (and nothing is launched).
        let mut p = dense();
        p.num_splits = 1000;
        for e in [
            attn_fwd_kvcache(&p, Stream::null()).unwrap_err(),
            attn_fwd_kvcache_workspace_bytes(&p, Stream::null()).unwrap_err(),
            attn_fwd_kvcache_num_splits(&p, Stream::null()).unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        }
    }
}
