/* Batch normalisation, per_replica and sync: the shapes and buffers it plans,
 * the same bits (parameters and running statistics) across device counts and
 * modes, running statistics that a refused step leaves alone, checkpoints that
 * carry them, the refusals (one value per channel, accumulation), eval
 * forwards that use them, and sync's whole-batch statistics whatever the
 * micro-batches. PyTorch's numbers: the golden suite. The tests that run in
 * both modes are loop tests: _i is the dp_bn_mode. */
#include "dp.h"
#include "helpers.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 1d after a linear and 2d after a conv, 12 floats per row (1 x 3 x 4) */
static const char *SPEC = "input 1 3 4\nconv2d 3 2 padding 1\nbatchnorm\nrelu\n"
                          "maxpool2d 2 stride 1\nflatten\nlinear 8\nbatchnorm\ntanh\n"
                          "linear 5\nloss softmax_cross_entropy\n";
enum { B = 32, IN = 12, CLASSES = 5, MB = 4, BN1 = 1, BN2 = 6 };

static void make_batch(float *x, int32_t *y, int step) {
  uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(step + 1);
  for (int i = 0; i < B * IN; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((s >> 40) & 0xffff) / 16384.0f - 2.0f;
  }
  for (int r = 0; r < B; r++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    y[r] = (int32_t)((s >> 33) % CLASSES);
  }
}

/* The parameters' hash folded with both layers' running statistics and counts. */
static uint64_t state_hash(dp_ctx *c) {
  uint64_t h = dp_params_hash(c);
  int layers[2] = {BN1, BN2}, widths[2] = {3, 8};
  for (int i = 0; i < 2; i++) {
    float mv[16];
    int64_t n = -1;
    ck_assert_int_eq(dp_get_running_stats(c, layers[i], mv, mv + widths[i], &n), DP_OK);
    h ^= dp_hash_bytes(mv, 2 * (size_t)widths[i] * 4) * (uint64_t)(i + 3);
    h ^= (uint64_t)n << (8 * i);
  }
  return h;
}

static dp_config cfg_of(int devices, dp_mode mode, int shard, dp_bn_mode bn) {
  dp_config c = config_of(B, devices, DP_OPT_ADAMW);
  c.batchnorm = bn;
  c.mode = mode;
  c.shard_optimizer = shard;
  c.micro_batch = MB;
  c.lr = 0.01f;
  c.seed = 3;
  return c;
}

static uint64_t train(dp_config c, int steps) {
  rig r;
  rig_open(&r, SPEC, &c);
  float x[B * IN];
  int32_t y[B];
  for (int s = 0; s < steps; s++) {
    make_batch(x, y, s);
    int rows = s % 3 == 2 ? B - MB - 2 : B; /* a short batch too (micro-batches of 2) */
    ck_assert_msg(dp_train_step(r.c, rows, IN, x, y, NULL) == DP_OK, "%s",
                  dp_ctx_error(r.c));
  }
  uint64_t h = state_hash(r.c);
  rig_close(&r);
  return h;
}

START_TEST(same_bits_and_running_stats_across_devices_and_modes) {
  uint64_t ref = train(cfg_of(1, DP_MODE_CLASSIC, 0, (dp_bn_mode)_i), 12);
  static const struct {
    int n;
    dp_mode mode;
    int shard;
  } setups[] = {{2, DP_MODE_CLASSIC, 0},   {4, DP_MODE_CLASSIC, 0},
                {8, DP_MODE_CLASSIC, 0},   {1, DP_MODE_ALLREDUCE, 0},
                {2, DP_MODE_ALLREDUCE, 0}, {4, DP_MODE_ALLREDUCE, 1},
                {8, DP_MODE_ALLREDUCE, 1}};
  for (size_t i = 0; i < sizeof setups / sizeof *setups; i++) {
    uint64_t h =
        train(cfg_of(setups[i].n, setups[i].mode, setups[i].shard, (dp_bn_mode)_i), 12);
    ck_assert_msg(h == ref, "%d devices, mode %d, shard %d: %016llx vs %016llx",
                  setups[i].n, setups[i].mode, setups[i].shard, (unsigned long long)h,
                  (unsigned long long)ref);
  }
  /* another micro-batch size: other bits (per_replica: other statistics; sync:
   * another tree) */
  dp_config other = cfg_of(1, DP_MODE_CLASSIC, 0, (dp_bn_mode)_i);
  other.micro_batch = 2 * MB;
  ck_assert_uint_ne(train(other, 12), ref);
}
END_TEST

