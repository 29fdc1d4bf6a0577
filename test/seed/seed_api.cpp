// The seed-compatible API (ROCm/aotriton 0.10 level, include/aotriton/flash.h) called the way
// PyTorch's ROCm adapter calls it: BSHD tensors viewed as BHSD (permute, no copy), LSE and delta
// as (B * Hq, Sq) fp32 (compact varlen: (Hq, total_q)), the dropout seed and offset as device
// scalars (offset = *offset1 + offset2) with seed/offset outputs, the version macros of
// <aotriton/config.h>, check_gpu on the stream, hipError_t results. Built against an installed
// tree (-laotriton_v2, <prefix>/include), by test/seed/CMakeLists.txt and by the ExternalProject
// test in test/seed/external/.
//
// Three parts:
// 1. Host checks (always): the macros, the types (DType numbering, TensorView<0>, implicit
//    Stream from a hipStream_t), and refusals that launch nothing: an unknown params_version
//    (hipErrorInvalidSymbol), a padded varlen, attn_bwd_fused, a forced backend
//    (hipErrorNotSupported), an int8 q (hipErrorInvalidValue naming q).
// 2. HIP (the recording HIP double, when AOTRITON_HIP_DOUBLE_LOG names its log and
//    AOTRITON_HIP_LIBRARY the double): check_gpu says the gfx942 device is served, and every seed
//    call launches exactly what the library's own API launches for the same problem (the
//    double's launch records, kernarg bytes included, compared; their correctness against the
//    archives' metadata is test/amd's recorded_launches). Without the double: "skipped".
// 3. CUDA (a GPU and its driver): the seed calls on a CUDA stream against a float64 CPU
//    reference, random inputs, outputs poisoned with NaN, the error bounded by that of the same
//    math done naively in bf16: max|out - ref| <= k * max|naive - ref| + floor (k = 3 for O and
//    LSE, 5 for gradients). Without one: "skipped: no GPU".
// Exit status 0 when every part passed or was skipped, 1 otherwise; `--require-gpu` makes a
// missing CUDA GPU a failure (for the GPU machine's run).
#include <aotriton/config.h>
#include <aotriton/dtypes.h>
#include <aotriton/flash.h>
#include <aotriton/runtime.h>
#include <aotriton/util.h>
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

// What PyTorch's adapter checks before using the v3 API.
#if AOTRITON_VERSION_MINOR < 9 && AOTRITON_VERSION_MAJOR == 0
#error "the seed's callers require AOTriton >= 0.9"
#endif
#if (AOTRITON_VERSION_MAJOR * 100 + AOTRITON_VERSION_MINOR) < 10
#error "the v3 API needs AOTRITON_VERSION >= 0.10"
#endif
#ifndef AOTRITON_LIBRARY_VERSION_STRING
#error "<aotriton/config.h> lacks the library's own version"
#endif

namespace {

using aotriton::DType;
using aotriton::TensorView;
namespace v2 = aotriton::v2::flash;
namespace v3 = aotriton::v3::flash;
using T4 = TensorView<4>;
using T2 = TensorView<2>;
using T1 = TensorView<1>;
using T0 = TensorView<0>;

int g_failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

std::string said(hipError_t e) {
  return "hipError " + std::to_string(static_cast<int>(e)) + " (" + aotriton::last_error_message() + ")";
}

// ---- Views as the adapter builds them -----------------------------------------------------
// A contiguous B x S x H x D tensor permuted to B x H x S x D.
T4 bshd(uint64_t addr, uint64_t b, uint64_t s, uint64_t h, uint64_t d, DType dtype) {
  return T4(static_cast<intptr_t>(addr), {b, h, s, d}, {s * h * d, d, h * d, 1}, dtype);
}
// A packed total x H x D tensor as 1 x H x total x D (unsqueeze(0).transpose(1, 2)).
T4 packed(uint64_t addr, uint64_t total, uint64_t h, uint64_t d, DType dtype) {
  return T4(static_cast<intptr_t>(addr), {1, h, total, d}, {total * h * d, d, h * d, 1}, dtype);
}
T2 rows2(uint64_t addr, uint64_t r, uint64_t c) {
  return T2(static_cast<intptr_t>(addr), {r, c}, {c, 1}, DType::kFloat32);
}
T1 offsets(uint64_t addr, uint64_t n) { return T1(static_cast<intptr_t>(addr), {n}, {1}, DType::kInt32); }
T0 u64(uint64_t addr) { return T0(static_cast<intptr_t>(addr), DType::kUInt64); }
T0 i64(uint64_t addr) { return T0(static_cast<intptr_t>(addr), DType::kInt64); }
T4 empty4(DType dtype) { return T4(0, {0, 0, 0, 0}, {0, 0, 0, 0}, dtype); }
// The library's own B x Hq x Sq row view of the same memory as a (B * Hq, Sq) T2.
TensorView<3> rows3(uint64_t addr, uint64_t b, uint64_t h, uint64_t s) {
  const uint64_t sizes[3] = {b, h, s};
  return TensorView<3>::contiguous(reinterpret_cast<const void*>(static_cast<uintptr_t>(addr)), sizes, DType::kFloat32);
}
const void* ptr(uint64_t addr) { return reinterpret_cast<const void*>(static_cast<uintptr_t>(addr)); }

// ---- 1. Host checks ------------------------------------------------------------------------
void host_checks() {
  static_assert(static_cast<int>(DType::kFloat32) == 1 && static_cast<int>(DType::kFloat16) == 2 &&
                    static_cast<int>(DType::kBFloat16) == 3 && static_cast<int>(DType::kInt32) == 12 &&
                    static_cast<int>(DType::kUInt64) == 23,
                "the seed's DType numbering");
  static_assert(std::is_convertible<ihipStream_t*, aotriton::Stream>::value, "a hipStream_t converts to Stream");
  static_assert(!std::is_convertible<CUstream_st*, aotriton::Stream>::value, "a CUDA stream only explicitly");
  static_assert(v3::attn_fwd_params::kVersion == 1 && v3::attn_bwd_params::kVersion == 1, "the 0.10 params");
  expect(AOTRITON_VERSION_MAJOR == 0 && AOTRITON_VERSION_MINOR == 10, "config.h: seed API level 0.10");
  expect(std::string(aotriton::version()).rfind(AOTRITON_LIBRARY_VERSION_STRING, 0) == 0,
         std::string("config.h: library version ") + AOTRITON_LIBRARY_VERSION_STRING + " = aotriton::version() " +
             aotriton::version());

  ihipStream_t* hip = reinterpret_cast<ihipStream_t*>(static_cast<uintptr_t>(0x5000));
  const DType f16 = DType::kFloat16;
  v3::attn_fwd_params p;
  p.Q = bshd(0x10000000, 2, 64, 4, 64, f16);
  p.K = bshd(0x20000000, 2, 64, 4, 64, f16);
  p.V = bshd(0x30000000, 2, 64, 4, 64, f16);
  p.Out = bshd(0x40000000, 2, 64, 4, 64, f16);
  p.L = rows2(0x50000000, 8, 64);
  p.Sm_scale = 0.125f;
  hipError_t e = v3::attn_fwd(p, 2, hip);
  expect(e == hipErrorInvalidSymbol, "v3 attn_fwd params_version 2 -> hipErrorInvalidSymbol: " + said(e));
  v3::attn_fwd_params padded = p;
  padded.varlen_type = v3::VarlenType::PaddedVarlen;
  e = v3::attn_fwd(padded, v3::attn_fwd_params::kVersion, hip);
  expect(e == hipErrorNotSupported, "v3 attn_fwd PaddedVarlen -> hipErrorNotSupported: " + said(e));
  v3::attn_options forced;
  forced.force_backend_index = 0;
  e = v3::attn_fwd(p, v3::attn_fwd_params::kVersion, hip, &forced);
  expect(e == hipErrorNotSupported, "v3 attn_fwd force_backend_index 0 -> hipErrorNotSupported: " + said(e));
  v3::attn_fwd_params int8 = p;
  int8.Q.dtype = DType::kInt8;
  e = v3::attn_fwd(int8, v3::attn_fwd_params::kVersion, hip);
  expect(e == hipErrorInvalidValue && std::string(aotriton::last_error_message()).find("q") != std::string::npos,
         "v3 attn_fwd int8 q -> hipErrorInvalidValue naming q: " + said(e));
  T4 none = empty4(f16);
  e = v2::attn_bwd_fused(p.Q, p.K, p.V, none, 0.125f, p.Out, p.Out, p.Q, p.K, p.V, none, p.L, 0.0f, i64(0), i64(0), 0,
                         false, hip);
  expect(e == hipErrorNotSupported, "v2 attn_bwd_fused -> hipErrorNotSupported: " + said(e));
  e = v2::attn_fwd(p.Q, p.K, p.V, none, 0.125f, p.L, p.Out, 0.5f, i64(0xd0000000), i64(0xd0000010), -1, u64(0),
                   u64(0), none, false, u64(0), hip);
  expect(e == hipErrorInvalidValue, "v2 attn_fwd with a negative philox_offset2 -> hipErrorInvalidValue: " + said(e));
}

// ---- 2. HIP: the recording double ----------------------------------------------------------
// The launch records the double appended to its log since the last call, without the function
// handle (which depends on load order).
struct Log {
  std::string path;
  std::streamoff at = 0;

