/* Tests of `dp repro` (tools/cmd_repro.c), end to end: dpt_cmd_repro on small
 * temporary model and CSV files, with stdout and stderr captured.
 *
 *   agree      fixed micro-batches: 1, 2, 4 (and 8) devices give the same bits,
 *              dropout and layernorm included; exit 0; tensors named as
 *              PyTorch's state_dict names an nn.Sequential
 *   diverge    without a fixed micro-batch, 1 and 2 devices cut the sums
 *              differently: exit 1, and the step, tensor and max abs difference
 *              printed are those an independent run through dp.h finds
 *   refused    configurations the library refuses: "refused: <why>", exit 2
 *              (unless --skip-refused); classic vs allreduce vs sharded agree
 *              wherever the library runs them
 *   usage      bad command lines exit 2 with a message; --help explains
 */
#include "capture.h"
#include "cli.h"
#include "data.h"
#include "helpers.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REPRO(res, ...) capture(ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), (res))

/* layer 0 linear, 1 layernorm, 2 gelu, 3 dropout, 4 linear nobias, 5 tanh, 6 linear */
static const char MLP_SPEC[] = "# repro test model\n"
                               "input 6\n"
                               "linear 16\nlayernorm\ngelu\ndropout 0.25\n"
                               "linear 8 nobias\ntanh\n"
                               "linear 3\n"
                               "loss softmax_cross_entropy\n";
/* its state_dict: names and element counts */
static const char *const MLP_TENSORS[] = {"0.weight", "0.bias",   "1.weight", "1.bias",
                                          "4.weight", "6.weight", "6.bias"};
static const size_t MLP_SIZES[] = {16 * 6, 16, 16, 16, 8 * 16, 3 * 8, 3};
#define MLP_N_TENSORS 7

static const char MSE_SPEC[] = "input 4\nlinear 8\nrelu\nlinear 2\nloss mse\n";

/* ---- helpers ---------------------------------------------------------------- */

typedef struct {
  char path[64];
} tmp_file;

static void tmp_write(tmp_file *t, const char *text) {
  snprintf(t->path, sizeof t->path, "/tmp/dp_repro_XXXXXX");
  int fd = mkstemp(t->path);
  ck_assert_msg(fd >= 0, "mkstemp failed");
  size_t len = strlen(text);
  ck_assert_int_eq((int)write(fd, text, len), (int)len);
  close(fd);
}

static double rng_unif(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-53; }

/* A classification CSV: rows of "label,f1..f6", 3 classes. */
static void classification_csv(tmp_file *t, int rows) {
  size_t cap = (size_t)rows * 128 + 1;
  char *text = malloc(cap);
  ck_assert_ptr_nonnull(text);
  size_t len = 0;
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (int r = 0; r < rows; r++) {
    double f[6], score = 0.0;
    for (int k = 0; k < 6; k++) {
      f[k] = 4.0 * rng_unif(&s) - 1.0;
      score += (k % 2 ? -1.0 : 1.0) * f[k];
    }
    int label = score < -0.5 ? 0 : score < 0.5 ? 1 : 2;
    len += (size_t)snprintf(text + len, cap - len, "%d", label);
    for (int k = 0; k < 6; k++)
      len += (size_t)snprintf(text + len, cap - len, ",%.5f", f[k]);
    len += (size_t)snprintf(text + len, cap - len, "\n");
  }
  tmp_write(t, text);
  free(text);
}

/* A regression CSV: "t1,t2,f1..f4". */
static void regression_csv(tmp_file *t, int rows) {
  size_t cap = (size_t)rows * 128 + 1;
  char *text = malloc(cap);
  ck_assert_ptr_nonnull(text);
  size_t len = 0;
  uint64_t s = 12345;
  for (int r = 0; r < rows; r++) {
    double f[4];
    for (int k = 0; k < 4; k++) f[k] = 2.0 * rng_unif(&s) - 1.0;
    len +=
        (size_t)snprintf(text + len, cap - len, "%.5f,%.5f", f[0] - 2 * f[1], f[2] * f[3]);
    for (int k = 0; k < 4; k++)
      len += (size_t)snprintf(text + len, cap - len, ",%.5f", f[k]);
    len += (size_t)snprintf(text + len, cap - len, "\n");
  }
  tmp_write(t, text);
  free(text);
}

