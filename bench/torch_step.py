#!/usr/bin/env python3
"""PyTorch CPU side of bench/compare.py: ms per training step for the models
libdp is compared on. Prints one JSON object. Run with Debian's python3-torch:
/usr/bin/python3 bench/torch_step.py [--threads 1,2] [--models cnn_digits,...].

The MLPs are built from their widths; the CNNs from their libdp spec files
(bench/models/*.dpm) by build_spec, layer by layer as the equivalent
nn.Sequential (NCHW, as libdp's image layers)."""
import argparse
import json
import os
import time

import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (widths or a spec file, loss, optimizer, batch); the same models as
# compare.py's libdp side (a spec's own `loss` line overrides the loss given here)
MODELS = {
    'seed': ([5, 2], 'mse', 'sgd', 30),
    'mlp_small': ([64, 128, 10], 'ce', 'adamw', 256),
    'mlp_large': ([784, 1024, 1024, 10], 'ce', 'sgd', 256),
    'cnn_digits': ('bench/models/cnn_digits.dpm', 'ce', 'adamw', 256),
    'cnn_cifar': ('bench/models/cnn_cifar.dpm', 'ce', 'sgd', 256),
}


def build(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def build_spec(path):
    """nn.Sequential of a libdp text spec (docs/API.md, "Text spec"): returns the
    model, the input shape of one sample (C, H, W) or (N,), the output width and
    the loss ('mse', 'ce' or None)."""
    layers, shape, in_shape, loss = [], None, None, None
    with open(os.path.join(ROOT, path)) as f:
        for line in f:
            tok = line.split('#', 1)[0].split()
            if not tok:
                continue
            op, args = tok[0], tok[1:]
            opts = {args[i]: int(args[i + 1]) for i in range(len(args) - 1)
                    if args[i] in ('stride', 'padding')}
            if op == 'input':
                shape = tuple(int(a) for a in args)
                in_shape = shape
            elif op == 'linear':
                layers.append(nn.Linear(shape[0], int(args[0]), bias='nobias' not in args))
                shape = (int(args[0]),)
            elif op in ('relu', 'gelu', 'tanh', 'sigmoid'):
                layers.append({'relu': nn.ReLU(), 'gelu': nn.GELU(approximate='tanh'),
                               'tanh': nn.Tanh(), 'sigmoid': nn.Sigmoid()}[op])
            elif op == 'layernorm':
                layers.append(nn.LayerNorm(shape[0], eps=1e-5))
            elif op == 'dropout':
                layers.append(nn.Dropout(float(args[0])))
            elif op == 'conv2d':
                out, k = int(args[0]), int(args[1])
                st, pad = opts.get('stride', 1), opts.get('padding', 0)
                layers.append(nn.Conv2d(shape[0], out, k, stride=st, padding=pad,
                                        bias='nobias' not in args))
                shape = (out, (shape[1] + 2 * pad - k) // st + 1,
                         (shape[2] + 2 * pad - k) // st + 1)
            elif op in ('maxpool2d', 'avgpool2d'):
                k = int(args[0])
                st = opts.get('stride', k)
                layers.append((nn.MaxPool2d if op == 'maxpool2d' else nn.AvgPool2d)(k, st))
                shape = (shape[0], (shape[1] - k) // st + 1, (shape[2] - k) // st + 1)
            elif op == 'flatten':
                layers.append(nn.Flatten())
                shape = (shape[0] * shape[1] * shape[2],)
            elif op == 'loss':
                loss = 'mse' if args[0] == 'mse' else 'ce'
            else:
                raise ValueError('%s: unknown layer %r' % (path, op))
    return nn.Sequential(*layers), in_shape, shape[0], loss


def time_model(name, threads, min_seconds):
    arch, loss_kind, opt_kind, batch = MODELS[name]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if isinstance(arch, str):
        model, in_shape, out_w, spec_loss = build_spec(arch)
        loss_kind = spec_loss or loss_kind
    else:
        model, in_shape, out_w = build(arch), (arch[0],), arch[-1]
    x = torch.randn(batch, *in_shape)
    if loss_kind == 'mse':
        target, loss_fn = torch.randn(batch, out_w), nn.MSELoss()
    else:
        target, loss_fn = torch.randint(0, out_w, (batch,)), nn.CrossEntropyLoss()
    if opt_kind == 'sgd':
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=0.001)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), target)
        loss.backward()
        opt.step()

    # warm-up: 20 steps, or what fits min_seconds (at least 3: a CNN step on
    # one core can take half a second)
    w0 = time.perf_counter()
    for i in range(20):
        step()
        if i >= 2 and time.perf_counter() - w0 >= min_seconds:
            break
    # each step timed on its own too: on a shared machine the minimum (a step
    # nobody preempted) is the stable figure; the mean is kept as before
    steps, times, t0 = 0, [], time.perf_counter()
    while True:
        for _ in range(10):
            s0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - s0)
        steps += 10
        el = time.perf_counter() - t0
        if el >= min_seconds:
            break
    times.sort()
    return {'model': name, 'threads': threads, 'batch': batch, 'optimizer': opt_kind,
            'input': list(in_shape),
            'ms_per_step': 1e3 * el / steps, 'steps': steps, 'min_ms': 1e3 * times[0],
            'median_ms': 1e3 * times[len(times) // 2]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--threads', default='1,2')
    ap.add_argument('--seconds', type=float, default=1.0)
    ap.add_argument('--models', default=','.join(MODELS), help='names, comma-separated')
    args = ap.parse_args()
    out = {'torch_version': torch.__version__, 'mkldnn': torch.backends.mkldnn.is_available()
           and torch.backends.mkldnn.enabled, 'results': []}
    for name in args.models.split(','):
        for t in [int(v) for v in args.threads.split(',')]:
            out['results'].append(time_model(name, t, args.seconds))
    print(json.dumps(out))


if __name__ == '__main__':
    main()
