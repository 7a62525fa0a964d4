/* The .dpm text format: one layer per line, '#' comments, shapes inferred.
 * Every error names "name:line:col" and says what was expected. */
#include "model/model.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <fcntl.h>
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
  const char *s; /* token start */
  int len;
  int col; /* 1-based */
} token;

#define MAX_TOKENS 16

/* Splits one line (without its newline) into tokens, stopping at '#'. */
static int tokenize(const char *line, int len, token *t, int cap) {
  int n = 0;
  for (int i = 0; i < len;) {
    if (line[i] == '#') break;
    if (isspace((unsigned char)line[i])) {
      i++;
      continue;
    }
    int j = i;
    while (j < len && !isspace((unsigned char)line[j]) && line[j] != '#') j++;
    if (n < cap) t[n] = (token){line + i, j - i, i + 1};
    n++;
    i = j;
  }
  return n;
}

static bool tok_is(const token *t, const char *w) {
  return (size_t)t->len == strlen(w) && memcmp(t->s, w, (size_t)t->len) == 0;
}

typedef struct {
  const char *name;
  int line;
} where;

#define SPEC_FAIL(st, w, col, ...) spec_fail((st), (w), (col), __LINE__, __VA_ARGS__)
static dp_status spec_fail(dp_status st, where w, int col, int srcline, const char *fmt,
                           ...) __attribute__((format(printf, 5, 6)));
static dp_status spec_fail(dp_status st, where w, int col, int srcline, const char *fmt,
                           ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return dp__error(st, __FILE__, srcline, "%s:%d:%d: %s", w.name, w.line, col, msg);
}

/* A token as messages echo it: whole up to 40 bytes, else its first 32 and
 * "...", so that the closing quote is always there. */
typedef struct {
  char s[48];
} echo_buf;
static const char *echo(const token *t, echo_buf *b) {
  if (t->len <= 40)
    snprintf(b->s, sizeof b->s, "%.*s", t->len, t->s);
  else
    snprintf(b->s, sizeof b->s, "%.32s...", t->s);
  return b->s;
}

/* A positive int: a width, or what noun names (a kernel size, a head count). */
static dp_status parse_width(const token *t, where w, const char *what, const char *noun,
                             int *out) {
  echo_buf e;
  for (int i = 0; i < t->len; i++)
    if (!isdigit((unsigned char)t->s[i]))
      return SPEC_FAIL(DP_ERR_PARSE, w, t->col, "%s: expected a positive integer, got '%s'",
                       what, echo(t, &e));
  int i = 0;
  while (i < t->len - 1 && t->s[i] == '0') i++; /* leading zeros */
  long long v = 0;
  for (; i < t->len && v <= DP_MAX_WIDTH; i++) v = v * 10 + (t->s[i] - '0');
  if (v > DP_MAX_WIDTH)
    return SPEC_FAIL(DP_ERR_PARSE, w, t->col, "%s: %s '%s' is too large (max %d)", what,
                     noun, echo(t, &e), DP_MAX_WIDTH);
  if (v == 0)
    return SPEC_FAIL(DP_ERR_PARSE, w, t->col, "%s: %s %s is out of range (1..%d)", what,
                     noun, echo(t, &e), DP_MAX_WIDTH);
  *out = (int)v;
  return DP_OK;
}

static dp_status parse_prob(const token *t, where w, float *out) {
  char buf[32];
  echo_buf e;
  if (t->len >= (int)sizeof buf)
    return SPEC_FAIL(DP_ERR_PARSE, w, t->col,
                     "dropout: expected a probability in [0, 1), got '%s'", echo(t, &e));
  memcpy(buf, t->s, (size_t)t->len);
  buf[t->len] = '\0';
  char *end;
  errno = 0;
  /* decimal only: strtod takes hexadecimal (0x0.8p0) too */
  bool decimal = strspn(buf, "0123456789.eE+-") == strlen(buf);
  double v = strtod(buf, &end);
  if (!decimal || errno || *end || end == buf || !(v >= 0.0 && v < 1.0))
    return SPEC_FAIL(DP_ERR_PARSE, w, t->col,
                     "dropout: expected a probability in [0, 1), got '%s'", buf);
  if (!((float)v < 1.0f)) /* e.g. 0.99999999: below 1, but 1 as a float */
    return SPEC_FAIL(DP_ERR_PARSE, w, t->col,
                     "dropout: probability '%s' rounds to 1 as a float; expected [0, 1)",
                     buf);
  *out = (float)v;
  return DP_OK;
}

