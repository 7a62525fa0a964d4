#!/usr/bin/env python3
"""Side-by-side benchmark: libdp against a current PyTorch (CPU) and OpenBLAS, in
one run, on this machine, printed as ratios.

    python3 bench/compare.py            # after ./configure.py && ninja
    python3 bench/compare.py --markdown # the table docs/PERFORMANCE.md holds
    python3 bench/compare.py --builddir build-hb   # another build folder's dp
    python3 bench/compare.py --only mlp_large,gpt  # rows whose label has a word

Interleaved: each round runs every row's libdp step (bench/step_min.c), then
PyTorch's step of that row's model (bench/torch_step.py --serve: one server
process per thread count, started once), so that both sides see the same
machine; rounds 3 by default. Each side's figures: the best step of all
rounds and the median of the rounds' medians; a target is met when both
ratios meet it.

PyTorch is a current one from PyPI, in a venv: --python, or else
$DP_BENCH_VENV/bin/python, or else ~/.cache/libdp/torch-venv/bin/python; a
missing default venv is made (python3 -m venv V && V/bin/pip install torch
numpy). OpenBLAS (libopenblas-dev, through apt as root when missing) for the
GEMM rows: OPENBLAS_CORETYPE unset so it picks its best kernel, which is named.
Benchmarks measure; nothing here asserts."""
import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, 'build')
DP = os.path.join(BUILD, 'dp')

