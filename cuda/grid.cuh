/* Shared by the kernel sources (cuda/kernels.cu, conv.cu, batchnorm.cu): the
 * element-wise launch shape and the unfused IEEE arithmetic that gives the
 * CPU backend's rounding steps. */
#ifndef DP_CUDA_GRID_CUH
#define DP_CUDA_GRID_CUH

#include <cuda_runtime.h>

#include <stddef.h>

/* The launch seam: nvcc's triple angle brackets here; the CPU simulation of the
 * CUDA runtime (tests/cuda_sim) defines DP_LAUNCH itself and runs these same
 * kernel bodies with their launch geometry. */
#ifndef DP_LAUNCH
#define DP_LAUNCH(k, grid, block, smem, st) k<<<(grid), (block), (smem), (st)>>>
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

static __device__ __forceinline__ float fm(float a, float b) { return __fmul_rn(a, b); }
static __device__ __forceinline__ float fa(float a, float b) { return __fadd_rn(a, b); }
static __device__ __forceinline__ float fs(float a, float b) { return __fsub_rn(a, b); }
static __device__ __forceinline__ float fd(float a, float b) { return __fdiv_rn(a, b); }

#endif
