/* Golden tests: libdp against PyTorch reference data.
 *
 * tests/golden/<case>.bin are written by tests/fixtures/golden/make_golden.py (format and
 * semantics in tests/fixtures/golden/README.md). For each case the model, batch, initial
 * parameters and hyper-parameters come from the file; libdp must reproduce
 * PyTorch's loss, gradients, eval-mode outputs and the parameters after five
 * steps of SGD-momentum and of AdamW, and the same two trainings with gradient
 * clipping by global norm (config.clip_grad_norm against
 * torch.nn.utils.clip_grad_norm_), within the tolerance below. Only dp.h is
 * used. Paths are relative to the current directory (the repo root).
 *
 * Batch normalisation cases (bn_*) carry a micro_batch entry: libdp runs them
 * with config.micro_batch set to it, since per_replica batchnorm normalises
 * each micro-batch with its own statistics (PyTorch's reference does the
 * same), so the results are then the same for every device count and mode.
 * They also hold the running statistics (dp_get_running_stats) after every
 * step of each training and the eval-mode outputs after the two unclipped
 * trainings; the running means and variances are compared under the
 * tolerance below (a bf16 case's: normwise per layer), the counts exactly.
 *
 * bn_sync_* cases carry the same records and bn_sync = 1: libdp runs them with
 * config.batchnorm = DP_BN_SYNC (SyncBatchNorm: every batchnorm normalises
 * with the whole batch's statistics; PyTorch's reference is the module on the
 * whole batch). Their results do not depend on the micro-batches beyond
 * rounding, so besides the tests every case gets (with the file's
 * micro_batch), the batchnorm_layouts tests run every training of each
 * bn_sync case on 1 to 4 devices in every layout with the file's micro_batch,
 * with none (one per device), with 1 and 2 rows, and in per_replica mode with
 * the whole batch as one micro-batch, all against PyTorch's data; and, where
 * docs/DETERMINISM.md promises it (a fixed micro-batch size, 1, 2 or 4
 * devices dividing the micro-batch count), check that the losses, gradient
 * norms, gradients, parameters, running statistics and eval outputs are the
 * same bits as classic on 1 device. The per_replica cases and the bf16
 * batchnorm cases (sync too: bf16's weight gradients are rounded per
 * micro-batch, so only the file's size matches PyTorch's) get the same sweep
 * with their file's micro_batch.
 *
 * Tolerance, element-wise against a reference tensor `want`:
 *   |got - want| <= 1e-5 * (|want| + 0.1 * max|want|)
 * The second term keeps elements much smaller than the tensor's largest (the
 * result of cancellation, whose float32 rounding error scales with the terms
 * summed, not with the result) from failing for rounding alone. The generator
 * checks that PyTorch's float32 results are within 10% of this tolerance of a
 * float64 rerun, so an independent float32 implementation has ample room.
 *
 * bf16 cases (bf16_*) carry precision = 1: libdp runs them with
 * config.precision = DP_PRECISION_BF16 and the file's micro_batch (libdp
 * rounds each micro-batch's weight gradients to bf16, as PyTorch's gradient
 * accumulation under autocast does), against PyTorch's bf16 autocast with
 * libdp's rounding points mirrored where autocast differs (README.md "bf16
 * cases", docs/PRECISION.md). Their tolerance is normwise, per tensor (each
 * parameter tensor of a parameter or gradient record, the whole output, each
 * loss or norm):
 *   ||got - want||_2 <= 2^-10 ||want||_2
 * Two implementations of the same bf16 semantics differ only where their fp32
 * accumulations round a value to different bf16 neighbours: a few elements one
 * ulp (<= 2^-7 relative) apart. Skipping the roundings (fp32) moves every
 * element by a rounding error (RMS ~2^-8 / sqrt(3) relative per rounding), so
 * 2^-10 tells the two apart: the generator requires PyTorch's autocast to be
 * within a quarter of it of a float64 emulation of the semantics, and a plain
 * fp32 run at least twice it away in the outputs or the gradients, and
 * test_bf16_case_run_in_fp32_fails checks that libdp's fp32 fails it.
 */
#include "dp.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef GOLDEN_RTOL
#define GOLDEN_RTOL 1e-5
#endif
#define GOLDEN_FLOOR 1e-1
#define GOLDEN_STEPS 5
#define GOLDEN_BF16_TOL 0x1p-10 /* normwise, bf16 cases (see above) */

/* ---- reader ----------------------------------------------------------------- */

enum { GT_F32 = 0, GT_I32 = 1, GT_TEXT = 2 };
#define GOLDEN_MAX_ENTRIES 64
#define GOLDEN_MAX_DIMS 4

typedef struct {
  char name[64];
  uint32_t dtype;
  uint32_t ndim;
  uint32_t dims[GOLDEN_MAX_DIMS];
  size_t count; /* elements (text: bytes) */
  void *data;   /* f32: float[count]; i32: int32_t[count]; text: NUL-terminated */
} golden_entry;

typedef struct {
  char case_name[64];
  int n;
  golden_entry e[GOLDEN_MAX_ENTRIES];
} golden;

typedef struct {
  const unsigned char *p;
  size_t len, off;
} cursor;

static int take_u32(cursor *c, uint32_t *v) {
  if (c->len - c->off < 4) return 0;
  const unsigned char *b = c->p + c->off;
  *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
  c->off += 4;
  return 1;
}

static void golden_free(golden *g) {
  for (int i = 0; i < g->n; i++) free(g->e[i].data);
  g->n = 0;
}

/* Reads tests/golden/<case>.bin; fails the running test on any error. */
static void golden_load(golden *g, const char *case_name) {
  char path[256];
  snprintf(path, sizeof path, "tests/golden/%s.bin", case_name);
  memset(g, 0, sizeof *g);
  snprintf(g->case_name, sizeof g->case_name, "%s", case_name);

  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL,
                "%s: cannot open (run from the repo root; regenerate with "
                "tests/fixtures/golden/make_golden.py)",
                path);
  ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
  long size = ftell(f);
  ck_assert_msg(size > 0, "%s: empty or unreadable", path);
  ck_assert_int_eq(fseek(f, 0, SEEK_SET), 0);
  unsigned char *buf = malloc((size_t)size);
  ck_assert_ptr_nonnull(buf);
  size_t got = fread(buf, 1, (size_t)size, f);
  fclose(f);
  ck_assert_msg(got == (size_t)size, "%s: short read", path);

  cursor c = {buf, (size_t)size, 0};
  ck_assert_msg(c.len >= 8 && memcmp(buf, "DPGOLD\0\0", 8) == 0, "%s: bad magic", path);
  c.off = 8;
  uint32_t version, n;
  ck_assert_msg(take_u32(&c, &version) && version == 1, "%s: unsupported version", path);
  ck_assert_msg(take_u32(&c, &n) && n <= GOLDEN_MAX_ENTRIES, "%s: bad entry count", path);
  for (uint32_t k = 0; k < n; k++) {
    golden_entry *e = &g->e[g->n];
    uint32_t name_len;
    ck_assert_msg(take_u32(&c, &name_len) && name_len < sizeof e->name &&
                      c.len - c.off >= name_len,
                  "%s: entry %u: bad name", path, (unsigned)k);
    memcpy(e->name, buf + c.off, name_len);
    e->name[name_len] = '\0';
    c.off += name_len;
    ck_assert_msg(take_u32(&c, &e->dtype) && e->dtype <= GT_TEXT, "%s: %s: bad dtype", path,
                  e->name);
    ck_assert_msg(take_u32(&c, &e->ndim) && e->ndim >= 1 && e->ndim <= GOLDEN_MAX_DIMS,
                  "%s: %s: bad ndim", path, e->name);
    size_t count = 1;
    for (uint32_t d = 0; d < e->ndim; d++) {
      ck_assert_msg(take_u32(&c, &e->dims[d]), "%s: %s: truncated dims", path, e->name);
      count *= e->dims[d];
    }
    ck_assert_msg(count < ((size_t)1 << 28), "%s: %s: too large", path, e->name);
    e->count = count;
    size_t esize = e->dtype == GT_TEXT ? 1 : 4;
    ck_assert_msg(c.len - c.off >= count * esize, "%s: %s: truncated payload", path,
                  e->name);
    if (e->dtype == GT_TEXT) {
      char *t = malloc(count + 1);
      ck_assert_ptr_nonnull(t);
      memcpy(t, buf + c.off, count);
      t[count] = '\0';
      e->data = t;
      c.off += count;
    } else {
      uint32_t *a = malloc((count ? count : 1) * sizeof *a);
      ck_assert_ptr_nonnull(a);
      for (size_t i = 0; i < count; i++) take_u32(&c, &a[i]);
      e->data = a; /* same size and representation as float / int32_t */
    }
    g->n++;
  }
  ck_assert_msg(c.off == c.len, "%s: trailing bytes", path);
  free(buf);
}

