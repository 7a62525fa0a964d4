/* Hostile sizes and inputs: every one must end in a clear dp_status and a
 * message, never a crash, a hang, a wrapped size or a partial write.
 *
 *   null_args    every pointer argument of every function in dp.h given NULL
 *                (one at a time): an error status or a no-op, and the
 *                context untouched
 *   sizes        dimensions and batches whose byte counts overflow size_t,
 *                zero-width layers (named by line and column), 0 / too many
 *                devices, more devices than rows (fewer used, and `dp plan`
 *                says so), absurd budgets, absurd rows/cols/n arguments
 *   values       NaN/Inf inputs and targets (DP_ERR_NONFINITE, nothing
 *                changed), labels out of range, non-finite dp_set_params
 *   checkpoint   truncated, oversized (trailing bytes, a sparse 1 GiB file),
 *                bit-flipped, another model's, not a file at all: refused,
 *                every arena byte unchanged
 *   files        CSV and model files: a 10 MB line, a line past the loader's
 *                limit, binary garbage, /dev/zero, a directory, a missing file
 *   regressions  exact inputs of bugs found by the fuzzers (fuzz/) and by the
 *                cases above
 *
 * lib/core/ctx.h is used only to snapshot a context's arenas. */
#include "dp.h"
#include "core/ctx.h"
#include "cli.h"
#include "data.h"
#include "../fuzz/ckpt_fixture.h"
#include "helpers.h"
#include "specs.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------ */

static const char SEED_SPEC[] = "input 5\nlinear 2\nloss mse\n";
static const char CE_SPEC[] =
    "input 4\nlinear 6\nrelu\nlinear 3\nloss softmax_cross_entropy\n";
/* Widths at the limit: 2^31-1 squared parameters fit size_t, bytes of a batch do not. */
static const char WIDE_SPEC[] = "input 2147483647\nlinear 2147483647\nloss mse\n";

