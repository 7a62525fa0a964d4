/* The CPU simulation of the CUDA runtime (tests/cuda_sim): the subset of
 * cuda_runtime.h that cuda/ uses, plus what a kernel body sees on a GPU
 * (threadIdx, blockIdx, __shared__, __syncthreads, warp shuffles, atomics).
 *
 * cuda/*.cu compile unchanged with g++ against this header; the one seam is the
 * launch, DP_LAUNCH(kernel, grid, block, smem, stream)(args...), which nvcc
 * spells kernel<<<grid, block, smem, stream>>>(args...) (cuda/grid.cuh).
 * How the simulation runs the code: docs/GPU.md, "The CUDA simulation". */
#ifndef DP_SIM_CUDA_RUNTIME_H
#define DP_SIM_CUDA_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

#define DP_CUDA_SIM 1
#define CUDART_VERSION 13000

/* ---- types and constants ---------------------------------------------------------- */

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorPeerAccessAlreadyEnabled = 704,
  cudaErrorPeerAccessNotEnabled = 705,
  cudaErrorTooManyPeers = 711,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorUnknown = 999,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};

#define cudaStreamDefault 0x0u
#define cudaStreamNonBlocking 0x1u
#define cudaEventDefault 0x0u
#define cudaEventBlockingSync 0x1u
#define cudaEventDisableTiming 0x2u
#define cudaHostAllocDefault 0x0u
#define cudaHostAllocPortable 0x1u
#define cudaHostAllocMapped 0x2u

typedef struct dp_sim_stream *cudaStream_t;
typedef struct dp_sim_event *cudaEvent_t;
typedef struct dp_sim_graph *cudaGraph_t;
typedef struct dp_sim_graph_exec *cudaGraphExec_t;

struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void *devicePointer;
  void *hostPointer;
};
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major, minor;
  int multiProcessorCount;
  int canMapHostMemory;
  int unifiedAddressing;
  int concurrentKernels;
  int asyncEngineCount;
  int pciBusID, pciDeviceID, pciDomainID;
};
struct cudaFuncAttributes {
  size_t sharedSizeBytes;
  size_t constSizeBytes;
  size_t localSizeBytes;
  int maxThreadsPerBlock;
  int numRegs;
  int ptxVersion;
  int binaryVersion;
};

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};

/* ---- the runtime API ---------------------------------------------------------------- */

extern "C" {
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceCanAccessPeer(int *can, int dev, int peer);
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMallocManaged(void **p, size_t bytes, unsigned int flags);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t s);
cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev,
                                size_t n, cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g,
                                 unsigned long long flags);
cudaError_t cudaGraphUpload(cudaGraphExec_t x, cudaStream_t s);
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x);
cudaError_t dp_sim_func_attributes(struct cudaFuncAttributes *a, const void *fn);
/* How many cuBLAS kernels were first needed on a device while NCCL was live there. */
int dp_sim_cold_gemms(void);
}

template <typename T>
static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, T *fn) {
  return dp_sim_func_attributes(a, (const void *)fn);
}

/* ---- device code -------------------------------------------------------------------- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __restrict__ __restrict
/* One block runs at a time on a simulation thread, its GPU threads as fibers of
 * that thread: a thread-local static is exactly one block's shared memory. */
#define __shared__ static thread_local
static constexpr int warpSize = 32;

/* What the running GPU thread sees (runtime.cc switches it with the fiber). */
struct dp_sim_thread_view {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};
extern thread_local dp_sim_thread_view *dp_sim_view;
#define threadIdx (dp_sim_view->thread_idx)
#define blockIdx (dp_sim_view->block_idx)
#define blockDim (dp_sim_view->block_dim)
#define gridDim (dp_sim_view->grid_dim)

extern "C" {
void dp_sim_syncthreads(void);
/* Exchanges 4 or 8 bytes among the threads of the caller's warp that `mask` names:
 * each deposits `v` and receives lane `src`'s deposit (the xor partner, the source
 * lane, or lane + delta per `how`). Every named thread must take part. */
uint64_t dp_sim_shfl(unsigned mask, uint64_t v, int how, int arg, int width);
void dp_sim_nanosleep(unsigned ns);
}
enum { DP_SIM_SHFL_IDX, DP_SIM_SHFL_XOR, DP_SIM_SHFL_DOWN, DP_SIM_SHFL_UP };

static inline void __syncthreads(void) { dp_sim_syncthreads(); }
static inline void __nanosleep(unsigned ns) { dp_sim_nanosleep(ns); }

