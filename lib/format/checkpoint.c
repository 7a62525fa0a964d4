/* Checkpoints: dp_ckpt_save / dp_ckpt_load. The format is in docs/CHECKPOINT.md.
 *
 * Save streams the file (no copy of the state is built in memory) into a
 * new temporary file beside path (dp__write_atomic: O_EXCL | O_NOFOLLOW, a
 * random name), fsyncs it, renames it over path and fsyncs the directory. Load reads the whole file, checks everything (structure, every
 * checksum, the model, optimizer and seed, every value finite) and only then
 * writes the context, so a refused load leaves the context as it was.
 *
 * The optimizer state is stored in its logical layout (k vectors of n_params
 * floats). Device d holds, for vector j, parameters [opt_off[d], +opt_len[d])
 * at float (j * opt_len[d] + e - opt_off[d]) of its OPT_STATE region. */
#include "core/ctx.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* 4: STEP's last word is the momentum in effect (dp_set_momentum; reserved,
 * 0, before); 3: an APPD section (the application's data) before END; 2: STEP
 * also holds the learning rate in effect. 1 to 3 are still read. */
#define CK_VERSION 4u
#define CK_SECTIONS 6u                /* versions 3 and 4; 1 and 2 have no APPD */
#define CK_APP_MAX ((size_t)16 << 20) /* APPD payload bound */
#define CK_HEADER 16u                 /* magic, version, section count */
#define CK_SEC_HEAD 16u               /* tag, reserved, payload length */
#define CK_SEC_TAIL 8u                /* checksum */
#define CK_MODL_FIXED 32u             /* MODL payload before the model text */
#define CK_FLAG_INFERENCE 1u
/* config.amsgrad: OPTS holds m, v and v_hat. A flag rather than a new
 * version, so that every other checkpoint keeps its bytes; a library that
 * predates it refuses the unknown flag rather than misreading three vectors. */
#define CK_FLAG_AMSGRAD 2u
#define CK_FLAGS_KNOWN (CK_FLAG_INFERENCE | CK_FLAG_AMSGRAD)
/* The step counter keys dropout and AdamW's bias correction, computed in
 * double: counts up to 2^53 are exact there, and far from the 64-bit wrap
 * that would make a step the "first" again. No run gets near it. */
#define CK_MAX_STEP ((uint64_t)1 << 53)

static const char *const CK_TAGS[CK_SECTIONS] = {"MODL", "STEP", "PARM",
                                                 "OPTS", "APPD", "END "};
enum { SEC_MODL, SEC_STEP, SEC_PARM, SEC_OPTS, SEC_APPD, SEC_END };
static unsigned sections_of(uint32_t version) { return version >= 3 ? 6u : 5u; }

/* ---- little helpers ---------------------------------------------------------- */

static void put32(unsigned char *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *b) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)b[i] << (8 * i);
  return v;
}
static uint64_t get64(const unsigned char *b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
  return v;
}
static float getf(const unsigned char *b) {
  uint32_t u = get32(b);
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static void putf(unsigned char *b, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  put32(b, u);
}

static unsigned ctx_state_vectors(const dp_ctx *c) {
  return (unsigned)dp__cfg_state_vectors(&c->plan->cfg); /* 0 for inference */
}

/* Device d's optimizer-state range (the planner's; all empty for inference). */
static void opt_range(const dp_plan *p, int d, size_t *off, size_t *len) {
  *off = p->opt_off[d];
  *len = p->opt_len[d];
}

/* The plan's optimizer-state layout must cover every parameter and fit the
 * regions; checked before any byte moves. */
static dp_status check_opt_layout(const dp_plan *p, unsigned k) {
  size_t n = p->model.n_params;
  if (k == 0 || n == 0) return DP_OK;
  for (int d = 0; d < p->split.n_used; d++) {
    size_t off, len, need;
    opt_range(p, d, &off, &len);
    if (len == 0) continue;
    if (off > n || len > n - off || !dp__mul(len, (size_t)k * 4, &need) ||
        need > p->regions[d][DP_REGION_OPT_STATE].size)
      return DP_FAIL(
          DP_ERR_INVALID,
          "checkpoint: device %d's optimizer state [%zu, +%zu) does not fit the plan", d,
          off, len);
  }
  /* Coverage: every element must be held by some device. */
  for (size_t e = 0; e < n;) {
    size_t next = e;
    for (int d = 0; d < p->split.n_used; d++) {
      size_t off, len;
      opt_range(p, d, &off, &len);
      if (len && off <= e && e < off + len && off + len > next) next = off + len;
    }
    if (next == e)
      return DP_FAIL(DP_ERR_INVALID,
                     "checkpoint: no device holds the optimizer state of parameter %zu", e);
    e = next;
  }
  return DP_OK;
}

/* The state a checkpoint holds, as host memory: device 0's parameters and
 * every device's optimizer state (k vectors of opt_len floats), copied into
 * one host block (mem) through dp__ctx_read: the host never dereferences an
 * arena, whatever the backend. */
typedef struct {
  const float *params;
  const float *opt[DP_MAX_DEVICES];
  float *mem;
} ck_state;

static dp_status state_read(dp_ctx *c, unsigned k, ck_state *v) {
  const dp_plan *p = c->plan;
  memset(v, 0, sizeof *v);
  size_t nf = dp__param_floats(&p->model), total = nf, off[DP_MAX_DEVICES],
         len[DP_MAX_DEVICES];
  for (int d = 0; d < p->split.n_used; d++) {
    opt_range(p, d, &off[d], &len[d]);
    total += (size_t)k * len[d]; /* bounded by the plan's regions: no overflow */
  }
  if (!(v->mem = malloc(total ? total * 4 : 4)))
    return DP_FAIL(DP_ERR_NOMEM,
                   "checkpoint: out of memory for a %zu-byte copy of the state", total * 4);
  /* the parameters and the buffers after them (batchnorm's running statistics) */
  dp_status s = dp__ctx_read(c, 0, DP_REGION_PARAMS, 0, v->mem, nf * 4);
  float *at = v->mem + nf;
  for (int d = 0; d < p->split.n_used && !s; d++) {
    v->opt[d] = at;
    s = dp__ctx_read(c, d, DP_REGION_OPT_STATE, 0, at, (size_t)k * len[d] * 4);
    at += (size_t)k * len[d];
  }
  v->params = v->mem;
  if (s) {
    free(v->mem);
    v->mem = NULL;
  }
  return s;
}

/* ---- save ---------------------------------------------------------------------- */

typedef struct {
  FILE *f;
  uint64_t file_h, sec_h;
  bool failed;
} writer;

static void w_bytes(writer *w, const void *b, size_t n) {
  if (w->failed || n == 0) return;
  w->file_h = dp__fnv1a(w->file_h, b, n);
  w->sec_h = dp__fnv1a(w->sec_h, b, n);
  if (fwrite(b, 1, n, w->f) != n) w->failed = true;
}

static void w_sec_begin(writer *w, int sec, uint64_t len) {
  unsigned char h[CK_SEC_HEAD];
  memcpy(h, CK_TAGS[sec], 4);
  put32(h + 4, 0);
  put64(h + 8, len);
  w_bytes(w, h, sizeof h);
  w->sec_h = DP_FNV_INIT; /* the section checksum covers the payload only */
}

static void w_sec_end(writer *w, uint64_t checksum) {
  unsigned char t[8];
  put64(t, checksum);
  w_bytes(w, t, 8);
}

static void w_floats(writer *w, const float *x, size_t n) {
  unsigned char buf[4096];
  while (n > 0 && !w->failed) {
    size_t m = n < sizeof buf / 4 ? n : sizeof buf / 4;
    for (size_t k = 0; k < m; k++) {
      uint32_t u;
      memcpy(&u, &x[k], 4);
      put32(buf + 4 * k, u);
    }
    w_bytes(w, buf, m * 4);
    x += m;
    n -= m;
  }
}

/* The state vectors in logical order: element e of vector j from the lowest
 * device whose range covers e, written in runs. */
static void w_opt_state(writer *w, const dp_ctx *c, const ck_state *v, unsigned k) {
  const dp_plan *p = c->plan;
  size_t n = p->model.n_params;
  for (unsigned j = 0; j < k; j++) {
    for (size_t e = 0; e < n && !w->failed;) {
      int src = -1;
      size_t off = 0, len = 0, end = n;
      for (int d = 0; d < p->split.n_used; d++) {
        size_t o, l;
        opt_range(p, d, &o, &l);
        if (l == 0) continue;
        if (src < 0 && o <= e && e < o + l) {
          src = d;
          off = o;
          len = l;
          if (o + l < end) end = o + l;
        } else if (src < 0 && o > e && o < end) {
          end = o; /* a lower device takes over from o */
        }
      }
      if (src < 0) { /* excluded by check_opt_layout */
        w->failed = true;
        break;
      }
      const float *s = v->opt[src] + (size_t)j * len + (e - off);
      w_floats(w, s, end - e);
      e = end;
    }
  }
}

/* "checkpoint 'path': cannot <what> 'file': <strerror>" */
static dp_status io_fail(const char *path, const char *what, const char *file, int err) {
  return dp__io_fail("checkpoint", path, what, file, err);
}

static dp_status write_file(dp_ctx *c, const ck_state *v, const void *app, size_t app_len,
                            FILE *f) {
  const dp_plan *p = c->plan;
  size_t n = p->model.n_params;
  unsigned k = ctx_state_vectors(c);
  size_t tlen = dp_model_format(&p->model, NULL, 0);
  char *text = malloc(tlen + 1);
  if (!text) return DP_FAIL(DP_ERR_NOMEM, "checkpoint: out of memory for the model text");
  dp_model_format(&p->model, text, tlen + 1);
  if (tlen > UINT32_MAX) {
    free(text);
    return DP_FAIL(DP_ERR_OVERFLOW, "checkpoint: the model text is too long");
  }

  writer w = {.f = f, .file_h = DP_FNV_INIT};
  unsigned char h[CK_HEADER];
  memcpy(h, DP__CKPT_MAGIC, 8);
  put32(h + 8, CK_VERSION);
  put32(h + 12, CK_SECTIONS);
  w_bytes(&w, h, sizeof h);

  unsigned char m[CK_MODL_FIXED];
  put64(m, n);
  put64(m + 8, p->cfg.seed);
  put32(m + 16, (uint32_t)p->cfg.optimizer);
  put32(m + 20, k);
  put32(m + 24, p->cfg.inference       ? CK_FLAG_INFERENCE
                : dp__amsgrad(&p->cfg) ? CK_FLAG_AMSGRAD
                                       : 0);
  put32(m + 28, (uint32_t)tlen);
  w_sec_begin(&w, SEC_MODL, CK_MODL_FIXED + (uint64_t)tlen);
  w_bytes(&w, m, sizeof m);
  w_bytes(&w, text, tlen);
  w_sec_end(&w, w.sec_h);
  free(text);

  unsigned char st[16]; /* step, the rate and the momentum in effect */
  put64(st, c->step);
  putf(st + 8, c->lr);
  putf(st + 12, c->momentum);
  w_sec_begin(&w, SEC_STEP, 16);
  w_bytes(&w, st, 16);
  w_sec_end(&w, w.sec_h);

  size_t nf = dp__param_floats(&p->model); /* the buffers after the parameters */
  w_sec_begin(&w, SEC_PARM, (uint64_t)nf * 4);
  w_floats(&w, v->params, nf);
  w_sec_end(&w, w.sec_h);

  w_sec_begin(&w, SEC_OPTS, (uint64_t)k * n * 4);
  w_opt_state(&w, c, v, k);
  w_sec_end(&w, w.sec_h);

  w_sec_begin(&w, SEC_APPD, app_len);
  w_bytes(&w, app, app_len);
  w_sec_end(&w, w.sec_h);

  w_sec_begin(&w, SEC_END, 0);
  w_sec_end(&w, w.file_h); /* everything before this field */
  return w.failed ? DP_ERR_IO : DP_OK;
}

typedef struct {
  dp_ctx *c;
  const ck_state *v;
  const void *app;
  size_t app_len;
} write_job;

static dp_status fill(FILE *f, void *arg) {
  const write_job *j = arg;
  return write_file(j->c, j->v, j->app, j->app_len, f);
}

dp_status dp_ckpt_save(dp_ctx *c, const char *path) {
  return dp_ckpt_save_app(c, path, NULL, 0);
}

dp_status dp_ckpt_save_app(dp_ctx *c, const char *path, const void *app, size_t app_bytes) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (!path || !*path)
    return dp__ctx_fail(
        c, DP_FAIL(DP_ERR_INVALID, "dp_ckpt_save: path is %s", path ? "empty" : "NULL"));
  if ((app_bytes && !app) || app_bytes > CK_APP_MAX)
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_INVALID,
                                   "dp_ckpt_save_app: %zu bytes of application data %s",
                                   app_bytes, app ? "(at most 16 MiB)" : "at NULL"));
  dp_status s = DP_OK;
  if (c->poison) /* a failed update left its state half-written: never persist that */
    s = DP_FAIL(DP_ERR_INVALID, "refusing to save: %s", c->poison_msg);
  if (!s) s = check_opt_layout(c->plan, ctx_state_vectors(c));
  if (!s && c->accum_k)
    s = DP_FAIL(DP_ERR_INVALID,
                "refusing to save in the middle of a gradient accumulation (%d of %d calls "
                "made): save after the call that updates",
                c->accum_k, dp__accumulate(&c->plan->cfg));
  /* across processes the save is collective: every rank goes on, or none */
  if ((s = dp__ctx_agree(c, s))) return dp__ctx_fail(c, s);
  ck_state v;
  if ((s = state_read(c, ctx_state_vectors(c), &v))) return dp__ctx_fail(c, s);
  /* across processes every rank read the state (collective); rank 0 writes
   * the one file and every rank returns how that went */
  if (!dp__ctx_writes_files(c)) {
    free(v.mem);
    return dp__ctx_fail(c, dp__ctx_root_status(c, DP_OK));
  }

  write_job job = {c, &v, app, app_bytes};
  s = dp__write_atomic(path, "checkpoint", fill, &job);
  free(v.mem);
  return dp__ctx_fail(c, dp__ctx_root_status(c, s));
}

