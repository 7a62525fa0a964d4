/* The plan (lib/core/): the split of a batch, buffer placement, the
 * per-device regions and the static schedule. Not installed. */
#ifndef DP_PLAN_H
#define DP_PLAN_H

#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

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
/* The Adam family (torch.optim.Adam, AdamW): the moments m and v. */
static inline bool dp__is_adam(dp_optimizer o) {
  return o == DP_OPT_ADAMW || o == DP_OPT_ADAM;
}
/* Optimizer state vectors: momentum 1, Adam and AdamW 2 (m, v) or, with
 * amsgrad, 3 (m, v, v_hat), plain SGD 0. */
static inline int dp__state_vectors(dp_optimizer o, bool amsgrad) {
  return dp__is_adam(o) ? (amsgrad ? 3 : 2) : o == DP_OPT_MOMENTUM ? 1 : 0;
}
/* config.amsgrad in effect: a training plan of the Adam family that sets it. */
static inline bool dp__amsgrad(const dp_config *c) {
  return c->amsgrad && !c->inference && dp__is_adam(c->optimizer);
}
/* The state vectors a plan of c keeps: none for inference (a checkpoint's
 * load into an inference context takes the parameters only). */
static inline int dp__cfg_state_vectors(const dp_config *c) {
  return c->inference ? 0 : dp__state_vectors(c->optimizer, dp__amsgrad(c));
}
/* The momentum a plan's optimizer starts with (dp_ctx_momentum): SGD's
 * (DP_OPT_MOMENTUM, as the plan names SGD with a buffer), Adam's beta1; 0 for
 * plain SGD and for inference. */
static inline float dp__config_momentum(const dp_config *c) {
  if (c->inference) return 0.0f;
  return dp__is_adam(c->optimizer)         ? c->beta1
         : c->optimizer == DP_OPT_MOMENTUM ? c->momentum
                                           : 0.0f;
}
/* The rank that holds global device dev. */
static inline int dp__rank_of(const dp_config *c, int dev) {
  return dev / (c->n_devices / dp__ranks(c));
}
/* Whether a reduction step that adds device src's gradients into device
 * dst's is one DP_OP_COPY_ADD (lib/plan.c): no comm buffer on dst. */
bool dp__copy_adds(const dp_config *c, int dst, int src);
/* Whether the reduction's transfer from src to dst carries bf16 values:
 * config.reduce_precision bf16 and a copy (not an in-place add). */
bool dp__wire_bf16(const dp_config *c, int dst, int src);

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
  /* config.recompute: a recomputed layer's (dp_plan.rc) output and statistics
   * again, one micro-batch, written by the backward's recompute; its act and
   * stats then hold one micro-batch too, the forward's */
  size_t rc_act[DP_MAX_LAYERS], rc_stats[DP_MAX_LAYERS];
  int rows, mb_rows;           /* this device's rows and largest micro-batch */
} dp_act_layout;

#define DP_MAX_BACKEND_OPTIONS 8 /* per backend (dp_backend_ops.options) */

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
  /* config.reduce_precision bf16 across copies (dp__wire_bf16): where in
   * device d's comm region the bf16 values it packs to send start (what it
   * receives is at 0) */
  size_t wire_send[DP_MAX_DEVICES];
  size_t align, slice_align; /* dp_backend_ops.align and .slice_align */
  dp_region_info regions[DP_MAX_DEVICES][DP_REGION_COUNT];
  size_t dev_bytes[DP_MAX_DEVICES];
  dp_act_layout act[DP_MAX_DEVICES];
  size_t host_bytes;
  /* the staging arena (backend.host_staging): inputs (batch, in), targets and
   * outputs (batch, out), each at an aligned offset */
  size_t host_x, host_t, host_y;
  /* the backend's options (dp_backend_ops.options, parsed) and what they make
   * the core do (DP_FEATURE_*) */
  int bopt[DP_MAX_BACKEND_OPTIONS];
  unsigned features;
  /* DP_FEATURE_SHARED_PARAMS applies (dp__param_home) */
  bool shared_params;
  int n_ops, ops_cap;
  dp_op *ops;
  int n_stages;
  /* config.recompute (plan.c, plan_segments). The forward runs the layers of
   * segment [seg_lo[i], seg_hi[i]] micro-batch by micro-batch (without
   * recompute, and in inference, every layer is its own segment); rc[i] > 0:
   * layer i's output (and statistics) is not kept but lives one micro-batch
   * at a time, and with rc[i] == 1 is recomputed in the backward. The
   * liveness times of one micro-batch's pass: layer i's forward at i, its
   * recompute at t_r[i] (-1: none) and its backward at t_b[i], all before
   * t_end. */
  int16_t seg_lo[DP_MAX_LAYERS], seg_hi[DP_MAX_LAYERS];
  int16_t t_r[DP_MAX_LAYERS], t_b[DP_MAX_LAYERS];
  uint8_t rc[DP_MAX_LAYERS];    /* 0 kept; 1 recomputed; 2 not needed by the backward */
  uint8_t rc_op[DP_MAX_LAYERS]; /* the backward's recompute runs layer i's forward */
  int t_end;
};

/* Activation buffers of one device at most: output, statistics and output
 * gradient of every layer, and a recomputed layer's two recompute buffers. */
#define DP_ACT_BUFS (5 * DP_MAX_LAYERS)

/* The device whose PARAMS region device d's ops read: with shared parameters
 * (dp_plan.shared_params) its rank's first device, whose region the broadcast
 * fills (the others have none); d itself otherwise. */
static inline int dp__param_home(const dp_plan *p, int d) {
  if (!p->shared_params || d < 0) return d;
  int per_rank = p->cfg.n_devices / dp__ranks(&p->cfg);
  return d - d % per_rank;
}

