/* The executor: walks the static schedule. Device 0's ops run on the calling
 * thread, every other device's on its own persistent worker; all meet at a
 * barrier after each stage. Nothing here allocates: the workers and their
 * state are made once by dp__exec_init. */
#include "core/exec.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spin a short while, then sleep on the condition variable: cheap when the
 * devices are busy on their own cores, and quick to free the core when a
 * device is late, so that the operating system can move the late device's
 * thread there (docs/PERFORMANCE.md, session 16). No sched_yield: on a
 * shared machine it hands the core to other work, which may keep it for a
 * whole time slice. The last thread in takes the mutex only when someone sleeps: a
 * sleeper counts itself before it reads gen, and the releaser bumps gen
 * before it reads the count (both sequentially consistent), so either the
 * sleeper sees the new gen or the releaser sees the sleeper. */
#define SPIN_NS 50000u /* ~50 us of spinning before sleeping */

static uint64_t mono_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void barrier_wait(dp_barrier *b) {
  unsigned gen = atomic_load_explicit(&b->gen, memory_order_acquire);
  if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) == b->n - 1) {
    atomic_store_explicit(&b->count, 0, memory_order_relaxed);
    atomic_fetch_add(&b->gen, 1);
    if (atomic_load(&b->sleepers) > 0) {
      pthread_mutex_lock(&b->mu);
      pthread_cond_broadcast(&b->cv);
      pthread_mutex_unlock(&b->mu);
    }
    return;
  }
  uint64_t t0 = mono_ns();
  for (unsigned i = 1;; i++) {
    if (atomic_load_explicit(&b->gen, memory_order_acquire) != gen) return;
    CPU_RELAX();
    if (i % 64 == 0 && mono_ns() - t0 > SPIN_NS) break;
  }
  pthread_mutex_lock(&b->mu);
  atomic_fetch_add(&b->sleepers, 1);
  while (atomic_load(&b->gen) == gen) pthread_cond_wait(&b->cv, &b->mu);
  atomic_fetch_sub(&b->sleepers, 1);
  pthread_mutex_unlock(&b->mu);
}

/* ---- the profile ----------------------------------------------------------------
 * Off (x->prof NULL) each hook is one test. A worker writes events only
 * between a run's release and its last barrier, while the caller cannot be
 * changing the buffer; its wait at that last barrier is recorded by device
 * 0's thread, which leaves the barrier last or with it (arrive_ns). */
uint64_t dp__now_ns(void) { return mono_ns(); }

/* The calling thread's CPU time (what it ran, preemption left out). */
static uint64_t cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

void dp__exec_profile(dp_exec *x, dp_prof_event *ev, size_t cap) {
  x->prof = ev;
  x->prof_cap = ev ? cap : 0;
  atomic_store(&x->prof_n, 0);
  atomic_store(&x->prof_dropped, 0);
}

void dp__exec_prof_add(dp_exec *x, const dp_prof_event *ev) {
  if (!x->prof) return;
  size_t i = atomic_fetch_add_explicit(&x->prof_n, 1, memory_order_relaxed);
  if (i < x->prof_cap)
    x->prof[i] = *ev;
  else
    atomic_fetch_add_explicit(&x->prof_dropped, 1, memory_order_relaxed);
}

/* An event's start: wall and thread CPU time; {0, 0} when the profile is off. */
typedef struct {
  uint64_t wall, cpu;
} prof_mark;

/* The CPU interval inside the wall one: wall first, then CPU; at the end CPU,
 * then wall (so that an op's CPU time is never more than its wall time). */
static prof_mark prof_start(const dp_exec *x) {
  prof_mark m = {0, 0};
  if (x->prof) {
    m.wall = mono_ns();
    m.cpu = cpu_ns();
  }
  return m;
}

static void prof_op(dp_exec *x, int dev, int k, const dp_op *op, bool shared, prof_mark m) {
  if (!x->prof) return;
  uint64_t cpu = cpu_ns() - m.cpu;
  dp_prof_event ev = {.t0_ns = m.wall,
                      .cpu_ns = cpu,
                      .t1_ns = mono_ns(),
                      .what = DP_PROF_EVENT_OP,
                      .kind = op->kind,
                      .phase = op->phase,
                      .shared = shared,
                      .thread = (int16_t)dev,
                      .device = op->device,
                      .layer = op->layer,
                      .op = k};
  dp__exec_prof_add(x, &ev);
}

