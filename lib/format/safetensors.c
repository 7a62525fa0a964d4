/* Weights to and from PyTorch: the parameters as a safetensors file
 * (safetensors.torch.save_file / load_file), named and shaped as the
 * state_dict of the model's nn.Sequential (dp_model_tensor). The format: an
 * 8-byte little-endian header length, a JSON object mapping each tensor name
 * to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data
 * that follows the header) plus an optional "__metadata__" object of strings,
 * padded with spaces to a multiple of 8; then the data. */
#include "core/ctx.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u << 20) /* safetensors' own limit on the header */

/* ---- export ------------------------------------------------------------------ */

/* A tensor of the state_dict: a parameter (dp_model_tensor) or a batchnorm
 * buffer (running_mean, running_var: F32; num_batches_tracked: I64, shape
 * []). The state is one byte array: the parameters (n_params floats), then each
 * batchnorm's running_mean, running_var (c floats each) and count (8 bytes, as
 * int64), in layer order; `off` is the tensor's first byte there. */
typedef struct {
  char name[64];
  int ndim, dims[4];
  bool i64, var; /* var: a running_var (never negative) */
  size_t off, numel;
} st_entry;

#define ST_MAX_ENTRIES (5 * DP_MAX_LAYERS)

static int st_entries(const dp_model *m, st_entry *e, size_t *state_bytes) {
  int n = 0;
  for (int i = 0; i < dp_model_n_tensors(m); i++, n++) {
    dp_tensor_info t;
    dp_model_tensor(m, i, &t);
    memset(&e[n], 0, sizeof e[n]);
    snprintf(e[n].name, sizeof e[n].name, "%s", t.name);
    e[n].ndim = t.ndim;
    memcpy(e[n].dims, t.dims, sizeof t.dims);
    e[n].off = t.offset * 4;
    e[n].numel = t.numel;
  }
  size_t off = m->n_params * 4;
  for (int li = 0; li < m->n_layers; li++) {
    const dp_layer *l = &m->layers[li];
    if (l->kind != DP_LAYER_BATCHNORM) continue;
    static const char *const names[3] = {"running_mean", "running_var",
                                         "num_batches_tracked"};
    for (int k = 0; k < 3; k++, n++) {
      memset(&e[n], 0, sizeof e[n]);
      snprintf(e[n].name, sizeof e[n].name, "%d.%s", li, names[k]);
      e[n].i64 = k == 2;
      e[n].var = k == 1;
      e[n].ndim = k < 2 ? 1 : 0;
      e[n].dims[0] = k < 2 ? l->c : 0;
      e[n].numel = k < 2 ? (size_t)l->c : 1;
      e[n].off = off;
      off += k < 2 ? 4 * (size_t)l->c : 8;
    }
  }
  *state_bytes = off;
  return n;
}

/* The byte size of an entry's data. */
static size_t st_bytes(const st_entry *e) { return e->numel * (e->i64 ? 8 : 4); }

/* The earlier entry whose state bytes entry i shares (a tied output head's weight
 * is the token table), or -1. */
static int alias_of(const st_entry *e, int i) {
  for (int k = 0; k < i; k++)
    if (e[k].off == e[i].off && e[k].numel == e[i].numel) return k;
  return -1;
}

typedef struct {
  const dp_model *m;
  const unsigned char *state; /* the state bytes (st_entries), little-endian */
  const dp_meta *meta;        /* the program's metadata pairs, after libdp's */
  int n_meta;
} export_job;

/* JSON string body of s (names and the spec text: quotes, backslashes and
 * control characters escaped). Nonzero when a write failed (a memory stream
 * that could not grow). */
static int json_str(FILE *f, const char *s, size_t n) {
  int bad = fputc('"', f) == EOF;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\')
      bad |= fprintf(f, "\\%c", ch) < 0;
    else if (ch == '\n')
      bad |= fputs("\\n", f) == EOF;
    else if (ch < 0x20)
      bad |= fprintf(f, "\\u%04x", ch) < 0;
    else
      bad |= fputc(ch, f) == EOF;
  }
  bad |= fputc('"', f) == EOF;
  return bad;
}

static void put_le(unsigned char *b, uint64_t v, int n) {
  for (int k = 0; k < n; k++) b[k] = (unsigned char)(v >> (8 * k));
}

