/* bf16 mixed precision on the cuda backend (config.precision DP_PRECISION_BF16,
 * docs/PRECISION.md), as lib/cpu/mixed.c on the cpu backend: the activations
 * between layers and their gradients are bf16 (dp_span.esz 2); parameters,
 * gradients, statistics, the model's inputs and outputs stay fp32.
 *
 * A linear layer multiplies bf16 operands with cublasGemmEx (CUDA_R_16BF
 * operands, fp32 output and compute): its weights rounded from the fp32 masters
 * into the shadow area, its input rounded when fp32 (the model's input); the
 * bias (rounded) and the relu in a kernel that rounds the output to bf16; the
 * weight and bias gradients rounded to bf16 in place. Every other layer runs
 * its fp32 op (cuda/backend.cu) on fp32 copies of its bf16 operands in the
 * shadow area and rounds its outputs back; conv2d reads rounded weights and
 * rounds its weight gradients; batchnorm keeps its weight gradients fp32 (as
 * autocast's batch_norm with fp32 weights), and its sync statistics ops read
 * fp32 copies too (dp__cuda_mixed_bn_operands).
 *
 * The shadow area follows conv2d's and attention's tail in WORKSPACE
 * (dp__cuda_mixed_at, sized by dp__cuda_mixed_workspace_bytes). cuBLAS sums in
 * an order of its own: the bits match the cpu backend's only where the
 * operations are elementwise; across device counts and modes they are the same
 * (the same shapes on the same GPU model), as in fp32. */
#include "layer.cuh"
#include "grid.cuh"
#include "util/bf16.h"

/* ---- kernels ---------------------------------------------------------------------- */

/* y = bf16(acc + bf16(b)) (then relu), stored as bf16 or as an fp32 value */
static __global__ void k_epilogue(const float *acc, const float *b, int cols, int relu,
                                  void *y, int y_bf16, size_t n) {
  GRID_STRIDE(i, n) {
    float v = b ? fa(acc[i], dp__bf16_roundf(b[i % (size_t)cols])) : acc[i];
    if (relu) v = v <= 0.0f ? 0.0f : v;
    if (y_bf16)
      ((uint16_t *)y)[i] = dp__bf16_rne(v);
    else
      ((float *)y)[i] = dp__bf16_roundf(v);
  }
}
/* a relu's backward in place on a bf16 gradient: its output y <= 0 gives 0 */
static __global__ void k_relu_mask(const uint16_t *y, uint16_t *dx, size_t n) {
  GRID_STRIDE(i, n) if (dp__bf16_widen(y[i]) <= 0.0f) dx[i] = 0;
}

/* cuda/kernels.cu's conversions, on the operand pointers this file holds */
static cudaError_t widen(cudaStream_t st, const void *x, float *y, size_t n) {
  return dp_k_unpack_bf16(st, (const uint16_t *)x, y, n);
}
static cudaError_t narrow(cudaStream_t st, const float *x, void *y, size_t n) {
  return dp_k_pack_bf16(st, x, (uint16_t *)y, n);
}
static cudaError_t round_to(cudaStream_t st, const float *x, float *y, size_t n) {
  return dp_k_round_bf16(st, x, y, n);
}

/* ---- the shadow area ---------------------------------------------------------------- */

namespace {
struct shadow {
  unsigned char *base; /* the WORKSPACE region */
  size_t at, end;
  dp_span from[8], to[8];
  int n;
};
} // namespace

static dp_status shadow_of(const lay &c, shadow *sh) {
  const dp_plan *p = c.p;
  bool training = !p->cfg.inference;
  int rows = p->act[c.d].mb_rows;
  size_t need = dp__cuda_mixed_workspace_bytes(&p->model, rows, training);
  if (p->regions[c.d][DP_REGION_WORKSPACE].size < need)
    return DP_FAIL(DP_ERR_BACKEND,
                   "layer %d: the plan's workspace (%zu bytes) is too small for bf16 (%zu)",
                   c.i, p->regions[c.d][DP_REGION_WORKSPACE].size, need);
  *sh = shadow{};
  sh->base = (unsigned char *)dp__region_ptr(c.e, c.d, DP_REGION_WORKSPACE);
  sh->at = dp__cuda_mixed_at(&p->model, rows, training);
  sh->end = need;
  return DP_OK;
}

/* bytes of the shadow area (256-aligned); NULL when it has no room. */
static void *take(shadow *sh, size_t bytes) {
  size_t b = dp__cuda_up256(bytes);
  if (b > sh->end - sh->at) return NULL;
  void *p = sh->base + sh->at;
  sh->at += b;
  return p;
}

