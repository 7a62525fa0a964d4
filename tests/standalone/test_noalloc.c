/* After init, libdp allocates nothing: this program replaces the allocator
 * (malloc, calloc, realloc, free, posix_memalign, aligned_alloc, memalign,
 * valloc, pvalloc), forwarding to glibc's internal entry points, and counts
 * every call made while `counting` is set, from any thread (the virtual
 * devices' workers call too).
 *
 * Setup (parse, plan, context, one warm-up step and one forward) is not
 * counted. Then, counted: 100 training steps and 100 forward passes per
 * configuration, with the batch alternating between two sizes so the schedule
 * is rebuilt on the way, and a few refused calls. Every count must be 0.
 *
 * Each counted host allocator call is classified by its caller (the return
 * address): "ours" when it lies in this executable's loaded segments (libdp.a
 * is linked in statically, so every libdp call is there), "theirs" otherwise
 * (libc's internals, the CUDA runtime and driver, cuBLAS, NCCL and their
 * threads). Only "ours" fail; "theirs" are printed as information, with their
 * first callers, when not 0. The blind spot: a libc function that libdp calls
 * and that allocates inside (fopen, strdup, ...) counts as theirs.
 *
 * In a CUDA build it also replaces the CUDA runtime's allocators (cudaMalloc,
 * cudaMallocAsync, cudaMallocHost, cudaMallocManaged, cudaHostAlloc, cudaFree,
 * cudaFreeAsync, cudaFreeHost), counted apart, and with a GPU runs the same on cuda
 * contexts (2 replicas on GPU 0, plain and with cuda_graph). There the warm-up is two
 * full-batch steps (the second captures the graph), a short step and full
 * and short forwards (first launches load kernels); the context creation is
 * counted too, to show that libdp's CUDA allocations reach the counter.
 * Without a GPU the cuda cases print "SKIP noalloc cuda: no GPU (...)". The
 * first counted calls' callers are printed (library and symbol) when a count
 * is not 0. The CUDA allocators count whoever calls them (this program or a
 * CUDA library): any device allocation after the warm-up is a failure.
 *
 * Its own executable (it defines malloc). Prints the counts; exit 0 on
 * success, 1 on failure. Under AddressSanitizer the allocator cannot be
 * replaced, so the test says "skipped" and exits 0.
 */
#include "dp.h"
#include "specs.h" /* MLP_EVERY_KIND_SPEC */
#ifdef DP_HAVE_MPI
#include "dp_mpi.h"
#endif

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define DP_NOALLOC_SKIP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) ||                 \
    __has_feature(thread_sanitizer)
#define DP_NOALLOC_SKIP 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define DP_NOALLOC_SKIP 1
#endif

#ifndef DP_NOALLOC_SKIP

/* ---- the counting allocator -------------------------------------------------- */

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t n);

static atomic_int counting;
static atomic_long n_calls, n_theirs, n_cuda_calls;

/* Callers of the first counted calls, for the report (resolved with dladdr
 * after counting stops: dladdr is not called from inside the allocator). */
enum { N_WHERE = 8 };
static void *host_where[N_WHERE], *theirs_where[N_WHERE], *cuda_where[N_WHERE];

#define CALLER __builtin_return_address(0)

/* This executable's PT_LOAD segments, [lo, hi), found once by find_exe()
 * before anything is counted; the allocator only compares against them. */
enum { N_SEGS = 16 };
static uintptr_t exe_lo[N_SEGS], exe_hi[N_SEGS];
static int n_exe_segs;

static int exe_segments(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  (void)arg;
  if (info->dlpi_name && info->dlpi_name[0]) return 1; /* not the main program: stop */
  for (int i = 0; i < info->dlpi_phnum && n_exe_segs < N_SEGS; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    exe_lo[n_exe_segs] = (uintptr_t)info->dlpi_addr + ph->p_vaddr;
    exe_hi[n_exe_segs] = exe_lo[n_exe_segs] + ph->p_memsz;
    n_exe_segs++;
  }
  return 1; /* the first entry is the main program: done */
}

static int find_exe(void) {
  n_exe_segs = 0;
  dl_iterate_phdr(exe_segments, NULL);
  return n_exe_segs;
}

static inline int from_exe(void *caller) {
  uintptr_t a = (uintptr_t)caller;
  for (int i = 0; i < n_exe_segs; i++)
    if (a >= exe_lo[i] && a < exe_hi[i]) return 1;
  return 0;
}

static inline void note(void *caller) {
  if (atomic_load_explicit(&counting, memory_order_relaxed)) {
    int ours = from_exe(caller);
    long k =
        atomic_fetch_add_explicit(ours ? &n_calls : &n_theirs, 1, memory_order_relaxed);
    if (k < N_WHERE) (ours ? host_where : theirs_where)[k] = caller;
  }
}

void *malloc(size_t n) {
  note(CALLER);
  return __libc_malloc(n);
}

void *calloc(size_t n, size_t size) {
  note(CALLER);
  return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n) {
  note(CALLER);
  return __libc_realloc(p, n);
}

void free(void *p) {
  note(CALLER);
  __libc_free(p);
}

int posix_memalign(void **out, size_t align, size_t n) {
  note(CALLER);
  if (align < sizeof(void *) || (align & (align - 1)) != 0) return EINVAL;
  void *p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}

void *aligned_alloc(size_t align, size_t n) {
  note(CALLER);
  return __libc_memalign(align, n);
}

void *memalign(size_t align, size_t n) {
  note(CALLER);
  return __libc_memalign(align, n);
}

void *valloc(size_t n) {
  note(CALLER);
  return __libc_memalign(4096, n);
}

void *pvalloc(size_t n) {
  note(CALLER);
  return __libc_memalign(4096, (n + 4095) & ~(size_t)4095);
}

/* ---- the counting CUDA allocators (CUDA builds) ----------------------------------
 * The build links libcudart.so dynamically and libdp.a statically, so these
 * definitions are the ones libdp's calls bind to; each counts, then calls the
 * runtime's own (dlsym(RTLD_NEXT)). The test is compiled without the CUDA
 * headers: the prototypes below are cuda_runtime_api.h's (CUDA 13), with
 * cudaError_t, an int-sized enum, as int. */
