/* The CUDA runtime of the simulation (sim.h says how it models a GPU): devices,
 * memory, streams and their workers, events, copies, launches, graphs, errors. */
#include "sim.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

pthread_mutex_t dp_sim_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t dp_sim_cv = PTHREAD_COND_INITIALIZER;

static thread_local int cur_dev;
static thread_local cudaError_t last_error;
static cudaError_t sticky[DP_SIM_MAX_DEVICES];

uint64_t dp_sim_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int env_int(const char *name, int dflt, int lo, int hi) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end;
  long x = strtol(v, &end, 10);
  return *end || x < lo || x > hi ? dflt : (int)x;
}

static int n_devices(void) { return env_int("DP_SIM_GPUS", 2, 0, DP_SIM_MAX_DEVICES); }
static uint64_t hold_ns(void) {
  static int us = -1;
  if (us < 0) us = env_int("DP_SIM_HOLD_US", 2000, 0, 10000000);
  return (uint64_t)us * 1000u;
}

/* ---- errors ------------------------------------------------------------------------- */

struct err_text {
  cudaError_t e;
  const char *name, *text;
};
static const err_text errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer",
     "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle",
     "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled",
     "peer access has not been enabled"},
    {cudaErrorTooManyPeers, "cudaErrorTooManyPeers", "peer mapping resources exhausted"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched",
     "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

static const err_text *text_of(cudaError_t e) {
  for (const err_text &t : errors)
    if (t.e == e) return &t;
  return &errors[sizeof errors / sizeof errors[0] - 1];
}
extern "C" const char *cudaGetErrorName(cudaError_t e) { return text_of(e)->name; }
extern "C" const char *cudaGetErrorString(cudaError_t e) { return text_of(e)->text; }

cudaError_t dp_sim_set_error(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}
cudaError_t dp_sim_sticky(int dev) {
  pthread_mutex_lock(&dp_sim_mu);
  cudaError_t e = dev >= 0 && dev < DP_SIM_MAX_DEVICES ? sticky[dev] : cudaSuccess;
  pthread_mutex_unlock(&dp_sim_mu);
  return e;
}
void dp_sim_poison(int dev, cudaError_t e) {
  pthread_mutex_lock(&dp_sim_mu);
  if (dev >= 0 && dev < DP_SIM_MAX_DEVICES && sticky[dev] == cudaSuccess) sticky[dev] = e;
  pthread_cond_broadcast(&dp_sim_cv);
  pthread_mutex_unlock(&dp_sim_mu);
}

extern "C" cudaError_t cudaGetLastError(void) {
  cudaError_t s = dp_sim_sticky(cur_dev);
  if (s != cudaSuccess) return s;
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
extern "C" cudaError_t cudaPeekAtLastError(void) {
  cudaError_t s = dp_sim_sticky(cur_dev);
  return s != cudaSuccess ? s : last_error;
}

/* ---- devices ------------------------------------------------------------------------ */

#define DEVICE_BYTES ((size_t)16 << 30)
static size_t dev_used[DP_SIM_MAX_DEVICES];
static bool peer_on[DP_SIM_MAX_DEVICES][DP_SIM_MAX_DEVICES];

static cudaError_t check_dev(int dev) {
  if (n_devices() == 0) return dp_sim_set_error(cudaErrorNoDevice);
  if (dev < 0 || dev >= n_devices()) return dp_sim_set_error(cudaErrorInvalidDevice);
  return cudaSuccess;
}

extern "C" cudaError_t cudaGetDeviceCount(int *n) {
  if (!n) return dp_sim_set_error(cudaErrorInvalidValue);
  *n = n_devices();
  return *n ? cudaSuccess : dp_sim_set_error(cudaErrorNoDevice);
}
extern "C" cudaError_t cudaGetDevice(int *dev) {
  if (!dev) return dp_sim_set_error(cudaErrorInvalidValue);
  *dev = cur_dev;
  return cudaSuccess;
}
extern "C" cudaError_t cudaSetDevice(int dev) {
  cudaError_t e = check_dev(dev);
  if (e == cudaSuccess) cur_dev = dev;
  return e;
}
extern "C" cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
  if (!p) return dp_sim_set_error(cudaErrorInvalidValue);
  cudaError_t e = check_dev(dev);
  if (e != cudaSuccess) return e;
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "libdp CUDA simulation (device %d)", dev);
  p->totalGlobalMem = DEVICE_BYTES;
  p->sharedMemPerBlock = 48 << 10;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 4;
  p->canMapHostMemory = p->unifiedAddressing = p->concurrentKernels = 1;
  p->asyncEngineCount = 2;
  p->pciBusID = dev;
  return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceCanAccessPeer(int *can, int dev, int peer) {
  if (!can) return dp_sim_set_error(cudaErrorInvalidValue);
  cudaError_t e = check_dev(dev);
  if (e == cudaSuccess) e = check_dev(peer);
  if (e != cudaSuccess) return e;
  *can = dev != peer;
  return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  cudaError_t e = check_dev(peer);
  if (e != cudaSuccess) return e;
  if (flags != 0 || peer == cur_dev) return dp_sim_set_error(cudaErrorInvalidValue);
  pthread_mutex_lock(&dp_sim_mu);
  bool was = peer_on[cur_dev][peer];
  peer_on[cur_dev][peer] = true;
  pthread_mutex_unlock(&dp_sim_mu);
  return was ? dp_sim_set_error(cudaErrorPeerAccessAlreadyEnabled) : cudaSuccess;
}
extern "C" cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
  if (!free_b || !total_b) return dp_sim_set_error(cudaErrorInvalidValue);
  cudaError_t e = check_dev(cur_dev);
  if (e != cudaSuccess) return e;
  pthread_mutex_lock(&dp_sim_mu);
  *total_b = DEVICE_BYTES;
  *free_b = DEVICE_BYTES - dev_used[cur_dev];
  pthread_mutex_unlock(&dp_sim_mu);
  return cudaSuccess;
}
extern "C" cudaError_t dp_sim_func_attributes(cudaFuncAttributes *a, const void *fn) {
  if (!a || !fn) return dp_sim_set_error(cudaErrorInvalidValue);
  memset(a, 0, sizeof *a);
  a->maxThreadsPerBlock = 1024;
  a->numRegs = 32;
  a->ptxVersion = a->binaryVersion = 90;
  return cudaSuccess;
}