  std::vector<std::string> launches() {
    std::ifstream in(path);
    in.seekg(at);
    std::vector<std::string> out;
    std::string line;
    while (std::getline(in, line)) {
      if (line.find("\"call\":\"hipModuleLaunchKernel\"") == std::string::npos) continue;
      const size_t f = line.find("\"function\":");
      if (f != std::string::npos) {
        size_t end = line.find_first_of(",}", f);
        if (end != std::string::npos && line[end] == ',') ++end;
        line.erase(f, end - f);
      }
      out.push_back(line);
    }
    in.clear();
    in.seekg(0, std::ios::end);
    at = in.tellg();
    return out;
  }
};

// Runs the seed call and the library's own call of the same problem; both must succeed and
// launch the same kernels with the same arguments.
template <typename Seed, typename Own>
void same_launches(Log& log, const std::string& what, Seed seed_call, Own own_call) {
  log.launches();
  const hipError_t e = seed_call();
  const std::vector<std::string> seed = log.launches();
  const aotriton::Status s = own_call();
  const std::vector<std::string> own = log.launches();
  if (e != hipSuccess || s != aotriton::Status::kSuccess) {
    expect(false, "HIP " + what + ": seed " + said(e) + ", own " + aotriton::status_name(s));
    return;
  }
  expect(!seed.empty() && seed == own, "HIP " + what + ": " + std::to_string(seed.size()) + " launches, the same as the own API's (" +
                                           std::to_string(own.size()) + ")");
}

constexpr uint64_t kQ = 0x10000000, kK = 0x20000000, kV = 0x30000000, kO = 0x40000000, kLse = 0x50000000,
                   kDo = 0x60000000, kDelta = 0x70000000, kDq = 0x80000000, kDk = 0x90000000, kDv = 0xa0000000,
                   kSeed = 0xd0000000, kOffset = 0xd0000010, kSeedOut = 0xd0000020, kOffsetOut = 0xd0000030,
                   kCuQ = 0xe0000000, kCuK = 0xe0001000, kMask = 0xf0000000;

void hip_double() {
  const char* log_path = std::getenv("AOTRITON_HIP_DOUBLE_LOG");
  ihipStream_t* stream = reinterpret_cast<ihipStream_t*>(static_cast<uintptr_t>(0x5000));
  hipError_t e = v2::check_gpu(stream);
  if (log_path == nullptr || *log_path == 0) {
    expect(!aotriton::isArchExperimentallySupported(stream) && aotriton::getMultiProcessorCount(stream) == 0,
           "HIP without a device: isArchExperimentallySupported false, getMultiProcessorCount 0");
    std::printf("HIP: skipped: no recording HIP double (AOTRITON_HIP_DOUBLE_LOG); check_gpu said %s\n", said(e).c_str());
    return;
  }
  if (e == hipErrorNoBinaryForGpu) {
    std::printf("HIP: skipped: this build has no kernels for the double's gfx942 (%s)\n", said(e).c_str());
    return;
  }
  expect(e == hipSuccess, "HIP check_gpu on the double's gfx942: " + said(e));
  if (e != hipSuccess) return;
  expect(aotriton::isArchExperimentallySupported(stream), "HIP isArchExperimentallySupported: gfx942 has not run on hardware");
  const int units = aotriton::getMultiProcessorCount(stream);
  expect(units == 304, "HIP getMultiProcessorCount: " + std::to_string(units) + " (the double's 304)");
  Log log{log_path};
  const DType f16 = DType::kFloat16;
  const uint64_t B = 2, HQ = 4, HK = 2, SQ = 128, SK = 96, D = 64;
  const float scale = 0.125f;
  const T4 q = bshd(kQ, B, SQ, HQ, D, f16), k = bshd(kK, B, SK, HK, D, f16), v = bshd(kV, B, SK, HK, D, f16);
  const T4 o = bshd(kO, B, SQ, HQ, D, f16), d_o = bshd(kDo, B, SQ, HQ, D, f16);
  const T4 dq = bshd(kDq, B, SQ, HQ, D, f16), dk = bshd(kDk, B, SK, HK, D, f16), dv = bshd(kDv, B, SK, HK, D, f16);
  const T2 lse = rows2(kLse, B * HQ, SQ), delta = rows2(kDelta, B * HQ, SQ);
  const T4 none = empty4(f16);
  const T0 no_scalar = u64(0);

  auto own_fwd = [&] {
    v2::FwdParams p;
    p.q = q, p.k = k, p.v = v, p.o = o, p.lse = rows3(kLse, B, HQ, SQ), p.sm_scale = scale;
    return p;
  };
  auto own_bwd = [&] {
    v2::BwdParams p;
    p.q = q, p.k = k, p.v = v, p.o = o, p.d_o = d_o, p.dq = dq, p.dk = dk, p.dv = dv;
    p.lse = rows3(kLse, B, HQ, SQ), p.delta = rows3(kDelta, B, HQ, SQ), p.sm_scale = scale;
    return p;
  };
  aotriton::Stream own_stream{stream};

  same_launches(
      log, "v2 attn_fwd causal (top-left)",
      [&] {
        return v2::attn_fwd(q, k, v, none, scale, lse, o, 0.0f, i64(kSeed), i64(kOffset), 0, no_scalar, no_scalar, none,
                            true, u64(0xd0000040), stream);
      },
      [&] {
        v2::FwdParams p = own_fwd();
        p.causal = true;
        return v2::attn_fwd(p, own_stream);
      });
  same_launches(
      log, "v2 attn_fwd dropout 0.25, offset2 5, seed/offset outputs",
      [&] {
        return v2::attn_fwd(q, k, v, none, scale, lse, o, 0.25f, i64(kSeed), i64(kOffset), 5, u64(kSeedOut),
                            u64(kOffsetOut), none, false, no_scalar, stream);
      },
      [&] {
        v2::FwdParams p = own_fwd();
        p.dropout_p = 0.25f, p.philox_seed = ptr(kSeed), p.philox_offset = ptr(kOffset), p.philox_offset_base = 5;
        p.philox_seed_out = const_cast<void*>(ptr(kSeedOut)), p.philox_offset_out = const_cast<void*>(ptr(kOffsetOut));
        return v2::attn_fwd(p, own_stream);
      });
  same_launches(
      log, "v2 attn_fwd with encoded_softmax (fp32 keep-mask)",
      [&] {
        const T4 mask(static_cast<intptr_t>(kMask), {B, HQ, SQ, SK}, {HQ * SQ * SK, SQ * SK, SK, 1}, DType::kFloat32);
        return v2::attn_fwd(q, k, v, none, scale, lse, o, 0.25f, i64(kSeed), i64(kOffset), 5, no_scalar, no_scalar, mask,
                            false, no_scalar, stream);
      },
      [&] {
        v2::FwdParams p = own_fwd();
        p.dropout_p = 0.25f, p.philox_seed = ptr(kSeed), p.philox_offset = ptr(kOffset), p.philox_offset_base = 5;
        aotriton::Status s = v2::attn_fwd(p, own_stream);
        if (s != aotriton::Status::kSuccess) return s;
        const uint64_t sizes[4] = {B, HQ, SQ, SK};
        return v2::debug_dropout_mask(TensorView<4>::contiguous(ptr(kMask), sizes, DType::kFloat32), 0.25f, ptr(kSeed),
                                      ptr(kOffset), 5, own_stream);
      });
  same_launches(
      log, "v2 attn_bwd causal with delta",
      [&] {
        return v2::attn_bwd(q, k, v, none, scale, o, d_o, dq, dk, dv, none, lse, delta, 0.0f, i64(kSeed), i64(kOffset), 0,
                            true, stream);
      },
      [&] {
        v2::BwdParams p = own_bwd();
        p.causal = true;
        return v2::attn_bwd(p, own_stream);
      });
  same_launches(
      log, "debug_simulate_encoded_softmax",
      [&] {
        const T4 r(static_cast<intptr_t>(kMask), {B, HQ, SQ, SK}, {HQ * SQ * SK, SQ * SK, SK, 1}, DType::kFloat32);
        return v2::debug_simulate_encoded_softmax(r, 0.25f, i64(kSeed), i64(kOffset), 9, stream);
      },
      [&] {
        const uint64_t sizes[4] = {B, HQ, SQ, SK};
        return v2::debug_dropout_mask(TensorView<4>::contiguous(ptr(kMask), sizes, DType::kFloat32), 0.25f, ptr(kSeed),
                                      ptr(kOffset), 9, own_stream);
      });

  // Packed: two sequences, 300 query tokens (max 200), 250 key tokens (max 150).
  const uint64_t TQ = 300, TK = 250, MAXQ = 200, MAXK = 150, NB = 2;
  const T4 pq = packed(kQ, TQ, HQ, D, f16), pk = packed(kK, TK, HK, D, f16), pv = packed(kV, TK, HK, D, f16);
  const T4 po = packed(kO, TQ, HQ, D, f16), pdo = packed(kDo, TQ, HQ, D, f16);
  const T4 pdq = packed(kDq, TQ, HQ, D, f16), pdk = packed(kDk, TK, HK, D, f16), pdv = packed(kDv, TK, HK, D, f16);
  const T1 cu_q = offsets(kCuQ, NB + 1), cu_k = offsets(kCuK, NB + 1);
  // The 0.10 callers' (B * Hq, max_seqlen_q) LSE buffer, holding (Hq, total_q).
  const T2 plse = rows2(kLse, NB * HQ, MAXQ);
  auto own_packed = [&](auto& p) {
    p.q = pq, p.k = pk, p.v = pv, p.o = po, p.sm_scale = scale, p.causal = true;
    p.cu_seqlens_q = cu_q, p.cu_seqlens_k = cu_k, p.max_seqlen_q = MAXQ, p.max_seqlen_k = MAXK;
    p.lse = rows3(kLse, 1, HQ, TQ);
  };
  same_launches(
      log, "v2 attn_fwd_compact_varlen causal, LSE (B * Hq, max_seqlen_q)",
      [&] {
        return v2::attn_fwd_compact_varlen(pq, pk, pv, none, cu_q, cu_k, MAXQ, MAXK, scale, plse, po, 0.0f, i64(kSeed),
                                           i64(kOffset), 0, no_scalar, no_scalar, none, true, u64(0xd0000040), stream);
      },
      [&] {
        v2::FwdParams p;
        own_packed(p);
        return v2::attn_fwd(p, own_stream);
      });
  same_launches(
      log, "v2 attn_bwd_compact_varlen causal, LSE (Hq, total_q)",
      [&] {
        return v2::attn_bwd_compact_varlen(pq, pk, pv, cu_q, cu_k, MAXQ, MAXK, none, scale, po, pdo, pdq, pdk, pdv, none,
                                           rows2(kLse, HQ, TQ), rows2(kDelta, HQ, TQ), 0.0f, i64(kSeed), i64(kOffset), 0,
                                           true, stream);
      },
      [&] {
        v2::BwdParams p;
        own_packed(p);
        p.d_o = pdo, p.dq = pdq, p.dk = pdk, p.dv = pdv, p.delta = rows3(kDelta, 1, HQ, TQ);
        return v2::attn_bwd(p, own_stream);
      });

  // v3: a sliding window of 32 keys to the left of the bottom-right diagonal, with dropout.
  v3::attn_fwd_params f;
  f.Q = q, f.K = k, f.V = v, f.Out = o, f.L = lse, f.Sm_scale = scale;
  f.Max_seqlen_q = SQ, f.Max_seqlen_k = SK;
  f.dropout_p = 0.1f, f.philox_seed_ptr = i64(kSeed), f.philox_offset1 = i64(kOffset), f.philox_offset2 = 3;
  f.philox_seed_output = u64(kSeedOut), f.philox_offset_output = u64(kOffsetOut), f.encoded_softmax = none;
  f.causal_type = v3::CausalType::WindowedAttention, f.varlen_type = v3::VarlenType::None;
  f.window_left = 32, f.window_right = v3::WindowValue::BottomRightAligned;
  auto own_window = [&](auto& p) {
    p.align = v2::MaskAlign::kBottomRight, p.window_left = 32, p.window_right = 0;
    p.dropout_p = 0.1f, p.philox_seed = ptr(kSeed), p.philox_offset = ptr(kOffset), p.philox_offset_base = 3;
  };
  same_launches(
      log, "v3 attn_fwd window (32, BottomRightAligned), dropout", [&] { return v3::attn_fwd(f, v3::attn_fwd_params::kVersion, stream); },
      [&] {
        v2::FwdParams p = own_fwd();
        own_window(p);
        p.philox_seed_out = const_cast<void*>(ptr(kSeedOut)), p.philox_offset_out = const_cast<void*>(ptr(kOffsetOut));
        return v2::attn_fwd(p, own_stream);
      });
  v3::attn_bwd_params g;
  g.Q = q, g.K = k, g.V = v, g.Out = o, g.DO = d_o, g.DQ = dq, g.DK = dk, g.DV = dv, g.L = lse, g.D = delta;
  g.Sm_scale = scale, g.Max_seqlen_q = SQ, g.Max_seqlen_k = SK;
  g.dropout_p = 0.1f, g.philox_seed_ptr = i64(kSeed), g.philox_offset1 = i64(kOffset), g.philox_offset2 = 3;
  g.causal_type = v3::CausalType::WindowedAttention, g.window_left = 32, g.window_right = v3::WindowValue::BottomRightAligned;
  same_launches(
      log, "v3 attn_bwd window (32, BottomRightAligned), dropout", [&] { return v3::attn_bwd(g, v3::attn_bwd_params::kVersion, stream); },
      [&] {
        v2::BwdParams p = own_bwd();
        own_window(p);
        return v2::attn_bwd(p, own_stream);
      });

  // Refusals launch nothing.
  log.launches();
  v3::attn_fwd_params wrong = f;
  wrong.L = rows2(kLse, B * HQ + 1, SQ);
  e = v3::attn_fwd(wrong, v3::attn_fwd_params::kVersion, stream);
  expect(e == hipErrorInvalidValue && log.launches().empty(), "HIP v3 attn_fwd with L of B * Hq + 1 rows: nothing launched, " + said(e));
}

// ---- 3. CUDA: numerics against float64 ----------------------------------------------------
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUdeviceptr = unsigned long long;

struct Cuda {
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuStreamCreate)(CUstream_st**, unsigned) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream_st*) = nullptr;
  CUresult (*cuMemAlloc_v2)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemFree_v2)(CUdeviceptr) = nullptr;
  CUresult (*cuMemcpyHtoD_v2)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*cuMemcpyDtoH_v2)(void*, CUdeviceptr, size_t) = nullptr;
};
Cuda g_cu;

