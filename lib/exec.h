/* The executor's state (lib/exec.c). */
#ifndef DP_EXEC_H
#define DP_EXEC_H

#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct {
  atomic_int count;
  atomic_uint gen;
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
  int n_devices, n_threads;
  const dp_backend_ops *backend;
  void *bctx;
  const dp_transport_ops *transport;
  void *tctx;
  dp_worker workers[DP_MAX_DEVICES];
  dp_barrier bar;
  atomic_int quit, failed, op_counter;
  /* the current job */
  dp_exec_env *env;
  const dp_op *ops;
  int n_ops, n_stages;
  /* per device outcome */
  dp_status status[DP_MAX_DEVICES];
  int fail_op[DP_MAX_DEVICES];
  char errmsg[DP_MAX_DEVICES][DP_ERRMSG_CAP];
  /* test hook: the fail_at-th op executed in a step fails (-1: off) */
  int fail_at;
};

dp_status dp__exec_init(dp_exec *x, int n_devices, const dp_backend_ops *b, void *bctx,
                        const dp_transport_ops *t, void *tctx);
void dp__exec_destroy(dp_exec *x);
/* Runs one schedule to completion; on failure, the first failing op's error. */
dp_status dp__exec_run(dp_exec *x, dp_exec_env *env, const dp_op *ops, int n_ops, int n_stages);

#endif
