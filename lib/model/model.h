/* The model: layers and their shapes, parsed from a spec or built by the
 * builder (lib/model/). Shapes only, no memory. Not installed. */
#ifndef DP_MODEL_H
#define DP_MODEL_H

#include "util/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- model (lib/model.c, lib/spec.c) ---- */
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
  int exclude_pad;    /* avgpool2d: count_include_pad=False (divide by the window's
                         real cells) */
  size_t buf_off;     /* batchnorm: its buffers (floats after the parameters):
                         running_mean (c), running_var (c), num_batches_tracked
                         (one uint32 slot) */
  int t;              /* sequences: positions per row (0: none); the output is
                         (t, c) and the input (t, ic) */
  int vocab, heads;   /* embedding, attention */
  int link;           /* residual: the index of its end (-1 while open); its
                         end and its shortcut: the index of the residual */
  float eps;          /* layernorm, batchnorm: added to the variance (default 1e-5) */
  float slope;        /* leaky_relu: negative_slope (default 0.01) */
  double momentum;    /* batchnorm: the running statistics' update factor, the
                         double of the spec's decimal as PyTorch's Python float
                         (default 0.1); DP_BN_CUMULATIVE: momentum=None */
  int tied;           /* linear: its weight is layer 0's token table (a tied output
                         head; param_off is the table's, n_params 0); embedding:
                         a head shares its token table, whose gradient the head's
                         backward writes first and the embedding's adds to */
} dp_layer;

/* The cross-entropy options (dp_ce_options); all zero: none. */
typedef struct {
  float smoothing;
  int ignore; /* ignore_index set */
  int32_t ignore_index;
  int n_weights; /* 0 or the classes */
  float weights[DP_MAX_CLASS_WEIGHTS];
} dp_ce_opts;

struct dp_model {
  int input_width;
  int input_c, input_h, input_w; /* input_h == 0: flat (input_c == input_width) */
  int input_t;                   /* token input: ids per row (== input_width), or 0 */
  int n_layers;
  dp_layer layers[DP_MAX_LAYERS];
  dp_loss_kind loss;
  dp_ce_opts ce; /* loss DP_LOSS_SOFTMAX_CE's options */
  float loss_param; /* smooth_l1's beta, huber's delta (1 until set) */
  int n_pos_weight; /* bce_with_logits' pos_weight: 0 (none) or the output width */
  float pos_weight[DP_MAX_CLASS_WEIGHTS];
  size_t n_params;
  size_t n_buffers; /* floats after the parameters in PARAMS (batchnorm) */
};

/* The loss is element-wise on float targets of the output's width (mse, l1,
 * smooth_l1, huber, bce_with_logits), the mean over every element. */
static inline bool dp__loss_on_targets(dp_loss_kind k) {
  return k == DP_LOSS_MSE || k == DP_LOSS_L1 || k == DP_LOSS_SMOOTH_L1 ||
         k == DP_LOSS_HUBER || k == DP_LOSS_BCE_LOGITS;
}

/* The model's cross-entropy takes options: its mean's denominator comes from
 * the targets (dp_exec_env.loss_inv, loss_denom) instead of the rows. */
static inline bool dp__ce_has_opts(const dp_model *m) {
  return m->loss == DP_LOSS_SOFTMAX_CE &&
         (m->ce.smoothing > 0.0f || m->ce.ignore || m->ce.n_weights > 0);
}

/* The floats of a layer's parameter span: its own, or a tied head's weight (the
 * token table it shares, (out, in) per position). */
static inline size_t dp__param_span(const dp_layer *l) {
  return l->kind == DP_LAYER_LINEAR && l->tied
             ? (size_t)(l->out / (l->t ? l->t : 1)) * (size_t)(l->in / (l->t ? l->t : 1))
             : l->n_params;
}

#define DP_NORM_EPS 1e-5f     /* layernorm's and batchnorm's default eps */
#define DP_LEAKY_SLOPE 0.01f  /* leaky_relu's default negative_slope (PyTorch's) */
#define DP_BN_CUMULATIVE -1.0 /* dp_layer.momentum: PyTorch's momentum=None */

/* The running statistics' update factor of batchnorm l at its count-th
 * training step (count >= 1, num_batches_tracked after the increment). */
static inline double dp__bn_factor(const dp_layer *l, uint32_t count) {
  return l->momentum == DP_BN_CUMULATIVE ? 1.0 / (double)count : l->momentum;
}

/* The rows a batchnorm of n rows normalises over: on a sequence (T positions
 * of c channels, channels last) each channel's n T values, which are the
 * flat batchnorm's of n T rows of c (PyTorch's BatchNorm1d(c) on the (B, c, T)
 * transpose); else n rows of c x S (S = H W, or 1). */
