/* The context: the arenas a plan describes, the executor, and the public
 * step/forward/parameter calls. All allocation happens in dp_ctx_create*;
 * the calls after it allocate nothing. */
#include "ctx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Records the thread's last error in the context too. */
dp_status dp__ctx_fail(dp_ctx *c, dp_status s) {
  if (s && c) snprintf(c->error, sizeof c->error, "%s", dp_last_error());
  return s;
}

const char *dp_ctx_error(const dp_ctx *c) { return c ? c->error : "no context"; }

static void init_params(dp_ctx *c) {
  const dp_plan *p = c->plan;
  float *w = (float *)(c->arena[0] + p->regions[0][DP_REGION_PARAMS].offset);
  for (int i = 0; i < p->model.n_layers; i++) {
    const dp_layer *l = &p->model.layers[i];
    float *lw = w + l->param_off;
    if (l->kind == DP_LAYER_LINEAR) {
      /* PyTorch's Linear init: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)). */
      float bound = 1.0f / sqrtf((float)l->in);
      for (size_t k = 0; k < l->n_params; k++)
        lw[k] = (2.0f * dp__rng_uniform(p->cfg.seed, DP_RNG_INIT, (uint64_t)i, k, 0) - 1.0f) *
                bound;
    } else if (l->kind == DP_LAYER_LAYERNORM) {
      for (int k = 0; k < l->out; k++) {
        lw[k] = 1.0f;
        lw[l->out + k] = 0.0f;
      }
    }
  }
}

static dp_status ctx_init(dp_ctx *c) {
  const dp_plan *p = c->plan;
  int n = p->split.n_used;
  for (int d = 0; d < n; d++) {
    uint32_t *w = (uint32_t *)c->arena[d];
    for (size_t k = 0; k < p->dev_bytes[d] / 4; k++) w[k] = DP_CANARY;
  }
  /* State that must start at zero. */
  static const dp_region zeroed[] = {DP_REGION_GRADS, DP_REGION_OPT_STATE};
  for (int d = 0; d < n; d++)
    for (int i = 0; i < 2; i++)
      memset(c->arena[d] + p->regions[d][zeroed[i]].offset, 0, p->regions[d][zeroed[i]].size);
  init_params(c);
  c->replicas_stale = true;
  int max_mbs = dp__split_max_mbs(&p->cfg);
  for (int i = 0; i < 2; i++) {
    dp_sched_cache *sc = i ? &c->infer : &c->train;
    sc->mbs = malloc((size_t)max_mbs * sizeof *sc->mbs);
    sc->ops = malloc((size_t)p->ops_cap * sizeof *sc->ops);
  }
  if (!c->train.mbs || !c->train.ops || !c->infer.mbs || !c->infer.ops)
    return DP_FAIL(DP_ERR_NOMEM, "context: out of memory for the schedule");
  dp_status s = dp__exec_init(&c->exec, n, &dp__cpu_backend, NULL, &dp__shm_transport, NULL);
  if (s) return s;
  c->exec_live = true;
  return DP_OK;
}

static dp_status ctx_new(const dp_plan *p, dp_ctx **out) {
  if (!out) return DP_FAIL(DP_ERR_INVALID, "dp_ctx_create: out is NULL");
  *out = NULL;
  if (!p) return DP_FAIL(DP_ERR_INVALID, "dp_ctx_create: plan is NULL");
  if (p->cfg.backend == DP_BACKEND_CUDA)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "the CUDA step is not implemented yet; plan with the cpu backend");
  dp_ctx *c = calloc(1, sizeof *c);
  if (!c) return DP_FAIL(DP_ERR_NOMEM, "context: out of memory");
  c->plan = p;
  c->inject_at = -1;
  *out = c;
  return DP_OK;
}

