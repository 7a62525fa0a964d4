#!/usr/bin/env python3
"""Writes build.ninja for libdp.

    ./configure.py [--cpu-only] [--cuda-arch 90] [--prefix /usr/local] [--debug] [--no-install]
    ninja            libdp.a, build/dp, the tests and the examples
    ninja test       builds everything, runs build/test_dp and each standalone test
    ninja asan       a second, CPU-only build in build-asan/ under ASan+UBSan; runs its tests
    ninja tsan       a CPU-only build in build-tsan/ under ThreadSanitizer; runs the test
                     suites whose steps run on several threads (TSAN_SUITES); fails on a race
    ninja fuzz       libFuzzer harnesses (fuzz/fuzz_*.c) built with clang in build-fuzz/
                     (CPU-only, ASan+UBSan), each run FUZZ_SECONDS (default 60); fails on a crash
    ninja valgrind   a 200-step training loop and 200 forward calls under valgrind memcheck
                     (2 devices; 4 with arena guards); fails on any error or definite/indirect
                     leak. clang+libFuzzer and valgrind are installed with apt-get when run as
                     root and missing; otherwise those two targets say how to install them
    ninja demo       runs DEMO (below)
    ninja install    libdp.a, dp.h, dp and dp.pc under --prefix (DESTDIR respected)

Run by a person as root, this script installs missing packages with apt-get (ninja,
Check, pkg-config, gcc; clang's libFuzzer and valgrind when missing). Whenever ninja runs
it (the regenerate rule, `ninja asan`), it is given --no-install and installs nothing: it
names what is missing and the apt-get command instead.

Environment read: CC, NVCC, CFLAGS, LDFLAGS, CUDA_HOME, FUZZ_CC (the clang of `ninja fuzz`).
Python standard library only.
Sources are globbed when this script runs; build.ninja reruns it by itself when
this script or a source folder changes (a file added or removed).
"""

import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

# ---- `ninja demo` runs this command from the repository root ------------------------
# dp train on the 8x8 digits: an MLP, 2 virtual devices; prints the memory plan (device 0
# heavier), progress, held-out accuracy, samples/s and the parameter hash.
DEMO = ['build/dp', 'train', '--model', 'examples/digits.dpm', '--data', 'data/digits.csv',
        '--devices', '2', '--batch', '64', '--epochs', '30', '--optimizer', 'adamw',
        '--lr', '0.003', '--plot', 'build/digits_loss.svg']
# -------------------------------------------------------------------------------------

ENV_VARS = ['CC', 'NVCC', 'CFLAGS', 'LDFLAGS', 'CUDA_HOME', 'FUZZ_CC']
APT_PACKAGES = {'ninja': 'ninja-build', 'pkg-config': 'pkg-config', 'check': 'check',
                'cc': 'gcc'}
SANITIZE = ['-fsanitize=address,undefined', '-fno-omit-frame-pointer',
            '-fno-sanitize-recover=undefined']
TSANITIZE = ['-fsanitize=thread', '-fno-omit-frame-pointer']
# test_dp's suites that `ninja tsan` runs: those whose steps run on several device
# threads (the executor's barriers, work sharing and left-out barriers, lib/core/exec.c)
TSAN_SUITES = ['step', 'faults', 'determinism', 'accumulate', 'batchnorm', 'clip', 'repro',
               'hostile', 'guards', 'precision']
# Directories whose listing decides the build: adding or removing a file in one of
# them reruns this script on the next `ninja`.
SOURCE_DIRS = ['lib', 'lib/util', 'lib/model', 'lib/core', 'lib/cpu', 'lib/format', 'lib/mpi', 'cuda', 'tools', 'tests', 'tests/standalone',
               'tests/valgrind', 'tests/emul', 'tests/checked', 'tests/mpi', 'tests/cuda_sim', 'examples']
# fuzz/ is not watched as a folder: its path would be the same ninja node as the
# `ninja fuzz` target, and every build would run the fuzzers to bring build.ninja
# up to date. Its sources are watched one by one instead (a new harness needs
# ./configure.py).
# `ninja fuzz`: instrumentation of the library and tools (coverage, ASan, UBSan) and of
# the harnesses' link (libFuzzer's main).
FUZZ_SANITIZE = ['-fsanitize=address,undefined', '-fno-omit-frame-pointer',
                 '-fno-sanitize-recover=undefined']
# `ninja valgrind`: memcheck, failing on any error and on definite/indirect leaks.
VALGRIND = ['valgrind', '--tool=memcheck', '--leak-check=full', '--error-exitcode=1',
            '--errors-for-leak-kinds=definite,indirect', '--show-leak-kinds=definite,indirect',
            '--suppressions=tests/valgrind/system.supp']
VALGRIND_RUNS = ['2', '4 --guards']  # arguments: device count, arena guards

# lib/'s folders that make libdp.a, lowest layer first (docs/ARCHITECTURE.md); lib/mpi is
# libdp_mpi.a.
LIB_LAYERS = ['util', 'model', 'core', 'cpu', 'format']

ROOT = os.path.dirname(os.path.abspath(__file__))


def fail(msg):
    sys.exit('configure.py: ' + msg)


def run(argv):
    """(exit status, stdout) of argv; 127 when it cannot be started."""
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           universal_newlines=True)
    except OSError:
        return 127, ''
    return p.returncode, p.stdout.strip()


def tool(cmd):
    """Absolute path of the program that the command line `cmd` starts, or None."""
    words = shlex.split(cmd)
    return shutil.which(words[0]) if words else None


def first_line(text):
    return text.splitlines()[0] if text else ''


# ---- detection ------------------------------------------------------------------------

def find_cc():
    if os.environ.get('CC'):
        return os.environ['CC']
    for name in ('cc', 'gcc'):
        if shutil.which(name):
            return name
    return None


def have_check():
    return shutil.which('pkg-config') and run(['pkg-config', '--exists', 'check'])[0] == 0


def missing_packages(cc):
    missing = []
    if not shutil.which('ninja'):
        missing.append(APT_PACKAGES['ninja'])
    if not shutil.which('pkg-config'):
        missing.append(APT_PACKAGES['pkg-config'])
    if not have_check():
        missing.append(APT_PACKAGES['check'])
    if cc is None or not tool(cc):
        if os.environ.get('CC'):
            fail('CC=%s: no such program' % os.environ['CC'])
        missing.append(APT_PACKAGES['cc'])
    return missing


def ensure_packages(install):
    """Installs ninja, Check, pkg-config (and gcc) through apt-get when `install` and run
    as root; otherwise prints the command that would and exits 1."""
    missing = missing_packages(find_cc())
    # g++ builds the CUDA simulation (tests/cuda_sim): installed along when this script
    # installs anything or runs as root; without it the simulated GPU suites are left
    # out, and the summary says so
    if not tool(os.environ.get('CXX', 'g++')) and install and os.geteuid() == 0 and (
            missing or shutil.which('apt-get')):
        missing.append('g++')
    if not missing:
        return
    names = ' '.join(missing)
    if not install or os.geteuid() != 0:
        fail('missing %s; install with:\n  sudo apt-get update && '
             'sudo apt-get install -y %s\nthen rerun ./configure.py' % (names, names))
    if not shutil.which('apt-get'):
        fail('missing %s, and there is no apt-get to install it with' % names)
    print('configure.py: installing %s: apt-get update && apt-get install -y %s'
          % (names, names), flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND='noninteractive')
    for argv in (['apt-get', 'update'], ['apt-get', 'install', '-y'] + missing):
        if subprocess.run(argv, env=env).returncode != 0:
            fail('`%s` failed' % ' '.join(argv))
    still = missing_packages(find_cc()) + ([] if tool(os.environ.get('CXX', 'g++')) or
                                           'g++' not in missing else ['g++'])
    if still:
        fail('still missing after apt-get install: ' + ' '.join(still))


