/* Packed, cache-blocked SGEMM with AVX-512, AVX2 and portable tiers. See
 * gemm.h for the contract; the notes here are about how it is kept.
 *
 * Blocking (Goto style; the same for every tier, so that the workspace size is
 * too): for each NC-wide column panel, for each KC-deep slice of K (ascending),
 * B's slice is packed into NR-wide slivers; for each MC-tall row block, A's
 * slice is packed into MR-tall slivers; then an MR x NR micro-kernel runs every
 * (A sliver, B sliver) pair. The micro-kernel keeps one accumulator lane per
 * element of its tile and adds one k at a time with a fused multiply-add, k
 * ascending; the first K slice starts from +0, later slices reload the partial
 * sums from C, and the last one applies the epilogue. Tiles that stick out of C
 * run the same kernel on zero-padded slivers into a tile on the stack.
 *
 * Packing moves data and never computes, so every tier may pack its own way
 * (the AVX2 and AVX-512 tiers share 8 x 8 transposes). Problems of at most
 * SMALL_FMAS fused multiply-adds skip packing and run the same per-element
 * sequence directly; problems whose panels fit STACK_WS bytes pack on the
 * stack. Only the rest use the caller's workspace.
 *
 * The blocking, the tiers' kernels and the driver are shared with the bf16
 * GEMM (bf16.c) through gemm_impl.h: a job names its packers (bf16.c's widen
 * and reorder bf16 operands), where the partial sums live, and a sink for
 * each tile's final values (NULL here: they stay in C). */
#include "cpu/gemm.h"
#include "cpu/gemm_impl.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define UA_SLIVERS 4 /* products this many B slivers wide read A in place */

typedef dp__gemm_tier tier;

/* The epilogue of one element, as every tier applies it. */
static inline float epi(float acc, const float *bias, int j, int relu) {
  if (bias) acc = acc + bias[j];
  if (relu) acc = acc <= 0.0f ? 0.0f : acc; /* NaN passes through */
  return acc;
}

/* ---- packing (no arithmetic: the same for every tier) ---------------------- */

/* Slivers of MR rows of op(A)[i0, i0+mc) x [k0, k0+kc): element (s*MR + ii, k)
 * at s*MR*kc + k*MR + ii; rows from mc to mpad are zero. */
static void pack_a_c(float *dst, const dp__gemm_mat *Am, int i0, int mc, int k0, int kc,
                     int MR, int mpad) {
  const float *A = Am->p;
  int lda = Am->ld, transA = Am->trans;
  for (int s = 0; s < mpad; s += MR) {
    float *d = dst + (size_t)s * kc;
    int rows = mc - s < 0 ? 0 : dp__imin(mc - s, MR);
    if (rows == 0) {
      memset(d, 0, (size_t)MR * kc * sizeof *d);
    } else if (transA) { /* op(A)[i][k] = A[k][i]: MR contiguous floats per k */
      const float *src = A + (size_t)k0 * lda + i0 + s;
      for (int k = 0; k < kc; k++, src += lda, d += MR) {
        int ii = 0;
        for (; ii < rows; ii++) d[ii] = src[ii];
        for (; ii < MR; ii++) d[ii] = 0.0f;
      }
    } else { /* A[i][k]: each row contiguous in k */
      for (int ii = 0; ii < MR; ii++) {
        if (ii < rows) {
          const float *src = A + (size_t)(i0 + s + ii) * lda + k0;
          for (int k = 0; k < kc; k++) d[(size_t)k * MR + ii] = src[k];
        } else {
          for (int k = 0; k < kc; k++) d[(size_t)k * MR + ii] = 0.0f;
        }
      }
    }
  }
}

/* Slivers of NR columns of op(B)[k0, k0+kc) x [j0, j0+nc): element (k, s*NR + jj)
 * at s*NR*kc + k*NR + jj; columns from nc to npad are zero. */
static void pack_b_c(float *dst, const dp__gemm_mat *Bm, int k0, int kc, int j0, int nc,
                     int NR, int s0, int s1) {
  const float *B = Bm->p;
  int ldb = Bm->ld, transB = Bm->trans;
  for (int s = s0; s < s1; s += NR) {
    float *d = dst + (size_t)s * kc;
    int cols = nc - s < 0 ? 0 : dp__imin(nc - s, NR);
    if (cols == 0) {
      memset(d, 0, (size_t)NR * kc * sizeof *d);
    } else if (!transB) { /* B[k][j]: NR contiguous floats per k */
      const float *src = B + (size_t)k0 * ldb + j0 + s;
      for (int k = 0; k < kc; k++, src += ldb, d += NR) {
        int jj = 0;
        for (; jj < cols; jj++) d[jj] = src[jj];
        for (; jj < NR; jj++) d[jj] = 0.0f;
      }
    } else { /* op(B)[k][j] = B[j][k]: each column of op(B) contiguous in k */
      for (int jj = 0; jj < NR; jj++) {
        if (jj < cols) {
          const float *src = B + (size_t)(j0 + s + jj) * ldb + k0;
          for (int k = 0; k < kc; k++) d[(size_t)k * NR + jj] = src[k];
        } else {
          for (int k = 0; k < kc; k++) d[(size_t)k * NR + jj] = 0.0f;
        }
      }
    }
  }
}

/* ---- scalar tier: fmaf, the same sequence per element ---------------------- */

#define MR_S 4
#define NR_S 8

