/* Helpers shared by the test suites: see helpers.h. */
#include "helpers.h"

#include <check.h>
#include <stdio.h>
#include <string.h>

dp_config config_of(int batch, int n_devices, dp_optimizer opt) {
  dp_config c;
  dp_config_default(&c);
  c.batch = batch;
  c.n_devices = n_devices;
  dp_config_set_optimizer(&c, opt);
  return c;
}

dp_model *model_of_at(const char *spec, const char *file, int line) {
  dp_model *m = NULL;
  dp_status s = dp_model_parse(spec, "test", &m);
  ck_assert_msg(s == DP_OK && m, "%s:%d: parse: %s: %s\nspec:\n%s", file, line,
                dp_status_name(s), dp_last_error(), spec ? spec : "(null)");
  return m;
}

dp_plan *plan_of_at(const dp_model *m, const dp_config *cfg, const char *file, int line) {
  dp_plan *p = NULL;
  dp_status s = dp_plan_create(m, cfg, &p);
  ck_assert_msg(s == DP_OK && p, "%s:%d: plan: %s: %s", file, line, dp_status_name(s),
                dp_last_error());
  return p;
}

dp_ctx *ctx_of_at(const dp_plan *p, const char *file, int line) {
  dp_ctx *c = NULL;
  dp_status s = dp_ctx_create(p, &c);
  ck_assert_msg(s == DP_OK && c, "%s:%d: ctx: %s: %s", file, line, dp_status_name(s),
                dp_last_error());
  return c;
}

bool rig_try_at(rig *r, const char *spec, const dp_config *cfg, const char *file,
                int line) {
  memset(r, 0, sizeof *r);
  r->m = model_of_at(spec, file, line);
  dp_status s = dp_plan_create(r->m, cfg, &r->p);
  if (s == DP_ERR_UNSUPPORTED) {
    dp_model_free(r->m);
    memset(r, 0, sizeof *r);
    return false;
  }
  ck_assert_msg(s == DP_OK && r->p, "%s:%d: plan: %s: %s", file, line, dp_status_name(s),
                dp_last_error());
  r->c = ctx_of_at(r->p, file, line);
  r->np = dp_model_n_params(r->m);
  return true;
}

void rig_open_at(rig *r, const char *spec, const dp_config *cfg, const char *file,
                 int line) {
  memset(r, 0, sizeof *r);
  r->m = model_of_at(spec, file, line);
  r->p = plan_of_at(r->m, cfg, file, line);
  r->c = ctx_of_at(r->p, file, line);
  r->np = dp_model_n_params(r->m);
}

void rig_close(rig *r) {
  dp_ctx_free(r->c);
  dp_plan_free(r->p);
  dp_model_free(r->m);
  memset(r, 0, sizeof *r);
}

uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1Dull;
}

bool cuda_or_skip(const char *suite, const char *test) {
  if (dp_cuda_available()) return true;
  fprintf(stderr, "SKIP %s: %s: the cuda backend is not in this build\n", suite, test);
  return false;
}
