/* Set-up and tear-down of the CUDA backend: per device one stream, events, a
 * cuBLAS handle and the status header (in the arena's WORKSPACE), peer access,
 * the NCCL communicators (DP_CUDA_NCCL), and the pinned block holding the
 * headers the step's one synchronisation reads back and the step's scalars.
 * Runs at context creation only: the step (backend.cu) allocates nothing. */
#include "backend.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" int dp__cuda_have_nccl(void) {
#ifdef DP_HAVE_NCCL
  return 1;
#else
  return 0;
#endif
}

/* ---- context ----------------------------------------------------------------------- */

extern "C" void dp__cuda_ctx_free(void *bctx) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  if (!c) return;
  if (c->capturing) dp__cuda_capture_abort(c);
#ifdef DP_HAVE_NCCL
  /* A failed context (a timeout, a device or NCCL error) may have NCCL kernels
   * waiting for a peer forever: abort the communicators first (ncclCommDestroy
   * would wait for them), and never block on a stream. Across processes
   * always: destroying a non-blocking communicator is a collective that
   * could wait on a peer process; every transfer ended at step_end. */
  if (c->failed || c->world)
    for (int d = c->d0; d < c->d1; d++)
      if (c->dev[d].comm) {
        if (ncclCommAbort(c->dev[d].comm) != ncclSuccess) (void)cudaGetLastError();
        c->dev[d].comm = NULL;
      }
#endif
  for (int d = c->d0; d < c->d1 && !c->failed;
       d++) { /* nothing may still run when things go */
    dev_ctx *x = &c->dev[d];
    if (!x->stream) continue;
    dp_cuda_device_scope scope;
    if (scope.enter(x->phys) == DP_OK) DP_CUDA_TRY(cudaStreamSynchronize(x->stream));
  }
  if (c->d0 == 0 && c->d1 > 0) { /* graphs first: they may hold NCCL operations of the
                                    comms (one process only: graphs and ev_fork are
                                    device 0's) */
    dp_cuda_device_scope scope;
    if (scope.enter(c->dev[0].phys) == DP_OK) {
      for (int k = 0; k < DP_CUDA_GRAPH_SLOTS; k++)
        if (c->graph[k]) DP_CUDA_TRY(cudaGraphExecDestroy(c->graph[k]));
      if (c->ev_fork) DP_CUDA_TRY(cudaEventDestroy(c->ev_fork));
    }
  }
#ifdef DP_HAVE_NCCL
  /* One thread may destroy every communicator of an ncclCommInitAll clique:
   * the last destroy finalizes them all (NCCL's commReclaim). */
  for (int d = c->d0; d < c->d1; d++)
    if (c->dev[d].comm && ncclCommDestroy(c->dev[d].comm) != ncclSuccess) {
      (void)cudaGetLastError();
      DP_FAIL(DP_ERR_BACKEND, "device %d: ncclCommDestroy failed: %s", d,
              ncclGetLastError(NULL) ? ncclGetLastError(NULL) : "?");
    }
#endif
  for (int d = c->d0; d < c->d1; d++) {
    dev_ctx *x = &c->dev[d];
    if (!x->stream && !x->blas && !x->ev[0] && !x->ev[1] && !x->ev_join) continue;
    dp_cuda_device_scope scope;
    if (scope.enter(x->phys) != DP_OK) continue;
    if (x->blas) (void)cublasDestroy(x->blas);
    for (int i = 0; i < 2; i++)
      if (x->ev[i]) DP_CUDA_TRY(cudaEventDestroy(x->ev[i]));
    if (x->ev_join) DP_CUDA_TRY(cudaEventDestroy(x->ev_join));
    if (x->stream) DP_CUDA_TRY(cudaStreamDestroy(x->stream));
  }
  if (c->host_hdr) DP_CUDA_TRY(cudaFreeHost(c->host_hdr));
  if (c->bounce) DP_CUDA_TRY(cudaFreeHost(c->bounce));
  if (dp__cuda_tl_ctx == c) {
    dp__cuda_tl_ctx = nullptr;
    dp__cuda_tl_dev = -1;
  }
  free(c);
}

