/* conv2d 3 x 3 stride 1 padding 1 and maxpool2d 2 stride 2 with AVX-512,
 * without im2col: see conv_fast.h for what they take and why their bits are
 * conv.c's. docs/PERFORMANCE.md (session 17) has the measurements.
 *
 * Planes (the layer's default): a plane of P = H W floats (NCHW) is cut into
 * VP = ceil(P / 16) vectors of 16 positions. With stride 1 and padding 1 the
 * tap (ky, kx) of positions q .. q + 15 reads x at q + (ky - 1) W + (kx - 1):
 * one masked load (mk: the lanes whose input is inside; a masked-off lane
 * reads nothing and gives +0, what im2col writes for a padding tap). So
 *   forward  y (n, OUT, P): tiles of 8 output channels x 3 vectors, the chain
 *            over (c, ky, kx) of fma(x tap, w, acc), then + bias, stored in
 *            NCHW directly (no COL, no transpose);
 *   dx       (n, C, P): tiles of up to 8 input channels x 3 vectors; per tap
 *            (ky, kx) in descending order (= the positions that read an
 *            element, ascending: col2im's order) the chain over o of
 *            fma(dy tap, w, acc), added into dx on the lanes where the tap
 *            exists (a masked add, the old sum first).
 * Images in the lanes (small planes, lanes_pay): x, y, dy and dx transposed
 * so that a vector holds one position of 16 images; a position's taps are
 * then the same in every lane, and those that read padding are skipped.
 * Weight gradient (always): output channels in the lanes, one chain per
 * (o, c, tap) over (image, position) ascending, from dY^T (P, OUT) per image
 * and x itself; per position only the taps inside (position classes: first,
 * middle and last row and column), in blocks of images whose dY^T stays in L1
 * (partial sums reloaded: the same chain); db's chain rides along.
 * Skipping a padding tap (an fma with +0) is exact but for zeros' signs and
 * NaNs: see dw_tile and fwd_lanes for how each keeps im2col's bits.
 *
 * The pools treat the micro-batch as rows: with even H, each pair of input
 * rows is one row of windows, so 16 windows are 64 contiguous floats when an
 * output row is 1, 2 or 4 floats (conv.c's loops take rows of 8 windows or
 * more 8 at a time, and narrower ones 4 or 1 at a time). */
#include "cpu/conv_fast.h"
#include "cpu/gemm.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define CX 1
#include "cpu/avx512.h"
#include <immintrin.h>
#define TGT512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#define INL512 TGT512 static inline __attribute__((always_inline))
#else
#define CX 0
#endif

#define VP_MAX 256  /* plane vectors: planes of up to 4096 floats */
#define MO 8        /* output channels of a forward tile */
#define CX_MAX_C 64 /* input channels (a forward tile's weights: 18 KiB of stack) */

static size_t up64(size_t bytes) { return (bytes + 63) / 64 * 64; }

bool dp__convx_off;

bool dp__convx_takes(const dp_layer *l) {
#if CX
  return !dp__convx_off && l->kind == DP_LAYER_CONV2D && l->k == 3 && l->stride == 1 &&
         l->pad == 1 && l->h == l->ih && l->w == l->iw && l->c % 16 == 0 && l->ic > 0 &&
         l->ic <= CX_MAX_C && (size_t)l->ih * (size_t)l->iw <= 16 * VP_MAX &&
         dp__simd_avx512();
#else
  (void)l;
  return false;
#endif
}

bool dp__poolx_takes(const dp_layer *l) {
#if CX
  int ow = l->w;
  return !dp__convx_off && l->kind == DP_LAYER_MAXPOOL2D && l->k == 2 && l->stride == 2 &&
         l->pad == 0 && l->ih % 2 == 0 && l->iw % 2 == 0 && l->h == l->ih / 2 &&
         l->w == l->iw / 2 && (ow == 1 || ow == 2 || ow == 4) && dp__simd_avx512();
#else
  (void)l;
  return false;
#endif
}

static size_t ckk_out(const dp_layer *l) { return (size_t)l->ic * 9 * (size_t)l->c; }

/* dY^T; then, when there is room, the partial sums of dW (dp__convx_backward) */
size_t dp__convx_bwd_bytes(const dp_layer *l, int n) {
  return up64((size_t)n * l->ih * l->iw * l->c * 4);
}

#if CX
typedef struct {
  int C, H, W, VP, OUT;
  size_t P, cin, cout, ckk; /* plane; floats per image of x and of y; taps */
  /* mk[9 v + t] (masks_of, for the plane kernels): the lanes of plane vector
   * v whose tap t = 3 ky + kx reads inside the image (lanes past P: none) */
  uint16_t mk[9 * VP_MAX];
} cshape;

static void shape_of(const dp_layer *l, cshape *s) {
  s->C = l->ic, s->H = l->ih, s->W = l->iw, s->OUT = l->c;
  s->P = (size_t)s->H * s->W;
  s->VP = (int)((s->P + 15) / 16);
  s->cin = (size_t)s->C * s->P, s->cout = (size_t)s->OUT * s->P, s->ckk = (size_t)s->C * 9;
}

/* mk, for the plane kernels */
static void masks_of(cshape *s) {
  memset(s->mk, 0, sizeof s->mk[0] * 9 * (size_t)s->VP);
  int oy = 0, ox = 0;
  for (size_t q = 0; q < s->P; q++) {
    for (int t = 0; t < 9; t++) {
      int iy = oy + t / 3 - 1, ix = ox + t % 3 - 1;
      if (iy >= 0 && iy < s->H && ix >= 0 && ix < s->W)
        s->mk[9 * (q / 16) + t] |= (uint16_t)(1u << (q % 16));
    }
    if (++ox == s->W) ox = 0, oy++;
  }
}

INL512 void store16(float *p, __mmask16 m, __m512 v) {
  if (m == 0xffff)
    _mm512_storeu_ps(p, v);
  else
    _mm512_mask_storeu_ps(p, m, v);
}

/* acc + a b with the GEMM kernel's operand roles (gemm.c: vfmadd231ps, acc,
 * then the element of op(A), then the one of op(B), b a broadcast made once
 * for the tile's row): which NaN comes out when NaNs meet depends on them, so
 * they are pinned in asm. */
INL512 __m512 fma_ab(__m512 acc, __m512 a, __m512 b) {
  __asm__("vfmadd231ps %[b], %[a], %[c]" : [c] "+v"(acc) : [a] "v"(a), [b] "v"(b));
  return acc;
}

