/* The image layers on the CPU (conv2d, maxpool2d, avgpool2d), NCHW as PyTorch:
 * a row of a micro-batch is one image, C x H x W floats.
 *
 * conv2d runs as GEMMs over the whole micro-batch (n images, P = OH * OW
 * output positions each, CKK = C * K * K taps):
 *   COL (n P, CKK)    im2col: row (image, position), column (channel, ky, kx)
 *   T   (n P, OUT)    = COL . W^T (+ bias)          then T -> y (n, OUT, P)
 *   dW  (OUT, CKK)    = dY^T . COL, dY^T the (n P, OUT) transpose of dy
 *   db  (OUT)         = column sums of dY^T
 *   dCOL (n P, CKK)   = dY^T' . W, then col2im into dx
 * so every output element is one fma chain over its taps (gemm.h's contract)
 * and every weight gradient one chain over the micro-batch's (image, position)
 * pairs in order: the bits depend on the micro-batch alone, never on the
 * device count. col2im and the pools' backward add into dx in a fixed loop
 * order. COL, T and the GEMMs' packing live in the device's WORKSPACE region
 * (dp__conv_workspace_bytes sizes it; the planner reserves it). */
#include "gemm.h"
#include "internal.h"

#include <math.h>
#include <string.h>

#define WS_ALIGN ((size_t)64)

