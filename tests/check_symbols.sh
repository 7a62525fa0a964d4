#!/bin/sh
# tests/check_symbols.sh LIB.a...: fails, listing them, when an archive defines a global
# symbol whose name does not start with dp_ (the API in include/dp.h) or dp__ (internal,
# shared between the library's files). Run by `ninja test` over build/libdp.a (and any
# other archive a consumer links: list it in configure.py's `checks`).
#
# Every defined global counts, whatever its kind (T, D, B, R, V, W, u, ...): a weak or
# unique symbol takes part in the consumer's link as much as a strong one. C++ names
# from cuda/*.cu are demangled first, so `dp__cuda_host_step(cuda_ctx*, unsigned long)`
# and `dp_cuda_device_scope::enter(int)` pass and `k_add(float*, ...)` does not.
#
# What nvcc and g++ may put into our objects by themselves, as reviewed with nvcc 13.0
# (whole-program mode, no -rdc): the fatbinary wrapper (__fatbinwrap_*), the
# registration functions (__cudaRegisterLinkedBinary_*, only under -rdc) and the static
# initialisers (_GLOBAL__sub_I_*) are local symbols; anonymous namespaces become named
# _GLOBAL__N_* ones, so their out-of-line inline functions would be global weak symbols
# (cuda/ has none out of line); __device_stub__* functions are global unless the kernel
# is static (every kernel is); g++'s DW.ref.__gxx_personality_v0 is not emitted under
# -fno-exceptions (configure.py's nvcc flags). None of them is allowed here: ALLOW stays
# empty unless one cannot be avoided, with the reason next to it.
ALLOW='^$'

set -eu
[ $# -ge 1 ] || { echo "usage: tests/check_symbols.sh LIB.a..." >&2; exit 2; }
NM=${NM:-nm}
command -v "$NM" >/dev/null || { echo "check_symbols: no $NM (binutils)" >&2; exit 2; }
if command -v c++filt >/dev/null; then FILT=c++filt; else FILT=cat; fi

status=0
for lib in "$@"; do
  [ -f "$lib" ] || { echo "check_symbols: no such file: $lib" >&2; exit 2; }
  # nm -A -P: "ARCHIVE[MEMBER]: NAME TYPE VALUE SIZE", one symbol a line.
  syms=$("$NM" -A -P -g --defined-only "$lib") ||
    { echo "check_symbols: $NM failed on $lib" >&2; exit 2; }
  total=$(printf '%s\n' "$syms" | grep -c . || true)
  bad=$(printf '%s\n' "$syms" | awk 'NF >= 3 { m = $1; sub(/^.*\[/, "", m); sub(/\]:$/, "", m);
                                                 print m " " $3 " " $2 }' |
    $FILT | awk -v allow="$ALLOW" '{
      member = $1; type = $2; name = $0; sub(/^[^ ]+ [^ ]+ /, "", name)
      core = name  # the entity a C++ special symbol belongs to
      sub(/^(TLS wrapper function|TLS init function|guard variable|vtable|VTT|typeinfo|typeinfo name|construction vtable) for /, "", core)
      if (core ~ /^dp_/ || name ~ allow) next
      printf "  %-14s %s  %s\n", member, type, name
    }')
  if [ -n "$bad" ]; then
    n=$(printf '%s\n' "$bad" | grep -c .)
    echo "check_symbols: $lib defines $n global symbol(s) without a dp_/dp__ prefix" \
      "(make them static, or prefix them dp__):"
    printf '%s\n' "$bad"
    status=1
  else
    echo "check_symbols: $lib: $total global symbols, all dp_ or dp__"
  fi
done
exit $status