# (label, model file, batch, optimizer, libdp devices, libdp mode, torch threads (1, 2)
# or 'best' (the faster of the two), torch model key, target on the speed-up = torch ms /
# libdp ms (both on the best and on the median), its text, libdp steps timed per round).
# Issue 31 item 4 compares 2 devices with PyTorch on 2 threads (fp32); the small models
# with PyTorch's best setting.
TGT_08 = '<= 0.8x torch time (>= 1.25x)'
TGT_05 = '<= 0.5x torch fp32 time (>= 2x)'
STEPS = [
    ('seed Linear(5,2) B=30 sgd, 2 dev vs torch best', 'examples/seed.dpm', 30, 'sgd', 2,
     'classic', 'best', 'seed', 10.0, '>= 10x', 20000),
    ('mlp 64-128-10 B=256 adamw, 2 dev vs torch best', 'bench/models/mlp_small.dpm', 256,
     'adamw', 2, 'classic', 'best', 'mlp_small', 5.0, '>= 5x', 3000),
    ('mlp 64-128-10 B=256 adamw, 1 dev vs torch best', 'bench/models/mlp_small.dpm', 256,
     'adamw', 1, 'classic', 'best', 'mlp_small', None, '-', 3000),
    ('mlp_large 784-1024-1024-10 B=256 sgd, 1 dev vs torch 1 thread',
     'bench/models/mlp_large.dpm', 256, 'sgd', 1, 'classic', 1, 'mlp_large', None, '-', 40),
    ('mlp_large 784-1024-1024-10 B=256 sgd, 2 dev vs torch 2 threads',
     'bench/models/mlp_large.dpm', 256, 'sgd', 2, 'classic', 2, 'mlp_large', 1.25, TGT_08, 60),
    # the cpu backend's params=shared: one copy of the weights for both devices (TOOL.md)
    ('mlp_large 784-1024-1024-10 B=256 sgd, 2 dev params=shared vs torch 2 threads',
     'bench/models/mlp_large.dpm', 256, 'sgd', 2, 'classic+shared', 2, 'mlp_large', 1.25,
     TGT_08, 60),
    ('mlp_large 784-1024-1024-10 B=256 sgd, 2 dev allreduce vs torch 2 threads',
     'bench/models/mlp_large.dpm', 256, 'sgd', 2, 'allreduce', 2, 'mlp_large', None, '-', 60),
    ('mlp_large 784-1024-1024-10 B=256 sgd, 2 dev sharded vs torch 2 threads',
     'bench/models/mlp_large.dpm', 256, 'sgd', 2, 'sharded', 2, 'mlp_large', None, '-', 60),
    # image layers (issue 17): the same nn.Sequential on both sides (torch_step.py
    # builds it from the spec file), one core each; goal: at least PyTorch's speed
    ('cnn digits 1x8x8 B=256 adamw, 1 dev vs torch 1 thread', 'bench/models/cnn_digits.dpm',
     256, 'adamw', 1, 'classic', 1, 'cnn_digits', 1.0, '>= 1x', 200),
    ('cnn digits 1x8x8 B=256 adamw, 2 dev vs torch best', 'bench/models/cnn_digits.dpm',
     256, 'adamw', 2, 'classic', 'best', 'cnn_digits', 5.0, '>= 5x', 200),
    ('cnn cifar 3x32x32 B=256 sgd, 1 dev vs torch 1 thread', 'bench/models/cnn_cifar.dpm',
     256, 'sgd', 1, 'classic', 1, 'cnn_cifar', 1.0, '>= 1x', 10),
    ('cnn cifar 3x32x32 B=256 sgd, 2 dev vs torch 2 threads', 'bench/models/cnn_cifar.dpm',
     256, 'sgd', 2, 'classic', 2, 'cnn_cifar', None, '-', 10),
    # transformers (issue 29): 2 devices against PyTorch on 2 threads; goal <= 0.8x its time
    ('tiny_gpt T=64 D=128 B=16 adamw, 2 dev vs torch 2 threads', 'bench/models/tiny_gpt.dpm',
     16, 'adamw', 2, 'classic', 2, 'tiny_gpt', 1.25, TGT_08, 20),
    ('gpt_wide T=256 D=384 L=6 B=8 adamw, 2 dev vs torch 2 threads',
     'bench/models/gpt_wide.dpm', 8, 'adamw', 2, 'classic', 2, 'gpt_wide', 1.25, TGT_08, 4),
    # bf16 mixed precision (issue 31 item 2; mode 'classic/bf16': docs/PRECISION.md)
    # against PyTorch's fp32: goal <= 0.5x its time where the CPU has AVX512-BF16
    ('mlp_large 784-1024-1024-10 B=256 sgd, bf16, 1 dev vs torch fp32 1 thread',
     'bench/models/mlp_large.dpm', 256, 'sgd', 1, 'classic/bf16', 1, 'mlp_large', None, '-',
     40),
    ('mlp_large 784-1024-1024-10 B=256 sgd, bf16, 2 dev vs torch fp32 2 threads',
     'bench/models/mlp_large.dpm', 256, 'sgd', 2, 'classic/bf16', 2, 'mlp_large', 2.0,
     TGT_05, 60),
    ('mlp_large 784-1024-1024-10 B=256 sgd, bf16, 2 dev params=shared vs torch fp32 2 '
     'threads', 'bench/models/mlp_large.dpm', 256, 'sgd', 2, 'classic+shared/bf16', 2,
     'mlp_large', 2.0, TGT_05, 60),
    ('gpt_wide T=256 D=384 L=6 B=8 adamw, bf16, 2 dev vs torch fp32 2 threads',
     'bench/models/gpt_wide.dpm', 8, 'adamw', 2, 'classic/bf16', 2, 'gpt_wide', 2.0, TGT_05,
     4),
]
SCALING_TARGET = 1.8
# the scaling line: one device against two in each mode
MLP_LARGE_1 = STEPS[3][0]
MLP_LARGE_2 = [(st[5], st[0]) for st in STEPS
               if st[1].endswith('mlp_large.dpm') and st[4] == 2 and '/' not in st[5]]
