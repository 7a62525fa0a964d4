/* The CUDA backend's vtables (lib/core/backend.h) over the calls of dp_cuda.h,
 * and its registration, dp_cuda_register. Plain C, so that designated
 * initialisers name every slot. The emulated GPU (tests/emul) implements the
 * same dp_cuda.h calls on the CPU and is registered through this same file,
 * so every CI run exercises this adapter too. */
#include "dp_cuda.h"
#include "core/backend.h"

/* Status words, per-step scalars and cuBLAS's workspace (dp_cuda.h): the same
 * on every device whatever the model; then conv2d's COL and T, or the
 * attention's scratch (training), for the
 * largest micro-batch (dp__cuda_model_workspace_bytes), which forward and
 * backward share. */
static size_t cuda_workspace_bytes(const dp_plan *p, int d) {
  const dp_model *m = &p->model;
  const dp_config *c = &p->cfg;
  int mb_rows = p->act[d].mb_rows;
  if (c->precision == DP_PRECISION_BF16)
    return dp__cuda_mixed_workspace_bytes(m, mb_rows, !c->inference);
  return dp__cuda_model_workspace_bytes(m, mb_rows, !c->inference);
}

/* The cuda backend's options (dp_config.backend_options); the deprecated
 * dp_config fields cuda_graph, tf32, transport and fast_collectives map onto
 * them (lib/core/options.c). The plan hash covers them in this order. */
enum { OPT_GRAPH, OPT_TF32, OPT_TRANSPORT, OPT_FAST_COLLECTIVES };
static const dp_backend_option cuda_options[] = {
    [OPT_GRAPH] = {"graph", "0|1",
                   "capture a step once and replay it as a CUDA graph (bit-identical)"},
    [OPT_TF32] = {"tf32", "0|1", "TF32 tensor cores for the FP32 GEMMs (~1e-3 relative)"},
    /* the words' indices are dp_transport's values */
    [OPT_TRANSPORT] = {"transport", "auto|copy|nccl",
                       "how replicas on distinct GPUs exchange: auto, device copies, NCCL"},
    [OPT_FAST_COLLECTIVES] = {"fast_collectives", "0|1",
                              "one ncclAllReduce instead of the canonical tree (allreduce "
                              "mode; bits depend on the topology)"},
    {NULL, NULL, NULL},
};

static unsigned cuda_features(const dp_config *c, const int *opt) {
  (void)c;
  return (opt[OPT_GRAPH] ? DP_FEATURE_GRAPHS : 0u) |
         (opt[OPT_FAST_COLLECTIVES] ? DP_FEATURE_COLLECTIVE : 0u);
}

