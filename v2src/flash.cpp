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

bridge::MaskSpec mask_of(bool causal, MaskAlign align, int32_t left, int32_t right) {
  return bridge::MaskSpec{causal, static_cast<int32_t>(align), left, right};
}

Status unknown_version(const char* what, uint32_t version, uint32_t known) {
  std::string message = std::string(what) + ".version " + std::to_string(version) +
                        " is not known to this library (it knows 1.." + std::to_string(known) + ")";
  return detail::fail(Status::kUnsupportedVersion, message.c_str());
}

}  // namespace

Status attn_fwd(const FwdParams& params, Stream stream) noexcept {
  return detail::guarded([&] {
    if (params.version < 1 || params.version > FwdParams::kVersion) {
      return unknown_version("FwdParams", params.version, FwdParams::kVersion);
    }
    bridge::FwdArgs args{to_bridge<4, bridge::TensorView4>(params.q),
                         to_bridge<4, bridge::TensorView4>(params.k),
                         to_bridge<4, bridge::TensorView4>(params.v),
                         to_bridge<4, bridge::TensorView4>(params.o),
                         to_bridge<3, bridge::TensorView3>(params.lse),
                         params.sm_scale,
                         mask_of(params.causal, MaskAlign::kTopLeft, -1, -1)};
    if (params.version >= 2) {  // fields a version-1 caller's struct does not have
      args.mask = mask_of(params.causal, params.align, params.window_left, params.window_right);
    }
    return detail::finish(bridge::attn_fwd(args, reinterpret_cast<std::size_t>(stream.handle)));
  });
}

Status attn_bwd(const BwdParams& params, Stream stream) noexcept {
  return detail::guarded([&] {
    if (params.version != BwdParams::kVersion) {
      return unknown_version("BwdParams", params.version, BwdParams::kVersion);
    }
    bridge::BwdArgs args{to_bridge<4, bridge::TensorView4>(params.q),
                         to_bridge<4, bridge::TensorView4>(params.k),
                         to_bridge<4, bridge::TensorView4>(params.v),
                         to_bridge<4, bridge::TensorView4>(params.o),
                         to_bridge<4, bridge::TensorView4>(params.d_o),
                         to_bridge<3, bridge::TensorView3>(params.lse),
                         to_bridge<3, bridge::TensorView3>(params.delta),
                         to_bridge<4, bridge::TensorView4>(params.dq),
                         to_bridge<4, bridge::TensorView4>(params.dk),
                         to_bridge<4, bridge::TensorView4>(params.dv),
                         params.sm_scale,
                         mask_of(params.causal, params.align, params.window_left, params.window_right)};
    return detail::finish(bridge::attn_bwd(args, reinterpret_cast<std::size_t>(stream.handle)));
  });
}

}  // namespace flash
}  // namespace v2
}  // namespace aotriton
