/* The packed GEMM's machinery, shared by the fp32 GEMM (gemm.c) and the bf16
 * GEMM (bf16.c): the blocking, the tiers' micro-kernels and packers, and the
 * blocked driver. Internal to lib/cpu; see gemm.h for the fp32 contract and
 * bf16.h for the bf16 one.
 *
 * The driver (dp__gemm_drive) never computes anything itself: the packers
 * move (and, for bf16, convert and reorder) operands into slivers, the
 * micro-kernel adds one k at a time with one fma per element, and a tile's
 * final values go to C directly or through a sink (bf16: rounding, the
 * stores). So every product that runs through it keeps the per-element fma
 * sequence of its packed operands. */
#ifndef DP_GEMM_IMPL_H
#define DP_GEMM_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define DP_GEMM_X86 1
#include "cpu/avx512.h"
#include <immintrin.h>
#else
#define DP_GEMM_X86 0
#endif

/* Blocking, shared by all tiers. RM and RN are multiples of every tier's MR
 * and NR: the packed panels are rounded to them, so the workspace size does
 * not depend on the tier. */
#ifndef KC
#define KC 256 /* even: a bf16 k pair never straddles two K slices */
#endif
#ifndef MC
#define MC 96
#endif
#ifndef NC
#define NC 1024
#endif
#define RM 12
#define RN 32
#define MR_MAX 12
#define NR_MAX 32
#define STACK_WS (32 * 1024) /* problems whose panels fit here pack on the stack */
#ifndef SMALL_FMAS
#define SMALL_FMAS 512 /* problems of at most this many fmas run unpacked */
#endif
_Static_assert(KC % 2 == 0, "KC");

/* micro-kernel flags */
enum { K_LOAD = 1, K_BIAS = 2, K_RELU = 4 };

static inline size_t dp__round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
static inline int dp__imin(int a, int b) { return a < b ? a : b; }

/* An operand as the packers see it. op(A)[i][k] = trans ? p[k ld + i] : p[i ld + k];
 * op(B)[k][j] = trans ? p[j ld + k] : p[k ld + j]. */
typedef struct {
  const void *p;
  int ld, trans;
  int store; /* bf16 packers: dp_bf16_store of the elements */
  int K;     /* bf16 packers: the product's depth (k = K of an odd K is the pad) */
} dp__gemm_mat;

/* c (MR, NR; row stride ldc) = [c if K_LOAD, else 0] + a-sliver · b-sliver over
 * kc steps; then, if asked, + bias (NR) and relu. */
typedef void (*dp__kern_fn)(int kc, const float *a, const float *b, float *c, size_t ldc,
                            int flags, const float *bias);
/* Packs op(A)[i0, i0+mc) x [k0, k0+kc) into MR-tall slivers, zero rows up to mpad:
 * element (s*MR + ii, k) at s*MR*kc + k*MR + ii. */
typedef void (*dp__pack_a_fn)(float *dst, const dp__gemm_mat *A, int i0, int mc, int k0,
                              int kc, int MR, int mpad);
/* Packs op(B)[k0, k0+kc) x [j0, j0+nc) into NR-wide slivers, zero past nc:
 * the slivers of panel columns [s0, s1) (multiples of NR), at dst + s0 * kc;
 * element (k, s*NR + jj) at s*NR*kc + k*NR + jj. */
typedef void (*dp__pack_b_fn)(float *dst, const dp__gemm_mat *B, int k0, int kc, int j0,
                              int nc, int NR, int s0, int s1);
/* dp__kern_fn with op(A) read where it lies instead of from a packed sliver:
 * row i of the sliver at a + i * sa_i, its step k at + k * sa_k (MR rows that
 * exist). The same fma per element in the same order as dp__kern_fn. */
typedef void (*dp__kern_ua_fn)(int kc, const float *a, size_t sa_i, size_t sa_k,
                               const float *b, float *c, size_t ldc, int flags,
                               const float *bias);