static void kern_scalar(int kc, const float *a, const float *b, float *c, size_t ldc,
                        int flags, const float *bias) {
  float acc[MR_S][NR_S];
  for (int i = 0; i < MR_S; i++)
    for (int j = 0; j < NR_S; j++) acc[i][j] = flags & K_LOAD ? c[i * ldc + j] : 0.0f;
  for (int k = 0; k < kc; k++, a += MR_S, b += NR_S)
    for (int i = 0; i < MR_S; i++)
      for (int j = 0; j < NR_S; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  for (int i = 0; i < MR_S; i++)
    for (int j = 0; j < NR_S; j++)
      c[i * ldc + j] = epi(acc[i][j], flags & K_BIAS ? bias : NULL, j, flags & K_RELU);
}

#if DP_GEMM_X86
/* ---- AVX2 tier: 6 x 16 (12 ymm accumulators) ------------------------------ */

#define TGT_AVX2 DP_TGT_AVX2
#define MR_2 DP_MR_2
#define NR_2 DP_NR_2

/* The AVX2 kernels' accumulators at the start (the partial sums of an earlier
 * K-block, or +0) and their epilogue (bias once after the whole sum, relu,
 * the store). Inlined: the accumulators stay in registers. */
#define AVX2_INLINE TGT_AVX2 static inline __attribute__((always_inline))
AVX2_INLINE void avx2_start(__m256 acc[][2], const float *c, size_t ldc, int flags) {
  if (flags & K_LOAD) {
#pragma GCC unroll 6
    for (int i = 0; i < MR_2; i++) {
      acc[i][0] = _mm256_loadu_ps(c + i * ldc);
      acc[i][1] = _mm256_loadu_ps(c + i * ldc + 8);
    }
  } else {
#pragma GCC unroll 6
    for (int i = 0; i < MR_2; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  }
}

AVX2_INLINE void avx2_finish(__m256 acc[][2], float *c, size_t ldc, int flags,
                             const float *bias) {
  if (flags & K_BIAS) {
    __m256 bb0 = _mm256_loadu_ps(bias), bb1 = _mm256_loadu_ps(bias + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR_2; i++) {
      acc[i][0] = _mm256_add_ps(acc[i][0], bb0);
      acc[i][1] = _mm256_add_ps(acc[i][1], bb1);
    }
  }
  if (flags & K_RELU) {
    __m256 z = _mm256_setzero_ps();
#pragma GCC unroll 6
    for (int i = 0; i < MR_2; i++)
      for (int h = 0; h < 2; h++) /* v <= 0 -> +0; NaN (unordered) passes */
        acc[i][h] = _mm256_andnot_ps(_mm256_cmp_ps(acc[i][h], z, _CMP_LE_OQ), acc[i][h]);
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR_2; i++) {
    _mm256_storeu_ps(c + i * ldc, acc[i][0]);
    _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
  }
}

TGT_AVX2 void dp__gemm_kern_avx2(int kc, const float *a, const float *b, float *c,
                                 size_t ldc, int flags, const float *bias) {
  __m256 acc[MR_2][2];
  avx2_start(acc, c, ldc, flags);
#pragma GCC unroll 4
  for (int k = 0; k < kc; k++, a += MR_2, b += NR_2) {
    __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR_2; i++) {
      __m256 ai = _mm256_broadcast_ss(a + i);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
  }
  avx2_finish(acc, c, ldc, flags, bias);
}

/* kern_avx2 reading op(A) in place (kern_ua_fn): for narrow products (one
 * or two B slivers) a packed A sliver would be used once or twice, so packing
 * it costs about what it saves. */
TGT_AVX2 static void kern_avx2_ua(int kc, const float *a, size_t sa_i, size_t sa_k,
                                  const float *b, float *c, size_t ldc, int flags,
                                  const float *bias) {
  const float *ar[MR_2];
  for (int i = 0; i < MR_2; i++) ar[i] = a + (size_t)i * sa_i;
  __m256 acc[MR_2][2];
  avx2_start(acc, c, ldc, flags);
  size_t o = 0;
#pragma GCC unroll 4
  for (int k = 0; k < kc; k++, o += sa_k, b += NR_2) {
    __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR_2; i++) {
      __m256 ai = _mm256_broadcast_ss(ar[i] + o);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
  }
  avx2_finish(acc, c, ldc, flags, bias);
}

/* One sliver of width W: lane l (< n; the others are zero) at step k is
 * src[l * ld + k]; it goes to d[k * W + l]. 8 x 8 transposes, in groups of 8
 * lanes (the last group may be narrower: W = 6, 12); masked loads past kc.
 * A sliver narrower than 8 (W = 6) is stored 8 wide, row by row: the 2 extra
 * lanes land on the next row, stored right after; only its last row is
 * stored exactly. (Masked stores are slow on AMD; exact 6-lane stores take
 * two.) */
TGT_AVX2 static void pack_t_avx2(float *d, int W, const float *src, size_t ld, int n,
                                 int kc, int rows_left) {
  for (int g = 0; g < W; g += 8, d += 8) {
    int cnt = dp__imin(8, W - g), valid = n - g < 0 ? 0 : dp__imin(n - g, cnt);
    bool spill = W < 8;
    if (valid == 0) {
      for (int k = 0; k < kc; k++) dp__store_n(d + (size_t)k * W, _mm256_setzero_ps(), cnt);
      continue;
    }
    const float *p[8];
    for (int l = 0; l < 8; l++) p[l] = src + (size_t)(g + (l < valid ? l : 0)) * ld;
    /* the next 8 source rows (of this sliver or the next), fetched a group
     * ahead: rows 1 KiB long do not train the hardware prefetchers */
    int pf = dp__imin(8, rows_left - g - 8);
    const float *q = pf > 0 ? src + (size_t)(g + 8) * ld : NULL;
    int k = 0;
    for (; k + 8 <= kc; k += 8) {
      if (q && k % 16 == 0)
        for (int l = 0; l < pf; l++) __builtin_prefetch(q + (size_t)l * ld + k, 0, 3);
      __m256 r[8];
#pragma GCC unroll 8
      for (int l = 0; l < 8; l++)
        r[l] = l < valid ? _mm256_loadu_ps(p[l] + k) : _mm256_setzero_ps();
      dp__transpose8(r);
      if (cnt == 8 || (spill && k + 8 < kc)) {
#pragma GCC unroll 8
        for (int kk = 0; kk < 8; kk++) _mm256_storeu_ps(d + (size_t)(k + kk) * W, r[kk]);
      } else {
        for (int kk = 0; kk < 8; kk++) dp__store_n(d + (size_t)(k + kk) * W, r[kk], cnt);
      }
    }
    if (k < kc) {
      int kn = kc - k;
      __m256i kmask = dp__lanes(kn);
      __m256 r[8];
      for (int l = 0; l < 8; l++)
        r[l] = l < valid ? _mm256_maskload_ps(p[l] + k, kmask) : _mm256_setzero_ps();
      dp__transpose8(r);
      for (int kk = 0; kk < kn; kk++) {
        float *o = d + (size_t)(k + kk) * W;
        if (spill && k + kk + 1 < kc)
          _mm256_storeu_ps(o, r[kk]);
        else
          dp__store_n(o, r[kk], cnt);
      }
    }
  }
}

/* A whole panel of slivers of width W when lane l (< n; zero up to npad) at
 * step k is src[k * ld + l]: row copies, 8 rows at a time, so that the source
 * is read along its rows and each sliver written contiguously. W = 6 spills
 * into the next row as in pack_t_avx2. */
TGT_AVX2 static void pack_c_avx2(float *dst, int W, const float *src, size_t ld, int n,
                                 int npad, int kc) {
  for (int k0 = 0; k0 < kc; k0 += 8) {
    int kn = dp__imin(8, kc - k0);
    for (int s = 0; s < npad; s += W) {
      float *d = dst + (size_t)s * kc + (size_t)k0 * W;
      const float *q = src + (size_t)k0 * ld + s;
      if (W % 8 == 0 && s + W <= n) { /* a full sliver */
        for (int k = 0; k < kn; k++, q += ld, d += W)
          for (int g = 0; g < W; g += 8) _mm256_storeu_ps(d + g, _mm256_loadu_ps(q + g));
        continue;
      }
      if (W < 8 && s + 8 <= n) {
        /* a full 6-wide sliver with 2 more columns in the panel: plain
         * 8-float loads, stored 8 wide (the 2 extra lanes spill into the next
         * row, stored right after) but for the panel's last row */
        int kfull = k0 + kn < kc ? kn : kn - 1;
        for (int k = 0; k < kfull; k++, q += ld, d += W)
          _mm256_storeu_ps(d, _mm256_loadu_ps(q));
        if (kfull < kn) dp__store_n(d, _mm256_loadu_ps(q), W);
        continue;
      }
      for (int k = 0; k < kn; k++, q += ld, d += W)
        for (int g = 0; g < W; g += 8) {
          int cnt = dp__imin(8, W - g),
              valid = n - s - g < 0 ? 0 : dp__imin(n - s - g, cnt);
          __m256 v = valid == 8  ? _mm256_loadu_ps(q + g)
                     : valid > 0 ? _mm256_maskload_ps(q + g, dp__lanes(valid))
                                 : _mm256_setzero_ps();
          if (W < 8 && k0 + k + 1 < kc)
            _mm256_storeu_ps(d + g, v);
          else
            dp__store_n(d + g, v, cnt);
        }
    }
  }
}

/* A tier's two packing moves: a panel read along its rows (pack_c) and a
 * sliver read across them (pack_t), as pack_c_avx2 and pack_t_avx2. */
typedef void (*pack_c_fn)(float *dst, int W, const float *src, size_t ld, int n, int npad,
                          int kc);
typedef void (*pack_t_fn)(float *d, int W, const float *src, size_t ld, int n, int kc,
                          int rows_left);

static inline __attribute__((always_inline)) void
pack_a_with(pack_c_fn pc, pack_t_fn pt, float *dst, const dp__gemm_mat *Am, int i0, int mc,
            int k0, int kc, int MR, int mpad) {
  const float *A = Am->p;
  int lda = Am->ld, transA = Am->trans;
  if (transA) {
    pc(dst, MR, A + (size_t)k0 * lda + i0, (size_t)lda, mc, mpad, kc);
    return;
  }
  for (int s = 0; s < mpad; s += MR) {
    float *d = dst + (size_t)s * kc;
    int rows = mc - s < 0 ? 0 : dp__imin(mc - s, MR);
    if (rows == 0)
      memset(d, 0, (size_t)MR * kc * sizeof *d);
    else
      pt(d, MR, A + (size_t)(i0 + s) * lda + k0, (size_t)lda, rows, kc, mc - s);
  }
}

static inline __attribute__((always_inline)) void
pack_b_with(pack_c_fn pc, pack_t_fn pt, float *dst, const dp__gemm_mat *Bm, int k0, int kc,
            int j0, int nc, int NR, int s0, int s1) {
  const float *B = Bm->p;
  int ldb = Bm->ld, transB = Bm->trans;
  if (!transB && s0 < nc) {
    pc(dst + (size_t)s0 * kc, NR, B + (size_t)k0 * ldb + j0 + s0, (size_t)ldb, nc - s0,
       s1 - s0, kc);
    return;
  }
  for (int s = s0; s < s1; s += NR) {
    float *d = dst + (size_t)s * kc;
    int cols = nc - s < 0 ? 0 : dp__imin(nc - s, NR);
    if (cols == 0)
      memset(d, 0, (size_t)NR * kc * sizeof *d);
    else
      pt(d, NR, B + (size_t)(j0 + s) * ldb + k0, (size_t)ldb, cols, kc, nc - s);
  }
}

static void pack_a_avx2(float *dst, const dp__gemm_mat *Am, int i0, int mc, int k0, int kc,
                        int MR, int mpad) {
  pack_a_with(pack_c_avx2, pack_t_avx2, dst, Am, i0, mc, k0, kc, MR, mpad);
}

static void pack_b_avx2(float *dst, const dp__gemm_mat *Bm, int k0, int kc, int j0, int nc,
                        int NR, int s0, int s1) {
  pack_b_with(pack_c_avx2, pack_t_avx2, dst, Bm, k0, kc, j0, nc, NR, s0, s1);
}

/* ---- AVX-512 packers: the same layouts, 16 lanes a move ------------------ */

/* pack_t_avx2's layout: lane l (< n; zero up to W) at step k is src[l * ld +
 * k], to d[k * W + l]; 16 x 16 transposes, masked loads past kc, masked
 * stores of the lanes a sliver has (AVX-512's masked stores are plain stores
 * on the lanes they name). The next 16 rows prefetched a group ahead. */
DP_TGT_AVX512 static void pack_t_avx512(float *d, int W, const float *src, size_t ld, int n,
                                        int kc, int rows_left) {
  for (int g = 0; g < W; g += 16, d += 16) {
    int cnt = dp__imin(16, W - g), valid = n - g < 0 ? 0 : dp__imin(n - g, cnt);
    __mmask16 sm = dp__lanes16(cnt);
    if (valid == 0) {
      for (int k = 0; k < kc; k++)
        _mm512_mask_storeu_ps(d + (size_t)k * W, sm, _mm512_setzero_ps());
      continue;
    }
    const float *p[16];
    for (int l = 0; l < 16; l++) p[l] = src + (size_t)(g + (l < valid ? l : 0)) * ld;
    int pf = dp__imin(16, rows_left - g - 16);
    const float *q = pf > 0 ? src + (size_t)(g + 16) * ld : NULL;
    for (int k = 0; k < kc; k += 16) {
      int kn = dp__imin(16, kc - k);
      __mmask16 km = dp__lanes16(kn);
      if (q)
        for (int l = 0; l < pf; l++) __builtin_prefetch(q + (size_t)l * ld + k, 0, 3);
      __m512 r[16];
#pragma GCC unroll 16
      for (int l = 0; l < 16; l++)
        r[l] = l < valid ? _mm512_maskz_loadu_ps(km, p[l] + k) : _mm512_setzero_ps();
      dp__transpose16(r);
      if (kn == 16 && cnt == 16) {
#pragma GCC unroll 16
        for (int kk = 0; kk < 16; kk++) _mm512_storeu_ps(d + (size_t)(k + kk) * W, r[kk]);
      } else {
        for (int kk = 0; kk < kn; kk++)
          _mm512_mask_storeu_ps(d + (size_t)(k + kk) * W, sm, r[kk]);
      }
    }
  }
}

/* pack_c_avx2's layout: lane l (< n; zero up to npad) at step k is src[k *
 * ld + l], row copies 8 rows at a time, 16 lanes a move (masked where a
 * sliver or the source ends). */
DP_TGT_AVX512 static void pack_c_avx512(float *dst, int W, const float *src, size_t ld,
                                        int n, int npad, int kc) {
  for (int k0 = 0; k0 < kc; k0 += 8) {
    int kn = dp__imin(8, kc - k0);
    for (int s = 0; s < npad; s += W) {
      float *d = dst + (size_t)s * kc + (size_t)k0 * W;
      const float *q = src + (size_t)k0 * ld + s;
      if (W % 16 == 0 && s + W <= n) { /* a full sliver */
        for (int k = 0; k < kn; k++, q += ld, d += W)
          for (int g = 0; g < W; g += 16) _mm512_storeu_ps(d + g, _mm512_loadu_ps(q + g));
        continue;
      }
      if (W >= 8 && W < 16 && s + 16 <= n) { /* the spill fits the next step's slot */
        /* a full narrow sliver (A's, 12 lanes) with 4 more lanes in the
         * panel: whole 16-lane loads and stores (masked ones take twice as
         * long), whose 4 extra lanes spill into the next step's slot, stored
         * right after; but for the panel's last step, which ends the sliver */
        int kfull = k0 + kn < kc ? kn : kn - 1;
        for (int k = 0; k < kfull; k++, q += ld, d += W)
          _mm512_storeu_ps(d, _mm512_loadu_ps(q));
        if (kfull < kn) _mm512_mask_storeu_ps(d, dp__lanes16(W), _mm512_loadu_ps(q));
        continue;
      }
      for (int k = 0; k < kn; k++, q += ld, d += W)
        for (int g = 0; g < W; g += 16) {
          int cnt = dp__imin(16, W - g),
              valid = n - s - g < 0 ? 0 : dp__imin(n - s - g, cnt);
          _mm512_mask_storeu_ps(d + g, dp__lanes16(cnt),
                                _mm512_maskz_loadu_ps(dp__lanes16(valid), q + g));
        }
    }
  }
}

static void pack_a_avx512(float *dst, const dp__gemm_mat *Am, int i0, int mc, int k0,
                          int kc, int MR, int mpad) {
  pack_a_with(pack_c_avx512, pack_t_avx512, dst, Am, i0, mc, k0, kc, MR, mpad);
}

static void pack_b_avx512(float *dst, const dp__gemm_mat *Bm, int k0, int kc, int j0,
                          int nc, int NR, int s0, int s1) {
  pack_b_with(pack_c_avx512, pack_t_avx512, dst, Bm, k0, kc, j0, nc, NR, s0, s1);
}

/* ---- AVX-512 tier: 12 x 32 (24 zmm accumulators) -------------------------- */

#define MR_5 DP_MR_5
#define NR_5 DP_NR_5

DP_TGT_AVX512 void dp__gemm_kern_avx512(int kc, const float *a, const float *b, float *c,
                                        size_t ldc, int flags, const float *bias) {
  __m512 acc[MR_5][2];
  dp__avx512_start(acc, c, ldc, flags);
#pragma GCC unroll 4
  for (int k = 0; k < kc; k++, a += MR_5, b += NR_5) {
    __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR_5; i++) {
      __m512 ai = _mm512_set1_ps(a[i]);
      acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
    }
  }
  dp__avx512_finish(acc, c, ldc, flags, bias);
}
#endif /* DP_GEMM_X86 */

/* ---- tiers and dispatch ---------------------------------------------------- */

const dp__gemm_tier dp__gemm_tiers[DP_GEMM_TIERS] = {
    [DP_GEMM_SCALAR] = {"scalar", MR_S, NR_S, kern_scalar, pack_a_c, pack_b_c, NULL},
#if DP_GEMM_X86
    [DP_GEMM_AVX2] = {"avx2", MR_2, NR_2, dp__gemm_kern_avx2, pack_a_avx2, pack_b_avx2,
                      kern_avx2_ua},
    [DP_GEMM_AVX512] = {"avx512", MR_5, NR_5, dp__gemm_kern_avx512, pack_a_avx512,
                        pack_b_avx512, NULL},
#endif
};

_Static_assert(RM % MR_S == 0 && RN % NR_S == 0 && MC % RM == 0, "blocking");
#if DP_GEMM_X86
_Static_assert(RM % MR_2 == 0 && RN % NR_2 == 0 && RM % MR_5 == 0 && RN % NR_5 == 0,
               "blocking");
_Static_assert(MR_5 <= MR_MAX && NR_5 <= NR_MAX, "tile");
#endif

static bool cpu_has(int t) {
  switch (t) {
  case DP_GEMM_SCALAR: return true;
#if DP_GEMM_X86
  case DP_GEMM_AVX2:
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  case DP_GEMM_AVX512:
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  default: return false;
  }
}

/* "avx512bf16" is the avx512 tier with the bf16 GEMM on the AVX512_BF16
 * instruction (bf16.h); the fp32 GEMM is the same. */
enum { NAME_AUTO = -2, NAME_UNKNOWN = -1, NAME_AVX512BF16 = DP_GEMM_TIERS };

static int tier_of(const char *name) {
  if (!name || strcmp(name, "auto") == 0) return NAME_AUTO;
  if (strcmp(name, "avx512bf16") == 0) return NAME_AVX512BF16;
  for (int t = 0; t < DP_GEMM_TIERS; t++)
    if (dp__gemm_tiers[t].name && strcmp(dp__gemm_tiers[t].name, name) == 0) return t;
  return NAME_UNKNOWN;
}

static bool name_has(int n) {
  if (n == NAME_AVX512BF16) return cpu_has(DP_GEMM_AVX512) && dp__gemm_bf16_hw_usable();
  return n >= 0 && cpu_has(n);
}

static int best_tier(void) {
  for (int t = DP_GEMM_TIERS - 1; t > 0; t--)
    if (cpu_has(t)) return t;
  return DP_GEMM_SCALAR;
}

/* The tier in use, + 1 (0: not chosen yet), and whether "avx512" was named
 * (the bf16 GEMM then emulates the AVX512_BF16 instruction even where the CPU
 * has it). Relaxed atomics: the choice is made once (or forced by a test
 * between runs); any thread may read it. */
static int cur_tier, bf16_hw_off;

/* Makes the name (known, supported or "auto") the tier in use. */
static void set_tier(int n) {
  int t = n == NAME_AUTO ? best_tier() : n == NAME_AVX512BF16 ? DP_GEMM_AVX512 : n;
  __atomic_store_n(&bf16_hw_off, n == DP_GEMM_AVX512, __ATOMIC_RELAXED);
  __atomic_store_n(&cur_tier, t + 1, __ATOMIC_RELAXED);
}

static const tier *get_tier(void) {
  int t = __atomic_load_n(&cur_tier, __ATOMIC_RELAXED);
  if (t == 0) {
    int want = tier_of(getenv("DP_GEMM_TIER"));
    set_tier(name_has(want) ? want : NAME_AUTO);
    t = __atomic_load_n(&cur_tier, __ATOMIC_RELAXED);
  }
  return &dp__gemm_tiers[t - 1];
}

int dp__gemm_tier_id(void) { return (int)(get_tier() - dp__gemm_tiers); }

bool dp__gemm_bf16_hw_allowed(void) {
  get_tier();
  return !__atomic_load_n(&bf16_hw_off, __ATOMIC_RELAXED);
}

int dp__gemm_force_tier(const char *name) {
  int n = tier_of(name);
  if (n != NAME_AUTO && !name_has(n)) return -1;
  set_tier(n);
  return 0;
}

bool dp__gemm_tier_supported(const char *name) {
  int n = tier_of(name);
  return n == NAME_AUTO || name_has(n);
}

const char *dp__gemm_tier_name(void) { return get_tier()->name; }

bool dp__simd_avx2(void) { return get_tier() != &dp__gemm_tiers[DP_GEMM_SCALAR]; }
bool dp__simd_avx512(void) {
#if DP_GEMM_X86
  return get_tier() == &dp__gemm_tiers[DP_GEMM_AVX512];
#else
  return false;
#endif
}

const char *dp_gemm_tier(void) { return dp__gemm_tier_name(); }

dp_status dp_gemm_set_tier(const char *name) {
  int t = tier_of(name);
  if (t == NAME_UNKNOWN)
    return DP_FAIL(
        DP_ERR_INVALID,
        "dp_gemm_set_tier: unknown GEMM tier '%s' (auto, avx512bf16, avx512, avx2, scalar)",
        name);
  if (dp__gemm_force_tier(name))
    return DP_FAIL(DP_ERR_UNSUPPORTED, "dp_gemm_set_tier: this CPU cannot run the %s tier",
                   name);
  return DP_OK;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

dp_status dp__gemm_bench_with(int m, int n, int k, int iters, size_t esz, size_t ws_bytes,
                              dp_gemm_bench_fill fill, dp_gemm_bench_run run,
                              const char *who, double *ms) {
  size_t a, b, c, wsr;
  if (!dp__mul((size_t)m, (size_t)k, &a) || !dp__mul((size_t)n, (size_t)k, &b) ||
      !dp__mul((size_t)m, (size_t)n, &c) || !dp__mul(a, esz, &a) || !dp__mul(b, esz, &b) ||
      !dp__mul(c, esz, &c) || !dp__align_up(ws_bytes ? ws_bytes : 64, 64, &wsr) ||
      !dp__align_up(a, 64, &a) || !dp__align_up(b, 64, &b) || !dp__align_up(c, 64, &c))
    return DP_FAIL(DP_ERR_OVERFLOW, "%s: %d x %d x %d overflows size_t", who, m, n, k);
  void *A = aligned_alloc(64, a), *B = aligned_alloc(64, b), *C = aligned_alloc(64, c);
  void *w = aligned_alloc(64, wsr);
  dp_status s = DP_OK;
  if (!A || !B || !C || !w) {
    s = DP_FAIL(DP_ERR_NOMEM, "%s: %d x %d x %d: out of memory", who, m, n, k);
    goto out;
  }
  fill(A, a / esz, 0);
  fill(B, b / esz, 1);
  run(m, n, k, A, B, C, w); /* one warm-up run */
  double t0 = now_ms();
  for (int it = 0; it < iters; it++) run(m, n, k, A, B, C, w);
  *ms = (now_ms() - t0) / iters;
out:
  free(A);
  free(B);
  free(C);
  free(w);
  return s;
}

static void fill_f32(void *p, size_t count, int which) {
  float *x = p;
  for (size_t i = 0; i < count; i++)
    x[i] = which ? (float)(i % 13) * 0.05f : (float)(i % 17) * 0.1f;
}

/* the linear layer's forward layout: C = A . B^T */
static void run_f32(int m, int n, int k, const void *A, const void *B, void *C, void *ws) {
  dp__sgemm(0, 1, m, n, k, A, k, B, k, C, n, NULL, ws);
}

dp_status dp__gemm_bench(int m, int n, int k, int iters, double *ms) {
  return dp__gemm_bench_with(m, n, k, iters, 4, dp__gemm_workspace_bytes(m, n, k), fill_f32,
                             run_f32, "dp_bench_sgemm", ms);
}

/* ---- sizes ----------------------------------------------------------------- */

/* Floats of the packed A block and bytes of the whole layout (A block rounded
 * to 64 bytes, then the B panel: its end is written by the first B slice). */
size_t dp__gemm_a_floats(int M, int K) {
  return dp__round_up((size_t)dp__imin(M, MC), RM) * dp__imin(K, KC);
}
size_t dp__gemm_b_floats(int N, int K) {
  return dp__round_up((size_t)dp__imin(N, NC), RN) * dp__imin(K, KC);
}
size_t dp__gemm_layout_bytes(int M, int N, int K) {
  return dp__round_up(dp__gemm_a_floats(M, K) * 4, 64) + dp__gemm_b_floats(N, K) * 4;
}

/* Whether dp__sgemm packs this shape (it needs M, N, K > 0). */
static bool packs(int M, int N, int K) { return (size_t)M * N * K > SMALL_FMAS; }

size_t dp__gemm_workspace_bytes(int M, int N, int K) {
  if (M <= 0 || N <= 0 || K <= 0 || !packs(M, N, K)) return 0;
  size_t b = dp__gemm_layout_bytes(M, N, K);
  return b <= STACK_WS ? 0 : b;
}

size_t dp__linear_workspace_bytes(const dp_layer *l, int mb_rows, bool training,
                                  bool input_grad) {
  if (l->kind != DP_LAYER_LINEAR || mb_rows <= 0) return 0;
  /* on a sequence, rows of every position, widths per position */
  long long m = (long long)mb_rows * dp__positions(l);
  int M = m > 0x7fffffff ? 0x7fffffff : (int)m, in = dp__pos_in(l), out = dp__pos_out(l);
  size_t w = dp__gemm_workspace_bytes(M, out, in); /* forward */
  if (training) {
    size_t gw = dp__gemm_workspace_bytes(out, in, M);
    size_t gi = input_grad ? dp__gemm_workspace_bytes(M, in, out) : 0;
    w = gw > w ? gw : w;
    w = gi > w ? gi : w;
  }
  return w;
}

size_t dp__model_workspace_bytes(const dp_model *m, int mb_rows, bool training) {
  size_t w = 0;
  for (int i = 0; i < m->n_layers; i++) {
    size_t li = dp__linear_workspace_bytes(&m->layers[i], mb_rows, training, i > 0);
    size_t ci = dp__conv_workspace_bytes(&m->layers[i], mb_rows, training);
    size_t ai = dp__attention_workspace_bytes(&m->layers[i], training);
    w = ai > w ? ai : w;
    w = li > w ? li : w;
    w = ci > w ? ci : w;
  }
  return w;
}

/* ---- the drivers ----------------------------------------------------------- */

/* The same sequence per element without packing: for tiny problems, where
 * packing costs more than it saves, and for calls without the workspace they
 * need (slow then). Four columns at a time, so that four fma chains overlap.
 * FMA is fmaf: libm's for the portable tier, the instruction under
 * target("fma") (both are the correctly rounded fused multiply-add). */
#define UNPACKED_BODY(FMA)                                                                 \
  for (int i = 0; i < M; i++) {                                                            \
    float *c = C + (size_t)i * ldc;                                                        \
    int j = 0;                                                                             \
    for (; j + 4 <= N; j += 4) {                                                           \
      float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;                                    \
      for (int k = 0; k < K; k++) {                                                        \
        float a = transA ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];                \
        if (transB) {                                                                      \
          const float *b = B + (size_t)j * ldb + k;                                        \
          a0 = FMA(a, b[0], a0), a1 = FMA(a, b[ldb], a1);                                  \
          a2 = FMA(a, b[2 * (size_t)ldb], a2), a3 = FMA(a, b[3 * (size_t)ldb], a3);        \
        } else {                                                                           \
          const float *b = B + (size_t)k * ldb + j;                                        \
          a0 = FMA(a, b[0], a0), a1 = FMA(a, b[1], a1);                                    \
          a2 = FMA(a, b[2], a2), a3 = FMA(a, b[3], a3);                                    \
        }                                                                                  \
      }                                                                                    \
      c[j] = epi(a0, bias, j, relu), c[j + 1] = epi(a1, bias, j + 1, relu);                \
      c[j + 2] = epi(a2, bias, j + 2, relu), c[j + 3] = epi(a3, bias, j + 3, relu);        \
    }                                                                                      \
    for (; j < N; j++) {                                                                   \
      float acc = 0.0f;                                                                    \
      for (int k = 0; k < K; k++) {                                                        \
        float a = transA ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];                \
        float b = transB ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];                \
        acc = FMA(a, b, acc);                                                              \
      }                                                                                    \
      c[j] = epi(acc, bias, j, relu);                                                      \
    }                                                                                      \
  }

