/* The CUDA backend's per-device state, shared by the step code (backend.cu)
 * and the set-up code (context.cu). Internal. */
#ifndef DP_CUDA_BACKEND_CUH
#define DP_CUDA_BACKEND_CUH

#include "kernels.cuh"

struct dev_ctx {
  int phys;                /* cfg.device_ids[d] */
  unsigned char *arena;    /* device memory, plan->dev_bytes[d] */
  size_t bytes;
  cudaStream_t stream;
  cudaEvent_t ev[2];       /* end of stage s: ev[s & 1] */
  cublasHandle_t blas;
  dp_cuda_header *hdr;     /* device pointer: start of WORKSPACE */
  /* bit X of touched[s & 1]: this device's stream read or wrote device X's
   * arena during stage s. Written by this device's thread only; read by the
   * others after the stage's barrier. */
  uint64_t touched[2];
  int stage;               /* the stage this device is in; -1 before the first */
};

struct cuda_ctx {
  const dp_plan *plan;
  int n;
  unsigned flags;
  dp_cuda_header *host_hdr; /* pinned, n entries: what step_end reads back */
  dev_ctx dev[DP_MAX_DEVICES];
};

/* The thread's current logical device, set by dp__cuda_stage_begin: the
 * transport's copy() is not told which device executes it. */
extern thread_local cuda_ctx *tl_ctx;
extern thread_local int tl_dev;

static inline dp_status use_device(int phys) {
  int cur = -1;
  DP_CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != phys) DP_CUDA_CHECK(cudaSetDevice(phys));
  return DP_OK;
}

#endif
