/* Out-of-memory paths, failed one by one (SQLite's habit): this program
 * replaces the allocator (malloc, calloc, realloc, posix_memalign,
 * aligned_alloc, memalign, valloc, pvalloc; free too, to track what is live),
 * forwarding to glibc's internal entry points as test_noalloc does, and makes
 * the N-th allocation libdp makes fail (NULL, errno ENOMEM). For N = 1, 2,
 * 3, ... it runs a fixed scenario through the public API until a run
 * completes with no failure injected:
 *
 *   parse a model spec, plan it (cpu, 2 devices, AdamW), create the context,
 *   2 training steps, a forward, a checkpoint saved (with application data),
 *   read back (dp_ckpt_info, dp_ckpt_read_app) and loaded, a safetensors
 *   export and import, then everything freed
 *
 * for each of: an MLP (layernorm, gelu, dropout) and a CNN (conv2d,
 * batchnorm, maxpool2d, flatten), each in classic and allreduce mode.
 *
 * For every N it checks: each call returns DP_OK or a failure status with a
 * non-empty dp_last_error(); a call fails only when a failure was injected
 * during it; after a failure the scenario stops, frees what it made, and no
 * allocation of libdp's is left live (every pointer libdp allocated during
 * the run has been freed) and no temporary file is left behind; a failed
 * dp_train_step leaves the parameters (dp_get_params, bit for bit), their
 * hash and the step counter as they were. A crash prints the N and the call.
 *
 * Which calls are libdp's: the caller (the return address) lies in this
 * executable's loaded segments (libdp.a is linked in statically), and the
 * call is made inside a public API call of the scenario (the test's own code
 * allocates nothing there). The blind spot, as in test_noalloc: a libc
 * function that libdp calls and that allocates inside (fopen, ...) is libc's.
 *
 * Its own executable (it defines malloc). Exit 0 on success, 1 on a
 * violation. In a sanitizer build the sanitizer owns malloc: configure.py
 * links this program with -Wl,--wrap for each allocator and strdup
 * (DP_OOM_WRAP), so libdp's calls still come here (and the sanitizer checks
 * every error path for leaks and bad accesses); compiled under a sanitizer
 * without that, it prints "SKIP test_oom: ..." and exits 0.
 */
#include "dp.h"

#include <dirent.h>
#include <errno.h>
#include <link.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Under a sanitizer, the sanitizer owns malloc: the build links this program
 * with -Wl,--wrap=malloc,... (configure.py, DP_OOM_WRAP) so that libdp's calls
 * (and this program's) reach __wrap_malloc, which calls the sanitizer's
 * (__real_malloc). libc's own calls are not seen then: no second pass. */
#ifndef DP_OOM_WRAP
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DP_OOM_SKIP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) ||                 \
    __has_feature(thread_sanitizer)
#define DP_OOM_SKIP 1
#endif
#endif
#endif

#ifndef DP_OOM_SKIP

/* ---- the failing allocator --------------------------------------------------- */

#ifdef DP_OOM_WRAP
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
void *__real_memalign(size_t align, size_t n);
char *__real_strdup(const char *s);
#define FN(name) __wrap_##name
#define REAL_MALLOC __real_malloc
#define REAL_CALLOC __real_calloc
#define REAL_REALLOC __real_realloc
#define REAL_FREE __real_free
#define REAL_MEMALIGN __real_memalign
#else
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t n);
#define FN(name) name
#define REAL_MALLOC __libc_malloc
#define REAL_CALLOC __libc_calloc
#define REAL_REALLOC __libc_realloc
#define REAL_FREE __libc_free
#define REAL_MEMALIGN __libc_memalign
#endif

#define CALLER __builtin_return_address(0)

/* armed: inside a public API call of the scenario; libdp's allocations are
 * counted and the fail_at-th fails. tracking: during a scenario run; libdp's
 * successful allocations are recorded in the live table until freed. */
static atomic_int armed, tracking, fail_theirs;
static atomic_long n_allocs, n_injected, fail_at;

enum { N_SEGS = 16 };
static uintptr_t exe_lo[N_SEGS], exe_hi[N_SEGS], exe_base;
static int n_exe_segs;