/* Refuses tokens after the `n` a keyword takes. */
static dp_status no_more(const token *t, int nt, int n, where w, const char *kw) {
  if (nt <= n) return DP_OK;
  int k = n < MAX_TOKENS ? n : MAX_TOKENS - 1;
  echo_buf e;
  return SPEC_FAIL(DP_ERR_PARSE, w, t[k].col, "unexpected '%s' after '%s'", echo(&t[k], &e),
                   kw);
}

/* Re-labels a builder error with the spec location. */
static dp_status at(dp_status s, where w, int col) {
  if (s == DP_OK) return s;
  char msg[DP_ERRMSG_CAP];
  snprintf(msg, sizeof msg, "%s", dp_last_error());
  /* drop the builder's " [file:line]" suffix (the last " [": the message itself
   * may contain one, as in "in [0, 1)") */
  char *tail = NULL;
  for (char *q = strstr(msg, " ["); q; q = strstr(q + 1, " [")) tail = q;
  if (tail) *tail = '\0';
  return SPEC_FAIL(s == DP_ERR_INVALID ? DP_ERR_PARSE : s, w, col, "%s", msg);
}

/* conv2d OUT K [stride S] [padding P] [nobias] | maxpool2d K [stride S]
 * [padding P] | avgpool2d K [stride S] [padding P] [exclude_pad]: the options
 * in any order, each once. */
static dp_status parse_window(dp_model **m, const token *t, int nt, where w) {
  const token *kw = &t[0];
  bool conv = tok_is(kw, "conv2d"), avg = tok_is(kw, "avgpool2d");
  char what[16];
  snprintf(what, sizeof what, "%.*s", kw->len, kw->s);
  int need = conv ? 2 : 1, v[2] = {0, 0};
  static const char *const names[2] = {"output channels", "kernel size"};
  static const char *const usage[3] = {"conv2d OUT K [stride S] [padding P] [nobias]",
                                       "maxpool2d K [stride S] [padding P]",
                                       "avgpool2d K [stride S] [padding P] [exclude_pad]"};
  const char *use = usage[conv ? 0 : avg ? 2 : 1];
  echo_buf e;
  for (int i = 0; i < need; i++) {
    if (nt < 2 + i)
      return SPEC_FAIL(DP_ERR_PARSE, w, i ? t[i].col + t[i].len + 1 : kw->col + kw->len + 1,
                       "%s: expected %s (%s)", what, names[conv ? i : 1], use);
    dp_status s = parse_width(&t[1 + i], w, what, names[conv ? i : 1], &v[i]);
    if (s) return s;
  }
  int stride = 0, pad = 0, bias = 1, exclude = 0, pad_col = 0;
  bool seen[4] = {false, false, false, false};
  for (int i = 1 + need; i < nt && i < MAX_TOKENS; i++) {
    const token *o = &t[i];
    int which = tok_is(o, "stride")        ? 0
                : tok_is(o, "padding")     ? 1
                : tok_is(o, "nobias")      ? 2
                : tok_is(o, "exclude_pad") ? 3
                                           : -1;
    if (which < 0 || (which == 2 && !conv) || (which == 3 && !avg))
      return SPEC_FAIL(DP_ERR_PARSE, w, o->col, "%s: expected %s, got '%s'", what,
                       conv  ? "'stride S', 'padding P' or 'nobias'"
                       : avg ? "'stride S', 'padding P' or 'exclude_pad'"
                             : "'stride S' or 'padding P'",
                       echo(o, &e));
    if (seen[which])
      return SPEC_FAIL(DP_ERR_PARSE, w, o->col, "%s: '%.*s' given twice", what, o->len,
                       o->s);
    seen[which] = true;
    if (which >= 2) {
      if (which == 2) bias = 0;
      if (which == 3) exclude = 1;
      continue;
    }
    if (i + 1 >= nt)
      return SPEC_FAIL(DP_ERR_PARSE, w, o->col + o->len + 1,
                       "%s: expected a number after '%s'", what,
                       which ? "padding" : "stride");
    const token *num = &t[++i];
    if (which == 1) pad_col = num->col;
    /* padding 0 (or 00: parse_width's leading zeros) */
    int zeros = 0;
    while (zeros < num->len && num->s[zeros] == '0') zeros++;
    if (which == 1 && num->len >= 1 && zeros == num->len) continue;
    dp_status s =
        parse_width(num, w, what, which ? "padding" : "stride", which ? &pad : &stride);
    if (s) return s;
  }
  if (nt > MAX_TOKENS) return no_more(t, nt, MAX_TOKENS, w, what);
  if (conv) return at(dp_model_add_conv2d(*m, v[0], v[1], stride, pad, bias), w, kw->col);
  if (pad > v[0] / 2) /* PyTorch's rule; said here at the number */
    return SPEC_FAIL(DP_ERR_PARSE, w, pad_col,
                     "%s: padding %d is more than half the kernel size %d (PyTorch "
                     "requires padding <= kernel / 2)",
                     what, pad, v[0]);
  return at(dp_model_add_pool2d_padded(*m, avg ? DP_LAYER_AVGPOOL2D : DP_LAYER_MAXPOOL2D,
                                       v[0], stride, pad, exclude),
            w, kw->col);
}

