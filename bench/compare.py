#!/usr/bin/env python3
"""Side-by-side benchmark: libdp against PyTorch CPU and OpenBLAS, in one run,
on this machine, printed as ratios.

    python3 bench/compare.py            # after ./configure.py && ninja
    python3 bench/compare.py --markdown # the table docs/PERFORMANCE.md holds

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
DP = os.path.join(ROOT, 'build', 'dp')

# (label, model file, batch, optimizer, libdp devices, torch threads, target)
STEPS = [
    ('seed Linear(5,2) B=30 sgd', 'examples/seed.dpm', 30, 'sgd', 2, 1, 'seed', '>= 10x'),
    ('mlp 64-128-10 B=256 adamw', 'bench/models/mlp_small.dpm', 256, 'adamw', 1, 1,
     'mlp_small', '>= 5x'),
    ('mlp 784-1024-1024-10 B=256 sgd, 1 dev', 'bench/models/mlp_large.dpm', 256, 'sgd', 1, 1,
     'mlp_large', '>= 2x torch best'),
    ('mlp 784-1024-1024-10 B=256 sgd, 2 dev', 'bench/models/mlp_large.dpm', 256, 'sgd', 2, 2,
     'mlp_large', '>= 2x torch best'),
]


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


def ensure_torch():
    if subprocess.run(['/usr/bin/python3', '-c', 'import torch'],
                      capture_output=True).returncode != 0:
        apt_install(['python3-torch'])


def openblas_gemm(sizes):
    exe = os.path.join(ROOT, 'build', 'bench_sgemm_openblas')

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--markdown', action='store_true')
    ap.add_argument('--seconds', type=float, default=1.0, help='PyTorch time per model')
    args = ap.parse_args()
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
        torch['results'] += json.loads(sh(['/usr/bin/python3', 'bench/torch_step.py',
                                           '--threads', str(n), '--seconds',
                                           str(args.seconds)], env=env))['results']
    tbest = {}
    for r in torch['results']:
        key = r['model']
        tbest[key] = min(tbest.get(key, 1e30), r['ms_per_step'])
    t1 = {r['model']: r['ms_per_step'] for r in torch['results'] if r['threads'] == 1}
    t2 = {r['model']: r['ms_per_step'] for r in torch['results'] if r['threads'] == 2}

    rows = []
    for (label, model, batch, opt, devs, threads, tkey, target) in STEPS:
        r = dp_json(['step', '--model', model, '--batch', str(batch), '--optimizer', opt,
                     '--devices', str(devs)])
        tref = tbest[tkey] if 'best' in target else (t1 if threads == 1 else t2)[tkey]
        rows.append((label, r['ms_per_step'], tref, tref / r['ms_per_step'], target))

    print('machine: %s' % sh(['sh', '-c', "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"]).strip())
    print('peak (one core): avx512 %.1f, avx2 %.1f GFLOP/s' % (peak['avx512'], peak['avx2']))
    print('PyTorch %s (CPU); OpenBLAS kernel %s\n' % (torch['torch_version'], blas['core']))
    if args.markdown:
        print('| step | libdp ms | PyTorch ms | speed-up | target |')
        print('|---|---:|---:|---:|---|')
        for (label, ms, tref, ratio, target) in rows:
            print('| %s | %.4f | %.4f | %.2fx | %s |' % (label, ms, tref, ratio, target))
        print('\n| sgemm n | libdp GFLOP/s | OpenBLAS GFLOP/s | ratio | % of peak |')
        print('|---:|---:|---:|---:|---:|')
    else:
        print('%-40s %10s %10s %9s  %s' % ('step', 'libdp ms', 'torch ms', 'speed-up', 'target'))
        for (label, ms, tref, ratio, target) in rows:
            print('%-40s %10.4f %10.4f %8.2fx  %s' % (label, ms, tref, ratio, target))
        print('\n%8s %14s %17s %7s %9s' % ('sgemm n', 'libdp GFLOP/s', 'OpenBLAS GFLOP/s',
                                            'ratio', '% peak'))
    pk = peak['avx512'] or peak['avx2']
    for o, b in zip(ours['results'], blas['results']):
        fmt = '| %d | %.1f | %.1f | %.2fx | %.0f%% |' if args.markdown else '%8d %14.1f %17.1f %6.2fx %8.0f%%'
        print(fmt % (o['n'], o['gflops'], b['gflops'], o['gflops'] / b['gflops'],
                     100 * o['gflops'] / pk))
    sc = dp_json(['step', '--model', 'bench/models/mlp_large.dpm', '--batch', '256',
                  '--optimizer', 'sgd', '--devices', '1'])
    sc2 = dp_json(['step', '--model', 'bench/models/mlp_large.dpm', '--batch', '256',
                   '--optimizer', 'sgd', '--devices', '2'])
    print('\nmlp_large: 2 virtual devices give %.2fx the samples/s of 1 (target >= 1.7x)'
          % (sc2['samples_per_s'] / sc['samples_per_s']))


if __name__ == '__main__':
    main()
