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

bridge::DropoutSpec dropout_of(float p, const void* seed, const void* offset, uint64_t base,
                               void* seed_out, void* offset_out) {
  auto addr = [](const void* ptr) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ptr)); };
  return bridge::DropoutSpec{p, addr(seed), addr(offset), base, addr(seed_out), addr(offset_out)};
}

bridge::VarlenSpec varlen_of(const TensorView<1>& cu_q, const TensorView<1>& cu_k, uint64_t max_q,
                             uint64_t max_k) {
  return bridge::VarlenSpec{to_bridge<1, bridge::TensorView1>(cu_q),
                            to_bridge<1, bridge::TensorView1>(cu_k), max_q, max_k};
}

// The host copies of the offsets as slices (empty when not given or not packed).
struct HostOffsets {
  rust::Slice<const int32_t> q, k;
};

HostOffsets host_offsets(const TensorView<1>& cu_q, const int32_t* host_q, const int32_t* host_k) {
  if (cu_q.data == nullptr || host_q == nullptr || host_k == nullptr) return {};
  const std::size_t n = static_cast<std::size_t>(cu_q.sizes[0]);
  return {rust::Slice<const int32_t>(host_q, n), rust::Slice<const int32_t>(host_k, n)};
}

bridge::MaskSpec mask_of(bool causal, MaskAlign align, int32_t left, int32_t right) {
  return bridge::MaskSpec{causal, static_cast<int32_t>(align), left, right};
}

bridge::StreamSpec stream_of(Stream stream) {
  return bridge::StreamSpec{static_cast<uint64_t>(reinterpret_cast<uintptr_t>(stream.handle)),
                            static_cast<int32_t>(stream.runtime)};
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
                         mask_of(params.causal, MaskAlign::kTopLeft, -1, -1),
                         bridge::TensorView4{},
                         dropout_of(0.0f, nullptr, nullptr, 0, nullptr, nullptr),
                         varlen_of(TensorView<1>{}, TensorView<1>{}, 0, 0),
                         false,
                         static_cast<int32_t>(Backend::kAuto)};
    // Read only the fields the caller's version of the struct has.
    if (params.version >= 2) {
      args.mask = mask_of(params.causal, params.align, params.window_left, params.window_right);
    }
    HostOffsets host{};
    if (params.version >= 3) {
      args.bias = to_bridge<4, bridge::TensorView4>(params.bias);
      args.dropout = dropout_of(params.dropout_p, params.philox_seed, params.philox_offset,
                                params.philox_offset_base, params.philox_seed_out,
                                params.philox_offset_out);
      args.varlen = varlen_of(params.cu_seqlens_q, params.cu_seqlens_k, params.max_seqlen_q,
                              params.max_seqlen_k);
      args.allow_tf32 = params.allow_tf32;
      host = host_offsets(params.cu_seqlens_q, params.cu_seqlens_q_host, params.cu_seqlens_k_host);
    }
    if (params.version >= 4) {
      args.backend = static_cast<int32_t>(params.backend);
    }
    return detail::finish(
        bridge::attn_fwd(args, host.q, host.k, stream_of(stream)));
  });
}

namespace {

// The bridge's view of a BwdParams of any version; fails on an unknown version.
Status bwd_args_of(const BwdParams& params, bridge::BwdArgs* out, HostOffsets* host) {
  if (params.version < 1 || params.version > BwdParams::kVersion) {
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
                       mask_of(params.causal, params.align, params.window_left, params.window_right),
                       bridge::TensorView4{},
                       bridge::TensorView4{},
                       dropout_of(0.0f, nullptr, nullptr, 0, nullptr, nullptr),
                       varlen_of(TensorView<1>{}, TensorView<1>{}, 0, 0),
                       false,
                       false,
                       static_cast<int32_t>(Backend::kAuto),
                       0,
                       0};
  *host = HostOffsets{};
  // Read only the fields the caller's version of the struct has.
  if (params.version >= 2) {
    args.bias = to_bridge<4, bridge::TensorView4>(params.bias);
    args.dbias = to_bridge<4, bridge::TensorView4>(params.dbias);
    args.dropout = dropout_of(params.dropout_p, params.philox_seed, params.philox_offset,
                              params.philox_offset_base, nullptr, nullptr);
    args.varlen = varlen_of(params.cu_seqlens_q, params.cu_seqlens_k, params.max_seqlen_q,
                            params.max_seqlen_k);
    args.allow_tf32 = params.allow_tf32;
    args.deterministic = params.deterministic;
    *host = host_offsets(params.cu_seqlens_q, params.cu_seqlens_q_host, params.cu_seqlens_k_host);
  }
  if (params.version >= 3) {
    args.backend = static_cast<int32_t>(params.backend);
    args.workspace = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(params.workspace));
    args.workspace_bytes = params.workspace_bytes;
  }
  *out = args;
  return Status::kSuccess;
}

}  // namespace

Status attn_bwd(const BwdParams& params, Stream stream) noexcept {
  return detail::guarded([&] {
    bridge::BwdArgs args;
    HostOffsets host{};
    Status status = bwd_args_of(params, &args, &host);
    if (status != Status::kSuccess) return status;
    return detail::finish(
        bridge::attn_bwd(args, host.q, host.k, stream_of(stream)));
  });
}

Status attn_bwd_workspace_bytes(const BwdParams& params, Stream stream, uint64_t* bytes) noexcept {
  return detail::guarded([&] {
    if (bytes == nullptr) {
      return detail::fail(Status::kNullPointer, "attn_bwd_workspace_bytes: bytes (the output) is null");
    }
    *bytes = 0;
    bridge::BwdArgs args;
    HostOffsets host{};
    Status status = bwd_args_of(params, &args, &host);
    if (status != Status::kSuccess) return status;
    return detail::finish(bridge::attn_bwd_workspace_bytes(
        args, host.q, host.k, stream_of(stream), *bytes));
  });
}

uint64_t dropout_offsets_consumed(uint64_t batch, uint64_t heads_q, uint64_t seqlen_q,
                                  uint64_t seqlen_k) noexcept {
  return bridge::dropout_offsets_consumed(batch, heads_q, seqlen_q, seqlen_k);
}

Status debug_dropout_mask(TensorView<4> out, float dropout_p, const void* philox_seed,
                          const void* philox_offset, uint64_t philox_offset_base,
                          Stream stream) noexcept {
  return detail::guarded([&] {
    bridge::TensorView4 view = to_bridge<4, bridge::TensorView4>(out);
    bridge::DropoutSpec spec =
        dropout_of(dropout_p, philox_seed, philox_offset, philox_offset_base, nullptr, nullptr);
    return detail::finish(
        bridge::debug_dropout_mask(view, spec, stream_of(stream)));
  });
}

}  // namespace flash
}  // namespace v2
}  // namespace aotriton
