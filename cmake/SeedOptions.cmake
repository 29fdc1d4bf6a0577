# The seed's (ROCm/aotriton) CMake options, as its consumers pass them (PyTorch's
# cmake/External/aotriton.cmake): each one is honoured or refused here by name, never ignored.
#
# Honoured:
#   AOTRITON_NO_PYTHON      this project never builds a Python module; ON or OFF changes nothing
#                           (the kernels' compiler uses its own venv, not a module for users).
#   AOTRITON_NO_SHARED      ON: only libaotriton.a (and libaotriton_v2.a naming it) is built and
#                           installed; the CMake package's aotriton::aotriton is then the static one.
#   AOTRITON_NOIMAGE_MODE   ON: runtime only (no Triton, no Python, no kernel compilation); the
#                           library reads the archives at run time (README, "Prebuilt images").
#   AOTRITON_GPU_BUILD_TIMEOUT  minutes one kernel may take to compile (0 = none): sets
#                           AOTRITON_COMPILE_TIMEOUT.
#   AOTRITON_ENABLE_FP32_INPUTS  fp32 kernels are always built; ON is accepted, OFF refused.
# Refused (FATAL_ERROR naming the option) when set to anything but their neutral value, because
# this project has no counterpart: a Triton wheel or venv of the caller's (the pinned Triton is
# part of the kernels' identity), the tuning builds, a renamed library, torch-dependent tests.
foreach(_neutral_off
    AOTRITON_USE_LOCAL_TRITON_WHEEL AOTRITON_INHERIT_SYSTEM_SITE_TRITON AOTRITON_ALT_TRITON_WHEEL_CONFIG_FILE
    AOTRITON_BUILD_FOR_TUNING AOTRITON_BUILD_FOR_TUNING_BUT_SKIP_KERNEL AOTRITON_TUNING_DATABASE_ROOT
    AOTRITON_NAME_SUFFIX AOTRITON_USE_TORCH AOTRITON_OVERRIDE_TARGET_GPUS AOTRITON_TERMINATE_WHEN_GPU_BUILD_TIMEOUT)
  if(DEFINED ${_neutral_off} AND ${_neutral_off})
    message(FATAL_ERROR
      "${_neutral_off}=${${_neutral_off}}: this aotriton does not support the seed option ${_neutral_off} "
      "(it compiles its kernels with its own pinned Triton, has no tuning build and no name suffix). "
      "Leave it unset, OFF or empty; the options it honours: AOTRITON_TARGET_ARCH, AOTRITON_NO_SHARED, "
      "AOTRITON_NOIMAGE_MODE, AOTRITON_NO_PYTHON, AOTRITON_GPU_BUILD_TIMEOUT (see cmake/SeedOptions.cmake).")
  endif()
endforeach()

if(DEFINED AOTRITON_ENABLE_FP32_INPUTS AND NOT AOTRITON_ENABLE_FP32_INPUTS)
  message(FATAL_ERROR "AOTRITON_ENABLE_FP32_INPUTS=${AOTRITON_ENABLE_FP32_INPUTS}: this aotriton always builds "
                      "its fp32 kernels; leave the option unset or ON")
endif()

if(DEFINED AOTRITON_GPU_BUILD_TIMEOUT AND NOT AOTRITON_GPU_BUILD_TIMEOUT STREQUAL "")
  if(NOT AOTRITON_GPU_BUILD_TIMEOUT MATCHES "^([0-9]+)(\\.([0-9]*))?$")
    message(FATAL_ERROR "AOTRITON_GPU_BUILD_TIMEOUT=${AOTRITON_GPU_BUILD_TIMEOUT}: minutes, a number >= 0")
  endif()
  # Whole minutes plus tenths (6 s each); 0 means no limit, as in the seed (a year here).
  set(_minutes ${CMAKE_MATCH_1})
  string(SUBSTRING "${CMAKE_MATCH_3}0" 0 1 _tenths)
  math(EXPR _timeout "${_minutes} * 60 + ${_tenths} * 6")
  if(_timeout EQUAL 0)
    set(_timeout 31536000)
  endif()
  set(AOTRITON_COMPILE_TIMEOUT ${_timeout} CACHE STRING "Seconds one kernel may take to compile" FORCE)
endif()

if(AOTRITON_NOIMAGE_MODE AND AOTRITON_GENERATE_ONLY)
  message(FATAL_ERROR "AOTRITON_NOIMAGE_MODE and AOTRITON_GENERATE_ONLY exclude each other: the first compiles "
                      "no kernels, the second only kernels")
endif()
