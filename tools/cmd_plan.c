/* `dp plan`: plans every byte of a data-parallel step without running it and
 * prints the per-device arena layout (table, JSON or SVG), the largest batch
 * that fits a budget, and the static schedule. */
#include "cli.h"
#include "svg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  OPT_MODEL = DPT_OPT_USER,
  OPT_JSON,
  OPT_SVG,
  OPT_BUDGET,
  OPT_SCHEDULE,
  OPT_FIT,
  OPT_FIT_ALLOW,
  OPT_FIT_COSTS
};

static const struct option plan_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"json", no_argument, NULL, OPT_JSON},
    {"svg", required_argument, NULL, OPT_SVG},
    {"budget", required_argument, NULL, OPT_BUDGET},
    {"schedule", no_argument, NULL, OPT_SCHEDULE},
    {"fit", no_argument, NULL, OPT_FIT},
    {"fit-allow", required_argument, NULL, OPT_FIT_ALLOW},
    {"fit-costs", required_argument, NULL, OPT_FIT_COSTS},
    {0, 0, 0, 0},
};

typedef struct {
  const char *model, *svg;
  int json, schedule, budget_set, fit, fit_extra;
  size_t budget;
  unsigned fit_allow;
  dp_fit_costs costs;
} plan_opts;

/* Search cap of --budget when --batch is absent. */
#define DEFAULT_BATCH_CAP (1 << 20)

/* Region descriptions for --help, and short phrases for the device-0 line. */
static const char *const region_help[DP_REGION_COUNT] = {
    [DP_REGION_PARAMS] = "model parameters, fp32, PyTorch state_dict order",
    [DP_REGION_GRADS] = "gradients (on device 0: reduced over all devices)",
    [DP_REGION_GRAD_PARTIALS] = "partial sums of the canonical gradient tree",
    [DP_REGION_OPT_STATE] = "momentum buffer, or Adam(W)'s (m, v[, v_hat])",
    [DP_REGION_INPUTS] = "this device's input chunk (rows, in)",
    [DP_REGION_TARGETS] = "the batch's targets, on the loss device",
    [DP_REGION_ACTIVATIONS] = "intermediate buffers, placed by liveness",
    [DP_REGION_OUTPUTS] = "this device's output chunk (rows, out)",
    [DP_REGION_OUTPUT_GRADS] = "d(loss)/d(outputs) scattered back (rows, out)",
    [DP_REGION_GATHERED_OUTPUTS] = "all outputs gathered on device 0 (batch, out)",
    [DP_REGION_GATHERED_GRADS] = "their gradients, on device 0 (batch, out)",
    [DP_REGION_LOSS] = "per-micro-batch loss sums",
    [DP_REGION_COMM] = "receive buffer for gradient reductions",
    [DP_REGION_WORKSPACE] = "backend scratch",
};
static const char *const region_phrase[DP_REGION_COUNT] = {
    [DP_REGION_PARAMS] = "parameters",
    [DP_REGION_GRADS] = "gradients",
    [DP_REGION_GRAD_PARTIALS] = "partial gradient sums",
    [DP_REGION_OPT_STATE] = "optimizer state",
    [DP_REGION_INPUTS] = "inputs",
    [DP_REGION_TARGETS] = "targets",
    [DP_REGION_ACTIVATIONS] = "activations",
    [DP_REGION_OUTPUTS] = "outputs",
    [DP_REGION_OUTPUT_GRADS] = "output gradients",
    [DP_REGION_GATHERED_OUTPUTS] = "gathered outputs",
    [DP_REGION_GATHERED_GRADS] = "gathered output gradients",
    [DP_REGION_LOSS] = "loss",
    [DP_REGION_COMM] = "comm buffer",
    [DP_REGION_WORKSPACE] = "workspace",
};

static void plan_help(FILE *f) {
  fputs("usage: dp plan --model FILE --batch B [--devices N|LIST] [options]\n"
        "       dp plan --model FILE --budget SIZE [--batch MAX] [options]\n"
        "\n"
        "Plans one data-parallel step without running it: loads the model spec, cuts\n"
        "the batch across the devices along dim 0 and lays out every device's arena.\n"
        "The numbers are exactly the ones the runtime uses (dp train, dp_ctx_create).\n"
        "\n"
        "Plan options:\n"
        "  --model FILE            model spec (.dpm), one layer per line (required)\n"
        "  --json                  print the plan as JSON instead of the table\n"
        "  --svg FILE              also write a stacked-bar chart of each device's arena\n"
        "  --budget SIZE           memory budget per device, e.g. 80GiB, 512MiB, 1.5GB,\n"
        "                          64KiB, 1000 (kB/MB/GB/TB = powers of 1000, KiB/MiB/\n"
        "                          GiB/TiB = powers of 1024): finds the largest batch\n"
        "                          whose plan fits on every device (and in the host\n"
        "                          staging arena), then prints the plan at that batch.\n"
        "                          --batch, if given, caps the search (default cap\n"
        "                          1048576). Exit status 1 when not even batch 1 fits.\n"
        "  --schedule              also print the static schedule: every op of one step\n"
        "  --fit                   with --budget and --batch: the configuration that fits\n"
        "                          the budget and has the shortest estimated step, its\n"
        "                          plan, and the runner-ups (see below)\n"
        "  --fit-allow LIST        what --fit may change, comma-separated: mode, shard,\n"
        "                          split, recompute, micro-batch, bf16, backend, or all\n"
        "                          (default mode,shard,split,recompute,backend: the ones\n"
        "                          that keep the bits, but for the unequal cut a balanced\n"
        "                          or memory split can make; micro-batch and bf16 change\n"
        "                          them;\n"
        "                          backend: the backend's options that keep the results,\n"
        "                          the cpu backend's params=shared, where not given)\n"
        "  --fit-costs K=V,...     the cost model's numbers (gflops, half_rows, mem_gbs,\n"
        "                          op_us, bf16_gflops; docs/PLANNER.md says how dp bench\n"
        "                          measures them)\n"
        "  -h, --help              this text\n"
        "\n",
        f);
  dpt_print_common_help(f);
  fputs("\n"
        "The table has one column per device that gets rows (with --split chunk, fewer\n"
        "devices than --devices may get any: B=3 on 4 devices uses 3). Its first rows\n"
        "are each device's rows and micro-batches; then one row per arena region, in\n"
        "arena order, in exact bytes (regions empty on every device are left out):\n",
        f);
  for (int r = 0; r < DP_REGION_COUNT; r++)
    fprintf(f, "    %-18s %s\n", dp_region_name((dp_region)r), region_help[r]);
  fputs("\"total\" is the device's whole arena including alignment padding: the bytes\n"
        "dp_ctx_create allocates (or dp_ctx_create_static needs) and the runtime's\n"
        "high-water mark. Parameters are replicated, never split (with the cpu\n"
        "backend's --backend-option params=shared only device 0 holds them, each\n"
        "rank's first device under mpirun); activations shrink with the per-device\n"
        "batch; in classic mode device 0 holds more (gathered outputs and their\n"
        "gradients, targets, loss, reduction buffer, optimizer state) and the line\n"
        "under the table says by how much and why. \"host staging\" is the pinned\n"
        "host arena (inputs, targets, outputs) of a step.\n"
        "\n"
        "A job of several processes (--ranks R; no MPI is needed to plan one): global\n"
        "device g belongs to rank g / (devices / R). The table gains a \"rank\" row,\n"
        "and below it comes what each rank's process holds: its global devices, its\n"
        "rows of the batch ([first, end), the rows it feeds) and its arena bytes (the\n"
        "sum over its devices), with the plan hash every rank of the job must share.\n"
        "--json gives each device its \"rank\" and adds \"plan_hash\" and a \"ranks\"\n"
        "array of {rank, devices, row0, rows, bytes} (one entry for one process);\n"
        "--svg labels each bar with its rank. A device count that is not a multiple\n"
        "of R is refused (exit 1).\n"
        "\n"
        "--schedule lists the ops of one step: index, stage (ops of one stage on\n"
        "different devices run in parallel), phase, op kind, executing device, layer,\n"
        "global micro-batch, rows covered, and for copies source -> destination as\n"
        "device:region[+offset] (\"host\" = the caller's memory), then bytes moved or\n"
        "touched.\n"
        "\n"
        "--fit plans every configuration --fit-allow opens (classic or allreduce, a\n"
        "sharded optimizer, the three splits, recompute every K layers, power-of-two\n"
        "micro-batches, bf16 mixed precision, the backend's options that keep the\n"
        "results: params=shared on the cpu backend) for the batch\n"
        "given, keeps those whose largest arena is within the budget, and ranks them by\n"
        "a cost model's step time: GEMM flops at a rate that falls with fewer rows,\n"
        "bytes streamed, a cost per op, on the slowest device. It prints the chosen\n"
        "configuration and up to five runner-ups, creates a context of the chosen one\n"
        "(cpu backend) to check its arenas against the budget, then prints its plan.\n"
        "When none fits it names the smallest it found and by how much that misses.\n"
        "\n"
        "Exit status: 0 ok, 1 model or planning error, 2 usage error.\n"
        "\n"
        "Examples:\n"
        "  dp plan --model examples/seed.dpm --batch 30 --devices 2\n"
        "  dp plan --model examples/mlp.dpm --batch 4096 --devices 0,0,1,1 --json\n"
        "  dp plan --model examples/mlp.dpm --devices 8 --optimizer adamw --budget 80GiB\n"
        "  dp plan --model examples/seed.dpm --batch 30 --devices 8 --ranks 4\n",
        f);
}

