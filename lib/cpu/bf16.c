/* bf16 conversions and the bf16 GEMM. See bf16.h for the contract; the notes
 * here are about how it is kept.
 *
 * The emulation tiers run the fp32 GEMM's driver and micro-kernels
 * (gemm_impl.h) on operands the packers here widen to fp32: the k order is
 * swapped within each pair (packed step k' holds element k' ^ 1), and an odd
 * K gets the pad (-0 in A, +0 in B: fma(-0, +0, acc) = acc, signed zeros
 * included) as element K. The fp32 GEMM's contract on those slivers (one fma
 * per packed step, ascending) then is this one's, given DAZ and FTZ: MXCSR's
 * on x86 (which also makes the epilogue's bias add add_d), in software on the
 * scalar tier (its packers zero denormals as they widen, fma_ftz flushes). The avx512bf16
 * tier packs bf16 pairs instead and runs the instruction. Every tier writes a tile's final
 * values through a sink here: NaN to the default NaN, then the store's rounding. */
#include "cpu/bf16.h"
#include "util/bf16.h"
#include "cpu/gemm_impl.h"

#include <float.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* Rows of fp32 partial sums in the workspace at a time, for results stored as
 * bf16 with K > KC (a multiple of MC: each pass packs B once more). */
#ifndef SCRATCH_ROWS
#define SCRATCH_ROWS (4 * MC)
#endif
#define DEFAULT_NAN 0x7fc00000u
/* fp32 results at least this large are stored past the caches (the HW tier) */
#define STREAM_BYTES ((size_t)2 << 20)
/* Packed B read by the unpacked path (dp__gemm_bf16_pb without workspace):
 * dp__gemm_mat.store of widened slivers and of bf16 pairs. */
enum { STORE_PACKED_W = 8, STORE_PACKED_P = 9 };

