/* The "checked" test backend (tests/checked/) and the plan verification
 * (lib/core/verify.c): a backend added from new files only runs the public API
 * with the cpu backend's bits, every op checked against the plan; an op or a
 * plan that reaches outside its memory is refused, naming what. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "checked/checked.h"
#include "core/operands.h"
#include "helpers.h"

/* the seed's case: x [30, 5], 2 devices, Linear(5, 2) */
static const char *const seed_spec = "input 5\nlinear 2\nloss mse\n";
static const char *const cnn_spec = "input 2 6 6\nconv2d 3 3 padding 1\nbatchnorm\nrelu\n"
                                    "maxpool2d 2\nflatten\nlinear 4\nlayernorm\ngelu\n"
                                    "dropout 0.25\nlinear 3\nloss softmax_cross_entropy\n";

static dp_backend checked_kind(void) {
  dp_backend k = DP_BACKEND_CPU;
  ck_assert_int_eq(dp_checked_register(&k), DP_OK);
  ck_assert_int_ge(k, 2);
  ck_assert_str_eq(dp_backend_name(k), "checked");
  return k;
}

/* Steps on backend b; returns the parameters' hash. */
static uint64_t train(const char *spec, dp_config c, dp_backend b, int in, int classes) {
  c.backend = b;
  rig r;
  rig_open(&r, spec, &c);
  enum { ROWS = 30 };
  float x[ROWS * 72], t[ROWS * 8];
  int32_t lab[ROWS];
  uint64_t s = 42;
  for (int i = 0; i < ROWS * in; i++) x[i] = (float)(rng_next(&s) % 1000) / 500.0f - 1.0f;
  for (int i = 0; i < ROWS * 8; i++) t[i] = (float)(rng_next(&s) % 100) / 100.0f;
  for (int i = 0; i < ROWS; i++) /* classes 0: a regression target, no labels */
    lab[i] = classes ? (int32_t)(rng_next(&s) % (uint64_t)classes) : 0;
  for (int k = 0; k < 3; k++) {
    float loss = 0.0f;
    ck_assert_msg(dp_train_step(r.c, ROWS, in, x, classes ? (const void *)lab : t, &loss) ==
                      DP_OK,
                  "%s", dp_last_error());
  }
  uint64_t h = dp_params_hash(r.c);
  rig_close(&r);
  return h;
}

START_TEST(checked_backend_runs_with_the_cpu_bits) {
  dp_backend k = checked_kind();
  long run0 = dp_checked_ops_run(), bad0 = dp_checked_ops_refused();
  dp_config c = config_of(30, 2, DP_OPT_ADAMW);
  ck_assert_uint_eq(train(seed_spec, c, k, 5, 0),
                    train(seed_spec, c, DP_BACKEND_CPU, 5, 0));
  c = config_of(30, 3, DP_OPT_MOMENTUM);
  c.mode = DP_MODE_ALLREDUCE;
  c.micro_batch = 4;
  ck_assert_uint_eq(train(cnn_spec, c, k, 72, 3),
                    train(cnn_spec, c, DP_BACKEND_CPU, 72, 3));
  ck_assert_int_gt(dp_checked_ops_run(), run0);
  ck_assert_int_eq(dp_checked_ops_refused(), bad0);
}
END_TEST

/* The checked backend pads every micro-batch's slice of a row tensor to 256 B
 * (dp_backend_ops.slice_align, as cuda does, issue 28's finding 3): its
 * plans are larger than the cpu's, every op still reads and writes inside its
 * own slice, and the bits stay the cpu's (packed) in both modes, for
 * micro-batches of 1, 3 and 7 rows, for widths that are not multiples of 4,
 * with gradient accumulation and with sync batchnorm. */