/* --fit-allow: "mode,shard,split,micro-batch,..." or "all". */
static int parse_fit_allow(const char *arg, unsigned *allow, char *err, size_t errcap) {
  static const struct {
    const char *name;
    unsigned bit;
  } words[] = {{"mode", DP_FIT_MODE},           {"shard", DP_FIT_SHARD},
               {"split", DP_FIT_SPLIT},         {"micro-batch", DP_FIT_MICRO_BATCH},
               {"recompute", DP_FIT_RECOMPUTE}, {"bf16", DP_FIT_PRECISION},
               {"backend", DP_FIT_BACKEND},     {"all", DP_FIT_ALL}};
  *allow = 0;
  for (const char *p = arg; *p;) {
    size_t n = strcspn(p, ",");
    size_t i = 0;
    while (i < sizeof words / sizeof words[0] &&
           (strlen(words[i].name) != n || strncmp(words[i].name, p, n)))
      i++;
    if (i == sizeof words / sizeof words[0]) {
      snprintf(err, errcap,
               "--fit-allow: '%.*s' is not one of mode, shard, split, micro-batch, "
               "recompute, bf16, backend, all",
               (int)n, p);
      return -1;
    }
    *allow |= words[i].bit;
    p += n + (p[n] == ',');
    if (p[-1] == ',' && !*p) { /* "mode,": an empty last entry, as "," is one */
      snprintf(err, errcap, "--fit-allow: an empty entry after the last comma");
      return -1;
    }
  }
  if (!*allow) {
    snprintf(err, errcap,
             "--fit-allow: name at least one of mode, shard, split, "
             "micro-batch, recompute, bf16, backend, all");
    return -1;
  }
  return 0;
}

/* --fit-costs: "gflops=90,half_rows=8,mem_gbs=10,op_us=1", any of them. */
static int parse_fit_costs(const char *arg, dp_fit_costs *k, char *err, size_t errcap) {
  const double *given[8];
  int n_given = 0;
  for (const char *p = arg; *p;) {
    size_t n = strcspn(p, ",");
    char item[64];
    snprintf(item, sizeof item, "%.*s", (int)(n < sizeof item ? n : sizeof item - 1), p);
    char *eq = strchr(item, '='), *end = NULL;
    double v = eq ? strtod(eq + 1, &end) : 0;
    double *field = NULL;
    if (eq) {
      *eq = '\0';
      field = !strcmp(item, "gflops")        ? &k->gflops
              : !strcmp(item, "half_rows")   ? &k->half_rows
              : !strcmp(item, "mem_gbs")     ? &k->mem_gbs
              : !strcmp(item, "op_us")       ? &k->op_us
              : !strcmp(item, "bf16_gflops") ? &k->bf16_gflops
                                             : NULL;
    }
    if (!field || end == eq + 1 || *end) {
      snprintf(err, errcap,
               "--fit-costs: '%.*s' is not NAME=NUMBER with NAME one of gflops, half_rows, "
               "mem_gbs, op_us, bf16_gflops",
               (int)n, p);
      return -1;
    }
    if (!(v >= 0) || v > 1e12) {
      snprintf(err, errcap, "--fit-costs: %s=%s: give a number from 0 to 1e12", item,
               eq + 1);
      return -1;
    }
    for (int g = 0; g < n_given; g++)
      if (given[g] == field) { /* which of two values was meant is not ours to guess */
        snprintf(err, errcap, "--fit-costs: %s is given twice; give it once", item);
        return -1;
      }
    if (n_given < 8) given[n_given++] = field;
    /* rates divide: dp_plan_fit refuses 0, said here as the usage error it is */
    if (v == 0 && (field == &k->gflops || field == &k->mem_gbs)) {
      snprintf(err, errcap, "--fit-costs: %s must be above 0 (a rate)", item);
      return -1;
    }
    *field = v;
    p += n + (p[n] == ',');
    if (p[-1] == ',' && !*p) {
      snprintf(err, errcap, "--fit-costs: an empty entry after the last comma");
      return -1;
    }
  }
  return 0;
}

static int plan_option(void *user, int code, const char *arg, char *err, size_t errcap) {
  plan_opts *o = user;
  switch (code) {
  case OPT_MODEL: o->model = arg; return 0;
  case OPT_JSON: o->json = 1; return 0;
  case OPT_SVG: o->svg = arg; return 0;
  case OPT_SCHEDULE: o->schedule = 1; return 0;
  case OPT_FIT: o->fit = 1; return 0;
  case OPT_FIT_ALLOW:
    o->fit_extra = 1;
    return parse_fit_allow(arg, &o->fit_allow, err, errcap);
  case OPT_FIT_COSTS: o->fit_extra = 1; return parse_fit_costs(arg, &o->costs, err, errcap);
  case OPT_BUDGET: {
    char msg[256];
    if (dpt_parse_size(arg, &o->budget, msg, sizeof msg)) {
      snprintf(err, errcap, "--budget: %s", msg);
      return -1;
    }
    o->budget_set = 1;
    return 0;
  }
  }
  snprintf(err, errcap, "internal: unhandled option %d", code);
  return -1;
}

/* ---- helpers ------------------------------------------------------------------ */

static int region_used(const dp_plan *p, int r) {
  for (int d = 0; d < dp_plan_n_devices(p); d++)
    if (dp_plan_region(p, d, (dp_region)r).size) return 1;
  return 0;
}

