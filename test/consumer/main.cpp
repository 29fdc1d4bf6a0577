// Uses the installed headers and library with no GPU: every validation error comes back as its
// own Status with a message, and a valid call reports that there is no driver.
#include <aotriton/flash.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>

namespace flash = aotriton::v2::flash;
using aotriton::DType;
using aotriton::Status;

static int g_failures = 0;

static void expect(const char* what, Status got, Status want) {
  bool ok = got == want;
  std::printf("%s %-40s %-22s %s\n", ok ? "ok  " : "FAIL", what, aotriton::status_name(got),
              aotriton::last_error_message());
  if (!ok) {
    std::printf("     expected %s\n", aotriton::status_name(want));
    ++g_failures;
  }
}

// A plausible call: fake (but aligned, non-null) device addresses; nothing is dereferenced
// before the driver is reached.
static const uint64_t kB = 2, kHq = 4, kHk = 2, kSq = 17, kSk = 33, kD = 40;

static aotriton::TensorView<4> view4(uintptr_t addr, uint64_t h, uint64_t s) {
  return aotriton::TensorView<4>::contiguous(reinterpret_cast<const void*>(addr), {kB, h, s, kD},
                                             DType::kFloat16);
}

static aotriton::TensorView<3> rows(uintptr_t addr) {
  return aotriton::TensorView<3>::contiguous(reinterpret_cast<const void*>(addr), {kB, kHq, kSq},
                                             DType::kFloat32);
}

static flash::FwdParams valid_params() {
  flash::FwdParams p;
  p.q = view4(0x10000, kHq, kSq);
  p.k = view4(0x20000, kHk, kSk);
  p.v = view4(0x30000, kHk, kSk);
  p.o = view4(0x40000, kHq, kSq);
  p.lse = rows(0x50000);
  p.sm_scale = 1.0f / std::sqrt(float(kD));
  p.causal = true;
  p.align = flash::MaskAlign::kBottomRight;
  return p;
}

static flash::BwdParams valid_bwd_params() {
  flash::BwdParams p;
  p.q = view4(0x10000, kHq, kSq);
  p.k = view4(0x20000, kHk, kSk);
  p.v = view4(0x30000, kHk, kSk);
  p.o = view4(0x40000, kHq, kSq);
  p.d_o = view4(0x60000, kHq, kSq);
  p.lse = rows(0x50000);
  p.delta = rows(0x70000);
  p.dq = view4(0x80000, kHq, kSq);
  p.dk = view4(0x90000, kHk, kSk);
  p.dv = view4(0xa0000, kHk, kSk);
  p.sm_scale = 1.0f / std::sqrt(float(kD));
  p.window_left = 3;
  p.window_right = 5;
  return p;
}

