/* Column tasks shared between device threads (team.h). The owner publishes
 * its job (release), claims tasks until none is left, waits until every
 * claimed task is done (acquire), withdraws the job and waits until no helper
 * may still read it: a helper counts itself a user before it looks at
 * `active` (both sequentially consistent), so the owner either sees it
 * counted or the helper sees the job withdrawn. The owner spins only a short
 * while for a helper's last task: a helper whose core was taken gets the
 * owner's core while the owner sleeps (it flags itself asleep before it reads
 * `done`, and a helper bumps `done` before it reads the flag, so one of them
 * sees the other). */
#include "cpu/team.h"

#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TEAM_RELAX() _mm_pause()
#else
#define TEAM_RELAX() ((void)0)
#endif

dp_team *dp__team_new(const dp_plan *p) {
  int n = p->cfg.n_devices;
  dp_team *t =
      aligned_alloc(64, (sizeof *t + (size_t)n * sizeof t->slot[0] + 63) / 64 * 64);
  if (!t) return NULL;
  t->n = n;
  for (int d = 0; d < n; d++) {
    dp_team_slot *s = &t->slot[d];
    atomic_init(&s->active, 0);
    atomic_init(&s->next, 0);
    atomic_init(&s->done, 0);
    atomic_init(&s->users, 0);
    atomic_init(&s->sleeping, 0);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
  }
  return t;
}

void dp__team_free(dp_team *t) {
  if (!t) return;
  for (int d = 0; d < t->n; d++) {
    pthread_mutex_destroy(&t->slot[d].mu);
    pthread_cond_destroy(&t->slot[d].cv);
  }
  free(t);
}

#define OWNER_SPIN_NS 20000u /* then sleep until the helpers' tasks are done */

static uint64_t mono_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Until the helpers have finished `want` tasks. */
static void wait_done(dp_team_slot *s, int want) {
  uint64_t t0 = mono_ns();
  for (unsigned i = 1; atomic_load_explicit(&s->done, memory_order_acquire) < want; i++) {
    TEAM_RELAX();
    if (i % 64 == 0 && mono_ns() - t0 > OWNER_SPIN_NS) {
      pthread_mutex_lock(&s->mu);
      atomic_store(&s->sleeping, 1);
      while (atomic_load(&s->done) < want) pthread_cond_wait(&s->cv, &s->mu);
      atomic_store(&s->sleeping, 0);
      pthread_mutex_unlock(&s->mu);
      return;
    }
  }
}

bool dp__team_sgemm(dp_team *t, int dev, int transA, int transB, int M, int N, int K,
                    const float *A, int lda, const float *B, int ldb, const float *Bpre,
                    float *C, int ldc, const dp_gemm_epilogue *ep, void *ws,
                    size_t ws_bytes) {
  dp_team_slot *s = t && t->n > 1 && dev >= 0 && dev < t->n ? &t->slot[dev] : NULL;
  int n = s ? dp__gemm_job_init(&s->job, transA, transB, M, N, K, A, lda, B, ldb, Bpre, C,
                                ldc, ep, ws, ws_bytes)
            : 0;
  if (!n) return false;
  atomic_store_explicit(&s->next, 0, memory_order_relaxed);
  atomic_store_explicit(&s->done, 0, memory_order_relaxed);
  atomic_store_explicit(&s->active, 1, memory_order_release); /* the job, A packed */
  int mine = 0;
  for (int g; (g = atomic_fetch_add_explicit(&s->next, 1, memory_order_relaxed)) < n;) {
    dp__gemm_job_task(&s->job, g);
    mine++;
  }
  wait_done(s, n - mine); /* the helpers' tasks: C's columns they wrote */
  atomic_store(&s->active, 0);
  while (atomic_load(&s->users) > 0) TEAM_RELAX();
  return true;
}

bool dp__team_help(dp_team *t, int dev) {
  if (!t) return false;
  for (int k = 1; k < t->n; k++) {
    dp_team_slot *s = &t->slot[(dev + k) % t->n];
    if (!atomic_load_explicit(&s->active, memory_order_relaxed)) continue;
    bool ran = false;
    atomic_fetch_add(&s->users, 1);
    if (atomic_load(&s->active)) {
      int g = atomic_fetch_add_explicit(&s->next, 1, memory_order_relaxed);
      if (g < s->job.n_tasks) {
        dp__gemm_job_task(&s->job, g);
        atomic_fetch_add(&s->done, 1);
        if (atomic_load(&s->sleeping)) {
          pthread_mutex_lock(&s->mu);
          pthread_cond_signal(&s->cv);
          pthread_mutex_unlock(&s->mu);
        }
        ran = true;
      }
    }
    atomic_fetch_sub(&s->users, 1);
    if (ran) return true;
  }
  return false;
}
