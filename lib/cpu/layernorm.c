/* layernorm on the CPU: the forward and backward of a layernorm layer on n
 * rows of width D (lib/cpu/backend.c calls them; cpu.h has the contract).
 *
 * Each row's sums (its mean, its variance, and the backward's sums of dxh and
 * dxh xh) run over the row's elements in order from +0, one add at a time:
 * a chain whose every add waits for the last, so a row at a time runs at the
 * adder's latency. The AVX-512 tier takes 16 rows at once with the rows in the
 * lanes (16 x 16 transposes of the row blocks): every lane is one row's chain,
 * the same operations in the same order, so the bits are the scalar loop's on
 * every tier. The elementwise parts (the output, the input gradient) and the
 * weight gradients (each element's sum over the rows in row order) run along
 * the rows. ISO C: no contraction, so a product and a sum stay two roundings
 * in both. */
#include "cpu/cpu.h"
#include "cpu/gemm.h"

#include <math.h>
#include <stddef.h>

static void forward_rows(int n, int D, float eps, const float *x, const float *g,
                         const float *b, float *st, float *y) {
  for (int r = 0; r < n; r++) {
    const float *xr = x + (size_t)r * D;
    float *yr = y + (size_t)r * D;
    float sum = 0.0f;
    for (int k = 0; k < D; k++) sum += xr[k];
    float mean = sum / (float)D, var = 0.0f;
    for (int k = 0; k < D; k++) var += (xr[k] - mean) * (xr[k] - mean);
    float rstd = 1.0f / sqrtf(var / (float)D + eps);
    st[2 * r] = mean;
    st[2 * r + 1] = rstd;
    for (int k = 0; k < D; k++) yr[k] = (xr[k] - mean) * rstd * g[k] + b[k];
  }
}

/* Row r's sums s1 (of dxh = dy g) and s2 (of dxh xh), then its input gradient
 * and its terms of the weight gradients (dg, db: + in row order). */
static void backward_row(int r, int D, const float *x, const float *st, const float *g,
                         const float *dy, float *dg, float *db, float *dx) {
  const float *xr = x + (size_t)r * D, *dyr = dy + (size_t)r * D;
  float mean = st[2 * r], rstd = st[2 * r + 1], s1 = 0.0f, s2 = 0.0f;
  for (int k = 0; k < D; k++) {
    float xh = (xr[k] - mean) * rstd, dxh = dyr[k] * g[k];
    dg[k] += dyr[k] * xh;
    db[k] += dyr[k];
    s1 += dxh;
    s2 += dxh * xh;
  }
  if (!dx) return;
  float *dxr = dx + (size_t)r * D;
  for (int k = 0; k < D; k++) {
    float xh = (xr[k] - mean) * rstd;
    dxr[k] = rstd * (dyr[k] * g[k] - s1 / (float)D - xh * s2 / (float)D);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include "cpu/avx512.h"

#include <immintrin.h>
#define TGT512 __attribute__((target("avx512f,avx512vl,avx2,fma")))
#define INL512 TGT512 static inline __attribute__((always_inline))

/* v[kk] = element k0 + kk of rows r0 .. r0 + 15 (lane l: row r0 + l; rows from
 * n on repeat row n - 1, whose lanes nothing keeps). */
INL512 void block16(const float *x, int D, int r0, int n, int k0, __m512 v[16]) {
  __mmask16 km = dp__lanes16(D - k0);
#pragma GCC unroll 16
  for (int l = 0; l < 16; l++)
    v[l] = _mm512_maskz_loadu_ps(km, x + (size_t)(r0 + l < n ? r0 + l : n - 1) * D + k0);
  dp__transpose16(v);
}

/* forward_rows on rows r0 .. min(r0 + 16, n) - 1 */
TGT512 static void forward16(int r0, int n, int D, float eps, const float *x,
                             const float *g, const float *b, float *st, float *y) {
  __m512 sum = _mm512_setzero_ps(), var = _mm512_setzero_ps(), v[16];
  for (int k0 = 0; k0 < D; k0 += 16) {
    block16(x, D, r0, n, k0, v);
    for (int kk = 0; kk < 16 && k0 + kk < D; kk++) sum = _mm512_add_ps(sum, v[kk]);
  }
  const __m512 fD = _mm512_set1_ps((float)D);
  __m512 mean = _mm512_div_ps(sum, fD);
  for (int k0 = 0; k0 < D; k0 += 16) {
    block16(x, D, r0, n, k0, v);
    for (int kk = 0; kk < 16 && k0 + kk < D; kk++) {
      __m512 d = _mm512_sub_ps(v[kk], mean);
      var = _mm512_add_ps(var, _mm512_mul_ps(d, d));
    }
  }
  __m512 rstd = _mm512_div_ps(
      _mm512_set1_ps(1.0f),
      _mm512_sqrt_ps(_mm512_add_ps(_mm512_div_ps(var, fD), _mm512_set1_ps(eps))));
  float mv[16], rv[16];
  _mm512_storeu_ps(mv, mean);
  _mm512_storeu_ps(rv, rstd);
  for (int l = 0; l < 16 && r0 + l < n; l++) {
    int r = r0 + l;
    st[2 * r] = mv[l];
    st[2 * r + 1] = rv[l];
    const float *xr = x + (size_t)r * D;
    float *yr = y + (size_t)r * D;
    __m512 m = _mm512_set1_ps(mv[l]), rs = _mm512_set1_ps(rv[l]);
    for (int k = 0; k < D; k += 16) {
      __mmask16 km = dp__lanes16(D - k);
      __m512 t = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(km, xr + k), m), rs);
      t = _mm512_add_ps(_mm512_mul_ps(t, _mm512_maskz_loadu_ps(km, g + k)),
                        _mm512_maskz_loadu_ps(km, b + k));
      _mm512_mask_storeu_ps(yr + k, km, t);
    }
  }
}