typedef cmd_result result;

static void result_free(result *r) { cmd_result_free(r); }

/* Runs dpt_cmd_repro with stdout and stderr going to temporary files. */
static void capture(int argc, char **argv, result *res) {
  *res = capture_cmd(dpt_cmd_repro, argc, argv);
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

/* Trains `steps` steps as dp repro feeds a configuration (all rows,
 * standardised; step s takes positions s*B.. of the endless sequence of epoch
 * orders), independently of tools/cmd_repro.c. params: (steps, n_params)
 * after each step; loss: (steps); *hash: dp_params_hash at the end. */
static void train_like_repro(const char *spec, const char *csv, const dp_config *cfg,
                             int steps, float *params, float *loss, uint64_t *hash) {
  dp_model *m = NULL;
  dpt_dataset d = {0};
  char err[256];
  ck_assert_msg(dp_model_load(spec, &m) == DP_OK, "%s", dp_last_error());
  ck_assert_msg(dpt_csv_load(csv, &d, err, sizeof err) == DP_OK, "%s", err);
  dpt_standardize(&d, NULL);
  dp_plan *p = plan_of(m, cfg);
  dp_ctx *c = ctx_of(p);
  int B = cfg->batch, F = d.n_features, epoch = -1;
  size_t np = dp_model_n_params(m);
  float *x = malloc((size_t)B * F * sizeof *x);
  int32_t *t = malloc((size_t)B * sizeof *t);
  int *perm = malloc((size_t)d.n_rows * sizeof *perm);
  ck_assert(x && t && perm);
  for (int s = 0; s < steps; s++) {
    for (int r = 0; r < B; r++) {
      long pos = (long)s * B + r;
      if (pos / d.n_rows != epoch) {
        epoch = (int)(pos / d.n_rows);
        dpt_epoch_order(d.n_rows, cfg->seed, epoch, perm);
      }
      int src = perm[pos % d.n_rows];
      memcpy(x + (size_t)r * F, d.x + (size_t)src * F, (size_t)F * sizeof *x);
      t[r] = d.label[src];
    }
    ck_assert_msg(dp_train_step(c, B, F, x, t, &loss[s]) == DP_OK, "%s", dp_ctx_error(c));
    ck_assert(dp_get_params(c, params + (size_t)s * np, np) == DP_OK);
  }
  *hash = dp_params_hash(c);
  free(x);
  free(t);
  free(perm);
  dpt_dataset_free(&d);
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
}

/* 1 when the library plans (and so `dp repro` runs) `mode` on n devices. */
static int library_runs(const char *spec, int batch, int micro, int n, dp_mode mode,
                        int shard) {
  dp_model *m = model_of(spec);
  dp_plan *p = NULL;
  dp_config c = config_of(batch, n, DP_OPT_ADAMW);
  c.micro_batch = micro;
  c.mode = mode;
  c.shard_optimizer = shard;
  int ok = dp_plan_create(m, &c, &p) == DP_OK;
  dp_plan_free(p);
  dp_model_free(m);
  return ok;
}

/* ---- agree ------------------------------------------------------------------ */

START_TEST(test_fixed_micro_batches_agree_for_1_2_4_devices) {
  tmp_file spec, csv;
  tmp_write(&spec, MLP_SPEC);
  classification_csv(&csv, 40);
  result r;
  REPRO(&r, "--model", spec.path, "--data", csv.path, "--batch", "16", "--micro-batch", "4",
        "--steps", "6", "--devices", "1,2,4", "--mode", "classic", "--seed", "3",
        "--trace");
  ck_assert_msg(r.rc == 0, "exit %d\nstdout:\n%s\nstderr:\n%s", r.rc, r.out, r.err);
  ck_assert_msg(strstr(r.out, "same: 3 configurations gave the same bits"), "%s", r.out);
  ck_assert_msg(!strstr(r.out, "DIFFERS"), "%s", r.out);
  ck_assert_int_eq(count_of(r.out, "  same\n"), 2);
  ck_assert_int_eq(count_of(r.out, "  reference\n"), 1);
  /* state_dict names of an nn.Sequential: layer index after `input`; a
   * layernorm has weight and bias, a `nobias` linear only a weight */
  for (int i = 0; i < MLP_N_TENSORS; i++)
    ck_assert_msg(strstr(r.out, MLP_TENSORS[i]), "trace lacks %s:\n%s", MLP_TENSORS[i],
                  r.out);
  ck_assert_msg(!strstr(r.out, "4.bias") && !strstr(r.out, "3.weight"), "%s", r.out);
  /* the trace: one row per step and configuration, none marked */
  ck_assert_int_eq(count_of(r.out, "  1 device classic "), 6);
  ck_assert_int_eq(count_of(r.out, "  4 devices classic "), 6);
  ck_assert_msg(!strstr(r.out, "  *\n"), "%s", r.out);
  result_free(&r);
  unlink(spec.path);
  unlink(csv.path);
}
END_TEST

/* A GPT on a text's bytes (--text) and on the same ids as a .npy (--tokens): 1, 2, 4
 * devices x classic, allreduce, sharded give one set of bits, the same from both files;
 * a sequence model with --data, a flat one with --text, and two sources are refused. */
static const char GPT_SMALL[] = "input tokens 8\nembed 256 16\nresidual\nlayernorm\n"
                                "linear 48\nattention 2\nlinear 16\nend\nlayernorm\n"
                                "linear 256\nloss softmax_cross_entropy\n";

/* --batchnorm sync reaches every configuration: a GPT block with batchnorm on
 * the sequence inside a residual block and after it gives one set of bits on
 * 1, 2 and 4 devices in every mode, in each batchnorm mode, and the two modes'
 * bits differ (micro-batches of 2 rows: per replica normalises each, sync
 * the batch's 8). */
static const char GPT_BN[] = "input tokens 8\nembed 256 16\nresidual\nlinear 48 nobias\n"
                             "attention 2\nlinear 16 nobias\nbatchnorm\nend\n"
                             "batchnorm momentum 0.2\nlinear 256\n"
                             "loss softmax_cross_entropy\n";

START_TEST(test_batchnorm_modes_agree_on_a_sequence_model) {
  tmp_file spec, text;
  tmp_write(&spec, GPT_BN);
  char body[400];
  for (int i = 0; i < (int)sizeof body - 1; i++)
    body[i] = (char)('a' + (i * 5 + i / 7) % 26);
  body[sizeof body - 1] = '\0';
  tmp_write(&text, body);
  result r[2];
  char *modes[2] = {"per_replica", "sync"};
  for (int k = 0; k < 2; k++) {
    REPRO(&r[k], "--model", spec.path, "--text", text.path, "--batch", "8", "--micro-batch",
          "2", "--steps", "3", "--devices", "1,2,4", "--optimizer", "adamw", "--batchnorm",
          modes[k], "--json");
    ck_assert_msg(r[k].rc == 0, "%s: exit %d\n%s\n%s", modes[k], r[k].rc, r[k].out,
                  r[k].err);
    ck_assert_msg(count_of(r[k].out, "\"same\": true") == 9 &&
                      strstr(r[k].out, "\"result\": \"same\""),
                  "%s:\n%s", modes[k], r[k].out);
    char want[64];
    snprintf(want, sizeof want, "\"batchnorm\": \"%s\"", modes[k]);
    ck_assert_msg(strstr(r[k].out, want), "%s", r[k].out);
  }
  /* the reference's parameter hash: another in the other mode */
  const char *h0 = strstr(r[0].out, "\"params_hash\""),
             *h1 = strstr(r[1].out, "\"params_hash\"");
  ck_assert_ptr_nonnull(h0);
  ck_assert_ptr_nonnull(h1);
  ck_assert_msg(strncmp(h0, h1, 34) != 0, "per_replica and sync: %.34s", h0);
  result_free(&r[0]);
  result_free(&r[1]);
  unlink(spec.path);
  unlink(text.path);
}
END_TEST

START_TEST(test_sequence_model_agrees_on_text_and_tokens) {
  tmp_file spec, text, csv;
  tmp_write(&spec, GPT_SMALL);
  char body[600];
  for (int i = 0; i < (int)sizeof body - 1; i++)
    body[i] = (char)('a' + (i * 7 + i / 13) % 26);
  body[sizeof body - 1] = '\0';
  tmp_write(&text, body);
  /* the same bytes as a 1-D '<u2' .npy */
  char npy[64] = "/tmp/dp_repro_XXXXXX";
  int fd = mkstemp(npy);
  ck_assert_int_ge(fd, 0);
  char head[128];
  int hl = snprintf(head, sizeof head,
                    "{'descr': '<u2', 'fortran_order': False, 'shape': (%d,), }",
                    (int)strlen(body));
  while ((10 + hl + 1) % 64) head[hl++] = ' ';
  head[hl++] = '\n';
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)hl, 0};
  ck_assert_int_eq((int)write(fd, pre, 10), 10);
  ck_assert_int_eq((int)write(fd, head, (size_t)hl), hl);
  for (size_t i = 0; i < strlen(body); i++) {
    unsigned char v[2] = {(unsigned char)body[i], 0};
    ck_assert_int_eq((int)write(fd, v, 2), 2);
  }
  close(fd);
  result r, q;
  REPRO(&r, "--model", spec.path, "--text", text.path, "--batch", "8", "--micro-batch", "2",
        "--steps", "3", "--devices", "1,2,4", "--optimizer", "adamw");
  ck_assert_msg(r.rc == 0, "exit %d\n%s\n%s", r.rc, r.out, r.err);
  ck_assert_msg(strstr(r.out, "same: 9 configurations gave the same bits"), "%s", r.out);
  REPRO(&q, "--model", spec.path, "--tokens", npy, "--batch", "8", "--micro-batch", "2",
        "--steps", "3", "--devices", "1", "--mode", "classic", "--optimizer", "adamw");
  ck_assert_msg(q.rc == 0, "exit %d\n%s\n%s", q.rc, q.out, q.err);
  /* the reference row (1 device classic) of both: the same loss and hash */
  const char *a = strstr(r.out, "      1  classic"), *b = strstr(q.out, "      1  classic");
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(b);
  ck_assert_int_eq(strncmp(a, b, 60), 0);
  result_free(&r);
  result_free(&q);
  classification_csv(&csv, 20);
  REPRO(&r, "--model", spec.path, "--data", csv.path, "--batch", "8");
  ck_assert_int_eq(r.rc, 1);
  ck_assert_msg(strstr(r.err, "is a sequence model (input tokens 8): give it --text"), "%s",
                r.err);
  result_free(&r);
  tmp_file flat;
  tmp_write(&flat, MLP_SPEC);
  REPRO(&r, "--model", flat.path, "--text", text.path, "--batch", "8");
  ck_assert_int_eq(r.rc, 1);
  ck_assert_msg(strstr(r.err, "is not a sequence model"), "%s", r.err);
  result_free(&r);
  REPRO(&r, "--model", spec.path, "--text", text.path, "--tokens", npy, "--batch", "8");
  ck_assert_int_eq(r.rc, 2);
  ck_assert_msg(strstr(r.err, "--data, --text and --tokens are alternatives"), "%s", r.err);
  result_free(&r);
  unlink(spec.path);
  unlink(text.path);
  unlink(csv.path);
  unlink(flat.path);
  unlink(npy);
}
END_TEST

