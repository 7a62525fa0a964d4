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

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
  OPT_LOG_EVERY,
  OPT_PLOT_LOG,
  OPT_PATIENCE,
  OPT_TEXT,
  OPT_TOKENS,
  OPT_SAVE_EVERY,
  OPT_SAVE_BEST,
  OPT_STANDARDIZE,
  OPT_LABELS,
  OPT_VAL_DATA,
  OPT_VAL_LABELS,
  OPT_HEADER,
  OPT_NO_SHUFFLE,
  OPT_DROP_LAST,
  OPT_DATA_SEED,
  OPT_CYCLE_MOMENTUM,
};

typedef struct {
  const char *model, *data, *plot, *save, *resume, *schedule, *log;
  const char *text, *tokens; /* a sequence model's data: bytes, or a .npy of ids */
  const char *save_every;    /* N optimizer steps, or Xe epochs */
  const char *save_best;     /* the checkpoint of the best held-out loss */
  const char *labels, *val_data, *val_labels; /* --labels, --val-data, --val-labels */
  const char *cycle_momentum; /* --cycle-momentum BASE:MAX | off (onecycle) */
  int header, no_shuffle, test_fraction_given;
  int drop_last; /* --drop-last: DataLoader's drop_last=True */
  int data_seed_given;
  uint64_t data_seed; /* --data-seed; default: --seed */
  int epochs, quiet, eval_every, patience, plot_log;
  int log_every;        /* --log-every: a record every N optimizer steps too */
  int standardize;      /* 0 none, 1 per feature (the default), 2 per channel */
  int std_given[2];     /* --standardize, --no-standardize given */
  double test_fraction; /* the decimal given: 0.2 of 1000 rows holds out 200, not 201 */
} train_opts;

/* One field of --lr-schedule: a number, or with an `e` suffix a number of
 * epochs (an integer field only). *v the number, *epochs whether it had one. 0,
 * or -1: not a number. */
static int schedule_field(const char *f, double *v, int *epochs) {
  char *end = NULL;
  errno = 0;
  if (!dpt_decimal(f, strlen(f))) return -1; /* strtod takes 0x10 and inf too */
  *v = strtod(f, &end);
  *epochs = end && *end == 'e' && end[1] == '\0';
  return end == f || errno || (*end && !*epochs) || !isfinite(*v) ? -1 : 0;
}

/* A step count of --lr-schedule: a whole number of steps an int holds. */
static int schedule_steps(double v, int *out) {
  if (!(v >= 0.0 && v <= (double)INT_MAX) || v != floor(v)) return -1;
  *out = (int)v;
  return 0;
}

/* A step count of --lr-schedule given in steps, or in epochs with an `e`
 * suffix: the optimizer steps by the end of that many epochs of `calls`
 * training calls each, `accumulate` calls per step (at least 1; 1 while calls
 * is not known). 0, or -1: not such a number. */
static int schedule_count(const char *f, long calls, int accumulate, double *v,
                          int *in_epochs) {
  int ep;
  if (schedule_field(f, v, &ep)) return -1;
  if (!ep) return 0;
  *in_epochs = 1;
  if (*v <= 0) return -1;
  double st = calls > 0 ? floor(*v * (double)calls / accumulate) : 1.0;
  *v = st < 1.0 ? 1.0 : st > INT_MAX ? INT_MAX : st;
  return 0;
}

/* multistep's milestones, "M1,M2,...", each a step count. 0, -1 (not numbers),
 * -2 (a count out of range). */
static int parse_milestones(char *list, long calls, int accumulate, dp_lr_schedule *s,
                            int *in_epochs) {
  for (char *p = list, *q; *p; p = q + 1) {
    double v;
    if ((q = strchr(p, ','))) *q = '\0';
    if (s->n_milestones == DP_LR_MAX_MILESTONES ||
        schedule_count(p, calls, accumulate, &v, in_epochs))
      return -1;
    if (schedule_steps(v, &s->milestones[s->n_milestones++])) return -2;
    if (!q) return 0;
  }
  return -1; /* an empty one */
}

/* onecycle's fields after the word: TOTAL[:PCT[:cos|linear[:DIV[:FINAL_DIV[:three]]]]]
 * (OneCycleLR's order; max_lr is --lr). TOTAL is a step count (in epochs with an e
 * suffix). 0, -1 (not such fields), -2 (TOTAL out of range). */
static int parse_onecycle(char **f, int k, long calls, int accumulate, dp_lr_schedule *s,
                          int *in_epochs) {
  float base = s->base_lr;
  dp_lr_schedule_onecycle(s, base, 0);
  double v;
  if (k < 1 || k > 6 || schedule_count(f[0], calls, accumulate, &v, in_epochs)) return -1;
  if (schedule_steps(v, &s->total_steps)) return -2;
  int ep;
  float *num[] = {&s->pct_start, NULL, &s->div_factor, &s->final_div_factor};
  for (int i = 1; i < k && i < 5; i++) {
    if (i == 2) { /* anneal_strategy */
      if (strcmp(f[i], "cos") && strcmp(f[i], "linear")) return -1;
      s->anneal_linear = strcmp(f[i], "linear") == 0;
    } else if (schedule_field(f[i], &v, &ep) || ep) {
      return -1;
    } else {
      *num[i - 1] = (float)v;
    }
  }
  if (k == 6 && strcmp(f[5], "three")) return -1;
  s->three_phase = k == 6;
  return 0;
}

/* --cycle-momentum BASE:MAX | off onto a onecycle schedule (which starts with
 * PyTorch's 0.85:0.95); refused with any other. 0, or -1 with err. */
static int cycle_momentum_of(const char *arg, dp_lr_schedule *s, char *err, size_t errcap) {
  if (!arg) return 0;
  if (s->kind != DP_LR_ONECYCLE)
    return dpt_fail(err, errcap,
                    "--cycle-momentum goes with --lr-schedule onecycle:... (OneCycleLR's "
                    "cycle_momentum); the other schedules set the rate alone");
  if (strcmp(arg, "off") == 0) {
    s->cycle_momentum = 0;
    return 0;
  }
  char base[64];
  const char *colon = strchr(arg, ':');
  if (!colon || (size_t)(colon - arg) >= sizeof base)
    return dpt_fail(err, errcap,
                    "--cycle-momentum: '%s' is not BASE:MAX (base_momentum and "
                    "max_momentum, e.g. 0.85:0.95) or off",
                    arg);
  snprintf(base, sizeof base, "%.*s", (int)(colon - arg), arg);
  float b, m;
  if (dpt_parse_float(base, 0, 1, "--cycle-momentum BASE", &b, err, errcap) ||
      dpt_parse_float(colon + 1, 0, 1, "--cycle-momentum MAX", &m, err, errcap))
    return -1;
  if (b >= 1.0f || m >= 1.0f) /* 1, or a value that rounds to 1 as a float */
    return dpt_fail(err, errcap, "--cycle-momentum %s: each momentum must be below 1", arg);
  s->cycle_momentum = 1;
  s->base_momentum = b;
  s->max_momentum = m;
  return 0;
}

/* dp train --help's schedule options (usage). */
static void usage_schedules(FILE *f) {
  fputs(
      "  --lr-schedule S       the learning rate per optimizer step, as\n"
      "                        torch.optim.lr_scheduler computes it from --lr:\n"
      "                        constant (default), step:N:GAMMA (StepLR),\n"
      "                        cosine:T_MAX[:ETA_MIN] (CosineAnnealingLR),\n"
      "                        warmup-cosine:W:T_MAX[:ETA_MIN[:START]] (LinearLR for W\n"
      "                        steps from START x lr, default 1/3, then the cosine),\n"
      "                        exponential:GAMMA (ExponentialLR),\n"
      "                        multistep:M1,M2,...:GAMMA (MultiStepLR), warmup:W[:START]\n"
      "                        (LinearLR, then lr),\n"
      "                        "
      "onecycle:TOTAL[:PCT[:cos|linear[:DIV[:FINAL_DIV[:three]]]]]\n"
      "                        (OneCycleLR, max_lr --lr, total_steps TOTAL, then its\n"
      "                        arguments in PyTorch's order; its momentum cycles as\n"
      "                        PyTorch's does: --cycle-momentum). N, T_MAX, W, TOTAL\n"
      "                        and the milestones count optimizer steps, or epochs\n"
      "                        with an e suffix (warmup-cosine:1e:10e,\n"
      "                        multistep:30e,80e:0.1, onecycle:10e; dp train prints\n"
      "                        the steps per epoch)\n"
      "  --cycle-momentum BASE:MAX | off\n"
      "                        onecycle's momentum (SGD's momentum, Adam's beta1),\n"
      "                        from MAX down to BASE while the rate rises, and back:\n"
      "                        OneCycleLR's cycle_momentum, base_momentum and\n"
      "                        max_momentum (default 0.85:0.95, as PyTorch; it\n"
      "                        replaces --momentum or --beta1, and gives plain SGD a\n"
      "                        momentum, as PyTorch's OneCycleLR does); off: the rate\n"
      "                        alone (cycle_momentum=False)\n",
      f);
}

/* --lr-schedule: constant | step:N:GAMMA | cosine:T_MAX[:ETA_MIN] |
 * warmup-cosine:W:T_MAX[:ETA_MIN[:START]] (START: 1/3, LinearLR's default) |
 * exponential:GAMMA | multistep:M1,M2,...:GAMMA | warmup:W[:START] |
 * onecycle:TOTAL[:PCT[:cos|linear[:DIV[:FINAL_DIV[:three]]]]], in optimizer steps;
 * base_lr (onecycle: max_lr) is --lr. N, T_MAX, W and the milestones may be
 * given in epochs with an `e` suffix (2e, 0.5e): schedule_count. With calls 0
 * (before the data is read) such fields are only checked for form
 * (*in_epochs set); the schedule is parsed again once calls is known. */
