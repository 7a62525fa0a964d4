/* Fault injection: a failed step leaves parameters, optimizer state and the
 * step counter bytewise as they were, and the next step gives exactly the
 * bits of a context that never saw the fault. The fault is injected at every
 * op of the schedule in turn (dp__ctx_inject_fault, lib/core/ctx.h), for classic,
 * allreduce and allreduce with a sharded optimizer, on 1 to 4 devices; ops of
 * the commit phase (the optimizer stage and what follows it, which cannot
 * fail on the cpu backend) are injected too and must poison the context.
 * Non-finite losses and gradients take the same path (DP_NONFINITE_ERROR and
 * DP_NONFINITE_SKIP). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/ctx.h"
#include "helpers.h"

/* ---- helpers ------------------------------------------------------------------ */

/* Layer norm, dropout (keyed by the step: a step that did not happen must not
 * move it) and two linears; softmax cross-entropy. */
static const char MODEL[] = "input 5\nlinear 8\ngelu\ndropout 0.25\nlayernorm\nlinear 4\n"
                            "loss softmax_cross_entropy\n";
/* The image layers and batchnorm (whose running statistics a failed step must
 * not move): 6 floats per row as 1 x 2 x 3. */
static const char IMAGE_MODEL[] = "input 1 2 3\nconv2d 2 2 padding 1\nbatchnorm\nrelu\n"
                                  "maxpool2d 2 stride 1\nflatten\nlinear 4\n"
                                  "loss softmax_cross_entropy\n";
#define BATCH 16
#define MICRO 2 /* 8 micro-batches: a gradient tree on every device */

typedef struct {
  const char *name;
  dp_mode mode;
  int shard;
} mode_case;

static const mode_case MODES[] = {
    {"classic", DP_MODE_CLASSIC, 0},
    {"allreduce", DP_MODE_ALLREDUCE, 0},
    {"allreduce+shard", DP_MODE_ALLREDUCE, 1},
};
#define N_MODES 3

static float rng_float(uint64_t *s) {
  return (float)(rng_next(s) >> 40) / 16777216.0f * 2 - 1;
}

typedef struct {
  float *x;
  void *t; /* int32 labels or float targets */
  int rows, in;
} batch;

/* Batch number k of a model: the same k always gives the same batch. */
static batch batch_of(const dp_model *m, int rows, int k) {
  batch b = {.rows = rows, .in = dp_model_input_width(m)};
  int out = dp_model_output_width(m);
  uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1);
  b.x = malloc((size_t)rows * b.in * sizeof *b.x);
  ck_assert_ptr_nonnull(b.x);
  for (int i = 0; i < rows * b.in; i++) b.x[i] = 2 * rng_float(&s);
  if (dp_model_loss(m) == DP_LOSS_SOFTMAX_CE) {
    int32_t *t = malloc((size_t)rows * sizeof *t);
    ck_assert_ptr_nonnull(t);
    for (int i = 0; i < rows; i++) t[i] = (int32_t)(rng_next(&s) % (uint64_t)out);
    b.t = t;
  } else {
    float *t = malloc((size_t)rows * out * sizeof *t);
    ck_assert_ptr_nonnull(t);
    for (int i = 0; i < rows * out; i++) t[i] = rng_float(&s);
    b.t = t;
  }
  return b;
}

static void batch_free(batch *b) {
  free(b->x);
  free(b->t);
}

/* The plan of `m` for one layout, optimizer, micro-batch and policy. */
/* plan_case's config.batchnorm (a test that wants sync sets it and puts it back) */
static dp_bn_mode bn_mode = DP_BN_PER_REPLICA;

static dp_plan *plan_case(const dp_model *m, const mode_case *mc, int n_dev,
                          dp_optimizer opt, int micro, dp_nonfinite_policy pol) {
  dp_config c = config_of(BATCH, n_dev, opt);
  c.batchnorm = bn_mode;
  c.micro_batch = micro;
  c.mode = mc->mode;
  c.shard_optimizer = mc->shard;
  c.lr = 0.05f;
  c.seed = 7;
  c.on_nonfinite = pol;
  return plan_of(m, &c);
}

