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
#include <limits.h>
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
  OPT_STANDARDIZE,
  OPT_LABELS,
  OPT_VAL_DATA,
  OPT_VAL_LABELS,
  OPT_HEADER,
  OPT_NO_SHUFFLE,
  OPT_DATA_SEED,
};

typedef struct {
  const char *model, *data, *plot, *save, *resume, *schedule, *log;
  const char *labels, *val_data, *val_labels; /* --labels, --val-data, --val-labels */
  int header, no_shuffle, test_fraction_given;
  int data_seed_given;
  uint64_t data_seed; /* --data-seed; default: --seed */
  int epochs, quiet, eval_every, patience, plot_log;
  int standardize;  /* 0 none, 1 per feature (the default), 2 per channel */
  int std_given[2]; /* --standardize, --no-standardize given */
  float test_fraction;
} train_opts;

/* One field of --lr-schedule: a number, or with an `e` suffix a number of
 * epochs (an integer field only). *v the number, *epochs whether it had one. 0,
 * or -1: not a number. */
static int schedule_field(const char *f, double *v, int *epochs) {
  char *end = NULL;
  errno = 0;
  *v = strtod(f, &end);
  *epochs = end && *end == 'e' && end[1] == '\0';
  return end == f || errno || (*end && !*epochs) || !isfinite(*v) ? -1 : 0;
}

/* --lr-schedule: constant | step:N:GAMMA | cosine:T_MAX[:ETA_MIN] |
 * warmup-cosine:W:T_MAX[:ETA_MIN[:START]] (START: 1/3, LinearLR's default),
 * in optimizer steps; base_lr is --lr. N, T_MAX and W may be given in epochs
 * with an `e` suffix (2e, 0.5e): the optimizer steps by the end of that many
 * epochs of `calls` training calls each, `accumulate` calls per step. With
 * calls 0 (before the data is read) such fields are only checked for form
 * (*in_epochs set); the schedule is parsed again once calls is known. */
static int parse_schedule(const char *text, float base_lr, long calls, int accumulate,
                          dp_lr_schedule *s, int *in_epochs, char *err, size_t errcap) {
  *s = (dp_lr_schedule){.kind = DP_LR_CONSTANT,
                        .base_lr = base_lr,
                        .gamma = 1.0f,
                        .start_factor = 1.0f / 3.0f};
  *in_epochs = 0;
  char buf[128], *field[6];
  double v[5] = {0};
  int n = 0, ep[5] = {0};
  if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf) goto bad;
  for (char *p = buf, *q; n < 6; p = q + 1) {
    field[n++] = p;
    if (!(q = strchr(p, ':'))) break;
    *q = '\0';
  }
  for (int i = 1; i < n; i++) {
    if (schedule_field(field[i], &v[i - 1], &ep[i - 1])) goto bad;
    if (ep[i - 1]) {
      *in_epochs = 1;
      if (v[i - 1] <= 0) goto bad;
      /* the steps done by the end of that many epochs (at least 1) */
      double st = calls > 0 ? floor(v[i - 1] * (double)calls / accumulate) : 1.0;
      v[i - 1] = st < 1.0 ? 1.0 : st > INT_MAX ? INT_MAX : st;
    }
  }
  const char *word = field[0];
  int k = n - 1; /* numbers after the word */
  if (strcmp(word, "constant") == 0 && k == 0) {
    /* base_lr throughout */
  } else if (strcmp(word, "step") == 0 && k == 2 && !ep[1]) {
    s->kind = DP_LR_STEP;
    s->step_size = (int)v[0];
    s->gamma = (float)v[1];
    if (v[0] != (int)v[0]) goto bad;
  } else if (strcmp(word, "cosine") == 0 && (k == 1 || k == 2) && !ep[1]) {
    s->kind = DP_LR_COSINE;
    s->t_max = (int)v[0];
    s->eta_min = (float)v[1];
    if (v[0] != (int)v[0]) goto bad;
  } else if (strcmp(word, "warmup-cosine") == 0 && k >= 2 && k <= 4 && !ep[2] && !ep[3]) {
    s->kind = DP_LR_WARMUP_COSINE;
    s->warmup = (int)v[0];
    s->t_max = (int)v[1];
    s->eta_min = (float)v[2];
    if (k == 4) s->start_factor = (float)v[3];
    if (v[0] != (int)v[0] || v[1] != (int)v[1]) goto bad;
  } else {
    goto bad;
  }
  if (*in_epochs && calls <= 0) return 0; /* checked again with the epochs' steps */
  if (dp_lr_schedule_check(s) == DP_OK) return 0;
  snprintf(err, errcap, "--lr-schedule %s: %s", text, dpt_user_msg(dp_last_error()));
  return -1;
bad:
  snprintf(err, errcap,
           "--lr-schedule: '%s' is not constant, step:N:GAMMA, cosine:T_MAX[:ETA_MIN] or "
           "warmup-cosine:W:T_MAX[:ETA_MIN[:START]] (N, T_MAX, W in steps, or in epochs "
           "with an e suffix: 2e)",
           text);
  return -1;
}