/* embed V D | attention H */
static dp_status parse_sequence(dp_model **m, const token *t, int nt, where w) {
  const token *kw = &t[0];
  bool embed = tok_is(kw, "embed");
  const char *what = embed ? "embed" : "attention";
  int need = embed ? 2 : 1, v[2] = {0, 0};
  for (int i = 0; i < need; i++) {
    if (nt < 2 + i)
      return SPEC_FAIL(
          DP_ERR_PARSE, w, i ? t[i].col + t[i].len + 1 : kw->col + kw->len + 1,
          "%s: expected %s", what,
          embed ? (i ? "the width D (embed V D)" : "the vocabulary V (embed V D)")
                : "the number of heads (attention H)");
    dp_status s = parse_width(&t[1 + i], w, what,
                              embed ? (i ? "width" : "vocabulary") : "head count", &v[i]);
    if (s) return s;
  }
  float p = 0.0f; /* attention H dropout P */
  int used = 1 + need;
  if (!embed && nt > used && tok_is(&t[used], "dropout")) {
    if (nt < used + 2)
      return SPEC_FAIL(DP_ERR_PARSE, w, t[used].col + t[used].len + 1,
                       "attention: expected a probability after 'dropout'");
    dp_status s = parse_prob(&t[used + 1], w, &p);
    if (s) return s;
    used += 2;
  }
  dp_status s = no_more(t, nt, used, w, what);
  if (s) return s;
  return at(embed ? dp_model_add_embedding(*m, v[0], v[1])
                  : dp_model_add_attention_dropout(*m, v[0], p),
            w, kw->col);
}

/* A decimal number in [lo, hi] (lo excluded when lo_open), as a float: the
 * value of `what` ("batchnorm: eps"); `expect` says the range to people ("a
 * number in (0, 1]"). */
static dp_status parse_real(const token *t, where w, const char *what, const char *expect,
                            double lo, bool lo_open, double hi, float *out) {
  char buf[32];
  echo_buf e;
  if (t->len >= (int)sizeof buf)
    return SPEC_FAIL(DP_ERR_PARSE, w, t->col, "%s: expected %s, got '%s'", what, expect,
                     echo(t, &e));
  memcpy(buf, t->s, (size_t)t->len);
  buf[t->len] = '\0';
  char *end;
  errno = 0;
  bool decimal = strspn(buf, "0123456789.eE+-") == strlen(buf); /* no hex, inf, nan */
  double v = strtod(buf, &end);
  float f = (float)v;
  if (!decimal || errno || *end || end == buf || !((lo_open ? f > lo : f >= lo) && f <= hi))
    return SPEC_FAIL(DP_ERR_PARSE, w, t->col, "%s: expected %s, got '%s'", what, expect,
                     buf);
  *out = f;
  return DP_OK;
}

/* layernorm [eps E] | batchnorm [eps E] [momentum M | momentum none]: the
 * options in any order, each once. */
