#!/bin/sh
# tests/mpi/run.sh BUILDDIR: the job across processes, under Open MPI's mpirun (a check
# of `ninja test` when configure.py found MPI). Each run of test_mpi checks, on every
# rank, that a job of 8 devices laid out as RANKS x (8 / RANKS) gives the bits of the
# same job in one process, step after step, and how it fails (docs/DISTRIBUTED.md).
set -u
bd=${1:?usage: tests/mpi/run.sh BUILDDIR}
# as root in a container: Open MPI refuses root without these, and its shared-memory
# single-copy mechanism (CMA) needs ptrace rights a container may lack
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# more ranks than cores (CI has 2): let waiting ranks yield
MPIRUN="mpirun --oversubscribe --bind-to none"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
run() { # name, then the command
  name=$1
  shift
  echo "-- $name"
  if ! "$@" >"$tmp/out" 2>&1; then
    cat "$tmp/out"
    echo "FAILED: $name"
    fail=1
  else
    grep -v '^ *$' "$tmp/out" | sed 's/^/   /' | tail -n 12
  fi
}
for np in 1 2 4 8; do
  run "layout ${np}x$((8 / np))" $MPIRUN -np $np "$bd/test_mpi" "$tmp"
done
# the path a multi-host job takes: no shared memory between the ranks
run "layout 4x2 over TCP" $MPIRUN --mca btl self,tcp -np 4 "$bd/test_mpi" "$tmp"
run "layout 2x4 over TCP" $MPIRUN --mca btl self,tcp -np 2 "$bd/test_mpi" "$tmp"
# no allocation by libdp after init on any rank; what MPI allocates, reported
run "no allocation, mpirun -np 2" $MPIRUN -np 2 "$bd/test_noalloc" --mpi
# the tool: dp train under mpirun gives the one-process parameter hash, and dp repro
# compares every tensor after every step across layouts
train="build/dp train --model examples/digits.dpm --data data/digits.csv --devices 4 \
  --batch 64 --micro-batch 4 --epochs 2 --optimizer adamw --lr 0.003"
train=$(echo "$train" | sed "s|build/dp|$bd/dp|")
echo "-- dp train, 1 process and mpirun -np 2 / -np 4"
$train >"$tmp/t1" 2>&1 || { cat "$tmp/t1"; echo "FAILED: dp train"; fail=1; }
for np in 2 4; do
  $MPIRUN -np $np $train >"$tmp/t$np" 2>&1 || { cat "$tmp/t$np"; echo "FAILED: mpirun -np $np dp train"; fail=1; }
  h1=$(grep "parameter hash" "$tmp/t1") hn=$(grep "parameter hash" "$tmp/t$np")
  a1=$(grep "^held-out:" "$tmp/t1") an=$(grep "^held-out:" "$tmp/t$np")
  if [ -z "$h1" ] || [ "$h1" != "$hn" ] || [ "$a1" != "$an" ]; then
    echo "FAILED: mpirun -np $np dp train: '$hn' '$an', one process: '$h1' '$a1'"
    fail=1
  else
    echo "   -np $np: $hn, $an (as one process)"
  fi
  # Open MPI gives a rank a terminal of its own even when mpirun's output goes to a
  # file: the progress line must not draw on it (no escape codes, no carriage returns)
  if grep -q "$(printf '\033')" "$tmp/t$np" || grep -q "$(printf '\r')" "$tmp/t$np"; then
    echo "FAILED: mpirun -np $np dp train wrote terminal escape codes into its output"
    fail=1
  fi
done
# shared parameters (the cpu backend's params=shared): each rank's first device holds
# them, the others read its copy, the broadcast crosses ranks only: the same hash
echo "-- dp train --backend-option params=shared, mpirun -np 2"
$MPIRUN -np 2 $train --backend-option params=shared >"$tmp/ts" 2>&1 ||
  { cat "$tmp/ts"; echo "FAILED: mpirun -np 2 dp train params=shared"; fail=1; }
hs=$(grep "parameter hash" "$tmp/ts")
if [ -z "$h1" ] || [ "$h1" != "$hs" ]; then
  echo "FAILED: params=shared under mpirun -np 2: '$hs', copies in one process: '$h1'"
  fail=1
