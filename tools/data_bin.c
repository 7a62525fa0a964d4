/* tools/data_bin.c — the binary datasets of `dp train` and `dp predict`:
 * NumPy .npy files and MNIST's IDX files (gzip'd or not), mapped in place;
 * and dpt_data_load, which tells the format from the first bytes and reads a
 * CSV otherwise. See data.h. */
#include "cli.h"
#include "data.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef DPT_HAVE_ZLIB
#include <zlib.h>
#endif

/* A gzip'd file decompresses to at most this much (beyond: gunzip it, and the
 * plain file is mapped instead of read into memory). */
#define GZ_MAX ((size_t)2 << 30)

/* ---- a file's bytes: mapped, or (gzip) decompressed into memory ------------------ */

typedef struct {
  unsigned char *p;
  size_t n;
  int mapped;
} blob;

static void blob_free(blob *b) {
  if (b->p && b->mapped)
    munmap(b->p, b->n);
  else
    free(b->p);
  memset(b, 0, sizeof *b);
}

#ifdef DPT_HAVE_ZLIB
/* deflate's most: 1032 bytes out for a byte in (a run of one byte) */
#define DEFLATE_RATIO 1032

/* The bytes of a decompressed IDX file of unsigned bytes (the type idx_parse
 * takes), by its header at out[0..len): 0 while the header is not all there
 * yet, SIZE_MAX for bytes that are no such header (nothing to bound them by:
 * idx_parse refuses them), SIZE_MAX - 1 past 2^64. */
static size_t idx_total(const unsigned char *out, size_t len) {
  if (len < 4) return 0;
  if (out[0] || out[1] || out[2] != 0x08 || out[3] < 1 || out[3] > 8) return SIZE_MAX;
  size_t nd = out[3], hn = 4 + 4 * nd, total = 1;
  if (len < hn) return 0;
  for (size_t k = 0; k < nd; k++) {
    const unsigned char *q = out + 4 + 4 * k;
    size_t dim = (size_t)q[0] << 24 | (size_t)q[1] << 16 | (size_t)q[2] << 8 | q[3];
    if (__builtin_mul_overflow(total, dim, &total)) return SIZE_MAX - 1;
  }
  return total > SIZE_MAX - 2 - hn ? SIZE_MAX - 1 : total + hn;
}

/* Once the header of a gzip'd IDX file is out: the file's bytes it gives
 * (*bound; SIZE_MAX: no IDX header), refused when more than n bytes of gzip
 * stream can hold (a header that is wrong, or a file cut short) or than
 * GZ_MAX; so a stream that decompresses to more than its header says stops
 * there (a few KiB of gzip inflating to GiB). */
static dp_status idx_bound(const char *path, const unsigned char *out, size_t len, size_t n,
                           size_t *bound, char *err, size_t errcap) {
  size_t t = idx_total(out, len);
  *bound = t;
  if (t == 0 || t == SIZE_MAX) return DP_OK;
  if (t / DEFLATE_RATIO > n) {
    char gives[48] = "more than 2^64 bytes";
    if (t != SIZE_MAX - 1) snprintf(gives, sizeof gives, "%zu bytes", t);
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: its IDX header gives %s, more than a gzip stream of %zu "
                           "bytes can hold (deflate: at most %d to 1): the file is cut "
                           "short or its header (bytes 4 on) is wrong; get it again",
                           path, gives, n, DEFLATE_RATIO);
  }
  if (t > GZ_MAX)
    return dpt_fail_status(DP_ERR_RANGE, err, errcap,
                           "%s: its IDX header gives more than %zu MiB of data: gunzip it "
                           "first (gunzip -k %s), and the plain file is mapped instead of "
                           "read into memory",
                           path, GZ_MAX >> 20, path);
  return DP_OK;
}

/* The gzip stream in[0..n) (one member or several) into *b; a gzip'd IDX file
 * no further than its header's size (idx_bound); with idx_only, anything else
 * no further than its first bytes (idx_parse refuses it). */
