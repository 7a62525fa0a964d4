/* The planner: from a model and a config, every region of every device's
 * arena (offset, size, alignment) and the static schedule of a step. Pure C,
 * no backend headers; the numbers it produces are the ones the runtime uses. */
#include "core/world.h" /* dp_agreement: its layout is in the build hash */

#include <float.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char *const region_names[DP_REGION_COUNT] = {
    [DP_REGION_PARAMS] = "params",
    [DP_REGION_GRADS] = "grads",
    [DP_REGION_GRAD_PARTIALS] = "grad_partials",
    [DP_REGION_OPT_STATE] = "optimizer_state",
    [DP_REGION_INPUTS] = "inputs",
    [DP_REGION_TARGETS] = "targets",
    [DP_REGION_ACTIVATIONS] = "activations",
    [DP_REGION_OUTPUTS] = "outputs",
    [DP_REGION_OUTPUT_GRADS] = "output_grads",
    [DP_REGION_GATHERED_OUTPUTS] = "gathered_outputs",
    [DP_REGION_GATHERED_GRADS] = "gathered_grads",
    [DP_REGION_LOSS] = "loss",
    [DP_REGION_COMM] = "comm",
    [DP_REGION_WORKSPACE] = "workspace",
};

const char *dp_region_name(dp_region r) {
  return (unsigned)r < DP_REGION_COUNT ? region_names[r] : "?";
}

void dp_config_default(dp_config *c) {
  if (!c) return;
  memset(c, 0, sizeof *c);
  c->n_devices = 1;
  for (int i = 0; i < DP_MAX_DEVICES; i++) c->device_ids[i] = i;
  c->split = DP_SPLIT_CHUNK;
  c->mode = DP_MODE_CLASSIC;
  c->optimizer = DP_OPT_SGD;
  c->backend = DP_BACKEND_CPU;
  c->lr = 0.01f;
  dp_config_set_optimizer(c, DP_OPT_SGD);
  c->seed = 0;
}

void dp_config_set_optimizer(dp_config *c, dp_optimizer o) {
  if (!c) return;
  c->optimizer = o;
  c->momentum = o == DP_OPT_MOMENTUM ? 0.9f : 0.0f;
  c->dampening = 0.0f;
  c->nesterov = 0;
  c->weight_decay = o == DP_OPT_ADAMW ? 0.01f : 0.0f; /* Adam's: 0, as PyTorch's */
  c->beta1 = 0.9f;
  c->beta2 = 0.999f;
  c->eps = 1e-8f;
  c->amsgrad = 0;
}

bool dp__shared_gpu(const dp_config *c, int n, int *first, int *second) {
  return dp__shared_gpu_in(c, 0, n, first, second);
}

bool dp__shared_gpu_in(const dp_config *c, int d0, int n, int *first, int *second) {
  for (int d = d0; d < d0 + n; d++)
    for (int e = d0; e < d; e++)
      if (c->device_ids[d] == c->device_ids[e]) {
        *first = e;
        *second = d;
        return true;
      }
  return false;
}

/* The optimizer's hyper-parameters: finite, in PyTorch's ranges, and none
 * that the chosen optimizer would silently ignore. Negated comparisons so that
 * NaN fails every one. */
static dp_status check_hyper(const dp_config *c) {
  if (!(c->lr > 0 && c->lr <= FLT_MAX)) /* (a schedule may reach 0; the plan's may not) */
    return DP_FAIL(DP_ERR_INVALID, "learning rate must be finite and > 0, got %g",
                   (double)c->lr);
  const struct {
    const char *name;
    float v, lo, hi;
    bool hi_open;
  } r[] = {
      {"momentum", c->momentum, 0, 1, true},
      {"dampening", c->dampening, 0, 1, false},
      {"weight_decay", c->weight_decay, 0, FLT_MAX, false},
      {"Adam(W) beta1", c->beta1, 0, 1, true},
      {"Adam(W) beta2", c->beta2, 0, 1, true},
      {"Adam(W) eps", c->eps, 0, FLT_MAX, false},
  };
  for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
    if (!(r[i].v >= r[i].lo && (r[i].hi_open ? r[i].v < r[i].hi : r[i].v <= r[i].hi)))
      return DP_FAIL(DP_ERR_INVALID, "%s must be %s, got %g", r[i].name,
                     r[i].hi == FLT_MAX ? "finite and >= 0"
                     : r[i].hi_open     ? "in [0, 1)"
                                        : "in [0, 1]",
                     (double)r[i].v);
  if (c->nesterov != 0 && c->nesterov != 1)
    return DP_FAIL(DP_ERR_INVALID, "nesterov must be 0 or 1, got %d", c->nesterov);
  if (c->amsgrad != 0 && c->amsgrad != 1)
    return DP_FAIL(DP_ERR_INVALID, "amsgrad must be 0 or 1, got %d", c->amsgrad);
  /* PyTorch's SGD has no amsgrad: a setting it would ignore is refused */
  if (c->amsgrad && !dp__is_adam(c->optimizer))
    return DP_FAIL(DP_ERR_INVALID,
                   "amsgrad is an Adam and AdamW setting; the optimizer is %s (choose "
                   "adam or adamw, or leave amsgrad off)",
                   dp_optimizer_name(c->optimizer));
  if (dp__is_adam(c->optimizer)) {
    const char *name = c->optimizer == DP_OPT_ADAM ? "Adam" : "AdamW";
    if (c->momentum != 0 || c->dampening != 0 || c->nesterov)
      return DP_FAIL(DP_ERR_INVALID,
                     "momentum, dampening and nesterov are SGD settings; %s takes beta1 "
                     "and beta2 (got momentum %g, dampening %g, nesterov %d)",
                     name, (double)c->momentum, (double)c->dampening, c->nesterov);
    if (!(c->eps > 0))
      return DP_FAIL(DP_ERR_INVALID, "%s needs eps > 0, got %g", name, (double)c->eps);
    /* AdamW: lr * weight_decay scales every parameter by 1 - lr * wd each
     * step (Adam adds wd * w to the gradient instead: no such bound) */
    if (c->optimizer == DP_OPT_ADAMW && !((double)c->lr * c->weight_decay <= 1.0))
      return DP_FAIL(DP_ERR_INVALID,
                     "lr * weight_decay is %g; AdamW multiplies every parameter by "
                     "1 - lr * weight_decay each step, so it must be at most 1",
                     (double)c->lr * c->weight_decay);
    return DP_OK;
  }
  if (c->optimizer == DP_OPT_MOMENTUM && !(c->momentum > 0))
    return DP_FAIL(DP_ERR_INVALID,
                   "the momentum optimizer needs momentum > 0 (got 0; momentum 0 is plain "
                   "SGD: use DP_OPT_SGD / --optimizer sgd)");
  if (c->dampening != 0 && !(c->momentum > 0))
    return DP_FAIL(DP_ERR_INVALID, "dampening %g needs momentum > 0", (double)c->dampening);
  if (c->nesterov && (!(c->momentum > 0) || c->dampening != 0))
    return DP_FAIL(DP_ERR_INVALID,
                   "nesterov momentum requires a momentum > 0 and zero dampening (as "
                   "PyTorch), got momentum %g, dampening %g",
                   (double)c->momentum, (double)c->dampening);
  return DP_OK;
}

/* config.precision and reduce_precision: names the library knows and a
 * backend that runs them (in bf16 every layer kind runs: lib/cpu/mixed.c,
 * cuda/mixed.cu). */
static dp_status check_precision(const dp_config *c, const dp_backend_ops *be) {
  if (c->reduce_precision != DP_PRECISION_FP32 && c->reduce_precision != DP_PRECISION_BF16)
    return DP_FAIL(DP_ERR_INVALID,
                   "unknown reduce_precision %d: the options are fp32 and bf16",
                   (int)c->reduce_precision);
  if (c->reduce_precision == DP_PRECISION_BF16 && !c->inference && !be->reduce_bf16)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "the %s backend does not reduce gradients in bf16 yet; use "
                   "reduce_precision fp32",
                   be->name);
  if (c->precision == DP_PRECISION_FP32) return DP_OK;
  if (c->precision != DP_PRECISION_BF16)
    return DP_FAIL(DP_ERR_INVALID, "unknown precision %d: the options are fp32 and bf16",
                   (int)c->precision);
  if (!be->mixed_bf16)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "the %s backend does not run precision bf16 yet; use the cpu backend, "
                   "or precision fp32",
                   be->name);
  return DP_OK;
}

/* The model's layers are ones the backend runs and its residual blocks
 * closed (bn: the model has a batchnorm). */
static dp_status check_layers_run(const dp_model *m, const dp_config *c,
                                  const dp_backend_ops *be, bool bn) {
  if (bn && !be->batchnorm)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "the %s backend does not run batchnorm layers yet; use the cpu backend",
                   be->name);
  for (int i = 0; i < m->n_layers && !be->image_layers; i++) {
    dp_layer_kind k = m->layers[i].kind;
    if (k == DP_LAYER_CONV2D || k == DP_LAYER_MAXPOOL2D || k == DP_LAYER_AVGPOOL2D ||
        k == DP_LAYER_FLATTEN)
      return DP_FAIL(DP_ERR_UNSUPPORTED,
                     "the %s backend does not run %s layers yet (layer %d); use the cpu "
                     "backend",
                     be->name, dp_layer_kind_name(k), i);
  }
  for (int i = 0; i < m->n_layers && !be->sequence_layers; i++) {
    dp_layer_kind k = m->layers[i].kind;
    if (k == DP_LAYER_EMBEDDING || k == DP_LAYER_ATTENTION || k == DP_LAYER_RESIDUAL ||
        k == DP_LAYER_RESIDUAL_END || k == DP_LAYER_SHORTCUT)
      return DP_FAIL(DP_ERR_UNSUPPORTED,
                     "the %s backend does not run %s layers yet (layer %d); use the cpu "
                     "backend",
                     be->name, dp_layer_kind_name(k), i);
  }
  for (int i = 0; i < m->n_layers && !be->attention_dropout; i++)
    if (m->layers[i].kind == DP_LAYER_ATTENTION && m->layers[i].p > 0.0f && !c->inference)
      return DP_FAIL(DP_ERR_UNSUPPORTED,
                     "the %s backend does not run attention dropout yet (layer %d); use "
                     "the cpu backend, or attention without dropout",
                     be->name, i);
  if (dp__model_open_residual(m) >= 0)
    return DP_FAIL(DP_ERR_INVALID, "the residual block at layer %d has no end",
                   dp__model_open_residual(m));
  return DP_OK;
}

