/* Training-step time that survives a shared machine: the minimum and the
 * median of single steps' wall times (a step that was preempted is slower,
 * never faster), next to the mean. Built and run by bench/compare.py;
 * by hand:
 *   cc -O2 -Iinclude bench/step_min.c build/libdp.a -lm -pthread -o build/bench_step_min
 *   build/bench_step_min MODEL BATCH DEVICES OPTIMIZER [STEPS [classic|allreduce|sharded]]
 * Prints one JSON object. Not part of the library; measures, asserts nothing. */
#include "dp.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + 1e-6 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr,
            "usage: %s MODEL BATCH DEVICES sgd|adamw|momentum [STEPS "
            "[classic|allreduce|sharded [fp32|bf16 [BACKEND_OPTIONS]]]]\n",
            argv[0]);
    return 2;
  }
  int B = atoi(argv[2]), devs = atoi(argv[3]), steps = argc > 5 ? atoi(argv[5]) : 200;
  dp_optimizer opt = strcmp(argv[4], "adamw") == 0      ? DP_OPT_ADAMW
                     : strcmp(argv[4], "momentum") == 0 ? DP_OPT_MOMENTUM
                                                        : DP_OPT_SGD;
  dp_model *m = NULL;
  dp_plan *p = NULL;
  dp_ctx *c = NULL;
  if (dp_model_load(argv[1], &m)) {
    fprintf(stderr, "%s: cannot load %s\n", argv[0], argv[1]);
    return 1;
  }
  dp_config cfg;
  dp_config_default(&cfg);
  dp_config_set_optimizer(&cfg, opt);
  cfg.batch = B;
  cfg.n_devices = devs;
  const char *mode = argc > 6 ? argv[6] : "classic";
  cfg.mode = strcmp(mode, "classic") == 0 ? DP_MODE_CLASSIC : DP_MODE_ALLREDUCE;
  cfg.shard_optimizer = strcmp(mode, "sharded") == 0;
  if (argc > 7 && dp_precision_parse(argv[7], &cfg.precision) != DP_OK) {
    fprintf(stderr, "%s: %s\n", argv[0], dp_last_error());
    return 2;
  }
  if (argc > 8) /* e.g. params=shared */
    snprintf(cfg.backend_options, sizeof cfg.backend_options, "%s", argv[8]);
  if (dp_plan_create(m, &cfg, &p) || dp_ctx_create(p, &c)) {
    fprintf(stderr, "%s: cannot plan or create the context: %s\n", argv[0], dp_last_error());
    return 1;
  }
  int in = dp_model_input_width(m), out = dp_model_output_width(m);
  float *x = malloc((size_t)B * in * 4), *t = malloc((size_t)B * out * 4);
  /* a sequence model: token ids below its vocabulary, a label per position */
  int P = dp_model_positions(m), classes = out / P;
  dp_layer_info l0;
  int vocab = dp_model_layer(m, 0, &l0) == DP_OK ? l0.vocab : 0;
  int32_t *lab = malloc((size_t)B * P * 4);
  double *ms = malloc((size_t)steps * sizeof *ms);
  uint64_t s = 12345;
  for (size_t i = 0; i < (size_t)B * in; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = vocab ? (float)((s >> 33) % (uint64_t)vocab)
                 : (float)((s >> 40) & 0xffff) / 32768.0f - 1.0f;
  }
  for (size_t i = 0; i < (size_t)B * out; i++) t[i] = x[i % ((size_t)B * in)] * 0.5f;
  for (size_t r = 0; r < (size_t)B * P; r++) lab[r] = (int32_t)((r * 7 + r / 3) % classes);
  const void *target =
      dp_model_loss(m) == DP_LOSS_MSE ? (const void *)t : (const void *)lab;
  float loss;
  for (int i = 0; i < 10; i++)
    if (dp_train_step(c, B, in, x, target, &loss)) return 1;
  double sum = 0;
  for (int i = 0; i < steps; i++) {
    double t0 = now_ms();
    if (dp_train_step(c, B, in, x, target, &loss)) return 1;
    ms[i] = now_ms() - t0;
    sum += ms[i];
  }
  qsort(ms, (size_t)steps, sizeof *ms, cmp);
  printf("{\"model\":\"%s\",\"batch\":%d,\"devices\":%d,\"optimizer\":\"%s\",\"steps\":%d,"
         "\"min_ms\":%.5f,\"median_ms\":%.5f,\"mean_ms\":%.5f}\n",
         argv[1], B, devs, argv[4], steps, ms[0], ms[steps / 2], sum / steps);
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
  free(x), free(t), free(lab), free(ms);
  return 0;
}
