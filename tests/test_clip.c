/* Gradient clipping by global norm (config.clip_grad_norm), as
 * torch.nn.utils.clip_grad_norm_: the norm against a double reference, the
 * scaling bit for bit, the same bits for every device count and mode, and
 * refusals. Clipping by value (config.clip_grad_value, clip_grad_value_): the
 * clamp bit for bit in every mode, NaN refused with nothing changed. */
#include "dp.h"
#include "helpers.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *SPEC = "input 12\nlinear 16\nlayernorm\ngelu\ndropout 0.2\nlinear 16\n"
                          "tanh\nlinear 5\nloss softmax_cross_entropy\n";
enum { B = 64, IN = 12, CLASSES = 5, MB = 4 };

static void make_batch(float *x, int32_t *y, int step) {
  uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(step + 1);
  for (int i = 0; i < B * IN; i++)
    x[i] = 3.0f * ((float)(rng_next(&s) >> 40) * 0x1p-23f - 1.0f);
  for (int r = 0; r < B; r++) y[r] = (int32_t)(rng_next(&s) % CLASSES);
}

static dp_config cfg_of(int n, dp_mode mode, int shard, float clip) {
  dp_config c = config_of(B, n, DP_OPT_ADAMW);
  c.micro_batch = MB;
  c.mode = mode;
  c.shard_optimizer = shard;
  c.seed = 11;
  c.clip_grad_norm = clip;
  return c;
}

/* One step of batch 0 on the rigs a and b, and their gradients (malloc'd, the
 * caller frees them). */
static void step_both(rig *a, rig *b, float **ga, float **gb) {
  float x[B * IN];
  int32_t y[B];
  make_batch(x, y, 0);
  ck_assert_int_eq(dp_train_step(a->c, B, IN, x, y, NULL), DP_OK);
  ck_assert_int_eq(dp_train_step(b->c, B, IN, x, y, NULL), DP_OK);
  *ga = malloc(a->np * 4);
  *gb = malloc(b->np * 4);
  ck_assert_int_eq(dp_get_grads(a->c, *ga, a->np), DP_OK);
  ck_assert_int_eq(dp_get_grads(b->c, *gb, b->np), DP_OK);
}

/* One step of the same batch on a clipping context and on one without: the
 * norm is the double norm of the unclipped gradients rounded to float, and
 * the clipped gradients are the unclipped ones times the coefficient. */
START_TEST(norm_and_scaling_match_the_definition) {
  static const float clips[] = {1e-3f, 0.05f, 1e6f};
  for (int i = 0; i < 3; i++) {
    dp_config a = cfg_of(2, DP_MODE_ALLREDUCE, 0, clips[i]),
              b = cfg_of(2, DP_MODE_ALLREDUCE, 0, 0);
    rig ra, rb;
    rig_open(&ra, SPEC, &a);
    rig_open(&rb, SPEC, &b);
    ck_assert(isnan(dp_ctx_grad_norm(ra.c)));
    ck_assert(dp_ctx_grad_norm(rb.c) == 0.0f);
    float *ga, *gb;
    step_both(&ra, &rb, &ga, &gb);
    double ss = 0.0;
    for (size_t k = 0; k < rb.np; k++) ss += (double)gb[k] * gb[k];
    float want = (float)sqrt(ss), norm = dp_ctx_grad_norm(ra.c);
    ck_assert_msg(fabsf(norm - want) <= 2e-7f * want, "norm %.9g, double reference %.9g",
                  (double)norm, (double)want);
    float coef = clips[i] / (norm + 1e-6f);
    for (size_t k = 0; k < ra.np; k++) {
      float expect = coef < 1.0f ? gb[k] * coef : gb[k];
      ck_assert_msg(memcmp(&ga[k], &expect, 4) == 0,
                    "max_norm %g: gradient %zu is %.9g, want %.9g", (double)clips[i], k,
                    (double)ga[k], (double)expect);
    }
    /* only a norm above max_norm changes anything */
    if (coef >= 1.0f)
      ck_assert_uint_eq(dp_params_hash(ra.c), dp_params_hash(rb.c));
    else
      ck_assert_uint_ne(dp_params_hash(ra.c), dp_params_hash(rb.c));
    free(ga);
    free(gb);
    rig_close(&ra);
    rig_close(&rb);
  }
}
END_TEST

/* 1, 2, 4, 8 devices in classic, allreduce and sharded modes, with a rate
 * schedule: the same parameters and norm after every step (the norm is summed
 * exactly). */
