/* The emulated GPU (see fake_cuda.h): cuda/dp_cuda.h implemented on the CPU,
 * strictly, to test lib/'s wiring of the CUDA backend where there is no GPU.
 *
 * Memory. An arena is a memfd mapped twice: PROT_NONE at the address handed
 * out (so a host dereference by lib/ faults, as device memory would) and
 * read-write at an alias, with a PROT_NONE page on either side, that only
 * this file uses. Staging ("pinned") memory is ordinary host memory, tracked.
 *
 * The step. Backend runs and transport copies are validated when called
 * (stage and thread, op stage, staging memory, arena pointers) and queued
 * per device; dp__cuda_step_end executes the queues, stage by stage, with the
 * CPU backend's ops on a shadow env whose arenas are the aliases, then reads
 * the status as the device would. Queuing instead of running models a
 * stream: nothing lib/ reads before the synchronisation is up to date. A
 * capture moves the queues into a slot without running them; a launch
 * replays the slot with the launch's step. Device semantics (docs/GPU.md):
 * the ops' step comes from dp__cuda_step_begin / dp__cuda_graph_launch; a
 * non-finite loss or gradient, or a label out of range, does not fail its op
 * but makes every optimizer op of the step do nothing, and step_end reports
 * it in the CPU backend's words. */
#include "fake_cuda.h"

#include "dp_cuda.h"
#include "cpu/gemm.h"
#include "core/backend.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifdef FAKE_CUDA_MPI
#include <mpi.h>
#endif

#define FK_MAX_GPUS 64
#define FK_MAX_ARENAS 512
#define FK_MAX_HOSTS 256
#define FK_DEFAULT_GPUS 4
#define FK_DEFAULT_FREE ((size_t)16 << 30)

typedef struct fk_ctx fk_ctx;

typedef struct {
  unsigned char *dev;  /* PROT_NONE view: the address lib/ sees */
  unsigned char *rw;   /* read-write alias of the same pages */
  unsigned char *span; /* the alias's reservation, a guard page each side */
  size_t bytes, map, span_bytes;
  int gpu, fd;
  long serial;   /* allocation order */
  fk_ctx *owner; /* the backend context using it, if any */
  bool live;
} fk_arena;

typedef struct {
  unsigned char *p;
  size_t bytes, map;
  bool live;
} fk_host;

static struct {
  pthread_mutex_t mu;
  bool configured;
  int gpus, have_nccl;
  size_t free_limit[FK_MAX_GPUS], used[FK_MAX_GPUS];
  fk_arena arenas[FK_MAX_ARENAS];
  fk_host hosts[FK_MAX_HOSTS];
  long serial, n_arenas, n_hosts, n_ctxs;
  size_t arena_bytes;
} G = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Counters the executor's threads bump concurrently. */
/* The next n_fail_captures calls of dp__cuda_capture_end fail (a driver that
 * refuses to instantiate), after ending the capture as the real one does. */
static atomic_long n_fail_captures;

void fake_cuda_fail_captures(long n) { atomic_store(&n_fail_captures, n); }
static atomic_long n_fail_launches;
void fake_cuda_fail_launches(long n) { atomic_store(&n_fail_launches, n); }

static atomic_long n_plain, n_ends, n_captures, n_aborts, n_launches, n_runs, n_copies,
    n_cross, n_peers, n_executed, n_bad_frees, n_memcpys;

static size_t page_bytes(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static void configure_locked(void) {
  if (G.configured) return;
  G.configured = true;
  const char *s = getenv("FAKE_CUDA_GPUS");
  G.gpus = s && *s ? atoi(s) : FK_DEFAULT_GPUS;
  if (G.gpus < 0) G.gpus = 0;
  if (G.gpus > FK_MAX_GPUS) G.gpus = FK_MAX_GPUS;
  G.have_nccl = 1;
  s = getenv("FAKE_CUDA_FREE_BYTES");
  size_t lim = s && *s ? (size_t)strtoull(s, NULL, 0) : FK_DEFAULT_FREE;
  for (int g = 0; g < FK_MAX_GPUS; g++) G.free_limit[g] = lim;
}

static void lock(void) {
  pthread_mutex_lock(&G.mu);
  configure_locked();
}

static void unlock(void) { pthread_mutex_unlock(&G.mu); }

/* ---- hooks (fake_cuda.h) ---------------------------------------------------------- */

void fake_cuda_set_gpus(int n) {
  lock();
  G.gpus = n < 0 ? 0 : n > FK_MAX_GPUS ? FK_MAX_GPUS : n;
  unlock();
}

void fake_cuda_set_have_nccl(int yes) {
  lock();
  G.have_nccl = yes != 0;
  unlock();
}

void fake_cuda_set_free_bytes(int gpu, size_t bytes) {
  lock();
  for (int g = 0; g < FK_MAX_GPUS; g++)
    if (gpu < 0 || g == gpu) G.free_limit[g] = bytes;
  unlock();
}

void fake_cuda_reset_config(void) {
  lock();
  G.configured = false;
  configure_locked();
  unlock();
}

fake_cuda_stats fake_cuda_get_stats(void) {
  fake_cuda_stats s;
  memset(&s, 0, sizeof s);
  lock();
  s.arenas = G.n_arenas;
  s.hosts = G.n_hosts;
  s.ctxs = G.n_ctxs;
  s.arena_bytes = G.arena_bytes;
  unlock();
  s.plain_steps = atomic_load(&n_plain);
  s.step_ends = atomic_load(&n_ends);
  s.captures = atomic_load(&n_captures);
  s.aborts = atomic_load(&n_aborts);
  s.launches = atomic_load(&n_launches);
  s.runs = atomic_load(&n_runs);
  s.copies = atomic_load(&n_copies);
  s.cross_copies = atomic_load(&n_cross);
  s.peers = atomic_load(&n_peers);
  s.executed = atomic_load(&n_executed);
  s.bad_frees = atomic_load(&n_bad_frees);
  s.memcpys = atomic_load(&n_memcpys);
  return s;
}

void fake_cuda_reset_counters(void) {
  atomic_long *all[] = {&n_plain,    &n_ends,     &n_captures,  &n_aborts,
                        &n_launches, &n_runs,     &n_copies,    &n_cross,
                        &n_peers,    &n_executed, &n_bad_frees, &n_memcpys};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) atomic_store(all[i], 0);
}

/* The live arena holding p (G.mu held); NULL when none. */
static fk_arena *arena_at_locked(const void *p) {
  uintptr_t a = (uintptr_t)p;
  for (int i = 0; i < FK_MAX_ARENAS; i++) {
    fk_arena *x = &G.arenas[i];
    if (x->live && a >= (uintptr_t)x->dev && a < (uintptr_t)x->dev + x->bytes) return x;
  }
  return NULL;
}

/* The live staging block holding [p, p + bytes) (G.mu held); NULL when none. */
static fk_host *host_at_locked(const void *p, size_t bytes) {
  uintptr_t a = (uintptr_t)p;
  for (int i = 0; i < FK_MAX_HOSTS; i++) {
    fk_host *h = &G.hosts[i];
    uintptr_t lo = (uintptr_t)h->p;
    if (h->live && a >= lo && a - lo <= h->bytes && bytes <= h->bytes - (a - lo)) return h;
  }
  return NULL;
}

void *fake_cuda_arena(int gpu, int k, size_t *bytes) {
  lock();
  fk_arena *pick[FK_MAX_ARENAS];
  int n = 0;
  for (int i = 0; i < FK_MAX_ARENAS; i++)
    if (G.arenas[i].live && G.arenas[i].gpu == gpu) pick[n++] = &G.arenas[i];
  /* allocation order: the table reuses free entries */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && pick[j - 1]->serial > pick[j]->serial; j--) {
      fk_arena *t = pick[j];
      pick[j] = pick[j - 1];
      pick[j - 1] = t;
    }
  void *p = k >= 0 && k < n ? pick[k]->dev : NULL;
  if (bytes) *bytes = p ? pick[k]->bytes : 0;
  unlock();
  return p;
}

int fake_cuda_is_device(const void *p) {
  lock();
  int r = arena_at_locked(p) != NULL;
  unlock();
  return r;
}

static dp_status test_access(void *dst, const void *src, size_t bytes, bool to_device) {
  const void *dev = to_device ? dst : src;
  lock();
  fk_arena *a = arena_at_locked(dev);
  size_t off = a ? (size_t)((const unsigned char *)dev - a->dev) : 0;
  if (!a || bytes > a->bytes - off) {
    unlock();
    return DP_FAIL(DP_ERR_INVALID, "fake cuda: [%p, +%zu) is not inside one live arena",
                   dev, bytes);
  }
  if (to_device)
    memcpy(a->rw + off, src, bytes);
  else
    memcpy(dst, a->rw + off, bytes);
  unlock();
  return DP_OK;
}

dp_status fake_cuda_poke(void *dev, const void *src, size_t bytes) {
  return test_access(dev, src, bytes, true);
}

dp_status fake_cuda_peek(void *dst, const void *dev, size_t bytes) {
  return test_access(dst, dev, bytes, false);
}

/* ---- devices and memory ----------------------------------------------------------- */

int dp__cuda_device_count(void) {
  lock();
  int n = G.gpus;
  unlock();
  if (n <= 0) DP_FAIL(DP_ERR_BACKEND, "no usable GPU: the emulated machine has none");
  return n;
}

int dp__cuda_have_nccl(void) {
  lock();
  int r = G.have_nccl;
  unlock();
  return r;
}

static dp_status no_such_gpu_locked(int dev) {
  return DP_FAIL(DP_ERR_INVALID, "cuda device %d: no such device (%d visible)", dev,
                 G.gpus);
}

static size_t free_locked(int dev) {
  return G.used[dev] < G.free_limit[dev] ? G.free_limit[dev] - G.used[dev] : 0;
}

