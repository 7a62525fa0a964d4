/* The CPU backend: the reference implementation of every layer, loss and
 * optimizer, run by one worker thread per virtual device on that device's
 * arena. Every loop has a fixed order (no atomics, no thread-count-dependent
 * splits), so results are a pure function of the inputs; each output
 * element's accumulation order depends only on the reduced dimension. The
 * executor may run element ranges of an elementwise op (copy, gradient add,
 * zero, check, update) on several threads at once (exec.c: work sharing):
 * those ops address everything by the op's offsets, and no element depends
 * on another, so the bits are the same. */
#include "cpu/gemm.h"
#include "cpu/bf16.h"
#include "core/operands.h"
#include "cpu/cpu.h"
#include "cpu/gelu.h"
#include "cpu/layer.h"
#include "util/bf16.h"
#include "util/expf.h"
#include "util/tanh.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* batchnorm: micro-batch mb's saved statistics, dp__bn_stats floats: mean,
 * rstd, unbiased variance per channel. */
static float *bn_stats(const lctx *c, int mb) {
  return ptr(c, c->o.bn_area) + (size_t)mb * dp__bn_stats(c->l->c);
}

/* batchnorm's buffers on the device: running_mean (c), running_var (c), the count. */
static float *bn_buffers(const lctx *c) { return ptr(c, c->o.bn_buffers); }

/* What bn_sums adds per element (xh = (x - mean) rstd): BN_X: x; BN_DEV2:
 * (x - mean)^2; BN_GRADS2: dy xh, dy; BN_GRADS4: those and dy g, dy g xh. */
typedef enum { BN_X, BN_DEV2, BN_GRADS2, BN_GRADS4 } bn_terms;

/* Channel ch's sums v[0..) of its M = n S values in dp__bn_chunks's order
 * (lib/model/model.h: chunks of the values in (row, position) order, each
 * dealt round-robin to DP_BN_LANES lanes summed from +0 and a halving tree
 * over the lanes, the chunk sums added ascending), which cuda/batchnorm.cu's
 * blocks take: the same bits on both backends. */
static void bn_sums(const float *x, const float *dy, int n, int C, size_t S, int ch,
                    bn_terms t, float mean, float rstd, float g, float *v) {
  const size_t M = (size_t)n * S;
  const int K = dp__bn_chunks(M, C), Q = t == BN_GRADS4 ? 4 : t == BN_GRADS2 ? 2 : 1;
  const size_t L = dp__bn_chunk_len(M, K);
  float lane[4][DP_BN_LANES];
  for (int c = 0; c < K; c++) {
    size_t j0 = (size_t)c * L < M ? (size_t)c * L : M, j1 = j0 + L < M ? j0 + L : M;
    size_t r = j0 / S, k = j0 % S;
    memset(lane, 0, sizeof lane); /* +0 */
    for (size_t j = j0, ln = 0; j < j1; j++) {
      size_t at = (r * (size_t)C + (size_t)ch) * S + k;
      float d = x[at] - mean, xh = d * rstd;
      switch (t) {
      case BN_X: lane[0][ln] += x[at]; break;
      case BN_DEV2: lane[0][ln] += d * d; break;
      case BN_GRADS4:
        lane[2][ln] += dy[at] * g;
        lane[3][ln] += dy[at] * g * xh;
        /* fall through */
      case BN_GRADS2:
        lane[0][ln] += dy[at] * xh;
        lane[1][ln] += dy[at];
        break;
      }
      if (++ln == DP_BN_LANES) ln = 0;
      if (++k == S) {
        k = 0;
        r++;
      }
    }
    for (int w = DP_BN_LANES / 2; w > 0; w >>= 1)
      for (int q = 0; q < Q; q++)
        for (int i = 0; i < w; i++) lane[q][i] += lane[q][i + w];
    for (int q = 0; q < Q; q++) v[q] = c == 0 ? lane[q][0] : v[q] + lane[q][0];
  }
}

/* y = (x - mean) rstd g + b per channel over n rows of C x S (S = H W, or 1
 * for a flat input). Training: the micro-batch's own statistics (bn_sums's
 * order: the mean, then the squared deviations; the biased variance), saved
 * for backward and the running statistics; eval: the running statistics. */
static void bn_forward(const lctx *c, const float *x, float *y) {
  const dp_layer *l = c->l;
  int n = dp__bn_rows(l, c->rows), C = l->c;
  size_t S = l->h ? (size_t)l->h * l->w : 1, M = (size_t)n * S;
  const float *g = layer_params(c), *b = g + C;
  /* sync: the whole batch's statistics, in place of micro-batch 0's */
  bool sync = c->e->training && dp__bn_sync(c->p, c->i);
  float *st = c->e->training ? bn_stats(c, sync ? 0 : c->mb) : NULL;
  const float *run = bn_buffers(c);
  for (int ch = 0; ch < C; ch++) {
    float mean, rstd;
    if (sync) {
      mean = st[ch];
      rstd = st[C + ch];
    } else if (st) {
      float sum, var;
      bn_sums(x, NULL, n, C, S, ch, BN_X, 0.0f, 0.0f, 0.0f, &sum);
      mean = sum / (float)M;
      bn_sums(x, NULL, n, C, S, ch, BN_DEV2, mean, 0.0f, 0.0f, &var);
      rstd = 1.0f / sqrtf(var / (float)M + l->eps);
      st[ch] = mean;
      st[C + ch] = rstd;
      st[2 * C + ch] = M > 1 ? var / (float)(M - 1) : NAN; /* refused before the step */
    } else {
      mean = run[ch];
      rstd = 1.0f / sqrtf(run[C + ch] + l->eps);
    }
    for (int r = 0; r < n; r++)
      for (size_t k = 0; k < S; k++) {
        size_t at = ((size_t)r * C + ch) * S + k;
        y[at] = (x[at] - mean) * rstd * g[ch] + b[ch];
      }
  }
}

/* ---- sync batchnorm (config.batchnorm sync): the whole batch's statistics ----
 * Each micro-batch's partial (rows, mean, sum of squared deviations: two
 * passes, bn_sums's order), merged pairwise in the canonical tree (Chan et al.'s
 * update, in double), so the result depends only on the micro-batches, not
 * on which device holds them. */

static size_t bn_positions(const dp_layer *l) { return l->h ? (size_t)l->h * l->w : 1; }

static uint32_t get_u32(const float *at) {
  uint32_t v;
  memcpy(&v, at, 4);
  return v;
}

static void put_u32(float *at, uint32_t v) { memcpy(at, &v, 4); }

static dp_status bn_stats_op(const lctx *c, const dp_op *op) {
  const dp_layer *l = c->l;
  const float *x = layer_in(c);
  int n = dp__bn_rows(l, op->rows), C = l->c;
  size_t S = bn_positions(l), M = (size_t)n * S;
  float *part = region(c->e, op->device, op->dst_region, op->dst_offset);
  put_u32(part, (uint32_t)n);
  for (int ch = 0; ch < C; ch++) {
    float sum, m2;
    bn_sums(x, NULL, n, C, S, ch, BN_X, 0.0f, 0.0f, 0.0f, &sum);
    float mean = sum / (float)M;
    bn_sums(x, NULL, n, C, S, ch, BN_DEV2, mean, 0.0f, 0.0f, &m2);
    part[1 + ch] = mean;
    part[1 + C + ch] = m2;
  }
  return DP_OK;
}

/* dst's partial merged with src's (both of layer op->layer). */
static dp_status bn_merge_op(const dp_exec_env *e, const dp_op *op) {
  const dp_layer *l = &e->plan->model.layers[op->layer];
  int C = l->c;
  float *a = region(e, op->device, op->dst_region, op->dst_offset);
  const float *b = region(e, op->device, op->src_region, op->src_offset);
  uint32_t rows = get_u32(a) + get_u32(b);
  double S = (double)bn_positions(l), na = get_u32(a) * S, nb = get_u32(b) * S, n = na + nb;
  for (int ch = 0; ch < C; ch++) {
    double delta = (double)b[1 + ch] - (double)a[1 + ch];
    a[1 + ch] = (float)((double)a[1 + ch] + delta * (nb / n));
    a[1 + C + ch] = (float)((double)a[1 + C + ch] + (double)b[1 + C + ch] +
                            delta * delta * (na * nb / n));
  }
  put_u32(a, rows);
  return DP_OK;
}

/* The whole batch's mean, rstd (biased variance, as the normalisation) and
 * unbiased variance (the running statistics') from the tree's root. */
static dp_status bn_final_op(const dp_exec_env *e, const dp_op *op) {
  const dp_layer *l = &e->plan->model.layers[op->layer];
  int C = l->c;
  float *f = region(e, op->device, op->dst_region, op->dst_offset);
  const float *root = region(e, op->device, op->src_region, op->src_offset);
  uint32_t rows = get_u32(root);
  double M = (double)rows * (double)bn_positions(l);
  for (int ch = 0; ch < C; ch++) {
    double m2 = root[1 + C + ch];
    f[ch] = root[1 + ch];
    f[C + ch] = (float)(1.0 / sqrt(m2 / M + (double)l->eps));
    f[2 * C + ch] = M > 1 ? (float)(m2 / (M - 1)) : NAN; /* refused before the step */
  }
  put_u32(f + 3 * C, rows);
  return DP_OK;
}