static dp_status gunzip(const char *path, const unsigned char *in, size_t n, bool idx_only,
                        blob *b, char *err, size_t errcap) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK)
    return dpt_fail_status(DP_ERR_NOMEM, err, errcap, "%s: out of memory for zlib", path);
  size_t cap = n * 4 + 4096, len = 0, bound = 0; /* bound: 0 not known yet */
  unsigned char *out = malloc(cap);
  dp_status s =
      out ? DP_OK : dpt_fail_status(DP_ERR_NOMEM, err, errcap, "%s: out of memory", path);
  z.next_in = (unsigned char *)in;
  while (!s) {
    if (len == cap) {
      size_t most = bound && bound != SIZE_MAX ? bound + 1 : GZ_MAX;
      size_t nc = cap * 2 > most ? most : cap * 2;
      unsigned char *nb = nc > cap ? realloc(out, nc) : NULL;
      if (!nb && nc > cap)
        s = dpt_fail_status(DP_ERR_NOMEM, err, errcap, "%s: out of memory", path);
      else if (!nb)
        s = dpt_fail_status(
            DP_ERR_RANGE, err, errcap,
            "%s decompresses to more than %zu MiB: gunzip it first (gunzip "
            "-k %s), and the plain file is mapped instead of read into memory",
            path, GZ_MAX >> 20, path);
      if (s) break;
      out = nb;
      cap = nc;
    }
    size_t left = n - (size_t)(z.next_in - in), room = cap - len;
    z.avail_in = left > UINT_MAX ? UINT_MAX : (unsigned)left;
    z.next_out = out + len;
    z.avail_out = room > UINT_MAX ? UINT_MAX : (unsigned)room;
    int rc = inflate(&z, Z_NO_FLUSH);
    len = (size_t)(z.next_out - out);
    left = n - (size_t)(z.next_in - in);
    if (!bound && (s = idx_bound(path, out, len, n, &bound, err, errcap)) != DP_OK) break;
    if (bound == SIZE_MAX && idx_only) break;
    if (bound && bound != SIZE_MAX && len > bound) {
      s = dpt_fail_status(DP_ERR_PARSE, err, errcap,
                          "%s: decompresses to more than the %zu bytes its IDX header "
                          "gives: trailing bytes, or a header (bytes 4 on) that is wrong; "
                          "get the file again",
                          path, bound);
      break;
    }
    if (rc == Z_STREAM_END) {
      if (left == 0) break;
      if (left < 2 || z.next_in[0] != 0x1f || z.next_in[1] != 0x8b) {
        s = dpt_fail_status(DP_ERR_PARSE, err, errcap,
                            "%s: byte %zu: trailing bytes after the gzip stream", path,
                            n - left);
        break;
      }
      inflateReset(&z); /* another member */
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      s = dpt_fail_status(DP_ERR_PARSE, err, errcap,
                          "%s: byte %zu: not a valid gzip stream (%s)", path, n - left,
                          z.msg ? z.msg : "zlib error");
    } else if (rc == Z_BUF_ERROR && left == 0 && z.avail_out > 0) {
      s = dpt_fail_status(DP_ERR_PARSE, err, errcap,
                          "%s: byte %zu: the gzip stream is cut short (truncated file)",
                          path, n);
    }
  }
  inflateEnd(&z);
  if (s) {
    free(out);
    return s;
  }
  b->p = out;
  b->n = len;
  b->mapped = 0;
  return DP_OK;
}
#endif

/* The regular file at path mapped read-only into *b (an empty file: p NULL);
 * a gzip'd one (1f 8b) decompressed when gz is allowed (1; 2: where it can
 * only be IDX, so that anything else stops at its first bytes), else
 * refused. */