dp_status dp__cuda_device_info(int dev, char *name, size_t cap, size_t *total_mem,
                               size_t *free_mem, int *sm_major, int *sm_minor) {
  lock();
  if (dev < 0 || dev >= G.gpus) {
    dp_status s = no_such_gpu_locked(dev);
    unlock();
    return s;
  }
  if (name && cap > 0) snprintf(name, cap, "emulated GPU %d (tests/emul/fake_cuda.c)", dev);
  if (total_mem) *total_mem = G.free_limit[dev];
  if (free_mem) *free_mem = free_locked(dev);
  if (sm_major) *sm_major = 9;
  if (sm_minor) *sm_minor = 0;
  unlock();
  return DP_OK;
}

static double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

static void unmap_arena(fk_arena *a) {
  if (a->dev) munmap(a->dev, a->map);
  if (a->span) munmap(a->span, a->span_bytes);
  if (a->fd >= 0) close(a->fd);
  a->dev = a->rw = a->span = NULL;
  a->fd = -1;
}

/* Two views of one memfd: the PROT_NONE one is the "device address". */
static bool map_arena(fk_arena *a, size_t bytes) {
  size_t pg = page_bytes();
  a->bytes = bytes;
  a->map = round_up(bytes, pg);
  a->span_bytes = a->map + 2 * pg;
  a->fd = memfd_create("fake-cuda-arena", MFD_CLOEXEC);
  if (a->fd < 0 || ftruncate(a->fd, (off_t)a->map) != 0) return false;
  void *dev = mmap(NULL, a->map, PROT_NONE, MAP_SHARED, a->fd, 0);
  if (dev == MAP_FAILED) return false;
  a->dev = dev;
  void *span = mmap(NULL, a->span_bytes, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (span == MAP_FAILED) return false;
  a->span = span;
  void *rw =
      mmap(a->span + pg, a->map, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, a->fd, 0);
  if (rw == MAP_FAILED) return false;
  a->rw = rw;
  return true;
}

dp_status dp__cuda_arena_alloc(int dev, size_t bytes, void **out) {
  if (!out) return DP_FAIL(DP_ERR_INVALID, "cuda device %d: arena: out is NULL", dev);
  *out = NULL;
  lock();
  dp_status s = DP_OK;
  if (dev < 0 || dev >= G.gpus) {
    s = no_such_gpu_locked(dev);
  } else if (bytes > 0 && bytes > free_locked(dev)) {
    /* cuda/arena.cu's refusal, word for word */
    s = DP_FAIL(DP_ERR_NOMEM,
                "cuda device %d: arena of %zu bytes (%.1f MiB) planned, but only %zu bytes "
                "(%.1f MiB) free of %zu",
                dev, bytes, mib(bytes), free_locked(dev), mib(free_locked(dev)),
                G.free_limit[dev]);
  } else if (bytes > 0) {
    fk_arena *a = NULL;
    for (int i = 0; i < FK_MAX_ARENAS && !a; i++)
      if (!G.arenas[i].live) a = &G.arenas[i];
    if (!a) {
      s = DP_FAIL(DP_ERR_NOMEM, "fake cuda: more than %d live arenas", FK_MAX_ARENAS);
    } else {
      memset(a, 0, sizeof *a);
      a->fd = -1;
      if (!map_arena(a, bytes)) {
        unmap_arena(a);
        s = DP_FAIL(DP_ERR_NOMEM,
                    "cuda device %d: arena of %zu bytes: cudaMalloc: "
                    "cudaErrorMemoryAllocation (emulated: mmap failed)",
                    dev, bytes);
      } else {
        a->gpu = dev;
        a->serial = G.serial++;
        a->live = true;
        G.used[dev] += bytes;
        G.n_arenas++;
        G.arena_bytes += bytes;
        *out = a->dev;
      }
    }
  }
  unlock();
  return s;
}

void dp__cuda_arena_free(int dev, void *p) {
  (void)dev; /* cudaFree finds the device of p by itself */
  if (!p) return;
  lock();
  fk_arena *a = arena_at_locked(p);
  if (!a || a->dev != p || a->owner) {
    atomic_fetch_add(&n_bad_frees, 1);
    DP_FAIL(DP_ERR_BACKEND, "cudaFree(%p): %s", p,
            !a || a->dev != p ? "not the start of a live arena"
                              : "the arena is still in use by a backend context");
    unlock();
    return;
  }
  G.used[a->gpu] -= a->bytes;
  G.n_arenas--;
  G.arena_bytes -= a->bytes;
  unmap_arena(a);
  a->live = false;
  unlock();
}

dp_status dp__cuda_host_alloc(size_t bytes, void **out) {
  if (!out) return DP_FAIL(DP_ERR_INVALID, "host staging arena: out is NULL");
  *out = NULL;
  if (bytes == 0) return DP_OK;
  lock();
  dp_status s = DP_OK;
  fk_host *h = NULL;
  for (int i = 0; i < FK_MAX_HOSTS && !h; i++)
    if (!G.hosts[i].live) h = &G.hosts[i];
  size_t pg = page_bytes(), map = round_up(bytes, pg) + pg;
  void *p = h ? mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
              : MAP_FAILED;
  if (p == MAP_FAILED) {
    s = DP_FAIL(DP_ERR_NOMEM,
                "pinned host staging arena of %zu bytes: cudaHostAlloc: "
                "cudaErrorMemoryAllocation (emulated)",
                bytes);
  } else {
    /* a write past the end of what was asked for faults (past the page) */
    mprotect((unsigned char *)p + map - pg, pg, PROT_NONE);
    *h = (fk_host){.p = p, .bytes = bytes, .map = map, .live = true};
    G.n_hosts++;
    *out = p;
  }
  unlock();
  return s;
}

void dp__cuda_host_free(void *p) {
  if (!p) return;
  lock();
  fk_host *h = host_at_locked(p, 0);
  if (!h || h->p != p) {
    atomic_fetch_add(&n_bad_frees, 1);
    DP_FAIL(DP_ERR_BACKEND, "cudaFreeHost(%p): not the start of a live staging block", p);
  } else {
    munmap(h->p, h->map);
    h->live = false;
    G.n_hosts--;
  }
  unlock();
}

/* ---- the backend context ---------------------------------------------------------- */

enum { ST_IDLE, ST_STEP, ST_CAPTURE, ST_CAPTURE_STEP, ST_LAUNCHED, ST_ABORTED };
static const char *const state_names[] = {
    "idle",      "a step",           "a capture before its step_begin",
    "a capture", "a launched graph", "an aborted capture"};

/* CALL_SEND / CALL_RECV: this process's half of an emulated NCCL pair with a
 * device of another process (the MPI build of the double: MPI underneath). */
enum { CALL_RUN, CALL_COPY, CALL_SEND, CALL_RECV };

/* One queued call, with the values a kernel launch would bake in (never a
 * pointer into the caller's stack). */
typedef struct {
  int kind, stage;
  int rows;
  bool training;
  dp_op op;
  void *dst;
  const void *src;
  size_t bytes;
  int peer, self; /* CALL_SEND/RECV: the global devices at either end */
} fk_call;

typedef struct {
  int phys;
  unsigned char *dev, *rw; /* arena as lib/ sees it, and its alias */
  size_t bytes;
  bool in_stage;
  int stage, last_stage;
  fk_call *q;
  int nq;
  dp_mb *mbs; /* this step's micro-batches, as the device's first call saw them */
  const dp_mb *mbs_from;
  bool mbs_set;
} fk_dev;

typedef struct {
  bool ready;
  fk_call *calls[DP_MAX_DEVICES];
  int n[DP_MAX_DEVICES];
  dp_mb *mbs[DP_MAX_DEVICES];
} fk_slot;

struct fk_ctx {
  const dp_plan *p;
  int n, n_mb, cap;
  int d0, d1;  /* this process's devices: [0, n), or a rank's across processes */
  bool world;  /* across processes: emulated NCCL over MPI */
  bool broken; /* an emulated NCCL transfer timed out: communicators aborted */
  bool synced; /* dp__cuda_step_sync ran in this step */
  int timeout_ms;
#ifdef FAKE_CUDA_MPI
  MPI_Comm comm; /* the emulated NCCL's own (a dup of the world's processes) */
#endif
  unsigned flags;
  int state, launched;
  uint64_t step; /* the step scalars of the queued work */
  float lr;      /* dp__cuda_set_lr's, config.lr at first */
  float momentum;             /* dp__cuda_set_momentum's, the config's at first */
  float loss_denom, loss_inv; /* dp__cuda_set_loss_norm's */
  fk_dev dev[DP_MAX_DEVICES];
  fk_slot slot[DP_CUDA_GRAPH_SLOTS];
  /* the status words of the last executed step */
  bool st_loss, st_label, st_grad, st_grad_inf;
  bool st_update;      /* GRAD_CHECK: the update would not be finite */
  uint64_t fault_step; /* DP_CUDA_DEBUG_FAULT_STEP, as cuda/context.cu reads it */
  bool faulted;        /* that step ran: every later step fails (a sticky error) */
  char update_msg[DP_ERRMSG_CAP]; /* the lowest device's report, in the cpu's words */
  int update_dev;
  /* the fast_collectives allreduce being entered: each device's op, by device */
  const dp_op *coll_first; /* the first device's op of the collective being entered */
  uint64_t coll_mask;      /* the devices that entered it */
  int coll_n, coll_stage;
  float loss;
  int bad_row;
  size_t bad_grad;
  dp_status fault;
  char fault_msg[DP_ERRMSG_CAP];
};

/* The executing device of the calling thread, set by dp__cuda_stage_begin:
 * copy() is not told which device runs it. */
static _Thread_local fk_ctx *tl_ctx;
static _Thread_local int tl_dev = -1;

static void slot_clear(fk_slot *s) {
  for (int d = 0; d < DP_MAX_DEVICES; d++) {
    free(s->calls[d]);
    free(s->mbs[d]);
  }
  memset(s, 0, sizeof *s);
}

static void clear_queues(fk_ctx *c) {
  for (int d = c->d0; d < c->d1; d++) {
    fk_dev *x = &c->dev[d];
    x->in_stage = false;
    x->stage = x->last_stage = -1;
    x->nq = 0;
    x->mbs_set = false;
    x->mbs_from = NULL;
  }
}

void dp__cuda_ctx_free(void *bctx) {
  fk_ctx *c = bctx;
  if (!c) return;
  if (c->state != ST_IDLE) {
    /* a wiring bug: freed with work queued and no step_end */
    atomic_fetch_add(&n_bad_frees, 1);
    DP_FAIL(DP_ERR_BACKEND, "fake cuda: context freed during %s", state_names[c->state]);
  }
  lock();
  for (int i = 0; i < FK_MAX_ARENAS; i++)
    if (G.arenas[i].owner == c) G.arenas[i].owner = NULL;
  G.n_ctxs--;
  unlock();
  for (int d = c->d0; d < c->d1; d++) {
    free(c->dev[d].q);
    free(c->dev[d].mbs);
  }
  for (int i = 0; i < DP_CUDA_GRAPH_SLOTS; i++) slot_clear(&c->slot[i]);
#ifdef FAKE_CUDA_MPI
  if (c->world) MPI_Comm_free(&c->comm);
#endif
  if (tl_ctx == c) {
    tl_ctx = NULL;
    tl_dev = -1;
  }
  free(c);
}

/* cuda/context.cu's checks, and the emulation's own: the arena is one the
 * double allocated on that GPU and holds the device's planned bytes, and the
 * CPU ops' GEMM buffers fit the workspace. */
static dp_status check_init_locked(const dp_plan *p, void *const arenas[], unsigned flags,
                                   int d0, int d1) {
  int n = p->split.n_used;
  if (n < 1 || n > DP_MAX_DEVICES)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init: %d devices", n);
  if (d0 < 0 || d1 > n || d0 > d1)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init: devices %d..%d of %d", d0, d1 - 1,
                   n);
  if (flags & ~(unsigned)(DP_CUDA_TF32 | DP_CUDA_NCCL))
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init: unknown flags 0x%x", flags);
  if ((flags & DP_CUDA_NCCL) && !G.have_nccl)
    return DP_FAIL(DP_ERR_UNSUPPORTED, "the NCCL transport: this build has no NCCL");
  for (int d = d0; d < d1; d++) {
    dp_region_info ws = p->regions[d][DP_REGION_WORKSPACE];
    /* the fixed part, then conv2d's COL and T at the device's largest
     * micro-batch (dp__cuda_model_workspace_bytes) */
    size_t need =
        dp__cuda_model_workspace_bytes(&p->model, p->act[d].mb_rows, !p->cfg.inference);
    int gpu = p->cfg.device_ids[d];
    if (ws.size < need)
      return DP_FAIL(
          DP_ERR_INVALID,
          "device %d: the plan reserves %zu bytes of workspace; the CUDA backend "
          "needs %zu (%zu of status words + %zu for cuBLAS + %zu for conv2d's "
          "buffers: dp__cuda_model_workspace_bytes)",
          d, ws.size, need, DP_CUDA_WS_HEADER_BYTES, DP_CUDA_BLAS_WS_BYTES,
          need - DP_CUDA_CONV_WS_OFFSET);
    size_t cpu_ws =
        dp__model_workspace_bytes(&p->model, p->act[d].mb_rows, !p->cfg.inference);
    if (cpu_ws > ws.size)
      return DP_FAIL(DP_ERR_INVALID,
                     "fake cuda: device %d: the CPU ops it runs need %zu bytes of GEMM "
                     "workspace, the plan has %zu: the emulation would not be the CPU's",
                     d, cpu_ws, ws.size);
    if (!arenas[d] || (uintptr_t)arenas[d] % 256 ||
        (ws.offset + DP_CUDA_WS_HEADER_BYTES) % 256)
      return DP_FAIL(DP_ERR_INVALID,
                     "device %d: arena %p or its workspace is not 256-aligned", d,
                     arenas[d]);
    if (gpu < 0 || gpu >= G.gpus) return no_such_gpu_locked(gpu);
    fk_arena *a = arena_at_locked(arenas[d]);
    if (!a || a->gpu != gpu)
      return DP_FAIL(DP_ERR_INVALID, "device %d: its arena %p is not memory of GPU %d", d,
                     arenas[d], gpu);
    size_t off = (size_t)((unsigned char *)arenas[d] - a->dev);
    if (p->dev_bytes[d] > a->bytes - off)
      return DP_FAIL(DP_ERR_INVALID,
                     "device %d: its arena holds %zu bytes from %p; the plan needs %zu", d,
                     a->bytes - off, arenas[d], p->dev_bytes[d]);
    if (a->owner)
      return DP_FAIL(DP_ERR_INVALID, "device %d: its arena %p belongs to another context",
                     d, arenas[d]);
    for (int e = d0; e < d; e++) {
      uintptr_t lo = (uintptr_t)arenas[e], hi = lo + p->dev_bytes[e];
      uintptr_t a0 = (uintptr_t)arenas[d], a1 = a0 + p->dev_bytes[d];
      if (a0 < hi && lo < a1)
        return DP_FAIL(DP_ERR_INVALID, "devices %d and %d: their arenas overlap", e, d);
      if ((flags & DP_CUDA_NCCL) && p->cfg.device_ids[e] == gpu)
        return DP_FAIL(DP_ERR_INVALID,
                       "the NCCL transport needs a GPU per replica; replicas %d and %d are "
                       "both on GPU %d",
                       e, d, gpu);
    }
  }
  return DP_OK;
}

