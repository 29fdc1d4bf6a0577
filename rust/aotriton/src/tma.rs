//! Host-side TMA descriptors for the Gluon kernels, the pure part: which tensors TMA can address,
//! and the `cuTensorMapEncodeTiled` parameters for a tensor plus a kernel's descriptor metadata
//! (python/kernels/flash_gluon/ABI.md, "Tensor descriptors"). The driver call itself is
//! `driver::cuda::encode_tensor_map`; nothing here needs a GPU.
use std::fmt;

use crate::archive::TensorDescMeta;
use crate::tensor::{DType, TensorView};

/// Most dimensions of a descriptor (the TMA limit).
pub(crate) const MAX_RANK: usize = crate::archive::MAX_TENSORDESC_RANK;

/// TMA strides (bytes) must stay below 2^40, sizes below 2^32.
const MAX_STRIDE_BYTES: u64 = 1 << 40;
const MAX_SIZE: u64 = 1 << 32;

/// Ragged descriptors (python/kernels/flash_gluon/ragged.py): the size of the row dimension,
/// the most tokens a packed tensor may have.
pub(crate) const RAGGED_ROWS: u64 = 1 << 30;
/// Ragged descriptors: the size of the two leading, address-only dimensions.
const RAGGED_SPAN: u64 = 0x7fff_0000;
/// Ragged descriptors: the first dimension's stride is this minus the row stride (elements), so
/// that `RAGGED_ROWS` of its steps are 2^64 elements: nothing, modulo the address width.
const RAGGED_WRAP: i64 = 1 << 34;

/// A strided tensor given to a descriptor argument: sizes and strides in elements, outermost
/// first, `rank` of them used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TensorArg {
    pub ptr: u64,
    pub dtype: DType,
    pub rank: usize,
    pub sizes: [u64; MAX_RANK],
    pub strides: [i64; MAX_RANK],
}

impl TensorArg {
    pub fn from_view<const R: usize>(t: &TensorView<R>) -> TensorArg {
        const { assert!(R >= 1 && R <= MAX_RANK) };
        let mut sizes = [1; MAX_RANK];
        let mut strides = [0; MAX_RANK];
        sizes[..R].copy_from_slice(&t.sizes);
        strides[..R].copy_from_slice(&t.strides);
        TensorArg { ptr: t.ptr, dtype: t.dtype, rank: R, sizes, strides }
    }

    /// The ragged descriptor of a packed `[1, H, tokens, D]` view (ragged.py): rank 5, sizes
    /// `[RAGGED_SPAN, RAGGED_SPAN, H, RAGGED_ROWS, D]`, strides `[2^34 − rs, rs, hs, rs, 1]`. The
    /// kernel addresses row `r` of the sequence `[start, start + len)` as
    /// `[RAGGED_ROWS, start + len, h, RAGGED_ROWS − len + r, 0]`: row `start + r`, in bounds while
    /// `r < len`. The tensor's own checks (`check`) still apply to the result.
    pub fn ragged(t: &TensorView<4>) -> Result<TensorArg, TmaProblem> {
        let [_, heads, tokens, dim] = t.sizes;
        if tokens > RAGGED_ROWS {
            return Err(TmaProblem::TooManyTokens { tokens });
        }
        let [_, head_stride, row_stride, last] = t.strides;
        Ok(TensorArg {
            ptr: t.ptr,
            dtype: t.dtype,
            rank: 5,
            sizes: [RAGGED_SPAN, RAGGED_SPAN, heads, RAGGED_ROWS, dim],
            strides: [RAGGED_WRAP - row_stride, row_stride, head_stride, row_stride, last],
        })
    }

    /// A dense row-major `rows × cols` matrix.
    pub fn matrix(ptr: u64, rows: u64, cols: u64, dtype: DType) -> TensorArg {
        TensorArg::from_view(&TensorView::contiguous(ptr, [rows, cols], dtype))
    }

