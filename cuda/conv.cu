/* The image layers on the GPU, NCHW as lib/cpu/conv.c (a row of a micro-batch is
 * one image, C x H x W floats); the math and the orders are lib/cpu/conv.c's.
 *
 * conv2d over the micro-batch's n images, P = OH * OW output positions,
 * CKK = C * K * K taps, the buffers after the cuBLAS workspace (dp_cuda.h,
 * DP_CUDA_CONV_WS_OFFSET):
 *   COL (n P, CKK)   k_im2col: row (image, position), column (channel, ky, kx);
 *                    0 where a tap is padding
 *   T   (n P, OUT)   = COL . W^T (+ bias)   dp__cuda_linear_forward (cuBLAS, the
 *                    linear layer's call and math mode; bias by k_bias_add)
 *   y   (n, OUT, P)  k_rows_to_planes(T)
 * backward:
 *   T   (n P, OUT)   = dY^T, k_planes_to_rows(dy)
 *   COL              k_im2col(x) again
 *   dW  (OUT, CKK)   = dY^T' . COL;  db = column sums of T (k_colsum);
 *   dCOL (n P, CKK)  = T . W into COL's place: dp__cuda_linear_backward, whose
 *                    dW GEMM reads COL before its dX GEMM overwrites it (one
 *                    stream: in order)
 *   dx  (n, C, H, W) k_col2im(dCOL), a gather.
 *
 * Fixed orders (no atomics; one thread per output element):
 *   - col2im: dx[s][c][iy][ix] = +0 + the dCOL taps that read it, windows in
 *     ascending (oy, ox) order (each window reads an element through at most
 *     one tap). lib/cpu/conv.c scatters in (image, oy, ox, c, ky, kx) order into a
 *     zeroed dx, which adds each element's taps in that same (oy, ox) order:
 *     the same bits from the same dCOL.
 *   - avgpool forward: +0 + the window's real cells (padding clipped off) in
 *     (ky, kx) order, then / (K K), or / the real cells with exclude_pad;
 *     backward: each element gathers dy / that divisor over the windows that
 *     hold it, (oy, ox) ascending, from +0: lib/cpu/conv.c's scatter order again.
 *   - maxpool: the window's argmax is the first largest real cell in (ky, kx)
 *     order (the -inf padding never wins), a NaN taken at once (lib/cpu/conv.c's argmax,
 * recomputed in backward); an element gathers dy of every window whose argmax it is, (oy,
 * ox) ascending, from +0: overlapping windows sum as on the CPU. Adds are __fadd_rn and
 * divisions __fdiv_rn (no contraction), so the pools and the transposes/col2im give the
 * CPU's bits; the GEMMs and the bias gradient are cuBLAS's and k_colsum's
 * (cuda/kernels.cu), close but not the CPU's bits, and the same bits run to run and across
 * device counts (their shapes are the micro-batch's). */
#include "conv.cuh"
#include "grid.cuh"

#include <limits.h>
#include <math.h>

namespace {
/* A layer's image shapes: input C x H x W, kernel K, stride S, padding Pd,
 * output OH x OW (OUT channels for conv2d, C for the pools). */
struct cshape {
  int C, H, W, K, S, Pd, OH, OW;
};
} // namespace

static cshape shape_of(const dp_layer *l) {
  cshape s;
  s.C = l->ic;
  s.H = l->ih;
  s.W = l->iw;
  s.K = l->k;
  s.S = l->stride;
  s.Pd = l->pad; /* conv2d's zeros, maxpool's -inf, avgpool's zeros */
  s.OH = l->h;
  s.OW = l->w;
  return s;
}

/* The outputs o in [*lo, *hi] whose window [o S - pad, o S - pad + K) holds
 * input coordinate i (empty when *lo > *hi). */
static __device__ __forceinline__ void windows_of(int i, int pad, int K, int S, int O,
                                                  int *lo, int *hi) {
  int a = i + pad - K + 1, b = i + pad; /* o S in [a, b] */
  *lo = a <= 0 ? 0 : (a + S - 1) / S;
  *hi = b / S < O - 1 ? b / S : O - 1;
}

/* ---- im2col, col2im, transposes ---------------------------------------------------- */

static __global__ void k_im2col(cshape s, const float *x, float *col, size_t total) {
  const int KK = s.K * s.K;
  const size_t ckk = (size_t)s.C * KK, P = (size_t)s.OH * s.OW;
  GRID_STRIDE(i, total) {
    size_t row = i / ckk, img = row / P;
    int tap = (int)(i % ckk), p = (int)(row % P);
    int oy = p / s.OW, ox = p % s.OW;
    int c = tap / KK, r = tap % KK, ky = r / s.K, kx = r % s.K;
    int iy = oy * s.S - s.Pd + ky, ix = ox * s.S - s.Pd + kx;
    col[i] = iy >= 0 && iy < s.H && ix >= 0 && ix < s.W
                 ? x[((img * s.C + c) * s.H + iy) * s.W + ix]
                 : 0.0f;
  }
}

