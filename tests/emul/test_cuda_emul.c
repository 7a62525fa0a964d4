/* lib/'s wiring of the CUDA backend, tested without a GPU: the public API
 * with cfg.backend = DP_BACKEND_CUDA runs against the emulated GPU of
 * tests/emul/fake_cuda.c and is compared with the cpu backend. The double
 * runs the CPU backend's own ops, so every difference in bits is a wiring
 * bug (a missed broadcast, a stale graph, a read before the step's one
 * synchronisation, ...), not arithmetic.
 *
 *   build/test_cuda_emul             every test (Check forks one child per test)
 *   CK_RUN_CASE=graphs build/...     one TCase; CK_FORK=no for a debugger
 *
 * It also checks that the double is as strict as it claims (suite fake_cuda):
 * a test double that accepts anything would let these tests pass for nothing.
 * The counting allocator below (as tests/standalone/test_noalloc.c's) is off
 * under sanitizers, which own the allocator. */
#include "fake_cuda.h"

#include "core/ctx.h"  /* DP_CANARY; the double's own tests call dp_cuda.h directly */
#include "cpu/gemm.h" /* dp__model_workspace_bytes: the CPU ops the double runs */
#include "dp.h"
#include "dp_cuda.h"
#include "req.h"

#include <check.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- counting allocator ------------------------------------------------------------ */

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EMUL_NOALLOC_SKIP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) ||                 \
    __has_feature(thread_sanitizer)
#define EMUL_NOALLOC_SKIP 1
#endif
#endif

static atomic_int counting;
static atomic_long n_calls;

#ifndef EMUL_NOALLOC_SKIP
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t n);

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
#endif

static void count_on(void) {
  atomic_store(&n_calls, 0);
  atomic_store(&counting, 1);
}

static long count_off(void) {
  atomic_store(&counting, 0);
  return atomic_load(&n_calls);
}

/* ---- models, data, contexts -------------------------------------------------------- */

static const char CE_SPEC[] = "input 12\n"
                              "linear 16\nlayernorm\ngelu\ndropout 0.2\n"
                              "linear 16\ntanh\n"
                              "linear 5\n"
                              "loss softmax_cross_entropy\n";
static const char MSE_SPEC[] = "input 12\n"
                               "linear 16\nrelu\ndropout 0.1\n"
                               "linear 16\nsigmoid\n"
                               "linear 5 nobias\n"
                               "loss mse\n";
enum { IN = 12, OUT = 5, BATCH = 32, MB = 4, SHORT = 19, TINY = 3, MAXP = 4096 };

typedef struct {
  dp_model *m;
  dp_plan *p;
  dp_ctx *c;
  int mse;
} rig;

/* The configuration both backends share; cuda-only options are set apart. */
static dp_config config(int n, dp_mode mode, int shard, dp_optimizer opt) {
  dp_config c;
  dp_config_default(&c);
  c.batch = BATCH;
  c.n_devices = n;
  c.micro_batch = MB;
  c.mode = mode;
  c.shard_optimizer = shard;
  dp_config_set_optimizer(&c, opt);
  c.lr = opt == DP_OPT_ADAMW ? 0.003f : 0.05f;
  c.weight_decay = 0.01f;
  c.seed = 11;
  return c;
}

static dp_config as_cuda(dp_config c, int graph) {
  c.backend = DP_BACKEND_CUDA;
  c.cuda_graph = graph;
  return c;
}

static dp_status rig_try(rig *r, const char *spec, const dp_config *cfg) {
  memset(r, 0, sizeof *r);
  r->mse = spec == MSE_SPEC;
  dp_status s = dp_model_parse(spec, "emul", &r->m);
  if (!s) s = dp_plan_create(r->m, cfg, &r->p);
  if (!s) s = dp_ctx_create(r->p, &r->c);
  return s;
}

static void rig_open(rig *r, const char *spec, const dp_config *cfg) {
  dp_status s = rig_try(r, spec, cfg);
  ck_assert_msg(s == DP_OK, "%s context, %d devices: %s: %s",
                cfg->backend == DP_BACKEND_CUDA ? "cuda" : "cpu", cfg->n_devices,
                dp_status_name(s), dp_last_error());
}

static void rig_close(rig *r) {
  dp_ctx_free(r->c);
  dp_plan_free(r->p);
  dp_model_free(r->m);
  memset(r, 0, sizeof *r);
}

/* Nothing of the double is left: no arena, staging block or backend
 * context, and nothing was freed that should not have been. */
static void expect_clean(const char *when) {
  fake_cuda_stats s = fake_cuda_get_stats();
  ck_assert_msg(s.arenas == 0 && s.hosts == 0 && s.ctxs == 0,
                "%s: live: %ld arenas, %ld staging blocks, %ld backend contexts", when,
                s.arenas, s.hosts, s.ctxs);
  ck_assert_msg(s.bad_frees == 0, "%s: %ld bad frees (unknown memory, or in use)", when,
                s.bad_frees);
}

static uint64_t mix(uint64_t s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

/* The batch of step k: x (BATCH, IN), labels and mse targets. */
typedef struct {
  float x[BATCH * IN];
  int32_t label[BATCH];
  float target[BATCH * OUT];
} batch;

static void make_batch(batch *b, int k) {
  uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(k + 1) + 7;
  for (int i = 0; i < BATCH * IN; i++) {
    s = mix(s);
    b->x[i] = (float)(s >> 40) * 0x1p-23f - 1.0f;
  }
  for (int i = 0; i < BATCH * OUT; i++) {
    s = mix(s);
    b->target[i] = (float)(s >> 40) * 0x1p-24f;
  }
  for (int r = 0; r < BATCH; r++) b->label[r] = (int32_t)((uint64_t)(r * 7 + k * 3) % OUT);
}

static const void *targets(const rig *r, const batch *b) {
  return r->mse ? (const void *)b->target : (const void *)b->label;
}

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static size_t n_params(const rig *r) { return dp_model_n_params(r->m); }

/* Parameters of every rig equal rs[0]'s, bit for bit. */
static void same_params(rig *const rs[], int n, const char *what) {
  static float p0[MAXP], pk[MAXP];
  size_t np = n_params(rs[0]);
  ck_assert(np <= MAXP);
  ck_assert_msg(dp_get_params(rs[0]->c, p0, np) == DP_OK, "%s: get params: %s", what,
                dp_ctx_error(rs[0]->c));
  for (int r = 1; r < n; r++) {
    ck_assert_msg(dp_get_params(rs[r]->c, pk, np) == DP_OK, "%s: get params: %s", what,
                  dp_ctx_error(rs[r]->c));
    for (size_t k = 0; k < np; k++)
      REQ(bits(p0[k]) == bits(pk[k]), "%s: context %d, parameter %zu: %.9g vs %.9g", what,
          r, k, pk[k], p0[k]);
    ck_assert_msg(dp_params_hash(rs[r]->c) == dp_params_hash(rs[0]->c),
                  "%s: context %d: parameter hashes differ", what, r);
  }
}

static void same_params2(rig *a, rig *b, const char *what) {
  rig *rs[2] = {a, b};
  same_params(rs, 2, what);
}

/* Step k on every rig with the same data and rows: each DP_OK, with the
 * loss bits of rs[0]. */
static void step_all(rig *const rs[], int n, int k, int rows, const char *what) {
  static batch bt;
  make_batch(&bt, k);
  float l0 = 0.0f;
  for (int r = 0; r < n; r++) {
    float l = -1.0f;
    dp_status s = dp_train_step(rs[r]->c, rows, IN, bt.x, targets(rs[r], &bt), &l);
    ck_assert_msg(s == DP_OK, "%s: context %d, step %d (%d rows): %s: %s", what, r, k, rows,
                  dp_status_name(s), dp_ctx_error(rs[r]->c));
    if (r == 0) l0 = l;
    ck_assert_msg(bits(l) == bits(l0),
                  "%s: context %d, step %d (%d rows): loss %.9g vs %.9g", what, r, k, rows,
                  l, l0);
  }
}

static void step_both(rig *a, rig *b, int k, int rows, const char *what) {
  rig *rs[2] = {a, b};
  step_all(rs, 2, k, rows, what);
}

/* Forward on every rig: outputs equal rs[0]'s bit for bit, nothing written
 * past rows * out. */
static void forward_all(rig *const rs[], int n, int k, int rows, const char *what) {
  static batch bt;
  static float y0[BATCH * OUT], yk[BATCH * OUT];
  make_batch(&bt, k);
  for (int r = 0; r < n; r++) {
    float *y = r ? yk : y0;
    memset(y, 0xff, sizeof y0);
    dp_status s = dp_forward(rs[r]->c, rows, IN, bt.x, y);
    ck_assert_msg(s == DP_OK, "%s: context %d, forward of %d rows: %s: %s", what, r, rows,
                  dp_status_name(s), dp_ctx_error(rs[r]->c));
    for (int i = 0; i < rows * OUT; i++)
      REQ(bits(y[i]) == bits(y0[i]),
          "%s: context %d, forward of %d rows, output %d: %.9g vs "
          "%.9g",
          what, r, rows, i, y[i], y0[i]);
    for (int i = rows * OUT; i < BATCH * OUT; i++)
      REQ(bits(y[i]) == 0xffffffffu, "%s: context %d, forward of %d rows wrote y[%d]", what,
          r, rows, i);
  }
}

static void forward_both(rig *a, rig *b, int k, int rows, const char *what) {
  rig *rs[2] = {a, b};
  forward_all(rs, 2, k, rows, what);
}

static const char *mode_name(dp_mode m, int shard) {
  return m == DP_MODE_CLASSIC ? "classic" : shard ? "allreduce+shard" : "allreduce";
}

/* ---- the double is strict (suite fake_cuda) ---------------------------------------- */

static sigjmp_buf fault_jump;

static void on_fault(int sig) { siglongjmp(fault_jump, sig); }

/* The fault is caught here rather than by Check's raise-signal test: under
 * AddressSanitizer its own handler would turn it into exit(1). */
START_TEST(arena_memory_is_not_host_addressable) {
  void *p = NULL;
  ck_assert_int_eq(dp__cuda_arena_alloc(0, 4096, &p), DP_OK);
  ck_assert(fake_cuda_is_device(p));
  struct sigaction sa, old_segv, old_bus;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fault;
  sigemptyset(&sa.sa_mask);
  ck_assert_int_eq(sigaction(SIGSEGV, &sa, &old_segv), 0);
  ck_assert_int_eq(sigaction(SIGBUS, &sa, &old_bus), 0);
  volatile int faults = 0;
  for (int i = 0; i < 2; i++) {
    if (sigsetjmp(fault_jump, 1) == 0) {
      volatile unsigned char *v = p;
      if (i == 0)
        v[100] = 1; /* what lib/ gets for any host write to an arena */
      else
        faults += v[4000]; /* or read */
    } else {
      faults++;
    }
  }
  sigaction(SIGSEGV, &old_segv, NULL);
  sigaction(SIGBUS, &old_bus, NULL);
  ck_assert_msg(faults == 2, "%d of 2 host accesses to fake device memory faulted", faults);
  dp__cuda_arena_free(0, p);
  expect_clean("after the fault test");
}
END_TEST

START_TEST(memory_calls_translate_and_refuse) {
  void *a = NULL, *h = NULL;
  ck_assert_int_eq(dp__cuda_arena_alloc(1, 1000, &a), DP_OK);
  ck_assert_int_eq((uintptr_t)a % 256, 0);
  ck_assert_int_eq(dp__cuda_host_alloc(64, &h), DP_OK);
  fake_cuda_stats s = fake_cuda_get_stats();
  ck_assert(s.arenas == 1 && s.hosts == 1 && s.arena_bytes == 1000);
  uint32_t in[250], out[250];
  for (int i = 0; i < 250; i++) in[i] = (uint32_t)i * 2654435761u;
  ck_assert_int_eq(dp__cuda_memcpy(a, in, sizeof in), DP_OK);
  ck_assert_int_eq(dp__cuda_memcpy(out, a, sizeof out), DP_OK);
  ck_assert(memcmp(in, out, sizeof in) == 0);
  ck_assert_int_eq(dp__cuda_fill_u32(1, (uint32_t *)a + 10, 7u, 5), DP_OK);
  ck_assert_int_eq(fake_cuda_peek(out, a, sizeof out), DP_OK);
  ck_assert(out[9] == in[9] && out[10] == 7u && out[14] == 7u && out[15] == in[15]);
  /* past the end, wrong GPU, no such GPU */
  ck_assert_int_eq(dp__cuda_memcpy((char *)a + 900, in, 200), DP_ERR_INVALID);
  ck_assert_int_eq(dp__cuda_memcpy(out, (char *)a + 996, 8), DP_ERR_INVALID);
  ck_assert_int_eq(dp__cuda_fill_u32(0, a, 0, 4), DP_ERR_INVALID);
  ck_assert_int_eq(dp__cuda_fill_u32(1, a, 0, 251), DP_ERR_INVALID);
  void *q = NULL;
  ck_assert_int_eq(dp__cuda_arena_alloc(4, 64, &q), DP_ERR_INVALID);
  ck_assert_ptr_null(q);
  ck_assert(strstr(dp_last_error(), "cuda device 4: no such device (4 visible)"));
  ck_assert_int_eq(dp_cuda_device_count(), 4);
  fake_cuda_set_gpus(2);
  ck_assert_int_eq(dp_cuda_device_count(), 2);
  ck_assert_int_eq(dp__cuda_arena_alloc(2, 64, &q), DP_ERR_INVALID);
  fake_cuda_reset_config();
  /* free memory, per GPU: cuda/arena.cu's refusal */
  fake_cuda_set_free_bytes(3, 5000);
  ck_assert_int_eq(dp__cuda_arena_alloc(3, 6000, &q), DP_ERR_NOMEM);
  ck_assert_msg(strstr(dp_last_error(), "cuda device 3: arena of 6000 bytes") &&
                    strstr(dp_last_error(), "only 5000 bytes"),
                "%s", dp_last_error());
  ck_assert_int_eq(dp__cuda_arena_alloc(3, 5000, &q), DP_OK);
  void *q2 = NULL;
  ck_assert_int_eq(dp__cuda_arena_alloc(3, 1, &q2), DP_ERR_NOMEM); /* it is all used */
  ck_assert_ptr_null(q2);
  dp__cuda_arena_free(3, q);
  /* frees of memory that is not an arena's or staging's start are counted */
  dp__cuda_arena_free(1, (char *)a + 256);
  dp__cuda_host_free(in);
  ck_assert_int_eq(fake_cuda_get_stats().bad_frees, 2);
  fake_cuda_reset_counters();
  dp__cuda_arena_free(1, a);
  dp__cuda_host_free(h);
  expect_clean("after freeing");
}
END_TEST

/* A cuda plan and arenas from the double, without a dp_ctx. */
typedef struct {
  dp_model *m;
  dp_plan *p;
  void *arena[4], *staging, *bctx;
} bare;

static void bare_open(bare *b, int n) {
  memset(b, 0, sizeof *b);
  dp_config c = as_cuda(config(n, DP_MODE_CLASSIC, 0, DP_OPT_SGD), 0);
  ck_assert_int_eq(dp_model_parse(CE_SPEC, "emul", &b->m), DP_OK);
  ck_assert_int_eq(dp_plan_create(b->m, &c, &b->p), DP_OK);
  for (int d = 0; d < n; d++)
    ck_assert_int_eq(dp__cuda_arena_alloc(d, dp_plan_device_bytes(b->p, d), &b->arena[d]),
                     DP_OK);
  ck_assert_int_eq(dp__cuda_host_alloc(dp_plan_host_bytes(b->p), &b->staging), DP_OK);
}

static void bare_close(bare *b) {
  dp__cuda_ctx_free(b->bctx);
  for (int d = 0; d < 4; d++) dp__cuda_arena_free(d, b->arena[d]);
  dp__cuda_host_free(b->staging);
  dp_plan_free(b->p);
  dp_model_free(b->m);
}

START_TEST(init_validates_like_context_cu) {
  bare b;
  bare_open(&b, 2);
  void *host[2] = {b.staging, b.arena[1]};
  ck_assert_int_eq(dp__cuda_ctx_init(b.p, host, 0, &b.bctx), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_last_error(), "is not memory of GPU 0"), "%s", dp_last_error());
  void *swapped[2] = {b.arena[1], b.arena[0]};
  ck_assert_int_eq(dp__cuda_ctx_init(b.p, swapped, 0, &b.bctx), DP_ERR_INVALID);
  void *odd[2] = {(char *)b.arena[0] + 64, b.arena[1]};
  ck_assert_int_eq(dp__cuda_ctx_init(b.p, odd, 0, &b.bctx), DP_ERR_INVALID);
  ck_assert_int_eq(dp__cuda_ctx_init(b.p, b.arena, 0x10, &b.bctx), DP_ERR_INVALID);
  fake_cuda_set_have_nccl(0);
  ck_assert_int_eq(dp__cuda_ctx_init(b.p, b.arena, DP_CUDA_NCCL, &b.bctx),
                   DP_ERR_UNSUPPORTED);
  fake_cuda_set_have_nccl(1);
  ck_assert_ptr_null(b.bctx);
  ck_assert_int_eq(fake_cuda_get_stats().ctxs, 0);
  ck_assert_int_eq(dp__cuda_ctx_init(b.p, b.arena, DP_CUDA_NCCL, &b.bctx), DP_OK);
  ck_assert_int_eq(fake_cuda_get_stats().ctxs, 1);
  /* an arena in use by a context cannot be freed or given to another */
  void *other = NULL;
  ck_assert_int_eq(dp__cuda_ctx_init(b.p, b.arena, 0, &other), DP_ERR_INVALID);
  dp__cuda_arena_free(0, b.arena[0]);
  ck_assert_int_eq(fake_cuda_get_stats().bad_frees, 1);
  fake_cuda_reset_counters();
  bare_close(&b);
  expect_clean("after the bare context");
}
END_TEST