/* The micro-batch's sums of dy x-hat and dy per channel (bn_sums's order), with the
 * whole batch's statistics: its gradients of the weight and the bias, which
 * the backward tree sums and the batchnorm's sums are copied from. */
static dp_status bn_bwd_stats_op(const lctx *c, const dp_op *op) {
  const dp_layer *l = c->l;
  const float *x = layer_in(c), *dy = layer_dout(c), *st = bn_stats(c, 0);
  int n = dp__bn_rows(l, op->rows), C = l->c;
  size_t S = bn_positions(l);
  float *dg = region(c->e, op->device, op->dst_region, op->dst_offset) + l->param_off,
        *db = dg + C;
  for (int ch = 0; ch < C; ch++) {
    float v[2];
    bn_sums(x, dy, n, C, S, ch, BN_GRADS2, st[ch], st[C + ch], 0.0f, v);
    dg[ch] = v[0];
    db[ch] = v[1];
  }
  if (op->flags & DP_OPF_ROUND_BF16) dp__bf16_round_f32_n(dg, 2 * (size_t)C); /* a leaf */
  return DP_OK;
}

dp_status dp__cpu_bn_sums(const lctx *c, const dp_op *op) {
  if (op->kind == DP_OP_BN_STATS) return bn_stats_op(c, op);
  if (op->kind == DP_OP_BN_BWD_STATS) return bn_bwd_stats_op(c, op);
  return DP_FAIL(DP_ERR_BACKEND, "cpu backend: op kind %d is not a batchnorm sums op",
                 op->kind);
}

/* dx with the whole batch's statistics and sums (sg, sb: this device's copy
 * of device 0's tree root): rstd (dy g - g sb / M - xh g sg / M). */
static void bn_sync_backward(const lctx *c, const float *x, const float *dy, float *dx) {
  if (!dx) return;
  const dp_layer *l = c->l;
  int n = dp__bn_rows(l, c->rows), C = l->c;
  const float *g = layer_params(c), *st = bn_stats(c, 0);
  const float *sums = region(c->e, c->d, DP_REGION_ACTIVATIONS,
                             c->p->act[c->d].stats[c->i] + dp__bn_sync_bwd(C) * 4);
  size_t S = bn_positions(l);
  float M = (float)((double)get_u32(st + 3 * C) * (double)S);
  for (int ch = 0; ch < C; ch++) {
    float mean = st[ch], rstd = st[C + ch], s1 = g[ch] * sums[C + ch] / M,
          s2 = g[ch] * sums[ch] / M;
    for (int r = 0; r < n; r++)
      for (size_t k = 0; k < S; k++) {
        size_t at = ((size_t)r * C + ch) * S + k;
        float xh = (x[at] - mean) * rstd;
        dx[at] = rstd * (dy[at] * g[ch] - s1 - xh * s2);
      }
  }
}

/* dx = rstd (dy g - s1 / M - xh s2 / M), s1 = sum dy g, s2 = sum dy g xh;
 * dg = sum dy xh, db = sum dy: the micro-batch's statistics (training only). */
static void bn_backward(const lctx *c, const float *x, const float *dy, float *dx,
                        float *grads) {
  const dp_layer *l = c->l;
  int n = dp__bn_rows(l, c->rows), C = l->c;
  size_t S = l->h ? (size_t)l->h * l->w : 1, M = (size_t)n * S;
  if (dp__bn_sync(c->p, c->i)) {
    bn_sync_backward(c, x, dy, dx);
    return;
  }
  const float *g = layer_params(c), *st = bn_stats(c, c->mb);
  float *dg = grads + l->param_off, *db = dg + C;
  for (int ch = 0; ch < C; ch++) {
    float mean = st[ch], rstd = st[C + ch], v[4];
    bn_sums(x, dy, n, C, S, ch, BN_GRADS4, mean, rstd, g[ch], v);
    float s1 = v[2], s2 = v[3];
    dg[ch] = v[0];
    db[ch] = v[1];
    if (!dx) continue;
    for (int r = 0; r < n; r++)
      for (size_t k = 0; k < S; k++) {
        size_t at = ((size_t)r * C + ch) * S + k;
        float xh = (x[at] - mean) * rstd;
        dx[at] = rstd * (dy[at] * g[ch] - s1 / (float)M - xh * s2 / (float)M);
      }
  }
}

/* The running statistics from micro-batch 0 (device 0's first), PyTorch's rule
 * in double as ATen's CPU kernel: r = m * stat + (1 - m) * r with the layer's
 * momentum m (momentum=None: 1 / num_batches_tracked after its increment), the
 * unbiased variance; num_batches_tracked + 1. */
static dp_status bn_update(const dp_exec_env *e, const dp_op *op) {
  lctx c = op_lctx(e, op); /* device 0's */
  const dp_layer *l = c.l;
  int C = l->c;
  const float *st = bn_stats(&c, 0);
  float *run = bn_buffers(&c);
  uint32_t count;
  memcpy(&count, &run[2 * C], 4);
  count++;
  const double m = dp__bn_factor(l, count);
  for (int ch = 0; ch < C; ch++) {
    run[ch] = (float)(m * (double)st[ch] + (1.0 - m) * (double)run[ch]);
    run[C + ch] = (float)(m * (double)st[2 * C + ch] + (1.0 - m) * (double)run[C + ch]);
  }
  memcpy(&run[2 * C], &count, 4);
  return DP_OK;
}

/* The linear layer's products run as packed GEMMs (gemm.h: one fma chain per
 * element over the reduced dimension, ascending; the same bits on every
 * instruction set). Their packing buffers live in the device's WORKSPACE
 * region, which the planner sizes with dp__model_workspace_bytes; a region too
 * small for a product gives NULL, and dp__sgemm then runs its unpacked path
 * (the same bits, slower) rather than write past it. */
static void *gemm_ws(const lctx *c, int M, int N, int K) {
  size_t need = dp__gemm_workspace_bytes(M, N, K);
  if (need == 0 || c->e->plan->regions[c->d][DP_REGION_WORKSPACE].size < need) return NULL;
  return dp__region_ptr(c->e, c->d, DP_REGION_WORKSPACE);
}

/* The forward's weights, W^T packed once per step for all of the device's
 * micro-batches: the forward runs layer by layer, so one buffer, after the
 * GEMMs' workspace, serves every layer; micro-batch 0 packs it, the others
 * read it (the same bits: gemm.h). NULL with one micro-batch, or when the
 * region has no room (an undersized plan, the emulated GPU's). */
static size_t packed_wt_at(size_t gemm_ws) { return (gemm_ws + 63) / 64 * 64; }

static const float *packed_wt(const lctx *c, const float *w) {
  const dp_plan *p = c->p;
  int d = c->d, in = dp__pos_in(c->l), out = dp__pos_out(c->l);
  if (p->split.dev_mb0[d + 1] - p->split.dev_mb0[d] < 2) return NULL;
  /* a recompute (config.recompute), or a segment's forward micro-batch by
   * micro-batch: other layers' weights are packed in between */
  if (!dp__forward_layer_major(p, c->op)) return NULL;
  size_t at = packed_wt_at(
      dp__model_workspace_bytes(&p->model, p->act[d].mb_rows, !p->cfg.inference));
  if (at + dp__gemm_packed_b_bytes(in, out) > ws_bytes(c)) return NULL;
  float *dst =
      (float *)((unsigned char *)dp__region_ptr(c->e, d, DP_REGION_WORKSPACE) + at);
  if (c->mb == 0) dp__gemm_pack_b(1, in, out, w, in, dst);
  return dst;
}

/* Dropout's multiplier for row r (of this micro-batch) and element j: keyed
 * by the global row, so the mask does not depend on the split. */
static float dropout_scale(const lctx *c, int r, int j) {
  uint64_t row =
      (uint64_t)(c->e->row_base + c->e->plan->split.dev_row0[c->d] + c->local + r);
  float u = dp__rng_uniform(c->e->plan->cfg.seed, DP_RNG_DROPOUT,
                            (c->e->step << 16) | (uint64_t)c->i, row, (uint64_t)j);
  return u >= c->l->p ? 1.0f / (1.0f - c->l->p) : 0.0f;
}

/* Attention dropout's keys for this op: the dropout layer's (dropout_scale). */
static dp_attn_drop attn_drop(const lctx *c) {
  return (dp_attn_drop){
      .on = c->e->training && c->l->p > 0.0f,
      .seed = c->e->plan->cfg.seed,
      .key = (c->e->step << 16) | (uint64_t)c->i,
      .row0 = (uint64_t)(c->e->row_base + c->e->plan->split.dev_row0[c->d] + c->local)};
}

/* Branch-free and alias-free, so they vectorise (gemm.h: DP_SIMD_FN): the
 * signs of activations are random, and a branch per element mispredicts half
 * the time. NaN passes through, as in PyTorch. */
