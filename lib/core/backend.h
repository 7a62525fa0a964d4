/* The two seams between the core and a device: the backend and the
 * transport (docs/ARCHITECTURE.md), what ops see of a step, and the
 * registry (lib/core/registry.c). Not installed. */
#ifndef DP_BACKEND_H
#define DP_BACKEND_H

#include "core/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the two seams: backend and transport (ggml style; docs/ARCHITECTURE.md) ----
 * Everything the core (context, checkpoint, planner, executor) asks of a
 * device goes through dp_backend_ops; every byte that crosses a device
 * boundary through dp_transport_ops. The core never names a backend. */
typedef struct dp_exec_env dp_exec_env;
typedef struct dp_backend_world dp_backend_world;

typedef struct dp_transport_ops {
  const char *name;
  /* A COPY op, on the thread of the device that executes it (dev ==
   * op->device). Both ends are (device, region, offset) in the op: a device
   * of this context, or DP_HOST for the caller's memory (the region says
   * which buffer); dp__endpoint resolves them for a transport whose devices
   * share this address space. */
  dp_status (*copy)(void *tctx, dp_exec_env *env, int dev, const dp_op *op);
  /* Optional (NULL: one-sided transport). Two-sided transports (NCCL
   * send/recv) need the other endpoint to take part: the executor calls
   * peer() on the thread of device dev, the copy's other endpoint (not the
   * executing device, not the host), in the copy's stage, in list order, so
   * both sides see a pair's transfers in the same order. A transport returns
   * DP_OK and does nothing for pairs it moves one-sided. */
  dp_status (*peer)(void *tctx, dp_exec_env *env, int dev, const dp_op *op);
  /* Optional (NULL: the plan reduces through a copy into the comm region and a
   * GRAD_ADD). DP_OP_COPY_ADD: dst += src, float by float, in one pass, on the
   * thread of the device that executes it; only a transport whose devices
   * share this address space has it (the planner asks the backend's own
   * transport, and emits the op only between devices of one process). */
  dp_status (*copy_add)(void *tctx, dp_exec_env *env, int dev, const dp_op *op);
  /* Optional (NULL: the plan may not use them; the planner refuses
   * fast_collectives for backends without one). DP_OP_ALLREDUCE: device
   * dev's gradients summed in place with every other device's, by the
   * transport's own collective, on dev's thread. */
  dp_status (*collective)(void *tctx, dp_exec_env *env, int dev, const dp_op *op);
  /* Optional (NULL: every copy is done when it returns). A transport whose
   * copies only start transfers completes device dev's started ones here;
   * the executor calls it on dev's thread before dev's next compute op and
   * at the end of every stage. */
  dp_status (*flush)(void *tctx, dp_exec_env *env, int dev);
  /* Transfers whose other side is in another process: after a failure the
   * executor still runs every copy of the run (no compute), so that no peer
   * waits for a transfer this side skipped; the outcome is agreed after. */
  bool complete_after_failure;
} dp_transport_ops;

/* One of a backend's own options (dp_config.backend_options): a name and the
 * words it takes, "0|1" or "auto|copy|nccl"; its value is the word's index
 * (the first is the default). */
typedef struct {
  const char *name, *values, *help;
  /* dp_plan_fit may try its words (DP_FIT_BACKEND): every one gives the same
   * results, with other memory or speed (params=shared; not tf32) */
  bool fit;
} dp_backend_option;

/* What the core does differently for a backend's options (features): capture
 * and replay steps as graphs (the context's graph slots); sum gradients with
 * the transport's collective (DP_OP_ALLREDUCE, no receive buffers). */
enum {
  DP_FEATURE_GRAPHS = 1u << 0,
  DP_FEATURE_COLLECTIVE = 1u << 1,
  DP_FEATURE_SHARED_PARAMS = 1u << 2
};
/* DP_FEATURE_SHARED_PARAMS (host_memory backends; classic mode or inference):
 * the devices of one process read one copy of the parameters and buffers, their
 * first device's (dp__param_home): the others get no PARAMS region and no
 * broadcast, so a step moves and caches one copy of the weights fewer per
 * replica. The same bits: every replica read the same values before. */