/* The rows micro-batch k holds in a step of `rows` rows: a smaller batch keeps
 * the planned cut points, so k keeps its planned rows of those past its first
 * row (0 when none are left). */
static inline int dp__mb_rows_at(const dp_plan *p, int k, int rows) {
  int r = rows - p->mbs[k].row0;
  return r <= 0 ? 0 : r < p->mbs[k].rows ? r : p->mbs[k].rows;
}

/* Whether the backward's recompute runs layer j's forward (config.recompute):
 * it writes a recomputed output, its own or its fused relu's. */
bool dp__recompute_op(const dp_plan *p, int j);

/* Whether op, a forward, runs layer by layer over all of the device's
 * micro-batches (the cpu backend packs the layer's weights once for all of
 * them then): a forward-phase op of a segment of one layer. */
static inline bool dp__forward_layer_major(const dp_plan *p, const dp_op *op) {
  return op->phase == DP_PHASE_FORWARD && op->layer >= 0 &&
         p->seg_lo[op->layer] == p->seg_hi[op->layer];
}
/* The largest of f(layer) over the linear layers whose forward runs layer by
 * layer (a segment of one layer: dp__forward_layer_major), 0 if none: what a
 * backend packs once for all of a device's micro-batches is sized by it. */
static inline size_t dp__layer_major_linear_max(const dp_plan *p,
                                                size_t (*f)(const dp_layer *l)) {
  size_t w = 0;
  for (int i = 0; i < p->model.n_layers; i++)
    if (p->model.layers[i].kind == DP_LAYER_LINEAR && p->seg_lo[i] == p->seg_hi[i]) {
      size_t b = f(&p->model.layers[i]);
      w = b > w ? b : w;
    }
  return w;
}

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
/* The activation buffers of device d with their sizes and lifetimes, as the
 * liveness planner places them (lib/core/plan.c; offsets not set): b[k] is
 * buffer who[k] = kind * n_layers + layer (kind 0: the layer's output, 1: its
 * saved statistics, 2: its output's gradient, 3 and 4: a recomputed layer's
 * output and statistics as the backward's recompute writes them). */
dp_status dp__act_buffers(const dp_plan *p, int d, dp_live_buf b[DP_ACT_BUFS],
                          int who[DP_ACT_BUFS], int *n);
/* Layer i is a batchnorm with whole-batch statistics (config.batchnorm sync)
 * in a training plan: its statistics area is dp__bn_sync_floats, and the
 * gradient of its output is kept for all of the device's rows (the backward
 * stops there until the whole batch's sums are known). */
static inline bool dp__bn_sync(const dp_plan *p, int i) {
  return !p->cfg.inference && p->cfg.batchnorm == DP_BN_SYNC &&
         p->model.layers[i].kind == DP_LAYER_BATCHNORM;
}
/* The gradient of layer o's output (o: its owner, or a view of it) is kept
 * for all of the device's rows: a sync batchnorm's backward segments part
 * the layer that writes it from the last that reads it (the batchnorm's
 * own; a residual block's skip gradient past one). */
bool dp__dact_all(const dp_plan *p, int o);
/* Each micro-batch of a device has a gradient slot of its own in the backward
 * (GRAD_PARTIALS holds n_mb - 1), not one per level of the canonical tree: a
 * tied head writes the token table's gradient in the backward's first segment
 * and the embedding adds its own in the last, with sync batchnorm's segments
 * between, so a slot that a later micro-batch reused would have lost the
 * head's part. The tree, and so the bits, are the same. */
bool dp__leaf_slots(const dp_plan *p);
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

/* Bytes between partial-gradient slots in GRAD_PARTIALS (lib/plan.c). */
size_t dp__partial_stride(const dp_plan *p);
/* Row tensors of width w (elements of esz bytes) on device d hold one slice per
 * micro-batch, slice j at j * dp__slice_stride(p, w, esz)
 * (dp_backend_ops.slice_align); dp__rows_bytes is the size of such a tensor for
 * all of device d's rows. */
size_t dp__slice_stride(const dp_plan *p, int w, size_t esz);
size_t dp__rows_bytes(const dp_plan *p, int d, int w, size_t esz);
/* Bytes per element of the activations between layers and of their gradients
 * in the ACTIVATIONS region (config.precision: bf16 2, else 4). The model's
 * inputs, outputs and output gradients, statistics, parameters and gradients
 * stay fp32. */
static inline size_t dp__act_esz(const dp_plan *p) {
  return p->cfg.precision == DP_PRECISION_BF16 ? 2 : 4;
}

/* Layer i of the plan's model is a relu right after a linear layer and the
 * plan's backend has fuses_linear_relu, or right after a conv2d layer in an
 * fp32 plan whose backend has fuses_conv_relu: that layer's forward applies
 * the relu as it writes (the GEMM's epilogue, the conv's store) and writes the
 * relu's output (live from then on), keeping no output of its own (no
 * buffer); the relu's forward does nothing. Its backward is unchanged (it
 * reads its own output). Every backend that runs the plan's ops follows this
 * (the emulated GPU runs the cpu backend's ops on a cuda plan). */
bool dp__relu_fused(const dp_plan *p, int i);
/* ... and layer i + 1 is a linear layer, or a maxpool2d in an fp32 plan whose
 * backend has fuses_relu_maxpool: that layer's backward writes its input
 * gradient straight into the relu's input gradient with the relu's backward
 * applied (where its input, the relu's output, is <= 0: +0); the relu's
 * backward does nothing and its output gradient gets no buffer. */
bool dp__relu_bwd_fused(const dp_plan *p, int i);

#ifdef __cplusplus
}
#endif

#endif