/* A COPY op executed by device dev: (src device, region, offset) -> (dst ...). */
static dp_op copy_op(int dev, int sd, int sr, size_t so, int dd, int dr, size_t doff,
                     size_t bytes) {
  dp_op op;
  memset(&op, 0, sizeof op);
  op.kind = DP_OP_COPY;
  op.device = (int16_t)dev;
  op.src_dev = (int16_t)sd;
  op.src_region = (uint8_t)sr;
  op.src_offset = so;
  op.dst_dev = (int16_t)dd;
  op.dst_region = (uint8_t)dr;
  op.dst_offset = doff;
  op.bytes = bytes;
  return op;
}

START_TEST(hooks_out_of_order_are_wiring_bugs) {
  bare b;
  bare_open(&b, 2);
  ck_assert_int_eq(dp__cuda_ctx_init(b.p, b.arena, 0, &b.bctx), DP_OK);
  void *x = b.bctx;
  const dp_op *ops = dp_plan_ops(b.p);
  float loss = 1.0f;
  char tmp[16];
  dp_exec_env env;
  memset(&env, 0, sizeof env);
  env.plan = b.p;
  env.arena[0] = b.arena[0];
  env.arena[1] = b.arena[1];
  env.rows = BATCH;
  env.loss_rows = BATCH;
  env.training = true;
  env.host_y = (float *)b.staging;
  static dp_mb mbs[64];
  env.mbs = mbs;
  /* device 0's params to the host outputs, to device 1's params; a copy whose
   * source runs past the end of device 0's arena */
  const dp_op to_host =
      copy_op(0, 0, DP_REGION_PARAMS, 0, DP_HOST, DP_REGION_OUTPUTS, 0, 16);
  const dp_op to_dev1 = copy_op(0, 0, DP_REGION_PARAMS, 0, 1, DP_REGION_PARAMS, 0, 16);
  dp_region_info ws = dp_plan_region(b.p, 0, DP_REGION_WORKSPACE);
  size_t end = dp_plan_device_bytes(b.p, 0);
  const dp_op past = copy_op(0, 0, DP_REGION_WORKSPACE, end - ws.offset - 8, DP_HOST,
                             DP_REGION_OUTPUTS, 0, 16);
  ck_assert_int_eq(dp__cuda_step_end(x, &loss), DP_ERR_BACKEND); /* no step_begin */
  ck_assert_int_eq(dp__cuda_stage_begin(x, 0, 0), DP_ERR_BACKEND);
  ck_assert_int_eq(dp__cuda_step_begin(x, 0), DP_OK);
  ck_assert_int_eq(dp__cuda_step_begin(x, 0), DP_ERR_BACKEND);     /* twice */
  ck_assert_int_eq(dp__cuda_capture_begin(x), DP_ERR_BACKEND);     /* in a step */
  ck_assert_int_eq(dp__cuda_stage_begin(x, 0, 1), DP_ERR_BACKEND); /* skips stage 0 */
  /* a copy or an op on a thread with no stage */
  ck_assert_int_eq(dp__cuda_copy(x, &env, 0, &to_host), DP_ERR_BACKEND);
  ck_assert_int_eq(dp__cuda_stage_begin(x, 0, 0), DP_OK);
  ck_assert_int_eq(dp__cuda_stage_begin(x, 0, 0), DP_ERR_BACKEND); /* already open */
  /* host endpoints must be staging; ranges inside an arena; the executing
   * device is the thread's */
  env.host_y = (float *)tmp;
  ck_assert_int_eq(dp__cuda_copy(x, &env, 0, &to_host), DP_ERR_BACKEND);
  env.host_y = (float *)b.staging;
  ck_assert_int_eq(dp__cuda_copy(x, &env, 0, &to_host), DP_OK);
  ck_assert_int_eq(dp__cuda_copy(x, &env, 0, &past), DP_ERR_INVALID);
  ck_assert_int_eq(dp__cuda_copy(x, &env, 1, &to_host), DP_ERR_BACKEND);
  /* peer: only the copy's other device endpoint, on its own thread */
  ck_assert_int_eq(dp__cuda_peer(x, &env, 0, &to_dev1), DP_OK);
  ck_assert_int_eq(dp__cuda_peer(x, &env, 0, &to_host), DP_ERR_BACKEND);
  ck_assert_int_eq(dp__cuda_peer(x, &env, 1, &to_dev1), DP_ERR_BACKEND);
  /* an op of device 1 on device 0's thread, an op of another stage */
  const dp_op *op1 = NULL, *op0_late = NULL;
  for (int k = 0; k < dp_plan_n_ops(b.p); k++) {
    if (!op1 && ops[k].device == 1 && ops[k].kind == DP_OP_FORWARD) op1 = &ops[k];
    if (!op0_late && ops[k].device == 0 && ops[k].kind == DP_OP_FORWARD) op0_late = &ops[k];
  }
  ck_assert(op1 && op0_late && op0_late->stage > 0);
  ck_assert_int_eq(dp__cuda_run(x, &env, op1), DP_ERR_BACKEND);
  ck_assert_int_eq(dp__cuda_run(x, &env, op0_late), DP_ERR_BACKEND);
  ck_assert_int_eq(dp__cuda_stage_end(x, 0, 1), DP_ERR_BACKEND); /* not the open one */
  ck_assert_int_eq(dp__cuda_stage_end(x, 0, 0), DP_OK);
  ck_assert_int_eq(dp__cuda_copy(x, &env, 0, &to_host), DP_ERR_BACKEND);
  /* device 1 never ran stage 0: step_end refuses the step */
  ck_assert_int_eq(dp__cuda_step_end(x, &loss), DP_ERR_BACKEND);
  ck_assert_msg(strstr(dp_last_error(), "device 1 ended at stage -1"), "%s",
                dp_last_error());
  /* graphs: launch of an empty slot, capture_end without a captured step */
  ck_assert(!dp__cuda_graph_ready(x, 0));
  ck_assert_int_eq(dp__cuda_graph_launch(x, 0, 3), DP_ERR_INVALID);
  ck_assert_int_eq(dp__cuda_capture_begin(x), DP_OK);
  ck_assert_int_eq(dp__cuda_capture_end(x, 0), DP_ERR_BACKEND); /* nothing captured */
  ck_assert(!dp__cuda_graph_ready(x, 0));
  ck_assert_int_eq(dp__cuda_capture_end(x, 0), DP_ERR_BACKEND); /* none open */
  ck_assert_int_eq(dp__cuda_capture_begin(x), DP_OK);
  ck_assert_int_eq(dp__cuda_step_begin(x, 0), DP_OK);
  dp__cuda_capture_abort(x);
  ck_assert_int_eq(dp__cuda_step_begin(x, 0), DP_ERR_BACKEND); /* step_end first */
  ck_assert_int_eq(dp__cuda_step_end(x, &loss), DP_OK);
  /* during a capture too (a synchronous copy or fill is illegal while capturing) */
  ck_assert_int_eq(dp__cuda_capture_begin(x), DP_OK);
  ck_assert_int_eq(dp__cuda_memcpy(tmp, b.arena[1], 16), DP_ERR_BACKEND);
  ck_assert_int_eq(dp__cuda_ctx_copy(x, 0, tmp, b.arena[0], 16), DP_ERR_BACKEND);
  ck_assert_int_eq(dp__cuda_fill_u32(0, b.arena[0], 0, 4), DP_ERR_BACKEND);
  dp__cuda_capture_abort(x);
  ck_assert_int_eq(dp__cuda_step_end(x, &loss), DP_OK);
  /* device memory of a context in flight: the copy would race the stream */
  ck_assert_int_eq(dp__cuda_step_begin(x, 0), DP_OK);
  ck_assert_int_eq(dp__cuda_memcpy(tmp, b.arena[1], 16), DP_ERR_BACKEND);
  ck_assert_int_eq(dp__cuda_fill_u32(0, b.arena[0], 0, 4), DP_ERR_BACKEND);
  ck_assert_int_eq(dp__cuda_step_end(x, &loss), DP_OK);
  ck_assert_int_eq(dp__cuda_memcpy(tmp, b.arena[1], 16), DP_OK);
  bare_close(&b);
  expect_clean("after the bare context");
}
END_TEST

/* ---- training and inference against the cpu backend (suite cuda_emul) ------------- */