static int exe_segments(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  (void)arg;
  if (info->dlpi_name && info->dlpi_name[0]) return 1;
  exe_base = (uintptr_t)info->dlpi_addr;
  for (int i = 0; i < info->dlpi_phnum && n_exe_segs < N_SEGS; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    exe_lo[n_exe_segs] = (uintptr_t)info->dlpi_addr + ph->p_vaddr;
    exe_hi[n_exe_segs] = exe_lo[n_exe_segs] + ph->p_memsz;
    n_exe_segs++;
  }
  return 1;
}

static inline int from_exe(void *caller) {
  uintptr_t a = (uintptr_t)caller;
  for (int i = 0; i < n_exe_segs; i++)
    if (a >= exe_lo[i] && a < exe_hi[i]) return 1;
  return 0;
}

/* The live table: open addressing over pointers, under a spin lock (the
 * allocator may be called from the devices' workers). */
enum { LIVE_CAP = 1 << 16 };
static uintptr_t live[LIVE_CAP];
static long n_live, live_overflow;
static atomic_flag live_lock = ATOMIC_FLAG_INIT;
#define TOMB ((uintptr_t)1)

static void lock(void) {
  while (atomic_flag_test_and_set_explicit(&live_lock, memory_order_acquire)) {
  }
}
static void unlock(void) { atomic_flag_clear_explicit(&live_lock, memory_order_release); }

static size_t slot_of(uintptr_t p) {
  return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ull >> 48) & (LIVE_CAP - 1);
}

static void live_add(void *ptr) {
  if (!ptr) return;
  lock();
  if (n_live >= LIVE_CAP / 2) {
    live_overflow++;
  } else {
    size_t i = slot_of((uintptr_t)ptr);
    while (live[i] > TOMB) i = (i + 1) & (LIVE_CAP - 1);
    live[i] = (uintptr_t)ptr;
    n_live++;
  }
  unlock();
}

static void live_remove(void *ptr) {
  if (!ptr) return;
  lock();
  if (n_live > 0) {
    size_t i = slot_of((uintptr_t)ptr);
    while (live[i] != 0) {
      if (live[i] == (uintptr_t)ptr) {
        live[i] = TOMB;
        n_live--;
        break;
      }
      i = (i + 1) & (LIVE_CAP - 1);
    }
  }
  unlock();
}

static void live_reset(void) {
  lock();
  memset(live, 0, sizeof live);
  n_live = 0;
  live_overflow = 0;
  unlock();
}

/* The distinct callers of the allocations failed (libdp's call sites). */
enum { N_SITES = 256 };
static void *sites[N_SITES];
static int n_sites;
static atomic_flag sites_lock = ATOMIC_FLAG_INIT;

static void note_site(void *caller) {
  while (atomic_flag_test_and_set_explicit(&sites_lock, memory_order_acquire)) {
  }
  int i = 0;
  while (i < n_sites && sites[i] != caller) i++;
  if (i == n_sites && n_sites < N_SITES) sites[n_sites++] = caller;
  atomic_flag_clear_explicit(&sites_lock, memory_order_release);
}

/* 1: this allocation (libdp's, made while armed) must fail. */
static inline int inject(void *caller) {
  if (!atomic_load_explicit(&armed, memory_order_relaxed)) return 0;
  if (!atomic_load_explicit(&fail_theirs, memory_order_relaxed) && !from_exe(caller))
    return 0;
  long k = atomic_fetch_add_explicit(&n_allocs, 1, memory_order_relaxed) + 1;
  if (k != atomic_load_explicit(&fail_at, memory_order_relaxed)) return 0;
  atomic_fetch_add_explicit(&n_injected, 1, memory_order_relaxed);
  if (from_exe(caller)) note_site(caller);
  return 1;
}

static inline void *record(void *caller, void *p) {
  if (p && atomic_load_explicit(&tracking, memory_order_relaxed) && from_exe(caller))
    live_add(p);
  return p;
}

static inline void forget(void *p) {
  if (p && atomic_load_explicit(&tracking, memory_order_relaxed)) live_remove(p);
}

void *FN(malloc)(size_t n) {
  void *caller = CALLER;
  if (inject(caller)) {
    errno = ENOMEM;
    return NULL;
  }
  return record(caller, REAL_MALLOC(n));
}