dp_status dp_ctx_create(const dp_plan *p, dp_ctx **out) {
  dp_status s = ctx_new(p, out);
  if (s) return s;
  dp_ctx *c = *out;
  c->owns_arenas = true;
  for (int d = 0; d < p->split.n_used && !s; d++) {
    c->arena[d] = aligned_alloc(p->align, p->dev_bytes[d] ? p->dev_bytes[d] : p->align);
    if (!c->arena[d])
      s = DP_FAIL(DP_ERR_NOMEM, "device %d: cannot allocate its %zu-byte arena", d,
                  p->dev_bytes[d]);
  }
  if (!s) s = ctx_init(c);
  if (s) {
    dp_ctx_free(c);
    *out = NULL;
  }
  return s;
}

dp_status dp_ctx_create_static(const dp_plan *p, void *const arenas[], void *host,
                               dp_ctx **out) {
  (void)host; /* the CPU backend stages nothing: it reads the caller's memory */
  if (out) *out = NULL;
  if (!arenas) return DP_FAIL(DP_ERR_INVALID, "dp_ctx_create_static: arenas is NULL");
  for (int d = 0; p && d < p->split.n_used; d++)
    if (!arenas[d] || (uintptr_t)arenas[d] % p->align)
      return DP_FAIL(DP_ERR_INVALID, "arena of device %d is %s", d,
                     arenas[d] ? "not aligned to the plan's alignment" : "NULL");
  dp_status s = ctx_new(p, out);
  if (s) return s;
  dp_ctx *c = *out;
  for (int d = 0; d < p->split.n_used; d++) c->arena[d] = arenas[d];
  if ((s = ctx_init(c))) {
    dp_ctx_free(c);
    *out = NULL;
  }
  return s;
}

void dp_ctx_free(dp_ctx *c) {
  if (!c) return;
  if (c->exec_live) dp__exec_destroy(&c->exec);
  if (c->owns_arenas)
    for (int d = 0; d < DP_MAX_DEVICES; d++) free(c->arena[d]);
  free(c->train.mbs);
  free(c->train.ops);
  free(c->infer.mbs);
  free(c->infer.ops);
  free(c);
}

/* The schedule for `rows`, rebuilt (without allocating) when rows change. */
static dp_status schedule_for(dp_ctx *c, dp_sched_cache *sc, int rows, bool training) {
  if (sc->rows == rows) return DP_OK;
  const dp_plan *p = c->plan;
  for (int k = 0; k < p->split.n_mb; k++) {
    int r = rows - p->mbs[k].row0;
    sc->mbs[k] = (dp_mb){p->mbs[k].row0, r <= 0 ? 0 : r < p->mbs[k].rows ? r : p->mbs[k].rows};
  }
  sc->rows = 0;
  dp_status s = dp__schedule_build(p, sc->mbs, training, sc->ops, p->ops_cap, &sc->n_ops,
                                   &sc->n_stages);
  if (s) return s;
  /* The commit phase starts at the first optimizer op, moved back to the
   * start of its stage if it is not one (it is: the gradient check has a stage
   * of its own). */
  int k = 0;
  while (k < sc->n_ops && sc->ops[k].kind != DP_OP_OPTIMIZER) k++;
  while (k > 0 && k < sc->n_ops && sc->ops[k - 1].stage == sc->ops[k].stage) k--;
  sc->commit = k;
  sc->rows = rows;
  return DP_OK;
}

dp_status dp__ctx_schedule(dp_ctx *c, int rows, bool training, const dp_op **ops, int *n_ops,
                           int *commit) {
  if (!c || rows < 1 || rows > c->plan->cfg.batch || (training && c->plan->cfg.inference))
    return DP_FAIL(DP_ERR_INVALID, "dp__ctx_schedule: bad arguments");
  dp_sched_cache *sc = training ? &c->train : &c->infer;
  dp_status s = schedule_for(c, sc, rows, training);
  if (s) return s;
  *ops = sc->ops;
  *n_ops = sc->n_ops;
  *commit = sc->commit;
  return DP_OK;
}

void dp__ctx_inject_fault(dp_ctx *c, int k) {
  if (c) c->inject_at = k < 0 ? -1 : k;
}