#ifdef FAKE_CUDA_MPI
static MPI_Comm base_comm = MPI_COMM_NULL; /* fake_cuda_set_mpi_comm's; WORLD if unset */
void fake_cuda_set_mpi_comm(MPI_Comm comm) { base_comm = comm; }
static atomic_int drop_sends;
void fake_cuda_drop_sends(int yes) { atomic_store(&drop_sends, yes != 0); }

/* ncclGetUniqueId on rank 0, the id through the world's broadcast (libdp's
 * own wiring, under test), then the communicator's "bootstrap": every rank
 * must hold the same id, and the emulated NCCL's MPI communicator must be the
 * world's processes in the world's order. */
static dp_status world_bootstrap(const dp_backend_world *w, MPI_Comm *out) {
  uint64_t id = 0;
  if (w->rank == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    id = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ 0x6e63636cull;
  }
  dp_status s = w->bcast(w->w, 0, &id, sizeof id);
  if (s) return s;
  MPI_Comm base = base_comm == MPI_COMM_NULL ? MPI_COMM_WORLD : base_comm;
  int size = 0, rank = -1;
  MPI_Comm_size(base, &size);
  MPI_Comm_rank(base, &rank);
  if (size != w->ranks || rank != w->rank)
    return DP_FAIL(DP_ERR_BACKEND,
                   "fake cuda: the emulated NCCL's communicator has %d processes (this one "
                   "%d), the world %d (this one %d): fake_cuda_set_mpi_comm",
                   size, rank, w->ranks, w->rank);
  if (MPI_Comm_dup(base, out) != MPI_SUCCESS)
    return DP_FAIL(DP_ERR_BACKEND, "fake cuda: MPI_Comm_dup failed");
  uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&id, &lo, 1, MPI_UINT64_T, MPI_MIN, *out);
  MPI_Allreduce(&id, &hi, 1, MPI_UINT64_T, MPI_MAX, *out);
  if (lo != hi || id == 0) {
    MPI_Comm_free(out);
    return DP_FAIL(DP_ERR_BACKEND,
                   "fake cuda: ncclCommInitRank: the ranks hold different unique ids "
                   "(the world's broadcast did not carry rank 0's)");
  }
  return DP_OK;
}
#endif

static dp_status ctx_init(const dp_plan *p, void *const arenas[], unsigned flags,
                          const dp_backend_world *w, void **bctx_out) {
  if (!bctx_out) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init: out is NULL");
  *bctx_out = NULL;
  if (!p || !arenas)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init: plan or arenas is NULL");
  int d0 = w ? w->dev0 : 0, d1 = w ? w->dev1 : p->split.n_used;
  if (w && !(flags & DP_CUDA_NCCL))
    return DP_FAIL(DP_ERR_INVALID,
                   "dp__cuda_ctx_init: across processes the copies between ranks need "
                   "NCCL (DP_CUDA_NCCL)");
  lock();
  dp_status s = check_init_locked(p, arenas, flags, d0, d1);
  unlock();
  if (s) return s;
#ifdef FAKE_CUDA_MPI
  MPI_Comm comm = MPI_COMM_NULL;
  if (w && (s = world_bootstrap(w, &comm))) return s;
#else
  if (w)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "fake cuda: across processes the emulated NCCL needs the MPI build of "
                   "the double (FAKE_CUDA_MPI)");
#endif
  fk_ctx *c = calloc(1, sizeof *c);
  if (!c) return DP_FAIL(DP_ERR_NOMEM, "dp__cuda_ctx_init: out of memory");
  c->p = p;
  c->n = p->split.n_used;
  c->d0 = d0;
  c->d1 = d1;
  c->world = w != NULL;
  c->timeout_ms = p->cfg.timeout_ms > 0 ? p->cfg.timeout_ms : 60000;
#ifdef FAKE_CUDA_MPI
  c->comm = comm;
#endif
  c->n_mb = p->split.n_mb;
  c->cap = p->ops_cap > 0 ? p->ops_cap : 1; /* no device has more calls than ops */
  c->flags = flags;
  c->lr = p->cfg.lr;
  c->momentum = dp__config_momentum(&p->cfg);
  const char *fs = getenv("DP_CUDA_DEBUG_FAULT_STEP");
  c->fault_step = fs ? strtoull(fs, NULL, 10) : 0;
  c->state = ST_IDLE;
  bool ok = true;
  for (int d = c->d0; d < c->d1; d++) {
    fk_dev *x = &c->dev[d];
    x->phys = p->cfg.device_ids[d];
    x->dev = arenas[d];
    x->bytes = p->dev_bytes[d];
    x->q = malloc((size_t)c->cap * sizeof *x->q);
    x->mbs = malloc((size_t)(c->n_mb > 0 ? c->n_mb : 1) * sizeof *x->mbs);
    ok = ok && x->q && x->mbs;
  }
  lock();
  for (int d = c->d0; d < c->d1; d++) {
    fk_arena *a = arena_at_locked(arenas[d]);
    c->dev[d].rw = a->rw + ((unsigned char *)arenas[d] - a->dev);
    if (ok) a->owner = c;
  }
  G.n_ctxs++;
  unlock();
  clear_queues(c);
  if (!ok) {
    dp__cuda_ctx_free(c);
    return DP_FAIL(DP_ERR_NOMEM, "dp__cuda_ctx_init: out of memory");
  }
  *bctx_out = c;
  return DP_OK;
}

