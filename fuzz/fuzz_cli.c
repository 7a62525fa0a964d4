/* libFuzzer harness: the `dp` command-line parsers (tools/cli.c). No command
 * runs (nothing plans, trains or writes files): only the parsing.
 *
 * The bytes are split at NUL bytes into arguments; argv[0] is "dp-fuzz".
 *   - dpt_parse_args with a command-like option table (long options with and
 *     without values, an optional value, short forms) and
 *     dpt_config_from_args: the result is OK/HELP/ERROR; an error has a
 *     message; OK leaves a configuration within the parsers' documented
 *     ranges, and first_arg/n_args inside argv;
 *   - every argument through every value parser (size, int, float, u64,
 *     devices, mode, optimizer, split, backend): 0 with a value in range, or
 *     -1 with a message and the output untouched;
 *   - a parsed size formats (dpt_bytes_exact) to digits that parse back to
 *     the same size; dpt_bytes_human and dpt_json_string take anything. */
#include "cli.h"
#include "fuzz_util.h"

#include <float.h>
#include <limits.h>
#include <math.h>

#define MAX_ARGS 64

enum { X_MODEL = DPT_OPT_USER, X_JSON, X_BUDGET, X_LEVEL };

static const struct option extra[] = {
    {"model", required_argument, NULL, X_MODEL},
    {"json", no_argument, NULL, X_JSON},
    {"budget", required_argument, NULL, X_BUDGET},
    {"level", optional_argument, NULL, X_LEVEL},
    {"output", required_argument, NULL, 'o'},
    {"quiet", no_argument, NULL, 'q'},
    {0, 0, 0, 0},
};

typedef struct {
  int calls;
  size_t budget;
} opts;

static int on_option(void *user, int code, const char *arg, char *err, size_t errcap) {
  opts *o = user;
  o->calls++;
  switch (code) {
  case X_MODEL:
  case 'o':
    FUZZ_CHECK(arg != NULL, "option %d without its value", code);
    return 0;
  case X_JSON:
  case 'q':
    FUZZ_CHECK(arg == NULL, "option %d got a value", code);
    return 0;
  case X_LEVEL: return 0;
  case X_BUDGET: return dpt_parse_size(arg, &o->budget, err, errcap);
  }
  FUZZ_CHECK(0, "handler called with unknown code %d", code);
  return -1;
}

static FILE *devnull(void) {
  static FILE *f;
  if (!f) f = fopen("/dev/null", "w");
  FUZZ_CHECK(f != NULL, "cannot open /dev/null");
  return f;
}

static void check_config(const dp_config *c) {
  FUZZ_CHECK(c->n_devices >= 1 && c->n_devices <= DP_MAX_DEVICES, "n_devices %d", c->n_devices);
  for (int i = 0; i < c->n_devices; i++)
    FUZZ_CHECK(c->device_ids[i] >= 0 && c->device_ids[i] <= 1023, "device id %d",
               c->device_ids[i]);
  FUZZ_CHECK(c->batch >= 0 && c->micro_batch >= 0, "batch %d, micro-batch %d", c->batch,
             c->micro_batch);
  FUZZ_CHECK((unsigned)c->split <= DP_SPLIT_MEMORY && (unsigned)c->mode <= DP_MODE_ALLREDUCE &&
                 (unsigned)c->optimizer <= DP_OPT_ADAM && (unsigned)c->backend <= DP_BACKEND_CUDA,
             "enum out of range");
  FUZZ_CHECK(isfinite(c->lr) && c->lr >= 0, "lr %g", (double)c->lr);
  FUZZ_CHECK(c->momentum >= 0 && c->momentum < 1, "momentum %g", (double)c->momentum);
  FUZZ_CHECK(c->dampening >= 0 && c->dampening <= 1, "dampening %g", (double)c->dampening);
  FUZZ_CHECK(c->nesterov == 0 || c->nesterov == 1, "nesterov %d", c->nesterov);
  FUZZ_CHECK(c->amsgrad == 0 || c->amsgrad == 1, "amsgrad %d", c->amsgrad);
  FUZZ_CHECK(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1, "betas");
  FUZZ_CHECK(isfinite(c->eps) && c->eps > 0, "eps %g", (double)c->eps);
  FUZZ_CHECK(isfinite(c->weight_decay) && c->weight_decay >= 0, "weight decay");
  dpt_print_config(devnull(), c);
}