static uint64_t u32_of(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

static dp_status export_fill(FILE *f, void *arg) {
  const export_job *j = arg;
  const dp_model *m = j->m;
  size_t tlen = dp_model_format(m, NULL, 0);
  char *text = malloc(tlen + 1);
  if (!text) return DP_FAIL(DP_ERR_NOMEM, "safetensors: out of memory");
  dp_model_format(m, text, tlen + 1);
  /* the header, built in memory first: its length comes before it */
  char *hdr = NULL;
  size_t hlen = 0;
  FILE *h = open_memstream(&hdr, &hlen);
  if (!h) {
    free(text);
    return DP_FAIL(DP_ERR_NOMEM, "safetensors: out of memory");
  }
  /* every write checked: glibc's memory stream does not set the error flag
   * when it cannot grow its buffer (the header would be cut), and its fclose
   * leaves hdr NULL when the last realloc fails */
  int bad = fputs("{\"__metadata__\":{\"format\":\"pt\",\"libdp_model\":", h) == EOF;
  bad |= json_str(h, text, tlen);
  for (int i = 0; i < j->n_meta; i++) {
    bad |= fputc(',', h) == EOF;
    bad |= json_str(h, j->meta[i].key, strlen(j->meta[i].key));
    bad |= fputc(':', h) == EOF;
    bad |= json_str(h, j->meta[i].value, strlen(j->meta[i].value));
  }
  bad |= fputs("}", h) == EOF;
  free(text);
  st_entry e[ST_MAX_ENTRIES];
  size_t state_bytes, tail = 0;
  int n = st_entries(m, e, &state_bytes);
  for (int i = 0; i < n && !bad; i++) {
    /* the state bytes are the data; a tensor that is another's (a tied head's
     * weight) gets a copy after them, so that the tensors tile the data */
    size_t at = e[i].off;
    if (alias_of(e, i) >= 0) {
      at = state_bytes + tail;
      tail += st_bytes(&e[i]);
    }
    bad |= fputc(',', h) == EOF;
    bad |= json_str(h, e[i].name, strlen(e[i].name));
    bad |= fprintf(h, ":{\"dtype\":\"%s\",\"shape\":[", e[i].i64 ? "I64" : "F32") < 0;
    for (int d = 0; d < e[i].ndim; d++)
      bad |= fprintf(h, "%s%d", d ? "," : "", e[i].dims[d]) < 0;
    bad |= fprintf(h, "],\"data_offsets\":[%zu,%zu]}", at, at + st_bytes(&e[i])) < 0;
  }
  bad |= fputc('}', h) == EOF;
  long pos = 0; /* the data starts 8-aligned */
  while (!bad && (pos = ftell(h)) >= 0 && pos % 8) bad |= fputc(' ', h) == EOF;
  bad |= pos < 0 || ferror(h);
  if (fclose(h) != 0 || bad || !hdr) {
    free(hdr);
    return DP_FAIL(DP_ERR_NOMEM, "safetensors: out of memory");
  }
  unsigned char len8[8];
  for (int b = 0; b < 8; b++) len8[b] = (unsigned char)((uint64_t)hlen >> (8 * b));
  bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
  free(hdr);
  /* the data: the state bytes, the tensors in order, little-endian, then the
   * aliases' copies */
  ok = ok && fwrite(j->state, 1, state_bytes, f) == state_bytes;
  for (int i = 0; i < n && ok; i++)
    if (alias_of(e, i) >= 0)
      ok = fwrite(j->state + e[i].off, 1, st_bytes(&e[i]), f) == st_bytes(&e[i]);
  return ok ? DP_OK : DP_ERR_IO;
}

static int utf8_len(const unsigned char *p, const unsigned char *end);

/* The program's metadata pairs as dp.h asks: keys non-empty, unique, not
 * libdp's own; keys and values UTF-8. */
static dp_status check_meta(const dp_meta *meta, int n) {
  if (n < 0 || (n > 0 && !meta))
    return DP_FAIL(DP_ERR_INVALID, "safetensors metadata: %d pairs at %p", n,
                   (const void *)meta);
  for (int i = 0; i < n; i++) {
    const char *k = meta[i].key, *v = meta[i].value;
    if (!k || !*k || !v)
      return DP_FAIL(DP_ERR_INVALID, "safetensors metadata pair %d: %s", i,
                     !k    ? "its key is NULL"
                     : !*k ? "its key is empty"
                           : "its value is NULL");
    if (!strcmp(k, "format") || !strcmp(k, "libdp_model"))
      return DP_FAIL(DP_ERR_INVALID,
                     "safetensors metadata key \"%s\" is libdp's own; name yours otherwise",
                     k);
    for (int j = 0; j < i; j++)
      if (!strcmp(meta[j].key, k))
        return DP_FAIL(DP_ERR_INVALID, "safetensors metadata key \"%.64s\" is given twice",
                       k);
    for (int t = 0; t < 2; t++) {
      const unsigned char *p = (const unsigned char *)(t ? v : k),
                          *e = p + strlen(t ? v : k);
      while (p < e) {
        int len = *p < 0x80 ? 1 : utf8_len(p, e);
        if (!len)
          return DP_FAIL(DP_ERR_INVALID,
                         "safetensors metadata: the %s of key \"%.64s\" is not valid UTF-8",
                         t ? "value" : "name", k);
        p += len;
      }
    }
  }
  return DP_OK;
}

dp_status dp_ckpt_export_safetensors(dp_ctx *c, const char *path) {
  return dp_ckpt_export_safetensors_meta(c, path, NULL, 0);
}

dp_status dp_ckpt_export_safetensors_meta(dp_ctx *c, const char *path, const dp_meta *meta,
                                          int n_meta) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (!path || !*path)
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_INVALID, "dp_ckpt_export_safetensors: path is %s",
                                   path ? "empty" : "NULL"));
  dp_status ms = check_meta(meta, n_meta);
  if (ms) return dp__ctx_fail(c, ms);
  const dp_model *m = &c->plan->model;
  size_t np = m->n_params, bytes;
  st_entry e[ST_MAX_ENTRIES];
  int n = st_entries(m, e, &bytes);
  unsigned char *state = malloc(bytes + 8);
  float *w = malloc(np ? np * 4 : 4);
  dp_status s = state && w ? DP_OK : DP_FAIL(DP_ERR_NOMEM, "safetensors: out of memory");
  if (!s) s = dp_get_params(c, w, np); /* collective across processes */
  for (size_t k = 0; k < np && !s; k++) put_le(state + 4 * k, u32_of(w[k]), 4);
  for (int i = 0; i < n && !s; i++) { /* batchnorm's buffers: mean, var, count */
    if (e[i].off < np * 4 || e[i].i64 || !strstr(e[i].name, "running_mean")) continue;
    int layer = atoi(e[i].name);
    size_t C = e[i].numel;
    float *mv = malloc(2 * C * 4 + 4);
    int64_t count = 0;
    if (!mv) s = DP_FAIL(DP_ERR_NOMEM, "safetensors: out of memory");
    if (!s) s = dp_get_running_stats(c, layer, mv, mv + C, &count);
    for (size_t k = 0; k < 2 * C && !s; k++)
      put_le(state + e[i].off + 4 * k, u32_of(mv[k]), 4);
    if (!s) put_le(state + e[i].off + 8 * C, (uint64_t)count, 8);
    free(mv);
  }
  if (!s && dp__ctx_writes_files(c)) {
    export_job j = {m, state, meta, n_meta};
    s = dp__write_atomic(path, "safetensors file", export_fill, &j);
  }
  free(w);
  free(state);
  return dp__ctx_fail(c, dp__ctx_root_status(c, s));
}

