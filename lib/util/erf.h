/* erf for the exact gelu (PyTorch's nn.GELU(), approximate='none'), written
 * once for the CPU backend and the CUDA kernels (lib/cpu/gelu.h,
 * cuda/kernels.cu): a fixed sequence of IEEE float operations and integer
 * selects, none fused (util/expf.h), so it vectorises (DP_SIMD_FN) and gives
 * the same bits on every tier, on the CUDA simulation and on a GPU. libm's
 * erff is a scalar call with glibc's bits on the host and CUDA's on a GPU.
 * Coefficients: tests/fixtures/fit_erf.py. Error: within 2 ulp of erf
 * (tests/test_softmax.c measures it). Not installed. */
#ifndef DP_ERF_H
#define DP_ERF_H

#include "util/expf.h"

#include <stdint.h>

/* erf(x) from a = |x|: below 0.921875, a + a g(u) (u = a^2, g of degree 6
 * fitted to erf(a)/a - 1: subnormal a gives a rounded sum near a, exact where
 * a g underflows); from there 1 - e^(-a^2) r(1/a) (r of degree 9 fitted to
 * erfc(a) e^(a^2); a clamped to 4: the float is 1 from 3.92 on; the rounding
 * of a^2 moves erfc by a^2 2^-24 relative, under a tenth of erf's ulp); then
 * x's sign. NaN passes through. Both sides are computed and one selected by
 * bit patterns. */
DP_FMATH_FN float dp__erff(float x) {
  const uint32_t SMALL = 0x3f6c0000u, FOUR = 0x40800000u; /* 0.921875, 4 */
  uint32_t xb = dp__f32_bits(x), ab = xb & 0x7fffffffu;
  uint32_t nan = 0u - (uint32_t)(ab > 0x7f800000u), small = 0u - (uint32_t)(ab < SMALL);
  float a = dp__f32_of(ab < FOUR ? ab : FOUR);
  float u = DP_FM(a, a), g = 7.99127229e-05f;
  g = DP_FA(DP_FM(g, u), -0.000804888317f);
  g = DP_FA(DP_FM(g, u), 0.00519235898f);
  g = DP_FA(DP_FM(g, u), -0.0268557239f);
  g = DP_FA(DP_FM(g, u), 0.112836257f);
  g = DP_FA(DP_FM(g, u), -0.376126289f);
  g = DP_FA(DP_FM(g, u), 0.128379166f);
  float ep = DP_FA(a, DP_FM(a, g));
  float t = DP_FD(1.0f, dp__f32_of(ab < SMALL ? SMALL : ab < FOUR ? ab : FOUR));
  float r = 0.0201924369f;
  r = DP_FA(DP_FM(r, t), -0.12223798f);
  r = DP_FA(DP_FM(r, t), 0.302132428f);
  r = DP_FA(DP_FM(r, t), -0.353825808f);
  r = DP_FA(DP_FM(r, t), 0.0842929259f);
  r = DP_FA(DP_FM(r, t), 0.314304024f);
  r = DP_FA(DP_FM(r, t), -0.405430377f);
  r = DP_FA(DP_FM(r, t), 0.0270303823f);
  r = DP_FA(DP_FM(r, t), 0.560961306f);
  r = DP_FA(DP_FM(r, t), 0.000164249184f);
  float el = DP_FS(1.0f, DP_FM(dp__expf(-u), r));
  uint32_t eb = (dp__f32_bits(ep) & small) | (dp__f32_bits(el) & ~small);
  eb |= xb & 0x80000000u;
  return dp__f32_of((eb & ~nan) | (xb & nan));
}

/* The exact gelu, PyTorch's formula and order: (x 0.5) (1 + erf(x / sqrt 2)).
 * For x far below 0 the sum 1 + erf cancels (a few ulp of the tiny result at
 * x = -5), as in PyTorch's fp32 kernel. */
#define DP_SQRT1_2 0.7071067811865476f
#define DP_INV_SQRT_2PI 0.3989422804014327f

DP_FMATH_FN float dp__gelu_erf(float x) {
  return DP_FM(DP_FM(x, 0.5f), DP_FA(1.0f, dp__erff(DP_FM(x, DP_SQRT1_2))));
}

/* dy times the exact gelu's derivative, Phi(x) + x phi(x), phi(x) =
 * e^(-x^2/2) / sqrt(2 pi). x^2/2 rounded to a float would move e^(-x^2/2) by
 * x^2 2^-25 relative (5 ulp at x = 4), so x = h + l with h of 12 significant
 * bits: h^2/2 is exact, and e^(-x^2/2) = e^(-h^2/2) e^(-d), d = l (x + h) / 2 <=
 * x^2 2^-12, e^(-d) by its Taylor polynomial to d^4 (error d^5/120 < 3e-8
 * relative while phi(x) is a normal float, |x| < 13.2). |x| is clamped to 16
 * first (phi is 0 in float from 14 on), so that x = +-inf gives dy (Phi = 1)
 * and 0, not 0 * inf. */
DP_FMATH_FN float dp__gelu_erf_grad(float x, float dy) {
  const uint32_t SIXTEEN = 0x41800000u;
  uint32_t xb = dp__f32_bits(x), ab = xb & 0x7fffffffu;
  float c = dp__f32_of(ab < SIXTEEN ? ab : SIXTEEN);
  float h = dp__f32_of(dp__f32_bits(c) & 0xfffff000u), l = DP_FS(c, h);
  float d = DP_FM(DP_FM(l, DP_FA(c, h)), 0.5f);
  float e = DP_FA(DP_FM(d, 1.0f / 24.0f), -1.0f / 6.0f);
  e = DP_FA(DP_FM(e, d), 0.5f);
  e = DP_FA(DP_FM(e, d), -1.0f);
  e = DP_FA(DP_FM(e, d), 1.0f);
  float phi = DP_FM(DP_FM(dp__expf(-DP_FM(DP_FM(h, h), 0.5f)), e), DP_INV_SQRT_2PI);
  float xc = dp__f32_of(dp__f32_bits(c) | (xb & 0x80000000u));
  float cdf = DP_FM(0.5f, DP_FA(1.0f, dp__erff(DP_FM(x, DP_SQRT1_2))));
  return DP_FM(dy, DP_FA(cdf, DP_FM(xc, phi)));
}

#endif