void *FN(calloc)(size_t n, size_t size) {
  void *caller = CALLER;
  if (inject(caller)) {
    errno = ENOMEM;
    return NULL;
  }
  return record(caller, REAL_CALLOC(n, size));
}

void *FN(realloc)(void *p, size_t n) {
  void *caller = CALLER;
  if (n > 0 && inject(caller)) { /* realloc(p, 0) frees: never failed */
    errno = ENOMEM;
    return NULL;
  }
  forget(p);
  void *q = REAL_REALLOC(p, n);
  if (!q && n > 0) {
    live_add(p); /* failed: p is still live (and was ours if it was tracked) */
    return NULL;
  }
  return record(caller, q);
}

void FN(free)(void *p) {
  forget(p);
  REAL_FREE(p);
}

int FN(posix_memalign)(void **out, size_t align, size_t n) {
  void *caller = CALLER;
  if (align < sizeof(void *) || (align & (align - 1)) != 0) return EINVAL;
  if (inject(caller)) return ENOMEM;
  void *p = REAL_MEMALIGN(align, n);
  if (!p) return ENOMEM;
  *out = record(caller, p);
  return 0;
}

void *FN(aligned_alloc)(size_t align, size_t n) {
  void *caller = CALLER;
  if (inject(caller)) {
    errno = ENOMEM;
    return NULL;
  }
  return record(caller, REAL_MEMALIGN(align, n));
}

void *FN(memalign)(size_t align, size_t n) {
  void *caller = CALLER;
  if (inject(caller)) {
    errno = ENOMEM;
    return NULL;
  }
  return record(caller, REAL_MEMALIGN(align, n));
}

void *FN(valloc)(size_t n) {
  void *caller = CALLER;
  if (inject(caller)) {
    errno = ENOMEM;
    return NULL;
  }
  return record(caller, REAL_MEMALIGN(4096, n));
}

void *FN(pvalloc)(size_t n) {
  void *caller = CALLER;
  if (inject(caller)) {
    errno = ENOMEM;
    return NULL;
  }
  return record(caller, REAL_MEMALIGN(4096, (n + 4095) & ~(size_t)4095));
}

#ifdef DP_OOM_WRAP
/* libdp's strdup calls, which libc's malloc would serve out of sight */
char *FN(strdup)(const char *str) {
  void *caller = CALLER;
  if (inject(caller)) {
    errno = ENOMEM;
    return NULL;
  }
  return record(caller, __real_strdup(str));
}
#endif

/* ---- crash report ---------------------------------------------------------------- */

static volatile const char *current_call = "(none)";
static volatile const char *current_case = "(none)";
static volatile long current_n;

#ifndef DP_OOM_WRAP
static void put(const char *s) {
  ssize_t r = write(2, s, strlen(s));
  (void)r;
}

static void on_crash(int sig) {
  char num[32];
  int k = 0;
  long v = current_n;
  char rev[32];
  int nr = 0;
  do {
    rev[nr++] = (char)('0' + v % 10);
    v /= 10;
  } while (v > 0 && nr < 30);
  while (nr > 0) num[k++] = rev[--nr];
  num[k] = 0;
  put("test_oom: FAILED: crashed (");
  put(sig == SIGSEGV   ? "SIGSEGV"
      : sig == SIGBUS  ? "SIGBUS"
      : sig == SIGABRT ? "SIGABRT"
                       : "signal");
  put(") in ");
  put((const char *)current_case);
  put(", allocation ");
  put(num);
  put(" failed, during ");
  put((const char *)current_call);
  put("\n");
  _exit(1);
}
#endif

/* ---- the scenario ------------------------------------------------------------------ */

static const char MLP_SPEC[] = "input 12\n"
                               "linear 16\nlayernorm\ngelu\ndropout 0.2\n"
                               "linear 5\n"
                               "loss softmax_cross_entropy\n";
/* the same 12 floats per row read as 1 x 3 x 4 */
static const char CNN_SPEC[] =
    "input 1 3 4\n"
    "conv2d 4 2 padding 1\nbatchnorm\nrelu\nmaxpool2d 2 stride 1\n"
    "flatten\nlinear 5\n"
    "loss softmax_cross_entropy\n";
