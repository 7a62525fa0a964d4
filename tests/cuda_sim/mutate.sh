#!/usr/bin/env bash
# tests/cuda_sim/mutate.sh: a mutation check of the CUDA simulation (tests/cuda_sim).
#
# The simulated suites are only worth something if they fail when cuda/ computes
# the wrong thing. This script proves it on a sample: it changes one operator on
# one line of cuda/*.cu (a "mutant"), rebuilds build/test_cuda_sim, runs the GPU
# test cases that compare each op and training step with the CPU backend, and
# records whether they noticed (killed) or not (survived).
#
#   tests/cuda_sim/mutate.sh                 12 mutants, seed 1
#   MUTANTS=30 SEED=7 tests/cuda_sim/mutate.sh
#   MUTATE_FILES=cuda/sequence.cu tests/cuda_sim/mutate.sh   one file's mutants
#
# Mutants are drawn deterministically: every (line, operator) pair of the files
# below is listed in file order, shuffled by Perl's seeded rand (drand48, the
# same sequence on every Perl >= 5.20), and tried in that order until MUTANTS
# of them have been tested. A mutant that does not compile, or that compiles to
# the same machine code as the original (code in a branch the simulation does not
# build, such as the #else of DP_HAVE_NCCL), is excluded and the next one drawn.
#
# Exit status: 0 when at least 75% of the tested mutants were killed, 1 below
# that, 2 when the check could not run (dirty cuda/, baseline failing, build).
# cuda/ is restored after every mutant and on any exit (Ctrl-C included); the
# script checks `git diff --quiet -- cuda/` before it returns.
set -u -o pipefail

MUTANTS=${MUTANTS:-12}
SEED=${SEED:-1}
MIN_KILL_RATE=75

# shellcheck disable=SC2206 # a list of paths without spaces
FILES=(${MUTATE_FILES:-cuda/kernels.cu cuda/batchnorm.cu cuda/conv.cu cuda/gemm.cu cuda/backend.cu cuda/sequence.cu})
BIN=build/test_cuda_sim
WORK=build/mutate # originals, baseline objects, per-mutant logs (kept for reading)

# Test cases run per mutant, as SUITE:TCASE (Check selects no finer than a
# tcase; tests/test_cuda.c, tests/test_cuda_fault.c):
#   cuda_fault:gpu_fault (~3 s): a device fault mid-run, the failure paths of
#     cuda/backend.cu (the error, the unusable context, aborting on free).
#   cuda:gpu_batchnorm (~30 s): its networks use conv, linear, activations, both
#     losses and every optimizer, so it kills most kernel mutants quickly.
#   cuda:gpu_backend (~90 s): every op against the CPU backend, the reduction
#     stress shapes, the GEMM alignment sweep, steps, graphs, NCCL.
#   cuda:gpu_sequence (~20 s): the GPT's ops, steps, layouts, graphs, NCCL and
#     inference (embedding, attention, residual blocks, per-position loss).
# The first failing test ends the run (see run_case), so only survivors pay for
# the whole list. Left out, for time: cuda_api (the public API over the same
# backend, ~90 s, most of it one memory-accounting test).
CASES="cuda_fault:gpu_fault cuda:gpu_batchnorm cuda:gpu_backend cuda:gpu_sequence"
cases_for() {
  case $1 in
  cuda/batchnorm.cu) echo cuda:gpu_batchnorm ;; # only the batchnorm networks use it
  cuda/sequence.cu) echo cuda:gpu_sequence ;;   # only the GPTs use it
  *) echo "$CASES" ;;
  esac
}

cd "$(git rev-parse --show-toplevel)" || exit 2

# The end check (`git diff --quiet -- cuda/`) only means something from a clean start.
if ! git diff --quiet -- cuda/; then
  echo "mutate: cuda/ has uncommitted changes; commit or stash them first" >&2
  exit 2
fi

rm -rf "$WORK"
mkdir -p "$WORK/orig" "$WORK/obj" "$WORK/log"
for f in "${FILES[@]}"; do cp -p "$f" "$WORK/orig/${f##*/}"; done

