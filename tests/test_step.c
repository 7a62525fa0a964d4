/* Step tests: what a training step and a forward pass promise, through dp.h only.
 *
 *   dp_equals_single  N devices (1..4) give the outputs, loss and gradients of one
 *                     device (fp32 rounding apart); fixed micro-batches give the
 *                     same bits for N = 1, 2, 4
 *   repeatable        the same run twice gives bit-identical parameters
 *   bad_input         every refused call leaves parameters, optimizer state and
 *                     the step counter exactly as they were, and says why
 *   small_batch       a batch smaller than planned matches a plan for that batch;
 *                     a relu after a linear is exactly relu(x W^T + b)
 *   high_water        the runtime's arena high-water mark equals the plan
 *   static_ctx        caller-provided arenas give the same bits as library ones
 *   learning          training really learns (a separable problem)
 *   optimizers        one step of SGD, momentum and AdamW against PyTorch's rules
 *   profile           dp_ctx_profile's events add up: per device's thread busy +
 *                     barrier + other = the steps' wall time, every op once per
 *                     step, every op class of an MLP present (no time asserted)
 *
 * Tolerance for results that may round differently (element-wise, want = the
 * single-device value):  |got - want| <= RTOL * (|want| + FLOOR * max|want|).
 */
#include "dp.h"
#include "helpers.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RTOL 1e-5
#define FLOOR 1e-2

static const char SEED_SPEC[] = "# the seed: Linear(5, 2) on [30, 5]\n"
                                "input 5\nlinear 2\nloss mse\n";

/* ---- helpers ---------------------------------------------------------------- *
 * Every config here has seed 7, the seed the tests were written with. */

static float rng_unif(uint64_t *s, float lo, float hi) {
  return lo + (hi - lo) * (float)(rng_next(s) >> 40) * 0x1p-24f;
}

/* A batch for a model: inputs U(-1, 1); targets U(-1, 1) (mse) or labels. */
typedef struct {
  int rows, in, out;
  dp_loss_kind loss;
  float *x;
  float *tf;   /* (rows, out), mse */
  int32_t *ti; /* (rows), softmax_cross_entropy */
} batch;

static void batch_make(batch *b, const dp_model *m, int rows, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  b->rows = rows;
  b->in = dp_model_input_width(m);
  b->out = dp_model_output_width(m);
  b->loss = dp_model_loss(m);
  b->x = malloc(sizeof(float) * (size_t)rows * (size_t)b->in);
  b->tf = malloc(sizeof(float) * (size_t)rows * (size_t)b->out);
  b->ti = malloc(sizeof(int32_t) * (size_t)rows);
  ck_assert(b->x && b->tf && b->ti);
  for (int k = 0; k < rows * b->in; k++) b->x[k] = rng_unif(&s, -1.0f, 1.0f);
  for (int k = 0; k < rows * b->out; k++) b->tf[k] = rng_unif(&s, -1.0f, 1.0f);
  for (int r = 0; r < rows; r++) b->ti[r] = (int32_t)(rng_next(&s) % (uint64_t)b->out);
}

static const void *batch_t(const batch *b) {
  return b->loss == DP_LOSS_MSE ? (const void *)b->tf : (const void *)b->ti;
}

static void batch_free(batch *b) {
  free(b->x);
  free(b->tf);
  free(b->ti);
}

static float *params_random(size_t n, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 3;
  float *p = malloc(n * sizeof *p);
  ck_assert_ptr_nonnull(p);
  for (size_t k = 0; k < n; k++) p[k] = rng_unif(&s, -0.6f, 0.6f);
  return p;
}

