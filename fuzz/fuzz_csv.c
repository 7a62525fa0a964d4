/* libFuzzer harness: the CSV loader of the `dp` tool (tools/data.c).
 *
 * The bytes are written to an in-memory file (memfd) and loaded as a
 * classification CSV (dpt_csv_load) and as a regression CSV with 1..3 targets
 * (the count from the input's hash). Each load must either
 *   - fail with a documented status, a message naming the path, and *out
 *     left all zero; or
 *   - succeed with a consistent dataset: rows >= 1, features >= 1, every
 *     value finite, labels in [0, n_classes) with n_classes = largest + 1 and
 *     at most DPT_MAX_LABEL + 1;
 * and a successful load is then split, standardised and shuffled (the steps
 * `dp train` runs next), which must keep every value finite. */
#include "data.h"
#include "fuzz_util.h"

#include <math.h>

static int memfd = -1;

static int all_zero(const dpt_dataset *d) {
  static const dpt_dataset zero;
  return memcmp(d, &zero, sizeof zero) == 0;
}

static void check_finite(const float *v, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++) FUZZ_CHECK(isfinite(v[i]), "%s[%zu] = %g", what, i, (double)v[i]);
}

static void check_dataset(const dpt_dataset *d, int n_targets) {
  FUZZ_CHECK(d->n_rows >= 1 && d->n_features >= 1, "rows %d, features %d", d->n_rows,
             d->n_features);
  size_t rows = (size_t)d->n_rows;
  FUZZ_CHECK(d->x != NULL, "no x");
  check_finite(d->x, rows * (size_t)d->n_features, "x");
  if (n_targets == 0) {
    FUZZ_CHECK(d->label && !d->y && d->n_targets == 0, "classification arrays");
    int max = -1;
    for (size_t r = 0; r < rows; r++) {
      FUZZ_CHECK(d->label[r] >= 0 && d->label[r] <= DPT_MAX_LABEL, "label %d", d->label[r]);
      if (d->label[r] > max) max = d->label[r];
    }
    FUZZ_CHECK(d->n_classes == max + 1, "n_classes %d, largest label %d", d->n_classes, max);
  } else {
    FUZZ_CHECK(d->y && !d->label && d->n_targets == n_targets && d->n_classes == 0,
               "regression arrays");
    check_finite(d->y, rows * (size_t)n_targets, "y");
  }
}

static void after_load(dpt_dataset *all, uint64_t h) {
  dpt_dataset train, test;
  char err[256];
  double frac = (double)(h % 5) / 5.0; /* 0, 0.2, ..., 0.8 */
  dp_status s = dpt_dataset_split(all, frac, h, &train, &test, err, sizeof err);
  if (s != DP_OK) {
    FUZZ_CHECK(s == DP_ERR_INVALID && all_zero(&train) && all_zero(&test),
               "split: %s: %s", dp_status_name(s), err);
    return;
  }
  FUZZ_CHECK(train.n_rows >= 1 && train.n_rows + test.n_rows == all->n_rows,
             "split %d + %d of %d", train.n_rows, test.n_rows, all->n_rows);
  dpt_standardize(&train, &test);
  check_finite(train.x, (size_t)train.n_rows * (size_t)train.n_features, "standardised x");
  check_finite(test.x, (size_t)test.n_rows * (size_t)test.n_features, "standardised test x");
  int perm[64];
  int n = train.n_rows < 64 ? train.n_rows : 64;
  dpt_epoch_order(n, h, 3, perm);
  unsigned char seen[64] = {0};
  for (int i = 0; i < n; i++) {
    FUZZ_CHECK(perm[i] >= 0 && perm[i] < n && !seen[perm[i]], "epoch order is not a permutation");
    seen[perm[i]] = 1;
  }
  dpt_dataset_free(&train);
  dpt_dataset_free(&test);
}

static void load_one(const char *path, int n_targets, uint64_t h) {
  dpt_dataset d;
  memset(&d, 0x5a, sizeof d); /* the loader must clear it */
  char err[512] = "";
  dp_status s = n_targets == 0 ? dpt_csv_load(path, &d, err, sizeof err)
                               : dpt_csv_load_regression(path, n_targets, &d, err, sizeof err);
  fuzz_count(s == DP_OK ? "loaded" : "refused");
  if (s != DP_OK) {
    FUZZ_CHECK(s == DP_ERR_IO || s == DP_ERR_PARSE || s == DP_ERR_RANGE ||
                   s == DP_ERR_NONFINITE || s == DP_ERR_NOMEM || s == DP_ERR_OVERFLOW,
               "unexpected status %s: %s", dp_status_name(s), err);
    FUZZ_CHECK(strncmp(err, path, strlen(path)) == 0, "message does not name the file: '%s'",
               err);
    FUZZ_CHECK(all_zero(&d), "a failed load left data in *out");
    return;
  }
  check_dataset(&d, n_targets);
  after_load(&d, h);
  dpt_dataset_free(&d);
  FUZZ_CHECK(all_zero(&d), "dpt_dataset_free does not clear");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[32];
  if (fuzz_memfile("fuzz_csv", data, size, path, sizeof path, &memfd) < 0) abort();
  uint64_t h = fuzz_hash(data, size);
  load_one(path, 0, h);
  load_one(path, 1 + (int)(h % 3), h);
  return 0;
}
