// GPU correctness test of the aotriton C++ API (aotriton::v2::flash::attn_fwd).
//
// A deterministic set of forward cases (both dtypes, head dims 64/128, causal on/off, ragged
// sequence lengths, Sq != Sk both ways, B x S x H x D memory viewed as B x H x S x D, a Q pointer
// that is only 2-byte aligned, padded rows) runs on a non-default stream of device 0; every output
// element is compared against a float64 CPU reference. The error allowed is scaled by the error of
// the same attention computed naively in the input precision:
//     max|out - ref64| <= 3 * max|naive - ref64| + floor
// floor = 1e-3 for O and 1e-3 * max(1, max|lse|) for LSE. Outputs are poisoned with NaN before each
// run: an element left unwritten fails, and so does any write outside the views.
//
// The CUDA driver is loaded with dlopen; no CUDA headers or toolkit are needed to build this.
// Usage: aotriton_gpu_test_cpp [--log PATH] [--seed N] [--require-gpu]
// Without a driver or a device it prints "skipped: no GPU" and exits 0 (2 with --require-gpu).
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "aotriton/flash.h"
#include "aotriton/runtime.h"

namespace {

// ---- CUDA driver, loaded at run time --------------------------------------------------------
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUstream = void*;
using CUdeviceptr = unsigned long long;

struct Driver {
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuMemAlloc_v2)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemFree_v2)(CUdeviceptr) = nullptr;
  CUresult (*cuMemcpyHtoDAsync_v2)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyDtoHAsync_v2)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;  // optional

  std::string error(CUresult r, const char* call) const {
    const char* name = nullptr;
    if (cuGetErrorName) cuGetErrorName(r, &name);
    return std::string(call) + " failed: " + (name ? name : "CUresult " + std::to_string(r));
  }
};

Driver g_cu;

template <typename F>
bool load_symbol(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

// False when there is no driver library (or it lacks a function this test needs).
bool load_driver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return false;
  bool ok = load_symbol(lib, "cuInit", g_cu.cuInit) && load_symbol(lib, "cuDeviceGetCount", g_cu.cuDeviceGetCount) &&
            load_symbol(lib, "cuDeviceGet", g_cu.cuDeviceGet) &&
            load_symbol(lib, "cuDeviceGetName", g_cu.cuDeviceGetName) &&
            load_symbol(lib, "cuDevicePrimaryCtxRetain", g_cu.cuDevicePrimaryCtxRetain) &&
            load_symbol(lib, "cuCtxSetCurrent", g_cu.cuCtxSetCurrent) &&
            load_symbol(lib, "cuStreamCreate", g_cu.cuStreamCreate) &&
            load_symbol(lib, "cuStreamSynchronize", g_cu.cuStreamSynchronize) &&
            load_symbol(lib, "cuMemAlloc_v2", g_cu.cuMemAlloc_v2) && load_symbol(lib, "cuMemFree_v2", g_cu.cuMemFree_v2) &&
            load_symbol(lib, "cuMemcpyHtoDAsync_v2", g_cu.cuMemcpyHtoDAsync_v2) &&
            load_symbol(lib, "cuMemcpyDtoHAsync_v2", g_cu.cuMemcpyDtoHAsync_v2);
  load_symbol(lib, "cuGetErrorName", g_cu.cuGetErrorName);
  if (!ok) std::fprintf(stderr, "libcuda lacks a needed function: %s\n", dlerror());
  return ok;
}

struct DriverError {
  std::string message;
};

void check(CUresult r, const char* call) {
  if (r != 0) throw DriverError{g_cu.error(r, call)};
}

