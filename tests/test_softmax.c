/* dp__expf (lib/util/expf.h), dp__tanhf (lib/util/tanh.h) and dp__erff
 * (lib/util/erf.h) against e^x, tanh and erf in double, and the softmax kernels
 * (lib/cpu/softmax.c) against their definition written out here: each row's
 * max and sums in the 16 lanes (lane l: columns l, l + 16, ... ascending from
 * -inf or +0), the lanes combined in order (the max) or by the halving tree
 * (the sums), one rounding per operation. Every tier this CPU has gives those
 * bits, on widths that are and are not multiples of 16, reads nothing above
 * the diagonal or outside its rows and writes nothing past its outputs; with
 * NaNs and infinities in the data, any NaN stands for a NaN. And the
 * attention's causal products by blocks of rows against whole products. */
#include "cpu/cpu.h"
#include "cpu/gemm.h"
#include "helpers.h"
#include "util/erf.h"
#include "util/expf.h"
#include "util/tanh.h"

#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAST 32 /* floats past every output, filled with a pattern */
#define L 16    /* DP_SUM_LANES, spelled out: the definition, not the header's */

static const char *const tiers[] = {"scalar", "avx2", "avx512"};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33) % n;
}

/* Uniform in [-mag, mag]; with special, now and then a value that breaks rows. */
static float val(float mag, bool special) {
  static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, 3e38f, -3e38f};
  if (special && rnd(300) == 0) return sp[rnd(8)];
  return ((float)rnd(1u << 20) / (float)(1u << 19) - 1.0f) * mag;
}

static float *filled(size_t n, float mag, bool special) {
  float *p = malloc((n + PAST) * 4);
  ck_assert_ptr_nonnull(p);
  for (size_t i = 0; i < n; i++) p[i] = val(mag, special);
  for (size_t i = n; i < n + PAST; i++) p[i] = 0.0f;
  return p;
}

static float *blank(size_t n) { return floats_blank(n, PAST); }

static float *copy(const float *a, size_t n) {
  float *p = blank(n);
  memcpy(p, a, n * 4); /* its PAST floats: blank's pattern, as the definition's */
  return p;
}

static void same(const char *what, const float *a, const float *b, size_t n, int w,
                 const char *tier) {
  for (size_t i = 0; i < n + PAST; i++)
    if (memcmp(a + i, b + i, 4) != 0 && !(i < n && isnan(a[i]) && isnan(b[i])))
      ck_abort_msg("%s, rows of %d, tier %s: row %zu column %zu: %a, the definition %a%s",
                   what, w, tier, i / (size_t)w, i % (size_t)w, (double)a[i], (double)b[i],
                   i >= n ? " (past the output)" : "");
}

/* ---- dp__expf ------------------------------------------------------------------ */

typedef struct {
  double err, err_sub; /* ulps of normal results; units of 2^-149 below FLT_MIN */
  float x, x_sub;
  long inf_wrong; /* +inf where the rounded e^x is finite, or the other way */
  float x_inf;
} expf_worst;

static void measure(expf_worst *w, uint32_t b0, uint32_t b1, uint32_t step) {
  for (uint64_t b = b0; b <= b1; b += step) {
    float x = dp__f32_of((uint32_t)b), y = dp__expf(x);
    double e = exp((double)x);
    float r = (float)e; /* the correctly rounded result but for double's error */
    if (isinf(r) || isinf(y)) {
      if (isinf(r) != isinf(y)) w->inf_wrong++, w->x_inf = x;
      continue;
    }
    int ex;
    frexpf(r, &ex);
    bool sub = r < FLT_MIN;
    double err = fabs((double)y - e) / ldexp(1.0, sub ? -149 : ex - 24);
    if (sub && err > w->err_sub) w->err_sub = err, w->x_sub = x;
    if (!sub && err > w->err) w->err = err, w->x = x;
  }
}

/* Every pattern from the bits of x - n to those of x + n (one sign). */
static void window(expf_worst *w, float x, uint32_t n) {
  uint32_t b = dp__f32_bits(x);
  measure(w, b - n, b + n, 1);
}

