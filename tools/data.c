/* tools/data.c — CSV datasets for `dp train`. See data.h for the format. */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* getc_unlocked */
#endif

#include "data.h"
#include "cli.h" /* dpt_open_regular */

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* A standardised value far outside the training share's range (a test value of
 * 1e38 over a tiny spread) may not fit a float: saturate instead of making inf. */
static float saturate(double v) {
  return v > FLT_MAX ? FLT_MAX : v < -FLT_MAX ? -FLT_MAX : (float)v;
}

/* ---- random numbers: splitmix64 ------------------------------------------- */

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t next64(uint64_t *state) {
  *state += 0x9e3779b97f4a7c15ULL;
  return mix64(*state);
}

/* Uniform in [0, k), k >= 1, without modulo bias. */
static uint64_t below(uint64_t *state, uint64_t k) {
  uint64_t threshold = (0 - k) % k; /* 2^64 mod k */
  for (;;) {
    uint64_t r = next64(state);
    if (r >= threshold) return r % k;
  }
}

/* Independent streams from one seed: the split uses domain 1, epoch e uses
 * domain 2 with e as the index. */
static uint64_t stream_state(uint64_t seed, uint64_t domain, uint64_t index) {
  return mix64(mix64(seed ^ (domain * 0xd1b54a32d192ed03ULL)) + index);
}

static void shuffle_rows(int *perm, int n, uint64_t state) {
  for (int i = 0; i < n; i++) perm[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)below(&state, (uint64_t)i + 1);
    int t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

void dpt_epoch_order(int n, uint64_t seed, int epoch, int *perm) {
  if (n <= 0 || !perm) return;
  shuffle_rows(perm, n, stream_state(seed, 2, (uint64_t)(int64_t)epoch));
}

/* ---- datasets ---------------------------------------------------------------- */

void dpt_dataset_free(dpt_dataset *d) {
  if (!d) return;
  if (!d->borrowed) free(d->x);
  if (!d->labels_borrowed) free(d->label);
  free(d->y);
  free(d->rows);
  if (d->own && d->own_mapped)
    munmap(d->own, d->own_len);
  else if (d->own)
    free(d->own);
  memset(d, 0, sizeof *d);
}

int dpt_first_label_past(const dpt_dataset *d, int classes) {
  size_t lw = d->label_width > 1 ? (size_t)d->label_width : 1;
  for (size_t i = 0; d->label && i < (size_t)d->n_rows * lw; i++)
    if (d->label[i] >= classes) return (int)(i / lw);
  return -1;
}

/* ---- rows -------------------------------------------------------------------- */

/* Row r of d (a view's r-th row) as floats into out, unstandardised; or, when
 * its floats are in memory already, a pointer to them (out unused). */
static const float *row_of(const dpt_dataset *d, int r, float *out) {
  size_t nf = (size_t)d->n_features, src = d->rows ? (size_t)d->rows[r] : (size_t)r;
  if (d->x) return d->x + src * nf;
  const unsigned char *p = d->xmap + src * nf *
                                         (d->xtype == DPT_X_F64  ? 8
                                          : d->xtype == DPT_X_U8 ? 1
                                                                 : 4);
  if (d->xtype == DPT_X_U8) {
    for (size_t j = 0; j < nf; j++) out[j] = (float)p[j];
  } else if (d->xtype == DPT_X_I32) {
    for (size_t j = 0; j < nf; j++) {
      int32_t v;
      memcpy(&v, p + 4 * j, 4);
      out[j] = (float)v;
    }
  } else if (d->xtype == DPT_X_F64) {
    for (size_t j = 0; j < nf; j++) {
      double v;
      memcpy(&v, p + 8 * j, 8); /* little-endian, checked when loaded */
      out[j] = (float)v;
    }
  } else {
    memcpy(out, p, nf * 4);
  }
  return out;
}

void dpt_dataset_gather(const dpt_dataset *d, const dpt_scaler *sc, const int *idx,
                        int from, int n, float *x, void *t) {
  size_t nf = (size_t)d->n_features;
  int per = sc && sc->n > 0 ? (int)(nf / (size_t)sc->n) : 0;
  size_t lw = d->label_width > 1 ? (size_t)d->label_width : 1;
  for (int r = 0; r < n; r++) {
    int i = idx ? idx[from + r] : from + r;
    float *xr = x + (size_t)r * nf;
    const float *v = row_of(d, i, xr);
    if (per)
      for (size_t j = 0; j < nf; j++)
        xr[j] = saturate((v[j] - sc->mean[j / (size_t)per]) / sc->std[j / (size_t)per]);
    else if (v != xr)
      memcpy(xr, v, nf * 4);
    if (!t) continue;
    if (d->label)
      memcpy((int32_t *)t + (size_t)r * lw, d->label + (size_t)i * lw, lw * 4);
    else if (d->y)
      memcpy((float *)t + (size_t)r * (size_t)d->n_targets,
             d->y + (size_t)i * (size_t)d->n_targets, (size_t)d->n_targets * 4);
  }
}

/* ---- CSV parsing ------------------------------------------------------------ */

typedef struct {
  const char *path;
  long line;
  char *err;
  size_t errcap;
} where;

/* At most 40 bytes of a field, for messages. */
#define SHOW_MAX 40
#define SHOW(s)                                                                            \
  (int)(strlen(s) > SHOW_MAX ? SHOW_MAX : strlen(s)), (s),                                 \
      (strlen(s) > SHOW_MAX ? "..." : "")

static int is_blank(char c) { return c == ' ' || c == '\t'; }

/* Trims blanks (and a stray '\r') around [s, e) in place; returns the start. */
static char *trim(char *s, char *e) {
  while (s < e && is_blank(*s)) s++;
  while (e > s && (is_blank(e[-1]) || e[-1] == '\r')) e--;
  *e = '\0';
  return s;
}

static dp_status parse_label(const where *w, int field, const char *s, int32_t *out) {
  if (*s == '\0')
    return dpt_fail_status(DP_ERR_PARSE, w->err, w->errcap, "%s:%ld: field %d: empty field",
                           w->path, w->line, field);
  const char *p = s;
  if (*p == '+' || *p == '-') p++;
  int digits = 1;
  for (const char *q = p; *q; q++)
    if (*q < '0' || *q > '9') digits = 0;
  if (!digits || *p == '\0')
    return dpt_fail_status(
        DP_ERR_PARSE, w->err, w->errcap,
        "%s:%ld: field %d: label \"%.*s%s\" is not a non-negative integer", w->path,
        w->line, field, SHOW(s));
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '-' && (v != 0 || errno == ERANGE))
    return dpt_fail_status(DP_ERR_RANGE, w->err, w->errcap,
                           "%s:%ld: field %d: label %.*s%s is not a non-negative integer",
                           w->path, w->line, field, SHOW(s));
  if (errno == ERANGE || v > DPT_MAX_LABEL)
    return dpt_fail_status(DP_ERR_RANGE, w->err, w->errcap,
                           "%s:%ld: field %d: label %.*s%s is larger than the limit %d",
                           w->path, w->line, field, SHOW(s), DPT_MAX_LABEL);
  *out = (int32_t)v;
  return DP_OK;
}

