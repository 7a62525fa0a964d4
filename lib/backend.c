/* The backends a plan can name: the cpu backend is built in; others are
 * registered by their own library (libdp_cuda.a: dp_cuda_register) or by a
 * test double. The core asks for a backend by its dp_backend kind and never
 * names one itself. */
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

int dp_cuda_device_count(void) {
  const dp_backend_ops *b = dp__backend_ops(DP_BACKEND_CUDA);
  if (!b) {
    DP_FAIL(DP_ERR_UNSUPPORTED, "the CUDA backend is not registered (a build without nvcc, "
                                "or a program that did not call dp_cuda_register)");
    return 0;
  }
  return b->device_count ? b->device_count() : 0;
}