/* ---- memory ------------------------------------------------------------------------- */

/* One mapping per allocation: [guard page][... user bytes, ending at most 255 bytes
 * before ...][guard page]. The user pointer is 256-aligned, as cudaMalloc's. */
struct alloc {
  unsigned char *map, *user;
  size_t map_bytes, bytes;
  int dev; /* -1: pinned host memory */
};
#define MAX_ALLOCS 4096
static alloc allocs[MAX_ALLOCS];

static cudaError_t sim_alloc(void **out, size_t bytes, int dev) {
  if (!out) return dp_sim_set_error(cudaErrorInvalidValue);
  *out = NULL;
  if (bytes == 0) return cudaSuccess;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t body = (bytes + 255) / 256 * 256;
  size_t pages = (body + page - 1) / page * page;
  if (dev >= 0 && bytes > DEVICE_BYTES - dev_used[dev])
    return dp_sim_set_error(cudaErrorMemoryAllocation);
  unsigned char *m =
      (unsigned char *)mmap(NULL, pages + 2 * page, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return dp_sim_set_error(cudaErrorMemoryAllocation);
  mprotect(m, page, PROT_NONE);
  mprotect(m + page + pages, page, PROT_NONE);
  /* fresh device memory is not zero on a GPU: make reads of unwritten bytes visible */
  unsigned char *user = m + page + (pages - body);
  if (dev >= 0 && !getenv("DP_SIM_ZERO_MEMORY")) memset(user, 0xff, body);
  pthread_mutex_lock(&dp_sim_mu);
  int slot = -1;
  for (int i = 0; i < MAX_ALLOCS && slot < 0; i++)
    if (!allocs[i].map) slot = i;
  if (slot < 0) {
    pthread_mutex_unlock(&dp_sim_mu);
    munmap(m, pages + 2 * page);
    return dp_sim_set_error(cudaErrorMemoryAllocation);
  }
  allocs[slot] = {m, user, pages + 2 * page, bytes, dev};
  if (dev >= 0) dev_used[dev] += bytes;
  pthread_mutex_unlock(&dp_sim_mu);
  *out = user;
  return cudaSuccess;
}

static int find_alloc_locked(const void *p, bool exact) {
  const unsigned char *c = (const unsigned char *)p;
  for (int i = 0; i < MAX_ALLOCS; i++) {
    const alloc &a = allocs[i];
    if (!a.map) continue;
    if (exact ? c == a.user : (c >= a.user && c < a.user + a.bytes)) return i;
  }
  return -1;
}

bool dp_sim_lookup(const void *p, size_t n, int *dev, bool *pinned) {
  pthread_mutex_lock(&dp_sim_mu);
  int i = find_alloc_locked(p, false);
  bool ok =
      i >= 0 && n <= allocs[i].bytes - (size_t)((const unsigned char *)p - allocs[i].user);
  if (dev) *dev = i >= 0 ? allocs[i].dev : -1;
  if (pinned) *pinned = i >= 0 && allocs[i].dev < 0;
  pthread_mutex_unlock(&dp_sim_mu);
  return ok;
}

static cudaError_t sim_free(void *p, bool device) {
  if (!p) return cudaSuccess;
  pthread_mutex_lock(&dp_sim_mu);
  int i = find_alloc_locked(p, true);
  if (i < 0 || (allocs[i].dev >= 0) != device) {
    pthread_mutex_unlock(&dp_sim_mu);
    return dp_sim_set_error(device ? cudaErrorInvalidDevicePointer : cudaErrorInvalidValue);
  }
  alloc a = allocs[i];
  allocs[i].map = NULL;
  if (a.dev >= 0) dev_used[a.dev] -= a.bytes;
  pthread_mutex_unlock(&dp_sim_mu);
  munmap(a.map, a.map_bytes); /* later accesses fault: use after free is reported */
  return cudaSuccess;
}

extern "C" cudaError_t cudaMalloc(void **p, size_t bytes) {
  cudaError_t e = check_dev(cur_dev);
  if (e != cudaSuccess) return e;
  if ((e = dp_sim_sticky(cur_dev)) != cudaSuccess) return e;
  return sim_alloc(p, bytes, cur_dev);
}
extern "C" cudaError_t cudaFree(void *p) {
  if (p) cudaDeviceSynchronize(); /* as the driver: cudaFree waits for the device */
  return sim_free(p, true);
}
extern "C" cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
  if (flags & ~(cudaHostAllocPortable | cudaHostAllocMapped))
    return dp_sim_set_error(cudaErrorInvalidValue);
  return sim_alloc(p, bytes, -1);
}
extern "C" cudaError_t cudaMallocHost(void **p, size_t bytes) {
  return sim_alloc(p, bytes, -1);
}
extern "C" cudaError_t cudaFreeHost(void *p) { return sim_free(p, false); }