/* What a context fills its arenas with before anything runs (gradients and
 * optimizer state zeroed): a NaN payload arithmetic never produces, so that
 * dp_ctx_high_water finds the last word an op wrote. A backend that runs ops
 * at context creation (the cuda backend's warm-up) puts it back. */
#define DP_CANARY 0x7fbadbadu

typedef struct dp_backend_ops {
  const char *name;
  /* Its options (terminated by a NULL name; NULL: none) and, optional, what
   * they make the core do: DP_FEATURE_* of a config and its parsed options. */
  const dp_backend_option *options;
  unsigned (*features)(const dp_config *c, const int *opt);
  /* ---- capabilities, plain data for the planner (no backend header needed) ----
   * Alignment of every region and arena; the WORKSPACE bytes device d of plan p
   * needs (what its ops touch, exactly where it can: dp_ctx_high_water); whether the
   * caller's inputs, targets and outputs pass through a pinned host staging arena (laid out
   * by the planner: dp_plan.host_x / host_t / host_y). workspace_bytes sees p's model,
   * config (training is !cfg.inference; precision may change what a layer needs),
   * segments (seg_lo, seg_hi: config.recompute), device d's micro-batches
   * (split.dev_mb0, mbs, act[d].mb_rows: its largest) and activation layout
   * (act[d]: dp__layer_operands works), but not the regions. */
  size_t align;
  /* Where a device holds several micro-batches, each one's rows of a row tensor
   * (inputs, activations, outputs, their gradients) start at a multiple of this,
   * so that a slice's alignment does not depend on how many micro-batches come
   * before it on its device (a GPU GEMM picks its kernel by alignment, and so its
   * bits). 0: packed (the cpu's kernels give the same bits at any alignment). */
  size_t slice_align;
  size_t (*workspace_bytes)(const dp_plan *p, int d);
  bool host_staging;
  /* runs DP_OP_GRAD_NORM and DP_OP_GRAD_CLIP (config.clip_grad_norm) */
  bool grad_clip;
  /* runs DP_OP_GRAD_CLAMP (config.clip_grad_value) */
  bool grad_clip_value;
  /* runs DP_OP_GRAD_ACCUM and DP_OP_GRAD_STASH (config.accumulate) */
  bool accumulate;
  /* its arenas are host memory that any thread of this process may address,
   * its ops are done when they return and it has no step, stage or graph
   * hooks: the executor may run an elementwise op's element ranges on several
   * device threads at once and leave out the barriers no data needs
   * (lib/core/exec.c: work sharing) */
  bool host_memory;
  /* runs conv2d, maxpool2d, avgpool2d and flatten layers */
  bool image_layers;
  /* runs batchnorm layers (and DP_OP_BN_UPDATE) */
  bool batchnorm;
  /* runs embedding, attention and residual layers */
  bool sequence_layers;
  /* runs attention with dropout on its probabilities */
  bool attention_dropout;
  /* runs config.precision bf16 (activations stored as bf16: dp__act_esz) */
  bool mixed_bf16;
  /* runs config.reduce_precision bf16: DP_OPF_* flags, GRAD_PACK and
   * GRAD_UNPACK (docs/PRECISION.md, "Gradient reduction") */
  bool reduce_bf16;
  /* computes a relu that follows a linear layer in the linear's forward
   * (dp__relu_fused): the plan keeps no buffer for the linear's own output */
  bool fuses_linear_relu;
  /* computes a relu that follows a conv2d layer in the conv's forward, in
   * fp32 plans (dp__relu_fused: no buffer for the conv's own output) */
  bool fuses_conv_relu;
  /* a maxpool2d after a fused relu writes the relu's input gradient, masked
   * by the relu's output (its own input), in fp32 plans (dp__relu_bwd_fused) */
  bool fuses_relu_maxpool;
  /* Optional: the config suits the backend, its options parsed (opt[i]: the
   * value of options[i]); DP_ERR_INVALID naming what does not otherwise. */
  dp_status (*check_config)(const dp_config *c, const int *opt);

  /* ---- memory: at context creation and free only, never in a step ----
   * One arena of dp_plan_device_bytes(p, dev) for device dev, aligned to
   * `align`; the staging arena (host_staging only); check_host: caller
   * memory handed to dp_ctx_create_static as the staging arena is usable
   * (optional). */
  dp_status (*arena_alloc)(const dp_plan *p, int dev, void **out);
  void (*arena_free)(const dp_plan *p, int dev, void *arena); /* NULL is fine */
  dp_status (*host_alloc)(size_t bytes, void **out);
  void (*host_free)(void *host);
  dp_status (*check_host)(const void *host);
  /* Host access to arena bytes between steps (the host never dereferences
   * an arena itself): copy from / to device dev's memory, synchronously
   * (bctx: the backend's context, NULL before ctx_init); fill count 32-bit
   * words (before ctx_init only). */
  dp_status (*read)(void *bctx, const dp_plan *p, int dev, void *dst, const void *src,
                    size_t bytes);
  dp_status (*write)(void *bctx, const dp_plan *p, int dev, void *dst, const void *src,
                     size_t bytes);
  dp_status (*fill_u32)(const dp_plan *p, int dev, void *dst, uint32_t value, size_t count);

  /* ---- the backend's context (optional: NULL for a stateless backend) ----
   * init runs after the arenas are filled; its bctx is also the transport's
   * tctx. free waits for queued work first. */
  dp_status (*ctx_init)(const dp_plan *p, void *const arenas[], void **bctx);
  void (*ctx_free)(void *bctx);
  const dp_transport_ops *transport;
  /* Optional: a backend that runs across processes (config.ranks > 1) by
   * itself: its context holds only this rank's devices, and its transport
   * moves the copies between ranks (both halves pair up across processes,
   * NCCL send/recv) and runs the collectives over every rank's devices, so
   * the world carries no bytes of a step for it. Set together with step_sync
   * when the backend is asynchronous. NULL: the world moves cross-rank bytes
   * (a synchronous backend whose memory the host can address). */
  dp_status (*ctx_init_world)(const dp_plan *p, void *const arenas[],
                              const dp_backend_world *world, void **bctx);
  /* Optional (asynchronous backends across processes): waits for everything
   * enqueued since step_begin and reports it as step_end would (status,
   * loss) without ending the step, so that the ranks can agree on the
   * pre-commit part before the commit part is enqueued. */
  dp_status (*step_sync)(void *bctx, float *loss);

  /* ---- a step ----
   * run: one compute op (FORWARD, BACKWARD, GRAD_ADD, ZERO, LOSS, LOSS_SUM,
   * GRAD_CHECK, OPTIMIZER) on the op's device thread.
   * stage_begin/stage_end (optional): asynchronous backends order their
   * queues with these: the executor calls them on device dev's thread for
   * every stage s of a run, also stages in which dev has no op and stages
   * after a failure: stage_begin before dev's first op of s, stage_end after
   * its last op of s and before the barrier that ends s. */
  dp_status (*run)(void *bctx, dp_exec_env *env, const dp_op *op);
  dp_status (*stage_begin)(void *bctx, int dev, int stage);
  dp_status (*stage_end)(void *bctx, int dev, int stage);
  /* Optional, together. NULL: a synchronous backend: an op has done its work
   * when it returns, so the context checks a step on the host between its
   * pre-commit and commit parts. Set: ops only enqueue; step_begin opens a
   * step (or forward) at counter `step`, the device refuses a non-finite or
   * out-of-range step by itself (no optimizer writes), and step_end is the
   * one synchronisation, reporting how the step went (DP_ERR_NONFINITE /
   * DP_ERR_RANGE: refused, nothing written; DP_ERR_BACKEND: the device
   * failed) and the loss. */
  dp_status (*step_begin)(void *bctx, uint64_t step);
  dp_status (*step_end)(void *bctx, float *loss);
  /* Optional (asynchronous backends with grad_clip): device 0's gradient norm
   * (config.clip_grad_norm) of the step that step_end or step_sync last
   * reported, as the cpu backend's clip op sets env->grad_norm (NaN: the
   * step did not reach its clipping, or device 0 is another rank's). */
  float (*grad_norm)(const void *bctx);
  /* Optional graphs of whole steps (n_graph_slots > 0): a capture records a
   * step (step_begin and the executor's runs) into a slot without running
   * it; a launch replays the slot at counter `step`; step_end follows as
   * after a plain step. */
  int n_graph_slots;
  dp_status (*capture_begin)(void *bctx);
  dp_status (*capture_end)(void *bctx, int slot);
  void (*capture_abort)(void *bctx);
  bool (*graph_ready)(const void *bctx, int slot);
  dp_status (*graph_launch)(void *bctx, int slot, uint64_t step);

  /* Optional: the learning rate changed between steps (dp_set_lr), for a
   * backend that keeps it on the device (in per-step scalars a graph replays);
   * NULL: the backend reads env->lr. */
  dp_status (*set_lr)(void *bctx, float lr);
  /* Optional: the same for the momentum (dp_set_momentum: SGD's momentum or
   * Adam's beta1); NULL: the backend reads env->momentum. */
  dp_status (*set_momentum)(void *bctx, float momentum);
  /* Optional: the next step's cross-entropy denominator and gradient scale
   * (dp_exec_env.loss_denom, loss_inv; models with dp__ce_has_opts), for a
   * backend that keeps them on the device; NULL: the backend reads env. */
  dp_status (*set_loss_norm)(void *bctx, float denom, float inv);
  /* Optional diagnostics (the public dp_cuda_* queries and dp bench): the
   * devices this backend can see (0 with the reason as the last error); the
   * name and memory of device dev; the time of one FP32 GEMM C (m, n) =
   * A (m, k) B (k, n) on it with the backend's math mode (tf32: TF32). */
  int (*device_count)(void);
  dp_status (*device_info)(int dev, char *name, size_t cap, size_t *total_mem,
                           size_t *free_mem);
  dp_status (*bench_sgemm)(int dev, int m, int n, int k, int iters, int tf32, double *ms,
                           double *tflops);
  /* Optional: the same for the bf16 GEMM of config.precision bf16 (bf16
   * operands, fp32 accumulation, bf16 output). */
  dp_status (*bench_gemm_bf16)(int dev, int m, int n, int k, int iters, double *ms);
} dp_backend_ops;