static size_t file_size_for(size_t nf, size_t n, unsigned k, size_t tlen, uint32_t version,
                            size_t app_len);

size_t dp_ckpt_bytes(const dp_ctx *c, size_t app_bytes) {
  if (!c) return 0;
  const dp_plan *p = c->plan;
  size_t base =
      file_size_for(dp__param_floats(&p->model), p->model.n_params, ctx_state_vectors(c),
                    dp_model_format(&p->model, NULL, 0), CK_VERSION, 0);
  /* SIZE_MAX for application data past what a size_t counts (no file room has it) */
  return app_bytes > SIZE_MAX - base ? SIZE_MAX : base + app_bytes;
}

/* ---- load ---------------------------------------------------------------------- */

typedef struct {
  /* from MODL */
  uint64_t n_params, seed, step;
  uint32_t version;
  float lr; /* version 2: the rate in effect; NaN in version 1 (no rate saved) */
  float momentum; /* version 4: the momentum in effect; NaN before (none saved) */
  uint32_t optimizer, k, flags, text_len;
  const unsigned char *text;
  const unsigned char *parm, *opts; /* payloads */
} ckpt_view;

/* A saved momentum (version 4) that a context of cf takes: a training
 * context whose optimizer keeps one (SGD's buffer, Adam's beta1). */
