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

/* Attention dropout's keys (lib/cpu/cpu.h's dp_attn_drop): probability (h, i,
 * j <= i) of the micro-batch's row r is kept, times 1 / (1 - l->p), when
 * u(seed, DP_RNG_DROPOUT, (hdr->sc.step << 16) | layer, row0 + r, h T T + i T + j)
 * >= l->p. The step is read on the device, as k_dropout's (graph replays). */
struct dp_cuda_attn_drop {
  uint64_t seed, layer, row0;
  const dp_cuda_header *hdr;
};

/* qkv (n, T, 3D) -> y (n, T, D), the probabilities p (n, H, T, T) saved (before
 * the dropout). drop: NULL, or the dropout's keys; then y = (kept p) v, each
 * head's kept probabilities in the second scratch block of ws (ws_bytes, at
 * least dp__cuda_attention_ws_bytes(l, n); DP_ERR_BACKEND otherwise). */
dp_status dp__cuda_attention_forward(cublasHandle_t h, cudaStream_t st, const dp_layer *l,
                                     int n, const float *qkv, float *p, float *y,
                                     const dp_cuda_attn_drop *drop, void *ws,
                                     size_t ws_bytes);
/* dqkv (n, T, 3D) written from dy (n, T, D), qkv and p; drop as the forward's
 * (the kept probabilities made again from the keys); ws: ws_bytes of scratch,
 * at least dp__cuda_attention_ws_bytes(l, n) (dp_cuda.h: after the cuBLAS
 * workspace, where conv2d's buffers lie; DP_ERR_BACKEND otherwise, nothing
 * enqueued). */
dp_status dp__cuda_attention_backward(cublasHandle_t h, cudaStream_t st, const dp_layer *l,
                                      int n, const float *qkv, const float *p,
                                      const float *dy, float *dqkv,
                                      const dp_cuda_attn_drop *drop, void *ws,
                                      size_t ws_bytes);

/* The building blocks: the causal softmax of s (rows of T, in place, rows * T
 * floats; row r is query position r % T), and its backward: ds (n, T, T) in
 * place from d(probabilities) and the saved probabilities p, matrix b of
 * which starts at p + b * p_stride. With the kept probabilities pd (n, T, T;
 * NULL: no dropout) d(probabilities) goes through the dropout first: times
 * keep where pd is not 0, else 0 (lib/cpu/sequence.c's test). */
cudaError_t dp_k_causal_softmax(cudaStream_t st, float *s, int rows, int T, float scale);
cudaError_t dp_k_causal_softmax_backward(cudaStream_t st, const float *p, size_t p_stride,
                                         float *ds, int n, int T, float scale,
                                         const float *pd, float keep);
/* pd (n, T, T) = head h's probabilities (matrix b at p + b * p_stride) with
 * the dropout's mask (dp_cuda_attn_drop) and scale keep = 1 / (1 - l->p); 0
 * above the diagonal. */
cudaError_t dp_k_attention_drop(cudaStream_t st, const dp_layer *l,
                                const dp_cuda_attn_drop *drop, int h, const float *p,
                                size_t p_stride, float *pd, int n, float keep);

/* Loads this file's kernels on the current device (dp_k_preload calls it). */
cudaError_t dp_k_sequence_preload(void);

#endif