/* Measured over every float in [-104, 89] (a throwaway program, glibc's exp in
 * double): at most 1.2183 ulp for normal results (x = -0x1.dfa24cp+5, also
 * 1.2106 at -0x1.790216p+2), 0.7771 units of 2^-149 for subnormal ones (x =
 * -0x1.5f4526p+6), and +inf exactly where the rounded e^x is. */
START_TEST(expf_accuracy) {
  expf_worst w = {0};
  measure(&w, 0u, 0x42b20000u, 997);                           /* +0 .. 89 */
  measure(&w, 0x80000000u, 0xc2d00000u, 997);                  /* -0 .. -104 */
  measure(&w, dp__f32_bits(88.0f), dp__f32_bits(89.0f), 1);    /* overflow */
  measure(&w, dp__f32_bits(-87.0f), dp__f32_bits(-104.0f), 1); /* subnormal, +0 */
  static const float around[] = {0x1p-24f, 0x1p-8f, 0.34657359f, 1.0f};
  for (int i = 0; i < 4; i++)
    window(&w, around[i], 1u << 19), window(&w, -around[i], 1u << 19);
  static const float worst[] = {-0x1.dfa24cp+5f, -0x1.790216p+2f, -0x1.5f4526p+6f};
  for (int i = 0; i < 3; i++) window(&w, worst[i], 1u << 12);
  ck_assert_msg(w.inf_wrong == 0, "dp__expf(%a): +inf where e^x rounds to finite or not",
                (double)w.x_inf);
  ck_assert_msg(w.err <= 1.25, "dp__expf(%a): %.4f ulp", (double)w.x, w.err);
  ck_assert_msg(w.err_sub <= 0.8, "dp__expf(%a): %.4f * 2^-149 off", (double)w.x_sub,
                w.err_sub);
}
END_TEST

/* dp__tanhf's e^(2|x|) has dp__expf's bits on its whole range, [+0, 20]
 * (checked on every float there once, a throwaway program; here every 61st
 * and the ends). */
START_TEST(expf_0_20_is_expf) {
  for (uint32_t b = 0; b <= 0x41a00000u; b += b < 0x41a00000u - 61 ? 61 : 1) {
    float x = dp__f32_of(b);
    uint32_t want = dp__f32_bits(dp__expf(x)), got = dp__f32_bits(dp__expf_0_20(x));
    if (got != want)
      ck_abort_msg("dp__expf_0_20(%a) is %a, dp__expf %a", (double)x,
                   (double)dp__f32_of(got), (double)dp__f32_of(want));
  }
}
END_TEST

/* ---- dp__tanhf ----------------------------------------------------------------- */

/* Measured over every positive float (a throwaway program, glibc's tanh in
 * double): at most 1.3430 ulp, at x = 0x1.43dddcp-1, just past the switch from
 * the polynomial to 1 - 2 / (e^2x + 1) at 0.625. */
START_TEST(tanhf_accuracy) {
  double worst = 0.0;
  float at = 0.0f;
  uint32_t sw = dp__f32_bits(0.625f), hi = dp__f32_bits(0x1.43dddcp-1f);
  for (int part = 0; part < 3; part++) {
    uint32_t b0 = part == 0 ? 0u : part == 1 ? sw - (1u << 18) : hi - (1u << 12);
    uint32_t b1 = part == 0 ? 0x7f7fffffu : part == 1 ? sw + (1u << 18) : hi + (1u << 12);
    for (uint64_t b = b0; b <= b1; b += part == 0 ? 997 : 1) {
      float x = dp__f32_of((uint32_t)b), y = dp__tanhf(x);
      double t = tanh((double)x);
      int ex;
      frexpf((float)t, &ex);
      double err = fabs((double)y - t) / ldexp(1.0, (float)t < FLT_MIN ? -149 : ex - 24);
      if (err > worst) worst = err, at = x;
      ck_assert_msg(dp__f32_bits(dp__tanhf(-x)) == (dp__f32_bits(y) ^ 0x80000000u),
                    "tanh(-%a) is not -tanh(%a)", (double)x, (double)x);
    }
  }
  ck_assert_msg(worst <= 1.4, "dp__tanhf(%a): %.4f ulp", (double)at, worst);
}
END_TEST