    pub fn sizes(&self) -> &[u64] {
        &self.sizes[..self.rank]
    }
}

/// Why TMA cannot address a tensor (the caller adds the tensor's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TmaProblem {
    /// The base address is not 16-byte aligned.
    BaseMisaligned { ptr: u64 },
    /// The innermost stride is not 1.
    LastStride { stride: i64 },
    /// A stride (in bytes) is not a positive multiple of 16.
    StrideNotMultiple16 { dim: usize, bytes: i128 },
    StrideTooLarge { dim: usize, bytes: i128 },
    SizeTooLarge { dim: usize, size: u64 },
    /// A packed tensor has more rows than a ragged descriptor addresses (`RAGGED_ROWS`).
    TooManyTokens { tokens: u64 },
    /// The kernel's descriptor has another rank or element size than the tensor.
    RankMismatch { tensor: usize, descriptor: usize },
    ElemSizeMismatch { tensor: u64, descriptor: u32 },
}

impl fmt::Display for TmaProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TmaProblem::BaseMisaligned { ptr } => write!(f, "address {ptr:#x} is not 16-byte aligned (TMA)"),
            TmaProblem::LastStride { stride } => write!(f, "the innermost stride is {stride}, TMA needs 1"),
            TmaProblem::StrideNotMultiple16 { dim, bytes } => {
                write!(f, "strides[{dim}] is {bytes} bytes, TMA needs a positive multiple of 16")
            }
            TmaProblem::StrideTooLarge { dim, bytes } => write!(f, "strides[{dim}] is {bytes} bytes, TMA allows < 2^40"),
            TmaProblem::SizeTooLarge { dim, size } => write!(f, "sizes[{dim}] is {size}, TMA allows < 2^32"),
            TmaProblem::TooManyTokens { tokens } => {
                write!(f, "{tokens} packed rows, a ragged TMA descriptor addresses at most 2^30")
            }
            TmaProblem::RankMismatch { tensor, descriptor } => {
                write!(f, "the tensor has rank {tensor} but the kernel's descriptor rank {descriptor}")
            }
            TmaProblem::ElemSizeMismatch { tensor, descriptor } => {
                write!(f, "the tensor has {tensor}-byte elements but the kernel's descriptor {descriptor}-byte ones")
            }
        }
    }
}

/// Element strides TMA is given: the tensor's, except that a dimension of size 1 (never
/// stepped) gets a valid one, the dense stride rounded up to 16 bytes.
fn effective_strides(t: &TensorArg) -> [i64; MAX_RANK] {
    let mut eff = t.strides;
    if t.rank == 0 {
        return eff;
    }
    let elem = t.dtype.size_bytes() as i128;
    eff[t.rank - 1] = 1;
    for d in (0..t.rank.saturating_sub(1)).rev() {
        if t.sizes[d] == 1 {
            let dense = (eff[d + 1] as i128 * t.sizes[d + 1] as i128 * elem).max(16);
            let rounded = (dense + 15) / 16 * 16;
            let bytes = if rounded < MAX_STRIDE_BYTES as i128 { rounded } else { 16 };
            eff[d] = (bytes / elem) as i64;
        }
    }
    eff
}

/// Whether TMA can address `t`: base 16-byte aligned, innermost stride 1, every other stride a
/// positive multiple of 16 bytes below 2^40, sizes below 2^32 (dimensions of size 1 may have any
/// stride: a valid one is substituted).
pub(crate) fn check(t: &TensorArg) -> Result<(), TmaProblem> {
    if !t.ptr.is_multiple_of(16) {
        return Err(TmaProblem::BaseMisaligned { ptr: t.ptr });
    }
    if let Some(dim) = t.sizes().iter().position(|&s| s >= MAX_SIZE) {
        return Err(TmaProblem::SizeTooLarge { dim, size: t.sizes[dim] });
    }
    let last = t.rank - 1;
    if t.sizes[last] != 1 && t.strides[last] != 1 {
        return Err(TmaProblem::LastStride { stride: t.strides[last] });
    }
    let eff = effective_strides(t);
    let elem = t.dtype.size_bytes() as i128;
    for (dim, &stride) in eff.iter().enumerate().take(last) {
        let bytes = stride as i128 * elem;
        if bytes <= 0 || bytes % 16 != 0 {
            return Err(TmaProblem::StrideNotMultiple16 { dim, bytes });
        }
        if bytes >= MAX_STRIDE_BYTES as i128 {
            return Err(TmaProblem::StrideTooLarge { dim, bytes });
        }
    }
    Ok(())
}