static int on_option(void *user, int code, const char *arg, char *err, size_t errcap) {
  train_opts *o = user;
  switch (code) {
  case OPT_MODEL: o->model = arg; return 0;
  case OPT_DATA: o->data = arg; return 0;
  case OPT_LABELS: o->labels = arg; return 0;
  case OPT_VAL_DATA: o->val_data = arg; return 0;
  case OPT_VAL_LABELS: o->val_labels = arg; return 0;
  case OPT_HEADER: o->header = 1; return 0;
  case OPT_NO_SHUFFLE: o->no_shuffle = 1; return 0;
  case OPT_DATA_SEED:
    o->data_seed_given = 1;
    return dpt_parse_u64(arg, "--data-seed", &o->data_seed, err, errcap);
  case OPT_PLOT: o->plot = arg; return 0;
  case OPT_SAVE: o->save = arg; return 0;
  case OPT_RESUME: o->resume = arg; return 0;
  case OPT_LR_SCHEDULE: o->schedule = arg; return 0;
  case OPT_QUIET: o->quiet = 1; return 0;
  case OPT_NO_STANDARDIZE:
    o->std_given[1] = 1;
    if (o->std_given[0] && o->standardize)
      return dpt_fail(err, errcap, "--no-standardize contradicts --standardize %s",
                      o->standardize == 1 ? "feature" : "channel");
    o->standardize = 0;
    return 0;
  case OPT_STANDARDIZE: {
    static const char *const words[] = {"none", "feature", "channel"};
    int k = 0;
    while (k < 3 && strcmp(arg, words[k])) k++;
    if (k == 3)
      return dpt_fail(err, errcap, "--standardize: '%s' is not none, feature or channel",
                      arg);
    if (o->std_given[1] && k)
      return dpt_fail(err, errcap, "--standardize %s contradicts --no-standardize", arg);
    o->std_given[0] = 1;
    o->standardize = k;
    return 0;
  }
  case OPT_LOG: o->log = arg; return 0;
  case OPT_PLOT_LOG: o->plot_log = 1; return 0;
  case OPT_EVAL_EVERY:
    return dpt_parse_int(arg, 1, 1000000, "--eval-every", &o->eval_every, err, errcap);
  case OPT_PATIENCE:
    return dpt_parse_int(arg, 1, 1000000, "--patience", &o->patience, err, errcap);
  case OPT_EPOCHS:
    return dpt_parse_int(arg, 1, 1000000, "--epochs", &o->epochs, err, errcap);
  case OPT_TEST_FRACTION:
    o->test_fraction_given = 1;
    return dpt_parse_float(arg, 0.0, 0.95, "--test-fraction", &o->test_fraction, err,
                           errcap);
  }
  return -1;
}

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: dp train --model M.dpm --data D.csv --batch B [--devices N] [--epochs E]\n"
      "                [--labels L] [--val-data V [--val-labels VL]] [--header]\n"
      "                [--no-shuffle] [--data-seed S]\n"
      "                [--optimizer sgd|momentum|adamw] [--lr LR] [--seed S]\n"
      "                [--split chunk|balanced|memory] [--micro-batch K]\n"
      "                [--test-fraction F] [--eval-every N [--patience P]]\n"
      "                [--log F.jsonl] [--plot loss.svg [--plot-log]] [--save F.ckpt]\n"
      "                [--resume F.ckpt] [--lr-schedule S] [--clip-grad-norm X]\n"
      "                [--standardize none|feature|channel] [--no-standardize]\n"
      "                [--quiet] [--backend cpu|cuda] [--graph] [--tf32]\n\n"
      "Trains the model on the data (a CSV: label first, then the features; for an mse\n"
      "model, the first <output width> fields are the targets; or .npy or MNIST IDX\n"
      "files with --labels) with data parallelism over N devices (virtual ones on\n"
      "the cpu backend, GPUs with --backend cuda): it prints the memory plan, then\n"
      "progress (a bar with the elapsed time and the time left on a terminal, one\n"
      "line per epoch otherwise), then held-out accuracy (or mse), samples/s and\n"
      "the parameter hash. A held-out share (--test-fraction, default 0.2) is split\n"
      "off with the data seed, or --val-data is held out; the inputs are\n"
      "standardised on the training share (--standardize).\n\n"
      "  --model FILE          model spec (.dpm)\n"
      "  --data FILE           the data, its format told by its first bytes: CSV (a\n"
      "                        first row with a field that is not a number is a\n"
      "                        header, skipped); NumPy .npy, float32/float64/uint8 of\n"
      "                        any shape (N, ...) whose values per row are the\n"
      "                        model's inputs, C order, little-endian; MNIST IDX\n"
      "                        (train-images-idx3-ubyte, gzip'd or not), pixels as\n"
      "                        floats 0..255. .npy and IDX files are mapped, not\n"
      "                        read: a file larger than memory trains\n"
      "  --labels FILE         with .npy or IDX data: the labels, .npy int32/int64/\n"
      "                        uint8 (N,) or IDX (train-labels-idx1-ubyte[.gz]); an\n"
      "                        mse model's targets as .npy float32/float64 (N, K)\n"
      "  --header              the CSV's first row is a header (else detected)\n"
      "  --val-data FILE       the held-out set (any format above), instead of a share\n"
      "                        of --data: all of --data trains; --val-labels FILE\n"
      "                        gives its labels when it needs them\n"
      "  --no-shuffle          the rows in file order: every epoch the same, and the\n"
      "                        held-out share the file's last rows\n"
      "  --data-seed S         the seed of the held-out split and the epochs' order\n"
      "                        (default: --seed), so that runs of other --seed\n"
      "                        (initialisation, dropout) see the same data order\n"
      "  --epochs E            passes over the training share (default 10)\n"
      "  --test-fraction F     held-out share, 0..0.95 (default 0.2; not with --val-data)\n"
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
      "                        steps from START x lr, default 1/3, then the cosine).\n"
      "                        N, T_MAX and W count optimizer steps, or epochs with an\n"
      "                        e suffix (warmup-cosine:1e:10e; dp train prints the\n"
      "                        steps per epoch)\n"
      "  --resume FILE         before training, load a checkpoint of the same model,\n"
      "                        optimizer and seed (from --save or dp_ckpt_save) and\n"
      "                        train on from it for --epochs more epochs: parameters,\n"
      "                        optimizer state, step counter, the rate schedule, the\n"
      "                        data order (the next epoch) and the standardisation\n"
      "                        continue, so --epochs 10 --save F, then --epochs 10\n"
      "                        --resume F gives the bits of --epochs 20 (same data,\n"
      "                        options and --save at the end of the first run)\n"
      "  --standardize MODE    the inputs' standardisation, (x - mean) / std with the\n"
      "                        mean and population deviation over the training share\n"
      "                        (kept in --save's checkpoint; dp predict and dp export\n"
      "                        use them): feature (the default) per feature, channel\n"
      "                        per input channel of an image model (over its H*W\n"
      "                        values, as torchvision's Normalize), none: raw inputs.\n"
      "                        A constant feature or channel gets std 1 (it becomes 0)\n"
      "                        and a warning names it\n"
      "  --no-standardize      the same as --standardize none\n"
      "  --quiet               only the final report\n\n");
  dpt_print_common_help(f);
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
static int evaluate(dp_ctx *ctx, const dp_plan *plan, const dpt_dataset *d,
                    const dpt_scaler *sc, int batch, int out_w, float *x, float *ymine,
                    float *y, double *metric, double *loss) {
  long correct = 0;
  double se = 0.0, ce = 0.0;
  char err[256];
  for (int from = 0; from < d->n_rows; from += batch) {
    int n = d->n_rows - from < batch ? d->n_rows - from : batch;
    dpt_dataset_gather(d, sc, NULL, from, n, x, NULL);
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
    size_t na = strcspn(a, "= "), nb = strcspn(b, "= ");
    if (la && lb && (na != nb || memcmp(a, b, na))) lb = 0; /* different words */
    /* a word (data-seed, shuffle) one run has: the default in the other */
    if (!la != !lb) {
      const char *wd = la ? a : b;
      size_t n = la ? na : nb, l = la ? la : strcspn(b, " ");
      char v[64];
      snprintf(v, sizeof v, "%.*s", (int)(l > n ? l - n - 1 : 0), wd + n + (l > n));
      snprintf(err, errcap,
               "--%.*s: the checkpoint's run used %s, this one %s; a resume continues the "
               "run only with the same settings",
               (int)n, wd, la ? v : "the default", la ? "the default" : v);
      return -1;
    }
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
                       const dpt_dataset *val, const dp_config *cfg) {
  char err[1024];
  dpt_train_inputs in = {.model = model,
                         .data = all,
                         .cfg = cfg,
                         .schedule = o->schedule,
                         .epochs = o->epochs,
                         .eval_every = o->eval_every,
                         .patience = o->patience,
                         .standardize = o->standardize,
                         .val = o->val_data ? val : NULL,
                         .data_seed = o->data_seed,
                         .no_shuffle = o->no_shuffle,
                         .header = o->header,
                         .resume = o->resume != NULL,
                         .test_fraction = o->test_fraction};
  if (!dpt_agree_train(&in, err, sizeof err)) return 0;
  if (*err) fprintf(stderr, "dp train: %s\n", err);
  return -1;
}

/* The state of one `dp train` run, handed from phase to phase. */
typedef struct {
  train_opts o;
  dp_config cfg;
  dp_lr_schedule sched;
  char err[512];
  int writes; /* rank 0 writes the files (every rank, as one process, under mpirun) */
  dp_model *model;
  dp_plan *plan;
  dp_ctx *ctx;
  const dp_config *pc; /* the plan's config */
  dpt_dataset all, train, test;
  dpt_scaler scaler; /* the feature standardisation (n = 0: none) */
  float *bx, *by, *curve, *hcurve;
  double *hx; /* the epochs of the held-out curve hcurve */
  void *bt;
  int *perm;
  FILE *logf;
  int in_w, out_w, batch, tsz;
  int epoch0, ep_end, ep_done, n_held;
  int tty, cols;
  long steps, samples;
  double t_train, t_run0;
  /* --patience: the best held-out loss, its epoch, evaluations since */
  double best;
  int best_ep, since_best, stopped;
} train_run;

/* The run's settings (settings_of), and the data order's when not the
 * default: data-seed=N when --data-seed differs from --seed, shuffle=0 with
 * --no-shuffle (so a run without them records what earlier versions did, and
 * a resume continues the order it had). Returns buf. */
static const char *run_settings(const train_run *t, char *buf, size_t cap) {
  settings_of(&t->cfg, t->o.schedule, buf, cap);
  size_t at = strlen(buf);
  if (t->o.data_seed != t->cfg.seed && at < cap)
    at += (size_t)snprintf(buf + at, cap - at, " data-seed=%llu",
                           (unsigned long long)t->o.data_seed);
  if (t->o.no_shuffle && at < cap) snprintf(buf + at, cap - at, " shuffle=0");
  return buf;
}

/* The command line into t->o, t->cfg and t->sched. Returns -1 to go on, else
 * the exit status (usage printed, or the error said). */
static int parse_train(int argc, char **argv, train_run *t) {
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
      {"standardize", required_argument, NULL, OPT_STANDARDIZE},
      {"labels", required_argument, NULL, OPT_LABELS},
      {"val-data", required_argument, NULL, OPT_VAL_DATA},
      {"val-labels", required_argument, NULL, OPT_VAL_LABELS},
      {"header", no_argument, NULL, OPT_HEADER},
      {"no-shuffle", no_argument, NULL, OPT_NO_SHUFFLE},
      {"data-seed", required_argument, NULL, OPT_DATA_SEED},
      {"eval-every", required_argument, NULL, OPT_EVAL_EVERY},
      {"log", required_argument, NULL, OPT_LOG},
      {"plot-log", no_argument, NULL, OPT_PLOT_LOG},
      {"patience", required_argument, NULL, OPT_PATIENCE},
      {0, 0, 0, 0}};
  train_opts *o = &t->o;
  dpt_common common;
  char *err = t->err;
  size_t errcap = sizeof t->err;
  int r = dpt_parse_command(argc, argv, extra, on_option, o, usage, &t->cfg, &common, err,
                            errcap);
  if (r == DPT_ARGS_HELP) return DPT_EXIT_OK;
  if (r == DPT_ARGS_OK && (!o->model || !o->data || !dpt_given(&common, DPT_OPT_BATCH)))
    r = dpt_fail(err, errcap, "--model, --data and --batch are required");
  if (r == DPT_ARGS_OK && t->cfg.inference)
    r = dpt_fail(err, errcap, "--inference makes no sense for training");
  if (r == DPT_ARGS_OK && o->patience && !o->eval_every)
    r = dpt_fail(
        err, errcap,
        "--patience needs --eval-every (it counts evaluations of the held-out share)");
  if (r == DPT_ARGS_OK && o->val_data && o->test_fraction_given)
    r = dpt_fail(err, errcap,
                 "--val-data is the held-out set: --test-fraction (a share of --data) goes "
                 "without it");
  if (r == DPT_ARGS_OK && o->val_labels && !o->val_data)
    r = dpt_fail(err, errcap, "--val-labels goes with --val-data");
  if (r == DPT_ARGS_OK && o->val_data) o->test_fraction = 0.0f;
  if (r == DPT_ARGS_OK && o->eval_every && o->test_fraction == 0.0f && !o->val_data)
    r = dpt_fail(
        err, errcap,
        "--eval-every needs a held-out share (--test-fraction > 0, or --val-data)");
  if (r == DPT_ARGS_OK && !o->data_seed_given) o->data_seed = t->cfg.seed;
  if (r == DPT_ARGS_OK && o->plot_log && !o->plot)
    r = dpt_fail(err, errcap, "--plot-log needs --plot");
  int in_epochs = 0;
  if (r == DPT_ARGS_OK && o->schedule &&
      parse_schedule(o->schedule, t->cfg.lr, 0, 1, &t->sched, &in_epochs, err, errcap))
    r = DPT_ARGS_ERROR;
  if (r != DPT_ARGS_OK) {
    fprintf(stderr, "dp train: %s\n(see dp train --help)\n", err);
    return DPT_EXIT_USAGE;
  }
  return -1;
}

