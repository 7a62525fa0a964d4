/* The model: an ordered list of layers with inferred widths and a flat
 * parameter layout in PyTorch state_dict order. Shapes only; no memory. */
#include "model/model.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The one name table of each of the model's enums: the spec words. */
static const char *const layer_names[] = {
    [DP_LAYER_INPUT] = "input",         [DP_LAYER_LINEAR] = "linear",
    [DP_LAYER_RELU] = "relu",           [DP_LAYER_GELU] = "gelu",
    [DP_LAYER_TANH] = "tanh",           [DP_LAYER_SIGMOID] = "sigmoid",
    [DP_LAYER_LAYERNORM] = "layernorm", [DP_LAYER_DROPOUT] = "dropout",
    [DP_LAYER_CONV2D] = "conv2d",       [DP_LAYER_MAXPOOL2D] = "maxpool2d",
    [DP_LAYER_AVGPOOL2D] = "avgpool2d", [DP_LAYER_FLATTEN] = "flatten",
    [DP_LAYER_BATCHNORM] = "batchnorm", [DP_LAYER_EMBEDDING] = "embed",
    [DP_LAYER_ATTENTION] = "attention", [DP_LAYER_RESIDUAL] = "residual",
    [DP_LAYER_RESIDUAL_END] = "end",    [DP_LAYER_GELU_ERF] = "gelu_erf",
    [DP_LAYER_SILU] = "silu",           [DP_LAYER_LEAKY_RELU] = "leaky_relu",
    [DP_LAYER_SHORTCUT] = "shortcut",
};
static const char *const loss_names[] = {
    [DP_LOSS_NONE] = "none",
    [DP_LOSS_MSE] = "mse",
    [DP_LOSS_SOFTMAX_CE] = "softmax_cross_entropy",
    [DP_LOSS_L1] = "l1",
    [DP_LOSS_SMOOTH_L1] = "smooth_l1",
    [DP_LOSS_HUBER] = "huber",
    [DP_LOSS_BCE_LOGITS] = "bce_with_logits",
};

const char *dp_layer_kind_name(dp_layer_kind k) {
  return (unsigned)k < sizeof layer_names / sizeof *layer_names ? layer_names[k] : "?";
}

const char *dp_loss_name(dp_loss_kind l) {
  return (unsigned)l < sizeof loss_names / sizeof *loss_names ? loss_names[l] : "?";
}

/* The internal spelling, kept for the library's own callers. */

bool dp__layer_needs_input(const dp_layer *l) {
  dp_layer_kind k = l->kind;
  /* a negative slope: the output's sign is not the input's */
  if (k == DP_LAYER_LEAKY_RELU) return l->slope < 0.0f;
  return k == DP_LAYER_LINEAR || k == DP_LAYER_GELU || k == DP_LAYER_GELU_ERF ||
         k == DP_LAYER_SILU || k == DP_LAYER_LAYERNORM || k == DP_LAYER_CONV2D ||
         k == DP_LAYER_MAXPOOL2D || /* maxpool: where the max was */
         k == DP_LAYER_BATCHNORM || k == DP_LAYER_EMBEDDING /* the ids */ ||
         k == DP_LAYER_ATTENTION /* q, k, v */;
}

bool dp__layer_needs_output(const dp_layer *l) {
  dp_layer_kind k = l->kind;
  return k == DP_LAYER_RELU || k == DP_LAYER_TANH || k == DP_LAYER_SIGMOID ||
         (k == DP_LAYER_LEAKY_RELU && l->slope >= 0.0f);
}

int dp__layer_stats_width(const dp_layer *l) {
  if (l->kind == DP_LAYER_LAYERNORM) return 2 * dp__positions(l);
  if (l->kind != DP_LAYER_ATTENTION) return 0;
  size_t n = (size_t)l->heads * (size_t)l->t * (size_t)l->t;
  return n > DP_MAX_WIDTH ? 0 : (int)n;
}

int dp__act_owner(const dp_model *m, int i) {
  /* a shortcut views its block's input: the residual's, followed back */
  while (i >= 0 && dp__layer_is_view(m, i))
    i = m->layers[i].kind == DP_LAYER_SHORTCUT ? m->layers[i].link : i - 1;
  return i;
}

int dp__grad_owner(const dp_model *m, int i) {
  while (i >= 0 && dp__layer_is_view(m, i) && m->layers[i].kind != DP_LAYER_SHORTCUT) i--;
  return i;
}

int dp__block_shortcut(const dp_model *m, int r) {
  int e = m->layers[r].link;
  for (int i = r + 1; i < (e < 0 ? m->n_layers : e); i++)
    if (m->layers[i].kind == DP_LAYER_SHORTCUT && m->layers[i].link == r) return i;
  return -1;
}

int dp__skip_owner(const dp_model *m, int k) {
  int s = dp__block_shortcut(m, m->layers[k].link);
  return dp__act_owner(m, s >= 0 ? s - 1 : m->layers[k].link);
}

int dp__layer_fan_in(const dp_layer *l) {
  return l->kind == DP_LAYER_CONV2D ? l->ic * l->k * l->k : dp__pos_in(l);
}

dp_status dp_model_new(int input_width, dp_model **out) {
  if (!out) return DP_FAIL(DP_ERR_INVALID, "dp_model_new: out is NULL");
  *out = NULL;
  if (input_width <= 0)
    return DP_FAIL(DP_ERR_INVALID, "input width must be positive, got %d", input_width);
  dp_model *m = calloc(1, sizeof *m);
  if (!m) return DP_FAIL(DP_ERR_NOMEM, "dp_model_new: out of memory");
  m->input_width = input_width;
  m->input_c = input_width;
  *out = m;
  return DP_OK;
}

dp_status dp_model_new_image(int channels, int height, int width, dp_model **out) {
  if (!out) return DP_FAIL(DP_ERR_INVALID, "dp_model_new_image: out is NULL");
  *out = NULL;
  if (channels <= 0 || height <= 0 || width <= 0)
    return DP_FAIL(DP_ERR_INVALID, "image input must be positive, got %d x %d x %d",
                   channels, height, width);
  size_t n;
  if (!dp__mul((size_t)channels * (size_t)height, (size_t)width, &n) || n > DP_MAX_WIDTH)
    return DP_FAIL(DP_ERR_INVALID,
                   "image input %d x %d x %d: %s floats per row is too many", channels,
                   height, width, "more than 2^31 - 1");
  dp_status s = dp_model_new((int)n, out);
  if (s) return s;
  (*out)->input_c = channels;
  (*out)->input_h = height;
  (*out)->input_w = width;
  return DP_OK;
}