#ifdef DP_HAVE_CUDA
typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags);
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaStreamSynchronize(cudaStream_t stream); /* not counted: the self-check's */

enum { CUDA_ERROR_UNKNOWN = 999 }; /* cudaErrorUnknown: the real function is missing */

static inline void note_cuda(void *caller) {
  if (atomic_load_explicit(&counting, memory_order_relaxed)) {
    long k = atomic_fetch_add_explicit(&n_cuda_calls, 1, memory_order_relaxed);
    if (k < N_WHERE) cuda_where[k] = caller;
  }
}

/* The runtime's functions, found once before anything is counted (main), or
 * on first use (dlsym may allocate; then the call is counted anyway). */
static struct {
  cudaError_t (*malloc_)(void **, size_t);
  cudaError_t (*malloc_async)(void **, size_t, cudaStream_t);
  cudaError_t (*malloc_host)(void **, size_t);
  cudaError_t (*malloc_managed)(void **, size_t, unsigned int);
  cudaError_t (*host_alloc)(void **, size_t, unsigned int);
  cudaError_t (*free_)(void *);
  cudaError_t (*free_async)(void *, cudaStream_t);
  cudaError_t (*free_host)(void *);
} real_cuda;

#define REAL(field, name)                                                                  \
  (real_cuda.field                                                                         \
       ? real_cuda.field                                                                   \
       : (real_cuda.field = (__typeof__(real_cuda.field))dlsym(RTLD_NEXT, name)))

/* 1 when every runtime allocator was found. */
static int resolve_cuda(void) {
  return REAL(malloc_, "cudaMalloc") && REAL(malloc_async, "cudaMallocAsync") &&
         REAL(malloc_host, "cudaMallocHost") && REAL(malloc_managed, "cudaMallocManaged") &&
         REAL(host_alloc, "cudaHostAlloc") && REAL(free_, "cudaFree") &&
         REAL(free_async, "cudaFreeAsync") && REAL(free_host, "cudaFreeHost");
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
  note_cuda(CALLER);
  return REAL(malloc_, "cudaMalloc") ? real_cuda.malloc_(devPtr, size) : CUDA_ERROR_UNKNOWN;
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
  note_cuda(CALLER);
  return REAL(malloc_async, "cudaMallocAsync")
             ? real_cuda.malloc_async(devPtr, size, hStream)
             : CUDA_ERROR_UNKNOWN;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
  note_cuda(CALLER);
  return REAL(malloc_host, "cudaMallocHost") ? real_cuda.malloc_host(ptr, size)
                                             : CUDA_ERROR_UNKNOWN;
}

cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
  note_cuda(CALLER);
  return REAL(malloc_managed, "cudaMallocManaged")
             ? real_cuda.malloc_managed(devPtr, size, flags)
             : CUDA_ERROR_UNKNOWN;
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  note_cuda(CALLER);
  return REAL(host_alloc, "cudaHostAlloc") ? real_cuda.host_alloc(pHost, size, flags)
                                           : CUDA_ERROR_UNKNOWN;
}

cudaError_t cudaFree(void *devPtr) {
  note_cuda(CALLER);
  return REAL(free_, "cudaFree") ? real_cuda.free_(devPtr) : CUDA_ERROR_UNKNOWN;
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
  note_cuda(CALLER);
  return REAL(free_async, "cudaFreeAsync") ? real_cuda.free_async(devPtr, hStream)
                                           : CUDA_ERROR_UNKNOWN;
}

cudaError_t cudaFreeHost(void *ptr) {
  note_cuda(CALLER);
  return REAL(free_host, "cudaFreeHost") ? real_cuda.free_host(ptr) : CUDA_ERROR_UNKNOWN;
}
#endif /* DP_HAVE_CUDA */

static void count_on(void) {
  atomic_store(&n_calls, 0);
  atomic_store(&n_theirs, 0);
  atomic_store(&n_cuda_calls, 0);
  memset(host_where, 0, sizeof host_where);
  memset(theirs_where, 0, sizeof theirs_where);
  memset(cuda_where, 0, sizeof cuda_where);
  atomic_store(&counting, 1);
}

/* Stops counting; returns this program's host allocator calls (libdp's). */
static long count_off(void) {
  atomic_store(&counting, 0);
  return atomic_load(&n_calls);
}

/* Host allocator calls from other libraries (not failures). */
static long theirs_count(void) { return atomic_load(&n_theirs); }

static long cuda_count(void) { return atomic_load(&n_cuda_calls); }

/* Where the first counted calls came from: "libcuda.so.1 (sym+0x12)"; a
 * static function of this program shows as "test_noalloc (?+0x...)", the
 * offset from the file's base (addr2line -e build/test_noalloc -f 0x...). */
static void print_callers(const char *phase, const char *kind, void *const *where, long n) {
  for (long k = 0; k < n && k < N_WHERE; k++) {
    Dl_info info;
    if (where[k] && dladdr(where[k], &info) && info.dli_fname) {
      const char *lib = strrchr(info.dli_fname, '/');
      printf("    %s: %s allocator call %ld from %s (%s+0x%lx)\n", phase, kind, k + 1,
             lib ? lib + 1 : info.dli_fname, info.dli_sname ? info.dli_sname : "?",
             (unsigned long)((char *)where[k] -
                             (char *)(info.dli_saddr ? info.dli_saddr : info.dli_fbase)));
    } else {
      printf("    %s: %s allocator call %ld from %p\n", phase, kind, k + 1, where[k]);
    }
  }
}

/* The callers of the calls just counted: libdp's host calls and the CUDA
 * allocator calls (failures), then other libraries' host calls (information). */
static void report_callers(const char *phase, long ours, long theirs, long cuda) {
  print_callers(phase, "host", host_where, ours);
  print_callers(phase, "cuda", cuda_where, cuda);
  print_callers(phase, "other library's host (not a failure)", theirs_where, theirs);
}

/* ---- the test ------------------------------------------------------------------ */

