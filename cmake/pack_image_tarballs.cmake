# The release step for prebuilt images (target aotriton_image_tarballs): one tarball per arch,
#   aotriton-images-<VERSION>-<arch>.tar.xz = lib/aotriton/aotriton-<arch>.images
#                                            + lib/aotriton/aotriton-images.sha256
# to be unpacked into an install prefix (a NOIMAGE build reads <prefix>/lib/aotriton), and
# SHA256SUMS over the tarballs (what a consumer pins, as PyTorch pins the seed's). Every tarball
# carries the manifest of all the build's archives, so unpacking several never overwrites one
# arch's digest with another's: the file is the same in each.
#
#   cmake -DARCHIVE_DIR=build/images -DARCHS="sm_90;gfx942" -DVERSION=0.1.0 -DOUT_DIR=dist \
#         -P cmake/pack_image_tarballs.cmake
cmake_minimum_required(VERSION 3.26)
foreach(_var ARCHIVE_DIR ARCHS VERSION OUT_DIR)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "pack_image_tarballs.cmake: -D${_var}=... is required")
  endif()
endforeach()
set(_manifest ${ARCHIVE_DIR}/aotriton-images.sha256)
if(NOT EXISTS ${_manifest})
  message(FATAL_ERROR "${_manifest} is missing: build the archives first")
endif()
file(STRINGS ${_manifest} _lines)
file(REMOVE_RECURSE ${OUT_DIR}/stage)
file(MAKE_DIRECTORY ${OUT_DIR})
set(_sums "")
foreach(_arch IN LISTS ARCHS)
  set(_archive ${ARCHIVE_DIR}/aotriton-${_arch}.images)
  if(NOT EXISTS ${_archive})
    message(FATAL_ERROR "${_archive} is missing")
  endif()
  # The manifest must vouch for this archive as built: its digest, recomputed.
  file(SHA256 ${_archive} _digest)
  string(FIND "${_lines}" "${_digest}  aotriton-${_arch}.images" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "${_manifest} has no line '${_digest}  aotriton-${_arch}.images': the archive changed after the build")
  endif()
  set(_stage ${OUT_DIR}/stage/${_arch})
  file(MAKE_DIRECTORY ${_stage}/lib/aotriton)
  file(COPY ${_archive} ${_manifest} DESTINATION ${_stage}/lib/aotriton)
  set(_tarball aotriton-images-${VERSION}-${_arch}.tar.xz)
  # Fixed mtime and relative paths: the same archives give the same tarball bytes.
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E tar cJf ${OUT_DIR}/${_tarball} --mtime=1970-01-01 --format=gnutar -- lib
    WORKING_DIRECTORY ${_stage}
    RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "packing ${_tarball} failed (${_rc})")
  endif()
  file(SHA256 ${OUT_DIR}/${_tarball} _tar_digest)
  string(APPEND _sums "${_tar_digest}  ${_tarball}\n")
  message(STATUS "${OUT_DIR}/${_tarball}")
endforeach()
file(REMOVE_RECURSE ${OUT_DIR}/stage)
file(WRITE ${OUT_DIR}/SHA256SUMS "${_sums}")
message(STATUS "${OUT_DIR}/SHA256SUMS")
