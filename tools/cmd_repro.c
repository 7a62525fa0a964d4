/* `dp repro`: the reproducibility check. Trains the same model on the same
 * batches under several configurations (device counts x modes) in lockstep,
 * hashes every parameter tensor after every step, and reports whether all of
 * them produce the same bits, and if not, the first step and tensor where two
 * of them part and by how much. */
#include "agree.h"
#include "cli.h"
#include "data.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- options ------------------------------------------------------------------ */

enum {
  OPT_MODEL = DPT_OPT_USER,
  OPT_DATA,
  OPT_STEPS,
  OPT_DEVICES, /* a list of counts here, not dp's --devices */
  OPT_MODE,    /* a list of modes here, not dp's --mode */
  OPT_TRACE,
  OPT_JSON,
  OPT_SKIP_REFUSED,
  OPT_NO_STANDARDIZE,
  OPT_LAYOUTS, /* ranks x devices per rank, under mpirun */
  OPT_TEXT,
  OPT_TOKENS,
};

/* Every option of `dp repro`. The common options listed here are handed on,
 * as "--name=value", to dpt_parse_args, so that they mean exactly what they
 * mean in every other command; --devices and --mode are repro's own (lists),
 * and --inference (no training) and --shard-optimizer (the `sharded` mode)
 * are left out. */
static const struct option repro_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"data", required_argument, NULL, OPT_DATA},
    {"text", required_argument, NULL, OPT_TEXT},
    {"tokens", required_argument, NULL, OPT_TOKENS},
    {"steps", required_argument, NULL, OPT_STEPS},
    {"devices", required_argument, NULL, OPT_DEVICES},
    {"mode", required_argument, NULL, OPT_MODE},
    {"trace", no_argument, NULL, OPT_TRACE},
    {"json", no_argument, NULL, OPT_JSON},
    {"skip-refused", no_argument, NULL, OPT_SKIP_REFUSED},
    {"no-standardize", no_argument, NULL, OPT_NO_STANDARDIZE},
    {"layouts", required_argument, NULL, OPT_LAYOUTS},
    {"batch", required_argument, NULL, DPT_OPT_BATCH},
    {"micro-batch", required_argument, NULL, DPT_OPT_MICRO_BATCH},
    {"split", required_argument, NULL, DPT_OPT_SPLIT},
    {"optimizer", required_argument, NULL, DPT_OPT_OPTIMIZER},
    {"backend", required_argument, NULL, DPT_OPT_BACKEND},
    {"lr", required_argument, NULL, DPT_OPT_LR},
    {"momentum", required_argument, NULL, DPT_OPT_MOMENTUM},
    {"dampening", required_argument, NULL, DPT_OPT_DAMPENING},
    {"nesterov", no_argument, NULL, DPT_OPT_NESTEROV},
    {"weight-decay", required_argument, NULL, DPT_OPT_WEIGHT_DECAY},
    {"beta1", required_argument, NULL, DPT_OPT_BETA1},
    {"beta2", required_argument, NULL, DPT_OPT_BETA2},
    {"eps", required_argument, NULL, DPT_OPT_EPS},
    {"amsgrad", no_argument, NULL, DPT_OPT_AMSGRAD},
    {"seed", required_argument, NULL, DPT_OPT_SEED},
    {"recompute", required_argument, NULL, DPT_OPT_RECOMPUTE},
    {"precision", required_argument, NULL, DPT_OPT_PRECISION},
    {"reduce-precision", required_argument, NULL, DPT_OPT_REDUCE_PRECISION},
    {"batchnorm", required_argument, NULL, DPT_OPT_BATCHNORM},
    {"backend-option", required_argument, NULL, DPT_OPT_BACKEND_OPTION},
    {"help", no_argument, NULL, 'h'},
    {0, 0, 0, 0},
};

/* The modes a configuration can have. */
enum { RM_CLASSIC = 0, RM_ALLREDUCE, RM_SHARDED, RM_COUNT };
static const char *const rm_names[RM_COUNT] = {"classic", "allreduce", "sharded"};

#define DEFAULT_STEPS 10
#define MAX_STEPS 1000000

typedef struct {
  const char *model, *data, *text, *tokens; /* one of the three data sources */
  int steps, trace, json, skip_refused, no_standardize;
  int n_counts, counts[DP_MAX_DEVICES]; /* device counts, in the order given */
  int ranks[DP_MAX_DEVICES];            /* processes of each (--layouts; else 1) */
  int layouts;                          /* --layouts given */
  int n_modes, modes[RM_COUNT];         /* RM_*, in the order given */
  dp_config base;                       /* the common options */
  int batch_given;
} repro_opts;