/* The model spec on one line: "input 5 | linear 2 | loss mse". */
static char *model_line(const dp_model *m) {
  size_t n = dp_model_format(m, NULL, 0);
  char *s = malloc(n + 1);
  if (!s) return NULL;
  dp_model_format(m, s, n + 1);
  while (n > 0 && s[n - 1] == '\n') s[--n] = '\0';
  /* Replace each newline by " | " into a new buffer. */
  size_t nl = 0;
  for (size_t i = 0; i < n; i++) nl += s[i] == '\n';
  char *t = malloc(n + 2 * nl + 1);
  if (!t) {
    free(s);
    return NULL;
  }
  size_t j = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '\n') {
      memcpy(t + j, " | ", 3);
      j += 3;
      while (i + 1 < n && s[i + 1] == ' ') i++; /* a residual block's indent */
    } else {
      t[j++] = s[i];
    }
  }
  t[j] = '\0';
  free(s);
  return t;
}

static int largest_other_device(const dp_plan *p) {
  int k = 1;
  for (int d = 2; d < dp_plan_n_devices(p); d++)
    if (dp_plan_device_bytes(p, d) > dp_plan_device_bytes(p, k)) k = d;
  return k;
}

/* Writes "dev:region[+offset]" or "host" into buf. */
static const char *endpoint(char *buf, size_t cap, int dev, int region, size_t off) {
  if (dev == DP_HOST) {
    snprintf(buf, cap, "host");
  } else if (off) {
    snprintf(buf, cap, "%d:%s+%zu", dev, dp_region_name((dp_region)region), off);
  } else {
    snprintf(buf, cap, "%d:%s", dev, dp_region_name((dp_region)region));
  }
  return buf;
}

static void op_detail(const dp_op *op, char *buf, size_t cap) {
  char a[64], b[64];
  buf[0] = '\0';
  switch (op->kind) {
  case DP_OP_COPY:
    snprintf(buf, cap, "%s -> %s",
             endpoint(a, sizeof a, op->src_dev, op->src_region, op->src_offset),
             endpoint(b, sizeof b, op->dst_dev, op->dst_region, op->dst_offset));
    break;
  case DP_OP_GRAD_ADD:
  case DP_OP_COPY_ADD: /* --reduce-precision bf16: rounded sums, bf16 sources */
    snprintf(buf, cap, "%s += %s%s",
             endpoint(b, sizeof b, op->dst_dev, op->dst_region, op->dst_offset),
             endpoint(a, sizeof a, op->src_dev, op->src_region, op->src_offset),
             (op->flags & DP_OPF_SRC_BF16)     ? " (bf16, rounded)"
             : (op->flags & DP_OPF_ROUND_BF16) ? " (rounded)"
                                               : "");
    break;
  case DP_OP_GRAD_PACK:
  case DP_OP_GRAD_UNPACK:
    snprintf(buf, cap, "%s -> %s%s",
             endpoint(a, sizeof a, op->src_dev, op->src_region, op->src_offset),
             endpoint(b, sizeof b, op->dst_dev, op->dst_region, op->dst_offset),
             op->kind == DP_OP_GRAD_PACK ? " (to bf16)" : " (from bf16)");
    break;
  case DP_OP_BACKWARD:
    snprintf(buf, cap, "grads -> %s",
             endpoint(b, sizeof b, op->dst_dev, op->dst_region, op->dst_offset));
    break;
  default: break;
  }
}

static int n_stages(const dp_plan *p) {
  int s = -1;
  const dp_op *ops = dp_plan_ops(p);
  for (int i = 0; i < dp_plan_n_ops(p); i++)
    if (ops[i].stage > s) s = ops[i].stage;
  return s + 1;
}

/* The global devices of a rank, "2-3" (or "2" for one device per rank). */
static const char *rank_devices(const dp_plan *p, int rank, char *buf, size_t cap) {
  int L = dp_plan_local_devices(p);
  if (L == 1)
    snprintf(buf, cap, "%d", rank);
  else
    snprintf(buf, cap, "%d-%d", rank * L, rank * L + L - 1);
  return buf;
}

/* The rows of the planned batch that a rank's devices take. */
static void rank_rows(const dp_plan *p, int rank, int *row0, int *n) {
  *row0 = *n = 0;
  if (dp_plan_rank_rows(p, dp_plan_config(p)->batch, rank, row0, n) != DP_OK) *n = 0;
}

/* Under the table of a job of several ranks: what each rank's process holds. */
static void print_ranks_text(FILE *f, const dp_plan *p) {
  int nr = dp_plan_ranks(p), batch = dp_plan_config(p)->batch;
  char a[48], b[48], dev[32], range[48], of[32];
  snprintf(of, sizeof of, "of batch %d", batch);
  int dev_w = (int)strlen("devices"), range_w = (int)strlen(of);
  int bytes_w = (int)strlen("arena bytes"), human_w = 0;
  for (int r = 0; r < nr; r++) {
    int r0, n, w;
    rank_rows(p, r, &r0, &n);
    w = (int)strlen(rank_devices(p, r, dev, sizeof dev));
    if (w > dev_w) dev_w = w;
    w = snprintf(range, sizeof range, "[%d, %d)", r0, r0 + n);
    if (w > range_w) range_w = w;
    w = (int)strlen(dpt_bytes_exact(dp_plan_rank_bytes(p, r), a, sizeof a));
    if (w > bytes_w) bytes_w = w;
    w = (int)strlen(dpt_bytes_human(dp_plan_rank_bytes(p, r), a, sizeof a));
    if (w > human_w) human_w = w;
  }
  int L = dp_plan_local_devices(p);
  fprintf(f,
          "\n%d ranks x %d device%s (plan hash %016llx); what each rank's process holds:\n",
          nr, L, L == 1 ? "" : "s", (unsigned long long)dp_plan_hash(p));
  fprintf(f, "rank  %-*s  rows  %-*s  %*s\n", dev_w, "devices", range_w, of, bytes_w,
          "arena bytes");
  for (int r = 0; r < nr; r++) {
    int r0, n;
    rank_rows(p, r, &r0, &n);
    if (n > 0)
      snprintf(range, sizeof range, "[%d, %d)", r0, r0 + n);
    else
      snprintf(range, sizeof range, "-");
    size_t rb = dp_plan_rank_bytes(p, r);
    fprintf(f, "%4d  %-*s  %4d  %-*s  %*s  %*s\n", r, dev_w,
            rank_devices(p, r, dev, sizeof dev), n, range_w, range, bytes_w,
            dpt_bytes_exact(rb, a, sizeof a), human_w, dpt_bytes_human(rb, b, sizeof b));
  }
}

/* ---- text output ----------------------------------------------------------------- */

static void print_schedule_text(const dp_plan *p) {
  const dp_op *ops = dp_plan_ops(p);
  int n = dp_plan_n_ops(p);
  printf("\nschedule: %d ops in %d stages (one %s step at the planned batch)\n", n,
         n_stages(p), dp_plan_config(p)->inference ? "inference" : "training");
  printf("%5s %5s  %-13s %-10s %3s %5s %5s  %-13s %-44s %s\n", "#", "stage", "phase", "op",
         "dev", "layer", "mb", "rows", "source -> destination", "bytes");
  for (int i = 0; i < n; i++) {
    const dp_op *op = &ops[i];
    char layer[16] = "-", mb[16] = "-", rows[32] = "-", detail[160], bytes[32];
    if (op->layer >= 0) snprintf(layer, sizeof layer, "%d", op->layer);
    if (op->micro_batch >= 0) snprintf(mb, sizeof mb, "%d", (int)op->micro_batch);
    if (op->rows > 0)
      snprintf(rows, sizeof rows, "[%d,%d)", (int)op->row0, (int)(op->row0 + op->rows));
    op_detail(op, detail, sizeof detail);
    printf("%5d %5d  %-13s %-10s %3d %5s %5s  %-13s %-44s %s\n", i, (int)op->stage,
           dp_phase_name((dp_phase)op->phase), dp_op_kind_name((dp_op_kind)op->kind),
           (int)op->device, layer, mb, rows, detail[0] ? detail : "-",
           dpt_bytes_exact(op->bytes, bytes, sizeof bytes));
  }
}