static dp_status parse_norm(dp_model **m, const token *t, int nt, where w) {
  bool bn = tok_is(&t[0], "batchnorm");
  const char *what = bn ? "batchnorm" : "layernorm";
  float eps = DP_NORM_EPS, momentum = 0.1f;
  bool seen[2] = {false, false};
  echo_buf e;
  for (int i = 1; i < nt && i < MAX_TOKENS; i += 2) {
    const token *o = &t[i];
    int which = tok_is(o, "eps") ? 0 : bn && tok_is(o, "momentum") ? 1 : -1;
    if (which < 0)
      return SPEC_FAIL(DP_ERR_PARSE, w, o->col,
                       "%s: expected %s or end of line, got '%s'%s", what,
                       bn ? "'eps E' or 'momentum M|none'" : "'eps E'", echo(o, &e),
                       memchr(o->s, '=', (size_t)o->len)
                           ? " (an option is two words: 'eps 1e-3', not 'eps=1e-3')"
                           : "");
    if (seen[which])
      return SPEC_FAIL(DP_ERR_PARSE, w, o->col, "%s: '%.*s' given twice", what, o->len,
                       o->s);
    seen[which] = true;
    if (i + 1 >= nt || i + 1 >= MAX_TOKENS)
      return SPEC_FAIL(DP_ERR_PARSE, w, o->col + o->len + 1, "%s: expected %s after '%s'",
                       what, which ? "a number in [0, 1] or 'none'" : "a number in (0, 1]",
                       which ? "momentum" : "eps");
    char name[32];
    snprintf(name, sizeof name, "%s: %s", what, which ? "momentum" : "eps");
    dp_status s;
    if (which == 1 && tok_is(&t[i + 1], "none"))
      momentum = DP_BN_MOMENTUM_NONE;
    else if ((s = which
                      ? parse_real(&t[i + 1], w, name,
                                   "a number in [0, 1] or 'none' (PyTorch's momentum=None)",
                                   0.0, false, 1.0, &momentum)
                      : parse_real(&t[i + 1], w, name, "a number in (0, 1]", 0.0, true, 1.0,
                                   &eps)))
      return s;
  }
  if (nt > MAX_TOKENS) return no_more(t, nt, MAX_TOKENS, w, what);
  return at(bn ? dp_model_add_batchnorm(*m, eps, momentum)
               : dp_model_add_layernorm(*m, eps),
            w, t[0].col);
}

/* `gelu approximate none | tanh`, PyTorch's nn.GELU(approximate=...): none is
 * the exact form (DP_LAYER_GELU_ERF), tanh the one plain `gelu` has always
 * meant (kept, so that saved specs keep their bits). */
static dp_status parse_gelu(dp_model **m, const token *t, int nt, where w) {
  echo_buf e;
  if (!tok_is(&t[1], "approximate"))
    return SPEC_FAIL(DP_ERR_PARSE, w, t[1].col,
                     "expected 'approximate' or end of line after 'gelu', got '%s'",
                     echo(&t[1], &e));
  if (nt < 3)
    return SPEC_FAIL(DP_ERR_PARSE, w, t[1].col + t[1].len + 1,
                     "expected 'none' or 'tanh' after 'approximate'");
  bool exact = tok_is(&t[2], "none");
  if (!exact && !tok_is(&t[2], "tanh"))
    return SPEC_FAIL(DP_ERR_PARSE, w, t[2].col,
                     "unknown gelu approximation '%s' (expected none: the exact "
                     "x Phi(x), PyTorch's default; or tanh: the same as plain 'gelu')",
                     echo(&t[2], &e));
  dp_status s = no_more(t, nt, 3, w, "gelu approximate");
  if (s) return s;
  return at(dp_model_add(*m, exact ? DP_LAYER_GELU_ERF : DP_LAYER_GELU), w, t[0].col);
}

/* A decimal float of at most 31 characters in [lo, hi] (strtod also takes
 * hexadecimal, inf and nan; the spec does not). false: not one. hi FLT_MAX
 * means finite as a float: "3.4028235e+38", FLT_MAX as dp_model_format
 * writes it, is above FLT_MAX as a double but rounds to it. */
static bool decimal_float(const char *s, int len, double lo, double hi, float *out) {
  char buf[32];
  if (len <= 0 || len >= (int)sizeof buf) return false;
  memcpy(buf, s, (size_t)len);
  buf[len] = '\0';
  if (strspn(buf, "0123456789.eE+-") != strlen(buf)) return false;
  char *end;
  errno = 0;
  double v = strtod(buf, &end);
  if (hi == FLT_MAX && v > hi && v < 0x1.ffffffp127) v = FLT_MAX; /* below the tie */
  if (errno || *end || end == buf || !(v >= lo && v <= hi)) return false;
  *out = (float)v;
  return *out <= (float)hi;
}

/* `weight W0,W1,...` (of a class) or `pos_weight P0,P1,...` (of an output):
 * one finite weight >= 0 each, commas between, no spaces, at most
 * DP_MAX_CLASS_WEIGHTS into out; a bad one is named by its own column. */
static dp_status parse_weights(const token *t, where w, const char *name, const char *of,
                               float *out, int *n_out) {
  int n = 0;
  for (int i = 0; i <= t->len;) {
    int j = i;
    while (j < t->len && t->s[j] != ',') j++;
    if (n == DP_MAX_CLASS_WEIGHTS)
      return SPEC_FAIL(DP_ERR_PARSE, w, t->col + i, "loss: at most %d %s weights",
                       DP_MAX_CLASS_WEIGHTS, of);
    if (!decimal_float(t->s + i, j - i, 0.0, FLT_MAX, &out[n]))
      return SPEC_FAIL(DP_ERR_PARSE, w, t->col + i,
                       "loss: %s: expected a finite number >= 0 for %s %d, got '%.*s'",
                       name, of, n, j - i > 40 ? 40 : j - i, t->s + i);
    n++;
    i = j + 1;
  }
  *n_out = n;
  return DP_OK;
}