static void prof_wait(dp_exec *x, int dev, int phase, uint64_t t0, uint64_t t1) {
  dp_prof_event ev = {.t0_ns = t0,
                      .t1_ns = t1,
                      .what = DP_PROF_EVENT_BARRIER,
                      .phase = (uint8_t)phase,
                      .thread = (int16_t)dev,
                      .device = -1,
                      .layer = -1,
                      .op = -1};
  dp__exec_prof_add(x, &ev);
}

/* A barrier inside a run, timed; phase: the phase of the ops it follows. */
static void wait_at(dp_exec *x, int dev, int phase) {
  uint64_t t0 = x->prof ? mono_ns() : 0;
  barrier_wait(&x->bar);
  if (t0) prof_wait(x, dev, phase, t0, dp__now_ns());
}

/* A run's last barrier: device 0's thread records every thread's wait. */
static void wait_last(dp_exec *x, int dev, int phase) {
  if (!x->prof) {
    barrier_wait(&x->bar);
    return;
  }
  uint64_t t0 = dp__now_ns();
  if (dev != x->dev0) x->arrive_ns[dev] = t0;
  barrier_wait(&x->bar); /* past it, a worker must not touch the buffer */
  if (dev != x->dev0) return;
  uint64_t t1 = dp__now_ns();
  x->last_release_ns = t1; /* the workers' next wait for a job starts after it */
  prof_wait(x, dev, phase, t0, t1);
  for (int d = x->dev0 + 1; d < x->dev0 + x->n_devices; d++)
    prof_wait(x, d, phase, x->arrive_ns[d], t1);
}

static bool skipped(const dp_exec_env *e, const dp_op *op) {
  return op->kind == DP_OP_COPY && op->phase == DP_PHASE_BROADCAST && e->skip_broadcast;
}

/* Bytes that cross a device boundary go to the transport, the rest to the
 * backend. */
static dp_status run_op(dp_exec *x, const dp_op *op) {
  dp_exec_env *e = x->env;
  if (op->kind == DP_OP_COPY)
    return skipped(e, op) ? DP_OK : x->transport->copy(x->tctx, e, op->device, op);
  if (op->kind == DP_OP_COPY_ADD)
    return x->transport->copy_add
               ? x->transport->copy_add(x->tctx, e, op->device, op)
               : DP_FAIL(DP_ERR_BACKEND, "the %s transport cannot add in place",
                         x->transport->name);
  if (op->kind == DP_OP_ALLREDUCE)
    return x->transport->collective
               ? x->transport->collective(x->tctx, e, op->device, op)
               : DP_FAIL(DP_ERR_BACKEND, "the %s transport has no collectives",
                         x->transport->name);
  return x->backend->run(x->bctx, e, op);
}

/* A two-sided transport's half of a copy that another device executes, on
 * the thread of `dev`, the copy's other endpoint. */
static bool is_peer(const dp_exec *x, const dp_op *op, int dev) {
  return x->transport->peer && op->kind == DP_OP_COPY && op->device != dev &&
         (op->src_dev == dev || op->dst_dev == dev) && !skipped(x->env, op);
}

static dp_status run_peer(dp_exec *x, const dp_op *op, int dev) {
  return x->transport->peer(x->tctx, x->env, dev, op);
}

/* ---- work sharing --------------------------------------------------------------
 * In classic mode the reduction, the check and the update run on device 0
 * while the others wait at the stage's barrier, and the broadcast on the
 * replicas while device 0 waits. Elementwise work has no order: every element
 * is computed by the same IEEE operations whichever thread computes it, so an
 * op may be cut into element ranges run by every device's thread, with a
 * barrier after it, without changing a bit. That needs a synchronous backend
 * (an op has done its work when it returns; no stage hooks) whose devices and
 * transport live in this one address space (the backend's own transport: no
 * world around it, no two-sided halves, no flush), and whose run() accepts
 * such an op on a sub-range (the cpu backend: its ops address parameters,
 * gradients and optimizer state by the op's offsets). The other threads start
 * their ranges as soon as they reach the op in the list, so an op is shared
 * only while no device it touches has run an op of its own earlier in the
 * stage (whose results it might read before they are written: the backward's
 * gradient adds after the device's layer ops); the reductions, checks,
 * updates and broadcasts open their stages. Classic mode's loss op, the whole
 * gathered batch on device 0 while the others would wait, is cut by
 * micro-batches instead: each micro-batch's sum and gradient rows are computed
 * whole by one thread in their order (loss_sum adds the sums later in the
 * canonical tree). The decision depends only on the
 * op list and the executor, so every device makes the same one, and every
 * device meets the op's barrier, a failed one too. */
