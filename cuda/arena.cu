/* Arenas: one cudaMalloc per device, one pinned host block for staging. Called
 * at context creation only; nothing here runs during a step. */
#include "common.cuh"

static double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

extern "C" dp_status dp__cuda_arena_alloc(int dev, size_t bytes, void **out) {
  if (!out) return DP_FAIL(DP_ERR_INVALID, "cuda device %d: arena: out is NULL", dev);
  *out = NULL;
  dp_cuda_device_scope scope;
  dp_status s = scope.enter(dev);
  if (s != DP_OK) return s;
  if (bytes == 0) return DP_OK;
  size_t free_b = 0, total_b = 0;
  cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaMemGetInfo", "cuda device %d", dev);
  }
  if (bytes > free_b)
    return DP_FAIL(
        DP_ERR_NOMEM,
        "cuda device %d: arena of %zu bytes (%.1f MiB) planned, but only %zu bytes "
        "(%.1f MiB) free of %zu",
        dev, bytes, mib(bytes), free_b, mib(free_b), total_b);
  void *p = NULL;
  e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* an allocation failure must not poison later calls */
    return DP_CUDA_FAIL(
        e == cudaErrorMemoryAllocation ? DP_ERR_NOMEM : DP_ERR_BACKEND, e, "cudaMalloc",
        "cuda device %d: arena of %zu bytes (%.1f MiB) planned, %zu bytes free", dev, bytes,
        mib(bytes), free_b);
  }
  *out = p;
  return DP_OK;
}

extern "C" void dp__cuda_arena_free(int dev, void *p) {
  if (!p) return;
  dp_cuda_device_scope scope;
  (void)scope.enter(dev); /* cudaFree finds the device of p by itself */
  cudaError_t e = cudaFree(p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaFree", "cuda device %d: arena free", dev);
  }
}

extern "C" dp_status dp__cuda_host_alloc(size_t bytes, void **out) {
  if (!out) return DP_FAIL(DP_ERR_INVALID, "host staging arena: out is NULL");
  *out = NULL;
  if (bytes == 0) return DP_OK;
  void *p = NULL;
  cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return DP_CUDA_FAIL(
        e == cudaErrorMemoryAllocation ? DP_ERR_NOMEM : DP_ERR_BACKEND, e, "cudaHostAlloc",
        "pinned host staging arena of %zu bytes (%.1f MiB)", bytes, mib(bytes));
  }
  *out = p;
  return DP_OK;
}

extern "C" void dp__cuda_host_free(void *p) {
  if (!p) return;
  cudaError_t e = cudaFreeHost(p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaFreeHost", "pinned host staging arena %p", p);
  }
}