static void print_text(const dp_plan *p, const char *model_path) {
  const dp_model *m = dp_plan_model(p);
  const dp_config *c = dp_plan_config(p);
  char a[48], b[48];

  size_t np = dp_model_n_params(m), pbytes = np * 4;
  char *line = model_line(m);
  int nl = dp_model_n_layers(m);
  printf("model   %s\n", model_path);
  printf("        %s\n", line ? line : "?");
  printf("        %d layer%s after input, %s parameters, %s B as fp32", nl,
         nl == 1 ? "" : "s", dpt_bytes_exact(np, a, sizeof a),
         dpt_bytes_exact(pbytes, b, sizeof b));
  if (pbytes >= 1024) printf(" (%s)", dpt_bytes_human(pbytes, a, sizeof a));
  printf("\n");
  free(line);
  printf("config  ");
  dpt_print_config(stdout, c);
  printf("\n");
  printf("\n");
  dpt_print_plan(stdout, p);
}

/* The widths of the arena table: the row names' column, each device's. */
typedef struct {
  int name_w, col_w;
} table_widths;

static const char *const TOTAL_LABEL = "total (padded)";

static table_widths table_widths_of(const dp_plan *p, int nd) {
  char a[48];
  table_widths t = {(int)strlen("micro-batches"), 8};
  if ((int)strlen(TOTAL_LABEL) > t.name_w) t.name_w = (int)strlen(TOTAL_LABEL);
  for (int r = 0; r < DP_REGION_COUNT; r++) {
    int w = (int)strlen(dp_region_name((dp_region)r));
    if (region_used(p, r) && w > t.name_w) t.name_w = w;
  }
  for (int d = 0; d < nd; d++) {
    char h[32];
    int w = snprintf(h, sizeof h, "device %d", d);
    if (w > t.col_w) t.col_w = w;
    w = (int)strlen(dpt_bytes_exact(dp_plan_device_bytes(p, d), a, sizeof a));
    if (w > t.col_w) t.col_w = w;
    w = (int)strlen(dpt_bytes_human(dp_plan_device_bytes(p, d), a, sizeof a));
    if (w > t.col_w) t.col_w = w;
  }
  return t;
}

/* The table: a column per device; the header, rank, gpu, rows and
 * micro-batch rows, a row per non-empty region, the padded total. */
static void print_arena_table(FILE *f, const dp_plan *p, int nd) {
  const dp_config *c = dp_plan_config(p);
  table_widths t = table_widths_of(p, nd);
  int name_w = t.name_w, col_w = t.col_w;
  char a[48];
  fprintf(f, "%-*s", name_w, "bytes");
  for (int d = 0; d < nd; d++) {
    char h[32];
    snprintf(h, sizeof h, "device %d", d);
    fprintf(f, "  %*s", col_w, h);
  }
  fprintf(f, "\n");
  if (dp_plan_ranks(p) > 1) {
    fprintf(f, "%-*s", name_w, "rank");
    for (int d = 0; d < nd; d++) fprintf(f, "  %*d", col_w, dp_plan_device_rank(p, d));
    fprintf(f, "\n");
  }
  if (dp_backend_caps(c->backend) & DP_BACKEND_CAP_DEVICES) {
    fprintf(f, "%-*s", name_w, "gpu");
    for (int d = 0; d < nd; d++) fprintf(f, "  %*d", col_w, c->device_ids[d]);
    fprintf(f, "\n");
  }
  fprintf(f, "%-*s", name_w, "rows");
  for (int d = 0; d < nd; d++) fprintf(f, "  %*d", col_w, dp_plan_device_rows(p, d));
  fprintf(f, "\n%-*s", name_w, "micro-batches");
  for (int d = 0; d < nd; d++)
    fprintf(f, "  %*d", col_w, dp_plan_device_micro_batches(p, d));
  fprintf(f, "\n");
  for (int r = 0; r < DP_REGION_COUNT; r++) {
    if (!region_used(p, r)) continue;
    fprintf(f, "%-*s", name_w, dp_region_name((dp_region)r));
    for (int d = 0; d < nd; d++)
      fprintf(f, "  %*s", col_w,
              dpt_bytes_exact(dp_plan_region(p, d, (dp_region)r).size, a, sizeof a));
    fprintf(f, "\n");
  }
  fprintf(f, "%-*s", name_w, TOTAL_LABEL);
  for (int d = 0; d < nd; d++)
    fprintf(f, "  %*s", col_w, dpt_bytes_exact(dp_plan_device_bytes(p, d), a, sizeof a));
  fprintf(f, "\n%-*s", name_w, "");
  for (int d = 0; d < nd; d++)
    fprintf(f, "  %*s", col_w, dpt_bytes_human(dp_plan_device_bytes(p, d), a, sizeof a));
  fprintf(f, "\n\n");
}

/* How much more device 0 holds than the largest other device, and which
 * regions make the difference. */
static void print_device0_difference(FILE *f, const dp_plan *p) {
  char a[48];
  int k = largest_other_device(p);
  size_t t0 = dp_plan_device_bytes(p, 0), tk = dp_plan_device_bytes(p, k);
  if (t0 > tk) {
    fprintf(f, "device 0 holds %s B more than device %d (",
            dpt_bytes_exact(t0 - tk, a, sizeof a), k);
    int any = 0;
    for (int r = 0; r < DP_REGION_COUNT; r++)
      if (dp_plan_region(p, 0, (dp_region)r).size >
          dp_plan_region(p, k, (dp_region)r).size) {
        fprintf(f, "%s%s", any ? ", " : "", region_phrase[r]);
        any = 1;
      }
    fprintf(f, "%s)\n", any ? "" : "alignment padding");
  } else if (t0 == tk) {
    fprintf(f, "device 0 holds the same as device %d (%s B)\n", k,
            dpt_bytes_exact(t0, a, sizeof a));
  } else {
    fprintf(f, "device %d holds %s B more than device 0\n", k,
            dpt_bytes_exact(tk - t0, a, sizeof a));
  }
}

/* config.recompute: device 0's activations with it and without it (the
 * same config planned again with recompute 0). */
static void print_recompute(FILE *f, const dp_plan *p) {
  const dp_config *c = dp_plan_config(p);
  if (c->inference || c->recompute <= 0) return;
  dp_config off = *c;
  off.recompute = 0;
  dp_plan *q = NULL;
  if (dp_plan_create(dp_plan_model(p), &off, &q) != DP_OK) return;
  char a[48], b[48];
  size_t with = dp_plan_region(p, 0, DP_REGION_ACTIVATIONS).size,
         without = dp_plan_region(q, 0, DP_REGION_ACTIVATIONS).size;
  fprintf(f, "recompute %d: device 0's activations take %s B; without recompute %s B",
          c->recompute, dpt_bytes_exact(with, a, sizeof a),
          dpt_bytes_exact(without, b, sizeof b));
  if (with <= without && without > 0)
    fprintf(f, " (%.0f%% less)", 100.0 * (double)(without - with) / (double)without);
  fputc('\n', f);
  dp_plan_free(q);
}

