#!/usr/bin/env bash
# Runs every GPU check of aotriton on a GPU machine, from the repo root:
#   test/gpu/run_all.sh            (OUT=/tmp/out by default; full logs go there)
# Needs what test/gpu/stage.sh put in .stage/ (the Rust test binary and the installed tree), the
# sources of test/gpu/cpp, test/gluon, test/torch and bench/, and on the machine: cmake, ninja
# (optional), g++, python3 with torch and triton, the CUDA driver. Builds the C++ test and the
# benchmark shim against .stage/install into $BUILD (default /tmp/aotriton-gpu-build), runs
#   0. the Gluon kernel checks (test/gluon/check_{fwd,bwd}.py through Triton's JIT: float64
#                             references, 100 repeated launches, then --consan: Gluon's
#                             concurrency sanitizer on every kernel shape family)
#   1. the Rust API test     (.stage/bin/aotriton-gpu-tests: forward + backward, >= 100 cases,
#                             dropout / bias / varlen / fp32 / deterministic / CUDA-graph cases,
#                             100-launch stability with a host-allocation count), once per
#                             backend forced (--backend portable, --backend gluon); then the
#                             crate's unit tests that need a GPU (.stage/bin/aotriton-unit-tests
#                             --ignored, each alone in its own process: one resets the context)
#   2. the C++ API test      (test/gpu/cpp, linked to .stage/install/lib/libaotriton.so), per backend;
#                             then the seed-compatible API (test/seed, -laotriton_v2) vs float64
#   3. the gradient check    (bench/grad_check.py: aotriton vs torch autograd in float64), per backend
#   4. the benchmark         (bench/bench_attn.py: the FlashAttention-3 grid, bf16 and fp16, beside
#                             torch SDPA's FA2 and cuDNN backends and FlexAttention, plus a GQA row;
#                             then the feature rows: dropout, bias, varlen)
#   5. the PyTorch tests     (test/torch/run.sh; TORCH=0 skips; BENCH=0 skips step 4)
#   6. the PyTorch benchmarks (bench/bench_torch.py: aotriton.torch with autograd vs SDPA's cuDNN
#                             and FA2, (B,H,S,D) and (B,S,H,D) inputs; bench/bench_decode.py: KV-cache
#                             decoding vs the same; needs steps 4 and 5 on; BENCH_TORCH_ARGS and
#                             BENCH_DECODE_ARGS add options, e.g. --quick)
# and, when asked (off by default; each adds its summary lines):
#   STRESS=1                 the stress modes of the Rust test binary after step 1, each its own
#                            process: --stress concurrency (64 threads x 8 streams, cold start,
#                            bitwise vs single-threaded runs), large (> 2^32-element tensors vs a
#                            float64 reference on slices), memory (10^5 calls, no host/device growth);
#                            about 5 min together. STRESS="large memory" runs the ones named;
#                            STRESS=multi-device (two GPUs: the concurrency mode over both devices
#                            of one process, one kernel load per device) is run only when named.
#   SANITIZE=1               test/gpu/sanitize.sh after those: compute-sanitizer memcheck, synccheck
#                            and racecheck over the suite's --quick list per backend (~8 min at most).
# BASE=0 skips steps 1-3 (with GLUON_CHECKS=0 BENCH=0 TORCH=0, only what STRESS / SANITIZE ask runs).
# On the device tool (600 s a call) even GLUON_CHECKS=0 BENCH=0 does not fit one call on an H200
# (2026-12-04: it was still in the torch suites at 600 s): run steps 1-3 (TORCH=0) and the torch
# suites (BASE=0, TORCH_SUITES a subset) in separate calls.
# keeps going when one part fails, prints a short summary last (pass/fail lines and the
# benchmark tables) and exits 1 if anything failed. Files in $OUT: <suite>-<backend>.log,
# gluon-*.log, bench_attn.log, bench_attn.json, torch-*.log, stress-<mode>.log, sanitize-<tool>.log,
# and build-<name>.log only for a failed build; at the end every *.log is packed into logs.tar.gz
# (the device tool brings back 8 files at most; PACK_LOGS=0 leaves them loose). BACKENDS (default "portable gluon") picks the
# backends; BENCH_ARGS adds options to bench_attn.py (e.g. BENCH_ARGS="--head-dims 128 --seqlens
# 4096 --dtypes bf16").
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
# The last argument is the backend (after --backend): logs are <api>-<backend>.
run_test() {
  local api=$1 rc backend=${*: -1}
  shift
  local tag=$api-$backend
  step "$api test (backend $backend)"
  "$@" --require-gpu --log "$OUT/$tag.log" >"$BUILD/$tag.out" 2>&1
  rc=$?
  [ -s "$OUT/$tag.log" ] || cp "$BUILD/$tag.out" "$OUT/$tag.log"
  [ $rc -eq 0 ] || failed=1
  note "[$backend] $(result_line "$api" "$BUILD/$tag.out" $rc)"
  grep -E "FAIL|panicked|error" "$BUILD/$tag.out" | grep -v PASS | head -n 20 | sed 's/^/    /' > "$BUILD/$tag.failures"
}