static dp_status step(dp_ctx *c, const batch *b, float *loss) {
  return dp_train_step(c, b->rows, b->in, b->x, b->t, loss);
}

static void step_ok(dp_ctx *c, const batch *b, float *loss) {
  dp_status s = step(c, b, loss);
  ck_assert_msg(s == DP_OK, "step: %s: %s", dp_status_name(s), dp_ctx_error(c));
}

/* Everything a step may change that must survive a failed one: the step
 * counter, the skip counter, and per device the parameter and optimizer state
 * regions (device 0's parameters are dp_get_params; replicas' are compared
 * too after a successful step). */
typedef struct {
  uint64_t step, skipped;
  size_t len[DP_MAX_DEVICES][2];
  unsigned char *bytes[DP_MAX_DEVICES][2];
} snapshot;

static const dp_region SNAP_REGIONS[2] = {DP_REGION_PARAMS, DP_REGION_OPT_STATE};

static snapshot snap(dp_ctx *c) {
  snapshot s = {.step = dp_ctx_step(c), .skipped = dp_ctx_skipped_steps(c)};
  for (int d = 0; d < dp_plan_n_devices(c->plan); d++)
    for (int i = 0; i < 2; i++) {
      dp_region_info ri = dp_plan_region(c->plan, d, SNAP_REGIONS[i]);
      s.len[d][i] = ri.size;
      s.bytes[d][i] = malloc(ri.size ? ri.size : 1);
      ck_assert_ptr_nonnull(s.bytes[d][i]);
      memcpy(s.bytes[d][i], c->arena[d] + ri.offset, ri.size);
    }
  return s;
}

static void snap_free(snapshot *s) {
  for (int d = 0; d < DP_MAX_DEVICES; d++)
    for (int i = 0; i < 2; i++) free(s->bytes[d][i]);
}

/* a and b equal: device 0's parameters and every device's optimizer state
 * always; replicas' parameters too when `replicas`. */
static void snap_expect_equal(const snapshot *a, const snapshot *b, int n_dev,
                              bool replicas, const char *what) {
  ck_assert_msg(a->step == b->step, "%s: step %llu, want %llu", what,
                (unsigned long long)a->step, (unsigned long long)b->step);
  ck_assert_msg(a->skipped == b->skipped, "%s: skipped steps differ", what);
  for (int d = 0; d < n_dev; d++)
    for (int i = 0; i < 2; i++) {
      if (i == 0 && d > 0 && !replicas) continue;
      ck_assert(a->len[d][i] == b->len[d][i]);
      ck_assert_msg(memcmp(a->bytes[d][i], b->bytes[d][i], a->len[d][i]) == 0,
                    "%s: device %d %s differ", what, d, dp_region_name(SNAP_REGIONS[i]));
    }
}

/* ---- every op of a training step ----------------------------------------- */

/* Totals over the whole table, for the report in docs/RELIABILITY.md. */
typedef struct {
  int domain, commit;
} counts;

/* One configuration: warm both contexts up, then for every op k of the
 * schedule: fail op k, check nothing changed, run the step again without a
 * fault and check it matches the reference bit for bit. */