int main() {
  std::printf("aotriton %s\n", aotriton::version());
  const aotriton::Stream stream{};

  flash::FwdParams p = valid_params();
  p.k.dtype = DType::kBFloat16;
  expect("k dtype differs from q", flash::attn_fwd(p, stream), Status::kDTypeMismatch);

  p = valid_params();
  p.v.sizes[2] = 32;
  expect("v sequence length differs from k", flash::attn_fwd(p, stream), Status::kShapeMismatch);

  p = valid_params();
  p.q.strides[3] = 2;
  expect("q last stride is 2", flash::attn_fwd(p, stream), Status::kBadStrides);

  p = valid_params();
  for (auto* t : {&p.q, &p.k, &p.v, &p.o}) {
    t->sizes[3] = 520;
  }
  expect("head dim 520 above 512", flash::attn_fwd(p, stream), Status::kUnsupportedHeadDim);

  p = valid_params();
  p.k.sizes[1] = p.v.sizes[1] = 3;
  expect("Hq 4 not a multiple of Hk 3", flash::attn_fwd(p, stream), Status::kShapeMismatch);

  p = valid_params();
  p.window_left = -2;
  expect("window_left -2", flash::attn_fwd(p, stream), Status::kInvalidArgument);

  p = valid_params();
  p.o.data = nullptr;
  expect("o is null", flash::attn_fwd(p, stream), Status::kNullPointer);

  p = valid_params();
  p.q.data = reinterpret_cast<const void*>(0x10001);
  expect("q is misaligned", flash::attn_fwd(p, stream), Status::kMisalignedPointer);

  p = valid_params();
  p.k.sizes[2] = p.v.sizes[2] = 0;
  expect("Sk is 0", flash::attn_fwd(p, stream), Status::kEmptyInput);

  p = valid_params();
  p.sm_scale = std::nanf("");
  expect("sm_scale not set", flash::attn_fwd(p, stream), Status::kInvalidArgument);

  p = valid_params();
  p.version = flash::FwdParams::kVersion + 1;
  expect("params from a newer header", flash::attn_fwd(p, stream), Status::kUnsupportedVersion);

  // Training extras (FwdParams version 3).
  static const uint64_t philox_state[2] = {0, 0};  // stands in for device addresses here
  p = valid_params();
  p.dropout_p = 1.0f;
  p.philox_seed = &philox_state[0];
  p.philox_offset = &philox_state[1];
  expect("dropout p = 1", flash::attn_fwd(p, stream), Status::kInvalidArgument);

  // Logit soft-capping (FwdParams version 6, BwdParams version 5).
  p = valid_params();
  p.softcap = -30.0f;
  expect("softcap negative", flash::attn_fwd(p, stream), Status::kInvalidArgument);
  p = valid_params();
  p.softcap = std::nanf("");
  expect("softcap NaN", flash::attn_fwd(p, stream), Status::kInvalidArgument);
  {
    flash::BwdParams gs = valid_bwd_params();
    gs.softcap = std::numeric_limits<float>::infinity();
    expect("backward softcap inf", flash::attn_bwd(gs, stream), Status::kInvalidArgument);
  }

  // ALiBi slopes (FwdParams version 7, BwdParams version 6): fp32, [B or 1, Hq].
  p = valid_params();
  p.alibi_slopes = aotriton::TensorView<2>::contiguous(reinterpret_cast<const void*>(0xa0000), {1, kHq},
                                                       DType::kFloat16);
  expect("alibi slopes fp16", flash::attn_fwd(p, stream), Status::kDTypeMismatch);
  p.alibi_slopes = aotriton::TensorView<2>::contiguous(reinterpret_cast<const void*>(0xa0000), {1, kHk},
                                                       DType::kFloat32);
  expect("alibi slopes per key head", flash::attn_fwd(p, stream), Status::kShapeMismatch);
  p.alibi_slopes = aotriton::TensorView<2>::contiguous(reinterpret_cast<const void*>(0xa0000), {kB, kHq},
                                                       DType::kFloat32);
  p.softcap = 30.0f;
  expect("alibi with softcap", flash::attn_fwd(p, stream), Status::kInvalidArgument);
  {
    flash::BwdParams ga = valid_bwd_params();
    ga.alibi_slopes = aotriton::TensorView<2>::contiguous(reinterpret_cast<const void*>(0xa0000), {3, kHq},
                                                          DType::kFloat32);
    expect("backward alibi slopes batch 3", flash::attn_bwd(ga, stream), Status::kShapeMismatch);
  }

  // Attention sinks (FwdParams version 8, BwdParams version 7): fp32 [Hq].
  p = valid_params();
  p.sinks = aotriton::TensorView<1>::contiguous(reinterpret_cast<const void*>(0xa8000), {kHk}, DType::kFloat32);
  expect("sinks per key head", flash::attn_fwd(p, stream), Status::kShapeMismatch);
  {
    flash::BwdParams gs = valid_bwd_params();
    gs.dsinks = aotriton::TensorView<1>::contiguous(reinterpret_cast<const void*>(0xa8000), {kHq}, DType::kFloat32);
    expect("backward dsinks without sinks", flash::attn_bwd(gs, stream), Status::kInvalidArgument);
  }

  p = valid_params();
  p.bias = aotriton::TensorView<4>::contiguous(reinterpret_cast<const void*>(0xb0000), {kB, 3, kSq, kSk},
                                               DType::kFloat16);
  expect("bias heads 3 do not broadcast to 4", flash::attn_fwd(p, stream), Status::kShapeMismatch);

  // A packed batch of 2 sequences: q tokens 5 + 12, k tokens 7 + 10.
  static const int32_t cu_q_host[3] = {0, 5, 17}, cu_k_host[3] = {0, 7, 17};
  auto packed = [&] {
    flash::FwdParams v = valid_params();
    const uint64_t tokens = 17;
    v.q = view4(0x10000, kHq, tokens);
    v.k = view4(0x20000, kHk, tokens);
    v.v = view4(0x30000, kHk, tokens);
    v.o = view4(0x40000, kHq, tokens);
    for (auto* t : {&v.q, &v.k, &v.v, &v.o}) t->sizes[0] = 1;
    v.lse = aotriton::TensorView<3>::contiguous(reinterpret_cast<const void*>(0x50000), {1, kHq, tokens},
                                                DType::kFloat32);
    v.cu_seqlens_q = aotriton::TensorView<1>::contiguous(reinterpret_cast<const void*>(0xc0000), {3},
                                                         DType::kInt32);
    v.cu_seqlens_k = aotriton::TensorView<1>::contiguous(reinterpret_cast<const void*>(0xc1000), {3},
                                                         DType::kInt32);
    v.max_seqlen_q = 12;
    v.max_seqlen_k = 10;
    v.cu_seqlens_q_host = cu_q_host;
    v.cu_seqlens_k_host = cu_k_host;
    return v;
  };
  p = packed();
  p.cu_seqlens_k.dtype = DType::kFloat32;
  expect("cu_seqlens_k is fp32", flash::attn_fwd(p, stream), Status::kDTypeMismatch);

  p = packed();
  p.max_seqlen_q = 11;
  expect("max_seqlen_q below a sequence", flash::attn_fwd(p, stream), Status::kInvalidArgument);

  // Host offsets: the library reads no more entries than the caller declares. Three entries
  // right before an inaccessible page; a wrong count must be an error, never a read past them.
  const long page = sysconf(_SC_PAGESIZE);
  void* pages = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (pages == MAP_FAILED || mprotect(static_cast<char*>(pages) + page, page, PROT_NONE) != 0) {
    std::printf("FAIL cannot map a guard page\n");
    ++g_failures;
  } else {
    int32_t* fenced = reinterpret_cast<int32_t*>(static_cast<char*>(pages) + page) - 3;
    std::memcpy(fenced, cu_q_host, sizeof cu_q_host);
    p = packed();
    p.cu_seqlens_q_host = p.cu_seqlens_k_host = fenced;
    p.cu_seqlens_q.sizes[0] = p.cu_seqlens_k.sizes[0] = 1000;  // the device tensors' claim
    p.cu_seqlens_q_host_count = p.cu_seqlens_k_host_count = 3;  // what the caller owns
    expect("host offsets: 3 entries, device says 1000", flash::attn_fwd(p, stream), Status::kShapeMismatch);
    p = packed();
    p.cu_seqlens_q_host = p.cu_seqlens_k_host = fenced;
    p.cu_seqlens_q_host_count = p.cu_seqlens_k_host_count = 1u << 20;
    expect("host offsets: count above 65536", flash::attn_fwd(p, stream), Status::kTooLarge);
    // A caller of an older header promised cu_seqlens.sizes[0] entries: bounded before reading.
    p = packed();
    p.version = 4;
    p.cu_seqlens_q_host = p.cu_seqlens_k_host = fenced;
    p.cu_seqlens_q.sizes[0] = p.cu_seqlens_k.sizes[0] = uint64_t(1) << 62;
    expect("host offsets: version-4 size 2^62", flash::attn_fwd(p, stream), Status::kTooLarge);
    flash::BwdParams gb = valid_bwd_params();
    gb.cu_seqlens_q = p.cu_seqlens_q;
    gb.cu_seqlens_k = p.cu_seqlens_k;
    gb.cu_seqlens_q_host = gb.cu_seqlens_k_host = fenced;
    gb.cu_seqlens_q_host_count = gb.cu_seqlens_k_host_count = 70000;
    expect("backward host offsets: count above 65536", flash::attn_bwd(gb, stream), Status::kTooLarge);
    munmap(pages, 2 * page);
  }
  p = packed();
  p.cu_seqlens_k_host = nullptr;
  expect("host offsets for q only", flash::attn_fwd(p, stream), Status::kInvalidArgument);
  p = packed();
  p.cu_seqlens_q_host = p.cu_seqlens_k_host = nullptr;
  p.varlen_status = reinterpret_cast<int32_t*>(0xd0002);
  expect("varlen_status misaligned", flash::attn_fwd(p, stream), Status::kMisalignedPointer);

  // Sizes whose packed strides overflow int64: they saturate (no undefined behaviour).
  const uint64_t huge = uint64_t(1) << 40;
  auto big = aotriton::TensorView<4>::contiguous(reinterpret_cast<const void*>(0x10000), {huge, huge, huge, 8},
                                                 DType::kFloat16);
  if (big.strides[3] != 1 || big.strides[2] != 8 || big.strides[1] != int64_t(8) << 40 ||
      big.strides[0] != INT64_MAX) {
    std::printf("FAIL contiguous strides of huge sizes: %lld %lld %lld %lld\n", (long long)big.strides[0],
                (long long)big.strides[1], (long long)big.strides[2], (long long)big.strides[3]);
    ++g_failures;
  }
  auto above = aotriton::TensorView<2>::contiguous(nullptr, {3, UINT64_MAX}, DType::kFloat16);
  if (above.strides[0] != INT64_MAX || above.strides[1] != 1) {
    std::printf("FAIL contiguous stride of a size above INT64_MAX: %lld\n", (long long)above.strides[0]);
    ++g_failures;
  }

  flash::BwdParams g = valid_bwd_params();
  g.lse.data = nullptr;
  expect("backward without lse", flash::attn_bwd(g, stream), Status::kNullPointer);

  g = valid_bwd_params();
  g.d_o.sizes[2] = 16;
  expect("backward d_o shape", flash::attn_bwd(g, stream), Status::kShapeMismatch);

  g = valid_bwd_params();
  g.dk.dtype = DType::kBFloat16;
  expect("backward dk dtype", flash::attn_bwd(g, stream), Status::kDTypeMismatch);

  // Backends (FwdParams version 4, BwdParams version 3): a forced backend that cannot serve the
  // inputs says why, before any driver call.
  p = valid_params();
  p.backend = flash::Backend::kGluon;
  for (auto* t : {&p.q, &p.k, &p.v, &p.o}) t->dtype = DType::kFloat32;
  expect("forced Gluon with fp32", flash::attn_fwd(p, stream), Status::kUnsupportedByBackend);
  p = valid_params();
  p.backend = flash::Backend::kGluon;
  p.softcap = 30.0f;
  expect("forced Gluon with softcap", flash::attn_fwd(p, stream), Status::kUnsupportedByBackend);
  p = valid_params();
  p.backend = static_cast<flash::Backend>(9);
  expect("unknown backend value", flash::attn_fwd(p, stream), Status::kInvalidArgument);

  g = valid_bwd_params();
  g.backend = flash::Backend::kGluon;
  expect("forced Gluon backward, no workspace", flash::attn_bwd(g, stream), Status::kUnsupportedByBackend);
  g.workspace = reinterpret_cast<void*>(0x1000000);
  g.workspace_bytes = 64;
  expect("forced Gluon backward, small workspace", flash::attn_bwd(g, stream),
         Status::kUnsupportedByBackend);
  g.workspace = reinterpret_cast<void*>(0x1000008);
  g.workspace_bytes = 1 << 30;
  expect("backward workspace misaligned", flash::attn_bwd(g, stream), Status::kMisalignedPointer);

  uint64_t bytes = 7;
  g = valid_bwd_params();
  g.backend = flash::Backend::kPortable;
  expect("workspace bytes, portable", flash::attn_bwd_workspace_bytes(g, stream, &bytes), Status::kSuccess);
  if (bytes != 0) {
    std::printf("FAIL portable backward needs %llu workspace bytes, expected 0\n", (unsigned long long)bytes);
    ++g_failures;
  }
  g.backend = flash::Backend::kGluon;
  g.softcap = 30.0f;
  expect("workspace bytes, forced Gluon, softcap", flash::attn_bwd_workspace_bytes(g, stream, &bytes),
         Status::kUnsupportedByBackend);
  expect("workspace bytes, null output", flash::attn_bwd_workspace_bytes(g, stream, nullptr),
         Status::kNullPointer);
  if (std::strcmp(aotriton::status_name(Status::kUnsupportedByBackend), "kUnsupportedByBackend") != 0) {
    std::printf("FAIL status_name(kUnsupportedByBackend)\n");
    ++g_failures;
  }

  // The tuner's override: set, then cleared (it changes which kernel launches, never validation:
  // a bad call with a forced id still fails by its own status).
  expect("tuning::force_kernel(id)", aotriton::tuning::force_kernel("attn_fwd-bf16-tf0-hd128-drop0-bias0-m64n64w4s2-aligned"),
         Status::kSuccess);
  {
    auto p = valid_params();
    p.q.data = nullptr;
    expect("forced kernel, null q", flash::attn_fwd(p, stream), Status::kNullPointer);
  }
  expect("tuning::force_kernel(nullptr)", aotriton::tuning::force_kernel(nullptr), Status::kSuccess);
  if (aotriton::tuning::forced_count() != 0) {  // nothing was launched, so nothing was forced
    std::printf("FAIL tuning::forced_count() after no launch: %llu\n",
                static_cast<unsigned long long>(aotriton::tuning::forced_count()));
    ++g_failures;
  }
  // The database switch: on by default, off and back.
  const bool default_on = aotriton::tuning::database_in_use();
  aotriton::tuning::use_database(false);
  const bool off = !aotriton::tuning::database_in_use();
  aotriton::tuning::use_database(true);
  if (!default_on || !off || !aotriton::tuning::database_in_use()) {
    std::printf("FAIL tuning::use_database / database_in_use (default %d, after off %d)\n", default_on, !off);
    ++g_failures;
  }

  // Valid calls: without a driver they must say so (and not crash).
  if (void* cuda = dlopen("libcuda.so.1", RTLD_LAZY)) {
    dlclose(cuda);
    std::printf("skipped: a CUDA driver is present, so the no-driver checks do not apply\n");
  } else {
    expect("valid forward, no driver", flash::attn_fwd(valid_params(), stream), Status::kNoDriver);
    expect("valid backward, no driver", flash::attn_bwd(valid_bwd_params(), stream), Status::kNoDriver);
    // A caller built against version 1 of FwdParams: the version-2 fields are not read.
    p = valid_params();
    p.version = 1;
    p.window_left = -2;
    expect("version-1 params ignore v2 fields", flash::attn_fwd(p, stream), Status::kNoDriver);
    expect("valid packed forward, no driver", flash::attn_fwd(packed(), stream), Status::kNoDriver);
    // Eligible inputs need the device to decide the backend.
    p = valid_params();
    p.backend = flash::Backend::kGluon;
    expect("forced Gluon forward, no driver", flash::attn_fwd(p, stream), Status::kNoDriver);
    g = valid_bwd_params();
    expect("workspace bytes, auto, no driver", flash::attn_bwd_workspace_bytes(g, stream, &bytes),
           Status::kNoDriver);
    // Callers built against older headers: the newer fields are not read.
    p = valid_params();
    p.version = 3;
    p.backend = flash::Backend::kGluon;
    for (auto* t : {&p.q, &p.k, &p.v, &p.o}) t->dtype = DType::kFloat32;
    expect("version-3 params ignore backend", flash::attn_fwd(p, stream), Status::kNoDriver);
    g = valid_bwd_params();
    g.version = 2;
    g.backend = flash::Backend::kGluon;
    g.workspace = reinterpret_cast<void*>(0x1000008);
    expect("version-2 backward ignores v3 fields", flash::attn_bwd(g, stream), Status::kNoDriver);
    p = valid_params();
    p.version = 5;
    p.softcap = -30.0f;
    expect("version-5 params ignore softcap", flash::attn_fwd(p, stream), Status::kNoDriver);
    g = valid_bwd_params();
    g.version = 4;
    g.softcap = -30.0f;
    expect("version-4 backward ignores softcap", flash::attn_bwd(g, stream), Status::kNoDriver);
    p = valid_params();
    p.version = 6;
    p.alibi_slopes = aotriton::TensorView<2>::contiguous(reinterpret_cast<const void*>(0xa0000), {1, 1},
                                                         DType::kFloat16);
    expect("version-6 params ignore alibi_slopes", flash::attn_fwd(p, stream), Status::kNoDriver);
    g = valid_bwd_params();
    g.version = 5;
    g.alibi_slopes = p.alibi_slopes;
    expect("version-5 backward ignores alibi_slopes", flash::attn_bwd(g, stream), Status::kNoDriver);
    p = valid_params();
    p.version = 7;
    p.sinks = aotriton::TensorView<1>::contiguous(reinterpret_cast<const void*>(0xa8000), {1}, DType::kFloat16);
    expect("version-7 params ignore sinks", flash::attn_fwd(p, stream), Status::kNoDriver);
    g = valid_bwd_params();
    g.version = 6;
    g.dsinks = p.sinks;
    expect("version-6 backward ignores dsinks", flash::attn_bwd(g, stream), Status::kNoDriver);
    float mask_out = 0;
    auto out = aotriton::TensorView<4>::contiguous(&mask_out, {1, 1, 1, 1}, DType::kFloat32);
    expect("debug dropout mask, no driver",
           flash::debug_dropout_mask(out, 0.5f, &philox_state[0], &philox_state[1], 0, stream),
           Status::kNoDriver);
  }
  uint64_t counters = 7;
  expect("dropout counters", flash::dropout_offsets_consumed(2, 4, 17, 33, &counters), Status::kSuccess);
  if (counters != 2 * 4 * (8 * 2) * (4 * 3)) {  // 8·⌈17/16⌉ quad rows, 4·⌈33/16⌉ unit columns
    std::printf("FAIL dropout_offsets_consumed: %llu\n", (unsigned long long)counters);
    ++g_failures;
  }
  expect("dropout counters overflow u64",
         flash::dropout_offsets_consumed(65535, 65535, uint64_t(1) << 30, uint64_t(1) << 30, &counters),
         Status::kTooLarge);
  if (counters != 0) {
    std::printf("FAIL dropout_offsets_consumed overflow left %llu\n", (unsigned long long)counters);
    ++g_failures;
  }
  expect("dropout counters, null output", flash::dropout_offsets_consumed(1, 1, 1, 1, nullptr), Status::kNullPointer);

  std::printf("%s\n", g_failures ? "consumer: FAILED" : "consumer: all checks passed");
  return g_failures ? 1 : 0;
}