/* ---- import: a small JSON reader for the header -------------------------------- */

/* Strict, as the safetensors format asks (RFC 8259 JSON in UTF-8): a file
 * another reader would take differently, or refuse, is refused here too. */
typedef struct {
  const char *start, *p, *end; /* the header: [start, end) */
  const char *path;
  dp_status err;
} json;

static dp_status jfail(json *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static dp_status jfail(json *j, const char *fmt, ...) {
  if (!j->err) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    j->err = DP_FAIL(DP_ERR_PARSE, "safetensors file '%s': header: %s", j->path, what);
  }
  return j->err;
}

static void ws(json *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
    j->p++;
}

static bool eat(json *j, char ch) {
  ws(j);
  if (j->p < j->end && *j->p == ch) {
    j->p++;
    return true;
  }
  return false;
}

/* The length (2-4) of the UTF-8 sequence at p, a byte >= 0x80, or 0 when it
 * is not UTF-8 (RFC 3629): a stray continuation byte, a cut sequence, an
 * overlong form, a surrogate, a code point above U+10FFFF. */
static int utf8_len(const unsigned char *p, const unsigned char *end) {
  unsigned c = p[0], cp, min;
  int n;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2, cp = c & 0x1f, min = 0x80;
  } else if ((c & 0xf0) == 0xe0) {
    n = 3, cp = c & 0x0f, min = 0x800;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (end - p < n) return 0;
  for (int k = 1; k < n; k++) {
    if ((p[k] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (p[k] & 0x3fu);
  }
  return cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ? 0 : n;
}

/* The four hex digits of a \u escape, or -1. */
static long hex4(json *j) {
  if (j->end - j->p < 4) return -1;
  long v = 0;
  for (int i = 0; i < 4; i++) {
    char hx = *j->p++;
    int d = hx >= '0' && hx <= '9'   ? hx - '0'
            : hx >= 'a' && hx <= 'f' ? hx - 'a' + 10
            : hx >= 'A' && hx <= 'F' ? hx - 'A' + 10
                                     : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

/* A \u escape after its "\u": the code point (a surrogate pair combined), or
 * -1. mode 1 (a name, read into a buffer) takes ASCII only: a NUL would end it
 * early ("0.weight", NUL, "x" read as "0.weight"), and libdp's names are
 * ASCII. mode 2 (a metadata string, decoded) takes any scalar value but NUL
 * (C strings); mode 0 (a string skipped) any scalar value: a surrogate pair,
 * never a lone half. */
static long unicode_escape(json *j, int mode) {
  long v = hex4(j);
  if (v < 0) return jfail(j, "a bad \\u escape"), -1;
  if (mode == 1) {
    if (v == 0 || v > 0x7f) return jfail(j, "a \\u escape outside ASCII or NUL"), -1;
    return v;
  }
  if (mode == 2 && v == 0) return jfail(j, "a \\u0000 (NUL) in a metadata string"), -1;
  if (v >= 0xdc00 && v <= 0xdfff)
    return jfail(j, "a \\u escape of a lone low surrogate (\\u%04lx)", v), -1;
  if (v >= 0xd800 && v <= 0xdbff) {
    long lo = -1;
    if (j->end - j->p >= 2 && j->p[0] == '\\' && j->p[1] == 'u') {
      j->p += 2;
      lo = hex4(j);
    }
    if (!(lo >= 0xdc00 && lo <= 0xdfff))
      return jfail(j, "a \\u escape of a high surrogate without its low half"), -1;
    v = 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
  }
  return v;
}

/* Code point v as UTF-8 into u (1 to 4 bytes); the byte count. */
static int utf8_put(long v, unsigned char u[4]) {
  if (v < 0x80) return u[0] = (unsigned char)v, 1;
  if (v < 0x800) {
    u[0] = (unsigned char)(0xc0 | v >> 6);
    u[1] = (unsigned char)(0x80 | (v & 0x3f));
    return 2;
  }
  if (v < 0x10000) {
    u[0] = (unsigned char)(0xe0 | v >> 12);
    u[1] = (unsigned char)(0x80 | (v >> 6 & 0x3f));
    u[2] = (unsigned char)(0x80 | (v & 0x3f));
    return 3;
  }
  u[0] = (unsigned char)(0xf0 | v >> 18);
  u[1] = (unsigned char)(0x80 | (v >> 12 & 0x3f));
  u[2] = (unsigned char)(0x80 | (v >> 6 & 0x3f));
  u[3] = (unsigned char)(0x80 | (v & 0x3f));
  return 4;
}

/* A string into buf (cap bytes, NUL-terminated), or checked and skipped
 * (buf NULL): UTF-8, no control characters (JSON escapes them). text: a
 * metadata string, its \u escapes decoded to UTF-8 (its length in bytes is at
 * most the raw string's, so a buffer of the header's size holds it); else a
 * name (ASCII escapes only). */
static bool jstr(json *j, char *buf, size_t cap, bool text) {
  if (!eat(j, '"')) return jfail(j, "a string was expected"), false;
  size_t n = 0;
  while (j->p < j->end && *j->p != '"') {
    unsigned char ch = (unsigned char)*j->p, u[4];
    int k = 1;
    if (ch < 0x20) return jfail(j, "a control character in a string"), false;
    if (ch >= 0x80) { /* a whole UTF-8 sequence, as it is */
      k = utf8_len((const unsigned char *)j->p, (const unsigned char *)j->end);
      if (!k)
        return jfail(j, "a string is not valid UTF-8 (byte 0x%02x at offset %td)", ch,
                     j->p - j->start),
               false;
      memcpy(u, j->p, (size_t)k);
      j->p += k;
    } else if (ch == '\\') {
      j->p++;
      if (j->p >= j->end) break;
      char e = *j->p++;
      static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
      const char *f = e ? strchr(from, e) : NULL;
      if (f) {
        u[0] = (unsigned char)to[f - from];
      } else if (e == 'u') {
        long v = unicode_escape(j, !buf ? 0 : text ? 2 : 1);
        if (v < 0) return false;
        k = utf8_put(v, u);
      } else {
        return jfail(j, "a bad escape in a string"), false;
      }
    } else {
      u[0] = ch;
      j->p++;
    }
    for (int i = 0; i < k; i++, n++)
      if (buf && n + 1 < cap) buf[n] = (char)u[i];
  }
  if (!eat(j, '"')) return jfail(j, "a string runs past the header's end"), false;
  if (buf) {
    if (n + 1 > cap) return jfail(j, "a name is too long"), false;
    buf[n] = '\0';
  }
  return true;
}

static bool jstring(json *j, char *buf, size_t cap) { return jstr(j, buf, cap, false); }

static bool digit(const json *j) { return j->p < j->end && *j->p >= '0' && *j->p <= '9'; }

/* A non-negative integer below 2^53 (JSON numbers are doubles); no leading
 * zero, as JSON has none. */
static bool jint(json *j, uint64_t *out) {
  ws(j);
  uint64_t v = 0;
  const char *s = j->p;
  while (digit(j)) {
    v = v * 10 + (uint64_t)(*j->p++ - '0');
    if (v >> 53) return jfail(j, "an integer is too large"), false;
  }
  if (j->p == s) return jfail(j, "a non-negative integer was expected"), false;
  if (*s == '0' && j->p - s > 1) return jfail(j, "an integer with a leading zero"), false;
  *out = v;
  return true;
}

/* A number as JSON writes it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static bool jnumber(json *j) {
  const char *s = j->p;
  if (j->p < j->end && *j->p == '-') j->p++;
  const char *int0 = j->p;
  while (digit(j)) j->p++;
  bool ok = j->p > int0 && (*int0 != '0' || j->p - int0 == 1);
  if (ok && j->p < j->end && *j->p == '.') {
    const char *f = ++j->p;
    while (digit(j)) j->p++;
    ok = j->p > f;
  }
  if (ok && j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
    j->p++;
    if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
    const char *x = j->p;
    while (digit(j)) j->p++;
    ok = j->p > x;
  }
  if (!ok) return jfail(j, "a bad number at offset %td", s - j->start), false;
  return true;
}

/* Skips any value (the metadata's, an unknown field's). */
static bool jskip(json *j, int depth) {
  ws(j);
  if (depth > 32) return jfail(j, "nested too deep"), false;
  if (j->p >= j->end) return jfail(j, "a value was expected"), false;
  char ch = *j->p;
  if (ch == '"') return jstring(j, NULL, 0);
  if (ch == '{' || ch == '[') {
    char close = ch == '{' ? '}' : ']';
    j->p++;
    if (eat(j, close)) return true;
    do {
      if (ch == '{' && (!jstring(j, NULL, 0) || !eat(j, ':')))
        return jfail(j, "a member name was expected"), false;
      if (!jskip(j, depth + 1)) return false;
    } while (eat(j, ','));
    if (!eat(j, close)) return jfail(j, "',' or a closing bracket was expected"), false;
    return true;
  }
  static const char *const words[] = {"true", "false", "null"};
  for (int w = 0; w < 3; w++) {
    size_t n = strlen(words[w]);
    if ((size_t)(j->end - j->p) >= n && !memcmp(j->p, words[w], n)) {
      j->p += n;
      return true;
    }
  }
  if (ch == '-' || (ch >= '0' && ch <= '9')) return jnumber(j);
  return jfail(j, "a value was expected at offset %td", j->p - j->start), false;
}

typedef struct {
  char dtype[16];
  int ndim;
  uint64_t shape[8];
  uint64_t begin, end;
  bool seen;
  bool borrowed; /* a tied head's name the file lacks: its other name's entry */
} st_tensor;

/* {"dtype": ..., "shape": [...], "data_offsets": [b, e]}, each once; other
 * fields are skipped. */
static bool jtensor(json *j, const char *name, st_tensor *t) {
  bool have_dtype = false, have_shape = false, have_off = false;
  if (!eat(j, '{')) return jfail(j, "a tensor's entry must be an object"), false;
  if (eat(j, '}')) return jfail(j, "a tensor's entry is empty"), false;
  do {
    char key[32];
    if (!jstring(j, key, sizeof key) || !eat(j, ':'))
      return jfail(j, "a member name was expected"), false;
    bool *have = !strcmp(key, "dtype")          ? &have_dtype
                 : !strcmp(key, "shape")        ? &have_shape
                 : !strcmp(key, "data_offsets") ? &have_off
                                                : NULL;
    /* a second value would silently replace the first */
    if (have && *have)
      return jfail(j, "tensor '%s' has its field \"%s\" twice", name, key), false;
    if (have) *have = true;
    if (!strcmp(key, "dtype")) {
      if (!jstring(j, t->dtype, sizeof t->dtype)) return false;
    } else if (!strcmp(key, "shape")) {
      if (!eat(j, '[')) return jfail(j, "a shape must be an array"), false;
      t->ndim = 0;
      if (!eat(j, ']')) {
        do {
          if (t->ndim == 8) return jfail(j, "a shape has more than 8 dimensions"), false;
          if (!jint(j, &t->shape[t->ndim++])) return false;
        } while (eat(j, ','));
        if (!eat(j, ']')) return jfail(j, "a shape's ']' is missing"), false;
      }
    } else if (!strcmp(key, "data_offsets")) {
      if (!eat(j, '[') || !jint(j, &t->begin) || !eat(j, ',') || !jint(j, &t->end) ||
          !eat(j, ']'))
        return jfail(j, "data_offsets must be [begin, end]"), false;
    } else if (!jskip(j, 1)) {
      return false;
    }
  } while (eat(j, ','));
  if (!eat(j, '}')) return jfail(j, "a tensor's '}' is missing"), false;
  if (!have_dtype || !have_shape || !have_off)
    return jfail(j, "a tensor lacks dtype, shape or data_offsets"), false;
  return true;
}

/* Opens the safetensors file at path for reading, a regular file only. */
static dp_status open_st(const char *path, struct stat *st, int *fd) {
  const char *failed;
  *fd = dp__open_regular(path, st, &failed);
  if (*fd == -2)
    return DP_FAIL(DP_ERR_IO, "safetensors file '%s' is not a regular file (%s)", path,
                   dp__file_kind(st->st_mode));
  if (*fd < 0) return dp__io_fail("safetensors file", path, failed, path, errno);
  return DP_OK;
}

/* Reads the whole file (at most `cap` bytes). */
static dp_status read_all(const char *path, size_t cap, unsigned char **buf, size_t *len) {
  struct stat st;
  *buf = NULL;
  int fd;
  dp_status so = open_st(path, &st, &fd);
  if (so) return so;
  if ((uint64_t)st.st_size > cap) {
    close(fd);
    return DP_FAIL(DP_ERR_PARSE,
                   "safetensors file '%s' has %lld bytes; a file for this model has at "
                   "most %zu",
                   path, (long long)st.st_size, cap);
  }
  size_t want = (size_t)st.st_size;
  unsigned char *b = malloc(want ? want : 1);
  dp_status s = b ? dp__read_fd(fd, b, want, len, "safetensors file", path)
                  : DP_FAIL(DP_ERR_NOMEM, "safetensors: out of memory for %zu bytes", want);
  close(fd);
  if (s)
    free(b);
  else
    *buf = b;
  return s;
}

/* The header's object into st, by the model's tensor index (ti): every name
 * the model's, none twice, "__metadata__" at most once and an object. */
static dp_status parse_header(json *j, const st_entry *ti, int n, st_tensor *st) {
  /* The format's header is an object: its first byte is '{' */
  if (j->p == j->end || *j->p != '{')
    return jfail(j, "it must be a JSON object, starting with '{'");
  j->p++;
  bool empty = eat(j, '}'), meta = false;
  if (!empty) do {
      char name[64];
      if (!jstring(j, name, sizeof name) || !eat(j, ':')) return jfail(j, "a name");
      if (!strcmp(name, "__metadata__")) {
        if (meta) return jfail(j, "\"__metadata__\" appears twice");
        meta = true;
        ws(j);
        if (j->p == j->end || *j->p != '{')
          return jfail(j, "__metadata__ must be an object");
        if (!jskip(j, 1)) return j->err;
        continue;
      }
      int k = 0;
      while (k < n && strcmp(ti[k].name, name)) k++;
      if (k == n) {
        char list[256] = "";
        for (int i = 0; i < n && strlen(list) < 200; i++)
          snprintf(list + strlen(list), sizeof list - strlen(list), "%s%.47s",
                   i ? ", " : "", ti[i].name);
        return DP_FAIL(DP_ERR_INVALID,
                       "safetensors file '%s' has a tensor '%s' that the model does not "
                       "(its tensors: %s)",
                       j->path, name, list);
      }
      if (st[k].seen)
        return DP_FAIL(DP_ERR_PARSE, "safetensors file '%s' names tensor '%s' twice",
                       j->path, name);
      if (!jtensor(j, name, &st[k])) return j->err;
      st[k].seen = true;
    } while (eat(j, ','));
  if (j->err) return j->err;
  if (!empty && !eat(j, '}')) return jfail(j, "'}' or ',' was expected");
  ws(j); /* the padding after the object */
  if (j->p != j->end) return jfail(j, "something follows the object");
  return DP_OK;
}

/* A tied output head's weight and the token table are one tensor under two
 * names: a file may hold one of them (safetensors.torch.save_model keeps one
 * name of tensors that share memory, as torch.save does not): the missing
 * name takes the other's entry, borrowed (not a tensor of the file's data). */
static void tied_names(const st_entry *ti, st_tensor *st, int n) {
  for (int k = 0; k < n; k++) {
    int k2 = alias_of(ti, k);
    if (k2 < 0 || st[k].seen == st[k2].seen) continue;
    int have = st[k].seen ? k : k2, lack = st[k].seen ? k2 : k;
    st[lack] = st[have];
    st[lack].borrowed = true;
  }
}

/* Each of the model's tensors is there, with its shape and dtype, and
 * data_offsets [begin, end] of exactly its byte size within the data. */
static dp_status check_entries(const char *path, const st_entry *ti, const st_tensor *st,
                               int n, size_t data_len) {
  for (int k = 0; k < n; k++) {
    const st_entry *t = &ti[k];
    const st_tensor *s = &st[k];
    char want[64] = "[", got[80] = "";
    bool same = s->ndim == t->ndim;
    for (int d = 0; d < t->ndim; d++) {
      snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", d ? ", " : "",
               t->dims[d]);
      same = same && s->shape[d] == (uint64_t)t->dims[d];
    }
    snprintf(want + strlen(want), sizeof want - strlen(want), "]");
    if (!s->seen)
      return DP_FAIL(DP_ERR_INVALID, "safetensors file '%s' has no tensor '%s' %s", path,
                     t->name, want);
    for (int d = 0; d < s->ndim; d++)
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", d ? ", " : "",
               (unsigned long long)s->shape[d]);
    if (!same)
      return DP_FAIL(DP_ERR_SHAPE,
                     "safetensors file '%s': tensor '%s' is [%s]; the model's is %s", path,
                     t->name, got, want);
    const char *dt = t->i64 ? "I64" : "F32";
    if (strcmp(s->dtype, dt))
      return DP_FAIL(DP_ERR_INVALID,
                     "safetensors file '%s': tensor '%s' is %s; libdp takes %s (save "
                     "model.float()'s state_dict)",
                     path, t->name, s->dtype, dt);
    if (s->end < s->begin || s->end - s->begin != (uint64_t)st_bytes(t) ||
        s->end > data_len)
      return DP_FAIL(DP_ERR_PARSE,
                     "safetensors file '%s': tensor '%s' has data_offsets [%llu, %llu] for "
                     "%zu bytes of data (%zu values)",
                     path, t->name, (unsigned long long)s->begin,
                     (unsigned long long)s->end, data_len, t->numel);
  }
  return DP_OK;
}

/* The tensors sorted by offset tile the data exactly, as the format asks:
 * the first starts at 0, each where the one before ends, the last at the
 * data's end. Without that, two tensors may share bytes, or a header length
 * a few bytes short (which moves the data's start into the padding) shifts
 * every value and still fits. */
static dp_status check_tiling(const char *path, const st_entry *ti, const st_tensor *st,
                              int n_all, size_t data_len) {
  int order[ST_MAX_ENTRIES], n = 0;
  for (int k = 0; k < n_all; k++) { /* insertion sort by (begin, end): n is small */
    if (st[k].borrowed) continue;   /* not the file's: its other name's bytes */
    int i = n++;
    while (i > 0 &&
           (st[order[i - 1]].begin > st[k].begin ||
            (st[order[i - 1]].begin == st[k].begin && st[order[i - 1]].end > st[k].end))) {
      order[i] = order[i - 1];
      i--;
    }
    order[i] = k;
  }
  uint64_t at = 0;
  for (int i = 0; i < n; i++) {
    const st_tensor *s = &st[order[i]];
    const char *name = ti[order[i]].name;
    if (s->begin < at)
      return DP_FAIL(DP_ERR_PARSE,
                     "safetensors file '%s': tensor '%s' [%llu, %llu] overlaps tensor '%s' "
                     "(which ends at %llu)",
                     path, name, (unsigned long long)s->begin, (unsigned long long)s->end,
                     ti[order[i - 1]].name, (unsigned long long)at);
    if (s->begin > at)
      return DP_FAIL(DP_ERR_PARSE,
                     "safetensors file '%s': tensor '%s' starts at byte %llu of the data, "
                     "after a gap of %llu bytes %s%s%s (the tensors must tile the data)",
                     path, name, (unsigned long long)s->begin,
                     (unsigned long long)(s->begin - at),
                     i ? "after tensor '" : "at its start", i ? ti[order[i - 1]].name : "",
                     i ? "'" : "");
    at = s->end;
  }
  if (at != data_len)
    return DP_FAIL(DP_ERR_PARSE,
                   "safetensors file '%s': %llu %s the last tensor%s%s%s (the data "
                   "has %zu bytes, the tensors %llu; is the header length right?)",
                   path, (unsigned long long)(data_len - at),
                   data_len - at == 1 ? "byte follows" : "bytes follow", n ? " '" : "",
                   n ? ti[order[n - 1]].name : "", n ? "'" : "", data_len,
                   (unsigned long long)at);
  return DP_OK;
}

/* The values into the state bytes: floats finite, running variances >= 0
 * (batchnorm divides by their square root), counts within libdp's 32 bits. */
static dp_status copy_values(const char *path, const st_entry *ti, const st_tensor *st,
                             int n, const unsigned char *data, unsigned char *state) {
  for (int k = 0; k < n; k++) {
    const st_entry *t = &ti[k];
    size_t eb = t->i64 ? 8 : 4;
    int k2 = alias_of(ti, k); /* a tied head's weight is the embedding's table */
    if (k2 >= 0 && memcmp(data + st[k2].begin, data + st[k].begin, eb * t->numel) != 0)
      return DP_FAIL(DP_ERR_INVALID,
                     "safetensors file '%s': '%s' and '%s' are one tensor in the model "
                     "(a tied output head) but differ in the file",
                     path, ti[k2].name, t->name);
    for (size_t e = 0; e < t->numel; e++) {
      const unsigned char *q = data + st[k].begin + eb * e;
      uint64_t u = 0;
      for (int x = (int)eb - 1; x >= 0; x--) u = u << 8 | q[x];
      if (t->i64) { /* num_batches_tracked: libdp counts in 32 bits */
        if (u > UINT32_MAX)
          return DP_FAIL(DP_ERR_INVALID,
                         "safetensors file '%s': %s is %lld; libdp counts up to %u", path,
                         t->name, (long long)u, UINT32_MAX);
      } else {
        float v;
        uint32_t u32 = (uint32_t)u;
        memcpy(&v, &u32, 4);
        if (!isfinite(v))
          return DP_FAIL(DP_ERR_NONFINITE, "safetensors file '%s': %s[%zu] is not finite",
                         path, t->name, e);
        if (t->var && v < 0.0f)
          return DP_FAIL(DP_ERR_INVALID,
                         "safetensors file '%s': %s[%zu] is %g; a variance is never "
                         "negative",
                         path, t->name, e, (double)v);
      }
      memcpy(state + t->off + eb * e, q, eb); /* little-endian as it is */
    }
  }
  return DP_OK;
}

/* A checkpoint given as a safetensors file: named as what it is, not as a
 * header length past the file. */
static dp_status is_a_checkpoint(const char *path) {
  return DP_FAIL(DP_ERR_PARSE,
                 "safetensors file '%s' is a libdp checkpoint, not a safetensors file (dp "
                 "export turns a checkpoint into one; a checkpoint is loaded as it is)",
                 path);
}

/* Checks the file against the model and decodes it into the state bytes
 * (st_entries: the parameters, then batchnorm's buffers). */
static dp_status decode(const dp_model *m, const char *path, const unsigned char *b,
                        size_t len, unsigned char *state) {
  if (len < 8)
    return DP_FAIL(DP_ERR_PARSE, "safetensors file '%s' is %zu bytes: too short", path,
                   len);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
  if (memcmp(b, DP__CKPT_MAGIC, 8) == 0) return is_a_checkpoint(path);
  if (hlen > ST_MAX_HEADER || hlen > len - 8)
    return DP_FAIL(DP_ERR_PARSE,
                   "safetensors file '%s': its header length %llu runs past the file's %zu "
                   "bytes",
                   path, (unsigned long long)hlen, len);
  const unsigned char *data = b + 8 + hlen;
  size_t data_len = len - 8 - (size_t)hlen;
  st_entry ti[ST_MAX_ENTRIES];
  size_t state_bytes;
  int n = st_entries(m, ti, &state_bytes);
  st_tensor st[ST_MAX_ENTRIES];
  memset(st, 0, sizeof st);
  const char *h = (const char *)b + 8;
  json j = {h, h, h + hlen, path, DP_OK};
  dp_status s = parse_header(&j, ti, n, st);
  if (!s) tied_names(ti, st, n);
  if (!s) s = check_entries(path, ti, st, n, data_len);
  if (!s) s = check_tiling(path, ti, st, n, data_len);
  if (!s) s = copy_values(path, ti, st, n, data, state);
  return s;
}

dp_status dp_ckpt_import_safetensors(dp_ctx *c, const char *path) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (!path || !*path)
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_INVALID, "dp_ckpt_import_safetensors: path is %s",
                                   path ? "empty" : "NULL"));
  const dp_model *m = &c->plan->model;
  size_t np = m->n_params, bytes;
  st_entry e[ST_MAX_ENTRIES];
  int n = st_entries(m, e, &bytes);
  /* the largest file this model has: its data (a tied weight's copy too) and a
   * generous header */
  size_t cap = 8 + ST_MAX_HEADER + bytes;
  for (int i = 0; i < n; i++)
    if (alias_of(e, i) >= 0) cap += st_bytes(&e[i]);
  unsigned char *buf = NULL, *state = malloc(bytes + 8);
  size_t len = 0;
  float *w = malloc(dp__param_floats(m) * 4 + 4); /* parameters, then the buffers */
  dp_status s = w && state ? DP_OK : DP_FAIL(DP_ERR_NOMEM, "safetensors: out of memory");
  /* across processes rank 0 reads and decides; the state goes to every rank */
  if (!s && dp__ctx_writes_files(c)) {
    s = read_all(path, cap, &buf, &len);
    if (!s) s = decode(m, path, buf, len, state);
    free(buf);
  }
  s = dp__ctx_root_status(c, s);
  if (!s) s = dp__ctx_bcast(c, 0, state, bytes);
  if (!s) { /* the state bytes as the PARAMS region's floats (the count: 32 bits) */
    for (size_t k = 0; k < np; k++) memcpy(&w[k], state + 4 * k, 4);
    for (int li = 0; li < m->n_layers; li++) {
      const dp_layer *l = &m->layers[li];
      if (l->kind != DP_LAYER_BATCHNORM) continue;
      char want[64];
      snprintf(want, sizeof want, "%d.running_mean", li);
      int k = 0;
      while (strcmp(e[k].name, want)) k++; /* st_entries lists it */
      float *dst = w + np + l->buf_off;
      memcpy(dst, state + e[k].off, 8 * (size_t)l->c); /* mean, var */
      memcpy(&dst[2 * l->c], state + e[k].off + 8 * (size_t)l->c,
             4); /* the count's low word */
    }
    s = dp__ctx_set_state(c, w);
  }
  free(w);
  free(state);
  return dp__ctx_fail(c, s);
}