static dp_status parse_float(const where *w, int field, const char *s, float *out) {
  if (*s == '\0')
    return dpt_fail_status(DP_ERR_PARSE, w->err, w->errcap, "%s:%ld: field %d: empty field",
                           w->path, w->line, field);
  errno = 0;
  char *end;
  float v = strtof(s, &end);
  /* strtof also reads hexadecimal floats; the format is decimal only */
  if (end == s || *end != '\0' || strpbrk(s, "xX"))
    return dpt_fail_status(DP_ERR_PARSE, w->err, w->errcap,
                           "%s:%ld: field %d: expected a number, got \"%.*s%s\"", w->path,
                           w->line, field, SHOW(s));
  if (!isfinite(v)) {
    if (errno == ERANGE) /* a finite decimal too large for float */
      return dpt_fail_status(DP_ERR_RANGE, w->err, w->errcap,
                             "%s:%ld: field %d: %.*s%s is out of float range", w->path,
                             w->line, field, SHOW(s));
    return dpt_fail_status(DP_ERR_NONFINITE, w->err, w->errcap,
                           "%s:%ld: field %d: non-finite value \"%.*s%s\"", w->path,
                           w->line, field, SHOW(s));
  }
  *out = v; /* ERANGE with a finite result is underflow: keep the tiny value */
  return DP_OK;
}

/* Growable arrays of the loader. */
typedef struct {
  dpt_dataset d;
  size_t cap_rows;
  bool features_only; /* rows hold the features only (dpt_csv_load_features) */
} builder;

static dp_status grow(builder *b, const where *w) {
  if ((size_t)b->d.n_rows < b->cap_rows) return DP_OK;
  if (b->d.n_rows == INT_MAX)
    return dpt_fail_status(DP_ERR_OVERFLOW, w->err, w->errcap, "%s:%ld: more than %d rows",
                           w->path, w->line, INT_MAX);
  size_t cap = b->cap_rows ? b->cap_rows * 2 : 256;
  if (cap > (size_t)INT_MAX) cap = (size_t)INT_MAX;
  size_t nx, ny;
  if (__builtin_mul_overflow(cap, (size_t)b->d.n_features, &nx) ||
      __builtin_mul_overflow(nx, sizeof(float), &nx) ||
      __builtin_mul_overflow(cap, (size_t)b->d.n_targets, &ny) ||
      __builtin_mul_overflow(ny, sizeof(float), &ny))
    return dpt_fail_status(DP_ERR_OVERFLOW, w->err, w->errcap, "%s:%ld: dataset too large",
                           w->path, w->line);
  float *x = realloc(b->d.x, nx ? nx : 1);
  if (!x) goto nomem;
  b->d.x = x;
  if (b->features_only) {
    /* no label, no targets */
  } else if (b->d.n_targets > 0) {
    float *y = realloc(b->d.y, ny ? ny : 1);
    if (!y) goto nomem;
    b->d.y = y;
  } else {
    int32_t *l = realloc(b->d.label, cap * sizeof(int32_t));
    if (!l) goto nomem;
    b->d.label = l;
  }
  b->cap_rows = cap;
  return DP_OK;
nomem:
  return dpt_fail_status(DP_ERR_NOMEM, w->err, w->errcap,
                         "%s:%ld: out of memory after %d rows", w->path, w->line,
                         b->d.n_rows);
}

/* Parses one data row (already known to have the right field count). */
static dp_status parse_row(builder *b, const where *w, char *line, size_t len) {
  dp_status s = grow(b, w);
  if (s != DP_OK) return s;
  size_t r = (size_t)b->d.n_rows;
  int nt = b->d.n_targets, nf = b->d.n_features;
  float *xr = b->d.x + r * (size_t)nf;
  char *p = line, *end = line + len;
  int32_t label = 0;
  for (int field = 1; p <= end; field++) {
    char *comma = memchr(p, ',', (size_t)(end - p));
    char *fe = comma ? comma : end;
    char *f = trim(p, fe);
    if (b->features_only) {
      s = parse_float(w, field, f, &xr[field - 1]);
    } else if (nt == 0 && field == 1) {
      s = parse_label(w, field, f, &label);
    } else if (field <= nt) {
      s = parse_float(w, field, f, b->d.y + r * (size_t)nt + (size_t)(field - 1));
    } else {
      int k = field - (nt == 0 ? 1 : nt) - 1;
      s = parse_float(w, field, f, &xr[k]);
    }
    if (s != DP_OK) return s;
    p = fe + 1;
  }
  if (nt == 0 && !b->features_only) {
    b->d.label[r] = label;
    if (label + 1 > b->d.n_classes) b->d.n_classes = label + 1;
  }
  b->d.n_rows++;
  return DP_OK;
}

/* One line of f into *buf (NUL-terminated, the newline kept), growing it up
 * to DPT_MAX_LINE bytes: a file without newlines (binary data, /dev/zero)
 * cannot make the loader allocate without bound. */
typedef enum { LINE_OK, LINE_EOF, LINE_ERROR, LINE_TOO_LONG, LINE_NOMEM } line_status;

static line_status read_line(FILE *f, char **buf, size_t *cap, size_t *len) {
  size_t n = 0;
  int c = EOF;
  while ((c = getc_unlocked(f)) != EOF) {
    if (n + 1 >= *cap) {
      if (*cap >= DPT_MAX_LINE) return LINE_TOO_LONG;
      size_t nc = *cap ? *cap * 2 : 4096;
      if (nc > DPT_MAX_LINE) nc = DPT_MAX_LINE;
      char *nb = realloc(*buf, nc);
      if (!nb) return LINE_NOMEM;
      *buf = nb;
      *cap = nc;
    }
    (*buf)[n++] = (char)c;
    if (c == '\n') break;
  }
  if (c == EOF && ferror(f)) return LINE_ERROR;
  if (n == 0) return LINE_EOF;
  (*buf)[n] = '\0';
  *len = n;
  return LINE_OK;
}

/* Whether the row holds a name: a field with a letter (ASCII or any UTF-8
 * character) that does not read as a number (a header's names; not an empty
 * field, a long number or a stray sign, which are data rows' errors). */
static bool has_word(const char *line) {
  for (const char *p = line;;) {
    size_t n = strcspn(p, ",");
    bool letter = false;
    for (size_t i = 0; i < n; i++) /* a UTF-8 byte is part of a letter (标签, étiquette) */
      letter |= isalpha((unsigned char)p[i]) || p[i] == '_' || (unsigned char)p[i] >= 0x80;
    char f[64], *e;
    snprintf(f, sizeof f, "%.*s", n < 63 ? (int)n : 63, p);
    const char *b = f;
    while (is_blank(*b)) b++;
    strtof(b, &e);
    while (is_blank(*e) || *e == '\r') e++;
    if (letter && (e == b || *e || n >= 63)) return true;
    if (!p[n]) return false;
    p += n + 1;
  }
}