// A device allocation, freed on destruction.
struct DevBuf {
  CUdeviceptr ptr = 0;
  explicit DevBuf(size_t bytes) { check(g_cu.cuMemAlloc_v2(&ptr, std::max<size_t>(bytes, 1)), "cuMemAlloc"); }
  ~DevBuf() {
    if (ptr) g_cu.cuMemFree_v2(ptr);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  void upload(const std::vector<T>& host, CUstream s) {
    check(g_cu.cuMemcpyHtoDAsync_v2(ptr, host.data(), host.size() * sizeof(T), s), "cuMemcpyHtoDAsync");
  }
  template <typename T>
  void download(std::vector<T>& host, CUstream s) {
    check(g_cu.cuMemcpyDtoHAsync_v2(host.data(), ptr, host.size() * sizeof(T), s), "cuMemcpyDtoHAsync");
  }
};

// ---- fp16 / bf16 <-> float, round to nearest even ------------------------------------------
uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

uint16_t f32_to_f16(float x) {
  uint32_t b = bits_of(x);
  uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000);
  int32_t exp = static_cast<int32_t>((b >> 23) & 0xff);
  uint32_t man = b & 0x7fffff;
  if (exp == 0xff) return sign | 0x7c00 | (man ? 0x0200 : 0);
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    uint32_t shift = static_cast<uint32_t>(14 - e);
    if (shift >= 25) return sign;
    uint32_t full = exp == 0 ? man : (man | 0x800000);
    uint32_t m = full >> shift;
    uint32_t rem = full & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (m & 1))) ++m;
    return sign | static_cast<uint16_t>(m);
  }
  uint32_t m = man >> 13, rem = man & 0x1fff;
  uint32_t h = (static_cast<uint32_t>(e) << 10) | m;
  if (rem > 0x1000 || (rem == 0x1000 && (m & 1))) ++h;
  return sign | static_cast<uint16_t>(h);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) {
    float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 0x1f) return float_of(sign | 0x7f800000 | (man << 13));
  return float_of(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_bf16(float x) {
  uint32_t b = bits_of(x);
  if (std::isnan(x)) return static_cast<uint16_t>((b >> 16) | 0x0040);
  b += 0x7fff + ((b >> 16) & 1);
  return static_cast<uint16_t>(b >> 16);
}

float bf16_to_f32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

enum class Lowp { kF16, kBF16 };

const char* lowp_name(Lowp t) { return t == Lowp::kF16 ? "fp16" : "bf16"; }
uint16_t to_bits(Lowp t, float x) { return t == Lowp::kF16 ? f32_to_f16(x) : f32_to_bf16(x); }
float from_bits(Lowp t, uint16_t b) { return t == Lowp::kF16 ? f16_to_f32(b) : bf16_to_f32(b); }
float round_to(Lowp t, float x) { return from_bits(t, to_bits(t, x)); }

constexpr uint16_t kPoison16 = 0xFFFF;      // NaN in fp16 and bf16
constexpr uint32_t kPoison32 = 0xFFFFFFFFu;  // NaN in fp32
constexpr size_t kGuard = 256;               // poisoned elements after every buffer

// Checks the converters on every bit pattern; a broken converter would void every comparison.
bool converters_ok() {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    float x = f16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(x) && f32_to_f16(x) != h) return false;
    float y = bf16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(y) && f32_to_bf16(y) != h) return false;
  }
  return f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00 && f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02 &&
         f32_to_f16(65520.0f) == 0x7c00 && f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80 &&
         f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82 && f32_to_f16(std::ldexp(1.5f, -25)) == 0x0001;
}

// ---- deterministic inputs ------------------------------------------------------------------
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform_open0() { return (static_cast<double>(next() >> 11) + 1.0) * (1.0 / 9007199254740992.0); }
  double normal() {
    double u1 = uniform_open0(), u2 = uniform_open0();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  float normal_in(Lowp t) {  // ~N(0,1), representable in t, never zero
    for (;;) {
      float v = round_to(t, static_cast<float>(normal()));
      if (v != 0.0f && std::isfinite(v)) return v;
    }
  }
};

// ---- cases ---------------------------------------------------------------------------------
enum class Layout { kBhsd, kBshd, kPadded, kQMisaligned };

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kBhsd: return "bhsd";
    case Layout::kBshd: return "bshd";
    case Layout::kPadded: return "padded";
    case Layout::kQMisaligned: return "q+2B";
  }
  return "?";
}

struct Case {
  Lowp dtype;
  size_t head_dim;
  bool causal;
  size_t batch, heads, seqlen_q, seqlen_k;
  Layout layout;

