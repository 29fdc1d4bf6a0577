// GPU correctness test of the aotriton C++ API (aotriton::v2::flash::attn_fwd and attn_bwd).
//
// Forward cases (both dtypes, head dims 64/128, causal on/off, ragged sequence lengths, Sq != Sk
// both ways, B x S x H x D memory viewed as B x H x S x D, a Q pointer that is only 2-byte
// aligned, padded rows) and 14 forward + backward cases (GQA / MQA, padded head dims such as 72,
// causal bottom-right, sliding windows, rows that see no key, a forward without LSE, logit
// soft-capping) run on a
// non-default stream of device 0; every output element is compared against a float64 CPU
// reference (written row by row here, independently of the Rust suite's). The error allowed is
// scaled by the error of the same math done naively in the input precision:
//     max|out - ref64| <= k * max|naive - ref64| + floor
// k = 3 for O, 5 for dQ / dK / dV; floor = 1e-3 (for gradients x max(1, max|ref|)); LSE per row
// within 3 * naive + 1e-3 * max(1, |lse|), +inf exactly where the reference is +inf. Outputs are
// poisoned with NaN before each run: an element left unwritten fails, and so does any write
// outside the views or into an input.
//
// Then 9 forward + backward cases of the third milestone (run_feature: dropout with the
// reference mask from flash::debug_dropout_mask, broadcast biases with dbias, packed batches with
// zero-length sequences, fp32; see "third milestone" below) and invalid calls for the new
// validations (dropout_p = 1, a missing seed, a bias that does not broadcast, dbias without
// bias, int32 cu_seqlens given as fp32, max_seqlen below a sequence's length with host copies).
// Beside the fp8 forward's cases (run_fp8), three KV-cache decode cases (run_kvcache,
// attn_fwd_kvcache: a dense and two paged caches with appends, one across a page boundary, GQA/MQA,
// splits forced and automatic, a length past the capacity clamped and reported in the status word).
//
// `--backend auto|portable|gluon` (default auto) sets FwdParams::backend / BwdParams::backend of
// every call. Each backward first asks attn_bwd_workspace_bytes() and, when that is > 0, is given
// a workspace of that many bytes, poisoned with 0xFF. Under `gluon`, a case the Gluon dispatch
// rule (flash.h) does not serve must be refused: attn_fwd / attn_bwd (and the workspace query)
// return kUnsupportedByBackend with a message and write nothing ("refused by gluon (...)", a
// PASS). When the backward ran on the Gluon
// kernels (forced, or auto with a workspace), whose dQ is summed with unordered reduce-adds, it is
// rerun 3 times with `deterministic` set: the reruns must be bitwise identical, their dK/dV equal
// to the first run's, and their dQ is checked against the reference like dQ ("dQ(det)").
//
// The CUDA driver is loaded with dlopen; no CUDA headers or toolkit are needed to build this.
// Usage: aotriton_gpu_test_cpp [--log PATH] [--seed N] [--require-gpu] [--backend B]
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
#include <memory>
#include <optional>
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
using CUstream = CUstream_st*;  // declared by aotriton/runtime.h, as in cuda.h
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

using aotriton::v2::flash::MaskAlign;

struct Case {
  Lowp dtype;
  size_t head_dim;
  size_t batch, heads_q, heads_k, seqlen_q, seqlen_k;
  Layout layout;
  // The mask as the C++ API takes it: `causal` sets window_right to 0.
  bool causal = false;
  MaskAlign align = MaskAlign::kTopLeft;
  int32_t window_left = -1, window_right = -1;
  bool backward = false;         // forward + backward (else forward only)
  bool fwd_without_lse = false;  // a forward with lse.data = nullptr first
  float softcap = 0.0f;          // logit soft-capping (FwdParams version 6); 0 = off
  float sm_scale = 0.0f;         // 0: 1/sqrt(D)
  size_t alibi_rows = 0;         // ALiBi slopes [rows, Hq] (FwdParams version 7): 0 off, 1 shared, B per sequence
  bool sinks = false;            // attention sinks [Hq] and their gradient (FwdParams version 8)
  size_t head_dim_v = 0;         // V's own head dim (O, dO, dV too); 0: head_dim

  size_t dv() const { return head_dim_v ? head_dim_v : head_dim; }

  // BLOOM's slopes 2^(-8(h+1)/Hq), scaled per sequence when each has its own row.
  float slope(size_t b, size_t h) const {
    return std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(heads_q)) *
           (1.0f + 0.5f * static_cast<float>(alibi_rows > 1 ? b : 0));
  }
  // Sink logits from negligible to dominant.
  float sink(size_t h) const {
    static const float logits[8] = {0.5f, -1.0f, 3.0f, -30.0f, 8.0f, 0.0f, 1.5f, -2.0f};
    return logits[h % 8];
  }

  size_t group() const { return heads_q / heads_k; }
  // Query row i sees key j (< Sk) iff i + off - left <= j <= i + off + right; -1 = unbounded side.
  bool visible(size_t i, size_t j) const {
    int64_t off = align == MaskAlign::kBottomRight ? static_cast<int64_t>(seqlen_k) - static_cast<int64_t>(seqlen_q) : 0;
    int64_t left = window_left, right = causal ? 0 : window_right;
    int64_t diag = static_cast<int64_t>(i) + off, jj = static_cast<int64_t>(j);
    return (left < 0 || jj >= diag - left) && (right < 0 || jj <= diag + right);
  }
  std::string mask_name() const {
    const char* al = align == MaskAlign::kBottomRight ? "BR" : "TL";
    char buf[64];
    if (causal && window_left < 0) {
      std::snprintf(buf, sizeof buf, "causal-%s", al);
    } else if (!causal && window_left < 0 && window_right < 0) {
      std::snprintf(buf, sizeof buf, "none");
    } else {
      std::snprintf(buf, sizeof buf, "win(%d,%d)-%s", window_left, causal ? 0 : window_right, al);
    }
    return buf;
  }
  std::string describe() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s %s D=%-3zu G=%zu Hq=%zu Hk=%zu B=%zu Sq=%-4zu Sk=%-4zu mask=%-16s layout=%-6s%s",
                  backward ? "fwd+bwd" : "fwd    ", lowp_name(dtype), head_dim, group(), heads_q, heads_k, batch,
                  seqlen_q, seqlen_k, mask_name().c_str(), layout_name(layout), fwd_without_lse ? " +fwd-no-lse" : "");
    std::string text = buf;
    if (softcap > 0) text += " softcap=" + std::to_string(softcap).substr(0, 4) + " scale=" + std::to_string(sm_scale).substr(0, 4);
    if (alibi_rows > 0) text += alibi_rows > 1 ? " alibi=[B,Hq]" : " alibi=[1,Hq]";
    if (sinks) text += " sinks";
    if (dv() != head_dim) text += " Dv=" + std::to_string(dv());
    return text;
  }
};

Case fwd_case(Lowp dtype, size_t d, bool causal, size_t b, size_t h, size_t sq, size_t sk, Layout layout) {
  Case c{dtype, d, b, h, h, sq, sk, layout};
  c.causal = causal;
  return c;
}

Case bwd_case(Lowp dtype, size_t d, size_t hq, size_t hk, size_t b, size_t sq, size_t sk, Layout layout, bool causal,
              MaskAlign align, int32_t left, int32_t right) {
  Case c{dtype, d, b, hq, hk, sq, sk, layout};
  c.causal = causal;
  c.align = align;
  c.window_left = left;
  c.window_right = right;
  c.backward = true;
  return c;
}

// Forward: 32 regular cases, every (dtype, head dim, causal, layout) twice, each of 16 (Sq, Sk)
// pairs twice with different combinations; then the special layouts. Forward + backward: 12
// cases with GQA / MQA, padded head dims, causal bottom-right, windows, rows without keys.
std::vector<Case> make_cases() {
  static const size_t pairs[16][2] = {{1, 1},     {17, 17},    {127, 127},  {1000, 1000}, {1, 17},   {17, 1},
                                      {1, 1000},  {1000, 1},   {17, 1000},  {1000, 17},   {127, 1000}, {1000, 127},
                                      {17, 127},  {127, 17},   {64, 128},   {256, 200}};
  std::vector<Case> out;
  for (size_t i = 0; i < 32; ++i) {
    size_t combo = i % 16;
    const size_t* pair = pairs[(5 * i + 3 * (i / 16)) % 16];
    out.push_back(fwd_case((combo & 1) ? Lowp::kBF16 : Lowp::kF16, (combo & 2) ? 128u : 64u, (combo & 4) != 0,
                           1 + i % 3, 1 + (i / 3) % 4, pair[0], pair[1], (combo & 8) ? Layout::kBshd : Layout::kBhsd));
  }
  out.push_back(fwd_case(Lowp::kF16, 64, false, 2, 3, 200, 333, Layout::kQMisaligned));
  out.push_back(fwd_case(Lowp::kBF16, 128, true, 1, 2, 1000, 127, Layout::kQMisaligned));
  out.push_back(fwd_case(Lowp::kBF16, 64, true, 2, 2, 130, 130, Layout::kPadded));
  out.push_back(fwd_case(Lowp::kF16, 128, false, 1, 3, 17, 300, Layout::kPadded));

  const MaskAlign TL = MaskAlign::kTopLeft, BR = MaskAlign::kBottomRight;
  using L = Layout;
  out.push_back(bwd_case(Lowp::kBF16, 128, 8, 2, 1, 200, 200, L::kBhsd, false, TL, -1, -1));  // GQA 4
  out.push_back(bwd_case(Lowp::kF16, 72, 4, 4, 1, 197, 131, L::kBshd, true, BR, -1, -1));    // padded D, causal BR
  out.push_back(bwd_case(Lowp::kBF16, 72, 6, 2, 1, 300, 120, L::kBhsd, true, BR, -1, -1));   // 180 rows without keys
  out.push_back(bwd_case(Lowp::kF16, 64, 8, 1, 1, 128, 384, L::kBhsd, false, BR, 32, 8));    // MQA, window BR
  out.push_back(bwd_case(Lowp::kBF16, 40, 4, 2, 2, 257, 257, L::kPadded, false, TL, 16, 0)); // sliding causal
  out.push_back(bwd_case(Lowp::kF16, 256, 2, 1, 1, 127, 255, L::kQMisaligned, false, TL, -1, -1));
  out.push_back(bwd_case(Lowp::kBF16, 8, 16, 2, 1, 61, 61, L::kBshd, true, TL, -1, -1));     // GQA 8
  out.push_back(bwd_case(Lowp::kF16, 160, 4, 2, 1, 1, 333, L::kBhsd, false, TL, -1, 5));     // Sq = 1
  out.push_back(bwd_case(Lowp::kBF16, 96, 3, 1, 1, 333, 17, L::kBhsd, false, BR, 0, 0));     // window (0,0), empty rows
  out.push_back(bwd_case(Lowp::kF16, 224, 2, 2, 1, 100, 100, L::kBshd, false, TL, 4000, 4000));  // wider than seq
  Case nolse = bwd_case(Lowp::kBF16, 128, 4, 1, 1, 200, 200, L::kBhsd, true, TL, -1, -1);
  nolse.fwd_without_lse = true;
  out.push_back(nolse);
  out.push_back(bwd_case(Lowp::kF16, 24, 8, 4, 1, 513, 77, L::kBshd, false, BR, 3, -1));   // (l, -1)
  // V's own head dim (DeepSeek MLA's 192/128; 128/64 with a window and padded dims).
  Case mla = bwd_case(Lowp::kBF16, 192, 4, 2, 1, 131, 200, L::kBshd, true, BR, -1, -1);
  mla.head_dim_v = 128;
  out.push_back(mla);
  Case half_v = bwd_case(Lowp::kF16, 96, 2, 2, 2, 97, 61, L::kPadded, false, TL, 16, 5);
  half_v.head_dim_v = 40;
  out.push_back(half_v);
  // Head dims above 256 (bucket 512, the portable kernels under every backend).
  out.push_back(bwd_case(Lowp::kBF16, 512, 4, 2, 1, 131, 200, L::kBshd, true, BR, -1, -1));  // GQA, causal BR
  out.push_back(bwd_case(Lowp::kF16, 264, 2, 2, 1, 97, 61, L::kPadded, false, TL, 16, 5));   // window, empty rows
  // Logit soft-capping: a saturating cap with GQA and causal BR, Gemma 2's 50 with a window.
  Case capped = bwd_case(Lowp::kBF16, 128, 8, 2, 1, 250, 250, L::kBshd, true, BR, -1, -1);
  capped.softcap = 4.0f;
  capped.sm_scale = 0.5f;
  out.push_back(capped);
  Case gemma = bwd_case(Lowp::kF16, 256, 4, 2, 1, 131, 200, L::kBhsd, false, TL, 64, 16);
  gemma.softcap = 50.0f;
  gemma.sm_scale = 1.0f;
  out.push_back(gemma);
  // ALiBi: per-sequence slopes with GQA and causal BR; shared slopes, no window but the bottom-right
  // diagonal (FlashAttention's convention), Sq != Sk.
  Case bloom = bwd_case(Lowp::kBF16, 128, 8, 2, 2, 250, 250, L::kBshd, true, BR, -1, -1);
  bloom.alibi_rows = 2;
  out.push_back(bloom);
  Case mpt = bwd_case(Lowp::kF16, 64, 4, 4, 1, 131, 200, L::kBhsd, false, BR, -1, -1);
  mpt.alibi_rows = 1;
  out.push_back(mpt);
  // Attention sinks: GQA with rows without keys (causal BR, Sq > Sk); a window.
  Case oss = bwd_case(Lowp::kBF16, 64, 8, 2, 2, 300, 200, L::kBhsd, true, BR, -1, -1);
  oss.sinks = true;
  out.push_back(oss);
  Case oss_window = bwd_case(Lowp::kF16, 128, 4, 4, 1, 257, 257, L::kBshd, false, TL, 128, 0);
  oss_window.sinks = true;
  out.push_back(oss_window);
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

// A B x h x s x d tensor of the case (d: Q/K's head dim, or V's for v, o, dO, dV); `shifted`: q,
// dO, dQ (2 bytes off in the misaligned layout).
Placement<4> place4(const Case& c, size_t h, size_t s, size_t d, bool shifted) {
  size_t b = c.batch;
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
      return Placement<4>(sizes, st, (c.layout == Layout::kQMisaligned && shifted) ? 1 : 0);
    }
  }
}

// LSE and delta: B x Hq x Sq fp32.
Placement<3> place_rows(const Case& c) {
  size_t b = c.batch, h = c.heads_q, s = c.seqlen_q;
  size_t sizes[3] = {b, h, s};
  size_t pitch = c.layout == Layout::kPadded ? s + 3 : s;
  size_t st[3] = {h * pitch, pitch, 1};
  return Placement<3>(sizes, st, 0);
}

// A tensor on the device plus the host copy of what was uploaded (values in the view, poison
// everywhere else).
template <typename T, int R>
struct DevTensor {
  Placement<R> place;
  std::vector<T> host;
  DevBuf buf;

