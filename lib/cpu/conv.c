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
 * (dp__conv_workspace_bytes sizes it; the planner reserves it).
 *
 * Speed without changing a bit (issue 17; docs/PERFORMANCE.md): the forward
 * and dCOL's product run on chunks of images whose COL stays in cache (rows of
 * a product are the same in any sub-problem); im2col and col2im go through a
 * zero-padded copy of one channel plane, so no tap is tested; the transposes
 * move 8 x 8 blocks (AVX2); maxpool 2 stride 2 takes its windows' maxima
 * with compares and blends, 8 windows at once. Everything else that adds keeps
 * its order, and the operand order of each add too (add_acc: only which NaN
 * comes out of NaN + NaN depends on it).
 *
 * On the AVX-512 tier, conv2d 3 x 3 padding 1 and the narrowest maxpools run
 * without im2col and with the same bits (conv_fast.h; session 17). */
#include "cpu/gemm.h"
#include "cpu/conv_fast.h"
#include "cpu/cpu.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define CONV_X86 1
#include <immintrin.h>
#define TGT_AVX2 __attribute__((target("avx2")))
#else
#define CONV_X86 0
#endif

/* a + b with a's NaN when both are NaNs, as the plain loops compiled before
 * (x86 returns the first operand's NaN; the compiler may swap the operands
 * of a commutative +, which changes only which NaN comes out). Legacy SSE
 * encoding: not for functions compiled for AVX (a state transition per add). */
static inline float add_acc(float a, float b) {
#if CONV_X86
  __asm__("addss %1, %0" : "+x"(a) : "x"(b));
  return a;
#else
  return a + b;
#endif
}

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

/* COL, T, the GEMMs' packing: the last part ends where its bytes do, so that
 * the plan is exact (T last, unpadded, when the products pack nothing: the
 * padding was up to 60 bytes no op touched) */
static size_t ws_need(const conv_ws *s) {
  return s->gemm ? s->col + s->t + s->gemm : s->col + s->np * s->out * 4;
}

size_t dp__conv_workspace_bytes(const dp_layer *l, int mb_rows, bool training) {
  if (l->kind != DP_LAYER_CONV2D || mb_rows <= 0) return 0;
  conv_ws s = ws_of(l, mb_rows, training);
  return ws_need(&s);
}

/* COL (n P, CKK) of n images x (n, C, H, W): zero where a tap is padding.
 * Row by row: the kernel rows of a window wholly inside the image are copied
 * without a test per tap (K a constant in the common K = 3 case). */
static inline __attribute__((always_inline)) void
im2col_k(const dp_layer *l, int n, const float *restrict x, float *restrict col, int K) {
  int C = l->ic, H = l->ih, W = l->iw, S = l->stride, Pd = l->pad;
  int OH = l->h, OW = l->w;
  size_t ckk = (size_t)C * K * K, hw = (size_t)H * W;
  float *row = col;
  for (int s = 0; s < n; s++) {
    const float *xs = x + (size_t)s * C * hw;
    for (int oy = 0; oy < OH; oy++) {
      int iy0 = oy * S - Pd;
      for (int ox = 0; ox < OW; ox++, row += ckk) {
        int ix0 = ox * S - Pd;
        bool inside = ix0 >= 0 && ix0 + K <= W;
        for (int c = 0; c < C; c++) {
          const float *xc = xs + (size_t)c * hw;
          float *dst = row + (size_t)c * K * K;
          for (int ky = 0; ky < K; ky++, dst += K) {
            int iy = iy0 + ky;
            if (iy < 0 || iy >= H) {
              for (int kx = 0; kx < K; kx++) dst[kx] = 0.0f;
              continue;
            }
            const float *xr = xc + (size_t)iy * W;
            if (inside) {
              for (int kx = 0; kx < K; kx++) dst[kx] = xr[ix0 + kx];
            } else {
              for (int kx = 0; kx < K; kx++) {
                int ix = ix0 + kx;
                dst[kx] = ix >= 0 && ix < W ? xr[ix] : 0.0f;
              }
            }
          }
        }
      }
    }
  }
}

/* The same COL through a zero-padded copy of one channel plane at a time (on
 * the stack, PAD_CAP floats): every window is then inside, so a row of taps is
 * K plain moves. COL is written a channel's K x K taps at a time. */
#define PAD_CAP 4096

