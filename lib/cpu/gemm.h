/* Packed, cache-blocked single-precision GEMM for the CPU backend (internal).
 *
 *   C (M, N) = op(A) (M, K) · op(B) (K, N)       row-major, beta = 0 (C is overwritten)
 *     op(A)[i][k] = transA ? A[k * lda + i] : A[i * lda + k]
 *     op(B)[k][j] = transB ? B[j * ldb + k] : B[k * ldb + j]
 *
 * The linear layer's three products:
 *   forward      Y (rows, out) = X (rows, in) · W^T        transA 0, transB 1, bias + act
 *   grad-input   dX (rows, in) = dY (rows, out) · W        transA 0, transB 0
 *   grad-weight  dW (out, in)  = dY^T · X (rows, in)       transA 1, transB 0, K = rows
 *   grad-bias    db (out)      = column sums of dY         dp__gemm_colsum
 *
 * Determinism contract. Every element of C is
 *     acc = +0; for k = 0 .. K-1 in ascending order: acc = fma(op(A)[i][k], op(B)[k][j], acc)
 *     c = acc (+ bias[j] when there is a bias) (then relu: c <= 0 ? +0 : c)
 * one fused multiply-add per k into a single accumulator, whatever M, N, the
 * tile position, the blocking or the instruction set. A K-block is resumed by
 * reloading the partial sum, which does not change it. So the bits depend only
 * on the operands and K; the AVX-512, AVX2 and scalar (fmaf) tiers give
 * identical results, and a row or column computed in any sub-problem equals the
 * same row or column of the whole problem.
 *
 * No allocation: the packing buffers live in the caller's workspace of
 * dp__gemm_workspace_bytes(M, N, K) bytes (64-byte alignment is best; any
 * alignment works). That is 0 for tiny problems (at most 512 fmas: they run
 * unpacked) and for problems whose panels fit 32 KiB (they pack into a buffer
 * on the calling thread's stack). Passing NULL for a problem that needs
 * workspace runs an unpacked path with the same bits (slow; it exists so that
 * an undersized plan can never write out of bounds). Several threads may run
 * GEMMs at once, each with its own workspace.
 *
 * Build with the default floating-point flags: -ffast-math (reassociation)
 * would break the contract; fp-contract does not matter (the products that
 * count are explicit fmas). */
#ifndef DP_GEMM_H
#define DP_GEMM_H

#include "cpu/cpu.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DP_GEMM_ACT_NONE = 0, DP_GEMM_ACT_RELU = 1 } dp_gemm_act;

/* Applied once per element after the full K accumulation. */
typedef struct {
  const float *bias; /* (N): c = acc + bias[j]; NULL: no bias */
  dp_gemm_act act;
} dp_gemm_epilogue;

/* Bytes of workspace dp__sgemm needs for this shape (0 when it packs on the
 * stack, or when M, N or K is 0). The same on every machine and every tier;
 * non-decreasing in M, N and K. A call of that shape writes the workspace's
 * last byte whenever the result is not 0. */
size_t dp__gemm_workspace_bytes(int M, int N, int K);

/* C = op(A) · op(B) with the epilogue ep (NULL: none). See the contract above.
 * K = 0 gives C = epilogue(0). Leading dimensions are in floats. */
void dp__sgemm(int transA, int transB, int M, int N, int K, const float *A, int lda,
               const float *B, int ldb, float *C, int ldc, const dp_gemm_epilogue *ep,
               void *workspace);

/* Several products with the same B (the forward's weights over the
 * micro-batches of a step): op(B) (K, N) packed once into
 * dp__gemm_packed_b_bytes(K, N) bytes (64-byte aligned) by dp__gemm_pack_b,
 * with the tier in use, then dp__sgemm_pb reads it instead of packing B: the
 * same bits as dp__sgemm (which it runs when Bpacked is NULL or the shape
 * does not take the packed route). No tier switch between a pack and its
 * uses. */
size_t dp__gemm_packed_b_bytes(int K, int N);
void dp__gemm_pack_b(int transB, int K, int N, const float *B, int ldb, float *dst);
void dp__sgemm_pb(int transA, int transB, int M, int N, int K, const float *A, int lda,
                  const float *B, int ldb, const float *Bpacked, float *C, int ldc,
                  const dp_gemm_epilogue *ep, void *workspace);