static float *fbuf(size_t n) {
  float *p = calloc(n ? n : 1, sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}

static void step_ok(rig *r, const batch *b, int rows, float *loss) {
  dp_status s = dp_train_step(r->c, rows, b->in, b->x, batch_t(b), loss);
  ck_assert_msg(s == DP_OK, "dp_train_step: %s: %s", dp_status_name(s), dp_ctx_error(r->c));
}

static void forward_ok(rig *r, const batch *b, int rows, float *y) {
  dp_status s = dp_forward(r->c, rows, b->in, b->x, y);
  ck_assert_msg(s == DP_OK, "dp_forward: %s: %s", dp_status_name(s), dp_ctx_error(r->c));
}

static void set_params(rig *r, const float *p) {
  ck_assert_msg(dp_set_params(r->c, p, r->np) == DP_OK, "%s", dp_ctx_error(r->c));
}

static void get_params(rig *r, float *p) {
  ck_assert_msg(dp_get_params(r->c, p, r->np) == DP_OK, "%s", dp_ctx_error(r->c));
}

static void get_grads(rig *r, float *g) {
  ck_assert_msg(dp_get_grads(r->c, g, r->np) == DP_OK, "%s", dp_ctx_error(r->c));
}

static void assert_close(const float *got, const float *want, size_t n, const char *what,
                         const char *where) {
  double mx = 0.0;
  for (size_t k = 0; k < n; k++) mx = fmax(mx, fabs((double)want[k]));
  for (size_t k = 0; k < n; k++) {
    double tol = RTOL * (fabs((double)want[k]) + FLOOR * mx);
    double err = fabs((double)got[k] - (double)want[k]);
    ck_assert_msg(err <= tol, "%s: %s[%zu] = %.9g, want %.9g (err %.3g > tol %.3g)", where, what,
                  k, (double)got[k], (double)want[k], err, tol);
  }
}

static void assert_close1(float got, float want, const char *what, const char *where) {
  assert_close(&got, &want, 1, what, where);
}

/* Arena end of device d: the end of its last non-empty region. */
static size_t plan_end(const dp_plan *p, int d) {
  size_t end = 0;
  for (int r = 0; r < DP_REGION_COUNT; r++) {
    dp_region_info ri = dp_plan_region(p, d, (dp_region)r);
    if (ri.size && ri.offset + ri.size > end) end = ri.offset + ri.size;
  }
  return end;
}

/* ---- DP == single device ---------------------------------------------------- */

typedef struct {
  const char *name;
  const char *spec;
  int batch;
  dp_split split;
  int micro_batch;
} equiv_case;

static const equiv_case EQUIV[] = {
    {"seed", SEED_SPEC, 30, DP_SPLIT_CHUNK, 0},
    {"mlp", MLP_EVERY_KIND_SPEC, 32, DP_SPLIT_CHUNK, 0},
    {"mlp balanced", MLP_EVERY_KIND_SPEC, 32, DP_SPLIT_BALANCED, 0},
    {"mlp micro_batch 4", MLP_EVERY_KIND_SPEC, 32, DP_SPLIT_CHUNK, 4},
    {"mlp balanced, odd batch, micro_batch 3", MLP_EVERY_KIND_SPEC, 31, DP_SPLIT_BALANCED,
     3},
};
#define N_EQUIV ((int)(sizeof EQUIV / sizeof *EQUIV))

typedef struct {
  float *y, *grads, *after, loss, eval_loss;
} step_result;

/* Forward, one SGD step, grads and params after, for one device count. */
static void run_equiv(const equiv_case *ec, int n_dev, const float *params, const batch *b,
                      step_result *res) {
  dp_config cfg = CFG(.batch = ec->batch, .n_devices = n_dev, .opt = DP_OPT_SGD, .seed = 7);
  cfg.split = ec->split;
  cfg.micro_batch = ec->micro_batch;
  rig r;
  rig_open(&r, ec->spec, &cfg);
  size_t np = r.np;
  res->y = fbuf((size_t)b->rows * (size_t)b->out);
  res->grads = fbuf(np);
  res->after = fbuf(np);
  set_params(&r, params);
  forward_ok(&r, b, b->rows, res->y);
  step_ok(&r, b, b->rows, &res->loss);
  get_grads(&r, res->grads);
  get_params(&r, res->after);
  rig_close(&r);
}

static void step_result_free(step_result *s) {
  free(s->y);
  free(s->grads);
  free(s->after);
}

/* Mean cross-entropy of logits y against labels (eval mode: no dropout). */
static float ce_loss(const float *y, const int32_t *t, int rows, int out) {
  double s = 0.0;
  for (int r = 0; r < rows; r++) {
    const float *z = y + (size_t)r * out;
    double mx = z[0], se = 0.0;
    for (int j = 1; j < out; j++) mx = fmax(mx, z[j]);
    for (int j = 0; j < out; j++) se += exp(z[j] - mx);
    s += mx + log(se) - z[t[r]];
  }
  return (float)(s / rows);
}

START_TEST(test_n_devices_match_one_device) {
  const equiv_case *ec = &EQUIV[_i];
  dp_model *m = model_of(ec->spec);
  size_t np = dp_model_n_params(m);
  float *params = params_random(np, 11);
  batch b;
  batch_make(&b, m, ec->batch, 5);
  step_result ref;
  run_equiv(ec, 1, params, &b, &ref);
  if (b.loss == DP_LOSS_SOFTMAX_CE) {
    /* The model has dropout: the training loss must not be the eval loss, or the
     * comparison below would not be checking that the masks agree. */
    float eval = ce_loss(ref.y, b.ti, b.rows, b.out);
    ck_assert_msg(fabsf(eval - ref.loss) > 1e-4f * fabsf(eval),
                  "%s: dropout seems inactive (train loss %g == eval loss %g)", ec->name,
                  (double)ref.loss, (double)eval);
  }
  for (int n = 2; n <= 4; n++) {
    char where[128];
    snprintf(where, sizeof where, "%s, %d devices vs 1", ec->name, n);
    step_result got;
    run_equiv(ec, n, params, &b, &got);
    assert_close(got.y, ref.y, (size_t)b.rows * b.out, "outputs", where);
    assert_close1(got.loss, ref.loss, "loss", where);
    assert_close(got.grads, ref.grads, np, "grads", where);
    assert_close(got.after, ref.after, np, "params after the step", where);
    step_result_free(&got);
  }
  step_result_free(&ref);
  batch_free(&b);
  free(params);
  dp_model_free(m);
}
END_TEST

/* With a fixed micro-batch size the gradient tree does not depend on N: for N a
 * power of two dividing the micro-batch count the bits are the same. */
START_TEST(test_micro_batches_give_same_bits_for_1_2_4_devices) {
  const equiv_case ec = {"mlp micro_batch 4", MLP_EVERY_KIND_SPEC, 32, DP_SPLIT_CHUNK, 4};
  dp_model *m = model_of(ec.spec);
  size_t np = dp_model_n_params(m);
  float *params = params_random(np, 12);
  batch b;
  batch_make(&b, m, ec.batch, 6);
  step_result ref;
  run_equiv(&ec, 1, params, &b, &ref);
  for (int n = 2; n <= 4; n *= 2) {
    step_result got;
    run_equiv(&ec, n, params, &b, &got);
    ck_assert_msg(memcmp(got.y, ref.y, sizeof(float) * (size_t)b.rows * b.out) == 0,
                  "outputs differ, %d devices", n);
    ck_assert_msg(memcmp(&got.loss, &ref.loss, sizeof got.loss) == 0,
                  "loss %.9g vs %.9g, %d devices", (double)got.loss, (double)ref.loss, n);
    ck_assert_msg(memcmp(got.grads, ref.grads, np * sizeof(float)) == 0,
                  "grads differ, %d devices", n);
    ck_assert_msg(memcmp(got.after, ref.after, np * sizeof(float)) == 0,
                  "params after the step differ, %d devices", n);
    step_result_free(&got);
  }
  step_result_free(&ref);
  batch_free(&b);
  free(params);
  dp_model_free(m);
}
END_TEST

/* Dropout masks are keyed by (seed, step, layer, global row, element): the
 * agreement across N is checked above; here, the mask must change from one
 * step to the next. */
START_TEST(test_dropout_mask_changes_with_the_step) {
  dp_config cfg = CFG(.batch = 32, .n_devices = 2, .opt = DP_OPT_SGD, .seed = 7);
  rig r;
  rig_open(&r, MLP_EVERY_KIND_SPEC, &cfg);
  size_t np = r.np;
  float *params = params_random(np, 13), *g1 = fbuf(np), *g2 = fbuf(np);
  batch b;
  batch_make(&b, r.m, 32, 7);
  set_params(&r, params);
  step_ok(&r, &b, 32, NULL);
  get_grads(&r, g1);
  set_params(&r, params); /* same params, same batch, next step number */
  step_ok(&r, &b, 32, NULL);
  get_grads(&r, g2);
  ck_assert_msg(memcmp(g1, g2, np * sizeof(float)) != 0,
                "two steps with the same params and batch gave the same grads: dropout "
                "mask does not depend on the step");
  free(params);
  free(g1);
  free(g2);
  batch_free(&b);
  rig_close(&r);
}
END_TEST

/* ---- run to run ----------------------------------------------------------- */

static void run_20_steps(int n_dev, const char *spec, int micro_batch, float *out) {
  dp_config cfg = CFG(.batch = 32, .n_devices = n_dev, .opt = DP_OPT_ADAMW, .seed = 7);
  cfg.micro_batch = micro_batch;
  rig r;
  rig_open(&r, spec, &cfg);
  for (int s = 0; s < 20; s++) {
    batch b;
    batch_make(&b, r.m, 32, 100 + (uint64_t)s);
    int rows = s % 3 == 2 ? 19 : 32; /* some smaller batches too */
    step_ok(&r, &b, rows, NULL);
    batch_free(&b);
  }
  ck_assert_int_eq((int)dp_ctx_step(r.c), 20);
  get_params(&r, out);
  rig_close(&r);
}

START_TEST(test_same_run_twice_is_bit_identical) {
  int n_dev = _i + 1;
  const char *specs[] = {SEED_SPEC, MLP_EVERY_KIND_SPEC};
  for (int k = 0; k < 2; k++)
    for (int mb = 0; mb <= 4; mb += 4) {
      dp_model *m = model_of(specs[k]);
      size_t np = dp_model_n_params(m);
      dp_model_free(m);
      float *a = fbuf(np), *b = fbuf(np);
      run_20_steps(n_dev, specs[k], mb, a);
      run_20_steps(n_dev, specs[k], mb, b);
      ck_assert_msg(memcmp(a, b, np * sizeof(float)) == 0,
                    "%s, %d devices, micro_batch %d: two identical runs differ",
                    k ? "mlp" : "seed", n_dev, mb);
      free(a);
      free(b);
    }
}
END_TEST

/* ---- bad input changes nothing -------------------------------------------- */

typedef enum {
  BAD_COLS_LESS,
  BAD_COLS_MORE,
  BAD_ROWS_OVER,
  BAD_ROWS_ZERO,
  BAD_ROWS_NEGATIVE,
  BAD_LABEL_NEGATIVE,
  BAD_LABEL_CLASSES,
  BAD_LABEL_LAST_ROW,
  BAD_NAN_INPUT_MSE,
  BAD_INF_INPUT_MSE,
  BAD_INF_TARGET_MSE,
  BAD_NAN_INPUT_CE,
  BAD_INF_INPUT_CE,
  BAD_NAN_INPUT_PARTIAL_BATCH,
  BAD_INF_GRADIENT,
  BAD_NULL_X,
  BAD_NULL_TARGET,
  BAD_NULL_CTX,
  BAD_COUNT
} bad_kind;

typedef struct {
  const char *name;
  int mlp;           /* model: 0 seed (mse), 1 mlp (softmax_cross_entropy) */
  dp_status want;
  const char *word;  /* the message must mention this */
} bad_case;

static const bad_case BAD[BAD_COUNT] = {
    [BAD_COLS_LESS] = {"input width - 1", 0, DP_ERR_SHAPE, "columns"},
    [BAD_COLS_MORE] = {"input width + 1", 1, DP_ERR_SHAPE, "columns"},
    [BAD_ROWS_OVER] = {"rows > planned batch", 0, DP_ERR_SHAPE, "rows"},
    [BAD_ROWS_ZERO] = {"rows 0", 1, DP_ERR_SHAPE, "rows"},
    [BAD_ROWS_NEGATIVE] = {"rows -1", 0, DP_ERR_SHAPE, "rows"},
    [BAD_LABEL_NEGATIVE] = {"label -1", 1, DP_ERR_RANGE, "label"},
    [BAD_LABEL_CLASSES] = {"label == classes", 1, DP_ERR_RANGE, "label"},
    [BAD_LABEL_LAST_ROW] = {"label out of range in the last row", 1, DP_ERR_RANGE, "label"},
    [BAD_NAN_INPUT_MSE] = {"NaN input (mse)", 0, DP_ERR_NONFINITE, "loss"},
    [BAD_INF_INPUT_MSE] = {"Inf input (mse)", 0, DP_ERR_NONFINITE, "loss"},
    [BAD_INF_TARGET_MSE] = {"Inf target (mse)", 0, DP_ERR_NONFINITE, "loss"},
    [BAD_NAN_INPUT_CE] = {"NaN input (cross-entropy)", 1, DP_ERR_NONFINITE, "loss"},
    [BAD_INF_INPUT_CE] = {"Inf input (cross-entropy)", 1, DP_ERR_NONFINITE, "loss"},
    [BAD_NAN_INPUT_PARTIAL_BATCH] = {"NaN in the last device's rows", 1, DP_ERR_NONFINITE,
                                     "loss"},
    [BAD_INF_GRADIENT] = {"finite loss, infinite gradient", 0, DP_ERR_NONFINITE, "gradient"},
    [BAD_NULL_X] = {"x NULL", 0, DP_ERR_INVALID, "NULL"},
    [BAD_NULL_TARGET] = {"target NULL", 1, DP_ERR_INVALID, "NULL"},
    [BAD_NULL_CTX] = {"ctx NULL", 0, DP_ERR_INVALID, "NULL"},
};

/* Seed-model params whose weights on input column 0 are zero: a huge value in
 * column 0 leaves the outputs (and the loss) finite but overflows dW[:, 0]. */
static void seed_params_col0_zero(float *p, size_t np) {
  uint64_t s = 99;
  for (size_t k = 0; k < np; k++) p[k] = rng_unif(&s, -0.6f, 0.6f);
  for (int o = 0; o < 2; o++) p[o * 5 + 0] = 0.0f;
}

/* Makes the bad call on ctx c with the good batch b as the starting point. */
static dp_status bad_call(bad_kind k, dp_ctx *c, const dp_plan *p, const batch *b) {
  int B = dp_plan_config(p)->batch, rows = b->rows, cols = b->in;
  batch w = *b; /* shallow: copies made below where the data change */
  float *x = malloc(sizeof(float) * (size_t)(B + 1) * (size_t)(b->in + 1));
  float *tf = malloc(sizeof(float) * (size_t)(B + 1) * (size_t)b->out);
  int32_t *ti = malloc(sizeof(int32_t) * (size_t)(B + 1));
  ck_assert(x && tf && ti);
  memcpy(x, b->x, sizeof(float) * (size_t)rows * (size_t)b->in);
  memcpy(tf, b->tf, sizeof(float) * (size_t)rows * (size_t)b->out);
  memcpy(ti, b->ti, sizeof(int32_t) * (size_t)rows);
  w.x = x;
  w.tf = tf;
  w.ti = ti;
  const void *t = batch_t(&w);
  dp_status s = DP_OK;
  switch (k) {
  case BAD_COLS_LESS: s = dp_train_step(c, rows, cols - 1, x, t, NULL); break;
  case BAD_COLS_MORE: s = dp_train_step(c, rows, cols + 1, x, t, NULL); break;
  case BAD_ROWS_OVER: s = dp_train_step(c, B + 1, cols, x, t, NULL); break;
  case BAD_ROWS_ZERO: s = dp_train_step(c, 0, cols, x, t, NULL); break;
  case BAD_ROWS_NEGATIVE: s = dp_train_step(c, -1, cols, x, t, NULL); break;
  case BAD_LABEL_NEGATIVE:
    ti[3] = -1;
    s = dp_train_step(c, rows, cols, x, t, NULL);
    break;
  case BAD_LABEL_CLASSES:
    ti[0] = b->out;
    s = dp_train_step(c, rows, cols, x, t, NULL);
    break;
  case BAD_LABEL_LAST_ROW:
    ti[rows - 1] = 1000;
    s = dp_train_step(c, rows, cols, x, t, NULL);
    break;
  case BAD_NAN_INPUT_MSE:
  case BAD_NAN_INPUT_CE:
    x[2 * cols + 1] = NAN;
    s = dp_train_step(c, rows, cols, x, t, NULL);
    break;
  case BAD_INF_INPUT_MSE:
  case BAD_INF_INPUT_CE:
    x[cols + 3] = -INFINITY;
    s = dp_train_step(c, rows, cols, x, t, NULL);
    break;
  case BAD_INF_TARGET_MSE:
    tf[1] = INFINITY;
    s = dp_train_step(c, rows, cols, x, t, NULL);
    break;
  case BAD_NAN_INPUT_PARTIAL_BATCH:
    x[(size_t)(rows - 1) * cols] = NAN;
    s = dp_train_step(c, rows, cols, x, t, NULL);
    break;
  case BAD_INF_GRADIENT:
    for (int r = 0; r < rows; r++) x[(size_t)r * cols] = 3e38f;
    for (int k2 = 0; k2 < rows * b->out; k2++) tf[k2] = 1e3f; /* large d(loss)/d(out) */
    s = dp_train_step(c, rows, cols, x, t, NULL);
    break;
  case BAD_NULL_X: s = dp_train_step(c, rows, cols, NULL, t, NULL); break;
  case BAD_NULL_TARGET: s = dp_train_step(c, rows, cols, x, NULL, NULL); break;
  case BAD_NULL_CTX: s = dp_train_step(NULL, rows, cols, x, t, NULL); break;
  case BAD_COUNT: break;
  }
  free(x);
  free(tf);
  free(ti);
  return s;
}

/* For every bad call, on 1 and 3 devices with AdamW:
 *   A: good step 1, bad call, good step 2
 *   B: good step 1,           good step 2   (a fresh context)
 * The bad call must return the status, leave params, grads and the step counter
 * bit-identical, and A and B must agree bit for bit after step 2 (so the
 * optimizer state, which step 2 reads, was not touched either). */
START_TEST(test_bad_input_changes_nothing) {
  const bad_case *bc = &BAD[_i];
  for (int n_dev = 1; n_dev <= 3; n_dev += 2) {
    const char *spec = bc->mlp ? MLP_EVERY_KIND_SPEC : SEED_SPEC;
    int B = bc->mlp ? 32 : 30;
    dp_config cfg = CFG(.batch = B, .n_devices = n_dev, .opt = DP_OPT_ADAMW, .seed = 7);
    cfg.lr = 0.05f;
    rig a, b;
    rig_open(&a, spec, &cfg);
    rig_open(&b, spec, &cfg);
    size_t np = a.np;
    float *p0 = fbuf(np), *pa = fbuf(np), *pb = fbuf(np), *g0 = fbuf(np);
    if (bc->mlp) {
      float *r = params_random(np, 21);
      memcpy(p0, r, np * sizeof *p0);
      free(r);
    } else {
      seed_params_col0_zero(p0, np);
    }
    set_params(&a, p0);
    set_params(&b, p0);
    batch b1, b2;
    batch_make(&b1, a.m, B, 31);
    batch_make(&b2, a.m, B, 32);
    step_ok(&a, &b1, B, NULL);
    step_ok(&b, &b1, B, NULL);
    if (!bc->mlp) { /* keep column 0's weights at zero (see seed_params_col0_zero) */
      get_params(&a, p0);
      for (int o = 0; o < 2; o++) p0[o * 5 + 0] = 0.0f;
      set_params(&a, p0);
      set_params(&b, p0);
    }

    get_params(&a, p0);
    get_grads(&a, g0);
    uint64_t step0 = dp_ctx_step(a.c);
    dp_status s = bad_call((bad_kind)_i, a.c, a.p, &b1);
    ck_assert_msg(s == bc->want, "%s, %d devices: got %s (%s), want %s", bc->name, n_dev,
                  dp_status_name(s), dp_last_error(), dp_status_name(bc->want));
    const char *msg = dp_last_error();
    ck_assert_msg(msg[0] != '\0', "%s: dp_last_error is empty", bc->name);
    ck_assert_msg(strstr(msg, bc->word) != NULL, "%s: dp_last_error '%s' does not mention '%s'",
                  bc->name, msg, bc->word);
    if (_i != BAD_NULL_CTX) {
      const char *cmsg = dp_ctx_error(a.c);
      ck_assert_msg(strstr(cmsg, bc->word) != NULL, "%s: dp_ctx_error '%s' does not mention '%s'",
                    bc->name, cmsg, bc->word);
    }
    get_params(&a, pa);
    ck_assert_msg(memcmp(pa, p0, np * sizeof *pa) == 0, "%s, %d devices: params changed",
                  bc->name, n_dev);
    ck_assert_msg(dp_ctx_step(a.c) == step0, "%s, %d devices: step counter changed", bc->name,
                  n_dev);

    /* optimizer state, indirectly: the next good step must match B's */
    float la, lb;
    step_ok(&a, &b2, B, &la);
    step_ok(&b, &b2, B, &lb);
    get_params(&a, pa);
    get_params(&b, pb);
    ck_assert_msg(memcmp(&la, &lb, sizeof la) == 0, "%s, %d devices: next loss differs",
                  bc->name, n_dev);
    ck_assert_msg(memcmp(pa, pb, np * sizeof *pa) == 0,
                  "%s, %d devices: the step after the refused call differs from a context "
                  "that never saw it (optimizer state touched?)",
                  bc->name, n_dev);
    ck_assert_int_eq((int)dp_ctx_step(a.c), 2);
    free(p0);
    free(pa);
    free(pb);
    free(g0);
    batch_free(&b1);
    batch_free(&b2);
    rig_close(&a);
    rig_close(&b);
  }
}
END_TEST

/* dp.h: dp_get_grads returns "gradients of the last successful step". A refused
 * step must not replace them. */
/* A step refused at the loss never reaches backward: the gradients are those of
 * the last successful step. A step refused for non-finite gradients leaves them
 * readable, so the caller can see which ones went bad. */
START_TEST(test_refused_step_gradients_are_last_or_diagnostic) {
  const bad_kind kinds[] = {BAD_NAN_INPUT_MSE, BAD_INF_GRADIENT};
  for (int i = 0; i < 2; i++) {
    dp_config cfg = CFG(.batch = 30, .n_devices = 2, .opt = DP_OPT_SGD, .seed = 7);
    rig a;
    rig_open(&a, SEED_SPEC, &cfg);
    size_t np = a.np;
    float *p0 = fbuf(np), *g0 = fbuf(np), *g1 = fbuf(np);
    seed_params_col0_zero(p0, np);
    set_params(&a, p0);
    batch b;
    batch_make(&b, a.m, 30, 41);
    step_ok(&a, &b, 30, NULL);
    get_grads(&a, g0);
    get_params(&a, p0);
    for (int o = 0; o < 2; o++) p0[o * 5 + 0] = 0.0f;
    set_params(&a, p0);
    ck_assert_int_eq(bad_call(kinds[i], a.c, a.p, &b), DP_ERR_NONFINITE);
    ck_assert_ptr_nonnull(strstr(dp_ctx_error(a.c), BAD[kinds[i]].word));
    get_grads(&a, g1);
    if (kinds[i] == BAD_NAN_INPUT_MSE) {
      ck_assert_msg(memcmp(g0, g1, np * sizeof *g0) == 0,
                    "%s: a step refused at the loss changed the gradients", BAD[kinds[i]].name);
    } else {
      int bad = 0;
      for (size_t k = 0; k < np; k++) bad += !isfinite(g1[k]);
      ck_assert_msg(bad > 0, "%s: the refused step's non-finite gradients are not readable",
                    BAD[kinds[i]].name);
    }
    free(p0);
    free(g0);
    free(g1);
    batch_free(&b);
    rig_close(&a);
  }
}
END_TEST

START_TEST(test_bad_forward_and_accessor_calls_are_refused) {
  dp_config cfg = CFG(.batch = 30, .n_devices = 2, .opt = DP_OPT_SGD, .seed = 7);
  rig r;
  rig_open(&r, SEED_SPEC, &cfg);
  size_t np = r.np;
  batch b;
  batch_make(&b, r.m, 30, 51);
  float y[31 * 2], *p = fbuf(np + 1);
  ck_assert_int_eq(dp_forward(r.c, 30, 4, b.x, y), DP_ERR_SHAPE);
  ck_assert_ptr_nonnull(strstr(dp_ctx_error(r.c), "columns"));
  ck_assert_int_eq(dp_forward(r.c, 31, 5, b.x, y), DP_ERR_SHAPE);
  ck_assert_ptr_nonnull(strstr(dp_ctx_error(r.c), "rows"));
  ck_assert_int_eq(dp_forward(r.c, 0, 5, b.x, y), DP_ERR_SHAPE);
  ck_assert_int_eq(dp_forward(r.c, 30, 5, NULL, y), DP_ERR_INVALID);
  ck_assert_int_eq(dp_forward(r.c, 30, 5, b.x, NULL), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_ctx_error(r.c), "NULL"));
  ck_assert_int_eq(dp_forward(NULL, 30, 5, b.x, y), DP_ERR_INVALID);
  ck_assert_int_eq(dp_get_params(r.c, NULL, np), DP_ERR_INVALID);
  ck_assert_int_eq(dp_get_params(r.c, p, np + 1), DP_ERR_SHAPE);
  ck_assert_int_eq(dp_get_params(NULL, p, np), DP_ERR_INVALID);
  ck_assert_int_eq(dp_set_params(r.c, NULL, np), DP_ERR_INVALID);
  ck_assert_int_eq(dp_set_params(r.c, p, np - 1), DP_ERR_SHAPE);
  ck_assert_int_eq(dp_get_grads(r.c, p, 0), DP_ERR_SHAPE);
  ck_assert_int_eq(dp_get_grads(NULL, p, np), DP_ERR_INVALID);
  /* a non-finite parameter is refused and changes nothing */
  float *before = fbuf(np);
  get_params(&r, before);
  for (size_t k = 0; k < np; k++) p[k] = 0.25f;
  p[np - 1] = NAN;
  ck_assert_int_eq(dp_set_params(r.c, p, np), DP_ERR_NONFINITE);
  get_params(&r, p);
  ck_assert(memcmp(p, before, np * sizeof *p) == 0);
  /* a training call on an inference context */
  rig inf;
  dp_config icfg = cfg;
  icfg.inference = 1;
  rig_open(&inf, SEED_SPEC, &icfg);
  ck_assert_int_eq(dp_train_step(inf.c, 30, 5, b.x, b.tf, NULL), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_ctx_error(inf.c), "inference"));
  ck_assert_int_eq(dp_get_grads(inf.c, p, np), DP_ERR_INVALID);
  ck_assert_int_eq((int)dp_ctx_step(inf.c), 0);
  rig_close(&inf);
  free(before);
  free(p);
  batch_free(&b);
  rig_close(&r);
}
END_TEST