template <typename F>
bool sym(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

bool load_cuda() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return false;
  return sym(lib, "cuInit", g_cu.cuInit) && sym(lib, "cuDeviceGetCount", g_cu.cuDeviceGetCount) &&
         sym(lib, "cuDeviceGet", g_cu.cuDeviceGet) && sym(lib, "cuDevicePrimaryCtxRetain", g_cu.cuDevicePrimaryCtxRetain) &&
         sym(lib, "cuCtxSetCurrent", g_cu.cuCtxSetCurrent) && sym(lib, "cuStreamCreate", g_cu.cuStreamCreate) &&
         sym(lib, "cuStreamSynchronize", g_cu.cuStreamSynchronize) && sym(lib, "cuMemAlloc_v2", g_cu.cuMemAlloc_v2) &&
         sym(lib, "cuMemFree_v2", g_cu.cuMemFree_v2) && sym(lib, "cuMemcpyHtoD_v2", g_cu.cuMemcpyHtoD_v2) &&
         sym(lib, "cuMemcpyDtoH_v2", g_cu.cuMemcpyDtoH_v2);
}

// Synchronous copies on the legacy default stream; the test's stream is a blocking one (flags
// 0), so its launches are ordered after them.
struct Buf {
  CUdeviceptr addr = 0;
  size_t bytes = 0;
  explicit Buf(size_t n) : bytes(n) {
    if (g_cu.cuMemAlloc_v2(&addr, std::max<size_t>(n, 16)) != 0) throw std::runtime_error("cuMemAlloc failed");
  }
  ~Buf() { g_cu.cuMemFree_v2(addr); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  template <typename T>
  void put(const std::vector<T>& h) {
    if (g_cu.cuMemcpyHtoD_v2(addr, h.data(), h.size() * sizeof(T)) != 0) throw std::runtime_error("cuMemcpyHtoD failed");
  }
  template <typename T>
  std::vector<T> get() {
    std::vector<T> h(bytes / sizeof(T));
    if (g_cu.cuMemcpyDtoH_v2(h.data(), addr, h.size() * sizeof(T)) != 0) throw std::runtime_error("cuMemcpyDtoH failed");
    return h;
  }
};

float bf16_to_f32(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}
uint16_t f32_to_bf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((b >> 16) | 0x40);
  b += 0x7fff + ((b >> 16) & 1);
  return static_cast<uint16_t>(b >> 16);
}
float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// One packed or dense problem on the host, BSHD memory: token t of sequence b is row
// seq_q[b] + i (packed) or b * Sq + i (dense).
struct Problem {
  uint64_t hq = 4, hk = 2, d = 64;
  std::vector<uint64_t> lq, lk;  // per-sequence lengths
  bool packed = false;
  double scale = 0.125;
  int32_t left = -1, right = -1;  // window, -1 unbounded
  bool bottom_right = false;
  float p = 0.0f;  // dropout
  uint64_t b() const { return lq.size(); }
  uint64_t max_q() const { return *std::max_element(lq.begin(), lq.end()); }
  uint64_t max_k() const { return *std::max_element(lk.begin(), lk.end()); }
  uint64_t rows_q() const { return packed ? sum(lq) : b() * max_q(); }
  uint64_t rows_k() const { return packed ? sum(lk) : b() * max_k(); }
  static uint64_t sum(const std::vector<uint64_t>& v) {
    uint64_t s = 0;
    for (uint64_t x : v) s += x;
    return s;
  }
  uint64_t start_q(uint64_t s) const { return packed ? sum({lq.begin(), lq.begin() + s}) : s * max_q(); }
  uint64_t start_k(uint64_t s) const { return packed ? sum({lk.begin(), lk.begin() + s}) : s * max_k(); }
  bool sees(uint64_t s, int64_t i, int64_t j) const {
    const int64_t off = bottom_right ? static_cast<int64_t>(lk[s]) - static_cast<int64_t>(lq[s]) : 0;
    return (left < 0 || j >= i + off - left) && (right < 0 || j <= i + off + right);
  }
};

