/* The causal softmax of an attention head's (T, T) scores and its backward
 * (lib/cpu/sequence.c calls them; cpu.h has the contract).
 *
 * Each row's max, sum of exps and the backward's dot run in util/expf.h's 16
 * lanes (lane l: columns l, l + 16, ... ascending, then a halving tree), and
 * e^x is dp__expf: a row's chain of adds one at a time ran at the adder's
 * latency and libm's expf was a call per element; now each loop is 16 lanes
 * wide and vectorises (DP_SIMD_FN512), every tier the same operations in the
 * same order, and cuda/sequence.cu's kernels the same again.
 *
 * lanes_tail: a row's last len % 16 columns go through the same 16-lane code,
 * the lanes past the row padded so that they change nothing: -inf for a max
 * (never taken) and an exp (e^(-inf - max) = +0, added to a lane sum that
 * started at +0 and so is never -0: unchanged); +0 * +0 for the dot. (A row
 * whose max is -inf is all NaN or -inf: its sum is NaN either way.) */
#include "cpu/cpu.h"
#include "cpu/gemm.h"
#include "util/expf.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>

#define L DP_SUM_LANES

/* Row i keeps columns j <= i: scaled, e^(s - max) / sum; +0 above. */
static inline DP_SIMD_BODY int causal_softmax_body(float *restrict s, int T, float scale) {
  for (int i = 0; i < T; i++) {
    float *restrict r = s + (size_t)i * T;
    int len = i + 1, full = len / L * L;
    float m[L], a[L], t[L]; /* t: the tail, padded with -inf (see lanes_tail) */
    for (int l = 0; l < L; l++) m[l] = -INFINITY, a[l] = 0.0f;
    for (int j = 0; j < full; j += L)
      for (int l = 0; l < L; l++) {
        float v = r[j + l] * scale;
        r[j + l] = v;
        m[l] = v > m[l] ? v : m[l];
      }
    for (int l = 0; l < L; l++) {
      float v = (full + l < len ? r[full + l] : -INFINITY) * scale;
      t[l] = v;
      m[l] = v > m[l] ? v : m[l];
    }
    /* The max is one value in any order but for the sign of a zero, which
     * s - max then does not show (NaNs are passed over, as one at a time). */
    float mx = m[0];
    for (int l = 1; l < L; l++) mx = m[l] > mx ? m[l] : mx;
    for (int j = 0; j < full; j += L)
      for (int l = 0; l < L; l++) {
        float e = dp__expf(r[j + l] - mx);
        r[j + l] = e;
        a[l] += e;
      }
    for (int l = 0; l < L; l++) {
      float e = dp__expf(t[l] - mx);
      t[l] = e;
      a[l] += e;
    }
    for (int l = 0; full + l < len; l++) r[full + l] = t[l];
    float sum = dp__lanes_total(a);
    for (int j = 0; j < len; j++) r[j] = r[j] / sum;
    for (int j = len; j < T; j++) r[j] = 0.0f;
  }
  return 0;
}
DP_SIMD_FN512(causal_softmax, (float *restrict s, int T, float scale), (s, T, scale))

void dp__causal_softmax(float *s, int T, float scale) { causal_softmax(s, T, scale); }

/* ds = p (dp - sum_j p dp) scale in place on row i's columns j <= i, +0 above. */
static inline DP_SIMD_BODY int
causal_softmax_bwd_body(const float *restrict p, float *restrict ds, int T, float scale) {
  for (int i = 0; i < T; i++) {
    const float *restrict pr = p + (size_t)i * T;
    float *restrict dr = ds + (size_t)i * T;
    int len = i + 1, full = len / L * L;
    float a[L];
    for (int l = 0; l < L; l++) a[l] = 0.0f;
    for (int j = 0; j < full; j += L)
      for (int l = 0; l < L; l++) a[l] += pr[j + l] * dr[j + l];
    for (int l = 0; l < L; l++) { /* the tail, padded with +0 (+0 * +0 adds nothing) */
      bool in = full + l < len;
      a[l] += (in ? pr[full + l] : 0.0f) * (in ? dr[full + l] : 0.0f);
    }
    float dot = dp__lanes_total(a);
    for (int j = 0; j < len; j++) dr[j] = pr[j] * (dr[j] - dot) * scale;
    for (int j = len; j < T; j++) dr[j] = 0.0f;
  }
  return 0;
}
DP_SIMD_FN512(causal_softmax_bwd,
              (const float *restrict p, float *restrict ds, int T, float scale),
              (p, ds, T, scale))