static inline DP_SIMD_BODY int relu_forward_body(const float *restrict x, float *restrict y,
                                                 size_t n) {
  for (size_t k = 0; k < n; k++) y[k] = x[k] <= 0.0f ? 0.0f : x[k];
  return 0;
}
DP_SIMD_FN(relu_forward, (const float *restrict x, float *restrict y, size_t n), (x, y, n))

static inline DP_SIMD_BODY int relu_backward_body(const float *restrict y,
                                                  const float *restrict dy,
                                                  float *restrict dx, size_t n) {
  for (size_t k = 0; k < n; k++) {
    float g = dy[k]; /* loaded unconditionally, so the select needs no branch */
    dx[k] = y[k] <= 0.0f ? 0.0f : g;
  }
  return 0;
}
DP_SIMD_FN(relu_backward,
           (const float *restrict y, const float *restrict dy, float *restrict dx,
            size_t n),
           (y, dy, dx, n))

/* The smooth activations' loops from their element functions, vectorised
 * (gemm.h: DP_SIMD_FN512): forward y = f(x), backward dx = g(x, dy) from the
 * input. gelu (tanh approximation: cpu/gelu.h), tanh through dp__tanhf
 * (util/tanh.h), the exact gelu through dp__erff (util/erf.h), sigmoid and
 * silu through dp__expf (util/expf.h): the same bits on every tier and on the
 * CUDA kernels (unlike libm's). */
#define ACT_FORWARD(name, f)                                                               \
  static inline DP_SIMD_BODY int name##_body(const float *restrict x, float *restrict y,   \
                                             size_t n) {                                   \
    for (size_t k = 0; k < n; k++) y[k] = f(x[k]);                                         \
    return 0;                                                                              \
  }                                                                                        \
  DP_SIMD_FN512(name, (const float *restrict x, float *restrict y, size_t n), (x, y, n))
#define ACT_BACKWARD(name, g)                                                              \
  static inline DP_SIMD_BODY int name##_body(                                              \
      const float *restrict x, const float *restrict dy, float *restrict dx, size_t n) {   \
    for (size_t k = 0; k < n; k++) dx[k] = g(x[k], dy[k]);                                 \
    return 0;                                                                              \
  }                                                                                        \
  DP_SIMD_FN512(                                                                           \
      name,                                                                                \
      (const float *restrict x, const float *restrict dy, float *restrict dx, size_t n),   \
      (x, dy, dx, n))

/* sigmoid 1 / (1 + e^-x) and silu x / (1 + e^-x), its derivative s (1 + x (1
 * - s)) with s the sigmoid: as PyTorch's CPU kernels write them and
 * cuda/kernels.cu computes them */
static inline __attribute__((always_inline)) float sigmoid_of(float v) {
  return 1.0f / (1.0f + dp__expf(-v));
}
static inline __attribute__((always_inline)) float silu_of(float v) {
  return v / (1.0f + dp__expf(-v));
}
static inline __attribute__((always_inline)) float silu_grad(float v, float dy) {
  float s = 1.0f / (1.0f + dp__expf(-v));
  return dy * s * (1.0f + v * (1.0f - s));
}

ACT_FORWARD(gelu_forward, dp__gelu)
ACT_BACKWARD(gelu_backward, dp__gelu_grad)
ACT_FORWARD(gelu_erf_forward, dp__gelu_erf)
ACT_BACKWARD(gelu_erf_backward, dp__gelu_erf_grad)
ACT_FORWARD(sigmoid_forward, sigmoid_of)
ACT_FORWARD(tanh_forward, dp__tanhf)
ACT_FORWARD(silu_forward, silu_of)
ACT_BACKWARD(silu_backward, silu_grad)

/* leaky_relu: x > 0 ? x : x slope (NaN: NaN); the backward by the sign of
 * xy: the output's, which is the input's for a slope >= 0 and keeps the input
 * dead, or the input's itself for a negative slope (dp__layer_needs_input) */
static inline DP_SIMD_BODY int
leaky_forward_body(const float *restrict x, float *restrict y, size_t n, float slope) {
  for (size_t k = 0; k < n; k++) y[k] = x[k] > 0.0f ? x[k] : x[k] * slope;
  return 0;
}
DP_SIMD_FN(leaky_forward,
           (const float *restrict x, float *restrict y, size_t n, float slope),
           (x, y, n, slope))

static inline DP_SIMD_BODY int leaky_backward_body(const float *restrict xy,
                                                   const float *restrict dy,
                                                   float *restrict dx, size_t n,
                                                   float slope) {
  for (size_t k = 0; k < n; k++) dx[k] = xy[k] > 0.0f ? dy[k] : dy[k] * slope;
  return 0;
}
DP_SIMD_FN(leaky_backward,
           (const float *restrict xy, const float *restrict dy, float *restrict dx,
            size_t n, float slope),
           (xy, dy, dx, n, slope))

/* relu_backward with dy = dx, in place (dp__relu_bwd_fused). */
static inline DP_SIMD_BODY int relu_mask_body(const float *restrict y, float *restrict dx,
                                              size_t n) {
  for (size_t k = 0; k < n; k++) dx[k] = y[k] <= 0.0f ? 0.0f : dx[k];
  return 0;
}
DP_SIMD_FN(relu_mask, (const float *restrict y, float *restrict dx, size_t n), (y, dx, n))
void dp__relu_mask(const float *y, float *dx, size_t n) { relu_mask(y, dx, n); }

dp_status dp__cpu_forward(const lctx *c) {
  const dp_layer *l = c->l;
  if (dp__layer_is_view(&c->p->model, c->i)) return DP_OK; /* flatten: nothing moves */
  const float *x = layer_in(c);
  float *y = layer_out(c);
  int n = c->rows, in = l->in, out = l->out;
  if (l->kind == DP_LAYER_LINEAR || l->kind == DP_LAYER_LAYERNORM) {
    /* on a sequence: every position a row, the widths per position */
    n *= dp__positions(l);
    in = dp__pos_in(l);
    out = dp__pos_out(l);
  }
  switch (l->kind) {
  case DP_LAYER_EMBEDDING: dp__embed_forward(l, n, x, layer_params(c), y); break;
  case DP_LAYER_ATTENTION: {
    dp_attn_drop drop = attn_drop(c);
    if (!dp__attention_forward(l, n, x, layer_stats(c), y, &drop,
                               dp__region_ptr(c->e, c->d, DP_REGION_WORKSPACE),
                               ws_bytes(c)))
      return DP_FAIL(DP_ERR_BACKEND,
                     "layer %d: the plan's workspace is too small for attention dropout",
                     c->i);
    break;
  }
  case DP_LAYER_RESIDUAL_END: { /* x + f(x): the block's input, then its output */
    const float *skip = ptr(c, c->o.skip);
    for (size_t k = 0; k < (size_t)n * out; k++) y[k] = skip[k] + x[k];
    break;
  }
  case DP_LAYER_RESIDUAL:
  case DP_LAYER_SHORTCUT: break;      /* views */
  case DP_LAYER_LINEAR: {             /* y (n, out) = x (n, in) · w^T + b */
    const float *w = layer_params(c); /* (out, in) */
    dp_gemm_epilogue ep = {.bias = l->bias ? w + (size_t)out * in : NULL};
    if (dp__relu_fused(c->p, c->i + 1)) {
      /* the relu after it, in the epilogue: straight into the relu's output */
      lctx r = at_layer(c, c->i + 1);
      y = layer_out(&r);
      ep.act = DP_GEMM_ACT_RELU;
    }
    dp__sgemm_pb(0, 1, n, out, in, x, in, w, in, packed_wt(c, w), y, out, &ep,
                 gemm_ws(c, n, out, in));
    break;
  }
  case DP_LAYER_RELU: /* done by the linear before it when fused */
    if (!dp__relu_fused(c->p, c->i)) relu_forward(x, y, (size_t)n * out);
    break;
  case DP_LAYER_TANH: tanh_forward(x, y, (size_t)n * out); break;
  case DP_LAYER_SIGMOID: sigmoid_forward(x, y, (size_t)n * out); break;
  case DP_LAYER_GELU: gelu_forward(x, y, (size_t)n * out); break;
  case DP_LAYER_GELU_ERF: gelu_erf_forward(x, y, (size_t)n * out); break;
  case DP_LAYER_SILU: silu_forward(x, y, (size_t)n * out); break;
  case DP_LAYER_LEAKY_RELU: leaky_forward(x, y, (size_t)n * out, l->slope); break;
  case DP_LAYER_LAYERNORM: {
    const float *g = layer_params(c), *b = g + out;
    /* stats (rows, 2): mean, rstd */
    dp__layernorm_forward(n, out, c->l->eps, x, g, b, layer_stats(c), y);
    break;
  }
  case DP_LAYER_DROPOUT:
    if (!c->e->training || l->p == 0.0f) {
      memcpy(y, x, (size_t)n * out * 4);
      break;
    }
    for (int r = 0; r < n; r++)
      for (int k = 0; k < out; k++) {
        size_t idx = (size_t)r * out + k;
        y[idx] = x[idx] * dropout_scale(c, r, k);
      }
    break;
  case DP_LAYER_CONV2D: {
    bool relu = dp__relu_fused(c->p, c->i + 1);
    if (relu) { /* straight into the relu's output */
      lctx r = at_layer(c, c->i + 1);
      y = layer_out(&r);
    }
    if (!dp__conv_forward(l, n, x, layer_params(c), y, relu,
                          dp__region_ptr(c->e, c->d, DP_REGION_WORKSPACE), ws_bytes(c)))
      return DP_FAIL(DP_ERR_BACKEND,
                     "layer %d: the plan's workspace is too small for conv2d", c->i);
    break;
  }
  case DP_LAYER_MAXPOOL2D:
  case DP_LAYER_AVGPOOL2D: dp__pool_forward(l, n, x, y); break;
  case DP_LAYER_FLATTEN: /* a view, but the last layer's output is OUTPUTS: a copy */
    if (c->i == c->L - 1) memcpy(y, x, (size_t)n * out * 4);
    break;
  case DP_LAYER_BATCHNORM: bn_forward(c, x, y); break;
  case DP_LAYER_INPUT: break;
  }
  return DP_OK;
}