/* fma_ab with b broadcast from memory by the fma itself: for a row of one
 * vector, where a broadcast made first would cost a uop more */
INL512 __m512 fma_abm(__m512 acc, __m512 a, const float *b) {
  __asm__("vfmadd231ps %[b]%{1to16%}, %[a], %[c]"
          : [c] "+v"(acc)
          : [a] "v"(a), [b] "m"(*b));
  return acc;
}

/* acc[j] = fma_ab(acc[j], a[j], *b) for j < N: one broadcast for them all */
INL512 void fma_row(__m512 *acc, const __m512 *a, const float *b, const int N) {
  if (N == 1) {
    acc[0] = fma_abm(acc[0], a[0], b);
    return;
  }
  __m512 bb = _mm512_set1_ps(*b);
#pragma GCC unroll 3
  for (int j = 0; j < N; j++) acc[j] = fma_ab(acc[j], a[j], bb);
}

/* The relu's forward: <= 0 gives +0, a NaN passes (backend.c's relu_forward,
 * the GEMM's epilogue); on dy, its backward where v is its output. */
INL512 __m512 relu16(__m512 v) {
  __mmask16 le = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LE_OQ);
  return _mm512_mask_mov_ps(v, le, _mm512_setzero_ps());
}
INL512 __m512 relu_bwd16(__m512 y, __m512 dy) {
  __mmask16 le = _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_LE_OQ);
  return _mm512_mask_mov_ps(dy, le, _mm512_setzero_ps());
}

/* acc + bias, the GEMM's epilogue (vaddps: acc's NaN first) */
INL512 __m512 add_bias(__m512 acc, __m512 bias) {
  __asm__("vaddps %[b], %[c], %[c]" : [c] "+v"(acc) : [b] "v"(bias));
  return acc;
}

/* e + d on the lanes of m (e elsewhere), e's NaN first as col2im's add_acc:
 * asm, so that the compiler cannot commute the operands. */
INL512 __m512 add_on(__m512 e, __mmask16 m, __m512 d) {
  __asm__("vaddps %[d], %[e], %[e]%{%[m]%}" : [e] "+v"(e) : [d] "v"(d), [m] "Yk"(m));
  return e;
}

/* The vectors g0 .. g0 + NV - 1 of the micro-batch's planes: image g / VP,
 * plane vector g % VP. */
typedef struct {
  const float *in[3]; /* x (forward) or dy (dx) at the vector */
  float *out[3];      /* y or dx at the vector */
  const uint16_t *mk[3];
  __mmask16 st[3]; /* the lanes inside the plane */
} vecs;

static inline void vecs_of(const cshape *s, int g0, int NV, const float *in, size_t in_img,
                           float *out, size_t out_img, vecs *v) {
#pragma GCC unroll 3
  for (int j = 0; j < NV; j++) {
    size_t im = (size_t)(g0 + j) / (size_t)s->VP, pv = (size_t)(g0 + j) % (size_t)s->VP;
    v->in[j] = in + im * in_img + 16 * pv;
    v->out[j] = out + im * out_img + 16 * pv;
    v->mk[j] = s->mk + 9 * pv;
    v->st[j] = dp__lanes16(s->P - 16 * pv);
  }
}

/* ---- forward ------------------------------------------------------------- */

/* y of output channels o0 .. o0 + MT - 1 on NV vectors: wt their weights
 * (C 9, MT), bias at o0 (or NULL), y at channel o0. */
INL512 void fwd_tile(const cshape *s, const float *wt, const float *bias, bool relu, int g0,
                     const int MT, const int NV, const float *x, float *y) {
  vecs v;
  vecs_of(s, g0, NV, x, s->cin, y, s->cout, &v);
  __m512 acc[16][3];
#pragma GCC unroll 16
  for (int i = 0; i < MT; i++)
#pragma GCC unroll 3
    for (int j = 0; j < NV; j++) acc[i][j] = _mm512_setzero_ps();
  const ptrdiff_t W = s->W;
  const float *w = wt;
  for (int c = 0; c < s->C; c++, w += 9 * MT) {
    ptrdiff_t cp = (ptrdiff_t)((size_t)c * s->P);
#pragma GCC unroll 9
    for (int t = 0; t < 9; t++) {
      ptrdiff_t off = cp + (t / 3 - 1) * W + (t % 3 - 1);
      __m512 b[3];
#pragma GCC unroll 3
      for (int j = 0; j < NV; j++) b[j] = _mm512_maskz_loadu_ps(v.mk[j][t], v.in[j] + off);
      const float *wr = w + t * MT;
#pragma GCC unroll 16
      for (int i = 0; i < MT; i++) /* COL's element, then W^T's */
        fma_row(acc[i], b, wr + i, NV);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MT; i++) {
    __m512 bb = bias ? _mm512_set1_ps(bias[i]) : _mm512_setzero_ps();
#pragma GCC unroll 3
    for (int j = 0; j < NV; j++) { /* the GEMM's epilogue: acc + bias once, relu */
      __m512 r = bias ? add_bias(acc[i][j], bb) : acc[i][j];
      store16(v.out[j] + (size_t)i * s->P, v.st[j], relu ? relu16(r) : r);
    }
  }
}

#define FWD_TILE(MT, NV)                                                                   \
  TGT512 static void fwd_tile_##MT##_##NV(const cshape *s, const float *wt,                \
                                          const float *b, bool relu, int g0,               \
                                          const float *x, float *y) {                      \
    fwd_tile(s, wt, b, relu, g0, MT, NV, x, y);                                            \
  }
FWD_TILE(8, 3)
FWD_TILE(8, 2)
FWD_TILE(8, 1)
FWD_TILE(16, 1)

/* ---- input gradient ------------------------------------------------------ */

/* dx of input channels c0 .. c0 + MC - 1 on NV vectors (w and dx at channel
 * c0). Tap t of input q is the output position q - (t / 3 - 1) W - (t % 3 - 1),
 * there when the forward's tap 8 - t of q is inside: the same masks. */
