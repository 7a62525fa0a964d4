/* tanh for the activations (gelu, tanh), written once for the CPU backend and
 * the CUDA kernels (lib/cpu/backend.c, cuda/kernels.cu). libm's tanhf is a
 * scalar call per element, most of a small transformer's step (its gelus);
 * this is a fixed sequence of IEEE float operations and integer selects, none
 * fused (util/expf.h), so it vectorises (DP_SIMD_FN) and gives the same bits
 * on every tier, on the CUDA simulation and on a GPU. Error: within 1.5 ulp of
 * tanh (tests/test_softmax.c measures it). Not installed. */
#ifndef DP_TANH_H
#define DP_TANH_H

#include "util/expf.h"

#include <stdint.h>

/* tanh(x) from a = |x|: below 0.625, a + a u Q(u) (u = a^2; Q of degree 5,
 * fitted to tanh's relative error on [0, 0.625]: subnormal a gives a); from
 * 0.625 on, 1 - 2 / (e^(2a) + 1) with e^(2a) >= 3.4, so nothing cancels (a
 * clamped to 10: the float is 1 from 9.02 on); then x's sign. NaN passes
 * through. Both sides are computed and one selected by bit patterns. */
DP_FMATH_FN float dp__tanhf(float x) {
  const uint32_t SMALL = 0x3f200000u, TEN = 0x41200000u; /* 0.625, 10 */
  uint32_t xb = dp__f32_bits(x), ab = xb & 0x7fffffffu;
  uint32_t nan = 0u - (uint32_t)(ab > 0x7f800000u), small = 0u - (uint32_t)(ab < SMALL);
  float a = dp__f32_of(ab < TEN ? ab : TEN);
  float u = DP_FM(a, a), q = 0.002147649647668004f;
  q = DP_FA(DP_FM(q, u), -0.008182795718312263f);
  q = DP_FA(DP_FM(q, u), 0.021703016012907028f);
  q = DP_FA(DP_FM(q, u), -0.05394721403717995f);
  q = DP_FA(DP_FM(q, u), 0.13333210349082947f);
  q = DP_FA(DP_FM(q, u), -0.3333333134651184f);
  float tp = DP_FA(a, DP_FM(DP_FM(a, u), q));
  float e = dp__expf_0_20(DP_FA(a, a)); /* 2a in [0, 20] */
  float te = DP_FS(1.0f, DP_FD(2.0f, DP_FA(e, 1.0f)));
  uint32_t tb = (dp__f32_bits(tp) & small) | (dp__f32_bits(te) & ~small);
  tb |= xb & 0x80000000u;
  return dp__f32_of((tb & ~nan) | (xb & nan));
}

#endif
