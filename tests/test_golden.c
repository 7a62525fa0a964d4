/* Golden tests: libdp against PyTorch reference data.
 *
 * tests/golden/<case>.bin are written by tools/golden/make_golden.py (format and
 * semantics in tools/golden/README.md). For each case the model, batch, initial
 * parameters and hyper-parameters come from the file; libdp must reproduce
 * PyTorch's loss, gradients, eval-mode outputs and the parameters after five
 * steps of SGD-momentum and of AdamW, and the same two trainings with gradient
 * clipping by global norm (config.clip_grad_norm against
 * torch.nn.utils.clip_grad_norm_), within the tolerance below. Only dp.h is
 * used. Paths are relative to the current directory (the repo root).
 *
 * Batch normalisation cases (bn_*) carry a micro_batch entry: libdp runs them
 * with config.micro_batch set to it, since per_replica batchnorm normalises
 * each micro-batch with its own statistics (PyTorch's reference does the
 * same), so the results are then the same for every device count and mode.
 * They also hold the running statistics (dp_get_running_stats) after every
 * step of each training and the eval-mode outputs after the two unclipped
 * trainings; the running means and variances are compared under the
 * tolerance below, the counts exactly.
 *
 * Tolerance, element-wise against a reference tensor `want`:
 *   |got - want| <= 1e-5 * (|want| + 0.1 * max|want|)
 * The second term keeps elements much smaller than the tensor's largest (the
 * result of cancellation, whose float32 rounding error scales with the terms
 * summed, not with the result) from failing for rounding alone. The generator
 * checks that PyTorch's float32 results are within 10% of this tolerance of a
 * float64 rerun, so an independent float32 implementation has ample room.
 */
#include "dp.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef GOLDEN_RTOL
#define GOLDEN_RTOL 1e-5
#endif
#define GOLDEN_FLOOR 1e-1
#define GOLDEN_STEPS 5

/* ---- reader ----------------------------------------------------------------- */

enum { GT_F32 = 0, GT_I32 = 1, GT_TEXT = 2 };
#define GOLDEN_MAX_ENTRIES 64
#define GOLDEN_MAX_DIMS 4

typedef struct {
  char name[64];
  uint32_t dtype;
  uint32_t ndim;
  uint32_t dims[GOLDEN_MAX_DIMS];
  size_t count; /* elements (text: bytes) */
  void *data;   /* f32: float[count]; i32: int32_t[count]; text: NUL-terminated */
} golden_entry;

typedef struct {
  char case_name[64];
  int n;
  golden_entry e[GOLDEN_MAX_ENTRIES];
} golden;

typedef struct {
  const unsigned char *p;
  size_t len, off;
} cursor;

static int take_u32(cursor *c, uint32_t *v) {
  if (c->len - c->off < 4) return 0;
  const unsigned char *b = c->p + c->off;
  *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
  c->off += 4;
  return 1;
}

static void golden_free(golden *g) {
  for (int i = 0; i < g->n; i++) free(g->e[i].data);
  g->n = 0;
}

