/* The context: the arenas a plan describes, the executor, and the public
 * step/forward/parameter calls. All allocation happens in dp_ctx_create*;
 * the calls after it allocate nothing.
 *
 * Everything it asks of a device goes through the plan's backend
 * (dp_backend_ops, docs/ARCHITECTURE.md), whose capabilities decide the path:
 * arenas are reached only through the backend's read/write; a backend with
 * host_staging gets the caller's inputs and targets through the staging
 * arena; a synchronous backend (no step_end) is checked on the host between
 * a step's pre-commit and commit parts, an asynchronous one refuses a bad
 * step on the device and reports it at step_end, its one synchronisation. */
#include "core/ctx.h"
#include "core/operands.h" /* dp__plan_verify */

#include <float.h>
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

static unsigned char *region_ptr(const dp_ctx *c, int d, dp_region r, size_t off) {
  return c->arena[d] + c->plan->regions[d][r].offset + off;
}

static dp_status check_span(const dp_ctx *c, int d, dp_region r, size_t off, size_t bytes) {
  size_t size = c->plan->regions[d][r].size;
  if (off > size || bytes > size - off)
    return DP_FAIL(DP_ERR_INVALID, "device %d %s: %zu bytes at offset %zu run past its %zu",
                   d, dp_region_name(r), bytes, off, size);
  return DP_OK;
}

static bool is_local(const dp_ctx *c, int d) { return d >= c->dev0 && d < c->dev1; }

dp_status dp__ctx_read(const dp_ctx *c, int d, dp_region r, size_t off, void *dst,
                       size_t bytes) {
  dp_status s = check_span(c, d, r, off, bytes);
  if (s || !bytes) return s;
  if (!c->world)
    return c->be->read(c->bctx, c->plan, d, dst, region_ptr(c, d, r, off), bytes);
  /* Across processes a read is collective: the rank that holds d reads, and
   * every rank gets the bytes. */
  int owner = dp__rank_of(&c->plan->cfg, d);
  if (owner == c->rank &&
      (s = c->be->read(c->bctx, c->plan, d, dst, region_ptr(c, d, r, off), bytes)))
    return s;
  return c->world->ops->bcast(c->world->w, owner, dst, bytes);
}

dp_status dp__ctx_write(dp_ctx *c, int d, dp_region r, size_t off, const void *src,
                        size_t bytes) {
  dp_status s = check_span(c, d, r, off, bytes);
  if (s || !bytes || !is_local(c, d)) return s; /* another rank writes its own devices */
  return c->be->write(c->bctx, c->plan, d, region_ptr(c, d, r, off), src, bytes);
}

/* ---- agreement across processes -------------------------------------------------
 * Collective: every rank's outcome s (at schedule index `order`; -1: before
 * any op) and batch rows combined; every rank returns the same status, with
 * the message of the rank where it happened. *value: rank 0's in, out (the
 * step's loss). A world that fails (a rank lost) poisons the context: the
 * ranks may no longer hold the same state. */
static dp_status agree(dp_ctx *c, dp_status s, int order, int rows, uint32_t value[2]) {
  dp_agreement a = {.status = s,
                    .rank = c->rank,
                    .order = order,
                    .rows_min = rows,
                    .rows_max = rows,
                    .value = value ? value[0] : 0,
                    .value2 = value ? value[1] : 0};
  if (s) snprintf(a.msg, sizeof a.msg, "%s", dp_last_error());
  dp_status ws = c->world->ops->agree(c->world->w, &a);
  if (ws) return dp__ctx_poison(c, ws);
  if (value) {
    value[0] = a.value;
    value[1] = a.value2;
  }
  if (a.rows_min != a.rows_max)
    return DP_FAIL(DP_ERR_INVALID,
                   "the ranks disagree on the batch (%d to %d rows): every rank passes the "
                   "whole batch's row count, and its own rows of it",
                   a.rows_min, a.rows_max);
  if (!a.status) return DP_OK;
  if (a.rank == c->rank && (int32_t)s == a.status) {
    dp__error_restore(a.msg); /* this rank's own failure, as it was */
    return s;
  }
  return DP_FAIL(a.status, "rank %d: %s", a.rank, a.msg);
}

/* n_words 32-bit words at byte offset off of device d's arena (guards and
 * the high-water scan, which cross regions), copied into c->bounce
 * (n_words <= DP_CTX_BOUNCE_WORDS). */
static const uint32_t *arena_words(const dp_ctx *c, int d, size_t off, size_t n_words,
                                   dp_status *s) {
  *s = c->be->read(c->bctx, c->plan, d, c->bounce, c->arena[d] + off, n_words * 4);
  return c->bounce;
}