#define UNPACKED_ARGS                                                                      \
  int transA, int transB, int M, int N, int K, const float *A, int lda, const float *B,    \
      int ldb, float *C, int ldc, const float *bias, int relu

static void gemm_unpacked_c(UNPACKED_ARGS){UNPACKED_BODY(fmaf)}
#if DP_GEMM_X86
TGT_AVX2 static void gemm_unpacked_fma(UNPACKED_ARGS) {
  UNPACKED_BODY(__builtin_fmaf)
}
#endif

static void gemm_unpacked(const tier *t, UNPACKED_ARGS) {
#if DP_GEMM_X86
  if (t != &dp__gemm_tiers[DP_GEMM_SCALAR]) {
    gemm_unpacked_fma(transA, transB, M, N, K, A, lda, B, ldb, C, ldc, bias, relu);
    return;
  }
#endif
  (void)t;
  gemm_unpacked_c(transA, transB, M, N, K, A, lda, B, ldb, C, ldc, bias, relu);
}

/* The per-call state of dp__gemm_drive's tiles. */
typedef struct {
  const dp__gemm_job *g;
  float *tile; /* MR_MAX x NR_MAX on the stack, for edge tiles and sunk ones */
  bool tile_set;
} drive_ctx;

/* One MR x NR tile at rows i.., columns j.. (mr x nr of them exist): the
 * kernel over one K slice on the A sliver (packed at ap, or in place at au),
 * the B sliver bp, the partial sums at cp (row stride ldp; NULL: no partial
 * sums, one K slice), then, after the last slice, the sink. Edge tiles and
 * tiles without partial sums run on the stack tile. */