  std::string describe() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s D=%-3zu causal=%d B=%zu H=%zu Sq=%-4zu Sk=%-4zu layout=%-6s", lowp_name(dtype),
                  head_dim, causal ? 1 : 0, batch, heads, seqlen_q, seqlen_k, layout_name(layout));
    return buf;
  }
};

// 32 regular cases: every (dtype, head dim, causal, layout) twice, each of 16 (Sq, Sk) pairs twice
// with different combinations; then the special layouts. (The Rust test runs the same list.)
std::vector<Case> make_cases() {
  static const size_t pairs[16][2] = {{1, 1},     {17, 17},    {127, 127},  {1000, 1000}, {1, 17},   {17, 1},
                                      {1, 1000},  {1000, 1},   {17, 1000},  {1000, 17},   {127, 1000}, {1000, 127},
                                      {17, 127},  {127, 17},   {64, 128},   {256, 200}};
  std::vector<Case> out;
  for (size_t i = 0; i < 32; ++i) {
    size_t combo = i % 16;
    const size_t* pair = pairs[(5 * i + 3 * (i / 16)) % 16];
    out.push_back(Case{(combo & 1) ? Lowp::kBF16 : Lowp::kF16, (combo & 2) ? 128u : 64u, (combo & 4) != 0,
                       1 + i % 3, 1 + (i / 3) % 4, pair[0], pair[1], (combo & 8) ? Layout::kBshd : Layout::kBhsd});
  }
  out.push_back(Case{Lowp::kF16, 64, false, 2, 3, 200, 333, Layout::kQMisaligned});
  out.push_back(Case{Lowp::kBF16, 128, true, 1, 2, 1000, 127, Layout::kQMisaligned});
  out.push_back(Case{Lowp::kBF16, 64, true, 2, 2, 130, 130, Layout::kPadded});
  out.push_back(Case{Lowp::kF16, 128, false, 1, 3, 17, 300, Layout::kPadded});
  return out;
}

// Where a logical tensor lives in its buffer.
template <int R>
struct Placement {
  size_t sizes[R];
  size_t strides[R];
  size_t offset = 0;  // elements before element [0, ...]
  size_t len = 0;     // whole buffer, guard included

  Placement(const size_t (&sz)[R], const size_t (&st)[R], size_t off) : offset(off) {
    size_t extent = 1;
    for (int d = 0; d < R; ++d) {
      sizes[d] = sz[d];
      strides[d] = st[d];
      extent += (sz[d] - 1) * st[d];
    }
    len = offset + extent + kGuard;
  }
  size_t count() const {
    size_t n = 1;
    for (int d = 0; d < R; ++d) n *= sizes[d];
    return n;
  }
  // Buffer index of every logical element, in logical row-major order.
  std::vector<size_t> indices() const {
    std::vector<size_t> out;
    out.reserve(count());
    size_t idx[R] = {};
    for (size_t n = count(); n > 0; --n) {
      size_t at = offset;
      for (int d = 0; d < R; ++d) at += idx[d] * strides[d];
      out.push_back(at);
      for (int d = R - 1; d >= 0; --d) {
        if (++idx[d] < sizes[d]) break;
        idx[d] = 0;
      }
    }
    return out;
  }
};

Placement<4> place4(const Case& c, size_t s, bool is_q) {
  size_t b = c.batch, h = c.heads, d = c.head_dim;
  size_t sizes[4] = {b, h, s, d};
  switch (c.layout) {
    case Layout::kBshd: {
      size_t st[4] = {s * h * d, d, h * d, 1};
      return Placement<4>(sizes, st, 0);
    }
    case Layout::kPadded: {
      size_t st[4] = {h * s * (d + 1), s * (d + 1), d + 1, 1};
      return Placement<4>(sizes, st, 0);
    }
    default: {
      size_t st[4] = {h * s * d, s * d, d, 1};
      return Placement<4>(sizes, st, (c.layout == Layout::kQMisaligned && is_q) ? 1 : 0);
    }
  }
}

