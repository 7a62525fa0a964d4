/* `dp export --pytorch FILE.py`: the model as PyTorch source. A build()
 * function returns an nn.Module whose parameters and buffers have the names
 * and shapes of dp_model_tensor (each layer registered under its index, as
 * nn.Sequential names them), so load_state_dict(load_file(W), strict=True)
 * takes the exported weights, and whose forward is the spec's: residual
 * blocks add their input, a token model maps (B, T) ids to (B, T, V) logits,
 * an image model takes (B, C, H, W) or the flat rows libdp reads. */
#include "cli.h"
#include "data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char PRELUDE[] =
    "\"\"\"Written by dp export --pytorch: the libdp model below as a PyTorch module.\n"
    "\n"
    "    import torch, safetensors.torch\n"
    "    m = build()\n"
    "    m.load_state_dict(safetensors.torch.load_file('weights.safetensors'), "
    "strict=True)\n"
    "    loss = criterion()(m(x), target)  # the spec's loss and its options\n"
    "\"\"\"\n"
    "import torch\n"
    "import torch.nn as nn\n"
    "\n"
    "\n"
    "class Embed(nn.Module):\n"
    "    \"\"\"libdp's embed V D: token embedding plus learned position embedding.\"\"\"\n"
    "\n"
    "    def __init__(self, vocab, width, context):\n"
    "        super().__init__()\n"
    "        self.tok = nn.Embedding(vocab, width)\n"
    "        self.pos = nn.Embedding(context, width)\n"
    "\n"
    "    def forward(self, ids):\n"
    "        return self.tok(ids.long()) + self.pos.weight[: ids.shape[1]]\n"
    "\n"
    "\n"
    "class Attention(nn.Module):\n"
    "    \"\"\"libdp's attention H: causal self-attention of a fused (B, T, 3D) q, k, "
    "v.\"\"\"\n"
    "\n"
    "    def __init__(self, heads, dropout=0.0):\n"
    "        super().__init__()\n"
    "        self.heads = heads\n"
    "        self.dropout = nn.Dropout(dropout)  # on the probabilities, in training\n"
    "\n"
    "    def forward(self, x):\n"
    "        B, T, C3 = x.shape\n"
    "        D = C3 // 3\n"
    "        hd = D // self.heads\n"
    "        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in x.split(D, "
    "2))\n"
    "        a = (q @ k.transpose(-2, -1)) * (1.0 / hd ** 0.5)\n"
    "        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()\n"
    "        a = self.dropout(a.masked_fill(~mask, float('-inf')).softmax(-1))\n"
    "        return (a @ v).transpose(1, 2).reshape(B, T, D)\n"
    "\n"
    "\n"
    "class SeqBatchNorm(nn.BatchNorm1d):\n"
    "    \"\"\"libdp's batchnorm on a sequence: BatchNorm1d(D) over each position's D "
    "features,\n"
    "    (B, T, D) taken as the (B, D, T) that BatchNorm1d normalises per channel.\"\"\"\n"
    "\n"
    "    def forward(self, x):\n"
    "        return super().forward(x.transpose(1, 2)).transpose(1, 2)\n"
    "\n"
    "\n";

/* The constructor of layer i's module, or NULL when it has none (residual
 * views, a shortcut, an end: the forward does them). */