else
  echo "   $hs (as copies in one process)"
fi
run "dp repro --layouts 1x8,2x4,4x2,8x1" $MPIRUN -np 8 "$bd/dp" repro \
  --model examples/digits.dpm --data data/digits.csv --batch 64 --micro-batch 4 \
  --steps 3 --optimizer adamw --layouts 1x8,2x4,4x2,8x1
# a GPT on a text's bytes: the same bits in every layout and mode (issue 29)
printf 'input tokens 8\nembed 256 16\nresidual\nlayernorm\nlinear 48\nattention 2\nlinear 16\nend\nlayernorm\nlinear 256\nloss softmax_cross_entropy\n' >"$tmp/gpt.dpm"
run "dp repro --text, a GPT, --layouts 1x4,2x2,4x1" $MPIRUN -np 4 "$bd/dp" repro \
  --model "$tmp/gpt.dpm" --text README.md --batch 8 --micro-batch 2 --steps 3 \
  --optimizer adamw --layouts 1x4,2x2,4x1
# nn.CrossEntropyLoss's options: the mean's denominator counted on each rank and
# broadcast; the same bits in every layout and mode
sed 's/^loss softmax_cross_entropy$/loss softmax_cross_entropy label_smoothing 0.1 ignore_index 7 weight 1,2,1,0.5,1,1,3,1,1,1/' \
  examples/digits.dpm >"$tmp/ce.dpm"
run "dp repro, cross-entropy options, --layouts 1x4,2x2,4x1" $MPIRUN -np 4 "$bd/dp" repro \
  --model "$tmp/ce.dpm" --data data/digits.csv --batch 64 --micro-batch 4 --steps 3 \
  --optimizer adamw --layouts 1x4,2x2,4x1
# bf16 mixed precision (issue 31): the same bits in every layout and mode too
run "dp repro --precision bf16, the GPT, --layouts 1x4,2x2,4x1" $MPIRUN -np 4 "$bd/dp" \
  repro --model "$tmp/gpt.dpm" --text README.md --batch 8 --micro-batch 2 --steps 3 \
  --optimizer adamw --layouts 1x4,2x2,4x1 --precision bf16
# the gradient reduction in bf16 (issue 31): packed to half the bytes between ranks,
# added in place within one; the same bits in every layout, in either precision
run "dp repro --reduce-precision bf16, the GPT, --layouts 1x4,2x2,4x1" $MPIRUN -np 4 \
  "$bd/dp" repro --model "$tmp/gpt.dpm" --text README.md --batch 8 --micro-batch 2 \
  --steps 3 --optimizer adamw --layouts 1x4,2x2,4x1 --reduce-precision bf16
run "dp repro --precision bf16 --reduce-precision bf16, digits, --layouts 1x8,2x4,4x2,8x1" \
  $MPIRUN -np 8 "$bd/dp" repro --model examples/digits.dpm --data data/digits.csv \
  --batch 64 --micro-batch 4 --steps 3 --optimizer adamw --layouts 1x8,2x4,4x2,8x1 \
  --precision bf16 --reduce-precision bf16
# the layout's process count against the job's, before the library is asked; every rank
# leaves with the status, no MPI_ABORT banner (an outside check, session 24)
run "dp repro --layouts 8x1 under -np 2: says it needs 8 processes" sh -c "out=\$($MPIRUN \
  -np 2 $bd/dp repro --model examples/digits.dpm --data data/digits.csv --batch 64 \
  --micro-batch 4 --steps 1 --layouts 2x1,8x1 --mode classic 2>&1); rc=\$?; echo \"\$out\"; \
  test \$rc -ne 0 && echo \"\$out\" | grep -q '8x1 .*refused: this layout needs 8 processes, \
the job has 2: run it under mpirun -np 8' && echo \"\$out\" | grep -q '2x1 .*reference' \
  && ! echo \"\$out\" | grep -q MPI_ABORT"
