/* Internal structures shared by the library's modules. Not installed. */
#ifndef DP_INTERNAL_H
#define DP_INTERNAL_H

#include "dp.h"

#include <stdarg.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors (lib/error.c) ---- */
#define DP_ERRMSG_CAP 512
/* Records "file:line: message" as the thread's last error; returns s. */
dp_status dp__error(dp_status s, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define DP_FAIL(s, ...) dp__error((s), __FILE__, __LINE__, __VA_ARGS__)
void dp__error_clear(void);
/* Sets the thread's last error to text verbatim (a message saved across
 * clean-up calls that may record errors of their own). */
void dp__error_restore(const char *text);

/* ---- files the library reads (lib/file.c) ---- */
#include <sys/stat.h>
/* Opens path read-only if it is a regular file, never blocking (a FIFO without
 * a writer included): the fd, with *st filled; -2 when it is not a regular
 * file (*st says what it is: dp__file_kind); -1 with errno when a call failed
 * (*failed names it: "open", "stat", "read"). */
int dp__open_regular(const char *path, struct stat *st, const char **failed);
/* Reads up to n bytes of fd into b (going on after EINTR; fewer when the file
 * ends first): *got of them. DP_ERR_IO when a read fails:
 * dp__io_fail(what, path, "read", path, errno). fd stays open. */
dp_status dp__read_fd(int fd, void *b, size_t n, size_t *got, const char *what,
                      const char *path);
/* "a directory", "a FIFO", "a socket", "a character device", "a block device",
 * "a symbolic link" (from lstat), "a regular file". */
const char *dp__file_kind(mode_t mode);
/* DP_ERR_IO: "<what> '<path>': cannot <failed> it: <strerror>" (or "... cannot
 * <failed> '<file>': ..." when file is not path). */
dp_status dp__io_fail(const char *what, const char *path, const char *failed,
                      const char *file, int err);
/* Writes path atomically through dp_file_create / dp_file_commit (dp.h):
 * fill(f, arg) writes the content into the temporary file (DP_ERR_IO with
 * errno set when a write failed, or another status with its message). On
 * failure the temporary file is removed and path is as it was. `what` names
 * the file in messages ("checkpoint"). */
#include <stdio.h>
dp_status dp__write_atomic(const char *path, const char *what,
                           dp_status (*fill)(FILE *f, void *arg), void *arg);

/* ---- checked size arithmetic ---- */
static inline bool dp__mul(size_t a, size_t b, size_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}
static inline bool dp__add(size_t a, size_t b, size_t *out) {
  return !__builtin_add_overflow(a, b, out);
}
/* Bytes between partial-gradient slots in GRAD_PARTIALS (lib/plan.c). */
size_t dp__partial_stride(const dp_plan *p);

static inline bool dp__align_up(size_t x, size_t a, size_t *out) {
  size_t t;
  if (!dp__add(x, a - 1, &t)) return false;
  *out = t / a * a;
  return true;
}

/* ---- model (lib/model.c, lib/spec.c) ---- */
#define DP_MAX_LAYERS 256
#define DP_MAX_WIDTH 0x7fffffff
#define DP_MAX_MICRO_BATCHES (1 << 22) /* per planned batch */

typedef struct {
  dp_layer_kind kind;
  int in, out;      /* widths (floats per row) */
  int bias;         /* linear, conv2d */
  float p;          /* dropout */
  size_t param_off; /* first parameter (floats) in the flat array */
  size_t n_params;
  int c, h, w;        /* output shape; h == 0: flat (c == out) */
  int ic, ih, iw;     /* input shape, the same way */
  int k, stride, pad; /* conv2d, pools */
  size_t buf_off;     /* batchnorm: its buffers (floats after the parameters):
                         running_mean (c), running_var (c), num_batches_tracked
                         (one uint32 slot) */
} dp_layer;

struct dp_model {
  int input_width;
  int input_c, input_h, input_w; /* input_h == 0: flat (input_c == input_width) */
  int n_layers;
  dp_layer layers[DP_MAX_LAYERS];
  dp_loss_kind loss;
  size_t n_params;
  size_t n_buffers; /* floats after the parameters in PARAMS (batchnorm) */
};

/* A batchnorm's buffers: 2 c floats and the count. */
static inline size_t dp__bn_buffers(int c) { return 2 * (size_t)c + 1; }
/* Floats a batchnorm's forward saves per micro-batch: mean, rstd and the
 * unbiased variance per channel. */
static inline size_t dp__bn_stats(int c) { return 3 * (size_t)c; }
/* config.batchnorm = DP_BN_SYNC: a batchnorm's statistics area on a device
 * with n_mb planned micro-batches (floats from its stats offset; the parts
 * every device has first, so that they are at the same offset on each):
 *   the whole batch's: mean (c), rstd (c), unbiased variance (c), rows (one
 *     uint32 slot) -- the first 3 c as per_replica's micro-batch 0;
 *   backward sums: this device's (sum dy x-hat (c), sum dy (c): the weight's and
 *     bias's gradients), then one to receive into;
 *   forward partials, one to receive into, then a slot per micro-batch: rows
 *     (uint32 slot), mean (c), sum of squared deviations (c). */
static inline size_t dp__bn_sync_final(int c) { return 3 * (size_t)c + 1; }
static inline size_t dp__bn_sync_bwd(int c) { return dp__bn_sync_final(c); }
static inline size_t dp__bn_sync_part(int c) { return 1 + 2 * (size_t)c; }
static inline size_t dp__bn_sync_recv(int c) { return dp__bn_sync_bwd(c) + 4 * (size_t)c; }
static inline size_t dp__bn_sync_fwd(int c, int slot) {
  return dp__bn_sync_recv(c) + (size_t)(slot + 1) * dp__bn_sync_part(c);
}
static inline size_t dp__bn_sync_floats(int c, int n_mb) {
  return dp__bn_sync_fwd(c, n_mb);
}
/* The PARAMS region's floats: parameters, then buffers. */
static inline size_t dp__param_floats(const dp_model *m) {
  return m->n_params + m->n_buffers;
}

/* What a layer's backward reads from the forward pass. */
bool dp__layer_needs_input(dp_layer_kind k);
bool dp__layer_needs_output(dp_layer_kind k);
/* Per-row float count of saved statistics (layernorm: mean, rstd). */
int dp__layer_stats_width(dp_layer_kind k);
/* The layer whose activation buffer holds layer i's output: i itself, or for
 * a view (flatten) the layer it views, followed back; -1: the input. The last
 * layer's output is in OUTPUTS whatever it is (a flatten there copies). */
int dp__act_owner(const dp_model *m, int i);
static inline bool dp__layer_is_view(const dp_model *m, int i) {
  return m->layers[i].kind == DP_LAYER_FLATTEN && i < m->n_layers - 1;
}
/* conv2d's fan-in, in_channels * k * k; a linear's in. */
int dp__layer_fan_in(const dp_layer *l);

/* lib/conv.c: the image layers on the CPU, on n images of a micro-batch.
 * conv2d's workspace (im2col, the transposed output, the GEMMs' packing):
 * dp__conv_workspace_bytes, 0 for other layers; forward and backward return
 * false when ws_bytes is short (nothing written). w: (out, in, k, k) then the
 * bias; dw, db: written, not accumulated; dx may be NULL. */
size_t dp__conv_workspace_bytes(const dp_layer *l, int mb_rows, bool training);
bool dp__conv_forward(const dp_layer *l, int n, const float *x, const float *w, float *y,
                      void *ws, size_t ws_bytes);
bool dp__conv_backward(const dp_layer *l, int n, const float *x, const float *w,
                       const float *dy, float *dw, float *db, float *dx, void *ws,
                       size_t ws_bytes);
/* maxpool2d, avgpool2d; dx is written (maxpool needs x: where the max was). */
void dp__pool_forward(const dp_layer *l, int n, const float *x, float *y);
void dp__pool_backward(const dp_layer *l, int n, const float *x, const float *dy,
                       float *dx);

/* ---- the job's processes (config.ranks) ---- */
static inline int dp__ranks(const dp_config *c) { return c->ranks > 1 ? c->ranks : 1; }
/* config.accumulate: calls per update (1: none), and the partial-sum slots
 * (log2 of it) each updating device keeps after its optimizer state. */
static inline int dp__accumulate(const dp_config *c) {
  return c->accumulate > 1 && !c->inference ? c->accumulate : 1;
}
static inline int dp__accum_levels(const dp_config *c) {
  int l = 0;
  while ((1 << l) < dp__accumulate(c)) l++;
  return l;
}
/* Optimizer state vectors: momentum 1, AdamW 2 (m, v), plain SGD 0. */
static inline int dp__state_vectors(dp_optimizer o) {
  return o == DP_OPT_ADAMW ? 2 : o == DP_OPT_MOMENTUM ? 1 : 0;
}
/* The rank that holds global device dev. */
static inline int dp__rank_of(const dp_config *c, int dev) {
  return dev / (c->n_devices / dp__ranks(c));
}
/* Whether a reduction step that adds device src's gradients into device
 * dst's is one DP_OP_COPY_ADD (lib/plan.c): no comm buffer on dst. */
bool dp__copy_adds(const dp_config *c, int dst, int src);

/* ---- split (lib/split.c) ---- */
typedef struct {
  int n_mb;    /* micro-batches in the batch */
  int mb_rows; /* largest micro-batch */
  int n_used;  /* devices with rows */
  int dev_mb0[DP_MAX_DEVICES +
              1]; /* device d owns micro-batches [dev_mb0[d], dev_mb0[d+1]) */
  int dev_row0[DP_MAX_DEVICES + 1];
} dp_split_info;

/* Micro-batch k covers rows [dp__mb_row0(k), +dp__mb_rows(k)). */
typedef struct {
  int row0, rows;
} dp_mb;

/* Splits `rows` rows for config c. mbs must hold dp__split_max_mbs(c) entries.
 * `first`: device 0's share of the items (rows, or micro-batches when the
 * micro-batch size is fixed) under DP_SPLIT_MEMORY; ignored otherwise. */
dp_status dp__split(const dp_config *c, int rows, int first, dp_split_info *s, dp_mb *mbs);
/* Items the split deals: rows, or micro-batches when their size is fixed. */
int dp__split_items(const dp_config *c, int rows);
int dp__split_max_mbs(const dp_config *c);
/* The last batch of the run of batches, starting at `rows`, that deal their
 * items to the same devices in the same pattern (INT_MAX when it never ends). */
int dp__split_run_end(const dp_config *c, int rows);

/* ---- liveness planner (lib/liveness.c), TFLite Micro style ---- */
typedef struct {
  size_t size, align;
  int first, last; /* inclusive use interval */
  size_t offset;   /* result */
} dp_live_buf;

/* Greedy placement: largest first, lowest offset that does not overlap any
 * already placed buffer whose interval intersects. Returns the arena size. */
dp_status dp__live_place(dp_live_buf *b, int n, size_t *total);

/* ---- plan (lib/plan.c, lib/schedule.c) ---- */
/* Activation-region buffers of one device. */
/* Offsets inside the device's ACTIVATIONS region; SIZE_MAX = not there
 * (layer 0's input is INPUTS, the last layer's output is OUTPUTS, its
 * gradient is OUTPUT_GRADS). */
typedef struct {
  size_t act[DP_MAX_LAYERS];   /* output of layer i: (rows, out_i) */
  size_t stats[DP_MAX_LAYERS]; /* saved statistics of layer i: (rows, 2) */
  size_t dact[DP_MAX_LAYERS];  /* gradient of layer i's output: (mb_rows, out_i) */
  int rows, mb_rows;           /* this device's rows and largest micro-batch */
} dp_act_layout;

struct dp_plan {
  dp_model model; /* a copy: the plan owns its shapes */
  dp_config cfg;
  dp_split_info split;
  dp_mb *mbs;                      /* (split.n_mb) */
  int grad_levels[DP_MAX_DEVICES]; /* partial-grad slots per device */
  /* Parameters [opt_off[d], +opt_len[d]) (in floats) whose optimizer state
   * device d holds and updates: classic: device 0 all; allreduce: every
   * device all, or its shard with shard_optimizer. The state region holds,
   * per state vector (momentum; or AdamW m then v), opt_len[d] floats. */
  size_t opt_off[DP_MAX_DEVICES], opt_len[DP_MAX_DEVICES];
  size_t align;
  dp_region_info regions[DP_MAX_DEVICES][DP_REGION_COUNT];
  size_t dev_bytes[DP_MAX_DEVICES];
  dp_act_layout act[DP_MAX_DEVICES];
  size_t host_bytes;
  /* the staging arena (backend.host_staging): inputs (batch, in), targets and
   * outputs (batch, out), each at an aligned offset */
  size_t host_x, host_t, host_y;
  int n_ops, ops_cap;
  dp_op *ops;
  int n_stages;
};

/* Builds the schedule of one step into ops (capacity cap; ops may be NULL to
 * count). mbs: the plan's micro-batches, truncated to the step's rows (a
 * smaller batch keeps the planned cut points; empty micro-batches are
 * skipped). Pure: no allocation. */
/* What a schedule is for: a forward, a training step (that updates), or a
 * training call of an accumulation that does not update (config.accumulate). */
enum { DP_SCHED_INFER = 0, DP_SCHED_TRAIN = 1, DP_SCHED_ACCUM = 2 };
dp_status dp__schedule_build(const dp_plan *p, const dp_mb *mbs, int kind, dp_op *ops,
                             int cap, int *n_ops, int *n_stages);
int dp__schedule_cap(const dp_plan *p);
/* Layer i is a batchnorm with whole-batch statistics (config.batchnorm sync)
 * in a training plan: its statistics area is dp__bn_sync_floats, and the
 * gradient of its output is kept for all of the device's rows (the backward
 * stops there until the whole batch's sums are known). */
static inline bool dp__bn_sync(const dp_plan *p, int i) {
  return !p->cfg.inference && p->cfg.batchnorm == DP_BN_SYNC &&
         p->model.layers[i].kind == DP_LAYER_BATCHNORM;
}
/* What the ranks of a job compare at start: hashes of the model, the config,
 * the schedule and the build (version, compiler). */
#define DP_PLAN_HASHES 4
#define DP_STR_(x) #x
#define DP_STR(x) DP_STR_(x)
void dp__plan_hashes(const dp_plan *p, uint64_t h[DP_PLAN_HASHES]);
/* dp_plan_rank_rows without the checks. */
void dp__rank_rows(const dp_plan *p, int rows, int rank, int *row0, int *n);

/* Replicas `first` < `second` (of the first n) that share a GPU, if any. */
bool dp__shared_gpu(const dp_config *c, int n, int *first, int *second);
/* The same among replicas [d0, d0 + n) (one rank's). */
bool dp__shared_gpu_in(const dp_config *c, int d0, int n, int *first, int *second);

static inline bool dp__is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }
/* The segment [lo, hi) of n floats that device r holds after `levels` levels
 * of recursive halving (level l pairs r with r ^ 2^l; the device with that bit
 * clear keeps the lower half). */