void dp_model_free(dp_model *m) { free(m); }

static int cur_width(const dp_model *m) {
  return m->n_layers ? m->layers[m->n_layers - 1].out : m->input_width;
}

/* The current output's positions (0: not a sequence; the token input's ids are
 * not one yet: the embedding makes it). */
static int cur_t(const dp_model *m) {
  return m->n_layers ? m->layers[m->n_layers - 1].t : 0;
}

/* The current output shape (h == 0: flat). */
static void cur_shape(const dp_model *m, int *c, int *h, int *w) {
  if (m->n_layers) {
    const dp_layer *l = &m->layers[m->n_layers - 1];
    *c = l->c, *h = l->h, *w = l->w;
  } else {
    *c = m->input_c, *h = m->input_h, *w = m->input_w;
  }
}

/* Appends a layer with n_params parameters; refuses after the loss. Shapes:
 * the input's is the current one; a layer that keeps it (elementwise ones)
 * leaves c/h/w 0 and gets it here. */
static dp_status push(dp_model *m, dp_layer l) {
  if (m->loss != DP_LOSS_NONE)
    return DP_FAIL(DP_ERR_INVALID, "no layer may follow the loss");
  if (m->input_t && m->n_layers == 0 && l.kind != DP_LAYER_EMBEDDING)
    return DP_FAIL(DP_ERR_INVALID,
                   "a token input (input tokens T) must be followed by 'embed V D', not %s",
                   dp_layer_kind_name(l.kind));
  cur_shape(m, &l.ic, &l.ih, &l.iw);
  if (l.kind != DP_LAYER_FLATTEN && l.kind != DP_LAYER_EMBEDDING) l.t = cur_t(m);
  if (l.c == 0) l.c = l.ih || l.t ? l.ic : l.out, l.h = l.ih, l.w = l.iw;
  if (m->n_layers >= DP_MAX_LAYERS)
    return DP_FAIL(DP_ERR_INVALID, "too many layers (at most %d)", DP_MAX_LAYERS);
  size_t total;
  if (!dp__add(m->n_params, l.n_params, &total))
    return DP_FAIL(DP_ERR_OVERFLOW, "parameter count overflows size_t");
  l.param_off = m->n_params;
  m->n_params = total;
  if (l.kind == DP_LAYER_BATCHNORM) {
    l.buf_off = m->n_buffers;
    m->n_buffers += dp__bn_buffers(l.c);
  }
  m->layers[m->n_layers++] = l;
  return DP_OK;
}

/* A layer that needs a flat input (PyTorch's nn.Linear and nn.LayerNorm act on
 * the last dimension of an image, which is not what a flat width means). */
static dp_status need_flat(const dp_model *m, const char *what) {
  int c, h, w;
  cur_shape(m, &c, &h, &w);
  if (h)
    return DP_FAIL(
        DP_ERR_INVALID,
        "%s needs a flat input, but the input here is an image %d x %d x %d: add "
        "flatten first",
        what, c, h, w);
  return DP_OK;
}

static dp_status need_image(const dp_model *m, const char *what) {
  int c, h, w;
  cur_shape(m, &c, &h, &w);
  if (!h && cur_t(m))
    return DP_FAIL(DP_ERR_INVALID,
                   "%s needs an image input, but the input here is a "
                   "sequence (%d positions of %d)",
                   what, cur_t(m), c);
  if (!h)
    return DP_FAIL(DP_ERR_INVALID,
                   "%s needs an image input (input C H W, then conv2d or pools), but the "
                   "input here is flat (%d)",
                   what, c);
  return DP_OK;
}

/* The output size of a window over n (padding pad each side), or 0 when the
 * window does not fit. */
static int window_out(int n, int k, int stride, int pad) {
  long long span = (long long)n + 2LL * pad - k;
  return span < 0 ? 0 : (int)(span / stride + 1);
}

dp_status dp_model_add_conv2d(dp_model *m, int out_channels, int kernel, int stride,
                              int padding, int bias) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  dp_status s = need_image(m, "conv2d");
  if (s) return s;
  if (stride == 0) stride = 1;
  if (out_channels <= 0 || kernel <= 0 || stride < 0 || padding < 0 || kernel > 4096 ||
      stride > 4096 || padding > 4096)
    return DP_FAIL(DP_ERR_INVALID,
                   "conv2d: channels, kernel and stride must be positive and padding >= 0 "
                   "(at most 4096), got %d, %d, %d, %d",
                   out_channels, kernel, stride, padding);
  int c, h, w;
  cur_shape(m, &c, &h, &w);
  int oh = window_out(h, kernel, stride, padding),
      ow = window_out(w, kernel, stride, padding);
  if (oh == 0 || ow == 0)
    return DP_FAIL(
        DP_ERR_INVALID,
        "conv2d: a %d x %d kernel with padding %d does not fit the %d x %d input", kernel,
        kernel, padding, h, w);
  size_t ckk, wn, outw;
  if (!dp__mul((size_t)c, (size_t)kernel * (size_t)kernel, &ckk) ||
      !dp__mul(ckk, (size_t)out_channels, &wn) ||
      !dp__mul((size_t)out_channels * (size_t)oh, (size_t)ow, &outw) ||
      outw > DP_MAX_WIDTH || ckk > DP_MAX_WIDTH)
    return DP_FAIL(DP_ERR_OVERFLOW, "conv2d %d -> %d, kernel %d: sizes overflow", c,
                   out_channels, kernel);
  dp_layer l = {.kind = DP_LAYER_CONV2D,
                .in = cur_width(m),
                .out = (int)outw,
                .bias = bias ? 1 : 0,
                .n_params = wn + (bias ? (size_t)out_channels : 0),
                .c = out_channels,
                .h = oh,
                .w = ow,
                .k = kernel,
                .stride = stride,
                .pad = padding};
  return push(m, l);
}

