/* Kernel execution in the CUDA simulation: a launch's blocks run one after the
 * other on the stream's worker thread, each block's GPU threads as fibers of it,
 * scheduled cooperatively: a thread runs until it finishes, reaches
 * __syncthreads (which releases when every live thread of the block is there) or
 * a warp shuffle (which releases when every lane its mask names is there).
 * DP_SIM_ORDER (ascending, the default; reverse; shuffle, keyed by DP_SIM_SEED)
 * sets the order of a launch's blocks and of the threads each scheduling round
 * starts or resumes: a GPU promises neither, so code that needs one fails. A
 * fault (an access outside every mapping, including the guard pages around each
 * allocation) ends the kernel: it is reported with the kernel, block and thread,
 * and the device is poisoned as a GPU's context is by an illegal address. */
#include "sim.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define STACK_BYTES (256u << 10)
#define MAX_THREADS 1024

thread_local dp_sim_thread_view *dp_sim_view;

/* ---- context switch (x86-64 System V; ucontext elsewhere) ------------------------- */

#if defined(__x86_64__)
/* swap_x86_64.S: saves the callee-saved registers, MXCSR and the x87 control word
 * on the current stack, stores its pointer in *save_sp and resumes to_sp. */
extern "C" void dp_sim_swap(void **save_sp, void *to_sp);
#else
#include <ucontext.h>
#endif

enum { F_NEW, F_RUN, F_WAIT_BLOCK, F_WAIT_WARP, F_DONE };

struct fiber {
  int state;
  int tid;
  int stack; /* index of its stack while it has one */
#if defined(__x86_64__)
  void *sp;
#else
  ucontext_t uc;
#endif
  dp_sim_thread_view view;
  unsigned gen; /* the barrier generation it waits to pass */
};

struct warp_state {
  unsigned count, gen, mask;
  uint64_t slot[2][32];
};

/* One worker's block in flight. */
struct block_rt {
  fiber f[MAX_THREADS];
  unsigned char *stacks; /* MAX_THREADS stacks, each below a guard page */
  int free_stack[MAX_THREADS];
  int n_free;
  int n, live;
  unsigned bar_count, bar_gen;
  warp_state warp[MAX_THREADS / 32];
  int order[MAX_THREADS]; /* the threads in this round's order */
  uint64_t rng;           /* the shuffle's state for this block */
  int cur;
#if defined(__x86_64__)
  void *sched_sp;
#else
  ucontext_t sched;
#endif
  dp_sim_op *op;
  sigjmp_buf fault_jmp;
  volatile sig_atomic_t in_kernel;
  bool failed;
};

static thread_local block_rt *rt;

