/* gelu with the tanh approximation (PyTorch's approximate='tanh'), one element
 * at a time, for the cpu backend's fp32 loops (backend.c) and its bf16 ones
 * (mixed.c): one definition, so that both give the same bits on every tier
 * (ISO C, no contraction; tanh through util/tanh.h). Not installed. */
#ifndef DP_CPU_GELU_H
#define DP_CPU_GELU_H

#include "util/erf.h" /* the exact gelu: dp__gelu_erf, dp__gelu_erf_grad */
#include "util/tanh.h"

#define DP_GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define DP_GELU_A 0.044715f

static inline __attribute__((always_inline)) float dp__gelu(float v) {
  return 0.5f * v * (1.0f + dp__tanhf(DP_GELU_C * (v + DP_GELU_A * v * v * v)));
}

/* dy times gelu's derivative at v */
static inline __attribute__((always_inline)) float dp__gelu_grad(float v, float dy) {
  float t = dp__tanhf(DP_GELU_C * (v + DP_GELU_A * v * v * v));
  float dt = (1.0f - t * t) * DP_GELU_C * (1.0f + 3.0f * DP_GELU_A * v * v);
  return dy * (0.5f * (1.0f + t) + 0.5f * v * dt);
}

#endif