/* the image layers, the same 12 floats per row read as 1 x 3 x 4 */
static const char CNN_SPEC[] =
    "input 1 3 4\n"
    "conv2d 4 2 padding 1\nbatchnorm\nrelu\nmaxpool2d 2 stride 1\n"
    "dropout 0.2\nconv2d 3 2\navgpool2d 1\nflatten\n"
    "linear 5\n"
    "loss softmax_cross_entropy\n";
enum { IN = 12, OUT = 5, BATCH = 32, SMALL = 19, STEPS = 100 };
/* a GPT on the same 12 columns read as token ids: a label per position, OUT
 * classes each (fill: ids below GPT_VOCAB) */
enum { GPT_VOCAB = 7 };
static const char GPT12_SPEC[] =
    "input tokens 12\nembed 7 8\n"
    "residual\nlayernorm\nlinear 24\nattention 2\nlinear 8\nend\n"
    "dropout 0.1\nlayernorm\nlinear 5\nloss softmax_cross_entropy\n";
/* the same with dropout on the attention probabilities (a workspace scratch) */
static const char GPT12_ADROP_SPEC[] =
    "input tokens 12\nembed 7 8\n"
    "residual\nlayernorm\nlinear 24\nattention 2 dropout 0.2\nlinear 8\nend\n"
    "dropout 0.1\nlayernorm\nlinear 5\nloss softmax_cross_entropy\n";

static int failures;

#define EXPECT(cond, ...)                                                                  \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);                                          \
      printf(__VA_ARGS__);                                                                 \
      printf("\n");                                                                        \
      failures++;                                                                          \
    }                                                                                      \
  } while (0)

/* The counter must see calls made through every entry point, from this thread
 * and from another one. The calls go through volatile pointers so that the
 * compiler cannot drop a malloc/free pair. */
static void *(*volatile p_malloc)(size_t) = malloc;
static void *(*volatile p_calloc)(size_t, size_t) = calloc;
static void *(*volatile p_realloc)(void *, size_t) = realloc;
static void (*volatile p_free)(void *) = free;
static char *(*volatile p_strdup)(const char *) = strdup;
static int (*volatile p_posix_memalign)(void **, size_t, size_t) = posix_memalign;
static void *(*volatile p_aligned_alloc)(size_t, size_t) = aligned_alloc;

static atomic_int thread_go, thread_done, thread_exit;

static void *thread_allocates(void *arg) {
  (void)arg;
  while (!atomic_load(&thread_go)) sched_yield();
  p_free(p_malloc(40));
  atomic_store(&thread_done, 1);
  /* thread exit frees glibc's per-thread state: only after counting stops */
  while (!atomic_load(&thread_exit)) sched_yield();
  return NULL;
}

static void check_counter_works(void) {
  long theirs = 0;
  count_on();
  void *a = p_malloc(24);
  long n1 = count_off();
  theirs += theirs_count();
  p_free(a); /* not counting: must not register */
  long n2 = atomic_load(&n_calls);

  count_on();
  a = p_calloc(3, 8);
  a = p_realloc(a, 100);
  void *b = NULL;
  int rc = p_posix_memalign(&b, 64, 100);
  void *c = p_aligned_alloc(64, 128);
  p_free(a);
  p_free(b);
  p_free(c);
  long n3 = count_off();
  theirs += theirs_count();
  EXPECT(rc == 0 && ((uintptr_t)b & 63) == 0, "posix_memalign");
  EXPECT(c && ((uintptr_t)c & 63) == 0, "aligned_alloc");

  /* another thread's calls count too (the thread is made before counting) */
  pthread_t th;
  atomic_store(&thread_go, 0);
  atomic_store(&thread_done, 0);
  atomic_store(&thread_exit, 0);
  EXPECT(pthread_create(&th, NULL, thread_allocates, NULL) == 0, "pthread_create");
  count_on();
  atomic_store(&thread_go, 1);
  while (!atomic_load(&thread_done)) sched_yield();
  long n4 = count_off();
  theirs += theirs_count();
  atomic_store(&thread_exit, 1);
  pthread_join(th, NULL);

  /* a call made inside a shared library is theirs, not ours: libc's strdup
   * calls malloc from libc.so */
  count_on();
  char *dup = p_strdup("a string for libc to copy");
  long n5 = count_off(), t5 = theirs_count();
  void *t5_where = theirs_where[0];
  p_free(dup);

  EXPECT(n1 == 1, "one malloc while counting registered %ld calls", n1);
  EXPECT(n2 == 1, "a free while not counting was counted");
  EXPECT(n3 == 7,
         "calloc, realloc, posix_memalign, aligned_alloc, 3 free: counted %ld, want 7", n3);
  EXPECT(n4 == 2, "malloc and free on another thread: counted %ld, want 2", n4);
  EXPECT(theirs == 0, "calls from this program were counted as other libraries' (%ld)",
         theirs);
  EXPECT(
      n5 == 0 && t5 >= 1,
      "strdup (malloc called inside libc): counted %ld as ours and %ld as theirs, want 0 "
      "and at least 1",
      n5, t5);
  int ok = n_exe_segs > 0 && n1 == 1 && n2 == 1 && n3 == 7 && n4 == 2 && theirs == 0 &&
           n5 == 0 && t5 >= 1;
  Dl_info info;
  const char *lib = t5 >= 1 && dladdr(t5_where, &info) && info.dli_fname
                        ? strrchr(info.dli_fname, '/')
                        : NULL;
  printf("counter self-check: %s (1, 7 and 2 calls seen; strdup's %ld from %s not ours)\n",
         ok ? "ok" : "BROKEN", t5, lib ? lib + 1 : "?");
}

#ifdef DP_HAVE_CUDA
/* Every counting CUDA allocator counts, from this program, and reaches the
 * runtime (whose calls succeed when there is a GPU). */
static cudaError_t (*volatile p_cudaMalloc)(void **, size_t) = cudaMalloc;
static cudaError_t (*volatile p_cudaMallocAsync)(void **, size_t,
                                                 cudaStream_t) = cudaMallocAsync;
static cudaError_t (*volatile p_cudaMallocHost)(void **, size_t) = cudaMallocHost;
static cudaError_t (*volatile p_cudaMallocManaged)(void **, size_t,
                                                   unsigned int) = cudaMallocManaged;