/// Triton's device TMA data-type enum → the host `CUtensorMapDataType` (Triton's
/// `TMA_DTYPE_DEVICE_TO_HOST`): 8 → 10, 9 → 8, 10 → 9, others unchanged.
pub(crate) fn host_data_type(device: u32) -> u32 {
    match device {
        8 => 10,
        9 => 8,
        10 => 9,
        other => other,
    }
}

/// Everything `cuTensorMapEncodeTiled` takes (dimensions innermost first, as the driver wants
/// them), plus the kernel parameters that follow the map (outermost first, as the kernel
/// declares them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TmaEncode {
    /// Host `CUtensorMapDataType`.
    pub data_type: u32,
    pub rank: u32,
    pub address: u64,
    pub global_dim: [u64; MAX_RANK],
    /// Byte strides of dimensions 1..rank (innermost first); rank − 1 of them used.
    pub global_strides: [u64; MAX_RANK - 1],
    pub box_dim: [u32; MAX_RANK],
    pub element_strides: [u32; MAX_RANK],
    /// `CUtensorMapSwizzle` (0..3).
    pub swizzle: u32,
    /// Kernel parameters after the map: rank × u32 sizes, then rank × u64 element strides.
    pub shape: [u32; MAX_RANK],
    pub strides: [u64; MAX_RANK],
}

