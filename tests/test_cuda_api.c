/* The CUDA backend through the public API only (dp_plan_create, dp_ctx_create,
 * dp_train_step, dp_forward, parameters, checkpoints), on GPU 0, against the
 * cpu backend: what a user of libdp sees. tests/test_cuda.c tests the backend
 * below the context.
 *
 * Every test is tagged "gpu". Where dp_cuda_device_count() is 0 (no GPU, no
 * driver, or a build without CUDA) each prints
 *   SKIP cuda_api: <test>: no GPU (<reason>)
 * to stderr and passes; tests/gpu/run.sh counts those lines as failures on
 * the GPU machine. CUDA is touched only inside tests, which Check runs in
 * forked children. Replicas all sit on GPU 0 (device_ids 0,0,...): the lent
 * machine has one GPU. */
#include "dp.h"
#include "specs.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 1 when there is a GPU; else prints the visible skip line and returns 0. */
static int gpu_or_skip(const char *test) {
  if (dp_cuda_device_count() > 0) return 1;
  fprintf(stderr, "SKIP cuda_api: %s: no GPU (%s)\n", test, dp_last_error());
  return 0;
}
#define REQUIRE_GPU(test)                                                                  \
  if (!gpu_or_skip(test)) return

/* Every layer kind, both losses: MLP_EVERY_KIND_SPEC (tests/specs.h) and SPEC_MSE. */
static const char SPEC_MSE[] = "input 9\n"
                               "linear 20\nrelu\ndropout 0.1\n"
                               "linear 12 nobias\nlayernorm\ntanh\n"
                               "linear 7\nsigmoid\n"
                               "linear 3\ngelu\n"
                               "loss mse\n";

/* ---- helpers ------------------------------------------------------------------- */

/* A plan and a context of one model and config. */
typedef struct {
  dp_model *m;
  dp_plan *p;
  dp_ctx *c;
  int in, out, ce;
  size_t np;
} run;

static void run_open(run *r, const char *spec, const dp_config *cfg, const char *what) {
  memset(r, 0, sizeof *r);
  ck_assert_int_eq(dp_model_parse(spec, "model", &r->m), DP_OK);
  ck_assert_msg(dp_plan_create(r->m, cfg, &r->p) == DP_OK, "%s: plan: %s", what,
                dp_last_error());
  ck_assert_msg(dp_ctx_create(r->p, &r->c) == DP_OK, "%s: context: %s", what,
                dp_last_error());
  r->in = dp_model_input_width(r->m);
  r->out = dp_model_output_width(r->m);
  r->ce = dp_model_loss(r->m) == DP_LOSS_SOFTMAX_CE;
  r->np = dp_model_n_params(r->m);
}

static void run_close(run *r) {
  dp_ctx_free(r->c);
  dp_plan_free(r->p);
  dp_model_free(r->m);
  memset(r, 0, sizeof *r);
}

/* The config of a test: `n` replicas, all on GPU 0 for cuda. */
static dp_config config(dp_backend b, int batch, int n, dp_mode mode, dp_optimizer opt) {
  dp_config c;
  dp_config_default(&c);
  c.backend = b;
  c.batch = batch;
  c.n_devices = n;
  if (b == DP_BACKEND_CUDA)
    for (int d = 0; d < DP_MAX_DEVICES; d++) c.device_ids[d] = 0;
  c.mode = mode;
  dp_config_set_optimizer(&c, opt);
  int adam = opt == DP_OPT_ADAMW || opt == DP_OPT_ADAM;
  c.lr = adam ? 0.003f : 0.05f;
  c.seed = 11;
  /* AdamW's update lr * m / (sqrt(v) + eps) is about lr * sign(g) for |g| >> eps:
   * a gradient at rounding-noise level whose sign differs between the GPU and
   * the CPU would move a parameter by 2 lr. With eps well above that noise the
   * update is continuous in g, so the cpu comparison measures real error. */
  if (adam) c.eps = 1e-3f;
  return c;
}

static dp_config as_cpu(dp_config c) {
  c.backend = DP_BACKEND_CPU;
  c.cuda_graph = 0;
  c.tf32 = 0;
  c.transport = DP_TRANSPORT_AUTO;
  for (int d = 0; d < DP_MAX_DEVICES; d++) c.device_ids[d] = d;
  return c;
}

/* A batch of the tests' own random numbers (an LCG), one per step. */
typedef struct {
  float *x, *y; /* (rows, in) inputs, (rows, out) mse targets */
  int32_t *lab; /* (rows) class labels */
} batch;

/* A sequence model (here GPT_SPEC's vocabulary): token ids, a label per position. */
static void batch_make(batch *b, const run *r, int rows, uint64_t step) {
  int P = dp_model_positions(r->m);
  b->x = malloc((size_t)rows * r->in * sizeof *b->x);
  b->y = malloc((size_t)rows * r->out * sizeof *b->y);
  b->lab = malloc((size_t)rows * P * sizeof *b->lab);
  ck_assert(b->x && b->y && b->lab);
  uint64_t s = 0x9e3779b97f4a7c15ull * (step + 1);
  for (size_t i = 0; i < (size_t)rows * r->in; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    b->x[i] =
        P > 1 ? (float)((s >> 40) % GPT_V) : (float)((s >> 40) & 0xffff) / 32768.0f - 1.0f;
  }
  for (size_t i = 0; i < (size_t)rows * r->out; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    b->y[i] = (float)((s >> 40) & 0xffff) / 65536.0f;
  }
  for (int i = 0; i < rows * P; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    b->lab[i] = (int32_t)((s >> 33) % (uint64_t)(r->out / P));
  }
}

