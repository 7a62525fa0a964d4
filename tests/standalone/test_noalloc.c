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
 * Its own executable (it defines malloc). Prints the counts; exit 0 on
 * success, 1 on failure. Under AddressSanitizer the allocator cannot be
 * replaced, so the test says "skipped" and exits 0.
 */
#include "dp.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define DP_NOALLOC_SKIP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || \
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
static atomic_long n_calls;

static inline void note(void) {
  if (atomic_load_explicit(&counting, memory_order_relaxed))
    atomic_fetch_add_explicit(&n_calls, 1, memory_order_relaxed);
}

void *malloc(size_t n) {
  note();
  return __libc_malloc(n);
}

void *calloc(size_t n, size_t size) {
  note();
  return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n) {
  note();
  return __libc_realloc(p, n);
}

void free(void *p) {
  note();
  __libc_free(p);
}

int posix_memalign(void **out, size_t align, size_t n) {
  note();
  if (align < sizeof(void *) || (align & (align - 1)) != 0) return EINVAL;
  void *p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}

void *aligned_alloc(size_t align, size_t n) {
  note();
  return __libc_memalign(align, n);
}

void *memalign(size_t align, size_t n) {
  note();
  return __libc_memalign(align, n);
}

void *valloc(size_t n) {
  note();
  return __libc_memalign(4096, n);
}

void *pvalloc(size_t n) {
  note();
  return __libc_memalign(4096, (n + 4095) & ~(size_t)4095);
}

static void count_on(void) {
  atomic_store(&n_calls, 0);
  atomic_store(&counting, 1);
}

static long count_off(void) {
  atomic_store(&counting, 0);
  return atomic_load(&n_calls);
}

/* ---- the test ------------------------------------------------------------------ */

static const char MLP_SPEC[] = "input 12\n"
                               "linear 16\nlayernorm\ngelu\ndropout 0.2\n"
                               "linear 16\ntanh\n"
                               "linear 16\nsigmoid\n"
                               "linear 16\nrelu\n"
                               "linear 5 nobias\n"
                               "loss softmax_cross_entropy\n";
enum { IN = 12, OUT = 5, BATCH = 32, SMALL = 19, STEPS = 100 };

static int failures;

#define EXPECT(cond, ...)                     \
  do {                                        \
    if (!(cond)) {                            \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                    \
      printf("\n");                           \
      failures++;                             \
    }                                         \
  } while (0)

/* The counter must see calls made through every entry point, from this thread
 * and from another one. The calls go through volatile pointers so that the
 * compiler cannot drop a malloc/free pair. */
static void *(*volatile p_malloc)(size_t) = malloc;
static void *(*volatile p_calloc)(size_t, size_t) = calloc;
static void *(*volatile p_realloc)(void *, size_t) = realloc;
static void (*volatile p_free)(void *) = free;
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
  count_on();
  void *a = p_malloc(24);
  long n1 = count_off();
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
  atomic_store(&thread_exit, 1);
  pthread_join(th, NULL);

  EXPECT(n1 == 1, "one malloc while counting registered %ld calls", n1);
  EXPECT(n2 == 1, "a free while not counting was counted");
  EXPECT(n3 == 7, "calloc, realloc, posix_memalign, aligned_alloc, 3 free: counted %ld, want 7",
         n3);
  EXPECT(n4 == 2, "malloc and free on another thread: counted %ld, want 2", n4);
  printf("counter self-check: %s (1, 7 and 2 calls seen)\n",
         n1 == 1 && n2 == 1 && n3 == 7 && n4 == 2 ? "ok" : "BROKEN");
}

typedef struct {
  const char *name;
  int n_devices;
  dp_split split;
  int micro_batch;
} config_case;

static void fill(float *x, int32_t *t, int rows, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int k = 0; k < rows * IN; k++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x[k] = (float)(s >> 40) * 0x1p-23f - 1.0f;
  }
  for (int r = 0; r < rows; r++) t[r] = (int32_t)((uint64_t)(r * 7 + (int)seed) % OUT);
}