static dp_status init_device(cuda_ctx *c, int d) {
  const dp_plan *p = c->plan;
  dev_ctx *x = &c->dev[d];
  dp_cuda_device_scope scope;
  dp_status s = scope.enter(x->phys);
  if (s != DP_OK) return DP_FAIL(s, "device %d: %s", d, dp_last_error());
  cudaPointerAttributes a;
  DP_CUDA_CHECK_D(d, cudaPointerGetAttributes(&a, x->arena));
  if ((a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) ||
      a.device != x->phys)
    return DP_FAIL(DP_ERR_INVALID, "device %d: its arena %p is not memory of GPU %d", d,
                   (void *)x->arena, x->phys);
  DP_CUDA_CHECK_D(d, cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking));
  for (int i = 0; i < 2; i++)
    DP_CUDA_CHECK_D(d, cudaEventCreateWithFlags(&x->ev[i], cudaEventDisableTiming));
  DP_CUDA_CHECK_D(d, cudaEventCreateWithFlags(&x->ev_join, cudaEventDisableTiming));
  if (d == 0) /* graph.cu's fork event is recorded on device 0's stream */
    DP_CUDA_CHECK_D(d, cudaEventCreateWithFlags(&c->ev_fork, cudaEventDisableTiming));
  unsigned char *ws = x->arena + p->regions[d][DP_REGION_WORKSPACE].offset;
  x->hdr = (dp_cuda_header *)ws;
  s = dp__cuda_blas_create(x->stream, ws + DP_CUDA_WS_HEADER_BYTES, DP_CUDA_BLAS_WS_BYTES,
                           (c->flags & DP_CUDA_TF32) != 0, &x->blas);
  if (s != DP_OK) return DP_FAIL(s, "device %d: %s", d, dp_last_error());
  const dp_ce_opts *ce = &p->model.ce; /* class weights: in the header area, for good */
  if (p->model.loss == DP_LOSS_SOFTMAX_CE && ce->n_weights)
    DP_CUDA_CHECK_D(d, cudaMemcpy(dp_cuda_ce_weights(x->hdr), ce->weights,
                                  (size_t)ce->n_weights * 4, cudaMemcpyHostToDevice));
  if (p->model.loss == DP_LOSS_BCE_LOGITS && p->model.n_pos_weight) /* the same place */
    DP_CUDA_CHECK_D(d,
                    cudaMemcpy(dp_cuda_ce_weights(x->hdr), p->model.pos_weight,
                               (size_t)p->model.n_pos_weight * 4, cudaMemcpyHostToDevice));
  return DP_OK;
}

/* Peer access between the distinct GPUs in use, where the hardware has it.
 * Only a speed-up: cudaMemcpyPeerAsync works without it (through host
 * memory), so a refusal (cudaErrorTooManyPeers, say) is not an error. Each
 * ordered pair of GPUs is visited once: at the first logical devices that
 * have them. */
static dp_status enable_peers(cuda_ctx *c) {
  for (int a = c->d0; a < c->d1; a++)
    for (int b = c->d0; b < c->d1; b++) {
      int pa = c->dev[a].phys, pb = c->dev[b].phys;
      if (pa == pb) continue;
      bool seen = false;
      for (int k = c->d0; k < a && !seen; k++) seen = c->dev[k].phys == pa;
      for (int k = c->d0; k < b && !seen; k++) seen = c->dev[k].phys == pb;
      if (seen) continue;
      int can = 0;
      DP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, pa, pb));
      if (!can) continue;
      dp_cuda_device_scope scope;
      dp_status s = scope.enter(pa);
      if (s != DP_OK) return s;
      if (cudaDeviceEnablePeerAccess(pb, 0) != cudaSuccess) (void)cudaGetLastError();
    }
  return DP_OK;
}

/* DP_CUDA_NCCL: one communicator per logical device, rank d on GPU
 * device_ids[d] (ncclCommInitAll creates the whole clique from this one
 * thread). The calling thread's device is restored. */
