#!/usr/bin/env bash
# compute-sanitizer over the Rust GPU suite, on the GPU machine, from anywhere in the repo:
#   test/gpu/sanitize.sh
# Runs .stage/bin/aotriton-gpu-tests --quick (a reduced case list: every head-dim bucket, layout,
# mask kind and feature, small sizes; `aotriton-gpu-tests --list --quick` prints it) under each
# tool (memcheck, synccheck, racecheck: that order, the slowest last) with each backend forced
# (portable, gluon). A run is clean when the tool reports no error or hazard AND the suite itself
# passes. Logs: $OUT/sanitize-<tool>.log (both backends' runs appended: tool and test output
# together). Prints one line per run, then `sanitize: N passed, M failed` last (what run_all.sh
# picks up); exits 1 if a run was not clean, 0 otherwise.
#   OUT            log directory (default /tmp/out)
#   BIN            the test binary (default .stage/bin/aotriton-gpu-tests)
#   TOOLS          default "memcheck synccheck racecheck"
#   BACKENDS       default "portable gluon"
#   RUN_LIMIT      seconds per run (default 200); a run past it counts as failed ("timed out")
#   BUDGET         seconds for the whole script (default 540): runs that would start later than
#                  BUDGET - 30 s are not started and count as failed ("not run: time budget")
#   COMPUTE_SANITIZER  the tool's path, if it is not found by itself
#   CUBINS         the Gluon kernels' cubins for racecheck_triage.py (default .stage/gluon-cubins)
# racecheck on the Gluon backend: the tool reports Triton's warp_specialize hand-off (see
# test/gpu/racecheck_triage.py); such a run is clean when every report is that hand-off in the
# SASS of the kernels that ran, every report was printed, and the suite passed.
# compute-sanitizer is looked for on PATH, under /usr/local/cuda*/ and /opt/nvidia, and in the
# nvidia pip packages of python3 (nvidia-cuda-sanitizer-api). Without it the script prints
# `sanitize: skipped: compute-sanitizer not found` and exits 0.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
BIN=${BIN:-.stage/bin/aotriton-gpu-tests}
TOOLS=${TOOLS:-memcheck synccheck racecheck}
BACKENDS=${BACKENDS:-portable gluon}
RUN_LIMIT=${RUN_LIMIT:-200}
BUDGET=${BUDGET:-540}
PYTHON=${PYTHON:-python3}
CUBINS=${CUBINS:-.stage/gluon-cubins}
PRINT_LIMIT=100000
mkdir -p "$OUT"
started=$(date +%s)

