#!/usr/bin/env bash
# Runs the libFuzzer harnesses; `ninja fuzz` calls it after building them.
#
#   fuzz/run.sh BUILD_DIR GEN_CKPT_SEEDS HARNESS...
#
# Each harness BUILD_DIR/HARNESS runs for FUZZ_SECONDS (default 60) on
#   BUILD_DIR/corpus/HARNESS   (written: new inputs libFuzzer finds; not committed)
#   fuzz/corpus/HARNESS        (the committed seeds, read only)
#   BUILD_DIR/seeds/HARNESS    (generated seeds: real checkpoints in the current format)
# with fuzz/HARNESS.dict as the dictionary when there is one, a 25 s per-input
# timeout and a 2 GiB RSS limit. A crash, a sanitizer
# report, a broken harness invariant, a leak, a timeout or an out-of-memory
# fails the run; libFuzzer saves the input as BUILD_DIR/artifacts/HARNESS-*.
# Prints one line per harness: executions, corpus size, crashes; exits 1 if
# any harness crashed. FUZZ_JOBS=N runs N harnesses at a time (default 1).
set -uo pipefail
cd "$(dirname "$0")/.."

if (($# < 3)); then
  echo "usage: fuzz/run.sh BUILD_DIR GEN_CKPT_SEEDS HARNESS..." >&2
  exit 2
fi
bd=$1
gen=$2
shift 2
secs=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-1}
case $secs in '' | *[!0-9]*) echo "fuzz: FUZZ_SECONDS must be a whole number, got '$secs'" >&2; exit 2 ;; esac

mkdir -p "$bd/artifacts" "$bd/logs" "$bd/seeds/fuzz_checkpoint"
if ! "$gen" "$bd/seeds/fuzz_checkpoint"; then
  echo "fuzz: $gen failed (checkpoint seeds)" >&2
  exit 1
fi

run_one() {
  local h=$1 log="$bd/logs/$1.log"
  local dirs=("$bd/corpus/$h")
  mkdir -p "$bd/corpus/$h"
  [ -d "fuzz/corpus/$h" ] && dirs+=("fuzz/corpus/$h")
  [ -d "$bd/seeds/$h" ] && dirs+=("$bd/seeds/$h")
  local dict=()
  [ -f "fuzz/$h.dict" ] && dict=(-dict="fuzz/$h.dict")
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
    "$bd/$h" -max_total_time="$secs" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$bd/artifacts/$h-" "${dict[@]}" "${dirs[@]}" >"$log" 2>&1
  echo $? >"$bd/logs/$h.rc"
}

start=$(date +%s)
echo "fuzz: ${#@} harnesses, ${secs}s each, ${jobs} at a time (logs in $bd/logs/)"
running=0
for h in "$@"; do
  run_one "$h" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n
    running=$((running - 1))
  fi
done
wait

fail=0
total=0
printf '%-18s %14s %10s %8s %8s\n' harness executions exec/s corpus crashes
for h in "$@"; do
  log="$bd/logs/$h.log"
  rc=$(cat "$bd/logs/$h.rc" 2>/dev/null || echo 1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  corp=$(grep -Eo 'corp: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+')
  crashes=0
  if [ "$rc" != 0 ]; then
    crashes=1
    fail=1
  fi
  total=$((total + ${execs:-0}))
  printf '%-18s %14s %10s %8s %8s\n' "$h" "${execs:-?}" "${rate:-?}" "${corp:-?}" "$crashes"
  if [ "$rc" != 0 ]; then
    echo "---- $h failed (exit $rc); the end of $log:"
    grep -E 'ERROR|invariant failed|SUMMARY|artifact|Test unit written' "$log" | head -20
    tail -40 "$log"
    echo "----"
  fi
done
echo "fuzz: $total executions in $(($(date +%s) - start)) s; $([ $fail = 0 ] && echo 'no crashes' || echo 'CRASHES (see above)')"
exit $fail
