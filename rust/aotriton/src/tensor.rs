//! Views of caller-owned device memory. The runtime never allocates or frees tensors.
use crate::error::{Result, bail};

/// Element type of a tensor.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F16 = 1,
    BF16 = 2,
    F32 = 3,
    /// 32-bit signed integers (sequence offsets such as `cu_seqlens`).
    I32 = 4,
}

impl DType {
    pub fn size_bytes(self) -> u64 {
        match self {
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
        }
    }
    pub fn from_raw(raw: i32) -> Option<DType> {
        match raw {
            1 => Some(DType::F16),
            2 => Some(DType::BF16),
            3 => Some(DType::F32),
            4 => Some(DType::I32),
            _ => None,
        }
    }
}

/// A strided view of device memory: `sizes` and `strides` are in elements, outermost first.
/// A view with a null pointer means "absent" where an operator documents the tensor as optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorView<const RANK: usize> {
    /// Device address of element [0, 0, ...].
    pub ptr: u64,
    pub sizes: [u64; RANK],
    pub strides: [i64; RANK],
    pub dtype: DType,
}

impl<const RANK: usize> TensorView<RANK> {
    pub fn new(ptr: u64, sizes: [u64; RANK], strides: [i64; RANK], dtype: DType) -> Self {
        TensorView { ptr, sizes, strides, dtype }
    }

    /// A densely packed row-major view.
    pub fn contiguous(ptr: u64, sizes: [u64; RANK], dtype: DType) -> Self {
        let mut strides = [0i64; RANK];
        let mut step = 1i64;
        for d in (0..RANK).rev() {
            strides[d] = step;
            step = step.saturating_mul(sizes[d] as i64);
        }
        TensorView { ptr, sizes, strides, dtype }
    }

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
}
