// The seed-compatible API (include/aotriton/flash.h, second half): copies the caller's arguments
// into the bridge's structs; rust/aotriton-cxx/src/seed.rs decides everything else.
#include <cstdint>
#include <string>

#include "aotriton/flash.h"
#include "status.h"

namespace aotriton {
namespace {

uint64_t address(const void* ptr) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ptr)); }

template <int Rank, typename BridgeView>
BridgeView bridged(const TensorView<Rank>& t) {
  BridgeView out;
  out.ptr = address(t.data);
  for (int d = 0; d < Rank; ++d) {
    out.sizes[d] = t.sizes[d];
    out.strides[d] = t.strides[d];
  }
  out.dtype = static_cast<int32_t>(t.dtype);
  return out;
}

bridge::TensorView4 b4(const TensorView<4>& t) { return bridged<4, bridge::TensorView4>(t); }
bridge::TensorView2 b2(const TensorView<2>& t) { return bridged<2, bridge::TensorView2>(t); }
bridge::TensorView1 b1(const TensorView<1>& t) { return bridged<1, bridge::TensorView1>(t); }
bridge::Scalar b0(const TensorView<0>& t) { return bridge::Scalar{address(t.data), static_cast<int32_t>(t.dtype)}; }

bridge::StreamSpec stream_spec(Stream stream) {
  return bridge::StreamSpec{address(stream.handle), static_cast<int32_t>(stream.runtime)};
}

bridge::SeedDropout dropout_of(float p, const TensorView<0>& seed, const TensorView<0>& offset1, uint64_t offset2,
                               bool offset2_signed) {
  return bridge::SeedDropout{p, b0(seed), b0(offset1), offset2, offset2_signed};
}

bridge::SeedShape shape_of(int8_t causal_type, int32_t left, int32_t right, int8_t varlen_type, const TensorView<1>& cu_q,
                           const TensorView<1>& cu_k, int32_t max_q, int32_t max_k) {
  return bridge::SeedShape{causal_type, left, right, varlen_type, b1(cu_q), b1(cu_k), max_q, max_k};
}

// A v2 call's is_causal (top-left) in the v3 form.
bridge::SeedShape v2_shape(bool is_causal, bool packed, const TensorView<1>& cu_q, const TensorView<1>& cu_k,
                           int32_t max_q, int32_t max_k) {
  using v3::flash::CausalType;
  using v3::flash::VarlenType;
  using v3::flash::WindowValue;
  return shape_of(is_causal ? CausalType::WindowedAttention : CausalType::None, WindowValue::TopLeftAligned,
                  WindowValue::TopLeftAligned, packed ? VarlenType::CompactVarlen : VarlenType::None, cu_q, cu_k,
                  max_q, max_k);
}

// Records the outcome's message for last_error_message() and returns its hipError_t.
hipError_t finish(const bridge::SeedOutcome& outcome) noexcept {
  try {
    detail::fail(static_cast<Status>(outcome.code), std::string(outcome.message).c_str());
  } catch (...) {
    detail::fail(static_cast<Status>(outcome.code), "");
  }
  return static_cast<hipError_t>(outcome.hip);
}

// Runs `body` (which returns a hipError_t), turning any C++ exception into hipErrorUnknown.
template <typename F>
hipError_t guarded(F&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    detail::fail(Status::kInternal, e.what());
  } catch (...) {
    detail::fail(Status::kInternal, "unknown C++ exception inside aotriton");
  }
  return hipErrorUnknown;
}

hipError_t forward(const bridge::SeedFwdArgs& args, int32_t version, Stream stream) {
  return finish(bridge::seed_attn_fwd(args, version, v3::flash::attn_fwd_params::kVersion, stream_spec(stream)));
}

hipError_t backward(const bridge::SeedBwdArgs& args, int32_t version, Stream stream) {
  return finish(bridge::seed_attn_bwd(args, version, v3::flash::attn_bwd_params::kVersion, stream_spec(stream)));
}