# ranks that disagree (docs/RELIABILITY.md, "Rank agreement"): before the first step the
# ranks compare digests of their model, data as read and options; a rank that differs
# ends the job on every rank, each leaving by itself with a non-zero status, with one
# message from rank 0 naming it, at once (not after the 60 s timeout). rank.sh reports
# each rank's status; mpirun is told to wait for every rank (and then exits 0 itself:
# without that setting it exits non-zero, ending the ranks still running).
printf '#!/bin/sh\n"$@"\nrc=$?\necho "rank $OMPI_COMM_WORLD_RANK exit $rc" >&2\nexit $rc\n' \
  >"$tmp/rank.sh"
chmod +x "$tmp/rank.sh"
small="$bd/dp train --model examples/digits.dpm --devices 2 --batch 64 --micro-batch 4 --quiet"
# the same row count, one feature of the first row changed
awk -F, -v OFS=, 'NR == 1 { $NF = $NF + 1 } 1' data/digits.csv >"$tmp/other.csv"
# job_ends WHAT WANT RANK0 RANK1: rank 0 runs RANK0, rank 1 RANK1 (each split into
# words); the job must end within 20 s, a non-zero exit on every rank, WANT (a grep
# pattern) said, "the ranks disagree" at most once, no DIFFERS verdict, no $tmp/p3.csv
job_ends() {
  echo "-- $1"
  start=$(date +%s)
  timeout 120 $MPIRUN --mca orte_abort_on_non_zero_status 0 -np 1 "$tmp/rank.sh" $3 : \
    -np 1 "$tmp/rank.sh" $4 >"$tmp/rd" 2>&1
  rc=$? took=$(($(date +%s) - start))
  if [ $rc -eq 124 ] || [ $took -gt 20 ] || ! grep -q "$2" "$tmp/rd" ||
    [ "$(grep -c 'the ranks disagree' "$tmp/rd")" -gt 1 ] || grep -q "DIFFERS" "$tmp/rd" ||
    [ -e "$tmp/p3.csv" ] || ! grep -q "rank 0 exit [1-9]" "$tmp/rd" ||
    ! grep -q "rank 1 exit [1-9]" "$tmp/rd"; then
    cat "$tmp/rd"
    echo "FAILED: $1 (exit $rc after ${took}s; want '$2' once, nothing written and a" \
      "non-zero exit on every rank, within 20 s)"
    fail=1
  else
    grep "$2" "$tmp/rd" | cut -c 1-100 | sed 's/^/   /'
    echo "   every rank exited non-zero, after ${took}s"
  fi
}
# said_once WHAT WANT STATUS ARGS...: `dp train` under mpirun -np 2 with $small ARGS says
# WANT once (rank 0 alone) and every rank exits STATUS by itself, without MPI_ABORT
said_once() {
  what=$1 want=$2 status=$3
  shift 3
  echo "-- $what under mpirun -np 2"
  $MPIRUN --mca orte_abort_on_non_zero_status 0 -np 2 "$tmp/rank.sh" $small "$@" \
    >"$tmp/ru" 2>&1
  if [ "$(grep -c "$want" "$tmp/ru")" -ne 1 ] ||
    [ "$(grep -c "exit $status\$" "$tmp/ru")" -ne 2 ] || grep -q MPI_ABORT "$tmp/ru"; then
    cat "$tmp/ru"
    echo "FAILED: $what under mpirun (want the message once, exit $status on both" \
      "ranks, no MPI_ABORT)"
    fail=1
  else
    echo "   said once, every rank exited $status"
  fi
}
# a bad command line: every rank finds it
said_once "a bad command line" "unknown option '--bogus'" 2 --bogus
# a configuration the planner refuses (the backend's option, on every rank alike; an
# outside check: each rank said it and mpirun aborted the job)
said_once "a refused plan" "params=shared needs classic mode" 1 --data data/digits.csv \
  --epochs 1 --mode allreduce --backend-option params=shared
# a --save rank 0 cannot write (a directory): rank 0 checks the files it writes (an
# outside check: mpirun aborted the job)
mkdir -p "$tmp/a_dir"
said_once "a --save that is a directory" "is a directory" 1 --data data/digits.csv \
  --epochs 1 --save "$tmp/a_dir"