INL512 void dx_tile(const cshape *s, const float *w, int g0, const int MC, const int NV,
                    const float *dy, float *dx) {
  vecs v;
  vecs_of(s, g0, NV, dy, s->cout, dx, s->cin, &v);
  const ptrdiff_t W = s->W;
  for (int t = 8; t >= 0; t--) { /* positions ascending */
    ptrdiff_t off = (1 - t / 3) * W + (1 - t % 3);
    __mmask16 m[3];
    const float *d[3];
#pragma GCC unroll 3
    for (int j = 0; j < NV; j++) m[j] = v.mk[j][8 - t], d[j] = v.in[j] + off;
    __m512 acc[8][3];
#pragma GCC unroll 8
    for (int i = 0; i < MC; i++)
#pragma GCC unroll 3
      for (int j = 0; j < NV; j++) acc[i][j] = _mm512_setzero_ps();
    const float *wp = w + t; /* W (OUT, C, 3, 3): w[o][c0 + i][t] */
    for (int o = 0; o < s->OUT; o++, wp += s->ckk) {
      __m512 b[3];
#pragma GCC unroll 3
      for (int j = 0; j < NV; j++)
        b[j] = _mm512_maskz_loadu_ps(m[j], d[j] + (size_t)o * s->P);
#pragma GCC unroll 8
      for (int i = 0; i < MC; i++) /* dY^T's element, then W's */
        fma_row(acc[i], b, wp + 9 * i, NV);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MC; i++)
#pragma GCC unroll 3
      for (int j = 0; j < NV; j++) {
        float *e = v.out[j] + (size_t)i * s->P;
        /* the first tap starts col2im's sum: +0, then + d where the tap is */
        __m512 old = t == 8 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(v.st[j], e);
        store16(e, v.st[j], add_on(old, m[j], acc[i][j]));
      }
  }
}

#define DX_TILE(MC, NV)                                                                    \
  TGT512 static void dx_tile_##MC##_##NV(const cshape *s, const float *w, int g0,          \
                                         const float *dy, float *dx) {                     \
    dx_tile(s, w, g0, MC, NV, dy, dx);                                                     \
  }
DX_TILE(8, 3)
DX_TILE(8, 2)
DX_TILE(8, 1)
DX_TILE(4, 3)
DX_TILE(4, 2)
DX_TILE(4, 1)
DX_TILE(1, 3)
DX_TILE(1, 2)
DX_TILE(1, 1)

typedef void (*dx_fn)(const cshape *, const float *, int, const float *, float *);

static void conv_dx(const cshape *s, int n, const float *w, const float *dy, float *dx) {
  static const dx_fn fn[3][3] = {{dx_tile_8_1, dx_tile_8_2, dx_tile_8_3},
                                 {dx_tile_4_1, dx_tile_4_2, dx_tile_4_3},
                                 {dx_tile_1_1, dx_tile_1_2, dx_tile_1_3}};
  int G = n * s->VP;
  for (int g0 = 0; g0 < G; g0 += 3) {
    int nv = G - g0 < 3 ? G - g0 : 3;
    for (int c0 = 0; c0 < s->C;) { /* 8, then 4, then 1 channels at a time */
      int r = s->C - c0, k = r >= 8 ? 0 : r >= 4 ? 1 : 2, mc = k == 0 ? 8 : k == 1 ? 4 : 1;
      fn[k][nv - 1](s, w + (size_t)c0 * 9, g0, dy, dx + (size_t)c0 * s->P);
      c0 += mc;
    }
  }
}

/* ---- weight gradient ----------------------------------------------------- */

/* dY^T (P, OUT) per image from dy (OUT, P); false when an element of dy is a
 * NaN or an infinity (moves: the bits are dy's) */
TGT512 static bool dyt_of(const cshape *s, int n, const float *dy, float *g) {
  __mmask16 bad = 0;
  for (int im = 0; im < n; im++) {
    const float *src = dy + (size_t)im * s->cout;
    float *dst = g + (size_t)im * s->cout;
    for (size_t p0 = 0; p0 < s->P; p0 += 16) {
      __mmask16 m = dp__lanes16(s->P - p0);
      size_t rows = s->P - p0 < 16 ? s->P - p0 : 16;
      for (int o0 = 0; o0 < s->OUT; o0 += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
          r[i] = _mm512_maskz_loadu_ps(m, src + (size_t)(o0 + i) * s->P + p0);
          bad |= _mm512_fpclass_ps_mask(r[i], 0x99); /* NaNs, infinities */
        }
        dp__transpose16(r);
        for (size_t j = 0; j < rows; j++)
          _mm512_storeu_ps(dst + (p0 + j) * (size_t)s->OUT + o0, r[j]);
      }
    }
  }
  return bad == 0;
}

/* The chains of dW skip the taps that read padding. An fma with +0 and a
 * finite dy changes the sum only when it is -0 (to +0), so, dy finite, a
 * chain that does not end at -0 has the im2col chain's bits; one that does
 * (an fma's product underflowed to -0 at least) is summed again the im2col
 * way by dw_redo. db's chain (dy's column sums, the old operand order) rides
 * along with channel 0's tiles. */

/* One position's step: the dY^T row gi (b) times the taps ky in [KY0, KY1],
 * kx in [KX0, KX1] of rows r[0..2] around ox (rows oy - 1 .. oy + 1). */
INL512 void dw_pos(__m512 acc[9][2], __m512 dba[2], const float *const r[3],
                   const float *gi, int ox, const int NO, const int DB, const int KY0,
                   const int KY1, const int KX0, const int KX1) {
  __m512 b[2];
#pragma GCC unroll 2
  for (int j = 0; j < NO; j++) b[j] = _mm512_loadu_ps(gi + 16 * j);
#pragma GCC unroll 9
  for (int t = 0; t < 9; t++) {
    int ky = t / 3, kx = t % 3;
    if (ky < KY0 || ky > KY1 || kx < KX0 || kx > KX1) continue;
    fma_row(acc[t], b, r[ky] + ox + kx - 1, NO); /* dY^T's element, then COL's */
  }
#pragma GCC unroll 2
  for (int j = 0; j < NO; j++)
    if (DB) dba[j] = add_bias(dba[j], b[j]); /* colsum: db + row */
}

/* One output row: its first, middle and last positions (W == 1: one). */
INL512 void dw_row(__m512 acc[9][2], __m512 dba[2], const float *const r[3],
                   const float *gi, int W, size_t OUT, const int NO, const int DB,
                   const int KY0, const int KY1) {
  if (W == 1) {
    dw_pos(acc, dba, r, gi, 0, NO, DB, KY0, KY1, 1, 1);
    return;
  }
  dw_pos(acc, dba, r, gi, 0, NO, DB, KY0, KY1, 1, 2);
  for (int ox = 1; ox < W - 1; ox++)
    dw_pos(acc, dba, r, gi + ox * OUT, ox, NO, DB, KY0, KY1, 0, 2);
  dw_pos(acc, dba, r, gi + (W - 1) * OUT, W - 1, NO, DB, KY0, KY1, 0, 1);
}