/* s == want and the thread's last error contains `needle`. */
#define EXPECT(call, want, needle)                                                         \
  do {                                                                                     \
    dp_status s_ = (call);                                                                 \
    ck_assert_msg(s_ == (want), "%s: %s (%s), want %s", #call, dp_status_name(s_),         \
                  dp_last_error(), dp_status_name(want));                                  \
    ck_assert_msg(strstr(dp_last_error(), (needle)) != NULL,                               \
                  "%s: message '%s' lacks '%s'", #call, dp_last_error(), (needle));        \
  } while (0)

/* Any error with a non-empty message. */
#define REFUSED(call)                                                                      \
  do {                                                                                     \
    dp__error_clear();                                                                     \
    dp_status s_ = (call);                                                                 \
    ck_assert_msg(s_ != DP_OK, "%s was accepted", #call);                                  \
    ck_assert_msg(dp_last_error()[0] != '\0', "%s: no message", #call);                    \
  } while (0)

/* The state a refused step must leave alone: parameters, gradients and
 * optimizer state, and the step counter. The scratch regions a step runs in
 * (inputs, activations, outputs, loss) may have been written before the
 * refusal, and in classic mode the replicas' parameters are a copy of device
 * 0's that every step refreshes first. */
static void snap_check_state(const ctx_snap *s, const dp_ctx *c, const char *what) {
  static const dp_region kept[] = {DP_REGION_PARAMS, DP_REGION_GRADS, DP_REGION_OPT_STATE};
  bool classic = dp_plan_config(c->plan)->mode == DP_MODE_CLASSIC;
  for (int d = 0; d < s->n_dev; d++)
    for (size_t k = classic && d > 0 ? 1 : 0; k < sizeof kept / sizeof *kept; k++) {
      dp_region_info ri = dp_plan_region(c->plan, d, kept[k]);
      ck_assert_msg(memcmp(s->arena[d] + ri.offset, c->arena[d] + ri.offset, ri.size) == 0,
                    "%s: device %d's %s changed", what, d, dp_region_name(kept[k]));
    }
  ck_assert_msg(dp_ctx_step(c) == s->step, "%s: the step counter changed", what);
}

/* The file `name` in t, written with n bytes of data: its path. */
static const char *tmp_write(tmpdir *t, const char *name, const void *data, size_t n) {
  file_write(tmp_path(t, name), data, n);
  return t->path;
}

/* ==== null_args ==================================================================== */

START_TEST(model_functions_take_null) {
  dp_model *m = (dp_model *)(uintptr_t)1;
  EXPECT(dp_model_parse(NULL, "x", &m), DP_ERR_INVALID, "NULL");
  ck_assert_ptr_null(m);
  EXPECT(dp_model_parse("input 3\n", "x", NULL), DP_ERR_INVALID, "NULL");
  /* a NULL name is a default name, not an error */
  EXPECT(dp_model_parse("input 0\n", NULL, &m), DP_ERR_PARSE, "<spec>:1:7:");
  EXPECT(dp_model_load(NULL, &m), DP_ERR_INVALID, "NULL");
  EXPECT(dp_model_load("examples/seed.dpm", NULL), DP_ERR_INVALID, "NULL");
  EXPECT(dp_model_new(3, NULL), DP_ERR_INVALID, "NULL");
  EXPECT(dp_model_add_linear(NULL, 3, 1), DP_ERR_INVALID, "NULL");
  EXPECT(dp_model_add(NULL, DP_LAYER_RELU), DP_ERR_INVALID, "NULL");
  EXPECT(dp_model_add_dropout(NULL, 0.5f), DP_ERR_INVALID, "NULL");
  EXPECT(dp_model_set_loss(NULL, DP_LOSS_MSE), DP_ERR_INVALID, "NULL");
  dp_model_free(NULL);
  ck_assert_int_eq(dp_model_input_width(NULL), 0);
  ck_assert_int_eq(dp_model_output_width(NULL), 0);
  ck_assert_int_eq(dp_model_n_layers(NULL), 0);
  ck_assert_int_eq(dp_model_layer_kind(NULL, 0), DP_LAYER_INPUT);
  ck_assert_int_eq(dp_model_loss(NULL), DP_LOSS_NONE);
  ck_assert_uint_eq(dp_model_n_params(NULL), 0);
  char buf[16] = "junk";
  ck_assert_uint_eq(dp_model_format(NULL, buf, sizeof buf), 0);
  ck_assert_str_eq(buf, "");
  ck_assert_uint_eq(dp_model_format(NULL, NULL, 0), 0);
  ck_assert_uint_eq(dp_model_format(NULL, NULL, 16), 0);
  dp_model *seed = model_of(SEED_SPEC);
  /* a NULL buffer is a length query whatever the capacity says */
  size_t need = dp_model_format(seed, NULL, 0);
  ck_assert_uint_eq(dp_model_format(seed, NULL, 100), need);
  ck_assert_int_eq(dp_model_layer_kind(seed, -1), DP_LAYER_INPUT);
  ck_assert_int_eq(dp_model_layer_kind(seed, INT_MAX), DP_LAYER_INPUT);
  dp_model_free(seed);
}
END_TEST

START_TEST(name_functions_take_null) {
  dp_precision pr = DP_PRECISION_BF16;
  EXPECT(dp_precision_parse("fp32", NULL), DP_ERR_INVALID,
         "dp_precision_parse: out is NULL");
  EXPECT(dp_precision_parse(NULL, &pr), DP_ERR_INVALID, "dp_precision_parse: name is NULL");
  ck_assert_int_eq(pr, DP_PRECISION_BF16);
  EXPECT(dp_precision_parse("fp16", &pr), DP_ERR_INVALID, "unknown precision 'fp16'");
  ck_assert_int_eq(pr, DP_PRECISION_BF16);
}
END_TEST

/* Messages that name what is wrong (an outside check, session 24). */
START_TEST(builder_and_option_messages_name_the_fault) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_new(4, &m), DP_OK);
  ck_assert_int_eq(dp_model_add_linear(m, 3, 1), DP_OK);
  EXPECT(dp_model_set_loss(m, DP_LOSS_NONE), DP_ERR_INVALID, "DP_LOSS_NONE is no loss 0");
  EXPECT(dp_model_set_loss(m, (dp_loss_kind)7), DP_ERR_INVALID, "unknown loss 7");
  dp_model_free(m);
  ck_assert_int_eq(dp_model_parse("input tokens 4\nembed 5 8\nlinear 24\n", "t", &m),
                   DP_OK);
  for (int h = -2; h <= 0; h++)
    EXPECT(dp_model_add_attention(m, h), DP_ERR_INVALID,
           "the number of heads must be 1 or more");
  ck_assert_int_eq(dp_model_add_attention(m, 2), DP_OK);
  dp_model_free(m);
  const char *name;
  EXPECT(dp_backend_option_info(DP_BACKEND_CPU, -1, &name, NULL, NULL), DP_ERR_RANGE,
         "no option -1: the cpu backend has 1 option (from 0)");
  EXPECT(dp_backend_option_info(DP_BACKEND_CPU, 1, &name, NULL, NULL), DP_ERR_RANGE,
         "no option 1: the cpu backend has 1 option (from 0)");
}
END_TEST

START_TEST(config_default_of_null_is_a_no_op) {
  /* Found by these cases: dp_config_default(NULL) wrote through NULL (fixed in
   * lib/core/plan.c). */
  dp_config_default(NULL);
}
END_TEST

START_TEST(plan_functions_take_null) {
  dp_model *m = model_of(SEED_SPEC);
  dp_config c = config_of(4, 2, DP_OPT_SGD);
  dp_plan *p = (dp_plan *)(uintptr_t)1;
  EXPECT(dp_plan_create(NULL, &c, &p), DP_ERR_INVALID, "required");
  ck_assert_ptr_null(p);
  p = (dp_plan *)(uintptr_t)1;
  EXPECT(dp_plan_create(m, NULL, &p), DP_ERR_INVALID, "required");
  ck_assert_ptr_null(p);
  EXPECT(dp_plan_create(m, &c, NULL), DP_ERR_INVALID, "NULL");
  dp_plan_free(NULL);
  int best = -7;
  EXPECT(dp_plan_max_batch(NULL, &c, 1 << 20, 8, &best), DP_ERR_INVALID, "NULL");
  EXPECT(dp_plan_max_batch(m, NULL, 1 << 20, 8, &best), DP_ERR_INVALID, "NULL");
  EXPECT(dp_plan_max_batch(m, &c, 1 << 20, 8, NULL), DP_ERR_INVALID, "NULL");
  ck_assert_int_eq(dp_plan_n_devices(NULL), 0);
  ck_assert_int_eq(dp_plan_device_rows(NULL, 0), 0);
  ck_assert_int_eq(dp_plan_device_micro_batches(NULL, 0), 0);
  ck_assert_uint_eq(dp_plan_device_bytes(NULL, 0), 0);
  dp_region_info ri = dp_plan_region(NULL, 0, DP_REGION_PARAMS);
  ck_assert(ri.offset == 0 && ri.size == 0 && ri.align == 0);
  ck_assert_uint_eq(dp_plan_host_bytes(NULL), 0);
  ck_assert_ptr_null(dp_plan_config(NULL));
  ck_assert_ptr_null(dp_plan_model(NULL));
  ck_assert_int_eq(dp_plan_n_ops(NULL), 0);
  ck_assert_ptr_null(dp_plan_ops(NULL));
  /* names of values outside their enums */
  ck_assert_str_eq(dp_region_name((dp_region)DP_REGION_COUNT), "?");
  ck_assert_str_eq(dp_region_name((dp_region)-1), "?");
  ck_assert_str_eq(dp_phase_name((dp_phase)DP_PHASE_COUNT), "?");
  ck_assert_str_eq(dp_phase_name((dp_phase)-1), "?");
  ck_assert_str_eq(dp_op_kind_name((dp_op_kind)1000), "?");
  ck_assert_ptr_nonnull(dp_status_name((dp_status)-1));
  ck_assert_ptr_nonnull(dp_status_name((dp_status)1000));
  ck_assert_ptr_nonnull(dp_last_error());
  dp_model_free(m);
}
END_TEST

START_TEST(context_functions_take_null) {
  dp_config cfg = config_of(4, 2, DP_OPT_SGD);
  dp_config_set_optimizer(&cfg, DP_OPT_MOMENTUM);
  rig r;
  rig_open(&r, SEED_SPEC, &cfg);
  float x[4 * 5] = {0}, t[4 * 2] = {0}, y[4 * 2], buf[12];
  ck_assert_int_eq(dp_train_step(r.c, 4, 5, x, t, NULL), DP_OK); /* loss NULL is allowed */
  ctx_snap before;
  ctx_snap_take(&before, r.c);

  dp_ctx *c = (dp_ctx *)(uintptr_t)1;
  EXPECT(dp_ctx_create(NULL, &c), DP_ERR_INVALID, "NULL");
  ck_assert_ptr_null(c);
  EXPECT(dp_ctx_create(r.p, NULL), DP_ERR_INVALID, "NULL");
  void *arenas[DP_MAX_DEVICES] = {0};
  c = (dp_ctx *)(uintptr_t)1;
  EXPECT(dp_ctx_create_static(r.p, NULL, NULL, &c), DP_ERR_INVALID, "NULL");
  ck_assert_ptr_null(c);
  EXPECT(dp_ctx_create_static(r.p, arenas, NULL, &c), DP_ERR_INVALID, "NULL");
  REFUSED(dp_ctx_create_static(NULL, arenas, NULL, &c));
  REFUSED(dp_ctx_create_static(r.p, arenas, NULL, NULL));
  dp_ctx_free(NULL);
  ck_assert_ptr_nonnull(dp_ctx_error(NULL));

  EXPECT(dp_train_step(NULL, 4, 5, x, t, NULL), DP_ERR_INVALID, "NULL");
  EXPECT(dp_train_step(r.c, 4, 5, NULL, t, NULL), DP_ERR_INVALID, "NULL");
  EXPECT(dp_train_step(r.c, 4, 5, x, NULL, NULL), DP_ERR_INVALID, "NULL");
  EXPECT(dp_forward(NULL, 4, 5, x, y), DP_ERR_INVALID, "NULL");
  EXPECT(dp_forward(r.c, 4, 5, NULL, y), DP_ERR_INVALID, "NULL");
  EXPECT(dp_forward(r.c, 4, 5, x, NULL), DP_ERR_INVALID, "NULL");
  EXPECT(dp_get_params(NULL, buf, r.np), DP_ERR_INVALID, "NULL");
  EXPECT(dp_get_params(r.c, NULL, r.np), DP_ERR_INVALID, "NULL");
  EXPECT(dp_set_params(NULL, buf, r.np), DP_ERR_INVALID, "NULL");
  EXPECT(dp_set_params(r.c, NULL, r.np), DP_ERR_INVALID, "NULL");
  EXPECT(dp_get_grads(NULL, buf, r.np), DP_ERR_INVALID, "NULL");
  EXPECT(dp_get_grads(r.c, NULL, r.np), DP_ERR_INVALID, "NULL");
  ck_assert_uint_eq(dp_ctx_step(NULL), 0);
  REFUSED(dp_ckpt_save(NULL, "/tmp/never-written.ckpt"));
  REFUSED(dp_ckpt_save(r.c, NULL));
  REFUSED(dp_ckpt_save(r.c, ""));
  REFUSED(dp_ckpt_load(NULL, "/tmp/never-read.ckpt"));
  REFUSED(dp_ckpt_load(r.c, NULL));
  REFUSED(dp_ckpt_load(r.c, ""));
  ck_assert_uint_eq(dp_ctx_high_water(NULL, 0), 0);
  ck_assert_uint_eq(dp_params_hash(NULL), 0);
  ck_assert_uint_eq(dp_ctx_skipped_steps(NULL), 0);
  REFUSED(dp_ctx_check_guards(NULL));
  ck_assert_ptr_nonnull(dp_ctx_error(r.c));
  ck_assert_msg(dp_ctx_error(r.c)[0] != '\0', "the context kept no error text");

  ctx_snap_check(&before, r.c, "NULL arguments");
  ctx_snap_free(&before);
  /* and it still works */
  ck_assert_int_eq(dp_train_step(r.c, 4, 5, x, t, NULL), DP_OK);
  ck_assert_int_eq(dp_forward(r.c, 4, 5, x, y), DP_OK);
  rig_close(&r);
}
END_TEST

START_TEST(cli_and_data_functions_take_null) {
  char err[256];
  size_t size = 77;
  ck_assert_int_eq(dpt_parse_size(NULL, &size, err, sizeof err), -1);
  ck_assert_uint_eq(size, 77);
  int v = 5;
  ck_assert_int_eq(dpt_parse_int(NULL, 0, 10, "--x", &v, err, sizeof err), -1);
  ck_assert_int_eq(dpt_parse_int("3", 0, 10, "--x", &v, NULL, 0),
                   0); /* no message buffer */
  ck_assert_int_eq(dpt_parse_int("x", 0, 10, "--x", &v, NULL, 0), -1);
  float f = 1.0f;
  ck_assert_int_eq(dpt_parse_float(NULL, 0, 1, "--x", &f, err, sizeof err), -1);
  uint64_t u = 1;
  ck_assert_int_eq(dpt_parse_u64(NULL, "--x", &u, err, sizeof err), -1);
  int n = 0, ids[DP_MAX_DEVICES];
  ck_assert_int_eq(dpt_parse_devices(NULL, &n, ids, err, sizeof err), -1);
  dp_mode mode;
  ck_assert_int_eq(dpt_parse_mode(NULL, &mode, err, sizeof err), -1);
  dp_optimizer opt;
  ck_assert_int_eq(dpt_parse_optimizer(NULL, &opt, err, sizeof err), -1);
  dp_split split;
  ck_assert_int_eq(dpt_parse_split(NULL, &split, err, sizeof err), -1);
  dp_backend be;
  ck_assert_int_eq(dpt_parse_backend(NULL, &be, err, sizeof err), -1);
  ck_assert_int_eq(dpt_given(NULL, DPT_OPT_BATCH), 0);

  dpt_dataset d;
  ck_assert_int_eq(dpt_csv_load(NULL, &d, err, sizeof err), DP_ERR_INVALID);
  ck_assert_int_eq(dpt_csv_load("data/digits.csv", NULL, err, sizeof err), DP_ERR_INVALID);
  ck_assert_int_eq(dpt_csv_load(NULL, NULL, NULL, 0), DP_ERR_INVALID);
  ck_assert_int_eq(dpt_csv_load_regression(NULL, 1, &d, err, sizeof err), DP_ERR_INVALID);
  ck_assert_int_eq(dpt_csv_load_regression("x.csv", 0, NULL, NULL, 0), DP_ERR_INVALID);
  dpt_dataset_free(NULL);
  dpt_standardize(NULL, NULL);
  dpt_epoch_order(10, 1, 0, NULL);
  dpt_dataset a = {0}, b, c;
  ck_assert_int_eq(dpt_dataset_split(NULL, 0.2, 1, &b, &c, err, sizeof err),
                   DP_ERR_INVALID);
  ck_assert_int_eq(dpt_dataset_split(&a, 0.2, 1, NULL, &c, err, sizeof err),
                   DP_ERR_INVALID);
  ck_assert_int_eq(dpt_dataset_split(&a, 0.2, 1, &b, NULL, err, sizeof err),
                   DP_ERR_INVALID);
}
END_TEST

/* ==== sizes ========================================================================== */

START_TEST(overflowing_dimensions_are_overflow) {
  /* parameter count: just under 2^62 per layer, the fifth one wraps */
  dp_model *m = (dp_model *)(uintptr_t)1;
  EXPECT(dp_model_parse("input 2147483647\nlinear 2147483647\nlinear 2147483647\n"
                        "linear 2147483647\nlinear 2147483647\nlinear 2147483647\n",
                        "big.dpm", &m),
         DP_ERR_OVERFLOW, "big.dpm:6:1: parameter count overflows");
  ck_assert_ptr_null(m);
  dp_model *b;
  ck_assert_int_eq(dp_model_new(INT_MAX, &b), DP_OK);
  ck_assert_int_eq(dp_model_add_linear(b, INT_MAX, 1), DP_OK);
  ck_assert_int_eq(dp_model_add_linear(b, INT_MAX, 1), DP_OK);
  ck_assert_int_eq(dp_model_add_linear(b, INT_MAX, 1), DP_OK);
  ck_assert_int_eq(dp_model_add_linear(b, INT_MAX, 1), DP_OK);
  size_t before = dp_model_n_params(b);
  EXPECT(dp_model_add_linear(b, INT_MAX, 1), DP_ERR_OVERFLOW, "overflows");
  ck_assert_int_eq(dp_model_n_layers(b), 4); /* the refused layer is not there */
  ck_assert_uint_eq(dp_model_n_params(b), before);
  dp_model_free(b);

  /* plan bytes: (2^31-1)^2 parameters * 4 bytes, and batch * width * 4 */
  dp_model *wide = model_of(WIDE_SPEC);
  dp_plan *p = (dp_plan *)(uintptr_t)1;
  dp_config c = config_of(1, 1, DP_OPT_SGD);
  EXPECT(dp_plan_create(wide, &c, &p), DP_ERR_OVERFLOW, "overflow");
  ck_assert_ptr_null(p);
  c = config_of(INT_MAX, 64, DP_OPT_SGD);
  EXPECT(dp_plan_create(wide, &c, &p), DP_ERR_OVERFLOW, "overflow");
  c.inference = 1;
  EXPECT(dp_plan_create(wide, &c, &p), DP_ERR_OVERFLOW, "overflow");
  /* what does not fit in size_t does not fit any budget */
  int best = -1;
  c = config_of(1, 2, DP_OPT_SGD);
  ck_assert_int_eq(dp_plan_max_batch(wide, &c, SIZE_MAX, 1000, &best), DP_OK);
  ck_assert_int_eq(best, 0);
  dp_model_free(wide);

  /* no parameters: the bytes of a batch alone, (2^31-1)^2 * 4 */
  dp_model *act = model_of("input 2147483647\nrelu\n");
  c = config_of(INT_MAX, 1, DP_OPT_SGD);
  c.inference = 1;
  EXPECT(dp_plan_create(act, &c, &p), DP_ERR_OVERFLOW, "overflow");
  dp_model_free(act);
}
END_TEST

START_TEST(zero_width_layers_are_refused_with_line_and_column) {
  dp_model *m = (dp_model *)(uintptr_t)1;
  EXPECT(dp_model_parse("input 3\nlinear 0\n", "z.dpm", &m), DP_ERR_PARSE,
         "z.dpm:2:8: linear: width 0 is out of range (1..2147483647)");
  ck_assert_ptr_null(m);
  EXPECT(dp_model_parse("input 0\n", "z.dpm", &m), DP_ERR_PARSE,
         "z.dpm:1:7: input: width 0");
  EXPECT(dp_model_parse("input 3\n  linear 000\n", "z.dpm", &m), DP_ERR_PARSE,
         "z.dpm:2:10: linear: width 000 is out of range");
  EXPECT(dp_model_parse("input 3\nlinear -2\n", "z.dpm", &m), DP_ERR_PARSE,
         "z.dpm:2:8: linear: expected a positive integer, got '-2'");
  EXPECT(dp_model_parse("input 3\nlinear 2147483648\n", "z.dpm", &m), DP_ERR_PARSE,
         "z.dpm:2:8: linear: width '2147483648' is too large (max 2147483647)");
  /* issue 12: an over-long width is too large, not "expected a positive integer" */
  EXPECT(
      dp_model_parse("input 3\nlinear 99999999999999999999999999999999999\n", "z.dpm", &m),
      DP_ERR_PARSE,
      "z.dpm:2:8: linear: width '99999999999999999999999999999999999' is too large (max "
      "2147483647)");
  dp_model *b;
  EXPECT(dp_model_new(0, &b), DP_ERR_INVALID, "positive");
  EXPECT(dp_model_new(INT_MIN, &b), DP_ERR_INVALID, "positive");
  ck_assert_int_eq(dp_model_new(3, &b), DP_OK);
  EXPECT(dp_model_add_linear(b, 0, 1), DP_ERR_INVALID, "positive");
  EXPECT(dp_model_add_linear(b, INT_MIN, 0), DP_ERR_INVALID, "positive");
  EXPECT(dp_model_add(b, (dp_layer_kind)-1), DP_ERR_INVALID, "dp_model_add");
  EXPECT(dp_model_add(b, DP_LAYER_LINEAR), DP_ERR_INVALID, "dp_model_add");
  EXPECT(dp_model_add_dropout(b, NAN), DP_ERR_INVALID, "[0, 1)");
  EXPECT(dp_model_add_dropout(b, -0.5f), DP_ERR_INVALID, "[0, 1)");
  EXPECT(dp_model_add_dropout(b, INFINITY), DP_ERR_INVALID, "[0, 1)");
  EXPECT(dp_model_set_loss(b, DP_LOSS_MSE), DP_ERR_INVALID, "at least one layer");
  EXPECT(dp_model_set_loss(b, (dp_loss_kind)42), DP_ERR_INVALID, "unknown loss");
  ck_assert_int_eq(dp_model_n_layers(b), 0);
  dp_model_free(b);
  /* a model with no layers cannot be planned */
  dp_model *in_only = model_of("input 3\n");
  dp_config c = config_of(4, 1, DP_OPT_SGD);
  c.inference = 1;
  dp_plan *p;
  EXPECT(dp_plan_create(in_only, &c, &p), DP_ERR_INVALID, "no layers");
  dp_model_free(in_only);
}
END_TEST

/* No raw control byte in a message. */
static void no_controls(const char *msg) {
  for (const char *p = msg; *p; p++)
    ck_assert_msg((unsigned char)*p >= 0x20 && *p != 0x7f, "byte 0x%02x in '%s'",
                  (unsigned char)*p, msg);
}

/* An outside check (session 23): a spec's token, a CSV field or a tensor name
 * quoted in a message carried its escape sequences to the terminal of whoever
 * printed it (clear the screen, retitle the window). They come as \xHH. */
START_TEST(control_bytes_from_files_are_escaped_in_messages) {
  dp_model *m = NULL;
  EXPECT(
      dp_model_parse("input 4\nlinear 2\nloss mse\n\x1b[2J\x1b]0;pwned\x07\n", "e.dpm", &m),
      DP_ERR_PARSE, "e.dpm:4:1: unexpected '\\x1b[2J\\x1b]0;pwned\\x07'");
  no_controls(dp_last_error());
  EXPECT(dp_model_parse("input 4\nlinear \x1b[31m2\n", "e.dpm", &m), DP_ERR_PARSE,
         "got '\\x1b[31m2'");
  no_controls(dp_last_error());
  tmpdir t;
  tmp_make(&t, "ctl", "e.csv");
  static const char csv[] = "1,2,3\n1,\x1b]0;pwned\x07,3\n";
  file_write(t.path, csv, sizeof csv - 1);
  dpt_dataset d;
  char err[512] = "";
  ck_assert_int_eq(dpt_csv_load(t.path, &d, err, sizeof err), DP_ERR_PARSE);
  ck_assert_msg(strstr(err, "got \"\\x1b]0;pwned\\x07\""), "%s", err);
  no_controls(err);
  tmp_done(&t);
}
END_TEST

START_TEST(device_counts_out_of_range_are_refused) {
  dp_model *m = model_of(SEED_SPEC);
  static const int bad[] = {0, -1, DP_MAX_DEVICES + 1, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    dp_config c = config_of(8, bad[i], DP_OPT_SGD);
    dp_plan *p = (dp_plan *)(uintptr_t)1;
    EXPECT(dp_plan_create(m, &c, &p), DP_ERR_INVALID, "device count");
    ck_assert_ptr_null(p);
    int best = -1;
    EXPECT(dp_plan_max_batch(m, &c, SIZE_MAX, 8, &best), DP_ERR_INVALID, "device count");
  }
  dp_config c = config_of(DP_MAX_DEVICES, DP_MAX_DEVICES, DP_OPT_SGD);
  dp_plan *p;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_OK);
  ck_assert_int_eq(dp_plan_n_devices(p), DP_MAX_DEVICES);
  dp_plan_free(p);
  /* other enums out of range */
  c = config_of(8, 2, DP_OPT_SGD);
  c.split = (dp_split)9;
  REFUSED(dp_plan_create(m, &c, &p));
  c = config_of(8, 2, DP_OPT_SGD);
  c.mode = (dp_mode)-3;
  REFUSED(dp_plan_create(m, &c, &p));
  c = config_of(8, 2, DP_OPT_SGD);
  dp_config_set_optimizer(&c, (dp_optimizer)7);
  REFUSED(dp_plan_create(m, &c, &p));
  c = config_of(8, 2, DP_OPT_SGD);
  c.backend = (dp_backend)7;
  REFUSED(dp_plan_create(m, &c, &p));
  c = config_of(8, 2, DP_OPT_SGD);
  c.lr = NAN;
  REFUSED(dp_plan_create(m, &c, &p));
  c.lr = -INFINITY;
  REFUSED(dp_plan_create(m, &c, &p));
  c = config_of(0, 2, DP_OPT_SGD);
  EXPECT(dp_plan_create(m, &c, &p), DP_ERR_INVALID, "batch");
  c = config_of(INT_MIN, 2, DP_OPT_SGD);
  EXPECT(dp_plan_create(m, &c, &p), DP_ERR_INVALID, "batch");
  c = config_of(8, 2, DP_OPT_SGD);
  c.micro_batch = -1;
  EXPECT(dp_plan_create(m, &c, &p), DP_ERR_INVALID, "micro-batch");
  dp_model_free(m);
}
END_TEST