/* ---- smaller batches ------------------------------------------------------ */

START_TEST(test_smaller_batch_matches_plan_for_it) {
  int n_dev = _i + 1;
  const char *specs[] = {SEED_SPEC, MLP_EVERY_KIND_SPEC};
  for (int k = 0; k < 2; k++) {
    dp_config c30 = CFG(.batch = 30, .n_devices = n_dev, .opt = DP_OPT_MOMENTUM, .seed = 7),
              c17 = CFG(.batch = 17, .n_devices = n_dev, .opt = DP_OPT_MOMENTUM, .seed = 7);
    rig big, small;
    rig_open(&big, specs[k], &c30);
    rig_open(&small, specs[k], &c17);
    size_t np = big.np;
    float *p = params_random(np, 61), *gb = fbuf(np), *gs = fbuf(np), *pb = fbuf(np),
          *ps = fbuf(np);
    set_params(&big, p);
    set_params(&small, p);
    batch b;
    batch_make(&b, big.m, 30, 62);
    float yb[30 * 5], ys[30 * 5], lb, ls;
    char where[96];
    snprintf(where, sizeof where, "%s, %d devices, 17 of 30 rows", k ? "mlp" : "seed", n_dev);
    for (int s = 0; s < 3; s++) { /* a few steps: momentum state is exercised */
      step_ok(&big, &b, 17, &lb);
      step_ok(&small, &b, 17, &ls);
      assert_close1(lb, ls, "loss", where);
      get_grads(&big, gb);
      get_grads(&small, gs);
      assert_close(gb, gs, np, "grads", where);
      get_params(&big, pb);
      get_params(&small, ps);
      assert_close(pb, ps, np, "params", where);
      /* keep the two on identical params so the tolerance does not compound */
      set_params(&big, ps);
    }
    forward_ok(&big, &b, 17, yb);
    forward_ok(&small, &b, 17, ys);
    assert_close(yb, ys, (size_t)17 * b.out, "outputs", where);
    /* and the big one still takes its full batch */
    step_ok(&big, &b, 30, &lb);
    ck_assert(isfinite(lb));
    free(p);
    free(gb);
    free(gs);
    free(pb);
    free(ps);
    batch_free(&b);
    rig_close(&big);
    rig_close(&small);
  }
}
END_TEST

/* Replicas must hold device 0's parameters whenever they compute: a forward on
 * a small batch (device 0 only) followed by a full-batch forward must use the
 * current parameters on every device. */
START_TEST(test_forward_after_partial_forward_uses_current_params) {
  dp_config cfg = CFG(.batch = 30, .n_devices = 4, .opt = DP_OPT_SGD, .seed = 7);
  cfg.lr = 0.5f;
  rig r, one;
  rig_open(&r, SEED_SPEC, &cfg);
  dp_config c1 = CFG(.batch = 30, .n_devices = 1, .opt = DP_OPT_SGD, .seed = 7);
  c1.inference = 1;
  rig_open(&one, SEED_SPEC, &c1);
  size_t np = r.np;
  float *p = fbuf(np), y[30 * 2], want[30 * 2];
  batch b;
  batch_make(&b, r.m, 30, 71);
  for (int round = 0; round < 2; round++) {
    step_ok(&r, &b, 30, NULL); /* changes the params on device 0 */
    forward_ok(&r, &b, 5, y);  /* 5 rows: device 0 only */
    forward_ok(&r, &b, 30, y); /* every device */
    get_params(&r, p);
    set_params(&one, p);
    forward_ok(&one, &b, 30, want);
    assert_close(y, want, 30 * 2, "outputs", "4 devices after a 5-row forward");
  }
  free(p);
  batch_free(&b);
  rig_close(&r);
  rig_close(&one);
}
END_TEST

/* A relu right after a linear layer (the CPU backend runs it in the GEMM's
 * epilogue, writing the relu's output directly): the outputs are exactly
 * relu(x W^T + b) by the GEMM contract, one fmaf chain per element, k
 * ascending, then the bias, then the relu; with the relu as the last layer,
 * on 1-3 devices, with several micro-batches per device (the forward's
 * weights packed once) and without, in training and inference contexts. */
static void linear_relu_ref(const float *x, int rows, int in, int out, const float *w,
                            float *y) {
  const float *b = w + (size_t)out * in;
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < out; j++) {
      float acc = 0.0f;
      for (int k = 0; k < in; k++)
        acc = fmaf(x[(size_t)r * in + k], w[(size_t)j * in + k], acc);
      acc = acc + b[j];
      y[(size_t)r * out + j] = acc <= 0.0f ? 0.0f : acc;
    }
}

START_TEST(test_linear_then_relu_is_exact) {
  static const char spec[] = "input 13\nlinear 70\nrelu\nlinear 11\nrelu\nloss mse\n";
  enum { ROWS = 29 };
  int n_dev = 1 + _i % 3, mb = _i / 3 % 2 ? 4 : 0, inference = _i / 6;
  dp_config cfg = CFG(.batch = ROWS, .n_devices = n_dev, .opt = DP_OPT_SGD, .seed = 7);
  cfg.micro_batch = mb;
  cfg.inference = inference;
  rig r;
  rig_open(&r, spec, &cfg);
  float *p = params_random(r.np, 17), h[ROWS * 70], want[ROWS * 11], y[ROWS * 11];
  set_params(&r, p);
  batch b;
  batch_make(&b, r.m, ROWS, 5);
  linear_relu_ref(b.x, ROWS, 13, 70, p, h);
  linear_relu_ref(h, ROWS, 70, 11, p + 70 * 13 + 70, want);
  int zeros = 0;
  for (int k = 0; k < ROWS * 11; k++) zeros += want[k] == 0.0f;
  ck_assert_msg(zeros > 0 && zeros < ROWS * 11, "the reference has %d zeros: no test",
                zeros);
  for (int round = 0; round < 2; round++) {
    forward_ok(&r, &b, ROWS, y);
    for (int k = 0; k < ROWS * 11; k++)
      ck_assert_msg(memcmp(&y[k], &want[k], 4) == 0,
                    "%d devices, micro-batch %d, %s: output %d = %a, relu(x W^T + b) = %a",
                    n_dev, mb, inference ? "inference" : "training", k, (double)y[k],
                    (double)want[k]);
    if (!inference) step_ok(&r, &b, ROWS, NULL); /* and the same after a step */
    if (!inference) {
      get_params(&r, p);
      linear_relu_ref(b.x, ROWS, 13, 70, p, h);
      linear_relu_ref(h, ROWS, 70, 11, p + 70 * 13 + 70, want);
    }
  }
  free(p);
  batch_free(&b);
  rig_close(&r);
}
END_TEST