/* An int32 (ignore_index: PyTorch's default is -100). */
static bool parse_int32(const token *t, int32_t *out) {
  int i = t->s[0] == '-' || t->s[0] == '+';
  if (i >= t->len || t->len - i > 10) return false;
  long long v = 0;
  for (int k = i; k < t->len; k++) {
    if (!isdigit((unsigned char)t->s[k])) return false;
    v = v * 10 + (t->s[k] - '0');
  }
  v = t->s[0] == '-' ? -v : v;
  if (v < INT32_MIN || v > INT32_MAX) return false;
  *out = (int32_t)v;
  return true;
}

/* loss mse | l1 | smooth_l1 [beta B] | huber [delta D] | bce_with_logits
 * [pos_weight P0,P1,...]: nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss(beta),
 * nn.HuberLoss(delta), nn.BCEWithLogitsLoss(pos_weight). */
static dp_status parse_elem_loss(dp_model **m, const token *t, int nt, where w) {
  static const struct {
    const char *w, *param;
    dp_loss_kind k;
  } kinds[] = {{"mse", NULL, DP_LOSS_MSE},
               {"l1", NULL, DP_LOSS_L1},
               {"smooth_l1", "beta", DP_LOSS_SMOOTH_L1},
               {"huber", "delta", DP_LOSS_HUBER},
               {"bce_with_logits", "pos_weight", DP_LOSS_BCE_LOGITS}};
  echo_buf e;
  size_t k = 0;
  while (k < sizeof kinds / sizeof *kinds && !tok_is(&t[1], kinds[k].w)) k++;
  if (k == sizeof kinds / sizeof *kinds)
    return SPEC_FAIL(DP_ERR_PARSE, w, t[1].col,
                     "unknown loss '%s' (expected mse, l1, smooth_l1, huber, "
                     "bce_with_logits or softmax_cross_entropy)",
                     echo(&t[1], &e));
  bool bce = kinds[k].k == DP_LOSS_BCE_LOGITS;
  float v = 1.0f, pw[DP_MAX_CLASS_WEIGHTS];
  int used = 2, n_pw = 0;
  if (kinds[k].param && nt > 2) {
    if (!tok_is(&t[2], kinds[k].param))
      return SPEC_FAIL(DP_ERR_PARSE, w, t[2].col,
                       "loss %s: expected '%s %s' or end of line, got '%s'", kinds[k].w,
                       kinds[k].param, bce ? "P0,P1,..." : "V", echo(&t[2], &e));
    if (nt < 4)
      return SPEC_FAIL(DP_ERR_PARSE, w, t[2].col + t[2].len + 1,
                       "loss %s: expected %s after '%s'", kinds[k].w,
                       bce ? "one weight per output, commas between" : "a number > 0",
                       kinds[k].param);
    char what[32];
    snprintf(what, sizeof what, "loss %s: %s", kinds[k].w, kinds[k].param);
    dp_status s = bce ? parse_weights(&t[3], w, "pos_weight", "output", pw, &n_pw)
                      : parse_real(&t[3], w, what, "a number > 0", 0.0, true, FLT_MAX, &v);
    if (s) return s;
    used = 4;
  }
  dp_status s = no_more(t, nt, used, w, "loss");
  if (s || (s = at(dp_model_set_loss(*m, kinds[k].k), w, t[0].col))) return s;
  if (bce) {
    dp_bce_options o = {.n_pos_weights = n_pw, .pos_weights = pw};
    return at(dp_model_set_bce_options(*m, &o), w, used > 2 ? t[3].col : t[0].col);
  }
  return kinds[k].param
             ? at(dp_model_set_loss_param(*m, v), w, used > 2 ? t[3].col : t[0].col)
             : DP_OK;
}

/* loss mse | loss softmax_cross_entropy [label_smoothing S] [ignore_index I]
 * [weight W0,W1,...]: the options in any order, each once (as conv2d's). */
