/* The backends a plan can name, one registration each. The core asks for a
 * backend by its dp_backend kind and never names one itself. */
#include "dp_cuda.h"
#include "internal.h"

static const dp_backend_ops *const registered[] = {
    [DP_BACKEND_CPU] = &dp__cpu_backend,
    [DP_BACKEND_CUDA] = &dp__cuda_backend,
};

const dp_backend_ops *dp__backend_ops(dp_backend kind) {
  return (unsigned)kind < sizeof registered / sizeof registered[0] ? registered[kind]
                                                                   : NULL;
}
