/* Checkpoint tests: dp_ckpt_save / dp_ckpt_load (format: docs/CHECKPOINT.md).
 *
 *   resume     save at step 20, load into a fresh context (same or another
 *              device count or mode), run to 50: the same bits as 50 straight
 *              steps (momentum, AdamW; a model with dropout)
 *   format     the file's layout, read back by hand; the bytes do not depend
 *              on the device count or mode (logical optimizer-state layout);
 *              every reader takes versions 1, 2 and 3
 *   inference  an inference context saves and loads parameters only
 *   damage     every truncation and a flipped bit in every byte is refused,
 *              the context bytewise unchanged and its next step as an
 *              untouched context's; behind repaired checksums, values no
 *              training produces (a negative AdamW v, a step above 2^53) are
 *              refused and every other mutation is read exactly
 *   crash      a saving child SIGKILLed at random times leaves a loadable file
 *   mismatch   model, optimizer, seed, kind of context; I/O errors
 *
 * lib/core/ctx.h is used to snapshot a context's arenas and to inject a fault.
 */
#include "dp.h"
#include "core/ctx.h"
#include "helpers.h"

#include <check.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char MLP_SPEC[] = "input 12\n"
                               "linear 16\nlayernorm\ngelu\ndropout 0.2\n"
                               "linear 16\ntanh\n"
                               "linear 5\n"
                               "loss softmax_cross_entropy\n";
static const char MLP17_SPEC[] = "input 12\n"
                                 "linear 17\nlayernorm\ngelu\ndropout 0.2\n"
                                 "linear 16\ntanh\n"
                                 "linear 5\n"
                                 "loss softmax_cross_entropy\n";
/* About 85k parameters: an AdamW checkpoint of 1 MB, so a kill often lands
 * in the middle of writing it. */
static const char BIG_SPEC[] = "input 64\nlinear 256\nrelu\nlinear 256\nrelu\nlinear 10\n"
                               "loss softmax_cross_entropy\n";

#define BATCH 32
#define MICRO 4
#define SAVE_AT 20
#define TOTAL 50

/* ---- helpers ------------------------------------------------------------------ */

typedef struct {
  int n_devices;
  dp_mode mode;
  int shard;
} layout;

/* The configs here: BATCH rows in micro-batches of MICRO, seed 7, SGD and
 * momentum at 0.05, AdamW at 0.003; the optimizer and the layout (n_devices,
 * mode, shard) are each test's: CK_CFG(DP_OPT_ADAMW, .n_devices = 2). */
#define LR(o) ((o) == DP_OPT_ADAMW ? 0.003f : 0.05f)
#define CK_CFG(o, ...)                                                                     \
  CFG(.batch = BATCH, .micro_batch = MICRO, .seed = 7, .opt = (o), .lr = LR(o), __VA_ARGS__)
/* A layout as CK_CFG's fields. */
#define LAYOUT(l) .n_devices = (l).n_devices, .mode = (l).mode, .shard = (l).shard

static void save_ok(rig *r, const char *path) {
  dp_status s = dp_ckpt_save(r->c, path);
  ck_assert_msg(s == DP_OK, "save %s: %s: %s", path, dp_status_name(s), dp_ctx_error(r->c));
}

static void load_ok(rig *r, const char *path) {
  dp_status s = dp_ckpt_load(r->c, path);
  ck_assert_msg(s == DP_OK, "load %s: %s: %s", path, dp_status_name(s), dp_ctx_error(r->c));
}

/* Everything a refused load must leave alone: every arena byte, the step
 * counter and whether replicas must be refreshed. */
static bool snap_same(const ctx_snap *s, rig *r) {
  for (int d = 0; d < s->n_dev; d++)
    if (memcmp(s->arena[d], r->c->arena[d], s->bytes[d]) != 0) return false;
  return s->step == r->c->step && s->stale == r->c->replicas_stale;
}

static const char *opt_str(dp_optimizer o) {
  return o == DP_OPT_ADAMW ? "adamw" : o == DP_OPT_MOMENTUM ? "momentum" : "sgd";
}

/* ---- resume ------------------------------------------------------------------- */

static const struct {
  layout save, load;
} RESUME[] = {
    {{1, DP_MODE_CLASSIC, 0}, {1, DP_MODE_CLASSIC, 0}},
    {{1, DP_MODE_CLASSIC, 0}, {4, DP_MODE_CLASSIC, 0}},
    {{4, DP_MODE_CLASSIC, 0}, {2, DP_MODE_CLASSIC, 0}},
    {{1, DP_MODE_CLASSIC, 0}, {4, DP_MODE_ALLREDUCE, 1}},
    {{4, DP_MODE_ALLREDUCE, 1}, {2, DP_MODE_ALLREDUCE, 0}},
    {{2, DP_MODE_ALLREDUCE, 0}, {1, DP_MODE_CLASSIC, 0}},
};
#define N_RESUME ((int)(sizeof RESUME / sizeof RESUME[0]))
static const dp_optimizer OPTS[] = {DP_OPT_SGD, DP_OPT_MOMENTUM, DP_OPT_ADAMW};

/* "Save at step 20, load into a fresh context, run to 50: identical to 50
 * straight steps." The straight run is one device; micro-batches are fixed,
 * so every device count and mode gives its bits. */
START_TEST(test_resume_equals_straight_run) {
  dp_optimizer opt = OPTS[1 + _i % 2]; /* momentum, adamw (sgd has no state) */
  layout ls = RESUME[_i / 2].save, ll = RESUME[_i / 2].load;
  dp_config cs = CK_CFG(opt, LAYOUT(ls)), cl = CK_CFG(opt, LAYOUT(ll)),
            c1 = CK_CFG(opt, .n_devices = 1);
  rig straight, a, b;
  if (!rig_try(&a, MLP_SPEC, &cs)) {
    printf("skipped: resume %s, mode %d: %s\n", opt_str(opt), (int)ls.mode,
           dp_last_error());
    return;
  }
  if (!rig_try(&b, MLP_SPEC, &cl)) {
    printf("skipped: resume %s, mode %d: %s\n", opt_str(opt), (int)ll.mode,
           dp_last_error());
    rig_close(&a);
    return;
  }
  rig_open(&straight, MLP_SPEC, &c1);
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "model.ckpt");

  run_steps(&straight, 0, TOTAL);
  run_steps(&a, 0, SAVE_AT);
  save_ok(&a, t.path);
  load_ok(&b, t.path);
  ck_assert_uint_eq(dp_ctx_step(b.c), SAVE_AT);
  assert_same_params(&a, &b, "just loaded");
  run_steps(&b, SAVE_AT, TOTAL);
  ck_assert_uint_eq(dp_ctx_step(b.c), TOTAL);
  assert_same_params(&straight, &b, "resumed vs straight");
  /* Saving changed nothing in the saving context. */
  run_steps(&a, SAVE_AT, TOTAL);
  assert_same_params(&straight, &a, "saver vs straight");

  tmp_done(&t);
  rig_close(&straight);
  rig_close(&a);
  rig_close(&b);
}
END_TEST

/* Shared parameters (the cpu backend's params=shared: only device 0 holds
 * them): a checkpoint saved from 4 such devices resumes on 2 such devices and
 * on 2 with copies, each identical to the straight run. */
START_TEST(test_resume_with_shared_params) {
  dp_config cs = CK_CFG(DP_OPT_MOMENTUM, .n_devices = 4),
            cl = CK_CFG(DP_OPT_MOMENTUM, .n_devices = 2),
            c1 = CK_CFG(DP_OPT_MOMENTUM, .n_devices = 1);
  snprintf(cs.backend_options, sizeof cs.backend_options, "params=shared");
  rig straight, a, b[2];
  rig_open(&straight, MLP_SPEC, &c1);
  rig_open(&a, MLP_SPEC, &cs);
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "model.ckpt");
  run_steps(&straight, 0, TOTAL);
  run_steps(&a, 0, SAVE_AT);
  save_ok(&a, t.path);
  for (int k = 0; k < 2; k++) {
    snprintf(cl.backend_options, sizeof cl.backend_options, "params=%s",
             k ? "copy" : "shared");
    rig_open(&b[k], MLP_SPEC, &cl);
    load_ok(&b[k], t.path);
    assert_same_params(&a, &b[k], "just loaded");
    run_steps(&b[k], SAVE_AT, TOTAL);
    assert_same_params(&straight, &b[k], k ? "copies resumed" : "shared resumed");
    rig_close(&b[k]);
  }
  run_steps(&a, SAVE_AT, TOTAL);
  assert_same_params(&straight, &a, "saver vs straight");
  tmp_done(&t);
  rig_close(&straight);
  rig_close(&a);
}
END_TEST

/* dp_ckpt_bytes is the size of the file a save writes: every optimizer (state
 * vectors), with and without application data, an inference context. */