START_TEST(test_regression_agrees_up_to_8_devices_with_wrapping_batches) {
  /* 12 rows, batch 16: every batch wraps into the next shuffled pass */
  tmp_file spec, csv;
  tmp_write(&spec, MSE_SPEC);
  regression_csv(&csv, 12);
  result r;
  REPRO(&r, "--model", spec.path, "--data", csv.path, "--batch", "16", "--micro-batch", "2",
        "--steps", "5", "--devices", "8,4,2,1", "--mode", "classic", "--optimizer",
        "momentum");
  ck_assert_msg(r.rc == 0, "exit %d\nstdout:\n%s\nstderr:\n%s", r.rc, r.out, r.err);
  ck_assert_msg(strstr(r.out, "same: 4 configurations"), "%s", r.out);
  ck_assert_msg(strstr(r.out, "regression"), "%s", r.out);
  result_free(&r);
  unlink(spec.path);
  unlink(csv.path);
}
END_TEST

/* ---- diverge ---------------------------------------------------------------- */

/* The first divergence between 1 and 2 devices without a fixed micro-batch,
 * found through dp.h: *step (1-based; 0 = none), *tensor (-1 = the loss
 * only), the max abs difference and its element. Also the tensor hashes of
 * 1 device after step 1 and both final parameter hashes. */
