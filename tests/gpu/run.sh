#!/usr/bin/env bash
# The CUDA backend's GPU check, for a session that is lent a GPU machine (docs/GPU.md).
#
#   tests/gpu/run.sh stage    HERE, before the device call: copies the Check unit-test
#                             library (headers, static libraries) and a pkg-config shim
#                             into .gpu-deps/ (ignored through .git/info/exclude), since
#                             nothing can be installed on the GPU machine.
#   tests/gpu/run.sh          ON THE GPU MACHINE (device `run`, carry [".gpu-deps"],
#                             timeout_s 480): configures with --cuda-arch 90 into build-gpu/,
#                             builds test_dp, test_noalloc and dp with ninja -j16, runs the
#                             cuda and cuda_api suites, the cuda_api suite again under
#                             CUDA_MODULE_LOADING=EAGER, the cuda_fault suite, a race stress
#                             (4 replicas, delayed vs CUDA_LAUNCH_BLOCKING=1; the digits MLP
#                             plain and with graphs, a CNN with sync batchnorm),
#                             test_noalloc, `dp bench gpu-step` and `dp bench gpu-gemm`, the
#                             PyTorch peer, the job across processes (2 GPUs only) and
#                             compute-sanitizer (the backend case; memcheck of the batchnorm
#                             case) when time is left.
#
# Time: every step runs under `timeout`, limited to its own cap and to what is left of one
# budget for the whole run (DP_GPU_BUDGET_S, default 420 s, at most 450 s); a step with
# under 15 s left is not run (a failure). The run ends within about 7.5 minutes.
#
# Output: a device call brings back at most a few files, so every log goes into ONE
# archive, $OUT/gpu-run.tar.gz (folder gpu-run/: configure.log, build.log, cuda_suite.log,
# cuda_api_suite.log, cuda_api_eager.log, cuda_fault.log, race_*.log, noalloc.log,
# bench_gpu_step.log, bench_gpu_gemm.log, bench_torch.log, multi_gpu.log,
# sanitizer_*.log, steps.txt, summary.txt; a log over 2 MiB keeps its first and last MiB),
# written at the end and also when the script stops early (EXIT trap), next to
# $OUT/summary.txt. The summary table is the last thing printed on stdout. OUT defaults to
# /tmp/dp-gpu-out.
#
# Without a GPU (nvidia-smi missing or listing none) configure and the build still run and
# every GPU step is listed as SKIPPED with the reason; the exit status is then 1 (nothing
# was proved). DP_GPU_FORCE=1 runs the GPU steps anyway (they skip or fail on their own:
# for testing this script). DP_GPU_SANITIZE=1 runs the compute-sanitizer steps even when
# less time is left than they usually ask for (still within the budget).
# Exit status: 0 when everything built and passed and nothing skipped for want of a GPU
# (a test that needs 2 GPUs may skip on a one-GPU machine: listed, not a failure); 1
# otherwise.
# shellcheck disable=SC2317 # finish and what it calls run from the EXIT trap
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

START=$(date +%s)
elapsed() { echo $(($(date +%s) - START)); }
TOTAL=${DP_GPU_BUDGET_S:-420}
case "$TOTAL" in '' | *[!0-9]*) TOTAL=420 ;; esac
[ "$TOTAL" -le 450 ] || TOTAL=450 # the device call has about 8 minutes in all
# Seconds a step may take: its own cap, or what is left of the budget; fails (prints
# nothing) when under 15 s are left.
budget() {
  local left=$((TOTAL - $(elapsed)))
  [ "$left" -ge 15 ] || return 1
  [ "$1" -lt "$left" ] && left=$1
  echo "$left"
}

OUTD=${OUT:-/tmp/dp-gpu-out}
mkdir -p "$OUTD"
ARCHIVE=$OUTD/gpu-run.tar.gz
SUMOUT=$OUTD/summary.txt
rm -f "$ARCHIVE" "$SUMOUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dp-gpu-run.XXXXXX")
LOGD=$WORK/gpu-run # every log; archived as gpu-run/ into $ARCHIVE
SCRATCH=$WORK/scratch
mkdir -p "$LOGD" "$SCRATCH"
STEPS=$LOGD/steps.txt
SUM=$LOGD/summary.txt
: >"$STEPS"