/* What a backend that runs across processes by itself (ctx_init_world) is
 * told of the job: this process's rank and devices [dev0, dev1) (global
 * indices), and a collective broadcast between processes for its set-up (the
 * NCCL unique id). */
struct dp_backend_world {
  int rank, ranks;
  int dev0, dev1;
  int timeout_ms; /* config.timeout_ms with its default filled in */
  dp_status (*bcast)(void *w, int root, void *buf, size_t bytes);
  void *w;
};

/* The backend_options strings dp_plan_fit tries for c (DP_FIT_BACKEND): c's
 * own, then c's with each combination of words of the backend's fit options
 * that c does not name (the first word, the default, left out), at most cap
 * in all; returns how many (at least 1; only c's own when c's options do not
 * parse: the plan refuses them then). */
int dp__fit_backend_options(const dp_config *c, char (*out)[DP_BACKEND_OPTIONS_CAP],
                            int cap);
/* The options of c for backend be into opt (every one, defaults included):
 * backend_options parsed, and the deprecated cuda fields of dp_config mapped
 * onto the options of those names (lib/core/options.c). */
dp_status dp__backend_options(const dp_backend_ops *be, const dp_config *c,
                              int opt[DP_MAX_BACKEND_OPTIONS]);
/* The backend registered for a backend kind (lib/backend.c); NULL when none
 * is (an unknown kind, or one whose library was not registered). */