START_TEST(training_matches_cpu_bit_for_bit) {
  static const struct {
    dp_mode mode;
    int shard;
  } modes[] = {{DP_MODE_CLASSIC, 0}, {DP_MODE_ALLREDUCE, 0}, {DP_MODE_ALLREDUCE, 1}};
  static const int ns[] = {1, 2, 4};
  static const dp_optimizer opts[] = {DP_OPT_ADAMW, DP_OPT_MOMENTUM};
  int runs = 0;
  for (int spec = 0; spec < 2; spec++)
    for (size_t mi = 0; mi < 3; mi++)
      for (size_t ni = 0; ni < 3; ni++)
        for (size_t oi = 0; oi < 2; oi++) {
          if (spec == 1 && oi == 1) continue; /* mse: AdamW only */
          dp_config c = config(ns[ni], modes[mi].mode, modes[mi].shard, opts[oi]);
          dp_config g = as_cuda(c, 0);
          char what[128];
          snprintf(what, sizeof what, "%s, %s, %d devices, %s", spec ? "mse" : "ce",
                   mode_name(c.mode, c.shard_optimizer), c.n_devices,
                   opts[oi] == DP_OPT_ADAMW ? "adamw" : "momentum");
          rig cu, cpu;
          const char *s = spec ? MSE_SPEC : CE_SPEC;
          rig_open(&cu, s, &g);
          rig_open(&cpu, s, &c);
          ck_assert_int_eq(dp_plan_n_devices(cu.p), ns[ni]);
          same_params2(&cu, &cpu, what); /* initialisation */
          for (int k = 0; k < 10; k++) step_both(&cu, &cpu, k, BATCH, what);
          same_params2(&cu, &cpu, what);
          ck_assert_int_eq(dp_ctx_step(cu.c), 10);
          rig_close(&cu);
          rig_close(&cpu);
          expect_clean(what);
          runs++;
        }
  ck_assert_int_eq(runs, 27);
}
END_TEST

START_TEST(forward_and_short_batches_match_cpu) {
  static const struct {
    dp_mode mode;
    int shard;
  } modes[] = {{DP_MODE_CLASSIC, 0}, {DP_MODE_ALLREDUCE, 1}};
  static const int rows[] = {BATCH, SHORT, TINY, BATCH, 1, SHORT};
  for (int mi = 0; mi < 2; mi++) {
    dp_config c = config(4, modes[mi].mode, modes[mi].shard, DP_OPT_ADAMW);
    dp_config g = as_cuda(c, 0);
    rig cu, cpu;
    rig_open(&cu, CE_SPEC, &g);
    rig_open(&cpu, CE_SPEC, &c);
    const char *what = mode_name(c.mode, c.shard_optimizer);
    forward_both(&cu, &cpu, 100, BATCH, what); /* before any step */
    for (int k = 0; k < 6; k++) {
      step_both(&cu, &cpu, k, rows[k], what);
      forward_both(&cu, &cpu, 200 + k, rows[(k + 1) % 6], what);
    }
    same_params2(&cu, &cpu, what);
    rig_close(&cu);
    rig_close(&cpu);
  }
  /* an inference plan */
  dp_config c = config(2, DP_MODE_CLASSIC, 0, DP_OPT_SGD);
  c.inference = 1;
  dp_config g = as_cuda(c, 0);
  rig cu, cpu;
  rig_open(&cu, CE_SPEC, &g);
  rig_open(&cpu, CE_SPEC, &c);
  for (int k = 0; k < 3; k++) forward_both(&cu, &cpu, k, rows[k], "inference plan");
  rig_close(&cu);
  rig_close(&cpu);
  expect_clean("after the forward tests");
}
END_TEST

/* ---- image layers (conv2d, pools, flatten) against the cpu backend --------------------
 * The wiring of cuda/backend.cu's image layers: flatten's view resolution
 * (first: a view of the input, no input gradient; in the middle; last: a copy
 * into OUTPUTS), conv2d's workspace after cuBLAS's (the double checks the plan
 * reserves dp__cuda_model_workspace_bytes and that the CPU's conv workspace
 * fits), pools with overlapping windows, odd sizes, stride and padding. */
/* overlapping maxpool (4 x 3 x 2), padding, nobias (5 x 4 x 3), avgpool with
 * stride 1 (5 x 3 x 2), flatten in the middle */
static const char CNN_CE_SPEC[] = "input 2 7 6\n"
                                  "conv2d 4 3 padding 1\nrelu\n"
                                  "maxpool2d 3 stride 2\n"
                                  "conv2d 5 2 padding 1 nobias\n"
                                  "avgpool2d 2 stride 1\n"
                                  "flatten\ndropout 0.2\nlinear 5\n"
                                  "loss softmax_cross_entropy\n";
/* stride 2 with padding (3 x 3 x 3), pools to 3 x 2 x 2, conv2d to 5 x 1 x 1,
 * flatten last (a copy into OUTPUTS) */
static const char CNN_LAST_SPEC[] = "input 1 5 5\n"
                                    "conv2d 3 3 stride 2 padding 1\ntanh\n"
                                    "avgpool2d 2 stride 1\n"
                                    "maxpool2d 1\n"
                                    "conv2d 5 2\n"
                                    "flatten\nloss mse\n";
/* padded pools: maxpool 3 stride 2 padding 1 (4 x 4 x 3), avgpool 2 padding 1
 * exclude_pad (4 x 3 x 2) */
static const char CNN_PAD_SPEC[] = "input 2 7 6\n"
                                   "conv2d 4 3 padding 1\nrelu\n"
                                   "maxpool2d 3 stride 2 padding 1\n"
                                   "avgpool2d 2 padding 1 exclude_pad\n"
                                   "flatten\nlinear 5\nloss mse\n";
/* flatten first: a view of the input, whose gradient nothing needs */
static const char CNN_FIRST_SPEC[] = "input 1 3 5\nflatten\nlinear 9\ngelu\nlinear 5\n"
                                     "loss mse\n";
enum { CNN_MAXIN = 84 };

typedef struct {
  float x[BATCH * CNN_MAXIN];
  int32_t label[BATCH];
  float target[BATCH * OUT];
} cnn_batch;

static void make_cnn_batch(cnn_batch *b, int k) {
  uint64_t s = 0x2545F4914F6CDD1Dull * (uint64_t)(k + 3) + 1;
  for (int i = 0; i < BATCH * CNN_MAXIN; i++) {
    s = mix(s);
    b->x[i] = (float)(s >> 40) * 0x1p-23f - 1.0f;
  }
  for (int i = 0; i < BATCH * OUT; i++) {
    s = mix(s);
    b->target[i] = (float)(s >> 40) * 0x1p-24f;
  }
  for (int r = 0; r < BATCH; r++) b->label[r] = (int32_t)((uint64_t)(r * 5 + k) % OUT);
}

/* Steps (also short batches) and forwards on both rigs: losses, outputs and
 * parameters bit for bit. */
static void cnn_both(const char *spec, const dp_config *c, int graph, int steps,
                     const char *what) {
  static cnn_batch bt;
  static float y0[BATCH * OUT], y1[BATCH * OUT];
  static const int rows[] = {BATCH, SHORT, BATCH, TINY, 1, BATCH};
  dp_config g = as_cuda(*c, graph);
  rig cu, cpu;
  rig_open(&cu, spec, &g);
  rig_open(&cpu, spec, c);
  int mse = dp_model_loss(cu.m) == DP_LOSS_MSE, in = dp_model_input_width(cu.m);
  ck_assert_int_le(in, CNN_MAXIN);
  ck_assert_int_eq(dp_model_output_width(cu.m), OUT);
  same_params2(&cu, &cpu, what);
  for (int k = 0; k < 6; k++) {
    make_cnn_batch(&bt, k);
    int n = rows[k];
    if (k < steps) {
      float l0 = -1.0f, l1 = -2.0f;
      const void *t = mse ? (const void *)bt.target : (const void *)bt.label;
      dp_status s0 = dp_train_step(cu.c, n, in, bt.x, t, &l0);
      dp_status s1 = dp_train_step(cpu.c, n, in, bt.x, t, &l1);
      ck_assert_msg(s0 == DP_OK && s1 == DP_OK,
                    "%s: step %d (%d rows): cuda %s, cpu %s: %s", what, k, n,
                    dp_status_name(s0), dp_status_name(s1),
                    s0 ? dp_ctx_error(cu.c) : dp_ctx_error(cpu.c));
      ck_assert_msg(bits(l0) == bits(l1), "%s: step %d (%d rows): loss %.9g vs cpu %.9g",
                    what, k, n, l0, l1);
    }
    int fr = rows[(k + 1) % 6];
    memset(y0, 0xff, sizeof y0);
    memset(y1, 0xff, sizeof y1);
    ck_assert_msg(dp_forward(cu.c, fr, in, bt.x, y0) == DP_OK, "%s: forward: %s", what,
                  dp_ctx_error(cu.c));
    ck_assert_msg(dp_forward(cpu.c, fr, in, bt.x, y1) == DP_OK, "%s: forward: %s", what,
                  dp_ctx_error(cpu.c));
    for (int i = 0; i < BATCH * OUT; i++)
      REQ(bits(y0[i]) == bits(y1[i]), "%s: forward %d of %d rows, output %d: %.9g vs %.9g",
          what, k, fr, i, y0[i], y1[i]);
  }
  same_params2(&cu, &cpu, what);
  rig_close(&cu);
  rig_close(&cpu);
}

START_TEST(image_layers_match_cpu_bit_for_bit) {
  static const struct {
    const char *spec, *name;
  } specs[] = {{CNN_CE_SPEC, "cnn ce"},
               {CNN_LAST_SPEC, "cnn, flatten last"},
               {CNN_PAD_SPEC, "padded pools"},
               {CNN_FIRST_SPEC, "flatten first"}};
  static const struct {
    int n;
    dp_mode mode;
    int shard, graph;
    dp_optimizer opt;
  } cfgs[] = {{1, DP_MODE_CLASSIC, 0, 0, DP_OPT_SGD},
              {3, DP_MODE_CLASSIC, 0, 0, DP_OPT_MOMENTUM},
              {4, DP_MODE_ALLREDUCE, 1, 0, DP_OPT_ADAMW},
              {2, DP_MODE_ALLREDUCE, 0, 1, DP_OPT_ADAMW}, /* captured and replayed */
              {4, DP_MODE_CLASSIC, 0, 1, DP_OPT_MOMENTUM}};
  int runs = 0;
  for (size_t si = 0; si < sizeof specs / sizeof *specs; si++)
    for (size_t ci = 0; ci < sizeof cfgs / sizeof *cfgs; ci++) {
      dp_config c = config(cfgs[ci].n, cfgs[ci].mode, cfgs[ci].shard, cfgs[ci].opt);
      char what[160];
      snprintf(what, sizeof what, "%s, %s, %d devices%s", specs[si].name,
               mode_name(c.mode, c.shard_optimizer), c.n_devices,
               cfgs[ci].graph ? ", cuda_graph" : "");
      cnn_both(specs[si].spec, &c, cfgs[ci].graph, 6, what);
      expect_clean(what);
      runs++;
    }
  /* inference plans: forward only */
  for (size_t si = 0; si < sizeof specs / sizeof *specs; si++) {
    dp_config c = config(3, DP_MODE_CLASSIC, 0, DP_OPT_SGD);
    c.inference = 1;
    char what[160];
    snprintf(what, sizeof what, "%s, inference plan", specs[si].name);
    cnn_both(specs[si].spec, &c, 0, 0, what);
    expect_clean(what);
    runs++;
  }
  ck_assert_int_eq(runs, 24);
}
END_TEST

/* The cuda plan's WORKSPACE: the fixed header and cuBLAS part, then conv2d's
 * COL and T at the largest micro-batch; a plan short of the conv part is
 * refused at init like one short of the fixed part. */
START_TEST(conv_workspace_follows_cublas_and_is_checked) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse(CNN_CE_SPEC, "ws", &m), DP_OK);
  dp_config c = as_cuda(config(2, DP_MODE_CLASSIC, 0, DP_OPT_SGD), 0);
  dp_plan *p = NULL;
  ck_assert_msg(dp_plan_create(m, &c, &p) == DP_OK, "%s", dp_last_error());
  size_t tail = 0;
  for (int i = 0; i < m->n_layers; i++) {
    const dp_layer *l = &m->layers[i];
    if (l->kind != DP_LAYER_CONV2D) continue;
    size_t np = (size_t)p->act[0].mb_rows * (size_t)l->h * (size_t)l->w;
    size_t col = (np * (size_t)(l->ic * l->k * l->k) * 4 + 255) / 256 * 256;
    size_t t = (np * (size_t)l->c * 4 + 255) / 256 * 256;
    ck_assert_uint_eq(dp__cuda_conv_workspace_bytes(l, p->act[0].mb_rows), col + t);
    tail = col + t > tail ? col + t : tail;
  }
  ck_assert_uint_gt(tail, 0);
  for (int d = 0; d < dp_plan_n_devices(p); d++) {
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_WORKSPACE).size,
                      DP_CUDA_CONV_WS_OFFSET + tail);
    /* the CPU ops the double runs fit: COL + T + the GEMMs' packing */
    ck_assert_uint_le(dp__model_workspace_bytes(m, p->act[d].mb_rows, true),
                      dp_plan_region(p, d, DP_REGION_WORKSPACE).size);
  }
  /* a model without conv2d keeps the fixed size */
  dp_model *f = NULL;
  ck_assert_int_eq(dp_model_parse(CNN_FIRST_SPEC, "ws", &f), DP_OK);
  ck_assert_uint_eq(dp__cuda_model_workspace_bytes(f, 8, true), dp__cuda_workspace_bytes());
  dp_model_free(f);
  /* one byte short of conv2d's part: init refuses, naming the parts */
  void *arena[2] = {NULL, NULL};
  for (int d = 0; d < 2; d++)
    ck_assert_int_eq(
        dp__cuda_arena_alloc(c.device_ids[d], dp_plan_device_bytes(p, d), &arena[d]),
        DP_OK);
  p->regions[1][DP_REGION_WORKSPACE].size--;
  void *bctx = NULL;
  ck_assert_int_eq(dp__cuda_ctx_init(p, arena, 0, &bctx), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_last_error(), "device 1") && strstr(dp_last_error(), "conv2d"),
                "%s", dp_last_error());
  ck_assert_ptr_null(bctx);
  p->regions[1][DP_REGION_WORKSPACE].size++;
  ck_assert_msg(dp__cuda_ctx_init(p, arena, 0, &bctx) == DP_OK, "%s", dp_last_error());
  dp__cuda_ctx_free(bctx);
  for (int d = 0; d < 2; d++) dp__cuda_arena_free(c.device_ids[d], arena[d]);
  dp_plan_free(p);
  dp_model_free(m);
  expect_clean("conv workspace");
}
END_TEST