static dp_status init_nccl(cuda_ctx *c) {
#ifdef DP_HAVE_NCCL
  int devs[DP_MAX_DEVICES];
  ncclComm_t comms[DP_MAX_DEVICES];
  for (int d = c->d0; d < c->d1; d++) devs[d] = c->dev[d].phys;
  int prev = 0;
  DP_CUDA_CHECK(cudaGetDevice(&prev));
  ncclResult_t r = ncclCommInitAll(comms, c->n, devs);
  if (cudaSetDevice(prev) != cudaSuccess) (void)cudaGetLastError();
  if (r != ncclSuccess) {
    const char *l = ncclGetLastError(NULL);
    (void)cudaGetLastError();
    return DP_FAIL(DP_ERR_BACKEND,
                   "ncclCommInitAll over %d GPUs (GPU %d first): %s (last NCCL "
                   "error: %s)",
                   c->n, devs[0], ncclGetErrorString(r), l && *l ? l : "none");
  }
  for (int d = c->d0; d < c->d1; d++) c->dev[d].comm = comms[d];
  c->nccl = true;
  return DP_OK;
#else
  (void)c;
  return DP_FAIL(DP_ERR_UNSUPPORTED,
                 "dp__cuda_ctx_init: DP_CUDA_NCCL, but this build has no "
                 "NCCL (configure.py found no nccl.h and libnccl.so)");
#endif
}

/* Across processes: one communicator per local device, rank = global device,
 * over every rank's devices (ncclCommInitRankConfig, non-blocking, so that a
 * rank that never comes ends in an error within the timeout). Rank 0 makes
 * the unique id and the world broadcasts it (with rank 0's verdict, so that
 * a failure there does not leave the others waiting for an id). */
static dp_status init_nccl_world(cuda_ctx *c, const dp_backend_world *w) {
#ifdef DP_HAVE_NCCL
  struct {
    ncclUniqueId id;
    int32_t ok;
  } msg;
  memset(&msg, 0, sizeof msg);
  const char *why = "";
  if (w->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&msg.id);
    msg.ok = r == ncclSuccess;
    if (!msg.ok) why = ncclGetErrorString(r);
  }
  dp_status s = w->bcast(w->w, 0, &msg, sizeof msg);
  if (s != DP_OK) return s;
  if (!msg.ok)
    return DP_FAIL(DP_ERR_BACKEND, "rank 0 could not make the NCCL unique id%s%s",
                   *why ? ": " : "", why);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  int prev = 0;
  DP_CUDA_CHECK(cudaGetDevice(&prev));
  ncclResult_t r = ncclGroupStart();
  for (int d = c->d0; d < c->d1 && (r == ncclSuccess || r == ncclInProgress); d++) {
    if (cudaSetDevice(c->dev[d].phys) != cudaSuccess) {
      (void)cudaGetLastError();
      r = ncclInvalidUsage;
      break;
    }
    r = ncclCommInitRankConfig(&c->dev[d].comm, c->n, msg.id, d, &cfg);
  }
  ncclResult_t g = ncclGroupEnd();
  if (r == ncclSuccess || r == ncclInProgress) r = g;
  if (cudaSetDevice(prev) != cudaSuccess) (void)cudaGetLastError();
  if (r != ncclSuccess && r != ncclInProgress) {
    const char *l = ncclGetLastError(NULL);
    (void)cudaGetLastError();
    for (int d = c->d0; d < c->d1; d++)
      if (c->dev[d].comm && ncclCommAbort(c->dev[d].comm) != ncclSuccess)
        (void)cudaGetLastError();
    for (int d = c->d0; d < c->d1; d++) c->dev[d].comm = NULL;
    return DP_FAIL(DP_ERR_BACKEND,
                   "ncclCommInitRankConfig for devices %d..%d of %d: %s (last NCCL error: "
                   "%s)",
                   c->d0, c->d1 - 1, c->n, ncclGetErrorString(r), l && *l ? l : "none");
  }
  c->nccl = true;
  /* each communicator is ready once NCCL stops answering ncclInProgress */
  for (int d = c->d0; d < c->d1; d++)
    if ((s = dp__cuda_nccl_issued(c, d, ncclInProgress, "ncclCommInitRankConfig")) != DP_OK)
      return s;
  return DP_OK;
#else
  (void)c, (void)w;
  return DP_FAIL(DP_ERR_UNSUPPORTED,
                 "the cuda backend across processes needs NCCL, which this build does not "
                 "have (configure.py found no nccl.h and libnccl.so)");
#endif
}

