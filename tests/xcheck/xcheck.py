#!/usr/bin/env python3
"""Randomised cross-check of libdp (`dp` tool) against PyTorch (session 24's outside
check; docs/RELIABILITY.md, "Cross-check against PyTorch"). Not part of `ninja test`:
it needs a PyTorch 2 (scaled_dot_product_attention) with safetensors, e.g. the
benchmark venv: /work/V/bin/python tests/xcheck/xcheck.py 20.

Each case: a random spec, random data, PyTorch-initialised weights (dp import),
`dp train --resume init.ckpt --standardize none|feature|channel --test-fraction F`,
`dp export` of the result, `dp predict`; then an independent PyTorch replay
(own module builder, torch.optim, torch.optim.lr_scheduler, clip_grad_norm_)
in float32 and float64, and normwise relative comparisons.

Dropout above 0 and shuffled order are replayed exactly: the replay mirrors libdp's
counter-based numbers bit for bit (dropout_keep: lib/util/rng.c keyed by seed,
(step << 16) | layer, the global row of the accumulation's concatenation, element;
epoch_order and split_rows: tools/data.c's splitmix64 Fisher-Yates of the held-out
split and of each epoch), so PyTorch applies libdp's masks (kept times 1/(1-p), as
nn.Dropout; on attention's probabilities too) and takes libdp's batches. A case draws
session 24's case as it was, then from a second generator: dropout probabilities for
its `dropout 0` lines and new dropout layers (65% of cases), `--seed` (0, small, any
64-bit), shuffled order (65%) with or without `--data-seed`, and a run stopped after
some epochs and `--resume`d (30% of multi-epoch cases; without batchnorm maybe on
another device count).

--bf16 (session 25): every case in --precision bf16 (30% also --reduce-precision bf16),
replayed with docs/PRECISION.md's semantics written out (Net.bf16: Q, _BLinear, _BConv,
_BAct, _G, _tree_params) against libdp; the scale is PyTorch's own bf16 gap, plain
torch.autocast('cpu', torch.bfloat16) against its fp32 run (bf16_bad). Seeds 1000..1179
on PyTorch 2.15.0: 171 agree, 1 BAD (--reduce-precision bf16 on 4 devices and 6
micro-batches: the device blocks' tree, PRECISION.md now says so), 8 refusals;
parameters 8.5e-9 from the replay at the median. BF16_CONV_BIAS=0 keeps conv2d's bias
fp32 (a probe: it fails).

usage: xcheck.py [--classic|--bf16] N [SEED0] | xcheck.py --case DIR (rerun a saved case)
       | xcheck.py --mask-check (libdp's dropout masks and order read off directly)
--classic: session 24's generator alone (dropout 0, --no-shuffle, seed 0).
DP: the dp binary (default build/dp); XCHECK_DIR: where the cases go (build/xcheck).
A line per case: "ok" or "BAD" (a difference from PyTorch fp64 well beyond PyTorch's
own fp32-fp64 gap), then the normwise relative errors (P parameters, L the logged
losses, lr, n the clipped gradient norm, h the held-out loss, pred the logits); or
"ERROR" where a dp command failed (the generator makes cases libdp rightly refuses:
a batchnorm micro-batch of one row, a convolution that does not fit).
"""
import json, math, os, subprocess, sys, random, shutil
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F
from safetensors.torch import save_file, load_file

torch.set_num_threads(1)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DP = os.path.abspath(os.environ.get("DP", os.path.join(REPO, "build", "dp")))
# the cases (spec, data, cmds.sh, case.json, result.json per seed), beside the build
ROOT = os.path.abspath(os.environ.get("XCHECK_DIR", os.path.join(REPO, "build", "xcheck")))
# --classic: session 24's generator alone (no dropout above 0, file order, seed 0)
CLASSIC = '--classic' in sys.argv
if CLASSIC: sys.argv.remove('--classic')
# --bf16: every case in mixed precision (--precision bf16, 30% with --reduce-precision
# bf16 too), replayed with docs/PRECISION.md's semantics (BF16 below)
BF16 = '--bf16' in sys.argv
if BF16: sys.argv.remove('--bf16')


# ---------------------------------------------------------------- libdp's random numbers
# Both mirrored bit for bit, vectorised over numpy uint64 (wrapping arithmetic).
M64 = (1 << 64) - 1
U64 = np.uint64


def _mix(z):
    """lib/util/rng.c mix: splitmix64's finaliser after adding the golden gamma."""
    z = z + U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def rng_u64(seed, stream, a, b, c):
    """dp__rng_u64(seed, stream, a, b, c), broadcasting over numpy arrays."""
    with np.errstate(over='ignore'):
        z = _mix(np.asarray(seed & M64, dtype=U64))
        z = _mix(z ^ U64(stream & M64))
        z = _mix(z ^ np.asarray(a, dtype=U64))
        z = _mix(z ^ np.asarray(b, dtype=U64))
        return _mix(z ^ np.asarray(c, dtype=U64))


DP_RNG_DROPOUT = 2


def dropout_keep(seed, step, layer, rows, n_elem, p):
    """libdp's dropout mask (lib/cpu/backend.c dropout_scale, sequence.c drop_probs):
    element j of global row r is kept iff u(seed, DP_RNG_DROPOUT, (step << 16) | layer,
    r, j) >= p, u the top 24 bits over 2^24 (a float), p as a float. (rows, n_elem) bools."""
    key = ((int(step) << 16) | int(layer)) & M64
    r = np.asarray(rows, dtype=U64)[:, None]
    e = np.arange(n_elem, dtype=U64)[None, :]
    u = (rng_u64(seed, DP_RNG_DROPOUT, key, r, e) >> U64(40)).astype(np.float64) * 2.0 ** -24
    return u >= float(np.float32(p))


def _mix64(z):
    """tools/data.c mix64 (no gamma): Python ints, masked."""
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)


def _stream_state(seed, domain, index):
    return _mix64((_mix64((seed ^ (domain * 0xd1b54a32d192ed03)) & M64) + index) & M64)


def _shuffle_rows(n, state):
    """tools/data.c shuffle_rows: Fisher-Yates drawing below(i + 1) without modulo bias."""
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        k = i + 1; threshold = ((1 << 64) - k) % k
        while True:
            state = (state + 0x9e3779b97f4a7c15) & M64
            x = _mix64(state)
            if x >= threshold: break
        j = x % k
        perm[i], perm[j] = perm[j], perm[i]
    return np.array(perm, dtype=np.int64)


def epoch_order(n, data_seed, epoch):
    """dpt_epoch_order: epoch `epoch` (0-based) takes training rows order[0], order[1], ..."""
    return _shuffle_rows(n, _stream_state(data_seed & M64, 2, epoch & M64))


def split_rows(n, test_fraction, shuffle, data_seed):
    """dpt_dataset_split_as: (training rows, held-out rows) as indices into the file."""
    n_test = max(0, int(math.ceil(float(test_fraction) * n - 1e-9)))
    if shuffle:
        perm = _shuffle_rows(n, _stream_state(data_seed & M64, 1, 0))
    else:
        perm = np.concatenate([np.arange(n - n_test, n), np.arange(n - n_test)]).astype(np.int64)
    return perm[n_test:], perm[:n_test]


# ---------------------------------------------------------------- spec -> torch
class Embed(nn.Module):
    def __init__(s, V, D, T):
        super().__init__(); s.tok = nn.Embedding(V, D); s.pos = nn.Embedding(T, D)
    def forward(s, ids):
        return s.tok(ids.long()) + s.pos.weight[None, : ids.shape[1]]


class Keyed:
    """What libdp keys dropout by, set by the replay before each forward: seed, the
    optimizer step, and the global rows (the accumulation's concatenation) of x's rows."""
    def __init__(s): s.seed = 0; s.step = 0; s.rows = None

    def mask(s, layer, n, E, p, dtype, device):
        """(n, E) multipliers: 1/(1 - p) where kept (PyTorch's nn.Dropout scaling), 0."""
        assert s.rows is not None and len(s.rows) == n, (n, s.rows)
        keep = dropout_keep(s.seed, s.step, layer, s.rows, E, p)
        p32 = np.float32(p)  # libdp holds p as a float; its scale 1.0f / (1.0f - p)
        scale = float(np.float32(1) / (np.float32(1) - p32)) if dtype != torch.float64 else 1.0 / (1.0 - float(p32))
        return torch.tensor(keep, dtype=dtype, device=device) * scale


