//! Views of caller-owned device memory. The runtime never allocates or frees tensors.
use crate::error::{Result, bail};

/// Element type of a tensor. The discriminants are the C API's `aotriton::DType` values, which
/// follow ROCm/aotriton's numbering (`include/aotriton/dtypes.h`).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE single precision.
    F32 = 1,
    /// IEEE half precision.
    F16 = 2,
    /// bfloat16.
    BF16 = 3,
    /// 32-bit signed integers (sequence offsets such as `cu_seqlens`).
    I32 = 12,
    /// 8-bit float e4m3 (`float8_e4m3fn`: 4 exponent bits, 3 mantissa bits, no infinities; the
    /// fp8 forward's inputs). Not in the seed's numbering, which has no fp8.
    F8E4M3 = 30,
}

impl DType {
    /// Bytes per element.
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F8E4M3 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
        }
    }
    /// The name kernels, rules and archives use for this dtype (`fp16`, `bf16`, `fp32`).
    pub fn triton_name(self) -> &'static str {
        match self {
            DType::F16 => "fp16",
            DType::BF16 => "bf16",
            DType::F32 => "fp32",
            DType::I32 => "i32",
            DType::F8E4M3 => "fp8e4nv",
        }
    }
    /// The dtype of a C API `aotriton::DType` value (1 F32, 2 F16, 3 BF16, 12 I32, 30 F8E4M3),
    /// `None` for every other value (including types the C header names but no operator takes).
    pub fn from_raw(raw: i32) -> Option<DType> {
        [DType::F32, DType::F16, DType::BF16, DType::I32, DType::F8E4M3].into_iter().find(|d| *d as i32 == raw)
    }
}

/// A strided view of device memory: `sizes` and `strides` are in elements, outermost first.
/// A view with a null pointer means "absent" where an operator documents the tensor as optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorView<const RANK: usize> {
    /// Device address of element [0, 0, ...].
    pub ptr: u64,
    /// Elements per dimension, outermost first.
    pub sizes: [u64; RANK],
    /// Elements between neighbours in each dimension, outermost first.
    pub strides: [i64; RANK],
    /// Element type.
    pub dtype: DType,
}

impl<const RANK: usize> TensorView<RANK> {
    /// A view of `ptr` with the given sizes and strides (in elements).
    pub fn new(ptr: u64, sizes: [u64; RANK], strides: [i64; RANK], dtype: DType) -> Self {
        TensorView { ptr, sizes, strides, dtype }
    }

    /// A densely packed row-major view.
    pub fn contiguous(ptr: u64, sizes: [u64; RANK], dtype: DType) -> Self {
        let mut strides = [0i64; RANK];
        let mut step = 1i64;
        for d in (0..RANK).rev() {
            strides[d] = step;
            // Saturates (sizes above i64::MAX too), as the C++ TensorView::contiguous does.
            step = step.saturating_mul(i64::try_from(sizes[d]).unwrap_or(i64::MAX));
        }
        TensorView { ptr, sizes, strides, dtype }
    }

    /// Whether the view is absent (null pointer).
    pub fn is_null(&self) -> bool {
        self.ptr == 0
    }

    /// Checks what every tensor argument needs: a non-null pointer aligned to its element,
    /// non-negative strides and a unit last stride. `name` is how messages refer to it ("q").
    pub(crate) fn check_layout(&self, name: &str) -> Result<()> {
        if self.ptr == 0 {
            bail!(NullPointer, "{name}: data pointer is null");
        }
        if !self.ptr.is_multiple_of(self.dtype.size_bytes()) {
            bail!(
                MisalignedPointer,
                "{name}: pointer {:#x} is not aligned to its {}-byte {} elements",
                self.ptr,
                self.dtype.size_bytes(),
                self.dtype.triton_name()
            );
        }
        if let Some(d) = self.strides.iter().position(|&s| s < 0) {
            bail!(BadStrides, "{name}: strides[{d}]={} is negative", self.strides[d]);
        }
        if RANK > 0 && self.strides[RANK - 1] != 1 && self.sizes[RANK - 1] > 1 {
            bail!(
                BadStrides,
                "{name}: the last stride must be 1 (got {}); make the innermost dimension contiguous",
                self.strides[RANK - 1]
            );
        }
        Ok(())
    }