START_TEST(test_ckpt_bytes_is_the_file_size) {
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "size.ckpt");
  char app[300];
  memset(app, 'a', sizeof app);
  for (int k = 0; k < 4; k++) {
    dp_config c = CK_CFG(OPTS[k % 3], .n_devices = 2);
    c.inference = k == 3;
    rig r;
    rig_open(&r, MLP_SPEC, &c);
    for (size_t n = 0; n <= sizeof app; n += sizeof app) {
      ck_assert_int_eq(dp_ckpt_save_app(r.c, t.path, n ? app : NULL, n), DP_OK);
      struct stat st;
      ck_assert_int_eq(stat(t.path, &st), 0);
      ck_assert_uint_eq(dp_ckpt_bytes(r.c, n), (size_t)st.st_size);
    }
    rig_close(&r);
  }
  ck_assert_uint_eq(dp_ckpt_bytes(NULL, 0), 0);
  /* application data past size_t: no size that wraps round to a small one */
  dp_config c = CK_CFG(OPTS[0], .n_devices = 2);
  rig r;
  rig_open(&r, MLP_SPEC, &c);
  ck_assert_uint_eq(dp_ckpt_bytes(r.c, SIZE_MAX), SIZE_MAX);
  ck_assert_uint_eq(dp_ckpt_bytes(r.c, SIZE_MAX - 100), SIZE_MAX);
  rig_close(&r);
  tmp_done(&t);
}
END_TEST

/* Loading over a context that has trained (state, step and replicas all set)
 * gives the same as loading into a fresh one. */
START_TEST(test_load_over_trained_context) {
  dp_config c4 = CK_CFG(DP_OPT_ADAMW, .n_devices = 4),
            c1 = CK_CFG(DP_OPT_ADAMW, .n_devices = 1);
  rig straight, a, b;
  rig_open(&straight, MLP_SPEC, &c1);
  rig_open(&a, MLP_SPEC, &c1);
  rig_open(&b, MLP_SPEC, &c4);
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "model.ckpt");
  run_steps(&straight, 0, 30);
  run_steps(&a, 0, 10);
  save_ok(&a, t.path);
  run_steps(&b, 100, 137); /* other data, a later step */
  load_ok(&b, t.path);
  ck_assert_uint_eq(dp_ctx_step(b.c), 10);
  run_steps(&b, 10, 30);
  assert_same_params(&straight, &b, "loaded over a trained context");
  tmp_done(&t);
  rig_close(&straight);
  rig_close(&a);
  rig_close(&b);
}
END_TEST

/* ---- format --------------------------------------------------------------------- */

START_TEST(test_format_is_as_documented) {
  dp_config cfg = CK_CFG(DP_OPT_ADAMW, .n_devices = 2);
  rig r;
  rig_open(&r, MLP_SPEC, &cfg);
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "model.ckpt");
  run_steps(&r, 0, 3);
  static const char app[] = "epoch=3 mean=0.5";
  ck_assert_int_eq(dp_ckpt_save_app(r.c, t.path, app, sizeof app - 1), DP_OK);
  size_t len;
  unsigned char *b = file_read(t.path, &len);
  ck_assert(len >= 16);
  ck_assert(memcmp(b, "DPCKPT\0\1", 8) == 0);
  ck_assert_uint_eq(le32(b + 8), 4);
  ck_assert_uint_eq(le32(b + 12), 6);
  static const char *tags[6] = {"MODL", "STEP", "PARM", "OPTS", "APPD", "END "};
  size_t off = 16, n = r.np;
  float *params = params_of(&r);
  for (int i = 0; i < 6; i++) {
    ck_assert(off + 24 <= len);
    ck_assert_msg(memcmp(b + off, tags[i], 4) == 0, "section %d", i);
    ck_assert_uint_eq(le32(b + off + 4), 0);
    uint64_t pl = le64(b + off + 8);
    ck_assert(off + 24 + pl <= len);
    const unsigned char *pay = b + off + 16;
    if (i < 5) ck_assert_uint_eq(le64(pay + pl), dp_hash_bytes(pay, pl));
    switch (i) {
    case 0: {
      char text[1024];
      size_t tl = dp_model_format(r.m, text, sizeof text);
      ck_assert_uint_eq(pl, 32 + tl);
      ck_assert_uint_eq(le64(pay), n);
      ck_assert_uint_eq(le64(pay + 8), 7);
      ck_assert_uint_eq(le32(pay + 16), DP_OPT_ADAMW);
      ck_assert_uint_eq(le32(pay + 20), 2);
      ck_assert_uint_eq(le32(pay + 24), 0);
      ck_assert_uint_eq(le32(pay + 28), tl);
      ck_assert(memcmp(pay + 32, text, tl) == 0);
      break;
    }
    case 1: { /* the step, the rate and the momentum (AdamW's beta1) in effect */
      ck_assert_uint_eq(pl, 16);
      ck_assert_uint_eq(le64(pay), 3);
      uint32_t u;
      memcpy(&u, &cfg.lr, 4);
      ck_assert_uint_eq(le32(pay + 8), u);
      memcpy(&u, &cfg.beta1, 4);
      ck_assert_uint_eq(le32(pay + 12), u);
      break;
    }
    case 2:
      ck_assert_uint_eq(pl, n * 4);
      for (size_t e = 0; e < n; e++) {
        uint32_t u;
        memcpy(&u, &params[e], 4);
        ck_assert_uint_eq(le32(pay + 4 * e), u);
      }
      break;
    case 3: ck_assert_uint_eq(pl, 2 * n * 4); break;
    case 4: /* the application's bytes, as given */
      ck_assert_uint_eq(pl, sizeof app - 1);
      ck_assert(memcmp(pay, app, pl) == 0);
      break;
    case 5:
      ck_assert_uint_eq(pl, 0);
      ck_assert_uint_eq(le64(pay), dp_hash_bytes(b, off + 16));
      ck_assert_uint_eq(off + 24, len);
      break;
    }
    off += 24 + pl;
  }
  free(params);
  free(b);
  /* read back without a context; a plain save carries none */
  void *got = NULL;
  size_t got_n = 0;
  ck_assert_int_eq(dp_ckpt_read_app(t.path, &got, &got_n), DP_OK);
  ck_assert_uint_eq(got_n, sizeof app - 1);
  ck_assert(got && memcmp(got, app, got_n) == 0);
  free(got);
  save_ok(&r, t.path);
  ck_assert_int_eq(dp_ckpt_read_app(t.path, &got, &got_n), DP_OK);
  ck_assert(got == NULL && got_n == 0);
  ck_assert_int_eq(dp_ckpt_save_app(r.c, t.path, NULL, 5), DP_ERR_INVALID);
  ck_assert_int_eq(dp_ckpt_save_app(r.c, t.path, app, (size_t)17 << 20), DP_ERR_INVALID);
  tmp_done(&t);
  rig_close(&r);
}
END_TEST

/* Version 2 carries the learning rate in effect (dp_set_lr): a load restores it, and
 * AdamW refuses one whose product with the loading context's weight_decay is above
 * 1; a version 1 file (no rate) still loads and leaves the context's own rate. */
START_TEST(test_rate_in_effect_round_trips_and_version_1_still_loads) {
  dp_config cfg = CK_CFG(DP_OPT_ADAMW, .n_devices = 2);
  rig a, b;
  rig_open(&a, MLP_SPEC, &cfg);
  rig_open(&b, MLP_SPEC, &cfg);
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "model.ckpt");
  run_steps(&a, 0, 2);
  ck_assert_int_eq(dp_set_lr(a.c, 0.00125f), DP_OK);
  save_ok(&a, t.path);
  ck_assert_int_eq(dp_ckpt_load(b.c, t.path), DP_OK);
  ck_assert(dp_ctx_lr(b.c) == 0.00125f);
  run_steps(&a, 2, 4);
  run_steps(&b, 2, 4);
  ck_assert_uint_eq(dp_params_hash(a.c), dp_params_hash(b.c));
  /* AdamW: the saved rate times a larger weight_decay above 1 is refused */
  dp_config big = cfg;
  big.lr = 0.001f;
  big.weight_decay = 900.0f; /* 0.00125 * 900 > 1, 0.001 * 900 < 1 */
  rig c;
  rig_open(&c, MLP_SPEC, &big);
  uint64_t h = dp_params_hash(c.c);
  ck_assert_int_eq(dp_ckpt_load(c.c, t.path), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_ctx_error(c.c), "weight_decay"), "%s", dp_ctx_error(c.c));
  ck_assert_uint_eq(dp_params_hash(c.c), h);
  ck_assert(dp_ctx_lr(c.c) == 0.001f);
  rig_close(&c);
  /* the same file as version 1: no APPD, STEP without the rate, checksums redone */
  size_t len;
  unsigned char *v2 = file_read(t.path, &len);
  ck_assert_uint_eq(le64(v2 + len - 48 + 8), 0); /* an empty APPD before END: drop it */
  memmove(v2 + len - 48, v2 + len - 24, 24);
  len -= 24;
  v2[12] = 5; /* sections */
  size_t modl_len = (size_t)le64(v2 + 16 + 8), step_sec = 16 + 24 + modl_len;
  unsigned char *v1 = malloc(len);
  ck_assert_ptr_nonnull(v1);
  memcpy(v1, v2, step_sec + 16 + 8);                 /* header, MODL, STEP's head + step */
  memcpy(v1 + step_sec + 24 + 8, v2 + step_sec + 40, /* the rest, after STEP's checksum */
         len - (step_sec + 40));
  size_t n1 = len - 8;
  v1[8] = 1; /* version */
  for (int i = 0; i < 8; i++)
    v1[step_sec + 8 + i] = (unsigned char)((uint64_t)8 >> (8 * i)); /* L */
  uint64_t hs = dp_hash_bytes(v1 + step_sec + 16, 8);
  for (int i = 0; i < 8; i++) v1[step_sec + 24 + i] = (unsigned char)(hs >> (8 * i));
  uint64_t he = dp_hash_bytes(v1, n1 - 8);
  for (int i = 0; i < 8; i++) v1[n1 - 8 + i] = (unsigned char)(he >> (8 * i));
  char p1[512];
  snprintf(p1, sizeof p1, "%s.v1", t.path);
  file_write(p1, v1, n1);
  rig d;
  rig_open(&d, MLP_SPEC, &cfg);
  ck_assert_msg(dp_ckpt_load(d.c, p1) == DP_OK, "%s", dp_ctx_error(d.c));
  ck_assert(dp_ctx_lr(d.c) == cfg.lr); /* no rate in the file: its own */
  ck_assert_uint_eq(dp_ctx_step(d.c), 2);
  unlink(p1);
  free(v1);
  free(v2);
  rig_close(&d);
  tmp_done(&t);
  rig_close(&a);
  rig_close(&b);
}
END_TEST

