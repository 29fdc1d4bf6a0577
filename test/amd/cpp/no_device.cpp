// Every C++ API call on a HIP stream, on a machine with the HIP runtime but no AMD GPU, must
// return kNoDevice (and a message naming the HIP call) without crashing. Run by
// test/amd/tests/no_device.rs; prints "<call>: <status> <message>" per call, exits 1 on a mismatch.
#include <aotriton/flash.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

int failures = 0;

void expect(const char* call, aotriton::Status got, aotriton::Status want) {
  std::printf("%s: %s %s\n", call, aotriton::status_name(got), aotriton::last_error_message());
  if (got != want) {
    std::printf("  FAIL: expected %s\n", aotriton::status_name(want));
    ++failures;
  }
}

}  // namespace

int main() {
  namespace flash = aotriton::v2::flash;
  using aotriton::DType;
  using aotriton::TensorView;
  const uint64_t B = 2, H = 4, S = 128, D = 64;
  // Fake, aligned device addresses: nothing is launched, so nothing is touched.
  auto t = [&](uintptr_t base) {
    return TensorView<4>::contiguous(reinterpret_cast<const void*>(base), {B, H, S, D}, DType::kFloat16);
  };
  auto rows = [&](uintptr_t base) {
    return TensorView<3>::contiguous(reinterpret_cast<const void*>(base), {B, H, S}, DType::kFloat32);
  };
  const aotriton::Stream streams[] = {aotriton::Stream::hip(),
                                      aotriton::Stream{reinterpret_cast<ihipStream_t*>(0x5000)}};
  for (const aotriton::Stream& stream : streams) {
    if (stream.runtime != aotriton::GpuRuntime::kHip) {
      std::printf("FAIL: a hipStream_t made a stream of runtime %d\n", static_cast<int>(stream.runtime));
      return 1;
    }
    flash::FwdParams fwd;
    fwd.q = t(0x100000);
    fwd.k = t(0x200000);
    fwd.v = t(0x300000);
    fwd.o = t(0x400000);
    fwd.lse = rows(0x500000);
    fwd.sm_scale = 1.0f / std::sqrt(float(D));
    fwd.causal = true;
    expect("attn_fwd", flash::attn_fwd(fwd, stream), aotriton::Status::kNoDevice);

    flash::BwdParams bwd;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.o = fwd.o;
    bwd.d_o = t(0x600000);
    bwd.lse = fwd.lse;
    bwd.delta = rows(0x700000);
    bwd.dq = t(0x800000);
    bwd.dk = t(0x900000);
    bwd.dv = t(0xa00000);
    bwd.sm_scale = fwd.sm_scale;
    expect("attn_bwd", flash::attn_bwd(bwd, stream), aotriton::Status::kNoDevice);
    uint64_t bytes = 1;
    expect("attn_bwd_workspace_bytes", flash::attn_bwd_workspace_bytes(bwd, stream, &bytes),
           aotriton::Status::kNoDevice);

    TensorView<4> mask = TensorView<4>::contiguous(reinterpret_cast<const void*>(0xb00000), {B, H, S, S},
                                                    DType::kFloat32);
    expect("debug_dropout_mask",
           flash::debug_dropout_mask(mask, 0.1f, reinterpret_cast<const void*>(0xc00000),
                                     reinterpret_cast<const void*>(0xc00008), 0, stream),
           aotriton::Status::kNoDevice);

    // Validation still comes first: a bad argument is reported as such on a HIP stream too.
    fwd.q.data = nullptr;
    expect("attn_fwd (null q)", flash::attn_fwd(fwd, stream), aotriton::Status::kNullPointer);
  }
  if (std::strstr(aotriton::version(), "(") == nullptr) {
    std::printf("FAIL: version() lacks the archs: %s\n", aotriton::version());
    ++failures;
  }
  std::printf("%s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