static dp_status blob_open(const char *path, const char *what, int gz, blob *b, char *err,
                           size_t errcap) {
  memset(b, 0, sizeof *b);
  char why[512];
  int fd = dpt_open_regular(path, what, why, sizeof why);
  if (fd < 0) return dpt_fail_status(DP_ERR_IO, err, errcap, "%s", why);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return dpt_fail_status(DP_ERR_IO, err, errcap, "cannot read %s '%s': %s", what, path,
                           strerror(e));
  }
  size_t n = (size_t)st.st_size;
  void *p = n ? mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  int e = errno;
  close(fd);
  if (p == MAP_FAILED)
    return dpt_fail_status(DP_ERR_IO, err, errcap, "cannot map %s '%s': %s", what, path,
                           strerror(e));
  b->p = p;
  b->n = n;
  b->mapped = 1;
  if (n < 2 || b->p[0] != 0x1f || b->p[1] != 0x8b) return DP_OK;
  if (!gz) {
    blob_free(b);
    return dpt_fail_status(
        DP_ERR_PARSE, err, errcap,
        "%s: a gzip'd file; only IDX files may be gzip'd: gunzip it first", path);
  }
#ifdef DPT_HAVE_ZLIB
  blob z;
  dp_status s = gunzip(path, b->p, b->n, gz == 2, &z, err, errcap);
  blob_free(b);
  if (!s) *b = z;
  return s;
#else
  blob_free(b);
  return dpt_fail_status(
      DP_ERR_UNSUPPORTED, err, errcap,
      "%s is gzip'd, and this dp was built without zlib: gunzip it first "
      "(gunzip -k %s), or install zlib (Debian: zlib1g-dev) and rebuild",
      path, path);
#endif
}

/* ---- .npy -------------------------------------------------------------------------- */

/* The header dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }"
 * then blanks: each of its three keys once, at the top level, in any order
 * (a key inside a string value is not a key). The values: pointers just past
 * "'key':" and its blanks. 0, or -1. */
static int npy_dict(const char *h, const char **d, const char **f, const char **sh) {
  static const char *const keys[3] = {"descr", "fortran_order", "shape"};
  const char **slot[3] = {d, f, sh};
  *d = *f = *sh = NULL;
  const char *p = h + strspn(h, " ");
  if (*p++ != '{') return -1;
  for (;;) {
    p += strspn(p, " ");
    if (*p == '}') break;
    if (*p != '\'') return -1;
    const char *k = p + 1, *ke = strchr(k, '\'');
    if (!ke) return -1;
    int which = -1;
    for (int i = 0; i < 3; i++)
      if ((size_t)(ke - k) == strlen(keys[i]) && !strncmp(k, keys[i], strlen(keys[i])))
        which = i;
    p = ke + 1 + strspn(ke + 1, " ");
    if (which < 0 || *slot[which] || *p++ != ':') return -1; /* unknown, twice, no ':' */
    p += strspn(p, " ");
    *slot[which] = p;
    if (*p == '[') { /* a structured dtype's list: skipped whole, its check says why */
      int depth = 0;
      do {
        depth += *p == '[' ? 1 : *p == ']' ? -1 : 0;
        p++;
      } while (*p && depth > 0);
      if (depth) return -1;
    } else {
      const char *e = *p == '\'' ? strchr(p + 1, '\'') : *p == '(' ? strchr(p, ')') : NULL;
      if (e)
        p = e + 1;
      else if (*p == '\'' || *p == '(')
        return -1; /* unterminated */
      else
        p += strcspn(p, ",}");
    }
    p += strspn(p, " ");
    if (*p == ',')
      p++;
    else if (*p != '}')
      return -1;
  }
  p++;
  return p[strspn(p, " \n")] == '\0' && *d && *f && *sh ? 0 : -1;
}

/* The length of the shape's text to show: its tuple, at most 48 bytes. */
static int shape_len(const char *sh) {
  size_t n = strcspn(sh, ")") + (strchr(sh, ')') ? 1 : 0);
  return n > 48 ? 48 : (int)n;
}

