// Element types of tensors passed to aotriton.
#pragma once

#include <cstdint>

namespace aotriton {

// Values are part of the ABI and are the seed's (ROCm/aotriton) numbering, so a program written
// against the seed's headers passes the same values. The operators take kFloat16, kBFloat16 and
// kFloat32 tensors (the fp8 forward kFloat8E4M3) and kInt32 sequence offsets; the 64-bit integer types are accepted for the
// seed's scalar arguments (the dropout seed and offset); everything else is refused by the call
// that receives it.
enum class DType : int32_t {
  kUnknown = 0,
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 10,
  kInt16 = 11,
  kInt32 = 12,  // sequence offsets (cu_seqlens)
  kInt64 = 13,
  kUInt8 = 20,
  kUInt16 = 21,
  kUInt32 = 22,
  kUInt64 = 23,
  kFloat8E4M3 = 30,  // float8_e4m3fn: the fp8 forward's inputs (not in the seed's numbering)
};

}  // namespace aotriton