/// The encode parameters for tensor `t` given to a descriptor argument with metadata `meta`:
/// rank r, dims and byte strides reversed, box = reversed `block_size`, element strides 1;
/// interleave none, L2 promotion 128 B and OOB fill none are fixed by the encoder.
pub(crate) fn encode_params(t: &TensorArg, meta: &TensorDescMeta) -> Result<TmaEncode, TmaProblem> {
    let rank = t.rank;
    if meta.rank() != rank {
        return Err(TmaProblem::RankMismatch { tensor: rank, descriptor: meta.rank() });
    }
    if t.dtype.size_bytes() != meta.elem_size as u64 {
        return Err(TmaProblem::ElemSizeMismatch { tensor: t.dtype.size_bytes(), descriptor: meta.elem_size });
    }
    check(t)?;
    let eff = effective_strides(t);
    let elem = t.dtype.size_bytes();
    let mut e = TmaEncode {
        data_type: host_data_type(meta.elem_type),
        rank: rank as u32,
        address: t.ptr,
        global_dim: [1; MAX_RANK],
        global_strides: [0; MAX_RANK - 1],
        box_dim: [1; MAX_RANK],
        element_strides: [1; MAX_RANK],
        swizzle: meta.swizzle,
        shape: [1; MAX_RANK],
        strides: [0; MAX_RANK],
    };
    for i in 0..rank {
        let d = rank - 1 - i; // i counts from the innermost dimension
        e.global_dim[i] = t.sizes[d];
        e.box_dim[i] = meta.block_size[d];
        if i > 0 {
            e.global_strides[i - 1] = eff[d] as u64 * elem;
        }
        e.shape[d] = t.sizes[d] as u32;
        e.strides[d] = eff[d] as u64;
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(block_size: &[u32], elem_type: u32, elem_size: u32) -> TensorDescMeta {
        TensorDescMeta { block_size: block_size.to_vec(), swizzle: 3, elem_type, elem_size, fp4_padded: false }
    }

    #[test]
    fn a_bhsd_tensor_encodes_reversed() {
        // [B=2, H=4, S=100, D=40] bf16, head dim padded to the 64 bucket by the box.
        let t = TensorArg::from_view(&TensorView::contiguous(0x10000, [2, 4, 100, 40], DType::BF16));
        let e = encode_params(&t, &meta(&[1, 1, 64, 64], 10, 2)).unwrap();
        assert_eq!(e.data_type, 9, "bf16: device 10 → host 9");
        assert_eq!(e.rank, 4);
        assert_eq!(e.address, 0x10000);
        assert_eq!(&e.global_dim[..4], &[40, 100, 4, 2]);
        assert_eq!(&e.global_strides[..3], &[80, 8000, 32000]);
        assert_eq!(&e.box_dim[..4], &[64, 64, 1, 1]);
        assert_eq!(&e.element_strides[..4], &[1, 1, 1, 1]);
        assert_eq!(e.swizzle, 3);
        assert_eq!(&e.shape[..4], &[2, 4, 100, 40]);
        assert_eq!(&e.strides[..4], &[16000, 4000, 40, 1]);
    }

    #[test]
    fn a_bshd_view_keeps_its_strides() {
        // B×S×H×D memory viewed as B×H×S×D.
        let (b, s, h, d) = (2u64, 300u64, 8u64, 128u64);
        let v = TensorView::new(0x20000, [b, h, s, d], [(s * h * d) as i64, d as i64, (h * d) as i64, 1], DType::F16);
        let e = encode_params(&TensorArg::from_view(&v), &meta(&[1, 1, 128, 64], 6, 2)).unwrap();
        assert_eq!(e.data_type, 6);
        assert_eq!(&e.global_dim[..4], &[d, s, h, b]);
        assert_eq!(&e.global_strides[..3], &[h * d * 2, d * 2, s * h * d * 2]);
        assert_eq!(&e.box_dim[..4], &[64, 128, 1, 1]);
    }

    #[test]
    fn size_one_dims_get_a_valid_stride() {
        // Batch 1 with a zero batch stride (a packed-style view) and a head dim of 8.
        let v = TensorView::new(0x30000, [1, 2, 5, 8], [0, 40, 8, 1], DType::BF16);
        let t = TensorArg::from_view(&v);
        check(&t).unwrap();
        let e = encode_params(&t, &meta(&[1, 1, 64, 64], 10, 2)).unwrap();
        assert_eq!(&e.global_strides[..3], &[16, 80, 160], "batch stride: 2 × 40 elements × 2 bytes");
        assert_eq!(e.strides[0], 80);
        // A size-1 head dim between others: its stride does not matter either.
        let v = TensorView::new(0x30000, [3, 1, 5, 64], [320, 7, 64, 1], DType::F16);
        assert_eq!(check(&TensorArg::from_view(&v)), Ok(()));
    }

    #[test]
    fn rank_2_fp32_workspace_views() {
        let t = TensorArg::matrix(0x40000, 2 * 4 * 128, 128, DType::F32);
        let e = encode_params(&t, &meta(&[64, 128], 7, 4)).unwrap();
        assert_eq!((e.data_type, e.rank), (7, 2));
        assert_eq!(&e.global_dim[..2], &[128, 1024]);
        assert_eq!(e.global_strides[0], 512);
        assert_eq!(&e.box_dim[..2], &[128, 64]);
        assert_eq!(&e.shape[..2], &[1024, 128]);
        assert_eq!(&e.strides[..2], &[128, 1]);
    }

    #[test]
    fn the_tma_rules() {
        let ok = || TensorView::contiguous(0x10000, [2, 4, 64, 64], DType::F16);
        let problem = |v: TensorView<4>| check(&TensorArg::from_view(&v)).unwrap_err();
        assert!(check(&TensorArg::from_view(&ok())).is_ok());
        let mut v = ok();
        v.ptr += 8;
        assert_eq!(problem(v), TmaProblem::BaseMisaligned { ptr: 0x10008 });
        // Head dim 36: a row of 72 bytes is not a multiple of 16.
        let v = TensorView::contiguous(0x10000, [2, 4, 64, 36], DType::F16);
        assert_eq!(problem(v), TmaProblem::StrideNotMultiple16 { dim: 2, bytes: 72 });
        let mut v = ok();
        v.strides[3] = 2;
        assert_eq!(problem(v), TmaProblem::LastStride { stride: 2 });
        let mut v = ok();
        v.strides[1] = 0;
        assert_eq!(problem(v), TmaProblem::StrideNotMultiple16 { dim: 1, bytes: 0 }, "broadcast heads");
        let mut v = ok();
        v.strides[0] = 1 << 40;
        assert_eq!(problem(v), TmaProblem::StrideTooLarge { dim: 0, bytes: 1 << 41 });
        let mut v = ok();
        v.sizes[2] = 1 << 32;
        assert_eq!(problem(v), TmaProblem::SizeTooLarge { dim: 2, size: 1 << 32 });
        let t = TensorArg::from_view(&ok());
        assert_eq!(encode_params(&t, &meta(&[64, 64], 6, 2)), Err(TmaProblem::RankMismatch { tensor: 4, descriptor: 2 }));
        assert_eq!(
            encode_params(&t, &meta(&[1, 1, 64, 64], 7, 4)),
            Err(TmaProblem::ElemSizeMismatch { tensor: 2, descriptor: 4 })
        );
        assert!(TmaProblem::StrideNotMultiple16 { dim: 2, bytes: 72 }.to_string().contains("72 bytes"));
    }

    #[test]
    fn a_ragged_descriptor_wraps_to_the_sequence_row() {
        // Packed [1, H=4, T=1000, D=72] bf16 (row stride H·D = 288 elements).
        let v = TensorView::new(0x50000, [1, 4, 1000, 72], [0, 72, 288, 1], DType::BF16);
        let t = TensorArg::ragged(&v).unwrap();
        assert_eq!((t.rank, t.sizes()), (5, &[RAGGED_SPAN, RAGGED_SPAN, 4, RAGGED_ROWS, 72][..]));
        assert_eq!(t.strides, [(1 << 34) - 288, 288, 72, 288, 1]);
        check(&t).unwrap();
        // Row r of the sequence [start, start + len) at [ROWS, start + len, h, ROWS - len + r, 0]
        // lands on row start + r (addresses modulo 2^64), as ragged.py says.
        let (start, len, r, h) = (700u64, 250u64, 17u64, 3u64);
        let coords = [RAGGED_ROWS, start + len, h, RAGGED_ROWS - len + r, 0];
        let elems = coords.iter().zip(t.strides).fold(0u64, |acc, (&c, s)| acc.wrapping_add(c.wrapping_mul(s as u64)));
        let bytes = elems.wrapping_mul(2);
        assert_eq!(bytes, ((start + r) * 288 + h * 72) * 2);
        let e = encode_params(&t, &meta(&[1, 1, 1, 64, 64], 10, 2)).unwrap();
        assert_eq!(e.rank, 5);
        assert_eq!(&e.global_dim[..5], &[72, RAGGED_ROWS, 4, RAGGED_SPAN, RAGGED_SPAN]);
        assert_eq!(&e.global_strides[..4], &[576, 144, 576, ((1u64 << 34) - 288) * 2]);
        assert_eq!(&e.box_dim[..5], &[64, 64, 1, 1, 1]);
        let too_many = TensorView::new(0x50000, [1, 1, RAGGED_ROWS + 1, 64], [0, 64, 64, 1], DType::BF16);
        assert_eq!(TensorArg::ragged(&too_many), Err(TmaProblem::TooManyTokens { tokens: RAGGED_ROWS + 1 }));
    }

    #[test]
    fn device_to_host_data_types() {
        assert_eq!([6, 7, 8, 9, 10, 0].map(host_data_type), [6, 7, 10, 8, 9, 0]);
    }
}