START_TEST(every_cross_device_copy_has_its_peer_call) {
  for (int mode = 0; mode < 2; mode++) {
    dp_config g =
        as_cuda(config(4, mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC, 0, DP_OPT_ADAMW), 0);
    rig cu;
    rig_open(&cu, CE_SPEC, &g);
    fake_cuda_reset_counters();
    static batch bt;
    make_batch(&bt, 1);
    for (int k = 0; k < 3; k++)
      ck_assert_int_eq(
          dp_train_step(cu.c, k == 1 ? SHORT : BATCH, IN, bt.x, bt.label, NULL), DP_OK);
    static float y[BATCH * OUT];
    ck_assert_int_eq(dp_forward(cu.c, BATCH, IN, bt.x, y), DP_OK);
    fake_cuda_stats s = fake_cuda_get_stats();
    ck_assert_msg(s.cross_copies > 0 && s.peers == s.cross_copies,
                  "%s: %ld copies between devices, %ld peer calls",
                  mode ? "allreduce" : "classic", s.cross_copies, s.peers);
    ck_assert_int_eq(s.plain_steps, 4);
    ck_assert_int_eq(s.step_ends, 4);
    ck_assert_int_eq(s.executed, s.runs + s.copies);
    rig_close(&cu);
  }
  expect_clean("after the peer test");
}
END_TEST

/* config.fast_collectives: one ncclAllReduce (emulated in device order)
 * instead of the canonical tree. Two devices: that order is the tree's, so
 * the cpu's bits; four: close to the cpu, and every replica holds the same
 * parameters (a forward after a forced broadcast gives the same bits). */
START_TEST(fast_collectives_allreduce) {
  for (int n = 2; n <= 4; n += 2) {
    dp_config c = config(n, DP_MODE_ALLREDUCE, 0, DP_OPT_ADAMW);
    dp_config g = as_cuda(c, 0);
    g.fast_collectives = 1;
    /* one graph across GPUs with NCCL inside can deadlock (issue 14, item 2) */
    g.cuda_graph = 1;
    dp_plan *refused = NULL;
    dp_model *mm = NULL;
    ck_assert_int_eq(dp_model_parse(CE_SPEC, "emul", &mm), DP_OK);
    ck_assert_int_eq(dp_plan_create(mm, &g, &refused), DP_ERR_INVALID);
    ck_assert_msg(strstr(dp_last_error(), "cuda_graph with the NCCL transport"), "%s",
                  dp_last_error());
    g.fast_collectives = 0;
    g.transport = DP_TRANSPORT_NCCL;
    ck_assert_int_eq(dp_plan_create(mm, &g, &refused), DP_ERR_INVALID);
    dp_model_free(mm);
    g.cuda_graph = 0;
    g.transport = DP_TRANSPORT_AUTO;
    g.fast_collectives = 1;
    rig cpu, cu;
    rig_open(&cpu, CE_SPEC, &c);
    rig_open(&cu, CE_SPEC, &g);
    static batch bt;
    for (int k = 0; k < 8; k++) {
      make_batch(&bt, k);
      float lc = 0.0f, lg = 0.0f;
      ck_assert_int_eq(dp_train_step(cpu.c, BATCH, IN, bt.x, bt.label, &lc), DP_OK);
      dp_status s = dp_train_step(cu.c, BATCH, IN, bt.x, bt.label, &lg);
      ck_assert_msg(s == DP_OK, "%d devices, step %d: %s", n, k, dp_ctx_error(cu.c));
      if (n == 2)
        ck_assert_msg(bits(lc) == bits(lg), "step %d: loss %.9g vs %.9g", k, lg, lc);
      else
        ck_assert_msg(fabsf(lc - lg) <= 1e-5f * fabsf(lc), "step %d: loss %.9g vs %.9g", k,
                      lg, lc);
    }
    static float pc[MAXP], pg[MAXP], y1[BATCH * OUT], y2[BATCH * OUT];
    size_t np = n_params(&cu);
    ck_assert_int_eq(dp_get_params(cpu.c, pc, np), DP_OK);
    ck_assert_int_eq(dp_get_params(cu.c, pg, np), DP_OK);
    for (size_t k = 0; k < np; k++)
      REQ(n == 2 ? bits(pc[k]) == bits(pg[k]) : fabsf(pc[k] - pg[k]) <= 1e-4f,
          "%d devices: parameter %zu: %.9g vs %.9g", n, k, pg[k], pc[k]);
    ck_assert_int_eq(dp_forward(cu.c, BATCH, IN, bt.x, y1), DP_OK);
    ck_assert_int_eq(dp_set_params(cu.c, pg, np),
                     DP_OK); /* replicas refreshed from device 0 */
    ck_assert_int_eq(dp_forward(cu.c, BATCH, IN, bt.x, y2), DP_OK);
    ck_assert_msg(memcmp(y1, y2, sizeof y1) == 0, "%d devices: replicas diverged", n);
    rig_close(&cpu);
    rig_close(&cu);
  }
  /* the collective needs NCCL in the build */
  fake_cuda_set_have_nccl(0);
  dp_config g = as_cuda(config(2, DP_MODE_ALLREDUCE, 0, DP_OPT_ADAMW), 0);
  g.fast_collectives = 1;
  rig cu;
  dp_status s = rig_try(&cu, CE_SPEC, &g);
  ck_assert_msg(s != DP_OK && !cu.c, "fast_collectives without NCCL: %s",
                dp_status_name(s));
  rig_close(&cu);
  expect_clean("after the fast_collectives test");
}
END_TEST

/* ---- graphs ------------------------------------------------------------------------- */

START_TEST(graph_replay_equals_plain_and_cpu) {
  for (int mode = 0; mode < 3; mode++) {
    dp_config c = config(mode == 0 ? 2 : 4, mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC,
                         mode == 2, mode == 1 ? DP_OPT_MOMENTUM : DP_OPT_ADAMW);
    dp_config gp = as_cuda(c, 0), gg = as_cuda(c, 1);
    const char *what = mode_name(c.mode, c.shard_optimizer);
    rig cpu, plain, graph;
    rig_open(&cpu, CE_SPEC, &c);
    rig_open(&plain, CE_SPEC, &gp);
    rig_open(&graph, CE_SPEC, &gg);
    rig *rs[3] = {&cpu, &plain, &graph};
    fake_cuda_reset_counters();
    for (int k = 0; k < 10; k++) step_all(rs, 3, k, BATCH, what);
    same_params(rs, 3, what);
    /* dropout keys and AdamW's bias corrections change every step: equal
     * bits mean each replay ran with its own step */
    fake_cuda_stats s = fake_cuda_get_stats();
    ck_assert_msg(
        s.captures == 1 && s.launches >= 8 && s.aborts == 0,
        "%s: 10 full steps: %ld captures, %ld launches, %ld aborts (want 1, >= 8, 0)", what,
        s.captures, s.launches, s.aborts);
    ck_assert_int_eq(s.plain_steps + s.launches, 20); /* plain's 10, graph's 10 */
    for (int k = 0; k < 4; k++) forward_all(rs, 3, 50 + k, BATCH, what);
    step_all(rs, 3, 10, BATCH, what);
    same_params(rs, 3, what);
    rig_close(&cpu);
    rig_close(&plain);
    rig_close(&graph);
  }
  expect_clean("after the graph tests");
}
END_TEST

/* A shape whose capture fails (a driver that cannot instantiate it) runs
 * plain from then on, that step included: same bits, no error, and the
 * context says why. */
START_TEST(graph_capture_failure_falls_back_to_plain) {
  dp_config c = config(2, DP_MODE_ALLREDUCE, 0, DP_OPT_ADAMW);
  dp_config gp = as_cuda(c, 0), gg = as_cuda(c, 1);
  rig plain, graph;
  rig_open(&plain, CE_SPEC, &gp);
  rig_open(&graph, CE_SPEC, &gg);
  rig *rs[2] = {&plain, &graph};
  fake_cuda_reset_counters();
  fake_cuda_fail_captures(1);
  /* allreduce: step 0 broadcasts (replicas start stale), step 1 is the warm-up
   * of the shape without the broadcast, step 2 tries the capture and fails */
  for (int k = 0; k < 3; k++) step_all(rs, 2, k, BATCH, "capture fails");
  ck_assert_msg(strstr(dp_ctx_error(graph.c), "graph capture failed"), "%s",
                dp_ctx_error(graph.c));
  for (int k = 3; k < 8; k++) step_all(rs, 2, k, BATCH, "capture fails");
  same_params(rs, 2, "capture fails");
  fake_cuda_stats s = fake_cuda_get_stats();
  ck_assert_msg(s.captures == 0 && s.launches == 0 && s.plain_steps == 16,
                "%ld captures, %ld launches, %ld plain steps (want 0, 0, 16)", s.captures,
                s.launches, s.plain_steps);
  fake_cuda_fail_captures(0);
  rig_close(&plain);
  rig_close(&graph);
  expect_clean("after the capture failure");
}
END_TEST

/* dp_set_lr on cuda (issue 16, item 1): the rate is a per-step scalar on the
 * device, so plain steps and graph replays after the change use it; bit for
 * bit the cpu's, which sets the same rate between the same steps. */
START_TEST(set_lr_reaches_plain_steps_and_graph_replays) {
  for (int opt = 0; opt < 3; opt++) {
    dp_config c = config(2, DP_MODE_ALLREDUCE, opt == 2, (dp_optimizer)opt);
    if (opt == DP_OPT_MOMENTUM) c.momentum = 0.9f;
    for (int graph = 0; graph < 2; graph++) {
      dp_config g = as_cuda(c, graph);
      char what[64];
      snprintf(what, sizeof what, "optimizer %d, cuda_graph %d", opt, graph);
      rig cpu, cu;
      rig_open(&cpu, CE_SPEC, &c);
      rig_open(&cu, CE_SPEC, &g);
      rig *rs[2] = {&cpu, &cu};
      for (int k = 0; k < 4; k++) step_all(rs, 2, k, BATCH, what); /* graph: captured */
      for (int r = 0; r < 2; r++)
        ck_assert_int_eq(dp_set_lr(rs[r]->c, c.lr * 0.25f), DP_OK);
      for (int k = 4; k < 8; k++) step_all(rs, 2, k, BATCH, what); /* graph: replays */
      same_params(rs, 2, what);
      rig_close(&cpu);
      rig_close(&cu);
    }
  }
  expect_clean("after the set_lr test");
}
END_TEST

/* A launch that fails after the graph was launched (issue 14, item 4): the
 * graph may have run, update included, so the step is not run again plain (that
 * would apply the update twice): the context is poisoned, and its parameters
 * are those of exactly one update. */
START_TEST(graph_launch_failure_poisons_instead_of_rerunning) {
  dp_config c = config(2, DP_MODE_ALLREDUCE, 0, DP_OPT_ADAMW);
  dp_config gg = as_cuda(c, 1);
  for (int at = 2; at <= 3; at++) { /* the capture's own launch; a later replay */
    rig cpu, graph;
    rig_open(&cpu, CE_SPEC, &c);
    rig_open(&graph, CE_SPEC, &gg);
    rig *rs[2] = {&cpu, &graph};
    for (int k = 0; k < at; k++) step_all(rs, 2, k, BATCH, "before the failed launch");
    fake_cuda_fail_launches(1);
    static batch bt;
    make_batch(&bt, at);
    float lc = 0.0f, lg = 0.0f;
    ck_assert_int_eq(dp_train_step(cpu.c, BATCH, IN, bt.x, bt.label, &lc), DP_OK);
    dp_status s = dp_train_step(graph.c, BATCH, IN, bt.x, bt.label, &lg);
    ck_assert_msg(s == DP_ERR_BACKEND, "at %d: %s: %s", at, dp_status_name(s),
                  dp_ctx_error(graph.c));
    ck_assert_msg(strstr(dp_ctx_error(graph.c), "injected"), "%s", dp_ctx_error(graph.c));
    /* the graph ran once: the parameters are the cpu's after the same step */
    same_params(rs, 2, "after the failed launch");
    s = dp_train_step(graph.c, BATCH, IN, bt.x, bt.label, &lg);
    ck_assert_msg(s != DP_OK && strstr(dp_ctx_error(graph.c), "unusable"),
                  "at %d: not poisoned: %s", at, dp_ctx_error(graph.c));
    fake_cuda_fail_launches(0);
    rig_close(&cpu);
    rig_close(&graph);
    expect_clean("after the failed launch");
  }
}
END_TEST

