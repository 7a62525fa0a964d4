#!/usr/bin/env python3
"""The PyTorch peer of `dp bench gpu-step`, for tests/gpu/run.sh: ms per training step
of the same model on GPU 0, FP32 (TF32 off, as libdp's default), plain and captured as
one CUDA graph (PyTorch's whole-step capture recipe). Prints one JSON object.

  python3 bench/torch_gpu_step.py [--batch 1024] [--widths 1024,4096,4096,1024]

The model is libdp's GPU_MODEL in tools/cmd_bench.c: linear layers with tanh-form GELU
between them (libdp's gelu), MSE loss, AdamW (lr 0.001, PyTorch's other defaults)."""
import argparse
import json
import time

import torch
import torch.nn as nn


def build(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.GELU(approximate='tanh'))
    return nn.Sequential(*layers)


def timed(fn, min_seconds):
    """Mean ms of fn() over at least min_seconds, after a warm-up, with the GPU
    synchronised at both ends (as libdp's step, which waits once per step)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    steps, t0 = 0, time.perf_counter()
    while True:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        steps += 10
        el = time.perf_counter() - t0
        if el >= min_seconds:
            return el * 1e3 / steps, steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--batch', type=int, default=1024)
    ap.add_argument('--widths', default='1024,4096,4096,1024')
    ap.add_argument('--seconds', type=float, default=0.5)
    a = ap.parse_args()
    widths = [int(w) for w in a.widths.split(',')]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device('cuda', 0)
    torch.manual_seed(0)
    out = {'bench': 'torch-gpu-step', 'torch': torch.__version__,
           'gpu': torch.cuda.get_device_name(0), 'widths': widths, 'batch': a.batch,
           'optimizer': 'adamw', 'precision': 'fp32'}

    # plain: zero_grad, forward, loss, backward, step; the step waits for the GPU
    # (libdp's step returns the loss, so it synchronises once per step too)
    model = build(widths).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=0.001)
    x = torch.randn(a.batch, widths[0], device=dev)
    t = torch.randn(a.batch, widths[-1], device=dev)
    loss_fn = nn.MSELoss()

    def plain():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), t)
        loss.backward()
        opt.step()
        return loss.item()

    out['plain_ms'], out['plain_steps'] = timed(plain, a.seconds)

    # graph: the whole step captured once (capturable AdamW), then replayed
    model = build(widths).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=0.001, capturable=True)
    sx, st = x.clone(), t.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(sx), st).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        sloss = loss_fn(model(sx), st)
        sloss.backward()
        opt.step()

    def replay():
        graph.replay()
        return sloss.item()

    out['graph_ms'], out['graph_steps'] = timed(replay, a.seconds)
    print(json.dumps(out))


if __name__ == '__main__':
    main()