static size_t up(size_t x) { return (x + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN; }

typedef struct {
  size_t np, ckk, out; /* n P rows, taps, output channels */
  size_t col, t, gemm; /* bytes of each part */
} conv_ws;

static conv_ws ws_of(const dp_layer *l, int n, bool training) {
  conv_ws s;
  s.np = (size_t)n * (size_t)l->h * (size_t)l->w;
  s.ckk = (size_t)l->ic * (size_t)l->k * (size_t)l->k;
  s.out = (size_t)l->c;
  s.col = up(s.np * s.ckk * 4);
  s.t = up(s.np * s.out * 4);
  int M = (int)s.np, N = (int)s.out, K = (int)s.ckk;
  s.gemm = dp__gemm_workspace_bytes(M, N, K);
  if (training) {
    size_t gw = dp__gemm_workspace_bytes(N, K, M), gi = dp__gemm_workspace_bytes(M, K, N);
    s.gemm = gw > s.gemm ? gw : s.gemm;
    s.gemm = gi > s.gemm ? gi : s.gemm;
  }
  return s;
}

size_t dp__conv_workspace_bytes(const dp_layer *l, int mb_rows, bool training) {
  if (l->kind != DP_LAYER_CONV2D || mb_rows <= 0) return 0;
  conv_ws s = ws_of(l, mb_rows, training);
  return s.col + s.t + s.gemm;
}

/* COL (n P, CKK) of n images x (n, C, H, W): zero where a tap is padding. */
static void im2col(const dp_layer *l, int n, const float *x, float *col) {
  int C = l->ic, H = l->ih, W = l->iw, K = l->k, S = l->stride, Pd = l->pad;
  int OH = l->h, OW = l->w;
  size_t ckk = (size_t)C * K * K;
  for (int s = 0; s < n; s++)
    for (int oy = 0; oy < OH; oy++)
      for (int ox = 0; ox < OW; ox++) {
        float *row = col + (((size_t)s * OH + oy) * OW + ox) * ckk;
        for (int c = 0; c < C; c++) {
          const float *xc = x + ((size_t)s * C + c) * H * W;
          for (int ky = 0; ky < K; ky++) {
            int iy = oy * S - Pd + ky;
            float *dst = row + ((size_t)c * K + ky) * K;
            if (iy < 0 || iy >= H) {
              memset(dst, 0, (size_t)K * 4);
              continue;
            }
            for (int kx = 0; kx < K; kx++) {
              int ix = ox * S - Pd + kx;
              dst[kx] = ix >= 0 && ix < W ? xc[(size_t)iy * W + ix] : 0.0f;
            }
          }
        }
      }
}

/* dx (n, C, H, W) = the sum, over every tap that read an element, of dCOL;
 * taps in (image, position, channel, ky, kx) order. */
static void col2im(const dp_layer *l, int n, const float *dcol, float *dx) {
  int C = l->ic, H = l->ih, W = l->iw, K = l->k, S = l->stride, Pd = l->pad;
  int OH = l->h, OW = l->w;
  size_t ckk = (size_t)C * K * K;
  memset(dx, 0, (size_t)n * C * H * W * 4);
  for (int s = 0; s < n; s++)
    for (int oy = 0; oy < OH; oy++)
      for (int ox = 0; ox < OW; ox++) {
        const float *row = dcol + (((size_t)s * OH + oy) * OW + ox) * ckk;
        for (int c = 0; c < C; c++) {
          float *xc = dx + ((size_t)s * C + c) * H * W;
          for (int ky = 0; ky < K; ky++) {
            int iy = oy * S - Pd + ky;
            if (iy < 0 || iy >= H) continue;
            const float *src = row + ((size_t)c * K + ky) * K;
            for (int kx = 0; kx < K; kx++) {
              int ix = ox * S - Pd + kx;
              if (ix >= 0 && ix < W) xc[(size_t)iy * W + ix] += src[kx];
            }
          }
        }
      }
}

bool dp__conv_forward(const dp_layer *l, int n, const float *x, const float *w, float *y,
                      void *ws, size_t ws_bytes) {
  if (n <= 0) return true;
  conv_ws s = ws_of(l, n, false);
  if (ws_bytes < s.col + s.t + s.gemm) return false;
  float *col = ws, *t = (float *)((unsigned char *)ws + s.col);
  void *g = s.gemm ? (unsigned char *)ws + s.col + s.t : NULL;
  im2col(l, n, x, col);
  size_t P = (size_t)l->h * l->w, wn = (size_t)l->c * s.ckk;
  dp_gemm_epilogue ep = {.bias = l->bias ? w + wn : NULL};
  dp__sgemm(0, 1, (int)s.np, (int)s.out, (int)s.ckk, col, (int)s.ckk, w, (int)s.ckk, t,
            (int)s.out, &ep, g);
  for (int i = 0; i < n; i++) /* (P, OUT) -> (OUT, P) per image */
    for (size_t p = 0; p < P; p++)
      for (size_t o = 0; o < s.out; o++)
        y[((size_t)i * s.out + o) * P + p] = t[((size_t)i * P + p) * s.out + o];
  return true;
}

bool dp__conv_backward(const dp_layer *l, int n, const float *x, const float *w,
                       const float *dy, float *dw, float *db, float *dx, void *ws,
                       size_t ws_bytes) {
  conv_ws s = ws_of(l, n, true);
  size_t wn = (size_t)l->c * s.ckk;
  if (n <= 0) { /* an empty micro-batch: zero gradients, as a GEMM over K = 0 */
    memset(dw, 0, wn * 4);
    if (db) memset(db, 0, s.out * 4);
    return true;
  }
  if (ws_bytes < s.col + s.t + s.gemm) return false;
  float *col = ws, *t = (float *)((unsigned char *)ws + s.col);
  void *g = s.gemm ? (unsigned char *)ws + s.col + s.t : NULL;
  size_t P = (size_t)l->h * l->w;
  for (int i = 0; i < n; i++) /* dy (OUT, P) -> dY^T (P, OUT) per image */
    for (size_t o = 0; o < s.out; o++)
      for (size_t p = 0; p < P; p++)
        t[((size_t)i * P + p) * s.out + o] = dy[((size_t)i * s.out + o) * P + p];
  im2col(l, n, x, col);
  dp__sgemm(1, 0, (int)s.out, (int)s.ckk, (int)s.np, t, (int)s.out, col, (int)s.ckk, dw,
            (int)s.ckk, NULL, g);
  if (db) dp__gemm_colsum((int)s.np, (int)s.out, t, (int)s.out, db);
  if (dx) { /* dCOL into COL's place (COL is no longer needed), then col2im */
    dp__sgemm(0, 0, (int)s.np, (int)s.ckk, (int)s.out, t, (int)s.out, w, (int)s.ckk, col,
              (int)s.ckk, NULL, g);
    col2im(l, n, col, dx);
  }
  return true;
}

/* The window of output (oy, ox) starts at input (oy S, ox S). Max: the first
 * largest element in (ky, kx) order, a NaN taken at once (PyTorch's rule), so
 * that forward and backward pick the same element. */
static size_t argmax(const float *xc, int W, int y0, int x0, int K) {
  size_t best = (size_t)y0 * W + x0;
  float m = -INFINITY;
  for (int ky = 0; ky < K; ky++)
    for (int kx = 0; kx < K; kx++) {
      size_t at = (size_t)(y0 + ky) * W + (x0 + kx);
      float v = xc[at];
      if (v > m || isnan(v)) {
        m = v;
        best = at;
        if (isnan(v)) return best;
      }
    }
  return best;
}

void dp__pool_forward(const dp_layer *l, int n, const float *x, float *y) {
  int C = l->ic, H = l->ih, W = l->iw, K = l->k, S = l->stride, OH = l->h, OW = l->w;
  bool mx = l->kind == DP_LAYER_MAXPOOL2D;
  float area = (float)(K * K);
  for (size_t sc = 0; sc < (size_t)n * C; sc++) {
    const float *xc = x + sc * H * W;
    float *yc = y + sc * OH * OW;
    for (int oy = 0; oy < OH; oy++)
      for (int ox = 0; ox < OW; ox++) {
        if (mx) {
          yc[oy * OW + ox] = xc[argmax(xc, W, oy * S, ox * S, K)];
          continue;
        }
        float sum = 0.0f;
        for (int ky = 0; ky < K; ky++)
          for (int kx = 0; kx < K; kx++)
            sum += xc[(size_t)(oy * S + ky) * W + (ox * S + kx)];
        yc[oy * OW + ox] = sum / area;
      }
  }
}

void dp__pool_backward(const dp_layer *l, int n, const float *x, const float *dy,
                       float *dx) {
  int C = l->ic, H = l->ih, W = l->iw, K = l->k, S = l->stride, OH = l->h, OW = l->w;
  bool mx = l->kind == DP_LAYER_MAXPOOL2D;
  float area = (float)(K * K);
  memset(dx, 0, (size_t)n * C * H * W * 4);
  for (size_t sc = 0; sc < (size_t)n * C; sc++) {
    const float *xc = x ? x + sc * H * W : NULL;
    const float *dyc = dy + sc * OH * OW;
    float *dxc = dx + sc * H * W;
    for (int oy = 0; oy < OH; oy++)
      for (int ox = 0; ox < OW; ox++) {
        float g = dyc[oy * OW + ox];
        if (mx) {
          dxc[argmax(xc, W, oy * S, ox * S, K)] += g;
          continue;
        }
        float share = g / area;
        for (int ky = 0; ky < K; ky++)
          for (int kx = 0; kx < K; kx++)
            dxc[(size_t)(oy * S + ky) * W + (ox * S + kx)] += share;
      }
  }
}
