/* The context's state (lib/ctx.c), shared with the modules that save and
 * restore it (lib/checkpoint.c). Not installed. */
#ifndef DP_CTX_H
#define DP_CTX_H

#include "exec.h"

/* Arena words no op has written keep this NaN payload, which arithmetic never
 * produces; dp_ctx_high_water finds the last word that changed. */
#define DP_CANARY 0x7fbadbadu

typedef struct {
  dp_mb *mbs; /* the plan's micro-batches truncated to `rows` */
  dp_op *ops;
  int n_ops, n_stages, rows; /* rows the ops were built for; 0 = none */
  bool training;
} dp_sched_cache;

struct dp_ctx {
  const dp_plan *plan;
  unsigned char *arena[DP_MAX_DEVICES];
  bool owns_arenas;
  dp_sched_cache train, infer;
  dp_exec exec;
  bool exec_live;
  bool replicas_stale;
  uint64_t step;
  char error[DP_ERRMSG_CAP];
};

/* Records the thread's last error (already set by DP_FAIL) in the context;
 * returns s. */
dp_status dp__ctx_fail(dp_ctx *c, dp_status s);

#endif