static __global__ void k_col2im(cshape s, const float *dcol, float *dx, size_t total) {
  const int KK = s.K * s.K;
  const size_t ckk = (size_t)s.C * KK, P = (size_t)s.OH * s.OW;
  GRID_STRIDE(i, total) {
    int ix = (int)(i % s.W);
    size_t t = i / s.W;
    int iy = (int)(t % s.H);
    t /= s.H;
    int c = (int)(t % s.C);
    size_t img = t / s.C;
    int oy0, oy1, ox0, ox1;
    windows_of(iy, s.Pd, s.K, s.S, s.OH, &oy0, &oy1);
    windows_of(ix, s.Pd, s.K, s.S, s.OW, &ox0, &ox1);
    const float *base = dcol + img * P * ckk + (size_t)c * KK;
    float acc = 0.0f;
    for (int oy = oy0; oy <= oy1; oy++) {
      int ky = iy + s.Pd - oy * s.S;
      for (int ox = ox0; ox <= ox1; ox++) {
        int kx = ix + s.Pd - ox * s.S;
        acc = fa(acc, base[((size_t)oy * s.OW + ox) * ckk + (size_t)(ky * s.K + kx)]);
      }
    }
    dx[i] = acc;
  }
}

/* y (n, out, P)[i][o][p] = t (n P, out)[i P + p][o]; a thread per y element. */
static __global__ void k_rows_to_planes(size_t P, size_t out, const float *t, float *y,
                                        size_t total) {
  GRID_STRIDE(j, total) {
    size_t p = j % P, r = j / P, o = r % out, img = r / out;
    y[j] = t[(img * P + p) * out + o];
  }
}

/* t (n P, out)[i P + p][o] = dy (n, out, P)[i][o][p]; a thread per t element. */
static __global__ void k_planes_to_rows(size_t P, size_t out, const float *dy, float *t,
                                        size_t total) {
  GRID_STRIDE(j, total) {
    size_t o = j % out, r = j / out, p = r % P, img = r / P;
    t[j] = dy[(img * out + o) * P + p];
  }
}

/* ---- pools ------------------------------------------------------------------------- */

/* A window's real cells: rows [*y0, *y1), columns [*x0, *x1) (lib/cpu/conv.c's
 * window_cells; never empty, as padding <= K / 2). */
static __device__ __forceinline__ void window_cells(const cshape &s, int oy, int ox,
                                                    int *y0, int *y1, int *x0, int *x1) {
  int a = oy * s.S - s.Pd, b = ox * s.S - s.Pd;
  *y0 = a < 0 ? 0 : a;
  *x0 = b < 0 ? 0 : b;
  *y1 = a + s.K < s.H ? a + s.K : s.H;
  *x1 = b + s.K < s.W ? b + s.K : s.W;
}

/* lib/cpu/conv.c's argmax: the first largest real cell in (ky, kx) order, a NaN
 * taken at once (the -inf padding never wins); the index within the plane. */
static __device__ __forceinline__ size_t window_argmax(const cshape &s, const float *xc,
                                                       int oy, int ox) {
  int y0, y1, x0, x1;
  window_cells(s, oy, ox, &y0, &y1, &x0, &x1);
  size_t best = (size_t)y0 * s.W + x0;
  float m = -INFINITY;
  for (int iy = y0; iy < y1; iy++)
    for (int ix = x0; ix < x1; ix++) {
      size_t at = (size_t)iy * s.W + (size_t)ix;
      float v = xc[at];
      if (v > m || isnan(v)) {
        m = v;
        best = at;
        if (isnan(v)) return best;
      }
    }
  return best;
}

/* avgpool's divisor: K K, or with exclude_pad the window's real cells */
static __device__ __forceinline__ float avg_divisor(const cshape &s, int excl, int oy,
                                                    int ox) {
  if (!excl) return (float)(s.K * s.K);
  int y0, y1, x0, x1;
  window_cells(s, oy, ox, &y0, &y1, &x0, &x1);
  return (float)((y1 - y0) * (x1 - x0));
}