static int parse_schedule(const char *text, float base_lr, long calls, int accumulate,
                          dp_lr_schedule *s, int *in_epochs, char *err, size_t errcap) {
  *s = (dp_lr_schedule){.kind = DP_LR_CONSTANT,
                        .base_lr = base_lr,
                        .gamma = 1.0f,
                        .start_factor = 1.0f / 3.0f};
  *in_epochs = 0;
  /* 16 milestones of 10 digits and a gamma of 9 fit (an outside check: 128 bytes
   * refused them as malformed) */
  char buf[256], *field[7];
  double v[5] = {0};
  int n = 0, ep[5] = {0};
  if (strlen(text) >= sizeof buf) {
    snprintf(err, errcap, "--lr-schedule: %zu characters; at most %zu", strlen(text),
             sizeof buf - 1);
    return -1;
  }
  snprintf(buf, sizeof buf, "%s", text);
  for (char *p = buf, *q; n < 7; p = q + 1) {
    field[n++] = p;
    if (!(q = strchr(p, ':'))) break;
    *q = '\0';
    if (n == 7) goto bad; /* more fields than any kind takes */
  }
  const char *word = field[0];
  if (strcmp(word, "onecycle") == 0) {
    int r = parse_onecycle(field + 1, n - 1, calls, accumulate, s, in_epochs);
    if (r == -2) goto steps;
    if (r) goto bad;
    goto check;
  }
  if (n > 6) goto bad;
  bool multi = strcmp(word, "multistep") == 0;
  for (int i = 1 + multi; i < n; i++) {
    if (schedule_field(field[i], &v[i - 1], &ep[i - 1])) goto bad;
    if (ep[i - 1] && schedule_count(field[i], calls, accumulate, &v[i - 1], in_epochs))
      goto bad;
  }
  int k = n - 1; /* numbers after the word */
  if (multi && k == 2 && !ep[1]) {
    s->kind = DP_LR_MULTISTEP;
    int r = parse_milestones(field[1], calls, accumulate, s, in_epochs);
    if (r == -2) goto steps;
    if (r) goto bad;
    s->gamma = (float)v[1];
  } else if (strcmp(word, "exponential") == 0 && k == 1 && !ep[0]) {
    s->kind = DP_LR_EXPONENTIAL;
    s->gamma = (float)v[0];
  } else if (strcmp(word, "warmup") == 0 && (k == 1 || k == 2) && !ep[1]) {
    s->kind = DP_LR_WARMUP;
    if (schedule_steps(v[0], &s->warmup)) goto steps;
    if (k == 2) s->start_factor = (float)v[1];
  } else if (strcmp(word, "constant") == 0 && k == 0) {
    /* base_lr throughout */
  } else if (strcmp(word, "step") == 0 && k == 2 && !ep[1]) {
    s->kind = DP_LR_STEP;
    if (schedule_steps(v[0], &s->step_size)) goto steps;
    s->gamma = (float)v[1];
  } else if (strcmp(word, "cosine") == 0 && (k == 1 || k == 2) && !ep[1]) {
    s->kind = DP_LR_COSINE;
    if (schedule_steps(v[0], &s->t_max)) goto steps;
    s->eta_min = (float)v[1];
  } else if (strcmp(word, "warmup-cosine") == 0 && k >= 2 && k <= 4 && !ep[2] && !ep[3]) {
    s->kind = DP_LR_WARMUP_COSINE;
    if (schedule_steps(v[0], &s->warmup) || schedule_steps(v[1], &s->t_max)) goto steps;
    s->eta_min = (float)v[2];
    if (k == 4) s->start_factor = (float)v[3];
  } else {
    goto bad;
  }
check:
  if (*in_epochs && calls <= 0) return 0; /* checked again with the epochs' steps */
  if (dp_lr_schedule_check(s) == DP_OK) return 0;
  snprintf(err, errcap, "--lr-schedule %s: %s", text, dpt_user_msg(dp_last_error()));
  return -1;
steps: /* an outside check (session 23): 99999999999999 was cast to an int */
  snprintf(
      err, errcap,
      "--lr-schedule %s: a step count (N, T_MAX, W, a milestone, TOTAL) is a whole number "
      "from 0 to 2147483647",
      text);
  return -1;
bad:
  snprintf(err, errcap,
           "--lr-schedule: '%s' is not constant, step:N:GAMMA, cosine:T_MAX[:ETA_MIN], "
           "warmup-cosine:W:T_MAX[:ETA_MIN[:START]], exponential:GAMMA, "
           "multistep:M1,M2,...:GAMMA (up to %d milestones), warmup:W[:START] or "
           "onecycle:TOTAL[:PCT[:cos|linear[:DIV[:FINAL_DIV[:three]]]]] (N, T_MAX, W, M, "
           "TOTAL in steps, or in epochs with an e suffix: 2e)",
           text, DP_LR_MAX_MILESTONES);
  return -1;
}

static int on_option(void *user, int code, const char *arg, char *err, size_t errcap) {
  train_opts *o = user;
  switch (code) {
  case OPT_MODEL: o->model = arg; return 0;
  case OPT_DATA: o->data = arg; return 0;
  case OPT_TEXT: o->text = arg; return 0;
  case OPT_TOKENS: o->tokens = arg; return 0;
  case OPT_SAVE_BEST: o->save_best = arg; return 0;
  case OPT_SAVE_EVERY: {
    double v;
    int in_epochs;
    o->save_every = arg;
    if (!schedule_field(arg, &v, &in_epochs) && v <= INT_MAX &&
        (in_epochs ? v > 0 : v >= 1 && v == (int)v))
      return 0;
    return dpt_fail(err, errcap,
                    "--save-every: '%s' is not a number of optimizer steps (200) or of "
                    "epochs (2e, 0.5e)",
                    arg);
  }
  case OPT_LABELS: o->labels = arg; return 0;
  case OPT_VAL_DATA: o->val_data = arg; return 0;
  case OPT_VAL_LABELS: o->val_labels = arg; return 0;
  case OPT_HEADER: o->header = 1; return 0;
  case OPT_NO_SHUFFLE: o->no_shuffle = 1; return 0;
  case OPT_DROP_LAST: o->drop_last = 1; return 0;
  case OPT_DATA_SEED:
    o->data_seed_given = 1;
    return dpt_parse_u64(arg, "--data-seed", &o->data_seed, err, errcap);
  case OPT_PLOT: o->plot = arg; return 0;
  case OPT_SAVE: o->save = arg; return 0;
  case OPT_RESUME: o->resume = arg; return 0;
  case OPT_LR_SCHEDULE: o->schedule = arg; return 0;
  case OPT_CYCLE_MOMENTUM: o->cycle_momentum = arg; return 0;
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
  case OPT_LOG_EVERY:
    return dpt_parse_int(arg, 1, INT_MAX, "--log-every", &o->log_every, err, errcap);
  case OPT_PLOT_LOG: o->plot_log = 1; return 0;
  case OPT_EVAL_EVERY:
    return dpt_parse_int(arg, 1, 1000000, "--eval-every", &o->eval_every, err, errcap);
  case OPT_PATIENCE:
    return dpt_parse_int(arg, 1, 1000000, "--patience", &o->patience, err, errcap);
  case OPT_EPOCHS:
    return dpt_parse_int(arg, 1, 1000000, "--epochs", &o->epochs, err, errcap);
  case OPT_TEST_FRACTION: {
    float f; /* its checks; the value kept is the double of the same text */
    o->test_fraction_given = 1;
    if (dpt_parse_float(arg, 0.0, 0.95, "--test-fraction", &f, err, errcap)) return -1;
    o->test_fraction = strtod(arg, NULL);
    return 0;
  }
  }
  return -1;
}

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: dp train --model M.dpm (--data D | --text FILE | --tokens F.npy)\n"
      "                --batch B [--devices N] [--epochs E]\n"
      "                [--labels L] [--val-data V [--val-labels VL]] [--header]\n"
      "                [--no-shuffle] [--data-seed S]\n"
      "                [--optimizer sgd|momentum|adamw|adam] [--lr LR] [--seed S]\n"
      "                [--split chunk|balanced|memory] [--micro-batch K]\n"
      "                [--test-fraction F] [--eval-every N [--patience P]]\n"
      "                [--log F.jsonl] [--plot loss.svg [--plot-log]] [--save F.ckpt]\n"
      "                [--resume F.ckpt] [--save-every N|Ne] [--save-best F.ckpt]\n"
      "                [--lr-schedule S] [--clip-grad-norm X | --clip-grad-value X]\n"
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
      "standardised on the training share (--standardize).\n"
      "A sequence model (input tokens T, embed V D: examples/tiny_gpt.dpm) trains on\n"
      "a text's bytes (--text) or token ids (--tokens) instead, to predict the next\n"
      "token at every position.\n\n"
      "  --model FILE          model spec (.dpm)\n"
      "  --data FILE           the data, its format told by its first bytes: CSV (a\n"
      "                        first row with a field that is not a number is a\n"
      "                        header, skipped); NumPy .npy, float32/float64/uint8 of\n"
      "                        any shape (N, ...) whose values per row are the\n"
      "                        model's inputs, C order, little-endian; MNIST IDX\n"
      "                        (train-images-idx3-ubyte, gzip'd or not), pixels as\n"
      "                        floats 0..255. .npy and IDX files are mapped, not\n"
      "                        read: a file larger than memory trains\n"
      "  --text FILE           a sequence model's data: the bytes of any file, as ids\n"
      "                        0..255 (embed 256). Windows of T + 1 bytes, one every\n"
      "                        T bytes (a row's T inputs and, at each position, the\n"
      "                        next byte), shuffled by the seed each epoch; the last\n"
      "                        --test-fraction of the windows (the file's tail) are\n"
      "                        held out, their loss printed in nats per byte with\n"
      "                        its perplexity. No standardisation\n"
      "  --tokens FILE.npy     the same on token ids of your own tokenizer: a 1-D .npy\n"
      "                        of int32 or uint16 ids, each below the model's\n"
      "                        vocabulary (embed V); nats per token\n"
      "  --labels FILE         with .npy or IDX data: the labels, .npy int32/int64/\n"
      "                        uint8 (N,) or IDX (train-labels-idx1-ubyte[.gz]); an\n"
      "                        mse model's targets as .npy float32/float64 (N, K)\n"
      "  --header              the CSV's first row is a header (else detected)\n"
      "  --val-data FILE       the held-out set (any format above), instead of a share\n"
      "                        of --data: all of --data trains; --val-labels FILE\n"
      "                        gives its labels when it needs them\n"
      "  --no-shuffle          the rows in file order: every epoch the same, and the\n"
      "                        held-out share the file's last rows\n"
      "  --drop-last           every epoch leaves out its last, short batch (the\n"
      "                        epoch's order's last rows), as PyTorch's DataLoader\n"
      "                        with drop_last=True\n"
      "  --data-seed S         the seed of the held-out split and the epochs' order\n"
      "                        (default: --seed), so that runs of other --seed\n"
      "                        (initialisation, dropout) see the same data order\n"
      "  --epochs E            passes over the training share (default 10)\n"
      "  --test-fraction F     held-out share, 0..0.95 (default 0.2; not with --val-data)\n"
      "  --eval-every N        after every N-th epoch, run the held-out share through\n"
      "                        the model and print its loss (the loss line's, with\n"
      "                        its weight, ignore_index and label_smoothing; a\n"
      "                        next-token model's: the plain cross-entropy, for the\n"
      "                        perplexity) and accuracy (or mse) on the epoch line\n"
      "                        (default 0: only at the end); training is the same bits\n"
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
      "                        to with --resume (after dropping any records of epochs\n"
      "                        after the checkpoint's); checked for writability\n"
      "                        before training starts\n"
      "  --log-every N         with --log: also a record every N optimizer steps,\n"
      "                        {\"epoch\":E,\"step\":S,\"kind\":\"step\",...}: the epoch\n"
      "                        in progress, loss (the mean of the calls since the\n"
      "                        last step record), lr, grad_norm, calls (of the mean)\n"
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
      "                        before training starts. A first SIGINT (Ctrl-C) or\n"
      "                        SIGTERM stops the run after the step at hand: it\n"
      "                        saves FILE (the place in the epoch too), prints the\n"
      "                        command that goes on and exits 130 (SIGINT) or 143\n"
      "                        (SIGTERM); a second signal stops at once, the file as\n"
      "                        it was\n"
      "  --save-every N        also save FILE every N optimizer steps, or every N\n"
      "                        epochs' steps with an e suffix (2e, 0.5e); --resume\n"
      "                        goes on from inside an epoch\n"
      "  --save-best FILE      with --eval-every: save a checkpoint to FILE at every\n"
      "                        new best held-out loss; with --patience, an early stop\n"
      "                        loads it back (the report, the hash and --save are the\n"
      "                        best epoch's) and says so\n");
  usage_schedules(f);
  fprintf(
      f, "  --resume FILE         before training, load a checkpoint of the same model,\n"
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
 * far, the epoch's samples/s so far (the JSONL log's figure at its end: step
 * time only), the time since training started and an estimate of the time
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
    fflush(stdout); /* a pipe or a file (tee, CI, mpirun) sees each epoch as it ends */
  }
}