static void run_case(const config_case *cc) {
  static float x[BATCH * IN], y[BATCH * OUT];
  static int32_t t[BATCH];
  dp_model *m = NULL;
  dp_plan *p = NULL;
  dp_ctx *c = NULL;
  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = BATCH;
  cfg.n_devices = cc->n_devices;
  cfg.split = cc->split;
  cfg.micro_batch = cc->micro_batch;
  cfg.optimizer = DP_OPT_ADAMW;
  cfg.seed = 3;
  if (dp_model_parse(MLP_SPEC, "mlp", &m) || dp_plan_create(m, &cfg, &p) ||
      dp_ctx_create(p, &c)) {
    EXPECT(0, "%s: setup failed: %s", cc->name, dp_last_error());
    goto done;
  }
  fill(x, t, BATCH, 1);
  float loss = 0;
  /* warm-up, not counted: one step and one forward at the full batch */
  EXPECT(dp_train_step(c, BATCH, IN, x, t, &loss) == DP_OK, "%s: warm-up step: %s", cc->name,
         dp_ctx_error(c));
  EXPECT(dp_forward(c, BATCH, IN, x, y) == DP_OK, "%s: warm-up forward: %s", cc->name,
         dp_ctx_error(c));
  uint64_t step0 = dp_ctx_step(c);

  int bad_steps = 0, bad_fwd = 0, nonfinite = 0;
  count_on();
  for (int k = 0; k < STEPS; k++) {
    int rows = k % 2 ? SMALL : BATCH; /* rebuilds the schedule every step */
    if (dp_train_step(c, rows, IN, x, t, &loss) != DP_OK) bad_steps++;
    if (!isfinite(loss)) nonfinite++;
  }
  long n_train = count_off();

  count_on();
  for (int k = 0; k < STEPS; k++) {
    int rows = k % 3 ? BATCH : SMALL;
    if (dp_forward(c, rows, IN, x, y) != DP_OK) bad_fwd++;
  }
  long n_forward = count_off();

  /* refused calls record an error message: that must not allocate either */
  count_on();
  int refused = 0;
  refused += dp_train_step(c, BATCH, IN + 1, x, t, NULL) == DP_ERR_SHAPE;
  refused += dp_train_step(c, BATCH + 1, IN, x, t, NULL) == DP_ERR_SHAPE;
  t[5] = OUT;
  refused += dp_train_step(c, BATCH, IN, x, t, NULL) == DP_ERR_RANGE;
  t[5] = 0;
  float keep = x[3];
  x[3] = NAN;
  refused += dp_train_step(c, BATCH, IN, x, t, NULL) == DP_ERR_NONFINITE;
  x[3] = keep;
  refused += dp_forward(c, BATCH, IN, x, NULL) == DP_ERR_INVALID;
  long n_errors = count_off();

  printf("%-40s train %3d steps: %ld allocator calls; forward %3d: %ld; "
         "refused calls: %ld\n",
         cc->name, STEPS, n_train, STEPS, n_forward, n_errors);
  EXPECT(bad_steps == 0 && nonfinite == 0, "%s: %d steps failed, %d losses non-finite: %s",
         cc->name, bad_steps, nonfinite, dp_ctx_error(c));
  EXPECT(bad_fwd == 0, "%s: %d forwards failed: %s", cc->name, bad_fwd, dp_ctx_error(c));
  EXPECT(dp_ctx_step(c) == step0 + STEPS, "%s: step counter %llu, want %llu", cc->name,
         (unsigned long long)dp_ctx_step(c), (unsigned long long)(step0 + STEPS));
  EXPECT(refused == 5, "%s: only %d of 5 bad calls were refused as expected", cc->name,
         refused);
  EXPECT(n_train == 0, "%s: %ld allocator calls during training steps", cc->name, n_train);
  EXPECT(n_forward == 0, "%s: %ld allocator calls during forward passes", cc->name, n_forward);
  EXPECT(n_errors == 0, "%s: %ld allocator calls during refused calls", cc->name, n_errors);
done:
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
}

int main(void) {
  check_counter_works();
  static const config_case cases[] = {
      {"mlp, 2 devices", 2, DP_SPLIT_CHUNK, 0},
      {"mlp, 4 devices", 4, DP_SPLIT_CHUNK, 0},
      {"mlp, 3 devices, balanced, micro_batch 4", 3, DP_SPLIT_BALANCED, 4},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
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