/* Backward of one layer on one micro-batch; parameter grads are written (not
 * accumulated) at grads (a slot of the canonical tree). */
static int grad_add(float *restrict dst, const float *restrict src, size_t n);

dp_status dp__cpu_backward(const lctx *c, float *grads) {
  const dp_layer *l = c->l;
  if (l->kind == DP_LAYER_RESIDUAL) { /* dx (its input's gradient, in place) += dskip */
    float *dx = layer_din(c);
    const float *ds = ptr(c, c->o.skip);
    if (dx && ds) grad_add(dx, ds, (size_t)c->rows * l->out);
    return DP_OK;
  }
  if (dp__layer_is_view(&c->p->model, c->i)) return DP_OK;
  /* a relu before a linear: done by the linear's grad-input product */
  if (dp__relu_bwd_fused(c->p, c->i)) return DP_OK;
  int n = c->rows, in = l->in, out = l->out;
  const float *dy = layer_dout(c);
  /* A linear after such a relu writes the relu's input gradient, masked by the
   * relu's output (its own input). */
  bool masked = c->i > 0 && dp__relu_bwd_fused(c->p, c->i - 1);
  lctx din = masked ? at_layer(c, c->i - 1) : *c;
  float *dx = layer_din(&din); /* NULL: the input's gradient is not needed */
  if (l->kind == DP_LAYER_LINEAR || l->kind == DP_LAYER_LAYERNORM) {
    n *= dp__positions(l); /* as the forward */
    in = dp__pos_in(l);
    out = dp__pos_out(l);
  }
  switch (l->kind) {
  case DP_LAYER_EMBEDDING:
    dp__embed_backward(l, n, layer_in(c), dy, grads + l->param_off);
    break;
  case DP_LAYER_ATTENTION: {
    dp_attn_drop drop = attn_drop(c);
    if (dx && !dp__attention_backward(l, n, layer_in(c), layer_stats(c), dy, dx, &drop,
                                      dp__region_ptr(c->e, c->d, DP_REGION_WORKSPACE),
                                      ws_bytes(c)))
      return DP_FAIL(DP_ERR_BACKEND,
                     "layer %d: the plan's workspace is too small for attention", c->i);
    break;
  }
  case DP_LAYER_RESIDUAL_END: {     /* the block's output gets dy; x gets it at the begin */
    float *df = ptr(c, c->o.dskip); /* with a shortcut: f's output, g's is dx */
    if (dx) memcpy(dx, dy, (size_t)n * out * 4);
    if (df) memcpy(df, dy, (size_t)n * out * 4);
    break;
  }
  case DP_LAYER_RESIDUAL: break; /* above */
  case DP_LAYER_SHORTCUT: break; /* a view */
  case DP_LAYER_LINEAR: {
    const float *w = layer_params(c), *x = layer_in(c);
    float *dw = grads + l->param_off, *db = l->bias ? dw + (size_t)out * in : NULL;
    /* dw (out, in) = dy^T (out, n) · x (n, in): summed over the rows in order */
    dp__sgemm(1, 0, out, in, n, dy, out, x, in, dw, in, NULL, gemm_ws(c, out, in, n));
    if (db) dp__gemm_colsum(n, out, dy, out, db);
    /* dx (n, in) = dy (n, out) · w (out, in); then the relu's backward in place
     * (x, its output, <= 0 gives 0): one streaming pass, faster here than a
     * mask applied tile by tile in the GEMM (PERFORMANCE.md, round four) */
    if (dx)
      dp__sgemm(0, 0, n, in, out, dy, out, w, in, dx, in, NULL, gemm_ws(c, n, in, out));
    if (dx && masked) relu_mask(x, dx, (size_t)n * in);
    break;
  }
  case DP_LAYER_RELU: {
    const float *y = layer_out(c);
    if (dx) relu_backward(y, dy, dx, (size_t)n * out);
    break;
  }
  case DP_LAYER_TANH: {
    const float *y = layer_out(c);
    if (dx)
      for (size_t k = 0; k < (size_t)n * out; k++) dx[k] = dy[k] * (1.0f - y[k] * y[k]);
    break;
  }
  case DP_LAYER_SIGMOID: {
    const float *y = layer_out(c);
    if (dx)
      for (size_t k = 0; k < (size_t)n * out; k++) dx[k] = dy[k] * y[k] * (1.0f - y[k]);
    break;
  }
  case DP_LAYER_GELU: {
    const float *x = layer_in(c);
    if (dx) gelu_backward(x, dy, dx, (size_t)n * out);
    break;
  }
  case DP_LAYER_GELU_ERF:
    if (dx) gelu_erf_backward(layer_in(c), dy, dx, (size_t)n * out);
    break;
  case DP_LAYER_SILU:
    if (dx) silu_backward(layer_in(c), dy, dx, (size_t)n * out);
    break;
  case DP_LAYER_LEAKY_RELU:
    if (dx) /* the input where its sign is not the output's (a negative slope) */
      leaky_backward(dp__layer_needs_input(l) ? layer_in(c) : layer_out(c), dy, dx,
                     (size_t)n * out, l->slope);
    break;
  case DP_LAYER_LAYERNORM: {
    float *dg = grads + l->param_off;
    dp__layernorm_backward(n, out, layer_in(c), layer_stats(c), layer_params(c), dy, dg,
                           dg + out, dx);
    break;
  }
  case DP_LAYER_DROPOUT:
    if (dx) {
      for (int r = 0; r < n; r++)
        for (int k = 0; k < out; k++) {
          size_t idx = (size_t)r * out + k;
          dx[idx] = l->p == 0.0f ? dy[idx] : dy[idx] * dropout_scale(c, r, k);
        }
    }
    break;
  case DP_LAYER_CONV2D: {
    float *dw = grads + l->param_off;
    float *db = l->bias ? dw + (l->n_params - (size_t)l->c) : NULL;
    if (!dp__conv_backward(l, n, layer_in(c), layer_params(c), dy, dw, db, dx,
                           dp__region_ptr(c->e, c->d, DP_REGION_WORKSPACE), ws_bytes(c)))
      return DP_FAIL(DP_ERR_BACKEND,
                     "layer %d: the plan's workspace is too small for conv2d", c->i);
    break;
  }
  case DP_LAYER_MAXPOOL2D:
  case DP_LAYER_AVGPOOL2D:
    /* masked: the relu before it, its input (dp__relu_bwd_fused) */
    if (dx)
      dp__pool_backward(l, n, l->kind == DP_LAYER_MAXPOOL2D ? layer_in(c) : NULL, dy, dx,
                        masked);
    break;
  case DP_LAYER_FLATTEN: /* a view; the last layer's gradient comes in OUTPUT_GRADS */
    if (dx && c->i == c->L - 1) memcpy(dx, dy, (size_t)n * out * 4);
    break;
  case DP_LAYER_BATCHNORM: bn_backward(c, layer_in(c), dy, dx, grads); break;
  case DP_LAYER_INPUT: break;
  }
  return DP_OK;
}

/* Loss sum over the rows of micro-batch mb, with the gradient of the mean
 * loss written beside it. o, t and g hold rows from row `base` on; `rows` is
 * the step's whole batch (the mean's denominator). */