/* The same training state saved from 1, 2, 4 devices (and the allreduce
 * modes, where built) gives the same file bytes. */
START_TEST(test_file_bytes_independent_of_devices_and_mode) {
  static const layout ls[] = {{1, DP_MODE_CLASSIC, 0},   {2, DP_MODE_CLASSIC, 0},
                              {4, DP_MODE_CLASSIC, 0},   {4, DP_MODE_ALLREDUCE, 0},
                              {4, DP_MODE_ALLREDUCE, 1}, {2, DP_MODE_ALLREDUCE, 1}};
  dp_optimizer opt = OPTS[_i];
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "model.ckpt");
  unsigned char *ref = NULL;
  size_t ref_len = 0;
  for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
    dp_config cfg = CK_CFG(opt, LAYOUT(ls[i]));
    rig r;
    if (!rig_try(&r, MLP_SPEC, &cfg)) continue; /* a mode this build lacks */
    run_steps(&r, 0, 5);
    save_ok(&r, t.path);
    size_t len;
    unsigned char *b = file_read(t.path, &len);
    if (!ref) {
      ref = b;
      ref_len = len;
    } else {
      ck_assert_msg(len == ref_len && memcmp(b, ref, len) == 0,
                    "%s: %d devices, mode %d, shard %d: file differs from 1 device's",
                    opt_str(opt), ls[i].n_devices, (int)ls[i].mode, ls[i].shard);
      free(b);
    }
    rig_close(&r);
  }
  free(ref);
  tmp_done(&t);
}
END_TEST

/* ---- inference ------------------------------------------------------------------ */

START_TEST(test_inference_context_takes_parameters_only) {
  dp_config ct = CK_CFG(DP_OPT_ADAMW, .n_devices = 1),
            ci = CK_CFG(DP_OPT_ADAMW, .n_devices = 2);
  ci.inference = 1;
  dp_config_set_optimizer(&ci, DP_OPT_SGD); /* ignored by an inference context */
  ci.seed = 99;                             /* likewise */
  rig tr, inf, inf2;
  rig_open(&tr, MLP_SPEC, &ct);
  rig_open(&inf, MLP_SPEC, &ci);
  rig_open(&inf2, MLP_SPEC, &ci);
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "model.ckpt");
  run_steps(&tr, 0, 20);
  save_ok(&tr, t.path);
  load_ok(&inf, t.path);
  assert_same_params(&tr, &inf, "training checkpoint into inference context");
  ck_assert_uint_eq(dp_ctx_step(inf.c), 20);
  /* an inference config naming Adam (amsgrad too) keeps no state either: the
   * load takes the parameters (test_oom found it looking for the state) */
  for (int ams = 0; ams < 2; ams++) {
    dp_config ca = ci;
    dp_config_set_optimizer(&ca, DP_OPT_ADAM);
    ca.amsgrad = ams;
    rig ia;
    rig_open(&ia, MLP_SPEC, &ca);
    load_ok(&ia, t.path);
    assert_same_params(&tr, &ia, "training checkpoint into an Adam inference context");
    rig_close(&ia);
  }

  /* Forward results: the loaded replicas, not the initial ones. */
  float x[BATCH * 12], y1[BATCH * 5], y2[BATCH * 5];
  uint64_t s = 5;
  for (int i = 0; i < BATCH * 12; i++) x[i] = (float)(rng_next(&s) >> 40) * 0x1p-23f - 1.0f;
  ck_assert_int_eq(dp_forward(tr.c, BATCH, 12, x, y1), DP_OK);
  ck_assert_int_eq(dp_forward(inf.c, BATCH, 12, x, y2), DP_OK);
  ck_assert(memcmp(y1, y2, sizeof y1) == 0);

  /* An inference context's own checkpoint: parameters, no state. */
  save_ok(&inf, t.path);
  load_ok(&inf2, t.path);
  assert_same_params(&inf, &inf2, "inference to inference");
  size_t len;
  unsigned char *b = file_read(t.path, &len);
  const unsigned char *modl = b + 16 + 16;
  ck_assert_uint_eq(le32(modl + 20), 0); /* no state vectors */
  ck_assert_uint_eq(le32(modl + 24), 1); /* the inference flag */
  free(b);

  /* ... which a training context refuses, unchanged. */
  ctx_snap sn;
  ctx_snap_take(&sn, tr.c);
  ck_assert_int_eq(dp_ckpt_load(tr.c, t.path), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_ctx_error(tr.c), "inference") != NULL, "%s", dp_ctx_error(tr.c));
  ck_assert(snap_same(&sn, &tr));
  ctx_snap_free(&sn);
  tmp_done(&t);
  rig_close(&tr);
  rig_close(&inf);
  rig_close(&inf2);
}
END_TEST

/* ---- damage ------------------------------------------------------------------- */

/* A checkpoint file (from `src` at step 3) and a target context of the same
 * model at another state; plus its twin that no load ever touches. */
typedef struct {
  rig src, target, twin;
  tmpdir t;
  char bad[320];
  unsigned char *file;
  size_t len;
  ctx_snap sn;
} damage_rig;

static void damage_open(damage_rig *d, dp_optimizer opt) {
  dp_config c1 = CK_CFG(opt, .n_devices = 1), c2 = CK_CFG(opt, .n_devices = 2);
  rig_open(&d->src, MLP_SPEC, &c1);
  rig_open(&d->target, MLP_SPEC, &c2);
  rig_open(&d->twin, MLP_SPEC, &c2);
  tmp_make(&d->t, "dp_ckpt", "model.ckpt");
  snprintf(d->bad, sizeof d->bad, "%s/bad.ckpt", d->t.dir);
  run_steps(&d->src, 0, 3);
  save_ok(&d->src, d->t.path);
  d->file = file_read(d->t.path, &d->len);
  run_steps(&d->target, 50, 55);
  run_steps(&d->twin, 50, 55);
  ctx_snap_take(&d->sn, d->target.c);
}

/* Refused with DP_ERR_PARSE and the target unchanged. */
static void damage_expect_refused(damage_rig *d, const unsigned char *b, size_t len,
                                  const char *what, size_t where) {
  file_write(d->bad, b, len);
  dp_status s = dp_ckpt_load(d->target.c, d->bad);
  ck_assert_msg(s == DP_ERR_PARSE, "%s at %zu: got %s (%s)", what, where, dp_status_name(s),
                dp_ctx_error(d->target.c));
  ck_assert_msg(snap_same(&d->sn, &d->target), "%s at %zu: the context changed", what,
                where);
}

/* One more step on the target and on its untouched twin: the same bits. */
static void damage_close(damage_rig *d) {
  run_steps(&d->target, 55, 56);
  run_steps(&d->twin, 55, 56);
  assert_same_params(&d->target, &d->twin, "after refused loads");
  /* The intact file still loads. */
  load_ok(&d->target, d->t.path);
  assert_same_params(&d->target, &d->src, "intact file");
  ctx_snap_free(&d->sn);
  free(d->file);
  tmp_done(&d->t);
  rig_close(&d->src);
  rig_close(&d->target);
  rig_close(&d->twin);
}