static counts fault_every_op_of(const char *spec, const mode_case *mc, int n_dev,
                                dp_optimizer opt, int rows) {
  dp_model *m = model_of(spec);
  dp_plan *p = plan_case(m, mc, n_dev, opt, MICRO, DP_NONFINITE_ERROR);
  dp_ctx *ref = ctx_of(p), *c = ctx_of(p);
  int nd = dp_plan_n_devices(p), k_batch = 0;
  float l_ref, l;
  for (int w = 0; w < 2;
       w++, k_batch++) { /* optimizer state and step counter non-trivial */
    batch b = batch_of(m, rows, k_batch);
    step_ok(ref, &b, &l_ref);
    step_ok(c, &b, &l);
    batch_free(&b);
  }
  const dp_op *ops;
  int n_ops, commit;
  ck_assert_int_eq(dp__ctx_schedule(c, rows, true, &ops, &n_ops, &commit), DP_OK);
  ck_assert_int_gt(commit, 0);
  ck_assert_int_lt(commit, n_ops);
  ck_assert_int_eq(ops[commit].kind, DP_OP_OPTIMIZER);
  ck_assert_int_lt(ops[commit - 1].stage, ops[commit].stage);
  for (int k = 0; k < commit; k++) /* nothing before the commit phase writes kept state */
    ck_assert_msg(ops[k].kind != DP_OP_OPTIMIZER &&
                      !(ops[k].kind == DP_OP_COPY && ops[k].dst_dev == 0 &&
                        (ops[k].dst_region == DP_REGION_PARAMS ||
                         ops[k].dst_region == DP_REGION_OPT_STATE)),
                  "op %d writes state before the commit phase", k);
  char where[128];
  for (int k = 0; k < commit; k++, k_batch++) {
    snprintf(where, sizeof where, "%s, %d devices, %d rows, fault at op %d of %d (%s %s)",
             mc->name, n_dev, rows, k, n_ops, dp_phase_name((dp_phase)ops[k].phase),
             dp_op_kind_name((dp_op_kind)ops[k].kind));
    batch b = batch_of(m, rows, k_batch);
    snapshot before = snap(c);
    float untouched = 12345.0f;
    dp__ctx_inject_fault(c, k);
    dp_status s = step(c, &b, &untouched);
    ck_assert_msg(s == DP_ERR_BACKEND, "%s: got %s", where, dp_status_name(s));
    ck_assert_msg(untouched == 12345.0f, "%s: the loss was written", where);
    /* the error names the op: its index, its kind, the device */
    char want[64];
    snprintf(want, sizeof want, "op %d of %d (", k, n_ops);
    const char *err = dp_ctx_error(c);
    ck_assert_msg(strstr(err, want) && strstr(err, "injected fault") &&
                      strstr(err, dp_op_kind_name((dp_op_kind)ops[k].kind)),
                  "%s: error text: %s", where, err);
    snprintf(want, sizeof want, "device %d, op", ops[k].device);
    ck_assert_msg(strstr(err, want), "%s: error text: %s", where, err);
    snapshot after = snap(c);
    snap_expect_equal(&after, &before, nd, false, where);
    snap_free(&after);
    snap_free(&before);
    /* the retry: exactly the reference's bits */
    step_ok(ref, &b, &l_ref);
    step_ok(c, &b, &l);
    ck_assert_msg(memcmp(&l, &l_ref, sizeof l) == 0, "%s: retry loss %.9g, reference %.9g",
                  where, (double)l, (double)l_ref);
    snapshot sr = snap(ref), sc = snap(c);
    snap_expect_equal(&sc, &sr, nd, true, where);
    snap_free(&sr);
    snap_free(&sc);
    batch_free(&b);
  }
  dp_ctx_free(c);
  /* The commit phase: a failure there cannot be undone, so the context must
   * refuse to go on. A fresh context per op. */
  for (int k = commit; k < n_ops; k++) {
    snprintf(where, sizeof where, "%s, %d devices, %d rows, fault at commit op %d of %d",
             mc->name, n_dev, rows, k, n_ops);
    dp_ctx *t = ctx_of(p);
    batch b = batch_of(m, rows, 0);
    step_ok(t, &b, NULL);
    dp__ctx_inject_fault(t, k);
    ck_assert_msg(step(t, &b, NULL) == DP_ERR_BACKEND, "%s", where);
    ck_assert_msg(strstr(dp_ctx_error(t), "update failed part way"), "%s: %s", where,
                  dp_ctx_error(t));
    ck_assert_msg(step(t, &b, NULL) == DP_ERR_BACKEND, "%s: the next step ran", where);
    ck_assert_msg(strstr(dp_ctx_error(t), "unusable"), "%s: %s", where, dp_ctx_error(t));
    float y[BATCH * 4];
    ck_assert_int_eq(dp_forward(t, b.rows, b.in, b.x, y), DP_ERR_BACKEND);
    ck_assert_uint_eq(dp_ctx_step(t), 1);
    batch_free(&b);
    dp_ctx_free(t);
  }
  dp_ctx_free(ref);
  dp_plan_free(p);
  dp_model_free(m);
  return (counts){commit, n_ops - commit};
}

