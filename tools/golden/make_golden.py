#!/usr/bin/env python3
"""Write PyTorch reference data for libdp's golden tests: tests/golden/<case>.bin.

Each case is one model spec (libdp's .dpm text), one batch and one set of
initial parameters. The script builds the same network in PyTorch (CPU,
float32), runs a forward/backward pass, five steps of SGD with momentum and
five steps of AdamW, the same two trainings with torch.nn.utils.clip_grad_norm_
before every optimizer step (max_norm: a quarter of the first gradient's norm,
so every step clips), and records everything tests/test_golden.c compares.

Dropout cannot use torch's generator: libdp draws its masks from a
counter-based generator (lib/rng.c), so this script re-implements that
generator bit for bit (64-bit arithmetic masked explicitly) and applies the
mask by hand. A known-answer self-check guards the re-implementation.

Before writing anything the script also reruns every case in float64 and
checks that the float32 results agree with it under the C test's tolerance,
with a wide margin; otherwise an independent float32 implementation (libdp's)
could fail the test for rounding reasons alone.

Image layers (input C H W, conv2d, maxpool2d, avgpool2d, flatten) run as
nn.Conv2d / nn.MaxPool2d / nn.AvgPool2d / nn.Flatten on x reshaped to
(B, C, H, W); the network's output is flattened per row, as libdp sees it.
Every max-pooling window is checked to have a unique maximum, clear of the
runner-up by more than twice the C test's tolerance (ties are allowed only
where they cannot matter: between zeros that a ReLU made), so that which
element a window picks cannot depend on rounding.

batchnorm (libdp's per_replica mode) cases name a micro-batch size: the batch
is run micro-batch by micro-batch in train mode, each normalised with its own
statistics, micro-batch 0 through the module (its running-statistics update is
the one kept, as nn.DataParallel keeps device 0's replica), the others without
running statistics; the loss is the whole batch's. These files also hold the
running statistics after every step and eval outputs after training.

bn_sync_* cases are batchnorm in libdp's sync mode (SyncBatchNorm): in
training every batchnorm normalises with the whole batch's statistics, so the
reference is the plain module run on the whole batch in train mode, whatever
the micro-batches; the running statistics are updated once per step from the
whole batch. Their files carry the same records plus "bn_sync" = 1; their
micro_batch is the one the C test runs first (any other gives the same
results up to rounding).

The bytes depend on which kernels PyTorch's CPU build picks, so the script
pins them (unless already set in the environment): OpenBLAS's Sandybridge
kernels on one thread, ATen's AVX2 kernels, and no oneDNN (convolutions take
PyTorch's im2col + BLAS path). An x86-64 CPU with AVX2 then gives the same
bytes whichever kernels it would pick by itself.

Usage: /usr/bin/python3 tools/golden/make_golden.py [-o tests/golden]
Needs python3-torch (Debian's 1.13 is fine) and numpy. See README.md here for
the file format.
"""
import argparse
import os
import struct
import sys

# Read when the libraries load, so set before importing numpy and torch.
os.environ.setdefault("OPENBLAS_CORETYPE", "Sandybridge")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

MAGIC = b"DPGOLD\0\0"
VERSION = 1
DT_F32, DT_I32, DT_TEXT = 0, 1, 2

# Hyper-parameters; stored in each file as "hparams" in exactly this order.
HPARAMS = [
    ("sgd_lr", 0.05),
    ("sgd_momentum", 0.9),
    ("sgd_weight_decay", 1e-3),
    ("adamw_lr", 0.01),
    ("adamw_beta1", 0.9),
    ("adamw_beta2", 0.999),
    ("adamw_eps", 1e-8),
    ("adamw_weight_decay", 0.01),
]
HP = dict(HPARAMS)
N_STEPS = 5
DROPOUT_SEED = 1234

# The C test's tolerance (tests/test_golden.c): element-wise
#   |got - want| <= RTOL * (|want| + FLOOR * max|want over the tensor|)
RTOL = 1e-5
FLOOR = 1e-1
# float32-vs-float64 errors must stay below this fraction of the tolerance.
MARGIN = 0.1

# ---- counter-based RNG, bit-exact with lib/rng.c ------------------------------
M64 = (1 << 64) - 1
DP_RNG_DROPOUT = 2