/* PyTorch's initialisation of every layer's parameters into w (host). */
static void init_params(const dp_plan *p, float *w) {
  for (int i = 0; i < p->model.n_layers; i++) {
    const dp_layer *l = &p->model.layers[i];
    float *lw = w + l->param_off;
    if (l->kind == DP_LAYER_LINEAR || l->kind == DP_LAYER_CONV2D) {
      /* PyTorch's Linear and Conv2d init: weight and bias ~ U(-1/sqrt(fan_in),
       * 1/sqrt(fan_in)), fan_in = in (linear), in_channels * k * k (conv2d). */
      float bound = 1.0f / sqrtf((float)dp__layer_fan_in(l));
      for (size_t k = 0; k < l->n_params; k++)
        lw[k] =
            (2.0f * dp__rng_uniform(p->cfg.seed, DP_RNG_INIT, (uint64_t)i, k, 0) - 1.0f) *
            bound;
    } else if (l->kind == DP_LAYER_LAYERNORM) {
      size_t n = l->n_params / 2; /* the features (per position on a sequence) */
      for (size_t k = 0; k < n; k++) {
        lw[k] = 1.0f;
        lw[n + k] = 0.0f;
      }
    } else if (l->kind == DP_LAYER_EMBEDDING) {
      /* nn.Embedding's init, N(0, 1), for both tables (Box-Muller) */
      for (size_t k = 0; k < l->n_params; k++) {
        double u1 = dp__rng_uniform(p->cfg.seed, DP_RNG_INIT, (uint64_t)i, k, 0);
        double u2 = dp__rng_uniform(p->cfg.seed, DP_RNG_INIT, (uint64_t)i, k, 1);
        lw[k] = (float)(sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
      }
    } else if (l->kind == DP_LAYER_BATCHNORM) { /* weight 1, bias 0; running mean 0,
                                                   running variance 1, count 0 */
      float *buf = w + p->model.n_params + l->buf_off;
      for (int k = 0; k < l->c; k++) {
        lw[k] = 1.0f;
        lw[l->c + k] = 0.0f;
        buf[k] = 0.0f;
        buf[l->c + k] = 1.0f;
      }
      memset(&buf[2 * l->c], 0, 4);
    }
  }
}

/* Canaries everywhere, zeroed gradients and optimizer state, initial
 * parameters on device 0 (the first step's broadcast copies them). */
static dp_status fill_arenas(dp_ctx *c) {
  const dp_plan *p = c->plan;
  static const dp_region zeroed[] = {DP_REGION_GRADS, DP_REGION_OPT_STATE};
  dp_status s = DP_OK;
  for (int d = c->dev0; d < c->dev1 && !s; d++) {
    s = c->be->fill_u32(p, d, c->arena[d], DP_CANARY, p->dev_bytes[d] / 4);
    for (int i = 0; i < 2 && !s; i++)
      s = c->be->fill_u32(p, d, region_ptr(c, d, zeroed[i], 0), 0,
                          p->regions[d][zeroed[i]].size / 4);
  }
  if (s) return s;
  size_t np = dp__param_floats(&p->model); /* the buffers after the parameters */
  float *w = malloc(np ? np * 4 : 4);
  if (!w)
    return DP_FAIL(DP_ERR_NOMEM, "context: out of memory for %zu initial parameters", np);
  init_params(p, w);
  s = dp__ctx_write(c, 0, DP_REGION_PARAMS, 0, w, np * 4);
  free(w);
  return s;
}

static dp_status ctx_init(dp_ctx *c) {
  const dp_plan *p = c->plan;
  dp_status s = fill_arenas(c);
  if (s) return s;
  c->replicas_stale = true;
  int max_mbs = dp__split_max_mbs(&p->cfg);
  dp_sched_cache *caches[3] = {&c->train, &c->infer, &c->accum};
  for (int i = 0; i < (dp__accumulate(&p->cfg) > 1 ? 3 : 2); i++) {
    caches[i]->mbs = malloc((size_t)max_mbs * sizeof *caches[i]->mbs);
    caches[i]->ops = malloc((size_t)p->ops_cap * sizeof *caches[i]->ops);
    caches[i]->sync = malloc((size_t)p->ops_cap); /* no more stages than ops */
    if (!caches[i]->mbs || !caches[i]->ops || !caches[i]->sync)
      return DP_FAIL(DP_ERR_NOMEM, "context: out of memory for the schedule");
  }
  if (c->world && c->be->ctx_init_world) { /* the backend spans the processes itself */
    dp_backend_world bw = {.rank = c->rank,
                           .ranks = dp__ranks(&p->cfg),
                           .dev0 = c->dev0,
                           .dev1 = c->dev1,
                           .timeout_ms = p->cfg.timeout_ms ? p->cfg.timeout_ms : 60000,
                           .bcast = c->world->ops->bcast,
                           .w = c->world->w};
    if ((s = c->be->ctx_init_world(p, (void *const *)c->arena, &bw, &c->bctx))) return s;
  } else if (c->be->ctx_init &&
             (s = c->be->ctx_init(p, (void *const *)c->arena, &c->bctx))) {
    return s;
  }
  const dp_transport_ops *t = c->be->transport;
  void *tctx = c->bctx;
  if (c->world) { /* the world's transport, around the backend's */
    c->world->inner_ctx = c->bctx;
    t = c->world->transport;
    tctx = c->world;
  }
  s = dp__exec_init(&c->exec, c->dev0, c->dev1 - c->dev0, c->be, c->bctx, t, tctx);
  if (s) return s;
  /* classic mode's loss op holds the whole batch's micro-batches, gathered in
   * one region (dp__loss_operands): any of them may be computed alone */
  c->exec.share_loss = c->plan->cfg.mode == DP_MODE_CLASSIC;
  c->exec_live = true;
  return DP_OK;
}

static dp_status ctx_new(const dp_plan *p, dp_ctx **out) {
  if (!out) return DP_FAIL(DP_ERR_INVALID, "dp_ctx_create: out is NULL");
  *out = NULL;
  if (!p) return DP_FAIL(DP_ERR_INVALID, "dp_ctx_create: plan is NULL");
  /* the plan read back through the operand view before any arena exists */
  dp_status v = dp__plan_verify(p);
  if (v) return v;
  dp_ctx *c = calloc(1, sizeof *c);
  if (!c) return DP_FAIL(DP_ERR_NOMEM, "context: out of memory");
  c->plan = p;
  c->dev1 = p->split.n_used;
  c->lr = p->cfg.lr;
  c->momentum = dp__config_momentum(&p->cfg);
  c->grad_norm = p->cfg.clip_grad_norm > 0 ? NAN : 0.0f;
  c->be = dp__backend_ops(p->cfg.backend); /* registered: the plan was made with it */
  c->inject_at = -1;
  if (!(c->bounce = malloc(DP_CTX_BOUNCE_WORDS * 4))) {
    free(c);
    return DP_FAIL(DP_ERR_NOMEM, "context: out of memory");
  }
  *out = c;
  return DP_OK;
}

/* A constructor's failure: frees what was made (which may record errors of
 * its own), keeps the original error text, and leaves *out NULL. */
static dp_status ctx_abandon(dp_ctx *c, dp_ctx **out, dp_status s) {
  char msg[DP_ERRMSG_CAP];
  snprintf(msg, sizeof msg, "%s", dp_last_error());
  dp_ctx_free(c);
  dp__error_restore(msg);
  *out = NULL;
  return s;
}

/* Refuses arenas the caller gives that are NULL, misaligned or overlap
 * (each device needs memory of its own: two replicas writing the same bytes
 * give wrong results, silently), and a staging arena its backend cannot use. */
static dp_status check_static(const dp_plan *p, int d0, int d1, void *const arenas[],
                              void *host) {
  if (!arenas) return DP_FAIL(DP_ERR_INVALID, "dp_ctx_create_static: arenas is NULL");
  for (int d = d0; d < d1; d++) {
    if (!arenas[d]) return DP_FAIL(DP_ERR_INVALID, "arena of device %d is NULL", d);
    if ((uintptr_t)arenas[d] % p->align)
      return DP_FAIL(DP_ERR_INVALID,
                     "arena of device %d (%p) is not aligned to %zu bytes, the plan's "
                     "alignment (dp_plan_alignment)",
                     d, arenas[d], (size_t)p->align);
  }
  for (int d = d0; d < d1; d++)
    for (int e = d + 1; e <= d1; e++) { /* e == d1: the host staging arena */
      uintptr_t a = (uintptr_t)arenas[d],
                b = e < d1 ? (uintptr_t)arenas[e] : (uintptr_t)host;
      size_t na = p->dev_bytes[d], nb = e < d1 ? p->dev_bytes[e] : host ? p->host_bytes : 0;
      if (na && nb && a < b + nb && b < a + na)
        return DP_FAIL(
            DP_ERR_INVALID,
            "the arena of device %d (%zu bytes at %p) overlaps %s%.0d (%zu bytes "
            "at %p); every device needs memory of its own",
            d, na, arenas[d], e < d1 ? "the arena of device " : "the host staging arena",
            e < d1 ? e : 0, nb, (void *)b);
    }
  /* A backend that reads the caller's memory stages nothing; one with
   * host_staging stages inputs through `host` (dp_plan_host_bytes; the
   * backend says what memory it must be: pinned, for cuda). */
  const dp_backend_ops *be = dp__backend_ops(p->cfg.backend);
  if (be && be->host_staging && p->host_bytes) {
    if ((uintptr_t)host % p->align)
      return DP_FAIL(
          DP_ERR_INVALID,
          "the pinned host staging arena (%zu bytes, dp_plan_host_bytes) must be "
          "aligned to %zu",
          p->host_bytes, p->align);
    dp_status s = be->check_host ? be->check_host(host) : DP_OK; /* NULL included */
    if (s) return s;
  }
  return DP_OK;
}

/* Every constructor: arenas NULL: allocated here; else the caller's
 * (indexed by global device: this process's are used). wo/w: the world of a
 * multi-process context (taken over: freed here on failure), NULL for one
 * process. */
static dp_status ctx_create(const dp_plan *p, void *const arenas[], void *host,
                            const dp_world_ops *wo, void *w, dp_ctx **out) {
  dp_status s = DP_OK;
  if (out) *out = NULL; /* on every failure, the first included */
  if (p && dp__ranks(&p->cfg) > 1 && !wo)
    s = DP_FAIL(DP_ERR_INVALID,
                "this plan is for a job of %d processes (config.ranks): create each "
                "rank's context with dp_ctx_create_mpi (dp_mpi.h) under mpirun",
                dp__ranks(&p->cfg));
  if (!s) s = ctx_new(p, out);
  if (s) {
    if (wo && w) wo->free(w);
    return s;
  }
  dp_ctx *c = *out;
  if (wo) {
    int L = p->cfg.n_devices / dp__ranks(&p->cfg);
    c->rank = wo->rank;
    c->dev0 = wo->rank * L < p->split.n_used ? wo->rank * L : p->split.n_used;
    c->dev1 = c->dev0 + L < p->split.n_used ? c->dev0 + L : p->split.n_used;
    if ((s = dp__world_new(p, wo, w, c->be->transport, c->be->ctx_init_world != NULL, NULL,
                           &c->world))) {
      wo->free(w);
      return ctx_abandon(c, out, s);
    }
  }
  if (arenas) {
    if (!(s = check_static(p, c->dev0, c->dev1, arenas, host))) {
      for (int d = c->dev0; d < c->dev1; d++) c->arena[d] = arenas[d];
      if (c->be->host_staging) c->staging = host;
    }
  } else {
    c->owns_arenas = true;
    /* a backend refuses an arena its device cannot hold, naming the device */
    for (int d = c->dev0; d < c->dev1 && !s; d++)
      s = c->be->arena_alloc(p, d, (void **)&c->arena[d]);
    if (!s && c->be->host_staging && p->host_bytes)
      s = c->be->host_alloc(p->host_bytes, (void **)&c->staging);
  }
  if (!s) s = ctx_init(c);
  return s ? ctx_abandon(c, out, s) : DP_OK;
}

dp_status dp_ctx_create(const dp_plan *p, dp_ctx **out) {
  return ctx_create(p, NULL, NULL, NULL, NULL, out);
}

dp_status dp_ctx_create_static(const dp_plan *p, void *const arenas[], void *host,
                               dp_ctx **out) {
  if (out) *out = NULL;
  if (!arenas) return DP_FAIL(DP_ERR_INVALID, "dp_ctx_create_static: arenas is NULL");
  return ctx_create(p, arenas, host, NULL, NULL, out);
}

dp_status dp__ctx_create_world(const dp_plan *p, void *const arenas[], void *host,
                               const dp_world_ops *wo, void *w, dp_ctx **out) {
  return ctx_create(p, arenas, host, wo, w, out);
}

void dp_ctx_free(dp_ctx *c) {
  if (!c) return;
  if (c->exec_live) dp__exec_destroy(&c->exec);
  if (c->bctx) c->be->ctx_free(c->bctx); /* waits for queued work first */
  dp__world_free(c->world);
  if (c->owns_arenas) {
    for (int d = c->dev0; d < c->dev1; d++)
      if (c->arena[d]) c->be->arena_free(c->plan, d, c->arena[d]);
    if (c->staging) c->be->host_free(c->staging);
  }
  free(c->bounce);
  free(c->train.mbs);
  free(c->train.ops);
  free(c->train.sync);
  free(c->infer.mbs);
  free(c->infer.ops);
  free(c->infer.sync);
  free(c->accum.mbs);
  free(c->accum.ops);
  free(c->accum.sync);
  free(c);
}

/* The schedule for `rows`, rebuilt (without allocating) when rows change. */
/* The next training call updates the parameters (config.accumulate: the
 * last call of an accumulation). */
static bool updates(const dp_ctx *c) {
  return c->accum_k + 1 >= dp__accumulate(&c->plan->cfg);
}

/* DP_SCHED_*: which schedule a cache holds (its world transfers too). */
static int kind_of(const dp_ctx *c, const dp_sched_cache *sc) {
  return sc == &c->infer   ? DP_SCHED_INFER
         : sc == &c->accum ? DP_SCHED_ACCUM
                           : DP_SCHED_TRAIN;
}

static dp_status schedule_for(dp_ctx *c, dp_sched_cache *sc, int rows) {
  int kind = kind_of(c, sc);
  if (sc->rows == rows) return DP_OK;
  const dp_plan *p = c->plan;
  for (int k = 0; k < p->split.n_mb; k++)
    sc->mbs[k] = (dp_mb){p->mbs[k].row0, dp__mb_rows_at(p, k, rows)};
  sc->rows = 0;
  dp_status s =
      dp__schedule_build(p, sc->mbs, kind, sc->ops, p->ops_cap, &sc->n_ops, &sc->n_stages);
  /* across processes: the persistent transfers of its cross-rank copies */
  if (!s && c->world)
    s = dp__world_prepare(c->world,
                          kind == DP_SCHED_TRAIN   ? 0
                          : kind == DP_SCHED_INFER ? 1
                                                   : 2,
                          sc->ops, sc->n_ops, c->arena);
  if (s) return s;
  /* The commit phase starts at the first optimizer op, moved back to the
   * start of its stage if it is not one (it is: the gradient check has a stage
   * of its own). */
  int k = 0;
  while (k < sc->n_ops && sc->ops[k].kind != DP_OP_OPTIMIZER &&
         sc->ops[k].kind != DP_OP_GRAD_STASH)
    k++;
  while (k > 0 && k < sc->n_ops && sc->ops[k - 1].stage == sc->ops[k].stage) k--;
  sc->commit = k;
  dp__exec_sync(&c->exec, c->plan, sc->ops, sc->n_ops, sc->sync);
  sc->rows = rows;
  return DP_OK;
}

dp_status dp__ctx_schedule(dp_ctx *c, int rows, bool training, const dp_op **ops,
                           int *n_ops, int *commit) {
  if (!c || rows < 1 || rows > c->plan->cfg.batch || (training && c->plan->cfg.inference))
    return DP_FAIL(DP_ERR_INVALID, "dp__ctx_schedule: bad arguments");
  dp_sched_cache *sc = !training ? &c->infer : updates(c) ? &c->train : &c->accum;
  dp_status s = schedule_for(c, sc, rows);
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
dp_status dp__ctx_poison(dp_ctx *c, dp_status s) {
  if (!c->poison) {
    c->poison = s;
    snprintf(c->poison_msg, sizeof c->poison_msg, "%s", dp_last_error());
  }
  return s;
}

static dp_status poisoned(dp_ctx *c) {
  return dp__ctx_fail(c,
                      DP_FAIL(c->poison,
                              "this context is unusable since an earlier failure left its "
                              "state untrustworthy (free it and restore from a "
                              "checkpoint): %s",
                              c->poison_msg));
}

/* The whole words of guard g of device d: g follows region g (g = -1: the one
 * before the first region), up to the next region or the arena's end. */
static void guard_words(const dp_plan *p, int d, int g, size_t *k0, size_t *k1) {
  size_t lo = g < 0 ? 0 : p->regions[d][g].offset + p->regions[d][g].size;
  size_t hi = g + 1 < DP_REGION_COUNT ? p->regions[d][g + 1].offset : p->dev_bytes[d];
  *k0 = (lo + 3) / 4;
  *k1 = hi / 4;
}

/* Words of device d's arena in [k0, k1) (word indices) that differ from the
 * canary: how many, the first, and whether the first and last word do. */
typedef struct {
  size_t n, first;
  bool head, tail;
} canary_scan;

static dp_status scan_canary(const dp_ctx *c, int d, size_t k0, size_t k1, canary_scan *r) {
  *r = (canary_scan){0};
  for (size_t k = k0; k < k1;) {
    size_t m = k1 - k < DP_CTX_BOUNCE_WORDS ? k1 - k : DP_CTX_BOUNCE_WORDS;
    dp_status s;
    const uint32_t *w = arena_words(c, d, k * 4, m, &s);
    if (s) return s;
    for (size_t i = 0; i < m; i++)
      if (w[i] != DP_CANARY && r->n++ == 0) r->first = k + i;
    if (k == k0) r->head = w[0] != DP_CANARY;
    if (k + m == k1) r->tail = w[m - 1] != DP_CANARY;
    k += m;
  }
  return DP_OK;
}

static dp_status check_guards(dp_ctx *c) {
  const dp_plan *p = c->plan;
  if (!p->cfg.guards) return DP_OK;
  int bad_guards = 0, bad_dev = -1, bad_region = 0;
  size_t bad_lo = 0, bad_hi = 0;
  canary_scan bad = {0};
  for (int d = c->dev0; d < c->dev1; d++) {
    for (int g = -1; g < DP_REGION_COUNT; g++) {
      size_t k0, k1;
      guard_words(p, d, g, &k0, &k1);
      canary_scan r;
      dp_status s = scan_canary(c, d, k0, k1, &r);
      if (s)
        return dp__ctx_poison(
            c, DP_FAIL(s, "device %d: cannot read its guards: %s", d, dp_last_error()));
      if (!r.n) continue;
      if (bad_guards++ == 0) {
        bad_dev = d;
        bad_region = g;
        bad_lo = k0 * 4;
        bad_hi = k1 * 4;
        bad = r;
      }
    }
  }
  if (!bad_guards) return DP_OK;
  /* A write that ran past a region's end hits the head of the guard after
   * it; one that ran before a region's start, the tail of the guard before. */
  char what[96];
  if (bad_region < 0 || (bad.tail && !bad.head && bad_region + 1 < DP_REGION_COUNT))
    snprintf(what, sizeof what, "before the start of region '%s'",
             dp_region_name((dp_region)(bad_region + 1)));
  else
    snprintf(what, sizeof what, "past the end of region '%s'",
             dp_region_name((dp_region)bad_region));
  char more[48] = "";
  if (bad_guards > 1)
    snprintf(more, sizeof more, "; %d more guards damaged", bad_guards - 1);
  return dp__ctx_poison(
      c, DP_FAIL(DP_ERR_CORRUPT,
                 "device %d: a write ran %s (guard at offset %zu damaged: %zu of its "
                 "%zu words, the first at offset %zu)%s",
                 bad_dev, what, bad_lo, bad.n, (bad_hi - bad_lo) / 4, bad.first * 4, more));
}

dp_status dp__ctx_rearm_guards(dp_ctx *c) {
  const dp_plan *p = c->plan;
  if (!p->cfg.guards) return DP_OK;
  for (int d = c->dev0; d < c->dev1; d++)
    for (int g = -1; g < DP_REGION_COUNT; g++) { /* the spans check_guards scans */
      size_t k0, k1;
      guard_words(p, d, g, &k0, &k1);
      if (k1 <= k0) continue;
      dp_status s = c->be->fill_u32(p, d, c->arena[d] + k0 * 4, DP_CANARY, k1 - k0);
      if (s) return s;
    }
  return DP_OK;
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
  if (!p->model.input_t) return DP_OK;
  /* token ids: integers in 0 .. V-1 (the embedding indexes its table by them);
   * this rank's rows (all of them in one process) */
  int row0 = 0, n = rows, V = p->model.layers[0].vocab;
  if (c->world) dp__rank_rows(p, rows, c->rank, &row0, &n);
  for (size_t k = 0; k < (size_t)n * (size_t)cols; k++)
    if (!(x[k] >= 0.0f && x[k] < (float)V && x[k] == floorf(x[k])))
      return DP_FAIL(DP_ERR_RANGE,
                     "token %.9g at position %zu of row %zu is not an id in 0..%d (the "
                     "embedding's vocabulary)",
                     (double)x[k], k % (size_t)cols, (size_t)row0 + k / (size_t)cols,
                     V - 1);
  return DP_OK;
}

static void env_init(dp_ctx *c, dp_exec_env *e, const dp_sched_cache *sc, int rows,
                     bool training) {
  *e = (dp_exec_env){.plan = c->plan,
                     .mbs = sc->mbs,
                     .rows = rows,
                     .training = training,
                     .step = c->step,
                     .lr = c->lr,
                     .momentum = c->momentum,
                     .grad_norm = NAN,
                     .accum_k = c->accum_k,
                     /* an accumulation's calls as one concatenated batch */
                     .loss_rows = rows * dp__accumulate(&c->plan->cfg),
                     .row_base = c->accum_k * rows,
                     .skip_broadcast = !c->replicas_stale};
  for (int d = c->dev0; d < c->dev1; d++) e->arena[d] = c->arena[d];
  int n;
  if (c->world) dp__rank_rows(c->plan, rows, c->rank, &e->host_row0, &n);
}

/* Checks a training call's arguments and builds its schedule; changes nothing. */
static dp_status train_args(dp_ctx *c, int rows, int cols, const float *x,
                            const void *target) {
  const dp_plan *p = c->plan;
  dp_status s = check_batch(c, rows, cols, x);
  if (!s && p->cfg.inference)
    s = DP_FAIL(DP_ERR_INVALID, "this context was planned for inference; use dp_forward");
  if (!s && !target) s = DP_FAIL(DP_ERR_INVALID, "targets are NULL");
  if (!s && p->model.loss == DP_LOSS_SOFTMAX_CE) {
    /* this rank's rows: all of them in one process */
    int row0 = 0, n = rows;
    if (c->world) dp__rank_rows(p, rows, c->rank, &row0, &n);
    const int32_t *t = target;
    int P = dp_model_positions(&p->model), classes = dp_model_output_width(&p->model) / P;
    const dp_ce_opts *o = &p->model.ce;
    for (size_t k = 0; k < (size_t)n * (size_t)P && !s; k++)
      if ((t[k] < 0 || t[k] >= classes) && !(o->ignore && t[k] == o->ignore_index))
        s = P == 1
                ? DP_FAIL(DP_ERR_RANGE, "label %d of row %d is outside 0..%d", t[k],
                          row0 + (int)k, classes - 1)
                : DP_FAIL(DP_ERR_RANGE,
                          "label %d at position %d of row %d is outside 0..%d", t[k],
                          (int)(k % (size_t)P), row0 + (int)(k / (size_t)P), classes - 1);
  }
  if (!s) s = schedule_for(c, updates(c) ? &c->train : &c->accum, rows);
  /* a batchnorm's micro-batch (sync: batch) of one value per channel */
  if (!s) s = dp_plan_check_rows(p, rows);
  return s;
}

/* A non-finite loss or gradient under the context's policy: DP_OK (skipped,
 * counted, *loss NaN) or the error. Nothing was applied either way. */
static dp_status nonfinite(dp_ctx *c, dp_status s, float *loss) {
  if (s == DP_ERR_NONFINITE && c->plan->cfg.on_nonfinite == DP_NONFINITE_SKIP) {
    c->skipped++;
    snprintf(c->error, sizeof c->error, "step %llu skipped: %s",
             (unsigned long long)c->step, dp_last_error());
    if (loss) *loss = NAN;
    return DP_OK;
  }
  return dp__ctx_fail(c, s);
}

/* ---- one run of a schedule -------------------------------------------------------
 * The fault guarantee (docs/RELIABILITY.md, "Fault injection and arena
 * guards"). State a failed step must leave alone: device 0's parameters,
 * every device's optimizer state, the step counter. Replicas' parameters are
 * copies of device 0's, refreshed by the broadcast that opens every training
 * step and by a forward after replicas_stale is set; everything else in the
 * arenas is rewritten before it is read in every step. The schedule writes
 * that state only in its commit phase (the optimizer stage and, with a
 * sharded optimizer, the parameter all-gather after it), so a step runs in
 * two parts: everything that can fail (transfers, layers, the loss and
 * gradient checks), then the commit phase.
 *
 * A synchronous backend (no step_end) has done an op's work when it returns,
 * so the host checks between the parts: the commit phase runs only when all
 * of the first part succeeded and every guard holds. Its ops cannot fail on
 * the cpu backend (arithmetic and memcpy over planned memory); if one fails
 * anyway, the state is partly updated and cannot be restored: the context is
 * poisoned instead of going on with it.
 *
 * An asynchronous backend (step_begin/step_end) only enqueues: the whole
 * schedule is enqueued at once, the device refuses a bad step by itself
 * (every optimizer kernel reads the status words first), and step_end, the
 * one synchronisation, says how it went. With graphs (n_graph_slots, config
 * cuda_graph) there is a slot per shape of run (training or forward, with or
 * without the parameter broadcast; full batches only): the first run of a
 * shape is plain (a warm-up), the second is captured and launched, every
 * later one launched. */
static int graph_slot(const dp_ctx *c, const dp_exec_env *e, int rows, int inject) {
  if (!(c->plan->features & DP_FEATURE_GRAPHS) ||
      c->be->n_graph_slots < DP_CTX_GRAPH_SLOTS || rows != c->plan->cfg.batch ||
      inject >= 0)
    return -1;
  return (e->training ? 0 : 2) + (e->skip_broadcast ? 1 : 0);
}

/* The caller's inputs, targets and output buffer as the executor's host
 * endpoints: directly, or through the staging arena (be->host_staging). */
static void host_io(dp_ctx *c, dp_exec_env *e, int rows, const float *x, const void *target,
                    float *y) {
  const dp_plan *p = c->plan;
  if (!c->be->host_staging) {
    e->host_x = x;
    e->host_t = target;
    e->host_y = y;
    return;
  }
  int row0 = 0, n = rows; /* across processes the caller holds this rank's rows */
  if (c->world) dp__rank_rows(p, rows, c->rank, &row0, &n);
  memcpy(c->staging + p->host_x, x, (size_t)n * (size_t)p->model.input_width * 4);
  e->host_x = (const float *)(c->staging + p->host_x);
  if (target) {
    size_t tw = (size_t)dp_model_target_width(&p->model);
    memcpy(c->staging + p->host_t, target, (size_t)n * tw * 4);
    e->host_t = c->staging + p->host_t;
  }
  e->host_y = (float *)(c->staging + p->host_y);
}

/* Runs (or, asynchronous, enqueues) the schedule: step_begin, the pre-commit
 * part, the commit part. *commit_failed: the commit part failed after all of
 * the pre-commit part ran (the update may be partly applied), or the device
 * failed (step_sync). A synchronous backend stops after the pre-commit part
 * when it failed or a guard was hit. Across processes every rank goes on to
 * the commit part, or none: a synchronous backend's pre-commit part has run
 * when it returns; an asynchronous one's is waited for first (step_sync;
 * its guards are checked after the whole step, as in one process). */
static dp_status run_parts(dp_ctx *c, dp_exec_env *e, const dp_sched_cache *sc, int inject,
                           bool *commit_failed) {
  *commit_failed = false;
  bool sync = !c->be->step_end;
  dp_status s = sync ? DP_OK : c->be->step_begin(c->bctx, c->step);
  if (!s)
    s = dp__exec_run(&c->exec, e, sc->ops, sc->sync, sc->n_ops, 0, sc->commit, inject);
  if (c->world) {
    int order = s ? c->exec.first_fail : 0;
    dp_status g = DP_OK;
    if (sync) {
      g = check_guards(c);
    } else { /* after a failure too: nothing of the part may still run */
      char msg[DP_ERRMSG_CAP];
      if (s) snprintf(msg, sizeof msg, "%s", dp_last_error());
      dp_status ss = c->be->step_sync(c->bctx, &e->loss);
      if (c->be->grad_norm)
        e->grad_norm = c->be->grad_norm(c->bctx); /* rank 0's: agreed below */
      *commit_failed = ss == DP_ERR_BACKEND;      /* the device failed: untrusted */
      if (s)
        dp__error_restore(msg);
      else if (ss)
        s = ss, order = sc->commit;
    }
    uint32_t v[2]; /* rank 0's loss and gradient norm, for every rank */
    memcpy(&v[0], &e->loss, 4);
    memcpy(&v[1], &e->grad_norm, 4);
    s = agree(c, g ? g : s, g ? sc->n_ops : order, e->rows, v);
    memcpy(&e->loss, &v[0], 4);
    memcpy(&e->grad_norm, &v[1], 4);
    if (s) return s;
  } else if (sync) {
    dp_status g = check_guards(c);
    if (g) return g;
  }
  if (!s) {
    s = dp__exec_run(&c->exec, e, sc->ops, sc->sync, sc->n_ops, sc->commit, sc->n_ops,
                     inject);
    *commit_failed = s != DP_OK;
  }
  return s;
}

/* Captures the schedule into graph `slot` and launches it. A failure before
 * the launch ran nothing (a capture only records) and dropped the capture;
 * *launched: the launch was attempted, so the graph may have run whatever
 * the launch returned. */
static dp_status capture(dp_ctx *c, dp_exec_env *e, const dp_sched_cache *sc, int slot,
                         bool *launched) {
  bool partial; /* irrelevant here: a capture runs nothing */
  *launched = false;
  dp_status s = c->be->capture_begin(c->bctx);
  if (!s) {
    s = run_parts(c, e, sc, -1, &partial);
    if (s) {
      char msg[DP_ERRMSG_CAP];
      snprintf(msg, sizeof msg, "%s", dp_last_error());
      c->be->capture_abort(c->bctx);
      dp__error_restore(msg);
      return s;
    }
    s = c->be->capture_end(c->bctx, slot);
  }
  if (!s) {
    *launched = true;
    s = c->be->graph_launch(c->bctx, slot, c->step);
  }
  return s;
}

/* One run of sc (plain, or captured then launched, or launched), to
 * completion. *untrusted: the state may be partly updated: part of the
 * commit phase failed after all of the pre-commit part ran, the device
 * failed (an asynchronous fault: its context is then unusable), or a graph
 * launch failed (the graph may have run, update included: running the step
 * again would apply it twice). A failure before the commit phase leaves the
 * state as it was. A shape whose capture fails runs plain from then on (this
 * run included); c->error says why. */
static dp_status run_sched(dp_ctx *c, dp_exec_env *e, const dp_sched_cache *sc, int slot,
                           int inject, float *loss, bool *untrusted) {
  const dp_backend_ops *be = c->be;
  bool commit_failed = false, launched = false;
  dp_status s;
  if (slot >= 0 && !c->graph_broken[slot] && be->graph_ready(c->bctx, slot)) {
    launched = true;
    s = be->graph_launch(c->bctx, slot, c->step);
    if (s) c->graph_broken[slot] = true;
  } else if (slot >= 0 && c->graph_warm[slot] && !c->graph_broken[slot]) {
    s = capture(c, e, sc, slot, &launched);
    if (s) c->graph_broken[slot] = true;
    if (s && !launched) {
      char why[DP_ERRMSG_CAP];
      snprintf(why, sizeof why, "%s", dp_last_error());
      if (!(s = run_parts(c, e, sc, inject, &commit_failed)))
        snprintf(c->error, sizeof c->error,
                 "graph capture failed; this shape of step runs plain: %.400s", why);
    }
  } else {
    s = run_parts(c, e, sc, inject, &commit_failed);
    if (!s && slot >= 0) c->graph_warm[slot] = true;
  }
  if (!be->step_end) {
    *untrusted = commit_failed;
    if (loss) *loss = e->loss;
    return s;
  }
  /* Always: nothing of this run may still be queued when we return. A
   * failure to enqueue comes first; its text stays the last error. */
  char msg[DP_ERRMSG_CAP];
  if (s) snprintf(msg, sizeof msg, "%s", dp_last_error());
  dp_status end = be->step_end(c->bctx, loss);
  if (c->world && loss) *loss = e->loss; /* rank 0's, agreed after step_sync */
  if (!c->world && be->grad_norm) e->grad_norm = be->grad_norm(c->bctx);
  *untrusted = commit_failed || end == DP_ERR_BACKEND || (launched && s);
  if (s) {
    if (end == DP_ERR_BACKEND) /* and the device failed too: report both */
      return DP_FAIL(DP_ERR_BACKEND, "%s; then: %s", msg, dp_last_error());
    dp__error_restore(msg);
    return s;
  }
  return end;
}

dp_status dp__ctx_agree(dp_ctx *c, dp_status s) {
  return c->world ? agree(c, s, -1, 0, NULL) : s;
}

dp_status dp__ctx_root_status(dp_ctx *c, dp_status s) {
  if (!c->world) return s;
  struct {
    int32_t status;
    char msg[DP_ERRMSG_CAP];
  } r = {.status = s};
  if (s && c->rank == 0) snprintf(r.msg, sizeof r.msg, "%s", dp_last_error());
  dp_status ws = c->world->ops->bcast(c->world->w, 0, &r, sizeof r);
  if (ws) return dp__ctx_poison(c, ws);
  if (!r.status || c->rank == 0) return r.status ? s : DP_OK;
  return DP_FAIL((dp_status)r.status, "rank 0: %s", r.msg);
}

dp_status dp__ctx_bcast(dp_ctx *c, int root, void *buf, size_t bytes) {
  if (!c->world) return DP_OK;
  dp_status s = c->world->ops->bcast(c->world->w, root, buf, bytes);
  return s ? dp__ctx_poison(c, s) : DP_OK;
}

/* Across processes, a call's arguments are agreed before anything runs: a
 * rank refused (or poisoned) refuses the call on every rank. */
static dp_status agree_args(dp_ctx *c, dp_status s, int rows) {
  return c->world ? agree(c, s, -1, rows, NULL) : s;
}

/* The cross-entropy options' denominator (dp__ce_has_opts) of a call: the
 * count of its non-ignored targets, or with class weights sum_c w_c n_c over
 * the per-class counts n_c, computed in double in class order. The counts are
 * integers, so they add exactly across processes (each rank broadcasts its
 * own in turn) and the denominator has the same bits for every layout. */
static dp_status ce_denominator(dp_ctx *c, int rows, const int32_t *t, float *denom) {
  const dp_model *m = &c->plan->model;
  const dp_ce_opts *o = &m->ce;
  int K = o->n_weights ? o->n_weights : 1, P = dp_model_positions(m), row0 = 0, n = rows;
  if (c->world) dp__rank_rows(c->plan, rows, c->rank, &row0, &n);
  int64_t *own = c->ce_counts, *sum = c->ce_counts + DP_MAX_CLASS_WEIGHTS;
  memset(own, 0, (size_t)K * sizeof *own);
  for (size_t k = 0; k < (size_t)n * (size_t)P; k++)
    if (!(o->ignore && t[k] == o->ignore_index)) own[o->n_weights ? t[k] : 0]++;
  memcpy(sum, own, (size_t)K * sizeof *own);
  int64_t *recv = c->ce_counts + 2 * DP_MAX_CLASS_WEIGHTS;
  for (int q = 0; c->world && q < c->world->ops->size; q++) {
    /* every rank calls every broadcast; the root's buffer is its own counts */
    dp_status s = dp__ctx_bcast(c, q, q == c->rank ? own : recv, (size_t)K * sizeof *own);
    if (s) return s;
    for (int k = 0; q != c->rank && k < K; k++) sum[k] += recv[k];
  }
  double d = 0.0;
  for (int k = 0; k < K; k++)
    d += (o->n_weights ? (double)o->weights[k] : 1.0) * (double)sum[k];
  *denom = (float)d;
  return DP_OK;
}

static dp_status train_step(dp_ctx *c, int rows, int cols, const float *x,
                            const void *target, float *loss) {
  if (c->poison && !c->world) return poisoned(c);
  dp_status s = c->poison ? poisoned(c) : train_args(c, rows, cols, x, target);
  if ((s = agree_args(c, s, rows))) return dp__ctx_fail(c, s);
  float denom = 0.0f, inv = 0.0f;
  if (dp__ce_has_opts(&c->plan->model)) {
    if ((s = ce_denominator(c, rows, target, &denom))) return dp__ctx_fail(c, s);
    /* PyTorch's mean is 0/0 here, a NaN loss: the non-finite policy decides */
    if (!(denom > 0.0f && denom <= FLT_MAX))
      return nonfinite(
          c,
          DP_FAIL(DP_ERR_NONFINITE,
                  "the loss is NaN: the sum of the weights of the batch's non-ignored "
                  "targets is %g (%s); the step was not applied",
                  (double)denom,
                  c->plan->model.ce.n_weights ? "every target ignored or of weight 0"
                                              : "every target is ignore_index"),
          loss);
    inv = 1.0f / (denom * (float)dp__accumulate(&c->plan->cfg));
    if (c->be->set_loss_norm && (s = c->be->set_loss_norm(c->bctx, denom, inv)))
      return dp__ctx_fail(c, s);
  }
  dp_exec_env e;
  bool update = updates(c);
  dp_sched_cache *sc = update ? &c->train : &c->accum;
  env_init(c, &e, sc, rows, true);
  e.loss_denom = denom;
  e.loss_inv = inv;
  /* Classic mode broadcasts every step (the optimizer ran on device 0 only);
   * allreduce keeps every replica current and broadcasts only when they are
   * stale (parameters set from outside, a load, a failed step). */
  bool classic = c->plan->cfg.mode == DP_MODE_CLASSIC;
  e.skip_broadcast = !classic && !c->replicas_stale;
  int inject = c->inject_at;
  c->inject_at = -1;
  host_io(c, &e, rows, x, target, NULL);
  bool untrusted;
  float l = 0.0f;
  s = run_sched(c, &e, sc, update ? graph_slot(c, &e, rows, inject) : -1, inject, &l,
                &untrusted);
  /* the norm of a step that reached its clipping (NaN: not reached, or a NaN
   * gradient, which refuses the step as non-finite) */
  if (c->plan->cfg.clip_grad_norm > 0 && (!isnan(e.grad_norm) || s == DP_ERR_NONFINITE))
    c->grad_norm = e.grad_norm;
  if (s == DP_ERR_CORRUPT) return dp__ctx_fail(c, s); /* a guard, before the commit */
  if (untrusted) {
    c->replicas_stale = true;
    return dp__ctx_fail(
        c, dp__ctx_poison(c, DP_FAIL(s,
                                     "the step's update failed part way (or the device "
                                     "failed), leaving parameters and optimizer state "
                                     "partly updated: %s",
                                     dp_last_error())));
  }
  /* A guard hit in the commit phase: the update is applied (and counted) on
   * a synchronous backend, but the context is poisoned all the same. */
  dp_status g = check_guards(c);
  if (s) {
    if (g) return dp__ctx_fail(c, g);
    c->replicas_stale = true;
    return nonfinite(c, s, loss); /* refused before its update */
  }
  if (update) { /* an optimizer step; an accumulating call only adds its gradient */
    c->step++;
    c->accum_k = 0;
  } else {
    c->accum_k++;
  }
  /* batchnorm's running statistics moved on device 0 only: the replicas take
   * them with the next broadcast */
  c->replicas_stale = classic || c->plan->model.n_buffers > 0;
  if (g) return dp__ctx_fail(c, g);
  if (loss) *loss = l;
  return DP_OK;
}

static dp_status forward(dp_ctx *c, int rows, int cols, const float *x, float *y) {
  if (c->poison && !c->world) return poisoned(c);
  dp_status s = c->poison ? poisoned(c) : check_batch(c, rows, cols, x);
  if (!s && !y) s = DP_FAIL(DP_ERR_INVALID, "outputs are NULL");
  if (!s) s = schedule_for(c, &c->infer, rows);
  if ((s = agree_args(c, s, rows))) return dp__ctx_fail(c, s);
  dp_exec_env e;
  env_init(c, &e, &c->infer, rows, false);
  int inject = c->inject_at;
  c->inject_at = -1;
  host_io(c, &e, rows, x, NULL, y);
  bool untrusted;
  s = run_sched(c, &e, &c->infer, graph_slot(c, &e, rows, inject), inject, NULL,
                &untrusted);
  if (untrusted)
    return dp__ctx_fail(c,
                        dp__ctx_poison(c, DP_FAIL(s, "the forward failed on the device: %s",
                                                  dp_last_error())));
  if (!s && c->be->host_staging) {
    int row0 = 0, n = rows; /* this rank's rows across processes */
    if (c->world) dp__rank_rows(c->plan, rows, c->rank, &row0, &n);
    memcpy(y, e.host_y, (size_t)n * (size_t)dp_model_output_width(&c->plan->model) * 4);
  }
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

/* The profile's step event: the whole call, on the caller's thread. */
static void prof_step(dp_ctx *c, uint64_t t0) {
  dp_prof_event ev = {.t0_ns = t0,
                      .t1_ns = dp__now_ns(),
                      .what = DP_PROF_EVENT_STEP,
                      .thread = (int16_t)c->dev0,
                      .device = -1,
                      .layer = -1,
                      .op = -1};
  dp__exec_prof_add(&c->exec, &ev);
}

dp_status dp_train_step(dp_ctx *c, int rows, int cols, const float *x, const void *target,
                        float *loss) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (!c->exec.prof) return train_step(c, rows, cols, x, target, loss);
  uint64_t t0 = dp__now_ns();
  dp_status s = train_step(c, rows, cols, x, target, loss);
  prof_step(c, t0);
  return s;
}

dp_status dp_forward(dp_ctx *c, int rows, int cols, const float *x, float *y) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (!c->exec.prof) return forward(c, rows, cols, x, y);
  uint64_t t0 = dp__now_ns();
  dp_status s = forward(c, rows, cols, x, y);
  prof_step(c, t0);
  return s;
}

dp_status dp_ctx_profile(dp_ctx *c, dp_prof_event *events, size_t cap) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (events && cap == 0)
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_INVALID, "a profile needs room for an event"));
  dp__exec_profile(&c->exec, events, cap);
  return DP_OK;
}

