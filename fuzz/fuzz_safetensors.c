/* libFuzzer harness: dp_ckpt_import_safetensors (lib/format/safetensors.c) on
 * arbitrary bytes.
 *
 * The bytes are written to an in-memory file (memfd) and imported into two
 * fixed contexts of one small model with every kind of tensor (linear with and
 * without a bias, layernorm): a 2-device training context with optimizer state
 * and an inference context. Then:
 *   - a refused import leaves the context exactly as it was: every arena byte,
 *     the step counter and the parameters' hash are compared with a snapshot;
 *     the status is one that a bad file may get and the error says something;
 *   - an accepted import put finite values only, and each tensor's values are
 *     a contiguous run of the file's data (after the header): nothing came
 *     from anywhere else; the context's own export then imports back to the
 *     same bits; the context is restored from the snapshot afterwards so every
 *     input starts from the same state.
 * The 8-byte header length stops most mutations of the JSON text at once, so
 * each input is also imported a second time "repaired": with the length set
 * to end at the brace that closes the header's top-level object (strings and
 * escapes followed). That reaches the JSON reader and the tensor checks.
 * Each file is also read by dp_safetensors_read_meta (check_meta). */
#include "core/ctx.h"
#include "fuzz_util.h"

#include <math.h>

#define ST_MODEL "input 3\nlinear 4\nlayernorm\ngelu\nlinear 2 nobias\nloss mse\n"
#define N_CTX 2
#define MAX_NP 64

typedef struct {
  dp_model *model;
  dp_plan *plan;
  dp_ctx *ctx;
  unsigned char *snap[DP_MAX_DEVICES];
  uint64_t step, hash;
} fixture;

static fixture fx[N_CTX];
static int memfd = -1;
static char export_path[96]; /* where an accepted context's own export goes */

static void put64(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
  return v;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  for (int i = 0; i < N_CTX; i++) {
    fixture *f = &fx[i];
    dp_config c;
    dp_config_default(&c);
    c.batch = 8;
    c.seed = 7;
    if (i == 0) {
      dp_config_set_optimizer(&c, DP_OPT_MOMENTUM);
      c.n_devices = 2;
      c.guards = 1;
    } else {
      c.inference = 1;
    }
    dp_status s = dp_model_parse(ST_MODEL, "fuzz.dpm", &f->model);
    if (!s) s = dp_plan_create(f->model, &c, &f->plan);
    if (!s) s = dp_ctx_create(f->plan, &f->ctx);
    if (!s && i == 0) { /* non-trivial optimizer state */
      float x[8 * 3], t[8 * 2];
      for (int k = 0; k < 8 * 3; k++) x[k] = (float)((k * 7) % 11) / 11.0f - 0.5f;
      for (int k = 0; k < 8 * 2; k++) t[k] = (float)((k * 5) % 3) - 1.0f;
      for (int k = 0; k < 2 && !s; k++) s = dp_train_step(f->ctx, 8, 3, x, t, NULL);
    }
    FUZZ_CHECK(s == DP_OK, "fixture %d: %s", i, dp_last_error());
    FUZZ_CHECK(dp_model_n_params(f->model) <= MAX_NP, "fixture %d: too many parameters", i);
    for (int d = 0; d < dp_plan_n_devices(f->plan); d++) {
      size_t n = dp_plan_device_bytes(f->plan, d);
      f->snap[d] = malloc(n ? n : 1);
      FUZZ_CHECK(f->snap[d] != NULL, "out of memory");
      memcpy(f->snap[d], f->ctx->arena[d], n);
    }
    f->step = dp_ctx_step(f->ctx);
    f->hash = dp_params_hash(f->ctx);
  }
  const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(export_path, sizeof export_path, "%s/dp_fuzz_st.%ld", base, (long)getpid());
  return 0;
}

/* Sets the header length to end at the brace closing the top-level object. */
static void repair(uint8_t *b, size_t n) {
  if (n < 9 || b[8] != '{') return;
  int depth = 0;
  bool str = false, esc = false;
  for (size_t i = 8; i < n; i++) {
    uint8_t ch = b[i];
    if (str) {
      if (esc)
        esc = false;
      else if (ch == '\\')
        esc = true;
      else if (ch == '"')
        str = false;
      continue;
    }
    if (ch == '"') str = true;
    if (ch == '{' || ch == '[') depth++;
    if ((ch == '}' || ch == ']') && --depth == 0) {
      put64(b, i + 1 - 8);
      return;
    }
  }
}

static void restore(fixture *f) {
  for (int d = 0; d < dp_plan_n_devices(f->plan); d++)
    memcpy(f->ctx->arena[d], f->snap[d], dp_plan_device_bytes(f->plan, d));
  f->ctx->step = f->step;
  f->ctx->replicas_stale = true;
}

static void check_unchanged(int i, const char *what) {
  fixture *f = &fx[i];
  for (int d = 0; d < dp_plan_n_devices(f->plan); d++)
    FUZZ_CHECK(memcmp(f->ctx->arena[d], f->snap[d], dp_plan_device_bytes(f->plan, d)) == 0,
               "context %d, %s input: a refused import changed device %d's arena (%s)", i,
               what, d, dp_ctx_error(f->ctx));
  FUZZ_CHECK(f->ctx->step == f->step, "context %d: a refused import changed the step", i);
  FUZZ_CHECK(dp_params_hash(f->ctx) == f->hash,
             "context %d: a refused import changed the parameters", i);
}