static bool has_momentum(const dp_config *cf, float saved) {
  return !isnan(saved) && !cf->inference && cf->optimizer != DP_OPT_SGD;
}

static size_t sec_size(uint64_t payload) {
  return CK_SEC_HEAD + (size_t)payload + CK_SEC_TAIL;
}

/* Exact file size of a checkpoint with these contents (no overflow: callers
 * bound n and tlen first). */
/* STEP's payload: the step (version 1); the step, the rate and a reserved word
 * (2, 3); the step, the rate and the momentum (4). */
static size_t step_bytes(uint32_t version) { return version == 1 ? 8 : 16; }

/* nf: PARM's floats (the parameters and the buffers), n: the parameters. */
static size_t file_size_for(size_t nf, size_t n, unsigned k, size_t tlen, uint32_t version,
                            size_t app_len) {
  return CK_HEADER + sec_size(CK_MODL_FIXED + tlen) + sec_size(step_bytes(version)) +
         sec_size(4 * nf) + sec_size((size_t)k * 4 * n) +
         (version >= 3 ? sec_size(app_len) : 0) + sec_size(0);
}

static bool ctx_text(const dp_ctx *c, char **text, size_t *len) {
  *len = dp_model_format(&c->plan->model, NULL, 0);
  *text = malloc(*len + 1);
  if (!*text) return false;
  dp_model_format(&c->plan->model, *text, *len + 1);
  return true;
}

