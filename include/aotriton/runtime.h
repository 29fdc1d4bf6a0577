// Status codes, streams and library information.
#pragma once

#include <cstdint>

// Marks the exported API; everything else in libaotriton is hidden.
#define AOTRITON_API __attribute__((visibility("default")))

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
  kInternal = 99,           // a bug in aotriton; please report it with the message
};

// A GPU stream: a CUstream on NVIDIA. The device is always the stream's device. A null handle
// is the legacy default stream of the calling thread's current context.
struct Stream {
  void* handle = nullptr;
};

// The message of the calling thread's last failing call (empty after a success). The pointer
// stays valid until this thread's next aotriton call.
AOTRITON_API const char* last_error_message() noexcept;

// "kShapeMismatch" etc.
AOTRITON_API const char* status_name(Status status) noexcept;

// Library version and the GPU archs it carries kernels for, e.g. "0.1.0 (sm_90)".
AOTRITON_API const char* version() noexcept;

}  // namespace aotriton
