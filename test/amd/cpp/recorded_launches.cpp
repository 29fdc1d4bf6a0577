// The C++ half of test/amd/tests/recorded_launches.rs: cases of that test's list, through the
// installed C++ API on a HIP stream, in the order of its CPP_CALLS, against the recording HIP
// double (the test sets AOTRITON_HIP_LIBRARY and AOTRITON_HIP_DOUBLE_LOG and checks what was
// recorded). Prints nothing but errors. Exit status: 0 when every call returned what it must,
// 1 otherwise, 77 when the library carries no gfx942 kernels.
#include <aotriton/flash.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace flash = aotriton::v2::flash;
using aotriton::DType;
using aotriton::Status;
using aotriton::TensorView;

namespace {

// The Rust test's fake device addresses (its `mod addr`).
constexpr uint64_t kQ = 0x10000000, kK = 0x20000000, kV = 0x30000000, kO = 0x40000000;
constexpr uint64_t kLse = 0x50000000, kDo = 0x60000000, kDelta = 0x70000000;
constexpr uint64_t kDq = 0x80000000, kDk = 0x90000000, kDv = 0xa0000000;
constexpr uint64_t kBias = 0xb0000000, kDbias = 0xc0000000;
constexpr uint64_t kSeed = 0xd0000000, kOffset = 0xd0000010, kSeedOut = 0xd0000020, kOffsetOut = 0xd0000030;
constexpr uint64_t kCuQ = 0xe0000000, kCuK = 0xe0001000, kOut = 0xf0000000, kWorkspace = 0xf8000000;
constexpr uint64_t kStream = 0x5000;

void* address(uint64_t a) { return reinterpret_cast<void*>(static_cast<uintptr_t>(a)); }

aotriton::Stream hip_stream(uint64_t handle) {
  return aotriton::Stream{reinterpret_cast<ihipStream_t*>(static_cast<uintptr_t>(handle))};
}

// A case of the Rust test's list (same fields and defaults as its BASE).
struct Case {
  const char* name = "";
  DType dtype = DType::kFloat16;
  uint64_t b = 2, hq = 4, hk = 4, sq = 128, sk = 128, d = 64;
  bool bshd = false;
  bool causal = false;
  flash::MaskAlign align = flash::MaskAlign::kTopLeft;
  int32_t window_left = -1, window_right = -1;
  float scale = 0.125f;
  bool lse = true;
  uint64_t bias[4] = {0, 0, 0, 0};  // sizes; all 0: no bias
  bool dbias = false;
  float dropout_p = 0.0f;
  uint64_t offset_base = 0;
  bool dropout_outputs = false;
  std::vector<int32_t> cu_q, cu_k;  // empty: not packed
  bool host_offsets = false;
  bool tf32 = false;
  uint64_t q_offset = 0;
  uint64_t stream = kStream;
};

Case named(const char* name) {
  Case c;
  c.name = name;
  return c;
}

uint64_t max_length(const std::vector<int32_t>& cu) {
  uint64_t longest = 0;
  for (size_t i = 1; i < cu.size(); ++i) {
    const uint64_t n = static_cast<uint64_t>(cu[i] - cu[i - 1]);
    if (n > longest) longest = n;
  }
  return longest;
}

// q/o/do/dq (keys = false) or k/v/dk/dv (keys = true), as the Rust test lays them out.
TensorView<4> tensor(uint64_t at, const Case& c, bool keys) {
  const uint64_t h = keys ? c.hk : c.hq;
  TensorView<4> t;
  t.data = address(at);
  t.dtype = c.dtype;
  if (!c.cu_q.empty()) {  // total x H x D viewed as [1, H, total, D]
    const uint64_t total = static_cast<uint64_t>(keys ? c.cu_k.back() : c.cu_q.back());
    const uint64_t sizes[4] = {1, h, total, c.d};
    const int64_t strides[4] = {static_cast<int64_t>(total * h * c.d), static_cast<int64_t>(c.d),
                                static_cast<int64_t>(h * c.d), 1};
    for (int i = 0; i < 4; ++i) t.sizes[i] = sizes[i], t.strides[i] = strides[i];
    return t;
  }
  const uint64_t s = keys ? c.sk : c.sq;
  if (c.bshd) {
    const uint64_t sizes[4] = {c.b, h, s, c.d};
    const int64_t strides[4] = {static_cast<int64_t>(s * h * c.d), static_cast<int64_t>(c.d),
                                static_cast<int64_t>(h * c.d), 1};
    for (int i = 0; i < 4; ++i) t.sizes[i] = sizes[i], t.strides[i] = strides[i];
    return t;
  }
  return TensorView<4>::contiguous(address(at), {c.b, h, s, c.d}, c.dtype);
}

TensorView<3> rows(uint64_t at, const Case& c) {
  if (!c.cu_q.empty()) {
    return TensorView<3>::contiguous(address(at), {1, c.hq, static_cast<uint64_t>(c.cu_q.back())}, DType::kFloat32);
  }
  return TensorView<3>::contiguous(address(at), {c.b, c.hq, c.sq}, DType::kFloat32);
}

TensorView<4> bias_like(uint64_t at, const Case& c) {
  if (c.bias[3] == 0) return TensorView<4>{};
  return TensorView<4>::contiguous(address(at), {c.bias[0], c.bias[1], c.bias[2], c.bias[3]}, c.dtype);
}

// The fields FwdParams and BwdParams share.
template <typename Params>
void common(Params& p, const Case& c) {
  p.q = tensor(kQ + c.q_offset, c, false);
  p.k = tensor(kK, c, true);
  p.v = tensor(kV, c, true);
  p.o = tensor(kO, c, false);
  p.sm_scale = c.scale;
  p.causal = c.causal;
  p.align = c.align;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.bias = bias_like(kBias, c);
  p.dropout_p = c.dropout_p;
  if (c.dropout_p != 0.0f) {
    p.philox_seed = address(kSeed);
    p.philox_offset = address(kOffset);
    p.philox_offset_base = c.offset_base;
  }
  if (!c.cu_q.empty()) {
    const uint64_t n = c.cu_q.size();
    p.cu_seqlens_q = TensorView<1>::contiguous(address(kCuQ), {n}, DType::kInt32);
    p.cu_seqlens_k = TensorView<1>::contiguous(address(kCuK), {n}, DType::kInt32);
    p.max_seqlen_q = max_length(c.cu_q);
    p.max_seqlen_k = max_length(c.cu_k);
    if (c.host_offsets) {
      p.cu_seqlens_q_host = c.cu_q.data();
      p.cu_seqlens_k_host = c.cu_k.data();
    }
  }
  p.allow_tf32 = c.tf32;
}

flash::FwdParams fwd_params(const Case& c) {
  flash::FwdParams p;
  common(p, c);
  if (c.lse) p.lse = rows(kLse, c);
  if (c.dropout_outputs) {
    p.philox_seed_out = address(kSeedOut);
    p.philox_offset_out = address(kOffsetOut);
  }
  return p;
}

flash::BwdParams bwd_params(const Case& c) {
  flash::BwdParams p;
  common(p, c);
  p.d_o = tensor(kDo, c, false);
  p.dq = tensor(kDq, c, false);
  p.dk = tensor(kDk, c, true);
  p.dv = tensor(kDv, c, true);
  p.lse = rows(kLse, c);
  p.delta = rows(kDelta, c);
  if (c.dbias) p.dbias = bias_like(kDbias, c);
  return p;
}

int failures = 0;

void expect(Status got, Status want, const char* what) {
  if (got != want) {
    std::fprintf(stderr, "%s: %s (%s), expected %s\n", what, aotriton::status_name(got),
                 aotriton::last_error_message(), aotriton::status_name(want));
    ++failures;
  }
}

void run(const Case& c, bool backward) {
  std::string what = std::string(c.name) + (backward ? " attn_bwd" : " attn_fwd");
  const aotriton::Stream stream = hip_stream(c.stream);
  if (backward) {
    expect(flash::attn_bwd(bwd_params(c), stream), Status::kSuccess, what.c_str());
  } else {
    expect(flash::attn_fwd(fwd_params(c), stream), Status::kSuccess, what.c_str());
  }
}

}  // namespace