START_TEST(graph_short_batches_run_plain) {
  static const int rows[] = {BATCH, BATCH, BATCH, SHORT, BATCH,
                             TINY,  BATCH, BATCH, 1,     BATCH};
  for (int mode = 0; mode < 2; mode++) {
    dp_config c = config(4, mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC, 0, DP_OPT_ADAMW);
    dp_config g = as_cuda(c, 1);
    const char *what = mode_name(c.mode, 0);
    rig cpu, graph;
    rig_open(&cpu, CE_SPEC, &c);
    rig_open(&graph, CE_SPEC, &g);
    rig *rs[2] = {&cpu, &graph};
    fake_cuda_reset_counters();
    for (int k = 0; k < 10; k++) {
      fake_cuda_stats a = fake_cuda_get_stats();
      step_all(rs, 2, k, rows[k], what);
      fake_cuda_stats b = fake_cuda_get_stats();
      if (rows[k] != BATCH)
        ck_assert_msg(b.launches == a.launches && b.plain_steps == a.plain_steps + 1,
                      "%s: step %d of %d rows: %ld launches, %ld plain steps (want 0, 1)",
                      what, k, rows[k], b.launches - a.launches,
                      b.plain_steps - a.plain_steps);
      else if (k >= 4)
        ck_assert_msg(b.launches == a.launches + 1 && b.plain_steps == a.plain_steps,
                      "%s: full step %d: %ld launches, %ld plain steps (want 1, 0)", what,
                      k, b.launches - a.launches, b.plain_steps - a.plain_steps);
      forward_all(rs, 2, 30 + k, rows[(k + 3) % 10], what);
    }
    same_params(rs, 2, what);
    rig_close(&cpu);
    rig_close(&graph);
  }
  expect_clean("after the short-batch graph test");
}
END_TEST

/* Replicas are stale after dp_set_params: a graph captured without the
 * parameter broadcast must not be replayed then. */
START_TEST(graph_allreduce_after_set_params) {
  for (int shard = 0; shard < 2; shard++) {
    dp_config c = config(4, DP_MODE_ALLREDUCE, shard, DP_OPT_ADAMW);
    dp_config g = as_cuda(c, 1);
    const char *what = mode_name(c.mode, shard);
    /* and classic on one device, which broadcasts every step: the same bits
     * by design, and blind to a stale replica that the cpu would share */
    dp_config c1 = config(1, DP_MODE_CLASSIC, 0, DP_OPT_ADAMW);
    rig one, cpu, graph;
    rig_open(&one, CE_SPEC, &c1);
    rig_open(&cpu, CE_SPEC, &c);
    rig_open(&graph, CE_SPEC, &g);
    rig *rs[3] = {&one, &cpu, &graph};
    for (int k = 0; k < 5; k++) step_all(rs, 3, k, BATCH, what);
    static float p[MAXP];
    size_t np = n_params(&cpu);
    for (int round = 0; round < 2; round++) {
      ck_assert_int_eq(dp_get_params(cpu.c, p, np), DP_OK);
      for (size_t k = 0; k < np; k++) p[k] = p[k] * 0.75f + (float)(k % 7) * 0.01f;
      for (int r = 0; r < 3; r++) ck_assert_int_eq(dp_set_params(rs[r]->c, p, np), DP_OK);
      for (int k = 0; k < 4; k++) step_all(rs, 3, 10 * round + 5 + k, BATCH, what);
      same_params(rs, 3, what);
      /* and a forward right after set_params */
      ck_assert_int_eq(dp_get_params(cpu.c, p, np), DP_OK);
      for (size_t k = 0; k < np; k++) p[k] = -p[k];
      for (int r = 0; r < 3; r++) ck_assert_int_eq(dp_set_params(rs[r]->c, p, np), DP_OK);
      forward_all(rs, 3, 77, BATCH, what);
    }
    rig_close(&one);
    rig_close(&cpu);
    rig_close(&graph);
  }
  expect_clean("after the set_params graph test");
}
END_TEST

/* ---- non-finite steps ---------------------------------------------------------------- */

static void nonfinite_case(int graph, dp_nonfinite_policy policy) {
  dp_config c = config(2, DP_MODE_ALLREDUCE, 1, DP_OPT_ADAMW);
  c.on_nonfinite = policy;
  dp_config g = as_cuda(c, graph);
  char what[64];
  snprintf(what, sizeof what, "%s, cuda_graph %d", policy ? "skip" : "error", graph);
  rig cpu, cu;
  rig_open(&cpu, CE_SPEC, &c);
  rig_open(&cu, CE_SPEC, &g);
  rig *rs[2] = {&cpu, &cu};
  for (int k = 0; k < 4; k++) step_all(rs, 2, k, BATCH, what);
  static float before[MAXP], after[MAXP];
  size_t np = n_params(&cu);
  ck_assert_int_eq(dp_get_params(cu.c, before, np), DP_OK);
  uint64_t step0 = dp_ctx_step(cu.c);
  static batch bt;
  make_batch(&bt, 4);
  bt.x[3 * IN + 5] = NAN;
  fake_cuda_stats a = fake_cuda_get_stats();
  for (int r = 0; r < 2; r++) {
    float loss = 0.0f;
    dp_status s = dp_train_step(rs[r]->c, BATCH, IN, bt.x, bt.label, &loss);
    if (policy == DP_NONFINITE_ERROR) {
      ck_assert_msg(s == DP_ERR_NONFINITE, "%s: context %d: %s: %s", what, r,
                    dp_status_name(s), dp_ctx_error(rs[r]->c));
    } else {
      ck_assert_msg(s == DP_OK && isnan(loss), "%s: context %d: %s, loss %g: %s", what, r,
                    dp_status_name(s), loss, dp_ctx_error(rs[r]->c));
      ck_assert_int_eq(dp_ctx_skipped_steps(rs[r]->c), 1);
    }
    ck_assert_msg(
        strstr(dp_ctx_error(rs[r]->c), "the loss is NaN; the step was not applied"),
        "%s: context %d: %s", what, r, dp_ctx_error(rs[r]->c));
  }
  if (graph) /* the refused step was a replay: the device refused it by itself */
    ck_assert_int_eq(fake_cuda_get_stats().launches, a.launches + 1);
  ck_assert_int_eq(dp_get_params(cu.c, after, np), DP_OK);
  for (size_t k = 0; k < np; k++)
    REQ(bits(before[k]) == bits(after[k]), "%s: parameter %zu changed by a refused step",
        what, k);
  ck_assert_int_eq(dp_ctx_step(cu.c), step0);
  same_params(rs, 2, what);
  /* training goes on, as on the cpu */
  for (int k = 5; k < 9; k++) step_all(rs, 2, k, BATCH, what);
  same_params(rs, 2, what);
  ck_assert_int_eq(dp_ctx_step(cu.c), step0 + 4);
  rig_close(&cpu);
  rig_close(&cu);
  expect_clean(what);
}

START_TEST(nonfinite_input_refuses_the_step) {
  nonfinite_case(0, DP_NONFINITE_ERROR);
  nonfinite_case(1, DP_NONFINITE_ERROR);
}
END_TEST

START_TEST(nonfinite_input_is_skipped_under_skip) {
  nonfinite_case(0, DP_NONFINITE_SKIP);
  nonfinite_case(1, DP_NONFINITE_SKIP);
}
END_TEST

/* An update that would overflow (lr near FLT_MAX) is refused by the device as
 * the cpu refuses it: same status and text, nothing written, in classic and
 * sharded allreduce, plain and replayed. */
START_TEST(nonfinite_update_is_refused_like_the_cpu) {
  for (int li = 0; li < 2; li++)
    for (int graph = 0; graph < 2; graph++) {
      dp_config c = li ? config(2, DP_MODE_ALLREDUCE, 1, DP_OPT_MOMENTUM)
                       : config(2, DP_MODE_CLASSIC, 0, DP_OPT_SGD);
      dp_config g = as_cuda(c, graph);
      char what[64];
      snprintf(what, sizeof what, "layout %d, cuda_graph %d", li, graph);
      rig cpu, cu;
      rig_open(&cpu, MSE_SPEC, &c);
      rig_open(&cu, MSE_SPEC, &g);
      rig *rs[2] = {&cpu, &cu};
      for (int k = 0; k < 3; k++) step_all(rs, 2, k, BATCH, what);
      rig_close(&cpu);
      rig_close(&cu);
      c.lr = g.lr = 3.4e38f; /* finite, but lr * gradient is not */
      rig_open(&cpu, MSE_SPEC, &c);
      rig_open(&cu, MSE_SPEC, &g);
      static float before[MAXP], after[MAXP];
      size_t np = n_params(&cu);
      ck_assert_int_eq(dp_get_params(cu.c, before, np), DP_OK);
      static batch bt;
      make_batch(&bt, 4);
      for (int i = 0; i < BATCH * IN; i++) bt.x[i] *= 1e4f;
      char msg[2][DP_ERRMSG_CAP];
      for (int r = 0; r < 2; r++) {
        float loss = 0.0f;
        dp_status s = dp_train_step(rs[r]->c, BATCH, IN, bt.x, bt.target, &loss);
        ck_assert_msg(s == DP_ERR_NONFINITE, "%s: context %d: %s: %s", what, r,
                      dp_status_name(s), dp_ctx_error(rs[r]->c));
        snprintf(msg[r], sizeof msg[r], "%s", dp_ctx_error(rs[r]->c));
        char *at = strrchr(msg[r], '[');
        if (at) *at = '\0';
      }
      ck_assert_msg(strstr(msg[0], "the update would make parameter"), "%s", msg[0]);
      /* the cpu's text is the executor's "device 0, op k of n (...): " + the op's */
      ck_assert_msg(strstr(msg[0], msg[1]), "%s: cpu '%s' vs cuda '%s'", what, msg[0],
                    msg[1]);
      ck_assert_int_eq(dp_get_params(cu.c, after, np), DP_OK);
      for (size_t k = 0; k < np; k++)
        REQ(bits(before[k]) == bits(after[k]),
            "%s: parameter %zu changed by a refused step", what, k);
      ck_assert_int_eq(dp_ctx_step(cu.c), 0);
      same_params(rs, 2, what);
      rig_close(&cpu);
      rig_close(&cu);
      expect_clean(what);
    }
}
END_TEST

/* ---- state in and out: checkpoints, parameters, gradients ---------------------------- */

static void tmp_path(char *buf, size_t cap) {
  snprintf(buf, cap, "/tmp/dp_emul_XXXXXX");
  int fd = mkstemp(buf);
  ck_assert_msg(fd >= 0, "mkstemp: %s", strerror(errno));
  close(fd);
}

static void step_one(rig *r, int k, int rows, const char *what) {
  static batch bt;
  make_batch(&bt, k);
  dp_status s = dp_train_step(r->c, rows, IN, bt.x, targets(r, &bt), NULL);
  ck_assert_msg(s == DP_OK, "%s: step %d: %s: %s", what, k, dp_status_name(s),
                dp_ctx_error(r->c));
}

/* ref and src train 4 steps, src saves; dst (after steps of its own) loads;
 * all go on 4 steps: the same bits as ref. */
static void ckpt_case(const dp_config *ref_cfg, const dp_config *src_cfg,
                      const dp_config *dst_cfg, int dst_pre, const char *what) {
  char path[64];
  tmp_path(path, sizeof path);
  rig ref, src, dst;
  rig_open(&ref, CE_SPEC, ref_cfg);
  rig_open(&src, CE_SPEC, src_cfg);
  rig_open(&dst, CE_SPEC, dst_cfg);
  for (int k = 0; k < 4; k++) {
    step_one(&ref, k, BATCH, what);
    step_one(&src, k, BATCH, what);
  }
  for (int k = 0; k < dst_pre; k++) step_one(&dst, 40 + k, k % 2 ? SHORT : BATCH, what);
  dp_status s = dp_ckpt_save(src.c, path);
  ck_assert_msg(s == DP_OK, "%s: save: %s", what, dp_ctx_error(src.c));
  s = dp_ckpt_load(dst.c, path);
  ck_assert_msg(s == DP_OK, "%s: load: %s", what, dp_ctx_error(dst.c));
  ck_assert_int_eq(dp_ctx_step(dst.c), 4);
  rig *rs[3] = {&ref, &src, &dst};
  same_params(rs, 3, what);
  for (int k = 4; k < 8; k++) step_all(rs, 3, k, BATCH, what);
  same_params(rs, 3, what);
  forward_all(rs, 3, 99, SHORT, what);
  rig_close(&ref);
  rig_close(&src);
  rig_close(&dst);
  unlink(path);
  expect_clean(what);
}

START_TEST(checkpoints_move_between_backends_and_device_counts) {
  dp_config c2 = config(2, DP_MODE_CLASSIC, 0, DP_OPT_ADAMW);
  dp_config g2 = as_cuda(c2, 0);
  ckpt_case(&c2, &g2, &c2, 0, "cuda -> cpu");
  ckpt_case(&c2, &c2, &g2, 0, "cpu -> cuda");
  dp_config c1 = config(1, DP_MODE_CLASSIC, 0, DP_OPT_ADAMW);
  dp_config g1 = as_cuda(c1, 0);
  dp_config g4 = as_cuda(config(4, DP_MODE_ALLREDUCE, 1, DP_OPT_ADAMW), 0);
  ckpt_case(&c1, &g1, &g4, 0, "cuda 1 device -> cuda 4, allreduce + shard");
  /* into a context whose graphs were captured before the load */
  dp_config gg4 = as_cuda(config(4, DP_MODE_ALLREDUCE, 0, DP_OPT_ADAMW), 1);
  ckpt_case(&c1, &c1, &gg4, 5, "cpu 1 device -> cuda 4 with graphs, after steps");
}
END_TEST