#define SHARE_MIN_BYTES ((size_t)128 * 1024) /* smaller ops: the barrier costs more */
/* a loss of fewer output bytes: the barrier costs more than its exps save */
#define SHARE_LOSS_MIN_BYTES ((size_t)64 * 1024)
#define SHARE_ALIGN ((size_t)64)             /* ranges start on cache lines */
/* a device's range in chunks that the others take when done with theirs */
#define SHARE_CHUNKS 16
#define SHARE_CHUNK_MIN ((size_t)16 * 1024)

/* A backend that says its devices are host memory of this process (the
 * registry checks it has none of the hooks work sharing cannot keep), with its
 * own transport (not a world's, which crosses processes). */
static bool share_capable(const dp_exec *x) {
  const dp_backend_ops *b = x->backend;
  return x->n_devices > 1 && b->host_memory && x->transport == b->transport &&
         x->transport->copy;
}

static bool local_end(const dp_exec *x, int dev) {
  return dev == DP_HOST || (dev >= x->dev0 && dev < x->dev0 + x->n_devices);
}

bool dp__exec_share_kind(const dp_op *op, bool classic) {
  if (op->kind == DP_OP_LOSS) /* by micro-batches: each sum one thread's */
    return classic && op->n_mb > 1 && op->bytes >= SHARE_LOSS_MIN_BYTES;
  if (op->bytes < SHARE_MIN_BYTES || op->bytes % 4) return false;
  switch ((dp_op_kind)op->kind) {
  case DP_OP_GRAD_ADD: return !(op->flags & DP_OPF_SRC_BF16); /* src offsets halve */
  case DP_OP_COPY:
  case DP_OP_COPY_ADD:
  case DP_OP_ZERO:
  case DP_OP_GRAD_CHECK:
  case DP_OP_OPTIMIZER: return true;
  default: return false;
  }
}

/* An op of a kind and size that work sharing cuts into ranges (when
 * shared_op's other conditions hold too): a copy between this process's
 * memories only. */
static bool shareable(const dp_exec *x, const dp_op *op) {
  if (!x->share || !dp__exec_share_kind(op, x->share_loss)) return false;
  return op->kind != DP_OP_COPY || (local_end(x, op->src_dev) && local_end(x, op->dst_dev));
}

/* busy[d]: device dev0 + d has run an op of its own earlier in this stage. */
static bool shared_op(const dp_exec *x, const dp_op *op, int k, int inject,
                      const bool *busy) {
  if (k == inject || !shareable(x, op) || skipped(x->env, op)) return false;
  int ends[3] = {op->device, op->src_dev, op->dst_dev};
  for (int i = 0; i < 3; i++)
    if (ends[i] != DP_HOST && local_end(x, ends[i]) && busy[ends[i] - x->dev0])
      return false;
  return true;
}

/* ---- barriers left out -----------------------------------------------------------
 * The devices meet at the end of a stage only when the next stage needs it
 * (dp__exec_sync): when one of its ops touches memory that ops another thread
 * ran since the last meeting wrote, or writes memory they read. What an op
 * touches, by region: a copy its two ends (an in-place add reads its
 * destination too); a compute op only its own device's memory (a backend
 * addresses no other): a forward pass writes activations, outputs and
 * workspace, a backward pass those (outputs read) and the output gradients
 * and gradients, both read parameters and inputs; the gradient check only
 * reads; any other op may read and write every region but the parameters
 * (which the optimizer and batchnorm's running statistics write).
 * A shared op runs on every thread. After a failure the devices stop at the
 * first stage after it that they reach: what they ran meanwhile touches
 * nothing another device is using, and a stage that writes the state a
 * refused step keeps (parameters, gradients, optimizer state) always starts
 * with a meeting, so that every device has seen the failures before it. */