/* The header row: 1 when line (its field count `count`) is the header, to
 * be skipped: header 1 forced, 0 detected (a field that is not a number),
 * -1 never. */
static int header_row(const char *line, int header, long count, long lineno, long *fields,
                      long *at) {
  if (header < 0 || (!header && !has_word(line))) return 0;
  *fields = count;
  *at = lineno;
  return 1;
}

static dp_status load(const char *path, int n_targets, bool features_only, int header,
                      dpt_dataset *out, char *err, size_t errcap) {
  if (out) memset(out, 0, sizeof *out);
  if (!path || !out)
    return dpt_fail_status(DP_ERR_INVALID, err, errcap, "dpt_csv_load: NULL argument");
  if (n_targets < 0)
    return dpt_fail_status(DP_ERR_INVALID, err, errcap, "%s: n_targets %d is negative",
                           path, n_targets);
  /* a regular file only, checked without blocking (a FIFO with no writer would
   * block a plain open for ever) */
  char why[512];
  int fd = dpt_open_regular(path, "data", why, sizeof why);
  if (fd < 0) return dpt_fail_status(DP_ERR_IO, err, errcap, "%s", why);
  FILE *f = fdopen(fd, "r");
  if (!f) {
    int e = errno;
    close(fd);
    return dpt_fail_status(DP_ERR_IO, err, errcap, "cannot read data '%s': %s", path,
                           strerror(e));
  }

  builder b;
  memset(&b, 0, sizeof b);
  b.d.n_targets = n_targets;
  b.features_only = features_only;
  where w = {path, 0, err, errcap};
  int n_fields = 0;              /* fixed by the first data row */
  long h_fields = 0, h_line = 0; /* the header row's field count and line */
  bool reread = false;
  char *line = NULL;
  size_t linecap = 0, len = 0;
  line_status ls;
  dp_status s = DP_OK;
  errno = 0;
  while ((ls = read_line(f, &line, &linecap, &len)) == LINE_OK) {
    w.line++;
    if (len > 0 && line[len - 1] == '\n') len--;
    if (len > 0 && line[len - 1] == '\r') len--;
    line[len] = '\0';
    if (w.line == 1 && len >= 3 && !memcmp(line, "\xef\xbb\xbf", 3)) { /* a UTF-8 BOM */
      memmove(line, line + 3, len - 2);
      len -= 3;
    }
    if (strlen(line) != len) {
      s = dpt_fail_status(DP_ERR_PARSE, err, errcap, "%s:%ld: NUL byte in line", path,
                          w.line);
      goto done;
    }
    const char *q = line;
    while (is_blank(*q)) q++;
    if (*q == '\0' || *q == '#') continue;

    long count = 1;
    for (const char *c = line; *c; c++)
      if (*c == ',') count++;
    if (n_fields == 0 && h_line == 0 &&
        header_row(line, header, count, w.line, &h_fields, &h_line))
      continue;
    if (h_line && count != h_fields) {
      s = dpt_fail_status(DP_ERR_PARSE, err, errcap,
                          "%s:%ld: field count %ld; the header row (line %ld) has %ld",
                          path, w.line, count, h_line, h_fields);
      goto done;
    }
    if (n_fields == 0) {
      int lead = features_only ? 0 : n_targets > 0 ? n_targets : 1; /* before features */
      long min = lead + 1;
      if (count < min) {
        const char *sep = strchr(line, ';')    ? "semicolons"
                          : strchr(line, '\t') ? "tabs"
                                               : NULL;
        s = dpt_fail_status(
            DP_ERR_PARSE, err, errcap,
            "%s:%ld: field count %ld, expected at least %ld (%s and a feature)%s%s%s", path,
            w.line, count, min, n_targets > 0 ? "targets" : "a label",
            sep ? "; fields are separated by commas, not " : "", sep ? sep : "",
            sep ? " as on this line" : "");
        goto done;
      }
      if (count > INT_MAX / 2) {
        s = dpt_fail_status(DP_ERR_OVERFLOW, err, errcap, "%s:%ld: %ld fields is too many",
                            path, w.line, count);
        goto done;
      }
      n_fields = (int)count;
      b.d.n_features = n_fields - lead;
    } else if (count != n_fields) {
      s = dpt_fail_status(DP_ERR_PARSE, err, errcap, "%s:%ld: field count %ld, expected %d",
                          path, w.line, count, n_fields);
      goto done;
    }
    s = parse_row(&b, &w, line, len);
    if (s != DP_OK) goto done;
    errno = 0;
  }
  if (ls == LINE_TOO_LONG) {
    s = dpt_fail_status(DP_ERR_PARSE, err, errcap,
                        "%s:%ld: line longer than %d MiB (not a CSV dataset?)", path,
                        w.line + 1, DPT_MAX_LINE >> 20);
    goto done;
  }
  if (ls == LINE_NOMEM) {
    s = dpt_fail_status(DP_ERR_NOMEM, err, errcap, "%s:%ld: out of memory for the line",
                        path, w.line + 1);
    goto done;
  }
  if (ls == LINE_ERROR || ferror(f)) {
    s = dpt_fail_status(DP_ERR_IO, err, errcap, "%s:%ld: read error: %s", path, w.line + 1,
                        strerror(errno ? errno : EIO));
    goto done;
  }
  if (b.d.n_rows == 0 && h_line && header == 0) { /* a detected header alone */
    reread = true;                                /* read as data, for the error it has */
    goto done;
  }
  if (b.d.n_rows == 0) {
    s = dpt_fail_status(DP_ERR_PARSE, err, errcap, "%s: no data rows%s", path,
                        h_line ? " after the header" : "");
    goto done;
  }
  b.d.header_line = (int)h_line;
done:
  free(line);
  fclose(f);
  if (s != DP_OK || reread) {
    dpt_dataset_free(&b.d);
    return reread ? load(path, n_targets, features_only, -1, out, err, errcap) : s;
  }
  *out = b.d;
  return DP_OK;
}

dp_status dpt_csv_load(const char *path, dpt_dataset *out, char *err, size_t errcap) {
  return load(path, 0, false, 0, out, err, errcap);
}

dp_status dpt_csv_load_features(const char *path, dpt_dataset *out, char *err,
                                size_t errcap) {
  return load(path, 0, true, 0, out, err, errcap);
}

dp_status dpt_csv_load_as(const char *path, dpt_rows rows, int n_targets, int header,
                          dpt_dataset *out, char *err, size_t errcap) {
  if (rows == DPT_ROWS_TARGETS && n_targets < 1) {
    if (out) memset(out, 0, sizeof *out);
    return dpt_fail_status(DP_ERR_INVALID, err, errcap, "%s: n_targets %d, expected >= 1",
                           path ? path : "(null)", n_targets);
  }
  return load(path, rows == DPT_ROWS_TARGETS ? n_targets : 0, rows == DPT_ROWS_FEATURES,
              header, out, err, errcap);
}

