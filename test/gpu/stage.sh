#!/usr/bin/env bash
# Runs on the BUILD machine (no GPU needed), from anywhere inside the repo. Puts into .stage/
# (git-ignored) what test/gpu/run_all.sh needs on the GPU machine besides the sources:
#   .stage/bin/aotriton-gpu-tests   the Rust API test, release, stripped
#   .stage/install/                 a copy of the installed tree (run the superbuild install first)
# Then carry .stage/ with the working tree (it must stay well under 64 MiB) and run
# test/gpu/run_all.sh there.
#   AOTRITON_KERNEL_DIR  compiled kernels for the crate (default build/kernels, the superbuild's)
#   INSTALL              the installed tree to stage (default install/)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
export AOTRITON_KERNEL_DIR=${AOTRITON_KERNEL_DIR:-$ROOT/build/kernels}
INSTALL=${INSTALL:-$ROOT/install}
die() { echo "stage.sh: $*" >&2; exit 1; }

ls "$AOTRITON_KERNEL_DIR"/*/manifest.json >/dev/null 2>&1 \
  || die "no compiled kernels in $AOTRITON_KERNEL_DIR (build the superbuild first, or set AOTRITON_KERNEL_DIR)"
[ -d "$INSTALL/lib/cmake/aotriton" ] && [ -d "$INSTALL/include/aotriton" ] \
  || die "no installed tree at $INSTALL (run the superbuild's install step first, or set INSTALL)"

# PATH: the bootstrapped cmake/ninja, should cargo's build script want them.
[ -d "$ROOT/.tools/bin" ] && export PATH="$ROOT/.tools/bin:$PATH"
cargo build --release -p aotriton-gpu-tests
target_dir=${CARGO_TARGET_DIR:-$ROOT/target}

rm -rf .stage
mkdir -p .stage/bin
cp "$target_dir/release/aotriton-gpu-tests" .stage/bin/
strip .stage/bin/aotriton-gpu-tests 2>/dev/null || true
cp -a "$INSTALL" .stage/install
# What the GPU run needs of the install tree: headers, the shared library (stripped) and its
# CMake package. The static library and the archive copies (the library embeds the archive)
# would push the carried tree past its 64 MiB limit.
rm -f .stage/install/lib/libaotriton.a .stage/install/lib/cmake/aotriton/aotritonStaticTargets*.cmake
rm -rf .stage/install/lib/aotriton
strip --strip-unneeded .stage/install/lib/libaotriton.so.* 2>/dev/null || true

echo "staged:"
(cd .stage && find . -type f -printf '%10s  %p\n' | sort -k2)
size=$(du -sb .stage | cut -f1)
echo "total: $((size / 1024)) KiB ($(du -sh .stage | cut -f1)) in $ROOT/.stage"
if [ "$size" -gt $((48 * 1024 * 1024)) ]; then
  echo "stage.sh: WARNING: .stage is over 48 MiB; the device copy limit is 64 MiB in all" >&2
fi
echo "next: carry .stage to the GPU machine and run test/gpu/run_all.sh from the repo root"