  DevTensor(const Placement<R>& p, const std::vector<T>* values, T poison, CUstream s)
      : place(p), host(p.len, poison), buf(p.len * sizeof(T)) {
    if (values) {
      std::vector<size_t> idx = place.indices();
      for (size_t i = 0; i < idx.size(); ++i) host[idx[i]] = (*values)[i];
    }
    restore(s);
  }
  void restore(CUstream s) { buf.upload(host, s); }
  std::vector<T> read(CUstream s) {
    std::vector<T> bits(host.size());
    buf.download(bits, s);
    check(g_cu.cuStreamSynchronize(s), "cuStreamSynchronize");
    return bits;
  }
  aotriton::TensorView<R> view(aotriton::DType dtype) const {
    aotriton::TensorView<R> t;
    t.data = reinterpret_cast<const void*>(static_cast<uintptr_t>(buf.ptr + place.offset * sizeof(T)));
    for (int d = 0; d < R; ++d) {
      t.sizes[d] = place.sizes[d];
      t.strides[d] = static_cast<int64_t>(place.strides[d]);
    }
    t.dtype = dtype;
    return t;
  }
  std::vector<T> logical(const std::vector<T>& bits) const {
    std::vector<T> out;
    for (size_t i : place.indices()) out.push_back(bits[i]);
    return out;
  }
  // Elements outside the view that differ from what was uploaded.
  size_t stray(const std::vector<T>& bits) const {
    std::vector<char> inside(place.len, 0);
    for (size_t i : place.indices()) inside[i] = 1;
    size_t n = 0;
    for (size_t i = 0; i < bits.size(); ++i) n += !inside[i] && bits[i] != host[i];
    return n;
  }
};

// ---- references ----------------------------------------------------------------------------
// Written row by row (a second implementation beside the Rust suite's matrix form):
//   s_j = scale q_i.k_j (visible j only), p_j = exp(s_j - max) / sum, o_i = sum_j p_j v_j,
//   lse_i = max + ln(sum); a row with no visible key: o_i = 0, lse_i = +inf, no gradient.
//   D_i = dO_i.o_i, dp_j = dO_i.v_j, ds_j = p_j (dp_j - D_i),
//   dq_i = scale sum_j ds_j k_j, dk_j += scale ds_j q_i, dv_j += p_j dO_i (over all i and the G
//   query heads of the K/V head).
// exact: double. naive: float, with s, p, o, dp, ds, dq, dk, dv rounded to the dtype (dk, dv after
// the whole sum).
struct Outputs {
  std::vector<double> o, lse, dq, dk, dv;
};

struct Inputs {
  const std::vector<float>&q, &k, &v, &d_o;
};

// All query heads of K/V head (b, hk).
void reference_group(const Case& c, float sm_scale, const Inputs& in, size_t b, size_t hk, Outputs& ex, Outputs& nv) {
  const size_t sq = c.seqlen_q, sk = c.seqlen_k, d = c.head_dim, dv = c.dv(), g = c.group();
  const double scale64 = sm_scale;
  const size_t kv = (b * c.heads_k + hk) * sk * d, kv_v = (b * c.heads_k + hk) * sk * dv;
  const float* k = &in.k[kv];
  const float* v = &in.v[kv_v];
  std::vector<double> dk64(sk * d, 0), dv64(sk * dv, 0);
  std::vector<float> dk32(sk * d, 0), dv32(sk * dv, 0);
  std::vector<double> s64(sk), p64(sk), o64(dv), dq64(d), t64(sk, 0.0);
  std::vector<float> s32(sk), p32(sk), o32(dv), dq32(d), t32(sk, 0.0f);
  std::vector<size_t> js;
  for (size_t hq = hk * g; hq < (hk + 1) * g; ++hq) {
    const size_t bh = b * c.heads_q + hq;
    for (size_t i = 0; i < sq; ++i) {
      const float* qi = &in.q[(bh * sq + i) * d];
      const size_t row = bh * sq + i;
      js.clear();
      for (size_t j = 0; j < sk; ++j)
        if (c.visible(i, j)) js.push_back(j);
      // A sink is one more term of each row's normaliser (no value); a row without keys then
      // has O = 0 and LSE = the sink.
      const double sink = c.sinks ? c.sink(hq) : -std::numeric_limits<double>::infinity();
      if (js.empty()) {
        ex.lse[row] = nv.lse[row] = c.sinks ? sink : std::numeric_limits<double>::infinity();
        continue;  // o, dq stay 0
      }
      double m64 = sink, l64 = 0;
      float m32 = static_cast<float>(sink), l32 = 0;
      const int64_t diag = static_cast<int64_t>(i) +
          (c.align == MaskAlign::kBottomRight ? static_cast<int64_t>(sk) - static_cast<int64_t>(sq) : 0);
      for (size_t j : js) {
        double a64 = 0;
        float a32 = 0;
        for (size_t t = 0; t < d; ++t) {
          a64 += static_cast<double>(qi[t]) * k[j * d + t];
          a32 += qi[t] * k[j * d + t];
        }
        s64[j] = a64 * scale64;
        s32[j] = round_to(c.dtype, a32 * sm_scale);
        if (c.softcap > 0) {  // s = cap * tanh(s / cap); t kept for the backward's 1 - t^2
          t64[j] = std::tanh(s64[j] / c.softcap);
          t32[j] = round_to(c.dtype, std::tanh(s32[j] / c.softcap));
          s64[j] = c.softcap * t64[j];
          s32[j] = round_to(c.dtype, c.softcap * t32[j]);
        }
        if (c.alibi_rows > 0) {  // -slope * |i + off - j|, off the mask's diagonal
          const float dist = static_cast<float>(std::llabs(diag - static_cast<int64_t>(j)));
          s64[j] -= static_cast<double>(c.slope(b, hq)) * dist;
          s32[j] = round_to(c.dtype, s32[j] - c.slope(b, hq) * dist);
        }
        m64 = std::max(m64, s64[j]);
        m32 = std::max(m32, s32[j]);
      }
      if (c.sinks) {
        l64 = std::exp(sink - m64);
        l32 = std::exp(static_cast<float>(sink) - m32);
      }
      for (size_t j : js) {
        l64 += std::exp(s64[j] - m64);
        l32 += std::exp(s32[j] - m32);
      }
      std::fill(o64.begin(), o64.end(), 0.0);
      std::fill(o32.begin(), o32.end(), 0.0f);
      for (size_t j : js) {
        p64[j] = std::exp(s64[j] - m64) / l64;
        p32[j] = round_to(c.dtype, std::exp(s32[j] - m32) / l32);
        for (size_t t = 0; t < dv; ++t) {
          o64[t] += p64[j] * v[j * dv + t];
          o32[t] += p32[j] * v[j * dv + t];
        }
      }
      for (size_t t = 0; t < dv; ++t) {
        o32[t] = round_to(c.dtype, o32[t]);
        ex.o[row * dv + t] = o64[t];
        nv.o[row * dv + t] = o32[t];
      }
      ex.lse[row] = m64 + std::log(l64);
      nv.lse[row] = m32 + std::log(l32);
      if (!c.backward) continue;

      const float* doi = &in.d_o[row * dv];
      double delta64 = 0;
      float delta32 = 0;
      for (size_t t = 0; t < dv; ++t) {
        delta64 += doi[t] * o64[t];
        delta32 += doi[t] * o32[t];
      }
      std::fill(dq64.begin(), dq64.end(), 0.0);
      std::fill(dq32.begin(), dq32.end(), 0.0f);
      for (size_t j : js) {
        double dp64 = 0;
        float dp32 = 0;
        for (size_t t = 0; t < dv; ++t) {
          dp64 += static_cast<double>(doi[t]) * v[j * dv + t];
          dp32 += doi[t] * v[j * dv + t];
        }
        dp32 = round_to(c.dtype, dp32);
        double ds64 = p64[j] * (dp64 - delta64);
        float ds32 = round_to(c.dtype, p32[j] * (dp32 - delta32));
        if (c.softcap > 0) {
          ds64 *= 1.0 - t64[j] * t64[j];
          ds32 = round_to(c.dtype, ds32 * (1.0f - t32[j] * t32[j]));
        }
        for (size_t t = 0; t < d; ++t) {
          dq64[t] += ds64 * k[j * d + t];
          dq32[t] += ds32 * k[j * d + t];
          dk64[j * d + t] += ds64 * qi[t];
          dk32[j * d + t] += ds32 * qi[t];
        }
        for (size_t t = 0; t < dv; ++t) {
          dv64[j * dv + t] += p64[j] * doi[t];
          dv32[j * dv + t] += p32[j] * doi[t];
        }
      }
      for (size_t t = 0; t < d; ++t) {
        ex.dq[row * d + t] = scale64 * dq64[t];
        nv.dq[row * d + t] = round_to(c.dtype, sm_scale * dq32[t]);
      }
    }
  }
  if (!c.backward) return;
  for (size_t x = 0; x < sk * d; ++x) {
    ex.dk[kv + x] = scale64 * dk64[x];
    nv.dk[kv + x] = round_to(c.dtype, sm_scale * dk32[x]);
  }
  for (size_t x = 0; x < sk * dv; ++x) {
    ex.dv[kv_v + x] = dv64[x];
    nv.dv[kv_v + x] = round_to(c.dtype, dv32[x]);
  }
}

void reference(const Case& c, float sm_scale, const Inputs& in, Outputs& exact, Outputs& naive) {
  const size_t nq = c.batch * c.heads_q * c.seqlen_q, nk = c.batch * c.heads_k * c.seqlen_k, d = c.head_dim;
  const size_t dv = c.dv();
  for (Outputs* out : {&exact, &naive}) {
    out->o.assign(nq * dv, 0);
    out->lse.assign(nq, 0);
    out->dq.assign(c.backward ? nq * d : 0, 0);
    out->dk.assign(c.backward ? nk * d : 0, 0);
    out->dv.assign(c.backward ? nk * dv : 0, 0);
  }
  const size_t jobs = c.batch * c.heads_k;
  const size_t threads = std::max<size_t>(1, std::min<size_t>({64, std::thread::hardware_concurrency(), jobs}));
  std::vector<std::thread> pool;
  for (size_t w = 0; w < threads; ++w) {
    pool.emplace_back([&, w] {
      for (size_t job = w; job < jobs; job += threads)
        reference_group(c, sm_scale, in, job / c.heads_k, job % c.heads_k, exact, naive);
    });
  }
  for (auto& t : pool) t.join();
}

// max |a - r| where neither is NaN (NaNs are counted separately); inf vs finite gives inf.
double max_err(const std::vector<double>& a, const std::vector<double>& r) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(r[i]) || a[i] == r[i]) continue;
    m = std::max(m, std::fabs(a[i] - r[i]));
  }
  return m;
}

size_t count_nan(const std::vector<double>& a) {
  return static_cast<size_t>(std::count_if(a.begin(), a.end(), [](double x) { return std::isnan(x); }));
}

struct Outcome {
  bool pass;
  std::string line;
};

// ---- backend (--backend auto|portable|gluon) ------------------------------------------------
// Every FwdParams / BwdParams this test builds asks for g_backend. The Gluon backend's dispatch
// rule (flash.h), restated so that a wrong refusal or a wrong acceptance fails a case: fp16 /
// bf16, no dropout or bias, head dim <= 256 (both passes; packed batches too), every
// tensor TMA-addressable (16-byte aligned base, last stride 1, other strides multiples of 16
// bytes: the padded rows and the 2-byte shifted q here break that), and for the backward a
// workspace of attn_bwd_workspace_bytes(). A forced Gluon that cannot serve a call must return
// kUnsupportedByBackend with a message and launch nothing.
using aotriton::v2::flash::Backend;

Backend g_backend = Backend::kAuto;

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kAuto: return "auto";
    case Backend::kPortable: return "portable";
    case Backend::kGluon: return "gluon";
  }
  return "?";
}

bool parse_backend(const std::string& name, Backend& out) {
  for (Backend b : {Backend::kAuto, Backend::kPortable, Backend::kGluon}) {
    if (name == backend_name(b)) {
      out = b;
      return true;
    }
  }
  return false;
}

bool forced_gluon() { return g_backend == Backend::kGluon; }

// The tag every case line carries.
std::string backend_tag() { return std::string("  [") + backend_name(g_backend) + "]"; }

// What the Gluon dispatch rule looks at.
struct GluonTraits {
  bool lowp;        // fp16 / bf16
  size_t head_dim;
  bool tma_layout;  // every tensor meets TMA's rules
  bool features;    // bias or soft-capping (packed batches and dropout are served)
  bool serves() const { return lowp && !features && tma_layout && head_dim <= 256u; }
};

// A call the forced Gluon backend must refuse: kUnsupportedByBackend with a message. True with
// the note for the case line, or false with the problem.
bool expect_refusal(const char* what, aotriton::Status st, std::string& note) {
  const std::string message = aotriton::last_error_message();
  if (st == aotriton::Status::kUnsupportedByBackend && !message.empty()) {
    note = std::string(what) + " refused by gluon (" + message + ")";
    return true;
  }
  if (st == aotriton::Status::kSuccess) {
    note = std::string(what) + ": gluon accepted a call the dispatch rule says it cannot serve!";
  } else {
    note = std::string(what) + ": expected kUnsupportedByBackend, got " + aotriton::status_name(st) + ": " + message + "!";
  }
  return false;
}

// The refusal of a backward: attn_bwd_workspace_bytes and attn_bwd both return
// kUnsupportedByBackend (the former with *bytes = 0). True with the note, or false with the
// problem.
bool expect_bwd_refusal(const aotriton::v2::flash::BwdParams& p, CUstream stream, std::string& note) {
  uint64_t bytes = 1;
  std::string ws_note;
  const bool ws_refused =
      expect_refusal("attn_bwd_workspace_bytes", aotriton::v2::flash::attn_bwd_workspace_bytes(p, aotriton::Stream{stream}, &bytes),
                     ws_note);
  const bool refused = expect_refusal("attn_bwd", aotriton::v2::flash::attn_bwd(p, aotriton::Stream{stream}), note);
  if (!ws_refused) {
    note += "; " + ws_note;
  } else if (bytes != 0) {
    note += "; attn_bwd_workspace_bytes refused but set *bytes = " + std::to_string(bytes) + "!";
  }
  return refused && ws_refused && bytes == 0;
}

