/* bf16 conversions and the bf16 GEMM of the CPU backend (internal; bf16 mixed
 * precision, issue 31): bf16 activations and weight copies stored as dp_bf16,
 * products accumulated in fp32.
 *
 * Conversions. dp_bf16 is the upper 16 bits of an IEEE binary32. from_f32
 * rounds to nearest even on the bit pattern: denormals stay denormal bf16s (no
 * flush), ±inf stay, a finite value past the largest bf16 rounds to ±inf, a
 * NaN becomes the quiet NaN 0x7fc0 with its sign. to_f32 is exact (bits << 16).
 * The vector copies (*_n) give the scalar functions' bits on every tier.
 *
 * GEMM contract: the arithmetic of VDPBF16PS (AVX512_BF16), so that the
 * instruction and its emulation give the same bits. With a(i,k) = op(A)[i][k]
 * and b(k,j) = op(B)[k][j] as bf16 values (an F32-stored operand is rounded by
 * from_f32 as it is read), every element of C is
 *
 *     acc = +0
 *     for p = 0, 1, ... while 2p < K:                  (the k pairs, ascending)
 *       if 2p+1 < K: acc = fma_d(a(i,2p+1), b(2p+1,j), acc)   (odd element first)
 *       acc = fma_d(a(i,2p), b(2p,j), acc)
 *     c = acc; with a bias: c = add_d(c, bias[j]); with relu: c = c <= 0 ? +0 : c
 *     a NaN c becomes the default NaN +0x7fc00000
 *     stored as c_store says: F32 c; F32_ROUNDED to_f32(from_f32(c)); BF16 from_f32(c)
 *
 * fma_d(x, y, z) is x * y + z rounded once to nearest even, with DAZ (an input
 * denormal, x, y or z, counts as a zero of its sign) and FTZ (a result that is
 * tiny, below 2^-126 in magnitude after rounding to 24 bits with an unbounded
 * exponent, becomes a zero of its sign); add_d(x, z) is x + z the same way.
 * The product of two bf16s is exact in fp32, so each fma_d is one step of the
 * instruction (srcdest += src1.bf16[2j+1] * src2.bf16[2j+1], then the even
 * element; RNE, DAZ, FTZ, MXCSR not consulted). For an odd K the instruction
 * sees the pad -0 * +0 at k = K, which leaves acc as it is, signed zeros
 * included: the "if" above. The epilogue runs under DAZ/FTZ too (a denormal
 * bias counts as zero; acc is never denormal), on every tier. Which NaN a NaN
 * operand propagates is not emulated (the instruction and x86 fmas pick
 * operands in different orders), hence the one default NaN. The caller's
 * MXCSR (rounding mode, DAZ, FTZ, exception masks and flags) does not matter
 * and is left as it was. K = 0 gives C = epilogue(+0).
 *
 * Tiers (dp__gemm_bf16_tier_name), chosen with the fp32 GEMM's tier
 * (dp__gemm_force_tier, DP_GEMM_TIER):
 *   avx512bf16  the instruction (VDPBF16PS) on 12 x 32 tiles of packed bf16
 *               pairs; on the avx512 tier where the CPU has AVX512_BF16 and a
 *               one-time self-check (denormals, FTZ's edge, odd K, signed
 *               zeros, cancellation, K slices) gives the emulation's bits. The
 *               tier name "avx512bf16" asks for it; "avx512" for the emulation.
 *   avx512, avx2  the fp32 GEMM's micro-kernels on operands widened to fp32
 *               (denormals made zero, the k order swapped within each pair,
 *               the pad at k = K) while packing, with MXCSR's DAZ and FTZ set
 *               (and round to nearest, exceptions masked) for the call: an
 *               ordinary fp32 fma then is fma_d.
 *   scalar      the same slivers, fmaf with DAZ and FTZ in software (the
 *               portable path: what a build for another CPU runs).
 *
 * Workspace: as dp__sgemm's. dp__gemm_bf16_workspace_bytes(M, N, K) bytes
 * (64-byte alignment is best), 0 for tiny problems (unpacked) and for problems
 * that pack on the stack; a NULL workspace where one is needed runs an
 * unpacked path with the same bits. Results stored as bf16 with K > 256 keep
 * their fp32 partial sums in the workspace too (up to 384 rows x 1024 columns
 * at a time); the other stores keep them in C. No allocation.
 *
 * Build with the default floating-point flags (no -ffast-math). */
#ifndef DP_BF16_H
#define DP_BF16_H

#include "cpu/gemm.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t dp_bf16; /* the upper 16 bits of an IEEE binary32 */