static inline void drive_tile(drive_ctx *x, int kc, const float *ap, const float *au,
                              size_t sa_i, size_t sa_k, const float *bp, float *cp,
                              size_t ldp, int flags, bool last, const float *bb, int i,
                              int j, int mr, int nr) {
  const dp__gemm_job *g = x->g;
  const tier *t = g->t;
  const int MR = t->mr, NR = t->nr;
  if (cp && mr == MR && nr == NR) {
    if (au)
      t->kern_ua(kc, au, sa_i, sa_k, bp, cp, ldp, flags, bb);
    else
      t->kern(kc, ap, bp, cp, ldp, flags, bb);
    if (last && g->sink) g->sink(g->sink_ctx, cp, ldp, i, j, MR, NR);
    return;
  }
  if (!x->tile_set) { /* edge tiles reload rows they then drop: define them once */
    memset(x->tile, 0, (size_t)MR_MAX * NR_MAX * sizeof *x->tile);
    x->tile_set = true;
  }
  if (flags & K_LOAD)
    for (int r = 0; r < mr; r++)
      memcpy(x->tile + r * NR, cp + (size_t)r * ldp, (size_t)nr * sizeof *cp);
  if (au)
    t->kern_ua(kc, au, sa_i, sa_k, bp, x->tile, (size_t)NR, flags, bb);
  else
    t->kern(kc, ap, bp, x->tile, (size_t)NR, flags, bb);
  if (last && g->sink)
    g->sink(g->sink_ctx, x->tile, (size_t)NR, i, j, mr, nr);
  else
    for (int r = 0; r < mr; r++)
      memcpy(cp + (size_t)r * ldp, x->tile + r * NR, (size_t)nr * sizeof *cp);
}

