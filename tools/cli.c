/* Shared command-line helpers of the `dp` tool (see cli.h). */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int vfail(char *err, size_t errcap, const char *fmt, va_list ap) {
  if (!err || !errcap) return -1;
  /* control bytes a message quotes from a file (a CSV field, a name) as \xHH:
   * their escape sequences would drive the user's terminal; a message's own
   * line breaks stay */
  char raw[4096];
  vsnprintf(raw, sizeof raw, fmt, ap);
  size_t o = 0;
  for (const char *p = raw; *p && o + 1 < errcap; p++) {
    unsigned char c = (unsigned char)*p;
    if ((c >= 0x20 && c != 0x7f) || c == '\n') {
      err[o++] = (char)c;
    } else if (o + 5 <= errcap) {
      snprintf(err + o, 5, "\\x%02x", c);
      o += 4;
    } else {
      break;
    }
  }
  err[o] = '\0';
  return -1;
}

int dpt_fail(char *err, size_t errcap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(err, errcap, fmt, ap);
  va_end(ap);
  return -1;
}

dp_status dpt_fail_status(dp_status s, char *err, size_t errcap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(err, errcap, fmt, ap);
  va_end(ap);
  return s;
}

/* ---- sizes ------------------------------------------------------------------- */

/* Multiplier of a unit suffix ("", "b", "k", "kb", "ki", "kib", ... "pib"),
 * case-insensitive; 0 when the suffix is not a unit. */
static uint64_t unit_multiplier(const char *u) {
  static const char prefixes[] = "kmgtp";
  if (*u == '\0') return 1;
  if ((u[0] == 'b' || u[0] == 'B') && u[1] == '\0') return 1;
  const char *pp = strchr(prefixes, tolower((unsigned char)u[0]));
  if (!pp || u[0] == '\0') return 0;
  int power = (int)(pp - prefixes) + 1;
  const char *q = u + 1;
  uint64_t base = 1000;
  if (*q == 'i' || *q == 'I') {
    base = 1024;
    q++;
  }
  if (*q == 'b' || *q == 'B') q++;
  if (*q != '\0') return 0;
  uint64_t m = 1;
  for (int i = 0; i < power; i++) m *= base; /* <= 1024^5, no overflow */
  return m;
}

int dpt_parse_size(const char *s, size_t *out, char *err, size_t errcap) {
  static const char units[] = "use B, kB, MB, GB, TB, PB or KiB, MiB, GiB, TiB, PiB";
  if (!s || !*s) return dpt_fail(err, errcap, "empty size");
  const char *p = s;
  if (*p == '-') return dpt_fail(err, errcap, "size '%s' is negative", s);
  if (!isdigit((unsigned char)*p))
    return dpt_fail(err, errcap, "size '%s' is not a number (e.g. 512MiB, 1.5GB, 1000)", s);
  uint64_t ip = 0;
  for (; isdigit((unsigned char)*p); p++) {
    unsigned d = (unsigned)(*p - '0');
    if (ip > (UINT64_MAX - d) / 10)
      return dpt_fail(err, errcap, "size '%s' is too large", s);
    ip = ip * 10 + d;
  }
  const char *frac = NULL;
  size_t nfrac = 0;
  if (*p == '.') {
    frac = ++p;
    while (isdigit((unsigned char)*p)) p++;
    nfrac = (size_t)(p - frac);
    if (nfrac == 0) return dpt_fail(err, errcap, "size '%s': digits expected after '.'", s);
  }
  const char *sp = p;
  while (*p == ' ') p++;
  if (p != sp && *p == '\0') return dpt_fail(err, errcap, "size '%s': trailing space", s);
  uint64_t mult = unit_multiplier(p);
  if (mult == 0)
    return dpt_fail(err, errcap, "size '%s': unknown unit '%s' (%s)", s, p, units);
  if (nfrac && mult == 1)
    return dpt_fail(err, errcap,
                    "size '%s': a fraction of a byte (use a unit, e.g. 1.5KiB)", s);
  uint64_t v;
  if (__builtin_mul_overflow(ip, mult, &v))
    return dpt_fail(err, errcap, "size '%s' is too large", s);
  /* floor(mult * 0.frac), exactly: multiply the decimal fraction by mult digit
   * by digit from the last; the final carry is the integer part. carry < mult,
   * so 9 * mult + carry < 10 * 1024^5 fits. */
  uint64_t carry = 0;
  for (size_t i = nfrac; i-- > 0;) carry = ((uint64_t)(frac[i] - '0') * mult + carry) / 10;
  if (__builtin_add_overflow(v, carry, &v) || v > SIZE_MAX)
    return dpt_fail(err, errcap, "size '%s' is too large (more than %zu bytes)", s,
                    (size_t)SIZE_MAX);
  *out = (size_t)v;
  return 0;
}

/* ---- numbers ----------------------------------------------------------------- */

int dpt_parse_int(const char *s, long min, long max, const char *what, int *out, char *err,
                  size_t errcap) {
  if (min < INT_MIN) min = INT_MIN;
  if (max > INT_MAX) max = INT_MAX;
  if (!s || !*s) return dpt_fail(err, errcap, "%s: empty value, expected an integer", what);
  if (isspace((unsigned char)*s))
    return dpt_fail(err, errcap, "%s: '%s' is not an integer", what, s);
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0')
    return dpt_fail(err, errcap, "%s: '%s' is not an integer", what, s);
  if (errno == ERANGE || v < min || v > max)
    return dpt_fail(err, errcap, "%s: %s is out of range [%ld, %ld]", what, s, min, max);
  *out = (int)v;
  return 0;
}

bool dpt_decimal(const char *s, size_t len) {
  return len > 0 && strspn(s, "0123456789.eE+-") >= len;
}

int dpt_parse_float(const char *s, double min, double max, const char *what, float *out,
                    char *err, size_t errcap) {
  if (!s || !*s) return dpt_fail(err, errcap, "%s: empty value, expected a number", what);
  /* decimal only: strtod would take hexadecimal (0x1p-3), inf and nan too */
  if (!dpt_decimal(s, strlen(s)))
    return dpt_fail(err, errcap, "%s: '%s' is not a decimal number", what, s);
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0')
    return dpt_fail(err, errcap, "%s: '%s' is not a number", what, s);
  /* ERANGE: too large (refused as out of range), or too small for a double's
   * normal range (1e-310; 1e-400 comes back as 0): rounds to 0 below */
  bool tiny = errno == ERANGE && fabs(v) <= 1.0;
  if (!isfinite(v) || (errno == ERANGE && !tiny) || v < min || v > max || v > FLT_MAX ||
      v < -FLT_MAX)
    return dpt_fail(err, errcap, "%s: %s is out of range [%g, %g]", what, s, min,
                    max > FLT_MAX ? (double)FLT_MAX : max);
  if ((v != 0 || tiny) && (float)v == 0) /* 1e-50: the library would see 0 */
    return dpt_fail(err, errcap,
                    "%s: %s rounds to 0 as a float32; the smallest it holds is 1.4e-45",
                    what, s);
  *out = (float)v;
  return 0;
}

int dpt_parse_u64(const char *s, const char *what, uint64_t *out, char *err,
                  size_t errcap) {
  if (!s || !*s) return dpt_fail(err, errcap, "%s: empty value, expected an integer", what);
  if (!isdigit((unsigned char)*s))
    return dpt_fail(err, errcap, "%s: '%s' is not a non-negative integer", what, s);
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end != '\0')
    return dpt_fail(err, errcap, "%s: '%s' is not a non-negative integer", what, s);
  if (errno == ERANGE || v > UINT64_MAX)
    return dpt_fail(err, errcap, "%s: %s is out of range [0, %llu]", what, s,
                    (unsigned long long)UINT64_MAX);
  *out = (uint64_t)v;
  return 0;
}