/* mx: maxpool; else avgpool, excl its exclude_pad */
static __global__ void k_pool_forward(cshape s, int mx, int excl, const float *x, float *y,
                                      size_t total) {
  const size_t plane = (size_t)s.H * s.W, oplane = (size_t)s.OH * s.OW;
  GRID_STRIDE(i, total) {
    size_t sc = i / oplane;
    int p = (int)(i % oplane), oy = p / s.OW, ox = p % s.OW;
    const float *xc = x + sc * plane;
    if (mx) {
      y[i] = xc[window_argmax(s, xc, oy, ox)];
      continue;
    }
    int y0, y1, x0, x1;
    window_cells(s, oy, ox, &y0, &y1, &x0, &x1);
    float sum = 0.0f;
    for (int iy = y0; iy < y1; iy++)
      for (int ix = x0; ix < x1; ix++) sum = fa(sum, xc[(size_t)iy * s.W + (size_t)ix]);
    y[i] = fd(sum, avg_divisor(s, excl, oy, ox));
  }
}

static __global__ void k_pool_backward(cshape s, int mx, int excl, const float *x,
                                       const float *dy, float *dx, size_t total) {
  const size_t plane = (size_t)s.H * s.W, oplane = (size_t)s.OH * s.OW;
  GRID_STRIDE(i, total) {
    size_t sc = i / plane;
    int q = (int)(i % plane), iy = q / s.W, ix = q % s.W;
    const float *xc = mx ? x + sc * plane : NULL;
    const float *dyc = dy + sc * oplane;
    int oy0, oy1, ox0, ox1;
    windows_of(iy, s.Pd, s.K, s.S, s.OH, &oy0, &oy1);
    windows_of(ix, s.Pd, s.K, s.S, s.OW, &ox0, &ox1);
    float acc = 0.0f;
    for (int oy = oy0; oy <= oy1; oy++)
      for (int ox = ox0; ox <= ox1; ox++) {
        float g = dyc[(size_t)oy * s.OW + ox];
        if (!mx)
          acc = fa(acc, fd(g, avg_divisor(s, excl, oy, ox)));
        else if (window_argmax(s, xc, oy, ox) == (size_t)q)
          acc = fa(acc, g);
      }
    dx[i] = acc;
  }
}

/* ---- launchers ---------------------------------------------------------------------- */

static size_t images(int n) { return n > 0 ? (size_t)n : 0; }

cudaError_t dp_k_im2col(cudaStream_t st, const dp_layer *l, int n, const float *x,
                        float *col) {
  cshape s = shape_of(l);
  size_t total = images(n) * s.OH * s.OW * ((size_t)s.C * s.K * s.K);
  if (total == 0) return cudaSuccess;
  DP_LAUNCH(k_im2col, blocks_for(total), THREADS, 0, st)(s, x, col, total);
  return cudaGetLastError();
}

cudaError_t dp_k_col2im(cudaStream_t st, const dp_layer *l, int n, const float *dcol,
                        float *dx) {
  cshape s = shape_of(l);
  size_t total = images(n) * s.C * s.H * s.W;
  if (total == 0) return cudaSuccess;
  DP_LAUNCH(k_col2im, blocks_for(total), THREADS, 0, st)(s, dcol, dx, total);
  return cudaGetLastError();
}

cudaError_t dp_k_rows_to_planes(cudaStream_t st, int n, int P, int out, const float *t,
                                float *y) {
  size_t total = images(n) * (size_t)(P > 0 ? P : 0) * (size_t)(out > 0 ? out : 0);
  if (total == 0) return cudaSuccess;
  DP_LAUNCH(k_rows_to_planes, blocks_for(total), THREADS, 0, st)((size_t)P, (size_t)out, t, y,
                                                          total);
  return cudaGetLastError();
}

cudaError_t dp_k_planes_to_rows(cudaStream_t st, int n, int P, int out, const float *dy,
                                float *t) {
  size_t total = images(n) * (size_t)(P > 0 ? P : 0) * (size_t)(out > 0 ? out : 0);
  if (total == 0) return cudaSuccess;
  DP_LAUNCH(k_planes_to_rows, blocks_for(total), THREADS, 0, st)((size_t)P, (size_t)out, dy, t,
                                                          total);
  return cudaGetLastError();
}

cudaError_t dp_k_pool_forward(cudaStream_t st, const dp_layer *l, int n, const float *x,
                              float *y) {
  cshape s = shape_of(l);
  size_t total = images(n) * s.C * s.OH * s.OW;
  if (total == 0) return cudaSuccess;
  DP_LAUNCH(k_pool_forward, blocks_for(total), THREADS, 0, st)
  (s, l->kind == DP_LAYER_MAXPOOL2D, l->exclude_pad, x, y, total);
  return cudaGetLastError();
}

cudaError_t dp_k_pool_backward(cudaStream_t st, const dp_layer *l, int n, const float *x,
                               const float *dy, float *dx) {
  cshape s = shape_of(l);
  size_t total = images(n) * s.C * s.H * s.W;
  if (total == 0) return cudaSuccess;
  DP_LAUNCH(k_pool_backward, blocks_for(total), THREADS, 0, st)
  (s, l->kind == DP_LAYER_MAXPOOL2D, l->exclude_pad, x, dy, dx, total);
  return cudaGetLastError();
}