static dp_status parse_loss(dp_model **m, const token *t, int nt, where w) {
  const token *kw = &t[0];
  echo_buf e;
  if (nt < 2)
    return SPEC_FAIL(DP_ERR_PARSE, w, kw->col + kw->len + 1,
                     "expected 'mse', 'l1', 'smooth_l1', 'huber', 'bce_with_logits' or "
                     "'softmax_cross_entropy' after 'loss'");
  bool ce = tok_is(&t[1], "softmax_cross_entropy");
  if (!ce) return parse_elem_loss(m, t, nt, w);
  static const char *const names[3] = {"label_smoothing", "ignore_index", "weight"};
  dp_ce_opts o = {0};
  int col[3] = {0, 0, 0};
  for (int i = 2; i < nt && i < MAX_TOKENS; i += 2) {
    int which = -1;
    for (int k = 0; k < 3; k++)
      if (tok_is(&t[i], names[k])) which = k;
    if (which < 0)
      return SPEC_FAIL(DP_ERR_PARSE, w, t[i].col,
                       "loss: expected 'label_smoothing S', 'ignore_index I' or "
                       "'weight W0,W1,...', got '%s'",
                       echo(&t[i], &e));
    if (col[which])
      return SPEC_FAIL(DP_ERR_PARSE, w, t[i].col, "loss: '%s' given twice", names[which]);
    if (i + 1 >= nt)
      return SPEC_FAIL(DP_ERR_PARSE, w, t[i].col + t[i].len + 1,
                       "loss: expected %s after '%s'",
                       which == 0   ? "a number in [0, 1]"
                       : which == 1 ? "an integer"
                                    : "one weight per class, commas between",
                       names[which]);
    const token *v = &t[i + 1];
    col[which] = v->col;
    dp_status s = DP_OK;
    if (which == 0 && !decimal_float(v->s, v->len, 0.0, 1.0, &o.smoothing))
      s = SPEC_FAIL(DP_ERR_PARSE, w, v->col,
                    "loss: label_smoothing: expected a number in [0, 1], got '%s'",
                    echo(v, &e));
    else if (which == 1 && !parse_int32(v, &o.ignore_index))
      s = SPEC_FAIL(DP_ERR_PARSE, w, v->col,
                    "loss: ignore_index: expected an integer (int32), got '%s'",
                    echo(v, &e));
    else if (which == 2)
      s = parse_weights(v, w, "weight", "class", o.weights, &o.n_weights);
    if (s) return s;
    o.ignore |= which == 1;
  }
  if (nt > MAX_TOKENS) return no_more(t, nt, MAX_TOKENS, w, "loss");
  dp_status s = at(dp_model_set_loss(*m, DP_LOSS_SOFTMAX_CE), w, kw->col);
  if (s) return s;
  dp_ce_options api = {.label_smoothing = o.smoothing,
                       .has_ignore_index = o.ignore,
                       .ignore_index = o.ignore_index,
                       .n_weights = o.n_weights,
                       .weights = o.weights};
  return at(dp_model_set_ce_options(*m, &api), w, col[2] ? col[2] : kw->col);
}