START_TEST(tanhf_special_values) {
  static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7fc12345u};
  for (int i = 0; i < 3; i++)
    ck_assert_uint_eq(dp__f32_bits(dp__tanhf(dp__f32_of(nans[i]))), nans[i]);
  ck_assert_uint_eq(dp__f32_bits(dp__tanhf(INFINITY)), dp__f32_bits(1.0f));
  ck_assert_uint_eq(dp__f32_bits(dp__tanhf(-INFINITY)), dp__f32_bits(-1.0f));
  ck_assert_uint_eq(dp__f32_bits(dp__tanhf(0.0f)), 0u);
  ck_assert_uint_eq(dp__f32_bits(dp__tanhf(-0.0f)), 0x80000000u);
  ck_assert_uint_eq(dp__f32_bits(dp__tanhf(1e-40f)), dp__f32_bits(1e-40f));
  ck_assert_uint_eq(dp__f32_bits(dp__tanhf(9.1f)), dp__f32_bits(1.0f));
  ck_assert_uint_eq(dp__f32_bits(dp__tanhf(9.0f)), dp__f32_bits(0x1.fffffep-1f));
}
END_TEST

/* ---- dp__erff and the exact gelu ------------------------------------------------ */

/* ulps of y from erf(x) (glibc's in double, a few double ulp off) */
static double erf_ulps(float x, float y) {
  double t = erf((double)x);
  int ex;
  frexpf((float)t, &ex);
  return fabs((double)y - t) / ldexp(1.0, fabsf((float)t) < FLT_MIN ? -149 : ex - 24);
}

/* Measured over every positive float (a throwaway program, glibc's erf in
 * double): at most 1.4794 ulp, at x = 0x1.d9c6eep-1, just past the switch from
 * the polynomial to 1 - e^(-x^2) r(1/x) at 0.921875. Here: every 997th float,
 * every float near the switch and the worst, and the odd symmetry. */
START_TEST(erff_accuracy) {
  double worst = 0.0;
  float at = 0.0f;
  uint32_t sw = dp__f32_bits(0.921875f), hi = dp__f32_bits(0x1.d9c6eep-1f);
  for (int part = 0; part < 3; part++) {
    uint32_t b0 = part == 0 ? 0u : part == 1 ? sw - (1u << 18) : hi - (1u << 12);
    uint32_t b1 = part == 0 ? 0x7f7fffffu : part == 1 ? sw + (1u << 18) : hi + (1u << 12);
    for (uint64_t b = b0; b <= b1; b += part == 0 ? 997 : 1) {
      float x = dp__f32_of((uint32_t)b), y = dp__erff(x);
      double err = erf_ulps(x, y);
      if (err > worst) worst = err, at = x;
      ck_assert_msg(dp__f32_bits(dp__erff(-x)) == (dp__f32_bits(y) ^ 0x80000000u),
                    "erf(-%a) is not -erf(%a)", (double)x, (double)x);
    }
  }
  ck_assert_msg(worst <= 1.5, "dp__erff(%a): %.4f ulp", (double)at, worst);
}
END_TEST

START_TEST(erff_special_values) {
  static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7fc12345u};
  for (int i = 0; i < 3; i++)
    ck_assert_uint_eq(dp__f32_bits(dp__erff(dp__f32_of(nans[i]))), nans[i]);
  ck_assert_uint_eq(dp__f32_bits(dp__erff(INFINITY)), dp__f32_bits(1.0f));
  ck_assert_uint_eq(dp__f32_bits(dp__erff(-INFINITY)), dp__f32_bits(-1.0f));
  ck_assert_uint_eq(dp__f32_bits(dp__erff(0.0f)), 0u);
  ck_assert_uint_eq(dp__f32_bits(dp__erff(-0.0f)), 0x80000000u);
  ck_assert_uint_eq(dp__f32_bits(dp__erff(4.0f)), dp__f32_bits(1.0f));
  ck_assert_uint_eq(dp__f32_bits(dp__erff(1e30f)), dp__f32_bits(1.0f));
  /* erf(x) = 2x/sqrt(pi) for tiny x: subnormals round once */
  ck_assert_float_eq(dp__erff(0x1p-140f), (float)(0x1p-140 * 1.1283791670955126));
}
END_TEST

