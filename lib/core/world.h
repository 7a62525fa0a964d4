/* A multi-process context's world (lib/core/world_transport.c): the transport that sends a
 * copy's bytes to another rank through the world's ops, and the schedules'
 * persistent transfers. Not installed. */
#ifndef DP_WORLD_H
#define DP_WORLD_H

#include "core/backend.h"

/* ---- the world: the job's processes (lib/core/world_transport.c; MPI: lib/mpi/) ----
 * A context of a plan with ranks > 1 runs its own rank's devices; the bytes
 * of a copy between devices of different ranks cross through the world, one
 * half (send or receive) on each rank, as persistent transfers made when a
 * schedule is built. The core never names MPI. */
typedef struct {
  int k;     /* schedule index of the copy */
  int peer;  /* the other rank */
  int dev;   /* the local device whose thread runs this half */
  bool send; /* this rank's half sends (else receives) */
  void *buf; /* local end: arena memory, or the world's host bounce */
  size_t bytes;
} dp_world_xfer;

/* What every rank agrees on at the end of a run part (collective): the
 * failure that comes first (lowest `order`, then lowest rank) and rank 0's
 * value (the step's loss bits; the batch rows before a run). */
typedef struct {
  int32_t status; /* DP_OK or the failure */
  int32_t rank;   /* where it happened */
  int64_t order;  /* schedule index, or -1 for a failure before any op */
  int32_t rows_min, rows_max;
  uint32_t value, value2; /* rank 0's: the loss, the gradient norm */
  char msg[DP_ERRMSG_CAP - 32];
} dp_agreement;

typedef struct dp_world_ops {
  const char *name;
  int rank, size;
  /* Transfers of schedule cache `cache` (0: training, 1: inference, 2: an
   * accumulating call), replacing
   * its previous ones; xfers[i].k are increasing. */
  dp_status (*prepare)(void *w, int cache, const dp_world_xfer *xfers, int n);
  /* Starts transfer k of cache on device dev's thread; host: a host buffer
   * the world copies to its bounce first (a send from caller memory). */
  dp_status (*start)(void *w, int cache, int k, const void *host);
  /* Completes every transfer device dev started (bounded by the timeout). */
  dp_status (*wait)(void *w, int dev);
  /* Collective, on the calling thread: combines every rank's a into a. */
  dp_status (*agree)(void *w, dp_agreement *a);
  /* Collective, between steps: `bytes` at buf from rank root to every rank. */
  dp_status (*bcast)(void *w, int root, void *buf, size_t bytes);
  void (*free)(void *w);
} dp_world_ops;

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