static dp_status check_config(const dp_model *m, const dp_config *c,
                              int opt[DP_MAX_BACKEND_OPTIONS]) {
  if (c->batch < 1)
    return DP_FAIL(DP_ERR_INVALID, "batch must be at least 1, got %d", c->batch);
  if (c->n_devices < 1 || c->n_devices > DP_MAX_DEVICES)
    return DP_FAIL(DP_ERR_INVALID, "device count %d is out of range (1..%d)", c->n_devices,
                   DP_MAX_DEVICES);
  if (c->ranks < 0 || c->ranks > c->n_devices)
    return DP_FAIL(DP_ERR_INVALID,
                   "ranks must be 1..%d (one or more devices per process), got %d",
                   c->n_devices, c->ranks);
  if (c->ranks > 1 && c->n_devices % c->ranks)
    return DP_FAIL(DP_ERR_INVALID,
                   "%d devices cannot be shared by %d ranks: every rank drives the same "
                   "number of devices (n_devices must be a multiple of ranks)",
                   c->n_devices, c->ranks);
  if (c->micro_batch < 0)
    return DP_FAIL(DP_ERR_INVALID, "micro-batch must be >= 0, got %d", c->micro_batch);
  if (c->mode != DP_MODE_CLASSIC && c->mode != DP_MODE_ALLREDUCE)
    return DP_FAIL(DP_ERR_INVALID, "unknown mode %d", (int)c->mode);
  if (c->inference != 0 && c->inference != 1)
    return DP_FAIL(DP_ERR_INVALID, "inference must be 0 or 1, got %d", c->inference);
  if (c->shard_optimizer != 0 && c->shard_optimizer != 1)
    return DP_FAIL(DP_ERR_INVALID, "shard_optimizer must be 0 or 1, got %d",
                   c->shard_optimizer);
  if (c->shard_optimizer && c->mode != DP_MODE_ALLREDUCE)
    return DP_FAIL(DP_ERR_INVALID,
                   "a sharded optimizer needs allreduce mode (in classic mode "
                   "only device 0 keeps optimizer state)");
  if (c->optimizer != DP_OPT_SGD && c->optimizer != DP_OPT_MOMENTUM &&
      c->optimizer != DP_OPT_ADAMW && c->optimizer != DP_OPT_ADAM)
    return DP_FAIL(DP_ERR_INVALID, "unknown optimizer %d", (int)c->optimizer);
  const dp_backend_ops *be = dp__backend_ops(c->backend);
  if (!be && strcmp(dp_backend_name(c->backend), "?"))
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "the %s backend is not registered: link its library (libdp_%s.a, "
                   "pkg-config dp-%s) and call dp_%s_register() first",
                   dp_backend_name(c->backend), dp_backend_name(c->backend),
                   dp_backend_name(c->backend), dp_backend_name(c->backend));
  if (!be) return DP_FAIL(DP_ERR_INVALID, "unknown backend %d", (int)c->backend);
  /* Across processes a step's status must be agreed before its commit phase,
   * which the host does between the two parts of a synchronous backend's
   * step, or after an asynchronous one's step_sync; an asynchronous backend
   * also moves the cross-rank bytes itself (ctx_init_world). */
  if (c->ranks > 1 && be->step_end && !(be->step_sync && be->ctx_init_world))
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "the %s backend does not run across several processes yet (ranks %d); "
                   "use the cpu backend, or one process (ranks 1)",
                   be->name, c->ranks);
  if (!c->inference && !(c->clip_grad_norm >= 0.0f && c->clip_grad_norm <= FLT_MAX))
    return DP_FAIL(DP_ERR_INVALID,
                   "clip_grad_norm must be finite and >= 0 (0: no clipping), got %g",
                   (double)c->clip_grad_norm);
  if (!c->inference && !(c->clip_grad_value >= 0.0f && c->clip_grad_value <= FLT_MAX))
    return DP_FAIL(DP_ERR_INVALID,
                   "clip_grad_value must be finite and >= 0 (0: no clipping), got %g",
                   (double)c->clip_grad_value);
  /* PyTorch users call clip_grad_norm_ or clip_grad_value_; both would need an
   * order PyTorch does not define */
  if (!c->inference && c->clip_grad_norm > 0 && c->clip_grad_value > 0)
    return DP_FAIL(DP_ERR_INVALID,
                   "clip_grad_norm %g and clip_grad_value %g: give one (PyTorch's "
                   "clip_grad_norm_ or clip_grad_value_), not both",
                   (double)c->clip_grad_norm, (double)c->clip_grad_value);
  if (!c->inference && (c->accumulate < 0 || c->accumulate > 65536 ||
                        (c->accumulate > 1 && !dp__is_pow2(c->accumulate))))
    return DP_FAIL(DP_ERR_INVALID,
                   "accumulate must be a power of two up to 65536 (0 or 1: none), got %d",
                   c->accumulate);
  /* the update's mean is over accumulate * batch rows, counted in int (the
   * loss gradient's scale, dropout's row keys): a context planned for that
   * concatenated batch must be possible */
  if (!c->inference && c->accumulate > 1 && (long long)c->batch * c->accumulate > INT_MAX)
    return DP_FAIL(DP_ERR_OVERFLOW,
                   "batch %d x accumulate %d is %lld rows per update, more than %d: use a "
                   "smaller batch or accumulate",
                   c->batch, c->accumulate, (long long)c->batch * c->accumulate, INT_MAX);
  /* a sequence model's ops count a micro-batch's positions in int (rows x T,
   * the rows of their products): the batch's tokens must fit (an outside
   * check: 32768 rows of 65536 tokens planned, and would have wrapped) */
  long long T = dp_model_positions(m);
  if (T > 1 && (long long)c->batch * T > INT_MAX)
    return DP_FAIL(DP_ERR_OVERFLOW,
                   "batch %d x %lld positions is %lld tokens, more than %d: use a smaller "
                   "batch",
                   c->batch, T, (long long)c->batch * T, INT_MAX);
  if (c->recompute < 0 || c->recompute > DP_MAX_LAYERS)
    return DP_FAIL(DP_ERR_INVALID,
                   "recompute must be 0 (off) or a segment length of 1..%d layers, got %d",
                   DP_MAX_LAYERS, c->recompute);
  dp_status ps = check_precision(c, be);
  if (ps) return ps;
  bool bn = false;
  for (int i = 0; i < m->n_layers; i++) bn |= m->layers[i].kind == DP_LAYER_BATCHNORM;
  if (c->batchnorm != DP_BN_PER_REPLICA && c->batchnorm != DP_BN_SYNC)
    return DP_FAIL(DP_ERR_INVALID, "unknown batchnorm mode %d", (int)c->batchnorm);
  dp_status ls = check_layers_run(m, c, be, bn);
  if (ls) return ls;
  if (!c->inference && c->accumulate > 1 && !be->accumulate)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "the %s backend cannot accumulate gradients yet (accumulate); use the "
                   "cpu backend",
                   be->name);
  if (!c->inference && c->clip_grad_norm > 0 && !be->grad_clip)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "the %s backend cannot clip gradients yet (clip_grad_norm); use the cpu "
                   "backend",
                   be->name);
  if (!c->inference && c->clip_grad_value > 0 && !be->grad_clip_value)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "the %s backend cannot clamp gradients yet (clip_grad_value); use the "
                   "cpu backend",
                   be->name);
  if (c->on_nonfinite != DP_NONFINITE_ERROR && c->on_nonfinite != DP_NONFINITE_SKIP)
    return DP_FAIL(DP_ERR_INVALID, "unknown non-finite policy %d", (int)c->on_nonfinite);
  if (c->timeout_ms < 0)
    return DP_FAIL(DP_ERR_INVALID, "timeout_ms must be >= 0 (0: the default), got %d",
                   c->timeout_ms);
  if (c->guards != 0 && c->guards != 1)
    return DP_FAIL(DP_ERR_INVALID, "guards must be 0 or 1, got %d", c->guards);

  /* The backend's own options, parsed from its table, then its check. */
  dp_status so = dp__backend_options(be, c, opt);
  if (so) return so;
  if (be->check_config) {
    dp_status s = be->check_config(c, opt);
    if (s) return s;
  }
  if (!c->inference && m->loss == DP_LOSS_NONE)
    return DP_FAIL(DP_ERR_INVALID, "a training plan needs a loss (add 'loss mse' or "
                                   "'loss softmax_cross_entropy', or plan --inference)");
  if (m->n_layers == 0) return DP_FAIL(DP_ERR_INVALID, "the model has no layers");
  if (!c->inference) return check_hyper(c);
  return DP_OK;
}

/* a * b * c bytes, checked. */
static bool mul3(size_t a, size_t b, size_t c, size_t *out) {
  size_t t;
  return dp__mul(a, b, &t) && dp__mul(t, c, out);
}