class KeyedDropout(nn.Module):
    """nn.Dropout(p) with libdp's keyed mask: identity in eval (held-out, predict)."""
    def __init__(s, p, layer, keyed):
        super().__init__(); s.p = p; s.layer = layer; s.keyed = [keyed]
    def forward(s, x):
        if not s.training or s.p == 0.0: return x
        n = x.shape[0]; E = int(np.prod(x.shape[1:]))  # a row's elements, C-order (NCHW, T x D)
        return x * s.keyed[0].mask(s.layer, n, E, s.p, x.dtype, x.device).reshape(x.shape)


class SeqBN(nn.BatchNorm1d):
    """batchnorm on a sequence: BatchNorm1d(D) on the (B, D, T) transpose of (B, T, D)."""
    def forward(s, x): return super().forward(x.transpose(1, 2)).transpose(1, 2)


class Attn(nn.Module):
    def __init__(s, H, p=0.0, layer=0, keyed=None):
        super().__init__(); s.H = H; s.p = p; s.layer = layer; s.keyed = [keyed]
    def forward(s, x):
        B, T, C3 = x.shape; D = C3 // 3; hd = D // s.H
        q, k, v = x.split(D, 2)
        f = lambda t: t.reshape(B, T, s.H, hd).permute(0, 2, 1, 3)
        if s.training and s.p > 0.0:  # dropout on the probabilities: element h T T + i T + j
            q, k, v = f(q), f(k), f(v)
            sc = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            pr = torch.softmax(sc.masked_fill(~causal, float('-inf')), -1)
            m = s.keyed[0].mask(s.layer, B, s.H * T * T, s.p, pr.dtype, pr.device).reshape(B, s.H, T, T)
            o = (pr * m) @ v
        else:
            o = F.scaled_dot_product_attention(f(q), f(k), f(v), is_causal=True)
        return o.permute(0, 2, 1, 3).reshape(B, T, D)


# ---------------------------------------------------------------- bf16: PRECISION.md replayed
# What docs/PRECISION.md says a libdp bf16 run computes, written from the document:
# every layer's output stored rounded to bf16 (round to nearest even) and, in the
# backward, every layer's input gradient rounded (Q: round the value, round its
# gradient); the loss's fp32 gradient rounded on its way into the last layer (Q on the
# last output). Linear: bf16 operands (the fp32 input, weights and bias rounded as read),
# fp32 accumulation, the bias added, rounded; dx = bf16(dy W), dW = bf16(dy^T x) and
# db = bf16(colsum dy) per micro-batch, kept in fp32. conv2d the same (the bias as
# autocast's bf16 convolution: rounded, its gradient rounded; BF16_CONV_BIAS = 0 leaves
# it fp32). Every other layer (activations, dropout, layernorm, residual adds,
# attention, embedding, pooling, batchnorm) in fp32 on the widened input, output and
# input gradient rounded, parameter gradients fp32. The loss in fp32.
BF16_CONV_BIAS = int(os.environ.get('BF16_CONV_BIAS', '1'))


def R(t):
    """fp32 -> bf16 (round to nearest even) -> fp32."""
    return t.to(torch.bfloat16).float()


class _Q(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x): return R(x)
    @staticmethod
    def backward(ctx, g): return R(g)


def Q(x): return _Q.apply(x)


class _G(torch.autograd.Function):
    """The identity, its gradient rounded: a residual block's branch, whose first
    layer writes its input gradient rounded before the block's add sums it with the
    skip's (and rounds again)."""
    @staticmethod
    def forward(ctx, x): return x.clone()
    @staticmethod
    def backward(ctx, g): return R(g)


class BfCtx:
    """The row ranges (micro-batches) of the tensor the next forward sees: linear's and
    conv2d's weight gradients are rounded per micro-batch (PRECISION.md, "Where it
    differs": several micro-batches per step)."""
    cuts = None


def _cuts(n):
    return BfCtx.cuts if BfCtx.cuts is not None else [(0, n)]


class _BLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, W, b):
        xr, Wr = R(x), R(W)
        y = xr.matmul(Wr.t())
        if b is not None: y = y + R(b)
        ctx.save_for_backward(xr, Wr); ctx.hasb = b is not None; ctx.cuts = _cuts(x.shape[0])
        return y
    @staticmethod
    def backward(ctx, g):
        xr, Wr = ctx.saved_tensors
        dx = g.matmul(Wr)
        dW = sum(R(g[lo:hi].reshape(-1, g.shape[-1]).t().matmul(xr[lo:hi].reshape(-1, xr.shape[-1]))) for lo, hi in ctx.cuts)
        db = sum(R(g[lo:hi].reshape(-1, g.shape[-1]).sum(0)) for lo, hi in ctx.cuts) if ctx.hasb else None
        return dx, dW, db


class _BConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, W, b, stride, pad):
        xr, Wr = R(x), R(W)
        y = F.conv2d(xr, Wr, None if b is None else (R(b) if BF16_CONV_BIAS else b), stride=stride, padding=pad)
        ctx.save_for_backward(xr, Wr); ctx.hasb = b is not None; ctx.cuts = _cuts(x.shape[0]); ctx.sp = (stride, pad)
        return y
    @staticmethod
    def backward(ctx, g):
        xr, Wr = ctx.saved_tensors; st, p = ctx.sp
        dx = torch.nn.grad.conv2d_input(xr.shape, Wr, g, stride=st, padding=p)
        dW = sum(R(torch.nn.grad.conv2d_weight(xr[lo:hi], Wr.shape, g[lo:hi], stride=st, padding=p)) for lo, hi in ctx.cuts)
        rb = R if BF16_CONV_BIAS else (lambda t: t)
        db = sum(rb(g[lo:hi].sum((0, 2, 3))) for lo, hi in ctx.cuts) if ctx.hasb else None
        return dx, dW, db, None, None


class _BAct(torch.autograd.Function):
    """tanh and sigmoid: the backward in fp32 from the stored bf16 output (1 - y^2,
    y (1 - y)), rounded once (PRECISION.md, "Where it differs")."""
    @staticmethod
    def forward(ctx, x, sig):
        y = R(torch.sigmoid(x) if sig else torch.tanh(x)); ctx.save_for_backward(y); ctx.sig = sig
        return y
    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return g * (y * (1 - y) if ctx.sig else 1 - y * y), None


def bf16_layer(m, x):
    """One layer of the spec under PRECISION.md's bf16 (output rounded by the caller)."""
    if isinstance(m, nn.Linear): return _BLinear.apply(x, m.weight, m.bias)
    if isinstance(m, nn.Conv2d): return _BConv.apply(x, m.weight, m.bias, m.stride, m.padding)
    if isinstance(m, (nn.Tanh, nn.Sigmoid)): return _BAct.apply(x, isinstance(m, nn.Sigmoid))
    return m(x)  # fp32 on the widened input