disagree() { # what, what the message must say, rank 0's arguments, rank 1's command
  job_ends "ranks that disagree: $1" "$2" "$small --data data/digits.csv $3" "$4"
}
disagree "another data file of the same row count" \
  "rank 1's training data differs from rank 0's (1797 rows, .*give every rank the same --data" \
  "--epochs 1" "$small --data $tmp/other.csv --epochs 1"
disagree "other --epochs" "rank 1 runs with --epochs 3, rank 0 with --epochs 2" \
  "--epochs 2" "$small --data data/digits.csv --epochs 3"
# a save is collective (every rank gathers the state, rank 0 writes it): other
# --save-every, or --save on rank 0 alone, waited 60 s for the rank that did not save,
# and wrote nothing (an outside check)
disagree "other --save-every" "rank 1 runs with --save-every 7, rank 0 with --save-every 5" \
  "--epochs 2 --save $tmp/e.ckpt --save-every 5" \
  "$small --data data/digits.csv --epochs 2 --save $tmp/e.ckpt --save-every 7"
disagree "--save on rank 0 alone" "rank 1 runs with no --save, rank 0 with --save" \
  "--epochs 1 --save $tmp/e.ckpt" "$small --data data/digits.csv --epochs 1"
# dp repro under mpirun: each rank loads its own model and data too. A rank whose data
# file is missing (on its host) waited for by the others forever in a collective, and a
# rank given other data gave a verdict of DIFFERS (an outside check): now the job ends
# at once, every rank non-zero, with the rank's message or rank 0's one naming rank 1
# ends_at_once WHAT WANT BAD CMD...: rank 0 runs CMD --data data/digits.csv, rank 1 CMD
# --data $tmp/BAD (job_ends)
ends_at_once() {
  what=$1 want=$2 f=$3
  shift 3
  job_ends "$what, rank 1 given $f" "$want" "$* --data data/digits.csv" "$* --data $tmp/$f"
}
rep="$bd/dp repro --model examples/digits.dpm --batch 64 --micro-batch 4 --steps 2 \
  --layouts 1x2,2x1 --mode classic"
ends_at_once "dp repro" "cannot read data '$tmp/missing.csv'" missing.csv $rep
ends_at_once "dp repro" "the ranks disagree: rank 1's training data differs from rank 0's" \
  other.csv $rep
# --resume: rank 0 reads the checkpoint and sends it (the ranks need not share a file
# system): rank 1's path, missing or another checkpoint, is never opened, and the job
# resumes rank 0's, bit for bit as one process does
echo "-- dp train --resume under mpirun: rank 0's checkpoint, whatever rank 1's path"
$small --data data/digits.csv --epochs 1 --save "$tmp/a.ckpt" >"$tmp/r1" 2>&1 &&
  $small --data data/digits.csv --epochs 2 --save "$tmp/b.ckpt" >"$tmp/r1" 2>&1 &&
  $small --data data/digits.csv --epochs 1 --resume "$tmp/a.ckpt" >"$tmp/r1" 2>&1 ||
  { cat "$tmp/r1"; echo "FAILED: dp train --save / --resume in one process"; fail=1; }
h1=$(grep "parameter hash" "$tmp/r1")
for other in "$tmp/missing.ckpt" "$tmp/b.ckpt"; do
  $MPIRUN -np 1 $small --data data/digits.csv --epochs 1 --resume "$tmp/a.ckpt" : -np 1 \
    $small --data data/digits.csv --epochs 1 --resume "$other" >"$tmp/r2" 2>&1
  rc=$?
  h2=$(grep "parameter hash" "$tmp/r2")
  if [ $rc -ne 0 ] || [ -z "$h1" ] || [ "$h1" != "$h2" ]; then
    cat "$tmp/r2"
    echo "FAILED: rank 1 with --resume $other: exit $rc, '$h2'; one process: '$h1'"
    fail=1
  else
    echo "   rank 1 given $(basename "$other"): $h2 (as one process)"
  fi
done
disagree "one rank without --resume" "rank 1 runs with no --resume, rank 0 with --resume" \
  "--epochs 1 --resume $tmp/a.ckpt" "$small --data data/digits.csv --epochs 1"
