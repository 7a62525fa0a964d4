/* The CUDA backend's device code (cuda/kernels.cu) and cuBLAS GEMMs
 * (cuda/gemm.cu), as host-side launchers for cuda/backend.cu. C++, internal.
 *
 * Every launcher enqueues on `st` and returns cudaGetLastError() (launch
 * errors only; faults during execution surface at dp__cuda_step_end). A
 * launcher given no elements enqueues nothing and returns cudaSuccess.
 *
 * Determinism: no floating-point atomics, and every reduction has a fixed
 * order that depends only on the shape (ascending loops per thread, fixed
 * shared-memory trees and fixed xor-butterflies across a warp), so results
 * are bit-identical run to run and across device counts (GEMMs: cuBLAS, same
 * shapes and workspace on the same GPU model). Where the CPU backend
 * (lib/cpu/backend.c) does a separate multiply and add, the kernels use
 * __fmul_rn/__fadd_rn so that nvcc does not contract them into an FMA: the
 * element-wise kernels without transcendental functions (relu, dropout, grad
 * add, zero, the optimizers) then give the CPU's bits; the column sums follow a
 * fixed order of their own (cuda/kernels.cu, k_colsum). */
#ifndef DP_CUDA_KERNELS_CUH
#define DP_CUDA_KERNELS_CUH

#include "check.cuh"

/* The start of every device's WORKSPACE region (DP_CUDA_WS_HEADER_BYTES
 * reserved); the cuBLAS workspace follows. Reset by dp__cuda_step_begin. */
enum {
  DP_CUDA_ST_LOSS = 1u,   /* LOSS_SUM: the loss is NaN or infinite (device 0) */
  DP_CUDA_ST_GRAD = 2u,   /* GRAD_CHECK: a gradient is NaN or infinite */
  DP_CUDA_ST_LABEL = 4u,  /* LOSS: a class label outside 0..classes-1 */
  DP_CUDA_ST_UPDATE = 8u, /* GRAD_CHECK: the update would write a non-finite value */
};
/* This step's scalars, the same on every device: dp__cuda_step_begin (and
 * dp__cuda_graph_launch) compute them on the host as lib/cpu/backend.c does
 * and one host-to-device copy per device puts them here, so that a captured
 * graph, whose kernel arguments are frozen, still sees the step it replays. */
typedef struct {
  uint64_t step;   /* keys dropout: (step << 16) | layer */
  uint32_t first;  /* momentum: 1 at step 0 (the buffer starts as the gradient) */
  float step_size; /* AdamW: (float)(lr / (1 - beta1^(step + 1))), in double */
  float bc2_sqrt;  /* AdamW: (float)sqrt(1 - beta2^(step + 1)), in double */
  float lr;        /* the rate in effect (dp_set_lr): SGD, momentum */
  /* the momentum in effect (dp_set_momentum): SGD's momentum or Adam(W)'s
   * beta1, and 1 - it in float */
  float mu, one_minus_mu;
  float decay;       /* AdamW: 1 - lr * weight_decay, in float */
  uint32_t reserved; /* 0 */
  /* the cross-entropy options' denominator and gradient scale of this step
   * (dp_exec_env.loss_denom, loss_inv; dp__cuda_set_loss_norm) */
  float loss_denom, loss_inv;
} dp_cuda_step_scalars;

typedef struct {
  /* status[d]: device d's own checks (bits above). Before an optimizer op the
   * other devices' own words are copied in, so that every optimizer kernel
   * sees every check (allreduce: all replicas refuse together). */
  uint32_t status[DP_MAX_DEVICES];
  unsigned long long
      bad_grad; /* min over bad gradients of index * 2 + (infinite); ~0 none */
  unsigned long long bad_update; /* smallest parameter index whose update is
                                    not finite; ~0 none */
  unsigned int bad_label_row;    /* smallest global row with a bad label; ~0u none */
  float loss;                    /* LOSS_SUM's result (device 0) */
  float grad_norm;         /* GRAD_CLIP's norm (config.clip_grad_norm); NaN: not reached */
  float clip_coef;         /* GRAD_CLIP: the factor its gradients are scaled by (1: none) */
  dp_cuda_step_scalars sc; /* not touched by the reset: written after it */
} dp_cuda_header;
/* The loss ops' scratch follows the header in the WORKSPACE's first
 * DP_CUDA_WS_HEADER_BYTES: a micro-batch's rows are summed by up to
 * DP_CUDA_LOSS_CHUNKS blocks (cuda/kernels.cu, loss_chunks), their sums kept
 * here until k_loss_chunks adds them. */
