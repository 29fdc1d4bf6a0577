// A C ABI over aotriton::v2::flash::attn_fwd / attn_bwd / debug_dropout_mask for ctypes (bench/bench_attn.py,
// bench/grad_check.py): primitive types only.
// Build (see CMakeLists.txt here):
//   cmake -S bench -B /tmp/bench -G Ninja -DCMAKE_PREFIX_PATH=<aotriton install prefix> && ninja -C /tmp/bench
// or directly:
//   g++ -O2 -std=c++17 -shared -fPIC bench/shim.cpp -I<prefix>/include -L<prefix>/lib -laotriton
//       -Wl,-rpath,<prefix>/lib -o libaotriton_shim.so
//
// Common conventions: tensors are device pointers with their sizes and element strides passed
// as int64 arrays, 4 per B x H x S x D tensor and 3 per B x Hq x Sq fp32 row tensor (lse, delta),
// in the order the tensors are listed. dtype: 1 fp16, 2 bf16, 3 fp32 (aotriton::DType). Masks: causal
// (0/1), align (0 top-left, 1 bottom-right), window_left / window_right (-1 = unbounded), with
// the semantics of aotriton/flash.h. stream: a CUstream (0 = legacy default stream). Each call
// returns the aotriton::Status value (0 = success); aotriton_shim_last_error() tells why not.
#include <cstdint>

#include "aotriton/flash.h"
#include "aotriton/runtime.h"

// The library is built with hidden visibility (CMakeLists.txt); only these C entry points are exported.
#define SHIM_EXPORT __attribute__((visibility("default")))

namespace {

template <int R>
aotriton::TensorView<R> make_view(uint64_t ptr, const int64_t* sizes, const int64_t* strides, aotriton::DType dtype) {
  aotriton::TensorView<R> t;
  t.data = reinterpret_cast<const void*>(static_cast<uintptr_t>(ptr));
  for (int d = 0; d < R; ++d) {
    t.sizes[d] = static_cast<uint64_t>(sizes[d]);
    t.strides[d] = strides[d];
  }
  t.dtype = dtype;
  return t;
}

aotriton::Stream make_stream(uint64_t stream) {
  return aotriton::Stream{reinterpret_cast<CUstream_st*>(static_cast<uintptr_t>(stream))};
}

}  // namespace

