#!/usr/bin/env python3
"""libdp <-> PyTorch through safetensors files (dp_ckpt_import_safetensors /
dp_ckpt_export_safetensors), checked against torch itself.

    /usr/bin/python3 tools/golden/safetensors_roundtrip.py [BUILD_DIR]   (default build)

For each model spec below, with the nn.Sequential that libdp's spec stands for
(nn.GELU(approximate="tanh") and nn.LayerNorm(eps=1e-5), as lib/cpu_backend.c
computes them):

  a. torch -> libdp: the PyTorch-initialised model's state_dict saved as a
     safetensors file; libdp imports it and runs a forward on fixed inputs:
     its outputs must match torch's forward (max |diff| <= 1e-5 * max |y|);
     libdp's own export of what it imported must be the very same tensors.
  b. libdp -> torch: libdp trains a few SGD steps from there and exports;
     torch loads the export with load_state_dict(strict=True): torch's forward
     must match libdp's forward on the same inputs (same tolerance).
  c. for models without dropout, torch trains the same steps itself (SGD, mean
     loss over the batch): its parameters must match libdp's export
     (max |diff| <= 1e-5 * max(1, max |p|); the gradients' summation orders
     differ, which costs ~1e-8).

libdp is driven by a small C program that this script writes and compiles
against BUILD_DIR/libdp.a (cc -Iinclude ... libdp.a -lm -pthread; CC picks the
compiler). The files are written and read with the `safetensors` package when
it is importable, else by hand (json + struct, as safetensors.torch does:
tensors sorted by name, header padded with spaces to 8 bytes); the report says
which. Exit status: 0 when every check passed, 1 when one failed, 2 for a
usage or build problem, 77 (and a line "SKIP: ...") when torch is missing.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    from torch import nn
except ImportError as e:  # pragma: no cover - depends on the machine
    print("SKIP: torch (and numpy) not importable by %s: %s "
          "(on Debian: apt-get install python3-torch)" % (sys.executable, e))
    sys.exit(77)

try:
    import safetensors.torch as st_torch  # the reference implementation, when present
except ImportError:
    st_torch = None

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SPECS = [
    ("mlp", "input 12\nlinear 16\nlayernorm\ngelu\nlinear 5\nloss softmax_cross_entropy\n"),
    ("every_layer",
     "input 12\nlinear 16\nlayernorm\ngelu\ndropout 0.1\nlinear 16 nobias\ntanh\n"
     "linear 8\nrelu\nsigmoid\nlinear 5\nloss softmax_cross_entropy\n"),
    ("mse", "input 7\nlinear 9 nobias\nrelu\nlayernorm\nlinear 3\nloss mse\n"),
    ("cnn",
     "input 2 7 6\nconv2d 3 3 stride 2 padding 1\nrelu\nmaxpool2d 2 stride 1\n"
     "conv2d 4 2 nobias\ntanh\navgpool2d 1\nflatten\nlinear 5\nloss softmax_cross_entropy\n"),
    ("batchnorm",  # running statistics and num_batches_tracked (I64) both ways
     "input 2 5 5\nconv2d 3 3 padding 1\nbatchnorm\nrelu\nflatten\nlinear 6\nbatchnorm\n"
     "tanh\nlinear 3\nloss mse\n"),
]
ROWS = 24
STEPS = 5
LR = 0.05
FWD_TOL = 1e-5
TRAIN_TOL = 1e-5

DRIVER = r"""
/* safetensors_roundtrip.py's libdp driver:
 *   driver SPEC IN.safetensors X T ROWS STEPS LR OUT.safetensors Y
 * imports IN into a fresh 2-device context of SPEC (SGD, lr LR, batch ROWS),
 * trains STEPS steps on the batch X (ROWS x in, raw float32) with targets T
 * (int32 labels or float32 rows), exports OUT, runs a forward on X and writes
 * the outputs (ROWS x out, raw float32) to Y. */
#include "dp.h"
#include <stdio.h>
#include <stdlib.h>

static void *slurp(const char *path, size_t want) {
  FILE *f = fopen(path, "rb");
  void *b = malloc(want ? want : 1);
  if (!f || !b || fread(b, 1, want, f) != want) {
    fprintf(stderr, "driver: cannot read %zu bytes from %s\n", want, path);
    exit(2);
  }
  fclose(f);
  return b;
}