START_TEST(test_truncated_file_is_refused) {
  damage_rig d;
  damage_open(&d, OPTS[_i]);
  /* Every length through the header, MODL and STEP, near every section
   * boundary, and every 13th in between. */
  size_t modl_len = (size_t)le64(d.file + 16 + 8);
  /* STEP: its 24-byte frame and 16 bytes */
  size_t parm_sec = 16 + 24 + modl_len + 24 + 16, opts_sec = parm_sec + 24 + 4 * d.src.np,
         bounds[3] = {parm_sec, opts_sec, d.len - 24};
  int tried = 0;
  for (size_t len = 0; len < d.len; len++) {
    bool near = len < parm_sec + 24;
    for (int i = 0; i < 3; i++) near |= len + 24 >= bounds[i] && len <= bounds[i] + 24;
    if (!near && len % 13) continue;
    damage_expect_refused(&d, d.file, len, "truncated", len);
    tried++;
  }
  ck_assert_int_gt(tried, 300);
  /* And the message says so. */
  file_write(d.bad, d.file, d.len - 100);
  ck_assert_int_eq(dp_ckpt_load(d.target.c, d.bad), DP_ERR_PARSE);
  char want[96];
  snprintf(want, sizeof want, "truncated: expected at least %zu bytes, file has %zu", d.len,
           d.len - 100);
  ck_assert_msg(strstr(dp_ctx_error(d.target.c), want), "%s", dp_ctx_error(d.target.c));
  /* Trailing bytes are refused too. */
  unsigned char *longer = malloc(d.len + 3);
  ck_assert_ptr_nonnull(longer);
  memcpy(longer, d.file, d.len);
  memset(longer + d.len, 0, 3);
  damage_expect_refused(&d, longer, d.len + 3, "trailing", d.len);
  free(longer);
  /* Far more than any checkpoint of this model. */
  size_t huge = 4 * d.len + 100000;
  longer = calloc(huge, 1);
  ck_assert_ptr_nonnull(longer);
  memcpy(longer, d.file, d.len);
  damage_expect_refused(&d, longer, huge, "trailing", huge);
  ck_assert_msg(strstr(dp_ctx_error(d.target.c), "trailing"), "%s",
                dp_ctx_error(d.target.c));
  free(longer);
  damage_close(&d);
}
END_TEST

static void put_le(unsigned char *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* MODL's fields, each wrong with every checksum right: refused naming the field
 * and what it should be (an outside check, session 23: "inconsistent fields"). */
START_TEST(test_wrong_model_fields_are_named) {
  damage_rig d;
  damage_open(&d, DP_OPT_MOMENTUM); /* one state vector */
  const size_t m = 16 + 16;         /* the header, MODL's head: its fields */
  const uint32_t text_len = (uint32_t)le64(d.file + 16 + 8) - 32;
  static const struct {
    size_t at;
    uint32_t v;
    const char *want;
  } wrong[] = {
      {16, 7, "section MODL: optimizer 7 is none of 0 to 3"},
      {20, 2, "section MODL: 2 optimizer state vectors; momentum keeps 1"},
      {20, 3, "section MODL: 3 optimizer state vectors; momentum keeps 1"},
      {24, 6, "section MODL: flags 0x6 (only 0x1, inference, and 0x2, amsgrad, are known)"},
      {24, 2, "section MODL: the amsgrad flag on a momentum checkpoint"},
      {28, 0, "section MODL: its text length field is 0, its text "},
  };
  unsigned char *b = malloc(d.len);
  ck_assert_ptr_nonnull(b);
  for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++) {
    memcpy(b, d.file, d.len);
    put_le(b + m + wrong[i].at, wrong[i].v, 4);
    ckpt_reseal(b, d.len);
    damage_expect_refused(&d, b, d.len, wrong[i].want, wrong[i].at);
    ck_assert_msg(strstr(dp_ctx_error(d.target.c), wrong[i].want), "'%s' not in %s",
                  wrong[i].want, dp_ctx_error(d.target.c));
  }
  /* dp_ckpt_info, which reads no context's model, bounds the count */
  memcpy(b, d.file, d.len);
  put_le(b + m + 20, 4, 4);
  ckpt_reseal(b, d.len);
  file_write(d.bad, b, d.len);
  dp_model *mo = NULL;
  ck_assert_int_eq(dp_ckpt_info(d.bad, &mo, NULL), DP_ERR_PARSE);
  ck_assert_msg(
      strstr(dp_last_error(), "section MODL: 4 optimizer state vectors (at most 3)"), "%s",
      dp_last_error());
  /* a NUL inside the model's text */
  memcpy(b, d.file, d.len);
  b[m + 32 + text_len / 2] = 0;
  ckpt_reseal(b, d.len);
  file_write(d.bad, b, d.len);
  ck_assert_int_eq(dp_ckpt_info(d.bad, &mo, NULL), DP_ERR_PARSE);
  ck_assert_msg(strstr(dp_last_error(), "section MODL: a NUL byte at byte "), "%s",
                dp_last_error());
  free(b);
  damage_close(&d);
}
END_TEST

/* A section of the wrong length, its checksums right, is named by its own tag
 * (an outside check, session 23: a short PARM was reported as the tag found
 * where APPD should start). */
START_TEST(test_section_of_wrong_length_is_named) {
  damage_rig d;
  damage_open(&d, DP_OPT_MOMENTUM);
  size_t modl_len = (size_t)le64(d.file + 16 + 8);
  size_t step_sec = 16 + 24 + modl_len, parm_sec = step_sec + 24 + 16;
  size_t opts_sec = parm_sec + 24 + 4 * d.src.np;
  static const char *const want[] = {"section STEP holds 12 bytes; expected 16",
                                     "section PARM holds", "section OPTS holds"};
  const size_t at[] = {step_sec, parm_sec, opts_sec};
  unsigned char *b = malloc(d.len);
  ck_assert_ptr_nonnull(b);
  for (int i = 0; i < 3; i++) { /* 4 bytes cut from the section's end */
    uint64_t pl = le64(d.file + at[i] + 8);
    size_t cut = at[i] + 16 + (size_t)pl - 4;
    memcpy(b, d.file, cut);
    memcpy(b + cut, d.file + cut + 4, d.len - cut - 4);
    put_le(b + at[i] + 8, pl - 4, 8);
    ckpt_reseal(b, d.len - 4);
    damage_expect_refused(&d, b, d.len - 4, want[i], (size_t)i);
    ck_assert_msg(strstr(dp_ctx_error(d.target.c), want[i]), "'%s' not in %s", want[i],
                  dp_ctx_error(d.target.c));
    char exp[64];
    snprintf(exp, sizeof exp, "bytes; expected %llu", (unsigned long long)pl);
    ck_assert_msg(strstr(dp_ctx_error(d.target.c), exp), "%s", dp_ctx_error(d.target.c));
  }
  free(b);
  damage_close(&d);
}
END_TEST

/* A small file whose MODL (checksum and all) names a huge model: dp_ckpt_info
 * refuses it by its size, before a tool plans and allocates that model's
 * arenas (a 118 KB file made dp predict try for 17 GB). */
START_TEST(test_header_of_a_huge_model_is_refused_by_size) {
  static const char *const texts[] = {
      "input 64\nlinear 20000\nrelu\nlinear 20000\nrelu\nlinear 10\nloss mse\n",
      "input 2147483647\nlinear 2147483647\nlinear 2147483647\n"};
  for (int t = 0; t < 2; t++) {
    dp_model *m = NULL;
    ck_assert_int_eq(dp_model_parse(texts[t], "huge", &m), DP_OK);
    size_t tl = strlen(texts[t]), pl = 32 + tl, len = 16 + 16 + pl + 8 + 4096;
    unsigned char *b = calloc(len, 1);
    memcpy(b, "DPCKPT\0\1", 8);
    put_le(b + 8, 3, 4);
    put_le(b + 12, 6, 4);
    memcpy(b + 16, "MODL", 4);
    put_le(b + 24, pl, 8);
    unsigned char *pay = b + 32;
    put_le(pay, dp_model_n_params(m), 8);
    put_le(pay + 16, DP_OPT_SGD, 4);
    put_le(pay + 28, tl, 4);
    memcpy(pay + 32, texts[t], tl);
    put_le(pay + pl, dp_hash_bytes(pay, pl), 8);
    tmpdir d;
    tmp_make(&d, "dp_ckpt", "huge.ckpt");
    file_write(d.path, b, len);
    dp_model *got = NULL;
    ck_assert_int_eq(dp_ckpt_info(d.path, &got, NULL), DP_ERR_PARSE);
    ck_assert_ptr_null(got);
    char want[160];
    snprintf(want, sizeof want, "truncated: its model of %zu parameters needs at least",
             dp_model_n_params(m));
    ck_assert_msg(strstr(dp_last_error(), want), "%s", dp_last_error());
    ck_assert_msg(strstr(dp_last_error(), "the file has "), "%s", dp_last_error());
    tmp_done(&d);
    free(b);
    dp_model_free(m);
  }
}
END_TEST

/* A flipped bit in every byte (all 8 bits in the header and the section
 * headers), so every section and every field. */
START_TEST(test_flipped_bit_is_refused) {
  damage_rig d;
  damage_open(&d, OPTS[_i]);
  unsigned char *b = malloc(d.len);
  ck_assert_ptr_nonnull(b);
  memcpy(b, d.file, d.len);
  size_t modl_len = (size_t)le64(d.file + 16 + 8);
  /* STEP: its 24-byte frame and 16 bytes */
  size_t parm_sec = 16 + 24 + modl_len + 24 + 16, opts_sec = parm_sec + 24 + 4 * d.src.np;
  for (size_t pos = 0; pos < d.len; pos++) {
    /* all bits: the header, MODL, STEP, END, and PARM's and OPTS' headers and checksums */
    bool all = pos < parm_sec + 16 || (pos >= opts_sec - 8 && pos < opts_sec + 16) ||
               pos >= d.len - 32;
    for (int bit = 0; bit < 8; bit++) {
      if (!all && bit != (int)(pos % 8)) continue;
      b[pos] ^= (unsigned char)(1u << bit);
      damage_expect_refused(&d, b, d.len, "flipped bit", pos * 8 + (size_t)bit);
      b[pos] ^= (unsigned char)(1u << bit);
    }
  }
  /* Which section was hit is named. */
  b[parm_sec + 16 + 5] ^= 4; /* a PARM payload byte */
  file_write(d.bad, b, d.len);
  ck_assert_int_eq(dp_ckpt_load(d.target.c, d.bad), DP_ERR_PARSE);
  ck_assert_msg(strstr(dp_ctx_error(d.target.c), "checksum mismatch in section PARM"), "%s",
                dp_ctx_error(d.target.c));
  free(b);
  damage_close(&d);
}
END_TEST