/* config.precision bf16: device 0's activations against fp32's (the same
 * config planned again in fp32). */
static void print_precision(FILE *f, const dp_plan *p) {
  const dp_config *c = dp_plan_config(p);
  if (c->precision == DP_PRECISION_FP32) return;
  dp_config off = *c;
  off.precision = DP_PRECISION_FP32;
  dp_plan *q = NULL;
  if (dp_plan_create(dp_plan_model(p), &off, &q) != DP_OK) return;
  char a[48], b[48];
  size_t with = dp_plan_region(p, 0, DP_REGION_ACTIVATIONS).size,
         without = dp_plan_region(q, 0, DP_REGION_ACTIVATIONS).size;
  fprintf(f, "precision %s: device 0's activations take %s B; in fp32 %s B",
          dp_precision_name(c->precision), dpt_bytes_exact(with, a, sizeof a),
          dpt_bytes_exact(without, b, sizeof b));
  if (without > 0) fprintf(f, " (%.2fx)", (double)with / (double)without);
  fputs("; parameters, gradients and optimizer state stay fp32\n", f);
  dp_plan_free(q);
}

/* What liveness saves in device 0's activations, and the host staging. */
static void print_activations_and_staging(FILE *f, const dp_plan *p) {
  const dp_config *c = dp_plan_config(p);
  char a[48], b[48];
  size_t un = dp_plan_activation_bytes_unshared(p, 0),
         act = dp_plan_region(p, 0, DP_REGION_ACTIVATIONS).size;
  if (un > act)
    fprintf(f,
            "activations: device 0's intermediate buffers would take %s B one by one; "
            "liveness places them in %s B (%.0f%% less)\n",
            dpt_bytes_exact(un, a, sizeof a), dpt_bytes_exact(act, b, sizeof b),
            100.0 * (double)(un - act) / (double)un);
  print_recompute(f, p);
  print_precision(f, p);
  size_t hb = dp_plan_host_bytes(p);
  if (hb == 0)
    fprintf(f,
            "host staging: 0 B (the %s backend reads and writes the caller's memory "
            "directly)\n",
            dp_backend_name(c->backend));
  else
    fprintf(f,
            "host staging: %s B (%s), pinned host memory for a step's inputs, targets "
            "and outputs\n",
            dpt_bytes_exact(hb, a, sizeof a), dpt_bytes_human(hb, b, sizeof b));
}

void dpt_print_plan(FILE *f, const dp_plan *p) {
  const dp_config *c = dp_plan_config(p);
  int nd = dp_plan_n_devices(p);
  if (nd < c->n_devices)
    fprintf(
        f,
        "only %d of %d devices get rows (%s split of %d rows); the rest hold nothing\n\n",
        nd, c->n_devices, dp_split_name(c->split), c->batch);
  print_arena_table(f, p, nd);
  if (nd > 1) print_device0_difference(f, p);
  print_activations_and_staging(f, p);
  if (dp_plan_ranks(p) > 1) print_ranks_text(f, p);
}

/* ---- JSON output ------------------------------------------------------------------ */

