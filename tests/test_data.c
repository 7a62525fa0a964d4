/* tests/test_data.c — the dp tool's dataset loader (tools/data.c) and SVG
 * writers (tools/svg.c). Run from the repository root (loads data/digits.csv). */
#include <check.h>
#include <sys/stat.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "data_files.h"
#include "svg.h"

/* ---- helpers ------------------------------------------------------------------ */

/* A temporary file (mkstemp in /tmp) holding `len` bytes of text. */
typedef struct {
  char path[64];
} tmpfile_t;

static void tmp_write_n(tmpfile_t *t, const char *text, size_t len) {
  strcpy(t->path, "/tmp/dpt_test_XXXXXX");
  int fd = mkstemp(t->path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq((long)write(fd, text, len), (long)len);
  close(fd);
}
static void tmp_write(tmpfile_t *t, const char *text) {
  tmp_write_n(t, text, strlen(text));
}

static void tmp_path(tmpfile_t *t) { /* a fresh, empty file to overwrite */
  tmp_write(t, "");
}

/* Loads `text` as a classification CSV; returns the status, the message in err. */
static dp_status load_text(const char *text, dpt_dataset *d, char *err, size_t cap,
                           char *path_out) {
  tmpfile_t t;
  tmp_write(&t, text);
  dp_status s = dpt_csv_load(t.path, d, err, cap);
  if (path_out) strcpy(path_out, t.path);
  unlink(t.path);
  return s;
}

/* Expects load of `text` to fail with `status` and the message
 * "<path>:<suffix>" exactly. */
static void expect_error(const char *text, dp_status status, const char *suffix) {
  dpt_dataset d;
  char err[256] = "", path[64], want[512];
  dp_status s = load_text(text, &d, err, sizeof err, path);
  ck_assert_msg(s == status, "status %d, expected %d (%s)", (int)s, (int)status, err);
  snprintf(want, sizeof want, "%s:%s", path, suffix);
  ck_assert_str_eq(err, want);
  /* nothing is kept on error */
  ck_assert_ptr_null(d.x);
  ck_assert_ptr_null(d.label);
  ck_assert_int_eq(d.n_rows, 0);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq((long)fread(s, 1, (size_t)n, f), n);
  s[n] = '\0';
  fclose(f);
  return s;
}

static int count_of(const char *hay, const char *needle) {
  int c = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) c++;
  return c;
}

/* n rows, 3 features: x = (i, 2i, 7), label i % 4. */
static void make_dataset(dpt_dataset *d, int n) {
  memset(d, 0, sizeof *d);
  d->n_rows = n;
  d->n_features = 3;
  d->n_classes = 4;
  d->x = malloc((size_t)n * 3 * sizeof(float));
  d->label = malloc((size_t)n * sizeof(int32_t));
  ck_assert_ptr_nonnull(d->x);
  ck_assert_ptr_nonnull(d->label);
  for (int i = 0; i < n; i++) {
    d->x[i * 3 + 0] = (float)i;
    d->x[i * 3 + 1] = (float)(2 * i);
    d->x[i * 3 + 2] = 7.0f;
    d->label[i] = i % 4;
  }
}

/* ---- csv parsing ----------------------------------------------------------- */

START_TEST(token_streams) {
  tmpfile_t t;
  char err[512];
  dpt_tokens tok;
  tmp_write(&t, "abcdefg");
  ck_assert_int_eq(dpt_text_load(t.path, &tok, err, sizeof err), DP_OK);
  ck_assert_uint_eq(tok.n, 7);
  dpt_dataset d;
  ck_assert_int_eq(dpt_token_windows(&tok, 0, tok.n, 3, &d, err, sizeof err), DP_OK);
  ck_assert_int_eq(d.n_rows, 2);
  ck_assert_int_eq(d.label_width, 3);
  /* a text's inputs are its bytes, read in place */
  ck_assert_ptr_null(d.x);
  ck_assert(d.xtype == DPT_X_U8 && d.xmap[3] == 'd' && d.own && !tok.byte);
  ck_assert_int_eq(d.label[5], 'g');
  float row[3];
  int one = 1;
  dpt_dataset_gather(&d, NULL, &one, 0, 1, row, NULL);
  ck_assert(row[0] == 'd' && row[1] == 'e' && row[2] == 'f');
  /* the held-out tail and the head, in file order: views with their labels
   * borrowed */
  dpt_dataset tr, te;
  ck_assert_int_eq(dpt_dataset_split_as(&d, 0.5, 0, 0, &tr, &te, err, sizeof err), DP_OK);
  ck_assert(tr.n_rows == 1 && te.n_rows == 1 && tr.labels_borrowed && te.labels_borrowed);
  ck_assert(tr.label == d.label && te.label == d.label + 3);
  dpt_dataset_free(&tr);
  dpt_dataset_free(&te);
  dpt_dataset_free(&d);
  dpt_tokens_free(&tok);
  unlink(t.path);
  /* .npy: int32 ids, then an id >= vocab, then a float dtype */
  static const char head[] = "\x93NUMPY\x01\x00\x76\x00{'descr': '<i4', "
                             "'fortran_order': False, 'shape': (3,), }";
  char buf[128 + 12];
  memset(buf, ' ', 128);
  memcpy(buf, head, sizeof head - 1);
  buf[127] = '\n';
  int32_t ids[3] = {1, 2, 300};
  memcpy(buf + 128, ids, 12);
  tmp_write_n(&t, buf, 140);
  ck_assert_int_eq(dpt_npy_load_tokens(t.path, 512, &tok, err, sizeof err), DP_OK);
  ck_assert_uint_eq(tok.n, 3);
  ck_assert_int_eq(tok.id[2], 300);
  /* their windows read the ids in place, inputs and labels */
  int32_t *ids_at = tok.id;
  ck_assert_int_eq(dpt_token_windows(&tok, 0, tok.n, 2, &d, err, sizeof err), DP_OK);
  ck_assert(d.n_rows == 1 && d.label_width == 2 && !d.x && d.xtype == DPT_X_I32 && !tok.id);
  ck_assert(d.own == ids_at && d.label == ids_at + 1 && d.labels_borrowed);
  ck_assert(d.label[0] == 2 && d.label[1] == 300);
  int zero = 0;
  dpt_dataset_gather(&d, NULL, &zero, 0, 1, row, NULL);
  ck_assert(row[0] == 1.0f && row[1] == 2.0f);
  dpt_dataset_free(&d);
  dpt_tokens_free(&tok);
  ck_assert_int_eq(dpt_npy_load_tokens(t.path, 256, &tok, err, sizeof err), DP_ERR_RANGE);
  ck_assert_ptr_nonnull(strstr(err, "index 2"));
  unlink(t.path);
  memcpy(buf + 21, "<f4", 3);
  tmp_write_n(&t, buf, 140);
  ck_assert_int_eq(dpt_npy_load_tokens(t.path, 512, &tok, err, sizeof err), DP_ERR_PARSE);
  ck_assert_ptr_nonnull(strstr(err, "dtype"));
  unlink(t.path);
  /* numpy's default int64: the fix named (an outside check, session 23) */
  memcpy(buf + 21, "<i8", 3);
  tmp_write_n(&t, buf, 140);
  ck_assert_int_eq(dpt_npy_load_tokens(t.path, 512, &tok, err, sizeof err), DP_ERR_PARSE);
  ck_assert_msg(strstr(err, "dtype '<i8' is not supported") &&
                    strstr(err, "(numpy: np.save(f, ids.astype(np.int32)))"),
                "%s", err);
  unlink(t.path);
}
END_TEST

START_TEST(csv_loads_labels_and_features) {
  dpt_dataset d;
  char err[256] = "";
  ck_assert_int_eq(load_text("0,1,2\n3,4.5,-1e2\n2,0,0.25\n", &d, err, sizeof err, NULL),
                   DP_OK);
  ck_assert_int_eq(d.n_rows, 3);
  ck_assert_int_eq(d.n_features, 2);
  ck_assert_int_eq(d.n_classes, 4);
  ck_assert_int_eq(d.n_targets, 0);
  ck_assert_ptr_null(d.y);
  ck_assert_int_eq(d.label[0], 0);
  ck_assert_int_eq(d.label[1], 3);
  ck_assert_int_eq(d.label[2], 2);
  ck_assert_float_eq(d.x[0], 1.0f);
  ck_assert_float_eq(d.x[1], 2.0f);
  ck_assert_float_eq(d.x[2], 4.5f);
  ck_assert_float_eq(d.x[3], -100.0f);
  ck_assert_float_eq(d.x[5], 0.25f);
  dpt_dataset_free(&d);
  ck_assert_ptr_null(d.x);
  dpt_dataset_free(&d); /* twice is fine */
  dpt_dataset_free(NULL);
}
END_TEST

START_TEST(csv_accepts_number_forms_and_spaces) {
  dpt_dataset d;
  char err[256] = "";
  ck_assert_int_eq(
      load_text(" +7 ,\t+1.5 , -.5,1e3,1E-2,  -0 ,3.\n", &d, err, sizeof err, NULL), DP_OK);
  ck_assert_int_eq(d.n_rows, 1);
  ck_assert_int_eq(d.n_features, 6);
  ck_assert_int_eq(d.label[0], 7);
  ck_assert_int_eq(d.n_classes, 8);
  const float want[] = {1.5f, -0.5f, 1000.0f, 0.01f, 0.0f, 3.0f};
  for (int i = 0; i < 6; i++) ck_assert_float_eq(d.x[i], want[i]);
  dpt_dataset_free(&d);
  /* a denormal-range value underflows quietly */
  ck_assert_int_eq(load_text("0,1e-45\n", &d, err, sizeof err, NULL), DP_OK);
  dpt_dataset_free(&d);
}
END_TEST