static dp_status parse_line(dp_model **m, const token *t, int nt, where w) {
  const token *kw = &t[0];
  echo_buf e;
  if (!*m) {
    if (!tok_is(kw, "input"))
      return SPEC_FAIL(DP_ERR_PARSE, w, kw->col,
                       "expected 'input N' or 'input C H W' first, got '%s'", echo(kw, &e));
    if (nt < 2)
      return SPEC_FAIL(DP_ERR_PARSE, w, kw->col + kw->len + 1,
                       "expected a width (or channels, height and width) after 'input'");
    int n[3] = {0, 0, 0};
    dp_status s;
    if (tok_is(&t[1], "tokens")) {
      if (nt < 3)
        return SPEC_FAIL(DP_ERR_PARSE, w, t[1].col + t[1].len + 1,
                         "input tokens: expected the context (positions per row)");
      if ((s = parse_width(&t[2], w, "input tokens", "context", &n[0]))) return s;
      if ((s = no_more(t, nt, 3, w, "input tokens"))) return s;
      return at(dp_model_new_tokens(n[0], m), w, kw->col);
    }
    s = parse_width(&t[1], w, "input", nt == 4 ? "channels" : "width", &n[0]);
    if (s) return s;
    if (nt == 2) return at(dp_model_new(n[0], m), w, kw->col);
    if (nt == 3)
      return SPEC_FAIL(
          DP_ERR_PARSE, w, t[2].col,
          "input: 'input N' takes one number and 'input C H W' three; got two");
    for (int i = 1; i < 3; i++)
      if ((s = parse_width(&t[1 + i], w, "input", i == 1 ? "height" : "width", &n[i])))
        return s;
    if ((s = no_more(t, nt, 4, w, "input"))) return s;
    return at(dp_model_new_image(n[0], n[1], n[2], m), w, kw->col);
  }
  if ((*m)->loss != DP_LOSS_NONE)
    return SPEC_FAIL(DP_ERR_PARSE, w, kw->col,
                     "unexpected '%s': the loss must be the last line", echo(kw, &e));
  if (tok_is(kw, "input"))
    return SPEC_FAIL(DP_ERR_PARSE, w, kw->col, "'input' may appear only once, first");
  if (tok_is(kw, "linear")) {
    if (nt < 2)
      return SPEC_FAIL(DP_ERR_PARSE, w, kw->col + kw->len + 1,
                       "expected a width after 'linear'");
    int n = 0;
    dp_status s = parse_width(&t[1], w, "linear", "width", &n);
    if (s) return s;
    int bias = 1, tied = 0;
    if (nt >= 3) {
      tied = tok_is(&t[2], "tied");
      if (!tied && !tok_is(&t[2], "nobias"))
        return SPEC_FAIL(DP_ERR_PARSE, w, t[2].col,
                         "expected 'nobias', 'tied' or end of line, got '%s'",
                         echo(&t[2], &e));
      bias = 0;
    }
    if ((s = no_more(t, nt, 3, w, "linear"))) return s;
    return at(tied ? dp_model_add_linear_tied(*m, n) : dp_model_add_linear(*m, n, bias), w,
              tied ? t[2].col : kw->col);
  }
  if (tok_is(kw, "dropout")) {
    if (nt < 2)
      return SPEC_FAIL(DP_ERR_PARSE, w, kw->col + kw->len + 1,
                       "expected a probability after 'dropout'");
    float p = 0.0f;
    dp_status s = parse_prob(&t[1], w, &p);
    if (s) return s;
    if ((s = no_more(t, nt, 2, w, "dropout"))) return s;
    return at(dp_model_add_dropout(*m, p), w, kw->col);
  }
  if (tok_is(kw, "gelu") && nt >= 2) return parse_gelu(m, t, nt, w);
  if ((tok_is(kw, "batchnorm") || tok_is(kw, "layernorm")) && nt >= 2)
    return parse_norm(m, t, nt, w);
  if (tok_is(kw, "leaky_relu") && nt >= 2) { /* leaky_relu SLOPE */
    float slope = 0.0f;
    dp_status s = parse_real(&t[1], w, "leaky_relu: negative_slope", "a finite number",
                             -FLT_MAX, false, FLT_MAX, &slope);
    if (s || (s = no_more(t, nt, 2, w, "leaky_relu"))) return s;
    return at(dp_model_add_leaky_relu(*m, slope), w, kw->col);
  }
  if (tok_is(kw, "conv2d") || tok_is(kw, "maxpool2d") || tok_is(kw, "avgpool2d"))
    return parse_window(m, t, nt, w);
  if (tok_is(kw, "embed") || tok_is(kw, "attention")) return parse_sequence(m, t, nt, w);
  if (tok_is(kw, "loss")) return parse_loss(m, t, nt, w);
  static const struct {
    const char *w;
    dp_layer_kind k;
  } simple[] = {{"relu", DP_LAYER_RELU},           {"gelu", DP_LAYER_GELU},
                {"tanh", DP_LAYER_TANH},           {"sigmoid", DP_LAYER_SIGMOID},
                {"layernorm", DP_LAYER_LAYERNORM}, {"flatten", DP_LAYER_FLATTEN},
                {"batchnorm", DP_LAYER_BATCHNORM}, {"residual", DP_LAYER_RESIDUAL},
                {"end", DP_LAYER_RESIDUAL_END},    {"shortcut", DP_LAYER_SHORTCUT},
                {"silu", DP_LAYER_SILU},           {"leaky_relu", DP_LAYER_LEAKY_RELU}};
  for (size_t i = 0; i < sizeof simple / sizeof *simple; i++) {
    if (!tok_is(kw, simple[i].w)) continue;
    dp_status s = no_more(t, nt, 1, w, simple[i].w);
    if (s) return s;
    if (simple[i].k == DP_LAYER_RESIDUAL)
      return at(dp_model_begin_residual(*m), w, kw->col);
    if (simple[i].k == DP_LAYER_RESIDUAL_END)
      return at(dp_model_end_residual(*m), w, kw->col);
    if (simple[i].k == DP_LAYER_SHORTCUT)
      return at(dp_model_begin_shortcut(*m), w, kw->col);
    return at(dp_model_add(*m, simple[i].k), w, kw->col);
  }
  return SPEC_FAIL(
      DP_ERR_PARSE, w, kw->col,
      "unknown layer '%s' (expected linear, relu, gelu, tanh, sigmoid, silu, leaky_relu, "
      "layernorm, dropout, conv2d, maxpool2d, avgpool2d, flatten, batchnorm, embed, "
      "attention, residual, shortcut, end or loss)",
      echo(kw, &e));
}

