/* Self-tests of the CUDA backend for tests/test_cuda.c and tests/gpu/run.sh:
 * the device RNG over a table of keys, and an SGEMM timing. Unlike the
 * backend these allocate (cudaMalloc, streams, handles): they are never part
 * of a step. */
#include "kernels.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The layer GEMMs (dp__cuda_linear_forward/backward, the backend's own calls)
 * on operands placed at every 4-byte offset 0..128 B from a 256-aligned base,
 * for widths 7, 8 and 1024 (the leading dimensions), 37 rows: cuBLAS may pick
 * another kernel for another alignment, and activations of a micro-batch sit
 * at row offsets inside the arena, so the bits must not depend on it. Every
 * result is compared with the offset-0 one by memcmp; *differ counts the
 * (shape, offset, product) triples whose bits differ, and `first` names the
 * first. */
static dp_status sweep(int dev, const int *widths, int n_widths, int step, int *checked,
                       int *differ, char *first, size_t cap) {
  if (!checked || !differ) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_gemm_alignment_sweep");
  *checked = *differ = 0;
  if (first && cap) first[0] = '\0';
  dp_cuda_device_scope scope;
  dp_status s = scope.enter(dev);
  if (s != DP_OK) return s;
  const int rows = 37, maxw = 1024, slack = 128;
  const size_t big = (size_t)maxw * maxw * 4 + slack, act = (size_t)rows * maxw * 4 + slack;
  dev_buf x, w, y, dy, dw, dx, ws;
  DP_CUDA_CHECK(cudaMalloc(&x.p, act));
  DP_CUDA_CHECK(cudaMalloc(&w.p, big));
  DP_CUDA_CHECK(cudaMalloc(&y.p, act));
  DP_CUDA_CHECK(cudaMalloc(&dy.p, act));
  DP_CUDA_CHECK(cudaMalloc(&dw.p, big));
  DP_CUDA_CHECK(cudaMalloc(&dx.p, act));
  DP_CUDA_CHECK(cudaMalloc(&ws.p, DP_CUDA_BLAS_WS_BYTES));
  stream_guard g;
  DP_CUDA_CHECK(cudaStreamCreateWithFlags(&g.s, cudaStreamNonBlocking));
  s = dp__cuda_blas_create(g.s, ws.p, DP_CUDA_BLAS_WS_BYTES, false, &g.h);
  if (s != DP_OK) return s;
  /* host copies: the inputs (the same values at every offset) and the results */
  size_t hb = (size_t)maxw * maxw;
  float *hin = (float *)malloc(hb * 4), *ref[3], *got = (float *)malloc(hb * 4);
  for (int i = 0; i < 3; i++) ref[i] = (float *)malloc(hb * 4);
  if (!hin || !got || !ref[0] || !ref[1] || !ref[2]) {
    free(hin), free(got), free(ref[0]), free(ref[1]), free(ref[2]);
    return DP_FAIL(DP_ERR_NOMEM, "dp__cuda_gemm_alignment_sweep: out of memory");
  }
  for (size_t i = 0; i < hb; i++) hin[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  for (int a = 0; a < n_widths && s == DP_OK; a++)
    for (int b = 0; b < n_widths && s == DP_OK; b++) {
      int in = widths[a], out = widths[b];
      for (int off = 0; off <= slack && s == DP_OK; off += step) {
        unsigned char *px = (unsigned char *)x.p + off, *pw = (unsigned char *)w.p + off,
                      *py = (unsigned char *)y.p + off, *pdy = (unsigned char *)dy.p + off,
                      *pdw = (unsigned char *)dw.p + off,
                      *pdx = (unsigned char *)dx.p + off;
        /* on the GEMMs' own stream: a cudaMemcpy from pageable memory runs on the
         * legacy stream, which a non-blocking stream is not ordered after */
        cudaError_t e =
            cudaMemcpyAsync(px, hin, (size_t)rows * in * 4, cudaMemcpyHostToDevice, g.s);
        if (e == cudaSuccess)
          e = cudaMemcpyAsync(pw, hin, (size_t)out * in * 4, cudaMemcpyHostToDevice, g.s);
        if (e == cudaSuccess)
          e = cudaMemcpyAsync(pdy, hin, (size_t)rows * out * 4, cudaMemcpyHostToDevice,
                              g.s);
        if (e != cudaSuccess) {
          (void)cudaGetLastError();
          s = DP_FAIL(DP_ERR_BACKEND, "alignment sweep: cudaMemcpyAsync: %s",
                      cudaGetErrorString(e));
          break;
        }
        s = dp__cuda_linear_forward(g.h, g.s, rows, in, out, (const float *)px,
                                    (const float *)pw, NULL, false, (float *)py);
        if (s == DP_OK)
          s = dp__cuda_linear_backward(g.h, g.s, rows, in, out, (const float *)px,
                                       (const float *)pw, (const float *)pdy, (float *)pdw,
                                       NULL, NULL, (float *)pdx);
        if (s != DP_OK) break;
        const void *res[3] = {py, pdw, pdx};
        size_t n[3] = {(size_t)rows * out, (size_t)out * in, (size_t)rows * in};
        static const char *const what[3] = {"forward y", "backward dW", "backward dx"};
        for (int r = 0; r < 3 && s == DP_OK; r++) {
          e = cudaMemcpyAsync(off ? got : ref[r], res[r], n[r] * 4, cudaMemcpyDeviceToHost,
                              g.s);
          if (e == cudaSuccess) e = cudaStreamSynchronize(g.s);
          if (e != cudaSuccess) {
            (void)cudaGetLastError();
            s = DP_FAIL(DP_ERR_BACKEND, "alignment sweep: %s", cudaGetErrorString(e));
            break;
          }
          if (!off) continue;
          (*checked)++;
          if (memcmp(got, ref[r], n[r] * 4) != 0) {
            if (!*differ && first && cap)
              snprintf(first, cap, "%s, in %d, out %d, offset %d B", what[r], in, out, off);
            (*differ)++;
          }
        }
      }
    }
  free(hin), free(got), free(ref[0]), free(ref[1]), free(ref[2]);
  return s;
}

extern "C" dp_status dp__cuda_gemm_alignment_sweep(int dev, int *checked, int *differ,
                                                   char *first, size_t cap) {
  static const int widths[] = {7, 8, 1024};
  return sweep(dev, widths, 3, 4, checked, differ, first, cap);
}

/* The same at offsets that keep every operand 16-byte aligned, with leading
 * dimensions that are multiples of 4 (widths 8 and 1024). */
extern "C" dp_status dp__cuda_gemm_alignment_sweep_aligned(int dev, int *checked,
                                                           int *differ) {
  static const int widths[] = {8, 1024};
  return sweep(dev, widths, 2, 16, checked, differ, NULL, 0);
}