running= # pid of the `timeout` running a test binary, for cleanup

# Put every file back from its saved copy. A plain cp gives the restored file a
# new mtime, so that ninja rebuilds its object (a copy with the original mtime
# would look older than the mutated object and leave the mutant in the build).
restore() {
  local f
  for f in "${FILES[@]}"; do
    cmp -s "$WORK/orig/${f##*/}" "$f" || cp "$WORK/orig/${f##*/}" "$f"
  done
}

cleanup() {
  if [ -n "$running" ]; then
    kill -TERM "$running" 2>/dev/null
    wait "$running" 2>/dev/null
  fi
  restore
}
trap cleanup EXIT
trap 'echo "mutate: interrupted; cuda/ restored" >&2; exit 130' INT TERM HUP

build() { ninja -C . "$BIN" >"$1" 2>&1; }

# The machine code of a cuda/ object, without debug information: a mutant whose
# object is identical to the original's is equivalent by construction.
object_of() { echo "build/sim/${1%.cu}.o"; }
code_of() { strip --strip-debug -o "$2" "$(object_of "$1")"; }

# run_case SUITE:TCASE LIMIT LOG: runs one tcase, at most LIMIT
# seconds. Check writes a line per finished test to CK_LOG_FILE_NAME (flushed
# each time); the first F (failure) or E (error: signal, Check's own timeout)
# line ends the run, so killed mutants do not wait for the rest of the case.
# timeout(1) runs the binary in a process group of its own and passes a TERM on
# to it; Check's runner passes it on to the test it forked (a process group of
# its own too), so nothing of a killed run keeps running.
# Sets verdict ("pass", "fail TCASE:TEST" or "timeout") and case_s (seconds);
# not run in a subshell, so that cleanup sees $running.
run_case() {
  local suite=${1%%:*} tcase=${1#*:} limit=$2 log=$3 start=$SECONDS rc first
  : >"$log"
  CK_LOG_FILE_NAME=$log CK_RUN_SUITE=$suite CK_RUN_CASE=$tcase \
    timeout "$limit" "$BIN" "$suite" >"$log.out" 2>&1 &
  running=$!
  while kill -0 "$running" 2>/dev/null; do
    if grep -qE '^[^:]+:[0-9]+:[FE]:' "$log"; then
      kill -TERM "$running" 2>/dev/null
      break
    fi
    sleep 1
  done
  wait "$running"
  rc=$?
  running=
  case_s=$((SECONDS - start))
  first=$(grep -m1 -E '^[^:]+:[0-9]+:[FE]:' "$log" | cut -d: -f4-5)
  if [ -n "$first" ]; then
    verdict="fail $first"
  elif [ "$rc" -eq 124 ]; then
    verdict=timeout
  elif [ "$rc" -ne 0 ] || ! grep -qE '^[^:]+:[0-9]+:P:' "$log"; then
    verdict="fail (exit $rc)" # a crash of the runner itself, or no test run at all
  else
    verdict=pass
  fi
}

# ---- baseline: the unmutated build passes, and how long each case takes --------

start_all=$SECONDS
[ -f build.ninja ] || ./configure.py --no-install >"$WORK/configure.log" 2>&1 ||
  { echo "mutate: ./configure.py --no-install failed; see $WORK/configure.log" >&2; exit 2; }
if ! build "$WORK/log/baseline-build.log"; then
  echo "mutate: $BIN does not build unmutated; see $WORK/log/baseline-build.log" >&2
  exit 2
fi
for f in "${FILES[@]}"; do code_of "$f" "$WORK/obj/${f##*/}.o"; done

declare -A limit # per case: 3x the baseline time plus 30 s; a slower mutant hangs
needed=$(for f in "${FILES[@]}"; do cases_for "$f"; done | tr ' ' '\n' | awk 'NF && !seen[$0]++')
for tcase in $needed; do
  run_case "$tcase" 900 "$WORK/log/baseline-${tcase#*:}"
  if [ "$verdict" != pass ]; then
    echo "mutate: the unmutated $tcase does not pass ($verdict); see $WORK/log/baseline-$tcase*" >&2
    exit 2
  fi
  limit[$tcase]=$((3 * case_s + 30))
  echo "baseline: $tcase passes in ${case_s} s (limit per mutant ${limit[$tcase]} s)"
done

# ---- the candidate mutants, shuffled by SEED -------------------------------------

# One candidate per (line, operator): the operator's first match on the line.
# Comments and string/char literals are blanked before matching (a change there
# changes no behaviour), and so are preprocessor lines with their continuations.
# Skipped as equivalent: the debug hooks' kernels (cuda/kernels.cu), whose
# arithmetic is a spin's length in microseconds (DP_CUDA_DEBUG_DELAY_US, timing
# for tests/gpu/run.sh's races, never a result) and the value written to an
# illegal address (DP_CUDA_DEBUG_FAULT_STEP faults whatever is written).
# Output: file, line, column (0-based), text replaced, replacement; tab-separated.
candidates=$(perl -e '
  use strict; use warnings;
  my ($seed, @files) = @ARGV;
  # [text, replacement, pattern]; the pattern matches exactly the text, with
  # look-arounds that keep it off longer tokens (dfa(, - 10, 10.0f, ...).
  my @ops = (
    ["fa(", "fs(", qr/(?<!\w)fa\(/],   # unfused IEEE add/sub/mul/div (cuda/grid.cuh)
    ["fs(", "fa(", qr/(?<!\w)fs\(/],
    ["fm(", "fa(", qr/(?<!\w)fm\(/],
    ["fd(", "fm(", qr/(?<!\w)fd\(/],
    ["__fadd_rn(", "__fsub_rn(", qr/__fadd_rn\(/],
    ["__fmul_rn(", "__fadd_rn(", qr/__fmul_rn\(/],
    ["__fdiv_rn(", "__fmul_rn(", qr/__fdiv_rn\(/],
    [" + ", " - ", qr/ \+ /],
    [" - ", " + ", qr/ - /],
    [" * ", " + ", qr/ \* /],
    [" < ", " <= ", qr/ < /],
    [" <= ", " < ", qr/ <= /],
    [" > ", " >= ", qr/ > /],
    [" >= ", " > ", qr/ >= /],
    ["+ 1", "+ 2", qr/(?<!\+)\+ 1(?![\w.])/],
    ["- 1", "- 2", qr/(?<!-)- 1(?![\w.])/],
    [">> 1", ">> 2", qr/>> 1(?![\w.])/],
    [">>= 1", ">>= 2", qr/>>= 1(?![\w.])/],
    ["<<= 1", "<<= 2", qr/<<= 1(?![\w.])/],
    ["+= ", "+= 2 * ", qr/\+= /],
    ["0.0f", "1.0f", qr/(?<![\w.])0\.0f/],
    ["1.0f", "2.0f", qr/(?<![\w.])1\.0f/],
  );
  my @all;
  for my $file (@files) {
    open(my $fh, "<", $file) or die "$file: $!";
    my $text = do { local $/; <$fh> };
    (my $mask = $text) =~ s{(/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\x27(?:\\.|[^\x27\\\n])*\x27)}
                           {(my $s = $1) =~ s/[^\n]/ /g; $s}gse;
    my @src = split /\n/, $text, -1;
    my @code = split /\n/, $mask, -1;
    my $continued = 0;
    for my $i (0 .. $#src) {
      my $pre = $continued || $src[$i] =~ /^\s*#/;
      $continued = $pre && $src[$i] =~ /\\$/;
      next if $pre || $src[$i] =~ /__nanosleep|\bk_debug_fault\b/;
      for my $op (@ops) {
        my ($from, $to, $re) = @$op;
        next unless $code[$i] =~ $re;
        push @all, join("\t", $file, $i + 1, $-[0], $from, $to);
      }
    }
  }
  srand($seed);
  for (my $i = $#all; $i > 0; $i--) {   # Fisher-Yates
    my $j = int(rand($i + 1));
    @all[$i, $j] = @all[$j, $i];
  }
  print "$_\n" for @all;
' "$SEED" "${FILES[@]}") || { echo "mutate: listing the candidates failed" >&2; exit 2; }
echo "candidates: $(printf '%s\n' "$candidates" | grep -c .) (line, operator) pairs in ${FILES[*]}; seed $SEED"

# apply FILE LINE COL FROM TO: the mutant, written over FILE (the original is in $WORK/orig).
apply() {
  perl -e '
    my ($file, $line, $col, $from, $to) = @ARGV;
    open(my $fh, "<", $file) or die "$file: $!";
    my @l = <$fh>;
    close $fh;
    substr($l[$line - 1], $col, length $from) eq $from or die "$file:$line: no \"$from\" at $col\n";
    substr($l[$line - 1], $col, length $from) = $to;
    open($fh, ">", $file) or die "$file: $!";
    print $fh @l;
  ' "$@"
}

# ---- the mutants -------------------------------------------------------------------

tested=0 killed=0 survived=0 nocompile=0 same=0 n=0
survivors=()
while IFS=$'\t' read -r file line col from to; do
  [ "$tested" -lt "$MUTANTS" ] || break
  n=$((n + 1))
  id=$(printf '%03d' "$n")
  where="$file:$line"
  change="'$from' -> '$to'"
  t0=$SECONDS
  apply "$file" "$line" "$col" "$from" "$to" || exit 2
  if ! build "$WORK/log/$id-build.log"; then
    printf '%-24s %-26s does not compile (excluded)\n' "$where" "$change"
    nocompile=$((nocompile + 1))
    restore
    continue
  fi
  code_of "$file" "$WORK/obj/mutant.o"
  if cmp -s "$WORK/obj/mutant.o" "$WORK/obj/${file##*/}.o"; then
    printf '%-24s %-26s same machine code (excluded)\n' "$where" "$change"
    same=$((same + 1))
    restore
    continue
  fi
  tested=$((tested + 1))
  verdict=pass
  for tcase in $(cases_for "$file"); do
    run_case "$tcase" "${limit[$tcase]}" "$WORK/log/$id-${tcase#*:}"
    [ "$verdict" = pass ] || break
  done
  restore
  case $verdict in
  pass)
    survived=$((survived + 1))
    survivors+=("$where $change: $(sed -n "${line}p" "$file" | sed 's/^ *//')")
    printf '%-24s %-26s SURVIVED (%d s)\n' "$where" "$change" $((SECONDS - t0))
    ;;
  timeout)
    killed=$((killed + 1))
    printf '%-24s %-26s killed: %s timed out (%d s)\n' "$where" "$change" "${tcase#*:}" $((SECONDS - t0))
    ;;
  *)
    killed=$((killed + 1))
    printf '%-24s %-26s killed by %s (%d s)\n' "$where" "$change" "${verdict#fail }" $((SECONDS - t0))
    ;;
  esac
done <<<"$candidates"

# Leave build/test_cuda_sim built from the unmutated sources.
build "$WORK/log/final-build.log" || echo "mutate: the final (unmutated) rebuild failed" >&2

echo
for s in "${survivors[@]}"; do echo "survivor: $s"; done
echo "excluded: $nocompile do not compile, $same compile to the same machine code"
rate=$(awk -v k="$killed" -v t="$tested" 'BEGIN { printf "%.1f", t ? 100 * k / t : 0 }')
echo "mutants: $tested compiled, $killed killed, $survived survived, kill rate $rate%"
echo "time: $((SECONDS - start_all)) s; logs in $WORK/log"

status=0
if [ "$tested" -lt "$MUTANTS" ]; then
  echo "mutate: only $tested of the $MUTANTS mutants asked for could be tested" >&2
  status=1
fi
[ $((100 * killed)) -ge $((MIN_KILL_RATE * tested)) ] && [ "$tested" -gt 0 ] || status=1
restore
if ! git diff --quiet -- cuda/; then
  echo "mutate: cuda/ is modified after the run" >&2
  status=2
fi
exit $status
