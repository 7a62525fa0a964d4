/* The registry: the backends a plan can name, by name. The cpu backend is
 * built in (lib/builtin.c lists it); others are registered by their own
 * library (libdp_cuda.a: dp_cuda_register) or by a test double. A plan names
 * its backend by kind (dp_config.backend); a kind is a registration's index,
 * the names "cpu" and "cuda" keep the kinds of the public enum. The core asks
 * for a backend by kind or name and never names one itself. */
#include "core/backend.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

extern const dp_backend_ops *const dp__builtin_backends[];

/* Registrations, by kind; a slot is written once, under the lock, before its
 * count is published, so lookups read without it. */
#define DP_MAX_BACKENDS 16
static _Atomic(const dp_backend_ops *) table[DP_MAX_BACKENDS];
static char names[DP_MAX_BACKENDS][DP_BACKEND_NAME_CAP];
static atomic_int n_named; /* slots whose name is set */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;

static int find_locked(const char *name) {
  int n = atomic_load(&n_named);
  for (int k = 0; k < n; k++)
    if (!strcmp(names[k], name)) return k;
  return -1;
}

/* The kind of `name`, reserving a slot for it (the public enum's names first,
 * so that DP_BACKEND_CPU and DP_BACKEND_CUDA keep their values); -1 when full. */
static int reserve_locked(const char *name) {
  int k = find_locked(name);
  if (k >= 0) return k;
  k = atomic_load(&n_named);
  if (k >= DP_MAX_BACKENDS) return -1;
  snprintf(names[k], sizeof names[k], "%s", name);
  atomic_store(&n_named, k + 1);
  return k;
}

/* The public enum's kinds, reserved first in this order, and what a query of
 * one says while nothing is registered under it. */
static const struct {
  const char *name, *missing;
} reserved[] = {
    {"cpu", NULL}, /* DP_BACKEND_CPU: built in */
    {"cuda", "the CUDA backend is not registered (a build without nvcc, or a program "
             "that did not call dp_cuda_register)"}, /* DP_BACKEND_CUDA */
};

static void add_builtins(void) {
  pthread_mutex_lock(&reg_mu);
  for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++)
    reserve_locked(reserved[i].name);
  for (int i = 0; dp__builtin_backends[i]; i++) {
    int k = reserve_locked(dp__builtin_backends[i]->name);
    if (k >= 0) atomic_store(&table[k], dp__builtin_backends[i]);
  }
  pthread_mutex_unlock(&reg_mu);
}

const dp_backend_ops *dp__backend_ops(dp_backend kind) {
  pthread_once(&builtin_once, add_builtins);
  return (unsigned)kind < DP_MAX_BACKENDS ? atomic_load(&table[kind]) : NULL;
}

static bool vtable_complete(const dp_backend_ops *ops) {
  return ops && ops->name && ops->name[0] && strlen(ops->name) < DP_BACKEND_NAME_CAP &&
         ops->run && ops->transport && ops->arena_alloc && ops->read && ops->write &&
         ops->fill_u32 && ops->workspace_bytes && ops->align &&
         !(ops->align & (ops->align - 1)) && !ops->step_begin == !ops->step_end &&
         (ops->n_graph_slots <= 0 ||
          (ops->capture_begin && ops->capture_end && ops->capture_abort &&
           ops->graph_ready && ops->graph_launch)) &&
         /* host_memory promises a synchronous backend without hooks */
         (!ops->host_memory ||
          (!ops->step_begin && !ops->stage_begin && !ops->stage_end &&
           ops->n_graph_slots <= 0 && !ops->ctx_init_world && !ops->transport->peer &&
           !ops->transport->flush && !ops->transport->complete_after_failure));
}

