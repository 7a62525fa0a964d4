/* `dp train`: the main job. Loads a model spec and a CSV dataset, plans the
 * arenas (and prints the plan), trains with data parallelism over N virtual
 * devices, then reports held-out accuracy, throughput and a parameter hash.
 * While it runs: a progress line (a bar with the elapsed time and an estimate
 * of the rest on a terminal), the held-out loss every --eval-every epochs
 * (with --patience, an early stop), a JSON line per epoch (--log) and the
 * curves (--plot). */
#include "agree.h"
#include "cli.h"
#include "data.h"
#include "svg.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

enum {
  OPT_MODEL = DPT_OPT_USER,
  OPT_DATA,
  OPT_EPOCHS,
  OPT_TEST_FRACTION,
  OPT_PLOT,
  OPT_SAVE,
  OPT_RESUME,
  OPT_LR_SCHEDULE,
  OPT_QUIET,
  OPT_NO_STANDARDIZE,
  OPT_EVAL_EVERY,
  OPT_LOG,
  OPT_PLOT_LOG,
  OPT_PATIENCE,
};

typedef struct {
  const char *model, *data, *plot, *save, *resume, *schedule, *log;
  int epochs, quiet, no_standardize, eval_every, patience, plot_log;
  float test_fraction;
} train_opts;

/* --lr-schedule: constant | step:N:GAMMA | cosine:T_MAX[:ETA_MIN] |
 * warmup-cosine:W:T_MAX[:ETA_MIN[:START]] (START: 1/3, LinearLR's default),
 * in optimizer steps; base_lr is --lr. */
static int parse_schedule(const char *text, float base_lr, dp_lr_schedule *s, char *err,
                          size_t errcap) {
  *s = (dp_lr_schedule){.kind = DP_LR_CONSTANT,
                        .base_lr = base_lr,
                        .gamma = 1.0f,
                        .start_factor = 1.0f / 3.0f};
  char word[32] = "";
  double a = 0, b = 0, c = 0, d = 0;
  char tail;
  int n = sscanf(text, "%31[a-z-]:%lf:%lf:%lf:%lf%c", word, &a, &b, &c, &d, &tail);
  if (n < 1 || n > 5) goto bad;
  if (strcmp(word, "constant") == 0 && n == 1) {
    /* base_lr throughout */
  } else if (strcmp(word, "step") == 0 && n == 3) {
    s->kind = DP_LR_STEP;
    s->step_size = (int)a;
    s->gamma = (float)b;
    if (a != (int)a) goto bad;
  } else if (strcmp(word, "cosine") == 0 && (n == 2 || n == 3)) {
    s->kind = DP_LR_COSINE;
    s->t_max = (int)a;
    s->eta_min = (float)b;
    if (a != (int)a) goto bad;
  } else if (strcmp(word, "warmup-cosine") == 0 && n >= 3) {
    s->kind = DP_LR_WARMUP_COSINE;
    s->warmup = (int)a;
    s->t_max = (int)b;
    s->eta_min = (float)c;
    if (n == 5) s->start_factor = (float)d;
    if (a != (int)a || b != (int)b) goto bad;
  } else {
    goto bad;
  }
  if (dp_lr_schedule_check(s) == DP_OK) return 0;
  snprintf(err, errcap, "--lr-schedule %s: %s", text, dpt_user_msg(dp_last_error()));
  return -1;
bad:
  snprintf(err, errcap,
           "--lr-schedule: '%s' is not constant, step:N:GAMMA, cosine:T_MAX[:ETA_MIN] or "
           "warmup-cosine:W:T_MAX[:ETA_MIN[:START]]",
           text);
  return -1;
}

static int on_option(void *user, int code, const char *arg, char *err, size_t errcap) {
  train_opts *o = user;
  switch (code) {
  case OPT_MODEL: o->model = arg; return 0;
  case OPT_DATA: o->data = arg; return 0;
  case OPT_PLOT: o->plot = arg; return 0;
  case OPT_SAVE: o->save = arg; return 0;
  case OPT_RESUME: o->resume = arg; return 0;
  case OPT_LR_SCHEDULE: o->schedule = arg; return 0;
  case OPT_QUIET: o->quiet = 1; return 0;
  case OPT_NO_STANDARDIZE: o->no_standardize = 1; return 0;
  case OPT_LOG: o->log = arg; return 0;
  case OPT_PLOT_LOG: o->plot_log = 1; return 0;
  case OPT_EVAL_EVERY:
    return dpt_parse_int(arg, 1, 1000000, "--eval-every", &o->eval_every, err, errcap);
  case OPT_PATIENCE:
    return dpt_parse_int(arg, 1, 1000000, "--patience", &o->patience, err, errcap);
  case OPT_EPOCHS:
    return dpt_parse_int(arg, 1, 1000000, "--epochs", &o->epochs, err, errcap);
  case OPT_TEST_FRACTION:
    return dpt_parse_float(arg, 0.0, 0.95, "--test-fraction", &o->test_fraction, err,
                           errcap);
  }
  return -1;
}

