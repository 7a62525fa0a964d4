/* e^x in float for the softmaxes, the loss, sigmoid and tanh, written once for the
 * CPU backend and the CUDA kernels (lib/cpu/softmax.c, lib/cpu/backend.c,
 * cuda/sequence.cu, cuda/kernels.cu), and the 16-lane order of the CPU's row sums.
 *
 * Why not libm's expf: it is a scalar call per element (half of a causal
 * softmax's time), its bits are glibc's (an FMA and a non-FMA variant) on the
 * host and CUDA's (2 ulp) on a GPU. This is a fixed sequence of IEEE float
 * multiplies, adds and integer selects, none fused (-ffp-contract=off; nvcc:
 * the _rn intrinsics), so it vectorises (DP_SIMD_FN) and gives the same bits on
 * every tier and on the CUDA simulation, and by construction on a GPU (not yet
 * run on one; NaN payloads aside). Error: within 1.5 ulp of e^x over the float
 * range (tests/test_softmax.c measures it). Not installed. */
#ifndef DP_EXPF_H
#define DP_EXPF_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define DP_FMATH_FN static __host__ __device__ __forceinline__
#else
#define DP_FMATH_FN static inline
#endif

#if defined(__CUDA_ARCH__)
#define DP_FM(a, b) __fmul_rn((a), (b))
#define DP_FA(a, b) __fadd_rn((a), (b))
#define DP_FS(a, b) __fsub_rn((a), (b))
#define DP_FD(a, b) __fdiv_rn((a), (b))
#else
#define DP_FM(a, b) ((a) * (b))
#define DP_FA(a, b) ((a) + (b))
#define DP_FS(a, b) ((a) - (b))
#define DP_FD(a, b) ((a) / (b))
#endif

DP_FMATH_FN uint32_t dp__f32_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

DP_FMATH_FN float dp__f32_of(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

/* e^x's reduction and polynomial, x in [-104, 89]: n = x / ln2 rounded to
 * nearest even (the 1.5 * 2^23 shift) into *n, r = x - n ln2 (Cody-Waite: n *
 * C1 is exact, C1 has 9 significant bits), and e^r by its Taylor polynomial to
 * r^7 (|r| <= 0.347: truncation < 6e-9 relative), returned. */
DP_FMATH_FN float dp__expf_poly(float x, int32_t *n) {
  const uint32_t SHIFT_B = 0x4b400000u;
  const float LOG2E = 1.44269504088896341f, SHIFT = 12582912.0f;
  const float C1 = 0.693359375f, C2 = -2.12194440e-4f;
  float t = DP_FA(DP_FM(x, LOG2E), SHIFT);
  *n = (int32_t)(dp__f32_bits(t) - SHIFT_B); /* -150 .. 129 */
  float nf = DP_FS(t, SHIFT);
  float r = DP_FS(DP_FS(x, DP_FM(nf, C1)), DP_FM(nf, C2));
  float p = 1.0f / 5040.0f;
  p = DP_FA(DP_FM(p, r), 1.0f / 720.0f);
  p = DP_FA(DP_FM(p, r), 1.0f / 120.0f);
  p = DP_FA(DP_FM(p, r), 1.0f / 24.0f);
  p = DP_FA(DP_FM(p, r), 1.0f / 6.0f);
  p = DP_FA(DP_FM(p, r), 0.5f);
  p = DP_FA(DP_FM(p, r), 1.0f);
  return DP_FA(DP_FM(p, r), 1.0f);
}

/* e^x: x clamped to [-104, 89] (e^-104 rounds to +0, e^89 overflows to +inf),
 * then dp__expf_poly's p 2^n in two exact powers of two (2^n alone is not a
 * float below n = -126, where the result is subnormal: the second multiply
 * rounds it once). NaN passes through. The selects compare bit patterns
 * (|x|'s order is its bits' order): integer selects vectorise, float compares
 * may trap and do not. */
DP_FMATH_FN float dp__expf(float x) {
  const uint32_t LO = 0xc2d00000u, HI = 0x42b20000u; /* -104, 89 */
  uint32_t xb = dp__f32_bits(x), ab = xb & 0x7fffffffu;
  uint32_t neg = 0u - (xb >> 31), nan = 0u - (uint32_t)(ab > 0x7f800000u);
  uint32_t lo = neg & (0u - (uint32_t)(xb > LO)), hi = ~neg & (0u - (uint32_t)(xb > HI));
  uint32_t cb = (xb & ~(lo | hi)) | (LO & lo) | (HI & hi);
  int32_t n;
  float p = dp__expf_poly(dp__f32_of(cb & ~nan), &n); /* NaN: any x; replaced below */
  uint32_t half = ((uint32_t)(n + 150) >> 1) - 75u; /* n1 = floor(n / 2), as unsigned */
  uint32_t s1 = (half + 127u) << 23, s2 = ((uint32_t)n - half + 127u) << 23;
  float y = DP_FM(DP_FM(p, dp__f32_of(s1)), dp__f32_of(s2));
  uint32_t yb = dp__f32_bits(y);
  return dp__f32_of((yb & ~nan) | (xb & nan));
}

/* dp__expf for x in [0, 20] (tanh's e^(2|x|), util/tanh.h), with its bits:
 * there nothing is clamped and nothing is NaN, n is 0 .. 29 and the result
 * p 2^n is normal, so dp__expf's two exact multiplies by powers of two are
 * one. A third fewer operations. */
DP_FMATH_FN float dp__expf_0_20(float x) {
  int32_t n;
  float p = dp__expf_poly(x, &n);
  return DP_FM(p, dp__f32_of(((uint32_t)n + 127u) << 23));
}

/* The row sums of the CPU's softmaxes (and the attention backward's dot): 16
 * lanes, lane l adding the terms j = l, l + 16, l + 32, ... ascending from +0,
 * then a halving tree, lane l + w into lane l for w = 8, 4, 2, 1. The same order
 * on every tier (a zmm, two ymm or a loop) and in the CUDA attention kernels
 * (the CUDA loss keeps its warp lanes). */
#define DP_SUM_LANES 16

DP_FMATH_FN float dp__lanes_total(float a[DP_SUM_LANES]) {
  for (int w = DP_SUM_LANES / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; l++) a[l] = DP_FA(a[l], a[l + w]);
  return a[0];
}

#endif