# bf16 against libdp's own fp32, with copies and with shared parameters: labels of the
# whole list (--only filters STEPS)
_MLP_BF16_2 = {st[5]: st[0] for st in STEPS if st[1].endswith('mlp_large.dpm') and st[4] == 2}
BF16_PAIRS = [(_MLP_BF16_2[m], _MLP_BF16_2[m + '/bf16']) for m in ('classic', 'classic+shared')]
# the default venv of a current PyTorch from PyPI
VENV = os.environ.get('DP_BENCH_VENV') or os.path.expanduser('~/.cache/libdp/torch-venv')


def sh(cmd, env=None):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT,
                          env=env).stdout


def apt_install(pkgs):
    if os.geteuid() != 0:
        sys.exit('compare.py: missing %s; run: sudo apt-get install -y %s'
                 % (' '.join(pkgs), ' '.join(pkgs)))
    env = dict(os.environ, DEBIAN_FRONTEND='noninteractive')
    subprocess.run(['apt-get', 'update', '-qq'], check=True, env=env)
    subprocess.run(['apt-get', 'install', '-y', '-qq'] + pkgs, check=True, env=env)


PYTHON = os.path.join(VENV, 'bin', 'python')


def has_torch(python):
    return os.path.exists(python) and subprocess.run(
        [python, '-c', 'import torch'], capture_output=True).returncode == 0


def ensure_torch(given):
    """A python with torch: the one given, or the default venv (made when missing)."""
    if has_torch(PYTHON):
        return
    if given:
        sys.exit('compare.py: %s has no torch; make a venv: python3 -m venv V && '
                 'V/bin/pip install torch numpy, then --python V/bin/python' % PYTHON)
    print('compare.py: making %s (python3 -m venv, pip install torch numpy)' % VENV,
          file=sys.stderr)
    subprocess.run([sys.executable, '-m', 'venv', VENV], check=True)
    subprocess.run([PYTHON, '-m', 'pip', 'install', '-q', 'torch', 'numpy'], check=True)
    if not has_torch(PYTHON):
        sys.exit('compare.py: torch did not install into %s' % VENV)


def mkl_path():
    """The line MKL_VERBOSE prints first: MKL's version and the code path it took."""
    env = dict(os.environ, MKL_VERBOSE='1', OMP_NUM_THREADS='1')
    r = subprocess.run([PYTHON, '-c', 'import torch; torch.mm(torch.ones(64, 64), '
                        'torch.ones(64, 64))'], capture_output=True, text=True, env=env)
    for line in r.stdout.splitlines():
        if line.startswith('MKL_VERBOSE') and 'SGEMM' not in line:
            return line[len('MKL_VERBOSE'):].strip()
    return 'no MKL_VERBOSE line'


