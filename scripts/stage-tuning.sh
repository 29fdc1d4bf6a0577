#!/usr/bin/env bash
# Stages what python/tune.py needs on the GPU machine into .stage-tune/ (git-ignored), from the
# superbuild (./build.sh with AOTRITON_TARGET_ARCH=sm_90) and its install:
#   images/aotriton-<arch>.images + aotriton-images.sha256   a tuning build: every candidate of
#                                   rules.py compiled (python/compile.py --for-tuning), packed
#   lib/libaotriton.so*, lib/libaotriton_shim.so              the runtime and the bench shim
#   bin/aotriton-pack                                          lists the archive's kernels
#   tune-progress.json                                         copied from TUNE_PROGRESS if set
#                                                              (a previous call's, to resume)
# Then, on the GPU machine (repo root; carry .stage-tune):
#   AOTRITON_IMAGE_DIR=$PWD/.stage-tune/images python3 python/tune.py \
#     --shim .stage-tune/lib/libaotriton_shim.so --pack .stage-tune/bin/aotriton-pack \
#     --out $OUT/sm_90.json --progress .stage-tune/tune-progress.json --budget 480 && \
#     cp .stage-tune/tune-progress.json $OUT/
# Env: ARCH (sm_90), BUILD_DIR (build), INSTALL (install), TUNE_PROGRESS, ONLY (compile only the
# kernels whose id contains one of these comma-separated substrings; default
# "-fp16-,-bf16-,debug_dropout_mask" (the dropout cells read their keep-mask through it), the
# tuner's default dtypes: the fp32 candidates are the slowest to compile and the last to tune;
# ONLY=, (empty) compiles every candidate; "a+b" selects ids holding both, e.g. ONLY="-fp32-+-drop0-bias0-,attn_bwd_preprocess-fp32" the fp32 base functionals).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ARCH=${ARCH:-sm_90}
BUILD_DIR=${BUILD_DIR:-build}
INSTALL=${INSTALL:-$ROOT/install}
die() { echo "stage-tuning.sh: $*" >&2; exit 1; }
[ -x "$BUILD_DIR/venv/bin/python" ] || die "no superbuild venv in $BUILD_DIR (run ./build.sh first)"
[ -f "$INSTALL/lib/libaotriton.so" ] || die "no installed library in $INSTALL"
cache=$(sed -n 's/^AOTRITON_KERNEL_CACHE:PATH=//p' "$BUILD_DIR/CMakeCache.txt")

kernels=$BUILD_DIR/tuning-kernels
"$BUILD_DIR/venv/bin/python" -B python/compile.py --arch "$ARCH" --for-tuning --out "$kernels" \
  --cache "${cache:-$BUILD_DIR/kernel-cache}" --only="${ONLY--fp16-,-bf16-,debug_dropout_mask}"
[ -d "$ROOT/.tools/bin" ] && export PATH="$ROOT/.tools/bin:$PATH"
# aotriton-pack embeds the normal build's archive like every binary of the crate.
AOTRITON_KERNEL_DIR=${AOTRITON_KERNEL_DIR:-$ROOT/$BUILD_DIR/kernels} AOTRITON_TARGET_ARCH=$ARCH \
  cargo build --locked --release -p aotriton --bin aotriton-pack
pack=${CARGO_TARGET_DIR:-$ROOT/target}/release/aotriton-pack

rm -rf .stage-tune
mkdir -p .stage-tune/images .stage-tune/lib .stage-tune/bin
"$pack" pack "$kernels/$ARCH" ".stage-tune/images/aotriton-$ARCH.images"
(cd .stage-tune/images && sha256sum "aotriton-$ARCH.images" > aotriton-images.sha256)
chmod 755 .stage-tune/images && chmod 644 .stage-tune/images/*
cp "$pack" .stage-tune/bin/
# The library under its SONAME as a plain file (no symlinks to carry), the shim linked to it.
cp -L "$INSTALL/lib/libaotriton.so.0" .stage-tune/lib/libaotriton.so.0
strip --strip-unneeded .stage-tune/lib/libaotriton.so.0 .stage-tune/bin/aotriton-pack 2>/dev/null || true
g++ -O2 -std=c++17 -shared -fPIC bench/shim.cpp -I"$INSTALL/include" -L.stage-tune/lib -l:libaotriton.so.0 \
  -Wl,-rpath,'$ORIGIN' -o .stage-tune/lib/libaotriton_shim.so
if [ -n "${TUNE_PROGRESS:-}" ]; then
  cp "$TUNE_PROGRESS" .stage-tune/tune-progress.json
fi
"$pack" verify ".stage-tune/images/aotriton-$ARCH.images" | tail -n 1
echo "staged:"
(cd .stage-tune && find . -type f -printf '%10s  %p\n' | sort -k2)
size=$(du -sb .stage-tune | cut -f1)
echo "total: $((size / 1024)) KiB in $ROOT/.stage-tune (the device copy limit is 64 MiB with the tree)"
[ "$size" -lt $((60 * 1024 * 1024)) ] || die ".stage-tune is over 60 MiB: tune fewer families per call"
