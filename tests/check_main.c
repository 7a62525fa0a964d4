/* Runs the Check suites that configure.py found in tests/test_*.c.
 *
 *   build/test_dp              every suite
 *   build/test_dp NAME...      only these suites (e.g. `cuda` for cuda_suite)
 *   build/test_dp --list       the suite names
 *
 * Check's own environment variables apply: CK_FORK=no (debugging),
 * CK_VERBOSITY=verbose, CK_RUN_CASE=..., CK_EXCLUDE_TAGS=gpu, ...
 * Exit status: 0 when every test passed, 1 otherwise. This process never
 * touches CUDA: Check forks a child per test, and only tests do. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "dp.h"

#include "suites.h"

typedef struct {
  const char *name;
  Suite *(*make)(void);
} suite_entry;

#define SUITE_ENTRY(name) {#name, name##_suite},
static const suite_entry all_suites[] = {DP_SUITES(SUITE_ENTRY){NULL, NULL}};

static const suite_entry *find_suite(const char *name) {
  for (const suite_entry *s = all_suites; s->name; s++)
    if (strcmp(s->name, name) == 0) return s;
  return NULL;
}

static void list_suites(FILE *f) {
  for (const suite_entry *s = all_suites; s->name; s++) fprintf(f, " %s", s->name);
  fprintf(f, "\n");
}

int main(int argc, char **argv) {
  if (argc == 2 && (strcmp(argv[1], "--list") == 0 || strcmp(argv[1], "--help") == 0)) {
    printf("usage: %s [SUITE...]\nsuites:", argv[0]);
    list_suites(stdout);
    return 0;
  }
  for (int i = 1; i < argc; i++) {
    if (!find_suite(argv[i])) {
      fprintf(stderr, "%s: no suite named '%s'; suites:", argv[0], argv[i]);
      list_suites(stderr);
      return 1;
    }
  }

#ifdef DP_HAVE_CUDA
  /* libdp_cuda.a: plans for the cuda backend (registering touches no CUDA) */
  if (dp_cuda_register() != DP_OK) {
    fprintf(stderr, "dp_cuda_register: %s\n", dp_last_error());
    return 1;
  }
#endif
  SRunner *sr = NULL;
  for (const suite_entry *s = all_suites; s->name; s++) {
    int wanted = argc == 1;
    for (int i = 1; i < argc && !wanted; i++) wanted = strcmp(argv[i], s->name) == 0;
    if (!wanted) continue;
    if (!sr)
      sr = srunner_create(s->make());
    else
      srunner_add_suite(sr, s->make());
  }
  if (!sr) {
    printf("no test suites\n");
    return 0;
  }
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed != 0 ? 1 : 0;
}