static counts fault_every_op(const mode_case *mc, int n_dev, dp_optimizer opt, int rows) {
  return fault_every_op_of(MODEL, mc, n_dev, opt, rows);
}

/* _i: mode * 4 + devices - 1 */
START_TEST(a_failed_step_changes_nothing_and_the_retry_matches) {
  const mode_case *mc = &MODES[_i / 4];
  int n_dev = _i % 4 + 1;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  counts full = fault_every_op(mc, n_dev, DP_OPT_ADAMW, BATCH), part = {0, 0};
  /* a short batch: the last devices get fewer rows, or none */
  if (n_dev >= 3) part = fault_every_op(mc, n_dev, DP_OPT_MOMENTUM, 5);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (getenv("DP_FAULT_REPORT"))
    printf("faults: %-16s N=%d: %d + %d fault points (state kept, retry exact), %d + %d "
           "commit ops (context poisoned); %.2f s\n",
           mc->name, n_dev, full.domain, part.domain, full.commit, part.commit,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
}
END_TEST

/* The same for a CNN with batchnorm: every op of the schedule, full and short
 * batches. _i: mode * 4 + devices - 1 */
START_TEST(a_failed_cnn_step_changes_nothing_and_the_retry_matches) {
  const mode_case *mc = &MODES[_i / 4];
  int n_dev = _i % 4 + 1;
  fault_every_op_of(IMAGE_MODEL, mc, n_dev, DP_OPT_ADAMW, BATCH);
  if (n_dev >= 3) fault_every_op_of(IMAGE_MODEL, mc, n_dev, DP_OPT_MOMENTUM, 5);
}
END_TEST

/* And with sync batchnorm, whose statistics cross the devices twice in the
 * middle of the step (trees in the forward and in the backward): a fault at
 * any of those ops too, full and short batches. */
START_TEST(a_failed_sync_batchnorm_step_changes_nothing_and_the_retry_matches) {
  const mode_case *mc = &MODES[_i / 4];
  int n_dev = _i % 4 + 1;
  bn_mode = DP_BN_SYNC;
  fault_every_op_of(IMAGE_MODEL, mc, n_dev, DP_OPT_ADAMW, BATCH);
  if (n_dev >= 3) fault_every_op_of(IMAGE_MODEL, mc, n_dev, DP_OPT_MOMENTUM, 5);
  bn_mode = DP_BN_PER_REPLICA;
}
END_TEST

/* ---- forward ---------------------------------------------------------------- */

START_TEST(a_failed_forward_changes_nothing) {
  const mode_case *mc = &MODES[_i / 4];
  int n_dev = _i % 4 + 1;
  dp_model *m = model_of(MODEL);
  dp_plan *p = plan_case(m, mc, n_dev, DP_OPT_ADAMW, 0, DP_NONFINITE_ERROR);
  dp_ctx *ref = ctx_of(p), *c = ctx_of(p);
  batch b = batch_of(m, BATCH, 3);
  step_ok(ref, &b, NULL);
  step_ok(c, &b, NULL);
  const dp_op *ops;
  int n_ops, commit;
  ck_assert_int_eq(dp__ctx_schedule(c, BATCH, false, &ops, &n_ops, &commit), DP_OK);
  ck_assert_int_eq(commit, n_ops); /* no commit phase: a forward keeps no state */
  float y_ref[BATCH * 4], y[BATCH * 4];
  ck_assert_int_eq(dp_forward(ref, BATCH, b.in, b.x, y_ref), DP_OK);
  for (int k = 0; k < n_ops; k++) {
    snapshot before = snap(c);
    dp__ctx_inject_fault(c, k);
    ck_assert_int_eq(dp_forward(c, BATCH, b.in, b.x, y), DP_ERR_BACKEND);
    ck_assert_msg(strstr(dp_ctx_error(c), "injected fault"), "%s", dp_ctx_error(c));
    snapshot after = snap(c);
    snap_expect_equal(&after, &before, dp_plan_n_devices(p), false, "failed forward");
    snap_free(&after);
    snap_free(&before);
    ck_assert_int_eq(dp_forward(c, BATCH, b.in, b.x, y), DP_OK);
    ck_assert_msg(memcmp(y, y_ref, sizeof y) == 0, "fault at forward op %d: outputs differ",
                  k);
  }
  /* and training goes on as if nothing happened */
  batch b2 = batch_of(m, BATCH, 4);
  float l_ref, l;
  step_ok(ref, &b2, &l_ref);
  step_ok(c, &b2, &l);
  ck_assert(memcmp(&l, &l_ref, sizeof l) == 0);
  ck_assert(dp_params_hash(c) == dp_params_hash(ref));
  batch_free(&b2);
  batch_free(&b);
  dp_ctx_free(c);
  dp_ctx_free(ref);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(the_hook_fires_once_and_a_refused_call_keeps_it) {
  dp_model *m = model_of(MODEL);
  dp_plan *p = plan_case(m, &MODES[0], 2, DP_OPT_SGD, 0, DP_NONFINITE_ERROR);
  dp_ctx *c = ctx_of(p);
  batch b = batch_of(m, BATCH, 0);
  dp__ctx_inject_fault(c, 0);
  /* refused before the executor runs: the fault stays armed */
  ck_assert_int_eq(dp_train_step(c, BATCH, b.in + 1, b.x, b.t, NULL), DP_ERR_SHAPE);
  ck_assert_int_eq(step(c, &b, NULL), DP_ERR_BACKEND);
  step_ok(c, &b, NULL); /* used up */
  dp__ctx_inject_fault(c, 0);
  dp__ctx_inject_fault(c, -1); /* disarmed */
  step_ok(c, &b, NULL);
  dp__ctx_inject_fault(c, 1 << 30); /* past the schedule: never fires */
  step_ok(c, &b, NULL);
  ck_assert_uint_eq(dp_ctx_step(c), 3);
  batch_free(&b);
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* ---- non-finite values ------------------------------------------------------ */

typedef enum {
  NF_LOSS_FROM_INPUTS, /* inputs make a layer overflow: the loss is infinite */
  NF_GRAD_ONLY,        /* a finite loss, but an infinite gradient */
  NF_FROM_PARAMS,      /* a parameter makes a layer overflow */
} nf_kind;

static const char NF_MODEL_DEEP[] = "input 4\nlinear 6\nrelu\nlinear 3\nloss mse\n";
static const char NF_MODEL_FLAT[] = "input 4\nlinear 3\nloss mse\n";

/* Runs: good step, bad step (refused or skipped), good step, against a
 * reference that only runs the two good steps. */
static void nonfinite_case(const mode_case *mc, int n_dev, nf_kind kind,
                           dp_nonfinite_policy pol) {
  dp_model *m = model_of(kind == NF_GRAD_ONLY ? NF_MODEL_FLAT : NF_MODEL_DEEP);
  dp_plan *p = plan_case(m, mc, n_dev, DP_OPT_ADAMW, 0, pol);
  dp_ctx *ref = ctx_of(p), *c = ctx_of(p);
  size_t np = dp_model_n_params(m);
  float *orig = malloc(np * sizeof *orig), *bad = malloc(np * sizeof *bad);
  ck_assert(orig && bad);
  batch good = batch_of(m, BATCH, 1), good2 = batch_of(m, BATCH, 2),
        nasty = batch_of(m, BATCH, 3);
  if (kind == NF_GRAD_ONLY)
    for (int i = 0; i < BATCH * 4; i++) nasty.x[i] = 3e38f;
  else if (kind == NF_LOSS_FROM_INPUTS)
    for (int i = 0; i < BATCH * 4; i++) nasty.x[i] = 1e30f;
  float l_ref, l;
  step_ok(ref, &good, &l_ref);
  step_ok(c, &good, &l);
  if (kind == NF_GRAD_ONLY) {
    /* y = W x with W = 1e-37 and x = 3e38: y ~ 100, a finite loss; the
     * weight gradient (y - t) x / rows overflows. */
    float w[15];
    for (int i = 0; i < 15; i++) w[i] = i < 12 ? 1e-37f : 0.0f;
    ck_assert_int_eq(dp_set_params(ref, w, np), DP_OK);
    ck_assert_int_eq(dp_set_params(c, w, np), DP_OK);
  }
  ck_assert_int_eq(dp_get_params(c, orig, np), DP_OK);
  if (kind == NF_FROM_PARAMS) {
    memcpy(bad, orig, np * sizeof *bad);
    for (int i = 0; i < 24; i++) bad[i] = 1e30f; /* the first linear's weight */
    ck_assert_int_eq(dp_set_params(c, bad, np), DP_OK);
  }
  snapshot before = snap(c);
  l = 1.0f;
  dp_status s = step(c, kind == NF_FROM_PARAMS ? &good2 : &nasty, &l);
  char where[96];
  snprintf(where, sizeof where, "%s, %d devices, case %d, policy %d", mc->name, n_dev,
           (int)kind, (int)pol);
  if (pol == DP_NONFINITE_ERROR) {
    ck_assert_msg(s == DP_ERR_NONFINITE, "%s: got %s (%s)", where, dp_status_name(s),
                  dp_ctx_error(c));
    ck_assert_msg(l == 1.0f, "%s: loss written", where);
    ck_assert_msg(strstr(dp_ctx_error(c), "not applied"), "%s: %s", where, dp_ctx_error(c));
    ck_assert_msg(strstr(dp_ctx_error(c), kind == NF_GRAD_ONLY ? "grad_check" : "loss"),
                  "%s: %s", where, dp_ctx_error(c));
    ck_assert_uint_eq(dp_ctx_skipped_steps(c), 0);
  } else {
    ck_assert_msg(s == DP_OK, "%s: got %s (%s)", where, dp_status_name(s), dp_ctx_error(c));
    ck_assert_msg(isnan(l), "%s: a skipped step reports loss %g", where, (double)l);
    ck_assert_uint_eq(dp_ctx_skipped_steps(c), 1);
    ck_assert_msg(strstr(dp_ctx_error(c), "skipped"), "%s: %s", where, dp_ctx_error(c));
    before.skipped++;
  }
  snapshot after = snap(c);
  snap_expect_equal(&after, &before, dp_plan_n_devices(p), false, where);
  snap_free(&after);
  snap_free(&before);
  if (kind == NF_FROM_PARAMS) ck_assert_int_eq(dp_set_params(c, orig, np), DP_OK);
  /* the next step is the reference's second step, bit for bit */
  step_ok(ref, &good2, &l_ref);
  step_ok(c, &good2, &l);
  ck_assert_msg(memcmp(&l, &l_ref, sizeof l) == 0, "%s: loss after", where);
  snapshot sr = snap(ref), sc = snap(c);
  sc.skipped = sr.skipped;
  snap_expect_equal(&sc, &sr, dp_plan_n_devices(p), true, where);
  snap_free(&sr);
  snap_free(&sc);
  batch_free(&good);
  batch_free(&good2);
  batch_free(&nasty);
  free(orig);
  free(bad);
  dp_ctx_free(c);
  dp_ctx_free(ref);
  dp_plan_free(p);
  dp_model_free(m);
}

START_TEST(a_nonfinite_step_is_refused_and_changes_nothing) {
  for (int k = 0; k < 3; k++)
    nonfinite_case(&MODES[_i / 4], _i % 4 + 1, (nf_kind)k, DP_NONFINITE_ERROR);
}
END_TEST

START_TEST(a_nonfinite_step_is_skipped_and_counted) {
  for (int k = 0; k < 3; k++)
    nonfinite_case(&MODES[_i / 4], _i % 4 + 1, (nf_kind)k, DP_NONFINITE_SKIP);
}
END_TEST

START_TEST(skipped_steps_accumulate_and_the_policy_is_checked) {
  dp_model *m = model_of(NF_MODEL_DEEP);
  dp_plan *p = plan_case(m, &MODES[1], 2, DP_OPT_SGD, 0, DP_NONFINITE_SKIP);
  dp_ctx *c = ctx_of(p);
  batch b = batch_of(m, BATCH, 0);
  for (int i = 0; i < BATCH * 4; i++) b.x[i] = 1e30f;
  for (int i = 0; i < 3; i++) step_ok(c, &b, NULL);
  ck_assert_uint_eq(dp_ctx_skipped_steps(c), 3);
  ck_assert_uint_eq(dp_ctx_step(c), 0);
  ck_assert_uint_eq(dp_ctx_skipped_steps(NULL), 0);
  batch_free(&b);
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_config cfg;
  dp_config_default(&cfg);
  ck_assert_int_eq(cfg.on_nonfinite, DP_NONFINITE_ERROR);
  cfg.batch = 4;
  cfg.on_nonfinite = (dp_nonfinite_policy)7;
  ck_assert_int_eq(dp_plan_create(m, &cfg, &p), DP_ERR_INVALID);
  dp_model_free(m);
}
END_TEST

/* ---- barriers left out (lib/core/exec.c, dp__exec_sync) ---------------------------- */

/* The seed step on 2 devices meets at 6 of its 10 stage ends: after the
 * gather (the loss reads device 1's rows), the loss (the scatter of its
 * gradients reads it), the scatter (the backward writes gradients, kept
 * state), the backward (the reduction reads device 1's gradients), the check
 * (the end of the part before the commit) and the update (the end of the
 * step). The broadcast, the scatter of the inputs and the forward share
 * nothing across devices; the check runs on device 0 after its own
 * reduction. */
START_TEST(the_seed_step_meets_only_where_it_must) {
  dp_model *m = model_of("input 5\nlinear 2\nloss mse\n");
  dp_config cfg = config_of(30, 2, DP_OPT_SGD);
  dp_plan *p = plan_of(m, &cfg);
  dp_ctx *c = ctx_of(p);
  const dp_op *ops;
  int n_ops, commit;
  ck_assert_int_eq(dp__ctx_schedule(c, 30, true, &ops, &n_ops, &commit), DP_OK);
  static const uint8_t want[] = {0, 0, 0, 1, 1, 1, 1, 0, 1, 1};
  ck_assert_int_eq(c->train.n_stages, (int)sizeof want);
  for (int i = 0; i < n_ops; i++) {
    int s = ops[i].stage;
    ck_assert_msg(c->train.sync[s] == want[s], "stage %d (%s): meet %d, want %d", s,
                  dp_phase_name((dp_phase)ops[i].phase), c->train.sync[s], want[s]);
  }
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* Whether op writes what a refused step keeps, by its kind and ends alone. */
static bool op_writes_kept(const dp_op *op) {
  if (op->kind == DP_OP_COPY || op->kind == DP_OP_COPY_ADD)
    return op->dst_region == DP_REGION_PARAMS || op->dst_region == DP_REGION_GRADS ||
           op->dst_region == DP_REGION_OPT_STATE;
  return op->kind != DP_OP_FORWARD && op->kind != DP_OP_GRAD_CHECK;
}

/* In every layout: a stage that writes parameters, gradients or optimizer
 * state starts with a meeting (so a failure before it stops every device
 * first), and so does a stage whose copy reads or writes another device's
 * region that the stage before wrote; the step's last stage ends with one;
 * and with several devices some stage ends without one. */
START_TEST(every_layout_meets_before_kept_state_and_crossing_data) {
  const mode_case *mc = &MODES[_i % N_MODES];
  int n_dev = 1 + _i / N_MODES;
  const char *specs[] = {MODEL, IMAGE_MODEL};
  for (int k = 0; k < 2; k++)
    for (int sync_bn = 0; sync_bn <= k; sync_bn++) {
      bn_mode = sync_bn ? DP_BN_SYNC : DP_BN_PER_REPLICA;
      dp_model *m = model_of(specs[k]);
      dp_plan *p = plan_case(m, mc, n_dev, DP_OPT_ADAMW, MICRO, DP_NONFINITE_ERROR);
      bn_mode = DP_BN_PER_REPLICA;
      dp_ctx *c = ctx_of(p);
      const dp_op *ops;
      int n_ops, commit, left_out = 0;
      ck_assert_int_eq(dp__ctx_schedule(c, BATCH, true, &ops, &n_ops, &commit), DP_OK);
      const uint8_t *sync = c->train.sync;
      int n_stages = c->train.n_stages;
      ck_assert_int_eq(sync[n_stages - 1], 1);
      for (int i = 0; i < n_ops; i++) {
        int s = ops[i].stage;
        if (s == 0) continue;
        char what[128];
        snprintf(what, sizeof what, "%s, %s, %d devices, op %d (%s %s)", k ? "cnn" : "mlp",
                 mc->name, n_dev, i, dp_phase_name((dp_phase)ops[i].phase),
                 dp_op_kind_name((dp_op_kind)ops[i].kind));
        if (op_writes_kept(&ops[i]))
          ck_assert_msg(sync[s - 1], "%s writes kept state without a meeting", what);
        /* a copy between devices after a stage that wrote its far end on
         * another device's thread */
        if ((ops[i].kind == DP_OP_COPY || ops[i].kind == DP_OP_COPY_ADD) &&
            ops[i].src_dev != ops[i].dst_dev && ops[i].src_dev >= 0 &&
            ops[i].dst_dev >= 0) {
          int far = ops[i].device == ops[i].src_dev ? ops[i].dst_dev : ops[i].src_dev;
          for (int j = 0; j < n_ops && ops[j].stage <= s - 1; j++)
            if (ops[j].stage == s - 1 && ops[j].device == far &&
                ops[j].kind != DP_OP_COPY && ops[j].kind != DP_OP_GRAD_CHECK &&
                ops[j].kind != DP_OP_FORWARD)
              ck_assert_msg(sync[s - 1], "%s crosses to device %d, busy the stage before",
                            what, far);
        }
      }
      for (int s = 0; s < n_stages; s++) left_out += !sync[s];
      if (n_dev > 1)
        ck_assert_msg(left_out > 0, "%s, %d devices: every stage meets", mc->name, n_dev);
      dp_ctx_free(c);
      dp_plan_free(p);
      dp_model_free(m);
    }
}
END_TEST

Suite *faults_suite(void) {
  Suite *s = suite_create("faults");
  TCase *tc = tcase_create("step");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, a_failed_step_changes_nothing_and_the_retry_matches, 0,
                      N_MODES * 4);
  tcase_add_loop_test(tc, a_failed_cnn_step_changes_nothing_and_the_retry_matches, 0,
                      N_MODES * 4);
  tcase_add_loop_test(tc,
                      a_failed_sync_batchnorm_step_changes_nothing_and_the_retry_matches, 0,
                      N_MODES * 4);
  tcase_add_test(tc, the_hook_fires_once_and_a_refused_call_keeps_it);
  suite_add_tcase(s, tc);
  tc = tcase_create("forward");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, a_failed_forward_changes_nothing, 0, N_MODES * 4);
  suite_add_tcase(s, tc);
  tc = tcase_create("nonfinite");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, a_nonfinite_step_is_refused_and_changes_nothing, 0, N_MODES * 4);
  tcase_add_loop_test(tc, a_nonfinite_step_is_skipped_and_counted, 0, N_MODES * 4);
  tcase_add_test(tc, skipped_steps_accumulate_and_the_policy_is_checked);
  tcase_add_test(tc, the_seed_step_meets_only_where_it_must);
  tcase_add_loop_test(tc, every_layout_meets_before_kept_state_and_crossing_data, 0,
                      N_MODES * 4);
  suite_add_tcase(s, tc);
  return s;
}