extern "C" cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p) {
  if (!a) return dp_sim_set_error(cudaErrorInvalidValue);
  memset(a, 0, sizeof *a);
  int dev = -1;
  bool pinned = false;
  if (p && dp_sim_lookup(p, 1, &dev, &pinned)) {
    a->type = pinned ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
    a->device = pinned ? cur_dev : dev;
    a->devicePointer = (void *)p;
    a->hostPointer = pinned ? (void *)p : NULL;
  } else {
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
    a->hostPointer = (void *)p;
  }
  return cudaSuccess;
}

/* ---- streams ------------------------------------------------------------------------ */

#define MAX_STREAMS 256
static dp_sim_stream *streams[MAX_STREAMS];
static dp_sim_stream *legacy[DP_SIM_MAX_DEVICES];

void dp_sim_release(dp_sim_stream *s, uint64_t count) {
  if (count > s->release) {
    s->release = count;
    pthread_cond_broadcast(&dp_sim_cv);
  }
}

void dp_sim_release_all_locked(void) {
  for (int i = 0; i < MAX_STREAMS; i++)
    if (streams[i]) dp_sim_release(streams[i], streams[i]->tail);
}

static void run_op(dp_sim_stream *s, dp_sim_op *op) {
  switch (op->kind) {
  case SIM_KERNEL: dp_sim_run_kernel(op, s->dev); break;
  case SIM_COPY: memmove(op->u.m.dst, op->u.m.src, op->u.m.n); break;
  case SIM_STAGED_COPY:
    memcpy(op->u.m.dst, op->u.m.src, op->u.m.n);
    free((void *)op->u.m.src);
    break;
  case SIM_SET: memset(op->u.m.dst, op->u.m.value, op->u.m.n); break;
  case SIM_RECORD: {
    pthread_mutex_lock(&dp_sim_mu);
    op->u.rec.ev->t_ns = dp_sim_now_ns();
    pthread_mutex_unlock(&dp_sim_mu);
    break;
  }
  case SIM_WAIT: {
    pthread_mutex_lock(&dp_sim_mu);
    dp_sim_stream *t = op->u.w.s;
    dp_sim_release(t, op->u.w.count);
    while (t->done < op->u.w.count && sticky[s->dev] == cudaSuccess)
      pthread_cond_wait(&dp_sim_cv, &dp_sim_mu);
    pthread_mutex_unlock(&dp_sim_mu);
    break;
  }
  case SIM_EXT: op->u.x.run(op, s); break;
  }
}

static void *worker(void *arg) {
  dp_sim_stream *s = (dp_sim_stream *)arg;
  pthread_mutex_lock(&dp_sim_mu);
  for (;;) {
    if (s->done == s->tail) {
      if (s->destroyed) break;
      pthread_cond_wait(&dp_sim_cv, &dp_sim_mu);
      continue;
    }
    dp_sim_op *op = &s->ring[s->done % DP_SIM_RING];
    uint64_t due = op->t_ns + hold_ns();
    if (s->done >= s->release && !s->destroyed && sticky[s->dev] == cudaSuccess) {
      uint64_t now = dp_sim_now_ns();
      if (now < due) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t wait = due - now;
        ts.tv_sec += (time_t)(wait / 1000000000u);
        ts.tv_nsec += (long)(wait % 1000000000u);
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&dp_sim_cv, &dp_sim_mu, &ts);
        continue;
      }
    }
    bool poisoned = sticky[s->dev] != cudaSuccess;
    pthread_mutex_unlock(&dp_sim_mu);
    if (!poisoned)
      run_op(s, op);
    else if (op->kind == SIM_STAGED_COPY)
      free((void *)op->u.m.src);
    pthread_mutex_lock(&dp_sim_mu);
    s->done++;
    pthread_cond_broadcast(&dp_sim_cv);
  }
  pthread_mutex_unlock(&dp_sim_mu);
  return NULL;
}

