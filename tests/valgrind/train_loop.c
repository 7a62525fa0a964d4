/* The `ninja valgrind` driver: a 200-step training loop and 200 inference
 * calls through the public API, run under valgrind memcheck (which fails the
 * target on any error or definite/indirect leak).
 *
 *   valgrind_train_loop N [--guards]   N virtual devices (1..DP_MAX_DEVICES);
 *                                      --guards: arena guards on (config.guards)
 *
 * The model uses every layer kind (layernorm, gelu, dropout, tanh, sigmoid,
 * relu, nobias) and AdamW, so every kernel and optimizer path runs; the
 * batch does not divide evenly, some steps take a smaller batch, and one
 * refused step (a NaN input) and a checkpoint save + load are in the loop,
 * so the error paths run under memcheck too. A second, inference-only
 * context runs the 200 forward calls. Exit status 0 when every call
 * behaved, 1 otherwise (valgrind's own errors give --error-exitcode). */
#include "dp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STEPS 200
#define FORWARDS 200
#define BATCH 37
#define IN 12
#define CLASSES 5

static const char *const SPEC = "input 12\n"
                                "linear 24\n"
                                "layernorm\n"
                                "gelu\n"
                                "dropout 0.1\n"
                                "linear 16\n"
                                "tanh\n"
                                "linear 16 nobias\n"
                                "sigmoid\n"
                                "linear 12\n"
                                "relu\n"
                                "linear 5\n"
                                "loss softmax_cross_entropy\n";

#define CHECK(call)                                                                   \
  do {                                                                                \
    dp_status s_ = (call);                                                            \
    if (s_ != DP_OK) {                                                                \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,               \
              dp_status_name(s_), dp_last_error());                                   \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

static int train(dp_model *m, int n_devices, int guards, const float *x, const int32_t *labels) {
  dp_config c;
  dp_config_default(&c);
  c.guards = guards;
  c.batch = BATCH;
  c.n_devices = n_devices;
  dp_config_set_optimizer(&c, DP_OPT_ADAMW);
  c.lr = 0.003f;
  c.seed = 11;
  dp_plan *p;
  CHECK(dp_plan_create(m, &c, &p));
  dp_ctx *ctx;
  CHECK(dp_ctx_create(p, &ctx));
  float first = 0.0f, loss = 0.0f;
  for (int step = 0; step < STEPS; step++) {
    int rows = step % 10 == 9 ? BATCH - 6 : BATCH; /* a smaller batch now and then */
    CHECK(dp_train_step(ctx, rows, IN, x, labels, &loss));
    if (step == 0) first = loss;
    if (step == STEPS / 2) { /* a refused step: the error path, state unchanged */
      float bad[BATCH * IN];
      memcpy(bad, x, sizeof bad);
      bad[5] = NAN;
      uint64_t h = dp_params_hash(ctx);
      if (dp_train_step(ctx, BATCH, IN, bad, labels, NULL) == DP_OK || dp_params_hash(ctx) != h) {
        fprintf(stderr, "a NaN input was not refused cleanly\n");
        return 1;
      }
    }
  }
  /* save and load back: the checkpoint code under memcheck too */
  char path[64];
  snprintf(path, sizeof path, "/tmp/dp_valgrind_%ld.ckpt", (long)getpid());
  CHECK(dp_ckpt_save(ctx, path));
  CHECK(dp_ckpt_load(ctx, path));
  unlink(path);
  size_t n = dp_model_n_params(m);
  float *params = malloc(n * sizeof *params), *grads = malloc(n * sizeof *grads);
  if (!params || !grads) return 1;
  CHECK(dp_get_params(ctx, params, n));
  CHECK(dp_get_grads(ctx, grads, n));
  CHECK(dp_set_params(ctx, params, n));
  if (guards) CHECK(dp_ctx_check_guards(ctx));
  printf("%d devices%s: %d steps, loss %.4f -> %.4f, params hash %016llx, high water %zu B\n",
         n_devices, guards ? " (guards)" : "", STEPS, (double)first, (double)loss,
         (unsigned long long)dp_params_hash(ctx),
         dp_ctx_high_water(ctx, 0));
  if (!(loss < first)) {
    fprintf(stderr, "training did not reduce the loss\n");
    return 1;
  }

  /* inference: a context planned forward-only, with the trained parameters */
  dp_config ci = c;
  ci.inference = 1;
  dp_plan *pi;
  CHECK(dp_plan_create(m, &ci, &pi));
  dp_ctx *inf;
  CHECK(dp_ctx_create(pi, &inf));
  CHECK(dp_set_params(inf, params, n));
  float y[BATCH * CLASSES];
  double sum = 0.0;
  for (int k = 0; k < FORWARDS; k++) {
    int rows = 1 + k % BATCH;
    CHECK(dp_forward(inf, rows, IN, x, y));
    for (int i = 0; i < rows * CLASSES; i++) sum += y[i];
  }
  printf("%d devices: %d forward calls, output sum %.4f\n", n_devices, FORWARDS, sum);
  free(params);
  free(grads);
  dp_ctx_free(inf);
  dp_plan_free(pi);
  dp_ctx_free(ctx);
  dp_plan_free(p);
  return isfinite(sum) ? 0 : 1;
}

int main(int argc, char **argv) {
  int n_devices = argc > 1 ? atoi(argv[1]) : 2;
  int guards = argc > 2 && strcmp(argv[2], "--guards") == 0;
  if (argc > 2 + guards || n_devices < 1 || n_devices > DP_MAX_DEVICES) {
    fprintf(stderr, "usage: %s [N_DEVICES [--guards]]\n", argv[0]);
    return 2;
  }
  float x[BATCH * IN];
  int32_t labels[BATCH];
  for (int r = 0; r < BATCH; r++) {
    labels[r] = r % CLASSES;
    for (int j = 0; j < IN; j++)
      x[r * IN + j] =
          (float)((r * 31 + j * 17) % 23) / 23.0f - 0.5f + (j == labels[r] ? 1.0f : 0.0f);
  }
  dp_model *m;
  CHECK(dp_model_parse(SPEC, "valgrind.dpm", &m));
  int rc = train(m, n_devices, guards, x, labels);
  dp_model_free(m);
  return rc;
}