static void parse_whole(int argc, char **argv) {
  char *copy[MAX_ARGS + 2];
  char err[512];
  dp_config cfg;
  dpt_common common;
  opts o = {0, 0};
  /* getopt permutes argv: give each parse its own copy of the array */
  memcpy(copy, argv, sizeof(char *) * (size_t)(argc + 1));
  err[0] = '\0';
  int r = dpt_parse_args(argc, copy, extra, on_option, &o, &cfg, &common, err, sizeof err);
  fuzz_count(r == DPT_ARGS_OK ? "args ok" : r == DPT_ARGS_HELP ? "args help" : "args refused");
  FUZZ_CHECK(r == DPT_ARGS_OK || r == DPT_ARGS_HELP || r == DPT_ARGS_ERROR, "returned %d", r);
  if (r == DPT_ARGS_ERROR) FUZZ_CHECK(err[0] != '\0', "error without a message");
  if (r == DPT_ARGS_OK) {
    FUZZ_CHECK(common.first_arg >= 1 && common.first_arg <= argc &&
                   common.n_args == argc - common.first_arg,
               "first_arg %d, n_args %d, argc %d", common.first_arg, common.n_args, argc);
    for (int i = common.first_arg; i < argc; i++) FUZZ_CHECK(copy[i] != NULL, "NULL positional");
    check_config(&cfg);
    for (int k = DPT_OPT_BATCH; k < DPT_OPT_COMMON_END; k++) (void)dpt_given(&common, k);
  }
  memcpy(copy, argv, sizeof(char *) * (size_t)(argc + 1));
  err[0] = '\0';
  r = dpt_config_from_args(argc, copy, &cfg, NULL, err, sizeof err);
  FUZZ_CHECK(r == DPT_ARGS_OK || r == DPT_ARGS_HELP || r == DPT_ARGS_ERROR, "returned %d", r);
  if (r == DPT_ARGS_ERROR) FUZZ_CHECK(err[0] != '\0', "error without a message");
  if (r == DPT_ARGS_OK) check_config(&cfg);
}

/* Runs one value parser: on failure the output keeps its sentinel and a
 * message was written. */
#define VALUE(call, out, sentinel)                                            \
  do {                                                                        \
    err[0] = '\0';                                                            \
    out = sentinel;                                                           \
    int r_ = (call);                                                          \
    FUZZ_CHECK(r_ == 0 || r_ == -1, #call " returned %d", r_);                \
    if (r_) FUZZ_CHECK(err[0] && out == sentinel, #call ": no message or output changed"); \
    ok = r_ == 0;                                                             \
  } while (0)

static void parse_values(const char *s) {
  char err[512];
  int ok;
  size_t size;
  VALUE(dpt_parse_size(s, &size, err, sizeof err), size, (size_t)0x5a5a5a5a);
  if (ok) {
    char buf[48], digits[48];
    dpt_bytes_exact(size, buf, sizeof buf);
    size_t j = 0;
    for (const char *p = buf; *p; p++)
      if (*p != ',') digits[j++] = *p;
    digits[j] = '\0';
    size_t back = 0;
    FUZZ_CHECK(dpt_parse_size(digits, &back, err, sizeof err) == 0 && back == size,
               "'%s' -> %zu -> '%s' -> %zu", s, size, buf, back);
    dpt_bytes_human(size, buf, sizeof buf);
  }
  int iv;
  VALUE(dpt_parse_int(s, 1, INT_MAX, "--batch", &iv, err, sizeof err), iv, -12345);
  if (ok) FUZZ_CHECK(iv >= 1, "--batch %d", iv);
  VALUE(dpt_parse_int(s, LONG_MIN, LONG_MAX, "--any", &iv, err, sizeof err), iv, -12345);
  float fv;
  VALUE(dpt_parse_float(s, 0, FLT_MAX, "--lr", &fv, err, sizeof err), fv, -1.0f);
  if (ok) FUZZ_CHECK(isfinite(fv) && fv >= 0, "--lr %g", (double)fv);
  VALUE(dpt_parse_float(s, -HUGE_VAL, HUGE_VAL, "--any", &fv, err, sizeof err), fv, -1.5f);
  if (ok) FUZZ_CHECK(isfinite(fv), "--any %g", (double)fv);
  uint64_t u;
  VALUE(dpt_parse_u64(s, "--seed", &u, err, sizeof err), u, 42u);
  int n = -1, ids[DP_MAX_DEVICES];
  VALUE(dpt_parse_devices(s, &n, ids, err, sizeof err), n, -1);
  if (ok) {
    FUZZ_CHECK(n >= 1 && n <= DP_MAX_DEVICES, "%d devices", n);
    for (int i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] <= 1023, "id %d", ids[i]);
  }
  dp_mode mode;
  VALUE(dpt_parse_mode(s, &mode, err, sizeof err), mode, (dp_mode)77);
  if (ok) FUZZ_CHECK(dp_mode_name(mode)[0] != '?', "mode %d", (int)mode);
  dp_optimizer opt;
  VALUE(dpt_parse_optimizer(s, &opt, err, sizeof err), opt, (dp_optimizer)77);
  if (ok) FUZZ_CHECK(dp_optimizer_name(opt)[0] != '?', "optimizer %d", (int)opt);
  dp_split split;
  VALUE(dpt_parse_split(s, &split, err, sizeof err), split, (dp_split)77);
  if (ok) FUZZ_CHECK(dp_split_name(split)[0] != '?', "split %d", (int)split);
  dp_backend be;
  VALUE(dpt_parse_backend(s, &be, err, sizeof err), be, (dp_backend)77);
  if (ok) FUZZ_CHECK(dp_backend_name(be)[0] != '?', "backend %d", (int)be);
  dpt_json_string(devnull(), s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4096) return 0;
  char *buf = malloc(size + 1);
  if (!buf) return 0;
  memcpy(buf, data, size);
  buf[size] = '\0';
  char *argv[MAX_ARGS + 2];
  int argc = 0;
  argv[argc++] = (char *)"dp-fuzz";
  for (size_t i = 0; i <= size && argc < MAX_ARGS + 1;) {
    argv[argc++] = buf + i;
    i += strlen(buf + i) + 1;
  }
  argv[argc] = NULL;
  for (int i = 1; i < argc; i++) parse_values(argv[i]);
  parse_whole(argc, argv);
  free(buf);
  return 0;
}
