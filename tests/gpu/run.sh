#!/usr/bin/env bash
# The CUDA backend's GPU check, for a session that is lent a GPU machine (docs/GPU.md).
#
#   tests/gpu/run.sh stage    HERE, before the device call: copies the Check unit-test
#                             library (headers, static libraries) and a pkg-config shim
#                             into .gpu-deps/ (ignored through .git/info/exclude), since
#                             nothing can be installed on the GPU machine.
#   tests/gpu/run.sh          ON THE GPU MACHINE (device `run`, carry [".gpu-deps"]):
#                             configures with --cuda-arch 90 into build-gpu/, builds test_dp,
#                             test_noalloc and dp with ninja -j16, runs the cuda and cuda_api
#                             suites, test_noalloc, `dp bench gpu-step` and `dp bench
#                             gpu-gemm`, the cuda_api suite again under CUDA_MODULE_LOADING=EAGER, the
#                             cuda_fault suite, a race stress (4 replicas, delayed vs
#                             CUDA_LAUNCH_BLOCKING=1; the digits MLP plain and with graphs,
#                             a CNN with sync batchnorm), compute-sanitizer (the backend
#                             case; memcheck of the batchnorm case) when time is left, and
#                             prints a summary table last. Every phase has a
#                             time limit; the whole run stays under 8 minutes (about 4
#                             expected; not yet measured).
#
# Environment: OUT (a folder whose files come back; default /tmp/dp-gpu-out) gets
# configure.log, build.log, cuda_suite.log, cuda_api_suite.log, noalloc.log,
# bench_gpu_step.log, bench_gpu_gemm.log, bench_torch.log (the PyTorch peer) and summary.txt. DP_GPU_SANITIZE=1 also runs the
# backend test case under compute-sanitizer memcheck (slow; only where the runtime has it).
# Exit status: 0 when everything built and passed and nothing skipped for want of a GPU
# (a test that needs 2 GPUs may skip on a one-GPU machine: listed, not a failure); 1
# otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

if [ "${1:-}" = "stage" ]; then
  D=.gpu-deps
  rm -rf "$D"
  mkdir -p "$D/bin" "$D/include" "$D/lib"
  inc=$(pkg-config --variable=includedir check)
  lib=$(pkg-config --variable=libdir check)
  slib=$(pkg-config --variable=libdir libsubunit)
  cp "$inc/check.h" "$inc/check_stdint.h" "$D/include/"
  cp "$lib/libcheck_pic.a" "$slib/libsubunit.a" "$D/lib/" # static: no .so to find at run time
  ver=$(pkg-config --modversion check)
  cat >"$D/bin/pkg-config" <<EOF
#!/bin/sh
# pkg-config for the one package configure.py asks about (written by tests/gpu/run.sh stage)
D=\$(cd "\$(dirname "\$0")/.." && pwd)
want=""; out=""
for a in "\$@"; do
  case "\$a" in
    --exists) want=exists ;;
    --cflags) out="\$out -I\$D/include -pthread" ;;
    --libs) out="\$out -L\$D/lib -lcheck_pic -lrt -lm -lsubunit -pthread" ;;
    --modversion) out="\$out $ver" ;;
    check) ;;
    *) exit 1 ;;
  esac
done
[ -n "\$out" ] && echo \$out
exit 0
EOF
  chmod +x "$D/bin/pkg-config"
  if [ -d .git ] && ! grep -qx '/.gpu-deps/' .git/info/exclude 2>/dev/null; then
    echo '/.gpu-deps/' >>.git/info/exclude
  fi
  echo "staged Check $ver in $D ($(du -sh "$D" | cut -f1)); carry \".gpu-deps\" in the device call"
  exit 0
fi

OUTD=${OUT:-/tmp/dp-gpu-out}
mkdir -p "$OUTD"
CLOG=$OUTD/configure.log
BLOG=$OUTD/build.log
SUM=$OUTD/summary.txt
START=$(date +%s)
elapsed() { echo $(($(date +%s) - START)); }
# Seconds a phase may take: its own cap, or what is left of the 420 s budget (the device
# call has about 8 minutes, and the summary must be printed before they end).
budget() {
  local left=$((420 - $(elapsed)))
  [ "$left" -lt 10 ] && left=10
  [ "$1" -lt "$left" ] && left=$1
  echo "$left"
}

echo "== nvidia-smi -L"
nvidia-smi -L || echo "(nvidia-smi failed)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true