enum { IN = 12, OUT = 5, BATCH = 8, MAX_PARAMS = 4096 };

typedef struct {
  const char *name, *spec;
  dp_mode mode;
} oom_case;

static int failures;
static char dir[64], ckpt_path[128], st_path[128], spec_path[2][128];
/* the inference context's arenas (dp_ctx_create_static) */
static _Alignas(4096) unsigned char static_arena[2][1 << 20];

#define VIOLATION(...)                                                                     \
  do {                                                                                     \
    printf("FAIL %s, allocation %ld: ", (const char *)current_case, (long)current_n);      \
    printf(__VA_ARGS__);                                                                   \
    printf("\n");                                                                          \
    failures++;                                                                            \
  } while (0)

/* One API call, armed. Evaluates to its status; checks the status against
 * what was injected during it. */
static long injected_before, n_absorbed;
static int verbose;
static void arm(const char *what) {
  current_call = what;
  injected_before = atomic_load(&n_injected);
  atomic_store(&armed, 1);
}

/* 1 when the call failed (the scenario stops), 0 when it succeeded. */
static int disarm(dp_status s, const char *what, long *nomem, long *other) {
  atomic_store(&armed, 0);
  long inj = atomic_load(&n_injected) - injected_before;
  if (s == DP_OK) {
    if (inj) {
      n_absorbed++;
      if (verbose)
        printf("  note: %s, allocation %ld: %s succeeded anyway\n",
               (const char *)current_case, (long)current_n, what);
    }
    return 0;
  }
  const char *msg = dp_last_error();
  if (!inj)
    VIOLATION("%s failed (%s: %s) but no allocation failed during it", what,
              dp_status_name(s), msg);
  if (!msg || !msg[0])
    VIOLATION("%s failed (%s) with an empty dp_last_error()", what, dp_status_name(s));
  if (s == DP_ERR_NOMEM)
    (*nomem)++;
  else {
    (*other)++;
    printf("  note: %s, allocation %ld: %s returned %s, not DP_ERR_NOMEM: %s\n",
           (const char *)current_case, (long)current_n, what, dp_status_name(s), msg);
  }
  return 1;
}

#define CALL(expr) (arm(#expr), disarm((expr), #expr, nomem, other))

static void fill(float *x, int32_t *t, int rows) {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (int k = 0; k < rows * IN; k++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x[k] = (float)(s >> 40) * 0x1p-23f - 1.0f;
  }
  for (int r = 0; r < rows; r++) t[r] = (int32_t)(r * 7 % OUT);
}

/* Files in dir other than the checkpoint and the export: temporary files left. */
static int stray_files(void) {
  DIR *d = opendir(dir);
  int n = 0;
  if (!d) return -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
        !strcmp(e->d_name, "model.ckpt") || !strcmp(e->d_name, "model.safetensors") ||
        !strcmp(e->d_name, "mlp.dpm") || !strcmp(e->d_name, "cnn.dpm"))
      continue;
    printf("  stray file %s/%s\n", dir, e->d_name);
    n++;
  }
  closedir(d);
  return n;
}

static float x[BATCH * IN], y[BATCH * OUT], before[MAX_PARAMS], after[MAX_PARAMS];
static int32_t t[BATCH];
static uint64_t before_hash, before_step;

/* The context's parameters, their hash and step counter, into before[];
 * nonzero (a violation counted) when they cannot be read. */
static int snapshot(dp_ctx *c, size_t np) {
  if (dp_get_params(c, before, np) != DP_OK) {
    VIOLATION("dp_get_params: %s", dp_last_error());
    return 1;
  }
  before_hash = dp_params_hash(c);
  before_step = dp_ctx_step(c);
  return 0;
}

/* 1 when they differ from the snapshot. */
static int changed(dp_ctx *c, size_t np) {
  return dp_get_params(c, after, np) != DP_OK ||
         memcmp(before, after, np * sizeof *before) != 0 ||
         dp_params_hash(c) != before_hash || dp_ctx_step(c) != before_step;
}

