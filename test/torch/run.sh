#!/usr/bin/env bash
# The PyTorch-integration tests, on a GPU machine, from anywhere in the repo:
#   test/torch/run.sh [PREFIX]        PREFIX: installed aotriton (default .stage/install)
# Env: OUT (logs, default /tmp/out), PYTHON (default python3), BUILD (scratch, default
# /tmp/aotriton-torch-build), LLAMA_ARGS (extra options for test_llama.py), TORCH_SUITES (a subset
# of the name:backend runs below, e.g. "registered:auto ops:gluon"; default all).
# Builds bindings/torch against PREFIX, then runs test_ops.py, test_graph.py, test_llama.py (forced
# portable backend, then the default dispatch, then forced onto Gluon), test_registered.py,
# test_flash_attn_compat.py and test_flash_impl_plumbing.py (default dispatch) and the README's C++
# consumer example; keeps going when one fails; logs go to $OUT/torch-*.log; prints a summary
# last and exits 1 if anything failed.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
PREFIX=${1:-${AOTRITON_PREFIX:-$ROOT/.stage/install}}
PREFIX=$(cd "$PREFIX" 2>/dev/null && pwd) || { echo "run.sh: no install prefix at ${1:-.stage/install}" >&2; exit 1; }
OUT=${OUT:-/tmp/out}
PYTHON=${PYTHON:-python3}
BUILD=${BUILD:-/tmp/aotriton-torch-build}
mkdir -p "$OUT" "$BUILD"
failed=0
declare -a summary
step() { echo "== $* ($(date +%T))"; }

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 1)
versions=$("$PYTHON" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n 1)

step "build the extension against $PREFIX"
if "$PYTHON" bindings/torch/build.py --prefix "$PREFIX" >"$OUT/torch-build.log" 2>&1; then
  summary+=("torch-build: ok")
else
  tail -n 40 "$OUT/torch-build.log"
  echo "torch-build: FAILED (see $OUT/torch-build.log)"
  exit 1