START_TEST(more_devices_than_rows_uses_fewer_and_says_so) {
  dp_model *m = model_of(SEED_SPEC);
  dp_config c = config_of(3, 8, DP_OPT_SGD);
  dp_plan *p;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_OK);
  ck_assert_int_eq(dp_plan_n_devices(p), 3);
  for (int d = 0; d < 3; d++) ck_assert_int_eq(dp_plan_device_rows(p, d), 1);
  ck_assert_int_eq(dp_plan_device_rows(p, 3), 0);
  ck_assert_uint_eq(dp_plan_device_bytes(p, 7), 0);
  /* `dp plan` says so */
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  ck_assert_ptr_nonnull(f);
  dpt_print_plan(f, p);
  fclose(f);
  ck_assert_msg(strstr(text, "only 3 of 8 devices get rows") != NULL,
                "dp plan printed:\n%s", text);
  free(text);
  /* and it trains and infers, on the 3 devices */
  dp_ctx *ctx;
  ck_assert_int_eq(dp_ctx_create(p, &ctx), DP_OK);
  float x[15] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, t[6] = {0}, y[6], loss;
  ck_assert_int_eq(dp_train_step(ctx, 3, 5, x, t, &loss), DP_OK);
  ck_assert(isfinite(loss));
  ck_assert_int_eq(dp_forward(ctx, 1, 5, x, y), DP_OK); /* one row: devices 1, 2 idle */
  ck_assert_int_eq(dp_forward(ctx, 3, 5, x, y), DP_OK);
  dp_ctx_free(ctx);
  dp_plan_free(p);
  /* torch.chunk: B=6 on 4 devices is 2+2+2 */
  c = config_of(6, 4, DP_OPT_SGD);
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_OK);
  ck_assert_int_eq(dp_plan_n_devices(p), 3);
  dp_plan_free(p);
  /* one row on the most devices */
  c = config_of(1, DP_MAX_DEVICES, DP_OPT_SGD);
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_OK);
  ck_assert_int_eq(dp_plan_n_devices(p), 1);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(absurd_budgets) {
  dp_model *m = model_of(SEED_SPEC);
  dp_config c = config_of(1, 2, DP_OPT_SGD);
  int best = -1;
  ck_assert_int_eq(dp_plan_max_batch(m, &c, 0, 1 << 20, &best), DP_OK);
  ck_assert_int_eq(best, 0);
  ck_assert_int_eq(dp_plan_max_batch(m, &c, 1, 1 << 20, &best), DP_OK);
  ck_assert_int_eq(best, 0);
  ck_assert_int_eq(dp_plan_max_batch(m, &c, SIZE_MAX, 1 << 20, &best), DP_OK);
  ck_assert_int_eq(best, 1 << 20);
  best = -1;
  EXPECT(dp_plan_max_batch(m, &c, SIZE_MAX, 0, &best), DP_ERR_INVALID, "max_batch");
  EXPECT(dp_plan_max_batch(m, &c, SIZE_MAX, INT_MIN, &best), DP_ERR_INVALID, "max_batch");
  /* the size parser at its limits */
  char err[256];
  size_t v = 0;
  ck_assert_int_eq(dpt_parse_size("18446744073709551615", &v, err, sizeof err), 0);
  ck_assert_uint_eq(v, SIZE_MAX);
  ck_assert_int_eq(dpt_parse_size("18446744073709551616", &v, err, sizeof err), -1);
  ck_assert_int_eq(dpt_parse_size("99999999999999999999999999PiB", &v, err, sizeof err),
                   -1);
  ck_assert_int_eq(dpt_parse_size("16384PiB", &v, err, sizeof err), -1); /* 2^64 */
  ck_assert_int_eq(dpt_parse_size("16383.999PiB", &v, err, sizeof err), 0);
  ck_assert_int_eq(dpt_parse_size("0", &v, err, sizeof err), 0);
  ck_assert_uint_eq(v, 0);
  dp_model_free(m);
}
END_TEST

