/* The sequence layers on the GPU (cuda/sequence.cu): the token + position
 * embedding, causal multi-head self-attention over a fused (T, 3D) q, k, v
 * row, and the residual add, with lib/cpu/sequence.c's arithmetic and orders.
 * C++, internal.
 *
 * Launchers enqueue on `st` and return cudaGetLastError(); nothing is
 * enqueued for no elements. No atomics: every output element is written by
 * one thread in a fixed order, so the embedding, the residual add and the
 * softmax kernels give the CPU's bits from the same inputs; the attention's
 * products are cuBLAS's (cublasSgemmStridedBatched), bit for bit the CPU's
 * only where cuBLAS's order is the CPU's one fma chain (docs/GPU.md). */
#ifndef DP_CUDA_SEQUENCE_CUH
#define DP_CUDA_SEQUENCE_CUH

#include "kernels.cuh"

/* y (n, T, D) = token row ids[r][t] of w (V, D) + position row t of the
 * (T, D) after it. ids are floats, checked integers in [0, V) (lib/core/ctx.c);
 * an id out of range adds nothing to its position row (no read out of bounds). */
cudaError_t dp_k_embed_forward(cudaStream_t st, const dp_layer *l, int n, const float *ids,
                               const float *w, float *y);
/* dw (V + T, D) written, not accumulated: each token row sums dy's rows of
 * that id, (r, t) ascending from +0, each position row dy's rows at that
 * position, r ascending (dp__embed_backward's order). */
cudaError_t dp_k_embed_backward(cudaStream_t st, const dp_layer *l, int n, const float *ids,
                                const float *dy, float *dw);
/* y (count) = skip + x: a residual block's end. */
cudaError_t dp_k_residual_add(cudaStream_t st, const float *skip, const float *x, float *y,
                              size_t count);

/* qkv (n, T, 3D) -> y (n, T, D), the probabilities p (n, H, T, T) saved. */
dp_status dp__cuda_attention_forward(cublasHandle_t h, cudaStream_t st, const dp_layer *l,
                                     int n, const float *qkv, float *p, float *y);
/* dqkv (n, T, 3D) written from dy (n, T, D), qkv and p; ws: ws_bytes of
 * scratch, at least dp__cuda_attention_ws_bytes(l, n) (dp_cuda.h: after the
 * cuBLAS workspace, where conv2d's buffers lie; DP_ERR_BACKEND otherwise,
 * nothing enqueued). */
dp_status dp__cuda_attention_backward(cublasHandle_t h, cudaStream_t st, const dp_layer *l,
                                      int n, const float *qkv, const float *p,
                                      const float *dy, float *dqkv, void *ws,
                                      size_t ws_bytes);

/* The building blocks: the causal softmax of s (rows of T, in place, rows * T
 * floats; row r is query position r % T), and its backward: ds (n, T, T) in
 * place from d(probabilities) and the saved probabilities p, matrix b of
 * which starts at p + b * p_stride. */
cudaError_t dp_k_causal_softmax(cudaStream_t st, float *s, int rows, int T, float scale);
cudaError_t dp_k_causal_softmax_backward(cudaStream_t st, const float *p, size_t p_stride,
                                         float *ds, int n, int T, float scale);

/* Loads this file's kernels on the current device (dp_k_preload calls it). */
cudaError_t dp_k_sequence_preload(void);

#endif