__attribute__((noinline)) static block_rt *runtime(void) {
  if (rt) return rt;
  block_rt *b = (block_rt *)mmap(NULL, sizeof(block_rt), PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  /* one mapping for every stack (a guard page each would cost 1024 mappings per
   * worker, and Linux allows 65530 a process); a canary at each stack's bottom
   * catches an overflow instead */
  unsigned char *st =
      (unsigned char *)mmap(NULL, (size_t)STACK_BYTES * MAX_THREADS, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (b == MAP_FAILED || st == MAP_FAILED) {
    dp_sim_report("cannot map fiber stacks");
    abort();
  }
  b->stacks = st;
  rt = b;
  return b;
}

#define CANARY 0x5ca1ab1edeadbeefull

static unsigned char *stack_top(block_rt *b, int i) {
  uint64_t *bottom = (uint64_t *)(b->stacks + (size_t)i * STACK_BYTES);
  bottom[0] = CANARY;
  return b->stacks + (size_t)(i + 1) * STACK_BYTES;
}
static bool stack_intact(block_rt *b, int i) {
  return *(uint64_t *)(b->stacks + (size_t)i * STACK_BYTES) == CANARY;
}

static void to_scheduler(block_rt *b, fiber *f) {
#if defined(__x86_64__)
  dp_sim_swap(&f->sp, b->sched_sp);
#else
  swapcontext(&f->uc, &b->sched);
#endif
  dp_sim_view = &f->view;
}

static void fiber_main(void) {
  block_rt *b = rt;
  fiber *f = &b->f[b->cur];
  dp_sim_view = &f->view;
  b->op->u.k.body(b->op->args);
  f->state = F_DONE;
  b->live--;
  /* a thread that exits counts as arrived at the block's barrier */
  if (b->bar_count && b->bar_count >= (unsigned)b->live) {
    b->bar_count = 0;
    b->bar_gen++;
  }
  to_scheduler(b, f);
  abort(); /* never resumed */
}

#if defined(__x86_64__)
static void start_fiber(block_rt *b, fiber *f, unsigned char *top) {
  uint64_t *sp = (uint64_t *)((uintptr_t)top & ~(uintptr_t)15);
  *--sp = 0;                             /* fiber_main's return address: none */
  *--sp = (uint64_t)fiber_main;          /* dp_sim_swap's ret goes here */
  for (int i = 0; i < 6; i++) *--sp = 0; /* rbp rbx r12-r15 */
  *--sp = 0x037f00001f80ull;             /* mxcsr (low), x87 control word (high) */
  f->sp = sp;
  dp_sim_swap(&b->sched_sp, f->sp);
}
static void resume_fiber(block_rt *b, fiber *f) { dp_sim_swap(&b->sched_sp, f->sp); }
#else
static void start_fiber(block_rt *b, fiber *f, unsigned char *top) {
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = top - STACK_BYTES;
  f->uc.uc_stack.ss_size = STACK_BYTES;
  f->uc.uc_link = NULL;
  makecontext(&f->uc, fiber_main, 0);
  swapcontext(&b->sched, &f->uc);
}
static void resume_fiber(block_rt *b, fiber *f) { swapcontext(&b->sched, &f->uc); }
#endif

static bool runnable(block_rt *b, fiber *f) {
  switch (f->state) {
  case F_NEW:
  case F_RUN: return true;
  case F_WAIT_BLOCK: return b->bar_gen != f->gen;
  case F_WAIT_WARP: return b->warp[f->tid / 32].gen != f->gen;
  default: return false;
  }
}

static const char *kernel_name(const dp_sim_op *op) {
  return op->u.k.name ? op->u.k.name : "?";
}

/* ---- execution order ----------------------------------------------------------------- */

enum { ORDER_ASCENDING, ORDER_REVERSE, ORDER_SHUFFLE };
struct order_cfg {
  int mode;
  uint64_t seed;
};

/* Read once (a C++ static's initialisation is thread-safe); a value the simulation
 * does not know aborts rather than silently running the default order. */
static const order_cfg &order(void) {
  static const order_cfg cfg = [] {
    order_cfg c = {ORDER_ASCENDING, 1};
    const char *o = getenv("DP_SIM_ORDER"), *sd = getenv("DP_SIM_SEED");
    if (o && *o && strcmp(o, "ascending")) {
      if (!strcmp(o, "reverse"))
        c.mode = ORDER_REVERSE;
      else if (!strcmp(o, "shuffle"))
        c.mode = ORDER_SHUFFLE;
      else {
        dp_sim_report("DP_SIM_ORDER=%s: not ascending, reverse or shuffle", o);
        abort();
      }
    }
    if (sd && *sd) c.seed = strtoull(sd, NULL, 0);
    return c;
  }();
  return cfg;
}

static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A launch's key: the seed, the kernel, its geometry and the worker's launch count
 * (a stream's ops run in issue order, so the same program gets the same keys). */
static uint64_t launch_key(const dp_sim_op *op) {
  static thread_local uint64_t launches;
  uint64_t h = mix64(order().seed ^ ++launches);
  for (const char *c = op->u.k.name; c && *c; c++) h = mix64(h ^ (unsigned char)*c);
  const uint3 g = op->u.k.grid, bd = op->u.k.block;
  return mix64(h ^ g.x ^ ((uint64_t)g.y << 20) ^ ((uint64_t)g.z << 40) ^
               mix64(bd.x ^ (bd.y << 10) ^ (bd.z << 20)));
}

/* The i-th block of n to run: a keyed permutation of [0, n) without memory (no
 * allocation per launch): a Feistel network on the next even power of two, walking
 * the cycle until the value falls inside. */
static uint64_t block_at(uint64_t i, uint64_t n, uint64_t key) {
  switch (order().mode) {
  case ORDER_ASCENDING: return i;
  case ORDER_REVERSE: return n - 1 - i;
  }
  int half = 1;
  while ((1ull << (2 * half)) < n) half++;
  uint64_t m = (1ull << half) - 1;
  do {
    uint64_t l = i >> half, r = i & m;
    for (int round = 0; round < 4; round++) {
      uint64_t t = l ^ (mix64((key + (uint64_t)round * 0x100000001b3ull) ^ r) & m);
      l = r;
      r = t;
    }
    i = l << half | r;
  } while (i >= n);
  return i;
}

/* Sets b->order for the next scheduling round. */
static void order_threads(block_rt *b) {
  for (int i = 0; i < b->n; i++)
    b->order[i] = order().mode == ORDER_REVERSE ? b->n - 1 - i : i;
  if (order().mode != ORDER_SHUFFLE) return;
  for (int i = b->n - 1; i > 0; i--) { /* Fisher-Yates */
    b->rng = mix64(b->rng);
    int j = (int)(b->rng % (uint64_t)(i + 1)), t = b->order[i];
    b->order[i] = b->order[j];
    b->order[j] = t;
  }
}

/* Runs one block to completion; false if its threads can never all finish. */
static bool run_block(block_rt *b, uint3 bid) {
  const dp_sim_op *op = b->op;
  dim3 bd(op->u.k.block.x, op->u.k.block.y, op->u.k.block.z);
  b->n = (int)(bd.x * bd.y * bd.z);
  b->live = b->n;
  b->bar_count = b->bar_gen = 0;
  b->n_free = 0;
  for (int i = MAX_THREADS - 1; i >= 0; i--) b->free_stack[b->n_free++] = i;
  for (int w = 0; w < (b->n + 31) / 32; w++) b->warp[w].count = b->warp[w].gen = 0;
  for (int t = 0; t < b->n; t++) {
    fiber *f = &b->f[t];
    f->state = F_NEW;
    f->tid = t;
    f->stack = -1;
    f->view.thread_idx = {(unsigned)t % bd.x, (unsigned)t / bd.x % bd.y,
                          (unsigned)t / (bd.x * bd.y)};
    f->view.block_idx = bid;
    f->view.block_dim = bd;
    f->view.grid_dim = dim3(op->u.k.grid.x, op->u.k.grid.y, op->u.k.grid.z);
  }
  while (b->live > 0) {
    bool progressed = false;
    order_threads(b);
    for (int k = 0; k < b->n; k++) {
      int t = b->order[k];
      fiber *f = &b->f[t];
      if (!runnable(b, f)) continue;
      progressed = true;
      b->cur = t;
      if (f->state == F_NEW) {
        f->stack = b->free_stack[--b->n_free];
        f->state = F_RUN;
        start_fiber(b, f, stack_top(b, f->stack));
      } else {
        f->state = F_RUN;
        resume_fiber(b, f);
      }
      if (f->state == F_DONE) b->free_stack[b->n_free++] = f->stack;
      if (!stack_intact(b, f->stack)) {
        dp_sim_report("kernel %s: thread %d overflowed its %u KiB stack", kernel_name(op),
                      t, STACK_BYTES >> 10);
        return false;
      }
      if (b->failed) return false;
    }
    if (!progressed) {
      int t = 0;
      while (t < b->n && b->f[t].state == F_DONE) t++;
      dp_sim_report("kernel %s: block (%u,%u,%u) can never finish: thread %d waits at %s "
                    "that not every thread reaches",
                    kernel_name(op), bid.x, bid.y, bid.z, t,
                    b->f[t].state == F_WAIT_WARP ? "a warp shuffle" : "__syncthreads");
      return false;
    }
  }
  return true;
}

extern "C" void dp_sim_syncthreads(void) {
  block_rt *b = rt;
  fiber *f = &b->f[b->cur];
  if (++b->bar_count >= (unsigned)b->live) {
    b->bar_count = 0;
    b->bar_gen++;
    return;
  }
  f->gen = b->bar_gen;
  f->state = F_WAIT_BLOCK;
  to_scheduler(b, f);
}

extern "C" uint64_t dp_sim_shfl(unsigned mask, uint64_t v, int how, int arg, int width) {
  block_rt *b = rt;
  fiber *f = &b->f[b->cur];
  int w = f->tid / 32, lane = f->tid % 32;
  warp_state *ws = &b->warp[w];
  int lanes = b->n - w * 32 < 32 ? b->n - w * 32 : 32;
  unsigned exist = lanes == 32 ? ~0u : ((1u << lanes) - 1);
  if (!(mask >> lane & 1u) || (mask & ~exist) || width < 1 || width > 32 ||
      (width & (width - 1))) {
    dp_sim_report("kernel %s: thread %d: warp shuffle with mask 0x%08x, width %d, in a "
                  "warp of %d lanes",
                  kernel_name(b->op), f->tid, mask, width, lanes);
    b->failed = true;
    to_scheduler(b, f);
  }
  unsigned parity = ws->gen & 1u;
  ws->slot[parity][lane] = v;
  if (ws->count == 0)
    ws->mask = mask;
  else if (ws->mask != mask) {
    dp_sim_report("kernel %s: thread %d: warp shuffle masks differ (0x%08x, 0x%08x)",
                  kernel_name(b->op), f->tid, ws->mask, mask);
    b->failed = true;
    to_scheduler(b, f);
  }
  if (++ws->count == (unsigned)__builtin_popcount(mask)) {
    ws->count = 0;
    ws->gen++;
  } else {
    f->gen = ws->gen;
    f->state = F_WAIT_WARP;
    to_scheduler(b, f);
  }
  int base = lane / width * width, src = lane;
  switch (how) {
  case DP_SIM_SHFL_IDX: src = base + (arg % width + width) % width; break;
  case DP_SIM_SHFL_XOR: src = lane ^ arg; break;
  case DP_SIM_SHFL_DOWN: src = lane - base + arg < width ? lane + arg : lane; break;
  case DP_SIM_SHFL_UP: src = lane - base >= arg ? lane - arg : lane; break;
  }
  if (src < 0 || src >= 32 || !(mask >> src & 1u)) return v; /* outside: own value */
  return ws->slot[parity][src];
}

extern "C" void dp_sim_nanosleep(unsigned ns) {
  struct timespec ts = {0, (long)ns};
  nanosleep(&ts, NULL);
}

/* ---- faults ------------------------------------------------------------------------ */

static struct sigaction old_segv, old_bus;

static void on_fault(int sig, siginfo_t *si, void *uc) {
  block_rt *b = rt;
  if (b && b->in_kernel) {
    b->in_kernel = 0;
    fiber *f = &b->f[b->cur];
    dp_sim_report(
        "kernel %s: illegal address %p (outside every allocation, or in the guard "
        "pages around one) at block (%u,%u,%u) thread (%u,%u,%u)",
        kernel_name(b->op), si->si_addr, f->view.block_idx.x, f->view.block_idx.y,
        f->view.block_idx.z, f->view.thread_idx.x, f->view.thread_idx.y,
        f->view.thread_idx.z);
    siglongjmp(b->fault_jmp, 1);
  }
  struct sigaction *old = sig == SIGSEGV ? &old_segv : &old_bus;
  sigaction(sig, old, NULL); /* not ours: the default (or previous) action */
  (void)uc;
}

static void install_handlers(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, [] {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
  });
}

bool dp_sim_run_kernel(dp_sim_op *op, int dev) {
  install_handlers();
  block_rt *b = runtime();
  b->op = op;
  b->failed = false;
  uint3 g = op->u.k.grid;
  if (sigsetjmp(b->fault_jmp, 1)) {
    b->in_kernel = 0;
    dp_sim_poison(dev, cudaErrorIllegalAddress);
    return false;
  }
  b->in_kernel = 1;
  uint64_t n = (uint64_t)g.x * g.y * g.z, key = launch_key(op);
  for (uint64_t i = 0; i < n; i++) {
    uint64_t id = block_at(i, n, key);
    uint3 bid = {(unsigned)(id % g.x), (unsigned)(id / g.x % g.y),
                 (unsigned)(id / g.x / g.y)};
    b->rng = mix64(key ^ id);
    if (!run_block(b, bid)) {
      b->in_kernel = 0;
      dp_sim_poison(dev, cudaErrorLaunchFailure);
      return false;
    }
  }
  b->in_kernel = 0;
  return true;
}

void dp_sim_report(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  /* one write: reports of several workers do not interleave */
  char line[1100];
  int n = snprintf(line, sizeof line, "cuda-sim: %s\n", buf);
  if (n > 0) {
    ssize_t w = write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    (void)w;
  }
}