int main() {
  if (std::strstr(aotriton::version(), "gfx942") == nullptr) {
    std::printf("the installed library carries no gfx942 kernels (%s)\n", aotriton::version());
    return 77;
  }

  Case d64 = named("fp16-d64");
  run(d64, false);
  run(d64, true);

  Case window = named("bf16-window-bottom-right");
  window.dtype = DType::kBFloat16;
  window.sq = 200, window.sk = 300, window.d = 128;
  window.window_left = 32, window.window_right = 8, window.align = flash::MaskAlign::kBottomRight;
  run(window, false);
  run(window, true);

  Case gqa = named("fp16-gqa");
  gqa.hq = 8, gqa.hk = 2, gqa.sq = 64, gqa.sk = 256;
  gqa.causal = true, gqa.align = flash::MaskAlign::kBottomRight;
  run(gqa, false);
  run(gqa, true);

  Case tf32 = named("fp32-tf32-d128");
  tf32.dtype = DType::kFloat32;
  tf32.d = 128, tf32.tf32 = true, tf32.sq = 90, tf32.sk = 150;
  run(tf32, false);
  run(tf32, true);

  Case dropout = named("fp16-dropout");
  dropout.sq = 90, dropout.sk = 70, dropout.causal = true;
  dropout.dropout_p = 0.2f, dropout.offset_base = 12345, dropout.dropout_outputs = true;
  run(dropout, false);
  run(dropout, true);

  Case bias = named("bf16-bias-broadcast-dbias");
  bias.dtype = DType::kBFloat16;
  bias.hk = 2, bias.sq = 70, bias.sk = 50;
  bias.bias[0] = 1, bias.bias[1] = 4, bias.bias[2] = 1, bias.bias[3] = 50;
  bias.dbias = true;
  bias.causal = true, bias.align = flash::MaskAlign::kBottomRight;
  run(bias, false);
  run(bias, true);

  Case varlen = named("fp16-varlen-host");
  varlen.hk = 2, varlen.causal = true, varlen.align = flash::MaskAlign::kBottomRight;
  varlen.cu_q = {0, 30, 30, 130}, varlen.cu_k = {0, 50, 70, 71}, varlen.host_offsets = true;
  run(varlen, false);
  run(varlen, true);

  Case packed = named("bf16-varlen-bias-dropout");
  packed.dtype = DType::kBFloat16;
  packed.cu_q = {0, 17, 81}, packed.cu_k = {0, 40, 41};
  packed.bias[0] = 2, packed.bias[1] = 4, packed.bias[2] = 64, packed.bias[3] = 40;
  packed.dbias = true;
  packed.dropout_p = 0.1f, packed.offset_base = 3, packed.dropout_outputs = true;
  run(packed, false);
  run(packed, true);

  Case bshd = named("bf16-bshd");
  bshd.dtype = DType::kBFloat16;
  bshd.hk = 2, bshd.sq = 120, bshd.sk = 120, bshd.bshd = true;
  run(bshd, false);
  run(bshd, true);

  Case unaligned = named("fp16-unaligned-q");
  unaligned.q_offset = 2;
  run(unaligned, false);
  run(unaligned, true);

  Case no_lse = named("fp16-no-lse");
  no_lse.lse = false;
  run(no_lse, false);

  Case null_stream = named("fp16-null-stream");
  null_stream.stream = 0;
  run(null_stream, false);

  // debug_dropout_mask: out 2 x 3 x 50 x 70 fp32, rows 72 apart.
  TensorView<4> out;
  out.data = address(kOut);
  out.dtype = DType::kFloat32;
  const uint64_t sizes[4] = {2, 3, 50, 70};
  const int64_t strides[4] = {3 * 50 * 72, 50 * 72, 72, 1};
  for (int i = 0; i < 4; ++i) out.sizes[i] = sizes[i], out.strides[i] = strides[i];
  expect(flash::debug_dropout_mask(out, 0.3f, address(kSeed), address(kOffset), 99, hip_stream(kStream)),
         Status::kSuccess, "debug_dropout_mask");

  // Backends (no launch): kAuto needs no workspace on gfx942; a forced kGluon is refused.
  flash::BwdParams auto_bwd = bwd_params(d64);
  auto_bwd.workspace = address(kWorkspace);
  auto_bwd.workspace_bytes = uint64_t{1} << 30;
  uint64_t bytes = 1;
  expect(flash::attn_bwd_workspace_bytes(auto_bwd, hip_stream(kStream), &bytes), Status::kSuccess,
         "attn_bwd_workspace_bytes");
  if (bytes != 0) {
    std::fprintf(stderr, "attn_bwd_workspace_bytes: %llu on gfx942, expected 0\n",
                 static_cast<unsigned long long>(bytes));
    ++failures;
  }
  flash::FwdParams gluon = fwd_params(d64);
  gluon.backend = flash::Backend::kGluon;
  expect(flash::attn_fwd(gluon, hip_stream(kStream)), Status::kUnsupportedByBackend, "forced Gluon attn_fwd");
  if (std::strstr(aotriton::last_error_message(), "sm_90 only") == nullptr) {
    std::fprintf(stderr, "forced Gluon attn_fwd: the message does not give the reason: %s\n",
                 aotriton::last_error_message());
    ++failures;
  }
  return failures == 0 ? 0 : 1;
}
