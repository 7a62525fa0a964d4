/* `dp bench`: measurements, never assertions. peak (one core's FMA peak),
 * gemm (our GEMM against that peak), step (ms/step and samples/s of a
 * model), comm (under mpirun: the canonical tree's allreduce against
 * MPI_Allreduce, and the step time on 1, 2, 4, ... ranks; --shm: the
 * shared-memory transport's bytes/s), scaling (step cost as batch,
 * width and device count grow), gpu-step and gpu-gemm (the cuda backend's
 * step, with and without CUDA graphs, and how much of it the GEMMs are).
 * Tables by default, --json for scripts. */
#include "cli.h"

#ifdef DP_HAVE_MPI
#include "dp_mpi.h"
#endif

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- peak ---------------------------------------------------------------------- */

/* Twelve independent FMA chains in named registers (an array may be kept in
 * memory at -O2, which would measure store forwarding instead). */
#define FMA12(FMA)                                                                         \
  do {                                                                                     \
    a0 = FMA(a0, m, c);                                                                    \
    a1 = FMA(a1, m, c);                                                                    \
    a2 = FMA(a2, m, c);                                                                    \
    a3 = FMA(a3, m, c);                                                                    \
    a4 = FMA(a4, m, c);                                                                    \
    a5 = FMA(a5, m, c);                                                                    \
    a6 = FMA(a6, m, c);                                                                    \
    a7 = FMA(a7, m, c);                                                                    \
    a8 = FMA(a8, m, c);                                                                    \
    a9 = FMA(a9, m, c);                                                                    \
    a10 = FMA(a10, m, c);                                                                  \
    a11 = FMA(a11, m, c);                                                                  \
  } while (0)

__attribute__((target("avx512f"))) static double peak_avx512(long iters) {
  __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  /* twelve distinct starting values and a register barrier per iteration: with
   * equal starts the compiler merges identical chains (two FMAs per iteration
   * instead of twelve, a peak 1.55x too high) */
  __m512 a0 = _mm512_set1_ps(1.0f), a1 = _mm512_set1_ps(1.001f),
         a2 = _mm512_set1_ps(1.002f), a3 = _mm512_set1_ps(1.003f),
         a4 = _mm512_set1_ps(1.004f), a5 = _mm512_set1_ps(1.005f),
         a6 = _mm512_set1_ps(1.006f), a7 = _mm512_set1_ps(1.007f),
         a8 = _mm512_set1_ps(1.008f), a9 = _mm512_set1_ps(1.009f),
         a10 = _mm512_set1_ps(1.010f), a11 = _mm512_set1_ps(1.011f);
  double t0 = dpt_now_s();
  for (long it = 0; it < iters; it++) {
    FMA12(_mm512_fmadd_ps);
    __asm__ volatile(""
                     : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6),
                       "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
  }
  double t = dpt_now_s() - t0;
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return (double)iters * 12 * 16 * 2 / t / 1e9;
}

__attribute__((target("avx2,fma"))) static double peak_avx2(long iters) {
  __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  /* twelve distinct starting values and a register barrier per iteration: with
   * equal starts the compiler merges identical chains (two FMAs per iteration
   * instead of twelve, a peak 1.55x too high) */
  __m256 a0 = _mm256_set1_ps(1.0f), a1 = _mm256_set1_ps(1.001f),
         a2 = _mm256_set1_ps(1.002f), a3 = _mm256_set1_ps(1.003f),
         a4 = _mm256_set1_ps(1.004f), a5 = _mm256_set1_ps(1.005f),
         a6 = _mm256_set1_ps(1.006f), a7 = _mm256_set1_ps(1.007f),
         a8 = _mm256_set1_ps(1.008f), a9 = _mm256_set1_ps(1.009f),
         a10 = _mm256_set1_ps(1.010f), a11 = _mm256_set1_ps(1.011f);
  double t0 = dpt_now_s();
  for (long it = 0; it < iters; it++) {
    FMA12(_mm256_fmadd_ps);
    __asm__ volatile(""
                     : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6),
                       "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
  }
  double t = dpt_now_s() - t0;
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  float out[8];
  _mm256_storeu_ps(out, s);
  volatile float sink = out[0];
  (void)sink;
  return (double)iters * 12 * 8 * 2 / t / 1e9;
}

/* Best of a few runs of ~0.2 s: GFLOP/s of one core. 0 when unsupported. */
static double measure_peak(int avx512) {
  if (avx512 ? !__builtin_cpu_supports("avx512f") : !__builtin_cpu_supports("fma"))
    return 0.0;
  double best = 0.0;
  for (int r = 0; r < 5; r++) {
    double g = avx512 ? peak_avx512(4000000) : peak_avx2(4000000);
    best = g > best ? g : best;
  }
  return best;
}

static int bench_peak(int json) {
  double p512 = measure_peak(1), p256 = measure_peak(0);
  if (json) {
    printf("{\"peak_gflops\":{\"avx512\":%.1f,\"avx2\":%.1f}}\n", p512, p256);
  } else {
    printf("one core's fp32 FMA peak (best of 5, ~0.2 s each)\n");
    printf("  avx512  %8.1f GFLOP/s%s\n", p512, p512 ? "" : "  (not supported)");
    printf("  avx2    %8.1f GFLOP/s%s\n", p256, p256 ? "" : "  (not supported)");
  }
  return DPT_EXIT_OK;
}

/* ---- step ---------------------------------------------------------------------- */

typedef struct {
  double ms_per_step, samples_per_s;
  int steps;
} step_result;

/* The benchmarks' data: B rows of x (B, in) in [-1, 1) from a fixed LCG, MSE
 * targets t (B, out) and labels lab (B) from them; returns the target array
 * the model's loss takes. The same bytes on every call (and every rank). */
static const void *random_batch(const dp_model *m, int B, float *x, float *t,
                                int32_t *lab) {
  int in = dp_model_input_width(m), outw = dp_model_output_width(m);
  int P = dp_model_positions(m), classes = outw / P;
  dp_layer_info l0;
  /* a token model's inputs are ids below its vocabulary */
  int vocab = dp_model_layer(m, 0, &l0) == DP_OK ? l0.vocab : 0;
  uint64_t s = 12345;
  for (size_t i = 0; i < (size_t)B * in; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = vocab ? (float)((s >> 33) % (uint64_t)vocab)
                 : (float)((s >> 40) & 0xffff) / 32768.0f - 1.0f;
  }
  for (size_t i = 0; i < (size_t)B * outw; i++) t[i] = x[i % ((size_t)B * in)] * 0.5f;
  for (size_t r = 0; r < (size_t)B * P; r++) lab[r] = (int32_t)((r * 7 + r / 3) % classes);
  return dp_model_loss(m) != DP_LOSS_SOFTMAX_CE ? (const void *)t : (const void *)lab;
}

/* random_batch's label array: one int32 per position of every row. */
static int32_t *labels_new(const dp_model *m, int B) {
  return calloc((size_t)B * (size_t)dp_model_positions(m), 4);
}

/* Times `steps` training steps (after a warm-up) on random data, repeated
 * until at least min_s seconds have passed. On failure the message is in
 * err (also printed unless quiet). */
static int time_steps_for(const dp_model *m, const dp_config *cfg, int steps, double min_s,
                          int quiet, step_result *out, char *err, size_t errcap) {
  dp_plan *p = NULL;
  dp_ctx *c = NULL;
  int in = dp_model_input_width(m), outw = dp_model_output_width(m), B = cfg->batch;
  float *x = malloc((size_t)B * in * 4), *t = malloc((size_t)B * outw * 4);
  int32_t *lab = labels_new(m, B);
  int rc = -1;
  if (!x || !t || !lab) goto done;
  const void *target = random_batch(m, B, x, t, lab);
  if (dp_plan_create(m, cfg, &p) || dp_ctx_create(p, &c)) goto done;
  float loss;
  for (int i = 0; i < 10; i++)
    if (dp_train_step(c, B, in, x, target, &loss)) goto done;
  /* Repeat until at least min_s has passed, for stable numbers at tiny steps. */
  int done_steps = 0;
  double t0 = dpt_now_s(), el;
  do {
    for (int i = 0; i < steps; i++)
      if (dp_train_step(c, B, in, x, target, &loss)) goto done;
    done_steps += steps;
    el = dpt_now_s() - t0;
  } while (el < min_s);
  out->steps = done_steps;
  out->ms_per_step = 1e3 * el / done_steps;
  out->samples_per_s = (double)B * done_steps / el;
  rc = 0;
done:
  if (rc) {
    snprintf(err, errcap, "%s",
             !x || !t || !lab ? "out of memory"
             : c              ? dpt_user_msg(dp_ctx_error(c))
                              : dpt_user_msg(dp_last_error()));
    if (!quiet) fprintf(stderr, "dp bench: %s\n", err);
  }
  dp_ctx_free(c);
  dp_plan_free(p);
  free(x);
  free(t);
  free(lab);
  return rc;
}

static int time_steps(const dp_model *m, const dp_config *cfg, int steps,
                      step_result *out) {
  char err[DPT_MSG_CAP];
  return time_steps_for(m, cfg, steps, 0.3, 0, out, err, sizeof err);
}

/* ---- step --profile ------------------------------------------------------------- */

/* Per layer and device's thread: forward and backward ms summed over the
 * profile (the layer columns of the table). */
typedef struct {
  double fwd[DP_MAX_DEVICES], bwd[DP_MAX_DEVICES];
} layer_ms;

static void sum_layers(const dp_prof_event *ev, size_t n, int n_layers, layer_ms *out) {
  memset(out, 0, (size_t)n_layers * sizeof *out);
  for (size_t i = 0; i < n; i++) {
    const dp_prof_event *e = &ev[i];
    if (e->what != DP_PROF_EVENT_OP || e->layer < 0 || e->layer >= n_layers ||
        e->thread < 0 || e->thread >= DP_MAX_DEVICES)
      continue;
    double ms = (double)(e->t1_ns - e->t0_ns) * 1e-6;
    if (e->kind == DP_OP_FORWARD) out[e->layer].fwd[e->thread] += ms;
    if (e->kind == DP_OP_BACKWARD) out[e->layer].bwd[e->thread] += ms;
  }
}