static inline uint32_t f2u(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static inline float u2f(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* ---- conversions ----------------------------------------------------------- */

/* The scalar rounding is lib/util/bf16.h's, shared with the CUDA kernels: RNE
 * by adding 0x7fff and the kept part's lowest bit (a carry runs into the
 * exponent, up to inf); NaN to the quiet NaN. */
dp_bf16 dp__bf16_from_f32(float x) { return dp__bf16_rne(x); }
float dp__bf16_to_f32(dp_bf16 h) { return dp__bf16_widen(h); }

/* Branch-free copies of the above, so that the loops vectorise. */
static inline DP_SIMD_BODY int from_n_body(const float *restrict x, dp_bf16 *restrict y,
                                           size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = dp__bf16_rne_sel(x[i]);
  return 0;
}
DP_SIMD_FN(from_n, (const float *restrict x, dp_bf16 *restrict y, size_t n), (x, y, n))

static inline DP_SIMD_BODY int to_n_body(const dp_bf16 *restrict x, float *restrict y,
                                         size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = u2f((uint32_t)x[i] << 16);
  return 0;
}
DP_SIMD_FN(to_n, (const dp_bf16 *restrict x, float *restrict y, size_t n), (x, y, n))

static inline DP_SIMD_BODY int round_n_body(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u = f2u(x[i]);
    uint32_t r = (u + 0x7fffu + (u >> 16 & 1u)) & 0xffff0000u,
             q = (u & 0x80000000u) | DEFAULT_NAN;
    x[i] = u2f((u & 0x7fffffffu) > 0x7f800000u ? q : r);
  }
  return 0;
}
DP_SIMD_FN(round_n, (float *x, size_t n), (x, n))

void dp__bf16_to_f32_n(const dp_bf16 *x, float *y, size_t n) { to_n(x, y, n); }
void dp__bf16_round_f32_n(float *x, size_t n) { round_n(x, n); }

static inline DP_SIMD_BODY int colsum_body(int M, int N, const dp_bf16 *restrict A, int lda,
                                           float *restrict out) {
  for (int j = 0; j < N; j++) out[j] = 0.0f;
  for (int i = 0; i < M; i++) {
    const dp_bf16 *a = A + (size_t)i * lda;
    for (int j = 0; j < N; j++) out[j] += u2f((uint32_t)a[j] << 16);
  }
  return 0;
}
DP_SIMD_FN(colsum, (int M, int N, const dp_bf16 *restrict A, int lda, float *restrict out),
           (M, N, A, lda, out))

void dp__gemm_bf16_colsum(int M, int N, const dp_bf16 *A, int lda, float *out) {
  colsum(M, N, A, lda, out);
}

/* ---- the arithmetic in software -------------------------------------------- */

/* A bf16 widened for the kernels: exact, a denormal to a zero of its sign. */
static inline float widen_daz(uint16_t h) {
  return u2f(h & 0x7f80u ? (uint32_t)h << 16 : (uint32_t)(h & 0x8000u) << 16);
}

static inline float daz(float x) {
  uint32_t u = f2u(x);
  return u & 0x7f800000u ? x : u2f(u & 0x80000000u);
}

/* Whether a b + c, whose correctly rounded value is ±FLT_MIN, is tiny: below
 * FLT_MIN - 2^-151 in magnitude (rounded to 24 bits with an unbounded
 * exponent, FLT_MIN - 2^-151 itself goes up to FLT_MIN, its even neighbour).
 * Exactly: the product of two floats is exact in double, the sum is s + e
 * (TwoSum), and s is that sum rounded, so it decides unless it is the bound. */
static bool tiny_at_min(float a, float b, float c) {
  double p = (double)a * b, s = p + c, v = s - p, e = (p - (s - v)) + (c - v);
  const double lim = 0x1.ffffffp-127;
  if (s < 0) s = -s, e = -e;
  return s < lim || (s == lim && e < 0);
}

/* fma_d for inputs that are not denormal (widen_daz'd operands, an acc that
 * fma_ftz made): fmaf, then FTZ. Only a result of magnitude FLT_MIN needs a
 * second look: fmaf rounds to the denormal grid, FTZ decides on 24 bits. */
static inline float fma_ftz(float a, float b, float c) {
  float r = fmaf(a, b, c), m = fabsf(r);
  if (!(m <= FLT_MIN) || m == 0.0f) return r; /* NaN too */
  if (m < FLT_MIN || tiny_at_min(a, b, c)) return copysignf(0.0f, r);
  return r;
}

/* The epilogue of one element with add_d: an exact sum (a tiny sum always
 * is), so tiny means denormal. */
static inline float epi_ftz(float acc, const float *bias, int j, int relu) {
  if (bias) {
    acc = acc + daz(bias[j]);
    if (fabsf(acc) < FLT_MIN) acc = copysignf(0.0f, acc);
  }
  if (relu) acc = acc <= 0.0f ? 0.0f : acc;
  return acc;
}

/* ---- operands, one element at a time ---------------------------------------- */

/* The bf16 bits of element (lane, k) of an operand: op(A)[lane][k] with
 * kmajor = A.trans, op(B)[k][lane] with kmajor = !B.trans; or of a packed B. */
static uint16_t packed_bits(const dp__gemm_mat *m, int k, int j);
static inline uint16_t elem_bits(const dp__gemm_mat *m, bool kmajor, int lane, int k) {
  size_t at = kmajor ? (size_t)k * m->ld + lane : (size_t)lane * m->ld + k;
  switch (m->store) {
  case DP_BF16_STORE_BF16: return ((const dp_bf16 *)m->p)[at];
  case DP_BF16_STORE_F32: return dp__bf16_rne(((const float *)m->p)[at]);
  default: return packed_bits(m, k, lane);
  }
}

/* The store of one final value. */
static inline void store_one(void *C, size_t at, int c_store, float v) {
  uint32_t u = v != v ? DEFAULT_NAN : f2u(v);
  if (c_store == DP_BF16_STORE_BF16)
    ((dp_bf16 *)C)[at] = dp__bf16_rne(u2f(u));
  else if (c_store == DP_BF16_STORE_F32_ROUNDED)
    ((float *)C)[at] = dp__bf16_roundf(u2f(u));
  else
    ((float *)C)[at] = u2f(u);
}

/* One product for the tiers. */
typedef struct {
  int M, N, K; /* K: the true depth */
  dp__gemm_mat A, B;
  void *C;
  int ldc, c_store;
  const float *bias;
  int relu;
  bool stream; /* sink_avx512: C is large, written past the caches */
} call;

/* The unpacked path: the contract element by element, FMA being fma_ftz
 * (software) or the fma instruction under MXCSR's DAZ and FTZ. */
#define UNPACKED_BODY(FMA)                                                                 \
  const dp__gemm_mat *A = &c->A, *B = &c->B;                                               \
  for (int i = 0; i < c->M; i++)                                                           \
    for (int j = 0; j < c->N; j++) {                                                       \
      float acc = 0.0f;                                                                    \
      for (int k = 0; k < c->K; k += 2) {                                                  \
        if (k + 1 < c->K)                                                                  \
          acc = FMA(widen_daz(elem_bits(A, A->trans, i, k + 1)),                           \
                    widen_daz(elem_bits(B, !B->trans, j, k + 1)), acc);                    \
        acc = FMA(widen_daz(elem_bits(A, A->trans, i, k)),                                 \
                  widen_daz(elem_bits(B, !B->trans, j, k)), acc);                          \
      }                                                                                    \
      store_one(c->C, (size_t)i * c->ldc + j, c->c_store,                                  \
                epi_ftz(acc, c->bias, j, c->relu));                                        \
    }

static void unpacked_sw(const call *c){UNPACKED_BODY(fma_ftz)}
#if DP_GEMM_X86
DP_TGT_AVX2 static void unpacked_fma(const call *c) {
  UNPACKED_BODY(__builtin_fmaf)
}
#endif

/* ---- scalar tier: widened slivers, fma_ftz ---------------------------------- */

/* W lanes [lane0, lane0 + n) (zero up to W) at packed steps [k0, k0 + kc):
 * step k holds element k ^ 1, widened; the pad past K. */
static void sliver_w_c(float *d, const dp__gemm_mat *m, bool kmajor, int lane0, int n,
                       int W, int k0, int kc, float pad) {
  for (int k = k0; k < k0 + kc; k++, d += W) {
    int ko = k ^ 1;
    for (int l = 0; l < W; l++)
      d[l] = l >= n      ? 0.0f
             : ko < m->K ? widen_daz(elem_bits(m, kmajor, lane0 + l, ko))
                         : pad;
  }
}

static int clamp_lanes(int n, int W) { return n < 0 ? 0 : n < W ? n : W; }

static void pack_a_w_c(float *dst, const dp__gemm_mat *A, int i0, int mc, int k0, int kc,
                       int MR, int mpad) {
  for (int s = 0; s < mpad; s += MR)
    sliver_w_c(dst + (size_t)s * kc, A, A->trans, i0 + s, clamp_lanes(mc - s, MR), MR, k0,
               kc, -0.0f);
}

static void pack_b_w_c(float *dst, const dp__gemm_mat *B, int k0, int kc, int j0, int nc,
                       int NR, int s0, int s1) {
  for (int s = s0; s < s1; s += NR)
    sliver_w_c(dst + (size_t)s * kc, B, !B->trans, j0 + s, clamp_lanes(nc - s, NR), NR, k0,
               kc, 0.0f);
}

#define MR_S 4
#define NR_S 8

static void kern_scalar(int kc, const float *a, const float *b, float *c, size_t ldc,
                        int flags, const float *bias) {
  float acc[MR_S][NR_S];
  for (int i = 0; i < MR_S; i++)
    for (int j = 0; j < NR_S; j++) acc[i][j] = flags & K_LOAD ? c[i * ldc + j] : 0.0f;
  for (int k = 0; k < kc; k++, a += MR_S, b += NR_S)
    for (int i = 0; i < MR_S; i++)
      for (int j = 0; j < NR_S; j++) acc[i][j] = fma_ftz(a[i], b[j], acc[i][j]);
  for (int i = 0; i < MR_S; i++)
    for (int j = 0; j < NR_S; j++)
      c[i * ldc + j] = epi_ftz(acc[i][j], flags & K_BIAS ? bias : NULL, j, flags & K_RELU);
}

/* A tile's final values to C (call), one at a time. */
static void sink_c(void *ctx, const float *t, size_t ldt, int i, int j, int mr, int nr) {
  const call *c = ctx;
  for (int r = 0; r < mr; r++)
    for (int q = 0; q < nr; q++)
      store_one(c->C, (size_t)(i + r) * c->ldc + j + q, c->c_store, t[r * ldt + q]);
}

/* ---- bf16 pairs (the avx512bf16 tier; any CPU can pack them) ---------------- */

/* W lanes at pair steps [k0, k0 + kc) (k0, kc even): word (k - k0) / 2 * W + l
 * holds elements k (low half) and k + 1; the pad past K; not DAZ'd (the
 * instruction is). */
static void sliver_p_c(uint32_t *d, const dp__gemm_mat *m, bool kmajor, int lane0, int n,
                       int W, int k0, int kc, uint16_t pad) {
  for (int k = k0; k < k0 + kc; k += 2, d += W)
    for (int l = 0; l < W; l++) {
      uint32_t lo = l < n ? elem_bits(m, kmajor, lane0 + l, k) : 0;
      uint32_t hi = l >= n         ? 0
                    : k + 1 < m->K ? elem_bits(m, kmajor, lane0 + l, k + 1)
                                   : pad;
      d[l] = lo | hi << 16;
    }
}

#if !DP_GEMM_X86 /* x86: the AVX2 copies below */
static void pack_a_p_c(float *dst, const dp__gemm_mat *A, int i0, int mc, int k0, int kc,
                       int MR, int mpad) {
  for (int s = 0; s < mpad; s += MR)
    sliver_p_c((uint32_t *)(void *)(dst + (size_t)s * kc), A, A->trans, i0 + s,
               clamp_lanes(mc - s, MR), MR, k0, kc, 0x8000u);
}

static void pack_b_p_c(float *dst, const dp__gemm_mat *B, int k0, int kc, int j0, int nc,
                       int NR, int s0, int s1) {
  for (int s = s0; s < s1; s += NR)
    sliver_p_c((uint32_t *)(void *)(dst + (size_t)s * kc), B, !B->trans, j0 + s,
               clamp_lanes(nc - s, NR), NR, k0, kc, 0);
}
#endif

/* Element (k, j) of op(B) packed whole by dp__gemm_pack_b_whole (m->ld: N,
 * m->K: the true K, m->trans: the tier's NR): block (jc, pc) at
 * jc K' + round_up(nc, RN) pc, sliver s at + s kc. */
static uint16_t packed_bits(const dp__gemm_mat *m, int k, int j) {
  int Kp = m->K + (m->K & 1), N = m->ld, NR = m->trans;
  int jc = j / NC * NC, pc = k / KC * KC, kc = dp__imin(KC, Kp - pc);
  size_t rn_end = dp__round_up((size_t)dp__imin(NC, N - jc), RN);
  const float *sl = (const float *)m->p + (size_t)jc * Kp + rn_end * pc +
                    (size_t)((j - jc) / NR * NR) * kc;
  int jj = (j - jc) % NR;
  if (m->store == STORE_PACKED_W)
    return (uint16_t)(f2u(sl[(size_t)((k ^ 1) - pc) * NR + jj]) >> 16);
  uint32_t w = ((const uint32_t *)(const void *)sl)[(size_t)(k - pc) / 2 * NR + jj];
  return (uint16_t)(k & 1 ? w >> 16 : w & 0xffffu);
}

#if DP_GEMM_X86
/* ---- AVX2 packers of widened slivers (the avx2 and avx512 tiers) ------------ */

#define TGT DP_TGT_AVX2
#define INL DP_AVX2_INLINE

/* round_bits of 8 fp32 bit patterns, the bf16 in the upper halves. */
INL __m256i round8(__m256i u) {
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u));
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                   _mm256_set1_epi32(0x7f800000));
  __m256i q = _mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32((int)0x80000000u)),
                              _mm256_set1_epi32((int)DEFAULT_NAN));
  return _mm256_blendv_epi8(r, q, nan);
}