static void usage(FILE *f) {
  fprintf(
      f, "usage: dp train --model M.dpm --data D.csv --batch B [--devices N] [--epochs E]\n"
         "                [--optimizer sgd|momentum|adamw] [--lr LR] [--seed S]\n"
         "                [--split chunk|balanced|memory] [--micro-batch K]\n"
         "                [--test-fraction F] [--eval-every N [--patience P]]\n"
         "                [--log F.jsonl] [--plot loss.svg [--plot-log]] [--save F.ckpt]\n"
         "                [--resume F.ckpt] [--lr-schedule S] [--clip-grad-norm X]\n"
         "                [--quiet] [--backend cpu|cuda] [--graph] [--tf32]\n\n"
         "Trains the model on the CSV data (label first, then the features; for an mse\n"
         "model, the first <output width> fields are the targets) with data parallelism\n"
         "over N devices (virtual ones on the cpu backend, GPUs with --backend cuda):\n"
         "it prints the memory plan, then progress (a bar with the elapsed time and the\n"
         "time left on a terminal, one line per epoch otherwise), then held-out\n"
         "accuracy (or mse), samples/s and the parameter hash. A held-out share\n"
         "(--test-fraction, default 0.2) is split off with the seed; features are\n"
         "standardised on the training share (--no-standardize to keep them raw).\n\n"
         "  --model FILE          model spec (.dpm)\n"
         "  --data FILE           CSV data\n"
         "  --epochs E            passes over the training share (default 10)\n"
         "  --test-fraction F     held-out share, 0..0.95 (default 0.2)\n"
         "  --eval-every N        after every N-th epoch, run the held-out share through\n"
         "                        the model and print its loss (mean cross-entropy, or\n"
         "                        mse) and accuracy (or mse) on the epoch line (default\n"
         "                        0: only at the end); training is the same bits\n"
         "  --patience P          with --eval-every: stop early when the held-out loss\n"
         "                        has not improved (gone below its best) for P\n"
         "                        evaluations in a row; --save then saves the state at\n"
         "                        the stop and the epochs done, which --resume continues\n"
         "  --log FILE.jsonl      one JSON object per epoch, a line each, flushed (so\n"
         "                        tail -f works): epoch, step, loss, lr, grad_norm (null\n"
         "                        without --clip-grad-norm), samples_per_s, elapsed_s,\n"
         "                        and after an evaluation heldout_loss and\n"
         "                        heldout_accuracy (a fraction) or heldout_mse; null for\n"
         "                        a number that is not finite. Written anew, or appended\n"
         "                        to with --resume; checked for writability before\n"
         "                        training starts\n"
         "  --plot FILE.svg       write the loss curve (mean loss per epoch; with\n"
         "                        --eval-every, the held-out loss too), the run's\n"
         "                        settings in the title; checked for writability before\n"
         "                        training starts\n"
         "  --plot-log            the plot's loss axis logarithmic (powers of ten)\n"
         "  --save FILE           after training, write a checkpoint (parameters,\n"
         "                        optimizer state, step counter, and the run: epochs\n"
         "                        done and the feature standardisation) as dp_ckpt_save\n"
         "                        does: to a temporary file, fsynced, then renamed over\n"
         "                        FILE, so an interrupted run leaves the old file or the\n"
         "                        new one (docs/CHECKPOINT.md). Checked for writability\n"
         "                        before training starts\n"
         "  --lr-schedule S       the learning rate per optimizer step, as\n"
         "                        torch.optim.lr_scheduler computes it from --lr:\n"
         "                        constant (default), step:N:GAMMA (StepLR),\n"
         "                        cosine:T_MAX[:ETA_MIN] (CosineAnnealingLR),\n"
         "                        warmup-cosine:W:T_MAX[:ETA_MIN[:START]] (LinearLR for W\n"
         "                        steps from START x lr, default 1/3, then the cosine)\n"
         "  --resume FILE         before training, load a checkpoint of the same model,\n"
         "                        optimizer and seed (from --save or dp_ckpt_save) and\n"
         "                        train on from it for --epochs more epochs: parameters,\n"
         "                        optimizer state, step counter, the rate schedule, the\n"
         "                        data order (the next epoch) and the standardisation\n"
         "                        continue, so --epochs 10 --save F, then --epochs 10\n"
         "                        --resume F gives the bits of --epochs 20 (same data,\n"
         "                        options and --save at the end of the first run)\n"
         "  --quiet               only the final report\n\n");
  dpt_print_common_help(f);
}

/* Copies rows perm[from..from+n) of d into x (and the targets into t). */
static void gather_rows(const dpt_dataset *d, const int *perm, int from, int n, float *x,
                        void *t) {
  for (int r = 0; r < n; r++) {
    int src = perm ? perm[from + r] : from + r;
    memcpy(x + (size_t)r * d->n_features, d->x + (size_t)src * d->n_features,
           (size_t)d->n_features * 4);
    if (d->label)
      ((int32_t *)t)[r] = d->label[src];
    else
      memcpy((float *)t + (size_t)r * d->n_targets, d->y + (size_t)src * d->n_targets,
             (size_t)d->n_targets * 4);
  }
}