/* A JSON number: %.9g when finite (every float reads back exactly), else null. */
static void json_number(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.9g", v);
  else
    fputs("null", f);
}

/* Labels a row holds: T for a sequence's windows (one per position), else one. */
static size_t label_width(const dpt_dataset *d) {
  return d->label_width > 1 ? (size_t)d->label_width : 1;
}

/* Held-out accuracy (classification) or mean squared error (regression) in
 * *metric, and the loss the model trains on in *loss: the mean softmax
 * cross-entropy over the rows (over every position of a sequence's rows:
 * nats per token), or the mse again; both computed in double from the
 * outputs. Every rank runs the forwards; the figures are rank 0's. */
/* A counted target's term of the cross-entropy the model trains on (its weight,
 * label smoothing: lib/cpu/softmax.c's dp__softmax_xent_opts, in double) given
 * lse = log sum e^y; plain: -log p_t alone. Its weight joins *wsum. */
static double ce_term(const dp_ce_options *o, bool plain, const float *y, size_t V,
                      int32_t t, double lse, double *wsum) {
  double wt = o->n_weights && !plain ? o->weights[t] : 1.0;
  *wsum += wt;
  double S = plain ? 0.0 : o->label_smoothing, term = (1.0 - S) * wt * (lse - y[t]);
  if (S > 0.0) {
    double sm = 0.0;
    for (size_t j = 0; j < V; j++)
      sm += (o->n_weights ? o->weights[j] : 1.0) * (lse - y[j]);
    term += S / (double)V * sm;
  }
  return term;
}

static int evaluate(dp_ctx *ctx, const dp_plan *plan, const dpt_dataset *d,
                    const dpt_scaler *sc, int batch, int out_w, float *x, float *ymine,
                    float *y, bool plain, double *metric, double *loss) {
  long correct = 0, ignored = 0;
  double se = 0.0, ce = 0.0, el = 0.0; /* el: the element-wise loss's terms */
  double wsum = 0.0; /* the cross-entropy's denominator: the counted targets' weights */
  dp_loss_kind lk = dp_model_loss(dp_plan_model(plan));
  double beta = dp_model_loss_param(dp_plan_model(plan)); /* smooth_l1, huber */
  size_t lw = label_width(d);
  dp_ce_options opt; /* a target equal to ignore_index counts in neither figure */
  dp_model_ce_options(dp_plan_model(plan), &opt);
  dp_bce_options bo; /* bce_with_logits' pos_weight: the training criterion's */
  dp_model_bce_options(dp_plan_model(plan), &bo);
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
        /* a label per position: the position's V logits */
        for (size_t p = 0, V = (size_t)out_w / lw; p < lw; p++, yr += V) {
          int32_t label = d->label[(size_t)(from + r) * lw + p];
          if (opt.has_ignore_index && label == opt.ignore_index) {
            ignored++;
            continue;
          }
          size_t best = 0;
          for (size_t j = 1; j < V; j++)
            if (yr[j] > yr[best]) best = j;
          correct += best == (size_t)label;
          /* -log softmax(y)[label] = logsumexp(y) - y[label], shifted by the max */
          double top = yr[best], sum = 0.0;
          for (size_t j = 0; j < V; j++) sum += exp((double)yr[j] - top);
          ce += ce_term(&opt, plain, yr, V, label, top + log(sum), &wsum);
        }
      } else {
        for (int j = 0; j < out_w; j++) {
          double e = (double)yr[j] - d->y[(size_t)(from + r) * d->n_targets + j];
          double z = fabs(e);
          se += e * e;
          if (lk == DP_LOSS_BCE_LOGITS) { /* lw log(1 + e^-y) + (1 - t) y; right: sign */
            double yv = yr[j], tv = d->y[(size_t)(from + r) * d->n_targets + j];
            double lwv =
                bo.n_pos_weights ? ((double)bo.pos_weights[j] - 1.0) * tv + 1.0 : 1.0;
            el += (1.0 - tv) * yv + lwv * ((yv < 0 ? -yv : 0.0) + log1p(exp(-fabs(yv))));
            correct += (yv > 0) == (tv > 0.5);
            continue;
          }
          el += lk == DP_LOSS_L1          ? z
                : lk == DP_LOSS_SMOOTH_L1 ? (z < beta ? 0.5 * z * z / beta : z - 0.5 * beta)
                : lk == DP_LOSS_HUBER ? (z < beta ? 0.5 * z * z : beta * (z - 0.5 * beta))
                                      : e * e;
        }
      }
    }
  }
  double labels = (double)d->n_rows * (double)lw - (double)ignored;
  *metric = d->label                   ? (double)correct / labels
            : lk == DP_LOSS_BCE_LOGITS ? (double)correct / ((double)d->n_rows * out_w)
                                       : se / ((double)d->n_rows * out_w);
  *loss = d->label ? ce / wsum : el / ((double)d->n_rows * out_w);
  return 0;
}

/* The run's settings as its checkpoints record them ("name=value" words;
 * floats exact in hexadecimal): a resume must use the same, or it would not
 * continue the run. A sequence model's run adds its data's kind, data=text
 * or data=tokens (a CSV run's record has no such word). Returns buf. */
static const char *settings_of(const dp_config *c, const char *schedule, const char *kind,
                               char *buf, size_t cap) {
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
  size_t n = strlen(buf);
  if (kind) snprintf(buf + n, cap - n, " data=%s", kind);
  return buf;
}

/* The kind of data a run trains on: "text" (--text), "tokens" (--tokens), or
 * NULL for CSV rows (--data); in a record's settings, after "data=". */
static const char *data_kind(const train_opts *o) {
  return o->text ? "text" : o->tokens ? "tokens" : NULL;
}

/* The data a checkpoint's run trained on, said against this run's: 0 when it
 * is the same kind, else -1 with what to do in err. */
static int same_kind(const char *saved, const char *kind, char *err, size_t errcap) {
  static const char *const option[][2] = {{"text", "--text (bytes)"},
                                          {"tokens", "--tokens (ids of a .npy)"}};
  const char *k = strstr(saved, " data="), *was = k ? k + 6 : NULL;
  /* the kind is one word: shuffle=0 or data-seed=N may follow it (an outside
   * check: a token run saved with --no-shuffle could not be resumed) */
  size_t wl = was ? strcspn(was, " ") : 0;
#define WAS(w) (wl == strlen(w) && !strncmp(was, (w), wl))
  if (!was == !kind && (!was || WAS(kind))) return 0;
  const char *a = "--data (CSV rows)", *b = a;
  for (int i = 0; i < 2; i++) {
    if (was && WAS(option[i][0])) a = option[i][1];
    if (kind && !strcmp(kind, option[i][0])) b = option[i][1];
  }
#undef WAS
  return dpt_fail(err, errcap,
                  "the checkpoint's run trained on %s, this one on %s; resume it with the "
                  "data it was trained on",
                  a, b);
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
  /* every setting that differs, in one message (an outside check, session 24: one
   * a run, found by retrying) */
  char what[1024] = "";
  size_t at = 0;
  int n_diff = 0;
  while (*a || *b) {
    size_t la = strcspn(a, " "), lb = strcspn(b, " ");
    size_t na = strcspn(a, "= "), nb = strcspn(b, "= ");
    if (la && lb && (na != nb || memcmp(a, b, na))) lb = 0; /* different words */
    char va[64], vb[64];
    int name = -1;
    const char *wd = a;
    /* a word (data-seed, shuffle) one run has: the default in the other */
    if (!la != !lb) {
      wd = la ? a : b;
      size_t n = la ? na : nb, l = la ? la : strcspn(b, " ");
      char v[64];
      snprintf(v, sizeof v, "%.*s", (int)(l > n ? l - n - 1 : 0), wd + n + (l > n));
      snprintf(va, sizeof va, "%s", la ? v : "the default");
      snprintf(vb, sizeof vb, "%s", la ? "the default" : v);
      name = (int)n;
    } else if ((la != lb || memcmp(a, b, la)) && !may_change(a, la, b, lb)) {
      const char *eq = memchr(a, '=', la), *eqb = memchr(b, '=', lb);
      name = eq ? (int)(eq - a) : (int)la;
      /* the values, for people: floats in decimal */
      snprintf(va, sizeof va, "%.*s", (int)(la - (eq ? (size_t)name + 1 : 0)),
               eq ? eq + 1 : a);
      snprintf(vb, sizeof vb, "%.*s", (int)(lb - (eqb ? (size_t)(eqb - b) + 1 : 0)),
               eqb ? eqb + 1 : b);
      shortest_float(va, sizeof va);
      shortest_float(vb, sizeof vb);
    }
    if (name >= 0 && at < sizeof what) {
      int w = snprintf(what + at, sizeof what - at,
                       "%s--%.*s: the checkpoint's run used %s, this one %s",
                       n_diff ? "; " : "", name, wd, va, vb);
      at += w > 0 ? (size_t)w : 0;
      n_diff++;
    }
    a += la + (a[la] == ' ');
    b += lb + (b[lb] == ' ');
  }
  if (!n_diff) return 0;
  snprintf(err, errcap,
           "%s; a resume continues the run only with the same settings: give %s as the "
           "checkpoint's run did",
           what, n_diff == 1 ? "it" : "them");
  return -1;
}

/* Under mpirun, before the first step: every rank's model, data as read and
 * options the same as rank 0's, or the job ends on every rank with rank 0's
 * one message (tools/agree.h). 0, or -1 (said). */
static int agree_ranks(const train_opts *o, const dp_model *model, const dpt_dataset *all,
                       const dpt_dataset *val, const dp_config *cfg) {
  char err[1024], cyc[96];
  snprintf(cyc, sizeof cyc, "cycle-momentum=%.70s",
           o->cycle_momentum ? o->cycle_momentum : "(default)");
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
                         .save = o->save != NULL,
                         .save_best = o->save_best != NULL,
                         .save_every = o->save_every,
                         .test_fraction = (float)o->test_fraction,
                         .extra = cyc};
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
  /* a sequence model's data: the ids (bytes) in its file; views = 1: train
   * and test are views of all's windows (its head and tail) */
  size_t n_ids;
  int views;
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
  /* --log-every: the losses of the calls since the last step record */
  double win_sum;
  long win_n;
  unsigned long long win_step; /* the last step record's step (a skipped step repeats it) */
  /* --patience: the best held-out loss, its epoch, evaluations since */
  double best;
  int best_ep, since_best, stopped;
  /* --save-best has written the best's checkpoint; an early stop loaded it */
  int best_saved, best_restored;
  /* a run resumed inside an epoch: the training calls of epoch0 done */
  int pos0;
  /* the --resume checkpoint's record names the run's settings (--lr among them) */
  int resume_settings;
  long every; /* --save-every, in optimizer steps (0: none) */
  /* a --save-every checkpoint at an epoch's end: its step, whose line waits for
   * the epoch's (0: none waits) */
  unsigned long long every_said;
  /* a stop by signal: the signal, then the epochs done and the calls done in
   * the next one, as the checkpoint records them */
  int stop_sig, stop_ep, stop_pos;
  int argc;
  char **argv;
} train_run;

/* The run's schedule cycles the momentum (onecycle with cycle_momentum). */
static bool cycles_momentum(const train_run *t) {
  return t->o.schedule && t->sched.kind == DP_LR_ONECYCLE && t->sched.cycle_momentum;
}