int dpt_parse_devices(const char *s, int *n_devices, int ids[DP_MAX_DEVICES], char *err,
                      size_t errcap) {
  char msg[256];
  if (!s || !*s) return dpt_fail(err, errcap, "--devices: empty value");
  if (!strchr(s, ',')) {
    int n;
    if (dpt_parse_int(s, 1, DP_MAX_DEVICES, "--devices", &n, msg, sizeof msg))
      return dpt_fail(err, errcap, "%s (a device count, or a comma list of device ids)",
                      msg);
    for (int i = 0; i < n; i++) ids[i] = i;
    *n_devices = n;
    return 0;
  }
  int tmp[DP_MAX_DEVICES], n = 0;
  const char *p = s;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len == 0)
      return dpt_fail(err, errcap, "--devices: empty device id in list '%s'", s);
    if (n == DP_MAX_DEVICES)
      return dpt_fail(err, errcap, "--devices: list '%s' has more than %d entries", s,
                      DP_MAX_DEVICES);
    char item[32];
    if (len >= sizeof item)
      return dpt_fail(err, errcap, "--devices: device id '%.*s' is not an integer",
                      (int)len, p);
    memcpy(item, p, len);
    item[len] = '\0';
    if (!isdigit((unsigned char)item[0]))
      return dpt_fail(err, errcap,
                      "--devices: device id '%s' is not a non-negative integer", item);
    if (dpt_parse_int(item, 0, 1023, "--devices: device id", &tmp[n], err, errcap))
      return -1;
    n++;
    if (!comma) break;
    p = comma + 1;
  }
  memcpy(ids, tmp, (size_t)n * sizeof *tmp);
  *n_devices = n;
  return 0;
}

/* ---- enumerations ------------------------------------------------------------ */

/* The words are the library's (dp_mode_name, ...): the values of an enum are
 * 0, 1, ... up to the first one it names "?". */
#define MAX_WORDS 8
#define WORDS(name_fn, type, names, n)                                                     \
  for (n = 0; n < MAX_WORDS && strcmp(name_fn((type)n), "?") != 0; n++)                    \
    names[n] = name_fn((type)n);

/* Index of s in names[0..n-1] (case-insensitive), or -1 with a message. */
static int parse_word(const char *s, const char *const *names, int n, const char *what,
                      char *err, size_t errcap) {
  for (int i = 0; s && i < n; i++)
    if (strcasecmp(s, names[i]) == 0) return i;
  char list[128] = "";
  size_t len = 0;
  for (int i = 0; i < n && len < sizeof list; i++)
    len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? "|" : "", names[i]);
  return dpt_fail(err, errcap, "%s: '%s' is not one of %s", what, s ? s : "", list);
}

#define PARSE_ENUM(fn, type, name_fn, option)                                              \
  int fn(const char *s, type *out, char *err, size_t errcap) {                             \
    const char *names[MAX_WORDS];                                                          \
    int n, i;                                                                              \
    WORDS(name_fn, type, names, n)                                                         \
    if ((i = parse_word(s, names, n, option, err, errcap)) < 0) return -1;                 \
    *out = (type)i;                                                                        \
    return 0;                                                                              \
  }

PARSE_ENUM(dpt_parse_mode, dp_mode, dp_mode_name, "--mode")
PARSE_ENUM(parse_optimizer_word, dp_optimizer, dp_optimizer_name, "--optimizer")

/* --optimizer: one of the names (sgd, momentum, adamw, adam: torch.optim.Adam). */
int dpt_parse_optimizer(const char *s, dp_optimizer *out, char *err, size_t errcap) {
  return parse_optimizer_word(s, out, err, errcap);
}
PARSE_ENUM(dpt_parse_split, dp_split, dp_split_name, "--split")
PARSE_ENUM(dpt_parse_backend, dp_backend, dp_backend_name, "--backend")
PARSE_ENUM(dpt_parse_transport, dp_transport, dp_transport_name, "--transport")
PARSE_ENUM(dpt_parse_bn_mode, dp_bn_mode, dp_bn_mode_name, "--batchnorm")

#define N_OF(table) ((int)(sizeof table / sizeof *table))

/* ---- formatting ---------------------------------------------------------------- */

char *dpt_bytes_human(size_t n, char *buf, size_t cap) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (!cap) return buf;
  if (n < 1024) {
    snprintf(buf, cap, "%zu B", n);
    return buf;
  }
  double v = (double)n / 1024.0;
  int k = 0;
  /* Move up while the value would print as 1024.00 or more. */
  while (v >= 1023.995 && k < 5) {
    v /= 1024.0;
    k++;
  }
  snprintf(buf, cap, "%.2f %s", v, units[k]);
  return buf;
}

const char *dpt_float_text(float v, char *buf, size_t cap) {
  for (int prec = 6; prec <= 9; prec++) {
    snprintf(buf, cap, "%.*g", prec, (double)v);
    if ((float)strtod(buf, NULL) == v) break;
  }
  return buf;
}

char *dpt_bytes_exact(size_t n, char *buf, size_t cap) {
  char digits[32];
  int nd = snprintf(digits, sizeof digits, "%zu", n);
  char tmp[48];
  size_t j = 0;
  for (int i = 0; i < nd; i++) {
    if (i > 0 && (nd - i) % 3 == 0) tmp[j++] = ',';
    tmp[j++] = digits[i];
  }
  tmp[j] = '\0';
  if (cap) snprintf(buf, cap, "%s", tmp);
  return buf;
}

void dpt_json_string(FILE *f, const char *s) {
  if (!s) {
    fputs("null", f);
    return;
  }
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"': fputs("\\\"", f); break;
    case '\\': fputs("\\\\", f); break;
    case '\n': fputs("\\n", f); break;
    case '\r': fputs("\\r", f); break;
    case '\t': fputs("\\t", f); break;
    case '\b': fputs("\\b", f); break;
    case '\f': fputs("\\f", f); break;
    default:
      if (*p < 0x20)
        fprintf(f, "\\u%04x", *p);
      else
        fputc(*p, f);
    }
  }
  fputc('"', f);
}

/* ---- backend options ------------------------------------------------------------ */

#define ITEM_SEPS ", \t"

/* The next item of a list at *at: its name [*name, *name + *nlen) and value
 * [*value, *value + *vlen) (an item without '=': value empty); 0 at the end. */
static int next_item(const char **at, const char **name, size_t *nlen, const char **value,
                     size_t *vlen) {
  const char *s = *at + strspn(*at, ITEM_SEPS);
  size_t len = strcspn(s, ITEM_SEPS);
  if (!len) return 0;
  const char *eq = memchr(s, '=', len);
  *name = s;
  *nlen = eq ? (size_t)(eq - s) : len;
  *value = eq ? eq + 1 : s + len;
  *vlen = eq ? len - *nlen - 1 : 0;
  *at = s + len;
  return 1;
}

int dpt_backend_option_get(const char *options, const char *name, char *val, size_t cap) {
  const char *at = options ? options : "", *n, *v;
  size_t nlen, vlen;
  int found = 0;
  if (cap) val[0] = '\0';
  while (next_item(&at, &n, &nlen, &v, &vlen))
    if (nlen == strlen(name) && !strncmp(n, name, nlen)) {
      found = 1;
      if (cap) snprintf(val, cap, "%.*s", (int)vlen, v);
    }
  return found;
}

int dpt_backend_option_on(const char *options, const char *name) {
  char v[8];
  return dpt_backend_option_get(options, name, v, sizeof v) && !strcmp(v, "1");
}