/* Rows [r0, r1) of column panel [jc, jc + nc) over the K slice [pc, pc + kc),
 * with the B slice packed (or being packed, sliver by sliver, when fuse) at
 * Bb. P: the partial sums of C (r0, jc), row stride ldp, or NULL. */
static void drive_rows(drive_ctx *x, float *Ap, float *Bp, const float *Bb, bool fuse,
                       int r0, int r1, int jc, int nc, int pc, int kc, float *P,
                       size_t ldp) {
  const dp__gemm_job *g = x->g;
  const tier *t = g->t;
  const int MR = t->mr, NR = t->nr;
  const bool last = pc + kc == g->K;
  const int flags =
      (pc > 0 ? K_LOAD : 0) | (last ? (g->bias ? K_BIAS : 0) | (g->relu ? K_RELU : 0) : 0);
  _Alignas(64) float tbias[NR_MAX];
  /* Narrow products (at most UA_SLIVERS B slivers) read A in place: each A
   * sliver would serve only those few B slivers. Only a last, partial row
   * sliver is packed (into apart), so that no row past M is read. */
  bool ua = t->kern_ua && g->N <= UA_SLIVERS * NR;
  const float *A = g->A.p;
  size_t sa_i = g->A.trans ? 1 : (size_t)g->A.ld, sa_k = g->A.trans ? (size_t)g->A.ld : 1;
  _Alignas(64) float apart[MR_MAX * KC];
  for (int ic = r0; ic < r1; ic += MC) {
    int mc = dp__imin(MC, r1 - ic);
    if (!ua)
      t->pack_a(Ap, &g->A, ic, mc, pc, kc, MR, (int)dp__round_up((size_t)mc, (size_t)MR));
    else if (mc % MR)
      t->pack_a(apart, &g->A, ic + mc / MR * MR, mc % MR, pc, kc, MR, MR);
    for (int jr = 0; jr < nc; jr += NR) {
      int nr = dp__imin(NR, nc - jr);
      if (fuse && ic == r0) t->pack_b(Bp, &g->B, pc, kc, jc, nc, NR, jr, jr + NR);
      const float *bp = Bb + (size_t)jr * kc, *bb = g->bias ? g->bias + jc + jr : NULL;
      if (bb && nr < NR) {
        for (int j = 0; j < NR; j++) tbias[j] = j < nr ? bb[j] : 0.0f;
        bb = tbias;
      }
      for (int ir = 0; ir < mc; ir += MR) {
        int mr = dp__imin(MR, mc - ir);
        const float *ap = ua ? apart : Ap + (size_t)ir * kc;
        float *cp = P ? P + (size_t)(ic - r0 + ir) * ldp + jr : NULL;
        /* in place: A's rows ic + ir .. + MR from column pc */
        const float *au =
            mr < MR || !ua ? NULL : A + (size_t)(ic + ir) * sa_i + (size_t)pc * sa_k;
        /* the next tile's C rows, which the next call reads or writes first */
        int nir = ir + MR < mc ? ir + MR : 0, njr = ir + MR < mc ? jr : jr + NR;
        if (P && njr < nc)
          for (int i = 0; i < dp__imin(MR, mc - nir); i++) {
            const float *q = P + (size_t)(ic - r0 + nir + i) * ldp + njr;
            __builtin_prefetch(q, 1, 3);
            __builtin_prefetch(q + dp__imin(NR, nc - njr) - 1, 1, 3);
          }
        drive_tile(x, kc, ap, au, sa_i, sa_k, bp, cp, ldp, flags, last, bb, ic + ir,
                   jc + jr, mr, nr);
      }
    }
  }
}