/* The run's settings (settings_of), and the data order's when not the
 * default: data-seed=N when --data-seed differs from --seed, shuffle=0 with
 * --no-shuffle, drop-last=1 and clip-grad-value=X when given (so a run without
 * them records what earlier versions did, and a resume continues the order it
 * had). Returns buf. */
static const char *run_settings(const train_run *t, char *buf, size_t cap) {
  settings_of(&t->cfg, t->o.schedule, data_kind(&t->o), buf, cap);
  size_t at = strlen(buf);
  if (t->o.data_seed != t->cfg.seed && at < cap)
    at += (size_t)snprintf(buf + at, cap - at, " data-seed=%llu",
                           (unsigned long long)t->o.data_seed);
  if (t->o.no_shuffle && at < cap) at += (size_t)snprintf(buf + at, cap - at, " shuffle=0");
  if (t->o.drop_last && at < cap)
    at += (size_t)snprintf(buf + at, cap - at, " drop-last=1");
  if (t->cfg.clip_grad_value > 0 && at < cap) /* as drop-last: only when set */
    at += (size_t)snprintf(buf + at, cap - at, " clip-grad-value=%a",
                           (double)t->cfg.clip_grad_value);
  if (t->cfg.amsgrad && at < cap) /* the same */
    at += (size_t)snprintf(buf + at, cap - at, " amsgrad=1");
  if (cycles_momentum(t) && at < cap) /* the same */
    snprintf(buf + at, cap - at, " cycle-momentum=%a:%a", (double)t->sched.base_momentum,
             (double)t->sched.max_momentum);
  return buf;
}

/* The training rows an epoch steps through: all, or with --drop-last its whole
 * batches' (the rest of the epoch's order is left out). */
static int epoch_rows(const train_run *t) {
  int n = t->train.n_rows, B = t->cfg.batch;
  return t->o.drop_last && B > 0 ? n / B * B : n;
}

/* The training calls (batches) of an epoch. */
static long epoch_calls(const train_run *t) {
  return ((long)epoch_rows(t) + t->cfg.batch - 1) / t->cfg.batch;
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
      {"cycle-momentum", required_argument, NULL, OPT_CYCLE_MOMENTUM},
      {"quiet", no_argument, NULL, OPT_QUIET},
      {"no-standardize", no_argument, NULL, OPT_NO_STANDARDIZE},
      {"standardize", required_argument, NULL, OPT_STANDARDIZE},
      {"labels", required_argument, NULL, OPT_LABELS},
      {"val-data", required_argument, NULL, OPT_VAL_DATA},
      {"val-labels", required_argument, NULL, OPT_VAL_LABELS},
      {"header", no_argument, NULL, OPT_HEADER},
      {"no-shuffle", no_argument, NULL, OPT_NO_SHUFFLE},
      {"drop-last", no_argument, NULL, OPT_DROP_LAST},
      {"data-seed", required_argument, NULL, OPT_DATA_SEED},
      {"eval-every", required_argument, NULL, OPT_EVAL_EVERY},
      {"log", required_argument, NULL, OPT_LOG},
      {"log-every", required_argument, NULL, OPT_LOG_EVERY},
      {"plot-log", no_argument, NULL, OPT_PLOT_LOG},
      {"patience", required_argument, NULL, OPT_PATIENCE},
      {"text", required_argument, NULL, OPT_TEXT},
      {"tokens", required_argument, NULL, OPT_TOKENS},
      {"save-every", required_argument, NULL, OPT_SAVE_EVERY},
      {"save-best", required_argument, NULL, OPT_SAVE_BEST},
      {0, 0, 0, 0}};
  train_opts *o = &t->o;
  dpt_common common;
  char *err = t->err;
  size_t errcap = sizeof t->err;
  int r = dpt_parse_command(argc, argv, extra, on_option, o, usage, &t->cfg, &common, err,
                            errcap);
  if (r == DPT_ARGS_HELP) return DPT_EXIT_OK;
  int n_data = !!o->data + !!o->text + !!o->tokens;
  if (r == DPT_ARGS_OK && (!o->model || !n_data || !dpt_given(&common, DPT_OPT_BATCH)))
    r = dpt_fail(err, errcap,
                 "--model, --batch and the data (--data D.csv, or --text FILE or --tokens "
                 "F.npy for a sequence model) are required");
  if (r == DPT_ARGS_OK && n_data > 1)
    r = dpt_fail(err, errcap,
                 "%s and %s: give one data file (--data for CSV rows, --text for the bytes "
                 "of a text, --tokens for a .npy of token ids)",
                 o->data ? "--data" : "--text", o->tokens ? "--tokens" : "--text");
  if (r == DPT_ARGS_OK && t->cfg.inference)
    r = dpt_fail(err, errcap, "--inference makes no sense for training");
  if (r == DPT_ARGS_OK && dpt_job_devices(&t->cfg, &common, err, errcap))
    r = DPT_ARGS_ERROR;
  if (r == DPT_ARGS_OK && (o->text || o->tokens) && o->std_given[0] && o->standardize)
    r = dpt_fail(
        err, errcap,
        "--standardize %s is for --data features; token ids are never standardised",
        o->standardize == 1 ? "feature" : "channel");
  /* --data's companions mean nothing beside a token stream (its held-out
   * share is its tail): refused, not ignored (an outside check: --val-data
   * was never read and the held-out figures were NaN) */
  if (r == DPT_ARGS_OK && (o->text || o->tokens) &&
      (o->val_data || o->val_labels || o->labels || o->header))
    r = dpt_fail(err, errcap,
                 "%s goes with --data; %s trains on its windows and holds out its tail "
                 "(--test-fraction F)",
                 o->val_data     ? "--val-data"
                 : o->val_labels ? "--val-labels"
                 : o->labels     ? "--labels"
                                 : "--header",
                 o->text ? "--text" : "--tokens");
  if (r == DPT_ARGS_OK && dpt_given(&common, DPT_OPT_RANKS) &&
      t->cfg.ranks != dpt_world_size())
    r = dpt_fail(err, errcap,
                 "--ranks %d: this job has %d process%s; start one of %d processes with "
                 "mpirun -np %d dp train ... (dp plan --ranks %d plans it without MPI)",
                 t->cfg.ranks, dpt_world_size(), dpt_world_size() > 1 ? "es" : "",
                 t->cfg.ranks, t->cfg.ranks, t->cfg.ranks);
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
  if (r == DPT_ARGS_OK && o->val_data) o->test_fraction = 0.0;
  if (r == DPT_ARGS_OK && o->eval_every && o->test_fraction == 0.0f && !o->val_data)
    r = dpt_fail(
        err, errcap,
        "--eval-every needs a held-out share (--test-fraction > 0, or --val-data)");
  if (r == DPT_ARGS_OK && !o->data_seed_given) o->data_seed = t->cfg.seed;
  if (r == DPT_ARGS_OK && o->plot_log && !o->plot)
    r = dpt_fail(err, errcap, "--plot-log needs --plot");
  if (r == DPT_ARGS_OK && o->log_every && !o->log)
    r = dpt_fail(err, errcap, "--log-every needs --log FILE.jsonl (the file it writes to)");
  if (r == DPT_ARGS_OK && o->save_every && !o->save)
    r = dpt_fail(err, errcap, "--save-every needs --save FILE (the checkpoint it writes)");
  if (r == DPT_ARGS_OK && o->save_best && !o->eval_every)
    r = dpt_fail(err, errcap,
                 "--save-best needs --eval-every (it keeps the checkpoint of the best "
                 "held-out loss)");
  int in_epochs = 0;
  if (r == DPT_ARGS_OK && o->schedule &&
      parse_schedule(o->schedule, t->cfg.lr, 0, 1, &t->sched, &in_epochs, err, errcap))
    r = DPT_ARGS_ERROR;
  if (r == DPT_ARGS_OK && o->cycle_momentum && !o->schedule)
    r = dpt_fail(err, errcap, "--cycle-momentum goes with --lr-schedule onecycle:...");
  if (r == DPT_ARGS_OK && cycle_momentum_of(o->cycle_momentum, &t->sched, err, errcap))
    r = DPT_ARGS_ERROR;
  /* OneCycleLR sets the momentum to max_momentum when it is made, SGD's (a
   * momentum SGD from then on, even one made without) or Adam's beta1 */
  if (r == DPT_ARGS_OK && cycles_momentum(t)) {
    if (t->cfg.optimizer == DP_OPT_ADAM || t->cfg.optimizer == DP_OPT_ADAMW)
      t->cfg.beta1 = t->sched.max_momentum;
    else
      t->cfg.momentum = t->sched.max_momentum;
  }
  /* an outside check (session 23): a wrong one was refused after the data loaded */
  if (r == DPT_ARGS_OK && dpt_check_backend_options(&t->cfg, err, errcap))
    r = DPT_ARGS_ERROR;
  if (r != DPT_ARGS_OK) {
    return dpt_usage_error("train", err, "(see dp train --help)");
  }
  return -1;
}

/* The data file, named as its option names it. */
static dpt_file_role data_file(const train_opts *o) {
  return o->text     ? (dpt_file_role){o->text, "text"}
         : o->tokens ? (dpt_file_role){o->tokens, "tokens"}
                     : (dpt_file_role){o->data, "data"};
}

/* The output files first: a path that cannot be written fails now, not after
 * the whole run. 0, or -1 (said). */
