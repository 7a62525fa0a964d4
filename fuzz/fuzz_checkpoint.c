/* libFuzzer harness: dp_ckpt_load (lib/format/checkpoint.c) on arbitrary bytes.
 *
 * The bytes are written to an in-memory file (memfd) and loaded into each of
 * the fixed contexts of ckpt_fixture.h (every optimizer-state layout). Then:
 *   - a refused load leaves the context exactly as it was: every arena byte
 *     and the step counter are compared with a snapshot, and the error says
 *     something;
 *   - an accepted load put the file's parameters on device 0 and its step in
 *     the counter; on some inputs (1 in 8, by hash) the context is saved
 *     again and the saved file must be byte-identical to the input (the format
 *     is canonical); then the context is restored from the snapshot so every
 *     input starts from the same state.
 * Checksums stop almost every mutation at the first section, so each input is
 * also loaded a second time "repaired": with every section checksum, the
 * whole-file checksum and the MODL text length recomputed from the sections'
 * own length fields. That reaches the structure, model, size and value checks
 * behind the checksums. */
#include "core/ctx.h"
#include "ckpt_fixture.h"
#include "fuzz_util.h"

static fixture fx[FIXTURE_N];
static unsigned char *snap[FIXTURE_N][DP_MAX_DEVICES];
static uint64_t snap_step[FIXTURE_N];
static int memfd = -1;
static char save_path[96]; /* where the load-save identity check saves */