void dp__causal_softmax_backward(const float *p, float *ds, int T, float scale) {
  causal_softmax_bwd(p, ds, T, scale);
}

/* The max and the sum of exps of a row of the loss, in the 16 lanes. */
static inline DP_SIMD_BODY int xent_body(const float *restrict z, const int32_t *restrict t,
                                         float *restrict g, size_t r0, size_t r1, int out,
                                         float inv, float *restrict total) {
  int full = out / L * L;
  float s = 0.0f;
  for (size_t r = r0; r < r1; r++) {
    const float *restrict zr = z + r * out;
    float *restrict gr = g + r * out, m[L], a[L];
    for (int l = 0; l < L; l++) m[l] = -INFINITY, a[l] = 0.0f;
    for (int j = 0; j < full; j += L)
      for (int l = 0; l < L; l++) m[l] = zr[j + l] > m[l] ? zr[j + l] : m[l];
    for (int l = 0; full + l < out; l++) m[l] = zr[full + l] > m[l] ? zr[full + l] : m[l];
    float mx = m[0];
    for (int l = 1; l < L; l++) mx = m[l] > mx ? m[l] : mx;
    for (int j = 0; j < full; j += L)
      for (int l = 0; l < L; l++) {
        float e = dp__expf(zr[j + l] - mx); /* kept: one exp per logit */
        gr[j + l] = e;
        a[l] += e;
      }
    /* the tail (under 16 of a wide row's columns) one lane at a time; rows of
     * at most 16 classes take xent_narrow_body */
    for (int l = 0; full + l < out; l++) {
      float e = dp__expf(zr[full + l] - mx);
      gr[full + l] = e;
      a[l] += e;
    }
    float se = dp__lanes_total(a), inv_se = 1.0f / se;
    int tr = t[r];
    float et = gr[tr];
    /* (mx - z_t) + log se, as PyTorch's log_softmax: log se is added at its own
     * scale, not rounded at the largest logit's (an outside check: equal
     * logits of 1e8 gave a loss of 0, not ln 3) */
    s += (mx - zr[tr]) + logf(se);
    for (int j = 0; j < out; j++) gr[j] = gr[j] * inv_se * inv;
    gr[tr] = (et * inv_se - 1.0f) * inv;
  }
  *total = s;
  return 0;
}
DP_SIMD_FN512(xent,
              (const float *restrict z, const int32_t *restrict t, float *restrict g,
               size_t r0, size_t r1, int out, float inv, float *restrict total),
              (z, t, g, r0, r1, out, inv, total))

/* Rows of at most 16 classes (where a row is all tail, one lane per class),
 * 16 rows at a time with the rows in the lanes: e[l][q] is class l of row q,
 * +0 for lanes past the classes (a lane that adds nothing holds its +0 start),
 * the max taken in class order (the same value), the sum by the same halving
 * tree, the loss added in row order: xent_body's operations, vectorised
 * across the rows instead of a row's 16 lanes. */