static int module_text(const dp_model *m, int i, const dp_layer_info *l, int *tensor,
                       char *buf, size_t cap) {
  dp_tensor_info w = {0};
  int nt = 0;
  char num[32], mom[32];
  if (l->n_params || l->tied) dp_model_tensor(m, *tensor, &w); /* tied: the table's */
  switch (l->kind) {
  case DP_LAYER_LINEAR:
    nt = l->bias ? 2 : 1;
    snprintf(buf, cap, "nn.Linear(%d, %d, bias=%s)", w.dims[1], w.dims[0],
             l->bias ? "True" : "False");
    break;
  case DP_LAYER_CONV2D:
    nt = l->bias ? 2 : 1;
    snprintf(buf, cap, "nn.Conv2d(%d, %d, %d, stride=%d, padding=%d, bias=%s)", w.dims[1],
             w.dims[0], l->kernel, l->stride, l->padding, l->bias ? "True" : "False");
    break;
  case DP_LAYER_LAYERNORM:
    nt = 2;
    snprintf(buf, cap, "nn.LayerNorm(%d, eps=%s)", w.dims[0],
             dpt_float_text(l->eps, num, sizeof num));
    break;
  case DP_LAYER_BATCHNORM:
    nt = 2;
    if (l->momentum == DP_BN_MOMENTUM_NONE)
      snprintf(mom, sizeof mom, "None");
    else
      dpt_float_text(l->momentum, mom, sizeof mom);
    snprintf(buf, cap, "%s(%d, eps=%s, momentum=%s)",
             l->positions ? "SeqBatchNorm"
             : l->height  ? "nn.BatchNorm2d"
                          : "nn.BatchNorm1d",
             w.dims[0], dpt_float_text(l->eps, num, sizeof num), mom);
    break;
  case DP_LAYER_EMBEDDING:
    nt = 2;
    snprintf(buf, cap, "Embed(%d, %d, %d)", l->vocab, l->channels, l->positions);
    break;
  case DP_LAYER_RELU: snprintf(buf, cap, "nn.ReLU()"); break;
  case DP_LAYER_GELU: snprintf(buf, cap, "nn.GELU(approximate='tanh')"); break;
  case DP_LAYER_GELU_ERF: snprintf(buf, cap, "nn.GELU()"); break; /* approximate='none' */
  case DP_LAYER_SILU: snprintf(buf, cap, "nn.SiLU()"); break;
  case DP_LAYER_LEAKY_RELU:
    snprintf(buf, cap, "nn.LeakyReLU(negative_slope=%s)",
             dpt_float_text(l->negative_slope, num, sizeof num));
    break;
  case DP_LAYER_TANH: snprintf(buf, cap, "nn.Tanh()"); break;
  case DP_LAYER_SIGMOID: snprintf(buf, cap, "nn.Sigmoid()"); break;
  case DP_LAYER_DROPOUT: snprintf(buf, cap, "nn.Dropout(%.9g)", (double)l->p); break;
  case DP_LAYER_FLATTEN: snprintf(buf, cap, "nn.Flatten()"); break;
  case DP_LAYER_MAXPOOL2D:
  case DP_LAYER_AVGPOOL2D: {
    /* padding and count_include_pad only when set: older exports keep their text */
    char pad[24] = "";
    if (l->padding) snprintf(pad, sizeof pad, ", padding=%d", l->padding);
    snprintf(buf, cap, "nn.%s(%d, stride=%d%s%s)",
             l->kind == DP_LAYER_MAXPOOL2D ? "MaxPool2d" : "AvgPool2d", l->kernel,
             l->stride, pad, l->exclude_pad ? ", count_include_pad=False" : "");
    break;
  }
  case DP_LAYER_ATTENTION:
    if (l->p > 0.0f)
      snprintf(buf, cap, "Attention(%d, dropout=%.9g)", l->heads, (double)l->p);
    else
      snprintf(buf, cap, "Attention(%d)", l->heads);
    break;
  default: (void)i; return 0; /* residual, shortcut, end, input */
  }
  *tensor += nt;
  return 1;
}

/* The input line of the spec: "input N", "input C H W" or "input tokens T". */
static void input_line(const dp_model *m, char *buf, size_t cap) {
  dp_model_format(m, buf, cap); /* truncated: the first line is all it needs */
  buf[strcspn(buf, "\n")] = '\0';
}

/* The shortcut of the residual block that starts at layer r, or -1. */
static int block_shortcut(const dp_model *m, int r) {
  dp_layer_info l;
  for (int i = r + 1; i < dp_model_n_layers(m); i++)
    if (!dp_model_layer(m, i, &l) && l.kind == DP_LAYER_SHORTCUT && l.link == r) return i;
  return -1;
}