#ifdef DP_HAVE_NCCL
/* Device d's stream has run everything enqueued, NCCL's errors polled meanwhile,
 * within the context's timeout (a peer process that never came ends in an error). */
static dp_status settle_nccl(cuda_ctx *c, int d, double deadline) {
  dev_ctx *x = &c->dev[d];
  for (;;) {
    cudaError_t e = cudaStreamQuery(x->stream);
    if (e == cudaSuccess) return DP_OK;
    if (e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      return DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaStreamQuery",
                          "device %d: connecting the NCCL peers", d);
    }
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(x->comm, &r) != ncclSuccess) r = ncclSystemError;
    if (r != ncclSuccess && r != ncclInProgress) {
      const char *l = ncclGetLastError(x->comm);
      return DP_FAIL(DP_ERR_BACKEND,
                     "device %d: connecting the NCCL peers: %s (last NCCL error: %s)", d,
                     ncclGetErrorString(r), l && *l ? l : "none");
    }
    if (dp__cuda_now() > deadline)
      return DP_FAIL(DP_ERR_BACKEND,
                     "device %d: connecting the NCCL peers took more than %d ms (a peer "
                     "process that never came?)",
                     d, c->timeout_ms);
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
}

/* The plan's NCCL links: from[a][b], device a sends to device b in some step
 * (a copy whose ends are two devices; across processes also a host end, which is
 * its executing device's, cuda/backend.cu's cross_process). */
static void nccl_links(const cuda_ctx *c, bool (*from)[DP_MAX_DEVICES]) {
  const dp_op *ops = dp_plan_ops(c->plan);
  for (int i = 0; i < dp_plan_n_ops(c->plan); i++) {
    const dp_op *op = &ops[i];
    if (op->kind != DP_OP_COPY) continue;
    int a = op->src_dev >= 0 ? op->src_dev : op->device;
    int b = op->dst_dev >= 0 ? op->dst_dev : op->device;
    if (a != b && ((op->src_dev >= 0 && op->dst_dev >= 0) || c->world)) from[a][b] = true;
  }
}

/* NCCL links a pair of ranks at their first transfer and a communicator at its
 * first all-reduce, allocating buffers and handshaking then: in the first step,
 * had it been left to itself (issue 28, finding 4). So every link the plan's
 * steps use is made here: one float to each peer a device sends to and from each
 * it receives from, in the loss ops' scratch of its workspace (no step has data
 * there yet), in one group; then each of the plan's all-reduces once, on the
 * gradients it reduces (every step writes them before it reduces them). */
static dp_status connect_nccl(cuda_ctx *c) {
  bool from[DP_MAX_DEVICES][DP_MAX_DEVICES] = {};
  nccl_links(c, from);
  double deadline = dp__cuda_now() + 1e-3 * c->timeout_ms;
  ncclResult_t r = ncclGroupStart();
  for (int d = c->d0; d < c->d1 && r == ncclSuccess; d++) {
    dev_ctx *x = &c->dev[d];
    dp_cuda_device_scope scope;
    if (scope.enter(x->phys) != DP_OK)
      return DP_FAIL(DP_ERR_BACKEND, "%s", dp_last_error());
    float *buf = dp_cuda_loss_chunks(x->hdr); /* [0]: sent; [1 + peer]: received */
    for (int e = 0; e < c->n && r == ncclSuccess; e++) {
      if (from[d][e]) r = ncclSend(buf, 1, ncclFloat32, e, x->comm, x->stream);
      if (from[e][d] && r == ncclSuccess)
        r = ncclRecv(buf + 1 + e, 1, ncclFloat32, e, x->comm, x->stream);
    }
  }
  ncclResult_t g = ncclGroupEnd();
  if (r == ncclSuccess) r = g;
  for (int d = c->d0; d < c->d1; d++) {
    dp_status s = dp__cuda_nccl_issued(c, d, r, "ncclSend/ncclRecv (connecting)");
    if (s != DP_OK) return s;
  }
  /* the all-reduces: the k-th of every device together, as a step issues them */
  const dp_op *ops = dp_plan_ops(c->plan);
  int n_ops = dp_plan_n_ops(c->plan), at[DP_MAX_DEVICES];
  for (int d = c->d0; d < c->d1; d++) at[d] = 0;
  for (;;) {
    bool any = false;
    r = ncclGroupStart();
    for (int d = c->d0; d < c->d1; d++) {
      while (at[d] < n_ops &&
             (ops[at[d]].kind != DP_OP_ALLREDUCE || ops[at[d]].device != d))
        at[d]++;
      if (at[d] == n_ops || r != ncclSuccess) continue;
      const dp_op *op = &ops[at[d]++];
      dev_ctx *x = &c->dev[d];
      dp_cuda_device_scope scope;
      if (scope.enter(x->phys) != DP_OK) break;
      float *gr =
          (float *)(x->arena + c->plan->regions[d][op->dst_region].offset + op->dst_offset);
      r = ncclAllReduce(gr, gr, op->bytes / 4, ncclFloat32, ncclSum, x->comm, x->stream);
      any = true;
    }
    g = ncclGroupEnd();
    if (r == ncclSuccess) r = g;
    for (int d = c->d0; d < c->d1 && any; d++) {
      dp_status s = dp__cuda_nccl_issued(c, d, r, "ncclAllReduce (connecting)");
      if (s != DP_OK) return s;
    }
    if (!any) break;
  }
  for (int d = c->d0; d < c->d1; d++) {
    dp_cuda_device_scope scope;
    dp_status s = scope.enter(c->dev[d].phys);
    if (s == DP_OK) s = settle_nccl(c, d, deadline);
    if (s != DP_OK) return s;
  }
  return DP_OK;
}
#endif

