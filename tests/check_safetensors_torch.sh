#!/bin/sh
# libdp <-> PyTorch through safetensors files: tests/fixtures/golden/safetensors_roundtrip.py
# against BUILD_DIR/libdp.a (torch -> libdp import and forward, libdp training and
# export -> torch load_state_dict(strict=True) and forward, torch's own training).
#   usage: tests/check_safetensors_torch.sh [BUILD_DIR]   (default build)
# The Python is $PYTHON when set, else the first of /usr/bin/python3 (Debian's
# python3-torch) and python3 that imports torch. Without torch the check is
# skipped, visibly ("SKIP safetensors_torch: ..."), and passes; any other
# failure fails it. Where the safetensors package is importable the check runs
# twice: with it, and with the script's own reader and writer (DP_ST_BY_HAND=1).
# Then tests/fixtures/golden/pytorch_export.py: dp export --pytorch's source.
set -u
cd "$(dirname "$0")/.." || exit 1
bd=${1:-build}
py=${PYTHON:-}
if [ -z "$py" ]; then
  for cand in /usr/bin/python3 python3; do
    if "$cand" -c 'import torch, numpy' >/dev/null 2>&1; then
      py=$cand
      break
    fi
  done
  [ -n "$py" ] || py=python3 # reports the SKIP itself
fi
out=$("$py" tests/fixtures/golden/safetensors_roundtrip.py "$bd" 2>&1)
rc=$?
printf '%s\n' "$out"
# With the safetensors package there, once more without it (the script's own
# reader and writer, as on a machine with Debian's torch alone: DP_ST_BY_HAND).
if [ $rc = 0 ] && "$py" -c 'import safetensors' >/dev/null 2>&1; then
  echo "check_safetensors_torch: again, the files read and written by hand"
  out=$(DP_ST_BY_HAND=1 "$py" tests/fixtures/golden/safetensors_roundtrip.py "$bd" 2>&1)
  rc=$?
  printf '%s\n' "$out"
fi
# dp export --pytorch: the model as PyTorch source, its forward against libdp's
if [ $rc = 0 ]; then
  out=$("$py" tests/fixtures/golden/pytorch_export.py "$bd" 2>&1)
  rc=$?
  printf '%s\n' "$out"
fi
case $rc in
0) echo "check_safetensors_torch: passed" ;;
77)
  why=$(printf '%s\n' "$out" | sed -n 's/^SKIP: //p' | head -n 1)
  echo "SKIP safetensors_torch: ${why:-torch is not available}"
  exit 0
  ;;
*)
  echo "check_safetensors_torch: FAILED (exit $rc)"
  exit 1
  ;;
esac
