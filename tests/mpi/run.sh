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
# a rank that dies (SIGKILL: mpirun sees it) or stops answering (alive: only libdp's
# timeout, 3 s here, can tell) ends the job with an error naming it, never a hang
lost() { # flag, what the output must say
  echo "-- a rank that $1 mid-training"
  start=$(date +%s)
  timeout 120 $MPIRUN -np 4 "$bd/test_mpi" "$tmp" "$2" 2 >"$tmp/lost" 2>&1
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
lost "stops answering" --stall-rank "rank 2 of 4 did not answer within 3000 ms"
exit $fail
