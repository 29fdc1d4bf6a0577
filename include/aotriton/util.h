// TensorView: a non-owning, strided view of device memory.
#pragma once

#include <array>
#include <cstdint>

#include "aotriton/dtypes.h"
#include "aotriton/runtime.h"

namespace aotriton {

// Sizes and strides are in elements, outermost dimension first. The view does not own the
// memory; aotriton never allocates or frees caller tensors. A null `data` marks an optional
// tensor as absent where an operator documents that.
//
// Two ways to build one: set the fields (or use contiguous()), or the seed's (ROCm/aotriton)
// constructor TensorView<Rank>(address, sizes, strides, dtype), whose strides are unsigned; a
// stride above INT64_MAX becomes negative here and is refused as kBadStrides by the call.
template <int Rank>
struct TensorView {
  static_assert(Rank >= 1 && Rank <= 8, "TensorView rank must be 0..8");
  static constexpr int kRank = Rank;

  const void* data = nullptr;
  uint64_t sizes[Rank] = {};
  int64_t strides[Rank] = {};
  DType dtype = DType::kFloat16;

  TensorView() = default;

  TensorView(intptr_t address, const std::array<uint64_t, Rank>& sizes_,
             const std::array<uint64_t, Rank>& strides_, DType dtype_)
      : data(reinterpret_cast<const void*>(address)), dtype(dtype_) {
    for (int d = 0; d < Rank; ++d) {
      sizes[d] = sizes_[d];
      strides[d] = static_cast<int64_t>(strides_[d]);
    }
  }

  // Present (a non-null data pointer).
  explicit operator bool() const { return data != nullptr; }

  // A densely packed row-major view. A stride that does not fit int64_t saturates at INT64_MAX
  // (as the Rust TensorView::contiguous does) instead of overflowing, which would be undefined
  // behaviour.
  static TensorView contiguous(const void* data, const uint64_t (&sizes)[Rank], DType dtype) {
    TensorView t;
    t.data = data;
    t.dtype = dtype;
    int64_t step = 1;  // never negative
    for (int d = Rank - 1; d >= 0; --d) {
      t.sizes[d] = sizes[d];
      t.strides[d] = step;
      const uint64_t max = static_cast<uint64_t>(INT64_MAX);
      step = sizes[d] != 0 && static_cast<uint64_t>(step) > max / sizes[d]
                 ? INT64_MAX
                 : step * static_cast<int64_t>(sizes[d]);
    }
    return t;
  }
};

// A device scalar (the seed's T0): the address of one element, e.g. the dropout seed and offset
// (u64 or i64) or the seed's atomic counter.
template <>
struct TensorView<0> {
  static constexpr int kRank = 0;

  const void* data = nullptr;
  DType dtype = DType::kUInt64;

  TensorView() = default;
  TensorView(intptr_t address, DType dtype_) : data(reinterpret_cast<const void*>(address)), dtype(dtype_) {}

  explicit operator bool() const { return data != nullptr; }
};

// The seed's device queries (a hipStream_t converts to Stream; a CUDA stream works too):
// whether the stream's device runs kernels that this release has not yet run on hardware (every
// arch but sm_90 today; PyTorch then asks for TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1), and
// its multiprocessor (compute unit) count. false / 0 when the device cannot be reached
// (last_error_message() says why).
AOTRITON_API bool isArchExperimentallySupported(Stream stream) noexcept;
AOTRITON_API int getMultiProcessorCount(Stream stream) noexcept;

}  // namespace aotriton