# What the summary reads; set by the steps (a step that never ran leaves "-").
brc=- rc_cuda=- rc_api=- rc_eager=- rc_fault=- rc_noalloc=- rc_step=- rc_gemm=- rc_torch=-
rc_mgpu=- warnings=0 NOGPU="" CUDA_OFF="" bad="" ngpu=0 MPI_BIN="" PY="" mgpu_why=""
LAST_RC=- LAST_T=0 STEP_PID="" STEP_LOG=""
fail() { bad="$bad $1"; }
# One row of the step table (steps.txt): NAME SECONDS STATUS
record() { printf '%-46s %5s  %s\n' "$1" "$2" "$3" >>"$STEPS"; }
say() { echo "== $*"; }
count() { # PATTERN FILE...: lines matching (extended regex), 0 where none or no file
  local n
  n=$(cat "${@:2}" 2>/dev/null | grep -cE -- "$1") || true
  echo "${n:-0}"
}

# run_step [--gpu] [--info|--custom] NAME LOG CAP COMMAND...
# Runs COMMAND (`env VAR=... prog args` allowed) under timeout (CAP, or what is left of the
# budget), its output in $LOGD/LOG; LAST_RC its exit status ("skip", "notbuilt", "notime"
# where it did not run), LAST_T its seconds. --gpu: skipped (with the reason) where there
# is no GPU. Default: a non-zero exit fails the run; --info: reported only; --custom: the
# caller records the result (the row and any failure).
run_step() {
  local gpu=0 mode=must name log cap t t0 bin a
  while :; do
    case "$1" in
      --gpu) gpu=1 ;;
      --info) mode=info ;;
      --custom) mode=custom ;;
      *) break ;;
    esac
    shift
  done
  name=$1 log=$2 cap=$3
  shift 3
  LAST_T=0
  bin=""
  for a in "$@"; do
    case "$a" in env | *=*) ;; *) bin=$a && break ;; esac
  done
  if [ "$gpu" = 1 ] && [ -n "$NOGPU" ]; then
    LAST_RC=skip
    say "$name: SKIPPED ($NOGPU)"
    [ "$mode" = custom ] || record "$name" - "SKIPPED ($NOGPU)"
    return 0
  fi
  if ! command -v "$bin" >/dev/null 2>&1; then
    LAST_RC=notbuilt
    echo "run.sh: $bin was not built (or is not on this machine)" >"$LOGD/$log"
    say "$name: FAILED ($bin missing)"
    if [ "$mode" != custom ]; then
      record "$name" - "$([ "$mode" = info ] && echo "not run" || echo FAILED) ($bin missing)"
      [ "$mode" = info ] || fail "$name"
    fi
    return 0
  fi
  if ! t=$(budget "$cap"); then
    LAST_RC=notime
    echo "run.sh: not run: no time left of the ${TOTAL} s budget" >"$LOGD/$log"
    say "$name: not run (no time left of the ${TOTAL} s budget)"
    if [ "$mode" != custom ]; then
      record "$name" - "$([ "$mode" = info ] && echo "not run" || echo FAILED) (no time left)"
      [ "$mode" = info ] || fail "$name"
    fi
    return 0
  fi
  say "$name (at $(elapsed) s, limit $t s) -> $log"
  STEP_LOG=$log STEP=$name
  t0=$(date +%s)
  # in the background, so that a TERM reaches the EXIT trap at once (finish stops the step)
  timeout -k 5 "$t" "$@" >"$LOGD/$log" 2>&1 </dev/null &
  STEP_PID=$!
  wait "$STEP_PID"
  LAST_RC=$?
  STEP_PID=""
  LAST_T=$(($(date +%s) - t0))
  case "$LAST_RC" in
    124 | 137) echo "run.sh: $name: timed out after $t s" >>"$LOGD/$log" ;;
  esac
  [ "$LAST_RC" = 0 ] || tail -3 "$LOGD/$log" | sed 's/^/   | /'
  [ "$mode" = custom ] && return 0
  if [ "$LAST_RC" = 0 ]; then
    record "$name" "$LAST_T" passed
  elif [ "$mode" = info ]; then
    record "$name" "$LAST_T" "exit $LAST_RC (informational)"
  else
    case "$LAST_RC" in
      124 | 137) record "$name" "$LAST_T" "FAILED (timed out after $t s)" ;;
      *) record "$name" "$LAST_T" "FAILED (exit $LAST_RC)" ;;
    esac
    fail "$name"
  fi
  return 0
}