#define ALL_REGIONS ((uint32_t)((1u << DP_REGION_COUNT) - 1))
#define R(region) (1u << DP_REGION_##region)

typedef struct {
  int slot[2];         /* local device, or n_devices for the host; -1: unused */
  uint32_t r[2], w[2]; /* regions read and written there */
} footprint;

static int slot_of(const dp_exec *x, int dev) {
  return dev == DP_HOST ? x->n_devices : dev - x->dev0;
}

static footprint footprint_of(const dp_exec *x, const dp_plan *p, const dp_op *op) {
  footprint f = {.slot = {-1, -1}};
  if (op->kind == DP_OP_COPY || op->kind == DP_OP_COPY_ADD) {
    /* a copy's ends are its devices' own (plan verification refuses one that
     * names a replica's shared parameters) */
    f.slot[0] = slot_of(x, op->src_dev);
    f.r[0] = 1u << op->src_region;
    f.slot[1] = slot_of(x, op->dst_dev);
    f.w[1] = 1u << op->dst_region;
    if (op->kind == DP_OP_COPY_ADD) f.r[1] = f.w[1];
    return f;
  }
  f.slot[0] = slot_of(x, op->device);
  f.r[0] = f.w[0] = ALL_REGIONS;
  switch ((dp_op_kind)op->kind) {
  case DP_OP_FORWARD: /* never the loss's, the optimizer's or the reduction's */
    f.w[0] = R(ACTIVATIONS) | R(OUTPUTS) | R(WORKSPACE);
    f.r[0] = f.w[0] | R(PARAMS) | R(INPUTS);
    break;
  case DP_OP_BACKWARD:
    f.w[0] = R(ACTIVATIONS) | R(OUTPUT_GRADS) | R(GRADS) | R(GRAD_PARTIALS) | R(WORKSPACE);
    f.r[0] = f.w[0] | R(PARAMS) | R(INPUTS) | R(OUTPUTS);
    break;
  case DP_OP_GRAD_CHECK: f.w[0] = 0; break; /* it only reads */
  case DP_OP_OPTIMIZER:
  case DP_OP_BN_UPDATE: break;
  default: f.w[0] &= ~R(PARAMS); break;
  }
  int home = dp__param_home(p, op->device);
  if (home != op->device) { /* shared parameters: they lie on another device */
    f.slot[1] = slot_of(x, home);
    f.r[1] = f.r[0] & R(PARAMS);
    f.w[1] = f.w[0] & R(PARAMS);
    f.r[0] &= ~R(PARAMS);
    f.w[0] &= ~R(PARAMS);
  }
  return f;
}

/* Whether op, on thread t (-1: every thread), touches what the other
 * threads' ops since the last meeting touched in a conflicting way. */
static bool conflicts(const dp_exec *x, const footprint *f, int t) {
  for (int u = 0; u < x->n_devices; u++) {
    if (u == t) continue;
    for (int i = 0; i < 2; i++) {
      int e = f->slot[i];
      if (e < 0) continue;
      if ((f->w[i] & (x->win_r[u][e] | x->win_w[u][e])) || (f->r[i] & x->win_w[u][e]))
        return true;
    }
  }
  return false;
}

/* What a refused step leaves as it was (RELIABILITY.md): an op that writes it
 * waits until every device has seen the failures of the stages before. */
static bool writes_kept(const footprint *f) {
  return ((f->w[0] | f->w[1]) & (R(PARAMS) | R(GRADS) | R(OPT_STATE))) != 0;
}

static void touch(dp_exec *x, const footprint *f, int t) {
  for (int u = t < 0 ? 0 : t; u < (t < 0 ? x->n_devices : t + 1); u++)
    for (int i = 0; i < 2; i++)
      if (f->slot[i] >= 0) {
        x->win_r[u][f->slot[i]] |= f->r[i];
        x->win_w[u][f->slot[i]] |= f->w[i];
      }
}

