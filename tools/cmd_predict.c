/* `dp predict`: a checkpoint's model over a CSV, predictions to a CSV — the
 * path a service takes, from the command line. */
#include "agree.h"
#include "cli.h"
#include "data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  OPT_CHECKPOINT = DPT_OPT_USER,
  OPT_DATA,
  OPT_OUT,
  OPT_FEATURES_ONLY,
  OPT_LABELS,
  OPT_HEADER
};

typedef struct {
  const char *checkpoint, *data, *out, *labels;
  int features_only, header;
} predict_opts;

static int on_option(void *user, int code, const char *arg, char *err, size_t errcap) {
  predict_opts *o = user;
  (void)err, (void)errcap;
  switch (code) {
  case OPT_CHECKPOINT: o->checkpoint = arg; return 0;
  case OPT_DATA: o->data = arg; return 0;
  case OPT_OUT: o->out = arg; return 0;
  case OPT_FEATURES_ONLY: o->features_only = 1; return 0;
  case OPT_LABELS: o->labels = arg; return 0;
  case OPT_HEADER: o->header = 1; return 0;
  }
  return -1;
}

static void usage(FILE *f) {
  fputs(
      "usage: dp predict --checkpoint F.ckpt --data D.csv [--out P.csv] [--features-only]\n"
      "                  [--labels L] [--header] [--batch B] [--devices N]\n"
      "                  [--backend cpu|cuda]\n"
      "\n"
      "Runs the checkpoint's model (dp train --save, dp_ckpt_save: the model travels in\n"
      "the file) over every row of the CSV and writes one line per row, in order:\n"
      "  classification (softmax_cross_entropy): the predicted class (a sequence\n"
      "  model: one per position), then the model's\n"
      "  outputs (logits), e.g. \"3,-1.25,0.5,...\";\n"
      "  regression (mse) and models without a loss: the outputs.\n"
      "Rows are as dp train reads them (label, or the targets, first; then the\n"
      "features), and then the held-out style metric is printed too (accuracy or\n"
      "mse); with --features-only they hold the features alone. Features are\n"
      "standardised as the run that saved the checkpoint standardised them (dp train\n"
      "keeps the means and deviations in the checkpoint); a checkpoint without a run\n"
      "record (dp_ckpt_save from a program) takes the features as they are.\n"
      "\n"
      "  --checkpoint FILE     the model and its parameters\n"
      "  --data FILE           the rows to predict\n"
      "  --out FILE            the predictions (default: standard output)\n"
      "  --features-only       rows hold only the features\n"
      "  --labels FILE         with .npy or IDX data: its labels (or targets), for the\n"
      "                        metric; without it such data is features only. The\n"
      "                        formats are dp train's (dp train --help)\n"
      "  --header              the CSV's first row is a header (else detected)\n"
      "  --batch B             rows per forward (default 256); --devices N splits each\n"
      "                        batch over N devices, with the same results\n"
      "\n"
      "Exit status: 0 written, 1 a file could not be read or written or the data does\n"
      "not fit the model (nothing written), 2 usage error, 3 written but some outputs\n"
      "are not finite (inf or nan; a warning names how many rows and the first).\n\n",
      f);
  dpt_print_common_help(f);
}

/* A label the model has no class for would only ever count as a wrong
 * prediction: refused, naming the first such row (1-based, data rows only).
 * classes: the outputs per position (a sequence model's vocabulary). */
static int labels_fit(const dpt_dataset *d, int classes, int positions, const char *data) {
  int r = dpt_first_label_past(d, classes);
  if (r < 0) return 0;
  fprintf(stderr,
          "dp predict: %s: row %d has label %d; the checkpoint's model has %d %s (labels 0 "
          "to %d)\n",
          data, r + 1, (int)d->label[r], classes,
          positions > 1 ? "classes per position" : "outputs", classes - 1);
  return -1;
}

/* A sequence model's rows are token ids: each value an id of its embedding's
 * vocabulary, checked before any forward so that the refusal names the data
 * row (1-based, as labels_fit does) and not a row of one batch (an outside
 * check: "rows 257..300: token 300 at position 3 of row 23"). */