/* 8 elements [at, at + 8) of the operand's storage as fp32 bit patterns
 * (bf16 in the upper halves; denormals stay: MXCSR's DAZ zeroes them in the
 * kernels, the instruction does itself). */
INL __m256i ld8(const dp__gemm_mat *m, size_t at) {
  if (m->store == DP_BF16_STORE_BF16)
    return _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                                 (const __m128i *)((const dp_bf16 *)m->p + at))),
                             16);
  return round8(
      _mm256_loadu_si256((const __m256i *)(const void *)((const float *)m->p + at)));
}

/* The same for n (0..8) elements, 0 past them. */
INL __m256i ld8_part(const dp__gemm_mat *m, size_t at, int n) {
  if (n == 8) return ld8(m, at);
  if (m->store == DP_BF16_STORE_BF16) {
    const dp_bf16 *p = (const dp_bf16 *)m->p + at;
    __m128i h;
    if (n == 4) {
      h = _mm_loadl_epi64((const __m128i *)(const void *)p);
    } else {
      dp_bf16 t[8] = {0};
      memcpy(t, p, (size_t)n * sizeof *p);
      h = _mm_loadu_si128((const __m128i *)(const void *)t);
    }
    return _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
  }
  return round8(
      _mm256_castps_si256(_mm256_maskload_ps((const float *)m->p + at, dp__lanes(n))));
}

/* Slivers of width W over lanes [lane0, lane0 + n), zero up to npad, of a
 * k-major operand (lane l of element k at k ld + l): packed step k is source
 * row k ^ 1 (the pad past K), widened. 8 steps of every sliver at a time, so
 * that the source is read along its rows. */
TGT static void pack_km_w(float *dst, int W, const dp__gemm_mat *m, int lane0, int n,
                          int npad, int k0, int kc, float pad) {
  const __m256 pv = _mm256_set1_ps(pad);
  for (int kb = k0; kb < k0 + kc; kb += 8)
    for (int s = 0; s < npad; s += W) {
      float *d = dst + (size_t)s * kc + (size_t)(kb - k0) * W;
      for (int k = kb; k < dp__imin(kb + 8, k0 + kc); k++, d += W) {
        int ko = k ^ 1;
        size_t row = (size_t)ko * m->ld + (size_t)(lane0 + s);
        for (int g = 0; g < W; g += 8) {
          int cnt = dp__imin(8, W - g), h = n - s - g; /* lanes there (any number) */
          __m256 v = ko >= m->K ? pv
                     : h >= 8
                         ? _mm256_castsi256_ps(ld8(m, row + g))
                         : _mm256_castsi256_ps(ld8_part(m, row + g, clamp_lanes(h, cnt)));
          dp__store_n(d + g, v, cnt);
        }
      }
    }
}

/* The same for a lane-major operand (lane l of element k at l ld + k): 8
 * elements of 8 lanes, transposed; step k takes transposed row k ^ 1. Blocks
 * past K (and the K slice's last, if short) go one element at a time. */