dp_status dpt_csv_load_regression(const char *path, int n_targets, dpt_dataset *out,
                                  char *err, size_t errcap) {
  if (n_targets < 1) {
    if (out) memset(out, 0, sizeof *out);
    return dpt_fail_status(DP_ERR_INVALID, err, errcap, "%s: n_targets %d, expected >= 1",
                           path ? path : "(null)", n_targets);
  }
  return load(path, n_targets, false, 0, out, err, errcap);
}

/* ---- split ------------------------------------------------------------------- */

/* A new dataset with the rows idx[0..n) of src (n may be 0): their features
 * copied, or for a dataset in xmap a view of them (rows: the file's rows). */
static dp_status gather_rows(const dpt_dataset *src, const int *idx, int n,
                             dpt_dataset *dst) {
  memset(dst, 0, sizeof *dst);
  dst->n_features = src->n_features;
  dst->n_targets = src->n_targets;
  dst->n_classes = src->n_classes;
  dst->label_width = src->label_width;
  dst->header_line = src->header_line;
  size_t nf = (size_t)src->n_features, nt = (size_t)src->n_targets;
  size_t lw = src->label_width > 1 ? (size_t)src->label_width : 1;
  size_t rows = (size_t)n;
  bool view = src->x == NULL;
  /* A contiguous range of a sequence's windows in file order (its head or
   * tail; ids are never standardised in place) borrows its labels, and its
   * inputs when they are in memory (--tokens' floats). */
  bool range = src->label_width > 1 && src->label && !src->rows && rows > 0;
  for (size_t i = 1; range && i < rows; i++) range = idx[i] == idx[0] + (int)i;
  /* sizes fit: src already holds at least this many rows */
  if (view) {
    dst->xmap = src->xmap;
    dst->xtype = src->xtype;
    dst->borrowed = 1;
    dst->rows = malloc(rows * sizeof(int) + 1);
  } else if (range) {
    dst->x = src->x + (size_t)idx[0] * nf;
    dst->borrowed = 1;
  } else {
    dst->x = malloc(rows * nf * sizeof(float) + 1);
  }
  if (range) {
    dst->label = src->label + (size_t)idx[0] * lw;
    dst->labels_borrowed = 1;
  } else if (src->label) {
    dst->label = malloc(rows * lw * sizeof(int32_t) + 1);
  }
  if (src->y) dst->y = malloc(rows * nt * sizeof(float) + 1);
  if ((view ? !dst->rows : !dst->x) || (src->label && !dst->label) || (src->y && !dst->y)) {
    dpt_dataset_free(dst);
    return DP_ERR_NOMEM;
  }
  for (size_t i = 0; i < rows; i++) {
    size_t r = (size_t)idx[i];
    if (view)
      dst->rows[i] = src->rows ? src->rows[r] : (int)r;
    else if (!range)
      memcpy(dst->x + i * nf, src->x + r * nf, nf * sizeof(float));
    if (src->label && !range)
      memcpy(dst->label + i * lw, src->label + r * lw, lw * sizeof(int32_t));
    if (src->y) memcpy(dst->y + i * nt, src->y + r * nt, nt * sizeof(float));
  }
  dst->n_rows = n;
  return DP_OK;
}

dp_status dpt_dataset_split(const dpt_dataset *all, double test_fraction, uint64_t seed,
                            dpt_dataset *train, dpt_dataset *test, char *err,
                            size_t errcap) {
  return dpt_dataset_split_as(all, test_fraction, 1, seed, train, test, err, errcap);
}

dp_status dpt_dataset_split_as(const dpt_dataset *all, double test_fraction, int shuffle,
                               uint64_t seed, dpt_dataset *train, dpt_dataset *test,
                               char *err, size_t errcap) {
  if (train) memset(train, 0, sizeof *train);
  if (test) memset(test, 0, sizeof *test);
  if (!all || !train || !test || train == test || train == all || test == all)
    return dpt_fail_status(DP_ERR_INVALID, err, errcap,
                           "dpt_dataset_split: NULL or aliased argument");
  if (all->n_rows <= 0 || (!all->x && !all->xmap))
    return dpt_fail_status(DP_ERR_INVALID, err, errcap, "dpt_dataset_split: empty dataset");
  if (!(test_fraction >= 0.0 && test_fraction < 1.0))
    return dpt_fail_status(DP_ERR_INVALID, err, errcap,
                           "test fraction %g is outside [0, 1)", test_fraction);
  int n = all->n_rows;
  /* the small slack keeps e.g. 0.7 * 10 = 7.000000000000001 at 7 */
  double want = ceil(test_fraction * (double)n - 1e-9);
  int n_test = want < 0 ? 0 : (int)want;
  if (n_test >= n)
    return dpt_fail_status(DP_ERR_INVALID, err, errcap,
                           "test fraction %g of %d rows leaves no training rows",
                           test_fraction, n);
  int *perm = malloc((size_t)n * sizeof(int));
  if (!perm)
    return dpt_fail_status(DP_ERR_NOMEM, err, errcap, "dpt_dataset_split: out of memory");
  if (shuffle) {
    shuffle_rows(perm, n, stream_state(seed, 1, 0));
  } else { /* file order: the held-out share is the tail, first in perm */
    for (int i = 0; i < n_test; i++) perm[i] = n - n_test + i;
    for (int i = n_test; i < n; i++) perm[i] = i - n_test;
  }
  dp_status s = gather_rows(all, perm, n_test, test);
  if (s == DP_OK) s = gather_rows(all, perm + n_test, n - n_test, train);
  free(perm);
  if (s != DP_OK) {
    dpt_dataset_free(train);
    dpt_dataset_free(test);
    return dpt_fail_status(s, err, errcap, "dpt_dataset_split: out of memory");
  }
  return DP_OK;
}

/* ---- standardisation ------------------------------------------------------ */

void dpt_standardize(dpt_dataset *train, dpt_dataset *test) {
  if (!train || train->n_rows <= 0 || !train->x || train->borrowed) return;
  if (test && (test->n_features != train->n_features || !test->x || test->borrowed))
    test = NULL;
  dpt_scaler sc;
  if (dpt_scaler_fit(train, &sc)) return; /* out of memory: left as they are */
  dpt_scaler_apply(&sc, train);
  dpt_scaler_apply(&sc, test);
  dpt_scaler_free(&sc);
}

/* The statistics of `groups` groups of the row's features (group g: features
 * [g * per, (g + 1) * per)) over every training row, in double: per feature
 * (per 1) or per channel (per H*W). The sums run over the rows in order and,
 * within a row, over the group's features in order, so per feature they are
 * the sums of before. */
