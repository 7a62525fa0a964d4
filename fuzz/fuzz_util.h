/* Helpers shared by the libFuzzer harnesses in fuzz/.
 *
 * FUZZ_CHECK(cond, ...) is the harnesses' assertion: a broken invariant prints
 * the message and aborts, which libFuzzer records as a crash (with the input
 * saved as an artifact), exactly like a sanitizer report. */
#ifndef DP_FUZZ_UTIL_H
#define DP_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FUZZ_CHECK(cond, ...)                                                  \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: invariant failed: %s\n  ", __FILE__, __LINE__,   \
              #cond);                                                          \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
      abort();                                                                 \
    }                                                                          \
  } while (0)

/* FNV-1a 64 of the input: derives "random" but reproducible choices from it. */
static inline uint64_t fuzz_hash(const uint8_t *d, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ d[i]) * 0x100000001b3ull;
  return h;
}

/* An in-memory file holding d[0..n): its fd, and "/proc/self/fd/N" in path
 * (cap >= 32), which fopen/open treat as the regular file it is. The file
 * is reused across inputs (truncated and rewritten), so a harness does no
 * disk I/O. Returns -1 (with a message) when memfd is unavailable. */
static inline int fuzz_memfile(const char *name, const uint8_t *d, size_t n, char *path,
                               size_t cap, int *fd_cache) {
  if (*fd_cache < 0) {
    *fd_cache = memfd_create(name, 0);
    if (*fd_cache < 0) {
      perror("memfd_create");
      return -1;
    }
  }
  int fd = *fd_cache;
  if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0) return -1;
  size_t off = 0;
  while (off < n) {
    ssize_t w = write(fd, d + off, n - off);
    if (w <= 0) return -1;
    off += (size_t)w;
  }
  snprintf(path, cap, "/proc/self/fd/%d", fd);
  return fd;
}

/* Outcome counters, printed at exit when DP_FUZZ_STATS is set in the
 * environment: they show how deep the inputs get (e.g. how many loads were
 * accepted), which libFuzzer's coverage numbers do not say directly. */
typedef struct {
  const char *name;
  unsigned long long n;
} fuzz_counter;

#define FUZZ_MAX_COUNTERS 16
static fuzz_counter fuzz_counters[FUZZ_MAX_COUNTERS];

static inline void fuzz_print_counters(void) {
  for (int i = 0; i < FUZZ_MAX_COUNTERS && fuzz_counters[i].name; i++)
    fprintf(stderr, "fuzz stat %-28s %llu\n", fuzz_counters[i].name, fuzz_counters[i].n);
}

static inline void fuzz_count(const char *name) {
  static int registered;
  if (!registered) {
    registered = 1;
    if (getenv("DP_FUZZ_STATS")) atexit(fuzz_print_counters);
  }
  for (int i = 0; i < FUZZ_MAX_COUNTERS; i++) {
    if (!fuzz_counters[i].name) fuzz_counters[i].name = name;
    if (strcmp(fuzz_counters[i].name, name) == 0) {
      fuzz_counters[i].n++;
      return;
    }
  }
}

#endif
