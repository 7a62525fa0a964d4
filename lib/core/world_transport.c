/* The world transport: a multi-process context's transport. Copies whose two
 * ends are in this process go to the backend's own transport, and so do all
 * copies when that transport spans the processes itself (the cuda backend's
 * NCCL: inner_spans); otherwise a copy between
 * devices (or a host) of different ranks crosses through the world (the MPI
 * one: lib/mpi/mpi_world.c), one half on each rank: the rank of the source sends,
 * the rank of the destination receives. Each half is a persistent transfer
 * made when the schedule is built (dp__world_prepare), so a step only starts
 * and completes transfers. The transfers a device started complete before its
 * next compute op and at the end of its stage (flush), so both directions of
 * an exchange move at once. */
#include "core/world.h"

#include <stdlib.h>
#include <string.h>

static int rank_of_dev(const dp_world_tx *t, int dev) { return dev / t->local; }

/* The rank of a copy's end: a device's, or for the host that of the device
 * that executes the copy (each rank feeds its own rows). */
static int end_rank(const dp_world_tx *t, const dp_op *op, int dev) {
  return rank_of_dev(t, dev == DP_HOST ? op->device : dev);
}

/* op's position in the schedule it belongs to (the training or the inference
 * cache). */
static void locate(const dp_world_tx *t, const dp_op *op, int *cache, int *k) {
  for (int i = 0; i < 3; i++)
    if (t->sched[i] && op >= t->sched[i] && op < t->sched[i] + t->n_sched[i]) {
      *cache = i;
      *k = (int)(op - t->sched[i]);
      return;
    }
  *cache = -1;
  *k = -1;
}

static dp_status start_half(dp_world_tx *t, dp_exec_env *env, const dp_op *op,
                            bool host_src) {
  int cache, k;
  locate(t, op, &cache, &k);
  if (cache < 0)
    return DP_FAIL(DP_ERR_BACKEND,
                   "world transport: a copy outside the prepared schedules");
  const void *host =
      host_src ? dp__endpoint(env, DP_HOST, op->src_region, op->src_offset) : NULL;
  return t->ops->start(t->w, cache, k, host);
}

static dp_status w_copy(void *tctx, dp_exec_env *env, int dev, const dp_op *op) {
  dp_world_tx *t = tctx;
  int sr = end_rank(t, op, op->src_dev), dr = end_rank(t, op, op->dst_dev);
  if (t->inner_spans || (sr == t->rank && dr == t->rank))
    return t->inner->copy(t->inner_ctx, env, dev, op);
  return start_half(t, env, op, op->src_dev == DP_HOST);
}

/* Planned only between devices of one rank whose backend adds in place
 * (dp__copy_adds). */
static dp_status w_copy_add(void *tctx, dp_exec_env *env, int dev, const dp_op *op) {
  dp_world_tx *t = tctx;
  if (!t->inner->copy_add || end_rank(t, op, op->src_dev) != t->rank ||
      end_rank(t, op, op->dst_dev) != t->rank)
    return DP_FAIL(DP_ERR_BACKEND,
                   "world transport: an in-place add from device %d to device %d, which "
                   "are not both this rank's (%d)",
                   op->src_dev, op->dst_dev, t->rank);
  return t->inner->copy_add(t->inner_ctx, env, dev, op);
}

static dp_status w_peer(void *tctx, dp_exec_env *env, int dev, const dp_op *op) {
  dp_world_tx *t = tctx;
  if (t->inner_spans || rank_of_dev(t, op->device) == t->rank)
    return t->inner->peer ? t->inner->peer(t->inner_ctx, env, dev, op) : DP_OK;
  return start_half(t, env, op, false);
}

/* Only a backend whose transport spans the processes has collectives across
 * them (dp__world_prepare refuses them otherwise). */