static int scaler_fit(const dpt_dataset *train, int groups, int per, dpt_scaler *sc) {
  memset(sc, 0, sizeof *sc);
  if (!train || train->n_rows <= 0 || (!train->x && !train->xmap) || groups <= 0) return 0;
  int nf = train->n_features;
  sc->mean = malloc((size_t)groups * sizeof *sc->mean);
  sc->std = malloc((size_t)groups * sizeof *sc->std);
  double *sum = calloc((size_t)groups, sizeof *sum);
  float *buf = malloc((size_t)nf * sizeof *buf); /* a row of a file, as floats */
  if (!sc->mean || !sc->std || !sum || !buf) {
    free(sum);
    free(buf);
    dpt_scaler_free(sc);
    return -1;
  }
  sc->n = groups;
  sc->per_channel = per > 1 || groups != nf;
  size_t n = (size_t)train->n_rows, count = n * (size_t)per;
  /* two passes over the rows in order (a mapped file streams through); each
   * group's sums add its values in row order, as a loop per feature would */
  for (size_t i = 0; i < n; i++) {
    const float *v = row_of(train, (int)i, buf);
    for (int g = 0; g < groups; g++)
      for (int k = 0; k < per; k++) sum[g] += v[g * per + k];
  }
  for (int g = 0; g < groups; g++) {
    sc->mean[g] = sum[g] / (double)count;
    sum[g] = 0.0;
  }
  for (size_t i = 0; i < n; i++) {
    const float *v = row_of(train, (int)i, buf);
    for (int g = 0; g < groups; g++)
      for (int k = 0; k < per; k++) {
        double d = v[g * per + k] - sc->mean[g];
        sum[g] += d * d;
      }
  }
  for (int g = 0; g < groups; g++) {
    double mean = sc->mean[g], sd = sqrt(sum[g] / (double)count);
    /* constant (or nearly, relative to the mean): scale 1, counted for a warning */
    if (!(sd > 1e-12 * (fabs(mean) > 1.0 ? fabs(mean) : 1.0))) {
      sd = 1.0;
      if (sc->n_constant < DPT_CONSTANT_SHOWN) sc->constant[sc->n_constant] = g;
      sc->n_constant++;
    }
    sc->std[g] = sd;
  }
  free(sum);
  free(buf);
  return 0;
}

int dpt_scaler_fit(const dpt_dataset *train, dpt_scaler *sc) {
  return scaler_fit(train, train ? train->n_features : 0, 1, sc);
}

int dpt_scaler_fit_channels(const dpt_dataset *train, int channels, dpt_scaler *sc) {
  if (!train || channels <= 0 || train->n_features % channels) {
    memset(sc, 0, sizeof *sc);
    return 0;
  }
  int rc = scaler_fit(train, channels, train->n_features / channels, sc);
  sc->per_channel = sc->n > 0;
  return rc;
}

void dpt_scaler_apply(const dpt_scaler *sc, dpt_dataset *d) {
  if (!sc || sc->n <= 0 || !d || !d->x) return;
  int nf = d->n_features;
  if (sc->per_channel ? nf % sc->n != 0 : nf != sc->n) return;
  int per = nf / sc->n;
  for (size_t i = 0; i < (size_t)(d->n_rows > 0 ? d->n_rows : 0); i++)
    for (int j = 0; j < nf; j++) {
      float *v = &d->x[i * (size_t)nf + (size_t)j];
      *v = saturate((*v - sc->mean[j / per]) / sc->std[j / per]);
    }
}

void dpt_scaler_free(dpt_scaler *sc) {
  if (!sc) return;
  free(sc->mean);
  free(sc->std);
  memset(sc, 0, sizeof *sc);
}

const char *dpt_scaler_mode(const dpt_scaler *sc) {
  return !sc || sc->n <= 0 ? "none" : sc->per_channel ? "channel" : "feature";
}

int dpt_scaler_fits(const dpt_scaler *sc, int features, int channels, char *err,
                    size_t errcap) {
  if (!sc || sc->n <= 0) return 0;
  if (sc->per_channel && sc->n != channels)
    return dpt_fail(err, errcap,
                    "its standardisation is per channel, of %d channels; the "
                    "model's input has %d",
                    sc->n, channels);
  if (!sc->per_channel && sc->n != features)
    return dpt_fail(err, errcap, "its standardisation has %d features; the model takes %d",
                    sc->n, features);
  return 0;
}

void dpt_scaler_summary(const dpt_scaler *sc, char *buf, size_t cap) {
  if (!sc || sc->n <= 0) {
    snprintf(buf, cap, "none: the model takes the features as they are");
    return;
  }
  size_t at = (size_t)snprintf(buf, cap, "per %s, %d value%s",
                               sc->per_channel ? "channel" : "feature", sc->n,
                               sc->n == 1 ? "" : "s");
  for (int k = 0; k < 2; k++) {
    const double *v = k ? sc->std : sc->mean;
    if (at < cap) at += (size_t)snprintf(buf + at, cap - at, "; %s", k ? "std" : "mean");
    for (int j = 0; j < sc->n && j < 4 && at < cap; j++)
      at += (size_t)snprintf(buf + at, cap - at, "%s %.4g", j ? "," : "", v[j]);
    if (sc->n > 4 && at < cap) at += (size_t)snprintf(buf + at, cap - at, ", ...");
  }
}

int dpt_model_image(const dp_model *m, int *c, int *h, int *w) {
  char in[128];
  *c = *h = *w = 0;
  dp_model_format(m, in, sizeof in); /* cut short: the first line is all it needs */
  if (sscanf(in, "input %d %d %d", c, h, w) == 3 && *c > 0 && *h > 0 && *w > 0) return 1;
  *c = *h = *w = 0;
  return 0;
}

/* ---- the standardisation in safetensors metadata -------------------------------- */

/* v as the shortest decimal that reads back as the same double. */
static void shortest_double(double v, char *buf, size_t cap) {
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, cap, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) return;
  }
}

int dpt_scaler_meta(const dpt_scaler *sc, dp_meta pairs[3], char **buf) {
  *buf = NULL;
  pairs[0] = (dp_meta){"dp.standardize", dpt_scaler_mode(sc)};
  if (!sc || sc->n <= 0) return 1;
  size_t cap = (size_t)sc->n * 26 + 1; /* "-1.2345678901234567e-308," */
  char *text = malloc(2 * cap);
  if (!text) return -1;
  for (int k = 0; k < 2; k++) {
    char *p = text + (size_t)k * cap;
    const double *v = k ? sc->std : sc->mean;
    *p = '\0';
    for (int j = 0; j < sc->n; j++) {
      if (j) *p++ = ',';
      shortest_double(v[j], p, 25);
      p += strlen(p);
    }
    pairs[1 + k] = (dp_meta){k ? "dp.std" : "dp.mean", text + (size_t)k * cap};
  }
  *buf = text;
  return 3;
}