/* Op events per (phase, kind): ms summed per thread, and how many. */
typedef struct {
  double ms[DP_MAX_DEVICES];
  long n;
} kind_ms;

#define N_KINDS (DP_OP_COPY_ADD + 1)

static void sum_kinds(const dp_prof_event *ev, size_t n, kind_ms (*out)[N_KINDS]) {
  for (size_t i = 0; i < n; i++) {
    const dp_prof_event *e = &ev[i];
    if (e->what != DP_PROF_EVENT_OP || e->phase >= DP_PHASE_COUNT || e->kind >= N_KINDS ||
        e->thread < 0 || e->thread >= DP_MAX_DEVICES)
      continue;
    out[e->phase][e->kind].ms[e->thread] += (double)(e->t1_ns - e->t0_ns) * 1e-6;
    out[e->phase][e->kind].n++;
  }
}

/* Barrier waits per phase of the stage they end (index DP_PHASE_COUNT: the
 * workers' wait for a job), ms summed, per thread. */
static void sum_waits(const dp_prof_event *ev, size_t n, double (*w)[DP_PHASE_COUNT + 1]) {
  for (size_t i = 0; i < n; i++)
    if (ev[i].what == DP_PROF_EVENT_BARRIER && ev[i].thread >= 0 &&
        ev[i].thread < DP_MAX_DEVICES && ev[i].phase <= DP_PHASE_COUNT)
      w[ev[i].thread][ev[i].phase] += (double)(ev[i].t1_ns - ev[i].t0_ns) * 1e-6;
}

static void print_profile_json(const char *model, const dp_config *cfg,
                               const dp_prof_summary *s, const dp_model *m,
                               const layer_ms *lay, size_t dropped) {
  double k = s->steps ? 1.0 / s->steps : 0.0;
  printf("{\"model\":\"%s\",\"batch\":%d,\"devices\":%d,\"optimizer\":\"%s\",\"steps\":%d,"
         "\"wall_ms_per_step\":%.5f,\"dropped\":%zu,\"threads\":[",
         model, cfg->batch, cfg->n_devices, dp_optimizer_name(cfg->optimizer), s->steps,
         s->wall_ms * k, dropped);
  for (int t = 0; t < s->n_threads; t++) {
    double busy = 0.0;
    printf("%s{\"device\":%d,\"ms_per_step\":{", t ? "," : "", t);
    for (int c = 0; c < DP_PROF_CLASS_COUNT; c++) {
      busy += s->busy_ms[t][c];
      printf("%s\"%s\":%.5f", c ? "," : "", dp_prof_class_name((dp_prof_class)c),
             s->busy_ms[t][c] * k);
    }
    printf("},\"busy_ms\":%.5f,\"busy_cpu_ms\":%.5f,\"barrier_ms\":%.5f,\"other_ms\":%.5f}",
           busy * k, s->busy_cpu_ms[t] * k, s->barrier_ms[t] * k, s->other_ms[t] * k);
  }
  printf("],\"ops_per_step\":{");
  for (int c = 0; c < DP_PROF_CLASS_COUNT; c++)
    printf("%s\"%s\":%.2f", c ? "," : "", dp_prof_class_name((dp_prof_class)c),
           (double)s->ops[c] * k);
  printf("},\"layers\":[");
  for (int i = 0; i < dp_model_n_layers(m); i++) {
    dp_layer_info li;
    dp_model_layer(m, i, &li);
    printf("%s{\"layer\":%d,\"kind\":\"%s\",\"forward_ms\":[", i ? "," : "", i,
           dp_layer_kind_name(li.kind));
    for (int t = 0; t < s->n_threads; t++)
      printf("%s%.5f", t ? "," : "", lay[i].fwd[t] * k);
    printf("],\"backward_ms\":[");
    for (int t = 0; t < s->n_threads; t++)
      printf("%s%.5f", t ? "," : "", lay[i].bwd[t] * k);
    printf("]}");
  }
  printf("]}\n");
}

/* One row of the text table: a label and a figure per thread. */
static void row(const char *label, const double *v, size_t stride, int n, double k) {
  printf("  %-22s", label);
  for (int t = 0; t < n; t++) printf(" %9.3f", v[(size_t)t * stride] * k);
  printf("\n");
}

static void print_profile_text(const char *model, const dp_config *cfg,
                               const dp_prof_summary *s, const dp_model *m,
                               const layer_ms *lay, const double (*w)[DP_PHASE_COUNT + 1],
                               const kind_ms (*kinds)[N_KINDS], size_t dropped) {
  int n = s->n_threads;
  double k = s->steps ? 1.0 / s->steps : 0.0, busy[DP_MAX_DEVICES], wall[DP_MAX_DEVICES];
  printf("%s, batch %d, %d device(s), %s: %d steps profiled, %.4f ms/step (wall)%s\n",
         model, cfg->batch, cfg->n_devices, dp_optimizer_name(cfg->optimizer), s->steps,
         s->wall_ms * k, dropped ? " (events dropped: the buffer was too small)" : "");
  printf("config  ");
  dpt_print_config(stdout, cfg);
  printf("\n");
  printf("\nms per step, per device's thread\n  %-22s", "");
  for (int t = 0; t < n; t++) printf("  device %d", t);
  printf("\n");
  for (int c = 0; c < DP_PROF_CLASS_COUNT; c++)
    row(dp_prof_class_name((dp_prof_class)c), &s->busy_ms[0][c], DP_PROF_CLASS_COUNT, n, k);
  for (int t = 0; t < n; t++) {
    busy[t] = 0.0;
    for (int c = 0; c < DP_PROF_CLASS_COUNT; c++) busy[t] += s->busy_ms[t][c];
    wall[t] = s->wall_ms;
  }
  row("= busy", busy, 1, n, k);
  row("  of it on the cpu", s->busy_cpu_ms, 1, n, k);
  row("idle at barriers", s->barrier_ms, 1, n, k);
  for (int ph = 0; ph <= DP_PHASE_COUNT; ph++) {
    char label[40];
    double any = 0.0;
    for (int t = 0; t < n; t++) any += w[t][ph];
    if (any * k < 0.0005) continue;
    snprintf(label, sizeof label, "  after %s",
             ph == DP_PHASE_COUNT ? "(job start)" : dp_phase_name((dp_phase)ph));
    row(label, &w[0][ph], DP_PHASE_COUNT + 1, n, k);
  }
  row("other (host, dispatch)", s->other_ms, 1, n, k);
  row("= wall", wall, 1, n, k);
  printf("\nper phase and op kind (layers' ops below), ms per step\n");
  for (int ph = 0; ph < DP_PHASE_COUNT; ph++)
    for (int o = 0; o < N_KINDS; o++) {
      if (!kinds[ph][o].n || o == DP_OP_FORWARD || o == DP_OP_BACKWARD) continue;
      char label[48];
      snprintf(label, sizeof label, "%s %s", dp_phase_name((dp_phase)ph),
               dp_op_kind_name((dp_op_kind)o));
      row(label, kinds[ph][o].ms, 1, n, k);
    }
  printf("\nper layer, ms per step: forward / backward\n  %-22s", "");
  for (int t = 0; t < n; t++) printf("      device %d    ", t);
  printf("\n");
  for (int i = 0; i < dp_model_n_layers(m); i++) {
    dp_layer_info li;
    dp_model_layer(m, i, &li);
    char label[40];
    snprintf(label, sizeof label, "%2d %s", i, dp_layer_kind_name(li.kind));
    printf("  %-22s", label);
    for (int t = 0; t < n; t++)
      printf(" %8.3f / %7.3f", lay[i].fwd[t] * k, lay[i].bwd[t] * k);
    printf("\n");
  }
}

/* dp bench step --profile: `steps` steps after a warm-up, every op and
 * barrier wait recorded (dp_ctx_profile), then the table. */
static int profile_steps(const char *name, const dp_model *m, const dp_config *cfg,
                         int steps, int json) {
  dp_plan *p = NULL;
  dp_ctx *c = NULL;
  int in = dp_model_input_width(m), outw = dp_model_output_width(m), B = cfg->batch;
  float *x = malloc((size_t)B * in * 4), *t = malloc((size_t)B * outw * 4);
  int32_t *lab = labels_new(m, B);
  dp_prof_event *ev = NULL;
  layer_ms *lay = calloc((size_t)dp_model_n_layers(m) + 1, sizeof *lay);
  double(*w)[DP_PHASE_COUNT + 1] = calloc(DP_MAX_DEVICES, sizeof *w);
  kind_ms(*kinds)[N_KINDS] = calloc(DP_PHASE_COUNT, sizeof *kinds);
  dp_prof_summary *sum = malloc(sizeof *sum);
  int rc = DPT_EXIT_FAIL;
  float loss;
  if (!x || !t || !lab || !lay || !w || !sum || !kinds) goto done;
  const void *target = random_batch(m, B, x, t, lab);
  if (dp_plan_create(m, cfg, &p) || dp_ctx_create(p, &c)) goto done;
  /* an op per device thread (a shared op on each), a barrier after each
   * stage and shared op, the step: at most this many events per step */
  size_t per = (size_t)dp_plan_n_ops(p) * 2 * ((size_t)cfg->n_devices + 1) + 64;
  if (!(ev = malloc(per * (size_t)steps * sizeof *ev))) goto done;
  for (int i = 0; i < 10; i++)
    if (dp_train_step(c, B, in, x, target, &loss)) goto done;
  if (dp_ctx_profile(c, ev, per * (size_t)steps)) goto done;
  for (int i = 0; i < steps; i++)
    if (dp_train_step(c, B, in, x, target, &loss)) goto done;
  size_t dropped, n = dp_ctx_profile_count(c, &dropped);
  dp_ctx_profile(c, NULL, 0);
  if (dp_prof_summarize(p, ev, n, sum)) goto done;
  sum_layers(ev, n, dp_model_n_layers(m), lay);
  sum_waits(ev, n, w);
  sum_kinds(ev, n, kinds);
  if (json)
    print_profile_json(name, cfg, sum, m, lay, dropped);
  else
    print_profile_text(name, cfg, sum, m, lay, (const double(*)[DP_PHASE_COUNT + 1]) w,
                       (const kind_ms(*)[N_KINDS])kinds, dropped);
  rc = DPT_EXIT_OK;
done:
  if (rc)
    fprintf(stderr, "dp bench step: %s\n",
            !x || !t || !lab || !lay || !w || !sum || !kinds || (p && c && !ev)
                ? "out of memory"
                : dpt_user_msg(c ? dp_ctx_error(c) : dp_last_error()));
  dp_ctx_free(c);
  dp_plan_free(p);
  free(x), free(t), free(lab), free(ev), free(lay), free(w), free(sum), free(kinds);
  return rc;
}