# ---- optional tools: clang with libFuzzer (`ninja fuzz`), valgrind (`ninja valgrind`) ------

FUZZ_PROBE = ('#include <stddef.h>\n#include <stdint.h>\n'
              'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) '
              '{ (void)d; (void)n; return 0; }\n')


def clang_candidates():
    if os.environ.get('FUZZ_CC'):
        return [os.environ['FUZZ_CC']]
    return ['clang'] + ['clang-%d' % v for v in range(19, 13, -1)]


def fuzzer_links(clang):
    """True when `clang` compiles and links a libFuzzer harness under ASan+UBSan."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, 'probe.c')
        with open(src, 'w') as f:
            f.write(FUZZ_PROBE)
        argv = shlex.split(clang) + ['-fsanitize=fuzzer'] + FUZZ_SANITIZE + [
            src, '-o', os.path.join(d, 'probe')]
        return run(argv)[0] == 0


def find_fuzz_cc():
    """(clang command, None) when libFuzzer links, else (clang or None, reason)."""
    found = None
    for cand in clang_candidates():
        if not tool(cand):
            continue
        found = found or cand
        if fuzzer_links(cand):
            return cand, None
    if not found:
        return None, 'no clang (set FUZZ_CC, or install the clang package)'
    return found, '%s cannot link -fsanitize=fuzzer (libFuzzer runtime missing)' % found


def clang_major(clang):
    m = re.search(r'clang version (\d+)', run(shlex.split(clang) + ['--version'])[1])
    return m.group(1) if m else None


def apt_install(names, install):
    """apt-get install when `install` and root; False (with a note) when that is not
    possible."""
    if not install or os.geteuid() != 0 or not shutil.which('apt-get'):
        return False
    print('configure.py: installing %s (optional tools): apt-get update && apt-get install -y %s'
          % (' '.join(names), ' '.join(names)), flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND='noninteractive')
    for argv in (['apt-get', 'update'], ['apt-get', 'install', '-y'] + names):
        if subprocess.run(argv, env=env).returncode != 0:
            print('configure.py: `%s` failed; continuing without it' % ' '.join(argv))
            return False
    return True


ZLIB_PROBE = ('#include <zlib.h>\n'
              'int main(void) { return gzopen("x", "rb") == 0 ? 0 : 1; }\n')


def find_zlib(cc):
    """Whether zlib's header and library are there (the dp tool reads gzip'd IDX files
    with it; without it those are refused with a message)."""
    if not cc:
        return False
    d = tempfile.mkdtemp()
    try:
        src = os.path.join(d, 'z.c')
        with open(src, 'w') as f:
            f.write(ZLIB_PROBE)
        return run(shlex.split(cc) + [src, '-o', os.path.join(d, 'z'), '-lz'])[0] == 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


def ensure_optional_tools(install):
    """clang + libFuzzer and valgrind: installed through apt-get when `install`, run as
    root and missing. Never fatal: without them `ninja fuzz` / `ninja valgrind` fail with the
    command that installs them. Returns (fuzz_cc, fuzz_reason, valgrind path)."""
    fuzz_cc, reason = find_fuzz_cc()
    if reason and not os.environ.get('FUZZ_CC'):
        if fuzz_cc is None:
            pkgs = ['clang']
        else:  # Debian splits the sanitizer/libFuzzer runtimes out of clang-N
            major = clang_major(fuzz_cc)
            pkgs = ['libclang-rt-%s-dev' % major] if major else []
        if pkgs and apt_install(pkgs, install):
            fuzz_cc, reason = find_fuzz_cc()
            if reason and fuzz_cc and clang_major(fuzz_cc):
                if apt_install(['libclang-rt-%s-dev' % clang_major(fuzz_cc)], install):
                    fuzz_cc, reason = find_fuzz_cc()
    if not find_zlib(find_cc()):  # gzip'd MNIST files (tools/data_bin.c)
        apt_install(['zlib1g-dev'], install)
    valgrind = shutil.which('valgrind')
    if not valgrind and apt_install(['valgrind'], install):
        valgrind = shutil.which('valgrind')
    if not find_mpi()[0]:  # Debian's Open MPI: the multi-process path (libdp_mpi.a)
        apt_install(['openmpi-bin', 'libopenmpi-dev'], install)
    return (fuzz_cc if not reason else None), reason, valgrind


def find_mpi():
    """({'cflags', 'libs', 'mpirun'}, state) when an MPI C compiler wrapper (Open MPI's
    mpicc; MPICC overrides) and mpirun are there, else (None, why not)."""
    mpicc = os.environ.get('MPICC') or shutil.which('mpicc')
    mpirun = shutil.which('mpirun')
    if not mpicc or not mpirun:
        return None, 'off (no mpicc/mpirun; on Debian: apt-get install openmpi-bin libopenmpi-dev)'
    st1, comp = run([mpicc, '--showme:compile'])
    st2, link = run([mpicc, '--showme:link'])
    if st1 or st2:
        return None, 'off (%s is not Open MPI\'s wrapper: no --showme)' % mpicc
    _, ver = run([mpirun, '--version'])
    return ({'cflags': shlex.split(comp), 'libs': shlex.split(link), 'mpirun': mpirun,
             'version': first_line(ver)}, 'on')


def find_cuda(args):
    """A dict describing the CUDA toolchain, or (None, reason it is off)."""
    if args.sanitize:
        return None, 'off (--sanitize builds CPU-only)'
    if args.cpu_only:
        return None, 'off (--cpu-only)'
    home = os.environ.get('CUDA_HOME') or '/usr/local/cuda'
    nvcc = os.environ.get('NVCC')
    if not nvcc:
        nvcc = os.path.join(home, 'bin', 'nvcc')
        if not os.access(nvcc, os.X_OK):
            nvcc = shutil.which('nvcc')
    if not nvcc or not tool(nvcc):
        return None, 'off (no nvcc; set NVCC or CUDA_HOME)'
    status, out = run(shlex.split(nvcc) + ['--version'])
    if status != 0:
        return None, 'off (`%s --version` failed)' % nvcc
    version = re.search(r'release ([\d.]+)', out)
    lib64 = os.path.join(home, 'lib64')
    for need in (os.path.join(home, 'include', 'cuda_runtime.h'),
                 os.path.join(lib64, 'libcudart.so')):
        if not os.path.exists(need):
            return None, 'off (nvcc found, but no %s)' % need
    cublas = os.path.join(lib64, 'libcublas.so')
    if not os.path.exists(cublas):
        return None, 'off (nvcc found, but no cuBLAS: %s)' % cublas
    return {'home': home, 'nvcc': nvcc, 'lib64': lib64, 'cublas': cublas,
            'version': version.group(1) if version else '?'}, 'on'


def find_nccl(cuda):
    """(include dir, lib dir) of NCCL, or None."""
    incs = [os.path.join(cuda['home'], 'include'), '/usr/include']
    libs = [cuda['lib64'], '/usr/lib/x86_64-linux-gnu']
    inc = next((d for d in incs if os.path.exists(os.path.join(d, 'nccl.h'))), None)
    lib = next((d for d in libs if os.path.exists(os.path.join(d, 'libnccl.so'))), None)
    return (inc, lib) if inc and lib else None


def cuda_arch_flags(spec):
    """'90' -> sm_90 code plus compute_90 PTX; '80,90' -> sm_80, sm_90, PTX of 90."""
    archs = [a.strip() for a in spec.split(',') if a.strip()]
    if not archs or not all(re.fullmatch(r'\d+[a-z]?', a) for a in archs):
        fail('--cuda-arch: expected numbers like 90 or 80,90, got %r' % spec)
    flags = []
    for a in archs:
        flags += ['-gencode', 'arch=compute_%s,code=sm_%s' % (a, a)]
    flags += ['-gencode', 'arch=compute_%s,code=compute_%s' % (archs[-1], archs[-1])]
    return flags


def dp_version():
    try:
        with open(os.path.join(ROOT, 'include', 'dp.h')) as f:
            text = f.read()
    except OSError:
        return '0.0'
    major = re.search(r'#define\s+DP_VERSION_MAJOR\s+(\d+)', text)
    minor = re.search(r'#define\s+DP_VERSION_MINOR\s+(\d+)', text)
    return '%s.%s' % (major.group(1) if major else 0, minor.group(1) if minor else 0)


# ---- a small writer for ninja files ---------------------------------------------------

def esc(value):
    """A value that ninja passes through unchanged."""
    return value.replace('$', '$$')


def esc_path(path):
    return path.replace('$', '$$').replace(' ', '$ ').replace(':', '$:')


def join(words):
    return ' '.join(words)


class Ninja:
    def __init__(self):
        self.lines = []

    def comment(self, text):
        self.lines.append('# ' + text)

    def newline(self):
        self.lines.append('')

    def variable(self, name, value, indent=0):
        self.lines.append('%s%s = %s' % ('  ' * indent, name, value))

    def rule(self, name, command, **kw):
        self.lines.append('rule ' + name)
        self.variable('command', command, 1)
        for key, value in kw.items():
            self.variable(key, value, 1)
        self.newline()

    def build(self, outputs, rule, inputs=(), implicit=(), variables=()):
        outputs = [outputs] if isinstance(outputs, str) else outputs
        line = 'build %s: %s' % (join(map(esc_path, outputs)), rule)
        if inputs:
            line += ' ' + join(map(esc_path, inputs))
        if implicit:
            line += ' | ' + join(map(esc_path, implicit))
        self.lines.append(line)
        for name, value in variables:
            self.variable(name, value, 1)
        return outputs

    def default(self, targets):
        self.lines.append('default ' + join(map(esc_path, targets)))

    def text(self):
        return '\n'.join(self.lines) + '\n'


def write(path, text):
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)


# ---- the build ------------------------------------------------------------------------

def sources(pattern):
    return sorted(glob.glob(pattern))


def stem(path):
    return os.path.splitext(os.path.basename(path))[0]


SUITE_RE = re.compile(r'Suite\s*\*\s*(\w+)_suite\s*\(\s*void\s*\)')


def find_suites(test_files):
    """[(suite name, file)] in file order; each test_*.c must define at least one."""
    suites, seen = [], {}
    for path in test_files:
        with open(path, errors='replace') as f:
            names = list(dict.fromkeys(SUITE_RE.findall(f.read())))
        if not names:
            fail('%s defines no `Suite *NAME_suite(void)`' % path)
        for name in names:
            if name in seen:
                fail('suite %s_suite is defined in %s and %s' % (name, seen[name], path))
            seen[name] = path
            suites.append((name, path))
    return suites


def suites_header(suites):
    lines = ['/* Generated by configure.py from tests/test_*.c; do not edit. */',
             '#ifndef DP_SUITES_H', '#define DP_SUITES_H', '', '#include <check.h>', '']
    lines += ['Suite *%s_suite(void); /* %s */' % (n, p) for n, p in suites]
    lines += ['', '/* X(name) for every suite, in file order. */', '#define DP_SUITES(X) \\']
    lines += ['  X(%s) \\' % n for n, _ in suites]
    lines += ['', '#endif', '']
    return '\n'.join(lines)


def main():
    ap = argparse.ArgumentParser(description='Writes build.ninja for libdp.')
    ap.add_argument('--cpu-only', action='store_true',
                    help='do not compile cuda/*.cu even when nvcc is found')
    ap.add_argument('--cuda-arch', default='90', metavar='ARCHS',
                    help='compute capabilities, e.g. 90 or 80,90 (default 90: sm_90 + PTX)')
    ap.add_argument('--prefix', default='/usr/local', help='install prefix (default /usr/local)')
    ap.add_argument('--debug', action='store_true', help='-O0 -g -DDP_DEBUG (default -O3 -g)')
    ap.add_argument('--builddir', default='build',
                    help='build folder (default build); any other writes BUILDDIR/build.ninja')
    ap.add_argument('--sanitize', nargs='?', const='address', choices=['address', 'thread'],
                    help='-O1, CPU-only, under sanitizers: address (the default) is ASan + '
                         'UBSan (what `ninja asan` uses), thread is ThreadSanitizer (what '
                         '`ninja tsan` uses)')
    ap.add_argument('--no-install', action='store_true',
                    help='never run apt-get; name missing packages instead (what build.ninja '
                         'passes when ninja reruns this script)')
    args = ap.parse_args()

    os.chdir(ROOT)
    bd = os.path.normpath(args.builddir)
    if os.path.isabs(bd) or bd.startswith('..') or bd in ('.', 'lib', 'cuda', 'tools',
                                                         'tests', 'examples', 'include'):
        fail('--builddir must be a new folder inside the repository, got %r' % args.builddir)
    manifest = 'build.ninja' if bd == 'build' else os.path.join(bd, 'build.ninja')

    ensure_packages(not args.no_install)
    cc = find_cc()
    fuzz_cc, fuzz_reason, valgrind = (None, None, None) if args.sanitize else \
        ensure_optional_tools(not args.no_install)
    _, check_cflags = run(['pkg-config', '--cflags', 'check'])
    _, check_libs = run(['pkg-config', '--libs', 'check'])
    _, check_version = run(['pkg-config', '--modversion', 'check'])
    cuda, cuda_state = find_cuda(args)
    # MPI: the multi-process path (libdp_mpi.a, dp under mpirun); never in the sanitizer
    # build, whose leak checker would report Open MPI's own allocations
    mpi, mpi_state = (None, 'off (sanitizer build)') if args.sanitize else find_mpi()
    nccl = find_nccl(cuda) if cuda else None
    env_flags = lambda name: shlex.split(os.environ.get(name, ''))

    # -- flags
    san_flags = TSANITIZE if args.sanitize == 'thread' else SANITIZE
    if args.sanitize:
        opt = ['-O1', '-g'] + san_flags + (['-DDP_DEBUG'] if args.debug else [])
    else:
        opt = ['-O0', '-g', '-DDP_DEBUG'] if args.debug else ['-O3', '-g']
    # -ffp-contract=off: a multiply and an add stay two roundings wherever the source
    # writes two (gcc's ISO C mode implies it, clang's does not), so every tier and
    # compiler gives the same bits (lib/util/expf.h, the GEMM's fma chains);
    # -fno-math-errno only lets sqrtf vectorise. Never -ffast-math: the bit-for-bit
    # guarantees depend on exact IEEE arithmetic.
    common = ['-std=c11', '-Wall', '-Wextra', '-D_GNU_SOURCE', '-pthread', '-fno-math-errno',
              '-ffp-contract=off']
    # cuda/dp_cuda.h is included as "dp_cuda.h": -iquote, not -I, so that <cuda.h> (the driver
    # API, included by CUDA's own headers) is never shadowed by it.
    cflags = common + ['-Iinclude', '-Ilib', '-Itools', '-iquote', 'cuda'] + opt
    defines = []
    if cuda:
        defines.append('-DDP_HAVE_CUDA=1')
        if nccl:
            defines.append('-DDP_HAVE_NCCL=1')
    cflags += defines + env_flags('CFLAGS')
    # zlib: the dp tool's reader of gzip'd IDX files (tools/data_bin.c); -lz goes on the
    # programs that link the tools (link_libs), never into libdp.a's own needs
    zlib = find_zlib(cc)
    if zlib:
        cflags.append('-DDPT_HAVE_ZLIB=1')
    # the tools and tests that use dp_mpi.h (compiled with the wrapper's include flags)
    tool_mpi_flags = (['-DDP_HAVE_MPI=1'] + mpi['cflags']) if mpi else []
    example_cflags = common + ['-Iinclude'] + opt + env_flags('CFLAGS')
    test_cflags = ['-Itests', '-I' + os.path.join(bd, 'gen')] + shlex.split(check_cflags)
    ldflags = ['-pthread'] + (san_flags if args.sanitize else []) + env_flags('LDFLAGS')
    # libdp.a needs only these; libdp_cuda.a (the CUDA backend) adds cuda_libs. The
    # rpaths are for this tree's own programs; the .pc files force none.
    sys_libs = ['-lm', '-pthread']
    link_libs = sys_libs + (['-lz'] if zlib else [])
    cuda_libs, cuda_pc_libs = [], []
    if cuda:
        lib64 = cuda['lib64']
        cuda_pc_libs = ['-L' + lib64, '-lcudart', '-lcublas']
        cuda_libs = ['-L' + lib64, '-Wl,-rpath,' + lib64, '-lcudart', '-lcublas']
        if nccl:
            system_dirs = (lib64, '/usr/lib/x86_64-linux-gnu')
            if nccl[1] not in system_dirs:
                cuda_libs += ['-L' + nccl[1], '-Wl,-rpath,' + nccl[1]]
                cuda_pc_libs += ['-L' + nccl[1]]
            cuda_libs.append('-lnccl')
            cuda_pc_libs.append('-lnccl')
        cuda_libs.append('-lstdc++')  # host code of nvcc objects is C++
        cuda_pc_libs.append('-lstdc++')
    nvccflags = []
    if cuda:
        nvopt = ['-O0', '-g', '-DDP_DEBUG'] if args.debug else ['-O2']
        # -fno-exceptions: cuda/ throws nothing and calls only C APIs; without it g++
        # puts a global DW.ref.__gxx_personality_v0 into every object with a destructor
        # (tests/check_symbols.sh: libdp.a defines only dp_/dp__ symbols).
        nvccflags = (['-std=c++17'] + nvopt +
                     ['-Xcompiler', '-fPIC,-fno-exceptions,-Wall,-Wextra,-iquote,cuda',
                      '-Iinclude', '-Ilib'] +
                     cuda_arch_flags(args.cuda_arch) + defines)
        if nccl and nccl[0] not in (os.path.join(cuda['home'], 'include'), '/usr/include'):
            nvccflags.append('-I' + nccl[0])

    # -- sources
    lib_src = sources('lib/*.c') + [s for d in LIB_LAYERS for s in sources('lib/%s/*.c' % d)]
    # The CUDA backend: its kernels and the C adapter that registers it (cuda/vtable.c,
    # plain C: the emulated GPU's test links it too, in every build).
    cuda_src = sources('cuda/*.cu') + sources('cuda/*.c') if cuda else []
    tool_src = [s for s in sources('tools/*.c') if s != 'tools/dp.c']
    mpi_src = sources('lib/mpi/*.c') if mpi else []
    # test_cuda.c drives cuda/'s internals: a CUDA build's only
    test_files = [s for s in sources('tests/test_*.c') if cuda or s != 'tests/test_cuda.c']
    helper_src = [s for s in sources('tests/*.c')
                  if s not in test_files and s != 'tests/check_main.c']
    helper_src += sources('tests/checked/*.c')  # the test-only "checked" backend
    standalone_src = sources('tests/standalone/*.c')
    # examples/mpi_*.c use dp_mpi.h: built where there is MPI
    example_src = [e for e in sources('examples/*.c')
                   if mpi or not os.path.basename(e).startswith('mpi_')]
    suites = find_suites(test_files)

    # -- build.ninja
    n = Ninja()
    O = lambda src: os.path.join(bd, os.path.splitext(src)[0] + '.o')
    B = lambda name: os.path.join(bd, name)
    n.comment('Generated by configure.py; edit configure.py, not this file.')
    n.comment('configure.py ' + shlex.join(sys.argv[1:]))
    n.variable('ninja_required_version', '1.7')
    n.variable('builddir', esc(bd))
    n.variable('cc', esc(cc))
    n.variable('cflags', esc(join(cflags)))
    n.variable('ldflags', esc(join(ldflags)))
    n.variable('libs', esc(join(sys_libs)))
    if cuda:
        n.variable('nvcc', esc(cuda['nvcc']))
        n.variable('nvccflags', esc(join(nvccflags)))
    n.newline()

    n.rule('cc', '$cc -MMD -MF $out.d $cflags -c $in -o $out',
           depfile='$out.d', deps='gcc', description='CC $out')
    if cuda:
        n.rule('nvcc', '$nvcc -MD -MF $out.d $nvccflags -c $in -o $out',
               depfile='$out.d', deps='gcc', description='NVCC $out')
    n.rule('ar', 'rm -f $out && ar crs $out $in', description='AR $out')
    n.rule('link', '$cc $ldflags -o $out $in $libs', description='LINK $out')
    configure_env = join('%s=%s' % (k, shlex.quote(os.environ[k]))
                         for k in ENV_VARS if os.environ.get(k))
    # `python3`, as the #! line says: build.ninja may outlive this interpreter's path.
    # --no-install: when ninja reruns this script (regenerating build.ninja, `ninja asan`)
    # it never runs apt-get; only a person running ./configure.py installs packages
    # (tests/check_configure.sh checks every such command line).
    rerun = ((('env %s ' % configure_env) if configure_env else '') +
             'python3 configure.py --no-install')
    rerun_args = [a for a in sys.argv[1:] if a != '--no-install']
    n.rule('configure', esc(rerun) + ' $args', generator='1', description='CONFIGURE $args')
    n.rule('console', '$cmd', pool='console', description='$desc')

    # libdp.a (the core and the cpu backend: -lm -pthread) and libdp_cuda.a (the CUDA
    # backend, registered by dp_cuda_register(); links the CUDA libraries)
    objs = [n.build(O(s), 'cc', [s])[0] for s in lib_src]
    n.newline()
    libdp = n.build(B('libdp.a'), 'ar', objs)[0]
    defaults = [libdp]
    libcuda = []
    vtable_obj = n.build(O('cuda/vtable.c'), 'cc', ['cuda/vtable.c'])[0]
    if cuda:
        cobjs = [n.build(O(s), 'nvcc', [s])[0] for s in cuda_src if s.endswith('.cu')]
        libcuda = n.build(B('libdp_cuda.a'), 'ar', cobjs + [vtable_obj])
        defaults += libcuda
    # libdp_mpi.a: the MPI world (include/dp_mpi.h), built with the wrapper's flags
    libmpi, mpi_libs = [], []
    if mpi:
        mflags = [('cflags', '$cflags ' + esc(join(mpi['cflags'])))]
        libmpi = n.build(B('libdp_mpi.a'), 'ar',
                         [n.build(O(s), 'cc', [s], variables=mflags)[0] for s in mpi_src])
        mpi_libs = mpi['libs']
        defaults += libmpi
    # what a program of this tree links: the CUDA backend and MPI where there are
    all_libs = libmpi + libcuda + [libdp]
    flibs = [('libs', esc(join(link_libs + cuda_libs + mpi_libs)))]

    # tools
    libtools = []
    tflags = [('cflags', '$cflags ' + esc(join(tool_mpi_flags)))]
    if tool_src:
        libtools = n.build(B('libdptools.a'), 'ar',
                           [n.build(O(s), 'cc', [s], variables=tflags)[0] for s in tool_src])
    dp = None
    if os.path.exists('tools/dp.c'):
        dp = n.build(B('dp'), 'link', [n.build(O('tools/dp.c'), 'cc', ['tools/dp.c'],
                                               variables=tflags)[0]]
                     + libtools + all_libs, variables=flibs)[0]
        defaults.append(dp)
    n.newline()

    # tests
    tcflags = [('cflags', '$cflags ' + esc(join(test_cflags)))]
    tlibs = [('libs', esc(join(shlex.split(check_libs) + link_libs + cuda_libs + mpi_libs)))]
    suites_h = os.path.join(bd, 'gen', 'suites.h')
    test_bins = []
    libtest = []
    if helper_src:
        libtest = n.build(B('libdptest.a'), 'ar',
                          [n.build(O(s), 'cc', [s], variables=tcflags)[0] for s in helper_src])
    if os.path.exists('tests/check_main.c'):
        tobjs = [n.build(O('tests/check_main.c'), 'cc', ['tests/check_main.c'], [suites_h],
                         variables=tcflags)[0]]
        tobjs += [n.build(O(s), 'cc', [s], variables=tcflags)[0] for s in test_files]
        test_bins += n.build(B('test_dp'), 'link', tobjs + libtest + libtools + all_libs,
                             variables=tlibs)
    # standalone tests see dp_mpi.h where there is MPI (test_noalloc --mpi)
    stflags = [('cflags', '$cflags ' + esc(join(test_cflags + tool_mpi_flags)))]
    for s in standalone_src:
        name = stem(s)
        if name in ('dp', 'test_dp', 'libdp', 'gen', 'lib', 'tools', 'tests', 'examples',
                    'cuda'):
            fail('%s: its program name %s collides with another build output' % (s, name))
        sflags, slibs = stflags, tlibs
        if name == 'test_oom' and args.sanitize:
            # the sanitizer owns malloc: libdp's allocator calls (and the test's)
            # are redirected at link time to the test's failing allocator, which
            # calls the sanitizer's (__real_malloc)
            sflags = [('cflags', '$cflags ' + esc(join(test_cflags + tool_mpi_flags +
                                                       ['-DDP_OOM_WRAP=1'])))]
            slibs = [('libs', tlibs[0][1] + ' ' + esc(join('-Wl,--wrap=' + f for f in (
                'malloc', 'calloc', 'realloc', 'free', 'posix_memalign', 'aligned_alloc',
                'memalign', 'valloc', 'pvalloc', 'strdup'))))]
        obj = n.build(O(s), 'cc', [s], variables=sflags)[0]
        test_bins += n.build(B(name), 'link', [obj] + libtest + libtools + all_libs,
                             variables=slibs)
    # test_cuda_emul: the CUDA backend's adapter (cuda/vtable.c, registered through
    # dp_cuda_register like the real one) over an emulated GPU (tests/emul/fake_cuda.c,
    # which implements dp_cuda.h on the CPU), with libdp.a: no CUDA library at all.
    emul_src = sources('tests/emul/*.c')
    if emul_src:
        eobjs = [n.build(O(s), 'cc', [s], variables=tcflags)[0] for s in emul_src]
        # The GPU suite through the public API runs here too, against the double, so
        # that its logic is checked on every run (test_dp runs it on a real GPU).
        eobjs += [O('tests/test_cuda_api.c'), O('tests/test_cuda_fault.c')]
        elibs = [('libs', esc(join(shlex.split(check_libs) + link_libs)))]
        test_bins += n.build(B('test_cuda_emul'), 'link', eobjs + [vtable_obj, libdp],
                             variables=elibs)
    # tests/mpi: programs run under mpirun by tests/mpi/run.sh (a check of `ninja test`)
    mpi_bins = []
    if mpi:
        mtflags = [('cflags', '$cflags ' + esc(join(test_cflags + tool_mpi_flags)))]
        for s in sources('tests/mpi/*.c'):
            obj = n.build(O(s), 'cc', [s], variables=mtflags)[0]
            mpi_bins += n.build(B(stem(s)), 'link', [obj] + libtools + all_libs,
                                variables=flibs)
        # test_cuda_mpi: test_mpi.c's job on the cuda backend across processes, over
        # the emulated GPU whose NCCL runs on MPI (FAKE_CUDA_MPI): the multi-process
        # CUDA path on every run, without a GPU (no CUDA library linked)
        if emul_src and os.path.exists('tests/mpi/test_mpi.c'):
            cmflags = [('cflags', '$cflags ' + esc(join(
                test_cflags + tool_mpi_flags + ['-iquote', 'tests/emul', '-DTEST_CUDA', '-DFAKE_CUDA_MPI'])))]
            cobj = n.build(O('tests/mpi/test_cuda_mpi.c'), 'cc',
                           ['tests/mpi/test_mpi.c'], variables=cmflags)[0]
            fobj = n.build(O('tests/emul/fake_cuda_mpi.c'), 'cc',
                           ['tests/emul/fake_cuda.c'], variables=cmflags)[0]
            mpi_bins += n.build(B('test_cuda_mpi'), 'link',
                                [cobj, fobj, vtable_obj] + libmpi + [libdp],
                                variables=[('libs', esc(join(link_libs + mpi_libs)))])
        # ... and on real GPUs (tests/gpu/run.sh, on a machine with two or more)
        if cuda and os.path.exists('tests/mpi/test_mpi.c'):
            gmflags = [('cflags', '$cflags ' + esc(join(
                test_cflags + tool_mpi_flags + ['-DTEST_CUDA', '-DTEST_CUDA_REAL'])))]
            gobj = n.build(O('tests/mpi/test_cuda_mpi_gpu.c'), 'cc',
                           ['tests/mpi/test_mpi.c'], variables=gmflags)[0]
            mpi_bins += n.build(B('test_cuda_mpi_gpu'), 'link', [gobj] + all_libs,
                                variables=flibs)
    defaults += test_bins + mpi_bins
    # test_cuda_sim: the real cuda/ sources (host code and kernels, unchanged but for
    # the launch seam) compiled for the host with g++ against the CPU simulation of
    # the CUDA runtime, cuBLAS and NCCL in tests/cuda_sim/, running the GPU suites
    # (docs/GPU.md, "The CUDA simulation"). Built wherever there is a C++ compiler.
    sim_bins = []
    cxx = tool(os.environ.get('CXX', 'g++'))
    if cxx and not args.sanitize and os.path.isdir('tests/cuda_sim'):
        SO = lambda src: os.path.join(bd, 'sim', os.path.splitext(src)[0] + '.o')
        simdefs = ['-DDP_HAVE_CUDA=1', '-DDP_HAVE_NCCL=1', '-DDP_CUDA_SIM=1']
        simcxx = (['-std=c++17', '-Wall', '-Wextra', '-pthread', '-fno-exceptions', '-O1', '-g',
                   '-ffp-contract=off', '-fno-math-errno', '-isystem', 'tests/cuda_sim/include',
                   '-Itests/cuda_sim', '-Iinclude', '-Ilib', '-iquote', 'cuda'] + simdefs)
        sim_gen = os.path.join(bd, 'gen', 'sim')
        n.rule('cxx_sim', '%s -MMD -MF $out.d $simflags -c $in -o $out' % esc(cxx),
               depfile='$out.d', deps='gcc', description='CXX $out')
        sv = [('simflags', esc(join(simcxx)))]
        sobjs = [n.build(SO(s), 'cxx_sim', [s], variables=[(
            'simflags', esc(join(simcxx + ['-x', 'c++'])))])[0] for s in sources('cuda/*.cu')]
        sobjs += [n.build(SO(s), 'cxx_sim', [s], variables=sv)[0]
                  for s in sources('tests/cuda_sim/*.cc') + sources('tests/cuda_sim/*.S')]
        scflags = [('cflags', '$cflags ' + esc(join(simdefs + ['-I' + sim_gen] + test_cflags)))]
        sobjs.append(n.build(SO('cuda/vtable.c'), 'cc', ['cuda/vtable.c'], variables=scflags)[0])
        libsim = n.build(B('libdp_cuda_sim.a'), 'ar', sobjs)
        sim_tests = ['tests/test_cuda.c', 'tests/test_cuda_api.c', 'tests/test_cuda_fault.c']
        tobjs = [n.build(SO('tests/check_main.c'), 'cc', ['tests/check_main.c'],
                         [os.path.join(sim_gen, 'suites.h')], variables=scflags)[0]]
        tobjs += [n.build(SO(s), 'cc', [s], variables=scflags)[0] for s in sim_tests]
        slibs = [('libs', esc(join(shlex.split(check_libs) + link_libs + ['-lstdc++'])))]
        sim_bins += n.build(B('test_cuda_sim'), 'link', tobjs + libtest + libtools + libsim +
                            [libdp], variables=slibs)
        # test_noalloc_sim: the no-allocation check on the simulation. Its counting
        # allocators wrap the runtime's through dlsym(RTLD_NEXT), as with libcudart.so,
        # so the runtime part of the simulation is a shared library here.
        rt_src = sources('tests/cuda_sim/*.cc') + sources('tests/cuda_sim/*.S')
        if os.path.exists('tests/standalone/test_noalloc.c'):
            pic = [n.build(os.path.join(bd, 'sim', 'pic', os.path.splitext(s)[0] + '.o'),
                           'cxx_sim', [s], variables=[('simflags', esc(join(simcxx + ['-fPIC'])))])[0]
                   for s in rt_src]
            n.rule('cxx_so', '%s -shared -pthread -o $out $in' % esc(cxx), description='SO $out')
            so = n.build(B('libdp_cuda_sim_rt.so'), 'cxx_so', pic)
            kobjs = [o for o in sobjs if not any(o == SO(r) for r in rt_src)]
            libk = n.build(B('libdp_cuda_sim_code.a'), 'ar', kobjs)
            nobj = n.build(SO('tests/standalone/test_noalloc.c'), 'cc',
                           ['tests/standalone/test_noalloc.c'], variables=scflags)[0]
            nlibs = [('libs', esc(join(link_libs + ['-ldl', '-lstdc++', '-L' + bd,
                                                   '-Wl,-rpath,' + os.path.abspath(bd), '-ldp_cuda_sim_rt'])))]
            sim_bins += n.build(B('test_noalloc_sim'), 'link', [nobj] + libtest + libtools +
                                libk + [libdp], [so[0]], variables=nlibs)
        # test_cuda_mpi_sim: tests/mpi/test_mpi.c's job on the simulation across
        # processes, its NCCL over MPI (tests/mpi/run.sh runs it under mpirun)
        sim_mpi_bins = []
        if mpi and os.path.exists('tests/mpi/test_mpi.c'):
            mcxx = simcxx + ['-DDP_SIM_MPI=1'] + mpi['cflags']
            nmpi = n.build(os.path.join(bd, 'sim', 'mpi', 'nccl.o'), 'cxx_sim',
                           ['tests/cuda_sim/nccl.cc'], variables=[('simflags', esc(join(mcxx)))])
            mobjs = [o for o in sobjs if o != SO('tests/cuda_sim/nccl.cc')] + nmpi
            libsim_mpi = n.build(B('libdp_cuda_sim_mpi.a'), 'ar', mobjs)
            mcf = [('cflags', '$cflags ' + esc(join(simdefs + test_cflags + tool_mpi_flags + [
                '-DTEST_CUDA', '-DTEST_CUDA_REAL'])))]
            mo = n.build(os.path.join(bd, 'sim', 'tests', 'mpi', 'test_cuda_mpi_sim.o'), 'cc',
                         ['tests/mpi/test_mpi.c'], variables=mcf)[0]
            sim_mpi_bins += n.build(B('test_cuda_mpi_sim'), 'link',
                                    [mo] + libtools + libmpi + libsim_mpi + [libdp],
                                    variables=[('libs', esc(join(link_libs + mpi_libs +
                                                                 ['-lstdc++'])))])
        defaults += sim_bins + sim_mpi_bins
        n.build('cuda-sim', 'console', [], sim_bins,
                variables=[('cmd', ' && '.join('./' + esc(b) for b in sim_bins)),
                           ('desc', 'CUDA-SIM')])
    n.newline()

    # examples: the public header only
    for s in example_src:
        is_mpi = os.path.basename(s).startswith('mpi_')
        ecflags = example_cflags + (mpi['cflags'] if is_mpi else [])
        obj = n.build(O(s), 'cc', [s], variables=[('cflags', esc(join(ecflags)))])[0]
        defaults += n.build(os.path.join(bd, 'examples', stem(s)), 'link',
                            [obj] + (libmpi if is_mpi else []) + [libdp],
                            variables=[('libs', esc(join(sys_libs + mpi_libs)))] if is_mpi
                            else [])
    n.newline()

    # programs for `ninja valgrind` (built by default, so they stay warning-free; not
    # run by `ninja test`)
    vbins = []
    if not args.sanitize:
        for s in sources('tests/valgrind/*.c'):
            obj = n.build(O(s), 'cc', [s])[0]
            vbins += n.build(B('valgrind_' + stem(s)), 'link', [obj, libdp])
        defaults += vbins
        n.newline()

    n.build('all', 'phony', defaults)
    n.default(['all'])
    n.newline()

    # ninja test: every test program from the repository root; fails if any failed
    test_env = ''
    if args.sanitize == 'thread':
        # a race aborts the test that found it, which fails its suite
        test_env = ("export TSAN_OPTIONS=$${TSAN_OPTIONS:-'halt_on_error=1 abort_on_error=1'} "
                    'CK_TIMEOUT_MULTIPLIER=$${CK_TIMEOUT_MULTIPLIER:-10}; ')
    elif args.sanitize:
        # LeakSanitizer works here (ptrace is allowed); where a sandbox forbids ptrace,
        # run with ASAN_OPTIONS=detect_leaks=0 instead. Check's timeouts are stretched
        # for the slower instrumented code.
        test_env = ('export ASAN_OPTIONS=$${ASAN_OPTIONS:-detect_leaks=1} '
                    'UBSAN_OPTIONS=$${UBSAN_OPTIONS:-print_stacktrace=1} '
                    'CK_TIMEOUT_MULTIPLIER=$${CK_TIMEOUT_MULTIPLIER:-4}; ')
    # Checks over build outputs first: the libraries' exported symbols (the shipped,
    # uninstrumented build only: ASan adds its own globals) and this manifest's
    # configure.py command lines.
    checks = [] if args.sanitize else [['tests/check_symbols.sh', libdp] + libcuda + libmpi]
    checks.append(['tests/check_configure.sh', manifest])
    checks.append([sys.executable, 'tests/check_layers.py'])  # docs/ARCHITECTURE.md's include rules
    checks.append([sys.executable, 'tests/check_docs.py'])  # the docs name what the code has
    if not args.sanitize:  # weights to and from PyTorch (skipped, visibly, without torch)
        checks.append(['tests/check_safetensors_torch.sh', bd])
    if mpi_bins and dp:  # the job across processes, under mpirun
        checks.append(['tests/mpi/run.sh', bd])
    # tests/run_tests.py runs each step with its output in BUILD/test-logs/, prints a
    # line per step (and why a failed one failed), then one table of them all
    steps = [shlex.join(argv) for argv in checks]
    if args.sanitize == 'thread':
        steps += ['CK_RUN_SUITE=%s ./%s' % (s, shlex.quote(B('test_dp')))
                  for s in TSAN_SUITES]
    else:
        steps += ['./' + shlex.quote(t) for t in test_bins + sim_bins]
        if sim_bins:  # the order-sensitive cases again, blocks and threads shuffled
            steps.append('DP_SIM_ORDER=shuffle DP_SIM_SEED=1 CK_RUN_SUITE=cuda '
                         'CK_RUN_CASE=gpu_order ./' + shlex.quote(B('test_cuda_sim')))
    test_cmd = test_env + esc(shlex.join(
        [sys.executable, 'tests/run_tests.py', '--logs', os.path.join(bd, 'test-logs')] +
        steps))
    n.build('test', 'console', [], defaults + [c[0] for c in checks] + ['tests/run_tests.py'],
            variables=[('cmd', test_cmd), ('desc', 'TEST ' + esc(bd))])

    # ninja demo
    demo = [os.path.join(bd, a[len('build/'):]) if a.startswith('build/') else a
            for a in DEMO]
    n.build('demo', 'console', [], [a for a in demo if a in defaults],
            variables=[('cmd', esc(shlex.join(demo))), ('desc', 'DEMO')])

    # ninja install
    if dp:
        pfx = lambda sub: '"$$D"' + esc(shlex.quote(os.path.join(args.prefix, sub)))
        steps = ['set -e', 'D="$${DESTDIR:-}"',
                 'install -d %s %s %s %s' % (pfx('lib'), pfx('lib/pkgconfig'),
                                             pfx('include'), pfx('bin')),
                 'install -m 644 %s %s' % (libdp, pfx('lib/libdp.a')),
                 'install -m 644 include/dp.h %s' % pfx('include/dp.h'),
                 'install -m 755 %s %s' % (dp, pfx('bin/dp')),
                 'install -m 644 %s %s' % (B('dp.pc'), pfx('lib/pkgconfig/dp.pc'))]
        if mpi:
            steps += ['install -m 644 %s %s' % (libmpi[0], pfx('lib/libdp_mpi.a')),
                      'install -m 644 include/dp_mpi.h %s' % pfx('include/dp_mpi.h'),
                      'install -m 644 %s %s' % (B('dp-mpi.pc'), pfx('lib/pkgconfig/dp-mpi.pc'))]
        if cuda:
            steps += ['install -m 644 %s %s' % (libcuda[0], pfx('lib/libdp_cuda.a')),
                      'install -m 644 %s %s' % (B('dp-cuda.pc'),
                                                pfx('lib/pkgconfig/dp-cuda.pc'))]
        n.build('install', 'console', [], [libdp, dp, B('dp.pc')] + libcuda + libmpi +
                ([B('dp-cuda.pc')] if cuda else []) + ([B('dp-mpi.pc')] if mpi else []),
                variables=[('cmd', '; '.join(steps)), ('desc', 'INSTALL ' + esc(args.prefix))])

    # ninja asan: configure build-asan/ and run its tests
    if not args.sanitize:
        asan_cmd = ('%s --builddir build-asan --sanitize && ninja -f build-asan/build.ninja test'
                    % esc(rerun))
        n.build('asan', 'console', variables=[('cmd', asan_cmd), ('desc', 'ASAN')])
        tsan_cmd = ('%s --builddir build-tsan --sanitize=thread && '
                    'ninja -f build-tsan/build.ninja test' % esc(rerun))
        n.build('tsan', 'console', variables=[('cmd', tsan_cmd), ('desc', 'TSAN')])
    n.newline()

    # ninja valgrind: tests/valgrind/*.c, each run under memcheck per device count
    if vbins:
        if valgrind:
            runs = ['%s %s %s' % (join(VALGRIND), shlex.quote(b), args)
                    for b in vbins for args in VALGRIND_RUNS]
            vcmd = ('set -e; ' + '; '.join('echo "== %s"; %s' % (r, r) for r in runs) +
                    '; echo "valgrind: %d runs, 0 errors, 0 definite/indirect leaks"' % len(runs))
        else:
            vcmd = ('echo "ninja valgrind: valgrind not found; install it with: '
                    'sudo apt-get install -y valgrind, then rerun ./configure.py"; exit 1')
        n.build('valgrind', 'console', [], vbins,
                variables=[('cmd', esc(vcmd)), ('desc', 'VALGRIND')])
        n.newline()

    # ninja fuzz: the library and tools again, with clang's coverage + ASan/UBSan, in
    # build-fuzz/; one program per fuzz/fuzz_*.c; fuzz/run.sh runs each FUZZ_SECONDS.
    fuzz_src = sources('fuzz/fuzz_*.c')
    if not args.sanitize and fuzz_src:
        fd = 'build-fuzz' if bd == 'build' else bd + '-fuzz'
        FO = lambda src: os.path.join(fd, os.path.splitext(src)[0] + '.o')
        if fuzz_cc:
            fcflags = (common + ['-Iinclude', '-Ilib', '-Itools', '-Ifuzz', '-iquote', 'cuda',
                                 '-O1', '-g', '-fsanitize=fuzzer-no-link'] + FUZZ_SANITIZE)
            n.variable('fuzzcc', esc(fuzz_cc))
            n.variable('fuzzcflags', esc(join(fcflags)))
            n.variable('fuzzldflags', esc(join(['-pthread', '-fsanitize=fuzzer'] +
                                               FUZZ_SANITIZE)))
            n.rule('fuzzcc', '$fuzzcc -MMD -MF $out.d $fuzzcflags -c $in -o $out',
                   depfile='$out.d', deps='gcc', description='FUZZCC $out')
            n.rule('fuzzlink', '$fuzzcc $fuzzldflags -o $out $in -lm -pthread',
                   description='FUZZLINK $out')
            fobjs = [n.build(FO(s), 'fuzzcc', [s])[0]
                     for s in lib_src]
            flib = n.build(os.path.join(fd, 'libdp.a'), 'ar', fobjs)
            ftools = n.build(os.path.join(fd, 'libdptools.a'), 'ar',
                             [n.build(FO(s), 'fuzzcc', [s])[0] for s in tool_src])
            fbins = []
            for s in fuzz_src:
                obj = n.build(FO(s), 'fuzzcc', [s])[0]
                fbins += n.build(os.path.join(fd, stem(s)), 'fuzzlink', [obj] + ftools + flib)
            # real checkpoints of the fuzz_checkpoint fixtures, in the current format
            gobj = n.build(O('fuzz/gen_ckpt_seeds.c'), 'cc', ['fuzz/gen_ckpt_seeds.c'],
                           variables=[('cflags', '$cflags -Ifuzz')])[0]
            gen = n.build(B('gen_ckpt_seeds'), 'link', [gobj, libdp])[0]
            fcmd = ('FUZZ_SECONDS=$${FUZZ_SECONDS:-60} fuzz/run.sh %s %s %s'
                    % (fd, esc(shlex.quote(gen)), join(esc(shlex.quote(stem(s)))
                                                        for s in fuzz_src)))
            # The target is named like the fuzz/ folder: run it through an output
            # that never exists, so that it always runs and `ninja -t clean` never
            # removes the folder.
            n.build(B('.run-fuzz'), 'console', [], fbins + [gen, 'fuzz/run.sh'],
                    variables=[('cmd', fcmd), ('desc', 'FUZZ')])
            n.build('fuzz', 'phony', [B('.run-fuzz')])
        else:
            fcmd = ('echo "ninja fuzz: %s; on Debian: sudo apt-get install -y clang '
                    'libclang-rt-14-dev (or set FUZZ_CC), then rerun ./configure.py"; exit 1'
                    % fuzz_reason)
            n.build(B('.run-fuzz'), 'console', variables=[('cmd', esc(fcmd)), ('desc', 'FUZZ')])
            n.build('fuzz', 'phony', [B('.run-fuzz')])
        n.newline()

    # regenerate build.ninja when this script, the .pc template or a source folder changes
    watched = ['configure.py', 'dp.pc.in', 'dp-cuda.pc.in', 'dp-mpi.pc.in'] + [d for d in SOURCE_DIRS
                                                               if os.path.isdir(d)]
    watched += sources('fuzz/*.c') + sources('fuzz/*.h')
    assert 'fuzz' not in watched
    n.build([manifest, suites_h, os.path.join(bd, 'gen', 'sim', 'suites.h'), B('dp.pc')] + ([B('dp-cuda.pc')] if cuda else []) +
            ([B('dp-mpi.pc')] if mpi else []),
            'configure', [], watched,
            variables=[('args', esc(shlex.join(rerun_args)))])

    # -- generated files
    write(suites_h, suites_header(suites))
    sim_suites = [x for x in find_suites(['tests/test_cuda.c', 'tests/test_cuda_api.c',
                                          'tests/test_cuda_fault.c'])]
    write(os.path.join(bd, 'gen', 'sim', 'suites.h'), suites_header(sim_suites))
    with open('dp.pc.in') as f:
        pc = f.read()
    pc = (pc.replace('@PREFIX@', args.prefix).replace('@VERSION@', dp_version())
          .replace('@LIBS@', join(sys_libs)))
    write(B('dp.pc'), pc)
    if cuda:
        with open('dp-cuda.pc.in') as f:
            pc = f.read()
        pc = (pc.replace('@PREFIX@', args.prefix).replace('@VERSION@', dp_version())
              .replace('@LIBS@', join(cuda_pc_libs)))
        write(B('dp-cuda.pc'), pc)
    if mpi:
        with open('dp-mpi.pc.in') as f:
            pc = f.read()
        write(B('dp-mpi.pc'), pc.replace('@PREFIX@', args.prefix)
              .replace('@VERSION@', dp_version()).replace('@LIBS@', join(mpi['libs']))
              .replace('@CFLAGS@', join(mpi['cflags'])))
    write(manifest, n.text())

    # -- summary
    _, ccv = run(shlex.split(cc) + ['--version'])
    print('libdp configure (%s):' % manifest)
    print('  C compiler  %s (%s)' % (cc, first_line(ccv)))
    if cuda:
        print('  CUDA        on: %s, nvcc %s, %s, -gencode for %s'
              % (cuda['home'], cuda['version'], cuda['nvcc'], args.cuda_arch))
        print('  cuBLAS      %s' % cuda['cublas'])
        print('  NCCL        %s' % ('%s/nccl.h, %s/libnccl.so' % nccl if nccl else 'not found'))
    else:
        print('  CUDA        %s' % cuda_state)
    sim_cxx = tool(os.environ.get('CXX', 'g++'))
    print('  CUDA sim    %s' % ((('on: %s (build/test_cuda_sim)' % sim_cxx) if sim_cxx
                                 else 'off: no g++ (the simulated GPU suites are left out)')
                                if not args.sanitize else 'off (sanitizer build)'))
    print('  MPI         %s' % ('on: %s' % mpi['version'] if mpi else mpi_state))
    print('  Check       %s' % check_version)
    print('  zlib        %s' % ('on (dp train reads gzip\'d IDX files)' if zlib else
                                'not found: gzip\'d IDX files are refused (apt-get install '
                                'zlib1g-dev)'))
    if not args.sanitize:
        print('  fuzz        %s' % (fuzz_cc + ' (libFuzzer)' if fuzz_cc else 'off: ' + fuzz_reason))
        print('  valgrind    %s' % (valgrind or 'not found'))
    print('  build       %s, %s' % (bd, join(opt)))
    print('  sources     %d lib, %d cuda, %d tools, %d suites, %d standalone, %d examples'
          % (len(lib_src), len(cuda_src), len(tool_src) + (dp is not None), len(suites),
             len(standalone_src), len(example_src)))
    print('  prefix      %s' % args.prefix)
    if bd == 'build':
        print('next: ninja && ninja test')
    else:
        print('next: ninja -f %s test' % manifest)


if __name__ == '__main__':
    main()
