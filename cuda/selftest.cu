/* Self-tests of the CUDA backend for tests/test_cuda.c and tests/gpu/run.sh:
 * the device RNG over a table of keys, and an SGEMM timing. Unlike the
 * backend these allocate (cudaMalloc, streams, handles): they are never part
 * of a step. */
#include "kernels.cuh"

namespace {
/* Device memory freed on scope exit (the current device must be the one it
 * was allocated on, or any: cudaFree finds it). */
struct dev_buf {
  void *p = nullptr;
  dev_buf() = default;
  dev_buf(const dev_buf &) = delete;
  dev_buf &operator=(const dev_buf &) = delete;
  ~dev_buf() {
    if (p && cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
  }
};

struct stream_guard {
  cudaStream_t s = nullptr;
  cublasHandle_t h = nullptr;
  cudaEvent_t ev[2] = {nullptr, nullptr};
  stream_guard() = default;
  stream_guard(const stream_guard &) = delete;
  stream_guard &operator=(const stream_guard &) = delete;
  ~stream_guard() {
    if (h) (void)cublasDestroy(h);
    for (int i = 0; i < 2; i++)
      if (ev[i] && cudaEventDestroy(ev[i]) != cudaSuccess) (void)cudaGetLastError();
    if (s && cudaStreamDestroy(s) != cudaSuccess) (void)cudaGetLastError();
  }
};
} // namespace

extern "C" dp_status dp__cuda_rng_table(uint64_t seed, uint64_t stream, const uint64_t *abc,
                                        int n, uint64_t *u64, float *uniform) {
  if (n < 0 || (n > 0 && (!abc || !u64 || !uniform)))
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_rng_table: bad arguments");
  if (n == 0) return DP_OK;
  dp_cuda_device_scope scope;
  dp_status s = scope.enter(0);
  if (s != DP_OK) return s;
  dev_buf keys, ou, of;
  size_t nk = (size_t)n * 3 * sizeof *abc;
  DP_CUDA_CHECK(cudaMalloc(&keys.p, nk));
  DP_CUDA_CHECK(cudaMalloc(&ou.p, (size_t)n * sizeof *u64));
  DP_CUDA_CHECK(cudaMalloc(&of.p, (size_t)n * sizeof *uniform));
  DP_CUDA_CHECK(cudaMemcpy(keys.p, abc, nk, cudaMemcpyHostToDevice));
  DP_CUDA_CHECK(dp_k_rng_table(0, seed, stream, (const uint64_t *)keys.p, n,
                               (uint64_t *)ou.p, (float *)of.p));
  DP_CUDA_CHECK(cudaMemcpy(u64, ou.p, (size_t)n * sizeof *u64, cudaMemcpyDeviceToHost));
  DP_CUDA_CHECK(
      cudaMemcpy(uniform, of.p, (size_t)n * sizeof *uniform, cudaMemcpyDeviceToHost));
  return DP_OK;
}

extern "C" dp_status dp__cuda_bench_sgemm(int dev, int m, int n, int k, int iters, int tf32,
                                          double *ms, double *tflops) {
  if (m < 1 || n < 1 || k < 1 || iters < 1 || !ms || !tflops)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_bench_sgemm: bad arguments");
  dp_cuda_device_scope scope;
  dp_status s = scope.enter(dev);
  if (s != DP_OK) return s;
  dev_buf a, b, c, ws;
  DP_CUDA_CHECK(cudaMalloc(&a.p, (size_t)m * k * 4));
  DP_CUDA_CHECK(cudaMalloc(&b.p, (size_t)k * n * 4));
  DP_CUDA_CHECK(cudaMalloc(&c.p, (size_t)m * n * 4));
  DP_CUDA_CHECK(cudaMalloc(&ws.p, DP_CUDA_BLAS_WS_BYTES));
  stream_guard g;
  DP_CUDA_CHECK(cudaStreamCreateWithFlags(&g.s, cudaStreamNonBlocking));
  DP_CUDA_CHECK(cudaEventCreate(&g.ev[0]));
  DP_CUDA_CHECK(cudaEventCreate(&g.ev[1]));
  s = dp__cuda_blas_create(g.s, ws.p, DP_CUDA_BLAS_WS_BYTES, tf32 != 0, &g.h);
  if (s != DP_OK) return s;
  /* 1.0f everywhere: finite, not denormal. */
  DP_CUDA_CHECK(dp_k_fill(g.s, (uint32_t *)a.p, 0x3f800000u, (size_t)m * k));
  DP_CUDA_CHECK(dp_k_fill(g.s, (uint32_t *)b.p, 0x3f800000u, (size_t)k * n));
  const float one = 1.0f, zero = 0.0f;
  for (int i = 0; i < iters + 2; i++) { /* two warm-up runs */
    if (i == 2) DP_CUDA_CHECK(cudaEventRecord(g.ev[0], g.s));
    DP_CUBLAS_CHECK(cublasSgemm(g.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one,
                                (const float *)a.p, m, (const float *)b.p, k, &zero,
                                (float *)c.p, m));
  }
  DP_CUDA_CHECK(cudaEventRecord(g.ev[1], g.s));
  DP_CUDA_CHECK(cudaEventSynchronize(g.ev[1]));
  float total = 0.0f;
  DP_CUDA_CHECK(cudaEventElapsedTime(&total, g.ev[0], g.ev[1]));
  *ms = (double)total / iters;
  *tflops = 2.0 * m * n * k / (*ms * 1e-3) / 1e12;
  return DP_OK;
}
