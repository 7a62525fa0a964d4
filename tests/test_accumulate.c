/* Gradient accumulation (config.accumulate): K calls of B rows update once,
 * with the bits of one step of the K*B concatenated rows on a context planned
 * for K*B; refused calls change nothing; saves wait for the update. */
#include "dp.h"
#include "helpers.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* dropout: its masks must be keyed by the row of the concatenation */
static const char *SPEC = "input 12\nlinear 16\nlayernorm\ngelu\ndropout 0.2\nlinear 16\n"
                          "tanh\nlinear 5\nloss softmax_cross_entropy\n";
enum { B = 32, IN = 12, CLASSES = 5, MB = 4, MAXK = 8, STEPS = 3 };

static float X[STEPS * MAXK * B * IN];
static int32_t Y[STEPS * MAXK * B];

static void make_data(void) {
  uint64_t s = 0x2545f4914f6cdd1dull;
  for (size_t i = 0; i < sizeof X / sizeof *X; i++)
    X[i] = 3.0f * ((float)(rng_next(&s) >> 40) * 0x1p-23f - 1.0f);
  for (size_t r = 0; r < sizeof Y / sizeof *Y; r++)
    Y[r] = (int32_t)(rng_next(&s) % CLASSES);
}

static dp_config cfg_of(int batch, int n, dp_mode mode, int shard, int K, float clip) {
  dp_config c = config_of(batch, n, DP_OPT_ADAMW);
  c.micro_batch = MB;
  c.mode = mode;
  c.shard_optimizer = shard;
  c.seed = 5;
  c.accumulate = K;
  c.clip_grad_norm = clip;
  return c;
}

/* K in 2, 4, 8; 1, 2, 4 devices; classic, allreduce, sharded; with and
 * without clipping: the parameters after every update are the concatenated
 * step's, bit for bit, and the step counter counts updates. */
START_TEST(accumulation_equals_the_concatenated_batch) {
  make_data();
  static const struct {
    int n;
    dp_mode mode;
    int shard;
  } L[] = {{1, DP_MODE_CLASSIC, 0},
           {2, DP_MODE_CLASSIC, 0},
           {4, DP_MODE_ALLREDUCE, 0},
           {2, DP_MODE_ALLREDUCE, 1},
           {4, DP_MODE_ALLREDUCE, 1}};
  for (int K = 2; K <= MAXK; K *= 2)
    for (size_t i = 0; i < sizeof L / sizeof *L; i++)
      for (int clip = 0; clip < 2; clip++) {
        dp_config ca = cfg_of(B, L[i].n, L[i].mode, L[i].shard, K, clip ? 0.05f : 0.0f);
        dp_config cb = cfg_of(K * B, L[i].n, L[i].mode, L[i].shard, 0, clip ? 0.05f : 0.0f);
        rig a, b;
        rig_open(&a, SPEC, &ca);
        rig_open(&b, SPEC, &cb);
        for (int t = 0; t < STEPS; t++) {
          for (int k = 0; k < K; k++) {
            ck_assert_int_eq(dp_ctx_accumulated(a.c), k);
            size_t r0 = (size_t)(t * K + k) * B;
            ck_assert_msg(dp_train_step(a.c, B, IN, X + r0 * IN, Y + r0, NULL) == DP_OK,
                          "%s", dp_ctx_error(a.c));
            ck_assert_uint_eq(dp_ctx_step(a.c), (uint64_t)(k + 1 == K ? t + 1 : t));
          }
          size_t r0 = (size_t)t * K * B;
          ck_assert_int_eq(dp_train_step(b.c, K * B, IN, X + r0 * IN, Y + r0, NULL), DP_OK);
          ck_assert_msg(
              dp_params_hash(a.c) == dp_params_hash(b.c),
              "K %d, %d devices, mode %d, shard %d, clip %d: update %d differs from "
              "the concatenated step",
              K, L[i].n, (int)L[i].mode, L[i].shard, clip, t + 1);
        }
        rig_close(&a);
        rig_close(&b);
      }
}
END_TEST

/* The same with batchnorm (per replica: each micro-batch's statistics, so a
 * micro-batch dividing the calls' rows gives the concatenated step's) on a
 * sequence, in fp32 and bf16, on 1 and 2 devices, K 2 and 4. */
START_TEST(accumulation_with_batchnorm_equals_the_concatenated_batch) {
  static const char *spec =
      "input tokens 6\nembed 11 8\nresidual\nlinear 24 nobias\n"
      "attention 2\nlinear 8 nobias\nbatchnorm\nend\n"
      "batchnorm momentum 0.3\nlinear 11\nloss softmax_cross_entropy\n";
  enum { T = 6, V = 11, R = 8 };
  static float x[4 * R * T];
  static int32_t y[4 * R * T];
  for (int i = 0; i < 4 * R * T; i++) {
    x[i] = (float)((i * 7 + i / 5) % V);
    y[i] = (i * 3 + i / 7) % V;
  }
  for (int K = 2; K <= 4; K *= 2)
    for (int n = 1; n <= 2; n++)
      for (int bf = 0; bf < 2; bf++) {
        dp_config ca = cfg_of(R, n, DP_MODE_CLASSIC, 0, K, 0.05f);
        dp_config cb = cfg_of(K * R, n, DP_MODE_CLASSIC, 0, 0, 0.05f);
        ca.micro_batch = cb.micro_batch = 2;
        ca.precision = cb.precision = bf ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
        rig a, b;
        rig_open(&a, spec, &ca);
        rig_open(&b, spec, &cb);
        for (int k = 0; k < K; k++)
          ck_assert_msg(dp_train_step(a.c, R, T, x + k * R * T, y + k * R * T, NULL) ==
                            DP_OK,
                        "%s", dp_ctx_error(a.c));
        ck_assert_int_eq(dp_train_step(b.c, K * R, T, x, y, NULL), DP_OK);
        ck_assert_msg(dp_params_hash(a.c) == dp_params_hash(b.c),
                      "K %d, %d devices, %s: the update differs from the concatenated step",
                      K, n, bf ? "bf16" : "fp32");
        rig_close(&a);
        rig_close(&b);
      }
}
END_TEST