#define DP_CUDA_LOSS_CHUNKS 16
#define DP_CUDA_WS_LOSS_OFFSET ((size_t)4096)
#define DP_CUDA_WS_BN_OFFSET ((size_t)8192) /* the batchnorm scratch, below */
static_assert(sizeof(dp_cuda_header) <= DP_CUDA_WS_LOSS_OFFSET, "header too large");
/* The cross-entropy's class weights (dp_ce_opts), or bce_with_logits'
 * pos_weight (one loss per model: the same place), written at init: in the
 * header area, after the header, up to DP_CUDA_CE_WEIGHTS of them. */
#define DP_CUDA_WS_CE_OFFSET ((size_t)1024)
#define DP_CUDA_CE_WEIGHTS ((int)((DP_CUDA_WS_LOSS_OFFSET - DP_CUDA_WS_CE_OFFSET) / 4))
static_assert(sizeof(dp_cuda_header) <= DP_CUDA_WS_CE_OFFSET, "header too large");
static inline float *dp_cuda_ce_weights(dp_cuda_header *hdr) {
  return (float *)((unsigned char *)hdr + DP_CUDA_WS_CE_OFFSET);
}
/* What k_loss_ce needs of the options (on: the model has them; else the
 * plain loss and its bits). keep = 1 - S, per = S / classes, wall = sum_c w_c
 * (classes without weights), w: the weights on the device or NULL. */
typedef struct {
  int on, ignore, ignore_index;
  float smooth, keep, per, wall;
  const float *w;
} dp_cuda_ce;

static inline float *dp_cuda_loss_chunks(dp_cuda_header *hdr) {
  return (float *)((unsigned char *)hdr + DP_CUDA_WS_LOSS_OFFSET);
}

/* Micro-batches of a LOSS op, as rows relative to the op's first row:
 * micro-batch i covers [lo(i), hi(i)). Up to DP_CUDA_MB_LIST listed
 * (bound[0..n]); more must be uniform: [i * m, min((i + 1) * m, end)). */
#define DP_CUDA_MB_LIST 64
typedef struct {
  int n, m, end;
  int bound[DP_CUDA_MB_LIST + 1];
} dp_cuda_mb_span;
static_assert(DP_CUDA_WS_LOSS_OFFSET + DP_CUDA_MB_LIST * DP_CUDA_LOSS_CHUNKS * 4 <=
                  DP_CUDA_WS_BN_OFFSET,
              "the loss scratch must end before the batchnorm scratch");
/* The batchnorm ops' scratch follows: a channel's values summed by K > 1
 * blocks (lib/model/model.h, dp__bn_chunks; cuda/batchnorm.cu) keep their
 * chunk sums here, sum q of chunk c of channel ch at q DP_BN_SLOTS + ch K + c
 * (up to 4 sums; K C <= DP_BN_SLOTS), until k_bn_combine adds them. */
static_assert(DP_CUDA_WS_BN_OFFSET + 4 * DP_BN_SLOTS * 4 <= DP_CUDA_WS_HEADER_BYTES,
              "the batchnorm scratch must fit the workspace's header area");
static inline float *dp_cuda_bn_scratch(dp_cuda_header *hdr) {
  return (float *)((unsigned char *)hdr + DP_CUDA_WS_BN_OFFSET);
}

/* The optimizer's constants (per plan; the per-step scalars are in the
 * header's sc): computed on the host exactly as lib/cpu/backend.c does. */
typedef struct {
  int kind; /* dp_optimizer */
  int nesterov;
  float wd, keep; /* keep = 1 - dampening; lr, decay, momentum: per-step scalars */
  float b2, one_minus_b2, eps;
  int amsgrad; /* config.amsgrad: v_hat = max(v_hat, v) is the denominator's */
} dp_cuda_opt;

/* ---- kernels.cu ---- */
/* relu, gelu (tanh form), gelu_erf (exact), tanh, sigmoid, silu, leaky_relu
 * (its negative slope: slope; 0 for the others) on n elements. */
cudaError_t dp_k_act_forward(cudaStream_t st, dp_layer_kind kind, const float *x, float *y,
                             size_t n, float slope);
/* dx from dy and the saved tensor: the output y for relu, tanh, sigmoid,
 * leaky_relu; the input x for gelu, gelu_erf and silu. */
cudaError_t dp_k_act_backward(cudaStream_t st, dp_layer_kind kind, const float *xy,
                              const float *dy, float *dx, size_t n, float slope);
/* y[r][j] = x[r][j] * (u >= p ? scale : 0), u = dp__rng_uniform(seed,
 * DP_RNG_DROPOUT, (hdr->sc.step << 16) | layer, row0 + r, j): forward (x, y)
 * and backward (dy, dx). The step is read on the device. */
