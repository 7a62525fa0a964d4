/* Shared by the kernel sources (cuda/kernels.cu, conv.cu, batchnorm.cu): the
 * element-wise launch shape and the unfused IEEE arithmetic that gives the
 * CPU backend's rounding steps. */
#ifndef DP_CUDA_GRID_CUH
#define DP_CUDA_GRID_CUH

#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>

/* The launch seam: nvcc's triple angle brackets here; the CPU simulation of the
 * CUDA runtime (tests/cuda_sim) defines DP_LAUNCH itself and runs these same
 * kernel bodies with their launch geometry. */
#ifndef DP_LAUNCH
#define DP_LAUNCH(k, grid, block, smem, st) k<<<(grid), (block), (smem), (st)>>>
#endif

/* Unroll a fixed-count loop (so that a small array it indexes stays in
 * registers); nothing for the simulation's g++. */
#ifdef DP_CUDA_SIM
#define DP_UNROLL
#else
#define DP_UNROLL _Pragma("unroll")
#endif

#define THREADS 256
#define MAX_BLOCKS (1u << 20) /* grid-stride loops cover the rest */

#define GRID_STRIDE(i, n)                                                                  \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                  \
       i += (size_t)gridDim.x * blockDim.x)

static inline unsigned blocks_for(size_t n) {
  size_t b = (n + THREADS - 1) / THREADS;
  return b > MAX_BLOCKS ? MAX_BLOCKS : (unsigned)b;
}

/* Whether one of status[0..n_check) is set, as the whole block sees it (thread 0
 * reads the words, the block waits): the optimizer, its checked copy and the
 * running-statistics update write nothing in a refused step. Every thread of the
 * block calls it, once per kernel. */
static __device__ __forceinline__ bool block_refused(const uint32_t *status, int n_check) {
  __shared__ uint32_t refused;
  if (threadIdx.x == 0) {
    uint32_t r = 0;
    for (int d = 0; d < n_check; d++) r |= status[d];
    refused = r;
  }
  __syncthreads();
  return refused != 0;
}

static __device__ __forceinline__ float fm(float a, float b) { return __fmul_rn(a, b); }
static __device__ __forceinline__ float fa(float a, float b) { return __fadd_rn(a, b); }
static __device__ __forceinline__ float fs(float a, float b) { return __fsub_rn(a, b); }
static __device__ __forceinline__ float fd(float a, float b) { return __fdiv_rn(a, b); }

#endif