class TorchServer:
    """bench/torch_step.py --serve on `threads` threads (OMP_NUM_THREADS and
    torch.set_num_threads), started once: a timing per request, no import per run."""

    def __init__(self, threads):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                   OPENBLAS_NUM_THREADS=str(threads))
        self.p = subprocess.Popen([PYTHON, 'bench/torch_step.py', '--serve', '--threads',
                                   str(threads)], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.info = json.loads(self.p.stdout.readline())

    def time(self, model, seconds):
        self.p.stdin.write('%s %g\n' % (model, seconds))
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            sys.exit('compare.py: the PyTorch server stopped')
        return json.loads(line)

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def openblas_gemm(sizes):
    exe = os.path.join(BUILD, 'bench_sgemm_openblas')

    def build():
        inc = [d for d in ['/usr/include/x86_64-linux-gnu/openblas-pthread',
                           '/usr/include/openblas'] if os.path.isdir(d)]
        return subprocess.run([os.environ.get('CC', 'cc'), '-O2', 'bench/sgemm_openblas.c',
                               '-o', exe] + ['-I' + d for d in inc] + ['-lopenblas'],
                              cwd=ROOT, capture_output=True).returncode == 0

    if not build():  # Debian's libopenblas-dev provides -lopenblas and its cblas.h
        apt_install(['libopenblas-dev'])
        if not build():
            sys.exit('compare.py: cannot build bench/sgemm_openblas.c against OpenBLAS')
    env = {k: v for k, v in os.environ.items() if k != 'OPENBLAS_CORETYPE'}
    env['OPENBLAS_NUM_THREADS'] = '1'
    return json.loads(sh([exe] + [str(s) for s in sizes], env=env))


def dp_json(args):
    return json.loads(sh([DP, 'bench'] + args + ['--json']))


def step_min_exe():
    """bench/step_min.c against the build's libdp.a: single steps timed, min/median/mean."""
    exe = os.path.join(BUILD, 'bench_step_min')
    r = subprocess.run([os.environ.get('CC', 'cc'), '-O2', '-Iinclude', 'bench/step_min.c',
                        os.path.join(BUILD, 'libdp.a'), '-lm', '-pthread', '-o', exe],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit('compare.py: cannot build bench/step_min.c:\n' + r.stderr)
    return exe


def gemm_pair():
    """bench/gemm_pair.c: the large MLP's GEMMs alone, 256 rows on one core against 128 rows
    on each of two at once (the scaling the arithmetic alone allows here)."""
    exe = os.path.join(BUILD, 'bench_gemm_pair')
    r = subprocess.run([os.environ.get('CC', 'cc'), '-O2', '-Iinclude', '-Ilib',
                        'bench/gemm_pair.c', os.path.join(BUILD, 'libdp.a'), '-lm', '-pthread',
                        '-o', exe], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit('compare.py: cannot build bench/gemm_pair.c:\n' + r.stderr)
    return json.loads(sh([exe, '15']))


def dp_step(exe, model, batch, devs, mode, opt, steps):
    """One run of bench/step_min.c: min, median and mean ms of single steps. mode:
    classic, allreduce or sharded, with '+shared' for the cpu backend's params=shared and
    '/bf16' for precision bf16."""
    mode, _, precision = mode.partition('/')
    mode, _, shared = mode.partition('+')
    return json.loads(sh([exe, model, str(batch), str(devs), opt, str(steps), mode,
                          precision or 'fp32'] + (['params=shared'] if shared else [])))


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def summary(runs):
    """Rounds' results -> the best step of all and the median of the rounds' medians."""
    return {'best': min(r['min_ms'] for r in runs),
            'median': median([r['median_ms'] for r in runs]), 'rounds': len(runs)}


def loadavg():
    return open('/proc/loadavg').read().split()[0]


def run_rounds(args, exe, servers):
    """Every row's libdp step, then PyTorch's step of its model on the thread counts it
    compares with (each (model, threads) once per round, right after the first row that
    needs it): `rounds` times. Returns the per-row libdp runs and per-(model, threads)
    PyTorch runs, and the load average after each round."""
    ours, theirs, loads = {}, {}, []
    for _ in range(args.rounds):
        done = set()
        for (label, model, batch, opt, devs, mode, threads, tkey, tgt, ttext, steps) in STEPS:
            ours.setdefault(label, []).append(dp_step(exe, model, batch, devs, mode, opt,
                                                      steps))
            for th in ((1, 2) if threads == 'best' else (threads,)):
                if (tkey, th) not in done:
                    done.add((tkey, th))
                    theirs.setdefault((tkey, th), []).append(servers[th].time(tkey,
                                                                              args.seconds))
        loads.append(loadavg())
    return ours, theirs, loads


def verdict(tgt, r_best, r_med):
    if tgt is None:
        return '-'
    if r_best >= tgt and r_med >= tgt:
        return 'met'
    return 'met on the best only' if r_best >= tgt else \
        'met on the median only' if r_med >= tgt else 'not met'


def print_header(args, peak, info, mkl, blas, loads, load0):
    print('machine: %s' % sh(['sh', '-c', "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"]).strip())
    print('load average (1 min): %s at the start, %s after each round' % (load0, ', '.join(loads)))
    print('peak (one core): avx512 %.1f, avx2 %.1f GFLOP/s' % (peak['avx512'], peak['avx2']))
    print('PyTorch %s (%s): BLAS %s, MKL %s, oneDNN %s%s, CPU capability %s; threads 1 '
          'and 2 (OMP_NUM_THREADS, torch.set_num_threads), fp32' %
          (info['torch_version'], PYTHON, info.get('blas', '?'), info.get('mkl_version', '-'),
           info.get('onednn_version', '-'), ' (on)' if info.get('mkldnn') else ' (off)',
           info.get('cpu_capability', '?')))
    print('MKL_VERBOSE: %s' % mkl)
    print('OpenBLAS kernel %s' % blas['core'])
    print('step times: per side, the best single step of %d interleaved rounds and the median '
          'of the rounds\' medians; speed-up = PyTorch ms / libdp ms\n' % args.rounds)


def print_rows(args, rows):
    if args.markdown:
        print('| step | libdp best ms | PyTorch best ms | speed-up (best) | libdp median ms | '
              'PyTorch median ms | speed-up (median) | target (best and median) |')
        print('|---|---:|---:|---:|---:|---:|---:|---|')
        for row in rows:
            print('| %s | %.4f | %.4f | %.2fx | %.4f | %.4f | %.2fx | %s |' % row)
    else:
        print('%-66s %9s %9s %8s %9s %9s %8s  %s' % ('step', 'libdp bst', 'torch bst',
                                                    'speed-up', 'libdp med', 'torch med',
                                                    'speed-up', 'target'))
        for row in rows:
            print('%-66s %9.4f %9.4f %7.2fx %9.4f %9.4f %7.2fx  %s' % row)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--markdown', action='store_true')
    ap.add_argument('--seconds', type=float, default=1.0,
                    help='PyTorch time per model and round')
    ap.add_argument('--builddir', default='build', help='the build folder whose dp runs')
    ap.add_argument('--rounds', type=int, default=3, help='interleaved rounds')
    ap.add_argument('--python', default=None,
                    help='the interpreter whose torch runs (default: a venv with a current '
                    'PyTorch from PyPI, $DP_BENCH_VENV or ~/.cache/libdp/torch-venv, made '
                    'when missing)')
    ap.add_argument('--only', default='',
                    help='run only the step rows whose label contains one of these '
                    'comma-separated words (e.g. cnn); the sgemm table is kept')
    args = ap.parse_args()
    global DP, BUILD, STEPS, PYTHON
    if args.python:
        PYTHON = args.python
    if args.only:
        words = args.only.split(',')
        STEPS = [st for st in STEPS if any(w in st[0] for w in words)]
        if not STEPS:
            sys.exit('compare.py: --only %s matches no row' % args.only)
    BUILD = os.path.join(ROOT, args.builddir)
    DP = os.path.join(BUILD, 'dp')
    if not os.path.exists(DP):
        sys.exit('compare.py: build first: ./configure.py && ninja')
    ensure_torch(args.python)
    load0 = loadavg()

    peak = dp_json(['peak'])['peak_gflops']
    ours_gemm = dp_json(['gemm', '--sizes', '512,1024'])
    blas = openblas_gemm([512, 1024])
    mkl = mkl_path()
    servers = {n: TorchServer(n) for n in (1, 2)}
    exe = step_min_exe()
    ours, theirs, loads = run_rounds(args, exe, servers)
    info = servers[1].info
    for sv in servers.values():
        sv.close()

    rows = []
    for (label, model, batch, opt, devs, mode, threads, tkey, tgt, ttext, steps) in STEPS:
        g = summary(ours[label])
        # 'best': PyTorch's faster thread count, for each figure on its own
        cand = [summary(theirs[(tkey, n)]) for n in ((1, 2) if threads == 'best'
                                                    else (threads,))]
        t = {k: min(c[k] for c in cand) for k in ('best', 'median')}
        r_best, r_med = t['best'] / g['best'], t['median'] / g['median']
        text = ttext if tgt is None else '%s: %s' % (ttext, verdict(tgt, r_best, r_med))
        rows.append((label, g['best'], t['best'], r_best, g['median'], t['median'], r_med, text))
    # (mode, 1 device / 2 devices on the best, on the medians)
    scaling = []
    for mode, l in MLP_LARGE_2:
        if MLP_LARGE_1 in ours and l in ours:
            one, two = summary(ours[MLP_LARGE_1]), summary(ours[l])
            scaling.append((mode, one['best'] / two['best'], one['median'] / two['median']))
    pair = gemm_pair() if scaling else None

    print_header(args, peak, info, mkl, blas, loads, load0)
    print_rows(args, rows)
    if args.markdown:
        print('\n| sgemm n | libdp GFLOP/s | OpenBLAS GFLOP/s | ratio | % of peak |')
        print('|---:|---:|---:|---:|---:|')
    else:
        print('\n%8s %14s %17s %7s %9s' % ('sgemm n', 'libdp GFLOP/s', 'OpenBLAS GFLOP/s',
                                            'ratio', '% peak'))
    pk = peak['avx512'] or peak['avx2']
    for o, b in zip(ours_gemm['results'], blas['results']):
        fmt = '| %d | %.1f | %.1f | %.2fx | %.0f%% |' if args.markdown else '%8d %14.1f %17.1f %6.2fx %8.0f%%'
        print(fmt % (o['n'], o['gflops'], b['gflops'], o['gflops'] / b['gflops'],
                     100 * o['gflops'] / pk))
    for mode, scale_best, scale_med in scaling:
        print('%smlp_large, %s: 2 virtual devices give %.2fx the samples/s of 1 on the best '
              '(%.2fx on the medians); target >= %.1fx: %s'
              % ('\n' if mode == scaling[0][0] else '', mode, scale_best, scale_med,
                 SCALING_TARGET, verdict(SCALING_TARGET, scale_best, scale_med)))
    if pair:
        print('mlp_large\'s GEMMs alone (bench/gemm_pair.c, no step around them): 256 rows on '
              'one core %.2f ms, 128 rows on each of two cores at once %.2f ms: %.2fx'
              % (pair['one_core_256_rows_ms'], pair['two_cores_128_rows_ms'],
                 pair['scaling']))
    for r in rows:  # issue 31's wording: libdp's time as a fraction of PyTorch's
        if r[7].startswith(TGT_08) or r[7].startswith(TGT_05):
            print('%s: libdp\'s time %.2fx PyTorch\'s on the best, %.2fx on the median '
                  '(goal <= %s)' % (r[0], 1 / r[3], 1 / r[6],
                                    '0.8x' if r[7].startswith(TGT_08) else '0.5x'))
    by_label = {r[0]: r for r in rows}
    for fp, bf in BF16_PAIRS:  # bf16 against libdp's own fp32
        if fp in by_label and bf in by_label:
            # r[1]: libdp best ms, r[4]: libdp median ms
            print('mlp_large 2 dev%s: bf16 %.2fx faster than fp32 on the best, %.2fx on the '
                  'median (goal >= 1.5x where AVX512-BF16 exists)'
                  % (' params=shared' if 'shared' in fp else '',
                     by_label[fp][1] / by_label[bf][1], by_label[fp][4] / by_label[bf][4]))
    cnn = [r for r in rows if r[0].startswith('cnn') and r[7].startswith('>= 1x')]
    if cnn:
        print('\nimage layers (issue 17), one core each: libdp at %s PyTorch\'s speed '
              '(best; %s on the medians); goal >= 1.0x: %s'
              % (', '.join('%.2fx' % r[3] for r in cnn), ', '.join('%.2fx' % r[6] for r in cnn),
                 'met' if all(r[3] >= 1.0 and r[6] >= 1.0 for r in cnn) else 'not met'))


if __name__ == '__main__':
    main()