/* Reads tests/golden/<case>.bin; fails the running test on any error. */
static void golden_load(golden *g, const char *case_name) {
  char path[256];
  snprintf(path, sizeof path, "tests/golden/%s.bin", case_name);
  memset(g, 0, sizeof *g);
  snprintf(g->case_name, sizeof g->case_name, "%s", case_name);

  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL,
                "%s: cannot open (run from the repo root; regenerate with "
                "tools/golden/make_golden.py)",
                path);
  ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
  long size = ftell(f);
  ck_assert_msg(size > 0, "%s: empty or unreadable", path);
  ck_assert_int_eq(fseek(f, 0, SEEK_SET), 0);
  unsigned char *buf = malloc((size_t)size);
  ck_assert_ptr_nonnull(buf);
  size_t got = fread(buf, 1, (size_t)size, f);
  fclose(f);
  ck_assert_msg(got == (size_t)size, "%s: short read", path);

  cursor c = {buf, (size_t)size, 0};
  ck_assert_msg(c.len >= 8 && memcmp(buf, "DPGOLD\0\0", 8) == 0, "%s: bad magic", path);
  c.off = 8;
  uint32_t version, n;
  ck_assert_msg(take_u32(&c, &version) && version == 1, "%s: unsupported version", path);
  ck_assert_msg(take_u32(&c, &n) && n <= GOLDEN_MAX_ENTRIES, "%s: bad entry count", path);
  for (uint32_t k = 0; k < n; k++) {
    golden_entry *e = &g->e[g->n];
    uint32_t name_len;
    ck_assert_msg(take_u32(&c, &name_len) && name_len < sizeof e->name &&
                      c.len - c.off >= name_len,
                  "%s: entry %u: bad name", path, (unsigned)k);
    memcpy(e->name, buf + c.off, name_len);
    e->name[name_len] = '\0';
    c.off += name_len;
    ck_assert_msg(take_u32(&c, &e->dtype) && e->dtype <= GT_TEXT, "%s: %s: bad dtype", path,
                  e->name);
    ck_assert_msg(take_u32(&c, &e->ndim) && e->ndim >= 1 && e->ndim <= GOLDEN_MAX_DIMS,
                  "%s: %s: bad ndim", path, e->name);
    size_t count = 1;
    for (uint32_t d = 0; d < e->ndim; d++) {
      ck_assert_msg(take_u32(&c, &e->dims[d]), "%s: %s: truncated dims", path, e->name);
      count *= e->dims[d];
    }
    ck_assert_msg(count < ((size_t)1 << 28), "%s: %s: too large", path, e->name);
    e->count = count;
    size_t esize = e->dtype == GT_TEXT ? 1 : 4;
    ck_assert_msg(c.len - c.off >= count * esize, "%s: %s: truncated payload", path,
                  e->name);
    if (e->dtype == GT_TEXT) {
      char *t = malloc(count + 1);
      ck_assert_ptr_nonnull(t);
      memcpy(t, buf + c.off, count);
      t[count] = '\0';
      e->data = t;
      c.off += count;
    } else {
      uint32_t *a = malloc((count ? count : 1) * sizeof *a);
      ck_assert_ptr_nonnull(a);
      for (size_t i = 0; i < count; i++) take_u32(&c, &a[i]);
      e->data = a; /* same size and representation as float / int32_t */
    }
    g->n++;
  }
  ck_assert_msg(c.off == c.len, "%s: trailing bytes", path);
  free(buf);
}

static const golden_entry *golden_get(const golden *g, const char *name, uint32_t dtype) {
  for (int i = 0; i < g->n; i++)
    if (strcmp(g->e[i].name, name) == 0) {
      ck_assert_msg(g->e[i].dtype == dtype, "%s: entry '%s' has dtype %u, expected %u",
                    g->case_name, name, (unsigned)g->e[i].dtype, (unsigned)dtype);
      return &g->e[i];
    }
  ck_abort_msg("%s: no entry '%s'", g->case_name, name);
  return NULL;
}

/* The entry, or NULL when the file has none of that name (entries only some
 * cases carry, such as micro_batch). */
static const golden_entry *golden_find(const golden *g, const char *name, uint32_t dtype) {
  for (int i = 0; i < g->n; i++)
    if (strcmp(g->e[i].name, name) == 0) return golden_get(g, name, dtype);
  return NULL;
}

static const float *golden_f32(const golden *g, const char *name, size_t *n) {
  const golden_entry *e = golden_get(g, name, GT_F32);
  if (n) *n = e->count;
  return e->data;
}

static const int32_t *golden_i32(const golden *g, const char *name, size_t *n) {
  const golden_entry *e = golden_get(g, name, GT_I32);
  if (n) *n = e->count;
  return e->data;
}

/* ---- comparison ------------------------------------------------------------- */