/* Checks MODL against the context. */
static dp_status check_model(const dp_ctx *c, const ckpt_view *v, const char *text,
                             size_t tlen, const char *path) {
  const dp_plan *p = c->plan;
  if (v->text_len != tlen || memcmp(v->text, text, tlen) != 0) {
    /* Name the first differing line of each. */
    size_t i = 0;
    while (i < tlen && i < v->text_len && v->text[i] == (unsigned char)text[i]) i++;
    size_t a = i, b = i;
    while (a > 0 && text[a - 1] != '\n') a--;
    b = a;
    size_t ea = a, eb = b;
    while (ea < tlen && text[ea] != '\n') ea++;
    while (eb < v->text_len && v->text[eb] != '\n') eb++;
    int line = 1;
    for (size_t q = 0; q < a; q++) line += text[q] == '\n';
    return DP_FAIL(DP_ERR_INVALID,
                   "%s: the checkpoint's model differs from the context's at line %d: "
                   "checkpoint '%.*s', context '%.*s'",
                   path, line, (int)(eb - b > 80 ? 80 : eb - b), (const char *)v->text + b,
                   (int)(ea - a > 80 ? 80 : ea - a), text + a);
  }
  if (v->n_params != p->model.n_params)
    return DP_FAIL(DP_ERR_INVALID,
                   "%s: the checkpoint has %llu parameters; the context %zu", path,
                   (unsigned long long)v->n_params, p->model.n_params);
  bool inference = p->cfg.inference;
  if (inference) return DP_OK; /* takes the parameters only */
  if (v->flags & CK_FLAG_INFERENCE)
    return DP_FAIL(
        DP_ERR_INVALID,
        "%s: the checkpoint was saved from an inference context (parameters only); "
        "a training context resumes only from a training checkpoint "
        "(use dp_set_params to start from its parameters)",
        path);
  if (v->optimizer != (uint32_t)p->cfg.optimizer)
    return DP_FAIL(DP_ERR_INVALID,
                   "%s: the checkpoint's optimizer is %s; the context's is %s", path,
                   dp_optimizer_name((dp_optimizer)v->optimizer),
                   dp_optimizer_name(p->cfg.optimizer)); /* MODL's check: in range */
  bool ams = (v->flags & CK_FLAG_AMSGRAD) != 0;
  if (ams != dp__amsgrad(&p->cfg))
    return DP_FAIL(DP_ERR_INVALID,
                   "%s: the checkpoint was saved with amsgrad %s; the context has amsgrad "
                   "%s (its optimizer state is %s): plan the context with amsgrad %d",
                   path, ams ? "on" : "off", ams ? "off" : "on",
                   ams ? "m, v and v_hat" : "m and v", ams ? 1 : 0);
  if (v->seed != p->cfg.seed)
    return DP_FAIL(DP_ERR_INVALID,
                   "%s: the checkpoint's seed is %llu; the context's is %llu", path,
                   (unsigned long long)v->seed, (unsigned long long)p->cfg.seed);
  return DP_OK;
}

/* Section i's header at off: tag and reserved word checked, payload length
 * returned; the whole section must be within len. */
static dp_status sec_open(const char *path, const unsigned char *b, size_t len, size_t off,
                          int i, size_t expect_total, uint64_t *plen) {
  if (len - off < CK_SEC_HEAD) {
    if (expect_total)
      return DP_FAIL(DP_ERR_PARSE, "%s: truncated: expected %zu bytes, file has %zu", path,
                     expect_total, len);
    return DP_FAIL(DP_ERR_PARSE, "%s: truncated: expected at least %zu bytes, file has %zu",
                   path, off + CK_SEC_HEAD, len);
  }
  if (memcmp(b + off, CK_TAGS[i], 4) != 0) {
    char t[5];
    for (int q = 0; q < 4; q++)
      t[q] = b[off + q] >= 32 && b[off + q] < 127 ? (char)b[off + q] : '?';
    t[4] = 0;
    return DP_FAIL(DP_ERR_PARSE, "%s: section %d is '%s'; expected '%s'", path, i + 1, t,
                   CK_TAGS[i]);
  }
  if (get32(b + off + 4) != 0)
    return DP_FAIL(DP_ERR_PARSE, "%s: section %s: reserved word is not 0", path,
                   CK_TAGS[i]);
  *plen = get64(b + off + 8);
  return DP_OK;
}

static dp_status sec_body(const char *path, const unsigned char *b, size_t len, size_t off,
                          int i, uint64_t plen, size_t expect_total) {
  if (plen > len - off - CK_SEC_HEAD || len - off - CK_SEC_HEAD - plen < CK_SEC_TAIL) {
    if (expect_total)
      return DP_FAIL(DP_ERR_PARSE, "%s: truncated: expected %zu bytes, file has %zu", path,
                     expect_total, len);
    return DP_FAIL(DP_ERR_PARSE,
                   "%s: truncated: expected at least %llu bytes, file has %zu", path,
                   (unsigned long long)(off + CK_SEC_HEAD + CK_SEC_TAIL) + plen, len);
  }
  const unsigned char *pay = b + off + CK_SEC_HEAD;
  if (dp__fnv1a(DP_FNV_INIT, pay, (size_t)plen) != get64(pay + plen))
    return DP_FAIL(DP_ERR_PARSE, "%s: checksum mismatch in section %s", path, CK_TAGS[i]);
  return DP_OK;
}

/* The optimizer state is finite, and Adam's or AdamW's second moment v (a
 * running mean of squared gradients) and amsgrad's v_hat (its running maximum)
 * are never negative: the update divides by a square root of one of them, so a
 * negative one would write NaN parameters on the next step. */
static dp_status check_opt_values(const ckpt_view *v, size_t n, const char *path) {
  bool adamw = dp__is_adam((dp_optimizer)v->optimizer) && v->k >= 2;
  for (size_t e = 0; e < (size_t)v->k * n; e++) {
    float x = getf(v->opts + 4 * e);
    if (!isfinite(x))
      return DP_FAIL(DP_ERR_PARSE,
                     "%s: optimizer state value %zu (vector %zu) is not finite", path,
                     e % n, e / n);
    if (adamw && e >= n && x < 0.0f)
      return DP_FAIL(
          DP_ERR_PARSE, "%s: %s's %s[%zu] is %g; a mean of squares is never negative", path,
          v->optimizer == DP_OPT_ADAM ? "Adam" : "AdamW",
          e >= 2 * n ? "amsgrad maximum v_hat" : "second moment v", e % n, (double)x);
  }
  return DP_OK;
}

/* MODL's flags: known bits, and amsgrad only for a training checkpoint of the
 * Adam family (no other keeps v_hat). */
static dp_status check_flags(const char *path, uint32_t flags, uint32_t optimizer) {
  if (flags & ~CK_FLAGS_KNOWN)
    return DP_FAIL(DP_ERR_PARSE,
                   "%s: section MODL: flags 0x%x (only 0x%x, inference, and 0x%x, amsgrad, "
                   "are known)",
                   path, flags, (unsigned)CK_FLAG_INFERENCE, (unsigned)CK_FLAG_AMSGRAD);
  if ((flags & CK_FLAG_AMSGRAD) &&
      ((flags & CK_FLAG_INFERENCE) || !dp__is_adam((dp_optimizer)optimizer)))
    return DP_FAIL(DP_ERR_PARSE,
                   "%s: section MODL: the amsgrad flag on a%s %s checkpoint (only Adam and "
                   "AdamW training keep v_hat)",
                   path, (flags & CK_FLAG_INFERENCE) ? "n inference" : "",
                   dp_optimizer_name((dp_optimizer)optimizer));
  return DP_OK;
}