/* The config on this backend, its options parsed. */
static dp_status cuda_check_config(const dp_config *c, const int *opt) {
  bool graph = opt[OPT_GRAPH], fast = opt[OPT_FAST_COLLECTIVES];
  dp_transport transport = (dp_transport)opt[OPT_TRANSPORT];
  if (fast && (c->mode != DP_MODE_ALLREDUCE || c->shard_optimizer ||
               transport == DP_TRANSPORT_COPY))
    return DP_FAIL(DP_ERR_INVALID,
                   "fast_collectives needs allreduce mode without a sharded "
                   "optimizer, and the NCCL transport");
  for (int d = 0; d < c->n_devices; d++)
    if (c->device_ids[d] < 0)
      return DP_FAIL(DP_ERR_INVALID, "device_ids[%d] is %d; GPU ids are >= 0", d,
                     c->device_ids[d]);
  /* One CUDA graph spanning several GPUs with NCCL kernels inside can deadlock
   * (NCCL documents it for several GPUs per process under capture): graphs go
   * with the copy transport (transport auto picks it for them). */
  if (graph && (transport == DP_TRANSPORT_NCCL || fast))
    return DP_FAIL(DP_ERR_INVALID,
                   "cuda_graph with the NCCL transport%s is refused: one graph across "
                   "several GPUs with NCCL inside can deadlock; use transport auto or copy "
                   "with graphs, or NCCL without them",
                   fast ? " (fast_collectives)" : "");
  if (c->ranks > 1 && (graph || transport == DP_TRANSPORT_COPY))
    return DP_FAIL(DP_ERR_INVALID,
                   "across processes (ranks %d) the cuda backend moves data between ranks "
                   "with NCCL and runs no graphs: %s is refused (use transport auto or "
                   "nccl, cuda_graph 0)",
                   c->ranks, graph ? "cuda_graph" : "transport copy");
  int e, d;
  /* NCCL wants a GPU per rank of a communicator: per replica in one process,
   * per replica of a process across processes (another host's GPU 0 is not
   * this one's) */
  int local = c->ranks > 1 ? c->n_devices / c->ranks : c->n_devices;
  if (c->ranks > 1) {
    for (int r = 0; r < c->ranks; r++)
      if (dp__shared_gpu_in(c, r * local, local, &e, &d))
        return DP_FAIL(DP_ERR_INVALID,
                       "across processes every replica of a rank needs a GPU of its own, "
                       "but replicas %d and %d (rank %d) are both on GPU %d",
                       e, d, r, c->device_ids[d]);
  } else if ((transport == DP_TRANSPORT_NCCL || fast) &&
             dp__shared_gpu(c, c->n_devices, &e, &d))
    return DP_FAIL(
        DP_ERR_INVALID,
        "the NCCL transport needs a GPU per replica, but replicas %d and %d are both on "
        "GPU %d (use transport auto or copy for replicas that share a GPU)",
        e, d, c->device_ids[d]);
  return DP_OK;
}

/* One cudaMalloc on the device's GPU; refuses, naming the device and the
 * bytes planned and free, before anything is allocated on a GPU that cannot
 * hold the plan. */
static dp_status cuda_arena_alloc(const dp_plan *p, int dev, void **out) {
  dp_status s = dp__cuda_arena_alloc(p->cfg.device_ids[dev], p->dev_bytes[dev], out);
  return s ? DP_FAIL(s, "device %d: %s", dev, dp_last_error()) : DP_OK;
}

static void cuda_arena_free(const dp_plan *p, int dev, void *arena) {
  dp__cuda_arena_free(p->cfg.device_ids[dev], arena);
}

/* Synchronous copies between the host and device dev's arena: on the
 * device's own stream through the context's pinned bounce block once there is
 * a context (waiting for this context's work only), before it one plain copy. */
static dp_status cuda_move(void *bctx, const dp_plan *p, int dev, void *dst,
                           const void *src, size_t bytes) {
  (void)p;
  return bctx ? dp__cuda_ctx_copy(bctx, dev, dst, src, bytes)
              : dp__cuda_memcpy(dst, src, bytes);
}

static dp_status cuda_fill(const dp_plan *p, int dev, void *dst, uint32_t value,
                           size_t count) {
  return dp__cuda_fill_u32(p->cfg.device_ids[dev], dst, value, count);
}

/* NCCL between replicas when asked, or by default when this build has it,
 * every replica has its own GPU and steps are not captured as graphs (see
 * cuda_check_config). */
static dp_status cuda_ctx_init(const dp_plan *p, void *const arenas[], void **bctx) {
  const int *opt = p->bopt;
  unsigned f = opt[OPT_TF32] ? DP_CUDA_TF32 : 0;
  int n = p->split.n_used, a, b;
  bool distinct = n > 1 && !dp__shared_gpu(&p->cfg, n, &a, &b);
  if (opt[OPT_TRANSPORT] == DP_TRANSPORT_NCCL || opt[OPT_FAST_COLLECTIVES] ||
      (opt[OPT_TRANSPORT] == DP_TRANSPORT_AUTO && distinct && !opt[OPT_GRAPH] &&
       dp__cuda_have_nccl()))
    f |= DP_CUDA_NCCL;
  return dp__cuda_ctx_init(p, arenas, f, bctx);
}

/* Across processes (config.ranks > 1): always NCCL, which pairs the halves of
 * a copy between ranks. */