START_TEST(running_stats_start_at_pytorch_defaults_and_count_steps) {
  dp_config c = cfg_of(2, DP_MODE_CLASSIC, 0, (dp_bn_mode)_i);
  rig r;
  rig_open(&r, SPEC, &c);
  float mv[16];
  int64_t n = -1;
  ck_assert_int_eq(dp_get_running_stats(r.c, BN2, mv, mv + 8, &n), DP_OK);
  for (int k = 0; k < 8; k++) {
    ck_assert_float_eq(mv[k], 0.0f);
    ck_assert_float_eq(mv[8 + k], 1.0f);
  }
  ck_assert_int_eq(n, 0);
  float x[B * IN];
  int32_t y[B];
  make_batch(x, y, 0);
  ck_assert_int_eq(dp_train_step(r.c, B, IN, x, y, NULL), DP_OK);
  ck_assert_int_eq(dp_get_running_stats(r.c, BN2, mv, mv + 8, &n), DP_OK);
  ck_assert_int_eq(n, 1);
  int moved = 0;
  for (int k = 0; k < 8; k++) moved += mv[k] != 0.0f && mv[8 + k] != 1.0f;
  ck_assert_int_gt(moved, 0);
  /* not a batchnorm; out of range */
  ck_assert_int_eq(dp_get_running_stats(r.c, 0, mv, mv, &n), DP_ERR_INVALID);
  ck_assert_int_eq(dp_get_running_stats(r.c, 99, NULL, NULL, NULL), DP_ERR_INVALID);
  ck_assert_int_eq(dp_get_running_stats(NULL, BN2, NULL, NULL, NULL), DP_ERR_INVALID);
  rig_close(&r);
}
END_TEST

/* A refused step (a NaN input) moves neither parameters nor running statistics;
 * the retry equals an undisturbed run. */
START_TEST(refused_step_leaves_running_stats_alone) {
  dp_config c = cfg_of(2, DP_MODE_ALLREDUCE, 0, (dp_bn_mode)_i);
  rig r, u;
  rig_open(&r, SPEC, &c);
  rig_open(&u, SPEC, &c);
  float x[B * IN];
  int32_t y[B];
  make_batch(x, y, 0);
  ck_assert_int_eq(dp_train_step(r.c, B, IN, x, y, NULL), DP_OK);
  ck_assert_int_eq(dp_train_step(u.c, B, IN, x, y, NULL), DP_OK);
  uint64_t before = state_hash(r.c);
  make_batch(x, y, 1);
  float keep = x[5];
  x[5] = NAN;
  ck_assert_int_eq(dp_train_step(r.c, B, IN, x, y, NULL), DP_ERR_NONFINITE);
  ck_assert_uint_eq(state_hash(r.c), before);
  x[5] = keep;
  ck_assert_int_eq(dp_train_step(r.c, B, IN, x, y, NULL), DP_OK);
  ck_assert_int_eq(dp_train_step(u.c, B, IN, x, y, NULL), DP_OK);
  ck_assert_uint_eq(state_hash(r.c), state_hash(u.c));
  rig_close(&r);
  rig_close(&u);
}
END_TEST

/* Saved on 4 devices, loaded on 1: the running statistics come along, and the
 * next steps and an eval forward are the straight run's. */
