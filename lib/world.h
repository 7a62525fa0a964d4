/* A multi-process context's world (lib/world.c): the transport that sends a
 * copy's bytes to another rank through the world's ops, and the schedules'
 * persistent transfers. Not installed. */
#ifndef DP_WORLD_H
#define DP_WORLD_H

#include "internal.h"

typedef struct dp_world_tx {
  const dp_plan *plan;
  const dp_world_ops *ops;
  void *w;                       /* the world's own state (ops->free frees it) */
  int rank, local;               /* this process's rank; devices per rank */
  const dp_transport_ops *inner; /* the backend's transport, for copies in this process */
  bool inner_spans; /* ... and for every copy: it pairs halves across processes */
  void *inner_ctx;
  const dp_transport_ops *transport; /* the world transport (tctx: this struct) */
  const dp_op *sched[3];             /* the op arrays prepared (0: training, 1: inference,
                                        2: an accumulating call) */
  int n_sched[3];
  dp_world_xfer *xfers; /* (plan ops_cap) scratch for prepare */
} dp_world_tx;

/* On success the world transport owns w (dp__world_free frees it). */
dp_status dp__world_new(const dp_plan *p, const dp_world_ops *ops, void *w,
                        const dp_transport_ops *inner, bool inner_spans, void *inner_ctx,
                        dp_world_tx **out);
void dp__world_free(dp_world_tx *t);
/* Makes the persistent transfers of a schedule just built for `cache`. */
dp_status dp__world_prepare(dp_world_tx *t, int cache, const dp_op *ops, int n_ops,
                            unsigned char *const arena[]);

#endif