/* The exact gelu and its derivative against the formulas in double, over
 * [-20, 20] every 2^-10: the forward within 2 ulp above -1 (below, 1 + erf
 * cancels, as in PyTorch's: 2 units of ulp + |x| 2^-24), the
 * derivative within 2^-23 absolute; x phi(x) keeps its relative accuracy far
 * out (e^(-x^2/2) from the split x = h + l, util/erf.h); +-inf give dy and 0. */
START_TEST(gelu_erf_is_the_formula) {
  double wf = 0.0, wg = 0.0;
  for (int k = -20 * 1024; k <= 20 * 1024; k++) {
    float x = (float)k / 1024.0f;
    double X = x, cdf = 0.5 * erfc(-X / sqrt(2.0)), phi = exp(-X * X / 2) / sqrt(2 * M_PI);
    double f = X * cdf, g = cdf + X * phi, y = dp__gelu_erf(x);
    int ex;
    frexp(f, &ex);
    double ulp = ldexp(1.0, ex < -125 ? -149 : ex - 24);
    /* below -1, 1 + erf is exact but erf's own error (1.5 2^-24) is no longer
     * small against it: |x| 2^-24 more */
    double e = fabs(y - f) / (x > -1.0f ? ulp : ulp + fabs(X) * 0x1p-24);
    if (e > wf) wf = e;
    double eg = fabs(dp__gelu_erf_grad(x, 1.0f) - g);
    if (eg > wg) wg = eg;
  }
  ck_assert_msg(wf <= 2.0, "gelu_erf: %.3f ulp", wf);
  ck_assert_msg(wg <= 0x1p-23, "gelu_erf's derivative: %g off", wg);
  for (float x = 6.0f; x <= 13.0f; x += 0.5f) { /* Phi(-x) is 0 there: -x phi(x) alone */
    double want = -(double)x * exp(-(double)x * x / 2) / sqrt(2 * M_PI);
    double got = dp__gelu_erf_grad(-x, 1.0f);
    ck_assert_msg(fabs(got - want) <= 1e-6 * fabs(want), "x phi(x) at %g: %g, want %g",
                  (double)-x, got, want);
  }
  ck_assert_float_eq(dp__gelu_erf_grad(INFINITY, 3.0f), 3.0f);
  ck_assert_float_eq(dp__gelu_erf_grad(-INFINITY, 3.0f), 0.0f);
  ck_assert(isnan(dp__gelu_erf_grad(NAN, 1.0f)));
  ck_assert(isnan(dp__gelu_erf(NAN)));
  ck_assert_float_eq(dp__gelu_erf(INFINITY), INFINITY);
}
END_TEST

static uint32_t bits_of_expf(uint32_t xb) { return dp__f32_bits(dp__expf(dp__f32_of(xb))); }