static int tokens_fit(const dpt_dataset *d, const dp_model *m, const char *data) {
  dp_layer_info l0;
  if (dp_model_n_layers(m) < 1 || dp_model_layer(m, 0, &l0) ||
      l0.kind != DP_LAYER_EMBEDDING)
    return 0;
  float *row = malloc((size_t)d->n_features * sizeof *row);
  if (!row) {
    fprintf(stderr, "dp predict: out of memory\n");
    return -1;
  }
  int rc = 0;
  for (int r = 0; !rc && r < d->n_rows; r++) {
    dpt_dataset_gather(d, NULL, NULL, r, 1, row, NULL);
    for (int j = 0; !rc && j < d->n_features; j++) {
      float v = row[j];
      if (v >= 0 && v < (float)l0.vocab && v == floorf(v)) continue;
      fprintf(stderr,
              "dp predict: %s: row %d, position %d: token %.9g is not an id of the "
              "checkpoint's model (0 to %d, its embedding's vocabulary)\n",
              data, r + 1, j, (double)v, l0.vocab - 1);
      rc = -1;
    }
  }
  free(row);
  return rc;
}

/* What the rows gave: the metric's sums, and the rows with an output that is
 * not finite (how many, the first one 1-based). */
typedef struct {
  long correct, ignored; /* ignored: labels equal to the loss's ignore_index */
  int has_ignore;
  int32_t ignore_index;
  double se;
  int n_bad, first_bad;
} predict_sums;

/* One line of predictions for the row with outputs yr (row `at` of d). */
static void predict_line(FILE *out, const dpt_dataset *d, int at, const float *yr,
                         int out_w, int positions, dp_loss_kind loss, predict_sums *sum) {
  int finite = 1;
  for (int j = 0; j < out_w; j++) finite &= isfinite(yr[j]) != 0;
  if (!finite && !sum->n_bad++) sum->first_bad = at + 1;
  if (loss == DP_LOSS_SOFTMAX_CE) { /* the class of each position (a sequence's T) */
    int classes = out_w / positions, best = 0;
    for (int t = 0; t < positions; t++) {
      const float *z = yr + (size_t)t * classes;
      best = 0;
      for (int j = 1; j < classes; j++)
        if (z[j] > z[best]) best = j;
      fprintf(out, "%d,", best);
    }
    /* a sequence's label is the token after it: the last position's class */
    if (d->label && sum->has_ignore && d->label[at] == sum->ignore_index)
      sum->ignored++; /* as PyTorch's ignore_index: counted nowhere */
    else if (d->label)
      sum->correct += best == d->label[at];
  } else if (d->y) {
    for (int j = 0; j < out_w; j++) {
      double tv = d->y[(size_t)at * d->n_targets + j], e = (double)yr[j] - tv;
      sum->se += e * e;
      sum->correct += (yr[j] > 0) == (tv > 0.5); /* bce_with_logits' accuracy */
    }
  }
  for (int j = 0; j < out_w; j++) fprintf(out, "%s%.9g", j ? "," : "", (double)yr[j]);
  fputc('\n', out);
}

/* Every row of d through the context, B at a time; a line each to out (NULL
 * on the ranks that do not write). 0, or -1 with the message printed. */
static int predict_rows(dp_ctx *c, const dp_plan *p, const dpt_dataset *d,
                        const dpt_scaler *sc, int B, dp_loss_kind loss, FILE *out,
                        predict_sums *sum) {
  int in_w = d->n_features, out_w = dp_model_output_width(dp_plan_model(p)), rc = -1;
  float *x = malloc((size_t)B * in_w * 4), *ymine = malloc((size_t)B * out_w * 4),
        *y = malloc((size_t)B * out_w * 4);
  char err[DPT_MSG_CAP];
  if (!x || !ymine || !y) {
    fprintf(stderr, "dp predict: out of memory\n");
    goto done;
  }
  for (int from = 0; from < d->n_rows; from += B) {
    int n = d->n_rows - from < B ? d->n_rows - from : B, r0, nr;
    dpt_dataset_gather(d, sc, NULL, from, n, x, NULL);
    /* under mpirun each rank feeds its rows; rank 0 gathers the outputs */
    if (dp_plan_rank_rows(p, n, dpt_world_rank(), &r0, &nr) ||
        dp_forward(c, n, in_w, x + (size_t)r0 * in_w, ymine) ||
        dpt_world_gather_rows(p, n, ymine, out_w, y, err, sizeof err)) {
      fprintf(stderr, "dp predict: rows %d..%d: %s\n", from + 1, from + n,
              dpt_user_msg(dp_ctx_error(c)));
      goto done;
    }
    for (int i = 0; out && i < n; i++)
      predict_line(out, d, from + i, y + (size_t)i * out_w, out_w,
                   dp_model_positions(dp_plan_model(p)), loss, sum);
  }
  rc = 0;
done:
  free(x);
  free(ymine);
  free(y);
  return rc;
}

