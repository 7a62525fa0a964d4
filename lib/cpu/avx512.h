/* AVX-512 helpers shared by lib/cpu's kernels (the GEMM's packers, the image
 * kernels, layernorm): lane masks and the 16 x 16 register transpose (moves
 * only). Internal to lib/cpu; x86-64 with GCC or Clang only. */
#ifndef DP_AVX512_H
#define DP_AVX512_H

#include <stddef.h>
#include <immintrin.h>

/* The first n lanes of 16 (none for n <= 0, all from 16 on). */
static inline __mmask16 dp__lanes16(ptrdiff_t n) {
  return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* 16 x 16 transpose in registers: rows r[0..15] in, columns out. */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
dp__transpose16(__m512 r[16]) {
  __m512 a[16], b[16], c[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    b[4 * i] = _mm512_shuffle_ps(a[4 * i], a[4 * i + 2], 0x44);
    b[4 * i + 1] = _mm512_shuffle_ps(a[4 * i], a[4 * i + 2], 0xee);
    b[4 * i + 2] = _mm512_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0x44);
    b[4 * i + 3] = _mm512_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0xee);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++) {
    c[j] = _mm512_shuffle_f32x4(b[j], b[j + 4], 0x88);
    c[j + 4] = _mm512_shuffle_f32x4(b[j], b[j + 4], 0xdd);
    c[j + 8] = _mm512_shuffle_f32x4(b[j + 8], b[j + 12], 0x88);
    c[j + 12] = _mm512_shuffle_f32x4(b[j + 8], b[j + 12], 0xdd);
  }
#pragma GCC unroll 8
  for (int j = 0; j < 8; j++) {
    r[j] = _mm512_shuffle_f32x4(c[j], c[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(c[j], c[j + 8], 0xdd);
  }
}

#endif