#define OVERFLOW()                                                                         \
  DP_FAIL(DP_ERR_OVERFLOW, "plan size overflows size_t (dims or batch too large)")

/* Partial buffers the canonical pairwise tree over n leaves needs besides the
 * destination: schedule.c gives a right child the next slot, and with the
 * split at mid = (lo + hi + 1) / 2 the right half has floor(n/2) leaves, so
 * the deepest slot is floor(log2(n)) (not the tree depth, ceil(log2(n))). */
static int tree_levels(int n) {
  int l = 0;
  while (n >> (l + 1)) l++;
  return l;
}

/* Micro-batch slices (issue 28, finding 3): slice j of a row tensor at j times
 * the largest micro-batch's bytes, rounded up to the backend's slice_align, so a
 * micro-batch's rows sit at the same alignment whatever its place on its device. */
size_t dp__slice_stride(const dp_plan *p, int w, size_t esz) {
  size_t b, a;
  if (!mul3((size_t)p->split.mb_rows, (size_t)w, esz, &b)) return SIZE_MAX;
  if (!p->slice_align) return b;
  return dp__align_up(b, p->slice_align, &a) ? a : SIZE_MAX;
}

size_t dp__rows_bytes(const dp_plan *p, int d, int w, size_t esz) {
  int mb0 = p->split.dev_mb0[d], mb1 = p->split.dev_mb0[d + 1];
  size_t S = dp__slice_stride(p, w, esz), last, n;
  if (mb1 == mb0) return 0;
  if (S == SIZE_MAX || !mul3((size_t)p->mbs[mb1 - 1].rows, (size_t)w, esz, &last) ||
      !dp__mul((size_t)(mb1 - mb0 - 1), S, &n) || !dp__add(n, last, &n))
    return SIZE_MAX;
  return n;
}

/* dp__rows_bytes into *out; false: overflow. */
static bool rows_bytes(const dp_plan *p, int d, int w, size_t esz, size_t *out) {
  *out = dp__rows_bytes(p, d, w, esz);
  return *out != SIZE_MAX;
}

/* Bytes of device d's activation buffer `kind` (0 output, 1 saved
 * statistics, 2 output gradient, 3 and 4 the recompute's output and
 * statistics) of layer i, 0 when it has none (the sizes before placement:
 * dp_plan_activation_bytes_unshared sums them too). A recomputed layer's
 * output and statistics hold one micro-batch. false: overflow. */
static bool act_bytes(const dp_plan *p, int d, int kind, int i, size_t *out) {
  const dp_model *m = &p->model;
  const dp_layer *l = &m->layers[i];
  const dp_act_layout *a = &p->act[d];
  bool train = !p->cfg.inference, rc = p->rc[i];
  int n_mb = p->split.dev_mb0[d + 1] - p->split.dev_mb0[d], sw = dp__layer_stats_width(l);
  size_t e = dp__act_esz(p); /* outputs and their gradients; statistics are fp32 */
  *out = 0;
  /* a shortcut's gradient (g's input's, until the block's begin adds it to x's) */
  if (l->kind == DP_LAYER_SHORTCUT && kind == 2 && train && dp__act_owner(m, i) >= 0)
    return dp__dact_all(p, i) ? rows_bytes(p, d, l->out, e, out)
                              : mul3((size_t)a->mb_rows, (size_t)l->out, e, out);
  if (dp__layer_is_view(m, i)) return true;
  switch (kind) {
  case 0:
    if (rc) return mul3((size_t)a->mb_rows, (size_t)l->out, e, out);
    return i == m->n_layers - 1 || rows_bytes(p, d, l->out, e, out);
  case 3: return p->rc[i] != 1 || mul3((size_t)a->mb_rows, (size_t)l->out, e, out);
  case 4: return p->rc[i] != 1 || !sw || mul3((size_t)a->mb_rows, (size_t)sw, 4, out);
  case 1:
    if (sw && rc) return mul3((size_t)a->mb_rows, (size_t)sw, 4, out);
    if (sw) return rows_bytes(p, d, sw, 4, out);
    if (l->kind != DP_LAYER_BATCHNORM || !train || n_mb == 0) return true;
    return mul3(dp__bn_sync(p, i) ? dp__bn_sync_floats(l->c, n_mb)
                                  : (size_t)n_mb * dp__bn_stats(l->c),
                1, 4, out);
  default: /* per micro-batch, or all rows across a sync batchnorm (dp__dact_all) */
    if (!train || i == m->n_layers - 1) return true;
    if (dp__dact_all(p, i)) return rows_bytes(p, d, l->out, e, out);
    return mul3((size_t)a->mb_rows, (size_t)l->out, e, out);
  }
}

bool dp__relu_fused(const dp_plan *p, int i) {
  const dp_model *m = &p->model;
  if (i <= 0 || i >= m->n_layers || m->layers[i].kind != DP_LAYER_RELU) return false;
  const dp_backend_ops *be = dp__backend_ops(p->cfg.backend);
  switch (m->layers[i - 1].kind) {
  case DP_LAYER_LINEAR: return be->fuses_linear_relu;
  case DP_LAYER_CONV2D: /* bf16 plans run conv2d on fp32 copies: unfused */
    return be->fuses_conv_relu && p->cfg.precision == DP_PRECISION_FP32;
  default: return false;
  }
}

bool dp__relu_bwd_fused(const dp_plan *p, int i) {
  if (!dp__relu_fused(p, i) || i + 1 >= p->model.n_layers) return false;
  switch (p->model.layers[i + 1].kind) {
  case DP_LAYER_LINEAR: return true;
  case DP_LAYER_MAXPOOL2D:
    return dp__backend_ops(p->cfg.backend)->fuses_relu_maxpool &&
           p->cfg.precision == DP_PRECISION_FP32;
  default: return false;
  }
}

/* Whether the forward may be cut into segments between layers i and i + 1
 * (config.recompute): not between a linear and the relu it writes, nor
 * before a view of i's output. */
static bool can_cut(const dp_plan *p, int i) {
  const dp_model *m = &p->model;
  return i + 1 < m->n_layers && !dp__relu_fused(p, i + 1) && !dp__layer_is_view(m, i + 1);
}

/* Which of the outputs that are not kept (rc 1 so far) the backward's
 * recompute must make, and which forward ops it runs (rc_op): from the top, an
 * output is needed when a backward reads it (its own, or its reader's, which
 * needs its input) or a recomputed forward does; a forward is recomputed when
 * it writes a needed output, its own or its fused relu's, or statistics its
 * backward reads. An output not needed lives one micro-batch in the forward
 * only (rc 2); a recomputed one is rc 1. */
static void plan_recomputed(dp_plan *p) {
  const dp_model *m = &p->model;
  int L = m->n_layers;
  bool need[DP_MAX_LAYERS] = {false};
  for (int j = L - 1; j >= 0; j--) {
    const dp_layer *l = &m->layers[j];
    if (p->rc[j]) {
      int e = j;
      while (e + 1 < L && dp__views_prev(m, e + 1)) e++;
      int r = e + 1; /* < L: the last layer's output is never recomputed */
      need[j] =
          dp__layer_needs_output(l) || dp__layer_needs_input(&m->layers[r]) || p->rc_op[r];
      for (int k = r; k < L; k++)
        need[j] |= m->layers[k].kind == DP_LAYER_RESIDUAL_END &&
                   dp__skip_owner(m, k) == j && p->rc_op[k];
      for (int k = r; k < L; k++) /* g's first layer reads x past its shortcut */
        if (m->layers[k].kind == DP_LAYER_SHORTCUT && dp__act_owner(m, k) == j) {
          int g = k;
          while (g + 1 < L && dp__views_prev(m, g + 1)) g++;
          need[j] |= dp__layer_needs_input(&m->layers[g + 1]) || p->rc_op[g + 1];
        }
    }
    p->rc_op[j] = !dp__layer_is_view(m, j) && !dp__relu_fused(p, j) &&
                  ((p->rc[j] && (need[j] || dp__layer_stats_width(l))) ||
                   (dp__relu_fused(p, j + 1) && need[j + 1]));
  }
  for (int i = 0; i < L; i++)
    if (p->rc[i]) p->rc[i] = p->rc_op[dp__relu_fused(p, i) ? i - 1 : i] ? 1 : 2;
}

/* An output that a layer of another segment reads must be kept (rc 0). */
static void keep_if_crossing(dp_plan *p, int o, int reader) {
  if (o >= 0 && p->seg_lo[o] != p->seg_lo[reader]) p->rc[o] = 0;
}

/* config.recompute K: segments of K layers (a cut moves past a layer that
 * cannot end one), cut around every sync batchnorm too (its statistics and
 * sums wait for the whole batch between two backward segments, so its
 * input and output are kept); the outputs no other segment reads are
 * recomputed; then the times of one micro-batch's pass: the forward, then
 * the backward segment by segment from the top, each segment's recompute
 * (ascending) before its backward (descending). Without recompute every
 * layer is a segment and t_b[i] = 2L - 1 - i. */