const dp_backend_ops *dp__backend_ops(dp_backend kind);
/* Registers ops under its name (ops->name, shorter than DP_BACKEND_NAME_CAP):
 * *kind (may be NULL) is the kind a dp_config names it by; registering a
 * name again replaces its ops and keeps its kind ("cuda" has DP_BACKEND_CUDA).
 * Built-in backends (lib/builtin.c) cannot be replaced. */
#define DP_BACKEND_NAME_CAP 16
dp_status dp__backend_register(const dp_backend_ops *ops, dp_backend *kind);

/* What ops see of the context during a step. */
struct dp_exec_env {
  const dp_plan *plan;
  unsigned char *arena[DP_MAX_DEVICES];
  const dp_mb *mbs;
  const float *host_x; /* (rows, in) */
  const void *host_t;  /* targets */
  float *host_y;       /* (rows, out) inference outputs */
  int rows;
  bool training;
  uint64_t step;   /* step counter, keys dropout */
  float lr;        /* the learning rate in effect (dp_set_lr; config.lr at first) */
  float momentum;  /* SGD's momentum or Adam's beta1 in effect (dp_set_momentum) */
  float loss;      /* result of the loss op */
  float grad_norm; /* result of device 0's clip op (config.clip_grad_norm) */
  /* config.accumulate: this call's index in the accumulation, the rows its
   * loss gradient is scaled by (accumulate * rows), and the row of the
   * concatenation its first row is (dropout's key) */
  int accum_k, loss_rows, row_base;
  /* the cross-entropy options (dp__ce_has_opts): the mean's denominator, the
   * call's count or weight sum of non-ignored targets over every device and
   * process, and the gradient's scale 1 / (loss_denom accumulate) */
  float loss_denom, loss_inv;
  bool skip_broadcast; /* replicas already hold device 0's parameters */
  int host_row0;       /* the first row of this rank's host buffers */
};