/* ---- metadata ------------------------------------------------------------------- */

/* The header bytes of the safetensors file at path: *hdr malloc'd (hlen + 1
 * bytes, NUL-terminated). */
static dp_status read_header(const char *path, char **hdr, size_t *hlen) {
  struct stat st;
  *hdr = NULL;
  int fd;
  dp_status so = open_st(path, &st, &fd);
  if (so) return so;
  unsigned char len8[8];
  size_t got = 0;
  uint64_t n = 0;
  dp_status s = dp__read_fd(fd, len8, 8, &got, "safetensors file", path);
  if (!s && got < 8)
    s = DP_FAIL(DP_ERR_PARSE, "safetensors file '%s' is %zu bytes: too short", path, got);
  for (int i = 7; !s && i >= 0; i--) n = n << 8 | len8[i];
  if (!s && memcmp(len8, DP__CKPT_MAGIC, 8) == 0) s = is_a_checkpoint(path);
  if (!s && (n > ST_MAX_HEADER || n > (uint64_t)st.st_size - 8))
    s = DP_FAIL(DP_ERR_PARSE,
                "safetensors file '%s': its header length %llu runs past the file's %lld "
                "bytes",
                path, (unsigned long long)n, (long long)st.st_size);
  char *b = s ? NULL : malloc((size_t)n + 1);
  if (!s && !b) s = DP_FAIL(DP_ERR_NOMEM, "safetensors: out of memory");
  if (!s) s = dp__read_fd(fd, b, (size_t)n, &got, "safetensors file", path);
  if (!s && got < n)
    s = DP_FAIL(DP_ERR_PARSE, "safetensors file '%s' ends inside its header", path);
  close(fd);
  if (s) {
    free(b);
    return s;
  }
  b[n] = '\0';
  *hdr = b;
  *hlen = (size_t)n;
  return DP_OK;
}