// The backward's workspace: asks attn_bwd_workspace_bytes what `p` needs on `stream`; when more
// than 0 bytes, allocates them, poisons them (0xFF bytes: NaN in every dtype, so a kernel that
// reads what it did not write shows up) and attaches them to `p`. `buf` owns the allocation
// (free it only after the backward has finished). Returns an empty string, or the problem.
std::string attach_workspace(aotriton::v2::flash::BwdParams& p, CUstream stream, std::unique_ptr<DevBuf>& buf) {
  p.workspace = nullptr;
  p.workspace_bytes = 0;
  uint64_t bytes = 0;
  const aotriton::Status st = aotriton::v2::flash::attn_bwd_workspace_bytes(p, aotriton::Stream{stream}, &bytes);
  if (st != aotriton::Status::kSuccess)
    return std::string("attn_bwd_workspace_bytes returned ") + aotriton::status_name(st) + ": " + aotriton::last_error_message();
  buf.reset();
  if (bytes == 0) return "";
  buf.reset(new DevBuf(static_cast<size_t>(bytes)));
  buf->upload(std::vector<uint8_t>(static_cast<size_t>(bytes), 0xFF), stream);
  check(g_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
  p.workspace = reinterpret_cast<void*>(static_cast<uintptr_t>(buf->ptr));
  p.workspace_bytes = bytes;
  return "";
}

// Whether the backward `p` runs on the Gluon kernels: forced, or kAuto given a workspace (the
// library asks for one only when it will run them). Their dQ is summed with reduce-adds in no
// fixed order, so its bits may differ from run to run unless `deterministic` is set.
bool gluon_backward(const aotriton::v2::flash::BwdParams& p) {
  return p.backend == Backend::kGluon || (p.backend == Backend::kAuto && p.workspace != nullptr);
}

aotriton::DType api_dtype(Lowp t) { return t == Lowp::kF16 ? aotriton::DType::kFloat16 : aotriton::DType::kBFloat16; }

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// max|got - exact| <= k * max|naive - exact| + floor (x max(1, max|exact|) when scale_floor); no NaN.
bool bounded_floor(const char* name, const std::vector<double>& got, const std::vector<double>& exact,
                   const std::vector<double>& naive, double k, double floor, bool scale_floor, std::string& line) {
  if (scale_floor) {
    double mag = 1.0;
    for (double x : exact) mag = std::max(mag, std::fabs(x));
    floor *= mag;
  }
  const double err = max_err(got, exact), bound = k * max_err(naive, exact) + floor;
  const size_t nan = count_nan(got);
  const bool ok = nan == 0 && err <= bound;
  line += std::string("  ") + name + " " + fmt("%.2e", err) + "/" + fmt("%.2e", bound);
  if (nan) line += "[" + std::to_string(nan) + " NaN]";
  if (!ok) line += "!";
  return ok;
}

// `bounded_floor` with the usual floor, 1e-3 (x max(1, max|exact|) for gradients).
bool bounded(const char* name, const std::vector<double>& got, const std::vector<double>& exact,
             const std::vector<double>& naive, double k, bool scale_floor, std::string& line) {
  return bounded_floor(name, got, exact, naive, k, 1e-3, scale_floor, line);
}

// LSE: finite reference rows within 3 * max|naive - exact| + 1e-3 * max(1, |lse_i|); +inf exactly
// where the reference is +inf.
bool lse_ok(const std::vector<double>& got, const std::vector<double>& exact, const std::vector<double>& naive,
            std::string& line) {
  double naive_err = 0, worst = 0;
  for (size_t i = 0; i < exact.size(); ++i)
    if (std::isfinite(exact[i]) && std::isfinite(naive[i])) naive_err = std::max(naive_err, std::fabs(naive[i] - exact[i]));
  size_t bad = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    if (std::isinf(exact[i])) {
      bad += !(got[i] == std::numeric_limits<double>::infinity());
      continue;
    }
    const double bound = 3 * naive_err + 1e-3 * std::max(1.0, std::fabs(exact[i]));
    const double err = std::isfinite(got[i]) ? std::fabs(got[i] - exact[i]) : std::numeric_limits<double>::infinity();
    bad += !(err <= bound);
    worst = std::max(worst, err / bound);
  }
  line += "  LSE err/bound " + fmt("%.2f", worst);
  if (bad) line += "[" + std::to_string(bad) + " rows wrong]!";
  return bad == 0;
}

// The forward's tensors, scale, mask and backend as a case states them (either case type); each
// case adds its own variants.
template <typename CaseT>
aotriton::v2::flash::FwdParams fwd_params(const CaseT& c, aotriton::TensorView<4> q, aotriton::TensorView<4> k,
                                          aotriton::TensorView<4> v, aotriton::TensorView<4> o,
                                          aotriton::TensorView<3> lse, float sm_scale) {
  aotriton::v2::flash::FwdParams fp;
  fp.q = q;
  fp.k = k;
  fp.v = v;
  fp.o = o;
  fp.lse = lse;
  fp.sm_scale = sm_scale;
  fp.causal = c.causal;
  fp.align = c.align;
  fp.window_left = c.window_left;
  fp.window_right = c.window_right;
  fp.backend = g_backend;
  return fp;
}

// The backward of the forward call `fp`: every field they share, as the forward had it, and the
// backward's own tensors (gradients' buffers of bias and sinks, and modes, are the caller's).
aotriton::v2::flash::BwdParams backward_of(const aotriton::v2::flash::FwdParams& fp, aotriton::TensorView<4> d_o,
                                           aotriton::TensorView<3> delta, aotriton::TensorView<4> dq,
                                           aotriton::TensorView<4> dk, aotriton::TensorView<4> dv) {
  aotriton::v2::flash::BwdParams bp;
  bp.q = fp.q;
  bp.k = fp.k;
  bp.v = fp.v;
  bp.o = fp.o;
  bp.d_o = d_o;
  bp.lse = fp.lse;
  bp.delta = delta;
  bp.dq = dq;
  bp.dk = dk;
  bp.dv = dv;
  bp.sm_scale = fp.sm_scale;
  bp.causal = fp.causal;
  bp.align = fp.align;
  bp.window_left = fp.window_left;
  bp.window_right = fp.window_right;
  bp.softcap = fp.softcap;
  bp.alibi_slopes = fp.alibi_slopes;
  bp.sinks = fp.sinks;
  bp.bias = fp.bias;
  bp.dropout_p = fp.dropout_p;
  bp.philox_seed = fp.philox_seed;
  bp.philox_offset = fp.philox_offset;
  bp.philox_offset_base = fp.philox_offset_base;
  bp.cu_seqlens_q = fp.cu_seqlens_q;
  bp.cu_seqlens_k = fp.cu_seqlens_k;
  bp.max_seqlen_q = fp.max_seqlen_q;
  bp.max_seqlen_k = fp.max_seqlen_k;
  bp.cu_seqlens_q_host = fp.cu_seqlens_q_host;
  bp.cu_seqlens_k_host = fp.cu_seqlens_k_host;
  bp.allow_tf32 = fp.allow_tf32;
  bp.backend = fp.backend;
  return bp;
}

Outcome run_case(const Case& c, SplitMix64& rng, CUstream stream) {
  using aotriton::Status;
  namespace fl = aotriton::v2::flash;
  const float sm_scale = c.sm_scale > 0 ? c.sm_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const size_t b = c.batch, hq = c.heads_q, hk = c.heads_k, sq = c.seqlen_q, sk = c.seqlen_k, d = c.head_dim;
  const size_t dv = c.dv();
  auto draw = [&](size_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = rng.normal_in(c.dtype);
    return x;
  };
  std::vector<float> q = draw(b * hq * sq * d), k = draw(b * hk * sk * d), v = draw(b * hk * sk * dv);
  std::vector<float> d_o = c.backward ? draw(b * hq * sq * dv) : std::vector<float>();
  auto enc = [&](const std::vector<float>& x) {
    std::vector<uint16_t> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = to_bits(c.dtype, x[i]);
    return out;
  };
  auto fail = [&](const std::string& what) { return Outcome{false, c.describe() + backend_tag() + "  " + what + "  FAIL"}; };
  const std::vector<uint16_t> qb = enc(q), kb = enc(k), vb = enc(v), dob = enc(d_o);

  // Inputs inside NaN guards; outputs all NaN.
  DevTensor<uint16_t, 4> q_dev(place4(c, hq, sq, d, true), &qb, kPoison16, stream);
  DevTensor<uint16_t, 4> k_dev(place4(c, hk, sk, d, false), &kb, kPoison16, stream);
  DevTensor<uint16_t, 4> v_dev(place4(c, hk, sk, dv, false), &vb, kPoison16, stream);
  DevTensor<uint16_t, 4> o_dev(place4(c, hq, sq, dv, false), nullptr, kPoison16, stream);
  DevTensor<uint32_t, 3> lse_dev(place_rows(c), nullptr, kPoison32, stream);
  const aotriton::DType dt = api_dtype(c.dtype);
  fl::FwdParams fp = fwd_params(c, q_dev.view(dt), k_dev.view(dt), v_dev.view(dt), o_dev.view(dt),
                                lse_dev.view(aotriton::DType::kFloat32), sm_scale);
  fp.softcap = c.softcap;
  // ALiBi slopes [rows, Hq] and sinks [Hq], fp32 (bit patterns), with their gradient's buffer.
  std::optional<DevTensor<uint32_t, 2>> slopes_dev;
  std::optional<DevTensor<uint32_t, 1>> sinks_dev, dsinks_dev;
  if (c.alibi_rows > 0) {
    std::vector<uint32_t> bits;
    for (size_t row = 0; row < c.alibi_rows; ++row)
      for (size_t h = 0; h < hq; ++h) bits.push_back(bits_of(c.slope(row, h)));
    const size_t sizes[2] = {c.alibi_rows, hq}, strides[2] = {hq, 1};
    slopes_dev.emplace(Placement<2>(sizes, strides, 0), &bits, kPoison32, stream);
    fp.alibi_slopes = slopes_dev->view(aotriton::DType::kFloat32);
  }
  if (c.sinks) {
    std::vector<uint32_t> bits;
    for (size_t h = 0; h < hq; ++h) bits.push_back(bits_of(c.sink(h)));
    const size_t sizes[1] = {hq}, strides[1] = {1};
    sinks_dev.emplace(Placement<1>(sizes, strides, 0), &bits, kPoison32, stream);
    dsinks_dev.emplace(Placement<1>(sizes, strides, 0), nullptr, kPoison32, stream);
    fp.sinks = sinks_dev->view(aotriton::DType::kFloat32);
  }

  // The backward's buffers and parameters (set up before the forward: a forced Gluon backend
  // checks its refusals first).
  std::optional<DevTensor<uint16_t, 4>> do_dev, dq_dev, dk_dev, dv_dev;
  std::optional<DevTensor<uint32_t, 3>> delta_dev;
  fl::BwdParams bp;
  if (c.backward) {
    do_dev.emplace(place4(c, hq, sq, dv, true), &dob, kPoison16, stream);
    delta_dev.emplace(place_rows(c), nullptr, kPoison32, stream);
    dq_dev.emplace(place4(c, hq, sq, d, true), nullptr, kPoison16, stream);
    dk_dev.emplace(place4(c, hk, sk, d, false), nullptr, kPoison16, stream);
    dv_dev.emplace(place4(c, hk, sk, dv, false), nullptr, kPoison16, stream);
    bp = backward_of(fp, do_dev->view(dt), delta_dev->view(aotriton::DType::kFloat32), dq_dev->view(dt),
                     dk_dev->view(dt), dv_dev->view(dt));
    if (dsinks_dev) bp.dsinks = dsinks_dev->view(aotriton::DType::kFloat32);
  }
  auto bwd_untouched = [&] {
    return !c.backward || (dq_dev->read(stream) == dq_dev->host && dk_dev->read(stream) == dk_dev->host &&
                           dv_dev->read(stream) == dv_dev->host && delta_dev->read(stream) == delta_dev->host);
  };

  // Forced Gluon: a case outside its rule must be refused, nothing written.
  if (forced_gluon()) {
    const GluonTraits traits{true, d, c.layout == Layout::kBhsd || c.layout == Layout::kBshd,
                               c.softcap > 0 || c.alibi_rows > 0 || c.sinks || dv != d};
    if (!traits.serves()) {
      std::string note;
      bool refused = expect_refusal("attn_fwd", fl::attn_fwd(fp, aotriton::Stream{stream}), note);
      if (c.backward) {
        std::string bwd_note;
        refused &= expect_bwd_refusal(bp, stream, bwd_note);
        note += "; " + bwd_note;
      }
      const bool untouched = o_dev.read(stream) == o_dev.host && lse_dev.read(stream) == lse_dev.host && bwd_untouched();
      const bool ok = refused && untouched;
      return {ok, c.describe() + backend_tag() + "  " + note + (untouched ? "" : " [outputs written]!") +
                      (ok ? "  PASS" : "  FAIL")};
    }
  }

  auto started = std::chrono::steady_clock::now();
  std::vector<uint16_t> o_first;
  bool lse_untouched = true;
  if (c.fwd_without_lse) {
    fl::FwdParams no_lse = fp;
    no_lse.lse.data = nullptr;
    Status st = fl::attn_fwd(no_lse, aotriton::Stream{stream});
    if (st != Status::kSuccess)
      return fail(std::string("attn_fwd (no lse) returned ") + aotriton::status_name(st) + ": " + aotriton::last_error_message());
    o_first = o_dev.read(stream);
    lse_untouched = lse_dev.read(stream) == lse_dev.host;
    o_dev.restore(stream);
  }
  Status st = fl::attn_fwd(fp, aotriton::Stream{stream});
  if (st != Status::kSuccess)
    return fail(std::string("attn_fwd returned ") + aotriton::status_name(st) + ": " + aotriton::last_error_message());
  const std::vector<uint16_t> o_bits = o_dev.read(stream);
  const std::vector<uint32_t> lse_bits = lse_dev.read(stream);

  std::vector<uint16_t> dq_bits, dk_bits, dv_bits, dq_det_bits;
  std::vector<uint32_t> delta_bits;
  size_t stray = o_dev.stray(o_bits) + lse_dev.stray(lse_bits);
  bool inputs_changed = false;
  bool ran_deterministic = false;
  size_t nondeterministic = 0;
  if (c.backward) {
    std::unique_ptr<DevBuf> workspace;
    std::string problem = attach_workspace(bp, stream, workspace);
    if (!problem.empty()) return fail(problem);
    st = fl::attn_bwd(bp, aotriton::Stream{stream});
    if (st != Status::kSuccess)
      return fail(std::string("attn_bwd returned ") + aotriton::status_name(st) + ": " + aotriton::last_error_message());
    dq_bits = dq_dev->read(stream);
    dk_bits = dk_dev->read(stream);
    dv_bits = dv_dev->read(stream);
    delta_bits = delta_dev->read(stream);
    stray += dq_dev->stray(dq_bits) + dk_dev->stray(dk_bits) + dv_dev->stray(dv_bits) + delta_dev->stray(delta_bits);
    // The Gluon backward's dQ is not bitwise reproducible (unordered fp32 reduce-adds): rerun it
    // in deterministic mode (Gluon dK/dV + a deterministic dQ kernel), outputs re-poisoned each
    // time; the reruns must agree bit for bit, their dK/dV must equal the first run's (they do
    // not depend on the mode), and their dQ is checked against the reference below.
    if (gluon_backward(bp)) {
      ran_deterministic = true;
      bp.deterministic = true;
      problem = attach_workspace(bp, stream, workspace);
      if (!problem.empty()) return fail(problem + " (deterministic)");
      constexpr int kDeterministicRuns = 3;
      std::vector<uint16_t> first_dq, first_dk, first_dv;
      for (int run = 0; run < kDeterministicRuns; ++run) {
        dq_dev->restore(stream);
        dk_dev->restore(stream);
        dv_dev->restore(stream);
        st = fl::attn_bwd(bp, aotriton::Stream{stream});
        if (st != Status::kSuccess)
          return fail(std::string("attn_bwd (deterministic) returned ") + aotriton::status_name(st) + ": " +
                      aotriton::last_error_message());
        std::vector<uint16_t> rdq = dq_dev->read(stream), rdk = dk_dev->read(stream), rdv = dv_dev->read(stream);
        if (run == 0) {
          first_dq = std::move(rdq);
          first_dk = std::move(rdk);
          first_dv = std::move(rdv);
        } else {
          nondeterministic += rdq != first_dq || rdk != first_dk || rdv != first_dv;
        }
      }
      nondeterministic += first_dk != dk_bits || first_dv != dv_bits;
      stray += dq_dev->stray(first_dq);
      dq_det_bits = dq_dev->logical(first_dq);
    }
    if (o_dev.read(stream) != o_bits || lse_dev.read(stream) != lse_bits || q_dev.read(stream) != q_dev.host ||
        k_dev.read(stream) != k_dev.host || v_dev.read(stream) != v_dev.host || do_dev->read(stream) != do_dev->host ||
        (slopes_dev && slopes_dev->read(stream) != slopes_dev->host) || (sinks_dev && sinks_dev->read(stream) != sinks_dev->host))
      inputs_changed = true;
    dq_bits = dq_dev->logical(dq_bits);
    dk_bits = dk_dev->logical(dk_bits);
    dv_bits = dv_dev->logical(dv_bits);
  }
  double gpu_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();

  Outputs exact, naive;
  reference(c, sm_scale, Inputs{q, k, v, d_o}, exact, naive);

  auto dec = [&](const std::vector<uint16_t>& bits) {
    std::vector<double> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = from_bits(c.dtype, bits[i]);
    return out;
  };
  std::vector<double> o = dec(o_dev.logical(o_bits)), lse;
  for (uint32_t x : lse_dev.logical(lse_bits)) lse.push_back(float_of(x));
  std::string line = c.describe() + backend_tag();
  bool pass = bounded("O", o, exact.o, naive.o, 3, false, line);
  pass &= lse_ok(lse, exact.lse, naive.lse, line);
  std::vector<double> dq, dq_det;
  if (c.backward) {
    dq = dec(dq_bits);
    pass &= bounded("dQ", dq, exact.dq, naive.dq, 5, true, line);
    pass &= bounded("dK", dec(dk_bits), exact.dk, naive.dk, 5, true, line);
    pass &= bounded("dV", dec(dv_bits), exact.dv, naive.dv, 5, true, line);
  }
  if (c.backward && dsinks_dev) {  // -sum_{b,i} exp(sink - lse) * rowsum(dO * O), per head
    std::vector<double> want(hq, 0.0), low(hq, 0.0), got;
    for (size_t bb = 0; bb < b; ++bb) {
      for (size_t h = 0; h < hq; ++h) {
        for (size_t i = 0; i < sq; ++i) {
          const size_t row = (bb * hq + h) * sq + i;
          double delta64 = 0;
          float delta32 = 0;
          for (size_t t = 0; t < dv; ++t) {
            delta64 += d_o[row * dv + t] * exact.o[row * dv + t];
            delta32 += d_o[row * dv + t] * static_cast<float>(naive.o[row * dv + t]);
          }
          want[h] -= std::exp(c.sink(h) - exact.lse[row]) * delta64;
          low[h] -= std::exp(c.sink(h) - static_cast<float>(naive.lse[row])) * delta32;
        }
      }
    }
    for (uint32_t x : dsinks_dev->logical(dsinks_dev->read(stream))) got.push_back(float_of(x));
    pass &= bounded("dSinks", got, want, low, 5, true, line);
  }
  if (ran_deterministic) {
    dq_det = dec(dq_det_bits);
    pass &= bounded("dQ(det)", dq_det, exact.dq, naive.dq, 5, true, line);
    if (nondeterministic) line += "  [deterministic reruns differ: " + std::to_string(nondeterministic) + "]!";
    pass &= nondeterministic == 0;
  }
  if (c.fwd_without_lse) {
    pass &= bounded("O(no-lse)", dec(o_dev.logical(o_first)), exact.o, naive.o, 3, false, line);
    if (!lse_untouched) line += "  [LSE written though not wanted]!";
    pass &= lse_untouched;
  }
  // Rows without keys: O (and dQ) exactly 0.
  size_t empty = 0, nonzero = 0;
  for (size_t row = 0; row < exact.lse.size(); ++row) {
    if (!std::isinf(exact.lse[row])) continue;
    ++empty;
    for (size_t t = 0; t < dv; ++t) nonzero += o[row * dv + t] != 0.0;
    for (size_t t = 0; t < d; ++t)
      nonzero += (c.backward && dq[row * d + t] != 0.0) || (ran_deterministic && dq_det[row * d + t] != 0.0);
  }
  if (empty) line += "  empty rows " + std::to_string(empty);
  if (nonzero) line += "[" + std::to_string(nonzero) + " nonzero O/dQ]!";
  pass &= nonzero == 0;
  if (inputs_changed) line += "  the backward changed an input!";
  if (stray) line += "  " + std::to_string(stray) + " writes outside the views!";
  pass &= stray == 0 && !inputs_changed;
  line += "  (" + fmt("%.1f", gpu_ms) + " ms)  " + (pass ? "PASS" : "FAIL");
  return {pass, line};
}