static cudaError_t new_stream(dp_sim_stream **out, int dev, unsigned flags,
                              bool is_legacy) {
  dp_sim_stream *s = (dp_sim_stream *)calloc(1, sizeof *s);
  dp_sim_op *ring =
      s ? (dp_sim_op *)mmap(NULL, sizeof(dp_sim_op) * DP_SIM_RING, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        : (dp_sim_op *)MAP_FAILED;
  if (!s || ring == MAP_FAILED) {
    free(s);
    return dp_sim_set_error(cudaErrorMemoryAllocation);
  }
  s->dev = dev;
  s->flags = flags;
  s->legacy = is_legacy;
  s->ring = ring;
  pthread_mutex_lock(&dp_sim_mu);
  int slot = -1;
  for (int i = 0; i < MAX_STREAMS && slot < 0; i++)
    if (!streams[i]) slot = i;
  if (slot >= 0) streams[slot] = s;
  pthread_mutex_unlock(&dp_sim_mu);
  if (slot < 0 || pthread_create(&s->worker, NULL, worker, s) != 0) {
    pthread_mutex_lock(&dp_sim_mu);
    if (slot >= 0) streams[slot] = NULL;
    pthread_mutex_unlock(&dp_sim_mu);
    munmap(ring, sizeof(dp_sim_op) * DP_SIM_RING);
    free(s);
    return dp_sim_set_error(cudaErrorMemoryAllocation);
  }
  *out = s;
  return cudaSuccess;
}

dp_sim_stream *dp_sim_stream_of(cudaStream_t s) {
  if (s) return s;
  pthread_mutex_lock(&dp_sim_mu);
  dp_sim_stream *l = legacy[cur_dev];
  pthread_mutex_unlock(&dp_sim_mu);
  if (l) return l;
  dp_sim_stream *made = NULL;
  if (new_stream(&made, cur_dev, 0, true) != cudaSuccess) return NULL;
  pthread_mutex_lock(&dp_sim_mu);
  if (!legacy[cur_dev]) legacy[cur_dev] = made;
  l = legacy[cur_dev];
  pthread_mutex_unlock(&dp_sim_mu);
  return l; /* a racing duplicate stays idle */
}

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  if (!s || (flags & ~cudaStreamNonBlocking))
    return dp_sim_set_error(cudaErrorInvalidValue);
  cudaError_t e = check_dev(cur_dev);
  if (e == cudaSuccess) e = dp_sim_sticky(cur_dev);
  if (e != cudaSuccess) return e;
  return new_stream(s, cur_dev, flags, false);
}
extern "C" cudaError_t cudaStreamCreate(cudaStream_t *s) {
  return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

static bool known_stream_locked(dp_sim_stream *s) {
  for (int i = 0; i < MAX_STREAMS; i++)
    if (streams[i] == s) return !s->destroyed;
  return false;
}

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return dp_sim_set_error(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&dp_sim_mu);
  if (!known_stream_locked(s) || s->legacy) {
    pthread_mutex_unlock(&dp_sim_mu);
    return dp_sim_set_error(cudaErrorInvalidResourceHandle);
  }
  /* as CUDA: work already queued completes; the handle is gone at once */
  dp_sim_release(s, s->tail);
  s->destroyed = true;
  pthread_cond_broadcast(&dp_sim_cv);
  for (int i = 0; i < MAX_STREAMS; i++)
    if (streams[i] == s) streams[i] = NULL;
  pthread_mutex_unlock(&dp_sim_mu);
  pthread_join(s->worker, NULL);
  munmap(s->ring, sizeof(dp_sim_op) * DP_SIM_RING);
  free(s);
  return cudaSuccess;
}

/* Adds the legacy stream's implicit ordering: its ops wait for every blocking
 * stream of the device, and a blocking stream's ops wait for it. */
static void implicit_waits_locked(dp_sim_stream *s, dp_sim_op *waits, int *n) {
  *n = 0;
  if (s->flags & cudaStreamNonBlocking) return;
  if (s->legacy) {
    for (int i = 0; i < MAX_STREAMS; i++) {
      dp_sim_stream *b = streams[i];
      if (b && b != s && b->dev == s->dev && !b->legacy &&
          !(b->flags & cudaStreamNonBlocking) && b->tail > b->done && *n < 64) {
        waits[*n].kind = SIM_WAIT;
        waits[*n].u.w.s = b;
        waits[(*n)++].u.w.count = b->tail;
      }
    }
  } else if (legacy[s->dev] && legacy[s->dev]->tail > legacy[s->dev]->done) {
    waits[0].kind = SIM_WAIT;
    waits[0].u.w.s = legacy[s->dev];
    waits[0].u.w.count = legacy[s->dev]->tail;
    *n = 1;
  }
}

void dp_sim_graph_add(dp_sim_graph *g, const dp_sim_op *op); /* below */

static void push_locked(dp_sim_stream *s, const dp_sim_op *op) {
  while (s->tail - s->done >= DP_SIM_RING) {
    dp_sim_release(s, s->tail);
    pthread_cond_wait(&dp_sim_cv, &dp_sim_mu);
  }
  dp_sim_op *slot = &s->ring[s->tail % DP_SIM_RING];
  size_t head = offsetof(dp_sim_op, args);
  memcpy(slot, op, op->kind == SIM_KERNEL || op->kind == SIM_EXT ? sizeof *op : head);
  slot->t_ns = dp_sim_now_ns();
  s->tail++;
  pthread_cond_broadcast(&dp_sim_cv);
}