static void forget(dp_exec *x) {
  for (int u = 0; u < x->n_devices; u++) {
    memset(x->win_r[u], 0, (size_t)(x->n_devices + 1) * sizeof **x->win_r);
    memset(x->win_w[u], 0, (size_t)(x->n_devices + 1) * sizeof **x->win_w);
  }
}

#undef R

void dp__exec_sync(dp_exec *x, const dp_plan *p, const dp_op *ops, int n_ops,
                   uint8_t *sync) {
  int n_stages = n_ops ? ops[n_ops - 1].stage + 1 : 0;
  memset(sync, 1, (size_t)n_stages);
  if (!x->share) return;
  forget(x);
  for (int k = 0; k < n_ops;) {
    int s = ops[k].stage, end = k;
    while (end < n_ops && ops[end].stage == s) end++;
    if (s > 0) {
      bool meet = false;
      for (int i = k; i < end && !meet; i++) {
        footprint f = footprint_of(x, p, &ops[i]);
        meet = writes_kept(&f) ||
               conflicts(x, &f, shareable(x, &ops[i]) ? -1 : slot_of(x, ops[i].device));
      }
      sync[s - 1] = meet;
      if (meet) forget(x);
    }
    for (int i = k; i < end; i++) {
      footprint f = footprint_of(x, p, &ops[i]);
      touch(x, &f, shareable(x, &ops[i]) ? -1 : slot_of(x, ops[i].device));
    }
    k = end;
  }
}

/* Device dev's part of a shared loss op: its micro-batches [m0, m1), as an
 * op; false when it has none. */
static bool loss_part(const dp_exec *x, const dp_op *op, int dev, dp_op *part) {
  size_t n = (size_t)x->n_devices, j = (size_t)(dev - x->dev0);
  *part = *op;
  size_t per = ((size_t)op->n_mb + n - 1) / n, m = (size_t)op->n_mb;
  size_t m0 = j * per < m ? j * per : m, m1 = m0 + per < m ? m0 + per : m;
  part->micro_batch += (int)m0;
  part->n_mb = (int)(m1 - m0);
  return m1 > m0;
}

/* Chunk c of range r of a shared elementwise op, as an op (bytes [b0, b1));
 * false past the range's last chunk. Range r is device dev0 + r's: its own
 * cache holds what it touched there in the ops before. */
static bool chunk_part(const dp_exec *x, const dp_op *op, size_t r, size_t c, dp_op *part) {
  size_t n = (size_t)x->n_devices;
  size_t per = (op->bytes + n - 1) / n;
  per = (per + SHARE_ALIGN - 1) / SHARE_ALIGN * SHARE_ALIGN;
  size_t chunk =
      per / SHARE_CHUNKS > SHARE_CHUNK_MIN ? per / SHARE_CHUNKS : SHARE_CHUNK_MIN;
  chunk = (chunk + SHARE_ALIGN - 1) / SHARE_ALIGN * SHARE_ALIGN;
  size_t r0 = r * per < op->bytes ? r * per : op->bytes;
  size_t r1 = r0 + per < op->bytes ? r0 + per : op->bytes;
  if (c >= (r1 - r0 + chunk - 1) / chunk) return false;
  size_t b0 = r0 + c * chunk, b1 = b0 + chunk < r1 ? b0 + chunk : r1;
  *part = *op;
  part->src_offset += b0;
  part->dst_offset += b0;
  part->bytes = b1 - b0;
  return true;
}

/* Records the first failure of device dev: at schedule index k, or in the
 * stage hook of stage `hook_stage` (-1: an op). */
static void note(dp_exec *x, int dev, int k, int stage, int hook_stage, dp_status st) {
  if (!st || x->status[dev]) return;
  int prev = atomic_load(&x->fail_stage);
  while (stage < prev && !atomic_compare_exchange_weak(&x->fail_stage, &prev, stage)) {
  }
  x->status[dev] = st;
  x->fail_op[dev] = k;
  x->fail_hook[dev] = hook_stage;
  snprintf(x->errmsg[dev], sizeof x->errmsg[dev], "%s", dp_last_error());
}

/* Device dev's work on a shared elementwise op: the chunks of its own range,
 * then those the other devices have not taken of theirs (claim[r]: range r's
 * chunks taken), so that a device late to the op, or slower at it (writing
 * lines another core holds), delays it by one chunk at most. Every element
 * is computed by the same operations whichever thread takes it. */