static void usage(FILE *f) {
  fputs(
      "usage: dp repro --model M.dpm (--data D.csv | --text F | --tokens F.npy) --batch B\n"
      "                [--micro-batch K]\n"
      "                [--steps S] [--devices 1,2,4,8 | --layouts 1x8,2x4,4x2,8x1]\n"
      "                [--mode classic,allreduce,sharded]\n"
      "                [--optimizer sgd|momentum|adamw|adam] [--lr LR] [--seed N]\n"
      "                [--trace] [--json] [--skip-refused]\n"
      "\n"
      "Checks that training gives the same bits whatever the device count and mode.\n"
      "Every configuration in the cross product of --devices and --mode trains the\n"
      "model from the same seed on the same batches: step s takes the B consecutive\n"
      "rows s*B .. s*B+B-1 of the data in a shuffled order (a new order from --seed\n"
      "for each pass, wrapping around), so every step has a full batch. The\n"
      "configurations run in lockstep; after every step the loss and an FNV-1a 64\n"
      "hash of each parameter tensor are compared with the first configuration that\n"
      "runs (the reference). Tensors are named as PyTorch's state_dict names an\n"
      "nn.Sequential of the model's layers (the layer index counts the layers after\n"
      "`input`): \"0.weight\" (out, in) and \"0.bias\" (out) of a linear layer 0,\n"
      "\"1.weight\" and \"1.bias\" (width) of a layernorm layer 1.\n"
      "\n"
      "Output: one row per configuration: device count, mode, final loss, parameter\n"
      "hash (as dp train prints it) and `same` or `DIFFERS from step s` against the\n"
      "reference. On a divergence it names the first step (1-based), the first tensor\n"
      "in state_dict order, the two configurations and that tensor's max absolute\n"
      "difference at that step (or the two losses, when only the loss differs).\n"
      "\n"
      "Repro options:\n"
      "  --model FILE          model spec (.dpm) with a loss line\n"
      "  --data FILE           CSV data: label first (softmax_cross_entropy), or the\n"
      "                        <output width> targets first (mse), then the features;\n"
      "                        all rows are used, standardised per feature\n"
      "  --text FILE           instead of --data, for a sequence model (input tokens T):\n"
      "                        the file's bytes as token ids, windows of T+1 of them\n"
      "                        one every T (as dp train --text), all used\n"
      "  --tokens FILE.npy     the same from a 1-D .npy of int32 or uint16 token ids\n"
      "  --steps S             training steps (default 10)\n"
      "  --devices LIST        device counts, comma separated (default 1,2,4,8); here\n"
      "                        not a list of device ids\n"
      "  --layouts LIST        instead of --devices: job layouts RxL, comma separated:\n"
      "                        R processes (MPI ranks) of L devices each, R*L devices\n"
      "                        in all. Run under mpirun with at least the largest R\n"
      "                        processes: mpirun -np 8 dp repro --layouts\n"
      "                        1x8,2x4,4x2,8x1 ... runs each layout on the first R\n"
      "                        processes (1xL: one process, rank 0) and compares\n"
      "                        every tensor after every step across them\n"
      "  --mode LIST           modes, comma separated: classic, allreduce, sharded\n"
      "                        (= allreduce with the optimizer state sharded across\n"
      "                        the devices); default classic,allreduce,sharded\n"
      "  --trace               also print, for every step and configuration, the loss,\n"
      "                        the parameter hash and the hash of every tensor\n"
      "  --json                print the report as one JSON object\n"
      "  --skip-refused        configurations the library refuses do not make the exit\n"
      "                        status 2\n"
      "  --no-standardize      keep the features as they are in the file\n"
      "\n"
      "Training options (as in dp train; --devices and --mode are the lists above):\n"
      "  --batch B             rows per step, and the planned batch (required)\n"
      "  --micro-batch K       rows per micro-batch (default 0 = each device's chunk,\n"
      "                        which does not give the same bits across counts)\n"
      "  --split chunk|balanced|memory  how micro-batches (or rows) are dealt to devices\n"
      "  --optimizer sgd|momentum|adamw|adam   (default sgd)\n"
      "  --lr X  --momentum X  --dampening X  --nesterov  --weight-decay X\n"
      "  --beta1 X  --beta2 X  --eps X  --amsgrad\n"
      "                        hyper-parameters, with dp train's ranges and defaults\n"
      "                        (PyTorch's; --optimizer sets its defaults first, the\n"
      "                        others override them; see dp train --help)\n"
      "  --backend cpu|cuda    (default cpu)\n"
      "  --backend-option NAME=VALUE  one of the backend's own options, in every\n"
      "                        configuration (repeatable; e.g. params=shared,\n"
      "                        with --mode classic: allreduce refuses it)\n"
      "  --seed N              parameter init, dropout and the batch order (default 0)\n"
      "  --recompute K         activation recompute every K layers in every\n"
      "                        configuration (the bits are those without it)\n"
      "  --precision fp32|bf16 bf16 mixed precision in every configuration\n"
      "                        (docs/PRECISION.md; default fp32)\n"
      "  --reduce-precision fp32|bf16  the gradient reduction's precision with bf16\n"
      "                        (default fp32)\n"
      "  --batchnorm per_replica|sync  batchnorm's statistics in every configuration:\n"
      "                        each micro-batch's (default) or the whole batch's\n"
      "                        (SyncBatchNorm); both give one set of bits\n"
      "\n"
      "When the bits are guaranteed to be the same (see docs/DETERMINISM.md):\n"
      "  - a fixed --micro-batch K, the chunk split, and the same batch size;\n"
      "  - device counts that are powers of two dividing the number of micro-batches\n"
      "    ceil(B/K) (with K = 4 and B = 32: 1, 2, 4 and 8 devices);\n"
      "  - classic, allreduce and sharded alike, any optimizer, dropout included;\n"
      "  - the same backend and the same build (compiler, flags): the cpu and cuda\n"
      "    backends give different bits, and so may two builds.\n"
      "Without --micro-batch every device runs its whole chunk as one micro-batch, so\n"
      "the sums are cut differently for each device count and the bits usually\n"
      "differ; that is what this command then shows.\n"
      "\n"
      "Exit status: 0 every configuration that ran gave the same bits at every step;\n"
      "1 two configurations differ, or a step failed, or the model or data could not\n"
      "be loaded; 2 usage error, or a configuration was refused (\"refused: <why>\",\n"
      "e.g. a mode this build does not implement) and --skip-refused was not given.\n"
      "A divergence wins over a refusal.\n",
      f);
}

/* Parses "1,2,4,8": counts in [1, DP_MAX_DEVICES], no repeats. */
static int parse_counts(const char *s, repro_opts *o, char *err, size_t errcap) {
  o->n_counts = 0;
  if (!s || !*s) return snprintf(err, errcap, "--devices: empty list"), -1;
  for (const char *p = s;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char item[32], msg[256];
    if (len == 0 || len >= sizeof item) {
      snprintf(err, errcap,
               "--devices: bad entry in '%s' (a comma list of device counts, "
               "e.g. 1,2,4,8)",
               s);
      return -1;
    }
    memcpy(item, p, len);
    item[len] = '\0';
    int n;
    if (dpt_parse_int(item, 1, DP_MAX_DEVICES, "--devices: device count", &n, msg,
                      sizeof msg)) {
      snprintf(err, errcap, "%s", msg);
      return -1;
    }
    for (int i = 0; i < o->n_counts; i++)
      if (o->counts[i] == n) {
        snprintf(err, errcap, "--devices: %d appears twice in '%s'", n, s);
        return -1;
      }
    if (o->n_counts == DP_MAX_DEVICES) {
      snprintf(err, errcap, "--devices: more than %d counts in '%s'", DP_MAX_DEVICES, s);
      return -1;
    }
    o->counts[o->n_counts++] = n;
    if (!comma) return 0;
    p = comma + 1;
  }
}