typedef struct {
  int step, tensor;
  double max_diff;
  size_t at;
  uint64_t first_hash[MLP_N_TENSORS], final_hash[2];
} expected_divergence;

#define DIV_STEPS 4

static expected_divergence find_divergence(const char *spec, const char *csv) {
  expected_divergence e = {0};
  size_t np = 0;
  for (int i = 0; i < MLP_N_TENSORS; i++) np += MLP_SIZES[i];
  float *w[2], loss[2][DIV_STEPS];
  for (int k = 0; k < 2; k++) {
    w[k] = malloc(DIV_STEPS * np * sizeof *w[k]);
    ck_assert_ptr_nonnull(w[k]);
    dp_config c;
    dp_config_default(&c);
    c.batch = 16;
    c.n_devices = k + 1;
    c.seed = 5;
    train_like_repro(spec, csv, &c, DIV_STEPS, w[k], loss[k], &e.final_hash[k]);
  }
  e.tensor = -1;
  for (int s = 0; s < DIV_STEPS && !e.step; s++) {
    size_t off = 0;
    for (int i = 0; i < MLP_N_TENSORS && !e.step; off += MLP_SIZES[i], i++) {
      const float *a = w[0] + s * np + off, *b = w[1] + s * np + off;
      if (memcmp(a, b, MLP_SIZES[i] * sizeof *a) == 0) continue;
      e.step = s + 1;
      e.tensor = i;
      for (size_t j = 0; j < MLP_SIZES[i]; j++) {
        double d = fabs((double)a[j] - (double)b[j]);
        if (d > e.max_diff) e.max_diff = d, e.at = j;
      }
    }
    if (!e.step && memcmp(&loss[0][s], &loss[1][s], sizeof(float)) != 0) e.step = s + 1;
  }
  size_t off = 0;
  for (int i = 0; i < MLP_N_TENSORS; off += MLP_SIZES[i], i++)
    e.first_hash[i] = dp_hash_bytes(w[0] + off, MLP_SIZES[i] * sizeof(float));
  free(w[0]);
  free(w[1]);
  return e;
}