// Results of one forward + backward, in BSHD rows (O, dQ: rows_q x hq x d; dK, dV: rows_k x hk x
// d), LSE per (sequence, head, row).
struct Result {
  std::vector<double> o, dq, dk, dv, lse;
};

// The math in double (`lowp` false) or naively in bf16/fp32 (`lowp` true: inputs as given, P and
// dS rounded to bf16 before their products, sums in float).
Result attention(const Problem& pr, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                 const std::vector<float>& d_o, const std::vector<float>& keep, bool lowp) {
  const uint64_t D = pr.d, HQ = pr.hq, HK = pr.hk, G = HQ / HK;
  Result r;
  r.o.assign(pr.rows_q() * HQ * D, 0.0), r.dq.assign(r.o.size(), 0.0);
  r.dk.assign(pr.rows_k() * HK * D, 0.0), r.dv.assign(r.dk.size(), 0.0);
  r.lse.assign(pr.b() * HQ * pr.max_q(), 0.0);
  auto rnd = [&](double x) { return lowp ? static_cast<double>(round_bf16(static_cast<float>(x))) : x; };
  auto acc = [&](double x) { return lowp ? static_cast<double>(static_cast<float>(x)) : x; };
  const double inv_keep = pr.p > 0 ? 1.0 / (1.0 - pr.p) : 1.0;
  for (uint64_t s = 0; s < pr.b(); ++s) {
    const uint64_t sq = pr.lq[s], sk = pr.lk[s], q0 = pr.start_q(s), k0 = pr.start_k(s);
    for (uint64_t h = 0; h < HQ; ++h) {
      const uint64_t hk = h / G;
      auto Q = [&](uint64_t i, uint64_t c) { return static_cast<double>(q[((q0 + i) * HQ + h) * D + c]); };
      auto K = [&](uint64_t j, uint64_t c) { return static_cast<double>(k[((k0 + j) * HK + hk) * D + c]); };
      auto V = [&](uint64_t j, uint64_t c) { return static_cast<double>(v[((k0 + j) * HK + hk) * D + c]); };
      auto DO = [&](uint64_t i, uint64_t c) { return static_cast<double>(d_o[((q0 + i) * HQ + h) * D + c]); };
      auto KEEP = [&](uint64_t i, uint64_t j) {
        return pr.p > 0 ? static_cast<double>(keep[((s * HQ + h) * pr.max_q() + i) * pr.max_k() + j]) : 1.0;
      };
      std::vector<double> P(sq * sk, 0.0);
      std::vector<double> lse(sq);
      for (uint64_t i = 0; i < sq; ++i) {
        double m = -std::numeric_limits<double>::infinity();
        std::vector<double> S(sk, -std::numeric_limits<double>::infinity());
        for (uint64_t j = 0; j < sk; ++j) {
          if (!pr.sees(s, i, j)) continue;
          double dot = 0;
          for (uint64_t c = 0; c < D; ++c) dot = acc(dot + Q(i, c) * K(j, c));
          S[j] = acc(dot * pr.scale);
          m = std::max(m, S[j]);
        }
        if (m == -std::numeric_limits<double>::infinity()) {
          lse[i] = std::numeric_limits<double>::infinity();
          continue;
        }
        double l = 0;
        for (uint64_t j = 0; j < sk; ++j) l = acc(l + (S[j] == -INFINITY ? 0.0 : std::exp(S[j] - m)));
        lse[i] = m + std::log(l);
        for (uint64_t j = 0; j < sk; ++j) P[i * sk + j] = S[j] == -INFINITY ? 0.0 : acc(std::exp(S[j] - m) / l);
      }
      for (uint64_t i = 0; i < sq; ++i) {
        r.lse[(s * HQ + h) * pr.max_q() + i] = lse[i];
        double delta = 0;
        std::vector<double> dP(sk, 0.0);
        for (uint64_t c = 0; c < D; ++c) {
          double o = 0;
          for (uint64_t j = 0; j < sk; ++j) o = acc(o + rnd(P[i * sk + j] * KEEP(i, j) * inv_keep) * V(j, c));
          r.o[((q0 + i) * HQ + h) * D + c] = o;
          delta = acc(delta + DO(i, c) * (lowp ? static_cast<double>(round_bf16(static_cast<float>(o))) : o));
        }
        for (uint64_t j = 0; j < sk; ++j) {
          double dpd = 0;
          for (uint64_t c = 0; c < D; ++c) dpd = acc(dpd + DO(i, c) * V(j, c));
          dP[j] = dpd * KEEP(i, j) * inv_keep;
          const double pd = rnd(P[i * sk + j] * KEEP(i, j) * inv_keep);
          for (uint64_t c = 0; c < D; ++c) r.dv[((k0 + j) * HK + hk) * D + c] += pd * DO(i, c);
        }
        for (uint64_t j = 0; j < sk; ++j) {
          const double ds = rnd(P[i * sk + j] * (dP[j] - delta));
          if (ds == 0) continue;
          for (uint64_t c = 0; c < D; ++c) {
            r.dq[((q0 + i) * HQ + h) * D + c] += ds * K(j, c) * pr.scale;
            r.dk[((k0 + j) * HK + hk) * D + c] += ds * Q(i, c) * pr.scale;
          }
        }
      }
    }
  }
  if (lowp) {  // the naive computation's outputs are in the input precision too
    for (std::vector<double>* t : {&r.o, &r.dq, &r.dk, &r.dv})
      for (double& x : *t) x = rnd(x);
  }
  return r;
}