START_TEST(params_and_grads_round_trip) {
  dp_config c = config(4, DP_MODE_ALLREDUCE, 0, DP_OPT_MOMENTUM);
  dp_config g = as_cuda(c, 0);
  rig cpu, cu;
  rig_open(&cpu, MSE_SPEC, &c);
  rig_open(&cu, MSE_SPEC, &g);
  rig *rs[2] = {&cpu, &cu};
  size_t np = n_params(&cu);
  static float p[MAXP], q[MAXP], gc[MAXP], gg[MAXP];
  ck_assert_int_eq(dp_get_grads(cu.c, gg, np), DP_OK);
  for (size_t k = 0; k < np; k++) REQ(gg[k] == 0.0f, "gradient %zu before any step", k);
  ck_assert_int_eq(dp_get_params(cu.c, p, np), DP_OK);
  for (size_t k = 0; k < np; k++) p[k] = p[k] * 0.5f + (float)(k % 5) * 0.03f;
  for (int r = 0; r < 2; r++) ck_assert_int_eq(dp_set_params(rs[r]->c, p, np), DP_OK);
  ck_assert_int_eq(dp_get_params(cu.c, q, np), DP_OK);
  ck_assert(memcmp(p, q, np * 4) == 0);
  for (int round = 0; round < 3; round++) {
    step_all(rs, 2, round, round == 1 ? SHORT : BATCH, "params");
    ck_assert_int_eq(dp_get_grads(cpu.c, gc, np), DP_OK);
    ck_assert_int_eq(dp_get_grads(cu.c, gg, np), DP_OK);
    for (size_t k = 0; k < np; k++)
      REQ(bits(gc[k]) == bits(gg[k]), "round %d: gradient %zu: %.9g vs %.9g", round, k,
          gg[k], gc[k]);
    same_params(rs, 2, "params");
    ck_assert_int_eq(dp_get_params(cu.c, p, np), DP_OK);
    for (size_t k = 0; k < np; k++) p[k] = -p[k];
    for (int r = 0; r < 2; r++) ck_assert_int_eq(dp_set_params(rs[r]->c, p, np), DP_OK);
  }
  /* refusals leave the parameters alone */
  ck_assert_int_eq(dp_get_params(cu.c, p, np), DP_OK);
  memcpy(q, p, np * 4);
  q[3] = INFINITY;
  ck_assert_int_eq(dp_set_params(cu.c, q, np), DP_ERR_NONFINITE);
  ck_assert_int_eq(dp_set_params(cu.c, q, np - 1), DP_ERR_SHAPE);
  ck_assert_int_eq(dp_get_params(cu.c, q, np), DP_OK);
  ck_assert(memcmp(p, q, np * 4) == 0);
  rig_close(&cpu);
  rig_close(&cu);
  expect_clean("after the parameter test");
}
END_TEST

/* ---- guards and high water -------------------------------------------------------------
 */

START_TEST(guards_hold_then_catch_damage_on_the_device) {
  dp_config c = config(2, DP_MODE_CLASSIC, 0, DP_OPT_ADAMW);
  c.guards = 1;
  dp_config g = as_cuda(c, 1);
  rig cpu, cu;
  rig_open(&cpu, CE_SPEC, &c);
  rig_open(&cu, CE_SPEC, &g);
  rig *rs[2] = {&cpu, &cu};
  for (int k = 0; k < 5; k++) {
    step_all(rs, 2, k, k == 2 ? SHORT : BATCH, "guards");
    forward_all(rs, 2, k, BATCH, "guards");
  }
  same_params(rs, 2, "guards");
  ck_assert_msg(dp_ctx_check_guards(cu.c) == DP_OK, "%s", dp_ctx_error(cu.c));
  /* one word just past device 1's gradients: the guard's head */
  dp_region_info gr = dp_plan_region(cu.p, 1, DP_REGION_GRADS);
  size_t bytes = 0;
  unsigned char *arena = fake_cuda_arena(1, 0, &bytes);
  ck_assert_ptr_nonnull(arena);
  ck_assert_uint_ge(bytes, dp_plan_device_bytes(cu.p, 1));
  uint32_t hit = 0x12345678u;
  ck_assert_int_eq(fake_cuda_poke(arena + gr.offset + gr.size, &hit, 4), DP_OK);
  ck_assert_int_eq(dp_ctx_check_guards(cu.c), DP_ERR_CORRUPT);
  const char *e = dp_ctx_error(cu.c);
  ck_assert_msg(strstr(e, "device 1") && strstr(e, "past the end of region 'grads'"), "%s",
                e);
  static batch bt;
  make_batch(&bt, 9);
  ck_assert_int_eq(dp_train_step(cu.c, BATCH, IN, bt.x, bt.label, NULL), DP_ERR_CORRUPT);
  rig_close(&cpu);
  rig_close(&cu);
  /* damage found by the check that ends a step: before device 0's first region */
  rig_open(&cu, CE_SPEC, &g);
  step_one(&cu, 0, BATCH, "guards");
  arena = fake_cuda_arena(0, 0, NULL);
  ck_assert_int_eq(fake_cuda_poke(arena + 8, &hit, 4), DP_OK);
  ck_assert_int_eq(dp_train_step(cu.c, BATCH, IN, bt.x, bt.label, NULL), DP_ERR_CORRUPT);
  ck_assert_msg(strstr(dp_ctx_error(cu.c), "device 0") &&
                    strstr(dp_ctx_error(cu.c), "before the start of region 'params'"),
                "%s", dp_ctx_error(cu.c));
  rig_close(&cu);
  expect_clean("after the guard test");
}
END_TEST

START_TEST(high_water_is_read_through_the_device) {
  for (int guards = 0; guards < 2; guards++) {
    dp_config c = config(2, DP_MODE_ALLREDUCE, 1, DP_OPT_ADAMW);
    c.guards = guards;
    dp_config g = as_cuda(c, 0);
    rig cu;
    rig_open(&cu, CE_SPEC, &g);
    for (int k = 0; k < 3; k++) step_one(&cu, k, BATCH, "high water");
    for (int d = 0; d < 2; d++) {
      size_t total = dp_plan_device_bytes(cu.p, d), hw = dp_ctx_high_water(cu.c, d);
      ck_assert_msg(hw > 0 && hw <= total, "device %d: high water %zu of %zu", d, hw,
                    total);
      /* the double's own scan of the same memory */
      uint32_t *w = malloc(total);
      ck_assert_ptr_nonnull(w);
      ck_assert_int_eq(fake_cuda_peek(w, fake_cuda_arena(d, 0, NULL), total), DP_OK);
      size_t k = total / 4;
      while (k > 0 && w[k - 1] == DP_CANARY) k--;
      free(w);
      ck_assert_msg(hw == k * 4,
                    "guards %d, device %d: high water %zu, the memory says %zu", guards, d,
                    hw, k * 4);
      ck_assert_uint_gt(hw, dp_plan_region(cu.p, d, DP_REGION_OPT_STATE).offset);
    }
    ck_assert_uint_eq(dp_ctx_high_water(cu.c, 2), 0);
    rig_close(&cu);
  }
  expect_clean("after the high-water test");
}
END_TEST

/* ---- refusals --------------------------------------------------------------------- */

START_TEST(refusals_create_nothing) {
  rig r;
  dp_config c = as_cuda(config(2, DP_MODE_CLASSIC, 0, DP_OPT_SGD), 0);
  c.device_ids[1] = 7; /* 4 fake GPUs */
  dp_status s = rig_try(&r, CE_SPEC, &c);
  ck_assert_msg(s != DP_OK && !r.c, "device 7 of 4: %s", dp_status_name(s));
  ck_assert_msg(strstr(dp_last_error(), "cuda device 7"), "%s", dp_last_error());
  rig_close(&r);
  expect_clean("after device 7");

  /* every GPU too small: device 0 is refused first, naming the numbers */
  c = as_cuda(config(2, DP_MODE_CLASSIC, 0, DP_OPT_SGD), 0);
  size_t limit = (size_t)16 << 20;
  fake_cuda_set_free_bytes(-1, limit);
  s = rig_try(&r, CE_SPEC, &c);
  ck_assert_msg(s == DP_ERR_NOMEM && !r.c, "%s: %s", dp_status_name(s), dp_last_error());
  char planned[32], free_b[32];
  snprintf(planned, sizeof planned, "%zu bytes", dp_plan_device_bytes(r.p, 0));
  snprintf(free_b, sizeof free_b, "%zu bytes", limit);
  const char *e = dp_last_error();
  ck_assert_msg(strstr(e, "device 0") && strstr(e, planned) && strstr(e, free_b),
                "want device 0, %s planned, %s free: %s", planned, free_b, e);
  rig_close(&r);
  expect_clean("after the memory refusal");

  /* only GPU 1 too small: device 0's arena was made, and must be gone */
  fake_cuda_reset_config();
  fake_cuda_set_free_bytes(1, limit);
  s = rig_try(&r, CE_SPEC, &c);
  ck_assert_msg(s == DP_ERR_NOMEM && !r.c, "%s: %s", dp_status_name(s), dp_last_error());
  ck_assert_msg(strstr(dp_last_error(), "cuda device 1"), "%s", dp_last_error());
  rig_close(&r);
  expect_clean("after the refusal on GPU 1");

  /* no GPU at all */
  fake_cuda_reset_config();
  fake_cuda_set_gpus(0);
  c = as_cuda(config(1, DP_MODE_CLASSIC, 0, DP_OPT_SGD), 0);
  s = rig_try(&r, CE_SPEC, &c);
  ck_assert_msg(s != DP_OK && !r.c, "no GPU: %s", dp_status_name(s));
  rig_close(&r);
  expect_clean("without GPUs");
}
END_TEST

/* Across processes the planner takes a cuda plan (the backend has ctx_init_world
 * and step_sync) but refuses what cannot cross processes, naming it; such a plan
 * needs dp_ctx_create_mpi. The job itself runs in test_cuda_mpi (tests/mpi). */