/* The output files first: a path that cannot be written fails now, not after
 * the whole run. 0, or -1 (said). */
static int check_files(train_run *t) {
  const train_opts *o = &t->o;
  char *err = t->err;
  /* no output may be an input (--save may be --resume: it is written after
   * the resume read it, whole, by a rename) */
  dpt_file_role outs[] = {{o->save, "checkpoint"}, {o->plot, "plot"}, {o->log, "log"}},
                ins[] = {{o->model, "model"},
                         {o->data, "data"},
                         {o->labels, "labels"},
                         {o->val_data, "validation data"},
                         {o->val_labels, "validation labels"},
                         {o->resume, "checkpoint"}};
  if (t->writes &&
      (dpt_check_distinct(outs, 3, ins, 5, err, sizeof t->err) ||
       dpt_check_distinct(outs + 1, 2, ins + 5, 1, err, sizeof t->err) ||
       (o->save && dpt_check_writable(o->save, "checkpoint", 1, err, sizeof t->err)) ||
       (o->plot && dpt_check_writable(o->plot, "plot", 1, err, sizeof t->err)) ||
       (o->log && dpt_check_writable(o->log, "log", 0, err, sizeof t->err)))) {
    fprintf(stderr, "dp train: %s\n", err);
    return -1;
  }
  if (o->resume && t->writes) { /* read by rank 0 (sent to the others), checked later */
    int fd = dpt_open_regular(o->resume, "checkpoint", err, sizeof t->err);
    if (fd < 0) {
      fprintf(stderr, "dp train: --resume: %s\n", err);
      return -1;
    }
    close(fd);
  }
  return 0;
}