/* ---- guards -------------------------------------------------------------------
 * With config.guards the planner leaves a guard before the first region and
 * after every region (plan.c); ctx_init fills the whole arena, guards
 * included, with DP_CANARY. Nothing may write a guard, so a guard word that
 * no longer holds the canary was hit by a write that ran out of a region. */

/* Marks the context unusable (see ctx.h); returns s. */
static dp_status poison(dp_ctx *c, dp_status s) {
  if (!c->poison) {
    c->poison = s;
    snprintf(c->poison_msg, sizeof c->poison_msg, "%s", dp_last_error());
  }
  return s;
}

static dp_status poisoned(dp_ctx *c) {
  return dp__ctx_fail(c, DP_FAIL(c->poison,
                                 "this context is unusable since an earlier failure left its "
                                 "state untrustworthy (free it and restore from a "
                                 "checkpoint): %s",
                                 c->poison_msg));
}

static dp_status check_guards(dp_ctx *c) {
  const dp_plan *p = c->plan;
  if (!p->cfg.guards) return DP_OK;
  int bad_guards = 0, bad_dev = -1, bad_region = 0;
  size_t bad_lo = 0, bad_hi = 0, bad_first = 0, bad_words = 0;
  bool bad_head = false, bad_tail = false;
  for (int d = 0; d < p->split.n_used; d++) {
    const uint32_t *w = (const uint32_t *)c->arena[d];
    /* guard g follows region g; g = -1 is the one before the first region */
    for (int g = -1; g < DP_REGION_COUNT; g++) {
      size_t lo = g < 0 ? 0 : p->regions[d][g].offset + p->regions[d][g].size;
      size_t hi = g + 1 < DP_REGION_COUNT ? p->regions[d][g + 1].offset : p->dev_bytes[d];
      size_t k0 = (lo + 3) / 4, k1 = hi / 4, n = 0, first = 0;
      for (size_t k = k0; k < k1; k++)
        if (w[k] != DP_CANARY && n++ == 0) first = k;
      if (!n) continue;
      if (bad_guards++ == 0) {
        bad_dev = d;
        bad_region = g;
        bad_lo = k0 * 4;
        bad_hi = k1 * 4;
        bad_first = first * 4;
        bad_words = n;
        bad_head = w[k0] != DP_CANARY;
        bad_tail = w[k1 - 1] != DP_CANARY;
      }
    }
  }
  if (!bad_guards) return DP_OK;
  /* A write that ran past a region's end hits the head of the guard after
   * it; one that ran before a region's start, the tail of the guard before. */
  char what[96];
  if (bad_region < 0 || (bad_tail && !bad_head && bad_region + 1 < DP_REGION_COUNT))
    snprintf(what, sizeof what, "before the start of region '%s'",
             dp_region_name((dp_region)(bad_region + 1)));
  else
    snprintf(what, sizeof what, "past the end of region '%s'",
             dp_region_name((dp_region)bad_region));
  char more[48] = "";
  if (bad_guards > 1) snprintf(more, sizeof more, "; %d more guards damaged", bad_guards - 1);
  return poison(c, DP_FAIL(DP_ERR_CORRUPT,
                           "device %d: a write ran %s (guard at offset %zu damaged: %zu of its "
                           "%zu words, the first at offset %zu)%s",
                           bad_dev, what, bad_lo, bad_words, (bad_hi - bad_lo) / 4, bad_first,
                           more));
}

dp_status dp_ctx_check_guards(dp_ctx *c) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (!c->plan->cfg.guards)
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_UNSUPPORTED, "this plan has no arena guards (set "
                                                       "config.guards)"));
  return dp__ctx_fail(c, check_guards(c));
}

static dp_status check_batch(dp_ctx *c, int rows, int cols, const float *x) {
  const dp_plan *p = c->plan;
  if (!x) return DP_FAIL(DP_ERR_INVALID, "inputs are NULL");
  if (cols != p->model.input_width)
    return DP_FAIL(DP_ERR_SHAPE, "inputs have %d columns; the model takes %d", cols,
                   p->model.input_width);
  if (rows < 1 || rows > p->cfg.batch)
    return DP_FAIL(DP_ERR_SHAPE, "a batch of %d rows is outside the planned 1..%d", rows,
                   p->cfg.batch);
  return DP_OK;
}

