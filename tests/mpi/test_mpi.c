/* A job of 8 devices across the processes of mpirun -np R (R in 1, 2, 4, 8:
 * layouts R x 8/R), checked on every rank against the same job in one
 * process (rank 0 runs it alongside and shares its bits):
 *   - classic, allreduce and sharded allreduce, with dropout and AdamW: the
 *     loss and the parameters after every step (full and short batches), the
 *     gradients, and a forward's outputs are bit-identical;
 *   - a step refused on one rank (a bad label, a NaN input, an injected fault
 *     at every cross-rank copy) is refused on every rank with the same status,
 *     the state bytewise unchanged, and the retry is bit-identical;
 *   - a rank planning another batch is refused at create, named;
 *   - a checkpoint saved by the job loads into one process (and back) and
 *     continues with the bits of a straight run;
 *   - sync batchnorm (its statistics' trees cross the ranks mid-forward and
 *     mid-backward): one process's parameters, running statistics and eval
 *     outputs, and a fault at any of those cross-rank copies refused;
 *   - no allocator calls by libdp... (tests/standalone/test_noalloc.c counts
 *     the one-process path; here the steps' counts are printed per rank).
 * With --kill-rank K, rank K kills itself mid-training; with --stall-rank K
 * it stops answering (alive): the others must end with an error naming it
 * (tests/mpi/run.sh checks that the job ends in time). test_cuda_mpi also has
 * --drop-rank K: rank K's NCCL sends stop mid-step (the rest of it goes on).
 *
 * Built a second time as test_cuda_mpi (-DTEST_CUDA): the same job on the cuda
 * backend, over the emulated GPU whose NCCL runs on MPI (tests/emul, built
 * with FAKE_CUDA_MPI): each rank drives its devices' emulated GPUs, copies
 * between ranks are NCCL pairs across processes, the pre-commit part is
 * synchronised (step_sync) before the ranks agree; the reference is still the
 * cpu backend in one process (the emulated GPU computes the cpu's bits), and
 * fast_collectives (NCCL's allreduce across the processes) is compared with
 * the emulated GPU in one process. No clipping or accumulation (cuda refuses
 * them).
 *
 * Usage: mpirun -np R test_mpi TMPDIR [--kill-rank K | --stall-rank K]. Exit 0 when every
 * check passed on this rank. */
#include "dp_mpi.h"
#if defined(TEST_CUDA_REAL) &&                                                             \
    defined(DP_CUDA_SIM) /* the CUDA simulation's NCCL over MPI */
#define PROG "test_cuda_mpi_sim"
void dp_sim_nccl_drop_sends(int yes); /* tests/cuda_sim/nccl.cc: --drop-rank */
#elif defined(TEST_CUDA_REAL)         /* real GPUs: tests/gpu/run.sh, a machine with >= 2 */
#define PROG "test_cuda_mpi_gpu"
#elif defined(TEST_CUDA)
#include "fake_cuda.h"
#define PROG "test_cuda_mpi"
#else
#define PROG "test_mpi"
#endif

#include "core/ctx.h" /* test hooks: dp__ctx_inject_fault, dp__ctx_schedule */

#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_DEV n_dev
static int n_dev = 8; /* test_cuda_mpi_gpu: DP_TEST_DEVICES (one GPU each) */
#define BATCH 64 /* M = 16 micro-batches of 4: 1, 2, 4, 8 devices give one set of bits */
#define IN 12
#define OUT 5

static int rank, size, failures;
static const char *tmpdir;

static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rank %d: FAIL: ", rank);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  failures++;
}

#define CHECK(cond, ...)                                                                   \
  do {                                                                                     \
    if (!(cond)) fail(__VA_ARGS__);                                                        \
  } while (0)

static const char *SPEC = "input 12\n"
                          "linear 16\n"
                          "relu\n"
                          "dropout 0.25\n"
                          "linear 16\n"
                          "tanh\n"
                          "linear 5\n"
                          "loss softmax_cross_entropy\n";