/* backward_row on rows r0 .. min(r0 + 16, n) - 1, in order; their s1 and s2
 * first, with the rows in the lanes */
TGT512 static void backward16(int r0, int n, int D, const float *x, const float *st,
                              const float *g, const float *dy, float *dg, float *db,
                              float *dx) {
  float mv[16], rv[16], s1v[16], s2v[16];
  for (int l = 0; l < 16; l++) {
    int r = r0 + l < n ? r0 + l : n - 1;
    mv[l] = st[2 * r];
    rv[l] = st[2 * r + 1];
  }
  const __m512 mean = _mm512_loadu_ps(mv), rstd = _mm512_loadu_ps(rv);
  __m512 s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps();
  for (int k0 = 0; dx && k0 < D; k0 += 16) {
    __m512 xv[16], dv[16];
    block16(x, D, r0, n, k0, xv);
    block16(dy, D, r0, n, k0, dv);
    for (int kk = 0; kk < 16 && k0 + kk < D; kk++) {
      __m512 xh = _mm512_mul_ps(_mm512_sub_ps(xv[kk], mean), rstd);
      __m512 dxh = _mm512_mul_ps(dv[kk], _mm512_set1_ps(g[k0 + kk]));
      s1 = _mm512_add_ps(s1, dxh);
      s2 = _mm512_add_ps(s2, _mm512_mul_ps(dxh, xh));
    }
  }
  _mm512_storeu_ps(s1v, s1);
  _mm512_storeu_ps(s2v, s2);
  for (int l = 0; l < 16 && r0 + l < n; l++) {
    int r = r0 + l;
    const float *xr = x + (size_t)r * D, *dyr = dy + (size_t)r * D;
    __m512 m = _mm512_set1_ps(mv[l]), rs = _mm512_set1_ps(rv[l]);
    __m512 a = _mm512_set1_ps(s1v[l] / (float)D), s = _mm512_set1_ps(s2v[l]);
    const __m512 fD = _mm512_set1_ps((float)D);
    for (int k = 0; k < D; k += 16) {
      __mmask16 km = dp__lanes16(D - k);
      __m512 xv = _mm512_maskz_loadu_ps(km, xr + k),
             dv = _mm512_maskz_loadu_ps(km, dyr + k);
      __m512 xh = _mm512_mul_ps(_mm512_sub_ps(xv, m), rs);
      _mm512_mask_storeu_ps(
          dg + k, km,
          _mm512_add_ps(_mm512_maskz_loadu_ps(km, dg + k), _mm512_mul_ps(dv, xh)));
      _mm512_mask_storeu_ps(db + k, km,
                            _mm512_add_ps(_mm512_maskz_loadu_ps(km, db + k), dv));
      if (!dx) continue;
      __m512 t = _mm512_sub_ps(_mm512_mul_ps(dv, _mm512_maskz_loadu_ps(km, g + k)), a);
      t = _mm512_sub_ps(t, _mm512_div_ps(_mm512_mul_ps(xh, s), fD));
      _mm512_mask_storeu_ps(dx + (size_t)r * D + k, km, _mm512_mul_ps(rs, t));
    }
  }
}
#endif

void dp__layernorm_forward(int n, int D, float eps, const float *x, const float *g,
                           const float *b, float *st, float *y) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (dp__simd_avx512()) {
    for (int r0 = 0; r0 < n; r0 += 16) forward16(r0, n, D, eps, x, g, b, st, y);
    return;
  }
#endif
  forward_rows(n, D, eps, x, g, b, st, y);
}

void dp__layernorm_backward(int n, int D, const float *x, const float *st, const float *g,
                            const float *dy, float *dg, float *db, float *dx) {
  for (int k = 0; k < D; k++) dg[k] = db[k] = 0.0f;
  dp__layernorm_backward_add(n, D, x, st, g, dy, dg, db, dx);
}

void dp__layernorm_backward_add(int n, int D, const float *x, const float *st,
                                const float *g, const float *dy, float *dg, float *db,
                                float *dx) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (dp__simd_avx512()) {
    for (int r0 = 0; r0 < n; r0 += 16) backward16(r0, n, D, x, st, g, dy, dg, db, dx);
    return;
  }
#endif
  for (int r = 0; r < n; r++) backward_row(r, D, x, st, g, dy, dg, db, dx);
}