START_TEST(max_batch_search_up_to_int_max) {
  /* Found by these cases: dp_plan_max_batch computed lo + (hi - lo + 1) / 2
   * in int, which overflows when max_batch is INT_MAX (UBSan: signed integer
   * overflow); the search then planned a negative batch and returned
   * DP_ERR_INVALID (fixed in lib/core/plan.c). Every batch of this model fits
   * SIZE_MAX. */
  dp_model *m = model_of(SEED_SPEC);
  dp_config c = config_of(1, 2, DP_OPT_SGD);
  int best = -1;
  dp_status s = dp_plan_max_batch(m, &c, SIZE_MAX, INT_MAX, &best);
  ck_assert_msg(s == DP_OK, "%s: %s", dp_status_name(s), dp_last_error());
  ck_assert_int_eq(best, INT_MAX);
  ck_assert_int_eq(dp_plan_max_batch(m, &c, 0, INT_MAX, &best), DP_OK);
  ck_assert_int_eq(best, 0);
  dp_model_free(m);
}
END_TEST

START_TEST(huge_micro_batch_counts_are_refused_cleanly) {
  /* 2^31-1 micro-batches of one row: a plan would hold billions of ops. The
   * planner refuses before allocating anything for them. */
  dp_model *m = model_of(SEED_SPEC);
  dp_config c = config_of(INT_MAX, 2, DP_OPT_SGD);
  c.micro_batch = 1;
  dp_plan *p = (dp_plan *)(uintptr_t)1;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_ERR_OVERFLOW);
  ck_assert_ptr_null(p);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "micro-batches"));
  /* the largest count allowed still plans */
  c.batch = 1 << 22;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_OK);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(absurd_rows_cols_and_counts) {
  dp_config cfg = config_of(6, 2, DP_OPT_SGD);
  rig r;
  rig_open(&r, SEED_SPEC, &cfg);
  float x[6 * 5] = {0}, t[6 * 2] = {0}, y[6 * 2] = {0};
  float *buf = calloc(r.np + 1, sizeof *buf);
  ctx_snap before;
  ctx_snap_take(&before, r.c);
  static const int rows[] = {0, -1, 7, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    EXPECT(dp_train_step(r.c, rows[i], 5, x, t, NULL), DP_ERR_SHAPE, "rows");
    EXPECT(dp_forward(r.c, rows[i], 5, x, y), DP_ERR_SHAPE, "rows");
  }
  static const int cols[] = {-1, 0, 4, 6, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof cols / sizeof *cols; i++) {
    EXPECT(dp_train_step(r.c, 6, cols[i], x, t, NULL), DP_ERR_SHAPE, "columns");
    EXPECT(dp_forward(r.c, 6, cols[i], x, y), DP_ERR_SHAPE, "columns");
  }
  static const size_t counts[] = {0, 1, 11, 13, SIZE_MAX, SIZE_MAX / 4 + 1};
  for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
    EXPECT(dp_get_params(r.c, buf, counts[i]), DP_ERR_SHAPE, "parameters");
    EXPECT(dp_set_params(r.c, buf, counts[i]), DP_ERR_SHAPE, "parameters");
    EXPECT(dp_get_grads(r.c, buf, counts[i]), DP_ERR_SHAPE, "parameters");
  }
  ctx_snap_check(&before, r.c, "absurd arguments");
  ctx_snap_free(&before);
  ck_assert_uint_eq(dp_ctx_high_water(r.c, -1), 0);
  ck_assert_uint_eq(dp_ctx_high_water(r.c, 2), 0);
  ck_assert_uint_eq(dp_ctx_high_water(r.c, INT_MAX), 0);
  ck_assert_int_eq(dp_plan_device_rows(r.p, INT_MIN), 0);
  ck_assert_int_eq(dp_plan_device_micro_batches(r.p, INT_MAX), 0);
  dp_region_info ri = dp_plan_region(r.p, 0, DP_REGION_COUNT);
  ck_assert(ri.size == 0 && ri.offset == 0);
  ri = dp_plan_region(r.p, 0, (dp_region)-1);
  ck_assert(ri.size == 0 && ri.offset == 0);
  free(buf);
  rig_close(&r);
}
END_TEST