// max|out - ref| <= k * max|naive - ref| + floor * max(1, max|ref|), NaN anywhere fails.
void compare(const std::string& what, const std::vector<float>& out, const std::vector<double>& ref,
             const std::vector<double>& naive, double k, double floor, const std::vector<bool>* only = nullptr) {
  double err = 0, nerr = 0, big = 1;
  bool nan = false;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (only && !(*only)[i]) continue;
    if (std::isinf(ref[i])) {
      nan |= !(std::isinf(out[i]) && out[i] > 0);
      continue;
    }
    nan |= std::isnan(out[i]);
    err = std::max(err, std::fabs(out[i] - ref[i]));
    nerr = std::max(nerr, std::fabs(naive[i] - ref[i]));
    big = std::max(big, std::fabs(ref[i]));
  }
  const double bound = k * nerr + floor * big;
  char line[200];
  std::snprintf(line, sizeof line, "%s: max err %.3g <= %.3g (naive bf16 %.3g)%s", what.c_str(), err, bound, nerr,
                nan ? " but NaN or a wrong +inf" : "");
  expect(!nan && err <= bound, line);
}

std::vector<float> bf16s(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = bf16_to_f32(h[i]);
  return f;
}

enum class Api { kV2, kV3 };

// The problem's mask as the v3 window fields, as PyTorch's adapter forms them: an unbounded side
// is the sequence length (top-left) or a sentinel; the diagonal as a sentinel, which also sets
// the alignment (numbers alone are top-left).
int32_t v3_sentinel(const Problem& pr) {
  return pr.bottom_right ? v3::WindowValue::BottomRightAligned : v3::WindowValue::TopLeftAligned;
}
int32_t v3_left(const Problem& pr) {
  if (pr.left >= 0) return pr.left;
  return pr.right == 0 ? v3_sentinel(pr) : static_cast<int32_t>(pr.max_q());
}
int32_t v3_right(const Problem& pr) {
  if (pr.right < 0) return static_cast<int32_t>(pr.max_k());
  return pr.right == 0 && (pr.left < 0 || pr.bottom_right) ? v3_sentinel(pr) : pr.right;
}

