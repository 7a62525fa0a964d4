/* bf16 conversions and the bf16 GEMM (internal). TEMPORARY reference version:
 * replaced by the bf16-kernel branch. */
#ifndef DP_BF16_H
#define DP_BF16_H

#include "cpu/gemm.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t dp_bf16;
dp_bf16 dp__bf16_from_f32(float x);
float dp__bf16_to_f32(dp_bf16 h);
void dp__bf16_from_f32_n(const float *x, dp_bf16 *y, size_t n);
void dp__bf16_to_f32_n(const dp_bf16 *x, float *y, size_t n);
void dp__bf16_round_f32_n(float *x, size_t n);

typedef enum {
  DP_BF16_STORE_BF16 = 0,
  DP_BF16_STORE_F32 = 1,
  DP_BF16_STORE_F32_ROUNDED = 2,
} dp_bf16_store;

size_t dp__gemm_bf16_workspace_bytes(int M, int N, int K);
void dp__gemm_bf16(int transA, int transB, int M, int N, int K, const void *A, int lda,
                   dp_bf16_store a_store, const void *B, int ldb, dp_bf16_store b_store,
                   void *C, int ldc, dp_bf16_store c_store, const dp_gemm_epilogue *ep,
                   void *workspace);
size_t dp__gemm_bf16_packed_b_bytes(int K, int N);
void dp__gemm_bf16_pack_b(int transB, int K, int N, const void *B, int ldb,
                          dp_bf16_store b_store, void *dst);
void dp__gemm_bf16_pb(int transA, int transB, int M, int N, int K, const void *A, int lda,
                      dp_bf16_store a_store, const void *Bpacked, void *C, int ldc,
                      dp_bf16_store c_store, const dp_gemm_epilogue *ep, void *workspace);
void dp__gemm_bf16_colsum(int M, int N, const dp_bf16 *A, int lda, float *out);
const char *dp__gemm_bf16_tier_name(void);

#ifdef __cplusplus
}
#endif

#endif
