/* Device threads sharing their products (issue 31 item 4): a device whose op
 * runs a large GEMM offers its column tasks (gemm.h: dp_gemm_job), and the
 * other devices' threads take some while they wait at a barrier
 * (dp_backend_ops.help), so that a device that is late (its core taken for a
 * moment) is not simply waited for. Any thread may run any task with the same
 * bits, so the results do not depend on who helped. Internal to lib/cpu/. */
#ifndef DP_CPU_TEAM_H
#define DP_CPU_TEAM_H

#include "cpu/gemm.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct {
  _Alignas(64) atomic_int active; /* a job is offered */
  atomic_int next, done;          /* the next task to claim; helpers' tasks finished */
  atomic_int users;               /* helpers that may be reading the job */
  atomic_int sleeping;            /* the owner sleeps on cv until done */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  dp_gemm_job job;
} dp_team_slot;

typedef struct dp_team_s {
  int n; /* devices of the plan: slots [0, n) */
  dp_team_slot slot[];
} dp_team;

/* One slot per device of p (calloc'd at context creation; NULL: out of memory). */
dp_team *dp__team_new(const dp_plan *p);
void dp__team_free(dp_team *t);
/* C = op(A) op(B) (+ ep) as dp__sgemm_pb computes it, on device dev's thread,
 * its column tasks offered to the other devices' threads, when t has several
 * devices and the shape is cut (dp__gemm_job_init, in ws of ws_bytes): true
 * when every task is done; false: nothing was done (run dp__sgemm_pb). */
bool dp__team_sgemm(dp_team *t, int dev, int transA, int transB, int M, int N, int K,
                    const float *A, int lda, const float *B, int ldb, const float *Bpre,
                    float *C, int ldc, const dp_gemm_epilogue *ep, void *ws,
                    size_t ws_bytes);
/* Runs one task another device offers, if there is one: true when it did. */
bool dp__team_help(dp_team *t, int dev);

#endif