/* cuBLAS's lazy kernel loads, done now (cuda/backend.cu, dp__cuda_warm_device): on
 * scratch memory of its own, freed again, so that no region's content changes. */
static dp_status warm_gemms(cuda_ctx *c) {
  size_t each = (dp__cuda_warm_bytes(c->plan) + 255) / 256 * 256;
  for (int d = c->d0; d < c->d1; d++) {
    dp_cuda_device_scope scope;
    dp_status s = scope.enter(c->dev[d].phys);
    if (s != DP_OK) return s;
    void *scratch = NULL;
    DP_CUDA_CHECK_D(d, cudaMalloc(&scratch, 5 * each)); /* x, w, y, dx, dw */
    s = dp__cuda_warm_device(c, d, (unsigned char *)scratch, each);
    cudaError_t e = cudaFree(scratch);
    if (s != DP_OK) return s;
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaFree", "device %d: the warm-up's scratch",
                          d);
    }
  }
  return DP_OK;
}

static dp_status ctx_init(const dp_plan *p, void *const arenas[], unsigned flags,
                          const dp_backend_world *w, void **bctx_out) {
  if (!bctx_out) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init: out is NULL");
  *bctx_out = NULL;
  if (!p || !arenas)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init: plan or arenas is NULL");
  int n = p->split.n_used;
  if (n < 1 || n > DP_MAX_DEVICES)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init: %d devices", n);
  int d0 = w ? w->dev0 : 0, d1 = w ? w->dev1 : n;
  if (d0 < 0 || d1 > n || d0 >= d1)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init: devices %d..%d of %d", d0, d1 - 1,
                   n);
  if (w && !(flags & DP_CUDA_NCCL))
    return DP_FAIL(DP_ERR_INVALID,
                   "dp__cuda_ctx_init: across processes the copies between ranks need "
                   "NCCL (DP_CUDA_NCCL)");
  for (int d = d0; d < d1; d++) {
    dp_region_info ws = p->regions[d][DP_REGION_WORKSPACE];
    /* the fixed part, then conv2d's COL and T or the attention's scratch at
     * the device's largest micro-batch (dp__cuda_model_workspace_bytes) */
    size_t need =
        dp__cuda_model_workspace_bytes(&p->model, p->act[d].mb_rows, !p->cfg.inference);
    if (ws.size < need)
      return DP_FAIL(
          DP_ERR_INVALID,
          "device %d: the plan reserves %zu bytes of workspace; the CUDA backend "
          "needs %zu (%zu of status words + %zu for cuBLAS + %zu for conv2d's or "
          "attention's buffers: dp__cuda_model_workspace_bytes)",
          d, ws.size, need, DP_CUDA_WS_HEADER_BYTES, DP_CUDA_BLAS_WS_BYTES,
          need - DP_CUDA_CONV_WS_OFFSET);
    if (!arenas[d] || (uintptr_t)arenas[d] % 256 ||
        (ws.offset + DP_CUDA_WS_HEADER_BYTES) % 256)
      return DP_FAIL(DP_ERR_INVALID,
                     "device %d: arena %p or its workspace is not 256-aligned", d,
                     arenas[d]);
    if (p->cfg.device_ids[d] < 0)
      return DP_FAIL(DP_ERR_INVALID, "device %d: GPU id %d", d, p->cfg.device_ids[d]);
  }
  if (flags & ~(unsigned)(DP_CUDA_TF32 | DP_CUDA_NCCL))
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init: unknown flags 0x%x", flags);
  if (p->model.loss == DP_LOSS_SOFTMAX_CE && p->model.ce.n_weights > DP_CUDA_CE_WEIGHTS)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "the cuda backend keeps class weights for at most %d classes (the "
                   "workspace's header area); this model has %d",
                   DP_CUDA_CE_WEIGHTS, p->model.ce.n_weights);
  if (p->model.loss == DP_LOSS_BCE_LOGITS && p->model.n_pos_weight > DP_CUDA_CE_WEIGHTS)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "the cuda backend keeps bce_with_logits' pos_weight for at most %d "
                   "outputs (the workspace's header area); this model has %d: use the cpu "
                   "backend, or fewer outputs",
                   DP_CUDA_CE_WEIGHTS, p->model.n_pos_weight);
  if (flags & DP_CUDA_NCCL) {
    if (!dp__cuda_have_nccl())
      return DP_FAIL(DP_ERR_UNSUPPORTED,
                     "dp__cuda_ctx_init: DP_CUDA_NCCL, but this build has "
                     "no NCCL (configure.py found no nccl.h and libnccl.so)");
    /* NCCL gives a GPU one rank of a communicator; replicas sharing a GPU
     * copy device to device instead (no NCCL flag). */
    for (int d = d0; d < d1; d++)
      for (int e = d0; e < d; e++)
        if (p->cfg.device_ids[d] == p->cfg.device_ids[e])
          return DP_FAIL(DP_ERR_INVALID,
                         "dp__cuda_ctx_init: NCCL needs a GPU per replica, but "
                         "replicas %d and %d are both on GPU %d",
                         e, d, p->cfg.device_ids[d]);
  }
  cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
  if (!c) return DP_FAIL(DP_ERR_NOMEM, "dp__cuda_ctx_init: out of memory");
  c->plan = p;
  c->n = n;
  c->d0 = d0;
  c->d1 = d1;
  c->world = w != NULL;
  c->flags = flags;
  c->timeout_ms = p->cfg.timeout_ms > 0 ? p->cfg.timeout_ms : 60000;
  c->lr = p->cfg.lr;
  c->momentum = dp__config_momentum(&p->cfg);
  const char *dbg = getenv("DP_CUDA_DEBUG_DELAY_US");
  c->debug_delay_us = dbg ? (unsigned)strtoul(dbg, NULL, 10) : 0;
  dbg = getenv("DP_CUDA_DEBUG_FAULT_STEP");
  c->debug_fault_step = dbg ? strtoull(dbg, NULL, 10) : 0;
  for (int d = d0; d < d1; d++) {
    c->dev[d].phys = p->cfg.device_ids[d];
    c->dev[d].arena = (unsigned char *)arenas[d];
    c->dev[d].bytes = p->dev_bytes[d];
    c->dev[d].stage = -1;
  }
  dp_status s = DP_OK;
  for (int d = d0; d < d1 && s == DP_OK; d++) s = init_device(c, d);
  if (s == DP_OK) s = enable_peers(c);
  if (s == DP_OK) s = warm_gemms(c); /* before NCCL: no lazy cuBLAS load later */
  if (s == DP_OK && (flags & DP_CUDA_NCCL)) s = w ? init_nccl_world(c, w) : init_nccl(c);