/* Parses "1x8,2x4": layouts R x L (R processes of L devices), no repeats. */
static int parse_layouts(const char *s, repro_opts *o, char *err, size_t errcap) {
  o->n_counts = 0;
  o->layouts = 1;
  if (!s || !*s) return snprintf(err, errcap, "--layouts: empty list"), -1;
  for (const char *p = s;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char item[32], msg[256];
    const char *x = len < sizeof item ? memchr(p, 'x', len) : NULL;
    if (!x || x == p || (size_t)(x - p) + 1 >= len) {
      snprintf(err, errcap,
               "--layouts: bad entry '%.*s' in '%s' (RxL: R processes of L devices, e.g. "
               "1x8,2x4,4x2,8x1)",
               (int)(len < 31 ? len : 31), p, s);
      return -1;
    }
    int R, L;
    memcpy(item, p, (size_t)(x - p));
    item[x - p] = '\0';
    if (dpt_parse_int(item, 1, DP_MAX_DEVICES, "--layouts: ranks", &R, msg, sizeof msg)) {
      snprintf(err, errcap, "%s", msg);
      return -1;
    }
    memcpy(item, x + 1, len - (size_t)(x - p) - 1);
    item[len - (size_t)(x - p) - 1] = '\0';
    if (dpt_parse_int(item, 1, DP_MAX_DEVICES, "--layouts: devices per rank", &L, msg,
                      sizeof msg)) {
      snprintf(err, errcap, "%s", msg);
      return -1;
    }
    if (R * L > DP_MAX_DEVICES) {
      snprintf(err, errcap, "--layouts: %dx%d is more than %d devices", R, L,
               DP_MAX_DEVICES);
      return -1;
    }
    for (int i = 0; i < o->n_counts; i++)
      if (o->ranks[i] == R && o->counts[i] == R * L) {
        snprintf(err, errcap, "--layouts: %dx%d appears twice in '%s'", R, L, s);
        return -1;
      }
    if (o->n_counts == DP_MAX_DEVICES) {
      snprintf(err, errcap, "--layouts: more than %d layouts in '%s'", DP_MAX_DEVICES, s);
      return -1;
    }
    o->ranks[o->n_counts] = R;
    o->counts[o->n_counts++] = R * L;
    if (!comma) return 0;
    p = comma + 1;
  }
}

/* Parses "classic,allreduce,sharded" (case-insensitive, no repeats). */
static int parse_modes(const char *s, repro_opts *o, char *err, size_t errcap) {
  o->n_modes = 0;
  if (!s || !*s) return snprintf(err, errcap, "--mode: empty list"), -1;
  for (const char *p = s;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    int m = -1;
    for (int k = 0; k < RM_COUNT; k++)
      if (strlen(rm_names[k]) == len && strncasecmp(p, rm_names[k], len) == 0) m = k;
    if (m < 0) {
      snprintf(err, errcap, "--mode: '%.*s' is not one of classic|allreduce|sharded",
               (int)len, p);
      return -1;
    }
    for (int i = 0; i < o->n_modes; i++)
      if (o->modes[i] == m) {
        snprintf(err, errcap, "--mode: %s appears twice in '%s'", rm_names[m], s);
        return -1;
      }
    o->modes[o->n_modes++] = m;
    if (!comma) return 0;
    p = comma + 1;
  }
}

static const char *option_name(int val) {
  for (const struct option *q = repro_options; q->name; q++)
    if (q->val == val) return q->name;
  return "?";
}

/* Two passes: getopt_long over repro_options (so that prefixes resolve among
 * all of repro's option names), handling repro's own options and collecting
 * the common ones as "--name=value"; then dpt_parse_args over those. Returns
 * DPT_ARGS_OK, DPT_ARGS_HELP or DPT_ARGS_ERROR (message in err). */
static int parse_repro_args(int argc, char **argv, repro_opts *o, char *err,
                            size_t errcap) {
  memset(o, 0, sizeof *o);
  o->steps = DEFAULT_STEPS;
  o->n_counts = 4;
  o->counts[0] = 1, o->counts[1] = 2, o->counts[2] = 4, o->counts[3] = 8;
  for (int i = 0; i < DP_MAX_DEVICES; i++) o->ranks[i] = 1;
  o->n_modes = RM_COUNT;
  for (int k = 0; k < RM_COUNT; k++) o->modes[k] = k;

  char **pass = calloc((size_t)argc + 1, sizeof *pass);
  int n_pass = 1, r = DPT_ARGS_ERROR;
  if (!pass) return snprintf(err, errcap, "out of memory"), DPT_ARGS_ERROR;
  pass[0] = argv[0];

  optind = 0; /* glibc: full reinitialisation */
  opterr = 0;
  int c;
  unsigned long long seen = 0; /* repro's own options given (the common ones are
                                  checked by dpt_config_from_args) */
  while ((c = getopt_long(argc, argv, ":h", repro_options, NULL)) != -1) {
    const char *tok = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
    if (c >= OPT_MODEL && c < OPT_MODEL + 64 && optarg) {
      unsigned long long bit = 1ull << (c - OPT_MODEL);
      if (seen & bit) {
        snprintf(err, errcap, "--%s given twice", option_name(c));
        goto out;
      }
      seen |= bit;
    }
    switch (c) {
    case 'h': r = DPT_ARGS_HELP; goto out;
    case ':':
      snprintf(err, errcap, "option --%s needs a value", option_name(optopt));
      goto out;
    case '?':
      if (optopt >= 0x100 || (optopt == 'h' && strncmp(tok, "--", 2) == 0))
        snprintf(err, errcap, "option --%s takes no value ('%s')", option_name(optopt),
                 tok);
      else if (optopt)
        snprintf(err, errcap, "unknown option '-%c'", optopt);
      else
        dpt_unknown_option(repro_options, tok, err, errcap);
      goto out;
    case OPT_MODEL: o->model = optarg; break;
    case OPT_DATA: o->data = optarg; break;
    case OPT_TEXT: o->text = optarg; break;
    case OPT_TOKENS: o->tokens = optarg; break;
    case OPT_STEPS:
      if (dpt_parse_int(optarg, 1, MAX_STEPS, "--steps", &o->steps, err, errcap)) goto out;
      break;
    case OPT_DEVICES:
      if (parse_counts(optarg, o, err, errcap)) goto out;
      break;
    case OPT_LAYOUTS:
      if (parse_layouts(optarg, o, err, errcap)) goto out;
      break;
    case OPT_MODE:
      if (parse_modes(optarg, o, err, errcap)) goto out;
      break;
    case OPT_TRACE: o->trace = 1; break;
    case OPT_JSON: o->json = 1; break;
    case OPT_SKIP_REFUSED: o->skip_refused = 1; break;
    case OPT_NO_STANDARDIZE: o->no_standardize = 1; break;
    default: { /* a common option: hand it on */
      const char *name = option_name(c);
      size_t len = strlen(name) + (optarg ? strlen(optarg) : 0) + 4;
      char *a = malloc(len);
      if (!a) {
        snprintf(err, errcap, "out of memory");
        goto out;
      }
      snprintf(a, len, "--%s%s%s", name, optarg ? "=" : "", optarg ? optarg : "");
      pass[n_pass++] = a;
      if (c == DPT_OPT_BATCH) o->batch_given = 1;
    }
    }
  }
  if (optind < argc) {
    snprintf(err, errcap, "unexpected argument '%s'", argv[optind]);
    goto out;
  }
  if (dpt_config_from_args(n_pass, pass, &o->base, NULL, err, errcap) != DPT_ARGS_OK)
    goto out;
  if (o->layouts && (seen & (1ull << (OPT_DEVICES - OPT_MODEL)))) {
    snprintf(err, errcap, "--devices and --layouts are alternatives: give one");
    goto out;
  }
  if (!!o->data + !!o->text + !!o->tokens > 1) {
    snprintf(err, errcap, "--data, --text and --tokens are alternatives: give one");
    goto out;
  }
  if (!o->model || !(o->data || o->text || o->tokens) || !o->batch_given) {
    snprintf(err, errcap, "--model, --data (or --text, --tokens) and --batch are required");
    goto out;
  }
  /* a backend option's name or value: wrong for every configuration */
  if (dpt_check_backend_options(&o->base, err, errcap)) goto out;
  if (!o->data) o->data = o->text ? o->text : o->tokens; /* the file, in messages */
  r = DPT_ARGS_OK;
out:
  for (int i = 1; i < n_pass; i++) free(pass[i]);
  free(pass);
  return r;
}