dp_status dp__backend_register(const dp_backend_ops *ops, dp_backend *kind) {
  pthread_once(&builtin_once, add_builtins);
  if (kind) *kind = (dp_backend)-1;
  if (!vtable_complete(ops))
    return DP_FAIL(DP_ERR_INVALID, "dp__backend_register: backend '%s': incomplete vtable",
                   ops && ops->name ? ops->name : "?");
  pthread_mutex_lock(&reg_mu);
  int k = reserve_locked(ops->name);
  const dp_backend_ops *had = k >= 0 ? atomic_load(&table[k]) : NULL;
  bool builtin = false;
  for (int i = 0; dp__builtin_backends[i]; i++) builtin |= had == dp__builtin_backends[i];
  if (k >= 0 && !builtin) atomic_store(&table[k], ops);
  pthread_mutex_unlock(&reg_mu);
  if (k < 0)
    return DP_FAIL(DP_ERR_INVALID,
                   "dp__backend_register: backend '%s': the registry is full "
                   "(%d backends)",
                   ops->name, DP_MAX_BACKENDS);
  if (builtin)
    return DP_FAIL(DP_ERR_INVALID, "dp__backend_register: '%s' is a built-in backend",
                   ops->name);
  if (kind) *kind = (dp_backend)k;
  return DP_OK;
}

int dp_backend_count(void) {
  pthread_once(&builtin_once, add_builtins);
  return atomic_load(&n_named);
}

int dp_backend_available(dp_backend kind) { return dp__backend_ops(kind) != NULL; }

dp_status dp_backend_find(const char *name, dp_backend *kind) {
  pthread_once(&builtin_once, add_builtins);
  if (kind) *kind = (dp_backend)-1;
  if (!name || !kind)
    return DP_FAIL(DP_ERR_INVALID, "dp_backend_find: name or kind is NULL");
  pthread_mutex_lock(&reg_mu);
  int k = find_locked(name);
  pthread_mutex_unlock(&reg_mu);
  if (k < 0 || !atomic_load(&table[k]))
    return DP_FAIL(DP_ERR_UNSUPPORTED, "no backend named '%s' is registered", name);
  *kind = (dp_backend)k;
  return DP_OK;
}

const char *dp_backend_name(dp_backend b) {
  pthread_once(&builtin_once, add_builtins);
  return (unsigned)b < (unsigned)atomic_load(&n_named) ? names[b] : "?";
}

int dp_cuda_available(void) { return dp__backend_ops(DP_BACKEND_CUDA) != NULL; }

/* The backend registered as kind b, or NULL with the reason as the last error. */
static const dp_backend_ops *registered(dp_backend b) {
  const dp_backend_ops *ops = dp__backend_ops(b);
  if (ops) return ops;
  if ((unsigned)b < sizeof reserved / sizeof *reserved && reserved[b].missing)
    DP_FAIL(DP_ERR_UNSUPPORTED, "%s", reserved[b].missing);
  else
    DP_FAIL(DP_ERR_UNSUPPORTED, "the %s backend (kind %d) is not registered",
            dp_backend_name(b), (int)b);
  return NULL;
}

/* A backend that counts devices has devices of its own (the machine's GPUs):
 * the diagnostics slots say what it reports. */
unsigned dp_backend_caps(dp_backend b) {
  const dp_backend_ops *ops = dp__backend_ops(b);
  if (!ops) return 0;
  return (ops->device_count ? DP_BACKEND_CAP_DEVICES : 0u) |
         (ops->bench_sgemm ? DP_BACKEND_CAP_GEMM_BENCH : 0u);
}

/* Appends `sep` (when buf is not empty) and s to buf[cap]; cut at cap. */
static void append(char *buf, size_t cap, const char *sep, const char *s) {
  size_t at = strlen(buf);
  if (snprintf(buf + at, cap - at, "%s%s", at ? sep : "", s) < 0) buf[at] = '\0';
}

dp_status dp_backend_find_caps(unsigned caps, dp_backend *kind) {
  if (kind) *kind = (dp_backend)-1;
  if (!kind) return DP_FAIL(DP_ERR_INVALID, "dp_backend_find_caps: kind is NULL");
  char had[DP_MAX_BACKENDS * DP_BACKEND_NAME_CAP] = "", why[512] = "";
  for (int k = 0; k < dp_backend_count(); k++) {
    dp_backend b = (dp_backend)k;
    if (dp_backend_available(b) && (dp_backend_caps(b) & caps) == caps) {
      *kind = b;
      return DP_OK;
    }
    if (dp_backend_available(b))
      append(had, sizeof had, ", ", dp_backend_name(b));
    else if ((size_t)k < sizeof reserved / sizeof *reserved && reserved[k].missing)
      append(why, sizeof why, "; ", reserved[k].missing);
  }
  char wanted[96] = "";
  if (caps & DP_BACKEND_CAP_DEVICES)
    append(wanted, sizeof wanted, " and ", "devices of its own");
  if (caps & DP_BACKEND_CAP_GEMM_BENCH)
    append(wanted, sizeof wanted, " and ", "a GEMM benchmark");
  if (caps & ~(DP_BACKEND_CAP_DEVICES | DP_BACKEND_CAP_GEMM_BENCH))
    append(wanted, sizeof wanted, " and ", "caps this library does not know");
  return DP_FAIL(DP_ERR_UNSUPPORTED, "no registered backend has %s (registered: %s)%s%s",
                 wanted, had, why[0] ? "; " : "", why);
}