START_TEST(expf_special_values) {
  static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7fc12345u, 0xffd00001u};
  for (int i = 0; i < 4; i++)
    ck_assert_msg(bits_of_expf(nans[i]) == nans[i], "NaN 0x%08x out as 0x%08x", nans[i],
                  bits_of_expf(nans[i]));
  ck_assert_uint_eq(bits_of_expf(0x7f800000u), 0x7f800000u); /* +inf */
  ck_assert_uint_eq(bits_of_expf(0xff800000u), 0u);          /* -inf: +0 */
  ck_assert_uint_eq(bits_of_expf(0u), dp__f32_bits(1.0f));
  ck_assert_uint_eq(bits_of_expf(0x80000000u), dp__f32_bits(1.0f));
  static const float over[] = {89.0f, 1e30f, FLT_MAX},
                     under[] = {-104.0f, -1e30f, -FLT_MAX};
  for (int i = 0; i < 3; i++) {
    ck_assert_msg(dp__f32_bits(dp__expf(over[i])) == 0x7f800000u, "e^%a", (double)over[i]);
    ck_assert_msg(dp__f32_bits(dp__expf(under[i])) == 0u, "e^%a", (double)under[i]);
  }
  int32_t d = (int32_t)(dp__f32_bits(dp__expf(1.0f)) - dp__f32_bits((float)M_E));
  ck_assert_msg(d >= -1 && d <= 1, "e^1 = %a", (double)dp__expf(1.0f));
  float s = dp__expf(-100.0f); /* 26.5 * 2^-149 */
  ck_assert_msg(s > 0.0f && s < FLT_MIN && fabs((double)s - exp(-100.0)) <= 0x1p-149,
                "e^-100 = %a", (double)s);
}
END_TEST

/* ---- the definitions --------------------------------------------------------------- */

/* The 16 lanes' sums into one: lane l + w into lane l, w = 8, 4, 2, 1. */
static float tree(float a[L]) {
  for (int w = L / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; l++) a[l] = a[l] + a[l + w];
  return a[0];
}

/* The lanes' maxima into one, lane 1 to 15 in order. */
static float lanes_max(const float m[L]) {
  float mx = m[0];
  for (int l = 1; l < L; l++) mx = m[l] > mx ? m[l] : mx;
  return mx;
}

static void ref_softmax(const float *in, float *out, int T, float scale) {
  for (int i = 0; i < T; i++) {
    const float *x = in + (size_t)i * T;
    float *r = out + (size_t)i * T, m[L], a[L];
    for (int l = 0; l < L; l++) m[l] = -INFINITY, a[l] = 0.0f;
    for (int j = 0; j <= i; j++) {
      float v = x[j] * scale;
      r[j] = v;
      m[j % L] = v > m[j % L] ? v : m[j % L];
    }
    float mx = lanes_max(m);
    for (int j = 0; j <= i; j++) {
      float d = r[j] - mx, e = dp__expf(d);
      r[j] = e;
      a[j % L] = a[j % L] + e;
    }
    float sum = tree(a);
    for (int j = 0; j <= i; j++) r[j] = r[j] / sum;
    for (int j = i + 1; j < T; j++) r[j] = 0.0f;
  }
}

static void ref_softmax_bwd(const float *p, const float *in, float *out, int T,
                            float scale) {
  for (int i = 0; i < T; i++) {
    const float *pr = p + (size_t)i * T, *d = in + (size_t)i * T;
    float *r = out + (size_t)i * T, a[L];
    for (int l = 0; l < L; l++) a[l] = 0.0f;
    for (int j = 0; j <= i; j++) {
      float q = pr[j] * d[j];
      a[j % L] = a[j % L] + q;
    }
    float dot = tree(a);
    for (int j = 0; j <= i; j++) {
      float u = d[j] - dot, v = pr[j] * u;
      r[j] = v * scale;
    }
    for (int j = i + 1; j < T; j++) r[j] = 0.0f;
  }
}

static float ref_xent(const float *z, const int32_t *t, float *g, size_t r0, size_t r1,
                      int out, float inv) {
  float total = 0.0f;
  for (size_t r = r0; r < r1; r++) {
    const float *zr = z + r * out;
    float *gr = g + r * out, m[L], a[L];
    for (int l = 0; l < L; l++) m[l] = -INFINITY, a[l] = 0.0f;
    for (int j = 0; j < out; j++) m[j % L] = zr[j] > m[j % L] ? zr[j] : m[j % L];
    float mx = lanes_max(m);
    for (int j = 0; j < out; j++) {
      float d = zr[j] - mx;
      gr[j] = dp__expf(d); /* e_j, until the gradient replaces it */
      a[j % L] = a[j % L] + gr[j];
    }
    /* PyTorch's order: log se added at its own scale (below: huge logits) */
    float se = tree(a), inv_se = 1.0f / se, loss = (mx - zr[t[r]]) + logf(se);
    total = total + loss;
    for (int j = 0; j < out; j++) {
      float p = gr[j] * inv_se;
      gr[j] = (j == t[r] ? p - 1.0f : p) * inv;
    }
  }
  return total;
}