START_TEST(test_chunk_micro_batches_diverge_and_the_report_names_where) {
  tmp_file spec, csv;
  tmp_write(&spec, MLP_SPEC);
  classification_csv(&csv, 40);
  expected_divergence e = find_divergence(spec.path, csv.path);
  /* one micro-batch of 16 rows vs two of 8: the per-row sums associate
   * differently, so some bit must differ within a few steps */
  ck_assert_msg(e.step > 0,
                "1 and 2 devices without micro-batches agreed; pick other data");
  ck_assert_msg(e.tensor >= 0, "only the loss differs at step %d", e.step);

  result r;
  REPRO(&r, "--model", spec.path, "--data", csv.path, "--batch", "16", "--steps", "4",
        "--devices", "1,2", "--mode", "classic", "--seed", "5", "--trace");
  ck_assert_msg(r.rc == 1, "exit %d\nstdout:\n%s\nstderr:\n%s", r.rc, r.out, r.err);
  char want[256];
  snprintf(want, sizeof want, "first divergence at step %d, tensor %s (", e.step,
           MLP_TENSORS[e.tensor]);
  ck_assert_msg(strstr(r.out, want), "lacks '%s':\n%s", want, r.out);
  ck_assert_msg(
      strstr(r.out, "between 1 device classic (the reference) and 2 devices classic"), "%s",
      r.out);
  snprintf(want, sizeof want, "max abs difference %.9g at %s[", e.max_diff,
           MLP_TENSORS[e.tensor]);
  ck_assert_msg(strstr(r.out, want), "lacks '%s':\n%s", want, r.out);
  ck_assert_msg(strstr(r.out, "note: without --micro-batch"), "%s", r.out);
  /* the trace's hashes and the table's parameter hashes are those of the
   * independent run */
  for (int i = 0; i < MLP_N_TENSORS; i++) {
    snprintf(want, sizeof want, "%016llx", (unsigned long long)e.first_hash[i]);
    ck_assert_msg(strstr(r.out, want), "trace lacks %s's hash %s:\n%s", MLP_TENSORS[i],
                  want, r.out);
  }
  snprintf(want, sizeof want, "  %016llx  reference\n",
           (unsigned long long)e.final_hash[0]);
  ck_assert_msg(strstr(r.out, want), "lacks '%s':\n%s", want, r.out);
  snprintf(want, sizeof want, "  %016llx  DIFFERS from step %d\n",
           (unsigned long long)e.final_hash[1], e.step);
  ck_assert_msg(strstr(r.out, want), "lacks '%s':\n%s", want, r.out);
  ck_assert_msg(count_of(r.out, "  *\n") >= 1, "no trace row marked:\n%s", r.out);
  result_free(&r);

  REPRO(&r, "--model", spec.path, "--data", csv.path, "--batch", "16", "--steps", "4",
        "--devices", "1,2", "--mode", "classic", "--seed", "5", "--json");
  ck_assert_int_eq(r.rc, 1);
  snprintf(want, sizeof want, "\"divergence\": {\"step\": %d, \"tensor\": \"%s\"", e.step,
           MLP_TENSORS[e.tensor]);
  ck_assert_msg(strstr(r.out, want), "lacks '%s':\n%s", want, r.out);
  snprintf(want, sizeof want, "\"first_diverging_step\": %d}", e.step);
  ck_assert_msg(strstr(r.out, want), "lacks '%s':\n%s", want, r.out);
  ck_assert_msg(strstr(r.out, "\"result\": \"differs\""), "%s", r.out);
  ck_assert_msg(strstr(r.out, "\"exit_status\": 1\n}\n"), "%s", r.out);
  ck_assert_msg(!strstr(r.out, "\"trace\""), "%s", r.out);
  result_free(&r);
  unlink(spec.path);
  unlink(csv.path);
}
END_TEST