dp_status dp_model_add_pool2d(dp_model *m, dp_layer_kind kind, int kernel, int stride) {
  return dp_model_add_pool2d_padded(m, kind, kernel, stride, 0, 0);
}

dp_status dp_model_add_pool2d_padded(dp_model *m, dp_layer_kind kind, int kernel,
                                     int stride, int padding, int exclude_pad) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  if (kind != DP_LAYER_MAXPOOL2D && kind != DP_LAYER_AVGPOOL2D)
    return DP_FAIL(DP_ERR_INVALID, "dp_model_add_pool2d takes maxpool2d or avgpool2d");
  const char *what = dp_layer_kind_name(kind);
  dp_status s = need_image(m, what);
  if (s) return s;
  if (stride == 0) stride = kernel;
  if (kernel <= 0 || stride <= 0 || kernel > 4096 || stride > 4096)
    return DP_FAIL(DP_ERR_INVALID, "%s: kernel and stride must be 1..4096, got %d and %d",
                   what, kernel, stride);
  /* PyTorch's rule: with more, a window could hold padding only */
  if (padding < 0 || padding > kernel / 2)
    return DP_FAIL(DP_ERR_INVALID,
                   "%s: padding must be in 0..%d (at most half the kernel %d, as PyTorch "
                   "requires), got %d",
                   what, kernel / 2, kernel, padding);
  if (exclude_pad && kind != DP_LAYER_AVGPOOL2D)
    return DP_FAIL(DP_ERR_INVALID,
                   "%s: exclude_pad is avgpool2d's (count_include_pad=False)", what);
  int c, h, w;
  cur_shape(m, &c, &h, &w);
  int oh = window_out(h, kernel, stride, padding),
      ow = window_out(w, kernel, stride, padding);
  if (oh == 0 || ow == 0) {
    if (padding)
      return DP_FAIL(DP_ERR_INVALID,
                     "%s: a %d x %d window with padding %d does not fit the %d x %d input",
                     what, kernel, kernel, padding, h, w);
    return DP_FAIL(DP_ERR_INVALID, "%s: a %d x %d window does not fit the %d x %d input",
                   what, kernel, kernel, h, w);
  }
  dp_layer l = {.kind = kind,
                .in = cur_width(m),
                .out = c * oh * ow,
                .c = c,
                .h = oh,
                .w = ow,
                .k = kernel,
                .stride = stride,
                .pad = padding,
                .exclude_pad = exclude_pad ? 1 : 0};
  return push(m, l);
}

dp_status dp_model_add_linear(dp_model *m, int out_width, int bias) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  dp_status fs = need_flat(m, "linear");
  if (fs) return fs;
  if (out_width <= 0)
    return DP_FAIL(DP_ERR_INVALID, "linear width must be positive, got %d", out_width);
  /* on a sequence, the same weights at every position: (out, in) per position */
  int t = cur_t(m), in = t ? cur_width(m) / t : cur_width(m);
  size_t w, rw;
  if (!dp__mul((size_t)out_width, (size_t)(t ? t : 1), &rw) || rw > DP_MAX_WIDTH)
    return DP_FAIL(DP_ERR_OVERFLOW, "linear %d on %d positions: %s", out_width, t,
                   "more than 2^31 - 1 floats per row");
  dp_layer l = {
      .kind = DP_LAYER_LINEAR, .in = cur_width(m), .out = (int)rw, .bias = bias ? 1 : 0};
  if (t) l.c = out_width;
  if (!dp__mul((size_t)in, (size_t)out_width, &w) ||
      !dp__add(w, l.bias ? (size_t)out_width : 0, &l.n_params))
    return DP_FAIL(DP_ERR_OVERFLOW, "linear %d x %d: parameter count overflows size_t",
                   out_width, in);
  return push(m, l);
}

dp_status dp_model_add_linear_tied(dp_model *m, int out_width) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  int t = cur_t(m);
  dp_layer *e = m->n_layers ? &m->layers[0] : NULL;
  if (!t || !e || e->kind != DP_LAYER_EMBEDDING)
    return DP_FAIL(DP_ERR_INVALID, "a tied linear shares the token embedding's weight: it "
                                   "needs a sequence model (input tokens T, embed V D)");
  if (e->tied)
    return DP_FAIL(DP_ERR_INVALID, "the token embedding is tied to a linear already");
  int in = cur_width(m) / t;
  if (out_width != e->vocab || in != e->c)
    return DP_FAIL(DP_ERR_INVALID,
                   "a tied linear maps width %d to the vocabulary %d, as the embedding's "
                   "(%d, %d) table does; here it would be %d to %d",
                   e->c, e->vocab, e->vocab, e->c, in, out_width);
  size_t rw; /* V logits per position: as an untied linear, at most 2^31 - 1 a row */
  if (!dp__mul((size_t)out_width, (size_t)t, &rw) || rw > DP_MAX_WIDTH)
    return DP_FAIL(DP_ERR_OVERFLOW, "linear %d tied on %d positions: %s", out_width, t,
                   "more than 2^31 - 1 floats per row");
  dp_layer l = {.kind = DP_LAYER_LINEAR,
                .in = cur_width(m),
                .out = (int)rw,
                .c = out_width,
                .tied = 1};
  dp_status s = push(m, l);
  if (s) return s;
  /* its weight is the table: no parameters of its own */
  m->layers[m->n_layers - 1].param_off = e->param_off;
  e->tied = 1;
  return DP_OK;
}