static void run_chunks(dp_exec *x, const dp_op *op, int k, int s, int dev,
                       atomic_int *claim, bool *bad) {
  size_t n = (size_t)x->n_devices, j = (size_t)(dev - x->dev0);
  prof_mark m = prof_start(x);
  for (size_t q = 0; q < n; q++) {
    size_t r = (j + q) % n;
    dp_op part;
    for (int c; (c = atomic_fetch_add_explicit(&claim[r], 1, memory_order_relaxed)) >= 0 &&
                chunk_part(x, op, r, (size_t)c, &part);) {
      dp_status st = run_op(x, &part);
      /* a check's message names the first bad element of the whole op: the
       * op's device runs it again whole (it only reads) */
      if (st && op->kind == DP_OP_GRAD_CHECK)
        bad[dev] = true;
      else
        note(x, dev, k, s, -1, st);
    }
  }
  prof_op(x, dev, k, op, true, m); /* one event a thread, whatever it took */
}

/* One device's share of the current job. */
static void run_device(dp_exec *x, int dev) {
  /* Read the job once: after this device's last barrier the caller may already
   * be writing the next job into x. */
  const dp_op *ops = x->ops;
  const uint8_t *sync = x->sync;
  int k = x->lo, hi = x->hi, s1 = x->s1, inject = x->inject_at;
  const dp_backend_ops *b = x->backend;
  const dp_transport_ops *t = x->transport;
  bool two_sided = t->peer != NULL, all_copies = t->complete_after_failure;
  int seq = 0; /* shared ops met in this run */
  bool busy[DP_MAX_DEVICES];
  for (int s = x->s0; s <= s1; s++) {
    memset(busy, 0, sizeof busy);
    /* A failure in an earlier stage, which every device sees alike (one in
     * this stage may or may not be visible yet). */
    bool stopped = atomic_load(&x->fail_stage) < s;
    bool started = false; /* transfers to complete before a compute op */
    /* The hooks run for every stage, after a failure too: an asynchronous
     * backend must close what its stage_begin opened. */
    if (b->stage_begin) note(x, dev, k, s, s, b->stage_begin(x->bctx, dev, s));
    for (; k < hi && ops[k].stage == s; k++) {
      const dp_op *op = &ops[k];
      /* (a COPY_ADD reads and writes this process's memory when it runs, like
       * a compute op: no other side waits for it) */
      bool xfer = op->kind == DP_OP_COPY || op->kind == DP_OP_ALLREDUCE;
      /* After a failure no op of a later stage starts, and no compute op at
       * all. With a two-sided transport the copies and collectives of the
       * failing stage still run on every side: a send whose receive was
       * skipped, or a collective a rank never entered, would never complete;
       * across processes (complete_after_failure) every later copy too, as
       * the other process cannot know of the failure before the run ends. */
      bool failed = atomic_load_explicit(&x->fail_stage, memory_order_relaxed) != INT_MAX;
      /* A gradient check runs after a failure in its own stage too: it only
       * reads what earlier stages wrote, and the failure reported is the
       * first in the schedule, not the first in time, so the error names the
       * same element however the threads ran (allreduce mode checks each
       * device's segment, in ascending order). */
      if (op->kind == DP_OP_GRAD_CHECK) failed = false;
      if (!shared_op(x, op, k, inject, busy)) {
        int ends[3] = {op->device, op->src_dev, op->dst_dev};
        for (int i = 0; i < 3; i++)
          if (ends[i] != DP_HOST && local_end(x, ends[i])) busy[ends[i] - x->dev0] = true;
      } else {
        int slot = seq++ & 1;
        bool *bad = x->part_bad[slot];
        dp_op part;
        if (!stopped && !failed && op->kind != DP_OP_LOSS) {
          run_chunks(x, op, k, s, dev, x->part_claim[slot], bad);
        } else if (!stopped && !failed && loss_part(x, op, dev, &part)) {
          prof_mark m = prof_start(x);
          note(x, dev, k, s, -1, run_op(x, &part));
          prof_op(x, dev, k, op, true, m);
        }
        wait_at(x, dev, op->phase);
        /* the op's device clears the slot for the shared op after next: every
         * device has left this one's chunks, and none can reach that one
         * before the next shared op's barrier */
        if (op->device == dev) {
          bool any = false;
          for (int d = x->dev0; d < x->dev0 + x->n_devices; d++) {
            any |= bad[d];
            bad[d] = false;
          }
          for (int r = 0; r < x->n_devices; r++)
            atomic_store_explicit(&x->part_claim[slot][r], 0, memory_order_relaxed);
          if (any) note(x, dev, k, s, -1, run_op(x, op));
        }
        continue;
      }
      if (!(xfer && all_copies) && (stopped || (failed && !(two_sided && xfer)))) continue;
      bool mine = op->device == dev, peer = !mine && is_peer(x, op, dev);
      if (!mine && !peer) continue;
      if (!xfer && started && t->flush) {
        note(x, dev, k, s, -1, t->flush(x->tctx, x->env, dev));
        started = false;
      }
      if (k == inject && (mine || all_copies)) {
        /* the fault hook: the op fails; a transfer another process waits
         * for still moves its bytes first */
        if (xfer && all_copies) (void)(mine ? run_op(x, op) : run_peer(x, op, dev));
        if (mine) note(x, dev, k, s, -1, DP_FAIL(DP_ERR_BACKEND, "injected fault"));
      } else if (k != inject || all_copies) {
        prof_mark m = prof_start(x);
        note(x, dev, k, s, -1, mine ? run_op(x, op) : run_peer(x, op, dev));
        prof_op(x, dev, k, op, false, m);
      }
      started |= xfer;
    }
    if (started && t->flush) note(x, dev, k, s, -1, t->flush(x->tctx, x->env, dev));
    if (b->stage_end) note(x, dev, k, s, s, b->stage_end(x->bctx, dev, s));
    int phase = ops[k - 1].phase; /* the stage's (k > lo: a stage has ops) */
    if (s == s1)
      wait_last(x, dev, phase);
    else if (!sync || sync[s])
      wait_at(x, dev, phase);
  }
}