#ifdef DP_HAVE_NCCL
  if (s == DP_OK && c->nccl) s = connect_nccl(c); /* no lazy NCCL connect in a step */
  if (s != DP_OK && c->nccl) c->failed = true;    /* free aborts, never waits */
#endif
  /* every kernel loaded now, not lazily during a step (CUDA_MODULE_LOADING=LAZY is
   * the default since 12.2: a kernel loaded while NCCL kernels spin can deadlock) */
  for (int d = d0; d < d1 && s == DP_OK; d++) {
    dp_cuda_device_scope scope;
    s = scope.enter(c->dev[d].phys);
    cudaError_t e = s == DP_OK ? dp_k_preload() : cudaSuccess;
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      s = DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaFuncGetAttributes",
                       "device %d: loading "
                       "the kernels",
                       d);
    }
  }
  if (s == DP_OK) {
    cudaError_t e =
        cudaHostAlloc((void **)&c->bounce, DP_CUDA_BOUNCE_BYTES, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      c->bounce = NULL;
      s = DP_CUDA_FAIL(dp__cuda_status_of(e), e, "cudaHostAlloc", "%s",
                       "pinned bounce block for host copies");
    }
  }
  if (s == DP_OK) {
    /* n headers read back by step_end, then the step's scalars: one pinned
     * block (the headers' size keeps the scalars 8-aligned) */
    static_assert(sizeof(dp_cuda_header) % 8 == 0, "scalars must stay aligned");
    size_t hb = (size_t)n * sizeof(dp_cuda_header);
    cudaError_t e = cudaHostAlloc((void **)&c->host_hdr, hb + sizeof(dp_cuda_step_scalars),
                                  cudaHostAllocPortable);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      c->host_hdr = NULL;
      s = DP_CUDA_FAIL(dp__cuda_status_of(e), e, "cudaHostAlloc", "%s",
                       "pinned status read-back block");
    } else {
      memset((void *)c->host_hdr, 0, hb + sizeof(dp_cuda_step_scalars));
      c->host_sc = (dp_cuda_step_scalars *)((unsigned char *)c->host_hdr + hb);
    }
  }
  if (s != DP_OK) {
    char msg[DP_ERRMSG_CAP];
    snprintf(msg, sizeof msg, "%s", dp_last_error());
    dp__cuda_ctx_free(c);
    return DP_FAIL(s, "%s", msg);
  }
  *bctx_out = c;
  return DP_OK;
}