static const golden_entry *golden_get(const golden *g, const char *name, uint32_t dtype) {
  for (int i = 0; i < g->n; i++)
    if (strcmp(g->e[i].name, name) == 0) {
      ck_assert_msg(g->e[i].dtype == dtype, "%s: entry '%s' has dtype %u, expected %u",
                    g->case_name, name, (unsigned)g->e[i].dtype, (unsigned)dtype);
      return &g->e[i];
    }
  ck_abort_msg("%s: no entry '%s'", g->case_name, name);
  return NULL;
}

/* The entry, or NULL when the file has none of that name (entries only some
 * cases carry, such as micro_batch). */
static const golden_entry *golden_find(const golden *g, const char *name, uint32_t dtype) {
  for (int i = 0; i < g->n; i++)
    if (strcmp(g->e[i].name, name) == 0) return golden_get(g, name, dtype);
  return NULL;
}

static const float *golden_f32(const golden *g, const char *name, size_t *n) {
  const golden_entry *e = golden_get(g, name, GT_F32);
  if (n) *n = e->count;
  return e->data;
}

static const int32_t *golden_i32(const golden *g, const char *name, size_t *n) {
  const golden_entry *e = golden_get(g, name, GT_I32);
  if (n) *n = e->count;
  return e->data;
}

/* ---- comparison ------------------------------------------------------------- */

/* Fails with the worst element (by |diff| / allowed) when any is out of tolerance. */
static void check_close(const char *case_name, const char *what, const float *got,
                        const float *want, size_t n) {
  double maxabs = 0.0;
  for (size_t i = 0; i < n; i++)
    if (fabs((double)want[i]) > maxabs) maxabs = fabs((double)want[i]);
  double floor_abs = GOLDEN_FLOOR * maxabs;
  size_t worst = 0, bad = 0;
  double worst_ratio = -1.0;
  for (size_t i = 0; i < n; i++) {
    double diff = fabs((double)got[i] - (double)want[i]);
    double allowed = GOLDEN_RTOL * (fabs((double)want[i]) + floor_abs);
    double ratio;
    if (isnan(diff))
      ratio = INFINITY;
    else if (allowed > 0.0)
      ratio = diff / allowed;
    else
      ratio = diff > 0.0 ? INFINITY : 0.0;
    if (ratio > 1.0) bad++;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  ck_assert_msg(bad == 0,
                "%s: %s: %zu of %zu elements outside tolerance; worst [%zu] got %.9g want "
                "%.9g (|diff| %.3g, allowed %.3g)",
                case_name, what, bad, n, worst, (double)got[worst], (double)want[worst],
                fabs((double)got[worst] - (double)want[worst]),
                GOLDEN_RTOL * (fabs((double)want[worst]) + floor_abs));
}

/* ||got - want||_2 / (GOLDEN_BF16_TOL ||want||_2): <= 1 passes (a NaN: infinity). */
static double norm_ratio(const float *got, const float *want, size_t n) {
  double d2 = 0.0, w2 = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)got[i] - (double)want[i];
    d2 += d * d;
    w2 += (double)want[i] * (double)want[i];
  }
  if (isnan(d2)) return INFINITY;
  if (w2 == 0.0) return d2 > 0.0 ? INFINITY : 0.0;
  return sqrt(d2 / w2) / GOLDEN_BF16_TOL;
}

/* The bf16 tolerance on one tensor; fails with the worst element. */
static void check_norm(const char *case_name, const char *what, const float *got,
                       const float *want, size_t n) {
  double ratio = norm_ratio(got, want, n);
  if (ratio <= 1.0) return;
  size_t worst = 0;
  for (size_t i = 1; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= fabs((double)got[worst] - want[worst])))
      worst = i;
  ck_abort_msg("%s: %s: normwise error %.3g x the bf16 tolerance (2^-10 relative); worst "
               "[%zu] of %zu got %.9g want %.9g",
               case_name, what, ratio, worst, n, (double)got[worst], (double)want[worst]);
}

/* ---- setting up libdp from a case -------------------------------------------- */

/* cnn_*: the image layers (conv2d with stride, padding, even and 1x1 kernels and
 * no bias; overlapping and gapped max/avg pooling in floor mode, padded pools
 * (cnn_pad: -inf for max, counted or excluded for avg); flatten first,
 * in the middle and last; dropout on an image), odd non-square inputs and a
 * short last chunk, under the same tolerance as the MLPs. bn_*: batchnorm,
 * per_replica, with the file's micro-batch size: 1d in an MLP (bn_mlp), 2d
 * after a conv (bn_cnn), both in one model with a short last micro-batch
 * (bn_two). bn_sync_*: the same three shapes of model in sync mode (the file's
 * bn_sync record), whole-batch statistics. bn_opts_*, bn_sync_opts: other eps
 * and momentum than the defaults (layernorm's eps too), and momentum=None, the
 * cumulative average. See tests/fixtures/golden/README.md. */
static const char *const golden_cases[] = {"seed",
                                           "b31n2",
                                           "b3n4",
                                           "mlp_all",
                                           "mlp_mse_b37n3",
                                           "mlp_gelu_erf",   /* nn.GELU() */
                                           "mlp_silu_leaky", /* nn.SiLU, nn.LeakyReLU */
                                           "mlp_leaky_neg",  /* negative slopes */
                                           "mlp_l1",         /* nn.L1Loss */
                                           "mlp_smooth_l1",  /* nn.SmoothL1Loss(beta) */
                                           "mlp_huber",      /* nn.HuberLoss(delta) */
                                           "mlp_bce",        /* nn.BCEWithLogitsLoss */
                                           "mlp_bce_posw",   /* its pos_weight */
                                           "cnn_all",
                                           "cnn_mse",
                                           "cnn_tail",
                                           "cnn_flatten_first",
                                           "cnn_dropout",
                                           "cnn_pad", /* pool padding */
                                           "bn_mlp",
                                           "bn_cnn",
                                           "bn_two",
                                           "bn_sync_mlp",
                                           "bn_sync_cnn",
                                           "bn_sync_two",
                                           "bn_opts_mlp", /* eps, momentum */
                                           "bn_opts_cnn", /* momentum=None */
                                           "bn_sync_opts",
                                           "gpt_tiny",
                                           "gpt_post",
                                           "gpt_tied",
                                           "gpt_attn_dropout",
                                           "mlp_ce_opts", /* label_smoothing, weight */
                                           "gpt_ignore",  /* ignore_index */
                                           "gpt_bn",      /* batchnorm on sequences */
                                           "gpt_bn_sync",
                                           "bf16_mlp",
                                           "bf16_cnn",
                                           "bf16_gpt",
                                           "bf16_bn_mlp",
                                           "bf16_bn_cnn",
                                           "bf16_bn_sync_cnn",
                                           "adam_mlp",
                                           "bf16_adam_mlp",
                                           "amsgrad_mlp",
                                           "bf16_amsgrad_mlp",
                                           "resnet_proj", /* projection shortcuts */
                                           "resnet_sync", /* ... with sync batchnorm */
                                           "bf16_leaky_neg"};