static void *worker_main(void *arg) {
  dp_worker *w = arg;
  dp_exec *x = w->exec;
  for (;;) {
    uint64_t t0 = dp__now_ns(); /* (profiled or not: known only after the release) */
    barrier_wait(&x->bar);      /* wait for a job */
    if (atomic_load(&x->quit)) return NULL;
    /* (device 0's thread recorded this thread's wait at the last barrier up
     * to last_release_ns, which it may have taken after this thread left) */
    if (x->prof)
      prof_wait(x, w->dev, DP_PHASE_COUNT,
                t0 > x->last_release_ns ? t0 : x->last_release_ns, dp__now_ns());
    run_device(x, w->dev);
  }
}

dp_status dp__exec_init(dp_exec *x, int dev0, int n_devices, const dp_backend_ops *b,
                        void *bctx, const dp_transport_ops *t, void *tctx) {
  memset(x, 0, sizeof *x);
  x->dev0 = dev0;
  x->n_devices = n_devices;
  x->backend = b;
  x->bctx = bctx;
  x->transport = t;
  x->tctx = tctx;
  x->inject_at = -1;
  x->share = share_capable(x);
  x->bar.n = n_devices;
  pthread_mutex_init(&x->bar.mu, NULL);
  pthread_cond_init(&x->bar.cv, NULL);
  for (int d = 1; d < n_devices; d++) {
    x->workers[d] = (dp_worker){.exec = x, .dev = dev0 + d};
    int rc = pthread_create(&x->workers[d].thread, NULL, worker_main, &x->workers[d]);
    if (rc) {
      x->n_devices = d; /* only these exist; shut them down */
      x->bar.n = d;
      dp__exec_destroy(x);
      return DP_FAIL(DP_ERR_NOMEM, "cannot start the worker of device %d: %s", d,
                     strerror(rc));
    }
    x->n_threads = d;
  }
  return DP_OK;
}

void dp__exec_destroy(dp_exec *x) {
  if (x->n_threads > 0) {
    atomic_store(&x->quit, 1);
    barrier_wait(&x->bar);
    for (int d = 1; d <= x->n_threads; d++) pthread_join(x->workers[d].thread, NULL);
  }
  x->n_threads = 0;
  pthread_mutex_destroy(&x->bar.mu);
  pthread_cond_destroy(&x->bar.cv);
}