extern "C" dp_status dp__cuda_ctx_init(const dp_plan *p, void *const arenas[],
                                       unsigned flags, void **bctx_out) {
  return ctx_init(p, arenas, flags, NULL, bctx_out);
}

extern "C" dp_status dp__cuda_ctx_init_world(const dp_plan *p, void *const arenas[],
                                             unsigned flags, const dp_backend_world *w,
                                             void **bctx_out) {
  if (!w) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init_world: no world");
  return ctx_init(p, arenas, flags, w, bctx_out);
}

/* ---- helpers for the context and tests --------------------------------------------- */

/* The GPU whose memory p is, or -1 for host memory. */
static dp_status device_of(const void *p, int *dev) {
  cudaPointerAttributes a;
  DP_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
  *dev = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
  return DP_OK;
}

extern "C" dp_status dp__cuda_memcpy(void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return DP_OK;
  if (!dst || !src) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_memcpy: NULL pointer");
  int dd, sd;
  dp_status s = device_of(dst, &dd);
  if (s == DP_OK) s = device_of(src, &sd);
  if (s != DP_OK) return s;
  /* cudaMemcpy runs on the legacy stream of the *current* device, and from pageable
   * memory it may return before the DMA into device memory has landed; the
   * backend's streams are non-blocking (no implicit order with the legacy stream).
   * So: copy with a GPU of the copy current, then wait for every GPU involved,
   * so that the next step reads what was written (the simulation showed a copy
   * into device 1 issued while device 0 was current, and waited for on device 1,
   * landing after the next op). Between steps only, so the cost does not matter. */
  int devs[2] = {dd, sd};
  {
    dp_cuda_device_scope scope;
    if (dd >= 0 || sd >= 0) {
      if ((s = scope.enter(dd >= 0 ? dd : sd)) != DP_OK) return s;
    }
    DP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  }
  for (int i = 0; i < 2; i++) {
    if (devs[i] < 0 || (i == 1 && devs[1] == devs[0])) continue;
    dp_cuda_device_scope scope;
    if ((s = scope.enter(devs[i])) != DP_OK) return s;
    DP_CUDA_CHECK(cudaDeviceSynchronize());
  }
  return DP_OK;
}

