#!/bin/sh
# tests/check_configure.sh BUILD.ninja: only a person running ./configure.py installs
# packages; ninja never does. Run by `ninja test`, from the repository root. Fails when
#  1. a command in the manifest that runs configure.py (the regenerate rule, `ninja asan`)
#     does not pass --no-install, or the manifest has no regenerate rule;
#  2. configure.py, given --no-install (install=False), would start apt-get: its
#     installing functions run here as root with every tool missing and apt-get faked,
#     and must only report; as a control, install=True must reach apt-get.
set -eu
manifest=${1:?usage: tests/check_configure.sh BUILD.ninja}
[ -f "$manifest" ] || { echo "check_configure: no such file: $manifest" >&2; exit 2; }

# 1. `rule configure` (generator = 1) and every command line naming configure.py
regen=$(awk '/^rule /{ r = $2 } r == "configure" && /^ +command = /{ print; exit }' "$manifest")
if [ -z "$regen" ]; then
  echo "check_configure: $manifest has no \`rule configure\` with a command"
  exit 1
fi
runs=$(grep -nE '^ +(command|cmd) = .*configure\.py' "$manifest" || true)
bad=$(printf '%s\n' "$runs" | grep -v -- 'configure\.py --no-install' | grep . || true)
if [ -n "$bad" ]; then
  echo "check_configure: $manifest runs configure.py without --no-install (a plain ninja" \
    "could run apt-get):"
  printf '%s\n' "$bad" | cut -c1-200
  exit 1
fi
n=$(printf '%s\n' "$runs" | grep -c .)
echo "check_configure: $manifest: $n configure.py command(s), all with --no-install"

# 2. configure.py's own behaviour under --no-install
python3 - <<'EOF'
import contextlib
import importlib.util
import io
import os
import sys

spec = importlib.util.spec_from_file_location('dp_configure', 'configure.py')
cfg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cfg)
os.environ.pop('CC', None)
os.environ.pop('FUZZ_CC', None)
apt = []


def fake_run(argv, *a, **kw):
    apt.append(list(argv))
    raise SystemExit('check_configure: started %s' % ' '.join(argv))


cfg.os.geteuid = lambda: 0  # as root, where the person's run would install
cfg.shutil.which = lambda name: '/usr/bin/apt-get' if name == 'apt-get' else None
cfg.subprocess.run = fake_run
cfg.run = lambda argv: (127, '')
problems = []


def expect(what, call, exits):
    del apt[:]
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its notes and refusals
            call()
        exited = False
    except SystemExit:
        exited = True
    if apt:
        problems.append('%s started apt-get: %s' % (what, apt[0]))
    elif exited != exits:
        problems.append('%s %s' % (what, 'did not exit' if exits else 'exited'))


expect('ensure_packages(install=False)', lambda: cfg.ensure_packages(False), True)
expect('ensure_optional_tools(install=False)', lambda: cfg.ensure_optional_tools(False), False)
expect("apt_install(['valgrind'], install=False)",
       lambda: cfg.apt_install(['valgrind'], False), False)
# the control: the person's run does reach apt-get (here faked, so it stops there)
del apt[:]
try:
    with contextlib.redirect_stdout(io.StringIO()):
        cfg.apt_install(['valgrind'], True)
except SystemExit:
    pass
if not apt:
    problems.append('control: apt_install(install=True) did not reach apt-get; '
                    'this check would not see an install')
for p in problems:
    print('check_configure: ' + p)
if problems:
    sys.exit(1)
print('check_configure: configure.py --no-install starts no apt-get (as root, all missing)')
EOF