dp_status dp__cuda_ctx_init(const dp_plan *p, void *const arenas[], unsigned flags,
                            void **bctx_out) {
  return ctx_init(p, arenas, flags, NULL, bctx_out);
}

dp_status dp__cuda_ctx_init_world(const dp_plan *p, void *const arenas[], unsigned flags,
                                  const dp_backend_world *w, void **bctx_out) {
  if (!w) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init_world: no world");
  return ctx_init(p, arenas, flags, w, bctx_out);
}

/* ---- executing queued work ("the device") ----------------------------------------- */

/* The alias of a device address of this context's arenas; host memory as is. */
static void *translate(const fk_ctx *c, const void *p) {
  uintptr_t a = (uintptr_t)p;
  for (int d = c->d0; d < c->d1; d++) {
    uintptr_t lo = (uintptr_t)c->dev[d].dev;
    if (a >= lo && a - lo < c->dev[d].bytes) return c->dev[d].rw + (a - lo);
  }
  return (void *)p;
}

/* The CE loss kernel's check: a label outside 0..classes-1 flags the step
 * (lowest global row) and its rows are left out. The double then writes zero
 * sums and gradients for all of the op's rows rather than the others' terms
 * (the step is refused either way; lib/core/ctx.c checks labels on the host too). */
static bool bad_labels(fk_ctx *c, const dp_exec_env *e, const dp_op *op) {
  const dp_plan *p = c->p;
  if (p->model.loss != DP_LOSS_SOFTMAX_CE) return false;
  int d = op->device, cols = dp_model_output_width(&p->model);
  const int32_t *t = dp__region_ptr(e, d, DP_REGION_TARGETS);
  bool bad = false;
  for (int k = 0; k < op->n_mb; k++) {
    const dp_mb *mb = &e->mbs[op->micro_batch + k];
    for (int r = mb->row0 - op->row0; r < mb->row0 - op->row0 + mb->rows; r++)
      if ((t[r] < 0 || t[r] >= cols) &&
          !(p->model.ce.ignore && t[r] == p->model.ce.ignore_index)) {
        if (!c->st_label || op->row0 + r < c->bad_row) c->bad_row = op->row0 + r;
        c->st_label = bad = true;
      }
  }
  if (!bad) return false;
  bool classic = p->cfg.mode == DP_MODE_CLASSIC;
  float *g =
      dp__region_ptr(e, d, classic ? DP_REGION_GATHERED_GRADS : DP_REGION_OUTPUT_GRADS);
  float *part = dp__region_ptr(e, d, DP_REGION_LOSS);
  for (int k = 0; k < op->n_mb; k++) {
    const dp_mb *mb = &e->mbs[op->micro_batch + k];
    part[k] = 0.0f;
    memset(g + (size_t)(mb->row0 - op->row0) * cols, 0, (size_t)mb->rows * cols * 4);
  }
  return true;
}

/* GRAD_CHECK flagged: the lowest bad index of any device, as the kernel's
 * atomicMin does. */
static void note_bad_grad(fk_ctx *c, const dp_exec_env *e, const dp_op *op) {
  const float *g =
      (const float *)((unsigned char *)dp__region_ptr(e, op->device, op->src_region) +
                      op->src_offset);
  for (size_t k = 0; k < op->bytes / 4; k++)
    if (!isfinite(g[k])) {
      size_t idx = op->src_offset / 4 + k;
      if (!c->st_grad || idx < c->bad_grad) {
        c->bad_grad = idx;
        c->st_grad_inf = isinf(g[k]);
      }
      c->st_grad = true;
      return;
    }
  /* finite gradients: the update would write a non-finite value (the kernel's
   * DP_CUDA_ST_UPDATE); the lowest device's report has the lowest index (its
   * optimizer range comes first) */
  if (!c->st_update || op->device < c->update_dev) {
    snprintf(c->update_msg, sizeof c->update_msg, "%s", dp_last_error());
    c->update_dev = op->device;
  }
  c->st_update = true;
}