/* ---- the kernels against them -------------------------------------------------------- */

static int width(int c, const int *fixed, int nfixed, uint32_t most) {
  return c < nfixed ? fixed[c] : 1 + (int)rnd(most);
}

/* The causal softmax, or its backward: both read row i's columns j <= i only. */
static void softmax_cases(bool backward, bool special, int count) {
  static const int Ts[] = {1, 2, 15, 16, 17, 31, 32, 33, 64, 100};
  static const float mags[] = {1.0f, 8.0f, 80.0f};
  int ran = 0;
  for (int c = 0; c < count; c++) {
    int T = width(c, Ts, 10, 130);
    size_t n = (size_t)T * T;
    float scale = 1.0f / sqrtf((float)(1 + rnd(128))), mag = mags[rnd(3)];
    /* above the diagonal: garbage that must not reach the results */
    float *s = filled(n, mag, special), *p = blank(n), *ds = filled(n, 4.0f, special);
    ref_softmax(s, p, T, scale);
    bool real_p = rnd(3) != 0; /* else any p, garbage above the diagonal too */
    if (backward && !real_p) memcpy(p, s, n * 4);
    float *want = p;
    if (backward) want = blank(n), ref_softmax_bwd(p, ds, want, T, scale);
    for (int t = 0; t < 3; t++) {
      if (dp__gemm_force_tier(tiers[t]) != 0) continue; /* not on this CPU */
      ran++;
      float *got = copy(backward ? ds : s, n);
      if (backward)
        dp__causal_softmax_backward(p, got, T, scale);
      else
        dp__causal_softmax(got, T, scale);
      same(backward ? "causal softmax backward" : "causal softmax", got, want, n, T,
           tiers[t]);
      free(got);
    }
    if (want != p) free(want);
    free(s), free(p), free(ds);
  }
  dp__gemm_force_tier("auto");
  ck_assert_int_ge(ran, count);
}

START_TEST(causal_softmax_is_the_definition_on_every_tier) {
  softmax_cases(false, false, 60);
  softmax_cases(false, true, 40);
}
END_TEST

START_TEST(causal_softmax_backward_is_the_definition_on_every_tier) {
  softmax_cases(true, false, 60);
  softmax_cases(true, true, 40);
}
END_TEST

static void xent_cases(bool special, int count) {
  static const int outs[] = {1, 2, 10, 15, 16, 17, 33, 256, 300};
  int ran = 0;
  for (int c = 0; c < count; c++) {
    /* up to 44 rows: the narrow path's blocks of 16, whole and partial */
    int out = width(c, outs, 9, 400), rows = 1 + (int)rnd(c % 2 ? 12 : 44);
    size_t r0 = rnd(3) ? 0 : rnd((uint32_t)rows), r1 = r0 + rnd((uint32_t)(rows - r0) + 1);
    size_t n = (size_t)rows * out;
    float inv = 1.0f / (float)(1 + rnd(64)), *z = filled(n, rnd(2) ? 4.0f : 60.0f, special);
    int32_t *t = malloc((size_t)rows * sizeof *t);
    ck_assert_ptr_nonnull(t);
    for (int r = 0; r < rows; r++) t[r] = (int32_t)rnd((uint32_t)out);
    float *g = blank(n), total = ref_xent(z, t, g, r0, r1, out, inv);
    for (int k = 0; k < 3; k++) {
      if (dp__gemm_force_tier(tiers[k]) != 0) continue;
      ran++;
      float *g2 = blank(n), total2 = dp__softmax_xent(z, t, g2, r0, r1, out, inv);
      ck_assert_msg(memcmp(&total, &total2, 4) == 0 || (isnan(total) && isnan(total2)),
                    "loss, width %d, rows [%zu, %zu), tier %s: %a, the definition %a", out,
                    r0, r1, tiers[k], (double)total2, (double)total);
      char what[64];
      snprintf(what, sizeof what, "softmax xent gradient, rows [%zu, %zu)", r0, r1);
      same(what, g2, g, n, out, tiers[k]);
      free(g2);
    }
    free(z), free(t), free(g);
  }
  dp__gemm_force_tier("auto");
  ck_assert_int_ge(ran, count);
}