/* Checks the whole image; fills v. `file_size` is the real size (the image
 * may hold only a prefix when the file is larger than any checkpoint of the
 * context's model). */
static dp_status parse(const dp_ctx *c, const unsigned char *b, size_t len,
                       size_t file_size, const char *path, const char *text, size_t tlen,
                       ckpt_view *v) {
  memset(v, 0, sizeof *v);
  if (len >= 8 && memcmp(b, DP__CKPT_MAGIC, 8) != 0)
    return DP_FAIL(DP_ERR_PARSE, "%s: not a libdp checkpoint (bad magic)", path);
  if (len < CK_HEADER)
    return DP_FAIL(DP_ERR_PARSE, "%s: truncated: expected at least %u bytes, file has %zu",
                   path, CK_HEADER, len);
  uint32_t version = get32(b + 8), count = get32(b + 12);
  if (version < 1 || version > CK_VERSION)
    return DP_FAIL(DP_ERR_PARSE,
                   "%s: checkpoint version %u; this library reads versions 1 to %u", path,
                   version, CK_VERSION);
  v->version = version;
  if (count != sections_of(version))
    return DP_FAIL(DP_ERR_PARSE, "%s: %u sections; version %u has %u", path, count, version,
                   sections_of(version));

  /* MODL */
  size_t off = CK_HEADER;
  uint64_t plen;
  dp_status s = sec_open(path, b, len, off, SEC_MODL, 0, &plen);
  if (!s && (plen < CK_MODL_FIXED || plen - CK_MODL_FIXED > UINT32_MAX))
    s = DP_FAIL(DP_ERR_PARSE, "%s: section MODL: payload of %llu bytes", path,
                (unsigned long long)plen);
  if (!s) s = sec_body(path, b, len, off, SEC_MODL, plen, 0);
  if (s && file_size > len) /* only a prefix was read */
    return DP_FAIL(DP_ERR_PARSE,
                   "%s: file has %zu bytes, more than any checkpoint of this "
                   "model (at most %zu)",
                   path, file_size, len);
  if (s) return s;
  const unsigned char *m = b + off + CK_SEC_HEAD;
  v->n_params = get64(m);
  v->seed = get64(m + 8);
  v->optimizer = get32(m + 16);
  v->k = get32(m + 20);
  v->flags = get32(m + 24);
  v->text_len = get32(m + 28);
  v->text = m + CK_MODL_FIXED;
  /* each field named (an outside check, session 23: "inconsistent fields") */
  if (v->text_len != plen - CK_MODL_FIXED)
    return DP_FAIL(DP_ERR_PARSE,
                   "%s: section MODL: its text length field is %u, its text %llu bytes",
                   path, v->text_len, (unsigned long long)(plen - CK_MODL_FIXED));
  if (v->optimizer > DP_OPT_ADAM)
    return DP_FAIL(DP_ERR_PARSE, "%s: section MODL: optimizer %u is none of 0 to %d", path,
                   v->optimizer, (int)DP_OPT_ADAM);
  if ((s = check_flags(path, v->flags, v->optimizer))) return s;
  unsigned want_k = (v->flags & CK_FLAG_INFERENCE)
                        ? 0u
                        : (unsigned)dp__state_vectors((dp_optimizer)v->optimizer,
                                                      (v->flags & CK_FLAG_AMSGRAD) != 0);
  if (v->k != want_k)
    return DP_FAIL(DP_ERR_PARSE,
                   "%s: section MODL: %u optimizer state vectors; %s%s keeps %u", path,
                   v->k, dp_optimizer_name((dp_optimizer)v->optimizer),
                   (v->flags & CK_FLAG_INFERENCE) ? " (inference)" : "", want_k);
  if ((s = check_model(c, v, text, tlen, path))) return s;
  off += sec_size(plen);

  /* The model matches: the file's exact size is known (version 3: once the
   * APPD length is read, at a known offset). */
  const dp_model *mo = &c->plan->model;
  size_t n = mo->n_params, nf = dp__param_floats(mo);
  uint64_t app_len = 0;
  if (version >= 3) {
    /* STEP, PARM and OPTS by their own headers first: a section of the wrong
     * length is named, not the tag found where APPD should start */
    const uint64_t fixed[3] = {step_bytes(version), (uint64_t)nf * 4,
                               (uint64_t)v->k * n * 4};
    size_t o = off;
    for (int i = SEC_STEP; i <= SEC_OPTS; i++) {
      if (o >= len || len - o < CK_SEC_HEAD) break; /* truncated: said below */
      if ((s = sec_open(path, b, len, o, i, 0, &plen))) return s;
      if (plen != fixed[i - SEC_STEP])
        return DP_FAIL(DP_ERR_PARSE, "%s: section %s holds %llu bytes; expected %llu", path,
                       CK_TAGS[i], (unsigned long long)plen,
                       (unsigned long long)fixed[i - SEC_STEP]);
      o += sec_size((size_t)plen);
    }
    size_t at = off;
    for (int i = 0; i < 3; i++) at += sec_size(fixed[i]);
    if (at >= len || len - at < CK_SEC_HEAD) /* the least it can be: APPD empty */
      return DP_FAIL(DP_ERR_PARSE,
                     "%s: truncated: expected at least %zu bytes, file has %zu", path,
                     file_size_for(nf, n, v->k, tlen, version, 0), file_size);
    if ((s = sec_open(path, b, len, at, SEC_APPD, 0, &app_len))) return s;
    if (app_len > CK_APP_MAX)
      return DP_FAIL(DP_ERR_PARSE, "%s: section APPD is larger than 16 MiB", path);
  }
  size_t total = file_size_for(nf, n, v->k, tlen, version, (size_t)app_len);
  if (file_size < total)
    return DP_FAIL(DP_ERR_PARSE, "%s: truncated: expected %zu bytes, file has %zu", path,
                   total, file_size);
  if (file_size > total)
    return DP_FAIL(DP_ERR_PARSE, "%s: expected %zu bytes, file has %zu (trailing data)",
                   path, total, file_size);
  /* From here len == file_size == total. */
  const uint64_t expect[CK_SECTIONS] = {
      0, step_bytes(version), (uint64_t)nf * 4, (uint64_t)v->k * n * 4, app_len, 0};
  for (int i = SEC_STEP; i <= SEC_END; i++) {
    if (i == SEC_APPD && version < 3) continue;
    if ((s = sec_open(path, b, len, off, i, total, &plen))) return s;
    if (plen != expect[i])
      return DP_FAIL(DP_ERR_PARSE, "%s: section %s holds %llu bytes; expected %llu", path,
                     CK_TAGS[i], (unsigned long long)plen, (unsigned long long)expect[i]);
    if (i == SEC_END) {
      if (len - off != CK_SEC_HEAD + CK_SEC_TAIL)
        return DP_FAIL(DP_ERR_PARSE, "%s: section END is not at the end of the file", path);
      if (dp__fnv1a(DP_FNV_INIT, b, off + CK_SEC_HEAD) != get64(b + off + CK_SEC_HEAD))
        return DP_FAIL(DP_ERR_PARSE,
                       "%s: checksum mismatch in section END (the whole file)", path);
      break;
    }
    if ((s = sec_body(path, b, len, off, i, plen, total))) return s;
    const unsigned char *pay = b + off + CK_SEC_HEAD;
    if (i == SEC_STEP) {
      v->step = get64(pay);
      if (v->step > CK_MAX_STEP)
        return DP_FAIL(
            DP_ERR_PARSE,
            "%s: section STEP: step %llu is above the largest libdp takes (2^53)", path,
            (unsigned long long)v->step);
      v->lr = version == 1 ? NAN : getf(pay + 8);
      if (version != 1 && !(v->lr >= 0.0f && v->lr <= FLT_MAX))
        return DP_FAIL(DP_ERR_PARSE, "%s: section STEP: learning rate %g", path,
                       (double)v->lr);
      v->momentum = version >= 4 ? getf(pay + 12) : NAN;
      /* a checkpoint without a momentum (plain SGD, inference) holds 0: the
       * format stays canonical (a load then a save gives the same bytes) */
      bool none = v->optimizer == DP_OPT_SGD || (v->flags & CK_FLAG_INFERENCE);
      if (version >= 4
              ? !(v->momentum >= 0.0f && v->momentum < 1.0f) || (none && get32(pay + 12))
              : version != 1 && get32(pay + 12))
        return DP_FAIL(DP_ERR_PARSE, "%s: section STEP: %s %g%s", path,
                       version >= 4 ? "momentum" : "reserved word", (double)getf(pay + 12),
                       version >= 4 && none ? " (plain SGD and inference keep none: 0)"
                                            : "");
    }
    if (i == SEC_PARM) v->parm = pay;
    if (i == SEC_OPTS) v->opts = pay;
    off += sec_size(plen);
  }
  for (size_t e = 0; e < n; e++)
    if (!isfinite(getf(v->parm + 4 * e)))
      return DP_FAIL(DP_ERR_PARSE, "%s: parameter %zu is not finite", path, e);
  for (int i = 0; i < mo->n_layers; i++) { /* batchnorm's running statistics */
    const dp_layer *l = &mo->layers[i];
    if (l->kind != DP_LAYER_BATCHNORM) continue;
    for (size_t e = 0; e < 2 * (size_t)l->c; e++) {
      float x = getf(v->parm + 4 * (n + l->buf_off + e));
      if (!isfinite(x) || (e >= (size_t)l->c && x < 0.0f))
        return DP_FAIL(DP_ERR_PARSE, "%s: layer %d's running %s[%zu] is %g", path, i,
                       e < (size_t)l->c ? "mean" : "var", e % (size_t)l->c, (double)x);
    }
  }
  return check_opt_values(v, n, path);
}

