/* TEMPORARY scalar reference of lib/cpu/bf16.h (replaced by the bf16-kernel branch). */
#include "cpu/bf16.h"

#include <math.h>
#include <string.h>

dp_bf16 dp__bf16_from_f32(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (dp_bf16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (dp_bf16)(u >> 16);
}
float dp__bf16_to_f32(dp_bf16 h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}
void dp__bf16_from_f32_n(const float *x, dp_bf16 *y, size_t n) {
  for (size_t k = 0; k < n; k++) y[k] = dp__bf16_from_f32(x[k]);
}
void dp__bf16_to_f32_n(const dp_bf16 *x, float *y, size_t n) {
  for (size_t k = 0; k < n; k++) y[k] = dp__bf16_to_f32(x[k]);
}
void dp__bf16_round_f32_n(float *x, size_t n) {
  for (size_t k = 0; k < n; k++) x[k] = dp__bf16_to_f32(dp__bf16_from_f32(x[k]));
}
static float flush(float x) { return fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x; }
static float get(const void *M, size_t idx, dp_bf16_store s) {
  if (s == DP_BF16_STORE_BF16) return dp__bf16_to_f32(((const dp_bf16 *)M)[idx]);
  return dp__bf16_to_f32(dp__bf16_from_f32(((const float *)M)[idx]));
}
static void put(void *C, size_t idx, dp_bf16_store s, float v) {
  if (s == DP_BF16_STORE_BF16)
    ((dp_bf16 *)C)[idx] = dp__bf16_from_f32(v);
  else if (s == DP_BF16_STORE_F32_ROUNDED)
    ((float *)C)[idx] = dp__bf16_to_f32(dp__bf16_from_f32(v));
  else
    ((float *)C)[idx] = v;
}
size_t dp__gemm_bf16_workspace_bytes(int M, int N, int K) {
  (void)M, (void)N, (void)K;
  return 0;
}
void dp__gemm_bf16(int transA, int transB, int M, int N, int K, const void *A, int lda,
                   dp_bf16_store a_store, const void *B, int ldb, dp_bf16_store b_store,
                   void *C, int ldc, dp_bf16_store c_store, const dp_gemm_epilogue *ep,
                   void *workspace) {
  (void)workspace;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float acc = 0.0f;
      for (int k0 = 0; k0 < K; k0 += 2)
        for (int t = 1; t >= 0; t--) {
          int k = k0 + t;
          if (k >= K) continue;
          float a =
              flush(get(A, transA ? (size_t)k * lda + i : (size_t)i * lda + k, a_store));
          float b =
              flush(get(B, transB ? (size_t)j * ldb + k : (size_t)k * ldb + j, b_store));
          acc = flush(fmaf(a, b, flush(acc)));
        }
      if (ep && ep->bias) acc += ep->bias[j];
      if (ep && ep->act == DP_GEMM_ACT_RELU) acc = acc <= 0.0f ? 0.0f : acc;
      put(C, (size_t)i * ldc + j, c_store, acc);
    }
}
size_t dp__gemm_bf16_packed_b_bytes(int K, int N) { return (size_t)K * N * 2; }
void dp__gemm_bf16_pack_b(int transB, int K, int N, const void *B, int ldb,
                          dp_bf16_store b_store, void *dst) {
  dp_bf16 *d = dst;
  for (int k = 0; k < K; k++)
    for (int j = 0; j < N; j++)
      d[(size_t)k * N + j] = dp__bf16_from_f32(
          get(B, transB ? (size_t)j * ldb + k : (size_t)k * ldb + j, b_store));
}
void dp__gemm_bf16_pb(int transA, int transB, int M, int N, int K, const void *A, int lda,
                      dp_bf16_store a_store, const void *Bpacked, void *C, int ldc,
                      dp_bf16_store c_store, const dp_gemm_epilogue *ep, void *workspace) {
  (void)transB;
  dp__gemm_bf16(transA, 0, M, N, K, A, lda, a_store, Bpacked, N, DP_BF16_STORE_BF16, C, ldc,
                c_store, ep, workspace);
}
void dp__gemm_bf16_colsum(int M, int N, const dp_bf16 *A, int lda, float *out) {
  for (int j = 0; j < N; j++) {
    float s = 0.0f;
    for (int i = 0; i < M; i++) s += dp__bf16_to_f32(A[(size_t)i * lda + j]);
    out[j] = s;
  }
}
const char *dp__gemm_bf16_tier_name(void) { return "reference"; }