/* ---- arena high-water mark ------------------------------------------------- */

/* _i >= 4: the cpu backend's params=shared (only device 0 holds the
 * parameters, the replicas' arenas end earlier) */
START_TEST(test_high_water_equals_plan) {
  const char *specs[] = {SEED_SPEC, MLP_EVERY_KIND_SPEC};
  int n_dev = _i % 4 + 1;
  const char *opts = _i >= 4 ? "params=shared" : "";
  for (int k = 0; k < 4; k++) /* specs[k % 2], with recompute 3 for k >= 2 */
    for (int mb = 0; mb <= 4; mb += 4)
      for (int inference = 0; inference <= 1; inference++) {
        dp_config cfg =
            CFG(.batch = 30, .n_devices = n_dev, .opt = DP_OPT_ADAMW, .seed = 7);
        cfg.micro_batch = mb;
        cfg.inference = inference;
        cfg.recompute = k >= 2 ? 3 : 0;
        snprintf(cfg.backend_options, sizeof cfg.backend_options, "%s", opts);
        rig r;
        rig_open(&r, specs[k % 2], &cfg);
        batch b;
        batch_make(&b, r.m, 30, 81);
        float y[30 * 5];
        if (inference)
          forward_ok(&r, &b, 30, y);
        else
          step_ok(&r, &b, 30, NULL);
        for (int d = 0; d < dp_plan_n_devices(r.p); d++) {
          size_t want = plan_end(r.p, d), got = dp_ctx_high_water(r.c, d);
          ck_assert_msg(got == want,
                        "%s, %d devices %s, micro_batch %d, %s: device %d high water "
                        "%zu, plan %zu (arena %zu)",
                        k % 2 ? "mlp" : "seed", n_dev, opts, mb,
                        inference ? "inference" : "training", d, got, want,
                        dp_plan_device_bytes(r.p, d));
          ck_assert(want <= dp_plan_device_bytes(r.p, d));
        }
        ck_assert_int_eq((int)dp_ctx_high_water(r.c, dp_plan_n_devices(r.p)), 0);
        ck_assert_int_eq((int)dp_ctx_high_water(r.c, -1), 0);
        batch_free(&b);
        rig_close(&r);
      }
}
END_TEST

/* Every layer kind, fp32 and bf16 (whose shadow area the planner sizes from
 * each op's own copies: it was sized from the layers' widths, and a CIFAR-sized
 * CNN left 2.2 MB of its 8.8 MB workspace untouched), sync batchnorm, several
 * micro-batches of unequal rows, recompute, inference: the high water is the
 * plan's end. fp32 conv2d runs without im2col on the avx512 tier (conv_fast.c)
 * while the plan has room for the other tiers' im2col (a tier can change
 * between steps: dp_gemm_set_tier), so fp32 CNNs are checked on the avx2 tier,
 * and only to stay inside the plan on avx512. */
static const char *const HW_SPECS[] = {
    "input 2 6 6\nconv2d 4 3 padding 1\nbatchnorm\nrelu\nmaxpool2d 2\n"
    "conv2d 5 2 stride 1\ntanh\nflatten\ndropout 0.2\nlinear 7\nbatchnorm\nsigmoid\nlinear "
    "5\n"
    "loss softmax_cross_entropy\n",
    MLP_EVERY_KIND_SPEC,
    GPT_ADROP_SPEC,
    "input 12\nlinear 16\ngelu\nlinear 5\nresidual\nlayernorm\nlinear 5\nend\n"
    "linear 6\ntanh\nlinear 3\nloss mse\n",
};

/* Inputs and targets for any model here: token ids below the vocabulary of
 * GPT_ADROP_SPEC, labels below the output width, or values in (-1, 1). */
static void hw_batch(const dp_model *m, int rows, float *x, void *t) {
  int in = dp_model_input_width(m), tw = dp_model_target_width(m);
  int out = dp_model_output_width(m) / (tw > 1 ? tw : 1);
  bool tokens = in == GPT_T && out == GPT_V;
  for (int k = 0; k < rows * in; k++)
    x[k] = tokens ? (float)(k * 7 % GPT_V) : (float)((k * 37) % 29 - 14) / 15.0f;
  for (int k = 0; k < rows * tw; k++) {
    if (dp_model_loss(m) == DP_LOSS_MSE)
      ((float *)t)[k] = (float)(k % 5) / 5.0f;
    else
      ((int32_t *)t)[k] = k * 3 % out;
  }
}

START_TEST(test_high_water_every_layer_equals_plan) {
  const char *spec = HW_SPECS[_i % 4];
  bool conv = _i % 4 == 0;
  dp_precision prec = _i < 4 ? DP_PRECISION_FP32 : DP_PRECISION_BF16;
  enum { ROWS = 22 };
  for (int v = 0; v < 6; v++) {
    dp_config cfg =
        CFG(.batch = ROWS, .n_devices = 1 + v % 3, .opt = DP_OPT_ADAMW, .seed = 7);
    cfg.precision = prec;
    cfg.micro_batch = v >= 3 ? 4 : 0; /* 4, 4, ..., 2 rows */
    cfg.recompute = v == 4 ? 2 : 0;
    cfg.batchnorm = v == 5 ? DP_BN_SYNC : DP_BN_PER_REPLICA;
    for (int inference = 0; inference <= 1; inference++) {
      cfg.inference = inference;
      for (int t = 0; t < 2; t++) { /* avx512 (where there is one), then avx2 */
        if (dp_gemm_set_tier(t ? "avx2" : "auto") != DP_OK) continue;
        bool strict =
            !(conv && prec == DP_PRECISION_FP32) || strcmp(dp_gemm_tier(), "avx512");
        rig r;
        rig_open(&r, spec, &cfg);
        int in = dp_model_input_width(r.m), tw = dp_model_target_width(r.m);
        float *x = fbuf((size_t)ROWS * in),
              *y = fbuf((size_t)ROWS * dp_model_output_width(r.m));
        int32_t t32[ROWS * GPT_T];
        float tf[ROWS * 3];
        void *tg = dp_model_loss(r.m) == DP_LOSS_MSE ? (void *)tf : (void *)t32;
        ck_assert_int_le(ROWS * tw, ROWS * GPT_T);
        hw_batch(r.m, ROWS, x, tg);
        dp_status st = inference ? dp_forward(r.c, ROWS, in, x, y)
                                 : dp_train_step(r.c, ROWS, in, x, tg, NULL);
        ck_assert_msg(st == DP_OK, "spec %d: %s", _i % 4, dp_ctx_error(r.c));
        for (int d = 0; d < dp_plan_n_devices(r.p); d++) {
          size_t want = plan_end(r.p, d), got = dp_ctx_high_water(r.c, d);
          ck_assert_msg(strict ? got == want : got <= want && got > 0,
                        "spec %d, %s, tier %s, variant %d, %s: device %d high water %zu, "
                        "plan %zu",
                        _i % 4, dp_precision_name(prec), t ? "avx2" : "avx512", v,
                        inference ? "inference" : "training", d, got, want);
        }
        free(x);
        free(y);
        rig_close(&r);
      }
    }
  }
  dp_gemm_set_tier("auto");
}
END_TEST

/* Random models and configurations (a fixed seed: 400 draws of MLPs with every
 * elementwise kind and residual blocks, and small CNNs; fp32 and bf16, 1-4
 * devices, micro-batches, recompute, sync batchnorm, both modes, shared
 * parameters, inference): a full batch and a shorter one run, and the high
 * water is the plan's end; the sizing of the bf16 shadow area from each op's
 * copies is what this draws against (the fixed cases above each pass). fp32
 * conv2d runs on the avx2 tier (see above), and an inference plan only stays
 * inside its plan: it has im2col room for the whole micro-batch while its
 * forward runs chunks of 256 KiB of it. */
static uint64_t hw_rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void hw_random_spec(uint64_t *r, char *b, size_t cap, bool conv) {
#define HW_R(n) ((int)(hw_rnd(r) % (uint64_t)(n)))
  int n;
  if (conv) {
    static const char *const after[] = {
        "relu\n", "tanh\n", "batchnorm\n", "maxpool2d 2\n", "gelu\n", "dropout 0.1\n", ""};
    int h = 4 + 2 * HW_R(4);
    n = snprintf(b, cap, "input %d %d %d\nconv2d %d %d padding %d\n%sflatten\nlinear %d\n",
                 1 + HW_R(3), h, h, 2 + HW_R(6), 1 + 2 * HW_R(2), HW_R(2), after[HW_R(7)],
                 3 + HW_R(8));
  } else {
    static const char *const acts[] = {
        "relu\n",        "gelu\n",      "tanh\n", "sigmoid\n", "layernorm\n",
        "dropout 0.2\n", "batchnorm\n", "",       ""};
    n = snprintf(b, cap, "input %d\n", 3 + HW_R(20));
    for (int i = 0, L = 1 + HW_R(4); i < L; i++) {
      int w = 2 + HW_R(40); /* a block after it adds back to this width */
      n += snprintf(b + n, cap - (size_t)n, "linear %d%s\n%s", w, HW_R(5) ? "" : " nobias",
                    acts[HW_R(9)]);
      if (!HW_R(6))
        n += snprintf(b + n, cap - (size_t)n,
                      "residual\nlayernorm\nlinear %d\ngelu\nlinear %d\nend\n",
                      4 + HW_R(10), w);
    }
    n += snprintf(b + n, cap - (size_t)n, "linear %d\n", 2 + HW_R(6));
  }
  snprintf(b + n, cap - (size_t)n, "loss %s\n",
           conv || HW_R(2) ? "softmax_cross_entropy" : "mse");
}

static dp_config hw_random_config(uint64_t *r) {
  dp_config c = CFG(.batch = 4 + HW_R(40), .n_devices = 1 + HW_R(4),
                    .opt = HW_R(2) ? DP_OPT_ADAMW : DP_OPT_SGD, .seed = 7);
  c.micro_batch = HW_R(3) ? 0 : 2 + HW_R(5);
  c.recompute = HW_R(3) ? 0 : 1 + HW_R(3);
  c.precision = HW_R(2) ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
  c.inference = !HW_R(5);
  c.batchnorm = HW_R(3) ? DP_BN_PER_REPLICA : DP_BN_SYNC;
  c.mode = HW_R(2) ? DP_MODE_CLASSIC : DP_MODE_ALLREDUCE;
  if (!HW_R(4)) snprintf(c.backend_options, sizeof c.backend_options, "params=shared");
  return c;
#undef HW_R
}