/* The state of one `dp predict` run, handed from phase to phase. */
typedef struct {
  predict_opts o;
  dp_config cfg;
  dpt_common common;
  char err[512];
  int writes; /* rank 0 writes (the predictions, the report) */
  dp_model *m;
  dp_plan *p;
  dp_ctx *c;
  dpt_dataset d;
  dpt_scaler sc;
  dp_file *of; /* --out, written whole and renamed over the path at the end */
  int in_w, out_w;
  dp_loss_kind loss;
} predict_run;

/* The command line into t. Returns -1 to go on, else the exit status. */
static int parse_predict(int argc, char **argv, predict_run *t) {
  static const struct option extra[] = {
      {"checkpoint", required_argument, NULL, OPT_CHECKPOINT},
      {"data", required_argument, NULL, OPT_DATA},
      {"out", required_argument, NULL, OPT_OUT},
      {"features-only", no_argument, NULL, OPT_FEATURES_ONLY},
      {"labels", required_argument, NULL, OPT_LABELS},
      {"header", no_argument, NULL, OPT_HEADER},
      {0, 0, 0, 0}};
  int r = dpt_parse_command(argc, argv, extra, on_option, &t->o, usage, &t->cfg, &t->common,
                            t->err, sizeof t->err);
  if (r == DPT_ARGS_HELP) return DPT_EXIT_OK;
  if (r == DPT_ARGS_OK && (!t->o.checkpoint || !t->o.data))
    r = dpt_fail(t->err, sizeof t->err, "--checkpoint and --data are required");
  /* an outside check: --labels was ignored (never read) beside --features-only */
  if (r == DPT_ARGS_OK && t->o.labels && t->o.features_only)
    r = dpt_fail(t->err, sizeof t->err,
                 "--labels gives the labels of .npy or IDX data, for the metric; "
                 "--features-only says there are none: give one or the other");
  if (r == DPT_ARGS_OK && dpt_check_backend_options(&t->cfg, t->err, sizeof t->err))
    r = DPT_ARGS_ERROR;
  if (r != DPT_ARGS_OK) {
    return dpt_usage_error("predict", t->err, "(see dp predict --help)");
  }
  return -1;
}

/* The output checked, the checkpoint's model, the data (as its loss reads
 * it) and the standardisation its training run used, applied. 0, or -1
 * (said). */