START_TEST(same_bits_for_every_device_count_and_mode) {
  static const struct {
    int n;
    dp_mode mode;
    int shard;
  } L[] = {{1, DP_MODE_CLASSIC, 0},   {2, DP_MODE_CLASSIC, 0},   {4, DP_MODE_CLASSIC, 0},
           {2, DP_MODE_ALLREDUCE, 0}, {4, DP_MODE_ALLREDUCE, 0}, {8, DP_MODE_ALLREDUCE, 0},
           {2, DP_MODE_ALLREDUCE, 1}, {4, DP_MODE_ALLREDUCE, 1}, {8, DP_MODE_ALLREDUCE, 1}};
  enum { N = sizeof L / sizeof *L, STEPS = 6 };
  rig r[N];
  for (int i = 0; i < N; i++) {
    dp_config c = cfg_of(L[i].n, L[i].mode, L[i].shard, 0.05f);
    rig_open(&r[i], SPEC, &c);
  }
  float x[B * IN];
  int32_t y[B];
  /* with a learning-rate schedule too (dp_set_lr before every step) */
  dp_lr_schedule sched = {.kind = DP_LR_WARMUP_COSINE,
                          .base_lr = 0.01f,
                          .gamma = 1.0f,
                          .start_factor = 1.0f / 3.0f,
                          .warmup = 2,
                          .t_max = 6};
  for (int t = 0; t < STEPS; t++) {
    make_batch(x, y, t);
    for (int i = 0; i < N; i++) {
      ck_assert_int_eq(dp_set_lr(r[i].c, dp_lr_at(&sched, dp_ctx_step(r[i].c))), DP_OK);
      ck_assert_msg(dp_train_step(r[i].c, B, IN, x, y, NULL) == DP_OK, "%s",
                    dp_ctx_error(r[i].c));
    }
    for (int i = 1; i < N; i++) {
      ck_assert_msg(dp_params_hash(r[i].c) == dp_params_hash(r[0].c),
                    "step %d: %d devices, mode %d, shard %d differ from one device", t,
                    L[i].n, (int)L[i].mode, L[i].shard);
      float a = dp_ctx_grad_norm(r[i].c), b = dp_ctx_grad_norm(r[0].c);
      ck_assert(memcmp(&a, &b, 4) == 0);
    }
  }
  ck_assert_float_gt(dp_ctx_grad_norm(r[0].c), 0.05f); /* it did clip */
  for (int i = 0; i < N; i++) rig_close(&r[i]);
}
END_TEST

START_TEST(bad_values_are_refused) {
  static const float bad[] = {-1.0f, NAN, INFINITY};
  dp_model *m = model_of(SPEC);
  for (int i = 0; i < 3; i++) {
    dp_config c = cfg_of(2, DP_MODE_CLASSIC, 0, bad[i]);
    dp_plan *p = NULL;
    ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_ERR_INVALID);
    ck_assert_msg(strstr(dp_last_error(), "clip_grad_norm"), "%s", dp_last_error());
    ck_assert_ptr_null(p);
  }
  /* an inference plan ignores it, like the other hyper-parameters */
  dp_config c = cfg_of(2, DP_MODE_CLASSIC, 0, -1.0f);
  c.inference = 1;
  dp_plan *p = plan_of(m, &c);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* A non-finite gradient: the norm says so, the step is refused by the check
 * that names the gradient, and nothing changes. */
START_TEST(nonfinite_gradient_is_refused_unchanged) {
  dp_config c = cfg_of(4, DP_MODE_ALLREDUCE, 1, 0.05f);
  rig r;
  rig_open(&r, SPEC, &c);
  float x[B * IN];
  int32_t y[B];
  make_batch(x, y, 0);
  ck_assert_int_eq(dp_train_step(r.c, B, IN, x, y, NULL), DP_OK);
  uint64_t h = dp_params_hash(r.c);
  x[5] = NAN;
  ck_assert_int_eq(dp_train_step(r.c, B, IN, x, y, NULL), DP_ERR_NONFINITE);
  ck_assert(!isfinite(dp_ctx_grad_norm(r.c)));
  ck_assert_uint_eq(dp_params_hash(r.c), h);
  ck_assert_uint_eq(dp_ctx_step(r.c), 1);
  rig_close(&r);
}
END_TEST

/* ---- config.clip_grad_value ---------------------------------------------------- */

/* One step of the same batch with and without clip_grad_value, on 2 devices
 * classic, 2 allreduce and 4 sharded (Adam): the gradients are the plain ones
 * clamped to [-v, v], bit for bit; the parameters change only when a gradient
 * was clamped. */