TGT static void pack_lm_w(float *dst, int W, const dp__gemm_mat *m, int lane0, int n,
                          int npad, int k0, int kc, float pad) {
  for (int s = 0; s < npad; s += W)
    for (int k = k0; k < k0 + kc; k += 8) {
      int kn = dp__imin(8, k0 + kc - k);
      float *d = dst + (size_t)s * kc + (size_t)(k - k0) * W;
      if (kn < 8 || k + 8 > m->K) {
        sliver_w_c(d, m, false, lane0 + s, clamp_lanes(n - s, W), W, k, kn, pad);
        continue;
      }
      for (int g = 0; g < W; g += 8, d += 8) {
        int cnt = dp__imin(8, W - g), valid = clamp_lanes(n - s - g, cnt);
        __m256 r[8];
        for (int l = 0; l < 8; l++)
          r[l] = l < valid
                     ? _mm256_castsi256_ps(ld8(m, (size_t)(lane0 + s + g + l) * m->ld + k))
                     : _mm256_setzero_ps();
        dp__transpose8(r);
        for (int kk = 0; kk < 8; kk++) dp__store_n(d + (size_t)kk * W, r[kk ^ 1], cnt);
      }
    }
}

TGT static void pack_a_w_avx2(float *dst, const dp__gemm_mat *A, int i0, int mc, int k0,
                              int kc, int MR, int mpad) {
  (A->trans ? pack_km_w : pack_lm_w)(dst, MR, A, i0, mc, mpad, k0, kc, -0.0f);
}

TGT static void pack_b_w_avx2(float *dst, const dp__gemm_mat *B, int k0, int kc, int j0,
                              int nc, int NR, int s0, int s1) {
  (B->trans ? pack_lm_w : pack_km_w)(dst + (size_t)s0 * kc, NR, B, j0 + s0, nc - s0,
                                     s1 - s0, k0, kc, 0.0f);
}

/* ---- AVX-512F packers of bf16 pairs (the avx512bf16 tier: it runs on the
 * avx512 tier only) ---------------------------------------------------------- */

#define TGT5 DP_TGT_AVX512
#define PF_PAIRS 4
#define INL5 DP_TGT_AVX512 static inline __attribute__((always_inline))

/* round_bits of 16 fp32 bit patterns, the bf16 in the upper halves (the
 * lower halves are not cleared: callers shift or mask them away). */
INL5 __m512i round16(__m512i u) {
  __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  __m512i r = _mm512_add_epi32(
      u, _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                          _mm512_set1_epi32(0x7fff)));
  __m512i q = _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi32((int)0x80000000u)),
                              _mm512_set1_epi32((int)DEFAULT_NAN));
  return _mm512_mask_mov_epi32(r, nan, q);
}

/* n (0..16) elements [at, at + n) of the storage as bf16 in the upper halves
 * of 16 words, 0 past them. */
INL5 __m512i ld16_hi(const dp__gemm_mat *m, size_t at, int n) {
  if (m->store == DP_BF16_STORE_BF16) {
    const dp_bf16 *p = (const dp_bf16 *)m->p + at;
    __m256i h;
    if (n == 16) {
      h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    } else {
      dp_bf16 t[16] = {0};
      memcpy(t, p, (size_t)n * sizeof *p);
      h = _mm256_loadu_si256((const __m256i *)(const void *)t);
    }
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
  }
  __mmask16 k = (__mmask16)((1u << n) - 1u);
  return round16(_mm512_maskz_loadu_epi32(k, (const float *)m->p + at));
}

/* Slivers of bf16 pairs (sliver_p_c's layout) of a k-major operand: rows k
 * and k + 1 (the pad for k + 1 = K) merged word by word, low and high
 * halves; a pair of rows along its length into every sliver, then the
 * next. */
TGT5 static void pack_km_p(float *dst, int W, const dp__gemm_mat *m, int lane0, int n,
                           int npad, int k0, int kc, uint16_t pad) {
  const __m512i pv = _mm512_set1_epi32((int)((uint32_t)pad << 16));
  int lanes = dp__imin(n, npad); /* read per row (none: slivers of zeros only) */
  size_t esz = m->store == DP_BF16_STORE_BF16 ? 2 : 4,
         span = lanes > 0 ? (size_t)lanes * esz : 0;
  for (int k = k0; k < k0 + kc; k += 2) { /* rows k and k + 1, along their length */
    size_t row = (size_t)k * m->ld + (size_t)lane0;
    uint32_t *d = (uint32_t *)(void *)dst + (size_t)(k - k0) / 2 * W;
    /* rows 4 pairs ahead: an A block reads a few lines of each of rows far
     * apart, which the prefetchers do not follow (the loads were most of
     * the packing's time) */
    if (k + PF_PAIRS * 2 + 1 < dp__imin(k0 + kc, m->K)) {
      const char *q = (const char *)m->p + (row + (size_t)PF_PAIRS * 2 * m->ld) * esz;
      for (size_t b = 0; b < span; b += 64) {
        __builtin_prefetch(q + b, 0, 3);
        __builtin_prefetch(q + (size_t)m->ld * esz + b, 0, 3);
      }
    }
    for (int s = 0; s < npad; s += W, d += (size_t)W * kc)
      for (int g = 0; g < W; g += 16) {
        /* all 16 lanes read where the operand has them (A's slivers are 12
         * wide: the 4 past it are not stored), else zeros past its end */
        int cnt = dp__imin(16, W - g), v = clamp_lanes(n - s - g, 16);
        __m512i lo = ld16_hi(m, row + (size_t)(s + g), v);
        __m512i hi = k + 1 >= m->K ? pv : ld16_hi(m, row + m->ld + (size_t)(s + g), v);
        /* (lo >> 16) | (hi & 0xffff0000) */
        __m512i w = _mm512_ternarylogic_epi32(_mm512_srli_epi32(lo, 16), hi,
                                              _mm512_set1_epi32((int)0xffff0000u), 0xf8);
        /* whole stores (masked ones take twice as long): a 12-lane sliver's 4
         * extra words spill into its next pair's slot, stored at the next k;
         * but for the panel's last pair, which ends the sliver */
        if (cnt == 16 || k + 2 < k0 + kc)
          _mm512_storeu_si512((void *)(d + g), w);
        else
          _mm512_mask_storeu_epi32(d + g, (__mmask16)((1u << cnt) - 1u), w);
      }
  }
}

