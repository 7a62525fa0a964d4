/* A device that fails: the CUDA backend through the public API when its GPU
 * reports an asynchronous fault (issue 14, item 7). The fault is the backend's
 * debug hook DP_CUDA_DEBUG_FAULT_STEP: an illegal-address kernel at the start of
 * that step. test_dp runs this on a real GPU (skipping, visibly, without one);
 * test_cuda_emul runs it on the emulated GPU, which honours the same hook, on
 * every CI run. A real fault leaves the process's CUDA context unusable:
 * Check's fork per test keeps it from the other tests (tests/gpu/run.sh runs
 * this suite on its own). */
#include "dp.h"

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A faulting step ends in DP_ERR_BACKEND within 30 s, naming the CUDA error;
 * every later step and forward is refused (the context is unusable); a
 * checkpoint cannot be saved from it; dp_ctx_free returns. An illegal address
 * poisons the GPU's CUDA context for the rest of the process (a sticky error:
 * the CUDA simulation keeps it too), so each variant runs in a test, a forked
 * process, of its own: `graph` is Check's loop index. */
START_TEST(device_fault_fails_the_step_in_bounded_time_and_free_returns) {
  if (dp_cuda_device_count() <= 0) {
    fprintf(stderr, "SKIP cuda_fault: %s: no GPU (%s)\n",
            "device_fault_fails_the_step_in_bounded_time_and_free_returns",
            dp_last_error());
    return;
  }
  const int graph = _i;
  setenv("DP_CUDA_DEBUG_FAULT_STEP", "3", 1);
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse("input 6\nlinear 8\nrelu\nlinear 3\n"
                                  "loss softmax_cross_entropy\n",
                                  "fault", &m),
                   DP_OK);
  {
    dp_config c;
    dp_config_default(&c);
    c.batch = 16;
    c.n_devices = 2;
    c.device_ids[0] = c.device_ids[1] = 0; /* the lent machine has one GPU */
    c.backend = DP_BACKEND_CUDA;
    c.cuda_graph = graph;
    c.timeout_ms = 30000;
    dp_plan *p = NULL;
    dp_ctx *ctx = NULL;
    ck_assert_msg(dp_plan_create(m, &c, &p) == DP_OK, "%s", dp_last_error());
    ck_assert_msg(dp_ctx_create(p, &ctx) == DP_OK, "%s", dp_last_error());
    float x[16 * 6];
    int32_t t[16];
    for (int i = 0; i < 16 * 6; i++) x[i] = (float)((i * 7) % 11) * 0.1f - 0.5f;
    for (int i = 0; i < 16; i++) t[i] = i % 3;
    float loss = 0.0f;
    for (int k = 0; k < 2; k++)
      ck_assert_msg(dp_train_step(ctx, 16, 6, x, t, &loss) == DP_OK, "step %d: %s", k,
                    dp_ctx_error(ctx));
    double t0 = now_s();
    dp_status s = dp_train_step(ctx, 16, 6, x, t, &loss);
    double dt = now_s() - t0;
    ck_assert_msg(s == DP_ERR_BACKEND, "graph %d: the faulting step: %s: %s", graph,
                  dp_status_name(s), dp_ctx_error(ctx));
    ck_assert_msg(dt < 30.0, "the faulting step took %.1f s", dt);
    ck_assert_msg(strstr(dp_ctx_error(ctx), "IllegalAddress") ||
                      strstr(dp_ctx_error(ctx), "illegal"),
                  "%s", dp_ctx_error(ctx));
    s = dp_train_step(ctx, 16, 6, x, t, &loss);
    ck_assert_msg(s != DP_OK && strstr(dp_ctx_error(ctx), "unusable"), "%s: %s",
                  dp_status_name(s), dp_ctx_error(ctx));
    float y[16 * 3];
    ck_assert_int_ne(dp_forward(ctx, 16, 6, x, y), DP_OK);
    dp_ctx_free(ctx); /* returns: a failed context aborts, it does not wait */
    dp_plan_free(p);
  }
  unsetenv("DP_CUDA_DEBUG_FAULT_STEP");
  dp_model_free(m);
}
END_TEST

Suite *cuda_fault_suite(void) {
  Suite *s = suite_create("cuda_fault");
  TCase *tc = tcase_create("gpu_fault");
  tcase_set_tags(tc, "gpu");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, device_fault_fails_the_step_in_bounded_time_and_free_returns, 0,
                      2);
  suite_add_tcase(s, tc);
  return s;
}