/* The shape tuple at sh: "(a, b, ...)", "(a,)" or "()". 0, or -1. */
static int npy_shape(const char *sh, dpt_npy *h) {
  if (*sh != '(') return -1;
  const char *p = sh + 1;
  h->ndim = 0;
  for (;;) {
    while (*p == ' ') p++;
    if (*p == ')') return 0;
    if (*p < '0' || *p > '9' || h->ndim == 8) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno || v > ((uint64_t)1 << 48)) return -1;
    h->shape[h->ndim++] = v;
    p = end;
    while (*p == ' ') p++;
    if (*p == ',')
      p++;
    else if (*p != ')')
      return -1;
  }
}

dp_status dpt_npy_parse(const char *path, const unsigned char *b, size_t n, dpt_npy *h,
                        char *err, size_t errcap) {
  memset(h, 0, sizeof *h);
  if (n < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte 0: not a .npy file (no \\x93NUMPY magic)", path);
  size_t hl = b[6] == 1 ? (size_t)b[8] | (size_t)b[9] << 8
              : n >= 12 ? (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 |
                              (size_t)b[11] << 24
                        : 0;
  size_t h0 = b[6] == 1 ? 10 : 12;
  if (b[6] != 1 && b[6] != 2 && b[6] != 3)
    return dpt_fail_status(
        DP_ERR_PARSE, err, errcap,
        "%s: byte 6: .npy format version %d.%d is not supported (1 to 3)", path, b[6],
        b[7]);
  if (hl > 65535) /* an outside check: this cap, not a cut file, refused it */
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte 8: a header of %zu bytes; dp reads .npy headers of up "
                           "to 65535 (numpy writes a few hundred: save it again with "
                           "numpy.save)",
                           path, hl);
  if (h0 + hl > n)
    return dpt_fail_status(
        DP_ERR_PARSE, err, errcap,
        "%s: byte 8: a header of %zu bytes; the file has %zu (truncated?)", path, hl, n);
  char hd[65536];
  memcpy(hd, b + h0, hl);
  hd[hl] = '\0';
  const char *d, *f, *sh;
  if (npy_dict(hd, &d, &f, &sh))
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte %zu: the .npy header is not a dict of 'descr', "
                           "'fortran_order' and 'shape', each once",
                           path, h0);
  h->at_descr = h0 + (size_t)(d - hd);
  h->at_fortran = h0 + (size_t)(f - hd);
  h->at_shape = h0 + (size_t)(sh - hd);
  size_t dl = *d == '\'' ? strcspn(d + 1, "'") : 0;
  if (dl < 3 || dl > 8 || d[1 + dl] != '\'' || !strchr("<>|=", d[1]) ||
      strspn(d + 3, "0123456789") != dl - 2) /* '<f4', not '<f4xyz' */
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte %zu: descr %.12s is not a simple dtype", path,
                           h->at_descr, d);
  snprintf(h->descr, sizeof h->descr, "%.*s", (int)dl, d + 1);
  h->big_endian = d[1] == '>';
  h->kind = d[2];
  h->size = atoi(d + 3);
  size_t fl = strcspn(f, " ,}"); /* the whole word: not 'Falsexyz' */
  if (!(fl == 5 && !strncmp(f, "False", 5)) && !(fl == 4 && !strncmp(f, "True", 4)))
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte %zu: fortran_order %.8s is not True or False", path,
                           h->at_fortran, f);
  h->fortran = *f == 'T';
  if (npy_shape(sh, h))
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte %zu: shape %.*s is not a tuple of at most 8 "
                           "dimensions, each 0 to 2^48",
                           path, h->at_shape, shape_len(sh), sh);
  h->data = h0 + hl;
  h->numel = 1;
  for (int k = 0; k < h->ndim; k++)
    if (__builtin_mul_overflow(h->numel, h->shape[k], &h->numel))
      return dpt_fail_status(DP_ERR_OVERFLOW, err, errcap, "%s: byte %zu: shape too large",
                             path, h->at_shape);
  return DP_OK;
}

