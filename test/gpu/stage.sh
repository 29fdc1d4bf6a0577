#!/usr/bin/env bash
# Runs on the BUILD machine (no GPU needed), from anywhere inside the repo. Puts into .stage/
# (git-ignored) what test/gpu/run_all.sh needs on the GPU machine besides the sources:
#   .stage/bin/aotriton-gpu-tests   the Rust API test, release, stripped
#   .stage/bin/aotriton-unit-tests  the crate's own unit tests, release, runtime-only, stripped:
#                                   run_all.sh runs the ones CI skips because they need a GPU
#                                   (`#[ignore]`; they load no kernel)
#   .stage/bin/examples/            the crate's examples and aotriton-info, release, runtime-only
#   .stage/images/                  the sm_90 archive + its digest line, their AOTRITON_IMAGE_DIR
#   .stage/gluon-cubins/            the Gluon kernels' cubins (sm_90), for racecheck_triage.py
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
# The unit-test executable's path has a hash in it: cargo names it in its JSON messages. Built
# runtime-only (feature no-images, as the examples below): the GPU unit tests load no kernel, and an
# embedded archive would add ~12 MB to a carried tree that must stay under 64 MiB.
examples_target=$target_dir/stage-no-images
unit_tests=$(CARGO_TARGET_DIR=$examples_target cargo test --release -p aotriton --lib --no-default-features \
  --features no-images,cudarc-adapters,cli --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])' | tail -n 1)
[ -x "$unit_tests" ] || die "cargo test --no-run named no unit-test executable"

rm -rf .stage
mkdir -p .stage/bin
cp "$target_dir/release/aotriton-gpu-tests" .stage/bin/
cp "$unit_tests" .stage/bin/aotriton-unit-tests
# The crate's examples and aotriton-info, built runtime-only (feature no-images: an embedded
# archive in each would take ~12 MB apiece) and run with AOTRITON_IMAGE_DIR=.stage/images, the
# build's archives and their digest manifest: the runtime-only path a packager ships.
CARGO_TARGET_DIR=$examples_target cargo build --release -p aotriton --no-default-features \
  --features no-images,cudarc-adapters,cli --examples --bin aotriton-info
mkdir -p .stage/bin/examples .stage/images
for example in "$ROOT"/rust/aotriton/examples/*.rs; do
  name=$(basename "$example" .rs)
  [ -x "$examples_target/release/examples/$name" ] && cp "$examples_target/release/examples/$name" .stage/bin/examples/
done
cp "$examples_target/release/aotriton-info" .stage/bin/examples/
strip .stage/bin/examples/* 2>/dev/null || true
archive_dir=${AOTRITON_ARCHIVE_DIR:-$ROOT/build/images}
cp "$archive_dir"/aotriton-sm_90.images .stage/images/
grep ' aotriton-sm_90.images$' "$archive_dir/aotriton-images.sha256" > .stage/images/aotriton-images.sha256
chmod 755 .stage/images && chmod 644 .stage/images/*
strip .stage/bin/aotriton-gpu-tests .stage/bin/aotriton-unit-tests 2>/dev/null || true
cp -a "$INSTALL" .stage/install
if ls "$AOTRITON_KERNEL_DIR"/sm_90/*_gluon*.cubin >/dev/null 2>&1; then
  mkdir -p .stage/gluon-cubins
  cp "$AOTRITON_KERNEL_DIR"/sm_90/*_gluon*.cubin .stage/gluon-cubins/
fi
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
