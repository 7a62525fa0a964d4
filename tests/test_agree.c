/* Rank agreement (tools/agree.h) in one process: the records the ranks of a
 * dp train job exchange, and rank 0's one message naming the first rank that
 * differs and what. tests/mpi/run.sh runs the exchange itself under mpirun. */
#include "agree.h"

#include <check.h>
#include <stdint.h>
#include <string.h>

typedef struct {
  dp_model *model;
  float x[6];
  int32_t label[3];
  dpt_dataset data;
  dp_config cfg;
  dpt_train_inputs in;
} job;

static void job_init(job *j) {
  memset(j, 0, sizeof *j);
  ck_assert_int_eq(
      dp_model_parse("input 2\nlinear 2\nloss softmax_cross_entropy\n", "a", &j->model),
      DP_OK);
  for (int i = 0; i < 6; i++) j->x[i] = (float)i;
  j->label[1] = 1;
  j->data = (dpt_dataset){
      .n_rows = 3, .n_features = 2, .x = j->x, .label = j->label, .n_classes = 2};
  dp_config_default(&j->cfg);
  j->cfg.batch = 3;
  j->in = (dpt_train_inputs){.model = j->model,
                             .data = &j->data,
                             .cfg = &j->cfg,
                             .epochs = 2,
                             .test_fraction = 0.2f};
}

/* A rank's record of j: every rank's the same unless a test changes j. */
static void record(const job *j, dpt_agree_rec *r) {
  ck_assert_int_eq(dpt_agree_record(&j->in, r), 0);
}

static void expect(const dpt_agree_rec *r, int n, int rank, const char *want) {
  char err[1024] = "";
  int got = dpt_agree_compare(r, n, err, sizeof err);
  ck_assert_msg(got == rank, "first differing rank %d, want %d (%s)", got, rank, err);
  ck_assert_msg(strstr(err, want), "message '%s' lacks '%s'", err, want);
}

START_TEST(agree_same_inputs_agree) {
  job j;
  job_init(&j);
  dpt_agree_rec r[3];
  for (int q = 0; q < 3; q++) record(&j, &r[q]);
  char err[64] = "unchanged";
  ck_assert_int_eq(dpt_agree_compare(r, 3, err, sizeof err), 0);
  ck_assert_str_eq(err, "unchanged");
  /* the paths are not compared: the same spec, however written, agrees */
  dp_model *m = NULL;
  ck_assert_int_eq(
      dp_model_parse("# another file\ninput 2\n\nlinear 2\nloss softmax_cross_entropy\n",
                     "b", &m),
      DP_OK);
  j.in.model = m;
  record(&j, &r[2]);
  ck_assert_int_eq(dpt_agree_compare(r, 3, err, sizeof err), 0);
  dp_model_free(m);
  dp_model_free(j.model);
}
END_TEST

/* One feature of one row differs: the data, with both digests and row
 * counts; a later rank that differs too is counted, not hidden. */
START_TEST(agree_names_the_data_and_counts_the_others) {
  job j;
  job_init(&j);
  dpt_agree_rec r[4];
  for (int q = 0; q < 4; q++) record(&j, &r[q]);
  j.x[5] = 5.5f;
  record(&j, &r[2]);
  j.x[5] = 5.0f;
  j.in.epochs = 3;
  record(&j, &r[3]);
  expect(r, 4, 2,
         "the ranks disagree: rank 2's training data differs from rank 0's (3 rows");
  expect(r, 4, 2, "give every rank the same --data file (1 more rank differs from rank 0)");
  /* a label differs: the data too */
  j.in.epochs = 2;
  j.label[0] = 1;
  record(&j, &r[1]);
  expect(r, 4, 1, "rank 1's training data differs");
  /* dp predict's words: its rows are data, its model --checkpoint's */
  j.in.predict = 1;
  for (int q = 0; q < 4; q++) record(&j, &r[q]);
  j.label[0] = 0;
  record(&j, &r[1]);
  expect(r, 4, 1, "the ranks disagree: rank 1's data differs from rank 0's (3 rows");
  /* its standardisation (from each rank's --checkpoint) is the model's; a flag
   * is said as the option it is */
  j.label[0] = 1;
  record(&j, &r[1]);
  j.in.model_more = 42;
  record(&j, &r[2]);
  expect(r, 3, 2, "rank 2's model differs from rank 0's");
  expect(r, 3, 2, "give every rank the same --checkpoint file");
  j.in.model_more = 0;
  j.in.extra = "-features-only";
  record(&j, &r[0]);
  record(&j, &r[1]);
  j.in.extra = "+features-only";
  record(&j, &r[2]);
  expect(r, 3, 2, "rank 2 runs with --features-only, rank 0 with no --features-only");
  dp_model_free(j.model);
}
END_TEST