# ---- the summary: details, then the step table, then the verdict (VERDICT_RC) ----
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
suite_counts() { # LABEL SUITE LOG RC
  local suite=$2 log=$3
  [ -e "$log" ] || return 0
  printf '%-28s %4d passed (%d of them skipped, %d for want of a GPU), %d failed, %d errors; exit %s\n' \
    "suite $1" "$(count '^[^:]+:[0-9]+:P:' "$log")" "$(count "^SKIP $suite:" "$log")" \
    "$(count "^SKIP $suite: [^:]+: no GPU" "$log")" "$(count '^[^:]+:[0-9]+:F:' "$log")" \
    "$(count '^[^:]+:[0-9]+:E:' "$log")" "$4"
}
L() { echo "$LOGD/$1"; }
render_summary() {
  local commit skipped
  echo "== summary (tests/gpu/run.sh, $(elapsed) s of a ${TOTAL} s budget)"
  if [ -n "$NOGPU" ]; then
    echo "GPU: none (${NOGPU#no GPU: })"
  else
    head -1 "$(L nvidia-smi.log)" 2>/dev/null || true
    sed -n '/^name, driver_version/{n;s/^/name, driver, memory, max SM clock: /;p;q}' \
      "$(L nvidia-smi.log)" 2>/dev/null || true
  fi
  if commit=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD 2>/dev/null || commit="$commit with local changes"
  else
    commit="? (no git here)"
  fi
  echo "commit $commit"
  [ -n "$CUDA_OFF" ] && echo "configure: CUDA off: $CUDA_OFF"
  echo "build: exit $brc, $warnings warning line(s)"
  suite_rows cuda "$(L cuda_suite.log)" || true
  suite_rows cuda_api "$(L cuda_api_suite.log)" || true
  grep -E '^cuda: .* match the cpu backend' "$(L cuda_suite.log)" 2>/dev/null |
    sed 's/^cuda: /ops: /' || true
  grep -E '^cuda: .*(bit for bit for 1, 2, 4|as graph replays: bit-identical)' \
    "$(L cuda_suite.log)" 2>/dev/null | sed 's/^cuda: /bits: /' || true
  grep -hE '^TIMING ' "$(L cuda_suite.log)" "$(L cuda_api_suite.log)" 2>/dev/null |
    sed 's/^TIMING /timing: /' || true
  grep -hE '^NOTE ' "$(L cuda_suite.log)" "$(L cuda_api_suite.log)" 2>/dev/null || true
  echo
  suite_counts cuda cuda "$(L cuda_suite.log)" "$rc_cuda"
  suite_counts cuda_api cuda_api "$(L cuda_api_suite.log)" "$rc_api"
  suite_counts "cuda_api EAGER" cuda_api "$(L cuda_api_eager.log)" "$rc_eager"
  suite_counts cuda_fault cuda_fault "$(L cuda_fault.log)" "$rc_fault"
  cat "$(L race.log)" 2>/dev/null || true
  if [ -n "$mgpu_why" ]; then
    printf '%-28s %s\n' "cuda across processes" "SKIPPED ($mgpu_why)"
  elif [ "$rc_mgpu" != - ]; then
    printf '%-28s exit %s\n' "cuda across processes" "$rc_mgpu"
    grep -hE '^(test_cuda_mpi_gpu|rank [0-9]+: FAIL)' "$LOGD"/multi_gpu_*.log 2>/dev/null |
      sed 's/^/  /' || true
  fi
  if [ -e "$(L noalloc.log)" ]; then
    printf '%-28s %s\n' "test_noalloc" "$(tail -1 "$(L noalloc.log)"), exit $rc_noalloc"
    grep -E 'cuda allocator calls:|context creation:|SKIP noalloc|^FAIL' "$(L noalloc.log)" \
      2>/dev/null | sed 's/^/  /' || true
  fi
  if [ -e "$(L bench_gpu_step.log)" ]; then
    echo "bench gpu-step (exit $rc_step):"
    grep -vE '^==' "$(L bench_gpu_step.log)" | head -20 | sed 's/^/  /' || true
  fi
  if [ -e "$(L bench_gpu_gemm.log)" ]; then
    echo "bench gpu-gemm (exit $rc_gemm):"
    grep -E 'GEMM-only|^step |FAILED|skipped' "$(L bench_gpu_gemm.log)" | head -20 |
      sed 's/^/  /' || true
  fi
  if [ -n "$PY" ] && [ -e "$(L bench_torch.log)" ] && [ -e "$(L bench_gpu_step.log)" ]; then
    echo "PyTorch peer (exit $rc_torch), libdp / PyTorch time per step, 1 replica:"
    timeout -k 2 20 "$PY" - "$(L bench_gpu_step.log)" "$(L bench_torch.log)" <<'PYEOF' 2>&1 |
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
  fi
  cat "$(L sanitizer.log)" 2>/dev/null || true
  echo
  printf '%-46s %5s  %s\n' step secs result
  cat "$STEPS"

  # the verdict
  skipped=$(($(count '^SKIP cuda: [^:]+: no GPU' "$(L cuda_suite.log)") +
    $(count '^SKIP cuda_api: [^:]+: no GPU' "$(L cuda_api_suite.log)") +
    $(count '^SKIP cuda_api: [^:]+: no GPU' "$(L cuda_api_eager.log)") +
    $(count '^SKIP cuda_fault: [^:]+: no GPU' "$(L cuda_fault.log)") +
    $(count '^SKIP noalloc' "$(L noalloc.log)") +
    $(count 'skipped, no GPU' "$(L bench_gpu_step.log)" "$(L bench_gpu_gemm.log)")))
  [ "$skipped" = 0 ] || fail "no-GPU-skips($skipped)"
  VERDICT_RC=1
  if [ -n "${STOPPED:-}" ]; then
    echo "run.sh: STOPPED EARLY: $STOPPED; failed so far:${bad:- nothing}"
  elif [ -n "$bad" ]; then
    echo "run.sh: FAILED:$bad${NOGPU:+ (and $NOGPU)}"
  elif [ -n "$NOGPU" ]; then
    echo "run.sh: NOT RUN ON A GPU ($NOGPU): the build ran, every GPU step skipped"
  else
    echo "run.sh: everything passed on the GPU"
    VERDICT_RC=0
  fi
}