static dp_status w_collective(void *tctx, dp_exec_env *env, int dev, const dp_op *op) {
  dp_world_tx *t = tctx;
  if (!t->inner_spans || !t->inner->collective)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "the transport's own collectives do not run across processes");
  return t->inner->collective(t->inner_ctx, env, dev, op);
}

static dp_status w_flush(void *tctx, dp_exec_env *env, int dev) {
  dp_world_tx *t = tctx;
  dp_status s = t->ops->wait(t->w, dev);
  if (!s && t->inner->flush) s = t->inner->flush(t->inner_ctx, env, dev);
  return s;
}

static const dp_transport_ops world_transport = {
    .name = "world",
    .copy = w_copy,
    .copy_add = w_copy_add,
    .peer = w_peer,
    .collective = w_collective,
    .flush = w_flush,
    .complete_after_failure = true,
};

dp_status dp__world_new(const dp_plan *p, const dp_world_ops *ops, void *w,
                        const dp_transport_ops *inner, bool inner_spans, void *inner_ctx,
                        dp_world_tx **out) {
  dp_world_tx *t = calloc(1, sizeof *t);
  if (!t) return DP_FAIL(DP_ERR_NOMEM, "world: out of memory");
  t->plan = p;
  t->ops = ops;
  t->w = w;
  t->rank = ops->rank;
  t->local = p->cfg.n_devices / dp__ranks(&p->cfg);
  t->inner = inner;
  t->inner_spans = inner_spans;
  t->inner_ctx = inner_ctx;
  t->transport = &world_transport;
  t->xfers = malloc((size_t)p->ops_cap * sizeof *t->xfers);
  if (!t->xfers) {
    free(t);
    return DP_FAIL(DP_ERR_NOMEM, "world: out of memory");
  }
  *out = t;
  return DP_OK;
}

void dp__world_free(dp_world_tx *t) {
  if (!t) return;
  if (t->ops && t->w) t->ops->free(t->w);
  free(t->xfers);
  free(t);
}

/* The local end of a cross-rank copy: device memory, or NULL for the host
 * (the world's bounce buffer). */
static void *local_end(const dp_world_tx *t, unsigned char *const arena[], int dev,
                       int region, size_t off) {
  if (dev == DP_HOST) return NULL;
  return dp__arena_region(t->plan, arena, dev, region) + off;
}

dp_status dp__world_prepare(dp_world_tx *t, int cache, const dp_op *ops, int n_ops,
                            unsigned char *const arena[]) {
  int n = 0;
  for (int k = 0; k < n_ops && !t->inner_spans; k++) {
    const dp_op *op = &ops[k];
    if (op->kind == DP_OP_ALLREDUCE)
      return DP_FAIL(DP_ERR_UNSUPPORTED,
                     "the transport's own collectives do not run across processes");
    if (op->kind != DP_OP_COPY) continue;
    int sr = end_rank(t, op, op->src_dev), dr = end_rank(t, op, op->dst_dev);
    if (sr == dr || (sr != t->rank && dr != t->rank)) continue;
    dp_world_xfer *x = &t->xfers[n++];
    x->k = k;
    x->bytes = op->bytes;
    x->send = sr == t->rank;
    x->peer = x->send ? dr : sr;
    int dev = x->send ? op->src_dev : op->dst_dev;
    if (dev == DP_HOST && !x->send)
      return DP_FAIL(DP_ERR_BACKEND, "world: op %d receives into another rank's host", k);
    x->buf = x->send ? local_end(t, arena, op->src_dev, op->src_region, op->src_offset)
                     : local_end(t, arena, op->dst_dev, op->dst_region, op->dst_offset);
    /* the thread that runs this half: the executing device, or the endpoint
     * device that takes the peer half */
    x->dev = rank_of_dev(t, op->device) == t->rank ? op->device : dev;
  }
  t->sched[cache] = ops;
  t->n_sched[cache] = n_ops;
  return t->ops->prepare(t->w, cache, t->xfers, n);
}
