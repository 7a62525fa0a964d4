/* The executor's state (lib/core/exec.c). */
#ifndef DP_EXEC_H
#define DP_EXEC_H

#include "core/backend.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct {
  atomic_int count;
  atomic_uint gen;
  atomic_int sleepers; /* threads that sleep on cv, or are about to */
  int n;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} dp_barrier;

typedef struct dp_exec dp_exec;

typedef struct {
  dp_exec *exec;
  int dev;
  pthread_t thread;
} dp_worker;

struct dp_exec {
  int dev0, n_devices, n_threads; /* runs devices [dev0, dev0 + n_devices) */
  const dp_backend_ops *backend;
  void *bctx;
  const dp_transport_ops *transport;
  void *tctx;
  dp_worker workers[DP_MAX_DEVICES];
  dp_barrier bar;
  atomic_int quit;
  atomic_int fail_stage; /* the earliest stage with a failure; INT_MAX: none */
  /* the current job: ops [lo, hi) of a schedule, which cover stages
   * [s0, s1]; the op at schedule index inject_at fails (test hook, -1: off) */
  dp_exec_env *env;
  const dp_op *ops;
  const uint8_t *sync; /* NULL: the devices meet after every stage */
  int lo, hi, s0, s1, inject_at;
  /* per device outcome */
  dp_status status[DP_MAX_DEVICES];
  int fail_op[DP_MAX_DEVICES];   /* schedule index */
  int fail_hook[DP_MAX_DEVICES]; /* the stage whose hook failed; -1: an op */
  char errmsg[DP_MAX_DEVICES][DP_ERRMSG_CAP];
  int first_fail; /* after a failed run: the schedule index it reported */
  /* Work sharing (exec.c): a synchronous backend whose devices all live in
   * this address space runs a large elementwise op (a copy, a gradient add,
   * the check, the update) on every device's thread, each an element range,
   * with a barrier after it, each its range first, then what is left of the
   * others' (by chunks). part_bad[slot][dev]: device dev found a bad
   * element in a check, for the shared op of parity slot. */
  bool share;
  /* ... and a loss op of several micro-batches (classic mode's, on the
   * gathered batch; set by the context) by micro-batches: each one's sum is
   * one thread's, in its order */
  bool share_loss;
  bool part_bad[2][DP_MAX_DEVICES];
  /* part_claim[slot][r]: the chunks of device dev0 + r's range taken so far */
  atomic_int part_claim[2][DP_MAX_DEVICES];
  /* dp__exec_sync's scratch: per thread, the regions (bit per dp_region) of
   * each device (and, last, of the host) that its ops since the last barrier
   * read and wrote */
  uint32_t win_r[DP_MAX_DEVICES][DP_MAX_DEVICES + 1],
      win_w[DP_MAX_DEVICES][DP_MAX_DEVICES + 1];
  /* the profile (dp_ctx_profile): the caller's buffer, NULL when off; set
   * between runs only, so the workers read it after a barrier */
  dp_prof_event *prof;
  size_t prof_cap;
  atomic_size_t prof_n, prof_dropped;
  uint64_t arrive_ns[DP_MAX_DEVICES]; /* a worker's arrival at a run's last barrier */
  uint64_t last_release_ns;           /* when device 0's thread left it */
};

/* Devices [dev0, dev0 + n_devices) of the plan (this process's): dev0 runs
 * on the calling thread, each other on a worker of its own. */
/* Whether op is of a kind and size that the executor of a host_memory backend
 * cuts into element ranges run by every device thread of its process (work
 * sharing; a copy only between that process's memories); classic: the plan's
 * mode (its loss is shared by micro-batches). dp_plan_fit's cost model counts
 * such an op on every device of a one-process job. */
bool dp__exec_share_kind(const dp_op *op, bool classic);
dp_status dp__exec_init(dp_exec *x, int dev0, int n_devices, const dp_backend_ops *b,
                        void *bctx, const dp_transport_ops *t, void *tctx);
void dp__exec_destroy(dp_exec *x);
/* Runs ops [lo, hi) of a schedule (whole stages: the ops of one stage are
 * all in or all out) to completion; once an op fails, no op of a later stage
 * starts (but the copies, with a transport that must complete them). On failure, the error
 * of the failing op that comes first in the schedule, naming it ("device 1, op 17 of 40
 * (backward layer 2, micro-batch 3): ..."). The op at schedule index inject_at (-1: none)
 * fails with DP_ERR_BACKEND instead of running: a deterministic test hook. */
dp_status dp__exec_run(dp_exec *x, dp_exec_env *env, const dp_op *ops, const uint8_t *sync,
                       int n_ops, int lo, int hi, int inject_at);
/* sync[s] for every stage s of the schedule ops[0, n_ops): whether the
 * devices must meet at the end of stage s (dp__exec_run meets at the end of
 * its last stage whatever it says). Only an executor that shares work (a
 * synchronous backend whose devices and transport live in this address
 * space) leaves a barrier out, and only where no op of the next stage
 * touches a region another thread's ops since the last barrier wrote, or
 * writes one they read. p: the plan of the ops (shared parameters lie on
 * their home device: dp__param_home). */
void dp__exec_sync(dp_exec *x, const dp_plan *p, const dp_op *ops, int n_ops,
                   uint8_t *sync);

/* The profile: record into ev[0, cap) from index 0 (NULL: off); between runs. */
void dp__exec_profile(dp_exec *x, dp_prof_event *ev, size_t cap);
/* Appends one event (a no-op when the profile is off). */
void dp__exec_prof_add(dp_exec *x, const dp_prof_event *ev);
uint64_t dp__now_ns(void); /* CLOCK_MONOTONIC */

#endif
