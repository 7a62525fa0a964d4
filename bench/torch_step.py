#!/usr/bin/env python3
"""PyTorch CPU side of bench/compare.py: ms per training step for the models
libdp is compared on. Prints one JSON object. Run with Debian's python3-torch:
/usr/bin/python3 bench/torch_step.py [--threads 1,2]."""
import argparse
import json
import time

import torch
import torch.nn as nn

# name -> (widths, loss, optimizer, batch); the same models as compare.py's libdp side
MODELS = {
    'seed': ([5, 2], 'mse', 'sgd', 30),
    'mlp_small': ([64, 128, 10], 'ce', 'adamw', 256),
    'mlp_large': ([784, 1024, 1024, 10], 'ce', 'sgd', 256),
}


def build(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def time_model(name, threads, min_seconds):
    widths, loss_kind, opt_kind, batch = MODELS[name]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build(widths)
    x = torch.randn(batch, widths[0])
    if loss_kind == 'mse':
        target, loss_fn = torch.randn(batch, widths[-1]), nn.MSELoss()
    else:
        target, loss_fn = torch.randint(0, widths[-1], (batch,)), nn.CrossEntropyLoss()
    if opt_kind == 'sgd':
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=0.001)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), target)
        loss.backward()
        opt.step()

    for _ in range(20):
        step()
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
            'ms_per_step': 1e3 * el / steps, 'steps': steps, 'min_ms': 1e3 * times[0],
            'median_ms': 1e3 * times[len(times) // 2]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--threads', default='1,2')
    ap.add_argument('--seconds', type=float, default=1.0)
    args = ap.parse_args()
    out = {'torch_version': torch.__version__, 'results': []}
    for name in MODELS:
        for t in [int(v) for v in args.threads.split(',')]:
            out['results'].append(time_model(name, t, args.seconds))
    print(json.dumps(out))


if __name__ == '__main__':
    main()