static void env_init(dp_ctx *c, dp_exec_env *e, const dp_sched_cache *sc, int rows, bool training) {
  *e = (dp_exec_env){.plan = c->plan, .mbs = sc->mbs, .rows = rows, .training = training,
                     .step = c->step, .skip_broadcast = !c->replicas_stale};
  for (int d = 0; d < c->plan->split.n_used; d++) e->arena[d] = c->arena[d];
}

dp_status dp_train_step(dp_ctx *c, int rows, int cols, const float *x, const void *target,
                        float *loss) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (c->poison) return poisoned(c);
  const dp_plan *p = c->plan;
  dp_status s = check_batch(c, rows, cols, x);
  if (!s && p->cfg.inference)
    s = DP_FAIL(DP_ERR_INVALID, "this context was planned for inference; use dp_forward");
  if (!s && !target) s = DP_FAIL(DP_ERR_INVALID, "targets are NULL");
  if (!s && p->model.loss == DP_LOSS_SOFTMAX_CE) {
    const int32_t *t = target;
    int classes = dp_model_output_width(&p->model);
    for (int r = 0; r < rows && !s; r++)
      if (t[r] < 0 || t[r] >= classes)
        s = DP_FAIL(DP_ERR_RANGE, "label %d of row %d is outside 0..%d", t[r], r, classes - 1);
  }
  if (!s) s = schedule_for(c, &c->train, rows, true);
  if (s) return dp__ctx_fail(c, s);
  dp_exec_env e;
  env_init(c, &e, &c->train, rows, true);
  e.host_x = x;
  e.host_t = target;
  /* Classic mode broadcasts every step (the optimizer ran on device 0 only);
   * allreduce keeps every replica current and broadcasts only when they are
   * stale (parameters set from outside, a load, a failed step). */
  bool classic = p->cfg.mode == DP_MODE_CLASSIC;
  e.skip_broadcast = !classic && !c->replicas_stale;
  /* The fault guarantee (docs/RELIABILITY.md, "Fault injection and arena
   * guards"). State a failed step must leave alone: device 0's parameters,
   * every device's optimizer state, the step counter. Replicas' parameters
   * are copies of device 0's, refreshed by the broadcast that opens every
   * training step and by a forward after replicas_stale is set; everything
   * else in the arenas is rewritten before it is read in every step. The
   * schedule writes that state only in its commit phase (the optimizer stage
   * and, with a sharded optimizer, the parameter all-gather after it), so
   * the step runs in two parts: everything that can fail (transfers, layers,
   * the loss and gradient checks), then, only when all of it succeeded and
   * every guard holds, the commit phase, whose ops cannot fail on the cpu
   * backend (arithmetic and memcpy over planned memory). If one fails anyway
   * (a backend that can), the state is partly updated and cannot be
   * restored: the context is poisoned instead of going on with it. */
  const dp_sched_cache *sc = &c->train;
  int inject = c->inject_at;
  c->inject_at = -1;
  s = dp__exec_run(&c->exec, &e, sc->ops, sc->n_ops, 0, sc->commit, inject);
  dp_status g = check_guards(c);
  if (g) return dp__ctx_fail(c, g);
  if (s) {
    c->replicas_stale = true;
    if (s == DP_ERR_NONFINITE && p->cfg.on_nonfinite == DP_NONFINITE_SKIP) {
      c->skipped++;
      snprintf(c->error, sizeof c->error, "step %llu skipped: %s", (unsigned long long)c->step,
               dp_last_error());
      if (loss) *loss = NAN;
      return DP_OK;
    }
    return dp__ctx_fail(c, s);
  }
  s = dp__exec_run(&c->exec, &e, sc->ops, sc->n_ops, sc->commit, sc->n_ops, inject);
  if (s) {
    c->replicas_stale = true;
    return dp__ctx_fail(c, poison(c, DP_FAIL(s, "the step's update failed part way, leaving "
                                                "parameters and optimizer state partly "
                                                "updated: %s",
                                             dp_last_error())));
  }
  c->step++;
  c->replicas_stale = classic;
  /* A guard hit in the commit phase: the update is applied (and counted),
   * but the context is poisoned all the same. */
  g = check_guards(c);
  if (g) return dp__ctx_fail(c, g);
  if (loss) *loss = e.loss;
  return DP_OK;
}