static int load_inputs(predict_run *t) {
  const predict_opts *o = &t->o;
  char *err = t->err;
  size_t errcap = sizeof t->err;
  dpt_file_role outs[] = {{o->out, "predictions"}},
                ins[] = {{o->checkpoint, "checkpoint"}, {o->data, "data"}};
  if (t->writes && o->out &&
      (dpt_check_distinct(outs, 1, ins, 2, err, errcap) ||
       dpt_check_writable(o->out, "predictions", 1, err, errcap))) {
    fprintf(stderr, "dp predict: %s\n", err);
    return -1;
  }
  if (dp_ckpt_info(o->checkpoint, &t->m, NULL)) {
    fprintf(stderr, "dp predict: %s\n", dpt_user_msg(dp_last_error()));
    return -1;
  }
  int in_w = t->in_w = dp_model_input_width(t->m),
      out_w = t->out_w = dp_model_output_width(t->m);
  dp_loss_kind loss = t->loss = dp_model_loss(t->m);
  int positions = dp_model_positions(t->m), classes = out_w / positions;
  dpt_dataset *d = &t->d;
  /* CSV, .npy or IDX (dp train's readers); binary data without --labels is
   * features only */
  dpt_data_spec spec = {.data = o->data,
                        .labels = o->labels,
                        .rows = o->features_only             ? DPT_ROWS_FEATURES
                                : loss == DP_LOSS_SOFTMAX_CE ? DPT_ROWS_CLASSES
                                : loss != DP_LOSS_NONE       ? DPT_ROWS_TARGETS
                                                             : DPT_ROWS_FEATURES,
                        .n_targets = out_w,
                        .n_outputs = loss == DP_LOSS_SOFTMAX_CE ? classes : 0,
                        .header = o->header,
                        .labels_optional = 1,
                        .n_features = in_w};
  dp_status s = dpt_data_load(&spec, d, err, errcap);
  if (s) {
    fprintf(stderr, "dp predict: %s\n", err);
    return -1;
  }
  if (d->n_features != in_w) {
    /* the fields as the file has them (the review of session 23) */
    dpt_width_mismatch(err, errcap, o->data, "the checkpoint's model", d, in_w, !o->labels);
    fprintf(stderr, "dp predict: %s%s\n", err,
            o->features_only ? "" : " (rows with the features only: --features-only)");
    return -1;
  }
  if (loss == DP_LOSS_SOFTMAX_CE && labels_fit(d, classes, positions, o->data)) return -1;
  if (tokens_fit(d, t->m, o->data)) return -1;
  int has_record, c, h, w;
  dpt_model_image(t->m, &c, &h, &w);
  if (dpt_ckpt_scaler(o->checkpoint, &t->sc, &has_record, err, errcap)) {
    fprintf(stderr, "dp predict: %s\n", err);
    return -1;
  }
  if (dpt_scaler_fits(&t->sc, in_w, c, err, errcap)) {
    fprintf(stderr, "dp predict: %s: %s\n", o->checkpoint, err);
    return -1;
  }
  /* 256 rows unless given, at most the rows: before the ranks compare it */
  if (!dpt_given(&t->common, DPT_OPT_BATCH)) t->cfg.batch = 256;
  if (t->cfg.batch > d->n_rows) t->cfg.batch = d->n_rows;
  return 0; /* the standardisation is applied as the rows are gathered */
}

/* Under mpirun, before the context: every rank's model and standardisation
 * (both from its own --checkpoint; the weights are rank 0's), rows as read and
 * options the same as rank 0's, or the job ends on every rank with rank 0's
 * one message (tools/agree.h; an outside check: a rank given other data wrote
 * wrong predictions, exit 0). The batch is compared as load_inputs made it, so
 * that a rank given --batch 256 agrees with one that takes it. 0, or -1 (said). */
static int agree_predict(predict_run *t) {
  const dpt_scaler *sc = &t->sc;
  uint64_t h = dp_hash_bytes(&sc->n, sizeof sc->n) ^ (uint64_t)sc->per_channel << 1;
  if (sc->n > 0) {
    h ^= dp_hash_bytes(sc->mean, (size_t)sc->n * sizeof *sc->mean);
    h = h * 1099511628211ull ^ dp_hash_bytes(sc->std, (size_t)sc->n * sizeof *sc->std);
  }
  char err[1024];
  dpt_train_inputs in = {.model = t->m,
                         .data = &t->d,
                         .cfg = &t->cfg,
                         .extra = t->o.features_only ? "+features-only" : "-features-only",
                         .predict = 1,
                         .model_more = h | 1};
  if (!dpt_agree_train(&in, err, sizeof err)) return 0;
  if (*err) fprintf(stderr, "dp predict: %s\n", err);
  return -1;
}

/* An inference plan (the batch load_inputs set), its context
 * with the checkpoint loaded, and the output file. 0, or -1 (said). */