static void fault(fk_ctx *c, const char *fmt, int a, int b) {
  if (c->fault) return;
  c->fault = DP_ERR_BACKEND;
  snprintf(c->fault_msg, sizeof c->fault_msg, fmt, a, b);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#ifdef FAKE_CUDA_MPI
/* Polls req until done or the step's timeout: false at the deadline (the
 * request is cancelled and freed, and the emulated communicators are broken). */
static bool mpi_done(fk_ctx *c, MPI_Request *req, double deadline) {
  for (long polls = 0;; polls++) {
    int done = 0;
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (now_s() > deadline) {
      MPI_Cancel(req);
      MPI_Request_free(req);
      c->broken = true;
      return false;
    }
    if (polls > 1000) nanosleep(&(struct timespec){0, 50000}, NULL);
  }
}

/* The devices [lo, hi) of a rank (the plan's, clipped to the used ones). */
static void rank_devs(const fk_ctx *c, int r, int *lo, int *hi) {
  int L = c->p->cfg.n_devices / dp__ranks(&c->p->cfg);
  *lo = r * L < c->n ? r * L : c->n;
  *hi = *lo + L < c->n ? *lo + L : c->n;
}

/* fast_collectives across processes: every device's vector, all ranks', in
 * device order, then the sum in device order (as in one process). */
static void allreduce_world(fk_ctx *c, const dp_op *op) {
  size_t len = op->bytes / 4;
  int ranks = dp__ranks(&c->p->cfg), counts[DP_MAX_DEVICES], displs[DP_MAX_DEVICES];
  for (int r = 0; r < ranks; r++) {
    int lo, hi;
    rank_devs(c, r, &lo, &hi);
    counts[r] = (int)((size_t)(hi - lo) * len);
    displs[r] = (int)((size_t)lo * len);
  }
  float *all = malloc((size_t)c->n * len * 4 + 1), *mine = malloc(counts[0] * 4 + 4);
  if (!all || !mine) {
    free(all), free(mine);
    fault(c, "fake cuda: out of memory in the allreduce of device %d (stage %d)",
          op->device, op->stage);
    return;
  }
  int L = c->d1 - c->d0;
  for (int d = c->d0; d < c->d1; d++)
    memcpy(mine + (size_t)(d - c->d0) * len,
           c->dev[d].rw + c->p->regions[d][op->dst_region].offset + op->dst_offset,
           op->bytes);
  MPI_Request req;
  MPI_Iallgatherv(mine, (int)((size_t)L * len), MPI_FLOAT, all, counts, displs, MPI_FLOAT,
                  c->comm, &req);
  if (!mpi_done(c, &req, now_s() + 1e-3 * c->timeout_ms)) {
    fault(c,
          "emulated NCCL: the allreduce of device %d did not complete within the "
          "timeout (stage %d); the communicators were aborted",
          op->device, op->stage);
  } else {
    for (size_t k = 0; k < len; k++) {
      float sum = all[k];
      for (int d = 1; d < c->n; d++) sum += all[(size_t)d * len + k];
      for (int d = c->d0; d < c->d1; d++)
        ((float *)(c->dev[d].rw + c->p->regions[d][op->dst_region].offset +
                   op->dst_offset))[k] = sum;
    }
  }
  free(all);
  free(mine);
}
#endif

/* config.fast_collectives: ncclAllReduce in place, entered by every device
 * of the context in one stage; it completes when the last one enters. The
 * sum runs in device order (NCCL's order depends on the topology; for two
 * devices this one is the canonical tree's). */
static void allreduce_enter(fk_ctx *c, const dp_op *op, int stage) {
  if (c->coll_n == 0) {
    c->coll_stage = stage;
    c->coll_first = op;
    c->coll_mask = 0;
  }
  const dp_op *o0 = c->coll_first; /* the devices enter in any order (streams) */
  if (stage != c->coll_stage || ((c->coll_mask >> op->device) & 1) ||
      op->dst_region != o0->dst_region || op->dst_offset != o0->dst_offset ||
      op->bytes != o0->bytes) {
    fault(c,
          "fake cuda: allreduce of device %d in stage %d does not match the collective "
          "the devices before it entered (a real one hangs)",
          op->device, stage);
    return;
  }
  c->coll_mask |= 1ull << op->device;
  if (++c->coll_n < c->d1 - c->d0) return;
  c->coll_n = 0;
#ifdef FAKE_CUDA_MPI
  if (c->world) {
    allreduce_world(c, op);
    return;
  }
#endif
  float *g[DP_MAX_DEVICES];
  for (int d = c->d0; d < c->d1; d++)
    g[d] =
        (float *)(c->dev[d].rw + c->p->regions[d][op->dst_region].offset + op->dst_offset);
  for (size_t k = 0; k < op->bytes / 4; k++) {
    float sum = g[0][k];
    for (int d = 1; d < c->n; d++) sum += g[d][k];
    for (int d = c->d0; d < c->d1; d++) g[d][k] = sum;
  }
}

static void exec_call(fk_ctx *c, const fk_call *k, const dp_mb *mbs, uint64_t step) {
  atomic_fetch_add_explicit(&n_executed, 1, memory_order_relaxed);
  if (k->kind == CALL_COPY) {
    memcpy(translate(c, k->dst), translate(c, k->src), k->bytes);
    return;
  }
  /* host_x/t/y stay NULL: compute ops never read caller memory */
  dp_exec_env e;
  memset(&e, 0, sizeof e);
  e.plan = c->p;
  for (int d = c->d0; d < c->d1; d++) e.arena[d] = c->dev[d].rw;
  e.mbs = mbs;
  e.rows = k->rows;
  e.loss_rows = k->rows; /* the cuda backend does not accumulate (the planner refuses) */
  e.training = k->training;
  e.step = step;
  e.lr = c->lr; /* as the device reads them from the step's scalars */
  e.momentum = c->momentum;
  e.loss_denom = c->loss_denom;
  e.loss_inv = c->loss_inv;
  const dp_op *op = &k->op;
  /* the commit phase's writes, refused on the device with the step */
  if ((op->kind == DP_OP_OPTIMIZER || op->kind == DP_OP_BN_UPDATE) &&
      (c->st_loss || c->st_label || c->st_grad || c->st_update))
    return;
  if (op->kind == DP_OP_LOSS && bad_labels(c, &e, op)) return;
  if (op->kind == DP_OP_ALLREDUCE) {
    allreduce_enter(c, op, k->stage);
    return;
  }
  dp_status s = dp__cpu_backend.run(NULL, &e, op);
  if (op->kind == DP_OP_LOSS_SUM) {
    c->loss = e.loss;
    if (s == DP_ERR_NONFINITE) c->st_loss = true, s = DP_OK;
  } else if (op->kind == DP_OP_GRAD_CHECK && s == DP_ERR_NONFINITE) {
    note_bad_grad(c, &e, op);
    s = DP_OK;
  }
  if (s && !c->fault) {
    c->fault = s;
    snprintf(c->fault_msg, sizeof c->fault_msg, "%s", dp_last_error());
  }
}

/* The status words, as dp__cuda_step_begin resets them on the device. */
static void exec_reset(fk_ctx *c) {
  c->st_loss = c->st_label = c->st_grad = c->st_grad_inf = c->st_update = false;
  c->loss = 0.0f;
  c->bad_row = -1;
  c->bad_grad = 0;
  c->fault = DP_OK;
  c->fault_msg[0] = '\0';
  c->coll_n = 0;
}

#ifdef FAKE_CUDA_MPI
/* Posts the MPI half of an emulated NCCL transfer with another process (tag:
 * the device pair; MPI keeps one pair's messages in order, as NCCL does). */
static void post(fk_ctx *c, const fk_call *k, MPI_Request *req) {
  int L = c->p->cfg.n_devices / dp__ranks(&c->p->cfg);
  int from = k->kind == CALL_SEND ? k->self : k->peer;
  int to = k->kind == CALL_SEND ? k->peer : k->self;
  int tag = from * DP_MAX_DEVICES + to;
  if (k->kind == CALL_SEND) /* a host end is staging memory: translate leaves it */
    MPI_Isend(translate(c, k->src), (int)k->bytes, MPI_BYTE, to / L, tag, c->comm, req);
  else
    MPI_Irecv(translate(c, k->dst), (int)k->bytes, MPI_BYTE, from / L, tag, c->comm, req);
}
#endif

/* Stage by stage; within a stage, device by device in list order (devices
 * share nothing within a stage: the CPU runs them in parallel). A transfer
 * with another process (CALL_SEND/RECV) holds up its device's queue until it
 * completes, as NCCL's kernel holds up its stream; the other devices go on. */
static void exec_all(fk_ctx *c, fk_call *const calls[], const int counts[],
                     dp_mb *const mbs[], uint64_t step) {
  int idx[DP_MAX_DEVICES] = {0};
  double deadline = now_s() + 1e-3 * c->timeout_ms;
#ifdef FAKE_CUDA_MPI
  MPI_Request req[DP_MAX_DEVICES];
  for (int d = 0; d < DP_MAX_DEVICES; d++) req[d] = MPI_REQUEST_NULL;
#endif
  for (;;) {
    int s = INT_MAX;
    for (int d = c->d0; d < c->d1; d++)
      if (idx[d] < counts[d] && calls[d][idx[d]].stage < s) s = calls[d][idx[d]].stage;
    if (s == INT_MAX) break;
    /* Streams run concurrently: the devices' calls of a stage interleave, one
     * at a time round-robin, starting from the last device on odd steps and the
     * first on even ones, so that work of one replica that depended on
     * another's in the same stage (a missing edge) would change the results. */
    for (bool more = true, waiting = false; more || waiting;) {
      more = waiting = false;
      for (int i = c->d0; i < c->d1; i++) {
        int d = step & 1 ? c->d1 - 1 - (i - c->d0) : i;
#ifdef FAKE_CUDA_MPI
        if (req[d] != MPI_REQUEST_NULL) { /* its transfer holds the stream */
          int done = 0;
          MPI_Test(&req[d], &done, MPI_STATUS_IGNORE);
          if (!done) {
            waiting = true;
            continue;
          }
          more = true;
        }
#endif
        if (idx[d] < counts[d] && calls[d][idx[d]].stage == s) {
          fk_call *k = &calls[d][idx[d]++];
          more = true;
          if (k->kind != CALL_SEND && k->kind != CALL_RECV) {
            exec_call(c, k, mbs[d], step);
            continue;
          }
#ifdef FAKE_CUDA_MPI
          if (!c->broken && !(k->kind == CALL_SEND && atomic_load(&drop_sends)))
            post(c, k, &req[d]);
#endif
        }
      }
      if (!more && waiting) {
        if (now_s() > deadline) {
#ifdef FAKE_CUDA_MPI
          for (int d = c->d0; d < c->d1; d++)
            if (req[d] != MPI_REQUEST_NULL) {
              MPI_Cancel(&req[d]);
              MPI_Request_free(&req[d]);
              fault(c,
                    "emulated NCCL: device %d's transfer with device %d did not complete "
                    "within the timeout (a peer process lost or stalled); the "
                    "communicators were aborted",
                    d, calls[d][idx[d] - 1].peer);
            }
#endif
          c->broken = true;
          waiting = false;
        } else {
          nanosleep(&(struct timespec){0, 20000}, NULL);
        }
      }
    }
    if (c->coll_n) {
      fault(c, "fake cuda: only %d of %d devices entered an allreduce (a real one hangs)",
            c->coll_n, c->d1 - c->d0);
      c->coll_n = 0;
    }
  }
}

/* ---- the executor's side: validation and queuing ---------------------------------- */

static bool recording(const fk_ctx *c) {
  return c->state == ST_STEP || c->state == ST_CAPTURE_STEP;
}

static dp_status not_recording(const fk_ctx *c, const char *what) {
  return DP_FAIL(DP_ERR_BACKEND,
                 "fake cuda: %s during %s: the executor may only run ops between "
                 "dp__cuda_step_begin and dp__cuda_step_end (or capture_end)",
                 what, state_names[c->state]);
}

/* The device arena (logical device) holding [p, p + bytes): -1 none, -2 it
 * starts in one and runs past its end. */
static int owner(const fk_ctx *c, const void *p, size_t bytes) {
  uintptr_t a = (uintptr_t)p;
  for (int d = c->d0; d < c->d1; d++) {
    uintptr_t lo = (uintptr_t)c->dev[d].dev;
    if (a >= lo && a - lo < c->dev[d].bytes)
      return bytes <= c->dev[d].bytes - (a - lo) ? d : -2;
  }
  return -1;
}

/* A host endpoint must be staging memory (the real backend copies
 * asynchronously and captures graphs: pageable caller memory will not do). */
static dp_status check_host(const void *p, size_t bytes, const char *what) {
  lock();
  bool other_arena = arena_at_locked(p) != NULL;
  bool ok = host_at_locked(p, bytes) != NULL;
  unlock();
  if (other_arena)
    return DP_FAIL(DP_ERR_BACKEND, "fake cuda: %s %p is device memory of another context",
                   what, p);
  if (!ok)
    return DP_FAIL(DP_ERR_BACKEND,
                   "fake cuda: %s [%p, +%zu) is not inside the pinned staging arena "
                   "(dp__cuda_host_alloc)",
                   what, p, bytes);
  return DP_OK;
}

static dp_status take_mbs(fk_dev *x, const fk_ctx *c, const dp_mb *mbs) {
  if (!mbs) return DP_FAIL(DP_ERR_BACKEND, "fake cuda: env.mbs is NULL");
  size_t n = (size_t)c->n_mb * sizeof *mbs;
  if (!x->mbs_set) {
    memcpy(x->mbs, mbs, n);
    x->mbs_from = mbs;
    x->mbs_set = true;
    return DP_OK;
  }
  if (mbs != x->mbs_from || memcmp(mbs, x->mbs, n) != 0)
    return DP_FAIL(
        DP_ERR_BACKEND,
        "fake cuda: the micro-batches changed within one step (queued kernels keep "
        "the values they were launched with)");
  return DP_OK;
}

/* collective: DP_OP_ALLREDUCE, which the transport hands in (dp__cuda_collective);
 * the backend's run takes every other compute op. */
static dp_status fk_run(void *bctx, dp_exec_env *e, const dp_op *op, bool collective) {
  fk_ctx *c = bctx;
  if (!c || !e || !op) return DP_FAIL(DP_ERR_INVALID, "fake cuda run: NULL argument");
  if (!recording(c)) return not_recording(c, "a backend run");
  int d = op->device;
  if (d < c->d0 || d >= c->d1)
    return DP_FAIL(DP_ERR_INVALID,
                   "cuda backend: op on device %d, but this process has devices %d..%d", d,
                   c->d0, c->d1 - 1);
  if (tl_ctx != c || tl_dev != d)
    return DP_FAIL(
        DP_ERR_BACKEND,
        "fake cuda: device %d's op runs on a thread whose stage is device %d's (or "
        "none): dp__cuda_stage_begin first, on the device's own thread",
        d, tl_ctx == c ? tl_dev : -1);
  fk_dev *x = &c->dev[d];
  if (!x->in_stage || op->stage != x->stage)
    return DP_FAIL(DP_ERR_BACKEND, "fake cuda: device %d runs an op of stage %d in %s %d",
                   d, op->stage, x->in_stage ? "stage" : "no stage; the last ended was",
                   x->in_stage ? x->stage : x->last_stage);
  /* the ops cuda/backend.cu runs: not clipping or accumulation (the planner
   * refuses them for this backend) */
  bool bn = op->kind >= DP_OP_BN_UPDATE && op->kind <= DP_OP_BN_BWD_STATS;
  /* reduce_precision bf16's packs (the cpu backend's code runs them) */
  bool packs = op->kind == DP_OP_GRAD_PACK || op->kind == DP_OP_GRAD_UNPACK;
  if (op->kind == DP_OP_COPY || (op->kind > DP_OP_ALLREDUCE && !bn && !packs) ||
      (op->kind == DP_OP_ALLREDUCE) != collective)
    return DP_FAIL(DP_ERR_BACKEND, "cuda backend: op kind %d is not a %s op", op->kind,
                   collective ? "collective" : "compute");
  if (op->kind == DP_OP_ALLREDUCE && !(c->flags & DP_CUDA_NCCL))
    return DP_FAIL(
        DP_ERR_BACKEND,
        "cuda backend: device %d: fast_collectives needs the NCCL communicators, "
        "which this context does not have",
        d);
  if ((op->kind == DP_OP_FORWARD || op->kind == DP_OP_BACKWARD) &&
      (op->layer < 0 || op->layer >= c->p->model.n_layers))
    return DP_FAIL(DP_ERR_INVALID, "cuda backend: no layer %d", op->layer);
  if (e->plan != c->p)
    return DP_FAIL(DP_ERR_BACKEND,
                   "fake cuda: env.plan is not the plan of dp__cuda_ctx_init");
  for (int k = c->d0; k < c->d1; k++)
    if (e->arena[k] != c->dev[k].dev)
      return DP_FAIL(DP_ERR_BACKEND,
                     "fake cuda: env.arena[%d] = %p is not device %d's arena %p", k,
                     (void *)e->arena[k], k, (void *)c->dev[k].dev);
  if (e->rows < 1 || e->rows > c->p->cfg.batch)
    return DP_FAIL(DP_ERR_BACKEND, "fake cuda: env.rows = %d", e->rows);
  const void *host[3] = {e->host_x, e->host_t, e->host_y};
  static const char *const host_names[3] = {"env.host_x", "env.host_t", "env.host_y"};
  for (int i = 0; i < 3; i++) {
    dp_status s = host[i] ? check_host(host[i], 1, host_names[i]) : DP_OK;
    if (s) return s;
  }
  dp_status s = take_mbs(x, c, e->mbs);
  if (s) return s;
  if (x->nq >= c->cap)
    return DP_FAIL(DP_ERR_BACKEND,
                   "fake cuda: device %d queued more than %d calls in a step", d, c->cap);
  x->q[x->nq++] = (fk_call){.kind = CALL_RUN,
                            .stage = x->stage,
                            .rows = e->rows,
                            .training = e->training,
                            .op = *op};
  atomic_fetch_add_explicit(&n_runs, 1, memory_order_relaxed);
  return DP_OK;
}

/* The executing device of a transport call: the thread's stage. */
static dp_status thread_dev(fk_ctx *c, const char *who, fk_dev **x) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "fake cuda %s: no context", who);
  if (!recording(c)) return not_recording(c, who);
  if (tl_ctx != c || tl_dev < c->d0 || tl_dev >= c->d1)
    return DP_FAIL(DP_ERR_BACKEND,
                   "cuda transport: %s on a thread that has no device: the "
                   "executor must call dp__cuda_stage_begin first",
                   who);
  *x = &c->dev[tl_dev];
  if (!(*x)->in_stage)
    return DP_FAIL(DP_ERR_BACKEND,
                   "cuda transport: device %d: %s outside a stage (after "
                   "stage_end of stage %d)",
                   tl_dev, who, (*x)->last_stage);
  return DP_OK;
}

