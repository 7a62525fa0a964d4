#!/bin/sh
# The installed library as a consumer sees it (.ci/run runs this after `ninja test`):
# `ninja install` into a temporary DESTDIR, then examples/embed.c built from that prefix
# with pkg-config and run, once against dp (the CPU-only link line must be exactly
# -ldp -lm -pthread, with no CUDA library and no forced rpath) and, when the CUDA backend
# is installed, once against dp-cuda with -DEMBED_CUDA.
#   usage: tests/check_install.sh [BUILD_DIR]   (default build)
set -eu
bd=${1:-build}
manifest=build.ninja
[ "$bd" = build ] || manifest=$bd/build.ninja
cc=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check_install: FAILED: $*"; exit 1; }

DESTDIR=$tmp ninja -f "$manifest" install >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "ninja install"; }
pc=$(find "$tmp" -name dp.pc -path '*/lib/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || fail "no dp.pc under the installed prefix"
export PKG_CONFIG_PATH=$(dirname "$pc")
pkc() { pkg-config --define-prefix "$@"; }

libs=$(pkc --libs dp)
# the flags after -L<prefix>/lib: nothing but libdp's own
rest=$(printf '%s\n' $libs | grep -v '^-L' | tr '\n' ' ')
[ "$rest" = "-ldp -lm -pthread " ] ||
  fail "pkg-config --libs dp gives '$libs'; a CPU-only consumer needs -ldp -lm -pthread"
case "$(pkc --libs dp-cuda 2>/dev/null) $libs" in
*rpath*) fail "a .pc file forces an rpath" ;;
esac

$cc -std=c11 -Wall -Wextra -Werror examples/embed.c $(pkc --cflags dp) $libs \
  -o "$tmp/embed" || fail "embed.c does not build against dp"
"$tmp/embed" >"$tmp/embed.out" || { cat "$tmp/embed.out"; fail "embed (dp) exited $?"; }
nm -u "$tmp/embed" | grep -qi 'cuda\|cublas\|nccl' && fail "embed (dp) needs a CUDA symbol"
echo "check_install: dp: built and ran embed.c with: $libs"

if pkc --exists dp-cuda; then
  clibs=$(pkc --libs dp-cuda)
  # the CUDA libraries are found where the .pc says; the run needs the loader to find
  # them too, which is the consumer's business (here: LD_LIBRARY_PATH)
  ldp=$(printf '%s\n' $clibs | sed -n 's/^-L//p' | tr '\n' ':')
  $cc -std=c11 -Wall -Wextra -Werror -DEMBED_CUDA examples/embed.c \
    $(pkc --cflags dp-cuda) $clibs -o "$tmp/embed_cuda" ||
    fail "embed.c does not build against dp-cuda"
  LD_LIBRARY_PATH=$ldp${LD_LIBRARY_PATH:-} "$tmp/embed_cuda" >"$tmp/embed_cuda.out" ||
    { cat "$tmp/embed_cuda.out"; fail "embed (dp-cuda) exited $?"; }
  grep -q "cuda backend registered" "$tmp/embed_cuda.out" ||
    fail "embed (dp-cuda) did not register the CUDA backend"
  echo "check_install: dp-cuda: built and ran embed.c with: $clibs"
else
  echo "check_install: dp-cuda: not installed (a build without nvcc)"
fi

if pkc --exists dp-mpi; then
  mlibs=$(pkc --libs dp-mpi)
  $cc -std=c11 -Wall -Wextra -Werror examples/mpi_train.c $(pkc --cflags dp-mpi) $mlibs \
    -o "$tmp/mpi_train" || fail "examples/mpi_train.c does not build against dp-mpi"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
  mpirun --oversubscribe -np 2 "$tmp/mpi_train" >"$tmp/mpi.out" 2>&1 ||
    { cat "$tmp/mpi.out"; fail "mpirun -np 2 mpi_train (dp-mpi) exited $?"; }
  grep -q "2 ranks x 4 devices" "$tmp/mpi.out" || { cat "$tmp/mpi.out"; fail "mpi_train said"; }
  echo "check_install: dp-mpi: built examples/mpi_train.c with: $mlibs; mpirun -np 2 ran it"
else
  echo "check_install: dp-mpi: not installed (a build without MPI)"
fi