#define N_GOLDEN_CASES ((int)(sizeof golden_cases / sizeof golden_cases[0]))
/* adam_*: torch.optim.Adam (coupled L2 weight decay 0.05) besides the usual
 * trainings, in fp32 and in bf16 (its adam_hparams, adam_params5, adam_loss). */
static const char *const adam_cases[] = {"adam_mlp", "bf16_adam_mlp"};
#define N_ADAM_CASES ((int)(sizeof adam_cases / sizeof adam_cases[0]))
/* amsgrad_*: Adam(amsgrad=True) and AdamW(amsgrad=True) besides the usual
 * trainings, in fp32 and in bf16 (ams_hparams, adam_ams_*, adamw_ams_*; beta2
 * 0.9, so that v_hat departs from v within the five steps). */
static const char *const ams_cases[] = {"amsgrad_mlp", "bf16_amsgrad_mlp"};
#define N_AMS_CASES ((int)(sizeof ams_cases / sizeof ams_cases[0]))
/* bf16_*: config.precision bf16 (the file's precision record) against PyTorch's
 * bf16 autocast: an MLP with every activation, layernorm and dropout; a CNN whose
 * first conv reads the fp32 input, with max and average pooling; a pre-LN GPT;
 * batchnorm (autocast's own mixed-precision batch_norm) in an MLP and a CNN,
 * per_replica, and in a CNN, sync, ending in a batchnorm. */
static const char *const bf16_cases[] = {"bf16_mlp",      "bf16_cnn",    "bf16_gpt",
                                         "bf16_bn_mlp",   "bf16_bn_cnn", "bf16_bn_sync_cnn",
                                         "bf16_leaky_neg"};
#define N_BF16_CASES ((int)(sizeof bf16_cases / sizeof bf16_cases[0]))

/* The layouts: classic, allreduce and allreduce with a sharded optimizer. */
static const struct {
  dp_mode mode;
  int shard;
  const char *name;
} layouts[] = {{DP_MODE_CLASSIC, 0, "classic"},
               {DP_MODE_ALLREDUCE, 0, "allreduce"},
               {DP_MODE_ALLREDUCE, 1, "sharded"}};
#define N_LAYOUTS ((int)(sizeof layouts / sizeof layouts[0]))

/* run_setup.micro_batch besides 0 (the file's) and a size > 0. */
enum {
  MB_NONE = -1, /* config.micro_batch = 0: one micro-batch per device (the default) */
  MB_BATCH = -2 /* the whole batch as one micro-batch */
};

/* How a case is run. Zero-initialised: the file's own setup (its N, classic,
 * its micro_batch and batchnorm mode, no clipping, a training plan). */
typedef struct {
  int inference;
  int n_devices;   /* 0: the file's N */
  int layout;      /* index in layouts[] */
  int clip;        /* config.clip_grad_norm = the file's clip_max_norm (0: none) */
  int micro_batch; /* 0: the file's micro_batch (0 when it has none); MB_NONE,
                      MB_BATCH, or rows per micro-batch */
  int per_replica; /* a bn_sync file run in per_replica mode (which, with the
                      whole batch as one micro-batch, normalises the same) */
  int fp32;        /* a bf16 case run in fp32 (which must fail its comparison) */
  int ams;         /* config.amsgrad with the file's ams_hparams (amsgrad_* cases) */
} run_setup;

typedef struct {
  golden g;
  dp_model *model;
  dp_plan *plan;
  dp_ctx *ctx;
  int batch, in_width;
  int micro_batch; /* config.micro_batch of the run */
  int n_devices;   /* config.n_devices of the run */
  int bn_sync;     /* config.batchnorm = DP_BN_SYNC */
  int bf16;        /* the file's precision record: compared under the bf16 tolerance */
  /* The run is one that docs/DETERMINISM.md promises the bits of: a fixed
   * micro-batch size, the chunk split, and a device count that is a power of
   * two dividing the micro-batch count. */
  int same_bits;
  char desc[128]; /* the layout, for messages */
  size_t n_params;
  const float *x;
  const void *target;
} golden_run;

#define CHECK_DP(name, call)                                                               \
  do {                                                                                     \
    dp_status st_ = (call);                                                                \
    ck_assert_msg(st_ == DP_OK, "%s: %s -> %s: %s", (name), #call, dp_status_name(st_),    \
                  dp_last_error());                                                        \
  } while (0)

/* Loads the case and builds model, plan and context with params0 loaded, set
 * up as s says (NULL: the file's own setup). The optimizer's hyper-parameters
 * come from the file. */