int dpt_backend_option_add(dp_config *c, const char *name, const char *value, char *err,
                           size_t errcap) {
  char item[DP_BACKEND_OPTIONS_CAP + 1];
  int n = snprintf(item, sizeof item, "%s=%s", name, value);
  const char *at = c->backend_options, *in, *iv;
  size_t nlen, vlen;
  while (next_item(&at, &in, &nlen, &iv, &vlen))
    if ((size_t)(at - in) == (size_t)n && !strncmp(in, item, (size_t)n)) return 0;
  size_t len = strlen(c->backend_options);
  if (n < 0 || len + (len ? 1 : 0) + (size_t)n >= sizeof c->backend_options)
    return dpt_fail(err, errcap,
                    "--backend-option %.*s: the backend options would pass their %d bytes "
                    "(%s%s%s); give fewer or shorter options",
                    n > 64 ? 64 : n, item, DP_BACKEND_OPTIONS_CAP - 1,
                    len ? "'" : "nothing before it", len ? c->backend_options : "",
                    len ? "' before it" : "");
  char *d = c->backend_options + len;
  if (len) *d++ = ',';
  memcpy(d, item, (size_t)n + 1);
  return 0;
}

int dpt_backend_option_set(dp_config *c, const char *name, const char *value, char *err,
                           size_t errcap) {
  char kept[DP_BACKEND_OPTIONS_CAP] = "";
  size_t len = 0;
  const char *at = c->backend_options, *n, *v;
  size_t nlen, vlen;
  while (next_item(&at, &n, &nlen, &v, &vlen)) {
    if (nlen == strlen(name) && !strncmp(n, name, nlen)) continue;
    size_t ilen = (size_t)(at - n);
    if (len + (len ? 1 : 0) + ilen >= sizeof kept) break; /* cannot happen: it fitted */
    if (len) kept[len++] = ',';
    memcpy(kept + len, n, ilen);
    kept[len += ilen] = '\0';
  }
  memcpy(c->backend_options, kept, len + 1);
  return value ? dpt_backend_option_add(c, name, value, err, errcap) : 0;
}

int dpt_check_backend_options(const dp_config *c, char *err, size_t errcap) {
  if (dp_backend_options_check(c) == DP_ERR_INVALID)
    return dpt_fail(err, errcap, "%s", dpt_user_msg(dp_last_error()));
  return 0;
}

int dpt_parse_backend_option(const char *s, dp_config *c, char *err, size_t errcap) {
  const char *eq = s ? strchr(s, '=') : NULL;
  if (!s || !eq || eq == s || !eq[1] || s[strcspn(s, ITEM_SEPS)])
    return dpt_fail(err, errcap,
                    "--backend-option: '%s' is not NAME=VALUE (one option, e.g. tf32=1)",
                    s ? s : "");
  char name[DP_BACKEND_OPTIONS_CAP];
  snprintf(name, sizeof name, "%.*s", (int)(eq - s), s);
  return dpt_backend_option_add(c, name, eq + 1, err, errcap);
}

/* ---- common options ------------------------------------------------------------ */

static const struct option common_options[] = {
    {"batch", required_argument, NULL, DPT_OPT_BATCH},
    {"devices", required_argument, NULL, DPT_OPT_DEVICES},
    {"split", required_argument, NULL, DPT_OPT_SPLIT},
    {"micro-batch", required_argument, NULL, DPT_OPT_MICRO_BATCH},
    {"mode", required_argument, NULL, DPT_OPT_MODE},
    {"optimizer", required_argument, NULL, DPT_OPT_OPTIMIZER},
    {"inference", no_argument, NULL, DPT_OPT_INFERENCE},
    {"backend", required_argument, NULL, DPT_OPT_BACKEND},
    {"lr", required_argument, NULL, DPT_OPT_LR},
    {"momentum", required_argument, NULL, DPT_OPT_MOMENTUM},
    {"weight-decay", required_argument, NULL, DPT_OPT_WEIGHT_DECAY},
    {"beta1", required_argument, NULL, DPT_OPT_BETA1},
    {"beta2", required_argument, NULL, DPT_OPT_BETA2},
    {"eps", required_argument, NULL, DPT_OPT_EPS},
    {"seed", required_argument, NULL, DPT_OPT_SEED},
    {"shard-optimizer", no_argument, NULL, DPT_OPT_SHARD_OPTIMIZER},
    {"graph", no_argument, NULL, DPT_OPT_GRAPH},
    {"tf32", no_argument, NULL, DPT_OPT_TF32},
    {"fast-collectives", no_argument, NULL, DPT_OPT_FAST_COLLECTIVES},
    {"transport", required_argument, NULL, DPT_OPT_TRANSPORT},
    {"dampening", required_argument, NULL, DPT_OPT_DAMPENING},
    {"nesterov", no_argument, NULL, DPT_OPT_NESTEROV},
    {"ranks", required_argument, NULL, DPT_OPT_RANKS},
    {"clip-grad-norm", required_argument, NULL, DPT_OPT_CLIP_GRAD_NORM},
    {"clip-grad-value", required_argument, NULL, DPT_OPT_CLIP_GRAD_VALUE},
    {"amsgrad", no_argument, NULL, DPT_OPT_AMSGRAD},
    {"accumulate", required_argument, NULL, DPT_OPT_ACCUMULATE},
    {"recompute", required_argument, NULL, DPT_OPT_RECOMPUTE},
    {"precision", required_argument, NULL, DPT_OPT_PRECISION},
    {"reduce-precision", required_argument, NULL, DPT_OPT_REDUCE_PRECISION},
    {"batchnorm", required_argument, NULL, DPT_OPT_BATCHNORM},
    {"backend-option", required_argument, NULL, DPT_OPT_BACKEND_OPTION},
    {"help", no_argument, NULL, 'h'},
};
#define N_COMMON N_OF(common_options)
#define MAX_EXTRA 48

int dpt_given(const dpt_common *c, int code) {
  if (!c || code < DPT_OPT_BATCH || code >= DPT_OPT_COMMON_END) return 0;
  return (int)((c->given >> (code - DPT_OPT_BATCH)) & 1ul);
}

/* A number in [0, 1) (momentum, betas). */
static int parse_below_one(const char *arg, const char *what, float *out, char *err,
                           size_t errcap) {
  float v = 0.0f;
  if (dpt_parse_float(arg, 0, 1, what, &v, err, errcap)) return -1;
  if (v >= 1.0f) /* 1, or a value that rounds to 1 as a float */
    return dpt_fail(err, errcap, "%s: %s is out of range [0, 1)", what, arg);
  *out = v;
  return 0;
}

