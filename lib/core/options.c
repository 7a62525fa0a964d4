/* A backend's own options: dp_config.backend_options ("name=value" items)
 * parsed against the backend's table (dp_backend_ops.options), the plan's
 * copy printed back, and the deprecated cuda fields of dp_config mapped onto
 * options of the same meaning. The core knows no option of any backend: it
 * matches names and words from the table. */
#include "core/backend.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

static int n_options(const dp_backend_ops *be) {
  int n = 0;
  while (be->options && be->options[n].name && n < DP_MAX_BACKEND_OPTIONS) n++;
  return n;
}

static int find_option(const dp_backend_ops *be, const char *name, size_t len) {
  for (int i = 0; i < n_options(be); i++)
    if (strlen(be->options[i].name) == len && !strncmp(be->options[i].name, name, len))
      return i;
  return -1;
}

/* The index of word w (len bytes) among "a|b|c"; -1 when it is not one. */
static int find_word(const char *values, const char *w, size_t len) {
  int k = 0;
  for (const char *v = values;; k++) {
    size_t n = strcspn(v, "|");
    if (n == len && !strncmp(v, w, len)) return k;
    if (!v[n]) return -1;
    v += n + 1;
  }
}

static int n_words(const char *values) {
  int n = 1;
  for (const char *v = values; *v; v++) n += *v == '|';
  return n;
}

static dp_status no_such_option(const dp_backend_ops *be, const char *item, size_t len) {
  char names[256] = "";
  for (int i = 0, at = 0; i < n_options(be) && at < (int)sizeof names; i++)
    at += snprintf(names + at, sizeof names - (size_t)at, "%s%s", i ? ", " : "",
                   be->options[i].name);
  return DP_FAIL(DP_ERR_INVALID, "backend option '%.*s': the %s backend has %s%s", (int)len,
                 item, be->name,
                 n_options(be) > 1 ? "the options "
                 : n_options(be)   ? "the option "
                                   : "no options",
                 names);
}

/* The deprecated fields of dp_config: the cuda backend's options before
 * backend_options existed, kept for programs that set them. */
static const struct {
  const char *field, *option;
  size_t at;
} legacy[] = {
    {"cuda_graph", "graph", offsetof(dp_config, cuda_graph)},
    {"tf32", "tf32", offsetof(dp_config, tf32)},
    {"transport", "transport", offsetof(dp_config, transport)},
    {"fast_collectives", "fast_collectives", offsetof(dp_config, fast_collectives)},
};

static dp_status parse_items(const dp_backend_ops *be, const char *text,
                             int opt[DP_MAX_BACKEND_OPTIONS], bool set[]) {
  for (const char *s = text; *s;) {
    s += strspn(s, ", \t");
    size_t len = strcspn(s, ", \t");
    if (!len) break;
    const char *eq = memchr(s, '=', len);
    if (!eq || eq == s)
      return DP_FAIL(DP_ERR_INVALID, "backend option '%.*s' is not name=value", (int)len,
                     s);
    int i = find_option(be, s, (size_t)(eq - s));
    if (i < 0) return no_such_option(be, s, (size_t)(eq - s));
    const dp_backend_option *o = &be->options[i];
    int v = find_word(o->values, eq + 1, len - (size_t)(eq - s) - 1);
    if (v < 0)
      return DP_FAIL(DP_ERR_INVALID, "backend option '%.*s': %s takes %s", (int)len, s,
                     o->name, o->values);
    if (set[i] && opt[i] != v)
      return DP_FAIL(DP_ERR_INVALID,
                     "backend option %s is given twice, with different values", o->name);
    opt[i] = v;
    set[i] = true;
    s += len;
  }
  return DP_OK;
}

dp_status dp__backend_options(const dp_backend_ops *be, const dp_config *c,
                              int opt[DP_MAX_BACKEND_OPTIONS]) {
  bool set[DP_MAX_BACKEND_OPTIONS] = {false};
  memset(opt, 0, DP_MAX_BACKEND_OPTIONS * sizeof *opt);
  size_t len = strnlen(c->backend_options, sizeof c->backend_options);
  if (len == sizeof c->backend_options)
    return DP_FAIL(DP_ERR_INVALID, "backend_options is not terminated within %d bytes",
                   DP_BACKEND_OPTIONS_CAP);
  dp_status s = parse_items(be, c->backend_options, opt, set);
  if (s) return s;
  for (size_t k = 0; k < sizeof legacy / sizeof *legacy; k++) {
    int v;
    memcpy(&v, (const char *)c + legacy[k].at, sizeof v);
    if (!v) continue;
    int i = find_option(be, legacy[k].option, strlen(legacy[k].option));
    if (i < 0)
      return DP_FAIL(DP_ERR_INVALID,
                     "%s is a cuda backend option; this plan is for the %s "
                     "backend",
                     legacy[k].field, be->name);
    if (v < 0 || v >= n_words(be->options[i].values))
      return DP_FAIL(DP_ERR_INVALID, "config.%s is %d; the %s backend's option %s takes %s",
                     legacy[k].field, v, be->name, legacy[k].option, be->options[i].values);
    if (set[i] && opt[i] != v)
      return DP_FAIL(DP_ERR_INVALID, "config.%s (%d) and backend option %s disagree",
                     legacy[k].field, v, legacy[k].option);
    opt[i] = v;
    set[i] = true;
  }
  return DP_OK;
}