dp_bf16 dp__bf16_from_f32(float x);
float dp__bf16_to_f32(dp_bf16 h);
void dp__bf16_from_f32_n(const float *x, dp_bf16 *y, size_t n);
void dp__bf16_to_f32_n(const dp_bf16 *x, float *y, size_t n);
void dp__bf16_round_f32_n(float *x, size_t n); /* x[i] = to_f32(from_f32(x[i])) */

/* How a GEMM operand or result is stored. */
typedef enum {
  DP_BF16_STORE_BF16 = 0, /* dp_bf16 elements */
  /* operands: fp32 elements, each rounded to bf16 (from_f32) as it is read;
   * results: the fp32 value itself */
  DP_BF16_STORE_F32 = 1,
  /* results only: fp32 elements holding the result rounded to bf16 */
  DP_BF16_STORE_F32_ROUNDED = 2,
} dp_bf16_store;

/* C (M, N) = op(A) (M, K) · op(B) (K, N), the contract above; beta = 0.
 * Leading dimensions in elements; transA, transB, lda, ldb, ldc as dp__sgemm's. */
size_t dp__gemm_bf16_workspace_bytes(int M, int N, int K);
void dp__gemm_bf16(int transA, int transB, int M, int N, int K, const void *A, int lda,
                   dp_bf16_store a_store, const void *B, int ldb, dp_bf16_store b_store,
                   void *C, int ldc, dp_bf16_store c_store, const dp_gemm_epilogue *ep,
                   void *workspace);

/* B packed once for several products (the forward's weights over a step's
 * micro-batches), as dp__gemm_pack_b / dp__sgemm_pb: op(B) (K, N) into
 * dp__gemm_bf16_packed_b_bytes(K, N) bytes (64-byte aligned) with the bf16
 * tier in use (no tier switch between a pack and its uses); b_store may be
 * F32 (fp32 master weights, rounded while packing). dp__gemm_bf16_pb gives
 * dp__gemm_bf16's bits for every shape, with or without workspace (it reads
 * B from the packed copy only). */
size_t dp__gemm_bf16_packed_b_bytes(int K, int N);
void dp__gemm_bf16_pack_b(int transB, int K, int N, const void *B, int ldb,
                          dp_bf16_store b_store, void *dst);
void dp__gemm_bf16_pb(int transA, int transB, int M, int N, int K, const void *A, int lda,
                      dp_bf16_store a_store, const void *Bpacked, void *C, int ldc,
                      dp_bf16_store c_store, const dp_gemm_epilogue *ep, void *workspace);

/* out[j] = sum over i ascending of to_f32(A[i lda + j]) from +0, plain fp32
 * adds (the caller's floating-point environment; a bias gradient from bf16
 * output gradients). */
void dp__gemm_bf16_colsum(int M, int N, const dp_bf16 *A, int lda, float *out);

/* "avx512bf16", "avx512", "avx2" or "scalar": the bf16 tier in use. */
const char *dp__gemm_bf16_tier_name(void);

/* Times C (m, n) = A (m, k) . B (n, k)^T, all bf16, on the calling thread with
 * operands it allocates (as dp__gemm_bench). */
dp_status dp__gemm_bf16_bench(int m, int n, int k, int iters, double *ms);

/* ---- test hooks (tests/test_bf16.c) ---- */

/* The avx512bf16 tier's micro-kernel: c (12, 32; row stride ldc) = [c if
 * flags & 1, else 0] + the kc (even) k steps of a and b, as VDPBF16PS pairs:
 * pair p of row i at a[p 12 + i], of column j at b[p 32 + j], element 2p in
 * the low half; then + bias (32) if flags & 2, relu if flags & 4. */
typedef void (*dp__bf16_pair_kern)(int kc, const uint32_t *a, const uint32_t *b, float *c,
                                   size_t ldc, int flags, const float *bias);
/* The self-check with kern as the avx512bf16 tier's kernel (NULL: the
 * instruction's; false where cpuid lacks it): true when its GEMMs give the
 * emulation's bits. */
bool dp__gemm_bf16_self_check(dp__bf16_pair_kern kern);
/* Replaces what the tier choice asks: has (1, 0; -1: cpuid's answer) and the
 * kernel (NULL: the instruction's); the self-check runs again when next
 * needed. The tier in use is not changed (dp__gemm_force_tier does). */
void dp__gemm_bf16_hw_override(int has, dp__bf16_pair_kern kern);
/* on: precision bf16's gelu, layernorm and residual adds (lib/cpu/mixed.c) take the
 * generic way, their fp32 op on fp32 copies, instead of their own loops on
 * the bf16 tensors (a test compares the two's bits). Set while no step runs. */
void dp__mixed_force_shadow(bool on);
/* How many layer ops have run on the bf16 tensors themselves since the first
 * call (which starts the count). */
unsigned long dp__mixed_own_runs(void);

#ifdef __cplusplus
}
#endif

#endif
