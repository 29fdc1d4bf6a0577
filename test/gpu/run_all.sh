#!/usr/bin/env bash
# Runs every GPU check of aotriton on a GPU machine, from the repo root:
#   test/gpu/run_all.sh            (OUT=/tmp/out by default; full logs go there)
# Needs what test/gpu/stage.sh put in .stage/ (the Rust test binary and the installed tree), the
# sources of test/gpu/cpp and bench/, and on the machine: cmake, ninja (optional), g++, python3
# with torch and triton, the CUDA driver. Builds the C++ test and the benchmark shim against
# .stage/install into $BUILD (default /tmp/aotriton-gpu-build), runs
#   1. the Rust API test     (.stage/bin/aotriton-gpu-tests: forward + backward, >= 100 cases, then
#                             dropout / bias / varlen / fp32 / deterministic / CUDA-graph cases)
#   2. the C++ API test      (test/gpu/cpp, linked to .stage/install/lib/libaotriton.so)
#   3. the gradient check    (bench/grad_check.py: aotriton vs torch autograd in float64, incl.
#                             dropout, broadcast bias + dBias, packed batches)
#   4. the benchmark         (bench/bench_attn.py: forward and backward beside torch SDPA, then the
#                             feature rows: dropout, bias, varlen; BENCH_ARGS="--features ''" skips them)
# keeps going when one part fails, prints a short summary last (pass/fail lines and both
# benchmark tables) and exits 1 if anything failed. Files in $OUT: rust-api.log, cpp-api.log,
# grad-check.log, bench_attn.log, bench_attn.json, and build-<name>.log only for a failed build.
# BENCH_ARGS adds options to bench_attn.py (e.g. BENCH_ARGS="--head-dims 128 --seqlens 4096").
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
STAGE=$ROOT/.stage
PREFIX=$STAGE/install
OUT=${OUT:-/tmp/out}
BUILD=${BUILD:-/tmp/aotriton-gpu-build}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT" "$BUILD"

failed=0
declare -a summary
note() { summary+=("$1"); }
step() { echo "== $* ($(date +%T))"; }

if [ ! -x "$STAGE/bin/aotriton-gpu-tests" ] || [ ! -d "$PREFIX/lib/cmake/aotriton" ]; then
  echo "missing .stage/bin/aotriton-gpu-tests or .stage/install: run test/gpu/stage.sh on the build machine" >&2
  exit 1
fi
export LD_LIBRARY_PATH="$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)

# Configure + build one CMake project against the staged install; $1 name, $2 source dir.
# The build log lands in $OUT only when the build fails.
build() {
  local name=$1 src=$2 log=$BUILD/build-$1.log
  step "build $name"
  if cmake -S "$src" -B "$BUILD/$name" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_PREFIX_PATH="$PREFIX" >"$log" 2>&1 && cmake --build "$BUILD/$name" >>"$log" 2>&1; then
    return 0
  fi
  cp "$log" "$OUT/"
  tail -n 30 "$log"
  return 1
}

# Runs a test binary: its output goes to $BUILD/<api>.out (and, through --log, the per-case log
# to $OUT/<api>.log; when the program died before writing it, its raw output goes there instead).
run_test() {
  local api=$1 rc
  shift
  step "$api test"
  "$@" --require-gpu --log "$OUT/$api.log" >"$BUILD/$api.out" 2>&1
  rc=$?
  [ -s "$OUT/$api.log" ] || cp "$BUILD/$api.out" "$OUT/$api.log"
  [ $rc -eq 0 ] || failed=1
  note "$(result_line "$api" "$BUILD/$api.out" $rc)"
  grep -E "FAIL|panicked|error" "$BUILD/$api.out" | grep -v PASS | head -n 20 | sed 's/^/    /' > "$BUILD/$api.failures"
}

# The "<api>: N passed, M failed" line of a test's output, or a note that it did not finish.
result_line() {
  local api=$1 out=$2 rc=$3 line
  line=$(grep -E "^$api: [0-9]+ passed, [0-9]+ failed" "$out" | tail -n 1)
  if [ -n "$line" ]; then echo "$line"; else echo "$api: did not finish (exit $rc): $(tail -n 1 "$out")"; fi
}

rm -f "$OUT"/rust-api.log "$OUT"/cpp-api.log "$OUT"/grad-check.log "$OUT"/bench_fwd.* "$OUT"/bench_attn.* \
  "$OUT"/build-*.log "$BUILD"/*.failures

# 1. Rust API test
run_test rust-api "$STAGE/bin/aotriton-gpu-tests"

# 2. C++ API test
if build cpp test/gpu/cpp; then
  run_test cpp-api "$BUILD/cpp/aotriton_gpu_test_cpp"
else
  failed=1
  note "cpp-api: build failed (see $OUT/build-cpp.log)"
fi

# 3. Gradient check and 4. benchmark, both through the shim.
bench_ok=0
SHIM=$BUILD/bench/libaotriton_shim.so
if build bench bench; then
  step "grad check"
  "$PYTHON" bench/grad_check.py --shim "$SHIM" >"$OUT/grad-check.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || failed=1
  note "$(result_line grad-check "$OUT/grad-check.log" $rc)"
  grep -E "FAIL|Error" "$OUT/grad-check.log" | head -n 20 | sed 's/^/    /' > "$BUILD/grad-check.failures"

  step "benchmark"
  # shellcheck disable=SC2086
  "$PYTHON" bench/bench_attn.py --shim "$SHIM" --json "$OUT/bench_attn.json" ${BENCH_ARGS:-} \
    >"$OUT/bench_attn.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then bench_ok=1; else failed=1; fi
  note "bench: exit $rc (full log $OUT/bench_attn.log, numbers $OUT/bench_attn.json)"
else
  failed=1
  note "grad-check: not run (shim build failed, see $OUT/build-bench.log)"
  note "bench: shim build failed (see $OUT/build-bench.log)"
fi

echo
echo "================ summary (logs in $OUT) ================"
echo "$gpu"
for line in "${summary[@]}"; do
  echo "$line"
  case $line in
    rust-api:*) cat "$BUILD/rust-api.failures" 2>/dev/null ;;
    cpp-api:*) cat "$BUILD/cpp-api.failures" 2>/dev/null ;;
    grad-check:*) cat "$BUILD/grad-check.failures" 2>/dev/null ;;
  esac
done
if [ -f "$OUT/bench_attn.log" ]; then
  # Shapes whose aotriton outputs were wrong or that failed, then the tables (from the first title on).
  grep -E "WRONG|Error|error" "$OUT/bench_attn.log" | head -n 20
  sed -n '/^forward, \|^backward, /,$p' "$OUT/bench_attn.log"
  [ $bench_ok -eq 1 ] || tail -n 15 "$OUT/bench_attn.log"
fi
echo "overall: $([ $failed -eq 0 ] && echo PASS || echo FAIL)"
exit $failed