# dp predict under mpirun: each rank reads its own rows and standardisation. A rank given
# other data wrote wrong predictions, exit 0, and a rank whose file was missing left the
# others waiting (an outside check): now the job ends at once, every rank non-zero, with
# rank 0's message naming rank 1 (or rank 1's own). With the same inputs: one process's
# predictions, byte for byte.
pre="$bd/dp predict --checkpoint $tmp/a.ckpt --devices 2 --batch 64"
$pre --data data/digits.csv --out "$tmp/p1.csv" >"$tmp/r1" 2>&1 ||
  { cat "$tmp/r1"; echo "FAILED: dp predict in one process"; fail=1; }
$MPIRUN -np 2 $pre --data data/digits.csv --out "$tmp/p2.csv" >"$tmp/r2" 2>&1
if [ $? -ne 0 ] || ! cmp -s "$tmp/p1.csv" "$tmp/p2.csv"; then
  cat "$tmp/r2"
  echo "FAILED: mpirun -np 2 dp predict: not one process's predictions"
  fail=1
else
  echo "-- dp predict under mpirun -np 2: one process's predictions, byte for byte"
fi
ends_at_once "dp predict" "cannot read data '$tmp/missing.csv'" missing.csv $pre \
  --out "$tmp/p3.csv"
ends_at_once "dp predict" "the ranks disagree: rank 1's data differs from rank 0's" \
  other.csv $pre --out "$tmp/p3.csv"
# the oversubscription warning counts a process's devices against the CPUs it may
# use (an outside check, session 23: it counted the job's, and told a 2-process job
# to use --devices 1): bound to a core each (c CPUs: its hardware threads), c devices
# a process are no warning and c + 1 are one, naming the binding. Skipped where 2
# processes cannot each have a core.
c=$(mpirun --bind-to core --map-by core -np 2 sh -c 'nproc' 2>/dev/null | head -n 1)
case "$c" in
'' | *[!0-9]*) echo "-- skipped: mpirun cannot bind 2 processes to a core each here" ;;
*)
  echo "-- dp train under mpirun, a process bound to a core ($c CPUs): its devices against it"
  for d in $((2 * c)) $((2 * c + 2)); do
    mpirun --bind-to core --map-by core -np 2 "$bd/dp" train --model examples/digits.dpm \
      --data data/digits.csv --devices $d --batch 64 --epochs 1 --quiet >"$tmp/o$d" 2>&1 ||
      { cat "$tmp/o$d"; echo "FAILED: mpirun -np 2 dp train --devices $d"; fail=1; }
  done
  many=$((2 * c + 2))
  if grep -q "virtual devices" "$tmp/o$((2 * c))"; then
    cat "$tmp/o$((2 * c))"; echo "FAILED: $c devices a process on $c CPUs were called oversubscribed"; fail=1
  elif ! grep -q "warning: $((c + 1)) virtual devices per process on the $c CPU.*--map-by slot:PE=$((c + 1))" "$tmp/o$many"; then
    cat "$tmp/o$many"; echo "FAILED: $((c + 1)) devices a process on $c CPUs: no warning naming the binding"; fail=1
  else
    echo "   $c devices a process: no warning; $((c + 1)): $(grep -o 'warning: [0-9]* virtual devices per process[^:]*' "$tmp/o$many")"
  fi
  ;;
esac
# devices the job's processes cannot share are refused before any data is read (a
# data file that does not exist is never opened)
echo "-- dp train --devices 3 under mpirun -np 2: refused before the data"
$MPIRUN -np 2 "$bd/dp" train --model examples/digits.dpm --data "$tmp/none.csv" --batch 64 \
  --devices 3 >"$tmp/d3" 2>&1 && { echo "FAILED: --devices 3 under -np 2 ran"; fail=1; }
if grep -q "none.csv" "$tmp/d3" ||
  ! grep -q "^dp train: --devices 3 cannot be shared by this job's 2 processes" "$tmp/d3"; then
  cat "$tmp/d3"; echo "FAILED: --devices 3 under -np 2: not refused before the data"; fail=1