cudaError_t dp_k_dropout(cudaStream_t st, const float *x, float *y, int rows, int cols,
                         uint64_t seed, const dp_cuda_header *hdr, uint64_t layer,
                         uint64_t row0, float p, float scale);
/* y += b per row, then relu if asked (b NULL: only the relu) */
cudaError_t dp_k_bias_add(cudaStream_t st, float *y, const float *b, int rows, int cols,
                          bool relu);
/* out[j] = sum over rows of a[r][j] (bias gradients), in k_colsum's fixed order
 * (row lanes, then a tree; a function of rows and cols only). */
cudaError_t dp_k_colsum(cudaStream_t st, const float *a, int rows, int cols, float *out);
/* stats: (rows, 2) mean, rstd = 1 / sqrt(var + eps). */
cudaError_t dp_k_layernorm_forward(cudaStream_t st, const float *x, const float *g,
                                   const float *b, float *y, float *stats, int rows,
                                   int cols, float eps);
/* dg, db written (not accumulated); dx may be NULL (first layer). */
cudaError_t dp_k_layernorm_backward(cudaStream_t st, const float *x, const float *stats,
                                    const float *g, const float *dy, float *dx, float *dg,
                                    float *db, int rows, int cols);
cudaError_t dp_k_add(cudaStream_t st, float *dst, const float *src, size_t n);
/* bf16 (util/bf16.h's rounding, the cpu backend's bits), for precision bf16
 * (cuda/mixed.cu) and reduce_precision bf16: dst = bf16(dst + src), src fp32
 * (src16 NULL) or bf16 (src NULL); y = x rounded to bf16 (y may be x); fp32
 * <-> bf16. */
cudaError_t dp_k_add_bf16(cudaStream_t st, float *dst, const float *src,
                          const uint16_t *src16, size_t n);
cudaError_t dp_k_round_bf16(cudaStream_t st, const float *x, float *y, size_t n);
cudaError_t dp_k_pack_bf16(cudaStream_t st, const float *x, uint16_t *y, size_t n);
cudaError_t dp_k_unpack_bf16(cudaStream_t st, const uint16_t *x, float *y, size_t n);
cudaError_t dp_k_fill(cudaStream_t st, uint32_t *dst, uint32_t value, size_t n);
/* One block per micro-batch: part[i] = its loss sum, g = d(mean loss)/d(o). */
/* chunks: the loss scratch (dp_cuda_loss_chunks), DP_CUDA_LOSS_CHUNKS floats per
 * micro-batch of the span (at most DP_CUDA_MB_LIST of them per launch). The
 * element-wise losses: mse (g = scale d), l1, smooth_l1, huber (param: beta,
 * delta) and bce_with_logits (g = the term's derivative times scale, 1 / the
 * mean's count; pw: its pos_weight per column on the device, or NULL). */
cudaError_t dp_k_loss_mse(cudaStream_t st, const float *o, const float *t, float *g,
                          float *part, float *chunks, const dp_cuda_mb_span *span, int cols,
                          float scale, dp_loss_kind kind, float param, const float *pw);
cudaError_t dp_k_loss_ce(cudaStream_t st, const float *z, const int32_t *labels, float *g,
                         float *part, float *chunks, const dp_cuda_mb_span *span, int cols,
                         float inv_rows, int row0, dp_cuda_header *hdr, int dev,
                         const dp_cuda_ce *ce);
/* hdr->loss = canonical tree over part[0..n_mb) (micro-batches >= n_ne are
 * empty and left out) / denom (step_denom: hdr->sc.loss_denom instead); sets
 * DP_CUDA_ST_LOSS when not finite. */
cudaError_t dp_k_loss_sum(cudaStream_t st, const float *part, int n_mb, int n_ne,
                          float denom, bool step_denom, dp_cuda_header *hdr, int dev);
/* Flags non-finite g[0..n) (parameter index base + i). */
cudaError_t dp_k_grad_check(cudaStream_t st, const float *g, size_t n, size_t base,
                            dp_cuda_header *hdr, int dev);
/* In one pass: flags non-finite g[0..n) as dp_k_grad_check, and (DP_CUDA_ST_UPDATE,
 * bad_update) an update of w[0..n) (parameter index base + i) that would write a
 * non-finite parameter or state word. m[0..n) and
 * v[0..n) are the same elements' optimizer state (momentum's buffer, AdamW's two
 * moments; unused where the optimizer has none), vh[0..n) amsgrad's v_hat
 * (NULL without it): the caller resolves them from the device's state layout
 * (dp_plan.opt_off/opt_len), as lib/cpu/backend.c. */