dp_status dp_model_add(dp_model *m, dp_layer_kind kind) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  if (kind != DP_LAYER_RELU && kind != DP_LAYER_GELU && kind != DP_LAYER_GELU_ERF &&
      kind != DP_LAYER_TANH && kind != DP_LAYER_SIGMOID && kind != DP_LAYER_LAYERNORM &&
      kind != DP_LAYER_FLATTEN && kind != DP_LAYER_BATCHNORM && kind != DP_LAYER_SILU &&
      kind != DP_LAYER_LEAKY_RELU)
    return DP_FAIL(
        DP_ERR_INVALID,
        "dp_model_add takes relu, gelu, gelu_erf, tanh, sigmoid, silu, leaky_relu, "
        "layernorm, flatten or batchnorm (use "
        "dp_model_add_linear/_dropout/_conv2d/_pool2d)");
  if (kind == DP_LAYER_LAYERNORM) {
    dp_status fs = need_flat(m, "layernorm");
    if (fs) return fs;
  }
  int w = cur_width(m);
  dp_layer l = {.kind = kind, .in = w, .out = w, .eps = DP_NORM_EPS, .momentum = 0.1};
  if (kind == DP_LAYER_LEAKY_RELU) l.slope = DP_LEAKY_SLOPE;
  if (kind == DP_LAYER_FLATTEN) l.c = w; /* flat from here on (h = w = 0) */
  if (kind == DP_LAYER_LAYERNORM)        /* over each position's features */
    l.n_params = 2 * (size_t)(cur_t(m) ? w / cur_t(m) : w);
  /* 1d over the features, 2d over the channels; on a sequence over each
   * position's features (dp__bn_rows) */
  if (kind == DP_LAYER_BATCHNORM) {
    int c, h, ww;
    cur_shape(m, &c, &h, &ww);
    l.n_params = 2 * (size_t)c;
    l.c = c, l.h = h, l.w = ww;
  }
  return push(m, l);
}

static dp_status check_eps(float eps, const char *what) {
  if (!(eps > 0.0f && eps <= 1.0f))
    return DP_FAIL(DP_ERR_INVALID, "%s: eps must be in (0, 1], got %g", what, (double)eps);
  return DP_OK;
}

dp_status dp_model_add_layernorm(dp_model *m, float eps) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  dp_status s = check_eps(eps, "layernorm");
  if (s || (s = dp_model_add(m, DP_LAYER_LAYERNORM))) return s;
  m->layers[m->n_layers - 1].eps = eps;
  return DP_OK;
}

dp_status dp_model_add_batchnorm(dp_model *m, float eps, float momentum) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  dp_status s = check_eps(eps, "batchnorm");
  if (s) return s;
  if (!(momentum >= 0.0f && momentum <= 1.0f) && momentum != DP_BN_MOMENTUM_NONE)
    return DP_FAIL(
        DP_ERR_INVALID,
        "batchnorm: momentum must be in [0, 1] or DP_BN_MOMENTUM_NONE (PyTorch's "
        "momentum=None), got %g",
        (double)momentum);
  if ((s = dp_model_add(m, DP_LAYER_BATCHNORM))) return s;
  dp_layer *l = &m->layers[m->n_layers - 1];
  l->eps = eps;
  /* the decimal a script writes, as a double (PyTorch's Python float): 0.01f
   * is 0.0099999998, and the running statistics would drift by its error */
  char num[32];
  l->momentum = momentum == DP_BN_MOMENTUM_NONE
                    ? DP_BN_CUMULATIVE
                    : strtod(dp__shortest_float(momentum + 0.0f, num, sizeof num), NULL);
  return DP_OK;
}

dp_status dp_model_add_leaky_relu(dp_model *m, float negative_slope) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  if (!(negative_slope >= -FLT_MAX && negative_slope <= FLT_MAX))
    return DP_FAIL(DP_ERR_INVALID, "leaky_relu: negative_slope must be finite, got %g",
                   (double)negative_slope);
  dp_status s = dp_model_add(m, DP_LAYER_LEAKY_RELU);
  if (s) return s;
  m->layers[m->n_layers - 1].slope = negative_slope + 0.0f; /* -0: 0, one spelling */
  return DP_OK;
}

dp_status dp_model_add_dropout(dp_model *m, float p) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  if (!(p >= 0.0f && p < 1.0f))
    return DP_FAIL(DP_ERR_INVALID, "dropout probability must be in [0, 1), got %g", p);
  int w = cur_width(m);
  return push(m, (dp_layer){.kind = DP_LAYER_DROPOUT, .in = w, .out = w, .p = p});
}

/* ---- sequences ---------------------------------------------------------------- */

dp_status dp_model_new_tokens(int context, dp_model **out) {
  if (out) *out = NULL;
  if (context <= 0 || context > 65536)
    return DP_FAIL(DP_ERR_INVALID, "input tokens: the context must be 1..65536, got %d",
                   context);
  dp_status s = dp_model_new(context, out);
  if (!s) (*out)->input_t = context;
  return s;
}

dp_status dp_model_add_embedding(dp_model *m, int vocab, int width) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  if (!m->input_t || m->n_layers)
    return DP_FAIL(DP_ERR_INVALID, "embed must come right after 'input tokens T' (it "
                                   "reads token ids)");
  if (vocab <= 0 || vocab > (1 << 24) || width <= 0)
    return DP_FAIL(DP_ERR_INVALID,
                   "embed: the vocabulary must be 1..16777216 (ids are floats) and the "
                   "width positive, got %d and %d",
                   vocab, width);
  int t = m->input_t;
  size_t rw, nv, nt;
  if (!dp__mul((size_t)t, (size_t)width, &rw) || rw > DP_MAX_WIDTH ||
      !dp__mul((size_t)vocab, (size_t)width, &nv) ||
      !dp__mul((size_t)t, (size_t)width, &nt))
    return DP_FAIL(DP_ERR_OVERFLOW, "embed %d x %d on %d positions: sizes overflow", vocab,
                   width, t);
  dp_layer l = {.kind = DP_LAYER_EMBEDDING,
                .in = t,
                .out = (int)rw,
                .c = width,
                .t = t,
                .vocab = vocab,
                .n_params = nv + nt};
  return push(m, l);
}

dp_status dp_model_add_attention(dp_model *m, int heads) {
  return dp_model_add_attention_dropout(m, heads, 0.0f);
}