static void batch_free(batch *b) {
  free(b->x);
  free(b->y);
  free(b->lab);
}

static const void *targets(const run *r, const batch *b) {
  return r->ce ? (const void *)b->lab : (const void *)b->y;
}

/* One training step of `rows` rows of step `step`'s batch; returns the loss. */
static float step(run *r, int rows, uint64_t data_step, const char *what) {
  batch b;
  batch_make(&b, r, rows, data_step);
  float loss = NAN;
  dp_status s = dp_train_step(r->c, rows, r->in, b.x, targets(r, &b), &loss);
  ck_assert_msg(s == DP_OK, "%s: step %llu (%d rows): %s: %s", what,
                (unsigned long long)data_step, rows, dp_status_name(s), dp_ctx_error(r->c));
  batch_free(&b);
  return loss;
}

static float *params_of(run *r) {
  float *w = malloc((r->np ? r->np : 1) * sizeof *w);
  ck_assert_ptr_nonnull(w);
  ck_assert_msg(dp_get_params(r->c, w, r->np) == DP_OK, "%s", dp_ctx_error(r->c));
  return w;
}

/* cuda `a` against cpu `b`: every |a - b| <= tol * max(|b|, mean |b|). */
static void expect_close(const float *a, const float *b, size_t n, double tol,
                         const char *what) {
  double mean = 0.0;
  for (size_t i = 0; i < n; i++) mean += fabs((double)b[i]);
  mean = n ? mean / (double)n : 0.0;
  double worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    double scale = fmax(fabs((double)b[i]), mean);
    double rel = scale > 0 ? d / scale : d;
    if (!(rel <= worst)) { /* NaN counts as worst */
      worst = rel;
      at = i;
      if (isnan(rel)) break;
    }
  }
  ck_assert_msg(worst <= tol,
                "%s: element %zu of %zu: cuda %.9g, cpu %.9g (relative %.3g > %.0e; mean "
                "|cpu| %.3g)",
                what, at, n, (double)a[at], (double)b[at], worst, tol, mean);
}

static void expect_loss_close(float cuda, float cpu, const char *what, int s) {
  double scale = fmax(fmax(fabs((double)cpu), fabs((double)cuda)), 1e-6);
  ck_assert_msg(fabs((double)cuda - (double)cpu) <= 1e-5 * scale,
                "%s: step %d: loss cuda %.9g, cpu %.9g (relative %.3g > 1e-5)", what, s,
                (double)cuda, (double)cpu, fabs((double)cuda - (double)cpu) / scale);
}

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* ---- tests ------------------------------------------------------------------------ */

/* Parameters are initialised on the host from the seed: the same bits on
 * both backends. */
START_TEST(initial_parameters_are_the_cpu_ones) {
  REQUIRE_GPU("initial_parameters_are_the_cpu_ones");
  const char *specs[2] = {MLP_EVERY_KIND_SPEC, SPEC_MSE};
  for (int i = 0; i < 2; i++) {
    dp_config g = config(DP_BACKEND_CUDA, 8, 2, DP_MODE_CLASSIC, DP_OPT_ADAMW);
    dp_config c = as_cpu(g);
    run rg, rc;
    run_open(&rg, specs[i], &g, "cuda");
    run_open(&rc, specs[i], &c, "cpu");
    float *wg = params_of(&rg), *wc = params_of(&rc);
    ck_assert_msg(memcmp(wg, wc, rc.np * 4) == 0, "model %d: initial parameters differ", i);
    ck_assert_uint_eq(dp_params_hash(rg.c), dp_params_hash(rc.c));
    free(wg);
    free(wc);
    run_close(&rg);
    run_close(&rc);
  }
}
END_TEST

/* 5 steps, cuda against cpu, from the same parameters: every loss within
 * 1e-5, the parameters after within 1e-4 (both relative). Covers every layer
 * kind, both losses, SGD (with weight decay), momentum, AdamW and Adam (their
 * momentum or beta1 set before each step: dp_set_momentum), classic and
 * allreduce (sharded too), 1 to 4 replicas, fixed and per-device micro-batches,
 * a short batch. */
