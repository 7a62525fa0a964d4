/* Checked CUDA and cuBLAS calls for the CUDA sources (C++). Each macro is used
 * inside a function that returns dp_status: on failure it records, through
 * DP_FAIL (so with this file:line), the call's text, the error's name and its
 * description, and returns from the enclosing function:
 *
 *   DP_CUDA_CHECK(cudaStreamCreate(&s));
 *     -> "cuda/backend.cu:120: cudaStreamCreate(&s): cudaErrorInvalidDevice: invalid
 *        device ordinal"
 *
 * A failed runtime call's error is cleared with cudaGetLastError() so that it does
 * not resurface in an unrelated later check; a sticky error (an asynchronous
 * fault) stays, and every later call reports it: the context is then unusable. */
#ifndef DP_CUDA_CHECK_CUH
#define DP_CUDA_CHECK_CUH

#include "common.cuh"

#include <cublas_v2.h>

static inline dp_status dp__cuda_status_of(cudaError_t e) {
  return e == cudaErrorMemoryAllocation ? DP_ERR_NOMEM : DP_ERR_BACKEND;
}

#define DP_CUDA_CHECK(call)                                                                \
  do {                                                                                     \
    cudaError_t dp_e_ = (call);                                                            \
    if (dp_e_ != cudaSuccess) {                                                            \
      (void)cudaGetLastError();                                                            \
      return DP_FAIL(dp__cuda_status_of(dp_e_), "%s: %s: %s", #call,                       \
                     cudaGetErrorName(dp_e_), cudaGetErrorString(dp_e_));                  \
    }                                                                                      \
  } while (0)

/* The same, naming the logical device first: "device 2: <call>: ...". */
#define DP_CUDA_CHECK_D(dev, call)                                                         \
  do {                                                                                     \
    cudaError_t dp_e_ = (call);                                                            \
    if (dp_e_ != cudaSuccess) {                                                            \
      (void)cudaGetLastError();                                                            \
      return DP_FAIL(dp__cuda_status_of(dp_e_), "device %d: %s: %s: %s", (int)(dev),       \
                     #call, cudaGetErrorName(dp_e_), cudaGetErrorString(dp_e_));           \
    }                                                                                      \
  } while (0)

#define DP_CUBLAS_CHECK(call)                                                              \
  do {                                                                                     \
    cublasStatus_t dp_b_ = (call);                                                         \
    if (dp_b_ != CUBLAS_STATUS_SUCCESS)                                                    \
      return DP_FAIL(dp_b_ == CUBLAS_STATUS_ALLOC_FAILED ? DP_ERR_NOMEM : DP_ERR_BACKEND,  \
                     "%s: %s: %s", #call, cublasGetStatusName(dp_b_),                      \
                     cublasGetStatusString(dp_b_));                                        \
  } while (0)

#ifdef DP_HAVE_NCCL
#include <nccl.h>

/* The same for NCCL (only in a build with NCCL), naming the logical device:
 *   "device 1: ncclSend(...): unhandled cuda error (run with NCCL_DEBUG=INFO for
 *    details) (last NCCL error: <ncclGetLastError>)"
 * ncclGetLastError may be about an earlier asynchronous failure; it is given
 * for what it is worth. A CUDA error NCCL ran into is cleared like ours. */
#define DP_NCCL_CHECK_D(dev, comm, call)                                                   \
  do {                                                                                     \
    ncclResult_t dp_r_ = (call);                                                           \
    if (dp_r_ != ncclSuccess) {                                                            \
      const char *dp_l_ = ncclGetLastError(comm);                                          \
      (void)cudaGetLastError();                                                            \
      return DP_FAIL(DP_ERR_BACKEND, "device %d: %s: %s (last NCCL error: %s)",            \
                     (int)(dev), #call, ncclGetErrorString(dp_r_),                         \
                     dp_l_ && *dp_l_ ? dp_l_ : "none");                                    \
    }                                                                                      \
  } while (0)

#define DP_NCCL_CHECK(comm, call)                                                          \
  do {                                                                                     \
    ncclResult_t dp_r_ = (call);                                                           \
    if (dp_r_ != ncclSuccess) {                                                            \
      const char *dp_l_ = ncclGetLastError(comm);                                          \
      (void)cudaGetLastError();                                                            \
      return DP_FAIL(DP_ERR_BACKEND, "%s: %s (last NCCL error: %s)", #call,                \
                     ncclGetErrorString(dp_r_), dp_l_ && *dp_l_ ? dp_l_ : "none");         \
    }                                                                                      \
  } while (0)
#endif

/* For cleanup paths that cannot return an error: the failure is recorded (the
 * thread's last error) and otherwise ignored. */
#define DP_CUDA_TRY(call)                                                                  \
  do {                                                                                     \
    cudaError_t dp_e_ = (call);                                                            \
    if (dp_e_ != cudaSuccess) {                                                            \
      (void)cudaGetLastError();                                                            \
      DP_FAIL(DP_ERR_BACKEND, "%s: %s: %s", #call, cudaGetErrorName(dp_e_),                \
              cudaGetErrorString(dp_e_));                                                  \
    }                                                                                      \
  } while (0)

#endif