/* A standardisation's mean or deviation as the scaler may apply it: a float32's
 * range (a mean of 1e39 or a deviation of 1e-300 makes every input +-FLT_MAX),
 * a deviation a normal float32 above 0 (it divides). dp train's own are: a
 * mean of float32 data, a deviation of at least 1e-12. */
static bool scale_ok(double v, bool deviation) {
  return isfinite(v) && fabs(v) <= FLT_MAX && (!deviation || v >= FLT_MIN);
}

/* The comma-separated doubles of key's value into v[0..n): *n of them (v NULL:
 * counted only). Decimal numbers only (no spaces, hexadecimal, inf or nan).
 * 0, or -1 (err). */
static int meta_numbers(const char *key, const char *val, double *v, int *n, int positive,
                        char *err, size_t errcap) {
  const char *p = val;
  *n = 0;
  for (;;) {
    size_t len = strcspn(p, ",");
    char *e = NULL;
    double x = dpt_decimal(p, len) ? strtod(p, &e) : 0.0;
    if (e != p + len)
      return dpt_fail(err, errcap, "metadata %s: field %d \"%.*s\" is not a decimal number",
                      key, *n + 1, len > 24 ? 24 : (int)len, p);
    if (!scale_ok(x, positive))
      return dpt_fail(err, errcap, "metadata %s: field %d is %.*s; %s", key, *n + 1,
                      len > 24 ? 24 : (int)len, p,
                      positive
                          ? "a deviation is a normal float32 above 0 (1.2e-38 to 3.4e38)"
                          : "a mean is a finite float32 (within +-3.4e38)");
    if (v) v[*n] = x;
    if (++*n > (1 << 24))
      return dpt_fail(err, errcap, "metadata %s: more than %d values", key, 1 << 24);
    if (p[len] == '\0') return 0;
    p += len + 1;
  }
}

int dpt_scaler_from_meta(const dp_meta *pairs, int n, dpt_scaler *sc, char *err,
                         size_t errcap) {
  memset(sc, 0, sizeof *sc);
  const char *mode = NULL, *mean = NULL, *std = NULL;
  for (int i = 0; i < n; i++) {
    if (!strcmp(pairs[i].key, "dp.standardize")) mode = pairs[i].value;
    if (!strcmp(pairs[i].key, "dp.mean")) mean = pairs[i].value;
    if (!strcmp(pairs[i].key, "dp.std")) std = pairs[i].value;
  }
  if (!mode && !mean && !std) return 0;
  if (!mode)
    return dpt_fail(err, errcap, "metadata %s without dp.standardize",
                    mean ? "dp.mean" : "dp.std");
  int per_channel = !strcmp(mode, "channel");
  if (!strcmp(mode, "none")) {
    if (mean || std)
      return dpt_fail(err, errcap, "metadata dp.standardize is \"none\" but %s is there",
                      mean ? "dp.mean" : "dp.std");
    return 1;
  }
  if (!per_channel && strcmp(mode, "feature"))
    return dpt_fail(err, errcap,
                    "metadata dp.standardize is \"%.32s\"; it is none, feature or channel",
                    mode);
  if (!mean || !std)
    return dpt_fail(err, errcap, "metadata dp.standardize is \"%s\" without %s", mode,
                    mean ? "dp.std" : "dp.mean");
  int nm, ns;
  if (meta_numbers("dp.mean", mean, NULL, &nm, 0, err, errcap) ||
      meta_numbers("dp.std", std, NULL, &ns, 1, err, errcap))
    return -1;
  if (nm != ns)
    return dpt_fail(err, errcap, "metadata dp.mean has %d values and dp.std %d", nm, ns);
  sc->mean = malloc((size_t)nm * sizeof *sc->mean);
  sc->std = malloc((size_t)nm * sizeof *sc->std);
  if (!sc->mean || !sc->std) {
    dpt_scaler_free(sc);
    return dpt_fail(err, errcap, "out of memory");
  }
  meta_numbers("dp.mean", mean, sc->mean, &nm, 0, err, errcap);
  meta_numbers("dp.std", std, sc->std, &ns, 1, err, errcap);
  sc->n = nm;
  sc->per_channel = per_channel;
  return 1;
}

int dpt_ckpt_scaler(const char *path, dpt_scaler *sc, int *has_record, char *err,
                    size_t errcap) {
  memset(sc, 0, sizeof *sc);
  *has_record = 0;
  void *app = NULL;
  size_t n = 0;
  if (dp_ckpt_read_app(path, &app, &n))
    return dpt_fail(err, errcap, "%s", dpt_user_msg(dp_last_error()));
  int epochs, rows, rc = 0;
  if (n && strncmp(app, "libdp-train ", n < 12 ? n : 12) == 0) {
    char why[256];
    if ((rc = dpt_run_parse(app, n, &epochs, &rows, sc, NULL, why, sizeof why)))
      snprintf(err, errcap, "%s: %s", path, why);
    else
      *has_record = 1;
  }
  free(app);
  return rc;
}

/* ---- the run, kept in the checkpoint's application data ---------------------
 * A text (exact: floats in hexadecimal):
 *   libdp-train 1
 *   epochs N              epochs done
 *   rows R                training rows (a check that the data is the same)
 *   standardize 0|1|2     none, per feature, per channel
 *   features F            the features (1) or the channels (2)
 *   mean <F values>       with standardize 1 or 2
 *   std <F values>                                                           */
char *dpt_run_text(int epochs, int rows, const dpt_scaler *sc, const char *settings,
                   size_t *len) {
  return dpt_run_text_at(epochs, 0, rows, sc, settings, len);
}

char *dpt_run_text_at(int epochs, int position, int rows, const dpt_scaler *sc,
                      const char *settings, size_t *len) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  if (!f) return NULL;
  fprintf(f, "libdp-train 1\nepochs %d\nrows %d\nstandardize %d\nfeatures %d\n", epochs,
          rows, sc->n > 0 ? 1 + (sc->per_channel != 0) : 0, sc->n);
  for (int k = 0; k < 2 && sc->n > 0; k++) {
    fputs(k ? "std" : "mean", f);
    for (int j = 0; j < sc->n; j++) fprintf(f, " %a", k ? sc->std[j] : sc->mean[j]);
    fputc('\n', f);
  }
  if (settings) fprintf(f, "settings %s\n", settings);
  if (position > 0) fprintf(f, "position %d\n", position);
  if (fclose(f) != 0) {
    free(buf);
    return NULL;
  }
  *len = n;
  return buf;
}

/* "<key> <n>\n" at *p, n a decimal in [0, hi] as dpt_run_text writes it (no
 * sign, space or leading zero): n in *out, *p past the line. Every number
 * read from a file is range-checked before arithmetic uses it (an epoch count
 * of 2147483647 once overflowed dp train's resume arithmetic). */