extern "C" {

// The tuner's override (aotriton::tuning::force_kernel): a kernel id, or nullptr to clear.
SHIM_EXPORT int aotriton_shim_force_kernel(const char* kernel_id) {
  return static_cast<int>(aotriton::tuning::force_kernel(kernel_id));
}

// aotriton::tuning::forced_count: kernels launched in place of dispatch's choice so far.
SHIM_EXPORT uint64_t aotriton_shim_forced_count() { return aotriton::tuning::forced_count(); }

// aotriton::tuning::use_database: 1 follows the tuning database, 0 only the heuristic.
SHIM_EXPORT void aotriton_shim_use_database(int on) { aotriton::tuning::use_database(on != 0); }

// attn_fwd: q, k, v, o sizes/strides in `sizes4` / `strides4` (16 int64 each); lse B x Hq x Sq
// fp32 (0 = not wanted). attn_bwd: q, k, v, o, d_o, dq, dk, dv (32 int64 each), then lse and
// delta in `rows_sizes3` / `rows_strides3` (6 each). Both (FwdParams v3 / BwdParams v2) then take
//   bias, bias_sizes4, bias_strides4      additive bias (0 = none), [B|1, Hq|1, Sq|1, Sk]
//   (bwd) dbias                           its gradient (0 = none), same sizes/strides as bias
//   dropout_p, philox_seed, philox_offset device addresses of u64 seed / offset (dropout_p 0 = off)
//   philox_offset_base
//   (fwd) philox_seed_out, philox_offset_out (0 = not wanted)
//   cu_seqlens_q, cu_seqlens_k, n_cu      int32 device offsets (B+1 = n_cu entries; 0 = not packed)
//   max_seqlen_q, max_seqlen_k
//   allow_tf32, (bwd) deterministic
//   backend                               0 auto, 1 portable, 2 gluon (aotriton::v2::flash::Backend)
//   (bwd) workspace, workspace_bytes      the backward's workspace (0 = none)
//   (bwd) query_bytes                     when not null: store attn_bwd_workspace_bytes() there, launch nothing
// The shim's own dtype codes (1 fp16, 2 bf16, 3 fp32: aotriton_shim.py), mapped by name: the
// library's DType values follow the seed's numbering and must not be assumed.
static aotriton::DType shim_dtype(int code) {
  switch (code) {
    case 1: return aotriton::DType::kFloat16;
    case 2: return aotriton::DType::kBFloat16;
    case 3: return aotriton::DType::kFloat32;
    default: return aotriton::DType::kUnknown;
  }
}

// dtype: 1 fp16, 2 bf16, 3 fp32.
SHIM_EXPORT int aotriton_shim_attn_fwd_ex(
    uint64_t q, uint64_t k, uint64_t v, uint64_t o, uint64_t lse, const int64_t* sizes4,
    const int64_t* strides4, const int64_t* lse_sizes3, const int64_t* lse_strides3, int dtype,
    float sm_scale, int causal, int align, int window_left, int window_right, uint64_t bias,
    const int64_t* bias_sizes4, const int64_t* bias_strides4, float dropout_p, uint64_t philox_seed,
    uint64_t philox_offset, uint64_t philox_offset_base, uint64_t philox_seed_out, uint64_t philox_offset_out,
    uint64_t cu_seqlens_q, uint64_t cu_seqlens_k, int64_t n_cu, uint64_t max_seqlen_q, uint64_t max_seqlen_k,
    int allow_tf32, int backend, uint64_t stream) {
  const auto dt = shim_dtype(dtype);
  aotriton::v2::flash::FwdParams p;
  p.q = make_view<4>(q, sizes4 + 0, strides4 + 0, dt);
  p.k = make_view<4>(k, sizes4 + 4, strides4 + 4, dt);
  p.v = make_view<4>(v, sizes4 + 8, strides4 + 8, dt);
  p.o = make_view<4>(o, sizes4 + 12, strides4 + 12, dt);
  p.lse = make_view<3>(lse, lse_sizes3, lse_strides3, aotriton::DType::kFloat32);
  p.sm_scale = sm_scale;
  p.causal = causal != 0;
  p.align = align ? aotriton::v2::flash::MaskAlign::kBottomRight : aotriton::v2::flash::MaskAlign::kTopLeft;
  p.window_left = window_left;
  p.window_right = window_right;
  if (bias) p.bias = make_view<4>(bias, bias_sizes4, bias_strides4, dt);
  p.dropout_p = dropout_p;
  p.philox_seed = reinterpret_cast<const void*>(static_cast<uintptr_t>(philox_seed));
  p.philox_offset = reinterpret_cast<const void*>(static_cast<uintptr_t>(philox_offset));
  p.philox_offset_base = philox_offset_base;
  p.philox_seed_out = reinterpret_cast<void*>(static_cast<uintptr_t>(philox_seed_out));
  p.philox_offset_out = reinterpret_cast<void*>(static_cast<uintptr_t>(philox_offset_out));
  if (cu_seqlens_q) {
    const int64_t n[1] = {n_cu}, one[1] = {1};
    p.cu_seqlens_q = make_view<1>(cu_seqlens_q, n, one, aotriton::DType::kInt32);
    p.cu_seqlens_k = make_view<1>(cu_seqlens_k, n, one, aotriton::DType::kInt32);
    p.max_seqlen_q = max_seqlen_q;
    p.max_seqlen_k = max_seqlen_k;
  }
  p.allow_tf32 = allow_tf32 != 0;
  p.backend = static_cast<aotriton::v2::flash::Backend>(backend);
  return static_cast<int>(aotriton::v2::flash::attn_fwd(p, make_stream(stream)));
}

SHIM_EXPORT int aotriton_shim_attn_bwd_ex(
    uint64_t q, uint64_t k, uint64_t v, uint64_t o, uint64_t d_o, uint64_t dq, uint64_t dk, uint64_t dv,
    uint64_t lse, uint64_t delta, const int64_t* sizes4, const int64_t* strides4, const int64_t* rows_sizes3,
    const int64_t* rows_strides3, int dtype, float sm_scale, int causal, int align, int window_left,
    int window_right, uint64_t bias, const int64_t* bias_sizes4, const int64_t* bias_strides4, uint64_t dbias,
    float dropout_p, uint64_t philox_seed, uint64_t philox_offset, uint64_t philox_offset_base,
    uint64_t cu_seqlens_q, uint64_t cu_seqlens_k, int64_t n_cu, uint64_t max_seqlen_q, uint64_t max_seqlen_k,
    int allow_tf32, int deterministic, int backend, uint64_t workspace, uint64_t workspace_bytes,
    uint64_t* query_bytes, uint64_t stream) {
  const auto dt = shim_dtype(dtype);
  aotriton::v2::flash::BwdParams p;
  p.q = make_view<4>(q, sizes4 + 0, strides4 + 0, dt);
  p.k = make_view<4>(k, sizes4 + 4, strides4 + 4, dt);
  p.v = make_view<4>(v, sizes4 + 8, strides4 + 8, dt);
  p.o = make_view<4>(o, sizes4 + 12, strides4 + 12, dt);
  p.d_o = make_view<4>(d_o, sizes4 + 16, strides4 + 16, dt);
  p.dq = make_view<4>(dq, sizes4 + 20, strides4 + 20, dt);
  p.dk = make_view<4>(dk, sizes4 + 24, strides4 + 24, dt);
  p.dv = make_view<4>(dv, sizes4 + 28, strides4 + 28, dt);
  p.lse = make_view<3>(lse, rows_sizes3 + 0, rows_strides3 + 0, aotriton::DType::kFloat32);
  p.delta = make_view<3>(delta, rows_sizes3 + 3, rows_strides3 + 3, aotriton::DType::kFloat32);
  p.sm_scale = sm_scale;
  p.causal = causal != 0;
  p.align = align ? aotriton::v2::flash::MaskAlign::kBottomRight : aotriton::v2::flash::MaskAlign::kTopLeft;
  p.window_left = window_left;
  p.window_right = window_right;
  if (bias) p.bias = make_view<4>(bias, bias_sizes4, bias_strides4, dt);
  if (dbias) p.dbias = make_view<4>(dbias, bias_sizes4, bias_strides4, dt);
  p.dropout_p = dropout_p;
  p.philox_seed = reinterpret_cast<const void*>(static_cast<uintptr_t>(philox_seed));
  p.philox_offset = reinterpret_cast<const void*>(static_cast<uintptr_t>(philox_offset));
  p.philox_offset_base = philox_offset_base;
  if (cu_seqlens_q) {
    const int64_t n[1] = {n_cu}, one[1] = {1};
    p.cu_seqlens_q = make_view<1>(cu_seqlens_q, n, one, aotriton::DType::kInt32);
    p.cu_seqlens_k = make_view<1>(cu_seqlens_k, n, one, aotriton::DType::kInt32);
    p.max_seqlen_q = max_seqlen_q;
    p.max_seqlen_k = max_seqlen_k;
  }
  p.allow_tf32 = allow_tf32 != 0;
  p.deterministic = deterministic != 0;
  p.backend = static_cast<aotriton::v2::flash::Backend>(backend);
  p.workspace = reinterpret_cast<void*>(static_cast<uintptr_t>(workspace));
  p.workspace_bytes = workspace_bytes;
  if (query_bytes) {
    return static_cast<int>(aotriton::v2::flash::attn_bwd_workspace_bytes(p, make_stream(stream), query_bytes));
  }
  return static_cast<int>(aotriton::v2::flash::attn_bwd(p, make_stream(stream)));
}

// out: fp32 B x H x Sq x Sk (sizes4 / strides4); 1.0 where dropout keeps an element, 0.0 where not.
SHIM_EXPORT int aotriton_shim_debug_dropout_mask(uint64_t out, const int64_t* sizes4,
                                                                            const int64_t* strides4, float dropout_p,
                                                                            uint64_t philox_seed, uint64_t philox_offset,
                                                                            uint64_t philox_offset_base, uint64_t stream) {
  return static_cast<int>(aotriton::v2::flash::debug_dropout_mask(
      make_view<4>(out, sizes4, strides4, aotriton::DType::kFloat32), dropout_p,
      reinterpret_cast<const void*>(static_cast<uintptr_t>(philox_seed)),
      reinterpret_cast<const void*>(static_cast<uintptr_t>(philox_offset)), philox_offset_base, make_stream(stream)));
}

// The Philox counters one call consumes; 0 when the count overflows (such calls are refused).
SHIM_EXPORT uint64_t aotriton_shim_dropout_offsets_consumed(uint64_t b, uint64_t h,
                                                                                      uint64_t sq, uint64_t sk) {
  uint64_t count = 0;
  if (aotriton::v2::flash::dropout_offsets_consumed(b, h, sq, sk, &count) != aotriton::Status::kSuccess) {
    return 0;
  }
  return count;
}

// The calling thread's last error message (empty after a success).
SHIM_EXPORT const char* aotriton_shim_last_error() {
  return aotriton::last_error_message();
}

SHIM_EXPORT const char* aotriton_shim_version() { return aotriton::version(); }

}  // extern "C"
