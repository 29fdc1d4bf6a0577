// Element types of tensors passed to aotriton.
#pragma once

#include <cstdint>

namespace aotriton {

// Values are part of the ABI (mirrored by the Rust runtime's DType); never renumber.
enum class DType : int32_t {
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat32 = 3,
  kInt32 = 4,  // sequence offsets (cu_seqlens)
};

}  // namespace aotriton