fi
# The wheel users install (bindings/torch/setup.py: libaotriton beside the extension, $ORIGIN
# rpath), installed into this python; the suites marked "wheel" below run on it, with neither
# PYTHONPATH (but for the tests' own helpers) nor LD_LIBRARY_PATH.
step "build and install the wheel"
rm -rf "$BUILD/wheel"
if AOTRITON_PREFIX="$PREFIX" "$PYTHON" -m pip wheel --no-build-isolation --no-deps bindings/torch -w "$BUILD/wheel" \
     >"$OUT/torch-wheel.log" 2>&1 &&
   "$PYTHON" -m pip install --no-deps --force-reinstall "$BUILD"/wheel/*.whl >>"$OUT/torch-wheel.log" 2>&1 &&
   (cd /tmp && env -u PYTHONPATH -u LD_LIBRARY_PATH "$PYTHON" -c \
     'import aotriton.torch as t, sys; print("installed", t.__file__, t.version()); sys.exit(0 if t.is_available() else 1)') \
     >>"$OUT/torch-wheel.log" 2>&1; then
  summary+=("torch-wheel: ok ($(basename "$BUILD"/wheel/*.whl), $(du -h "$BUILD"/wheel/*.whl | cut -f1); $(grep '^installed' "$OUT/torch-wheel.log"))")
else
  failed=1
  summary+=("torch-wheel: FAILED (see $OUT/torch-wheel.log)")
fi
TREE_PYTHONPATH="$ROOT/bindings/torch/python:$ROOT/test/torch${PYTHONPATH:+:$PYTHONPATH}"
TREE_LD_LIBRARY_PATH="$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# Each suite on the forced portable backend, then with the default dispatch (on an H200: the Gluon
# kernels wherever they apply), then forced onto Gluon: test_ops.py and test_graph.py run the cases
# Gluon serves as usual and check that the others are refused (kUnsupportedByBackend; harness.py's
# gluon_refusal is the rule); every call of the Llama model is one Gluon serves, so a refusal would
# fail it.
# Then, with the default dispatch only: torch's registered flash-attention path (test_registered.py),
# the FlashAttention-2-compatible functions (test_flash_attn_compat.py), a sliding-window Mistral
# (test_mistral.py), and on the CPU with float64 stand-ins for the kernels the plumbing of the
# registration (test_flash_impl_plumbing.py), of the transformers glue (test_hf_plumbing.py), of the
# KV-cache decode API (test_kvcache_plumbing.py) and of torch's context parallel over two gloo ranks
# (test_context_parallel_cpu.py).
ALL_SUITES="ops:portable graph:portable llama:portable ops:auto graph:auto llama:auto ops:gluon graph:gluon llama:gluon
            registered:auto flash_attn_compat:auto mistral:auto flash_impl_plumbing:auto hf_plumbing:auto
            kvcache_plumbing:auto context_parallel_cpu:auto"
for run in ${TORCH_SUITES:-$ALL_SUITES}; do
  name=${run%%:*} backend=${run#*:}
  step "test_$name.py (backend $backend)"
  args=()
  case $name in llama|mistral) args=(${LLAMA_ARGS:-}) ;; esac
  log=$OUT/torch-$name-$backend.log
  case $name in
    registered|flash_attn_compat|mistral)  # on the installed wheel
      env -u LD_LIBRARY_PATH PYTHONPATH="$ROOT/test/torch" AOTRITON_BACKEND=$backend \
        "$PYTHON" "test/torch/test_$name.py" "${args[@]}" >"$log" 2>&1 ;;
    *)
      PYTHONPATH=$TREE_PYTHONPATH LD_LIBRARY_PATH=$TREE_LD_LIBRARY_PATH AOTRITON_BACKEND=$backend \
        "$PYTHON" "test/torch/test_$name.py" "${args[@]}" >"$log" 2>&1 ;;
  esac
  rc=$?
  [ $rc -eq 0 ] || failed=1
  line=$(grep -E "^torch-$name: [0-9]+ passed, [0-9]+ failed" "$log" | tail -n 1)
  [ -n "$line" ] || line="torch-$name: did not finish (exit $rc): $(tail -n 1 "$log")"
  summary+=("[$backend] $line")
  grep -E "^FAIL" "$log" | head -n 15 | while read -r l; do echo "    $l"; done >"$BUILD/$name-$backend.failures"
done

# torch's context parallelism over NCCL with the registered kernels (test_context_parallel.py), a
# torchrun program: two ranks on a machine with two GPUs or more, else one (the same code path).
# TORCH_CP=0 skips it; CP_ARGS adds options (--bench). NCCL's NVLink multicast stays off.
if [ "${TORCH_CP:-1}" != 0 ]; then
  step "test_context_parallel.py (torchrun)"
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  ranks=$(( gpus >= 2 ? 2 : 1 ))
  log=$OUT/torch-context_parallel-auto.log
  # A collective that never completes would hang the whole run: bounded (CP_TIMEOUT seconds).
  PYTHONPATH=$TREE_PYTHONPATH LD_LIBRARY_PATH=$TREE_LD_LIBRARY_PATH NCCL_NVLS_ENABLE=0 \
    timeout "${CP_TIMEOUT:-300}" "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node=$ranks \
    test/torch/test_context_parallel.py ${CP_ARGS:-} >"$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || failed=1
  line=$(grep -E "^torch-context_parallel: [0-9]+ passed, [0-9]+ failed" "$log" | tail -n 1)
  [ -n "$line" ] || line="torch-context_parallel: did not finish (exit $rc): $(tail -n 1 "$log")"
  summary+=("[auto, $ranks GPU] $line")
  # Its failed cases and, when one raised, the exception's last line (ranks print tracebacks).
  grep -E "^FAIL" "$log" | head -n 10 | sed 's/^/    /' >"$BUILD/context_parallel-auto, $ranks GPU.failures"
  grep -E "^[A-Za-z_.]*(Error|Exception): " "$log" | sort -u | head -n 3 | cut -c1-300 | sed 's/^/    /' \
    >>"$BUILD/context_parallel-auto, $ranks GPU.failures"
fi

# The README's C++ consumer example (its ```cmake and ```cpp blocks, verbatim).
step "C++ consumer example from README.md"
ex=$BUILD/cpp_example
rm -rf "$ex" && mkdir -p "$ex"
"$PYTHON" - "$ROOT/README.md" "$ex" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
open(sys.argv[2] + "/CMakeLists.txt", "w").write(re.search(r"```cmake\n(.*?)```", text, re.S).group(1))
open(sys.argv[2] + "/main.cpp", "w").write(re.search(r"```cpp\n(.*?)```", text, re.S).group(1))
EOF
log=$OUT/torch-cpp-example.log
if ! command -v cmake >/dev/null 2>&1; then
  summary+=("torch-cpp-example: skipped (no cmake)")
elif cmake -S "$ex" -B "$ex/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" >"$log" 2>&1 \
     && cmake --build "$ex/build" >>"$log" 2>&1; then
  if LD_LIBRARY_PATH=$TREE_LD_LIBRARY_PATH "$ex/build/example" >>"$log" 2>&1; then
    summary+=("torch-cpp-example: 1 passed, 0 failed")
  else
    failed=1
    summary+=("torch-cpp-example: 0 passed, 1 failed ($(tail -n 1 "$log"))")
  fi
elif grep -q "CUDAToolkit" "$log"; then
  summary+=("torch-cpp-example: skipped (no CUDA toolkit for cudart; see $log)")
else
  failed=1
  summary+=("torch-cpp-example: build failed (see $log)")
fi

echo
echo "================ torch summary (logs in $OUT) ================"
echo "$gpu | $versions"
for line in "${summary[@]}"; do
  echo "$line"
  case $line in
    "["*"] torch-"*)
      b=${line#[}; b=${b%%]*}; n=${line#*torch-}; n=${n%%:*}
      cat "$BUILD/$n-$b.failures" 2>/dev/null ;;
  esac
done
for b in portable auto gluon; do
  grep -E "worst tensor" "$OUT/torch-llama-$b.log" 2>/dev/null | sed "s/^/[$b] llama /"
done
grep -E "worst tensor" "$OUT/torch-mistral-auto.log" 2>/dev/null | sed "s/^/[auto] mistral /"
echo "torch overall: $([ $failed -eq 0 ] && echo PASS || echo FAIL)"
exit $failed
