#!/usr/bin/env bash
# The CUDA backend's GPU check, for a session that is lent a GPU machine (docs/GPU.md).
#
#   tests/gpu/run.sh stage    HERE, before the device call: copies the Check unit-test
#                             library (headers, static libraries) and a pkg-config shim
#                             into .gpu-deps/ (ignored through .git/info/exclude), since
#                             nothing can be installed on the GPU machine.
#   tests/gpu/run.sh          ON THE GPU MACHINE (device `run`, carry [".gpu-deps"]):
#                             configures with --cuda-arch 90 into build-gpu/, builds
#                             build-gpu/test_dp, runs the cuda suite, prints a table last.
#                             Under 8 minutes; about 2 expected (not yet measured).
#
# Environment: OUT (a folder whose files come back; default /tmp/dp-gpu-out) gets
# build.log, cuda_suite.log and summary.txt. DP_GPU_SANITIZE=1 also runs the backend
# test case under compute-sanitizer memcheck (slow; only where the runtime supports it).
# Exit status: 0 when the suite passed with no test skipped, 1 otherwise.
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
BLOG=$OUTD/build.log
TLOG=$OUTD/cuda_suite.log
SUM=$OUTD/summary.txt
START=$(date +%s)
elapsed() { echo $(($(date +%s) - START)); }

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
./configure.py --cuda-arch 90 --builddir build-gpu 2>&1 | tee "$BLOG"
if ! grep -q '^  CUDA        on' "$BLOG"; then
  echo "run.sh: configure.py turned CUDA off (see above): no GPU backend to test" >&2
  exit 1
fi
echo "== build ($(elapsed) s)"
ninja -f build-gpu/build.ninja build-gpu/test_dp 2>&1 | tee -a "$BLOG"
warnings=$(grep -c -i 'warning' "$BLOG" || true)

echo "== cuda suite ($(elapsed) s)"
set +e
CK_VERBOSITY=verbose build-gpu/test_dp cuda 2>&1 | tee "$TLOG"
rc=${PIPESTATUS[0]}
set -e

src=0
if [ "${DP_GPU_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer memcheck, test case gpu_backend ($(elapsed) s)"
  set +e
  CK_RUN_CASE=gpu_backend CK_DEFAULT_TIMEOUT=600 CK_TIMEOUT_MULTIPLIER=10 \
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 build-gpu/test_dp cuda \
    2>&1 | tee "$OUTD/sanitizer.log" | tail -20
  src=${PIPESTATUS[0]}
  set -e
fi

# ---- the table, last ----
{
  echo
  echo "== summary (tests/gpu/run.sh, $(elapsed) s)"
  nvidia-smi -L 2>/dev/null | head -1 || true
  printf '%-62s %s\n' "test" "result"
  grep -E '^[^:]+:[0-9]+:[PFE]:' "$TLOG" | while IFS=: read -r _ _ res tcase test _; do
    case "$res" in P) r=passed ;; F) r=FAILED ;; *) r=ERROR ;; esac
    if grep -q "^SKIP cuda: $test:" "$TLOG"; then r="SKIPPED (no GPU?)"; fi
    printf '%-62s %s\n' "$tcase/$test" "$r"
  done
  echo
  grep -E '^cuda: .* match the cpu backend' "$TLOG" | sed 's/^cuda: /ops: /' || true
  grep -E '^TIMING ' "$TLOG" | sed 's/^TIMING /timing: /' || true
  grep -E '^NOTE ' "$TLOG" || true
  echo "build warnings: $warnings"
  grep -E '^[0-9]+%: Checks' "$TLOG" || echo "no Check summary line (the suite crashed?)"
  [ "$src" = 0 ] || echo "compute-sanitizer: exit $src (see sanitizer.log)"
} | tee "$SUM"

skipped=$(grep -c '^SKIP cuda:' "$TLOG" || true)
if [ "$rc" != 0 ] || [ "$skipped" != 0 ] || [ "$src" != 0 ]; then
  echo "run.sh: FAILED (suite exit $rc, $skipped skipped, sanitizer exit $src)"
  exit 1
fi
echo "run.sh: all cuda tests passed on the GPU"