START_TEST(training_matches_cpu) {
  REQUIRE_GPU("training_matches_cpu");
  static const struct {
    const char *name, *spec;
    dp_optimizer opt;
    dp_mode mode;
    int n, batch, micro, shard;
    float wd;
  } cases[] = {
      {"ce adamw classic 2", MLP_EVERY_KIND_SPEC, DP_OPT_ADAMW, DP_MODE_CLASSIC, 2, 24, 0,
       0, -1},
      {"mse sgd+wd allreduce 3 micro 4", SPEC_MSE, DP_OPT_SGD, DP_MODE_ALLREDUCE, 3, 25, 4,
       0, 0.01f},
      {"ce momentum allreduce sharded 4 micro 4", MLP_EVERY_KIND_SPEC, DP_OPT_MOMENTUM,
       DP_MODE_ALLREDUCE, 4, 32, 4, 1, -1},
      {"mse adamw classic 1", SPEC_MSE, DP_OPT_ADAMW, DP_MODE_CLASSIC, 1, 17, 0, 0, -1},
      {"mse momentum classic 4", SPEC_MSE, DP_OPT_MOMENTUM, DP_MODE_CLASSIC, 4, 30, 0, 0,
       -1},
      {"ce sgd allreduce 2 micro 3", MLP_EVERY_KIND_SPEC, DP_OPT_SGD, DP_MODE_ALLREDUCE, 2,
       18, 3, 0, -1},
      {"ce adam+wd allreduce sharded 4 micro 4", MLP_EVERY_KIND_SPEC, DP_OPT_ADAM,
       DP_MODE_ALLREDUCE, 4, 32, 4, 1, 0.01f},
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    dp_config g =
        config(DP_BACKEND_CUDA, cases[k].batch, cases[k].n, cases[k].mode, cases[k].opt);
    g.micro_batch = cases[k].micro;
    g.shard_optimizer = cases[k].shard;
    if (cases[k].wd >= 0) g.weight_decay = cases[k].wd;
    dp_config c = as_cpu(g);
    run rg, rc;
    run_open(&rg, cases[k].spec, &g, cases[k].name);
    run_open(&rc, cases[k].spec, &c, cases[k].name);
    float *w0 = params_of(&rc);
    ck_assert_msg(dp_set_params(rg.c, w0, rg.np) == DP_OK, "%s", dp_ctx_error(rg.c));
    free(w0);
    for (int s = 0; s < 5; s++) {
      int rows = s == 3 ? cases[k].batch - 5 : cases[k].batch; /* one short batch */
      if (cases[k].opt != DP_OPT_SGD) { /* a momentum (beta1) of each step's own */
        float m = 0.5f + 0.1f * (float)s;
        ck_assert_msg(dp_set_momentum(rg.c, m) == DP_OK, "%s", dp_ctx_error(rg.c));
        ck_assert_int_eq(dp_set_momentum(rc.c, m), DP_OK);
      }
      float lg = step(&rg, rows, (uint64_t)s, cases[k].name);
      float lc = step(&rc, rows, (uint64_t)s, cases[k].name);
      expect_loss_close(lg, lc, cases[k].name, s);
    }
    ck_assert_uint_eq(dp_ctx_step(rg.c), 5);
    float *wg = params_of(&rg), *wc = params_of(&rc);
    char what[128];
    snprintf(what, sizeof what, "%s: parameters after 5 steps", cases[k].name);
    expect_close(wg, wc, rc.np, 1e-4, what);
    free(wg);
    free(wc);
    run_close(&rg);
    run_close(&rc);
  }
}
END_TEST

/* Two contexts, the same 10 steps: the same bits, every loss and every
 * parameter. */
START_TEST(run_to_run_bit_identical) {
  REQUIRE_GPU("run_to_run_bit_identical");
  for (int graph = 0; graph < 2; graph++) {
    dp_config g = config(DP_BACKEND_CUDA, 32, 2, DP_MODE_ALLREDUCE, DP_OPT_ADAMW);
    g.cuda_graph = graph;
    run a, b;
    run_open(&a, MLP_EVERY_KIND_SPEC, &g, "first");
    run_open(&b, MLP_EVERY_KIND_SPEC, &g, "second");
    for (int s = 0; s < 10; s++) {
      float la = step(&a, 32, (uint64_t)s, "first"),
            lb = step(&b, 32, (uint64_t)s, "second");
      ck_assert_msg(bits_of(la) == bits_of(lb), "graph %d, step %d: loss %.9g then %.9g",
                    graph, s, (double)la, (double)lb);
    }
    uint64_t ha = dp_params_hash(a.c), hb = dp_params_hash(b.c);
    ck_assert_msg(ha == hb, "graph %d: parameter hash %016llx then %016llx", graph,
                  (unsigned long long)ha, (unsigned long long)hb);
    run_close(&a);
    run_close(&b);
  }
}
END_TEST

/* The headline property on the GPU, through the context: with a fixed
 * micro-batch, 1, 2 and 4 replicas (all on GPU 0), classic, allreduce and
 * sharded give the same parameter bits (test_determinism.c's check on cpu). */
START_TEST(same_bits_for_1_2_4_replicas_and_every_mode) {
  REQUIRE_GPU("same_bits_for_1_2_4_replicas_and_every_mode");
  enum { B = 64, MB = 8, STEPS = 10 };
  static const int counts[] = {1, 2, 4};
  static const struct {
    const char *name;
    dp_mode mode;
    int shard;
  } modes[] = {{"classic", DP_MODE_CLASSIC, 0},
               {"allreduce", DP_MODE_ALLREDUCE, 0},
               {"allreduce+sharded", DP_MODE_ALLREDUCE, 1}};
  uint64_t ref = 0;
  for (int mi = 0; mi < 3; mi++)
    for (int ci = 0; ci < 3; ci++) {
      dp_config g = config(DP_BACKEND_CUDA, B, counts[ci], modes[mi].mode, DP_OPT_ADAMW);
      g.micro_batch = MB;
      g.shard_optimizer = modes[mi].shard;
      run r;
      run_open(&r, MLP_EVERY_KIND_SPEC, &g, modes[mi].name);
      for (int s = 0; s < STEPS; s++) /* every fifth step short */
        step(&r, s % 5 == 4 ? B - 3 * MB - 5 : B, (uint64_t)s, modes[mi].name);
      uint64_t h = dp_params_hash(r.c);
      if (mi == 0 && ci == 0) ref = h;
      ck_assert_msg(h == ref, "%d replicas, %s: hash %016llx; 1 replica classic: %016llx",
                    counts[ci], modes[mi].name, (unsigned long long)h,
                    (unsigned long long)ref);
      run_close(&r);
    }
}
END_TEST