/* Values that pass the checksums but are not finite are refused. */
START_TEST(test_nonfinite_values_are_refused) {
  damage_rig d;
  damage_open(&d, DP_OPT_MOMENTUM);
  unsigned char *b = malloc(d.len);
  ck_assert_ptr_nonnull(b);
  size_t modl_len = (size_t)le64(d.file + 16 + 8);
  /* STEP: its 24-byte frame and 16 bytes */
  size_t parm_sec = 16 + 24 + modl_len + 24 + 16, opts_sec = parm_sec + 24 + d.src.np * 4;
  size_t secs[2] = {parm_sec, opts_sec};
  for (int which = 0; which < 2; which++) {
    memcpy(b, d.file, d.len);
    unsigned char *pay = b + secs[which] + 16;
    uint64_t pl = le64(b + secs[which] + 8);
    const uint32_t nan_bits = 0x7fc00000u;
    for (int i = 0; i < 4; i++) pay[4 * 7 + i] = (unsigned char)(nan_bits >> (8 * i));
    uint64_t h = dp_hash_bytes(pay, pl);
    for (int i = 0; i < 8; i++) pay[pl + i] = (unsigned char)(h >> (8 * i));
    size_t end = d.len - 24;
    h = dp_hash_bytes(b, end + 16);
    for (int i = 0; i < 8; i++) b[end + 16 + i] = (unsigned char)(h >> (8 * i));
    damage_expect_refused(&d, b, d.len, "NaN", (size_t)which);
    ck_assert_msg(strstr(dp_ctx_error(d.target.c), "not finite"), "%s",
                  dp_ctx_error(d.target.c));
  }
  free(b);
  damage_close(&d);
}
END_TEST

/* The payload of section `tag` (its offset in *pay, its length returned). */
static size_t section_of(const unsigned char *b, size_t len, const char *tag, size_t *pay) {
  for (size_t off = 16; off + 24 <= len; off += 24 + (size_t)le64(b + off + 8))
    if (memcmp(b + off, tag, 4) == 0) {
      *pay = off + 16;
      return (size_t)le64(b + off + 8);
    }
  ck_abort_msg("no section %s", tag);
  return 0;
}

static void put_f32le(unsigned char *b, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  for (int i = 0; i < 4; i++) b[i] = (unsigned char)(u >> (8 * i));
}

/* AdamW's second moment is a mean of squares: a negative one (checksums
 * recomputed, so only the value check can find it) is refused, naming the
 * element, before the context changes (every arena byte, the parameters'
 * hash); a load would have made the next step write NaN parameters. */
START_TEST(test_negative_second_moment_is_refused) {
  damage_rig d;
  damage_open(&d, DP_OPT_ADAMW);
  size_t pay, pl = section_of(d.file, d.len, "OPTS", &pay), n = d.src.np;
  ck_assert_uint_eq(pl, 2 * n * 4);
  unsigned char *b = malloc(d.len);
  ck_assert_ptr_nonnull(b);
  static const struct {
    size_t at;
    float v;
    const char *needle;
  } bad[] = {{5, -1e-3f, "AdamW's second moment v[5] is -0.001; a mean of squares"},
             {0, -FLT_MIN, "AdamW's second moment v[0] is -1.17549e-38"},
             {~(size_t)0, -FLT_MAX, "second moment v["}}; /* ~0: the last */
  uint64_t h = dp_params_hash(d.target.c);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    memcpy(b, d.file, d.len);
    size_t at = bad[i].at == ~(size_t)0 ? n - 1 : bad[i].at;
    put_f32le(b + pay + 4 * (n + at), bad[i].v);
    ckpt_reseal(b, d.len);
    damage_expect_refused(&d, b, d.len, "negative v", at);
    ck_assert_msg(strstr(dp_ctx_error(d.target.c), bad[i].needle), "%s",
                  dp_ctx_error(d.target.c));
    ck_assert_uint_eq(dp_params_hash(d.target.c), h);
  }
  /* momentum's buffer and AdamW's first moment may be negative: m = -1 loads */
  memcpy(b, d.file, d.len);
  put_f32le(b + pay + 4 * 3, -1.0f);
  ckpt_reseal(b, d.len);
  file_write(d.bad, b, d.len);
  rig fresh;
  dp_config c2 = CK_CFG(DP_OPT_ADAMW, .n_devices = 2);
  rig_open(&fresh, MLP_SPEC, &c2);
  load_ok(&fresh, d.bad);
  run_steps(&fresh, 3, 4);
  rig_close(&fresh);
  free(b);
  damage_close(&d);
}
END_TEST

/* The step counter is range-checked: above 2^53 (doubles count it exactly
 * up to there, and the 64-bit counter would wrap to a "first" step) it is
 * refused; 2^53 itself loads. */
START_TEST(test_step_out_of_range_is_refused) {
  damage_rig d;
  damage_open(&d, DP_OPT_MOMENTUM);
  size_t pay;
  ck_assert_uint_eq(section_of(d.file, d.len, "STEP", &pay), 16);
  unsigned char *b = malloc(d.len);
  ck_assert_ptr_nonnull(b);
  const uint64_t steps[] = {((uint64_t)1 << 53) + 1, UINT64_MAX, (uint64_t)1 << 53};
  for (int i = 0; i < 3; i++) {
    memcpy(b, d.file, d.len);
    for (int k = 0; k < 8; k++) b[pay + k] = (unsigned char)(steps[i] >> (8 * k));
    ckpt_reseal(b, d.len);
    if (i < 2) {
      damage_expect_refused(&d, b, d.len, "step", (size_t)i);
      ck_assert_msg(strstr(dp_ctx_error(d.target.c), "step") &&
                        strstr(dp_ctx_error(d.target.c), "2^53"),
                    "%s", dp_ctx_error(d.target.c));
      continue;
    }
    file_write(d.bad, b, d.len);
    rig fresh;
    dp_config c2 = CK_CFG(DP_OPT_MOMENTUM, .n_devices = 2);
    rig_open(&fresh, MLP_SPEC, &c2);
    load_ok(&fresh, d.bad);
    ck_assert_uint_eq(dp_ctx_step(fresh.c), steps[i]);
    rig_close(&fresh);
  }
  free(b);
  damage_close(&d);
}
END_TEST

/* STEP's last word (version 4) is the momentum in effect: one outside [0, 1)
 * or not finite is refused, the context unchanged; the same word in a version 3
 * file must be the reserved 0, and so must it in a plain SGD file. */
START_TEST(test_momentum_out_of_range_is_refused) {
  damage_rig d;
  damage_open(&d, DP_OPT_MOMENTUM);
  size_t pay;
  ck_assert_uint_eq(section_of(d.file, d.len, "STEP", &pay), 16);
  unsigned char *b = malloc(d.len);
  ck_assert_ptr_nonnull(b);
  const float bad[] = {1.0f, -0.25f, NAN, INFINITY, 3e38f};
  for (int i = 0; i < 5; i++) {
    memcpy(b, d.file, d.len);
    memcpy(b + pay + 12, &bad[i], 4);
    ckpt_reseal(b, d.len);
    damage_expect_refused(&d, b, d.len, "momentum", (size_t)i);
    ck_assert_msg(strstr(dp_ctx_error(d.target.c), "momentum"), "%s",
                  dp_ctx_error(d.target.c));
  }
  size_t n3;
  unsigned char *v3 = ckpt_as_version(d.file, d.len, 3, &n3);
  ck_assert_uint_eq(section_of(v3, n3, "STEP", &pay), 16);
  v3[pay + 12] = 1;
  ckpt_reseal(v3, n3);
  damage_expect_refused(&d, v3, n3, "version 3 reserved word", 0);
  ck_assert_msg(strstr(dp_ctx_error(d.target.c), "reserved word"), "%s",
                dp_ctx_error(d.target.c));
  free(v3);
  free(b);
  damage_close(&d);
  /* plain SGD keeps no momentum: its file holds 0 (the format is canonical) */
  damage_open(&d, DP_OPT_SGD);
  ck_assert_uint_eq(section_of(d.file, d.len, "STEP", &pay), 16);
  ck_assert_uint_eq(le32(d.file + pay + 12), 0);
  b = malloc(d.len);
  ck_assert_ptr_nonnull(b);
  memcpy(b, d.file, d.len);
  const float half = 0.5f;
  memcpy(b + pay + 12, &half, 4);
  ckpt_reseal(b, d.len);
  damage_expect_refused(&d, b, d.len, "plain SGD's momentum", 0);
  ck_assert_msg(strstr(dp_ctx_error(d.target.c), "plain SGD and inference keep none"), "%s",
                dp_ctx_error(d.target.c));
  free(b);
  damage_close(&d);
}
END_TEST