def mix(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def rng_u64(seed, stream, a, b, c):
    return mix(mix(mix(mix(mix(seed & M64) ^ stream) ^ a) ^ b) ^ c)


def rng_uniform(seed, stream, a, b, c):
    """A float32 in [0, 1): the top 24 bits times 2^-24 (exact in float32)."""
    return np.float32((rng_u64(seed, stream, a, b, c) >> 40) * 2.0**-24)


def _mix_np(z):
    # numpy uint64 array arithmetic wraps modulo 2^64, as C's uint64_t does.
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def dropout_uniform(seed, step, layer, rows, width, row0=0):
    """u[i][j] = uniform(seed, 2, (step << 16) | layer, i, j) for a (rows, width) block,
    i = row0 .. row0 + rows - 1 (the row in the whole batch)."""
    a = ((step << 16) | layer) & M64
    prefix = mix(mix(mix(seed & M64) ^ DP_RNG_DROPOUT) ^ a)  # python int
    with np.errstate(over="ignore"):
        i = np.arange(row0, row0 + rows, dtype=np.uint64)[:, None]
        j = np.arange(width, dtype=np.uint64)[None, :]
        z = _mix_np(_mix_np(np.uint64(prefix) ^ i) ^ j)
    return ((z >> np.uint64(40)).astype(np.float64) * 2.0**-24).astype(np.float32)


def self_check_rng():
    # Known answers from an independent C implementation (a few lines of
    # uint64_t arithmetic compiled with gcc), see README.md.
    got = rng_u64(1, 2, 3, 4, 5)
    assert got == 0x90BB69B7166551DE, hex(got)
    u = rng_uniform(1234, 2, (3 << 16) | 3, 7, 11)
    assert (rng_u64(1234, 2, (3 << 16) | 3, 7, 11) >> 40) == 16768607
    assert u == np.float32(16768607 * 2.0**-24), u
    # The vectorised path agrees with the scalar one.
    blk = dropout_uniform(1234, 3, 3, 9, 13)
    for i in range(9):
        for j in range(13):
            assert blk[i, j] == rng_uniform(1234, 2, (3 << 16) | 3, i, j)
    assert blk[7, 11] == u


# ---- the network ------------------------------------------------------------
def parse_spec(text):
    """Returns (input_shape, layers, loss): input_shape (W,) or (C, H, W);
    layers as (kind, arg) tuples."""
    in_shape, layers, loss = None, [], None
    for raw in text.splitlines():
        t = raw.split("#", 1)[0].split()
        if not t:
            continue
        if t[0] == "input":
            assert len(t) in (2, 4), raw
            in_shape = tuple(int(v) for v in t[1:])
        elif t[0] == "loss":
            loss = t[1]
        elif t[0] == "linear":
            layers.append(("linear", (int(t[1]), len(t) < 3)))
        elif t[0] == "dropout":
            layers.append(("dropout", float(t[1])))
        elif t[0] in ("conv2d", "maxpool2d", "avgpool2d"):
            conv = t[0] == "conv2d"
            need = 2 if conv else 1
            v = [int(a) for a in t[1 : 1 + need]]
            opt = {"stride": None, "padding": 0, "nobias": False}
            rest = t[1 + need :]
            while rest:
                if rest[0] == "nobias":
                    assert conv
                    opt["nobias"] = True
                    rest = rest[1:]
                else:
                    assert rest[0] == "stride" or (conv and rest[0] == "padding"), raw
                    opt[rest[0]] = int(rest[1])
                    rest = rest[2:]
            if conv:  # (out, k, stride, padding, bias); stride defaults to 1
                layers.append(("conv2d", (v[0], v[1], opt["stride"] or 1, opt["padding"],
                                          not opt["nobias"])))
            else:  # (k, stride); stride defaults to k
                layers.append((t[0], (v[0], opt["stride"] or v[0])))
        else:
            assert t[0] in ("relu", "gelu", "tanh", "sigmoid", "layernorm", "flatten",
                            "batchnorm"), t[0]
            assert len(t) == 1, raw
            layers.append((t[0], None))
    return in_shape, layers, loss


def window_out(n, k, stride, pad):
    """Output size of a window sliding over n (floor mode), as PyTorch computes it."""
    span = n + 2 * pad - k
    assert span >= 0, "window %d does not fit %d (padding %d)" % (k, n, pad)
    return span // stride + 1


class Net(nn.Module):
    """The spec's layers in order; dropout is applied by hand with libdp's masks.

    batchnorm is nn.BatchNorm1d(C) on a flat activation (C = its width) and
    nn.BatchNorm2d(C) on an image (C = channels), eps 1e-5, momentum 0.1,
    affine. forward() takes the mode explicitly: eval (running statistics),
    train updating the running statistics (the module itself, micro-batch 0),
    or train leaving them alone (F.batch_norm without running statistics: the
    other micro-batches, whose replicas' buffers nn.DataParallel discards).

    The input rows are (C*H*W) floats for an image input, reshaped here to
    (B, C, H, W) (NCHW, libdp's layout); the output is flattened per row.
    With `record` set to a list, every max-pooling layer appends
    (layer index, kind of the layer before it, kernel, stride, its input)."""

    def __init__(self, in_shape, layers, seed):
        super().__init__()
        self.seed = seed
        self.in_shape = in_shape
        self.record = None
        self.kinds = []
        self.bn_spatial = {}
        mods = []
        shape = in_shape
        for kind, arg in layers:
            if kind in ("linear", "layernorm"):
                assert len(shape) == 1, "%s needs a flat input (flatten first)" % kind
            if kind in ("conv2d", "maxpool2d", "avgpool2d"):
                assert len(shape) == 3, "%s needs an image input" % kind
            if kind == "linear":
                out, bias = arg
                mods.append(nn.Linear(shape[0], out, bias=bias))
                shape = (out,)
            elif kind == "layernorm":
                w = shape[0]
                ln = nn.LayerNorm(w, eps=1e-5, elementwise_affine=True)
                # Non-trivial affine parameters so their gradients are exercised.
                with torch.no_grad():
                    ln.weight.add_(0.1 * torch.randn(w))
                    ln.bias.add_(0.1 * torch.randn(w))
                mods.append(ln)
            elif kind == "batchnorm":
                c = shape[0]  # features (flat) or channels (image)
                bn = (nn.BatchNorm1d if len(shape) == 1 else nn.BatchNorm2d)(
                    c, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True)
                with torch.no_grad():  # as LayerNorm's: so they matter
                    bn.weight.add_(0.1 * torch.randn(c))
                    bn.bias.add_(0.1 * torch.randn(c))
                mods.append(bn)
                self.bn_spatial[len(mods) - 1] = int(np.prod(shape[1:]))  # H*W (1 if flat)
            elif kind == "conv2d":
                out, k, stride, pad, bias = arg
                mods.append(nn.Conv2d(shape[0], out, k, stride=stride, padding=pad, bias=bias))
                shape = (out, window_out(shape[1], k, stride, pad),
                         window_out(shape[2], k, stride, pad))
            elif kind in ("maxpool2d", "avgpool2d"):
                k, stride = arg
                # No padding, floor mode; AvgPool2d divides by k*k.
                mods.append(nn.MaxPool2d(k, stride) if kind == "maxpool2d"
                            else nn.AvgPool2d(k, stride))
                shape = (shape[0], window_out(shape[1], k, stride, 0),
                         window_out(shape[2], k, stride, 0))
            elif kind == "flatten":
                mods.append(nn.Flatten())
                shape = (int(np.prod(shape)),)
            elif kind == "relu":
                mods.append(nn.ReLU())
            elif kind == "gelu":
                mods.append(nn.GELU(approximate="tanh"))
            elif kind == "tanh":
                mods.append(nn.Tanh())
            elif kind == "sigmoid":
                mods.append(nn.Sigmoid())
            elif kind == "dropout":
                mods.append(nn.Identity())  # placeholder keeps indices aligned
            self.kinds.append((kind, arg))
        self.layers = nn.ModuleList(mods)
        self.out_w = int(np.prod(shape))

    def reset_buffers(self):
        """The batchnorm buffers as a new module has them (PyTorch's and libdp's start)."""
        for mod in self.layers:
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                mod.reset_running_stats()

    def forward(self, x, step, training, row0=0, update_stats=True):
        """x: rows row0.. of the batch (a micro-batch; row0 keys dropout).
        training with update_stats: batchnorm updates its running statistics."""
        B = x.shape[0]
        x = x.reshape((B,) + tuple(self.in_shape))
        for idx, ((kind, arg), mod) in enumerate(zip(self.kinds, self.layers)):
            if kind == "batchnorm":
                if not training:
                    mod.eval()
                    x = mod(x)
                elif update_stats:
                    mod.train()
                    x = mod(x)
                else:
                    x = nn.functional.batch_norm(x, None, None, mod.weight, mod.bias,
                                                 True, 0.0, mod.eps)
            elif kind == "dropout":
                if training:
                    p = np.float32(arg)  # libdp keeps p as a float
                    # j: the element in the row as libdp stores it (NCHW for an image)
                    u = dropout_uniform(self.seed, step, idx, B, x[0].numel(), row0)
                    mask = torch.from_numpy((u >= p).astype(np.float32)).to(x.dtype)
                    x = x * mask.reshape(x.shape) / (1.0 - float(p))
            else:
                if kind == "maxpool2d" and self.record is not None:
                    prev = self.kinds[idx - 1][0] if idx else "input"
                    self.record.append((idx, prev, arg[0], arg[1], x.detach().clone()))
                x = mod(x)
        return x.reshape(B, -1)


def check_pool_windows(record):
    """Worst max-pooling window: (ratio, layer, zero_ties). ratio is the smallest
    (max - runner-up) over the C test's tolerance for the max, 2 * RTOL * (|max|
    + FLOOR * max|input|) (twice it: either value may be off by a tolerance);
    above 1, values within the tolerance of PyTorch's cannot pick a different
    element. Ties of zeros behind a ReLU are skipped (counted in zero_ties): the
    ReLU's backward zeroes the gradient whichever zero a window picks."""
    worst, worst_layer, zero_ties = float("inf"), None, 0
    for idx, prev, k, s, x in record:
        win = x.double().unfold(2, k, s).unfold(3, k, s)  # (B, C, OH, OW, k, k)
        win = win.reshape(-1, k * k)
        top2 = win.topk(2, dim=1).values if k * k > 1 else None
        if top2 is None:
            continue
        gap = top2[:, 0] - top2[:, 1]
        harmless = (gap == 0) & (top2[:, 0] == 0) & (prev == "relu")
        zero_ties += int(harmless.sum())
        allowed = 2 * RTOL * (top2[:, 0].abs() + FLOOR * x.double().abs().max())
        ratio = (gap / allowed)[~harmless]
        if ratio.numel() and ratio.min().item() < worst:
            worst, worst_layer = ratio.min().item(), idx
    return worst, worst_layer, zero_ties


def make_loss(loss):
    return nn.MSELoss() if loss == "mse" else nn.CrossEntropyLoss()


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def bn_stats(net):
    """(running_mean, running_var) of every batchnorm layer concatenated in layer
    order, and the num_batches_tracked counts."""
    bns = [m for m in net.layers if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    return (torch.cat([m.running_mean.detach().clone() for m in bns]),
            torch.cat([m.running_var.detach().clone() for m in bns]),
            torch.stack([m.num_batches_tracked.detach().clone() for m in bns]))


def run_case(spec, B, dtype, torch_seed, max_norm=None, micro_batch=None, sync=False):
    """Everything the golden file holds, computed in `dtype`.

    max_norm: clip_grad_norm_'s max_norm for the clipping records; None
    derives it from this run's first gradient (the float32 run does).
    micro_batch: rows per micro-batch (libdp's config.micro_batch; batchnorm's
    per_replica statistics depend on it); None: the whole batch at once.
    sync: batchnorm in sync mode (whole-batch statistics: the module run on the
    whole batch, micro_batch only recorded for the C test)."""
    in_shape, layers, loss_kind = parse_spec(spec)
    in_w = int(np.prod(in_shape))  # a row: C*H*W floats for an image (NCHW)
    torch.manual_seed(torch_seed)
    net = Net(in_shape, layers, DROPOUT_SEED)
    x = torch.randn(B, in_w)
    if loss_kind == "mse":
        target = torch.randn(B, net.out_w)
    else:
        target = torch.randint(0, net.out_w, (B,), dtype=torch.int64)
    params0 = flat(net.parameters()).clone()  # state_dict order, buffers left out
    net = net.to(dtype)
    x = x.to(dtype)
    if loss_kind == "mse":
        target = target.to(dtype)
    crit = make_loss(loss_kind)
    net.record = [] if dtype == torch.float32 else None  # max-pooling inputs
    r = {"in_w": in_w, "out_w": net.out_w, "loss_kind": loss_kind}
    r["x"], r["target"], r["params0"] = x, target, params0

    def set_params(flat_p):
        """Parameters from flat_p, batchnorm buffers as new (a fresh libdp context)."""
        off = 0
        with torch.no_grad():
            for p in net.parameters():
                n = p.numel()
                p.copy_(flat_p[off : off + n].reshape(p.shape).to(dtype))
                off += n
        net.reset_buffers()

    # parameters() order is state_dict order with the buffers left out.
    buffers = set(k for k, _ in net.named_buffers())
    assert ([k for k, _ in net.named_parameters()]
            == [k for k in net.state_dict().keys() if k not in buffers])
    has_bn = bool(buffers)
    assert has_bn == (micro_batch is not None), "batchnorm cases (only) set micro_batch"
    assert has_bn or not sync, "sync is a batchnorm mode"
    mb = micro_batch or B
    if has_bn:
        r["micro_batch"] = mb
        # (layer index after `input`, C) per batchnorm, in layer order
        r["bn_layers"] = [(i, m.num_features) for i, m in enumerate(net.layers)
                          if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        # sync: the statistics are the whole batch's, whatever the micro-batches
        rows = [B] if sync else [min(mb, B - r0) for r0 in range(0, B, mb)]
        for i, c in r["bn_layers"]:
            # PyTorch refuses (and libdp refuses) one value per channel.
            per = net.bn_spatial[i]
            assert min(rows) * per > 1, "a micro-batch has one value per channel"

    def train_forward(t):
        """Step t's training-mode forward over the micro-batches (per_replica):
        each normalised with its own statistics; only micro-batch 0's update the
        running statistics. The outputs are concatenated, so the mean loss over
        them is the sum of the micro-batches' loss sums over B. sync: the whole
        batch at once (what SyncBatchNorm computes over all the replicas)."""
        if sync:
            return net(x, t, True)
        outs = [net(x[r0 : r0 + mb], t, True, row0=r0, update_stats=(r0 == 0))
                for r0 in range(0, B, mb)]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    # Step 0: training-mode forward, loss, gradients.
    set_params(params0)
    net.zero_grad()
    out = train_forward(0)
    loss = crit(out, target)
    loss.backward()
    r["out"], r["loss"] = out.detach(), loss.detach().reshape(1)
    r["grads"] = flat(p.grad for p in net.parameters())
    net.reset_buffers()  # eval_out: params0 with a new context's buffers
    with torch.no_grad():
        r["eval_out"] = net(x, 0, False)

    def record_stats(name, stats):
        if has_bn:
            r[name + "_running_mean"] = torch.stack([s[0] for s in stats])
            r[name + "_running_var"] = torch.stack([s[1] for s in stats])
            r[name + "_num_batches"] = torch.stack([s[2] for s in stats])

    def make_sgd(ps):
        return torch.optim.SGD(ps, lr=HP["sgd_lr"], momentum=HP["sgd_momentum"],
                               weight_decay=HP["sgd_weight_decay"])

    def make_adamw(ps):
        return torch.optim.AdamW(ps, lr=HP["adamw_lr"],
                                 betas=(HP["adamw_beta1"], HP["adamw_beta2"]),
                                 eps=HP["adamw_eps"], weight_decay=HP["adamw_weight_decay"])

    for name, make_opt in (("sgdm", make_sgd), ("adamw", make_adamw)):
        set_params(params0)
        opt = make_opt(list(net.parameters()))
        losses, stats = [], []
        for t in range(N_STEPS):
            opt.zero_grad()
            l = crit(train_forward(t), target)  # step t = optimizer steps done so far
            l.backward()
            opt.step()
            losses.append(l.detach())
            if has_bn:
                stats.append(bn_stats(net))
        r[name + "_params5"] = flat(net.parameters())
        r[name + "_loss"] = torch.stack(losses)
        record_stats(name, stats)
        if has_bn:  # eval mode after training: the running statistics
            with torch.no_grad():
                r[name + "_eval_out5"] = net(x, N_STEPS, False)

    # Gradient clipping by global norm (libdp's config.clip_grad_norm):
    # clip_grad_norm_ between backward() and every optimizer.step(). max_norm
    # is a quarter of the first step's unclipped gradient norm, rounded to
    # float32 (libdp's config field is a float); the float64 rerun is given
    # the float32 run's value so both clip against the same number.
    if max_norm is None:
        max_norm = float(np.float32(0.25 * r["grads"].double().norm().item()))
    r["clip_max_norm"] = torch.tensor([max_norm], dtype=torch.float32)
    for name, make_opt in (
        ("sgd_clip", make_sgd),
        ("adamw_clip", make_adamw),
    ):
        set_params(params0)
        opt = make_opt(list(net.parameters()))
        norms, stats = [], []
        for t in range(N_STEPS):
            opt.zero_grad()
            l = crit(train_forward(t), target)
            l.backward()
            norms.append(nn.utils.clip_grad_norm_(net.parameters(), max_norm).detach())
            if t == 0 and name == "sgd_clip":
                r["clip_grads1"] = flat(p.grad for p in net.parameters())
            opt.step()
            if has_bn:
                stats.append(bn_stats(net))
        r[name + "_params"] = flat(net.parameters())
        r[name + "_norms"] = torch.stack(norms)
        record_stats(name, stats)
    r["clip_norms"] = r.pop("sgd_clip_norms")
    if net.record is not None:
        r["pool"] = check_pool_windows(net.record)  # over every forward above
    return r


CASES = [
    # name, spec lines, B, N, torch seed
    ("seed", ["input 5", "linear 2", "loss mse"], 30, 2, 1),
    ("b31n2", ["input 5", "linear 2", "loss mse"], 31, 2, 2),
    ("b3n4", ["input 5", "linear 2", "loss mse"], 3, 4, 3),
    ("mlp_all", ["input 12", "linear 16", "layernorm", "gelu", "dropout 0.2", "linear 16",
                 "tanh", "linear 16", "sigmoid", "linear 16", "relu", "linear 5 nobias",
                 "loss softmax_cross_entropy"], 32, 4, 4),
    ("mlp_mse_b37n3", ["input 7", "linear 9", "relu", "linear 3", "loss mse"], 37, 3, 5),
    # Image layers. Shapes (C x H x W) in the comments; B and N leave a short
    # last chunk (13 on 4: 4+4+4+1; 7 on 3: 3+3+1; 5 on 2: 3+2; 9 on 2: 5+4;
    # 11 on 4: 3+3+3+2).
    ("cnn_all", ["input 3 11 9",                        # 3x11x9, odd and not square
                 "conv2d 4 3 stride 2 padding 1",       # 4x6x5
                 "relu",
                 "maxpool2d 2 stride 1",                # 4x5x4, overlapping windows
                 "conv2d 5 2 padding 1 nobias",         # 5x6x5, even kernel, no bias
                 "tanh",
                 "avgpool2d 2",                         # 5x3x2, floor drops the last column
                 "flatten",                             # 30
                 "linear 6",
                 "loss softmax_cross_entropy"], 13, 4, 12),
    ("cnn_mse", ["input 2 17 14",
                 "conv2d 3 5 stride 3 padding 2",       # 3x6x5
                 "sigmoid",
                 "maxpool2d 2 stride 3",                # 3x2x2, stride > kernel (gaps)
                 "flatten",                             # 12
                 "linear 4",
                 "loss mse"], 7, 3, 7),
    ("cnn_tail", ["input 2 8 7",
                  "conv2d 3 3 padding 1",               # 3x8x7, 'same' padding
                  "gelu",
                  "avgpool2d 2 stride 3",               # 3x3x2, stride > kernel
                  "conv2d 4 3 stride 2 padding 2",      # 4x3x2, windows mostly padding
                  "conv2d 2 1",                         # 2x3x2, 1x1 kernel
                  "flatten",                            # 12, the last layer
                  "loss mse"], 5, 2, 8),
    ("cnn_flatten_first", ["input 1 4 5", "flatten", "linear 3", "relu", "linear 2",
                           "loss mse"], 9, 2, 9),
    # Dropout on an image: the mask's element j is the NCHW index in the row.
    ("cnn_dropout", ["input 2 6 5",
                     "conv2d 3 3 padding 1",            # 3x6x5
                     "dropout 0.3",
                     "relu",
                     "maxpool2d 2",                     # 3x3x2, floor drops the last column
                     "flatten",                         # 18
                     "linear 3",
                     "loss softmax_cross_entropy"], 11, 4, 21),
    # Batch normalisation, per_replica: the sixth field is the micro-batch
    # size (config.micro_batch), which the statistics depend on; with it fixed
    # libdp's results are the same for every device count and mode. The layer
    # before each batchnorm has no bias: batchnorm cancels it, so its gradient
    # is zero up to rounding, which AdamW's g / sqrt(v) would blow up into
    # +-lr steps of a rounding-dependent sign (seen: 5000x the tolerance in
    # adamw_params5 against the float64 rerun, through the running mean and
    # eval outputs too).
    ("bn_mlp", ["input 10",
                "linear 12 nobias",
                "batchnorm",                            # BatchNorm1d(12), 4 rows each
                "relu",
                "linear 4",
                "loss softmax_cross_entropy"], 16, 2, 47, 4),
    ("bn_cnn", ["input 2 6 6",
                "conv2d 3 3 padding 1 nobias",          # 3x6x6
                "batchnorm",                            # BatchNorm2d(3), 3*6*6 values each
                "relu",
                "maxpool2d 2",                          # 3x3x3
                "flatten",                              # 27
                "linear 3",
                "loss mse"], 12, 4, 55, 3),
    # Two batchnorms (2d then 1d: layers 1 and 5) and a short last micro-batch
    # (14 rows in micro-batches of 5: 5+5+4).
    ("bn_two", ["input 2 4 4",
                "conv2d 2 3 nobias",                    # 2x2x2
                "batchnorm",                            # BatchNorm2d(2), 5*2*2 values each
                "tanh",
                "flatten",                              # 8
                "linear 5 nobias",
                "batchnorm",                            # BatchNorm1d(5), 5 rows (4 in the last)
                "tanh",
                "linear 2",
                "loss mse"], 14, 3, 107, 5),
    # Batch normalisation, sync (SyncBatchNorm; the seventh field): every
    # batchnorm normalises with the whole batch's statistics, so PyTorch's
    # reference is the module on the whole batch and the micro-batch size
    # (the sixth field, recorded as micro_batch) does not matter beyond
    # rounding: the C test also runs each case with other micro-batch sizes.
    # Each cut is four micro-batches, the last short (so 1, 2 and 4 devices
    # give the same bits; on the file's N = 3 they are dealt 2+2+0, on N = 4
    # one each). Biasless layers before the batchnorms, as above.
    ("bn_sync_mlp", ["input 9",
                     "linear 11 nobias",
                     "batchnorm",                       # BatchNorm1d(11), over 15 rows
                     "relu",
                     "linear 3",
                     "loss softmax_cross_entropy"], 15, 3, 211, 4, "sync"),  # 4+4+4+3
    ("bn_sync_cnn", ["input 3 7 5",
                     "conv2d 4 3 padding 1 nobias",     # 4x7x5
                     "batchnorm",                       # BatchNorm2d(4), over 11*7*5 values
                     "relu",
                     "maxpool2d 2",                     # 4x3x2, floor drops a row and a column
                     "flatten",                         # 24
                     "linear 3",
                     "loss mse"], 11, 4, 324, 3, "sync"),  # 3+3+3+2
    # Two batchnorms (2d then 1d: layers 1 and 5).
    ("bn_sync_two", ["input 2 5 4",
                     "conv2d 3 3 nobias",               # 3x3x2
                     "batchnorm",                       # BatchNorm2d(3), over 14*3*2 values
                     "tanh",
                     "flatten",                         # 18
                     "linear 5 nobias",
                     "batchnorm",                       # BatchNorm1d(5), over 14 rows
                     "tanh",
                     "linear 2",
                     "loss mse"], 14, 3, 328, 4, "sync"),  # 4+4+4+2
]
COMPARED = ["out", "loss", "grads", "eval_out", "sgdm_params5", "sgdm_loss",
            "adamw_params5", "adamw_loss"]
# Gradient clipping records, written after "hparams" so that the records above
# keep their bytes (only the header's entry count changed when these came).
CLIP_COMPARED = ["clip_norms", "clip_grads1", "sgd_clip_params", "adamw_clip_params",
                 "adamw_clip_norms"]
# Every step's norm must exceed max_norm by this factor (float32 and float64
# runs), so that whether a step clips cannot depend on rounding.
CLIP_MARGIN = 1.01
# Batchnorm cases only, after the clipping records: running statistics after
# every step of each of the four trainings, and eval-mode outputs after the
# two unclipped ones.
BN_TRAININGS = ["sgdm", "adamw", "sgd_clip", "adamw_clip"]
BN_COMPARED = ([t + s for t in BN_TRAININGS for s in ("_running_mean", "_running_var")]
               + ["sgdm_eval_out5", "adamw_eval_out5"])


def tol_ratio(got, want):
    """Worst |got - want| / allowed over the tensor (<= 1 passes the C test)."""
    got = got.double().reshape(-1)
    want = want.double().reshape(-1)
    s = FLOOR * want.abs().max().item()
    allowed = RTOL * (want.abs() + s)
    return ((got - want).abs() / allowed).max().item()


def entry(name, dtype, arr_or_bytes, dims=None):
    nb = name.encode()
    if dtype == DT_TEXT:
        payload = arr_or_bytes
        dims = [len(payload)]
    else:
        npdt = "<f4" if dtype == DT_F32 else "<i4"
        a = np.ascontiguousarray(np.asarray(arr_or_bytes), dtype=npdt)
        dims = list(a.shape) if dims is None else dims
        assert int(np.prod(dims)) == a.size
        payload = a.tobytes()
    head = struct.pack("<I", len(nb)) + nb + struct.pack("<II", dtype, len(dims))
    return head + struct.pack("<%dI" % len(dims), *dims) + payload


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("-o", "--out-dir",
                    default=os.path.normpath(os.path.join(here, "..", "..", "tests", "golden")))
    args = ap.parse_args()
    torch.set_num_threads(1)  # fixed reduction order run to run
    # Convolutions through PyTorch's own im2col + BLAS (pinned above) rather
    # than oneDNN, whose kernels depend on the CPU; the other layers never
    # use oneDNN here.
    torch.backends.mkldnn.enabled = False
    self_check_rng()
    print("rng self-check ok: rng_u64(1,2,3,4,5) = 0x%016x, uniform(1234,2,(3<<16)|3,7,11) = %.9g"
          % (rng_u64(1, 2, 3, 4, 5), rng_uniform(1234, 2, (3 << 16) | 3, 7, 11)))
    os.makedirs(args.out_dir, exist_ok=True)
    ok = True
    for name, lines, B, N, tseed, *rest in CASES:
        spec = "\n".join(lines) + "\n"
        mb = rest[0] if rest else None
        sync = rest[1:] == ["sync"]
        assert rest[1:] in ([], ["sync"]), name
        r = run_case(spec, B, torch.float32, tseed, micro_batch=mb, sync=sync)
        r64 = run_case(spec, B, torch.float64, tseed, r["clip_max_norm"].item(), mb, sync)
        bn_keys = BN_COMPARED if mb is not None else []
        worst = max((tol_ratio(r[k], r64[k]), k) for k in COMPARED + CLIP_COMPARED + bn_keys)
        if worst[0] > MARGIN:
            ok = False
        for t in BN_TRAININGS if mb is not None else []:
            if not torch.equal(r[t + "_num_batches"], r64[t + "_num_batches"]):
                print("error: %s: %s_num_batches differ between float32 and float64"
                      % (name, t), file=sys.stderr)
                ok = False
        max_norm = r["clip_max_norm"].item()
        clip_ratio = min(rr[k].min().item() / max_norm for rr in (r, r64)
                         for k in ("clip_norms", "adamw_clip_norms"))
        pool_gap, pool_layer, zero_ties = r["pool"]
        pool_note = ""
        if pool_layer is not None:
            pool_note = "  maxpool gap >= %.1f x tol (%d zero ties after relu)" % (
                pool_gap, zero_ties)
            if pool_gap <= 1.0:
                print("error: %s: a max-pooling window of layer %d has its two largest "
                      "values only %.3g x the tolerance apart; the element it picks could "
                      "depend on rounding" % (name, pool_layer, pool_gap), file=sys.stderr)
                ok = False
        if clip_ratio < CLIP_MARGIN:
            print("error: %s: a step's gradient norm is only %.4f x max_norm; clipping must "
                  "be clear at every step" % (name, clip_ratio), file=sys.stderr)
            ok = False
        ents = [
            entry("spec", DT_TEXT, spec.encode()),
            entry("config", DT_I32, [B, N, 0, DROPOUT_SEED]),
            entry("x", DT_F32, r["x"].numpy()),
        ]
        if r["loss_kind"] == "mse":
            ents.append(entry("target", DT_F32, r["target"].numpy()))
        else:
            ents.append(entry("target", DT_I32, r["target"].numpy().astype(np.int32)))
        ents.append(entry("params0", DT_F32, r["params0"].numpy()))
        for k in COMPARED:
            ents.append(entry(k, DT_F32, r[k].numpy()))
        ents.append(entry("hparams", DT_F32, [v for _, v in HPARAMS]))
        ents.append(entry("clip_max_norm", DT_F32, r["clip_max_norm"].numpy()))
        for k in CLIP_COMPARED:
            ents.append(entry(k, DT_F32, r[k].numpy()))
        if mb is not None:
            ents.append(entry("micro_batch", DT_I32, [r["micro_batch"]]))
            ents.append(entry("bn_layers", DT_I32, r["bn_layers"]))
            for t in BN_TRAININGS:
                ents.append(entry(t + "_running_mean", DT_F32, r[t + "_running_mean"].numpy()))
                ents.append(entry(t + "_running_var", DT_F32, r[t + "_running_var"].numpy()))
                ents.append(entry(t + "_num_batches", DT_I32,
                                  r[t + "_num_batches"].numpy().astype(np.int32)))
            for t in ("sgdm", "adamw"):
                ents.append(entry(t + "_eval_out5", DT_F32, r[t + "_eval_out5"].numpy()))
        if sync:  # last, so that the per_replica files keep their bytes
            ents.append(entry("bn_sync", DT_I32, [1]))
        blob = MAGIC + struct.pack("<II", VERSION, len(ents)) + b"".join(ents)
        path = os.path.join(args.out_dir, name + ".bin")
        with open(path, "wb") as f:
            f.write(blob)
        if mb is not None:
            pool_note += "  micro_batch=%d%s" % (mb, " sync" if sync else "")
        print("%-17s B=%-3d N=%d params=%-5d loss=%.6f  max_norm=%.6g (norms >= %.2f x)  "
              "f32-vs-f64 worst %.3f of tol (%s)%s  %s"
              % (name, B, N, r["params0"].numel(), r["loss"].item(), max_norm, clip_ratio,
                 worst[0], worst[1], pool_note, os.path.relpath(path)))
    if not ok:
        print("error: float32 results are not safely inside the tolerance of the float64 "
              "reference (ratio > %.2f); change the case" % MARGIN, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