cudaError_t dp_sim_enqueue(cudaStream_t st, const dp_sim_op *op) {
  dp_sim_stream *s = dp_sim_stream_of(st);
  if (!s) return dp_sim_set_error(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&dp_sim_mu);
  if (!known_stream_locked(s)) {
    pthread_mutex_unlock(&dp_sim_mu);
    return dp_sim_set_error(cudaErrorInvalidResourceHandle);
  }
  cudaError_t e = sticky[s->dev];
  if (e != cudaSuccess) {
    pthread_mutex_unlock(&dp_sim_mu);
    return dp_sim_set_error(e);
  }
  if (s->cap) {
    dp_sim_graph_add(s->cap, op);
    pthread_mutex_unlock(&dp_sim_mu);
    return cudaSuccess;
  }
  dp_sim_op waits[64];
  int n = 0;
  implicit_waits_locked(s, waits, &n);
  for (int i = 0; i < n; i++) push_locked(s, &waits[i]);
  push_locked(s, op);
  pthread_mutex_unlock(&dp_sim_mu);
  return cudaSuccess;
}

/* Waits until s has run `count` ops; the device's sticky error if it faulted. */
static cudaError_t wait_for(dp_sim_stream *s, uint64_t count) {
  pthread_mutex_lock(&dp_sim_mu);
  dp_sim_release(s, count);
  while (s->done < count && sticky[s->dev] == cudaSuccess)
    pthread_cond_wait(&dp_sim_cv, &dp_sim_mu);
  cudaError_t e = sticky[s->dev];
  pthread_mutex_unlock(&dp_sim_mu);
  return e;
}

static cudaError_t capture_forbids(dp_sim_stream *s) {
  pthread_mutex_lock(&dp_sim_mu);
  bool cap = s->cap != NULL;
  if (cap) s->cap_error = cudaErrorStreamCaptureInvalidated;
  pthread_mutex_unlock(&dp_sim_mu);
  return cap ? dp_sim_set_error(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t st) {
  dp_sim_stream *s = dp_sim_stream_of(st);
  if (!s) return dp_sim_set_error(cudaErrorMemoryAllocation);
  cudaError_t e = capture_forbids(s);
  if (e != cudaSuccess) return e;
  pthread_mutex_lock(&dp_sim_mu);
  uint64_t count = s->tail;
  bool known = known_stream_locked(s);
  pthread_mutex_unlock(&dp_sim_mu);
  if (!known) return dp_sim_set_error(cudaErrorInvalidResourceHandle);
  return dp_sim_set_error(wait_for(s, count));
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t st) {
  dp_sim_stream *s = dp_sim_stream_of(st);
  if (!s) return dp_sim_set_error(cudaErrorMemoryAllocation);
  cudaError_t e = capture_forbids(s);
  if (e != cudaSuccess) return e;
  pthread_mutex_lock(&dp_sim_mu);
  if (!known_stream_locked(s)) {
    pthread_mutex_unlock(&dp_sim_mu);
    return dp_sim_set_error(cudaErrorInvalidResourceHandle);
  }
  dp_sim_release(s, s->tail);
  e = sticky[s->dev] != cudaSuccess ? sticky[s->dev]
      : s->done == s->tail          ? cudaSuccess
                                    : cudaErrorNotReady;
  pthread_mutex_unlock(&dp_sim_mu);
  /* not ready is an answer, not an error: cudaGetLastError does not keep it */
  return e == cudaErrorNotReady ? e : dp_sim_set_error(e);
}

extern "C" cudaError_t cudaDeviceSynchronize(void) {
  dp_sim_stream *wait[MAX_STREAMS];
  uint64_t count[MAX_STREAMS];
  int n = 0;
  pthread_mutex_lock(&dp_sim_mu);
  for (int i = 0; i < MAX_STREAMS; i++)
    if (streams[i] && streams[i]->dev == cur_dev && !streams[i]->destroyed) {
      wait[n] = streams[i];
      count[n++] = streams[i]->tail;
    }
  pthread_mutex_unlock(&dp_sim_mu);
  for (int i = 0; i < n; i++) {
    cudaError_t e = wait_for(wait[i], count[i]);
    if (e != cudaSuccess) return dp_sim_set_error(e);
  }
  return dp_sim_set_error(dp_sim_sticky(cur_dev));
}

/* ---- events ------------------------------------------------------------------------- */

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  if (!e || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)))
    return dp_sim_set_error(cudaErrorInvalidValue);
  *e = (dp_sim_event *)calloc(1, sizeof(dp_sim_event));
  if (!*e) return dp_sim_set_error(cudaErrorMemoryAllocation);
  (*e)->flags = flags;
  return cudaSuccess;
}
extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e) {
  return cudaEventCreateWithFlags(e, cudaEventDefault);
}
extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return dp_sim_set_error(cudaErrorInvalidResourceHandle);
  /* a record still queued refers to it: wait for it (CUDA defers the release) */
  pthread_mutex_lock(&dp_sim_mu);
  dp_sim_stream *s = e->s;
  uint64_t c = e->count;
  bool alive = s && known_stream_locked(s);
  pthread_mutex_unlock(&dp_sim_mu);
  if (alive) (void)wait_for(s, c);
  free(e);
  return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st) {
  if (!e) return dp_sim_set_error(cudaErrorInvalidResourceHandle);
  dp_sim_stream *s = dp_sim_stream_of(st);
  if (!s) return dp_sim_set_error(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&dp_sim_mu);
  if (s->cap) { /* a node of the capture: waits on it join the capture */
    e->cap = s->cap;
    e->s = NULL;
    pthread_mutex_unlock(&dp_sim_mu);
    return cudaSuccess;
  }
  pthread_mutex_unlock(&dp_sim_mu);
  dp_sim_op op;
  op.kind = SIM_RECORD;
  op.u.rec.ev = e;
  cudaError_t r = dp_sim_enqueue(s, &op);
  if (r != cudaSuccess) return r;
  pthread_mutex_lock(&dp_sim_mu);
  e->cap = NULL;
  e->s = s;
  e->count = s->tail; /* just pushed: done >= tail means it ran */
  pthread_mutex_unlock(&dp_sim_mu);
  return cudaSuccess;
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t e,
                                           unsigned int flags) {
  if (!e) return dp_sim_set_error(cudaErrorInvalidResourceHandle);
  if (flags != 0) return dp_sim_set_error(cudaErrorInvalidValue);
  dp_sim_stream *s = dp_sim_stream_of(st);
  if (!s) return dp_sim_set_error(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&dp_sim_mu);
  if (e->cap) { /* recorded in a capture: s joins it (ordering is the capture's order) */
    if (s->cap && s->cap != e->cap) {
      pthread_mutex_unlock(&dp_sim_mu);
      return dp_sim_set_error(cudaErrorStreamCaptureUnmatched);
    }
    s->cap = e->cap;
    pthread_mutex_unlock(&dp_sim_mu);
    return cudaSuccess;
  }
  dp_sim_stream *src = e->s;
  uint64_t count = e->count;
  pthread_mutex_unlock(&dp_sim_mu);
  if (!src) return cudaSuccess; /* never recorded: nothing to wait for */
  pthread_mutex_lock(&dp_sim_mu);
  bool cap = s->cap != NULL;
  pthread_mutex_unlock(&dp_sim_mu);
  if (cap) return cudaSuccess; /* an outside dependency of a capture: satisfied at launch */
  dp_sim_op op;
  op.kind = SIM_WAIT;
  op.u.w.s = src;
  op.u.w.count = count;
  return dp_sim_enqueue(s, &op);
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return dp_sim_set_error(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&dp_sim_mu);
  dp_sim_stream *s = e->s;
  uint64_t c = e->count;
  pthread_mutex_unlock(&dp_sim_mu);
  return s ? dp_sim_set_error(wait_for(s, c)) : cudaSuccess;
}
extern "C" cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return dp_sim_set_error(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&dp_sim_mu);
  cudaError_t r = cudaSuccess;
  if (e->s) {
    dp_sim_release(e->s, e->count);
    r = e->s->done >= e->count ? cudaSuccess : cudaErrorNotReady;
  }
  pthread_mutex_unlock(&dp_sim_mu);
  return r;
}
extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  if (!ms || !a || !b) return dp_sim_set_error(cudaErrorInvalidValue);
  if ((a->flags | b->flags) & cudaEventDisableTiming)
    return dp_sim_set_error(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&dp_sim_mu);
  bool ready = a->s && b->s && a->s->done >= a->count && b->s->done >= b->count;
  *ms = ready ? (float)((double)(int64_t)(b->t_ns - a->t_ns) / 1e6) : 0.0f;
  pthread_mutex_unlock(&dp_sim_mu);
  return ready ? cudaSuccess : dp_sim_set_error(cudaErrorNotReady);
}