/* ==== values ========================================================================= */

/* For NaN, +Inf, -Inf in one input element (first row, last row), in classic
 * and allreduce mode: DP_ERR_NONFINITE naming the loss, every arena byte and
 * the step counter unchanged, and the next good step gives the same bits as
 * in a context that never saw the bad one. */
START_TEST(nonfinite_inputs_are_refused_and_change_nothing) {
  static const float bad[] = {NAN, INFINITY, -INFINITY};
  for (int mode = 0; mode < 2; mode++)
    for (int ce = 0; ce < 2; ce++) {
      dp_config cfg = config_of(8, 3, DP_OPT_SGD);
      cfg.mode = (dp_mode)mode;
      dp_config_set_optimizer(&cfg, DP_OPT_ADAMW);
      const char *spec = ce ? CE_SPEC : SEED_SPEC;
      rig a, b;
      rig_open(&a, spec, &cfg);
      rig_open(&b, spec, &cfg);
      int in = dp_model_input_width(a.m), out = dp_model_output_width(a.m);
      float x[8 * 5], tf[8 * 3];
      int32_t ti[8];
      for (int i = 0; i < 8 * in; i++) x[i] = (float)((i * 7) % 5) * 0.3f - 0.6f;
      for (int i = 0; i < 8 * out; i++) tf[i] = (float)(i % 3) - 1.0f;
      for (int r = 0; r < 8; r++) ti[r] = r % out;
      const void *t = ce ? (const void *)ti : (const void *)tf;
      ck_assert_int_eq(dp_train_step(a.c, 8, in, x, t, NULL), DP_OK);
      ck_assert_int_eq(dp_train_step(b.c, 8, in, x, t, NULL), DP_OK);
      for (size_t k = 0; k < 3; k++)
        for (int where = 0; where < 2; where++) {
          float xb[8 * 5];
          memcpy(xb, x, sizeof xb);
          xb[where ? 8 * in - 1 : 0] = bad[k];
          ctx_snap before;
          ctx_snap_take(&before, a.c);
          float loss = 123.0f;
          dp_status s = dp_train_step(a.c, 8, in, xb, t, &loss);
          ck_assert_msg(s == DP_ERR_NONFINITE, "mode %d ce %d value %g: %s (%s)", mode, ce,
                        (double)bad[k], dp_status_name(s), dp_last_error());
          ck_assert_msg(strstr(dp_ctx_error(a.c), "loss") != NULL, "message: %s",
                        dp_ctx_error(a.c));
          ck_assert_msg(loss == 123.0f, "the loss output was written on a refused step");
          char what[64];
          snprintf(what, sizeof what, "mode %d, ce %d, x = %g", mode, ce, (double)bad[k]);
          snap_check_state(&before, a.c, what);
          ctx_snap_free(&before);
        }
      /* non-finite mse targets too */
      if (!ce) {
        float tb[8 * 3];
        memcpy(tb, tf, sizeof tb);
        tb[3] = NAN;
        ctx_snap before;
        ctx_snap_take(&before, a.c);
        ck_assert_int_eq(dp_train_step(a.c, 8, in, x, tb, NULL), DP_ERR_NONFINITE);
        snap_check_state(&before, a.c, "non-finite target");
        ctx_snap_free(&before);
      }
      ck_assert_int_eq(dp_train_step(a.c, 8, in, x, t, NULL), DP_OK);
      ck_assert_int_eq(dp_train_step(b.c, 8, in, x, t, NULL), DP_OK);
      ck_assert_msg(dp_params_hash(a.c) == dp_params_hash(b.c),
                    "mode %d ce %d: refused steps changed what came after", mode, ce);
      rig_close(&a);
      rig_close(&b);
    }
}
END_TEST

START_TEST(labels_out_of_range_are_refused) {
  dp_config cfg = config_of(4, 2, DP_OPT_SGD);
  rig r;
  rig_open(&r, CE_SPEC, &cfg);
  float x[4 * 4] = {0};
  static const int32_t bad[] = {-1, 3, 4, INT32_MAX, INT32_MIN};
  ctx_snap before;
  ctx_snap_take(&before, r.c);
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
    for (int row = 0; row < 4; row += 3) {
      int32_t t[4] = {0, 1, 2, 0};
      t[row] = bad[k];
      char want[64];
      snprintf(want, sizeof want, "label %d of row %d", (int)bad[k], row);
      EXPECT(dp_train_step(r.c, 4, 4, x, t, NULL), DP_ERR_RANGE, want);
    }
  /* a label beyond the rows of this step is not read */
  int32_t t[4] = {0, 1, 2, -5};
  ck_assert_int_eq(dp_train_step(r.c, 3, 4, x, t, NULL), DP_OK);
  before.step++;
  ck_assert_uint_eq(dp_ctx_step(r.c), before.step);
  ctx_snap_free(&before);
  rig_close(&r);
}
END_TEST