cudaError_t dp_k_step_check(cudaStream_t st, const dp_cuda_opt *o, const float *w,
                            const float *g, const float *m, const float *v, const float *vh,
                            size_t n, size_t base, dp_cuda_header *hdr, int dev);
/* Updates w[0..n) unless one of hdr->status[0..n_check) is set; the per-step
 * scalars (momentum's first flag, AdamW's step_size and bc2_sqrt) come from
 * hdr->sc. */
cudaError_t dp_k_optimizer(cudaStream_t st, const dp_cuda_opt *o, float *w, const float *g,
                           float *m, float *v, float *vh, size_t n,
                           const dp_cuda_header *hdr, int n_check);
/* config.clip_grad_norm (lib/cpu/backend.c's grad_norm_op and grad_clip_op, the
 * same bytes and bits). bins (256, 2): the exact sum of squares of g[0..n), a
 * 128-bit integer (lo, hi) per biased exponent, inf and NaN counted in bin 255;
 * one block over chunks of at most DP_K_NORM_CHUNK elements, whose squares
 * (< 2^48 each) an integer atomicAdd sums in shared memory without overflow,
 * then folded into bins in a fixed order. */
cudaError_t dp_k_grad_norm(cudaStream_t st, const float *g, size_t n,
                           unsigned long long *bins);
/* From n_slots such bins: hdr->grad_norm, and hdr->clip_coef = clip / (norm +
 * 1e-6) (1 when the norm is not finite). */
cudaError_t dp_k_clip_coef(cudaStream_t st, const unsigned long long *slots, int n_slots,
                           float clip, dp_cuda_header *hdr);
/* g[0..n) *= hdr->clip_coef when it is below 1. */
cudaError_t dp_k_clip_scale(cudaStream_t st, float *g, size_t n, const dp_cuda_header *hdr);
/* config.clip_grad_value: g[0..n) clamped to [-clip, clip], as
 * lib/cpu/backend.c's grad_clamp_op (a NaN stays NaN). */
cudaError_t dp_k_clip_value(cudaStream_t st, float *g, size_t n, float clip);
/* dst[0..n) = src[0..n) unless one of hdr->status[0..n_check) is set
 * (config.accumulate's GRAD_STASH: a refused call keeps nothing). */
cudaError_t dp_k_checked_copy(cudaStream_t st, float *dst, const float *src, size_t n,
                              const dp_cuda_header *hdr, int n_check);
cudaError_t dp_k_reset_header(cudaStream_t st, dp_cuda_header *hdr);
/* Debug hooks (cuda_ctx.debug_*): a spin of `us` microseconds; a write to an
 * unmapped address (an asynchronous illegal-address fault). */
cudaError_t dp_k_debug_spin(cudaStream_t st, unsigned us);
cudaError_t dp_k_debug_fault(cudaStream_t st);
/* Loads every kernel on the current device now (see kernels.cu). */
cudaError_t dp_k_preload(void);
/* cudaFuncGetAttributes on each of n kernels: loads them now (not lazily). */
cudaError_t dp_k_load(const void *const *kernels, size_t n);
cudaError_t dp_k_rng_table(cudaStream_t st, uint64_t seed, uint64_t stream,
                           const uint64_t *abc, int n, uint64_t *u64, float *uniform);

/* ---- gemm.cu: row-major linear layers through column-major cuBLAS ---- */
/* A handle for one logical device: bound to st, workspace ws (ws_bytes, from
 * the arena; NULL/0 leaves cuBLAS's own pool, for self-tests only), math mode
 * pinned (FP32, no reduced-precision reductions; TF32 tensor ops if tf32), no
 * atomics, host pointer mode. */
dp_status dp__cuda_blas_create(cudaStream_t st, void *ws, size_t ws_bytes, bool tf32,
                               cublasHandle_t *out);
/* y (rows, out) = x (rows, in) . w^T (w: (out, in)) [+ b (out)], then, if relu,
 * relu (a relu layer fused into the linear: dp__relu_fused). */
dp_status dp__cuda_linear_forward(cublasHandle_t h, cudaStream_t st, int rows, int in,
                                  int out, const float *x, const float *w, const float *b,
                                  bool relu, float *y);
/* dw (out, in) = dy^T . x; db (out) = column sums of dy (NULL: no bias); dx
 * (rows, in) = dy . w (NULL: not needed), then 0 where relu_out (rows, in;
 * NULL: none) <= 0 (the backward of a relu before the linear:
 * dp__relu_bwd_fused). */
dp_status dp__cuda_linear_backward(cublasHandle_t h, cudaStream_t st, int rows, int in,
                                   int out, const float *x, const float *w, const float *dy,
                                   float *dw, float *db, const float *relu_out, float *dx);

#endif