/* A duration as m:ss, or h:mm:ss from an hour; "-:--" when unknown. */
static char *clock_text(double s, char *buf, size_t cap) {
  if (!(s >= 0.0) || s > 1e8) {
    snprintf(buf, cap, "-:--");
    return buf;
  }
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

/* The epoch's line. On a terminal (of `cols` columns), rewritten in place
 * while the epoch runs: a bar (narrowed so that the line fits), the loss so
 * far, samples/s, the time since training started and an estimate of the time
 * left (elapsed and left in seconds; left < 0: unknown). Otherwise one line at
 * the end of the epoch. `heldout`: the figures of an evaluation after the
 * epoch ("" when none), after the rest (a line that may wrap: the last). */
static void progress(int tty, int cols, int epoch, int epochs, int done, int total,
                     float loss, double sps, double elapsed, double left,
                     const char *heldout, int final) {
  if (tty) {
    char head[32], tail[160], e[32], l[32], bar[64];
    int nh = snprintf(head, sizeof head, "epoch %3d/%d ", epoch, epochs);
    int nt = snprintf(tail, sizeof tail, " loss %.4f  %.0f samples/s  elapsed %s eta %s",
                      (double)loss, sps, clock_text(elapsed, e, sizeof e),
                      clock_text(left, l, sizeof l));
    int width = cols - 1 - nh - nt - 2;
    width = width > 30 ? 30 : width < 10 ? 10 : width;
    int fill = total ? (int)((long long)width * done / total) : width;
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    /* \033[K: the rest of a longer earlier line erased */
    printf("\r%s[%s]%s%s\033[K", head, bar, tail, heldout);
    if (final) printf("\n");
    fflush(stdout);
  } else if (final) {
    printf("epoch %3d/%d  loss %.4f  %.0f samples/s%s\n", epoch, epochs, (double)loss, sps,
           heldout);
  }
}

/* A JSON number: %.9g when finite (every float reads back exactly), else null. */
static void json_number(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.9g", v);
  else
    fputs("null", f);
}

/* Held-out accuracy (classification) or mean squared error (regression) in
 * *metric, and the loss the model trains on in *loss: the mean softmax
 * cross-entropy over the rows, or the mse again; both computed in double from
 * the outputs. Every rank runs the forwards; the figures are rank 0's. */
static int evaluate(dp_ctx *ctx, const dp_plan *plan, const dpt_dataset *d, int batch,
                    int out_w, float *x, float *ymine, float *y, double *metric,
                    double *loss) {
  long correct = 0;
  double se = 0.0, ce = 0.0;
  char err[256];
  for (int from = 0; from < d->n_rows; from += batch) {
    int n = d->n_rows - from < batch ? d->n_rows - from : batch;
    memcpy(x, d->x + (size_t)from * d->n_features, (size_t)n * d->n_features * 4);
    /* under mpirun: this rank's rows in, rank 0 gathers every rank's outputs */
    int r0, nr;
    if (dp_plan_rank_rows(plan, n, dpt_world_rank(), &r0, &nr) ||
        dp_forward(ctx, n, d->n_features, x + (size_t)r0 * d->n_features, ymine) ||
        dpt_world_gather_rows(plan, n, ymine, out_w, y, err, sizeof err))
      return -1;
    for (int r = 0; r < n; r++) {
      const float *yr = y + (size_t)r * out_w;
      if (d->label) {
        int best = 0;
        for (int j = 1; j < out_w; j++)
          if (yr[j] > yr[best]) best = j;
        correct += best == d->label[from + r];
        /* -log softmax(y)[label] = logsumexp(y) - y[label], shifted by the max */
        double top = yr[best], sum = 0.0;
        for (int j = 0; j < out_w; j++) sum += exp((double)yr[j] - top);
        ce += top + log(sum) - (double)yr[d->label[from + r]];
      } else {
        for (int j = 0; j < out_w; j++) {
          double e = (double)yr[j] - d->y[(size_t)(from + r) * d->n_targets + j];
          se += e * e;
        }
      }
    }
  }
  *metric = d->label ? (double)correct / d->n_rows : se / ((double)d->n_rows * out_w);
  *loss = d->label ? ce / d->n_rows : *metric;
  return 0;
}

/* The run's settings as its checkpoints record them ("name=value" words;
 * floats exact in hexadecimal): a resume must use the same, or it would not
 * continue the run. Returns buf. */
static const char *settings_of(const dp_config *c, const char *schedule, char *buf,
                               size_t cap) {
  snprintf(buf, cap,
           "optimizer=%s lr=%a momentum=%a dampening=%a nesterov=%d weight-decay=%a "
           "beta1=%a beta2=%a eps=%a clip-grad-norm=%a accumulate=%d batch=%d "
           "micro-batch=%d seed=%llu lr-schedule=%s",
           dp_optimizer_name(c->optimizer == DP_OPT_SGD && c->momentum > 0 ? DP_OPT_MOMENTUM
                                                                           : c->optimizer),
           (double)c->lr, (double)c->momentum, (double)c->dampening, c->nesterov,
           (double)c->weight_decay, (double)c->beta1, (double)c->beta2, (double)c->eps,
           (double)c->clip_grad_norm, c->accumulate > 1 ? c->accumulate : 1, c->batch,
           c->micro_batch, (unsigned long long)c->seed, schedule ? schedule : "constant");
  return buf;
}

/* A hexadecimal float in buf rewritten as the shortest decimal that reads
 * back as the same float ("0x1.89374cp-9" -> "0.003"). */
static void shortest_float(char *buf, size_t cap) {
  double d = strtod(buf, NULL);
  if (!strstr(buf, "0x") || !(fabs(d) <= FLT_MAX)) return; /* a record's, as it is */
  float v = (float)d;
  for (int prec = 6; prec <= 9; prec++) {
    snprintf(buf, cap, "%.*g", prec, (double)v);
    if ((float)strtod(buf, NULL) == v) return;
  }
}

/* A setting a resume may change: another micro-batch cuts the same batch
 * otherwise (a layout, like the device count; the checkpoint holds nothing
 * that depends on it), so the run goes on with the new layout's bits. */
static int may_change(const char *a, size_t la, const char *b, size_t lb) {
  static const char mb[] = "micro-batch=";
  size_t n = sizeof mb - 1;
  return la > n && lb > n && memcmp(a, mb, n) == 0 && memcmp(b, mb, n) == 0;
}

/* The first setting that differs between a checkpoint's run and this one:
 * 0, or -1 with "--name: the checkpoint's run used X, this one Y" in err. */
static int same_settings(const char *saved, const char *now, char *err, size_t errcap) {
  const char *a = saved, *b = now;
  while (*a || *b) {
    size_t la = strcspn(a, " "), lb = strcspn(b, " ");
    if ((la != lb || memcmp(a, b, la)) && !may_change(a, la, b, lb)) {
      const char *eq = memchr(a, '=', la), *eqb = memchr(b, '=', lb);
      int name = eq ? (int)(eq - a) : (int)la;
      char va[64], vb[64]; /* the values, for people: floats in decimal */
      snprintf(va, sizeof va, "%.*s", (int)(la - (eq ? (size_t)name + 1 : 0)),
               eq ? eq + 1 : a);
      snprintf(vb, sizeof vb, "%.*s", (int)(lb - (eqb ? (size_t)(eqb - b) + 1 : 0)),
               eqb ? eqb + 1 : b);
      shortest_float(va, sizeof va);
      shortest_float(vb, sizeof vb);
      snprintf(err, errcap,
               "--%.*s: the checkpoint's run used %s, this one %s; a resume continues the "
               "run only with the same settings",
               name, a, va, vb);
      return -1;
    }
    a += la + (a[la] == ' ');
    b += lb + (b[lb] == ' ');
  }
  return 0;
}

/* Under mpirun, before the first step: every rank's model, data as read and
 * options the same as rank 0's, or the job ends on every rank with rank 0's
 * one message (tools/agree.h). 0, or -1 (said). */
static int agree_ranks(const train_opts *o, const dp_model *model, const dpt_dataset *all,
                       const dp_config *cfg) {
  char err[1024];
  dpt_train_inputs in = {.model = model,
                         .data = all,
                         .cfg = cfg,
                         .schedule = o->schedule,
                         .epochs = o->epochs,
                         .eval_every = o->eval_every,
                         .patience = o->patience,
                         .no_standardize = o->no_standardize,
                         .resume = o->resume != NULL,
                         .test_fraction = o->test_fraction};
  if (!dpt_agree_train(&in, err, sizeof err)) return 0;
  if (*err) fprintf(stderr, "dp train: %s\n", err);
  return -1;
}

int dpt_cmd_train(int argc, char **argv) {
  static const struct option extra[] = {
      {"model", required_argument, NULL, OPT_MODEL},
      {"data", required_argument, NULL, OPT_DATA},
      {"epochs", required_argument, NULL, OPT_EPOCHS},
      {"test-fraction", required_argument, NULL, OPT_TEST_FRACTION},
      {"plot", required_argument, NULL, OPT_PLOT},
      {"save", required_argument, NULL, OPT_SAVE},
      {"resume", required_argument, NULL, OPT_RESUME},
      {"lr-schedule", required_argument, NULL, OPT_LR_SCHEDULE},
      {"quiet", no_argument, NULL, OPT_QUIET},
      {"no-standardize", no_argument, NULL, OPT_NO_STANDARDIZE},
      {"eval-every", required_argument, NULL, OPT_EVAL_EVERY},
      {"log", required_argument, NULL, OPT_LOG},
      {"plot-log", no_argument, NULL, OPT_PLOT_LOG},
      {"patience", required_argument, NULL, OPT_PATIENCE},
      {0, 0, 0, 0}};
  train_opts o = {.epochs = 10, .test_fraction = 0.2f};
  dp_config cfg;
  dpt_common common;
  char err[512];
  int r = dpt_parse_args(argc, argv, extra, on_option, &o, &cfg, &common, err, sizeof err);
  if (r == DPT_ARGS_HELP) {
    usage(stdout);
    return DPT_EXIT_OK;
  }
  if (r == DPT_ARGS_OK && common.n_args > 0) {
    snprintf(err, sizeof err, "unexpected argument '%s'", argv[common.first_arg]);
    r = DPT_ARGS_ERROR;
  }
  if (r == DPT_ARGS_OK && (!o.model || !o.data || !dpt_given(&common, DPT_OPT_BATCH))) {
    snprintf(err, sizeof err, "--model, --data and --batch are required");
    r = DPT_ARGS_ERROR;
  }
  if (r == DPT_ARGS_OK && cfg.inference) {
    snprintf(err, sizeof err, "--inference makes no sense for training");
    r = DPT_ARGS_ERROR;
  }
  if (r == DPT_ARGS_OK && o.patience && !o.eval_every) {
    snprintf(err, sizeof err,
             "--patience needs --eval-every (it counts evaluations of the held-out share)");
    r = DPT_ARGS_ERROR;
  }
  if (r == DPT_ARGS_OK && o.eval_every && o.test_fraction == 0.0f) {
    snprintf(err, sizeof err, "--eval-every needs a held-out share (--test-fraction > 0)");
    r = DPT_ARGS_ERROR;
  }
  if (r == DPT_ARGS_OK && o.plot_log && !o.plot) {
    snprintf(err, sizeof err, "--plot-log needs --plot");
    r = DPT_ARGS_ERROR;
  }
  dp_lr_schedule sched;
  if (r == DPT_ARGS_OK && o.schedule &&
      parse_schedule(o.schedule, cfg.lr, &sched, err, sizeof err))
    r = DPT_ARGS_ERROR;
  if (r != DPT_ARGS_OK) {
    fprintf(stderr, "dp train: %s\n(see dp train --help)\n", err);
    return DPT_EXIT_USAGE;
  }

  int rc = DPT_EXIT_FAIL;
  dp_model *model = NULL;
  dp_plan *plan = NULL;
  dp_ctx *ctx = NULL;
  dpt_dataset all = {0}, train = {0}, test = {0};
  dpt_scaler scaler = {0}; /* the feature standardisation (n = 0: none) */
  float *bx = NULL, *by = NULL, *curve = NULL, *hcurve = NULL;
  double *hx = NULL; /* the epochs of the held-out curve hcurve */
  void *bt = NULL;
  int *perm = NULL;
  FILE *logf = NULL;

  /* the output files first: a path that cannot be written fails now, not after
   * the whole run */
  /* rank 0 writes the files (every rank, as one process, under mpirun) */
  int writes = dpt_world_rank() == 0;
  /* no output may be an input (--save may be --resume: it is written after
   * the resume read it, whole, by a rename) */
  dpt_file_role outs[] = {{o.save, "checkpoint"}, {o.plot, "plot"}, {o.log, "log"}},
                ins[] = {{o.model, "model"}, {o.data, "data"}, {o.resume, "checkpoint"}};
  if (writes && (dpt_check_distinct(outs, 3, ins, 2, err, sizeof err) ||
                 dpt_check_distinct(outs + 1, 2, ins + 2, 1, err, sizeof err) ||
                 (o.save && dpt_check_writable(o.save, "checkpoint", 1, err, sizeof err)) ||
                 (o.plot && dpt_check_writable(o.plot, "plot", 1, err, sizeof err)) ||
                 (o.log && dpt_check_writable(o.log, "log", 0, err, sizeof err)))) {
    fprintf(stderr, "dp train: %s\n", err);
    goto out;
  }
  if (o.resume && writes) { /* read by rank 0 (sent to the others), checked later */
    int fd = dpt_open_regular(o.resume, "checkpoint", err, sizeof err);
    if (fd < 0) {
      fprintf(stderr, "dp train: --resume: %s\n", err);
      goto out;
    }
    close(fd);
  }
  if (dpt_load_model(o.model, &model, err, sizeof err) ||
      dpt_require_loss(o.model, model, NULL, err, sizeof err)) {
    fprintf(stderr, "dp train: %s\n", err);
    goto out;
  }
  int in_w = dp_model_input_width(model), out_w = dp_model_output_width(model);
  dp_loss_kind loss_kind = dp_model_loss(model);
  dp_status s = loss_kind == DP_LOSS_SOFTMAX_CE
                    ? dpt_csv_load(o.data, &all, err, sizeof err)
                    : dpt_csv_load_regression(o.data, out_w, &all, err, sizeof err);
  if (s) {
    fprintf(stderr, "dp train: %s\n", err);
    goto out;
  }
  if (all.n_features != in_w) {
    fprintf(stderr, "dp train: %s has %d features per row; %s takes %d\n", o.data,
            all.n_features, o.model, in_w);
    goto out;
  }
  if (all.label && all.n_classes > out_w) {
    fprintf(stderr, "dp train: %s has labels up to %d; the model has %d outputs\n", o.data,
            all.n_classes - 1, out_w);
    goto out;
  }
  if (agree_ranks(&o, model, &all, &cfg)) goto out;
  if (dpt_dataset_split(&all, o.test_fraction, cfg.seed, &train, &test, err, sizeof err)) {
    fprintf(stderr, "dp train: %s\n", err);
    goto out;
  }
  /* The run so far: a resumed run continues its epochs and keeps the
   * standardisation it trained with (a checkpoint of another program, or of
   * an older format, carries none: epoch 0, fitted again). */
  int epoch0 = 0;
  if (o.resume) {
    void *app = NULL;
    size_t app_n = 0;
    int rows = 0;
    if (dpt_world_read_app(o.resume, &app, &app_n, err, sizeof err)) {
      if (*err) fprintf(stderr, "dp train: cannot resume from '%s': %s\n", o.resume, err);
      goto out;
    }
    char *saved = NULL, now[1024];
    if (app_n &&
        dpt_run_parse(app, app_n, &epoch0, &rows, &scaler, &saved, err, sizeof err)) {
      free(app);
      fprintf(stderr, "dp train: cannot resume from '%s': %s\n", o.resume, err);
      goto out;
    }
    free(app);
    /* the checkpoint carries the run's settings: the same, or no resume */
    int differ =
        saved && same_settings(saved, settings_of(&cfg, o.schedule, now, sizeof now), err,
                               sizeof err);
    free(saved);
    if (differ) {
      fprintf(stderr, "dp train: cannot resume from '%s': %s\n", o.resume, err);
      goto out;
    }
    if (epoch0 > DPT_MAX_EPOCHS - o.epochs) { /* the record's count, range-checked */
      fprintf(
          stderr,
          "dp train: cannot resume from '%s': %d epochs done and --epochs %d would pass "
          "%d epochs\n",
          o.resume, epoch0, o.epochs, DPT_MAX_EPOCHS);
      goto out;
    }
    if (app_n && rows != train.n_rows)
      fprintf(stderr,
              "dp train: warning: %s was trained on %d rows; this data gives %d (another "
              "file, or another --test-fraction): the run will not continue as it was\n",
              o.resume, rows, train.n_rows);
    if (app_n && (scaler.n > 0) != !o.no_standardize) {
      fprintf(stderr,
              "dp train: %s was trained %s standardised features; resume it %s "
              "--no-standardize\n",
              o.resume, scaler.n > 0 ? "on" : "without", scaler.n > 0 ? "without" : "with");
      goto out;
    }
    if (scaler.n && scaler.n != train.n_features) {
      fprintf(stderr, "dp train: %s standardises %d features; this data has %d\n", o.resume,
              scaler.n, train.n_features);
      goto out;
    }
  }
  if (!o.no_standardize && !scaler.n && dpt_scaler_fit(&train, &scaler)) {
    fprintf(stderr, "dp train: out of memory\n");
    goto out;
  }
  dpt_scaler_apply(&scaler, &train);
  dpt_scaler_apply(&scaler, &test);
  /* a backend this build lacks: that first, the planner could only say it less well */
  if (!dp_cuda_available() && dpt_require_backend(&cfg, err, sizeof err)) {
    fprintf(stderr, "dp train: %s\n", err);
    goto out;
  }
  if (dp_plan_create(model, &cfg, &plan)) {
    fprintf(stderr, "dp train: %s\n", dpt_user_msg(dp_last_error()));
    goto out;
  }
  /* the plan is checked first: a config error says what is wrong with it */
  if (dpt_require_backend(&cfg, err, sizeof err)) {
    fprintf(stderr, "dp train: %s\n", err);
    goto out;
  }
  dpt_warn_oversubscribed(stderr, "dp train", dp_plan_n_devices(plan), cfg.backend,
                          dpt_cpu_count());
  if (dpt_ctx_create(plan, &ctx)) {
    fprintf(stderr, "dp train: %s\n", dpt_user_msg(dp_last_error()));
    goto out;
  }
  if (o.resume && dp_ckpt_load(ctx, o.resume)) {
    fprintf(stderr, "dp train: cannot resume from '%s': %s\n", o.resume,
            dpt_user_msg(dp_ctx_error(ctx)));
    goto out;
  }
  const dp_config *pc = dp_plan_config(plan);
  int B = pc->batch, tsz = all.label ? 4 : out_w * 4;
  bx = malloc((size_t)B * in_w * 4);
  by = calloc((size_t)B * out_w * 2, 4); /* the batch's outputs, then this rank's */
  bt = malloc((size_t)B * tsz);
  perm = malloc((size_t)train.n_rows * sizeof *perm);
  curve = malloc((size_t)o.epochs * sizeof *curve);
  hcurve = malloc((size_t)o.epochs * sizeof *hcurve);
  hx = malloc((size_t)o.epochs * sizeof *hx);
  if (!bx || !by || !bt || !perm || !curve || !hcurve || !hx) {
    fprintf(stderr, "dp train: out of memory\n");
    goto out;
  }

  if (!o.quiet) {
    printf("dp train: %s on %s: %d train / %d held-out rows, %d features, %s\n", o.model,
           o.data, train.n_rows, test.n_rows, all.n_features,
           all.label ? "classification" : "regression");
    dpt_print_config(stdout, pc);
    printf("\n");
    dpt_print_plan(stdout, plan);
    printf("\n");
    if (o.resume)
      printf("resumed from %s at step %llu\n", o.resume,
             (unsigned long long)dp_ctx_step(ctx));
  }
  /* the log: a resumed run continues its file */
  if (writes && o.log && dp_file_append(o.log, "log", !o.resume, &logf)) {
    fprintf(stderr, "dp train: %s\n", dpt_user_msg(dp_last_error()));
    goto out;
  }
  int tty = !o.quiet && isatty(STDOUT_FILENO), cols = 80;
  struct winsize ws;
  if (tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) cols = ws.ws_col;
  long steps = 0, samples = 0;
  double t_train = 0.0, t_run0 = dpt_now_s();
  int ep_end = epoch0 + o.epochs, ep_done = epoch0, n_held = 0;
  /* --patience: the best held-out loss, its epoch, evaluations since */
  double best = INFINITY;
  int best_ep = 0, since_best = 0, stopped = 0;
  for (int ep = epoch0; ep < ep_end; ep++) {
    dpt_epoch_order(train.n_rows, cfg.seed, ep, perm);
    double sum = 0.0, t0 = dpt_now_s(), t_last = t0, t_epoch = 0.0;
    int nb = 0;
    long ep_samples = 0;
    for (int from = 0; from < train.n_rows; from += B) {
      int n = train.n_rows - from < B ? train.n_rows - from : B;
      gather_rows(&train, perm, from, n, bx, bt);
      float loss;
      /* the scheduled rate at this optimizer step (the context's counter: a resumed
       * run continues its schedule) */
      if (o.schedule && dp_set_lr(ctx, dp_lr_at(&sched, dp_ctx_step(ctx)))) {
        fprintf(stderr, "dp train: --lr-schedule: %s\n", dpt_user_msg(dp_ctx_error(ctx)));
        goto out;
      }
      double ts = dpt_now_s();
      /* under mpirun every rank has the batch and feeds its own rows of it */
      int r0 = 0, nr = n;
      if (dp_plan_ranks(plan) > 1) dp_plan_rank_rows(plan, n, dpt_world_rank(), &r0, &nr);
      if (dp_train_step(ctx, n, in_w, bx + (size_t)r0 * in_w, (char *)bt + (size_t)r0 * tsz,
                        &loss)) {
        printf("%s", tty ? "\n" : "");
        fprintf(stderr, "dp train: epoch %d, step %ld: %s\n", ep + 1, steps + 1,
                dpt_user_msg(dp_ctx_error(ctx)));
        double decay = (double)pc->lr * pc->weight_decay;
        if (pc->optimizer != DP_OPT_ADAMW && decay > 2.0) /* |1 - lr*wd| > 1 */
          fprintf(stderr,
                  "dp train: the likely cause: --lr * --weight-decay is %g; SGD multiplies "
                  "the parameters by 1 - lr * weight_decay each step, so above 2 they grow "
                  "without bound; lower --weight-decay or --lr\n",
                  decay);
        goto out;
      }
      double te = dpt_now_s();
      t_train += te - ts;
      t_epoch += te - ts;
      sum += loss;
      nb++;
      steps++;
      samples += n;
      ep_samples += n;
      if (tty && te - t_last > 0.1) {
        /* the time left: the time so far over the share of the epochs done */
        double el = te - t_run0,
               frac = (ep - epoch0 + (double)(from + n) / train.n_rows) / o.epochs;
        progress(tty, cols, ep + 1, ep_end, from + n, train.n_rows, (float)(sum / nb),
                 samples / t_train, el, frac > 0 ? el / frac - el : -1.0, "", 0);
        t_last = te;
      }
    }
    int k = ep - epoch0;
    curve[k] = (float)(sum / nb);
    ep_done = ep + 1;

    /* the held-out share after every --eval-every-th epoch (counted from the
     * run's first, so a resumed run evaluates where the whole one would) */
    char held[128] = "";
    double h_metric = NAN, h_loss = NAN;
    int evaluated = o.eval_every && ep_done % o.eval_every == 0;
    if (evaluated) {
      if (evaluate(ctx, plan, &test, B, out_w, bx, by + (size_t)B * out_w, by, &h_metric,
                   &h_loss)) {
        printf("%s", tty ? "\n" : "");
        fprintf(stderr, "dp train: evaluation after epoch %d: %s\n", ep_done,
                dpt_user_msg(dp_ctx_error(ctx)));
        goto out;
      }
      hx[n_held] = ep_done;
      hcurve[n_held++] = (float)h_loss;
      if (all.label)
        snprintf(held, sizeof held, "  held-out loss %.4f  accuracy %.2f%%", h_loss,
                 100.0 * h_metric);
      else
        snprintf(held, sizeof held, "  held-out loss (mse) %.4g", h_loss);
    }
    double el = dpt_now_s() - t_run0;
    if (!o.quiet)
      progress(tty, cols, ep_done, ep_end, train.n_rows, train.n_rows, curve[k],
               samples / t_train, el, el / (k + 1) * (ep_end - ep_done), held, 1);
    if (logf) {
      fprintf(logf, "{\"epoch\":%d,\"step\":%llu,\"loss\":", ep_done,
              (unsigned long long)dp_ctx_step(ctx));
      json_number(logf, curve[k]);
      fputs(",\"lr\":", logf);
      json_number(logf, dp_ctx_lr(ctx));
      fputs(",\"grad_norm\":", logf);
      json_number(logf, pc->clip_grad_norm > 0 ? dp_ctx_grad_norm(ctx) : NAN);
      fputs(",\"samples_per_s\":", logf);
      json_number(logf, t_epoch > 0 ? (double)ep_samples / t_epoch : NAN);
      fputs(",\"elapsed_s\":", logf);
      json_number(logf, el);
      if (evaluated) {
        fputs(",\"heldout_loss\":", logf);
        json_number(logf, h_loss);
        fputs(all.label ? ",\"heldout_accuracy\":" : ",\"heldout_mse\":", logf);
        json_number(logf, h_metric);
      }
      fputs("}\n", logf);
      if (fflush(logf) || ferror(logf)) {
        fprintf(stderr, "dp train: warning: cannot write log '%s': %s; no more lines\n",
                o.log, strerror(errno));
        fclose(logf);
        logf = NULL;
      }
    }
    /* --patience: rank 0 has the figures; every rank stops with it */
    if (evaluated && o.patience) {
      if (h_loss < best) {
        best = h_loss;
        best_ep = ep_done;
        since_best = 0;
      } else {
        since_best++;
      }
      if (dpt_world_bcast_int(since_best >= o.patience)) {
        stopped = 1;
        break;
      }
    }
  }
  if (stopped)
    printf("early stop at epoch %d: held-out loss has not improved for %d evaluation%s "
           "(best %.4f at epoch %d)\n",
           ep_done, o.patience, o.patience == 1 ? "" : "s", best, best_ep);

  double metric = 0.0, eval_loss = 0.0;
  const dpt_dataset *eval = test.n_rows ? &test : &train;
  if (evaluate(ctx, plan, eval, B, out_w, bx, by + (size_t)B * out_w, by, &metric,
               &eval_loss)) {
    fprintf(stderr, "dp train: evaluation: %s\n", dpt_user_msg(dp_ctx_error(ctx)));
    goto out;
  }
  printf("\n%s: %s %.2f%s (%d rows)\n", test.n_rows ? "held-out" : "training",
         all.label ? "accuracy" : "mse", all.label ? 100.0 * metric : metric,
         all.label ? "%" : "", eval->n_rows);
  printf("steps: %ld in %.3f s of step time: %.3f ms/step, %.0f samples/s\n", steps,
         t_train, 1e3 * t_train / (double)steps, (double)samples / t_train);
  printf("parameter hash: %016llx (fnv-1a 64 of %zu fp32 parameters)\n",
         (unsigned long long)dp_params_hash(ctx), dp_model_n_params(model));
  if (logf) {
    FILE *lf = logf;
    logf = NULL;
    if (fclose(lf)) {
      fprintf(stderr, "dp train: cannot write log '%s': %s\n", o.log, strerror(errno));
      goto out;
    }
  }
  if (o.plot && writes) {
    /* the curves over the run's epochs; the settings under the title */
    int n_ep = ep_done - epoch0;
    double *ex = malloc((size_t)n_ep * sizeof *ex);
    if (!ex) {
      fprintf(stderr, "dp train: out of memory\n");
      goto out;
    }
    for (int i = 0; i < n_ep; i++) ex[i] = epoch0 + i + 1;
    char title[512], lr[96];
    if (o.schedule)
      snprintf(lr, sizeof lr, "lr %g (%s)", (double)pc->lr, o.schedule);
    else
      snprintf(lr, sizeof lr, "lr %g", (double)pc->lr);
    snprintf(title, sizeof title, "%s\n%s: %s, %s, batch %d on %d device%s",
             n_held ? "training and held-out loss" : "training loss", o.model,
             dp_optimizer_name(pc->optimizer), lr, pc->batch, pc->n_devices,
             pc->n_devices == 1 ? "" : "s");
    dpt_svg_series lines[2] = {
        {.name = "training (epoch mean)", .x = ex, .y = curve, .n = n_ep},
        {.name = "held-out", .x = hx, .y = hcurve, .n = n_held}};
    dp_status ps = dpt_svg_lines(o.plot, title, "epoch",
                                 o.plot_log ? "mean loss (log scale)" : "mean loss", lines,
                                 n_held ? 2 : 1, o.plot_log, err, sizeof err);
    free(ex);
    if (ps) {
      fprintf(stderr, "dp train: %s\n", err);
      goto out;
    }
    printf("loss curve: %s\n", o.plot);
  }
  if (o.save) {
    size_t run_n = 0;
    char settings[1024];
    char *run =
        dpt_run_text(ep_done, train.n_rows, &scaler,
                     settings_of(&cfg, o.schedule, settings, sizeof settings), &run_n);
    if (!run) {
      fprintf(stderr, "dp train: out of memory\n");
      goto out;
    }
    dp_status ss = dp_ckpt_save_app(ctx, o.save, run, run_n);
    free(run);
    if (ss) {
      fprintf(stderr, "dp train: %s\n", dpt_user_msg(dp_ctx_error(ctx)));
      goto out;
    }
    printf("checkpoint: %s (step %llu)\n", o.save, (unsigned long long)dp_ctx_step(ctx));
  }
  rc = DPT_EXIT_OK;
out:
  free(bx);
  free(by);
  free(bt);
  free(perm);
  free(curve);
  free(hcurve);
  free(hx);
  if (logf) fclose(logf);
  dpt_dataset_free(&all);
  dpt_dataset_free(&train);
  dpt_dataset_free(&test);
  dpt_scaler_free(&scaler);
  dp_ctx_free(ctx);
  dp_plan_free(plan);
  dp_model_free(model);
  return rc;
}
