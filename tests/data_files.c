/* tests/data_files.c — see data_files.h. */
#include "data_files.h"

#include "data.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DPT_HAVE_ZLIB
#include <zlib.h>
#endif

size_t npy_write(const char *path, const char *descr, int fortran, const uint64_t *shape,
                 int ndim, const void *data, size_t bytes) {
  char dict[256], sh[160] = "";
  for (int k = 0; k < ndim; k++)
    snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%llu,%s",
             (unsigned long long)shape[k], k + 1 < ndim ? " " : "");
  if (ndim > 1) sh[strlen(sh) - 1] = '\0'; /* (3,) but (3, 4) */
  snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }",
           descr, fortran ? "True" : "False", sh);
  size_t hl = strlen(dict) + 1, total = 10 + hl;
  total = (total + 63) / 64 * 64;
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  unsigned char head[10] = {0x93,
                            'N',
                            'U',
                            'M',
                            'P',
                            'Y',
                            1,
                            0,
                            (unsigned char)((total - 10) & 0xff),
                            (unsigned char)((total - 10) >> 8)};
  ck_assert_uint_eq(fwrite(head, 1, 10, f), 10);
  fputs(dict, f);
  for (size_t i = 10 + strlen(dict); i + 1 < total; i++) fputc(' ', f);
  fputc('\n', f);
  if (bytes) ck_assert_uint_eq(fwrite(data, 1, bytes, f), bytes);
  ck_assert_int_eq(fclose(f), 0);
  return total;
}

int have_zlib(void) {
#ifdef DPT_HAVE_ZLIB
  return 1;
#else
  return 0;
#endif
}

int idx_write(const char *path, const uint32_t *dims, int nd, const unsigned char *data,
              int gz) {
  unsigned char head[4 + 4 * 8] = {0, 0, 0x08, (unsigned char)nd};
  size_t n = 1;
  for (int k = 0; k < nd; k++) {
    for (int b = 0; b < 4; b++)
      head[4 + 4 * k + b] = (unsigned char)(dims[k] >> (24 - 8 * b));
    n *= dims[k];
  }
  size_t hn = 4 + 4 * (size_t)nd;
  if (gz) {
#ifdef DPT_HAVE_ZLIB
    gzFile z = gzopen(path, "wb");
    ck_assert_ptr_nonnull(z);
    ck_assert_int_eq(gzwrite(z, head, (unsigned)hn), (int)hn);
    if (n) ck_assert_int_eq(gzwrite(z, data, (unsigned)n), (int)n);
    ck_assert_int_eq(gzclose(z), Z_OK);
    return 1;
#else
    return 0;
#endif
  }
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(head, 1, hn, f), hn);
  if (n) ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
  return 1;
}

int gz_write_zeros(const char *path, const void *head, size_t hn, size_t zeros) {
#ifdef DPT_HAVE_ZLIB
  static const unsigned char z0[4096];
  gzFile z = gzopen(path, "wb9");
  ck_assert_ptr_nonnull(z);
  ck_assert_int_eq(gzwrite(z, head, (unsigned)hn), (int)hn);
  for (size_t k = 0; k < zeros; k += sizeof z0) {
    unsigned m = (unsigned)(zeros - k < sizeof z0 ? zeros - k : sizeof z0);
    ck_assert_int_eq(gzwrite(z, z0, m), (int)m);
  }
  ck_assert_int_eq(gzclose(z), Z_OK);
  return 1;
#else
  (void)path, (void)head, (void)hn, (void)zeros;
  return 0;
#endif
}

int digits_arrays(float **x, int32_t **y) {
  dpt_dataset d;
  char err[256];
  ck_assert_msg(dpt_csv_load("data/digits.csv", &d, err, sizeof err) == DP_OK, "%s", err);
  ck_assert_int_eq(d.n_features, 64);
  *x = d.x;
  *y = d.label;
  int rows = d.n_rows;
  d.x = NULL;
  d.label = NULL;
  dpt_dataset_free(&d);
  return rows;
}
