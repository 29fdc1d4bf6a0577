#!/bin/sh
# Regenerates test/amd/code_objects.md, the generated table of what every AMD code object uses
# (LDS, VGPRs, AGPRs, SGPRs, scratch per arch, family, config and variant): runs the code-object
# test (test/amd/tests/code_objects.rs) with AOTRITON_WRITE_CODE_OBJECT_TABLE=1, which writes the
# table instead of comparing it. Commit the result with the kernel or config change that moved it.
#
# It reads the archives of ./build.sh / ./test.sh (AOTRITON_ARCHIVE_DIR, default build/images);
# build them first with the AMD archs, e.g.
#   AOTRITON_TARGET_ARCH="sm_90;gfx942;gfx90a;gfx950" ./build.sh
# The environment is test.sh's by default, so cargo reuses that build (override any variable):
#   AOTRITON_KERNEL_DIR   compiled kernels the crate packs (default build/kernels when present;
#                         without it the crate is built with no kernels, which the test does not need)
#   AOTRITON_TARGET_ARCH  archs the crate embeds (default test.sh's, or `none` without kernels)
# Needs the ROCm code-object manager (libamd_comgr.so.2, Debian's libamd-comgr2).
set -eu
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
export AOTRITON_ARCHIVE_DIR="${AOTRITON_ARCHIVE_DIR:-$(pwd)/$BUILD_DIR/images}"
if [ -z "${AOTRITON_KERNEL_DIR:-}" ] && [ -d "$BUILD_DIR/kernels" ]; then
    export AOTRITON_KERNEL_DIR="$(pwd)/$BUILD_DIR/kernels"
fi
if [ -n "${AOTRITON_KERNEL_DIR:-}" ]; then
    export AOTRITON_TARGET_ARCH="${AOTRITON_TARGET_ARCH:-sm_90;gfx942;gfx90a;gfx950}"
else
    export AOTRITON_TARGET_ARCH="${AOTRITON_TARGET_ARCH:-none}"
fi
AOTRITON_WRITE_CODE_OBJECT_TABLE=1 exec cargo test --locked -p aotriton-amd-tests --test code_objects -- --nocapture