START_TEST(checkpoints_carry_running_stats) {
  char path[] = "/tmp/dp_bn_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  dp_config c4 = cfg_of(4, DP_MODE_CLASSIC, 0, (dp_bn_mode)_i),
            c1 = cfg_of(1, DP_MODE_ALLREDUCE, 0, (dp_bn_mode)_i);
  rig a, b;
  rig_open(&a, SPEC, &c4);
  rig_open(&b, SPEC, &c1);
  float x[B * IN], ya[B * CLASSES], yb[B * CLASSES];
  int32_t y[B];
  for (int s = 0; s < 3; s++) {
    make_batch(x, y, s);
    ck_assert_int_eq(dp_train_step(a.c, B, IN, x, y, NULL), DP_OK);
  }
  ck_assert_int_eq(dp_ckpt_save(a.c, path), DP_OK);
  ck_assert_int_eq(dp_ckpt_load(b.c, path), DP_OK);
  ck_assert_uint_eq(state_hash(b.c), state_hash(a.c));
  make_batch(x, y, 7);
  ck_assert_int_eq(dp_forward(a.c, B, IN, x, ya), DP_OK); /* eval: the running stats */
  ck_assert_int_eq(dp_forward(b.c, B, IN, x, yb), DP_OK);
  ck_assert_int_eq(memcmp(ya, yb, sizeof ya), 0);
  ck_assert_int_eq(dp_train_step(a.c, B, IN, x, y, NULL), DP_OK);
  ck_assert_int_eq(dp_train_step(b.c, B, IN, x, y, NULL), DP_OK);
  ck_assert_uint_eq(state_hash(b.c), state_hash(a.c));
  /* the eval forward changed: it reads the statistics the step moved */
  ck_assert_int_eq(dp_forward(b.c, B, IN, x, yb), DP_OK);
  ck_assert_int_ne(memcmp(ya, yb, sizeof ya), 0);
  rig_close(&a);
  rig_close(&b);
  unlink(path);
}
END_TEST

/* dp_plan_check_rows says before any data what dp_train_step refuses: every
 * row count 0..B+1 on a 5 + 4 cut (per replica, micro-batches of 3, sync) gets
 * the step's status, and the step leaves the parameters as they were. */
START_TEST(check_rows_says_what_the_step_refuses) {
  for (int v = 0; v < 3; v++) {
    dp_config c = cfg_of(2, DP_MODE_CLASSIC, 0, v == 2 ? DP_BN_SYNC : DP_BN_PER_REPLICA);
    c.batch = 9;
    c.micro_batch = v == 1 ? 3 : 0;
    rig r;
    rig_open(&r, "input 4\nlinear 3\nbatchnorm\nlinear 2\nloss mse\n", &c);
    float x[9 * 4], t[9 * 2] = {0};
    for (int i = 0; i < 9 * 4; i++) x[i] = (float)(i % 7);
    int refused = 0;
    for (int rows = 0; rows <= 10; rows++) {
      dp_status want = dp_plan_check_rows(r.p, rows);
      uint64_t h = dp_params_hash(r.c);
      dp_status got = dp_train_step(r.c, rows, 4, x, t, NULL);
      if (want == DP_ERR_SHAPE) {
        refused++;
        ck_assert_msg(got == DP_ERR_SHAPE && dp_params_hash(r.c) == h, "v %d rows %d: %s",
                      v, rows, dp_ctx_error(r.c));
      } else if (want == DP_OK) {
        ck_assert_msg(got == DP_OK, "v %d rows %d: %s", v, rows, dp_ctx_error(r.c));
      } else {
        ck_assert_int_eq(want, DP_ERR_RANGE);
        ck_assert(rows < 1 || rows > 9);
      }
    }
    /* per replica: 1 and 6 rows (device 1's one); micro-batches of 3: 1, 4, 7
     * rows; sync: a batch of 1 */
    ck_assert_int_eq(refused, v == 0 ? 2 : v == 1 ? 3 : 1);
    rig_close(&r);
  }
  ck_assert_int_eq(dp_plan_check_rows(NULL, 1), DP_ERR_INVALID);
}
END_TEST