static int make_context(predict_run *t) {
  dp_config *cfg = &t->cfg;
  cfg->inference = 1;
  if (dpt_require_backend(cfg, t->err, sizeof t->err)) {
    fprintf(stderr, "dp predict: %s\n", t->err);
    return -1;
  }
  if (dp_plan_create(t->m, cfg, &t->p) || dpt_ctx_create(t->p, &t->c) ||
      dp_ckpt_load(t->c, t->o.checkpoint)) {
    fprintf(stderr, "dp predict: %s\n",
            dpt_user_msg(t->c ? dp_ctx_error(t->c) : dp_last_error()));
    return -1;
  }
  if (t->writes && t->o.out && dp_file_create(t->o.out, "predictions", &t->of)) {
    fprintf(stderr, "dp predict: %s\n", dpt_user_msg(dp_last_error()));
    return -1;
  }
  return 0;
}

/* The predictions written (and --out committed), then the report line and
 * the warning of rows that are not finite. The exit status, or -1 (said). */
static int predict(predict_run *t) {
  const predict_opts *o = &t->o;
  const dpt_dataset *d = &t->d;
  FILE *out = !t->writes ? NULL : t->of ? dp_file_stream(t->of) : stdout;
  predict_sums sum = {0};
  dp_ce_options ce;
  dp_model_ce_options(t->m, &ce);
  sum.has_ignore = ce.has_ignore_index;
  sum.ignore_index = ce.ignore_index;
  if (predict_rows(t->c, t->p, d, &t->sc, t->cfg.batch, t->loss, out, &sum)) return -1;
  dp_file *done_of = t->of;
  t->of = NULL;
  if (done_of && dp_file_commit(done_of)) {
    fprintf(stderr, "dp predict: %s\n", dpt_user_msg(dp_last_error()));
    return -1;
  }
  FILE *report = o->out ? stdout : stderr; /* the predictions may be on stdout */
  if (t->writes) {
    fprintf(report, "dp predict: %d rows of %s through %s", d->n_rows, o->data,
            o->checkpoint);
    if (d->label)
      fprintf(report, ": accuracy %.2f%%%s",
              100.0 * (double)sum.correct / (double)(d->n_rows - sum.ignored),
              dp_model_positions(t->m) > 1 ? " (the last position against each row's label)"
                                           : "");
    else if (d->y &&
             t->loss == DP_LOSS_BCE_LOGITS) /* a logit's side against its target's */
      fprintf(report, ": accuracy %.2f%%",
              100.0 * (double)sum.correct / ((double)d->n_rows * t->out_w));
    else if (d->y)
      fprintf(report, ": mse %.6g", sum.se / ((double)d->n_rows * t->out_w));
    fprintf(report, "%s%s\n", o->out ? " -> " : "", o->out ? o->out : "");
  }
  if (t->writes && sum.n_bad) { /* written, but not to be taken for good predictions */
    fprintf(stderr,
            "dp predict: warning: %d of %d rows have an output that is not finite (inf or "
            "nan; the first: row %d): the model overflows on them (exit status %d)\n",
            sum.n_bad, d->n_rows, sum.first_bad, DPT_EXIT_NONFINITE);
    return DPT_EXIT_NONFINITE;
  }
  return DPT_EXIT_OK;
}

int dpt_cmd_predict(int argc, char **argv) {
  predict_run t = {.o = {0}};
  int rc = parse_predict(argc, argv, &t);
  if (rc >= 0) return rc;
  t.writes = dpt_world_rank() == 0;
  rc = DPT_EXIT_FAIL;
  /* under mpirun every rank loads its own inputs: a rank that failed (a file
   * missing on its host) is known to every rank before the collective
   * context creation, which would wait for it (as dp repro) */
  int bad = dpt_world_max_int(load_inputs(&t) ? 1 : 0);
  if (bad) dpt_world_failed_together();
  if (!bad && !agree_predict(&t) && !make_context(&t)) {
    int r = predict(&t);
    if (r >= 0) rc = r;
  }
  dp_file_discard(t.of);
  dpt_scaler_free(&t.sc);
  dpt_dataset_free(&t.d);
  dp_ctx_free(t.c);
  dp_plan_free(t.p);
  dp_model_free(t.m);
  return rc;
}