START_TEST(csv_accepts_crlf) {
  dpt_dataset d;
  char err[256] = "";
  ck_assert_int_eq(load_text("1,2,3\r\n0, 4 ,5\r\n", &d, err, sizeof err, NULL), DP_OK);
  ck_assert_int_eq(d.n_rows, 2);
  ck_assert_int_eq(d.n_features, 2);
  ck_assert_float_eq(d.x[1], 3.0f);
  ck_assert_float_eq(d.x[3], 5.0f);
  dpt_dataset_free(&d);
  /* no newline at the end of the last line */
  ck_assert_int_eq(load_text("1,2\r\n0,4", &d, err, sizeof err, NULL), DP_OK);
  ck_assert_int_eq(d.n_rows, 2);
  ck_assert_float_eq(d.x[1], 4.0f);
  dpt_dataset_free(&d);
}
END_TEST

START_TEST(csv_skips_comments_and_blank_lines) {
  dpt_dataset d;
  char err[256] = "";
  ck_assert_int_eq(load_text("# label, a, b\n\n  # indented\n1,2,3\n   \n\t\n2,3,4\n#end",
                             &d, err, sizeof err, NULL),
                   DP_OK);
  ck_assert_int_eq(d.n_rows, 2);
  ck_assert_int_eq(d.n_features, 2);
  ck_assert_int_eq(d.label[1], 2);
  dpt_dataset_free(&d);
  /* line numbers count comment and blank lines */
  expect_error("# c\n\n1,2\r\n1,x\n", DP_ERR_PARSE,
               "4: field 2: expected a number, got \"x\"");
}
END_TEST

START_TEST(csv_regression_targets_first) {
  tmpfile_t t;
  tmp_write(&t, "1.5,-2,10,20\n0.5,3,30,40\n");
  dpt_dataset d;
  char err[256] = "";
  ck_assert_int_eq(dpt_csv_load_regression(t.path, 2, &d, err, sizeof err), DP_OK);
  ck_assert_int_eq(d.n_rows, 2);
  ck_assert_int_eq(d.n_targets, 2);
  ck_assert_int_eq(d.n_features, 2);
  ck_assert_int_eq(d.n_classes, 0);
  ck_assert_ptr_null(d.label);
  ck_assert_float_eq(d.y[0], 1.5f);
  ck_assert_float_eq(d.y[3], 3.0f);
  ck_assert_float_eq(d.x[0], 10.0f);
  ck_assert_float_eq(d.x[3], 40.0f);
  dpt_dataset_free(&d);
  /* targets are floats: nan is refused there too */
  unlink(t.path);
  tmp_write(&t, "1,2\nnan,3\n");
  ck_assert_int_eq(dpt_csv_load_regression(t.path, 1, &d, err, sizeof err),
                   DP_ERR_NONFINITE);
  ck_assert_ptr_nonnull(strstr(err, ":2: field 1: non-finite value \"nan\""));
  /* a row must hold the targets and a feature */
  ck_assert_int_eq(dpt_csv_load_regression(t.path, 2, &d, err, sizeof err), DP_ERR_PARSE);
  ck_assert_int_eq(dpt_csv_load_regression(t.path, 0, &d, err, sizeof err), DP_ERR_INVALID);
  unlink(t.path);
}
END_TEST

START_TEST(csv_error_bad_number) {
  expect_error("0,1,2\n1,2,3\n2,3,abc\n", DP_ERR_PARSE,
               "3: field 3: expected a number, got \"abc\"");
  expect_error("0,1,2x\n", DP_ERR_PARSE, "1: field 3: expected a number, got \"2x\"");
  expect_error("0,1 2,3\n", DP_ERR_PARSE, "1: field 2: expected a number, got \"1 2\"");
  expect_error("0,0x10\n", DP_ERR_PARSE, "1: field 2: expected a number, got \"0x10\"");
  expect_error("0,-\n", DP_ERR_PARSE, "1: field 2: expected a number, got \"-\"");
}
END_TEST

START_TEST(csv_error_empty_field) {
  expect_error("0,1,2\n1,,3\n", DP_ERR_PARSE, "2: field 2: empty field");
  expect_error("0,1,2\n1,2,\n", DP_ERR_PARSE, "2: field 3: empty field");
  expect_error(" ,1\n", DP_ERR_PARSE, "1: field 1: empty field");
}
END_TEST

START_TEST(csv_error_field_count) {
  expect_error("0,1,2\n1,2\n", DP_ERR_PARSE, "2: field count 2, expected 3");
  expect_error("0,1,2\n\n# x\n1,2,3,4\n", DP_ERR_PARSE, "4: field count 4, expected 3");
  expect_error("5\n", DP_ERR_PARSE,
               "1: field count 1, expected at least 2 (a label and a feature)");
}
END_TEST

START_TEST(csv_error_labels) {
  expect_error("0,1\n-1,2\n", DP_ERR_RANGE,
               "2: field 1: label -1 is not a non-negative integer");
  expect_error("1.5,2\n", DP_ERR_PARSE,
               "1: field 1: label \"1.5\" is not a non-negative integer");
  expect_error("cat,2\n", DP_ERR_PARSE,
               "1: field 1: label \"cat\" is not a non-negative integer");
  expect_error("-x,2\n", DP_ERR_PARSE,
               "1: field 1: label \"-x\" is not a non-negative integer");
  expect_error("65536,2\n", DP_ERR_RANGE,
               "1: field 1: label 65536 is larger than the limit 65535");
  expect_error("99999999999999999999999,2\n", DP_ERR_RANGE,
               "1: field 1: label 99999999999999999999999 is larger than the limit 65535");
  /* the largest allowed label is fine */
  dpt_dataset d;
  char err[256];
  ck_assert_int_eq(load_text("65535,1\n", &d, err, sizeof err, NULL), DP_OK);
  ck_assert_int_eq(d.n_classes, 65536);
  dpt_dataset_free(&d);
}
END_TEST

START_TEST(csv_error_non_finite) {
  expect_error("0,1\n1,nan\n", DP_ERR_NONFINITE, "2: field 2: non-finite value \"nan\"");
  expect_error("0,inf\n", DP_ERR_NONFINITE, "1: field 2: non-finite value \"inf\"");
  expect_error("0,1, -Infinity \n", DP_ERR_NONFINITE,
               "1: field 3: non-finite value \"-Infinity\"");
  expect_error("0,NAN\n", DP_ERR_NONFINITE, "1: field 2: non-finite value \"NAN\"");
  expect_error("0,1e39\n", DP_ERR_RANGE, "1: field 2: 1e39 is out of float range");
}
END_TEST

START_TEST(csv_error_empty_file) {
  expect_error("", DP_ERR_PARSE, " no data rows");
  expect_error("# only a comment\n\n  \n", DP_ERR_PARSE, " no data rows");
}
END_TEST

START_TEST(csv_error_missing_file_and_args) {
  dpt_dataset d;
  char err[256] = "";
  ck_assert_int_eq(dpt_csv_load("/nonexistent/dir/x.csv", &d, err, sizeof err), DP_ERR_IO);
  ck_assert_str_eq(err,
                   "cannot read data '/nonexistent/dir/x.csv': No such file or directory");
  ck_assert_ptr_null(d.x);
  ck_assert_int_eq(dpt_csv_load(NULL, &d, err, sizeof err), DP_ERR_INVALID);
  /* err may be NULL or tiny */
  ck_assert_int_eq(dpt_csv_load("/nonexistent/dir/x.csv", &d, NULL, 0), DP_ERR_IO);
  char tiny[8];
  ck_assert_int_eq(dpt_csv_load("/nonexistent/dir/x.csv", &d, tiny, sizeof tiny),
                   DP_ERR_IO);
  ck_assert_str_eq(tiny, "cannot ");
}
END_TEST

/* Issue 12: `dp train --data FIFO` blocked for ever in open() when the FIFO
 * had no writer. The type is checked without blocking and anything but a
 * regular file is refused. The alarm makes a regression fail, not hang. */
START_TEST(csv_fifo_without_writer_is_refused_at_once) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/dp_test_data_fifo_%ld", (long)getpid());
  unlink(path);
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  dpt_dataset d;
  char err[256] = "", want[160];
  alarm(10);
  dp_status s = dpt_csv_load(path, &d, err, sizeof err);
  dp_status s2 = dpt_csv_load_regression(path, 1, &d, err, sizeof err);
  alarm(0);
  unlink(path);
  ck_assert_int_eq(s, DP_ERR_IO);
  ck_assert_int_eq(s2, DP_ERR_IO);
  snprintf(want, sizeof want,
           "cannot read data '%s': is a FIFO (named pipe), not a regular file", path);
  ck_assert_str_eq(err, want);
  ck_assert_ptr_null(d.x);
  /* a directory says so */
  ck_assert_int_eq(dpt_csv_load("/tmp", &d, err, sizeof err), DP_ERR_IO);
  ck_assert_str_eq(err, "cannot read data '/tmp': is a directory");
}
END_TEST

START_TEST(csv_error_long_field_is_shortened) {
  char text[256];
  snprintf(text, sizeof text, "0,%s\n",
           "abcdefghijabcdefghijabcdefghijabcdefghijabcdefghij");
  expect_error(
      text, DP_ERR_PARSE,
      "1: field 2: expected a number, got \"abcdefghijabcdefghijabcdefghijabcdefghij...\"");
}
END_TEST

START_TEST(csv_error_nul_byte) {
  tmpfile_t t;
  tmp_write_n(&t, "0,1\n1,2\0\n", 9);
  dpt_dataset d;
  char err[256] = "", want[128];
  ck_assert_int_eq(dpt_csv_load(t.path, &d, err, sizeof err), DP_ERR_PARSE);
  snprintf(want, sizeof want, "%s:2: NUL byte in line", t.path);
  ck_assert_str_eq(err, want);
  unlink(t.path);
}
END_TEST

START_TEST(csv_many_rows_grow) {
  /* more rows than the first allocation, with checked values */
  size_t cap = 5000 * 16;
  char *text = malloc(cap), *p = text;
  ck_assert_ptr_nonnull(text);
  for (int i = 0; i < 5000; i++) p += sprintf(p, "%d,%d,%d.5\n", i % 10, i, -i);
  dpt_dataset d;
  char err[256] = "";
  ck_assert_int_eq(load_text(text, &d, err, sizeof err, NULL), DP_OK);
  free(text);
  ck_assert_int_eq(d.n_rows, 5000);
  ck_assert_int_eq(d.n_classes, 10);
  ck_assert_int_eq(d.label[4321], 1);
  ck_assert_float_eq(d.x[4321 * 2], 4321.0f);
  ck_assert_float_eq(d.x[4321 * 2 + 1], -4321.5f);
  dpt_dataset_free(&d);
}
END_TEST