/* Reads at most cap bytes of path into *buf; *file_size is the size. */
static dp_status read_file(const char *path, size_t cap, unsigned char **buf, size_t *len,
                           size_t *file_size) {
  *buf = NULL;
  struct stat st;
  const char *failed;
  int fd = dp__open_regular(path, &st, &failed); /* never blocks on a FIFO */
  if (fd == -2)
    return DP_FAIL(DP_ERR_IO, "checkpoint: '%s' is not a regular file (%s)", path,
                   dp__file_kind(st.st_mode));
  if (fd < 0) return io_fail(path, failed, path, errno);
  size_t want = (uint64_t)st.st_size < cap ? (size_t)st.st_size : cap;
  unsigned char *b = malloc(want ? want : 1);
  dp_status s = b ? dp__read_fd(fd, b, want, len, "checkpoint", path)
                  : DP_FAIL(DP_ERR_NOMEM, "checkpoint: out of memory for %zu bytes", want);
  close(fd);
  if (s) {
    free(b);
    return s;
  }
  *buf = b;
  /* the file shrank while read: parse what is there */
  *file_size = *len < want ? *len : (size_t)st.st_size;
  return DP_OK;
}

/* read_file on rank 0 of a job, its bytes sent to every rank (the ranks
 * need not share a file system); one process: read_file. */
static dp_status read_shared(dp_ctx *c, const char *path, size_t cap, unsigned char **buf,
                             size_t *len, size_t *file_size) {
  dp_status s = dp__ctx_writes_files(c) ? read_file(path, cap, buf, len, file_size) : DP_OK;
  if ((s = dp__ctx_root_status(c, s)) || dp_ctx_rank(c) == 0) {
    if (dp_ctx_rank(c) == 0 && s == DP_OK) { /* then the bytes, to the others */
      uint64_t meta[2] = {*len, *file_size};
      if ((s = dp__ctx_bcast(c, 0, meta, sizeof meta)) ||
          (s = dp__ctx_bcast(c, 0, *buf, *len))) {
        free(*buf);
        *buf = NULL;
      }
    }
    return s;
  }
  uint64_t meta[2];
  if ((s = dp__ctx_bcast(c, 0, meta, sizeof meta))) return s;
  *len = (size_t)meta[0];
  *file_size = (size_t)meta[1];
  if (!(*buf = malloc(*len ? *len : 1)))
    return DP_FAIL(DP_ERR_NOMEM, "checkpoint: out of memory for %zu bytes", *len);
  if ((s = dp__ctx_bcast(c, 0, *buf, *len))) {
    free(*buf);
    *buf = NULL;
  }
  return s;
}

