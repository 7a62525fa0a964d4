/* Shared by the CUDA sources, cuda/NAME.cu (C++): the library's internal header, with C
 * linkage, and helpers for checked CUDA calls. */
#ifndef DP_CUDA_COMMON_CUH
#define DP_CUDA_COMMON_CUH

#include <cuda_runtime.h>

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* internal.h declares dp__error and friends for C; give them C linkage here
 * (harmless once internal.h carries its own extern "C" guard). */
extern "C" {
#include "core/backend.h"
}

#include "dp_cuda.h"

/* Records a failed CUDA call: "<fmt ...>: <call>: <error name>: <error text>"
 * and evaluates to s. fmt must be a string literal with at least one argument. */
#define DP_CUDA_FAIL(s, err, call, fmt, ...)                                               \
  DP_FAIL((s), fmt ": %s: %s: %s", __VA_ARGS__, (call), cudaGetErrorName(err),             \
          cudaGetErrorString(err))

/* Makes `dev` the calling thread's current device for the lifetime of the
 * scope and restores the previous one afterwards. */
class dp_cuda_device_scope {
public:
  dp_cuda_device_scope() = default;
  dp_cuda_device_scope(const dp_cuda_device_scope &) = delete;
  dp_cuda_device_scope &operator=(const dp_cuda_device_scope &) = delete;
  ~dp_cuda_device_scope();
  /* Checks that dev names a visible GPU (DP_ERR_INVALID if not,
   * DP_ERR_BACKEND when CUDA itself fails) and switches to it. */
  dp_status enter(int dev);

private:
  int prev_ = -1;
  bool switched_ = false;
};

#endif