/* An inference plan runs a batchnorm on its running statistics: every row count
 * 1..B runs, and dp_plan_check_rows says so (it refused the one-row micro-batches a
 * training step refuses, while dp_forward ran them: an outside check). */
START_TEST(check_rows_takes_any_count_on_an_inference_plan) {
  for (int v = 0; v < 2; v++) {
    dp_config c = cfg_of(2, DP_MODE_CLASSIC, 0, v ? DP_BN_SYNC : DP_BN_PER_REPLICA);
    c.batch = 9;
    c.micro_batch = 3;
    c.inference = 1;
    dp_model *m = NULL;
    ck_assert_int_eq(
        dp_model_parse("input 4\nlinear 3\nbatchnorm\nlinear 2\nloss mse\n", "bn", &m),
        DP_OK);
    dp_plan *p = NULL;
    dp_ctx *ctx = NULL;
    ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_OK);
    ck_assert_int_eq(dp_ctx_create(p, &ctx), DP_OK);
    float x[9 * 4], y[9 * 2];
    for (int i = 0; i < 9 * 4; i++) x[i] = (float)(i % 7);
    for (int rows = 1; rows <= 9; rows++) {
      ck_assert_msg(dp_forward(ctx, rows, 4, x, y) == DP_OK, "%d rows: %s", rows,
                    dp_ctx_error(ctx));
      ck_assert_msg(dp_plan_check_rows(p, rows) == DP_OK, "v %d, %d rows: %s", v, rows,
                    dp_last_error());
    }
    ck_assert_int_eq(dp_plan_check_rows(p, 10), DP_ERR_RANGE);
    dp_ctx_free(ctx);
    dp_plan_free(p);
    dp_model_free(m);
  }
}
END_TEST

START_TEST(refusals_name_what_is_wrong) {
  /* one row in a micro-batch: one value per channel of the 1d batchnorm */
  dp_config c = cfg_of(1, DP_MODE_CLASSIC, 0, DP_BN_PER_REPLICA);
  c.micro_batch = 1;
  rig r;
  rig_open(&r, "input 4\nlinear 3\nbatchnorm\nlinear 2\nloss mse\n", &c);
  float x[B * 4] = {0}, t[B * 2] = {0};
  for (int i = 0; i < B * 4; i++) x[i] = (float)(i % 7);
  uint64_t h = dp_params_hash(r.c);
  ck_assert_int_eq(dp_train_step(r.c, B, 4, x, t, NULL), DP_ERR_SHAPE);
  ck_assert_msg(strstr(dp_ctx_error(r.c), "one row"), "%s", dp_ctx_error(r.c));
  ck_assert_uint_eq(dp_params_hash(r.c), h);
  rig_close(&r);
  /* but a 2d batchnorm has H x W values per channel in a row */
  rig_open(&r, "input 1 2 2\nconv2d 2 1\nbatchnorm\nflatten\nlinear 2\nloss mse\n", &c);
  ck_assert_int_eq(dp_train_step(r.c, B, 4, x, t, NULL), DP_OK);
  rig_close(&r);
  /* an unknown mode */
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse(SPEC, "bn", &m), DP_OK);
  dp_plan *p = NULL;
  dp_config s = cfg_of(2, DP_MODE_CLASSIC, 0, DP_BN_PER_REPLICA);
  s.batchnorm = (dp_bn_mode)7;
  ck_assert_int_eq(dp_plan_create(m, &s, &p), DP_ERR_INVALID);
  for (int bn = 0; bn < 2 && dp_cuda_available(); bn++) { /* cuda plans it too */
    s = cfg_of(2, DP_MODE_CLASSIC, 0, (dp_bn_mode)bn);
    s.backend = DP_BACKEND_CUDA;
    ck_assert_msg(dp_plan_create(m, &s, &p) == DP_OK, "%s", dp_last_error());
    dp_plan_free(p);
    p = NULL;
  }
  ck_assert_ptr_null(p);
  /* the shapes: 1d over the features, 2d over the channels; 2 c parameters */
  dp_layer_info li;
  ck_assert_int_eq(dp_model_layer(m, BN1, &li), DP_OK);
  ck_assert_int_eq(li.channels, 3);
  ck_assert_uint_eq(li.n_params, 6);
  ck_assert_int_eq(dp_model_layer(m, BN2, &li), DP_OK);
  ck_assert_int_eq(li.channels, 8);
  ck_assert_int_eq(li.height, 0);
  dp_tensor_info t1;
  ck_assert_int_eq(dp_model_tensor(m, 2, &t1), DP_OK);
  ck_assert_str_eq(t1.name, "1.weight");
  ck_assert_int_eq(t1.dims[0], 3);
  dp_model_free(m);
}
END_TEST