Placement<3> place_lse(const Case& c) {
  size_t b = c.batch, h = c.heads, s = c.seqlen_q;
  size_t sizes[3] = {b, h, s};
  size_t pitch = c.layout == Layout::kPadded ? s + 3 : s;
  size_t st[3] = {h * pitch, pitch, 1};
  return Placement<3>(sizes, st, 0);
}

template <int R>
aotriton::TensorView<R> view(const DevBuf& buf, const Placement<R>& p, aotriton::DType dtype, size_t elem_bytes) {
  aotriton::TensorView<R> t;
  t.data = reinterpret_cast<const void*>(static_cast<uintptr_t>(buf.ptr + p.offset * elem_bytes));
  for (int d = 0; d < R; ++d) {
    t.sizes[d] = p.sizes[d];
    t.strides[d] = static_cast<int64_t>(p.strides[d]);
  }
  t.dtype = dtype;
  return t;
}

// ---- references ----------------------------------------------------------------------------
struct Outputs {
  std::vector<double> o, lse;
};

size_t visible_keys(bool causal, size_t i, size_t sk) { return causal ? std::min(i + 1, sk) : sk; }

// float64 (exact) and naive low precision (scores accumulated in f32 then rounded to the dtype,
// softmax in f32 with P rounded to the dtype, P.V accumulated in f32 then rounded; LSE in f32
// from the rounded scores), for one (batch, head).
void reference_head(const Case& c, float sm_scale, const float* q, const float* k, const float* v, double* eo,
                    double* el, double* no, double* nl) {
  size_t sq = c.seqlen_q, sk = c.seqlen_k, d = c.head_dim;
  std::vector<double> s64(sk), acc64(d);
  std::vector<float> s32(sk), acc32(d);
  for (size_t i = 0; i < sq; ++i) {
    size_t n = visible_keys(c.causal, i, sk);
    const float* qi = q + i * d;
    for (size_t j = 0; j < n; ++j) {
      const float* kj = k + j * d;
      double a64 = 0;
      float a32 = 0;
      for (size_t t = 0; t < d; ++t) {
        a64 += static_cast<double>(qi[t]) * kj[t];
        a32 += qi[t] * kj[t];
      }
      s64[j] = a64 * static_cast<double>(sm_scale);
      s32[j] = round_to(c.dtype, a32 * sm_scale);
    }
    double m64 = -std::numeric_limits<double>::infinity(), l64 = 0;
    for (size_t j = 0; j < n; ++j) m64 = std::max(m64, s64[j]);
    std::fill(acc64.begin(), acc64.end(), 0.0);
    for (size_t j = 0; j < n; ++j) {
      double e = std::exp(s64[j] - m64);
      l64 += e;
      for (size_t t = 0; t < d; ++t) acc64[t] += e * v[j * d + t];
    }
    for (size_t t = 0; t < d; ++t) eo[i * d + t] = acc64[t] / l64;
    el[i] = m64 + std::log(l64);

    float m32 = -std::numeric_limits<float>::infinity(), l32 = 0;
    for (size_t j = 0; j < n; ++j) m32 = std::max(m32, s32[j]);
    for (size_t j = 0; j < n; ++j) {
      s32[j] = std::exp(s32[j] - m32);
      l32 += s32[j];
    }
    std::fill(acc32.begin(), acc32.end(), 0.0f);
    for (size_t j = 0; j < n; ++j) {
      float p = round_to(c.dtype, s32[j] / l32);
      for (size_t t = 0; t < d; ++t) acc32[t] += p * v[j * d + t];
    }
    for (size_t t = 0; t < d; ++t) no[i * d + t] = round_to(c.dtype, acc32[t]);
    nl[i] = m32 + std::log(l32);
  }
}