/* The shape as "(3, 28, 28)". */
static char *shape_text(const dpt_npy *h, char *buf, size_t cap) {
  size_t at = (size_t)snprintf(buf, cap, "(");
  for (int k = 0; k < h->ndim && at < cap; k++)
    at += (size_t)snprintf(buf + at, cap - at, "%s%llu", k ? ", " : "",
                           (unsigned long long)h->shape[k]);
  if (at < cap) snprintf(buf + at, cap - at, "%s)", h->ndim == 1 ? "," : "");
  return buf;
}

/* The checks every .npy reader makes: little-endian, C order, a dtype among
 * `ok` (space-separated descrs), the data exactly as long as the shape says. */
static dp_status npy_require(const char *path, const blob *b, const dpt_npy *h,
                             const char *ok, const char *what, char *err, size_t errcap) {
  if (h->big_endian)
    return dpt_fail_status(
        DP_ERR_PARSE, err, errcap,
        "%s: byte %zu: dtype '%s' is big-endian; libdp reads little-endian "
        "(numpy: a.astype(a.dtype.newbyteorder('<')))",
        path, h->at_descr, h->descr);
  char canon[16]; /* '<f4' ('=': native, little-endian where we run; bytes: '|u1') */
  snprintf(canon, sizeof canon, "'%c%c%d'", h->size == 1 ? '|' : '<', h->kind, h->size);
  if (!strstr(ok, canon))
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte %zu: dtype '%s' is not supported: %s must be %s", path,
                           h->at_descr, h->descr, what, ok);
  if (h->fortran)
    return dpt_fail_status(
        DP_ERR_PARSE, err, errcap,
        "%s: byte %zu: the array is in Fortran order; libdp reads C order "
        "(numpy: np.save(f, np.ascontiguousarray(a)))",
        path, h->at_fortran);
  char sh[96];
  size_t need = 0;
  if (__builtin_mul_overflow((size_t)h->numel, (size_t)h->size, &need) ||
      need != b->n - h->data)
    return dpt_fail_status(
        DP_ERR_PARSE, err, errcap,
        "%s: byte %zu: shape %s of '%s' is %zu bytes of data; the file has "
        "%zu after its header (%s)",
        path, h->data, shape_text(h, sh, sizeof sh), h->descr, need, b->n - h->data,
        need > b->n - h->data ? "truncated" : "trailing bytes");
  return DP_OK;
}

/* ---- IDX (MNIST) -------------------------------------------------------------------- */

/* An IDX header: 0, 0, type 0x08 (unsigned bytes), ndim; ndim big-endian
 * u32 dimensions; then the bytes. As a .npy header, for the same checks. */
static dp_status idx_parse(const char *path, const blob *b, dpt_npy *h, char *err,
                           size_t errcap) {
  memset(h, 0, sizeof *h);
  size_t pl = strlen(path);
  if (b->n < 4 || b->p[0] != 0 || b->p[1] != 0)
    return dpt_fail_status(DP_ERR_PARSE, err, errcap, "%s: byte 0: not an IDX file%s", path,
                           pl > 3 && !strcmp(path + pl - 3, ".gz")
                               ? " (once gunzipped: only IDX data is read gzip'd; gunzip a "
                                 "CSV or .npy file first)"
                               : "");
  if (b->p[2] != 0x08)
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte 2: IDX type 0x%02x is not supported: libdp reads "
                           "unsigned bytes (0x08), as MNIST's files are",
                           path, b->p[2]);
  int nd = b->p[3];
  if (nd < 1 || nd > 8)
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte 3: %d dimensions (IDX files have 1 to 8)", path, nd);
  if (b->n < 4 + 4 * (size_t)nd)
    return dpt_fail_status(DP_ERR_PARSE, err, errcap,
                           "%s: byte %zu: the header of %d dimensions is cut short", path,
                           b->n, nd);
  h->ndim = nd;
  h->numel = 1;
  for (int k = 0; k < nd; k++) {
    const unsigned char *q = b->p + 4 + 4 * k;
    h->shape[k] = (uint64_t)q[0] << 24 | (uint64_t)q[1] << 16 | (uint64_t)q[2] << 8 | q[3];
    if (__builtin_mul_overflow(h->numel, h->shape[k], &h->numel))
      return dpt_fail_status(DP_ERR_OVERFLOW, err, errcap, "%s: byte 4: shape too large",
                             path);
  }
  h->kind = 'u';
  h->size = 1;
  h->data = 4 + 4 * (size_t)nd;
  snprintf(h->descr, sizeof h->descr, "|u1");
  return npy_require(path, b, h, "'|u1'", "IDX data", err, errcap);
}