/* Gradient accumulation: every call is a training forward, so the running
 * statistics move on every call, from that call's micro-batch 0 (sync: that
 * call's batch), as PyTorch's do in an accumulation loop. With per_replica
 * statistics and micro-batches that divide the calls, the update is still the
 * concatenated batch's, bit for bit. */
START_TEST(accumulation_moves_running_stats_every_call) {
  dp_bn_mode mode = (dp_bn_mode)_i;
  dp_config ca = cfg_of(2, DP_MODE_CLASSIC, 0, mode), cs = ca,
            cc = cfg_of(2, DP_MODE_CLASSIC, 0, mode);
  ca.batch = cs.batch = B / 2;
  ca.accumulate = 2;
  rig a, s, c;
  rig_open(&a, SPEC, &ca);
  rig_open(&s, SPEC, &cs); /* single steps of the calls' batches */
  rig_open(&c, SPEC, &cc); /* the concatenated batch */
  float x[B * IN], mv[2][16];
  int32_t y[B];
  int64_t n[2];
  make_batch(x, y, 0);
  ck_assert_int_eq(dp_train_step(a.c, B / 2, IN, x, y, NULL), DP_OK);
  ck_assert_int_eq(dp_ctx_accumulated(a.c), 1);
  ck_assert_int_eq(dp_train_step(s.c, B / 2, IN, x, y, NULL), DP_OK);
  ck_assert_int_eq(dp_get_running_stats(a.c, BN2, mv[0], mv[0] + 8, &n[0]), DP_OK);
  ck_assert_int_eq(dp_get_running_stats(s.c, BN2, mv[1], mv[1] + 8, &n[1]), DP_OK);
  ck_assert_int_eq(n[0], 1);
  ck_assert_int_eq(n[1], 1);
  ck_assert_int_eq(memcmp(mv[0], mv[1], sizeof mv[0]), 0); /* the same forward */
  /* a refused call moves neither the accumulation nor the statistics */
  uint64_t before = state_hash(a.c);
  float keep = x[B / 2 * IN + 3];
  x[B / 2 * IN + 3] = NAN;
  ck_assert_int_eq(dp_train_step(a.c, B / 2, IN, x + B / 2 * IN, y + B / 2, NULL),
                   DP_ERR_NONFINITE);
  x[B / 2 * IN + 3] = keep;
  ck_assert_uint_eq(state_hash(a.c), before);
  ck_assert_int_eq(dp_ctx_accumulated(a.c), 1);
  ck_assert_int_eq(dp_train_step(a.c, B / 2, IN, x + B / 2 * IN, y + B / 2, NULL), DP_OK);
  ck_assert_int_eq(dp_ctx_accumulated(a.c), 0);
  ck_assert_int_eq(dp_get_running_stats(a.c, BN2, mv[0], mv[0] + 8, &n[0]), DP_OK);
  ck_assert_int_eq(n[0], 2);
  ck_assert_int_eq(dp_train_step(c.c, B, IN, x, y, NULL), DP_OK);
  ck_assert_int_eq(dp_get_running_stats(c.c, BN2, mv[1], mv[1] + 8, &n[1]), DP_OK);
  ck_assert_int_eq(n[1], 1);
  if (mode == DP_BN_PER_REPLICA)
    ck_assert_uint_eq(dp_params_hash(a.c), dp_params_hash(c.c));
  else /* the statistics of each call's 16 rows, not of all 32: another update */
    ck_assert_uint_ne(dp_params_hash(a.c), dp_params_hash(c.c));
  rig_close(&a);
  rig_close(&s);
  rig_close(&c);
}
END_TEST