int dp_backend_device_count(dp_backend b) {
  const dp_backend_ops *ops = registered(b);
  if (!ops) return 0;
  if (!ops->device_count) {
    DP_FAIL(DP_ERR_UNSUPPORTED,
            "the %s backend has no devices of its own to count (its devices are virtual)",
            ops->name);
    return 0;
  }
  return ops->device_count();
}

dp_status dp_backend_device_info(dp_backend b, int dev, char *name, size_t cap,
                                 size_t *total_mem, size_t *free_mem) {
  if (name && cap) name[0] = '\0';
  const dp_backend_ops *ops = registered(b);
  if (!ops) return DP_ERR_UNSUPPORTED;
  if (!ops->device_info)
    return DP_FAIL(DP_ERR_UNSUPPORTED, "the %s backend has no device query", ops->name);
  return ops->device_info(dev, name, cap, total_mem, free_mem);
}

int dp_cuda_device_count(void) { return dp_backend_device_count(DP_BACKEND_CUDA); }

dp_status dp_cuda_device_info(int gpu, char *name, size_t cap, size_t *total_mem,
                              size_t *free_mem) {
  return dp_backend_device_info(DP_BACKEND_CUDA, gpu, name, cap, total_mem, free_mem);
}

dp_status dp_bench_sgemm(dp_backend backend, int device, int m, int n, int k, int iters,
                         int tf32, double *ms_per_gemm) {
  if (ms_per_gemm) *ms_per_gemm = 0.0;
  if (!ms_per_gemm || m < 1 || n < 1 || k < 1 || iters < 1)
    return DP_FAIL(DP_ERR_INVALID,
                   "dp_bench_sgemm: bad arguments (m %d, n %d, k %d, iters %d, ms %s)", m,
                   n, k, iters, ms_per_gemm ? "given" : "NULL");
  if ((unsigned)backend >= (unsigned)dp_backend_count()) /* no name: not a kind */
    return DP_FAIL(DP_ERR_INVALID, "dp_bench_sgemm: unknown backend %d", (int)backend);
  const dp_backend_ops *b = registered(backend);
  if (!b) return DP_ERR_UNSUPPORTED;
  if (!b->bench_sgemm)
    return DP_FAIL(DP_ERR_UNSUPPORTED, "dp_bench_sgemm: backend %s has no GEMM benchmark",
                   dp_backend_name(backend));
  double tflops = 0.0;
  return b->bench_sgemm(device, m, n, k, iters, tf32, ms_per_gemm, &tflops);
}

dp_status dp_bench_gemm_bf16(dp_backend backend, int device, int m, int n, int k, int iters,
                             double *ms_per_gemm) {
  if (ms_per_gemm) *ms_per_gemm = 0.0;
  if (!ms_per_gemm || m < 1 || n < 1 || k < 1 || iters < 1)
    return DP_FAIL(DP_ERR_INVALID,
                   "dp_bench_gemm_bf16: bad arguments (m %d, n %d, k %d, iters %d, ms %s)",
                   m, n, k, iters, ms_per_gemm ? "given" : "NULL");
  if ((unsigned)backend >= (unsigned)dp_backend_count())
    return DP_FAIL(DP_ERR_INVALID, "dp_bench_gemm_bf16: unknown backend %d", (int)backend);
  const dp_backend_ops *b = registered(backend);
  if (!b) return DP_ERR_UNSUPPORTED;
  if (!b->bench_gemm_bf16)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "dp_bench_gemm_bf16: backend %s has no bf16 GEMM "
                   "benchmark",
                   dp_backend_name(backend));
  return b->bench_gemm_bf16(device, m, n, k, iters, ms_per_gemm);
}