typedef struct {
  const char *name;
  int mr, nr;
  dp__kern_fn kern;
  dp__pack_a_fn pack_a;
  dp__pack_b_fn pack_b;
  dp__kern_ua_fn kern_ua; /* NULL: A is always packed */
} dp__gemm_tier;

enum { DP_GEMM_SCALAR, DP_GEMM_AVX2, DP_GEMM_AVX512, DP_GEMM_TIERS };
extern const dp__gemm_tier dp__gemm_tiers[DP_GEMM_TIERS];
/* The tier in use (DP_GEMM_SCALAR ...), and whether the bf16 GEMM may use the
 * AVX512_BF16 instruction on the avx512 tier (not when "avx512" was named). */
int dp__gemm_tier_id(void);
bool dp__gemm_bf16_hw_allowed(void);
/* bf16.c: whether the CPU has AVX512_BF16 and its one-time self-check passed */
bool dp__gemm_bf16_hw_usable(void);

#if DP_GEMM_X86
void dp__gemm_kern_avx2(int kc, const float *a, const float *b, float *c, size_t ldc,
                        int flags, const float *bias);
void dp__gemm_kern_avx512(int kc, const float *a, const float *b, float *c, size_t ldc,
                          int flags, const float *bias);
#endif

/* A tile's final values (mr x nr at t, row stride ldt), for C rows i.., columns
 * j..: the sink writes them wherever they go. */
typedef void (*dp__gemm_sink_fn)(void *ctx, const float *t, size_t ldt, int i, int j,
                                 int mr, int nr);

/* One product for dp__gemm_drive. */
typedef struct {
  const dp__gemm_tier *t;
  int M, N, K; /* K: the packed depth */
  dp__gemm_mat A, B;
  /* fp32 partial sums (and, without a sink, the result). NULL: the partial
   * sums of `scratch_rows` rows at a time in the workspace after the B panel
   * (K > KC), or none at all (K <= KC: tiles go to the sink from the stack). */
  float *C;
  size_t ldc;
  int scratch_rows;
  const float *bias;
  int relu;
  dp__gemm_sink_fn sink; /* NULL: the results stay in C */
  void *sink_ctx;
} dp__gemm_job;

/* Floats of the packed A block and of the B panel; bytes of the whole layout
 * (A block rounded to 64 bytes, then the B panel), without scratch. */
size_t dp__gemm_a_floats(int M, int K);
size_t dp__gemm_b_floats(int N, int K);
size_t dp__gemm_layout_bytes(int M, int N, int K);

/* Runs the job with the packing buffers at ws (dp__gemm_layout_bytes, plus
 * scratch_rows x round_up(min(N, NC), RN) floats when the job needs them);
 * Bpre: op(B) already packed whole by the tier's pack_b in the layout of
 * dp__gemm_pack_b, or NULL. */
void dp__gemm_drive(const dp__gemm_job *g, float *ws, const float *Bpre);
/* The layout of dp__gemm_pack_b with the job's tier and B. */
void dp__gemm_pack_b_whole(const dp__gemm_tier *t, const dp__gemm_mat *B, int K, int N,
                           float *dst);

#if DP_GEMM_X86
#define DP_TGT_AVX2 __attribute__((target("avx2,fma")))
#define DP_AVX2_INLINE DP_TGT_AVX2 static inline __attribute__((always_inline))