static cudaError_t (*volatile p_cudaHostAlloc)(void **, size_t,
                                               unsigned int) = cudaHostAlloc;
static cudaError_t (*volatile p_cudaFree)(void *) = cudaFree;
static cudaError_t (*volatile p_cudaFreeAsync)(void *, cudaStream_t) = cudaFreeAsync;
static cudaError_t (*volatile p_cudaFreeHost)(void *) = cudaFreeHost;

/* Counts the CUDA allocator calls of one call (>= 1: the runtime may call its
 * own exported allocators inside). With a GPU the call must succeed. */
static int counted_cuda_call(const char *what, int gpus, int (*call)(void **), void **p) {
  count_on();
  int rc = call(p);
  count_off();
  long n = cuda_count();
  EXPECT(n >= 1, "%s was not counted", what);
  if (gpus > 0) EXPECT(rc == 0, "%s failed: cudaError_t %d", what, rc);
  return n >= 1;
}

static int call_malloc(void **p) { return p_cudaMalloc(p, 256); }
static int call_malloc_host(void **p) { return p_cudaMallocHost(p, 256); }
static int call_host_alloc(void **p) { return p_cudaHostAlloc(p, 256, 0); }
static int call_malloc_managed(void **p) { return p_cudaMallocManaged(p, 256, 1); }
static int call_malloc_async(void **p) { return p_cudaMallocAsync(p, 256, NULL); }
static int call_free(void **p) { return p_cudaFree(*p); }
static int call_free_async(void **p) {
  int rc = p_cudaFreeAsync(*p, NULL);
  return rc ? rc : cudaStreamSynchronize(NULL);
}
static int call_free_host(void **p) { return p_cudaFreeHost(*p); }

static void check_cuda_counter_works(int gpus) {
  EXPECT(resolve_cuda(), "the CUDA runtime's allocators were not found (dlsym RTLD_NEXT)");
  static const struct {
    const char *name, *free_name;
    int (*alloc)(void **), (*release)(void **);
  } calls[] = {{"cudaMalloc", "cudaFree", call_malloc, call_free},
               {"cudaMallocHost", "cudaFreeHost", call_malloc_host, call_free_host},
               {"cudaHostAlloc", "cudaFreeHost", call_host_alloc, call_free_host},
               {"cudaMallocManaged", "cudaFree", call_malloc_managed, call_free},
               {"cudaMallocAsync", "cudaFreeAsync", call_malloc_async, call_free_async}};
  int ok = 0, want = 0;
  for (size_t i = 0; i < sizeof calls / sizeof *calls; i++) {
    void *p = NULL;
    ok += counted_cuda_call(calls[i].name, gpus, calls[i].alloc, &p);
    want++;
    if (p || gpus > 0) { /* without a GPU the runtime refused: nothing to free */
      ok += counted_cuda_call(calls[i].free_name, gpus, calls[i].release, &p);
      want++;
    }
  }
  printf("cuda counter self-check: %s (%d of %d calls seen%s)\n",
         ok == want ? "ok" : "BROKEN", ok, want,
         gpus > 0 ? "" : "; no GPU, so the runtime refused the allocations");
}
#endif

typedef struct {
  const char *name;
  int n_devices;
  dp_split split;
  int micro_batch;
  dp_backend backend; /* cuda: every replica on GPU 0 */
  int cuda_graph;
  dp_mode mode;
  int shard;
  float clip;       /* clip_grad_norm */
  const char *spec; /* NULL: MLP_EVERY_KIND_SPEC */
  dp_bn_mode bn;    /* config.batchnorm */
  int recompute;    /* config.recompute */
} config_case;

/* seq: token ids below GPT_VOCAB and a label per position */
static void fill(float *x, int32_t *t, int rows, uint64_t seed, bool seq) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int k = 0; k < rows * IN; k++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x[k] = seq ? (float)((s >> 40) % GPT_VOCAB) : (float)(s >> 40) * 0x1p-23f - 1.0f;
  }
  for (int r = 0; r < rows * (seq ? IN : 1); r++)
    t[r] = (int32_t)((uint64_t)(r * 7 + (int)seed) % OUT);
}

/* config.reduce_precision of the cases run while it is set: bf16's packs and
 * send areas are planned too */
static dp_precision reduce_precision = DP_PRECISION_FP32;

static void run_case(const config_case *cc, dp_precision precision);

/* cc again, named `name`, with the gradient reduction in bf16 */
static void run_case_reduced_bf16(const config_case *cc, const char *name,
                                  dp_precision precision) {
  config_case r = *cc;
  r.name = name;
  reduce_precision = DP_PRECISION_BF16;
  run_case(&r, precision);
  reduce_precision = DP_PRECISION_FP32;
}

