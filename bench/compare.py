#!/usr/bin/env python3
"""Side-by-side benchmark: libdp against PyTorch CPU and OpenBLAS, in one run,
on this machine, printed as ratios.

    python3 bench/compare.py            # after ./configure.py && ninja
    python3 bench/compare.py --markdown # the table docs/PERFORMANCE.md holds
    python3 bench/compare.py --builddir build-hb   # another build folder's dp
    python3 bench/compare.py --only cnn            # the rows whose label has "cnn"

Installs what it needs when missing (as root, through apt): Debian's
python3-torch (run under /usr/bin/python3) and libopenblas-dev. Unsets
OPENBLAS_CORETYPE for the GEMM comparison so OpenBLAS picks its best kernel,
and names the kernel it ran. Benchmarks measure; nothing here asserts."""
import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, 'build')
DP = os.path.join(BUILD, 'dp')

# (label, model file, batch, optimizer, libdp devices, libdp mode, torch threads or
# 'best', torch model key, target on the speed-up = torch ms / libdp ms, its text, libdp
# steps timed). Issue 15 compares libdp's step with PyTorch's best setting (1 or 2
# threads, whichever is faster on this machine).
STEPS = [
    ('seed Linear(5,2) B=30 sgd, 2 dev vs torch best', 'examples/seed.dpm', 30, 'sgd', 2,
     'classic', 'best', 'seed', 10.0, '>= 10x', 20000),
    ('mlp 64-128-10 B=256 adamw, 2 dev vs torch best', 'bench/models/mlp_small.dpm', 256,
     'adamw', 2, 'classic', 'best', 'mlp_small', 5.0, '>= 5x', 3000),
    ('mlp 64-128-10 B=256 adamw, 1 dev vs torch best', 'bench/models/mlp_small.dpm', 256,
     'adamw', 1, 'classic', 'best', 'mlp_small', None, '-', 3000),
    ('mlp 784-1024-1024-10 B=256 sgd, 1 dev vs torch best', 'bench/models/mlp_large.dpm', 256,
     'sgd', 1, 'classic', 'best', 'mlp_large', None, '-', 60),
    ('mlp 784-1024-1024-10 B=256 sgd, 2 dev vs torch best', 'bench/models/mlp_large.dpm', 256,
     'sgd', 2, 'classic', 'best', 'mlp_large', 1 / 0.6, '<= 0.6x torch time (>= 1.67x)', 60),
    ('mlp 784-1024-1024-10 B=256 sgd, 2 dev allreduce', 'bench/models/mlp_large.dpm', 256,
     'sgd', 2, 'allreduce', 'best', 'mlp_large', None, '-', 60),
    ('mlp 784-1024-1024-10 B=256 sgd, 2 dev sharded', 'bench/models/mlp_large.dpm', 256,
     'sgd', 2, 'sharded', 'best', 'mlp_large', None, '-', 60),
    # image layers (issue 17): the same nn.Sequential on both sides (torch_step.py
    # builds it from the spec file), one core each; goal: at least PyTorch's speed
    ('cnn digits 1x8x8 B=256 adamw, 1 dev vs torch 1 thread', 'bench/models/cnn_digits.dpm',
     256, 'adamw', 1, 'classic', 1, 'cnn_digits', 1.0, '>= 1x', 200),
    ('cnn cifar 3x32x32 B=256 sgd, 1 dev vs torch 1 thread', 'bench/models/cnn_cifar.dpm',
     256, 'sgd', 1, 'classic', 1, 'cnn_cifar', 1.0, '>= 1x', 10),
    ('cnn cifar 3x32x32 B=256 sgd, 2 dev vs torch best', 'bench/models/cnn_cifar.dpm', 256,
     'sgd', 2, 'classic', 'best', 'cnn_cifar', None, '-', 10),
    # transformers (issue 29): 2 devices against PyTorch on 2 threads; goal <= 0.8x its time
    ('tiny_gpt T=64 D=128 B=16 adamw, 2 dev vs torch 2 threads', 'bench/models/tiny_gpt.dpm',
     16, 'adamw', 2, 'classic', 2, 'tiny_gpt', 1.25, '<= 0.8x torch time (>= 1.25x)', 20),
    ('gpt_wide T=256 D=384 L=6 B=8 adamw, 2 dev vs torch 2 threads',
     'bench/models/gpt_wide.dpm', 8, 'adamw', 2, 'classic', 2, 'gpt_wide', 1.25,
     '<= 0.8x torch time (>= 1.25x)', 3),
]
SCALING_TARGET = 1.8
# the scaling line: one device against two in each mode
MLP_LARGE_1 = STEPS[3][0]
MLP_LARGE_2 = [(st[5], st[0]) for st in STEPS[4:7]]


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