START_TEST(test_high_water_random_configurations) {
  uint64_t r = 88172645463325252ull;
  int ran = 0;
  for (int it = 0; it < 400; it++) {
    char spec[1024];
    bool conv = hw_rnd(&r) % 3 == 0;
    hw_random_spec(&r, spec, sizeof spec, conv);
    dp_config c = hw_random_config(&r);
    dp_model *m = NULL;
    dp_plan *p = NULL;
    dp_ctx *x = NULL;
    ck_assert_msg(dp_model_parse(spec, "random", &m) == DP_OK, "%s: %s", spec,
                  dp_last_error());
    bool fp32_conv = conv && c.precision == DP_PRECISION_FP32;
    ck_assert_int_eq(dp_gemm_set_tier(fp32_conv ? "avx2" : "auto"), DP_OK);
    if (dp_plan_create(m, &c, &p) != DP_OK) { /* e.g. sync batchnorm with a block */
      dp_model_free(m);
      continue;
    }
    ck_assert_msg(dp_ctx_create(p, &x) == DP_OK, "%s", dp_last_error());
    int in = dp_model_input_width(m), tw = dp_model_target_width(m);
    int out = dp_model_output_width(m);
    float *xs = fbuf((size_t)c.batch * in), *y = fbuf((size_t)c.batch * out);
    int32_t *t = calloc((size_t)c.batch * out, 4);
    ck_assert_ptr_nonnull(t);
    for (int k = 0; k < c.batch * in; k++) xs[k] = (float)((k * 37) % 29 - 14) / 15.0f;
    if (dp_model_loss(m) != DP_LOSS_MSE)
      for (int k = 0; k < c.batch * tw; k++) t[k] = k % (out / tw);
    int rows[2] = {c.batch, 1 + (int)(hw_rnd(&r) % (uint64_t)c.batch)};
    for (int k = 0; k < 2; k++) {
      if (!c.inference && dp_plan_check_rows(p, rows[k]) != DP_OK) continue;
      dp_status st = c.inference ? dp_forward(x, rows[k], in, xs, y)
                                 : dp_train_step(x, rows[k], in, xs, t, NULL);
      ck_assert_msg(st == DP_OK, "draw %d, %d rows: %s\n%s", it, rows[k], dp_ctx_error(x),
                    spec);
      ran += k == 0;
      for (int d = 0; k == 0 && d < dp_plan_n_devices(p); d++) {
        size_t got = dp_ctx_high_water(x, d), want = plan_end(p, d);
        ck_assert_msg(fp32_conv && c.inference ? got <= want : got == want,
                      "draw %d: device %d high water %zu, plan %zu (%s, %d devices, "
                      "micro-batch %d, recompute %d, %s)\n%s",
                      it, d, got, want, dp_precision_name(c.precision), c.n_devices,
                      c.micro_batch, c.recompute, c.inference ? "inference" : "training",
                      spec);
      }
    }
    free(xs);
    free(y);
    free(t);
    dp_ctx_free(x);
    dp_plan_free(p);
    dp_model_free(m);
  }
  dp_gemm_set_tier("auto");
  ck_assert_int_ge(ran, 250);
}
END_TEST

/* Recompute's segments of several layers do not pack their weights once for
 * all micro-batches, and the workspace has no room for it then: the high
 * water is the plan's end (an outside check found 2 KiB of the 4 KiB
 * workspace never touched), in bf16 too (its shadow area is sized from each
 * op's copies). */
START_TEST(test_high_water_recompute_equals_plan) {
  for (int v = 0; v < 8; v++) {
    dp_config cfg = CFG(.batch = 32, .n_devices = 2, .opt = DP_OPT_ADAMW, .seed = 7);
    cfg.micro_batch = 4;
    cfg.recompute = 1 + v % 3;
    cfg.precision = v < 3 ? DP_PRECISION_FP32 : DP_PRECISION_BF16;
    /* v 6, 7: linears and relus alone in bf16, whose shadow area is the biases'
     * slots and the last layer's fp32 gradient's copy (it was reserved for
     * every linear: 1.6 KB more) */
    bool linears = v >= 6;
    rig r;
    rig_open(&r,
             linears ? "input 12\nlinear 100\nrelu\nlinear 50\nrelu\nlinear 5\n"
                       "loss softmax_cross_entropy\n"
                     : "input 12\nlinear 32\nrelu\nlayernorm\ndropout 0.1\nlinear 16\n"
                       "gelu\nlinear 5\nloss softmax_cross_entropy\n",
             &cfg);
    batch b;
    batch_make(&b, r.m, 32, 5);
    step_ok(&r, &b, 32, NULL);
    for (int d = 0; d < dp_plan_n_devices(r.p); d++) {
      dp_region_info w = dp_plan_region(r.p, d, DP_REGION_WORKSPACE);
      size_t hw = dp_ctx_high_water(r.c, d), end = plan_end(r.p, d);
      ck_assert_uint_eq(end, w.offset + w.size);
      ck_assert_msg(hw == end, "%s, recompute %d, device %d: high water %zu, plan %zu",
                    v < 3 ? "fp32" : "bf16", cfg.recompute, d, hw, end);
    }
    batch_free(&b);
    rig_close(&r);
  }
}
END_TEST

/* ---- caller-provided arenas ------------------------------------------------ */

START_TEST(test_static_ctx_matches_ctx_create) {
  int n_dev = _i + 1;
  dp_config cfg = CFG(.batch = 32, .n_devices = n_dev, .opt = DP_OPT_ADAMW, .seed = 7);
  rig r;
  rig_open(&r, MLP_EVERY_KIND_SPEC, &cfg);
  void *arenas[DP_MAX_DEVICES] = {0};
  int nd = dp_plan_n_devices(r.p);
  for (int d = 0; d < nd; d++) {
    arenas[d] = aligned_alloc(64, dp_plan_device_bytes(r.p, d));
    ck_assert_ptr_nonnull(arenas[d]);
  }
  ck_assert_int_eq((int)dp_plan_host_bytes(r.p), 0);
  dp_ctx *sc = NULL;
  ck_assert_msg(dp_ctx_create_static(r.p, arenas, NULL, &sc) == DP_OK, "%s", dp_last_error());
  size_t np = r.np;
  float *pa = fbuf(np), *pb = fbuf(np), ya[32 * 5], yb[32 * 5];
  for (int s = 0; s < 5; s++) {
    batch b;
    batch_make(&b, r.m, 32, 90 + (uint64_t)s);
    float la, lb;
    step_ok(&r, &b, s == 3 ? 21 : 32, &la);
    ck_assert_int_eq(dp_train_step(sc, s == 3 ? 21 : 32, b.in, b.x, b.ti, &lb), DP_OK);
    ck_assert(memcmp(&la, &lb, sizeof la) == 0);
    forward_ok(&r, &b, 32, ya);
    ck_assert_int_eq(dp_forward(sc, 32, b.in, b.x, yb), DP_OK);
    ck_assert(memcmp(ya, yb, sizeof ya) == 0);
    batch_free(&b);
  }
  get_params(&r, pa);
  ck_assert_int_eq(dp_get_params(sc, pb, np), DP_OK);
  ck_assert_msg(memcmp(pa, pb, np * sizeof *pa) == 0, "static and allocated contexts differ");
  ck_assert(dp_params_hash(sc) == dp_params_hash(r.c));
  /* the context really lives in the caller's memory */
  dp_region_info pr = dp_plan_region(r.p, 0, DP_REGION_PARAMS);
  ck_assert(memcmp((unsigned char *)arenas[0] + pr.offset, pb, np * sizeof *pb) == 0);
  for (int d = 0; d < nd; d++)
    ck_assert_uint_eq(dp_ctx_high_water(sc, d), dp_ctx_high_water(r.c, d));
  dp_ctx_free(sc); /* must not free the caller's arenas */
  for (int d = 0; d < nd; d++) free(arenas[d]);
  free(pa);
  free(pb);
  rig_close(&r);
}
END_TEST

START_TEST(test_static_ctx_refuses_bad_arenas) {
  dp_config cfg = CFG(.batch = 30, .n_devices = 3, .opt = DP_OPT_SGD, .seed = 7);
  rig r;
  rig_open(&r, SEED_SPEC, &cfg);
  int nd = dp_plan_n_devices(r.p);
  ck_assert_int_eq(nd, 3);
  void *arenas[DP_MAX_DEVICES] = {0}, *raw[DP_MAX_DEVICES] = {0};
  for (int d = 0; d < nd; d++) {
    raw[d] = aligned_alloc(64, dp_plan_device_bytes(r.p, d) + 64);
    ck_assert_ptr_nonnull(raw[d]);
    arenas[d] = raw[d];
  }
  dp_ctx *sc = (dp_ctx *)&cfg; /* any non-NULL value: it must be reset */
  ck_assert_int_eq(dp_ctx_create_static(r.p, NULL, NULL, &sc), DP_ERR_INVALID);
  ck_assert_ptr_null(sc);
  ck_assert(dp_last_error()[0] != '\0');

  for (int d = 0; d < nd; d++) {
    void *keep = arenas[d];
    arenas[d] = NULL;
    sc = (dp_ctx *)&cfg;
    ck_assert_int_eq(dp_ctx_create_static(r.p, arenas, NULL, &sc), DP_ERR_INVALID);
    ck_assert_ptr_null(sc);
    ck_assert_ptr_nonnull(strstr(dp_last_error(), "NULL"));
    for (int off = 4; off < 64; off *= 2) {
      arenas[d] = (unsigned char *)keep + off;
      sc = (dp_ctx *)&cfg;
      ck_assert_int_eq(dp_ctx_create_static(r.p, arenas, NULL, &sc), DP_ERR_INVALID);
      ck_assert_ptr_null(sc);
      ck_assert_ptr_nonnull(strstr(dp_last_error(), "align"));
    }
    arenas[d] = keep;
  }
  ck_assert_int_eq(dp_ctx_create_static(NULL, arenas, NULL, &sc), DP_ERR_INVALID);
  ck_assert_int_eq(dp_ctx_create_static(r.p, arenas, NULL, NULL), DP_ERR_INVALID);
  ck_assert_int_eq(dp_ctx_create(NULL, &sc), DP_ERR_INVALID);
  ck_assert_int_eq(dp_ctx_create(r.p, NULL), DP_ERR_INVALID);
  /* two devices on the same or overlapping memory (issue 12, item 4) */
  for (int d = 1; d < nd; d++) {
    void *keep = arenas[d];
    size_t shift[] = {0, 64, dp_plan_device_bytes(r.p, 0) - 64};
    for (int k = 0; k < 3; k++) {
      arenas[d] = (unsigned char *)arenas[0] + shift[k];
      sc = (dp_ctx *)&cfg;
      ck_assert_int_eq(dp_ctx_create_static(r.p, arenas, NULL, &sc), DP_ERR_INVALID);
      ck_assert_ptr_null(sc);
      ck_assert_msg(strstr(dp_last_error(), "overlaps"), "%s", dp_last_error());
    }
    arenas[d] = keep;
  }
  /* and the good arenas work */
  ck_assert_int_eq(dp_ctx_create_static(r.p, arenas, NULL, &sc), DP_OK);
  dp_ctx_free(sc);
  for (int d = 0; d < nd; d++) free(raw[d]);
  rig_close(&r);
}
END_TEST

/* ---- learning -------------------------------------------------------------- */

/* Four Gaussian-ish blobs in 8 dims, centres 2.5 * e_k, noise U(-1, 1)^8 plus a
 * shared random offset: linearly separable with margin. */
START_TEST(test_training_learns_separable_problem) {
  enum { N = 128, IN = 8, K = 4, STEPS = 200 };
  static const char spec[] = "input 8\nlinear 32\ngelu\nlinear 32\nrelu\nlinear 4\n"
                             "loss softmax_cross_entropy\n";
  dp_config cfg = CFG(.batch = N, .n_devices = 3, .opt = DP_OPT_ADAMW, .seed = 7);
  cfg.lr = 0.01f;
  rig r;
  rig_open(&r, spec, &cfg);
  static float x[N * IN], y[N * K];
  int32_t t[N];
  uint64_t s = 12345;
  for (int i = 0; i < N; i++) {
    t[i] = i % K;
    for (int j = 0; j < IN; j++)
      x[i * IN + j] = rng_unif(&s, -1.0f, 1.0f) + (j == t[i] ? 2.5f : 0.0f) + 0.3f;
  }
  float first = 0, last = 0;
  for (int k = 0; k < STEPS; k++) {
    float l;
    ck_assert_msg(dp_train_step(r.c, N, IN, x, t, &l) == DP_OK, "%s", dp_ctx_error(r.c));
    if (k == 0) first = l;
    last = l;
  }
  ck_assert_int_eq(dp_forward(r.c, N, IN, x, y), DP_OK);
  int correct = 0;
  for (int i = 0; i < N; i++) {
    int best = 0;
    for (int j = 1; j < K; j++)
      if (y[i * K + j] > y[i * K + best]) best = j;
    correct += best == t[i];
  }
  double acc = (double)correct / N;
  ck_assert_msg(acc > 0.95, "training accuracy %.3f after %d steps (loss %g -> %g)", acc, STEPS,
                (double)first, (double)last);
  ck_assert_msg(last < 0.25f * first, "loss only went from %g to %g", (double)first,
                (double)last);
  rig_close(&r);
}
END_TEST

/* ---- optimizers against hand computations --------------------------------- */

/* Seed model (Linear(5, 2), mse, mean over all 60 elements), 30 rows: the loss
 * and gradients by hand, in double. */