START_TEST(softmax_xent_is_the_definition_on_every_tier) {
  xent_cases(false, 120);
  xent_cases(true, 60);
}
END_TEST

/* Equal logits of any size: the loss is ln(classes), the gradient 1/classes
 * less the label's 1 (an outside check: logits of 1e8 gave a loss of 0, log se
 * rounded at the largest logit's scale), narrow and wide rows, every tier. */
START_TEST(softmax_xent_of_huge_equal_logits_is_log_classes) {
  static const float vals[] = {0.0f, 1e4f, 1e8f, -1e8f, 3e37f};
  static const int outs[] = {3, 40};
  for (int k = 0; k < 3; k++) {
    if (dp__gemm_force_tier(tiers[k]) != 0) continue;
    for (int o = 0; o < 2; o++)
      for (int v = 0; v < 5; v++) {
        int out = outs[o];
        float z[40], g[40];
        int32_t t[1] = {1};
        for (int j = 0; j < out; j++) z[j] = vals[v];
        float loss = dp__softmax_xent(z, t, g, 0, 1, out, 1.0f);
        ck_assert_msg(fabsf(loss - logf((float)out)) <= 1e-6f,
                      "tier %s, %d classes of %g: loss %.9g, ln %d = %.9g", tiers[k], out,
                      (double)vals[v], (double)loss, out, (double)logf((float)out));
        for (int j = 0; j < out; j++)
          ck_assert_msg(fabsf(g[j] - (1.0f / (float)out - (j == 1))) <= 1e-6f,
                        "tier %s, %d classes of %g: gradient %d is %g", tiers[k], out,
                        (double)vals[v], j, (double)g[j]);
      }
  }
  dp__gemm_force_tier("auto");
}
END_TEST

/* ---- attention's causal products (lib/cpu/sequence.c) ---- */

/* One head of the attention on whole products (dp__sgemm over all T rows and
 * columns, the probabilities' upper triangle zeros): the forward's p and y,
 * then the backward's dq, dk, dv. */
static void ref_head(int T, int hd, int D, float scale, const float *q, const float *k,
                     const float *v, const float *dy, float *p, float *y, float *dq,
                     float *dk, float *dv) {
  size_t n = (size_t)T * T;
  float *ds = blank(n);
  dp__sgemm(0, 1, T, T, hd, q, 3 * D, k, 3 * D, p, T, NULL, NULL);
  dp__causal_softmax(p, T, scale);
  for (int i = 0; i < T; i++)
    for (int j = i + 1; j < T; j++) p[(size_t)i * T + j] = 0.0f;
  dp__sgemm(0, 0, T, hd, T, p, T, v, 3 * D, y, D, NULL, NULL);
  dp__sgemm(1, 0, T, hd, T, p, T, dy, D, dv, 3 * D, NULL, NULL);
  dp__sgemm(0, 1, T, T, hd, dy, D, v, 3 * D, ds, T, NULL, NULL);
  dp__causal_softmax_backward(p, ds, T, scale);
  for (int i = 0; i < T; i++)
    for (int j = i + 1; j < T; j++) ds[(size_t)i * T + j] = 0.0f;
  dp__sgemm(0, 0, T, hd, T, ds, T, k, 3 * D, dq, 3 * D, NULL, NULL);
  dp__sgemm(1, 0, T, hd, T, ds, T, q, 3 * D, dk, 3 * D, NULL, NULL);
  free(ds);
}