/* Whether a pack of op(B) (K, N) serves dp__sgemm_pb on its first n columns
 * (the products of a causal mask's row blocks), the same bits: true when the
 * pack is one block of slivers (K and N within one blocking step), whose
 * slivers then start where a pack of (K, n) puts them (a tile past column n
 * computes into a tile on the stack and keeps its first columns only). */
bool dp__gemm_packed_b_prefix(int K, int N, int n);

/* out[j] = sum over i = 0 .. M-1, ascending, of A[i * lda + j], from +0. */
void dp__gemm_colsum(int M, int N, const float *A, int lda, float *out);

/* The CPU backend's elementwise loops (the optimizer, its non-finite scan,
 * relu, gradient adds, column sums) follow the tier: on the AVX2 and AVX-512
 * tiers they run a copy compiled for AVX2 (8 lanes instead of SSE's 4), on the
 * scalar tier the baseline copy. Each element is the same IEEE operations in
 * the same order either way (ISO C: no contraction into fma), so the bits do
 * not change. DP_SIMD_FN(name, params, args) defines `static int name params`
 * from `static inline DP_SIMD_BODY int name##_body params`. */
bool dp__simd_avx2(void);
bool dp__simd_avx512(void); /* the AVX-512 tier is in use */
#if defined(__x86_64__) && defined(__GNUC__)
#define DP_SIMD_BODY __attribute__((always_inline))
#define DP_SIMD_FN(name, params, args)                                                     \
  __attribute__((target("avx2"))) static int name##_avx2 params { return name##_body args; } \
  static int name##_base params { return name##_body args; }                                \
  static int name params { return dp__simd_avx2() ? name##_avx2 args : name##_base args; }
/* DP_SIMD_FN with a third copy, compiled for AVX-512, that the AVX-512 tier
 * runs: for loops whose arithmetic, not memory, bounds them (gelu's double
 * exp: 1.45x the AVX2 copy's elements per second on Zen 4), with the same
 * bits for the same reason. */
#define DP_SIMD_FN512(name, params, args)                                                  \
  __attribute__((target("avx512f,avx512vl,avx512dq,avx2"))) static int name##_avx512 params { \
    return name##_body args;                                                               \
  }                                                                                        \
  __attribute__((target("avx2"))) static int name##_avx2 params { return name##_body args; } \
  static int name##_base params { return name##_body args; }                                \
  static int name params {                                                                 \
    return dp__simd_avx512() ? name##_avx512 args                                          \
           : dp__simd_avx2() ? name##_avx2 args                                            \
                             : name##_base args;                                           \
  }
#else
#define DP_SIMD_BODY
#define DP_SIMD_FN(name, params, args)                                                     \
  static int name params { return name##_body args; }
#define DP_SIMD_FN512(name, params, args) DP_SIMD_FN(name, params, args)
#endif

/* Tiers: "avx512", "avx2", "scalar"; "auto" (or NULL) goes back to the best the
 * CPU supports. Returns 0, or -1 (nothing changed) for an unknown name or a tier
 * this CPU lacks. The environment variable DP_GEMM_TIER, read at the first
 * GEMM, picks the starting tier the same way. Meant for tests and benchmarks:
 * switch tiers while no GEMM runs. "avx512bf16" is the avx512 tier with the
 * bf16 GEMM (bf16.h) on the AVX512_BF16 instruction, where the CPU has it
 * and its self-check passes ("auto" takes it then; naming "avx512" makes the
 * bf16 GEMM emulate it); the tier's name stays "avx512". */
int dp__gemm_force_tier(const char *name);
bool dp__gemm_tier_supported(const char *name);
const char *dp__gemm_tier_name(void); /* the tier in use */

/* dp_bench_sgemm's cpu part (arguments checked by it): times C (m, n) =
 * A (m, k) . B (n, k)^T on the calling thread with operands it allocates. */
dp_status dp__gemm_bench(int m, int n, int k, int iters, double *ms);

/* Workspace of one linear layer's GEMMs on micro-batches of up to mb_rows
 * rows: the forward; in training also grad-weight and, when input_grad (every
 * layer but the first), grad-input. */
size_t dp__linear_workspace_bytes(const dp_layer *l, int mb_rows, bool training,
                                  bool input_grad);
/* The largest of those over the model's linear layers: the CPU backend's
 * WORKSPACE region. */
size_t dp__model_workspace_bytes(const dp_model *m, int mb_rows, bool training);

#ifdef __cplusplus
}
#endif

#endif
