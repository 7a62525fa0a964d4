/* How far two cores can scale the large MLP's arithmetic alone: the products
 * of one training step of 784-1024-1024-10 (per linear layer y = x W^T,
 * dW = dy^T x, and dx = dy W but for the first layer) through libdp's GEMM
 * (lib/cpu/gemm.h), timed
 *   - at 256 rows on one core (what 1 device runs), and
 *   - at 128 rows on each of two cores at once, each with its own weights and
 *     activations (what 2 replicas run), the slower core's time counting.
 * Their ratio is the scaling the GEMMs alone allow on this machine, with no
 * step around them: no broadcast, reduction, update or barrier. Best of
 * ROUNDS interleaved rounds. Built and run by bench/compare.py; by hand:
 *   cc -O2 -Iinclude -Ilib bench/gemm_pair.c build/libdp.a -lm -pthread -o /tmp/gp
 *   /tmp/gp [ROUNDS]
 * Prints one JSON object. Not part of the library; measures, asserts nothing. */
#define _GNU_SOURCE
#include "cpu/gemm.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define LAYERS 3
static const int WIDTH[LAYERS + 1] = {784, 1024, 1024, 10};

typedef struct {
  int rows, cpu;
  float *act[LAYERS + 1]; /* (rows, WIDTH[l]): inputs and outputs of each layer */
  float *grad[LAYERS + 1];
  float *w[LAYERS], *dw[LAYERS]; /* (WIDTH[l + 1], WIDTH[l]) */
  void *ws;
  double ms;
} replica;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + 1e-6 * (double)t.tv_nsec;
}

static float *filled(size_t n, unsigned seed) {
  float *p = malloc(n * sizeof *p);
  if (!p) {
    fprintf(stderr, "gemm_pair: out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < n; i++)
    p[i] = (float)((i * 2654435761u + seed) % 97) / 97.0f - 0.5f;
  return p;
}

static void replica_init(replica *r, int rows, int cpu) {
  r->rows = rows;
  r->cpu = cpu;
  for (int l = 0; l <= LAYERS; l++) {
    r->act[l] = filled((size_t)rows * WIDTH[l], 1u + (unsigned)l);
    r->grad[l] = filled((size_t)rows * WIDTH[l], 7u + (unsigned)l);
  }
  size_t ws = 0;
  for (int l = 0; l < LAYERS; l++) {
    size_t in = (size_t)WIDTH[l], out = (size_t)WIDTH[l + 1];
    r->w[l] = filled(out * in, 3u + (unsigned)l);
    r->dw[l] = filled(out * in, 5u + (unsigned)l);
    size_t need[3] = {dp__gemm_workspace_bytes(rows, (int)out, (int)in),
                      dp__gemm_workspace_bytes((int)out, (int)in, rows),
                      dp__gemm_workspace_bytes(rows, (int)in, (int)out)};
    for (int k = 0; k < 3; k++) ws = need[k] > ws ? need[k] : ws;
  }
  r->ws = aligned_alloc(64, (ws + 63) / 64 * 64);
  if (!r->ws) {
    fprintf(stderr, "gemm_pair: out of memory\n");
    exit(1);
  }
}

/* One step's products on the calling thread, pinned to r->cpu. */
static void *replica_step(void *arg) {
  replica *r = arg;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(r->cpu, &set);
  (void)sched_setaffinity(0, sizeof set, &set);
  int n = r->rows;
  double t0 = now_ms();
  for (int l = 0; l < LAYERS; l++)
    dp__sgemm(0, 1, n, WIDTH[l + 1], WIDTH[l], r->act[l], WIDTH[l], r->w[l], WIDTH[l],
              r->act[l + 1], WIDTH[l + 1], NULL, r->ws);
  for (int l = LAYERS - 1; l >= 0; l--) {
    dp__sgemm(1, 0, WIDTH[l + 1], WIDTH[l], n, r->grad[l + 1], WIDTH[l + 1], r->act[l],
              WIDTH[l], r->dw[l], WIDTH[l], NULL, r->ws);
    if (l > 0)
      dp__sgemm(0, 0, n, WIDTH[l], WIDTH[l + 1], r->grad[l + 1], WIDTH[l + 1], r->w[l],
                WIDTH[l], r->grad[l], WIDTH[l], NULL, r->ws);
  }
  r->ms = now_ms() - t0;
  return NULL;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 15;
  if (rounds < 1) rounds = 1;
  replica one, a, b;
  replica_init(&one, 256, 0);
  replica_init(&a, 128, 0);
  replica_init(&b, 128, 1);
  double best_one = 1e30, best_pair = 1e30;
  for (int i = 0; i < rounds; i++) {
    replica_step(&one);
    if (one.ms < best_one) best_one = one.ms;
    pthread_t t;
    if (pthread_create(&t, NULL, replica_step, &b)) {
      fprintf(stderr, "gemm_pair: cannot start a thread\n");
      return 1;
    }
    replica_step(&a);
    pthread_join(t, NULL);
    double pair = a.ms > b.ms ? a.ms : b.ms;
    if (pair < best_pair) best_pair = pair;
  }
  printf(
      "{\"one_core_256_rows_ms\":%.3f,\"two_cores_128_rows_ms\":%.3f,\"scaling\":%.3f}\n",
      best_one, best_pair, best_one / best_pair);
  return 0;
}
