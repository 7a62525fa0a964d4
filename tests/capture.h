/* Runs a `dp` subcommand in-process with stdout and stderr captured (header
 * only; the suites of tools/ share it). */
#ifndef DP_TEST_CAPTURE_H
#define DP_TEST_CAPTURE_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* argc and argv of a command line: RUN-style calls, cmd(ARGC(...), ARGV(...)) */
#define ARGV(...) ((char *[]){"cmd", __VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){"cmd", __VA_ARGS__}) / sizeof(char *)))

typedef struct {
  int rc;
  char *out, *err; /* what the command printed, NUL-terminated */
} cmd_result;

static inline char *capture_slurp(FILE *f) {
  fflush(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  ck_assert(n >= 0);
  char *buf = malloc((size_t)n + 1);
  ck_assert_ptr_nonnull(buf);
  rewind(f);
  size_t got = fread(buf, 1, (size_t)n, f);
  buf[got] = '\0';
  return buf;
}

static inline cmd_result capture_cmd(int (*cmd)(int, char **), int argc, char **argv) {
  cmd_result r;
  fflush(stdout);
  fflush(stderr);
  FILE *fo = tmpfile(), *fe = tmpfile();
  ck_assert(fo && fe);
  int so = dup(STDOUT_FILENO), se = dup(STDERR_FILENO);
  ck_assert(so >= 0 && se >= 0);
  dup2(fileno(fo), STDOUT_FILENO);
  dup2(fileno(fe), STDERR_FILENO);
  r.rc = cmd(argc, argv);
  fflush(stdout);
  fflush(stderr);
  dup2(so, STDOUT_FILENO);
  dup2(se, STDERR_FILENO);
  close(so);
  close(se);
  r.out = capture_slurp(fo);
  r.err = capture_slurp(fe);
  fclose(fo);
  fclose(fe);
  return r;
}

static inline void cmd_result_free(cmd_result *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

#endif