START_TEST(ranks_plans_take_nccl_only) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse(CE_SPEC, "ranks", &m), DP_OK);
  dp_config c = as_cuda(config(4, DP_MODE_ALLREDUCE, 0, DP_OPT_SGD), 0);
  c.ranks = 2;
  dp_plan *p = NULL;
  ck_assert_msg(dp_plan_create(m, &c, &p) == DP_OK, "%s", dp_last_error());
  ck_assert_int_eq(dp_plan_ranks(p), 2);
  dp_ctx *x = NULL;
  ck_assert_int_eq(dp_ctx_create(p, &x), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_last_error(), "dp_ctx_create_mpi") && !x, "%s", dp_last_error());
  dp_plan_free(p);
  static const struct {
    int graph;
    dp_transport t;
    int ids_shared;
    const char *says;
  } bad[] = {{1, DP_TRANSPORT_AUTO, 0, "cuda_graph"},
             {0, DP_TRANSPORT_COPY, 0, "transport copy"},
             {0, DP_TRANSPORT_AUTO, 1, "replicas 2 and 3 (rank 1) are both on GPU"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    dp_config b = c;
    b.cuda_graph = bad[i].graph;
    b.transport = bad[i].t;
    if (bad[i].ids_shared) b.device_ids[3] = b.device_ids[2];
    p = NULL;
    dp_status s = dp_plan_create(m, &b, &p);
    ck_assert_msg(s == DP_ERR_INVALID && !p && strstr(dp_last_error(), bad[i].says),
                  "case %zu: %s: %s", i, dp_status_name(s), dp_last_error());
  }
  /* another host's GPU 0 is not this one's: ranks may name the same ids */
  dp_config h = c;
  h.device_ids[2] = 0, h.device_ids[3] = 1;
  ck_assert_msg(dp_plan_create(m, &h, &p) == DP_OK, "%s", dp_last_error());
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* ---- no allocation after create ------------------------------------------------------ */

static void noalloc_case(dp_mode mode, int graph) {
  dp_config g = as_cuda(config(4, mode, mode == DP_MODE_ALLREDUCE, DP_OPT_ADAMW), graph);
  char what[64];
  snprintf(what, sizeof what, "%s, cuda_graph %d", mode_name(mode, g.shard_optimizer),
           graph);
  rig cu;
  rig_open(&cu, CE_SPEC, &g);
  static batch bt;
  static float y[BATCH * OUT];
  make_batch(&bt, 3);
  /* warm-up, not counted: the counted pattern twice, so that every graph
   * shape it uses (steps and forwards, with and without the broadcast) has
   * had its warm-up run and its capture */
  for (int round = 0; round < 2; round++) {
    for (int k = 0; k < 3; k++)
      ck_assert_int_eq(dp_train_step(cu.c, BATCH, IN, bt.x, bt.label, NULL), DP_OK);
    for (int k = 0; k < 3; k++)
      ck_assert_int_eq(dp_forward(cu.c, BATCH, IN, bt.x, y), DP_OK);
  }
  fake_cuda_stats a = fake_cuda_get_stats();
  fake_cuda_reset_counters();
  int bad = 0;
  float loss = 0.0f;
  count_on();
  for (int k = 0; k < 100; k++) {
    int rows = k % 4 == 3 ? SHORT : BATCH;
    bad += dp_train_step(cu.c, rows, IN, bt.x, bt.label, &loss) != DP_OK || !isfinite(loss);
  }
  long n_train = count_off();
  count_on();
  for (int k = 0; k < 100; k++)
    bad += dp_forward(cu.c, k % 3 ? BATCH : TINY, IN, bt.x, y) != DP_OK;
  long n_fwd = count_off();
  fake_cuda_stats b = fake_cuda_get_stats();
  ck_assert_msg(bad == 0, "%s: %d calls failed: %s", what, bad, dp_ctx_error(cu.c));
#ifndef EMUL_NOALLOC_SKIP
  ck_assert_msg(n_train == 0 && n_fwd == 0,
                "%s: allocator calls: %ld in 100 steps, %ld in 100 forwards", what, n_train,
                n_fwd);
#else
  (void)n_train, (void)n_fwd;
#endif
  ck_assert_msg(b.arenas == a.arenas && b.hosts == a.hosts && b.ctxs == a.ctxs &&
                    b.arena_bytes == a.arena_bytes,
                "%s: the double's live allocations changed", what);
  if (graph)
    ck_assert_msg(b.captures == 0 && b.launches >= 140,
                  "%s: %ld captures and %ld launches while counting (want 0, >= 140)", what,
                  b.captures, b.launches);
  else
    ck_assert_int_eq(b.launches, 0);
  rig_close(&cu);
  expect_clean(what);
}

START_TEST(no_allocation_after_create) {
#ifndef EMUL_NOALLOC_SKIP
  /* the counter sees calls at all (through a volatile pointer: not elided) */
  void *(*volatile p_malloc)(size_t) = malloc;
  count_on();
  void *p = p_malloc(24);
  long n = count_off();
  free(p);
  ck_assert_int_eq(n, 1);
#else
  printf("test_cuda_emul: allocator counting skipped (a sanitizer owns the allocator); the "
         "double's own counters are still checked\n");
#endif
  noalloc_case(DP_MODE_CLASSIC, 0);
  noalloc_case(DP_MODE_CLASSIC, 1);
  noalloc_case(DP_MODE_ALLREDUCE, 0);
  noalloc_case(DP_MODE_ALLREDUCE, 1);
}
END_TEST

/* ---- caller-provided memory ---------------------------------------------------------- */

START_TEST(create_static_with_device_memory) {
  dp_config c = config(2, DP_MODE_ALLREDUCE, 1, DP_OPT_ADAMW);
  dp_config g = as_cuda(c, 1);
  rig cpu, cu;
  rig_open(&cpu, CE_SPEC, &c);
  memset(&cu, 0, sizeof cu);
  ck_assert_int_eq(dp_model_parse(CE_SPEC, "emul", &cu.m), DP_OK);
  ck_assert_int_eq(dp_plan_create(cu.m, &g, &cu.p), DP_OK);
  void *arena[2] = {NULL, NULL}, *staging = NULL;
  for (int d = 0; d < 2; d++)
    ck_assert_int_eq(
        dp__cuda_arena_alloc(g.device_ids[d], dp_plan_device_bytes(cu.p, d), &arena[d]),
        DP_OK);
  ck_assert_int_eq(dp__cuda_host_alloc(dp_plan_host_bytes(cu.p), &staging), DP_OK);
  /* refused: arenas on the wrong GPUs, host memory as an arena */
  void *swapped[2] = {arena[1], arena[0]};
  dp_ctx *bad = NULL;
  ck_assert_int_ne(dp_ctx_create_static(cu.p, swapped, staging, &bad), DP_OK);
  ck_assert_ptr_null(bad);
  void *host = aligned_alloc(4096, (dp_plan_device_bytes(cu.p, 0) + 4095) / 4096 * 4096);
  void *mixed[2] = {host, arena[1]};
  ck_assert_int_ne(dp_ctx_create_static(cu.p, mixed, staging, &bad), DP_OK);
  ck_assert_ptr_null(bad);
  free(host);
  ck_assert_int_eq(fake_cuda_get_stats().ctxs, 0);

  dp_status s = dp_ctx_create_static(cu.p, arena, staging, &cu.c);
  ck_assert_msg(s == DP_OK, "%s", dp_last_error());
  rig *rs[2] = {&cpu, &cu};
  for (int k = 0; k < 6; k++) step_all(rs, 2, k, k == 3 ? SHORT : BATCH, "static");
  forward_all(rs, 2, 1, BATCH, "static");
  same_params(rs, 2, "static");
  dp_ctx_free(cu.c);
  cu.c = NULL;
  /* the memory stays the caller's */
  fake_cuda_stats st = fake_cuda_get_stats();
  ck_assert(st.arenas == 2 && st.hosts == 1 && st.ctxs == 0 && st.bad_frees == 0);

  /* staging that is not pinned is refused at create, naming the requirement */
  void *plain = aligned_alloc(4096, (dp_plan_host_bytes(cu.p) + 4095) / 4096 * 4096);
  cu.c = (dp_ctx *)(uintptr_t)1;
  s = dp_ctx_create_static(cu.p, arena, plain, &cu.c);
  ck_assert_msg(s == DP_ERR_INVALID && strstr(dp_last_error(), "not pinned host memory"),
                "%s: %s", dp_status_name(s), dp_last_error());
  ck_assert_ptr_null(cu.c);
  free(plain);

  for (int d = 0; d < 2; d++) dp__cuda_arena_free(g.device_ids[d], arena[d]);
  dp__cuda_host_free(staging);
  rig_close(&cu);
  rig_close(&cpu);
  expect_clean("after the static test");
}
END_TEST

/* ---- faults ----------------------------------------------------------------------------
 * The cuda path's failure handling (lib/core/ctx.c cuda_run): an op that fails to
 * enqueue before the commit phase leaves parameters, optimizer state and the
 * step counter as they were, so the retry and every later step give the bits
 * of a context that never saw the fault; one that fails in the commit phase
 * poisons the context (saving refused) until a checkpoint is loaded. The fault
 * goes to every op of the schedule in turn (dp__ctx_inject_fault). */
START_TEST(injected_faults_change_nothing_or_poison) {
  static const struct {
    int n, shard, graph;
    dp_mode mode;
    dp_optimizer opt;
  } cases[] = {{2, 0, 0, DP_MODE_CLASSIC, DP_OPT_MOMENTUM},
               {2, 0, 1, DP_MODE_CLASSIC, DP_OPT_ADAMW},
               {4, 1, 0, DP_MODE_ALLREDUCE, DP_OPT_ADAMW}};
  char path[64];
  snprintf(path, sizeof path, "/tmp/dp_emul_fault_%ld.ckpt", (long)getpid());
  for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
    dp_config c =
        as_cuda(config(cases[ci].n, cases[ci].mode, cases[ci].shard, cases[ci].opt),
                cases[ci].graph);
    char what[96];
    snprintf(what, sizeof what, "%s, %d devices%s", mode_name(c.mode, c.shard_optimizer),
             c.n_devices, c.cuda_graph ? ", graph" : "");
    rig ref;
    rig_open(&ref, CE_SPEC, &c);
    for (int k = 0; k < 5; k++) step_all((rig *[]){&ref}, 1, k, BATCH, what);
    const dp_op *ops;
    int n_ops, commit;
    ck_assert_int_eq(dp__ctx_schedule(ref.c, BATCH, true, &ops, &n_ops, &commit), DP_OK);
    ck_assert(commit > 0 && commit < n_ops);
    if (getenv("DP_FAULT_REPORT"))
      fprintf(stderr, "faults: %s: %d fault points, %d in the commit phase\n", what, n_ops,
              n_ops - commit);
    static batch bt;
    make_batch(&bt, 2);
    /* one context, brought back to step 2 by a checkpoint before each fault
     * (a load also heals a poisoned context) */
    rig t;
    rig_open(&t, CE_SPEC, &c);
    for (int j = 0; j < 2; j++) step_all((rig *[]){&t}, 1, j, BATCH, what);
    ck_assert_msg(dp_ckpt_save(t.c, path) == DP_OK, "%s", dp_ctx_error(t.c));
    for (int k = 0; k < n_ops; k++) {
      ck_assert_msg(dp_ckpt_load(t.c, path) == DP_OK, "%s", dp_ctx_error(t.c));
      dp__ctx_inject_fault(t.c, k);
      dp_status s = dp_train_step(t.c, BATCH, IN, bt.x, bt.label, NULL);
      ck_assert_msg(s == DP_ERR_BACKEND && strstr(dp_ctx_error(t.c), "injected fault"),
                    "%s: fault at op %d of %d: %s: %s", what, k, n_ops, dp_status_name(s),
                    dp_ctx_error(t.c));
      ck_assert_int_eq(dp_ctx_step(t.c), 2);
      if (k < commit) {
        for (int j = 2; j < 5; j++) step_all((rig *[]){&t}, 1, j, BATCH, what);
        same_params2(&ref, &t, what);
      } else {
        s = dp_train_step(t.c, BATCH, IN, bt.x, bt.label, NULL);
        ck_assert_msg(s != DP_OK && strstr(dp_ctx_error(t.c), "unusable"),
                      "%s: fault at op %d (commit phase from %d): not poisoned: %s", what,
                      k, commit, dp_ctx_error(t.c));
        char other[80];
        snprintf(other, sizeof other, "%s.poisoned", path);
        ck_assert_int_ne(dp_ckpt_save(t.c, other), DP_OK);
      }
    }
    rig_close(&t);
    rig_close(&ref);
  }
  unlink(path);
  expect_clean("after the fault tests");
}
END_TEST

/* ---- batchnorm against the cpu backend ---------------------------------------------
 * The wiring of cuda/backend.cu's batchnorm: the planner accepts it for cuda,
 * the ops of both modes reach the backend (per_replica's statistics slot per
 * micro-batch, sync's partials, merges, final statistics and backward sums,
 * and the gradient of a sync batchnorm's output kept for all of a device's
 * rows), and the running statistics move on device 0 in the commit phase,
 * refused with the step, and reach the replicas for eval forwards. The double
 * runs the cpu ops, so every mismatch here is an address or an order. */
/* 1d after a linear */
static const char BN_1D_SPEC[] = "input 12\nlinear 16\nbatchnorm\nrelu\nlinear 5\n"
                                 "loss softmax_cross_entropy\n";
/* 2d after a conv (4 x 7 x 6), the image layers around it */
static const char BN_2D_SPEC[] = "input 2 7 6\nconv2d 4 3 padding 1\nbatchnorm\nrelu\n"
                                 "maxpool2d 2\nflatten\nlinear 5\n"
                                 "loss softmax_cross_entropy\n";
/* two of them, 2d then 1d, mse */
static const char BN_TWO_SPEC[] =
    "input 1 3 4\nconv2d 3 2 padding 1\nbatchnorm\nrelu\n"
    "maxpool2d 2 stride 1\nflatten\nlinear 8\nbatchnorm\ntanh\n"
    "linear 5\nloss mse\n";
enum { BN_MAXC = 16 };

/* Every batchnorm layer's running statistics and count, bit for bit. */
static void same_running_stats(rig *a, rig *b, const char *what) {
  int n = 0;
  for (int i = 0; i < dp_model_n_layers(a->m); i++) {
    if (dp_model_layer_kind(a->m, i) != DP_LAYER_BATCHNORM) continue;
    int C = a->m->layers[i].c;
    ck_assert_int_le(C, BN_MAXC);
    float ma[BN_MAXC], va[BN_MAXC], mb[BN_MAXC], vb[BN_MAXC];
    int64_t na = -1, nb = -2;
    ck_assert_msg(dp_get_running_stats(a->c, i, ma, va, &na) == DP_OK, "%s: %s", what,
                  dp_ctx_error(a->c));
    ck_assert_msg(dp_get_running_stats(b->c, i, mb, vb, &nb) == DP_OK, "%s: %s", what,
                  dp_ctx_error(b->c));
    ck_assert_msg(na == nb, "%s: layer %d: num_batches_tracked %lld vs %lld", what, i,
                  (long long)na, (long long)nb);
    for (int k = 0; k < C; k++) {
      REQ(bits(ma[k]) == bits(mb[k]), "%s: layer %d: running_mean[%d] %.9g vs %.9g", what,
          i, k, ma[k], mb[k]);
      REQ(bits(va[k]) == bits(vb[k]), "%s: layer %d: running_var[%d] %.9g vs %.9g", what, i,
          k, va[k], vb[k]);
    }
    n++;
  }
  ck_assert_int_gt(n, 0);
}

/* Steps on both rigs with the row counts of `rows` (short batches: a short
 * last micro-batch), each followed by an eval forward of another row count
 * (the running statistics): losses, outputs, parameters and running
 * statistics bit for bit. */
static void bn_steps(rig *cu, rig *cpu, int k0, int steps, const char *what) {
  static cnn_batch bt;
  static float y0[BATCH * OUT], y1[BATCH * OUT];
  static const int rows[] = {BATCH, 30, BATCH, SHORT, TINY, 27};
  int mse = dp_model_loss(cu->m) == DP_LOSS_MSE, in = dp_model_input_width(cu->m);
  ck_assert_int_le(in, CNN_MAXIN);
  for (int k = k0; k < k0 + steps; k++) {
    make_cnn_batch(&bt, k);
    int n = rows[k % 6];
    float l0 = -1.0f, l1 = -2.0f;
    const void *t = mse ? (const void *)bt.target : (const void *)bt.label;
    dp_status s0 = dp_train_step(cu->c, n, in, bt.x, t, &l0);
    dp_status s1 = dp_train_step(cpu->c, n, in, bt.x, t, &l1);
    ck_assert_msg(s0 == DP_OK && s1 == DP_OK, "%s: step %d (%d rows): cuda %s, cpu %s: %s",
                  what, k, n, dp_status_name(s0), dp_status_name(s1),
                  s0 ? dp_ctx_error(cu->c) : dp_ctx_error(cpu->c));
    ck_assert_msg(bits(l0) == bits(l1), "%s: step %d (%d rows): loss %.9g vs cpu %.9g",
                  what, k, n, l0, l1);
    int fr = rows[(k + 1) % 6];
    memset(y0, 0xff, sizeof y0);
    memset(y1, 0xff, sizeof y1);
    ck_assert_msg(dp_forward(cu->c, fr, in, bt.x, y0) == DP_OK, "%s: forward: %s", what,
                  dp_ctx_error(cu->c));
    ck_assert_msg(dp_forward(cpu->c, fr, in, bt.x, y1) == DP_OK, "%s: forward: %s", what,
                  dp_ctx_error(cpu->c));
    for (int i = 0; i < BATCH * OUT; i++)
      REQ(bits(y0[i]) == bits(y1[i]), "%s: forward %d of %d rows, output %d: %.9g vs %.9g",
          what, k, fr, i, y0[i], y1[i]);
  }
  same_params2(cu, cpu, what);
  same_running_stats(cu, cpu, what);
}

