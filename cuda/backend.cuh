/* The CUDA backend's per-device state, shared by the step code (backend.cu),
 * the set-up code (context.cu) and the CUDA graphs (graph.cu). Internal. */
#ifndef DP_CUDA_BACKEND_CUH
#define DP_CUDA_BACKEND_CUH

#include "kernels.cuh"

#include <time.h>

/* The pinned block host reads and writes of device memory go through between
 * steps (dp__cuda_ctx_copy), a chunk at a time. */
#define DP_CUDA_BOUNCE_BYTES ((size_t)4 << 20)

/* Monotonic seconds, for the step's deadline. */
static inline double dp__cuda_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

struct dev_ctx {
  int phys;             /* cfg.device_ids[d] */
  unsigned char *arena; /* device memory, plan->dev_bytes[d] */
  size_t bytes;
  cudaStream_t stream;
  cudaEvent_t ev[2];   /* end of stage s: ev[s & 1] */
  cudaEvent_t ev_join; /* graphs: this stream joins device 0's (graph.cu) */
  cublasHandle_t blas;
  dp_cuda_header *hdr; /* device pointer: start of WORKSPACE */
  /* bit X of touched[s & 1]: this device's stream read or wrote device X's
   * arena during stage s. Written by this device's thread only; read by the
   * others after the stage's barrier. */
  uint64_t touched[2];
  int stage; /* the stage this device is in; -1 before the first */
#ifdef DP_HAVE_NCCL
  ncclComm_t comm; /* rank d of the context's clique (DP_CUDA_NCCL), or NULL */
  /* This device's thread has an NCCL group open: its consecutive sends and
   * receives (the two directions of an exchange) are issued together at the
   * group's end, which comes before any other work it enqueues. */
  bool group_open;
#endif
  /* NCCL transfers this device's thread issued this step, by peer: sends
   * (src here) and receives (dst here), count and bytes. Written by this
   * device's thread only; dp__cuda_step_end checks that every send has its
   * receive before it waits on a stream (an unmatched one would never end). */
  uint64_t sent_n[DP_MAX_DEVICES], sent_b[DP_MAX_DEVICES];
  uint64_t recv_n[DP_MAX_DEVICES], recv_b[DP_MAX_DEVICES];
  uint64_t coll_n; /* ncclAllReduce calls this step (fast_collectives): all equal */
  /* config.accumulate: this step is a call that only accumulates (its
   * gradient check refuses it as "not accumulated"). This device's thread. */
  bool accum_call;
};

struct cuda_ctx {
  const dp_plan *plan;
  int n;      /* the plan's devices (p->split.n_used), every rank's */
  int d0, d1; /* this process's: [0, n) in one process; a rank's across processes */
  bool world; /* across processes: NCCL over every rank's devices (non-blocking
                 communicators), copies with an end in another process paired there */
  unsigned flags;
  bool nccl;      /* DP_CUDA_NCCL: comm[] are live */
  bool capturing; /* between capture_begin and capture_end/abort */
  bool failed; /* a step timed out or the device or NCCL failed: free aborts, never waits */
  int timeout_ms; /* cfg.timeout_ms, the default filled in */
  /* How long the last step's wait for the streams took (seconds): wait_stream
   * spins, without naps, for up to twice that, so a step's end is seen at once
   * whatever its length (issue 28, finding 5), and only a step far longer than
   * the last one naps between polls. */
  double last_wait_s;
  float lr; /* the rate in effect: cfg.lr, then dp__cuda_set_lr's */
  float momentum; /* SGD's momentum or Adam's beta1 in effect: dp__cuda_set_momentum */
  float loss_denom, loss_inv; /* dp__cuda_set_loss_norm's: the next step's */
  /* Debug hooks for tests/gpu/run.sh, read from the environment at creation
   * (never set in normal use): DP_CUDA_DEBUG_DELAY_US: a spin of that many
   * microseconds at the start of every stage of replica (step mod n), so that
   * a missing cross-stream edge shows as changed bits; DP_CUDA_DEBUG_FAULT_STEP:
   * an illegal-address kernel at the start of that step (1-based; 0: none). */
  unsigned debug_delay_us;
  uint64_t debug_fault_step;
  unsigned char *bounce;    /* pinned, DP_CUDA_BOUNCE_BYTES: host copies between steps */
  dp_cuda_header *host_hdr; /* pinned, n entries: what step_end reads back */
  dp_cuda_step_scalars *host_sc; /* pinned, after host_hdr: the step's scalars */
  uint64_t step;                 /* host copy of host_sc->step, for checks */
  float grad_norm;     /* device 0's norm of the last step (config.clip_grad_norm); NaN:
                          not reached, or device 0 is another rank's */
  cudaEvent_t ev_fork; /* on device 0: forks the other streams (graph.cu) */
  cudaGraphExec_t graph[DP_CUDA_GRAPH_SLOTS];
  dev_ctx dev[DP_MAX_DEVICES];
};

/* The thread's current logical device, set by dp__cuda_stage_begin: the
 * transport checks that it is the device its copy() and peer() are told
 * execute them. */
extern thread_local cuda_ctx *dp__cuda_tl_ctx;
extern thread_local int dp__cuda_tl_dev;

static inline bool is_local(const cuda_ctx *c, int d) { return d >= c->d0 && d < c->d1; }

static inline dp_status use_device(int phys) {
  int cur = -1;
  DP_CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != phys) DP_CUDA_CHECK(cudaSetDevice(phys));
  return DP_OK;
}

/* backend.cu: writes the step's scalars into the pinned block and resets the
 * per-step host bookkeeping (stages, touches, NCCL counts). Host only: shared
 * by dp__cuda_step_begin and dp__cuda_graph_launch. */
void dp__cuda_host_step(cuda_ctx *c, uint64_t step);
/* Zeroes the NCCL transfer counts (also when a captured step is dropped:
 * its transfers never ran). */
void dp__cuda_reset_counts(cuda_ctx *c);
/* true, naming one pair, when a device's sends to another do not match that
 * device's receives from it (count or bytes). */
bool dp__cuda_unmatched(const cuda_ctx *c, int *from, int *to);
#ifdef DP_HAVE_NCCL
/* The outcome of a call on device d's communicator (backend.cu): polls a
 * non-blocking one's ncclInProgress within the timeout; on an error or the
 * deadline across processes, aborts the communicators (c->failed). */
dp_status dp__cuda_nccl_issued(cuda_ctx *c, int d, ncclResult_t r, const char *call);
#endif

/* Runs every cuBLAS call device d's steps can make once (with NCCL: every row count
 * up to the planned one), on `scratch` (5 operands of `each` bytes, each 256-aligned;
 * dp__cuda_warm_bytes sizes one), so that no kernel loads lazily during a step
 * (cuda/backend.cu; cuda/context.cu calls it before NCCL). */
size_t dp__cuda_warm_bytes(const dp_plan *p);
dp_status dp__cuda_warm_device(cuda_ctx *c, int d, unsigned char *scratch, size_t each);

#endif