/* Every reader takes every version the loader takes (issue 26: dp_ckpt_info
 * and dp_ckpt_read_app once took versions 1 and 3 only, so dp predict, export
 * and --resume refused a version 2 file the library loads). The same state
 * as versions 1, 2, 3: each loads, dp_ckpt_info names its version and size,
 * dp_ckpt_read_app gives its data (none before version 3). Versions 0 and 4,
 * and a section count not the version's, are refused by all three. */
START_TEST(test_every_reader_takes_every_version) {
  dp_config cfg = CK_CFG(DP_OPT_ADAMW, .n_devices = 2);
  rig a, b;
  rig_open(&a, MLP_SPEC, &cfg);
  rig_open(&b, MLP_SPEC, &cfg);
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "v4.ckpt");
  run_steps(&a, 0, 3);
  static const char app[] = "libdp-train 1\nepochs 1\n";
  ck_assert_int_eq(dp_ckpt_save_app(a.c, t.path, app, sizeof app - 1), DP_OK);
  size_t len;
  unsigned char *v4 = file_read(t.path, &len);
  for (int vi = 0; vi < 4; vi++) {
    int v = (int[]){2, 1, 3, 4}[vi]; /* 2 first: the version issue 26 found refused */
    size_t n;
    unsigned char *f = ckpt_as_version(v4, len, v, &n);
    if (v == 4) ck_assert(n == len && memcmp(f, v4, n) == 0);
    char name[16];
    snprintf(name, sizeof name, "v%d%s.ckpt", v, v == 4 ? "b" : "");
    tmp_path(&t, name);
    file_write(t.path, f, n);
    run_steps(&b, 100, 101); /* another state */
    ck_assert_msg(dp_ckpt_load(b.c, t.path) == DP_OK, "version %d: %s", v,
                  dp_ctx_error(b.c));
    assert_same_params(&a, &b, "loaded");
    ck_assert_uint_eq(dp_ctx_step(b.c), 3);
    dp_model *m = NULL;
    dp_ckpt_summary info;
    ck_assert_msg(dp_ckpt_info(t.path, &m, &info) == DP_OK, "version %d: %s", v,
                  dp_last_error());
    ck_assert_uint_eq(info.version, (unsigned)v);
    ck_assert_uint_eq(info.n_params, a.np);
    ck_assert_uint_eq(info.file_bytes, n);
    ck_assert_int_eq(info.optimizer, DP_OPT_ADAMW);
    ck_assert_uint_eq(dp_model_n_params(m), a.np);
    dp_model_free(m);
    void *got = NULL;
    size_t got_n = 0;
    ck_assert_msg(dp_ckpt_read_app(t.path, &got, &got_n) == DP_OK, "version %d: %s", v,
                  dp_last_error());
    if (v < 3)
      ck_assert(got == NULL && got_n == 0);
    else
      ck_assert(got_n == sizeof app - 1 && memcmp(got, app, got_n) == 0);
    free(got);
    for (int bad = 0; bad < 3; bad++) { /* version 0, 5, the other section count */
      unsigned char *g = malloc(n);
      ck_assert_ptr_nonnull(g);
      memcpy(g, f, n);
      if (bad < 2)
        g[8] = bad ? 5 : 0;
      else
        g[12] = v < 3 ? 6 : 5;
      ckpt_reseal(g, n);
      file_write(t.path, g, n);
      free(g);
      ctx_snap sn;
      ctx_snap_take(&sn, b.c);
      ck_assert_int_eq(dp_ckpt_load(b.c, t.path), DP_ERR_PARSE);
      ck_assert_int_eq(dp_ckpt_info(t.path, NULL, &info), DP_ERR_PARSE);
      ck_assert_msg(strstr(dp_last_error(), bad < 2 ? "version" : "sections"), "%s",
                    dp_last_error());
      ck_assert_int_eq(dp_ckpt_read_app(t.path, &got, &got_n), DP_ERR_PARSE);
      ck_assert(got == NULL && got_n == 0);
      ctx_snap_check(&sn, b.c, "another version");
      ctx_snap_free(&sn);
    }
    free(f);
  }
  free(v4);
  tmp_done(&t);
  rig_close(&a);
  rig_close(&b);
}
END_TEST

/* The hostile user's attack with the checksums repaired (ckpt_reseal), so
 * that every mutation reaches the structure, model and value checks behind
 * them: a flipped bit in every byte of the header, MODL, STEP and each
 * section's frame, in every byte of the batchnorm's buffers and of AdamW's
 * second moment's first floats, and in one float in 16 of the rest. A refusal
 * leaves every arena byte as it was. An acceptance must be exact (device 0's
 * parameters, buffers and optimizer state hold the file's bytes, the step and
 * rate its STEP: nothing read otherwise than written) and, for a mutated
 * state, sound (the next step, if it succeeds, leaves every parameter finite). */
static const char ATTACK_SPEC[] = "input 12\nlinear 8\nbatchnorm\nrelu\nlinear 5\n"
                                  "loss softmax_cross_entropy\n";

typedef struct {
  rig src, dst;
  tmpdir t;
  char own[320];
  unsigned char *file;
  size_t len, parm, opts, step; /* the payloads' offsets */
  int refused, accepted, stepped;
} ck_attack;

static void ck_attack_one(ck_attack *a, const unsigned char *b, size_t where, bool step) {
  file_write(a->t.path, b, a->len);
  ctx_snap sn; /* per load: an accepted one's step leaves scratch regions written */
  ctx_snap_take(&sn, a->dst.c);
  dp_status s = dp_ckpt_load(a->dst.c, a->t.path);
  if (s != DP_OK) {
    ctx_snap_check(&sn, a->dst.c, "refused");
    ctx_snap_free(&sn);
    a->refused++;
    return;
  }
  ctx_snap_free(&sn);
  const dp_plan *p = a->dst.p;
  dp_region_info pr = dp_plan_region(p, 0, DP_REGION_PARAMS),
                 os = dp_plan_region(p, 0, DP_REGION_OPT_STATE);
  size_t nf = (size_t)le64(b + a->parm - 8), no = (size_t)le64(b + a->opts - 8);
  float lr = dp_ctx_lr(a->dst.c);
  if (nf > pr.size || no != os.size ||
      memcmp(a->dst.c->arena[0] + pr.offset, b + a->parm, nf) != 0 ||
      memcmp(a->dst.c->arena[0] + os.offset, b + a->opts, no) != 0 ||
      dp_ctx_step(a->dst.c) != le64(b + a->step) || memcmp(&lr, b + a->step + 8, 4) != 0)
    ck_abort_msg("byte %zu: accepted, but the context does not hold the file's state",
                 where);
  int k = 0;
  if (step && try_steps(&a->dst, 60, 61, &k) == DP_OK) {
    float *w = params_of(&a->dst);
    for (size_t e = 0; e < a->dst.np; e++)
      if (!isfinite(w[e]))
        ck_abort_msg("byte %zu: accepted, and the next step wrote parameter %zu = %g",
                     where, e, (double)w[e]);
    free(w);
    a->stepped++;
  }
  load_ok(&a->dst, a->own); /* back to where it was */
  a->accepted++;
}

START_TEST(test_resealed_mutations_are_refused_or_exact) {
  ck_attack a;
  memset(&a, 0, sizeof a);
  dp_config c1 = CK_CFG(DP_OPT_ADAMW, .n_devices = 1),
            c2 = CK_CFG(DP_OPT_ADAMW, .n_devices = 2);
  rig_open(&a.src, ATTACK_SPEC, &c1);
  rig_open(&a.dst, ATTACK_SPEC, &c2);
  tmp_make(&a.t, "dp_ckpt", "attack.ckpt");
  snprintf(a.own, sizeof a.own, "%s/own.ckpt", a.t.dir);
  run_steps(&a.src, 0, 3);
  run_steps(&a.dst, 50, 52);
  save_ok(&a.src, a.t.path);
  save_ok(&a.dst, a.own);
  a.file = file_read(a.t.path, &a.len);
  size_t parm_len = section_of(a.file, a.len, "PARM", &a.parm);
  section_of(a.file, a.len, "OPTS", &a.opts);
  section_of(a.file, a.len, "STEP", &a.step);
  size_t np = a.src.np, buffers = a.parm + 4 * np, v = a.opts + 4 * np, frames[7], nf = 0;
  for (size_t off = 16; off + 24 <= a.len; off += 24 + (size_t)le64(a.file + off + 8))
    frames[nf++] = off;
  unsigned char *b = malloc(a.len);
  ck_assert_ptr_nonnull(b);
  for (size_t at = 0; at < a.len; at++) {
    bool frame = at < a.parm; /* the header, MODL, STEP and PARM's frame */
    for (size_t i = 0; i < nf; i++) frame |= at >= frames[i] && at < frames[i] + 24;
    bool state = (at >= buffers && at < a.parm + parm_len) || (at >= v && at < v + 64);
    if (!frame && !state && (at - a.parm) / 4 % 16) continue;
    for (int bit = 0; bit < 8; bit++) {
      memcpy(b, a.file, a.len);
      b[at] ^= (unsigned char)(1u << bit);
      ckpt_reseal(b, a.len);
      ck_attack_one(&a, b, at, state || (at >= a.step && at < a.step + 16));
    }
  }
  if (getenv("DP_ATTACK_REPORT"))
    fprintf(stderr, "checkpoint attack: %d refused, %d accepted (%d stepped)\n", a.refused,
            a.accepted, a.stepped);
  ck_assert_int_gt(a.refused, 500);
  ck_assert_int_gt(a.accepted, 500);
  free(b);
  free(a.file);
  tmp_done(&a.t);
  rig_close(&a.src);
  rig_close(&a.dst);
}
END_TEST

