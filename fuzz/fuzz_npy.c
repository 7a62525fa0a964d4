/* libFuzzer harness: the binary data readers of the `dp` tool (tools/data_bin.c):
 * .npy and IDX files (and what claims to be one; anything else is read as a
 * CSV, fuzz_csv's part), through dpt_data_load as dp predict reads data
 * without labels, and the .npy header parser alone.
 *
 * The bytes are an in-memory file (memfd). Each load must either
 *   - fail with a documented status, a message naming the path, and *out
 *     left all zero; or
 *   - succeed with rows >= 1 and features >= 1, whose rows, gathered through
 *     the held-out split's views and a standardisation fitted on them (the
 *     steps `dp train` runs), are all finite. */
#include "data.h"
#include "fuzz_util.h"

#include <math.h>

static int memfd = -1;

static int all_zero(const dpt_dataset *d) {
  static const dpt_dataset zero;
  return memcmp(d, &zero, sizeof zero) == 0;
}

/* Every row of d, standardised by sc (may be NULL), finite. */
static void check_rows(const dpt_dataset *d, const dpt_scaler *sc) {
  float x[4096];
  int per = 4096 / d->n_features, n = d->n_rows < 64 ? d->n_rows : 64;
  if (per < 1) return; /* a row wider than the buffer: the load was checked */
  for (int from = 0; from < n; from += per) {
    int k = n - from < per ? n - from : per;
    dpt_dataset_gather(d, sc, NULL, from, k, x, NULL);
    for (size_t i = 0; i < (size_t)k * (size_t)d->n_features; i++)
      FUZZ_CHECK(isfinite(x[i]), "row value %zu = %g", i, (double)x[i]);
  }
}

static void after_load(dpt_dataset *all, uint64_t h) {
  check_rows(all, NULL);
  dpt_dataset train, test;
  char err[256];
  dp_status s = dpt_dataset_split_as(all, (double)(h % 3) / 4.0, (int)(h >> 8 & 1), h,
                                     &train, &test, err, sizeof err);
  if (s != DP_OK) {
    FUZZ_CHECK(s == DP_ERR_INVALID && all_zero(&train) && all_zero(&test), "split: %s: %s",
               dp_status_name(s), err);
    return;
  }
  FUZZ_CHECK(all->x ? train.x && !train.rows : train.rows && train.borrowed && !train.x,
             "the split copied a mapped file, or did not copy a CSV's");
  dpt_scaler sc;
  FUZZ_CHECK(dpt_scaler_fit(&train, &sc) == 0, "out of memory");
  check_rows(&test, &sc);
  check_rows(&train, &sc);
  dpt_scaler_free(&sc);
  dpt_dataset_free(&train);
  dpt_dataset_free(&test);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[32], err[512] = "";
  if (fuzz_memfile("fuzz_npy", data, size, path, sizeof path, &memfd) < 0) abort();
  dpt_npy hdr;
  dp_status s = dpt_npy_parse(path, data, size, &hdr, err, sizeof err);
  FUZZ_CHECK(s != DP_OK || hdr.data <= size, "data offset %zu past %zu", hdr.data, size);
  dpt_dataset d;
  memset(&d, 0x5a, sizeof d); /* the loader must clear it */
  dpt_data_spec sp = {.data = path, .rows = DPT_ROWS_CLASSES, .labels_optional = 1};
  s = dpt_data_load(&sp, &d, err, sizeof err);
  fuzz_count(s == DP_OK ? "loaded" : "refused");
  if (s != DP_OK) {
    FUZZ_CHECK(s == DP_ERR_IO || s == DP_ERR_PARSE || s == DP_ERR_RANGE ||
                   s == DP_ERR_NONFINITE || s == DP_ERR_NOMEM || s == DP_ERR_OVERFLOW ||
                   s == DP_ERR_UNSUPPORTED || s == DP_ERR_SHAPE,
               "unexpected status %s: %s", dp_status_name(s), err);
    FUZZ_CHECK(strncmp(err, path, strlen(path)) == 0,
               "message does not name the file: '%s'", err);
    FUZZ_CHECK(all_zero(&d), "a failed load left data in *out");
    return 0;
  }
  FUZZ_CHECK(d.n_rows >= 1 && d.n_features >= 1, "rows %d, features %d", d.n_rows,
             d.n_features);
  after_load(&d, fuzz_hash(data, size));
  dpt_dataset_free(&d);
  FUZZ_CHECK(all_zero(&d), "dpt_dataset_free does not clear");
  return 0;
}