/* ---- features ----------------------------------------------------------------------- */

/* Every value finite and within float's range; the first that is not named
 * by its byte, row and value. */
static dp_status check_values(const char *path, const dpt_dataset *d, size_t data0,
                              char *err, size_t errcap) {
  if (d->xtype == DPT_X_U8) return DP_OK;
  size_t n = (size_t)d->n_rows * (size_t)d->n_features, w = d->xtype == DPT_X_F64 ? 8 : 4;
  for (size_t i = 0; i < n; i++) {
    double v;
    if (w == 8) {
      memcpy(&v, d->xmap + 8 * i, 8);
    } else {
      float f;
      memcpy(&f, d->xmap + 4 * i, 4);
      v = f;
    }
    if (isfinite(v) && fabs(v) <= FLT_MAX) continue;
    size_t nf = (size_t)d->n_features;
    return dpt_fail_status(isnan(v) || isinf(v) ? DP_ERR_NONFINITE : DP_ERR_RANGE, err,
                           errcap, "%s: byte %zu (row %zu, value %zu): %s", path,
                           data0 + w * i, i / nf, i % nf,
                           isnan(v)   ? "NaN; every value must be a finite number"
                           : isinf(v) ? "infinite; every value must be a finite number"
                                      : "beyond float32's range");
  }
  return DP_OK;
}

/* The features of a binary file (npy 1, IDX 0) into d, in place; `width`
 * values a row (0: any). */
static dp_status load_features(const char *path, int npy, int width, dpt_dataset *d,
                               char *err, size_t errcap) {
  blob b;
  dpt_npy h;
  dp_status s = blob_open(path, "data", npy ? 0 : 2, &b, err, errcap);
  if (s) return s;
  s = npy ? dpt_npy_parse(path, b.p, b.n, &h, err, errcap)
          : idx_parse(path, &b, &h, err, errcap);
  if (!s && npy)
    s = npy_require(path, &b, &h, "'<f4', '<f8' or '|u1'", "features", err, errcap);
  char sh[96];
  if (!s && (h.ndim < 1 || h.shape[0] == 0 || h.shape[0] > INT_MAX || h.numel == 0 ||
             h.numel / h.shape[0] > (1u << 30)))
    s = dpt_fail_status(
        DP_ERR_PARSE, err, errcap,
        "%s: byte %zu: shape %s: the data must be rows (N, ...) with N from 1 "
        "to %d, of 1 to 2^30 values each",
        path, npy ? h.at_shape : 4, shape_text(&h, sh, sizeof sh), INT_MAX);
  if (!s && width > 0 && h.numel / h.shape[0] != (uint64_t)width)
    s = dpt_fail_status(DP_ERR_SHAPE, err, errcap,
                        "%s: byte %zu: shape %s: %llu values per row; the model takes %d",
                        path, npy ? h.at_shape : 4, shape_text(&h, sh, sizeof sh),
                        (unsigned long long)(h.numel / h.shape[0]), width);
  if (s) {
    blob_free(&b);
    return s;
  }
  d->n_rows = (int)h.shape[0];
  d->n_features = (int)(h.numel / h.shape[0]);
  d->xtype = h.kind == 'u' ? DPT_X_U8 : h.size == 8 ? DPT_X_F64 : DPT_X_F32;
  d->xmap = b.p + h.data;
  d->own = b.p;
  d->own_len = b.n;
  d->own_mapped = b.mapped;
  return check_values(path, d, h.data, err, errcap);
}