dp_status dp_model_add_attention_dropout(dp_model *m, int heads, float p) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  if (!(p >= 0.0f && p < 1.0f))
    return DP_FAIL(DP_ERR_INVALID, "attention dropout must be in [0, 1), got %g",
                   (double)p);
  int t = cur_t(m), w = cur_width(m);
  if (!t)
    return DP_FAIL(DP_ERR_INVALID, "attention needs a sequence (input tokens T, embed V "
                                   "D, then a linear to 3 D)");
  int c3 = w / t;
  if (heads <= 0)
    return DP_FAIL(DP_ERR_INVALID, "attention %d: the number of heads must be 1 or more",
                   heads);
  if (c3 % 3 || (c3 / 3) % heads)
    return DP_FAIL(DP_ERR_INVALID,
                   "attention %d: its input must be q, k and v side by side, 3 D wide with "
                   "D divisible by the heads; here it is %d wide per position",
                   heads, c3);
  dp_layer l = {.kind = DP_LAYER_ATTENTION,
                .in = w,
                .out = w / 3,
                .c = c3 / 3,
                .heads = heads,
                .p = p}; /* dropout on the probabilities (PyTorch's dropout_p) */
  size_t st = (size_t)heads * (size_t)t * (size_t)t;
  if (st > DP_MAX_WIDTH)
    return DP_FAIL(DP_ERR_OVERFLOW,
                   "attention %d on %d positions: its scores are more "
                   "than 2^31 - 1 floats per row",
                   heads, t);
  return push(m, l);
}

/* The innermost residual block still open, or -1. */
static int open_residual(const dp_model *m) {
  for (int i = m->n_layers - 1; i >= 0; i--)
    if (m->layers[i].kind == DP_LAYER_RESIDUAL && m->layers[i].link < 0) return i;
  return -1;
}

dp_status dp_model_begin_residual(dp_model *m) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  int w = cur_width(m);
  return push(m, (dp_layer){.kind = DP_LAYER_RESIDUAL, .in = w, .out = w, .link = -1});
}

/* A row's shape in words: "16 floats", "1 x 4 x 4 (C x H x W)", "64 x 128 (T x D)". */
static void shape_words(char *b, size_t cap, int n, int t, int c, int h, int w) {
  if (h)
    snprintf(b, cap, "%d x %d x %d (C x H x W)", c, h, w);
  else if (t)
    snprintf(b, cap, "%d x %d (T x D)", t, n / t);
  else
    snprintf(b, cap, "%d floats, flat", n);
}

/* Whether the last layer's output has the shape of layer `at`'s input (or
 * output: want_out), else a DP_FAIL naming both. */
static dp_status same_shape(const dp_model *m, int at, bool want_out, const char *what) {
  const dp_layer *r = &m->layers[at], *last = &m->layers[m->n_layers - 1];
  int in = want_out ? r->out : r->in, c = want_out ? r->c : r->ic;
  int h = want_out ? r->h : r->ih, w = want_out ? r->w : r->iw;
  if (last->out == in && last->h == h && last->t == r->t &&
      (!h || (last->c == c && last->w == w)))
    return DP_OK;
  /* in words: 16 floats and 1 x 4 x 4 differ in shape, not in size */
  char got[64], want[64];
  shape_words(got, sizeof got, last->out, last->t, last->c, last->h, last->w);
  shape_words(want, sizeof want, in, r->t, c, h, w);
  return DP_FAIL(DP_ERR_INVALID, what, got, want, at);
}

dp_status dp_model_end_residual(dp_model *m) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  int f = open_residual(m);
  if (f < 0) return DP_FAIL(DP_ERR_INVALID, "'end' without a 'residual' to close");
  if (f == m->n_layers - 1)
    return DP_FAIL(DP_ERR_INVALID, "the residual block (layer %d) is empty", f);
  int sc = dp__block_shortcut(m, f);
  if (sc == m->n_layers - 1)
    return DP_FAIL(DP_ERR_INVALID,
                   "the shortcut (layer %d) has no layers: put its projection (e.g. "
                   "conv2d C 1 stride S nobias, batchnorm) between 'shortcut' and 'end', "
                   "or drop 'shortcut' for x + f(x)",
                   sc);
  dp_status s =
      sc >= 0
          ? same_shape(m, sc - 1, true,
                       "the shortcut's output (%s per row) must have the shape of the "
                       "block's output before 'shortcut' (%s, at layer %d) to be "
                       "added to it")
          : same_shape(m, f, false,
                       "the residual block's output (%s per row) must have the shape of "
                       "its input (%s, at layer %d) to be added to it");
  if (s) return s;
  int w = cur_width(m), k = m->n_layers;
  s = push(m, (dp_layer){.kind = DP_LAYER_RESIDUAL_END, .in = w, .out = w, .link = f});
  if (!s) m->layers[f].link = k;
  return s;
}

dp_status dp_model_begin_shortcut(dp_model *m) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  int f = open_residual(m);
  if (f < 0)
    return DP_FAIL(DP_ERR_INVALID,
                   "'shortcut' outside a residual block: it goes between 'residual' ... "
                   "and 'end'");
  if (dp__block_shortcut(m, f) >= 0)
    return DP_FAIL(DP_ERR_INVALID,
                   "the residual block at layer %d has a shortcut already (layer %d): one "
                   "per block",
                   f, dp__block_shortcut(m, f));
  if (f == m->n_layers - 1)
    return DP_FAIL(DP_ERR_INVALID,
                   "the residual block (layer %d) has no layers before 'shortcut'", f);
  const dp_layer r = m->layers[f];
  int k = m->n_layers;
  dp_status s = push(
      m, (dp_layer){.kind = DP_LAYER_SHORTCUT, .in = cur_width(m), .out = r.in, .link = f});
  if (s) return s;
  /* its input is f's output (the layer before it), its output a view of x */
  dp_layer *l = &m->layers[k];
  l->c = r.ic, l->h = r.ih, l->w = r.iw, l->t = r.t;
  return DP_OK;
}

int dp__model_open_residual(const dp_model *m) { return open_residual(m); }