typedef struct {
  const cshape *s;
  int n;
  const float *x, *g; /* x (n, C, P), dY^T (n P, OUT) */
} dw_ctx;

/* dW (o, c, t) summed again with the padding taps, as im2col's GEMM does */
static float dw_redo(const dw_ctx *d, int o, int c, int t) {
  const cshape *s = d->s;
  float acc = 0.0f;
  for (int im = 0; im < d->n; im++)
    for (int oy = 0; oy < s->H; oy++)
      for (int ox = 0; ox < s->W; ox++) {
        int iy = oy + t / 3 - 1, ix = ox + t % 3 - 1;
        bool in = iy >= 0 && iy < s->H && ix >= 0 && ix < s->W;
        float col = in ? d->x[im * s->cin + c * s->P + (size_t)iy * s->W + ix] : 0.0f;
        size_t k = (size_t)im * s->P + (size_t)oy * s->W + ox;
        acc = fmaf(d->g[k * s->OUT + o], col, acc);
      }
  return acc;
}

/* The tile of channel c, output channels o0 .. o0 + 16 NO - 1, images [s0, s1):
 * from +0 (first) or the partial sums in part ((C 9, OUT) at (c 9, o0)) and,
 * with DB, db (at o0); to part, or, after the last images, to dw (at o0, c 9). */
INL512 void dw_tile(const dw_ctx *d, int c, int o0, int s0, int s1, const int NO,
                    const int DB, float *part, bool first, float *dw, float *db) {
  const cshape *s = d->s;
  const size_t OUT = (size_t)s->OUT, W = (size_t)s->W;
  __m512 acc[9][2], dba[2];
#pragma GCC unroll 9
  for (int t = 0; t < 9; t++)
#pragma GCC unroll 2
    for (int j = 0; j < NO; j++)
      acc[t][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(part + t * OUT + 16 * j);
#pragma GCC unroll 2
  for (int j = 0; j < NO; j++)
    dba[j] = first || !DB ? _mm512_setzero_ps() : _mm512_loadu_ps(db + 16 * j);
  for (int im = s0; im < s1; im++) {
    const float *xi = d->x + (size_t)im * s->cin + (size_t)c * s->P;
    const float *gi = d->g + (size_t)im * s->P * OUT + o0;
    for (int oy = 0; oy < s->H; oy++, gi += W * OUT) {
      const float *r[3] = {xi + ((ptrdiff_t)oy - 1) * (ptrdiff_t)W, xi + oy * W,
                           xi + (oy + 1) * W};
      if (s->H == 1)
        dw_row(acc, dba, r, gi, s->W, OUT, NO, DB, 1, 1);
      else if (oy == 0)
        dw_row(acc, dba, r, gi, s->W, OUT, NO, DB, 1, 2);
      else if (oy < s->H - 1)
        dw_row(acc, dba, r, gi, s->W, OUT, NO, DB, 0, 2);
      else
        dw_row(acc, dba, r, gi, s->W, OUT, NO, DB, 0, 1);
    }
  }
#pragma GCC unroll 2
  for (int j = 0; j < NO; j++)
    if (DB) _mm512_storeu_ps(db + 16 * j, dba[j]);
  if (!dw) {
#pragma GCC unroll 9
    for (int t = 0; t < 9; t++)
#pragma GCC unroll 2
      for (int j = 0; j < NO; j++) _mm512_storeu_ps(part + t * OUT + 16 * j, acc[t][j]);
    return;
  }
  float tmp[9][32]; /* lanes are output channels: dw's column of each tap */
  __mmask16 neg0 = 0;
#pragma GCC unroll 9
  for (int t = 0; t < 9; t++)
#pragma GCC unroll 2
    for (int j = 0; j < NO; j++) {
      _mm512_storeu_ps(tmp[t] + 16 * j, acc[t][j]);
      neg0 |= _mm512_cmpeq_epi32_mask(_mm512_castps_si512(acc[t][j]),
                                      _mm512_set1_epi32((int)0x80000000u));
    }
  for (int o = 0; o < 16 * NO; o++)
    for (int t = 0; t < 9; t++) {
      float v = tmp[t][o];
      uint32_t bits;
      memcpy(&bits, &v, 4);
      if (neg0 && bits == 0x80000000u) v = dw_redo(d, o0 + o, c, t);
      dw[(size_t)o * s->ckk + t] = v;
    }
}

#define DW_TILE(NO, DB)                                                                    \
  TGT512 static void dw_tile_##NO##_##DB(const dw_ctx *d, int c, int o0, int s0, int s1,   \
                                         float *part, bool first, float *dw, float *db) {  \
    dw_tile(d, c, o0, s0, s1, NO, DB, part, first, dw, db);                                \
  }
DW_TILE(2, 0)
DW_TILE(2, 1)
DW_TILE(1, 0)
DW_TILE(1, 1)

/* dW (and db) in blocks of images whose dY^T stays in L1 when part (room for
 * the partial sums, (C 9, OUT)) is there, else in one block. */
static void conv_dw(const dw_ctx *d, float *part, float *dw, float *db) {
  typedef void (*fn)(const dw_ctx *, int, int, int, int, float *, bool, float *, float *);
  static const fn tile[2][2] = {{dw_tile_1_0, dw_tile_1_1}, {dw_tile_2_0, dw_tile_2_1}};
  const cshape *s = d->s;
  int n = d->n;
  size_t img = s->P * s->OUT * 4; /* dY^T of one image */
  int kb = !part ? n : img >= ((size_t)16 << 10) ? 1 : (int)(((size_t)16 << 10) / img);
  for (int s0 = 0; s0 < n; s0 += kb) {
    int s1 = n - s0 < kb ? n : s0 + kb;
    for (int c = 0; c < s->C; c++)
      for (int o0 = 0; o0 < s->OUT; o0 += 32) {
        float *pc = part ? part + (size_t)c * 9 * s->OUT + o0 : NULL;
        float *dwc = s1 == n ? dw + (size_t)o0 * s->ckk + (size_t)c * 9 : NULL;
        int two = s->OUT - o0 >= 32, with_db = c == 0 && db;
        tile[two][with_db](d, c, o0, s0, s1, pc, s0 == 0, dwc, with_db ? db + o0 : NULL);
      }
  }
}