static inline DP_SIMD_BODY int xent_narrow_body(const float *restrict z,
                                                const int32_t *restrict t,
                                                float *restrict g, size_t r0, size_t r1,
                                                int out, float inv, float *restrict total) {
  float s = 0.0f;
  for (size_t b = r0; b < r1; b += L) {
    int nq = r1 - b < L ? (int)(r1 - b) : L;
    float e[L][L], mx[L], is[L];
    for (int q = 0; q < L; q++) mx[q] = -INFINITY;
    for (int l = 0; l < L; l++)
      for (int q = 0; q < L; q++) e[l][q] = l < out && q < nq ? z[(b + q) * out + l] : 0.0f;
    for (int l = 0; l < out; l++)
      for (int q = 0; q < L; q++) mx[q] = e[l][q] > mx[q] ? e[l][q] : mx[q];
    for (int l = 0; l < out; l++)
      for (int q = 0; q < L; q++) e[l][q] = dp__expf(e[l][q] - mx[q]);
    float a[L][L];
    for (int l = 0; l < L; l++)
      for (int q = 0; q < L; q++) a[l][q] = e[l][q];
    for (int w = L / 2; w >= 1; w /= 2)
      for (int l = 0; l < w; l++)
        for (int q = 0; q < L; q++) a[l][q] = a[l][q] + a[l + w][q];
    for (int q = 0; q < L; q++) is[q] = 1.0f / a[0][q];
    for (int q = 0; q < nq; q++) {
      size_t r = b + (size_t)q;
      int tr = t[r];
      s += (mx[q] - z[r * out + tr]) + logf(a[0][q]); /* as xent_body */
      float *restrict gr = g + r * out;
      for (int j = 0; j < out; j++) gr[j] = e[j][q] * is[q] * inv;
      gr[tr] = (e[tr][q] * is[q] - 1.0f) * inv;
    }
  }
  *total = s;
  return 0;
}
DP_SIMD_FN512(xent_narrow,
              (const float *restrict z, const int32_t *restrict t, float *restrict g,
               size_t r0, size_t r1, int out, float inv, float *restrict total),
              (z, t, g, r0, r1, out, inv, total))

float dp__softmax_xent(const float *z, const int32_t *t, float *g, size_t r0, size_t r1,
                       int out, float inv) {
  float total;
  if (out <= L)
    xent_narrow(z, t, g, r0, r1, out, inv, &total);
  else
    xent(z, t, g, r0, r1, out, inv, &total);
  return total;
}

/* The sum of v[0..n) (times w[j] when w) in the 16 lanes, then their tree. */
static float lanes_sum(const float *v, const float *w, int n) {
  float a[L];
  for (int l = 0; l < L; l++) a[l] = 0.0f;
  for (int j = 0; j < n; j++) a[j % L] += w ? w[j] * v[j] : v[j];
  return dp__lanes_total(a);
}

/* Not vectorised as the plain loss is: the options' terms are a pass or two
 * more per row, and the plain loss keeps its own bits. */
float dp__softmax_xent_opts(const float *z, const int32_t *t, float *g, size_t r0,
                            size_t r1, int out, const dp_ce_opts *o, float inv) {
  const float *w = o->n_weights ? o->weights : NULL;
  float S = o->smoothing, keep = 1.0f - S, per = S / (float)out;
  float wall = w ? lanes_sum(w, NULL, out) : (float)out; /* sum_c w_c */
  float s = 0.0f;
  for (size_t r = r0; r < r1; r++) {
    const float *zr = z + r * out;
    float *gr = g + r * out;
    int tr = t[r];
    if (o->ignore && tr == o->ignore_index) {
      for (int j = 0; j < out; j++) gr[j] = 0.0f;
      continue;
    }
    float mx = -INFINITY;
    for (int j = 0; j < out; j++) mx = zr[j] > mx ? zr[j] : mx;
    for (int j = 0; j < out; j++) gr[j] = mx - zr[j];       /* -log p_j - log se */
    float smooth = S > 0.0f ? lanes_sum(gr, w, out) : 0.0f; /* sum_c w_c (mx - z_c) */
    for (int j = 0; j < out; j++) gr[j] = dp__expf(-gr[j]);
    float se = lanes_sum(gr, NULL, out), inv_se = 1.0f / se, ls = logf(se);
    float wt = w ? w[tr] : 1.0f, et = gr[tr];
    /* (mx - z_t) + log se, as the plain loss */
    float loss = keep * wt * ((mx - zr[tr]) + ls);
    if (S > 0.0f) loss += per * (smooth + wall * ls);
    s += loss;
    float a = keep * wt + per * wall;
    for (int j = 0; j < out; j++)
      gr[j] = (gr[j] * inv_se * a - per * (w ? w[j] : 1.0f)) * inv;
    gr[tr] = (et * inv_se * a - per * wt - keep * wt) * inv;
  }
  return s;
}
