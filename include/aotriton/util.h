// TensorView: a non-owning, strided view of device memory.
#pragma once

#include <cstdint>

#include "aotriton/dtypes.h"

namespace aotriton {

// Sizes and strides are in elements, outermost dimension first. The view does not own the
// memory; aotriton never allocates or frees caller tensors. A null `data` marks an optional
// tensor as absent where an operator documents that.
template <int Rank>
struct TensorView {
  static_assert(Rank >= 1 && Rank <= 8, "TensorView rank must be 1..8");
  static constexpr int kRank = Rank;

  const void* data = nullptr;
  uint64_t sizes[Rank] = {};
  int64_t strides[Rank] = {};
  DType dtype = DType::kFloat16;

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

}  // namespace aotriton
