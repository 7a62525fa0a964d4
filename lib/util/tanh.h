/* tanh for the activations (gelu, tanh), written once for the CPU backend and
 * the CUDA kernels (lib/cpu/backend.c, cuda/kernels.cu). libm's tanhf is a
 * scalar call per element, most of a small transformer's step (its gelus);
 * this is the same IEEE operations in double on every instruction set, so it
 * vectorises (DP_SIMD_FN) and gives the same bits on every tier and on the
 * CUDA simulation. The double result is within ~1e-12 relative of tanh, so the
 * float is tanh correctly rounded but for ties closer than that. Not
 * installed. */
#ifndef DP_TANH_H
#define DP_TANH_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define DP_TANH_FN static __host__ __device__ __forceinline__
#else
#define DP_TANH_FN static inline
#endif
/* the device pass rounds every operation on its own, as the host's
 * -ffp-contract=off does (nvcc would fuse a*b+c into an fma) */
#if defined(__CUDA_ARCH__)
#define DP_DM(a, b) __dmul_rn((a), (b))
#define DP_DA(a, b) __dadd_rn((a), (b))
#define DP_DS(a, b) __dsub_rn((a), (b))
#define DP_DD(a, b) __ddiv_rn((a), (b))
#else
#define DP_DM(a, b) ((a) * (b))
#define DP_DA(a, b) ((a) + (b))
#define DP_DS(a, b) ((a) - (b))
#define DP_DD(a, b) ((a) / (b))
#endif

/* e^y for 0 <= y <= 18.1: y = n ln2 + r (Cody-Waite, |r| <= ln2 / 2), e^r by its
 * Taylor polynomial to r^9 (truncation < 1e-11 relative), times 2^n. */
DP_TANH_FN double dp__exp_small(double y) {
  const double LN2_HI = 6.93147180369123816490e-01, LN2_LO = 1.90821492927058770002e-10;
  int n = (int)DP_DA(DP_DM(y, 1.44269504088896338700e+00), 0.5);
  double r = DP_DS(DP_DS(y, DP_DM((double)n, LN2_HI)), DP_DM((double)n, LN2_LO));
  double p = 1.0 / 362880.0;
  p = DP_DA(DP_DM(p, r), 1.0 / 40320.0);
  p = DP_DA(DP_DM(p, r), 1.0 / 5040.0);
  p = DP_DA(DP_DM(p, r), 1.0 / 720.0);
  p = DP_DA(DP_DM(p, r), 1.0 / 120.0);
  p = DP_DA(DP_DM(p, r), 1.0 / 24.0);
  p = DP_DA(DP_DM(p, r), 1.0 / 6.0);
  p = DP_DA(DP_DM(p, r), 0.5);
  p = DP_DA(DP_DM(p, r), 1.0);
  p = DP_DA(DP_DM(p, r), 1.0);
  uint64_t bits = (uint64_t)(n + 1023) << 52;
  double s;
  memcpy(&s, &bits, 8);
  return DP_DM(p, s);
}

DP_TANH_FN uint32_t dp__f32_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

DP_TANH_FN float dp__f32_of(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

/* tanh(x): (e - 1) / (e + 1), e = e^(2|x|), with x's sign; x itself below 2^-14
 * (tanh x = x - x^3/3: the float is x), +-1 from 9 on (tanh rounds to 1 there);
 * NaN passes through. The selects compare bit patterns (|x|'s order is its
 * bits' order): integer selects vectorise, float compares may trap and do not. */
DP_TANH_FN float dp__tanhf(float x) {
  const uint32_t NINE = 0x41100000u, ONE = 0x3f800000u, TINY = 0x38800000u; /* 2^-14 */
  uint32_t xb = dp__f32_bits(x), ab = xb & 0x7fffffffu;
  uint32_t cb = ab < NINE ? ab : NINE; /* e^(2a) in exp_small's range */
  double a = (double)dp__f32_of(cb);
  double e = dp__exp_small(DP_DA(a, a));
  uint32_t tb = dp__f32_bits((float)DP_DD(DP_DS(e, 1.0), DP_DA(e, 1.0)));
  /* masks, not ?: (which the compiler turns into branches around the float work) */
  uint32_t big = 0u - (uint32_t)(ab >= NINE), tiny = 0u - (uint32_t)(ab < TINY);
  uint32_t nan = 0u - (uint32_t)(ab > 0x7f800000u);
  tb = (tb & ~big) | (ONE & big);
  tb = (tb & ~tiny) | (ab & tiny);
  tb |= xb & 0x80000000u;
  return dp__f32_of((tb & ~nan) | (xb & nan));
}

#endif