size_t dp_ctx_profile_count(const dp_ctx *c, size_t *dropped) {
  if (dropped) *dropped = c ? atomic_load(&c->exec.prof_dropped) : 0;
  if (!c) return 0;
  size_t n = atomic_load(&c->exec.prof_n);
  return n < c->exec.prof_cap ? n : c->exec.prof_cap;
}

static dp_status check_n(dp_ctx *c, const void *buf, size_t n) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  if (!buf) return dp__ctx_fail(c, DP_FAIL(DP_ERR_INVALID, "buffer is NULL"));
  if (n != c->plan->model.n_params)
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_SHAPE,
                                   "buffer holds %zu floats; the model has %zu "
                                   "parameters",
                                   n, c->plan->model.n_params));
  return DP_OK;
}

dp_status dp_get_params(dp_ctx *c, float *out, size_t n) {
  dp_status s = check_n(c, out, n);
  if (!s) s = dp__ctx_fail(c, dp__ctx_read(c, 0, DP_REGION_PARAMS, 0, out, n * 4));
  return s;
}

dp_status dp_set_params(dp_ctx *c, const float *in, size_t n) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  dp_status s = check_n(c, in, n);
  for (size_t k = 0; !s && k < n; k++)
    if (!isfinite(in[k])) s = DP_FAIL(DP_ERR_NONFINITE, "parameter %zu is not finite", k);
  /* across processes every rank goes on, or none: the replicas' staleness
   * (whether the next step broadcasts) must be the same on every rank */
  if ((s = dp__ctx_agree(c, s))) return dp__ctx_fail(c, s);
  c->replicas_stale = true;
  c->accum_k = 0; /* new parameters: an accumulation starts again */
  s = dp__ctx_write(c, 0, DP_REGION_PARAMS, 0, in, n * 4);
  if (s) /* only a device copy can fail, part way */
    return dp__ctx_fail(c, dp__ctx_poison(c, DP_FAIL(s,
                                                     "setting the parameters failed part "
                                                     "way: %s",
                                                     dp_last_error())));
  return DP_OK;
}