/* ---- crash -------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "A crash mid-save (a child killed during the write) leaves the previous
 * checkpoint loadable." The child saves and steps in a loop; it is SIGKILLed
 * after a random time of 0 to 3 save durations (measured here: fsync makes it
 * depend on the file system), so kills land before, during and after saves. */
START_TEST(test_killed_save_leaves_loadable_checkpoint) {
  dp_config cfg = CK_CFG(DP_OPT_ADAMW, .n_devices = 1);
  rig a, b;
  rig_open(&a, BIG_SPEC, &cfg);
  rig_open(&b, BIG_SPEC, &cfg);
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "model.ckpt");
  run_steps(&a, 0, 1);
  double t0 = now_s();
  save_ok(&a, t.path);
  double t_save = now_s() - t0;
  unsigned window_us = (unsigned)(3e6 * t_save) + 100;
  if (window_us > 100000) window_us = 100000;
  uint64_t rs = (uint64_t)time(NULL) * 2654435761u + (uint64_t)getpid();
  uint64_t last_step = 1;
  float *last = params_of(&a);
  int torn = 0, renewed = 0;
  fflush(stdout);
  fflush(stderr);
  for (int trial = 0; trial < 50; trial++) {
    run_steps(&a, 1 + trial, 2 + trial); /* the child's first save is news */
    pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) { /* no Check calls in here */
      alarm(20);    /* never outlive the test */
      for (int k = 0;; k++) {
        int at;
        if (dp_ckpt_save(a.c, t.path) != DP_OK || try_steps(&a, 1000 + k, 1001 + k, &at))
          _exit(3);
      }
    }
    usleep((useconds_t)(rng_next(&rs) % (window_us + 1)));
    kill(pid, SIGKILL);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
                  "trial %d: child ended on its own", trial);
    /* The file at path is complete, old or new; temporary files are the
     * killed child's and are removed. */
    load_ok(&b, t.path);
    float *now = params_of(&b);
    uint64_t step = dp_ctx_step(b.c);
    bool old = step == last_step && memcmp(now, last, b.np * 4) == 0;
    ck_assert_msg(old || step >= dp_ctx_step(a.c),
                  "trial %d: neither the old checkpoint nor "
                  "one of the child's",
                  trial);
    renewed += !old;
    free(last);
    last = now;
    last_step = step;
    torn += remove_prefixed(t.dir, "model.ckpt.tmp.");
    ck_assert_int_eq(dir_entries(t.dir), 1);
  }
  free(last);
  /* How many kills landed mid-save (a temporary file left) and how many
   * after a rename: both vary from run to run, and are usually > 0. */
  (void)torn;
  (void)renewed;
  tmp_done(&t);
  rig_close(&a);
  rig_close(&b);
}
END_TEST

/* ---- mismatch and I/O ----------------------------------------------------------- */

static void expect_invalid(rig *r, const char *path, const char *want1, const char *want2) {
  ctx_snap sn;
  ctx_snap_take(&sn, r->c);
  dp_status s = dp_ckpt_load(r->c, path);
  ck_assert_msg(s == DP_ERR_INVALID, "got %s: %s", dp_status_name(s), dp_ctx_error(r->c));
  ck_assert_msg(strstr(dp_ctx_error(r->c), want1) && strstr(dp_ctx_error(r->c), want2),
                "message lacks '%s' or '%s': %s", want1, want2, dp_ctx_error(r->c));
  ck_assert(snap_same(&sn, r));
  ctx_snap_free(&sn);
}

START_TEST(test_model_mismatch_is_refused) {
  dp_config cfg = CK_CFG(DP_OPT_MOMENTUM, .n_devices = 1);
  rig r16, r17;
  rig_open(&r16, MLP_SPEC, &cfg);
  rig_open(&r17, MLP17_SPEC, &cfg);
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "model.ckpt");
  run_steps(&r16, 0, 2);
  run_steps(&r17, 0, 2);
  save_ok(&r17, t.path); /* larger than any checkpoint of r16's model */
  expect_invalid(&r16, t.path, "linear 17", "linear 16");
  save_ok(&r16, t.path); /* smaller */
  expect_invalid(&r17, t.path, "linear 16", "linear 17");
  /* Far larger than any checkpoint of r16's model: only a prefix is read. */
  dp_config ca = CK_CFG(DP_OPT_ADAMW, .n_devices = 1);
  rig big;
  rig_open(&big, BIG_SPEC, &ca);
  save_ok(&big, t.path);
  rig_close(&big);
  expect_invalid(&r16, t.path, "input 64", "input 12");
  tmp_done(&t);
  rig_close(&r16);
  rig_close(&r17);
}
END_TEST

START_TEST(test_optimizer_and_seed_mismatch_is_refused) {
  dp_config cm = CK_CFG(DP_OPT_MOMENTUM, .n_devices = 1),
            ca = CK_CFG(DP_OPT_ADAMW, .n_devices = 2),
            cs = CK_CFG(DP_OPT_SGD, .n_devices = 1),
            cseed = CK_CFG(DP_OPT_MOMENTUM, .n_devices = 2);
  cseed.seed = 8;
  rig m, a, sgd, seed;
  rig_open(&m, MLP_SPEC, &cm);
  rig_open(&a, MLP_SPEC, &ca);
  rig_open(&sgd, MLP_SPEC, &cs);
  rig_open(&seed, MLP_SPEC, &cseed);
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "model.ckpt");
  run_steps(&m, 0, 2);
  save_ok(&m, t.path);
  expect_invalid(&a, t.path, "momentum", "adamw");
  expect_invalid(&sgd, t.path, "momentum", "sgd");
  expect_invalid(&seed, t.path, "seed is 7", "8");
  run_steps(&a, 0, 2);
  save_ok(&a, t.path);
  expect_invalid(&m, t.path, "adamw", "momentum");
  tmp_done(&t);
  rig_close(&m);
  rig_close(&a);
  rig_close(&sgd);
  rig_close(&seed);
}
END_TEST

START_TEST(test_io_errors) {
  dp_config cfg = CK_CFG(DP_OPT_ADAMW, .n_devices = 2);
  rig r;
  rig_open(&r, MLP_SPEC, &cfg);
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "model.ckpt");
  run_steps(&r, 0, 2);
  ctx_snap sn;
  ctx_snap_take(&sn, r.c);
  char p[400];

  /* A missing file. */
  snprintf(p, sizeof p, "%s/missing.ckpt", t.dir);
  ck_assert_int_eq(dp_ckpt_load(r.c, p), DP_ERR_IO);
  ck_assert_msg(strstr(dp_ctx_error(r.c), p) && strstr(dp_ctx_error(r.c), strerror(ENOENT)),
                "%s", dp_ctx_error(r.c));
  /* A directory. */
  ck_assert_int_eq(dp_ckpt_load(r.c, t.dir), DP_ERR_IO);
  /* Not a checkpoint. */
  file_write(p, (const unsigned char *)"hello, world\n", 13);
  ck_assert_int_eq(dp_ckpt_load(r.c, p), DP_ERR_PARSE);
  ck_assert_int_eq(unlink(p), 0);
  ck_assert(snap_same(&sn, &r));

  /* Saving into a directory that does not exist, or over a directory. */
  expect_write_refused(r.c, dp_ckpt_save, t.dir, "x.ckpt");
  /* ... or over a FIFO or a device, or through a planted link (issue 26) */
  expect_write_keeps_nodes(r.c, dp_ckpt_save, t.dir, "x.ckpt");

  /* NULL arguments. */
  ck_assert_int_eq(dp_ckpt_save(NULL, t.path), DP_ERR_INVALID);
  ck_assert_int_eq(dp_ckpt_load(NULL, t.path), DP_ERR_INVALID);
  ck_assert_int_eq(dp_ckpt_save(r.c, NULL), DP_ERR_INVALID);
  ck_assert_int_eq(dp_ckpt_load(r.c, NULL), DP_ERR_INVALID);
  ck_assert(snap_same(&sn, &r));

  /* A relative path (the directory is "."). */
  char cwd[512];
  ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
  ck_assert_int_eq(chdir(t.dir), 0);
  save_ok(&r, "rel.ckpt");
  load_ok(&r, "rel.ckpt");
  ck_assert_int_eq(chdir(cwd), 0);
  ck_assert_int_eq(dir_entries(t.dir), 1);

  ctx_snap_free(&sn);
  tmp_done(&t);
  rig_close(&r);
}
END_TEST