static void run_case(const config_case *cc, dp_precision precision) {
  static float x[BATCH * IN], y[BATCH * IN * OUT]; /* a GPT's: (BATCH, IN, OUT) */
  static int32_t t[BATCH * IN];
  bool seq = cc->spec == GPT12_SPEC || cc->spec == GPT12_ADROP_SPEC;
  dp_model *m = NULL;
  dp_plan *p = NULL;
  dp_ctx *c = NULL;
  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = BATCH;
  cfg.n_devices = cc->n_devices;
  cfg.split = cc->split;
  cfg.micro_batch = cc->micro_batch;
  dp_config_set_optimizer(&cfg, DP_OPT_ADAMW);
  cfg.seed = 3;
  cfg.mode = cc->mode;
  cfg.shard_optimizer = cc->shard;
  cfg.clip_grad_norm = cc->clip;
  cfg.batchnorm = cc->bn;
  cfg.recompute = cc->recompute;
  cfg.precision = precision;
  cfg.reduce_precision = reduce_precision;
  /* the clipping cases accumulate too: 2 calls per update (the schedules of
   * both kinds of call alternate) */
  cfg.accumulate = cc->clip > 0 ? 2 : 0;
  int cuda = cc->backend == DP_BACKEND_CUDA;
  if (cuda) {
    cfg.backend = DP_BACKEND_CUDA;
    cfg.cuda_graph = cc->cuda_graph;
    for (int d = 0; d < DP_MAX_DEVICES; d++) cfg.device_ids[d] = 0;
  }
  if (dp_model_parse(cc->spec ? cc->spec : MLP_EVERY_KIND_SPEC, "mlp", &m) ||
      dp_plan_create(m, &cfg, &p)) {
    EXPECT(0, "%s: setup failed: %s", cc->name, dp_last_error());
    goto done;
  }
  /* cuda: the creation's CUDA allocations (arenas, pinned staging) must reach
   * the counter, or a 0 below would prove nothing */
  if (cuda) count_on();
  dp_status cs = dp_ctx_create(p, &c);
  long setup_host = cuda ? count_off() : 0, setup_theirs = cuda ? theirs_count() : 0,
       setup_cuda = cuda ? cuda_count() : 0;
  if (cs) {
    EXPECT(0, "%s: setup failed: %s", cc->name, dp_last_error());
    goto done;
  }
  if (cuda) {
    printf("%-40s context creation: %ld host (and %ld from other libraries) and %ld cuda "
           "allocator calls\n",
           cc->name, setup_host, setup_theirs, setup_cuda);
    EXPECT(setup_cuda >= cc->n_devices + 1,
           "%s: context creation made %ld cuda allocator calls, want at least %d (the "
           "arenas and the staging): the interposition does not see libdp's calls",
           cc->name, setup_cuda, cc->n_devices + 1);
  }
  fill(x, t, BATCH, 1, seq);
  float loss = 0;
  /* warm-up, not counted: one step and one forward at the full batch; cuda:
   * a second full-batch step (the graph's capture), a short step and a short
   * forward (cuBLAS's kernels for those shapes load on first launch), and a
   * second full forward */
  EXPECT(dp_train_step(c, BATCH, IN, x, t, &loss) == DP_OK, "%s: warm-up step: %s",
         cc->name, dp_ctx_error(c));
  if (cuda) {
    EXPECT(dp_train_step(c, BATCH, IN, x, t, &loss) == DP_OK, "%s: warm-up step 2: %s",
           cc->name, dp_ctx_error(c));
    EXPECT(dp_train_step(c, SMALL, IN, x, t, &loss) == DP_OK, "%s: warm-up short step: %s",
           cc->name, dp_ctx_error(c));
    EXPECT(dp_forward(c, SMALL, IN, x, y) == DP_OK, "%s: warm-up short forward: %s",
           cc->name, dp_ctx_error(c));
    EXPECT(dp_forward(c, BATCH, IN, x, y) == DP_OK, "%s: warm-up forward: %s", cc->name,
           dp_ctx_error(c));
  }
  EXPECT(dp_forward(c, BATCH, IN, x, y) == DP_OK, "%s: warm-up forward: %s", cc->name,
         dp_ctx_error(c));
  uint64_t step0 = dp_ctx_step(c);

  int bad_steps = 0, bad_fwd = 0, nonfinite = 0;
  count_on();
  /* a learning-rate schedule too: dp_set_lr before every step */
  dp_lr_schedule sched = {.kind = DP_LR_WARMUP_COSINE,
                          .base_lr = cfg.lr,
                          .gamma = 1.0f,
                          .start_factor = 1.0f / 3.0f,
                          .warmup = 10,
                          .t_max = 200};
  for (int k = 0; k < STEPS; k++) {
    int rows = k % 2 ? SMALL : BATCH; /* rebuilds the schedule every step */
    if (dp_set_lr(c, dp_lr_at(&sched, dp_ctx_step(c))) != DP_OK) bad_steps++;
    if (dp_train_step(c, rows, IN, x, t, &loss) != DP_OK) bad_steps++;
    if (!isfinite(loss)) nonfinite++;
  }
  long n_train = count_off(), t_train = theirs_count(), c_train = cuda_count();
  report_callers("train", n_train, t_train, c_train);

  count_on();
  for (int k = 0; k < STEPS; k++) {
    int rows = k % 3 ? BATCH : SMALL;
    if (dp_forward(c, rows, IN, x, y) != DP_OK) bad_fwd++;
  }
  long n_forward = count_off(), t_forward = theirs_count(), c_forward = cuda_count();
  report_callers("forward", n_forward, t_forward, c_forward);

  /* refused calls record an error message: that must not allocate either */
  count_on();
  int refused = 0;
  refused += dp_train_step(c, BATCH, IN + 1, x, t, NULL) == DP_ERR_SHAPE;
  refused += dp_train_step(c, BATCH + 1, IN, x, t, NULL) == DP_ERR_SHAPE;
  t[5] = OUT;
  refused += dp_train_step(c, BATCH, IN, x, t, NULL) == DP_ERR_RANGE;
  t[5] = 0;
  float keep = x[3];
  x[3] = NAN; /* a GPT's: not a token id */
  refused +=
      dp_train_step(c, BATCH, IN, x, t, NULL) == (seq ? DP_ERR_RANGE : DP_ERR_NONFINITE);
  x[3] = keep;
  refused += dp_forward(c, BATCH, IN, x, NULL) == DP_ERR_INVALID;
  long n_errors = count_off(), t_errors = theirs_count(), c_errors = cuda_count();
  report_callers("refused calls", n_errors, t_errors, c_errors);

  printf("%-40s train %3d steps: %ld allocator calls; forward %3d: %ld; "
         "refused calls: %ld\n",
         cc->name, STEPS, n_train, STEPS, n_forward, n_errors);
  /* other libraries' host calls: information only (the CUDA runtime, driver
   * and their threads allocate as they please) */
  if (cuda)
    printf("%-40s cuda allocator calls: train %ld, forward %ld, refused calls %ld; host "
           "allocator calls from other libraries (not failures): %ld, %ld, %ld\n",
           cc->name, c_train, c_forward, c_errors, t_train, t_forward, t_errors);
  else if (t_train || t_forward || t_errors)
    printf("%-40s host allocator calls from other libraries (not failures): train %ld, "
           "forward %ld, refused calls %ld\n",
           cc->name, t_train, t_forward, t_errors);
  EXPECT(bad_steps == 0 && nonfinite == 0, "%s: %d steps failed, %d losses non-finite: %s",
         cc->name, bad_steps, nonfinite, dp_ctx_error(c));
  EXPECT(bad_fwd == 0, "%s: %d forwards failed: %s", cc->name, bad_fwd, dp_ctx_error(c));
  uint64_t updates = (uint64_t)STEPS / (uint64_t)(cfg.accumulate > 1 ? cfg.accumulate : 1);
  EXPECT(dp_ctx_step(c) == step0 + updates, "%s: step counter %llu, want %llu", cc->name,
         (unsigned long long)dp_ctx_step(c), (unsigned long long)(step0 + updates));
  EXPECT(refused == 5, "%s: only %d of 5 bad calls were refused as expected", cc->name,
         refused);
  EXPECT(n_train == 0, "%s: %ld allocator calls during training steps", cc->name, n_train);
  EXPECT(n_forward == 0, "%s: %ld allocator calls during forward passes", cc->name,
         n_forward);
  EXPECT(n_errors == 0, "%s: %ld allocator calls during refused calls", cc->name, n_errors);
  EXPECT(c_train == 0, "%s: %ld cuda allocator calls during training steps", cc->name,
         c_train);
  EXPECT(c_forward == 0, "%s: %ld cuda allocator calls during forward passes", cc->name,
         c_forward);
  EXPECT(c_errors == 0, "%s: %ld cuda allocator calls during refused calls", cc->name,
         c_errors);
done:
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
}