dp_status dp__ctx_set_state(dp_ctx *c, const float *in) {
  const dp_model *m = &c->plan->model;
  dp_status s = DP_OK;
  for (size_t k = 0; !s && k < m->n_params; k++)
    if (!isfinite(in[k])) s = DP_FAIL(DP_ERR_NONFINITE, "parameter %zu is not finite", k);
  if ((s = dp__ctx_agree(c, s))) return dp__ctx_fail(c, s);
  c->replicas_stale = true;
  c->accum_k = 0;
  s = dp__ctx_write(c, 0, DP_REGION_PARAMS, 0, in, dp__param_floats(m) * 4);
  if (s)
    return dp__ctx_fail(
        c, dp__ctx_poison(
               c, DP_FAIL(s, "setting the state failed part way: %s", dp_last_error())));
  return DP_OK;
}

dp_status dp_get_grads(dp_ctx *c, float *out, size_t n) {
  dp_status s = check_n(c, out, n);
  if (s) return s;
  if (c->plan->cfg.inference)
    return dp__ctx_fail(c,
                        DP_FAIL(DP_ERR_INVALID, "an inference context has no gradients"));
  /* Device d's optimizer reads the fully reduced gradients of its range
   * [opt_off[d], +opt_len[d]) from its own GRADS region; elsewhere that region
   * may hold partial sums (a sharded optimizer's reduce-scatter leaves each
   * device only its shard). So each range is read from the device that owns
   * it; the ranges tile [0, n) (classic: device 0 holds all of it). */
  const dp_plan *p = c->plan;
  for (int d = 0; d < p->split.n_used; d++) {
    size_t off = p->opt_off[d], len = p->opt_len[d];
    if (!len) continue;
    if ((s = dp__ctx_read(c, d, DP_REGION_GRADS, off * 4, out + off, len * 4)))
      return dp__ctx_fail(c, s);
    if (len == n) break; /* a full copy (unsharded): the rest hold the same */
  }
  return DP_OK;
}