/* Token ids (floats holding integers 0 .. V-1) and per-position labels:
 * out-of-range, negative, non-integer and non-finite ids in dp_train_step and
 * dp_forward, and labels >= V at some position, are refused with DP_ERR_RANGE
 * before anything changes. */
START_TEST(bad_token_ids_and_labels_are_refused_and_change_nothing) {
  enum { R = 5 };
  /* nextafterf(V - 1, V): printed with %g it read as V - 1, an id in range */
  const float bad[] = {
      GPT_V, GPT_V + 7, -1.0f, 2.5f,
      NAN,   INFINITY,  1e30f, nextafterf((float)(GPT_V - 1), (float)GPT_V)};
  for (int mode = 0; mode < 2; mode++) {
    dp_config cfg = config_of(R, 2, DP_OPT_ADAMW);
    cfg.mode = (dp_mode)mode;
    rig r;
    rig_open(&r, GPT_SPEC, &cfg);
    ck_assert_int_eq(dp_model_input_width(r.m), GPT_T);
    ck_assert_int_eq(dp_model_target_width(r.m), GPT_T);
    float x[R * GPT_T], y[R * GPT_T * GPT_V];
    int32_t t[R * GPT_T];
    for (int i = 0; i < R * GPT_T; i++) {
      x[i] = (float)((i * 5) % GPT_V);
      t[i] = (i * 3) % GPT_V;
    }
    ck_assert_int_eq(dp_train_step(r.c, R, GPT_T, x, t, NULL), DP_OK);
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
      for (int where = 0; where < 3; where++) {
        float xb[R * GPT_T];
        memcpy(xb, x, sizeof xb);
        xb[where == 0 ? 0 : where == 1 ? 7 : R * GPT_T - 1] = bad[k];
        ctx_snap before;
        ctx_snap_take(&before, r.c);
        float loss = 123.0f;
        dp_status s = dp_train_step(r.c, R, GPT_T, xb, t, &loss);
        ck_assert_msg(s == DP_ERR_RANGE, "mode %d id %g: %s (%s)", mode, (double)bad[k],
                      dp_status_name(s), dp_last_error());
        char shown[48];
        snprintf(shown, sizeof shown, "token %.9g at position", (double)bad[k]);
        ck_assert_msg(strstr(dp_last_error(), shown), "'%s' not in %s", shown,
                      dp_last_error());
        ck_assert_msg(loss == 123.0f, "the loss output was written on a refused step");
        for (int i = 0; i < R * GPT_T * GPT_V; i++) y[i] = 7.0f;
        s = dp_forward(r.c, R, GPT_T, xb, y);
        ck_assert_msg(s == DP_ERR_RANGE, "forward, mode %d id %g: %s (%s)", mode,
                      (double)bad[k], dp_status_name(s), dp_last_error());
        char what[64];
        snprintf(what, sizeof what, "mode %d, id %g at %d", mode, (double)bad[k], where);
        snap_check_state(&before, r.c, what);
        ctx_snap_free(&before);
      }
    static const int32_t bad_labels[] = {GPT_V, -1, INT32_MAX};
    for (size_t k = 0; k < 3; k++)
      for (int at = 1; at < R * GPT_T; at += 13) {
        int32_t tb[R * GPT_T];
        memcpy(tb, t, sizeof tb);
        tb[at] = bad_labels[k];
        ctx_snap before;
        ctx_snap_take(&before, r.c);
        dp_status s = dp_train_step(r.c, R, GPT_T, x, tb, NULL);
        ck_assert_msg(s == DP_ERR_RANGE, "label %d at %d: %s (%s)", (int)bad_labels[k], at,
                      dp_status_name(s), dp_last_error());
        snap_check_state(&before, r.c, "bad label");
        ctx_snap_free(&before);
      }
    ck_assert_int_eq(dp_train_step(r.c, R, GPT_T, x, t, NULL), DP_OK);
    ck_assert_int_eq(dp_forward(r.c, R, GPT_T, x, y), DP_OK);
    rig_close(&r);
  }
}
END_TEST

START_TEST(set_params_with_nonfinite_values_is_refused) {
  dp_config cfg = config_of(4, 2, DP_OPT_SGD);
  rig r;
  rig_open(&r, CE_SPEC, &cfg);
  float *p0 = malloc(r.np * sizeof *p0), *p = malloc(r.np * sizeof *p);
  float *got = malloc(r.np * sizeof *got);
  ck_assert(p0 && p && got);
  ck_assert_int_eq(dp_get_params(r.c, p0, r.np), DP_OK);
  static const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
  size_t at[] = {0, r.np / 2, r.np - 1};
  for (size_t k = 0; k < 4; k++)
    for (size_t j = 0; j < 3; j++) {
      memcpy(p, p0, r.np * sizeof *p);
      for (size_t i = 0; i < r.np; i++) p[i] = 0.5f; /* all valid but one */
      p[at[j]] = bad[k];
      char want[64];
      snprintf(want, sizeof want, "parameter %zu is not finite", at[j]);
      EXPECT(dp_set_params(r.c, p, r.np), DP_ERR_NONFINITE, want);
      ck_assert_int_eq(dp_get_params(r.c, got, r.np), DP_OK);
      ck_assert_msg(memcmp(got, p0, r.np * sizeof *got) == 0,
                    "a refused set wrote parameters");
    }
  /* the largest finite values are parameters; a step on them may overflow,
   * which is refused the same way */
  for (size_t i = 0; i < r.np; i++) p[i] = (i % 2) ? FLT_MAX : -FLT_MAX;
  ck_assert_int_eq(dp_set_params(r.c, p, r.np), DP_OK);
  float x[16];
  for (int i = 0; i < 16; i++) x[i] = 1.0f;
  int32_t t[4] = {0, 1, 2, 1};
  uint64_t h = dp_params_hash(r.c);
  dp_status s = dp_train_step(r.c, 4, 4, x, t, NULL);
  ck_assert_msg(s == DP_OK || s == DP_ERR_NONFINITE, "%s", dp_status_name(s));
  if (s) ck_assert_msg(dp_params_hash(r.c) == h, "a refused step changed the parameters");
  free(p0);
  free(p);
  free(got);
  rig_close(&r);
}
END_TEST

/* ==== checkpoint ===================================================================== */

/* The four fixture contexts (every optimizer-state layout) and a real
 * checkpoint of each, made after 2 steps. */
typedef struct {
  fixture fx[FIXTURE_N];
  unsigned char *file[FIXTURE_N];
  size_t len[FIXTURE_N];
  tmpdir t;
} ckpt_rig;

static void ckpt_open(ckpt_rig *k) {
  tmp_make(&k->t, "dp_hostile", NULL);
  for (int i = 0; i < FIXTURE_N; i++) {
    ck_assert_msg(fixture_make(i, FIXTURE_MODEL, &k->fx[i]) == DP_OK, "fixture %d: %s", i,
                  dp_last_error());
    ck_assert_int_eq(fixture_train(&k->fx[i], 2), DP_OK);
    char name[32];
    snprintf(name, sizeof name, "good%d.ckpt", i);
    const char *path = tmp_path(&k->t, name);
    ck_assert_msg(dp_ckpt_save(k->fx[i].ctx, path) == DP_OK, "%s",
                  dp_ctx_error(k->fx[i].ctx));
    k->file[i] = file_read(path, &k->len[i]);
    ck_assert_msg(dp_ckpt_load(k->fx[i].ctx, path) == DP_OK, "%s",
                  dp_ctx_error(k->fx[i].ctx));
  }
}

static void ckpt_close(ckpt_rig *k) {
  for (int i = 0; i < FIXTURE_N; i++) {
    fixture_free(&k->fx[i]);
    free(k->file[i]);
  }
  tmp_done(&k->t);
}

/* Loading `path` into every fixture is refused with a message; nothing changes. */
static void refused_everywhere(ckpt_rig *k, const char *path, const char *what) {
  for (int i = 0; i < FIXTURE_N; i++) {
    ctx_snap before;
    ctx_snap_take(&before, k->fx[i].ctx);
    dp_status s = dp_ckpt_load(k->fx[i].ctx, path);
    ck_assert_msg(s != DP_OK, "%s: fixture %d accepted it", what, i);
    ck_assert_msg(dp_ctx_error(k->fx[i].ctx)[0] != '\0', "%s: no message", what);
    ctx_snap_check(&before, k->fx[i].ctx, what);
    ctx_snap_free(&before);
  }
}