/* ---- refused ---------------------------------------------------------------- */

/* --backend-option reaches every configuration: with the cpu backend's
 * params=shared, 1, 2 and 4 devices in classic mode agree and give the bits of
 * copies (the same parameter hash); allreduce and sharded are refused, saying
 * why; the header names the option. */
START_TEST(test_backend_options_reach_every_configuration) {
  tmp_file spec, csv;
  tmp_write(&spec, MLP_SPEC);
  classification_csv(&csv, 40);
  result r[2];
  for (int k = 0; k < 2; k++) {
    REPRO(&r[k], "--model", spec.path, "--data", csv.path, "--batch", "16", "--micro-batch",
          "4", "--steps", "4", "--devices", "1,2,4", "--seed", "3", "--skip-refused",
          "--backend-option", k ? "params=shared" : "params=copy");
    ck_assert_msg(r[k].rc == 0, "exit %d\nstdout:\n%s\nstderr:\n%s", r[k].rc, r[k].out,
                  r[k].err);
    ck_assert_msg(strstr(r[k].out, k ? "cpu backend (params=shared)" : "(params=copy)"),
                  "%s", r[k].out);
  }
  ck_assert_msg(strstr(r[0].out, "same: 9 configurations"), "%s", r[0].out);
  ck_assert_msg(strstr(r[1].out, "same: 3 configurations"), "%s", r[1].out);
  ck_assert_int_eq(count_of(r[1].out, "refused: params=shared needs classic mode"), 6);
  /* one hash: the 1-device classic reference row of both */
  const char *a = strstr(r[0].out, "reference"), *b = strstr(r[1].out, "reference");
  ck_assert(a && b && a - r[0].out > 18 && b - r[1].out > 18);
  ck_assert_msg(memcmp(a - 18, b - 18, 16) == 0, "%.16s vs %.16s", a - 18, b - 18);
  result_free(&r[0]);
  result_free(&r[1]);
  unlink(spec.path);
  unlink(csv.path);
}
END_TEST