void dp__gemm_drive(const dp__gemm_job *g, float *ws, const float *Bpre) {
  const tier *t = g->t;
  const int M = g->M, N = g->N, K = g->K, NR = t->nr;
  float *Ap = ws, *Bp = ws + dp__round_up(dp__gemm_a_floats(M, K), 16);
  /* partial sums in C, in scratch after the B panel (rows at a time), or none */
  float *S = g->C || K <= KC ? NULL : Bp + dp__gemm_b_floats(N, K);
  size_t lds = dp__round_up((size_t)dp__imin(N, NC), RN);
  int rows = S ? g->scratch_rows : M;
  _Alignas(64) float tile[MR_MAX * NR_MAX];
  drive_ctx x = {.g = g, .tile = tile};
  for (int jc = 0; jc < N; jc += NC) {
    int nc = dp__imin(NC, N - jc);
    int nr_end = (int)dp__round_up((size_t)nc, (size_t)NR),
        rn_end = (int)dp__round_up((size_t)nc, RN);
    for (int r0 = 0; r0 < M; r0 += rows) {
      int r1 = dp__imin(M, r0 + rows);
      float *P = g->C ? g->C + (size_t)r0 * g->ldc + jc : S;
      size_t ldp = g->C ? g->ldc : lds;
      for (int pc = 0; pc < K; pc += KC) {
        int kc = dp__imin(KC, K - pc);
        /* A transposed B (the forward's weights) is packed sliver by sliver
         * just before the first row block uses it, so the sliver is still in
         * L1 then; a row-major B is packed whole, reading its rows
         * contiguously. The zero slivers past the tier's rounding (up to RN)
         * are packed first. */
        bool fuse = g->B.trans != 0 && !Bpre;
        const float *Bb = Bpre ? Bpre + (size_t)jc * K + (size_t)rn_end * pc : Bp;
        if (!Bpre) t->pack_b(Bp, &g->B, pc, kc, jc, nc, NR, fuse ? nr_end : 0, rn_end);
        drive_rows(&x, Ap, Bp, Bb, fuse, r0, r1, jc, nc, pc, kc, P, ldp);
      }
    }
  }
}