/* Options: the first that differs, named as on the command line, both values. */
START_TEST(agree_names_the_option_and_both_values) {
  job j;
  job_init(&j);
  dpt_agree_rec r[2];
  record(&j, &r[0]);
  j.in.epochs = 3;
  record(&j, &r[1]);
  expect(r, 2, 1,
         "the ranks disagree: rank 1 runs with --epochs 3, rank 0 with --epochs 2: give "
         "every rank the same options");
  j.in.epochs = 2;
  j.cfg.lr = 0.003f;
  record(&j, &r[1]);
  expect(r, 2, 1, "rank 1 runs with --lr 0.003, rank 0 with --lr 0.01");
  j.cfg.lr = 0.01f;
  j.in.resume = 1;
  record(&j, &r[1]);
  expect(r, 2, 1, "rank 1 runs with --resume, rank 0 with no --resume");
  j.in.resume = 0;
  /* a save is collective: --save, --save-best and --save-every alike everywhere
   * (an outside check: one rank's --save-every 5 against another's 7 waited 60 s) */
  j.in.save = 1;
  record(&j, &r[1]);
  expect(r, 2, 1, "rank 1 runs with --save, rank 0 with no --save");
  j.in.save_every = "7";
  record(&j, &r[1]);
  j.in.save_every = "5";
  record(&j, &r[0]);
  expect(r, 2, 1, "rank 1 runs with --save-every 7, rank 0 with --save-every 5");
  j.in.save = 0;
  j.in.save_every = NULL;
  j.in.save_best = 1;
  record(&j, &r[0]);
  j.in.save_best = 0;
  record(&j, &r[1]);
  expect(r, 2, 1, "rank 1 runs with no --save-best, rank 0 with --save-best");
  record(&j, &r[0]);
  /* dp repro: --steps instead of --epochs, and its configurations as words */
  j.in.steps = 3;
  j.in.extra = "layouts=1x2,2x1 mode=classic";
  record(&j, &r[0]);
  j.in.steps = 4;
  record(&j, &r[1]);
  expect(r, 2, 1, "rank 1 runs with --steps 4, rank 0 with --steps 3");
  j.in.steps = 3;
  j.in.extra = "layouts=1x2 mode=classic";
  record(&j, &r[1]);
  expect(r, 2, 1, "rank 1 runs with --layouts 1x2, rank 0 with --layouts 1x2,2x1");
  j.in.steps = 0;
  j.in.extra = NULL;
  record(&j, &r[0]);
  j.in.schedule = "cosine:100";
  record(&j, &r[1]);
  expect(r, 2, 1,
         "rank 1 runs with --lr-schedule cosine:100, rank 0 with --lr-schedule "
         "constant");
  j.in.schedule = NULL;
  j.cfg.micro_batch = 1;
  record(&j, &r[1]);
  expect(r, 2, 1, "--micro-batch 1, rank 0 with --micro-batch 0");
  j.cfg.micro_batch = 0;
  snprintf(j.cfg.backend_options, sizeof j.cfg.backend_options, "tf32=1");
  record(&j, &r[1]);
  expect(r, 2, 1,
         "rank 1 runs with --backend-options tf32=1, rank 0 with --backend-options (none)");
  snprintf(j.cfg.backend_options, sizeof j.cfg.backend_options, "graph=1,tf32=1");
  record(&j, &r[0]);
  snprintf(j.cfg.backend_options, sizeof j.cfg.backend_options, "graph=1,tf32=0");
  record(&j, &r[1]);
  expect(r, 2, 1,
         "rank 1 runs with --backend-options graph=1,tf32=0, rank 0 with "
         "--backend-options graph=1,tf32=1");
  dp_model_free(j.model);
}
END_TEST

START_TEST(agree_names_the_model) {
  job j;
  job_init(&j);
  dpt_agree_rec r[2];
  record(&j, &r[0]);
  dp_model *m = NULL;
  ck_assert_int_eq(
      dp_model_parse("input 2\nlinear 2\nrelu\nloss softmax_cross_entropy\n", "b", &m),
      DP_OK);
  j.in.model = m;
  record(&j, &r[1]);
  expect(r, 2, 1, "rank 1's model differs from rank 0's (spec digest ");
  expect(r, 2, 1, "give every rank the same --model file");
  dp_model_free(m);
  dp_model_free(j.model);
}
END_TEST

/* One process: nothing to agree on, nothing exchanged. */
START_TEST(agree_one_process_is_a_no_op) {
  job j;
  job_init(&j);
  char err[64] = "x";
  ck_assert_int_eq(dpt_agree_train(&j.in, err, sizeof err), 0);
  ck_assert_str_eq(err, "");
  dp_model_free(j.model);
}
END_TEST

Suite *agree_suite(void) {
  Suite *s = suite_create("agree");
  TCase *tc = tcase_create("records");
  tcase_add_test(tc, agree_same_inputs_agree);
  tcase_add_test(tc, agree_names_the_data_and_counts_the_others);
  tcase_add_test(tc, agree_names_the_option_and_both_values);
  tcase_add_test(tc, agree_names_the_model);
  tcase_add_test(tc, agree_one_process_is_a_no_op);
  suite_add_tcase(s, tc);
  return s;
}