else
  echo "   $(grep -m1 '^dp train: --devices 3' "$tmp/d3")"
fi
# a sequence model on a text (dp train --text): the one-process bits (a row's labels are
# T ids: each rank feeds its rows' targets); a SIGINT to one rank stops every rank after
# the same step (they agree on it after each step), saves and exits 130; the command it
# prints, resumed for 2 epochs, gives the bits of one process run to the same epoch
printf 'input tokens 8\nembed 256 16\nresidual\n  layernorm\n  linear 48\n  attention 2\n  linear 16\nend\nlayernorm\nlinear 256\nloss softmax_cross_entropy\n' >"$tmp/g.dpm"
head -c 3000 README.md >"$tmp/t.txt"
seq="$bd/dp train --model $tmp/g.dpm --text $tmp/t.txt --batch 8 --devices 2 --micro-batch 2 \
  --optimizer adamw --lr 0.01 --quiet"
echo "-- dp train --text, 1 process and mpirun -np 2"
$seq --epochs 2 >"$tmp/q1" 2>&1 || { cat "$tmp/q1"; echo "FAILED: dp train --text"; fail=1; }
timeout 120 $MPIRUN -np 2 $seq --epochs 2 >"$tmp/q2" 2>&1 ||
  { cat "$tmp/q2"; echo "FAILED: mpirun -np 2 dp train --text"; fail=1; }
h1=$(grep "parameter hash" "$tmp/q1") h2=$(grep "parameter hash" "$tmp/q2")
a1=$(grep "^held-out:" "$tmp/q1") a2=$(grep "^held-out:" "$tmp/q2")
if [ -z "$h1" ] || [ "$h1" != "$h2" ] || [ "$a1" != "$a2" ]; then
  echo "FAILED: mpirun -np 2 dp train --text: '$h2' '$a2', one process: '$h1' '$a1'"
  fail=1
else
  echo "   -np 2: $h2, $a2 (as one process)"
fi
echo "-- dp train --text under mpirun -np 2: SIGINT to one rank"
timeout 120 $MPIRUN -np 2 $seq --epochs 100000 --save "$tmp/s.ckpt" --log "$tmp/s.jsonl" \
  >"$tmp/s.out" 2>&1 &
mp=$!
i=0
while [ ! -s "$tmp/s.jsonl" ] && [ $i -lt 600 ]; do
  sleep 0.1
  i=$((i + 1))
done
# timeout's child is mpirun; mpirun's children are the ranks: signal the last one only
rank=$(pgrep -P "$(pgrep -P $mp | head -n 1)" | tail -n 1)
[ -n "$rank" ] && kill -INT "$rank"
wait $mp
rc=$?
left=$(sed -n 's/.*to go on: .* --resume [^ ]* --epochs \([0-9]*\)$/\1/p' "$tmp/s.out")
if [ $rc -ne 130 ] || [ -z "$left" ]; then
  cat "$tmp/s.out"
  echo "FAILED: SIGINT to rank pid '$rank' under mpirun: exit $rc (want 130 and the resume line)"
  fail=1
else
  grep "to go on" "$tmp/s.out" | cut -c 1-100 | sed 's/^/   /'
  timeout 120 $MPIRUN -np 2 $seq --resume "$tmp/s.ckpt" --epochs 2 >"$tmp/s2" 2>&1
  $seq --epochs $((100000 - left + 2)) >"$tmp/s1" 2>&1
  h1=$(grep "parameter hash" "$tmp/s1") h2=$(grep "parameter hash" "$tmp/s2")
  if [ -z "$h1" ] || [ "$h1" != "$h2" ]; then
    cat "$tmp/s2"
    echo "FAILED: resumed under mpirun: '$h2'; one process to epoch $((100000 - left + 2)): '$h1'"
    fail=1
  else
    echo "   resumed for 2 epochs: $h2 (as one process)"
  fi
fi
# dp bench comm: the canonical tree against MPI_Allreduce, and steps on 1 and 2 ranks with
# one parameter hash (a smoke run: the figures are in docs/PERFORMANCE.md)
run "dp bench comm, 2 ranks" sh -c "$MPIRUN -np 2 $bd/dp bench comm --max-bytes 64KiB \
  --iters 3 --steps 3 | grep -x 'params hash: the same for 1 and 2 ranks'"