# The "<api>: N passed, M failed" line of a test's output, or a note that it did not finish.
result_line() {
  local api=$1 out=$2 rc=$3 line
  line=$(grep -E "^$api: [0-9]+ passed, [0-9]+ failed" "$out" | tail -n 1)
  if [ -n "$line" ]; then echo "$line"; else echo "$api: did not finish (exit $rc): $(tail -n 1 "$out")"; fi
}

rm -f "$OUT"/unit-tests.log "$OUT"/examples.log "$OUT"/seed-api.log "$OUT"/rust-api*.log "$OUT"/cpp-api*.log "$OUT"/grad-check*.log "$OUT"/gluon-*.log "$OUT"/bench_fwd.* \
  "$OUT"/bench_attn.* "$OUT"/bench_torch.* "$OUT"/bench_torch_varlen.* "$OUT"/bench_torch_dropout.* "$OUT"/bench_torch_dropout_gluon.* "$OUT"/bench_decode.* "$OUT"/build-*.log "$OUT"/stress-*.log "$OUT"/sanitize-*.log "$BUILD"/*.failures

# 0. The Gluon kernels through Triton's JIT on the product sources: numerics against float64
#    (check_fwd/check_bwd, incl. 100 repeated backward launches), then the mbarrier protocol of each
#    kernel shape family under Gluon's concurrency sanitizer (--consan). GLUON_CHECKS=0 skips,
#    GLUON_CHECKS=fwd / bwd runs one kernel family's checks, GLUON_CHECKS=varlen the packed-batch ones,
#    GLUON_CHECKS=dropout the dropout ones (the forward's mask bit for bit against the portable rule;
#    also the forward with Philox's rounds unrolled at hd128 (no spill with DROPOUT_ONE_LOOP 3, whose
#    rounds loop keeps 128 bytes of stack) and the backward with its rounds as a loop),
#    GLUON_CHECKS=dropout-bench their timings beside cuDNN's, alternating (the run-to-run spread is
#    about 5 %): the forward shipped / rounds unrolled, the backward shipped and with dQ from its own
#    kernel at hd64/128, rounds unrolled / as a loop, keep bits from the words / through a bool tile,
#    GLUON_CHECKS=dq those of attn_bwd_gluon_dq and its benchmark beside the portable dQ,
#    GLUON_CHECKS=gqa the GQA rows' benchmark with and without a head split.
checks=()
case ${GLUON_CHECKS:-1} in
  1) checks=("check_fwd" "check_fwd_varlen" "check_fwd_dropout" "check_bwd" "check_bwd --gluon-dq" "check_bwd_varlen"
              "check_bwd_dropout"
              "check_fwd --consan" "check_bwd --consan" "check_fwd_varlen --consan" "check_fwd_dropout --consan"
              "check_bwd_varlen --consan" "check_bwd_dropout --consan") ;;
  fwd) checks=("check_fwd" "check_fwd_varlen" "check_fwd_dropout" "check_fwd --consan" "check_fwd_varlen --consan"
               "check_fwd_dropout --consan") ;;
  bwd) checks=("check_bwd" "check_bwd_varlen" "check_bwd_dropout" "check_bwd --consan" "check_bwd_varlen --consan"
               "check_bwd_dropout --consan") ;;
  varlen) checks=("check_fwd_varlen" "check_bwd_varlen" "check_fwd_varlen --consan" "check_bwd_varlen --consan") ;;
  dropout) checks=("check_fwd_dropout" "check_bwd_dropout" "check_fwd_dropout --consan" "check_bwd_dropout --consan"
                   "check_fwd_dropout --rounds-loop 0" "check_bwd_dropout --rounds-loop 1") ;;
  dropout-bench) checks=("check_fwd_dropout --bench" "check_fwd_dropout --bench --rounds-loop 0"
                         "check_fwd_dropout --bench" "check_fwd_dropout --bench --rounds-loop 0"
                         "check_bwd_dropout --bench" "check_bwd_dropout --bench --rounds-loop 1"
                         "check_bwd_dropout --bench" "check_bwd_dropout --bench --signs-from-words 0") ;;
  # dQ in its own Gluon kernel (kernels/flash_gluon/bwd_dq.py, in the archive at hd256): checked with
  # its pairs (varlen, dropout and consan cases included), then timed beside the portable dQ.
  dq) checks=("check_bwd --gluon-dq" "check_bwd --portable-dq" "check_bwd_varlen" "check_bwd_dropout"
              "check_bwd --consan" "check_bwd --bench --gluon-dq"
              "check_bwd --bench --buckets 256 --gluon-dq 64:2:1") ;;  # hd256's other shape (40 B of spill)
  # The GQA rows with and without a head split (HEAD_SPLIT: the group's heads over N CTAs per key block).
  gqa) checks=("check_bwd --only head_split" "check_bwd --bench-gqa --head-split 2,4,7,8") ;;
esac
if [ ${#checks[@]} -gt 0 ]; then
  for check in "${checks[@]}"; do
    name=gluon-${check// --/-}
    name=${name//[ :]/-}  # "--rounds-loop 1" -> "-rounds-loop-1": plain file names come back from the device
    step "$name"
    # shellcheck disable=SC2086
    args=""
    case $check in *" "*) args=${check#* } ;; esac
    "$PYTHON" test/gluon/${check%% *}.py $args >"$OUT/$name.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || failed=1
    line=$(grep -E "^(check_fwd|check_bwd|consan)[^:]*: " "$OUT/$name.log" | tail -n 1)
    note "$name: ${line:-did not finish (exit $rc): $(tail -n 1 "$OUT/$name.log")}"
  done
fi

# 1. Rust API test, per backend (forced)
if [ "${BASE:-1}" = 1 ]; then
  for backend in ${BACKENDS:-portable gluon}; do
    run_test rust-api "$STAGE/bin/aotriton-gpu-tests" --backend "$backend"
  done
fi

# 1a. The crate's `#[ignore]`d unit tests, which need the driver and a GPU, one process each.
if [ "${BASE:-1}" = 1 ]; then
  # (Only the driver's: the other ignored tests are helpers that tests start in child processes.)
  for test in $("$STAGE/bin/aotriton-unit-tests" --list --ignored 2>/dev/null | sed -n 's/^\(driver::.*\): test$/\1/p'); do
    step "unit test $test"
    out=$BUILD/unit-$test.out
    "$STAGE/bin/aotriton-unit-tests" --ignored --exact "$test" --nocapture >"$out" 2>&1
    rc=$?
    cat "$out" >>"$OUT/unit-tests.log"
    [ $rc -eq 0 ] || failed=1
    # Each test prints what it measured (or "skipped: ...") on stderr; keep its last such line.
    detail=$(grep -vE "^(running|test |$|test result|successes|failures)" "$out" | tail -n 1 | cut -c1-300)
    note "unit $test: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)")${detail:+  ($detail)}"
  done
fi

# 1a'. The crate's examples and aotriton-info (runtime-only builds reading .stage/images, checked
#     against its digest manifest), run as a user runs them: each must exit 0.
if [ "${BASE:-1}" = 1 ] && [ -d "$STAGE/bin/examples" ]; then
  for exe in "$STAGE"/bin/examples/*; do
    name=$(basename "$exe")
    step "example $name"
    AOTRITON_IMAGE_DIR=$STAGE/images "$exe" >"$BUILD/example-$name.out" 2>&1
    rc=$?
    { echo "== $name (exit $rc)"; cat "$BUILD/example-$name.out"; } >>"$OUT/examples.log"
    [ $rc -eq 0 ] || failed=1
    note "example $name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)")  ($(grep -v '^$' "$BUILD/example-$name.out" | tail -n 1 | cut -c1-200))"
  done
fi

# 1b. Stress modes (STRESS=1: all three; or a list of them), each in its own process: the
#     concurrency mode needs a process that has loaded no kernel yet.
stress_modes=${STRESS:-0}
[ "$stress_modes" = 1 ] && stress_modes="concurrency large memory"
[ "$stress_modes" = 0 ] && stress_modes=""
for mode in $stress_modes; do
  step "stress $mode"
  out=$BUILD/stress-$mode.out
  "$STAGE/bin/aotriton-gpu-tests" --stress "$mode" --require-gpu --log "$OUT/stress-$mode.log" >"$out" 2>&1
  rc=$?
  [ -s "$OUT/stress-$mode.log" ] || cp "$out" "$OUT/stress-$mode.log"
  [ $rc -eq 0 ] || failed=1
  note "$(result_line "stress-$mode" "$out" $rc)"
  while IFS= read -r line; do note "    $line"; done < <(grep -E "FAIL|panicked" "$out" | head -n 10 | cut -c1-600)
done

# 1c. compute-sanitizer over the --quick suite (SANITIZE=1).
if [ "${SANITIZE:-0}" = 1 ]; then
  step "compute-sanitizer"
  out=$BUILD/sanitize.out
  OUT=$OUT BIN=$STAGE/bin/aotriton-gpu-tests BACKENDS="${BACKENDS:-portable gluon}" PYTHON=$PYTHON \
    test/gpu/sanitize.sh >"$out" 2>&1
  rc=$?
  [ $rc -eq 0 ] || failed=1
  while IFS= read -r line; do note "$line"; done < <(grep -E "^(sanitize|compute-sanitizer)|^    " "$out")
  grep -qE "^sanitize: " "$out" || note "sanitize: did not finish (exit $rc): $(tail -n 1 "$out")"
fi

# 2. C++ API test, per backend (forced)
if [ "${BASE:-1}" = 1 ]; then
  if build cpp test/gpu/cpp; then
    for backend in ${BACKENDS:-portable gluon}; do
      run_test cpp-api "$BUILD/cpp/aotriton_gpu_test_cpp" --backend "$backend"
    done
  else
    failed=1
    note "cpp-api: build failed (see $OUT/build-cpp.log)"
  fi
fi

# 2b. The seed-compatible API (ROCm/aotriton's v2/v3 functions) on CUDA against float64:
#     test/seed/seed_api.cpp built against the staged install as the seed's consumers link it.
if [ "${BASE:-1}" = 1 ]; then
  step "seed API"
  if cmake -S test/seed -B "$BUILD/seed" "${generator[@]}" -DAOTRITON_PREFIX="$PREFIX" >"$BUILD/build-seed.log" 2>&1 \
     && cmake --build "$BUILD/seed" >>"$BUILD/build-seed.log" 2>&1; then
    "$BUILD/seed/seed_api" --require-gpu >"$OUT/seed-api.log" 2>&1 || failed=1
    note "seed-api: $(tail -n 1 "$OUT/seed-api.log")"
    while IFS= read -r line; do note "    $line"; done < <(grep -E "FAIL" "$OUT/seed-api.log" | head -n 10 | cut -c1-300)
  else
    failed=1
    cp "$BUILD/build-seed.log" "$OUT/build-seed.log"
    note "seed-api: build failed (see $OUT/build-seed.log)"
  fi
fi

# 3. Gradient check and 4. benchmark, both through the shim.
bench_ok=0
SHIM=$BUILD/bench/libaotriton_shim.so
if [ "${BASE:-1}" != 1 ] && [ "${BENCH:-1}" != 1 ]; then
  :  # neither needs the shim
elif build bench bench; then
  if [ "${BASE:-1}" = 1 ]; then
  for backend in ${BACKENDS:-portable gluon}; do
    step "grad check (backend $backend)"
    log=$OUT/grad-check-$backend.log
    "$PYTHON" bench/grad_check.py --shim "$SHIM" --backend "$backend" >"$log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || failed=1
    note "[$backend] $(result_line grad-check "$log" $rc)"
    grep -E "FAIL|Error" "$log" | head -n 20 | sed 's/^/    /' > "$BUILD/grad-check-$backend.failures"
  done
  fi

  if [ "${BENCH:-1}" = 1 ]; then
  step "benchmark"
  # shellcheck disable=SC2086
  "$PYTHON" bench/bench_attn.py --shim "$SHIM" --json "$OUT/bench_attn.json" ${BENCH_ARGS:-} \
    >"$OUT/bench_attn.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then bench_ok=1; else failed=1; fi
  note "bench: exit $rc (full log $OUT/bench_attn.log, numbers $OUT/bench_attn.json)"
  fi
else
  failed=1
  [ "${BASE:-1}" = 1 ] && note "grad-check: not run (shim build failed, see $OUT/build-bench.log)"
  [ "${BENCH:-1}" = 1 ] && note "bench: shim build failed (see $OUT/build-bench.log)"
fi

# 5. PyTorch integration (its own summary is folded into ours).
if [ "${TORCH:-1}" = 1 ]; then
  step "torch tests"
  OUT=$OUT PYTHON=$PYTHON test/torch/run.sh "$PREFIX" >"$BUILD/torch.out" 2>&1
  [ $? -eq 0 ] || failed=1
  while IFS= read -r line; do note "$line"; done < <(sed -n '/^================ torch summary/,$p' "$BUILD/torch.out" | tail -n +3)
fi

# 6. The benchmarks through the PyTorch binding built by step 5: bench/<name>.py, its options in
# the variable named by the third argument (then a fourth argument's options, if any), its log and
# JSON in $OUT/<out>.{log,json} (<out>: the fifth argument, else <name>).
torch_bench() {
  local name=$1 title=$2 options="${!3:-} ${4:-}" out=${5:-$1}
  step "$title"
  # shellcheck disable=SC2086
  PYTHONPATH="$ROOT/bindings/torch/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "bench/$name.py" \
    --json "$OUT/$out.json" $options >"$OUT/$out.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || failed=1
  note "${out//_/-}: exit $rc (full log $OUT/$out.log)"
}
if [ "${TORCH:-1}" = 1 ] && [ "${BENCH:-1}" = 1 ]; then
  torch_bench bench_torch "torch benchmark" BENCH_TORCH_ARGS
  # The packed batch (flash_attn_varlen) beside the fixed-length call and torch's varlen_attn.
  torch_bench bench_torch "torch varlen benchmark" BENCH_TORCH_VARLEN_ARGS --varlen bench_torch_varlen
  # Dropout 0.1 through the binding (torch's rng_state layout) beside SDPA's cuDNN and FA2 with dropout.
  torch_bench bench_torch "torch dropout benchmark" BENCH_TORCH_DROPOUT_ARGS "--dropout 0.1 --quick" bench_torch_dropout
  # The same with the Gluon dropout kernels forced (Auto leaves a windowed dropout forward to the
  # portable ones: these figures decide it). A variable before a function call reaches its commands.
  AOTRITON_BACKEND=gluon torch_bench bench_torch "torch dropout benchmark, Gluon forced" BENCH_TORCH_DROPOUT_ARGS \
    "--dropout 0.1 --quick" bench_torch_dropout_gluon
  # KV-cache decoding (flash_attn_with_kvcache) beside SDPA's FA2 and cuDNN.
  torch_bench bench_decode "decode benchmark" BENCH_DECODE_ARGS
fi

echo
echo "================ summary (logs in $OUT) ================"
echo "$gpu"
for line in "${summary[@]}"; do
  echo "$line"
  case $line in
    "["*"] "*)
      b=${line#[}; b=${b%%]*}; n=${line#*] }; n=${n%%:*}
      cat "$BUILD/$n-$b.failures" 2>/dev/null ;;
  esac
done
if [ -f "$OUT/bench_attn.log" ]; then
  # Shapes whose aotriton outputs were wrong or that failed, then the tables (from the first title on).
  grep -E "WRONG|Error|error" "$OUT/bench_attn.log" | head -n 20
  sed -n '/^forward, \|^backward, /,$p' "$OUT/bench_attn.log"
  [ $bench_ok -eq 1 ] || tail -n 15 "$OUT/bench_attn.log"
fi
if [ -f "$OUT/bench_torch.log" ]; then
  sed -n '/^torch /,$p' "$OUT/bench_torch.log" | tail -n 40
fi
if [ -f "$OUT/bench_torch_dropout.log" ]; then
  sed -n '/^torch /,$p' "$OUT/bench_torch_dropout.log" | tail -n 12
fi
if [ -f "$OUT/bench_torch_varlen.log" ]; then
  sed -n '/^packed batch/,$p' "$OUT/bench_torch_varlen.log" | tail -n 20
fi
if [ -f "$OUT/bench_decode.log" ]; then
  sed -n '/^device copy/,$p' "$OUT/bench_decode.log" | tail -n 70
fi
echo "overall: $([ $failed -eq 0 ] && echo PASS || echo FAIL)"
if [ "${PACK_LOGS:-1}" = 1 ] && ls "$OUT"/*.log >/dev/null 2>&1; then
  (cd "$OUT" && tar -czf logs.tar.gz ./*.log && rm -f ./*.log)
fi
exit $failed