void dp__ar_segment(size_t n, int levels, int r, size_t *lo, size_t *hi);

/* config.clip_grad_norm: a device's exact sum of squares of its gradients,
 * a 128-bit integer (lo, hi words) per float exponent: DP_NORM_BINS_BYTES in
 * the comm region per slot (bin 255 counts the infinite (lo) and NaN (hi)
 * gradients). */
#define DP_NORM_BINS 256
#define DP_NORM_BINS_BYTES (DP_NORM_BINS * 16)

/* ---- rng (lib/rng.c) ---- */
enum { DP_RNG_INIT = 1, DP_RNG_DROPOUT = 2 };
/* Counter-based: the same key always gives the same number. */
uint64_t dp__rng_u64(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b, uint64_t c);
/* FNV-1a 64 of n bytes, continuing from h (start with DP_FNV_INIT): the hash of
 * dp_params_hash, checkpoint checksums and dp repro's tensor hashes. */
#define DP_FNV_INIT 0xcbf29ce484222325ull
uint64_t dp__fnv1a(uint64_t h, const void *data, size_t n);
/* Uniform in [0, 1) with 24 bits. */
float dp__rng_uniform(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b, uint64_t c);

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

typedef struct dp_backend_ops {
  const char *name;
  /* ---- capabilities, plain data for the planner (no backend header needed) ----
   * Alignment of every region and arena; the WORKSPACE bytes a device needs
   * for the model at its largest micro-batch, with n_mb micro-batches; whether the caller's
   * inputs, targets and outputs pass through a pinned host staging arena (laid out by the
   * planner: dp_plan.host_x / host_t / host_y). */
  size_t align;
  size_t (*workspace_bytes)(const dp_model *m, int mb_rows, int n_mb, bool training);
  bool host_staging;
  /* runs DP_OP_GRAD_NORM and DP_OP_GRAD_CLIP (config.clip_grad_norm), and
   * DP_OP_GRAD_ACCUM and DP_OP_GRAD_STASH (config.accumulate) */
  bool grad_clip;
  /* runs conv2d, maxpool2d, avgpool2d and flatten layers */
  bool image_layers;
  /* runs batchnorm layers (and DP_OP_BN_UPDATE) */
  bool batchnorm;
  /* computes a relu that follows a linear layer in the linear's forward
   * (dp__relu_fused): the plan keeps no buffer for the linear's own output */
  bool fuses_linear_relu;
  /* Optional: the backend's own config options (cuda_graph, tf32, ...) are
   * valid; DP_ERR_INVALID naming the option otherwise. NULL: the backend has
   * none, and the planner refuses a config that sets one. */
  dp_status (*check_config)(const dp_config *c);

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
  /* Optional diagnostics (the public dp_cuda_* queries and dp bench): the
   * devices this backend can see (0 with the reason as the last error); the
   * name and memory of device dev; the time of one FP32 GEMM C (m, n) =
   * A (m, k) B (k, n) on it with the backend's math mode (tf32: TF32). */
  int (*device_count)(void);
  dp_status (*device_info)(int dev, char *name, size_t cap, size_t *total_mem,
                           size_t *free_mem);
  dp_status (*bench_sgemm)(int dev, int m, int n, int k, int iters, int tf32, double *ms,
                           double *tflops);
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

/* ---- the world: the job's processes (lib/world.c; MPI: lib/mpi/) ----
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

/* The backend registered for a backend kind (lib/backend.c); NULL when none
 * is (an unknown kind, or one whose library was not registered). */
const dp_backend_ops *dp__backend_ops(dp_backend kind);
/* Layer i of the plan's model is a relu right after a linear layer and the
 * plan's backend has fuses_linear_relu: the linear's forward applies the relu
 * in its GEMM epilogue and writes the relu's output (live from then on),
 * keeping no output of its own (no buffer); the relu's forward does nothing.
 * Its backward is unchanged (it reads its own output). Every backend that runs
 * the plan's ops follows this (the emulated GPU runs the cpu backend's ops on
 * a cuda plan). */
bool dp__relu_fused(const dp_plan *p, int i);
/* ... and layer i + 1 is a linear layer: that linear's backward writes its
 * grad-input product straight into the relu's input gradient and applies the
 * relu's backward there in place (its input, the relu's output, <= 0 gives 0);
 * the relu's backward does nothing and its output gradient gets no buffer. */
bool dp__relu_bwd_fused(const dp_plan *p, int i);
/* Registers ops as the backend of `kind` (the cpu backend is built in). */
dp_status dp__backend_register(dp_backend kind, const dp_backend_ops *ops);

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
  float loss;      /* result of the loss op */
  float grad_norm; /* result of device 0's clip op (config.clip_grad_norm) */
  /* config.accumulate: this call's index in the accumulation, the rows its
   * loss gradient is scaled by (accumulate * rows), and the row of the
   * concatenation its first row is (dropout's key) */
  int accum_k, loss_rows, row_base;
  bool skip_broadcast; /* replicas already hold device 0's parameters */
  int host_row0;       /* the first row of this rank's host buffers */
};

extern const dp_backend_ops dp__cpu_backend;

/* Pointer to region r of device d in env. */
static inline void *dp__region_ptr(const dp_exec_env *e, int dev, int r) {
  return e->arena[dev] + e->plan->regions[dev][r].offset;
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
    /* offsets count global rows; this rank's buffers start at host_row0 */
    size_t width = region == DP_REGION_INPUTS    ? (size_t)m->input_width * 4
                   : region == DP_REGION_TARGETS ? (m->loss == DP_LOSS_MSE ? out : 4)
                                                 : out;
    return (unsigned char *)base + (off - (size_t)e->host_row0 * width);
  }
  return (unsigned char *)dp__region_ptr(e, dev, region) + off;
}

#ifdef __cplusplus
}
#endif

#endif