static void print_json(const dp_plan *p, const char *model_path, const plan_opts *o,
                       int budget_batch, int budget_cap) {
  const dp_model *m = dp_plan_model(p);
  const dp_config *c = dp_plan_config(p);
  int nd = dp_plan_n_devices(p);
  FILE *f = stdout;
  char fl[9][32];

  size_t n = dp_model_format(m, NULL, 0);
  char *spec = malloc(n + 1);
  if (spec) dp_model_format(m, spec, n + 1);

  fputs("{\n  \"model\": {\"path\": ", f);
  dpt_json_string(f, model_path);
  fprintf(f, ", \"input_width\": %d, \"output_width\": %d, \"n_layers\": %d, \"layers\": [",
          dp_model_input_width(m), dp_model_output_width(m), dp_model_n_layers(m));
  for (int i = 0; i < dp_model_n_layers(m); i++) {
    fputs(i ? ", " : "", f);
    dpt_json_string(f, dp_layer_kind_name(dp_model_layer_kind(m, i)));
  }
  fputs("], \"loss\": ", f);
  dpt_json_string(f, dp_loss_name(dp_model_loss(m)));
  fprintf(f, ", \"n_params\": %zu, \"param_bytes\": %zu, \"spec\": ", dp_model_n_params(m),
          dp_model_n_params(m) * 4);
  dpt_json_string(f, spec ? spec : "");
  free(spec);

  fprintf(f,
          "},\n  \"config\": {\"batch\": %d, \"n_devices\": %d, \"ranks\": %d, "
          "\"device_ids\": [",
          c->batch, c->n_devices, dp_plan_ranks(p));
  for (int d = 0; d < c->n_devices && d < DP_MAX_DEVICES; d++)
    fprintf(f, "%s%d", d ? ", " : "", c->device_ids[d]);
  /* the backend's options as the plan has them, every one with its value */
  char bo[256], tv[32];
  dp_plan_backend_options(p, bo, sizeof bo);
  const char *transport = dpt_backend_option_get(bo, "transport", tv, sizeof tv)
                              ? tv
                              : dp_transport_name(c->transport);
  fprintf(
      f,
      "], \"n_devices_used\": %d, \"split\": \"%s\", \"micro_batch\": %d, "
      "\"mode\": \"%s\", \"optimizer\": \"%s\", \"inference\": %s, \"backend\": \"%s\", "
      "\"lr\": %s, \"momentum\": %s, \"weight_decay\": %s, \"beta1\": %s, "
      "\"beta2\": %s, \"eps\": %s, \"seed\": %llu, \"cuda_graph\": %s, \"tf32\": %s, "
      "\"transport\": \"%s\", \"fast_collectives\": %s, \"backend_options\": ",
      nd, dp_split_name(c->split), c->micro_batch, dp_mode_name(c->mode),
      dp_optimizer_name(c->optimizer), c->inference ? "true" : "false",
      dp_backend_name(c->backend), dpt_float_text(c->lr, fl[0], sizeof fl[0]),
      dpt_float_text(c->momentum, fl[1], sizeof fl[1]),
      dpt_float_text(c->weight_decay, fl[2], sizeof fl[2]),
      dpt_float_text(c->beta1, fl[3], sizeof fl[3]),
      dpt_float_text(c->beta2, fl[4], sizeof fl[4]),
      dpt_float_text(c->eps, fl[5], sizeof fl[5]), (unsigned long long)c->seed,
      dpt_backend_option_on(bo, "graph") ? "true" : "false",
      dpt_backend_option_on(bo, "tf32") ? "true" : "false", transport,
      dpt_backend_option_on(bo, "fast_collectives") ? "true" : "false");
  dpt_json_string(f, bo);
  /* the rest of the run's settings (an outside check: a reader could not tell
   * nesterov or clipping from the JSON) */
  fprintf(f,
          ", \"dampening\": %s, \"nesterov\": %s, \"clip_grad_norm\": %s, "
          "\"accumulate\": %d, \"recompute\": %d, \"precision\": \"%s\", "
          "\"reduce_precision\": \"%s\", \"batchnorm\": \"%s\", \"clip_grad_value\": %s, "
          "\"amsgrad\": %s",
          dpt_float_text(c->dampening, fl[6], sizeof fl[6]), c->nesterov ? "true" : "false",
          dpt_float_text(c->clip_grad_norm, fl[7], sizeof fl[7]), c->accumulate,
          c->recompute, dp_precision_name(c->precision),
          dp_precision_name(c->reduce_precision), dp_bn_mode_name(c->batchnorm),
          dpt_float_text(c->clip_grad_value, fl[8], sizeof fl[8]),
          c->amsgrad ? "true" : "false");
  fputs("},\n", f);

  if (o->budget_set)
    fprintf(f, "  \"budget\": {\"bytes\": %zu, \"max_batch\": %d, \"search_cap\": %d},\n",
            o->budget, budget_batch, budget_cap);

  fputs("  \"devices\": [", f);
  for (int d = 0; d < nd; d++) {
    fprintf(f,
            "%s\n    {\"id\": %d, \"physical_id\": %d, \"rank\": %d, \"rows\": %d, "
            "\"micro_batches\": %d, \"total_bytes\": %zu,\n     \"regions\": {",
            d ? "," : "", d, c->device_ids[d], dp_plan_device_rank(p, d),
            dp_plan_device_rows(p, d), dp_plan_device_micro_batches(p, d),
            dp_plan_device_bytes(p, d));
    for (int r = 0; r < DP_REGION_COUNT; r++) {
      fputs(r ? ", " : "", f);
      dpt_json_string(f, dp_region_name((dp_region)r));
      fprintf(f, ": %zu", dp_plan_region(p, d, (dp_region)r).size);
    }
    fputs("},\n     \"offsets\": {", f);
    for (int r = 0; r < DP_REGION_COUNT; r++) {
      fputs(r ? ", " : "", f);
      dpt_json_string(f, dp_region_name((dp_region)r));
      fprintf(f, ": %zu", dp_plan_region(p, d, (dp_region)r).offset);
    }
    fputs("}}", f);
  }
  fprintf(f, "\n  ],\n  \"host_bytes\": %zu", dp_plan_host_bytes(p));

  /* the job's processes: one entry per rank (one for a one-process plan) */
  fprintf(f, ",\n  \"plan_hash\": \"%016llx\",\n  \"ranks\": [",
          (unsigned long long)dp_plan_hash(p));
  for (int r = 0, L = dp_plan_local_devices(p); r < dp_plan_ranks(p); r++) {
    int r0, rn;
    rank_rows(p, r, &r0, &rn);
    fprintf(f, "%s\n    {\"rank\": %d, \"devices\": [", r ? "," : "", r);
    for (int d = r * L; d < r * L + L; d++) fprintf(f, "%s%d", d > r * L ? ", " : "", d);
    fprintf(f, "], \"row0\": %d, \"rows\": %d, \"bytes\": %zu}", r0, rn,
            dp_plan_rank_bytes(p, r));
  }
  fputs("\n  ]", f);

  if (o->schedule) {
    const dp_op *ops = dp_plan_ops(p);
    fprintf(f, ",\n  \"n_stages\": %d,\n  \"ops\": [", n_stages(p));
    for (int i = 0; i < dp_plan_n_ops(p); i++) {
      const dp_op *op = &ops[i];
      fprintf(f, "%s\n    {\"index\": %d, \"stage\": %d, \"phase\": ", i ? "," : "", i,
              (int)op->stage);
      dpt_json_string(f, dp_phase_name((dp_phase)op->phase));
      fputs(", \"kind\": ", f);
      dpt_json_string(f, dp_op_kind_name((dp_op_kind)op->kind));
      fprintf(f,
              ", \"device\": %d, \"layer\": %d, \"micro_batch\": %d, \"row0\": %d, "
              "\"rows\": %d, \"bytes\": %zu",
              (int)op->device, (int)op->layer, (int)op->micro_batch, (int)op->row0,
              (int)op->rows, op->bytes);
      int two_ends = op->kind == DP_OP_COPY || op->kind == DP_OP_GRAD_ADD ||
                     op->kind == DP_OP_COPY_ADD || op->kind == DP_OP_GRAD_PACK ||
                     op->kind == DP_OP_GRAD_UNPACK;
      if (op->flags) fprintf(f, ", \"flags\": %u", (unsigned)op->flags);
      if (two_ends) {
        fprintf(f, ", \"src_dev\": %d, \"src_region\": ", (int)op->src_dev);
        dpt_json_string(f, dp_region_name((dp_region)op->src_region));
        fprintf(f, ", \"src_offset\": %zu", op->src_offset);
      }
      if (two_ends || op->kind == DP_OP_BACKWARD) {
        fprintf(f, ", \"dst_dev\": %d, \"dst_region\": ", (int)op->dst_dev);
        dpt_json_string(f, dp_region_name((dp_region)op->dst_region));
        fprintf(f, ", \"dst_offset\": %zu", op->dst_offset);
      }
      fputs("}", f);
    }
    fputs("\n  ]", f);
  }
  fputs("\n}\n", f);
}

/* ---- SVG --------------------------------------------------------------------------- */

/* budget: bytes per device (0: none), drawn as a line across the bars */
static int write_svg(const dp_plan *p, const char *path, const char *model_path,
                     size_t budget, char *err, size_t errcap) {
  const dp_config *c = dp_plan_config(p);
  int nd = dp_plan_n_devices(p);
  int seg_region[DP_REGION_COUNT + 1], ns = 0, padding = 0;
  for (int r = 0; r < DP_REGION_COUNT; r++)
    if (region_used(p, r)) seg_region[ns++] = r;
  for (int d = 0; d < nd; d++) {
    size_t sum = 0;
    for (int r = 0; r < DP_REGION_COUNT; r++)
      sum += dp_plan_region(p, d, (dp_region)r).size;
    if (dp_plan_device_bytes(p, d) > sum) padding = 1;
  }
  if (padding) seg_region[ns++] = -1;
  if (ns == 0) seg_region[ns++] = -1;

  double *values = calloc((size_t)nd * (size_t)ns, sizeof *values);
  char(*labels)[32] = calloc((size_t)nd, sizeof *labels);
  const char **bar_labels = calloc((size_t)nd, sizeof *bar_labels);
  const char *seg_names[DP_REGION_COUNT + 1];
  if (!values || !labels || !bar_labels) {
    free(values);
    free(labels);
    free(bar_labels);
    snprintf(err, errcap, "out of memory");
    return -1;
  }
  for (int s = 0; s < ns; s++)
    seg_names[s] = seg_region[s] < 0 ? "padding" : dp_region_name((dp_region)seg_region[s]);
  for (int d = 0; d < nd; d++) {
    if (dp_plan_ranks(p) > 1)
      snprintf(labels[d], sizeof labels[d], "device %d\nrank %d", d,
               dp_plan_device_rank(p, d));
    else
      snprintf(labels[d], sizeof labels[d], "device %d", d);
    bar_labels[d] = labels[d];
    size_t sum = 0;
    for (int s = 0; s < ns; s++) {
      if (seg_region[s] < 0) continue;
      size_t v = dp_plan_region(p, d, (dp_region)seg_region[s]).size;
      values[(size_t)d * (size_t)ns + (size_t)s] = (double)v;
      sum += v;
    }
    size_t total = dp_plan_device_bytes(p, d);
    if (seg_region[ns - 1] < 0)
      values[(size_t)d * (size_t)ns + (size_t)(ns - 1)] =
          total > sum ? (double)(total - sum) : 0;
  }
  const char *base = strrchr(model_path, '/');
  base = base ? base + 1 : model_path;
  char title[256];
  char job[48] = "";
  if (dp_plan_ranks(p) > 1) snprintf(job, sizeof job, " in %d ranks", dp_plan_ranks(p));
  snprintf(title, sizeof title, "%s: batch %d on %d device%s%s, %s, %s", base, c->batch, nd,
           nd == 1 ? "" : "s", job, dp_mode_name(c->mode),
           c->inference ? "inference" : dp_optimizer_name(c->optimizer));
  /* one colour per region, the same in every chart; padding grey */
  static const char *const region_color[DP_REGION_COUNT] = {
      [DP_REGION_PARAMS] = "#4e79a7",         [DP_REGION_GRADS] = "#f28e2b",
      [DP_REGION_GRAD_PARTIALS] = "#ffbe7d",  [DP_REGION_OPT_STATE] = "#e15759",
      [DP_REGION_INPUTS] = "#76b7b2",         [DP_REGION_TARGETS] = "#59a14f",
      [DP_REGION_ACTIVATIONS] = "#edc948",    [DP_REGION_OUTPUTS] = "#b07aa1",
      [DP_REGION_OUTPUT_GRADS] = "#ff9da7",   [DP_REGION_GATHERED_OUTPUTS] = "#9c755f",
      [DP_REGION_GATHERED_GRADS] = "#d4a6c8", [DP_REGION_LOSS] = "#86bcb6",
      [DP_REGION_COMM] = "#499894",           [DP_REGION_WORKSPACE] = "#8cd17d",
  };
  const char *seg_colors[DP_REGION_COUNT + 1];
  for (int s = 0; s < ns; s++)
    seg_colors[s] = seg_region[s] < 0 ? "#bab0ac" : region_color[seg_region[s]];
  char blabel[80], bh[48];
  snprintf(blabel, sizeof blabel, "budget %s", dpt_bytes_human(budget, bh, sizeof bh));
  dp_status st =
      dpt_svg_stacked_bars_limit(path, title, nd, bar_labels, ns, seg_names, seg_colors,
                                 values, (double)budget, blabel, err, errcap);
  free(values);
  free(labels);
  free(bar_labels);
  return st == DP_OK ? 0 : -1;
}