/* Issue 12: dp_ckpt_load on a FIFO with no writer blocked for ever in open();
 * the docs promise DP_ERR_IO for anything but a regular file. The alarm turns
 * a regression into a failure instead of a hang. */
START_TEST(test_fifo_without_writer_is_refused_at_once) {
  dp_config cfg = CK_CFG(DP_OPT_MOMENTUM, .n_devices = 1);
  rig r;
  rig_open(&r, MLP_SPEC, &cfg);
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "model.ckpt");
  run_steps(&r, 0, 1);
  ctx_snap sn;
  ctx_snap_take(&sn, r.c);
  /* refused at once; a directory names itself as one */
  expect_not_a_file_refused(r.c, dp_ckpt_load, t.dir, "fifo.ckpt");
  ck_assert(snap_same(&sn, &r));
  /* a regular file still loads (O_NONBLOCK is cleared before reading) */
  save_ok(&r, t.path);
  load_ok(&r, t.path);
  ctx_snap_free(&sn);
  tmp_done(&t);
  rig_close(&r);
}
END_TEST

/* config.amsgrad: v_hat rides in the checkpoint (the amsgrad flag, a third
 * vector) and a resume from 4 sharded devices onto 2 classic ones is the
 * straight run's bits, for Adam and AdamW; beta2 0.5 makes v fall between
 * steps, so that v_hat differs from v (a v_hat lost on the way would change
 * the bits; amsgrad's run differs from the plain one). A checkpoint loads
 * only into a context of its own amsgrad setting, either way round, refused
 * with nothing changed. */
START_TEST(test_amsgrad_resume_and_mismatch_refused) {
  dp_optimizer opt = _i ? DP_OPT_ADAMW : DP_OPT_ADAM;
  dp_config cs = CK_CFG(opt, .n_devices = 4, .mode = DP_MODE_ALLREDUCE, .shard = 1),
            cl = CK_CFG(opt, .n_devices = 2), c1 = CK_CFG(opt, .n_devices = 1);
  dp_config *all[] = {&cs, &cl, &c1};
  for (int i = 0; i < 3; i++) {
    all[i]->lr = 0.003f;
    all[i]->beta2 = 0.5f;
    all[i]->amsgrad = 1;
  }
  dp_config plain = c1;
  plain.amsgrad = 0;
  rig straight, a, b, p;
  rig_open(&straight, MLP_SPEC, &c1);
  rig_open(&a, MLP_SPEC, &cs);
  rig_open(&b, MLP_SPEC, &cl);
  rig_open(&p, MLP_SPEC, &plain);
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "ams.ckpt");
  run_steps(&straight, 0, TOTAL);
  run_steps(&a, 0, SAVE_AT);
  save_ok(&a, t.path);
  dp_ckpt_summary info;
  ck_assert_int_eq(dp_ckpt_info(t.path, NULL, &info), DP_OK);
  ck_assert(info.amsgrad == 1 && info.optimizer == opt && !info.inference);
  ck_assert_uint_eq(info.file_bytes, dp_ckpt_bytes(a.c, 0));
  /* one vector of n_params floats more than the same run without amsgrad */
  ck_assert_uint_eq(dp_ckpt_bytes(a.c, 0), dp_ckpt_bytes(p.c, 0) + 4 * a.np);
  load_ok(&b, t.path);
  assert_same_params(&a, &b, "just loaded");
  run_steps(&b, SAVE_AT, TOTAL);
  assert_same_params(&straight, &b, "amsgrad resumed vs straight");

  /* amsgrad's file into a plain context, and a plain file into amsgrad's */
  run_steps(&p, 0, TOTAL);
  float *x = params_of(&p), *y = params_of(&straight);
  ck_assert_msg(memcmp(x, y, 4 * p.np) != 0, "amsgrad changed nothing");
  free(x);
  free(y);
  const char *plain_path = tmp_path(&t, "plain.ckpt");
  save_ok(&p, plain_path);
  ck_assert_int_eq(dp_ckpt_info(plain_path, NULL, &info), DP_OK);
  ck_assert_int_eq(info.amsgrad, 0);
  static const char *const want[] = {"saved with amsgrad on; the context has amsgrad off",
                                     "saved with amsgrad off; the context has amsgrad on"};
  for (int k = 0; k < 2; k++) {
    rig *into = k ? &b : &p;
    ctx_snap sn;
    ctx_snap_take(&sn, into->c);
    tmp_path(&t, k ? "plain.ckpt" : "ams.ckpt");
    ck_assert_int_eq(dp_ckpt_load(into->c, t.path), DP_ERR_INVALID);
    ck_assert_msg(strstr(dp_ctx_error(into->c), want[k]), "%s", dp_ctx_error(into->c));
    ctx_snap_check(&sn, into->c, "a refused amsgrad mismatch");
    ck_assert(sn.stale == into->c->replicas_stale);
    ctx_snap_free(&sn);
  }
  tmp_done(&t);
  rig_close(&straight);
  rig_close(&a);
  rig_close(&b);
  rig_close(&p);
}
END_TEST

/* A failed update poisons the context (its state is half-written): saving it
 * is refused, and loading a good checkpoint makes it whole again. */
START_TEST(test_poisoned_context_refuses_save_and_load_heals_it) {
  tmpdir t;
  tmp_make(&t, "dp_ckpt", "model.ckpt");
  dp_config cfg =
      CK_CFG(DP_OPT_ADAMW, .n_devices = 2, .mode = DP_MODE_ALLREDUCE, .shard = 1);
  rig a, ref;
  rig_open(&a, MLP_SPEC, &cfg);
  rig_open(&ref, MLP_SPEC, &cfg);
  run_steps(&a, 0, 3);
  run_steps(&ref, 0, 3);
  save_ok(&a, t.path);
  const dp_op *ops;
  int n_ops, commit;
  ck_assert_int_eq(dp__ctx_schedule(a.c, BATCH, true, &ops, &n_ops, &commit), DP_OK);
  ck_assert_int_lt(commit, n_ops);
  dp__ctx_inject_fault(a.c, n_ops - 1); /* the last op of the update phase */
  int at = 0;
  ck_assert_int_ne(try_steps(&a, 3, 4, &at), DP_OK);
  ck_assert_int_ne(try_steps(&a, 3, 4, &at), DP_OK); /* poisoned: refused */
  dp_status s = dp_ckpt_save(a.c, t.path);
  ck_assert_int_eq(s, DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_ctx_error(a.c), "refusing to save"));
  load_ok(&a, t.path); /* the file saved at step 3 is intact */
  run_steps(&a, 3, 6);
  run_steps(&ref, 3, 6);
  assert_same_params(&a, &ref, "after healing by load");
  rig_close(&a);
  rig_close(&ref);
  tmp_done(&t);
}
END_TEST

Suite *checkpoint_suite(void) {
  Suite *s = suite_create("checkpoint");

  TCase *tc = tcase_create("resume");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_resume_equals_straight_run, 0, 2 * N_RESUME);
  tcase_add_test(tc, test_load_over_trained_context);
  tcase_add_test(tc, test_resume_with_shared_params);
  tcase_add_loop_test(tc, test_amsgrad_resume_and_mismatch_refused, 0, 2);
  tcase_add_test(tc, test_ckpt_bytes_is_the_file_size);
  suite_add_tcase(s, tc);

  tc = tcase_create("format");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_format_is_as_documented);
  tcase_add_test(tc, test_rate_in_effect_round_trips_and_version_1_still_loads);
  tcase_add_test(tc, test_every_reader_takes_every_version);
  tcase_add_loop_test(tc, test_file_bytes_independent_of_devices_and_mode, 0, 3);
  suite_add_tcase(s, tc);

  tc = tcase_create("inference");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_inference_context_takes_parameters_only);
  suite_add_tcase(s, tc);

  tc = tcase_create("damage");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_truncated_file_is_refused, 1, 3);
  tcase_add_test(tc, test_wrong_model_fields_are_named);
  tcase_add_test(tc, test_section_of_wrong_length_is_named);
  tcase_add_test(tc, test_header_of_a_huge_model_is_refused_by_size);
  tcase_add_loop_test(tc, test_flipped_bit_is_refused, 0, 3);
  tcase_add_test(tc, test_nonfinite_values_are_refused);
  tcase_add_test(tc, test_negative_second_moment_is_refused);
  tcase_add_test(tc, test_step_out_of_range_is_refused);
  tcase_add_test(tc, test_momentum_out_of_range_is_refused);
  tcase_add_test(tc, test_resealed_mutations_are_refused_or_exact);
  suite_add_tcase(s, tc);

  tc = tcase_create("crash");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_killed_save_leaves_loadable_checkpoint);
  suite_add_tcase(s, tc);

  tc = tcase_create("poison");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_poisoned_context_refuses_save_and_load_heals_it);
  suite_add_tcase(s, tc);

  tc = tcase_create("mismatch");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_model_mismatch_is_refused);
  tcase_add_test(tc, test_optimizer_and_seed_mismatch_is_refused);
  tcase_add_test(tc, test_io_errors);
  tcase_add_test(tc, test_fifo_without_writer_is_refused_at_once);
  suite_add_tcase(s, tc);
  return s;
}