START_TEST(test_refused_configurations_exit_2) {
  tmp_file spec, csv;
  tmp_write(&spec, MLP_SPEC);
  classification_csv(&csv, 20);
  result r;
  /* lr 0 parses, and the library refuses every configuration */
  REPRO(&r, "--model", spec.path, "--data", csv.path, "--batch", "8", "--micro-batch", "2",
        "--devices", "1,2", "--mode", "classic", "--lr", "0");
  ck_assert_msg(r.rc == 2, "exit %d\n%s", r.rc, r.out);
  ck_assert_int_eq(count_of(r.out, "refused: learning rate must be finite and > 0"), 2);
  ck_assert_msg(strstr(r.out, "no configuration could run"), "%s", r.out);
  result_free(&r);
  REPRO(&r, "--model", spec.path, "--data", csv.path, "--batch", "8", "--micro-batch", "2",
        "--devices", "1,2", "--mode", "classic", "--lr", "0", "--skip-refused", "--json");
  ck_assert_msg(r.rc == 2, "nothing ran, yet exit %d\n%s", r.rc, r.out);
  ck_assert_msg(strstr(r.out, "\"status\": \"refused\", \"message\": \"learning rate"),
                "%s", r.out);
  ck_assert_msg(strstr(r.out, "\"result\": \"refused\""), "%s", r.out);
  result_free(&r);
  unlink(spec.path);
  unlink(csv.path);
}
END_TEST

START_TEST(test_modes_agree_where_the_library_runs_them) {
  tmp_file spec, csv;
  tmp_write(&spec, MLP_SPEC);
  classification_csv(&csv, 40);
  int runs_all = 1;
  for (int n = 1; n <= 4; n *= 2)
    runs_all &= library_runs(MLP_SPEC, 16, 4, n, DP_MODE_ALLREDUCE, 0) &&
                library_runs(MLP_SPEC, 16, 4, n, DP_MODE_ALLREDUCE, 1);
  result r;
  REPRO(&r, "--model", spec.path, "--data", csv.path, "--batch", "16", "--micro-batch", "4",
        "--steps", "4", "--devices", "1,2,4", "--mode", "classic,allreduce,sharded",
        "--optimizer", "adamw", "--lr", "0.003");
  if (runs_all) {
    ck_assert_msg(r.rc == 0, "exit %d\n%s\n%s", r.rc, r.out, r.err);
    ck_assert_msg(strstr(r.out, "same: 9 configurations"), "%s", r.out);
  } else {
    ck_assert_msg(r.rc == 2, "exit %d\n%s\n%s", r.rc, r.out, r.err);
    ck_assert_msg(strstr(r.out, "refused: "), "%s", r.out);
    ck_assert_msg(strstr(r.out, "(exit status 2; --skip-refused to ignore)"), "%s", r.out);
    ck_assert_msg(!strstr(r.out, "DIFFERS"), "%s", r.out);
  }
  result_free(&r);
  REPRO(&r, "--model", spec.path, "--data", csv.path, "--batch", "16", "--micro-batch", "4",
        "--steps", "4", "--devices", "1,2,4", "--mode", "classic,allreduce,sharded",
        "--optimizer", "adamw", "--lr", "0.003", "--skip-refused");
  ck_assert_msg(r.rc == 0, "exit %d\n%s\n%s", r.rc, r.out, r.err);
  result_free(&r);
  unlink(spec.path);
  unlink(csv.path);
}
END_TEST

/* ---- usage ------------------------------------------------------------------ */

static void usage_error(result *r, const char *needle) {
  ck_assert_msg(r->rc == 2, "exit %d for a bad command line\n%s", r->rc, r->err);
  ck_assert_msg(strstr(r->err, needle), "stderr lacks '%s':\n%s", needle, r->err);
  ck_assert_msg(r->out[0] == '\0', "printed on stdout:\n%s", r->out);
  result_free(r);
}

