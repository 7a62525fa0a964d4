/* The backends a plan can name: the cpu backend is built in; others are
 * registered by their own library (libdp_cuda.a: dp_cuda_register) or by a
 * test double. The core asks for a backend by its dp_backend kind and never
 * names one itself. */
#include "gemm.h" /* dp__gemm_bench */
#include "internal.h"

#include <stdatomic.h>

static _Atomic(const dp_backend_ops *) registered[] = {
    [DP_BACKEND_CPU] = &dp__cpu_backend,
    [DP_BACKEND_CUDA] = NULL,
};
#define N_KINDS (sizeof registered / sizeof registered[0])

const dp_backend_ops *dp__backend_ops(dp_backend kind) {
  return (unsigned)kind < N_KINDS ? atomic_load(&registered[kind]) : NULL;
}

dp_status dp__backend_register(dp_backend kind, const dp_backend_ops *ops) {
  if ((unsigned)kind >= N_KINDS || kind == DP_BACKEND_CPU || !ops || !ops->run ||
      !ops->transport || !ops->arena_alloc || !ops->read || !ops->write || !ops->fill_u32 ||
      !ops->workspace_bytes || !ops->align || (ops->align & (ops->align - 1)) ||
      !ops->step_begin != !ops->step_end ||
      (ops->n_graph_slots > 0 &&
       !(ops->capture_begin && ops->capture_end && ops->capture_abort && ops->graph_ready &&
         ops->graph_launch)))
    return DP_FAIL(DP_ERR_INVALID, "dp__backend_register: backend %d: incomplete vtable",
                   (int)kind);
  atomic_store(&registered[kind], ops);
  return DP_OK;
}

const char *dp_backend_name(dp_backend b) {
  static const char *const names[] = {[DP_BACKEND_CPU] = "cpu", [DP_BACKEND_CUDA] = "cuda"};
  return (unsigned)b < sizeof names / sizeof names[0] ? names[b] : "?";
}

int dp_cuda_available(void) { return dp__backend_ops(DP_BACKEND_CUDA) != NULL; }

/* The registered CUDA backend, or NULL with the reason as the last error. */
static const dp_backend_ops *cuda_ops(void) {
  const dp_backend_ops *b = dp__backend_ops(DP_BACKEND_CUDA);
  if (!b)
    DP_FAIL(DP_ERR_UNSUPPORTED, "the CUDA backend is not registered (a build without nvcc, "
                                "or a program that did not call dp_cuda_register)");
  return b;
}

int dp_cuda_device_count(void) {
  const dp_backend_ops *b = cuda_ops();
  if (!b) return 0;
  return b->device_count ? b->device_count() : 0;
}

dp_status dp_cuda_device_info(int gpu, char *name, size_t cap, size_t *total_mem,
                              size_t *free_mem) {
  if (name && cap) name[0] = '\0';
  const dp_backend_ops *b = cuda_ops();
  if (!b) return DP_ERR_UNSUPPORTED;
  if (!b->device_info)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "dp_cuda_device_info: the registered CUDA backend "
                   "(%s) has no device query",
                   b->name ? b->name : "?");
  return b->device_info(gpu, name, cap, total_mem, free_mem);
}

dp_status dp_bench_sgemm(dp_backend backend, int device, int m, int n, int k, int iters,
                         int tf32, double *ms_per_gemm) {
  if (ms_per_gemm) *ms_per_gemm = 0.0;
  if (!ms_per_gemm || m < 1 || n < 1 || k < 1 || iters < 1)
    return DP_FAIL(DP_ERR_INVALID,
                   "dp_bench_sgemm: bad arguments (m %d, n %d, k %d, iters %d, ms %s)", m,
                   n, k, iters, ms_per_gemm ? "given" : "NULL");
  if (backend == DP_BACKEND_CPU) {
    if (device != 0 || tf32)
      return DP_FAIL(DP_ERR_INVALID,
                     "dp_bench_sgemm: the cpu backend runs on the calling "
                     "thread (device 0) and has no TF32 (got device %d, "
                     "tf32 %d)",
                     device, tf32);
    return dp__gemm_bench(m, n, k, iters, ms_per_gemm);
  }
  if ((unsigned)backend >= N_KINDS)
    return DP_FAIL(DP_ERR_INVALID, "dp_bench_sgemm: unknown backend %d", (int)backend);
  const dp_backend_ops *b =
      backend == DP_BACKEND_CUDA ? cuda_ops() : dp__backend_ops(backend);
  if (!b) return DP_ERR_UNSUPPORTED;
  if (!b->bench_sgemm)
    return DP_FAIL(DP_ERR_UNSUPPORTED, "dp_bench_sgemm: backend %s has no GEMM benchmark",
                   dp_backend_name(backend));
  double tflops = 0.0;
  return b->bench_sgemm(device, m, n, k, iters, tf32, ms_per_gemm, &tflops);
}