/* One training step, armed; a failed one must change nothing. 1: it failed. */
static int train(dp_ctx *c, size_t np, long *nomem, long *other) {
  float loss = 0;
  if (snapshot(c, np)) return 1;
  if (CALL(dp_train_step(c, BATCH, IN, x, t, &loss))) {
    if (changed(c, np))
      VIOLATION("a failed dp_train_step changed the parameters or the step counter");
    return 1;
  }
  return 0;
}

/* Runs the scenario once. Returns 1 when every call succeeded. */
static int scenario(const oom_case *oc, long *nomem, long *other) {
  static const char app[] = "application state";
  dp_model *m = NULL, *info_model = NULL;
  dp_plan *p = NULL, *ip = NULL;
  dp_ctx *c = NULL, *ic = NULL;
  void *app_back = NULL;
  size_t app_bytes = 0;
  dp_ckpt_summary sum;
  int ok = 0;
  fill(x, t, BATCH);
  /* the spec from a file (written once by main) */
  if (CALL(dp_model_load(spec_path[oc->spec == CNN_SPEC], &m))) goto done;
  dp_model_free(m);
  m = NULL;
  if (CALL(dp_model_parse(oc->spec, oc->name, &m))) goto done;
  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = BATCH;
  cfg.n_devices = 2;
  cfg.mode = oc->mode;
  dp_config_set_optimizer(&cfg, DP_OPT_ADAMW);
  cfg.seed = 5;
  int fit = 0;
  if (CALL(dp_plan_max_batch(m, &cfg, (size_t)1 << 30, BATCH, &fit))) goto done;
  if (fit != BATCH) VIOLATION("dp_plan_max_batch: %d, want %d", fit, (int)BATCH);
  if (CALL(dp_plan_create(m, &cfg, &p))) goto done;
  if (CALL(dp_ctx_create(p, &c))) goto done;
  size_t np = dp_model_n_params(m);
  if (np > MAX_PARAMS) {
    VIOLATION("%zu parameters, more than the test's %d", np, (int)MAX_PARAMS);
    goto done;
  }
  for (int k = 0; k < 2; k++)
    if (train(c, np, nomem, other)) goto done;
  if (CALL(dp_forward(c, BATCH, IN, x, y))) goto done;
  if (CALL(dp_ckpt_save(c, ckpt_path))) goto done;
  if (CALL(dp_ckpt_save_app(c, ckpt_path, app, sizeof app))) goto done;
  uint64_t h_saved = dp_params_hash(c), step_saved = dp_ctx_step(c);
  if (CALL(dp_ckpt_info(ckpt_path, &info_model, &sum))) goto done;
  if (sum.n_params != np || sum.seed != cfg.seed)
    VIOLATION("dp_ckpt_info: %zu parameters, seed %llu", sum.n_params,
              (unsigned long long)sum.seed);
  if (CALL(dp_ckpt_read_app(ckpt_path, &app_back, &app_bytes))) goto done;
  if (app_bytes != sizeof app || !app_back || memcmp(app_back, app, sizeof app) != 0)
    VIOLATION("dp_ckpt_read_app gave back other data");
  /* a step past the checkpoint: a load that fails must leave its result */
  if (train(c, np, nomem, other) || snapshot(c, np)) goto done;
  if (CALL(dp_ckpt_load(c, ckpt_path))) {
    if (changed(c, np)) VIOLATION("a failed dp_ckpt_load changed the context");
    goto done;
  }
  if (dp_params_hash(c) != h_saved || dp_ctx_step(c) != step_saved)
    VIOLATION("dp_ckpt_load did not restore the saved parameters and step");
  if (CALL(dp_ckpt_export_safetensors(c, st_path))) goto done;
  uint64_t h_exported = dp_params_hash(c);
  if (train(c, np, nomem, other) || snapshot(c, np)) goto done;
  if (CALL(dp_ckpt_import_safetensors(c, st_path))) {
    if (changed(c, np))
      VIOLATION("a failed dp_ckpt_import_safetensors changed the context");
    goto done;
  }
  if (dp_params_hash(c) != h_exported)
    VIOLATION("dp_ckpt_import_safetensors did not set the exported parameters");
  /* an inference plan on caller-provided arenas, loading the checkpoint */
  dp_config icfg = cfg;
  icfg.inference = 1;
  if (CALL(dp_plan_create(m, &icfg, &ip))) goto done;
  int nd = dp_plan_n_devices(ip);
  void *arenas[2] = {NULL, NULL};
  size_t align = dp_plan_alignment(ip);
  for (int d = 0; d < nd && d < 2; d++) {
    size_t bytes = (dp_plan_device_bytes(ip, d) + align - 1) / align * align;
    arenas[d] = bytes <= sizeof static_arena[d] ? static_arena[d] : NULL;
    if (!arenas[d]) {
      VIOLATION("device %d needs %zu bytes, more than the test's arena", d, bytes);
      goto done;
    }
  }
  if (dp_plan_host_bytes(ip) > 0) {
    VIOLATION("a cpu plan with a host staging arena");
    goto done;
  }
  if (CALL(dp_ctx_create_static(ip, arenas, NULL, &ic))) goto done;
  if (CALL(dp_ckpt_load(ic, ckpt_path))) goto done;
  if (CALL(dp_forward(ic, BATCH, IN, x, y))) goto done;
  /* a CPU GEMM benchmark (allocates its operands) */
  double ms = 0;
  if (CALL(dp_bench_sgemm(DP_BACKEND_CPU, 0, 8, 8, 8, 1, 0, &ms))) goto done;
  ok = 1;
done:
  current_call = "freeing";
  free(app_back);
  dp_model_free(info_model);
  dp_ctx_free(ic);
  dp_plan_free(ip);
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
  current_call = "(between runs)";
  return ok;
}