int dp__fit_backend_options(const dp_config *c, char (*out)[DP_BACKEND_OPTIONS_CAP],
                            int cap) {
  snprintf(out[0], DP_BACKEND_OPTIONS_CAP, "%s", c->backend_options);
  const dp_backend_ops *be = dp__backend_ops(c->backend);
  int opt[DP_MAX_BACKEND_OPTIONS] = {0}, n = 1;
  bool set[DP_MAX_BACKEND_OPTIONS] = {false};
  if (!be || cap < 1 ||
      strnlen(c->backend_options, DP_BACKEND_OPTIONS_CAP) == DP_BACKEND_OPTIONS_CAP ||
      parse_items(be, c->backend_options, opt, set))
    return 1;
  for (int i = 0; i < n_options(be); i++) {
    if (!be->options[i].fit || set[i]) continue;
    /* every string so far, again with each of the option's other words */
    int have = n;
    for (int w = 1; w < n_words(be->options[i].values); w++)
      for (int k = 0; k < have && n < cap; k++) {
        const char *v = be->options[i].values;
        for (int j = 0; j < w; j++) v = strchr(v, '|') + 1;
        int len =
            snprintf(out[n], DP_BACKEND_OPTIONS_CAP, "%s%s%s=%.*s", out[k],
                     out[k][0] ? "," : "", be->options[i].name, (int)strcspn(v, "|"), v);
        if (len > 0 && len < DP_BACKEND_OPTIONS_CAP) n++;
      }
  }
  return n;
}

dp_status dp_backend_option_info(dp_backend b, int i, const char **name,
                                 const char **values, const char **help) {
  const dp_backend_ops *be = dp__backend_ops(b);
  if (name) *name = NULL;
  if (values) *values = NULL;
  if (help) *help = NULL;
  if (!be)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "dp_backend_option_info: backend %s (%d) is not "
                   "registered",
                   dp_backend_name(b), (int)b);
  if (i < 0 || i >= n_options(be))
    return DP_FAIL(DP_ERR_RANGE,
                   "dp_backend_option_info: no option %d: the %s backend has %d option%s%s",
                   i, be->name, n_options(be), n_options(be) == 1 ? "" : "s",
                   n_options(be) ? " (from 0)" : "");
  if (name) *name = be->options[i].name;
  if (values) *values = be->options[i].values;
  if (help) *help = be->options[i].help;
  return DP_OK;
}

dp_status dp_backend_options_check(const dp_config *c) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp_backend_options_check: config is NULL");
  const dp_backend_ops *be = dp__backend_ops(c->backend);
  if (!be)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "dp_backend_options_check: backend %s (%d) is not registered",
                   dp_backend_name(c->backend), (int)c->backend);
  int opt[DP_MAX_BACKEND_OPTIONS];
  return dp__backend_options(be, c, opt);
}

dp_status dp_plan_backend_options(const dp_plan *p, char *buf, size_t cap) {
  if (!p || !buf || !cap)
    return DP_FAIL(DP_ERR_INVALID, "dp_plan_backend_options: %s",
                   !p     ? "plan is NULL"
                   : !buf ? "buf is NULL"
                          : "cap is 0");
  buf[0] = '\0';
  const dp_backend_ops *be = dp__backend_ops(p->cfg.backend);
  size_t at = 0;
  for (int i = 0; be && i < n_options(be) && at < cap; i++) {
    const char *v = be->options[i].values;
    for (int k = 0; k < p->bopt[i] && strchr(v, '|'); k++) v = strchr(v, '|') + 1;
    int n = snprintf(buf + at, cap - at, "%s%s=%.*s", i ? " " : "", be->options[i].name,
                     (int)strcspn(v, "|"), v);
    at += n > 0 ? (size_t)n : 0;
  }
  return DP_OK;
}