/* nn.CrossEntropyLoss's options (label smoothing, class weights, ignore_index
 * on about a third of the labels): the cpu backend's losses and parameters,
 * and one set of bits on 1, 2 and 4 replicas in every mode, with and without
 * a graph (the denominator is a per-step scalar a replay reads). */
static const char CE_OPTS[] =
    "input 12\nlinear 16\nrelu\nlinear 5\n"
    "loss softmax_cross_entropy label_smoothing 0.1 ignore_index -1 "
    "weight 1,2,0.5,0,1.5\n";

static float ce_step(run *r, int rows, uint64_t data_step, const char *what) {
  batch b;
  batch_make(&b, r, rows, data_step);
  for (int i = 0; i < rows; i += 3) b.lab[i] = -1;
  float loss = NAN;
  dp_status s = dp_train_step(r->c, rows, r->in, b.x, b.lab, &loss);
  ck_assert_msg(s == DP_OK, "%s: step %llu: %s", what, (unsigned long long)data_step,
                dp_ctx_error(r->c));
  batch_free(&b);
  return loss;
}

START_TEST(ce_options_match_cpu_and_same_bits_everywhere) {
  REQUIRE_GPU("ce_options_match_cpu_and_same_bits_everywhere");
  enum { B = 32, MB = 4, STEPS = 6 };
  static const int counts[] = {1, 2, 4};
  uint64_t ref = 0;
  float ref_loss = 0.0f;
  for (int mode = 0; mode < 2; mode++)
    for (int ci = 0; ci < 3; ci++)
      for (int graph = 0; graph < 2; graph++) {
        dp_config g = config(DP_BACKEND_CUDA, B, counts[ci], (dp_mode)mode, DP_OPT_ADAMW);
        g.micro_batch = MB;
        g.cuda_graph = graph;
        dp_config c = as_cpu(g);
        run rg, rc;
        run_open(&rg, CE_OPTS, &g, "cuda");
        run_open(&rc, CE_OPTS, &c, "cpu");
        float lg = 0.0f;
        for (int s = 0; s < STEPS; s++) {
          int rows = s == 3 ? B - 5 : B;
          lg = ce_step(&rg, rows, (uint64_t)s, "cuda");
          expect_loss_close(lg, ce_step(&rc, rows, (uint64_t)s, "cpu"), "ce options", s);
        }
        float *wg = params_of(&rg), *wc = params_of(&rc);
        expect_close(wg, wc, rc.np, 1e-4, "ce options: parameters");
        free(wg), free(wc);
        uint64_t h = dp_params_hash(rg.c);
        if (!ref) ref = h, ref_loss = lg;
        ck_assert_msg(h == ref && bits_of(lg) == bits_of(ref_loss),
                      "%d replicas, mode %d, graph %d: hash %016llx loss %.9g; first: "
                      "%016llx %.9g",
                      counts[ci], mode, graph, (unsigned long long)h, (double)lg,
                      (unsigned long long)ref, (double)ref_loss);
        run_close(&rg);
        run_close(&rc);
      }
}
END_TEST

/* A captured step replayed (cuda_graph 1) gives the bits of plain execution:
 * 20 steps with dropout, new parameters set half-way (replicas must see
 * them), a momentum (beta1) set before each step from the sixth on, and a
 * short batch (which runs plain) in between. */
START_TEST(graph_replay_equals_plain_execution) {
  REQUIRE_GPU("graph_replay_equals_plain_execution");
  static const struct {
    const char *name;
    dp_mode mode;
    dp_optimizer opt;
    int n;
  } cases[] = {{"allreduce adamw 2", DP_MODE_ALLREDUCE, DP_OPT_ADAMW, 2},
               {"classic momentum 3", DP_MODE_CLASSIC, DP_OPT_MOMENTUM, 3}};
  enum { B = 30 };
  for (int k = 0; k < 2; k++) {
    dp_config g = config(DP_BACKEND_CUDA, B, cases[k].n, cases[k].mode, cases[k].opt);
    run plain, graph;
    run_open(&plain, MLP_EVERY_KIND_SPEC, &g, "plain");
    g.cuda_graph = 1;
    run_open(&graph, MLP_EVERY_KIND_SPEC, &g, "graph");
    for (int s = 0; s < 20; s++) {
      if (s == 10) { /* new parameters on both: scaled by 0.75 */
        float *w = params_of(&plain);
        for (size_t i = 0; i < plain.np; i++) w[i] *= 0.75f;
        ck_assert_int_eq(dp_set_params(plain.c, w, plain.np), DP_OK);
        ck_assert_msg(dp_set_params(graph.c, w, graph.np) == DP_OK, "%s",
                      dp_ctx_error(graph.c));
        free(w);
      }
      int rows = s == 15 ? B - 7 : B;
      if (s >= 5) { /* a per-step scalar, as the rate: the replays must see it */
        float m = 0.95f - 0.02f * (float)s;
        ck_assert_int_eq(dp_set_momentum(plain.c, m), DP_OK);
        ck_assert_msg(dp_set_momentum(graph.c, m) == DP_OK, "%s", dp_ctx_error(graph.c));
      }
      float lp = step(&plain, rows, (uint64_t)s, "plain");
      float lg = step(&graph, rows, (uint64_t)s, "graph");
      ck_assert_msg(bits_of(lp) == bits_of(lg), "%s: step %d: loss plain %.9g, graph %.9g",
                    cases[k].name, s, (double)lp, (double)lg);
    }
    float *wp = params_of(&plain), *wg = params_of(&graph);
    size_t first = 0;
    while (first < plain.np && bits_of(wp[first]) == bits_of(wg[first])) first++;
    ck_assert_msg(first == plain.np, "%s: parameter %zu differs: plain %.9g, graph %.9g",
                  cases[k].name, first, (double)wp[first < plain.np ? first : 0],
                  (double)wg[first < plain.np ? first : 0]);
    free(wp);
    free(wg);
    ck_assert_uint_eq(dp_ctx_step(graph.c), 20);
    run_close(&plain);
    run_close(&graph);
  }
}
END_TEST