static dp_status no_room(const lay &c) {
  return DP_FAIL(DP_ERR_BACKEND, "layer %d: the bf16 shadow area is too small", c.i);
}

/* ---- linear: cublasGemmEx on bf16 operands -------------------------------------- */

/* C (m, n) column-major = op(A) op(B), A and B bf16, C fp32 (cuda/gemm.cu's
 * row-major reading of each product). */
static dp_status gemm_bf16(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                           int m, int n, int k, const void *a, int lda, const void *b,
                           int ldb, float *c, int ldc) {
  const float one = 1.0f, zero = 0.0f;
  DP_CUBLAS_CHECK(cublasGemmEx(h, ta, tb, m, n, k, &one, a, CUDA_R_16BF, lda, b,
                               CUDA_R_16BF, ldb, &zero, c, CUDA_R_32F, ldc,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return DP_OK;
}

/* An operand as bf16: itself (bf16 activations) or rounded into the shadow area
 * (the model's fp32 input). NULL: no room. */
static const void *as_bf16(dev_ctx *x, const lay &c, shadow *sh, dp_span s, size_t n) {
  if (s.esz == 2) return ptr(c, s);
  void *b = take(sh, n * 2);
  if (b && narrow(x->stream, ptr(c, s), b, n) != cudaSuccess) return NULL;
  return b;
}

static dp_status linear_forward(dev_ctx *x, const lay &c) {
  const dp_layer *l = c.l;
  int rows = c.rows * dp__positions(l), pin = dp__pos_in(l), pout = dp__pos_out(l);
  shadow sh;
  dp_status s = shadow_of(c, &sh);
  if (s || rows <= 0) return s;
  const float *w = layer_params(c);
  const void *xb = as_bf16(x, c, &sh, c.o.in, (size_t)rows * pin);
  void *wb = take(&sh, (size_t)pin * pout * 2);
  float *acc = (float *)take(&sh, (size_t)rows * (pin > pout ? pin : pout) * 4);
  if (!xb || !wb || !acc) return no_room(c);
  DP_CUDA_CHECK(narrow(x->stream, w, wb, (size_t)pin * pout));
  /* Y^T (out, rows) = W^T' X^T' */
  s = gemm_bf16(x->blas, CUBLAS_OP_T, CUBLAS_OP_N, pout, rows, pin, wb, pin, xb, pin, acc,
                pout);
  if (s) return s;
  bool relu = dp__relu_fused(c.p, c.i + 1);
  dp_span ys = relu ? at_layer(c, c.i + 1).o.out : c.o.out;
  size_t n = (size_t)rows * pout;
  DP_LAUNCH(k_epilogue, blocks_for(n), THREADS, 0, x->stream)
  (acc, l->bias ? w + (size_t)pout * pin : NULL, pout, relu ? 1 : 0, ptr(c, ys),
   ys.esz == 2 ? 1 : 0, n);
  DP_CUDA_CHECK(cudaGetLastError());
  return DP_OK;
}

static dp_status linear_backward(dev_ctx *x, const lay &c, float *grads) {
  const dp_layer *l = c.l;
  int rows = c.rows * dp__positions(l), pin = dp__pos_in(l), pout = dp__pos_out(l);
  shadow sh;
  dp_status s = shadow_of(c, &sh);
  if (s || rows <= 0) return s;
  const float *w = layer_params(c);
  size_t ny = (size_t)rows * pout;
  /* the loss's fp32 output gradient is rounded to bf16 on its way in */
  const void *xb = as_bf16(x, c, &sh, c.o.in, (size_t)rows * pin);
  void *wb = take(&sh, (size_t)pin * pout * 2);
  float *acc = (float *)take(&sh, (size_t)rows * (pin > pout ? pin : pout) * 4);
  const void *dyb = as_bf16(x, c, &sh, c.o.dout, ny);
  float *dyf = (float *)take(&sh, ny * 4);
  if (!xb || !wb || !acc || !dyb || !dyf) return no_room(c);
  float *dw = grads + l->param_off, *db = l->bias ? dw + (size_t)pout * pin : NULL;
  /* dW^T (in, out) = X^T' dY', rounded in place */
  s = gemm_bf16(x->blas, CUBLAS_OP_N, CUBLAS_OP_T, pin, pout, rows, xb, pin, dyb, pout, dw,
                pin);
  if (s) return s;
  DP_CUDA_CHECK(round_to(x->stream, dw, dw, (size_t)pin * pout));
  if (db) { /* the column sums of the bf16 dy, rounded */
    DP_CUDA_CHECK(widen(x->stream, dyb, dyf, ny));
    DP_CUDA_CHECK(dp_k_colsum(x->stream, dyf, rows, pout, db));
    DP_CUDA_CHECK(round_to(x->stream, db, db, (size_t)pout));
  }
  bool masked = c.i > 0 && dp__relu_bwd_fused(c.p, c.i - 1);
  dp_span dxs = masked ? at_layer(c, c.i - 1).o.din : c.o.din;
  if (dxs.region < 0) return DP_OK;
  DP_CUDA_CHECK(narrow(x->stream, w, wb, (size_t)pin * pout));
  /* dX^T (in, rows) = W^T' dY^T' */
  s = gemm_bf16(x->blas, CUBLAS_OP_N, CUBLAS_OP_N, pin, rows, pout, wb, pin, dyb, pout, acc,
                pin);
  if (s) return s;
  size_t nx = (size_t)rows * pin;
  DP_CUDA_CHECK(narrow(x->stream, acc, ptr(c, dxs), nx));
  if (masked) {
    if (c.o.in.esz != 2 || dxs.esz != 2)
      return DP_FAIL(DP_ERR_BACKEND, "layer %d: a fused relu's tensors are not bf16", c.i);
    DP_LAUNCH(k_relu_mask, blocks_for(nx), THREADS, 0, x->stream)
    ((const uint16_t *)ptr(c, c.o.in), (uint16_t *)ptr(c, dxs), nx);
    DP_CUDA_CHECK(cudaGetLastError());
  }
  return DP_OK;
}

/* ---- every other layer: its fp32 op on fp32 copies ------------------------------ */

static bool same_span(dp_span a, dp_span b) {
  return a.region == b.region && a.off == b.off && a.bytes == b.bytes;
}

/* The fp32 copy of s in the shadow area (none for none); fill: with its values.
 * A buffer the op names twice maps to one copy. false: no room. */
static bool widen_span(dev_ctx *x, const lay &c, shadow *sh, dp_span s, bool fill,
                       bool round, dp_span *out) {
  *out = s;
  if (s.region < 0) return true;
  for (int k = 0; k < sh->n; k++)
    if (same_span(sh->from[k], s)) {
      *out = sh->to[k];
      return true;
    }
  size_t n = s.bytes / (size_t)s.esz;
  size_t at = sh->at;
  if (!take(sh, n * 4) || sh->n == 8) return false;
  dp_span w = {DP_REGION_WORKSPACE, at, n * 4, 4};
  if (fill && s.esz == 2 && widen(x->stream, ptr(c, s), ptr(c, w), n) != cudaSuccess)
    return false;
  if (fill && s.esz == 4 &&
      (round ? round_to(x->stream, ptr(c, s), ptr(c, w), n)
             : cudaMemcpyAsync(ptr(c, w), ptr(c, s), n * 4, cudaMemcpyDeviceToDevice,
                               x->stream)) != cudaSuccess)
    return false;
  sh->from[sh->n] = s;
  sh->to[sh->n++] = w;
  *out = w;
  return true;
}

/* What the op wrote to w goes back to s rounded to bf16 (an fp32 tensor, the
 * model's output, holds the bf16 values). */
static cudaError_t narrow_span(dev_ctx *x, const lay &c, dp_span w, dp_span s) {
  if (s.region < 0) return cudaSuccess;
  size_t n = s.bytes / (size_t)s.esz;
  return s.esz == 2 ? narrow(x->stream, ptr(c, w), ptr(c, s), n)
                    : round_to(x->stream, ptr(c, w), ptr(c, s), n);
}

static dp_status shadow_run(dev_ctx *x, const lay &c, float *grads, int global_row0) {
  shadow sh;
  dp_status s = shadow_of(c, &sh);
  if (s) return s;
  lay k = c;
  bool bwd = grads != NULL, ok = true, conv = c.l->kind == DP_LAYER_CONV2D;
  /* conv2d rounds the model's fp32 input; the loss's fp32 gradient arrives
   * rounded, at a block's begin too (lib/cpu/mixed.c) */
  ok &= widen_span(x, c, &sh, c.o.in, true, conv, &k.o.in);
  ok &= widen_span(x, c, &sh, c.o.skip, true, bwd, &k.o.skip);
  k.o.dskip = dp_span{-1, 0, 0, 4}; /* a block end's: copied from din after */
  ok &= widen_span(x, c, &sh, c.o.out, bwd, false, &k.o.out);
  if (bwd) { /* a residual block's begin adds to its input's gradient in place */
    ok &= widen_span(x, c, &sh, c.o.din, c.l->kind == DP_LAYER_RESIDUAL, false, &k.o.din);
    ok &= widen_span(x, c, &sh, c.o.dout, true, true, &k.o.dout);
  }
  if (ok && conv) { /* autocast's bf16 convolution: the weights rounded */
    size_t at = sh.at, n = c.o.params.bytes / 4;
    ok = take(&sh, n * 4) != NULL;
    k.o.params = dp_span{DP_REGION_WORKSPACE, at, n * 4, 4};
    if (ok) DP_CUDA_CHECK(round_to(x->stream, ptr(c, c.o.params), ptr(c, k.o.params), n));
  }
  if (!ok) return no_room(c);
  /* conv2d's and attention's tail ends where the shadow area starts */
  k.o.workspace.bytes =
      dp__cuda_mixed_at(&c.p->model, c.p->act[c.d].mb_rows, !c.p->cfg.inference);
  s = bwd ? dp__cuda_backward(x, k, grads, global_row0)
          : dp__cuda_forward(x, k, global_row0);
  if (s) return s;
  if (!bwd) {
    DP_CUDA_CHECK(narrow_span(x, c, k.o.out, c.o.out));
    return DP_OK;
  }
  DP_CUDA_CHECK(narrow_span(x, c, k.o.din, c.o.din));
  if (conv)
    DP_CUDA_CHECK(
        round_to(x->stream, grads + c.l->param_off, grads + c.l->param_off, c.l->n_params));
  return DP_OK;
}

/* ---- sync batchnorm's sums -------------------------------------------------------- */

/* DP_OP_BN_STATS and DP_OP_BN_BWD_STATS read the micro-batch's input (and, with
 * dout, its output gradient) as the batchnorm's forward and backward do: c's
 * spans become fp32 copies in the shadow area (the loss's fp32 gradient
 * rounded), which cuda/backend.cu's bn_op then reads; what it writes is fp32. */
dp_status dp__cuda_mixed_bn_operands(dev_ctx *x, lay *c, bool dout) {
  shadow sh;
  dp_status s = shadow_of(*c, &sh);
  if (s) return s;
  lay k = *c;
  bool ok = widen_span(x, *c, &sh, c->o.in, true, false, &k.o.in);
  if (dout) ok &= widen_span(x, *c, &sh, c->o.dout, true, true, &k.o.dout);
  if (!ok) return no_room(*c);
  *c = k;
  return DP_OK;
}

/* ---- the layer ops ---------------------------------------------------------------- */

dp_status dp__cuda_mixed_forward(dev_ctx *x, const lay &c, int global_row0) {
  dp_layer_kind k = c.l->kind;
  if (dp__layer_is_view(&c.p->model, c.i) || k == DP_LAYER_INPUT) return DP_OK;
  if (k == DP_LAYER_LINEAR) return linear_forward(x, c);
  if (k == DP_LAYER_RELU && dp__relu_fused(c.p, c.i)) return DP_OK; /* the linear did */
  return shadow_run(x, c, NULL, global_row0);
}

dp_status dp__cuda_mixed_backward(dev_ctx *x, const lay &c, float *grads, int global_row0) {
  dp_layer_kind k = c.l->kind;
  if (k == DP_LAYER_RESIDUAL) return shadow_run(x, c, grads, global_row0);
  if (k == DP_LAYER_RESIDUAL_END && c.o.dskip.region >= 0) {
    /* with a shortcut: f's output gradient is g's, the bf16 bits din gets */
    dp_status s = shadow_run(x, c, grads, global_row0);
    if (!s && c.o.din.region >= 0)
      DP_CUDA_CHECK(cudaMemcpyAsync(ptr(c, c.o.dskip), ptr(c, c.o.din), c.o.din.bytes,
                                    cudaMemcpyDeviceToDevice, x->stream));
    return s;
  }
  if (dp__layer_is_view(&c.p->model, c.i) || k == DP_LAYER_INPUT) return DP_OK;
  if (dp__relu_bwd_fused(c.p, c.i)) return DP_OK; /* the linear after it does it */
  if (k == DP_LAYER_LINEAR) return linear_backward(x, c, grads);
  return shadow_run(x, c, grads, global_row0);
}