# No network there: an apt-get that fails at once keeps configure.py from trying.
SHIM=$(mktemp -d)
printf '#!/bin/sh\necho "apt-get: offline (tests/gpu/run.sh)" >&2\nexit 1\n' >"$SHIM/apt-get"
chmod +x "$SHIM/apt-get"
export PATH="$SHIM:$PATH"
if ! { command -v pkg-config >/dev/null && pkg-config --exists check; }; then
  if [ -x .gpu-deps/bin/pkg-config ]; then
    export PATH="$ROOT/.gpu-deps/bin:$PATH"
    echo "== Check from .gpu-deps (tests/gpu/run.sh stage)"
  else
    echo "run.sh: no Check library here and no .gpu-deps/: run 'tests/gpu/run.sh stage' on" \
      "the build machine and carry .gpu-deps" >&2
    exit 1
  fi
fi

# cuBLAS: configure.py wants $CUDA_HOME/lib64/libcublas.so. Where the toolkit lacks it but
# a Python wheel (nvidia-cublas) has it, give configure.py a CUDA_HOME of links to both, and
# nvcc (which finds CUDA's own headers from where it really is) the wheel's headers.
# (Untested: the lent machine's toolkit is expected to have cuBLAS.)
CH=${CUDA_HOME:-/usr/local/cuda}
if [ ! -e "$CH/lib64/libcublas.so" ]; then
  wd=$(python3 -c 'import nvidia.cublas as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  if [ -n "$wd" ] && ls "$wd"/lib/libcublas.so* >/dev/null 2>&1; then
    FH=$(mktemp -d)
    for f in "$CH"/*; do ln -s "$f" "$FH/"; done
    rm -f "$FH/include" "$FH/lib64"
    mkdir "$FH/include" "$FH/lib64"
    for f in "$CH"/include/* "$wd"/include/*; do ln -sf "$f" "$FH/include/"; done
    for f in "$CH"/lib64/* "$wd"/lib/*; do ln -sf "$f" "$FH/lib64/"; done
    for f in "$FH"/lib64/libcublas.so.* "$FH"/lib64/libcublasLt.so.*; do
      [ -e "$f" ] || continue
      b=$(basename "$f")
      ln -sf "$f" "$FH/lib64/${b%%.so.*}.so"
    done
    export CUDA_HOME=$FH NVCC="$CH/bin/nvcc -I$wd/include"
    echo "== cuBLAS from $wd (CUDA_HOME=$FH)"
  fi
fi

echo "== configure ($(elapsed) s)"
# -lineinfo: compute-sanitizer names source lines (no effect on the code generated)
NVCC="${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc} -lineinfo" \
  ./configure.py --no-install --cuda-arch 90 --builddir build-gpu 2>&1 | tee "$CLOG"
if ! grep -q '^  CUDA        on' "$CLOG"; then
  echo "run.sh: configure.py turned CUDA off (see above): no GPU backend to test" >&2
  exit 1
fi

echo "== build: ninja -j16 test_dp test_noalloc dp ($(elapsed) s)"
set +e
# the job across processes on real GPUs, where configure.py found MPI here
MPI_BIN=""
grep -q 'build build-gpu/test_cuda_mpi_gpu:' build-gpu/build.ninja 2>/dev/null &&
  MPI_BIN=build-gpu/test_cuda_mpi_gpu
timeout "$(budget 240)" ninja -j16 -f build-gpu/build.ninja build-gpu/test_dp \
  build-gpu/test_noalloc build-gpu/dp $MPI_BIN 2>&1 | tee "$BLOG"
brc=${PIPESTATUS[0]}
set -e
warnings=$(grep -ci 'warning' "$BLOG" || true)

# Each phase: its log in $OUT, its exit status in a variable; a phase that cannot run
# (no binary) counts as failed. Called with errexit off (set +e below).
run_phase() { # NAME LOG CAP COMMAND...
  local name=$1 log=$2 cap=$3 rc
  shift 3
  echo "== $name ($(elapsed) s)"
  if [ ! -x "$1" ]; then
    echo "run.sh: $1 was not built" | tee "$log"
    return 1
  fi
  timeout "$(budget "$cap")" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" = 124 ]; then echo "run.sh: $name: timed out" | tee -a "$log"; fi
  return "$rc"
}

CK_VERBOSITY=verbose
export CK_VERBOSITY
set +e # from here on every step runs, whatever failed before; the table says what
run_phase "cuda suite" "$OUTD/cuda_suite.log" 200 build-gpu/test_dp cuda
rc_cuda=$?
run_phase "cuda_api suite" "$OUTD/cuda_api_suite.log" 150 build-gpu/test_dp cuda_api
rc_api=$?
# The same suite (graphs included) with every module loaded up front, as opposed to
# lazily (the default since CUDA 12.2; the backend preloads its own kernels either way).
CUDA_MODULE_LOADING=EAGER run_phase "cuda_api suite, CUDA_MODULE_LOADING=EAGER" \
  "$OUTD/cuda_api_eager.log" 120 build-gpu/test_dp cuda_api
rc_eager=$?
# A device fault (DP_CUDA_DEBUG_FAULT_STEP) must end its step in DP_ERR_BACKEND within 30 s
# and dp_ctx_free must return; on its own: the fault leaves the CUDA context unusable.
run_phase "cuda_fault suite" "$OUTD/cuda_fault.log" 90 build-gpu/test_dp cuda_fault
rc_fault=$?
# Race stress: 4 replicas on GPU 0, about 200 steps of the digits MLP, with a spin in a
# rotating replica's every stage (DP_CUDA_DEBUG_DELAY_US), plain and with graphs; the
# parameter hash must equal that of a run with CUDA_LAUNCH_BLOCKING=1 (no concurrency at
# all). A missing cross-stream edge would let one replica read another's data early.
race() { # LOG ENV... (RACE_MODEL, RACE_EPOCHS, RACE_GRAPH, RACE_EXTRA: dp's arguments)
  local log=$1
  shift
  env "$@" build-gpu/dp train --model "${RACE_MODEL:-examples/digits.dpm}" \
    --data data/digits.csv --batch 64 --epochs "${RACE_EPOCHS:-9}" --optimizer adamw \
    --lr 0.003 --backend cuda --devices 0,0,0,0 ${RACE_GRAPH:-} ${RACE_EXTRA:-} \
    >>"$log" 2>&1
}
rc_race=0
: >"$OUTD/race.log"
for RACE_GRAPH in "" "--graph"; do
  echo "== race stress ${RACE_GRAPH:-plain} ($(elapsed) s)" | tee -a "$OUTD/race.log"
  if [ -x build-gpu/dp ] && [ "$(budget 60)" -gt 20 ]; then
    h1=$(race "$OUTD/race.log" DP_CUDA_DEBUG_DELAY_US=200; grep -o 'hash: [0-9a-f]*' \
      "$OUTD/race.log" | tail -1)
    h2=$(race "$OUTD/race.log" CUDA_LAUNCH_BLOCKING=1; grep -o 'hash: [0-9a-f]*' \
      "$OUTD/race.log" | tail -1)
    echo "race ${RACE_GRAPH:-plain}: delayed $h1, serialised $h2" | tee -a "$OUTD/race.log"
    [ -n "$h1" ] && [ "$h1" = "$h2" ] || rc_race=1
  else
    echo "race ${RACE_GRAPH:-plain}: not run (no dp, or no time left)" | tee -a "$OUTD/race.log"
    rc_race=1
  fi
done
# Sync batchnorm: the statistics' trees cross the replicas in the middle of the forward
# and of the backward (cuda/batchnorm.cu); a conv + 2d and 1d batchnorm model on the
# digits, micro-batches of 8 (merges within a replica too), plain steps.
RACE_MODEL=$(mktemp --suffix=.dpm)
printf '%s\n' 'input 1 8 8' 'conv2d 8 3 padding 1' batchnorm relu 'maxpool2d 2' flatten \
  'linear 32' batchnorm relu 'linear 10' 'loss softmax_cross_entropy' >"$RACE_MODEL"
RACE_EPOCHS=3 RACE_GRAPH="" RACE_EXTRA="--batchnorm sync --micro-batch 8"
echo "== race stress, sync batchnorm ($(elapsed) s)" | tee -a "$OUTD/race.log"
if [ -x build-gpu/dp ] && [ "$(budget 60)" -gt 20 ]; then
  h1=$(race "$OUTD/race.log" DP_CUDA_DEBUG_DELAY_US=200; grep -o 'hash: [0-9a-f]*' \
    "$OUTD/race.log" | tail -1)
  h2=$(race "$OUTD/race.log" CUDA_LAUNCH_BLOCKING=1; grep -o 'hash: [0-9a-f]*' \
    "$OUTD/race.log" | tail -1)
  echo "race sync batchnorm: delayed $h1, serialised $h2" | tee -a "$OUTD/race.log"
  [ -n "$h1" ] && [ "$h1" = "$h2" ] || rc_race=1
else
  echo "race sync batchnorm: not run (no dp, or no time left)" | tee -a "$OUTD/race.log"
  rc_race=1
fi
unset RACE_MODEL RACE_EPOCHS RACE_EXTRA
run_phase "test_noalloc" "$OUTD/noalloc.log" 90 build-gpu/test_noalloc
rc_noalloc=$?
run_phase "dp bench gpu-step" "$OUTD/bench_gpu_step.log" 60 build-gpu/dp bench gpu-step
rc_step=$?
run_phase "dp bench gpu-gemm" "$OUTD/bench_gpu_gemm.log" 60 build-gpu/dp bench gpu-gemm
rc_gemm=$?
# The peer, in the same run: PyTorch on the same model, batch, optimizer and precision.
# Informational: a machine without PyTorch's CUDA is not a failure of libdp.
PY=$(command -v python3 || true)
if [ -n "$PY" ]; then
  run_phase "PyTorch peer" "$OUTD/bench_torch.log" 90 "$PY" bench/torch_gpu_step.py
  rc_torch=$?
else
  echo "run.sh: no python3 for the PyTorch peer" | tee "$OUTD/bench_torch.log"
  rc_torch=1
fi

# The cuda backend across processes (docs/DISTRIBUTED.md): tests/mpi/test_mpi.c's job,
# one GPU per replica, under mpirun, against the same job in one process, bit for bit
# (refusals, injected faults at every cross-rank copy, checkpoints both ways). Needs two
# GPUs and Open MPI on this machine: otherwise listed as skipped, with the reason.
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
mgpu_why="" rc_mgpu=0
: >"$OUTD/multi_gpu.log"
if [ "${ngpu:-0}" -lt 2 ]; then
  mgpu_why="needs 2 GPUs, this machine has ${ngpu:-0}"
elif ! command -v mpirun >/dev/null; then
  mgpu_why="no mpirun on this machine"
elif [ -z "$MPI_BIN" ] || [ ! -x "$MPI_BIN" ]; then
  mgpu_why="test_cuda_mpi_gpu not built (configure.py found no MPI)"
else
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  for layout in 2x1 2x2 4x1; do
    np=${layout%x*} per=${layout#*x} devs=$((np * per))
    [ "$devs" -le "$ngpu" ] || continue
    echo "== cuda across processes, $layout ($(elapsed) s)" | tee -a "$OUTD/multi_gpu.log"
    DP_TEST_DEVICES=$devs timeout "$(budget 60)" mpirun --oversubscribe --bind-to none \
      -np "$np" "$MPI_BIN" "$OUTD" >>"$OUTD/multi_gpu.log" 2>&1 || rc_mgpu=1
  done
fi

# compute-sanitizer: memcheck, synccheck and initcheck over the backend test case, in one
# process (CK_FORK=no: the tool follows no fork), on the -lineinfo build. Slow: only with
# DP_GPU_SANITIZE=1, or when time is left.
src=0
if command -v compute-sanitizer >/dev/null && [ -x build-gpu/test_dp ] &&
  { [ "${DP_GPU_SANITIZE:-0}" = 1 ] || [ "$(budget 400)" -gt 150 ]; }; then
  for tool in memcheck synccheck initcheck; do
    echo "== compute-sanitizer $tool, test case gpu_backend ($(elapsed) s)"
    CK_FORK=no CK_RUN_CASE=gpu_backend CK_DEFAULT_TIMEOUT=600 \
      timeout "$(budget 100)" compute-sanitizer --tool $tool --error-exitcode 3 \
      build-gpu/test_dp cuda 2>&1 | tee "$OUTD/sanitizer_$tool.log" | tail -5
    r=${PIPESTATUS[0]}
    echo "compute-sanitizer $tool: exit $r" >>"$OUTD/sanitizer.log"
    [ "$r" = 0 ] || src=$r
  done
  # the batchnorm kernels (cuda/batchnorm.cu): memcheck, when time is still left
  if [ "${DP_GPU_SANITIZE:-0}" = 1 ] || [ "$(budget 400)" -gt 60 ]; then
    echo "== compute-sanitizer memcheck, test case gpu_batchnorm ($(elapsed) s)"
    CK_FORK=no CK_RUN_CASE=gpu_batchnorm CK_DEFAULT_TIMEOUT=600 \
      timeout "$(budget 100)" compute-sanitizer --tool memcheck --error-exitcode 3 \
      build-gpu/test_dp cuda 2>&1 | tee "$OUTD/sanitizer_memcheck_bn.log" | tail -5
    r=${PIPESTATUS[0]}
    echo "compute-sanitizer memcheck (gpu_batchnorm): exit $r" >>"$OUTD/sanitizer.log"
    [ "$r" = 0 ] || src=$r
  fi
fi

# ---- the table, last ----
# Check's verbose lines: "file:line:P|F|E:tcase:test:iteration: message". A test that
# skips prints "SKIP <suite>: <test>: <why>" and passes: "no GPU" means this run proved
# nothing (a failure); another reason (e.g. "needs 2 GPUs" on this one-GPU machine) is
# expected here, listed, and not a failure.
suite_rows() { # SUITE LOG
  local suite=$1 log=$2 res tcase test r why
  grep -E '^[^:]+:[0-9]+:[PFE]:' "$log" 2>/dev/null | while IFS=: read -r _ _ res tcase test _; do
    case "$res" in P) r=passed ;; F) r=FAILED ;; *) r=ERROR ;; esac
    why=$(grep -m1 "^SKIP $suite: $test: " "$log" | sed "s/^SKIP $suite: $test: //" | cut -c1-48)
    [ -n "$why" ] && r="SKIPPED ($why)"
    printf '  %-64s %s\n' "$suite/$tcase/$test" "$r"
  done
}
suite_counts() { # SUITE LOG RC
  local suite=$1 log=$2 rc=$3 p f e s n
  p=$(grep -cE '^[^:]+:[0-9]+:P:' "$log" 2>/dev/null || true)
  f=$(grep -cE '^[^:]+:[0-9]+:F:' "$log" 2>/dev/null || true)
  e=$(grep -cE '^[^:]+:[0-9]+:E:' "$log" 2>/dev/null || true)
  s=$(grep -c "^SKIP $suite:" "$log" 2>/dev/null || true)
  n=$(grep -cE "^SKIP $suite: [^:]+: no GPU" "$log" 2>/dev/null || true)
  printf '%-28s %4d passed (%d of them skipped, %d for want of a GPU), %d failed, %d errors; exit %s\n' \
    "suite $suite" "$p" "$s" "$n" "$f" "$e" "$rc"
}
skip_cuda=$(grep -cE '^SKIP cuda: [^:]+: no GPU' "$OUTD/cuda_suite.log" 2>/dev/null || true)
skip_api=$(grep -cE '^SKIP cuda_api: [^:]+: no GPU' "$OUTD/cuda_api_suite.log" 2>/dev/null ||
  true)
skip_api=$((skip_api + $(grep -cE '^SKIP cuda_fault: [^:]+: no GPU' "$OUTD/cuda_fault.log" \
  2>/dev/null || true)))
skip_noalloc=$(grep -c '^SKIP noalloc' "$OUTD/noalloc.log" 2>/dev/null || true)
skip_bench=$(cat "$OUTD"/bench_gpu_*.log 2>/dev/null | grep -c 'skipped, no GPU' || true)
{
  echo
  echo "== summary (tests/gpu/run.sh, $(elapsed) s)"
  nvidia-smi -L 2>/dev/null | head -1 || true
  nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null |
    sed 's/^/driver /' | head -1 || true
  if commit=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD 2>/dev/null || commit="$commit with local changes"
  else
    commit="? (no git here)"
  fi
  echo "commit $commit"
  echo "build: exit $brc, $warnings warning line(s)"
  suite_rows cuda "$OUTD/cuda_suite.log" || true
  suite_rows cuda_api "$OUTD/cuda_api_suite.log" || true
  grep -E '^cuda: .* match the cpu backend' "$OUTD/cuda_suite.log" 2>/dev/null |
    sed 's/^cuda: /ops: /' || true
  grep -E '^cuda: .*(bit for bit for 1, 2, 4|as graph replays: bit-identical)' \
    "$OUTD/cuda_suite.log" 2>/dev/null | sed 's/^cuda: /bits: /' || true
  grep -hE '^TIMING ' "$OUTD/cuda_suite.log" "$OUTD/cuda_api_suite.log" 2>/dev/null |
    sed 's/^TIMING /timing: /' || true
  grep -hE '^NOTE ' "$OUTD/cuda_suite.log" "$OUTD/cuda_api_suite.log" 2>/dev/null || true
  echo
  suite_counts cuda "$OUTD/cuda_suite.log" "$rc_cuda"
  suite_counts cuda_api "$OUTD/cuda_api_suite.log" "$rc_api"
  suite_counts cuda_api "$OUTD/cuda_api_eager.log" "$rc_eager" | sed 's/^suite cuda_api   /suite cuda_api EAGER/'
  suite_counts cuda_fault "$OUTD/cuda_fault.log" "$rc_fault"
  grep -E '^NOTE .*alignment' "$OUTD/cuda_suite.log" 2>/dev/null || true
  grep -E '^race ' "$OUTD/race.log" 2>/dev/null || true
  if [ -n "$mgpu_why" ]; then
    printf '%-28s %s\n' "cuda across processes" "SKIPPED ($mgpu_why)"
  else
    printf '%-28s exit %s\n' "cuda across processes" "$rc_mgpu"
    grep -E '^(test_cuda_mpi_gpu|rank [0-9]+: FAIL)' "$OUTD/multi_gpu.log" | sed 's/^/  /' ||
      true
  fi
  printf '%-28s %s\n' "test_noalloc" \
    "$(tail -1 "$OUTD/noalloc.log" 2>/dev/null || echo '?'), exit $rc_noalloc"
  grep -E 'cuda allocator calls:|context creation:|SKIP noalloc|^FAIL' "$OUTD/noalloc.log" \
    2>/dev/null | sed 's/^/  /' || true
  echo "bench gpu-step (exit $rc_step):"
  grep -vE '^==' "$OUTD/bench_gpu_step.log" 2>/dev/null | sed 's/^/  /' || true
  echo "bench gpu-gemm (exit $rc_gemm):"
  grep -E 'GEMM-only|^step |FAILED|skipped' "$OUTD/bench_gpu_gemm.log" 2>/dev/null |
    sed 's/^/  /' || true
  echo "PyTorch peer (exit $rc_torch), libdp / PyTorch time per step, 1 replica:"
  "${PY:-python3}" - "$OUTD/bench_gpu_step.log" "$OUTD/bench_torch.log" <<'PYEOF' 2>&1 |
import json, re, sys
ours = {}
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\s*(\d+) \(([\d,]+)\)\s+(yes|no)\s+([\d.]+)", line)
    if m:
        ours[(int(m.group(1)), m.group(3) == "yes")] = float(m.group(4))
peer = None
for line in open(sys.argv[2], errors="replace"):
    if line.startswith("{"):
        peer = json.loads(line)
if not peer:
    print("no PyTorch result (see bench_torch.log)")
    sys.exit(0)
print("torch %s on %s: plain %.3f ms/step, graph %.3f ms/step" % (
    peer["torch"], peer["gpu"], peer["plain_ms"], peer["graph_ms"]))
for graph, key in ((False, "plain_ms"), (True, "graph_ms")):
    if (1, graph) in ours:
        print("%-6s libdp %.3f ms vs PyTorch %.3f ms: ratio %.2f (below 1: libdp faster)" % (
            "graph" if graph else "plain", ours[(1, graph)], peer[key],
            ours[(1, graph)] / peer[key]))
PYEOF
    sed 's/^/  /' || true
  cat "$OUTD/sanitizer.log" 2>/dev/null || echo "compute-sanitizer: not run"
} | tee "$SUM"

bad=""
[ "$brc" = 0 ] || bad="$bad build"
[ "$rc_cuda" = 0 ] || bad="$bad cuda-suite"
[ "$rc_api" = 0 ] || bad="$bad cuda_api-suite"
[ "$rc_eager" = 0 ] || bad="$bad cuda_api-eager"
[ "$rc_fault" = 0 ] || bad="$bad cuda_fault"
[ "$rc_race" = 0 ] || bad="$bad race-stress"
[ "$rc_noalloc" = 0 ] || bad="$bad noalloc"
[ "$rc_step" = 0 ] || bad="$bad bench-gpu-step"
[ "$rc_gemm" = 0 ] || bad="$bad bench-gpu-gemm"
[ "$src" = 0 ] || bad="$bad sanitizer"
[ "$rc_mgpu" = 0 ] || bad="$bad cuda-across-processes"
skipped=$((skip_cuda + skip_api + skip_noalloc + skip_bench))
[ "$skipped" = 0 ] || bad="$bad no-GPU-skips($skipped)"
if [ -n "$bad" ]; then
  echo "run.sh: FAILED:$bad" | tee -a "$SUM"
  exit 1
fi
echo "run.sh: everything passed on the GPU" | tee -a "$SUM"