run "dp bench comm outside mpirun: exit 1, says how" sh -c "out=\$($bd/dp bench comm 2>&1); \
  rc=\$?; echo \"\$out\"; test \$rc -eq 1 && echo \"\$out\" | grep -q 'mpirun -np 4 dp bench comm'"
# a rank that dies (SIGKILL: mpirun sees it) or stops answering (alive: only libdp's
# timeout, 3 s here, can tell) ends the job with an error naming it, never a hang
lost() { # what, flag, what the output must say[, program]
  echo "-- a rank that $1 mid-training${4:+ ($4)}"
  start=$(date +%s)
  timeout 120 $MPIRUN -np 4 "$bd/${4:-test_mpi}" "$tmp" "$2" 2 >"$tmp/lost" 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q "$3" "$tmp/lost"; then
    cat "$tmp/lost"
    echo "FAILED: a rank that $1 (exit $rc after ${took}s; want an error with '$3')"
    fail=1
  else
    grep -m 2 "$3" "$tmp/lost" | sed 's/^/   /'
    echo "   the job ended with exit $rc after ${took}s"
  fi
}
lost "is killed" --kill-rank "rank 2 .*exited on signal 9"
# the first rank to time out names the rank it waits for (rank 2, or on a loaded machine
# a rank between it and rank 2 in the agreement's tree), then MPI_Abort ends the job
lost "stops answering" --stall-rank "rank [0-9] of 4 did not answer within 3000 ms"
# the cuda backend across processes, over the emulated GPU whose NCCL runs on MPI: the
# same job and checks (docs/DISTRIBUTED.md, "GPUs across processes")
if [ -x "$bd/test_cuda_mpi" ]; then
  for np in 1 2 4 8; do
    run "cuda (emulated GPU, NCCL over MPI): layout ${np}x$((8 / np))" \
      $MPIRUN -np $np "$bd/test_cuda_mpi" "$tmp"
  done
  run "cuda (emulated): layout 4x2 over TCP" $MPIRUN --mca btl self,tcp -np 4 \
    "$bd/test_cuda_mpi" "$tmp"
  lost "is killed" --kill-rank "rank 2 .*exited on signal 9" test_cuda_mpi
  lost "stops answering" --stall-rank "rank [0-9] of 4 did not answer within 3000 ms" \
    test_cuda_mpi
  lost "stops sending" --drop-rank "did not complete within the timeout" test_cuda_mpi
fi
# the same job on the CUDA simulation (tests/cuda_sim): cuda/'s own code, its NCCL pairs
# and all-reduce over MPI between the processes; 8 simulated GPUs visible to each process,
# one per device (docs/GPU.md, "The CUDA simulation")
if [ -x "$bd/test_cuda_mpi_sim" ]; then
  for np in 2 4; do
    run "cuda (simulated GPUs, NCCL over MPI): layout ${np}x$((8 / np))" \
      env DP_SIM_GPUS=8 DP_TEST_DEVICES=8 $MPIRUN -x DP_SIM_GPUS -x DP_TEST_DEVICES \
      -np $np "$bd/test_cuda_mpi_sim" "$tmp"
  done
  # lost ranks on the simulation: cuda/'s own step deadline and NCCL abort end the job
  # (the emulator's cases above test the emulator's NCCL; these the backend's code)
  export DP_SIM_GPUS=8 DP_TEST_DEVICES=8
  plain=$MPIRUN
  MPIRUN="$MPIRUN -x DP_SIM_GPUS -x DP_TEST_DEVICES"
  lost "is killed" --kill-rank "rank 2 .*exited on signal 9" test_cuda_mpi_sim
  lost "stops answering" --stall-rank "rank [0-9] of 4 did not answer within 3000 ms" \
    test_cuda_mpi_sim
  lost "stops sending" --drop-rank "did not finish within 3000 ms" test_cuda_mpi_sim
  MPIRUN=$plain
fi
exit $fail
