#!/bin/sh
# The test command: builds and installs (build.sh), then runs every test that needs no GPU:
#   cargo test   the Rust runtime (archive, dispatch, validation, no-driver behaviour, fuzzing of
#                the archive reader and the validation for a fixed time), the bridge,
#                and the AMD checks (test/amd: the real HIP runtime without a device, every hsaco
#                against the code-object manager's metadata, launches recorded by a HIP double,
#                one process driving two of its devices), and the CUDA launch path against a
#                recording CUDA driver double (test/cuda: two sm_90 devices, no GPU)
#   cli          aotriton-info / aotriton-pack as a user runs them
#   crates       the runtime and image crates packaged and built offline by a fresh consumer
#   ctest        the out-of-tree C++ consumer (shared and static) against the installed tree, the
#                seed-compatible API (on the recording HIP double) and PyTorch's ExternalProject
#                flow, and the Python tests (rules, compile driver, kernel numerics in the interpreter)
#   torch        the PyTorch glue on the CPU with float64 stand-ins for the kernels (registration,
#                transformers, KV cache, torch's context parallel over two gloo ranks) and the
#                tuner's dry run, where a python3 with torch (and
#                transformers) is found; PyPI has
#                only torch's 4.7 GB CUDA build, so CI prints "skipped: ..." and the GPU machine
#                runs them (test/torch/run.sh)
#   GPU tests    run only where a GPU is; here they print "skipped: no GPU" (test/gpu/README.md)
# The images of every arch are built (AOTRITON_TARGET_ARCH overrides), so that the AMD checks have
# archives to check. The AMD checks need Debian's ROCm 5.2 libraries (.ci/run installs them);
# without them they print "skipped: ..." (under CI=true: they fail).
set -eu
cd "$(dirname "$0")"
export AOTRITON_TARGET_ARCH="${AOTRITON_TARGET_ARCH:-sm_90;gfx942;gfx90a;gfx950}"
./build.sh
BUILD_DIR=${BUILD_DIR:-build}
TOOLS=$(pwd)/.tools/bin
# Reuse the superbuild's compiled kernels instead of compiling them again for cargo's profile.
export AOTRITON_KERNEL_DIR="$(pwd)/$BUILD_DIR/kernels"
# The AMD checks read the packed archives and the installed C++ API from here.
export AOTRITON_ARCHIVE_DIR="$(pwd)/$BUILD_DIR/images"
export AOTRITON_INSTALL_DIR="${PREFIX:-$(pwd)/install}"
# The fuzz targets (rust/aotriton/tests/fuzz_*.rs: archive reader, parameter validation) run for a
# fixed budget each; the seed is printed, AOTRITON_FUZZ_SEED replays it.
export AOTRITON_FUZZ_SECONDS="${AOTRITON_FUZZ_SECONDS:-90}"
cargo test --locked --workspace
# aotriton-info and aotriton-pack as a user runs them (feature cli).
cargo test --locked -p aotriton --features cli --test cli
# The crates as crates.io would serve them: packaged (each <= 10 MiB) and built offline by a
# fresh consumer with no Python (scripts/package-crates.sh; about 2 minutes).
scripts/package-crates.sh "$BUILD_DIR/images"
"$TOOLS/ctest" --test-dir "$BUILD_DIR" --output-on-failure
cargo run --locked --quiet -p aotriton-gpu-tests
# The PyTorch glue's CPU tests (TORCH_PYTHON: a python3 with torch; default python3).
TORCH_PYTHON=${TORCH_PYTHON:-python3}
if "$TORCH_PYTHON" -c "import torch, transformers" >/dev/null 2>&1; then
  log=$(mktemp)
  for t in test_flash_impl_plumbing test_hf_plumbing test_kvcache_plumbing test_context_parallel_cpu; do
    if ! PYTHONPATH="$(pwd)/bindings/torch/python:$(pwd)/test/torch" "$TORCH_PYTHON" "test/torch/$t.py" >"$log" 2>&1; then
      grep -E "^FAIL|Error" "$log" | head -n 20
      tail -n 1 "$log"
      exit 1
    fi
    tail -n 1 "$log"
  done
  # The tuner's dry run (python/tune.py on the CPU with a float64 stand-in shim); the build
  # venv's python_tests skip it without torch.
  if ! (cd python/tests && "$TORCH_PYTHON" -B -m unittest test_tune_dry) >"$log" 2>&1; then
    cat "$log"
    exit 1
  fi
  echo "tune-dry-run: $(tail -n 1 "$log")"
  rm -f "$log"
else
  echo "skipped: PyTorch glue CPU tests and the tuner's dry run (no torch + transformers for $TORCH_PYTHON;" \
    "test/torch/run.sh runs the glue tests on the GPU machine)"
fi