static void run_open(golden_run *r, const char *case_name, dp_optimizer opt,
                     const run_setup *s) {
  static const run_setup file_setup = {0};
  if (!s) s = &file_setup;
  ck_assert(s->layout >= 0 && s->layout < N_LAYOUTS);
  /* per_replica normalises as sync only with a single micro-batch */
  ck_assert(!s->per_replica || s->micro_batch == MB_BATCH);
  memset(r, 0, sizeof *r);
  golden_load(&r->g, case_name);
  const golden *g = &r->g;
  const char *spec = golden_get(g, "spec", GT_TEXT)->data;
  size_t n;
  const int32_t *conf = golden_i32(g, "config", &n);
  ck_assert_uint_eq(n, 4);
  const float *hp = golden_f32(g, "hparams", &n);
  ck_assert_uint_eq(n, 8);
  r->batch = conf[0];
  int file_mb = 0;
  const golden_entry *mbe = golden_find(g, "micro_batch", GT_I32);
  if (mbe) {
    ck_assert_uint_eq(mbe->count, 1);
    file_mb = ((const int32_t *)mbe->data)[0];
    ck_assert_msg(file_mb > 0, "%s: micro_batch %d", case_name, file_mb);
  }
  const golden_entry *se = golden_find(g, "bn_sync", GT_I32);
  if (se) {
    ck_assert_msg(se->count == 1 && ((const int32_t *)se->data)[0] == 1 && mbe,
                  "%s: bn_sync must be [1], in a batchnorm case", case_name);
    r->bn_sync = !s->per_replica;
  }
  const golden_entry *pe = golden_find(g, "precision", GT_I32);
  if (pe) {
    ck_assert_msg(pe->count == 1 && ((const int32_t *)pe->data)[0] == DP_PRECISION_BF16 &&
                      mbe,
                  "%s: precision must be [%d], with a micro_batch", case_name,
                  (int)DP_PRECISION_BF16);
    r->bf16 = 1;
  }
  r->micro_batch = s->micro_batch == 0          ? file_mb
                   : s->micro_batch == MB_NONE  ? 0
                   : s->micro_batch == MB_BATCH ? r->batch
                                                : s->micro_batch;
  ck_assert_int_ge(r->micro_batch, 0);
  r->n_devices = s->n_devices > 0 ? s->n_devices : conf[1];
  int n_mb = r->micro_batch ? (r->batch + r->micro_batch - 1) / r->micro_batch : 0;
  r->same_bits = n_mb > 0 && conf[2] == DP_SPLIT_CHUNK &&
                 (r->n_devices & (r->n_devices - 1)) == 0 && n_mb % r->n_devices == 0;
  int bn = golden_find(g, "bn_layers", GT_I32) != NULL;
  snprintf(r->desc, sizeof r->desc, "%s on %d device(s), micro_batch %d%s%s%s",
           layouts[s->layout].name, r->n_devices, r->micro_batch,
           bn ? (r->bn_sync ? ", batchnorm sync" : ", batchnorm per_replica") : "",
           r->bf16 ? (s->fp32 ? ", fp32 (a bf16 case)" : ", bf16") : "",
           s->clip ? ", clipped" : "");

  CHECK_DP(case_name, dp_model_parse(spec, case_name, &r->model));
  int in = dp_model_input_width(r->model), out = dp_model_output_width(r->model);
  r->in_width = in;
  r->n_params = dp_model_n_params(r->model);

  const golden_entry *xe = golden_get(g, "x", GT_F32);
  ck_assert_msg(xe->ndim == 2 && xe->dims[0] == (uint32_t)r->batch &&
                    xe->dims[1] == (uint32_t)in,
                "%s: x shape does not match the model", case_name);
  r->x = xe->data;
  if (dp_model_loss(r->model) == DP_LOSS_SOFTMAX_CE) {
    /* a label per row (B), or per position of a sequence (B, T) */
    const golden_entry *te = golden_get(g, "target", GT_I32);
    int t = dp_model_positions(r->model);
    ck_assert_int_eq(dp_model_target_width(r->model), t);
    ck_assert_msg(
        te->dims[0] == (uint32_t)r->batch &&
            (t == 1 ? te->ndim == 1 : te->ndim == 2 && te->dims[1] == (uint32_t)t),
        "%s: target shape does not match", case_name);
    r->target = te->data;
  } else {
    const golden_entry *te = golden_get(g, "target", GT_F32);
    ck_assert_msg(te->ndim == 2 && te->dims[0] == (uint32_t)r->batch &&
                      te->dims[1] == (uint32_t)out,
                  "%s: target shape does not match the model", case_name);
    r->target = te->data;
  }
  const float *p0 = golden_f32(g, "params0", &n);
  ck_assert_msg(n == r->n_params, "%s: params0 has %zu floats, the model %zu", case_name, n,
                r->n_params);

  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = r->batch;
  cfg.n_devices = r->n_devices;
  cfg.split = (dp_split)conf[2];
  cfg.micro_batch = r->micro_batch; /* per_replica batchnorm's statistics depend on it */
  cfg.batchnorm = r->bn_sync ? DP_BN_SYNC : DP_BN_PER_REPLICA;
  cfg.precision = r->bf16 && !s->fp32 ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
  cfg.seed = (uint64_t)(uint32_t)conf[3];
  cfg.inference = s->inference;
  cfg.mode = layouts[s->layout].mode;
  cfg.shard_optimizer = layouts[s->layout].shard;
  if (s->clip) {
    const float *max_norm = golden_f32(g, "clip_max_norm", &n);
    ck_assert_uint_eq(n, 1);
    ck_assert_msg(max_norm[0] > 0.0f, "%s: clip_max_norm %g", case_name,
                  (double)max_norm[0]);
    cfg.clip_grad_norm = max_norm[0];
  }
  dp_config_set_optimizer(&cfg, opt);
  if (s->ams) { /* the amsgrad_* cases' own record: lr, betas, eps, Adam's and
                   AdamW's weight decay */
    const float *ha = golden_f32(g, "ams_hparams", &n);
    ck_assert_uint_eq(n, 6);
    cfg.amsgrad = 1;
    cfg.lr = ha[0];
    cfg.beta1 = ha[1];
    cfg.beta2 = ha[2];
    cfg.eps = ha[3];
    cfg.weight_decay = opt == DP_OPT_ADAM ? ha[4] : ha[5];
  } else if (opt == DP_OPT_ADAM) { /* the adam_* cases' own record */
    const float *ha = golden_f32(g, "adam_hparams", &n);
    ck_assert_uint_eq(n, 5);
    cfg.lr = ha[0];
    cfg.beta1 = ha[1];
    cfg.beta2 = ha[2];
    cfg.eps = ha[3];
    cfg.weight_decay = ha[4];
  } else if (opt == DP_OPT_ADAMW) {
    cfg.lr = hp[3];
    cfg.beta1 = hp[4];
    cfg.beta2 = hp[5];
    cfg.eps = hp[6];
    cfg.weight_decay = hp[7];
  } else {
    cfg.lr = hp[0];
    cfg.momentum = hp[1];
    cfg.weight_decay = hp[2];
  }
  dp_status st = dp_plan_create(r->model, &cfg, &r->plan);
  ck_assert_msg(st == DP_OK, "%s: %s: dp_plan_create -> %s: %s", case_name, r->desc,
                dp_status_name(st), dp_last_error());
  CHECK_DP(case_name, dp_ctx_create(r->plan, &r->ctx));
  CHECK_DP(case_name, dp_set_params(r->ctx, p0, r->n_params));
}

static void run_close(golden_run *r) {
  dp_ctx_free(r->ctx);
  dp_plan_free(r->plan);
  dp_model_free(r->model);
  golden_free(&r->g);
}