find_sanitizer() {
  local c d
  if [ -n "${COMPUTE_SANITIZER:-}" ] && [ -x "$COMPUTE_SANITIZER" ]; then echo "$COMPUTE_SANITIZER"; return 0; fi
  c=$(command -v compute-sanitizer 2>/dev/null) && { echo "$c"; return 0; }
  for c in /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer \
           /opt/nvidia/compute-sanitizer/compute-sanitizer /opt/nvidia/*/compute-sanitizer/compute-sanitizer; do
    [ -x "$c" ] && { echo "$c"; return 0; }
  done
  # pip: nvidia-cuda-sanitizer-api puts it under the nvidia namespace package.
  while IFS= read -r d; do
    [ -d "$d" ] || continue
    c=$(find "$d" -maxdepth 4 -type f -name compute-sanitizer -perm -u+x 2>/dev/null | head -n 1)
    [ -n "$c" ] && { echo "$c"; return 0; }
  done < <("$PYTHON" -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
  return 1
}

if [ ! -x "$BIN" ]; then
  echo "sanitize: did not finish: no test binary at $BIN (run test/gpu/stage.sh on the build machine)"
  exit 1
fi
if ! SAN=$(find_sanitizer); then
  echo "sanitize: skipped: compute-sanitizer not found"
  exit 0
fi
echo "compute-sanitizer: $SAN ($("$SAN" --version 2>&1 | grep -m1 -i version))"

passed=0
failed=0
for tool in $TOOLS; do
  log=$OUT/sanitize-$tool.log
  : >"$log"
  for backend in $BACKENDS; do
    now=$(date +%s)
    left=$((BUDGET - (now - started)))
    if [ "$left" -lt 30 ]; then
      echo "sanitize-$tool [$backend]: not run: time budget (${BUDGET} s) spent"
      failed=$((failed + 1))
      continue
    fi
    limit=$((left < RUN_LIMIT ? left : RUN_LIMIT))
    echo "== $tool, backend $backend (limit ${limit} s)" >>"$log"
    t0=$(date +%s)
    # --error-exitcode: a tool finding tells itself apart from a failing test (exit 1).
    # Every report printed (racecheck's are triaged one by one below).
    timeout -k 10 "$limit" "$SAN" --tool "$tool" --error-exitcode 86 --print-limit "$PRINT_LIMIT" \
      "$BIN" --quick --require-gpu --backend "$backend" >>"$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    # The tool's own summary: "ERROR SUMMARY: N errors" (memcheck, synccheck) or
    # "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)".
    section=$(sed -n "/^== $tool, backend $backend /,\$p" "$log")
    tool_line=$(grep -E "(ERROR|RACECHECK) SUMMARY" <<<"$section" | tail -n 1)
    tool_line=${tool_line#========= }
    test_line=$(grep -E "^rust-api: [0-9]+ passed, [0-9]+ failed" <<<"$section" | tail -n 1)
    case $rc in
      0) verdict=clean ;;
      86) verdict="tool found errors" ;;
      1) verdict="the suite failed" ;;
      124|137) verdict="timed out after ${limit} s" ;;
      2) verdict="no GPU" ;;
      *) verdict="exit $rc" ;;
    esac
    if [ $rc -eq 86 ] && [ "$tool" = racecheck ] && [ "$backend" = gluon ]; then
      # All reports printed (fewer displayed than the print limit, each one read), each one the
      # warp_specialize hand-off in the SASS of the kernels that ran.
      shown=$(grep -oE "RACECHECK SUMMARY: [0-9]+ hazards? displayed" <<<"$tool_line" | grep -oE "[0-9]+")
      blocks=$(grep -c "Race reported between" <<<"$section")
      "$PYTHON" test/gpu/racecheck_triage.py <(echo "$section") --cubins "$CUBINS" >"$OUT/racecheck-triage.log" 2>&1
      triage_rc=$?
      triage_line=$(tail -n 1 "$OUT/racecheck-triage.log")
      if [ $triage_rc -eq 0 ] && [ "${shown:-x}" = "$blocks" ] && [ "$shown" -lt "$PRINT_LIMIT" ]; then
        rc=0
        verdict="clean outside Triton's warp_specialize hand-off ($triage_line)"
      else
        verdict="tool found errors ($triage_line; $blocks of ${shown:-?} reports read)"
      fi
    fi
    # Clean only with the tool's summary present and the suite's own line showing 0 failed.
    if [ $rc -eq 0 ] && [ -n "$tool_line" ] && [[ $test_line == *" 0 failed" ]]; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      [ $rc -eq 0 ] && verdict="no tool summary or no test result line"
    fi
    echo "sanitize-$tool [$backend]: $verdict in ${secs} s; ${tool_line:-no tool summary};" \
      "${test_line:-no rust-api result line}"
    if [[ $verdict != clean* ]]; then
      # The tool's first findings and the suite's failures, for the summary.
      grep -E "^========= +(Invalid|Error|Race|Barrier|Program hit|Uninitialized|Misaligned|Out-of-range|Warning)|FAIL" \
        <<<"$section" | head -n 8 | sed 's/^/    /'
    fi
  done
done
# racecheck's reports on the Gluon kernels all fall on the shared memory that Triton's
# warp_specialize lowering uses to start its worker warps (README, "Stress and sanitizers"). The
# probe is a Gluon kernel with warp_specialize and no shared memory of its own (as is, and after an
# mbarrier init and a barrier of the parent region's warps, as the attention kernels start), and
# its control without: whatever racecheck reports on them is about that start-up code.
if [[ " $TOOLS " == *" racecheck "* ]] && [[ " $BACKENDS " == *" gluon "* ]]; then
  log=$OUT/sanitize-racecheck.log
  for variant in warp_specialize mbarrier plain; do
    flag=; [ $variant != warp_specialize ] && flag=--$variant
    echo "== racecheck, probe $variant" >>"$log"
    timeout -k 10 120 "$SAN" --tool racecheck --print-limit 20 "$PYTHON" test/gluon/ws_racecheck_probe.py $flag >>"$log" 2>&1
    section=$(sed -n "/^== racecheck, probe $variant\$/,\$p" "$log")
    tool_line=$(grep -E "RACECHECK SUMMARY" <<<"$section" | tail -n 1)
    run_line=$(grep -E "^ws_racecheck_probe: " <<<"$section" | tail -n 1)
    echo "sanitize-racecheck [probe: $variant]: ${tool_line#========= }; ${run_line:-the probe did not finish}"
    grep -E "^========= +(Error|Warning|  and)" <<<"$section" | head -n 4 | sed 's/^/    /'
  done
fi
echo "sanitize: $passed passed, $failed failed"
[ $failed -eq 0 ]