START_TEST(digits_csv_loads) {
  dpt_dataset d;
  char err[256] = "";
  dp_status s = dpt_csv_load("data/digits.csv", &d, err, sizeof err);
  ck_assert_msg(s == DP_OK, "%s", err);
  ck_assert_int_eq(d.n_rows, 1797);
  ck_assert_int_eq(d.n_features, 64);
  ck_assert_int_eq(d.n_classes, 10);
  /* first line, read independently */
  FILE *f = fopen("data/digits.csv", "r");
  ck_assert_ptr_nonnull(f);
  int v[65];
  for (int i = 0; i < 65; i++) ck_assert_int_eq(fscanf(f, i ? ",%d" : "%d", &v[i]), 1);
  fclose(f);
  ck_assert_int_eq(d.label[0], v[0]);
  for (int i = 0; i < 64; i++) ck_assert_float_eq(d.x[i], (float)v[i + 1]);
  int count[10] = {0};
  for (int i = 0; i < d.n_rows; i++) {
    ck_assert_int_ge(d.label[i], 0);
    ck_assert_int_le(d.label[i], 9);
    count[d.label[i]]++;
  }
  for (int c = 0; c < 10; c++) ck_assert_int_ge(count[c], 170);
  for (size_t i = 0; i < (size_t)d.n_rows * 64; i++) {
    ck_assert(d.x[i] >= 0.0f && d.x[i] <= 16.0f);
    ck_assert(d.x[i] == floorf(d.x[i]));
  }
  dpt_dataset_free(&d);
}
END_TEST

/* ---- split --------------------------------------------------------------------- */

START_TEST(split_sizes) {
  dpt_dataset all, tr, te;
  char err[256] = "";
  make_dataset(&all, 10);
  const struct {
    double frac;
    int n_test;
  } cases[] = {{0.3, 3}, {0.7, 7}, {0.25, 3}, {0.01, 1}, {0.0, 0}, {0.9, 9}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    ck_assert_int_eq(dpt_dataset_split(&all, cases[k].frac, 1, &tr, &te, err, sizeof err),
                     DP_OK);
    ck_assert_int_eq(te.n_rows, cases[k].n_test);
    ck_assert_int_eq(tr.n_rows, 10 - cases[k].n_test);
    ck_assert_int_eq(tr.n_features, 3);
    ck_assert_int_eq(te.n_features, 3);
    ck_assert_int_eq(tr.n_classes, 4);
    ck_assert_int_eq(te.n_classes, 4);
    dpt_dataset_free(&tr);
    dpt_dataset_free(&te);
  }
  dpt_dataset_free(&all);
}
END_TEST

START_TEST(split_refuses_bad_fractions) {
  dpt_dataset all, tr, te;
  char err[256] = "";
  make_dataset(&all, 10);
  ck_assert_int_eq(dpt_dataset_split(&all, 1.0, 1, &tr, &te, err, sizeof err),
                   DP_ERR_INVALID);
  ck_assert_str_eq(err, "test fraction 1 is outside [0, 1)");
  ck_assert_int_eq(dpt_dataset_split(&all, -0.1, 1, &tr, &te, err, sizeof err),
                   DP_ERR_INVALID);
  ck_assert_int_eq(dpt_dataset_split(&all, NAN, 1, &tr, &te, err, sizeof err),
                   DP_ERR_INVALID);
  ck_assert_int_eq(dpt_dataset_split(&all, 0.95, 1, &tr, &te, err, sizeof err),
                   DP_ERR_INVALID);
  ck_assert_str_eq(err, "test fraction 0.95 of 10 rows leaves no training rows");
  ck_assert_ptr_null(tr.x);
  ck_assert_ptr_null(te.x);
  ck_assert_int_eq(dpt_dataset_split(&all, 0.5, 1, &tr, &tr, err, sizeof err),
                   DP_ERR_INVALID);
  ck_assert_int_eq(dpt_dataset_split(NULL, 0.5, 1, &tr, &te, err, sizeof err),
                   DP_ERR_INVALID);
  dpt_dataset_free(&all);
}
END_TEST

START_TEST(split_is_disjoint_and_covers_all) {
  dpt_dataset all, tr, te;
  char err[256] = "";
  make_dataset(&all, 101);
  ck_assert_int_eq(dpt_dataset_split(&all, 0.2, 42, &tr, &te, err, sizeof err), DP_OK);
  ck_assert_int_eq(te.n_rows, 21);
  ck_assert_int_eq(tr.n_rows, 80);
  int seen[101] = {0};
  const dpt_dataset *parts[2] = {&tr, &te};
  for (int p = 0; p < 2; p++)
    for (int i = 0; i < parts[p]->n_rows; i++) {
      const float *row = parts[p]->x + i * 3;
      int id = (int)row[0];
      ck_assert_int_ge(id, 0);
      ck_assert_int_lt(id, 101);
      seen[id]++;
      /* the whole row and its label travel together */
      ck_assert_float_eq(row[1], (float)(2 * id));
      ck_assert_float_eq(row[2], 7.0f);
      ck_assert_int_eq(parts[p]->label[i], id % 4);
    }
  for (int i = 0; i < 101; i++) ck_assert_int_eq(seen[i], 1);
  /* shuffled, not the first rows in order */
  int in_order = 1;
  for (int i = 0; i < te.n_rows; i++)
    if ((int)te.x[i * 3] != i) in_order = 0;
  ck_assert_int_eq(in_order, 0);
  dpt_dataset_free(&tr);
  dpt_dataset_free(&te);
  dpt_dataset_free(&all);
}
END_TEST

START_TEST(split_is_deterministic) {
  dpt_dataset all, a_tr, a_te, b_tr, b_te, c_tr, c_te;
  char err[256] = "";
  make_dataset(&all, 50);
  ck_assert_int_eq(dpt_dataset_split(&all, 0.3, 7, &a_tr, &a_te, err, sizeof err), DP_OK);
  ck_assert_int_eq(dpt_dataset_split(&all, 0.3, 7, &b_tr, &b_te, err, sizeof err), DP_OK);
  ck_assert_int_eq(dpt_dataset_split(&all, 0.3, 8, &c_tr, &c_te, err, sizeof err), DP_OK);
  ck_assert_mem_eq(a_tr.x, b_tr.x, (size_t)a_tr.n_rows * 3 * sizeof(float));
  ck_assert_mem_eq(a_te.x, b_te.x, (size_t)a_te.n_rows * 3 * sizeof(float));
  ck_assert_mem_eq(a_te.label, b_te.label, (size_t)a_te.n_rows * sizeof(int32_t));
  ck_assert_int_ne(memcmp(a_te.x, c_te.x, (size_t)a_te.n_rows * 3 * sizeof(float)), 0);
  dpt_dataset_free(&a_tr);
  dpt_dataset_free(&a_te);
  dpt_dataset_free(&b_tr);
  dpt_dataset_free(&b_te);
  dpt_dataset_free(&c_tr);
  dpt_dataset_free(&c_te);
  dpt_dataset_free(&all);
}
END_TEST

START_TEST(split_copies_regression_targets) {
  tmpfile_t t;
  tmp_write(&t, "0.5,0\n1.5,1\n2.5,2\n3.5,3\n");
  dpt_dataset all, tr, te;
  char err[256] = "";
  ck_assert_int_eq(dpt_csv_load_regression(t.path, 1, &all, err, sizeof err), DP_OK);
  unlink(t.path);
  ck_assert_int_eq(dpt_dataset_split(&all, 0.5, 3, &tr, &te, err, sizeof err), DP_OK);
  ck_assert_ptr_null(tr.label);
  ck_assert_ptr_nonnull(tr.y);
  ck_assert_int_eq(tr.n_targets, 1);
  for (int i = 0; i < 2; i++) {
    ck_assert_float_eq(tr.y[i], tr.x[i] + 0.5f);
    ck_assert_float_eq(te.y[i], te.x[i] + 0.5f);
  }
  dpt_dataset_free(&tr);
  dpt_dataset_free(&te);
  dpt_dataset_free(&all);
}
END_TEST

START_TEST(split_digits) {
  dpt_dataset all, tr, te;
  char err[256] = "";
  ck_assert_int_eq(dpt_csv_load("data/digits.csv", &all, err, sizeof err), DP_OK);
  ck_assert_int_eq(dpt_dataset_split(&all, 0.2, 0, &tr, &te, err, sizeof err), DP_OK);
  ck_assert_int_eq(te.n_rows, 360);
  ck_assert_int_eq(tr.n_rows, 1437);
  ck_assert_int_eq(tr.n_classes, 10);
  ck_assert_int_eq(te.n_classes, 10);
  dpt_dataset_free(&tr);
  dpt_dataset_free(&te);
  dpt_dataset_free(&all);
}
END_TEST

/* ---- standardize ----------------------------------------------------------------- */

START_TEST(standardize_uses_train_stats) {
  dpt_dataset tr, te;
  make_dataset(&tr, 9); /* feature 0: 0..8, mean 4, population var 60/9 */
  make_dataset(&te, 2);
  dpt_standardize(&tr, &te);
  for (int j = 0; j < 2; j++) {
    double sum = 0, ss = 0;
    for (int i = 0; i < 9; i++) sum += tr.x[i * 3 + j];
    for (int i = 0; i < 9; i++) ss += tr.x[i * 3 + j] * tr.x[i * 3 + j];
    ck_assert_double_eq_tol(sum / 9, 0.0, 1e-6);
    ck_assert_double_eq_tol(ss / 9, 1.0, 1e-5);
  }
  /* the constant feature becomes 0, not NaN */
  for (int i = 0; i < 9; i++) ck_assert_float_eq(tr.x[i * 3 + 2], 0.0f);
  ck_assert_float_eq(te.x[2], 0.0f);
  /* test row 1 (x0 = 1) with the train mean 4 and std sqrt(60/9) */
  ck_assert_double_eq_tol(te.x[3], (1.0 - 4.0) / sqrt(60.0 / 9.0), 1e-6);
  dpt_standardize(&tr, NULL);
  dpt_standardize(NULL, NULL);
  dpt_dataset_free(&tr);
  dpt_dataset_free(&te);
}
END_TEST