/* One data set (--data, or --val-data) as the model reads it: CSV, .npy or
 * IDX, with its labels file; checked against the model. 0, or -1 (said). */
static int load_data(train_run *t, const char *data, const char *labels,
                     const char *labels_opt, dpt_dataset *d) {
  const train_opts *o = &t->o;
  int ce = dp_model_loss(t->model) == DP_LOSS_SOFTMAX_CE;
  dpt_data_spec spec = {.data = data,
                        .labels = labels,
                        .labels_opt = labels_opt,
                        .rows = ce ? DPT_ROWS_CLASSES : DPT_ROWS_TARGETS,
                        .n_targets = t->out_w,
                        .n_outputs = ce ? t->out_w : 0,
                        .header = o->header,
                        .n_features = t->in_w};
  if (dpt_data_load(&spec, d, t->err, sizeof t->err)) {
    fprintf(stderr, "dp train: %s\n", t->err);
    return -1;
  }
  if (d->n_features != t->in_w) {
    fprintf(stderr, "dp train: %s has %d features per row; %s takes %d\n", data,
            d->n_features, o->model, t->in_w);
    return -1;
  }
  if (d->label && d->n_classes > t->out_w) {
    fprintf(stderr, "dp train: %s has labels up to %d; the model has %d outputs\n", data,
            d->n_classes - 1, t->out_w);
    return -1;
  }
  return 0;
}

/* The model and the data, checked against each other, agreed on by the ranks
 * and split into the training and held-out shares. 0, or -1 (said). */
static int load_inputs(train_run *t) {
  const train_opts *o = &t->o;
  char *err = t->err;
  if (dpt_load_model(o->model, &t->model, err, sizeof t->err) ||
      dpt_require_loss(o->model, t->model, NULL, err, sizeof t->err)) {
    fprintf(stderr, "dp train: %s\n", err);
    return -1;
  }
  t->in_w = dp_model_input_width(t->model);
  t->out_w = dp_model_output_width(t->model);
  int c, h, w;
  if (o->standardize == 2 && !dpt_model_image(t->model, &c, &h, &w)) {
    fprintf(stderr,
            "dp train: --standardize channel is for image models (input C H W); %s takes "
            "rows of %d features: use --standardize feature\n",
            o->model, t->in_w);
    return -1;
  }
  if (load_data(t, o->data, o->labels, "--labels", &t->all) ||
      (o->val_data && load_data(t, o->val_data, o->val_labels, "--val-labels", &t->test)))
    return -1;
  if (agree_ranks(o, t->model, &t->all, &t->test, &t->cfg)) return -1;
  /* --val-data: every row of --data trains (in the data seed's order, as with
   * --test-fraction 0), the validation set is held out as it is */
  dpt_dataset none;
  if (dpt_dataset_split_as(&t->all, o->test_fraction, !o->no_shuffle, o->data_seed,
                           &t->train, o->val_data ? &none : &t->test, err, sizeof t->err)) {
    fprintf(stderr, "dp train: %s\n", err);
    return -1;
  }
  if (o->val_data) dpt_dataset_free(&none);
  return 0;
}