static void write_forward(FILE *f, const dp_model *m, int standardize) {
  char in[128];
  int c = 0, h = 0, w = 0;
  input_line(m, in, sizeof in);
  fprintf(f, "    def forward(self, x):\n        m = self._modules\n");
  if (standardize) fprintf(f, "        x = standardize(x, self.dp_mean, self.dp_std)\n");
  if (sscanf(in, "input %d %d %d", &c, &h, &w) == 3)
    fprintf(f,
            "        if x.dim() == 2:  # libdp's flat rows\n"
            "            x = x.view(-1, %d, %d, %d)\n",
            c, h, w);
  for (int i = 0; i < dp_model_n_layers(m); i++) {
    dp_layer_info l;
    dp_model_layer(m, i, &l);
    int sc = l.kind == DP_LAYER_RESIDUAL       ? block_shortcut(m, i)
             : l.kind == DP_LAYER_RESIDUAL_END ? block_shortcut(m, l.link)
                                               : -1;
    if (l.kind == DP_LAYER_RESIDUAL && sc >= 0)
      fprintf(f,
              "        r%d = x  # residual: f(x) + g(x) up to layer %d, g from layer %d\n",
              i, l.link, sc);
    else if (l.kind == DP_LAYER_RESIDUAL)
      fprintf(f, "        r%d = x  # residual: x + f(x) up to layer %d\n", i, l.link);
    else if (l.kind == DP_LAYER_SHORTCUT) /* f's output kept, g on the block's input */
      fprintf(f, "        s%d = x  # f(x)\n        x = r%d\n", i, l.link);
    else if (l.kind == DP_LAYER_RESIDUAL_END && sc >= 0)
      fprintf(f, "        x = s%d + x\n", sc);
    else if (l.kind == DP_LAYER_RESIDUAL_END)
      fprintf(f, "        x = r%d + x\n", l.link);
    else
      fprintf(f, "        x = m['%d'](x)\n", i);
  }
  fprintf(f, "        return x\n");
}

/* A Python list of the doubles v[0..n), each the shortest decimal that reads
 * back as the same double, always with a point or an exponent (-0.0 stays a
 * float, and negative). */
static void py_list(FILE *f, const char *name, const double *v, int n) {
  fprintf(f, "%s = [", name);
  for (int j = 0; j < n; j++) {
    char b[40];
    for (int prec = 1; prec <= 17; prec++) {
      snprintf(b, sizeof b, "%.*g", prec, v[j]);
      if (strtod(b, NULL) == v[j]) break;
    }
    if (!strpbrk(b, ".e")) strcat(b, ".0");
    fprintf(f, "%s%s", j == 0 ? "" : j % 6 ? ", " : ",\n    ", b);
  }
  fputs("]\n", f);
}

/* dp train's standardisation: its values and the function that applies them
 * as dp predict does (in double, saturated to float's range). */
static void write_standardize(FILE *f, const dpt_scaler *sc) {
  fprintf(f,
          "# dp train's standardisation (--standardize %s): the module takes raw rows,\n"
          "# as dp predict does, and its first step is (x - MEAN) / STD per %s.\n"
          "STANDARDIZE = \"%s\"\n",
          dpt_scaler_mode(sc),
          sc->per_channel ? "input channel (over its H*W values)" : "feature",
          dpt_scaler_mode(sc));
  py_list(f, "MEAN", sc->mean, sc->n);
  py_list(f, "STD", sc->std, sc->n);
  fputs("\n\ndef standardize(x, mean, std):\n"
        "    \"\"\"(x - mean) / std per feature or channel, as dp predict computes it: in\n"
        "    double, saturated to float32's range, then rounded to float32.\"\"\"\n"
        "    big = torch.finfo(torch.float32).max\n"
        "    z = x.reshape(x.shape[0], mean.numel(), -1).double()\n"
        "    z = ((z - mean[:, None]) / std[:, None]).clamp(-big, big)\n"
        "    return z.float().reshape(x.shape)\n\n\n",
        f);
}

/* criterion(): the spec's loss as PyTorch's module, reduction 'mean', with the
 * cross-entropy's options (weight, ignore_index, label_smoothing) or
 * bce_with_logits' pos_weight; a sequence's
 * logits (B, T, V) and labels (B, T) flattened to (B T, V) and (B T). */