/* The attention computes its causal products by blocks of rows (of a size
 * that depends on the context), only up to each block's last row: every
 * value has the whole products' bits on every tier, for contexts that are
 * and are not multiples of the blocks, on finite data. */
START_TEST(attention_blocks_give_the_whole_products_bits) {
  static const int Ts[] = {5, 64, 100, 127, 128, 130, 256};
  int ran = 0;
  for (int c = 0; c < (int)(sizeof Ts / sizeof Ts[0]); c++) {
    int T = Ts[c], H = 2, hd = 8 + 8 * (c % 3), D = H * hd, n = 2;
    dp_layer l = {.kind = DP_LAYER_ATTENTION, .t = T, .c = D, .heads = H};
    float scale = 1.0f / sqrtf((float)hd);
    size_t nq = (size_t)n * T * 3 * D, ny = (size_t)n * T * D, np = (size_t)n * H * T * T;
    float *qkv = filled(nq, 2.0f, false), *dy = filled(ny, 1.0f, false);
    float *p = blank(np), *y = blank(ny), *dqkv = blank(nq);
    for (int r = 0; r < n; r++)
      for (int h = 0; h < H; h++) {
        size_t at = (size_t)r * T * 3 * D + (size_t)h * hd, ay = (size_t)r * T * D + h * hd;
        ref_head(T, hd, D, scale, qkv + at, qkv + at + D, qkv + at + 2 * D, dy + ay,
                 p + ((size_t)r * H + h) * T * T, y + ay, dqkv + at, dqkv + at + D,
                 dqkv + at + 2 * D);
      }
    size_t wsb = dp__attention_workspace_bytes(&l, true);
    void *ws = malloc(wsb);
    for (int t = 0; t < 3; t++) {
      if (dp__gemm_force_tier(tiers[t]) != 0) continue; /* not on this CPU */
      ran++;
      float *p2 = blank(np), *y2 = blank(ny), *d2 = blank(nq);
      for (size_t i = 0; i < np; i++) p2[i] = NAN; /* what the forward must write */
      ck_assert(dp__attention_forward(&l, n, qkv, p2, y2, NULL, ws, wsb));
      for (size_t i = 0; i < np; i++) { /* the lower triangles: the softmax's output */
        size_t row = i / T % T, col = i % T;
        if (col <= row && memcmp(&p2[i], &p[i], 4) != 0)
          ck_abort_msg("T %d, tier %s: p[%zu] is %a, whole products %a", T, tiers[t], i,
                       (double)p2[i], (double)p[i]);
      }
      same("attention y", y2, y, ny, T, tiers[t]);
      ck_assert(dp__attention_backward(&l, n, qkv, p, dy, d2, NULL, ws, wsb));
      same("attention dqkv", d2, dqkv, nq, T, tiers[t]);
      free(p2), free(y2), free(d2);
    }
    free(ws), free(qkv), free(dy), free(p), free(y), free(dqkv);
  }
  dp__gemm_force_tier("auto");
  ck_assert_int_ge(ran, 7);
}
END_TEST

Suite *softmax_suite(void) {
  Suite *s = suite_create("softmax");
  TCase *tc = tcase_create("kernels");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, expf_accuracy);
  tcase_add_test(tc, expf_special_values);
  tcase_add_test(tc, expf_0_20_is_expf);
  tcase_add_test(tc, tanhf_accuracy);
  tcase_add_test(tc, tanhf_special_values);
  tcase_add_test(tc, erff_accuracy);
  tcase_add_test(tc, erff_special_values);
  tcase_add_test(tc, gelu_erf_is_the_formula);
  tcase_add_test(tc, causal_softmax_is_the_definition_on_every_tier);
  tcase_add_test(tc, causal_softmax_backward_is_the_definition_on_every_tier);
  tcase_add_test(tc, softmax_xent_is_the_definition_on_every_tier);
  tcase_add_test(tc, softmax_xent_of_huge_equal_logits_is_log_classes);
  tcase_add_test(tc, attention_blocks_give_the_whole_products_bits);
  suite_add_tcase(s, tc);
  return s;
}
