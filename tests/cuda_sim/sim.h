/* Internals of the CUDA simulation (tests/cuda_sim), shared by runtime.cc,
 * kernel.cc, cublas.cc and nccl.cc. C++; not seen by cuda/.
 *
 * The model (docs/GPU.md, "The CUDA simulation"):
 * - device memory is host memory from mmap, one mapping per allocation with
 *   inaccessible guard pages around it, so an access past either end faults;
 * - a stream is a fixed ring of ops run in order by a worker thread of its own;
 *   an op runs only once it is released: by a host call that waits for it (stream
 *   or event synchronisation, a query), by an op of another stream that waits for
 *   it, or when it has been queued longer than the hold time (DP_SIM_HOLD_US,
 *   default 2000). Work nobody waited for therefore runs late, so a missing event
 *   wait shows up as wrong data rather than as luck;
 * - events are (stream, position) pairs; a wait is an op that waits for the
 *   position to run;
 * - graphs record the ops of every stream that joins the capture in the order the
 *   host issued them, and a launch enqueues them, in that order, on one stream. */
#ifndef DP_SIM_H
#define DP_SIM_H

#include "cuda_runtime.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#define DP_SIM_MAX_DEVICES 16
#define DP_SIM_RING 1024 /* ops a stream holds before an enqueue waits */

enum dp_sim_op_kind {
  SIM_KERNEL,
  SIM_COPY,
  SIM_SET,
  SIM_RECORD,
  SIM_WAIT,
  SIM_STAGED_COPY, /* a pageable upload's staged bytes: copied, then freed */
  SIM_EXT,         /* cuBLAS and NCCL ops: run(op) */
};

struct dp_sim_op;
typedef void (*dp_sim_ext_run)(dp_sim_op *op, struct dp_sim_stream *s);

struct dp_sim_op {
  int kind;
  uint64_t t_ns; /* when it was queued (the hold time counts from here) */
  union {
    struct {
      dp_sim_kernel_body body;
      const void *fn;
      const char *name;
      uint3 grid, block; /* dim3 has a constructor: not in a union */
    } k;
    struct {
      void *dst;
      const void *src;
      size_t n;
      int value;
    } m;
    struct {
      cudaEvent_t ev;
    } rec;
    struct {
      struct dp_sim_stream *s;
      uint64_t count; /* s must have run this many ops */
    } w;
    struct {
      dp_sim_ext_run run;
    } x;
  } u;
  alignas(16) unsigned char args[DP_SIM_ARG_BYTES];
};

struct dp_sim_graph;

struct dp_sim_stream {
  int dev;
  unsigned flags;
  bool legacy;
  bool destroyed;
  uint64_t tail;    /* ops enqueued */
  uint64_t done;    /* ops finished */
  uint64_t release; /* ops below this may run without waiting for the hold time */
  dp_sim_op *ring;  /* DP_SIM_RING slots */
  pthread_t worker;
  dp_sim_graph *cap; /* the capture this stream takes part in, or NULL */
  bool cap_origin;
  cudaError_t cap_error;
  bool nccl; /* an NCCL operation was issued on it (cublas.cc's lazy-load check) */
};

struct dp_sim_event {
  unsigned flags;
  dp_sim_stream *s; /* the last record's stream and position (done count), or NULL */
  uint64_t count;
  uint64_t t_ns;     /* when the last record ran */
  dp_sim_graph *cap; /* recorded during this capture */
};

/* The simulation's one lock and condition: every state change broadcasts. */
extern pthread_mutex_t dp_sim_mu;
extern pthread_cond_t dp_sim_cv;
uint64_t dp_sim_now_ns(void);

/* Queues op (copied) on s, or records it into s's capture. Call without the lock.
 * Returns the error to report (a poisoned device, a destroyed stream). */
cudaError_t dp_sim_enqueue(cudaStream_t s, const dp_sim_op *op);
/* The stream an API call means (NULL: the current device's legacy stream). */
dp_sim_stream *dp_sim_stream_of(cudaStream_t s);
/* Releases s's ops up to `count` (with the lock held). */
void dp_sim_release(dp_sim_stream *s, uint64_t count);
/* Releases every stream's queued ops (an NCCL op waits for a peer's stream). */
void dp_sim_release_all_locked(void);
/* Records e for cudaGetLastError and returns it. */
cudaError_t dp_sim_set_error(cudaError_t e);
/* The device's sticky error (a fault in one of its kernels), or cudaSuccess. */
cudaError_t dp_sim_sticky(int dev);
void dp_sim_poison(int dev, cudaError_t e);
/* Whether [p, p + n) lies inside one live allocation of the simulation (device or
 * pinned host memory); sets *dev to its device (-1 for pinned host memory). */
bool dp_sim_lookup(const void *p, size_t n, int *dev, bool *pinned);
/* Runs a kernel op on the calling worker; false after a fault (reported). */
bool dp_sim_run_kernel(dp_sim_op *op, int dev);
void dp_sim_report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