/* ---- copies ------------------------------------------------------------------------- */

struct side {
  bool sim;    /* inside an allocation of the simulation */
  bool pinned; /* pinned host memory */
  int dev;
};

static cudaError_t classify(const void *p, size_t n, side *s) {
  int dev = -1;
  bool pinned = false;
  s->sim = dp_sim_lookup(p, n, &dev, &pinned);
  if (!s->sim && dp_sim_lookup(p, 1, &dev, &pinned)) /* starts inside, runs past the end */
    return dp_sim_set_error(cudaErrorInvalidValue);
  s->pinned = pinned;
  s->dev = s->sim ? dev : -1;
  return cudaSuccess;
}

/* Checks a copy's ends against `kind`; device memory must be the simulation's. */
static cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                              side *d, side *s) {
  if ((!dst || !src) && n) return dp_sim_set_error(cudaErrorInvalidValue);
  cudaError_t e = classify(dst, n, d);
  if (e == cudaSuccess) e = classify(src, n, s);
  if (e != cudaSuccess) return e;
  bool dd = d->sim && !d->pinned, sd = s->sim && !s->pinned;
  switch (kind) {
  case cudaMemcpyHostToDevice: e = dd && !sd ? cudaSuccess : cudaErrorInvalidValue; break;
  case cudaMemcpyDeviceToHost: e = sd && !dd ? cudaSuccess : cudaErrorInvalidValue; break;
  case cudaMemcpyDeviceToDevice: e = sd && dd ? cudaSuccess : cudaErrorInvalidValue; break;
  case cudaMemcpyHostToHost: e = !sd && !dd ? cudaSuccess : cudaErrorInvalidValue; break;
  case cudaMemcpyDefault: e = cudaSuccess; break;
  default: e = cudaErrorInvalidMemcpyDirection;
  }
  return dp_sim_set_error(e);
}