static float loss_rows(const dp_exec_env *e, const dp_mb *mb, int base, const float *o,
                       const void *target, float *g) {
  const dp_plan *p = e->plan;
  int rows = e->loss_rows;
  int out = dp_model_output_width(&p->model);
  float s = 0.0f;
  size_t r0 = (size_t)(mb->row0 - base), r1 = r0 + (size_t)mb->rows;
  if (p->model.loss == DP_LOSS_MSE) {
    const float *t = target;
    float scale = 2.0f / ((float)rows * (float)out);
    for (size_t idx = r0 * out; idx < r1 * out; idx++) {
      float diff = o[idx] - t[idx];
      s += diff * diff;
      g[idx] = scale * diff;
    }
    return s;
  }
  if (dp__loss_on_targets(p->model.loss))
    return dp__elem_loss(p->model.loss, p->model.loss_param,
                         p->model.n_pos_weight ? p->model.pos_weight : NULL, (size_t)out, o,
                         target, g, r0 * out, r1 * out, 1.0f / ((float)rows * (float)out));
  /* a sequence's every position is a row of `out / P` classes */
  const int32_t *t = target;
  size_t P = (size_t)dp_model_positions(&p->model);
  out /= (int)P;
  r0 *= P, r1 *= P;
  if (dp__ce_has_opts(&p->model))
    return dp__softmax_xent_opts(o, t, g, r0, r1, out, &p->model.ce, e->loss_inv);
  float inv = 1.0f / ((float)rows * (float)P);
  return dp__softmax_xent(o, t, g, r0, r1, out, inv);
}

/* Loss terms of the op's micro-batches (dp__loss_operands: classic mode's
 * gathered outputs on device 0, or a run of a device's own micro-batches), one
 * sum per micro-batch. */
static dp_status loss_op(dp_exec_env *e, const dp_op *op) {
  dp_loss_operands lo;
  dp__loss_operands(e->plan, op, &lo);
  int d = op->device;
  const float *o = dp__span_ptr(e, d, lo.out);
  float *g = dp__span_ptr(e, d, lo.dout), *part = dp__span_ptr(e, d, lo.sums);
  const void *t = dp__span_ptr(e, d, lo.targets);
  for (int k = 0; k < op->n_mb; k++)
    part[k] = loss_rows(e, &e->mbs[op->micro_batch + k], op->row0, o, t, g);
  return DP_OK;
}

/* Canonical pairwise sum of v[lo, hi), leaving out empty micro-batches (the
 * same tree the gradients take). mbs[lo] is not empty. */
static float tree_sum(const float *v, const dp_mb *mbs, int lo, int hi) {
  if (hi - lo == 1) return v[lo];
  int mid = (lo + hi + 1) / 2;
  float left = tree_sum(v, mbs, lo, mid);
  return mbs[mid].rows ? left + tree_sum(v, mbs, mid, hi) : left;
}

/* The loss from every micro-batch's sum, combined in the canonical tree, so
 * its bits do not depend on the split or the mode. */
static dp_status loss_sum_op(dp_exec_env *e, const dp_op *op) {
  const dp_plan *p = e->plan;
  float denom = (float)op->rows * (dp__loss_on_targets(p->model.loss)
                                       ? (float)dp_model_output_width(&p->model)
                                       : (float)dp_model_positions(&p->model));
  if (dp__ce_has_opts(&p->model)) denom = e->loss_denom; /* the targets' (ctx.c) */
  e->loss = tree_sum(region(e, 0, DP_REGION_LOSS, 0), e->mbs, 0, op->n_mb) / denom;
  if (!isfinite(e->loss))
    return DP_FAIL(DP_ERR_NONFINITE, "the loss is %s; the step was not applied",
                   isnan(e->loss) ? "NaN" : "infinite");
  return DP_OK;
}

/* 1 when x is NaN or infinite: all exponent bits set. Branch-free, so scans
 * vectorise; the slow search for the index runs only when one says so. */
static inline uint32_t nonfinite_bit(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return (b & 0x7f800000u) == 0x7f800000u;
}

/* ---- the optimizers: PyTorch's element rules, written once ----------------------
 * The update applies them; the check before the commit phase evaluates the same
 * expressions without storing, so a step whose update would leave a parameter
 * or its state non-finite is refused with nothing written. */
typedef struct {
  /* mu: the momentum in effect, SGD's momentum or Adam(W)'s beta1 */
  float lr, wd, mu, keep, b2, eps, step_size, bc2_sqrt, decay;
  bool first, nesterov, ams; /* ams: config.amsgrad (the plan's dp__amsgrad) */
} opt_consts;

/* The rate and the momentum in effect (dp_exec_env.lr, .momentum: SGD's
 * momentum or Adam's beta1), the config's until dp_set_lr or dp_set_momentum
 * changes them. */
static opt_consts opt_consts_of(const dp_config *c, const dp_exec_env *e) {
  uint64_t step = e->step;
  float lr = e->lr;
  opt_consts u = {.lr = lr,
                  .wd = c->weight_decay,
                  .mu = e->momentum,
                  .keep = 1.0f - c->dampening, /* 1 - 0 is exactly 1 */
                  .b2 = c->beta2,
                  .eps = c->eps,
                  .decay = 1.0f - lr * c->weight_decay,
                  .first = step == 0,
                  .nesterov = c->nesterov != 0,
                  .ams = dp__amsgrad(c)};
  if (c->optimizer == DP_OPT_ADAMW || c->optimizer == DP_OPT_ADAM) {
    double t = (double)step + 1.0;
    /* beta1 in effect: PyTorch's 1 - beta1 ** step takes the group's current one */
    double bc1 = 1.0 - pow(e->momentum, t), bc2 = 1.0 - pow(c->beta2, t);
    u.step_size = (float)(lr / bc1);
    u.bc2_sqrt = (float)sqrt(bc2);
  }
  return u;
}

/* SGD: w - lr (g + wd w). */
static inline float sgd_w(const opt_consts *u, float w, float g) {
  return w - u->lr * (g + u->wd * w);
}
/* torch.optim.SGD with momentum: g' = g + wd w; buf = g' on the first step,
 * else mu buf + (1 - dampening) g'; the step is buf, or g' + mu buf (nesterov). */
static inline float mom_g(const opt_consts *u, float w, float g) {
  return u->wd != 0.0f ? g + u->wd * w : g;
}
static inline float mom_buf(const opt_consts *u, float buf, float gk) {
  return u->first ? gk : u->mu * buf + u->keep * gk;
}
static inline float mom_w(const opt_consts *u, float w, float gk, float buf) {
  return w - u->lr * (u->nesterov ? gk + u->mu * buf : buf);
}
/* AdamW (decoupled decay): m, v moments, then w decay - step_size m / denom. */
static inline float adam_m(const opt_consts *u, float m, float g) {
  return u->mu * m + (1.0f - u->mu) * g; /* mu: beta1 */
}
static inline float adam_v(const opt_consts *u, float v, float g) {
  return u->b2 * v + (1.0f - u->b2) * g * g;
}
static inline float adam_w(const opt_consts *u, float w, float m, float v) {
  float denom = sqrtf(v) / u->bc2_sqrt + u->eps;
  return w * u->decay - u->step_size * (m / denom);
}
/* torch.optim.Adam: the L2 term joins the gradient before the moments (mom_g's
 * g + wd w), and the step has no decay factor. */
static inline float adam_l2_w(const opt_consts *u, float w, float m, float v) {
  float denom = sqrtf(v) / u->bc2_sqrt + u->eps;
  return w - u->step_size * (m / denom);
}
/* amsgrad: torch.maximum(v_hat, v), stored, and the denominator's v in
 * adam_w / adam_l2_w (PyTorch's single-tensor path: the same expression with
 * v_hat for v). Both are finite and >= 0 here, so no NaN rule is needed. */
static inline float adam_vhat(float vh, float v) { return v > vh ? v : vh; }

/* 1 when the update of element k would leave a non-finite parameter or state
 * word; branch-free per element so that the scan vectorises. s: the first
 * state vector (momentum, AdamW's m) at this range, sv: AdamW's v, sh:
 * amsgrad's v_hat (NULL without it). */
static inline uint32_t update_bad(dp_optimizer o, const opt_consts *u, const float *w,
                                  const float *g, const float *s, const float *sv,
                                  const float *sh, size_t k) {
  switch (o) {
  case DP_OPT_SGD: return nonfinite_bit(sgd_w(u, w[k], g[k]));
  case DP_OPT_MOMENTUM: {
    float gk = mom_g(u, w[k], g[k]), b = mom_buf(u, s[k], gk);
    return nonfinite_bit(b) | nonfinite_bit(mom_w(u, w[k], gk, b));
  }
  case DP_OPT_ADAMW: {
    float m = adam_m(u, s[k], g[k]), v = adam_v(u, sv[k], g[k]);
    float d = u->ams ? adam_vhat(sh[k], v) : v; /* the denominator's */
    return nonfinite_bit(m) | nonfinite_bit(v) | nonfinite_bit(d) |
           nonfinite_bit(adam_w(u, w[k], m, d));
  }
  case DP_OPT_ADAM: {
    float gk = mom_g(u, w[k], g[k]), m = adam_m(u, s[k], gk), v = adam_v(u, sv[k], gk);
    float d = u->ams ? adam_vhat(sh[k], v) : v;
    return nonfinite_bit(m) | nonfinite_bit(v) | nonfinite_bit(d) |
           nonfinite_bit(adam_l2_w(u, w[k], m, d));
  }
  }
  return 0;
}