static void plan_segments(dp_plan *p) {
  const dp_model *m = &p->model;
  int L = m->n_layers, K = p->cfg.inference ? 0 : p->cfg.recompute;
  for (int i = 0, lo = 0, n = 0; i < L; i++) {
    bool sync = i + 1 < L && (dp__bn_sync(p, i) || dp__bn_sync(p, i + 1));
    if (i < L - 1 && K && !(can_cut(p, i) && (++n >= K || sync))) {
      n += !can_cut(p, i); /* counted above when it can cut */
      continue;
    }
    for (int j = lo; j <= i; j++) {
      p->seg_lo[j] = (int16_t)lo;
      p->seg_hi[j] = (int16_t)i;
    }
    lo = i + 1;
    n = 0;
  }
  for (int i = 0; i < L; i++) /* owners of a buffer, but the last layer's (OUTPUTS) */
    p->rc[i] = K && i < L - 1 && !dp__layer_is_view(m, i) && !dp__relu_fused(p, i + 1);
  for (int j = 0; j < L; j++) {
    if (j > 0) keep_if_crossing(p, dp__act_owner(m, j - 1), j);
    if (m->layers[j].kind == DP_LAYER_RESIDUAL_END)
      keep_if_crossing(p, dp__skip_owner(m, j), j);
    if (dp__bn_sync(p, j)) {
      p->rc[j] = 0;
      if (j > 0 && dp__act_owner(m, j - 1) >= 0) p->rc[dp__act_owner(m, j - 1)] = 0;
    }
  }
  plan_recomputed(p);
  int t = L;
  for (int hi = L - 1; hi >= 0; hi = p->seg_lo[hi] - 1) {
    for (int j = p->seg_lo[hi]; j <= hi; j++) p->t_r[j] = -1;
    for (int j = p->seg_lo[hi]; j <= hi; j++)
      if (p->rc_op[j]) {
        p->t_r[j] = (int16_t)t++;
        if (dp__relu_fused(p, j + 1)) p->t_r[j + 1] = p->t_r[j];
      }
    for (int j = hi; j >= p->seg_lo[hi]; j--) p->t_b[j] = (int16_t)t++;
  }
  p->t_end = t;
}

bool dp__recompute_op(const dp_plan *p, int j) { return p->rc_op[j]; }

/* The last reads of layer i's output (i owns its buffer, e is the last view
 * of it): *fwd the last forward reader, *bwd the last read in the backward's
 * pass (a recompute or a backward; -1: none). */
static void output_reads(const dp_plan *p, int i, int e, int *fwd, int *bwd) {
  const dp_model *m = &p->model;
  bool train = !p->cfg.inference;
  int L = m->n_layers;
  *fwd = -1;
  *bwd = -1;
  if (train && dp__layer_needs_output(&m->layers[i])) *bwd = p->t_b[i];
  /* its readers: the layer after its views, and after those of shortcuts that
   * view it (g's first layer reads the block's input x) */
  for (int s = e; s < L; s++) {
    if (s > e && !(m->layers[s].kind == DP_LAYER_SHORTCUT && dp__act_owner(m, s) == i))
      continue;
    int v = s;
    while (v + 1 < L && dp__views_prev(m, v + 1)) v++;
    int reader = v + 1;
    if (reader > *fwd) *fwd = reader;
    if (p->t_r[reader] > *bwd) *bwd = p->t_r[reader];
    if (train && dp__layer_needs_input(&m->layers[reader]) && p->t_b[reader] > *bwd)
      *bwd = p->t_b[reader];
  }
  /* the input of residual blocks (f's output, with a shortcut): read again by
   * their ends' forwards */
  for (int k = e + 1; k < L; k++)
    if (m->layers[k].kind == DP_LAYER_RESIDUAL_END && dp__skip_owner(m, k) == i) {
      if (k > *fwd) *fwd = k;
      if (p->t_r[k] > *bwd) *bwd = p->t_r[k];
    }
}

/* Adds buffer (kind, i) of [first, last] to b, who (n) unless it is 0 bytes
 * of a kind that is optional. false: overflow. */
static bool add_buf(const dp_plan *p, int d, int kind, int i, int first, int last,
                    dp_live_buf *b, int *who, int *n) {
  b[*n] = (dp_live_buf){.align = p->align, .first = first, .last = last};
  if (!act_bytes(p, d, kind, i, &b[*n].size)) return false;
  who[(*n)++] = kind * p->model.n_layers + i;
  return true;
}

/* The layers whose backward first writes (*w) and last reads (*r) the
 * gradient of layer i's output (e: its last view): the reader's, then this
 * layer's. */
static void dact_users(const dp_model *m, bool relu_bwd_fused, int i, int e, int *w,
                       int *r) {
  int L = m->n_layers, reader = e + 1;
  *w = reader;
  *r = i;
  /* a residual end's output gradient reaches its block's input too: the
   * begin's backward adds it, after the block's layers (with a shortcut the
   * end copies it to f's output gradient, and the begin adds g's input
   * gradient, the shortcut's, instead) */
  int b = m->layers[i].link;
  if ((m->layers[i].kind == DP_LAYER_RESIDUAL_END && dp__block_shortcut(m, b) < 0) ||
      m->layers[i].kind == DP_LAYER_SHORTCUT)
    *r = b;
  /* f's output gradient: written by its block's end's backward */
  if (reader < L && m->layers[reader].kind == DP_LAYER_SHORTCUT)
    *w = m->layers[m->layers[reader].link].link;
  /* a relu whose backward runs in the next linear's grad-input product: the
   * relu's input gradient is written there, and its output gradient is never
   * made */
  if (relu_bwd_fused) *w = reader + 1;
}

/* The next sync batchnorm at or below layer i, or -1. */
static int sync_at_or_below(const dp_plan *p, int i) {
  while (i >= 0 && !dp__bn_sync(p, i)) i--;
  return i;
}

bool dp__leaf_slots(const dp_plan *p) {
  const dp_model *m = &p->model;
  if (p->cfg.inference || p->cfg.batchnorm != DP_BN_SYNC) return false;
  bool tied = false, bn = false;
  for (int i = 0; i < m->n_layers; i++) {
    tied |= m->layers[i].kind == DP_LAYER_LINEAR && m->layers[i].tied;
    bn |= m->layers[i].kind == DP_LAYER_BATCHNORM;
  }
  return tied && bn;
}

bool dp__dact_all(const dp_plan *p, int o) {
  const dp_model *m = &p->model;
  int L = m->n_layers;
  if (p->cfg.inference || p->cfg.batchnorm != DP_BN_SYNC) return false;
  o = dp__grad_owner(m, o);
  if (o < 0 || o >= L - 1) return false;
  int e = o, w, r;
  while (e + 1 < L && dp__views_prev(m, e + 1)) e++;
  dact_users(m, dp__relu_bwd_fused(p, e + 1), o, e, &w, &r);
  /* a sync batchnorm in [r, w): the backward stops there between them */
  return sync_at_or_below(p, w - 1) >= r;
}

/* The first time of the backward segment that runs layer w's backward: the
 * segments end at sync batchnorms, so its top is the lowest one at or above w
 * (whose backward opens it) or the last layer, and its first op that top's
 * recompute segment's first recompute, or the top's backward. */
static int bwd_segment_start(const dp_plan *p, int w) {
  int L = p->model.n_layers, top = w;
  while (top < L - 1 && !dp__bn_sync(p, top)) top++;
  int t = p->t_b[top];
  for (int j = p->seg_lo[top]; j <= top; j++)
    if (p->t_r[j] >= 0 && p->t_r[j] < t) t = p->t_r[j];
  return t;
}

/* The gradient of layer i's output (e: its last view), per micro-batch: from
 * the writer's backward to the last reader's. One that a sync batchnorm's
 * backward segments cut (dp__dact_all: the batchnorm's own, a residual
 * block's skip gradient past one) holds all rows: the backward runs in
 * segments between sync batchnorms, each micro-batch through all of a
 * segment's layers before the next, so it lives from the start of its
 * writer's segment (the segments above it are done with every micro-batch
 * by then) to the end of its last reader's (the next sync batchnorm's
 * backward, or the end). */
static dp_live_buf dact_live(const dp_plan *p, int i, int e, int n_mb) {
  int w, r;
  dact_users(&p->model, dp__relu_bwd_fused(p, e + 1), i, e, &w, &r);
  dp_live_buf b = {.align = p->align, .first = p->t_b[w], .last = p->t_b[r]};
  if (dp__dact_all(p, i) && n_mb > 1) {
    int below = sync_at_or_below(p, r - 1);
    b.first = bwd_segment_start(p, w);
    b.last = below >= 0 ? p->t_b[below] : p->t_end;
  }
  return b;
}

/* The activation buffers of device d with their sizes and lifetimes (offsets
 * not set): b[k] is buffer who[k] = kind * L + layer (kind 0: output, 1: saved
 * statistics, 2: output gradient, 3, 4: the recompute's output and
 * statistics), *n of them. With several micro-batches per device, the
 * backward runs micro-batch by micro-batch, so a buffer of all of them that
 * the backward reads stays live to the end; and the forward of a segment of
 * several layers (config.recompute) too, so such a buffer is live over the
 * whole of each segment that uses it. */