/* ---- the command ------------------------------------------------------------------- */

/* When no batch fits: the layouts that spread device 0's extras (allreduce mode)
 * and the optimizer state (sharded) may, and the tool says which would. */
static void suggest_layout(const dp_model *m, const dp_config *cfg, size_t budget,
                           int cap) {
  static const struct {
    dp_mode mode;
    int shard;
    const char *flags;
  } tries[] = {{DP_MODE_ALLREDUCE, 0, "--mode allreduce"},
               {DP_MODE_ALLREDUCE, 1, "--mode allreduce --shard-optimizer"}};
  for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
    if (cfg->mode == tries[i].mode && cfg->shard_optimizer >= tries[i].shard) continue;
    dp_config c = *cfg;
    c.mode = tries[i].mode;
    c.shard_optimizer = tries[i].shard;
    c.batch = cap;
    int fits = 0;
    if (dp_plan_max_batch(m, &c, budget, cap, &fits) == DP_OK && fits > 0) {
      fprintf(stderr, "dp plan: with %s a batch of up to %d fits\n", tries[i].flags, fits);
      return;
    }
  }
}

/* ---- --fit ------------------------------------------------------------------------ */

/* Largest arenas --fit creates to check its choice (all devices together). */
#define FIT_VERIFY_CAP ((size_t)256 << 20)

static void fit_row(const char *tag, int rank, const dp_fit *f) {
  char a[48], mb[16] = "chunk", rc[16] = "no";
  if (f->config.micro_batch > 0) snprintf(mb, sizeof mb, "%d", f->config.micro_batch);
  if (f->config.recompute > 0) snprintf(rc, sizeof rc, "%d", f->config.recompute);
  printf("%-7s %4d  %-9s  %-5s  %-8s  %11s  %9s  %9s  %16s  %12.3f  %s\n", tag, rank,
         dp_mode_name(f->config.mode), f->config.shard_optimizer ? "yes" : "no",
         dp_split_name(f->config.split), mb, rc, dp_precision_name(f->config.precision),
         dpt_bytes_exact(f->bytes, a, sizeof a), f->est_ms,
         f->config.backend_options[0] ? f->config.backend_options : "-");
}

/* One training step (or forward) of zeros at the full batch on a context of plan
 * p, then every device's high-water mark against the budget. */
static void fit_verify(const dp_plan *p, const dp_model *m, size_t budget) {
  size_t all = dp_plan_host_bytes(p);
  for (int d = 0; d < dp_plan_n_devices(p); d++) all += dp_plan_device_bytes(p, d);
  char a[48], b[48];
  if (all > FIT_VERIFY_CAP) {
    printf("not checked by a step here: its arenas take %s in all (dp train runs it)\n",
           dpt_bytes_human(all, a, sizeof a));
    return;
  }
  const dp_config *c = dp_plan_config(p);
  int in = dp_model_input_width(m), tw = dp_model_target_width(m);
  float *x = calloc((size_t)c->batch * in, sizeof *x);
  float *t = calloc((size_t)c->batch * (tw > 0 ? tw : 1), sizeof *t);
  float *y = calloc((size_t)c->batch * dp_model_output_width(m), sizeof *y);
  dp_ctx *ctx = NULL;
  float loss = 0;
  dp_status s = !x || !t || !y ? DP_ERR_NOMEM : dp_ctx_create(p, &ctx);
  if (!s)
    s = c->inference ? dp_forward(ctx, c->batch, in, x, y)
                     : dp_train_step(ctx, c->batch, in, x, t, &loss);
  if (s) {
    printf("not checked by a step here: %s\n",
           dpt_user_msg(ctx ? dp_ctx_error(ctx) : dp_last_error()));
  } else {
    size_t hw = 0;
    for (int d = 0; d < dp_plan_n_devices(p); d++)
      if (dp_ctx_high_water(ctx, d) > hw) hw = dp_ctx_high_water(ctx, d);
    printf("checked: a step of the chosen configuration touched at most %s B (%s) of a "
           "device's arena, within the budget\n",
           dpt_bytes_exact(hw, a, sizeof a), dpt_bytes_human(hw, b, sizeof b));
    if (hw > budget) printf("(over the budget: a bug, please report it)\n");
  }
  dp_ctx_free(ctx);
  free(x);
  free(t);
  free(y);
}