static const struct {
  const char *spec, *name;
} bn_specs[] = {{BN_1D_SPEC, "bn 1d"}, {BN_2D_SPEC, "bn 2d"}, {BN_TWO_SPEC, "bn two"}};

START_TEST(batchnorm_matches_cpu_bit_for_bit) {
  static const struct {
    int n;
    dp_mode mode;
    int shard, graph, mb;
    dp_optimizer opt;
  } cfgs[] = {{1, DP_MODE_CLASSIC, 0, 0, MB, DP_OPT_ADAMW},
              {2, DP_MODE_CLASSIC, 0, 0, MB, DP_OPT_MOMENTUM},
              {4, DP_MODE_CLASSIC, 0, 0, 5, DP_OPT_SGD}, /* a short last micro-batch */
              {2, DP_MODE_ALLREDUCE, 0, 0, MB, DP_OPT_ADAMW},
              {4, DP_MODE_ALLREDUCE, 1, 0, 5, DP_OPT_ADAMW},
              {4, DP_MODE_CLASSIC, 0, 1, MB, DP_OPT_MOMENTUM}, /* captured and replayed */
              {2, DP_MODE_ALLREDUCE, 0, 1, MB, DP_OPT_ADAMW}};
  int runs = 0;
  for (int bn = 0; bn < 2; bn++)
    for (size_t si = 0; si < sizeof bn_specs / sizeof *bn_specs; si++)
      for (size_t ci = 0; ci < sizeof cfgs / sizeof *cfgs; ci++) {
        dp_config c = config(cfgs[ci].n, cfgs[ci].mode, cfgs[ci].shard, cfgs[ci].opt);
        c.batchnorm = bn ? DP_BN_SYNC : DP_BN_PER_REPLICA;
        c.micro_batch = cfgs[ci].mb;
        dp_config g = as_cuda(c, cfgs[ci].graph);
        char what[160];
        snprintf(what, sizeof what, "%s, %s, %s, %d devices, micro-batch %d%s",
                 bn_specs[si].name, dp_bn_mode_name(c.batchnorm),
                 mode_name(c.mode, c.shard_optimizer), c.n_devices, c.micro_batch,
                 cfgs[ci].graph ? ", cuda_graph" : "");
        rig cu, cpu;
        rig_open(&cu, bn_specs[si].spec, &g);
        rig_open(&cpu, bn_specs[si].spec, &c);
        ck_assert_int_eq(dp_plan_n_devices(cu.p), cfgs[ci].n);
        same_params2(&cu, &cpu, what);
        same_running_stats(&cu, &cpu, what); /* PyTorch's defaults on both */
        bn_steps(&cu, &cpu, 0, 7, what);
        rig_close(&cu);
        rig_close(&cpu);
        expect_clean(what);
        runs++;
      }
  /* inference plans: the running statistics (PyTorch's defaults) */
  for (size_t si = 0; si < sizeof bn_specs / sizeof *bn_specs; si++) {
    dp_config c = config(3, DP_MODE_CLASSIC, 0, DP_OPT_SGD);
    c.inference = 1;
    char what[160];
    snprintf(what, sizeof what, "%s, inference plan", bn_specs[si].name);
    cnn_both(bn_specs[si].spec, &c, 0, 0, what);
    expect_clean(what);
    runs++;
  }
  ck_assert_int_eq(runs, 45);
}
END_TEST

/* A step refused on the device (NaN input: the loss is NaN) moves no running
 * statistic, in either mode, plain and replayed, as on the cpu; training
 * then goes on as on the cpu. */
START_TEST(batchnorm_refused_step_keeps_running_stats) {
  for (int bn = 0; bn < 2; bn++)
    for (int graph = 0; graph < 2; graph++) {
      dp_config c = config(2, graph ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC, 0, DP_OPT_ADAMW);
      c.batchnorm = bn ? DP_BN_SYNC : DP_BN_PER_REPLICA;
      dp_config g = as_cuda(c, graph);
      char what[96];
      snprintf(what, sizeof what, "%s, %s, cuda_graph %d", dp_bn_mode_name(c.batchnorm),
               mode_name(c.mode, 0), graph);
      rig cu, cpu;
      rig_open(&cu, BN_TWO_SPEC, &g);
      rig_open(&cpu, BN_TWO_SPEC, &c);
      bn_steps(&cu, &cpu, 0, 3, what);
      const int layer = 6; /* the second batchnorm, 8 channels */
      float m0[8], v0[8], m1[8], v1[8];
      int64_t n0 = -1, n1 = -2;
      ck_assert_int_eq(dp_get_running_stats(cu.c, layer, m0, v0, &n0), DP_OK);
      ck_assert_int_eq(n0, 3);
      static cnn_batch bt;
      make_cnn_batch(&bt, 3);
      int in = dp_model_input_width(cu.m);
      bt.x[5 * in + 2] = NAN;
      for (int r = 0; r < 2; r++) {
        rig *x = r ? &cpu : &cu;
        dp_status s = dp_train_step(x->c, BATCH, in, bt.x, bt.target, NULL);
        ck_assert_msg(s == DP_ERR_NONFINITE, "%s: %s: %s: %s", what, r ? "cpu" : "cuda",
                      dp_status_name(s), dp_ctx_error(x->c));
      }
      ck_assert_int_eq(dp_ctx_step(cu.c), 3);
      ck_assert_int_eq(dp_get_running_stats(cu.c, layer, m1, v1, &n1), DP_OK);
      ck_assert_int_eq(n1, 3);
      for (int k = 0; k < 8; k++)
        REQ(bits(m0[k]) == bits(m1[k]) && bits(v0[k]) == bits(v1[k]),
            "%s: channel %d's running statistics moved in a refused step", what, k);
      same_running_stats(&cu, &cpu, what);
      bn_steps(&cu, &cpu, 4, 3, what);
      rig_close(&cu);
      rig_close(&cpu);
      expect_clean(what);
    }
}
END_TEST

/* Checkpoints carry the running statistics between the backends and device
 * counts: the cuda backend saves, the cpu backend (or a cuda context with
 * other devices and graphs, after steps of its own) loads, and both go on
 * with the same bits as a cpu context that never stopped. */
START_TEST(batchnorm_checkpoints_move_between_backends) {
  for (int bn = 0; bn < 2; bn++)
    for (int to_cuda = 0; to_cuda < 2; to_cuda++) {
      dp_config c = config(2, DP_MODE_CLASSIC, 0, DP_OPT_ADAMW);
      c.batchnorm = bn ? DP_BN_SYNC : DP_BN_PER_REPLICA;
      dp_config src_cfg = as_cuda(c, 0);
      dp_config ref_cfg = config(1, DP_MODE_CLASSIC, 0, DP_OPT_ADAMW);
      ref_cfg.batchnorm = c.batchnorm;
      dp_config dst_cfg = to_cuda
                              ? as_cuda(config(4, DP_MODE_ALLREDUCE, 1, DP_OPT_ADAMW), 1)
                              : config(4, DP_MODE_ALLREDUCE, 0, DP_OPT_ADAMW);
      dst_cfg.batchnorm = c.batchnorm;
      char what[96], path[64];
      snprintf(what, sizeof what, "%s, cuda 2 devices -> %s 4 devices",
               dp_bn_mode_name(c.batchnorm), to_cuda ? "cuda (graphs)" : "cpu");
      tmp_path(path, sizeof path);
      rig src, ref, dst;
      rig_open(&src, BN_TWO_SPEC, &src_cfg);
      rig_open(&ref, BN_TWO_SPEC, &ref_cfg);
      rig_open(&dst, BN_TWO_SPEC, &dst_cfg);
      bn_steps(&src, &ref, 0, 4, what); /* same bits for 1 and 2 devices */
      for (int k = 40; k < 42; k++) {   /* steps of its own, replayed from the second on */
        static cnn_batch bt;
        make_cnn_batch(&bt, k);
        ck_assert_msg(dp_train_step(dst.c, BATCH, dp_model_input_width(dst.m), bt.x,
                                    bt.target, NULL) == DP_OK,
                      "%s: %s", what, dp_ctx_error(dst.c));
      }
      ck_assert_msg(dp_ckpt_save(src.c, path) == DP_OK, "%s: save: %s", what,
                    dp_ctx_error(src.c));
      ck_assert_msg(dp_ckpt_load(dst.c, path) == DP_OK, "%s: load: %s", what,
                    dp_ctx_error(dst.c));
      same_running_stats(&dst, &ref, what);
      bn_steps(&dst, &ref, 4, 4, what);
      rig_close(&src);
      rig_close(&ref);
      rig_close(&dst);
      unlink(path);
      expect_clean(what);
    }
}
END_TEST

/* ---- suites ---------------------------------------------------------------------------
 */

static void fresh(void) {
  fake_cuda_reset_config();
  fake_cuda_reset_counters();
}

static TCase *tcase(const char *name) {
  TCase *tc = tcase_create(name);
  tcase_add_checked_fixture(tc, fresh, NULL);
  tcase_set_timeout(tc, 300);
  return tc;
}

static Suite *fake_cuda_suite(void) {
  Suite *s = suite_create("fake_cuda");
  TCase *tc = tcase("double");
  tcase_add_test(tc, arena_memory_is_not_host_addressable);
  tcase_add_test(tc, memory_calls_translate_and_refuse);
  tcase_add_test(tc, init_validates_like_context_cu);
  tcase_add_test(tc, hooks_out_of_order_are_wiring_bugs);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *cuda_emul_suite(void) {
  Suite *s = suite_create("cuda_emul");
  TCase *tc = tcase("steps");
  tcase_add_test(tc, training_matches_cpu_bit_for_bit);
  tcase_add_test(tc, forward_and_short_batches_match_cpu);
  tcase_add_test(tc, every_cross_device_copy_has_its_peer_call);
  tcase_add_test(tc, fast_collectives_allreduce);
  suite_add_tcase(s, tc);
  tc = tcase("images");
  tcase_add_test(tc, image_layers_match_cpu_bit_for_bit);
  tcase_add_test(tc, conv_workspace_follows_cublas_and_is_checked);
  suite_add_tcase(s, tc);
  tc = tcase("batchnorm");
  tcase_add_test(tc, batchnorm_matches_cpu_bit_for_bit);
  tcase_add_test(tc, batchnorm_refused_step_keeps_running_stats);
  tcase_add_test(tc, batchnorm_checkpoints_move_between_backends);
  suite_add_tcase(s, tc);
  tc = tcase("graphs");
  tcase_add_test(tc, graph_replay_equals_plain_and_cpu);
  tcase_add_test(tc, graph_short_batches_run_plain);
  tcase_add_test(tc, graph_launch_failure_poisons_instead_of_rerunning);
  tcase_add_test(tc, set_lr_reaches_plain_steps_and_graph_replays);
  tcase_add_test(tc, graph_capture_failure_falls_back_to_plain);
  tcase_add_test(tc, graph_allreduce_after_set_params);
  suite_add_tcase(s, tc);
  tc = tcase("nonfinite");
  tcase_add_test(tc, nonfinite_input_refuses_the_step);
  tcase_add_test(tc, nonfinite_input_is_skipped_under_skip);
  tcase_add_test(tc, nonfinite_update_is_refused_like_the_cpu);
  suite_add_tcase(s, tc);
  tc = tcase("state");
  tcase_add_test(tc, checkpoints_move_between_backends_and_device_counts);
  tcase_add_test(tc, params_and_grads_round_trip);
  tcase_add_test(tc, guards_hold_then_catch_damage_on_the_device);
  tcase_add_test(tc, high_water_is_read_through_the_device);
  suite_add_tcase(s, tc);
  tc = tcase("faults");
  tcase_add_test(tc, injected_faults_change_nothing_or_poison);
  suite_add_tcase(s, tc);
  tc = tcase("resources");
  tcase_add_test(tc, refusals_create_nothing);
  tcase_add_test(tc, ranks_plans_take_nccl_only);
  tcase_add_test(tc, no_allocation_after_create);
  tcase_add_test(tc, create_static_with_device_memory);
  suite_add_tcase(s, tc);
  return s;
}

Suite *cuda_api_suite(void);   /* tests/test_cuda_api.c, here on the emulated GPU */
Suite *cuda_fault_suite(void); /* tests/test_cuda_fault.c, likewise */

int main(void) {
  /* cuda/vtable.c's registration, over the emulated GPU's dp_cuda.h */
  if (dp_cuda_register() != DP_OK) {
    fprintf(stderr, "dp_cuda_register: %s\n", dp_last_error());
    return 1;
  }
  SRunner *sr = srunner_create(fake_cuda_suite());
  srunner_add_suite(sr, cuda_emul_suite());
  srunner_add_suite(sr, cuda_api_suite());
  srunner_add_suite(sr, cuda_fault_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