extern "C" dp_status dp__cuda_ctx_copy(void *bctx, int dev, void *dst, const void *src,
                                       size_t bytes) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  if (bytes == 0) return DP_OK;
  if (!c || dev < c->d0 || dev >= c->d1 || !dst || !src)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_copy: bad arguments");
  if (c->failed)
    return DP_FAIL(DP_ERR_BACKEND,
                   "device %d: the context failed earlier; its memory can "
                   "no longer be read or written",
                   dev);
  dev_ctx *x = &c->dev[dev];
  uintptr_t lo = (uintptr_t)x->arena, hi = lo + x->bytes;
  bool to_dev = (uintptr_t)dst >= lo && (uintptr_t)dst < hi;
  uintptr_t d0 = to_dev ? (uintptr_t)dst : (uintptr_t)src;
  if (!to_dev && !((uintptr_t)src >= lo && (uintptr_t)src < hi))
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_copy: neither end is device %d's arena",
                   dev);
  if (bytes > hi - d0)
    return DP_FAIL(DP_ERR_INVALID,
                   "dp__cuda_ctx_copy: %zu bytes run past device %d's arena", bytes, dev);
  dp_cuda_device_scope scope;
  dp_status s = scope.enter(x->phys);
  if (s != DP_OK) return s;
  for (size_t off = 0; off < bytes; off += DP_CUDA_BOUNCE_BYTES) {
    size_t m = bytes - off < DP_CUDA_BOUNCE_BYTES ? bytes - off : DP_CUDA_BOUNCE_BYTES;
    if (to_dev) {
      memcpy(c->bounce, (const unsigned char *)src + off, m);
      DP_CUDA_CHECK_D(dev, cudaMemcpyAsync((unsigned char *)dst + off, c->bounce, m,
                                           cudaMemcpyHostToDevice, x->stream));
      DP_CUDA_CHECK_D(dev, cudaStreamSynchronize(x->stream));
    } else {
      DP_CUDA_CHECK_D(dev, cudaMemcpyAsync(c->bounce, (const unsigned char *)src + off, m,
                                           cudaMemcpyDeviceToHost, x->stream));
      DP_CUDA_CHECK_D(dev, cudaStreamSynchronize(x->stream));
      memcpy((unsigned char *)dst + off, c->bounce, m);
    }
  }
  return DP_OK;
}

extern "C" dp_status dp__cuda_set_loss_norm(void *bctx, float denom, float inv) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_set_loss_norm: no context");
  c->loss_denom = denom; /* read by dp__cuda_host_step, as the rate */
  c->loss_inv = inv;
  return DP_OK;
}

extern "C" dp_status dp__cuda_set_lr(void *bctx, float lr) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_set_lr: no context");
  c->lr = lr; /* read by dp__cuda_host_step into the next step's scalars */
  return DP_OK;
}

extern "C" dp_status dp__cuda_set_momentum(void *bctx, float momentum) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_set_momentum: no context");
  c->momentum = momentum; /* the next step's scalars, as the rate */
  return DP_OK;
}

extern "C" dp_status dp__cuda_check_pinned(const void *p) {
  if (!p) return DP_FAIL(DP_ERR_INVALID, "host staging arena is NULL");
  cudaPointerAttributes a;
  DP_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
  if (a.type != cudaMemoryTypeHost)
    return DP_FAIL(DP_ERR_INVALID,
                   "host staging arena %p is not pinned host memory (it must come from "
                   "cudaHostAlloc or cudaMallocHost: asynchronous copies and graph capture "
                   "need it)",
                   p);
  return DP_OK;
}

extern "C" dp_status dp__cuda_fill_u32(int dev, void *dst, uint32_t value, size_t count) {
  if (count == 0) return DP_OK;
  if (!dst) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_fill_u32: NULL pointer");
  dp_cuda_device_scope scope;
  dp_status s = scope.enter(dev);
  if (s != DP_OK) return s;
  DP_CUDA_CHECK(dp_k_fill(0, (uint32_t *)dst, value, count));
  DP_CUDA_CHECK(cudaStreamSynchronize(0));
  return DP_OK;
}
