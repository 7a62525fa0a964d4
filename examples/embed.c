/* A fixed-budget service embedding libdp, using only <dp.h>.
 *
 * The arenas are static buffers: the process's memory for the model is fixed
 * at link time. At start-up the service plans its batch, refuses to run if the
 * plan does not fit its per-device budget, and creates the context on its own
 * memory (dp_ctx_create_static). It then serves synthetic requests: each
 * request brings a labelled batch to learn from, and after a few requests it
 * answers a query batch by inference. The training steps and forward passes
 * allocate nothing.
 *
 *   cc -std=c11 examples/embed.c $(pkg-config --cflags --static --libs dp) -o embed
 *
 * (from a build tree: cc -std=c11 -Iinclude examples/embed.c build/libdp.a -lm -pthread).
 * Built with -DEMBED_CUDA against dp-cuda (pkg-config --static --libs dp-cuda) it also
 * registers the CUDA backend and reports the GPUs; it serves on the cpu backend either way.
 *
 * Exit status 0 on success; on any failure the library's error text is printed
 * and the status is 1.
 */
#include <dp.h>

#include <stdint.h>
#include <stdio.h>

/* The model, compiled in: 3 classes of 4 features. */
static const char MODEL[] = "input 4\n"
                            "linear 32\n"
                            "relu\n"
                            "linear 3\n"
                            "loss softmax_cross_entropy\n";
enum {
  IN = 4,
  CLASSES = 3,
  DEVICES = 2,            /* virtual devices (worker threads) */
  BATCH = 64,             /* rows per request, planned */
  REQUESTS = 60,          /* training requests served */
};

/* Bytes per device arena (-DEMBED_BUDGET=... to try a tighter one). */
#ifndef EMBED_BUDGET
#define EMBED_BUDGET (1 << 20)
#endif
#define BUDGET ((size_t)(EMBED_BUDGET))

/* All of the service's model memory. */
static _Alignas(64) unsigned char arena[DEVICES][BUDGET];

/* One synthetic request: class c sits at +2 on feature c, noise in [-1, 1). */
static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float noise(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)(rng >> 40) * 0x1p-23f - 1.0f;
}

static void next_request(int rows, float *x, int32_t *label) {
  for (int r = 0; r < rows; r++) {
    label[r] = (int32_t)(r % CLASSES);
    for (int j = 0; j < IN; j++) x[r * IN + j] = noise() + (j == label[r] ? 2.0f : 0.0f);
  }
}

static int fail(const char *what, dp_status s) {
  fprintf(stderr, "embed: %s: %s: %s\n", what, dp_status_name(s), dp_last_error());
  return 1;
}

int main(void) {
  dp_model *model = NULL;
  dp_plan *plan = NULL;
  dp_ctx *ctx = NULL;
  int rc = 1;
  dp_status s;

#ifdef EMBED_CUDA
  if ((s = dp_cuda_register())) return fail("cuda", s);
  printf("cuda backend registered: %d GPU(s)\n", dp_cuda_device_count());
#endif
  if ((s = dp_model_parse(MODEL, "embed", &model))) return fail("model", s);

  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = BATCH;
  cfg.n_devices = DEVICES;
  dp_config_set_optimizer(&cfg, DP_OPT_ADAMW);
  cfg.lr = 0.01f;
  cfg.seed = 1;
  if ((s = dp_plan_create(model, &cfg, &plan))) {
    rc = fail("plan", s);
    goto out;
  }

  /* Does the plan fit the budget? If not, say what would. */
  int devices = dp_plan_n_devices(plan);
  int fits = devices <= DEVICES && dp_plan_host_bytes(plan) == 0;
  for (int d = 0; d < devices; d++) {
    printf("device %d: %zu bytes of %zu\n", d, dp_plan_device_bytes(plan, d), BUDGET);
    if (dp_plan_device_bytes(plan, d) > BUDGET) fits = 0;
  }
  if (!fits) {
    int best = 0;
    if ((s = dp_plan_max_batch(model, &cfg, BUDGET, BATCH, &best))) {
      rc = fail("max batch", s);
      goto out;
    }
    fprintf(stderr, "embed: the plan does not fit %zu bytes per device; "
                    "the largest batch that fits is %d\n", BUDGET, best);
    goto out;
  }

  void *arenas[DEVICES];
  for (int d = 0; d < DEVICES; d++) arenas[d] = arena[d];
  if ((s = dp_ctx_create_static(plan, arenas, NULL, &ctx))) {
    rc = fail("context", s);
    goto out;
  }

  /* Serve: learn from each request; the last one is smaller than planned. */
  static float x[BATCH * IN], y[BATCH * CLASSES];
  static int32_t label[BATCH];
  float loss = 0.0f;
  for (int q = 0; q < REQUESTS; q++) {
    int rows = q == REQUESTS - 1 ? BATCH / 2 + 3 : BATCH;
    next_request(rows, x, label);
    if ((s = dp_train_step(ctx, rows, IN, x, label, &loss))) {
      fprintf(stderr, "embed: request %d: %s\n", q, dp_ctx_error(ctx));
      goto out;
    }
    if (q % 20 == 0 || q == REQUESTS - 1) printf("request %2d: %2d rows, loss %.4f\n", q, rows,
                                                 (double)loss);
  }

  /* Answer a query batch. */
  int rows = 12, correct = 0;
  next_request(rows, x, label);
  if ((s = dp_forward(ctx, rows, IN, x, y))) {
    fprintf(stderr, "embed: query: %s\n", dp_ctx_error(ctx));
    goto out;
  }
  printf("query:");
  for (int r = 0; r < rows; r++) {
    int best = 0;
    for (int k = 1; k < CLASSES; k++)
      if (y[r * CLASSES + k] > y[r * CLASSES + best]) best = k;
    printf(" %d", best);
    correct += best == label[r];
  }
  printf("  (%d of %d correct)\n", correct, rows);
  printf("steps %llu, params hash %016llx, device 0 high water %zu bytes\n",
         (unsigned long long)dp_ctx_step(ctx), (unsigned long long)dp_params_hash(ctx),
         dp_ctx_high_water(ctx, 0));
  rc = 0;

out:
  dp_ctx_free(ctx); /* the arenas stay ours: static */
  dp_plan_free(plan);
  dp_model_free(model);
  return rc;
}