// A v2 call's extargs: the seed's tuning structs carry nothing here (flash.h), so whatever the
// pointer, the automatic choice runs.
int32_t backend_index(const void* /*extargs*/) { return -1; }

}  // namespace

bool isArchExperimentallySupported(Stream stream) noexcept {
  bool experimental = false;
  guarded([&] { return finish(bridge::seed_arch_experimental(stream_spec(stream), experimental)); });
  return experimental;
}

int getMultiProcessorCount(Stream stream) noexcept {
  int32_t count = 0;
  guarded([&] { return finish(bridge::seed_multiprocessors(stream_spec(stream), count)); });
  return count;
}

namespace v2 {
namespace flash {

hipError_t check_gpu(Stream stream) noexcept {
  return guarded([&] { return finish(bridge::seed_check_gpu(stream_spec(stream))); });
}

hipError_t attn_fwd(T4 q, T4 k, T4 v, T4 b, float sm_scale, T2 softmax_lse, T4 Out, float dropout_p, T0 philox_seed,
                    T0 philox_offset1, int64_t philox_offset2, T0 philox_seed_output, T0 philox_offset_output,
                    T4 encoded_softmax, bool is_causal, T0 /*atomic_for_causal: no kernel here needs it*/,
                    Stream stream, FwdExtraArguments* extargs) noexcept {
  return guarded([&] {
    bridge::SeedFwdArgs args{b4(q), b4(k), b4(v), b4(b), b2(T2{}), sm_scale, b2(softmax_lse), b4(Out),
                             v2_shape(is_causal, false, T1{}, T1{}, 0, 0),
                             dropout_of(dropout_p, philox_seed, philox_offset1, static_cast<uint64_t>(philox_offset2), true),
                             b0(philox_seed_output), b0(philox_offset_output), b4(encoded_softmax), backend_index(extargs)};
    return forward(args, v3::flash::attn_fwd_params::kVersion, stream);
  });
}

hipError_t attn_fwd_compact_varlen(T4 q, T4 k, T4 v, T4 b, T1 cu_seqlens_q, T1 cu_seqlens_k, int32_t max_seqlen_q,
                                   int32_t max_seqlen_k, float sm_scale, T2 softmax_lse, T4 Out, float dropout_p,
                                   T0 philox_seed, T0 philox_offset1, int64_t philox_offset2, T0 philox_seed_output,
                                   T0 philox_offset_output, T4 encoded_softmax, bool is_causal,
                                   T0 /*atomic_for_causal*/, Stream stream, FwdExtraArguments* extargs) noexcept {
  return guarded([&] {
    bridge::SeedFwdArgs args{b4(q), b4(k), b4(v), b4(b), b2(T2{}), sm_scale, b2(softmax_lse), b4(Out),
                             v2_shape(is_causal, true, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                             dropout_of(dropout_p, philox_seed, philox_offset1, static_cast<uint64_t>(philox_offset2), true),
                             b0(philox_seed_output), b0(philox_offset_output), b4(encoded_softmax), backend_index(extargs)};
    return forward(args, v3::flash::attn_fwd_params::kVersion, stream);
  });
}

hipError_t attn_bwd(T4 q, T4 k, T4 v, T4 b, float sm_scale, T4 out, T4 dout, T4 dq, T4 dk, T4 dv, T4 db,
                    T2 softmax_lse, T2 delta, float dropout_p, T0 philox_seed, T0 philox_offset1,
                    int64_t philox_offset2, bool is_causal, Stream stream, BwdExtraArguments* extargs) noexcept {
  return guarded([&] {
    bridge::SeedBwdArgs args{b4(q), b4(k), b4(v), b4(b), sm_scale, b4(out), b4(dout), b4(dk), b4(dv), b4(dq), b4(db),
                             b2(softmax_lse), b2(delta), v2_shape(is_causal, false, T1{}, T1{}, 0, 0),
                             dropout_of(dropout_p, philox_seed, philox_offset1, static_cast<uint64_t>(philox_offset2), true),
                             backend_index(extargs)};
    return backward(args, v3::flash::attn_bwd_params::kVersion, stream);
  });
}

hipError_t attn_bwd_fused(T4, T4, T4, T4, float, T4, T4, T4, T4, T4, T4, T2, float, T0, T0, int64_t, bool, Stream,
                          FusedBwdExtraArguments*) noexcept {
  return guarded([&] {
    return finish(bridge::seed_not_supported(
        "attn_bwd_fused: the kernels here need a delta workspace and the library never allocates device memory; "
        "call attn_bwd with a (B * Hq, Sq) fp32 delta"));
  });
}

hipError_t attn_bwd_compact_varlen(T4 q, T4 k, T4 v, T1 cu_seqlens_q, T1 cu_seqlens_k, int32_t max_seqlen_q,
                                   int32_t max_seqlen_k, T4 b, float sm_scale, T4 out, T4 dout, T4 dq, T4 dk, T4 dv,
                                   T4 db, T2 softmax_lse, T2 delta, float dropout_p, T0 philox_seed,
                                   T0 philox_offset1, int64_t philox_offset2, bool is_causal, Stream stream,
                                   BwdExtraArguments* extargs) noexcept {
  return guarded([&] {
    bridge::SeedBwdArgs args{b4(q), b4(k), b4(v), b4(b), sm_scale, b4(out), b4(dout), b4(dk), b4(dv), b4(dq), b4(db),
                             b2(softmax_lse), b2(delta),
                             v2_shape(is_causal, true, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                             dropout_of(dropout_p, philox_seed, philox_offset1, static_cast<uint64_t>(philox_offset2), true),
                             backend_index(extargs)};
    return backward(args, v3::flash::attn_bwd_params::kVersion, stream);
  });
}

hipError_t debug_simulate_encoded_softmax(T4 r, float dropout_p, T0 philox_seed, T0 philox_offset1,
                                          uint64_t philox_offset2, Stream stream) noexcept {
  return guarded([&] {
    return finish(bridge::seed_debug_simulate_encoded_softmax(
        b4(r), dropout_of(dropout_p, philox_seed, philox_offset1, philox_offset2, false), stream_spec(stream)));
  });
}

}  // namespace flash
}  // namespace v2

namespace v3 {
namespace flash {

hipError_t attn_fwd(const attn_fwd_params& p, int32_t params_version, Stream stream,
                    const attn_options* options) noexcept {
  return guarded([&] {
    bridge::SeedFwdArgs args{b4(p.Q), b4(p.K), b4(p.V), b4(p.B), b2(p.A), p.Sm_scale, b2(p.L), b4(p.Out),
                             shape_of(p.causal_type, p.window_left, p.window_right, p.varlen_type, p.cu_seqlens_q,
                                      p.cu_seqlens_k, p.Max_seqlen_q, p.Max_seqlen_k),
                             dropout_of(p.dropout_p, p.philox_seed_ptr, p.philox_offset1, p.philox_offset2, false),
                             b0(p.philox_seed_output), b0(p.philox_offset_output), b4(p.encoded_softmax),
                             options == nullptr ? -1 : options->force_backend_index};
    return forward(args, params_version, stream);
  });
}

hipError_t attn_bwd(const attn_bwd_params& p, int32_t params_version, Stream stream,
                    const attn_options* options) noexcept {
  return guarded([&] {
    bridge::SeedBwdArgs args{b4(p.Q), b4(p.K), b4(p.V), b4(p.B), p.Sm_scale, b4(p.Out), b4(p.DO), b4(p.DK), b4(p.DV),
                             b4(p.DQ), b4(p.DB), b2(p.L), b2(p.D),
                             shape_of(p.causal_type, p.window_left, p.window_right, p.varlen_type, p.cu_seqlens_q,
                                      p.cu_seqlens_k, p.Max_seqlen_q, p.Max_seqlen_k),
                             dropout_of(p.dropout_p, p.philox_seed_ptr, p.philox_offset1, p.philox_offset2, false),
                             options == nullptr ? -1 : options->force_backend_index};
    return backward(args, params_version, stream);
  });
}

}  // namespace flash
}  // namespace v3
}  // namespace aotriton