template <typename T>
static inline T dp_sim_shfl_t(unsigned m, T v, int how, int arg, int w) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of T");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  bits = dp_sim_shfl(m, bits, how, arg, w);
  T r;
  memcpy(&r, &bits, sizeof r);
  return r;
}
template <typename T> static inline T __shfl_sync(unsigned m, T v, int src, int w = 32) {
  return dp_sim_shfl_t(m, v, DP_SIM_SHFL_IDX, src, w);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned m, T v, int lane, int w = 32) {
  return dp_sim_shfl_t(m, v, DP_SIM_SHFL_XOR, lane, w);
}
template <typename T>
static inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32) {
  return dp_sim_shfl_t(m, v, DP_SIM_SHFL_DOWN, (int)d, w);
}
template <typename T>
static inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32) {
  return dp_sim_shfl_t(m, v, DP_SIM_SHFL_UP, (int)d, w);
}

/* Atomics: real ones (kernels of different streams run on different threads). */
template <typename T> static inline T atomicOr(T *p, T v) {
  return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}
template <typename T> static inline T atomicAnd(T *p, T v) {
  return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST);
}
template <typename T> static inline T atomicAdd(T *p, T v) {
  static_assert(std::is_integral<T>::value, "the simulation has integer atomicAdd only");
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
template <typename T> static inline T atomicMin(T *p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                 __ATOMIC_SEQ_CST)) {
  }
  return old;
}
template <typename T> static inline T atomicMax(T *p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                 __ATOMIC_SEQ_CST)) {
  }
  return old;
}
template <typename T> static inline T atomicExch(T *p, T v) {
  return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}
template <typename T> static inline T atomicCAS(T *p, T c, T v) {
  __atomic_compare_exchange_n(p, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return c;
}

/* IEEE single operations, one rounding each: the simulation is compiled with
 * -ffp-contract=off, so these are what nvcc's intrinsics promise. */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline float __int_as_float(int v) {
  float f;
  memcpy(&f, &v, 4);
  return f;
}
static inline int __float_as_int(float f) {
  int v;
  memcpy(&v, &f, 4);
  return v;
}
static inline float __uint_as_float(unsigned v) {
  float f;
  memcpy(&f, &v, 4);
  return f;
}
static inline unsigned __float_as_uint(float f) {
  unsigned v;
  memcpy(&v, &f, 4);
  return v;
}

/* ---- the launch seam ------------------------------------------------------------------
 */

/* A launch's arguments travel by value inside the stream's op (no allocation), as
 * the kernel's parameter types, like nvcc's parameter buffer. */
#define DP_SIM_ARG_BYTES 1024
extern "C" {
typedef void (*dp_sim_kernel_body)(const void *args);
/* Enqueues a launch of `body` over grid x block on `st`; `args` (n bytes) is copied.
 * Records a launch error for cudaGetLastError (bad geometry, a poisoned device). */
void dp_sim_launch(const void *fn, const char *name, dim3 grid, dim3 block, size_t smem,
                   cudaStream_t st, dp_sim_kernel_body body, const void *args, size_t n);
}

template <typename... P> struct dp_sim_args {
  void (*fn)(P...);
  std::tuple<typename std::decay<P>::type...> a;
};
template <typename... P> static void dp_sim_run_body(const void *p) {
  const dp_sim_args<P...> *s = (const dp_sim_args<P...> *)p;
  std::apply(s->fn, s->a); /* each GPU thread gets its own copy of the parameters */
}
template <typename... P> struct dp_sim_launcher {
  void (*fn)(P...);
  const char *name;
  dim3 grid, block;
  size_t smem;
  cudaStream_t st;
  template <typename... A> void operator()(A &&...a) const {
    static_assert(sizeof(dp_sim_args<P...>) <= DP_SIM_ARG_BYTES,
                  "kernel parameters too large");
    dp_sim_args<P...> s{fn,
                        std::tuple<typename std::decay<P>::type...>(std::forward<A>(a)...)};
    static_assert((std::is_trivially_copyable<typename std::decay<P>::type>::value && ...),
                  "kernel parameters must be trivially copyable");
    dp_sim_launch((const void *)fn, name, grid, block, smem, st, dp_sim_run_body<P...>, &s,
                  sizeof s);
  }
};
template <typename... P>
static inline dp_sim_launcher<P...> dp_sim_launch_of(void (*fn)(P...), const char *name,
                                                     dim3 g, dim3 b, size_t smem,
                                                     cudaStream_t st) {
  return dp_sim_launcher<P...>{fn, name, g, b, smem, st};
}
#define DP_LAUNCH(k, grid, block, smem, st)                                                \
  dp_sim_launch_of(k, #k, dim3(grid), dim3(block), (smem), (st))

#endif
