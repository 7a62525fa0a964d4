#!/usr/bin/env python3
"""PyTorch CPU side of bench/compare.py: ms per training step for the models
libdp is compared on. Prints one JSON object:
V/bin/python bench/torch_step.py [--threads 1,2] [--models cnn_digits,...].
--serve: a server for interleaved runs (compare.py): prints the build's info as
one JSON line, then answers each line "MODEL SECONDS" on stdin with one JSON
line (the timing), on the thread count of --threads (one number), until EOF.

The MLPs are built from their widths; the CNNs from their libdp spec files
(bench/models/*.dpm) by build_spec, layer by layer as the equivalent
nn.Sequential (NCHW, as libdp's image layers)."""
import argparse
import json
import os
import sys
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
    # transformers (issue 29): token input, residual blocks (build_spec)
    'tiny_gpt': ('bench/models/tiny_gpt.dpm', 'ce', 'adamw', 16),
    'gpt_wide': ('bench/models/gpt_wide.dpm', 'ce', 'adamw', 8),
}


class Embed(nn.Module):
    """libdp's embed V D: token plus learned position embeddings."""
    def __init__(self, vocab, width, context):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(context, width)

    def forward(self, ids):
        return self.tok(ids) + self.pos.weight[:ids.shape[1]]


class Attention(nn.Module):
    """libdp's attention H on a fused (B, T, 3D) q, k, v: causal, as PyTorch users
    write it (scaled_dot_product_attention where this torch has it)."""
    def __init__(self, heads):
        super().__init__()
        self.h = heads

    def forward(self, x):
        B, T, C3 = x.shape
        D = C3 // 3
        q, k, v = (t.view(B, T, self.h, D // self.h).transpose(1, 2) for t in x.split(D, 2))
        if hasattr(nn.functional, 'scaled_dot_product_attention'):
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            a = (q @ k.transpose(-2, -1)) * (D // self.h) ** -0.5
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            y = a.masked_fill(~mask, float('-inf')).softmax(-1) @ v
        return y.transpose(1, 2).reshape(B, T, D)


class Residual(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)


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
    layers, shape, in_shape, loss, stack, tokens = [], None, None, None, [], False
    with open(os.path.join(ROOT, path)) as f:
        for line in f:
            tok = line.split('#', 1)[0].split()
            if not tok:
                continue
            op, args = tok[0], tok[1:]
            opts = {args[i]: int(args[i + 1]) for i in range(len(args) - 1)
                    if args[i] in ('stride', 'padding')}
            if op == 'input' and args[0] == 'tokens':
                in_shape, tokens = (int(args[1]),), True
            elif op == 'input':
                shape = tuple(int(a) for a in args)
                in_shape = shape
            elif op == 'embed':
                layers.append(Embed(int(args[0]), int(args[1]), in_shape[0]))
                shape = (int(args[1]),)
            elif op == 'attention':
                layers.append(Attention(int(args[0])))
                shape = (shape[0] // 3,)
            elif op == 'residual':
                stack.append(layers)
                layers = []
            elif op == 'end':
                body = nn.Sequential(*layers)
                layers = stack.pop()
                layers.append(Residual(body))
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
    model = nn.Sequential(*layers)
    model.tokens = tokens
    return model, in_shape, shape[0], loss


def time_model(name, threads, min_seconds):
    arch, loss_kind, opt_kind, batch = MODELS[name]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if isinstance(arch, str):
        model, in_shape, out_w, spec_loss = build_spec(arch)
        loss_kind = spec_loss or loss_kind
    else:
        model, in_shape, out_w = build(arch), (arch[0],), arch[-1]
    if getattr(model, 'tokens', False):  # ids in, a label per position
        T = in_shape[0]
        x = torch.randint(0, out_w, (batch, T))
        target, ce = torch.randint(0, out_w, (batch * T,)), nn.CrossEntropyLoss()
        loss_fn = lambda z, t: ce(z.reshape(-1, out_w), t)  # noqa: E731
    elif loss_kind == 'mse':
        x, target, loss_fn = torch.randn(batch, *in_shape), torch.randn(batch, out_w), nn.MSELoss()
    else:
        x = torch.randn(batch, *in_shape)
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


def build_info():
    """The PyTorch build: version, BLAS, MKL and oneDNN versions, CPU capability."""
    info = {'torch_version': torch.__version__,
            'mkldnn': torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled,
            'mkl': torch.backends.mkl.is_available()}
    cfg = torch.__config__.show() if hasattr(torch, '__config__') else ''
    for line in cfg.splitlines():
        line = line.strip(' -')
        if 'Math Kernel Library Version' in line:
            info['mkl_version'] = line.split('Version', 1)[1].split('-Product')[0].strip()
        elif 'MKL-DNN v' in line or 'oneDNN v' in line:
            info['onednn_version'] = line.split(' v', 1)[1].split(' ')[0]
        elif line.startswith('CPU capability usage:'):
            info['cpu_capability'] = line.split(':', 1)[1].strip()
        elif 'BLAS_INFO=' in line:
            info['blas'] = line.split('BLAS_INFO=', 1)[1].split(',')[0]
    return info


def serve(threads):
    print(json.dumps(build_info()), flush=True)
    for line in sys.stdin:
        words = line.split()
        if len(words) != 2:
            continue
        print(json.dumps(time_model(words[0], threads, float(words[1]))), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--threads', default='1,2')
    ap.add_argument('--seconds', type=float, default=1.0)
    ap.add_argument('--models', default=','.join(MODELS), help='names, comma-separated')
    ap.add_argument('--serve', action='store_true', help='answer "MODEL SECONDS" lines')
    args = ap.parse_args()
    if args.serve:
        serve(int(args.threads))
        return
    out = dict(build_info(), results=[])
    for name in args.models.split(','):
        for t in [int(v) for v in args.threads.split(',')]:
            out['results'].append(time_model(name, t, args.seconds))
    print(json.dumps(out))


if __name__ == '__main__':
    main()