#define TRY(call)                                                              \
  do {                                                                         \
    dp_status s_ = (call);                                                     \
    if (s_) {                                                                  \
      fprintf(stderr, "driver: %s: %s: %s\n", #call, dp_status_name(s_),      \
              ctx ? dp_ctx_error(ctx) : dp_last_error());                      \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(int argc, char **argv) {
  if (argc != 10) {
    fprintf(stderr, "usage: driver SPEC IN X T ROWS STEPS LR OUT Y\n");
    return 2;
  }
  int rows = atoi(argv[5]), steps = atoi(argv[6]);
  dp_model *m = NULL;
  dp_plan *p = NULL;
  dp_ctx *ctx = NULL;
  TRY(dp_model_load(argv[1], &m));
  int in = dp_model_input_width(m), out = dp_model_output_width(m);
  int ce = dp_model_loss(m) == DP_LOSS_SOFTMAX_CE;
  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = rows;
  cfg.n_devices = 2;
  cfg.seed = 12345; /* replaced by the import */
  cfg.lr = (float)atof(argv[7]);
  TRY(dp_plan_create(m, &cfg, &p));
  TRY(dp_ctx_create(p, &ctx));
  TRY(dp_ckpt_import_safetensors(ctx, argv[2]));
  float *x = slurp(argv[3], (size_t)rows * in * 4);
  void *t = slurp(argv[4], (size_t)rows * (ce ? 1 : out) * 4);
  for (int k = 0; k < steps; k++) TRY(dp_train_step(ctx, rows, in, x, t, NULL));
  TRY(dp_ckpt_export_safetensors(ctx, argv[8]));
  float *y = malloc((size_t)rows * out * 4);
  TRY(dp_forward(ctx, rows, in, x, y));
  FILE *f = fopen(argv[9], "wb");
  if (!f || fwrite(y, 4, (size_t)rows * out, f) != (size_t)rows * out || fclose(f)) {
    fprintf(stderr, "driver: cannot write %s\n", argv[9]);
    return 1;
  }
  free(x);
  free(t);
  free(y);
  dp_ctx_free(ctx);
  dp_plan_free(p);
  dp_model_free(m);
  return 0;
}
"""


# ---- safetensors, by the package or by hand -------------------------------------

def save_st(tensors, path):
    if st_torch is not None:
        st_torch.save_file(tensors, path, metadata={"format": "pt"})
        return
    names = sorted(tensors)  # as safetensors orders F32 tensors: by name
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in names:
        a = tensors[name].detach().contiguous().numpy().astype("<f4")
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_st(path):
    if st_torch is not None:
        return st_torch.load_file(path)
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError("%s: too short" % path)
    (hlen,) = struct.unpack("<Q", buf[:8])
    if hlen > len(buf) - 8:
        raise ValueError("%s: header length %d past the end" % (path, hlen))
    hdr_bytes = buf[8:8 + hlen]
    if not hdr_bytes.startswith(b"{"):
        raise ValueError("%s: header does not start with '{'" % path)
    header = json.loads(hdr_bytes.decode("utf-8"))
    data = buf[8 + hlen:]
    out, spans = {}, []
    for name, info in header.items():
        if name == "__metadata__":
            if not all(isinstance(v, str) for v in info.values()):
                raise ValueError("%s: metadata values must be strings" % path)
            continue
        if info["dtype"] != "F32":
            raise ValueError("%s: %s is %s" % (path, name, info["dtype"]))
        b, e = info["data_offsets"]
        n = 1
        for d in info["shape"]:
            n *= d
        if e - b != 4 * n or e > len(data):
            raise ValueError("%s: %s has bad data_offsets" % (path, name))
        spans.append((b, e))
        a = np.frombuffer(data, dtype="<f4", count=n, offset=b).astype(np.float32)
        out[name] = torch.from_numpy(a.copy()).reshape(info["shape"])
    # as safetensors validates: the tensors tile the data exactly
    pos = 0
    for b, e in sorted(spans):
        if b != pos:
            raise ValueError("%s: data_offsets leave a gap or overlap at %d" % (path, b))
        pos = e
    if pos != len(data):
        raise ValueError("%s: %d bytes of data, the tensors cover %d" % (path, len(data), pos))
    return out


# ---- the model --------------------------------------------------------------------

class Seq(nn.Sequential):
    """nn.Sequential whose rows are libdp's: an image input is reshaped to NCHW
    on the way in, and every output flattened per row on the way out (the
    state_dict names are nn.Sequential's own)."""

    def __init__(self, shape, mods):
        super().__init__(*mods)
        self.shape = shape

    def forward(self, x):
        y = super().forward(x.reshape(x.shape[0], *self.shape))
        return y.reshape(x.shape[0], -1)


def window(n, k, s, p):
    return (n + 2 * p - k) // s + 1


def sequential(spec):
    """nn.Sequential of a libdp spec (Seq), its loss and its output width."""
    mods, width, loss, img, shape = [], None, None, None, None
    for line in spec.splitlines():
        w = line.split("#")[0].split()
        if not w:
            continue
        if w[0] == "input":
            shape = tuple(int(v) for v in w[1:])
            img = shape if len(shape) == 3 else None
            width = shape[0] if img is None else shape[0] * shape[1] * shape[2]
        elif w[0] in ("conv2d", "maxpool2d", "avgpool2d"):
            nums = [int(v) for v in w[1:3 if w[0] == "conv2d" else 2]]
            opt = {w[i]: int(w[i + 1]) for i in range(len(nums) + 1, len(w) - 1)
                   if w[i] in ("stride", "padding")}
            c, h, ww = img
            k = nums[-1]
            if w[0] == "conv2d":
                st, pd = opt.get("stride", 1), opt.get("padding", 0)
                mods.append(nn.Conv2d(c, nums[0], k, stride=st, padding=pd,
                                      bias="nobias" not in w))
                c = nums[0]
            else:
                st, pd = opt.get("stride", k), 0
                mods.append((nn.MaxPool2d if w[0] == "maxpool2d" else nn.AvgPool2d)(k, st))
            img = (c, window(h, k, st, pd), window(ww, k, st, pd))
            width = img[0] * img[1] * img[2]
        elif w[0] == "batchnorm":
            bn = nn.BatchNorm2d(img[0]) if img else nn.BatchNorm1d(width)
            n = img[0] if img else width
            with torch.no_grad():  # not the defaults, so that they matter
                bn.weight.add_(0.1 * torch.randn(n))
                bn.bias.add_(0.1 * torch.randn(n))
                bn.running_mean.add_(0.1 * torch.randn(n))
                bn.running_var.add_(0.2 * torch.rand(n))
                bn.num_batches_tracked.fill_(3)
            mods.append(bn)
        elif w[0] == "flatten":
            mods.append(nn.Flatten())
            img = None
        elif w[0] == "linear":
            n = int(w[1])
            mods.append(nn.Linear(width, n, bias=not (len(w) > 2 and w[2] == "nobias")))
            width = n
        elif w[0] == "layernorm":
            ln = nn.LayerNorm(width, eps=1e-5)
            with torch.no_grad():  # not the trivial 1 and 0, so that they matter
                ln.weight.add_(0.1 * torch.randn(width))
                ln.bias.add_(0.1 * torch.randn(width))
            mods.append(ln)
        elif w[0] == "gelu":
            mods.append(nn.GELU(approximate="tanh"))
        elif w[0] == "relu":
            mods.append(nn.ReLU())
        elif w[0] == "tanh":
            mods.append(nn.Tanh())
        elif w[0] == "sigmoid":
            mods.append(nn.Sigmoid())
        elif w[0] == "dropout":
            mods.append(nn.Dropout(float(w[1])))
        elif w[0] == "loss":
            loss = w[1]
        else:
            raise ValueError("unknown spec line %r" % line)
    return Seq(shape, mods), loss, width


def rel_diff(a, b):
    """max |a - b| / max |b| (b the reference)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# ---- the checks --------------------------------------------------------------------

def build_driver(bd, tmp):
    lib = os.path.join(bd, "libdp.a")
    if not os.path.exists(lib):
        print("safetensors_roundtrip: %s is missing: build first (ninja -f %s/build.ninja)"
              % (lib, bd))
        sys.exit(2)
    src, exe = os.path.join(tmp, "driver.c"), os.path.join(tmp, "driver")
    with open(src, "w") as f:
        f.write(DRIVER)
    cc = os.environ.get("CC", "cc").split()
    cmd = cc + ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror",
                "-I" + os.path.join(ROOT, "include"), src, lib, "-lm", "-pthread", "-o", exe]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print("safetensors_roundtrip: the driver does not build:\n  %s\n%s%s"
              % (" ".join(cmd), r.stdout, r.stderr))
        sys.exit(2)
    return exe


def run_driver(exe, tmp, spec_path, st_in, x_path, t_path, steps, tag):
    st_out = os.path.join(tmp, tag + "_out.safetensors")
    y_path = os.path.join(tmp, tag + "_y.bin")
    cmd = [exe, spec_path, st_in, x_path, t_path, str(ROWS), str(steps), repr(LR), st_out, y_path]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("driver failed (%d): %s%s" % (r.returncode, r.stdout, r.stderr))
    return st_out, np.fromfile(y_path, dtype="<f4")


def check_spec(name, spec, exe, tmp, seed):
    torch.manual_seed(seed)
    model, loss, out_w = sequential(spec)
    in_w = 1
    for v in model.shape:
        in_w *= v
    x = torch.randn(ROWS, in_w)
    if loss == "softmax_cross_entropy":
        t = torch.randint(0, out_w, (ROWS,))
        t_bytes = t.numpy().astype("<i4").tobytes()
        loss_fn = nn.CrossEntropyLoss()
    else:
        t = torch.randn(ROWS, out_w)
        t_bytes = t.numpy().astype("<f4").tobytes()
        loss_fn = nn.MSELoss()
    spec_path = os.path.join(tmp, name + ".dpm")
    x_path, t_path = os.path.join(tmp, name + "_x.bin"), os.path.join(tmp, name + "_t.bin")
    with open(spec_path, "w") as f:
        f.write(spec)
    with open(x_path, "wb") as f:
        f.write(x.numpy().astype("<f4").tobytes())
    with open(t_path, "wb") as f:
        f.write(t_bytes)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    st_in = os.path.join(tmp, name + "_torch.safetensors")
    save_st(init, st_in)
    results, ok = [], True

    def record(what, value, tol):
        nonlocal ok
        good = value <= tol
        ok = ok and good
        results.append("  %-44s %.3g (limit %.0e) %s" % (what, value, tol, "ok" if good else "FAIL"))

    # a. torch -> libdp: import, forward
    model.eval()
    with torch.no_grad():
        y_torch = model(x).numpy()
    st_back, y_dp = run_driver(exe, tmp, spec_path, st_in, x_path, t_path, 0, name + "_a")
    record("a. forward, libdp vs torch (rel)", rel_diff(y_dp.reshape(y_torch.shape), y_torch),
           FWD_TOL)
    back = load_st(st_back)
    same = set(back) == set(init) and all(torch.equal(back[k], init[k]) for k in init)
    ok = ok and same
    results.append("  %-44s %s" % ("a. libdp's export of the import == state_dict",
                                   "ok" if same else "FAIL (names %s vs %s)"
                                   % (sorted(back), sorted(init))))

    # b. libdp trains and exports; torch loads it strictly and runs the forward
    st_trained, y_dp = run_driver(exe, tmp, spec_path, st_in, x_path, t_path, STEPS, name + "_b")
    trained = load_st(st_trained)
    m2, _, _ = sequential(spec)
    m2.load_state_dict(trained, strict=True)
    m2.eval()
    with torch.no_grad():
        y2 = m2(x).numpy()
    moved = max(float((trained[k] - init[k]).abs().max()) for k in init)
    record("b. forward after %d libdp steps, torch vs libdp" % STEPS,
           rel_diff(y2, y_dp.reshape(y2.shape)), FWD_TOL)
    if moved == 0:
        ok = False
        results.append("  b. training changed no parameter: FAIL")

    # c. torch trains the same steps (no dropout: its masks are not libdp's; no
    # batchnorm: libdp normalises each device's micro-batch on its own, torch the batch)
    if "dropout" not in spec and "batchnorm" not in spec:
        model.train()
        model.load_state_dict(init)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        for _ in range(STEPS):
            opt.zero_grad()
            loss_fn(model(x), t).backward()
            opt.step()
        sd = model.state_dict()
        scale = max(1.0, max(float(v.abs().max()) for v in sd.values()))
        diff = max(float((trained[k] - sd[k]).abs().max()) for k in sd)
        record("c. params after %d steps, libdp vs torch (rel)" % STEPS, diff / scale,
               TRAIN_TOL)
    return ok, results, moved


def main():
    bd = sys.argv[1] if len(sys.argv) > 1 else "build"
    if len(sys.argv) > 2:
        print("usage: safetensors_roundtrip.py [BUILD_DIR]")
        return 2
    if not os.path.isabs(bd):
        bd = os.path.join(ROOT, bd)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="dp_st_torch_")
    try:
        exe = build_driver(bd, tmp)
        print("safetensors_roundtrip: torch %s, files %s, libdp from %s"
              % (torch.__version__,
                 "by the safetensors package" if st_torch else "by hand (json + struct; "
                 "the safetensors package is not importable)", os.path.relpath(bd, ROOT)))
        all_ok = True
        for i, (name, spec) in enumerate(SPECS):
            try:
                ok, lines, moved = check_spec(name, spec, exe, tmp, 1000 + i)
            except Exception as e:  # a driver or format failure: report it as one
                ok, lines, moved = False, ["  %s: %s" % (type(e).__name__, e)], 0.0
            all_ok = all_ok and ok
            print("%s: %s" % (name, " / ".join(l for l in spec.splitlines())))
            print("\n".join(lines))
        print("safetensors_roundtrip: %s" % ("all checks passed" if all_ok else "FAILED"))
        return 0 if all_ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