/* ---- parameter tensors -------------------------------------------------------- */

/* The parameter tensors of m in state_dict order (dp_model_tensor). Returns
 * 0, or -1 with a message. */
static int model_tensors(const dp_model *m, dp_tensor_info **out, int *n_out, char *err,
                         size_t errcap) {
  int n = dp_model_n_tensors(m);
  dp_tensor_info *t = calloc((size_t)n + 1, sizeof *t);
  if (!t) {
    snprintf(err, errcap, "out of memory");
    return -1;
  }
  for (int i = 0; i < n; i++)
    if (dp_model_tensor(m, i, &t[i]) != DP_OK) {
      snprintf(err, errcap, "%s", dpt_user_msg(dp_last_error()));
      free(t);
      return -1;
    }
  *out = t;
  *n_out = n;
  return 0;
}

static uint64_t fnv1a(const float *v, size_t n) { return dp_hash_bytes(v, n * sizeof *v); }

static uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* ---- configurations ---------------------------------------------------------- */

enum { ST_OK = 0, ST_REFUSED, ST_ERROR };

typedef struct {
  int n_devices, mode; /* RM_* */
  int ranks;           /* processes (--layouts) */
  int here;            /* this process takes part (under mpirun: rank < ranks) */
  char label[40];      /* "2 devices classic", "2x4 classic" */
  char layout[16];     /* "2 devices", "2x4" */
  dp_config cfg;
  dp_plan *plan;
  dp_ctx *ctx;
  int status;
  char msg[600];
  float loss;    /* of the last step run */
  uint64_t hash; /* dp_params_hash after the last step run */
  uint64_t *th;  /* (n_tensors) tensor hashes after the last step run */
  int div_step;  /* first step differing from the reference; 0 = none */
} run_cfg;

/* The first divergence found. */
typedef struct {
  int step;   /* 0 = none */
  int cfg;    /* the configuration that differs from the reference */
  int tensor; /* index, or -1 when only the loss differs */
  double max_diff;
  size_t at; /* element of the max difference, within the tensor */
  float ref_value, value;
} divergence;

static void json_float(FILE *f, float v) {
  char buf[32];
  if (isfinite(v))
    fputs(dpt_float_text(v, buf, sizeof buf), f);
  else
    fputs("null", f);
}

static void json_hash(FILE *f, uint64_t h) {
  fprintf(f, "\"%016llx\"", (unsigned long long)h);
}

static void json_number(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.9g", v);
  else
    fputs("null", f);
}