dp_status dp_ckpt_load(dp_ctx *c, const char *path) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (!path || !*path)
    return dp__ctx_fail(
        c, DP_FAIL(DP_ERR_INVALID, "dp_ckpt_load: path is %s", path ? "empty" : "NULL"));
  const dp_plan *p = c->plan;
  size_t n = p->model.n_params;
  unsigned k = ctx_state_vectors(c);
  dp_status s = check_opt_layout(p, k);
  if (s) return dp__ctx_fail(c, s);
  char *text;
  size_t tlen;
  if (!ctx_text(c, &text, &tlen))
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_NOMEM, "checkpoint: out of memory"));
  /* The largest checkpoint of this model (amsgrad's three state vectors). */
  size_t cap;
  if (n > SIZE_MAX / 64 || tlen > SIZE_MAX / 4) {
    free(text);
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_OVERFLOW, "checkpoint: the model is too large"));
  }
  size_t nf = dp__param_floats(&p->model);
  cap = file_size_for(nf, n, 3, tlen, CK_VERSION, CK_APP_MAX); /* the largest */

  unsigned char *buf = NULL;
  size_t len = 0, file_size = 0;
  s = read_shared(c, path, cap, &buf, &len, &file_size);
  if (s) {
    free(text);
    return dp__ctx_fail(c, s);
  }
  ckpt_view v;
  s = parse(c, buf, len, file_size, path, text, tlen, &v);
  free(text);
  const dp_config *cf = &c->plan->cfg;
  if (!s && !isnan(v.lr) && !cf->inference && cf->optimizer == DP_OPT_ADAMW &&
      !((double)v.lr * cf->weight_decay <= 1.0))
    s = DP_FAIL(DP_ERR_INVALID,
                "%s: its learning rate %g times this context's weight_decay %g is above 1 "
                "(AdamW multiplies every parameter by 1 - lr * weight_decay)",
                path, (double)v.lr, (double)cf->weight_decay);
  if (s) {
    free(buf);
    return dp__ctx_fail(c, s);
  }

  /* Everything checked: decode into host memory, then write the context. On
   * the cpu backend the writes are memcpys and cannot fail; a cuda device
   * copy that fails part way leaves the state mixed: the context is then
   * poisoned (a later load heals it). */
  float *img = malloc((nf + (size_t)k * n) * 4 + 4); /* parameters and buffers, then k
                                                        state vectors */
  if (!img) {
    free(buf);
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_NOMEM, "checkpoint: out of memory"));
  }
  for (size_t e = 0; e < nf; e++) img[e] = getf(v.parm + 4 * e);
  for (size_t e = 0; e < (size_t)k * n; e++) img[nf + e] = getf(v.opts + 4 * e);
  free(buf);
  for (int d = 0; d < p->split.n_used && !s; d++)
    if (p->regions[d][DP_REGION_PARAMS].size >= nf * 4)
      s = dp__ctx_write(c, d, DP_REGION_PARAMS, 0, img, nf * 4);
  for (int d = 0; d < p->split.n_used && k > 0 && !s;
       d++) { /* k == v.k: check_model matched */
    size_t off, olen;
    opt_range(p, d, &off, &olen);
    for (unsigned j = 0; j < k && !s; j++)
      s = dp__ctx_write(c, d, DP_REGION_OPT_STATE, (size_t)j * olen * 4,
                        img + nf + (size_t)j * n + off, olen * 4);
  }
  free(img);
  c->replicas_stale = true;
  c->accum_k = 0; /* a loaded state: an accumulation starts again */
  if (s)
    return dp__ctx_fail(c, dp__ctx_poison(c, DP_FAIL(s,
                                                     "checkpoint '%s': writing the loaded "
                                                     "state failed part way: %s",
                                                     path, dp_last_error())));
  c->step = v.step;
  /* the rate in effect when it was saved (version 2); a version 1 file has none
   * and leaves the context's own. Checked above like dp_set_lr checks it. */
  if (!isnan(v.lr)) {
    if (c->be->set_lr && !c->plan->cfg.inference) s = c->be->set_lr(c->bctx, v.lr);
    if (s)
      return dp__ctx_fail(
          c, dp__ctx_poison(c, DP_FAIL(s, "checkpoint '%s': %s", path, dp_last_error())));
    if (!c->plan->cfg.inference) c->lr = v.lr;
  }
  /* the momentum in effect (version 4), where the optimizer has one: parse
   * took it in [0, 1), the range dp_set_momentum takes */
  if (has_momentum(cf, v.momentum)) {
    if (c->be->set_momentum) s = c->be->set_momentum(c->bctx, v.momentum);
    if (s)
      return dp__ctx_fail(
          c, dp__ctx_poison(c, DP_FAIL(s, "checkpoint '%s': %s", path, dp_last_error())));
    c->momentum = v.momentum;
  }
  /* Every piece of kept state was just rewritten: a poisoned context is whole
   * again, its guards too (a damaged guard would fail the next call again). */
  if (c->poison) {
    s = dp__ctx_rearm_guards(c);
    if (s)
      return dp__ctx_fail(
          c, DP_FAIL(s, "checkpoint '%s': refilling the arena guards failed: %s", path,
                     dp_last_error()));
  }
  c->poison = DP_OK;
  c->poison_msg[0] = '\0';
  return DP_OK;
}

/* The file holds at least the sections of its model's parameters and k
 * optimizer state vectors: a small file whose header names a huge model is
 * refused here, before a caller plans (and allocates) that model's arenas. */
static dp_status check_least_size(const char *path, const dp_model *m, unsigned k,
                                  size_t tlen, uint32_t version, size_t file_size) {
  size_t n = dp_model_n_params(m), nf = dp__param_floats(m);
  if (k > 3)
    return DP_FAIL(DP_ERR_PARSE, "%s: section MODL: %u optimizer state vectors (at most 3)",
                   path, k);
  size_t least = n > SIZE_MAX / 32 || nf > SIZE_MAX / 32
                     ? SIZE_MAX
                     : file_size_for(nf, n, k, tlen, version, 0);
  if (file_size >= least) return DP_OK;
  return DP_FAIL(DP_ERR_PARSE,
                 "%s: truncated: its model of %zu parameters needs at least %zu bytes, the "
                 "file has %zu",
                 path, n, least, file_size);
}