dp_status dp_set_lr(dp_ctx *c, float lr) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  const dp_config *cf = &c->plan->cfg;
  if (cf->inference)
    return dp__ctx_fail(
        c, DP_FAIL(DP_ERR_INVALID, "an inference context has no learning rate"));
  /* 0 is a rate (a schedule's floor, as in PyTorch); the plan's must be > 0 */
  if (!(lr >= 0.0f && lr <= FLT_MAX))
    return dp__ctx_fail(c, DP_FAIL(DP_ERR_INVALID,
                                   "learning rate must be finite and >= 0, got %g",
                                   (double)lr));
  if (cf->optimizer == DP_OPT_ADAMW && !((double)lr * cf->weight_decay <= 1.0))
    return dp__ctx_fail(
        c, DP_FAIL(DP_ERR_INVALID,
                   "lr * weight_decay is %g; AdamW multiplies every parameter "
                   "by 1 - lr * weight_decay each step, so it must be at most 1",
                   (double)lr * cf->weight_decay));
  if (c->be->set_lr) {
    dp_status s = c->be->set_lr(c->bctx, lr);
    if (s) return dp__ctx_fail(c, s);
  }
  c->lr = lr;
  return DP_OK;
}

float dp_ctx_lr(const dp_ctx *c) { return c ? c->lr : 0.0f; }

