// Status codes, streams and library information.
#pragma once

#include <cstddef>
#include <cstdint>

// Marks the exported API; everything else in libaotriton is hidden.
#ifndef AOTRITON_API
#define AOTRITON_API __attribute__((visibility("default")))
#endif

// The stream types of the two runtimes, declared here so that no CUDA or HIP header is needed:
// cudaStream_t and CUstream are `CUstream_st*`, hipStream_t is `ihipStream_t*`.
struct CUstream_st;
struct ihipStream_t;

namespace aotriton {

// Every call returns a Status; nothing throws and nothing aborts. On failure,
// last_error_message() tells the cause. Values are stable (mirrored by the Rust ErrorKind);
// new ones are only appended.
enum class Status : int32_t {
  kSuccess = 0,
  kInvalidArgument = 1,     // a parameter is wrong in a way no kind below covers
  kDTypeMismatch = 2,       // tensors that must share a dtype do not
  kShapeMismatch = 3,       // tensor sizes disagree
  kBadStrides = 4,          // negative stride, or last stride not 1
  kUnsupportedHeadDim = 5,  // head dim not built into this library
  kNullPointer = 6,         // a required tensor has a null data pointer
  kMisalignedPointer = 7,   // a data pointer is not aligned to its element size
  kEmptyInput = 8,          // batch, heads, Sq or Sk is 0
  kUnsupportedDType = 9,    // the operator does not take this dtype
  kTooLarge = 10,           // beyond the launch grid or the kernel's index arithmetic
  kUnsupportedVersion = 11, // a parameter struct's `version` is unknown to this library
  kUnsupportedByBackend = 12,  // the forced backend cannot serve these inputs on this device
  kNoDriver = 20,           // no GPU driver library on this machine
  kDriverError = 21,        // a driver call failed (named in the message)
  kUnsupportedGpu = 22,     // no kernels for this GPU architecture in this build
  kKernelNotFound = 23,     // no compiled kernel serves these inputs
  kBadArchive = 24,         // a kernel archive is corrupt or mismatched
  kNoDevice = 25,           // the stream's runtime library is present but reports no GPU
  kUntrustedImages = 26,    // AOTRITON_IMAGE_DIR or an archive in it is not trusted (permissions, digest)
  kInternal = 99,           // a bug in aotriton; please report it with the message
};

// Which GPU runtime a stream belongs to.
enum class GpuRuntime : int32_t {
  kCuda = 0,  // NVIDIA: a cudaStream_t / CUstream
  kHip = 1,   // AMD: a hipStream_t
};

// A GPU stream of either runtime. The constructors take each runtime's own stream type, so a
// CUDA stream cannot be passed as a HIP one or the other way round:
//   aotriton::Stream{cuda_stream}        // cudaStream_t or CUstream
//   aotriton::Stream{hip_stream}         // hipStream_t (also implicitly, as the seed's API takes it)
//   aotriton::Stream::hip()              // HIP's null stream
//   aotriton::Stream{} / Stream::cuda()  // CUDA's legacy default stream
// The device is always the stream's device (HIP before ROCm 6, which cannot say which device a
// stream belongs to: the calling thread's current device). A null handle is that runtime's
// default stream of the calling thread's current context or device. A stream of a runtime whose
// library this process cannot load gets kNoDriver; one with no GPU behind it kNoDevice.
struct Stream {
  void* handle = nullptr;
  GpuRuntime runtime = GpuRuntime::kCuda;

  constexpr Stream() = default;
  constexpr explicit Stream(CUstream_st* cuda_stream) : handle(cuda_stream), runtime(GpuRuntime::kCuda) {}
  // Implicit, as in the seed (ROCm/aotriton), whose callers pass a hipStream_t where a Stream is
  // expected. The CUDA one stays explicit, and a bare nullptr is refused at compile time (it
  // would otherwise silently mean HIP's null stream).
  constexpr Stream(ihipStream_t* hip_stream) : handle(hip_stream), runtime(GpuRuntime::kHip) {}
  Stream(std::nullptr_t) = delete;
  static constexpr Stream cuda(CUstream_st* stream = nullptr) { return Stream(stream); }
  static constexpr Stream hip(ihipStream_t* stream = nullptr) { return Stream(stream); }
};

// The message of the calling thread's last failing call (empty after a success). The pointer
// stays valid until this thread's next aotriton call.
AOTRITON_API const char* last_error_message() noexcept;

// "kShapeMismatch" etc.
AOTRITON_API const char* status_name(Status status) noexcept;

// Library version and the GPU archs it carries kernels for, e.g. "0.1.0 (sm_90)".
AOTRITON_API const char* version() noexcept;

// For the tuner (python/tune.py): while an id is forced, every operator kernel whose functional
// holds a compiled kernel with that id (and whose alignment hints fit the call) launches it
// instead of dispatch's choice; the other kernels of the operator choose as usual. nullptr
// clears it. Process-wide; meant for timing the candidates of a tuning build (kernel ids are
// python/rules.py's), not for production calls.
namespace tuning {
AOTRITON_API Status force_kernel(const char* kernel_id) noexcept;
// How many kernels the override has launched in place of dispatch's choice so far (process-wide):
// read it around a call to know the forced kernel itself ran.
AOTRITON_API uint64_t forced_count() noexcept;
// Whether dispatch follows the tuning database compiled into the archive (true, the default) or
// only the documented heuristic, as a build without a database would (false). Process-wide;
// takes effect at the next call.
AOTRITON_API void use_database(bool on) noexcept;
AOTRITON_API bool database_in_use() noexcept;
}  // namespace tuning

}  // namespace aotriton