/* ---- rss ---------------------------------------------------------------------- */

/* Resident set size in KiB (from /proc/self/statm), 0 when unknown. */
static long rss_kib(void) {
  long pages_total, pages_res;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  int n = fscanf(f, "%ld %ld", &pages_total, &pages_res);
  fclose(f);
  return n == 2 ? pages_res * (sysconf(_SC_PAGESIZE) / 1024) : 0;
}

/* Resident memory after init, then every `steps`/10 steps: it must stay flat. */
static int bench_rss(const dp_model *m, const dp_config *cfg, int steps, int json) {
  dp_plan *p = NULL;
  dp_ctx *c = NULL;
  int in = dp_model_input_width(m), outw = dp_model_output_width(m), B = cfg->batch;
  float *x = calloc((size_t)B * in, 4), *t = calloc((size_t)B * outw, 4);
  int32_t *lab = labels_new(m, B);
  int rc = DPT_EXIT_FAIL;
  if (!x || !t || !lab || dp_plan_create(m, cfg, &p) || dp_ctx_create(p, &c)) {
    fprintf(stderr, "dp bench rss: %s\n", dpt_user_msg(dp_last_error()));
    goto done;
  }
  const void *target = random_batch(m, B, x, t, lab);
  float loss;
  /* Warm-up: the first steps touch stack pages and lazily mapped library code. */
  for (int i = 0; i < 10; i++)
    if (dp_train_step(c, B, in, x, target, &loss)) goto fail;
  long r0 = rss_kib(), mx = r0;
  if (json)
    printf("{\"rss_kib\":[%ld", r0);
  else
    printf("resident set after init and 10 warm-up steps: %ld KiB\n", r0);
  /* ten readings over the `steps` steps: k steps / 10 after the k-th (an
   * outside check: steps / 10 each ran 0 steps for --steps 5, and any
   * remainder was left out, while the report said `steps`) */
  for (int k = 1; k <= 10; k++) {
    int done = (int)((long long)steps * k / 10);
    for (int i = (int)((long long)steps * (k - 1) / 10); i < done; i++)
      if (dp_train_step(c, B, in, x, target, &loss)) goto fail;
    long r = rss_kib();
    mx = r > mx ? r : mx;
    if (json)
      printf(",%ld", r);
    else
      printf("after %6d steps: %ld KiB\n", done, r);
  }
  if (json)
    printf("],\"growth_kib\":%ld}\n", mx - r0);
  else
    printf("growth over %d steps: %ld KiB\n", steps, mx - r0);
  rc = DPT_EXIT_OK;
  goto done;
fail:
  fprintf(stderr, "dp bench rss: %s\n", dpt_user_msg(dp_ctx_error(c)));
done:
  dp_ctx_free(c);
  dp_plan_free(p);
  free(x);
  free(t);
  free(lab);
  return rc;
}

/* ---- comm ---------------------------------------------------------------------- */

/* GB/s of memcpy between two arenas of `bytes`, over about 256 MiB copied; -1
 * when out of memory. */
static double copy_gbs(size_t bytes) {
  unsigned char *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes);
  double gbs = -1.0;
  if (a && b) {
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    long reps = (long)(256 * 1048576.0 / bytes) + 1;
    double t0 = dpt_now_s();
    for (long r = 0; r < reps; r++) {
      memcpy(b, a, bytes);
      a[r % bytes] ^= b[(r * 7) % bytes]; /* keep the copies observable */
    }
    gbs = (double)bytes * reps / (dpt_now_s() - t0) / 1e9;
  }
  free(a);
  free(b);
  return gbs;
}

/* --shm: the shared-memory transport is memcpy between arenas; bytes/s per
 * size, in one process. */
static int bench_comm_shm(int json) {
  static const size_t sizes[] = {4096, 65536, 1 << 20, 16 << 20, 64 << 20};
  enum { N = sizeof sizes / sizeof *sizes };
  if (json)
    printf("{\"transport\":\"shm\",\"results\":[");
  else
    printf("transport shm (memcpy between two arenas)\n%12s %12s\n", "bytes", "GB/s");
  for (int i = 0; i < N; i++) {
    double gbs = copy_gbs(sizes[i]);
    if (gbs < 0) {
      fprintf(stderr, "dp bench comm: out of memory\n");
      return DPT_EXIT_FAIL;
    }
    if (json)
      printf("%s{\"bytes\":%zu,\"gb_per_s\":%.2f}", i ? "," : "", sizes[i], gbs);
    else
      printf("%12zu %12.2f\n", sizes[i], gbs);
  }
  if (json) printf("]}\n");
  return DPT_EXIT_OK;
}

/* ---- gemm ---------------------------------------------------------------------- */

static int bench_gemm(int json, const char *sizes_arg, const char *tier) {
  if (tier && dp_gemm_set_tier(tier)) {
    fprintf(stderr, "dp bench gemm: tier '%s' is unknown or not supported here\n", tier);
    return DPT_EXIT_USAGE;
  }
  int sizes[32], n = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", sizes_arg ? sizes_arg : "64,128,256,512,1024");
  size_t bl = strlen(buf);
  if (sizes_arg && strlen(sizes_arg) >= sizeof buf) {
    fprintf(stderr, "dp bench gemm: --sizes: at most %zu characters\n", sizeof buf - 1);
    return DPT_EXIT_USAGE;
  }
  if (!bl || buf[0] == ',' || buf[bl - 1] == ',' || strstr(buf, ",,")) {
    fprintf(stderr, "dp bench gemm: --sizes: give sizes separated by commas, e.g. "
                    "256,512,1024 (no empty entry)\n");
    return DPT_EXIT_USAGE;
  }
  for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    if (n == 32) {
      fprintf(stderr, "dp bench gemm: --sizes: at most 32 sizes\n");
      return DPT_EXIT_USAGE;
    }
    char err[128];
    if (dpt_parse_int(tok, 1, 8192, "--sizes", &sizes[n], err, sizeof err)) {
      fprintf(stderr, "dp bench gemm: %s\n", err);
      return DPT_EXIT_USAGE;
    }
    n++;
  }
  /* the GEMM of the tiers: the default config's backend (the built-in one) */
  dp_config cpu;
  dp_config_default(&cpu);
  /* the peak of the tier in use (avx2 is half of avx512; the scalar tier has none
   * to compare with) */
  const char *tier_now = dp_gemm_tier();
  double peak = strcmp(tier_now, "avx512") == 0 ? measure_peak(1)
                : strcmp(tier_now, "avx2") == 0 ? measure_peak(0)
                                                : 0.0;
  if (json)
    printf("{\"peak_gflops\":%.1f,\"tier\":\"%s\",\"results\":[", peak, dp_gemm_tier());
  else
    printf("sgemm, one thread, tier %s; peak %.1f GFLOP/s\n%8s %12s %10s %8s\n",
           dp_gemm_tier(), peak, "n", "GFLOP/s", "ms", "% peak");
  for (int i = 0; i < n; i++) {
    int s = sizes[i];
    /* the forward layout (C = A . B^T), timed for about 0.3 s: one run to
     * size the count, then the timed runs */
    double ms = 0.0;
    int reps = 1;
    dp_status st = dp_bench_sgemm(cpu.backend, 0, s, s, s, 1, 0, &ms);
    if (st == DP_OK) {
      double want = ms > 0 ? 300.0 / ms : 1e7;
      reps = want < 1 ? 1 : want > 1e7 ? 10000000 : (int)ceil(want);
      st = dp_bench_sgemm(cpu.backend, 0, s, s, s, reps, 0, &ms);
    }
    if (st != DP_OK) {
      fprintf(stderr, "dp bench gemm: %s\n", dpt_user_msg(dp_last_error()));
      return DPT_EXIT_FAIL;
    }
    double gf = ms > 0 ? 2.0 * s * s * (double)s / (ms * 1e-3) / 1e9 : 0.0;
    if (json)
      printf("%s{\"n\":%d,\"gflops\":%.2f,\"ms\":%.4f,\"pct_peak\":%.1f}", i ? "," : "", s,
             gf, ms, peak > 0 ? 100 * gf / peak : 0.0);
    else
      printf("%8d %12.2f %10.4f %7.1f%%\n", s, gf, ms, peak > 0 ? 100 * gf / peak : 0.0);
  }
  if (json) printf("]}\n");
  return DPT_EXIT_OK;
}

/* ---- command ---------------------------------------------------------------------- */

enum {
  OPT_MODEL = DPT_OPT_USER,
  OPT_STEPS,
  OPT_JSON,
  OPT_SIZES,
  OPT_TIER,
  OPT_MAX_BYTES,
  OPT_ITERS,
  OPT_SHM,
  OPT_PROFILE
};