/* DP_OK when a context of config cf takes momentum m; else DP_ERR_INVALID
 * saying why. */
static dp_status momentum_check(const dp_config *cf, float m) {
  if (cf->inference) return DP_FAIL(DP_ERR_INVALID, "an inference context has no momentum");
  if (cf->optimizer == DP_OPT_SGD)
    return DP_FAIL(DP_ERR_INVALID,
                   "plain SGD keeps no momentum buffer to set a momentum for: create the "
                   "context with config.momentum > 0 (a schedule that cycles it starts at "
                   "its max_momentum, as PyTorch's OneCycleLR sets it)");
  if (!(m >= 0.0f && m < 1.0f))
    return DP_FAIL(DP_ERR_INVALID, "%s must be in [0, 1), got %g",
                   dp__is_adam(cf->optimizer) ? "Adam's beta1" : "momentum", (double)m);
  return DP_OK;
}

dp_status dp_set_momentum(dp_ctx *c, float momentum) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  dp_status s = momentum_check(&c->plan->cfg, momentum);
  if (!s && c->be->set_momentum) s = c->be->set_momentum(c->bctx, momentum);
  if (s) return dp__ctx_fail(c, s);
  c->momentum = momentum;
  return DP_OK;
}

float dp_ctx_momentum(const dp_ctx *c) { return c ? c->momentum : 0.0f; }