dp_status dp_ckpt_info(const char *path, dp_model **model, dp_ckpt_summary *out) {
  if (model) *model = NULL;
  if (out) memset(out, 0, sizeof *out);
  if (!path || !*path)
    return DP_FAIL(DP_ERR_INVALID, "dp_ckpt_info: path is %s", path ? "empty" : "NULL");
  /* only the beginning: the header and MODL (a model text is far below 1 MiB) */
  unsigned char *b = NULL;
  size_t len = 0, file_size = 0;
  dp_status s = read_file(path, CK_HEADER + CK_SEC_HEAD + CK_MODL_FIXED + (1u << 20), &b,
                          &len, &file_size);
  if (s) return s;
  uint64_t plen = 0;
  if (len < 8 || memcmp(b, DP__CKPT_MAGIC, 8) != 0)
    s = DP_FAIL(DP_ERR_PARSE, "%s: not a libdp checkpoint (bad magic)", path);
  else if (len < CK_HEADER)
    s = DP_FAIL(DP_ERR_PARSE, "%s: truncated: %zu bytes", path, len);
  else if (get32(b + 8) < 1 || get32(b + 8) > CK_VERSION) /* every version parse takes */
    s = DP_FAIL(DP_ERR_PARSE,
                "%s: checkpoint version %u; this library reads versions 1 to %u", path,
                get32(b + 8), CK_VERSION);
  else if (get32(b + 12) != sections_of(get32(b + 8)))
    s = DP_FAIL(DP_ERR_PARSE, "%s: %u sections; version %u has %u", path, get32(b + 12),
                get32(b + 8), sections_of(get32(b + 8)));
  if (!s) s = sec_open(path, b, len, CK_HEADER, SEC_MODL, 0, &plen);
  if (!s && (plen < CK_MODL_FIXED || plen - CK_MODL_FIXED > (1u << 20)))
    s = DP_FAIL(DP_ERR_PARSE, "%s: section MODL: payload of %llu bytes", path,
                (unsigned long long)plen);
  if (!s) s = sec_body(path, b, len, CK_HEADER, SEC_MODL, plen, 0);
  dp_model *m = NULL;
  if (!s) {
    const unsigned char *mo = b + CK_HEADER + CK_SEC_HEAD;
    size_t tlen = (size_t)plen - CK_MODL_FIXED;
    char *text = malloc(tlen + 1);
    if (!text) {
      s = DP_FAIL(DP_ERR_NOMEM, "checkpoint: out of memory");
    } else {
      memcpy(text, mo + CK_MODL_FIXED, tlen);
      text[tlen] = '\0';
      if (get32(mo + 28) != tlen)
        s = DP_FAIL(DP_ERR_PARSE,
                    "%s: section MODL: its text length field is %u, its text %zu bytes",
                    path, get32(mo + 28), tlen);
      else if (strlen(text) != tlen)
        s = DP_FAIL(DP_ERR_PARSE, "%s: section MODL: a NUL byte at byte %zu of its text",
                    path, strlen(text));
      else if ((s = dp_model_parse(text, path, &m)))
        s = DP_FAIL(s, "%s: the model it holds: %s", path, dp_last_error());
      else if (dp_model_n_params(m) != get64(mo))
        s = DP_FAIL(DP_ERR_PARSE, "%s: section MODL: %llu parameters for a model of %zu",
                    path, (unsigned long long)get64(mo), dp_model_n_params(m));
      else
        s = check_least_size(path, m, get32(mo + 20), tlen, get32(b + 8), file_size);
      free(text);
    }
    if (!s && out) {
      out->version = get32(b + 8);
      out->n_params = get64(mo);
      out->seed = get64(mo + 8);
      out->optimizer = (dp_optimizer)get32(mo + 16);
      out->inference = (get32(mo + 24) & CK_FLAG_INFERENCE) != 0;
      out->amsgrad = (get32(mo + 24) & CK_FLAG_AMSGRAD) != 0;
      out->file_bytes = file_size;
    }
  }
  free(b);
  if (!s && model)
    *model = m;
  else
    dp_model_free(m);
  return s;
}

dp_status dp_ckpt_read_app(const char *path, void **app, size_t *bytes) {
  if (!app || !bytes) return DP_FAIL(DP_ERR_INVALID, "dp_ckpt_read_app: NULL argument");
  *app = NULL;
  *bytes = 0;
  if (!path || !*path)
    return DP_FAIL(DP_ERR_INVALID, "dp_ckpt_read_app: path is %s", path ? "empty" : "NULL");
  dp_ckpt_summary info;
  dp_status s = dp_ckpt_info(path, NULL, &info); /* header and MODL checked */
  if (s || info.version < 3) return s;           /* older files carry none */
  unsigned char *b = NULL;
  size_t len = 0, file_size = 0;
  if ((s = read_file(path, info.file_bytes, &b, &len, &file_size))) return s;
  /* walk the sections up to APPD, each one's length and checksum checked */
  size_t off = CK_HEADER;
  for (int i = SEC_MODL; i <= SEC_APPD && !s; i++) {
    uint64_t plen = 0;
    s = sec_open(path, b, len, off, i, 0, &plen);
    if (!s) s = sec_body(path, b, len, off, i, plen, 0);
    if (!s && i == SEC_APPD) {
      if (plen > CK_APP_MAX) {
        s = DP_FAIL(DP_ERR_PARSE, "%s: section APPD is larger than 16 MiB", path);
      } else if (plen) {
        if (!(*app = malloc((size_t)plen)))
          s = DP_FAIL(DP_ERR_NOMEM, "checkpoint: out of memory");
        else {
          memcpy(*app, b + off + CK_SEC_HEAD, (size_t)plen);
          *bytes = (size_t)plen;
        }
      }
    }
    off += sec_size(plen);
  }
  free(b);
  return s;
}