static dp_status endpoints(const fk_ctx *c, void *dst, const void *src, size_t bytes,
                           int *sd, int *dd) {
  *sd = owner(c, src, bytes);
  *dd = owner(c, dst, bytes);
  if (*sd == -2 || *dd == -2)
    return DP_FAIL(
        DP_ERR_INVALID,
        "cuda transport: a copy of %zu bytes runs past the end of device %d's arena", bytes,
        *sd == -2 ? owner(c, src, 0) : owner(c, dst, 0));
  dp_status s = *sd < 0 ? check_host(src, bytes, "copy source") : DP_OK;
  if (!s && *dd < 0) s = check_host(dst, bytes, "copy destination");
  return s;
}

dp_status dp__cuda_run(void *bctx, dp_exec_env *e, const dp_op *op) {
  return fk_run(bctx, e, op, false);
}

dp_status dp__cuda_collective(void *tctx, dp_exec_env *e, int dev, const dp_op *op) {
  if (op && op->device != dev)
    return DP_FAIL(DP_ERR_BACKEND, "cuda transport: device %d's collective on device %d",
                   op->device, dev);
  return fk_run(tctx, e, op, true);
}

/* The op's (device, region, offset) ends as addresses, and a strict check
 * that the devices it names own them (DP_HOST: host memory). */
static dp_status op_ends(const fk_ctx *c, dp_exec_env *e, const dp_op *op, void **dst,
                         const void **src, int *sd, int *dd) {
  *dst = dp__endpoint(e, op->dst_dev, op->dst_region, op->dst_offset);
  *src = dp__endpoint(e, op->src_dev, op->src_region, op->src_offset);
  dp_status s = endpoints(c, *dst, *src, op->bytes, sd, dd);
  if (!s && (*sd != op->src_dev || *dd != op->dst_dev))
    s = DP_FAIL(DP_ERR_BACKEND,
                "fake cuda: a copy names devices %d -> %d, but its memory is %d's -> %d's",
                op->src_dev, op->dst_dev, *sd, *dd);
  return s;
}

/* cuda/backend.cu's rule across processes: the NCCL ranks (global devices)
 * that send and receive a copy's bytes (a host end is the executing
 * device's); true when one is another process's. */
static bool cross_process(const fk_ctx *c, const dp_op *op, int *from, int *to) {
  if (!c->world) return false;
  *from = op->src_dev >= 0 ? op->src_dev : op->device;
  *to = op->dst_dev >= 0 ? op->dst_dev : op->device;
  bool lf = *from >= c->d0 && *from < c->d1, lt = *to >= c->d0 && *to < c->d1;
  return *from != *to && (!lf || !lt);
}

/* This process's half of a pair across processes, queued on device dev: the
 * local end checked (arena of dev, or staging memory for the executing
 * device's host end), the remote one never resolved. */
static dp_status queue_half(fk_ctx *c, fk_dev *x, dp_exec_env *e, int dev, const dp_op *op,
                            int from, int to) {
  if (dev != from && dev != to)
    return DP_FAIL(DP_ERR_INVALID,
                   "cuda transport: device %d has no end in a copy from device %d to "
                   "device %d of another process",
                   dev, from, to);
  bool send = dev == from;
  int ldev = send ? op->src_dev : op->dst_dev;
  void *p = dp__endpoint(e, ldev, send ? op->src_region : op->dst_region,
                         send ? op->src_offset : op->dst_offset);
  int o = owner(c, p, op->bytes);
  dp_status s = o == -2 ? DP_FAIL(DP_ERR_INVALID,
                                  "cuda transport: a copy of %zu bytes runs "
                                  "past the end of device %d's arena",
                                  op->bytes, ldev)
                : o == -1
                    ? check_host(p, op->bytes, send ? "copy source" : "copy destination")
                    : DP_OK;
  if (s) return s;
  if (o != ldev)
    return DP_FAIL(DP_ERR_BACKEND,
                   "fake cuda: a copy's local end names device %d, but its memory is %d's",
                   ldev, o);
  if (op->bytes == 0) return DP_OK;
  if (x->nq >= c->cap)
    return DP_FAIL(DP_ERR_BACKEND,
                   "fake cuda: device %d queued more than %d calls in a step", dev, c->cap);
  x->q[x->nq++] = (fk_call){.kind = send ? CALL_SEND : CALL_RECV,
                            .stage = x->stage,
                            .dst = send ? NULL : p,
                            .src = send ? p : NULL,
                            .bytes = op->bytes,
                            .peer = send ? to : from,
                            .self = dev};
  atomic_fetch_add_explicit(&n_copies, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&n_cross, 1, memory_order_relaxed);
  return DP_OK;
}

dp_status dp__cuda_copy(void *tctx, dp_exec_env *e, int dev, const dp_op *op) {
  fk_ctx *c = tctx;
  fk_dev *x = NULL;
  dp_status s = thread_dev(c, "copy", &x);
  if (s) return s;
  if (dev != tl_dev || dev != op->device)
    return DP_FAIL(DP_ERR_BACKEND,
                   "cuda transport: copy executed by device %d (op of device %d) on device "
                   "%d's thread",
                   dev, op->device, tl_dev);
  int from, to;
  if (cross_process(c, op, &from, &to)) return queue_half(c, x, e, dev, op, from, to);
  int sd, dd;
  void *dst;
  const void *src;
  if ((s = op_ends(c, e, op, &dst, &src, &sd, &dd))) return s;
  size_t bytes = op->bytes;
  if (bytes == 0) return DP_OK;
  if (x->nq >= c->cap)
    return DP_FAIL(DP_ERR_BACKEND,
                   "fake cuda: device %d queued more than %d calls in a step", tl_dev,
                   c->cap);
  x->q[x->nq++] = (fk_call){
      .kind = CALL_COPY, .stage = x->stage, .dst = dst, .src = src, .bytes = bytes};
  atomic_fetch_add_explicit(&n_copies, 1, memory_order_relaxed);
  if (sd >= 0 && dd >= 0 && sd != dd)
    atomic_fetch_add_explicit(&n_cross, 1, memory_order_relaxed);
  return DP_OK;
}

/* The other endpoint's half of a two-sided copy: checked and counted only
 * (the copy itself moves the bytes). */