static bool pad_fits(const dp_layer *l) {
  return (size_t)(l->ih + 2 * l->pad) * (size_t)(l->iw + 2 * l->pad) <= PAD_CAP;
}

static inline __attribute__((always_inline)) void im2col_pad_k(const dp_layer *l, int n,
                                                               const float *restrict x,
                                                               float *restrict col, int K) {
  int C = l->ic, H = l->ih, W = l->iw, S = l->stride, Pd = l->pad;
  int OH = l->h, OW = l->w, PW = W + 2 * Pd;
  size_t ckk = (size_t)C * K * K, hw = (size_t)H * W, P = (size_t)OH * OW;
  float pb[PAD_CAP];
  memset(pb, 0, (size_t)(H + 2 * Pd) * PW * 4); /* the border stays zero */
  for (int s = 0; s < n; s++)
    for (int c = 0; c < C; c++) {
      const float *xc = x + ((size_t)s * C + c) * hw;
      for (int iy = 0; iy < H; iy++)
        memcpy(pb + (size_t)(iy + Pd) * PW + Pd, xc + (size_t)iy * W, (size_t)W * 4);
      float *dst = col + (size_t)s * P * ckk + (size_t)c * K * K;
      for (int oy = 0; oy < OH; oy++)
        for (int ox = 0; ox < OW; ox++, dst += ckk) {
          const float *w0 = pb + (size_t)oy * S * PW + (size_t)ox * S;
          for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++) dst[ky * K + kx] = w0[(size_t)ky * PW + kx];
        }
    }
}

/* col2im through a padded plane: per channel plane, positions ascending, taps
 * (ky, kx) ascending, as the direct loop adds into each element (what lands in
 * the padding is dropped); then the plane's inside is copied out. */
static inline __attribute__((always_inline)) void col2im_pad_k(const dp_layer *l, int n,
                                                               const float *restrict dcol,
                                                               float *restrict dx, int K) {
  int C = l->ic, H = l->ih, W = l->iw, S = l->stride, Pd = l->pad;
  int OH = l->h, OW = l->w, PW = W + 2 * Pd;
  size_t ckk = (size_t)C * K * K, hw = (size_t)H * W, P = (size_t)OH * OW;
  float pb[PAD_CAP];
  for (int s = 0; s < n; s++)
    for (int c = 0; c < C; c++) {
      memset(pb, 0, (size_t)(H + 2 * Pd) * PW * 4);
      const float *src = dcol + (size_t)s * P * ckk + (size_t)c * K * K;
      for (int oy = 0; oy < OH; oy++)
        for (int ox = 0; ox < OW; ox++, src += ckk) {
          float *w0 = pb + (size_t)oy * S * PW + (size_t)ox * S;
          for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++) {
              float *e = w0 + (size_t)ky * PW + kx;
              *e = add_acc(*e, src[ky * K + kx]);
            }
        }
      float *xc = dx + ((size_t)s * C + c) * hw;
      for (int iy = 0; iy < H; iy++)
        memcpy(xc + (size_t)iy * W, pb + (size_t)(iy + Pd) * PW + Pd, (size_t)W * 4);
    }
}

/* dx (n, C, H, W) = the sum, over every tap that read an element, of dCOL;
 * taps in (image, position, channel, ky, kx) order (the loops run in that
 * order; only the bounds tests are hoisted). */
static inline __attribute__((always_inline)) void
col2im_k(const dp_layer *l, int n, const float *restrict dcol, float *restrict dx, int K) {
  int C = l->ic, H = l->ih, W = l->iw, S = l->stride, Pd = l->pad;
  int OH = l->h, OW = l->w;
  size_t ckk = (size_t)C * K * K, hw = (size_t)H * W;
  memset(dx, 0, (size_t)n * C * hw * 4);
  const float *row = dcol;
  for (int s = 0; s < n; s++) {
    float *xs = dx + (size_t)s * C * hw;
    for (int oy = 0; oy < OH; oy++) {
      int iy0 = oy * S - Pd;
      int ky0 = iy0 < 0 ? -iy0 : 0, ky1 = H - iy0 < K ? H - iy0 : K;
      for (int ox = 0; ox < OW; ox++, row += ckk) {
        int ix0 = ox * S - Pd;
        int kx0 = ix0 < 0 ? -ix0 : 0, kx1 = W - ix0 < K ? W - ix0 : K;
        for (int c = 0; c < C; c++) {
          float *xc = xs + (size_t)c * hw;
          const float *src = row + (size_t)c * K * K;
          for (int ky = ky0; ky < ky1; ky++) {
            float *xr = xc + (size_t)(iy0 + ky) * W + ix0;
            const float *sr = src + (size_t)ky * K;
            if (kx0 == 0 && kx1 == K)
              for (int kx = 0; kx < K; kx++) xr[kx] = add_acc(xr[kx], sr[kx]);
            else
              for (int kx = kx0; kx < kx1; kx++) xr[kx] = add_acc(xr[kx], sr[kx]);
          }
        }
      }
    }
  }
}

