// aotriton::v2::flash (include/aotriton/flash.h) on top of the Rust runtime, through the bridge.
#include "aotriton/flash.h"

#include <cstdint>
#include <string>
#include <utility>

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
                             uint64_t max_k, const int32_t* status) {
  return bridge::VarlenSpec{to_bridge<1, bridge::TensorView1>(cu_q),
                            to_bridge<1, bridge::TensorView1>(cu_k), max_q, max_k,
                            static_cast<uint64_t>(reinterpret_cast<uintptr_t>(status))};
}

// The host copies of the offsets as slices (empty when not given or not packed).
struct HostOffsets {
  rust::Slice<const int32_t> q, k;
};

// A packed batch has B + 1 offsets with B <= 65535 (the launch grid's limit).
constexpr uint64_t kMaxOffsets = 65536;

// The host arrays of a packed batch as slices of their declared lengths (`count` 0: the device
// tensor's, as callers of older headers promised). The lengths are bounded before any slice
// exists: a Rust slice longer than the memory behind it is undefined behaviour even unread.
Status host_offsets(const TensorView<1>& cu_q, const TensorView<1>& cu_k, const int32_t* host_q,
                    uint64_t count_q, const int32_t* host_k, uint64_t count_k, HostOffsets* out) {
  *out = HostOffsets{};
  if (cu_q.data == nullptr || (host_q == nullptr && host_k == nullptr)) return Status::kSuccess;
  if (host_q == nullptr || host_k == nullptr) {
    return detail::fail(Status::kInvalidArgument,
                        host_q == nullptr ? "cu_seqlens_k_host is given without cu_seqlens_q_host: give both or neither"
                                          : "cu_seqlens_q_host is given without cu_seqlens_k_host: give both or neither");
  }
  if (count_q == 0) count_q = cu_q.sizes[0];
  if (count_k == 0) count_k = cu_k.sizes[0];
  for (auto [name, count] : {std::pair<const char*, uint64_t>{"cu_seqlens_q_host", count_q}, {"cu_seqlens_k_host", count_k}}) {
    if (count > kMaxOffsets) {
      std::string message = std::string(name) + " has " + std::to_string(count) +
                            " entries; a packed batch has at most " + std::to_string(kMaxOffsets) +
                            " (B + 1 offsets, B <= 65535)";
      return detail::fail(Status::kTooLarge, message.c_str());
    }
  }
  *out = {rust::Slice<const int32_t>(host_q, static_cast<std::size_t>(count_q)),
          rust::Slice<const int32_t>(host_k, static_cast<std::size_t>(count_k))};
  return Status::kSuccess;
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
                         varlen_of(TensorView<1>{}, TensorView<1>{}, 0, 0, nullptr),
                         false,
                         static_cast<int32_t>(Backend::kAuto),
                         0.0f,
                         bridge::TensorView2{},
                         bridge::TensorView1{}};
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
      args.allow_tf32 = params.allow_tf32;
    }
    if (params.version >= 4) {
      args.backend = static_cast<int32_t>(params.backend);
    }
    if (params.version >= 6) {
      args.softcap = params.softcap;
    }
    if (params.version >= 7) {
      args.alibi_slopes = to_bridge<2, bridge::TensorView2>(params.alibi_slopes);
    }
    if (params.version >= 8) {
      args.sinks = to_bridge<1, bridge::TensorView1>(params.sinks);
    }
    if (params.version >= 3) {
      const bool v5 = params.version >= 5;
      args.varlen = varlen_of(params.cu_seqlens_q, params.cu_seqlens_k, params.max_seqlen_q,
                              params.max_seqlen_k, v5 ? params.varlen_status : nullptr);
      Status status = host_offsets(params.cu_seqlens_q, params.cu_seqlens_k, params.cu_seqlens_q_host,
                                   v5 ? params.cu_seqlens_q_host_count : 0, params.cu_seqlens_k_host,
                                   v5 ? params.cu_seqlens_k_host_count : 0, &host);
      if (status != Status::kSuccess) return status;
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
                       varlen_of(TensorView<1>{}, TensorView<1>{}, 0, 0, nullptr),
                       false,
                       false,
                       static_cast<int32_t>(Backend::kAuto),
                       0,
                       0,
                       0.0f,
                       bridge::TensorView2{},
                       bridge::TensorView1{},
                       bridge::TensorView1{}};
  *host = HostOffsets{};
  // Read only the fields the caller's version of the struct has.
  if (params.version >= 2) {
    args.bias = to_bridge<4, bridge::TensorView4>(params.bias);
    args.dbias = to_bridge<4, bridge::TensorView4>(params.dbias);
    args.dropout = dropout_of(params.dropout_p, params.philox_seed, params.philox_offset,
                              params.philox_offset_base, nullptr, nullptr);
    args.allow_tf32 = params.allow_tf32;
    args.deterministic = params.deterministic;
  }
  if (params.version >= 3) {
    args.backend = static_cast<int32_t>(params.backend);
    args.workspace = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(params.workspace));
    args.workspace_bytes = params.workspace_bytes;
  }
  if (params.version >= 5) {
    args.softcap = params.softcap;
  }
  if (params.version >= 6) {
    args.alibi_slopes = to_bridge<2, bridge::TensorView2>(params.alibi_slopes);
  }
  if (params.version >= 7) {
    args.sinks = to_bridge<1, bridge::TensorView1>(params.sinks);
    args.dsinks = to_bridge<1, bridge::TensorView1>(params.dsinks);
  }
  if (params.version >= 2) {
    const bool v4 = params.version >= 4;
    args.varlen = varlen_of(params.cu_seqlens_q, params.cu_seqlens_k, params.max_seqlen_q,
                            params.max_seqlen_k, v4 ? params.varlen_status : nullptr);
    Status status = host_offsets(params.cu_seqlens_q, params.cu_seqlens_k, params.cu_seqlens_q_host,
                                 v4 ? params.cu_seqlens_q_host_count : 0, params.cu_seqlens_k_host,
                                 v4 ? params.cu_seqlens_k_host_count : 0, host);
    if (status != Status::kSuccess) return status;
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

Status attn_fwd_fp8(const Fp8FwdParams& params, Stream stream) noexcept {
  return detail::guarded([&] {
    if (params.version != Fp8FwdParams::kVersion) {
      return unknown_version("Fp8FwdParams", params.version, Fp8FwdParams::kVersion);
    }
    bridge::Fp8FwdArgs args{to_bridge<4, bridge::TensorView4>(params.q),
                            to_bridge<4, bridge::TensorView4>(params.k),
                            to_bridge<4, bridge::TensorView4>(params.v),
                            to_bridge<4, bridge::TensorView4>(params.o),
                            to_bridge<3, bridge::TensorView3>(params.lse),
                            to_bridge<2, bridge::TensorView2>(params.q_descale),
                            to_bridge<2, bridge::TensorView2>(params.k_descale),
                            to_bridge<2, bridge::TensorView2>(params.v_descale),
                            params.sm_scale,
                            mask_of(params.causal, params.align, params.window_left, params.window_right),
                            static_cast<uint64_t>(reinterpret_cast<uintptr_t>(params.workspace)),
                            params.workspace_bytes};
    return detail::finish(bridge::attn_fwd_fp8(args, stream_of(stream)));
  });
}

Status attn_fwd_fp8_workspace_bytes(TensorView<4> k, uint64_t* bytes) noexcept {
  return detail::guarded([&] {
    if (bytes == nullptr) {
      return detail::fail(Status::kNullPointer, "attn_fwd_fp8_workspace_bytes: bytes (the output) is null");
    }
    *bytes = 0;
    return detail::finish(bridge::attn_fwd_fp8_workspace_bytes(to_bridge<4, bridge::TensorView4>(k), *bytes));
  });
}

namespace {

// The bridge's view of a KvCacheParams; fails on an unknown version.
Status kvcache_args_of(const KvCacheParams& params, bridge::KvCacheArgs* out) {
  if (params.version != KvCacheParams::kVersion) {
    return unknown_version("KvCacheParams", params.version, KvCacheParams::kVersion);
  }
  *out = bridge::KvCacheArgs{to_bridge<4, bridge::TensorView4>(params.q),
                             to_bridge<4, bridge::TensorView4>(params.k_cache),
                             to_bridge<4, bridge::TensorView4>(params.v_cache),
                             to_bridge<2, bridge::TensorView2>(params.page_table),
                             to_bridge<1, bridge::TensorView1>(params.cache_seqlens),
                             to_bridge<4, bridge::TensorView4>(params.k_new),
                             to_bridge<4, bridge::TensorView4>(params.v_new),
                             to_bridge<4, bridge::TensorView4>(params.o),
                             to_bridge<3, bridge::TensorView3>(params.lse),
                             params.sm_scale,
                             mask_of(params.causal, MaskAlign::kBottomRight, params.window_left, params.window_right),
                             params.num_splits,
                             static_cast<uint64_t>(reinterpret_cast<uintptr_t>(params.workspace)),
                             params.workspace_bytes,
                             static_cast<uint64_t>(reinterpret_cast<uintptr_t>(params.status))};
  return Status::kSuccess;
}

}  // namespace

Status attn_fwd_kvcache(const KvCacheParams& params, Stream stream) noexcept {
  return detail::guarded([&] {
    bridge::KvCacheArgs args;
    Status status = kvcache_args_of(params, &args);
    if (status != Status::kSuccess) return status;
    return detail::finish(bridge::attn_fwd_kvcache(args, stream_of(stream)));
  });
}

Status attn_fwd_kvcache_workspace_bytes(const KvCacheParams& params, Stream stream, uint64_t* bytes) noexcept {
  return detail::guarded([&] {
    if (bytes == nullptr) {
      return detail::fail(Status::kNullPointer, "attn_fwd_kvcache_workspace_bytes: bytes (the output) is null");
    }
    *bytes = 0;
    bridge::KvCacheArgs args;
    Status status = kvcache_args_of(params, &args);
    if (status != Status::kSuccess) return status;
    return detail::finish(bridge::attn_fwd_kvcache_workspace_bytes(args, stream_of(stream), *bytes));
  });
}

Status attn_fwd_kvcache_num_splits(const KvCacheParams& params, Stream stream, uint32_t* splits) noexcept {
  return detail::guarded([&] {
    if (splits == nullptr) {
      return detail::fail(Status::kNullPointer, "attn_fwd_kvcache_num_splits: splits (the output) is null");
    }
    *splits = 0;
    bridge::KvCacheArgs args;
    Status status = kvcache_args_of(params, &args);
    if (status != Status::kSuccess) return status;
    return detail::finish(bridge::attn_fwd_kvcache_num_splits(args, stream_of(stream), *splits));
  });
}

Status dropout_offsets_consumed(uint64_t batch, uint64_t heads_q, uint64_t seqlen_q, uint64_t seqlen_k,
                                uint64_t* count) noexcept {
  return detail::guarded([&] {
    if (count == nullptr) {
      return detail::fail(Status::kNullPointer, "dropout_offsets_consumed: count (the output) is null");
    }
    return detail::finish(bridge::dropout_offsets_consumed(batch, heads_q, seqlen_q, seqlen_k, *count));
  });
}

uint64_t dropout_offsets_consumed(uint64_t batch, uint64_t heads_q, uint64_t seqlen_q,
                                  uint64_t seqlen_k) noexcept {
  uint64_t count = 0;
  if (dropout_offsets_consumed(batch, heads_q, seqlen_q, seqlen_k, &count) != Status::kSuccess) {
    return UINT64_MAX;
  }
  return count;
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