static int record_int(const char **p, const char *key, int hi, int *out, char *why,
                      size_t whycap) {
  size_t k = strlen(key);
  if (strncmp(*p, key, k) || (*p)[k] != ' ')
    return snprintf(why, whycap, "no line \"%s N\" where it belongs", key), -1;
  const char *s = *p + k + 1, *d = s;
  int shown = (int)strcspn(s, "\n");
  if (shown > 40) shown = 40; /* the message shows at most 40 characters of it */
  long long v = 0;
  while (*d >= '0' && *d <= '9') {
    v = v * 10 + (*d++ - '0'); /* v <= hi <= INT_MAX before: no overflow */
    if (v > hi)
      return snprintf(why, whycap, "%s %.*s is out of range (0 to %d)", key, shown, s, hi),
             -1;
  }
  if (d == s || (*s == '0' && d - s > 1) || *d != '\n')
    return snprintf(why, whycap, "%s: \"%.*s\" is not a number", key, shown, s), -1;
  *out = (int)v;
  *p = d + 1;
  return 0;
}

/* The record's counts: epochs done, training rows, standardize 0, 1 or 2, and
 * the feature count (0 without standardisation, 1 to 2^24 with). */
static int record_head(const char **p, int *epochs, int *rows, int *std, int *nf, char *why,
                       size_t whycap) {
  if (strncmp(*p, "libdp-train 1\n", 14))
    return snprintf(why, whycap, "it does not start with \"libdp-train 1\""), -1;
  *p += 14;
  if (record_int(p, "epochs", DPT_MAX_EPOCHS, epochs, why, whycap) ||
      record_int(p, "rows", INT_MAX, rows, why, whycap) ||
      record_int(p, "standardize", 2, std, why, whycap) ||
      record_int(p, "features", 1 << 24, nf, why, whycap))
    return -1;
  if ((*nf > 0) != (*std > 0))
    return snprintf(why, whycap, "standardize %d with %d features", *std, *nf), -1;
  return 0;
}

/* Parses dpt_run_text's output: 0, or -1 with a message (a file of another
 * program, or damaged). */
int dpt_run_parse(const char *text, size_t len, int *epochs, int *rows, dpt_scaler *sc,
                  char **settings, char *err, size_t errcap) {
  memset(sc, 0, sizeof *sc);
  if (settings) *settings = NULL;
  char *t = malloc(len + 1), why[160] = "";
  if (!t) return snprintf(err, errcap, "out of memory"), -1;
  memcpy(t, text, len);
  t[len] = '\0';
  int std = 0, nf = 0, rc = -1;
  const char *p = t;
  if (strlen(t) != len) { /* a NUL would end the text early */
    snprintf(why, sizeof why, "a NUL byte");
    goto bad;
  }
  if (record_head(&p, epochs, rows, &std, &nf, why, sizeof why)) goto bad;
  if (std) {
    sc->n = nf;
    sc->per_channel = std == 2;
    sc->mean = malloc((size_t)nf * sizeof *sc->mean);
    sc->std = malloc((size_t)nf * sizeof *sc->std);
    if (!sc->mean || !sc->std) {
      snprintf(why, sizeof why, "out of memory for its %d features", nf);
      goto bad;
    }
    /* each way it can be wrong said (an outside check, session 23) */
    for (int k = 0; k < 2; k++) {
      const char *word = k ? "std" : "mean";
      if (strncmp(p, word, strlen(word))) {
        snprintf(why, sizeof why, "no line \"%s ...\" where it belongs", word);
        goto bad;
      }
      p += strlen(word);
      for (int j = 0; j < nf; j++) {
        char *e;
        if (*p != ' ' || (p[1] && strchr(" \t\n\v\f\r", p[1]))) {
          /* one space: strtod would skip a newline too */
          snprintf(why, sizeof why, "%s has %d values where features gives %d", word, j,
                   nf);
          goto bad;
        }
        double v = strtod(p, &e);
        if (e == p || !scale_ok(v, k)) {
          snprintf(why, sizeof why, "%s[%d] is not a %s", word, j,
                   k ? "normal float32 above 0" : "finite float32");
          goto bad;
        }
        (k ? sc->std : sc->mean)[j] = v;
        p = e;
      }
      while (*p == ' ') p++;
      if (*p++ != '\n') {
        snprintf(why, sizeof why, "%s has more values than features gives (%d)", word, nf);
        goto bad;
      }
    }
  }
  /* the run's settings (optional: earlier records have none) */
  if (!strncmp(p, "settings ", 9)) {
    const char *nl = strchr(p, '\n');
    if (!nl) {
      snprintf(why, sizeof why, "its settings line does not end");
      goto bad;
    }
    if (settings && !(*settings = strndup(p + 9, (size_t)(nl - p - 9)))) {
      snprintf(why, sizeof why, "out of memory");
      goto bad;
    }
    p = nl + 1;
  }
  /* a run stopped inside an epoch (optional) */
  int position;
  if (!strncmp(p, "position ", 9) &&
      record_int(&p, "position", INT_MAX, &position, why, sizeof why))
    goto bad;
  if (*p) {
    char shown[25];
    size_t n = 0;
    for (; n < 24 && p[n] && p[n] != '\n'; n++) /* what is printable of it */
      shown[n] = isprint((unsigned char)p[n]) ? p[n] : '?';
    shown[n] = '\0';
    snprintf(why, sizeof why, "a line it does not know at byte %td: \"%s\"", p - t, shown);
    goto bad;
  }
  rc = 0;
bad:
  if (rc) {
    snprintf(err, errcap, "its run record (the application data) is not dp train's%s%s",
             *why ? ": " : "", why);
    dpt_scaler_free(sc);
    if (settings) {
      free(*settings);
      *settings = NULL;
    }
  }
  free(t);
  return rc;
}

int dpt_run_position(const char *text, size_t len) {
  /* the record's last line, as dpt_run_parse has checked it */
  static const char key[] = "\nposition ";
  const char *end = text + len, *p = NULL;
  for (const char *q = text; q && q < end; q = memchr(q + 1, '\n', (size_t)(end - q - 1)))
    if ((size_t)(end - q) > sizeof key && !memcmp(q, key, sizeof key - 1)) p = q;
  return p ? atoi(p + sizeof key - 1) : 0;
}

/* ---- token streams ---------------------------------------------------------- */

void dpt_tokens_free(dpt_tokens *t) {
  if (!t) return;
  free(t->id);
  free(t->byte);
  memset(t, 0, sizeof *t);
}