static int set_common(int code, const char *arg, dp_config *c, char *err, size_t errcap) {
  switch (code) {
  case DPT_OPT_BATCH:
    return dpt_parse_int(arg, 1, INT_MAX, "--batch", &c->batch, err, errcap);
  case DPT_OPT_DEVICES:
    return dpt_parse_devices(arg, &c->n_devices, c->device_ids, err, errcap);
  case DPT_OPT_SPLIT: return dpt_parse_split(arg, &c->split, err, errcap);
  case DPT_OPT_MICRO_BATCH:
    return dpt_parse_int(arg, 0, INT_MAX, "--micro-batch", &c->micro_batch, err, errcap);
  case DPT_OPT_MODE: return dpt_parse_mode(arg, &c->mode, err, errcap);
  case DPT_OPT_OPTIMIZER: {
    dp_optimizer o;
    if (dpt_parse_optimizer(arg, &o, err, errcap)) return -1;
    dp_config_set_optimizer(c, o); /* PyTorch's defaults for it */
    return 0;
  }
  case DPT_OPT_INFERENCE: c->inference = 1; return 0;
  case DPT_OPT_BACKEND: return dpt_parse_backend(arg, &c->backend, err, errcap);
  case DPT_OPT_LR: /* 0 is the planner's to refuse, per configuration (dp repro) */
    if (dpt_parse_float(arg, -FLT_MAX, FLT_MAX, "--lr", &c->lr, err, errcap)) return -1;
    /* the range said as the library's (session 24: "[0, ...]" read as 0 allowed) */
    if (c->lr < 0)
      return dpt_fail(err, errcap,
                      "--lr: %s is out of range (0, %g]: a learning rate is > 0", arg,
                      (double)FLT_MAX);
    return 0;
  case DPT_OPT_MOMENTUM:
    return parse_below_one(arg, "--momentum", &c->momentum, err, errcap);
  case DPT_OPT_DAMPENING:
    return dpt_parse_float(arg, 0, 1, "--dampening", &c->dampening, err, errcap);
  case DPT_OPT_NESTEROV: c->nesterov = 1; return 0;
  case DPT_OPT_WEIGHT_DECAY:
    return dpt_parse_float(arg, 0, FLT_MAX, "--weight-decay", &c->weight_decay, err,
                           errcap);
  case DPT_OPT_BETA1: return parse_below_one(arg, "--beta1", &c->beta1, err, errcap);
  case DPT_OPT_BETA2: return parse_below_one(arg, "--beta2", &c->beta2, err, errcap);
  case DPT_OPT_EPS: {
    float v;
    if (dpt_parse_float(arg, 0, FLT_MAX, "--eps", &v, err, errcap)) return -1;
    if (!(v > 0.0f))
      return dpt_fail(err, errcap,
                      "--eps: %s is not above 0 (Adam(W) divides by sqrt(v) + eps)", arg);
    c->eps = v;
    return 0;
  }
  case DPT_OPT_SEED: return dpt_parse_u64(arg, "--seed", &c->seed, err, errcap);
  case DPT_OPT_RANKS:
    return dpt_parse_int(arg, 1, DP_MAX_DEVICES, "--ranks", &c->ranks, err, errcap);
  case DPT_OPT_ACCUMULATE: /* a power of two (the planner's rule), said before any work */
    if (dpt_parse_int(arg, 1, 65536, "--accumulate", &c->accumulate, err, errcap))
      return -1;
    if ((c->accumulate & (c->accumulate - 1)) == 0) return 0;
    snprintf(err, errcap, "--accumulate: %d is not a power of two (1, 2, 4, ... 65536)",
             c->accumulate);
    return -1;
  case DPT_OPT_RECOMPUTE: /* 0: off; at most a segment per layer */
    return dpt_parse_int(arg, 0, DP_MAX_LAYERS, "--recompute", &c->recompute, err, errcap);
  case DPT_OPT_PRECISION:
    if (dp_precision_parse(arg, &c->precision) == DP_OK) return 0;
    return dpt_fail(err, errcap,
                    "--precision %s: the options are fp32 and bf16 (bf16: mixed precision, "
                    "docs/PRECISION.md)",
                    arg);
  case DPT_OPT_REDUCE_PRECISION:
    if (dp_precision_parse(arg, &c->reduce_precision) == DP_OK) return 0;
    return dpt_fail(err, errcap,
                    "--reduce-precision %s: the options are fp32 and bf16 (bf16: the "
                    "gradients summed in bf16, docs/PRECISION.md)",
                    arg);
  case DPT_OPT_CLIP_GRAD_NORM: /* 0: no clipping (the default) */
    return dpt_parse_float(arg, 0, FLT_MAX, "--clip-grad-norm", &c->clip_grad_norm, err,
                           errcap);
  case DPT_OPT_CLIP_GRAD_VALUE: /* 0: no clamping (the default) */
    return dpt_parse_float(arg, 0, FLT_MAX, "--clip-grad-value", &c->clip_grad_value, err,
                           errcap);
  case DPT_OPT_SHARD_OPTIMIZER: c->shard_optimizer = 1; return 0;
  case DPT_OPT_AMSGRAD: c->amsgrad = 1; return 0; /* the planner refuses it for sgd */
  case DPT_OPT_GRAPH: return dpt_backend_option_add(c, "graph", "1", err, errcap);
  case DPT_OPT_TF32: return dpt_backend_option_add(c, "tf32", "1", err, errcap);
  case DPT_OPT_FAST_COLLECTIVES:
    return dpt_backend_option_add(c, "fast_collectives", "1", err, errcap);
  case DPT_OPT_BACKEND_OPTION: return dpt_parse_backend_option(arg, c, err, errcap);
  case DPT_OPT_TRANSPORT: return dpt_parse_transport(arg, &c->transport, err, errcap);
  case DPT_OPT_BATCHNORM: return dpt_parse_bn_mode(arg, &c->batchnorm, err, errcap);
  }
  return dpt_fail(err, errcap, "internal: unknown common option %d", code);
}

/* Levenshtein distance of a and b, capped: strings longer than 31 bytes are
 * "far" (99). */
int dpt_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 31 || lb > 31) return 99;
  int row[32];
  for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int up = row[j];
      int best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

/* What an unknown or ambiguous long option (tok, "--name" or "--name=value")
 * was, to err: the options it is a prefix of, or the nearest name (at most two
 * edits away, '_' read as '-'). */
int dpt_unknown_option(const struct option *opts, const char *tok, char *err,
                       size_t errcap) {
  char name[40];
  const char *n = strncmp(tok, "--", 2) == 0 ? tok + 2 : tok;
  size_t len = strcspn(n, "=");
  if (len >= sizeof name) len = sizeof name - 1;
  memcpy(name, n, len);
  name[len] = '\0';
  for (char *c = name; *c; c++)
    if (*c == '_') *c = '-';
  char list[160] = "";
  int prefixed = 0;
  const char *only = NULL; /* the one option name is a prefix of ('_' for '-') */
  for (const struct option *o = opts; o->name; o++)
    if (len && strncmp(o->name, name, len) == 0 && prefixed++ < 4) {
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s--%s",
               prefixed > 1 ? ", " : "", o->name);
      only = o->name;
    }
  if (prefixed > 1)
    return dpt_fail(err, errcap, "option '--%s' is ambiguous: %s%s", name, list,
                    prefixed > 4 ? ", ..." : "");
  if (prefixed == 1)
    return dpt_fail(err, errcap, "unknown option '%.*s'; did you mean '--%s'?",
                    (int)strcspn(tok, "="), tok, only);
  /* other tools' names for libdp's */
  static const char *const alias[][2] = {{"learning-rate", "lr"},
                                         {"batch-size", "batch"},
                                         {"num-epochs", "epochs"},
                                         {"gpus", "devices"},
                                         {"nproc-per-node", "devices"}};
  for (size_t i = 0; i < sizeof alias / sizeof *alias; i++)
    if (strcmp(name, alias[i][0]) == 0)
      for (const struct option *o = opts; o->name; o++)
        if (strcmp(o->name, alias[i][1]) == 0)
          return dpt_fail(err, errcap, "unknown option '%.*s'; did you mean '--%s'?",
                          (int)strcspn(tok, "="), tok, o->name);
  const char *best = NULL;
  int bd = 3;
  for (const struct option *o = opts; o->name; o++) {
    int d = dpt_distance(name, o->name);
    if (d < bd) {
      bd = d;
      best = o->name;
    }
  }
  /* a short name is near too many: only one edit from it */
  if (best && (bd <= 1 || len > 4))
    return dpt_fail(err, errcap, "unknown option '%.*s'; did you mean '--%s'?",
                    (int)strcspn(tok, "="), tok, best);
  return dpt_fail(err, errcap, "unknown option '%.*s'", (int)strcspn(tok, "="), tok);
}