dp_status dp__act_buffers(const dp_plan *p, int d, dp_live_buf b[DP_ACT_BUFS],
                          int who[DP_ACT_BUFS], int *n_out) {
  const dp_model *m = &p->model;
  int L = m->n_layers, T = p->t_end, n = 0;
  bool train = !p->cfg.inference;
  int n_mb = p->split.dev_mb0[d + 1] - p->split.dev_mb0[d];
  bool many = n_mb > 1;
  *n_out = 0;
  for (int i = 0; i < L; i++) {
    const dp_layer *l = &m->layers[i];
    if (dp__layer_is_view(m, i)) { /* in its owner's buffers (below) */
      size_t g;
      if (!act_bytes(p, d, 2, i, &g)) return OVERFLOW();
      if (g) { /* a shortcut's gradient, its own */
        int e = i;
        while (e + 1 < L && dp__views_prev(m, e + 1)) e++;
        b[n] = dact_live(p, i, e, n_mb);
        b[n].size = g;
        who[n++] = 2 * L + i;
      }
      continue;
    }
    /* layers i+1 .. e view this output (flatten): it lives for them too */
    int e = i;
    while (e + 1 < L && dp__views_prev(m, e + 1)) e++;
    bool rc = p->rc[i];
    int w0 = dp__relu_fused(p, i) ? i - 1 : i; /* whose forward writes it */
    if (i < L - 1) {
      int fwd, bwd;
      output_reads(p, i, e, &fwd, &bwd);
      /* a recomputed output, one micro-batch: in the forward up to its
       * readers in the segment, in the backward from its recompute */
      if (rc && !add_buf(p, d, 0, i, w0, fwd, b, who, &n)) return OVERFLOW();
      if (p->rc[i] == 1 &&
          !add_buf(p, d, 3, i, p->t_r[w0], bwd > p->t_r[w0] ? bwd : p->t_r[w0], b, who, &n))
        return OVERFLOW();
      /* With a backend that fuses a linear and the relu after it, the linear
       * writes the relu's output (live from the linear's forward on) and has
       * none of its own. */
      if (!rc && !dp__relu_fused(p, i + 1)) {
        int last = bwd >= 0 ? (many ? T : bwd) : many ? p->seg_hi[fwd] : fwd;
        if (!add_buf(p, d, 0, i, many ? p->seg_lo[w0] : w0, last, b, who, &n))
          return OVERFLOW();
      }
      if (train && !dp__relu_bwd_fused(p, i)) {
        b[n] = dact_live(p, i, e, n_mb);
        if (!act_bytes(p, d, 2, i, &b[n].size)) return OVERFLOW();
        who[n++] = 2 * L + i;
      }
    }
    size_t st;
    if (!act_bytes(p, d, 1, i, &st)) return OVERFLOW();
    if (st && rc && dp__layer_stats_width(l)) {
      /* the forward's is read by nothing; the recompute's by the backward
       * (batchnorm's area is kept: the recompute writes the same statistics) */
      if (!add_buf(p, d, 1, i, i, i, b, who, &n) ||
          !add_buf(p, d, 4, i, p->t_r[i], p->t_b[i], b, who, &n))
        return OVERFLOW();
    } else if (st) {
      /* batchnorm: each micro-batch's statistics (or the whole batch's), read by
       * the backward and, micro-batch 0's, by the running-statistics update in
       * the commit phase (to the end) */
      bool bn = l->kind == DP_LAYER_BATCHNORM;
      b[n] = (dp_live_buf){.align = p->align,
                           .size = st,
                           .first = many && train ? p->seg_lo[i] : i,
                           .last = bn      ? T
                                   : train ? (many ? T : p->t_b[i])
                                           : i};
      who[n++] = 1 * L + i;
    }
  }
  *n_out = n;
  return DP_OK;
}

/* Activation buffers of device d, placed by liveness. */
static dp_status plan_activations(dp_plan *p, int d, size_t *total) {
  const dp_model *m = &p->model;
  dp_act_layout *a = &p->act[d];
  int L = m->n_layers, n;
  dp_live_buf b[DP_ACT_BUFS];
  int who[DP_ACT_BUFS];
  for (int i = 0; i < L; i++)
    a->act[i] = a->stats[i] = a->dact[i] = a->rc_act[i] = a->rc_stats[i] = SIZE_MAX;
  dp_status s = dp__act_buffers(p, d, b, who, &n);
  if (!s) s = dp__live_place(b, n, total);
  if (s) return s;
  for (int k = 0; k < n; k++) {
    int kind = who[k] / L, i = who[k] % L;
    size_t *dst = kind == 0   ? a->act
                  : kind == 1 ? a->stats
                  : kind == 2 ? a->dact
                  : kind == 3 ? a->rc_act
                              : a->rc_stats;
    dst[i] = b[k].offset;
  }
  for (int i = 0; i < L; i++) /* a view's buffers are its owner's (none: the input's) */
    if (dp__layer_is_view(m, i)) {
      int o = dp__act_owner(m, i), g = dp__grad_owner(m, i);
      a->act[i] = o >= 0 ? a->act[o] : SIZE_MAX;
      if (g != i) a->dact[i] = g >= 0 ? a->dact[g] : SIZE_MAX;
    }
  return DP_OK;
}

/* A reduction step between devices of one process, on a backend whose own
 * transport adds in place (schedule.c: reduce_copy). */
bool dp__copy_adds(const dp_config *c, int dst, int src) {
  return dp__backend_ops(c->backend)->transport->copy_add &&
         dp__rank_of(c, dst) == dp__rank_of(c, src);
}

/* Whether classic mode's reduction copies another device's gradients into
 * device d's comm region (a sender in another process, or a transport
 * without copy_add). */
static bool reduce_receives(const dp_config *c, int d, int n_used) {
  for (int dist = 1; dist < n_used; dist *= 2)
    if (d % (2 * dist) == 0 && d + dist < n_used && !dp__copy_adds(c, d, d + dist))
      return true;
  return false;
}

/* Allreduce mode's receive buffer on device d: the largest half it keeps at a
 * level whose partner's half crosses through a copy (dp__copy_adds). */
static size_t halving_receives(const dp_config *c, size_t n_params, int d, int n_used) {
  size_t most = 0;
  for (int l = 0; (1 << l) < n_used; l++) {
    size_t lo, hi;
    dp__ar_segment(n_params, l + 1, d, &lo, &hi);
    if (!dp__copy_adds(c, d, d ^ (1 << l)) && hi - lo > most) most = hi - lo;
  }
  return most * 4;
}

bool dp__wire_bf16(const dp_config *c, int dst, int src) {
  return c->reduce_precision == DP_PRECISION_BF16 && !c->inference &&
         !dp__copy_adds(c, dst, src);
}

/* config.reduce_precision bf16: the floats device d receives and packs to
 * send, at most, in the reduction's transfers that carry bf16 (dp__wire_bf16),
 * as schedule.c emits them: the tree to device 0 (classic, and allreduce with
 * a device count not a power of two, which then sends every device its
 * range from device 0), or the halving and, unless the optimizer is sharded,
 * the doubling. */
static void wire_floats(const dp_plan *p, int d, int n, size_t *recv, size_t *send) {
  const dp_config *c = &p->cfg;
  size_t P = p->model.n_params, lo, hi;
  *recv = *send = 0;
#define MOST(x, v) ((x) = (v) > (x) ? (v) : (x))
  if (c->mode != DP_MODE_CLASSIC && dp__is_pow2(n)) {
    for (int l = 0; (1 << l) < n; l++) {
      int q = d ^ (1 << l);
      if (!dp__wire_bf16(c, d, q)) continue;
      dp__ar_segment(P, l + 1, d, &lo, &hi); /* kept: received, then sent back */
      MOST(*recv, hi - lo);
      if (!c->shard_optimizer) MOST(*send, hi - lo);
      dp__ar_segment(P, l + 1, q, &lo, &hi); /* the partner's: sent, then received */
      MOST(*send, hi - lo);
      if (!c->shard_optimizer) MOST(*recv, hi - lo);
    }
    return;
  }
  for (int dist = 1; dist < n; dist *= 2) {
    if (d % (2 * dist) == 0 && d + dist < n && dp__wire_bf16(c, d, d + dist))
      MOST(*recv, P);
    if (d % (2 * dist) == dist && dp__wire_bf16(c, d - dist, d)) MOST(*send, P);
  }
  if (c->mode != DP_MODE_CLASSIC)
    for (int q = 1; q < n; q++)
      if (dp__wire_bf16(c, q, 0)) {
        if (d == 0) MOST(*send, P);
        if (d == q) MOST(*recv, p->opt_len[q]);
      }
#undef MOST
}

/* Device d's comm region: what it receives of other devices' gradients (fp32,
 * or bf16 then what it packs to send), or nothing when every step of its
 * reduction adds in place. */
static bool comm_bytes(dp_plan *p, int d, size_t *bytes) {
  const dp_config *c = &p->cfg;
  int n_used = p->split.n_used;
  size_t P = p->model.n_params * 4;
  *bytes = 0;
  p->wire_send[d] = 0;
  if (p->features & DP_FEATURE_COLLECTIVE) return true; /* summed in place */
  if (c->reduce_precision == DP_PRECISION_BF16) {
    size_t recv, send;
    wire_floats(p, d, n_used, &recv, &send);
    if (!send) return (*bytes = recv * 2), true;
    return dp__align_up(recv * 2, p->align, &p->wire_send[d]) &&
           dp__add(p->wire_send[d], send * 2, bytes);
  }
  if (c->mode != DP_MODE_CLASSIC && dp__is_pow2(n_used) && n_used > 1)
    *bytes = halving_receives(c, p->model.n_params, d, n_used);
  else if (reduce_receives(c, d, n_used))
    *bytes = P;
  return true;
}