static void write_criterion(FILE *f, const dp_model *m) {
  dp_loss_kind k = dp_model_loss(m);
  if (k == DP_LOSS_NONE) return;
  fputs("\n\ndef criterion():\n    \"\"\"The spec's loss, as dp train computes it.\"\"\"\n",
        f);
  char num[32];
  dp_bce_options b;
  dp_model_bce_options(m, &b);
  if (b.n_pos_weights) {
    fputs("    return nn.BCEWithLogitsLoss(pos_weight=torch.tensor([", f);
    for (int i = 0; i < b.n_pos_weights; i++)
      fprintf(f, "%s%s", i ? ", " : "", dpt_float_text(b.pos_weights[i], num, sizeof num));
    fputs("], dtype=torch.float32))\n", f); /* whole weights read "2": an int64 tensor */
    return;
  }
  if (k != DP_LOSS_SOFTMAX_CE) {
    float v = dp_model_loss_param(m);
    if (k == DP_LOSS_SMOOTH_L1 || k == DP_LOSS_HUBER)
      fprintf(f, "    return nn.%s(%s=%s)\n",
              k == DP_LOSS_HUBER ? "HuberLoss" : "SmoothL1Loss",
              k == DP_LOSS_HUBER ? "delta" : "beta", dpt_float_text(v, num, sizeof num));
    else
      fprintf(f, "    return nn.%s()\n",
              k == DP_LOSS_L1           ? "L1Loss"
              : k == DP_LOSS_BCE_LOGITS ? "BCEWithLogitsLoss"
                                        : "MSELoss");
    return;
  }
  dp_ce_options o;
  dp_model_ce_options(m, &o);
  int V = dp_model_output_width(m) / dp_model_positions(m);
  fputs("    ce = nn.CrossEntropyLoss(", f);
  const char *sep = "";
  if (o.n_weights) {
    fputs("weight=torch.tensor([", f);
    for (int i = 0; i < o.n_weights; i++) {
      fprintf(f, "%s%s", i ? ", " : "", dpt_float_text(o.weights[i], num, sizeof num));
    }
    fputs("], dtype=torch.float32)", f); /* whole weights read "2": an int64 tensor */
    sep = ", ";
  }
  if (o.has_ignore_index)
    fprintf(f, "%signore_index=%d", sep, (int)o.ignore_index), sep = ", ";
  if (o.label_smoothing > 0.0f)
    fprintf(f, "%slabel_smoothing=%s", sep,
            dpt_float_text(o.label_smoothing, num, sizeof num));
  fprintf(f,
          ")\n    return lambda out, target: ce(out.reshape(-1, %d), "
          "target.reshape(-1).long())\n",
          V);
}

int dpt_write_pytorch(const dp_model *m, const dpt_scaler *sc, FILE *f) {
  int standardize = sc && sc->n > 0;
  fputs(PRELUDE, f);
  if (standardize) write_standardize(f, sc);
  size_t n = dp_model_format(m, NULL, 0);
  char *spec = malloc(n + 1);
  if (!spec) return -1;
  dp_model_format(m, spec, n + 1);
  fputs("SPEC = \"\"\"\\\n", f);
  fputs(spec, f);
  free(spec);
  fputs("\"\"\"\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n",
        f);
  if (standardize) /* not in the state_dict: strict loading takes the weights alone */
    fputs(
        "        self.register_buffer('dp_mean', torch.tensor(MEAN, dtype=torch.float64),\n"
        "                             persistent=False)\n"
        "        self.register_buffer('dp_std', torch.tensor(STD, dtype=torch.float64),\n"
        "                             persistent=False)\n",
        f);
  int tensor = 0;
  for (int i = 0; i < dp_model_n_layers(m); i++) {
    dp_layer_info l;
    char ctor[160];
    dp_model_layer(m, i, &l);
    if (module_text(m, i, &l, &tensor, ctor, sizeof ctor))
      fprintf(f, "        self.add_module('%d', %s)\n", i, ctor);
    if (l.kind == DP_LAYER_LINEAR && l.tied) /* one Parameter, two state_dict names */
      fprintf(f, "        self._modules['%d'].weight = self._modules['0'].tok.weight\n", i);
  }
  fputc('\n', f);
  write_forward(f, m, standardize);
  fputs("\n\ndef build():\n    return Model()\n", f);
  write_criterion(f, m);
  return ferror(f) ? -1 : 0;
}