#ifdef DP_HAVE_MPI
/* Under mpirun (test_noalloc --mpi): a job of 2 devices per rank, every rank
 * counting. libdp's calls must be 0 on every rank; what MPI (and libc inside
 * it) allocates is reported per step. Phase 1: steady full batches (steps and
 * forwards); phase 2: alternating batch sizes, which rebuilds the schedule and
 * its persistent MPI requests (MPI_Send_init allocates inside MPI). */
static void run_mpi_case(const char *name, dp_mode mode, int shard) {
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  dp_model *m = NULL;
  dp_plan *p = NULL;
  dp_ctx *c = NULL;
  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = BATCH;
  cfg.n_devices = 2 * size;
  cfg.ranks = size;
  cfg.micro_batch = 4;
  cfg.mode = mode;
  cfg.shard_optimizer = shard;
  cfg.reduce_precision = reduce_precision;
  dp_config_set_optimizer(&cfg, DP_OPT_ADAMW);
  float x[BATCH * IN], y[BATCH * OUT];
  int32_t t[BATCH];
  for (int r = 0; r < BATCH; r++) {
    t[r] = r % OUT;
    for (int j = 0; j < IN; j++) x[r * IN + j] = sinf(0.1f * (float)(r * IN + j));
  }
  if (dp_model_parse(MLP_EVERY_KIND_SPEC, "mlp", &m) || dp_plan_create(m, &cfg, &p) ||
      dp_ctx_create_mpi(p, MPI_COMM_WORLD, &c)) {
    EXPECT(0, "rank %d: %s: setup: %s", rank, name, dp_last_error());
    goto done;
  }
  int r0[2], n[2], sizes[2] = {BATCH, SMALL}, bad = 0;
  for (int i = 0; i < 2; i++) dp_plan_rank_rows(p, sizes[i], rank, &r0[i], &n[i]);
  /* warm-up: both shapes of step and forward, the full one last */
  for (int i = 1; i >= 0; i--) {
    bad += dp_train_step(c, sizes[i], IN, x + r0[i] * IN, t + r0[i], NULL) != DP_OK;
    bad += dp_forward(c, sizes[i], IN, x + r0[i] * IN, y) != DP_OK;
  }
  count_on();
  for (int k = 0; k < STEPS; k++) {
    bad += dp_train_step(c, BATCH, IN, x + r0[0] * IN, t + r0[0], NULL) != DP_OK;
    bad += dp_forward(c, BATCH, IN, x + r0[0] * IN, y) != DP_OK;
  }
  long ours1 = count_off(), theirs1 = theirs_count();
  report_callers("mpi steady", ours1, theirs1, 0);
  count_on();
  for (int k = 0; k < STEPS; k++) {
    int i = k % 2;
    bad += dp_train_step(c, sizes[i], IN, x + r0[i] * IN, t + r0[i], NULL) != DP_OK;
  }
  long ours2 = count_off(), theirs2 = theirs_count();
  report_callers("mpi alternating", ours2, theirs2, 0);
  printf("rank %d of %d, %-22s %d steps + %d forwards: libdp %ld allocator calls, MPI "
         "and libc inside it %ld (%.1f per step); %d steps of alternating sizes "
         "(requests rebuilt): libdp %ld, MPI %ld\n",
         rank, size, name, STEPS, STEPS, ours1, theirs1, (double)theirs1 / STEPS, STEPS,
         ours2, theirs2);
  EXPECT(bad == 0, "rank %d: %s: %d calls failed: %s", rank, name, bad, dp_ctx_error(c));
  EXPECT(ours1 == 0 && ours2 == 0, "rank %d: %s: libdp made %ld + %ld allocator calls",
         rank, name, ours1, ours2);
done:
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
}

static int run_mpi(int *argc, char ***argv) {
  int level;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &level);
  run_mpi_case("classic", DP_MODE_CLASSIC, 0);
  run_mpi_case("allreduce", DP_MODE_ALLREDUCE, 0);
  run_mpi_case("allreduce, sharded", DP_MODE_ALLREDUCE, 1);
  reduce_precision = DP_PRECISION_BF16; /* packed to bf16 between the ranks */
  run_mpi_case("classic, bf16 reduction", DP_MODE_CLASSIC, 0);
  run_mpi_case("allreduce, bf16 reduction", DP_MODE_ALLREDUCE, 0);
  reduce_precision = DP_PRECISION_FP32;
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  printf("%s\n", total ? "test_noalloc --mpi: FAILED" : "test_noalloc --mpi: ok");
  return total ? 1 : 0;
}
#endif