/* Trains `steps` full batches with plain SGD and returns the parameters (n
 * floats). (Not AdamW: the biases before the batchnorms have gradients of
 * zero up to rounding, which g / sqrt(v) turns into whole steps.) */
static float *train_params(dp_config c, int steps, size_t *n) {
  dp_config_set_optimizer(&c, DP_OPT_SGD);
  c.lr = 0.1f;
  rig r;
  rig_open(&r, SPEC, &c);
  float x[B * IN];
  int32_t y[B];
  for (int s = 0; s < steps; s++) {
    make_batch(x, y, s);
    ck_assert_msg(dp_train_step(r.c, B, IN, x, y, NULL) == DP_OK, "%s", dp_ctx_error(r.c));
  }
  *n = dp_model_n_params(r.m);
  float *w = malloc(*n * 4);
  ck_assert_int_eq(dp_get_params(r.c, w, *n), DP_OK);
  rig_close(&r);
  return w;
}

/* Largest |a - b| over the largest |b|. */
static double rel_diff(const float *a, const float *b, size_t n) {
  double d = 0, m = 0;
  for (size_t k = 0; k < n; k++) {
    d = fmax(d, fabs((double)a[k] - (double)b[k]));
    m = fmax(m, fabs((double)b[k]));
  }
  return d / m;
}

/* sync normalises with the whole batch: whatever the micro-batches and the
 * devices (3: not a power of two, so other bits), the training is the one of
 * a single micro-batch (per_replica with the batch as its micro-batch) up to
 * rounding, and far from per_replica's micro-batch statistics. */
START_TEST(sync_statistics_are_the_whole_batch) {
  size_t n;
  dp_config whole = cfg_of(1, DP_MODE_CLASSIC, 0, DP_BN_PER_REPLICA);
  whole.micro_batch = B;
  float *ref = train_params(whole, 4, &n);
  static const struct {
    int devices, micro_batch;
  } lay[] = {{1, MB}, {2, 2 * MB}, {3, MB}, {4, 0}, {8, 1}};
  for (size_t i = 0; i < sizeof lay / sizeof *lay; i++) {
    dp_config c = cfg_of(lay[i].devices, DP_MODE_ALLREDUCE, 0, DP_BN_SYNC);
    c.micro_batch = lay[i].micro_batch;
    float *w = train_params(c, 4, &n);
    double d = rel_diff(w, ref, n);
    ck_assert_msg(d < 1e-4, "%d devices, micro-batch %d: %g from the whole batch's",
                  lay[i].devices, lay[i].micro_batch, d);
    free(w);
  }
  float *pr = train_params(cfg_of(2, DP_MODE_CLASSIC, 0, DP_BN_PER_REPLICA), 4, &n);
  ck_assert_double_gt(rel_diff(pr, ref, n), 1e-3);
  free(pr);
  free(ref);
}
END_TEST

/* sync: a micro-batch of one row is fine (the batch has the variance); a batch
 * of one row of a 1d batchnorm is not, and is refused before anything moves. */
START_TEST(sync_refuses_only_a_batch_of_one_value) {
  dp_config c = cfg_of(2, DP_MODE_CLASSIC, 0, DP_BN_SYNC);
  c.micro_batch = 1;
  rig r;
  rig_open(&r, "input 4\nlinear 3\nbatchnorm\nlinear 2\nloss mse\n", &c);
  float x[B * 4] = {0}, t[B * 2] = {0};
  for (int i = 0; i < B * 4; i++) x[i] = (float)(i % 7);
  ck_assert_int_eq(dp_train_step(r.c, B, 4, x, t, NULL), DP_OK);
  uint64_t h = dp_params_hash(r.c);
  float mv[6];
  int64_t count = -1;
  ck_assert_int_eq(dp_train_step(r.c, 1, 4, x, t, NULL), DP_ERR_SHAPE);
  ck_assert_msg(strstr(dp_ctx_error(r.c), "one row"), "%s", dp_ctx_error(r.c));
  ck_assert_uint_eq(dp_params_hash(r.c), h);
  ck_assert_int_eq(dp_get_running_stats(r.c, 1, mv, mv + 3, &count), DP_OK);
  ck_assert_int_eq(count, 1);
  ck_assert_int_eq(dp_train_step(r.c, 2, 4, x, t, NULL), DP_OK);
  rig_close(&r);
}
END_TEST