static void seed_by_hand(const float *p, const batch *b, double *loss, double *g) {
  const float *w = p, *bias = p + 10;
  double s = 0.0;
  for (int k = 0; k < 12; k++) g[k] = 0.0;
  for (int r = 0; r < b->rows; r++)
    for (int o = 0; o < 2; o++) {
      double y = bias[o];
      for (int k = 0; k < 5; k++) y += (double)w[o * 5 + k] * b->x[r * 5 + k];
      double diff = y - b->tf[r * 2 + o], dy = 2.0 * diff / (b->rows * 2.0);
      s += diff * diff;
      for (int k = 0; k < 5; k++) g[o * 5 + k] += dy * b->x[r * 5 + k];
      g[10 + o] += dy;
    }
  *loss = s / (b->rows * 2.0);
}

static void assert_near_d(const float *got, const double *want, size_t n, double rel,
                          double abs_tol, const char *what) {
  for (size_t k = 0; k < n; k++)
    ck_assert_msg(fabs(got[k] - want[k]) <= rel * fabs(want[k]) + abs_tol,
                  "%s[%zu] = %.9g, want %.9g", what, k, (double)got[k], want[k]);
}

START_TEST(test_seed_loss_and_grads_by_hand) {
  for (int n_dev = 1; n_dev <= 4; n_dev++) {
    dp_config cfg = CFG(.batch = 30, .n_devices = n_dev, .opt = DP_OPT_SGD, .seed = 7);
    rig r;
    rig_open(&r, SEED_SPEC, &cfg);
    ck_assert_int_eq((int)dp_model_n_params(r.m), 12);
    float *p = params_random(12, 111), g[12];
    set_params(&r, p);
    batch b;
    batch_make(&b, r.m, 30, 112);
    double wl, wg[12];
    seed_by_hand(p, &b, &wl, wg);
    float l;
    step_ok(&r, &b, 30, &l);
    get_grads(&r, g);
    ck_assert_msg(fabs(l - wl) <= 1e-6 * wl, "loss %.9g, want %.9g", (double)l, wl);
    assert_near_d(g, wg, 12, 1e-5, 1e-7, "grad");
    free(p);
    batch_free(&b);
    rig_close(&r);
  }
}
END_TEST

START_TEST(test_sgd_matches_pytorch_rule) {
  dp_config cfg = CFG(.batch = 30, .n_devices = 2, .opt = DP_OPT_SGD, .seed = 7);
  cfg.lr = 0.05f;
  cfg.weight_decay = 0.1f;
  rig r;
  rig_open(&r, SEED_SPEC, &cfg);
  float *p0 = params_random(12, 121), g[12], p1[12];
  double want[12];
  set_params(&r, p0);
  float p[12];
  memcpy(p, p0, sizeof p);
  for (int s = 0; s < 3; s++) {
    batch b;
    batch_make(&b, r.m, 30, 122 + (uint64_t)s);
    step_ok(&r, &b, 30, NULL);
    get_grads(&r, g);
    get_params(&r, p1);
    for (int k = 0; k < 12; k++) /* torch.optim.SGD: p -= lr * (g + wd * p) */
      want[k] = p[k] - 0.05 * ((double)g[k] + 0.1 * p[k]);
    assert_near_d(p1, want, 12, 1e-6, 1e-7, "sgd param");
    memcpy(p, p1, sizeof p);
    batch_free(&b);
  }
  free(p0);
  rig_close(&r);
}
END_TEST

/* torch.optim.SGD(lr, momentum, dampening, weight_decay, nesterov), in double:
 * d = g + wd p; buf = d on the first step, mu buf + (1 - dampening) d after;
 * the step is buf, or d + mu buf with nesterov; p -= lr * step. DP_OPT_SGD
 * with momentum > 0 is the same optimizer as DP_OPT_MOMENTUM. */
START_TEST(test_momentum_matches_pytorch_rule) {
  const struct {
    dp_optimizer opt;
    float mu, damp, wd;
    int nesterov;
  } cases[] = {
      {DP_OPT_MOMENTUM, 0.9f, 0.0f, 0.0f, 0},  {DP_OPT_MOMENTUM, 0.9f, 0.0f, 0.01f, 0},
      {DP_OPT_SGD, 0.9f, 0.0f, 0.01f, 0},      {DP_OPT_SGD, 0.8f, 0.3f, 0.0f, 0},
      {DP_OPT_MOMENTUM, 0.7f, 1.0f, 0.02f, 0}, {DP_OPT_SGD, 0.9f, 0.0f, 0.0f, 1},
      {DP_OPT_MOMENTUM, 0.5f, 0.0f, 0.01f, 1},
  };
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    dp_config cfg = CFG(.batch = 30, .n_devices = 3, .opt = cases[ci].opt, .seed = 7);
    cfg.lr = 0.05f;
    cfg.momentum = cases[ci].mu;
    cfg.dampening = cases[ci].damp;
    cfg.nesterov = cases[ci].nesterov;
    cfg.weight_decay = cases[ci].wd;
    rig r;
    rig_open(&r, SEED_SPEC, &cfg);
    float *p0 = params_random(12, 131), g[12], p[12], p1[12];
    double buf[12] = {0}, want[12], mu = cases[ci].mu, wd = cases[ci].wd, lr = 0.05,
                              damp = cases[ci].damp;
    set_params(&r, p0);
    memcpy(p, p0, sizeof p);
    for (int s = 0; s < 4; s++) {
      batch b;
      batch_make(&b, r.m, 30, 132 + (uint64_t)s);
      step_ok(&r, &b, 30, NULL);
      get_grads(&r, g);
      get_params(&r, p1);
      for (int k = 0; k < 12; k++) {
        double d = (double)g[k] + wd * p[k];
        buf[k] = s == 0 ? d : mu * buf[k] + (1.0 - damp) * d;
        want[k] = p[k] - lr * (cases[ci].nesterov ? d + mu * buf[k] : buf[k]);
      }
      char what[64];
      snprintf(what, sizeof what, "momentum case %zu param", ci);
      assert_near_d(p1, want, 12, 1e-6, 1e-7, what);
      memcpy(p, p1, sizeof p);
      batch_free(&b);
    }
    free(p0);
    rig_close(&r);
  }
}
END_TEST

/* dp_set_lr (issue 16, item 1): steps after it are exactly those of a context
 * planned with the new rate from the same state (a checkpoint carries the
 * state, not the rate); refusals change nothing; an inference context has none. */
START_TEST(test_set_lr_changes_the_rate_of_later_steps_only) {
  const struct {
    dp_mode mode;
    int shard, n;
  } layouts[] = {{DP_MODE_CLASSIC, 0, 1}, {DP_MODE_CLASSIC, 0, 3}, {DP_MODE_ALLREDUCE, 1, 4}};
  for (int opt = 0; opt < 3; opt++)
    for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++) {
      dp_config a =
          CFG(.batch = 32, .n_devices = layouts[li].n, .opt = (dp_optimizer)opt, .seed = 7);
      a.mode = layouts[li].mode;
      a.shard_optimizer = layouts[li].shard;
      if (opt == DP_OPT_MOMENTUM) a.momentum = 0.9f;
      a.lr = 0.05f;
      dp_config b = a;
      b.lr = 0.0125f;
      rig ra, rb;
      rig_open(&ra, MLP_EVERY_KIND_SPEC, &a);
      ck_assert(dp_ctx_lr(ra.c) == 0.05f);
      batch bt[6];
      for (int k = 0; k < 6; k++) batch_make(&bt[k], ra.m, 32, 500 + (uint64_t)k);
      for (int k = 0; k < 3; k++) step_ok(&ra, &bt[k], 32, NULL);
      char ck[64];
      snprintf(ck, sizeof ck, "/tmp/dp_test_lr_%d.ckpt", (int)getpid());
      ck_assert_int_eq(dp_ckpt_save(ra.c, ck), DP_OK);
      /* refused: nothing changes */
      const float bad[] = {-1e-9f, -1.0f, INFINITY, NAN};
      for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(dp_set_lr(ra.c, bad[i]), DP_ERR_INVALID);
        ck_assert_msg(strstr(dp_ctx_error(ra.c), "learning rate"), "%s", dp_ctx_error(ra.c));
      }
      if (opt == DP_OPT_ADAMW) ck_assert_int_eq(dp_set_lr(ra.c, 200.0f), DP_ERR_INVALID);
      ck_assert(dp_ctx_lr(ra.c) == 0.05f);
      ck_assert_int_eq(dp_set_lr(ra.c, 0.0125f), DP_OK);
      ck_assert(dp_ctx_lr(ra.c) == 0.0125f);
      for (int k = 3; k < 6; k++) step_ok(&ra, &bt[k], 32, NULL);
      rig_open(&rb, MLP_EVERY_KIND_SPEC, &b);
      ck_assert_int_eq(dp_ckpt_load(rb.c, ck), DP_OK);
      ck_assert(dp_ctx_lr(rb.c) == 0.05f); /* the file's rate (version 2) */
      ck_assert_int_eq(dp_set_lr(rb.c, 0.0125f), DP_OK);
      for (int k = 3; k < 6; k++) step_ok(&rb, &bt[k], 32, NULL);
      ck_assert_msg(dp_params_hash(ra.c) == dp_params_hash(rb.c),
                    "optimizer %d layout %zu: a rate set between steps differs from one "
                    "planned",
                    opt, li);
      unlink(ck);
      for (int k = 0; k < 6; k++) batch_free(&bt[k]);
      rig_close(&ra);
      rig_close(&rb);
    }
  dp_config ci = CFG(.batch = 8, .n_devices = 1, .opt = DP_OPT_SGD, .seed = 7);
  ci.inference = 1;
  rig ri;
  rig_open(&ri, SEED_SPEC, &ci);
  ck_assert_int_eq(dp_set_lr(ri.c, 0.1f), DP_ERR_INVALID);
  rig_close(&ri);
  ck_assert_int_eq(dp_set_lr(NULL, 0.1f), DP_ERR_INVALID);
}
END_TEST

/* dp_set_momentum (OneCycleLR's cycle_momentum): steps after it are exactly
 * those of a context planned with that momentum (SGD's) or beta1 (Adam's and
 * AdamW's, whose bias correction takes the one in effect) from the same state;
 * a checkpoint carries it (version 4), an older file leaves the context's own;
 * refusals change nothing; plain SGD and inference have none. */