class Net(nn.Module):
    """Independent builder of the spec language (not dp's generated source)."""
    def __init__(s, spec):
        super().__init__()
        s.prog = []  # ops: ('mod', name) ('res',) ('end',) ('flat',) ('img', C,H,W)
        s.keyed = Keyed()  # dropout's keys (libdp's layer index: idx below, as the tensors')
        lines = [l.split('#')[0].split() for l in spec.splitlines()]
        lines = [l for l in lines if l]
        inp = lines[0]; s.loss = None
        if inp[1] == 'tokens':
            s.kind = 'seq'; T = int(inp[2]); shape = None
        elif len(inp) == 4:
            s.kind = 'img'; shape = (int(inp[1]), int(inp[2]), int(inp[3]))
        else:
            s.kind = 'flat'; shape = (int(inp[1]),)
        s.in_shape = shape
        idx = 0; stack = []
        for l in lines[1:]:
            op = l[0]; name = str(idx)
            if op == 'loss':
                s.loss = l[1]; continue
            if op == 'embed':
                V, D = int(l[1]), int(l[2]); s.add_module(name, Embed(V, D, T)); shape = (D,)
                s.prog.append(('mod', name))
            elif op == 'linear':
                n = int(l[1]); tied = 'tied' in l; bias = not ('nobias' in l or tied)
                m = nn.Linear(shape[-1], n, bias=bias); s.add_module(name, m)
                if tied: m.weight = s._modules['0'].tok.weight
                shape = (n,); s.prog.append(('mod', name))
            elif op in ('relu', 'gelu', 'tanh', 'sigmoid', 'silu'):
                s.add_module(name, {'relu': nn.ReLU(), 'gelu': nn.GELU(approximate='tanh'),
                                    'tanh': nn.Tanh(), 'sigmoid': nn.Sigmoid(),
                                    'silu': nn.SiLU()}[op])
                s.prog.append(('mod', name))
            elif op == 'leaky_relu':
                s.add_module(name, nn.LeakyReLU(float(l[1]) if len(l) > 1 else 0.01))
                s.prog.append(('mod', name))
            elif op == 'dropout':
                s.add_module(name, KeyedDropout(float(l[1]), idx, s.keyed)); s.prog.append(('mod', name))
            elif op == 'layernorm':
                s.add_module(name, nn.LayerNorm(shape[-1], eps=1e-5)); s.prog.append(('mod', name))
            elif op == 'batchnorm':
                if len(shape) == 3: s.add_module(name, nn.BatchNorm2d(shape[0], eps=1e-5, momentum=0.1))
                elif s.kind == 'seq': s.add_module(name, SeqBN(shape[0], eps=1e-5, momentum=0.1))
                else: s.add_module(name, nn.BatchNorm1d(shape[0], eps=1e-5, momentum=0.1))
                s.prog.append(('mod', name))
            elif op == 'conv2d':
                out, K = int(l[1]), int(l[2]); kw = dict(zip(l[3::2], l[4::2]))
                st = int(kw.get('stride', 1)); p = int(kw.get('padding', 0)); bias = 'nobias' not in l
                s.add_module(name, nn.Conv2d(shape[0], out, K, stride=st, padding=p, bias=bias))
                H = (shape[1] + 2 * p - K) // st + 1; W = (shape[2] + 2 * p - K) // st + 1
                shape = (out, H, W); s.prog.append(('mod', name))
            elif op in ('maxpool2d', 'avgpool2d'):
                K = int(l[1]); st = int(l[3]) if len(l) > 3 else K
                s.add_module(name, (nn.MaxPool2d if op == 'maxpool2d' else nn.AvgPool2d)(K, st))
                shape = (shape[0], (shape[1] - K) // st + 1, (shape[2] - K) // st + 1)
                s.prog.append(('mod', name))
            elif op == 'flatten':
                s.add_module(name, nn.Flatten()); shape = (int(np.prod(shape)),); s.prog.append(('mod', name))
            elif op == 'attention':
                p = float(l[3]) if len(l) > 3 and l[2] == 'dropout' else 0.0
                s.add_module(name, Attn(int(l[1]), p, idx, s.keyed)); shape = (shape[0] // 3,); s.prog.append(('mod', name))
            elif op == 'residual':
                s.prog.append(('res',))
            elif op == 'end':
                s.prog.append(('end',))
            else:
                raise ValueError(op)
            idx += 1
        s.out_shape = shape

    bf16 = False  # PRECISION.md's bf16 (set by the replay)

    def forward(s, x):
        if s.kind == 'img' and x.dim() == 2: x = x.view(-1, *s.in_shape)
        stack = []
        for p in s.prog:
            if s.bf16:
                if p[0] == 'mod': x = Q(bf16_layer(s._modules[p[1]], x))
                elif p[0] == 'res': stack.append(x); x = _G.apply(x)
                else: x = Q(stack.pop() + x)
                continue
            if p[0] == 'mod': x = s._modules[p[1]](x)
            elif p[0] == 'res': stack.append(x)
            else: x = stack.pop() + x
        return x


# ---------------------------------------------------------------- random cases
def rand_mlp(r):
    D = r.randint(3, 12); lines = [f"input {D}"]; w = D
    for _ in range(r.randint(1, 3)):
        w = r.randint(1, 16) if r.random() < 0.1 else r.randint(2, 16)
        lines.append(f"linear {w}" + (" nobias" if r.random() < 0.15 else ""))
        for _ in range(r.randint(0, 3)):
            lines.append(r.choice(['relu', 'gelu', 'tanh', 'sigmoid', 'layernorm', 'batchnorm', 'dropout 0']))
    loss = r.choice(['softmax_cross_entropy', 'mse'])
    C = r.randint(2, 6); lines += [f"linear {C}", f"loss {loss}"]
    return "\n".join(lines) + "\n", dict(kind='flat', loss=loss)


def rand_cnn(r):
    C = r.randint(1, 3); H = r.randint(5, 9); W = r.randint(5, 9)
    lines = [f"input {C} {H} {W}"]; c, h, w = C, H, W
    for _ in range(r.randint(1, 2)):
        K = r.choice([1, 2, 3]); S = r.choice([1, 1, 2]); P = r.choice([0, 1]) if K > 1 else 0
        if (h + 2 * P - K) // S + 1 < 2 or (w + 2 * P - K) // S + 1 < 2: S = 1
        o = r.randint(2, 5)
        opts = (f" stride {S}" if S != 1 or r.random() < 0.3 else "") + (f" padding {P}" if P else "") + (" nobias" if r.random() < 0.2 else "")
        lines.append(f"conv2d {o}{' '.join([''] + [str(K)])}{opts}")
        c, h, w = o, (h + 2 * P - K) // S + 1, (w + 2 * P - K) // S + 1
        for _ in range(r.randint(0, 2)):
            lines.append(r.choice(['relu', 'gelu', 'tanh', 'sigmoid', 'batchnorm', 'dropout 0']))
        if min(h, w) >= 2 and r.random() < 0.7:
            K = 2; S = r.choice([1, 2])
            K = 3 if (min(h, w) >= 3 and r.random() < 0.3) else 2
            lines.append(r.choice(['maxpool2d', 'avgpool2d']) + f" {K}" + (f" stride {S}" if S != K else ""))
            h, w = (h - K) // S + 1, (w - K) // S + 1
    lines.append("flatten")
    if r.random() < 0.4: lines.append("batchnorm")
    if r.random() < 0.4: lines += [f"linear {r.randint(3, 10)}", r.choice(['relu', 'layernorm', 'gelu'])]
    loss = r.choice(['softmax_cross_entropy', 'mse'])
    lines += [f"linear {r.randint(2, 5)}", f"loss {loss}"]
    return "\n".join(lines) + "\n", dict(kind='img', loss=loss)


def rand_gpt(r):
    T = r.randint(1, 8); V = r.randint(5, 24); H = r.choice([1, 2, 4]); D = H * r.randint(2, 4)
    lines = [f"input tokens {T}", f"embed {V} {D}"]
    def block(depth):
        out = []
        if r.random() < 0.6:
            out += ["residual", "layernorm", f"linear {3 * D}", f"attention {H}" + (" dropout 0" if r.random() < 0.3 else ""), f"linear {D}", "end"]
        else:
            out += ["residual", "layernorm", f"linear {r.randint(4, 12)}", r.choice(['gelu', 'relu', 'tanh']), f"linear {D}"]
            if depth == 0 and r.random() < 0.3: out += block(1)
            out += ["end"]
        return out
    for _ in range(r.randint(1, 3)): lines += block(0)
    if r.random() < 0.7: lines.append("layernorm")
    lines += [f"linear {V}" + (" tied" if r.random() < 0.5 else (" nobias" if r.random() < 0.2 else "")), "loss softmax_cross_entropy"]
    return "\n".join(lines) + "\n", dict(kind='seq', loss='softmax_cross_entropy', T=T, V=V)


def add_layers(r, spec, kind):
    """Session 30's layers, from a generator of their own (the draws of session 24's
    cases unchanged): silu and leaky_relu (negative slopes too: the backward reads the
    input's sign) in place of some activations, and on a sequence batchnorm (each
    feature over the T positions) after a block's last linear or in place of the last
    layernorm."""
    out = []
    lines = spec.splitlines()
    for i, l in enumerate(lines):
        w = l.split()[0]
        nxt = lines[i + 1].split()[0] if i + 1 < len(lines) else ''
        if w in ('relu', 'gelu', 'tanh', 'sigmoid') and r.random() < 0.3:
            l = r.choice(['silu', 'leaky_relu', 'leaky_relu 0.2', 'leaky_relu -0.3',
                          'leaky_relu -1.5'])
        if kind == 'seq' and w == 'layernorm' and nxt == 'linear' and i + 2 < len(lines) \
                and lines[i + 2].startswith('loss') and r.random() < 0.4:
            l = 'batchnorm'
        out.append(l)
        if kind == 'seq' and w == 'linear' and nxt == 'end' and r.random() < 0.3:
            out.append('batchnorm')
    return "\n".join(out) + "\n"


def rand_case(seed):
    r = random.Random(seed)
    spec, meta = r.choice([rand_mlp, rand_mlp, rand_cnn, rand_gpt])(r)
    if not CLASSIC: spec = add_layers(random.Random(seed * 65537 + 11), spec, meta['kind'])
    has_bn = 'batchnorm' in spec
    c = dict(seed=seed, spec=spec, **meta)
    c['devices'] = r.choice([1, 2, 4])
    c['mode'] = r.choice(['classic', 'allreduce'])
    c['shard'] = c['mode'] == 'allreduce' and r.random() < 0.3
    c['accumulate'] = r.choice([1, 1, 2, 4])
    c['batch'] = r.randint(2, 12)
    c['micro'] = r.choice([0, 0, 1, 2, 3, 4]) if not has_bn else r.choice([0, 2, 3, 4])
    if has_bn:
        c['bn'] = r.choice(['per_replica', 'sync'])
    if c['micro'] > c['batch']: c['micro'] = c['batch']
    c['steps'] = r.randint(1, 4)  # optimizer steps per epoch
    c['epochs'] = r.randint(1, 3)
    o = r.choice(['sgd', 'momentum', 'adamw'])
    opt = dict(name=o)
    if o == 'sgd':
        opt['lr'] = r.choice([0.01, 0.05, 0.1]); opt['wd'] = r.choice([0, 0, 0.01, 0.1])
        if r.random() < 0.3: opt['momentum'] = r.choice([0.5, 0.9])
    elif o == 'momentum':
        opt['lr'] = r.choice([0.01, 0.05]); opt['momentum'] = r.choice([0.9, 0.5, 0.99]); opt['wd'] = r.choice([0, 0.01])
        if r.random() < 0.4: opt['nesterov'] = True
        elif r.random() < 0.4: opt['dampening'] = r.choice([0.1, 0.5, 1.0])
    else:
        opt['lr'] = r.choice([0.001, 0.01, 0.03]); opt['wd'] = r.choice([None, 0, 0.1])
        if r.random() < 0.3: opt['beta1'] = 0.8; opt['beta2'] = 0.99
        if r.random() < 0.2: opt['eps'] = 1e-6
    c['opt'] = opt
    nsteps = c['steps'] * c['epochs']
    c['sched'] = r.choice([None, None, f"step:{r.randint(1, 3)}:0.5", f"cosine:{r.randint(2, 6)}",
                           f"cosine:{r.randint(2, 6)}:0.001", f"warmup-cosine:{r.randint(1, 3)}:{r.randint(2, 6)}",
                           f"warmup-cosine:2:4:0.0005:0.5"])
    c['clip'] = r.choice([None, None, 0.1, 1.0, 100.0])
    c['split'] = 'chunk' if has_bn else r.choice(['chunk', 'chunk', 'balanced', 'memory'])
    c['extra'] = r.randint(1, c['batch'] - 1) if (c['accumulate'] == 1 and c['batch'] > 1 and r.random() < 0.3) else 0
    if has_bn and c['extra'] and c.get('bn') == 'per_replica' and c['micro'] == 0: c['extra'] = 0
    if has_bn and c['extra'] == 1: c['extra'] = 0   # one row: refused by BN
    c['heldout'] = r.random() < 0.35
    c['recompute'] = r.choice([0, 0, 0, 1, 2])
    c['standardize'] = None if meta['kind'] == 'seq' else r.choice(['none', 'none', 'feature'] + (['channel'] if meta['kind'] == 'img' else []))
    if CLASSIC: return c  # session 24's cases, draw for draw
    if BF16: bf16_draws(c, seed, has_bn)
    # dropout, shuffled order and seeds: from a second generator, so that the draws
    # above (session 24's cases) stay as they were and only gain these
    r2 = random.Random(seed * 1000003 + 7)
    if r2.random() < 0.65: c['spec'] = add_dropout(r2, c['spec'], meta['kind'])
    c['dp_seed'] = r2.choice([0, r2.randrange(1, 1000), r2.randrange(1 << 64)])
    c['shuffle'] = r2.random() < 0.65
    c['data_seed'] = r2.choice([r2.randrange(1, 1000), r2.randrange(1 << 64)]) if r2.random() < (0.4 if c['shuffle'] else 0.1) else None
    # stopped after some epochs and resumed (the step counter keys dropout, the epoch
    # the order), without batchnorm maybe on another device count (rows keyed globally)
    if c['epochs'] > 1 and r2.random() < 0.3:
        c['resume_at'] = r2.randint(1, c['epochs'] - 1)
        if not has_bn and r2.random() < 0.5: c['resume_devices'] = r2.choice([1, 2, 3, 4])
    return c


def bf16_draws(c, seed, has_bn):
    """--bf16: the case in mixed precision, from a third generator (the draws above
    unchanged). --reduce-precision bf16 in 30% (not with sync batchnorm: its
    micro-batch gradients are not separable in a replay); split chunk where no
    micro-batch is fixed (PRECISION.md and DETERMINISM.md define the bf16 rounding
    per micro-batch; the other splits' cut points are not documented)."""
    r3 = random.Random(seed * 7919 + 3)
    c['bf16'] = True
    c['rbf16'] = c.get('bn') != 'sync' and r3.random() < 0.3
    if not c['micro']: c['split'] = 'chunk'


def add_dropout(r, spec, kind):
    """The spec with dropout above 0: session 24's `dropout 0` lines mostly given a
    probability, and dropout layers inserted where the spec language allows them (after
    the input of a flat or image model, after activations, linears, convolutions, pools,
    flatten and batchnorm, never after the head; on a sequence after the embedding, in
    residual blocks, and on attention's probabilities); at least one above 0."""
    P = lambda: r.choice([0.05, 0.1, 0.2, 0.3, 0.5, 0.5, 0.7, 0.9])
    lines = spec.splitlines(); out = []; n = 0
    head = max(i for i, l in enumerate(lines) if l.startswith('linear'))
    for i, l in enumerate(lines):
        w = l.split()
        if w[0] == 'dropout' and float(w[1]) == 0 and r.random() < 0.8:
            l = f"dropout {P()}"; n += 1
        elif w[0] == 'attention' and (len(w) == 2 or float(w[3]) == 0) and r.random() < 0.6:
            l = f"attention {w[1]} dropout {P()}"; n += 1
        out.append(l)
        if i >= head or w[0] in ('loss', 'residual', 'dropout'): continue
        nxt = lines[i + 1].split()[0] if i + 1 < len(lines) else ''
        if kind == 'seq':
            ok = w[0] in ('embed', 'gelu', 'relu', 'tanh') or (w[0] == 'linear' and nxt == 'end') or w[0] == 'end'
            pr = 0.35
        else:
            ok = w[0] != 'input' or nxt != 'embed'
            pr = 0.2 if w[0] == 'input' else 0.25
        if ok and nxt != 'dropout' and r.random() < pr:
            out.append(f"dropout {P()}"); n += 1
    if n == 0:  # one after the first place that takes it
        for i, l in enumerate(out):
            w = l.split()[0]
            if (kind == 'seq' and w == 'embed') or (kind != 'seq' and w == 'input'):
                out.insert(i + 1, f"dropout {P()}"); break
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- dp side
def sh(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\nrc={p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout + p.stderr


def opt_args(c):
    o = c['opt']; a = ['--optimizer', o['name'], '--lr', repr(o['lr'])]
    if o.get('wd') is not None: a += ['--weight-decay', repr(o['wd'])]
    for k, f in (('momentum', '--momentum'), ('dampening', '--dampening'), ('beta1', '--beta1'), ('beta2', '--beta2'), ('eps', '--eps')):
        if k in o: a += [f, repr(o[k])]
    if o.get('nesterov'): a += ['--nesterov']
    return a


def make_data(c, d):
    rng = np.random.default_rng(c['seed'])
    train = c['batch'] * c['accumulate'] * c['steps'] + c.get('extra', 0)
    hold = 0
    if c.get('heldout'):
        if train % 3 == 0: c['tf'] = '0.25'; hold = train // 3
        else: c['tf'] = '0.5'; hold = train
    rows = train + hold
    c['rows'] = rows; c['train'] = train
    net = Net(c['spec'])
    if c['kind'] == 'seq':
        T, V = c['T'], c['V']
        ids = rng.integers(0, V, size=rows * T + 1).astype(np.int32)
        np.save(f"{d}/ids.npy", ids)
        X = np.stack([ids[k * T: k * T + T] for k in range(rows)]).astype(np.float32)
        Y = np.stack([ids[k * T + 1: k * T + T + 1] for k in range(rows)]).astype(np.int64)
        np.save(f"{d}/x.npy", X)
        return X, Y
    nin = int(np.prod(net.in_shape))
    X = rng.standard_normal((rows, nin))
    if c.get('standardize') not in (None, 'none'):  # features of different scales
        X = X * rng.uniform(0.1, 10, size=nin) + rng.uniform(-5, 5, size=nin)
    X = (X * c.get('xscale', 1.0)).astype(np.float32)
    np.save(f"{d}/x.npy", X)
    nout = net.out_shape[0]
    if c['loss'] == 'mse':
        Y = rng.standard_normal((rows, nout)).astype(np.float32)
    else:
        Y = rng.integers(0, nout, size=rows).astype(np.int32)
    np.save(f"{d}/y.npy", Y)
    return X, Y


def init_weights(c, d):
    torch.manual_seed(c['seed'])
    net = Net(c['spec'])
    with torch.no_grad():
        for n, p in net.named_parameters():  # perturb norms' affine so they matter
            if p.dim() == 1 and ('weight' in n) and not isinstance(net._modules[n.split('.')[0]], nn.Linear):
                p.add_(0.2 * torch.randn_like(p))
            elif p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
        for n, b in net.named_buffers():
            if 'running_mean' in n: b.copy_(0.1 * torch.randn_like(b))
            if 'running_var' in n: b.copy_(1 + 0.1 * torch.rand_like(b))
    sd = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
    save_file(sd, f"{d}/init.safetensors")
    return sd


def dp_train_cmds(c):
    """The training: one command, or (c['resume_at'] = k) k epochs saved to mid.ckpt
    and the rest resumed from it (on c['resume_devices'] devices where given)."""
    k = c.get('resume_at')
    if not k: return [dp_train_cmd(c)]
    return [dp_train_cmd(c, epochs=k, save='mid.ckpt'),
            dp_train_cmd(c, epochs=c['epochs'] - k, resume='mid.ckpt', devices=c.get('resume_devices'))]


def dp_train_cmd(c, epochs=None, resume='init.ckpt', save='out.ckpt', devices=None):
    cmd = [DP, 'train', '--model', 'm.dpm', '--resume', resume] + ([] if c.get('shuffle') else ['--no-shuffle']) + [
           '--batch', str(c['batch']), '--devices', str(devices or c['devices']), '--mode', c['mode'], '--seed', str(c.get('dp_seed', 0)),
           '--epochs', str(epochs or c['epochs']), '--log', 'run.jsonl', '--save', save, '--quiet']
    if c['kind'] == 'seq': cmd += ['--tokens', 'ids.npy']
    else: cmd += ['--data', 'x.npy', '--labels', 'y.npy', '--standardize', 'none']
    cmd += ['--test-fraction', c['tf'], '--eval-every', '1'] if c.get('heldout') else ['--test-fraction', '0']
    if c.get('bf16'): cmd += ['--precision', 'bf16']
    if c.get('rbf16'): cmd += ['--reduce-precision', 'bf16']
    if c.get('recompute'): cmd += ['--recompute', str(c['recompute'])]
    if c['kind'] != 'seq': cmd[cmd.index('--standardize') + 1] = c.get('standardize') or 'none'
    if c['shard']: cmd += ['--shard-optimizer']
    if c['micro']: cmd += ['--micro-batch', str(c['micro'])]
    if c['accumulate'] > 1: cmd += ['--accumulate', str(c['accumulate'])]
    if c.get('bn'): cmd += ['--batchnorm', c['bn']]
    if c['sched']: cmd += ['--lr-schedule', c['sched']]
    if c['clip']: cmd += ['--clip-grad-norm', repr(c['clip'])]
    if c['split'] != 'chunk': cmd += ['--split', c['split']]
    if c.get('data_seed') is not None: cmd += ['--data-seed', str(c['data_seed'])]
    return cmd + opt_args(c)


def run_dp(c, d):
    with open(f"{d}/m.dpm", "w") as f: f.write(c['spec'])
    cmds = [[DP, 'import', 'init.safetensors', '--model', 'm.dpm', '--out', 'init.ckpt', '--seed', str(c.get('dp_seed', 0))] + opt_args(c),
            *dp_train_cmds(c),
            [DP, 'export', 'out.ckpt', '--safetensors', 'out.safetensors'],
            [DP, 'predict', '--checkpoint', 'out.ckpt', '--data', 'x.npy', '--out', 'pred.csv'] + (['--precision', 'bf16'] if c.get('bf16') else [])]
    with open(f"{d}/cmds.sh", "w") as f:
        f.write("set -e\n" + "\n".join(' '.join(x) for x in cmds) + "\n")
    outs = [sh(x, d) for x in cmds]
    logs = [json.loads(l) for l in open(f"{d}/run.jsonl")]
    out = load_file(f"{d}/out.safetensors")
    pred = np.loadtxt(f"{d}/pred.csv", delimiter=',', ndmin=2)
    nout = Net(c['spec']).out_shape[0]
    if c['kind'] == 'seq':
        pred = pred[:, c['T']:].reshape(len(pred), c['T'], nout)
    elif c['loss'] == 'softmax_cross_entropy':
        pred = pred[:, 1:]
    return out, logs, pred, outs[1:-2]


# ---------------------------------------------------------------- torch replay
def cuts(c, rows):
    """Micro-batch row ranges of one call (chunk split)."""
    B = rows
    if c['micro']:
        K = c['micro']; return [(i, min(i + K, B)) for i in range(0, B, K)]
    N = c['devices']; ch = -(-c['batch'] // N)  # planned chunk
    return [(i, min(i + ch, B)) for i in range(0, B, ch) if i < B]


def make_sched(c, opt):
    s = c['sched']; S = torch.optim.lr_scheduler
    if not s: return None
    f = s.split(':')
    if f[0] == 'step': return S.StepLR(opt, int(f[1]), float(f[2]))
    if f[0] == 'cosine': return S.CosineAnnealingLR(opt, int(f[1]), float(f[2]) if len(f) > 2 else 0.0)
    W, T = int(f[1]), int(f[2]); eta = float(f[3]) if len(f) > 3 else 0.0; st = float(f[4]) if len(f) > 4 else 1 / 3
    return S.SequentialLR(opt, [S.LinearLR(opt, st, 1.0, W), S.CosineAnnealingLR(opt, T, eta)], milestones=[W])


def standardize(c, X, tr_idx):
    """dp train's standardisation, fitted on the training share (rows tr_idx), in double."""
    mode = c.get('standardize')
    if mode in (None, 'none'): return X
    Xd = X.astype(np.float64); tr = Xd[np.sort(tr_idx)]
    if mode == 'feature':
        mean = tr.mean(0); std = tr.std(0)
    else:
        C = Net(c['spec']).in_shape[0]; v = tr.reshape(len(tr), C, -1)
        mean = np.repeat(v.mean((0, 2)), v.shape[2]); std = np.repeat(v.std((0, 2)), v.shape[2])
    std = np.where(std == 0, 1.0, std)
    return ((Xd - mean) / std).astype(np.float32)


def data_seed(c):
    return c['data_seed'] if c.get('data_seed') is not None else c.get('dp_seed', 0)


def rows_of(c):
    """The training rows (file indices, in the split's order) and the held-out ones."""
    n, ntr = c['rows'], c['train']
    if c['kind'] == 'seq':  # windows: the tail is held out, never shuffled
        return np.arange(ntr), np.arange(ntr, n)
    tr, te = split_rows(n, c['tf'] if c.get('heldout') else 0, c.get('shuffle', False), data_seed(c))
    assert len(tr) == ntr, (len(tr), ntr)
    return tr, te


def cuts_at(c, rows, ep):
    """cuts() in epoch ep: after a resume on another device count, that count's."""
    if c.get('resume_devices') and ep >= c['resume_at']:
        return cuts(dict(c, devices=c['resume_devices']), rows)
    return cuts(c, rows)


def replay(c, sd0, X, Y, dtype, how=None):
    """PyTorch's run of the case in dtype; how='bf16': PRECISION.md's bf16 (Net.bf16,
    BfCtx, and with c['rbf16'] the reduction's sums rounded in the canonical tree);
    how='autocast': plain torch.autocast('cpu', torch.bfloat16), PyTorch's own bf16."""
    net = Net(c['spec'])
    net.load_state_dict(sd0, strict=True)
    net = net.to(dtype)
    bf = how == 'bf16'; net.bf16 = bf; ac = how == 'autocast'
    net.keyed.seed = c.get('dp_seed', 0)
    tr_idx, te_idx = rows_of(c)
    if c['kind'] == 'seq':
        Xt = torch.tensor(X).long(); Yt = torch.tensor(Y).long()
    else:
        Xt = torch.tensor(standardize(c, X, tr_idx), dtype=dtype)
        Yt = torch.tensor(Y, dtype=dtype) if c['loss'] == 'mse' else torch.tensor(Y).long()
    o = c['opt']; params = list(net.parameters())
    if o['name'] == 'adamw':
        opt = torch.optim.AdamW(params, lr=o['lr'], betas=(o.get('beta1', 0.9), o.get('beta2', 0.999)),
                                eps=o.get('eps', 1e-8), weight_decay=0.01 if o.get('wd') is None else o['wd'])
    else:
        mom = o.get('momentum', 0.9 if o['name'] == 'momentum' else 0.0)
        opt = torch.optim.SGD(params, lr=o['lr'], momentum=mom, dampening=o.get('dampening', 0.0),
                              nesterov=bool(o.get('nesterov')), weight_decay=o.get('wd') or 0.0)
    sch = make_sched(c, opt)
    bns = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    B, A, ntr = c['batch'], c['accumulate'], c['train']
    calls_per_epoch = -(-ntr // B)
    T = c['T'] if c['kind'] == 'seq' else 1
    ep_loss, ep_lr, ep_norm, ep_held = [], [], [], []
    norm = None; nstep = 0  # optimizer steps so far: dropout's key (from import's step 0)
    for ep in range(c['epochs']):
        net.train()
        calls = []; lr_used = None
        order = tr_idx[epoch_order(ntr, data_seed(c), ep)] if c.get('shuffle') else tr_idx
        for ci in range(calls_per_epoch):
            if ci % A == 0: opt.zero_grad()
            r0 = ci * B; rows = min(B, ntr - r0)
            sel = torch.tensor(order[r0:r0 + rows])
            xb, yb = Xt[sel], Yt[sel]
            mc = cuts_at(c, rows, ep)
            rbf = bf and c.get('rbf16')
            mbs = [(0, rows)] if (c.get('bn') == 'sync' or not bns) and not rbf else mc
            # bf16: a forward over several micro-batches rounds the weight gradients per micro-batch
            BfCtx.cuts = mc if len(mbs) == 1 else None
            if rbf and ci % A == 0:  # --reduce-precision bf16: the leaves of the step's tree
                Kc = mc[0][1] - mc[0][0]; Mc = -(-B // Kc); leaves = [None] * (A * Mc)
            tot = 0.0
            for j, (lo, hi) in enumerate(mbs):
                saved = [(m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone()) for m in bns]
                # dropout keyed by the row of the accumulation's concatenation of calls
                net.keyed.step = nstep; net.keyed.rows = (ci % A) * rows + np.arange(lo, hi)
                with torch.autocast('cpu', dtype=torch.bfloat16, enabled=ac):
                    out = net(xb[lo:hi])
                out = out.float() if dtype == torch.float32 else out
                if c['loss'] == 'mse':
                    l = F.mse_loss(out, yb[lo:hi], reduction='sum') / (rows * out.shape[-1])
                else:
                    l = F.cross_entropy(out.reshape(-1, out.shape[-1]), yb[lo:hi].reshape(-1), reduction='sum') / (rows * T)
                (l / A).backward(); tot += l.item()
                if rbf:  # this micro-batch's gradient alone, rounded (the tree's leaf)
                    leaves[(ci % A) * Mc + lo // Kc] = [R(p.grad) if p.grad is not None else torch.zeros_like(p) for p in params]
                    opt.zero_grad()
                if j > 0:  # running stats follow micro-batch 0
                    with torch.no_grad():
                        for m, (rm, rv, nb) in zip(bns, saved):
                            m.running_mean.copy_(rm); m.running_var.copy_(rv); m.num_batches_tracked.copy_(nb)
            calls.append(tot)
            if ci % A == A - 1:
                if rbf:  # every sum of the canonical tree rounded (PRECISION.md)
                    red = _tree_params(leaves)
                    for p, g in zip(params, red): p.grad = g.clone()
                if c['clip']:
                    norm = float(torch.nn.utils.clip_grad_norm_(params, c['clip']))
                lr_used = opt.param_groups[0]['lr']
                opt.step(); nstep += 1
                if sch: sch.step()
        ep_loss.append(float(np.mean(calls))); ep_lr.append(lr_used); ep_norm.append(norm)
        if c.get('heldout'):
            net.eval()
            with torch.no_grad():
                te = torch.tensor(te_idx)
                BfCtx.cuts = None
                with torch.autocast('cpu', dtype=torch.bfloat16, enabled=ac):
                    out = net(Xt[te]).double()
                if c['loss'] == 'mse': hl = float(((out - Yt[te].double()) ** 2).mean())
                else: hl = float(F.cross_entropy(out.reshape(-1, out.shape[-1]), Yt[te].reshape(-1)))
            ep_held.append(hl)
    net.eval()
    BfCtx.cuts = None
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16, enabled=ac):
        pred = net(Xt).float().numpy() if dtype == torch.float32 else net(Xt).numpy()
    return net, dict(loss=ep_loss, lr=ep_lr, norm=ep_norm, held=ep_held), pred


def _tree_params(leaves):
    """The canonical tree's sum of per-parameter gradient lists, every sum rounded."""
    def t(lo, hi):
        if hi - lo == 1: return leaves[lo]
        mid = (lo + hi + 1) // 2
        a, b = t(lo, mid), t(mid, hi)
        if a is None: return b
        if b is None: return a
        return [R(x + y) for x, y in zip(a, b)]
    return t(0, len(leaves))


def rel(a, b):
    a = np.asarray(a, np.float64).ravel(); b = np.asarray(b, np.float64).ravel()
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / nb) if nb > 0 else float(np.linalg.norm(a - b))



def log_rel(logs, key, ref):
    """The largest relative error of dp's logged values of key against ref's (inf
    when their counts differ or dp lacks one that ref has)."""
    got = [l.get(key) for l in logs]
    if len(got) != len(ref): return float('inf')
    e = 0.0
    for g, w in zip(got, ref):
        if w is None: continue
        if g is None: return float('inf')
        e = max(e, abs(g - w) / max(abs(w), 1e-30))
    return e

def check(c, d):
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/case.json", "w") as f: json.dump(c, f, indent=1)
    X, Y = make_data(c, d)
    sd0 = init_weights(c, d)
    out, logs, pred, trainlog = run_dp(c, d)
    n32, l32, p32 = replay(c, sd0, X, Y, torch.float32)
    n64, l64, p64 = replay(c, sd0, X, Y, torch.float64)
    sd32, sd64 = n32.state_dict(), n64.state_dict()
    res = {}
    allp_dp, allp_32, allp_64 = [], [], []
    worst = (0, None)
    for k in sd32:
        if k.endswith('num_batches_tracked'):
            if int(out[k]) != int(sd32[k]): res['nbt:' + k] = (int(out[k]), int(sd32[k]))
            continue
        e = rel(out[k], sd32[k].detach()); e64 = rel(sd32[k].detach(), sd64[k].detach()); ed = rel(out[k], sd64[k].detach())
        res[k] = (e, ed, e64)
        if 'running' not in k:
            allp_dp.append(out[k].numpy().ravel()); allp_32.append(sd32[k].detach().numpy().ravel()); allp_64.append(sd64[k].detach().numpy().ravel())
    tot = rel(np.concatenate(allp_dp), np.concatenate(allp_32))
    tot64 = rel(np.concatenate(allp_dp), np.concatenate(allp_64))
    base = rel(np.concatenate(allp_32), np.concatenate(allp_64))
    mrel = lambda key, ref: log_rel(logs, key, ref)
    dl = [l['loss'] for l in logs]
    lerr = mrel('loss', l32['loss']); lerr64 = mrel('loss', l64['loss'])
    lrerr = mrel('lr', l32['lr']); nerr = mrel('grad_norm', l64['norm']) if c['clip'] else 0.0
    herr = mrel('heldout_loss', l64['held']) if c.get('heldout') else 0.0
    hbase = max([abs(a - b) / abs(b) for a, b in zip(l32['held'], l64['held'])] or [0])
    lbase = max([abs(a - b) / abs(b) for a, b in zip(l32['loss'], l64['loss']) if b] or [0])
    nbase = max([abs(a - b) / abs(b) for a, b in zip(l32['norm'], l64['norm']) if b] or [0])
    perr = rel(pred, p32); perr64 = rel(pred, p64); pbase = rel(p32, p64)
    summary = dict(lr=lrerr, norm64=nerr, norm_base=nbase, held64=herr, held_base=hbase, params=tot, params64=tot64, params_base=base, loss=lerr, loss64=lerr64, loss_base=lbase,
                   pred=perr, pred64=perr64, pred_base=pbase,
                   worst_tensor=max(((v[1], k) for k, v in res.items() if isinstance(v, tuple) and isinstance(v[0], float)), default=None),
                   nbt=[(k, v) for k, v in res.items() if k.startswith('nbt:')],
                   dp_loss=dl, torch=l32)
    with open(f"{d}/result.json", "w") as f: json.dump(dict(summary=summary, tensors=res), f, indent=1)
    return summary


def check_bf16(c, d):
    """A bf16 case: libdp against PRECISION.md's replay (how='bf16'), the scale being
    PyTorch's own bf16 gap: plain autocast against its fp32 run."""
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/case.json", "w") as f: json.dump(c, f, indent=1)
    X, Y = make_data(c, d)
    sd0 = init_weights(c, d)
    out, logs, pred, trainlog = run_dp(c, d)
    runs = {h: replay(c, sd0, X, Y, torch.float32, h) for h in ('bf16', 'autocast', None)}
    n64 = replay(c, sd0, X, Y, torch.float64)[0].state_dict()  # PyTorch's own fp32 noise
    sds = {h: r[0].state_dict() for h, r in runs.items()}
    res = {}; cat = {}
    keys = [k for k in sds['bf16'] if not k.endswith('num_batches_tracked')]
    for k in sds['bf16']:
        if k.endswith('num_batches_tracked') and int(out[k]) != int(sds['bf16'][k]):
            res['nbt:' + k] = (int(out[k]), int(sds['bf16'][k]))
    for k in keys:
        res[k] = (rel(out[k], sds['bf16'][k].detach()), rel(sds['autocast'][k].detach(), sds[None][k].detach()),
                  rel(out[k], sds['autocast'][k].detach()))
    P = lambda sd: np.concatenate([(out[k].numpy() if sd is None else sd[k].detach().numpy()).ravel() for k in keys if 'running' not in k] or [np.zeros(1)])
    pdp = P(None); pbf, pac, pf = P(sds['bf16']), P(sds['autocast']), P(sds[None])
    mrel = lambda key, ref: log_rel(logs, key, ref)
    def lgap(key):
        a, b = runs['autocast'][1][key], runs[None][1][key]
        return max([abs(x - y) / abs(y) for x, y in zip(a, b) if x is not None and y] or [0])
    lb = runs['bf16'][1]
    # libdp's logits against the replay's forward at libdp's own trained parameters:
    # the inference semantics alone, apart from the training's drift
    own = Net(c['spec']); own.load_state_dict({k: out[k] for k in sds['bf16']}, strict=True); own.eval()
    Xo = torch.tensor(X).long() if c['kind'] == 'seq' else torch.tensor(standardize(c, X, rows_of(c)[0]))
    with torch.no_grad():
        own.bf16 = True; po = own(Xo).numpy(); own.bf16 = False
        with torch.autocast('cpu', dtype=torch.bfloat16): pa = own(Xo).float().numpy()
        pf32 = own(Xo).numpy()
    summary = dict(
        params_noise=rel(pf, np.concatenate([n64[k].detach().numpy().ravel() for k in keys if 'running' not in k] or [np.zeros(1)])),
        pred_own=rel(pred, po), pred_own_base=rel(pa, pf32),
        params=rel(pdp, pbf), params_base=rel(pac, pf), params_ac=rel(pdp, pac), params_fp32=rel(pdp, pf), params_rep_ac=rel(pbf, pac),
        loss=mrel('loss', lb['loss']), loss_base=lgap('loss'),
        lr=mrel('lr', lb['lr']),
        norm=mrel('grad_norm', lb['norm']) if c['clip'] else 0.0, norm_base=lgap('norm') if c['clip'] else 0.0,
        held=mrel('heldout_loss', lb['held']) if c.get('heldout') else 0.0, held_base=lgap('held') if c.get('heldout') else 0.0,
        pred=rel(pred, runs['bf16'][2]), pred_base=rel(runs['autocast'][2], runs[None][2]), pred_ac=rel(pred, runs['autocast'][2]),
        worst_tensor=max(((v[0], k) for k, v in res.items() if isinstance(v, tuple) and isinstance(v[0], float)), default=None),
        nbt=[(k, v) for k, v in res.items() if k.startswith('nbt:')],
        dp_loss=[l['loss'] for l in logs], torch=lb)
    with open(f"{d}/result.json", "w") as f: json.dump(dict(summary=summary, tensors=res), f, indent=1)
    return summary


def bf16_bad(s):
    """BAD: further from the bf16 replay than a quarter of PyTorch's own autocast-fp32
    gap and than a floor (2^-8 of bf16 rounding, 1e-3 for the gradient norm and
    held-out loss scalars), a learning rate off, or a batchnorm step count."""
    return [k for k, fl in (('params', 4e-3), ('loss', 4e-3), ('pred_own', 1e-3), ('norm', 1e-3), ('held', 1e-3))
            if s[k] > fl and s[k] > 0.25 * s[k + '_base']] + (['lr'] if s['lr'] > 1e-6 else []) + (['nbt'] if s['nbt'] else [])


def mask_check(d, cases=None):
    """libdp's dropout mask read off directly, against dropout_keep and epoch_order: a
    model `input N / dropout p / linear K nobias / loss mse` from W = 0, one SGD step
    (lr 1) of K = A B rows whose targets are one-hot (file row q: e_q); then W[q, j] =
    2 / (A B K) x[q, j] m[g, j] / (1 - p), g the row's global index in the step (its
    place in the epoch's order), so W's zeros are the mask's. Bit-for-bit: the zeros
    must agree everywhere, the values to 1e-6. Returns the number of failures."""
    os.makedirs(d, exist_ok=True); bad = 0
    cases = cases or [  # (N, p, B, A, devices, micro, seed, shuffle, data_seed, mode)
        (7, 0.5, 6, 1, 1, 0, 0, False, None, 'classic'),
        (5, 0.3, 8, 1, 2, 0, 1, False, None, 'allreduce'),
        (9, 0.7, 5, 2, 2, 2, 12345, False, None, 'classic'),
        (4, 0.1, 6, 4, 4, 1, 2 ** 64 - 1, True, None, 'allreduce'),
        (6, 0.5, 7, 2, 3, 0, 99, True, 7, 'classic'),
        (3, 0.9, 12, 1, 2, 5, 0xDEADBEEFCAFEF00D, True, 2 ** 63 + 5, 'allreduce'),
    ]
    for N, p, B, A, dev, mb, seed, shuf, ds, mode in cases:
        K = A * B
        spec = f"input {N}\ndropout {p}\nlinear {K} nobias\nloss mse\n"
        with open(f"{d}/m.dpm", "w") as f: f.write(spec)
        rng = np.random.default_rng(seed & 0xFFFF)
        X = rng.uniform(1, 2, size=(K, N)).astype(np.float32); Y = np.eye(K, dtype=np.float32)
        np.save(f"{d}/x.npy", X); np.save(f"{d}/y.npy", Y)
        save_file({'1.weight': torch.zeros(K, N)}, f"{d}/init.safetensors")
        opt = ['--optimizer', 'sgd', '--lr', '1', '--weight-decay', '0']
        sh([DP, 'import', 'init.safetensors', '--model', 'm.dpm', '--out', 'init.ckpt', '--seed', str(seed)] + opt, d)
        cmd = [DP, 'train', '--model', 'm.dpm', '--resume', 'init.ckpt', '--data', 'x.npy', '--labels', 'y.npy',
               '--standardize', 'none', '--test-fraction', '0', '--batch', str(B), '--devices', str(dev), '--mode', mode,
               '--seed', str(seed), '--epochs', '1', '--save', 'out.ckpt', '--quiet'] + opt
        if not shuf: cmd += ['--no-shuffle']
        if ds is not None: cmd += ['--data-seed', str(ds)]
        if A > 1: cmd += ['--accumulate', str(A)]
        if mb: cmd += ['--micro-batch', str(mb)]
        sh(cmd, d); sh([DP, 'export', 'out.ckpt', '--safetensors', 'out.safetensors'], d)
        W = load_file(f"{d}/out.safetensors")['1.weight'].numpy().astype(np.float64)
        dseed = seed if ds is None else ds  # the split shuffles too (with no held-out rows)
        order = split_rows(K, 0, True, dseed)[0][epoch_order(K, dseed, 0)] if shuf else np.arange(K)
        g_of = np.empty(K, np.int64); g_of[order] = np.arange(K)  # file row q is global row g_of[q]
        keep = dropout_keep(seed, 0, 0, g_of, N, p)  # the dropout is layer 0, step 0
        want = 2.0 / (K * K) * X.astype(np.float64) * keep / (1.0 - float(np.float32(p)))
        zeros_ok = np.array_equal(W == 0, ~keep)
        e = rel(W, want)
        ok = zeros_ok and e < 1e-6
        bad += not ok
        print(f"mask N{N} p{p} B{B} acc{A} dev{dev} mb{mb} {mode} seed {seed} shuffle {int(shuf)} data-seed {ds}: "
              f"{'ok ' if ok else 'BAD'} zeros {'equal' if zeros_ok else 'DIFFER'} ({int((~keep).sum())} of {keep.size} dropped), values {e:.1e}", flush=True)
    return bad


def desc(c):
    o = c['opt']
    return (f"{c['kind']:4s} {c['loss'][:3]} dev{c['devices']} {c['mode'][:5]}{'+sh' if c['shard'] else ''} B{c['batch']} mb{c['micro']} acc{c['accumulate']} "
            f"st{c['steps']}x{c['epochs']} {o['name']}{'/nest' if o.get('nesterov') else ''}{'/damp' if 'dampening' in o else ''} "
            f"sch={c['sched']} clip={c['clip']} bn={c.get('bn')} {c['split']} x{c['extra']} ho{int(c['heldout'])} rc{c['recompute']} std={c['standardize']}"
            f" drop={max_dropout(c['spec']):g} {'shuf' if c.get('shuffle') else 'file'}{'' if c.get('data_seed') is None else '/ds'} seed={c.get('dp_seed', 0)}"
            + (f" resume@{c['resume_at']}" + (f"/dev{c['resume_devices']}" if c.get('resume_devices') else '') if c.get('resume_at') else ''))


def max_dropout(spec):
    """The largest dropout probability of a spec (layers and attention's), 0 if none."""
    ps = [float(w[i + 1]) for w in (l.split() for l in spec.splitlines()) for i in range(len(w) - 1) if w[i] == 'dropout']
    return max(ps, default=0.0)


if __name__ == '__main__':
    if sys.argv[1] == '--mask-check':
        sys.exit(1 if mask_check(f"{ROOT}/mask") else 0)
    if sys.argv[1] == '--case':
        d = sys.argv[2]; c = json.load(open(f"{d}/case.json"))
        print(json.dumps((check_bf16 if c.get('bf16') else check)(c, d), indent=1)); sys.exit()
    n = int(sys.argv[1]); s0 = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    for seed in range(s0, s0 + n):
        c = rand_case(seed); d = f"{ROOT}/{'bf16' if BF16 else 'cases'}/{seed}"
        try:
            s = (check_bf16 if BF16 else check)(c, d)
        except Exception as e:
            print(f"seed {seed}: ERROR {desc(c)}\n   {str(e)[:600]}", flush=True); continue
        if BF16:
            bad = bf16_bad(s)
            print(f"seed {seed}: {'BAD' if bad else 'ok '} P {s['params']:.1e} (ac-fp32 {s['params_base']:.1e}, fp32-64 {s['params_noise']:.0e}, ac {s['params_ac']:.1e}) "
                  f"L {s['loss']:.1e} ({s['loss_base']:.1e}) n {s['norm']:.0e} h {s['held']:.0e} pred {s['pred_own']:.1e} ({s['pred_own_base']:.1e}) trained {s['pred']:.1e} ({s['pred_base']:.1e})"
                  f"{' rbf16' if c.get('rbf16') else ''} {' '.join(bad)} | {desc(c)}", flush=True)
            continue
        flag = 'BAD' if (s['params64'] > 1e-4 and s['params64'] > 20 * s['params_base']) or (s['loss64'] > 1e-4 and s['loss64'] > 20 * s.get('loss_base', 0)) or (s['pred64'] > 1e-4 and s['pred64'] > 20 * s['pred_base']) or s['nbt'] or s['lr'] > 1e-6 or (s['norm64'] > 1e-5 and s['norm64'] > 20 * s['norm_base']) or (s['held64'] > 1e-5 and s['held64'] > 20 * s['held_base']) else 'ok '
        print(f"seed {seed}: {flag} P {s['params']:.1e}/{s['params64']:.1e} (t32-64 {s['params_base']:.1e}) L {s['loss']:.1e} lr {s['lr']:.0e} n {s['norm64']:.0e} h {s['held64']:.0e} pred {s['pred']:.1e}/{s['pred64']:.1e} | {desc(c)}", flush=True)