typedef struct {
  const char *model, *sizes, *tier;
  int steps, steps_given, json;
  size_t max_bytes; /* comm: the largest allreduce */
  int iters, shm;   /* comm: allreduces per round (0: about 0.2 s per size); --shm */
  int profile;      /* step: --profile */
} bench_opts;

static int on_option(void *user, int code, const char *arg, char *err, size_t errcap) {
  bench_opts *o = user;
  switch (code) {
  case OPT_MODEL: o->model = arg; return 0;
  case OPT_SIZES: o->sizes = arg; return 0;
  case OPT_TIER: o->tier = arg; return 0;
  case OPT_JSON: o->json = 1; return 0;
  case OPT_SHM: o->shm = 1; return 0;
  case OPT_PROFILE: o->profile = 1; return 0;
  case OPT_ITERS: return dpt_parse_int(arg, 1, 10000000, "--iters", &o->iters, err, errcap);
  case OPT_MAX_BYTES:
    if (dpt_parse_size(arg, &o->max_bytes, err, errcap)) return -1;
    if (o->max_bytes < 8 || o->max_bytes / 4 > INT32_MAX) {
      snprintf(err, errcap, "--max-bytes: %s is out of range (8 B to 8 GiB)", arg);
      return -1;
    }
    return 0;
  case OPT_STEPS:
    o->steps_given = 1;
    return dpt_parse_int(arg, 1, 1000000, "--steps", &o->steps, err, errcap);
  }
  return -1;
}

static void usage(FILE *f) {
  fprintf(
      f, "usage: dp bench peak|gemm|step|comm|rss|scaling|fit-costs|gpu-step|gpu-gemm\n"
         "                [options] [--json]\n\n"
         "  peak                 one core's fp32 FMA peak (AVX-512 and AVX2)\n"
         "  gemm [--sizes LIST] [--tier auto|avx512|avx2|scalar]\n"
         "                       our GEMM (forward layout, n x n x n) vs that peak\n"
         "  step --model M --batch B [--devices N] [--steps K] [--profile]\n"
         "                       [common options]\n"
         "                       ms/step and samples/s of training steps (any model:\n"
         "                       flat or image input, e.g. bench/models/cnn_cifar.dpm),\n"
         "                       K steps (default 20) repeated until 0.3 s have passed;\n"
         "                       --profile: where K steps' time goes, per op class and\n"
         "                       per device's thread, the idle time at barriers (by the\n"
         "                       phase they end) and per layer\n"
         "  comm [--max-bytes SIZE] [--iters N] [--model M] [--batch B] [--steps K]\n"
         "                       under mpirun (mpirun -np 4 dp bench comm): allreduce\n"
         "                       of 1 KiB, 4 KiB, ... SIZE (default 64MiB) across the\n"
         "                       job's ranks, libdp's canonical tree vs MPI_Allreduce\n"
         "                       (us, bus GB/s as nccl-tests counts it, their ratio;\n"
         "                       the best of 3 rounds of N allreduces per size, default\n"
         "                       N: about 0.2 s per size);\n"
         "                       then ms/step on the first 1, 2, 4, ... ranks (layout\n"
         "                       r x 1, allreduce mode, default an MLP 784-1024-1024-10,\n"
         "                       batch 256, K steps) and the parameter hash of each,\n"
         "                       which must be the same (else exit 1). Not under\n"
         "                       mpirun: says how to run it and exits 1\n"
         "  comm --shm           bytes/s of the in-process shared-memory transport\n"
         "  rss --model M --batch B [--steps K]\n"
         "                       resident memory after init and over K steps\n"
         "                       (default 10000): it stays flat\n"
         "  scaling [--model M]  step cost as batch, width and device count grow\n"
         "                       (default: MLPs 64-W-W-10 with W in 64, 256, 1024)\n"
         "  fit-costs            the numbers of dp plan --fit's cost model on this\n"
         "                       machine (GEMM rate and the rows at half of it, copy\n"
         "                       bandwidth, cost per op), as a --fit-costs argument\n"
         "  gpu-step [--model M] [--batch B] [--devices LIST] [--tf32] [common options]\n"
         "                       cuda backend: ms/step and samples/s with and without\n"
         "                       --graph, and the graph's speed-up; 1 and 4 replicas\n"
         "                       on GPU 0 unless --devices is given (default model an\n"
         "                       MLP 1024-4096-4096-1024 with gelu and mse, batch 1024,\n"
         "                       adamw)\n"
         "  gpu-gemm [--model M] [--batch B] [--micro-batch K] [--tf32]\n"
         "                       each GEMM of that model's step (forward y = x W^T,\n"
         "                       backward dW = dy^T x and dx = dy W per linear layer\n"
         "                       and micro-batch; conv2d's three on its im2col matrix)\n"
         "                       timed alone through cuBLAS, summed over a step,\n"
         "                       against the measured step (1 replica)\n"
         "                       The gpu benchmarks print why and exit 0 without a GPU.\n\n"
         "Benchmarks measure; they assert nothing. bench/compare.py runs these\n"
         "side by side with PyTorch and OpenBLAS and prints ratios.\n\n");
  dpt_print_common_help(f);
}

static dp_model *mlp(int in, int w, int out) {
  dp_model *m = NULL;
  if (dp_model_new(in, &m) || dp_model_add_linear(m, w, 1) ||
      dp_model_add(m, DP_LAYER_RELU) || dp_model_add_linear(m, w, 1) ||
      dp_model_add(m, DP_LAYER_RELU) || dp_model_add_linear(m, out, 1) ||
      dp_model_set_loss(m, DP_LOSS_SOFTMAX_CE)) {
    dp_model_free(m);
    return NULL;
  }
  return m;
}

static int bench_scaling(const bench_opts *o, const dp_config *base) {
  static const int widths[] = {64, 256, 1024}, batches[] = {32, 128, 512},
                   devs[] = {1, 2, 4};
  if (o->json)
    printf("{\"results\":[");
  else
    printf("%-22s %6s %7s %10s %12s\n", "model", "batch", "devices", "ms/step",
           "samples/s");
  int first = 1;
  for (int wi = 0; wi < (o->model ? 1 : 3); wi++) {
    dp_model *m = NULL;
    char name[64];
    if (o->model) {
      char err[512];
      if (dpt_load_model(o->model, &m, err, sizeof err)) {
        fprintf(stderr, "dp bench: %s\n", err);
        return DPT_EXIT_FAIL;
      }
      snprintf(name, sizeof name, "%s", o->model);
    } else {
      m = mlp(64, widths[wi], 10);
      snprintf(name, sizeof name, "mlp 64-%d-%d-10", widths[wi], widths[wi]);
    }
    for (int bi = 0; bi < 3; bi++)
      for (int di = 0; di < 3; di++) {
        dp_config c = *base;
        c.batch = batches[bi];
        c.n_devices = devs[di];
        step_result r;
        if (time_steps(m, &c, o->steps, &r)) {
          dp_model_free(m);
          return DPT_EXIT_FAIL;
        }
        if (o->json)
          printf("%s{\"model\":\"%s\",\"batch\":%d,\"devices\":%d,\"ms_per_step\":%.4f,"
                 "\"samples_per_s\":%.0f}",
                 first ? "" : ",", name, c.batch, c.n_devices, r.ms_per_step,
                 r.samples_per_s);
        else
          printf("%-22s %6d %7d %10.4f %12.0f\n", name, c.batch, c.n_devices, r.ms_per_step,
                 r.samples_per_s);
        first = 0;
      }
    dp_model_free(m);
  }
  if (o->json) printf("]}\n");
  return DPT_EXIT_OK;
}

/* ---- comm across processes ------------------------------------------------------- */

#define COMM_MIN_BYTES 1024 /* the first size; then x4 up to --max-bytes */
#define COMM_SIZE_S 0.2     /* aimed seconds per size (tree and MPI_Allreduce together) */
#define COMM_MIN_ITERS 3    /* per size */
#define COMM_ROUNDS 3       /* the best of 3 rounds, where a size has time for them */
#define COMM_MAX_ITERS 20000
#define COMM_WARMUP_STEPS 3
#define COMM_MODEL_NAME "mlp 784-1024-1024-10"
#define COMM_BATCH 256

/* One layout's row of the step scaling (rank 0's numbers). */
typedef struct {
  int ranks;
  double ms, samples_per_s;
  uint64_t hash;
} comm_step_row;

/* Not in an MPI job: how to run it (stderr, exit 1). */
static int comm_how_to_run(const char *why) {
  fprintf(
      stderr,
      "dp bench comm: %s\n"
      "  it times the allreduce between the processes of an MPI job (libdp's canonical\n"
      "  tree vs MPI_Allreduce) and the step time on 1, 2, 4, ... of them;\n"
      "  run it under mpirun: mpirun -np 4 dp bench comm\n"
      "  (dp bench comm --shm: the in-process shared-memory transport, no MPI)\n",
      why);
  return DPT_EXIT_FAIL;
}

#ifdef DP_HAVE_MPI
/* Waits for every rank of comm without spinning: a rank with nothing to do
 * while others time their steps leaves them the cores (a job of more ranks
 * than cores). */
static void quiet_barrier(MPI_Comm comm) {
  MPI_Request req;
  int done = 0;
  if (MPI_Ibarrier(comm, &req) != MPI_SUCCESS) {
    MPI_Barrier(comm);
    return;
  }
  while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
    struct timespec ts = {0, 200000}; /* 0.2 ms */
    nanosleep(&ts, NULL);
  }
}

/* busbw as nccl-tests defines it for an allreduce: 2 (R - 1) / R x bytes / t,
 * in GB/s; 0 for one rank (nothing crosses). */
static double busbw_gbs(int R, size_t bytes, double t) {
  return R > 1 && t > 0 ? 2.0 * (R - 1) / R * (double)bytes / t / 1e9 : 0.0;
}

/* Allreduces (tree and MPI) that take about COMM_SIZE_S when one takes
 * `each` seconds. */