static uint32_t get32(const uint8_t *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static uint64_t get64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
  return v;
}
static void put64(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void put32(uint8_t *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  for (int i = 0; i < FIXTURE_N; i++) {
    dp_status s = fixture_make(i, FIXTURE_MODEL, &fx[i]);
    if (!s) s = fixture_train(&fx[i], 2); /* non-trivial optimizer state */
    FUZZ_CHECK(s == DP_OK, "fixture %d: %s", i, dp_last_error());
    for (int d = 0; d < dp_plan_n_devices(fx[i].plan); d++) {
      size_t n = dp_plan_device_bytes(fx[i].plan, d);
      snap[i][d] = malloc(n ? n : 1);
      FUZZ_CHECK(snap[i][d] != NULL, "out of memory");
      memcpy(snap[i][d], fx[i].ctx->arena[d], n);
    }
    snap_step[i] = dp_ctx_step(fx[i].ctx);
  }
  const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(save_path, sizeof save_path, "%s/dp_fuzz_ckpt.%ld", base, (long)getpid());
  return 0;
}

/* Recomputes the checksums (and the MODL text length) of a copy of the input,
 * following the section length fields as far as they stay inside the bytes. */
static void repair(uint8_t *b, size_t n) {
  size_t off = 16;
  for (int i = 0; i < 5; i++) {
    if (n < 16 || n - off < 16 + 8) return;
    uint64_t plen = get64(b + off + 8);
    if (plen > n - off - 16 - 8) return;
    uint8_t *pay = b + off + 16;
    if (i == 0 && plen >= 32 && plen - 32 <= UINT32_MAX)
      put32(pay + 28, (uint32_t)(plen - 32));
    bool last = memcmp(b + off, "END ", 4) == 0 || i == 4;
    put64(pay + plen, fuzz_hash(last ? b : pay, last ? (size_t)(pay - b) : (size_t)plen));
    if (last) return;
    off += 16 + (size_t)plen + 8;
  }
}

static void restore(int i) {
  for (int d = 0; d < dp_plan_n_devices(fx[i].plan); d++)
    memcpy(fx[i].ctx->arena[d], snap[i][d], dp_plan_device_bytes(fx[i].plan, d));
  fx[i].ctx->step = snap_step[i];
  fx[i].ctx->replicas_stale = true;
}

static void check_unchanged(int i, const char *what) {
  for (int d = 0; d < dp_plan_n_devices(fx[i].plan); d++)
    FUZZ_CHECK(
        memcmp(fx[i].ctx->arena[d], snap[i][d], dp_plan_device_bytes(fx[i].plan, d)) == 0,
        "fixture %d, %s input: a refused load changed device %d's arena (%s)", i, what, d,
        dp_ctx_error(fx[i].ctx));
  FUZZ_CHECK(fx[i].ctx->step == snap_step[i],
             "fixture %d: a refused load changed the step counter", i);
}

/* The loaded parameters are the file's PARM payload (found by its tag). */
static void check_loaded(int i, const uint8_t *b, size_t n, uint64_t h) {
  dp_ctx *c = fx[i].ctx;
  size_t np = dp_model_n_params(fx[i].model);
  const uint8_t *parm = NULL, *step = NULL, *appd = NULL;
  size_t appd_n = 0;
  for (size_t off = 16; off + 16 <= n;) {
    uint64_t plen = get64(b + off + 8);
    if (memcmp(b + off, "PARM", 4) == 0) parm = b + off + 16;
    if (memcmp(b + off, "STEP", 4) == 0) step = b + off + 16;
    if (memcmp(b + off, "APPD", 4) == 0) appd = b + off + 16, appd_n = (size_t)plen;
    if (plen > n) break;
    off += 16 + (size_t)plen + 8;
  }
  FUZZ_CHECK(parm && step, "an accepted file has no PARM or STEP section");
  float got[64];
  FUZZ_CHECK(np <= 64 && dp_get_params(c, got, np) == DP_OK, "dp_get_params");
  FUZZ_CHECK(memcmp(got, parm, np * 4) == 0,
             "fixture %d: loaded parameters differ from the file", i);
  FUZZ_CHECK(dp_ctx_step(c) == get64(step), "fixture %d: step %llu, file says %llu", i,
             (unsigned long long)dp_ctx_step(c), (unsigned long long)get64(step));
  /* An inference context saves a parameters-only file, whatever it loaded; a
   * file of versions 1 to 3 is saved as version 4 (a rate, an APPD section, a
   * momentum added): the identity holds for files of the current version,
   * saved again with their application data. */
  if (h % 8 == 0 && !dp_plan_config(fx[i].plan)->inference && get32(b + 8) == 4) {
    const char *path = save_path; /* removed right after: nothing is left behind */
    dp_status s = dp_ckpt_save_app(c, path, appd, appd_n);
    FUZZ_CHECK(s == DP_OK, "saving what was loaded: %s", dp_ctx_error(c));
    FILE *f = fopen(path, "rb");
    FUZZ_CHECK(f != NULL, "cannot reopen %s", path);
    uint8_t *back = malloc(n + 1);
    FUZZ_CHECK(back != NULL, "out of memory");
    size_t got_n = fread(back, 1, n + 1, f);
    fclose(f);
    unlink(path);
    fuzz_count("load-save identity checked");
    FUZZ_CHECK(got_n == n && memcmp(back, b, n) == 0,
               "fixture %d: load then save is not the identity (%zu bytes, saved %zu)", i,
               n, got_n);
    free(back);
  }
}

static void load_all(const uint8_t *b, size_t n, bool repaired, uint64_t h) {
  const char *what = repaired ? "repaired" : "raw";
  char path[32];
  if (fuzz_memfile("fuzz_ckpt", b, n, path, sizeof path, &memfd) < 0) abort();
  for (int i = 0; i < FIXTURE_N; i++) {
    dp_status s = dp_ckpt_load(fx[i].ctx, path);
    fuzz_count(s == DP_OK ? (repaired ? "accepted (repaired)" : "accepted (raw)")
                          : (repaired ? "refused (repaired)" : "refused (raw)"));
    if (s != DP_OK) {
      FUZZ_CHECK(s == DP_ERR_PARSE || s == DP_ERR_INVALID || s == DP_ERR_IO ||
                     s == DP_ERR_OVERFLOW || s == DP_ERR_NONFINITE,
                 "fixture %d: unexpected status %s: %s", i, dp_status_name(s),
                 dp_ctx_error(fx[i].ctx));
      FUZZ_CHECK(dp_ctx_error(fx[i].ctx)[0] != '\0', "refused without a message");
      check_unchanged(i, what);
      continue;
    }
    check_loaded(i, b, n, h);
    restore(i);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint64_t h = fuzz_hash(data, size);
  load_all(data, size, false, h);
  uint8_t *fixed = malloc(size ? size : 1);
  if (!fixed) return 0;
  memcpy(fixed, data, size);
  repair(fixed, size);
  if (size == 0 || memcmp(fixed, data, size) != 0) load_all(fixed, size, true, h);
  free(fixed);
  return 0;
}