/* What the checkpoint's record says against this run: its settings must be
 * the same, its epochs within the limit, its standardisation the one asked
 * for. 0, or -1 (said). */
static int check_resumed(train_run *t, int rows, int has_record) {
  const train_opts *o = &t->o;
  if (t->epoch0 > DPT_MAX_EPOCHS - o->epochs) { /* the record's count, range-checked */
    fprintf(stderr,
            "dp train: cannot resume from '%s': %d epochs done and --epochs %d would pass "
            "%d epochs\n",
            o->resume, t->epoch0, o->epochs, DPT_MAX_EPOCHS);
    return -1;
  }
  if (has_record && rows > 0 && rows != t->train.n_rows) /* rows 0: dp import's record */
    fprintf(stderr,
            "dp train: warning: %s was trained on %d rows; this data gives %d (another "
            "file, or another --test-fraction): the run will not continue as it was\n",
            o->resume, rows, t->train.n_rows);
  int saved = t->scaler.n > 0 ? 1 + t->scaler.per_channel : 0;
  if (has_record && saved != o->standardize) {
    static const char *const words[] = {"none", "feature", "channel"};
    fprintf(
        stderr,
        "dp train: %s was trained with --standardize %s; resume it with --standardize %s "
        "(this run asks for %s)\n",
        o->resume, words[saved], words[saved], words[o->standardize]);
    return -1;
  }
  char why[256];
  int c, h, w;
  dpt_model_image(t->model, &c, &h, &w);
  if (dpt_scaler_fits(&t->scaler, t->in_w, c, why, sizeof why)) {
    fprintf(stderr, "dp train: %s: %s\n", o->resume, why);
    return -1;
  }
  return 0;
}

/* The run so far: a resumed run continues its epochs and keeps the
 * standardisation it trained with (a checkpoint of another program, or of
 * an older format, carries none: epoch 0, fitted again). 0, or -1 (said). */
static int read_resume(train_run *t) {
  const train_opts *o = &t->o;
  char *err = t->err;
  void *app = NULL;
  size_t app_n = 0;
  int rows = 0;
  if (dpt_world_read_app(o->resume, &app, &app_n, err, sizeof t->err)) {
    if (*err) fprintf(stderr, "dp train: cannot resume from '%s': %s\n", o->resume, err);
    return -1;
  }
  char *saved = NULL, now[1024];
  if (app_n && dpt_run_parse(app, app_n, &t->epoch0, &rows, &t->scaler, &saved, err,
                             sizeof t->err)) {
    free(app);
    fprintf(stderr, "dp train: cannot resume from '%s': %s\n", o->resume, err);
    return -1;
  }
  free(app);
  /* the checkpoint carries the run's settings: the same, or no resume */
  int differ =
      saved && same_settings(saved, run_settings(t, now, sizeof now), err, sizeof t->err);
  free(saved);
  if (differ) {
    fprintf(stderr, "dp train: cannot resume from '%s': %s\n", o->resume, err);
    return -1;
  }
  return check_resumed(t, rows, app_n != 0);
}

/* The plan, the context (a resumed run's state loaded into it) and the
 * buffers of the epoch loop. 0, or -1 (said). */
static int make_context(train_run *t) {
  const train_opts *o = &t->o;
  char *err = t->err;
  /* a backend this build lacks: that first, the planner could only say it less well */
  if (!dp_backend_available(t->cfg.backend) &&
      dpt_require_backend(&t->cfg, err, sizeof t->err)) {
    fprintf(stderr, "dp train: %s\n", err);
    return -1;
  }
  if (dp_plan_create(t->model, &t->cfg, &t->plan)) {
    fprintf(stderr, "dp train: %s\n", dpt_user_msg(dp_last_error()));
    return -1;
  }
  /* the plan is checked first: a config error says what is wrong with it */
  if (dpt_require_backend(&t->cfg, err, sizeof t->err)) {
    fprintf(stderr, "dp train: %s\n", err);
    return -1;
  }
  dpt_warn_oversubscribed(stderr, "dp train", dp_plan_n_devices(t->plan), t->cfg.backend,
                          dpt_cpu_count());
  if (dpt_ctx_create(t->plan, &t->ctx)) {
    fprintf(stderr, "dp train: %s\n", dpt_user_msg(dp_last_error()));
    return -1;
  }
  if (o->resume && dp_ckpt_load(t->ctx, o->resume)) {
    fprintf(stderr, "dp train: cannot resume from '%s': %s\n", o->resume,
            dpt_user_msg(dp_ctx_error(t->ctx)));
    return -1;
  }
  t->pc = dp_plan_config(t->plan);
  int B = t->batch = t->pc->batch;
  t->tsz = t->all.label ? 4 : t->out_w * 4;
  t->bx = malloc((size_t)B * t->in_w * 4);
  t->by = calloc((size_t)B * t->out_w * 2, 4); /* the batch's outputs, then this rank's */
  t->bt = malloc((size_t)B * t->tsz);
  t->perm = malloc((size_t)t->train.n_rows * sizeof *t->perm);
  t->curve = malloc((size_t)o->epochs * sizeof *t->curve);
  t->hcurve = malloc((size_t)o->epochs * sizeof *t->hcurve);
  t->hx = malloc((size_t)o->epochs * sizeof *t->hx);
  if (!t->bx || !t->by || !t->bt || !t->perm || !t->curve || !t->hcurve || !t->hx) {
    fprintf(stderr, "dp train: out of memory\n");
    return -1;
  }
  return 0;
}

/* What is about to run (unless --quiet), then the log opened: a resumed run
 * continues its file. 0, or -1 (said). */