void reference(const Case& c, float sm_scale, const std::vector<float>& q, const std::vector<float>& k,
               const std::vector<float>& v, Outputs& exact, Outputs& naive) {
  size_t sq = c.seqlen_q, sk = c.seqlen_k, d = c.head_dim, bh = c.batch * c.heads;
  exact.o.assign(bh * sq * d, 0);
  exact.lse.assign(bh * sq, 0);
  naive.o.assign(bh * sq * d, 0);
  naive.lse.assign(bh * sq, 0);
  size_t threads = std::max(1u, std::min(64u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t w = 0; w < std::min(threads, bh); ++w) {
    pool.emplace_back([&, w] {
      for (size_t i = w; i < bh; i += threads) {
        reference_head(c, sm_scale, &q[i * sq * d], &k[i * sk * d], &v[i * sk * d], &exact.o[i * sq * d],
                       &exact.lse[i * sq], &naive.o[i * sq * d], &naive.lse[i * sq]);
      }
    });
  }
  for (auto& t : pool) t.join();
}

double max_err(const std::vector<double>& a, const std::vector<double>& r) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double e = std::fabs(a[i] - r[i]);
    if (e > m) m = e;  // NaN never raises the max; NaNs are counted separately
  }
  return m;
}

struct Outcome {
  bool pass;
  std::string line;
};

aotriton::DType api_dtype(Lowp t) { return t == Lowp::kF16 ? aotriton::DType::kFloat16 : aotriton::DType::kBFloat16; }

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