/* ---- images in the lanes ------------------------------------------------- */

/* For small planes (4 x 4: 44 of 144 taps read padding) the forward and dx
 * also run with 16 images in the lanes of a vector: x, y, dy and dx
 * transposed to (C P, ld) (ld = n rounded up to 16; the extra lanes are
 * zero, their results dropped), where a position's taps are the same for all
 * lanes, so those that read padding are skipped. dx's sums then have no
 * padding terms anyway (col2im drops them); the forward's chains do, and,
 * as with dW, skipping them is exact unless a chain ends at -0 (summed again
 * the im2col way) or a weight is a NaN or an infinity (the plane path runs
 * then). */

/* dst (cols, ld) = src (rows, cols)^T (row stride lds), rows <= ld; dst's
 * columns rows .. ld - 1 zero */
TGT512 static void to_lanes(const float *src, size_t rows, size_t cols, size_t lds,
                            float *dst, size_t ld) {
  for (size_t r0 = 0; r0 < ld; r0 += 16)
    for (size_t c0 = 0; c0 < cols; c0 += 16) {
      __mmask16 cm = dp__lanes16(cols - c0);
      __m512 r[16];
#pragma GCC unroll 16
      for (size_t i = 0; i < 16; i++)
        r[i] = r0 + i < rows ? _mm512_maskz_loadu_ps(cm, src + (r0 + i) * lds + c0)
                             : _mm512_setzero_ps();
      dp__transpose16(r);
      for (size_t j = 0; j < 16 && c0 + j < cols; j++)
        _mm512_storeu_ps(dst + (c0 + j) * ld + r0, r[j]);
    }
}

/* dst (rows, cols) (row stride ldd) = the first rows columns of src (cols, ld),
 * relu applied where asked (moves otherwise) */
TGT512 static void from_lanes(const float *src, size_t rows, size_t cols, size_t ld,
                              float *dst, size_t ldd, bool relu) {
  for (size_t r0 = 0; r0 < rows; r0 += 16)
    for (size_t c0 = 0; c0 < cols; c0 += 16) {
      __mmask16 cm = dp__lanes16(cols - c0);
      __m512 r[16];
#pragma GCC unroll 16
      for (size_t j = 0; j < 16; j++)
        r[j] =
            c0 + j < cols ? _mm512_loadu_ps(src + (c0 + j) * ld + r0) : _mm512_setzero_ps();
      dp__transpose16(r);
      for (size_t i = 0; i < 16 && r0 + i < rows; i++)
        store16(dst + (r0 + i) * ldd + c0, cm, relu ? relu16(r[i]) : r[i]);
    }
}

static size_t lanes_of(int n) { return ((size_t)n + 15) / 16 * 16; }

/* Whether a layer runs with images in the lanes: small planes, where many
 * taps read padding, and enough channels that the transposes pay. */
static bool lanes_pay(const cshape *s) { return s->P <= 16 && s->C >= 4; }

/* The taps of position (oy, ox) that read inside: ky in [*ky0, *ky1], ... */
static void taps_of(const cshape *s, int oy, int ox, int k[4]) {
  k[0] = oy == 0 ? 1 : 0, k[1] = oy == s->H - 1 ? 1 : 2;
  k[2] = ox == 0 ? 1 : 0, k[3] = ox == s->W - 1 ? 1 : 2;
}

/* The forward's chain of output (o, image, position p) with the padding taps
 * as fmas with +0, im2col's way (before the bias) */
static float fwd_redo(const cshape *s, const float *x, const float *w, int o, size_t im,
                      int p) {
  float acc = 0.0f;
  int oy = p / s->W, ox = p % s->W;
  for (int c = 0; c < s->C; c++)
    for (int t = 0; t < 9; t++) {
      int iy = oy + t / 3 - 1, ix = ox + t % 3 - 1;
      bool in = iy >= 0 && iy < s->H && ix >= 0 && ix < s->W;
      float col = in ? x[im * s->cin + c * s->P + (size_t)iy * s->W + ix] : 0.0f;
      acc = fmaf(col, w[(size_t)o * s->ckk + (size_t)c * 9 + t], acc);
    }
  return acc;
}

typedef struct {
  const cshape *s;
  size_t n, ld;            /* images, lanes */
  const float *x, *w, *xt; /* x as given (for fwd_redo), W, x in the lanes */
} lanes_ctx;

/* A position's taps that read inside, in chain order: the x^T row (times ld)
 * and the packed weights' offset of each */
typedef struct {
  int n;
  size_t row[CX_MAX_C * 9];
  int wo[CX_MAX_C * 9];
} tap_list;

static void taps_list(const cshape *s, int p, size_t ld, tap_list *t) {
  int k[4], oy = p / s->W, ox = p % s->W;
  taps_of(s, oy, ox, k);
  t->n = 0;
  for (int c = 0; c < s->C; c++)
    for (int ky = k[0]; ky <= k[1]; ky++)
      for (int kx = k[2]; kx <= k[3]; kx++, t->n++) {
        t->row[t->n] =
            ((size_t)c * s->P + (size_t)(oy + ky - 1) * s->W + (size_t)(ox + kx - 1)) * ld;
        t->wo[t->n] = (c * 9 + ky * 3 + kx) * MO;
      }
}

/* Y^T rows (o0 + i) P + p, lanes s0 .. s0 + 16 NV - 1: p's taps tl */
INL512 void fwd_lanes_tile(const lanes_ctx *d, const float *wt, const float *bias, int o0,
                           int p, const tap_list *tl, size_t s0, const int NV, float *yt) {
  const cshape *s = d->s;
  const size_t ld = d->ld;
  __m512 acc[MO][3];
#pragma GCC unroll 8
  for (int i = 0; i < MO; i++)
#pragma GCC unroll 3
    for (int j = 0; j < NV; j++) acc[i][j] = _mm512_setzero_ps();
  const float *xt = d->xt + s0;
  for (int t = 0; t < tl->n; t++) {
    const float *row = xt + tl->row[t], *wr = wt + tl->wo[t];
    __m512 b[3];
#pragma GCC unroll 3
    for (int j = 0; j < NV; j++) b[j] = _mm512_loadu_ps(row + 16 * j);
#pragma GCC unroll 8
    for (int i = 0; i < MO; i++) fma_row(acc[i], b, wr + i, NV);
  }
  const __m512i neg0 = _mm512_set1_epi32((int)0x80000000u);
#pragma GCC unroll 8
  for (int i = 0; i < MO; i++)
#pragma GCC unroll 3
    for (int j = 0; j < NV; j++) {
      float *out = yt + ((size_t)(o0 + i) * s->P + (size_t)p) * ld + s0 + 16 * j;
      __mmask16 m = _mm512_cmpeq_epi32_mask(_mm512_castps_si512(acc[i][j]), neg0);
      if (m) { /* rare: some chain ends at -0 */
        _mm512_storeu_ps(out, acc[i][j]);
        for (size_t l = 0, im = s0 + 16 * (size_t)j; l < 16 && im + l < d->n; l++)
          if (m >> l & 1) out[l] = fwd_redo(s, d->x, d->w, o0 + i, im + l, p);
        acc[i][j] = _mm512_loadu_ps(out);
      }
      _mm512_storeu_ps(out,
                       bias ? add_bias(acc[i][j], _mm512_set1_ps(bias[i])) : acc[i][j]);
    }
}