START_TEST(test_usage_errors_exit_2) {
  result r;
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv");
  usage_error(&r, "--batch are required");
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv", "--batch", "4", "--devices", "1,1");
  usage_error(&r, "1 appears twice");
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv", "--batch", "4", "--devices", "0");
  usage_error(&r, "--devices");
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv", "--batch", "4", "--devices", "2,,4");
  usage_error(&r, "--devices");
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv", "--batch", "4", "--devices", "65");
  usage_error(&r, "out of range");
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv", "--batch", "4", "--mode", "classic,ddp");
  usage_error(&r, "'ddp' is not one of classic|allreduce|sharded");
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv", "--batch", "4", "--mode",
        "sharded,SHARDED");
  usage_error(&r, "appears twice");
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv", "--batch", "4", "--steps", "0");
  usage_error(&r, "--steps");
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv", "--batch", "4", "--lr", "x");
  usage_error(&r, "--lr");
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv", "--batch", "0");
  usage_error(&r, "--batch");
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv", "--batch", "4", "--inference");
  usage_error(&r, "--inference");
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv", "--batch", "4", "--json=1");
  usage_error(&r, "--json takes no value");
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv", "--batch", "4", "--micro-batch");
  usage_error(&r, "--micro-batch needs a value");
  REPRO(&r, "--model", "m.dpm", "--data", "d.csv", "--batch", "4", "extra");
  usage_error(&r, "unexpected argument 'extra'");
  REPRO(&r, "--m", "x");
  usage_error(&r, "ambiguous");
}
END_TEST

START_TEST(test_help_explains_the_guarantee) {
  result r;
  REPRO(&r, "--help");
  ck_assert_int_eq(r.rc, 0);
  const char *needles[] = {"usage: dp repro", "--devices LIST", "--mode LIST",
                           "sharded",         "powers of two",  "micro-batch",
                           "state_dict",      "--skip-refused", "Exit status",
                           "--trace",         "--json",         "--seed"};
  for (size_t i = 0; i < sizeof needles / sizeof *needles; i++)
    ck_assert_msg(strstr(r.out, needles[i]), "help lacks '%s'", needles[i]);
  result_free(&r);
}
END_TEST

START_TEST(test_bad_files_exit_1) {
  tmp_file spec, csv;
  tmp_write(&spec, MSE_SPEC);   /* 4 features, 2 targets */
  classification_csv(&csv, 10); /* 7 fields: as regression, 5 features */
  result r;
  REPRO(&r, "--model", "/nonexistent/m.dpm", "--data", csv.path, "--batch", "4");
  ck_assert_int_eq(r.rc, 1);
  ck_assert_msg(strstr(r.err, "dp repro: "), "%s", r.err);
  result_free(&r);
  REPRO(&r, "--model", spec.path, "--data", csv.path, "--batch", "4");
  ck_assert_int_eq(r.rc, 1);
  /* the fields as the file has them (an outside check, session 23: "5 features
   * per row" of a file whose rows have 7 fields) */
  ck_assert_msg(strstr(r.err, "has 7 fields per row: 2 targets (loss mse, one per output), "
                              "then 5 features; ") &&
                    strstr(r.err, " takes 4 features (rows of 6 fields)"),
                "%s", r.err);
  result_free(&r);
  unlink(spec.path);
  unlink(csv.path);
}
END_TEST

Suite *repro_suite(void) {
  Suite *s = suite_create("repro");
  TCase *tc = tcase_create("agree");
  tcase_add_test(tc, test_fixed_micro_batches_agree_for_1_2_4_devices);
  tcase_add_test(tc, test_sequence_model_agrees_on_text_and_tokens);
  tcase_add_test(tc, test_batchnorm_modes_agree_on_a_sequence_model);
  tcase_add_test(tc, test_regression_agrees_up_to_8_devices_with_wrapping_batches);
  suite_add_tcase(s, tc);

  tc = tcase_create("diverge");
  tcase_add_test(tc, test_chunk_micro_batches_diverge_and_the_report_names_where);
  suite_add_tcase(s, tc);

  tc = tcase_create("refused");
  tcase_add_test(tc, test_refused_configurations_exit_2);
  tcase_add_test(tc, test_backend_options_reach_every_configuration);
  tcase_add_test(tc, test_modes_agree_where_the_library_runs_them);
  suite_add_tcase(s, tc);

  tc = tcase_create("usage");
  tcase_add_test(tc, test_usage_errors_exit_2);
  tcase_add_test(tc, test_help_explains_the_guarantee);
  tcase_add_test(tc, test_bad_files_exit_1);
  suite_add_tcase(s, tc);
  return s;
}