/* One per_replica step of `rows` rows on a context planned for `planned` rows on
 * `devices` devices (a micro-batch per device): its parameters. */
static float *short_step_params(int planned, int devices, int rows, size_t *n) {
  dp_config c = cfg_of(devices, DP_MODE_CLASSIC, 0, DP_BN_PER_REPLICA);
  c.batch = planned;
  c.micro_batch = 0;
  rig r;
  rig_open(&r, SPEC, &c);
  float x[B * IN];
  int32_t y[B];
  make_batch(x, y, 0);
  ck_assert_msg(dp_train_step(r.c, rows, IN, x, y, NULL) == DP_OK, "%s", dp_ctx_error(r.c));
  *n = dp_model_n_params(r.m);
  float *w = malloc(*n * 4);
  ck_assert_int_eq(dp_get_params(r.c, w, *n), DP_OK);
  rig_close(&r);
  return w;
}

/* A short batch (an epoch's last) keeps the planned cut points, so per_replica
 * normalises its rows in the planned blocks: 10 rows on a context planned for 32
 * on 2 devices all go to device 0 (one device's statistics), not torch.chunk's
 * 5 + 5 that nn.DataParallel, or a context planned for 10, would use (API.md). */
START_TEST(short_batch_keeps_the_planned_cut_for_statistics) {
  size_t n;
  float *got = short_step_params(B, 2, 10, &n);
  float *one = short_step_params(B, 1, 10, &n);
  float *chunked = short_step_params(10, 2, 10, &n);
  ck_assert_double_lt(rel_diff(got, one, n), 1e-6);
  ck_assert_double_gt(rel_diff(got, chunked, n), 1e-3);
  free(got);
  free(one);
  free(chunked);
}
END_TEST

Suite *batchnorm_suite(void) {
  Suite *s = suite_create("batchnorm");
  TCase *tc = tcase_create("both_modes");
  tcase_set_timeout(tc, 240);
  tcase_add_loop_test(tc, same_bits_and_running_stats_across_devices_and_modes,
                      DP_BN_PER_REPLICA, DP_BN_SYNC + 1);
  tcase_add_loop_test(tc, running_stats_start_at_pytorch_defaults_and_count_steps,
                      DP_BN_PER_REPLICA, DP_BN_SYNC + 1);
  tcase_add_loop_test(tc, refused_step_leaves_running_stats_alone, DP_BN_PER_REPLICA,
                      DP_BN_SYNC + 1);
  tcase_add_loop_test(tc, checkpoints_carry_running_stats, DP_BN_PER_REPLICA,
                      DP_BN_SYNC + 1);
  tcase_add_loop_test(tc, accumulation_moves_running_stats_every_call, DP_BN_PER_REPLICA,
                      DP_BN_SYNC + 1);
  tcase_add_test(tc, refusals_name_what_is_wrong);
  tcase_add_test(tc, check_rows_says_what_the_step_refuses);
  tcase_add_test(tc, check_rows_takes_any_count_on_an_inference_plan);
  tcase_add_test(tc, short_batch_keeps_the_planned_cut_for_statistics);
  suite_add_tcase(s, tc);
  tc = tcase_create("sync");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, sync_statistics_are_the_whole_batch);
  tcase_add_test(tc, sync_refuses_only_a_batch_of_one_value);
  suite_add_tcase(s, tc);
  return s;
}