static dp_status cuda_ctx_init_world(const dp_plan *p, void *const arenas[],
                                     const dp_backend_world *w, void **bctx) {
  unsigned f = (p->bopt[OPT_TF32] ? DP_CUDA_TF32 : 0) | DP_CUDA_NCCL;
  if (!dp__cuda_have_nccl())
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "the cuda backend across processes needs NCCL, which this build does "
                   "not have (configure.py found no nccl.h and libnccl.so)");
  return dp__cuda_ctx_init_world(p, arenas, f, w, bctx);
}

static bool cuda_graph_ready(const void *bctx, int slot) {
  return dp__cuda_graph_ready(bctx, slot) != 0;
}

static dp_status cuda_device_info(int dev, char *name, size_t cap, size_t *total_mem,
                                  size_t *free_mem) {
  return dp__cuda_device_info(dev, name, cap, total_mem, free_mem, NULL, NULL);
}

static const dp_transport_ops cuda_transport = {
    .name = "cuda",
    .copy = dp__cuda_copy,
    .peer = dp__cuda_peer,
    .collective = dp__cuda_collective,
};

static const dp_backend_ops cuda_backend = {
    .name = "cuda",
    .options = cuda_options,
    .features = cuda_features,
    .align = 256,       /* cudaMalloc's alignment, and cuBLAS's preferred one */
    .slice_align = 256, /* cuBLAS picks kernels by alignment: see dp_backend_ops */
    .workspace_bytes = cuda_workspace_bytes,
    .host_staging = true,      /* pinned: device copies run asynchronously */
    .grad_clip = true,         /* clipping: cuda/backend.cu */
    .grad_clip_value = true,   /* clamping: cuda/backend.cu */
    .accumulate = true,        /* accumulation: cuda/backend.cu */
    .image_layers = true,      /* conv2d, pools, flatten: cuda/conv.cu */
    .batchnorm = true,         /* both modes: cuda/batchnorm.cu */
    .sequence_layers = true,   /* embedding, attention, residual: cuda/sequence.cu */
    .attention_dropout = true, /* on the probabilities: cuda/sequence.cu */
    .mixed_bf16 = true,        /* precision bf16: cuda/mixed.cu */
    .reduce_bf16 = true,       /* reduce_precision bf16: cuda/kernels.cu */
    .fuses_linear_relu = true, /* the relu in the linear's bias kernel */
    .check_config = cuda_check_config,
    .arena_alloc = cuda_arena_alloc,
    .arena_free = cuda_arena_free,
    .host_alloc = dp__cuda_host_alloc,
    .host_free = dp__cuda_host_free,
    .check_host = dp__cuda_check_pinned,
    .read = cuda_move,
    .write = cuda_move,
    .fill_u32 = cuda_fill,
    .ctx_init = cuda_ctx_init,
    .ctx_free = dp__cuda_ctx_free,
    .transport = &cuda_transport,
    .run = dp__cuda_run,
    .stage_begin = dp__cuda_stage_begin,
    .stage_end = dp__cuda_stage_end,
    .set_lr = dp__cuda_set_lr,
    .set_momentum = dp__cuda_set_momentum,
    .set_loss_norm = dp__cuda_set_loss_norm,
    .step_begin = dp__cuda_step_begin,
    .step_end = dp__cuda_step_end,
    .grad_norm = dp__cuda_grad_norm,
    .ctx_init_world = cuda_ctx_init_world,
    .step_sync = dp__cuda_step_sync,
    .n_graph_slots = DP_CUDA_GRAPH_SLOTS,
    .capture_begin = dp__cuda_capture_begin,
    .capture_end = dp__cuda_capture_end,
    .capture_abort = dp__cuda_capture_abort,
    .graph_ready = cuda_graph_ready,
    .graph_launch = dp__cuda_graph_launch,
    .device_count = dp__cuda_device_count,
    .device_info = cuda_device_info,
    .bench_sgemm = dp__cuda_bench_sgemm,
};

dp_status dp_cuda_register(void) {
  return dp__backend_register(&cuda_backend, NULL); /* "cuda": DP_BACKEND_CUDA */
}
