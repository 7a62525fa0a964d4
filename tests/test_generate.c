/* tests/test_generate.c — `dp generate` (tools/cmd_generate.c): a sequence
 * model's checkpoint continues a prompt, greedy or sampled, its window sliding
 * past the context; every refusal before anything runs. */
#include "capture.h"
#include "cli.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Context 8, vocabulary V (256: bytes), one block. */
static const char GPT_FMT[] = "input tokens 8\n"
                              "embed %d 24\n"
                              "residual\n"
                              "  layernorm\n"
                              "  linear 72\n"
                              "  attention 3\n"
                              "  linear 24\n"
                              "end\n"
                              "layernorm\n"
                              "linear %d\n"
                              "loss softmax_cross_entropy\n";
enum { T = 8 };

static char dir[64];

static void setup(void) {
  strcpy(dir, "/tmp/dpt_gen_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

/* A checkpoint of `spec` at its initialisation (seed 5) in dir/name. */
static void make_ckpt(const char *spec, const char *name, char *path, size_t cap) {
  dp_model *m;
  dp_plan *p;
  dp_ctx *c;
  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = 2;
  cfg.seed = 5;
  snprintf(path, cap, "%s/%s", dir, name);
  ck_assert_msg(dp_model_parse(spec, name, &m) == DP_OK, "%s", dp_last_error());
  ck_assert_msg(dp_plan_create(m, &cfg, &p) == DP_OK, "%s", dp_last_error());
  ck_assert_msg(dp_ctx_create(p, &c) == DP_OK, "%s", dp_last_error());
  ck_assert_msg(dp_ckpt_save(c, path) == DP_OK, "%s", dp_last_error());
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
}

static void gpt_ckpt(int vocab, char *path, size_t cap) {
  char spec[512], name[32];
  snprintf(spec, sizeof spec, GPT_FMT, vocab, vocab);
  snprintf(name, sizeof name, "gpt%d.ckpt", vocab);
  make_ckpt(spec, name, path, cap);
}

#define GEN(...) capture_cmd(dpt_cmd_generate, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__))

/* The ids of an --ids line. */
static int parse_ids(const char *s, int *ids, int cap) {
  int n = 0;
  char *end;
  for (long v = strtol(s, &end, 10); end != s && n < cap; v = strtol(s, &end, 10)) {
    ids[n++] = (int)v;
    s = end;
  }
  return n;
}

/* The logits of the last of `n` ids (the last T of them) through the API. */
static void last_logits(dp_ctx *c, const int *ids, int n, int V, float *z) {
  float x[T] = {0}, y[T * 256];
  int w = n < T ? n : T;
  for (int i = 0; i < w; i++) x[i] = (float)ids[n - w + i];
  ck_assert(V <= 256);
  ck_assert_msg(dp_forward(c, 1, T, x, y) == DP_OK, "%s", dp_ctx_error(c));
  memcpy(z, y + (size_t)(w - 1) * V, (size_t)V * 4);
}

/* An inference context of the checkpoint, batch 1. */
static void open_ckpt(const char *path, dp_model **m, dp_plan **p, dp_ctx **c) {
  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = 1;
  cfg.inference = 1;
  ck_assert(dp_ckpt_info(path, m, NULL) == DP_OK);
  ck_assert(dp_plan_create(*m, &cfg, p) == DP_OK);
  ck_assert(dp_ctx_create(*p, c) == DP_OK);
  ck_assert_msg(dp_ckpt_load(*c, path) == DP_OK, "%s", dp_ctx_error(*c));
}

/* Greedy: each generated id is the argmax of the model's logits over the last
 * T ids (checked through the API), past the context too; the text starts with
 * the prompt; the same run prints the same text. */
START_TEST(greedy_is_the_argmax_of_the_sliding_window) {
  char ck[128];
  gpt_ckpt(64, ck, sizeof ck);
  cmd_result r =
      GEN("--checkpoint", ck, "--prompt-ids", "1,2, 3", "--tokens", "20", "--greedy");
  ck_assert_msg(r.rc == 0, "%s", r.err);
  int ids[64], n = parse_ids(r.out, ids, 64);
  ck_assert_int_eq(n, 23);
  ck_assert(ids[0] == 1 && ids[1] == 2 && ids[2] == 3);
  dp_model *m;
  dp_plan *p;
  dp_ctx *c;
  open_ckpt(ck, &m, &p, &c);
  for (int i = 3; i < n; i++) {
    float z[64];
    last_logits(c, ids, i, 64, z);
    int best = 0;
    for (int j = 1; j < 64; j++)
      if (z[j] > z[best]) best = j;
    ck_assert_msg(ids[i] == best, "token %d: %d, the argmax is %d", i, ids[i], best);
  }
  cmd_result r2 =
      GEN("--checkpoint", ck, "--prompt-ids", "1 2 3", "--tokens", "20", "--greedy");
  ck_assert_str_eq(r2.out, r.out);
  /* an empty entry is refused, not skipped */
  static const char *const empty[] = {"1,,2", ",1", "1, ,2", "1,2,", "1,2, "};
  for (int i = 0; i < 5; i++) {
    cmd_result e = GEN("--checkpoint", ck, "--prompt-ids", (char *)empty[i], "--tokens",
                       "2", "--greedy");
    ck_assert_int_eq(e.rc, 1);
    ck_assert_msg(strstr(e.err, "--prompt-ids: an empty entry"), "%s: %s", empty[i], e.err);
    cmd_result_free(&e);
  }
  /* an id is digits: a sign is refused, not read by strtol (an outside check) */
  static const char *const signed_ids[][2] = {{"+5,3", "'+5' (entry 1)"},
                                              {"3,-0", "'-0' (entry 2)"}};
  for (int i = 0; i < 2; i++) {
    cmd_result e = GEN("--checkpoint", ck, "--prompt-ids", (char *)signed_ids[i][0],
                       "--tokens", "2", "--greedy");
    ck_assert_int_eq(e.rc, 1);
    ck_assert_msg(strstr(e.err, signed_ids[i][1]), "%s: %s", signed_ids[i][0], e.err);
    cmd_result_free(&e);
  }
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
  cmd_result_free(&r);
  cmd_result_free(&r2);
}
END_TEST

/* A prompt longer than the context: only its last T ids count, so its
 * continuation is that of those T ids alone. */
START_TEST(a_long_prompt_slides_to_its_last_context) {
  char ck[128];
  gpt_ckpt(256, ck, sizeof ck);
  cmd_result a = GEN("--checkpoint", ck, "--prompt", "0123456789abcdef", "--tokens", "12",
                     "--greedy"),
             b = GEN("--checkpoint", ck, "--prompt", "89abcdef", "--tokens", "12",
                     "--greedy");
  ck_assert_msg(a.rc == 0 && b.rc == 0, "%s%s", a.err, b.err);
  ck_assert_int_eq(strlen(a.out), 16 + 12 + 1); /* the prompt, the tokens, a newline */
  ck_assert(strncmp(a.out, "0123456789abcdef", 16) == 0);
  ck_assert(memcmp(a.out + 16, b.out + 8, 13) == 0);
  cmd_result_free(&a);
  cmd_result_free(&b);
}
END_TEST

/* Sampling: the seed decides (same seed, same text; other seeds, other
 * texts); --top-k K keeps every token among the K most likely; top-k 1 is
 * greedy whatever the temperature. */
START_TEST(sampling_is_keyed_by_the_seed_and_top_k_holds) {
  char ck[128];
  gpt_ckpt(64, ck, sizeof ck);
  cmd_result a = GEN("--checkpoint", ck, "--prompt-ids", "7", "--tokens", "30", "--seed",
                     "11"),
             b = GEN("--checkpoint", ck, "--prompt-ids", "7", "--tokens", "30", "--seed",
                     "11"),
             d = GEN("--checkpoint", ck, "--prompt-ids", "7", "--tokens", "30", "--seed",
                     "12");
  ck_assert_msg(a.rc == 0, "%s", a.err);
  ck_assert_str_eq(a.out, b.out);
  ck_assert_str_ne(a.out, d.out);
  cmd_result k = GEN("--checkpoint", ck, "--prompt-ids", "7", "--tokens", "25", "--top-k",
                     "3", "--temperature", "5", "--seed", "2");
  ck_assert_msg(k.rc == 0, "%s", k.err);
  int ids[64], n = parse_ids(k.out, ids, 64), outside_top1 = 0;
  ck_assert_int_eq(n, 26);
  dp_model *m;
  dp_plan *p;
  dp_ctx *c;
  open_ckpt(ck, &m, &p, &c);
  for (int i = 1; i < n; i++) {
    float z[64];
    last_logits(c, ids, i, 64, z);
    int above = 0;
    for (int j = 0; j < 64; j++) above += z[j] > z[ids[i]];
    ck_assert_msg(above < 3, "token %d is only the %d-th most likely", i, above + 1);
    outside_top1 += above > 0;
  }
  ck_assert_msg(outside_top1 > 0, "temperature 5 and top-k 3 never left the argmax");
  cmd_result g = GEN("--checkpoint", ck, "--prompt-ids", "7", "--tokens", "25", "--greedy"),
             k1 = GEN("--checkpoint", ck, "--prompt-ids", "7", "--tokens", "25", "--top-k",
                      "1", "--temperature", "50");
  ck_assert_str_eq(g.out, k1.out);
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
  cmd_result *all[] = {&a, &b, &d, &k, &g, &k1};
  for (int i = 0; i < 6; i++) cmd_result_free(all[i]);
}
END_TEST

/* --samples K: K continuations in one batch, sample 1 that of a single run,
 * the same lines on 1 and 2 devices. */
START_TEST(samples_side_by_side_on_any_device_count) {
  char ck[128];
  gpt_ckpt(64, ck, sizeof ck);
  cmd_result one = GEN("--checkpoint", ck, "--prompt-ids", "5,6", "--tokens", "14"),
             k1 = GEN("--checkpoint", ck, "--prompt-ids", "5,6", "--tokens", "14",
                      "--samples", "3"),
             k2 = GEN("--checkpoint", ck, "--prompt-ids", "5,6", "--tokens", "14",
                      "--samples", "3", "--devices", "2");
  ck_assert_msg(one.rc == 0 && k1.rc == 0 && k2.rc == 0, "%s%s%s", one.err, k1.err, k2.err);
  ck_assert_str_eq(k1.out, k2.out);
  ck_assert(strncmp(k1.out, one.out, strlen(one.out)) == 0);
  int lines = 0;
  for (const char *s = k1.out; *s; s++) lines += *s == '\n';
  ck_assert_int_eq(lines, 3);
  cmd_result_free(&one);
  cmd_result_free(&k1);
  cmd_result_free(&k2);
}
END_TEST

/* rc 1 or 2 and the message, nothing printed on stdout. */
static void refused(cmd_result r, int rc, const char *needle) {
  ck_assert_msg(r.rc == rc, "rc %d (want %d): %s", r.rc, rc, r.err);
  ck_assert_msg(strstr(r.err, needle), "'%s' not in: %s", needle, r.err);
  ck_assert_str_eq(r.out, "");
  cmd_result_free(&r);
}

START_TEST(refusals_say_what_to_do) {
  char g64[128], g300[128], mlp[128];
  gpt_ckpt(64, g64, sizeof g64);
  gpt_ckpt(300, g300, sizeof g300);
  make_ckpt("input 4\nlinear 3\nloss softmax_cross_entropy\n", "mlp.ckpt", mlp, sizeof mlp);
  refused(GEN("--checkpoint", mlp, "--prompt", "hi"), 1, "is not a sequence model");
  refused(GEN("--checkpoint", g64, "--prompt", "hi"), 1,
          "byte 1 of the prompt is 104; the model's vocabulary has 64 ids");
  refused(GEN("--checkpoint", g300, "--prompt", "hi"), 1, "give the prompt as ids");
  refused(GEN("--checkpoint", g64, "--prompt", ""), 1, "the prompt is empty");
  refused(GEN("--checkpoint", g64, "--prompt-ids", "3,64"), 1,
          "'64' (entry 2) is not an id of the model (0 to 63)");
  refused(GEN("--checkpoint", g64, "--prompt-ids", "3,x"), 1, "'x' (entry 2) is not an id");
  refused(GEN("--checkpoint", g64, "--prompt-ids", "3 2\t1"), 1,
          "'2\\x091' (entry 2) is not an id of the model (0 to 63): ids are separated by "
          "commas or spaces");
  refused(GEN("--checkpoint", g64, "--prompt-ids", "1", "--top-k", "65"), 1,
          "--top-k 65: the model has 64 tokens");
  refused(GEN("--checkpoint", g64, "--prompt-ids", "1", "--greedy", "--temperature", "2"),
          2, "give one or the other");
  refused(GEN("--checkpoint", g64, "--prompt-ids", "1", "--temperature", "0"), 2,
          "--temperature: 0 is out of range (0, 1e6] (for the most likely token every "
          "time: --greedy)");
  /* the range said as it is: -1 and 2e6 (an outside check: "[0, 1e+06]") */
  refused(GEN("--checkpoint", g64, "--prompt-ids", "1", "--temperature", "-1"), 2,
          "--temperature: -1 is out of range (0, 1e6]");
  refused(GEN("--checkpoint", g64, "--prompt-ids", "1", "--temperature", "2e6"), 2,
          "--temperature: 2e6 is out of range (0, 1e6]\n");
  refused(GEN("--checkpoint", g64, "--prompt-ids", "1", "--prompt", "a"), 2,
          "--prompt TEXT or --prompt-ids IDS (one)");
  refused(GEN("--prompt", "a"), 2, "--checkpoint is required");
  char missing[128];
  snprintf(missing, sizeof missing, "%s/none.ckpt", dir);
  refused(GEN("--checkpoint", missing, "--prompt", "a"), 1, "cannot open it");
}
END_TEST

/* A model with more logits than its embedding reads (embed 16, linear 256: dp
 * train takes it, needing at least V logits): every id drawn, greedy or
 * sampled, is one it can read back, and a prompt id past the embedding is
 * refused before anything runs. It drew ids up to 255 and failed in the next
 * forward ("token 68 at position 3 of row 0 is not an id in 0..15"). */
START_TEST(ids_stay_within_the_embedding) {
  char spec[512], ck[128];
  snprintf(spec, sizeof spec, GPT_FMT, 16, 256);
  make_ckpt(spec, "wide.ckpt", ck, sizeof ck);
  static char *const how[][2] = {{"--greedy", "--ids"}, {"--seed", "1"}, {"--seed", "2"}};
  for (int h = 0; h < 3; h++) {
    cmd_result r = GEN("--checkpoint", ck, "--prompt-ids", "1,2,3", "--tokens", "40",
                       how[h][0], how[h][1]);
    ck_assert_msg(r.rc == 0, "exit %d: %s", r.rc, r.err);
    int ids[64], n = parse_ids(r.out, ids, 64);
    ck_assert_int_eq(n, 43);
    for (int i = 0; i < n; i++) ck_assert_msg(ids[i] >= 0 && ids[i] < 16, "%s", r.out);
    cmd_result_free(&r);
  }
  refused(GEN("--checkpoint", ck, "--prompt-ids", "1,20"), 1,
          "'20' (entry 2) is not an id of the model (0 to 15)");
  refused(GEN("--checkpoint", ck, "--prompt-ids", "1", "--top-k", "17"), 1,
          "--top-k 17: the model has 16 tokens");
}
END_TEST

Suite *generate_suite(void) {
  Suite *s = suite_create("generate");
  TCase *tc = tcase_create("generate");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, greedy_is_the_argmax_of_the_sliding_window);
  tcase_add_test(tc, a_long_prompt_slides_to_its_last_context);
  tcase_add_test(tc, sampling_is_keyed_by_the_seed_and_top_k_holds);
  tcase_add_test(tc, samples_side_by_side_on_any_device_count);
  tcase_add_test(tc, refusals_say_what_to_do);
  tcase_add_test(tc, ids_stay_within_the_embedding);
  suite_add_tcase(s, tc);
  return s;
}
