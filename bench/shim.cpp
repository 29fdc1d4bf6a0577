// A C ABI over aotriton::v2::flash::attn_fwd for ctypes (bench/bench_fwd.py): primitive types only.
// Build (see CMakeLists.txt here):  cmake -S bench -B /tmp/bench -G Ninja \
//     -DCMAKE_PREFIX_PATH=<aotriton install prefix> && ninja -C /tmp/bench
// or directly:  g++ -O2 -std=c++17 -shared -fPIC bench/shim.cpp -I<prefix>/include \
//     -L<prefix>/lib -laotriton -Wl,-rpath,<prefix>/lib -o libaotriton_shim.so
#include <cstdint>

#include "aotriton/flash.h"
#include "aotriton/runtime.h"

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

}  // namespace

extern "C" {

// q, k, v, o: device pointers of B x H x S x D views; `sizes4` and `strides4` hold 16 int64 each,
// the sizes / element strides of q, k, v, o in that order. lse: B x H x Sq fp32 with `lse_sizes3`
// and `lse_strides3`. dtype: 1 fp16, 2 bf16 (aotriton::DType). stream: a CUstream (0 = legacy
// default stream). Returns the aotriton::Status value (0 = success).
__attribute__((visibility("default"))) int aotriton_shim_attn_fwd(
    uint64_t q, uint64_t k, uint64_t v, uint64_t o, uint64_t lse, const int64_t* sizes4,
    const int64_t* strides4, const int64_t* lse_sizes3, const int64_t* lse_strides3, int dtype,
    float sm_scale, int causal, uint64_t stream) {
  const auto dt = static_cast<aotriton::DType>(dtype);
  aotriton::v2::flash::FwdParams p;
  p.q = make_view<4>(q, sizes4 + 0, strides4 + 0, dt);
  p.k = make_view<4>(k, sizes4 + 4, strides4 + 4, dt);
  p.v = make_view<4>(v, sizes4 + 8, strides4 + 8, dt);
  p.o = make_view<4>(o, sizes4 + 12, strides4 + 12, dt);
  p.lse = make_view<3>(lse, lse_sizes3, lse_strides3, aotriton::DType::kFloat32);
  p.sm_scale = sm_scale;
  p.causal = causal != 0;
  aotriton::Stream s;
  s.handle = reinterpret_cast<void*>(static_cast<uintptr_t>(stream));
  return static_cast<int>(aotriton::v2::flash::attn_fwd(p, s));
}

// The calling thread's last error message (empty after a success).
__attribute__((visibility("default"))) const char* aotriton_shim_last_error() {
  return aotriton::last_error_message();
}

__attribute__((visibility("default"))) const char* aotriton_shim_version() { return aotriton::version(); }

}  // extern "C"