static inline DP_SIMD_BODY int
update_scan_body(dp_optimizer o, const opt_consts *u, const float *restrict w,
                 const float *restrict g, const float *restrict s, const float *restrict sv,
                 const float *restrict sh, size_t n) {
  /* one loop per optimizer, each free of branches, so that it vectorises */
  const opt_consts v = *u;
  uint32_t bad = 0;
  switch (o) {
  case DP_OPT_SGD: /* exact: the element rule with the optimizer a constant */
    for (size_t k = 0; k < n; k++) bad |= update_bad(DP_OPT_SGD, &v, w, g, s, sv, sh, k);
    break;
  case DP_OPT_MOMENTUM:
    for (size_t k = 0; k < n; k++)
      bad |= update_bad(DP_OPT_MOMENTUM, &v, w, g, s, sv, sh, k);
    break;
  case DP_OPT_ADAMW: {
    /* Conservative, without AdamW's sqrt and division: the moments finite and
     * |w decay| + step_size |m| / eps (denom >= eps) below FLT_MAX / 2 cannot
     * give a non-finite parameter; an element that fails the bound is decided
     * exactly by the caller's search. amsgrad's v_hat is the larger of v and
     * the stored v_hat (finite), so v finite covers it. */
    float inv_eps = 1.0f / v.eps, dec = fabsf(v.decay), lim = FLT_MAX / 2;
    for (size_t k = 0; k < n; k++) {
      float m = adam_m(&v, s[k], g[k]), vv = adam_v(&v, sv[k], g[k]);
      float bound = fabsf(w[k]) * dec + v.step_size * (fabsf(m) * inv_eps);
      bad |= nonfinite_bit(m) | nonfinite_bit(vv) | (uint32_t) !(bound <= lim);
    }
    break;
  }
  case DP_OPT_ADAM: {
    /* the same bound on Adam's step (no decay factor) */
    float inv_eps = 1.0f / v.eps, lim = FLT_MAX / 2;
    for (size_t k = 0; k < n; k++) {
      float gk = mom_g(&v, w[k], g[k]);
      float m = adam_m(&v, s[k], gk), vv = adam_v(&v, sv[k], gk);
      float bound = fabsf(w[k]) + v.step_size * (fabsf(m) * inv_eps);
      bad |= nonfinite_bit(m) | nonfinite_bit(vv) | (uint32_t) !(bound <= lim);
    }
    break;
  }
  }
  return bad != 0;
}
DP_SIMD_FN(update_scan,
           (dp_optimizer o, const opt_consts *u, const float *restrict w,
            const float *restrict g, const float *restrict s, const float *restrict sv,
            const float *restrict sh, size_t n),
           (o, u, w, g, s, sv, sh, n))

/* The gradients of this device's optimizer range are finite, and so is every
 * value the update would write (parameters and optimizer state). */
/* The optimizer state of parameters [off, off + n) of device d (the core's
 * view, lib/core/operands.c): the first state vector at *s, AdamW's second at
 * *sv, amsgrad's v_hat at *sh; NULL where the optimizer has none. An op may
 * cover part of the device's range (the executor shares elementwise ops out). */
static dp_status opt_state(const dp_exec_env *e, int d, size_t off, size_t n, float **s,
                           float **sv, float **sh) {
  dp_opt_operands o;
  dp_status st = dp__opt_operands(e->plan, d, off, n, DP_REGION_GRADS, off * 4, &o);
  *s = dp__span_ptr(e, d, o.state[0]);
  *sv = dp__span_ptr(e, d, o.state[1]);
  *sh = dp__span_ptr(e, d, o.state[2]);
  return st;
}

static dp_status grad_check_op(dp_exec_env *e, const dp_op *op) {
  const dp_config *c = &e->plan->cfg;
  int d = op->device;
  size_t n = op->bytes / 4, off = op->src_offset / 4;
  const float *g = region(e, d, op->src_region, op->src_offset);
  const float *w = region(e, d, DP_REGION_PARAMS, op->src_offset);
  float *s, *sv, *sh;
  dp_status st = opt_state(e, d, off, n, &s, &sv, &sh);
  if (st) return st;
  opt_consts u = opt_consts_of(c, e);
  /* One pass: a non-finite gradient makes its update non-finite too, so the
   * update scan covers both (conservatively for AdamW); the exact search says
   * which, if any. */
  if (!update_scan(c->optimizer, &u, w, g, s, sv, sh, n)) return DP_OK;
  for (size_t k = 0; k < n; k++)
    if (!isfinite(g[k]))
      return DP_FAIL(DP_ERR_NONFINITE, "gradient %zu is %s; the step was not applied",
                     off + k, isnan(g[k]) ? "NaN" : "infinite");
  for (size_t k = 0; k < n; k++)
    if (update_bad(c->optimizer, &u, w, g, s, sv, sh, k))
      return DP_FAIL(DP_ERR_NONFINITE,
                     "the update would make parameter %zu or its optimizer state "
                     "non-finite (lr %g, weight_decay %g); the step was not applied",
                     off + k, (double)e->lr, (double)c->weight_decay);
  return DP_OK; /* the bound was only cautious */
}

/* PyTorch's update rules on n parameters. Alias-free loops so that they
 * vectorise (the same IEEE operations per element either way). */
static inline DP_SIMD_BODY int update_body(dp_optimizer o, const opt_consts *uc,
                                           float *restrict w, const float *restrict g,
                                           float *restrict s, float *restrict sv,
                                           float *restrict sh, size_t n) {
  const opt_consts u = *uc;
  switch (o) {
  case DP_OPT_SGD:
    for (size_t k = 0; k < n; k++) w[k] = sgd_w(&u, w[k], g[k]);
    break;
  case DP_OPT_MOMENTUM:
    for (size_t k = 0; k < n; k++) {
      float gk = mom_g(&u, w[k], g[k]);
      s[k] = mom_buf(&u, s[k], gk);
      w[k] = mom_w(&u, w[k], gk, s[k]);
    }
    break;
  case DP_OPT_ADAMW:
    if (u.ams) /* a loop of its own, so that each stays free of branches */
      for (size_t k = 0; k < n; k++) {
        float m = adam_m(&u, s[k], g[k]), v = adam_v(&u, sv[k], g[k]);
        float vh = adam_vhat(sh[k], v);
        s[k] = m;
        sv[k] = v;
        sh[k] = vh;
        w[k] = adam_w(&u, w[k], m, vh);
      }
    else
      for (size_t k = 0; k < n; k++) {
        float m = adam_m(&u, s[k], g[k]), v = adam_v(&u, sv[k], g[k]);
        s[k] = m;
        sv[k] = v;
        w[k] = adam_w(&u, w[k], m, v);
      }
    break;
  case DP_OPT_ADAM:
    if (u.ams)
      for (size_t k = 0; k < n; k++) {
        float gk = mom_g(&u, w[k], g[k]);
        float m = adam_m(&u, s[k], gk), v = adam_v(&u, sv[k], gk);
        float vh = adam_vhat(sh[k], v);
        s[k] = m;
        sv[k] = v;
        sh[k] = vh;
        w[k] = adam_l2_w(&u, w[k], m, vh);
      }
    else
      for (size_t k = 0; k < n; k++) {
        float gk = mom_g(&u, w[k], g[k]);
        float m = adam_m(&u, s[k], gk), v = adam_v(&u, sv[k], gk);
        s[k] = m;
        sv[k] = v;
        w[k] = adam_l2_w(&u, w[k], m, v);
      }
    break;
  }
  return 0;
}
DP_SIMD_FN(update,
           (dp_optimizer o, const opt_consts *uc, float *restrict w,
            const float *restrict g, float *restrict s, float *restrict sv,
            float *restrict sh, size_t n),
           (o, uc, w, g, s, sv, sh, n))

/* The update of parameters [off, off + n) of this device (its optimizer range
 * or a part of it: opt_state). */
static dp_status optimizer_op(dp_exec_env *e, const dp_op *op) {
  const dp_config *c = &e->plan->cfg;
  int d = op->device;
  float *s, *sv, *sh;
  dp_status st = opt_state(e, d, op->dst_offset / 4, op->bytes / 4, &s, &sv, &sh);
  if (st) return st;
  opt_consts u = opt_consts_of(c, e);
  update(c->optimizer, &u, region(e, d, DP_REGION_PARAMS, op->dst_offset),
         region(e, d, DP_REGION_GRADS, op->dst_offset), s, sv, sh, op->bytes / 4);
  return DP_OK;
}

/* ---- gradient clipping (config.clip_grad_norm) ---------------------------------
 * The squared norm is summed exactly: a float g is m * 2^(E - 150) with an
 * integer m < 2^24 (E its biased exponent; subnormals: E = 1 without the
 * implicit bit), so g^2 = m^2 * 2^(2E - 300) with m^2 < 2^48, added into a
 * 128-bit integer per exponent. Integer sums do not depend on order or on how
 * the gradients are cut between devices; the conversion to a double at the
 * end is one fixed computation. */