# Logs over 2 MiB keep their first and last MiB (a file that comes back is at most 16 MiB).
cap_logs() { # BYTES
  local f half=$(($1 / 2))
  for f in "$LOGD"/*; do
    if [ ! -f "$f" ] || [ "$(stat -c %s "$f")" -le "$1" ]; then continue; fi
    { head -c "$half" "$f"; printf '\n[... run.sh: cut to the first and last %d bytes ...]\n' \
      "$half"; tail -c "$half" "$f"; } >"$f.cut" && mv "$f.cut" "$f"
  done
}
FINISHED=""
finish() { # the EXIT trap: summary, archive, the table last
  local rc=$? cap note=""
  set +e
  [ -n "$FINISHED" ] && return
  FINISHED=1
  trap - INT TERM
  if [ -n "${STEP_PID:-}" ]; then # stopped during a step: end it (timeout passes TERM on)
    kill -TERM "$STEP_PID" 2>/dev/null
    wait "$STEP_PID" 2>/dev/null
    echo "run.sh: stopped during this step" >>"$LOGD/${STEP_LOG:-stopped.log}"
  fi
  if [ -z "${DONE:-}" ]; then
    STOPPED="exit $rc at $(elapsed) s, during: ${STEP:-setup}"
  fi
  render_summary >"$SUM" 2>&1
  cp "$SUM" "$SUMOUT"
  for cap in 2097152 262144; do
    cap_logs "$cap"
    tar -czf "$ARCHIVE" -C "$WORK" gpu-run 2>"$SCRATCH/tar.err" || note="could not write"
    [ -z "$note" ] && [ "$(stat -c %s "$ARCHIVE")" -le 15728640 ] && break
  done
  if [ -n "$note" ] || [ ! -s "$ARCHIVE" ]; then
    note="run.sh: archive: could not write $ARCHIVE: $(head -c 300 "$SCRATCH/tar.err")"
  else
    note="archive: $ARCHIVE ($(stat -c %s "$ARCHIVE") bytes, $(tar -tzf "$ARCHIVE" | grep -vc '/$') files), summary: $SUMOUT"
  fi
  # the archive line goes before the verdict, which stays the last line
  { sed '$d' "$SUM"; echo "$note"; tail -1 "$SUM"; } >"$SUMOUT"
  echo
  cat "$SUMOUT"
  rm -rf "$WORK"
  if [ -n "${STOPPED:-}" ]; then
    [ "$rc" = 0 ] && rc=1
    exit "$rc"
  fi
  exit "$VERDICT_RC"
}
trap finish EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# ---- the machine ----
STEP="nvidia-smi"
ngpu=0
if ! command -v nvidia-smi >/dev/null; then
  NOGPU="no GPU: nvidia-smi is not on this machine"
else
  timeout -k 2 20 nvidia-smi -L >"$(L nvidia-smi.log)" 2>&1 || true
  timeout -k 2 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
    --format=csv >>"$(L nvidia-smi.log)" 2>&1 || true
  ngpu=$(count '^GPU [0-9]+:' "$(L nvidia-smi.log)")
  [ "$ngpu" -gt 0 ] ||
    NOGPU="no GPU: nvidia-smi lists none ($(head -1 "$(L nvidia-smi.log)" | cut -c1-60))"
fi
if [ -n "$NOGPU" ] && [ "${DP_GPU_FORCE:-0}" = 1 ]; then
  say "$NOGPU; DP_GPU_FORCE=1: running the GPU steps anyway"
  echo "DP_GPU_FORCE=1: GPU steps run without a GPU ($NOGPU)" >>"$(L nvidia-smi.log)"
  record "GPU" - "none (${NOGPU#no GPU: }), DP_GPU_FORCE=1"
  fail "no-GPU"
  NOGPU=""
elif [ -n "$NOGPU" ]; then
  say "$NOGPU: configure and build only; every GPU step is skipped"
  echo "$NOGPU" >>"$(L nvidia-smi.log)"
  record "GPU" - "none (${NOGPU#no GPU: })"
else
  say "GPU: $(head -1 "$(L nvidia-smi.log)")"
  record "GPU" - "$ngpu: $(head -1 "$(L nvidia-smi.log)" | cut -c1-60)"
fi

# No network there: an apt-get that fails at once keeps configure.py from trying.
mkdir -p "$SCRATCH/shim"
printf '#!/bin/sh\necho "apt-get: offline (tests/gpu/run.sh)" >&2\nexit 1\n' >"$SCRATCH/shim/apt-get"
chmod +x "$SCRATCH/shim/apt-get"
export PATH="$SCRATCH/shim:$PATH"
STEP="Check library"
if ! { command -v pkg-config >/dev/null && pkg-config --exists check; }; then
  if [ -x .gpu-deps/bin/pkg-config ]; then
    export PATH="$ROOT/.gpu-deps/bin:$PATH"
    say "Check from .gpu-deps (tests/gpu/run.sh stage)"
  else
    echo "run.sh: no Check library here and no .gpu-deps/: run 'tests/gpu/run.sh stage' on" \
      "the build machine and carry .gpu-deps" >&2
    record "Check library" - "FAILED (no Check and no .gpu-deps/: run 'tests/gpu/run.sh stage')"
    fail "Check-library"
    exit 1
  fi
fi

# cuBLAS: configure.py wants $CUDA_HOME/lib64/libcublas.so. The system toolkit's comes first.
# Where the toolkit lacks it (or has only libcublas.so.N), give configure.py a CUDA_HOME of
# links, build-gpu-cudahome/ (ignored, a stable path for the build's rpath): the toolkit's
# files first, then, for names the toolkit lacks, a Python wheel's cuBLAS: CUDA 13 wheels
# install it under site-packages/nvidia/cu13/{lib,include} (lib/libcublas.so.13), CUDA 12
# ones under site-packages/nvidia/cublas/{lib,include}; both are searched, the layout of
# nvcc's major version first. nvcc (which finds CUDA's own headers where it really is) gets
# -I of the links' include/. (Only tried without a GPU: the lent machine's toolkit is
# expected to have cuBLAS.)
STEP="cuBLAS"
CH=${CUDA_HOME:-/usr/local/cuda}
cublas_from="$CH/lib64/libcublas.so"
if [ ! -e "$CH/lib64/libcublas.so" ]; then
  wd=""
  if ! ls "$CH"/lib64/libcublas.so.[0-9]* >/dev/null 2>&1; then
    cumajor=$(timeout -k 2 20 "$CH/bin/nvcc" --version 2>/dev/null |
      sed -n 's/.*release \([0-9]*\)\..*/\1/p' | head -1) || true
    wd=$(timeout -k 2 20 python3 - "${cumajor:-13}" 2>/dev/null <<'PYEOF' || true
import os, site, sys
major = sys.argv[1]
roots = []
try:
    import nvidia  # a namespace package: every wheel's folder
    roots += list(nvidia.__path__)
except Exception:
    pass
dirs = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
roots += [os.path.join(d, "nvidia") for d in dirs if d]
layouts = ["cu" + major, "cublas"] if major != "12" else ["cublas", "cu" + major]
for sub in layouts:
    for r in roots:
        lib = os.path.join(r, sub, "lib")
        if os.path.exists(os.path.join(lib, "libcublas.so." + major)):
            print(os.path.join(r, sub))
            sys.exit(0)
PYEOF
    )
  fi
  if [ -n "$wd" ] || ls "$CH"/lib64/libcublas.so.[0-9]* >/dev/null 2>&1; then
    FH=$ROOT/build-gpu-cudahome
    rm -rf "$FH"
    mkdir -p "$FH"
    for f in "$CH"/*; do ln -s "$f" "$FH/"; done
    rm -f "$FH/include" "$FH/lib64"
    mkdir "$FH/include" "$FH/lib64"
    # the toolkit's files first; the wheel's only for names the toolkit lacks
    for f in "$CH"/include/* ${wd:+"$wd"/include/*}; do
      if [ -e "$f" ] && [ ! -e "$FH/include/${f##*/}" ]; then ln -s "$f" "$FH/include/"; fi
    done
    for f in "$CH"/lib64/* ${wd:+"$wd"/lib/*}; do
      if [ -e "$f" ] && [ ! -e "$FH/lib64/${f##*/}" ]; then ln -s "$f" "$FH/lib64/"; fi
    done
    for f in "$FH"/lib64/libcublas.so.* "$FH"/lib64/libcublasLt.so.*; do
      b=${f##*/}
      if [ -e "$f" ] && [ ! -e "$FH/lib64/${b%%.so.*}.so" ]; then
        ln -s "$f" "$FH/lib64/${b%%.so.*}.so"
      fi
    done
    export CUDA_HOME=$FH NVCC="${NVCC:-$CH/bin/nvcc} -I$FH/include"
    cublas_from="${wd:-$CH/lib64} (links in $FH)"
  else
    cublas_from="none found ($CH/lib64, site-packages/nvidia/cu13 and nvidia/cublas)"
  fi
fi
say "cuBLAS: $cublas_from"
echo "cuBLAS: $cublas_from" >"$(L cublas.log)"
record "cuBLAS" - "$cublas_from"

# ---- configure and build ----
STEP="configure"
set +e # from here on every step runs, whatever failed before; the table says what
# -lineinfo: compute-sanitizer names source lines (no effect on the code generated)
run_step --custom "configure (--cuda-arch 90, build-gpu/)" configure.log 90 \
  env NVCC="${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc} -lineinfo" \
  ./configure.py --no-install --cuda-arch 90 --builddir build-gpu
crc=$LAST_RC
if [ "$crc" = notime ]; then
  CUDA_OFF="configure.py not run (no time left)"
elif [ "$crc" != 0 ]; then
  CUDA_OFF="configure.py failed (exit $crc, see configure.log)"
elif ! grep -q '^  CUDA        on' "$(L configure.log)"; then
  CUDA_OFF=$(grep -m1 '^  CUDA ' "$(L configure.log)" | sed 's/^  CUDA *//')
  CUDA_OFF="${CUDA_OFF:-no CUDA line in configure.log}: no GPU backend to test"
fi
if [ -n "$CUDA_OFF" ]; then
  record "configure (--cuda-arch 90, build-gpu/)" "$LAST_T" "FAILED ($CUDA_OFF)"
  fail configure
  say "configure: $CUDA_OFF"
else
  record "configure (--cuda-arch 90, build-gpu/)" "$LAST_T" "passed (CUDA on, $(grep -m1 \
    '^  CUDA        on' "$(L configure.log)" | grep -oE 'nvcc [0-9.]+' | head -1))"
fi

STEP="build"
# the job across processes on real GPUs, where configure.py found MPI here
grep -q 'build build-gpu/test_cuda_mpi_gpu:' build-gpu/build.ninja 2>/dev/null &&
  MPI_BIN=build-gpu/test_cuda_mpi_gpu
if [ -z "$CUDA_OFF" ]; then
  # shellcheck disable=SC2086 # MPI_BIN: empty or one word
  run_step "build (ninja -j16${MPI_BIN:+, with test_cuda_mpi_gpu})" \
    build.log 240 ninja -j16 \
    -f build-gpu/build.ninja build-gpu/test_dp build-gpu/test_noalloc build-gpu/dp $MPI_BIN
  brc=$LAST_RC
  warnings=$(count 'warning' "$(L build.log)")
else
  record "build" - "not run (configure failed)"
fi

# ---- the GPU steps ----
export CK_VERBOSITY=verbose
STEP="cuda suite"
run_step --gpu "cuda suite" cuda_suite.log 200 build-gpu/test_dp cuda
rc_cuda=$LAST_RC
STEP="cuda_api suite"
run_step --gpu "cuda_api suite" cuda_api_suite.log 150 build-gpu/test_dp cuda_api
rc_api=$LAST_RC
# The same suite (graphs included) with every module loaded up front, as opposed to
# lazily (the default since CUDA 12.2; the backend preloads its own kernels either way).
STEP="cuda_api EAGER"
run_step --gpu "cuda_api suite, CUDA_MODULE_LOADING=EAGER" cuda_api_eager.log 120 \
  env CUDA_MODULE_LOADING=EAGER build-gpu/test_dp cuda_api
rc_eager=$LAST_RC
# A device fault (DP_CUDA_DEBUG_FAULT_STEP) must end its step in DP_ERR_BACKEND within 30 s
# and dp_ctx_free must return; on its own: the fault leaves the CUDA context unusable.
STEP="cuda_fault suite"
run_step --gpu "cuda_fault suite" cuda_fault.log 90 build-gpu/test_dp cuda_fault
rc_fault=$LAST_RC

# Race stress: 4 replicas on GPU 0, about 200 steps of the digits MLP, with a spin in a
# rotating replica's every stage (DP_CUDA_DEBUG_DELAY_US), plain and with graphs; the
# parameter hash must equal that of a run with CUDA_LAUNCH_BLOCKING=1 (no concurrency at
# all). A missing cross-stream edge would let one replica read another's data early.
# Each run has its own log and timeout and must exit 0; its hash is read from its own log.
race_pair() { # LABEL DP-TRAIN-ARGS...
  local label=$1 tag mode envv log h h_delayed="" h_serialised="" why="" out="" secs=0
  shift
  tag=${label// /_}
  for mode in delayed serialised; do
    case "$mode" in
      delayed) envv=DP_CUDA_DEBUG_DELAY_US=200 ;;
      *) envv=CUDA_LAUNCH_BLOCKING=1 ;;
    esac
    log=race_${tag}_$mode.log
    run_step --gpu --custom "race $label, $mode" "$log" 60 env "$envv" build-gpu/dp train \
      --data data/digits.csv --batch 64 --optimizer adamw --lr 0.003 --backend cuda \
      --devices 0,0,0,0 "$@"
    if [ "$LAST_RC" = skip ]; then
      record "race $label" - "SKIPPED ($NOGPU)"
      return 0
    fi
    secs=$((secs + LAST_T))
    h=""
    case "$LAST_RC" in
      0)
        h=$(grep -m1 -oE 'parameter hash: [0-9a-f]+' "$(L "$log")" | sed 's/.*: //')
        [ -n "$h" ] || why="$why; $mode: exit 0 but no 'parameter hash:' line in $log"
        ;;
      124 | 137) why="$why; $mode: timed out" ;;
      notbuilt) why="$why; $mode: dp not built" ;;
      notime) why="$why; $mode: not run, no time left" ;;
      *) why="$why; $mode: exit $LAST_RC" ;;
    esac
    if [ "$mode" = delayed ]; then h_delayed=$h; else h_serialised=$h; fi
    out="$out, $mode ${h:-(no hash)} (exit $LAST_RC, $LAST_T s)"
  done
  if [ -z "$why" ] && [ "$h_delayed" != "$h_serialised" ]; then
    why="; the hashes differ"
  fi
  echo "race $label:${out#,}${why:+: FAILED (${why#; })}" >>"$(L race.log)"
  if [ -z "$why" ]; then
    record "race $label" "$secs" "passed (same hash, $h_delayed)"
  else
    record "race $label" "$secs" "FAILED (${why#; })"
    fail "race-${tag}"
  fi
}
STEP="race stress"
race_pair plain --model examples/digits.dpm --epochs 9
race_pair graph --model examples/digits.dpm --epochs 9 --graph
# Sync batchnorm: the statistics' trees cross the replicas in the middle of the forward
# and of the backward (cuda/batchnorm.cu); a conv + 2d and 1d batchnorm model on the
# digits, micro-batches of 8 (merges within a replica too), plain steps.
printf '%s\n' 'input 1 8 8' 'conv2d 8 3 padding 1' batchnorm relu 'maxpool2d 2' flatten \
  'linear 32' batchnorm relu 'linear 10' 'loss softmax_cross_entropy' >"$SCRATCH/bn.dpm"