/* dp_forward on cuda against cpu, from the same parameters: within 1e-5, at
 * the planned batch and short ones (the last replicas get fewer rows or
 * none); a training context and an inference plan. */
START_TEST(forward_matches_cpu) {
  REQUIRE_GPU("forward_matches_cpu");
  static const struct {
    const char *name, *spec;
    int inference, n;
    dp_split split;
  } cases[] = {
      {"ce training context, 4 replicas", MLP_EVERY_KIND_SPEC, 0, 4, DP_SPLIT_CHUNK},
      {"mse inference plan, 3 replicas balanced", SPEC_MSE, 1, 3, DP_SPLIT_BALANCED}};
  enum { B = 29 };
  static const int rows_list[] = {B, B - 1, 8, 1};
  for (int k = 0; k < 2; k++) {
    dp_config g = config(DP_BACKEND_CUDA, B, cases[k].n, DP_MODE_CLASSIC, DP_OPT_SGD);
    g.inference = cases[k].inference;
    g.split = cases[k].split;
    dp_config c = as_cpu(g);
    run rg, rc;
    run_open(&rg, cases[k].spec, &g, cases[k].name);
    run_open(&rc, cases[k].spec, &c, cases[k].name);
    float *w = params_of(&rc);
    ck_assert_int_eq(dp_set_params(rg.c, w, rg.np), DP_OK);
    free(w);
    float *yg = malloc((size_t)B * rg.out * 4), *yc = malloc((size_t)B * rg.out * 4);
    ck_assert(yg && yc);
    for (int i = 0; i < 4; i++) {
      int rows = rows_list[i];
      batch b;
      batch_make(&b, &rg, rows, (uint64_t)(100 + i));
      for (size_t j = 0; j < (size_t)B * rg.out; j++) yg[j] = yc[j] = NAN;
      ck_assert_msg(dp_forward(rg.c, rows, rg.in, b.x, yg) == DP_OK, "%s, %d rows: %s",
                    cases[k].name, rows, dp_ctx_error(rg.c));
      ck_assert_msg(dp_forward(rc.c, rows, rc.in, b.x, yc) == DP_OK, "%s",
                    dp_ctx_error(rc.c));
      char what[128];
      snprintf(what, sizeof what, "%s, forward of %d rows", cases[k].name, rows);
      expect_close(yg, yc, (size_t)rows * rg.out, 1e-5, what);
      for (size_t j = (size_t)rows * rg.out; j < (size_t)B * rg.out; j++)
        ck_assert_msg(isnan(yg[j]), "%s: wrote past the %d rows asked for", what, rows);
      batch_free(&b);
    }
    free(yg);
    free(yc);
    run_close(&rg);
    run_close(&rc);
  }
}
END_TEST

/* A NaN in the input: DP_ERR_NONFINITE, nothing applied (parameters the same
 * bits, the step counter the same), and the next steps equal a twin context
 * that never saw the bad batch (so the optimizer state is untouched too);
 * plain and replayed from a graph. */