/* What an accepted import must have put in the context. */
static void check_accepted(int i, const uint8_t *b, size_t n) {
  fixture *f = &fx[i];
  dp_ctx *c = f->ctx;
  size_t np = dp_model_n_params(f->model);
  float got[MAX_NP];
  FUZZ_CHECK(dp_get_params(c, got, np) == DP_OK, "dp_get_params: %s", dp_ctx_error(c));
  for (size_t e = 0; e < np; e++)
    FUZZ_CHECK(isfinite(got[e]), "context %d: parameter %zu is not finite after import", i,
               e);
  /* each tensor is a run of the data section's bytes */
  FUZZ_CHECK(n >= 8 && get64(b) <= n - 8, "accepted a file whose header runs past its end");
  const uint8_t *data = b + 8 + get64(b);
  size_t dlen = n - 8 - (size_t)get64(b);
  for (int k = 0; k < dp_model_n_tensors(f->model); k++) {
    dp_tensor_info t;
    FUZZ_CHECK(dp_model_tensor(f->model, k, &t) == DP_OK, "dp_model_tensor");
    uint8_t le[MAX_NP * 4];
    for (size_t e = 0; e < t.numel; e++) {
      uint32_t u;
      memcpy(&u, &got[t.offset + e], 4);
      for (int q = 0; q < 4; q++) le[4 * e + q] = (uint8_t)(u >> (8 * q));
    }
    FUZZ_CHECK(memmem(data, dlen, le, t.numel * 4) != NULL,
               "context %d: tensor %s's values are not in the file's data", i, t.name);
  }
  fuzz_count("accepted: values checked");
  /* the context's own export imports back to the same bits */
  uint64_t h = dp_params_hash(c);
  dp_status s = dp_ckpt_export_safetensors(c, export_path);
  FUZZ_CHECK(s == DP_OK, "exporting what was imported: %s", dp_ctx_error(c));
  restore(f);
  s = dp_ckpt_import_safetensors(c, export_path);
  unlink(export_path);
  FUZZ_CHECK(s == DP_OK, "importing the export of what was imported: %s", dp_ctx_error(c));
  FUZZ_CHECK(dp_params_hash(c) == h, "context %d: export then import is not the identity",
             i);
}

/* dp_safetensors_read_meta on the same file: a refusal (a documented status,
 * a message naming the file) leaves NULL and 0; an answer is pairs of strings
 * inside its one block, none empty-keyed twice. */
static void check_meta(const char *path) {
  dp_meta *m = (dp_meta *)&m;
  int n = -1;
  dp_status s = dp_safetensors_read_meta(path, &m, &n);
  fuzz_count(s == DP_OK ? "metadata read" : "metadata refused");
  if (s != DP_OK) {
    FUZZ_CHECK(s == DP_ERR_PARSE || s == DP_ERR_IO || s == DP_ERR_NOMEM,
               "metadata: unexpected status %s: %s", dp_status_name(s), dp_last_error());
    FUZZ_CHECK(m == NULL && n == 0, "a refused read left pairs");
    FUZZ_CHECK(strstr(dp_last_error(), path) != NULL, "metadata: no file in '%s'",
               dp_last_error());
    return;
  }
  FUZZ_CHECK(n >= 0 && (n == 0) == (m == NULL), "%d pairs at %p", n, (void *)m);
  for (int i = 0; i < n; i++) {
    FUZZ_CHECK(m[i].key && m[i].value, "pair %d has a NULL string", i);
    FUZZ_CHECK((const void *)m[i].key > (const void *)(m + n - 1) &&
                   (const void *)m[i].value > (const void *)(m + n - 1),
               "pair %d points outside its block", i);
    for (int j = 0; j < i; j++)
      FUZZ_CHECK(strcmp(m[i].key, m[j].key) != 0, "key '%s' twice", m[i].key);
  }
  free(m);
}

static void import_all(const uint8_t *b, size_t n, bool repaired) {
  const char *what = repaired ? "repaired" : "raw";
  char path[32];
  if (fuzz_memfile("fuzz_st", b, n, path, sizeof path, &memfd) < 0) abort();
  for (int i = 0; i < N_CTX; i++) {
    dp_status s = dp_ckpt_import_safetensors(fx[i].ctx, path);
    fuzz_count(s == DP_OK            ? (repaired ? "accepted (repaired)" : "accepted (raw)")
               : s == DP_ERR_PARSE   ? "refused: parse"
               : s == DP_ERR_INVALID ? "refused: invalid"
               : s == DP_ERR_SHAPE   ? "refused: shape"
                                     : "refused: other");
    if (s != DP_OK) {
      FUZZ_CHECK(s == DP_ERR_PARSE || s == DP_ERR_INVALID || s == DP_ERR_SHAPE ||
                     s == DP_ERR_NONFINITE,
                 "context %d: unexpected status %s: %s", i, dp_status_name(s),
                 dp_ctx_error(fx[i].ctx));
      FUZZ_CHECK(dp_ctx_error(fx[i].ctx)[0] != '\0', "refused without a message");
      check_unchanged(i, what);
      continue;
    }
    check_accepted(i, b, n);
    restore(&fx[i]);
  }
  check_meta(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  import_all(data, size, false);
  uint8_t *fixed = malloc(size ? size : 1);
  if (!fixed) return 0;
  memcpy(fixed, data, size);
  repair(fixed, size);
  if (size >= 8 && memcmp(fixed, data, size) != 0) import_all(fixed, size, true);
  free(fixed);
  return 0;
}