dp_status dp_forward(dp_ctx *c, int rows, int cols, const float *x, float *y) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (c->poison) return poisoned(c);
  dp_status s = check_batch(c, rows, cols, x);
  if (!s && !y) s = DP_FAIL(DP_ERR_INVALID, "outputs are NULL");
  if (!s) s = schedule_for(c, &c->infer, rows, false);
  if (s) return dp__ctx_fail(c, s);
  dp_exec_env e;
  env_init(c, &e, &c->infer, rows, false);
  e.host_x = x;
  e.host_y = y;
  int inject = c->inject_at;
  c->inject_at = -1;
  s = dp__exec_run(&c->exec, &e, c->infer.ops, c->infer.n_ops, 0, c->infer.n_ops, inject);
  dp_status g = check_guards(c);
  if (g) return dp__ctx_fail(c, g);
  if (s) {
    c->replicas_stale = true;
    return dp__ctx_fail(c, s);
  }
  /* Only the devices that got rows were refreshed: a smaller batch leaves the
   * last devices as they were. */
  if (rows > c->plan->split.dev_row0[c->plan->split.n_used - 1]) c->replicas_stale = false;
  return DP_OK;
}

static float *dev0(dp_ctx *c, dp_region r) {
  return (float *)(c->arena[0] + c->plan->regions[0][r].offset);
}

static dp_status check_n(dp_ctx *c, const void *buf, size_t n) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (!buf) return dp__ctx_fail(c, DP_FAIL(DP_ERR_INVALID, "buffer is NULL"));
  if (n != c->plan->model.n_params)
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_SHAPE, "buffer holds %zu floats; the model has %zu "
                                             "parameters",
                               n, c->plan->model.n_params));
  return DP_OK;
}

dp_status dp_get_params(dp_ctx *c, float *out, size_t n) {
  dp_status s = check_n(c, out, n);
  if (!s) memcpy(out, dev0(c, DP_REGION_PARAMS), n * 4);
  return s;
}

dp_status dp_set_params(dp_ctx *c, const float *in, size_t n) {
  dp_status s = check_n(c, in, n);
  if (s) return s;
  for (size_t k = 0; k < n; k++)
    if (!isfinite(in[k]))
      return dp__ctx_fail(c, DP_FAIL(DP_ERR_NONFINITE, "parameter %zu is not finite", k));
  memcpy(dev0(c, DP_REGION_PARAMS), in, n * 4);
  c->replicas_stale = true;
  return DP_OK;
}

dp_status dp_get_grads(dp_ctx *c, float *out, size_t n) {
  dp_status s = check_n(c, out, n);
  if (s) return s;
  if (c->plan->cfg.inference)
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_INVALID, "an inference context has no gradients"));
  memcpy(out, dev0(c, DP_REGION_GRADS), n * 4);
  return DP_OK;
}

uint64_t dp_ctx_step(const dp_ctx *c) { return c ? c->step : 0; }
uint64_t dp_ctx_skipped_steps(const dp_ctx *c) { return c ? c->skipped : 0; }

size_t dp_ctx_high_water(const dp_ctx *c, int dev) {
  if (!c || dev < 0 || dev >= c->plan->split.n_used) return 0;
  const uint32_t *w = (const uint32_t *)c->arena[dev];
  size_t k = c->plan->dev_bytes[dev] / 4;
  while (k > 0 && w[k - 1] == DP_CANARY) k--;
  return k * 4;
}

uint64_t dp_params_hash(dp_ctx *c) {
  if (!c) return 0;
  return dp__fnv1a(DP_FNV_INIT, dev0(c, DP_REGION_PARAMS), c->plan->model.n_params * 4);
}