static dp_status grad_norm_op(dp_exec_env *e, const dp_op *op) {
  const float *g = region(e, op->device, op->src_region, op->src_offset);
  uint64_t *bins =
      (void *)region(e, op->device, op->dst_region, op->dst_offset); /* (256, 2) */
  memset(bins, 0, DP_NORM_BINS_BYTES);
  for (size_t k = 0; k < op->bytes / 4; k++) {
    uint32_t u;
    memcpy(&u, &g[k], 4);
    uint32_t E = (u >> 23) & 0xff, m = u & 0x7fffff;
    if (E == 0xff) { /* inf (lo) or NaN (hi): counted */
      bins[2 * 255 + (m != 0)]++;
      continue;
    }
    if (E)
      m |= 0x800000;
    else
      E = 1;
    uint64_t sq = (uint64_t)m * m, lo = bins[2 * E] + sq;
    bins[2 * E + 1] += lo < sq; /* the carry */
    bins[2 * E] = lo;
  }
  return DP_OK;
}

/* config.clip_grad_value: torch.clamp's rule, so a NaN stays NaN (the check
 * that follows refuses it) and an infinity becomes the bound. */
static dp_status grad_clamp_op(dp_exec_env *e, const dp_op *op) {
  float *g = region(e, op->device, op->dst_region, op->dst_offset);
  const float hi = e->plan->cfg.clip_grad_value, lo = -hi;
  for (size_t k = 0; k < op->bytes / 4; k++) g[k] = g[k] > hi ? hi : g[k] < lo ? lo : g[k];
  return DP_OK;
}

static dp_status grad_clip_op(dp_exec_env *e, const dp_op *op) {
  const uint64_t *slot =
      (const void *)region(e, op->device, op->src_region, op->src_offset);
  double total = 0.0;
  uint64_t infs = 0, nans = 0;
  for (int q = 0; q < op->n_mb; q++) {
    infs += slot[q * 2 * DP_NORM_BINS + 2 * 255];
    nans += slot[q * 2 * DP_NORM_BINS + 2 * 255 + 1];
  }
  for (int E = 254; E >= 1; E--) { /* the largest first */
    uint64_t lo = 0, hi = 0;
    for (int q = 0; q < op->n_mb; q++) {
      const uint64_t *b = slot + q * 2 * DP_NORM_BINS + 2 * E;
      lo += b[0];
      hi += b[1] + (lo < b[0]);
    }
    if (lo | hi) total += ldexp(ldexp((double)hi, 64) + (double)lo, 2 * E - 300);
  }
  float norm = nans ? NAN : infs ? INFINITY : (float)sqrt(total);
  if (op->device == 0) e->grad_norm = norm;
  /* a gradient that is not finite: the check that follows names it */
  if (!isfinite(norm)) return DP_OK;
  /* PyTorch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1 */
  float coef = e->plan->cfg.clip_grad_norm / (norm + 1e-6f);
  if (coef < 1.0f) {
    float *g = region(e, op->device, op->dst_region, op->dst_offset);
    for (size_t k = 0; k < op->bytes / 4; k++) g[k] *= coef;
  }
  return DP_OK;
}

/* ---- gradient accumulation (config.accumulate) -----------------------------------
 * The calls of an accumulation combine in a pairwise tree, as the
 * micro-batches of their concatenation would: slot l of the optimizer_state
 * region holds the sum of the 2^l calls before, and call k adds the slots of
 * the set bits of k (lowest first, each the left operand) to its own
 * gradient; a call that does not update then keeps the result in the slot of
 * k's lowest clear bit (the commit phase: GRAD_STASH). */
static dp_status grad_accum_op(dp_exec_env *e, const dp_op *op) {
  size_t n = op->bytes / 4;
  float *restrict g = region(e, op->device, op->dst_region, op->dst_offset);
  const float *slots = region(e, op->device, op->src_region, op->src_offset);
  int k = e->accum_k;
  for (int l = 0; (k >> l) & 1; l++) {
    const float *restrict s = slots + (size_t)l * n;
    if (op->flags & DP_OPF_ROUND_BF16) /* config.reduce_precision bf16 */
      for (size_t i = 0; i < n; i++) g[i] = dp__bf16_roundf(s[i] + g[i]);
    else
      for (size_t i = 0; i < n; i++) g[i] = s[i] + g[i];
  }
  if (k + 1 == dp__accumulate(&e->plan->cfg)) return DP_OK; /* the update's check follows */
  /* a call that only accumulates: its gradients must be finite to be kept */
  uint32_t bad = 0;
  for (size_t i = 0; i < n; i++) bad |= nonfinite_bit(g[i]);
  for (size_t i = 0; bad && i < n; i++)
    if (!isfinite(g[i]))
      return DP_FAIL(DP_ERR_NONFINITE, "gradient %zu is %s; the call was not accumulated",
                     op->dst_offset / 4 + i, isnan(g[i]) ? "NaN" : "infinite");
  return DP_OK;
}

static dp_status grad_stash_op(dp_exec_env *e, const dp_op *op) {
  size_t n = op->bytes / 4;
  int l = 0;
  while ((e->accum_k >> l) & 1) l++;
  float *slots = region(e, op->device, op->src_region, op->src_offset);
  memcpy(slots + (size_t)l * n, region(e, op->device, op->dst_region, op->dst_offset),
         n * 4);
  return DP_OK;
}

static inline DP_SIMD_BODY int grad_add_body(float *restrict dst, const float *restrict src,
                                             size_t n) {
  for (size_t k = 0; k < n; k++) dst[k] += src[k];
  return 0;
}
DP_SIMD_FN(grad_add, (float *restrict dst, const float *restrict src, size_t n),
           (dst, src, n))

/* config.reduce_precision bf16 (DP_OPF_ROUND_BF16): a sum of the tree,
 * computed in fp32 and rounded to bf16; DP_OPF_SRC_BF16: src is bf16. */
static inline DP_SIMD_BODY int grad_add_round_body(float *restrict dst,
                                                   const float *restrict src, size_t n) {
  for (size_t k = 0; k < n; k++) dst[k] = dp__bf16_roundf(dst[k] + src[k]);
  return 0;
}
DP_SIMD_FN(grad_add_round, (float *restrict dst, const float *restrict src, size_t n),
           (dst, src, n))

static inline DP_SIMD_BODY int grad_add_bf16_body(float *restrict dst,
                                                  const uint16_t *restrict src, size_t n) {
  for (size_t k = 0; k < n; k++) dst[k] = dp__bf16_roundf(dst[k] + dp__bf16_widen(src[k]));
  return 0;
}
DP_SIMD_FN(grad_add_bf16, (float *restrict dst, const uint16_t *restrict src, size_t n),
           (dst, src, n))

/* dst += src for a GRAD_ADD or COPY_ADD, as its flags say */
static void grad_sum(const dp_op *op, float *dst, const void *src) {
  size_t n = op->bytes / 4;
  if (op->flags & DP_OPF_SRC_BF16)
    grad_add_bf16(dst, src, n);
  else if (op->flags & DP_OPF_ROUND_BF16)
    grad_add_round(dst, src, n);
  else
    grad_add(dst, src, n);
}

/* A leaf of the bf16 tree (DP_OPF_ROUND_BF16 on a backward): the layer's
 * gradients rounded, unless its backward wrote bf16 values already (precision
 * bf16's linear and conv2d: lib/cpu/mixed.c). */
static void round_leaf(const lctx *c, const dp_op *op, float *grads) {
  dp_layer_kind k = c->l->kind;
  if (!(op->flags & DP_OPF_ROUND_BF16) || !c->l->n_params || !grads) return;
  if (c->p->cfg.precision == DP_PRECISION_BF16 &&
      (k == DP_LAYER_LINEAR || k == DP_LAYER_CONV2D))
    return;
  dp__bf16_round_f32_n(grads + c->l->param_off, c->l->n_params);
}

static dp_status layer_op(dp_exec_env *e, const dp_op *op) {
  lctx c = op_lctx(e, op);
  float *grads = region(e, op->device, op->dst_region, op->dst_offset);
  dp_status s;
  if (e->plan->cfg.precision == DP_PRECISION_BF16)
    s = op->kind == DP_OP_FORWARD ? dp__mixed_forward(&c) : dp__mixed_backward(&c, grads);
  else
    s = op->kind == DP_OP_FORWARD ? dp__cpu_forward(&c) : dp__cpu_backward(&c, grads);
  if (!s && op->kind == DP_OP_BACKWARD) round_leaf(&c, op, grads);
  return s;
}

