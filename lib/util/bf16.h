/* fp32 <-> bf16, written once for the cpu backend and the CUDA kernels
 * (lib/cpu/bf16.c, cuda/mixed.cu): round to nearest even on the bit pattern,
 * denormals kept, infinities kept, a NaN the quiet NaN 0x7fc0 with its sign. Integer
 * operations only, so every instruction set and the GPU give the same bits.
 * Not installed. */
#ifndef DP_UTIL_BF16_H
#define DP_UTIL_BF16_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define DP_BF16_FN static __host__ __device__ __forceinline__
#else
#define DP_BF16_FN static inline
#endif

DP_BF16_FN uint16_t dp__bf16_rne(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7fc0u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

DP_BF16_FN float dp__bf16_widen(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* dp__bf16_rne with integer selects for its branch, so that loops of it
 * vectorise */
DP_BF16_FN uint16_t dp__bf16_rne_sel(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = ((u >> 16) & 0x8000u) | 0x7fc0u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

/* x rounded to bf16, as an fp32 value (with the select, so that the reduction's
 * loops of it vectorise) */
DP_BF16_FN float dp__bf16_roundf(float x) { return dp__bf16_widen(dp__bf16_rne_sel(x)); }

#endif