    /// The bytes `[start, end)` the view addresses (empty when a size is 0), or `TooLarge` when
    /// the last element's address does not fit 64 bits (a device address that would wrap).
    pub(crate) fn byte_range(&self, name: &str) -> Result<(u64, u64)> {
        if self.sizes.contains(&0) {
            return Ok((self.ptr, self.ptr));
        }
        if let Some(d) = self.strides.iter().position(|&s| s < 0) {
            bail!(BadStrides, "{name}: strides[{d}]={} is negative", self.strides[d]);
        }
        // In i128 with checks: one (size − 1) · stride fits, a sum of several may not.
        let end = (0..RANK)
            .try_fold(0i128, |last, d| last.checked_add((self.sizes[d] as i128 - 1).checked_mul(self.strides[d] as i128)?))
            .and_then(|last| last.checked_add(1)?.checked_mul(self.dtype.size_bytes() as i128))
            .and_then(|bytes| bytes.checked_add(self.ptr as i128))
            .filter(|&end| end <= u64::MAX as i128);
        match end {
            Some(end) => Ok((self.ptr, end as u64)),
            None => bail!(
                TooLarge,
                "{name}: sizes {:?} × strides {:?} from address {:#x} run past the end of the address space",
                self.sizes,
                self.strides,
                self.ptr
            ),
        }
    }

    /// Checks that no two elements of the view share an address (an output written by several
    /// programs at once would race): with the dims of size > 1 sorted by stride, each stride
    /// must step past everything the smaller dims span. Zero strides on such dims fail.
    pub(crate) fn check_no_self_overlap(&self, name: &str) -> Result<()> {
        let mut dims: [(i128, i128); RANK] = [(0, 0); RANK];
        let mut n = 0;
        for d in 0..RANK {
            if self.sizes[d] > 1 {
                dims[n] = (self.strides[d] as i128, self.sizes[d] as i128);
                n += 1;
            }
        }
        dims[..n].sort_unstable();
        let mut span = 0i128; // elements the smaller dims reach past their first one
        for &(stride, size) in &dims[..n] {
            if stride <= span {
                bail!(BadStrides, "{name}: strides {:?} with sizes {:?} make elements overlap (an output needs distinct addresses)", self.strides, self.sizes);
            }
            // A span past i128 cannot be addressed anyway (byte_range refuses it too).
            span = match (size - 1).checked_mul(stride).and_then(|step| span.checked_add(step)) {
                Some(span) => span,
                None => bail!(TooLarge, "{name}: sizes {:?} × strides {:?} overflow", self.sizes, self.strides),
            };
        }
        Ok(())
    }
}

/// The memory one argument of a call covers, for the aliasing check.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region<'a> {
    pub name: &'a str,
    pub bytes: (u64, u64),
}

impl<'a> Region<'a> {
    /// An output tensor: its elements must also have distinct addresses.
    pub fn output<const R: usize>(name: &'a str, t: &TensorView<R>) -> Result<Region<'a>> {
        t.check_no_self_overlap(name)?;
        Region::input(name, t)
    }

    /// An input tensor (it may repeat elements, e.g. a broadcast bias with a zero stride).
    pub fn input<const R: usize>(name: &'a str, t: &TensorView<R>) -> Result<Region<'a>> {
        Ok(Region { name, bytes: t.byte_range(name)? })
    }

    /// Nothing (an absent optional argument): overlaps no other region.
    pub const NONE: Region<'static> = Region { name: "", bytes: (0, 0) };

    /// `bytes` bytes at device address `ptr` (a u64 of the dropout state, a workspace).
    pub fn raw(name: &'a str, ptr: u64, bytes: u64) -> Result<Region<'a>> {
        // Named without formatting: the launch path allocates nothing.
        let end = crate::error::checked_sum(name, ptr, bytes)?;
        Ok(Region { name, bytes: (ptr, end) })
    }

    fn overlaps(&self, other: &Region) -> bool {
        // Empty regions (absent arguments, zero sizes) overlap nothing.
        self.bytes.0 < other.bytes.1 && other.bytes.0 < self.bytes.1
    }
}

/// Checks that no output overlaps another output or any input (inputs may share memory, e.g.
/// q, k and v as views of one packed tensor). Absent arguments are `Region::NONE`.
pub(crate) fn check_no_aliasing(outputs: &[Region], inputs: &[Region]) -> Result<()> {
    for (i, out) in outputs.iter().enumerate() {
        for other in outputs[i + 1..].iter().chain(inputs) {
            if out.overlaps(other) {
                bail!(
                    InvalidArgument,
                    "{} [{:#x}, {:#x}) overlaps {} [{:#x}, {:#x}): outputs must not share memory with inputs or other outputs",
                    out.name,
                    out.bytes.0,
                    out.bytes.1,
                    other.name,
                    other.bytes.0,
                    other.bytes.1
                );
            }
        }
    }
    Ok(())
}
