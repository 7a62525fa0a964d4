/* The linear layer's GEMMs through cuBLAS. cuBLAS is column-major and our
 * buffers are row-major; a row-major (r, c) matrix is the column-major (c, r)
 * matrix, its transpose, so each product is computed transposed:
 *
 *   forward      Y (rows, out) = X W^T     as  Y^T (out, rows) = W^T' X^T'
 *                  cublasSgemm(T, N, m = out, n = rows, k = in,  A = W ld in,  B = X ld in,
 * C = Y ld out) grad-weight  dW (out, in) = dY^T X     as  dW^T (in, out) = X^T' dY'
 *                  cublasSgemm(N, T, m = in,  n = out,  k = rows, A = X ld in,  B = dY ld
 * out, C = dW ld in) grad-input   dX (rows, in) = dY W      as  dX^T (in, rows) = W^T'
 * dY^T' cublasSgemm(N, N, m = in,  n = rows, k = out, A = W ld in,  B = dY ld out, C = dX
 * ld in)
 *
 * (M' is the column-major view of a row-major M.) Bias add and bias gradient
 * are kernels (cuda/kernels.cu): y = acc + b after the whole accumulation,
 * db = column sums of dY, rows ascending, as on the CPU.
 *
 * Each logical device has its own handle, bound to its stream, with the
 * cuBLAS workspace carved from its arena (never cuBLAS's own pool: no
 * allocation during a step, and a fixed workspace size keeps the algorithm
 * choice, and with it the bits, fixed). */
#include "kernels.cuh"

static dp_status blas_configure(cublasHandle_t h, cudaStream_t st, void *ws,
                                size_t ws_bytes, bool tf32) {
  /* cublasSetStream resets the workspace to cuBLAS's default pool: stream first. */
  DP_CUBLAS_CHECK(cublasSetStream(h, st));
  if (ws) DP_CUBLAS_CHECK(cublasSetWorkspace(h, ws, ws_bytes));
  cublasMath_t mode =
      (cublasMath_t)((tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                     CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  DP_CUBLAS_CHECK(cublasSetMathMode(h, mode));
  DP_CUBLAS_CHECK(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED));
  DP_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
  return DP_OK;
}

dp_status dp__cuda_blas_create(cudaStream_t st, void *ws, size_t ws_bytes, bool tf32,
                               cublasHandle_t *out) {
  *out = NULL;
  cublasHandle_t h = NULL;
  DP_CUBLAS_CHECK(cublasCreate(&h));
  dp_status s = blas_configure(h, st, ws, ws_bytes, tf32);
  if (s != DP_OK) {
    (void)cublasDestroy(h);
    return s;
  }
  *out = h;
  return DP_OK;
}

dp_status dp__cuda_linear_forward(cublasHandle_t h, cudaStream_t st, int rows, int in,
                                  int out, const float *x, const float *w, const float *b,
                                  bool relu, float *y) {
  if (rows <= 0) return DP_OK;
  const float one = 1.0f, zero = 0.0f;
  DP_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, w, in, x,
                              in, &zero, y, out));
  if (b || relu) DP_CUDA_CHECK(dp_k_bias_add(st, y, b, rows, out, relu));
  return DP_OK;
}

dp_status dp__cuda_linear_backward(cublasHandle_t h, cudaStream_t st, int rows, int in,
                                   int out, const float *x, const float *w, const float *dy,
                                   float *dw, float *db, const float *relu_out, float *dx) {
  const float one = 1.0f, zero = 0.0f;
  /* rows == 0 cannot come from the schedule (empty micro-batches have no
   * ops); cuBLAS with k = 0 and beta = 0 would write zeros, as the CPU does. */
  DP_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, &one, x, in, dy,
                              out, &zero, dw, in));
  if (db) DP_CUDA_CHECK(dp_k_colsum(st, dy, rows, out, db));
  if (dx && rows > 0)
    DP_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, &one, w, in, dy,
                                out, &zero, dx, in));
  if (dx && relu_out && rows > 0) /* in place: each element reads its own dx first */
    DP_CUDA_CHECK(
        dp_k_act_backward(st, DP_LAYER_RELU, relu_out, dx, dx, (size_t)rows * in, 0.0f));
  return DP_OK;
}