// ---- third milestone: dropout, bias + dBias, packed batches, fp32 ---------------------------
// Forward + backward through the C++ API with the features of FwdParams v3 / BwdParams v2.
// The dropout keep-mask of the reference is the library's own flash::debug_dropout_mask (the
// Rust suite checks that mask bit for bit against a host Philox model and against the masks
// the forward and backward use); the reference is the row-by-row one above extended with the
// bias (s = scale q.k + bias), dropout (O = sum_j p_j m_j r v_j, dp_j = m_j r dO.v_j,
// ds_j = p_j (dp_j - D)) and dBias = ds summed over the bias's broadcast dims, run per sequence
// for packed batches (each sequence's own lengths for the mask, local positions for bias and
// dropout, max lengths for the mask's counter layout). fp32: the naive reference is the same
// math in float, floor 1e-5 (x max(1, max|ref|) for every tensor).
enum class Elt { kF16, kBF16, kF32 };

const char* elt_name(Elt e) { return e == Elt::kF16 ? "fp16" : e == Elt::kBF16 ? "bf16" : "fp32"; }
aotriton::DType elt_dtype(Elt e) {
  return e == Elt::kF16 ? aotriton::DType::kFloat16 : e == Elt::kBF16 ? aotriton::DType::kBFloat16 : aotriton::DType::kFloat32;
}
Lowp elt_lowp(Elt e) { return e == Elt::kF16 ? Lowp::kF16 : Lowp::kBF16; }
float elt_round(Elt e, float x) { return e == Elt::kF32 ? x : round_to(elt_lowp(e), x); }

template <typename T>
T elt_enc(Elt e, float x);
template <>
uint16_t elt_enc<uint16_t>(Elt e, float x) {
  return to_bits(elt_lowp(e), x);
}
template <>
uint32_t elt_enc<uint32_t>(Elt, float x) {
  return bits_of(x);
}
template <typename T>
float elt_dec(Elt e, T b);
template <>
float elt_dec<uint16_t>(Elt e, uint16_t b) {
  return from_bits(elt_lowp(e), b);
}
template <>
float elt_dec<uint32_t>(Elt, uint32_t b) {
  return float_of(b);
}

constexpr size_t kTail = 2;  // poisoned tokens after the last sequence of a packed tensor

struct FeatCase {
  Elt dtype = Elt::kF16;
  size_t d = 0, batch = 0, hq = 0, hk = 0, sq = 0, sk = 0;  // packed: batch = sequences, sq / sk = max lengths
  bool causal = false;
  MaskAlign align = MaskAlign::kTopLeft;
  int32_t window_left = -1, window_right = -1;
  bool bias = false;
  bool bias_one[3] = {false, false, false};  // bias size 1 (broadcast) in B, Hq, Sq
  float dropout = 0.0f;
  std::vector<size_t> lq, lk;  // packed batch when not empty
  bool host_cu = false;

  bool packed() const { return !lq.empty(); }
  size_t group() const { return hq / hk; }
  bool visible(size_t i, size_t j, size_t len_q, size_t len_k) const {
    int64_t off = align == MaskAlign::kBottomRight ? static_cast<int64_t>(len_k) - static_cast<int64_t>(len_q) : 0;
    int64_t left = window_left, right = causal ? 0 : window_right;
    int64_t diag = static_cast<int64_t>(i) + off, jj = static_cast<int64_t>(j);
    return (left < 0 || jj >= diag - left) && (right < 0 || jj <= diag + right);
  }
  std::vector<size_t> cu(const std::vector<size_t>& l) const {
    std::vector<size_t> c(1, 0);
    for (size_t x : l) c.push_back(c.back() + x);
    return c;
  }
  size_t tokens_q() const { return packed() ? cu(lq).back() + kTail : sq; }
  size_t tokens_k() const { return packed() ? cu(lk).back() + kTail : sk; }
  size_t len_q(size_t s) const { return packed() ? lq[s] : sq; }
  size_t len_k(size_t s) const { return packed() ? lk[s] : sk; }
  // Row (token) index into the logical [*, D] arrays: [B, H, S, D] or packed [1, H, T, D].
  size_t qrow(size_t s, size_t h, size_t i) const {
    return packed() ? h * tokens_q() + cu(lq)[s] + i : (s * hq + h) * sq + i;
  }
  size_t krow(size_t s, size_t h, size_t j) const {
    return packed() ? h * tokens_k() + cu(lk)[s] + j : (s * hk + h) * sk + j;
  }
  void bias_sizes(size_t out[4]) const {
    out[0] = bias_one[0] ? 1 : batch;
    out[1] = bias_one[1] ? 1 : hq;
    out[2] = bias_one[2] ? 1 : sq;
    out[3] = sk;
  }
  size_t bias_at(size_t s, size_t h, size_t i, size_t j) const {
    size_t z[4];
    bias_sizes(z);
    return (((z[0] == 1 ? 0 : s) * z[1] + (z[1] == 1 ? 0 : h)) * z[2] + (z[2] == 1 ? 0 : i)) * z[3] + j;
  }
  std::string describe() const {
    char buf[256];
    const char* al = align == MaskAlign::kBottomRight ? "BR" : "TL";
    std::string mask = causal ? std::string("causal-") + al
                              : (window_left < 0 && window_right < 0)
                                    ? std::string("none")
                                    : "win(" + std::to_string(window_left) + "," + std::to_string(window_right) + ")-" + al;
    std::snprintf(buf, sizeof buf, "fwd+bwd %s D=%-3zu G=%zu Hq=%zu Hk=%zu B=%zu Sq=%-4zu Sk=%-4zu mask=%s", elt_name(dtype),
                  d, group(), hq, hk, batch, sq, sk, mask.c_str());
    std::string s = buf;
    if (bias) {
      s += std::string(" bias=[") + (bias_one[0] ? "1" : "B") + "," + (bias_one[1] ? "1" : "Hq") + "," +
           (bias_one[2] ? "1" : "Sq") + ",Sk]";
    }
    if (dropout > 0) s += " dropout=" + fmt("%g", dropout);
    if (packed()) {
      s += " packed q{";
      for (size_t i = 0; i < lq.size(); ++i) s += (i ? "," : "") + std::to_string(lq[i]);
      s += "} k{";
      for (size_t i = 0; i < lk.size(); ++i) s += (i ? "," : "") + std::to_string(lk[i]);
      s += host_cu ? "} +host" : "}";
    }
    return s;
  }
};

struct FeatRef {
  std::vector<double> o, lse, dq, dk, dv, dbias;
};

// exact (double) and naive (float, products rounded to the dtype) references; elements of tail
// tokens stay NaN. `keep`: B x Hq x Sq x Sk (max lengths) 0/1 or empty.
void feat_reference(const FeatCase& c, float sm_scale, const std::vector<float>& q, const std::vector<float>& k,
                    const std::vector<float>& v, const std::vector<float>& d_o, const std::vector<float>& bias,
                    const std::vector<float>& keep, FeatRef& ex, FeatRef& nv) {
  const size_t d = c.d, g = c.group(), nq = c.hq * c.tokens_q() * (c.packed() ? 1 : c.batch),
               nk = c.hk * c.tokens_k() * (c.packed() ? 1 : c.batch);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  size_t bz[4];
  c.bias_sizes(bz);
  const size_t nb = c.bias ? bz[0] * bz[1] * bz[2] * bz[3] : 0;
  for (FeatRef* r : {&ex, &nv}) {
    r->o.assign(nq * d, nan);
    r->dq.assign(nq * d, nan);
    r->lse.assign(nq, nan);
    r->dk.assign(nk * d, nan);
    r->dv.assign(nk * d, nan);
    r->dbias.assign(nb, 0.0);
  }
  std::vector<float> dbias32(nb, 0.0f);
  const double r64 = c.dropout > 0 ? 1.0 / (1.0 - static_cast<double>(c.dropout)) : 1.0;
  const float r32 = static_cast<float>(r64);
  const Elt e = c.dtype;
  for (size_t s = 0; s < c.batch; ++s) {
    const size_t lq = c.len_q(s), lk = c.len_k(s);
    for (size_t h = 0; h < c.hk; ++h) {
      std::vector<double> dk64(lk * d, 0), dv64(lk * d, 0);
      std::vector<float> dk32(lk * d, 0), dv32(lk * d, 0);
      for (size_t hh = h * g; hh < (h + 1) * g; ++hh) {
        for (size_t i = 0; i < lq; ++i) {
          const size_t row = c.qrow(s, hh, i);
          const float* qi = &q[row * d];
          const float* doi = &d_o[row * d];
          std::vector<size_t> js;
          for (size_t j = 0; j < lk; ++j)
            if (c.visible(i, j, lq, lk)) js.push_back(j);
          if (js.empty()) {
            for (FeatRef* r : {&ex, &nv}) {
              r->lse[row] = inf;
              for (size_t t = 0; t < d; ++t) r->o[row * d + t] = r->dq[row * d + t] = 0.0;
            }
            continue;
          }
          std::vector<double> s64(lk), p64(lk, 0), f64(lk, 1.0);
          std::vector<float> s32(lk), p32(lk, 0), pd32(lk, 0), f32v(lk, 1.0f);
          double m64 = -inf, l64 = 0;
          float m32 = -std::numeric_limits<float>::infinity(), l32 = 0;
          for (size_t j : js) {
            const float* kj = &k[c.krow(s, h, j) * d];
            double a64 = 0;
            float a32 = 0;
            for (size_t t = 0; t < d; ++t) {
              a64 += static_cast<double>(qi[t]) * kj[t];
              a32 += qi[t] * kj[t];
            }
            const float b = c.bias ? bias[c.bias_at(s, hh, i, j)] : 0.0f;
            s64[j] = a64 * sm_scale + b;
            s32[j] = elt_round(e, a32 * sm_scale + b);
            m64 = std::max(m64, s64[j]);
            m32 = std::max(m32, s32[j]);
            if (!keep.empty()) {
              const float kept = keep[((s * c.hq + hh) * c.sq + i) * c.sk + j];
              f64[j] = kept * r64;
              f32v[j] = kept * r32;
            }
          }
          for (size_t j : js) {
            l64 += std::exp(s64[j] - m64);
            l32 += std::exp(s32[j] - m32);
          }
          std::vector<double> o64(d, 0);
          std::vector<float> o32(d, 0);
          for (size_t j : js) {
            const float* vj = &v[c.krow(s, h, j) * d];
            p64[j] = std::exp(s64[j] - m64) / l64;
            const float praw = std::exp(s32[j] - m32) / l32;
            p32[j] = elt_round(e, praw);
            pd32[j] = elt_round(e, praw * f32v[j]);
            for (size_t t = 0; t < d; ++t) {
              o64[t] += p64[j] * f64[j] * vj[t];
              o32[t] += pd32[j] * vj[t];
            }
          }
          double delta64 = 0;
          float delta32 = 0;
          for (size_t t = 0; t < d; ++t) {
            o32[t] = elt_round(e, o32[t]);
            ex.o[row * d + t] = o64[t];
            nv.o[row * d + t] = o32[t];
            delta64 += doi[t] * o64[t];
            delta32 += doi[t] * o32[t];
          }
          ex.lse[row] = m64 + std::log(l64);
          nv.lse[row] = m32 + std::log(l32);
          std::vector<double> dq64(d, 0);
          std::vector<float> dq32(d, 0);
          for (size_t j : js) {
            const size_t kr = c.krow(s, h, j);
            const float* kj = &k[kr * d];
            const float* vj = &v[kr * d];
            double dp64 = 0;
            float dp32 = 0;
            for (size_t t = 0; t < d; ++t) {
              dp64 += static_cast<double>(doi[t]) * vj[t];
              dp32 += doi[t] * vj[t];
            }
            dp64 *= f64[j];
            dp32 = elt_round(e, dp32 * f32v[j]);
            const double ds64 = p64[j] * (dp64 - delta64);
            const float ds32 = elt_round(e, p32[j] * (dp32 - delta32));
            if (c.bias) {
              ex.dbias[c.bias_at(s, hh, i, j)] += ds64;
              dbias32[c.bias_at(s, hh, i, j)] += ds32;
            }
            for (size_t t = 0; t < d; ++t) {
              dq64[t] += ds64 * kj[t];
              dq32[t] += ds32 * kj[t];
              dk64[j * d + t] += ds64 * qi[t];
              dk32[j * d + t] += ds32 * qi[t];
              dv64[j * d + t] += p64[j] * f64[j] * doi[t];
              dv32[j * d + t] += pd32[j] * doi[t];
            }
          }
          for (size_t t = 0; t < d; ++t) {
            ex.dq[row * d + t] = static_cast<double>(sm_scale) * dq64[t];
            nv.dq[row * d + t] = elt_round(e, sm_scale * dq32[t]);
          }
        }
      }
      for (size_t j = 0; j < lk; ++j) {
        const size_t kr = c.krow(s, h, j);
        for (size_t t = 0; t < d; ++t) {
          ex.dk[kr * d + t] = static_cast<double>(sm_scale) * dk64[j * d + t];
          ex.dv[kr * d + t] = dv64[j * d + t];
          nv.dk[kr * d + t] = elt_round(e, sm_scale * dk32[j * d + t]);
          nv.dv[kr * d + t] = elt_round(e, dv32[j * d + t]);
        }
      }
    }
  }
  for (size_t x = 0; x < nb; ++x) nv.dbias[x] = elt_round(e, dbias32[x]);
}

