/* Weights to and from PyTorch: the parameters as a safetensors file
 * (safetensors.torch.save_file / load_file), named and shaped as the
 * state_dict of the model's nn.Sequential (dp_model_tensor). The format: an
 * 8-byte little-endian header length, a JSON object mapping each tensor name
 * to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data
 * that follows the header) plus an optional "__metadata__" object of strings,
 * padded with spaces to a multiple of 8; then the data. */
#include "ctx.h"

#include <errno.h>
#include <math.h>
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
  bool i64;
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

typedef struct {
  const dp_model *m;
  const unsigned char *state; /* the state bytes (st_entries), little-endian */
} export_job;

/* JSON string body of s (names and the spec text: quotes, backslashes and
 * control characters escaped). */
static void json_str(FILE *f, const char *s, size_t n) {
  fputc('"', f);
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch == '\n')
      fputs("\\n", f);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
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
  fputs("{\"__metadata__\":{\"format\":\"pt\",\"libdp_model\":", h);
  json_str(h, text, tlen);
  fputs("}", h);
  free(text);
  st_entry e[ST_MAX_ENTRIES];
  size_t state_bytes;
  int n = st_entries(m, e, &state_bytes);
  for (int i = 0; i < n; i++) {
    fputc(',', h);
    json_str(h, e[i].name, strlen(e[i].name));
    fprintf(h, ":{\"dtype\":\"%s\",\"shape\":[", e[i].i64 ? "I64" : "F32");
    for (int d = 0; d < e[i].ndim; d++) fprintf(h, "%s%d", d ? "," : "", e[i].dims[d]);
    fprintf(h, "],\"data_offsets\":[%zu,%zu]}", e[i].off, e[i].off + st_bytes(&e[i]));
  }
  fputc('}', h);
  while (ftell(h) % 8) fputc(' ', h); /* the data starts 8-aligned */
  if (fclose(h) != 0) {
    free(hdr);
    return DP_FAIL(DP_ERR_NOMEM, "safetensors: out of memory");
  }
  unsigned char len8[8];
  for (int b = 0; b < 8; b++) len8[b] = (unsigned char)((uint64_t)hlen >> (8 * b));
  bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
  free(hdr);
  /* the data: the state bytes, the tensors in order, little-endian */
  ok = ok && fwrite(j->state, 1, state_bytes, f) == state_bytes;
  return ok ? DP_OK : DP_ERR_IO;
}

dp_status dp_ckpt_export_safetensors(dp_ctx *c, const char *path) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (!path || !*path)
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_INVALID, "dp_ckpt_export_safetensors: path is %s",
                                   path ? "empty" : "NULL"));
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
    export_job j = {m, state};
    s = dp__write_atomic(path, "safetensors file", export_fill, &j);
  }
  free(w);
  free(state);
  return dp__ctx_fail(c, dp__ctx_root_status(c, s));
}

/* ---- import: a small JSON reader for the header -------------------------------- */

typedef struct {
  const char *p, *end;
  const char *path;
  dp_status err;
} json;

static dp_status jfail(json *j, const char *what) {
  if (!j->err)
    j->err = DP_FAIL(DP_ERR_PARSE, "safetensors file '%s': header: %s", j->path, what);
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

/* A string into buf (cap bytes, NUL-terminated); \uXXXX escapes of ASCII only. */
static bool jstring(json *j, char *buf, size_t cap) {
  if (!eat(j, '"')) return jfail(j, "a string was expected"), false;
  size_t n = 0;
  while (j->p < j->end && *j->p != '"') {
    char ch = *j->p++;
    if ((unsigned char)ch < 0x20) return jfail(j, "a control character in a string"), false;
    if (ch == '\\') {
      if (j->p >= j->end) break;
      char e = *j->p++;
      static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
      const char *k = strchr(from, e);
      if (e && k) {
        ch = to[k - from];
      } else if (e == 'u' && j->end - j->p >= 4) {
        unsigned v = 0;
        for (int i = 0; i < 4; i++) {
          char hx = *j->p++;
          int d = hx >= '0' && hx <= '9'   ? hx - '0'
                  : hx >= 'a' && hx <= 'f' ? hx - 'a' + 10
                  : hx >= 'A' && hx <= 'F' ? hx - 'A' + 10
                                           : -1;
          if (d < 0) return jfail(j, "a bad hex digit in a \\u escape"), false;
          v = v * 16 + (unsigned)d;
        }
        /* a NUL would end a name early: "0.weight" and a NUL and "x" read as "0.weight" */
        if (v == 0 || v > 0x7f) return jfail(j, "a \\u escape outside ASCII or NUL"), false;
        ch = (char)v;
      } else {
        return jfail(j, "a bad escape in a string"), false;
      }
    }
    if (buf && n + 1 < cap) buf[n] = ch;
    n++;
  }
  if (!eat(j, '"')) return jfail(j, "a string runs past the header's end"), false;
  if (buf) {
    if (n + 1 > cap) return jfail(j, "a name is too long"), false;
    buf[n] = '\0';
  }
  return true;
}

/* A non-negative integer below 2^53 (JSON numbers are doubles). */
static bool jint(json *j, uint64_t *out) {
  ws(j);
  uint64_t v = 0;
  const char *s = j->p;
  while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
    v = v * 10 + (uint64_t)(*j->p++ - '0');
    if (v >> 53) return jfail(j, "an integer is too large"), false;
  }
  if (j->p == s) return jfail(j, "a non-negative integer was expected"), false;
  *out = v;
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
  /* a number, true, false, null */
  const char *s = j->p;
  while (j->p < j->end && *j->p && strchr("+-.0123456789eEtruefalsn", *j->p)) j->p++;
  if (j->p == s) return jfail(j, "a value was expected"), false;
  return true;
}

