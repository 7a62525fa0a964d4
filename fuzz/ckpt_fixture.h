/* The fixed small contexts that fuzz_checkpoint loads into, shared with
 * gen_ckpt_seeds (which writes real checkpoints of them as the seed corpus)
 * and tests/test_hostile.c's checkpoint cases. One model, four contexts that
 * cover every optimizer-state layout the loader writes:
 *   0  adamw, allreduce, 4 devices, sharded optimizer state (k = 2, shards),
 *      arena guards on
 *   1  momentum, classic, 2 devices                         (k = 1, device 0)
 *   2  sgd, allreduce, 3 devices                            (k = 0)
 *   3  inference, 1 device                                  (parameters only)
 * All use seed 7. FIXTURE_OTHER_MODEL is a different model, for "checkpoint
 * of another model" inputs. */
#ifndef DP_CKPT_FIXTURE_H
#define DP_CKPT_FIXTURE_H

#include "dp.h"

#include <stdint.h>

#define FIXTURE_MODEL "input 3\nlinear 4\nlayernorm\ngelu\nlinear 2\nloss mse\n"
#define FIXTURE_OTHER_MODEL "input 3\nlinear 5\nrelu\nlinear 2\nloss mse\n"
#define FIXTURE_N 4
#define FIXTURE_BATCH 8

typedef struct {
  dp_model *model;
  dp_plan *plan;
  dp_ctx *ctx;
} fixture;

static inline void fixture_config(int which, dp_config *c) {
  dp_config_default(c);
  c->batch = FIXTURE_BATCH;
  c->seed = 7;
  switch (which) {
  case 0:
    c->guards = 1; /* the loader must write inside the regions, guards or not */
    dp_config_set_optimizer(c, DP_OPT_ADAMW);
    c->mode = DP_MODE_ALLREDUCE;
    c->n_devices = 4;
    c->shard_optimizer = 1;
    break;
  case 1:
    dp_config_set_optimizer(c, DP_OPT_MOMENTUM);
    c->n_devices = 2;
    break;
  case 2:
    c->mode = DP_MODE_ALLREDUCE;
    c->n_devices = 3;
    break;
  default:
    c->inference = 1;
    break;
  }
}

/* Builds fixture `which` from `spec` (FIXTURE_MODEL or FIXTURE_OTHER_MODEL). */
static inline dp_status fixture_make(int which, const char *spec, fixture *f) {
  f->model = NULL;
  f->plan = NULL;
  f->ctx = NULL;
  dp_config c;
  fixture_config(which, &c);
  dp_status s = dp_model_parse(spec, "fixture.dpm", &f->model);
  if (!s) s = dp_plan_create(f->model, &c, &f->plan);
  if (!s) s = dp_ctx_create(f->plan, &f->ctx);
  return s;
}

static inline void fixture_free(fixture *f) {
  dp_ctx_free(f->ctx);
  dp_plan_free(f->plan);
  dp_model_free(f->model);
  f->ctx = NULL;
  f->plan = NULL;
  f->model = NULL;
}

/* `steps` training steps on fixed data (a no-op for the inference context). */
static inline dp_status fixture_train(fixture *f, int steps) {
  if (dp_plan_config(f->plan)->inference) return DP_OK;
  float x[FIXTURE_BATCH * 3], t[FIXTURE_BATCH * 2];
  for (int i = 0; i < FIXTURE_BATCH * 3; i++) x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
  for (int i = 0; i < FIXTURE_BATCH * 2; i++) t[i] = (float)((i * 5) % 3) - 1.0f;
  for (int k = 0; k < steps; k++) {
    dp_status s = dp_train_step(f->ctx, FIXTURE_BATCH, 3, x, t, NULL);
    if (s) return s;
  }
  return DP_OK;
}

#endif
