/* The CUDA entry points of a build without CUDA (configure.py --cpu-only, or no
 * nvcc): nothing is available and every call says why. */
#include "dp_cuda.h"

#include "internal.h"

#define NO_CUDA "built without CUDA"

int dp_cuda_available(void) { return 0; }

int dp_cuda_device_count(void) {
  DP_FAIL(DP_ERR_UNSUPPORTED, NO_CUDA);
  return 0;
}

dp_status dp__cuda_device_info(int dev, char *name, size_t cap, size_t *total_mem,
                               size_t *free_mem, int *sm_major, int *sm_minor) {
  (void)name, (void)cap, (void)total_mem, (void)free_mem, (void)sm_major, (void)sm_minor;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda device %d: " NO_CUDA, dev);
}

dp_status dp__cuda_arena_alloc(int dev, size_t bytes, void **out) {
  if (out) *out = NULL;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda device %d: arena of %zu bytes: " NO_CUDA, dev,
                 bytes);
}

void dp__cuda_arena_free(int dev, void *p) { (void)dev, (void)p; }

dp_status dp__cuda_host_alloc(size_t bytes, void **out) {
  if (out) *out = NULL;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "pinned host staging arena of %zu bytes: " NO_CUDA,
                 bytes);
}

void dp__cuda_host_free(void *p) { (void)p; }