race_pair "sync batchnorm" --model "$SCRATCH/bn.dpm" --epochs 3 --batchnorm sync \
  --micro-batch 8

STEP="test_noalloc"
run_step --gpu "test_noalloc" noalloc.log 90 build-gpu/test_noalloc
rc_noalloc=$LAST_RC
STEP="bench gpu-step"
run_step --gpu "dp bench gpu-step" bench_gpu_step.log 60 build-gpu/dp bench gpu-step
rc_step=$LAST_RC
STEP="bench gpu-gemm"
run_step --gpu "dp bench gpu-gemm" bench_gpu_gemm.log 60 build-gpu/dp bench gpu-gemm
rc_gemm=$LAST_RC
# The peer, in the same run: PyTorch on the same model, batch, optimizer and precision.
# Informational: a machine without PyTorch's CUDA is not a failure of libdp.
STEP="PyTorch peer"
PY=$(command -v python3 || true)
run_step --gpu --info "PyTorch peer (bench/torch_gpu_step.py)" bench_torch.log 90 \
  "${PY:-python3}" bench/torch_gpu_step.py
rc_torch=$LAST_RC

# The cuda backend across processes (docs/DISTRIBUTED.md): tests/mpi/test_mpi.c's job,
# one GPU per replica, under mpirun, against the same job in one process, bit for bit
# (refusals, injected faults at every cross-rank copy, checkpoints both ways). Needs two
# GPUs and Open MPI on this machine: otherwise listed as skipped, with the reason.
STEP="cuda across processes"
if [ -n "$NOGPU" ]; then
  mgpu_why=$NOGPU