dp_status dp_model_set_loss(dp_model *m, dp_loss_kind loss) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  if (open_residual(m) >= 0)
    return DP_FAIL(DP_ERR_INVALID, "the residual block at layer %d has no 'end'",
                   open_residual(m));
  if (!dp__loss_on_targets(loss) && loss != DP_LOSS_SOFTMAX_CE)
    return DP_FAIL(DP_ERR_INVALID,
                   "%s loss %d: a model's loss is DP_LOSS_MSE, L1, SMOOTH_L1, HUBER, "
                   "BCE_LOGITS or SOFTMAX_CE",
                   loss == DP_LOSS_NONE ? "DP_LOSS_NONE is no" : "unknown", (int)loss);
  if (m->loss != DP_LOSS_NONE) return DP_FAIL(DP_ERR_INVALID, "the loss is already set");
  if (m->n_layers == 0) return DP_FAIL(DP_ERR_INVALID, "a loss needs at least one layer");
  m->loss = loss;
  m->loss_param = loss == DP_LOSS_SMOOTH_L1 || loss == DP_LOSS_HUBER ? 1.0f : 0.0f;
  return DP_OK;
}

dp_status dp_model_set_loss_param(dp_model *m, float v) {
  if (!m) return DP_FAIL(DP_ERR_INVALID, "model is NULL");
  if (m->loss != DP_LOSS_SMOOTH_L1 && m->loss != DP_LOSS_HUBER)
    return DP_FAIL(DP_ERR_INVALID,
                   "a loss parameter is smooth_l1's beta or huber's delta; this model's "
                   "loss is %s",
                   dp_loss_name(m->loss));
  if (!(v > 0.0f && v <= FLT_MAX))
    return DP_FAIL(DP_ERR_INVALID, "%s: %s must be > 0 and finite, got %g",
                   dp_loss_name(m->loss), m->loss == DP_LOSS_HUBER ? "delta" : "beta",
                   (double)v);
  m->loss_param = v;
  return DP_OK;
}

float dp_model_loss_param(const dp_model *m) { return m ? m->loss_param : 0.0f; }

dp_status dp_model_set_ce_options(dp_model *m, const dp_ce_options *o) {
  if (!m || !o)
    return DP_FAIL(DP_ERR_INVALID, "dp_model_set_ce_options: model or options is NULL");
  if (m->loss != DP_LOSS_SOFTMAX_CE)
    return DP_FAIL(DP_ERR_INVALID,
                   "label_smoothing, ignore_index and weight are options of loss "
                   "softmax_cross_entropy; this model's loss is %s",
                   dp_loss_name(m->loss));
  if (!(o->label_smoothing >= 0.0f && o->label_smoothing <= 1.0f))
    return DP_FAIL(DP_ERR_INVALID, "label_smoothing must be in [0, 1], got %g",
                   (double)o->label_smoothing);
  int classes = dp_model_output_width(m) / dp_model_positions(m);
  if (o->n_weights != 0 && o->n_weights != classes)
    return DP_FAIL(DP_ERR_INVALID,
                   "weight: %d class weights for %d classes (one per class)", o->n_weights,
                   classes);
  if (o->n_weights > DP_MAX_CLASS_WEIGHTS)
    return DP_FAIL(DP_ERR_INVALID, "weight: at most %d classes take class weights, got %d",
                   DP_MAX_CLASS_WEIGHTS, o->n_weights);
  if (o->n_weights && !o->weights)
    return DP_FAIL(DP_ERR_INVALID, "weight: n_weights is %d but weights is NULL",
                   o->n_weights);
  for (int i = 0; i < o->n_weights; i++)
    if (!(o->weights[i] >= 0.0f && o->weights[i] <= FLT_MAX))
      return DP_FAIL(DP_ERR_INVALID, "weight: class %d's weight %g is not finite and >= 0",
                     i, (double)o->weights[i]);
  dp_ce_opts c = {.smoothing = o->label_smoothing + 0.0f, /* -0 as 0: one spelling */
                  .ignore = o->has_ignore_index != 0,
                  .ignore_index = o->has_ignore_index ? o->ignore_index : 0,
                  .n_weights = o->n_weights};
  for (int i = 0; i < o->n_weights; i++) c.weights[i] = o->weights[i] + 0.0f;
  m->ce = c;
  return DP_OK;
}

dp_status dp_model_ce_options(const dp_model *m, dp_ce_options *out) {
  if (out) memset(out, 0, sizeof *out);
  if (!m || !out)
    return DP_FAIL(DP_ERR_INVALID, "dp_model_ce_options: model or out is NULL");
  *out = (dp_ce_options){.label_smoothing = m->ce.smoothing,
                         .has_ignore_index = m->ce.ignore,
                         .ignore_index = m->ce.ignore_index,
                         .n_weights = m->ce.n_weights,
                         .weights = m->ce.n_weights ? m->ce.weights : NULL};
  return DP_OK;
}

dp_status dp_model_set_bce_options(dp_model *m, const dp_bce_options *o) {
  if (!m || !o)
    return DP_FAIL(DP_ERR_INVALID, "dp_model_set_bce_options: model or options is NULL");
  if (m->loss != DP_LOSS_BCE_LOGITS)
    return DP_FAIL(
        DP_ERR_INVALID,
        "pos_weight is an option of loss bce_with_logits; this model's loss is %s",
        dp_loss_name(m->loss));
  int n = o->n_pos_weights, out = dp_model_output_width(m);
  if (n != 0 && n != out)
    return DP_FAIL(DP_ERR_INVALID,
                   "pos_weight: %d weights for %d outputs (one per output, as PyTorch's "
                   "pos_weight of the output's width)",
                   n, out);
  if (n > DP_MAX_CLASS_WEIGHTS)
    return DP_FAIL(DP_ERR_INVALID, "pos_weight: at most %d outputs take weights, got %d",
                   DP_MAX_CLASS_WEIGHTS, n);
  if (n && !o->pos_weights)
    return DP_FAIL(DP_ERR_INVALID,
                   "pos_weight: n_pos_weights is %d but pos_weights is NULL", n);
  for (int i = 0; i < n; i++)
    if (!(o->pos_weights[i] >= 0.0f && o->pos_weights[i] <= FLT_MAX))
      return DP_FAIL(DP_ERR_INVALID,
                     "pos_weight: output %d's weight %g is not finite and >= 0", i,
                     (double)o->pos_weights[i]);
  for (int i = 0; i < n; i++) m->pos_weight[i] = o->pos_weights[i] + 0.0f; /* -0 as 0 */
  m->n_pos_weight = n;
  return DP_OK;
}