// One forward + backward through the seed API on `stream`, checked against float64.
void run_case(const std::string& name, const Problem& pr, Api api, CUstream_st* cu_stream, std::mt19937& gen) {
  const aotriton::Stream stream{cu_stream};
  const uint64_t D = pr.d, HQ = pr.hq, HK = pr.hk, B = pr.b(), MQ = pr.max_q(), MK = pr.max_k();
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  auto random_bf16 = [&](uint64_t n) {
    std::vector<uint16_t> h(n);
    for (auto& x : h) x = f32_to_bf16(uni(gen));
    return h;
  };
  const uint64_t nq = pr.rows_q() * HQ * D, nk = pr.rows_k() * HK * D;
  std::vector<uint16_t> hq = random_bf16(nq), hk = random_bf16(nk), hv = random_bf16(nk), hdo = random_bf16(nq);
  Buf q(nq * 2), k(nk * 2), v(nk * 2), o(nq * 2), d_o(nq * 2), dq(nq * 2), dk(nk * 2), dv(nk * 2);
  const uint64_t nrows = pr.packed ? HQ * pr.rows_q() : B * HQ * MQ;
  Buf lse(nrows * 4), delta(nrows * 4), seed(8), offset(8), seed_out(8), offset_out(8), mask(B * HQ * MQ * MK * 4);
  Buf cu_q(4 * (B + 1)), cu_k(4 * (B + 1));
  q.put(hq), k.put(hk), v.put(hv), d_o.put(hdo);
  const uint16_t nan16 = 0x7fc0;
  for (Buf* b : {&o, &dq, &dk, &dv}) b->put(std::vector<uint16_t>(b->bytes / 2, nan16));
  for (Buf* b : {&lse, &delta}) b->put(std::vector<float>(b->bytes / 4, std::nanf("")));
  seed.put(std::vector<uint64_t>{0x1234abcdULL}), offset.put(std::vector<uint64_t>{1000});
  seed_out.put(std::vector<uint64_t>{0}), offset_out.put(std::vector<uint64_t>{0});
  std::vector<int32_t> cq{0}, ck{0};
  for (uint64_t s = 0; s < B; ++s) cq.push_back(cq.back() + static_cast<int32_t>(pr.lq[s])), ck.push_back(ck.back() + static_cast<int32_t>(pr.lk[s]));
  cu_q.put(cq), cu_k.put(ck);

  const DType bf = DType::kBFloat16;
  T4 tq, tk, tv, to, tdo, tdq, tdk, tdv;
  if (pr.packed) {
    tq = packed(q.addr, pr.rows_q(), HQ, D, bf), tk = packed(k.addr, pr.rows_k(), HK, D, bf), tv = packed(v.addr, pr.rows_k(), HK, D, bf);
    to = packed(o.addr, pr.rows_q(), HQ, D, bf), tdo = packed(d_o.addr, pr.rows_q(), HQ, D, bf);
    tdq = packed(dq.addr, pr.rows_q(), HQ, D, bf), tdk = packed(dk.addr, pr.rows_k(), HK, D, bf), tdv = packed(dv.addr, pr.rows_k(), HK, D, bf);
  } else {
    tq = bshd(q.addr, B, MQ, HQ, D, bf), tk = bshd(k.addr, B, MK, HK, D, bf), tv = bshd(v.addr, B, MK, HK, D, bf);
    to = bshd(o.addr, B, MQ, HQ, D, bf), tdo = bshd(d_o.addr, B, MQ, HQ, D, bf);
    tdq = bshd(dq.addr, B, MQ, HQ, D, bf), tdk = bshd(dk.addr, B, MK, HK, D, bf), tdv = bshd(dv.addr, B, MK, HK, D, bf);
  }
  const T2 tl = pr.packed ? rows2(lse.addr, HQ, pr.rows_q()) : rows2(lse.addr, B * HQ, MQ);
  const T2 td = pr.packed ? rows2(delta.addr, HQ, pr.rows_q()) : rows2(delta.addr, B * HQ, MQ);
  const T1 tcq = offsets(cu_q.addr, B + 1), tck = offsets(cu_k.addr, B + 1);
  const T4 none = empty4(bf);
  const float scale = static_cast<float>(pr.scale);
  const uint64_t offset2 = 24;
  const bool causal = pr.left < 0 && pr.right == 0 && !pr.bottom_right;

  std::vector<float> keep;
  if (pr.p > 0) {
    const T4 r(static_cast<intptr_t>(mask.addr), {B, HQ, MQ, MK}, {HQ * MQ * MK, MQ * MK, MK, 1}, DType::kFloat32);
    hipError_t e = v2::debug_simulate_encoded_softmax(r, pr.p, i64(seed.addr), i64(offset.addr), offset2, stream);
    expect(e == hipSuccess, name + ": debug_simulate_encoded_softmax " + said(e));
    g_cu.cuStreamSynchronize(cu_stream);
    keep = mask.get<float>();
  }

  hipError_t e;
  if (api == Api::kV2) {
    e = pr.packed ? v2::attn_fwd_compact_varlen(tq, tk, tv, none, tcq, tck, static_cast<int32_t>(MQ), static_cast<int32_t>(MK), scale,
                                                tl, to, pr.p, i64(seed.addr), i64(offset.addr), offset2, u64(seed_out.addr),
                                                u64(offset_out.addr), none, causal, u64(0), stream)
                  : v2::attn_fwd(tq, tk, tv, none, scale, tl, to, pr.p, i64(seed.addr), i64(offset.addr), offset2,
                                 u64(seed_out.addr), u64(offset_out.addr), none, causal, u64(0), stream);
  } else {
    v3::attn_fwd_params f;
    f.Q = tq, f.K = tk, f.V = tv, f.Out = to, f.L = tl, f.Sm_scale = scale, f.B = none, f.encoded_softmax = none;
    if (pr.packed) f.cu_seqlens_q = tcq, f.cu_seqlens_k = tck, f.varlen_type = v3::VarlenType::CompactVarlen;
    f.Max_seqlen_q = static_cast<int32_t>(MQ), f.Max_seqlen_k = static_cast<int32_t>(MK);
    f.dropout_p = pr.p, f.philox_seed_ptr = i64(seed.addr), f.philox_offset1 = i64(offset.addr), f.philox_offset2 = offset2;
    f.philox_seed_output = u64(seed_out.addr), f.philox_offset_output = u64(offset_out.addr);
    f.causal_type = v3::CausalType::WindowedAttention;
    f.window_left = v3_left(pr), f.window_right = v3_right(pr);
    e = v3::attn_fwd(f, v3::attn_fwd_params::kVersion, stream);
  }
  expect(e == hipSuccess, name + ": forward " + said(e));
  if (e != hipSuccess) return;
  if (api == Api::kV2) {
    e = pr.packed ? v2::attn_bwd_compact_varlen(tq, tk, tv, tcq, tck, static_cast<int32_t>(MQ), static_cast<int32_t>(MK), none, scale,
                                                to, tdo, tdq, tdk, tdv, none, tl, td, pr.p, i64(seed.addr), i64(offset.addr),
                                                offset2, causal, stream)
                  : v2::attn_bwd(tq, tk, tv, none, scale, to, tdo, tdq, tdk, tdv, none, tl, td, pr.p, i64(seed.addr),
                                 i64(offset.addr), offset2, causal, stream);
  } else {
    v3::attn_bwd_params g;
    g.Q = tq, g.K = tk, g.V = tv, g.Out = to, g.DO = tdo, g.DQ = tdq, g.DK = tdk, g.DV = tdv, g.L = tl, g.D = td;
    g.B = none, g.DB = none, g.Sm_scale = scale;
    if (pr.packed) g.cu_seqlens_q = tcq, g.cu_seqlens_k = tck, g.varlen_type = v3::VarlenType::CompactVarlen;
    g.Max_seqlen_q = static_cast<int32_t>(MQ), g.Max_seqlen_k = static_cast<int32_t>(MK);
    g.dropout_p = pr.p, g.philox_seed_ptr = i64(seed.addr), g.philox_offset1 = i64(offset.addr), g.philox_offset2 = offset2;
    g.causal_type = v3::CausalType::WindowedAttention;
    g.window_left = v3_left(pr), g.window_right = v3_right(pr);
    e = v3::attn_bwd(g, v3::attn_bwd_params::kVersion, stream);
  }
  expect(e == hipSuccess, name + ": backward " + said(e));
  if (e != hipSuccess) return;
  g_cu.cuStreamSynchronize(cu_stream);

  const std::vector<float> fq = bf16s(hq), fk = bf16s(hk), fv = bf16s(hv), fdo = bf16s(hdo);
  const Result ref = attention(pr, fq, fk, fv, fdo, keep, false), naive = attention(pr, fq, fk, fv, fdo, keep, true);
  compare(name + " O", bf16s(o.get<uint16_t>()), ref.o, naive.o, 3, 1e-3);
  // LSE rows in the seed's layout: (B * Hq, Sq) dense; packed (Hq, total_q).
  std::vector<float> got_lse = lse.get<float>(), lse_in_ref_order(ref.lse.size(), 0.0f);
  std::vector<bool> valid(ref.lse.size(), false);
  for (uint64_t s = 0; s < B; ++s)
    for (uint64_t h = 0; h < HQ; ++h)
      for (uint64_t i = 0; i < pr.lq[s]; ++i) {
        const uint64_t at = (s * HQ + h) * MQ + i;
        lse_in_ref_order[at] = pr.packed ? got_lse[h * pr.rows_q() + pr.start_q(s) + i] : got_lse[at];
        valid[at] = true;
      }
  compare(name + " LSE", lse_in_ref_order, ref.lse, naive.lse, 3, 1e-3, &valid);
  compare(name + " dQ", bf16s(dq.get<uint16_t>()), ref.dq, naive.dq, 5, 1e-3);
  compare(name + " dK", bf16s(dk.get<uint16_t>()), ref.dk, naive.dk, 5, 1e-3);
  compare(name + " dV", bf16s(dv.get<uint16_t>()), ref.dv, naive.dv, 5, 1e-3);
  if (pr.p > 0) {
    const std::vector<uint64_t> s_out = seed_out.get<uint64_t>(), o_out = offset_out.get<uint64_t>();
    expect(s_out[0] == 0x1234abcdULL && o_out[0] == 1000 + offset2,
           name + ": philox outputs seed " + std::to_string(s_out[0]) + ", offset " + std::to_string(o_out[0]) +
               " = *offset1 + offset2 (" + std::to_string(1000 + offset2) + ")");
  }
}