typedef struct {
  char dtype[16];
  int ndim;
  uint64_t shape[8];
  uint64_t begin, end;
  bool seen;
} st_tensor;

/* {"dtype": ..., "shape": [...], "data_offsets": [b, e]} */
static bool jtensor(json *j, st_tensor *t) {
  bool have_dtype = false, have_shape = false, have_off = false;
  if (!eat(j, '{')) return jfail(j, "a tensor's entry must be an object"), false;
  if (eat(j, '}')) return jfail(j, "a tensor's entry is empty"), false;
  do {
    char key[32];
    if (!jstring(j, key, sizeof key) || !eat(j, ':'))
      return jfail(j, "a member name was expected"), false;
    if (!strcmp(key, "dtype")) {
      if (!jstring(j, t->dtype, sizeof t->dtype)) return false;
      have_dtype = true;
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
      have_shape = true;
    } else if (!strcmp(key, "data_offsets")) {
      if (!eat(j, '[') || !jint(j, &t->begin) || !eat(j, ',') || !jint(j, &t->end) ||
          !eat(j, ']'))
        return jfail(j, "data_offsets must be [begin, end]"), false;
      have_off = true;
    } else if (!jskip(j, 1)) {
      return false;
    }
  } while (eat(j, ','));
  if (!eat(j, '}')) return jfail(j, "a tensor's '}' is missing"), false;
  if (!have_dtype || !have_shape || !have_off)
    return jfail(j, "a tensor lacks dtype, shape or data_offsets"), false;
  return true;
}

/* Reads the whole file (at most `cap` bytes). */
static dp_status read_all(const char *path, size_t cap, unsigned char **buf, size_t *len) {
  struct stat st;
  const char *failed;
  *buf = NULL;
  int fd = dp__open_regular(path, &st, &failed);
  if (fd == -2)
    return DP_FAIL(DP_ERR_IO, "safetensors file '%s' is not a regular file (%s)", path,
                   dp__file_kind(st.st_mode));
  if (fd < 0) return dp__io_fail("safetensors file", path, failed, path, errno);
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

/* Checks the file against the model and decodes it into the state bytes
 * (st_entries: the parameters, then batchnorm's buffers). */
static dp_status decode(const dp_model *m, const char *path, const unsigned char *b,
                        size_t len, unsigned char *state) {
  if (len < 8)
    return DP_FAIL(DP_ERR_PARSE, "safetensors file '%s' is %zu bytes: too short", path,
                   len);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
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
  json j = {(const char *)b + 8, (const char *)b + 8 + hlen, path, DP_OK};
  if (!eat(&j, '{')) return jfail(&j, "it must be a JSON object");
  bool empty = eat(&j, '}');
  if (!empty) do {
      char name[64];
      if (!jstring(&j, name, sizeof name) || !eat(&j, ':')) return jfail(&j, "a name");
      if (!strcmp(name, "__metadata__")) {
        if (!jskip(&j, 1)) return j.err;
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
                       path, name, list);
      }
      if (st[k].seen)
        return DP_FAIL(DP_ERR_PARSE, "safetensors file '%s' names tensor '%s' twice", path,
                       name);
      if (!jtensor(&j, &st[k])) return j.err;
      st[k].seen = true;
    } while (eat(&j, ','));
  if (j.err) return j.err;
  if (!empty && !eat(&j, '}')) return jfail(&j, "'}' or ',' was expected");
  ws(&j);
  if (j.p != j.end) return jfail(&j, "something follows the object");
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
    size_t eb = t->i64 ? 8 : 4;
    if (s->end < s->begin || s->end - s->begin != (uint64_t)st_bytes(t) ||
        s->end > data_len)
      return DP_FAIL(DP_ERR_PARSE,
                     "safetensors file '%s': tensor '%s' has data_offsets [%llu, %llu] for "
                     "%zu bytes of data (%zu values)",
                     path, t->name, (unsigned long long)s->begin,
                     (unsigned long long)s->end, data_len, t->numel);
    for (size_t e = 0; e < t->numel; e++) {
      const unsigned char *q = data + s->begin + eb * e;
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
      }
      memcpy(state + t->off + eb * e, q, eb); /* little-endian as it is */
    }
  }
  return DP_OK;
}

dp_status dp_ckpt_import_safetensors(dp_ctx *c, const char *path) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (!path || !*path)
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_INVALID, "dp_ckpt_import_safetensors: path is %s",
                                   path ? "empty" : "NULL"));
  const dp_model *m = &c->plan->model;
  size_t np = m->n_params, bytes;
  st_entry e[ST_MAX_ENTRIES];
  st_entries(m, e, &bytes);
  /* the largest file this model has: its data and a generous header */
  size_t cap = 8 + ST_MAX_HEADER + bytes;
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