/* "device 0 params", "host inputs" */
static void endpoint_name(char *buf, size_t cap, int dev, int region) {
  if (dev == DP_HOST)
    snprintf(buf, cap, "host %s",
             region == DP_REGION_INPUTS    ? "inputs"
             : region == DP_REGION_TARGETS ? "targets"
                                           : "outputs");
  else
    snprintf(buf, cap, "device %d %s", dev, dp_region_name((dp_region)region));
}

/* What an op is, for error messages: "backward layer 2 (linear), micro-batch
 * 3", "reduce copy of 48 bytes, device 1 grads -> device 0 comm". */
static void describe_op(const dp_plan *p, const dp_op *op, char *buf, size_t cap) {
  const char *ph = dp_phase_name((dp_phase)op->phase),
             *kind = dp_op_kind_name((dp_op_kind)op->kind);
  char src[48], dst[48];
  switch ((dp_op_kind)op->kind) {
  case DP_OP_COPY:
    endpoint_name(src, sizeof src, op->src_dev, op->src_region);
    endpoint_name(dst, sizeof dst, op->dst_dev, op->dst_region);
    snprintf(buf, cap, "%s copy of %zu bytes, %s -> %s", ph, op->bytes, src, dst);
    return;
  case DP_OP_COPY_ADD:
    endpoint_name(src, sizeof src, op->src_dev, op->src_region);
    endpoint_name(dst, sizeof dst, op->dst_dev, op->dst_region);
    snprintf(buf, cap, "%s %s of %zu bytes, %s += %s", ph, kind, op->bytes, dst, src);
    return;
  case DP_OP_FORWARD:
  case DP_OP_BACKWARD:
    snprintf(buf, cap, "%s layer %d (%s), micro-batch %d", kind, op->layer,
             op->layer >= 0 && op->layer < p->model.n_layers
                 ? dp_layer_kind_name(p->model.layers[op->layer].kind)
                 : "?",
             op->micro_batch);
    return;
  case DP_OP_LOSS:
    snprintf(buf, cap, "loss of micro-batches %d..%d", op->micro_batch,
             op->micro_batch + op->n_mb - 1);
    return;
  default: snprintf(buf, cap, "%s %s", ph, kind); return;
  }
}

dp_status dp__exec_run(dp_exec *x, dp_exec_env *env, const dp_op *ops, const uint8_t *sync,
                       int n_ops, int lo, int hi, int inject_at) {
  if (lo >= hi || x->n_devices == 0) return DP_OK;
  x->env = env;
  x->ops = ops;
  x->sync = sync;
  x->lo = lo;
  x->hi = hi;
  x->s0 = ops[lo].stage;
  x->s1 = ops[hi - 1].stage;
  x->inject_at = inject_at;
  atomic_store(&x->fail_stage, INT_MAX);
  x->first_fail = -1;
  int d0 = x->dev0, d1 = x->dev0 + x->n_devices;
  for (int d = d0; d < d1; d++) x->status[d] = DP_OK;
  if (x->n_devices > 1) wait_at(x, d0, DP_PHASE_COUNT); /* release the workers */
  run_device(x, d0);
  if (atomic_load(&x->fail_stage) == INT_MAX) return DP_OK;
  /* Report the failure that comes first in the schedule. */
  int first = -1;
  for (int d = d0; d < d1; d++)
    if (x->status[d] && (first < 0 || x->fail_op[d] < x->fail_op[first])) first = d;
  x->first_fail = x->fail_op[first];
  char what[160];
  if (x->fail_hook[first] >= 0)
    return dp__error(x->status[first], __FILE__, __LINE__,
                     "device %d, stage %d of the %s backend: %s", first,
                     x->fail_hook[first], x->backend->name, x->errmsg[first]);
  describe_op(env->plan, &ops[x->fail_op[first]], what, sizeof what);
  return dp__error(x->status[first], __FILE__, __LINE__, "device %d, op %d of %d (%s): %s",
                   first, x->fail_op[first], n_ops, what, x->errmsg[first]);
}