#define FWD_LANES(NV)                                                                      \
  TGT512 static void fwd_lanes_##NV(const lanes_ctx *d, const float *wt,                   \
                                    const float *bias, int o0, int p, const tap_list *tl,  \
                                    size_t s0, float *yt) {                                \
    fwd_lanes_tile(d, wt, bias, o0, p, tl, s0, NV, yt);                                    \
  }
FWD_LANES(3)
FWD_LANES(2)
FWD_LANES(1)

/* The forward's workspace with images in the lanes: x^T, y^T, W^T */
static size_t fwd_lanes_bytes(const cshape *s, int n) {
  return lanes_of(n) * s->P * ((size_t)s->C + (size_t)s->OUT) * 4 + s->ckk * s->OUT * 4;
}

TGT512 static bool all_finite(const float *p, size_t n) {
  __mmask16 bad = 0;
  for (size_t i = 0; i < n; i += 16)
    bad |= _mm512_fpclass_ps_mask(_mm512_maskz_loadu_ps(dp__lanes16(n - i), p + i), 0x99);
  return bad == 0;
}

static bool fwd_lanes(const cshape *s, const dp_layer *l, int n, const float *x,
                      const float *w, float *y, bool relu, void *ws, size_t ws_bytes) {
  if (!lanes_pay(s) || ws_bytes < fwd_lanes_bytes(s, n) || !all_finite(w, l->n_params))
    return false;
  size_t ld = lanes_of(n), tile = s->ckk * MO;
  float *xt = ws, *yt = xt + ld * s->cin, *wt = yt + ld * s->cout;
  to_lanes(x, (size_t)n, s->cin, s->cin, xt, ld);
  for (int o0 = 0; o0 < s->OUT; o0 += MO) /* W^T in tiles of 8 outputs: (C 9, 8) each */
    dp__conv_transpose(w + (size_t)o0 * s->ckk, MO, s->ckk, s->ckk, wt + o0 / MO * tile,
                       MO);
  lanes_ctx d = {s, (size_t)n, ld, x, w, xt};
  const float *bias = l->bias ? w + s->ckk * (size_t)s->OUT : NULL;
  tap_list tl;
  /* a position's rows of 48 images (27 KiB for 16 channels) stay in L1 over
   * the output tiles */
  for (int p = 0; p < (int)s->P; p++) {
    taps_list(s, p, ld, &tl);
    for (size_t s0 = 0; s0 < ld; s0 += 48)
      for (int o0 = 0; o0 < s->OUT; o0 += MO) {
        const float *bo = bias ? bias + o0 : NULL, *wo = wt + o0 / MO * tile;
        if (ld - s0 >= 48)
          fwd_lanes_3(&d, wo, bo, o0, p, &tl, s0, yt);
        else if (ld - s0 == 32)
          fwd_lanes_2(&d, wo, bo, o0, p, &tl, s0, yt);
        else
          fwd_lanes_1(&d, wo, bo, o0, p, &tl, s0, yt);
      }
  }
  from_lanes(yt, (size_t)n, s->cout, ld, y, s->cout, relu);
  return true;
}

/* dx^T rows (c0 + i) P + q, lanes s0 ..: + the chain over o of position p's
 * tap t (its input is q) */
INL512 void dx_lanes_tile(const cshape *s, const float *dyt, size_t ld, const float *w,
                          int p, size_t q, size_t s0, const int MC, const int NV,
                          float *dxt) {
  __m512 acc[8][3];
#pragma GCC unroll 8
  for (int i = 0; i < MC; i++)
#pragma GCC unroll 3
    for (int j = 0; j < NV; j++) acc[i][j] = _mm512_setzero_ps();
  const float *row = dyt + (size_t)p * ld + s0, *wp = w;
  for (int o = 0; o < s->OUT; o++, row += s->P * ld, wp += s->ckk) {
    __m512 b[3];
#pragma GCC unroll 3
    for (int j = 0; j < NV; j++) b[j] = _mm512_loadu_ps(row + 16 * j);
#pragma GCC unroll 8
    for (int i = 0; i < MC; i++) /* dY^T's element, then W's */
      fma_row(acc[i], b, wp + 9 * i, NV);
  }
#pragma GCC unroll 8
  for (int i = 0; i < MC; i++)
#pragma GCC unroll 3
    for (int j = 0; j < NV; j++) { /* col2im's add, the old sum first */
      float *e = dxt + ((size_t)i * s->P + q) * ld + s0 + 16 * j;
      _mm512_storeu_ps(e, add_on(_mm512_loadu_ps(e), 0xffff, acc[i][j]));
    }
}

#define DX_LANES(MC, NV)                                                                   \
  TGT512 static void dx_lanes_##MC##_##NV(const cshape *s, const float *dyt, size_t ld,    \
                                          const float *w, int p, size_t q, size_t s0,      \
                                          float *dxt) {                                    \
    dx_lanes_tile(s, dyt, ld, w, p, q, s0, MC, NV, dxt);                                   \
  }
DX_LANES(8, 3)
DX_LANES(8, 2)
DX_LANES(8, 1)
DX_LANES(4, 3)
DX_LANES(4, 2)
DX_LANES(4, 1)
DX_LANES(1, 3)
DX_LANES(1, 2)
DX_LANES(1, 1)