/* ---- labels ------------------------------------------------------------------------- */

/* Label or target k of a labels file, as a double (an integer dtype exactly). */
static double value_at(const unsigned char *p, const dpt_npy *h) {
  if (h->kind == 'f') {
    if (h->size == 8) {
      double v;
      memcpy(&v, p, 8);
      return v;
    }
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  if (h->size == 1) return h->kind == 'i' ? (double)(int8_t)p[0] : (double)p[0];
  if (h->size == 4) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
  }
  int64_t v;
  memcpy(&v, p, 8);
  return (double)v; /* a label beyond 2^53 is out of range either way */
}

/* The labels (classes) or targets of d's rows from their file. */
static dp_status load_labels(const dpt_data_spec *sp, dpt_dataset *d, char *err,
                             size_t errcap) {
  const char *path = sp->labels;
  bool targets = sp->rows == DPT_ROWS_TARGETS;
  int nt = targets ? sp->n_targets : 1;
  blob b;
  dpt_npy h;
  dp_status s = blob_open(path, "labels", 1, &b, err, errcap);
  if (s) return s;
  bool npy = b.n >= 6 && memcmp(b.p, "\x93NUMPY", 6) == 0;
  s = npy ? dpt_npy_parse(path, b.p, b.n, &h, err, errcap)
          : idx_parse(path, &b, &h, err, errcap);
  if (!s && npy)
    s = npy_require(path, &b, &h, targets ? "'<f4' or '<f8'" : "'<i4', '<i8' or '|u1'",
                    targets ? "regression targets" : "class labels", err, errcap);
  char sh[96];
  if (!s && (h.ndim < 1 || h.ndim > 2 || (h.ndim == 2 && h.shape[1] != (uint64_t)nt) ||
             (h.ndim == 1 && nt != 1)))
    s = dpt_fail_status(DP_ERR_PARSE, err, errcap,
                        "%s: byte %zu: shape %s: %s must be (N,)%s or (N, %d)", path,
                        h.at_shape, shape_text(&h, sh, sizeof sh),
                        targets ? "targets" : "labels", nt == 1 ? "" : " for one", nt);
  if (!s && h.shape[0] != (uint64_t)d->n_rows)
    s = dpt_fail_status(DP_ERR_PARSE, err, errcap, "%s: byte %zu: %llu %s; %s has %d rows",
                        path, h.at_shape, (unsigned long long)h.shape[0],
                        targets ? "rows of targets" : "labels", sp->data, d->n_rows);
  size_t n = (size_t)d->n_rows * (size_t)nt;
  if (!s && !(targets ? (void *)(d->y = malloc(n * 4 + 4))
                      : (void *)(d->label = malloc(n * 4 + 4))))
    s = dpt_fail_status(DP_ERR_NOMEM, err, errcap, "%s: out of memory", path);
  int top = sp->n_outputs > 0 ? sp->n_outputs - 1 : DPT_MAX_LABEL;
  for (size_t i = 0; !s && i < n; i++) {
    double v = value_at(b.p + h.data + i * (size_t)h.size, &h);
    if (targets && (!isfinite(v) || fabs(v) > FLT_MAX))
      s = dpt_fail_status(isfinite(v) ? DP_ERR_RANGE : DP_ERR_NONFINITE, err, errcap,
                          "%s: byte %zu (row %zu): target %g is not a finite float32", path,
                          h.data + i * (size_t)h.size, i / (size_t)nt, v);
    else if (!targets && (v < 0 || v > top))
      s = dpt_fail_status(DP_ERR_RANGE, err, errcap,
                          "%s: byte %zu (row %zu): label %.0f is out of range (0 to %d%s)",
                          path, h.data + i * (size_t)h.size, i, v, top,
                          sp->n_outputs > 0 ? ": the model's outputs" : "");
    else if (targets)
      d->y[i] = (float)v;
    else
      d->label[i] = (int32_t)v;
    if (!s && !targets && d->label[i] >= d->n_classes) d->n_classes = d->label[i] + 1;
  }
  if (!s && targets) d->n_targets = nt;
  if (!s && !targets) d->label_width = 1;
  blob_free(&b);
  return s;
}