static int start_run(train_run *t) {
  const train_opts *o = &t->o;
  /* training calls per epoch, and the optimizer steps they make (accumulation) */
  long calls = (t->train.n_rows + t->batch - 1) / t->batch;
  int K = t->pc->accumulate > 1 ? t->pc->accumulate : 1, in_epochs = 0;
  if (o->schedule && parse_schedule(o->schedule, t->sched.base_lr, calls, K, &t->sched,
                                    &in_epochs, t->err, sizeof t->err)) {
    fprintf(stderr, "dp train: %s\n", t->err);
    return -1;
  }
  if (!o->quiet) {
    printf("dp train: %s on %s: %d train / %d held-out rows, %d features, %s\n", o->model,
           o->data, t->train.n_rows, t->test.n_rows, t->all.n_features,
           t->all.label ? "classification" : "regression");
    if (o->val_data) printf("held-out rows: %s (--val-data)\n", o->val_data);
    for (int k = 0; k < 2; k++) {
      const dpt_dataset *d = k ? &t->test : &t->all;
      if (d->header_line && (!k || o->val_data))
        printf("%s: its header row (line %d) skipped\n", k ? o->val_data : o->data,
               d->header_line);
    }
    if (o->no_shuffle) printf("data order: as in the file, every epoch (--no-shuffle)\n");
    dpt_print_config(stdout, t->pc);
    printf("\n");
    dpt_print_plan(stdout, t->plan);
    printf("\n");
    if (K > 1)
      printf("steps per epoch: %ld training calls of up to %d rows, %g optimizer steps "
             "(one per %d calls)\n",
             calls, t->batch, (double)calls / K, K);
    else
      printf("steps per epoch: %ld (batches of up to %d of %d rows)\n", calls, t->batch,
             t->train.n_rows);
    if (o->resume)
      printf("resumed from %s at step %llu\n", o->resume,
             (unsigned long long)dp_ctx_step(t->ctx));
  }
  if (t->writes && o->log && dp_file_append(o->log, "log", !o->resume, &t->logf)) {
    fprintf(stderr, "dp train: %s\n", dpt_user_msg(dp_last_error()));
    return -1;
  }
  t->tty = !o->quiet && isatty(STDOUT_FILENO);
  t->cols = 80;
  struct winsize ws;
  if (t->tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    t->cols = ws.ws_col;
  t->t_run0 = dpt_now_s();
  t->ep_end = t->epoch0 + o->epochs;
  t->ep_done = t->epoch0;
  t->best = INFINITY;
  return 0;
}

/* A failed step said, with the likely cause when it is the weight decay. */
static void step_failed(const train_run *t, int ep) {
  printf("%s", t->tty ? "\n" : "");
  fprintf(stderr, "dp train: epoch %d, step %ld: %s\n", ep + 1, t->steps + 1,
          dpt_user_msg(dp_ctx_error(t->ctx)));
  double decay = (double)t->pc->lr * t->pc->weight_decay;
  if (t->pc->optimizer != DP_OPT_ADAMW && decay > 2.0) /* |1 - lr*wd| > 1 */
    fprintf(stderr,
            "dp train: the likely cause: --lr * --weight-decay is %g; SGD multiplies "
            "the parameters by 1 - lr * weight_decay each step, so above 2 they grow "
            "without bound; lower --weight-decay or --lr\n",
            decay);
}

/* What one epoch did, for its line and its log record. */
typedef struct {
  double t_epoch; /* seconds in dp_train_step */
  long samples;
} epoch_stats;

/* The steps of epoch ep over the shuffled training rows; its mean loss into
 * curve[ep - epoch0]. 0, or -1 (said). */
static int train_epoch(train_run *t, int ep, epoch_stats *es) {
  const dpt_dataset *train = &t->train;
  int B = t->batch;
  /* --no-shuffle: every epoch in file order; else keyed by the data seed */
  const int *order = t->o.no_shuffle ? NULL : t->perm;
  if (order) dpt_epoch_order(train->n_rows, t->o.data_seed, ep, t->perm);
  double sum = 0.0, t0 = dpt_now_s(), t_last = t0;
  int nb = 0;
  for (int from = 0; from < train->n_rows; from += B) {
    int n = train->n_rows - from < B ? train->n_rows - from : B;
    dpt_dataset_gather(train, &t->scaler, order, from, n, t->bx, t->bt);
    float loss;
    /* the scheduled rate at this optimizer step (the context's counter: a resumed
     * run continues its schedule) */
    if (t->o.schedule && dp_set_lr(t->ctx, dp_lr_at(&t->sched, dp_ctx_step(t->ctx)))) {
      fprintf(stderr, "dp train: --lr-schedule: %s\n", dpt_user_msg(dp_ctx_error(t->ctx)));
      return -1;
    }
    double ts = dpt_now_s();
    /* under mpirun every rank has the batch and feeds its own rows of it */
    int r0 = 0, nr = n;
    if (dp_plan_ranks(t->plan) > 1)
      dp_plan_rank_rows(t->plan, n, dpt_world_rank(), &r0, &nr);
    if (dp_train_step(t->ctx, n, t->in_w, t->bx + (size_t)r0 * t->in_w,
                      (char *)t->bt + (size_t)r0 * t->tsz, &loss)) {
      step_failed(t, ep);
      return -1;
    }
    double te = dpt_now_s();
    t->t_train += te - ts;
    es->t_epoch += te - ts;
    sum += loss;
    nb++;
    t->steps++;
    t->samples += n;
    es->samples += n;
    if (t->tty && te - t_last > 0.1) {
      /* the time left: the time so far over the share of the epochs done */
      double el = te - t->t_run0,
             frac = (ep - t->epoch0 + (double)(from + n) / train->n_rows) / t->o.epochs;
      progress(t->tty, t->cols, ep + 1, t->ep_end, from + n, train->n_rows,
               (float)(sum / nb), t->samples / t->t_train, el,
               frac > 0 ? el / frac - el : -1.0, "", 0);
      t_last = te;
    }
  }
  t->curve[ep - t->epoch0] = (float)(sum / nb);
  return 0;
}

/* The held-out figures after an epoch. */
typedef struct {
  int evaluated;
  double metric, loss;
  char text[128]; /* for the epoch's line */
} held_out;

/* The held-out share after every --eval-every-th epoch (counted from the
 * run's first, so a resumed run evaluates where the whole one would).
 * 0, or -1 (said). */
static int evaluate_epoch(train_run *t, held_out *h) {
  int B = t->batch, out_w = t->out_w;
  h->text[0] = '\0';
  h->metric = NAN;
  h->loss = NAN;
  h->evaluated = t->o.eval_every && t->ep_done % t->o.eval_every == 0;
  if (!h->evaluated) return 0;
  if (evaluate(t->ctx, t->plan, &t->test, &t->scaler, B, out_w, t->bx,
               t->by + (size_t)B * out_w, t->by, &h->metric, &h->loss)) {
    printf("%s", t->tty ? "\n" : "");
    fprintf(stderr, "dp train: evaluation after epoch %d: %s\n", t->ep_done,
            dpt_user_msg(dp_ctx_error(t->ctx)));
    return -1;
  }
  t->hx[t->n_held] = t->ep_done;
  t->hcurve[t->n_held++] = (float)h->loss;
  if (t->all.label)
    snprintf(h->text, sizeof h->text, "  held-out loss %.4f  accuracy %.2f%%", h->loss,
             100.0 * h->metric);
  else
    snprintf(h->text, sizeof h->text, "  held-out loss (mse) %.4g", h->loss);
  return 0;
}

/* The epoch's record in the --log file (one JSON object a line); a write that
 * fails stops the log with a warning. */
static void log_epoch(train_run *t, int k, double el, const epoch_stats *es,
                      const held_out *h) {
  FILE *logf = t->logf;
  fprintf(logf, "{\"epoch\":%d,\"step\":%llu,\"loss\":", t->ep_done,
          (unsigned long long)dp_ctx_step(t->ctx));
  json_number(logf, t->curve[k]);
  fputs(",\"lr\":", logf);
  json_number(logf, dp_ctx_lr(t->ctx));
  fputs(",\"grad_norm\":", logf);
  json_number(logf, t->pc->clip_grad_norm > 0 ? dp_ctx_grad_norm(t->ctx) : NAN);
  fputs(",\"samples_per_s\":", logf);
  json_number(logf, es->t_epoch > 0 ? (double)es->samples / es->t_epoch : NAN);
  fputs(",\"elapsed_s\":", logf);
  json_number(logf, el);
  if (h->evaluated) {
    fputs(",\"heldout_loss\":", logf);
    json_number(logf, h->loss);
    fputs(t->all.label ? ",\"heldout_accuracy\":" : ",\"heldout_mse\":", logf);
    json_number(logf, h->metric);
  }
  fputs("}\n", logf);
  if (fflush(logf) || ferror(logf)) {
    fprintf(stderr, "dp train: warning: cannot write log '%s': %s; no more lines\n",
            t->o.log, strerror(errno));
    fclose(logf);
    t->logf = NULL;
  }
}

/* --patience: rank 0 has the figures; every rank stops with it. 1: stop. */
static int patience_over(train_run *t, const held_out *h) {
  if (!h->evaluated || !t->o.patience) return 0;
  if (h->loss < t->best) {
    t->best = h->loss;
    t->best_ep = t->ep_done;
    t->since_best = 0;
  } else {
    t->since_best++;
  }
  return dpt_world_bcast_int(t->since_best >= t->o.patience);
}

/* The epochs: steps, then the held-out evaluation, the progress line and the
 * log record of each; --patience may stop early. 0, or -1 (said). */
static int run_epochs(train_run *t) {
  for (int ep = t->epoch0; ep < t->ep_end; ep++) {
    epoch_stats es = {0};
    if (train_epoch(t, ep, &es)) return -1;
    int k = ep - t->epoch0;
    t->ep_done = ep + 1;
    held_out h;
    if (evaluate_epoch(t, &h)) return -1;
    double el = dpt_now_s() - t->t_run0;
    if (!t->o.quiet)
      progress(t->tty, t->cols, t->ep_done, t->ep_end, t->train.n_rows, t->train.n_rows,
               t->curve[k], t->samples / t->t_train, el,
               el / (k + 1) * (t->ep_end - t->ep_done), h.text, 1);
    if (t->logf) log_epoch(t, k, el, &es, &h);
    if (patience_over(t, &h)) {
      t->stopped = 1;
      break;
    }
  }
  if (t->stopped)
    printf("early stop at epoch %d: held-out loss has not improved for %d evaluation%s "
           "(best %.4f at epoch %d)\n",
           t->ep_done, t->o.patience, t->o.patience == 1 ? "" : "s", t->best, t->best_ep);
  return 0;
}

/* The final evaluation, the step timings and the parameter hash; then the log
 * closed. 0, or -1 (said). */
static int final_report(train_run *t) {
  double metric = 0.0, eval_loss = 0.0;
  int B = t->batch, out_w = t->out_w;
  const dpt_dataset *eval = t->test.n_rows ? &t->test : &t->train;
  if (evaluate(t->ctx, t->plan, eval, &t->scaler, B, out_w, t->bx,
               t->by + (size_t)B * out_w, t->by, &metric, &eval_loss)) {
    fprintf(stderr, "dp train: evaluation: %s\n", dpt_user_msg(dp_ctx_error(t->ctx)));
    return -1;
  }
  int label = t->all.label != 0;
  printf("\n%s: %s %.2f%s (%d rows)\n", t->test.n_rows ? "held-out" : "training",
         label ? "accuracy" : "mse", label ? 100.0 * metric : metric, label ? "%" : "",
         eval->n_rows);
  printf("steps: %ld in %.3f s of step time: %.3f ms/step, %.0f samples/s\n", t->steps,
         t->t_train, 1e3 * t->t_train / (double)t->steps, (double)t->samples / t->t_train);
  printf("parameter hash: %016llx (fnv-1a 64 of %zu fp32 parameters)\n",
         (unsigned long long)dp_params_hash(t->ctx), dp_model_n_params(t->model));
  if (t->logf) {
    FILE *lf = t->logf;
    t->logf = NULL;
    if (fclose(lf)) {
      fprintf(stderr, "dp train: cannot write log '%s': %s\n", t->o.log, strerror(errno));
      return -1;
    }
  }
  return 0;
}

/* --plot: the curves over the run's epochs; the settings under the title.
 * 0, or -1 (said). */
static int write_plot(train_run *t) {
  const train_opts *o = &t->o;
  const dp_config *pc = t->pc;
  int n_ep = t->ep_done - t->epoch0, n_held = t->n_held;
  double *ex = malloc((size_t)n_ep * sizeof *ex);
  if (!ex) {
    fprintf(stderr, "dp train: out of memory\n");
    return -1;
  }
  for (int i = 0; i < n_ep; i++) ex[i] = t->epoch0 + i + 1;
  char title[512], lr[96];
  if (o->schedule)
    snprintf(lr, sizeof lr, "lr %g (%s)", (double)pc->lr, o->schedule);
  else
    snprintf(lr, sizeof lr, "lr %g", (double)pc->lr);
  snprintf(title, sizeof title, "%s\n%s: %s, %s, batch %d on %d device%s",
           n_held ? "training and held-out loss" : "training loss", o->model,
           dp_optimizer_name(pc->optimizer), lr, pc->batch, pc->n_devices,
           pc->n_devices == 1 ? "" : "s");
  dpt_svg_series lines[2] = {
      {.name = "training (epoch mean)", .x = ex, .y = t->curve, .n = n_ep},
      {.name = "held-out", .x = t->hx, .y = t->hcurve, .n = n_held}};
  dp_status ps = dpt_svg_lines(o->plot, title, "epoch",
                               o->plot_log ? "mean loss (log scale)" : "mean loss", lines,
                               n_held ? 2 : 1, o->plot_log, t->err, sizeof t->err);
  free(ex);
  if (ps) {
    fprintf(stderr, "dp train: %s\n", t->err);
    return -1;
  }
  printf("loss curve: %s\n", o->plot);
  return 0;
}

/* --save: the checkpoint, with the run's record (epochs, rows, the
 * standardisation, the settings). 0, or -1 (said). */
static int save_checkpoint(train_run *t) {
  size_t run_n = 0;
  char settings[1024];
  char *run = dpt_run_text(t->ep_done, t->train.n_rows, &t->scaler,
                           run_settings(t, settings, sizeof settings), &run_n);
  if (!run) {
    fprintf(stderr, "dp train: out of memory\n");
    return -1;
  }
  dp_status ss = dp_ckpt_save_app(t->ctx, t->o.save, run, run_n);
  free(run);
  if (ss) {
    fprintf(stderr, "dp train: %s\n", dpt_user_msg(dp_ctx_error(t->ctx)));
    return -1;
  }
  printf("checkpoint: %s (step %llu)\n", t->o.save,
         (unsigned long long)dp_ctx_step(t->ctx));
  return 0;
}

static void free_run(train_run *t) {
  free(t->bx);
  free(t->by);
  free(t->bt);
  free(t->perm);
  free(t->curve);
  free(t->hcurve);
  free(t->hx);
  if (t->logf) fclose(t->logf);
  dpt_dataset_free(&t->all);
  dpt_dataset_free(&t->train);
  dpt_dataset_free(&t->test);
  dpt_scaler_free(&t->scaler);
  dp_ctx_free(t->ctx);
  dp_plan_free(t->plan);
  dp_model_free(t->model);
}

/* The standardisation fitted on the training share (--standardize feature or
 * channel), with a warning naming the constant features or channels (std 0:
 * taken as 1, so they become 0). 0, or -1 (said). */
static int fit_scaler(train_run *t) {
  int c, h, w, channel = t->o.standardize == 2;
  dpt_model_image(t->model, &c, &h, &w);
  if (channel ? dpt_scaler_fit_channels(&t->train, c, &t->scaler)
              : dpt_scaler_fit(&t->train, &t->scaler)) {
    fprintf(stderr, "dp train: out of memory\n");
    return -1;
  }
  const dpt_scaler *sc = &t->scaler;
  if (sc->n_constant && t->writes) {
    char list[128] = "";
    size_t at = 0;
    for (int i = 0; i < sc->n_constant && i < DPT_CONSTANT_SHOWN; i++)
      at += (size_t)snprintf(list + at, sizeof list - at, "%s%d", i ? ", " : "",
                             sc->constant[i]);
    const char *what = channel ? "channel" : "feature";
    fprintf(stderr,
            "dp train: warning: %d of %d %ss %s constant over the %d training rows (std 0; "
            "%s%s%s): standardised with std 1, %s 0 for every row\n",
            sc->n_constant, sc->n, what, sc->n_constant == 1 ? "is" : "are",
            t->train.n_rows, sc->n_constant == 1 ? what : "the first: ", list,
            sc->n_constant > DPT_CONSTANT_SHOWN ? ", ..." : "",
            sc->n_constant == 1 ? "it becomes" : "they become");
  }
  return 0;
}

/* Everything after the command line: 0, or -1 (said). */
static int train(train_run *t) {
  if (check_files(t) || load_inputs(t)) return -1;
  if (t->o.resume && read_resume(t)) return -1;
  if (t->o.standardize && !t->scaler.n && fit_scaler(t)) return -1;
  /* the standardisation is applied as each batch is gathered (a mapped file
   * is never written) */
  if (make_context(t) || start_run(t) || run_epochs(t) || final_report(t)) return -1;
  if (t->o.plot && t->writes && write_plot(t)) return -1;
  if (t->o.save && save_checkpoint(t)) return -1;
  return 0;
}

int dpt_cmd_train(int argc, char **argv) {
  train_run t = {.o = {.epochs = 10, .test_fraction = 0.2f, .standardize = 1}};
  int rc = parse_train(argc, argv, &t);
  if (rc < 0) {
    t.writes = dpt_world_rank() == 0;
    rc = train(&t) ? DPT_EXIT_FAIL : DPT_EXIT_OK;
  }
  free_run(&t);
  return rc;
}