/* The whole regular file at path into *buf (malloc'd, *n bytes). */
static dp_status read_whole(const char *path, const char *what, unsigned char **buf,
                            size_t *n, char *err, size_t errcap) {
  char why[512];
  *buf = NULL;
  *n = 0;
  int fd = dpt_open_regular(path, what, why, sizeof why);
  if (fd < 0) return dpt_fail_status(DP_ERR_IO, err, errcap, "%s", why);
  size_t cap = 0;
  for (;;) {
    if (*n == cap) {
      size_t nc = cap ? cap * 2 : 65536;
      unsigned char *nb = nc > cap ? realloc(*buf, nc) : NULL;
      if (!nb) {
        close(fd);
        free(*buf);
        *buf = NULL;
        return dpt_fail_status(DP_ERR_NOMEM, err, errcap, "%s: out of memory", path);
      }
      *buf = nb;
      cap = nc;
    }
    ssize_t r = read(fd, *buf + *n, cap - *n);
    if (r == 0) break;
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      close(fd);
      free(*buf);
      *buf = NULL;
      return dpt_fail_status(DP_ERR_IO, err, errcap, "cannot read %s '%s': %s", what, path,
                             strerror(e));
    }
    *n += (size_t)r;
  }
  close(fd);
  return DP_OK;
}

dp_status dpt_text_load(const char *path, dpt_tokens *out, char *err, size_t errcap) {
  memset(out, 0, sizeof *out);
  unsigned char *b;
  size_t n;
  dp_status s = read_whole(path, "text", &b, &n, err, errcap);
  if (s) return s;
  unsigned char *fit = realloc(b, n ? n : 1); /* the read's doubling slack back */
  out->byte = fit ? fit : b;
  out->n = n;
  return DP_OK;
}

/* The .npy header of b (n bytes), through the one parser: *width 4 (int32)
 * or 2 (uint16), *count elements, *data the offset of the first. */
static dp_status npy_header(const char *path, const unsigned char *b, size_t n, int *width,
                            size_t *count, size_t *data, char *err, size_t errcap) {
  dpt_npy h;
  dp_status s = dpt_npy_parse(path, b, n, &h, err, errcap);
  if (s) return s;
  if (!strcmp(h.descr, "<i4") || !strcmp(h.descr, "=i4"))
    *width = 4;
  else if (!strcmp(h.descr, "<u2") || !strcmp(h.descr, "=u2"))
    *width = 2;
  else
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte %zu: dtype '%s' is not supported: token ids must be "
                           "int32 ('<i4') or uint16 ('<u2'), little-endian (numpy: "
                           "np.save(f, ids.astype(np.int32)))",
                           path, h.at_descr, h.descr);
  if (h.fortran)
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte %zu: fortran_order must be False (C order)", path,
                           h.at_fortran);
  if (h.ndim != 1)
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte %zu: token ids must be a 1-D array", path, h.at_shape);
  *count = (size_t)h.shape[0];
  *data = h.data;
  if (h.shape[0] > (n - *data) / (size_t)*width)
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: the header says %llu ids; the file holds fewer", path,
                           (unsigned long long)h.shape[0]);
  /* as every other .npy reader: the data exactly as long as the shape says
   * (an outside check: a shape too small trained on the head of the file) */
  if (h.shape[0] * (size_t)*width != n - *data)
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte %zu: shape (%llu,) of '%s' is %llu bytes of data; the "
                           "file has %zu after its header (trailing bytes)",
                           path, h.at_shape, (unsigned long long)h.shape[0], h.descr,
                           (unsigned long long)(h.shape[0] * (size_t)*width), n - *data);
  return DP_OK;
}

dp_status dpt_npy_load_tokens(const char *path, int vocab, dpt_tokens *out, char *err,
                              size_t errcap) {
  memset(out, 0, sizeof *out);
  unsigned char *b;
  size_t n, count = 0, at = 0;
  int w = 0;
  dp_status s = read_whole(path, "tokens", &b, &n, err, errcap);
  if (!s) s = npy_header(path, b, n, &w, &count, &at, err, errcap);
  if (!s && !(out->id = malloc((count ? count : 1) * sizeof *out->id)))
    s = dpt_fail_status(DP_ERR_NOMEM, err, errcap, "%s: out of memory", path);
  for (size_t i = 0; !s && i < count; i++) {
    const unsigned char *p = b + at + i * (size_t)w;
    int64_t v = w == 2 ? (int64_t)(p[0] | p[1] << 8)
                       : (int64_t)(int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                                            (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
    if (v < 0 || v >= vocab)
      s = dpt_fail_status(DP_ERR_RANGE, err, errcap,
                          "%s: id %lld at index %zu is outside the model's vocabulary "
                          "0..%d",
                          path, (long long)v, i, vocab - 1);
    else
      out->id[i] = (int32_t)v;
  }
  free(b);
  if (s)
    dpt_tokens_free(out);
  else
    out->n = count;
  return s;
}

dp_status dpt_token_windows(dpt_tokens *tok, size_t from, size_t to, int T,
                            dpt_dataset *out, char *err, size_t errcap) {
  memset(out, 0, sizeof *out);
  size_t rows = to > from + 1 && T > 0 ? (to - from - 1) / (size_t)T : 0;
  if (rows > INT_MAX)
    return dpt_fail_status(DP_ERR_OVERFLOW, err, errcap, "%zu windows are too many", rows);
  if (!tok->byte && !tok->id && rows)
    return dpt_fail_status(DP_ERR_INVALID, err, errcap, "dpt_token_windows: no ids");
  if (tok->id) { /* inputs and labels in place: row r at from + rT, + 1 */
    out->xmap = (const unsigned char *)(tok->id + from);
    out->xtype = DPT_X_I32;
    out->label = tok->id + from + (rows ? 1 : 0);
    out->labels_borrowed = 1;
    out->own = tok->id;
    out->own_len = tok->n * sizeof *tok->id;
    tok->id = NULL;
  } else if (tok->byte) { /* the inputs in place: row r at byte from + rT */
    out->label = malloc((rows ? rows : 1) * (size_t)T * sizeof *out->label);
    if (!out->label) return dpt_fail_status(DP_ERR_NOMEM, err, errcap, "out of memory");
    for (size_t i = 0; i < rows * (size_t)T; i++) out->label[i] = tok->byte[from + i + 1];
    out->xmap = tok->byte + from;
    out->xtype = DPT_X_U8;
    out->own = tok->byte;
    out->own_len = tok->n;
    tok->byte = NULL;
  }
  out->n_rows = (int)rows;
  out->n_features = T;
  out->label_width = T;
  return DP_OK;
}

void dpt_width_mismatch(char *err, size_t errcap, const char *path, const char *model,
                        const dpt_dataset *d, int in_w, int targets_in_rows) {
  int lead = !targets_in_rows ? 0
             : d->label       ? (d->label_width > 1 ? d->label_width : 1)
                              : d->n_targets;
  if (lead <= 0) {
    snprintf(err, errcap, "%s has %d features per row; %s takes %d", path, d->n_features,
             model, in_w);
    return;
  }
  char what[96];
  if (d->label)
    snprintf(what, sizeof what, "%s", "a label");
  else
    snprintf(what, sizeof what, "%d target%s (loss mse, one per output)", lead,
             lead == 1 ? "" : "s");
  snprintf(
      err, errcap,
      "%s has %d fields per row: %s, then %d features; %s takes %d features (rows of %d "
      "fields)",
      path, lead + d->n_features, what, d->n_features, model, in_w, lead + in_w);
}