/* Found by fuzz_csv: a held-out value of 1e38 over a training spread of 1e-3
 * overflowed float; standardised values saturate and stay finite. */
START_TEST(standardize_saturates_far_outliers) {
  float trx[2] = {0.5f, 0.501f}, tex[2] = {1e38f, -1e38f};
  int32_t lab[2] = {0, 1};
  dpt_dataset tr = {.n_rows = 2, .n_features = 1, .x = trx, .label = lab, .n_classes = 2};
  dpt_dataset te = {.n_rows = 2, .n_features = 1, .x = tex, .label = lab, .n_classes = 2};
  dpt_standardize(&tr, &te);
  ck_assert(isfinite(te.x[0]) && te.x[0] > 1e30f);
  ck_assert(isfinite(te.x[1]) && te.x[1] < -1e30f);
}
END_TEST

static void file_put(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(b, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
}

/* ---- binary formats (.npy, IDX) and CSV headers ------------------------------------ */

/* A scratch directory for the files of one test, and paths in it. */
typedef struct {
  char dir[64], path[8][128];
} bin_dir;

static void bin_open(bin_dir *b) {
  strcpy(b->dir, "/tmp/dpt_bin_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(b->dir));
}

static const char *bin_path(bin_dir *b, int k, const char *name) {
  char p[sizeof b->path[k]]; /* not straight into b: GCC's -Wrestrict takes them as one */
  snprintf(p, sizeof p, "%s/%s", b->dir, name);
  memcpy(b->path[k], p, sizeof p);
  return b->path[k];
}

static void bin_close(bin_dir *b) {
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", b->dir);
  ck_assert_int_eq(system(cmd), 0);
}

/* dpt_data_load of (data, labels) as classes below n_outputs (0: any). */
static dp_status bin_load(const char *data, const char *labels, int n_outputs,
                          dpt_dataset *d, char *err, size_t cap) {
  dpt_data_spec sp = {
      .data = data, .labels = labels, .rows = DPT_ROWS_CLASSES, .n_outputs = n_outputs};
  return dpt_data_load(&sp, d, err, cap);
}

/* Rows 0..n of d as floats, unstandardised, through dpt_dataset_gather. */
static void rows_of(const dpt_dataset *d, float *x, int32_t *lab) {
  dpt_dataset_gather(d, NULL, NULL, 0, d->n_rows, x, lab);
}

/* The same 6 rows of 4 values (shape (6, 2, 2)) as float32, float64 and
 * uint8 .npy files and as IDX, plain and gzip'd, with int32, int64, uint8
 * and IDX labels: every one reads the same rows and labels, in place (x
 * NULL, the features mapped), with the right element type. */
START_TEST(binary_formats_read_the_same_rows) {
  bin_dir b;
  bin_open(&b);
  enum { R = 6, F = 4 };
  float xf[R * F];
  double xd[R * F];
  unsigned char xu[R * F], yu[R];
  int32_t yi[R];
  int64_t yl[R];
  for (int i = 0; i < R * F; i++)
    xu[i] = (unsigned char)(i * 7 % 256), xf[i] = xu[i], xd[i] = xu[i];
  for (int i = 0; i < R; i++) yu[i] = (unsigned char)(i % 3), yi[i] = i % 3, yl[i] = i % 3;
  uint64_t shape[3] = {R, 2, 2}, lshape[1] = {R};
  uint32_t dims[3] = {R, 2, 2}, ldims[1] = {R};
  npy_write(bin_path(&b, 0, "f4.npy"), "<f4", 0, shape, 3, xf, sizeof xf);
  npy_write(bin_path(&b, 1, "f8.npy"), "<f8", 0, shape, 3, xd, sizeof xd);
  npy_write(bin_path(&b, 2, "u1.npy"), "|u1", 0, shape, 3, xu, sizeof xu);
  idx_write(bin_path(&b, 3, "x-idx3-ubyte"), dims, 3, xu, 0);
  int gz = idx_write(bin_path(&b, 4, "x-idx3-ubyte.gz"), dims, 3, xu, 1);
  npy_write(bin_path(&b, 5, "i4.npy"), "<i4", 0, lshape, 1, yi, sizeof yi);
  npy_write(bin_path(&b, 6, "i8.npy"), "<i8", 0, lshape, 1, yl, sizeof yl);
  idx_write(bin_path(&b, 7, "y-idx1-ubyte"), ldims, 1, yu, 0);
  static const int xtype[5] = {DPT_X_F32, DPT_X_F64, DPT_X_U8, DPT_X_U8, DPT_X_U8};
  for (int k = 0; k < 5; k++) {
    if (k == 4 && !gz) continue;
    for (int l = 5; l < 8; l++) {
      dpt_dataset d;
      char err[256] = "";
      ck_assert_msg(bin_load(b.path[k], b.path[l], 3, &d, err, sizeof err) == DP_OK,
                    "%s + %s: %s", b.path[k], b.path[l], err);
      ck_assert(d.n_rows == R && d.n_features == F && d.n_classes == 3 && !d.x && d.xmap);
      ck_assert_int_eq(d.xtype, xtype[k]);
      ck_assert_int_eq(d.own_mapped, k != 4); /* gzip'd: decompressed into memory */
      float x[R * F];
      int32_t lab[R];
      rows_of(&d, x, lab);
      ck_assert_mem_eq(x, xf, sizeof xf);
      ck_assert_mem_eq(lab, yi, sizeof yi);
      dpt_dataset_free(&d);
    }
  }
  /* uint8 .npy labels, and features only when labels are optional */
  npy_write(bin_path(&b, 5, "u1y.npy"), "|u1", 0, lshape, 1, yu, sizeof yu);
  dpt_dataset d;
  char err[256];
  ck_assert_int_eq(bin_load(b.path[0], b.path[5], 0, &d, err, sizeof err), DP_OK);
  ck_assert_int_eq(d.label[4], 1);
  dpt_dataset_free(&d);
  dpt_data_spec sp = {.data = b.path[0], .rows = DPT_ROWS_CLASSES, .labels_optional = 1};
  ck_assert_int_eq(dpt_data_load(&sp, &d, err, sizeof err), DP_OK);
  ck_assert(d.n_rows == R && !d.label && !d.y);
  dpt_dataset_free(&d);
  /* float targets for an mse model: (N, 2) */
  float t[R * 2];
  for (int i = 0; i < R * 2; i++) t[i] = 0.5f * (float)i;
  uint64_t tshape[2] = {R, 2};
  npy_write(bin_path(&b, 6, "t.npy"), "<f4", 0, tshape, 2, t, sizeof t);
  sp = (dpt_data_spec){
      .data = b.path[1], .labels = b.path[6], .rows = DPT_ROWS_TARGETS, .n_targets = 2};
  ck_assert_msg(dpt_data_load(&sp, &d, err, sizeof err) == DP_OK, "%s", err);
  ck_assert(d.n_targets == 2 && d.y && !d.label && d.y[11] == 5.5f);
  dpt_dataset_free(&d);
  bin_close(&b);
}
END_TEST

/* A mapped dataset splits into views (the features never copied): the same
 * rows and labels as the split of the same rows read from a CSV, the same
 * standardisation fitted through them, bit for bit; --no-shuffle's split
 * holds out the tail. */
START_TEST(binary_split_views_match_the_csv) {
  bin_dir b;
  bin_open(&b);
  float *x;
  int32_t *y;
  int rows = digits_arrays(&x, &y);
  uint64_t shape[2] = {(uint64_t)rows, 64}, lshape[1] = {(uint64_t)rows};
  npy_write(bin_path(&b, 0, "x.npy"), "<f4", 0, shape, 2, x, (size_t)rows * 64 * 4);
  npy_write(bin_path(&b, 1, "y.npy"), "<i4", 0, lshape, 1, y, (size_t)rows * 4);
  dpt_dataset all, csv, tr, te, ctr, cte;
  char err[256];
  ck_assert_int_eq(bin_load(b.path[0], b.path[1], 10, &all, err, sizeof err), DP_OK);
  ck_assert_int_eq(dpt_csv_load("data/digits.csv", &csv, err, sizeof err), DP_OK);
  for (int shuffle = 0; shuffle < 2; shuffle++) {
    ck_assert_int_eq(
        dpt_dataset_split_as(&all, 0.2, shuffle, 42, &tr, &te, err, sizeof err), DP_OK);
    ck_assert_int_eq(
        dpt_dataset_split_as(&csv, 0.2, shuffle, 42, &ctr, &cte, err, sizeof err), DP_OK);
    ck_assert(tr.rows && tr.borrowed && !tr.x && te.rows && ctr.x && !ctr.rows);
    ck_assert_int_eq(te.n_rows, 360);
    if (!shuffle) /* the held-out tail, in file order */
      ck_assert(te.rows[0] == rows - 360 && te.rows[359] == rows - 1 && tr.rows[5] == 5);
    dpt_scaler a, c;
    ck_assert_int_eq(dpt_scaler_fit(&tr, &a), 0);
    ck_assert_int_eq(dpt_scaler_fit(&ctr, &c), 0);
    ck_assert_mem_eq(a.mean, c.mean, 64 * sizeof(double));
    ck_assert_mem_eq(a.std, c.std, 64 * sizeof(double));
    ck_assert_int_eq(a.n_constant, c.n_constant);
    float *va = malloc(360 * 64 * 4), *vc = malloc(360 * 64 * 4);
    int32_t la[360], lc[360];
    int idx[4] = {359, 0, 17, 200};
    dpt_dataset_gather(&te, &a, NULL, 0, 360, va, la);
    dpt_dataset_gather(&cte, &c, NULL, 0, 360, vc, lc);
    ck_assert_mem_eq(va, vc, 360 * 64 * 4);
    ck_assert_mem_eq(la, lc, sizeof la);
    dpt_dataset_gather(&tr, &a, idx, 1, 3, va, la); /* rows picked by an order */
    dpt_dataset_gather(&ctr, &c, idx, 1, 3, vc, lc);
    ck_assert_mem_eq(va, vc, 3 * 64 * 4);
    free(va);
    free(vc);
    dpt_scaler_free(&a);
    dpt_scaler_free(&c);
    dpt_dataset_free(&tr);
    dpt_dataset_free(&te);
    dpt_dataset_free(&ctr);
    dpt_dataset_free(&cte);
  }
  dpt_dataset_free(&all);
  dpt_dataset_free(&csv);
  free(x);
  free(y);
  bin_close(&b);
}
END_TEST

/* Hostile binary files: each refused with the file, the byte offset and the
 * reason, nothing kept. */
/* A .npy file of version 1.0 with the header dict text given (padded with
 * blanks and a newline to 16 bytes) and n bytes of data. */
static void raw_npy(const char *path, const char *dict, const void *data, size_t n) {
  unsigned char b[512];
  size_t dl = strlen(dict), hl = (10 + dl + 1 + 15) / 16 * 16 - 10;
  ck_assert(10 + hl + n <= sizeof b);
  memcpy(b, "\x93NUMPY\x01\x00", 8);
  b[8] = (unsigned char)hl;
  b[9] = (unsigned char)(hl >> 8);
  memset(b + 10, ' ', hl);
  memcpy(b + 10, dict, dl);
  b[10 + hl - 1] = '\n';
  memcpy(b + 10 + hl, data, n);
  file_put(path, b, 10 + hl + n);
}

START_TEST(binary_hostile_files_are_refused) {
  bin_dir b;
  bin_open(&b);
  enum { R = 4, F = 3 };
  float xf[R * F];
  for (int i = 0; i < R * F; i++) xf[i] = (float)i;
  int32_t yi[R] = {0, 1, 2, 1};
  uint64_t shape[2] = {R, F}, lshape[1] = {R};
  const char *x = bin_path(&b, 0, "x.npy"), *y = bin_path(&b, 1, "y.npy"),
             *bad = bin_path(&b, 2, "bad.npy");
  size_t x0 = npy_write(x, "<f4", 0, shape, 2, xf, sizeof xf);
  npy_write(y, "<i4", 0, lshape, 1, yi, sizeof yi);
  char err[512], want[512];
  dpt_dataset d;
  /* the loader's message for (data, labels) as classes below 3 */
#define REFUSED(data, labels, status, ...)                                                 \
  do {                                                                                     \
    snprintf(want, sizeof want, __VA_ARGS__);                                              \
    dp_status s_ = bin_load((data), (labels), 3, &d, err, sizeof err);                     \
    ck_assert_msg(s_ == (status), "%s: status %d: %s", want, (int)s_, err);                \
    ck_assert_msg(strstr(err, want), "got \"%s\", want \"%s\"", err, want);                \
    ck_assert(!d.xmap && !d.label && d.n_rows == 0);                                       \
  } while (0)
  /* truncated data, trailing bytes, a cut header, wrong magic */
  unsigned char buf[4096];
  FILE *f = fopen(x, "rb");
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  file_put(bad, buf, n - 5);
  REFUSED(
      bad, y, DP_ERR_PARSE,
      "%s: byte %zu: shape (4, 3) of '<f4' is 48 bytes of data; the file has 43 after its "
      "header (truncated)",
      bad, x0);
  file_put(bad, buf, 30);
  REFUSED(bad, y, DP_ERR_PARSE, "%s: byte 8: a header of %zu bytes; the file has 30", bad,
          x0 - 10);
  /* a version 2.0 header longer than dp reads, in a file that holds it: the cap
   * is named, not a cut file (an outside check) */
  {
    size_t big = 70000, tot = 12 + big + 48;
    unsigned char *v2 = calloc(tot, 1);
    ck_assert_ptr_nonnull(v2);
    memcpy(v2, "\x93NUMPY\x02\x00", 8);
    v2[8] = (unsigned char)big, v2[9] = (unsigned char)(big >> 8);
    v2[10] = (unsigned char)(big >> 16), v2[11] = 0;
    file_put(bad, v2, tot);
    free(v2);
    REFUSED(bad, y, DP_ERR_PARSE,
            "%s: byte 8: a header of 70000 bytes; dp reads .npy headers of up to 65535",
            bad);
  }
  memcpy(buf, "\x93NUMPX", 6);
  file_put(bad, buf, n);
  REFUSED(bad, y, DP_ERR_PARSE, "%s: byte 0: not a .npy file", bad);
  /* another dtype, Fortran order, big-endian, a shape that is not rows */
  npy_write(bad, "<i2", 0, shape, 2, xf, R * F * 2);
  REFUSED(
      bad, y, DP_ERR_PARSE,
      "%s: byte 20: dtype '<i2' is not supported: features must be '<f4', '<f8' or '|u1'",
      bad);
  npy_write(bad, "<f4", 1, shape, 2, xf, sizeof xf);
  REFUSED(bad, y, DP_ERR_PARSE, "%s: byte 44: the array is in Fortran order", bad);
  npy_write(bad, ">f4", 0, shape, 2, xf, sizeof xf);
  REFUSED(bad, y, DP_ERR_PARSE, "%s: byte 20: dtype '>f4' is big-endian", bad);
  uint64_t zero[1] = {0};
  npy_write(bad, "<f4", 0, zero, 1, xf, 0);
  REFUSED(bad, y, DP_ERR_PARSE, "shape (0,): the data must be rows (N, ...)");
  uint64_t empty_rows[2] = {R, 0}; /* found by fuzz_npy: rows of no values */
  npy_write(bad, "<f4", 0, empty_rows, 2, xf, 0);
  REFUSED(bad, y, DP_ERR_PARSE,
          "%s: byte 60: shape (4, 0): the data must be rows (N, ...) "
          "with N from 1 to 2147483647, of 1 to 2^30 values each",
          bad);
  /* the header dict walked, not searched: a key inside a string, an unknown or
   * repeated key, a dtype with junk after its size, a dimension past 2^48
   * (shown as its tuple alone); its keys in another order read the same */
  raw_npy(bad,
          "{'x': \"'descr': '<f4'\", 'descr': '<i2', 'fortran_order': False, "
          "'shape': (4, 3), }",
          xf, R * F * 2);
  REFUSED(bad, y, DP_ERR_PARSE,
          "%s: byte 10: the .npy header is not a dict of 'descr', 'fortran_order' and "
          "'shape', each once",
          bad);
  raw_npy(bad,
          "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", xf,
          sizeof xf);
  REFUSED(bad, y, DP_ERR_PARSE, "the .npy header is not a dict");
  raw_npy(bad, "{'descr': '<f4xyz', 'fortran_order': False, 'shape': (4, 3), }", xf,
          sizeof xf);
  REFUSED(bad, y, DP_ERR_PARSE, "%s: byte 20: descr '<f4xyz'", bad);
  raw_npy(bad, "{'descr': '<f4', 'fortran_order': Falsexyz, 'shape': (4, 3), }", xf,
          sizeof xf);
  REFUSED(bad, y, DP_ERR_PARSE, "fortran_order Falsexyz");
  raw_npy(bad,
          "{'descr': [('a', '<f4'), ('b', '<f4')], 'fortran_order': False, "
          "'shape': (4,), }",
          xf, sizeof xf);
  REFUSED(bad, y, DP_ERR_PARSE, "is not a simple dtype");
  raw_npy(bad,
          "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 3), }",
          xf, sizeof xf);
  REFUSED(bad, y, DP_ERR_PARSE,
          "shape (4611686018427387904, 3) is not a tuple of at most 8 dimensions, each 0 "
          "to 2^48");
  raw_npy(bad, "{'shape': (4, 3), 'fortran_order': False, 'descr': '<f4'}", xf, sizeof xf);
  {
    ck_assert_int_eq(bin_load(bad, y, 3, &d, err, sizeof err), DP_OK);
    ck_assert_int_eq(d.n_rows, R);
    ck_assert_int_eq(d.n_features, F);
    dpt_dataset_free(&d);
  }
  /* values: NaN, infinite, beyond float's range (float64) */
  float nan_x[R * F];
  memcpy(nan_x, xf, sizeof xf);
  nan_x[7] = NAN;
  size_t off = npy_write(bad, "<f4", 0, shape, 2, nan_x, sizeof nan_x);
  REFUSED(bad, y, DP_ERR_NONFINITE, "%s: byte %zu (row 2, value 1): NaN", bad, off + 28);
  nan_x[7] = -INFINITY;
  npy_write(bad, "<f4", 0, shape, 2, nan_x, sizeof nan_x);
  REFUSED(bad, y, DP_ERR_NONFINITE, "%s: byte %zu (row 2, value 1): infinite", bad,
          off + 28);
  double big[R * F] = {0};
  big[11] = 1e39;
  off = npy_write(bad, "<f8", 0, shape, 2, big, sizeof big);
  REFUSED(bad, y, DP_ERR_RANGE, "%s: byte %zu (row 3, value 2): beyond float32's range",
          bad, off + 88);
  /* labels: out of range (above, below), too few, of another dtype or shape */
  int32_t yb[R] = {0, 1, 3, 1};
  off = npy_write(bad, "<i4", 0, lshape, 1, yb, sizeof yb);
  REFUSED(x, bad, DP_ERR_RANGE, "%s: byte %zu (row 2): label 3 is out of range (0 to 2",
          bad, off + 8);
  yb[2] = -1;
  npy_write(bad, "<i4", 0, lshape, 1, yb, sizeof yb);
  REFUSED(x, bad, DP_ERR_RANGE, "(row 2): label -1 is out of range");
  uint64_t three[1] = {3};
  npy_write(bad, "<i4", 0, three, 1, yi, 12);
  REFUSED(x, bad, DP_ERR_PARSE, "%s: byte 60: 3 labels; %s has 4 rows", bad, x);
  npy_write(bad, "<f4", 0, lshape, 1, xf, 16);
  REFUSED(x, bad, DP_ERR_PARSE, "dtype '<f4' is not supported: class labels must be");
  npy_write(bad, "<i4", 0, shape, 2, xf, sizeof xf);
  REFUSED(x, bad, DP_ERR_PARSE, "shape (4, 3): labels must be (N,) or (N, 1)");
  /* features that are not the model's width */
  dpt_data_spec sp = {.data = x, .labels = y, .rows = DPT_ROWS_CLASSES, .n_features = 5};
  ck_assert_int_eq(dpt_data_load(&sp, &d, err, sizeof err), DP_ERR_SHAPE);
  ck_assert_msg(strstr(err, "byte 60: shape (4, 3): 3 values per row; the model takes 5"),
                "%s", err);
  /* labels missing; a labels file beside a CSV; --header beside a .npy */
  REFUSED(x, NULL, DP_ERR_INVALID,
          "%s holds the features only: give the labels with --labels", x);
  file_put(bad, "hello\n", 6); /* what is wrong with the file comes first */
  REFUSED(bad, NULL, DP_ERR_PARSE, "%s: byte 0: not a .npy file", bad);
  const char *csv = bin_path(&b, 3, "d.csv");
  file_put(csv, "0,1,2,3\n", 8);
  REFUSED(csv, y, DP_ERR_INVALID,
          "is a CSV file, which holds its labels in its first field");
  sp = (dpt_data_spec){.data = x, .labels = y, .rows = DPT_ROWS_CLASSES, .header = 1};
  ck_assert_int_eq(dpt_data_load(&sp, &d, err, sizeof err), DP_ERR_INVALID);
  /* IDX: another type, a cut header, truncated data, a truncated gzip stream */
  const char *idx = bin_path(&b, 4, "x-idx3-ubyte");
  unsigned char ib[12 + R * F * 4] = {0, 0, 0x0d, 2, 0, 0,
                                      0, R, 0,    0, 0, F}; /* type 0x0d: floats */
  file_put(idx, ib, 12 + R * F * 4);
  REFUSED(idx, y, DP_ERR_PARSE, "%s: byte 2: IDX type 0x0d is not supported", idx);
  ib[2] = 0x08;
  file_put(idx, ib, 9);
  REFUSED(idx, y, DP_ERR_PARSE, "%s: byte 9: the header of 2 dimensions is cut short", idx);
  file_put(idx, ib, 12 + R * F - 1);
  REFUSED(idx, y, DP_ERR_PARSE,
          "%s: byte 12: shape (4, 3) of '|u1' is 12 bytes of data; the "
          "file has 11 after its header (truncated)",
          idx);
  ib[0] = 7;
  file_put(idx, ib, 12 + R * F);
  REFUSED(idx, y, DP_ERR_PARSE, "%s: byte 0: not an IDX file", idx);
  uint32_t dims[2] = {R, F};
  unsigned char xu[R * F] = {0};
  const char *gz = bin_path(&b, 5, "x-idx3-ubyte.gz");
  if (idx_write(gz, dims, 2, xu, 1)) {
    f = fopen(gz, "rb");
    n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    file_put(gz, buf, n - 12);
    REFUSED(gz, y, DP_ERR_PARSE, "the gzip stream is cut short (truncated file)");
    buf[3] = 0xff; /* reserved flag bits */
    file_put(gz, buf, n);
    REFUSED(gz, y, DP_ERR_PARSE, "%s: byte", gz);
    /* decompressed no further than the header says: 64 MiB of zeros after a
     * header of 12 bytes of data (64 KiB of gzip) stop at byte 25 */
    unsigned char hd[12] = {0, 0, 0x08, 2, 0, 0, 0, R, 0, 0, 0, F};
    gz_write_zeros(gz, hd, 12, (size_t)64 << 20);
    REFUSED(gz, y, DP_ERR_PARSE,
            "%s: decompresses to more than the 24 bytes its IDX header gives", gz);
    /* gzip'd features are IDX or nothing: another type, or no IDX at all,
     * stops at its first bytes */
    hd[2] = 0x09;
    gz_write_zeros(gz, hd, 12, (size_t)64 << 20);
    REFUSED(gz, y, DP_ERR_PARSE, "%s: byte 2: IDX type 0x09 is not supported", gz);
    hd[2] = 0x08;
    gz_write_zeros(gz, "1,2,3\n", 6, (size_t)64 << 20);
    REFUSED(gz, y, DP_ERR_PARSE, "%s: byte 0: not an IDX file (once gunzipped", gz);
    /* a header giving more than the stream can hold, or than 2 GiB */
    hd[5] = 0x10; /* 0x100004 rows of 3 bytes: 3 MiB from a stream of a few dozen */
    gz_write_zeros(gz, hd, 12, 12);
    REFUSED(gz, y, DP_ERR_PARSE,
            "its IDX header gives 3145752 bytes, more than a gzip stream of");
    hd[10] = 0x10; /* rows of 0x1003 bytes: 4 GiB, from a stream of a few dozen */
    gz_write_zeros(gz, hd, 12, 12);
    REFUSED(gz, y, DP_ERR_PARSE, "its IDX header gives 4298129432 bytes, more than a gzip");
  } else {
    file_put(gz, "\x1f\x8b\x08", 3);
    REFUSED(gz, y, DP_ERR_UNSUPPORTED, "built without zlib: gunzip it first");
  }
#undef REFUSED
  bin_close(&b);
}
END_TEST

/* CSV headers: detected (a field that is not a number), skipped, its line
 * counted; forced with header 1 even when numeric; a row with another field
 * count than the header's refused; a lone "header" read as data, with its
 * error. */
START_TEST(csv_header_is_detected_or_forced) {
  tmpfile_t t;
  char err[256];
  dpt_dataset d;
  tmp_write(&t, "# names\nlabel,f1,f2\n1,2,3\n0,4,5\n");
  ck_assert_int_eq(dpt_csv_load(t.path, &d, err, sizeof err), DP_OK);
  ck_assert(d.n_rows == 2 && d.n_features == 2 && d.header_line == 2 && d.x[0] == 2.0f);
  dpt_dataset_free(&d);
  unlink(t.path);
  tmp_write(&t, "label,0,1\n1,2,3\n"); /* numeric names after the first */
  ck_assert_int_eq(dpt_csv_load(t.path, &d, err, sizeof err), DP_OK);
  ck_assert(d.n_rows == 1 && d.header_line == 1);
  dpt_dataset_free(&d);
  unlink(t.path);
  tmp_write(&t, "7,8,9\n1,2,3\n");
  ck_assert_int_eq(dpt_csv_load_as(t.path, DPT_ROWS_CLASSES, 0, 1, &d, err, sizeof err),
                   DP_OK);
  ck_assert(d.n_rows == 1 && d.label[0] == 1 && d.header_line == 1);
  dpt_dataset_free(&d);
  ck_assert_int_eq(dpt_csv_load(t.path, &d, err, sizeof err), DP_OK);
  ck_assert(d.n_rows == 2 && d.header_line == 0);
  dpt_dataset_free(&d);
  unlink(t.path);
  char want[256];
  tmp_write(&t, "a,b,c\n1,2,3\n1,2\n");
  ck_assert_int_eq(dpt_csv_load(t.path, &d, err, sizeof err), DP_ERR_PARSE);
  snprintf(want, sizeof want, "%s:3: field count 2; the header row (line 1) has 3", t.path);
  ck_assert_str_eq(err, want);
  unlink(t.path);
  /* a UTF-8 byte-order mark is not a header; nor is a first row with an empty
   * field, a long number or a stray sign (no letter): they are data rows, and
   * their errors are said */
  tmp_write(&t, "\xef\xbb\xbf"
                "1,2,3\n0,4,5\n");
  ck_assert_int_eq(dpt_csv_load(t.path, &d, err, sizeof err), DP_OK);
  ck_assert(d.n_rows == 2 && d.header_line == 0 && d.label[0] == 1 && d.x[0] == 2.0f);
  dpt_dataset_free(&d);
  unlink(t.path);
  static const char *const not_names[] = {
      "1,,3\n1,2,3\n", "1,-,3\n1,2,3\n",
      "1,12345678901234567890123456789012345678901234567"
      "8901234567890123456789,3\n1,2,3\n"};
  for (int i = 0; i < 3; i++) {
    tmp_write(&t, not_names[i]);
    ck_assert_int_ne(dpt_csv_load(t.path, &d, err, sizeof err), DP_OK);
    snprintf(want, sizeof want, "%s:1: field 2:", t.path);
    ck_assert_msg(strstr(err, want), "%s", err);
    unlink(t.path);
  }
  /* names in any script are a header */
  tmp_write(&t, "\xe6\xa0\x87\xe7\xad\xbe,\xe7\x89\xb9\xe5\xbe\x81\n1,2\n");
  ck_assert_int_eq(dpt_csv_load(t.path, &d, err, sizeof err), DP_OK);
  ck_assert(d.n_rows == 1 && d.header_line == 1);
  dpt_dataset_free(&d);
  unlink(t.path);
  /* another separator: said */
  tmp_write(&t, "label;a;b\n1;2;3\n");
  ck_assert_int_eq(dpt_csv_load(t.path, &d, err, sizeof err), DP_ERR_PARSE);
  ck_assert_msg(strstr(err, "fields are separated by commas, not semicolons"), "%s", err);
  unlink(t.path);
  tmp_write(&t, "a,b,c\n");
  ck_assert_int_eq(dpt_csv_load(t.path, &d, err, sizeof err), DP_ERR_PARSE);
  snprintf(want, sizeof want, "%s:1: field 1: label \"a\" is not a non-negative integer",
           t.path);
  ck_assert_str_eq(err, want);
  ck_assert_int_eq(dpt_csv_load_as(t.path, DPT_ROWS_CLASSES, 0, 1, &d, err, sizeof err),
                   DP_ERR_PARSE);
  ck_assert_ptr_nonnull(strstr(err, "no data rows after the header"));
  unlink(t.path);
}
END_TEST

/* ---- epoch order ------------------------------------------------------------------ */

static int is_permutation(const int *p, int n) {
  int *seen = calloc((size_t)n, sizeof(int));
  int ok = 1;
  for (int i = 0; i < n; i++) {
    if (p[i] < 0 || p[i] >= n || seen[p[i]])
      ok = 0;
    else
      seen[p[i]] = 1;
  }
  free(seen);
  return ok;
}

START_TEST(epoch_order_is_a_permutation) {
  const int ns[] = {1, 2, 3, 10, 1000};
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    int n = ns[k];
    int *p = malloc((size_t)n * sizeof(int));
    for (int e = 0; e < 5; e++) {
      dpt_epoch_order(n, 12345, e, p);
      ck_assert(is_permutation(p, n));
    }
    free(p);
  }
  int untouched = -7;
  dpt_epoch_order(0, 1, 0, &untouched);
  ck_assert_int_eq(untouched, -7);
  dpt_epoch_order(5, 1, 0, NULL);
}
END_TEST

START_TEST(epoch_order_is_deterministic) {
  int a[200], b[200];
  dpt_epoch_order(200, 99, 3, a);
  dpt_epoch_order(200, 99, 3, b);
  ck_assert_mem_eq(a, b, sizeof a);
  /* pinned: runs recorded with a seed must replay the same order later */
  int c[8];
  const int want[8] = {4, 6, 5, 3, 2, 0, 1, 7};
  dpt_epoch_order(8, 0, 0, c);
  ck_assert_mem_eq(c, want, sizeof c);
}
END_TEST

START_TEST(epoch_order_differs_by_epoch_and_seed) {
  int a[200], b[200], c[200];
  dpt_epoch_order(200, 99, 0, a);
  dpt_epoch_order(200, 99, 1, b);
  dpt_epoch_order(200, 100, 0, c);
  ck_assert_int_ne(memcmp(a, b, sizeof a), 0);
  ck_assert_int_ne(memcmp(a, c, sizeof a), 0);
  /* and it does shuffle */
  int identity = 1;
  for (int i = 0; i < 200; i++)
    if (a[i] != i) identity = 0;
  ck_assert_int_eq(identity, 0);
  /* roughly uniform: element 0 lands in each half about equally often */
  int low = 0;
  int p[10];
  for (int e = 0; e < 2000; e++) {
    dpt_epoch_order(10, 5, e, p);
    for (int i = 0; i < 5; i++)
      if (p[i] == 0) low++;
  }
  ck_assert_int_gt(low, 850);
  ck_assert_int_lt(low, 1150);
}
END_TEST

/* ---- svg ------------------------------------------------------------------------- */

START_TEST(svg_line_plot_writes_file) {
  tmpfile_t t;
  tmp_path(&t);
  float y[50];
  for (int i = 0; i < 50; i++) y[i] = 2.3f * expf(-0.05f * (float)i) + 0.1f;
  char err[256] = "";
  ck_assert_int_eq(dpt_svg_line_plot(t.path, "loss <digits> & co", "epoch", "loss", y, 50,
                                     err, sizeof err),
                   DP_OK);
  char *s = slurp(t.path);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(strncmp(s, "<svg", 4), 0);
  ck_assert_int_eq(count_of(s, "<polyline"), 1);
  ck_assert_int_eq(count_of(s, "points=\""), 1);
  ck_assert_ptr_nonnull(strstr(s, "loss &lt;digits&gt; &amp; co"));
  ck_assert_ptr_nonnull(strstr(s, ">epoch<"));
  ck_assert_ptr_nonnull(strstr(s, "</svg>\n"));
  free(s);
  unlink(t.path);
}
END_TEST

START_TEST(svg_line_plot_single_and_constant) {
  tmpfile_t t;
  tmp_path(&t);
  char err[256] = "";
  float one = 0.75f;
  ck_assert_int_eq(dpt_svg_line_plot(t.path, NULL, NULL, NULL, &one, 1, err, sizeof err),
                   DP_OK);
  char *s = slurp(t.path);
  ck_assert_int_eq(strncmp(s, "<svg", 4), 0);
  ck_assert_ptr_nonnull(strstr(s, "<polyline"));
  ck_assert_ptr_nonnull(strstr(s, "<circle"));
  ck_assert_ptr_null(strstr(s, "nan"));
  ck_assert_ptr_null(strstr(s, "inf"));
  free(s);
  float flat[5] = {0, 0, 0, 0, 0};
  ck_assert_int_eq(dpt_svg_line_plot(t.path, "t", "x", "y", flat, 5, err, sizeof err),
                   DP_OK);
  s = slurp(t.path);
  ck_assert_ptr_nonnull(strstr(s, "<polyline"));
  ck_assert_ptr_null(strstr(s, "nan"));
  ck_assert_ptr_null(strstr(s, "inf"));
  free(s);
  /* a diverged value splits the line */
  float gap[5] = {1, 2, NAN, 3, 4};
  ck_assert_int_eq(dpt_svg_line_plot(t.path, "t", "x", "y", gap, 5, err, sizeof err),
                   DP_OK);
  s = slurp(t.path);
  ck_assert_int_eq(count_of(s, "<polyline"), 2);
  ck_assert_ptr_null(strstr(s, "nan"));
  free(s);
  unlink(t.path);
}
END_TEST

START_TEST(svg_line_plot_errors) {
  float y[3] = {1, 2, 3};
  char err[256] = "";
  ck_assert_int_eq(
      dpt_svg_line_plot("/nonexistent/dir/plot.svg", "t", "x", "y", y, 3, err, sizeof err),
      DP_ERR_IO);
  ck_assert_str_eq(err, "cannot write chart '/nonexistent/dir/plot.svg': No such file or "
                        "directory");
  ck_assert_int_eq(dpt_svg_line_plot("/tmp/x.svg", "t", "x", "y", y, 0, err, sizeof err),
                   DP_ERR_INVALID);
  ck_assert_int_eq(dpt_svg_line_plot("/tmp/x.svg", "t", "x", "y", NULL, 3, err, sizeof err),
                   DP_ERR_INVALID);
  /* a device is never written (nor replaced by the rename): refused, untouched */
  struct stat st;
  if (stat("/dev/full", &st) == 0) {
    ck_assert_int_eq(dpt_svg_line_plot("/dev/full", "t", "x", "y", y, 3, err, sizeof err),
                     DP_ERR_IO);
    ck_assert_str_eq(err,
                     "cannot write chart '/dev/full': is a character device, not a regular "
                     "file");
    ck_assert(S_ISCHR(st.st_mode));
  }
}
END_TEST

START_TEST(svg_stacked_bars_writes_file) {
  tmpfile_t t;
  tmp_path(&t);
  const char *bars[] = {"gpu0", "gpu1"};
  const char *segs[] = {"params", "unused", "activations", "gathered <outputs>"};
  const double v[] = {
      1.5 * 1048576, 0, 3.0 * 1048576, 2.0 * 1048576, /* gpu0 */
      1.5 * 1048576, 0, 1.5 * 1048576, 0,             /* gpu1 */
  };
  char err[256] = "";
  ck_assert_int_eq(dpt_svg_stacked_bars(t.path, "arena per device", 2, bars, 4, segs, NULL,
                                        v, err, sizeof err),
                   DP_OK);
  char *s = slurp(t.path);
  ck_assert_int_eq(strncmp(s, "<svg", 4), 0);
  ck_assert_ptr_nonnull(strstr(s, "MiB"));
  ck_assert_ptr_nonnull(strstr(s, ">gpu0<"));
  ck_assert_ptr_nonnull(strstr(s, ">gpu1<"));
  ck_assert_ptr_nonnull(strstr(s, "gathered &lt;outputs&gt;"));
  ck_assert_ptr_nonnull(strstr(s, ">6.50 MiB<")); /* gpu0's total */
  ck_assert_ptr_null(strstr(s, "unused"));        /* zero everywhere: no legend */
  /* 5 non-zero segments drawn, each with a tooltip */
  ck_assert_int_eq(count_of(s, "<title>"), 5);
  /* what only the first bar holds: named on it and marked in the legend */
  ck_assert_ptr_nonnull(strstr(s, "gathered &lt;outputs&gt; (only gpu0)"));
  ck_assert_ptr_null(strstr(s, "params (only"));
  free(s);
  /* the caller's colours, per segment, whatever else is in the chart */
  const char *colors[] = {"#111111", "#222222", "#333333", "#444444"};
  ck_assert_int_eq(
      dpt_svg_stacked_bars(t.path, "c", 2, bars, 4, segs, colors, v, err, sizeof err),
      DP_OK);
  s = slurp(t.path);
  ck_assert_int_eq(count_of(s, "fill=\"#111111\""), 3); /* two bars and the legend */
  ck_assert_int_eq(count_of(s, "fill=\"#444444\""), 2); /* gpu0 only, and the legend */
  ck_assert_int_eq(count_of(s, "#222222"), 0);          /* zero everywhere */
  free(s);
  /* NULL names and all-zero values still make a file */
  const double z[] = {0, 0};
  ck_assert_int_eq(
      dpt_svg_stacked_bars(t.path, NULL, 2, NULL, 1, NULL, NULL, z, err, sizeof err),
      DP_OK);
  s = slurp(t.path);
  ck_assert_ptr_nonnull(strstr(s, ">dev 1<"));
  ck_assert_ptr_null(strstr(s, "nan"));
  free(s);
  unlink(t.path);
}
END_TEST

START_TEST(svg_stacked_bars_errors) {
  const double v[] = {1, -1};
  char err[256] = "";
  ck_assert_int_eq(
      dpt_svg_stacked_bars("/tmp/x.svg", "t", 1, NULL, 2, NULL, NULL, v, err, sizeof err),
      DP_ERR_INVALID);
  ck_assert_str_eq(err,
                   "dpt_svg_stacked_bars: bar 0 segment 1: value -1 is not a finite byte "
                   "count >= 0");
  const double w[] = {1, 2};
  ck_assert_int_eq(dpt_svg_stacked_bars("/nonexistent/dir/b.svg", "t", 1, NULL, 2, NULL,
                                        NULL, w, err, sizeof err),
                   DP_ERR_IO);
  ck_assert_int_eq(
      dpt_svg_stacked_bars("/tmp/x.svg", "t", 0, NULL, 2, NULL, NULL, w, err, sizeof err),
      DP_ERR_INVALID);
}
END_TEST

START_TEST(svg_format_bytes) {
  char b[32];
  ck_assert_str_eq(dpt_format_bytes(0, b, sizeof b), "0 B");
  ck_assert_str_eq(dpt_format_bytes(1023, b, sizeof b), "1023 B");
  ck_assert_str_eq(dpt_format_bytes(1536, b, sizeof b), "1.50 KiB");
  ck_assert_str_eq(dpt_format_bytes(12.5 * 1048576, b, sizeof b), "12.5 MiB");
  ck_assert_str_eq(dpt_format_bytes(640.0 * 1073741824.0, b, sizeof b), "640 GiB");
  ck_assert_str_eq(dpt_format_bytes(2.0 * 1099511627776.0, b, sizeof b), "2.00 TiB");
}
END_TEST

/* ---- the run record (dp train's checkpoint data) ------------------------------ */

/* What dpt_run_text writes reads back; every number of a record is
 * range-checked (issue 26: "epochs 2147483647" overflowed dp train's resume
 * arithmetic), and a record of other shape is refused with the reason. */
START_TEST(run_record_numbers_are_range_checked) {
  double mean[2] = {0.5, -0x1.8p+3},
         sd[2] = {1.0, 0x1.123456789abcdp-100}; /* a double's bits */
  dpt_scaler sc = {.n = 2, .mean = mean, .std = sd}, got;
  size_t n;
  char *text = dpt_run_text(7, 1437, &sc, "lr=0x1p-3", &n), err[256];
  ck_assert_ptr_nonnull(text);
  int epochs = -1, rows = -1;
  char *settings = NULL;
  ck_assert_int_eq(dpt_run_parse(text, n, &epochs, &rows, &got, &settings, err, sizeof err),
                   0);
  ck_assert(epochs == 7 && rows == 1437 && got.n == 2 && got.mean[1] == mean[1] &&
            got.std[1] == sd[1]);
  ck_assert_str_eq(settings, "lr=0x1p-3");
  free(settings);
  dpt_scaler_free(&got);
  free(text);
  static const struct {
    const char *text, *needle; /* NULL: taken */
  } cases[] = {
      {"libdp-train 1\nepochs 1000000000\nrows 2147483647\nstandardize 0\nfeatures 0\n",
       NULL},
      {"libdp-train 1\nepochs 0\nrows 0\nstandardize 0\nfeatures 0\n", NULL},
      {"libdp-train 1\nepochs 2147483647\nrows 1\nstandardize 0\nfeatures 0\n",
       "epochs 2147483647 is out of range (0 to 1000000000)"},
      {"libdp-train 1\nepochs 1000000001\nrows 1\nstandardize 0\nfeatures 0\n",
       "out of range"},
      {"libdp-train 1\nepochs 99999999999999999999\nrows 1\nstandardize 0\nfeatures 0\n",
       "out of range"},
      {"libdp-train 1\nepochs -1\nrows 1\nstandardize 0\nfeatures 0\n", "not a number"},
      {"libdp-train 1\nepochs +3\nrows 1\nstandardize 0\nfeatures 0\n", "not a number"},
      {"libdp-train 1\nepochs  3\nrows 1\nstandardize 0\nfeatures 0\n", "not a number"},
      {"libdp-train 1\nepochs 03\nrows 1\nstandardize 0\nfeatures 0\n", "not a number"},
      {"libdp-train 1\nepochs 3x\nrows 1\nstandardize 0\nfeatures 0\n", "not a number"},
      {"libdp-train 1\nepochs 3\nrows 2147483648\nstandardize 0\nfeatures 0\n",
       "rows 2147483648 is out of range"},
      {"libdp-train 1\nepochs 3\nrows -5\nstandardize 0\nfeatures 0\n", "rows"},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 3\nfeatures 0\n",
       "standardize 3 is out of range (0 to 2)"},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 2\nfeatures 0\n",
       "standardize 2 with 0 features"},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 1\nfeatures 0\n",
       "standardize 1 with 0 features"},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 0\nfeatures 4\n",
       "standardize 0 with 4 features"},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 1\nfeatures 16777217\n",
       "features 16777217 is out of range"},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 1\nfeatures 1\nmean nan\nstd 0x1p+0\n",
       "mean[0] is not a finite float32"},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 1\nfeatures 1\nmean 0\nstd 0\n",
       "std[0] is not a normal float32 above 0"},
      /* an outside check (session 23): beyond a float32, every input was +-FLT_MAX */
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 1\nfeatures 1\nmean 1e39\nstd 1\n",
       "mean[0] is not a finite float32"},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 1\nfeatures 1\nmean 0\nstd 1e-300\n",
       "std[0] is not a normal float32 above 0"},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 1\nfeatures 1\nmean 0\nstd -1\n",
       "std[0]"},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 1\nfeatures 1\nmean 0\nstd inf\n",
       "std[0]"},
      /* each way named (an outside check, session 23: "not dp train's" alone) */
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 1\nfeatures 2\nmean 0\n1\nstd 1 1\n",
       "not dp train's: mean has 1 values where features gives 2"},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 1\nfeatures 1\nmean 0 1\nstd 1\n",
       "mean has more values than features gives (1)"},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 1\nfeatures 1\nmean 0\n",
       "no line \"std ...\" where it belongs"},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 0\nfeatures 0\nposition 2\nposition "
       "2\n",
       "a line it does not know at byte 66: \"position 2\""},
      {"libdp-train 1\nepochs 3\nrows 5\nstandardize 0\nfeatures 0\nsettings x",
       "its settings line does not end"},
      {"libdp-train 2\nepochs 3\n", "libdp-train 1"},
      {"libdp-train 1\nrows 5\n", "no line \"epochs N\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *t = cases[i].text;
    int r = dpt_run_parse(t, strlen(t), &epochs, &rows, &got, NULL, err, sizeof err);
    if (!cases[i].needle) {
      ck_assert_msg(r == 0, "case %zu: %s", i, err);
      dpt_scaler_free(&got);
      continue;
    }
    ck_assert_msg(r == -1, "case %zu: taken", i);
    ck_assert_msg(strstr(err, "its run record (the application data) is not dp train's") &&
                      strstr(err, cases[i].needle),
                  "case %zu: '%s' lacks '%s'", i, err, cases[i].needle);
    ck_assert(got.n == 0 && !got.mean && !got.std);
  }
  /* a NUL inside */
  static const char nul[] =
      "libdp-train 1\nepochs 3\0\nrows 5\nstandardize 0\nfeatures 0\n";
  ck_assert_int_eq(
      dpt_run_parse(nul, sizeof nul - 1, &epochs, &rows, &got, NULL, err, sizeof err), -1);
}
END_TEST
Suite *data_suite(void) {
  Suite *s = suite_create("data");

  TCase *tc = tcase_create("csv");
  tcase_add_test(tc, csv_loads_labels_and_features);
  tcase_add_test(tc, csv_accepts_number_forms_and_spaces);
  tcase_add_test(tc, csv_accepts_crlf);
  tcase_add_test(tc, csv_skips_comments_and_blank_lines);
  tcase_add_test(tc, csv_regression_targets_first);
  tcase_add_test(tc, csv_error_bad_number);
  tcase_add_test(tc, csv_error_empty_field);
  tcase_add_test(tc, csv_error_field_count);
  tcase_add_test(tc, csv_error_labels);
  tcase_add_test(tc, csv_error_non_finite);
  tcase_add_test(tc, csv_error_empty_file);
  tcase_add_test(tc, csv_error_missing_file_and_args);
  tcase_add_test(tc, csv_fifo_without_writer_is_refused_at_once);
  tcase_add_test(tc, csv_error_long_field_is_shortened);
  tcase_add_test(tc, csv_error_nul_byte);
  tcase_add_test(tc, csv_many_rows_grow);
  suite_add_tcase(s, tc);

  tc = tcase_create("digits");
  tcase_add_test(tc, digits_csv_loads);
  tcase_add_test(tc, split_digits);
  suite_add_tcase(s, tc);

  tc = tcase_create("split");
  tcase_add_test(tc, split_sizes);
  tcase_add_test(tc, split_refuses_bad_fractions);
  tcase_add_test(tc, split_is_disjoint_and_covers_all);
  tcase_add_test(tc, split_is_deterministic);
  tcase_add_test(tc, split_copies_regression_targets);
  suite_add_tcase(s, tc);

  tc = tcase_create("formats");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, binary_formats_read_the_same_rows);
  tcase_add_test(tc, binary_split_views_match_the_csv);
  tcase_add_test(tc, binary_hostile_files_are_refused);
  tcase_add_test(tc, csv_header_is_detected_or_forced);
  suite_add_tcase(s, tc);

  tc = tcase_create("standardize");
  tcase_add_test(tc, standardize_uses_train_stats);
  tcase_add_test(tc, standardize_saturates_far_outliers);
  tcase_add_test(tc, run_record_numbers_are_range_checked);
  suite_add_tcase(s, tc);

  tc = tcase_create("epoch_order");
  tcase_add_test(tc, epoch_order_is_a_permutation);
  tcase_add_test(tc, epoch_order_is_deterministic);
  tcase_add_test(tc, epoch_order_differs_by_epoch_and_seed);
  suite_add_tcase(s, tc);

  tc = tcase_create("svg");
  tcase_add_test(tc, svg_line_plot_writes_file);
  tcase_add_test(tc, svg_line_plot_single_and_constant);
  tcase_add_test(tc, svg_line_plot_errors);
  tcase_add_test(tc, svg_stacked_bars_writes_file);
  tcase_add_test(tc, svg_stacked_bars_errors);
  tcase_add_test(tc, svg_format_bytes);
  tcase_add_test(tc, token_streams);
  suite_add_tcase(s, tc);
  return s;
}
