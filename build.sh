#!/bin/sh
# Builds everything on a fresh machine and installs it into ./install:
#   .tools/   cmake + ninja from PyPI (hash-pinned), only if the system has no cmake >= 3.26
#   build/    the superbuild: venv with the pinned Triton, kernels, Rust runtime, C++ library
#   install/  lib/libaotriton.{a,so}, include/aotriton/, lib/aotriton/*.images, lib/cmake/aotriton/,
#             bin/aotriton-pack
# then lists what the installed archives hold. Needs python3 (with venv), cargo and a C++ compiler.
# Knobs: BUILD_DIR, PREFIX, BUILD_TYPE (Release|Debug), AOTRITON_TARGET_ARCH (default sm_90).
set -eu
cd "$(dirname "$0")"
ROOT=$(pwd)
TOOLS=$ROOT/.tools/bin
BUILD_DIR=${BUILD_DIR:-build}
PREFIX=${PREFIX:-$ROOT/install}
BUILD_TYPE=${BUILD_TYPE:-Release}
ARCHS=${AOTRITON_TARGET_ARCH:-sm_90}

if [ ! -x "$TOOLS/cmake" ] || [ ! -x "$TOOLS/ninja" ] ||
   [ third_party/tools/requirements.txt -nt "$TOOLS/cmake" ]; then
  python3 -m venv --clear .tools
  "$TOOLS/pip" install --quiet --disable-pip-version-check --require-hashes --only-binary=:all: \
    -r third_party/tools/requirements.txt
  touch "$TOOLS/cmake"
fi

"$TOOLS/cmake" -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_MAKE_PROGRAM="$TOOLS/ninja" \
  -DCMAKE_BUILD_TYPE="$BUILD_TYPE" -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  "-DAOTRITON_TARGET_ARCH=$ARCHS"
"$TOOLS/cmake" --build "$BUILD_DIR"
"$TOOLS/cmake" --install "$BUILD_DIR" > /dev/null

# The main job's result: what the installed library carries, every image checked.
for archive in "$PREFIX"/lib/aotriton/*.images; do
  "$PREFIX/bin/aotriton-pack" verify "$archive"
done
echo "installed into $PREFIX"
