/* The context's state (lib/core/ctx.c), shared with the modules that save and
 * restore it (lib/format/checkpoint.c). Not installed. */
#ifndef DP_CTX_H
#define DP_CTX_H

#include "core/exec.h"
#include "core/world.h"

typedef struct {
  dp_mb *mbs; /* the plan's micro-batches truncated to `rows` */
  dp_op *ops;
  uint8_t *sync;             /* per stage: the devices meet at its end (dp__exec_sync) */
  int n_ops, n_stages, rows; /* rows the ops were built for; 0 = none */
  /* Ops [commit, n_ops) are the commit phase: from the first op that writes
   * state a failed step must leave alone (the optimizer stage) to the end.
   * n_ops when there is none (inference). Always the start of a stage. */
  int commit;
} dp_sched_cache;

/* Host words arenas are read through (guards, high water, hash): the host
 * never dereferences an arena itself, whatever the backend. */
#define DP_CTX_BOUNCE_WORDS 4096
/* Graph slots the context keeps (backends may offer fewer). */
#define DP_CTX_GRAPH_SLOTS 4

struct dp_ctx {
  const dp_plan *plan;
  const dp_backend_ops *be; /* the plan's backend */
  /* A multi-process context (plan ranks > 1): its world, its rank, and the
   * used devices it holds, [dev0, dev1); one process: NULL, 0, all of them.
   * Only these devices have arenas here. */
  dp_world_tx *world;
  int rank, dev0, dev1;
  /* backend memory, reached only through dp__ctx_read / dp__ctx_write (or
   * the backend's ops) */
  unsigned char *arena[DP_MAX_DEVICES];
  bool owns_arenas;
  void *bctx;             /* the backend's context (NULL for a stateless one) */
  unsigned char *staging; /* be->host_staging: the staging arena (dp_plan_host_bytes) */
  uint32_t *bounce;       /* DP_CTX_BOUNCE_WORDS host words */
  /* graphs (be->n_graph_slots), per slot (see ctx.c graph_slot): a plain
   * step of this shape has run, so the next one may be captured */
  bool graph_warm[DP_CTX_GRAPH_SLOTS];
  bool graph_broken[DP_CTX_GRAPH_SLOTS]; /* its capture failed: runs plain */
  /* the schedules: a training step, a forward, and (config.accumulate) a
   * training call that only accumulates */
  dp_sched_cache train, infer, accum;
  dp_exec exec;
  bool exec_live;
  bool replicas_stale;
  uint64_t step;
  float lr;         /* the learning rate in effect: config.lr, then dp_set_lr's */
  float momentum;   /* the momentum in effect (SGD's, Adam's beta1): dp_set_momentum */
  float grad_norm;  /* config.clip_grad_norm: the last step's (dp_ctx_grad_norm) */
  int accum_k;      /* config.accumulate: calls accumulated since the last update */
  uint64_t skipped; /* steps skipped under DP_NONFINITE_SKIP */
  /* the cross-entropy options' counts (ctx.c, ce_denominator): this rank's,
   * the sum, another rank's */
  int64_t ce_counts[3 * DP_MAX_CLASS_WEIGHTS];
  int inject_at;    /* test hook: schedule index that fails in the next run, -1 none */
  /* Nonzero: state can no longer be trusted (a guard was hit, or an op of a
   * commit phase failed); step and forward return it with poison_msg. */
  dp_status poison;
  char poison_msg[DP_ERRMSG_CAP];
  char error[DP_ERRMSG_CAP];
};

/* Records the thread's last error (already set by DP_FAIL) in the context;
 * returns s. */
dp_status dp__ctx_fail(dp_ctx *c, dp_status s);

/* Copies `bytes` at offset off of device d's region r to host memory dst, or
 * host memory src into it, through the backend (the only way the host
 * touches an arena). */
dp_status dp__ctx_read(const dp_ctx *c, int d, dp_region r, size_t off, void *dst,
                       size_t bytes);
dp_status dp__ctx_write(dp_ctx *c, int d, dp_region r, size_t off, const void *src,
                        size_t bytes);
/* Marks the context unusable (a failed update, a damaged guard); returns s. */
dp_status dp__ctx_poison(dp_ctx *c, dp_status s);
/* config.guards: fills every guard with the canary again, so that a context
 * whose kept state was just rewritten whole (dp_ckpt_load) checks clean; DP_OK
 * without guards. */
dp_status dp__ctx_rearm_guards(dp_ctx *c);

/* A multi-process context (lib/mpi/): ranks > 1, its world ops and state
 * (taken over: freed on failure too); arenas NULL to allocate them, else the
 * caller's, indexed by global device. */
dp_status dp__ctx_create_world(const dp_plan *p, void *const arenas[], void *host,
                               const dp_world_ops *wo, void *w, dp_ctx **out);

/* Across processes (collective; one process: s, and nothing is done): rank
 * 0's outcome s, which every rank returns (its message, "rank 0: ...");
 * bytes at buf from rank root to every rank. */
dp_status dp__ctx_root_status(dp_ctx *c, dp_status s);
/* Across processes (collective): every rank's outcome s combined, the same
 * status (the first failing rank's message) on every rank; one process: s. */
dp_status dp__ctx_agree(dp_ctx *c, dp_status s);
dp_status dp__ctx_bcast(dp_ctx *c, int root, void *buf, size_t bytes);
/* This process writes the job's files (one process, or rank 0). */
static inline bool dp__ctx_writes_files(const dp_ctx *c) { return c->rank == 0; }

/* Benchmark hook (dp bench comm): runs the ops of phase ph of the training
 * schedule of `rows` rows, iters times, on whatever the arenas hold (every
 * rank of a job, together). */
dp_status dp__ctx_run_phase(dp_ctx *c, int rows, dp_phase ph, int iters);

/* ---- test hooks (tests/test_faults.c, tests/test_guards.c) ---- */
/* The op at schedule index k of the next executor run (dp_train_step or
 * dp_forward, whichever comes first) fails with DP_ERR_BACKEND instead of
 * running; k < 0 disarms. Deterministic: an index into the schedule, not a
 * count of ops as threads happen to run them. */
void dp__ctx_inject_fault(dp_ctx *c, int k);
/* The schedule a call of `rows` rows will run (training or inference) and
 * its commit index (see dp_sched_cache). */
dp_status dp__ctx_schedule(dp_ctx *c, int rows, bool training, const dp_op **ops,
                           int *n_ops, int *commit);

/* The PARAMS region's floats of device 0 (the parameters, then the buffers:
 * dp__param_floats), as dp_set_params sets the parameters (agreed across
 * processes; the replicas are stale after it). */
dp_status dp__ctx_set_state(dp_ctx *c, const float *in);

#endif