static const char *option_name(const struct option *opts, int val) {
  for (const struct option *o = opts; o->name; o++)
    if (o->val == val && !o->flag) return o->name;
  return NULL;
}

int dpt_parse_args(int argc, char **argv, const struct option *extra, dpt_option_fn fn,
                   void *user, dp_config *cfg, dpt_common *common, char *err,
                   size_t errcap) {
  struct option opts[N_COMMON + MAX_EXTRA + 1];
  char shortopts[3 * MAX_EXTRA + 4] = ":h"; /* ':' = report a missing value as ':' */
  size_t nshort = 2;
  int n = 0;
  dpt_common local;
  if (!common) common = &local;
  memset(common, 0, sizeof *common);
  dp_config_default(cfg);
#ifdef DP_DEBUG
  cfg->guards = 1; /* checked builds: the tool guards its arenas by default */
#endif

  for (int i = 0; i < N_COMMON; i++) opts[n++] = common_options[i];
  for (const struct option *o = extra; o && o->name; o++) {
    if (n == N_COMMON + MAX_EXTRA)
      return dpt_fail(err, errcap, "internal: too many options");
    opts[n++] = *o;
    if (!o->flag && o->val > 0 && o->val < 128 && isalnum(o->val) && o->val != 'h') {
      shortopts[nshort++] = (char)o->val;
      if (o->has_arg == required_argument) shortopts[nshort++] = ':';
      if (o->has_arg == optional_argument) {
        shortopts[nshort++] = ':';
        shortopts[nshort++] = ':';
      }
      shortopts[nshort] = '\0';
    }
  }
  memset(&opts[n], 0, sizeof opts[n]);

  /* The common options' values, in command-line order: checked as they come
   * (on a scratch config), applied after the loop with --optimizer first. */
  enum { N_CODES = DPT_OPT_COMMON_END - DPT_OPT_BATCH };
  int order[N_CODES];
  const char *value[N_CODES];
  int n_given = 0;
  int seen_extra[MAX_EXTRA], n_seen_extra = 0;
  enum { MAX_BACKEND_ITEMS = 64 };
  const char *items[MAX_BACKEND_ITEMS]; /* --backend-option, each time, in order */
  int n_items = 0;
  dp_config scratch = *cfg;

  optind = 0; /* glibc: 0 forces a full reinitialisation of getopt's state */
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, shortopts, opts, NULL)) != -1) {
    const char *tok = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
    if (c == 'h') return DPT_ARGS_HELP;
    if (c == ':') {
      const char *name = optopt >= 0x100 ? option_name(opts, optopt) : NULL;
      if (name) return dpt_fail(err, errcap, "option --%s needs a value", name);
      if (optopt > 0 && optopt < 0x100) {
        name = option_name(opts, optopt);
        if (name && strncmp(tok, "--", 2) == 0)
          return dpt_fail(err, errcap, "option --%s needs a value", name);
        return dpt_fail(err, errcap, "option -%c needs a value", optopt);
      }
      return dpt_fail(err, errcap, "option %s needs a value", tok);
    }
    if (c == '?') {
      if (optopt == 0) return dpt_unknown_option(opts, tok, err, errcap);
      if (optopt >= 0x100 || (optopt == 'h' && strncmp(tok, "--", 2) == 0)) {
        const char *name = option_name(opts, optopt);
        return dpt_fail(err, errcap, "option --%s takes no value ('%s')", name ? name : "?",
                        tok);
      }
      if (isprint(optopt) && strncmp(tok, "--", 2) != 0)
        return dpt_fail(err, errcap, "unknown option '-%c'", optopt);
      return dpt_fail(err, errcap, "bad option '%s'", tok);
    }
    if (c >= DPT_OPT_BATCH && c < DPT_OPT_COMMON_END) {
      int again = dpt_given(common, c);
      if (again && optarg && c != DPT_OPT_BACKEND_OPTION)
        return dpt_fail(err, errcap, "--%s given twice", option_name(opts, c));
      if (set_common(c, optarg, &scratch, err, errcap)) return DPT_ARGS_ERROR;
      common->given |= 1ul << (c - DPT_OPT_BATCH);
      if (c == DPT_OPT_BACKEND_OPTION) { /* repeatable: applied after the others */
        if (n_items == MAX_BACKEND_ITEMS)
          return dpt_fail(err, errcap, "--backend-option given more than %d times",
                          MAX_BACKEND_ITEMS);
        items[n_items++] = optarg;
        continue;
      }
      if (!again) { /* a flag without a value may repeat: recorded once (order[] has
                       room for each common option once) */
        order[n_given] = c;
        value[n_given++] = optarg;
      }
      continue;
    }
    for (int i = 0; optarg && i < n_seen_extra; i++) /* a flag may repeat (-v -v) */
      if (seen_extra[i] == c) {
        const char *name = option_name(opts, c);
        if (name) return dpt_fail(err, errcap, "--%s given twice", name);
        return dpt_fail(err, errcap, "-%c given twice", c);
      }
    if (n_seen_extra < MAX_EXTRA) seen_extra[n_seen_extra++] = c;
    if (!fn) return dpt_fail(err, errcap, "internal: no handler for option '%s'", tok);
    if (fn(user, c, optarg, err, errcap)) return DPT_ARGS_ERROR;
  }
  /* --optimizer sets PyTorch's defaults for it; the explicit options override */
  for (int i = 0; i < n_given; i++)
    if (order[i] == DPT_OPT_OPTIMIZER && set_common(order[i], value[i], cfg, err, errcap))
      return DPT_ARGS_ERROR;
  for (int i = 0; i < n_given; i++)
    if (order[i] != DPT_OPT_OPTIMIZER && set_common(order[i], value[i], cfg, err, errcap))
      return DPT_ARGS_ERROR;
  for (int i = 0; i < n_items; i++)
    if (dpt_parse_backend_option(items[i], cfg, err, errcap)) return DPT_ARGS_ERROR;
  /* a micro-batch is a part of a batch (an outside check, session 23: 100000 of a
   * batch of 64 was taken and shown as it was given) */
  if (dpt_given(common, DPT_OPT_MICRO_BATCH) && dpt_given(common, DPT_OPT_BATCH) &&
      cfg->micro_batch > cfg->batch)
    return dpt_fail(err, errcap,
                    "--micro-batch %d is more than --batch %d: a micro-batch is a part of "
                    "a batch; give --micro-batch %d or less",
                    cfg->micro_batch, cfg->batch, cfg->batch);
  /* under mpirun, the job's processes (dp plan --ranks R plans one without) */
  if (!dpt_given(common, DPT_OPT_RANKS) && dpt_world_size() > 1)
    cfg->ranks = dpt_world_size();
  common->first_arg = optind;
  common->n_args = argc - optind;
  return DPT_ARGS_OK;
}

int dpt_job_devices(const dp_config *cfg, const dpt_common *common, char *err,
                    size_t errcap) {
  int ranks = dpt_world_size();
  if (ranks <= 1 || dpt_given(common, DPT_OPT_RANKS) || cfg->n_devices % ranks == 0)
    return 0;
  if (!dpt_given(common, DPT_OPT_DEVICES))
    return dpt_fail(err, errcap,
                    "--devices counts the whole job's devices, 1 when not given: give this "
                    "job of %d processes --devices %d (one a process) or a multiple of %d",
                    ranks, ranks, ranks);
  return dpt_fail(
      err, errcap,
      "--devices %d cannot be shared by this job's %d processes: each drives the "
      "same number of devices; give a multiple of %d",
      cfg->n_devices, ranks, ranks);
}