// The elements whose reference is not NaN (tail tokens of packed tensors are left out).
void live3(const std::vector<double>& got, const std::vector<double>& exact, const std::vector<double>& naive,
           std::vector<double>& g, std::vector<double>& x, std::vector<double>& n) {
  g.clear();
  x.clear();
  n.clear();
  for (size_t i = 0; i < exact.size(); ++i) {
    if (std::isnan(exact[i])) continue;
    g.push_back(got[i]);
    x.push_back(exact[i]);
    n.push_back(naive[i]);
  }
}


template <typename T>
Outcome run_feature_typed(const FeatCase& c, SplitMix64& rng, CUstream stream) {
  using aotriton::Status;
  namespace fl = aotriton::v2::flash;
  const Elt e = c.dtype;
  const aotriton::DType dt = elt_dtype(e);
  const T poison = static_cast<T>(~T(0));  // NaN in every dtype here
  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  const size_t d = c.d, tq = c.tokens_q(), tk = c.tokens_k();
  auto fail = [&](const std::string& what) { return Outcome{false, c.describe() + backend_tag() + "  " + what + "  FAIL"}; };
  auto status_text = [](const char* call, Status st) {
    return std::string(call) + " returned " + aotriton::status_name(st) + ": " + aotriton::last_error_message();
  };
  // Placements: [B, H, S, D] contiguous, or packed [1, H, T, D] over T x H x D memory.
  auto place = [&](size_t h, size_t t) {
    if (c.packed()) {
      size_t sz[4] = {1, h, t, d}, st[4] = {t * h * d, d, h * d, 1};
      return Placement<4>(sz, st, 0);
    }
    size_t sz[4] = {c.batch, h, t, d}, st[4] = {h * t * d, t * d, d, 1};
    return Placement<4>(sz, st, 0);
  };
  const size_t rows_b = c.packed() ? 1 : c.batch;
  size_t rsz[3] = {rows_b, c.hq, tq}, rst[3] = {c.hq * tq, tq, 1};
  const Placement<3> rows(rsz, rst, 0);
  auto draw = [&](size_t n) {
    std::vector<float> x(n);
    for (auto& y : x) {
      if (e == Elt::kF32) {
        do y = static_cast<float>(rng.normal());
        while (y == 0.0f);
      } else {
        y = rng.normal_in(elt_lowp(e));
      }
    }
    return x;
  };
  auto enc = [&](const std::vector<float>& x) {
    std::vector<T> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = elt_enc<T>(e, x[i]);
    return out;
  };
  const Placement<4> pq = place(c.hq, tq), pk = place(c.hk, tk);
  const std::vector<float> q = draw(pq.count()), k = draw(pk.count()), v = draw(pk.count()), d_o = draw(pq.count());
  size_t bz[4];
  c.bias_sizes(bz);
  const size_t bst[4] = {bz[1] * bz[2] * bz[3], bz[2] * bz[3], bz[3], 1};
  const Placement<4> pb(bz, bst, 0);
  const std::vector<float> bias = c.bias ? draw(pb.count()) : std::vector<float>();
  const std::vector<T> qb = enc(q), kb = enc(k), vb = enc(v), dob = enc(d_o), biasb = enc(bias);

  DevTensor<T, 4> q_dev(pq, &qb, poison, stream), k_dev(pk, &kb, poison, stream), v_dev(pk, &vb, poison, stream);
  DevTensor<T, 4> do_dev(pq, &dob, poison, stream), o_dev(pq, nullptr, poison, stream);
  DevTensor<T, 4> dq_dev(pq, nullptr, poison, stream), dk_dev(pk, nullptr, poison, stream), dv_dev(pk, nullptr, poison, stream);
  DevTensor<uint32_t, 3> lse_dev(rows, nullptr, kPoison32, stream), delta_dev(rows, nullptr, kPoison32, stream);
  DevTensor<T, 4> bias_dev(pb, c.bias ? &biasb : nullptr, poison, stream), dbias_dev(pb, nullptr, poison, stream);
  // cu_seqlens (int32) and their host copies.
  std::vector<int32_t> cuq, cuk;
  for (size_t x : c.cu(c.lq)) cuq.push_back(static_cast<int32_t>(x));
  for (size_t x : c.cu(c.lk)) cuk.push_back(static_cast<int32_t>(x));
  DevBuf cuq_dev(cuq.size() * 4), cuk_dev(cuk.size() * 4);
  if (c.packed()) {
    cuq_dev.upload(cuq, stream);
    cuk_dev.upload(cuk, stream);
  }
  // Seed, offset, and the seed/offset the forward reports.
  const uint64_t seed = rng.next(), offset = rng.next() >> 8, base = rng.next() >> 40;
  DevBuf seed_dev(8), offset_dev(8), out_dev(16);
  seed_dev.upload(std::vector<uint64_t>{seed}, stream);
  offset_dev.upload(std::vector<uint64_t>{offset}, stream);
  out_dev.upload(std::vector<uint64_t>{~0ull, ~0ull}, stream);
  check(g_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
  auto ptr = [](const DevBuf& b) { return reinterpret_cast<void*>(static_cast<uintptr_t>(b.ptr)); };
  auto cu_view = [&](const DevBuf& b, size_t n) {
    const uint64_t sz[1] = {n};
    return aotriton::TensorView<1>::contiguous(ptr(b), sz, aotriton::DType::kInt32);
  };

  // The keep-mask from the library's debug entry, B x Hq x Sq x Sk (max lengths).
  std::vector<float> keep;
  std::string notes;
  bool pass = true;
  if (c.dropout > 0) {
    size_t msz[4] = {c.batch, c.hq, c.sq, c.sk}, mst[4] = {c.hq * c.sq * c.sk, c.sq * c.sk, c.sk, 1};
    DevTensor<uint32_t, 4> mask_dev(Placement<4>(msz, mst, 0), nullptr, kPoison32, stream);
    Status st = fl::debug_dropout_mask(mask_dev.view(aotriton::DType::kFloat32), c.dropout, ptr(seed_dev), ptr(offset_dev),
                                       base, aotriton::Stream{stream});
    if (st != Status::kSuccess) return fail(status_text("debug_dropout_mask", st));
    const std::vector<uint32_t> bits = mask_dev.read(stream);
    size_t bad = mask_dev.stray(bits), kept = 0;
    for (uint32_t b : mask_dev.logical(bits)) {
      bad += b != 0 && b != bits_of(1.0f);
      keep.push_back(b == bits_of(1.0f) ? 1.0f : 0.0f);
      kept += b == bits_of(1.0f);
    }
    const double n = static_cast<double>(keep.size()), p = c.dropout;
    const double z = (kept / n - (1 - p)) / std::sqrt(p * (1 - p) / n);
    const bool ok = bad == 0 && std::fabs(z) <= 6;
    pass &= ok;
    notes += "  debug mask kept " + fmt("%.3f", kept / n) + " (z " + fmt("%+.1f", z) + ")" + (bad ? " [not 0/1]!" : "") +
             (ok ? "" : "!");
  }

  fl::FwdParams fp = fwd_params(c, q_dev.view(dt), k_dev.view(dt), v_dev.view(dt), o_dev.view(dt),
                                lse_dev.view(aotriton::DType::kFloat32), sm_scale);
  if (c.bias) fp.bias = bias_dev.view(dt);
  if (c.dropout > 0) {
    fp.dropout_p = c.dropout;
    fp.philox_seed = ptr(seed_dev);
    fp.philox_offset = ptr(offset_dev);
    fp.philox_offset_base = base;
    fp.philox_seed_out = ptr(out_dev);
    fp.philox_offset_out = reinterpret_cast<void*>(static_cast<uintptr_t>(out_dev.ptr + 8));
  }
  if (c.packed()) {
    fp.cu_seqlens_q = cu_view(cuq_dev, cuq.size());
    fp.cu_seqlens_k = cu_view(cuk_dev, cuk.size());
    fp.max_seqlen_q = c.sq;
    fp.max_seqlen_k = c.sk;
    if (c.host_cu) {
      fp.cu_seqlens_q_host = cuq.data();
      fp.cu_seqlens_k_host = cuk.data();
    }
  }
  fl::BwdParams bp = backward_of(fp, do_dev.view(dt), delta_dev.view(aotriton::DType::kFloat32), dq_dev.view(dt),
                                 dk_dev.view(dt), dv_dev.view(dt));
  if (c.bias) bp.dbias = dbias_dev.view(dt);

  // Forced Gluon: a case outside its rule must be refused, nothing written; a backward it does
  // not serve is checked for the refusal, then run on the portable backend.
  auto outputs_untouched = [&] {
    return o_dev.read(stream) == o_dev.host && lse_dev.read(stream) == lse_dev.host && dq_dev.read(stream) == dq_dev.host &&
           dk_dev.read(stream) == dk_dev.host && dv_dev.read(stream) == dv_dev.host &&
           delta_dev.read(stream) == delta_dev.host && dbias_dev.read(stream) == dbias_dev.host;
  };
  if (forced_gluon()) {
    const GluonTraits traits{e != Elt::kF32, d, true, c.bias};
    if (!traits.serves()) {
      std::string note, bwd_note;
      bool refused = expect_refusal("attn_fwd", fl::attn_fwd(fp, aotriton::Stream{stream}), note);
      refused &= expect_bwd_refusal(bp, stream, bwd_note);
      std::vector<uint64_t> reported(2);
      out_dev.download(reported, stream);
      check(g_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
      const bool untouched = outputs_untouched() && reported == std::vector<uint64_t>{~0ull, ~0ull};
      pass &= refused && untouched;
      return {pass, c.describe() + backend_tag() + "  " + note + "; " + bwd_note + (untouched ? "" : " [outputs written]!") +
                        notes + (pass ? "  PASS" : "  FAIL")};
    }
  }

  Status st = fl::attn_fwd(fp, aotriton::Stream{stream});
  if (st != Status::kSuccess) return fail(status_text("attn_fwd", st));
  const std::vector<T> o_bits = o_dev.read(stream);
  const std::vector<uint32_t> lse_bits = lse_dev.read(stream);
  if (c.dropout > 0) {
    std::vector<uint64_t> got(2);
    out_dev.download(got, stream);
    check(g_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
    if (got[0] != seed || got[1] != offset + base) {
      pass = false;
      notes += "  seed_out/offset_out wrong!";
    }
  }

  std::unique_ptr<DevBuf> workspace;
  const std::string problem = attach_workspace(bp, stream, workspace);
  if (!problem.empty()) return fail(problem);
  st = fl::attn_bwd(bp, aotriton::Stream{stream});
  if (st != Status::kSuccess) return fail(status_text("attn_bwd", st));
  const std::vector<T> dq_bits = dq_dev.read(stream), dk_bits = dk_dev.read(stream), dv_bits = dv_dev.read(stream);
  const std::vector<T> dbias_bits = dbias_dev.read(stream);
  const std::vector<uint32_t> delta_bits = delta_dev.read(stream);
  const bool inputs_changed = o_dev.read(stream) != o_bits || lse_dev.read(stream) != lse_bits ||
                              q_dev.read(stream) != q_dev.host || k_dev.read(stream) != k_dev.host ||
                              v_dev.read(stream) != v_dev.host || do_dev.read(stream) != do_dev.host ||
                              bias_dev.read(stream) != bias_dev.host;

  FeatRef ex, nv;
  feat_reference(c, sm_scale, q, k, v, d_o, bias, keep, ex, nv);
  auto dec = [&](const std::vector<T>& bits) {
    std::vector<double> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = elt_dec<T>(e, bits[i]);
    return out;
  };
  const std::vector<double> o = dec(o_dev.logical(o_bits)), dq = dec(dq_dev.logical(dq_bits)),
                            dk = dec(dk_dev.logical(dk_bits)), dv = dec(dv_dev.logical(dv_bits));
  std::vector<double> lse, delta;
  for (uint32_t x : lse_dev.logical(lse_bits)) lse.push_back(float_of(x));
  for (uint32_t x : delta_dev.logical(delta_bits)) delta.push_back(float_of(x));
  const bool fp32 = e == Elt::kF32;
  const double floor = fp32 ? 1e-5 : 1e-3;
  std::string line = c.describe() + backend_tag();
  std::vector<double> g, x, n;
  live3(o, ex.o, nv.o, g, x, n);
  pass &= bounded_floor("O", g, x, n, 3, floor, fp32, line);
  live3(lse, ex.lse, nv.lse, g, x, n);
  pass &= lse_ok(g, x, n, line);
  live3(dq, ex.dq, nv.dq, g, x, n);
  pass &= bounded_floor("dQ", g, x, n, 5, floor, true, line);
  live3(dk, ex.dk, nv.dk, g, x, n);
  pass &= bounded_floor("dK", g, x, n, 5, floor, true, line);
  live3(dv, ex.dv, nv.dv, g, x, n);
  pass &= bounded_floor("dV", g, x, n, 5, floor, true, line);
  if (c.bias) pass &= bounded_floor("dBias", dec(dbias_dev.logical(dbias_bits)), ex.dbias, nv.dbias, 5, floor, true, line);
  // Rows without keys: O = dQ = 0; keys of sequences without queries: dK = dV = 0 (exactly).
  size_t empty = 0, idle = 0, nonzero = 0;
  for (size_t row = 0; row < ex.lse.size(); ++row) {
    if (!(ex.lse[row] == std::numeric_limits<double>::infinity())) continue;
    ++empty;
    for (size_t t = 0; t < d; ++t) nonzero += o[row * d + t] != 0.0 || dq[row * d + t] != 0.0;
  }
  for (size_t s = 0; c.packed() && s < c.batch; ++s) {
    if (c.lq[s] != 0) continue;
    for (size_t h = 0; h < c.hk; ++h)
      for (size_t j = 0; j < c.lk[s]; ++j, ++idle)
        for (size_t t = 0; t < d; ++t) {
          const size_t at = c.krow(s, h, j) * d + t;
          nonzero += dk[at] != 0.0 || dv[at] != 0.0;
        }
  }
  if (empty) line += "  rows w/o keys " + std::to_string(empty);
  if (idle) line += "  keys w/o queries " + std::to_string(idle);
  if (nonzero) line += "[" + std::to_string(nonzero) + " nonzero O/dQ/dK/dV]!";
  pass &= nonzero == 0;
  // delta = rowsum(dO o O) on live rows.
  size_t delta_bad = 0;
  for (size_t row = 0; row < delta.size(); ++row) {
    if (std::isnan(ex.lse[row])) continue;
    double want = 0, mag = 0;
    for (size_t t = 0; t < d; ++t) {
      want += d_o[row * d + t] * o[row * d + t];
      mag += std::fabs(d_o[row * d + t] * o[row * d + t]);
    }
    delta_bad += !(std::fabs(delta[row] - want) <= 1e-4 * (1 + mag));
  }
  if (delta_bad) line += "  delta: " + std::to_string(delta_bad) + " rows wrong!";
  // Nothing outside the views, nor in the tail tokens of packed tensors.
  size_t stray = o_dev.stray(o_bits) + dq_dev.stray(dq_bits) + dk_dev.stray(dk_bits) + dv_dev.stray(dv_bits) +
                 lse_dev.stray(lse_bits) + delta_dev.stray(delta_bits) + dbias_dev.stray(dbias_bits);
  auto tail = [&](const std::vector<T>& logical, const std::vector<double>& exact) {
    size_t m = 0;
    for (size_t i = 0; i < exact.size(); ++i) m += std::isnan(exact[i]) && logical[i] != poison;
    return m;
  };
  auto tail32 = [&](const std::vector<uint32_t>& logical) {
    size_t m = 0;
    for (size_t i = 0; i < ex.lse.size(); ++i) m += std::isnan(ex.lse[i]) && logical[i] != kPoison32;
    return m;
  };
  stray += tail(o_dev.logical(o_bits), ex.o) + tail(dq_dev.logical(dq_bits), ex.dq) + tail(dk_dev.logical(dk_bits), ex.dk) +
           tail(dv_dev.logical(dv_bits), ex.dv) + tail32(lse_dev.logical(lse_bits)) + tail32(delta_dev.logical(delta_bits));
  if (stray) line += "  " + std::to_string(stray) + " writes outside the views / sequences!";
  if (inputs_changed) line += "  the backward changed an input!";
  pass &= delta_bad == 0 && stray == 0 && !inputs_changed;
  line += notes + (pass ? "  PASS" : "  FAIL");
  return {pass, line};
}

Outcome run_feature(const FeatCase& c, SplitMix64& rng, CUstream stream) {
  return c.dtype == Elt::kF32 ? run_feature_typed<uint32_t>(c, rng, stream) : run_feature_typed<uint16_t>(c, rng, stream);
}

std::vector<FeatCase> feature_cases() {
  const MaskAlign TL = MaskAlign::kTopLeft, BR = MaskAlign::kBottomRight;
  auto mk = [](Elt e, size_t d, size_t b, size_t hq, size_t hk, size_t sq, size_t sk) {
    FeatCase c;
    c.dtype = e;
    c.d = d;
    c.batch = b;
    c.hq = hq;
    c.hk = hk;
    c.sq = sq;
    c.sk = sk;
    return c;
  };
  auto pk = [&](Elt e, size_t d, size_t hq, size_t hk, std::vector<size_t> lq, std::vector<size_t> lk, bool host) {
    FeatCase c = mk(e, d, lq.size(), hq, hk, *std::max_element(lq.begin(), lq.end()), *std::max_element(lk.begin(), lk.end()));
    c.lq = std::move(lq);
    c.lk = std::move(lk);
    c.host_cu = host;
    return c;
  };
  std::vector<FeatCase> out;
  FeatCase c = mk(Elt::kBF16, 64, 2, 4, 2, 97, 131);  // dropout
  c.dropout = 0.2f;
  out.push_back(c);
  c = mk(Elt::kF16, 128, 1, 4, 1, 200, 173);  // dropout + key-padding bias + causal BR
  c.dropout = 0.5f;
  c.causal = true;
  c.align = BR;
  c.bias = true;
  c.bias_one[1] = c.bias_one[2] = true;
  out.push_back(c);
  c = mk(Elt::kF16, 64, 2, 4, 2, 77, 130);  // bias [1, Hq, Sq, Sk], window
  c.bias = true;
  c.bias_one[0] = true;
  c.window_left = 16;
  c.window_right = 4;
  out.push_back(c);
  c = mk(Elt::kBF16, 96, 3, 2, 2, 61, 99);  // bias [B, 1, 1, Sk], causal TL
  c.bias = true;
  c.bias_one[1] = c.bias_one[2] = true;
  c.causal = true;
  c.align = TL;
  out.push_back(c);
  c = pk(Elt::kBF16, 64, 4, 2, {17, 0, 40, 1}, {23, 5, 0, 64}, true);  // packed, zero-length q and k
  c.causal = true;
  c.align = BR;
  out.push_back(c);
  // Packed batches the Gluon backend serves too (ragged descriptors): hd256 with a window, GQA hd128.
  c = pk(Elt::kBF16, 256, 2, 1, {130, 1, 0, 257}, {200, 65, 3, 129}, false);
  c.window_left = 64;
  c.window_right = 16;
  c.align = BR;
  out.push_back(c);
  c = pk(Elt::kF16, 128, 8, 2, {100, 1, 0, 77}, {130, 33, 5, 1}, true);
  c.causal = true;
  c.align = TL;
  out.push_back(c);
  c = pk(Elt::kF16, 128, 4, 4, {50, 9, 0}, {0, 31, 44}, false);  // packed + bias [B,Hq,1,Sk] + dropout
  c.bias = true;
  c.bias_one[2] = true;
  c.dropout = 0.3f;
  out.push_back(c);
  out.push_back(mk(Elt::kF32, 64, 1, 4, 2, 97, 61));  // fp32
  c = mk(Elt::kF32, 128, 2, 2, 1, 33, 129);  // fp32 + broadcast bias + dropout + causal
  c.bias = true;
  c.bias_one[0] = c.bias_one[1] = c.bias_one[2] = true;
  c.dropout = 0.25f;
  c.causal = true;
  out.push_back(c);
  c = pk(Elt::kF32, 64, 2, 1, {30, 0, 12}, {25, 9, 0}, true);  // fp32 packed + full bias
  c.bias = true;
  out.push_back(c);
  return out;
}

// Invalid calls on a live device: each must return its documented Status and write nothing.
// `spoil_fwd` or `spoil_bwd` (one of them) breaks otherwise valid parameters (Hq 4, Hk 2).
Outcome invalid_case(const char* what, aotriton::Status want, CUstream stream,
                     const std::function<void(aotriton::v2::flash::FwdParams&)>& spoil_fwd,
                     const std::function<void(aotriton::v2::flash::BwdParams&)>& spoil_bwd) {
  const size_t b = 1, hq = 4, hk = 2, s = 64, d = 64, nq = b * hq * s * d, nk = b * hk * s * d;
  DevBuf dq(nq * 2), dk(nk * 2), dv(nk * 2), ddo(nq * 2), dout(nq * 2), dgq(nq * 2), dgk(nk * 2), dgv(nk * 2);
  DevBuf dlse(b * hq * s * 4), ddelta(b * hq * s * 4);
  std::vector<uint16_t> ones_q(nq, f32_to_f16(1.0f)), ones_k(nk, f32_to_f16(1.0f));
  std::vector<uint16_t> poison_q(nq, kPoison16), poison_k(nk, kPoison16);
  std::vector<uint32_t> zeros_rows(b * hq * s, 0);
  dq.upload(ones_q, stream);
  dk.upload(ones_k, stream);
  dv.upload(ones_k, stream);
  ddo.upload(ones_q, stream);
  dlse.upload(zeros_rows, stream);
  dout.upload(poison_q, stream);
  dgq.upload(poison_q, stream);
  dgk.upload(poison_k, stream);
  dgv.upload(poison_k, stream);
  auto t4 = [&](const DevBuf& buf, size_t h) {
    const uint64_t sizes[4] = {b, h, s, d};
    return aotriton::TensorView<4>::contiguous(reinterpret_cast<const void*>(static_cast<uintptr_t>(buf.ptr)), sizes,
                                               aotriton::DType::kFloat16);
  };
  auto t3 = [&](const DevBuf& buf) {
    const uint64_t sizes[3] = {b, hq, s};
    return aotriton::TensorView<3>::contiguous(reinterpret_cast<const void*>(static_cast<uintptr_t>(buf.ptr)), sizes,
                                               aotriton::DType::kFloat32);
  };
  aotriton::Status st;
  std::unique_ptr<DevBuf> workspace;
  if (spoil_fwd) {
    aotriton::v2::flash::FwdParams p;
    p.q = t4(dq, hq);
    p.k = t4(dk, hk);
    p.v = t4(dv, hk);
    p.o = t4(dout, hq);
    p.lse = t3(dlse);
    p.sm_scale = 0.125f;
    p.backend = g_backend;
    spoil_fwd(p);
    st = aotriton::v2::flash::attn_fwd(p, aotriton::Stream{stream});
  } else {
    aotriton::v2::flash::BwdParams p;
    p.q = t4(dq, hq);
    p.k = t4(dk, hk);
    p.v = t4(dv, hk);
    p.o = t4(ddo, hq);
    p.d_o = t4(ddo, hq);
    p.lse = t3(dlse);
    p.delta = t3(ddelta);
    p.dq = t4(dgq, hq);
    p.dk = t4(dgk, hk);
    p.dv = t4(dgv, hk);
    p.sm_scale = 0.125f;
    p.backend = g_backend;
    spoil_bwd(p);
    // The workspace the call asks for, if any (these calls are invalid: the query normally
    // fails as the call does, and then none is given); the call's own result is what counts.
    uint64_t bytes = 0;
    if (aotriton::v2::flash::attn_bwd_workspace_bytes(p, aotriton::Stream{stream}, &bytes) == aotriton::Status::kSuccess &&
        bytes > 0) {
      workspace.reset(new DevBuf(static_cast<size_t>(bytes)));
      workspace->upload(std::vector<uint8_t>(static_cast<size_t>(bytes), 0xFF), stream);
      check(g_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
      p.workspace = reinterpret_cast<void*>(static_cast<uintptr_t>(workspace->ptr));
      p.workspace_bytes = bytes;
    }
    st = aotriton::v2::flash::attn_bwd(p, aotriton::Stream{stream});
  }
  std::string message = aotriton::last_error_message();
  bool untouched = true;
  for (DevBuf* buf : {&dout, &dgq}) {
    std::vector<uint16_t> out(nq);
    buf->download(out, stream);
    check(g_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
    untouched &= out == poison_q;
  }
  for (DevBuf* buf : {&dgk, &dgv}) {
    std::vector<uint16_t> out(nk);
    buf->download(out, stream);
    check(g_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
    untouched &= out == poison_k;
  }
  bool pass = st == want && untouched && !message.empty();
  std::string line = std::string("invalid call (") + what + ")" + backend_tag() + " -> " + aotriton::status_name(st) + ": " + message;
  if (st != want) line += std::string("  expected ") + aotriton::status_name(want);
  if (!untouched) line += "  but an output was written";
  if (message.empty()) line += "  but last_error_message() is empty";
  return {pass, line + (pass ? "  PASS" : "  FAIL")};
}

}  // namespace

// ---- the fp8 forward (attn_fwd_fp8) ----------------------------------------------------------
// A second implementation beside the Rust suite's fp8.rs: e4m3 inputs with per-(batch, KV head)
// descales (amax / 448), float64 reference of the dequantised inputs, naive bound from P rounded
// to e4m3 and O to bf16 (O: 3x naive + 2^-8 max|ref|); LSE within 2^-9 * sm_scale * max_j sum_d
// |q_d k_d| + 1e-3 (the tensor cores' fp8 accumulation, which no float64 naive shows). Rows with
// no key: O = 0, LSE = +inf. Outputs poisoned with NaN.
uint8_t e4m3_encode(float x) {
  uint8_t sign = std::signbit(x) ? 0x80 : 0;
  float a = std::min(std::fabs(x), 448.0f);
  if (std::isnan(x)) return 0x7f;
  if (a == 0.0f) return sign;
  int e = std::max(static_cast<int>(std::floor(std::log2(a))), -6);
  float step = std::ldexp(1.0f, e - 3);
  float q = std::nearbyint(a / step) * step;  // the default rounding mode: ties to even
  if (q >= std::ldexp(1.0f, e + 1)) ++e;
  if (q < std::ldexp(1.0f, -6)) return sign | static_cast<uint8_t>(q / std::ldexp(1.0f, -9));
  return sign | static_cast<uint8_t>((e + 7) << 3) | static_cast<uint8_t>((q / std::ldexp(1.0f, e) - 1.0f) * 8.0f);
}

float e4m3_decode(uint8_t b) {
  float sign = (b & 0x80) ? -1.0f : 1.0f;
  int e = (b >> 3) & 0xf, m = b & 7;
  if (e == 0xf && m == 7) return NAN;
  return sign * (e == 0 ? m * std::ldexp(1.0f, -9) : (1.0f + m / 8.0f) * std::ldexp(1.0f, e - 7));
}

struct Fp8Case {
  size_t b, hq, hk, sq, sk, d;
  int32_t left, right;
  bool bottom_right;
  std::string describe() const {
    return "fp8 D=" + std::to_string(d) + " Hq=" + std::to_string(hq) + " Hk=" + std::to_string(hk) +
           " B=" + std::to_string(b) + " Sq=" + std::to_string(sq) + " Sk=" + std::to_string(sk) + " window(" +
           std::to_string(left) + ", " + std::to_string(right) + (bottom_right ? ", BR)" : ")");
  }
};

std::vector<Fp8Case> fp8_cases() {
  return {{2, 4, 2, 150, 211, 128, -1, -1, false},
          {1, 8, 1, 97, 300, 256, -1, 0, true},
          {2, 2, 2, 100, 33, 64, 0, 0, false}};  // top-left diagonal: rows >= 33 see no key
}

// e4m3 bits of normal values (magnitude 0.5..3 by head), quantised per (batch, KV head).
void fp8_inputs(SplitMix64& rng, size_t b, size_t h, size_t hk, size_t s, size_t d, std::vector<uint8_t>& bits,
                std::vector<float>& descale) {
  size_t per_head = s * d, g = h / hk;
  std::vector<float> x(b * h * per_head);
  for (size_t i = 0; i < x.size(); ++i) {
    size_t head = (i / per_head) % h;
    x[i] = static_cast<float>(rng.normal() * (0.5 + 2.5 * head / std::max<size_t>(h - 1, 1)));
  }
  descale.assign(b * hk, 0.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    float& m = descale[(i / (h * per_head)) * hk + ((i / per_head) % h) / g];
    m = std::max(m, std::fabs(x[i]));
  }
  for (float& m : descale) m = std::max(m, 1e-6f) / 448.0f;
  bits.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    bits[i] = e4m3_encode(x[i] / descale[(i / (h * per_head)) * hk + ((i / per_head) % h) / g]);
  }
}

Outcome run_fp8(const Fp8Case& c, SplitMix64& rng, CUstream stream) {
  using aotriton::DType;
  std::vector<uint8_t> qb, kb, vb;
  std::vector<float> dq, dk, dv;
  fp8_inputs(rng, c.b, c.hq, c.hk, c.sq, c.d, qb, dq);
  fp8_inputs(rng, c.b, c.hk, c.hk, c.sk, c.d, kb, dk);
  fp8_inputs(rng, c.b, c.hk, c.hk, c.sk, c.d, vb, dv);
  DevBuf q(qb.size()), k(kb.size()), v(vb.size()), o(c.b * c.hq * c.sq * c.d * 2), lse(c.b * c.hq * c.sq * 4);
  DevBuf dqb(dq.size() * 4), dkb(dk.size() * 4), dvb(dv.size() * 4);
  q.upload(qb, stream);
  k.upload(kb, stream);
  v.upload(vb, stream);
  dqb.upload(dq, stream);
  dkb.upload(dk, stream);
  dvb.upload(dv, stream);
  std::vector<uint16_t> o_host(c.b * c.hq * c.sq * c.d, 0x7fc0);
  std::vector<float> lse_host(c.b * c.hq * c.sq, NAN);
  o.upload(o_host, stream);
  lse.upload(lse_host, stream);
  auto addr = [](const DevBuf& b) { return reinterpret_cast<const void*>(static_cast<uintptr_t>(b.ptr)); };
  const size_t q_sz[4] = {c.b, c.hq, c.sq, c.d}, kv_sz[4] = {c.b, c.hk, c.sk, c.d}, l_sz[3] = {c.b, c.hq, c.sq},
               ds_sz[2] = {c.b, c.hk};
  aotriton::v2::flash::Fp8FwdParams p;
  p.q = aotriton::TensorView<4>::contiguous(addr(q), q_sz, DType::kFloat8E4M3);
  p.k = aotriton::TensorView<4>::contiguous(addr(k), kv_sz, DType::kFloat8E4M3);
  p.v = aotriton::TensorView<4>::contiguous(addr(v), kv_sz, DType::kFloat8E4M3);
  p.o = aotriton::TensorView<4>::contiguous(addr(o), q_sz, DType::kBFloat16);
  p.lse = aotriton::TensorView<3>::contiguous(addr(lse), l_sz, DType::kFloat32);
  p.q_descale = aotriton::TensorView<2>::contiguous(addr(dqb), ds_sz, DType::kFloat32);
  p.k_descale = aotriton::TensorView<2>::contiguous(addr(dkb), ds_sz, DType::kFloat32);
  p.v_descale = aotriton::TensorView<2>::contiguous(addr(dvb), ds_sz, DType::kFloat32);
  const double sm_scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  p.sm_scale = static_cast<float>(sm_scale);
  p.align = c.bottom_right ? aotriton::v2::flash::MaskAlign::kBottomRight : aotriton::v2::flash::MaskAlign::kTopLeft;
  p.window_left = c.left;
  p.window_right = c.right;
  uint64_t ws_bytes = 0;
  aotriton::Status st = aotriton::v2::flash::attn_fwd_fp8_workspace_bytes(p.k, &ws_bytes);
  if (st != aotriton::Status::kSuccess) return {false, c.describe() + "  workspace_bytes failed  FAIL"};
  DevBuf ws(ws_bytes);
  p.workspace = reinterpret_cast<void*>(static_cast<uintptr_t>(ws.ptr));
  p.workspace_bytes = ws_bytes;
  st = aotriton::v2::flash::attn_fwd_fp8(p, aotriton::Stream::cuda(stream));
  if (st != aotriton::Status::kSuccess) {
    return {false, c.describe() + "  attn_fwd_fp8: " + aotriton::last_error_message() + "  FAIL"};
  }
  o.download(o_host, stream);
  lse.download(lse_host, stream);
  check(g_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");

  size_t g = c.hq / c.hk, d = c.d, nan = 0;
  bool empty_ok = true;
  double o_err = 0, naive_err = 0, o_max = 0, lse_excess = 0;
  for (size_t z = 0; z < c.b; ++z) {
    for (size_t h = 0; h < c.hq; ++h) {
      size_t kh = h / g;
      auto qv = [&](size_t i, size_t x) { return e4m3_decode(qb[((z * c.hq + h) * c.sq + i) * d + x]) * double(dq[z * c.hk + kh]); };
      auto kv = [&](size_t j, size_t x) { return e4m3_decode(kb[((z * c.hk + kh) * c.sk + j) * d + x]) * double(dk[z * c.hk + kh]); };
      auto vv = [&](size_t j, size_t x) { return e4m3_decode(vb[((z * c.hk + kh) * c.sk + j) * d + x]) * double(dv[z * c.hk + kh]); };
      for (size_t i = 0; i < c.sq; ++i) {
        size_t row = (z * c.hq + h) * c.sq + i;
        long diag = static_cast<long>(i) + (c.bottom_right ? static_cast<long>(c.sk) - static_cast<long>(c.sq) : 0);
        std::vector<size_t> seen;
        for (size_t j = 0; j < c.sk; ++j) {
          long jj = static_cast<long>(j);
          if ((c.left < 0 || jj >= diag - c.left) && (c.right < 0 || jj <= diag + c.right)) seen.push_back(j);
        }
        if (seen.empty()) {
          bool zero = true;
          for (size_t x = 0; x < d; ++x) zero &= o_host[row * d + x] == 0;
          empty_ok &= zero && std::isinf(lse_host[row]) && lse_host[row] > 0;
          continue;
        }
        std::vector<double> s(seen.size()), pr(seen.size());
        double m = -INFINITY, abs_sum = 0;
        for (size_t t = 0; t < seen.size(); ++t) {
          double acc = 0, a = 0;
          for (size_t x = 0; x < d; ++x) {
            acc += qv(i, x) * kv(seen[t], x);
            a += std::fabs(qv(i, x) * kv(seen[t], x));
          }
          s[t] = acc * sm_scale;
          m = std::max(m, s[t]);
          abs_sum = std::max(abs_sum, a);
        }
        double l = 0;
        for (size_t t = 0; t < seen.size(); ++t) l += (pr[t] = std::exp(s[t] - m));
        double lse_ref = m + std::log(l), lse_got = lse_host[row];
        if (std::isnan(lse_got)) ++nan;
        else lse_excess = std::max(lse_excess, std::fabs(lse_got - lse_ref) / (std::ldexp(1.0, -9) * abs_sum * sm_scale + 1e-3));
        for (size_t x = 0; x < d; ++x) {
          double r = 0, nv = 0;
          for (size_t t = 0; t < seen.size(); ++t) {
            r += pr[t] * vv(seen[t], x);
            nv += e4m3_decode(e4m3_encode(static_cast<float>(pr[t]))) * vv(seen[t], x);
          }
          r /= l;
          nv = bf16_to_f32(f32_to_bf16(static_cast<float>(nv / l)));
          double got = bf16_to_f32(o_host[row * d + x]);
          if (std::isnan(got)) ++nan;
          o_err = std::max(o_err, std::fabs(got - r));
          naive_err = std::max(naive_err, std::fabs(nv - r));
          o_max = std::max(o_max, std::fabs(r));
        }
      }
    }
  }
  double bound = 3 * naive_err + std::ldexp(1.0, -8) * o_max;
  bool pass = o_err <= bound && lse_excess <= 1.0 && nan == 0 && empty_ok;
  char line[256];
  std::snprintf(line, sizeof line, "  O %.2e/%.2e (naive %.2e)  LSE %.2f of its bound  NaN %zu  empty rows %s  %s", o_err,
                bound, naive_err, lse_excess, nan, empty_ok ? "ok" : "WRONG", pass ? "PASS" : "FAIL");
  return {pass, c.describe() + line};
}

// e4m3 codec: every bit pattern round-trips (NaN aside) and ties go to even.
bool e4m3_codec_ok() {
  for (int b = 0; b < 256; ++b) {
    float x = e4m3_decode(static_cast<uint8_t>(b));
    if (!std::isnan(x) && e4m3_encode(x) != b) return false;
  }
  return e4m3_decode(e4m3_encode(1.0625f)) == 1.0f && e4m3_decode(e4m3_encode(1.1875f)) == 1.25f &&
         e4m3_decode(e4m3_encode(1000.0f)) == 448.0f;
}

// ---- KV-cache decode attention (attn_fwd_kvcache) -------------------------------------------
// Token-major q/o [B, Sq, Hq, D], caches dense [B, S, Hk, D] or pages [N_PAGES, PAGE, Hk, D]
// with a shuffled int32 page table, k_new/v_new appended at cache_seqlens first. Float64 host
// reference over the caches as the host appended them; O within 3x the naive computation (P and O
// rounded to the input dtype) + 1e-3, LSE within 1e-3 * max(1, |lse|), +inf exactly for rows that
// see no key. O (with a guard after it), LSE and the workspace are poisoned; the whole cache
// buffers (spare pages poisoned with NaN) must equal the host-appended ones bit for bit; the
// status word must hold exactly the expected bits (a length past the capacity: clamped, bit 1).
struct KvCase {
  Lowp t;
  size_t b, hq, hk, d, sq, page;  // page 0: dense
  size_t rows;                    // dense: S_cache; paged: pages per sequence (MAX_PAGES)
  std::vector<int32_t> lens;
  size_t n_new;
  bool causal;
  int32_t left, right;
  uint32_t splits;
  int32_t want_status;
  std::string describe() const {
    std::string l;
    for (int32_t x : lens) l += (l.empty() ? "" : ",") + std::to_string(x);
    return std::string("kvcache ") + lowp_name(t) + " B=" + std::to_string(b) + " Hq=" + std::to_string(hq) +
           " Hk=" + std::to_string(hk) + " D=" + std::to_string(d) + " Sq=" + std::to_string(sq) +
           (page ? " page=" + std::to_string(page) + " pages/seq=" + std::to_string(rows)
                 : " dense S=" + std::to_string(rows)) +
           " lens=[" + l + "] new=" + std::to_string(n_new) + (causal ? " causal" : "") + " window(" +
           std::to_string(left) + ", " + std::to_string(right) + ") splits=" + std::to_string(splits);
  }
};

std::vector<KvCase> kvcache_cases() {
  return {{Lowp::kBF16, 2, 8, 2, 128, 1, 0, 200, {37, 150}, 2, false, -1, -1, 0, 0},
          {Lowp::kF16, 3, 8, 2, 64, 4, 16, 6, {14, 0, 60}, 4, true, -1, -1, 3, 0},  // 14 + 4 crosses a page
          {Lowp::kBF16, 2, 4, 1, 128, 1, 16, 6, {500, 5}, 2, false, 30, -1, 0, 1}};   // 500: clamped to 94
}

Outcome run_kvcache(const KvCase& c, SplitMix64& rng, CUstream stream) {
  using aotriton::DType;
  namespace fl = aotriton::v2::flash;
  const bool paged = c.page != 0;
  const size_t row = c.hk * c.d;  // elements per cache row
  const size_t capacity = paged ? c.rows * c.page : c.rows;
  const size_t pool = paged ? c.b * c.rows + 2 : c.b;  // two spare pages, never referenced
  const size_t rows_per_block = paged ? c.page : c.rows;
  std::vector<uint16_t> qh(c.b * c.sq * c.hq * c.d), kc(pool * rows_per_block * row), vc(kc.size());
  std::vector<uint16_t> kn(c.b * c.n_new * row), vn(kn.size());
  for (auto* v : {&qh, &kc, &vc, &kn, &vn})
    for (uint16_t& x : *v) x = to_bits(c.t, rng.normal_in(c.t));
  std::vector<int32_t> table;
  if (paged) {
    std::vector<int32_t> ids(pool);
    for (size_t i = 0; i < pool; ++i) ids[i] = static_cast<int32_t>(i);
    for (size_t i = pool - 1; i > 0; --i) std::swap(ids[i], ids[rng.next() % (i + 1)]);
    table.assign(ids.begin(), ids.begin() + c.b * c.rows);
    for (size_t s = c.b * c.rows; s < pool; ++s)  // spare pages: NaN
      for (size_t e = 0; e < c.page * row; ++e) kc[ids[s] * c.page * row + e] = vc[ids[s] * c.page * row + e] = kPoison16;
  }
  // Where key j of sequence b lives (element offset of its row).
  auto at = [&](size_t b, size_t j) {
    return paged ? (static_cast<size_t>(table[b * c.rows + j / c.page]) * c.page + j % c.page) * row : (b * c.rows + j) * row;
  };
  // The host's append, with each length clamped as the kernels do.
  std::vector<size_t> len(c.b);
  std::vector<uint16_t> kc_want = kc, vc_want = vc;
  for (size_t b = 0; b < c.b; ++b) {
    len[b] = std::min<size_t>(static_cast<size_t>(std::max(c.lens[b], 0)), capacity - c.n_new);
    for (size_t t = 0; t < c.n_new; ++t)
      for (size_t e = 0; e < row; ++e) {
        kc_want[at(b, len[b] + t) + e] = kn[(b * c.n_new + t) * row + e];
        vc_want[at(b, len[b] + t) + e] = vn[(b * c.n_new + t) * row + e];
      }
  }
  const size_t o_elems = qh.size(), lse_elems = c.b * c.hq * c.sq;
  DevBuf q(qh.size() * 2), k(kc.size() * 2), v(vc.size() * 2), knb(std::max<size_t>(kn.size(), 1) * 2),
      vnb(std::max<size_t>(vn.size(), 1) * 2), o((o_elems + kGuard) * 2), lse(lse_elems * 4), lens(c.b * 4),
      tab(std::max<size_t>(table.size(), 1) * 4), status(4);
  q.upload(qh, stream);
  k.upload(kc, stream);
  v.upload(vc, stream);
  if (c.n_new) {
    knb.upload(kn, stream);
    vnb.upload(vn, stream);
  }
  if (paged) tab.upload(table, stream);
  lens.upload(c.lens, stream);
  std::vector<uint16_t> o_host(o_elems + kGuard, kPoison16);
  std::vector<uint32_t> lse_host(lse_elems, kPoison32);
  std::vector<int32_t> status_host(1, 0);
  o.upload(o_host, stream);
  lse.upload(lse_host, stream);
  status.upload(status_host, stream);
  auto addr = [](const DevBuf& buf) { return reinterpret_cast<const void*>(static_cast<uintptr_t>(buf.ptr)); };
  const DType dt = c.t == Lowp::kF16 ? DType::kFloat16 : DType::kBFloat16;
  const uint64_t q_sz[4] = {c.b, c.sq, c.hq, c.d}, c_sz[4] = {pool, rows_per_block, c.hk, c.d},
                 n_sz[4] = {c.b, c.n_new, c.hk, c.d}, l_sz[3] = {c.b, c.hq, c.sq}, t_sz[2] = {c.b, c.rows},
                 s_sz[1] = {c.b};
  fl::KvCacheParams p;
  p.q = aotriton::TensorView<4>::contiguous(addr(q), q_sz, dt);
  p.k_cache = aotriton::TensorView<4>::contiguous(addr(k), c_sz, dt);
  p.v_cache = aotriton::TensorView<4>::contiguous(addr(v), c_sz, dt);
  if (paged) p.page_table = aotriton::TensorView<2>::contiguous(addr(tab), t_sz, DType::kInt32);
  p.cache_seqlens = aotriton::TensorView<1>::contiguous(addr(lens), s_sz, DType::kInt32);
  if (c.n_new) {
    p.k_new = aotriton::TensorView<4>::contiguous(addr(knb), n_sz, dt);
    p.v_new = aotriton::TensorView<4>::contiguous(addr(vnb), n_sz, dt);
  }
  p.o = aotriton::TensorView<4>::contiguous(addr(o), q_sz, dt);
  p.lse = aotriton::TensorView<3>::contiguous(addr(lse), l_sz, DType::kFloat32);
  const double sm_scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  p.sm_scale = static_cast<float>(sm_scale);
  p.causal = c.causal;
  p.window_left = c.left;
  p.window_right = c.right;
  p.num_splits = c.splits;
  p.status = reinterpret_cast<int32_t*>(static_cast<uintptr_t>(status.ptr));
  const aotriton::Stream s = aotriton::Stream::cuda(stream);
  uint64_t ws_bytes = 0;
  uint32_t splits = 0;
  if (fl::attn_fwd_kvcache_workspace_bytes(p, s, &ws_bytes) != aotriton::Status::kSuccess ||
      fl::attn_fwd_kvcache_num_splits(p, s, &splits) != aotriton::Status::kSuccess) {
    return {false, c.describe() + "  workspace/splits query: " + aotriton::last_error_message() + "  FAIL"};
  }
  std::unique_ptr<DevBuf> ws;
  if (ws_bytes) {
    ws = std::make_unique<DevBuf>(ws_bytes);
    ws->upload(std::vector<uint8_t>(ws_bytes, 0xFF), stream);
    p.workspace = reinterpret_cast<void*>(static_cast<uintptr_t>(ws->ptr));
    p.workspace_bytes = ws_bytes;
  } else if (splits > 1) {
    return {false, c.describe() + "  " + std::to_string(splits) + " splits but no workspace  FAIL"};
  }
  if (fl::attn_fwd_kvcache(p, s) != aotriton::Status::kSuccess) {
    return {false, c.describe() + "  attn_fwd_kvcache: " + aotriton::last_error_message() + "  FAIL"};
  }
  std::vector<uint16_t> kc_got(kc.size()), vc_got(vc.size());
  o.download(o_host, stream);
  lse.download(lse_host, stream);
  status.download(status_host, stream);
  k.download(kc_got, stream);
  v.download(vc_got, stream);
  check(g_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");

  const size_t g = c.hq / c.hk, d = c.d;
  size_t nan = 0;
  bool empty_ok = true, guard_ok = true;
  for (size_t e = o_elems; e < o_host.size(); ++e) guard_ok &= o_host[e] == kPoison16;
  double o_err = 0, naive_err = 0, lse_err = 0;
  auto val = [&](const std::vector<uint16_t>& buf, size_t off) { return static_cast<double>(from_bits(c.t, buf[off])); };
  for (size_t b = 0; b < c.b; ++b) {
    const size_t L = len[b] + c.n_new;
    for (size_t h = 0; h < c.hq; ++h) {
      const size_t kh = h / g;
      for (size_t t = 0; t < c.sq; ++t) {
        const long pos = static_cast<long>(L) - static_cast<long>(c.sq) + static_cast<long>(t);
        const int32_t right = c.causal ? 0 : c.right;
        std::vector<size_t> seen;
        for (size_t j = 0; j < L; ++j) {
          const long jj = static_cast<long>(j);
          if ((c.left < 0 || jj >= pos - c.left) && (right < 0 || jj <= pos + right)) seen.push_back(j);
        }
        const size_t qo = ((b * c.sq + t) * c.hq + h) * d, lrow = (b * c.hq + h) * c.sq + t;
        float lse_got;
        std::memcpy(&lse_got, &lse_host[lrow], 4);
        if (seen.empty()) {
          for (size_t x = 0; x < d; ++x) empty_ok &= o_host[qo + x] == 0 || o_host[qo + x] == 0x8000;
          empty_ok &= std::isinf(lse_got) && lse_got > 0;
          continue;
        }
        std::vector<double> sc(seen.size()), pr(seen.size());
        double m = -INFINITY;
        for (size_t i = 0; i < seen.size(); ++i) {
          double acc = 0;
          for (size_t x = 0; x < d; ++x) acc += val(qh, qo + x) * val(kc_want, at(b, seen[i]) + kh * d + x);
          m = std::max(m, sc[i] = acc * sm_scale);
        }
        double l = 0;
        for (size_t i = 0; i < seen.size(); ++i) l += (pr[i] = std::exp(sc[i] - m));
        const double lse_ref = m + std::log(l);
        if (std::isnan(lse_got)) ++nan;
        else lse_err = std::max(lse_err, std::fabs(lse_got - lse_ref) / std::max(1.0, std::fabs(lse_ref)));
        for (size_t x = 0; x < d; ++x) {
          double r = 0, nv = 0;
          for (size_t i = 0; i < seen.size(); ++i) {
            const double vx = val(vc_want, at(b, seen[i]) + kh * d + x);
            r += pr[i] * vx;
            nv += round_to(c.t, static_cast<float>(pr[i])) * vx;
          }
          r /= l;
          nv = round_to(c.t, static_cast<float>(nv / l));
          const double got = from_bits(c.t, o_host[qo + x]);
          if (std::isnan(got)) ++nan;
          o_err = std::max(o_err, std::fabs(got - r));
          naive_err = std::max(naive_err, std::fabs(nv - r));
        }
      }
    }
  }
  const bool caches_ok = kc_got == kc_want && vc_got == vc_want;
  const double bound = 3 * naive_err + 1e-3;
  const bool pass = o_err <= bound && lse_err <= 1e-3 && nan == 0 && empty_ok && guard_ok && caches_ok &&
                    status_host[0] == c.want_status;
  char line[320];
  std::snprintf(line, sizeof line,
                "  splits %u ws %llu B  O %.2e/%.2e  LSE %.2e  NaN %zu  empty rows %s  guard %s  caches %s  status %d/%d  %s",
                splits, static_cast<unsigned long long>(ws_bytes), o_err, bound, lse_err, nan, empty_ok ? "ok" : "WRONG",
                guard_ok ? "ok" : "WRITTEN", caches_ok ? "ok" : "WRONG", status_host[0], c.want_status,
                pass ? "PASS" : "FAIL");
  return {pass, c.describe() + line};
}

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
    } else if (a == "--backend" && i + 1 < argc && parse_backend(argv[i + 1], g_backend)) {
      ++i;
    } else {
      std::fprintf(stderr, "usage: %s [--log PATH] [--seed N] [--require-gpu] [--backend auto|portable|gluon]\n", argv[0]);
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
       ", seed " + std::to_string(seed) + ", backend " + backend_name(g_backend));
  emit("bounds: max|out-ref64| <= k*max|naive-ref64| + floor, k=3 (O) / 5 (dQ,dK,dV), floor 1e-3 (x max(1,max|ref|) "
       "for gradients); LSE per row; shown as err/bound, '!' marks a failed check");

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
  bool codec = e4m3_codec_ok();
  record({codec, std::string("e4m3 codec (all bit patterns, ties to even)  ") + (codec ? "PASS" : "FAIL")});
  // The fp8 forward has one backend (Gluon, sm_90), whatever --backend says.
  for (const Fp8Case& c : fp8_cases()) {
    try {
      record(run_fp8(c, rng, stream));
    } catch (const DriverError& e) {
      record({false, c.describe() + "  driver error: " + e.message + "  FAIL"});
    }
  }
  // The KV-cache attention has one backend (portable), whatever --backend says.
  for (const KvCase& c : kvcache_cases()) {
    try {
      record(run_kvcache(c, rng, stream));
    } catch (const DriverError& e) {
      record({false, c.describe() + "  driver error: " + e.message + "  FAIL"});
    }
  }
  for (const FeatCase& c : feature_cases()) {
    try {
      record(run_feature(c, rng, stream));
    } catch (const DriverError& e) {
      record({false, c.describe() + "  driver error: " + e.message + "  FAIL"});
    }
  }
  using aotriton::Status;
  using P = aotriton::v2::flash::FwdParams;
  using BP = aotriton::v2::flash::BwdParams;
  struct Invalid {
    const char* what;
    Status want;
    std::function<void(P&)> spoil_fwd;
    std::function<void(BP&)> spoil_bwd;
  };
  // Live buffers the new invalid calls point at: seed, offset, a bias-sized buffer, int32
  // offsets {0, 30, 64} of two packed sequences over the [1, 4, 64, 64] tensors.
  static const int32_t cu_host[3] = {0, 30, 64};
  DevBuf live_seed(8), live_offset(8), live_bias(4 * 64 * 64 * 2), live_cu(12);
  try {
    live_seed.upload(std::vector<uint64_t>{7}, stream);
    live_offset.upload(std::vector<uint64_t>{0}, stream);
    live_cu.upload(std::vector<int32_t>(cu_host, cu_host + 3), stream);
    check(g_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
  } catch (const DriverError& e) {
    std::printf("cpp-api: setup failed: %s\n", e.message.c_str());
    return 1;
  }
  const void* seed_ptr = reinterpret_cast<const void*>(static_cast<uintptr_t>(live_seed.ptr));
  const void* offset_ptr = reinterpret_cast<const void*>(static_cast<uintptr_t>(live_offset.ptr));
  const void* bias_ptr = reinterpret_cast<const void*>(static_cast<uintptr_t>(live_bias.ptr));
  const void* cu_ptr = reinterpret_cast<const void*>(static_cast<uintptr_t>(live_cu.ptr));
  auto bias_view = [bias_ptr](uint64_t b, uint64_t h, uint64_t m, uint64_t n) {
    const uint64_t sz[4] = {b, h, m, n};
    return aotriton::TensorView<4>::contiguous(bias_ptr, sz, aotriton::DType::kFloat16);
  };
  auto cu_view = [cu_ptr](aotriton::DType dt) {
    const uint64_t sz[1] = {3};
    return aotriton::TensorView<1>::contiguous(cu_ptr, sz, dt);
  };
  auto packed_fwd = [cu_view](P& p, aotriton::DType dt, uint64_t max_q, bool host) {
    p.cu_seqlens_q = p.cu_seqlens_k = cu_view(dt);
    p.max_seqlen_q = max_q;
    p.max_seqlen_k = 34;
    if (host) p.cu_seqlens_q_host = p.cu_seqlens_k_host = cu_host;
  };
  auto packed_bwd = [cu_view](BP& p, aotriton::DType dt, uint64_t max_q, bool host) {
    p.cu_seqlens_q = p.cu_seqlens_k = cu_view(dt);
    p.max_seqlen_q = max_q;
    p.max_seqlen_k = 34;
    if (host) p.cu_seqlens_q_host = p.cu_seqlens_k_host = cu_host;
  };
  const Invalid invalid[] = {
      {"fwd: dropout_p 1", Status::kInvalidArgument,
       [=](P& p) {
         p.dropout_p = 1.0f;
         p.philox_seed = seed_ptr;
         p.philox_offset = offset_ptr;
       },
       nullptr},
      {"bwd: dropout_p 1", Status::kInvalidArgument, nullptr,
       [=](BP& p) {
         p.dropout_p = 1.0f;
         p.philox_seed = seed_ptr;
         p.philox_offset = offset_ptr;
       }},
      {"fwd: dropout without a seed pointer", Status::kNullPointer,
       [=](P& p) {
         p.dropout_p = 0.5f;
         p.philox_offset = offset_ptr;
       },
       nullptr},
      {"fwd: bias [1,3,64,64] with Hq 4", Status::kShapeMismatch, [=](P& p) { p.bias = bias_view(1, 3, 64, 64); },
       nullptr},
      {"bwd: dbias without bias", Status::kInvalidArgument, nullptr, [=](BP& p) { p.dbias = bias_view(1, 1, 1, 64); }},
      {"fwd: cu_seqlens fp32", Status::kDTypeMismatch,
       [=](P& p) { packed_fwd(p, aotriton::DType::kFloat32, 34, false); }, nullptr},
      {"fwd: max_seqlen_q 20 < sequence of 30 (host copies)", Status::kInvalidArgument,
       [=](P& p) { packed_fwd(p, aotriton::DType::kInt32, 20, true); }, nullptr},
      {"bwd: max_seqlen_q 20 < sequence of 30 (host copies)", Status::kInvalidArgument, nullptr,
       [=](BP& p) { packed_bwd(p, aotriton::DType::kInt32, 20, true); }},
      {"fwd: q null", Status::kNullPointer, [](P& p) { p.q.data = nullptr; }, nullptr},
      {"fwd: sm_scale unset", Status::kInvalidArgument,
       [](P& p) { p.sm_scale = std::numeric_limits<float>::quiet_NaN(); }, nullptr},
      {"fwd: k seqlen 0", Status::kEmptyInput, [](P& p) { p.k.sizes[2] = p.v.sizes[2] = 0; }, nullptr},
      {"fwd: version 999", Status::kUnsupportedVersion, [](P& p) { p.version = 999; }, nullptr},
      {"fwd: Hq 3, Hk 2", Status::kShapeMismatch,
       [](P& p) { p.q.sizes[1] = p.o.sizes[1] = p.lse.sizes[1] = 3; }, nullptr},
      {"bwd: lse null", Status::kNullPointer, nullptr, [](BP& p) { p.lse.data = nullptr; }},
      {"bwd: Hq 3, Hk 2", Status::kShapeMismatch, nullptr,
       [](BP& p) {
         p.q.sizes[1] = p.o.sizes[1] = p.d_o.sizes[1] = p.dq.sizes[1] = 3;
         p.lse.sizes[1] = p.delta.sizes[1] = 3;
       }},
      {"bwd: version 999", Status::kUnsupportedVersion, nullptr, [](BP& p) { p.version = 999; }},
  };
  for (const Invalid& inv : invalid) {
    try {
      record(invalid_case(inv.what, inv.want, stream, inv.spoil_fwd, inv.spoil_bwd));
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
