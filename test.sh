#!/bin/sh
# The test command: builds and installs (build.sh), then runs every test that needs no GPU:
#   cargo test   the Rust runtime (archive, dispatch, validation, no-driver behaviour), the bridge
#   ctest        the out-of-tree C++ consumer (shared and static) against the installed tree,
#                and the Python tests (rules, compile driver, kernel numerics in the interpreter)
#   GPU tests    run only where a GPU is; here they print "skipped: no GPU" (test/gpu/README.md)
set -eu
cd "$(dirname "$0")"
./build.sh
BUILD_DIR=${BUILD_DIR:-build}
TOOLS=$(pwd)/.tools/bin
# Reuse the superbuild's compiled kernels instead of compiling them again for cargo's profile.
export AOTRITON_KERNEL_DIR="$(pwd)/$BUILD_DIR/kernels"
cargo test --locked --workspace
"$TOOLS/ctest" --test-dir "$BUILD_DIR" --output-on-failure
cargo run --locked --quiet -p aotriton-gpu-tests