Outcome run_case(const Case& c, SplitMix64& rng, CUstream stream) {
  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // Inputs: logical values (rounded to the dtype) scattered into NaN-filled device-layout buffers.
  Placement<4> places[3] = {place4(c, c.seqlen_q, true), place4(c, c.seqlen_k, false), place4(c, c.seqlen_k, false)};
  std::vector<float> logical[3];
  std::vector<uint16_t> host[3];
  for (int t = 0; t < 3; ++t) {
    logical[t].resize(places[t].count());
    for (auto& x : logical[t]) x = rng.normal_in(c.dtype);
    host[t].assign(places[t].len, kPoison16);
    std::vector<size_t> idx = places[t].indices();
    for (size_t i = 0; i < idx.size(); ++i) host[t][idx[i]] = to_bits(c.dtype, logical[t][i]);
  }
  Placement<4> o_place = place4(c, c.seqlen_q, false);
  Placement<3> lse_place = place_lse(c);

  DevBuf dq(host[0].size() * 2), dk(host[1].size() * 2), dv(host[2].size() * 2);
  DevBuf dout(o_place.len * 2), dlse(lse_place.len * 4);
  dq.upload(host[0], stream);
  dk.upload(host[1], stream);
  dv.upload(host[2], stream);
  std::vector<uint16_t> o_bits(o_place.len, kPoison16);
  std::vector<uint32_t> lse_bits(lse_place.len, kPoison32);
  dout.upload(o_bits, stream);
  dlse.upload(lse_bits, stream);

  const aotriton::DType dt = api_dtype(c.dtype);
  aotriton::v2::flash::FwdParams params;
  params.q = view(dq, places[0], dt, 2);
  params.k = view(dk, places[1], dt, 2);
  params.v = view(dv, places[2], dt, 2);
  params.o = view(dout, o_place, dt, 2);
  params.lse = view(dlse, lse_place, aotriton::DType::kFloat32, 4);
  params.sm_scale = sm_scale;
  params.causal = c.causal;
  auto started = std::chrono::steady_clock::now();
  aotriton::Status st = aotriton::v2::flash::attn_fwd(params, aotriton::Stream{stream});
  std::string message = st == aotriton::Status::kSuccess ? "" : aotriton::last_error_message();
  // Copy back after the launch (ordered on the same stream), then wait.
  std::vector<uint16_t> o_out(o_place.len);
  std::vector<uint32_t> lse_out(lse_place.len);
  dout.download(o_out, stream);
  dlse.download(lse_out, stream);
  check(g_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
  double gpu_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  if (st != aotriton::Status::kSuccess) {
    return {false, c.describe() + "  attn_fwd returned " + aotriton::status_name(st) + ": " + message + "  FAIL"};
  }

  Outputs exact, naive;
  reference(c, sm_scale, logical[0], logical[1], logical[2], exact, naive);

  std::vector<size_t> o_idx = o_place.indices(), lse_idx = lse_place.indices();
  std::vector<double> o(o_idx.size()), lse(lse_idx.size());
  size_t nan_o = 0, nan_lse = 0, stray = 0;
  std::vector<char> in_o(o_place.len, 0), in_l(lse_place.len, 0);
  for (size_t i = 0; i < o_idx.size(); ++i) {
    o[i] = from_bits(c.dtype, o_out[o_idx[i]]);
    nan_o += std::isnan(o[i]);
    in_o[o_idx[i]] = 1;
  }
  for (size_t i = 0; i < lse_idx.size(); ++i) {
    lse[i] = float_of(lse_out[lse_idx[i]]);
    nan_lse += std::isnan(lse[i]);
    in_l[lse_idx[i]] = 1;
  }
  for (size_t i = 0; i < o_out.size(); ++i) stray += !in_o[i] && o_out[i] != kPoison16;
  for (size_t i = 0; i < lse_out.size(); ++i) stray += !in_l[i] && lse_out[i] != kPoison32;

  double err_o = max_err(o, exact.o), bound_o = 3 * max_err(naive.o, exact.o) + 1e-3;
  double lse_mag = 1.0;
  for (double x : exact.lse) lse_mag = std::max(lse_mag, std::fabs(x));
  double err_l = max_err(lse, exact.lse), bound_l = 3 * max_err(naive.lse, exact.lse) + 1e-3 * lse_mag;
  bool pass = nan_o == 0 && nan_lse == 0 && stray == 0 && err_o <= bound_o && err_l <= bound_l;
  std::string line = c.describe() + "  O err " + fmt("%.3e", err_o) + " bound " + fmt("%.3e", bound_o) + "  LSE err " +
                     fmt("%.3e", err_l) + " bound " + fmt("%.3e", bound_l);
  if (nan_o + nan_lse > 0)
    line += "  NaN/unwritten O " + std::to_string(nan_o) + " LSE " + std::to_string(nan_lse);
  if (stray > 0) line += "  " + std::to_string(stray) + " writes outside the views";
  line += "  (" + fmt("%.1f", gpu_ms) + " ms)  " + (pass ? "PASS" : "FAIL");
  return {pass, line};
}

// Invalid calls on a live device: each must return its documented Status and launch nothing.
Outcome invalid_case(const char* what, aotriton::Status want, CUstream stream,
                     const std::function<void(aotriton::v2::flash::FwdParams&)>& spoil) {
  const size_t b = 1, h = 2, s = 64, d = 64, n = b * h * s * d;
  DevBuf dq(n * 2), dk(n * 2), dv(n * 2), dout(n * 2), dlse(b * h * s * 4);
  std::vector<uint16_t> ones(n, f32_to_f16(1.0f)), poison(n, kPoison16);
  std::vector<uint32_t> lse_poison(b * h * s, kPoison32);
  dq.upload(ones, stream);
  dk.upload(ones, stream);
  dv.upload(ones, stream);
  dout.upload(poison, stream);
  dlse.upload(lse_poison, stream);
  auto t4 = [&](const DevBuf& buf) {
    const uint64_t sizes[4] = {b, h, s, d};
    return aotriton::TensorView<4>::contiguous(reinterpret_cast<const void*>(static_cast<uintptr_t>(buf.ptr)), sizes,
                                               aotriton::DType::kFloat16);
  };
  aotriton::v2::flash::FwdParams params;
  params.q = t4(dq);
  params.k = t4(dk);
  params.v = t4(dv);
  params.o = t4(dout);
  const uint64_t lse_sizes[3] = {b, h, s};
  params.lse = aotriton::TensorView<3>::contiguous(reinterpret_cast<const void*>(static_cast<uintptr_t>(dlse.ptr)),
                                                   lse_sizes, aotriton::DType::kFloat32);
  params.sm_scale = 0.125f;
  spoil(params);
  aotriton::Status st = aotriton::v2::flash::attn_fwd(params, aotriton::Stream{stream});
  std::string message = aotriton::last_error_message();
  std::vector<uint16_t> out(n);
  dout.download(out, stream);
  check(g_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
  bool untouched = std::all_of(out.begin(), out.end(), [](uint16_t x) { return x == kPoison16; });
  bool pass = st == want && untouched && !message.empty();
  std::string line = std::string("invalid call (") + what + ") -> " + aotriton::status_name(st) + ": " + message;
  if (st != want) line += std::string("  expected ") + aotriton::status_name(want);
  if (!untouched) line += "  but O was written";
  if (message.empty()) line += "  but last_error_message() is empty";
  return {pass, line + (pass ? "  PASS" : "  FAIL")};
}

}  // namespace

int main(int argc, char** argv) {
  std::string log_path;
  uint64_t seed = 0x5EEDA07Eull;
  bool require_gpu = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--log" && i + 1 < argc) {
      log_path = argv[++i];
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 0);
    } else if (a == "--require-gpu") {
      require_gpu = true;
    } else {
      std::fprintf(stderr, "usage: %s [--log PATH] [--seed N] [--require-gpu]\n", argv[0]);
      return 2;
    }
  }
  int count = 0;
  if (!load_driver() || g_cu.cuInit(0) != 0 || g_cu.cuDeviceGetCount(&count) != 0 || count == 0) {
    std::printf("skipped: no GPU\n");
    return require_gpu ? 2 : 0;
  }

  std::string log;
  auto emit = [&](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    log += line + "\n";
  };
  CUstream stream = nullptr;
  char name[256] = "?";
  try {
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    check(g_cu.cuDeviceGet(&dev, 0), "cuDeviceGet");
    g_cu.cuDeviceGetName(name, sizeof name, dev);
    check(g_cu.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(g_cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    check(g_cu.cuStreamCreate(&stream, 0), "cuStreamCreate");  // blocking, not the default stream
  } catch (const DriverError& e) {
    std::printf("cpp-api: setup failed: %s\n", e.message.c_str());
    return 1;
  }
  emit(std::string("aotriton C++ API GPU test: device 0 = ") + name + ", aotriton " + aotriton::version() +
       ", seed " + std::to_string(seed));

  int passed = 0, failed = 0, n = 0;
  auto record = [&](const Outcome& r) {
    (r.pass ? passed : failed)++;
    char prefix[16];
    std::snprintf(prefix, sizeof prefix, "[%2d] ", ++n);
    emit(prefix + r.line);
  };
  bool conv = converters_ok();
  record({conv, std::string("fp16/bf16 converters (all bit patterns, ties to even)  ") + (conv ? "PASS" : "FAIL")});

  SplitMix64 rng{seed};
  for (const Case& c : make_cases()) {
    try {
      record(run_case(c, rng, stream));
    } catch (const DriverError& e) {
      record({false, c.describe() + "  driver error: " + e.message + "  FAIL"});
    }
  }
  using aotriton::Status;
  using P = aotriton::v2::flash::FwdParams;
  struct Invalid {
    const char* what;
    Status want;
    std::function<void(P&)> spoil;
  };
  const Invalid invalid[] = {
      {"q null", Status::kNullPointer, [](P& p) { p.q.data = nullptr; }},
      {"sm_scale unset", Status::kInvalidArgument,
       [](P& p) { p.sm_scale = std::numeric_limits<float>::quiet_NaN(); }},
      {"k seqlen 0", Status::kEmptyInput, [](P& p) { p.k.sizes[2] = p.v.sizes[2] = 0; }},
      {"version 999", Status::kUnsupportedVersion, [](P& p) { p.version = 999; }},
  };
  for (const Invalid& inv : invalid) {
    try {
      record(invalid_case(inv.what, inv.want, stream, inv.spoil));
    } catch (const DriverError& e) {
      record({false, std::string("invalid call (") + inv.what + "): driver error: " + e.message + "  FAIL"});
    }
  }
  emit("cpp-api: " + std::to_string(passed) + " passed, " + std::to_string(failed) + " failed");
  if (!log_path.empty()) {
    std::ofstream f(log_path);
    f << log;
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", log_path.c_str());
      return 1;
    }
  }
  return failed == 0 ? 0 : 1;
}