/* Fails with the worst element (by |diff| / allowed) when any is out of tolerance. */
static void check_close(const char *case_name, const char *what, const float *got,
                        const float *want, size_t n) {
  double maxabs = 0.0;
  for (size_t i = 0; i < n; i++)
    if (fabs((double)want[i]) > maxabs) maxabs = fabs((double)want[i]);
  double floor_abs = GOLDEN_FLOOR * maxabs;
  size_t worst = 0, bad = 0;
  double worst_ratio = -1.0;
  for (size_t i = 0; i < n; i++) {
    double diff = fabs((double)got[i] - (double)want[i]);
    double allowed = GOLDEN_RTOL * (fabs((double)want[i]) + floor_abs);
    double ratio;
    if (isnan(diff))
      ratio = INFINITY;
    else if (allowed > 0.0)
      ratio = diff / allowed;
    else
      ratio = diff > 0.0 ? INFINITY : 0.0;
    if (ratio > 1.0) bad++;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  ck_assert_msg(bad == 0,
                "%s: %s: %zu of %zu elements outside tolerance; worst [%zu] got %.9g want "
                "%.9g (|diff| %.3g, allowed %.3g)",
                case_name, what, bad, n, worst, (double)got[worst], (double)want[worst],
                fabs((double)got[worst] - (double)want[worst]),
                GOLDEN_RTOL * (fabs((double)want[worst]) + floor_abs));
}

static void check_scalar(const char *case_name, const char *what, float got, float want) {
  check_close(case_name, what, &got, &want, 1);
}

/* ---- setting up libdp from a case -------------------------------------------- */

/* cnn_*: the image layers (conv2d with stride, padding, even and 1x1 kernels and
 * no bias; overlapping and gapped max/avg pooling in floor mode; flatten first,
 * in the middle and last; dropout on an image), odd non-square inputs and a
 * short last chunk, under the same tolerance as the MLPs. bn_*: batchnorm,
 * per_replica, with the file's micro-batch size: 1d in an MLP (bn_mlp), 2d
 * after a conv (bn_cnn), both in one model with a short last micro-batch
 * (bn_two). See tools/golden/README.md. */
static const char *const golden_cases[] = {
    "seed",    "b31n2",   "b3n4",     "mlp_all",           "mlp_mse_b37n3",
    "cnn_all", "cnn_mse", "cnn_tail", "cnn_flatten_first", "cnn_dropout",
    "bn_mlp",  "bn_cnn",  "bn_two"};
#define N_GOLDEN_CASES ((int)(sizeof golden_cases / sizeof golden_cases[0]))

typedef struct {
  golden g;
  dp_model *model;
  dp_plan *plan;
  dp_ctx *ctx;
  int batch, in_width;
  int micro_batch; /* the file's micro_batch (bn_* cases), else 0 */
  size_t n_params;
  const float *x;
  const void *target;
} golden_run;

#define CHECK_DP(name, call)                                                               \
  do {                                                                                     \
    dp_status st_ = (call);                                                                \
    ck_assert_msg(st_ == DP_OK, "%s: %s -> %s: %s", (name), #call, dp_status_name(st_),    \
                  dp_last_error());                                                        \
  } while (0)

/* Loads the case and builds model, plan and context with params0 loaded.
 * n_devices <= 0 keeps the file's N. */
/* mode, shard: the layout (classic, allreduce, allreduce with a sharded
 * optimizer); n_devices 0: the golden file's own device count; clip: set
 * config.clip_grad_norm to the file's clip_max_norm (0: no clipping). */
static void run_open(golden_run *r, const char *case_name, dp_optimizer opt, int inference,
                     int n_devices, dp_mode mode, int shard, int clip) {
  memset(r, 0, sizeof *r);
  golden_load(&r->g, case_name);
  const golden *g = &r->g;
  const char *spec = golden_get(g, "spec", GT_TEXT)->data;
  size_t n;
  const int32_t *conf = golden_i32(g, "config", &n);
  ck_assert_uint_eq(n, 4);
  const float *hp = golden_f32(g, "hparams", &n);
  ck_assert_uint_eq(n, 8);
  r->batch = conf[0];
  const golden_entry *mbe = golden_find(g, "micro_batch", GT_I32);
  if (mbe) {
    ck_assert_uint_eq(mbe->count, 1);
    r->micro_batch = ((const int32_t *)mbe->data)[0];
    ck_assert_msg(r->micro_batch > 0, "%s: micro_batch %d", case_name, r->micro_batch);
  }

  CHECK_DP(case_name, dp_model_parse(spec, case_name, &r->model));
  int in = dp_model_input_width(r->model), out = dp_model_output_width(r->model);
  r->in_width = in;
  r->n_params = dp_model_n_params(r->model);

  const golden_entry *xe = golden_get(g, "x", GT_F32);
  ck_assert_msg(xe->ndim == 2 && xe->dims[0] == (uint32_t)r->batch &&
                    xe->dims[1] == (uint32_t)in,
                "%s: x shape does not match the model", case_name);
  r->x = xe->data;
  if (dp_model_loss(r->model) == DP_LOSS_SOFTMAX_CE) {
    const golden_entry *te = golden_get(g, "target", GT_I32);
    ck_assert_msg(te->ndim == 1 && te->dims[0] == (uint32_t)r->batch,
                  "%s: target shape does not match", case_name);
    r->target = te->data;
  } else {
    const golden_entry *te = golden_get(g, "target", GT_F32);
    ck_assert_msg(te->ndim == 2 && te->dims[0] == (uint32_t)r->batch &&
                      te->dims[1] == (uint32_t)out,
                  "%s: target shape does not match the model", case_name);
    r->target = te->data;
  }
  const float *p0 = golden_f32(g, "params0", &n);
  ck_assert_msg(n == r->n_params, "%s: params0 has %zu floats, the model %zu", case_name, n,
                r->n_params);

  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = r->batch;
  cfg.n_devices = n_devices > 0 ? n_devices : conf[1];
  cfg.split = (dp_split)conf[2];
  cfg.micro_batch = r->micro_batch; /* per_replica batchnorm's statistics depend on it */
  cfg.seed = (uint64_t)(uint32_t)conf[3];
  cfg.inference = inference;
  cfg.mode = mode;
  cfg.shard_optimizer = shard;
  if (clip) {
    const float *max_norm = golden_f32(g, "clip_max_norm", &n);
    ck_assert_uint_eq(n, 1);
    ck_assert_msg(max_norm[0] > 0.0f, "%s: clip_max_norm %g", case_name,
                  (double)max_norm[0]);
    cfg.clip_grad_norm = max_norm[0];
  }
  dp_config_set_optimizer(&cfg, opt);
  if (opt == DP_OPT_ADAMW) {
    cfg.lr = hp[3];
    cfg.beta1 = hp[4];
    cfg.beta2 = hp[5];
    cfg.eps = hp[6];
    cfg.weight_decay = hp[7];
  } else {
    cfg.lr = hp[0];
    cfg.momentum = hp[1];
    cfg.weight_decay = hp[2];
  }
  CHECK_DP(case_name, dp_plan_create(r->model, &cfg, &r->plan));
  CHECK_DP(case_name, dp_ctx_create(r->plan, &r->ctx));
  CHECK_DP(case_name, dp_set_params(r->ctx, p0, r->n_params));
}

static void run_close(golden_run *r) {
  dp_ctx_free(r->ctx);
  dp_plan_free(r->plan);
  dp_model_free(r->model);
  golden_free(&r->g);
}

static float *alloc_floats(size_t n) {
  float *p = calloc(n ? n : 1, sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}

/* ---- batchnorm running statistics ---------------------------------------------- */

/* Compares every batchnorm's running statistics (dp_get_running_stats) with
 * row `t` of the file's <prefix>_running_mean / _running_var (f32, (steps,
 * sum of C), the layers concatenated in order) and <prefix>_num_batches (i32,
 * (steps, batchnorms)), the records after step t. The layers come from the
 * file's bn_layers ((layer index after `input`, C) each) and must be the
 * model's batchnorms; every other layer, and one past the last, must be
 * refused with DP_ERR_INVALID. A case without batchnorm has no records: then
 * only the refusals are checked. */
static void check_running_stats(golden_run *r, const char *prefix, int t,
                                const char *when) {
  const golden *g = &r->g;
  const char *cn = g->case_name;
  int n_layers = dp_model_n_layers(r->model);
  const golden_entry *le = golden_find(g, "bn_layers", GT_I32);
  int n_bn = 0;
  const int32_t *bl = NULL;
  if (le) {
    ck_assert_msg(le->ndim == 2 && le->dims[1] == 2, "%s: bn_layers shape", cn);
    n_bn = (int)le->dims[0];
    bl = le->data;
  }
  float dummy[1];
  int64_t dummy_count;
  for (int i = 0, k = 0; i <= n_layers; i++) {
    int is_bn = k < n_bn && bl[2 * k] == i;
    if (i < n_layers)
      ck_assert_msg((dp_model_layer_kind(r->model, i) == DP_LAYER_BATCHNORM) == is_bn,
                    "%s: layer %d: the model's kind %d and the file's bn_layers disagree",
                    cn, i, (int)dp_model_layer_kind(r->model, i));
    if (is_bn) {
      k++;
      continue;
    }
    dp_status st = dp_get_running_stats(r->ctx, i, dummy, dummy, &dummy_count);
    ck_assert_msg(st == DP_ERR_INVALID,
                  "%s: dp_get_running_stats of layer %d (not a batchnorm) -> %s, expected "
                  "DP_ERR_INVALID",
                  cn, i, dp_status_name(st));
  }
  if (!n_bn) return;

  char key[64], what[160];
  size_t n;
  snprintf(key, sizeof key, "%s_running_mean", prefix);
  const golden_entry *me = golden_get(g, key, GT_F32);
  snprintf(key, sizeof key, "%s_running_var", prefix);
  const golden_entry *ve = golden_get(g, key, GT_F32);
  snprintf(key, sizeof key, "%s_num_batches", prefix);
  const golden_entry *ce = golden_get(g, key, GT_I32);
  size_t total_c = 0;
  for (int k = 0; k < n_bn; k++) total_c += (size_t)bl[2 * k + 1];
  ck_assert_msg(me->ndim == 2 && me->dims[0] == GOLDEN_STEPS && me->dims[1] == total_c &&
                    ve->ndim == 2 && ve->dims[0] == GOLDEN_STEPS &&
                    ve->dims[1] == total_c && ce->ndim == 2 &&
                    ce->dims[0] == GOLDEN_STEPS && ce->dims[1] == (uint32_t)n_bn,
                "%s: %s running statistics records have the wrong shape", cn, prefix);
  ck_assert_int_lt(t, GOLDEN_STEPS);
  const float *want_mean = (const float *)me->data + (size_t)t * total_c;
  const float *want_var = (const float *)ve->data + (size_t)t * total_c;
  const int32_t *want_count = (const int32_t *)ce->data + (size_t)t * n_bn;
  n = 0;
  for (int k = 0; k < n_bn; k++) {
    int layer = bl[2 * k], c = bl[2 * k + 1];
    float *mean = alloc_floats((size_t)c), *var = alloc_floats((size_t)c);
    int64_t count = -1;
    dp_status st = dp_get_running_stats(r->ctx, layer, mean, var, &count);
    ck_assert_msg(st == DP_OK, "%s: dp_get_running_stats(layer %d) -> %s: %s", cn, layer,
                  dp_status_name(st), dp_last_error());
    snprintf(what, sizeof what, "%s: running_mean of layer %d", when, layer);
    check_close(cn, what, mean, want_mean + n, (size_t)c);
    snprintf(what, sizeof what, "%s: running_var of layer %d", when, layer);
    check_close(cn, what, var, want_var + n, (size_t)c);
    ck_assert_msg(count == (int64_t)want_count[k],
                  "%s: %s: num_batches_tracked of layer %d is %lld, PyTorch's %d", cn, when,
                  layer, (long long)count, (int)want_count[k]);
    n += (size_t)c;
    free(mean);
    free(var);
  }
}

/* ---- training: five steps against PyTorch's optimizer ------------------------ */

/* prefix "sgdm" or "adamw": compares step 0's loss and gradients, every step's
 * loss, and the parameters after GOLDEN_STEPS steps. */
static void check_training(const char *case_name, dp_optimizer opt, const char *prefix) {
  golden_run r;
  run_open(&r, case_name, opt, 0, 0, DP_MODE_CLASSIC, 0, 0);
  char key[64], what[96];
  size_t n;
  snprintf(key, sizeof key, "%s_loss", prefix);
  const float *want_loss = golden_f32(&r.g, key, &n);
  ck_assert_uint_eq(n, GOLDEN_STEPS);
  snprintf(key, sizeof key, "%s_params5", prefix);
  const float *want_params = golden_f32(&r.g, key, &n);
  ck_assert_uint_eq(n, r.n_params);
  const float *want_grads = golden_f32(&r.g, "grads", &n);
  ck_assert_uint_eq(n, r.n_params);
  float *buf = alloc_floats(r.n_params);

  for (int t = 0; t < GOLDEN_STEPS; t++) {
    ck_assert_msg(dp_ctx_step(r.ctx) == (uint64_t)t, "%s: step counter %llu before step %d",
                  case_name, (unsigned long long)dp_ctx_step(r.ctx), t);
    float loss = NAN;
    CHECK_DP(case_name, dp_train_step(r.ctx, r.batch, r.in_width, r.x, r.target, &loss));
    if (t == 0) {
      check_scalar(case_name, "loss at step 0", loss, golden_f32(&r.g, "loss", NULL)[0]);
      CHECK_DP(case_name, dp_get_grads(r.ctx, buf, r.n_params));
      check_close(case_name, "grads at step 0 (params0)", buf, want_grads, r.n_params);
    }
    snprintf(what, sizeof what, "%s loss at step %d", prefix, t);
    check_scalar(case_name, what, loss, want_loss[t]);
    snprintf(what, sizeof what, "%s after step %d", prefix, t);
    check_running_stats(&r, prefix, t, what);
  }
  ck_assert_uint_eq(dp_ctx_step(r.ctx), GOLDEN_STEPS);
  CHECK_DP(case_name, dp_get_params(r.ctx, buf, r.n_params));
  snprintf(what, sizeof what, "%s params after %d steps", prefix, GOLDEN_STEPS);
  check_close(case_name, what, buf, want_params, r.n_params);
  /* Eval mode after training (batchnorm: the running statistics). */
  snprintf(key, sizeof key, "%s_eval_out5", prefix);
  const golden_entry *ee = golden_find(&r.g, key, GT_F32);
  if (ee) {
    ck_assert_uint_eq(ee->count, (size_t)r.batch * (size_t)dp_model_output_width(r.model));
    float *y = alloc_floats(ee->count);
    CHECK_DP(case_name, dp_forward(r.ctx, r.batch, r.in_width, r.x, y));
    snprintf(what, sizeof what, "%s: dp_forward after %d steps (%s)", prefix, GOLDEN_STEPS,
             key);
    check_close(case_name, what, y, ee->data, ee->count);
    free(y);
    /* dp_forward is eval mode: it leaves the running statistics alone. */
    snprintf(what, sizeof what, "%s after step %d and dp_forward", prefix,
             GOLDEN_STEPS - 1);
    check_running_stats(&r, prefix, GOLDEN_STEPS - 1, what);
  }
  free(buf);
  run_close(&r);
}

START_TEST(test_matches_pytorch_sgd_momentum) {
  check_training(golden_cases[_i], DP_OPT_MOMENTUM, "sgdm");
}
END_TEST

START_TEST(test_matches_pytorch_adamw) {
  check_training(golden_cases[_i], DP_OPT_ADAMW, "adamw");
}
END_TEST

/* The design doc's permanent example, named on its own so it shows in reports. */
START_TEST(test_seed_matches_pytorch_sgd_momentum) {
  check_training("seed", DP_OPT_MOMENTUM, "sgdm");
}
END_TEST

/* ---- inference ---------------------------------------------------------------- */

static void check_forward(golden_run *r, const char *what) {
  size_t n;
  const float *want = golden_f32(&r->g, "eval_out", &n);
  ck_assert_uint_eq(n, (size_t)r->batch * (size_t)dp_model_output_width(r->model));
  float *y = alloc_floats(n);
  CHECK_DP(r->g.case_name, dp_forward(r->ctx, r->batch, r->in_width, r->x, y));
  check_close(r->g.case_name, what, y, want, n);
  free(y);
}

START_TEST(test_inference_plan_matches_pytorch_eval) {
  golden_run r;
  run_open(&r, golden_cases[_i], DP_OPT_SGD, 1, 0, DP_MODE_CLASSIC, 0, 0);
  check_forward(&r, "inference plan forward (eval_out)");
  run_close(&r);
}
END_TEST

START_TEST(test_training_ctx_forward_is_eval_mode) {
  golden_run r;
  run_open(&r, golden_cases[_i], DP_OPT_MOMENTUM, 0, 0, DP_MODE_CLASSIC, 0, 0);
  check_forward(&r, "training ctx forward (eval_out)");
  run_close(&r);
}
END_TEST

/* ---- data parallel == single device ----------------------------------------- */

/* The layouts: classic, allreduce and allreduce with a sharded optimizer. */
static const struct {
  dp_mode mode;
  int shard;
  const char *name;
} layouts[] = {{DP_MODE_CLASSIC, 0, "classic"},
               {DP_MODE_ALLREDUCE, 0, "allreduce"},
               {DP_MODE_ALLREDUCE, 1, "sharded"}};

/* dp_get_grads against PyTorch in every layout: classic, allreduce and
 * allreduce with a sharded optimizer (where each device holds the reduced
 * gradients of its shard only), on 1 to 4 devices; and the loss. */
START_TEST(test_grads_same_for_1_to_4_devices_in_every_mode) {
  const char *case_name = golden_cases[_i];
  float *ref = NULL;
  size_t n_params = 0;
  float ref_loss = 0.0f;
  for (int li = 0; li < 3; li++)
    for (int nd = 1; nd <= 4; nd++) {
      golden_run r;
      run_open(&r, case_name, DP_OPT_MOMENTUM, 0, nd, layouts[li].mode, layouts[li].shard,
               0);
      float *g = alloc_floats(r.n_params);
      float loss = NAN;
      CHECK_DP(case_name, dp_train_step(r.ctx, r.batch, r.in_width, r.x, r.target, &loss));
      CHECK_DP(case_name, dp_get_grads(r.ctx, g, r.n_params));
      char what[96];
      snprintf(what, sizeof what, "%s grads with %d device(s) vs PyTorch", layouts[li].name,
               nd);
      check_close(case_name, what, g, golden_f32(&r.g, "grads", NULL), r.n_params);
      snprintf(what, sizeof what, "%s loss with %d device(s) vs PyTorch", layouts[li].name,
               nd);
      check_scalar(case_name, what, loss, golden_f32(&r.g, "loss", NULL)[0]);
      /* The running statistics after step 0 come from params0's forward: the
       * same for both optimizers, so SGD-momentum's record serves. */
      snprintf(what, sizeof what, "%s on %d device(s) after step 0", layouts[li].name, nd);
      check_running_stats(&r, "sgdm", 0, what);
      if (!ref) {
        ref = g;
        n_params = r.n_params;
        ref_loss = loss;
      } else {
        ck_assert_uint_eq(r.n_params, n_params);
        snprintf(what, sizeof what, "%s grads with %d devices vs classic on 1",
                 layouts[li].name, nd);
        check_close(case_name, what, g, ref, n_params);
        snprintf(what, sizeof what, "%s loss with %d devices vs classic on 1",
                 layouts[li].name, nd);
        check_scalar(case_name, what, loss, ref_loss);
        free(g);
      }
      run_close(&r);
    }
  free(ref);
}
END_TEST

/* ---- gradient clipping -------------------------------------------------------- */

/* config.clip_grad_norm = the file's clip_max_norm (a quarter of the first
 * gradient's norm, so every step clips) against torch.nn.utils.clip_grad_norm_
 * before every optimizer.step(): each step's dp_ctx_grad_norm (the norm before
 * clipping, as clip_grad_norm_ returns it), the clipped gradients of step 0
 * and the parameters after GOLDEN_STEPS steps. prefix "sgd_clip" (norms in
 * "clip_norms") or "adamw_clip". The same batch every step, as in
 * check_training. */
static void check_clipped_training(const char *case_name, dp_optimizer opt,
                                   const char *prefix, int n_devices, int li) {
  golden_run r;
  run_open(&r, case_name, opt, 0, n_devices, layouts[li].mode, layouts[li].shard, 1);
  size_t n;
  char key[64], what[128];
  snprintf(key, sizeof key, "%s", opt == DP_OPT_ADAMW ? "adamw_clip_norms" : "clip_norms");
  const float *want_norms = golden_f32(&r.g, key, &n);
  ck_assert_uint_eq(n, GOLDEN_STEPS);
  snprintf(key, sizeof key, "%s_params", prefix);
  const float *want_params = golden_f32(&r.g, key, &n);
  ck_assert_uint_eq(n, r.n_params);
  const float *want_grads = golden_f32(&r.g, "clip_grads1", &n);
  ck_assert_uint_eq(n, r.n_params);
  float *buf = alloc_floats(r.n_params);

  for (int t = 0; t < GOLDEN_STEPS; t++) {
    float loss = NAN;
    CHECK_DP(case_name, dp_train_step(r.ctx, r.batch, r.in_width, r.x, r.target, &loss));
    snprintf(what, sizeof what, "%s %s on %d device(s): grad norm at step %d", prefix,
             layouts[li].name, n_devices, t);
    check_scalar(case_name, what, dp_ctx_grad_norm(r.ctx), want_norms[t]);
    if (t == 0) {
      CHECK_DP(case_name, dp_get_grads(r.ctx, buf, r.n_params));
      snprintf(what, sizeof what, "%s %s on %d device(s): clipped grads at step 0", prefix,
               layouts[li].name, n_devices);
      check_close(case_name, what, buf, want_grads, r.n_params);
    }
    snprintf(what, sizeof what, "%s %s on %d device(s) after step %d", prefix,
             layouts[li].name, n_devices, t);
    check_running_stats(&r, prefix, t, what);
  }
  ck_assert_uint_eq(dp_ctx_step(r.ctx), GOLDEN_STEPS);
  CHECK_DP(case_name, dp_get_params(r.ctx, buf, r.n_params));
  snprintf(what, sizeof what, "%s %s on %d device(s): params after %d steps", prefix,
           layouts[li].name, n_devices, GOLDEN_STEPS);
  check_close(case_name, what, buf, want_params, r.n_params);
  free(buf);
  run_close(&r);
}

START_TEST(test_clipped_sgd_momentum_matches_pytorch_on_1_2_4_devices_in_every_mode) {
  for (int li = 0; li < 3; li++)
    for (int nd = 1; nd <= 4; nd *= 2)
      check_clipped_training(golden_cases[_i], DP_OPT_MOMENTUM, "sgd_clip", nd, li);
}
END_TEST

START_TEST(test_clipped_adamw_matches_pytorch_on_1_2_4_devices_in_every_mode) {
  for (int li = 0; li < 3; li++)
    for (int nd = 1; nd <= 4; nd *= 2)
      check_clipped_training(golden_cases[_i], DP_OPT_ADAMW, "adamw_clip", nd, li);
}
END_TEST

/* ---- suite ------------------------------------------------------------------ */

Suite *golden_suite(void) {
  Suite *s = suite_create("golden");

  TCase *tc = tcase_create("sgd_momentum");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_seed_matches_pytorch_sgd_momentum);
  tcase_add_loop_test(tc, test_matches_pytorch_sgd_momentum, 0, N_GOLDEN_CASES);
  suite_add_tcase(s, tc);

  tc = tcase_create("adamw");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, test_matches_pytorch_adamw, 0, N_GOLDEN_CASES);
  suite_add_tcase(s, tc);

  tc = tcase_create("inference");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, test_inference_plan_matches_pytorch_eval, 0, N_GOLDEN_CASES);
  tcase_add_loop_test(tc, test_training_ctx_forward_is_eval_mode, 0, N_GOLDEN_CASES);
  suite_add_tcase(s, tc);

  tc = tcase_create("device_count");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, test_grads_same_for_1_to_4_devices_in_every_mode, 0,
                      N_GOLDEN_CASES);
  suite_add_tcase(s, tc);

  tc = tcase_create("clip_grad_norm");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(
      tc, test_clipped_sgd_momentum_matches_pytorch_on_1_2_4_devices_in_every_mode, 0,
      N_GOLDEN_CASES);
  tcase_add_loop_test(tc, test_clipped_adamw_matches_pytorch_on_1_2_4_devices_in_every_mode,
                      0, N_GOLDEN_CASES);
  suite_add_tcase(s, tc);

  return s;
}