static int check_files(train_run *t) {
  const train_opts *o = &t->o;
  char *err = t->err;
  /* no output may be an input (--save may be --resume: it is written after
   * the resume read it, whole, by a rename) */
  dpt_file_role outs[] = {{o->save, "checkpoint"},
                          {o->save_best, "best checkpoint"},
                          {o->plot, "plot"},
                          {o->log, "log"}},
                ins[] = {{o->model, "model"},
                         data_file(o),
                         {o->labels, "labels"},
                         {o->val_data, "validation data"},
                         {o->val_labels, "validation labels"},
                         {o->resume, "checkpoint"}};
  if (t->writes &&
      (dpt_check_distinct(outs, 4, ins, 5, err, sizeof t->err) ||
       dpt_check_distinct(outs + 2, 2, ins + 5, 1, err, sizeof t->err) ||
       (o->save && dpt_check_writable(o->save, "checkpoint", 1, err, sizeof t->err)) ||
       (o->save_best &&
        dpt_check_writable(o->save_best, "best checkpoint", 1, err, sizeof t->err)) ||
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

/* The ids of --text (bytes) or --tokens (a .npy), checked against the
 * model's vocabulary V and context T. 0, or -1 (said). */
static int load_ids(train_run *t, int T, int V, dpt_tokens *tok) {
  const train_opts *o = &t->o;
  char *err = t->err;
  const char *unit = o->text ? "bytes" : "ids";
  dpt_file_role f = data_file(o);
  if (o->text ? dpt_text_load(o->text, tok, err, sizeof t->err)
              : dpt_npy_load_tokens(o->tokens, V, tok, err, sizeof t->err)) {
    fprintf(stderr, "dp train: %s\n", err);
    return -1;
  }
  for (size_t i = 0; o->text && i < tok->n; i++)
    if (dpt_token(tok, i) >= V) {
      fprintf(stderr,
              "dp train: text '%s': byte %zu is %d, outside the model's vocabulary 0..%d "
              "(embed %d); a model of bytes has embed 256\n",
              o->text, i, (int)dpt_token(tok, i), V - 1, V);
      return -1;
    }
  if (tok->n < (size_t)T + 1) {
    char has[64] = "is empty";
    if (tok->n) snprintf(has, sizeof has, "has %zu %s", tok->n, unit);
    fprintf(stderr,
            "dp train: %s '%s' %s; the model's context (input tokens %d) needs windows of "
            "%d %s (the inputs and the next one): give a longer %s\n",
            f.what, f.path, has, T, T + 1, unit, o->text ? "text" : "token file");
    return -1;
  }
  t->n_ids = tok->n;
  return 0;
}

/* A sequence model's data: windows of T + 1 ids (a row's T inputs and T
 * labels, the next id at each position), one every T ids; the last
 * --test-fraction of the windows are held out (the file's tail), the rest
 * train in an order shuffled by the seed each epoch. Token ids are not
 * features: no standardisation. 0, or -1 (said). */
static int load_sequence(train_run *t, int T, int V) {
  train_opts *o = &t->o;
  dpt_file_role f = data_file(o);
  const char *unit = o->text ? "bytes" : "ids";
  int V_out = t->out_w / T;
  if (dp_model_loss(t->model) != DP_LOSS_SOFTMAX_CE || V_out < V) {
    fprintf(stderr,
            "dp train: %s predicts the next token: it needs %d logits per position (its "
            "vocabulary, embed %d) and `loss softmax_cross_entropy`; it has %d per "
            "position and %s%s\n",
            o->model, V, V, V_out,
            dp_model_loss(t->model) == DP_LOSS_SOFTMAX_CE ? "that loss" : "loss ",
            dp_model_loss(t->model) == DP_LOSS_SOFTMAX_CE
                ? ""
                : dp_loss_name(dp_model_loss(t->model)));
    return -1;
  }
  dpt_tokens tok;
  int bad = load_ids(t, T, V, &tok) ||
            dpt_token_windows(&tok, 0, tok.n, T, &t->all, t->err, sizeof t->err);
  dpt_tokens_free(&tok);
  if (bad) {
    if (t->n_ids) fprintf(stderr, "dp train: %s\n", t->err);
    return -1;
  }
  int rows = t->all.n_rows, B = t->cfg.batch;
  double want = ceil(o->test_fraction * (double)rows - 1e-9);
  int n_test = want < 0 ? 0 : (int)want, n_train = rows - n_test;
  if (n_train < B) {
    fprintf(stderr,
            "dp train: %s '%s' gives %d windows of %d %s: %d to train on and %d held out "
            "(--test-fraction %g); --batch %d needs %d to train on: give a longer %s, or "
            "a smaller --batch or --test-fraction\n",
            f.what, f.path, rows, T + 1, unit, n_train, n_test, (double)o->test_fraction, B,
            B, o->text ? "text" : "token file");
    return -1;
  }
  o->standardize = 0;
  if (agree_ranks(o, t->model, &t->all, &t->test, &t->cfg)) return -1;
  /* the head of the windows trains, the tail is held out (file order) */
  t->views = 1;
  if (dpt_dataset_split_as(&t->all, o->test_fraction, 0, 0, &t->train, &t->test, t->err,
                           sizeof t->err)) {
    fprintf(stderr, "dp train: %s\n", t->err);
    return -1;
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
    dpt_width_mismatch(t->err, sizeof t->err, data, o->model, d, t->in_w, !labels);
    fprintf(stderr, "dp train: %s\n", t->err);
    return -1;
  }
  int r = dpt_first_label_past(d, t->out_w);
  if (r < 0) return 0;
  fprintf(stderr,
          "dp train: %s: row %d has label %d; the model has %d outputs (labels 0 to %d)\n",
          data, r + 1, (int)d->label[r], t->out_w, t->out_w - 1);
  return -1;
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
  int V = 0, T = dpt_model_sequence(t->model, &V);
  if (T && o->data) {
    fprintf(stderr,
            "dp train: %s is a sequence model (input tokens %d): train it on a text "
            "(--text FILE, its bytes) or token ids (--tokens F.npy), not on --data\n",
            o->model, T);
    return -1;
  }
  if (!T && !o->data) {
    fprintf(stderr,
            "dp train: %s: %s is not a sequence model; --text and --tokens train one whose "
            "spec starts `input tokens T` and `embed V D` (examples/tiny_gpt.dpm). For CSV "
            "rows: --data\n",
            o->text ? "--text" : "--tokens", o->model);
    return -1;
  }
  if (T) return load_sequence(t, T, V);
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
  if (t->train.n_rows < t->cfg.batch) { /* as --text: the plan would be all unused rows */
    fprintf(stderr,
            "dp train: --batch %d is more than the %d rows %s trains on (%d held out): "
            "give --batch %d or less\n",
            t->cfg.batch, t->train.n_rows, o->data, o->val_data ? 0 : t->test.n_rows,
            t->train.n_rows);
    return -1;
  }
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
  /* stopped inside an epoch: its calls done (none left when the data shrank) */
  t->pos0 = app_n ? dpt_run_position(app, app_n) : 0;
  t->resume_settings = saved != NULL;
  free(app);
  /* the checkpoint carries the run's settings: the same, or no resume */
  int differ =
      saved && (same_kind(saved, data_kind(o), err, sizeof t->err) ||
                same_settings(saved, run_settings(t, now, sizeof now), err, sizeof t->err));
  if (differ) {
    free(saved);
    fprintf(stderr, "dp train: cannot resume from '%s': %s\n", o->resume, err);
    return -1;
  }
  /* its settings (batch included) and its own data: a position past its epoch
   * is not a record of a run */
  if (t->pos0 < 0 || (saved && t->pos0 && rows == t->train.n_rows &&
                      (long)t->pos0 * t->cfg.batch >= rows)) {
    free(saved);
    fprintf(stderr,
            "dp train: cannot resume from '%s': its run record stopped at batch %d of an "
            "epoch of %d rows in batches of %d (inconsistent)\n",
            o->resume, t->pos0, rows, t->cfg.batch);
    return -1;
  }
  free(saved);
  if (t->pos0 && (long)t->pos0 * t->cfg.batch >= epoch_rows(t)) t->pos0 = 0;
  return check_resumed(t, rows, app_n != 0);
}

/* dp_ckpt_load refused the --resume checkpoint: said in the tool's terms (an
 * outside check, session 24: an imported checkpoint's optimizer was "the
 * context's", the path twice, no fix): the option and its value to give where
 * the checkpoint's optimizer or seed is not this run's, else the library's
 * reason without the path it starts with. */
static void resume_failed(train_run *t) {
  const char *path = t->o.resume, *why = dpt_user_msg(dp_ctx_error(t->ctx));
  size_t n = strlen(path);
  if (!strncmp(why, path, n) && !strncmp(why + n, ": ", 2)) why += n + 2;
  char fix[256] = "";
  dp_ckpt_summary sum;
  if (dp_ckpt_info(path, NULL, &sum) == DP_OK && !sum.inference) {
    if (sum.optimizer != t->cfg.optimizer)
      snprintf(fix, sizeof fix,
               "--optimizer: the checkpoint holds %s's state, this run uses %s: give "
               "--optimizer %s",
               dp_optimizer_name(sum.optimizer), dp_optimizer_name(t->cfg.optimizer),
               dp_optimizer_name(sum.optimizer));
    else if (sum.seed != t->cfg.seed)
      snprintf(fix, sizeof fix,
               "--seed: the checkpoint's run used %llu, this one %llu: give --seed %llu",
               (unsigned long long)sum.seed, (unsigned long long)t->cfg.seed,
               (unsigned long long)sum.seed);
  }
  fprintf(stderr, "dp train: cannot resume from '%s': %s\n", path, fix[0] ? fix : why);
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
  /* every rank plans alike: rank 0 says why (a rank that failed alone says it
   * itself), and every rank leaves by itself (an outside check: each rank said
   * it, then mpirun aborted the job) */
  int bad = dp_plan_create(t->model, &t->cfg, &t->plan) != DP_OK;
  int any = dpt_world_max_int(bad), zero = dpt_world_bcast_int(bad);
  if (any) {
    if (bad && (dpt_world_rank() == 0 || !zero))
      fprintf(stderr, "dp train: %s\n", dpt_user_msg(dp_last_error()));
    dpt_world_failed_together();
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
    resume_failed(t);
    return -1;
  }
  /* The load restored the rate in effect at the save. A record with settings has
   * had its --lr compared; one without (dp import, a program's dp_ckpt_save) has
   * not, and without --lr-schedule its rate would silently replace --lr (an
   * outside check: dp import's default 0.01 trained a run that said lr 0.003). */
  if (o->resume && !t->resume_settings && !o->schedule && dp_ctx_lr(t->ctx) != t->cfg.lr) {
    char saved[32], now[32];
    snprintf(saved, sizeof saved, "%a", (double)dp_ctx_lr(t->ctx));
    snprintf(now, sizeof now, "%a", (double)t->cfg.lr);
    shortest_float(saved, sizeof saved);
    shortest_float(now, sizeof now);
    /* every rank decides alike (agreed --lr, rank 0's checkpoint): rank 0 says
     * it and each leaves by itself */
    if (dpt_world_rank() == 0)
      fprintf(stderr,
              "dp train: cannot resume from '%s': --lr: the checkpoint's rate is %s (the "
              "--lr of dp import, or of the program that saved it), this run's %s: give "
              "--lr %s, or write the checkpoint again with --lr %s\n",
              o->resume, saved, now, saved, now);
    dpt_world_failed_together();
    return -1;
  }
  t->pc = dp_plan_config(t->plan);
  int B = t->batch = t->pc->batch;
  t->tsz = t->all.label ? 4 * (int)label_width(&t->all) : t->out_w * 4;
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

/* Whether the n bytes at s (a last line without its newline) are a record,
 * {"epoch":N,"step":..., cut short anywhere by a write that failed (a full
 * disk, a file-size limit) or a killed run. */
static bool record_start(const char *s, size_t n) {
  static const char head[] = "{\"epoch\":", step[] = ",\"step\":";
  size_t i = 0, d;
  for (; i < n && head[i]; i++)
    if (s[i] != head[i]) return false;
  for (d = i; i < n && isdigit((unsigned char)s[i]);) i++;
  if (i == n) return true;
  if (i == d) return false;
  for (size_t j = 0; i < n && step[j]; i++, j++)
    if (s[i] != step[j]) return false;
  return true;
}

/* --resume with --log: the log's records of epochs after `epochs` (written by a run
 * that went on past the checkpoint and then died, or by an earlier resume of it) are
 * dropped, so that the resumed run's records follow the checkpoint's without an epoch
 * twice. The kept lines are written whole to a new file renamed over the log. 0 or -1
 * (said in err). A missing log is fine. */
static int trim_log(const char *path, int epochs, unsigned long long step, char *err,
                    size_t errcap) {
  if (access(path, F_OK) != 0) return 0;
  int fd = dpt_open_regular(path, "log", err, errcap);
  if (fd < 0) return -1;
  FILE *in = fdopen(fd, "r");
  if (!in) {
    close(fd);
    return dpt_fail(err, errcap, "cannot read log '%s': out of memory", path);
  }
  char *line = NULL;
  size_t cap = 0, kept = 0, dropped = 0;
  char *text = NULL;
  size_t tn = 0;
  FILE *out = open_memstream(&text, &tn);
  long lineno = 0, foreign = 0;
  for (ssize_t n; out && !foreign && (n = getline(&line, &cap, in)) > 0;) {
    int ep = 0;
    lineno++;
    /* A last record cut short, wherever the cut fell, is dropped (an outside
     * check of files: a full disk's cut at `{"e` made the log "not this run's
     * log"). A record's epoch is its first field: {"epoch":N,"step":... A line of
     * any other form is not this tool's log (--log naming the data or the model
     * by mistake): refused before a byte is appended (an outside check, session
     * 23). */
    if (line[n - 1] != '\n' && record_start(line, (size_t)n)) {
      dropped++;
      continue;
    }
    int cnt = 0, kind = 0;
    unsigned long long at = 0;
    if (sscanf(line, "{\"epoch\":%d,\"step\":%n", &ep, &cnt) < 1 || !cnt) {
      foreign = lineno;
      continue;
    }
    /* --log-every's records by their step: a resume inside an epoch keeps
     * those of its first part */
    bool by_step = sscanf(line + cnt, "%llu,\"kind\":\"step\"%n", &at, &kind) == 1 && kind;
    if ((by_step ? at > step : ep > epochs) || line[n - 1] != '\n') {
      dropped++;
      continue;
    }
    fwrite(line, 1, (size_t)n, out);
    kept++;
  }
  free(line);
  int bad = ferror(in) || !out;
  fclose(in);
  if (out) fclose(out);
  if (foreign) {
    free(text);
    return dpt_fail(err, errcap,
                    "--log %s: line %ld is not a dp train log record ({\"epoch\":N,"
                    "\"step\":...}), so the file is not this run's log: give the log the "
                    "checkpoint's run wrote, or a new file",
                    path, foreign);
  }
  if (bad || !dropped) {
    free(text);
    return bad ? dpt_fail(err, errcap, "cannot read log '%s'", path) : 0;
  }
  dp_file *f = NULL;
  dp_status st = dp_file_create(path, "log", &f);
  if (st == DP_OK) {
    fwrite(text, 1, tn, dp_file_stream(f));
    st = dp_file_commit(f);
  }
  free(text);
  if (st != DP_OK) return dpt_fail(err, errcap, "%s", dpt_user_msg(dp_last_error()));
  printf("log %s: %zu record%s after the checkpoint's epoch %d (step %llu) dropped (%zu "
         "kept)\n",
         path, dropped, dropped == 1 ? "" : "s", epochs, step, kept);
  return 0;
}

/* Whether a batch of R rows (0: none) can run on the plan's cut: said, -1; else
 * 0. The library's own check (dp_plan_check_rows): a batchnorm refuses a
 * micro-batch (sync: a batch) of one value per channel. */
static int check_rows(train_run *t, int R, const char *which) {
  if (!R || dp_plan_check_rows(t->plan, R) == DP_OK) return 0;
  bool sync = t->pc->batchnorm == DP_BN_SYNC; /* it refuses a batch of one row alone */
  fprintf(stderr,
          "dp train: --batch %d: %s has %d of the %d training rows, and %s; give a "
          "--batch%s that leaves no single row%s\n",
          t->batch, which, R, t->train.n_rows, dpt_user_msg(dp_last_error()),
          t->pc->micro_batch > 0 && !sync ? " or --micro-batch" : "",
          sync ? "" : ", or --batchnorm sync");
  return -1;
}

/* Every epoch ends in the same short batch: one a batchnorm cannot take is said
 * before any training (an outside check: --batch 8 on 2 devices over 1797 rows
 * trained an epoch, then failed at its last step). 0, or -1 (said). */
static int check_last_batch(train_run *t) {
  int B = t->batch, n = t->train.n_rows;
  return check_rows(t, n < B ? 0 : B, "every full batch") ||
                 check_rows(t, t->o.drop_last ? 0 : n % B, "every epoch's last batch")
             ? -1
             : 0;
}

/* OneCycleLR as a PyTorch script would make it, and what its momentum drives. */
static void print_onecycle(const train_run *t) {
  const dp_lr_schedule *s = &t->sched;
  char m[96] = "cycle_momentum=False";
  if (s->cycle_momentum)
    snprintf(m, sizeof m, "cycle_momentum=True, base_momentum=%g, max_momentum=%g",
             (double)s->base_momentum, (double)s->max_momentum);
  printf("lr schedule: OneCycleLR(max_lr=%g, total_steps=%d, pct_start=%g, "
         "anneal_strategy='%s', div_factor=%g, final_div_factor=%g, three_phase=%s, %s)",
         (double)s->base_lr, s->total_steps, (double)s->pct_start,
         s->anneal_linear ? "linear" : "cos", (double)s->div_factor,
         (double)s->final_div_factor, s->three_phase ? "True" : "False", m);
  bool adam = t->pc->optimizer == DP_OPT_ADAM || t->pc->optimizer == DP_OPT_ADAMW;
  if (s->cycle_momentum)
    printf(": %s goes from %g down to %g and back up as the rate rises and falls\n",
           adam ? "Adam's beta1" : "SGD's momentum", (double)s->max_momentum,
           (double)s->base_momentum);
  else
    printf(": the learning rate only, momentum and betas stay\n");
}

/* What is about to run (unless --quiet), then the log opened: a resumed run
 * continues its file. 0, or -1 (said). */
static int start_run(train_run *t) {
  const train_opts *o = &t->o;
  /* training calls per epoch, and the optimizer steps they make (accumulation) */
  long calls = epoch_calls(t);
  int K = t->pc->accumulate > 1 ? t->pc->accumulate : 1, in_epochs = 0;
  if (o->schedule &&
      (parse_schedule(o->schedule, t->sched.base_lr, calls, K, &t->sched, &in_epochs,
                      t->err, sizeof t->err) ||
       cycle_momentum_of(o->cycle_momentum, &t->sched, t->err, sizeof t->err))) {
    fprintf(stderr, "dp train: %s\n", t->err);
    return -1;
  }
  /* OneCycleLR raises past its total_steps: said before any training (a resumed
   * run goes on from the checkpoint's step) */
  long run_calls = calls * o->epochs - t->pos0;
  long last = (long)dp_ctx_step(t->ctx) + run_calls / K;
  if (o->schedule && t->sched.kind == DP_LR_ONECYCLE && last > t->sched.total_steps) {
    fprintf(stderr,
            "dp train: --lr-schedule %s: the run ends at optimizer step %ld (epoch %d), "
            "past the schedule's %d steps (PyTorch's OneCycleLR raises there): give a "
            "TOTAL of at least %ld, or fewer --epochs\n",
            o->schedule, last, t->epoch0 + o->epochs, t->sched.total_steps, last);
    return -1;
  }
  /* A checkpoint holds no partial sums (dp_ckpt_save refuses one inside an
   * accumulation): a save at the run's end, or at an epoch's end (--save-best,
   * --patience's stop), must fall between optimizer steps. Said before any
   * training, not after it. */
  int at_epochs = o->save_best || (o->save && o->patience);
  if (K > 1 && (o->save || o->save_best) && at_epochs && calls % K) {
    fprintf(stderr,
            "dp train: --accumulate %d: an epoch's %ld training calls end inside an "
            "optimizer step, and a checkpoint holds no partial sums, so %s could not save "
            "at an epoch's end: give a --batch that makes the batches per epoch a "
            "multiple of %d\n",
            K, calls, o->save_best ? "--save-best" : "--save (with --patience)", K);
    return -1;
  }
  /* the calls a given --epochs E makes: E x calls, less a resumed run's done ones */
  char e_calls[48];
  if (t->pos0)
    snprintf(e_calls, sizeof e_calls, "E x %ld - %d", calls, t->pos0);
  else
    snprintf(e_calls, sizeof e_calls, "E x %ld", calls);
  if (K > 1 && o->save && run_calls % K) {
    fprintf(stderr,
            "dp train: --accumulate %d: this run's %ld training calls (%ld per epoch) end "
            "inside an optimizer step, and a checkpoint holds no partial sums, so --save "
            "could not save at the end: give --epochs E with %s a multiple of %d, or "
            "a --batch that makes the batches per epoch a multiple of %d\n",
            K, run_calls, calls, e_calls, K, K);
    return -1;
  }
  /* an outside check (session 23): --accumulate 1024 on 69 calls trained without a
   * word and changed nothing */
  if (K > 1 && run_calls > 0 && run_calls < K) {
    fprintf(stderr,
            "dp train: --accumulate %d: this run's %ld training calls (%ld per epoch) are "
            "fewer than one optimizer step's %d, so the model would not change: give more "
            "--epochs, a smaller --batch or a smaller --accumulate\n",
            K, run_calls, calls, K);
    return -1;
  }
  if (K > 1 && run_calls % K && dpt_world_rank() == 0) { /* said once, by rank 0 */
    char last[48] = "last training call ends";
    if (run_calls % K > 1)
      snprintf(last, sizeof last, "last %ld training calls end", run_calls % K);
    fprintf(stderr,
            "dp train: warning: --accumulate %d: this run's %s inside an optimizer step, "
            "whose gradients are not applied (give --epochs E with %s a multiple of %d "
            "to use every batch)\n",
            K, last, e_calls, K);
  }
  if (o->save_every) { /* checked for form when parsed */
    double v;
    int ep;
    schedule_field(o->save_every, &v, &ep);
    double st = ep ? floor(v * (double)calls / K) : v;
    t->every = st < 1.0 ? 1 : st > INT_MAX ? INT_MAX : (long)st;
  }
  if (!o->quiet && t->views)
    printf("dp train: %s on %s: %zu %s, %d training / %d held-out windows (the tail) of "
           "%d + 1, a window every %d\n",
           o->model, data_file(o).path, t->n_ids, o->text ? "bytes" : "token ids",
           t->train.n_rows, t->test.n_rows, t->in_w, t->in_w);
  else if (!o->quiet)
    printf("dp train: %s on %s: %d train / %d held-out rows, %d features, %s\n", o->model,
           o->data, t->train.n_rows, t->test.n_rows, t->all.n_features,
           t->all.label                                    ? "classification"
           : dp_model_loss(t->model) == DP_LOSS_BCE_LOGITS ? "multi-label (bce_with_logits)"
                                                           : "regression");
  if (!o->quiet) {
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
      printf("steps per epoch: %ld (batches of up to %d of %d %s%s)\n", calls, t->batch,
             t->train.n_rows, t->views ? "windows" : "rows",
             epoch_rows(t) < t->train.n_rows ? "; --drop-last leaves the last ones out"
                                             : "");
    if (o->schedule && t->sched.kind == DP_LR_ONECYCLE) print_onecycle(t);
    if (o->resume && t->pos0)
      printf("resumed from %s at step %llu (epoch %d, after %d of its batches)\n",
             o->resume, (unsigned long long)dp_ctx_step(t->ctx), t->epoch0 + 1, t->pos0);
    else if (o->resume)
      printf("resumed from %s at step %llu\n", o->resume,
             (unsigned long long)dp_ctx_step(t->ctx));
  }
  char lerr[DPT_MSG_CAP];
  if (t->writes && o->log && o->resume &&
      trim_log(o->log, t->epoch0, (unsigned long long)dp_ctx_step(t->ctx), lerr,
               sizeof lerr)) {
    fprintf(stderr, "dp train: %s\n", lerr);
    return -1;
  }
  if (t->writes && o->log && dp_file_append(o->log, "log", !o->resume, &t->logf)) {
    fprintf(stderr, "dp train: %s\n", dpt_user_msg(dp_last_error()));
    return -1;
  }
  t->tty = !o->quiet && isatty(STDOUT_FILENO) && !dpt_world_launched();
  t->cols = 80;
  struct winsize ws;
  if (t->tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    t->cols = ws.ws_col;
  t->t_run0 = dpt_now_s();
  t->ep_end = t->epoch0 + o->epochs;
  t->ep_done = t->epoch0;
  t->best = INFINITY;
  /* SIGINT, SIGTERM: stop after the step at hand, save, say how to go on */
  dpt_stop_install("dp train");
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

static void log_flush(train_run *t);

/* --log-every's record of the optimizer step just done, in epoch ep (1-based,
 * in progress): the mean loss of the calls since the last such record. */
static void log_step(train_run *t, int ep) {
  FILE *logf = t->logf;
  fprintf(logf, "{\"epoch\":%d,\"step\":%llu,\"kind\":\"step\",\"loss\":", ep,
          (unsigned long long)dp_ctx_step(t->ctx));
  json_number(logf, t->win_n ? t->win_sum / (double)t->win_n : NAN);
  fputs(",\"lr\":", logf);
  json_number(logf, dp_ctx_lr(t->ctx));
  fputs(",\"grad_norm\":", logf);
  json_number(logf, t->pc->clip_grad_norm > 0 ? dp_ctx_grad_norm(t->ctx) : NAN);
  fprintf(logf, ",\"calls\":%ld}\n", t->win_n);
  t->win_sum = 0.0;
  t->win_n = 0;
  t->win_step = dp_ctx_step(t->ctx);
  log_flush(t);
}

/* What one epoch did, for its line and its log record. */
typedef struct {
  double t_epoch; /* seconds in dp_train_step */
  long samples;
} epoch_stats;

/* What a checkpoint is written for: the end of the run, --save-every (inside
 * an epoch, or at its end: said after the epoch's line), --save-best, a stop by
 * signal (each says so its own way). */
typedef enum { SAVE_END, SAVE_EVERY, SAVE_EVERY_EPOCH, SAVE_BEST, SAVE_STOP } save_kind;
static int save_checkpoint(train_run *t, const char *path, int epochs, int position,
                           save_kind kind);
static void say_every(train_run *t);

/* After a step that ended an optimizer step (accumulation done; a checkpoint
 * holds no partial sums), `done` rows into epoch ep: --save-every's
 * checkpoint, and the stop signal the ranks agree on. 0: go on; 1: stop
 * (t->stop_*); -1: failed (said). */
static int after_step(train_run *t, int ep, int done) {
  int K = t->pc->accumulate > 1 ? t->pc->accumulate : 1;
  if (t->steps % K) return 0;
  uint64_t st = dp_ctx_step(t->ctx);
  if (t->logf && t->o.log_every && st % (uint64_t)t->o.log_every == 0 && st != t->win_step)
    log_step(t, ep + 1);
  /* the checkpoint's place: epochs done, and calls done in the next one */
  int e = ep, pos = (done + t->batch - 1) / t->batch;
  if (done >= epoch_rows(t)) {
    e = ep + 1;
    pos = 0;
  }
  if (t->every && dp_ctx_step(t->ctx) % (uint64_t)t->every == 0 &&
      save_checkpoint(t, t->o.save, e, pos, pos == 0 ? SAVE_EVERY_EPOCH : SAVE_EVERY))
    return -1;
  int sig = dpt_stop_agreed();
  if (!sig) return 0;
  t->stop_sig = sig;
  t->stop_ep = e;
  t->stop_pos = pos;
  return 1;
}

/* The steps of epoch ep over the shuffled training rows (a resumed run's
 * first epoch from where it stopped); its mean loss into curve[ep - epoch0].
 * 0; 1: stopped by a signal after a step; -1: failed (said). */
static int train_epoch(train_run *t, int ep, epoch_stats *es) {
  const dpt_dataset *train = &t->train;
  int B = t->batch;
  /* --no-shuffle: every epoch in file order; else keyed by the data seed */
  const int *order = t->o.no_shuffle ? NULL : t->perm;
  if (order) dpt_epoch_order(train->n_rows, t->o.data_seed, ep, t->perm);
  double sum = 0.0, t0 = dpt_now_s(), t_last = t0;
  int nb = 0, rows = epoch_rows(t);
  for (int from = ep == t->epoch0 ? t->pos0 * B : 0; from < rows; from += B) {
    int n = rows - from < B ? rows - from : B;
    dpt_dataset_gather(train, &t->scaler, order, from, n, t->bx, t->bt);
    float loss;
    /* the scheduled rate at this optimizer step (the context's counter: a resumed
     * run continues its schedule) */
    uint64_t at = dp_ctx_step(t->ctx);
    if (t->o.schedule &&
        (dp_set_lr(t->ctx, dp_lr_at(&t->sched, at)) ||
         (cycles_momentum(t) && dp_set_momentum(t->ctx, dp_momentum_at(&t->sched, at))))) {
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
    t->win_sum += loss;
    t->win_n++;
    t->steps++;
    t->samples += n;
    es->samples += n;
    if (t->tty && te - t_last > 0.1) {
      /* the time left: the time so far over the share of the epochs done */
      double el = te - t->t_run0,
             frac = (ep - t->epoch0 + (double)(from + n) / rows) / t->o.epochs;
      progress(t->tty, t->cols, ep + 1, t->ep_end, from + n, rows, (float)(sum / nb),
               es->samples / es->t_epoch, el, frac > 0 ? el / frac - el : -1.0, "", 0);
      t_last = te;
    }
    int after = after_step(t, ep, from + n);
    /* a stop at the epoch's end: the epoch completes first (its line, held-out
     * figures and log record: run_epochs), then the stop (an outside check,
     * session 24: they were lost, and a stop in the run's last step printed a
     * resume of --epochs 0) */
    if (after < 0 || (after > 0 && from + n < rows)) return after;
  }
  t->curve[ep - t->epoch0] = (float)(sum / nb);
  return 0;
}

/* The held-out figures after an epoch. */
/* The held-out figure is an accuracy: of classes, or of bce_with_logits'
 * outputs (a logit's sign against its target's side of 0.5); else the mse. */
static bool accuracy_of(const train_run *t) {
  return t->all.label || dp_model_loss(t->model) == DP_LOSS_BCE_LOGITS;
}

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
               t->by + (size_t)B * out_w, t->by, t->views != 0, &h->metric, &h->loss)) {
    printf("%s", t->tty ? "\n" : "");
    fprintf(stderr, "dp train: evaluation after epoch %d: %s\n", t->ep_done,
            dpt_user_msg(dp_ctx_error(t->ctx)));
    return -1;
  }
  t->hx[t->n_held] = t->ep_done;
  t->hcurve[t->n_held++] = (float)h->loss;
  if (t->views)
    snprintf(h->text, sizeof h->text, "  held-out %.4f nats/%s  perplexity %.2f", h->loss,
             t->o.text ? "byte" : "token", exp(h->loss));
  else if (accuracy_of(t))
    snprintf(h->text, sizeof h->text, "  held-out loss %.4f  accuracy %.2f%%", h->loss,
             100.0 * h->metric);
  else
    snprintf(h->text, sizeof h->text, "  held-out loss (%s) %.4g",
             dp_loss_name(dp_model_loss(t->model)), h->loss);
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
    fputs(accuracy_of(t) ? ",\"heldout_accuracy\":" : ",\"heldout_mse\":", logf);
    json_number(logf, h->metric);
    if (t->views) {
      fputs(",\"heldout_perplexity\":", logf);
      json_number(logf, exp(h->loss));
    }
  }
  fputs("}\n", logf);
  log_flush(t);
}

/* A record written: flushed (tail -f), or on a failed write the log stops with
 * a warning. */
static void log_flush(train_run *t) {
  if (fflush(t->logf) || ferror(t->logf)) {
    fprintf(stderr, "dp train: warning: cannot write log '%s': %s; no more lines\n",
            t->o.log, strerror(errno));
    fclose(t->logf);
    t->logf = NULL;
  }
}

/* The held-out loss against the best so far (rank 0 has the figures; every
 * rank follows it): --save-best saves a new best (and says so on the epoch's
 * line); --patience counts the evaluations since. 1: stop; 0: go on; -1:
 * failed (said). */
static int patience_over(train_run *t, held_out *h) {
  if (!h->evaluated || (!t->o.patience && !t->o.save_best)) return 0;
  if (dpt_world_bcast_int(h->loss < t->best)) {
    t->best = h->loss;
    t->best_ep = t->ep_done;
    t->since_best = 0;
    /* --save-best: the checkpoint of the best so far (every rank saves) */
    if (t->o.save_best) {
      if (save_checkpoint(t, t->o.save_best, t->ep_done, 0, SAVE_BEST)) return -1;
      t->best_saved = 1;
      size_t n = strlen(h->text);
      snprintf(h->text + n, sizeof h->text - n, "  best: saved");
    }
  } else {
    t->since_best++;
  }
  return t->o.patience && dpt_world_bcast_int(t->since_best >= t->o.patience);
}

/* An early stop with --save-best: the best checkpoint loaded back, so that
 * the report, the parameter hash and --save are the best's. 0, or -1 (said). */
static int restore_best(train_run *t) {
  if (dp_ckpt_load(t->ctx, t->o.save_best)) {
    fprintf(stderr, "dp train: cannot restore the best checkpoint '%s': %s\n",
            t->o.save_best, dpt_user_msg(dp_ctx_error(t->ctx)));
    return -1;
  }
  t->best_restored = 1;
  printf("restored the best checkpoint %s (epoch %d, step %llu)\n", t->o.save_best,
         t->best_ep, (unsigned long long)dp_ctx_step(t->ctx));
  return 0;
}

/* The epochs: steps, then the held-out evaluation, the progress line and the
 * log record of each; --patience may stop early. 0, or -1 (said). */
static int run_epochs(train_run *t) {
  for (int ep = t->epoch0; ep < t->ep_end; ep++) {
    epoch_stats es = {0};
    int st = train_epoch(t, ep, &es);
    if (st) {
      say_every(t);
      return st < 0 ? -1 : 0; /* stopped by a signal: t->stop_sig */
    }
    int k = ep - t->epoch0;
    t->ep_done = ep + 1;
    held_out h;
    if (evaluate_epoch(t, &h)) {
      say_every(t);
      return -1;
    }
    int stop = patience_over(t, &h);
    if (stop < 0) {
      say_every(t);
      return -1;
    }
    double el = dpt_now_s() - t->t_run0;
    if (!t->o.quiet)
      progress(t->tty, t->cols, t->ep_done, t->ep_end, epoch_rows(t), epoch_rows(t),
               t->curve[k], es.t_epoch > 0 ? es.samples / es.t_epoch : 0.0, el,
               el / (k + 1) * (t->ep_end - t->ep_done), h.text, 1);
    say_every(t);
    if (t->logf) log_epoch(t, k, el, &es, &h);
    /* a signal in the epoch's last step: after the run's last epoch, or an early
     * stop, the run ends as usual; else it stops here */
    if (t->stop_sig && (stop || t->ep_done == t->ep_end)) t->stop_sig = 0;
    if (stop) {
      t->stopped = 1;
      break;
    }
    if (t->stop_sig) break;
  }
  if (t->stopped)
    printf("early stop at epoch %d: held-out loss has not improved for %d evaluation%s "
           "(best %.4f at epoch %d)\n",
           t->ep_done, t->o.patience, t->o.patience == 1 ? "" : "s", t->best, t->best_ep);
  if (t->stopped && t->best_saved) return restore_best(t);
  return 0;
}

/* The final evaluation, the step timings and the parameter hash; then the log
 * closed. 0, or -1 (said). */
static int final_report(train_run *t) {
  double metric = 0.0, eval_loss = 0.0;
  int B = t->batch, out_w = t->out_w;
  const dpt_dataset *eval = t->test.n_rows ? &t->test : &t->train;
  if (evaluate(t->ctx, t->plan, eval, &t->scaler, B, out_w, t->bx,
               t->by + (size_t)B * out_w, t->by, t->views != 0, &metric, &eval_loss)) {
    fprintf(stderr, "dp train: evaluation: %s\n", dpt_user_msg(dp_ctx_error(t->ctx)));
    return -1;
  }
  int label = t->all.label != 0, acc = accuracy_of(t);
  /* the targets equal to ignore_index, which the figures leave out: said */
  char ign[64] = "";
  dp_ce_options ce;
  if (label && dp_model_ce_options(t->model, &ce) == DP_OK && ce.has_ignore_index) {
    long n = 0;
    for (size_t k = 0, lw = label_width(eval); k < (size_t)eval->n_rows * lw; k++)
      n += eval->label[k] == ce.ignore_index;
    snprintf(ign, sizeof ign, ", %ld target%s ignored", n, n == 1 ? "" : "s");
  }
  if (t->views)
    printf("\n%s: %.4f nats/%s, perplexity %.2f, next-%s accuracy %.2f%% (%d windows%s)\n",
           t->test.n_rows ? "held-out" : "training", eval_loss,
           t->o.text ? "byte" : "token", exp(eval_loss), t->o.text ? "byte" : "token",
           100.0 * metric, eval->n_rows, ign);
  else
    printf("\n%s: %s %.2f%s (%d row%s%s)\n", t->test.n_rows ? "held-out" : "training",
           acc ? "accuracy" : "mse", acc ? 100.0 * metric : metric, acc ? "%" : "",
           eval->n_rows, eval->n_rows == 1 ? "" : "s", ign);
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

/* A checkpoint at path, with the run's record (epochs done and the calls
 * done in the next one, rows, the standardisation, the settings). 0, or -1
 * (said). */
static int save_checkpoint(train_run *t, const char *path, int epochs, int position,
                           save_kind kind) {
  size_t run_n = 0;
  char settings[1024];
  char *run = dpt_run_text_at(epochs, position, t->train.n_rows, &t->scaler,
                              run_settings(t, settings, sizeof settings), &run_n);
  if (!run) {
    fprintf(stderr, "dp train: out of memory\n");
    return -1;
  }
  dp_status ss = dp_ckpt_save_app(t->ctx, path, run, run_n);
  free(run);
  if (ss) {
    printf("%s", t->tty && kind != SAVE_END ? "\n" : "");
    fprintf(stderr, "dp train: %s\n", dpt_user_msg(dp_ctx_error(t->ctx)));
    return -1;
  }
  if (kind == SAVE_END)
    printf("checkpoint: %s (step %llu)\n", path, (unsigned long long)dp_ctx_step(t->ctx));
  else if (kind == SAVE_EVERY_EPOCH && !t->o.quiet)
    t->every_said = (unsigned long long)dp_ctx_step(t->ctx); /* after the epoch's line */
  else if (kind == SAVE_EVERY && !t->o.quiet) { /* over a progress line on a terminal */
    printf("%scheckpoint: %s (step %llu, --save-every)%s\n", t->tty ? "\r" : "", path,
           (unsigned long long)dp_ctx_step(t->ctx), t->tty ? "\033[K" : "");
    fflush(stdout);
  }
  return 0;
}

/* The line of a --save-every checkpoint written at an epoch's end, after that
 * epoch's line (an outside check, session 23: it came before it). */
static void say_every(train_run *t) {
  if (!t->every_said) return;
  printf("checkpoint: %s (step %llu, --save-every)\n", t->o.save, t->every_said);
  fflush(stdout);
  t->every_said = 0;
}

/* A stop by signal, after the step at hand (every rank after the same one):
 * the log closed, --save written with the place in the epoch, one line that
 * says where and how to go on; exit status 128 + the signal (130 for
 * SIGINT, 143 for SIGTERM). Every rank leaves by itself. */
static int interrupted(train_run *t) {
  const train_opts *o = &t->o;
  int sig = t->stop_sig, rc = 128 + sig;
  dpt_world_failed_together();
  if (t->logf) {
    fclose(t->logf);
    t->logf = NULL;
  }
  if (o->save && save_checkpoint(t, o->save, t->stop_ep, t->stop_pos, SAVE_STOP)) rc = 1;
  char where[96];
  if (t->stop_pos)
    snprintf(where, sizeof where, "in epoch %d (%d of its %ld batches)", t->stop_ep + 1,
             t->stop_pos, epoch_calls(t));
  else
    snprintf(where, sizeof where, "at the end of epoch %d", t->stop_ep);
  fflush(stdout);
  if (!t->writes) return rc;
  if (!o->save) {
    fprintf(
        stderr,
        "dp train: %s: stopped after step %llu, %s; nothing was saved (no --save FILE)\n",
        dpt_signal_name(sig), (unsigned long long)dp_ctx_step(t->ctx), where);
    return rc;
  }
  if (rc == 1) return rc; /* the save said why */
  /* the command that goes on: the same, resumed from the file, the epochs left */
  char prefix[600];
  int n = 0;
  if (dpt_world_size() > 1)
    n = snprintf(prefix, sizeof prefix, "mpirun -np %d ", dpt_world_size());
  snprintf(prefix + n, sizeof prefix - (size_t)n, "%s train", program_invocation_name);
  char *cmd = dpt_resume_command(prefix, t->argc, t->argv, o->save, t->ep_end - t->stop_ep);
  fprintf(stderr, "dp train: %s: stopped after step %llu, %s; saved %s; to go on: %s\n",
          dpt_signal_name(sig), (unsigned long long)dp_ctx_step(t->ctx), where, o->save,
          cmd ? cmd : "(out of memory)");
  free(cmd);
  return rc;
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

/* Everything after the command line: 0; -1: failed (said); or the exit
 * status of a stop by signal. */
/* Bytes beyond what the file system holds now that the run's checkpoints need
 * at their peak, for the paths of `on` (the paths on one file system): best is
 * rewritten during the run, --save with --save-every too, and --save written
 * at the end; a rewrite writes its new file beside the old one. ckpt: one
 * checkpoint's size; have[i]: the bytes (at most ckpt) of the file at path i
 * now that its replacement frees (counted as used already). */
static size_t room_needed(const train_opts *o, const bool on[2], const size_t have[2],
                          size_t ckpt) {
  bool rewritten[2] = {o->save_every != NULL, true}; /* 0: --save, 1: --save-best */
  size_t run = 0, end = 0;
  bool any = false;
  for (int i = 0; i < 2; i++)
    if (on[i] && rewritten[i]) {
      any = true;
      run += ckpt - have[i]; /* it exists during the run */
    }
  run += any ? ckpt : 0; /* a rewrite's new file */
  if (on[0])             /* the end: --save's file beside the best, and its old one */
    end = (on[1] ? ckpt - have[1] : 0) + (rewritten[0] ? ckpt - have[0] : 0) + ckpt;
  return run > end ? run : end;
}

/* The file systems of --save and --save-best have room for the run's
 * checkpoints before the work (an outside check, session 25: a full disk was
 * found when the run's end wrote it, the run's work lost). Rank 0, which
 * writes the files, checks; every rank leaves alike. 0, or -1 (said). */
static int check_room(train_run *t) {
  const train_opts *o = &t->o;
  const char *path[2] = {o->save, o->save_best};
  int bad = 0;
  if (t->writes && (path[0] || path[1])) {
    size_t run_n = 0;
    char settings[1024];
    run_settings(t, settings, sizeof settings);
    /* the run's record as long as any it writes: at its last epoch (a resumed
     * run's count goes on from its checkpoint's), or inside it at its last
     * batch (--save-every, a stop) */
    int last = t->epoch0 + o->epochs, calls = (int)epoch_calls(t);
    for (int k = 0; k < 2; k++) {
      size_t n = 0;
      free(dpt_run_text_at(k ? last - 1 : last, k ? calls - 1 : 0, t->train.n_rows,
                           &t->scaler, settings, &n));
      run_n = n > run_n ? n : run_n;
    }
    size_t ckpt = dp_ckpt_bytes(t->ctx, run_n);
    size_t have[2] = {0, 0};
    bool same = false;
    unsigned long long dev[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
      /* what the rename frees: the entry's own blocks (a link's target, a
       * file of other links and a smaller file free less than a checkpoint) */
      struct stat st;
      if (path[i] && lstat(path[i], &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1) {
        unsigned long long b = (unsigned long long)st.st_blocks * 512,
                           z = (unsigned long long)st.st_size;
        b = b < z ? b : z;
        have[i] = b < ckpt ? (size_t)b : ckpt;
      }
      dev[i] = path[i] ? dpt_dir_device(path[i]) : 0;
    }
    same = path[0] && path[1] && dev[0] && dev[0] == dev[1];
    for (int i = 0; i < 2 && !bad; i++) {
      if (!path[i] || (same && i == 1)) continue;
      bool on[2] = {i == 0 || same, i == 1 || same};
      size_t need = room_needed(o, on, have, ckpt);
      const char *what = same ? "the checkpoints of --save and --save-best"
                         : i  ? "best checkpoint"
                              : "checkpoint";
      if (dp_file_room(path[i], what, need)) {
        fprintf(stderr, "dp train: %s\n", dpt_user_msg(dp_last_error()));
        if (need > ckpt)
          fprintf(stderr,
                  "(%zu bytes a checkpoint; a checkpoint the run writes again is written "
                  "beside the old one, then replaces it)\n",
                  ckpt);
        bad = 1;
      }
    }
  }
  if (!dpt_world_bcast_int(bad)) return 0;
  dpt_world_failed_together();
  return -1;
}

static int train(train_run *t) {
  /* rank 0 checks the files it writes; every rank leaves by itself on its
   * word (an outside check: a directory at --save under mpirun was said once,
   * then mpirun aborted the job) */
  if (dpt_world_bcast_int(check_files(t) != 0)) {
    dpt_world_failed_together();
    return -1;
  }
  if (load_inputs(t)) return -1;
  if (t->o.resume && read_resume(t)) return -1;
  if (t->o.standardize && !t->scaler.n && fit_scaler(t)) return -1;
  /* the standardisation is applied as each batch is gathered (a mapped file
   * is never written) */
  if (make_context(t) || check_last_batch(t) || check_room(t) || start_run(t) ||
      run_epochs(t))
    return -1;
  if (t->stop_sig) return interrupted(t);
  if (final_report(t)) return -1;
  /* a chart that cannot be written does not lose the run's checkpoint (an
   * outside check of files: a full disk under --plot skipped --save) */
  int failed = t->o.plot && t->writes && write_plot(t);
  /* the state's epochs: the best's, when the early stop restored it */
  int ep = t->best_restored ? t->best_ep : t->ep_done;
  if (t->o.save && save_checkpoint(t, t->o.save, ep, 0, SAVE_END)) return -1;
  return failed ? -1 : 0;
}

int dpt_cmd_train(int argc, char **argv) {
  train_run t = {.o = {.epochs = 10, .test_fraction = 0.2, .standardize = 1},
                 .argc = argc,
                 .argv = argv};
  int rc = parse_train(argc, argv, &t);
  if (rc < 0) {
    t.writes = dpt_world_rank() == 0;
    rc = train(&t);
    rc = rc < 0 ? DPT_EXIT_FAIL : rc;
  }
  dpt_stop_restore();
  free_run(&t);
  return rc;
}