/* Runs oc for N = 1, 2, ... until a run injects nothing; returns the number
 * of allocations failed one by one. */
static long run_case(const oom_case *oc, long *nomem, long *other) {
  current_case = oc->name;
  long n;
  for (n = 1;; n++) {
    current_n = n;
    atomic_store(&n_allocs, 0);
    atomic_store(&n_injected, 0);
    atomic_store(&fail_at, n);
    live_reset();
    atomic_store(&tracking, 1);
    int ok = scenario(oc, nomem, other);
    atomic_store(&tracking, 0);
    long injected = atomic_load(&n_injected), seen = atomic_load(&n_allocs);
    if (n_live != 0 || live_overflow)
      VIOLATION("%ld allocation(s) of libdp's still live after the scenario freed "
                "everything%s",
                n_live, live_overflow ? " (table overflowed)" : "");
    if (stray_files() != 0) VIOLATION("files left in %s", dir);
    if (!injected) {
      if (!ok) VIOLATION("the scenario failed with no allocation failed");
      printf("%-24s %3ld allocations%s, each failed in turn\n", oc->name, seen,
             atomic_load(&fail_theirs) ? " (libc's inside libdp's calls too)" : "");
      return n - 1;
    }
    if (failures > 20) {
      printf("too many failures, stopping\n");
      return n;
    }
  }
}

/* The injector fails the N-th armed call, and the live table sees this
 * program's allocations (a stand-in for libdp's: same executable). */
static int self_check(void) {
  void *(*volatile p_malloc)(size_t) = malloc;
  void *(*volatile p_calloc)(size_t, size_t) = calloc;
  void *(*volatile p_realloc)(void *, size_t) = realloc;
  atomic_store(&n_allocs, 0);
  atomic_store(&n_injected, 0);
  atomic_store(&fail_at, 2);
  live_reset();
  atomic_store(&tracking, 1);
  atomic_store(&armed, 1);
  void *a = p_malloc(16);
  errno = 0;
  void *b = p_calloc(2, 8);
  int e = errno;
  void *c = p_realloc(a, 64);
  atomic_store(&armed, 0);
  long live_3 = n_live, injected = atomic_load(&n_injected), seen = atomic_load(&n_allocs);
  free(c ? c : a);
  long live_0 = n_live;
  atomic_store(&tracking, 0);
  int ok = a && !b && e == ENOMEM && c && injected == 1 && seen == 3 && live_3 == 1 &&
           live_0 == 0;
  printf("injector self-check: %s (call 2 of 3 failed with ENOMEM; 1 then 0 allocations "
         "live)\n",
         ok ? "ok" : "BROKEN");
  return ok;
}