static dp_status plan_device(dp_plan *p, int d) {
  const dp_model *m = &p->model;
  const dp_config *c = &p->cfg;
  bool train = !c->inference, dev0 = d == 0;
  int in = m->input_width, out = dp_model_output_width(m);
  size_t B = (size_t)c->batch, P, sz[DP_REGION_COUNT] = {0};
  dp_act_layout *a = &p->act[d];
  int mb0 = p->split.dev_mb0[d], mb1 = p->split.dev_mb0[d + 1];
  a->rows = 0;
  a->mb_rows = 0;
  for (int k = mb0; k < mb1; k++) {
    a->rows += p->mbs[k].rows;
    if (p->mbs[k].rows > a->mb_rows) a->mb_rows = p->mbs[k].rows;
  }
  size_t rows = (size_t)a->rows;
  if (!dp__mul(m->n_params, 4, &P)) return OVERFLOW();
  p->grad_levels[d] = !train              ? 0
                      : dp__leaf_slots(p) ? (mb1 - mb0 > 1 ? mb1 - mb0 - 1 : 0)
                                          : tree_levels(mb1 - mb0);
  /* the parameters, then the buffers (batchnorm's running statistics): the
   * broadcast carries both, the optimizer and the gradients only the first */
  if (dp__param_home(p, d) == d && !mul3(dp__param_floats(m), 1, 4, &sz[DP_REGION_PARAMS]))
    return OVERFLOW();
  if (!rows_bytes(p, d, in, 4, &sz[DP_REGION_INPUTS]) ||
      !rows_bytes(p, d, out, 4, &sz[DP_REGION_OUTPUTS]))
    return OVERFLOW();
  if (train) {
    bool classic = c->mode == DP_MODE_CLASSIC;
    size_t tw = (size_t)dp_model_target_width(m); /* target elements per row */
    sz[DP_REGION_GRADS] = P;
    size_t stride = 0; /* each partial at the alignment unit: see dp__partial_stride */
    if (!dp__align_up(P, p->align, &stride) ||
        !dp__mul((size_t)p->grad_levels[d], stride, &sz[DP_REGION_GRAD_PARTIALS]))
      return OVERFLOW();
    sz[DP_REGION_OUTPUT_GRADS] = sz[DP_REGION_OUTPUTS];
    /* the optimizer's state vectors, then (config.accumulate) the partial sums
     * of the accumulation, one per level of its pairwise tree */
    int k = dp__cfg_state_vectors(c) + dp__accum_levels(c);
    if (!mul3((size_t)k, p->opt_len[d], 4, &sz[DP_REGION_OPT_STATE])) return OVERFLOW();
    int n_used = p->split.n_used;
    if (!comm_bytes(p, d, &sz[DP_REGION_COMM])) return OVERFLOW();
    /* clipping: the norm's bins after the reduction (the comm region is free
     * then), one slot per device with a sharded optimizer (each sums its
     * shard; the slots are then exchanged), else one */
    if (c->clip_grad_norm > 0 && (dev0 || !classic)) {
      size_t slots = !classic && c->shard_optimizer ? (size_t)n_used : 1;
      if (sz[DP_REGION_COMM] < slots * DP_NORM_BINS_BYTES)
        sz[DP_REGION_COMM] = slots * DP_NORM_BINS_BYTES;
    }
    if (classic && dev0) {
      if (!mul3(B, tw, 4, &sz[DP_REGION_TARGETS])) return OVERFLOW();
      if (!mul3(B, (size_t)out, 4, &sz[DP_REGION_GATHERED_OUTPUTS])) return OVERFLOW();
      sz[DP_REGION_GATHERED_GRADS] = sz[DP_REGION_GATHERED_OUTPUTS];
    }
    if (!classic && !mul3(rows, tw, 4, &sz[DP_REGION_TARGETS])) return OVERFLOW();
    /* per-micro-batch loss sums: device 0 collects all of them */
    if (dev0)
      sz[DP_REGION_LOSS] = (size_t)p->split.n_mb * 4;
    else if (!classic)
      sz[DP_REGION_LOSS] = (size_t)(mb1 - mb0) * 4;
  }
  /* the activations first: a backend may size its workspace from the ops'
   * operands (the cpu backend's bf16 shadow area: lib/cpu/mixed.c) */
  dp_status s = plan_activations(p, d, &sz[DP_REGION_ACTIVATIONS]);
  if (s) return s;
  sz[DP_REGION_WORKSPACE] = dp__backend_ops(c->backend)->workspace_bytes(p, d);
  /* Guards (config.guards): one alignment unit before the first region and
   * after every region, empty ones included; the guard after a region is all
   * of [content end, next region), padding included (ctx.c checks exactly
   * that span). Without guards this is the plain aligned layout. */
  size_t guard = c->guards ? p->align : 0, cur = guard;
  for (int r = 0; r < DP_REGION_COUNT; r++) {
    if (!dp__align_up(cur, p->align, &cur)) return OVERFLOW();
    p->regions[d][r] = (dp_region_info){.offset = cur, .size = sz[r], .align = p->align};
    if (!dp__add(cur, sz[r], &cur) || !dp__add(cur, guard, &cur)) return OVERFLOW();
  }
  if (!dp__align_up(cur, p->align, &p->dev_bytes[d])) return OVERFLOW();
  return DP_OK;
}

/* The host staging arena, for backends that stage the caller's data
 * (backend.host_staging; the cpu backend reads the caller's memory directly):
 * inputs, targets, outputs, each aligned. */
static dp_status plan_host(dp_plan *p) {
  p->host_bytes = p->host_x = p->host_t = p->host_y = 0;
  if (!dp__backend_ops(p->cfg.backend)->host_staging) return DP_OK;
  const dp_model *m = &p->model;
  size_t B = (size_t)p->cfg.batch, x, t = 0, y, cur = 0;
  int out = dp_model_output_width(m);
  if (!mul3(B, (size_t)m->input_width, 4, &x) || !mul3(B, (size_t)out, 4, &y))
    return OVERFLOW();
  if (!p->cfg.inference && !mul3(B, (size_t)dp_model_target_width(m), 4, &t))
    return OVERFLOW();
  size_t parts[3] = {x, t, y}, *at[3] = {&p->host_x, &p->host_t, &p->host_y};
  for (int i = 0; i < 3; i++) {
    if (!dp__align_up(cur, p->align, &cur)) return OVERFLOW();
    *at[i] = cur;
    if (!dp__add(cur, parts[i], &cur)) return OVERFLOW();
  }
  if (!dp__align_up(cur, p->align, &p->host_bytes)) return OVERFLOW();
  return DP_OK;
}

void dp_plan_free(dp_plan *p) {
  if (!p) return;
  free(p->mbs);
  free(p->ops);
  free(p);
}

/* Which parameters each device keeps optimizer state for (see internal.h). */
static void plan_opt_ranges(dp_plan *p) {
  size_t P = p->model.n_params;
  int n = p->split.n_used;
  for (int d = 0; d < DP_MAX_DEVICES; d++) p->opt_off[d] = p->opt_len[d] = 0;
  if (p->cfg.inference) return;
  for (int d = 0; d < n; d++) {
    size_t lo = 0, hi = P;
    if (p->cfg.mode == DP_MODE_CLASSIC) {
      hi = d == 0 ? P : 0;
    } else if (p->cfg.shard_optimizer && dp__is_pow2(n)) {
      int levels = 0;
      while ((1 << levels) < n) levels++;
      dp__ar_segment(P, levels, d, &lo, &hi); /* where the reduce-scatter leaves it */
    } else if (p->cfg.shard_optimizer) {
      lo = (size_t)d * (P / n) + (size_t)(d < (int)(P % n) ? d : (int)(P % n));
      hi = lo + P / n + (d < (int)(P % n));
    }
    p->opt_off[d] = lo;
    p->opt_len[d] = hi - lo;
  }
}

/* Split with device 0 taking `first` items (memory policy), then lay out
 * every device. */
static dp_status plan_devices(dp_plan *p, int first) {
  dp_status s = dp__split(&p->cfg, p->cfg.batch, first, &p->split, p->mbs);
  if (s) return s;
  plan_opt_ranges(p);
  for (int d = 0; d < p->split.n_used; d++)
    if ((s = plan_device(p, d))) return s;
  return DP_OK;
}

static size_t largest_other(const dp_plan *p) {
  size_t mx = 0;
  for (int d = 1; d < p->split.n_used; d++)
    mx = p->dev_bytes[d] > mx ? p->dev_bytes[d] : mx;
  return mx;
}

/* Memory policy: device 0's arena grows with its share, the others' shrink;
 * find the share where the larger of the two is smallest (ties: the larger
 * share, closer to an even split). */
static dp_status plan_memory_split(dp_plan *p) {
  int n = dp__split_items(&p->cfg, p->cfg.batch), N = p->cfg.n_devices;
  int lo = 1, hi = n / N + (n % N != 0);
  dp_status s;
  while (lo < hi) { /* smallest share where device 0 is the larger */
    int mid = lo + (hi - lo) / 2;
    if ((s = plan_devices(p, mid))) return s;
    if (p->dev_bytes[0] >= largest_other(p))
      hi = mid;
    else
      lo = mid + 1;
  }
  int best = lo;
  size_t best_peak = SIZE_MAX;
  for (int c0 = lo > 1 ? lo - 1 : lo; c0 <= lo; c0++) {
    if ((s = plan_devices(p, c0))) return s;
    size_t peak = p->dev_bytes[0] > largest_other(p) ? p->dev_bytes[0] : largest_other(p);
    if (peak <= best_peak) {
      best_peak = peak;
      best = c0;
    }
  }
  return plan_devices(p, best);
}