/* Pointer to region r of device dev, given the arenas of p's devices: shared
 * parameters lie on their home device (dp__param_home). */
static inline unsigned char *
dp__arena_region(const dp_plan *p, unsigned char *const arena[], int dev, int r) {
  if (r == DP_REGION_PARAMS) dev = dp__param_home(p, dev);
  return arena[dev] + p->regions[dev][r].offset;
}

/* Pointer to region r of device d in env. */
static inline void *dp__region_ptr(const dp_exec_env *e, int dev, int r) {
  return dp__arena_region(e->plan, e->arena, dev, r);
}

/* The address of a transfer's end (device, region, offset) in this process:
 * a device arena of env, or for DP_HOST the caller's (or the staging
 * arena's) inputs, targets or outputs, as the region says. */
static inline void *dp__endpoint(const dp_exec_env *e, int dev, int region, size_t off) {
  if (dev == DP_HOST) {
    const dp_model *m = &e->plan->model;
    size_t out = (size_t)m->layers[m->n_layers - 1].out * 4;
    const void *base = region == DP_REGION_INPUTS    ? (const void *)e->host_x
                       : region == DP_REGION_TARGETS ? e->host_t
                                                     : (const void *)e->host_y;
    /* offsets count global rows; this rank's buffers start at host_row0 (a
     * sequence's row has a label per position) */
    size_t width = region == DP_REGION_INPUTS    ? (size_t)m->input_width * 4
                   : region == DP_REGION_TARGETS ? (size_t)dp_model_target_width(m) * 4
                                                 : out;
    return (unsigned char *)base + (off - (size_t)e->host_row0 * width);
  }
  return (unsigned char *)dp__region_ptr(e, dev, region) + off;
}

#ifdef __cplusplus
}
#endif

#endif