START_TEST(nonfinite_input_is_refused_and_changes_nothing) {
  REQUIRE_GPU("nonfinite_input_is_refused_and_changes_nothing");
  enum { B = 24 };
  for (int graph = 0; graph < 2; graph++) {
    dp_config g = config(DP_BACKEND_CUDA, B, 2, DP_MODE_ALLREDUCE, DP_OPT_ADAMW);
    g.cuda_graph = graph;
    run r, twin;
    run_open(&r, MLP_EVERY_KIND_SPEC, &g, "refusing");
    run_open(&twin, MLP_EVERY_KIND_SPEC, &g, "twin");
    for (int s = 0; s < 3; s++) { /* a graph is captured by now */
      step(&r, B, (uint64_t)s, "refusing");
      step(&twin, B, (uint64_t)s, "twin");
    }
    float *before = params_of(&r);
    batch b;
    batch_make(&b, &r, B, 99);
    b.x[5 * r.in + 3] = NAN;
    float loss = 0;
    dp_status s = dp_train_step(r.c, B, r.in, b.x, b.lab, &loss);
    ck_assert_msg(s == DP_ERR_NONFINITE, "graph %d: NaN input gave %s: %s", graph,
                  dp_status_name(s), dp_ctx_error(r.c));
    ck_assert_msg(strstr(dp_ctx_error(r.c), "NaN") || strstr(dp_ctx_error(r.c), "infinite"),
                  "graph %d: the message does not say what was not finite: %s", graph,
                  dp_ctx_error(r.c));
    batch_free(&b);
    float *after = params_of(&r);
    ck_assert_msg(memcmp(before, after, r.np * 4) == 0,
                  "graph %d: a refused step changed "
                  "the parameters",
                  graph);
    ck_assert_uint_eq(dp_ctx_step(r.c), 3);
    free(before);
    free(after);
    for (int k = 3; k < 6; k++) {
      float a = step(&r, B, (uint64_t)k, "refusing"),
            t = step(&twin, B, (uint64_t)k, "twin");
      ck_assert_msg(bits_of(a) == bits_of(t),
                    "graph %d, step %d after the refusal: loss %.9g, "
                    "twin %.9g",
                    graph, k, (double)a, (double)t);
    }
    ck_assert_msg(dp_params_hash(r.c) == dp_params_hash(twin.c),
                  "graph %d: the refused step left a trace (optimizer state?)", graph);
    run_close(&r);
    run_close(&twin);
  }
}
END_TEST

/* A plan larger than the GPU: dp_ctx_create refuses it before allocating,
 * naming the device and the bytes planned and free; no context; the GPU
 * stays usable. (Planning is arithmetic: a huge batch plans anywhere.) */
START_TEST(arena_larger_than_free_memory_is_refused) {
  REQUIRE_GPU("arena_larger_than_free_memory_is_refused");
  /* narrow input and output (small host staging), a wide hidden layer: about
   * 2 MiB of device arena per row, 4 TiB at this batch */
  static const char spec[] = "input 4\nlinear 65536\nrelu\nlinear 4\nloss mse\n";
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse(spec, "huge", &m), DP_OK);
  dp_config g = config(DP_BACKEND_CUDA, 1 << 21, 1, DP_MODE_CLASSIC, DP_OPT_SGD);
  dp_plan *p = NULL;
  ck_assert_msg(dp_plan_create(m, &g, &p) == DP_OK, "%s", dp_last_error());
  size_t planned = dp_plan_device_bytes(p, 0);
  ck_assert_msg(planned > ((size_t)1 << 40), "the plan is only %zu bytes", planned);
  ck_assert_uint_lt(dp_plan_host_bytes(p), (size_t)1 << 30);
  dp_ctx *c = (dp_ctx *)&c;
  dp_status s = dp_ctx_create(p, &c);
  ck_assert_msg(s == DP_ERR_NOMEM, "gave %s: %s", dp_status_name(s), dp_last_error());
  ck_assert_ptr_null(c);
  const char *msg = dp_last_error();
  char want[64];
  snprintf(want, sizeof want, "%zu bytes", planned);
  ck_assert_msg(strstr(msg, "device 0"), "no 'device 0' in: %s", msg);
  ck_assert_msg(strstr(msg, want), "no '%s' (the planned bytes) in: %s", want, msg);
  ck_assert_msg(strstr(msg, "free"), "no free bytes in: %s", msg);
  dp_plan_free(p);
  dp_model_free(m);
  /* the refusal allocated nothing that stays: a real context still works */
  dp_config ok = config(DP_BACKEND_CUDA, 8, 2, DP_MODE_CLASSIC, DP_OPT_SGD);
  run r;
  run_open(&r, SPEC_MSE, &ok, "after the refusal");
  step(&r, 8, 0, "after the refusal");
  run_close(&r);
}
END_TEST

/* Replicas on a GPU that does not exist: a clear error, no context, no crash. */
START_TEST(missing_gpu_is_refused) {
  REQUIRE_GPU("missing_gpu_is_refused");
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse(SPEC_MSE, "mse", &m), DP_OK);
  dp_config g = config(DP_BACKEND_CUDA, 8, 2, DP_MODE_CLASSIC, DP_OPT_SGD);
  g.device_ids[1] = 99;
  dp_plan *p = NULL;
  ck_assert_msg(dp_plan_create(m, &g, &p) == DP_OK, "%s", dp_last_error());
  dp_ctx *c = (dp_ctx *)&c;
  dp_status s = dp_ctx_create(p, &c);
  ck_assert_msg(s != DP_OK, "a context on GPU 99 was created");
  ck_assert_ptr_null(c);
  ck_assert_msg(strstr(dp_last_error(), "99"), "the message does not name GPU 99: %s",
                dp_last_error());
  fprintf(stderr, "cuda_api: missing_gpu_is_refused: %s: %s\n", dp_status_name(s),
          dp_last_error());
  dp_plan_free(p);
  /* and the same config on GPU 0 works */
  g.device_ids[1] = 0;
  run r;
  run_open(&r, SPEC_MSE, &g, "GPU 0 again");
  step(&r, 8, 0, "GPU 0 again");
  run_close(&r);
  dp_model_free(m);
}
END_TEST

/* A checkpoint saved by a cuda context loads into a cpu one with the same
 * bits (parameters, step), and both continue alike (within tolerance); and
 * back, cpu to cuda. */
