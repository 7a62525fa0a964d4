/* The image layers on the GPU (cuda/conv.cu): conv2d as im2col + cuBLAS
 * GEMMs (cuda/gemm.cu's linear-layer calls at (n P, CKK) x (OUT, CKK)),
 * maxpool2d and avgpool2d, NCHW as lib/cpu/conv.c. C++, internal.
 *
 * Launchers enqueue on `st` and return cudaGetLastError(); nothing is
 * enqueued for no elements. No atomics: every output element is written by
 * one thread, and every sum (col2im, the pools' backward, avgpool's window)
 * runs in a fixed ascending order that is lib/cpu/conv.c's, so these kernels give
 * the CPU's bits from the same inputs; only the GEMMs (cuBLAS) and the bias
 * gradient (k_colsum's order) differ from the CPU in the last bits. */
#ifndef DP_CUDA_CONV_CUH
#define DP_CUDA_CONV_CUH

#include "kernels.cuh"

/* y (n, OUT, OH, OW) = conv2d of x (n, C, H, W) by w (OUT, C, K, K) [+ the
 * bias (OUT) after w when l->bias]. ws: conv2d's part of the WORKSPACE region
 * (dp_cuda.h, DP_CUDA_CONV_WS_OFFSET), ws_bytes of it: COL then T, at least
 * dp__cuda_conv_workspace_bytes(l, n) (DP_ERR_BACKEND otherwise, nothing
 * enqueued). */
dp_status dp__cuda_conv_forward(cublasHandle_t h, cudaStream_t st, const dp_layer *l, int n,
                                const float *x, const float *w, float *y, void *ws,
                                size_t ws_bytes);
/* dw (OUT, CKK) and db (OUT, NULL without a bias) written, not accumulated;
 * dx (n, C, H, W) written, NULL when not needed. */
dp_status dp__cuda_conv_backward(cublasHandle_t h, cudaStream_t st, const dp_layer *l,
                                 int n, const float *x, const float *w, const float *dy,
                                 float *dw, float *db, float *dx, void *ws,
                                 size_t ws_bytes);

/* maxpool2d (first largest real cell in (ky, kx) order, a NaN at once) or
 * avgpool2d (the real cells' sum in (ky, kx) order, then / (K K), or / their
 * count with exclude_pad) of x (n, C, H, W), padding l->pad. */
cudaError_t dp_k_pool_forward(cudaStream_t st, const dp_layer *l, int n, const float *x,
                              float *y);
/* dx (n, C, H, W) written: each element gathers, over the windows that
 * contain it in (oy, ox) order, dy / the window's divisor (avg) or dy where
 * it is the window's max (max: x needed). */
cudaError_t dp_k_pool_backward(cudaStream_t st, const dp_layer *l, int n, const float *x,
                               const float *dy, float *dx);

/* The building blocks, for tests and the throwaway host emulation:
 * COL (n P, CKK) of x; dx = col2im(dCOL) as a gather; the (n P, OUT) <->
 * (n, OUT, P) transposes. */
cudaError_t dp_k_im2col(cudaStream_t st, const dp_layer *l, int n, const float *x,
                        float *col);
cudaError_t dp_k_col2im(cudaStream_t st, const dp_layer *l, int n, const float *dcol,
                        float *dx);
cudaError_t dp_k_rows_to_planes(cudaStream_t st, int n, int P, int out, const float *t,
                                float *y);
cudaError_t dp_k_planes_to_rows(cudaStream_t st, int n, int P, int out, const float *dy,
                                float *t);

/* Loads this file's kernels on the current device (dp_k_preload calls it). */
cudaError_t dp_k_conv_preload(void);

#endif