START_TEST(test_set_momentum_changes_the_momentum_of_later_steps_only) {
  const dp_optimizer opts[] = {DP_OPT_MOMENTUM, DP_OPT_ADAMW, DP_OPT_ADAM};
  const struct {
    dp_mode mode;
    int shard, n;
  } layouts[] = {
      {DP_MODE_CLASSIC, 0, 1}, {DP_MODE_CLASSIC, 0, 3}, {DP_MODE_ALLREDUCE, 1, 4}};
  for (int oi = 0; oi < 3; oi++)
    for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++) {
      dp_optimizer opt = opts[oi];
      bool adam = opt != DP_OPT_MOMENTUM;
      dp_config a = CFG(.batch = 32, .n_devices = layouts[li].n, .opt = opt, .seed = 7);
      a.mode = layouts[li].mode;
      a.shard_optimizer = layouts[li].shard;
      a.lr = adam ? 0.01f : 0.05f;
      dp_config b = a;
      if (adam) {
        a.beta1 = 0.9f;
        b.beta1 = 0.55f;
      } else {
        a.momentum = 0.9f;
        b.momentum = 0.55f;
      }
      rig ra, rb;
      rig_open(&ra, MLP_EVERY_KIND_SPEC, &a);
      ck_assert(dp_ctx_momentum(ra.c) == 0.9f);
      batch bt[6];
      for (int k = 0; k < 6; k++) batch_make(&bt[k], ra.m, 32, 700 + (uint64_t)k);
      for (int k = 0; k < 3; k++) step_ok(&ra, &bt[k], 32, NULL);
      char ck[64], ck3[64];
      snprintf(ck, sizeof ck, "/tmp/dp_test_mom_%d.ckpt", (int)getpid());
      snprintf(ck3, sizeof ck3, "/tmp/dp_test_mom3_%d.ckpt", (int)getpid());
      ck_assert_int_eq(dp_ckpt_save(ra.c, ck), DP_OK);
      size_t len, n3;
      unsigned char *v4 = file_read(ck, &len);
      unsigned char *v3 = ckpt_as_version(v4, len, 3, &n3);
      file_write(ck3, v3, n3);
      free(v3);
      free(v4);
      const float bad[] = {-1e-9f, 1.0f, 1.5f, INFINITY, NAN};
      for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(dp_set_momentum(ra.c, bad[i]), DP_ERR_INVALID);
        ck_assert_msg(strstr(dp_ctx_error(ra.c), adam ? "beta1" : "momentum"), "%s",
                      dp_ctx_error(ra.c));
      }
      ck_assert(dp_ctx_momentum(ra.c) == 0.9f);
      ck_assert_int_eq(dp_set_momentum(ra.c, 0.55f), DP_OK);
      ck_assert(dp_ctx_momentum(ra.c) == 0.55f);
      for (int k = 3; k < 6; k++) step_ok(&ra, &bt[k], 32, NULL);
      /* planned with 0.55: the version 3 file leaves it; then the same steps */
      rig_open(&rb, MLP_EVERY_KIND_SPEC, &b);
      ck_assert_int_eq(dp_ckpt_load(rb.c, ck3), DP_OK);
      ck_assert(dp_ctx_momentum(rb.c) == 0.55f);
      for (int k = 3; k < 6; k++) step_ok(&rb, &bt[k], 32, NULL);
      ck_assert_msg(dp_params_hash(ra.c) == dp_params_hash(rb.c),
                    "optimizer %d layout %zu: a momentum set between steps differs from "
                    "one planned",
                    opt, li);
      /* version 4 restores the momentum in effect when it was saved */
      ck_assert_int_eq(dp_ckpt_load(rb.c, ck), DP_OK);
      ck_assert(dp_ctx_momentum(rb.c) == 0.9f);
      unlink(ck);
      unlink(ck3);
      for (int k = 0; k < 6; k++) batch_free(&bt[k]);
      rig_close(&ra);
      rig_close(&rb);
    }
  dp_config cs = CFG(.batch = 8, .n_devices = 2, .opt = DP_OPT_SGD, .seed = 7);
  rig rs;
  rig_open(&rs, SEED_SPEC, &cs);
  ck_assert(dp_ctx_momentum(rs.c) == 0.0f);
  ck_assert_int_eq(dp_set_momentum(rs.c, 0.9f), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_ctx_error(rs.c), "config.momentum > 0"), "%s",
                dp_ctx_error(rs.c));
  rig_close(&rs);
  dp_config ci = CFG(.batch = 8, .n_devices = 1, .opt = DP_OPT_ADAMW, .seed = 7);
  ci.inference = 1;
  rig ri;
  rig_open(&ri, SEED_SPEC, &ci);
  ck_assert(dp_ctx_momentum(ri.c) == 0.0f);
  ck_assert_int_eq(dp_set_momentum(ri.c, 0.9f), DP_ERR_INVALID);
  rig_close(&ri);
  ck_assert_int_eq(dp_set_momentum(NULL, 0.9f), DP_ERR_INVALID);
}
END_TEST

/* One line of tests/golden/onecycle_training.txt: its word, then up to cap
 * floats into v; returns their count. */
static int golden_floats(FILE *f, const char *word, float *v, int cap) {
  static char line[16384];
  ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
  size_t w = strlen(word);
  ck_assert_msg(strncmp(line, word, w) == 0 && line[w] == ' ', "expected %s: %.40s", word,
                line);
  int n = 0;
  for (char *p = line + w, *end; n < cap; p = end, n++) {
    v[n] = strtof(p, &end);
    if (end == p) break;
  }
  return n;
}

/* OneCycleLR with cycle_momentum against PyTorch (tests/golden/onecycle_training.txt,
 * written by make_lr_golden.py): Linear(6, 8), Tanh, Linear(8, 3) and MSELoss,
 * 12 steps of SGD (whose momentum 0 OneCycleLR replaces), SGD with nesterov
 * (three phases), Adam (its beta1 cycled) and AdamW (linear annealing), each
 * step's rate and momentum set from dp_lr_at and dp_momentum_at, on 1 and 2
 * devices: within 2.3e-7 of the largest parameter when written. Holding the
 * momentum at max_momentum instead misses by 0.08-0.15. */
START_TEST(test_onecycle_momentum_trains_as_pytorch) {
  FILE *f = fopen("tests/golden/onecycle_training.txt", "r");
  ck_assert_msg(
      f, "tests/golden/onecycle_training.txt: run the tests from the repository root");
  char line[256];
  ck_assert_ptr_nonnull(fgets(line, sizeof line, f)); /* the header */
  static float x[16 * 6], y[16 * 3], p0[128], want[128], got[128];
  ck_assert_int_eq(golden_floats(f, "x", x, 16 * 6), 16 * 6);
  ck_assert_int_eq(golden_floats(f, "y", y, 16 * 3), 16 * 3);
  static const char spec[] = "input 6\nlinear 8\ntanh\nlinear 3\nloss mse\n";
  for (int tr = 0; tr < 4; tr++) {
    char name[32];
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    ck_assert_int_eq(sscanf(line, "train %31s", name), 1);
    float lr, wd;
    int total;
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    ck_assert_int_eq(sscanf(line, "hparams %f %f %d", &lr, &wd, &total), 3);
    int np = golden_floats(f, "params0", p0, 128);
    ck_assert_int_eq(np, 8 * 6 + 8 + 3 * 8 + 3);
    ck_assert_int_eq(golden_floats(f, "params", want, 128), np);
    dp_lr_schedule s;
    dp_lr_schedule_onecycle(&s, lr, total);
    dp_optimizer opt = tr < 2 ? DP_OPT_MOMENTUM : tr == 2 ? DP_OPT_ADAM : DP_OPT_ADAMW;
    if (tr == 1) s.three_phase = 1;
    if (tr == 2) s.base_momentum = 0.8f, s.max_momentum = 0.9f;
    if (tr == 3) s.anneal_linear = 1;
    double worst = 0.0, held = 0.0;
    for (int run = 0; run < 3; run++) { /* 1 device, 2 devices, held momentum */
      dp_config cfg = CFG(.batch = 16, .n_devices = run == 1 ? 2 : 1, .opt = opt);
      cfg.lr = lr;
      cfg.weight_decay = wd;
      cfg.nesterov = tr == 1;
      if (opt == DP_OPT_MOMENTUM) /* OneCycleLR sets it when made, as the beta1 */
        cfg.momentum = s.max_momentum;
      else
        cfg.beta1 = s.max_momentum;
      rig r;
      rig_open(&r, spec, &cfg);
      ck_assert_int_eq(dp_set_params(r.c, p0, (size_t)np), DP_OK);
      for (int t = 0; t < total; t++) {
        ck_assert_int_eq(dp_set_lr(r.c, dp_lr_at(&s, (uint64_t)t)), DP_OK);
        if (run < 2)
          ck_assert_int_eq(dp_set_momentum(r.c, dp_momentum_at(&s, (uint64_t)t)), DP_OK);
        ck_assert_msg(dp_train_step(r.c, 16, 6, x, y, NULL) == DP_OK, "%s",
                      dp_ctx_error(r.c));
      }
      ck_assert_int_eq(dp_get_params(r.c, got, (size_t)np), DP_OK);
      double wmax = 0.0, e = 0.0;
      for (int k = 0; k < np; k++) wmax = fmax(wmax, fabs(want[k]));
      for (int k = 0; k < np; k++) e = fmax(e, fabs(got[k] - want[k]) / wmax);
      if (run < 2)
        worst = fmax(worst, e);
      else
        held = e;
      rig_close(&r);
    }
    ck_assert_msg(worst <= 2e-6, "%s: libdp against PyTorch: %g of the largest parameter",
                  name, worst);
    ck_assert_msg(held > 100 * worst && held > 1e-4,
                  "%s: the momentum held at max_momentum misses by only %g (cycled %g)",
                  name, held, worst);
  }
  fclose(f);
}
END_TEST

/* The layouts of the non-finite update tests: (mode, shard_optimizer, devices);
 * allreduce with 3 devices reduces to device 0 and scatters, the others halve. */
static const struct {
  dp_mode mode;
  int shard, n;
} nf_layouts[] = {{DP_MODE_CLASSIC, 0, 1},   {DP_MODE_CLASSIC, 0, 2},
                  {DP_MODE_ALLREDUCE, 0, 2}, {DP_MODE_ALLREDUCE, 0, 4},
                  {DP_MODE_ALLREDUCE, 1, 4}, {DP_MODE_ALLREDUCE, 0, 3},
                  {DP_MODE_ALLREDUCE, 1, 3}};

/* Batch 32 in layout li with optimizer opt, no weight decay. */
static dp_config nf_config(size_t li, int opt) {
  dp_config cfg =
      CFG(.batch = 32, .n_devices = nf_layouts[li].n, .opt = (dp_optimizer)opt, .seed = 7);
  cfg.mode = nf_layouts[li].mode;
  cfg.shard_optimizer = nf_layouts[li].shard;
  cfg.weight_decay = 0.0f;
  return cfg;
}

/* The refusal names the first parameter whose update is non-finite, the same
 * one in every layout: allreduce mode checks each device's reduced segment
 * (not every device its whole gradient), in ascending order. Inputs 0..2 are
 * zero, so parameters 0-2 and 5-7 (their weights) keep a zero gradient and a
 * finite update under SGD and momentum; the first bad one is 3, in the second
 * of four segments (the third device's). */
START_TEST(test_nonfinite_update_names_the_first_parameter_in_every_layout) {
  size_t want = 0;
  for (int opt = 0; opt < 3; opt++)
    for (size_t li = 0; li < sizeof nf_layouts / sizeof nf_layouts[0]; li++) {
      dp_config cfg = nf_config(li, opt);
      cfg.lr = 3e38f;
      rig r;
      rig_open(&r, SEED_SPEC, &cfg);
      batch b;
      batch_make(&b, r.m, 32, 78);
      for (int k = 0; k < 32; k++) /* and large gradients for the others */
        for (int j = 0; j < b.in; j++)
          b.x[k * b.in + j] = j < 3 ? 0.0f : b.x[k * b.in + j] * 1e3f;
      dp_status st = dp_train_step(r.c, 32, b.in, b.x, batch_t(&b), NULL);
      ck_assert_msg(st == DP_ERR_NONFINITE, "opt %d layout %zu: %s (%s)", opt, li,
                    dp_status_name(st), dp_ctx_error(r.c));
      const char *at = strstr(dp_ctx_error(r.c), "parameter ");
      size_t k = SIZE_MAX;
      ck_assert_msg(at && sscanf(at, "parameter %zu", &k) == 1, "%s", dp_ctx_error(r.c));
      if (li == 0) want = k;
      ck_assert_msg(k == want, "opt %d layout %zu: names parameter %zu, not %zu: %s", opt,
                    li, k, want, dp_ctx_error(r.c));
      /* AdamW's step size overflows at this rate: every update is bad */
      ck_assert_msg(k == (opt == DP_OPT_ADAMW ? 0u : 3u), "opt %d: parameter %zu", opt, k);
      batch_free(&b);
      rig_close(&r);
    }
}
END_TEST

/* An update that would leave a parameter (or its optimizer state) non-finite
 * is refused like a non-finite gradient: DP_ERR_NONFINITE naming the cause,
 * parameters, optimizer state and step counter bytewise as they were, in
 * every layout; a later good step still runs (issue 12, item 3). */