START_TEST(clamp_matches_the_definition_in_every_mode) {
  static const float values[] = {1e-3f, 0.02f, 1e6f};
  static const struct {
    int n;
    dp_mode mode;
    int shard;
  } L[] = {{2, DP_MODE_CLASSIC, 0}, {2, DP_MODE_ALLREDUCE, 0}, {4, DP_MODE_ALLREDUCE, 1}};
  for (int l = 0; l < 3; l++)
    for (int i = 0; i < 3; i++) {
      dp_config a = cfg_of(L[l].n, L[l].mode, L[l].shard, 0),
                b = cfg_of(L[l].n, L[l].mode, L[l].shard, 0);
      a.optimizer = b.optimizer = DP_OPT_ADAM;
      a.weight_decay = b.weight_decay = 0.01f;
      a.clip_grad_value = values[i];
      rig ra, rb;
      rig_open(&ra, SPEC, &a);
      rig_open(&rb, SPEC, &b);
      float *ga, *gb;
      step_both(&ra, &rb, &ga, &gb);
      size_t clamped = 0;
      for (size_t k = 0; k < ra.np; k++) {
        float v = values[i], expect = gb[k] > v ? v : gb[k] < -v ? -v : gb[k];
        clamped += expect != gb[k];
        ck_assert_msg(memcmp(&ga[k], &expect, 4) == 0,
                      "layout %d, clip_grad_value %g: gradient %zu is %.9g, want %.9g", l,
                      (double)v, k, (double)ga[k], (double)expect);
      }
      ck_assert_msg((clamped > 0) == (i < 2), "clip_grad_value %g clamped %zu",
                    (double)values[i], clamped);
      if (clamped)
        ck_assert_uint_ne(dp_params_hash(ra.c), dp_params_hash(rb.c));
      else
        ck_assert_uint_eq(dp_params_hash(ra.c), dp_params_hash(rb.c));
      free(ga);
      free(gb);
      rig_close(&ra);
      rig_close(&rb);
    }
}
END_TEST

/* A NaN gradient stays NaN under the clamp (torch.clamp's rule): the step is
 * refused naming it, parameters, optimizer state and step counter unchanged
 * (the next good step gives the bits of a context that never saw the bad one);
 * under DP_NONFINITE_SKIP it is skipped. */
START_TEST(clamp_keeps_nan_and_the_step_is_refused_unchanged) {
  for (int skip = 0; skip < 2; skip++) {
    dp_config c = cfg_of(4, DP_MODE_ALLREDUCE, 1, 0);
    c.optimizer = DP_OPT_ADAM;
    c.clip_grad_value = 1e-3f;
    c.on_nonfinite = skip ? DP_NONFINITE_SKIP : DP_NONFINITE_ERROR;
    rig r, ref;
    rig_open(&r, SPEC, &c);
    rig_open(&ref, SPEC, &c);
    float x[B * IN];
    int32_t y[B];
    make_batch(x, y, 0);
    ck_assert_int_eq(dp_train_step(r.c, B, IN, x, y, NULL), DP_OK);
    ck_assert_int_eq(dp_train_step(ref.c, B, IN, x, y, NULL), DP_OK);
    uint64_t h = dp_params_hash(r.c);
    float bad[B * IN];
    memcpy(bad, x, sizeof bad);
    bad[5] = NAN;
    float loss = 0.0f;
    ck_assert_int_eq(dp_train_step(r.c, B, IN, bad, y, &loss),
                     skip ? DP_OK : DP_ERR_NONFINITE);
    if (!skip) ck_assert_msg(strstr(dp_ctx_error(r.c), "NaN"), "%s", dp_ctx_error(r.c));
    ck_assert_uint_eq(dp_params_hash(r.c), h);
    ck_assert_uint_eq(dp_ctx_step(r.c), 1);
    make_batch(x, y, 1);
    ck_assert_int_eq(dp_train_step(r.c, B, IN, x, y, NULL), DP_OK);
    ck_assert_int_eq(dp_train_step(ref.c, B, IN, x, y, NULL), DP_OK);
    ck_assert_uint_eq(dp_params_hash(r.c), dp_params_hash(ref.c));
    rig_close(&r);
    rig_close(&ref);
  }
}
END_TEST

Suite *clip_suite(void) {
  Suite *s = suite_create("clip");
  TCase *tc = tcase_create("clip_grad_norm");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, norm_and_scaling_match_the_definition);
  tcase_add_test(tc, same_bits_for_every_device_count_and_mode);
  tcase_add_test(tc, bad_values_are_refused);
  tcase_add_test(tc, nonfinite_gradient_is_refused_unchanged);
  suite_add_tcase(s, tc);
  tc = tcase_create("clip_grad_value");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, clamp_matches_the_definition_in_every_mode);
  tcase_add_test(tc, clamp_keeps_nan_and_the_step_is_refused_unchanged);
  suite_add_tcase(s, tc);
  return s;
}