/* The "__metadata__" object at j->p: its pairs counted (out NULL) or decoded
 * into out[] with the strings at *text (room enough: see jstr). */
static dp_status meta_pairs(json *j, dp_meta *out, char **text, size_t cap, int *n) {
  *n = 0;
  if (!eat(j, '{')) return jfail(j, "__metadata__ must be an object");
  if (eat(j, '}')) return DP_OK;
  do {
    char *k = out ? *text : NULL;
    if (!jstr(j, k, cap, true) || !eat(j, ':')) return jfail(j, "a metadata key");
    if (out) *text += strlen(k) + 1;
    ws(j);
    if (j->p == j->end || *j->p != '"')
      return jfail(j, "__metadata__ maps strings to strings; the value of a key is not a "
                      "string");
    char *v = out ? *text : NULL;
    if (!jstr(j, v, cap, true)) return j->err;
    if (out) {
      *text += strlen(v) + 1;
      for (int i = 0; i < *n; i++)
        if (!strcmp(out[i].key, k))
          return jfail(j, "__metadata__ has the key \"%.64s\" twice", k);
      out[*n] = (dp_meta){k, v};
    }
    ++*n;
  } while (eat(j, ','));
  if (!eat(j, '}')) return jfail(j, "__metadata__: '}' or ',' was expected");
  return DP_OK;
}