/* The layout drive reads as Bpre: for each NC-wide column block jc (its nc
 * columns rounded to RN), for each KC-deep block pc, the slivers of that
 * block; block (jc, pc) at jc K + round_up(nc, RN) pc floats. */
void dp__gemm_pack_b_whole(const tier *t, const dp__gemm_mat *B, int K, int N, float *dst) {
  for (int jc = 0; jc < N; jc += NC) {
    int nc = dp__imin(NC, N - jc), rn_end = (int)dp__round_up((size_t)nc, RN);
    for (int pc = 0; pc < K; pc += KC)
      t->pack_b(dst + (size_t)jc * K + (size_t)rn_end * pc, B, pc, dp__imin(KC, K - pc), jc,
                nc, t->nr, 0, rn_end);
  }
}

/* dp__sgemm's job (fp32 operands and C, no sink). */
static dp__gemm_job sgemm_job(int transA, int transB, int M, int N, int K, const float *A,
                              int lda, const float *B, int ldb, float *C, int ldc,
                              const dp_gemm_epilogue *ep) {
  return (dp__gemm_job){.t = get_tier(),
                        .M = M,
                        .N = N,
                        .K = K,
                        .A = {.p = A, .ld = lda, .trans = transA},
                        .B = {.p = B, .ld = ldb, .trans = transB},
                        .C = C,
                        .ldc = (size_t)ldc,
                        .bias = ep ? ep->bias : NULL,
                        .relu = ep && ep->act == DP_GEMM_ACT_RELU};
}

