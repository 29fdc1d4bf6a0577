// Uses the installed headers and library with no GPU: every validation error comes back as its
// own Status with a message, and a valid call reports that there is no driver.
#include <aotriton/flash.h>
#include <dlfcn.h>

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
static flash::FwdParams valid_params() {
  const uint64_t b = 2, h = 4, sq = 17, sk = 33, d = 64;
  auto addr = [](uintptr_t a) { return reinterpret_cast<const void*>(a); };
  flash::FwdParams p;
  p.q = aotriton::TensorView<4>::contiguous(addr(0x10000), {b, h, sq, d}, DType::kFloat16);
  p.k = aotriton::TensorView<4>::contiguous(addr(0x20000), {b, h, sk, d}, DType::kFloat16);
  p.v = aotriton::TensorView<4>::contiguous(addr(0x30000), {b, h, sk, d}, DType::kFloat16);
  p.o = aotriton::TensorView<4>::contiguous(addr(0x40000), {b, h, sq, d}, DType::kFloat16);
  p.lse = aotriton::TensorView<3>::contiguous(addr(0x50000), {b, h, sq}, DType::kFloat32);
  p.sm_scale = 1.0f / std::sqrt(float(d));
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
    t->sizes[3] = 80;
  }
  expect("head dim 80 not compiled", flash::attn_fwd(p, stream), Status::kUnsupportedHeadDim);

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
  p.version = 7;
  expect("params from a newer header", flash::attn_fwd(p, stream), Status::kUnsupportedVersion);

  // A valid call: without a driver it must say so (and not crash).
  if (void* cuda = dlopen("libcuda.so.1", RTLD_LAZY)) {
    dlclose(cuda);
    std::printf("skipped: a CUDA driver is present, so the no-driver check does not apply\n");
  } else {
    expect("valid call, no driver", flash::attn_fwd(valid_params(), stream), Status::kNoDriver);
  }

  std::printf("%s\n", g_failures ? "consumer: FAILED" : "consumer: all checks passed");
  return g_failures ? 1 : 0;
}