static cudaError_t copy_async(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                              cudaStream_t st, bool sync_call) {
  side d, s;
  cudaError_t e = check_copy(dst, src, n, kind, &d, &s);
  if (e != cudaSuccess || n == 0) return e;
  dp_sim_stream *str = dp_sim_stream_of(st);
  if (!str) return dp_sim_set_error(cudaErrorMemoryAllocation);
  bool dev_dst = d.sim && !d.pinned, dev_src = s.sim && !s.pinned;
  bool pageable_src = !s.sim, pageable_dst = !d.sim;
  if ((pageable_src || pageable_dst) && (e = capture_forbids(str)) != cudaSuccess) return e;
  dp_sim_op op;
  op.kind = SIM_COPY;
  op.u.m.dst = dst;
  op.u.m.src = src;
  op.u.m.n = n;
  if (!dev_dst &&
      !dev_src) { /* host to host: the copy runs on the host, after the stream */
    pthread_mutex_lock(&dp_sim_mu);
    uint64_t c = str->tail;
    pthread_mutex_unlock(&dp_sim_mu);
    if ((e = wait_for(str, c)) != cudaSuccess) return dp_sim_set_error(e);
    memmove(dst, src, n);
    return cudaSuccess;
  }
  if (pageable_src) {
    /* From pageable memory the call returns once the bytes are staged; the copy to
     * the device runs in stream order, later. */
    void *stage = malloc(n);
    if (!stage) return dp_sim_set_error(cudaErrorMemoryAllocation);
    memcpy(stage, src, n);
    op.kind = SIM_STAGED_COPY;
    op.u.m.src = stage;
  }
  e = dp_sim_enqueue(str, &op);
  if (e != cudaSuccess) {
    if (op.kind == SIM_STAGED_COPY) free((void *)op.u.m.src);
    return e;
  }
  /* Into pageable memory (and every cudaMemcpy but a pageable upload or a device
   * to device copy) the call returns when the copy is done. */
  if (pageable_dst || (sync_call && !pageable_src && !(dev_dst && dev_src))) {
    pthread_mutex_lock(&dp_sim_mu);
    uint64_t c = str->tail;
    pthread_mutex_unlock(&dp_sim_mu);
    return dp_sim_set_error(wait_for(str, c));
  }
  return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                                       cudaMemcpyKind k, cudaStream_t s) {
  return copy_async(dst, src, n, k, s, false);
}
extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k) {
  return copy_async(dst, src, n, k, NULL, true);
}
extern "C" cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src,
                                           int src_dev, size_t n, cudaStream_t s) {
  side d, sr;
  cudaError_t e = check_copy(dst, src, n, cudaMemcpyDeviceToDevice, &d, &sr);
  if (e != cudaSuccess) return e;
  if (n && (d.dev != dst_dev || sr.dev != src_dev))
    return dp_sim_set_error(cudaErrorInvalidValue);
  return copy_async(dst, src, n, cudaMemcpyDeviceToDevice, s, false);
}
extern "C" cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st) {
  side d;
  cudaError_t e = classify(p, n, &d);
  if (e != cudaSuccess) return e;
  if (n && (!d.sim || d.pinned)) return dp_sim_set_error(cudaErrorInvalidValue);
  if (n == 0) return cudaSuccess;
  dp_sim_op op;
  op.kind = SIM_SET;
  op.u.m.dst = p;
  op.u.m.n = n;
  op.u.m.value = v;
  return dp_sim_enqueue(st, &op);
}
extern "C" cudaError_t cudaMemset(void *p, int v, size_t n) {
  cudaError_t e = cudaMemsetAsync(p, v, n, NULL);
  return e == cudaSuccess ? cudaStreamSynchronize(NULL) : e;
}

/* ---- launches ----------------------------------------------------------------------- */

extern "C" void dp_sim_launch(const void *fn, const char *name, dim3 g, dim3 b, size_t smem,
                              cudaStream_t st, dp_sim_kernel_body body, const void *args,
                              size_t n) {
  size_t threads = (size_t)b.x * b.y * b.z;
  if (!g.x || !g.y || !g.z || !threads || threads > 1024 || b.z > 64 || g.y > 65535 ||
      g.z > 65535 || g.x > 0x7fffffffu || smem > (48u << 10)) {
    dp_sim_report("launch of %s: invalid configuration (grid %u,%u,%u, block %u,%u,%u, "
                  "%zu bytes of shared memory)",
                  name, g.x, g.y, g.z, b.x, b.y, b.z, smem);
    dp_sim_set_error(cudaErrorInvalidConfiguration);
    return;
  }
  static thread_local dp_sim_op op; /* 1 KiB of arguments: not on the caller's stack */
  op.kind = SIM_KERNEL;
  op.u.k.body = body;
  op.u.k.fn = fn;
  op.u.k.name = name;
  op.u.k.grid = uint3{g.x, g.y, g.z};
  op.u.k.block = uint3{b.x, b.y, b.z};
  memcpy(op.args, args, n);
  dp_sim_enqueue(st, &op);
}

/* ---- graphs ------------------------------------------------------------------------- */

struct dp_sim_graph {
  dp_sim_op *nodes;
  size_t n, cap;
  dp_sim_stream *origin;
};
struct dp_sim_graph_exec {
  dp_sim_op *nodes;
  size_t n;
};

void dp_sim_graph_add(dp_sim_graph *g, const dp_sim_op *op) {
  if (op->kind == SIM_WAIT || op->kind == SIM_RECORD)
    return; /* the order is the capture's */
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 64;
    dp_sim_op *m = (dp_sim_op *)realloc(g->nodes, cap * sizeof *m);
    if (!m) {
      g->origin->cap_error = cudaErrorMemoryAllocation;
      return;
    }
    g->nodes = m;
    g->cap = cap;
  }
  g->nodes[g->n++] = *op;
}

extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t st, cudaStreamCaptureMode mode) {
  if (!st) return dp_sim_set_error(cudaErrorStreamCaptureUnsupported);
  if (mode != cudaStreamCaptureModeRelaxed && mode != cudaStreamCaptureModeGlobal &&
      mode != cudaStreamCaptureModeThreadLocal)
    return dp_sim_set_error(cudaErrorInvalidValue);
  dp_sim_graph *g = (dp_sim_graph *)calloc(1, sizeof *g);
  if (!g) return dp_sim_set_error(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&dp_sim_mu);
  if (st->cap) {
    pthread_mutex_unlock(&dp_sim_mu);
    free(g);
    return dp_sim_set_error(cudaErrorInvalidValue);
  }
  g->origin = st;
  st->cap = g;
  st->cap_origin = true;
  st->cap_error = cudaSuccess;
  pthread_mutex_unlock(&dp_sim_mu);
  return cudaSuccess;
}

extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *out) {
  if (!st || !out) return dp_sim_set_error(cudaErrorInvalidValue);
  *out = NULL;
  pthread_mutex_lock(&dp_sim_mu);
  dp_sim_graph *g = st->cap;
  if (!g || !st->cap_origin) {
    pthread_mutex_unlock(&dp_sim_mu);
    return dp_sim_set_error(g ? cudaErrorStreamCaptureUnmatched : cudaErrorInvalidValue);
  }
  cudaError_t e = st->cap_error;
  for (int i = 0; i < MAX_STREAMS; i++)
    if (streams[i] && streams[i]->cap == g) {
      if (streams[i]->cap_error != cudaSuccess) e = streams[i]->cap_error;
      streams[i]->cap = NULL;
      streams[i]->cap_origin = false;
      streams[i]->cap_error = cudaSuccess;
    }
  pthread_mutex_unlock(&dp_sim_mu);
  if (e != cudaSuccess) {
    free(g->nodes);
    free(g);
    return dp_sim_set_error(cudaErrorStreamCaptureInvalidated);
  }
  *out = g;
  return cudaSuccess;
}

extern "C" cudaError_t cudaStreamIsCapturing(cudaStream_t st,
                                             cudaStreamCaptureStatus *out) {
  if (!out) return dp_sim_set_error(cudaErrorInvalidValue);
  dp_sim_stream *s = dp_sim_stream_of(st);
  if (!s) return dp_sim_set_error(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&dp_sim_mu);
  *out = !s->cap                       ? cudaStreamCaptureStatusNone
         : s->cap_error != cudaSuccess ? cudaStreamCaptureStatusInvalidated
                                       : cudaStreamCaptureStatusActive;
  pthread_mutex_unlock(&dp_sim_mu);
  return cudaSuccess;
}

extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g,
                                            unsigned long long flags) {
  if (!x || !g || flags) return dp_sim_set_error(cudaErrorInvalidValue);
  *x = (dp_sim_graph_exec *)calloc(1, sizeof **x);
  if (!*x) return dp_sim_set_error(cudaErrorMemoryAllocation);
  (*x)->nodes = (dp_sim_op *)malloc((g->n ? g->n : 1) * sizeof(dp_sim_op));
  if (!(*x)->nodes) {
    free(*x);
    *x = NULL;
    return dp_sim_set_error(cudaErrorMemoryAllocation);
  }
  memcpy((*x)->nodes, g->nodes, g->n * sizeof(dp_sim_op));
  (*x)->n = g->n;
  return cudaSuccess;
}
extern "C" cudaError_t cudaGraphUpload(cudaGraphExec_t x, cudaStream_t st) {
  if (!x) return dp_sim_set_error(cudaErrorInvalidValue);
  return dp_sim_stream_of(st) ? cudaSuccess : dp_sim_set_error(cudaErrorInvalidValue);
}
extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t st) {
  if (!x) return dp_sim_set_error(cudaErrorInvalidValue);
  for (size_t i = 0; i < x->n; i++) {
    cudaError_t e = dp_sim_enqueue(st, &x->nodes[i]);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  if (!g) return dp_sim_set_error(cudaErrorInvalidValue);
  free(g->nodes);
  free(g);
  return cudaSuccess;
}
extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
  if (!x) return dp_sim_set_error(cudaErrorInvalidValue);
  free(x->nodes);
  free(x);
  return cudaSuccess;
}

/* ---- the rest of the allocators (tests/standalone/test_noalloc.c counts them all) ---- */

extern "C" cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
  /* stream-ordered in CUDA; here at once, after what the stream has queued */
  cudaError_t e = cudaStreamSynchronize(s);
  return e == cudaSuccess ? cudaMalloc(p, bytes) : e;
}
extern "C" cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  cudaError_t e = cudaStreamSynchronize(s);
  return e == cudaSuccess ? sim_free(p, true) : e;
}
extern "C" cudaError_t cudaMallocManaged(void **p, size_t bytes, unsigned int flags) {
  (void)flags;
  return cudaMalloc(p, bytes); /* host-addressable anyway: device memory is host memory */
}