dp_status dp_model_bce_options(const dp_model *m, dp_bce_options *out) {
  if (out) memset(out, 0, sizeof *out);
  if (!m || !out)
    return DP_FAIL(DP_ERR_INVALID, "dp_model_bce_options: model or out is NULL");
  out->n_pos_weights = m->n_pos_weight;
  out->pos_weights = m->n_pos_weight ? m->pos_weight : NULL;
  return DP_OK;
}

int dp_model_input_width(const dp_model *m) { return m ? m->input_width : 0; }
int dp_model_output_width(const dp_model *m) { return m ? cur_width(m) : 0; }
int dp_model_positions(const dp_model *m) { return m && cur_t(m) ? cur_t(m) : 1; }
int dp_model_target_width(const dp_model *m) {
  if (!m) return 0;
  return dp__loss_on_targets(m->loss) ? cur_width(m) : dp_model_positions(m);
}
int dp_model_n_layers(const dp_model *m) { return m ? m->n_layers : 0; }
dp_layer_kind dp_model_layer_kind(const dp_model *m, int i) {
  return m && i >= 0 && i < m->n_layers ? m->layers[i].kind : DP_LAYER_INPUT;
}
dp_loss_kind dp_model_loss(const dp_model *m) { return m ? m->loss : DP_LOSS_NONE; }
size_t dp_model_n_params(const dp_model *m) { return m ? m->n_params : 0; }

/* snprintf into a running buffer; keeps counting past the end. */
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(*len < cap ? buf + *len : NULL, *len < cap ? cap - *len : 0, fmt, ap);
  va_end(ap);
  if (n > 0) *len += (size_t)n;
}

size_t dp_model_format(const dp_model *m, char *buf, size_t cap) {
  size_t len = 0;
  char num[32];
  if (!buf) cap = 0; /* a length query, whatever cap says */
  if (cap) buf[0] = '\0';
  if (!m) return 0;
  if (m->input_h)
    put(buf, cap, &len, "input %d %d %d\n", m->input_c, m->input_h, m->input_w);
  else if (m->input_t)
    put(buf, cap, &len, "input tokens %d\n", m->input_t);
  else
    put(buf, cap, &len, "input %d\n", m->input_width);
  int depth = 0; /* residual blocks open: two spaces each */
  for (int i = 0; i < m->n_layers; i++) {
    const dp_layer *l = &m->layers[i];
    /* a shortcut at its block's depth, as its end */
    bool out = l->kind == DP_LAYER_RESIDUAL_END || l->kind == DP_LAYER_SHORTCUT;
    for (int k = 0; k < depth - out; k++) put(buf, cap, &len, "  ");
    if (l->kind == DP_LAYER_RESIDUAL_END) depth--;
    if (l->kind == DP_LAYER_RESIDUAL) depth++;
    if (l->kind == DP_LAYER_LINEAR)
      put(buf, cap, &len, "linear %d%s\n", dp__pos_out(l),
          l->tied   ? " tied"
          : l->bias ? ""
                    : " nobias");
    else if (l->kind == DP_LAYER_EMBEDDING)
      put(buf, cap, &len, "embed %d %d\n", l->vocab, l->c);
    else if (l->kind == DP_LAYER_ATTENTION) {
      put(buf, cap, &len, "attention %d", l->heads);
      if (l->p > 0.0f)
        put(buf, cap, &len, " dropout %s", dp__shortest_float(l->p, num, sizeof num));
      put(buf, cap, &len, "\n");
    } else if (l->kind == DP_LAYER_CONV2D) {
      put(buf, cap, &len, "conv2d %d %d", l->c, l->k);
      if (l->stride != 1) put(buf, cap, &len, " stride %d", l->stride);
      if (l->pad) put(buf, cap, &len, " padding %d", l->pad);
      put(buf, cap, &len, "%s\n", l->bias ? "" : " nobias");
    } else if (l->kind == DP_LAYER_MAXPOOL2D || l->kind == DP_LAYER_AVGPOOL2D) {
      put(buf, cap, &len, "%s %d", dp_layer_kind_name(l->kind), l->k);
      if (l->stride != l->k) put(buf, cap, &len, " stride %d", l->stride);
      /* the defaults unsaid: saved specs keep their text */
      if (l->pad) put(buf, cap, &len, " padding %d", l->pad);
      put(buf, cap, &len, "%s\n", l->exclude_pad ? " exclude_pad" : "");
    } else if (l->kind == DP_LAYER_GELU_ERF) {
      put(buf, cap, &len, "gelu approximate none\n");
    } else if (l->kind == DP_LAYER_LEAKY_RELU && l->slope != DP_LEAKY_SLOPE) {
      put(buf, cap, &len, "leaky_relu %s\n", dp__shortest_float(l->slope, num, sizeof num));
    } else if (l->kind == DP_LAYER_DROPOUT) {
      put(buf, cap, &len, "dropout %s\n", dp__shortest_float(l->p, num, sizeof num));
    } else if (l->kind == DP_LAYER_LAYERNORM || l->kind == DP_LAYER_BATCHNORM) {
      /* the defaults unsaid: saved specs keep their text */
      put(buf, cap, &len, "%s", dp_layer_kind_name(l->kind));
      if (l->eps != DP_NORM_EPS)
        put(buf, cap, &len, " eps %s", dp__shortest_float(l->eps, num, sizeof num));
      if (l->kind == DP_LAYER_BATCHNORM && l->momentum == DP_BN_CUMULATIVE)
        put(buf, cap, &len, " momentum none");
      else if (l->kind == DP_LAYER_BATCHNORM && l->momentum != 0.1)
        put(buf, cap, &len, " momentum %s",
            dp__shortest_float((float)l->momentum, num, sizeof num));
      put(buf, cap, &len, "\n");
    } else
      put(buf, cap, &len, "%s\n", dp_layer_kind_name(l->kind));
  }
  if (m->loss != DP_LOSS_NONE) put(buf, cap, &len, "loss %s", dp_loss_name(m->loss));
  if (m->ce.smoothing > 0.0f)
    put(buf, cap, &len, " label_smoothing %s",
        dp__shortest_float(m->ce.smoothing, num, sizeof num));
  if (m->ce.ignore) put(buf, cap, &len, " ignore_index %d", (int)m->ce.ignore_index);
  if ((m->loss == DP_LOSS_SMOOTH_L1 || m->loss == DP_LOSS_HUBER) && m->loss_param != 1.0f)
    put(buf, cap, &len, " %s %s", m->loss == DP_LOSS_HUBER ? "delta" : "beta",
        dp__shortest_float(m->loss_param, num, sizeof num));
  for (int i = 0; i < m->ce.n_weights; i++)
    put(buf, cap, &len, "%s%s", i ? "," : " weight ",
        dp__shortest_float(m->ce.weights[i], num, sizeof num));
  for (int i = 0; i < m->n_pos_weight; i++) /* only when set: older specs keep their text */
    put(buf, cap, &len, "%s%s", i ? "," : " pos_weight ",
        dp__shortest_float(m->pos_weight[i], num, sizeof num));
  if (m->loss != DP_LOSS_NONE) put(buf, cap, &len, "\n");
  return len;
}