/* Everything but the schedule; `p` is zeroed by the caller. */
static dp_status plan_memory(dp_plan *p, const dp_model *m, const dp_config *c) {
  dp_status s = check_config(m, c, p->bopt);
  if (s) return s;
  p->model = *m;
  p->cfg = *c;
  const dp_backend_ops *be = dp__backend_ops(c->backend);
  p->features = be->features ? be->features(c, p->bopt) : 0;
  if ((p->features & DP_FEATURE_COLLECTIVE) && c->reduce_precision == DP_PRECISION_BF16 &&
      !c->inference)
    return DP_FAIL(DP_ERR_INVALID,
                   "reduce_precision bf16 sums the gradients along libdp's canonical "
                   "tree, and the %s backend's collectives (fast_collectives) sum them "
                   "in their own order: use one or the other",
                   be->name);
  if (p->features & DP_FEATURE_SHARED_PARAMS) {
    /* the backend's check_config refuses the option by its name; this
     * guards the plan of a backend that does not */
    if (!be->host_memory || (!c->inference && c->mode != DP_MODE_CLASSIC))
      return DP_FAIL(DP_ERR_INVALID,
                     "the %s backend's options share the parameters between its "
                     "devices, which needs host memory and classic mode or an inference "
                     "plan (in allreduce mode every replica updates its own copy)",
                     be->name);
    p->shared_params = true;
  }
  /* SGD with momentum keeps a buffer: one name for it from here on */
  if (p->cfg.optimizer == DP_OPT_SGD && p->cfg.momentum > 0)
    p->cfg.optimizer = DP_OPT_MOMENTUM;
  p->align = be->align;
  p->slice_align = be->slice_align;
  plan_segments(p);
  int max_mbs = dp__split_max_mbs(&p->cfg);
  /* The schedule has about 2 ops per layer per micro-batch (3 with
   * recompute), counted in int. */
  long long per_layer = c->recompute && !c->inference ? 3 : 2;
  long long ops = (long long)max_mbs * (per_layer * m->n_layers + 8) + 64LL * c->n_devices;
  if (c->reduce_precision == DP_PRECISION_BF16) /* the packs and unpacks */
    ops += 16LL * c->n_devices;
  if (max_mbs > DP_MAX_MICRO_BATCHES || ops > INT_MAX / 2)
    return DP_FAIL(DP_ERR_OVERFLOW,
                   "%d micro-batches of %d layers is too many to schedule (at most %d "
                   "micro-batches); use a larger micro-batch",
                   max_mbs, m->n_layers, DP_MAX_MICRO_BATCHES);
  p->mbs = malloc((size_t)max_mbs * sizeof *p->mbs);
  if (!p->mbs)
    return DP_FAIL(DP_ERR_NOMEM, "plan: out of memory for %d micro-batches", max_mbs);
  s = c->split == DP_SPLIT_MEMORY && c->n_devices > 1 ? plan_memory_split(p)
                                                      : plan_devices(p, 0);
  if (s) return s;
  return plan_host(p);
}

dp_status dp_plan_create(const dp_model *m, const dp_config *c, dp_plan **out) {
  if (!out) return DP_FAIL(DP_ERR_INVALID, "dp_plan_create: out is NULL");
  *out = NULL;
  if (!m || !c)
    return DP_FAIL(DP_ERR_INVALID, "dp_plan_create: model and config are required");
  dp_plan *p = calloc(1, sizeof *p);
  if (!p) return DP_FAIL(DP_ERR_NOMEM, "plan: out of memory");
  dp_status s = plan_memory(p, m, c);
  if (!s) {
    p->ops_cap = dp__schedule_cap(p);
    p->ops = malloc((size_t)p->ops_cap * sizeof *p->ops);
    if (!p->ops) s = DP_FAIL(DP_ERR_NOMEM, "plan: out of memory for %d ops", p->ops_cap);
  }
  if (!s)
    s = dp__schedule_build(p, p->mbs, !c->inference, p->ops, p->ops_cap, &p->n_ops,
                           &p->n_stages);
  if (s) {
    dp_plan_free(p);
    return s;
  }
  *out = p;
  return DP_OK;
}

static dp_status fits(const dp_model *m, const dp_config *c, int batch, size_t budget,
                      bool *ok) {
  dp_config cc = *c;
  cc.batch = batch;
  dp_plan *p = calloc(1, sizeof *p);
  if (!p) return DP_FAIL(DP_ERR_NOMEM, "plan: out of memory");
  dp_status s = plan_memory(p, m, &cc);
  *ok = false;
  if (s == DP_ERR_OVERFLOW) {
    s = DP_OK; /* too large to even count: it does not fit */
  } else if (!s) {
    *ok = p->host_bytes <= budget;
    for (int d = 0; d < p->split.n_used; d++)
      if (p->dev_bytes[d] > budget) *ok = false;
  }
  dp_plan_free(p);
  return s;
}

/* Largest batch in [lo, hi] that fits, given that the plan does not shrink as
 * the batch grows inside [lo, hi] and that lo fits. */
static dp_status largest_in_run(const dp_model *m, const dp_config *c, size_t budget,
                                int lo, int hi, int *out) {
  while (lo < hi) {
    int mid = (int)(lo + ((long long)hi - lo + 1) / 2); /* hi may be INT_MAX */
    bool ok;
    dp_status s = fits(m, c, mid, budget, &ok);
    if (s) return s;
    if (ok)
      lo = mid;
    else
      hi = mid - 1;
  }
  *out = lo;
  return DP_OK;
}

/* The plan does not grow with the batch everywhere: when a larger batch uses
 * more devices, the sharded optimizer state, the receive buffers and the
 * reduction tree of each device can shrink (allreduce). It grows inside each
 * run of batches that deal to the same devices (dp__split_run_end), so: the
 * runs from the largest down; the first whose smallest batch fits holds the
 * answer, found by bisection inside it. There are at most about N * N runs
 * below N * N items and one above. */
dp_status dp_plan_max_batch(const dp_model *m, const dp_config *c, size_t budget,
                            int max_batch, int *out_batch) {
  if (!m || !c || !out_batch)
    return DP_FAIL(DP_ERR_INVALID, "dp_plan_max_batch: NULL argument");
  if (max_batch < 1) return DP_FAIL(DP_ERR_INVALID, "max_batch must be >= 1");
  *out_batch = 0;
  dp_config cc = *c;
  cc.batch = 1;
  int opt[DP_MAX_BACKEND_OPTIONS];
  dp_status s = check_config(m, &cc, opt);
  if (s) return s;
  enum { MAX_RUNS = DP_MAX_DEVICES * DP_MAX_DEVICES + 2 };
  static _Thread_local int start[MAX_RUNS]; /* 16 KiB: kept off the stack */
  int n = 0;
  for (int b = 1;;) {
    if (n == MAX_RUNS) return DP_FAIL(DP_ERR_INVALID, "dp_plan_max_batch: too many runs");
    start[n++] = b;
    int e = dp__split_run_end(c, b);
    if (e >= max_batch) break;
    b = e + 1;
  }
  for (int k = n - 1; k >= 0; k--) {
    bool ok;
    if ((s = fits(m, c, start[k], budget, &ok))) return s;
    if (!ok) continue;
    int hi = k + 1 < n ? start[k + 1] - 1 : max_batch;
    return largest_in_run(m, c, budget, start[k], hi, out_batch);
  }
  return DP_OK;
}

int dp_plan_n_devices(const dp_plan *p) { return p ? p->split.n_used : 0; }
/* A batchnorm normalises each micro-batch (sync: the batch) with its own
 * statistics, and one value per channel has no variance (PyTorch refuses it
 * as well). A step of `rows` rows keeps the planned cut points
 * (dp__mb_rows_at, as the step's schedule cuts it). */
dp_status dp_plan_check_rows(const dp_plan *p, int rows) {
  if (!p) return DP_FAIL(DP_ERR_INVALID, "no plan");
  if (rows < 1 || rows > p->cfg.batch)
    return DP_FAIL(DP_ERR_RANGE, "%d rows: the plan takes 1 to %d (config.batch)", rows,
                   p->cfg.batch);
  if (p->cfg.inference) return DP_OK; /* its forward takes the running statistics */
  for (int i = 0; i < p->model.n_layers; i++) {
    const dp_layer *l = &p->model.layers[i];
    /* one value per channel and row: a flat input (a sequence has T) */
    if (l->kind != DP_LAYER_BATCHNORM || (l->h ? (size_t)l->h * l->w : 1) != 1 ||
        dp__bn_rows(l, 1) != 1)
      continue;
    if (dp__bn_sync(p, i)) {
      if (rows == 1)
        return DP_FAIL(DP_ERR_SHAPE,
                       "batchnorm (layer %d, sync) would normalise a batch of one row, one "
                       "value per channel (no variance); use a batch of 2 rows or more",
                       i);
      continue;
    }
    for (int k = 0; k < p->split.n_mb; k++) {
      if (dp__mb_rows_at(p, k, rows) == 1)
        return DP_FAIL(
            DP_ERR_SHAPE,
            "batchnorm (layer %d) would normalise micro-batch %d of one row, one "
            "value per channel (no variance); use micro-batches of 2 rows or "
            "more (config.micro_batch), or a batch that leaves no single row",
            i, k);
    }
  }
  return DP_OK;
}

int dp_plan_device_rows(const dp_plan *p, int d) {
  return p && d >= 0 && d < p->split.n_used ? p->act[d].rows : 0;
}
int dp_plan_device_micro_batches(const dp_plan *p, int d) {
  return p && d >= 0 && d < p->split.n_used ? p->split.dev_mb0[d + 1] - p->split.dev_mb0[d]
                                            : 0;
}
size_t dp_plan_device_bytes(const dp_plan *p, int d) {
  return p && d >= 0 && d < p->split.n_used ? p->dev_bytes[d] : 0;
}
dp_region_info dp_plan_region(const dp_plan *p, int d, dp_region r) {
  if (!p || d < 0 || d >= p->split.n_used || (unsigned)r >= DP_REGION_COUNT)
    return (dp_region_info){0};
  return p->regions[d][r];
}
size_t dp_plan_host_bytes(const dp_plan *p) { return p ? p->host_bytes : 0; }

/* ---- plan hashes: what every rank of a job must share ---- */
static uint64_t h_u64(uint64_t h, uint64_t v) { return dp__fnv1a(h, &v, sizeof v); }
static uint64_t h_f32(uint64_t h, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return h_u64(h, u);
}