dp_status dp_model_parse(const char *text, const char *name, dp_model **out) {
  if (!out) return DP_FAIL(DP_ERR_INVALID, "dp_model_parse: out is NULL");
  *out = NULL;
  if (!text) return DP_FAIL(DP_ERR_INVALID, "dp_model_parse: text is NULL");
  where w = {name ? name : "<spec>", 0};
  dp_model *m = NULL;
  int at_line[DP_MAX_LAYERS], at_col[DP_MAX_LAYERS]; /* where each layer was */
  const char *p = text;
  if (strncmp(p, "\xef\xbb\xbf", 3) == 0)
    p += 3; /* a UTF-8 byte-order mark (editors add one) */
  while (*p) {
    const char *nl = strchr(p, '\n');
    int len = nl ? (int)(nl - p) : (int)strlen(p);
    if (len > 0 && p[len - 1] == '\r') len--;
    w.line++;
    token t[MAX_TOKENS];
    int nt = tokenize(p, len, t, MAX_TOKENS);
    if (nt > 0) {
      dp_status s = parse_line(&m, t, nt, w);
      if (s) {
        dp_model_free(m);
        return s;
      }
      if (m && m->n_layers > 0) {
        at_line[m->n_layers - 1] = w.line;
        at_col[m->n_layers - 1] = t[0].col;
      }
    }
    if (!nl) break;
    p = nl + 1;
  }
  if (!m) {
    w.line = w.line ? w.line : 1;
    return SPEC_FAIL(DP_ERR_PARSE, w, 1, "empty model: expected 'input N'");
  }
  int open = dp__model_open_residual(m);
  if (open >= 0) {
    w.line = at_line[open];
    dp_model_free(m);
    return SPEC_FAIL(
        DP_ERR_PARSE, w, at_col[open],
        "this 'residual' has no 'end' (the block runs to the end of the spec)");
  }
  *out = m;
  return DP_OK;
}

/* Opens path for reading if it is a regular file, without blocking on a FIFO. */
static dp_status open_spec(const char *path, FILE **out) {
  struct stat st;
  const char *failed;
  int fd = dp__open_regular(path, &st, &failed);
  if (fd == -2 && S_ISDIR(st.st_mode))
    return DP_FAIL(DP_ERR_IO, "%s: is a directory, not a model spec", path);
  if (fd == -2)
    return DP_FAIL(DP_ERR_IO,
                   "%s: not a regular file (%s); a model spec is read from a file", path,
                   dp__file_kind(st.st_mode));
  if (fd < 0) return DP_FAIL(DP_ERR_IO, "%s: cannot %s: %s", path, failed, strerror(errno));
  if (!(*out = fdopen(fd, "rb"))) {
    int err = errno;
    close(fd);
    return DP_FAIL(err == ENOMEM ? DP_ERR_NOMEM : DP_ERR_IO, "%s: cannot read: %s", path,
                   strerror(err));
  }
  return DP_OK;
}

dp_status dp_model_load(const char *path, dp_model **out) {
  if (!out) return DP_FAIL(DP_ERR_INVALID, "dp_model_load: out is NULL");
  *out = NULL;
  if (!path) return DP_FAIL(DP_ERR_INVALID, "dp_model_load: path is NULL");
  FILE *f = NULL;
  dp_status s = open_spec(path, &f);
  if (s) return s;
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) {
      s = DP_FAIL(DP_ERR_NOMEM, "%s: out of memory", path);
      break;
    }
    len += fread(buf + len, 1, cap - 1 - len, f);
    if (len > (64u << 20)) {
      s = DP_FAIL(DP_ERR_PARSE, "%s: larger than 64 MiB; not a model spec", path);
      break;
    }
    if (len < cap - 1) break;
    char *nb = realloc(buf, cap * 2);
    if (!nb) free(buf);
    buf = nb;
    cap *= 2;
  }
  if (!s && ferror(f)) s = DP_FAIL(DP_ERR_IO, "%s: read error: %s", path, strerror(errno));
  fclose(f);
  if (!s) {
    buf[len] = '\0';
    const char *nul = memchr(buf, '\0', len);
    if (nul) { /* its line and column, as every other spec error has */
      where w = {path, 1};
      const char *line = buf;
      for (const char *q = buf; q < nul; q++)
        if (*q == '\n') {
          w.line++;
          line = q + 1;
        }
      s = SPEC_FAIL(DP_ERR_PARSE, w, (int)(nul - line) + 1,
                    "NUL byte; a model spec is text");
    } else {
      s = dp_model_parse(buf, path, out);
    }
  }
  free(buf);
  return s;
}
