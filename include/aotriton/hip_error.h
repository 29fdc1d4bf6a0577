// hipError_t, the status type of the seed-compatible functions (flash.h: check_gpu, the v2
// positional functions, aotriton::v3::flash).
//
// With HIP's own header available and a HIP platform chosen (__HIP_PLATFORM_AMD__, as hipcc and
// PyTorch's ROCm build define), that header's hipError_t is used. Otherwise (a CUDA program, a
// machine without ROCm) this header declares the same enum, with HIP's values, for the codes
// aotriton returns: the two are the same type to the linker (an enum is mangled by its name), so
// one library serves both kinds of callers. Define AOTRITON_HIP_ERROR_FROM_HIP=0 to force the
// declaration here, =1 to require HIP's header.
#pragma once

#ifndef AOTRITON_HIP_ERROR_FROM_HIP
#if defined(__has_include)
#if __has_include(<hip/hip_runtime_api.h>) && \
    (defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_HCC__) || defined(__HIP_PLATFORM_NVIDIA__))
#define AOTRITON_HIP_ERROR_FROM_HIP 1
#endif
#endif
#endif
#ifndef AOTRITON_HIP_ERROR_FROM_HIP
#define AOTRITON_HIP_ERROR_FROM_HIP 0
#endif

#if AOTRITON_HIP_ERROR_FROM_HIP
#include <hip/hip_runtime_api.h>
#elif !defined(HIP_INCLUDE_HIP_HIP_RUNTIME_API_H)
// HIP's values (hip_runtime_api.h); the ones aotriton returns are listed in flash.h.
typedef enum hipError_t {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorOutOfMemory = 2,
  hipErrorInvalidSymbol = 13,
  hipErrorInsufficientDriver = 35,
  hipErrorNoDevice = 100,
  hipErrorInvalidDevice = 101,
  hipErrorInvalidImage = 200,
  hipErrorNoBinaryForGpu = 209,
  hipErrorPeerAccessUnsupported = 217,
  hipErrorSharedObjectSymbolNotFound = 302,
  hipErrorInvalidHandle = 400,
  hipErrorNotFound = 500,
  hipErrorLaunchFailure = 719,
  hipErrorNotSupported = 801,
  hipErrorUnknown = 999,
} hipError_t;
#endif
