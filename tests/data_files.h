/* tests/data_files.h — the files the dp tool's data readers take (.npy, IDX,
 * gzip'd IDX), written by the tests themselves, and the digits as arrays. */
#ifndef TEST_DATA_FILES_H
#define TEST_DATA_FILES_H

#include <stddef.h>
#include <stdint.h>

/* A .npy file (format 1.0, header padded to 64 bytes as numpy pads it):
 * descr as numpy writes it ("<f4", "|u1", ">f4"), the order, the shape and
 * `bytes` bytes of data. Returns the data's byte offset (64 or 128). */
size_t npy_write(const char *path, const char *descr, int fortran, const uint64_t *shape,
                 int ndim, const void *data, size_t bytes);
/* An IDX file of unsigned bytes (type 0x08) of dims[0..nd), gzip'd when gz
 * (through zlib: 0 when this build has none, and nothing is written).
 * Returns 1 when written. */
int idx_write(const char *path, const uint32_t *dims, int nd, const unsigned char *data,
              int gz);
/* head (hn bytes) then `zeros` zero bytes, gzip'd into path: 1, or 0 without
 * zlib (nothing written). */
int gz_write_zeros(const char *path, const void *head, size_t hn, size_t zeros);
/* Whether this build reads gzip'd files (DPT_HAVE_ZLIB). */
int have_zlib(void);
/* data/digits.csv (run from the repository root) as arrays: *x (rows x 64
 * floats), *y (rows labels); free both. */
int digits_arrays(float **x, int32_t **y);

#endif