START_TEST(damaged_checkpoints_are_refused_into_every_layout) {
  ckpt_rig k;
  ckpt_open(&k);
  const char *path = tmp_path(&k.t, "damaged.ckpt");
  for (int i = 0; i < FIXTURE_N; i++) {
    char what[64];
    for (size_t n = 0; n < k.len[i]; n++) { /* every truncation */
      FILE *f = fopen(path, "wb");
      ck_assert_uint_eq(fwrite(k.file[i], 1, n, f), n);
      fclose(f);
      snprintf(what, sizeof what, "checkpoint %d cut to %zu bytes", i, n);
      refused_everywhere(&k, path, what);
    }
    for (size_t b = 0; b < k.len[i]; b++) { /* a flipped bit in every byte */
      k.file[i][b] ^= (unsigned char)(1u << (b % 8));
      FILE *f = fopen(path, "wb");
      ck_assert_uint_eq(fwrite(k.file[i], 1, k.len[i], f), k.len[i]);
      fclose(f);
      k.file[i][b] ^= (unsigned char)(1u << (b % 8));
      snprintf(what, sizeof what, "checkpoint %d, bit %zu flipped", i, b * 8 + b % 8);
      refused_everywhere(&k, path, what);
    }
  }
  ckpt_close(&k);
}
END_TEST

START_TEST(oversized_checkpoints_are_refused_without_reading_them) {
  ckpt_rig k;
  ckpt_open(&k);
  const char *path = tmp_path(&k.t, "big.ckpt");
  /* one trailing byte; then a megabyte */
  size_t n = k.len[0];
  unsigned char *b = calloc(n + (1 << 20), 1);
  memcpy(b, k.file[0], n);
  FILE *f = fopen(path, "wb");
  ck_assert_uint_eq(fwrite(b, 1, n + 1, f), n + 1);
  fclose(f);
  ctx_snap before;
  ctx_snap_take(&before, k.fx[0].ctx);
  EXPECT(dp_ckpt_load(k.fx[0].ctx, path), DP_ERR_PARSE, "trailing");
  ctx_snap_check(&before, k.fx[0].ctx, "a trailing byte");
  ctx_snap_free(&before);
  f = fopen(path, "wb");
  ck_assert_uint_eq(fwrite(b, 1, n + (1 << 20), f), n + (1 << 20));
  fclose(f);
  refused_everywhere(&k, path, "a megabyte of trailing zeros");
  free(b);
  /* a sparse 1 GiB file that starts with a valid checkpoint: refused from its
   * size, not read (the loader reads at most the largest checkpoint of the
   * context's model) */
  int fd = open(path, O_WRONLY | O_TRUNC);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, k.file[0], n), (ssize_t)n);
  ck_assert_int_eq(ftruncate(fd, (off_t)1 << 30), 0);
  close(fd);
  refused_everywhere(&k, path, "a 1 GiB file");
  ckpt_close(&k);
}
END_TEST

START_TEST(foreign_and_non_files_are_refused) {
  ckpt_rig k;
  ckpt_open(&k);
  /* another model's checkpoint */
  fixture other;
  ck_assert_int_eq(fixture_make(1, FIXTURE_OTHER_MODEL, &other), DP_OK);
  const char *path = tmp_path(&k.t, "other.ckpt");
  ck_assert_int_eq(dp_ckpt_save(other.ctx, path), DP_OK);
  fixture_free(&other);
  refused_everywhere(&k, path, "another model's checkpoint");
  EXPECT(dp_ckpt_load(k.fx[1].ctx, path), DP_ERR_INVALID, "model differs");
  /* a model spec, an empty file, random bytes */
  path = tmp_write(&k.t, "spec.ckpt", FIXTURE_MODEL, strlen(FIXTURE_MODEL));
  refused_everywhere(&k, path, "a model spec");
  path = tmp_write(&k.t, "empty.ckpt", "", 0);
  refused_everywhere(&k, path, "an empty file");
  unsigned char junk[4096];
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < sizeof junk; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    junk[i] = (unsigned char)(s >> 56);
  }
  path = tmp_write(&k.t, "junk.ckpt", junk, sizeof junk);
  refused_everywhere(&k, path, "random bytes");
  /* the magic and then garbage */
  memcpy(junk, k.file[0], 16);
  path = tmp_write(&k.t, "magic.ckpt", junk, sizeof junk);
  refused_everywhere(&k, path, "a header and garbage");
  /* not regular files */
  refused_everywhere(&k, k.t.dir, "a directory");
  refused_everywhere(&k, "/dev/null", "/dev/null");
  refused_everywhere(&k, "/dev/zero", "/dev/zero");
  refused_everywhere(&k, "/nonexistent/dir/x.ckpt", "a missing file");
  EXPECT(dp_ckpt_load(k.fx[0].ctx, k.t.dir), DP_ERR_IO, "not a regular file");
  /* saving into a directory that does not exist, or over a directory */
  ctx_snap before;
  ctx_snap_take(&before, k.fx[0].ctx);
  EXPECT(dp_ckpt_save(k.fx[0].ctx, "/nonexistent/dir/x.ckpt"), DP_ERR_IO, "x.ckpt");
  REFUSED(dp_ckpt_save(k.fx[0].ctx, k.t.dir));
  ctx_snap_check(&before, k.fx[0].ctx, "failed saves");
  ctx_snap_free(&before);
  ckpt_close(&k);
}
END_TEST

/* ==== files ========================================================================== */

START_TEST(csv_with_a_ten_megabyte_line) {
  tmpdir t;
  tmp_make(&t, "dp_hostile", NULL);
  size_t n = 10u << 20;
  char *b = malloc(n + 16);
  ck_assert_ptr_nonnull(b);
  /* a label and one 10 MB number: out of float range */
  memcpy(b, "1,", 2);
  memset(b + 2, '7', n);
  memcpy(b + 2 + n, "\n", 2);
  const char *path = tmp_write(&t, "long_number.csv", b, n + 3);
  dpt_dataset d;
  char err[512];
  ck_assert_int_eq(dpt_csv_load(path, &d, err, sizeof err), DP_ERR_RANGE);
  ck_assert_msg(strstr(err, ":1: field 2:") && strstr(err, "...") && strlen(err) < 200,
                "message: %s", err);
  ck_assert_ptr_null(d.x);
  /* a valid 10 MB row: 2.6 million features */
  size_t k = 0;
  b[k++] = '3';
  while (k + 2 < n) {
    char digit = (char)('0' + k % 10);
    b[k++] = ',';
    b[k++] = digit;
  }
  b[k++] = '\n';
  path = tmp_write(&t, "wide.csv", b, k);
  ck_assert_msg(dpt_csv_load(path, &d, err, sizeof err) == DP_OK, "%s", err);
  ck_assert_int_eq(d.n_rows, 1);
  ck_assert_int_eq(d.n_features, (int)(k - 2) / 2);
  ck_assert_int_eq(d.n_classes, 4);
  dpt_dataset_free(&d);
  /* a model spec with a 10 MB line */
  memcpy(b, "input 3\nlinear ", 15);
  memset(b + 15, '9', n);
  b[15 + n] = '\0';
  dp_model *m = (dp_model *)(uintptr_t)1;
  EXPECT(dp_model_parse(b, "long.dpm", &m), DP_ERR_PARSE,
         "long.dpm:2:8: linear: width '99999999999999999999999999999999...' is too large");
  ck_assert_msg(strlen(dp_last_error()) < 600, "the message holds the whole token");
  ck_assert_ptr_null(m);
  free(b);
  tmp_done(&t);
}
END_TEST