/* The partial sums are planned: optimizer_state holds log2(K) gradient copies
 * after AdamW's two vectors. */
START_TEST(partial_sums_are_in_the_plan) {
  dp_model *m = model_of(SPEC);
  size_t n = dp_model_n_params(m);
  for (int K = 1; K <= 8; K *= 2) {
    dp_config c = cfg_of(B, 1, DP_MODE_CLASSIC, 0, K, 0);
    dp_plan *p = plan_of(m, &c);
    int levels = K == 8 ? 3 : K == 4 ? 2 : K == 2 ? 1 : 0;
    ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_OPT_STATE).size, (2 + levels) * n * 4);
    dp_plan_free(p);
  }
  static const int bad[] = {3, 6, -2, 131072};
  for (int i = 0; i < 4; i++) {
    dp_config c = cfg_of(B, 1, DP_MODE_CLASSIC, 0, bad[i], 0);
    dp_plan *p = NULL;
    ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_ERR_INVALID);
    ck_assert_msg(strstr(dp_last_error(), "accumulate"), "%s", dp_last_error());
  }
  dp_model_free(m);
}
END_TEST

/* A refused call in the middle leaves the accumulation where it was, and its
 * retry gives the bits of an undisturbed run; a save waits for the update. */
START_TEST(refused_call_and_save_in_the_middle) {
  make_data();
  dp_config ca = cfg_of(B, 2, DP_MODE_ALLREDUCE, 1, 4, 0.05f);
  rig a, ref;
  rig_open(&a, SPEC, &ca);
  rig_open(&ref, SPEC, &ca);
  for (int k = 0; k < 4; k++) {
    size_t r0 = (size_t)k * B;
    if (k == 2) {
      float keep = X[r0 * IN + 3];
      X[r0 * IN + 3] = NAN;
      ck_assert_int_eq(dp_train_step(a.c, B, IN, X + r0 * IN, Y + r0, NULL),
                       DP_ERR_NONFINITE);
      X[r0 * IN + 3] = keep;
      ck_assert_int_eq(dp_ctx_accumulated(a.c), 2);
      char path[] = "/tmp/dp_accum_XXXXXX";
      int fd = mkstemp(path);
      ck_assert_int_ge(fd, 0);
      ck_assert_int_eq(dp_ckpt_save(a.c, path), DP_ERR_INVALID);
      ck_assert_msg(strstr(dp_ctx_error(a.c), "accumulation"), "%s", dp_ctx_error(a.c));
      unlink(path);
    }
    ck_assert_int_eq(dp_train_step(a.c, B, IN, X + r0 * IN, Y + r0, NULL), DP_OK);
    ck_assert_int_eq(dp_train_step(ref.c, B, IN, X + r0 * IN, Y + r0, NULL), DP_OK);
  }
  ck_assert_uint_eq(dp_ctx_step(a.c), 1);
  ck_assert_uint_eq(dp_params_hash(a.c), dp_params_hash(ref.c));
  rig_close(&a);
  rig_close(&ref);
}
END_TEST

/* The update's mean is over accumulate * batch rows: more than INT_MAX of
 * them wrapped the loss gradient's scale (batch 32768 x 65536: the gradient's
 * sign flipped and the step went uphill, DP_OK; 65536 x 65536: a scale of
 * 1/0 refused every step as non-finite). The planner refuses them. */
START_TEST(rows_per_update_past_int_max_are_refused) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse("input 1\nlinear 1\nloss mse\n", "t", &m), DP_OK);
  dp_config c = config_of(32768, 1, DP_OPT_SGD);
  c.accumulate = 65536;
  dp_plan *p = NULL;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_ERR_OVERFLOW);
  ck_assert_ptr_null(p);
  ck_assert_msg(strstr(dp_last_error(), "2147483648 rows per update"), "%s",
                dp_last_error());
  c.batch = 65536;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_ERR_OVERFLOW);
  /* the largest that fits int is planned, and dp_plan_max_batch stops there */
  c.batch = 32767;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_OK);
  dp_plan_free(p);
  int best = 0;
  ck_assert_int_eq(dp_plan_max_batch(m, &c, (size_t)1 << 40, 100000, &best), DP_OK);
  ck_assert_int_eq(best, 32767);
  /* an inference plan does not accumulate */
  c.batch = 65536;
  c.inference = 1;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_OK);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

Suite *accumulate_suite(void) {
  Suite *s = suite_create("accumulate");
  TCase *tc = tcase_create("accumulate");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, accumulation_equals_the_concatenated_batch);
  tcase_add_test(tc, accumulation_with_batchnorm_equals_the_concatenated_batch);
  tcase_add_test(tc, partial_sums_are_in_the_plan);
  tcase_add_test(tc, refused_call_and_save_in_the_middle);
  tcase_add_test(tc, rows_per_update_past_int_max_are_refused);
  suite_add_tcase(s, tc);
  return s;
}