void cuda_gpu(bool require_gpu) {
  int count = 0;
  CUdevice device = 0;
  CUcontext context = nullptr;
  if (!load_cuda() || g_cu.cuInit(0) != 0 || g_cu.cuDeviceGetCount(&count) != 0 || count == 0) {
    if (require_gpu) {
      expect(false, "CUDA: --require-gpu, but no GPU (or no driver)");
    } else {
      std::printf("CUDA: skipped: no GPU\n");
    }
    return;
  }
  CUstream_st* stream = nullptr;
  if (g_cu.cuDeviceGet(&device, 0) != 0 || g_cu.cuDevicePrimaryCtxRetain(&context, device) != 0 ||
      g_cu.cuCtxSetCurrent(context) != 0 || g_cu.cuStreamCreate(&stream, 0) != 0) {
    expect(false, "CUDA: device 0 context and stream");
    return;
  }
  const hipError_t e = v2::check_gpu(aotriton::Stream{stream});
  expect(e == hipSuccess, "CUDA check_gpu: " + said(e));
  if (e != hipSuccess) return;
  // Experimental is a release fact (which archs have run on hardware), not a property to check.
  std::printf("INFO CUDA isArchExperimentallySupported: %s\n",
              aotriton::isArchExperimentallySupported(aotriton::Stream{stream}) ? "true" : "false");
  expect(aotriton::getMultiProcessorCount(aotriton::Stream{stream}) > 0, "CUDA getMultiProcessorCount > 0");
  std::mt19937 gen(20240601);
  Problem base;
  base.lq = {67, 67}, base.lk = {93, 93};
  Problem causal = base;
  causal.right = 0;
  Problem window = base;
  window.left = 16, window.right = 4;
  Problem window_br = base;
  window_br.left = 16, window_br.right = 0, window_br.bottom_right = true;
  Problem varlen = base;
  varlen.packed = true, varlen.lq = {30, 45, 1}, varlen.lk = {50, 21, 40}, varlen.right = 0;
  Problem dropout = base;
  dropout.p = 0.2f, dropout.right = 0;
  Problem varlen_window = varlen;
  varlen_window.left = 8, varlen_window.right = 8, varlen_window.bottom_right = false;
  try {
    run_case("CUDA v2 attn_fwd/attn_bwd", base, Api::kV2, stream, gen);
    run_case("CUDA v2 causal", causal, Api::kV2, stream, gen);
    run_case("CUDA v2 compact varlen causal", varlen, Api::kV2, stream, gen);
    run_case("CUDA v2 dropout 0.2 causal", dropout, Api::kV2, stream, gen);
    run_case("CUDA v3 window (16, 4)", window, Api::kV3, stream, gen);
    run_case("CUDA v3 window (16, BottomRightAligned)", window_br, Api::kV3, stream, gen);
    run_case("CUDA v3 compact varlen window (8, 8)", varlen_window, Api::kV3, stream, gen);
  } catch (const std::exception& ex) {
    expect(false, std::string("CUDA: ") + ex.what());
  }
}

}  // namespace

// --require-gpu (the GPU machine's run): a missing GPU is a failure, not a skip.
int main(int argc, char** argv) {
  const bool require_gpu = argc > 1 && std::strcmp(argv[1], "--require-gpu") == 0;
  host_checks();
  hip_double();
  cuda_gpu(require_gpu);
  std::printf("%s (%d failed)\n", g_failures == 0 ? "seed API: ok" : "seed API: FAILED", g_failures);
  return g_failures == 0 ? 0 : 1;
}