elif [ "${ngpu:-0}" -lt 2 ]; then
  mgpu_why="needs 2 GPUs, this machine has ${ngpu:-0}"
elif ! command -v mpirun >/dev/null; then
  mgpu_why="no mpirun on this machine"
elif [ -z "$MPI_BIN" ] || [ ! -x "$MPI_BIN" ]; then
  mgpu_why="test_cuda_mpi_gpu not built (configure.py found no MPI)"
fi
if [ -n "$mgpu_why" ]; then
  record "cuda across processes" - "SKIPPED ($mgpu_why)"
else
  rc_mgpu=0
  mkdir -p "$SCRATCH/mpi"
  for layout in 2x1 2x2 4x1; do
    np=${layout%x*} per=${layout#*x} devs=$((np * per))
    [ "$devs" -le "$ngpu" ] || continue
    run_step --gpu "cuda across processes, $layout" "multi_gpu_$layout.log" 60 \
      env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DP_TEST_DEVICES=$devs \
      mpirun --oversubscribe --bind-to none -np "$np" "$MPI_BIN" "$SCRATCH/mpi"
    [ "$LAST_RC" = 0 ] || rc_mgpu=1
  done
fi

# compute-sanitizer: memcheck, synccheck and initcheck over the backend test case, in one
# process (CK_FORK=no: the tool follows no fork), on the -lineinfo build. Slow: only with
# DP_GPU_SANITIZE=1, or when time is left. It runs with --error-exitcode 97: exit 97 (the
# tool found errors) fails the run; any other non-zero exit is the program's own status
# (e.g. the tool refused the device, as on gVisor machines, or the case failed or timed
# out) and is reported, not counted as a sanitizer failure.
SAN_RC=97
sanitize() { # NAME LOG CASE TOOL
  local name=$1 log=$2 n st
  run_step --gpu --custom "$name" "$log" 100 env CK_FORK=no CK_RUN_CASE="$3" \
    CK_DEFAULT_TIMEOUT=600 compute-sanitizer --tool "$4" --error-exitcode "$SAN_RC" \
    build-gpu/test_dp cuda
  n=$(grep -m1 -oE 'ERROR SUMMARY: [0-9]+' "$(L "$log")" 2>/dev/null | grep -oE '[0-9]+$')
  case "$LAST_RC" in
    0) st="passed (${n:-0} errors)" ;;
    "$SAN_RC")
      st="FAILED (compute-sanitizer found ${n:-?} errors)"
      fail "sanitizer-$4"
      ;;
    124 | 137) st="not finished: timed out (the program under the tool; not a sanitizer failure)" ;;
    notime) st="not run (no time left)" ;;
    notbuilt) st="not run (test_dp not built)" ;;
    *)
      st="the program failed (exit $LAST_RC; not a sanitizer failure)"
      grep -q 'Device not supported' "$(L "$log")" 2>/dev/null &&
        st="$st: compute-sanitizer: Device not supported on this machine"
      ;;
  esac
  record "$name" "$LAST_T" "$st"
  echo "compute-sanitizer $4 ($3): $st" >>"$(L sanitizer.log)"
}
STEP="compute-sanitizer"
if [ -n "$NOGPU" ]; then
  record "compute-sanitizer" - "SKIPPED ($NOGPU)"
