/* CUDA backend entry points, callable from C. Internal: not installed.
 *
 * A CUDA build implements them in cuda/NAME.cu; a build without CUDA links
 * cuda/none.c instead, where every call fails with DP_ERR_UNSUPPORTED.
 * Include it as "dp_cuda.h" (build.ninja passes -iquote cuda), never <cuda.h>,
 * which is the CUDA driver API. Errors are recorded with DP_FAIL and read
 * back with dp_last_error(). */
#ifndef DP_CUDA_H
#define DP_CUDA_H

#include <stddef.h>

#include "dp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dp_cuda_available() and dp_cuda_device_count() are public: see dp.h. */

/* Name (NUL-terminated, cut to cap), memory and compute capability of GPU
 * `dev`. Any output pointer may be NULL. free_mem is read on the device, so
 * the call creates the device's primary context. */
dp_status dp__cuda_device_info(int dev, char *name, size_t cap, size_t *total_mem,
                               size_t *free_mem, int *sm_major, int *sm_minor);

/* One cudaMalloc of `bytes` on GPU `dev`: a device arena (aligned to at least
 * 256 bytes). Refuses with DP_ERR_NOMEM, naming the device, the bytes planned
 * and the bytes free, when `bytes` exceeds the free memory cudaMemGetInfo
 * reports. bytes == 0 gives *out = NULL and DP_OK. The calling thread's
 * current device is left as it was. */
dp_status dp__cuda_arena_alloc(int dev, size_t bytes, void **out);
void dp__cuda_arena_free(int dev, void *p); /* p may be NULL */

/* Pinned host staging memory (cudaHostAlloc, portable to every device).
 * bytes == 0 gives *out = NULL and DP_OK. */
dp_status dp__cuda_host_alloc(size_t bytes, void **out);
void dp__cuda_host_free(void *p); /* p may be NULL */

#ifdef __cplusplus
}
#endif
#endif