int dpt_parse_command(int argc, char **argv, const struct option *extra, dpt_option_fn fn,
                      void *user, void (*usage)(FILE *), dp_config *cfg, dpt_common *common,
                      char *err, size_t errcap) {
  dpt_common local;
  if (!common) common = &local;
  int r = dpt_parse_args(argc, argv, extra, fn, user, cfg, common, err, errcap);
  if (r == DPT_ARGS_HELP && usage) usage(stdout);
  if (r == DPT_ARGS_OK && common->n_args > 0)
    return dpt_fail(err, errcap, "unexpected argument '%s'", argv[common->first_arg]);
  return r;
}

int dpt_config_from_args(int argc, char **argv, dp_config *cfg, dpt_common *common,
                         char *err, size_t errcap) {
  dpt_common local;
  if (!common) common = &local;
  int r = dpt_parse_args(argc, argv, NULL, NULL, NULL, cfg, common, err, errcap);
  if (r == DPT_ARGS_OK && common->n_args > 0)
    return dpt_fail(err, errcap, "unexpected argument '%s'", argv[common->first_arg]);
  return r;
}

void dpt_print_common_help(FILE *f) {
  fputs("Configuration (the same options, with the same meaning, in every command):\n"
        "  --batch B               largest batch a step takes, in rows (the planned size)\n"
        "  --devices N|LIST        N replicas on devices 0..N-1 (default 1), or a comma\n"
        "                          list of physical device ids, one per replica:\n"
        "                          --devices 0,0,1,1 = 4 replicas, two on each of 2 GPUs\n"
        "  --split chunk|balanced|memory\n"
        "                          how the batch is cut along dim 0 (default chunk):\n"
        "                          chunk    = torch.chunk: ceil(B/N) rows per device,\n"
        "                                     the last may be short, fewer devices may\n"
        "                                     be used\n"
        "                          balanced = torch.tensor_split: the first B%N devices\n"
        "                                     get one row more\n"
        "                          memory   = device 0 gets fewer rows, so that the\n"
        "                                     largest arena is as small as it can be\n"
        "  --micro-batch K         rows per micro-batch (default 0 = each device's\n"
        "                          chunk); a fixed K makes results bit-identical\n"
        "                          across device counts\n"
        "  --mode classic|allreduce\n"
        "                          classic   = nn.DataParallel (default): outputs\n"
        "                                      gathered on device 0, loss, reduced\n"
        "                                      gradients and optimizer there, replicas\n"
        "                                      refreshed each step\n"
        "                          allreduce = DDP-like: each device computes its loss,\n"
        "                                      gradients all-reduced, every replica\n"
        "                                      updates; memory is balanced\n"
        "  --shard-optimizer       allreduce: each device keeps and updates only its\n"
        "                          shard of the optimizer state (ZeRO-1 style); the\n"
        "                          parameters are the same bits as without it\n"
        "  --batchnorm per_replica|sync\n"
        "                          batchnorm layers in training: per_replica = each\n"
        "                          micro-batch's own statistics (default; nn.DataParallel\n"
        "                          with one micro-batch per device); sync = the whole\n"
        "                          batch's (SyncBatchNorm), the same whatever the\n"
        "                          devices and micro-batches\n"
        "  --optimizer sgd|momentum|adamw|adam   (default sgd)\n"
        "  --inference             forward only: no gradients, no optimizer state\n"
        "  --backend cpu|cuda      cpu: threads as virtual devices (default); cuda: GPUs\n"
        "  --graph                 cuda: capture a step once as a CUDA graph and replay\n"
        "                          it (one launch per step; full batches only; the same\n"
        "                          bits as without it)\n"
        "  --tf32                  cuda: TF32 tensor cores for the GEMMs: faster, ~1e-3\n"
        "                          relative error, so no longer close to the cpu backend\n"
        "  --transport auto|copy|nccl\n"
        "                          cuda: how replicas on distinct GPUs move data (default\n"
        "                          auto: NCCL when built with it and every replica has a\n"
        "                          GPU of its own, else CUDA copies); the same bits\n"
        "                          either way.\n"
        "  --fast-collectives      cuda, allreduce, a GPU per replica: sum gradients with\n"
        "                          ncclAllReduce instead of the canonical tree; faster on\n"
        "                          many GPUs, bit-identical run to run only on a fixed\n"
        "                          topology and device count. The cpu backend refuses\n"
        "                          these four.\n"
        "  --backend-option NAME=VALUE\n"
        "                          one of the backend's own options, added to its list\n"
        "                          (repeatable), e.g. --backend-option tf32=1; --graph,\n"
        "                          --tf32 and --fast-collectives are graph=1, tf32=1\n"
        "                          and fast_collectives=1. The backend checks the names\n"
        "                          and values when planning. The cpu backend has\n"
        "                          params=copy|shared: shared, one copy of the\n"
        "                          parameters that every device reads (classic mode or\n"
        "                          --inference; the same bits, less memory)\n"
        "  --lr X                  learning rate, > 0 (default 0.01)\n"
        "Optimizer settings are PyTorch's, with its defaults but --lr's (PyTorch's\n"
        "is 0.001): --optimizer sets the defaults of the optimizer it names\n"
        "(whatever the option order), then the options below override them:\n"
        "    sgd      = torch.optim.SGD: momentum 0, dampening 0, no nesterov,\n"
        "               weight decay 0 (SGD with --momentum X > 0 is momentum SGD)\n"
        "    momentum = the same with momentum 0.9\n"
        "    adamw    = torch.optim.AdamW: betas 0.9 0.999, eps 1e-8, weight decay 0.01\n"
        "    adam     = torch.optim.Adam: the same with weight decay 0 (coupled L2)\n"
        "  --momentum X            sgd/momentum, in [0, 1) (default 0; momentum: 0.9)\n"
        "  --dampening X           sgd/momentum with momentum > 0, in [0, 1] (default 0)\n"
        "  --nesterov              sgd/momentum: Nesterov momentum (needs momentum > 0\n"
        "                          and dampening 0)\n"
        "  --weight-decay X        >= 0; sgd/momentum: L2 added to the gradient\n"
        "                          (default 0); adamw: decoupled decay (default 0.01);\n"
        "                          adam: L2 added to the gradient (default 0)\n"
        "  --beta1 X, --beta2 X    adam/adamw, each in [0, 1) (default 0.9, 0.999)\n"
        "  --eps X                 adam/adamw, > 0 (default 1e-8)\n"
        "  --amsgrad               adam/adamw: the AMSGrad variant (amsgrad=True): the\n"
        "                          step divides by the running maximum of v (a third\n"
        "                          state vector)\n"
        "  --clip-grad-norm X      torch.nn.utils.clip_grad_norm_(params, X) before\n"
        "                          every optimizer step: gradients scaled down when\n"
        "                          their total L2 norm is above X; >= 0 (default 0: off)\n"
        "  --clip-grad-value X     torch.nn.utils.clip_grad_value_(params, X) before\n"
        "                          every optimizer step: each gradient clamped to\n"
        "                          [-X, X]; >= 0 (default 0: off); not with\n"
        "                          --clip-grad-norm\n"
        "  --accumulate K          gradient accumulation: one optimizer step every K\n"
        "                          batches, on their mean gradient (bit-identical to one\n"
        "                          step of the K batches together; with the cross-\n"
        "                          entropy's weight or ignore_index, each batch's mean\n"
        "                          over K, as PyTorch's (loss / K).backward() loop); K a\n"
        "                          power of two\n"
        "  --recompute K           activation recompute: the forward keeps the outputs\n"
        "                          at the ends of segments of K layers, the backward\n"
        "                          recomputes the rest (bit-identical; 0: off)\n"
        "  --precision P           fp32 (default) or bf16: mixed precision, bf16\n"
        "                          activations and GEMM operands, fp32 master weights\n"
        "                          and accumulation (docs/PRECISION.md)\n"
        "  --reduce-precision P    fp32 (default) or bf16: the gradient reduction's sums\n"
        "                          rounded to bf16, half the bytes between processes\n"
        "                          and GPUs, the same bits for every layout\n"
        "  --seed N                parameter init and dropout, unsigned 64-bit\n"
        "  --ranks R               processes of the job (MPI ranks), each driving\n"
        "                          devices/R of the devices; under mpirun the default is\n"
        "                          the number of processes, else 1 (docs/DISTRIBUTED.md)\n"
        "Options take their value as '--opt value' or '--opt=value'; a unique prefix of\n"
        "an option name is accepted; an option that takes a value may be given once.\n",
        f);
}

