/* The utilities every layer may use: errors, files, checked arithmetic,
 * counter-based random numbers and the one FNV-1a. Not installed. */
#ifndef DP_UTIL_H
#define DP_UTIL_H

#include "dp.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors (lib/error.c) ---- */
#define DP_ERRMSG_CAP 512
/* Records "file:line: message" as the thread's last error; returns s. */
dp_status dp__error(dp_status s, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define DP_FAIL(s, ...) dp__error((s), __FILE__, __LINE__, __VA_ARGS__)
void dp__error_clear(void);
/* Sets the thread's last error to text verbatim (a message saved across
 * clean-up calls that may record errors of their own). */
void dp__error_restore(const char *text);

/* ---- files the library reads (lib/file.c) ---- */
#include <sys/stat.h>
/* Opens path read-only if it is a regular file, never blocking (a FIFO without
 * a writer included): the fd, with *st filled; -2 when it is not a regular
 * file (*st says what it is: dp__file_kind); -1 with errno when a call failed
 * (*failed names it: "open", "stat", "read"). */
int dp__open_regular(const char *path, struct stat *st, const char **failed);
/* Reads up to n bytes of fd into b (going on after EINTR; fewer when the file
 * ends first): *got of them. DP_ERR_IO when a read fails:
 * dp__io_fail(what, path, "read", path, errno). fd stays open. */
dp_status dp__read_fd(int fd, void *b, size_t n, size_t *got, const char *what,
                      const char *path);
/* "a directory", "a FIFO", "a socket", "a character device", "a block device",
 * "a symbolic link" (from lstat), "a regular file". */
const char *dp__file_kind(mode_t mode);
/* DP_ERR_IO: "<what> '<path>': cannot <failed> it: <strerror>" (or "... cannot
 * <failed> '<file>': ..." when file is not path). */
dp_status dp__io_fail(const char *what, const char *path, const char *failed,
                      const char *file, int err);
/* Writes path atomically through dp_file_create / dp_file_commit (dp.h):
 * fill(f, arg) writes the content into the temporary file (DP_ERR_IO with
 * errno set when a write failed, or another status with its message). On
 * failure the temporary file is removed and path is as it was. `what` names
 * the file in messages ("checkpoint"). */
#include <stdio.h>
dp_status dp__write_atomic(const char *path, const char *what,
                           dp_status (*fill)(FILE *f, void *arg), void *arg);

/* A libdp checkpoint's first 8 bytes (docs/CHECKPOINT.md): its reader writes
 * and checks them, the safetensors reader names such a file for what it is. */
#define DP__CKPT_MAGIC "DPCKPT\0\1"

/* ---- checked size arithmetic ---- */
static inline bool dp__mul(size_t a, size_t b, size_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}
static inline bool dp__add(size_t a, size_t b, size_t *out) {
  return !__builtin_add_overflow(a, b, out);
}

static inline bool dp__align_up(size_t x, size_t a, size_t *out) {
  size_t t;
  if (!dp__add(x, a - 1, &t)) return false;
  *out = t / a * a;
  return true;
}

static inline bool dp__is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

/* ---- rng (lib/rng.c) ---- */
enum { DP_RNG_INIT = 1, DP_RNG_DROPOUT = 2 };
/* Counter-based: the same key always gives the same number. */
uint64_t dp__rng_u64(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b, uint64_t c);
/* FNV-1a 64 of n bytes, continuing from h (start with DP_FNV_INIT): the hash of
 * dp_params_hash, checkpoint checksums and dp repro's tensor hashes. */
#define DP_FNV_INIT 0xcbf29ce484222325ull
uint64_t dp__fnv1a(uint64_t h, const void *data, size_t n);
/* The shortest decimal (up to 9 significant digits) that reads back as v, into
 * num (cap >= 32): how a person or a script writes the float (0.99999f as
 * "0.99999"). Returns num. (lib/util/names.c) */
const char *dp__shortest_float(float v, char *num, size_t cap);
/* Uniform in [0, 1) with 24 bits. */
float dp__rng_uniform(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b, uint64_t c);

#ifdef __cplusplus
}
#endif

#endif