static dp_status cpu_run(void *bctx, dp_exec_env *e, const dp_op *op) {
  (void)bctx;
  switch ((dp_op_kind)op->kind) {
  case DP_OP_FORWARD:
  case DP_OP_BACKWARD: return layer_op(e, op);
  case DP_OP_GRAD_ADD:
    grad_sum(op, region(e, op->device, op->dst_region, op->dst_offset),
             region(e, op->device, op->src_region, op->src_offset));
    return DP_OK;
  case DP_OP_GRAD_PACK:
    dp__bf16_from_f32_n(region(e, op->device, op->src_region, op->src_offset),
                        (dp_bf16 *)region(e, op->device, op->dst_region, op->dst_offset),
                        op->bytes / 4);
    return DP_OK;
  case DP_OP_GRAD_UNPACK:
    dp__bf16_to_f32_n(
        (const dp_bf16 *)region(e, op->device, op->src_region, op->src_offset),
        region(e, op->device, op->dst_region, op->dst_offset), op->bytes / 4);
    return DP_OK;
  case DP_OP_ZERO: { /* -0.0: x + -0.0 == x for every x, +0.0 and -0.0 included */
    float *dst = region(e, op->device, op->dst_region, op->dst_offset);
    for (size_t k = 0; k < op->bytes / 4; k++) dst[k] = -0.0f;
    return DP_OK;
  }
  case DP_OP_LOSS: return loss_op(e, op);
  case DP_OP_LOSS_SUM: return loss_sum_op(e, op);
  case DP_OP_BN_UPDATE: return bn_update(e, op);
  case DP_OP_BN_STATS:
  case DP_OP_BN_BWD_STATS: { /* they read the layer's activations: bf16 widens them */
    lctx c = op_lctx(e, op);
    if (e->plan->cfg.precision == DP_PRECISION_BF16) return dp__mixed_bn_sums(&c, op);
    return dp__cpu_bn_sums(&c, op);
  }
  case DP_OP_BN_MERGE: return bn_merge_op(e, op);
  case DP_OP_BN_FINAL: return bn_final_op(e, op);
  case DP_OP_GRAD_CHECK: return grad_check_op(e, op);
  case DP_OP_OPTIMIZER: return optimizer_op(e, op);
  case DP_OP_GRAD_NORM: return grad_norm_op(e, op);
  case DP_OP_GRAD_CLIP: return grad_clip_op(e, op);
  case DP_OP_GRAD_CLAMP: return grad_clamp_op(e, op);
  case DP_OP_GRAD_ACCUM: return grad_accum_op(e, op);
  case DP_OP_GRAD_STASH: return grad_stash_op(e, op);
  case DP_OP_ALLREDUCE: /* the transport's (the executor never hands it here) */
  case DP_OP_COPY_ADD:
  case DP_OP_COPY: break;
  }
  return DP_FAIL(DP_ERR_BACKEND, "cpu backend: op kind %d is not a compute op", op->kind);
}

/* ---- memory: host memory, reached directly ---------------------------------------- */

static size_t packed_wt_bytes(const dp_layer *l) {
  return dp__gemm_packed_b_bytes(dp__pos_in(l), dp__pos_out(l));
}

/* The packed GEMMs' buffers (gemm.h); with several micro-batches, then the
 * forward's packed weights (packed_wt) of the layers that pack them: a
 * recompute's segments of several layers do not, and room for them would be
 * bytes no op touches (an outside check: the plan was not exact then). */
static size_t cpu_workspace_bytes(const dp_plan *p, int d) {
  const dp_model *m = &p->model;
  bool training = !p->cfg.inference;
  int n_mb = p->split.dev_mb0[d + 1] - p->split.dev_mb0[d];
  if (p->cfg.precision == DP_PRECISION_BF16) return dp__mixed_workspace_bytes(p, d);
  size_t w = dp__model_workspace_bytes(m, p->act[d].mb_rows, training),
         pk = n_mb > 1 ? dp__layer_major_linear_max(p, packed_wt_bytes) : 0;
  return pk ? packed_wt_at(w) + pk : w;
}

static dp_status cpu_arena_alloc(const dp_plan *p, int dev, void **out) {
  size_t bytes = p->dev_bytes[dev];
  *out = aligned_alloc(p->align, bytes ? bytes : p->align);
  if (!*out)
    return DP_FAIL(DP_ERR_NOMEM, "device %d: cannot allocate its %zu-byte arena", dev,
                   bytes);
  return DP_OK;
}

static void cpu_arena_free(const dp_plan *p, int dev, void *arena) {
  (void)p, (void)dev;
  free(arena);
}

static dp_status cpu_copy_bytes(void *bctx, const dp_plan *p, int dev, void *dst,
                                const void *src, size_t bytes) {
  (void)bctx, (void)p, (void)dev;
  memcpy(dst, src, bytes);
  return DP_OK;
}

static dp_status cpu_fill_u32(const dp_plan *p, int dev, void *dst, uint32_t value,
                              size_t count) {
  (void)p, (void)dev;
  uint32_t *w = dst;
  for (size_t k = 0; k < count; k++) w[k] = value;
  return DP_OK;
}

/* ---- transport: virtual devices share one address space, so a copy is memcpy ---- */

static dp_status shm_copy(void *tctx, dp_exec_env *e, int dev, const dp_op *op) {
  (void)tctx, (void)dev;
  memcpy(dp__endpoint(e, op->dst_dev, op->dst_region, op->dst_offset),
         dp__endpoint(e, op->src_dev, op->src_region, op->src_offset), op->bytes);
  return DP_OK;
}

/* A reduction step in one pass: dst += src as grad_add does (the same bits as a
 * copy into comm and a GRAD_ADD), reading the other device's memory in place. */
static dp_status shm_copy_add(void *tctx, dp_exec_env *e, int dev, const dp_op *op) {
  (void)tctx, (void)dev;
  grad_sum(op, dp__endpoint(e, op->dst_dev, op->dst_region, op->dst_offset),
           dp__endpoint(e, op->src_dev, op->src_region, op->src_offset));
  return DP_OK;
}

static const dp_transport_ops shm_transport = {
    .name = "shm", .copy = shm_copy, .copy_add = shm_copy_add};

/* dp_bench_sgemm's cpu part: the GEMM on the calling thread (device 0). */
static dp_status cpu_bench_sgemm(int dev, int m, int n, int k, int iters, int tf32,
                                 double *ms, double *tflops) {
  if (dev != 0 || tf32)
    return DP_FAIL(DP_ERR_INVALID,
                   "dp_bench_sgemm: the cpu backend runs on the calling "
                   "thread (device 0) and has no TF32 (got device %d, "
                   "tf32 %d)",
                   dev, tf32);
  dp_status s = dp__gemm_bench(m, n, k, iters, ms);
  *tflops = !s && *ms > 0 ? 2.0 * m * n * k / (*ms * 1e9) : 0.0;
  return s;
}

/* dp_bench_gemm_bf16's cpu part: the bf16 GEMM on the calling thread (device 0). */
static dp_status cpu_bench_gemm_bf16(int dev, int m, int n, int k, int iters, double *ms) {
  if (dev != 0)
    return DP_FAIL(DP_ERR_INVALID,
                   "dp_bench_gemm_bf16: the cpu backend runs on the calling thread "
                   "(device 0), got device %d",
                   dev);
  return dp__gemm_bf16_bench(m, n, k, iters, ms);
}

/* The cpu backend's options (dp_config.backend_options). */
enum { OPT_PARAMS };
static const dp_backend_option cpu_options[] = {
    [OPT_PARAMS] =
        {"params", "copy|shared",
         "shared: the devices read one copy of the parameters, device 0's "
         "(classic mode or inference; the same bits for the same split, less memory and "
         "traffic)",
         .fit = true},
    {NULL, NULL, NULL},
};

static unsigned cpu_features(const dp_config *c, const int *opt) {
  (void)c;
  return opt[OPT_PARAMS] ? DP_FEATURE_SHARED_PARAMS : 0u;
}

/* The config on this backend, its options parsed: the refusal names the
 * option (the core's own check knows only the feature). */
static dp_status cpu_check_config(const dp_config *c, const int *opt) {
  if (opt[OPT_PARAMS] && !c->inference && c->mode != DP_MODE_CLASSIC)
    return DP_FAIL(DP_ERR_INVALID,
                   "params=shared needs classic mode or an inference plan: in %s mode "
                   "every replica updates its own copy (use params=copy)",
                   dp_mode_name(c->mode));
  return DP_OK;
}

/* The reference backend: synchronous (an op is done when it returns), no
 * backend context, no staging, no graphs. */
const dp_backend_ops dp__cpu_backend = {
    .name = "cpu",
    .options = cpu_options,
    .features = cpu_features,
    .check_config = cpu_check_config,
    .align = 64, /* a cache line */
    .workspace_bytes = cpu_workspace_bytes,
    .image_layers = true,
    .sequence_layers = true,
    .attention_dropout = true,
    .batchnorm = true,
    .mixed_bf16 = true,
    .reduce_bf16 = true,
    .fuses_linear_relu = true,  /* forward: the relu in the GEMM's epilogue */
    .fuses_conv_relu = true,    /* the relu in the conv's stores */
    .fuses_relu_maxpool = true, /* the relu's mask in the pool's dx stores */
    .host_staging = false,
    .grad_clip = true,
    .grad_clip_value = true,
    .accumulate = true,
    .host_memory = true,
    .arena_alloc = cpu_arena_alloc,
    .arena_free = cpu_arena_free,
    .read = cpu_copy_bytes,
    .write = cpu_copy_bytes,
    .fill_u32 = cpu_fill_u32,
    .transport = &shm_transport,
    .run = cpu_run,
    .bench_sgemm = cpu_bench_sgemm,
    .bench_gemm_bf16 = cpu_bench_gemm_bf16,
};