void dp__sgemm(int transA, int transB, int M, int N, int K, const float *A, int lda,
               const float *B, int ldb, float *C, int ldc, const dp_gemm_epilogue *ep,
               void *workspace) {
  if (M <= 0 || N <= 0) return;
  const float *bias = ep ? ep->bias : NULL;
  int relu = ep && ep->act == DP_GEMM_ACT_RELU;
  if (K <= 0) {
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = epi(0.0f, bias, j, relu);
    return;
  }
  const tier *t = get_tier();
  size_t need = dp__gemm_layout_bytes(M, N, K);
  dp__gemm_job g = sgemm_job(transA, transB, M, N, K, A, lda, B, ldb, C, ldc, ep);
  if (!packs(M, N, K)) {
    gemm_unpacked(t, transA, transB, M, N, K, A, lda, B, ldb, C, ldc, bias, relu);
  } else if (need <= STACK_WS) {
    _Alignas(64) unsigned char buf[STACK_WS];
    dp__gemm_drive(&g, (float *)(void *)buf, NULL);
  } else if (workspace) {
    dp__gemm_drive(&g, workspace, NULL);
  } else {
    gemm_unpacked(t, transA, transB, M, N, K, A, lda, B, ldb, C, ldc, bias, relu);
  }
}

static inline DP_SIMD_BODY int colsum_body(int M, int N, const float *restrict A, int lda,
                                           float *restrict out) {
  for (int j = 0; j < N; j++) out[j] = 0.0f;
  for (int i = 0; i < M; i++) {
    const float *a = A + (size_t)i * lda;
    for (int j = 0; j < N; j++) out[j] += a[j];
  }
  return 0;
}
DP_SIMD_FN(colsum, (int M, int N, const float *restrict A, int lda, float *restrict out),
           (M, N, A, lda, out))

void dp__gemm_colsum(int M, int N, const float *A, int lda, float *out) {
  colsum(M, N, A, lda, out);
}

size_t dp__gemm_packed_b_bytes(int K, int N) {
  return K > 0 && N > 0 ? dp__round_up((size_t)N, RN) * (size_t)K * 4 : 0;
}

bool dp__gemm_packed_b_prefix(int K, int N, int n) {
  return K > 0 && K <= KC && N <= NC && n > 0 && n <= N;
}

/* The layout dp__gemm_drive reads as Bpre (dp__gemm_pack_b_whole). */
void dp__gemm_pack_b(int transB, int K, int N, const float *B, int ldb, float *dst) {
  dp__gemm_mat Bm = {.p = B, .ld = ldb, .trans = transB};
  dp__gemm_pack_b_whole(get_tier(), &Bm, K, N, dst);
}

void dp__sgemm_pb(int transA, int transB, int M, int N, int K, const float *A, int lda,
                  const float *B, int ldb, const float *Bpacked, float *C, int ldc,
                  const dp_gemm_epilogue *ep, void *workspace) {
  /* the prepacked path needs the packed route and the A block's workspace */
  if (!Bpacked || M <= 0 || N <= 0 || K <= 0 || !packs(M, N, K) ||
      (dp__gemm_layout_bytes(M, N, K) > STACK_WS && !workspace)) {
    dp__sgemm(transA, transB, M, N, K, A, lda, B, ldb, C, ldc, ep, workspace);
    return;
  }
  _Alignas(64) unsigned char buf[STACK_WS];
  float *ws = dp__gemm_layout_bytes(M, N, K) <= STACK_WS ? (float *)(void *)buf : workspace;
  dp__gemm_job g = sgemm_job(transA, transB, M, N, K, A, lda, B, ldb, C, ldc, ep);
  dp__gemm_drive(&g, ws, Bpacked);
}