int main(int argc, char **argv) {
  /* before anything is counted: this program's segments, the "ours" ranges */
  EXPECT(find_exe() > 0, "dl_iterate_phdr found no segment of this program");
#ifdef DP_HAVE_CUDA
  resolve_cuda(); /* before anything is counted: dlsym may allocate */
  EXPECT(dp_cuda_register() == DP_OK, "dp_cuda_register: %s", dp_last_error());
#endif
  check_counter_works();
  if (argc > 1 && !strcmp(argv[1], "--mpi")) {
#ifdef DP_HAVE_MPI
    return failures ? 1 : run_mpi(&argc, &argv);
#else
    printf("test_noalloc --mpi: this build has no MPI\n");
    return 1;
#endif
  }
  static const config_case cases[] = {
      {"mlp, 2 devices", 2, DP_SPLIT_CHUNK, 0, DP_BACKEND_CPU, 0, DP_MODE_CLASSIC, 0, 0,
       NULL, DP_BN_PER_REPLICA, 0},
      {"mlp, 4 devices", 4, DP_SPLIT_CHUNK, 0, DP_BACKEND_CPU, 0, DP_MODE_CLASSIC, 0, 0,
       NULL, DP_BN_PER_REPLICA, 0},
      {"mlp, 3 devices, balanced, micro_batch 4", 3, DP_SPLIT_BALANCED, 4, DP_BACKEND_CPU,
       0, DP_MODE_CLASSIC, 0, 0, NULL, DP_BN_PER_REPLICA, 0},
      {"mlp, 4 devices, sharded, clip_grad_norm, accumulate 2", 4, DP_SPLIT_CHUNK, 0,
       DP_BACKEND_CPU, 0, DP_MODE_ALLREDUCE, 1, 0.01f, NULL, DP_BN_PER_REPLICA, 0},
      {"mlp, 2 devices, classic, clip_grad_norm, accumulate 2", 2, DP_SPLIT_CHUNK, 0,
       DP_BACKEND_CPU, 0, DP_MODE_CLASSIC, 0, 0.01f, NULL, DP_BN_PER_REPLICA, 0},
      {"cnn, 2 devices, micro_batch 4", 2, DP_SPLIT_CHUNK, 4, DP_BACKEND_CPU, 0,
       DP_MODE_CLASSIC, 0, 0, CNN_SPEC, DP_BN_PER_REPLICA, 0},
      {"cnn, 3 devices, allreduce, sharded", 3, DP_SPLIT_BALANCED, 0, DP_BACKEND_CPU, 0,
       DP_MODE_ALLREDUCE, 1, 0, CNN_SPEC, DP_BN_PER_REPLICA, 0},
      {"cnn, 4 devices, sync batchnorm, micro_batch 2", 4, DP_SPLIT_CHUNK, 2,
       DP_BACKEND_CPU, 0, DP_MODE_CLASSIC, 0, 0, CNN_SPEC, DP_BN_SYNC, 0},
      {"cnn, 2 devices, sync batchnorm, clip_grad_norm, accumulate 2", 2, DP_SPLIT_CHUNK, 4,
       DP_BACKEND_CPU, 0, DP_MODE_CLASSIC, 0, 0.01f, CNN_SPEC, DP_BN_SYNC, 0},
      {"cnn, 3 devices, allreduce, sync batchnorm", 3, DP_SPLIT_BALANCED, 0, DP_BACKEND_CPU,
       0, DP_MODE_ALLREDUCE, 0, 0, CNN_SPEC, DP_BN_SYNC, 0},
      {"mlp, 2 devices, micro_batch 4, recompute 3", 2, DP_SPLIT_CHUNK, 4, DP_BACKEND_CPU,
       0, DP_MODE_CLASSIC, 0, 0, NULL, DP_BN_PER_REPLICA, 3},
      {"cnn, 2 devices, allreduce, sync batchnorm, micro_batch 2, recompute 2", 2,
       DP_SPLIT_CHUNK, 2, DP_BACKEND_CPU, 0, DP_MODE_ALLREDUCE, 0, 0, CNN_SPEC, DP_BN_SYNC,
       2},
      {"gpt, 3 devices, micro_batch 4", 3, DP_SPLIT_CHUNK, 4, DP_BACKEND_CPU, 0,
       DP_MODE_CLASSIC, 0, 0, GPT12_SPEC, DP_BN_PER_REPLICA, 0},
      {"gpt, 2 devices, micro_batch 2, recompute 3", 2, DP_SPLIT_CHUNK, 2, DP_BACKEND_CPU,
       0, DP_MODE_CLASSIC, 0, 0, GPT12_SPEC, DP_BN_PER_REPLICA, 3},
      {"gpt attention dropout, 2 devices, allreduce", 2, DP_SPLIT_CHUNK, 0, DP_BACKEND_CPU,
       0, DP_MODE_ALLREDUCE, 0, 0, GPT12_ADROP_SPEC, DP_BN_PER_REPLICA, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    run_case(&cases[i], DP_PRECISION_FP32);
  /* bf16 mixed precision: its shadow copies and packed bf16 weights are planned */
  static const config_case bf16_cases[] = {
      {"mlp, 3 devices, micro_batch 4, bf16", 3, DP_SPLIT_CHUNK, 4, DP_BACKEND_CPU, 0,
       DP_MODE_ALLREDUCE, 0, 0, NULL, DP_BN_PER_REPLICA, 0},
      {"gpt, 2 devices, micro_batch 2, recompute 2, bf16", 2, DP_SPLIT_CHUNK, 2,
       DP_BACKEND_CPU, 0, DP_MODE_CLASSIC, 0, 0, GPT12_SPEC, DP_BN_PER_REPLICA, 2},
      /* batchnorm: widened copies of whole micro-batches, the sync sums' too */
      {"cnn, 3 devices, batchnorm, micro_batch 4, bf16", 3, DP_SPLIT_CHUNK, 4,
       DP_BACKEND_CPU, 0, DP_MODE_CLASSIC, 0, 0, CNN_SPEC, DP_BN_PER_REPLICA, 0},
      {"cnn, 2 devices, allreduce, sync batchnorm, micro_batch 2, recompute 2, bf16", 2,
       DP_SPLIT_CHUNK, 2, DP_BACKEND_CPU, 0, DP_MODE_ALLREDUCE, 0, 0, CNN_SPEC, DP_BN_SYNC,
       2},
      {"cnn, 2 devices, sync batchnorm, clip_grad_norm, accumulate 2, bf16", 2,
       DP_SPLIT_CHUNK, 4, DP_BACKEND_CPU, 0, DP_MODE_CLASSIC, 0, 0.01f, CNN_SPEC,
       DP_BN_SYNC, 0},
  };
  for (size_t i = 0; i < sizeof bf16_cases / sizeof *bf16_cases; i++)
    run_case(&bf16_cases[i], DP_PRECISION_BF16);
  /* the gradient reduction in bf16: rounding in-place adds, accumulation */
  run_case_reduced_bf16(&cases[3], "mlp, 4 devices, sharded, accumulate 2, bf16 reduction",
                        DP_PRECISION_FP32);
  run_case_reduced_bf16(&bf16_cases[1], "gpt, 2 devices, recompute 2, bf16, bf16 reduction",
                        DP_PRECISION_BF16);

  /* the cuda backend, when there is a GPU */
  int gpus = dp_cuda_device_count();
#ifdef DP_HAVE_CUDA
  check_cuda_counter_works(gpus);
#endif
  static const config_case gpu_cases[] = {
      {"cuda, 2 replicas on GPU 0", 2, DP_SPLIT_CHUNK, 0, DP_BACKEND_CUDA, 0,
       DP_MODE_CLASSIC, 0, 0, NULL, DP_BN_PER_REPLICA, 0},
      {"cuda graph, 2 replicas on GPU 0", 2, DP_SPLIT_CHUNK, 0, DP_BACKEND_CUDA, 1,
       DP_MODE_CLASSIC, 0, 0, NULL, DP_BN_PER_REPLICA, 0},
      {"cuda, 2 replicas on GPU 0, micro_batch 4, recompute 3", 2, DP_SPLIT_CHUNK, 4,
       DP_BACKEND_CUDA, 0, DP_MODE_CLASSIC, 0, 0, NULL, DP_BN_PER_REPLICA, 3},
      {"cuda gpt, 2 replicas, allreduce", 2, DP_SPLIT_CHUNK, 0, DP_BACKEND_CUDA, 0,
       DP_MODE_ALLREDUCE, 0, 0, GPT12_SPEC, DP_BN_PER_REPLICA, 0},
      {"cuda graph gpt, 2 replicas", 2, DP_SPLIT_CHUNK, 0, DP_BACKEND_CUDA, 1,
       DP_MODE_CLASSIC, 0, 0, GPT12_SPEC, DP_BN_PER_REPLICA, 0},
      {"cuda gpt attention dropout, 2 replicas, allreduce", 2, DP_SPLIT_CHUNK, 0,
       DP_BACKEND_CUDA, 0, DP_MODE_ALLREDUCE, 0, 0, GPT12_ADROP_SPEC, DP_BN_PER_REPLICA, 0},
      {"cuda graph gpt attention dropout, 2 replicas", 2, DP_SPLIT_CHUNK, 0,
       DP_BACKEND_CUDA, 1, DP_MODE_CLASSIC, 0, 0, GPT12_ADROP_SPEC, DP_BN_PER_REPLICA, 0},
  };
  /* bf16 (cuda/mixed.cu): the shadow area and its copies, planned */
  static const config_case gpu_bf16_cases[] = {
      {"cuda gpt, 2 replicas, allreduce, bf16", 2, DP_SPLIT_CHUNK, 0, DP_BACKEND_CUDA, 0,
       DP_MODE_ALLREDUCE, 0, 0, GPT12_SPEC, DP_BN_PER_REPLICA, 0},
      {"cuda graph, 2 replicas on GPU 0, bf16", 2, DP_SPLIT_CHUNK, 0, DP_BACKEND_CUDA, 1,
       DP_MODE_CLASSIC, 0, 0, NULL, DP_BN_PER_REPLICA, 0},
      {"cuda cnn, 2 replicas, allreduce, batchnorm, bf16", 2, DP_SPLIT_CHUNK, 4,
       DP_BACKEND_CUDA, 0, DP_MODE_ALLREDUCE, 0, 0, CNN_SPEC, DP_BN_PER_REPLICA, 0},
      {"cuda graph cnn, 2 replicas, sync batchnorm, bf16", 2, DP_SPLIT_CHUNK, 4,
       DP_BACKEND_CUDA, 1, DP_MODE_CLASSIC, 0, 0, CNN_SPEC, DP_BN_SYNC, 0},
  };
  if (gpus > 0) {
    for (size_t i = 0; i < sizeof gpu_cases / sizeof *gpu_cases; i++)
      run_case(&gpu_cases[i], DP_PRECISION_FP32);
    for (size_t i = 0; i < sizeof gpu_bf16_cases / sizeof *gpu_bf16_cases; i++)
      run_case(&gpu_bf16_cases[i], DP_PRECISION_BF16);
    /* the gradient reduction in bf16: packs, copies of half the bytes, unpacks */
    run_case_reduced_bf16(&gpu_cases[3], "cuda gpt, 2 replicas, allreduce, bf16 reduction",
                          DP_PRECISION_FP32);
    run_case_reduced_bf16(&gpu_cases[1], "cuda graph, 2 replicas, bf16 reduction",
                          DP_PRECISION_FP32);
    run_case_reduced_bf16(&gpu_bf16_cases[0], "cuda gpt, allreduce, bf16, bf16 reduction",
                          DP_PRECISION_BF16);
  } else
    printf("SKIP noalloc cuda: no GPU (%s)\n", dp_last_error());

  /* the counter still works after all that (workers included) */
  check_counter_works();
  printf("%s\n", failures ? "test_noalloc: FAILED" : "test_noalloc: ok");
  return failures ? 1 : 0;
}

#else /* DP_NOALLOC_SKIP */

int main(void) {
  printf("test_noalloc: skipped (a sanitizer owns the allocator in this build)\n");
  return 0;
}

#endif