static inline int dp__bn_rows(const dp_layer *l, int n) { return n * (l->t ? l->t : 1); }
/* A batchnorm's buffers: 2 c floats and the count. */
static inline size_t dp__bn_buffers(int c) { return 2 * (size_t)c + 1; }
/* Floats a batchnorm's forward saves per micro-batch: mean, rstd and the
 * unbiased variance per channel. */
static inline size_t dp__bn_stats(int c) { return 3 * (size_t)c; }
/* The order a batchnorm sums a channel's M = n S values in, on both backends
 * (lib/cpu/backend.c's bn_sums, cuda/batchnorm.cu; the same bits): the values
 * in (row, position) order j = r S + k are cut into K = dp__bn_chunks(M, C)
 * chunks of L = dp__bn_chunk_len(M, K) consecutive values (the last may be
 * shorter), a GPU block each. Chunk c's values j = c L + i are dealt to
 * DP_BN_LANES lanes (i to lane i mod DP_BN_LANES, each lane's sum ascending
 * from +0), the lane sums meet in a halving tree (lane t += lane t + 256,
 * then t + 128, ..., 1), and the chunk sums are added in ascending c, from
 * chunk 0's. K is a function of (M, C) alone: 1 up to DP_BN_CHUNK values,
 * else ceil(M / DP_BN_CHUNK) (at least 4 passes of a block each), at most
 * DP_BN_SLOTS / C (about a GPU's worth of blocks over all channels; 1 for
 * C > DP_BN_SLOTS / 2), so K C <= DP_BN_SLOTS whenever K > 1: the CUDA
 * scratch's size (cuda/kernels.cuh, dp_cuda_bn_scratch). */
#define DP_BN_LANES 512
#define DP_BN_CHUNK ((size_t)4 * DP_BN_LANES)
#define DP_BN_SLOTS 512
static inline int dp__bn_chunks(size_t M, int C) {
  size_t k = (M + DP_BN_CHUNK - 1) / DP_BN_CHUNK;
  size_t cap = C > 0 && C < DP_BN_SLOTS ? (size_t)(DP_BN_SLOTS / C) : 1;
  return k < 2 ? 1 : (int)(k < cap ? k : cap);
}
static inline size_t dp__bn_chunk_len(size_t M, int K) {
  return (M + (size_t)K - 1) / (size_t)K;
}
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
bool dp__layer_needs_input(const dp_layer *l);
bool dp__layer_needs_output(const dp_layer *l);
/* Per-row float count of saved statistics (layernorm: mean and rstd per
 * position; attention: the probabilities (heads, t, t)); 0 when none, or too
 * many (dp_model refuses such a layer). */
int dp__layer_stats_width(const dp_layer *l);
/* The layer whose activation buffer holds layer i's output: i itself, or for
 * a view (flatten) the layer it views, followed back; -1: the input. The last
 * layer's output is in OUTPUTS whatever it is (a flatten there copies). */
int dp__act_owner(const dp_model *m, int i);
static inline bool dp__layer_is_view(const dp_model *m, int i) {
  return (m->layers[i].kind == DP_LAYER_FLATTEN && i < m->n_layers - 1) ||
         m->layers[i].kind == DP_LAYER_RESIDUAL || m->layers[i].kind == DP_LAYER_SHORTCUT;
}
/* Layer i is a view of layer i - 1's output (a shortcut views its block's
 * input instead). */
static inline bool dp__views_prev(const dp_model *m, int i) {
  return dp__layer_is_view(m, i) && m->layers[i].kind != DP_LAYER_SHORTCUT;
}
/* The layer whose gradient buffer holds the gradient of layer i's output: as
 * dp__act_owner, but a shortcut has its own (g's input gradient, added to
 * x's by the block's begin after f's backward wrote it). */
int dp__grad_owner(const dp_model *m, int i);
/* The shortcut of the residual block that starts at layer r, or -1. */
int dp__block_shortcut(const dp_model *m, int r);
/* The layer whose buffer holds the skip input of residual end k: the owner
 * of its residual's input (-1: the model's input), or with a shortcut the
 * owner of f's output (the layer before the shortcut). */
int dp__skip_owner(const dp_model *m, int k);
/* A linear or layernorm on a sequence acts on each of its t positions: rows
 * of the layer's GEMM or normalisation per row of the batch, and the widths
 * per position. */
static inline int dp__positions(const dp_layer *l) { return l->t ? l->t : 1; }
static inline int dp__pos_in(const dp_layer *l) { return l->in / dp__positions(l); }
static inline int dp__pos_out(const dp_layer *l) { return l->out / dp__positions(l); }
/* The innermost residual block without its end, or -1. */
int dp__model_open_residual(const dp_model *m);
/* conv2d's fan-in, in_channels * k * k; a linear's in. */
int dp__layer_fan_in(const dp_layer *l);

#ifdef __cplusplus
}
#endif

#endif