PYTHON = '/usr/bin/python3'


def ensure_torch():
    if subprocess.run([PYTHON, '-c', 'import torch'], capture_output=True).returncode == 0:
        return
    if PYTHON != '/usr/bin/python3':
        sys.exit('compare.py: %s has no torch; make one: python3 -m venv V && '
                 'V/bin/pip install torch numpy safetensors' % PYTHON)
    apt_install(['python3-torch'])


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


def dp_step(exe, model, batch, devs, mode, opt, steps, rounds):
    """The best of `rounds` runs (interleaved by the caller): min, median and mean ms."""
    best = None
    for _ in range(rounds):
        r = json.loads(sh([exe, model, str(batch), str(devs), opt, str(steps), mode]))
        if best is None:
            best = r
        else:
            for k in ('min_ms', 'median_ms', 'mean_ms'):
                best[k] = min(best[k], r[k])
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--markdown', action='store_true')
    ap.add_argument('--seconds', type=float, default=1.0, help='PyTorch time per model')
    ap.add_argument('--builddir', default='build', help='the build folder whose dp runs')
    ap.add_argument('--rounds', type=int, default=3, help='libdp rounds (best of them)')
    ap.add_argument('--python', default='/usr/bin/python3',
                    help='the interpreter whose torch runs (default Debian\'s; a current '
                    'PyTorch from PyPI: python3 -m venv V && V/bin/pip install torch, '
                    'then --python V/bin/python)')
    ap.add_argument('--only', default='',
                    help='run only the step rows whose label contains one of these '
                    'comma-separated words (e.g. cnn); the sgemm table is kept')
    args = ap.parse_args()
    global DP, BUILD, STEPS, PYTHON
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
    ensure_torch()

    peak = dp_json(['peak'])['peak_gflops']
    ours = dp_json(['gemm', '--sizes', '512,1024'])
    blas = openblas_gemm([512, 1024])
    # torch.set_num_threads does not reach Debian torch's BLAS (OpenBLAS through the
    # generic path): each thread count runs in its own process with OpenBLAS and OpenMP
    # limited to it before torch is imported, so "1 thread" really uses one core.
    torch = {'results': []}
    for n in (1, 2):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(n), OMP_NUM_THREADS=str(n))
        models = sorted({st[7] for st in STEPS})
        one = json.loads(sh([PYTHON, 'bench/torch_step.py', '--threads', str(n),
                             '--seconds', str(args.seconds), '--models', ','.join(models)],
                            env=env))
        torch['torch_version'] = one['torch_version']
        torch['mkldnn'] = one.get('mkldnn')
        torch['results'] += one['results']
    def torch_ref(key, threads, field):
        rs = [r for r in torch['results'] if r['model'] == key and
              (threads == 'best' or r['threads'] == threads)]
        return min(r[field] for r in rs)

    # libdp: every configuration once per round, rounds interleaved, best of them
    exe = step_min_exe()
    got = {}
    for _ in range(args.rounds):
        for (label, model, batch, opt, devs, mode, threads, tkey, tgt, ttext, steps) in STEPS:
            r = dp_step(exe, model, batch, devs, mode, opt, steps, 1)
            g = got.setdefault(label, r)
            for k in ('min_ms', 'median_ms', 'mean_ms'):
                g[k] = min(g[k], r[k])
    rows = []
    for (label, model, batch, opt, devs, mode, threads, tkey, tgt, ttext, steps) in STEPS:
        g = got[label]
        tmin, tmean = torch_ref(tkey, threads, 'min_ms'), torch_ref(tkey, threads, 'ms_per_step')
        ratio = tmin / g['min_ms']
        verdict = '-' if tgt is None else ('met' if ratio >= tgt else 'not met')
        rows.append((label, g['min_ms'], tmin, ratio, g['mean_ms'], tmean, tmean / g['mean_ms'],
                     ttext + ('' if tgt is None else ': ' + verdict)))
    # (mode, 1 device / 2 devices on the minima, on the means)
    scaling = [(mode, got[MLP_LARGE_1]['min_ms'] / got[l]['min_ms'],
                got[MLP_LARGE_1]['mean_ms'] / got[l]['mean_ms'])
               for mode, l in MLP_LARGE_2 if MLP_LARGE_1 in got and l in got]
    pair = gemm_pair() if scaling else None

    print('machine: %s' % sh(['sh', '-c', "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"]).strip())
    print('load average at the end: %s' % open('/proc/loadavg').read().split()[0])
    print('peak (one core): avx512 %.1f, avx2 %.1f GFLOP/s' % (peak['avx512'], peak['avx2']))
    print('PyTorch %s (CPU%s); OpenBLAS kernel %s'
          % (torch['torch_version'], ', oneDNN (mkldnn) on' if torch.get('mkldnn') else '',
             blas['core']))
    print('step times: the fastest single step (best of %d rounds; PyTorch: of its run), '
          'then the mean\n' % args.rounds)
    if args.markdown:
        print('| step | libdp min ms | PyTorch min ms | speed-up | libdp mean ms | '
              'PyTorch mean ms | speed-up (means) | target (on the minima) |')
        print('|---|---:|---:|---:|---:|---:|---:|---|')
        for row in rows:
            print('| %s | %.4f | %.4f | %.2fx | %.4f | %.4f | %.2fx | %s |' % row)
        print('\n| sgemm n | libdp GFLOP/s | OpenBLAS GFLOP/s | ratio | % of peak |')
        print('|---:|---:|---:|---:|---:|')
    else:
        print('%-54s %9s %9s %8s %9s %9s %8s  %s' % ('step', 'libdp min', 'torch min', 'speed-up',
                                                    'libdp avg', 'torch avg', 'speed-up',
                                                    'target'))
        for row in rows:
            print('%-54s %9.4f %9.4f %7.2fx %9.4f %9.4f %7.2fx  %s' % row)
        print('\n%8s %14s %17s %7s %9s' % ('sgemm n', 'libdp GFLOP/s', 'OpenBLAS GFLOP/s',
                                            'ratio', '% peak'))
    pk = peak['avx512'] or peak['avx2']
    for o, b in zip(ours['results'], blas['results']):
        fmt = '| %d | %.1f | %.1f | %.2fx | %.0f%% |' if args.markdown else '%8d %14.1f %17.1f %6.2fx %8.0f%%'
        print(fmt % (o['n'], o['gflops'], b['gflops'], o['gflops'] / b['gflops'],
                     100 * o['gflops'] / pk))
    for mode, scale_min, scale_mean in scaling:
        print('%smlp_large, %s: 2 virtual devices give %.2fx the samples/s of 1 on the minima '
              '(%.2fx on the means); target >= %.1fx: %s'
              % ('\n' if mode == scaling[0][0] else '', mode, scale_min, scale_mean,
                 SCALING_TARGET, 'met' if scale_min >= SCALING_TARGET else 'not met'))
    if pair:
        print('mlp_large\'s GEMMs alone (bench/gemm_pair.c, no step around them): 256 rows on '
              'one core %.2f ms, 128 rows on each of two cores at once %.2f ms: %.2fx'
              % (pair['one_core_256_rows_ms'], pair['two_cores_128_rows_ms'],
                 pair['scaling']))
    cnn = [r for r in rows if r[0].startswith('cnn') and r[7] != '-']
    if cnn:
        print('\nimage layers (issue 17), one core each: libdp at %s PyTorch\'s speed '
              '(minima; %s on the means); goal >= 1.0x: %s'
              % (', '.join('%.2fx' % r[3] for r in cnn), ', '.join('%.2fx' % r[6] for r in cnn),
                 'met' if all(r[3] >= 1.0 for r in cnn) else 'not met'))


if __name__ == '__main__':
    main()
