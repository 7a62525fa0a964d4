/* Helpers shared by the test suites (tests/helpers.c, built into libdptest.a,
 * which test_dp and the standalone tests link; test_cuda_emul does not).
 *
 * Each one that builds something fails the running test, with libdp's message,
 * when libdp refuses. */
#ifndef DP_TEST_HELPERS_H
#define DP_TEST_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dp.h"

/* dp_config_default with `batch`, `n_devices` and `opt` (dp_config_set_optimizer's
 * hyper-parameters); everything else, seed 0 included, as the default.
 * config_of(b, n, DP_OPT_SGD) is the plain default of that batch and device count. */
dp_config config_of(int batch, int n_devices, dp_optimizer opt);

/* `spec` parsed, named "test". */
dp_model *model_of_at(const char *spec, const char *file, int line);
/* The plan of `m` under `cfg`. */
dp_plan *plan_of_at(const dp_model *m, const dp_config *cfg, const char *file, int line);
/* A context of `p` (library arenas). */
dp_ctx *ctx_of_at(const dp_plan *p, const char *file, int line);

/* A model, its plan and a context; np: the model's parameter count. */
typedef struct {
  dp_model *m;
  dp_plan *p;
  dp_ctx *c;
  size_t np;
} rig;

/* model_of, plan_of and ctx_of in one. */
void rig_open_at(rig *r, const char *spec, const dp_config *cfg, const char *file,
                 int line);
/* rig_open, except that DP_ERR_UNSUPPORTED from the planner (a mode this build
 * lacks) returns false with *r zeroed. */
bool rig_try_at(rig *r, const char *spec, const dp_config *cfg, const char *file, int line);
/* Frees what rig_open made and zeroes *r. */
void rig_close(rig *r);

/* The calls: a failure message names the caller's file and line. */
#define model_of(spec) model_of_at((spec), __FILE__, __LINE__)
#define plan_of(m, cfg) plan_of_at((m), (cfg), __FILE__, __LINE__)
#define ctx_of(p) ctx_of_at((p), __FILE__, __LINE__)
#define rig_open(r, spec, cfg) rig_open_at((r), (spec), (cfg), __FILE__, __LINE__)
#define rig_try(r, spec, cfg) rig_try_at((r), (spec), (cfg), __FILE__, __LINE__)

/* 1 when this build has the cuda backend (registered by tests/check_main.c);
 * else 0 after printing "SKIP <suite>: <test>: ..." (a CPU-only build, such as
 * the sanitizer build, plans nothing for cuda). */
bool cuda_or_skip(const char *suite, const char *test);

/* xorshift64*: the tests' own seeded generator; *s must not be 0. */
uint64_t rng_next(uint64_t *s);

#endif