/* 8 x 8 transpose: rows r[0..7] in, columns out. */
DP_AVX2_INLINE void dp__transpose8(__m256 r[8]) {
  __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* The first n (0..8) lanes. */
DP_AVX2_INLINE __m256i dp__lanes(int n) {
  static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256((const __m256i *)(const void *)(m + 8 - n));
}

/* The first cnt (1..7) lanes of v to o, without touching o[cnt..]. */
DP_AVX2_INLINE void dp__store_part(float *o, __m256 v, int cnt) {
  __m128 lo = _mm256_castps256_ps128(v);
  if (cnt >= 4) {
    _mm_storeu_ps(o, lo);
    lo = _mm256_extractf128_ps(v, 1);
    o += 4;
    cnt -= 4;
  }
  if (cnt >= 2) {
    _mm_storel_pi((__m64 *)(void *)o, lo);
    lo = _mm_movehl_ps(lo, lo);
    o += 2;
    cnt -= 2;
  }
  if (cnt) _mm_store_ss(o, lo);
}

/* The first cnt (1..8) lanes of v to o. */
DP_AVX2_INLINE void dp__store_n(float *o, __m256 v, int cnt) {
  if (cnt == 8)
    _mm256_storeu_ps(o, v);
  else
    dp__store_part(o, v, cnt);
}

#define DP_TGT_AVX512 __attribute__((target("avx512f,avx512vl,avx2,fma")))
#define DP_MR_2 6 /* the avx2 tier's tile */
#define DP_NR_2 16
#define DP_MR_5 12 /* the avx512 tier's tile */
#define DP_NR_5 32

/* The AVX-512 kernels' accumulators at the start (the partial sums of an
 * earlier K-block, or +0) and their epilogue (bias once after the whole sum,
 * relu, the store). Inlined: the accumulators stay in registers. */
DP_TGT_AVX512 static inline __attribute__((always_inline)) void
dp__avx512_start(__m512 acc[][2], const float *c, size_t ldc, int flags) {
  if (flags & K_LOAD) {
#pragma GCC unroll 12
    for (int i = 0; i < DP_MR_5; i++) {
      acc[i][0] = _mm512_loadu_ps(c + i * ldc);
      acc[i][1] = _mm512_loadu_ps(c + i * ldc + 16);
    }
  } else {
#pragma GCC unroll 12
    for (int i = 0; i < DP_MR_5; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  }
}

DP_TGT_AVX512 static inline __attribute__((always_inline)) void
dp__avx512_finish(__m512 acc[][2], float *c, size_t ldc, int flags, const float *bias) {
  if (flags & K_BIAS) {
    __m512 bb0 = _mm512_loadu_ps(bias), bb1 = _mm512_loadu_ps(bias + 16);
#pragma GCC unroll 12
    for (int i = 0; i < DP_MR_5; i++) {
      acc[i][0] = _mm512_add_ps(acc[i][0], bb0);
      acc[i][1] = _mm512_add_ps(acc[i][1], bb1);
    }
  }
  if (flags & K_RELU) {
    __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 12
    for (int i = 0; i < DP_MR_5; i++)
      for (int h = 0; h < 2; h++) /* v <= 0 -> +0; NaN (unordered) passes */
        acc[i][h] = _mm512_maskz_mov_ps(
            ~_mm512_cmp_ps_mask(acc[i][h], z, _CMP_LE_OQ) & 0xffff, acc[i][h]);
  }
#pragma GCC unroll 12
  for (int i = 0; i < DP_MR_5; i++) {
    _mm512_storeu_ps(c + i * ldc, acc[i][0]);
    _mm512_storeu_ps(c + i * ldc + 16, acc[i][1]);
  }
}
#endif /* DP_GEMM_X86 */

/* The GEMM benchmarks' harness (dp__gemm_bench, dp__gemm_bf16_bench): operands
 * A (m, k), B (n, k) and C (m, n) of esz-byte elements and ws_bytes of
 * workspace, allocated here; fill(p, count, which) writes A (which 0) and B (1);
 * run(...) is the product, called once to warm up, then iters times: *ms is the
 * mean. `who` names the caller in the errors. */
typedef void (*dp_gemm_bench_fill)(void *p, size_t count, int which);
typedef void (*dp_gemm_bench_run)(int m, int n, int k, const void *A, const void *B,
                                  void *C, void *ws);
dp_status dp__gemm_bench_with(int m, int n, int k, int iters, size_t esz, size_t ws_bytes,
                              dp_gemm_bench_fill fill, dp_gemm_bench_run run,
                              const char *who, double *ms);

#endif
