// FlashAttention operators.
//
// Layouts: q, k, v, o are B x H x S x D views with any element strides whose last stride is 1
// (B x H x S x D and B x S x H x D memory both work). lse is a B x H x Sq fp32 view (last stride
// 1) that receives, per query row, the natural-log log-sum-exp of the row's scaled scores.
#pragma once

#include <cstdint>
#include <limits>

#include "aotriton/dtypes.h"
#include "aotriton/runtime.h"
#include "aotriton/util.h"

namespace aotriton {
namespace v2 {
namespace flash {

// Versioned parameters: `version` tells the library which fields the caller's header had.
// Later versions only append fields, so a program built against an older header keeps working.
struct FwdParams {
  static constexpr uint32_t kVersion = 1;
  uint32_t version = kVersion;

  TensorView<4> q;    // B x H x Sq x D, fp16 or bf16
  TensorView<4> k;    // B x H x Sk x D, same dtype as q
  TensorView<4> v;    // B x H x Sk x D, same dtype as q
  TensorView<4> o;    // B x H x Sq x D output, same dtype as q
  TensorView<3> lse;  // B x H x Sq fp32 output
  // Scale of q.k; must be set (typically 1/sqrt(D)): NaN is rejected as "not set".
  float sm_scale = std::numeric_limits<float>::quiet_NaN();
  // Causal mask aligned top-left: query i sees keys j <= i.
  bool causal = false;
};

// Enqueues the forward pass on `stream` and returns without waiting. Every argument is checked
// first; on any error nothing is launched.
AOTRITON_API Status attn_fwd(const FwdParams& params, Stream stream) noexcept;

}  // namespace flash
}  // namespace v2
}  // namespace aotriton