elif ! command -v compute-sanitizer >/dev/null; then
  record "compute-sanitizer" - "SKIPPED (no compute-sanitizer on this machine)"
  echo "compute-sanitizer: not run (not on this machine)" >>"$(L sanitizer.log)"
elif [ ! -x build-gpu/test_dp ]; then
  record "compute-sanitizer" - "not run (test_dp not built)"
else
  for tool in memcheck synccheck initcheck; do
    left=$((TOTAL - $(elapsed)))
    if [ "${DP_GPU_SANITIZE:-0}" = 1 ] || [ "$left" -gt 150 ]; then
      sanitize "compute-sanitizer $tool, gpu_backend" "sanitizer_$tool.log" gpu_backend "$tool"
    else
      record "compute-sanitizer $tool, gpu_backend" - "not run (only $left s left)"
      echo "compute-sanitizer $tool (gpu_backend): not run (only $left s left)" >>"$(L sanitizer.log)"
    fi
  done
  # the batchnorm kernels (cuda/batchnorm.cu): memcheck, when time is still left
  left=$((TOTAL - $(elapsed)))
  if [ "${DP_GPU_SANITIZE:-0}" = 1 ] || [ "$left" -gt 60 ]; then
    sanitize "compute-sanitizer memcheck, gpu_batchnorm" sanitizer_memcheck_bn.log \
      gpu_batchnorm memcheck
  else
    record "compute-sanitizer memcheck, gpu_batchnorm" - "not run (only $left s left)"
  fi
fi

STEP="summary"
DONE=1
exit 0 # the EXIT trap (finish) writes the summary and the archive, prints the table last
