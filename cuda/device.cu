/* Device queries: is there a GPU, which one, how much memory is free. */
#include "common.cuh"

#include <stdio.h>

extern "C" int dp__cuda_device_count(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    /* No driver, no device, or a driver older than the runtime: not a crash. */
    (void)cudaGetLastError();
    DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaGetDeviceCount", "no usable GPU (runtime %d)",
                 CUDART_VERSION);
    return 0;
  }
  if (n <= 0) {
    DP_FAIL(DP_ERR_BACKEND, "no usable GPU: cudaGetDeviceCount found none");
    return 0;
  }
  return n;
}

dp_status dp_cuda_device_scope::enter(int dev) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaGetDeviceCount", "cuda device %d", dev);
  }
  if (dev < 0 || dev >= n)
    return DP_FAIL(DP_ERR_INVALID, "cuda device %d: no such device (%d visible)", dev, n);
  int prev = 0;
  e = cudaGetDevice(&prev);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaGetDevice", "cuda device %d", dev);
  }
  if (prev != dev) {
    e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaSetDevice", "cuda device %d", dev);
    }
    prev_ = prev;
    switched_ = true;
  }
  return DP_OK;
}

dp_cuda_device_scope::~dp_cuda_device_scope() {
  if (switched_ && cudaSetDevice(prev_) != cudaSuccess) (void)cudaGetLastError();
}

extern "C" dp_status dp__cuda_device_info(int dev, char *name, size_t cap,
                                          size_t *total_mem, size_t *free_mem,
                                          int *sm_major, int *sm_minor) {
  dp_cuda_device_scope scope;
  dp_status s = scope.enter(dev);
  if (s != DP_OK) return s;
  cudaDeviceProp prop;
  cudaError_t e = cudaGetDeviceProperties(&prop, dev);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaGetDeviceProperties", "cuda device %d",
                        dev);
  }
  size_t free_b = 0, total_b = 0;
  if (free_mem || total_mem) {
    e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaMemGetInfo", "cuda device %d", dev);
    }
  }
  if (name && cap > 0) snprintf(name, cap, "%s", prop.name);
  if (total_mem) *total_mem = total_b;
  if (free_mem) *free_mem = free_b;
  if (sm_major) *sm_major = prop.major;
  if (sm_minor) *sm_minor = prop.minor;
  return DP_OK;
}