dp_status dp__cuda_peer(void *tctx, dp_exec_env *e, int dev, const dp_op *op) {
  fk_ctx *c = tctx;
  fk_dev *x = NULL;
  dp_status s = thread_dev(c, "peer", &x);
  if (s) return s;
  if (dev != tl_dev)
    return DP_FAIL(DP_ERR_BACKEND,
                   "cuda transport: peer() for device %d on device %d's thread", dev,
                   tl_dev);
  int from, to;
  if (cross_process(c, op, &from, &to)) {
    atomic_fetch_add_explicit(&n_peers, 1, memory_order_relaxed);
    return queue_half(c, x, e, dev, op, from, to);
  }
  int sd, dd;
  void *dst;
  const void *src;
  if ((s = op_ends(c, e, op, &dst, &src, &sd, &dd))) return s;
  if (!((sd == dev && dd >= 0 && dd != dev) || (dd == dev && sd >= 0 && sd != dev)))
    return DP_FAIL(DP_ERR_BACKEND,
                   "cuda transport: peer() on device %d for a copy between %d and %d (-1: "
                   "host): dev must be the copy's other device endpoint",
                   dev, sd, dd);
  atomic_fetch_add_explicit(&n_peers, 1, memory_order_relaxed);
  return DP_OK;
}

/* ---- stage, step and graph hooks -------------------------------------------------- */

static dp_status check_dev(const fk_ctx *c, int dev, const char *who) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "%s: no context", who);
  if (dev < c->d0 || dev >= c->d1)
    return DP_FAIL(DP_ERR_INVALID, "%s: device %d, but this process has devices %d..%d",
                   who, dev, c->d0, c->d1 - 1);
  return DP_OK;
}

dp_status dp__cuda_stage_begin(void *bctx, int dev, int stage) {
  fk_ctx *c = bctx;
  dp_status s = check_dev(c, dev, "dp__cuda_stage_begin");
  if (s) return s;
  if (!recording(c)) return not_recording(c, "dp__cuda_stage_begin");
  fk_dev *x = &c->dev[dev];
  if (x->in_stage)
    return DP_FAIL(DP_ERR_BACKEND,
                   "dp__cuda_stage_begin: device %d begins stage %d while stage %d is open",
                   dev, stage, x->stage);
  /* every stage, in order, from 0: the event bookkeeping relies on it */
  if (stage != x->last_stage + 1)
    return DP_FAIL(
        DP_ERR_BACKEND,
        "dp__cuda_stage_begin: device %d begins stage %d after stage %d; the hooks "
        "must run for every stage of a step, from 0, in order",
        dev, stage, x->last_stage);
  x->in_stage = true;
  x->stage = stage;
  tl_ctx = c;
  tl_dev = dev;
  return DP_OK;
}

dp_status dp__cuda_stage_end(void *bctx, int dev, int stage) {
  fk_ctx *c = bctx;
  dp_status s = check_dev(c, dev, "dp__cuda_stage_end");
  if (s) return s;
  if (!recording(c)) return not_recording(c, "dp__cuda_stage_end");
  fk_dev *x = &c->dev[dev];
  if (!x->in_stage || x->stage != stage)
    return DP_FAIL(DP_ERR_BACKEND,
                   "dp__cuda_stage_end: device %d ends stage %d but began %d", dev, stage,
                   x->in_stage ? x->stage : -1);
  if (tl_ctx != c || tl_dev != dev)
    return DP_FAIL(DP_ERR_BACKEND,
                   "dp__cuda_stage_end: device %d's stage ends on another device's thread",
                   dev);
  x->in_stage = false;
  x->last_stage = stage;
  return DP_OK;
}

/* Every device went through the same stages and none is still in one. */
static dp_status check_stages(const fk_ctx *c, const char *who) {
  for (int d = c->d0; d < c->d1; d++) {
    const fk_dev *x = &c->dev[d];
    if (x->in_stage)
      return DP_FAIL(DP_ERR_BACKEND, "%s: device %d is still in stage %d (no stage_end)",
                     who, d, x->stage);
    if (x->last_stage != c->dev[c->d0].last_stage)
      return DP_FAIL(DP_ERR_BACKEND,
                     "%s: device %d ended at stage %d, device %d at stage %d: every device "
                     "must run every stage's hooks",
                     who, d, x->last_stage, c->d0, c->dev[c->d0].last_stage);
  }
  return DP_OK;
}

dp_status dp__cuda_step_begin(void *bctx, uint64_t step) {
  fk_ctx *c = bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_step_begin: no context");
  if (c->state != ST_IDLE && c->state != ST_CAPTURE)
    return DP_FAIL(DP_ERR_BACKEND,
                   "dp__cuda_step_begin during %s: the previous step needs its step_end",
                   state_names[c->state]);
  if (c->state == ST_IDLE) atomic_fetch_add(&n_plain, 1);
  c->state = c->state == ST_IDLE ? ST_STEP : ST_CAPTURE_STEP;
  c->synced = false;
  c->step = step;
  clear_queues(c);
  tl_ctx = NULL;
  tl_dev = -1;
  return DP_OK;
}

static dp_status run_queued(fk_ctx *c, int state, float *loss, bool reset);

dp_status dp__cuda_step_end(void *bctx, float *loss) {
  fk_ctx *c = bctx;
  if (loss) *loss = 0.0f;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_step_end: no context");
  int state = c->state;
  if (state != ST_STEP && state != ST_LAUNCHED && state != ST_ABORTED)
    return DP_FAIL(DP_ERR_BACKEND,
                   "dp__cuda_step_end during %s: no step_begin or graph_launch before it",
                   state_names[state]);
  atomic_fetch_add(&n_ends, 1);
  dp_status s = state == ST_STEP ? check_stages(c, "dp__cuda_step_end") : DP_OK;
  c->state = ST_IDLE;
  if (!s) s = run_queued(c, state, loss, !c->synced);
  clear_queues(c);
  return s;
}

/* Across processes, mid-step: runs what is queued so far and reports it; the
 * step stays open (its stages go on; step_end runs the rest). */
dp_status dp__cuda_step_sync(void *bctx, float *loss) {
  fk_ctx *c = bctx;
  if (loss) *loss = 0.0f;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_step_sync: no context");
  if (c->state != ST_STEP)
    return DP_FAIL(DP_ERR_BACKEND, "dp__cuda_step_sync during %s: only in a plain step",
                   state_names[c->state]);
  if (c->synced) return DP_FAIL(DP_ERR_BACKEND, "dp__cuda_step_sync: twice in one step");
  dp_status s = check_stages(c, "dp__cuda_step_sync");
  if (!s) s = run_queued(c, ST_STEP, loss, true);
  for (int d = c->d0; d < c->d1; d++) c->dev[d].nq = 0; /* ran: the rest queues anew */
  c->synced = true;
  return s;
}

/* Runs the queued work (or the launched graph) and reports it as the device's
 * status words do. reset: the status words start afresh (not after a
 * step_sync in the same step). */
static dp_status run_queued(fk_ctx *c, int state, float *loss, bool reset) {
  /* the debug fault kernel runs first in its step: nothing of it, or after it */
  if (c->faulted ||
      (c->fault_step && c->step + 1 == c->fault_step && state != ST_ABORTED)) {
    c->faulted = true;
    return DP_FAIL(DP_ERR_BACKEND,
                   "device %d (GPU %d): cudaStreamQuery: "
                   "cudaErrorIllegalAddress: an illegal memory access was "
                   "encountered (emulated: DP_CUDA_DEBUG_FAULT_STEP)",
                   c->d0, c->dev[c->d0].phys);
  }
  if (c->broken)
    return DP_FAIL(DP_ERR_BACKEND,
                   "emulated NCCL: the communicators were aborted after a transfer timed "
                   "out; the context can no longer move data between processes");
  if (reset) exec_reset(c);
  if (state == ST_STEP) {
    fk_call *calls[DP_MAX_DEVICES];
    int counts[DP_MAX_DEVICES];
    dp_mb *mbs[DP_MAX_DEVICES];
    for (int d = c->d0; d < c->d1; d++) {
      calls[d] = c->dev[d].q;
      counts[d] = c->dev[d].nq;
      mbs[d] = c->dev[d].mbs;
    }
    exec_all(c, calls, counts, mbs, c->step);
  } else if (state == ST_LAUNCHED) {
    fk_slot *g = &c->slot[c->launched];
    exec_all(c, g->calls, g->n, g->mbs, c->step);
  } else { /* aborted capture: nothing ran */
    exec_all(c, NULL, (int[DP_MAX_DEVICES]){0}, NULL, c->step);
  }
  if (c->fault)
    return DP_FAIL(DP_ERR_BACKEND, "emulated GPU: an op failed on the device: %s",
                   c->fault_msg);
  if (loss) *loss = c->loss;
  /* cuda/backend.cu's order: the loss, labels, then gradients */
  if (c->st_loss)
    return DP_FAIL(DP_ERR_NONFINITE, "the loss is %s; the step was not applied",
                   isnan(c->loss) ? "NaN" : "infinite");
  if (c->st_label)
    return DP_FAIL(DP_ERR_RANGE,
                   "the label of row %d is outside 0..%d; the step was not applied",
                   c->bad_row, dp_model_output_width(&c->p->model) - 1);
  if (c->st_grad)
    return DP_FAIL(DP_ERR_NONFINITE, "gradient %zu is %s; the step was not applied",
                   c->bad_grad, c->st_grad_inf ? "infinite" : "NaN");
  if (c->st_update) { /* the text without the cpu backend's file:line */
    char *at = strrchr(c->update_msg, '[');
    if (at && at > c->update_msg) at[-1] = '\0';
    return DP_FAIL(DP_ERR_NONFINITE, "%s", c->update_msg);
  }
  return DP_OK;
}

dp_status dp__cuda_capture_begin(void *bctx) {
  fk_ctx *c = bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_capture_begin: no context");
  if (c->state != ST_IDLE)
    return DP_FAIL(DP_ERR_BACKEND, "dp__cuda_capture_begin during %s",
                   state_names[c->state]);
  c->state = ST_CAPTURE;
  clear_queues(c);
  return DP_OK;
}