/* ---- inspection ---------------------------------------------------------------- */

dp_status dp_model_layer(const dp_model *m, int i, dp_layer_info *out) {
  if (out) memset(out, 0, sizeof *out);
  if (!m || !out) return DP_FAIL(DP_ERR_INVALID, "dp_model_layer: model or out is NULL");
  if (i < 0 || i >= m->n_layers)
    return DP_FAIL(DP_ERR_RANGE, "dp_model_layer: layer %d out of range (the model has %d)",
                   i, m->n_layers);
  const dp_layer *l = &m->layers[i];
  *out = (dp_layer_info){
      .kind = l->kind,
      .in = l->in,
      .out = l->out,
      .bias = l->bias,
      .p = l->p,
      .param_offset = l->param_off,
      .n_params = l->n_params,
      .channels = l->c,
      .height = l->h,
      .width = l->w,
      .kernel = l->k,
      .stride = l->stride,
      .padding = l->pad,
      .exclude_pad = l->exclude_pad,
      .positions = l->t,
      .tied = l->tied,
      .eps = l->kind == DP_LAYER_LAYERNORM || l->kind == DP_LAYER_BATCHNORM ? l->eps : 0.0f,
      .negative_slope = l->slope,
      .momentum = l->kind != DP_LAYER_BATCHNORM     ? 0.0f
                  : l->momentum == DP_BN_CUMULATIVE ? DP_BN_MOMENTUM_NONE
                                                    : (float)l->momentum,
      .vocab = l->vocab,
      .heads = l->heads,
      .link = l->kind == DP_LAYER_RESIDUAL || l->kind == DP_LAYER_RESIDUAL_END ||
                      l->kind == DP_LAYER_SHORTCUT
                  ? l->link
                  : 0};
  return DP_OK;
}

/* Parameter tensors of layer l: linear, conv2d: weight (and bias); layernorm:
 * weight, bias. */
static int layer_tensors(const dp_layer *l) {
  if (l->kind == DP_LAYER_LINEAR || l->kind == DP_LAYER_CONV2D) return l->bias ? 2 : 1;
  return l->kind == DP_LAYER_LAYERNORM || l->kind == DP_LAYER_BATCHNORM ||
                 l->kind == DP_LAYER_EMBEDDING
             ? 2
             : 0;
}

/* An embedding's tensors: "i.tok.weight" (V, D), then "i.pos.weight" (T, D). */
static void embedding_tensor(const dp_layer *l, int li, int pos, dp_tensor_info *out) {
  snprintf(out->name, sizeof out->name, "%d.%s.weight", li, pos ? "pos" : "tok");
  out->ndim = 2;
  out->dims[0] = pos ? l->t : l->vocab;
  out->dims[1] = l->c;
  out->numel = (size_t)out->dims[0] * (size_t)l->c;
  out->offset = l->param_off + (pos ? (size_t)l->vocab * (size_t)l->c : 0);
}

int dp_model_n_tensors(const dp_model *m) {
  int n = 0;
  for (int i = 0; m && i < m->n_layers; i++) n += layer_tensors(&m->layers[i]);
  return n;
}

dp_status dp_model_tensor(const dp_model *m, int i, dp_tensor_info *out) {
  if (out) memset(out, 0, sizeof *out);
  if (!m || !out) return DP_FAIL(DP_ERR_INVALID, "dp_model_tensor: model or out is NULL");
  int left = i;
  for (int li = 0; i >= 0 && li < m->n_layers; li++) {
    const dp_layer *l = &m->layers[li];
    int nt = layer_tensors(l);
    if (left >= nt) {
      left -= nt;
      continue;
    }
    /* linear: weight (out, in) then bias (out); conv2d: weight (out, in, k, k) then
     * bias (out); layernorm: weight (n) then bias (n); on a sequence, the widths
     * per position */
    if (l->kind == DP_LAYER_EMBEDDING) {
      embedding_tensor(l, li, left, out);
      return DP_OK;
    }
    int bias = left == 1, matrix = l->kind == DP_LAYER_LINEAR && !bias;
    int conv = l->kind == DP_LAYER_CONV2D;
    snprintf(out->name, sizeof out->name, "%d.%s", li, bias ? "bias" : "weight");
    if (conv && !bias) {
      out->ndim = 4;
      out->dims[0] = l->c, out->dims[1] = l->ic, out->dims[2] = l->k, out->dims[3] = l->k;
      out->numel = (size_t)l->c * (size_t)l->ic * (size_t)l->k * (size_t)l->k;
    } else {
      out->ndim = matrix ? 2 : 1;
      out->dims[0] = conv || l->kind == DP_LAYER_BATCHNORM ? l->c : dp__pos_out(l);
      out->dims[1] = matrix ? dp__pos_in(l) : 0;
      out->numel =
          matrix ? (size_t)out->dims[0] * (size_t)out->dims[1] : (size_t)out->dims[0];
    }
    out->offset = l->param_off + (bias ? l->n_params - out->numel : 0);
    return DP_OK;
  }
  return DP_FAIL(DP_ERR_RANGE, "dp_model_tensor: tensor %d out of range (the model has %d)",
                 i, dp_model_n_tensors(m));
}