/* The data of step t: the same on every rank (each takes its rows). */
static void make_batch(int t, float *x, int32_t *y) {
  for (int r = 0; r < BATCH; r++) {
    for (int j = 0; j < IN; j++)
      x[r * IN + j] = sinf(0.37f * (float)(r * IN + j) + 1.3f * (float)t);
    y[r] = (r * 7 + t * 3) % OUT;
  }
}

typedef struct {
  const char *name;
  dp_mode mode;
  int shard, fast; /* fast: fast_collectives (cuda only) */
  int bf16; /* 1: reduce_precision bf16 (packed between ranks); 2: and precision bf16 */
} mode_case;

static const mode_case MODES[] = {
    {"classic", DP_MODE_CLASSIC, 0, 0, 0},
    {"allreduce", DP_MODE_ALLREDUCE, 0, 0, 0},
    {"sharded", DP_MODE_ALLREDUCE, 1, 0, 0},
    {"classic, bf16 reduction", DP_MODE_CLASSIC, 0, 0, 1},
    {"allreduce, bf16 reduction", DP_MODE_ALLREDUCE, 0, 0, 1},
    {"sharded, bf16 precision and reduction", DP_MODE_ALLREDUCE, 1, 0, 2},
#ifdef TEST_CUDA
    {"fast_collectives", DP_MODE_ALLREDUCE, 0, 1, 0}
#endif
};

static dp_config config_for(const mode_case *m, int ranks) {
  dp_config c;
  dp_config_default(&c);
#ifdef TEST_CUDA
  c.backend = DP_BACKEND_CUDA;
  c.fast_collectives = m->fast;
#endif
  c.batch = BATCH;
  c.n_devices = N_DEV;
  c.ranks = ranks;
  c.mode = m->mode;
  c.shard_optimizer = m->shard;
  dp_config_set_optimizer(&c, DP_OPT_ADAMW);
  c.lr = 0.01f;
  c.seed = 7;
  c.micro_batch = 4; /* fixed: the bits do not depend on the device count */
  c.reduce_precision = m->bf16 ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
  c.precision = m->bf16 == 2 ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
#ifndef TEST_CUDA
  c.clip_grad_norm = 0.05f; /* clipping; sharded: the norm's bins cross ranks too */
#endif
  c.timeout_ms = 20000;
  return c;
}

/* The one-process reference: the cpu backend, whose bits the emulated GPU
 * gives; fast_collectives sums in NCCL's order, so its reference is the
 * emulated GPU in one process. */
static dp_config reference_for(const mode_case *m) {
  dp_config c = config_for(m, 1);
#ifndef TEST_CUDA_REAL /* a real GPU's GEMMs are not the cpu's bits: cuda in one process   \
                        */
  if (!m->fast) c.backend = DP_BACKEND_CPU;
#endif
  return c;
}