/* The backend options of a config, when any is set (config.backend_options,
 * or a transport other than auto); shown on a cpu config too, since the
 * planner refuses them there and the line should show why. */
static void print_backend_options(FILE *f, const dp_config *c) {
  static const char *const known[][2] = {
      {"graph", "cuda graph"}, {"tf32", "tf32"}, {"fast_collectives", "fast collectives"}};
  const char *o = c->backend_options;
  char v[DP_BACKEND_OPTIONS_CAP];
  int sep = 0;
  if (dpt_backend_option_get(o, "transport", v, sizeof v))
    sep = fprintf(f, " (transport %s", v) > 0;
  else if (c->transport != DP_TRANSPORT_AUTO)
    sep = fprintf(f, " (transport %s", dp_transport_name(c->transport)) > 0;
  for (size_t k = 0; k < sizeof known / sizeof *known; k++)
    if (dpt_backend_option_on(o, known[k][0]))
      fprintf(f, "%s%s", sep++ ? ", " : " (", known[k][1]);
  const char *at = o, *n, *iv;
  size_t nlen, vlen;
  while (next_item(&at, &n, &nlen, &iv, &vlen)) {
    int shown = nlen == strlen("transport") && !strncmp(n, "transport", nlen);
    for (size_t k = 0; k < sizeof known / sizeof *known; k++)
      if (nlen == strlen(known[k][0]) && !strncmp(n, known[k][0], nlen) &&
          (vlen == 1 && (*iv == '1' || *iv == '0')))
        shown = 1;
    if (vlen == 1 && *iv == '0') shown = 1; /* an option at 0: nothing to show */
    if (!shown) fprintf(f, "%s%.*s", sep++ ? ", " : " (", (int)(at - n), n);
  }
  if (sep) fputc(')', f);
}

void dpt_print_config(FILE *f, const dp_config *c) {
  fprintf(f, "batch %d on %d device%s", c->batch, c->n_devices,
          c->n_devices == 1 ? "" : "s");
  if (c->ranks > 1) fprintf(f, " in %d ranks x %d", c->ranks, c->n_devices / c->ranks);
  int identity = 1;
  for (int i = 0; i < c->n_devices && i < DP_MAX_DEVICES; i++)
    if (c->device_ids[i] != i) identity = 0;
  if ((dp_backend_caps(c->backend) & DP_BACKEND_CAP_DEVICES) || !identity) {
    fputs(" [ids ", f);
    for (int i = 0; i < c->n_devices && i < DP_MAX_DEVICES; i++)
      fprintf(f, "%s%d", i ? "," : "", c->device_ids[i]);
    fputc(']', f);
  }
  fprintf(f, " (%s split, micro-batch ", dp_split_name(c->split));
  if (c->micro_batch > 0)
    fprintf(f, "%d)", c->micro_batch);
  else
    fputs("= chunk)", f);
  fprintf(f, ", %s mode%s, ", dp_mode_name(c->mode),
          c->shard_optimizer ? " with sharded optimizer state" : "");
  if (c->inference) {
    fputs("inference", f);
  } else {
    fprintf(f, "%s (lr %g", dp_optimizer_name(c->optimizer), (double)c->lr);
    if (c->momentum > 0.0f) fprintf(f, ", momentum %g", (double)c->momentum);
    if (c->dampening != 0.0f) fprintf(f, ", dampening %g", (double)c->dampening);
    if (c->nesterov) fputs(", nesterov", f);
    if (c->optimizer == DP_OPT_ADAMW || c->optimizer == DP_OPT_ADAM)
      fprintf(f, ", betas %g %g, eps %g%s", (double)c->beta1, (double)c->beta2,
              (double)c->eps, c->amsgrad ? ", amsgrad" : "");
    if (c->weight_decay > 0.0f) fprintf(f, ", weight decay %g", (double)c->weight_decay);
    if (c->clip_grad_norm > 0.0f)
      fprintf(f, ", clip grad norm %g", (double)c->clip_grad_norm);
    if (c->clip_grad_value > 0.0f)
      fprintf(f, ", clip grad value %g", (double)c->clip_grad_value);
    if (c->accumulate > 1) fprintf(f, ", accumulating %d batches per step", c->accumulate);
    if (c->recompute > 0) fprintf(f, ", recompute every %d layers", c->recompute);
    if (c->reduce_precision != DP_PRECISION_FP32)
      fprintf(f, ", gradients reduced in %s", dp_precision_name(c->reduce_precision));
    fputs("), training", f);
    if (c->batchnorm != DP_BN_PER_REPLICA)
      fprintf(f, " with %s batchnorm", dp_bn_mode_name(c->batchnorm));
  }
  if (c->precision != DP_PRECISION_FP32)
    fprintf(f, ", %s mixed precision", dp_precision_name(c->precision));
  fprintf(f, ", %s backend", dp_backend_name(c->backend));
  print_backend_options(f, c);
  fprintf(f, ", seed %llu", (unsigned long long)c->seed);
}

int dpt_require_backend(const dp_config *c, char *err, size_t errcap) {
  /* a kind without a name: the planner says so */
  if ((int)c->backend < 0 || (int)c->backend >= dp_backend_count()) return 0;
  /* virtual devices run anywhere */
  if (dp_backend_available(c->backend) &&
      !(dp_backend_caps(c->backend) & DP_BACKEND_CAP_DEVICES))
    return 0;
  if (dp_backend_device_count(c->backend) > 0) return 0;
  /* the library's reason: not registered, or none visible ("no usable GPU ...") */
  return dpt_fail(err, errcap, "--backend %s: %s", dp_backend_name(c->backend),
                  dpt_user_msg(dp_last_error()));
}

double dpt_now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- messages and files for people ------------------------------------------- */

/* Length of a library location " [name.c:123]" at s, or 0. */
static size_t location_len(const char *s) {
  if (s[0] != ' ' || s[1] != '[') return 0;
  size_t i = 2;
  int dot = 0;
  while (isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '-' || s[i] == '.') {
    dot |= s[i] == '.';
    i++;
  }
  if (i == 2 || !dot || s[i] != ':' || !isdigit((unsigned char)s[i + 1])) return 0;
  i++;
  while (isdigit((unsigned char)s[i])) i++;
  return s[i] == ']' ? i + 1 : 0;
}

const char *dpt_user_msg(const char *lib_msg) {
  static char buf[2048];
  size_t j = 0;
  for (const char *p = lib_msg ? lib_msg : ""; *p && j + 1 < sizeof buf;) {
    size_t skip = location_len(p);
    if (skip) {
      p += skip;
      continue;
    }
    buf[j++] = *p++;
  }
  buf[j] = '\0';
  return buf;
}