/* ---- every format ---------------------------------------------------------------------
 */

/* The format of the file at path from its first bytes: 'n' .npy, 'i' IDX, 'g'
 * gzip, 'c' CSV (anything else; also a file that cannot be read, whose
 * reader then says why). */
static char format_of(const char *path) {
  char why[256];
  unsigned char m[6] = {0};
  int fd = dpt_open_regular(path, "data", why, sizeof why);
  if (fd < 0) return 'c';
  ssize_t got = read(fd, m, sizeof m);
  close(fd);
  if (got >= 6 && memcmp(m, "\x93NUMPY", 6) == 0) return 'n';
  if (got >= 2 && m[0] == 0x1f && m[1] == 0x8b) return 'g';
  if (got >= 4 && m[0] == 0 && m[1] == 0 && m[2] >= 0x08 && m[2] <= 0x0e) return 'i';
  /* no magic: the name says what the file was meant to be, and its reader
   * says what is wrong with it ("byte 0: not a .npy file") */
  size_t n = strlen(path);
  if (n >= 4 && !strcmp(path + n - 4, ".npy")) return 'n';
  if (n >= 3 && !strcmp(path + n - 3, ".gz")) return 'g';
  if (strstr(path, "-ubyte")) return 'i';
  return 'c';
}

dp_status dpt_data_load(const dpt_data_spec *sp, dpt_dataset *out, char *err,
                        size_t errcap) {
  memset(out, 0, sizeof *out);
  char f = format_of(sp->data);
  const char *lopt = sp->labels_opt ? sp->labels_opt : "--labels";
  if (f == 'c') {
    if (sp->labels)
      return dpt_fail_status(
          DP_ERR_INVALID, err, errcap,
          "%s is a CSV file, which holds its labels in its first field%s: "
          "%s %s is for .npy and IDX data",
          sp->data, sp->rows == DPT_ROWS_TARGETS ? "s" : "", lopt, sp->labels);
    return dpt_csv_load_as(sp->data, sp->rows, sp->n_targets, sp->header, out, err, errcap);
  }
  if (sp->header)
    return dpt_fail_status(DP_ERR_INVALID, err, errcap,
                           "--header is for CSV files; %s is a %s file", sp->data,
                           f == 'n' ? ".npy" : "binary IDX");
  bool want = sp->rows != DPT_ROWS_FEATURES;
  /* the features first: what is wrong with the file is said before what is
   * missing beside it */
  dp_status s = load_features(sp->data, f == 'n', sp->n_features, out, err, errcap);
  if (!s && want && !sp->labels && !sp->labels_optional)
    s = dpt_fail_status(DP_ERR_INVALID, err, errcap,
                        "%s holds the features only: give the %s with %s FILE (.npy or "
                        "IDX)",
                        sp->data, sp->rows == DPT_ROWS_TARGETS ? "targets" : "labels",
                        lopt);
  if (!s && want && sp->labels) s = load_labels(sp, out, err, errcap);
  if (s) dpt_dataset_free(out);
  return s;
}