static const oom_case cases[] = {
    {"mlp, allreduce", MLP_SPEC, DP_MODE_ALLREDUCE},
    {"mlp, classic", MLP_SPEC, DP_MODE_CLASSIC},
    {"cnn, allreduce", CNN_SPEC, DP_MODE_ALLREDUCE},
    {"cnn, classic", CNN_SPEC, DP_MODE_CLASSIC},
};

/* One pass over the cases; theirs: libc's allocations inside libdp's calls
 * fail too. Returns the allocations failed. */
static long run_pass(int theirs, long *nomem, long *other) {
  atomic_store(&fail_theirs, theirs);
  n_absorbed = 0;
  long total = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases && failures <= 20; i++)
    total += run_case(&cases[i], nomem, other);
  return total;
}

int main(int argc, char **argv) {
  int libdp_only = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--libdp-only"))
      libdp_only = 1;
    else if (!strcmp(argv[i], "-v"))
      verbose = 1;
    else {
      printf("usage: test_oom [--libdp-only] [-v]\n");
      return 2;
    }
  }
#ifndef DP_OOM_WRAP /* the sanitizer reports crashes itself */
  signal(SIGSEGV, on_crash);
  signal(SIGBUS, on_crash);
  signal(SIGABRT, on_crash);
#else
  libdp_only = 1;
#endif
  dl_iterate_phdr(exe_segments, NULL);
  if (n_exe_segs == 0) {
    printf("test_oom: FAILED: dl_iterate_phdr found no segment of this program\n");
    return 1;
  }
  if (!self_check()) {
    printf("test_oom: FAILED: the injector does not work\n");
    return 1;
  }
  n_sites = 0; /* the self-check's are this program's */
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/test_oom.XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    printf("test_oom: FAILED: mkdtemp %s: %s\n", dir, strerror(errno));
    return 1;
  }
  snprintf(ckpt_path, sizeof ckpt_path, "%s/model.ckpt", dir);
  snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
  for (int i = 0; i < 2; i++) {
    snprintf(spec_path[i], sizeof spec_path[i], "%s/%s.dpm", dir, i ? "cnn" : "mlp");
    FILE *f = fopen(spec_path[i], "w");
    if (!f || fputs(i ? CNN_SPEC : MLP_SPEC, f) == EOF || fclose(f) != 0) {
      printf("test_oom: FAILED: cannot write %s\n", spec_path[i]);
      return 1;
    }
  }

  /* pass 1: libdp's own allocations */
  long nomem = 0, other = 0;
  long total = run_pass(0, &nomem, &other);
  long absorbed = n_absorbed;
  /* pass 2: also libc's allocations made inside libdp's calls (the stdio
   * streams of checkpoint files, open_memstream, pthread_create, ...): a
   * failure there must be reported too, or absorbed with a correct result */
  long nomem2 = 0, other2 = 0, total2 = 0, absorbed2 = 0;
  if (!libdp_only && !failures) {
    total2 = run_pass(1, &nomem2, &other2);
    absorbed2 = n_absorbed;
  }
  unlink(ckpt_path);
  unlink(st_path);
  unlink(spec_path[0]);
  unlink(spec_path[1]);
  rmdir(dir);
  if (failures) {
    printf("test_oom: FAILED (%d violations)\n", failures);
    return 1;
  }
  if (!libdp_only)
    printf("with libc's allocations inside libdp's calls: %ld failed one by one (%ld "
           "DP_ERR_NOMEM, %ld other statuses, %ld absorbed by libc), every failure "
           "reported and clean\n",
           total2, nomem2, other2, absorbed2);
  if (verbose)
    for (int i = 0; i < n_sites; i++)
      printf("  call site %d: %#lx (addr2line -f -e test_oom that)\n", i + 1,
             (unsigned long)((uintptr_t)sites[i] - exe_base));
  printf("test_oom: %ld allocations at %d call sites failed one by one (%ld DP_ERR_NOMEM, "
         "%ld other statuses, %ld absorbed), every failure reported and clean\n",
         total, n_sites, nomem, other, absorbed);
  return 0;
}

#else /* DP_OOM_SKIP */

int main(void) {
  printf("SKIP test_oom: a sanitizer owns the allocator in this build\n");
  return 0;
}

#endif
