/* layernorm's CPU kernels (lib/cpu/layernorm.c) against the definition
 * written out here: each row's mean, variance and backward sums over its
 * elements in order from +0, one rounding per operation, the weight gradients
 * summed over the rows in row order. Every tier this CPU has (the AVX-512 one
 * runs 16 rows at once, rows in the lanes) gives those bits, on widths and
 * row counts that are and are not multiples of 16, with and without the
 * input gradient, and writes nothing past its outputs; with NaNs and
 * infinities in the data, any NaN stands for a NaN. */
#include "cpu/cpu.h"
#include "cpu/gemm.h"
#include "helpers.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAST 32 /* floats past every output, filled with a pattern */

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(uint32_t n) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33) % n;
}

static float val(bool special) {
  static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, 3e38f, -2e-38f};
  if (special && rnd(40) == 0) return sp[rnd(8)];
  return ((float)rnd(1u << 20) / (float)(1u << 19) - 1.0f) * (rnd(4) ? 1.0f : 37.0f);
}

static float *filled(size_t n, bool special) {
  float *p = malloc((n + PAST) * 4);
  ck_assert_ptr_nonnull(p);
  for (size_t i = 0; i < n; i++) p[i] = val(special);
  for (size_t i = n; i < n + PAST; i++) p[i] = 0.0f;
  return p;
}

static float *blank(size_t n) { return floats_blank(n, PAST); }

/* The definition (PyTorch's layernorm, eps 1e-5), operation by operation. */
static void ref_forward(int n, int D, const float *x, const float *g, const float *b,
                        float *st, float *y) {
  for (int r = 0; r < n; r++) {
    float sum = 0.0f, var = 0.0f;
    for (int k = 0; k < D; k++) sum = sum + x[(size_t)r * D + k];
    float mean = sum / (float)D;
    for (int k = 0; k < D; k++) {
      float d = x[(size_t)r * D + k] - mean, p = d * d;
      var = var + p;
    }
    float v = var / (float)D, e = v + 1e-5f, rstd = 1.0f / sqrtf(e);
    st[2 * r] = mean;
    st[2 * r + 1] = rstd;
    for (int k = 0; k < D; k++) {
      float t = (x[(size_t)r * D + k] - mean) * rstd, u = t * g[k];
      y[(size_t)r * D + k] = u + b[k];
    }
  }
}

static void ref_backward(int n, int D, const float *x, const float *st, const float *g,
                         const float *dy, float *dg, float *db, float *dx) {
  for (int k = 0; k < D; k++) dg[k] = db[k] = 0.0f;
  for (int r = 0; r < n; r++) {
    const float *xr = x + (size_t)r * D, *dyr = dy + (size_t)r * D;
    float mean = st[2 * r], rstd = st[2 * r + 1];
    float s1 = 0.0f, s2 = 0.0f;
    for (int k = 0; k < D; k++) {
      float xh = (xr[k] - mean) * rstd, dxh = dyr[k] * g[k], p = dyr[k] * xh, q = dxh * xh;
      dg[k] = dg[k] + p;
      db[k] = db[k] + dyr[k];
      s1 = s1 + dxh;
      s2 = s2 + q;
    }
    if (!dx) continue;
    float a = s1 / (float)D;
    for (int k = 0; k < D; k++) {
      float xh = (xr[k] - mean) * rstd, t = dyr[k] * g[k] - a, q = xh * s2,
            u = q / (float)D;
      dx[(size_t)r * D + k] = rstd * (t - u);
    }
  }
}

static void same(const char *what, const float *a, const float *b, size_t n, int rows,
                 int D, const char *tier) {
  for (size_t i = 0; i < n + PAST; i++)
    if (memcmp(a + i, b + i, 4) != 0 && !(i < n && isnan(a[i]) && isnan(b[i])))
      ck_abort_msg("%s, %d rows of %d, tier %s: element %zu: %a, the definition %a%s", what,
                   rows, D, tier, i, (double)a[i], (double)b[i],
                   i >= n ? " (past the output)" : "");
}

static void cases(bool special, int count) {
  static const char *const tiers[] = {"scalar", "avx2", "avx512"};
  int ran = 0;
  for (int c = 0; c < count; c++) {
    int n = c < 4 ? 16 * (c + 1) : 1 + (int)rnd(40);
    int D = c % 7 == 0 ? 128 : c % 7 == 1 ? 384 : 1 + (int)rnd(70);
    size_t nd = (size_t)n * D;
    float *x = filled(nd, special), *g = filled((size_t)D, special),
          *b = filled((size_t)D, special), *dy = filled(nd, special);
    float *st = blank(2 * (size_t)n), *y = blank(nd), *dg = blank((size_t)D),
          *db = blank((size_t)D), *dx = blank(nd);
    ref_forward(n, D, x, g, b, st, y);
    bool with_dx = rnd(4) != 0;
    ref_backward(n, D, x, st, g, dy, dg, db, with_dx ? dx : NULL);
    for (int t = 0; t < 3; t++) {
      if (dp__gemm_force_tier(tiers[t]) != 0) continue; /* not on this CPU */
      ran++;
      float *st2 = blank(2 * (size_t)n), *y2 = blank(nd), *dg2 = blank((size_t)D),
            *db2 = blank((size_t)D), *dx2 = blank(nd);
      dp__layernorm_forward(n, D, 1e-5f, x, g, b, st2, y2);
      same("statistics", st2, st, 2 * (size_t)n, n, D, tiers[t]);
      same("y", y2, y, nd, n, D, tiers[t]);
      dp__layernorm_backward(n, D, x, st, g, dy, dg2, db2, with_dx ? dx2 : NULL);
      same("dg", dg2, dg, (size_t)D, n, D, tiers[t]);
      same("db", db2, db, (size_t)D, n, D, tiers[t]);
      if (with_dx) same("dx", dx2, dx, nd, n, D, tiers[t]);
      /* in two blocks split at a multiple of 16 rows, adding to dg and db */
      int r1 = 16 * (int)rnd((uint32_t)(n / 16 + 1));
      for (int k = 0; k < D; k++) dg2[k] = db2[k] = 0.0f;
      dp__layernorm_backward_add(r1, D, x, st, g, dy, dg2, db2, with_dx ? dx2 : NULL);
      dp__layernorm_backward_add(n - r1, D, x + (size_t)r1 * D, st + 2 * (size_t)r1, g,
                                 dy + (size_t)r1 * D, dg2, db2,
                                 with_dx ? dx2 + (size_t)r1 * D : NULL);
      same("dg in blocks", dg2, dg, (size_t)D, n, D, tiers[t]);
      same("db in blocks", db2, db, (size_t)D, n, D, tiers[t]);
      if (with_dx) same("dx in blocks", dx2, dx, nd, n, D, tiers[t]);
      free(st2), free(y2), free(dg2), free(db2), free(dx2);
    }
    free(x), free(g), free(b), free(dy), free(st), free(y), free(dg), free(db), free(dx);
  }
  dp__gemm_force_tier("auto");
  ck_assert_int_ge(ran, count);
}

START_TEST(layernorm_is_the_definition_on_every_tier) { cases(false, 200); }
END_TEST

START_TEST(layernorm_with_nans_and_infinities) { cases(true, 120); }
END_TEST

Suite *layernorm_suite(void) {
  Suite *s = suite_create("layernorm");
  TCase *tc = tcase_create("kernels");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, layernorm_is_the_definition_on_every_tier);
  tcase_add_test(tc, layernorm_with_nans_and_infinities);
  suite_add_tcase(s, tc);
  return s;
}