/* What a file that is not a regular file is. */
static const char *not_regular(mode_t m) {
  if (S_ISDIR(m)) return "is a directory";
  if (S_ISFIFO(m)) return "is a FIFO (named pipe), not a regular file";
  if (S_ISCHR(m)) return "is a character device, not a regular file";
  if (S_ISBLK(m)) return "is a block device, not a regular file";
  if (S_ISSOCK(m)) return "is a socket, not a regular file";
  return "is not a regular file";
}

int dpt_open_regular(const char *path, const char *what, char *err, size_t errcap) {
  if (!path || !*path)
    return dpt_fail(err, errcap, "cannot read %s: empty file name", what);
  /* O_NONBLOCK: opening a FIFO that has no writer returns at once, so that
   * the type check below happens instead of a wait for a writer */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return dpt_fail(err, errcap, "cannot read %s '%s': %s", what, path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return dpt_fail(err, errcap, "cannot read %s '%s': %s", what, path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return dpt_fail(err, errcap, "cannot read %s '%s': %s", what, path,
                    not_regular(st.st_mode));
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
    int e = errno;
    close(fd);
    return dpt_fail(err, errcap, "cannot read %s '%s': %s", what, path, strerror(e));
  }
  return fd;
}

int dpt_load_model(const char *path, dp_model **out, char *err, size_t errcap) {
  *out = NULL;
  int fd = dpt_open_regular(path, "model", err, errcap);
  if (fd < 0) return -1;
  close(fd);
  if (dp_model_load(path, out) == DP_OK) return 0;
  return dpt_fail(err, errcap, "%s", dpt_user_msg(dp_last_error()));
}

int dpt_model_sequence(const dp_model *m, int *vocab) {
  dp_layer_info l0;
  if (dp_model_n_layers(m) < 1 || dp_model_layer(m, 0, &l0) ||
      l0.kind != DP_LAYER_EMBEDDING)
    return 0;
  if (vocab) *vocab = l0.vocab;
  return l0.positions;
}

int dpt_require_loss(const char *path, const dp_model *m, const dp_config *c, char *err,
                     size_t errcap) {
  if ((c && c->inference) || dp_model_loss(m) != DP_LOSS_NONE) return 0;
  return dpt_fail(err, errcap,
                  "model '%s' has no loss line; training needs one (end it with 'loss "
                  "softmax_cross_entropy' or 'loss mse'%s)",
                  path, c ? ", or plan with --inference" : "");
}

int dpt_check_writable(const char *path, const char *what, int replace, char *err,
                       size_t errcap) {
  if (dp_file_check(path, what, !replace) == DP_OK) return 0;
  return dpt_fail(err, errcap, "%s", dpt_user_msg(dp_last_error()));
}

/* The identities of a path: what it names (followed) and the entry itself
 * (not followed, the thing a rename replaces); 0 for those that do not exist. */
typedef struct {
  int n;
  dev_t dev[2];
  ino_t ino[2];
} file_ids;

static file_ids ids_of(const char *path, int entry_too) {
  file_ids id = {0};
  struct stat st;
  if (stat(path, &st) == 0) {
    id.dev[id.n] = st.st_dev;
    id.ino[id.n++] = st.st_ino;
  }
  if (entry_too && lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
    id.dev[id.n] = st.st_dev;
    id.ino[id.n++] = st.st_ino;
  }
  return id;
}

static int ids_meet(const file_ids *a, const file_ids *b) {
  for (int i = 0; i < a->n; i++)
    for (int j = 0; j < b->n; j++)
      if (a->dev[i] == b->dev[j] && a->ino[i] == b->ino[j]) return 1;
  return 0;
}

/* Two paths naming one entry that does not exist yet (x.ckpt and ./x.ckpt):
 * the same last name in the same directory. */
static int same_new_entry(const char *a, const char *b) {
  struct stat st, dst[2];
  const char *p[2] = {a, b}, *name[2];
  for (int i = 0; i < 2; i++) {
    if (lstat(p[i], &st) == 0) return 0; /* ids_of compares what exists */
    const char *slash = strrchr(p[i], '/');
    name[i] = slash ? slash + 1 : p[i];
    size_t n = !slash ? 0 : slash == p[i] ? 1 : (size_t)(slash - p[i]);
    char dir[4096];
    if (!*name[i] || n >= sizeof dir) return 0;
    memcpy(dir, n ? p[i] : ".", n ? n : 1);
    dir[n ? n : 1] = '\0';
    if (stat(dir, &dst[i]) != 0) return 0;
  }
  return strcmp(name[0], name[1]) == 0 && dst[0].st_dev == dst[1].st_dev &&
         dst[0].st_ino == dst[1].st_ino;
}

int dpt_check_distinct(const dpt_file_role *outs, int n_outs, const dpt_file_role *ins,
                       int n_ins, char *err, size_t errcap) {
  for (int o = 0; o < n_outs; o++) {
    if (!outs[o].path) continue;
    file_ids out = ids_of(outs[o].path, 1);
    for (int i = 0; i < n_ins; i++) {
      if (!ins[i].path) continue;
      file_ids in = ids_of(ins[i].path, 0);
      if (ids_meet(&out, &in))
        return dpt_fail(err, errcap, "cannot write %s '%s': it is the %s '%s' it reads",
                        outs[o].what, outs[o].path, ins[i].what, ins[i].path);
    }
    for (int k = 0; k < o; k++) {
      if (!outs[k].path) continue;
      file_ids other = ids_of(outs[k].path, 1);
      if (strcmp(outs[k].path, outs[o].path) == 0 || ids_meet(&out, &other) ||
          same_new_entry(outs[k].path, outs[o].path))
        return dpt_fail(err, errcap, "cannot write %s '%s': it is also the %s '%s'",
                        outs[o].what, outs[o].path, outs[k].what, outs[k].path);
    }
  }
  return 0;
}

int dpt_cpu_count(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int dpt_warn_oversubscribed(FILE *f, const char *cmd, int n_devices, dp_backend backend,
                            int n_cpus) {
  /* a backend of virtual devices runs a thread per device; under mpirun each
   * process runs its share of the job's devices on the CPUs it is bound to */
  int ranks = dpt_world_size() > 1 ? dpt_world_size() : 1;
  int local = (n_devices + ranks - 1) / ranks;
  if (!dp_backend_available(backend) ||
      (dp_backend_caps(backend) & DP_BACKEND_CAP_DEVICES) || local <= n_cpus)
    return 0;
  if (dpt_world_rank() != 0) return 1; /* said once, by rank 0 */
  if (ranks > 1)
    fprintf(f,
            "%s: warning: %d virtual devices per process on the %d CPU%s each process may "
            "use: the %s backend runs a thread per device, so they take turns and steps "
            "are many times slower; give each process %d cores (mpirun --bind-to none, or "
            "--map-by slot:PE=%d) or run more processes (docs/DISTRIBUTED.md)\n",
            cmd, local, n_cpus, n_cpus == 1 ? "" : "s", dp_backend_name(backend), local,
            local);
  else
    fprintf(f,
            "%s: warning: %d virtual devices on %d CPU%s: the %s backend runs a thread per "
            "device, so they take turns and steps are many times slower; use --devices %d "
            "or fewer for speed (docs/TOOL.md)\n",
            cmd, n_devices, n_cpus, n_cpus == 1 ? "" : "s", dp_backend_name(backend),
            n_cpus);
  return 1;
}

unsigned long long dpt_dir_device(const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  size_t n = !slash ? 0 : slash == path ? 1 : (size_t)(slash - path);
  if (n >= sizeof dir) return 0;
  memcpy(dir, n ? path : ".", n ? n : 1);
  dir[n ? n : 1] = '\0';
  struct stat st;
  return stat(dir, &st) == 0 ? (unsigned long long)st.st_dev : 0;
}