static bool dx_lanes(const cshape *s, int n, const float *w, const float *dy, float *dx,
                     void *ws, size_t ws_bytes) {
  typedef void (*fn)(const cshape *, const float *, size_t, const float *, int, size_t,
                     size_t, float *);
  static const fn tile[3][3] = {{dx_lanes_8_1, dx_lanes_8_2, dx_lanes_8_3},
                                {dx_lanes_4_1, dx_lanes_4_2, dx_lanes_4_3},
                                {dx_lanes_1_1, dx_lanes_1_2, dx_lanes_1_3}};
  size_t ld = lanes_of(n);
  if (!lanes_pay(s) || ws_bytes < up64(ld * s->P * ((size_t)s->C + (size_t)s->OUT) * 4))
    return false;
  float *dyt = ws, *dxt = dyt + ld * s->cout;
  to_lanes(dy, (size_t)n, s->cout, s->cout, dyt, ld);
  memset(dxt, 0, ld * s->cin * 4); /* col2im's sums start at +0 */
  for (size_t s0 = 0; s0 < ld; s0 += 48) {
    int nv = ld - s0 >= 48 ? 3 : (int)((ld - s0) / 16);
    for (int p = 0; p < (int)s->P; p++) { /* positions ascending: col2im's order */
      int k[4], oy = p / s->W, ox = p % s->W;
      taps_of(s, oy, ox, k);
      for (int ky = k[0]; ky <= k[1]; ky++)
        for (int kx = k[2]; kx <= k[3]; kx++) {
          size_t q = (size_t)(oy + ky - 1) * s->W + (size_t)(ox + kx - 1);
          for (int c0 = 0; c0 < s->C;) {
            int r = s->C - c0, t = r >= 8 ? 0 : r >= 4 ? 1 : 2;
            tile[t][nv - 1](s, dyt, ld, w + (size_t)c0 * 9 + ky * 3 + kx, p, q, s0,
                            dxt + (size_t)c0 * s->P * ld);
            c0 += t == 0 ? 8 : t == 1 ? 4 : 1;
          }
        }
    }
  }
  from_lanes(dxt, (size_t)n, s->cin, ld, dx, s->cin, false);
  return true;
}

void dp__convx_forward(const dp_layer *l, int n, const float *x, const float *w, float *y,
                       bool relu, void *ws, size_t ws_bytes) {
  cshape s;
  shape_of(l, &s);
  if (fwd_lanes(&s, l, n, x, w, y, relu, ws, ws_bytes)) return;
  masks_of(&s);
  const float *bias = l->bias ? w + s.ckk * (size_t)s.OUT : NULL;
  /* a tile's weights (C 9, MT): a tap's MT adjacent. One input channel: 16
   * outputs a tile, so that each tap's load serves them all */
  float wt[CX_MAX_C * 9 * MO];
  const int MT = s.C == 1 ? 16 : MO;
  int G = n * s.VP;
  for (int o0 = 0; o0 < s.OUT; o0 += MT) {
    dp__conv_transpose(w + (size_t)o0 * s.ckk, (size_t)MT, s.ckk, s.ckk, wt, (size_t)MT);
    const float *bo = bias ? bias + o0 : NULL;
    float *yo = y + (size_t)o0 * s.P;
    for (int g0 = 0; g0 < G; g0 += MT == 16 ? 1 : 3)
      if (MT == 16)
        fwd_tile_16_1(&s, wt, bo, relu, g0, x, yo);
      else if (G - g0 >= 3)
        fwd_tile_8_3(&s, wt, bo, relu, g0, x, yo);
      else if (G - g0 == 2)
        fwd_tile_8_2(&s, wt, bo, relu, g0, x, yo);
      else
        fwd_tile_8_1(&s, wt, bo, relu, g0, x, yo);
  }
}

bool dp__convx_backward(const dp_layer *l, int n, const float *x, const float *w,
                        const float *dy, float *dw, float *db, float *dx, void *ws,
                        size_t ws_bytes) {
  cshape s;
  shape_of(l, &s);
  size_t need = dp__convx_bwd_bytes(l, n);
  float *g = ws; /* dY^T (n P, OUT) */
  float *part =
      ws_bytes >= need + ckk_out(l) * 4 ? (float *)((unsigned char *)ws + need) : NULL;
  if (!dyt_of(&s, n, dy, g)) return false; /* a NaN or infinity: conv.c's path */
  dw_ctx d = {&s, n, x, g};
  conv_dw(&d, part, dw, db);
  if (dx && !dx_lanes(&s, n, w, dy, dx, ws, ws_bytes)) {
    masks_of(&s);
    conv_dx(&s, n, w, dy, dx);
  }
  return true;
}

/* ---- maxpool2d 2 stride 2 ------------------------------------------------ */

/* The taps (0,0) (0,1) (1,0) (1,1) of 16 windows, taken in that order by
 * conv.c's rule (v when v > m, or v is a NaN and m is not: the first largest,
 * the first NaN): the max in *m, in k[j] the lanes whose window took tap j. */
INL512 void sel4(const __m512 t[4], __m512 *m, __mmask16 k[4]) {
  __m512 mm = t[0];
  __m512i ii = _mm512_setzero_si512();
#pragma GCC unroll 3
  for (int j = 1; j < 4; j++) {
    __mmask16 take = _mm512_cmp_ps_mask(t[j], mm, _CMP_GT_OQ) |
                     (_mm512_cmp_ps_mask(t[j], t[j], _CMP_UNORD_Q) &
                      _mm512_cmp_ps_mask(mm, mm, _CMP_ORD_Q));
    mm = _mm512_mask_mov_ps(mm, take, t[j]);
    ii = _mm512_mask_mov_epi32(ii, take, _mm512_set1_epi32(j));
  }
  *m = mm;
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++) k[j] = _mm512_cmpeq_epi32_mask(ii, _mm512_set1_epi32(j));
}

/* sel4 without NaNs: vmaxps (v > m ? v : m, with v first) is the rule then,
 * and the tap taken is the first that equals the max (an earlier equal one
 * would have been kept). */
INL512 void sel4_finite(const __m512 t[4], __m512 *m, __mmask16 k[4], bool taken) {
  __m512 mm = _mm512_max_ps(t[1], t[0]);
  mm = _mm512_max_ps(t[2], mm);
  mm = _mm512_max_ps(t[3], mm);
  *m = mm;
  if (!taken) return;
  __mmask16 seen = 0;
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++) {
    __mmask16 e = _mm512_cmp_ps_mask(t[j], mm, _CMP_EQ_OQ);
    k[j] = e & (__mmask16)~seen;
    seen |= e;
  }
}

