/* tests/test_train_text.c — `dp train --text` and `--tokens` (tools/cmd_train.c):
 * a sequence model trains on the windows of a text's bytes or of a .npy of
 * token ids, its held-out tail in nats per token; a saved run resumes bit for
 * bit and `dp generate` continues from its checkpoint; every refusal before
 * anything runs. */
#include "capture.h"
#include "cli.h"
#include "data.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Context 8, vocabulary V, one block. */
static const char GPT_FMT[] = "input tokens 8\n"
                              "embed %d 16\n"
                              "residual\n"
                              "  layernorm\n"
                              "  linear 48\n"
                              "  attention 2\n"
                              "  linear 16\n"
                              "end\n"
                              "layernorm\n"
                              "linear %d\n"
                              "loss softmax_cross_entropy\n";
enum { T = 8 };

static char dir[64];

static void setup(void) {
  strcpy(dir, "/tmp/dpt_text_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

static char *in_dir(char *path, size_t cap, const char *name) {
  snprintf(path, cap, "%s/%s", dir, name);
  return path;
}

static void write_bytes(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert(fwrite(b, 1, n, f) == n);
  ck_assert_int_eq(fclose(f), 0);
}

/* A spec of vocabulary V in (and Vout logits per position out) in dir/name. */
static void gpt_spec(const char *name, int V, int Vout, char *path, size_t cap) {
  char spec[512];
  snprintf(spec, sizeof spec, GPT_FMT, V, Vout);
  write_bytes(in_dir(path, cap, name), spec, strlen(spec));
}

/* n bytes of an English-like text (words drawn from a short list by a fixed
 * generator: repetitive enough to learn in a few steps). */
static void make_text(const char *path, size_t n) {
  static const char *const words[] = {"the ", "cat ", "sat ", "on ", "a ",  "mat. ",
                                      "and ", "dog ", "ran ", "to ", "it, "};
  char *b = malloc(n + 16);
  ck_assert_ptr_nonnull(b);
  uint32_t s = 12345;
  size_t k = 0;
  while (k < n) {
    s = s * 1103515245u + 12345u;
    const char *w = words[(s >> 16) % (sizeof words / sizeof *words)];
    for (size_t i = 0; w[i] && k < n; i++) b[k++] = w[i];
  }
  write_bytes(path, b, n);
  free(b);
}

/* A 1-D .npy (version 1.0) of ids as '<i4' (width 4) or '<u2' (width 2). */
static void write_npy(const char *path, const int32_t *ids, size_t n, int width) {
  char head[128];
  int hl = snprintf(head, sizeof head,
                    "{'descr': '%s', 'fortran_order': False, 'shape': (%zu,), }",
                    width == 4 ? "<i4" : "<u2", n);
  while ((10 + hl + 1) % 64) head[hl++] = ' ';
  head[hl++] = '\n';
  size_t total = 10 + (size_t)hl + n * (size_t)width;
  unsigned char *b = malloc(total);
  ck_assert_ptr_nonnull(b);
  memcpy(b, "\x93NUMPY\x01\x00", 8);
  b[8] = (unsigned char)(hl & 0xff);
  b[9] = (unsigned char)(hl >> 8);
  memcpy(b + 10, head, (size_t)hl);
  for (size_t i = 0; i < n; i++)
    for (int j = 0; j < width; j++)
      b[10 + hl + i * (size_t)width + (size_t)j] =
          (unsigned char)((uint32_t)ids[i] >> 8 * j);
  write_bytes(path, b, total);
  free(b);
}

/* The bytes of a file as ids. */
static size_t file_ids(const char *path, int32_t **ids) {
  dpt_tokens t;
  char err[256];
  ck_assert_msg(dpt_text_load(path, &t, err, sizeof err) == DP_OK, "%s", err);
  *ids = t.id;
  return t.n;
}

#define TRAIN(...) capture_cmd(dpt_cmd_train, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__))
#define GEN(...) capture_cmd(dpt_cmd_generate, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__))

static void hash_of(const cmd_result *r, char *out) {
  const char *h = strstr(r->out, "parameter hash: ");
  ck_assert_msg(h, "no hash in: %s", r->out);
  snprintf(out, 17, "%s", h + 16);
}

static void ok(const cmd_result *r) {
  ck_assert_msg(r->rc == 0, "exit %d: %s%s", r->rc, r->out, r->err);
}

/* A number after `key` in a JSON line. */
static double json_value(const char *line, const char *key) {
  const char *k = strstr(line, key);
  ck_assert_msg(k, "%s not in %s", key, line);
  return strtod(k + strlen(key), NULL);
}

/* A short --text run trains: the epochs' loss and the held-out loss fall;
 * the held-out share is printed in nats per byte with its perplexity, and
 * logged (heldout_loss, heldout_perplexity = exp of it). */
START_TEST(text_run_trains_and_the_loss_falls) {
  char model[128], text[128], log[128];
  gpt_spec("g.dpm", 256, 256, model, sizeof model);
  make_text(in_dir(text, sizeof text, "t.txt"), 3000);
  in_dir(log, sizeof log, "run.jsonl");
  cmd_result r =
      TRAIN("--model", model, "--text", text, "--batch", "16", "--devices", "2", "--epochs",
            "4", "--optimizer", "adamw", "--lr", "0.01", "--eval-every", "1", "--log", log);
  ok(&r);
  /* (3000 - 1) / 8 = 374 windows, 75 held out (the tail), 299 to train on */
  ck_assert_msg(strstr(r.out, "3000 bytes, 299 training / 75 held-out windows"), "%s",
                r.out);
  ck_assert_msg(strstr(r.out, "nats/byte  perplexity "), "%s", r.out);
  ck_assert_msg(strstr(r.out, "held-out: "), "%s", r.out);
  FILE *f = fopen(log, "r");
  ck_assert_ptr_nonnull(f);
  char line[1024];
  double loss[4], held[4];
  int n = 0;
  while (n < 4 && fgets(line, sizeof line, f)) {
    loss[n] = json_value(line, "\"loss\":");
    held[n] = json_value(line, "\"heldout_loss\":");
    double ppl = json_value(line, "\"heldout_perplexity\":");
    ck_assert_msg(fabs(ppl - exp(held[n])) < 1e-6 * ppl, "%s", line);
    n++;
  }
  fclose(f);
  ck_assert_int_eq(n, 4);
  /* a uniform guess over 256 bytes is log 256 = 5.55 nats */
  ck_assert_msg(loss[3] < loss[0] && held[3] < held[0] && held[3] < 4.0,
                "loss %g -> %g, held-out %g -> %g", loss[0], loss[3], held[0], held[3]);
  cmd_result_free(&r);
}
END_TEST

/* --tokens: the text's bytes as int32 and as uint16 ids train exactly as
 * --text does (the same windows, the same parameter hash); an id outside the
 * vocabulary is refused naming its index. */
START_TEST(tokens_int32_and_uint16_train_as_the_text) {
  char model[128], m64[128], text[128], n32[128], n16[128], bad[128];
  gpt_spec("g.dpm", 256, 256, model, sizeof model);
  gpt_spec("g64.dpm", 64, 64, m64, sizeof m64);
  make_text(in_dir(text, sizeof text, "t.txt"), 1200);
  int32_t *ids;
  size_t n = file_ids(text, &ids);
  write_npy(in_dir(n32, sizeof n32, "t32.npy"), ids, n, 4);
  write_npy(in_dir(n16, sizeof n16, "t16.npy"), ids, n, 2);
  char h[3][24];
  char *files[3][2] = {{"--text", text}, {"--tokens", n32}, {"--tokens", n16}};
  for (int k = 0; k < 3; k++) {
    cmd_result r = TRAIN("--model", model, files[k][0], files[k][1], "--batch", "8",
                         "--epochs", "2", "--optimizer", "adamw", "--lr", "0.01");
    ok(&r);
    if (k) ck_assert_msg(strstr(r.out, "1200 token ids, "), "%s", r.out);
    if (k) ck_assert_msg(strstr(r.out, "nats/token"), "%s", r.out);
    hash_of(&r, h[k]);
    cmd_result_free(&r);
  }
  ck_assert_str_eq(h[1], h[0]);
  ck_assert_str_eq(h[2], h[0]);
  ids[0] = 63; /* the last id of a vocabulary of 64 */
  ids[1] = 300;
  write_npy(in_dir(bad, sizeof bad, "bad.npy"), ids, n, 4);
  cmd_result r = TRAIN("--model", m64, "--tokens", bad, "--batch", "8");
  ck_assert_int_eq(r.rc, 1);
  ck_assert_msg(strstr(r.err, "id 300 at index 1 is outside the model's vocabulary 0..63"),
                "%s", r.err);
  ck_assert_str_eq(r.out, "");
  cmd_result_free(&r);
  free(ids);
}
END_TEST

/* The tool's steps are the library's on the windows: head of the text to
 * train, in dpt_epoch_order's order each epoch, a row's labels the next byte
 * at each of its positions; the same parameter hash through the API. */
START_TEST(steps_are_the_windows_in_the_epoch_order) {
  char model[128], text[128];
  gpt_spec("g.dpm", 256, 256, model, sizeof model);
  make_text(in_dir(text, sizeof text, "t.txt"), 1000);
  cmd_result r = TRAIN("--model", model, "--text", text, "--batch", "8", "--epochs", "2",
                       "--optimizer", "adamw", "--lr", "0.01", "--seed", "7");
  ok(&r);
  char h[24], want[24];
  hash_of(&r, h);
  cmd_result_free(&r);
  int32_t *ids;
  size_t n = file_ids(text, &ids);
  /* (1000 - 1) / 8 = 124 windows, 25 held out: 99 train */
  enum { ROWS = 99, B = 8 };
  dp_model *m;
  dp_plan *p;
  dp_ctx *c;
  dp_config cfg;
  dp_config_default(&cfg);
  dp_config_set_optimizer(&cfg, DP_OPT_ADAMW);
  cfg.batch = B;
  cfg.lr = 0.01f;
  cfg.seed = 7;
  ck_assert(dp_model_load(model, &m) == DP_OK);
  ck_assert(dp_plan_create(m, &cfg, &p) == DP_OK);
  ck_assert(dp_ctx_create(p, &c) == DP_OK);
  int perm[ROWS];
  float x[B * T];
  int32_t y[B * T];
  for (int ep = 0; ep < 2; ep++) {
    dpt_epoch_order(ROWS, 7, ep, perm);
    for (int from = 0; from < ROWS; from += B) {
      int rows = ROWS - from < B ? ROWS - from : B;
      for (int i = 0; i < rows; i++)
        for (int j = 0; j < T; j++) {
          size_t at = (size_t)perm[from + i] * T + (size_t)j;
          x[i * T + j] = (float)ids[at];
          y[i * T + j] = ids[at + 1];
        }
      float loss;
      ck_assert_msg(dp_train_step(c, rows, T, x, y, &loss) == DP_OK, "%s", dp_ctx_error(c));
    }
  }
  snprintf(want, sizeof want, "%016llx", (unsigned long long)dp_params_hash(c));
  ck_assert_str_eq(h, want);
  ck_assert(n == 1000);
  free(ids);
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* --save, then --resume: the parameter hash of the uninterrupted run, on two
 * devices; the record says the data was a text; dp generate continues a
 * prompt from the checkpoint; the checkpoint of a text run is not resumed on
 * tokens. */
START_TEST(save_resume_is_bit_exact_and_generate_reads_it) {
  char model[128], text[128], ck[128], npy[128];
  gpt_spec("g.dpm", 256, 256, model, sizeof model);
  make_text(in_dir(text, sizeof text, "t.txt"), 1500);
  in_dir(ck, sizeof ck, "run.ckpt");
#define RUN(...)                                                                           \
  TRAIN("--model", model, "--text", text, "--batch", "8", "--devices", "2", "--optimizer", \
        "adamw", "--lr", "0.01", "--lr-schedule", "cosine:2e", __VA_ARGS__)
  cmd_result full = RUN("--epochs", "4");
  cmd_result first = RUN("--epochs", "2", "--save", ck);
  cmd_result second = RUN("--epochs", "2", "--resume", ck, "--save", ck);
#undef RUN
  ok(&full);
  ok(&first);
  ok(&second);
  ck_assert_msg(strstr(second.out, "resumed from"), "%s", second.out);
  char hf[24], h1[24], h2[24];
  hash_of(&full, hf);
  hash_of(&first, h1);
  hash_of(&second, h2);
  ck_assert_str_eq(h2, hf);
  ck_assert_str_ne(h1, hf);
  void *app;
  size_t app_n;
  ck_assert(dp_ckpt_read_app(ck, &app, &app_n) == DP_OK);
  int epochs, rows;
  dpt_scaler sc;
  char *settings, err[256];
  ck_assert_msg(
      dpt_run_parse(app, app_n, &epochs, &rows, &sc, &settings, err, sizeof err) == 0, "%s",
      err);
  free(app);
  ck_assert_int_eq(epochs, 4);
  ck_assert_int_eq(rows, 149); /* (1500 - 1) / 8 = 187 windows, 38 held out */
  ck_assert_int_eq(sc.n, 0);   /* ids are not standardised */
  ck_assert_msg(strstr(settings, " data=text"), "%s", settings);
  free(settings);

  cmd_result g =
      GEN("--checkpoint", ck, "--prompt", "the cat", "--tokens", "12", "--greedy", "--ids");
  ok(&g);
  int got[32], n_got = 0;
  for (char *p = g.out, *e; n_got < 32; p = e) {
    long v = strtol(p, &e, 10);
    if (e == p) break;
    got[n_got++] = (int)v;
  }
  ck_assert_msg(n_got == 7 + 12, "%s", g.out);
  for (int i = 0; i < 7; i++) ck_assert_int_eq(got[i], "the cat"[i]);

  int32_t *ids;
  size_t n = file_ids(text, &ids);
  write_npy(in_dir(npy, sizeof npy, "t.npy"), ids, n, 4);
  free(ids);
  cmd_result other = TRAIN("--model", model, "--tokens", npy, "--batch", "8", "--devices",
                           "2", "--optimizer", "adamw", "--lr", "0.01", "--lr-schedule",
                           "cosine:2e", "--epochs", "1", "--resume", ck);
  ck_assert_int_eq(other.rc, 1);
  ck_assert_msg(strstr(other.err,
                       "the checkpoint's run trained on --text (bytes), this one "
                       "on --tokens"),
                "%s", other.err);
  cmd_result_free(&full);
  cmd_result_free(&first);
  cmd_result_free(&second);
  cmd_result_free(&g);
  cmd_result_free(&other);
}
END_TEST

/* Exit status rc, the message, and nothing trained. */
static void refused(cmd_result r, int rc, const char *needle) {
  ck_assert_msg(r.rc == rc, "rc %d (want %d): %s", r.rc, rc, r.err);
  ck_assert_msg(strstr(r.err, needle), "'%s' not in: %s", needle, r.err);
  ck_assert_msg(!strstr(r.out, "parameter hash"), "%s", r.out);
  cmd_result_free(&r);
}

START_TEST(refusals_name_what_is_wrong) {
  char model[128], m64[128], mse[128], narrow[128], mlp[128], text[128], empty[128],
      shortt[128], csv[128];
  gpt_spec("g.dpm", 256, 256, model, sizeof model);
  gpt_spec("g64.dpm", 64, 64, m64, sizeof m64);
  gpt_spec("narrow.dpm", 256, 100, narrow, sizeof narrow);
  char spec[512];
  snprintf(spec, sizeof spec, GPT_FMT, 256, 256);
  strcpy(strstr(spec, "loss "), "loss mse\n");
  write_bytes(in_dir(mse, sizeof mse, "mse.dpm"), spec, strlen(spec));
  write_bytes(in_dir(mlp, sizeof mlp, "mlp.dpm"), "input 8\nlinear 4\nloss mse\n", 26);
  make_text(in_dir(text, sizeof text, "t.txt"), 400); /* 49 windows: 39 + 10 */
  write_bytes(in_dir(empty, sizeof empty, "empty.txt"), "", 0);
  write_bytes(in_dir(shortt, sizeof shortt, "short.txt"), "12345678", 8);
  write_bytes(in_dir(csv, sizeof csv, "d.csv"), "1,2,3,4,5,6,7,8,9\n", 18);
  refused(TRAIN("--model", model, "--data", csv, "--text", text, "--batch", "8"), 2,
          "--data and --text: give one data file");
  refused(TRAIN("--model", model, "--text", text, "--tokens", text, "--batch", "8"), 2,
          "--text and --tokens: give one data file");
  refused(TRAIN("--model", model, "--batch", "8"), 2, "--text FILE or --tokens F.npy");
  refused(TRAIN("--model", mlp, "--text", text, "--batch", "8"), 1,
          "is not a sequence model; --text and --tokens train one whose spec starts `input "
          "tokens T`");
  refused(TRAIN("--model", model, "--data", csv, "--batch", "8"), 1,
          "is a sequence model (input tokens 8): train it on a text");
  refused(TRAIN("--model", model, "--text", empty, "--batch", "8"), 1,
          "is empty; the model's context (input tokens 8) needs windows of 9 bytes");
  refused(TRAIN("--model", model, "--text", shortt, "--batch", "8"), 1,
          "has 8 bytes; the model's context (input tokens 8) needs windows of 9 bytes");
  refused(TRAIN("--model", model, "--text", text, "--batch", "40"), 1,
          "gives 49 windows of 9 bytes: 39 to train on and 10 held out (--test-fraction "
          "0.2); --batch 40 needs 40 to train on");
  refused(TRAIN("--model", m64, "--text", text, "--batch", "8"), 1,
          ": byte 0 is "); /* a letter */
  refused(TRAIN("--model", m64, "--text", text, "--batch", "8"), 1,
          ", outside the model's vocabulary 0..63 (embed 64); a model of bytes has embed "
          "256");
  refused(TRAIN("--model", narrow, "--text", text, "--batch", "8"), 1,
          "needs 256 logits per position (its vocabulary, embed 256)");
  refused(TRAIN("--model", mse, "--text", text, "--batch", "8"), 1,
          "and `loss softmax_cross_entropy`; it has 256 per position and loss mse");
}
END_TEST

Suite *train_text_suite(void) {
  Suite *s = suite_create("train_text");
  TCase *tc = tcase_create("train_text");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, text_run_trains_and_the_loss_falls);
  tcase_add_test(tc, tokens_int32_and_uint16_train_as_the_text);
  tcase_add_test(tc, steps_are_the_windows_in_the_epoch_order);
  tcase_add_test(tc, save_resume_is_bit_exact_and_generate_reads_it);
  tcase_add_test(tc, refusals_name_what_is_wrong);
  suite_add_tcase(s, tc);
  return s;
}