uint64_t dp_ctx_step(const dp_ctx *c) { return c ? c->step : 0; }
int dp_ctx_rank(const dp_ctx *c) { return c ? c->rank : 0; }
float dp_ctx_grad_norm(const dp_ctx *c) { return c ? c->grad_norm : NAN; }
int dp_ctx_accumulated(const dp_ctx *c) { return c ? c->accum_k : 0; }
uint64_t dp_ctx_skipped_steps(const dp_ctx *c) { return c ? c->skipped : 0; }

size_t dp_ctx_high_water(const dp_ctx *c, int dev) {
  if (!c || !is_local(c, dev)) return 0; /* another rank's device: not here */
  /* from the end, a chunk at a time, to the last word that is not the canary */
  for (size_t k = c->plan->dev_bytes[dev] / 4; k > 0;) {
    size_t m = k < DP_CTX_BOUNCE_WORDS ? k : DP_CTX_BOUNCE_WORDS;
    dp_status s;
    const uint32_t *w = arena_words(c, dev, (k - m) * 4, m, &s);
    if (s) return 0; /* documented: 0 when it cannot be read */
    for (size_t i = m; i > 0; i--)
      if (w[i - 1] != DP_CANARY) return (k - m + i) * 4;
    k -= m;
  }
  return 0;
}