/* --fit: the chosen configuration into *cfg; prints the candidates. 0 or -1. */
static int fit_config(const dp_model *m, dp_config *cfg, const plan_opts *o) {
  enum { SHOWN = 6 };
  dp_fit f[SHOWN];
  int n = 0;
  dp_status s = dp_plan_fit(m, cfg, o->budget, o->fit_allow, &o->costs, f, SHOWN, &n);
  char a[48], b[48], c[48], d[48], e[48];
  if (s == DP_ERR_RANGE) { /* f[0]: the smallest found; sizes as every line has them */
    const dp_config *k = &f[0].config;
    char mb[32] = "the chunk";
    if (k->micro_batch > 0) snprintf(mb, sizeof mb, "%d rows", k->micro_batch);
    fprintf(
        stderr,
        "dp plan: --fit: no configuration fits %s B (%s) per device: the smallest "
        "found needs %s B (%s: mode %s%s, split %s, micro-batch %s, recompute %d, "
        "precision %s%s%s), %s B over: give a larger --budget, or let --fit-allow change "
        "more\n",
        dpt_bytes_exact(o->budget, a, sizeof a), dpt_bytes_human(o->budget, b, sizeof b),
        dpt_bytes_exact(f[0].bytes, c, sizeof c), dpt_bytes_human(f[0].bytes, d, sizeof d),
        dp_mode_name(k->mode), k->shard_optimizer ? ", sharded optimizer" : "",
        dp_split_name(k->split), mb, k->recompute, dp_precision_name(k->precision),
        k->backend_options[0] ? ", " : "", k->backend_options,
        dpt_bytes_exact(f[0].bytes - o->budget, e, sizeof e));
    return -1;
  }
  if (s != DP_OK) {
    fprintf(stderr, "dp plan: --fit: %s\n", dpt_user_msg(dp_last_error()));
    return -1;
  }
  printf(
      "fit     %s B (%s) per device, batch %d on %d devices; may change:%s%s%s%s%s%s%s\n",
      dpt_bytes_exact(o->budget, a, sizeof a), dpt_bytes_human(o->budget, b, sizeof b),
      cfg->batch, cfg->n_devices, o->fit_allow & DP_FIT_MODE ? " mode" : "",
      o->fit_allow & DP_FIT_SHARD ? " shard" : "",
      o->fit_allow & DP_FIT_SPLIT ? " split" : "",
      o->fit_allow & DP_FIT_RECOMPUTE ? " recompute" : "",
      o->fit_allow & DP_FIT_MICRO_BATCH ? " micro-batch" : "",
      o->fit_allow & DP_FIT_PRECISION ? " bf16" : "",
      o->fit_allow & DP_FIT_BACKEND ? " backend options" : "");
  printf("%-7s %4s  %-9s  %-5s  %-8s  %11s  %9s  %9s  %16s  %12s  %s\n", "", "rank", "mode",
         "shard", "split", "micro-batch", "recompute", "precision", "largest arena",
         "est. ms/step", "backend options");
  for (int i = 0; i < n; i++) fit_row(i == 0 ? "chosen" : "", i + 1, &f[i]);
  printf("(estimates: gflops %g, half_rows %g, mem_gbs %g, op_us %g, bf16_gflops %g; "
         "--fit-costs)\n",
         o->costs.gflops, o->costs.half_rows, o->costs.mem_gbs, o->costs.op_us,
         o->costs.bf16_gflops);
  *cfg = f[0].config;
  return 0;
}

int dpt_cmd_plan(int argc, char **argv) {
  plan_opts o = {.fit_allow = DP_FIT_MODE | DP_FIT_SHARD | DP_FIT_SPLIT | DP_FIT_RECOMPUTE |
                              DP_FIT_BACKEND};
  dp_fit_costs_default(&o.costs);
  dp_config cfg;
  dpt_common com;
  char err[512];
  int r = dpt_parse_command(argc, argv, plan_options, plan_option, &o, plan_help, &cfg,
                            &com, err, sizeof err);
  if (r == DPT_ARGS_HELP) return DPT_EXIT_OK;
  if (r == DPT_ARGS_OK && !o.model)
    r = dpt_fail(err, sizeof err, "--model FILE is required");
  if (r == DPT_ARGS_OK && !o.budget_set && !dpt_given(&com, DPT_OPT_BATCH))
    r = dpt_fail(err, sizeof err, "--batch B is required (or --budget SIZE to find it)");
  if (r == DPT_ARGS_OK && o.fit && (!o.budget_set || !dpt_given(&com, DPT_OPT_BATCH)))
    r = dpt_fail(err, sizeof err, "--fit needs --budget SIZE and the --batch B to fit");
  if (r == DPT_ARGS_OK && !o.fit && o.fit_extra)
    r = dpt_fail(err, sizeof err, "--fit-allow and --fit-costs go with --fit");
  if (r != DPT_ARGS_OK) {
    return dpt_usage_error("plan", err, "run 'dp plan --help' for the options");
  }

  dp_model *m = NULL;
  dpt_file_role out = {o.svg, "chart"}, in = {o.model, "model"};
  if (dpt_check_distinct(&out, 1, &in, 1, err, sizeof err) ||
      (o.svg && dpt_check_writable(o.svg, "chart", 1, err, sizeof err)) ||
      dpt_load_model(o.model, &m, err, sizeof err) ||
      dpt_require_loss(o.model, m, &cfg, err, sizeof err)) {
    fprintf(stderr, "dp plan: %s\n", err);
    dp_model_free(m);
    return DPT_EXIT_FAIL;
  }

  int status = DPT_EXIT_FAIL, budget_batch = 0, cap = 0;
  dp_plan *p = NULL;
  char a[48], b[48];
  if (o.fit) {
    if (fit_config(m, &cfg, &o)) goto out;
  } else if (o.budget_set) {
    cap = dpt_given(&com, DPT_OPT_BATCH) ? cfg.batch : DEFAULT_BATCH_CAP;
    cfg.batch = cap;
    if (dp_plan_max_batch(m, &cfg, o.budget, cap, &budget_batch) != DP_OK) {
      fprintf(stderr, "dp plan: %s\n", dpt_user_msg(dp_last_error()));
      goto out;
    }
    if (budget_batch == 0) {
      fprintf(stderr, "dp plan: no batch fits in %s B (%s) per device",
              dpt_bytes_exact(o.budget, a, sizeof a),
              dpt_bytes_human(o.budget, b, sizeof b));
      cfg.batch = 1;
      if (dp_plan_create(m, &cfg, &p) == DP_OK) {
        size_t need = dp_plan_host_bytes(p);
        for (int d = 0; d < dp_plan_n_devices(p); d++)
          if (dp_plan_device_bytes(p, d) > need) need = dp_plan_device_bytes(p, d);
        fprintf(stderr, ": batch 1 needs %s B (%s)", dpt_bytes_exact(need, a, sizeof a),
                dpt_bytes_human(need, b, sizeof b));
      }
      fputc('\n', stderr);
      suggest_layout(m, &cfg, o.budget, cap);
      goto out;
    }
    cfg.batch = budget_batch;
  }

  if (dp_plan_create(m, &cfg, &p) != DP_OK) {
    fprintf(stderr, "dp plan: %s\n", dpt_user_msg(dp_last_error()));
    goto out;
  }

  if (o.json) {
    print_json(p, o.model, &o, budget_batch, cap);
  } else {
    if (o.fit) fit_verify(p, m, o.budget);
    if (o.budget_set && !o.fit) {
      printf("budget  %s B (%s) per device: the largest batch that fits is %d",
             dpt_bytes_exact(o.budget, a, sizeof a), dpt_bytes_human(o.budget, b, sizeof b),
             budget_batch);
      if (budget_batch == cap)
        printf(" = the search cap (%s)", dpt_given(&com, DPT_OPT_BATCH)
                                             ? "the --batch given"
                                             : "raise it with --batch");
      printf("\n");
    }
    print_text(p, o.model);
    if (o.schedule) print_schedule_text(p);
  }
  if (o.svg) {
    char serr[512] = "";
    if (write_svg(p, o.svg, o.model, o.budget_set ? o.budget : 0, serr, sizeof serr)) {
      fprintf(stderr, "dp plan: --svg: %s\n", serr[0] ? serr : "could not write the chart");
      goto out;
    }
    if (!o.json) printf("wrote %s\n", o.svg);
  }
  fflush(stdout);
  status = ferror(stdout) ? DPT_EXIT_FAIL : DPT_EXIT_OK;
  if (status) fprintf(stderr, "dp plan: error writing the output\n");
out:
  dp_plan_free(p);
  dp_model_free(m);
  return status;
}