/* dst[j * ldd + i] = src[i * lds + j] for i < rows, j < cols: a move, so any
 * order gives the same bits. 8 x 8 blocks (AVX2 where there is one). */
#if CONV_X86
TGT_AVX2 static inline void tr8(const float *s, size_t lds, float *d, size_t ldd) {
  __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + lds),
         r2 = _mm256_loadu_ps(s + 2 * lds), r3 = _mm256_loadu_ps(s + 3 * lds),
         r4 = _mm256_loadu_ps(s + 4 * lds), r5 = _mm256_loadu_ps(s + 5 * lds),
         r6 = _mm256_loadu_ps(s + 6 * lds), r7 = _mm256_loadu_ps(s + 7 * lds);
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
         t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
         t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
         t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)),
         u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)),
         u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)),
         u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2)),
         u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)),
         u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2)),
         u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)),
         u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(d + ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(d + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(d + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(d + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(d + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(d + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(d + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
}

TGT_AVX2 static void transpose_avx2(const float *src, size_t rows, size_t cols, size_t lds,
                                    float *dst, size_t ldd) {
  size_t r8 = rows & ~(size_t)7, c8 = cols & ~(size_t)7;
  /* 16 source rows per pass: each destination row gets a whole 64-byte line */
  for (size_t i0 = 0; i0 < r8; i0 += 16) {
    size_t i1 = i0 + 16 < r8 ? i0 + 16 : r8;
    for (size_t j = 0; j < c8; j += 8)
      for (size_t i = i0; i < i1; i += 8)
        tr8(src + i * lds + j, lds, dst + j * ldd + i, ldd);
  }
  for (size_t i = 0; i < r8; i++)
    for (size_t j = c8; j < cols; j++) dst[j * ldd + i] = src[i * lds + j];
  for (size_t i = r8; i < rows; i++)
    for (size_t j = 0; j < cols; j++) dst[j * ldd + i] = src[i * lds + j];
}
#endif

void dp__conv_transpose(const float *restrict src, size_t rows, size_t cols, size_t lds,
                        float *restrict dst, size_t ldd) {
#if CONV_X86
  if (__builtin_cpu_supports("avx2")) {
    transpose_avx2(src, rows, cols, lds, dst, ldd);
    return;
  }
#endif
  for (size_t i0 = 0; i0 < rows; i0 += 8)
    for (size_t j0 = 0; j0 < cols; j0 += 8) {
      size_t i1 = i0 + 8 < rows ? i0 + 8 : rows, j1 = j0 + 8 < cols ? j0 + 8 : cols;
      for (size_t j = j0; j < j1; j++)
        for (size_t i = i0; i < i1; i++) dst[j * ldd + i] = src[i * lds + j];
    }
}

static void im2col(const dp_layer *l, int n, const float *x, float *col) {
  if (pad_fits(l) && l->k == 3)
    im2col_pad_k(l, n, x, col, 3);
  else if (pad_fits(l))
    im2col_pad_k(l, n, x, col, l->k);
  else if (l->k == 3)
    im2col_k(l, n, x, col, 3);
  else
    im2col_k(l, n, x, col, l->k);
}

static void col2im(const dp_layer *l, int n, const float *dcol, float *dx) {
  if (pad_fits(l) && l->k == 3)
    col2im_pad_k(l, n, dcol, dx, 3);
  else if (pad_fits(l))
    col2im_pad_k(l, n, dcol, dx, l->k);
  else if (l->k == 3)
    col2im_k(l, n, dcol, dx, 3);
  else
    col2im_k(l, n, dcol, dx, l->k);
}

/* Images per chunk of the forward (and of dCOL's product in backward): COL for
 * that many stays in cache between im2col (col2im) and the GEMM. A chunk's
 * rows of the product equal the same rows of the whole one (gemm.h), so the
 * bits do not depend on it; the weight gradient, whose chain runs over every
 * (image, position), is one product over the whole micro-batch. */
#ifndef CONV_CHUNK_BYTES
#define CONV_CHUNK_BYTES ((size_t)256 << 10)
#endif

static int chunk_images(const conv_ws *s, int n) {
  size_t per = s->np / (size_t)n * s->ckk * 4, k = per ? CONV_CHUNK_BYTES / per : (size_t)n;
  return k < 1 ? 1 : k > (size_t)n ? n : (int)k;
}

bool dp__conv_forward(const dp_layer *l, int n, const float *x, const float *w, float *y,
                      bool relu, void *ws, size_t ws_bytes) {
  if (n <= 0) return true;
  conv_ws s = ws_of(l, n, false);
  if (ws_bytes < ws_need(&s)) return false;
  if (dp__convx_takes(l)) { /* the same bits */
    dp__convx_forward(l, n, x, w, y, relu, ws, ws_bytes);
    return true;
  }
  float *col = ws, *t = (float *)((unsigned char *)ws + s.col);
  void *g = s.gemm ? (unsigned char *)ws + s.col + s.t : NULL;
  size_t P = (size_t)l->h * l->w, wn = (size_t)l->c * s.ckk, in = (size_t)l->in;
  dp_gemm_epilogue ep = {.bias = l->bias ? w + wn : NULL,
                         .act = relu ? DP_GEMM_ACT_RELU : DP_GEMM_ACT_NONE};
  int nb = chunk_images(&s, n);
  for (int s0 = 0; s0 < n; s0 += nb) {
    int m = n - s0 < nb ? n - s0 : nb;
    im2col(l, m, x + (size_t)s0 * in, col);
    dp__sgemm(0, 1, (int)((size_t)m * P), (int)s.out, (int)s.ckk, col, (int)s.ckk, w,
              (int)s.ckk, t, (int)s.out, &ep, g);
    for (int i = 0; i < m; i++) /* (P, OUT) -> (OUT, P) per image */
      dp__conv_transpose(t + (size_t)i * P * s.out, P, s.out, s.out,
                         y + ((size_t)s0 + i) * s.out * P, P);
  }
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
  if (ws_bytes < ws_need(&s)) return false;
  if (dp__convx_takes(l) && ws_bytes >= dp__convx_bwd_bytes(l, n) && /* the same bits */
      dp__convx_backward(l, n, x, w, dy, dw, db, dx, ws, ws_bytes))
    return true;
  float *col = ws, *t = (float *)((unsigned char *)ws + s.col);
  void *g = s.gemm ? (unsigned char *)ws + s.col + s.t : NULL;
  size_t P = (size_t)l->h * l->w;
  for (int i = 0; i < n; i++) /* dy (OUT, P) -> dY^T (P, OUT) per image */
    dp__conv_transpose(dy + (size_t)i * s.out * P, s.out, P, P, t + (size_t)i * P * s.out,
                       s.out);
  im2col(l, n, x, col);
  dp__sgemm(1, 0, (int)s.out, (int)s.ckk, (int)s.np, t, (int)s.out, col, (int)s.ckk, dw,
            (int)s.ckk, NULL, g);
  if (db) dp__gemm_colsum((int)s.np, (int)s.out, t, (int)s.out, db);
  if (dx) { /* dCOL into COL's place (COL is no longer needed), then col2im */
    int nb = chunk_images(&s, n);
    size_t in = (size_t)l->in;
    for (int s0 = 0; s0 < n; s0 += nb) {
      int m = n - s0 < nb ? n - s0 : nb;
      dp__sgemm(0, 0, (int)((size_t)m * P), (int)s.ckk, (int)s.out,
                t + (size_t)s0 * P * s.out, (int)s.out, w, (int)s.ckk, col, (int)s.ckk,
                NULL, g);
      col2im(l, m, col, dx + (size_t)s0 * in);
    }
  }
  return true;
}

/* The window of output (oy, ox) starts at input (oy S, ox S). Max: the first
 * largest element in (ky, kx) order, a NaN taken at once (PyTorch's rule), so
 * that forward and backward pick the same element. Without branches: taking v
 * when v > m or (v is a NaN and m is not) is that rule (a NaN m takes nothing
 * more; the first element is the start, -inf included). */
static inline __attribute__((always_inline)) size_t argmax_k(const float *xc, int W, int y0,
                                                             int x0, int K) {
  const float *r = xc + (size_t)y0 * W + x0;
  size_t best = 0;
  float m = r[0];
  for (int ky = 0; ky < K; ky++)
    for (int kx = 0; kx < K; kx++) {
      size_t at = (size_t)ky * W + kx;
      float v = r[at];
      bool take = v > m || (v != v && m == m);
      m = take ? v : m;
      best = take ? at : best;
    }
  return (size_t)y0 * W + x0 + best;
}

static inline __attribute__((always_inline)) void
maxpool_fwd_k(const dp_layer *l, int n, const float *restrict x, float *restrict y, int K) {
  int C = l->ic, H = l->ih, W = l->iw, S = l->stride, OH = l->h, OW = l->w;
  for (size_t sc = 0; sc < (size_t)n * C; sc++) {
    const float *xc = x + sc * H * W;
    float *yc = y + sc * OH * OW;
    for (int oy = 0; oy < OH; oy++)
      for (int ox = 0; ox < OW; ox++)
        yc[oy * OW + ox] = xc[argmax_k(xc, W, oy * S, ox * S, K)];
  }
}

/* dx = 0 + the sum of dy over the windows whose max an element is, windows in
 * (oy, ox) order. */
static inline __attribute__((always_inline)) void maxpool_bwd_k(const dp_layer *l, int n,
                                                                const float *restrict x,
                                                                const float *restrict dy,
                                                                float *restrict dx, int K) {
  int C = l->ic, H = l->ih, W = l->iw, S = l->stride, OH = l->h, OW = l->w;
  memset(dx, 0, (size_t)n * C * H * W * 4);
  for (size_t sc = 0; sc < (size_t)n * C; sc++) {
    const float *xc = x + sc * H * W, *dyc = dy + sc * OH * OW;
    float *dxc = dx + sc * H * W;
    for (int oy = 0; oy < OH; oy++)
      for (int ox = 0; ox < OW; ox++) {
        size_t at = argmax_k(xc, W, oy * S, ox * S, K);
        dxc[at] = add_acc(dyc[oy * OW + ox], dxc[at]); /* dy first, as before */
      }
  }
}

/* A window's real cells with padding: rows [*y0, *y1) and columns [*x0, *x1)
 * of the plane, the window of output (oy, ox) starting at (oy S - P, ox S - P)
 * clipped to it. Never empty: P <= K / 2 (dp_model_add_pool2d_padded) leaves
 * every floor-mode window a real row and column. */
static inline void window_cells(const dp_layer *l, int oy, int ox, int *y0, int *y1,
                                int *x0, int *x1) {
  int S = l->stride, P = l->pad, K = l->k;
  int a = oy * S - P, b = ox * S - P;
  *y0 = a < 0 ? 0 : a;
  *x0 = b < 0 ? 0 : b;
  *y1 = a + K < l->ih ? a + K : l->ih;
  *x1 = b + K < l->iw ? b + K : l->iw;
}

/* argmax_k over a padded window: the -inf padding never wins, so it is the
 * rule of argmax_k on the real cells alone, from the first of them. */
static size_t argmax_pad(const dp_layer *l, const float *xc, int oy, int ox) {
  int y0, y1, x0, x1, W = l->iw;
  window_cells(l, oy, ox, &y0, &y1, &x0, &x1);
  size_t best = (size_t)y0 * W + x0;
  float m = xc[best];
  for (int iy = y0; iy < y1; iy++)
    for (int ix = x0; ix < x1; ix++) {
      size_t at = (size_t)iy * W + ix;
      float v = xc[at];
      bool take = v > m || (v != v && m == m);
      m = take ? v : m;
      best = take ? at : best;
    }
  return best;
}

/* maxpool with padding: y, or (dy given) dx as maxpool_bwd_k's */
static void maxpool_pad(const dp_layer *l, int n, const float *restrict x,
                        const float *restrict dy, float *restrict y, float *restrict dx) {
  int C = l->ic, H = l->ih, W = l->iw, OH = l->h, OW = l->w;
  if (dx) memset(dx, 0, (size_t)n * C * H * W * 4);
  for (size_t sc = 0; sc < (size_t)n * C; sc++) {
    const float *xc = x + sc * H * W;
    for (int oy = 0; oy < OH; oy++)
      for (int ox = 0; ox < OW; ox++) {
        size_t at = argmax_pad(l, xc, oy, ox), o = sc * OH * OW + (size_t)oy * OW + ox;
        if (dx)
          dx[sc * H * W + at] = add_acc(dy[o], dx[sc * H * W + at]); /* dy first */
        else
          y[o] = xc[at];
      }
  }
}

/* avgpool's divisor for a window of real cells [y0, y1) x [x0, x1): K K
 * (PyTorch's count_include_pad), or with exclude_pad those cells' count */
static inline float avg_divisor(const dp_layer *l, int y0, int y1, int x0, int x1) {
  return (float)(l->exclude_pad ? (y1 - y0) * (x1 - x0) : l->k * l->k);
}

#if CONV_X86
/* maxpool2d 2 stride 2 with AVX2: the four taps of 8 (or 4) windows side by
 * side, (0,0) (0,1) (1,0) (1,1), taken in that order by the rule of argmax_k
 * with compares and blends (moves: the same element comes out). */
#define MP_SEL(T, V, M) /* v > m or (v is a NaN and m is not) */                           \
  T##_or_ps(T##_cmp_ps(V, M, _CMP_GT_OQ),                                                  \
            T##_and_ps(T##_cmp_ps(V, V, _CMP_UNORD_Q), T##_cmp_ps(M, M, _CMP_ORD_Q)))

/* even and odd elements of 16 floats at p: e = p[0], p[2], ..., o = p[1], p[3], ... */
TGT_AVX2 static inline void deint8(const float *p, __m256 *e, __m256 *o) {
  __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
  *e = _mm256_castpd_ps(_mm256_permute4x64_pd(
      _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), 0xd8));
  *o = _mm256_castpd_ps(_mm256_permute4x64_pd(
      _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), 0xd8));
}

/* p[0..15] = e0 o0 e1 o1 ... e7 o7 (deint8 undone) */
TGT_AVX2 static inline void int8(float *p, __m256 e, __m256 o) {
  __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
  _mm256_storeu_ps(p, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(p + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}

/* the four taps of 8 windows: max in *m, the tap taken (0..3, as int bits) in *idx */
TGT_AVX2 static inline void win8(const float *r0, const float *r1, __m256 *m, __m256 *idx) {
  __m256 t[4];
  deint8(r0, &t[0], &t[1]);
  deint8(r1, &t[2], &t[3]);
  __m256 mm = t[0], id = _mm256_setzero_ps();
  for (int k = 1; k < 4; k++) {
    __m256 take = MP_SEL(_mm256, t[k], mm);
    mm = _mm256_blendv_ps(mm, t[k], take);
    id = _mm256_blendv_ps(id, _mm256_castsi256_ps(_mm256_set1_epi32(k)), take);
  }
  *m = mm;
  *idx = id;
}

TGT_AVX2 static inline void win4(const float *r0, const float *r1, __m128 *m, __m128 *idx) {
  __m128 t[4];
  for (int r = 0; r < 2; r++) {
    const float *p = r ? r1 : r0;
    __m128 a = _mm_loadu_ps(p), b = _mm_loadu_ps(p + 4);
    t[2 * r] = _mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    t[2 * r + 1] = _mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
  }
  __m128 mm = t[0], id = _mm_setzero_ps();
  for (int k = 1; k < 4; k++) {
    __m128 take = MP_SEL(_mm, t[k], mm);
    mm = _mm_blendv_ps(mm, t[k], take);
    id = _mm_blendv_ps(id, _mm_castsi128_ps(_mm_set1_epi32(k)), take);
  }
  *m = mm;
  *idx = id;
}

/* one window, the scalar way but without branches: the tap taken, 0..3 */
TGT_AVX2 static inline int win1(const float *r0, const float *r1) {
  __m128 t[4] = {_mm_load_ss(r0), _mm_load_ss(r0 + 1), _mm_load_ss(r1),
                 _mm_load_ss(r1 + 1)};
  __m128 mm = t[0], id = _mm_setzero_ps();
  for (int k = 1; k < 4; k++) {
    __m128 take = MP_SEL(_mm, t[k], mm);
    mm = _mm_blendv_ps(mm, t[k], take);
    id = _mm_blendv_ps(id, _mm_castsi128_ps(_mm_set1_epi32(k)), take);
  }
  return _mm_cvtsi128_si32(_mm_castps_si128(id));
}

TGT_AVX2 static void maxpool22_fwd(const dp_layer *l, int n, const float *x, float *y) {
  int C = l->ic, H = l->ih, W = l->iw, OH = l->h, OW = l->w;
  for (size_t sc = 0; sc < (size_t)n * C; sc++) {
    const float *xc = x + sc * H * W;
    float *yc = y + sc * OH * OW;
    for (int oy = 0; oy < OH; oy++) {
      const float *r0 = xc + (size_t)2 * oy * W, *r1 = r0 + W;
      float *yr = yc + (size_t)oy * OW;
      int ox = 0;
      for (; ox + 8 <= OW; ox += 8) {
        __m256 m, id;
        win8(r0 + 2 * ox, r1 + 2 * ox, &m, &id);
        _mm256_storeu_ps(yr + ox, m);
      }
      for (; ox + 4 <= OW; ox += 4) {
        __m128 m, id;
        win4(r0 + 2 * ox, r1 + 2 * ox, &m, &id);
        _mm_storeu_ps(yr + ox, m);
      }
      for (; ox < OW; ox++) {
        int k = win1(r0 + 2 * ox, r1 + 2 * ox);
        yr[ox] = (k < 2 ? r0 : r1)[2 * ox + (k & 1)];
      }
    }
  }
}

/* dx: 0 + dy at the tap taken, +0 elsewhere (each element is in one window
 * at most: what memset and += gave) */
TGT_AVX2 static void maxpool22_bwd(const dp_layer *l, int n, const float *x,
                                   const float *dy, float *dx) {
  int C = l->ic, H = l->ih, W = l->iw, OH = l->h, OW = l->w;
  for (size_t sc = 0; sc < (size_t)n * C; sc++) {
    const float *xc = x + sc * H * W, *dyc = dy + sc * OH * OW;
    float *dxc = dx + sc * H * W;
    for (int oy = 0; oy < OH; oy++) {
      const float *r0 = xc + (size_t)2 * oy * W, *r1 = r0 + W;
      float *d0 = dxc + (size_t)2 * oy * W, *d1 = d0 + W;
      const float *g = dyc + (size_t)oy * OW;
      int ox = 0;
      for (; ox + 8 <= OW; ox += 8) {
        __m256 m, id;
        win8(r0 + 2 * ox, r1 + 2 * ox, &m, &id);
        __m256 gz = _mm256_add_ps(_mm256_setzero_ps(), _mm256_loadu_ps(g + ox));
        __m256i ii = _mm256_castps_si256(id);
        __m256 t[4];
        for (int k = 0; k < 4; k++)
          t[k] = _mm256_and_ps(
              _mm256_castsi256_ps(_mm256_cmpeq_epi32(ii, _mm256_set1_epi32(k))), gz);
        int8(d0 + 2 * ox, t[0], t[1]);
        int8(d1 + 2 * ox, t[2], t[3]);
      }
      for (; ox + 4 <= OW; ox += 4) {
        __m128 m, id;
        win4(r0 + 2 * ox, r1 + 2 * ox, &m, &id);
        __m128 gz = _mm_add_ps(_mm_setzero_ps(), _mm_loadu_ps(g + ox));
        __m128i ii = _mm_castps_si128(id);
        __m128 t[4];
        for (int k = 0; k < 4; k++)
          t[k] = _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(ii, _mm_set1_epi32(k))), gz);
        _mm_storeu_ps(d0 + 2 * ox, _mm_unpacklo_ps(t[0], t[1]));
        _mm_storeu_ps(d0 + 2 * ox + 4, _mm_unpackhi_ps(t[0], t[1]));
        _mm_storeu_ps(d1 + 2 * ox, _mm_unpacklo_ps(t[2], t[3]));
        _mm_storeu_ps(d1 + 2 * ox + 4, _mm_unpackhi_ps(t[2], t[3]));
      }
      for (; ox < OW; ox++) {
        int k = win1(r0 + 2 * ox, r1 + 2 * ox);
        d0[2 * ox] = d0[2 * ox + 1] = d1[2 * ox] = d1[2 * ox + 1] = 0.0f;
        float *at = (k < 2 ? d0 : d1) + 2 * ox + (k & 1);
        *at = 0.0f + g[ox]; /* one term: no NaN to choose */
      }
      for (int ix = 2 * OW; ix < W; ix++) d0[ix] = d1[ix] = 0.0f;
    }
    if (2 * OH < H) memset(dxc + (size_t)2 * OH * W, 0, (size_t)(H - 2 * OH) * W * 4);
  }
}
#endif

static bool maxpool22(const dp_layer *l) {
#if CONV_X86
  return l->kind == DP_LAYER_MAXPOOL2D && l->k == 2 && l->stride == 2 && l->pad == 0 &&
         __builtin_cpu_supports("avx2");
#else
  (void)l;
  return false;
#endif
}

void dp__pool_forward(const dp_layer *l, int n, const float *x, float *y) {
  int C = l->ic, H = l->ih, W = l->iw, K = l->k, OH = l->h, OW = l->w;
  if (dp__poolx_takes(l)) { /* the same elements */
    dp__poolx_forward(l, n, x, y);
    return;
  }
#if CONV_X86
  if (maxpool22(l)) {
    maxpool22_fwd(l, n, x, y);
    return;
  }
#endif
  if (l->kind == DP_LAYER_MAXPOOL2D && l->pad) {
    maxpool_pad(l, n, x, NULL, y, NULL);
    return;
  }
  if (l->kind == DP_LAYER_MAXPOOL2D) {
    if (K == 2)
      maxpool_fwd_k(l, n, x, y, 2);
    else if (K == 3)
      maxpool_fwd_k(l, n, x, y, 3);
    else
      maxpool_fwd_k(l, n, x, y, K);
    return;
  }
  /* the real cells from +0 in (ky, kx) order (padding adds zeros: nothing) */
  for (size_t sc = 0; sc < (size_t)n * C; sc++) {
    const float *xc = x + sc * H * W;
    float *yc = y + sc * OH * OW;
    for (int oy = 0; oy < OH; oy++)
      for (int ox = 0; ox < OW; ox++) {
        int y0, y1, x0, x1;
        window_cells(l, oy, ox, &y0, &y1, &x0, &x1);
        float sum = 0.0f;
        for (int iy = y0; iy < y1; iy++)
          for (int ix = x0; ix < x1; ix++) sum += xc[(size_t)iy * W + ix];
        yc[oy * OW + ox] = sum / avg_divisor(l, y0, y1, x0, x1);
      }
  }
}

/* maxpool2d's backward; masked: then the relu's before it, in place */
static void maxpool_backward(const dp_layer *l, int n, const float *x, const float *dy,
                             float *dx, bool masked) {
  if (dp__poolx_takes(l)) { /* the same bits; the mask in its stores */
    dp__poolx_backward(l, n, x, dy, dx, masked);
    return;
  }
  bool done = false;
  if (l->pad) {
    maxpool_pad(l, n, x, dy, NULL, dx);
    done = true;
  }
#if CONV_X86
  if (!done && maxpool22(l)) {
    maxpool22_bwd(l, n, x, dy, dx);
    done = true;
  }
#endif
  if (!done && l->k == 2)
    maxpool_bwd_k(l, n, x, dy, dx, 2);
  else if (!done && l->k == 3)
    maxpool_bwd_k(l, n, x, dy, dx, 3);
  else if (!done)
    maxpool_bwd_k(l, n, x, dy, dx, l->k);
  if (masked) dp__relu_mask(x, dx, (size_t)n * l->in);
}

void dp__pool_backward(const dp_layer *l, int n, const float *x, const float *dy, float *dx,
                       bool masked) {
  int C = l->ic, H = l->ih, W = l->iw, OH = l->h, OW = l->w;
  if (l->kind == DP_LAYER_MAXPOOL2D) {
    maxpool_backward(l, n, x, dy, dx, masked);
    return;
  }
  memset(dx, 0, (size_t)n * C * H * W * 4);
  for (size_t sc = 0; sc < (size_t)n * C; sc++) {
    const float *dyc = dy + sc * OH * OW;
    float *dxc = dx + sc * H * W;
    for (int oy = 0; oy < OH; oy++)
      for (int ox = 0; ox < OW; ox++) {
        int y0, y1, x0, x1;
        window_cells(l, oy, ox, &y0, &y1, &x0, &x1);
        float share = dyc[oy * OW + ox] / avg_divisor(l, y0, y1, x0, x1);
        for (int iy = y0; iy < y1; iy++)
          for (int ix = x0; ix < x1; ix++) {
            size_t at = (size_t)iy * W + ix;
            dxc[at] = add_acc(dxc[at], share);
          }
      }
  }
}