/* The header's object: its members skipped, the metadata's pairs counted or
 * decoded (meta_pairs). */
static dp_status header_meta(json *j, dp_meta *out, char **text, size_t cap, int *n) {
  size_t room = (size_t)(j->end - j->start) + 1;
  char *name = malloc(room);
  bool seen = false, empty = false;
  if (!name) return DP_FAIL(DP_ERR_NOMEM, "safetensors: out of memory");
  *n = 0;
  if (j->p == j->end || *j->p != '{')
    jfail(j, "it must be a JSON object, starting with '{'");
  if (!j->err) {
    j->p++;
    empty = eat(j, '}');
  }
  if (!j->err && !empty) do {
      if (!jstr(j, name, room, true) || !eat(j, ':')) {
        jfail(j, "a name");
        break;
      }
      if (strcmp(name, "__metadata__")) {
        if (!jskip(j, 1)) break;
        continue;
      }
      if (seen) {
        jfail(j, "\"__metadata__\" appears twice");
        break;
      }
      seen = true;
      if (meta_pairs(j, out, text, cap, n)) break;
    } while (eat(j, ','));
  free(name);
  if (!j->err && !empty && !eat(j, '}')) jfail(j, "'}' or ',' was expected");
  ws(j); /* the padding after the object */
  if (!j->err && j->p != j->end) jfail(j, "something follows the object");
  return j->err;
}