static float *alloc_floats(size_t n) {
  float *p = calloc(n ? n : 1, sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}

/* ---- comparing a run's results under its case's tolerance --------------------- */

/* An output or any other tensor of n floats: element-wise (fp32 cases) or
 * normwise (bf16). */
static void check_out(const golden_run *r, const char *what, const float *got,
                      const float *want, size_t n) {
  if (r->bf16)
    check_norm(r->g.case_name, what, got, want, n);
  else
    check_close(r->g.case_name, what, got, want, n);
}

static void check_value(const golden_run *r, const char *what, float got, float want) {
  check_out(r, what, &got, &want, 1);
}

/* Parameters or gradients (n_params floats): element-wise over the array
 * (fp32), or normwise per parameter tensor (bf16: a small tensor's error is
 * not lost in a large one's norm). */
static void check_params(const golden_run *r, const char *what, const float *got,
                         const float *want) {
  if (!r->bf16) {
    check_close(r->g.case_name, what, got, want, r->n_params);
    return;
  }
  for (int i = 0; i < dp_model_n_tensors(r->model); i++) {
    dp_tensor_info t;
    CHECK_DP(r->g.case_name, dp_model_tensor(r->model, i, &t));
    char w[320];
    snprintf(w, sizeof w, "%s, tensor %s", what, t.name);
    check_norm(r->g.case_name, w, got + t.offset, want + t.offset, t.numel);
  }
}

/* The worst norm_ratio over the parameter tensors. */
static double params_norm_ratio(const golden_run *r, const float *got, const float *want) {
  double worst = 0.0;
  for (int i = 0; i < dp_model_n_tensors(r->model); i++) {
    dp_tensor_info t;
    CHECK_DP(r->g.case_name, dp_model_tensor(r->model, i, &t));
    double q = norm_ratio(got + t.offset, want + t.offset, t.numel);
    if (!(q <= worst)) worst = q;
  }
  return worst;
}

/* ---- batchnorm running statistics ---------------------------------------------- */

/* The file's bn_layers ((layer index after `input`, C) per batchnorm, in
 * layer order; none: *n_bn = 0) and the sum of their C. */
static const int32_t *bn_layers(const golden_run *r, int *n_bn, size_t *total_c) {
  const golden_entry *le = golden_find(&r->g, "bn_layers", GT_I32);
  *n_bn = 0;
  *total_c = 0;
  if (!le) return NULL;
  ck_assert_msg(le->ndim == 2 && le->dims[1] == 2, "%s: bn_layers shape", r->g.case_name);
  const int32_t *bl = le->data;
  *n_bn = (int)le->dims[0];
  for (int k = 0; k < *n_bn; k++) *total_c += (size_t)bl[2 * k + 1];
  return bl;
}

/* Every batchnorm's running statistics (dp_get_running_stats), concatenated
 * in layer order as the file's records are: mean and var (total_c floats
 * each), count (n_bn). */
static void read_running_stats(golden_run *r, float *mean, float *var, int64_t *count) {
  int n_bn;
  size_t total_c, off = 0;
  const int32_t *bl = bn_layers(r, &n_bn, &total_c);
  for (int k = 0; k < n_bn; k++) {
    int layer = bl[2 * k];
    count[k] = -1;
    dp_status st = dp_get_running_stats(r->ctx, layer, mean + off, var + off, &count[k]);
    ck_assert_msg(st == DP_OK, "%s: dp_get_running_stats(layer %d) -> %s: %s",
                  r->g.case_name, layer, dp_status_name(st), dp_last_error());
    off += (size_t)bl[2 * k + 1];
  }
}

/* Compares every batchnorm's running statistics (dp_get_running_stats) with
 * row `t` of the file's <prefix>_running_mean / _running_var (f32, (steps,
 * sum of C), the layers concatenated in order) and <prefix>_num_batches (i32,
 * (steps, batchnorms)), the records after step t. The layers come from the
 * file's bn_layers ((layer index after `input`, C) each) and must be the
 * model's batchnorms; every other layer, and one past the last, must be
 * refused with DP_ERR_INVALID. A case without batchnorm has no records: then
 * only the refusals are checked. */
static void check_running_stats(golden_run *r, const char *prefix, int t,
                                const char *when) {
  const golden *g = &r->g;
  const char *cn = g->case_name;
  int n_layers = dp_model_n_layers(r->model);
  int n_bn;
  size_t total_c;
  const int32_t *bl = bn_layers(r, &n_bn, &total_c);
  float dummy[1];
  int64_t dummy_count;
  for (int i = 0, k = 0; i <= n_layers; i++) {
    int is_bn = k < n_bn && bl[2 * k] == i;
    if (i < n_layers)
      ck_assert_msg((dp_model_layer_kind(r->model, i) == DP_LAYER_BATCHNORM) == is_bn,
                    "%s: layer %d: the model's kind %d and the file's bn_layers disagree",
                    cn, i, (int)dp_model_layer_kind(r->model, i));
    if (is_bn) {
      k++;
      continue;
    }
    dp_status st = dp_get_running_stats(r->ctx, i, dummy, dummy, &dummy_count);
    ck_assert_msg(st == DP_ERR_INVALID,
                  "%s: dp_get_running_stats of layer %d (not a batchnorm) -> %s, expected "
                  "DP_ERR_INVALID",
                  cn, i, dp_status_name(st));
  }
  if (!n_bn) return;

  char key[64], what[200];
  snprintf(key, sizeof key, "%s_running_mean", prefix);
  const golden_entry *me = golden_get(g, key, GT_F32);
  snprintf(key, sizeof key, "%s_running_var", prefix);
  const golden_entry *ve = golden_get(g, key, GT_F32);
  snprintf(key, sizeof key, "%s_num_batches", prefix);
  const golden_entry *ce = golden_get(g, key, GT_I32);
  ck_assert_msg(me->ndim == 2 && me->dims[0] == GOLDEN_STEPS && me->dims[1] == total_c &&
                    ve->ndim == 2 && ve->dims[0] == GOLDEN_STEPS &&
                    ve->dims[1] == total_c && ce->ndim == 2 &&
                    ce->dims[0] == GOLDEN_STEPS && ce->dims[1] == (uint32_t)n_bn,
                "%s: %s running statistics records have the wrong shape", cn, prefix);
  ck_assert_int_lt(t, GOLDEN_STEPS);
  const float *want_mean = (const float *)me->data + (size_t)t * total_c;
  const float *want_var = (const float *)ve->data + (size_t)t * total_c;
  const int32_t *want_count = (const int32_t *)ce->data + (size_t)t * n_bn;
  float *mean = alloc_floats(total_c), *var = alloc_floats(total_c);
  int64_t count[GOLDEN_MAX_ENTRIES];
  ck_assert_int_le(n_bn, GOLDEN_MAX_ENTRIES);
  read_running_stats(r, mean, var, count);
  size_t off = 0;
  for (int k = 0; k < n_bn; k++) {
    int layer = bl[2 * k], c = bl[2 * k + 1];
    snprintf(what, sizeof what, "%s: running_mean of layer %d", when, layer);
    check_out(r, what, mean + off, want_mean + off, (size_t)c);
    snprintf(what, sizeof what, "%s: running_var of layer %d", when, layer);
    check_out(r, what, var + off, want_var + off, (size_t)c);
    ck_assert_msg(count[k] == (int64_t)want_count[k],
                  "%s: %s: num_batches_tracked of layer %d is %lld, PyTorch's %d", cn, when,
                  layer, (long long)count[k], (int)want_count[k]);
    off += (size_t)c;
  }
  free(mean);
  free(var);
}

/* ---- training: five steps against PyTorch's optimizer ------------------------ */

/* The file's four trainings (the same batch every step): SGD-momentum and
 * AdamW, without and with gradient clipping (config.clip_grad_norm = the
 * file's clip_max_norm, a quarter of the first gradient's norm, so every step
 * clips, against torch.nn.utils.clip_grad_norm_ before every
 * optimizer.step()). prefix names the running statistics records; an
 * unclipped training also has <prefix>_loss (each step's loss; step 0's is
 * `loss`, its gradients `grads`) and <prefix>_eval_out5 (batchnorm cases: eval
 * mode after the training), a clipped one the norms clip_grad_norm_ returns
 * (before clipping: dp_ctx_grad_norm) and step 0's clipped gradients
 * (clip_grads1). */
static const struct {
  const char *prefix;
  dp_optimizer opt;
  int clip;
  const char *params; /* parameters after GOLDEN_STEPS steps */
  const char *norms;  /* clipped: each step's gradient norm */
  int ams;            /* config.amsgrad (the amsgrad_* cases) */
} trainings[] = {
    {"sgdm", DP_OPT_MOMENTUM, 0, "sgdm_params5", NULL, 0},
    {"adamw", DP_OPT_ADAMW, 0, "adamw_params5", NULL, 0},
    {"sgd_clip", DP_OPT_MOMENTUM, 1, "sgd_clip_params", "clip_norms", 0},
    {"adamw_clip", DP_OPT_ADAMW, 1, "adamw_clip_params", "adamw_clip_norms", 0},
    {"adam", DP_OPT_ADAM, 0, "adam_params5", NULL, 0}, /* the adam_* cases only */
    /* the amsgrad_* cases only */
    {"adam_ams", DP_OPT_ADAM, 0, "adam_ams_params5", NULL, 1},
    {"adamw_ams", DP_OPT_ADAMW, 0, "adamw_ams_params5", NULL, 1},
};
enum {
  TR_SGDM,
  TR_ADAMW,
  TR_SGD_CLIP,
  TR_ADAMW_CLIP,
  TR_ADAM,
  TR_ADAM_AMS,
  TR_ADAMW_AMS,
  N_TRAININGS
};

/* What a training ended with, for comparing the bits of two layouts. */
typedef struct {
  char desc[128];
  int same_bits; /* golden_run.same_bits */
  float loss[GOLDEN_STEPS], norm[GOLDEN_STEPS];
  size_t n_params, n_out, total_c;
  int n_bn;
  float *grads0; /* step 0's gradients (clipped when the training clips) */
  float *params; /* after GOLDEN_STEPS steps */
  float *eval5;  /* dp_forward after them (n_out floats; NULL when none is compared) */
  float *mean, *var;
  int64_t count[GOLDEN_MAX_ENTRIES]; /* running statistics after the last step */
} run_bits;

static void run_bits_free(run_bits *b) {
  free(b->grads0);
  free(b->params);
  free(b->eval5);
  free(b->mean);
  free(b->var);
  memset(b, 0, sizeof *b);
}

/* Runs training `ti` of the case set up as s (NULL: the file's own setup;
 * s->clip is the training's) and compares with PyTorch: first dp_forward at
 * params0 (eval mode, eval_out; it must change nothing), then at every step
 * the loss (unclipped) or the gradient norm (clipped) and the running
 * statistics, step 0's gradients, the parameters after GOLDEN_STEPS steps and
 * (batchnorm, unclipped) dp_forward after them against <prefix>_eval_out5,
 * which must leave the running statistics alone. bits: NULL, or filled with
 * the results (run_bits_free). */
static void train_and_check(const char *case_name, int ti, const run_setup *s,
                            run_bits *bits) {
  static const run_setup file_setup = {0};
  run_setup setup = s ? *s : file_setup;
  setup.clip = trainings[ti].clip;
  setup.ams = trainings[ti].ams;
  setup.inference = 0;
  const char *prefix = trainings[ti].prefix;
  golden_run r;
  run_open(&r, case_name, trainings[ti].opt, &setup);
  char key[64], what[256];
  size_t n, n_out = (size_t)r.batch * (size_t)dp_model_output_width(r.model);
  const float *want_params = golden_f32(&r.g, trainings[ti].params, &n);
  ck_assert_uint_eq(n, r.n_params);
  const float *want_grads = golden_f32(&r.g, setup.clip ? "clip_grads1" : "grads", &n);
  ck_assert_uint_eq(n, r.n_params);
  const float *want = NULL; /* each step's loss or gradient norm */
  if (setup.clip) {
    want = golden_f32(&r.g, trainings[ti].norms, &n);
  } else {
    snprintf(key, sizeof key, "%s_loss", prefix);
    want = golden_f32(&r.g, key, &n);
  }
  ck_assert_uint_eq(n, GOLDEN_STEPS);
  snprintf(key, sizeof key, "%s_eval_out5", prefix);
  const golden_entry *ee = golden_find(&r.g, key, GT_F32);
  if (ee) ck_assert_uint_eq(ee->count, n_out);
  run_bits local;
  run_bits *b = bits ? bits : &local;
  memset(b, 0, sizeof *b);
  snprintf(b->desc, sizeof b->desc, "%s", r.desc);
  b->same_bits = r.same_bits;
  b->n_params = r.n_params;
  b->n_out = n_out;
  bn_layers(&r, &b->n_bn, &b->total_c);
  ck_assert_int_le(b->n_bn, GOLDEN_MAX_ENTRIES);
  b->grads0 = alloc_floats(r.n_params);
  b->params = alloc_floats(r.n_params);
  b->mean = alloc_floats(b->total_c);
  b->var = alloc_floats(b->total_c);

  /* Eval mode at params0, with the new context's running statistics. */
  float *y = alloc_floats(n_out);
  CHECK_DP(case_name, dp_forward(r.ctx, r.batch, r.in_width, r.x, y));
  snprintf(what, sizeof what, "%s, %s: dp_forward at params0 (eval_out)", prefix, r.desc);
  check_out(&r, what, y, golden_f32(&r.g, "eval_out", NULL), n_out);

  for (int t = 0; t < GOLDEN_STEPS; t++) {
    ck_assert_msg(dp_ctx_step(r.ctx) == (uint64_t)t,
                  "%s: %s: step counter %llu before step %d", case_name, r.desc,
                  (unsigned long long)dp_ctx_step(r.ctx), t);
    float loss = NAN;
    dp_status st = dp_train_step(r.ctx, r.batch, r.in_width, r.x, r.target, &loss);
    ck_assert_msg(st == DP_OK, "%s: %s, %s: dp_train_step (step %d) -> %s: %s", case_name,
                  prefix, r.desc, t, dp_status_name(st), dp_last_error());
    b->loss[t] = loss;
    b->norm[t] = dp_ctx_grad_norm(r.ctx);
    if (setup.clip) {
      snprintf(what, sizeof what, "%s, %s: grad norm at step %d", prefix, r.desc, t);
      check_value(&r, what, b->norm[t], want[t]);
    } else {
      snprintf(what, sizeof what, "%s, %s: loss at step %d", prefix, r.desc, t);
      check_value(&r, what, loss, want[t]);
    }
    if (t == 0) {
      snprintf(what, sizeof what, "%s, %s: loss at step 0 (`loss`)", prefix, r.desc);
      if (!setup.clip) check_value(&r, what, loss, golden_f32(&r.g, "loss", NULL)[0]);
      CHECK_DP(case_name, dp_get_grads(r.ctx, b->grads0, r.n_params));
      snprintf(what, sizeof what, "%s, %s: %s grads at step 0 (params0)", prefix, r.desc,
               setup.clip ? "clipped" : "unclipped");
      check_params(&r, what, b->grads0, want_grads);
    }
    snprintf(what, sizeof what, "%s, %s: after step %d", prefix, r.desc, t);
    check_running_stats(&r, prefix, t, what);
  }
  ck_assert_uint_eq(dp_ctx_step(r.ctx), GOLDEN_STEPS);
  CHECK_DP(case_name, dp_get_params(r.ctx, b->params, r.n_params));
  snprintf(what, sizeof what, "%s, %s: params after %d steps", prefix, r.desc,
           GOLDEN_STEPS);
  check_params(&r, what, b->params, want_params);
  read_running_stats(&r, b->mean, b->var, b->count);
  if (ee) { /* eval mode after training: batchnorm's running statistics */
    CHECK_DP(case_name, dp_forward(r.ctx, r.batch, r.in_width, r.x, y));
    snprintf(what, sizeof what, "%s, %s: dp_forward after %d steps (%s)", prefix, r.desc,
             GOLDEN_STEPS, key);
    check_out(&r, what, y, ee->data, n_out);
    b->eval5 = y;
    y = NULL;
    /* dp_forward is eval mode: it leaves the running statistics alone. */
    snprintf(what, sizeof what, "%s, %s: after step %d and dp_forward", prefix, r.desc,
             GOLDEN_STEPS - 1);
    check_running_stats(&r, prefix, GOLDEN_STEPS - 1, what);
  }
  free(y);
  run_close(&r);
  if (!bits) run_bits_free(&local);
}

START_TEST(test_matches_pytorch_sgd_momentum) {
  train_and_check(golden_cases[_i], TR_SGDM, NULL, NULL);
}
END_TEST

START_TEST(test_matches_pytorch_adamw) {
  train_and_check(golden_cases[_i], TR_ADAMW, NULL, NULL);
}
END_TEST

/* The design doc's permanent example, named on its own so it shows in reports. */
START_TEST(test_seed_matches_pytorch_sgd_momentum) {
  train_and_check("seed", TR_SGDM, NULL, NULL);
}
END_TEST

/* ---- inference ---------------------------------------------------------------- */

static void check_forward(golden_run *r, const char *what) {
  size_t n;
  const float *want = golden_f32(&r->g, "eval_out", &n);
  ck_assert_uint_eq(n, (size_t)r->batch * (size_t)dp_model_output_width(r->model));
  float *y = alloc_floats(n);
  CHECK_DP(r->g.case_name, dp_forward(r->ctx, r->batch, r->in_width, r->x, y));
  check_out(r, what, y, want, n);
  free(y);
}

START_TEST(test_inference_plan_matches_pytorch_eval) {
  golden_run r;
  run_open(&r, golden_cases[_i], DP_OPT_SGD, &(run_setup){.inference = 1});
  check_forward(&r, "inference plan forward (eval_out)");
  run_close(&r);
}
END_TEST

START_TEST(test_training_ctx_forward_is_eval_mode) {
  golden_run r;
  run_open(&r, golden_cases[_i], DP_OPT_MOMENTUM, NULL);
  check_forward(&r, "training ctx forward (eval_out)");
  run_close(&r);
}
END_TEST

/* ---- data parallel == single device ----------------------------------------- */

/* dp_get_grads against PyTorch in every layout: classic, allreduce and
 * allreduce with a sharded optimizer (where each device holds the reduced
 * gradients of its shard only), on 1 to 4 devices; and the loss. Where
 * docs/DETERMINISM.md promises it (golden_run.same_bits: the bf16 cases, whose
 * micro-batch is fixed, on 1, 2 and 4 devices), the same bits as classic on 1. */
START_TEST(test_grads_same_for_1_to_4_devices_in_every_mode) {
  const char *case_name = golden_cases[_i];
  float *ref = NULL;
  size_t n_params = 0;
  float ref_loss = 0.0f;
  int ref_same_bits = 0;
  for (int li = 0; li < N_LAYOUTS; li++)
    for (int nd = 1; nd <= 4; nd++) {
      golden_run r;
      run_open(&r, case_name, DP_OPT_MOMENTUM, &(run_setup){.n_devices = nd, .layout = li});
      float *g = alloc_floats(r.n_params);
      float loss = NAN;
      CHECK_DP(case_name, dp_train_step(r.ctx, r.batch, r.in_width, r.x, r.target, &loss));
      CHECK_DP(case_name, dp_get_grads(r.ctx, g, r.n_params));
      char what[96];
      snprintf(what, sizeof what, "%s grads with %d device(s) vs PyTorch", layouts[li].name,
               nd);
      check_params(&r, what, g, golden_f32(&r.g, "grads", NULL));
      snprintf(what, sizeof what, "%s loss with %d device(s) vs PyTorch", layouts[li].name,
               nd);
      check_value(&r, what, loss, golden_f32(&r.g, "loss", NULL)[0]);
      /* The running statistics after step 0 come from params0's forward: the
       * same for both optimizers, so SGD-momentum's record serves. */
      snprintf(what, sizeof what, "%s on %d device(s) after step 0", layouts[li].name, nd);
      check_running_stats(&r, "sgdm", 0, what);
      if (!ref) {
        ref = g;
        n_params = r.n_params;
        ref_loss = loss;
        ref_same_bits = r.same_bits;
      } else {
        ck_assert_uint_eq(r.n_params, n_params);
        snprintf(what, sizeof what, "%s grads with %d devices vs classic on 1",
                 layouts[li].name, nd);
        check_params(&r, what, g, ref);
        snprintf(what, sizeof what, "%s loss with %d devices vs classic on 1",
                 layouts[li].name, nd);
        check_value(&r, what, loss, ref_loss);
        if (ref_same_bits && r.same_bits) {
          ck_assert_msg(memcmp(g, ref, n_params * sizeof *g) == 0,
                        "%s: %s: gradients differ from classic on 1 device (promised the "
                        "same bits)",
                        case_name, r.desc);
          ck_assert_msg(memcmp(&loss, &ref_loss, sizeof loss) == 0,
                        "%s: %s: loss %.9g differs from classic on 1 device's %.9g "
                        "(promised the same bits)",
                        case_name, r.desc, (double)loss, (double)ref_loss);
        }
        free(g);
      }
      run_close(&r);
    }
  free(ref);
}
END_TEST

/* ---- bf16 ------------------------------------------------------------------- */

/* A bf16 case run in fp32 by mistake must fail: its step-0 gradients or its
 * eval outputs lie outside the bf16 tolerance of PyTorch's bf16 data (the
 * generator requires a plain fp32 run at least twice the tolerance away; this
 * checks libdp's fp32), while the bf16 run passes (the tests above). */
START_TEST(test_bf16_case_run_in_fp32_fails) {
  const char *case_name = bf16_cases[_i];
  golden_run r;
  run_open(&r, case_name, DP_OPT_MOMENTUM, &(run_setup){.fp32 = 1});
  ck_assert_msg(r.bf16, "%s: not a bf16 case (no precision record)", case_name);
  size_t n_out = (size_t)r.batch * (size_t)dp_model_output_width(r.model);
  float *y = alloc_floats(n_out), *g = alloc_floats(r.n_params);
  CHECK_DP(case_name, dp_forward(r.ctx, r.batch, r.in_width, r.x, y));
  CHECK_DP(case_name, dp_train_step(r.ctx, r.batch, r.in_width, r.x, r.target, NULL));
  CHECK_DP(case_name, dp_get_grads(r.ctx, g, r.n_params));
  double out_q = norm_ratio(y, golden_f32(&r.g, "eval_out", NULL), n_out);
  double grad_q = params_norm_ratio(&r, g, golden_f32(&r.g, "grads", NULL));
  ck_assert_msg(out_q > 1.0 || grad_q > 1.0,
                "%s: fp32 passes the bf16 comparison (eval_out %.3g, grads %.3g x the "
                "tolerance): it cannot tell fp32 from bf16",
                case_name, out_q, grad_q);
  free(y);
  free(g);
  run_close(&r);
}
END_TEST

/* ---- gradient clipping -------------------------------------------------------- */

/* The clipped trainings (train_and_check) on 1, 2 and 4 devices in every layout. */
static void check_clipped_everywhere(const char *case_name, int ti) {
  for (int li = 0; li < N_LAYOUTS; li++)
    for (int nd = 1; nd <= 4; nd *= 2)
      train_and_check(case_name, ti, &(run_setup){.n_devices = nd, .layout = li}, NULL);
}

START_TEST(test_clipped_sgd_momentum_matches_pytorch_on_1_2_4_devices_in_every_mode) {
  check_clipped_everywhere(golden_cases[_i], TR_SGD_CLIP);
}
END_TEST

START_TEST(test_clipped_adamw_matches_pytorch_on_1_2_4_devices_in_every_mode) {
  check_clipped_everywhere(golden_cases[_i], TR_ADAMW_CLIP);
}
END_TEST

/* ---- torch.optim.Adam ------------------------------------------------------------ */

static void check_same_run_bits(const char *case_name, const char *prefix,
                                const run_bits *ref, const run_bits *b);

/* Adam against PyTorch on 1, 2 and 4 devices in every layout with micro-batches
 * of 8 rows (4 of them), each run within the tolerance and all of them the same
 * bits. */
START_TEST(test_adam_matches_pytorch_on_1_2_4_devices_in_every_mode_with_the_same_bits) {
  const char *name = adam_cases[_i];
  run_bits ref, b;
  int have_ref = 0;
  for (int li = 0; li < N_LAYOUTS; li++)
    for (int nd = 1; nd <= 4; nd *= 2) {
      run_setup s = {.n_devices = nd, .layout = li, .micro_batch = 8};
      train_and_check(name, TR_ADAM, &s, have_ref ? &b : &ref);
      ck_assert_msg((have_ref ? b : ref).same_bits, "%s: %s", name,
                    (have_ref ? b : ref).desc);
      if (have_ref) {
        check_same_run_bits(name, "adam", &ref, &b);
        run_bits_free(&b);
      }
      have_ref = 1;
    }
  run_bits_free(&ref);
}
END_TEST

/* Adam(amsgrad=True) and AdamW(amsgrad=True) against PyTorch on 1, 2 and 4
 * devices in every layout (the sharded optimizer's too: v_hat is cut like m
 * and v) with micro-batches of 8 rows, each run within the tolerance and all
 * of them the same bits. */
START_TEST(test_amsgrad_matches_pytorch_on_1_2_4_devices_in_every_mode_with_the_same_bits) {
  const char *name = ams_cases[_i / 2];
  int ti = _i % 2 ? TR_ADAMW_AMS : TR_ADAM_AMS;
  run_bits ref, b;
  int have_ref = 0;
  for (int li = 0; li < N_LAYOUTS; li++)
    for (int nd = 1; nd <= 4; nd *= 2) {
      run_setup s = {.n_devices = nd, .layout = li, .micro_batch = 8};
      train_and_check(name, ti, &s, have_ref ? &b : &ref);
      ck_assert_msg((have_ref ? b : ref).same_bits, "%s: %s", name,
                    (have_ref ? b : ref).desc);
      if (have_ref) {
        check_same_run_bits(name, trainings[ti].prefix, &ref, &b);
        run_bits_free(&b);
      }
      have_ref = 1;
    }
  run_bits_free(&ref);
}
END_TEST

/* ---- every layout, every micro-batch size (batchnorm) ------------------------- */

/* Fails unless a and b (n floats of `what`) are the same bits. */
static void check_same_bits(const char *case_name, const char *prefix, const char *what,
                            const run_bits *ref, const run_bits *b, const float *x,
                            const float *y, size_t n) {
  if (memcmp(x, y, n * sizeof *x) == 0) return;
  size_t i = 0;
  while (memcmp(&x[i], &y[i], sizeof *x) == 0) i++;
  ck_abort_msg("%s: %s: %s differs between %s and %s (promised the same bits): [%zu] "
               "%.9g vs %.9g",
               case_name, prefix, what, ref->desc, b->desc, i, (double)x[i], (double)y[i]);
}

static void check_same_run_bits(const char *case_name, const char *prefix,
                                const run_bits *ref, const run_bits *b) {
  ck_assert(ref->n_params == b->n_params && ref->total_c == b->total_c &&
            ref->n_bn == b->n_bn && ref->n_out == b->n_out && !ref->eval5 == !b->eval5);
  check_same_bits(case_name, prefix, "each step's loss", ref, b, ref->loss, b->loss,
                  GOLDEN_STEPS);
  check_same_bits(case_name, prefix, "each step's gradient norm", ref, b, ref->norm,
                  b->norm, GOLDEN_STEPS);
  check_same_bits(case_name, prefix, "step 0's gradients", ref, b, ref->grads0, b->grads0,
                  b->n_params);
  check_same_bits(case_name, prefix, "the parameters after training", ref, b, ref->params,
                  b->params, b->n_params);
  check_same_bits(case_name, prefix, "running_mean after training", ref, b, ref->mean,
                  b->mean, b->total_c);
  check_same_bits(case_name, prefix, "running_var after training", ref, b, ref->var, b->var,
                  b->total_c);
  ck_assert_msg(memcmp(ref->count, b->count, (size_t)b->n_bn * sizeof *b->count) == 0,
                "%s: %s: num_batches_tracked differs between %s and %s", case_name, prefix,
                ref->desc, b->desc);
  if (b->eval5)
    check_same_bits(case_name, prefix, "dp_forward after training", ref, b, ref->eval5,
                    b->eval5, b->n_out);
}

/* The layout sweeps: each bn_sync case with each of sync_micro_batches, and
 * each per_replica batchnorm case and bf16 batchnorm case with its file's
 * micro-batch size (the only one PyTorch's data holds for it: bf16 rounds each
 * micro-batch's weight gradients, sync or not). Sync batchnorm's statistics are the whole
 * batch's whatever the micro-batches, so a bn_sync case must match PyTorch
 * with every size (1 leaves one value per channel in each micro-batch of a
 * 1d batchnorm, which only whole-batch statistics can normalise), and in
 * per_replica mode with the whole batch as one micro-batch (the same
 * statistics: the sync data checked against per_replica's code too). */
static const char *const sync_cases[] = {"bn_sync_mlp", "bn_sync_cnn", "bn_sync_two",
                                         "bn_sync_opts", "resnet_sync"};
static const char *const file_mb_cases[] = {"bn_mlp",      "bn_cnn",          "bn_two",
                                            "bn_opts_mlp", "bn_opts_cnn",     "bf16_bn_mlp",
                                            "bf16_bn_cnn", "bf16_bn_sync_cnn"};
static const struct {
  int micro_batch; /* run_setup.micro_batch: 0 the file's, MB_NONE, MB_BATCH or rows */
  int per_replica;
} sync_micro_batches[] = {{0, 0}, {MB_NONE, 0}, {1, 0}, {2, 0}, {MB_BATCH, 1}};
#define N_SYNC_SWEEPS                                                                      \
  ((int)(sizeof sync_cases / sizeof sync_cases[0] *                                        \
         (sizeof sync_micro_batches / sizeof sync_micro_batches[0])))
#define N_SWEEPS (N_SYNC_SWEEPS + (int)(sizeof file_mb_cases / sizeof file_mb_cases[0]))

/* Sweep i: its case, and its setup's micro-batch fields. */
static const char *sweep(int i, run_setup *s) {
  memset(s, 0, sizeof *s);
  if (i >= N_SYNC_SWEEPS) return file_mb_cases[i - N_SYNC_SWEEPS];
  int n = (int)(sizeof sync_micro_batches / sizeof sync_micro_batches[0]);
  s->micro_batch = sync_micro_batches[i % n].micro_batch;
  s->per_replica = sync_micro_batches[i % n].per_replica;
  return sync_cases[i / n];
}

/* Every training of a sweep on 1 to 4 devices in every layout against
 * PyTorch (train_and_check), and, where docs/DETERMINISM.md promises it
 * (golden_run.same_bits: a fixed micro-batch size and 1, 2 or 4 devices
 * dividing the micro-batch count), the same bits as classic on 1 device:
 * losses, gradient norms, step 0's gradients, the parameters and running
 * statistics after training and the eval outputs after it. */
START_TEST(test_every_layout_matches_pytorch_and_fixed_micro_batch_gives_same_bits) {
  run_setup s;
  const char *case_name = sweep(_i, &s);
  for (int ti = 0; ti < N_TRAININGS; ti++) {
    if (ti >= TR_ADAM) continue; /* the adam_* and amsgrad_* cases' own, none of these */
    run_bits ref = {0};
    for (s.layout = 0; s.layout < N_LAYOUTS; s.layout++)
      for (s.n_devices = 1; s.n_devices <= 4; s.n_devices++) {
        run_bits b;
        train_and_check(case_name, ti, &s, &b);
        if (s.layout == 0 && s.n_devices == 1) /* the reference */
          ck_assert_msg(b.same_bits == (s.micro_batch != MB_NONE), "%s: %s", case_name,
                        b.desc);
        if (!b.same_bits) {
          run_bits_free(&b);
        } else if (!ref.params) {
          ref = b;
        } else {
          check_same_run_bits(case_name, trainings[ti].prefix, &ref, &b);
          run_bits_free(&b);
        }
      }
    run_bits_free(&ref);
  }
}
END_TEST

/* ---- suite ------------------------------------------------------------------ */

Suite *golden_suite(void) {
  Suite *s = suite_create("golden");

  TCase *tc = tcase_create("sgd_momentum");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_seed_matches_pytorch_sgd_momentum);
  tcase_add_loop_test(tc, test_matches_pytorch_sgd_momentum, 0, N_GOLDEN_CASES);
  suite_add_tcase(s, tc);

  tc = tcase_create("adamw");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, test_matches_pytorch_adamw, 0, N_GOLDEN_CASES);
  suite_add_tcase(s, tc);

  tc = tcase_create("adam");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(
      tc, test_adam_matches_pytorch_on_1_2_4_devices_in_every_mode_with_the_same_bits, 0,
      N_ADAM_CASES);
  suite_add_tcase(s, tc);

  tc = tcase_create("amsgrad");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(
      tc, test_amsgrad_matches_pytorch_on_1_2_4_devices_in_every_mode_with_the_same_bits, 0,
      2 * N_AMS_CASES);
  suite_add_tcase(s, tc);

  tc = tcase_create("inference");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, test_inference_plan_matches_pytorch_eval, 0, N_GOLDEN_CASES);
  tcase_add_loop_test(tc, test_training_ctx_forward_is_eval_mode, 0, N_GOLDEN_CASES);
  suite_add_tcase(s, tc);

  tc = tcase_create("device_count");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, test_grads_same_for_1_to_4_devices_in_every_mode, 0,
                      N_GOLDEN_CASES);
  suite_add_tcase(s, tc);

  tc = tcase_create("clip_grad_norm");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(
      tc, test_clipped_sgd_momentum_matches_pytorch_on_1_2_4_devices_in_every_mode, 0,
      N_GOLDEN_CASES);
  tcase_add_loop_test(tc, test_clipped_adamw_matches_pytorch_on_1_2_4_devices_in_every_mode,
                      0, N_GOLDEN_CASES);
  suite_add_tcase(s, tc);

  tc = tcase_create("bf16");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, test_bf16_case_run_in_fp32_fails, 0, N_BF16_CASES);
  suite_add_tcase(s, tc);

  tc = tcase_create("batchnorm_layouts");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(
      tc, test_every_layout_matches_pytorch_and_fixed_micro_batch_gives_same_bits, 0,
      N_SWEEPS);
  suite_add_tcase(s, tc);

  return s;
}
