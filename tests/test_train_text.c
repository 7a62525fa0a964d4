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
#include <signal.h>
#include <sys/wait.h>
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
  *ids = malloc((t.n ? t.n : 1) * sizeof **ids);
  for (size_t i = 0; i < t.n; i++) (*ids)[i] = dpt_token(&t, i);
  size_t n = t.n;
  dpt_tokens_free(&t);
  return n;
}

#define TRAIN(...) capture_cmd(dpt_cmd_train, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__))
#define GEN(...) capture_cmd(dpt_cmd_generate, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__))
#define PREDICT(...) capture_cmd(dpt_cmd_predict, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__))

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

/* docs/TOOL.md's sequence example, as it reads there (an outside check, session
 * 23, found its model missing from the repository): examples/small_gpt.dpm on the
 * GPL text Debian ships gives its figures, which the same bits give on every
 * machine and tier. */
START_TEST(the_documented_small_gpt_run_gives_its_figures) {
  char gpl[] = "/usr/share/common-licenses/GPL-3";
  if (access(gpl, R_OK) != 0) {
    fprintf(stderr,
            "NOTE train_text: the_documented_small_gpt_run_gives_its_figures: no "
            "%s on this system; skipped\n",
            gpl);
    return;
  }
  cmd_result r = TRAIN("--model", "examples/small_gpt.dpm", "--text", gpl, "--devices", "2",
                       "--batch", "32", "--epochs", "2", "--optimizer", "adamw", "--lr",
                       "0.003", "--eval-every", "1");
  ok(&r);
  static const char *const want[] = {
      "35149 bytes, 1756 training / 440 held-out windows (the tail) of 16 + 1",
      "epoch   1/2  loss 3.6477  ",
      "held-out 3.8039 nats/byte  perplexity 44.88",
      "epoch   2/2  loss 2.8141  ",
      "held-out: 3.5020 nats/byte, perplexity 33.18, next-byte accuracy 20.06% (440 "
      "windows)",
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    ck_assert_msg(strstr(r.out, want[i]), "'%s' not in:\n%s", want[i], r.out);
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
/* dp predict on a sequence model: rows of T = 8 ids with, first, the token
 * after them as the label; the accuracy is the last position's class against
 * it (it printed 0.00% whatever the predictions were). Labels: the first 5
 * rows' the class predicted (from a features-only pass), the other 5 another
 * one; a label past the vocabulary is refused naming the classes. */
static void predict_scores_the_last_position(char *ck, const int32_t *ids) {
  char rows[128], feats[128], line[256];
  FILE *f = fopen(in_dir(feats, sizeof feats, "feats.csv"), "w");
  for (int r = 0; r < 10; r++)
    for (int t = 0; t < 8; t++) fprintf(f, "%d%c", ids[r * 9 + t], t == 7 ? '\n' : ',');
  fclose(f);
  cmd_result plain = PREDICT("--checkpoint", ck, "--data", feats, "--features-only");
  ok(&plain);
  f = fopen(in_dir(rows, sizeof rows, "rows.csv"), "w");
  const char *p = plain.out;
  for (int r = 0; r < 10; r++) {
    int cls[8];
    for (int t = 0; t < 8; t++) cls[t] = (int)strtol(p, (char **)&p, 10), p++;
    int label = r < 5 ? cls[7] : (cls[7] + 1) % 256;
    fprintf(f, "%d", label);
    for (int t = 0; t < 8; t++) fprintf(f, ",%d", ids[r * 9 + t]);
    fputc('\n', f);
    p = strchr(p, '\n') + 1;
  }
  fclose(f);
  cmd_result got = PREDICT("--checkpoint", ck, "--data", rows);
  ok(&got);
  ck_assert_msg(strstr(got.err, "accuracy 50.00% (the last position"), "%s", got.err);
  ck_assert_str_eq(got.out, plain.out); /* the same predictions */
  f = fopen(rows, "a");
  snprintf(line, sizeof line, "256,1,2,3,4,5,6,7,8\n");
  fputs(line, f);
  fclose(f);
  cmd_result bad = PREDICT("--checkpoint", ck, "--data", rows);
  ck_assert_int_eq(bad.rc, 1);
  ck_assert_msg(strstr(bad.err, "256 classes per position") || strstr(bad.err, "label 256"),
                "%s", bad.err);
  /* a token outside the vocabulary in a later batch: named by its data row
   * (it was "rows 257..300: token 300 at position 3 of row 23"), and nothing
   * written */
  char many[128], out[128];
  f = fopen(in_dir(many, sizeof many, "many.csv"), "w");
  for (int r = 0; r < 300; r++)
    for (int t = 0; t < 8; t++)
      fprintf(f, "%d%c", r == 279 && t == 3 ? 300 : 5, t == 7 ? '\n' : ',');
  fclose(f);
  cmd_result far = PREDICT("--checkpoint", ck, "--data", many, "--features-only", "--out",
                           in_dir(out, sizeof out, "p.csv"));
  ck_assert_int_eq(far.rc, 1);
  ck_assert_msg(strstr(far.err, "many.csv: row 280, position 3: token 300 is not an id of "
                                "the checkpoint's model (0 to 255"),
                "%s", far.err);
  ck_assert_int_ne(access(out, F_OK), 0);
  cmd_result_free(&far);
  cmd_result_free(&plain);
  cmd_result_free(&got);
  cmd_result_free(&bad);
}

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
  predict_scores_the_last_position(ck, ids);
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

/* A token run saved with --no-shuffle or --data-seed resumes (its record's
 * kind is followed by shuffle=0 / data-seed=N: an outside check found such
 * runs refused as "trained on --data"), bit for bit as the run without a stop;
 * --text and --tokens both. */
START_TEST(resume_with_no_shuffle_or_data_seed) {
  char model[128], text[128], ck[128], npy[128];
  gpt_spec("g.dpm", 256, 256, model, sizeof model);
  make_text(in_dir(text, sizeof text, "t.txt"), 600);
  int32_t *ids;
  size_t n = file_ids(text, &ids);
  write_npy(in_dir(npy, sizeof npy, "t.npy"), ids, n, 4);
  free(ids);
  in_dir(ck, sizeof ck, "r.ckpt");
  static char *const order[][2] = {{"--no-shuffle", "--quiet"}, {"--data-seed", "7"}};
  for (int k = 0; k < 2; k++)
    for (int o = 0; o < 2; o++) {
      char *kind = k ? "--tokens" : "--text", *file = k ? npy : text;
#define RUN(...)                                                                           \
  TRAIN("--model", model, kind, file, "--batch", "8", "--optimizer", "sgd", "--lr",        \
        "0.05", order[o][0], order[o][1], __VA_ARGS__)
      cmd_result full = RUN("--epochs", "2");
      cmd_result first = RUN("--epochs", "1", "--save", ck);
      cmd_result second = RUN("--epochs", "1", "--resume", ck);
#undef RUN
      ok(&full);
      ok(&first);
      ck_assert_msg(second.rc == 0, "%s %s: exit %d: %s", kind, order[o][0], second.rc,
                    second.err);
      char hf[24], h2[24];
      hash_of(&full, hf);
      hash_of(&second, h2);
      ck_assert_msg(!strcmp(hf, h2), "%s %s: resumed %s, without a stop %s", kind,
                    order[o][0], h2, hf);
      cmd_result_free(&full);
      cmd_result_free(&first);
      cmd_result_free(&second);
    }
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
  refused(
      TRAIN("--model", model, "--text", text, "--batch", "8", "--standardize", "channel"),
      2, "--standardize channel is for --data features; token ids are never standardised");
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

/* --data's companions (--val-data, --val-labels, --labels, --header) beside
 * --text or --tokens are refused as usage errors: they were ignored, so
 * --val-data V --eval-every 1 trained with no held-out set at all (V never
 * read), printed "held-out -nan" and stopped early under --patience. */
START_TEST(data_options_beside_a_token_stream_are_refused) {
  char model[128], text[128], missing[128];
  gpt_spec("g.dpm", 256, 256, model, sizeof model);
  make_text(in_dir(text, sizeof text, "t.txt"), 400);
  in_dir(missing, sizeof missing, "nonexistent.txt");
  refused(TRAIN("--model", model, "--text", text, "--batch", "8", "--val-data", missing,
                "--eval-every", "1"),
          2,
          "--val-data goes with --data; --text trains on its windows and holds out its "
          "tail");
  refused(TRAIN("--model", model, "--text", text, "--batch", "8", "--val-data", text,
                "--val-labels", text),
          2, "--val-data goes with --data");
  refused(TRAIN("--model", model, "--tokens", text, "--batch", "8", "--labels", text), 2,
          "--labels goes with --data; --tokens trains");
  refused(TRAIN("--model", model, "--text", text, "--batch", "8", "--header"), 2,
          "--header goes with --data");
}
END_TEST

/* A --tokens .npy whose data runs past its shape is refused, as every other
 * .npy reader refuses it: it trained on the ids its shape covered, silently. */
START_TEST(tokens_with_trailing_bytes_are_refused) {
  char model[128], npy[128];
  gpt_spec("g.dpm", 256, 256, model, sizeof model);
  int32_t ids[400];
  for (int i = 0; i < 400; i++) ids[i] = i % 37;
  write_npy(in_dir(npy, sizeof npy, "ids.npy"), ids, 400, 4);
  /* the same header with 4 more bytes after the data */
  FILE *f = fopen(npy, "ab");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fwrite("\1\0\0\0", 1, 4, f), 4);
  ck_assert_int_eq(fclose(f), 0);
  refused(
      TRAIN("--model", model, "--tokens", npy, "--batch", "8"), 1,
      "ids.npy: byte 60: shape (400,) of '<i4' is 1600 bytes of data; the file has 1604 "
      "after its header (trailing bytes)");
}
END_TEST

/* ---- stopping safely: signals, --save-every, --save-best ------------------- */

/* A record of a run saved inside an epoch: its last line "position N" reads
 * back (0 without it); a position out of range, or not last, is refused. */
START_TEST(run_record_position_round_trips) {
  dpt_scaler none = {0}, got;
  size_t n;
  int epochs, rows;
  char err[256];
  char *text = dpt_run_text_at(4, 17, 299, &none, "seed=0 data=text", &n);
  ck_assert_ptr_nonnull(text);
  ck_assert_msg(dpt_run_parse(text, n, &epochs, &rows, &got, NULL, err, sizeof err) == 0,
                "%s", err);
  ck_assert(epochs == 4 && rows == 299 && got.n == 0);
  ck_assert_int_eq(dpt_run_position(text, n), 17);
  free(text);
  text = dpt_run_text(4, 299, &none, "seed=0", &n);
  ck_assert_int_eq(dpt_run_position(text, n), 0);
  ck_assert(!strstr(text, "position"));
  free(text);
  static const char *const bad[] = {
      "libdp-train 1\nepochs 3\nrows 5\nstandardize 0\nfeatures 0\nposition -1\n",
      "libdp-train 1\nepochs 3\nrows 5\nstandardize 0\nfeatures 0\nposition 2147483648\n",
      "libdp-train 1\nepochs 3\nrows 5\nstandardize 0\nfeatures 0\nposition 2\nsettings "
      "a=1\n"};
  for (int i = 0; i < 3; i++)
    ck_assert_msg(dpt_run_parse(bad[i], strlen(bad[i]), &epochs, &rows, &got, NULL, err,
                                sizeof err) == -1,
                  "case %d taken", i);
}
END_TEST

/* The dp binary next to this test binary, or "" when absent. */
static void dp_binary(char *path, size_t cap) {
  char self[512];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  path[0] = '\0';
  if (n <= 0) return;
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  if (!slash) return;
  *slash = '\0';
  snprintf(path, cap, "%s/dp", self);
  if (access(path, X_OK) != 0) path[0] = '\0';
}

/* `dp train ARGS` as a child process, its output in dir/out and dir/err. */
static pid_t spawn_train(const char *dp, char *const *args) {
  char *argv[64] = {(char *)dp, "train"};
  int n = 2;
  for (; args[n - 2]; n++) argv[n] = args[n - 2];
  argv[n] = NULL;
  char out[128], err[128];
  in_dir(out, sizeof out, "out");
  in_dir(err, sizeof err, "err");
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  ck_assert(pid >= 0);
  if (pid == 0) {
    if (!freopen(out, "w", stdout) || !freopen(err, "w", stderr)) _exit(126);
    execv(dp, argv);
    _exit(127);
  }
  return pid;
}

/* Waits until the file has `lines` lines (the child's log); 0, or -1 when
 * the child ended first or 60 s went by. */
static int wait_lines(pid_t pid, const char *path, int lines) {
  for (int i = 0; i < 6000; i++) {
    FILE *f = fopen(path, "r");
    int n = 0;
    for (int c; f && (c = fgetc(f)) != EOF;) n += c == '\n';
    if (f) fclose(f);
    if (n >= lines) return 0;
    if (waitpid(pid, NULL, WNOHANG) != 0) return -1;
    usleep(10000);
  }
  return -1;
}

/* The child's end: its exit status, or 128 + the signal that killed it. */
static int child_status(pid_t pid) {
  int st;
  ck_assert(waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char *b = calloc(1, 65536);
  ck_assert_ptr_nonnull(b);
  size_t n = fread(b, 1, 65535, f);
  b[n] = '\0';
  fclose(f);
  return b;
}

/* The run record of a checkpoint: epochs done, calls done in the next. */
static void record_of(const char *ck, int *epochs, int *position) {
  void *app;
  size_t n;
  int rows;
  dpt_scaler sc;
  char err[256];
  ck_assert_msg(dp_ckpt_read_app(ck, &app, &n) == DP_OK, "%s", dp_last_error());
  ck_assert_msg(dpt_run_parse(app, n, epochs, &rows, &sc, NULL, err, sizeof err) == 0, "%s",
                err);
  *position = dpt_run_position(app, n);
  free(app);
  dpt_scaler_free(&sc);
}

/* The parameter hash `dp train ARGS --epochs E` prints (in-process). */
static void hash_after(char *const *args, int n_args, int epochs, char *hash) {
  char *argv[40] = {"train"}, ep[16];
  int n = 1;
  for (int i = 0; i < n_args; i++) argv[n++] = args[i];
  snprintf(ep, sizeof ep, "%d", epochs);
  argv[n++] = "--epochs";
  argv[n++] = ep;
  argv[n] = NULL;
  cmd_result r = capture_cmd(dpt_cmd_train, n, argv);
  ok(&r);
  hash_of(&r, hash);
  cmd_result_free(&r);
}

/* The files of a run to stop: the dp binary, a spec, a text of 3000 bytes, and
 * the paths of the checkpoint, the log and the run's stderr. */
typedef struct {
  char dp[600], model[128], text[128], ck[128], log[128], err[128];
} stop_files;

/* 0, or 1 (said) when there is no dp binary to run. */
static int stop_setup(stop_files *f) {
  dp_binary(f->dp, sizeof f->dp);
  if (!f->dp[0]) {
    fprintf(stderr, "NOTE train_text: no dp binary next to the test binary; skipped\n");
    return 1;
  }
  gpt_spec("g.dpm", 256, 256, f->model, sizeof f->model);
  make_text(in_dir(f->text, sizeof f->text, "t.txt"), 3000);
  in_dir(f->ck, sizeof f->ck, "run.ckpt");
  in_dir(f->log, sizeof f->log, "run.jsonl");
  in_dir(f->err, sizeof f->err, "err");
  return 0;
}

/* A signal in an epoch's last step (here each epoch is one step: the batch is
 * all 1437 training rows of the digits): the epoch completes, its log record
 * written, before the stop; in the run's last epoch the run ends as usual, exit
 * 0 (an outside check, session 24: the record was lost, and a stop in the last
 * step printed a resume with --epochs 0, which dp train refuses). */
START_TEST(a_signal_in_an_epochs_last_step_completes_the_epoch) {
  char dp[600], model[128], ck[128], log[128], errp[128];
  dp_binary(dp, sizeof dp);
  if (!dp[0]) {
    fprintf(stderr, "NOTE train_text: no dp binary next to the test binary; skipped\n");
    return;
  }
  FILE *f = fopen(in_dir(model, sizeof model, "wide.dpm"), "w");
  ck_assert_ptr_nonnull(f);
  fputs("input 64\nlinear 2048\nrelu\nlinear 2048\nrelu\nlinear 10\n"
        "loss softmax_cross_entropy\n",
        f);
  fclose(f);
  in_dir(ck, sizeof ck, "one.ckpt");
  in_dir(log, sizeof log, "one.jsonl");
  in_dir(errp, sizeof errp, "err");
  static char *const epochs[2] = {"100000", "2"};
  for (int k = 0; k < 2; k++) {
    unlink(ck);
    unlink(log);
    char *args[] = {"--model", model,    "--data", "data/digits.csv", "--batch", "1437",
                    "--quiet", "--save", ck,       "--log",           log,       "--epochs",
                    epochs[k], NULL};
    pid_t pid = spawn_train(dp, args);
    ck_assert_msg(wait_lines(pid, log, 1) == 0, "the run ended before its first epoch");
    kill(pid, SIGINT);
    int st = child_status(pid);
    char *err = read_text(errp);
    FILE *lf = fopen(log, "r");
    ck_assert_ptr_nonnull(lf);
    int records = 0;
    for (int c; (c = fgetc(lf)) != EOF;) records += c == '\n';
    fclose(lf);
    if (k == 1) { /* the last epoch's step: the run ends as usual */
      ck_assert_msg(st == 0, "exit %d: %s", st, err);
      ck_assert_int_eq(records, 2);
    } else {
      ck_assert_msg(st == 130, "exit %d: %s", st, err);
      const char *at = strstr(err, "at the end of epoch ");
      ck_assert_msg(at, "%s", err);
      int e = atoi(at + 20);
      ck_assert_int_eq(records, e); /* the stopped epoch's record too */
      char want[64];
      snprintf(want, sizeof want, " --epochs %d", 100000 - e);
      ck_assert_msg(strstr(err, want), "'%s' not in %s", want, err);
    }
    free(err);
  }
}
END_TEST

/* SIGINT, then SIGTERM, mid-run: exit 130 and 143, after saving; the line
 * names the checkpoint and the command that goes on, and that command (with
 * fewer epochs) gives the parameter hash of the uninterrupted run to the same
 * epoch, the stopped epoch finished from where it stopped. */
START_TEST(a_signal_saves_and_the_printed_command_resumes) {
  stop_files f;
  if (stop_setup(&f)) return;
  char *dp = f.dp, *model = f.model, *text = f.text, *ck = f.ck, *log = f.log,
       *errp = f.err;
  char *base[] = {"--model",     model,   "--text", text,   "--batch", "8",
                  "--optimizer", "adamw", "--lr",   "0.01", "--seed",  "3"};
  const int sigs[2] = {SIGINT, SIGTERM};
  for (int k = 0; k < 2; k++) {
    unlink(ck);
    unlink(log);
    char *args[] = {base[0],  base[1], base[2], base[3],  base[4],  base[5],    base[6],
                    base[7],  base[8], base[9], base[10], base[11], "--epochs", "100000",
                    "--save", ck,      "--log", log,      NULL};
    pid_t pid = spawn_train(dp, args);
    ck_assert_msg(wait_lines(pid, log, 1) == 0, "the run ended before its first epoch");
    usleep(3000 * (k + 1)); /* somewhere inside an epoch */
    kill(pid, sigs[k]);
    ck_assert_int_eq(child_status(pid), 128 + sigs[k]);
    char *err = read_text(errp);
    ck_assert_msg(
        strstr(err, k ? "SIGTERM: stopped after step " : "SIGINT: stopped after step "),
        "%s", err);
    ck_assert_msg(strstr(err, "; saved "), "%s", err);
    char *cmd = strstr(err, "to go on: ");
    ck_assert_msg(cmd, "%s", err);
    cmd += 10;
    *strchr(cmd, '\n') = '\0';
    /* the epochs left: 100000 less those done */
    char *ep = strstr(cmd, " --epochs ");
    ck_assert_msg(ep && strstr(cmd, " --resume ") && strstr(cmd, " --save "), "%s", cmd);
    int left = atoi(ep + 10), epochs, position;
    record_of(ck, &epochs, &position);
    ck_assert_int_eq(left, 100000 - epochs);
    /* go on for 2 epochs: the stopped one to its end, and one more */
    char line[4096];
    snprintf(line, sizeof line, "%.*s --epochs 2 --quiet > %s/resumed 2>&1",
             (int)(ep - cmd), cmd, dir);
    ck_assert_msg(system(line) == 0, "%s", line);
    char resumed[128], h_res[24], h_full[24];
    char *out = read_text(in_dir(resumed, sizeof resumed, "resumed"));
    cmd_result rr = {.out = out};
    hash_of(&rr, h_res);
    hash_after(base, 12, epochs + 2, h_full);
    ck_assert_msg(!strcmp(h_res, h_full),
                  "stopped at epoch %d + %d calls: resumed %s, whole %s", epochs, position,
                  h_res, h_full);
    free(out);
    free(err);
  }
}
END_TEST

/* A second signal ends the run at once (no save); the checkpoint that
 * --save-every wrote before stays whole, and a crash (SIGKILL) leaves one
 * that resumes exactly: saved every 7 steps, inside an epoch. */
START_TEST(a_second_signal_exits_at_once_and_periodic_saves_resume) {
  stop_files f;
  if (stop_setup(&f)) return;
  char *dp = f.dp, *model = f.model, *text = f.text, *ck = f.ck, *log = f.log,
       *errp = f.err;
  char *base[] = {"--model", model,         "--text", text,   "--batch",
                  "8",       "--optimizer", "adamw",  "--lr", "0.01"};
  char *args[] = {base[0],        base[1], base[2], base[3],    base[4],  base[5],  base[6],
                  base[7],        base[8], base[9], "--epochs", "100000", "--save", ck,
                  "--save-every", "7",     "--log", log,        NULL};
  /* both signals pending when it runs on (which is handled first is the
   * kernel's choice): the second finds the first's flag */
  pid_t pid = spawn_train(dp, args);
  ck_assert_msg(wait_lines(pid, log, 2) == 0, "the run ended before its second epoch");
  kill(pid, SIGSTOP);
  kill(pid, SIGINT);
  kill(pid, SIGTERM);
  kill(pid, SIGCONT);
  int rc = child_status(pid); /* 128 + the second one's number */
  ck_assert_msg(rc == 130 || rc == 143, "exit %d", rc);
  char *err = read_text(errp);
  ck_assert_msg(strstr(err, "second signal: stopped at once"), "%s", err);
  ck_assert_msg(!strstr(err, "saved"), "%s", err);
  free(err);
  dp_ckpt_summary sum;
  ck_assert_msg(dp_ckpt_info(ck, NULL, &sum) == DP_OK, "%s", dp_last_error());
  int epochs, position;
  record_of(ck, &epochs, &position);
  /* 299 windows, 38 calls an epoch: saved at a multiple of 7 steps */
  ck_assert_int_eq((epochs * 38 + position) % 7, 0);
  ck_assert_int_ge(epochs, 1);

  /* killed outright: the last periodic checkpoint resumes exactly */
  unlink(log);
  pid = spawn_train(dp, args);
  ck_assert_msg(wait_lines(pid, log, 1) == 0, "the run ended before its first epoch");
  usleep(5000);
  kill(pid, SIGKILL);
  ck_assert_int_eq(child_status(pid), 128 + SIGKILL);
  record_of(ck, &epochs, &position);
  ck_assert_int_eq((epochs * 38 + position) % 7, 0);
  char *more[] = {base[0], base[1], base[2], base[3], base[4],    base[5],
                  base[6], base[7], base[8], base[9], "--resume", ck};
  char h_res[24], h_full[24];
  hash_after(more, 12, 2, h_res);
  hash_after(base, 10, epochs + 2, h_full);
  ck_assert_msg(!strcmp(h_res, h_full),
                "saved at epoch %d + %d calls: resumed %s, whole %s", epochs, position,
                h_res, h_full);
}
END_TEST

/* --save-every Ne saves at the end of every N epochs' steps (in-process: the
 * lines it prints); --save-best keeps the checkpoint of the best held-out
 * loss, and with --patience the early stop restores it: the report and the
 * hash are those of the run to that epoch. */
START_TEST(save_every_epochs_and_save_best_restores) {
  char model[128], text[128], ck[128], best[128];
  gpt_spec("g.dpm", 256, 256, model, sizeof model);
  make_text(in_dir(text, sizeof text, "t.txt"), 1500);
  in_dir(ck, sizeof ck, "run.ckpt");
  in_dir(best, sizeof best, "best.ckpt");
  /* 149 training windows, 19 calls an epoch */
  cmd_result r = TRAIN("--model", model, "--text", text, "--batch", "8", "--epochs", "5",
                       "--save", ck, "--save-every", "2e");
  ok(&r);
  ck_assert_msg(strstr(r.out, "(step 38, --save-every)") &&
                    strstr(r.out, "(step 76, --save-every)") &&
                    !strstr(r.out, "(step 57, --save-every)"),
                "%s", r.out);
  /* each after the line of the epoch it ends (an outside check, session 23: it
   * came before) */
  const char *e2 = strstr(r.out, "epoch   2/5"),
             *s38 = strstr(r.out, "(step 38, --save-every)"),
             *e3 = strstr(r.out, "epoch   3/5");
  ck_assert_msg(e2 && e3 && e2 < s38 && s38 < e3, "%s", r.out);
  cmd_result_free(&r);
  char *base[] = {"--model",     model,   "--text", text,   "--batch", "8",
                  "--optimizer", "adamw", "--lr",   "0.05", "--seed",  "1"};
  cmd_result b =
      TRAIN("--model", model, "--text", text, "--batch", "8", "--optimizer", "adamw",
            "--lr", "0.05", "--seed", "1", "--epochs", "60", "--eval-every", "1",
            "--patience", "2", "--save-best", best, "--save", ck);
  ok(&b);
  const char *stop = strstr(b.out, "early stop at epoch ");
  ck_assert_msg(stop, "%s", b.out);
  const char *at = strstr(stop, "at epoch ");
  at = strstr(at + 1, "at epoch ");
  int best_ep = atoi(at + 9);
  char want[256];
  snprintf(want, sizeof want, "restored the best checkpoint %s (epoch %d,", best, best_ep);
  ck_assert_msg(strstr(b.out, want), "%s", b.out);
  ck_assert_msg(strstr(b.out, "best: saved"), "%s", b.out);
  char h_best[24], h_run[24];
  hash_of(&b, h_best);
  hash_after(base, 12, best_ep, h_run);
  ck_assert_str_eq(h_best, h_run);
  int epochs, position;
  record_of(ck, &epochs, &position);
  ck_assert_int_eq(epochs, best_ep);
  record_of(best, &epochs, &position);
  ck_assert_int_eq(epochs, best_ep);
  ck_assert_int_eq(position, 0);
  cmd_result_free(&b);
  refused(TRAIN("--model", model, "--text", text, "--batch", "8", "--save-every", "3"), 2,
          "--save-every needs --save FILE");
  refused(TRAIN("--model", model, "--text", text, "--batch", "8", "--save", ck,
                "--save-every", "0.5"),
          2, "--save-every: '0.5' is not a number of optimizer steps");
  refused(TRAIN("--model", model, "--text", text, "--batch", "8", "--save-best", best), 2,
          "--save-best needs --eval-every");
}
END_TEST

Suite *train_text_suite(void) {
  Suite *s = suite_create("train_text");
  TCase *tc = tcase_create("train_text");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, text_run_trains_and_the_loss_falls);
  tcase_add_test(tc, the_documented_small_gpt_run_gives_its_figures);
  tcase_add_test(tc, tokens_int32_and_uint16_train_as_the_text);
  tcase_add_test(tc, steps_are_the_windows_in_the_epoch_order);
  tcase_add_test(tc, save_resume_is_bit_exact_and_generate_reads_it);
  tcase_add_test(tc, resume_with_no_shuffle_or_data_seed);
  tcase_add_test(tc, refusals_name_what_is_wrong);
  tcase_add_test(tc, data_options_beside_a_token_stream_are_refused);
  tcase_add_test(tc, tokens_with_trailing_bytes_are_refused);
  suite_add_tcase(s, tc);
  tc = tcase_create("stop");
  tcase_set_timeout(tc, 180);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, run_record_position_round_trips);
  tcase_add_test(tc, a_signal_saves_and_the_printed_command_resumes);
  tcase_add_test(tc, a_signal_in_an_epochs_last_step_completes_the_epoch);
  tcase_add_test(tc, a_second_signal_exits_at_once_and_periodic_saves_resume);
  tcase_add_test(tc, save_every_epochs_and_save_best_restores);
  suite_add_tcase(s, tc);
  return s;
}