dp_status dp__cuda_capture_end(void *bctx, int slot) {
  fk_ctx *c = bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_capture_end: no context");
  if (slot < 0 || slot >= DP_CUDA_GRAPH_SLOTS)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_capture_end: slot %d", slot);
  if (c->state == ST_CAPTURE) { /* the capture ends all the same, holding nothing */
    c->state = ST_IDLE;
    clear_queues(c);
    return DP_FAIL(DP_ERR_BACKEND, "dp__cuda_capture_end: nothing was captured (a capture "
                                   "holds dp__cuda_step_begin and the step's runs)");
  }
  if (c->state != ST_CAPTURE_STEP)
    return DP_FAIL(DP_ERR_BACKEND, "dp__cuda_capture_end during %s: no capture is open",
                   state_names[c->state]);
  dp_status s = check_stages(c, "dp__cuda_capture_end");
  c->state = ST_IDLE;
  if (!s && atomic_load(&n_fail_captures) > 0) {
    atomic_fetch_sub(&n_fail_captures, 1);
    clear_queues(c);
    return DP_FAIL(DP_ERR_BACKEND, "dp__cuda_capture_end: cudaGraphInstantiate: "
                                   "cudaErrorNotSupported (injected by the fake)");
  }
  fk_slot *g = &c->slot[slot];
  slot_clear(g);
  for (int d = c->d0; d < c->d1 && !s;
       d++) { /* instantiation allocates, as the driver's does */
    const fk_dev *x = &c->dev[d];
    g->n[d] = x->nq;
    g->calls[d] = malloc((size_t)(x->nq > 0 ? x->nq : 1) * sizeof *x->q);
    g->mbs[d] = malloc((size_t)(c->n_mb > 0 ? c->n_mb : 1) * sizeof *x->mbs);
    if (!g->calls[d] || !g->mbs[d]) {
      s = DP_FAIL(DP_ERR_NOMEM, "dp__cuda_capture_end: out of memory");
      break;
    }
    memcpy(g->calls[d], x->q, (size_t)x->nq * sizeof *x->q);
    memcpy(g->mbs[d], x->mbs, (size_t)c->n_mb * sizeof *x->mbs);
  }
  clear_queues(c);
  if (s) {
    slot_clear(g);
    return s;
  }
  g->ready = true;
  atomic_fetch_add(&n_captures, 1);
  return DP_OK;
}

void dp__cuda_capture_abort(void *bctx) {
  fk_ctx *c = bctx;
  if (!c || (c->state != ST_CAPTURE && c->state != ST_CAPTURE_STEP)) return;
  c->state = ST_ABORTED;
  clear_queues(c);
  atomic_fetch_add(&n_aborts, 1);
}

int dp__cuda_graph_ready(const void *bctx, int slot) {
  const fk_ctx *c = bctx;
  return c && slot >= 0 && slot < DP_CUDA_GRAPH_SLOTS && c->slot[slot].ready;
}

dp_status dp__cuda_graph_launch(void *bctx, int slot, uint64_t step) {
  fk_ctx *c = bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_graph_launch: no context");
  if (!dp__cuda_graph_ready(c, slot))
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_graph_launch: slot %d holds no graph", slot);
  if (c->state != ST_IDLE)
    return DP_FAIL(DP_ERR_BACKEND, "dp__cuda_graph_launch during %s",
                   state_names[c->state]);
  c->state = ST_LAUNCHED;
  c->launched = slot;
  c->step = step;
  atomic_fetch_add(&n_launches, 1);
  if (atomic_load(&n_fail_launches) > 0) {
    atomic_fetch_sub(&n_fail_launches, 1);
    return DP_FAIL(DP_ERR_BACKEND,
                   "dp__cuda_graph_launch: cudaStreamWaitEvent after "
                   "cudaGraphLaunch: cudaErrorUnknown (injected by the fake)");
  }
  return DP_OK;
}

/* ---- synchronous helpers ---------------------------------------------------------- */

/* The alias of [p, p + bytes) when p is device memory (G.mu held); p itself
 * for host memory. Refuses a range past an arena's end, and memory of a
 * context whose step is in flight: the real copy would race the queued work. */
static dp_status resolve_locked(const void *p, size_t bytes, void **out, const char *who) {
  *out = (void *)p;
  fk_arena *a = arena_at_locked(p);
  if (!a) return DP_OK;
  size_t off = (size_t)((const unsigned char *)p - a->dev);
  if (bytes > a->bytes - off)
    return DP_FAIL(
        DP_ERR_INVALID,
        "%s: %zu bytes at offset %zu of a %zu-byte arena on GPU %d run past its end", who,
        bytes, off, a->bytes, a->gpu);
  if (a->owner && a->owner->state != ST_IDLE)
    return DP_FAIL(
        DP_ERR_BACKEND,
        "%s: GPU %d memory of a context during %s (no dp__cuda_step_end yet): the "
        "copy would race the queued work",
        who, a->gpu, state_names[a->owner->state]);
  *out = a->rw + off;
  return DP_OK;
}

dp_status dp__cuda_memcpy(void *dst, const void *src, size_t bytes) {
  atomic_fetch_add(&n_memcpys, 1);
  if (bytes == 0) return DP_OK;
  if (!dst || !src) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_memcpy: NULL pointer");
  lock();
  void *d, *s;
  dp_status st = resolve_locked(dst, bytes, &d, "dp__cuda_memcpy destination");
  if (!st) st = resolve_locked(src, bytes, &s, "dp__cuda_memcpy source");
  if (!st) memcpy(d, s, bytes);
  unlock();
  return st;
}

/* The context's copy: one end must be device dev's arena of that context;
 * otherwise dp__cuda_memcpy's checks (in flight, bounds). */
dp_status dp__cuda_ctx_copy(void *bctx, int dev, void *dst, const void *src, size_t bytes) {
  fk_ctx *c = bctx;
  if (!c || dev < c->d0 || dev >= c->d1)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_copy: no context, or device %d", dev);
  if (bytes == 0) return DP_OK;
  const unsigned char *a = c->dev[dev].dev, *d = dst, *sp = src;
  size_t n = c->p->dev_bytes[dev];
  bool to_dev = d >= a && d < a + n, from_dev = sp >= a && sp < a + n;
  if (to_dev == from_dev)
    return DP_FAIL(DP_ERR_INVALID,
                   "dp__cuda_ctx_copy: exactly one end must be device %d's arena", dev);
  return dp__cuda_memcpy(dst, src, bytes);
}

dp_status dp__cuda_set_loss_norm(void *bctx, float denom, float inv) {
  fk_ctx *c = bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_set_loss_norm: no context");
  if (c->state != ST_IDLE) /* as the rate: a step's scalars are fixed once queued */
    return DP_FAIL(DP_ERR_BACKEND, "dp__cuda_set_loss_norm during %s",
                   state_names[c->state]);
  c->loss_denom = denom;
  c->loss_inv = inv;
  return DP_OK;
}

dp_status dp__cuda_set_lr(void *bctx, float lr) {
  fk_ctx *c = bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_set_lr: no context");
  if (c->state != ST_IDLE) /* a step's scalars are fixed once it is queued */
    return DP_FAIL(DP_ERR_BACKEND, "dp__cuda_set_lr during %s", state_names[c->state]);
  c->lr = lr;
  return DP_OK;
}

dp_status dp__cuda_set_momentum(void *bctx, float momentum) {
  fk_ctx *c = bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_set_momentum: no context");
  if (c->state != ST_IDLE)
    return DP_FAIL(DP_ERR_BACKEND, "dp__cuda_set_momentum during %s",
                   state_names[c->state]);
  c->momentum = momentum;
  return DP_OK;
}

dp_status dp__cuda_check_pinned(const void *p) {
  if (!p) return DP_FAIL(DP_ERR_INVALID, "host staging arena is NULL");
  lock();
  bool pinned = host_at_locked(p, 0) != NULL;
  unlock();
  if (!pinned)
    return DP_FAIL(DP_ERR_INVALID, "host staging arena %p is not pinned host memory", p);
  return DP_OK;
}

dp_status dp__cuda_fill_u32(int dev, void *dst, uint32_t value, size_t count) {
  if (count == 0) return DP_OK;
  if (!dst) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_fill_u32: NULL pointer");
  lock();
  dp_status s = DP_OK;
  fk_arena *a = arena_at_locked(dst);
  void *w = NULL;
  if (dev < 0 || dev >= G.gpus)
    s = no_such_gpu_locked(dev);
  else if (!a || a->gpu != dev)
    s = DP_FAIL(DP_ERR_INVALID, "dp__cuda_fill_u32: %p is not memory of GPU %d", dst, dev);
  else if (count > SIZE_MAX / 4)
    s = DP_FAIL(DP_ERR_INVALID, "dp__cuda_fill_u32: %zu words", count);
  else
    s = resolve_locked(dst, count * 4, &w, "dp__cuda_fill_u32");
  if (!s) {
    uint32_t *p = w;
    for (size_t k = 0; k < count; k++) p[k] = value;
  }
  unlock();
  return s;
}

/* ---- self-tests --------------------------------------------------------------------- */

dp_status dp__cuda_rng_table(uint64_t seed, uint64_t stream, const uint64_t *abc, int n,
                             uint64_t *u64, float *uniform) {
  if (n < 0 || (n > 0 && (!abc || !u64 || !uniform)))
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_rng_table: bad arguments");
  for (int i = 0; i < n; i++) {
    const uint64_t *k = abc + 3 * (size_t)i;
    u64[i] = dp__rng_u64(seed, stream, k[0], k[1], k[2]);
    uniform[i] = dp__rng_uniform(seed, stream, k[0], k[1], k[2]);
  }
  return DP_OK;
}

dp_status dp__cuda_bench_sgemm(int dev, int m, int n, int k, int iters, int tf32,
                               double *ms, double *tflops) {
  (void)m, (void)n, (void)k, (void)iters, (void)tf32;
  if (ms) *ms = 0.0;
  if (tflops) *tflops = 0.0;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda device %d: the emulated GPU has no timings",
                 dev);
}

/* The emulated GPU reports no gradient norm (its tests do not clip). */
float dp__cuda_grad_norm(const void *bctx) {
  (void)bctx;
  return NAN;
}