/* dy where the window took tap j, +0 elsewhere: 0 + dy, as memset and += gave */
INL512 void spread4(const __mmask16 k[4], __m512 dy, __m512 v[4]) {
  __m512 gz = _mm512_add_ps(_mm512_setzero_ps(), dy); /* one NaN at most: no order */
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++) v[j] = _mm512_maskz_mov_ps(k[j], gz);
}

/* Output rows of OW = 1, 2 or 4 floats (wider rows: conv.c's AVX2 loops, as
 * fast on Zen 4, whose 512-bit shuffles and compares take two 256-bit
 * slots): 16 windows are 64 contiguous
 * floats z0 .. z3 (16 / OW row pairs); tap k of lane L is float
 * (L / OW) 4 OW + (k / 2) 2 OW + 2 (L % OW) + k % 2, in z0, z1 for L < 8 and
 * z2, z3 for L >= 8: ix[k] holds it mod 32, iv[q] the inverse (for float
 * 16 q + l: 16 (k / 2) + 8 (k % 2) + L % 8 in the lanes L < 8 or L >= 8 of
 * the four spread vectors). */
typedef struct {
  __m512i ix[4], iv[4];
} pool_ix;

TGT512 static void pool_ix_of(int OW, pool_ix *p) {
  int32_t a[4][16], b[4][16];
  for (int L = 0; L < 16; L++)
    for (int k = 0; k < 4; k++) {
      int gi = L / OW * 4 * OW + k / 2 * 2 * OW + 2 * (L % OW) + k % 2;
      a[k][L] = gi % 32;
      b[gi / 16][gi % 16] = 16 * (k / 2) + 8 * (k % 2) + L % 8;
    }
  for (int k = 0; k < 4; k++) {
    p->ix[k] = _mm512_loadu_si512(a[k]);
    p->iv[k] = _mm512_loadu_si512(b[k]);
  }
}

/* The taps of 16 windows; whether one of them is a NaN */
INL512 bool taps64(const float *x, __mmask16 mz[4], const pool_ix *p, __m512 t[4]) {
  __m512 z[4];
  __mmask16 nan = 0;
#pragma GCC unroll 4
  for (int q = 0; q < 4; q++) {
    z[q] = _mm512_maskz_loadu_ps(mz[q], x + 16 * q);
    nan |= _mm512_cmp_ps_mask(z[q], z[q], _CMP_UNORD_Q);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; k++)
    t[k] = _mm512_mask_blend_ps(0xff00, _mm512_permutex2var_ps(z[0], p->ix[k], z[1]),
                                _mm512_permutex2var_ps(z[2], p->ix[k], z[3]));
  return nan != 0;
}

/* 16 windows per step over the whole micro-batch (rows of windows follow one
 * another across planes and images); the last step masked. */
INL512 void pool_small_k(int OW, size_t T, const float *x, const float *dy, float *y,
                         float *dx, const int BWD, bool masked) {
  pool_ix p;
  pool_ix_of(OW, &p);
  for (size_t o = 0; o < T; o += 16) {
    size_t r = T - o < 16 ? T - o : 16;
    __mmask16 mz[4], k[4];
    for (int q = 0; q < 4; q++)
      mz[q] = dp__lanes16(4 * r > 16 * (size_t)q ? 4 * r - 16 * q : 0);
    __m512 t[4], m;
    if (taps64(x + 4 * o, mz, &p, t))
      sel4(t, &m, k);
    else
      sel4_finite(t, &m, k, BWD);
    if (!BWD) {
      store16(y + o, dp__lanes16(r), m);
      continue;
    }
    __m512 v[4];
    spread4(k, _mm512_maskz_loadu_ps(dp__lanes16(r), dy + o), v);
    __m512 lo01 = _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(1, 0, 1, 0)),
           lo23 = _mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(1, 0, 1, 0)),
           hi01 = _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(3, 2, 3, 2)),
           hi23 = _mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(3, 2, 3, 2));
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
      __m512 g = _mm512_permutex2var_ps(q < 2 ? lo01 : hi01, p.iv[q], q < 2 ? lo23 : hi23);
      if (masked) /* the relu before it: x is its output */
        g = relu_bwd16(_mm512_maskz_loadu_ps(mz[q], x + 4 * o + 16 * q), g);
      store16(dx + 4 * o + 16 * q, mz[q], g);
    }
  }
}

TGT512 static void pool_small(int OW, size_t T, const float *x, const float *dy, float *y,
                              float *dx, bool masked) {
  if (dy && masked)
    pool_small_k(OW, T, x, dy, NULL, dx, 1, true);
  else if (dy)
    pool_small_k(OW, T, x, dy, NULL, dx, 1, false);
  else
    pool_small_k(OW, T, x, NULL, y, NULL, 0, false);
}

static void pool_run(const dp_layer *l, int n, const float *x, const float *dy, float *y,
                     float *dx, bool masked) {
  pool_small(l->w, (size_t)n * l->ic * l->h * l->w, x, dy, y, dx, masked);
}

void dp__poolx_forward(const dp_layer *l, int n, const float *x, float *y) {
  pool_run(l, n, x, NULL, y, NULL, false);
}

void dp__poolx_backward(const dp_layer *l, int n, const float *x, const float *dy,
                        float *dx, bool masked) {
  pool_run(l, n, x, dy, NULL, dx, masked);
}

#else /* no AVX-512 build: the takes functions are false, nothing below runs */
void dp__convx_forward(const dp_layer *l, int n, const float *x, const float *w, float *y,
                       bool relu, void *ws, size_t ws_bytes) {
  (void)l, (void)n, (void)x, (void)w, (void)y, (void)relu, (void)ws, (void)ws_bytes;
}
bool dp__convx_backward(const dp_layer *l, int n, const float *x, const float *w,
                        const float *dy, float *dw, float *db, float *dx, void *ws,
                        size_t ws_bytes) {
  (void)l, (void)n, (void)x, (void)w, (void)dy, (void)dw, (void)db, (void)dx, (void)ws;
  (void)ws_bytes;
  return false;
}
void dp__poolx_forward(const dp_layer *l, int n, const float *x, float *y) {
  (void)l, (void)n, (void)x, (void)y;
}
void dp__poolx_backward(const dp_layer *l, int n, const float *x, const float *dy,
                        float *dx, bool masked) {
  (void)l, (void)n, (void)x, (void)dy, (void)dx, (void)masked;
}
#endif