START_TEST(padded_micro_batch_slices_keep_the_cpu_bits) {
  dp_backend k = checked_kind();
  static const char *const odd_mlp = "input 5\nlinear 7\nlayernorm\nrelu\nlinear 3\n"
                                     "tanh\nloss mse\n";
  static const char *const sync_cnn = "input 2 6 6\nconv2d 3 3 padding 1\nbatchnorm\n"
                                      "relu\nmaxpool2d 2\nflatten\nlinear 5\nloss "
                                      "softmax_cross_entropy\n";
  static const int mbs[] = {1, 3, 7};
  long bad0 = dp_checked_ops_refused();
  for (int mode = 0; mode < 2; mode++)
    for (int i = 0; i < 3; i++) {
      dp_config c = config_of(30, 3, DP_OPT_ADAMW);
      c.mode = mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC;
      c.micro_batch = mbs[i];
      c.backend = k;
      rig r;
      rig_open(&r, odd_mlp, &c);
      /* 7 rows of 5 floats (140 B) are padded to 256 B per slice */
      size_t packed = (size_t)dp_plan_device_rows(r.p, 1) * 5 * 4;
      ck_assert_uint_gt(dp_plan_region(r.p, 1, DP_REGION_INPUTS).size, packed);
      rig_close(&r);
      ck_assert_msg(train(odd_mlp, c, k, 5, 0) == train(odd_mlp, c, DP_BACKEND_CPU, 5, 0),
                    "mlp, %s, micro-batches of %d", mode ? "allreduce" : "classic", mbs[i]);
      c.batchnorm = DP_BN_SYNC;
      c.accumulate = i == 1 ? 2 : 1;
      ck_assert_msg(
          train(sync_cnn, c, k, 72, 5) == train(sync_cnn, c, DP_BACKEND_CPU, 72, 5),
          "sync-bn cnn, %s, micro-batches of %d", mode ? "allreduce" : "classic", mbs[i]);
    }
  ck_assert_int_eq(dp_checked_ops_refused(), bad0);
}
END_TEST

START_TEST(checked_backend_refuses_an_op_outside_its_region) {
  dp_backend k = checked_kind();
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  c.backend = k;
  rig r;
  rig_open(&r, seed_spec, &c);
  const dp_op *ops = dp_plan_ops(r.p);
  int n = dp_plan_n_ops(r.p), fwd = -1;
  for (int i = 0; i < n && fwd < 0; i++)
    if (ops[i].kind == DP_OP_FORWARD) fwd = i;
  ck_assert_int_ge(fwd, 0);
  dp_op bad = ops[fwd];
  bad.rows += 1000; /* rows the device's INPUTS do not have */
  dp_exec_env e = {.plan = r.p};
  long bad0 = dp_checked_ops_refused();
  ck_assert_int_eq(dp__backend_ops(k)->run(NULL, &e, &bad), DP_ERR_INVALID);
  ck_assert_int_eq(dp_checked_ops_refused(), bad0 + 1);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "outside region"));
  rig_close(&r);
}
END_TEST

/* A plan whose buffers overlap, or whose region is too small for an op, is
 * refused by dp__plan_verify (and so by dp_ctx_create) before any arena. */
START_TEST(plan_verify_finds_overlaps_and_stray_operands) {
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  rig r;
  rig_open(&r, "input 5\nlinear 8\ntanh\nlinear 2\nloss mse\n", &c);
  ck_assert_int_eq(dp__plan_verify(r.p), DP_OK);
  dp_plan *q = malloc(sizeof *q);
  ck_assert_ptr_nonnull(q);
  /* two buffers live at once in one place: linear 0's output and tanh's */
  memcpy(q, r.p, sizeof *q);
  q->act[0].act[1] = q->act[0].act[0];
  ck_assert_int_eq(dp__plan_verify(q), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "overlap"));
  dp_ctx *x = NULL;
  ck_assert_int_eq(dp_ctx_create(q, &x), DP_ERR_INVALID);
  ck_assert_ptr_null(x);
  /* a region too small for the rows an op reads */
  memcpy(q, r.p, sizeof *q);
  q->regions[1][DP_REGION_INPUTS].size = 8;
  ck_assert_int_eq(dp__plan_verify(q), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "outside region"));
  /* regions that overlap */
  memcpy(q, r.p, sizeof *q);
  q->regions[0][DP_REGION_GRADS].offset = q->regions[0][DP_REGION_PARAMS].offset;
  ck_assert_int_eq(dp__plan_verify(q), DP_ERR_INVALID);
  free(q);
  rig_close(&r);
}
END_TEST

Suite *checked_suite(void) {
  Suite *s = suite_create("checked");
  TCase *tc = tcase_create("checked");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, checked_backend_runs_with_the_cpu_bits);
  tcase_add_test(tc, padded_micro_batch_slices_keep_the_cpu_bits);
  tcase_add_test(tc, checked_backend_refuses_an_op_outside_its_region);
  tcase_add_test(tc, plan_verify_finds_overlaps_and_stray_operands);
  suite_add_tcase(s, tc);
  return s;
}
