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

Usage: /usr/bin/python3 tools/golden/make_golden.py [-o tests/golden]
Needs python3-torch (Debian's 1.13 is fine) and numpy. See README.md here for
the file format.
"""
import argparse
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn

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


def dropout_uniform(seed, step, layer, rows, width):
    """u[i][j] = uniform(seed, 2, (step << 16) | layer, i, j) for a (rows, width) block."""
    a = ((step << 16) | layer) & M64
    prefix = mix(mix(mix(seed & M64) ^ DP_RNG_DROPOUT) ^ a)  # python int
    with np.errstate(over="ignore"):
        i = np.arange(rows, dtype=np.uint64)[:, None]
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
    """Returns (input_width, layers, loss): layers as (kind, arg) tuples."""
    in_w, layers, loss = None, [], None
    for raw in text.splitlines():
        t = raw.split("#", 1)[0].split()
        if not t:
            continue
        if t[0] == "input":
            in_w = int(t[1])
        elif t[0] == "loss":
            loss = t[1]
        elif t[0] == "linear":
            layers.append(("linear", (int(t[1]), len(t) < 3)))
        elif t[0] == "dropout":
            layers.append(("dropout", float(t[1])))
        else:
            assert t[0] in ("relu", "gelu", "tanh", "sigmoid", "layernorm"), t[0]
            layers.append((t[0], None))
    return in_w, layers, loss


class Net(nn.Module):
    """The spec's layers in order; dropout is applied by hand with libdp's masks."""

    def __init__(self, in_w, layers, seed):
        super().__init__()
        self.seed = seed
        self.kinds = []
        mods = []
        w = in_w
        for kind, arg in layers:
            if kind == "linear":
                out, bias = arg
                mods.append(nn.Linear(w, out, bias=bias))
                w = out
            elif kind == "layernorm":
                ln = nn.LayerNorm(w, eps=1e-5, elementwise_affine=True)
                # Non-trivial affine parameters so their gradients are exercised.
                with torch.no_grad():
                    ln.weight.add_(0.1 * torch.randn(w))
                    ln.bias.add_(0.1 * torch.randn(w))
                mods.append(ln)
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
        self.out_w = w

    def forward(self, x, step, training):
        for idx, ((kind, arg), mod) in enumerate(zip(self.kinds, self.layers)):
            if kind == "dropout":
                if training:
                    p = np.float32(arg)  # libdp keeps p as a float
                    u = dropout_uniform(self.seed, step, idx, x.shape[0], x.shape[1])
                    mask = torch.from_numpy((u >= p).astype(np.float32)).to(x.dtype)
                    x = x * mask / (1.0 - float(p))
            else:
                x = mod(x)
        return x


def make_loss(loss):
    return nn.MSELoss() if loss == "mse" else nn.CrossEntropyLoss()


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def run_case(spec, B, dtype, torch_seed, max_norm=None):
    """Everything the golden file holds, computed in `dtype`.

    max_norm: clip_grad_norm_'s max_norm for the clipping records; None
    derives it from this run's first gradient (the float32 run does)."""
    in_w, layers, loss_kind = parse_spec(spec)
    torch.manual_seed(torch_seed)
    net = Net(in_w, layers, DROPOUT_SEED)
    x = torch.randn(B, in_w)
    if loss_kind == "mse":
        target = torch.randn(B, net.out_w)
    else:
        target = torch.randint(0, net.out_w, (B,), dtype=torch.int64)
    params0 = flat(net.state_dict().values()).clone()
    net = net.to(dtype)
    x = x.to(dtype)
    if loss_kind == "mse":
        target = target.to(dtype)
    crit = make_loss(loss_kind)
    r = {"in_w": in_w, "out_w": net.out_w, "loss_kind": loss_kind}
    r["x"], r["target"], r["params0"] = x, target, params0

    def set_params(flat_p):
        off = 0
        with torch.no_grad():
            for p in net.parameters():
                n = p.numel()
                p.copy_(flat_p[off : off + n].reshape(p.shape).to(dtype))
                off += n

    # state_dict order equals parameters() order here (no buffers).
    assert [k for k, _ in net.named_parameters()] == list(net.state_dict().keys())

    # Step 0: training-mode forward, loss, gradients.
    set_params(params0)
    net.zero_grad()
    out = net(x, 0, True)
    loss = crit(out, target)
    loss.backward()
    r["out"], r["loss"] = out.detach(), loss.detach().reshape(1)
    r["grads"] = flat(p.grad for p in net.parameters())
    with torch.no_grad():
        r["eval_out"] = net(x, 0, False)

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
        losses = []
        for t in range(N_STEPS):
            opt.zero_grad()
            l = crit(net(x, t, True), target)  # step t = optimizer steps done so far
            l.backward()
            opt.step()
            losses.append(l.detach())
        r[name + "_params5"] = flat(net.parameters())
        r[name + "_loss"] = torch.stack(losses)

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
        norms = []
        for t in range(N_STEPS):
            opt.zero_grad()
            l = crit(net(x, t, True), target)
            l.backward()
            norms.append(nn.utils.clip_grad_norm_(net.parameters(), max_norm).detach())
            if t == 0 and name == "sgd_clip":
                r["clip_grads1"] = flat(p.grad for p in net.parameters())
            opt.step()
        r[name + "_params"] = flat(net.parameters())
        r[name + "_norms"] = torch.stack(norms)
    r["clip_norms"] = r.pop("sgd_clip_norms")
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
    self_check_rng()
    print("rng self-check ok: rng_u64(1,2,3,4,5) = 0x%016x, uniform(1234,2,(3<<16)|3,7,11) = %.9g"
          % (rng_u64(1, 2, 3, 4, 5), rng_uniform(1234, 2, (3 << 16) | 3, 7, 11)))
    os.makedirs(args.out_dir, exist_ok=True)
    ok = True
    for name, lines, B, N, tseed in CASES:
        spec = "\n".join(lines) + "\n"
        r = run_case(spec, B, torch.float32, tseed)
        r64 = run_case(spec, B, torch.float64, tseed, r["clip_max_norm"].item())
        worst = max((tol_ratio(r[k], r64[k]), k) for k in COMPARED + CLIP_COMPARED)
        if worst[0] > MARGIN:
            ok = False
        max_norm = r["clip_max_norm"].item()
        clip_ratio = min(rr[k].min().item() / max_norm for rr in (r, r64)
                         for k in ("clip_norms", "adamw_clip_norms"))
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
        blob = MAGIC + struct.pack("<II", VERSION, len(ents)) + b"".join(ents)
        path = os.path.join(args.out_dir, name + ".bin")
        with open(path, "wb") as f:
            f.write(blob)
        print("%-14s B=%-3d N=%d params=%-5d loss=%.6f  max_norm=%.6g (norms >= %.2f x)  "
              "f32-vs-f64 worst %.3f of tol (%s)  %s"
              % (name, B, N, r["params0"].numel(), r["loss"].item(), max_norm, clip_ratio,
                 worst[0], worst[1], os.path.relpath(path)))
    if not ok:
        print("error: float32 results are not safely inside the tolerance of the float64 "
              "reference (ratio > %.2f); change the case" % MARGIN, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