/* 16 elements [at, at + 16) of the storage as 8 bf16 pairs. */
INL5 __m256i ld16_pairs(const dp__gemm_mat *m, size_t at) {
  if (m->store == DP_BF16_STORE_BF16)
    return _mm256_loadu_si256((const __m256i *)(const void *)((const dp_bf16 *)m->p + at));
  __m512i u = round16(_mm512_loadu_si512((const void *)((const float *)m->p + at)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
}

/* The same for a lane-major operand: 8 pairs of 8 lanes, transposed as
 * 32-bit words; blocks of 16 whole elements first, 8 lanes at a time along
 * their rows (8 streams the prefetchers follow), then the blocks past K (and
 * a short last one) one element at a time. */
TGT5 static void pack_lm_p(float *dst, int W, const dp__gemm_mat *m, int lane0, int n,
                           int npad, int k0, int kc, uint16_t pad) {
  int kend = k0;
  while (kend + 16 <= k0 + kc && kend + 16 <= m->K) kend += 16;
  for (int s = 0; s < npad; s += W) {
    uint32_t *d0 = (uint32_t *)(void *)(dst + (size_t)s * kc);
    for (int g = 0; g < W; g += 8) {
      int cnt = dp__imin(8, W - g), valid = clamp_lanes(n - s - g, cnt);
      size_t row = (size_t)(lane0 + s + g) * m->ld;
      for (int k = k0; k < kend; k += 16) {
        uint32_t *d = d0 + (size_t)(k - k0) / 2 * W + g;
        __m256 r[8];
        for (int l = 0; l < 8; l++)
          r[l] = l < valid ? _mm256_castsi256_ps(ld16_pairs(m, row + (size_t)l * m->ld + k))
                           : _mm256_setzero_ps();
        dp__transpose8(r);
        for (int kk = 0; kk < 8; kk++)
          dp__store_n((float *)(void *)(d + (size_t)kk * W), r[kk], cnt);
      }
    }
    for (int k = kend; k < k0 + kc; k += 16)
      sliver_p_c(d0 + (size_t)(k - k0) / 2 * W, m, false, lane0 + s, clamp_lanes(n - s, W),
                 W, k, dp__imin(16, k0 + kc - k), pad);
  }
}

TGT5 static void pack_a_p_avx512(float *dst, const dp__gemm_mat *A, int i0, int mc, int k0,
                                 int kc, int MR, int mpad) {
  (A->trans ? pack_km_p : pack_lm_p)(dst, MR, A, i0, mc, mpad, k0, kc, 0x8000u);
}

TGT5 static void pack_b_p_avx512(float *dst, const dp__gemm_mat *B, int k0, int kc, int j0,
                                 int nc, int NR, int s0, int s1) {
  (B->trans ? pack_lm_p : pack_km_p)(dst + (size_t)s0 * kc, NR, B, j0 + s0, nc - s0,
                                     s1 - s0, k0, kc, 0);
}

/* A tile's final values to C: NaN to the default NaN, then the store. */
TGT static void sink_avx2(void *ctx, const float *t, size_t ldt, int i, int j, int mr,
                          int nr) {
  const call *c = ctx;
  const __m256 dn = _mm256_castsi256_ps(_mm256_set1_epi32((int)DEFAULT_NAN));
  for (int r = 0; r < mr; r++) {
    const float *src = t + r * ldt;
    size_t at = (size_t)(i + r) * c->ldc + (size_t)j;
    for (int q = 0; q < nr; q += 8) {
      int n = dp__imin(8, nr - q);
      __m256 v =
          n == 8 ? _mm256_loadu_ps(src + q) : _mm256_maskload_ps(src + q, dp__lanes(n));
      v = _mm256_blendv_ps(v, dn, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      if (c->c_store == DP_BF16_STORE_F32) {
        dp__store_n((float *)c->C + at + q, v, n);
        continue;
      }
      __m256i u = round8(_mm256_castps_si256(v));
      if (c->c_store == DP_BF16_STORE_F32_ROUNDED) {
        dp__store_n((float *)c->C + at + q, _mm256_castsi256_ps(u), n);
        continue;
      }
      u = _mm256_srli_epi32(u, 16);
      __m128i h =
          _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
      dp_bf16 *o = (dp_bf16 *)c->C + at + q;
      if (n == 8) {
        _mm_storeu_si128((__m128i *)(void *)o, h);
      } else {
        dp_bf16 tmp[8];
        _mm_storeu_si128((__m128i *)(void *)tmp, h);
        memcpy(o, tmp, (size_t)n * sizeof *o);
      }
    }
  }
}

/* ---- the instruction ---------------------------------------------------------- */

#define TGT_BF16 __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx2,fma")))

/* sink_avx2 on 16 lanes, for the tiers that run on AVX-512 (a weight
 * gradient's product, K = a micro-batch's rows, spent a fifth of its time in
 * the 8-lane one). After the NaNs are the default NaN, round_bits is the add
 * and the mask: the default NaN and the infinities round to themselves. */
TGT5 static void sink_avx512(void *ctx, const float *t, size_t ldt, int i, int j, int mr,
                             int nr) {
  const call *c = ctx;
  const __m512i dn = _mm512_set1_epi32((int)DEFAULT_NAN), one = _mm512_set1_epi32(1),
                half = _mm512_set1_epi32(0x7fff), hi = _mm512_set1_epi32((int)0xffff0000u);
  for (int r = 0; r < mr; r++) {
    const float *src = t + r * ldt;
    size_t at = (size_t)(i + r) * c->ldc + (size_t)j;
    for (int q = 0; q < nr; q += 16) {
      int n = dp__imin(16, nr - q);
      __mmask16 m = (__mmask16)((1u << n) - 1u);
      __m512 v = _mm512_maskz_loadu_ps(m, src + q);
      __m512i u = _mm512_mask_mov_epi32(_mm512_castps_si512(v),
                                        _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), dn);
      if (c->c_store == DP_BF16_STORE_F32) {
        _mm512_mask_storeu_epi32((float *)c->C + at + q, m, u);
        continue;
      }
      u = _mm512_add_epi32(
          u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
      if (c->c_store == DP_BF16_STORE_F32_ROUNDED) {
        float *o = (float *)c->C + at + q;
        if (c->stream && n == 16 && ((uintptr_t)o & 63) == 0)
          _mm512_stream_si512((void *)o, _mm512_and_si512(u, hi));
        else
          _mm512_mask_storeu_epi32(o, m, _mm512_and_si512(u, hi));
      } else if (n == 16)
        _mm256_storeu_si256((__m256i *)(void *)((dp_bf16 *)c->C + at + q),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
      else { /* AVX-512F has no 16-bit masked store */
        dp_bf16 tmp[16];
        _mm256_storeu_si256((__m256i *)(void *)tmp,
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
        memcpy((dp_bf16 *)c->C + at + q, tmp, (size_t)n * sizeof tmp[0]);
      }
    }
  }
}

TGT_BF16 static void kern_pairs(int kc, const uint32_t *a, const uint32_t *b, float *c,
                                size_t ldc, int flags, const float *bias) {
  __m512 acc[DP_MR_5][2];
  dp__avx512_start(acc, c, ldc, flags);
#pragma GCC unroll 2
  for (int p = 0; p < kc / 2; p++, a += DP_MR_5, b += DP_NR_5) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(b),
             b1 = (__m512bh)_mm512_loadu_si512(b + 16);
#pragma GCC unroll 12
    for (int i = 0; i < DP_MR_5; i++) {
      __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
    }
  }
  dp__avx512_finish(acc, c, ldc, flags, bias);
}
/* from_n on 16 elements at a time (round16, the words' upper halves stored):
 * the same bits, twice the AVX2 copy's elements per second on Zen 5 (a
 * training step's weight copy rounds every linear weight once). */
TGT5 static void from_n_avx512(const float *x, dp_bf16 *y, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i u = round16(_mm512_loadu_si512((const void *)(x + i)));
    _mm256_storeu_si256((__m256i *)(void *)(y + i),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
  }
  for (; i < n; i++) y[i] = dp__bf16_rne_sel(x[i]);
}

#define KERN_PAIRS kern_pairs
#define UNPACKED_HW unpacked_fma
#define SINK_HW sink_avx512
#define PACK_A_P pack_a_p_avx512
#define PACK_B_P pack_b_p_avx512
#else
#define KERN_PAIRS NULL
#define UNPACKED_HW unpacked_sw
#define SINK_HW sink_c
#define PACK_A_P pack_a_p_c
#define PACK_B_P pack_b_p_c
#endif /* DP_GEMM_X86 */

void dp__bf16_from_f32_n(const float *x, dp_bf16 *y, size_t n) {
#if DP_GEMM_X86
  if (dp__simd_avx512()) {
    from_n_avx512(x, y, n);
    return;
  }
#endif
  from_n(x, y, n);
}

/* ---- tiers -------------------------------------------------------------------- */

/* The avx512bf16 tier's kernel (dp__gemm_bf16_hw_override; NULL: kern_pairs),
 * and the one the self-check runs (kern_check), both behind kern_hw's
 * signature. */
static dp__bf16_pair_kern hw_kern, check_kern;

static void kern_hw(int kc, const float *a, const float *b, float *c, size_t ldc, int flags,
                    const float *bias) {
  dp__bf16_pair_kern k = __atomic_load_n(&hw_kern, __ATOMIC_RELAXED);
  (k ? k : KERN_PAIRS)(kc, (const uint32_t *)(const void *)a,
                       (const uint32_t *)(const void *)b, c, ldc, flags, bias);
}

static void kern_check(int kc, const float *a, const float *b, float *c, size_t ldc,
                       int flags, const float *bias) {
  check_kern(kc, (const uint32_t *)(const void *)a, (const uint32_t *)(const void *)b, c,
             ldc, flags, bias);
}

typedef struct {
  dp__gemm_tier t;
  bool hw_arith; /* x86: MXCSR DAZ | FTZ for the call; else fma_ftz, MXCSR's default */
  bool pairs;    /* packs bf16 pairs */
  void (*unpacked)(const call *c);
  dp__gemm_sink_fn sink;
} bf16_tier;

enum { B_SCALAR, B_AVX2, B_AVX512, B_HW, B_TIERS };

static const bf16_tier btiers[B_TIERS] = {
    [B_SCALAR] = {.t = {"scalar", MR_S, NR_S, kern_scalar, pack_a_w_c, pack_b_w_c, NULL},
                  .unpacked = unpacked_sw,
                  .sink = sink_c},
#if DP_GEMM_X86
    [B_AVX2] = {.t = {"avx2", DP_MR_2, DP_NR_2, dp__gemm_kern_avx2, pack_a_w_avx2,
                      pack_b_w_avx2, NULL},
                .hw_arith = true,
                .unpacked = unpacked_fma,
                .sink = sink_avx2},
    [B_AVX512] = {.t = {"avx512", DP_MR_5, DP_NR_5, dp__gemm_kern_avx512, pack_a_w_avx2,
                        pack_b_w_avx2, NULL},
                  .hw_arith = true,
                  .unpacked = unpacked_fma,
                  .sink = sink_avx512},
#endif
    [B_HW] = {.t = {"avx512bf16", 12, 32, kern_hw, PACK_A_P, PACK_B_P, NULL},
              .hw_arith = DP_GEMM_X86,
              .pairs = true,
              .unpacked = UNPACKED_HW,
              .sink = SINK_HW},
};
_Static_assert(RM % MR_S == 0 && RN % NR_S == 0 && RM % 12 == 0 && RN % 32 == 0, "tiles");
_Static_assert(12 <= MR_MAX && 32 <= NR_MAX, "tiles");

static const bf16_tier *tier_now(void) {
  switch (dp__gemm_tier_id()) {
#if DP_GEMM_X86
  case DP_GEMM_AVX512:
    return dp__gemm_bf16_hw_allowed() && dp__gemm_bf16_hw_usable() ? &btiers[B_HW]
                                                                   : &btiers[B_AVX512];
  case DP_GEMM_AVX2: return &btiers[B_AVX2];
#endif
  default: return &btiers[B_SCALAR];
  }
}

const char *dp__gemm_bf16_tier_name(void) { return tier_now()->t.name; }

/* MXCSR for a call: the hardware arithmetic's DAZ | FTZ, round to nearest,
 * exceptions masked, or the default for the software one; the caller's back
 * after, flags included (the instruction sets none). */
#if DP_GEMM_X86
static unsigned mx_enter(bool hw) {
  unsigned old = _mm_getcsr();
  _mm_setcsr(hw ? 0x9fc0u : 0x1f80u);
  return old;
}
static void mx_leave(unsigned old) { _mm_setcsr(old); }
#else
static unsigned mx_enter(bool hw) { return (void)hw, 0; }
static void mx_leave(unsigned old) { (void)old; }
#endif

/* ---- the product ---------------------------------------------------------------- */

static bool packs(int M, int N, int K) { return (size_t)M * N * K > SMALL_FMAS; }

/* Bytes of the packing layout, and of the partial sums of results stored as
 * bf16 (Kp: K rounded up to even). */
static size_t need_bytes(int M, int N, int Kp, bool bf16_out) {
  size_t b = dp__gemm_layout_bytes(M, N, Kp);
  if (bf16_out && Kp > KC)
    b += (size_t)dp__imin(M, SCRATCH_ROWS) * dp__round_up((size_t)dp__imin(N, NC), RN) * 4;
  return b;
}

size_t dp__gemm_bf16_workspace_bytes(int M, int N, int K) {
  if (M <= 0 || N <= 0 || K <= 0 || !packs(M, N, K)) return 0;
  size_t b = need_bytes(M, N, K + (K & 1), true);
  return b <= STACK_WS ? 0 : b;
}

/* The call c on tier bt; Bpre: B packed whole by this tier (c->B then
 * describes that packing, for the unpacked path). */
static void run(const bf16_tier *bt, const call *c, void *workspace, const float *Bpre) {
  if (c->M <= 0 || c->N <= 0) return;
  unsigned mx = mx_enter(bt->hw_arith);
  if (c->K <= 0) {
    for (int i = 0; i < c->M; i++)
      for (int j = 0; j < c->N; j++)
        store_one(c->C, (size_t)i * c->ldc + j, c->c_store,
                  epi_ftz(0.0f, c->bias, j, c->relu));
    mx_leave(mx);
    return;
  }
  int Kp = c->K + (c->K & 1);
  bool bf16_out = c->c_store == DP_BF16_STORE_BF16;
  size_t need = need_bytes(c->M, c->N, Kp, bf16_out);
  dp__gemm_job g = {.t = &bt->t,
                    .M = c->M,
                    .N = c->N,
                    .K = Kp,
                    .A = c->A,
                    .B = c->B,
                    /* one K slice: the tiles go from the stack to the sink, which
                     * writes C once */
                    .C = bf16_out || Kp <= KC ? NULL : c->C,
                    .ldc = (size_t)c->ldc,
                    .scratch_rows = SCRATCH_ROWS,
                    .bias = c->bias,
                    .relu = c->relu,
                    .sink = bt->sink,
                    .sink_ctx = (void *)c};
  if (!packs(c->M, c->N, c->K)) {
    bt->unpacked(c);
  } else if (need <= STACK_WS) {
    _Alignas(64) unsigned char buf[STACK_WS];
    dp__gemm_drive(&g, (float *)(void *)buf, Bpre);
  } else if (workspace) {
    dp__gemm_drive(&g, workspace, Bpre);
  } else {
    bt->unpacked(c);
  }
#if DP_GEMM_X86
  if (c->stream) _mm_sfence(); /* the streamed stores before any later one */
#endif
  mx_leave(mx);
}

static call make_call(int transA, int transB, int M, int N, int K, const void *A, int lda,
                      dp_bf16_store a_store, const void *B, int ldb, dp_bf16_store b_store,
                      void *C, int ldc, dp_bf16_store c_store, const dp_gemm_epilogue *ep) {
  return (call){.M = M,
                .N = N,
                .K = K,
                .A = {.p = A, .ld = lda, .trans = transA, .store = (int)a_store, .K = K},
                .B = {.p = B, .ld = ldb, .trans = transB, .store = (int)b_store, .K = K},
                .C = C,
                .ldc = ldc,
                .c_store = (int)c_store,
                .bias = ep ? ep->bias : NULL,
                .relu = ep && ep->act == DP_GEMM_ACT_RELU,
                /* a weight gradient larger than L2 (the step's 1024 x 1024
                 * layer: 0.1 of its time less) */
                .stream = c_store == DP_BF16_STORE_F32_ROUNDED &&
                          (size_t)M * (size_t)N * 4 >= STREAM_BYTES};
}

void dp__gemm_bf16(int transA, int transB, int M, int N, int K, const void *A, int lda,
                   dp_bf16_store a_store, const void *B, int ldb, dp_bf16_store b_store,
                   void *C, int ldc, dp_bf16_store c_store, const dp_gemm_epilogue *ep,
                   void *workspace) {
  call c = make_call(transA, transB, M, N, K, A, lda, a_store, B, ldb, b_store, C, ldc,
                     c_store, ep);
  run(tier_now(), &c, workspace, NULL);
}

size_t dp__gemm_bf16_packed_b_bytes(int K, int N) {
  return K > 0 && N > 0 ? dp__round_up((size_t)N, RN) * (size_t)(K + (K & 1)) * 4 : 0;
}

void dp__gemm_bf16_pack_b(int transB, int K, int N, const void *B, int ldb,
                          dp_bf16_store b_store, void *dst) {
  dp__gemm_mat Bm = {.p = B, .ld = ldb, .trans = transB, .store = (int)b_store, .K = K};
  if (K > 0 && N > 0) dp__gemm_pack_b_whole(&tier_now()->t, &Bm, K + (K & 1), N, dst);
}

void dp__gemm_bf16_pb(int transA, int transB, int M, int N, int K, const void *A, int lda,
                      dp_bf16_store a_store, const void *Bpacked, void *C, int ldc,
                      dp_bf16_store c_store, const dp_gemm_epilogue *ep, void *workspace) {
  const bf16_tier *bt = tier_now();
  call c = make_call(transA, transB, M, N, K, A, lda, a_store, NULL, 0, DP_BF16_STORE_BF16,
                     C, ldc, c_store, ep);
  /* the unpacked path reads B from the packing (packed_bits) */
  c.B = (dp__gemm_mat){.p = Bpacked,
                       .ld = N,
                       .trans = bt->t.nr,
                       .store = bt->pairs ? STORE_PACKED_P : STORE_PACKED_W,
                       .K = K};
  run(bt, &c, workspace, Bpacked);
}

/* ---- the avx512bf16 tier's self-check -------------------------------------------- */

/* Operands of the check: exponents that make products land on both sides of
 * FTZ's edge, denormals, signed zeros, huge values, random signs (so sums
 * cancel), and in problem 1 products that round exactly at FLT_MIN. */
static dp_bf16 check_value(uint32_t r) {
  uint16_t sign = (uint16_t)(r << 15), man = (uint16_t)(r >> 1 & 0x7fu);
  int e;
  switch (r >> 8 & 15) {
  case 0: return sign;                         /* ±0 */
  case 1: return (uint16_t)(sign | (man | 1)); /* a denormal */
  case 2:
  case 3: e = 1 + (int)(r >> 12 & 15); break;  /* tiny */
  case 4: e = 180 + (int)(r >> 12 & 7); break; /* huge */
  default: e = 120 + (int)(r >> 12 & 15); break;
  }
  return (uint16_t)(sign | e << 7 | man);
}

/* Problem 1's crafted values. Rows 0-5 times columns 0-15: 2^-63 * ±2^-63 =
 * ±FLT_MIN, then ∓(m/4) 2^-(150+q) (m 4..7, q 0..3): FTZ's edge, the tie
 * included. Rows 6-11 times columns 16-31: a denormal times ±2^70, 0 only
 * with DAZ. */
static void check_edges(dp_bf16 *A, dp_bf16 *B, int M, int N) {
  for (int i = 0; i < M; i++) {
    int m = 4 + i % 4;
    A[i * 2] = (uint16_t)((127 - 77) << 7 | (m & 3) << 5);
    A[i * 2 + 1] = i < M / 2 ? 0x2000 : (uint16_t)(1 + 5 * i);
  }
  for (int j = 0; j < N; j++) {
    uint16_t s = (uint16_t)((j & 1) << 15);
    B[N + j] = (uint16_t)(s | (j < N / 2 ? 0x2000 : (127 + 70) << 7));
    B[j] = (uint16_t)((s ^ 0x8000u) | (127 - 73 - (j >> 1) % 4) << 7);
  }
}

enum { CHECK_A = 16 * 304, CHECK_B = 304 * 40, CHECK_C = 16 * 64 };
static struct {
  dp_bf16 A[CHECK_A], B[CHECK_B];
  float bias[64], C[CHECK_C], R[CHECK_C];
  _Alignas(64) unsigned char ws[96 * 1024];
} chk;
static int check_lock;

/* The problems of the check: (transA, transB, M, N, K, bias/relu). Odd K, K =
 * 1, two K slices, edge tiles, every layout. */
static const int CHECKS[][6] = {{0, 1, 12, 64, 1, 0},  {0, 0, 12, 32, 2, 0},
                                {0, 1, 13, 35, 37, 1}, {1, 0, 16, 40, 19, 2},
                                {1, 1, 5, 40, 301, 1}, {0, 0, 4, 33, 300, 3}};

static bool check_one(const bf16_tier *bt, const int *p, uint32_t *seed) {
  int tA = p[0], tB = p[1], M = p[2], N = p[3], K = p[4];
  for (int i = 0; i < M * K; i++)
    chk.A[i] = check_value(*seed = *seed * 1664525u + 1013904223u);
  for (int i = 0; i < N * K; i++)
    chk.B[i] = check_value(*seed = *seed * 1664525u + 1013904223u);
  for (int j = 0; j < N; j++)
    chk.bias[j] = j % 7 == 0 ? u2f(0x00400000u) : dp__bf16_to_f32(chk.B[j]) * 3.0f;
  if (K == 2 && !tA && !tB) check_edges(chk.A, chk.B, M, N);
  dp_gemm_epilogue ep = {.bias = p[5] & 1 ? chk.bias : NULL,
                         .act = p[5] & 2 ? DP_GEMM_ACT_RELU : DP_GEMM_ACT_NONE};
  call c = make_call(tA, tB, M, N, K, chk.A, tA ? M : K, DP_BF16_STORE_BF16, chk.B,
                     tB ? K : N, DP_BF16_STORE_BF16, chk.C, N, DP_BF16_STORE_F32, &ep);
  if (need_bytes(M, N, K + (K & 1), false) > sizeof chk.ws) return false;
  run(bt, &c, chk.ws, NULL);
  c.C = chk.R;
  run(&btiers[B_SCALAR], &c, NULL, NULL);
  return memcmp(chk.C, chk.R, (size_t)M * N * sizeof *chk.C) == 0;
}

/* What the tier choice asks (dp__gemm_bf16_hw_override), and its answer: 0
 * not asked yet, 1 being checked, 2 usable, 3 not. */
static int hw_has = -1, hw_state;

/* cpuid's answer */
static bool cpuid_bf16(void) {
#if DP_GEMM_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

static bool cpu_has_bf16(void) {
  int has = __atomic_load_n(&hw_has, __ATOMIC_RELAXED);
  return has >= 0 ? has : cpuid_bf16();
}

bool dp__gemm_bf16_self_check(dp__bf16_pair_kern kern) {
  if (!kern) kern = cpuid_bf16() ? KERN_PAIRS : NULL; /* never SIGILL */
  if (!kern) return false;
  while (__atomic_exchange_n(&check_lock, 1, __ATOMIC_ACQUIRE)) sched_yield();
  check_kern = kern;
  bf16_tier bt = btiers[B_HW];
  bt.t.kern = kern_check;
  bool ok = true;
  uint32_t seed = 12345;
  for (size_t i = 0; ok && i < sizeof CHECKS / sizeof *CHECKS; i++)
    ok = check_one(&bt, CHECKS[i], &seed);
  __atomic_store_n(&check_lock, 0, __ATOMIC_RELEASE);
  return ok;
}

bool dp__gemm_bf16_hw_usable(void) {
  for (;;) {
    int s = __atomic_load_n(&hw_state, __ATOMIC_ACQUIRE), zero = 0;
    if (s >= 2) return s == 2;
    if (s == 0 && __atomic_compare_exchange_n(&hw_state, &zero, 1, false, __ATOMIC_ACQ_REL,
                                              __ATOMIC_ACQUIRE)) {
      dp__bf16_pair_kern k = __atomic_load_n(&hw_kern, __ATOMIC_RELAXED);
      bool ok = cpu_has_bf16() && dp__gemm_bf16_self_check(k);
      __atomic_store_n(&hw_state, ok ? 2 : 3, __ATOMIC_RELEASE);
      return ok;
    }
    sched_yield(); /* another thread runs the check (a few microseconds) */
  }
}

void dp__gemm_bf16_hw_override(int has, dp__bf16_pair_kern kern) {
  __atomic_store_n(&hw_has, has < 0 ? -1 : has != 0, __ATOMIC_RELAXED);
  __atomic_store_n(&hw_kern, kern, __ATOMIC_RELAXED);
  __atomic_store_n(&hw_state, 0, __ATOMIC_RELEASE);
}

/* ---- benchmark -------------------------------------------------------------------- */

static void fill_bf16(void *p, size_t count, int which) {
  dp_bf16 *x = p;
  for (size_t i = 0; i < count; i++)
    x[i] = dp__bf16_from_f32(which ? (float)(i % 13) * 0.05f : (float)(i % 17) * 0.1f);
}

/* the linear layer's forward layout with bf16 activations: C = A . B^T */
static void run_bf16(int m, int n, int k, const void *A, const void *B, void *C, void *ws) {
  dp__gemm_bf16(0, 1, m, n, k, A, k, DP_BF16_STORE_BF16, B, k, DP_BF16_STORE_BF16, C, n,
                DP_BF16_STORE_BF16, NULL, ws);
}

dp_status dp__gemm_bf16_bench(int m, int n, int k, int iters, double *ms) {
  return dp__gemm_bench_with(m, n, k, iters, 2, dp__gemm_bf16_workspace_bytes(m, n, k),
                             fill_bf16, run_bf16, "bf16 gemm bench", ms);
}
