//! Adapters from [cudarc](https://docs.rs/cudarc) (feature `cudarc-adapters`): its streams to
//! [`Stream`], its device memory to [`TensorView`].
//!
//! cudarc tracks which stream last wrote or read a buffer and makes other streams wait for it.
//! The adapters take the address with that bookkeeping for `stream` (it waits for earlier writes,
//! or reads for a mutable view), and the view is meant for a call on that same stream: on another
//! stream, synchronise yourself.
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};

use crate::error::{Error, ErrorKind, Result, bail};
use crate::{DType, DeviceSupport, Runtime, Stream, TensorView};

impl From<&CudaStream> for Stream {
    fn from(stream: &CudaStream) -> Stream {
        Stream::cuda(stream.cu_stream() as usize)
    }
}

/// A densely packed row-major view of `memory` with `sizes`, as `dtype`, for reading on `stream`.
/// Refuses (`InvalidArgument`) an element type whose size is not `dtype`'s, and sizes holding
/// more elements than `memory` has (`TooLarge` if their product overflows).
pub fn tensor_view<T, const RANK: usize>(
    memory: &impl DevicePtr<T>,
    stream: &CudaStream,
    sizes: [u64; RANK],
    dtype: DType,
) -> Result<TensorView<RANK>> {
    check_fits(std::mem::size_of::<T>(), memory.len(), &sizes, dtype)?;
    let (ptr, _recorded) = memory.device_ptr(stream);
    Ok(TensorView::contiguous(ptr, sizes, dtype))
}

/// As [`tensor_view`], for memory the call writes (outputs, gradients, workspaces).
pub fn tensor_view_mut<T, const RANK: usize>(
    memory: &mut impl DevicePtrMut<T>,
    stream: &CudaStream,
    sizes: [u64; RANK],
    dtype: DType,
) -> Result<TensorView<RANK>> {
    check_fits(std::mem::size_of::<T>(), memory.len(), &sizes, dtype)?;
    let (ptr, _recorded) = memory.device_ptr_mut(stream);
    Ok(TensorView::contiguous(ptr, sizes, dtype))
}

/// [`device_support`](crate::device_support) of CUDA device `ordinal`, its primary context made
/// current for the question (a fresh process has no current context, and the null stream runs in
/// the current one): for tools that look at a device before anything else uses it.
pub fn cuda_device_support(ordinal: usize) -> Result<DeviceSupport> {
    if !crate::library_present(Runtime::Cuda) {
        // The runtime's NoDriver error names the library it looked for.
        return crate::device_support(Stream::cuda(0));
    }
    // cudarc panics when it cannot open the driver library it looks for (other names than the
    // runtime's): that is an answer here, not a crash.
    let context = std::panic::catch_unwind(|| CudaContext::new(ordinal))
        .map_err(|_| Error::new(ErrorKind::NoDriver, "cudarc could not load the CUDA driver library"))?
        .map_err(|e| Error::new(ErrorKind::Driver, format!("cannot use CUDA device {ordinal}: {e:?}")))?;
    let support = crate::device_support(Stream::cuda(0));
    drop(context);
    support
}

fn check_fits(elem_size: usize, len: usize, sizes: &[u64], dtype: DType) -> Result<()> {
    if elem_size as u64 != dtype.size_bytes() {
        bail!(InvalidArgument, "memory of {elem_size}-byte elements viewed as {dtype:?} ({} bytes)", dtype.size_bytes());
    }
    let Some(elements) = sizes.iter().try_fold(1u64, |n, &s| n.checked_mul(s)) else {
        bail!(TooLarge, "sizes {sizes:?} hold more than 2^64 elements");
    };
    if elements > len as u64 {
        bail!(InvalidArgument, "sizes {sizes:?} hold {elements} elements, the memory has {len}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn a_view_must_fit_its_memory_and_element_type() {
        assert!(check_fits(2, 24, &[2, 3, 4], DType::BF16).is_ok());
        assert!(check_fits(2, 100, &[2, 3, 4], DType::F16).is_ok());
        let kind = |r: Result<()>| r.unwrap_err().kind();
        assert_eq!(kind(check_fits(2, 23, &[2, 3, 4], DType::F16)), ErrorKind::InvalidArgument);
        assert_eq!(kind(check_fits(4, 24, &[2, 3, 4], DType::F16)), ErrorKind::InvalidArgument);
        assert_eq!(kind(check_fits(4, 24, &[u64::MAX, 2], DType::F32)), ErrorKind::TooLarge);
    }
}