START_TEST(checkpoint_moves_between_cuda_and_cpu) {
  REQUIRE_GPU("checkpoint_moves_between_cuda_and_cpu");
  enum { B = 20 };
  char path[64];
  snprintf(path, sizeof path, "/tmp/dp_cuda_api_XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  dp_config g = config(DP_BACKEND_CUDA, B, 2, DP_MODE_ALLREDUCE, DP_OPT_ADAMW);
  dp_config c = as_cpu(g);
  c.n_devices = 3; /* a checkpoint loads into any device count and mode */
  c.mode = DP_MODE_CLASSIC;
  run rg, rc;
  run_open(&rg, SPEC_MSE, &g, "cuda");
  run_open(&rc, SPEC_MSE, &c, "cpu");
  for (int s = 0; s < 3; s++) step(&rg, B, (uint64_t)s, "cuda");
  ck_assert_msg(dp_ckpt_save(rg.c, path) == DP_OK, "%s", dp_ctx_error(rg.c));
  ck_assert_msg(dp_ckpt_load(rc.c, path) == DP_OK, "%s", dp_ctx_error(rc.c));
  ck_assert_uint_eq(dp_ctx_step(rc.c), 3);
  float *wg = params_of(&rg), *wc = params_of(&rc);
  ck_assert_msg(memcmp(wg, wc, rg.np * 4) == 0, "parameters differ after loading");
  free(wg);
  free(wc);
  for (int s = 3; s < 6; s++) {
    float lg = step(&rg, B, (uint64_t)s, "cuda"), lc = step(&rc, B, (uint64_t)s, "cpu");
    expect_loss_close(lg, lc, "after cuda -> cpu", s);
  }
  wg = params_of(&rg);
  wc = params_of(&rc);
  expect_close(wg, wc, rg.np, 1e-4, "after cuda -> cpu and 3 more steps");
  free(wg);
  free(wc);

  /* back: the cpu context's state into a fresh cuda context */
  ck_assert_msg(dp_ckpt_save(rc.c, path) == DP_OK, "%s", dp_ctx_error(rc.c));
  run r2;
  run_open(&r2, SPEC_MSE, &g, "cuda 2");
  ck_assert_msg(dp_ckpt_load(r2.c, path) == DP_OK, "%s", dp_ctx_error(r2.c));
  ck_assert_uint_eq(dp_ctx_step(r2.c), 6);
  ck_assert_uint_eq(dp_params_hash(r2.c), dp_params_hash(rc.c));
  float l2 = step(&r2, B, 6, "cuda 2"), lc = step(&rc, B, 6, "cpu");
  expect_loss_close(l2, lc, "after cpu -> cuda", 6);
  run_close(&r2);
  run_close(&rg);
  run_close(&rc);
  unlink(path);
}
END_TEST

/* What a context takes from the GPU: at least its planned arenas, and what
 * CUDA keeps beyond them (streams, events, cuBLAS state) is reported, not
 * guessed; freeing gives the arenas back. 4 replicas on GPU 0, the
 * benchmark's model. A NOTE line carries the numbers to tests/gpu/run.sh. */
START_TEST(device_memory_is_the_plan_plus_reported_overhead) {
  REQUIRE_GPU("device_memory_is_the_plan_plus_reported_overhead");
#ifndef DP_CUDA_SIM
  static const char spec[] = "input 1024\nlinear 4096\ngelu\nlinear 4096\ngelu\n"
                             "linear 1024\nloss mse\n";
  dp_config g = config(DP_BACKEND_CUDA, 1024, 4, DP_MODE_ALLREDUCE, DP_OPT_ADAMW);
  const char *shape = "1024-4096-4096-1024";
#else /* the same accounting at a size the CUDA simulation's scalar GEMMs run in seconds   \
       */
  static const char spec[] = "input 256\nlinear 1024\ngelu\nlinear 1024\ngelu\n"
                             "linear 256\nloss mse\n";
  dp_config g = config(DP_BACKEND_CUDA, 256, 4, DP_MODE_ALLREDUCE, DP_OPT_ADAMW);
  const char *shape = "256-1024-1024-256";
#endif
  size_t f0, f1, f2, total;
  /* the primary context exists before the first reading (the query makes it) */
  ck_assert_msg(dp_cuda_device_info(0, NULL, 0, &total, &f0) == DP_OK, "%s",
                dp_last_error());
  run r;
  run_open(&r, spec, &g, "4 replicas");
  ck_assert_msg(dp_cuda_device_info(0, NULL, 0, NULL, &f1) == DP_OK, "%s", dp_last_error());
  size_t planned = 0;
  for (int d = 0; d < dp_plan_n_devices(r.p); d++) planned += dp_plan_device_bytes(r.p, d);
  size_t used = f0 > f1 ? f0 - f1 : 0;
  double mib = 1024.0 * 1024.0;
  fprintf(stderr,
          "NOTE cuda_api: 4 replicas of %s (AdamW, batch %d) on GPU 0: "
          "planned %.1f MiB, cudaMemGetInfo fell by %.1f MiB at create (%.1f MiB beyond "
          "the plan)\n",
          shape, g.batch, (double)planned / mib, (double)used / mib,
          used > planned ? (double)(used - planned) / mib : 0.0);
  /* the driver hands out memory in pages of up to 2 MiB per allocation */
  ck_assert_msg(used + 8u * 2 * 1024 * 1024 >= planned,
                "the context took %zu bytes from the GPU, less than the %zu it planned",
                used, planned);
  run_close(&r);
  ck_assert_msg(dp_cuda_device_info(0, NULL, 0, NULL, &f2) == DP_OK, "%s", dp_last_error());
  ck_assert_msg(f2 + 8u * 2 * 1024 * 1024 >= f1 + planned,
                "after dp_ctx_free only %zu of the %zu planned bytes came back",
                f2 > f1 ? f2 - f1 : 0, planned);
}
END_TEST

/* cuBLAS loads a kernel at its first launch, which can deadlock while an NCCL
 * kernel of the device spins (issue 28, finding 4), so the context loads every
 * GEMM a step can make before NCCL starts. A batch smaller than planned (an
 * epoch's tail) gives its last micro-batches fewer rows: new GEMM shapes, which
 * must have been loaded too, for linear, conv2d and attention layers alike, in
 * training steps and in forwards (attention dropout: other operands). On the CUDA
 * simulation, which counts a first use on a stream that has carried NCCL calls. */
#ifdef DP_CUDA_SIM
int dp_sim_cold_gemms(void); /* tests/cuda_sim/cublas.cc */
#endif
START_TEST(smaller_batches_load_no_gemm_while_nccl_is_live) {
#ifndef DP_CUDA_SIM
  fprintf(stderr, "SKIP cuda_api: smaller_batches_load_no_gemm_while_nccl_is_live: "
                  "counts cuBLAS's first loads on the CUDA simulation only\n");
#else
  REQUIRE_GPU("smaller_batches_load_no_gemm_while_nccl_is_live");
  static const char *const specs[] = {
      SPEC_MSE,
      "input 2 5 4\nconv2d 3 3 padding 1\nrelu\nmaxpool2d 2\nflatten\n"
      "linear 4\nloss softmax_cross_entropy\n",
      GPT_SPEC, /* the attention's batched GEMMs, linear layers per position */
      /* attention dropout: y = p v takes the kept probabilities (n, T, T) in training, p
       * (n, H, T, T) in a forward; with T T odd and H = 4 the first head's p is
       * 16-byte aligned, the kept ones never: two kinds of call */
      "input tokens 5\nembed 11 8\nlinear 24\nattention 4 dropout 0.2\nlinear 11\n"
      "loss softmax_cross_entropy\n"};
  enum { B = 21, MB = 4, N_SPECS = sizeof specs / sizeof *specs };
  for (int i = 0; i < N_SPECS; i++)
    for (int mode = 0; mode < 2; mode++) {
      dp_config g = config(DP_BACKEND_CUDA, B, 2,
                           mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC, DP_OPT_SGD);
      for (int d = 0; d < DP_MAX_DEVICES; d++) g.device_ids[d] = d % 2; /* a GPU each */
      g.transport = DP_TRANSPORT_NCCL;
      g.micro_batch = MB;
      run r;
      run_open(&r, specs[i], &g, "nccl");
      int cold = dp_sim_cold_gemms();
      for (int rows = B; rows >= 1; rows--) {
        step(&r, rows, (uint64_t)rows, "nccl");
        batch b; /* and a forward (evaluation) of the training context */
        batch_make(&b, &r, rows, (uint64_t)rows);
        float *y = malloc((size_t)rows * (size_t)r.out * sizeof *y);
        ck_assert_ptr_nonnull(y);
        ck_assert_msg(dp_forward(r.c, rows, r.in, b.x, y) == DP_OK, "%s",
                      dp_ctx_error(r.c));
        free(y);
        batch_free(&b);
        ck_assert_msg(dp_sim_cold_gemms() == cold,
                      "spec %d, %s: a step and a forward of %d rows (planned %d) loaded %d "
                      "GEMM kernels while NCCL was live",
                      i, mode ? "allreduce" : "classic", rows, B,
                      dp_sim_cold_gemms() - cold);
      }
      run_close(&r);
    }
#endif
}
END_TEST

Suite *cuda_api_suite(void) {
  Suite *s = suite_create("cuda_api");
  TCase *tc = tcase_create("gpu_api");
  tcase_set_tags(tc, "gpu");
  tcase_add_test(tc, initial_parameters_are_the_cpu_ones);
  tcase_add_test(tc, training_matches_cpu);
  tcase_add_test(tc, run_to_run_bit_identical);
  tcase_add_test(tc, same_bits_for_1_2_4_replicas_and_every_mode);
  tcase_add_test(tc, ce_options_match_cpu_and_same_bits_everywhere);
  tcase_add_test(tc, graph_replay_equals_plain_execution);
  tcase_add_test(tc, forward_matches_cpu);
  tcase_add_test(tc, nonfinite_input_is_refused_and_changes_nothing);
  tcase_add_test(tc, arena_larger_than_free_memory_is_refused);
  tcase_add_test(tc, missing_gpu_is_refused);
  tcase_add_test(tc, checkpoint_moves_between_cuda_and_cpu);
  tcase_add_test(tc, device_memory_is_the_plan_plus_reported_overhead);
  tcase_add_test(tc, smaller_batches_load_no_gemm_while_nccl_is_live);
  /* each test creates its CUDA context afresh (Check forks per test) */
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  return s;
}