uint64_t dp_params_hash(dp_ctx *c) {
  if (!c) return 0;
  size_t bytes = c->plan->model.n_params * 4;
  uint64_t h = DP_FNV_INIT;
  for (size_t off = 0; off < bytes;) {
    size_t m =
        bytes - off < DP_CTX_BOUNCE_WORDS * 4 ? bytes - off : DP_CTX_BOUNCE_WORDS * 4;
    if (dp__ctx_read(c, 0, DP_REGION_PARAMS, off, c->bounce, m)) return 0;
    h = dp__fnv1a(h, c->bounce, m);
    off += m;
  }
  return h;
}

dp_status dp_get_running_stats(dp_ctx *c, int layer, float *mean, float *var,
                               int64_t *count) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "context is NULL");
  const dp_model *m = &c->plan->model;
  if (layer < 0 || layer >= m->n_layers || m->layers[layer].kind != DP_LAYER_BATCHNORM)
    return DP_FAIL(DP_ERR_INVALID, "layer %d is not a batchnorm layer", layer);
  const dp_layer *l = &m->layers[layer];
  size_t off = (m->n_params + l->buf_off) * 4, C = (size_t)l->c;
  uint32_t n = 0;
  /* collective across processes: every read on every rank, NULL outputs too */
  dp_status s = DP_OK;
  for (int k = 0; k < 2 && !s; k++) {
    float *dst = k ? var : mean;
    for (size_t at = 0; at < C && !s;) { /* through the bounce when dst is NULL */
      size_t w = C - at < DP_CTX_BOUNCE_WORDS ? C - at : DP_CTX_BOUNCE_WORDS;
      s = dp__ctx_read(c, 0, DP_REGION_PARAMS, off + (k * C + at) * 4,
                       dst ? (void *)(dst + at) : (void *)c->bounce, w * 4);
      at += w;
    }
  }
  if (!s) s = dp__ctx_read(c, 0, DP_REGION_PARAMS, off + 2 * C * 4, &n, 4);
  if (!s && count) *count = (int64_t)n;
  return s;
}

dp_status dp__ctx_run_phase(dp_ctx *c, int rows, dp_phase ph, int iters) {
  if (!c || c->plan->cfg.inference || rows < 1 || rows > c->plan->cfg.batch || iters < 0)
    return DP_FAIL(DP_ERR_INVALID, "dp__ctx_run_phase: bad arguments");
  dp_status s = schedule_for(c, &c->train, rows);
  if (s) return s;
  const dp_op *ops = c->train.ops;
  int n = c->train.n_ops, lo = 0;
  while (lo < n && ops[lo].phase != ph) lo++;
  int hi = lo;
  while (hi < n && ops[hi].phase == ph) hi++;
  dp_exec_env e;
  env_init(c, &e, &c->train, rows, true);
  for (int i = 0; i < iters && !s; i++)
    s = dp__exec_run(&c->exec, &e, ops, c->train.sync, n, lo, hi, -1);
  return s;
}