static int comm_iters(double each) {
  double want = each > 0 ? ceil(COMM_SIZE_S / each) : COMM_MAX_ITERS;
  return want < COMM_MIN_ITERS   ? COMM_MIN_ITERS
         : want > COMM_MAX_ITERS ? COMM_MAX_ITERS
                                 : (int)want;
}

/* Part 1: the canonical tree's allreduce vs MPI_Allreduce on MPI_COMM_WORLD,
 * 1 KiB, 4 KiB, ... --max-bytes. Collective. */
static int comm_allreduce(const bench_opts *o, int R, int rank) {
  size_t sizes[64], mx = o->max_bytes & ~(size_t)3;
  int n = 0;
  for (size_t b = mx < COMM_MIN_BYTES ? mx : COMM_MIN_BYTES; n < 64; b *= 4) {
    sizes[n++] = b < mx ? b : mx;
    if (b >= mx) break;
  }
  if (o->json)
    printf("\"allreduce\":[");
  else
    printf("%12s %7s %11s %11s %10s %10s %7s\n", "bytes", "runs", "tree us", "MPI us",
           "tree GB/s", "MPI GB/s", "ratio");
  double prev = 0.0, worst = -1.0; /* seconds of tree + MPI at the previous size */
  for (int i = 0; i < n; i++) {
    double tree = 0.0, mpi = 0.0;
    int iters = o->iters;
    if (!iters) {
      /* about COMM_SIZE_S per size, decided on rank 0: a guess from the
       * previous size scaled by the bytes, checked by a trial of a sixteenth
       * of it (3 allreduces at the first size) unless it is the minimum */
      int trial = 0;
      if (rank == 0) {
        iters = i ? comm_iters(prev * (double)sizes[i] / (double)sizes[i - 1]) : 0;
        trial = !iters ? COMM_MIN_ITERS : iters > 2 * COMM_MIN_ITERS ? iters / 16 : 0;
      }
      MPI_Bcast(&trial, 1, MPI_INT, 0, MPI_COMM_WORLD);
      if (trial) {
        if (dp_mpi_bench_allreduce(MPI_COMM_WORLD, sizes[i], trial, &tree, &mpi)) goto fail;
        iters = comm_iters(tree + mpi);
      }
      MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    /* the best of COMM_ROUNDS rounds of each (a shared machine's noise
     * only ever adds time), unless a size has time for too few allreduces
     * (each round sets up a context of its own); --iters is per round */
    int rounds = COMM_ROUNDS;
    if (!o->iters && iters < COMM_ROUNDS * COMM_MIN_ITERS)
      rounds = 1;
    else if (!o->iters)
      iters = (iters + COMM_ROUNDS - 1) / COMM_ROUNDS;
    for (int k = 0; k < rounds; k++) {
      double tk, mk;
      if (dp_mpi_bench_allreduce(MPI_COMM_WORLD, sizes[i], iters, &tk, &mk)) goto fail;
      tree = k == 0 || tk < tree ? tk : tree;
      mpi = k == 0 || mk < mpi ? mk : mpi;
    }
    prev = tree + mpi;
    double bt = busbw_gbs(R, sizes[i], tree), bm = busbw_gbs(R, sizes[i], mpi);
    /* tree busbw / MPI busbw = MPI time / tree time; none for one rank (the
     * tree moves nothing, MPI_Allreduce copies) */
    double ratio = R > 1 && tree > 0 ? mpi / tree : -1.0;
    if (ratio >= 0 && sizes[i] >= (1u << 20) && (worst < 0 || ratio < worst)) worst = ratio;
    char rs[32] = "-", runs[32];
    snprintf(runs, sizeof runs, "%dx%d", rounds, iters);
    if (ratio >= 0) snprintf(rs, sizeof rs, o->json ? "%.3f" : "%.2f", ratio);
    if (o->json)
      printf("%s{\"bytes\":%zu,\"rounds\":%d,\"iters\":%d,\"tree_us\":%.3f,\"mpi_us\":%.3f,"
             "\"tree_busbw_gbs\":%.3f,\"mpi_busbw_gbs\":%.3f,\"ratio\":%s}",
             i ? "," : "", sizes[i], rounds, iters, tree * 1e6, mpi * 1e6, bt, bm,
             ratio >= 0 ? rs : "null");
    else
      printf("%12zu %7s %11.1f %11.1f %10.3f %10.3f %7s\n", sizes[i], runs, tree * 1e6,
             mpi * 1e6, bt, bm, rs);
    fflush(stdout);
  }
  if (o->json) {
    printf("],\"lowest_ratio_from_1mib\":");
    if (worst >= 0)
      printf("%.3f,", worst);
    else
      printf("null,");
  } else if (worst >= 0) {
    printf("lowest ratio at >= 1 MiB: %.2f (the goal: >= 0.80 on 4 ranks)\n", worst);
  }
  return DPT_EXIT_OK;
fail:
  fprintf(stderr, "dp bench comm: rank %d: %s\n", rank, dpt_user_msg(dp_last_error()));
  return DPT_EXIT_FAIL;
}

/* One layout r x 1 on the communicator sub (the first r ranks): warm-up, then
 * `steps` timed steps between barriers, then the parameter hash. Collective
 * over sub. 0, or -1 with the message printed. */
static int comm_time_layout(const dp_model *m, const dp_config *c, MPI_Comm sub, int steps,
                            const float *x, const void *target, comm_step_row *out) {
  int rank = 0, r0 = 0, nr = 0, in = dp_model_input_width(m);
  size_t tsz = (size_t)dp_model_target_width(m) * 4;
  MPI_Comm_rank(sub, &rank);
  dp_plan *p = NULL;
  dp_ctx *ctx = NULL;
  float loss;
  int rc = -1;
  if (dp_plan_create(m, c, &p) || dp_ctx_create_mpi(p, sub, &ctx) ||
      dp_plan_rank_rows(p, c->batch, rank, &r0, &nr))
    goto done;
  const float *xm = x + (size_t)r0 * in;
  const void *tm = (const char *)target + (size_t)r0 * tsz;
  for (int i = 0; i < COMM_WARMUP_STEPS; i++)
    if (dp_train_step(ctx, c->batch, in, xm, tm, &loss)) goto done;
  MPI_Barrier(sub);
  double t0 = MPI_Wtime();
  for (int i = 0; i < steps; i++)
    if (dp_train_step(ctx, c->batch, in, xm, tm, &loss)) goto done;
  MPI_Barrier(sub);
  double el = MPI_Wtime() - t0;
  out->ranks = c->ranks;
  out->ms = 1e3 * el / steps;
  out->samples_per_s = (double)c->batch * steps / el;
  out->hash = dp_params_hash(ctx);
  rc = 0;
done:
  if (rc)
    fprintf(stderr, "dp bench comm: %d rank%s, rank %d: %s\n", c->ranks,
            c->ranks == 1 ? "" : "s", rank,
            dpt_user_msg(ctx ? dp_ctx_error(ctx) : dp_last_error()));
  dp_ctx_free(ctx);
  dp_plan_free(p);
  return rc;
}

/* Part 2: step time of one model and global batch on the first 1, 2, 4, ...
 * ranks (layout r x 1, allreduce mode, one micro-batch size for all), and the
 * parameter hash of each, which must be one. Collective. */
static int comm_scaling(const bench_opts *o, const dp_config *base,
                        const dpt_common *common, int R, int rank) {
  const char *name = o->model ? o->model : COMM_MODEL_NAME;
  dp_model *m = NULL;
  char err[512];
  if (o->model ? dpt_load_model(o->model, &m, err, sizeof err) ||
                     dpt_require_loss(o->model, m, NULL, err, sizeof err)
               : !(m = mlp(784, 1024, 10))) {
    fprintf(stderr, "dp bench comm: %s\n", o->model ? err : dpt_user_msg(dp_last_error()));
    dp_model_free(m);
    return DPT_EXIT_FAIL;
  }
  int rmax = 1;
  while (rmax * 2 <= R) rmax *= 2;
  dp_config c = *base;
  c.batch = dpt_given(common, DPT_OPT_BATCH) ? base->batch : COMM_BATCH;
  c.mode = DP_MODE_ALLREDUCE;
  /* micro-batches a multiple of the largest layout: the same bits on all */
  if (!dpt_given(common, DPT_OPT_MICRO_BATCH))
    c.micro_batch = c.batch / rmax > 0 ? c.batch / rmax : 1;
  int B = c.batch, in = dp_model_input_width(m), outw = dp_model_output_width(m);
  float *x = malloc((size_t)B * in * 4), *t = malloc((size_t)B * outw * 4);
  int32_t *lab = labels_new(m, B);
  comm_step_row rows[8];
  int n = 0, rc = DPT_EXIT_FAIL;
  if (!x || !t || !lab) {
    fprintf(stderr, "dp bench comm: out of memory\n");
    goto out; /* the job ends (dpt_world_exit aborts it) */
  }
  const void *target = random_batch(m, B, x, t, lab);
  if (o->json) {
    printf("\"scaling\":{\"model\":");
    dpt_json_string(stdout, name);
    printf(",\"batch\":%d,\"micro_batch\":%d,\"optimizer\":\"%s\",\"steps\":%d,"
           "\"results\":[",
           B, c.micro_batch, dp_optimizer_name(c.optimizer), o->steps);
  } else {
    printf("\nstep time on the first r ranks (layout r x 1, allreduce mode, %d steps\n"
           "after %d warm-up): %s, batch %d, micro-batch %d, %s\n",
           o->steps, COMM_WARMUP_STEPS, name, B, c.micro_batch,
           dp_optimizer_name(c.optimizer));
    printf("%6s %10s %12s %9s  %s\n", "ranks", "ms/step", "samples/s", "speed-up",
           "params hash");
  }
  for (int r = 1; r <= R && n < 8; r *= 2) {
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank < r ? 0 : MPI_UNDEFINED, rank, &sub);
    comm_step_row row = {0};
    if (sub != MPI_COMM_NULL) {
      c.n_devices = c.ranks = r;
      int bad = comm_time_layout(m, &c, sub, o->steps, x, target, &row);
      MPI_Comm_free(&sub);
      if (bad) goto out; /* on every rank of sub: the job ends */
    }
    /* the others wait without taking a core */
    quiet_barrier(MPI_COMM_WORLD);
    rows[n++] = row;
    double speedup = row.ms > 0 ? rows[0].ms / row.ms : 0.0;
    if (o->json)
      printf("%s{\"ranks\":%d,\"ms_per_step\":%.4f,\"samples_per_s\":%.0f,\"speedup\":%.3f,"
             "\"params_hash\":\"%016llx\"}",
             n > 1 ? "," : "", r, row.ms, row.samples_per_s, speedup,
             (unsigned long long)row.hash);
    else
      printf("%6d %10.3f %12.0f %8.2fx  %016llx%s\n", r, row.ms, row.samples_per_s, speedup,
             (unsigned long long)row.hash,
             n > 1 && row.hash != rows[0].hash ? "  DIFFERS" : "");
    fflush(stdout);
  }
  /* rank 0 holds every row (it is in every layout); all ranks share the verdict */
  int same = 1;
  for (int i = 1; i < n; i++) same &= rows[i].hash == rows[0].hash;
  MPI_Bcast(&same, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (o->json) {
    printf("],\"hash_match\":%s}}\n", same ? "true" : "false"); /* the end */
  } else if (same) {
    printf("params hash: the same for");
    for (int i = 0; i < n; i++)
      printf("%s %d", i ? (i == n - 1 ? " and" : ",") : "", rows[i].ranks);
    printf(" rank%s\n", n == 1 && rows[0].ranks == 1 ? "" : "s");
  }
  if (!same && rank == 0)
    fprintf(stderr, "dp bench comm: the parameters differ between layouts (hashes above): "
                    "the same steps must give the same bits on any number of ranks\n");
  rc = same ? DPT_EXIT_OK : DPT_EXIT_FAIL;
out:
  free(x);
  free(t);
  free(lab);
  dp_model_free(m);
  return rc;
}
#endif

/* dp bench comm: under mpirun, the allreduce table and the step scaling;
 * --shm: the in-process memcpy; elsewhere, how to run it. */
static int bench_comm(const bench_opts *o, const dp_config *base,
                      const dpt_common *common) {
  if (o->shm) return bench_comm_shm(o->json);
#ifndef DP_HAVE_MPI
  (void)base;
  (void)common;
  return comm_how_to_run("this dp was built without MPI (configure.py found no mpicc and "
                         "mpirun; on Debian: apt-get install openmpi-bin libopenmpi-dev)");
#else
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return comm_how_to_run("not in an MPI job (not launched by mpirun)");
  int R = dpt_world_size(), rank = dpt_world_rank(), cpus = dpt_cpu_count();
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int len = 0;
  MPI_Get_library_version(lib, &len);
  lib[strcspn(lib, ",\n")] = '\0'; /* "Open MPI v4.1.4" */
  if (o->json) {
    printf("{\"bench\":\"comm\",\"mpi\":");
    dpt_json_string(stdout, lib);
    printf(",\"ranks\":%d,\"cpus\":%d,", R, cpus);
  } else {
    printf("dp bench comm: %d rank%s (%s); rank 0 may run on %d CPU%s%s\n", R,
           R == 1 ? "" : "s", lib, cpus, cpus == 1 ? "" : "s",
           R > cpus ? " (fewer than the ranks: on one host they take turns)" : "");
    printf("\nallreduce of float32 across the ranks: libdp's canonical tree (the reduce\n"
           "phase of an allreduce step, one device per rank, persistent MPI requests)\n"
           "vs MPI_Allreduce: us per allreduce, the best of `runs` rounds x allreduces\n"
           "(timed between barriers); busbw = 2 (R-1)/R x bytes / time (nccl-tests);\n"
           "ratio = tree busbw / MPI busbw\n");
  }
  if (!o->json && (R & (R - 1)))
    printf("(%d ranks, not a power of two: the tree's reduce phase is a reduce to rank 0\n"
           "and a copy of each rank's optimizer shard, not a whole allreduce)\n",
           R);
  int rc = comm_allreduce(o, R, rank);
  if (rc == DPT_EXIT_OK) rc = comm_scaling(o, base, common, R, rank);
  return rc;
#endif
}

/* ---- gpu-step, gpu-gemm --------------------------------------------------------- */

/* The default model of the GPU benchmarks (test_cuda.c's timing_report times
 * the same one through the backend alone). */
static const char GPU_MODEL[] =
    "input 1024\nlinear 4096\ngelu\nlinear 4096\ngelu\nlinear 1024\n"
    "loss mse\n";
#define GPU_MODEL_NAME "mlp 1024-4096-4096-1024"
#define GPU_MIN_S 0.5 /* timed seconds per configuration (after the warm-up) */

/* 1 when a backend with devices of its own and a GEMM benchmark is registered
 * (*kind) and its device 0 is there (its name in name[cap]); else prints why
 * the benchmark is skipped (a result, so on stdout) and returns 0. */
static int gpu_or_skip(const char *what, int json, char *name, size_t cap,
                       dp_backend *kind) {
  if (dp_backend_find_caps(DP_BACKEND_CAP_DEVICES | DP_BACKEND_CAP_GEMM_BENCH, kind) ==
          DP_OK &&
      dp_backend_device_count(*kind) > 0 &&
      dp_backend_device_info(*kind, 0, name, cap, NULL, NULL) == DP_OK)
    return 1;
  const char *why = dpt_user_msg(dp_last_error());
  if (json) {
    printf("{\"bench\":\"%s\",\"skipped\":true,\"reason\":", what);
    dpt_json_string(stdout, why);
    printf("}\n");
  } else {
    printf("dp bench %s: skipped, no GPU: %s\n", what, why);
  }
  return 0;
}

/* The model of the GPU benchmarks: --model, or GPU_MODEL. */
static dp_model *gpu_model(const char *path, const char **name) {
  dp_model *m = NULL;
  char err[512];
  if (path ? dpt_load_model(path, &m, err, sizeof err) != 0
           : dp_model_parse(GPU_MODEL, GPU_MODEL_NAME, &m) != DP_OK) {
    fprintf(stderr, "dp bench: %s\n", path ? err : dpt_user_msg(dp_last_error()));
    return NULL;
  }
  *name = path ? path : GPU_MODEL_NAME;
  return m;
}

/* The config of the GPU benchmarks: base (its backend the one gpu_or_skip
 * found), with batch 1024 and AdamW unless given, and `replicas` replicas all
 * on GPU 0 unless --devices was given (replicas == 0). */
static dp_config gpu_config(const dp_config *base, const dpt_common *common, int replicas,
                            int graph) {
  dp_config c = *base;
  /* graph=1 or not, whatever the common options said (the name fits: the
   * options only lose an item) */
  (void)dpt_backend_option_set(&c, "graph", graph ? "1" : NULL, NULL, 0);
  if (!dpt_given(common, DPT_OPT_BATCH)) c.batch = 1024;
  if (!dpt_given(common, DPT_OPT_OPTIMIZER)) dp_config_set_optimizer(&c, DP_OPT_ADAMW);
  if (replicas > 0) {
    c.n_devices = replicas;
    for (int d = 0; d < DP_MAX_DEVICES; d++) c.device_ids[d] = 0;
  }
  return c;
}

static int bench_gpu_step(const bench_opts *o, const dp_config *cfg,
                          const dpt_common *common) {
  char gpu[256];
  dp_config gb = *cfg, *base = &gb;
  if (!gpu_or_skip("gpu-step", o->json, gpu, sizeof gpu, &gb.backend)) return DPT_EXIT_OK;
  const char *name;
  dp_model *m = gpu_model(o->model, &name);
  if (!m) return DPT_EXIT_FAIL;
  /* replicas 1 and 4 on GPU 0, or what --devices says */
  int counts[2] = {1, 4}, n_counts = 2;
  if (dpt_given(common, DPT_OPT_DEVICES)) {
    counts[0] = 0;
    n_counts = 1;
  }
  dp_config c0 = gpu_config(base, common, counts[0], 0);
  int tf32 = dpt_backend_option_on(c0.backend_options, "tf32");
  if (o->json) {
    printf("{\"bench\":\"gpu-step\",\"gpu\":");
    dpt_json_string(stdout, gpu);
    printf(",\"model\":");
    dpt_json_string(stdout, name);
    printf(
        ",\"batch\":%d,\"micro_batch\":%d,\"optimizer\":\"%s\",\"tf32\":%d,\"results\":[",
        c0.batch, c0.micro_batch, dp_optimizer_name(c0.optimizer), tf32);
  } else {
    printf("gpu-step: %s, batch %d, micro-batch %s, %s, %s, on %s\n", name, c0.batch,
           c0.micro_batch ? "given" : "= chunk", dp_optimizer_name(c0.optimizer),
           tf32 ? "tf32" : "fp32", gpu);
    printf("%-22s %6s %10s %12s %6s\n", "replicas (GPU ids)", "graph", "ms/step",
           "samples/s", "steps");
  }
  int failed = 0;
  double ms[2][2] = {{0}};
  for (int i = 0; i < n_counts; i++)
    for (int g = 0; g < 2; g++) {
      dp_config c = gpu_config(base, common, counts[i], g);
      char ids[64] = "", err[DPT_MSG_CAP];
      for (int d = 0, len = 0; d < c.n_devices && len < (int)sizeof ids - 8; d++)
        len += snprintf(ids + len, sizeof ids - (size_t)len, "%s%d", d ? "," : "",
                        c.device_ids[d]);
      step_result r = {0};
      int bad = time_steps_for(m, &c, o->steps, GPU_MIN_S, 1, &r, err, sizeof err);
      failed += bad != 0;
      ms[i][g] = bad ? 0.0 : r.ms_per_step;
      if (o->json) {
        printf("%s{\"replicas\":%d,\"device_ids\":\"%s\",\"graph\":%d,", i + g ? "," : "",
               c.n_devices, ids, g);
        if (bad) {
          printf("\"error\":");
          dpt_json_string(stdout, err);
          printf("}");
        } else {
          printf("\"ms_per_step\":%.4f,\"samples_per_s\":%.0f,\"steps\":%d}", r.ms_per_step,
                 r.samples_per_s, r.steps);
        }
      } else {
        char label[96];
        snprintf(label, sizeof label, "%d (%s)", c.n_devices, ids);
        if (bad)
          printf("%-22s %6s FAILED: %s\n", label, g ? "yes" : "no", err);
        else
          printf("%-22s %6s %10.3f %12.0f %6d\n", label, g ? "yes" : "no", r.ms_per_step,
                 r.samples_per_s, r.steps);
      }
      fflush(stdout);
    }
  /* graph speed-up: plain ms / graph ms, per replica count */
  if (o->json) printf("],\"graph_speedup\":[");
  for (int i = 0; i < n_counts; i++) {
    dp_config c = gpu_config(base, common, counts[i], 0);
    int ok = ms[i][0] > 0 && ms[i][1] > 0;
    if (o->json) {
      printf("%s{\"replicas\":%d,\"speedup\":", i ? "," : "", c.n_devices);
      if (ok)
        printf("%.3f}", ms[i][0] / ms[i][1]);
      else
        printf("null}");
    } else if (ok) {
      printf("graph speed-up, %d replica%s: %.3fx (%.3f -> %.3f ms/step)\n", c.n_devices,
             c.n_devices == 1 ? "" : "s", ms[i][0] / ms[i][1], ms[i][0], ms[i][1]);
    }
  }
  if (o->json) printf("]}\n");
  dp_model_free(m);
  return failed ? DPT_EXIT_FAIL : DPT_EXIT_OK;
}

/* One GEMM of a step: C (m, n) = A (m, k) . B (k, n), `count` times per step. */
typedef struct {
  int layer;
  const char *what; /* "fwd y=xW^T", "bwd dW=dy^Tx", "bwd dx=dyW" */
  int m, n, k, count;
  double ms, tflops;
} gemm_shape;

/* The GEMMs of one training step of m on one replica (cuda/gemm.cu): per
 * linear layer and micro-batch of r rows, forward y = x W^T (r, out, in),
 * dW = dy^T x (out, in, r), and dx = dy W (r, in, out) except for the first
 * layer, whose input needs no gradient. A conv2d layer (cuda/conv.cu, im2col:
 * r images, P output positions, CKK = in channels x K x K taps) runs the same
 * three on COL: forward (r P, out, CKK), dW (out, CKK, r P), dCOL (r P, CKK,
 * out). Returns the number written. */
static int step_gemms(const dp_model *m, int batch, int micro, gemm_shape *g, int cap) {
  int full = batch / micro, rest = batch % micro, n = 0;
  for (int part = 0; part < 2; part++) {
    int rows = part ? rest : micro, count = part ? 1 : full;
    if (rows == 0 || count == 0) continue;
    for (int i = 0; i < dp_model_n_layers(m) && n + 3 <= cap; i++) {
      dp_layer_info l;
      if (dp_model_layer(m, i, &l) != DP_OK) continue;
      if (l.kind == DP_LAYER_LINEAR) {
        g[n++] = (gemm_shape){i, "fwd  y = x W^T", rows, l.out, l.in, count, 0, 0};
        g[n++] = (gemm_shape){i, "bwd dW = dy^T x", l.out, l.in, rows, count, 0, 0};
        if (i > 0)
          g[n++] = (gemm_shape){i, "bwd dx = dy W", rows, l.in, l.out, count, 0, 0};
      } else if (l.kind == DP_LAYER_CONV2D && l.channels > 0) {
        /* the weight is (out, CKK), then out biases when there is a bias */
        int oc = l.channels, ckk = (int)((l.n_params - (l.bias ? (size_t)oc : 0)) / oc);
        long np = (long)rows * l.height * l.width;
        if (np > INT32_MAX) continue; /* not a shape one GEMM call takes */
        g[n++] = (gemm_shape){i, "fwd  T = COL W^T", (int)np, oc, ckk, count, 0, 0};
        g[n++] = (gemm_shape){i, "bwd dW = dY^T COL", oc, ckk, (int)np, count, 0, 0};
        if (i > 0)
          g[n++] = (gemm_shape){i, "bwd dCOL = dY^T W", (int)np, ckk, oc, count, 0, 0};
      }
    }
  }
  return n;
}

static int bench_gpu_gemm(const bench_opts *o, const dp_config *cfg,
                          const dpt_common *common) {
  char gpu[256];
  dp_config gb = *cfg, *base = &gb;
  if (!gpu_or_skip("gpu-gemm", o->json, gpu, sizeof gpu, &gb.backend)) return DPT_EXIT_OK;
  const char *name;
  dp_model *m = gpu_model(o->model, &name);
  if (!m) return DPT_EXIT_FAIL;
  dp_config c = gpu_config(base, common, 1, 0);
  int tf32 = dpt_backend_option_on(c.backend_options, "tf32");
  int micro = c.micro_batch > 0 && c.micro_batch < c.batch ? c.micro_batch : c.batch;
  int cap = 6 * dp_model_n_layers(m) + 3, rc = DPT_EXIT_FAIL;
  gemm_shape *g = malloc((size_t)cap * sizeof *g);
  if (!g) {
    fprintf(stderr, "dp bench gpu-gemm: out of memory\n");
    goto out;
  }
  int n = step_gemms(m, c.batch, micro, g, cap);
  double gemm_ms = 0.0;
  for (int i = 0; i < n; i++) {
    /* the same shape again (another layer): measured once */
    int j = 0;
    while (j < i && !(g[j].m == g[i].m && g[j].n == g[i].n && g[j].k == g[i].k)) j++;
    if (j < i) {
      g[i].ms = g[j].ms;
      g[i].tflops = g[j].tflops;
    } else if (dp_bench_sgemm(c.backend, 0, g[i].m, g[i].n, g[i].k, 50, tf32, &g[i].ms) ==
               DP_OK) {
      g[i].tflops =
          g[i].ms > 0 ? 2.0 * g[i].m * g[i].n * g[i].k / (g[i].ms * 1e-3) / 1e12 : 0;
    } else {
      fprintf(stderr, "dp bench gpu-gemm: sgemm %d x %d x %d: %s\n", g[i].m, g[i].n, g[i].k,
              dpt_user_msg(dp_last_error()));
      goto out;
    }
    gemm_ms += g[i].ms * g[i].count;
  }
  /* the whole step, one replica, plain and as a graph */
  step_result r[2] = {{0}};
  char err[2][DPT_MSG_CAP];
  int bad[2];
  for (int gr = 0; gr < 2; gr++) {
    dp_config cg = gpu_config(base, common, 1, gr);
    bad[gr] =
        time_steps_for(m, &cg, o->steps, GPU_MIN_S, 1, &r[gr], err[gr], sizeof err[gr]);
  }
  if (o->json) {
    printf("{\"bench\":\"gpu-gemm\",\"gpu\":");
    dpt_json_string(stdout, gpu);
    printf(",\"model\":");
    dpt_json_string(stdout, name);
    printf(",\"batch\":%d,\"micro_batch\":%d,\"optimizer\":\"%s\",\"tf32\":%d,\"gemms\":[",
           c.batch, micro, dp_optimizer_name(c.optimizer), tf32);
    for (int i = 0; i < n; i++)
      printf("%s{\"layer\":%d,\"gemm\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"per_step\":%d,"
             "\"ms\":%.4f,\"tflops\":%.2f}",
             i ? "," : "", g[i].layer, g[i].what, g[i].m, g[i].n, g[i].k, g[i].count,
             g[i].ms, g[i].tflops);
    printf("],\"gemm_ms_per_step\":%.4f", gemm_ms);
    for (int gr = 0; gr < 2; gr++) {
      const char *key = gr ? "graph" : "plain";
      if (bad[gr]) {
        printf(",\"%s_error\":", key);
        dpt_json_string(stdout, err[gr]);
      } else {
        printf(",\"%s_ms_per_step\":%.4f,\"%s_step_over_gemm\":%.3f", key,
               r[gr].ms_per_step, key, r[gr].ms_per_step / gemm_ms);
      }
    }
    printf("}\n");
  } else {
    printf("gpu-gemm: %s, batch %d, micro-batch %d, %s, %s, 1 replica on %s\n", name,
           c.batch, micro, dp_optimizer_name(c.optimizer), tf32 ? "tf32" : "fp32", gpu);
    printf(
        "each GEMM of a step alone through cuBLAS (C(m,n) = A(m,k) B(k,n), mean of 50)\n");
    printf("%5s  %-18s %6s %6s %6s %5s %9s %8s %10s\n", "layer", "gemm", "m", "n", "k", "x",
           "ms", "TFLOP/s", "ms/step");
    for (int i = 0; i < n; i++)
      printf("%5d  %-18s %6d %6d %6d %5d %9.4f %8.2f %10.4f\n", g[i].layer, g[i].what,
             g[i].m, g[i].n, g[i].k, g[i].count, g[i].ms, g[i].tflops,
             g[i].ms * g[i].count);
    printf("GEMM-only time per step: %.4f ms\n", gemm_ms);
    for (int gr = 0; gr < 2; gr++) {
      if (bad[gr])
        printf("step (%s): FAILED: %s\n", gr ? "graph" : "plain", err[gr]);
      else
        printf("step (%s): %.4f ms; step time / GEMM-only time = %.3f\n",
               gr ? "graph" : "plain", r[gr].ms_per_step, r[gr].ms_per_step / gemm_ms);
    }
  }
  rc = bad[0] || bad[1] ? DPT_EXIT_FAIL : DPT_EXIT_OK;
out:
  free(g);
  dp_model_free(m);
  return rc;
}

/* ---- fit-costs: the numbers of dp_plan_fit's cost model, measured here ---------- */

/* ms per GEMM of (m, n, k) in the forward layout, timed for about 0.2 s. */
static double gemm_ms(int m, int n, int k) {
  dp_config cpu;
  dp_config_default(&cpu);
  double ms = 0.0;
  if (dp_bench_sgemm(cpu.backend, 0, m, n, k, 1, 0, &ms) != DP_OK) return -1.0;
  int reps = ms > 0 ? (int)ceil(200.0 / ms) : 1000;
  reps = reps < 1 ? 1 : reps > 100000 ? 100000 : reps;
  return dp_bench_sgemm(cpu.backend, 0, m, n, k, reps, 0, &ms) == DP_OK ? ms : -1.0;
}

/* The bf16 GEMM's GFLOP/s at m x n x k (0 when the backend has none). */
static double gemm_bf16_gflops(int m, int n, int k) {
  dp_config cpu;
  dp_config_default(&cpu);
  double ms = 0.0;
  if (dp_bench_gemm_bf16(cpu.backend, 0, m, n, k, 1, &ms) != DP_OK) return 0.0;
  int reps = ms > 0 ? (int)ceil(200.0 / ms) : 1000;
  reps = reps < 1 ? 1 : reps > 100000 ? 100000 : reps;
  if (dp_bench_gemm_bf16(cpu.backend, 0, m, n, k, reps, &ms) != DP_OK || ms <= 0)
    return 0.0;
  return 2.0 * m * n * k / (ms * 1e6);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* gflops: a 256 x 1024 x 1024 GEMM; half_rows: the median over 1..64 rows of
 * r (G / g(r) - 1), which makes G r / (r + h) pass through each; mem_gbs: a
 * 16 MiB copy; op_us: the seed model's step on one device over its ops;
 * bf16_gflops: the bf16 GEMM at 256 x 1024 x 1024. */
static int bench_fit_costs(int json) {
  enum { N = 7, BIG = 1024 };
  double ms = gemm_ms(256, BIG, BIG);
  if (ms <= 0) {
    fprintf(stderr, "dp bench fit-costs: the GEMM did not run: %s\n", dp_last_error());
    return DPT_EXIT_FAIL;
  }
  double G = 2.0 * 256 * BIG * BIG / (ms * 1e6), h[N];
  for (int i = 0; i < N; i++) {
    int r = 1 << i;
    double t = gemm_ms(r, BIG, BIG), g = t > 0 ? 2.0 * r * BIG * BIG / (t * 1e6) : G;
    h[i] = g < G ? r * (G / g - 1.0) : 0.0;
  }
  qsort(h, N, sizeof h[0], cmp_double);
  double mem = copy_gbs(16u << 20);
  if (mem < 0) {
    fprintf(stderr, "dp bench fit-costs: out of memory\n");
    return DPT_EXIT_FAIL;
  }
  dp_model *m = NULL;
  dp_plan *p = NULL;
  dp_config c;
  dp_config_default(&c);
  c.batch = 30; /* one device: the executor's own cost, no other thread to wait for */
  step_result res = {0};
  char err[DPT_MSG_CAP];
  double op_us = -1.0;
  if (dp_model_parse("input 5\nlinear 2\nloss mse\n", "seed", &m) == DP_OK &&
      dp_plan_create(m, &c, &p) == DP_OK &&
      time_steps_for(m, &c, 1000, 0.2, 1, &res, err, sizeof err) == 0)
    op_us = 1e3 * res.ms_per_step / (dp_plan_n_ops(p) / (double)c.n_devices);
  dp_plan_free(p);
  dp_model_free(m);
  if (op_us < 0) op_us = 1.0;
  double B = gemm_bf16_gflops(256, BIG, BIG); /* precision bf16's GEMM */
  if (json)
    printf("{\"gflops\":%.1f,\"half_rows\":%.1f,\"mem_gbs\":%.1f,\"op_us\":%.2f,"
           "\"bf16_gflops\":%.1f}\n",
           G, h[N / 2], mem, op_us, B);
  else
    printf("GEMM %.1f GFLOP/s at 256 rows (tier %s), half of it at %.1f rows; bf16 GEMM "
           "%.1f GFLOP/s; copies %.1f GB/s; %.2f us per op\n--fit-costs gflops=%.1f,"
           "half_rows=%.1f,mem_gbs=%.1f,op_us=%.2f,bf16_gflops=%.1f\n",
           G, dp_gemm_tier(), h[N / 2], B, mem, op_us, G, h[N / 2], mem, op_us, B);
  return DPT_EXIT_OK;
}

int dpt_cmd_bench(int argc, char **argv) {
  static const struct option extra[] = {
      {"model", required_argument, NULL, OPT_MODEL},
      {"steps", required_argument, NULL, OPT_STEPS},
      {"sizes", required_argument, NULL, OPT_SIZES},
      {"tier", required_argument, NULL, OPT_TIER},
      {"json", no_argument, NULL, OPT_JSON},
      {"max-bytes", required_argument, NULL, OPT_MAX_BYTES},
      {"iters", required_argument, NULL, OPT_ITERS},
      {"shm", no_argument, NULL, OPT_SHM},
      {"profile", no_argument, NULL, OPT_PROFILE},
      {0, 0, 0, 0}};
  bench_opts o = {.steps = 20, .max_bytes = 64u << 20};
  dp_config cfg;
  dpt_common common;
  char err[512];
  int r = dpt_parse_args(argc, argv, extra, on_option, &o, &cfg, &common, err, sizeof err);
  if (r == DPT_ARGS_HELP) {
    usage(stdout);
    return DPT_EXIT_OK;
  }
  const char *what = r == DPT_ARGS_OK && common.n_args == 1 ? argv[common.first_arg] : NULL;
  if (r != DPT_ARGS_OK || !what) {
    return dpt_usage_error(
        "bench",
        r != DPT_ARGS_OK ? err
                         : "name one benchmark: peak, gemm, step, comm, rss, scaling, "
                           "fit-costs, gpu-step or gpu-gemm",
        "(see dp bench --help)");
  }
  if (strcmp(what, "peak") == 0) return bench_peak(o.json);
  if (strcmp(what, "comm") == 0) return bench_comm(&o, &cfg, &common);
  if (strcmp(what, "gemm") == 0) return bench_gemm(o.json, o.sizes, o.tier);
  if (strcmp(what, "fit-costs") == 0) return bench_fit_costs(o.json);
  if (strcmp(what, "gpu-step") == 0) return bench_gpu_step(&o, &cfg, &common);
  if (strcmp(what, "gpu-gemm") == 0) return bench_gpu_gemm(&o, &cfg, &common);
  /* the cpu benchmarks with --backend cuda: one clear line when there is no GPU */
  if (dpt_require_backend(&cfg, err, sizeof err)) {
    fprintf(stderr, "dp bench %s: %s\n", what, err);
    return DPT_EXIT_FAIL;
  }
  if (strcmp(what, "scaling") == 0) {
    if (!dpt_given(&common, DPT_OPT_OPTIMIZER)) dp_config_set_optimizer(&cfg, DP_OPT_SGD);
    return bench_scaling(&o, &cfg);
  }
  if (strcmp(what, "step") == 0 || strcmp(what, "rss") == 0) {
    if (!o.model || !dpt_given(&common, DPT_OPT_BATCH)) {
      char cmd[32];
      snprintf(cmd, sizeof cmd, "bench %s", what);
      return dpt_usage_error(cmd, "--model and --batch are required", NULL);
    }
    dp_model *m = NULL;
    char lerr[512];
    if (dpt_load_model(o.model, &m, lerr, sizeof lerr)) {
      fprintf(stderr, "dp bench: %s\n", lerr);
      return DPT_EXIT_FAIL;
    }
    dpt_warn_oversubscribed(stderr, "dp bench", cfg.n_devices, cfg.backend,
                            dpt_cpu_count());
    if (strcmp(what, "rss") == 0) {
      int rc = bench_rss(m, &cfg, o.steps_given ? o.steps : 10000, o.json);
      dp_model_free(m);
      return rc;
    }
    if (o.profile) {
      int rc = profile_steps(o.model, m, &cfg, o.steps, o.json);
      dp_model_free(m);
      return rc;
    }
    step_result res;
    int bad = time_steps(m, &cfg, o.steps, &res);
    dp_model_free(m);
    if (bad) return DPT_EXIT_FAIL;
    if (o.json)
      printf(
          "{\"model\":\"%s\",\"batch\":%d,\"devices\":%d,\"optimizer\":\"%s\",\"steps\":%d,"
          "\"ms_per_step\":%.5f,\"samples_per_s\":%.0f}\n",
          o.model, cfg.batch, cfg.n_devices, dp_optimizer_name(cfg.optimizer), res.steps,
          res.ms_per_step, res.samples_per_s);
    else {
      printf("%s, batch %d, %d device(s), %s: %.4f ms/step, %.0f samples/s (%d steps)\n",
             o.model, cfg.batch, cfg.n_devices, dp_optimizer_name(cfg.optimizer),
             res.ms_per_step, res.samples_per_s, res.steps);
      /* the whole configuration, so that runs of another mode, precision or backend
       * option are told apart */
      printf("config  ");
      dpt_print_config(stdout, &cfg);
      printf("\n");
    }
    return DPT_EXIT_OK;
  }
  snprintf(err, sizeof err,
           "unknown benchmark '%s' (peak, gemm, step, comm, rss, scaling, fit-costs, "
           "gpu-step, gpu-gemm)",
           what);
  return dpt_usage_error("bench", err, NULL);
}