/* "[17, 3]", "[5]" or "[2, 0, 1, 1]" for element k of tensor t. */
static void element_index(const dp_tensor_info *t, size_t k, char *buf, size_t cap) {
  size_t idx[4] = {0, 0, 0, 0};
  for (int d = t->ndim - 1; d >= 0; d--) {
    size_t n = d ? (size_t)t->dims[d] : SIZE_MAX; /* the first takes what is left */
    idx[d] = k % n;
    k /= n;
  }
  size_t len = 0;
  for (int d = 0; d < t->ndim && len < cap; d++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%zu", d ? ", " : "[", idx[d]);
  if (len < cap) snprintf(buf + len, cap - len, "]");
}

static void print_trace_header(const dp_tensor_info *t, int nt) {
  printf(
      "trace: after every step, the loss, the parameter hash and the FNV-1a 64 hash of\n"
      "every tensor (state_dict order); '*' marks a row that differs from the reference\n");
  printf("%5s  %-18s  %-16s  %-16s", "step", "configuration", "loss", "params");
  for (int i = 0; i < nt; i++) printf("  %-16s", t[i].name);
  printf("\n");
}

/* Copies the batch of `step` (0-based): data rows at positions step*B ..
 * step*B+B-1 of the endless sequence of epoch orders. */
static int make_batch(const dpt_dataset *d, long long step, int B, uint64_t seed, int *perm,
                      int *perm_epoch, float *x, void *t) {
  for (int r = 0; r < B; r++) {
    long long pos = step * B + r;
    long long ep = pos / d->n_rows;
    if (ep > INT_MAX) return -1;
    if (ep != *perm_epoch) {
      dpt_epoch_order(d->n_rows, seed, (int)ep, perm);
      *perm_epoch = (int)ep;
    }
    int src = perm[pos % d->n_rows];
    /* the row's features, in memory or read in place (a text's bytes) */
    dpt_dataset_gather(d, NULL, &src, 0, 1, x + (size_t)r * d->n_features, NULL);
    int lw = d->label_width > 1 ? d->label_width : 1; /* T for token windows */
    if (d->label)
      memcpy((int32_t *)t + (size_t)r * lw, d->label + (size_t)src * lw,
             (size_t)lw * sizeof(int32_t));
    else
      memcpy((float *)t + (size_t)r * d->n_targets, d->y + (size_t)src * d->n_targets,
             (size_t)d->n_targets * sizeof(float));
  }
  return 0;
}

/* The state of one `dp repro` run, handed from phase to phase. */
typedef struct {
  repro_opts o;
  char err[600];
  int nc, nt, ref; /* configurations, parameter tensors, the reference (-1: none) */
  dp_model *model;
  dpt_dataset data;
  dp_tensor_info *tensors;
  run_cfg *cf;
  float *bx, *ref_params, *params;
  void *bt;
  int *perm;
  divergence div;
  int in_w, out_w, batch, tsz;
  size_t np;
  int n_refused, n_errors, n_run, n_differ;
} repro_run;

/* The data of the run: a CSV, or for a sequence model (input tokens T) a text's
 * bytes or a .npy of token ids cut into windows of T + 1 ids (as dp train's). 0, or -1
 * with the message in err. */
static int load_data(const repro_opts *o, const dp_model *m, dpt_dataset *data, char *err,
                     size_t errcap) {
  int V = 0, T = dpt_model_sequence(m, &V);
  if (!o->text && !o->tokens) {
    if (T) {
      snprintf(err, errcap,
               "%s is a sequence model (input tokens %d): give it --text FILE or --tokens "
               "F.npy, not --data",
               o->model, T);
      return -1;
    }
    dp_status s =
        dp_model_loss(m) == DP_LOSS_SOFTMAX_CE
            ? dpt_csv_load(o->data, data, err, errcap)
            : dpt_csv_load_regression(o->data, dp_model_output_width(m), data, err, errcap);
    return s ? -1 : 0;
  }
  if (!T) {
    snprintf(err, errcap,
             "%s is not a sequence model; --text and --tokens take one whose spec starts "
             "`input tokens T` (examples/tiny_gpt.dpm)",
             o->model);
    return -1;
  }
  dpt_tokens tok;
  dp_status s = o->text ? dpt_text_load(o->text, &tok, err, errcap)
                        : dpt_npy_load_tokens(o->tokens, V, &tok, err, errcap);
  if (s) return -1;
  for (size_t i = 0; o->text && i < tok.n; i++)
    if (dpt_token(&tok, i) >= V) {
      snprintf(err, errcap, "%s: byte %zu is %d, outside the model's vocabulary of %d",
               o->text, i, (int)dpt_token(&tok, i), V);
      dpt_tokens_free(&tok);
      return -1;
    }
  s = dpt_token_windows(&tok, 0, tok.n, T, data, err, errcap);
  dpt_tokens_free(&tok);
  if (!s && data->n_rows < 1) {
    snprintf(err, errcap, "%s holds fewer than T + 1 = %d ids: no window to train on",
             o->text ? o->text : o->tokens, T + 1);
    return -1;
  }
  return s ? -1 : 0;
}

/* The model, its tensors and the data, checked against each other, and the
 * buffers of the lockstep run. 0, or -1 (said). */
static int load_repro(repro_run *t) {
  const repro_opts *o = &t->o;
  char *err = t->err;
  if (dpt_load_model(o->model, &t->model, err, sizeof t->err) ||
      dpt_require_loss(o->model, t->model, NULL, err, sizeof t->err)) {
    fprintf(stderr, "dp repro: %s\n", err);
    return -1;
  }
  int in_w = t->in_w = dp_model_input_width(t->model),
      out_w = t->out_w = dp_model_output_width(t->model);
  dp_loss_kind loss_kind = dp_model_loss(t->model);
  if (model_tensors(t->model, &t->tensors, &t->nt, err, sizeof t->err)) {
    fprintf(stderr, "dp repro: %s\n", err);
    return -1;
  }
  dpt_dataset *data = &t->data;
  if (load_data(o, t->model, data, err, sizeof t->err)) {
    fprintf(stderr, "dp repro: %s\n", err);
    return -1;
  }
  (void)loss_kind;
  if (data->n_features != in_w) {
    dpt_width_mismatch(err, sizeof t->err, o->data, o->model, data, in_w, 1);
    fprintf(stderr, "dp repro: %s\n", err);
    return -1;
  }
  if (data->label && data->label_width <= 1 && data->n_classes > out_w) {
    fprintf(stderr, "dp repro: %s has labels up to %d; the model has %d outputs\n", o->data,
            data->n_classes - 1, out_w);
    return -1;
  }
  if ((long long)o->steps * o->base.batch / data->n_rows >= INT_MAX) {
    fprintf(stderr, "dp repro: %d steps of %d rows are too many passes over %d rows\n",
            o->steps, o->base.batch, data->n_rows);
    return -1;
  }
  if (!o->no_standardize && !dpt_model_sequence(t->model, NULL))
    dpt_standardize(data, NULL);

  size_t np = t->np = dp_model_n_params(t->model);
  int B = t->batch = o->base.batch;
  t->tsz = data->label
               ? (data->label_width > 1 ? data->label_width : 1) * (int)sizeof(int32_t)
               : out_w * (int)sizeof(float);
  t->bx = malloc((size_t)B * in_w * sizeof *t->bx);
  t->bt = malloc((size_t)B * t->tsz);
  t->perm = malloc((size_t)data->n_rows * sizeof *t->perm);
  t->ref_params = malloc((np ? np : 1) * sizeof *t->ref_params);
  t->params = malloc((np ? np : 1) * sizeof *t->params);
  if (!t->bx || !t->bt || !t->perm || !t->ref_params || !t->params) {
    fprintf(stderr, "dp repro: out of memory\n");
    return -1;
  }
  return 0;
}

/* Under mpirun, before any context: every rank's model, data as read and
 * options the same as rank 0's (tools/agree.h), or the job ends on every rank
 * with rank 0's one message. 0, or -1 (said). */
static int agree_repro(repro_run *t) {
  const repro_opts *o = &t->o;
  char extra[64 * DP_MAX_DEVICES + 64], err[1024];
  size_t at =
      (size_t)snprintf(extra, sizeof extra, "%s=", o->layouts ? "layouts" : "devices");
  for (int i = 0; i < o->n_counts && at < sizeof extra; i++)
    at += (size_t)(o->layouts
                       ? snprintf(extra + at, sizeof extra - at, "%s%dx%d", i ? "," : "",
                                  o->ranks[i], o->counts[i] / o->ranks[i])
                       : snprintf(extra + at, sizeof extra - at, "%s%d", i ? "," : "",
                                  o->counts[i]));
  for (int j = 0; j < o->n_modes && at < sizeof extra; j++)
    at += (size_t)snprintf(extra + at, sizeof extra - at, "%s%s",
                           j ? "," : " mode=", rm_names[o->modes[j]]);
  dpt_train_inputs in = {.model = t->model,
                         .data = &t->data,
                         .cfg = &o->base,
                         .standardize = !o->no_standardize,
                         .steps = o->steps,
                         .extra = extra};
  if (!dpt_agree_train(&in, err, sizeof err)) return 0;
  if (*err) fprintf(stderr, "dp repro: %s\n", err);
  return -1;
}

/* Every configuration: plan and context, all alive for the lockstep run; a
 * refused one keeps its message. 0, or -1 (said). */
static int make_configs(repro_run *t) {
  const repro_opts *o = &t->o;
  /* The configurations step one after the other: the largest count decides
   * whether the virtual devices have a CPU each. */
  int max_count = 0;
  for (int i = 0; i < o->n_counts; i++)
    max_count = o->counts[i] > max_count ? o->counts[i] : max_count;
  dpt_warn_oversubscribed(stderr, "dp repro", max_count, o->base.backend, dpt_cpu_count());

  for (int i = 0; i < o->n_counts; i++)
    for (int j = 0; j < o->n_modes; j++) {
      run_cfg *c = &t->cf[i * o->n_modes + j];
      c->n_devices = o->counts[i];
      c->ranks = o->ranks[i];
      c->mode = o->modes[j];
      if (o->layouts)
        snprintf(c->layout, sizeof c->layout, "%dx%d", c->ranks, c->n_devices / c->ranks);
      else
        snprintf(c->layout, sizeof c->layout, "%d device%s", c->n_devices,
                 c->n_devices == 1 ? "" : "s");
      snprintf(c->label, sizeof c->label, "%s %s", c->layout, rm_names[c->mode]);
      c->cfg = o->base;
      c->cfg.n_devices = c->n_devices;
      c->cfg.ranks = c->ranks;
      c->cfg.mode = c->mode == RM_CLASSIC ? DP_MODE_CLASSIC : DP_MODE_ALLREDUCE;
      c->cfg.shard_optimizer = c->mode == RM_SHARDED;
      c->th = calloc((size_t)t->nt + 1, sizeof *c->th);
      if (!c->th) {
        fprintf(stderr, "dp repro: out of memory\n");
        return -1;
      }
      c->here = 1;
      /* a layout of R processes runs on the job's first R (collective) */
      if (dpt_world_layout_msg(c->ranks, c->msg, sizeof c->msg) ||
          dp_plan_create(t->model, &c->cfg, &c->plan) ||
          dpt_ctx_create_part(c->plan, &c->ctx, &c->here)) {
        c->status = ST_REFUSED;
        if (!*c->msg) snprintf(c->msg, sizeof c->msg, "%s", dpt_user_msg(dp_last_error()));
        t->n_refused++;
      } else if (t->ref < 0 && c->here) {
        t->ref = i * o->n_modes + j;
      }
    }
  return 0;
}

/* What the run compares, before the first step: the JSON document's head or
 * the text's. */
static void print_header(const repro_run *t) {
  const repro_opts *o = &t->o;
  const dpt_dataset *data = &t->data;
  int B = t->batch, nc = t->nc;
  if (o->json) {
    printf("{\n  \"model\": ");
    dpt_json_string(stdout, o->model);
    printf(",\n  \"data\": ");
    dpt_json_string(stdout, o->data);
    printf(
        ",\n  \"rows\": %d,\n  \"steps\": %d,\n  \"batch\": %d,\n  \"micro_batch\": %d,\n",
        data->n_rows, o->steps, B, o->base.micro_batch);
    printf("  \"split\": \"%s\",\n  \"optimizer\": \"%s\",\n  \"lr\": ",
           dp_split_name(o->base.split), dp_optimizer_name(o->base.optimizer));
    json_float(stdout, o->base.lr);
    printf(",\n  \"seed\": %llu,\n  \"batchnorm\": \"%s\",\n  \"backend\": \"%s\",\n"
           "  \"backend_options\": ",
           (unsigned long long)o->base.seed, dp_bn_mode_name(o->base.batchnorm),
           dp_backend_name(o->base.backend));
    dpt_json_string(stdout, o->base.backend_options);
    printf(",\n  \"tensors\": [");
    for (int i = 0; i < t->nt; i++) {
      printf("%s\n    {\"name\": \"%s\", \"shape\": [%d", i ? "," : "", t->tensors[i].name,
             t->tensors[i].dims[0]);
      for (int d = 1; d < t->tensors[i].ndim; d++) printf(", %d", t->tensors[i].dims[d]);
      printf("]}");
    }
    printf("\n  ]");
    if (o->trace) printf(",\n  \"trace\": [");
    return;
  }
  printf("dp repro: %s on %s: %d rows, %d features, %s\n", o->model, o->data, data->n_rows,
         data->n_features, data->label ? "classification" : "regression");
  printf("%d steps of batch %d (%s split, micro-batch ", o->steps, B,
         dp_split_name(o->base.split));
  if (o->base.micro_batch > 0)
    printf("%d", o->base.micro_batch);
  else
    printf("= each device's chunk");
  const char *bo = o->base.backend_options;
  printf("), %s lr %g, seed %llu, %s backend%s%s%s%s%s; %d configuration%s\n",
         dp_optimizer_name(o->base.optimizer), (double)o->base.lr,
         (unsigned long long)o->base.seed, dp_backend_name(o->base.backend),
         *bo ? " (" : "", bo, *bo ? ")" : "",
         o->base.batchnorm == DP_BN_SYNC ? ", batchnorm " : "",
         o->base.batchnorm == DP_BN_SYNC ? dp_bn_mode_name(o->base.batchnorm) : "", nc,
         nc == 1 ? "" : "s");
  if (o->base.micro_batch == 0 && nc > 1)
    printf("note: without --micro-batch the bits are not expected to match across device "
           "counts\n");
  printf("\n");
  if (o->trace && t->ref >= 0) print_trace_header(t->tensors, t->nt);
}

/* The first divergence, at `step`, of configuration k (parameters w) from the
 * reference: in tensor ti (the largest difference in it), or in the loss
 * alone (ti < 0). */
static void record_divergence(repro_run *t, int step, int k, int ti, const float *w) {
  divergence *div = &t->div;
  const run_cfg *c = &t->cf[k], *rc = &t->cf[t->ref];
  div->step = step;
  div->cfg = k;
  div->tensor = ti;
  if (ti < 0) {
    div->ref_value = rc->loss;
    div->value = c->loss;
    div->max_diff = fabs((double)c->loss - (double)rc->loss);
    return;
  }
  const dp_tensor_info *ten = &t->tensors[ti];
  const float *a = t->ref_params + ten->offset, *b = w + ten->offset;
  div->max_diff = 0.0;
  div->at = ten->numel;
  for (size_t e = 0; e < ten->numel; e++) {
    int bits_differ = float_bits(a[e]) != float_bits(b[e]);
    double d = fabs((double)a[e] - (double)b[e]);
    if (d != d) d = bits_differ ? INFINITY : 0.0; /* NaN: the largest */
    /* the largest difference; failing any (-0 vs +0), the first element
     * whose bits differ */
    if (d > div->max_diff || (div->at == ten->numel && bits_differ)) {
      div->max_diff = d > div->max_diff ? d : div->max_diff;
      div->at = e;
    }
  }
  div->ref_value = a[div->at];
  div->value = b[div->at];
}

/* Configuration k after `step` against the reference: 1 when its bits
 * differ (the first divergence recorded). */
static int compare_to_ref(repro_run *t, int step, int k, const float *w) {
  run_cfg *c = &t->cf[k];
  const run_cfg *rc = &t->cf[t->ref];
  int ti = -1;
  for (int i = 0; i < t->nt && ti < 0; i++)
    if (c->th[i] != rc->th[i]) ti = i;
  int differs = ti >= 0 || float_bits(c->loss) != float_bits(rc->loss);
  if (differs && !c->div_step) c->div_step = step;
  if (differs && !t->div.step) record_divergence(t, step, k, ti, w);
  return differs;
}

/* --trace: configuration c's line (or JSON object) after `step`. */
static void print_trace(const repro_run *t, const run_cfg *c, int step, int differs,
                        int first) {
  if (t->o.json) {
    printf("%s\n    {\"step\": %d, \"devices\": %d, \"mode\": \"%s\", \"loss\": ",
           first ? "" : ",", step, c->n_devices, rm_names[c->mode]);
    json_float(stdout, c->loss);
    printf(", \"loss_bits\": \"%08x\", \"params_hash\": ", (unsigned)float_bits(c->loss));
    json_hash(stdout, c->hash);
    printf(", \"tensor_hashes\": [");
    for (int i = 0; i < t->nt; i++) {
      if (i) printf(", ");
      json_hash(stdout, c->th[i]);
    }
    printf("], \"same\": %s}", differs ? "false" : "true");
  } else {
    printf("%5d  %-18s  %-16.9g  %016llx", step, c->label, (double)c->loss,
           (unsigned long long)c->hash);
    for (int i = 0; i < t->nt; i++) printf("  %016llx", (unsigned long long)c->th[i]);
    printf("%s\n", differs ? "  *" : "");
  }
}

/* One step of configuration k on the batch in bx/bt, its hashes taken.
 * 0, or -1: the step failed (the configuration marked, its message kept). */
static int step_config(repro_run *t, int k, int step, float *w) {
  run_cfg *c = &t->cf[k];
  int B = t->batch;
  /* a layout of several processes: this one feeds its rows */
  int r0 = 0, nr = B;
  if (c->ranks > 1) dp_plan_rank_rows(c->plan, B, dpt_world_rank(), &r0, &nr);
  if (dp_train_step(c->ctx, B, t->in_w, t->bx + (size_t)r0 * t->in_w,
                    (char *)t->bt + (size_t)r0 * t->tsz, &c->loss) ||
      dp_get_params(c->ctx, w, t->np)) {
    c->status = ST_ERROR;
    snprintf(c->msg, sizeof c->msg, "step %d: %s", step,
             dpt_user_msg(dp_ctx_error(c->ctx)));
    t->n_errors++;
    return -1;
  }
  c->hash = dp_params_hash(c->ctx);
  for (int i = 0; i < t->nt; i++)
    c->th[i] = fnv1a(w + t->tensors[i].offset, t->tensors[i].numel);
  return 0;
}

/* The lockstep run: every configuration takes each step on the same batch,
 * and is compared with the reference after it. 0, or -1 (said). */
static int run_lockstep(repro_run *t) {
  const repro_opts *o = &t->o;
  int perm_epoch = -1, first_trace = 1, ref = t->ref;
  for (int step = 1; step <= o->steps && ref >= 0; step++) {
    if (make_batch(&t->data, step - 1, t->batch, o->base.seed, t->perm, &perm_epoch, t->bx,
                   t->bt)) {
      fprintf(stderr, "dp repro: step %d: position out of range\n", step);
      return -1;
    }
    int ref_alive = t->cf[ref].status == ST_OK;
    for (int k = 0; k < t->nc; k++) {
      run_cfg *c = &t->cf[k];
      if (c->status != ST_OK || !c->here) continue;
      float *w = k == ref ? t->ref_params : t->params;
      if (step_config(t, k, step, w)) {
        if (k == ref) ref_alive = 0;
        continue;
      }
      int differs = k != ref && ref_alive && compare_to_ref(t, step, k, w);
      if (o->trace) {
        print_trace(t, c, step, differs, first_trace);
        first_trace = 0;
      }
    }
  }
  return 0;
}

/* The report's JSON: the configurations, the divergence, the result. */
static void report_json(const repro_run *t, const char *result, const char *where,
                        int exit_status) {
  const divergence *div = &t->div;
  const run_cfg *cf = t->cf;
  int ref = t->ref;
  if (t->o.trace) printf("\n  ]");
  printf(",\n  \"configurations\": [");
  for (int k = 0; k < t->nc; k++) {
    const run_cfg *c = &cf[k];
    static const char *const st[] = {"ok", "refused", "error"};
    printf("%s\n    {\"devices\": %d, \"ranks\": %d, \"mode\": \"%s\", \"status\": \"%s\"",
           k ? "," : "", c->n_devices, c->ranks, rm_names[c->mode], st[c->status]);
    if (c->status != ST_OK) {
      printf(", \"message\": ");
      dpt_json_string(stdout, c->msg);
    }
    if (c->status == ST_OK) {
      printf(", \"final_loss\": ");
      json_float(stdout, c->loss);
      printf(", \"loss_bits\": \"%08x\", \"params_hash\": ", (unsigned)float_bits(c->loss));
      json_hash(stdout, c->hash);
    }
    printf(", \"reference\": %s, \"same\": %s, \"first_diverging_step\": ",
           k == ref ? "true" : "false",
           c->status == ST_OK && !c->div_step ? "true" : "false");
    if (c->div_step)
      printf("%d}", c->div_step);
    else
      printf("null}");
  }
  printf("\n  ],\n  \"divergence\": ");
  if (div->step) {
    printf("{\"step\": %d, \"tensor\": ", div->step);
    dpt_json_string(stdout, div->tensor >= 0 ? t->tensors[div->tensor].name : "loss");
    printf(", \"reference\": {\"devices\": %d, \"mode\": \"%s\"}, ", cf[ref].n_devices,
           rm_names[cf[ref].mode]);
    printf("\"other\": {\"devices\": %d, \"mode\": \"%s\"}, \"max_abs_diff\": ",
           cf[div->cfg].n_devices, rm_names[cf[div->cfg].mode]);
    json_number(stdout, div->max_diff);
    printf(", \"index\": ");
    dpt_json_string(stdout, div->tensor >= 0 ? where : NULL);
    printf(", \"reference_value\": ");
    json_float(stdout, div->ref_value);
    printf(", \"value\": ");
    json_float(stdout, div->value);
    printf("}");
  } else {
    printf("null");
  }
  printf(",\n  \"result\": \"%s\",\n  \"exit_status\": %d\n}\n", result, exit_status);
}

/* The report's table: a line per configuration. */
static void report_table(const repro_run *t) {
  const repro_opts *o = &t->o;
  const run_cfg *cf = t->cf;
  int ref = t->ref;
  if (o->trace && ref >= 0) printf("\n");
  printf("%7s  %-9s  %-16s  %-16s  %s\n", o->layouts ? "layout" : "devices", "mode",
         "final loss", "params hash", ref >= 0 ? "vs reference" : "");
  for (int k = 0; k < t->nc; k++) {
    const run_cfg *c = &cf[k];
    if (o->layouts)
      printf("%7s  %-9s  ", c->layout, rm_names[c->mode]);
    else
      printf("%7d  %-9s  ", c->n_devices, rm_names[c->mode]);
    if (c->status == ST_REFUSED) {
      printf("refused: %s\n", c->msg);
    } else if (c->status == ST_ERROR) {
      printf("error at %s\n", c->msg);
    } else {
      printf("%-16.9g  %016llx  ", (double)c->loss, (unsigned long long)c->hash);
      if (k == ref)
        printf("reference\n");
      else if (c->div_step)
        printf("DIFFERS from step %d\n", c->div_step);
      else if (cf[ref].status != ST_OK)
        printf("?\n");
      else
        printf("same\n");
    }
  }
  printf("\n");
}

/* The report's text: the table, then the verdict. */
static void report_text(const repro_run *t, const char *where) {
  const repro_opts *o = &t->o;
  const divergence *div = &t->div;
  const run_cfg *cf = t->cf;
  int ref = t->ref, n_run = t->n_run, n_errors = t->n_errors, n_refused = t->n_refused;
  report_table(t);
  if (div->step) {
    const run_cfg *c = &cf[div->cfg];
    printf("DIFFERS: first divergence at step %d, ", div->step);
    if (div->tensor >= 0) {
      const dp_tensor_info *ten = &t->tensors[div->tensor];
      printf("tensor %s (", ten->name);
      for (int d = 0; d < ten->ndim; d++) printf("%s%d", d ? " x " : "", ten->dims[d]);
      printf("), between %s (the reference) and %s: max abs difference %.9g at %s%s "
             "(%.9g vs %.9g)\n",
             cf[ref].label, c->label, div->max_diff, ten->name, where,
             (double)div->ref_value, (double)div->value);
    } else {
      printf("the loss (every parameter tensor the same), between %s (the reference) and "
             "%s: %.9g vs %.9g, difference %.9g\n",
             cf[ref].label, c->label, (double)div->ref_value, (double)div->value,
             div->max_diff);
    }
    printf("%d of %d configurations differ from the reference\n", t->n_differ, n_run);
  } else if (ref >= 0 && !n_errors) {
    printf("same: %d configuration%s gave the same bits (every parameter tensor and the "
           "loss) after each of %d step%s\n",
           n_run, n_run == 1 ? "" : "s", o->steps, o->steps == 1 ? "" : "s");
  }
  if (n_errors)
    printf("%d configuration%s failed during training\n", n_errors,
           n_errors == 1 ? "" : "s");
  if (ref < 0)
    printf("no configuration could run: all %d were refused\n", t->nc);
  else if (n_refused)
    printf("%d configuration%s refused%s\n", n_refused, n_refused == 1 ? "" : "s",
           o->skip_refused ? " (skipped: --skip-refused)"
                           : " (exit status 2; "
                             "--skip-refused to ignore)");
}

/* The report; returns the exit status it states. */
static int report(repro_run *t) {
  for (int k = 0; k < t->nc; k++) {
    if (t->cf[k].status != ST_REFUSED) t->n_run++;
    if (t->cf[k].div_step) t->n_differ++;
  }
  int exit_status = DPT_EXIT_OK;
  if (t->n_differ || t->n_errors)
    exit_status = DPT_EXIT_FAIL;
  else if (t->ref < 0 || (t->n_refused && !t->o.skip_refused))
    exit_status = DPT_EXIT_USAGE;
  const char *result = t->n_differ   ? "differs"
                       : t->n_errors ? "error"
                       : t->ref < 0  ? "refused"
                                     : "same";
  char where[64] = "";
  if (t->div.step && t->div.tensor >= 0)
    element_index(&t->tensors[t->div.tensor], t->div.at, where, sizeof where);
  if (t->o.json)
    report_json(t, result, where, exit_status);
  else
    report_text(t, where);
  return exit_status;
}

static void free_repro(repro_run *t) {
  for (int k = 0; k < t->nc; k++) {
    dp_ctx_free(t->cf[k].ctx);
    dp_plan_free(t->cf[k].plan);
    free(t->cf[k].th);
  }
  free(t->cf);
  free(t->bx);
  free(t->bt);
  free(t->perm);
  free(t->ref_params);
  free(t->params);
  free(t->tensors);
  dpt_dataset_free(&t->data);
  dp_model_free(t->model);
}

int dpt_cmd_repro(int argc, char **argv) {
  repro_run t = {.ref = -1};
  int r = parse_repro_args(argc, argv, &t.o, t.err, sizeof t.err);
  if (r == DPT_ARGS_HELP) {
    usage(stdout);
    return DPT_EXIT_OK;
  }
  if (r != DPT_ARGS_OK) {
    return dpt_usage_error("repro", t.err, "(see dp repro --help)");
  }
  if (dpt_require_backend(&t.o.base, t.err, sizeof t.err)) {
    fprintf(stderr, "dp repro: %s\n", t.err);
    return DPT_EXIT_FAIL;
  }
  t.nc = t.o.n_counts * t.o.n_modes;
  t.cf = calloc((size_t)t.nc, sizeof *t.cf);
  if (!t.cf) {
    fprintf(stderr, "dp repro: out of memory\n");
    return DPT_EXIT_FAIL;
  }
  int rc = DPT_EXIT_FAIL;
  /* under mpirun every rank loads its own inputs: a rank that failed (its data
   * file missing on its host) is known to every rank before the collective
   * context creation, which would wait for it forever (an outside check), and
   * ranks given other data or options end the job, not a verdict of DIFFERS */
  int bad = dpt_world_max_int(load_repro(&t) ? 1 : 0);
  if (bad) dpt_world_failed_together();
  if (!bad && !agree_repro(&t) && !make_configs(&t)) {
    print_header(&t);
    if (!run_lockstep(&t)) rc = report(&t);
  }
  rc = dpt_world_bcast_int(rc); /* rank 0 took part in every configuration */
  /* every rank has the job's status and leaves by itself: a refused layout is an
   * exit status, not Open MPI's abort banner (an outside check, session 24) */
  dpt_world_failed_together();
  fflush(stdout);
  free_repro(&t);
  return rc;
}
