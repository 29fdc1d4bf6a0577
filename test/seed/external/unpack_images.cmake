# Per-arch image tarballs into an install prefix, each checked first against SHA256SUMS (as
# PyTorch pins the seed's tarballs with URL_HASH): TARBALL_DIR, ARCHS, PREFIX.
cmake_minimum_required(VERSION 3.26)
string(REPLACE "|" ";" ARCHS "${ARCHS}")  # |-separated when passed through a command line
file(STRINGS ${TARBALL_DIR}/SHA256SUMS _sums)
foreach(_arch IN LISTS ARCHS)
  file(GLOB _tarball ${TARBALL_DIR}/aotriton-images-*-${_arch}.tar.xz)
  list(LENGTH _tarball _n)
  if(NOT _n EQUAL 1)
    message(FATAL_ERROR "${TARBALL_DIR}: expected one aotriton-images-*-${_arch}.tar.xz, found ${_n}")
  endif()
  get_filename_component(_name ${_tarball} NAME)
  file(SHA256 ${_tarball} _digest)
  list(FIND _sums "${_digest}  ${_name}" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "${_name}: SHA-256 ${_digest} is not in SHA256SUMS")
  endif()
  file(ARCHIVE_EXTRACT INPUT ${_tarball} DESTINATION ${PREFIX})
endforeach()