dp_status dp_safetensors_read_meta(const char *path, dp_meta **meta, int *n_meta) {
  if (meta) *meta = NULL;
  if (n_meta) *n_meta = 0;
  if (!path || !*path || !meta || !n_meta)
    return DP_FAIL(DP_ERR_INVALID, "dp_safetensors_read_meta: %s is NULL or empty",
                   !path || !*path ? "path"
                   : meta          ? "n_meta"
                                   : "meta");
  char *hdr = NULL;
  size_t hlen = 0;
  dp_status s = read_header(path, &hdr, &hlen);
  if (s) return s;
  int n = 0;
  json j = {hdr, hdr, hdr + hlen, path, DP_OK};
  s = header_meta(&j, NULL, NULL, 0, &n); /* first the count, then the pairs */
  dp_meta *out = NULL;
  if (!s && n > 0) {
    size_t room = hlen + 1;
    out = malloc((size_t)n * sizeof *out + room);
    if (!out) s = DP_FAIL(DP_ERR_NOMEM, "safetensors: out of memory");
    char *text = (char *)(out + n);
    j = (json){hdr, hdr, hdr + hlen, path, DP_OK};
    if (!s) s = header_meta(&j, out, &text, room, &n);
  }
  free(hdr);
  if (s) {
    free(out);
    return s;
  }
  *meta = out;
  *n_meta = n;
  return DP_OK;
}