/* ---- conv2d ------------------------------------------------------------------------- */

namespace {
struct conv_dims {
  size_t P, np, ckk; /* positions per image, n P rows, taps */
  float *col, *t;    /* in the workspace */
};
} // namespace

/* The GEMM dimensions (ints for cuBLAS) and the workspace's COL and T for n
 * images; DP_ERR_BACKEND when the workspace is short or a dimension does not
 * fit an int. */
static dp_status conv_dims_of(const dp_layer *l, int n, void *ws, size_t ws_bytes,
                              conv_dims *d) {
  d->P = (size_t)l->h * (size_t)l->w;
  d->np = images(n) * d->P;
  d->ckk = (size_t)l->ic * (size_t)l->k * (size_t)l->k;
  size_t need = dp__cuda_conv_workspace_bytes(l, n);
  if (d->np > INT_MAX || d->ckk > INT_MAX)
    return DP_FAIL(DP_ERR_BACKEND,
                   "cuda backend: conv2d of %d images: %zu x %zu im2col rows and taps "
                   "exceed cuBLAS's int dimensions",
                   n, d->np, d->ckk);
  if (!ws || ws_bytes < need)
    return DP_FAIL(DP_ERR_BACKEND,
                   "cuda backend: conv2d of %d images needs %zu bytes of workspace after "
                   "cuBLAS's; the plan has %zu",
                   n, need, ws_bytes);
  d->col = (float *)ws;
  d->t = (float *)((unsigned char *)ws + dp__cuda_conv_col_bytes(l, n));
  return DP_OK;
}

dp_status dp__cuda_conv_forward(cublasHandle_t h, cudaStream_t st, const dp_layer *l, int n,
                                const float *x, const float *w, float *y, void *ws,
                                size_t ws_bytes) {
  if (n <= 0) return DP_OK;
  conv_dims d;
  dp_status s = conv_dims_of(l, n, ws, ws_bytes, &d);
  if (s != DP_OK) return s;
  const float *b = l->bias ? w + (size_t)l->c * d.ckk : NULL;
  DP_CUDA_CHECK(dp_k_im2col(st, l, n, x, d.col));
  s = dp__cuda_linear_forward(h, st, (int)d.np, (int)d.ckk, l->c, d.col, w, b, false, d.t);
  if (s != DP_OK) return s;
  DP_CUDA_CHECK(dp_k_rows_to_planes(st, n, (int)d.P, l->c, d.t, y));
  return DP_OK;
}

dp_status dp__cuda_conv_backward(cublasHandle_t h, cudaStream_t st, const dp_layer *l,
                                 int n, const float *x, const float *w, const float *dy,
                                 float *dw, float *db, float *dx, void *ws,
                                 size_t ws_bytes) {
  if (n <= 0) { /* an empty micro-batch: zero gradients, as lib/cpu/conv.c */
    size_t ckk = (size_t)l->ic * (size_t)l->k * (size_t)l->k;
    DP_CUDA_CHECK(cudaMemsetAsync(dw, 0, (size_t)l->c * ckk * 4, st));
    if (db) DP_CUDA_CHECK(cudaMemsetAsync(db, 0, (size_t)l->c * 4, st));
    return DP_OK;
  }
  conv_dims d;
  dp_status s = conv_dims_of(l, n, ws, ws_bytes, &d);
  if (s != DP_OK) return s;
  DP_CUDA_CHECK(dp_k_planes_to_rows(st, n, (int)d.P, l->c, dy, d.t));
  DP_CUDA_CHECK(dp_k_im2col(st, l, n, x, d.col));
  /* dW = T^T' COL, db = colsum(T), dCOL = T W into COL (after dW read it) */
  s = dp__cuda_linear_backward(h, st, (int)d.np, (int)d.ckk, l->c, d.col, w, d.t, dw, db,
                               NULL, dx ? d.col : NULL);
  if (s != DP_OK) return s;
  if (dx) DP_CUDA_CHECK(dp_k_col2im(st, l, n, d.col, dx));
  return DP_OK;
}

/* ---- eager loading ------------------------------------------------------------------ */

cudaError_t dp_k_conv_preload(void) {
  const void *const kernels[] = {
      (const void *)k_im2col,         (const void *)k_col2im,
      (const void *)k_rows_to_planes, (const void *)k_planes_to_rows,
      (const void *)k_pool_forward,   (const void *)k_pool_backward,
  };
  return dp_k_load(kernels, sizeof kernels / sizeof kernels[0]);
}