START_TEST(csv_line_over_the_limit_and_endless_files) {
  tmpdir t;
  tmp_make(&t, "dp_hostile", NULL);
  /* no newline for more than DPT_MAX_LINE bytes: refused at the limit */
  const char *path = tmp_path(&t, "endless.csv");
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ck_assert_int_ge(fd, 0);
  char chunk[65536];
  memset(chunk, '5', sizeof chunk);
  for (size_t w = 0; w < (size_t)DPT_MAX_LINE + sizeof chunk; w += sizeof chunk)
    ck_assert_int_eq(write(fd, chunk, sizeof chunk), (ssize_t)sizeof chunk);
  close(fd);
  dpt_dataset d;
  char err[512];
  ck_assert_int_eq(dpt_csv_load(path, &d, err, sizeof err), DP_ERR_PARSE);
  ck_assert_msg(strstr(err, ":1: line longer than 64 MiB") != NULL, "message: %s", err);
  ck_assert_ptr_null(d.x);
  /* devices (/dev/zero never ends, /dev/null is empty) are not regular files:
   * refused before any read, as FIFOs are (which would block) */
  ck_assert_int_eq(dpt_csv_load("/dev/zero", &d, err, sizeof err), DP_ERR_IO);
  ck_assert_str_eq(
      err, "cannot read data '/dev/zero': is a character device, not a regular file");
  ck_assert_int_eq(dpt_csv_load("/dev/null", &d, err, sizeof err), DP_ERR_IO);
  ck_assert_msg(strstr(err, "not a regular file") != NULL, "message: %s", err);
  dp_model *m;
  EXPECT(dp_model_load("/dev/zero", &m), DP_ERR_IO, "not a regular file");
  EXPECT(dp_model_load("/dev/null", &m), DP_ERR_IO, "not a regular file");
  /* model specs: the loader stops at 64 MiB */
  path = tmp_path(&t, "endless.dpm");
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ck_assert_int_ge(fd, 0);
  memset(chunk, '#', sizeof chunk);
  for (size_t w = 0; w < ((size_t)64 << 20) + sizeof chunk; w += sizeof chunk)
    ck_assert_int_eq(write(fd, chunk, sizeof chunk), (ssize_t)sizeof chunk);
  close(fd);
  EXPECT(dp_model_load(path, &m), DP_ERR_PARSE, "64 MiB");
  tmp_done(&t);
}
END_TEST

START_TEST(binary_garbage_and_directories) {
  tmpdir t;
  tmp_make(&t, "dp_hostile", NULL);
  unsigned char junk[65536];
  uint64_t s = 12345;
  for (size_t i = 0; i < sizeof junk; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    junk[i] = (unsigned char)(s >> 56);
  }
  const char *path = tmp_write(&t, "junk.bin", junk, sizeof junk);
  dpt_dataset d;
  char err[512];
  dp_status st = dpt_csv_load(path, &d, err, sizeof err);
  ck_assert_msg(st == DP_ERR_PARSE || st == DP_ERR_RANGE, "%s: %s", dp_status_name(st),
                err);
  ck_assert_msg(strncmp(err, path, strlen(path)) == 0, "message: %s", err);
  ck_assert_ptr_null(d.x);
  st = dpt_csv_load_regression(path, 2, &d, err, sizeof err);
  ck_assert_msg(st != DP_OK && d.x == NULL, "%s", err);
  /* garbage without NULs or newlines' help: printable noise */
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(33 + junk[i] % 90);
  path = tmp_write(&t, "noise.csv", junk, sizeof junk);
  ck_assert_int_ne(dpt_csv_load(path, &d, err, sizeof err), DP_OK);
  dp_model *m = (dp_model *)(uintptr_t)1;
  REFUSED(dp_model_load(path, &m));
  ck_assert_ptr_null(m);
  /* binary model spec: NUL bytes */
  path = tmp_write(&t, "nul.dpm", "input 3\n\0linear 2\n", 18);
  EXPECT(dp_model_load(path, &m), DP_ERR_PARSE, "NUL");
  /* a directory */
  ck_assert_int_eq(dpt_csv_load(t.dir, &d, err, sizeof err), DP_ERR_IO);
  ck_assert_msg(strstr(err, t.dir) && strstr(err, "directory"), "message: %s", err);
  ck_assert_ptr_null(d.x);
  REFUSED(dp_model_load(t.dir, &m));
  ck_assert_int_eq(dpt_csv_load("/nonexistent/x.csv", &d, err, sizeof err), DP_ERR_IO);
  EXPECT(dp_model_load("/nonexistent/x.dpm", &m), DP_ERR_IO, "/nonexistent/x.dpm");
  tmp_done(&t);
}
END_TEST

/* ==== regressions ==================================================================== */

START_TEST(dropout_that_rounds_to_one_is_refused_with_a_whole_message) {
  /* Found by the hostile cases: 0.99999999999 is below 1 as a double but 1 as
   * a float; the builder refused it and spec.c cut its message at the first
   * " [" ("dropout probability must be in"), taking " [0, 1)" for the
   * location suffix. Now the parser refuses it itself, and a builder message
   * is cut only at its final " [file:line]". */
  dp_model *m = (dp_model *)(uintptr_t)1;
  EXPECT(dp_model_parse("input 3\ndropout 0.99999999999\n", "r.dpm", &m), DP_ERR_PARSE,
         "r.dpm:2:9: dropout: probability '0.99999999999' rounds to 1 as a float");
  ck_assert_ptr_null(m);
  EXPECT(dp_model_parse("input 3\ndropout 0.99999998\n", "r.dpm", &m), DP_ERR_PARSE,
         "rounds to 1");
  /* the largest float below 1 is still a probability, and round-trips */
  m = model_of("input 3\ndropout 0.99999994\n");
  char buf[64];
  dp_model_format(m, buf, sizeof buf);
  ck_assert_str_eq(buf, "input 3\ndropout 0.99999994\n");
  dp_model_free(m);
  /* a builder message with a bracket keeps it: 256 layers, then one more */
  char *spec = malloc(16 + 257 * 5);
  strcpy(spec, "input 2\n");
  for (int i = 0; i < 257; i++) strcat(spec, "relu\n");
  EXPECT(dp_model_parse(spec, "r.dpm", &m), DP_ERR_PARSE,
         "r.dpm:258:1: too many layers (at most 256)");
  ck_assert_msg(strstr(dp_last_error(), "[model.c") == NULL, "builder location leaked: %s",
                dp_last_error());
  free(spec);
}
END_TEST

START_TEST(format_with_null_buffer_and_capacity_is_a_length_query) {
  /* Found by the null_args cases: dp_model_format(m, NULL, cap > 0) wrote
   * buf[0]. */
  dp_model *m = model_of("input 3\nlinear 2 nobias\nloss mse\n");
  size_t n = dp_model_format(m, NULL, 0);
  ck_assert_uint_eq(n, strlen("input 3\nlinear 2 nobias\nloss mse\n"));
  ck_assert_uint_eq(dp_model_format(m, NULL, SIZE_MAX), n);
  dp_model_free(m);
}
END_TEST

Suite *hostile_suite(void) {
  Suite *s = suite_create("hostile");
  TCase *tc = tcase_create("null_args");
  tcase_add_test(tc, model_functions_take_null);
  tcase_add_test(tc, config_default_of_null_is_a_no_op);
  tcase_add_test(tc, name_functions_take_null);
  tcase_add_test(tc, builder_and_option_messages_name_the_fault);
  tcase_add_test(tc, plan_functions_take_null);
  tcase_add_test(tc, context_functions_take_null);
  tcase_add_test(tc, cli_and_data_functions_take_null);
  suite_add_tcase(s, tc);

  tc = tcase_create("sizes");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, overflowing_dimensions_are_overflow);
  tcase_add_test(tc, zero_width_layers_are_refused_with_line_and_column);
  tcase_add_test(tc, control_bytes_from_files_are_escaped_in_messages);
  tcase_add_test(tc, device_counts_out_of_range_are_refused);
  tcase_add_test(tc, more_devices_than_rows_uses_fewer_and_says_so);
  tcase_add_test(tc, absurd_budgets);
  tcase_add_test(tc, max_batch_search_up_to_int_max);
  tcase_add_test(tc, huge_micro_batch_counts_are_refused_cleanly);
  tcase_add_test(tc, absurd_rows_cols_and_counts);
  suite_add_tcase(s, tc);

  tc = tcase_create("values");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, nonfinite_inputs_are_refused_and_change_nothing);
  tcase_add_test(tc, labels_out_of_range_are_refused);
  tcase_add_test(tc, bad_token_ids_and_labels_are_refused_and_change_nothing);
  tcase_add_test(tc, set_params_with_nonfinite_values_is_refused);
  suite_add_tcase(s, tc);

  tc = tcase_create("checkpoint");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, damaged_checkpoints_are_refused_into_every_layout);
  tcase_add_test(tc, oversized_checkpoints_are_refused_without_reading_them);
  tcase_add_test(tc, foreign_and_non_files_are_refused);
  suite_add_tcase(s, tc);

  tc = tcase_create("files");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, csv_with_a_ten_megabyte_line);
  tcase_add_test(tc, csv_line_over_the_limit_and_endless_files);
  tcase_add_test(tc, binary_garbage_and_directories);
  suite_add_tcase(s, tc);

  tc = tcase_create("regressions");
  tcase_add_test(tc, dropout_that_rounds_to_one_is_refused_with_a_whole_message);
  tcase_add_test(tc, format_with_null_buffer_and_capacity_is_a_length_query);
  suite_add_tcase(s, tc);
  return s;
}