START_TEST(test_nonfinite_update_is_refused_and_changes_nothing) {
  for (int opt = 0; opt < 3; opt++)
    for (size_t li = 0; li < sizeof nf_layouts / sizeof nf_layouts[0]; li++) {
      dp_config cfg = nf_config(li, opt);
      rig r;
      rig_open(&r, SEED_SPEC, &cfg);
      batch b;
      batch_make(&b, r.m, 32, 77);
      step_ok(&r, &b, 32, NULL); /* some optimizer state to keep */
      char ck0[64], ck1[64];
      snprintf(ck0, sizeof ck0, "/tmp/dp_test_nfu_%d_a.ckpt", (int)getpid());
      snprintf(ck1, sizeof ck1, "/tmp/dp_test_nfu_%d_b.ckpt", (int)getpid());
      ck_assert_int_eq(dp_ckpt_save(r.c, ck0), DP_OK);
      uint64_t h0 = dp_params_hash(r.c), step0 = dp_ctx_step(r.c);
      /* the same state under an overflowing rate (lr is not part of a
       * checkpoint's identity: load it into a context planned with it) */
      dp_config big = cfg;
      big.lr = 3e38f;
      rig r2;
      rig_open(&r2, SEED_SPEC, &big);
      ck_assert_msg(dp_ckpt_load(r2.c, ck0) == DP_OK, "%s", dp_last_error());
      ck_assert_int_eq(dp_set_lr(r2.c, big.lr), DP_OK); /* the load restored the file's */
      float loss = 0.0f;
      for (int k = 0; k < 32 * b.in; k++) b.x[k] *= 1e3f; /* large gradients */
      dp_status st = dp_train_step(r2.c, 32, b.in, b.x, batch_t(&b), &loss);
      ck_assert_msg(st == DP_ERR_NONFINITE, "opt %d layout %zu: %s (%s)", opt, li,
                    dp_status_name(st), dp_ctx_error(r2.c));
      ck_assert_msg(strstr(dp_ctx_error(r2.c), "non-finite") &&
                        strstr(dp_ctx_error(r2.c), "lr 3e+38"),
                    "%s", dp_ctx_error(r2.c));
      ck_assert_uint_eq(dp_params_hash(r2.c), h0);
      ck_assert_uint_eq(dp_ctx_step(r2.c), step0);
      ck_assert_int_eq(dp_set_lr(r2.c, cfg.lr), DP_OK); /* the file holds the rate too */
      ck_assert_int_eq(dp_ckpt_save(r2.c, ck1), DP_OK);
      FILE *fa = fopen(ck0, "rb"), *fb = fopen(ck1, "rb");
      ck_assert(fa && fb);
      int ca, cb, same = 1;
      do {
        ca = fgetc(fa);
        cb = fgetc(fb);
        same &= ca == cb;
      } while (ca != EOF && cb != EOF);
      fclose(fa);
      fclose(fb);
      ck_assert_msg(same, "opt %d layout %zu: the refused step changed the saved state", opt,
                    li);
      for (int k = 0; k < 32 * b.in; k++) b.x[k] /= 1e3f;
      step_ok(&r, &b, 32, NULL); /* the original context still trains */
      unlink(ck0);
      unlink(ck1);
      batch_free(&b);
      rig_close(&r2);
      rig_close(&r);
    }
}
END_TEST

START_TEST(test_adamw_matches_pytorch_rule) {
  dp_config cfg = CFG(.batch = 30, .n_devices = 2, .opt = DP_OPT_ADAMW, .seed = 7);
  cfg.lr = 0.01f;
  rig r;
  rig_open(&r, SEED_SPEC, &cfg);
  const dp_config *pc = dp_plan_config(r.p);
  ck_assert_msg(fabsf(pc->weight_decay - 0.01f) == 0.0f, "AdamW's default weight decay is %g",
                (double)pc->weight_decay);
  double lr = pc->lr, b1 = pc->beta1, b2 = pc->beta2, eps = pc->eps, wd = pc->weight_decay;
  float *p0 = params_random(12, 141), g[12], p[12], p1[12];
  double m[12] = {0}, v[12] = {0}, want[12];
  set_params(&r, p0);
  memcpy(p, p0, sizeof p);
  for (int s = 0; s < 4; s++) {
    batch b;
    batch_make(&b, r.m, 30, 142 + (uint64_t)s);
    step_ok(&r, &b, 30, NULL);
    get_grads(&r, g);
    get_params(&r, p1);
    /* torch.optim.AdamW: p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
     * p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps) */
    double t = s + 1, bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
    for (int k = 0; k < 12; k++) {
      m[k] = b1 * m[k] + (1.0 - b1) * g[k];
      v[k] = b2 * v[k] + (1.0 - b2) * (double)g[k] * g[k];
      double q = p[k] * (1.0 - lr * wd);
      want[k] = q - lr / bc1 * m[k] / (sqrt(v[k]) / sqrt(bc2) + eps);
    }
    assert_near_d(p1, want, 12, 1e-6, 1e-7, "adamw param");
    memcpy(p, p1, sizeof p);
    batch_free(&b);
  }
  free(p0);
  rig_close(&r);
}
END_TEST

/* ---- profile ------------------------------------------------------------------ */

/* The events of 5 steps of an MLP on 2 devices: each op of the schedule once
 * per step (a shared op once per thread), each of a thread's totals inside
 * the steps' wall time, every class present. Consistency only: no time is
 * asserted. loop i: 0 the small MLP (no shared ops), 1 a wide one whose
 * reduction, check and update are shared by both threads. */
START_TEST(test_profile_totals_are_consistent) {
  static const char *specs[] = {
      "input 16\nlinear 32\nrelu\nlinear 32\nrelu\nlinear 4\nloss softmax_cross_entropy\n",
      "input 64\nlinear 256\nrelu\nlinear 256\nrelu\nlinear 4\nloss "
      "softmax_cross_entropy\n"};
  enum { STEPS = 5 };
  dp_config cfg = CFG(.batch = 32, .n_devices = 2, .seed = 7);
  rig r;
  rig_open(&r, specs[_i], &cfg);
  run_steps(&r, 0, 2); /* warm: the schedules are built */
  size_t cap = 4096, dropped = 1;
  dp_prof_event *ev = calloc(cap, sizeof *ev);
  ck_assert_ptr_nonnull(ev);
  ck_assert_int_eq(dp_ctx_profile_count(r.c, NULL), 0);
  ck_assert_int_eq(dp_ctx_profile(r.c, ev, cap), DP_OK);
  run_steps(&r, 2, 2 + STEPS);
  size_t n = dp_ctx_profile_count(r.c, &dropped);
  ck_assert_int_eq(dp_ctx_profile(r.c, NULL, 0), DP_OK);
  run_steps(&r, 2 + STEPS, 3 + STEPS); /* off: nothing more recorded */
  ck_assert_int_eq(dropped, 0);
  ck_assert(n > 0 && n < cap);
  dp_prof_summary sum;
  ck_assert_int_eq(dp_prof_summarize(r.p, ev, n, &sum), DP_OK);
  ck_assert_int_eq(sum.steps, STEPS);
  ck_assert_int_eq(sum.n_threads, 2);
  ck_assert(sum.wall_ms > 0.0);
  /* the ops of the schedule, by class; a shared op (>= 128 KiB elementwise,
   * exec.c) on each thread */
  long want[DP_PROF_CLASS_COUNT] = {0}, got_shared = 0;
  const dp_op *ops = dp_plan_ops(r.p);
  for (int k = 0; k < dp_plan_n_ops(r.p); k++) {
    dp_prof_event e = {.what = DP_PROF_EVENT_OP,
                       .kind = ops[k].kind,
                       .phase = ops[k].phase,
                       .layer = ops[k].layer};
    int c = dp_prof_class_of(r.p, &e);
    ck_assert(c >= 0 && c < DP_PROF_CLASS_COUNT);
    want[c] += STEPS;
  }
  for (size_t i = 0; i < n; i++) got_shared += ev[i].shared;
  long ops_seen = 0, ops_want = 0;
  for (int c = 0; c < DP_PROF_CLASS_COUNT; c++) {
    ck_assert_msg(sum.ops[c] >= want[c] && want[c] > 0, "class %s: %ld events, %ld ops",
                  dp_prof_class_name((dp_prof_class)c), sum.ops[c], want[c]);
    ops_seen += sum.ops[c];
    ops_want += want[c];
  }
  /* each shared op leaves one event per thread: one more than unshared */
  ck_assert_int_eq(ops_seen, ops_want + got_shared / 2);
  ck_assert(_i == 0 ? got_shared == 0 : got_shared > 0);
  for (int t = 0; t < 2; t++) {
    double busy = 0.0;
    for (int c = 0; c < DP_PROF_CLASS_COUNT; c++) {
      ck_assert(sum.busy_ms[t][c] >= 0.0);
      busy += sum.busy_ms[t][c];
    }
    /* the events of one thread do not overlap and lie inside the steps:
     * busy + barrier fit in the wall time (a microsecond for the clock reads
     * of the two threads' barrier ends) */
    double waits = sum.barrier_ms[t];
    ck_assert_msg(busy + waits <= sum.wall_ms + 1e-3 * STEPS,
                  "thread %d: busy %.4f + barrier %.4f > wall %.4f", t, busy,
                  sum.barrier_ms[t], sum.wall_ms);
    ck_assert(busy > 0.0 && sum.barrier_ms[t] >= 0.0);
    /* the CPU time of the ops: at most their wall time (a microsecond of
     * clock reads apart) */
    ck_assert_msg(sum.busy_cpu_ms[t] > 0.0 && sum.busy_cpu_ms[t] <= busy + 1e-3 * STEPS, "thread %d: cpu %.6f busy %.6f", t, sum.busy_cpu_ms[t], busy);
    ck_assert(fabs(busy + waits + sum.other_ms[t] - sum.wall_ms) < 1e-9 * (1.0 + sum.wall_ms));
  }
  /* a buffer too small: the first cap events, the rest counted */
  ck_assert_int_eq(dp_ctx_profile(r.c, ev, 8), DP_OK);
  run_steps(&r, 3 + STEPS, 4 + STEPS);
  ck_assert_int_eq(dp_ctx_profile_count(r.c, &dropped), 8);
  ck_assert(dropped > 0);
  ck_assert_int_eq(dp_ctx_profile(r.c, NULL, 0), DP_OK);
  ck_assert_int_ne(dp_ctx_profile(r.c, ev, 0), DP_OK);
  free(ev);
  rig_close(&r);
}
END_TEST

/* ---- suite ----------------------------------------------------------------- */

Suite *step_suite(void) {
  Suite *s = suite_create("step");

  TCase *tc = tcase_create("dp_equals_single");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_n_devices_match_one_device, 0, N_EQUIV);
  tcase_add_test(tc, test_micro_batches_give_same_bits_for_1_2_4_devices);
  tcase_add_test(tc, test_dropout_mask_changes_with_the_step);
  suite_add_tcase(s, tc);

  tc = tcase_create("repeatable");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_same_run_twice_is_bit_identical, 0, 4);
  suite_add_tcase(s, tc);

  tc = tcase_create("bad_input");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_bad_input_changes_nothing, 0, BAD_COUNT);
  tcase_add_test(tc, test_refused_step_gradients_are_last_or_diagnostic);
  tcase_add_test(tc, test_bad_forward_and_accessor_calls_are_refused);
  suite_add_tcase(s, tc);

  tc = tcase_create("small_batch");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_smaller_batch_matches_plan_for_it, 0, 4);
  tcase_add_test(tc, test_forward_after_partial_forward_uses_current_params);
  tcase_add_loop_test(tc, test_linear_then_relu_is_exact, 0, 12);
  suite_add_tcase(s, tc);

  tc = tcase_create("high_water");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_high_water_equals_plan, 0, 8);
  tcase_add_test(tc, test_high_water_recompute_equals_plan);
  tcase_add_loop_test(tc, test_high_water_every_layer_equals_plan, 0, 8);
  tcase_add_test(tc, test_high_water_random_configurations);
  suite_add_tcase(s, tc);

  tc = tcase_create("static_ctx");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_static_ctx_matches_ctx_create, 0, 4);
  tcase_add_test(tc, test_static_ctx_refuses_bad_arenas);
  suite_add_tcase(s, tc);

  tc = tcase_create("learning");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_training_learns_separable_problem);
  suite_add_tcase(s, tc);

  tc = tcase_create("optimizers");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_seed_loss_and_grads_by_hand);
  tcase_add_test(tc, test_sgd_matches_pytorch_rule);
  tcase_add_test(tc, test_momentum_matches_pytorch_rule);
  tcase_add_test(tc, test_nonfinite_update_is_refused_and_changes_nothing);
  tcase_add_test(tc, test_nonfinite_update_names_the_first_parameter_in_every_layout);
  tcase_add_test(tc, test_set_lr_changes_the_rate_of_later_steps_only);
  tcase_add_test(tc, test_set_momentum_changes_the_momentum_of_later_steps_only);
  tcase_add_test(tc, test_onecycle_momentum_trains_as_pytorch);
  tcase_add_test(tc, test_adamw_matches_pytorch_rule);
  suite_add_tcase(s, tc);

  tc = tcase_create("profile");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_profile_totals_are_consistent, 0, 2);
  suite_add_tcase(s, tc);
  return s;
}
