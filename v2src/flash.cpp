// aotriton::v2::flash (include/aotriton/flash.h) on top of the Rust runtime, through the bridge.
#include "aotriton/flash.h"

#include <cstdint>
#include <string>

#include "status.h"

namespace aotriton {
namespace v2 {
namespace flash {
namespace {

template <int Rank, typename BridgeView>
BridgeView to_bridge(const TensorView<Rank>& t) {
  BridgeView out;
  out.ptr = reinterpret_cast<uint64_t>(t.data);
  for (int d = 0; d < Rank; ++d) {
    out.sizes[d] = t.sizes[d];
    out.strides[d] = t.strides[d];
  }
  out.dtype = static_cast<int32_t>(t.dtype);
  return out;
}

}  // namespace

Status attn_fwd(const FwdParams& params, Stream stream) noexcept {
  return detail::guarded([&] {
    if (params.version != 1) {
      std::string message = "FwdParams.version " + std::to_string(params.version) +
                            " is not known to this library (it knows 1)";
      return detail::fail(Status::kUnsupportedVersion, message.c_str());
    }
    bridge::FwdParamsV1 p{
        to_bridge<4, bridge::TensorView4>(params.q), to_bridge<4, bridge::TensorView4>(params.k),
        to_bridge<4, bridge::TensorView4>(params.v), to_bridge<4, bridge::TensorView4>(params.o),
        to_bridge<3, bridge::TensorView3>(params.lse), params.sm_scale, params.causal};
    return detail::finish(bridge::attn_fwd(p, reinterpret_cast<std::size_t>(stream.handle)));
  });
}

}  // namespace flash
}  // namespace v2
}  // namespace aotriton