void dp__plan_hashes(const dp_plan *p, uint64_t h[DP_PLAN_HASHES]) {
  /* field by field: struct padding is not part of a plan */
  const dp_model *m = &p->model;
  uint64_t x =
      h_u64(h_u64(h_u64(DP_FNV_INIT, (uint64_t)m->input_width), (uint64_t)m->n_layers),
            (uint64_t)m->loss);
  for (int i = 0; i < m->n_layers; i++) {
    const dp_layer *l = &m->layers[i];
    x = h_u64(h_u64(h_u64(h_u64(x, l->kind), (uint64_t)l->in), (uint64_t)l->out), l->bias);
    x = h_f32(x, l->p);
    int geo[] = {l->c, l->h, l->w, l->k, l->stride, l->pad}; /* image layers */
    for (size_t g = 0; g < sizeof geo / sizeof *geo; g++) x = h_u64(x, (uint64_t)geo[g]);
    /* sequences and other than the norms' defaults: only when set, so that
     * the hashes of other plans stay as they were */
    int seq[] = {l->t, l->vocab, l->heads, l->tied};
    for (size_t g = 0; g < sizeof seq / sizeof *seq; g++)
      if (seq[g]) x = h_u64(h_u64(x, 0x5100u + g), (uint64_t)seq[g]);
    if ((l->kind == DP_LAYER_LAYERNORM || l->kind == DP_LAYER_BATCHNORM) &&
        (l->eps != DP_NORM_EPS || (l->kind == DP_LAYER_BATCHNORM && l->momentum != 0.1))) {
      uint64_t mom;
      memcpy(&mom, &l->momentum, 8);
      x = h_u64(h_f32(h_u64(x, 0x6e6fu), l->eps), mom);
    }
    if (l->kind == DP_LAYER_LEAKY_RELU) x = h_f32(h_u64(x, 0x6c72u), l->slope);
    if (l->exclude_pad) x = h_u64(x, 0x6570u); /* only when set, as above (padding: geo) */
  }
  if (m->loss_param != 0.0f) x = h_f32(h_u64(x, 0x6c70u), m->loss_param); /* beta, delta */
  if (dp__ce_has_opts(m)) { /* only when set: plans without them hash as they did */
    x = h_f32(h_u64(x, 0x6365u), m->ce.smoothing);
    x = h_u64(h_u64(x, (uint64_t)m->ce.ignore), (uint64_t)(uint32_t)m->ce.ignore_index);
    x = h_u64(x, (uint64_t)m->ce.n_weights);
    for (int i = 0; i < m->ce.n_weights; i++) x = h_f32(x, m->ce.weights[i]);
  }
  if (m->n_pos_weight) { /* bce_with_logits' pos_weight: only when set, as above */
    x = h_u64(h_u64(x, 0x7077u), (uint64_t)m->n_pos_weight);
    for (int i = 0; i < m->n_pos_weight; i++) x = h_f32(x, m->pos_weight[i]);
  }
  h[0] = x;
  const dp_config *c = &p->cfg;
  x = DP_FNV_INIT;
  int64_t ints[] = {c->batch, c->n_devices, dp__ranks(c), dp__accumulate(c), c->split,
                    c->micro_batch, c->mode, c->shard_optimizer, c->optimizer, c->inference,
                    c->backend, c->nesterov, c->on_nonfinite, c->guards, c->timeout_ms,
                    /* the backend's options where the cuda fields were: the same hashes */
                    p->bopt[0], p->bopt[1], p->bopt[2], p->bopt[3], c->batchnorm};
  for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) x = h_u64(x, (uint64_t)ints[i]);
  if (c->recompute) /* only when set: the hashes of plans without it stay as they were */
    x = h_u64(h_u64(x, 0x7263u), (uint64_t)c->recompute);
  if (c->clip_grad_value > 0) /* the same */
    x = h_f32(h_u64(x, 0x6376u), c->clip_grad_value);
  if (dp__amsgrad(c)) x = h_u64(x, 0x616du);       /* the same */
  for (int i = 4; i < DP_MAX_BACKEND_OPTIONS; i++) /* a backend with more options */
    if (p->bopt[i]) x = h_u64(h_u64(x, (uint64_t)i), (uint64_t)p->bopt[i]);
  float fl[] = {c->lr,    c->momentum, c->dampening, c->weight_decay,
                c->beta1, c->beta2,    c->eps};
  for (size_t i = 0; i < sizeof fl / sizeof *fl; i++) x = h_f32(x, fl[i]);
  x = h_u64(x, c->seed);
  for (int d = 0; d < c->n_devices; d++) x = h_u64(x, (uint64_t)c->device_ids[d]);
  h[1] = x;
  x = DP_FNV_INIT;
  for (int k = 0; k < p->n_ops; k++) {
    const dp_op *o = &p->ops[k];
    int64_t f[] = {o->phase,
                   o->kind,
                   o->device,
                   o->layer,
                   o->micro_batch,
                   o->n_mb,
                   o->stage,
                   o->src_dev,
                   o->dst_dev,
                   o->src_region,
                   o->dst_region,
                   (int64_t)o->src_offset,
                   (int64_t)o->dst_offset,
                   (int64_t)o->bytes,
                   o->row0,
                   o->rows};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) x = h_u64(x, (uint64_t)f[i]);
  }
  for (int d = 0; d < p->split.n_used; d++) x = h_u64(x, p->dev_bytes[d]);
  h[2] = x;
  /* the build: version, compiler, the layout of what crosses processes */
  static const char build[] =
      "libdp " DP_STR(DP_VERSION_MAJOR) "." DP_STR(DP_VERSION_MINOR) " " __VERSION__;
  x = dp__fnv1a(DP_FNV_INIT, build, sizeof build - 1);
  h[3] = h_u64(h_u64(x, sizeof(dp_agreement)), sizeof(dp_op));
}

uint64_t dp_plan_hash(const dp_plan *p) {
  if (!p) return 0;
  uint64_t h[DP_PLAN_HASHES];
  dp__plan_hashes(p, h);
  return dp__fnv1a(DP_FNV_INIT, h, sizeof h);
}

size_t dp_plan_activation_bytes_unshared(const dp_plan *p, int dev) {
  if (!p || dev < 0 || dev >= p->split.n_used) return 0;
  const dp_model *m = &p->model;
  const dp_act_layout *a = &p->act[dev];
  size_t total = 0, al = p->align;
  for (int i = 0; i < m->n_layers; i++)
    for (int k = 0; k < 5; k++) {
      size_t sz;
      if ((k == 0   ? a->act
           : k == 1 ? a->stats
           : k == 2 ? a->dact
           : k == 3 ? a->rc_act
                    : a->rc_stats)[i] == SIZE_MAX ||
          !act_bytes(p, dev, k, i, &sz))
        continue;
      total += (sz + al - 1) / al * al;
    }
  return total;
}

int dp_plan_ranks(const dp_plan *p) { return p ? dp__ranks(&p->cfg) : 0; }
int dp_plan_local_devices(const dp_plan *p) {
  return p ? p->cfg.n_devices / dp__ranks(&p->cfg) : 0;
}
int dp_plan_device_rank(const dp_plan *p, int dev) {
  return p && dev >= 0 && dev < p->cfg.n_devices ? dp__rank_of(&p->cfg, dev) : -1;
}

dp_status dp_plan_rank_rows(const dp_plan *p, int rows, int rank, int *row0, int *n) {
  if (!p || !row0 || !n) return DP_FAIL(DP_ERR_INVALID, "dp_plan_rank_rows: NULL argument");
  if (rank < 0 || rank >= dp__ranks(&p->cfg))
    return DP_FAIL(DP_ERR_INVALID, "rank %d is outside 0..%d", rank,
                   dp__ranks(&p->cfg) - 1);
  if (rows < 1 || rows > p->cfg.batch)
    return DP_FAIL(DP_ERR_SHAPE, "a batch of %d rows is outside the planned 1..%d", rows,
                   p->cfg.batch);
  dp__rank_rows(p, rows, rank, row0, n);
  return DP_OK;
}

void dp__rank_rows(const dp_plan *p, int rows, int rank, int *row0, int *n) {
  /* A smaller batch keeps the planned cut points: micro-batches empty from
   * the end, so a rank's rows are its planned rows cut at `rows`. */
  int L = p->cfg.n_devices / dp__ranks(&p->cfg), d0 = rank * L, d1 = d0 + L;
  if (d0 > p->split.n_used) d0 = p->split.n_used;
  if (d1 > p->split.n_used) d1 = p->split.n_used;
  int lo = p->split.dev_row0[d0], hi = p->split.dev_row0[d1];
  if (lo > rows) lo = rows;
  if (hi > rows) hi = rows;
  *row0 = lo;
  *n = hi - lo;
}

size_t dp_plan_rank_bytes(const dp_plan *p, int rank) {
  if (!p || rank < 0 || rank >= dp__ranks(&p->cfg)) return 0;
  int L = p->cfg.n_devices / dp__ranks(&p->cfg);
  size_t total = 0;
  for (int d = rank * L; d < rank * L + L && d < p->split.n_used; d++)
    total += p->dev_bytes[d];
  return total;
}
size_t dp_plan_alignment(const dp_plan *p) { return p ? p->align : 0; }
const dp_config *dp_plan_config(const dp_plan *p) { return p ? &p->cfg : NULL; }
const dp_model *dp_plan_model(const dp_plan *p) { return p ? &p->model : NULL; }
int dp_plan_n_ops(const dp_plan *p) { return p ? p->n_ops : 0; }
const dp_op *dp_plan_ops(const dp_plan *p) { return p ? p->ops : NULL; }

/* The byte distance between partial-gradient slots in GRAD_PARTIALS: the gradient
 * size rounded up to the plan's alignment, so that every slot starts aligned. A GPU
 * GEMM picks its kernel by its operands' alignment; slots at n_params * 4 bytes apart
 * put a weight gradient at another alignment for another device count, and the bits
 * followed (issue 28, found by the CUDA simulation). */
size_t dp__partial_stride(const dp_plan *p) {
  size_t b = p->model.n_params * 4, a = b;
  return dp__align_up(b, p->align, &a) ? a : b;
}