/* Rank 0's value to every rank. */
static uint64_t share_u64(uint64_t v) {
  MPI_Bcast(&v, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  return v;
}

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* The job's step on this rank's rows of the batch. */
static dp_status job_step(dp_ctx *c, const dp_plan *p, int rows, const float *x,
                          const int32_t *y, float *loss) {
  int r0, n;
  dp_plan_rank_rows(p, rows, rank, &r0, &n);
  return dp_train_step(c, rows, IN, x + (size_t)r0 * IN, y + r0, loss);
}

/* Every rank: the same status; rank 0 prints it once. */
static void expect_all(dp_status got, dp_status want, const char *what) {
  int mine = (int)got, lo, hi;
  MPI_Allreduce(&mine, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == hi, "%s: the ranks returned different statuses (%d..%d)", what, lo, hi);
  CHECK(got == want, "%s: status %d (%s), want %d", what, (int)got,
        got ? dp_last_error() : "ok", (int)want);
}

static void check_mode(const mode_case *m, dp_model *model) {
  dp_config cw = config_for(m, size), c1 = reference_for(m);
  dp_plan *pw = NULL, *p1 = NULL;
  dp_ctx *cx = NULL, *ref = NULL;
  dp_status s = dp_plan_create(model, &cw, &pw);
  if (!s) s = dp_ctx_create_mpi(pw, MPI_COMM_WORLD, &cx);
  if (s) {
    fail("%s: creating the job's context: %s", m->name, dp_last_error());
    dp_plan_free(pw);
    return;
  }
  if (rank == 0) {
    if ((s = dp_plan_create(model, &c1, &p1)) || (s = dp_ctx_create(p1, &ref)))
      fail("%s: the one-process reference: %s", m->name, dp_last_error());
  }
  CHECK(dp_plan_hash(pw) != 0 && dp_plan_ranks(pw) == size, "%s: plan accessors", m->name);
  size_t np = dp_model_n_params(model);
  float *x = malloc(sizeof(float) * BATCH * IN), *g = malloc(np * 4),
        *gref = malloc(np * 4);
  int32_t *y = malloc(sizeof(int32_t) * BATCH);
  float *out = malloc(sizeof(float) * BATCH * OUT),
        *oref = malloc(sizeof(float) * BATCH * OUT);
  /* full batches, a short one (some ranks get no rows), full again */
  static const int rows_of[] = {BATCH, BATCH, 37, 3, BATCH, BATCH};
  for (int t = 0; t < 6; t++) {
    int rows = rows_of[t];
    make_batch(t, x, y);
    float lw = 0, lr = 0;
    s = job_step(cx, pw, rows, x, y, &lw);
    expect_all(s, DP_OK, "a step");
    if (rank == 0 && ref && dp_train_step(ref, rows, IN, x, y, &lr))
      fail("reference step: %s", dp_last_error());
    uint64_t hw = dp_params_hash(cx),
             hr = share_u64(rank == 0 && ref ? dp_params_hash(ref) : 0);
    uint32_t lref = (uint32_t)share_u64(bits(lr));
    CHECK(hw == hr, "%s step %d (%d rows): parameters %016llx, one process %016llx",
          m->name, t, rows, (unsigned long long)hw, (unsigned long long)hr);
    CHECK(bits(lw) == lref, "%s step %d: loss %.9g differs from one process's", m->name, t,
          (double)lw);
#ifndef TEST_CUDA
    uint32_t nref = (uint32_t)share_u64(rank == 0 && ref ? bits(dp_ctx_grad_norm(ref)) : 0);
    CHECK(bits(dp_ctx_grad_norm(cx)) == nref, "%s step %d: gradient norm %.9g differs",
          m->name, t, (double)dp_ctx_grad_norm(cx));
#endif
  }
  /* gradients and a forward */
  s = dp_get_grads(cx, g, np);
  CHECK(!s, "get_grads: %s", dp_last_error());
  if (rank == 0 && ref) dp_get_grads(ref, gref, np);
  MPI_Bcast(gref, (int)np, MPI_FLOAT, 0, MPI_COMM_WORLD);
  CHECK(!memcmp(g, gref, np * 4), "%s: gradients differ from one process's", m->name);
  make_batch(99, x, y);
  int r0, n;
  dp_plan_rank_rows(pw, BATCH, rank, &r0, &n);
  s = dp_forward(cx, BATCH, IN, x + (size_t)r0 * IN, out);
  expect_all(s, DP_OK, "a forward");
  if (rank == 0 && ref) dp_forward(ref, BATCH, IN, x, oref);
  MPI_Bcast(oref, BATCH * OUT, MPI_FLOAT, 0, MPI_COMM_WORLD);
  CHECK(!memcmp(out, oref + (size_t)r0 * OUT, (size_t)n * OUT * 4),
        "%s: this rank's forward outputs differ from one process's", m->name);

  /* refusals: a bad label on the last rank; a NaN input on the last rank */
  uint64_t before = dp_params_hash(cx);
  make_batch(6, x, y);
  int lr0, ln;
  dp_plan_rank_rows(pw, BATCH, size - 1, &lr0, &ln);
  int32_t saved = y[lr0 + ln - 1];
  if (rank == size - 1) y[lr0 + ln - 1] = OUT + 3;
  s = job_step(cx, pw, BATCH, x, y, NULL);
  expect_all(s, DP_ERR_RANGE, "a bad label on the last rank");
  if (rank != size - 1 && size > 1)
    CHECK(strstr(dp_ctx_error(cx), "rank") != NULL, "the refusal names no rank: %s",
          dp_ctx_error(cx));
  y[lr0 + ln - 1] = saved;
  float xs = x[(size_t)(lr0 + ln - 1) * IN];
  if (rank == size - 1) x[(size_t)(lr0 + ln - 1) * IN] = NAN;
  s = job_step(cx, pw, BATCH, x, y, NULL);
  expect_all(s, DP_ERR_NONFINITE, "a NaN input on the last rank");
  x[(size_t)(lr0 + ln - 1) * IN] = xs;
  CHECK(dp_params_hash(cx) == before, "%s: a refused step changed the parameters", m->name);

  /* an injected fault at every cross-rank copy of the training schedule, on
   * the rank that executes it */
  const dp_op *ops;
  int n_ops, commit, faults = 0;
  dp__ctx_schedule(cx, BATCH, true, &ops, &n_ops, &commit);
  for (int k = 0; k < commit; k++) {
    const dp_op *o = &ops[k];
    if (o->kind != DP_OP_COPY) continue;
    int sr = dp_plan_device_rank(pw, o->src_dev < 0 ? o->device : o->src_dev);
    int dr = dp_plan_device_rank(pw, o->dst_dev < 0 ? o->device : o->dst_dev);
    if (sr == dr) continue;
    if (rank == dp_plan_device_rank(pw, o->device)) dp__ctx_inject_fault(cx, k);
    s = job_step(cx, pw, BATCH, x, y, NULL);
    /* a skipped broadcast (replicas current) runs no copy: nothing to fail */
    if (o->phase == DP_PHASE_BROADCAST && m->mode != DP_MODE_CLASSIC) {
      dp__ctx_inject_fault(cx, -1);
      if (!s) break; /* a step ran: the reference no longer matches; stop here */
      continue;
    }
    expect_all(s, DP_ERR_BACKEND, "an injected fault at a cross-rank copy");
    CHECK(dp_params_hash(cx) == before, "%s: a fault at op %d changed the parameters",
          m->name, k);
    faults++;
  }
  /* dp_set_params refused on one rank is refused on all (the next step's
   * broadcast must be the same everywhere) */
  s = dp_get_params(cx, g, np);
  CHECK(!s, "get_params: %s", dp_last_error());
  if (rank == size - 1) g[0] = NAN;
  s = dp_set_params(cx, g, np);
  expect_all(s, DP_ERR_NONFINITE, "dp_set_params with a NaN on the last rank");
  CHECK(dp_params_hash(cx) == before, "%s: a refused dp_set_params changed the parameters",
        m->name);
  /* the retry: the reference's next step, bit for bit */
  float lw = 0, lref = 0;
  s = job_step(cx, pw, BATCH, x, y, &lw);
  expect_all(s, DP_OK, "the retry after refusals");
  if (rank == 0 && ref) dp_train_step(ref, BATCH, IN, x, y, &lref);
  uint64_t hr = share_u64(rank == 0 && ref ? dp_params_hash(ref) : 0);
  CHECK(dp_params_hash(cx) == hr && bits(lw) == (uint32_t)share_u64(bits(lref)),
        "%s: the retry differs from one process's step", m->name);

  /* a checkpoint of the job loads into one process and continues alike */
  char path[512];
  snprintf(path, sizeof path, "%s/job-%s-%d.ckpt", tmpdir, m->name, size);
  s = dp_ckpt_save(cx, path);
  expect_all(s, DP_OK, "saving the job's checkpoint");
  if (rank == 0 && ref) {
    dp_ctx *back = NULL;
    dp_config c2 = reference_for(m);
    c2.n_devices = m->fast ? N_DEV : 2; /* NCCL's sum: the same devices, or other bits */
    dp_plan *p2 = NULL;
    if (dp_plan_create(model, &c2, &p2) || dp_ctx_create(p2, &back) ||
        dp_ckpt_load(back, path))
      fail("%s: loading the job's checkpoint in 1 x 2: %s", m->name, dp_last_error());
    else {
      make_batch(7, x, y);
      dp_train_step(back, BATCH, IN, x, y, NULL);
      dp_train_step(ref, BATCH, IN, x, y, NULL);
      CHECK(dp_params_hash(back) == dp_params_hash(ref),
            "%s: saved in %d x %d, loaded in 1 x %d: the next step differs", m->name, size,
            N_DEV / size, c2.n_devices);
    }
    dp_ctx_free(back);
    dp_plan_free(p2);
  } else if (rank == 0) {
    make_batch(7, x, y);
  }
  /* and back: the reference's state into the job */
  snprintf(path, sizeof path, "%s/ref-%s-%d.ckpt", tmpdir, m->name, size);
  if (rank == 0 && ref && dp_ckpt_save(ref, path)) fail("save: %s", dp_last_error());
  MPI_Barrier(MPI_COMM_WORLD);
  s = dp_ckpt_load(cx, path);
  expect_all(s, DP_OK, "loading a one-process checkpoint into the job");
  make_batch(8, x, y);
  s = job_step(cx, pw, BATCH, x, y, NULL);
  if (rank == 0 && ref) dp_train_step(ref, BATCH, IN, x, y, NULL);
  hr = share_u64(rank == 0 && ref ? dp_params_hash(ref) : 0);
  CHECK(!s && dp_params_hash(cx) == hr,
        "%s: loaded from one process, the job's next step differs", m->name);
  if (rank == 0)
    printf("%-9s %d x %d: 6 steps, grads, forward, 2 refusals, %d injected faults, "
           "checkpoints both ways: same bits as one process\n",
           m->name, size, N_DEV / size, faults);
  free(x);
  free(y);
  free(g);
  free(gref);
  free(out);
  free(oref);
  dp_ctx_free(cx);
  dp_ctx_free(ref);
  dp_plan_free(pw);
  dp_plan_free(p1);
}

#ifndef TEST_CUDA
/* Gradient accumulation across processes: 2 calls of 32 rows update with the
 * bits of one step of the 64 rows in one process (the accumulating call's
 * schedule has transfers of its own). */
static void check_accumulate(dp_model *model) {
  dp_config cw = config_for(&MODES[2], size), c1 = config_for(&MODES[2], 1);
  cw.batch = BATCH / 2;
  cw.accumulate = 2;
  dp_plan *pw = NULL, *p1 = NULL;
  dp_ctx *cx = NULL, *ref = NULL;
  if (dp_plan_create(model, &cw, &pw) || dp_ctx_create_mpi(pw, MPI_COMM_WORLD, &cx)) {
    fail("accumulate: %s", dp_last_error());
    dp_plan_free(pw);
    return;
  }
  if (rank == 0 && (dp_plan_create(model, &c1, &p1) || dp_ctx_create(p1, &ref)))
    fail("accumulate: the reference: %s", dp_last_error());
  float *x = malloc(sizeof(float) * BATCH * IN);
  int32_t *y = malloc(sizeof(int32_t) * BATCH);
  for (int t = 0; t < 3; t++) {
    make_batch(t, x, y);
    for (int k = 0; k < 2; k++) {
      dp_status s = job_step(cx, pw, BATCH / 2, x + (size_t)k * (BATCH / 2) * IN,
                             y + k * (BATCH / 2), NULL);
      expect_all(s, DP_OK, "an accumulating call");
    }
    if (rank == 0 && ref) dp_train_step(ref, BATCH, IN, x, y, NULL);
    uint64_t hr = share_u64(rank == 0 && ref ? dp_params_hash(ref) : 0);
    CHECK(dp_params_hash(cx) == hr && dp_ctx_step(cx) == (uint64_t)t + 1,
          "accumulate 2 x %d rows, update %d: not the bits of one %d-row step", BATCH / 2,
          t + 1, BATCH);
  }
  if (rank == 0)
    printf("accumulate: 2 calls of %d rows = one step of %d, 3 updates\n", BATCH / 2,
           BATCH);
  free(x);
  free(y);
  dp_ctx_free(cx);
  dp_ctx_free(ref);
  dp_plan_free(pw);
  dp_plan_free(p1);
}

/* The parameters' hash folded with every batchnorm's running statistics
 * (collective: rank 0's). */
static uint64_t bn_state(dp_ctx *c, const dp_model *m) {
  uint64_t h = dp_params_hash(c);
  for (int i = 0; i < dp_model_n_layers(m); i++) {
    dp_layer_info li;
    if (dp_model_layer(m, i, &li) || li.kind != DP_LAYER_BATCHNORM) continue;
    float mv[64];
    int64_t n = 0;
    if (li.channels > 32 || dp_get_running_stats(c, i, mv, mv + li.channels, &n)) {
      fail("running statistics of layer %d: %s", i, dp_last_error());
      continue;
    }
    h = dp_hash_bytes(mv, 2 * (size_t)li.channels * 4) ^ (h * 31 + (uint64_t)n);
  }
  return h;
}

/* sync batchnorm: the statistics' trees cross the ranks in the middle of the
 * forward and of the backward; the job gives one process's bits (parameters
 * and running statistics, full and short batches, an eval forward), and a
 * fault at any cross-rank copy of those trees is refused on every rank with
 * nothing moved. A CNN, and a ResNet (an identity block, then a projection
 * block, batchnorm in f and g: skip gradients wait across the sums). */
static const char *const BN_SPEC = "input 1 3 4\nconv2d 3 2 padding 1 nobias\nbatchnorm\n"
                                   "relu\nflatten\nlinear 16 nobias\nbatchnorm\ntanh\n"
                                   "linear 5\nloss softmax_cross_entropy\n";
static const char *const BN_RESNET_SPEC =
    "input 1 3 4\nconv2d 4 3 padding 1 nobias\nbatchnorm\nrelu\n"
    "residual\nconv2d 4 3 padding 1 nobias\nbatchnorm\nrelu\nend\n"
    "residual\nconv2d 6 3 stride 2 padding 1 nobias\nbatchnorm\nrelu\n"
    "conv2d 6 3 padding 1 nobias\nbatchnorm\nshortcut\nconv2d 6 1 stride 2 nobias\n"
    "batchnorm\nend\nrelu\nflatten\nlinear 5\nloss softmax_cross_entropy\n";

static void check_sync_batchnorm(const char *spec) {
  dp_model *model = NULL;
  if (dp_model_parse(spec, "bn", &model)) {
    fail("sync batchnorm spec: %s", dp_last_error());
    return;
  }
  for (size_t mi = 0; mi < sizeof MODES / sizeof *MODES; mi++) {
    const mode_case *m = &MODES[mi];
    dp_config cw = config_for(m, size), c1 = config_for(m, 1);
    cw.batchnorm = c1.batchnorm = DP_BN_SYNC;
    cw.clip_grad_norm = c1.clip_grad_norm = 0;
    dp_plan *pw = NULL, *p1 = NULL;
    dp_ctx *cx = NULL, *ref = NULL;
    if (dp_plan_create(model, &cw, &pw) || dp_ctx_create_mpi(pw, MPI_COMM_WORLD, &cx)) {
      fail("sync batchnorm, %s: %s", m->name, dp_last_error());
      dp_plan_free(pw);
      continue;
    }
    if (rank == 0 && (dp_plan_create(model, &c1, &p1) || dp_ctx_create(p1, &ref)))
      fail("sync batchnorm, %s: the reference: %s", m->name, dp_last_error());
    float *x = malloc(sizeof(float) * BATCH * IN),
          *out = malloc(sizeof(float) * BATCH * OUT),
          *oref = malloc(sizeof(float) * BATCH * OUT);
    int32_t *y = malloc(sizeof(int32_t) * BATCH);
    static const int rows_of[] = {BATCH, 37, 3, BATCH};
    for (int t = 0; t < 4; t++) {
      make_batch(t, x, y);
      expect_all(job_step(cx, pw, rows_of[t], x, y, NULL), DP_OK, "a sync batchnorm step");
      if (rank == 0 && ref) dp_train_step(ref, rows_of[t], IN, x, y, NULL);
      uint64_t hr = share_u64(rank == 0 && ref ? bn_state(ref, model) : 0);
      CHECK(bn_state(cx, model) == hr,
            "sync batchnorm, %s, step %d (%d rows): not one "
            "process's parameters and running statistics",
            m->name, t, rows_of[t]);
    }
    int r0, n;
    dp_plan_rank_rows(pw, BATCH, rank, &r0, &n);
    expect_all(dp_forward(cx, BATCH, IN, x + (size_t)r0 * IN, out), DP_OK, "a forward");
    if (rank == 0 && ref) dp_forward(ref, BATCH, IN, x, oref);
    MPI_Bcast(oref, BATCH * OUT, MPI_FLOAT, 0, MPI_COMM_WORLD);
    CHECK(!memcmp(out, oref + (size_t)r0 * OUT, (size_t)n * OUT * 4),
          "sync batchnorm, %s: eval outputs differ from one process's", m->name);
    /* a fault at every cross-rank copy of the forward and backward trees */
    uint64_t before = bn_state(cx, model);
    const dp_op *ops;
    int n_ops, commit, faults = 0;
    dp__ctx_schedule(cx, BATCH, true, &ops, &n_ops, &commit);
    for (int k = 0; k < commit; k++) {
      const dp_op *o = &ops[k];
      if (o->kind != DP_OP_COPY ||
          (o->phase != DP_PHASE_FORWARD && o->phase != DP_PHASE_BACKWARD) ||
          dp_plan_device_rank(pw, o->src_dev) == dp_plan_device_rank(pw, o->dst_dev))
        continue;
      if (rank == dp_plan_device_rank(pw, o->device)) dp__ctx_inject_fault(cx, k);
      expect_all(job_step(cx, pw, BATCH, x, y, NULL), DP_ERR_BACKEND,
                 "an injected fault at a cross-rank batchnorm copy");
      CHECK(bn_state(cx, model) == before,
            "sync batchnorm, %s: a fault at op %d moved "
            "the state",
            m->name, k);
      faults++;
    }
    CHECK(size == 1 || faults > 0, "sync batchnorm, %s: no cross-rank copy in the trees",
          m->name);
    expect_all(job_step(cx, pw, BATCH, x, y, NULL), DP_OK, "the retry");
    if (rank == 0 && ref) dp_train_step(ref, BATCH, IN, x, y, NULL);
    uint64_t hr = share_u64(rank == 0 && ref ? bn_state(ref, model) : 0);
    CHECK(bn_state(cx, model) == hr, "sync batchnorm, %s: the retry differs", m->name);
    if (rank == 0)
      printf("sync batchnorm%s, %s: one process's bits; %d faults at cross-rank copies "
             "refused\n",
             spec == BN_RESNET_SPEC ? " (resnet)" : "", m->name, faults);
    free(x);
    free(y);
    free(out);
    free(oref);
    dp_ctx_free(cx);
    dp_ctx_free(ref);
    dp_plan_free(pw);
    dp_plan_free(p1);
  }
  dp_model_free(model);
}

#endif

/* A rank that plans another batch is refused on every rank, named. */
static void check_mismatch(dp_model *model) {
  if (size < 2) return;
  dp_config c = config_for(&MODES[1], size);
  if (rank == size - 1) c.batch = BATCH + 1;
  dp_plan *p = NULL;
  dp_ctx *cx = NULL;
  dp_status s = dp_plan_create(model, &c, &p);
  if (!s) s = dp_ctx_create_mpi(p, MPI_COMM_WORLD, &cx);
  expect_all(s, DP_ERR_INVALID, "a rank with another batch");
  char want[32];
  snprintf(want, sizeof want, "rank %d", size - 1);
  CHECK(strstr(dp_last_error(), want) && strstr(dp_last_error(), "config"),
        "the mismatch message should name %s and the config: %s", want, dp_last_error());
  if (rank == 0) printf("mismatch: %s\n", strstr(dp_last_error(), want));
  dp_ctx_free(cx);
  dp_plan_free(p);
}

/* Rank `victim` kills itself (or, stall: stops answering) at step 3; the
 * others must fail, naming it. */
static int run_kill(dp_model *model, int victim, bool stall, bool drop) {
  dp_config c = config_for(&MODES[1], size);
  c.timeout_ms = 3000;
  dp_plan *p = NULL;
  dp_ctx *cx = NULL;
  if (dp_plan_create(model, &c, &p) || dp_ctx_create_mpi(p, MPI_COMM_WORLD, &cx)) {
    fprintf(stderr, "rank %d: %s\n", rank, dp_last_error());
    return 1;
  }
  float *x = malloc(sizeof(float) * BATCH * IN);
  int32_t *y = malloc(sizeof(int32_t) * BATCH);
  for (int t = 0; t < 10; t++) {
    if (t == 3 && rank == victim) {
#if defined(TEST_CUDA) && !defined(TEST_CUDA_REAL)
      if (drop) /* mid-step: its NCCL sends never go out, the rest goes on */
        fake_cuda_drop_sends(1);
#elif defined(DP_CUDA_SIM)
      if (drop) dp_sim_nccl_drop_sends(1); /* the same, in the simulated NCCL */
#endif
      if (!stall && !drop) raise(SIGKILL);
      if (stall) sleep(60); /* alive, but never answers: only the timeout can tell */
    }
    make_batch(t, x, y);
    dp_status s = job_step(cx, p, BATCH, x, y, NULL);
    if (s) {
      fprintf(stderr, "rank %d: step %d failed: %s\n", rank, t, dp_ctx_error(cx));
      MPI_Abort(MPI_COMM_WORLD, 3); /* what a job does when it cannot go on */
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  int level;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
#ifdef TEST_CUDA
#ifdef TEST_CUDA_REAL
  const char *nd = getenv("DP_TEST_DEVICES");
  if (nd) n_dev = atoi(nd);
  if (n_dev < size || n_dev % size || n_dev > 8) {
    fprintf(stderr, "DP_TEST_DEVICES=%d: a multiple of %d, at most 8\n", n_dev, size);
    return 2;
  }
#else
  fake_cuda_set_gpus(N_DEV); /* each process's emulated GPUs: device_ids 0..7 */
#endif
  if (dp_cuda_register()) {
    fprintf(stderr, "dp_cuda_register: %s\n", dp_last_error());
    return 2;
  }
#endif
  if (argc < 2) {
    if (rank == 0) fprintf(stderr, "usage: test_mpi TMPDIR [--kill-rank K]\n");
    MPI_Finalize();
    return 2;
  }
  tmpdir = argv[1];
  dp_model *model = NULL;
  if (dp_model_parse(SPEC, "test", &model)) {
    fprintf(stderr, "spec: %s\n", dp_last_error());
    return 2;
  }
  if (argc >= 4 && (!strcmp(argv[2], "--kill-rank") || !strcmp(argv[2], "--stall-rank") ||
                    !strcmp(argv[2], "--drop-rank")))
    return run_kill(model, atoi(argv[3]), !strcmp(argv[2], "--stall-rank"),
                    !strcmp(argv[2], "--drop-rank"));
  for (size_t i = 0; i < sizeof MODES / sizeof *MODES; i++) check_mode(&MODES[i], model);
#ifndef TEST_CUDA
  check_accumulate(model);
  check_sync_batchnorm(BN_SPEC);
  check_sync_batchnorm(BN_RESNET_SPEC);
#endif
  check_mismatch(model);
  dp_model_free(model);
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf(PROG " %d x %d: %s\n", size, N_DEV / size, total ? "FAILED" : "ok");
  MPI_Finalize();
  return total ? 1 : 0;
}
