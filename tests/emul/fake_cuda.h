/* An emulated GPU: every entry point and vtable of cuda/dp_cuda.h, run on the
 * CPU (tests/emul/fake_cuda.c), and the hooks its tests use.
 *
 * It is a strict test double for the wiring in lib/ (ctx.c, exec.c,
 * checkpoint.c), not a simulator of CUDA: compute ops run the CPU backend's
 * code on read-write aliases of the arenas, so a cuda context must match a
 * cpu context bit for bit, and every departure from the calling contract of
 * dp_cuda.h (order of the step, stage and graph hooks; staging memory; host
 * access to device memory) fails loudly:
 *   - device memory is a PROT_NONE mapping: a host dereference segfaults;
 *   - work is queued and runs only in dp__cuda_step_end, as on a stream, so
 *     reading results before the synchronisation gets stale data;
 *   - a capture records without running; a launch replays with the new step.
 * Link it before libdp.a: the linker then takes these definitions and never
 * pulls an object of cuda/ from the archive (duplicate symbols otherwise). */
#ifndef DP_FAKE_CUDA_H
#define DP_FAKE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "dp.h"

typedef struct {
  /* live now (not reset by fake_cuda_reset_counters) */
  long arenas, hosts, ctxs;
  size_t arena_bytes; /* sum of live arena sizes */
  /* since the last fake_cuda_reset_counters */
  long plain_steps;  /* dp__cuda_step_begin outside a capture */
  long step_ends;    /* dp__cuda_step_end accepted */
  long captures;     /* dp__cuda_capture_end that filled a slot */
  long aborts;       /* dp__cuda_capture_abort of an open capture */
  long launches;     /* dp__cuda_graph_launch */
  long runs, copies; /* backend run / transport copy calls accepted (enqueued) */
  long cross_copies; /* copies between two distinct logical devices */
  long peers;        /* dp__cuda_transport.peer calls accepted */
  long executed;     /* calls executed (plain steps and replays) */
  long bad_frees;    /* frees of unknown memory, or of an arena still in a context */
  long memcpys;      /* dp__cuda_memcpy calls */
} fake_cuda_stats;

/* Fake GPUs: count (default 4, or $FAKE_CUDA_GPUS), NCCL in this "build"
 * (default 1), free memory per GPU before any arena (default 16 GiB, or
 * $FAKE_CUDA_FREE_BYTES; gpu -1: every GPU). */
void fake_cuda_set_gpus(int n);
void fake_cuda_set_have_nccl(int yes);
void fake_cuda_set_free_bytes(int gpu, size_t bytes);
/* The next n captures fail at dp__cuda_capture_end (nothing ran). */
void fake_cuda_fail_captures(long n);
/* The next n calls of dp__cuda_graph_launch launch the graph (step_end runs it)
 * and then report a failure, as a launch whose later CUDA call failed. */
void fake_cuda_fail_launches(long n);
/* Back to the defaults above (live allocations are kept). */
void fake_cuda_reset_config(void);
#ifdef FAKE_CUDA_MPI
#include <mpi.h>
/* The MPI build of the double (test_cuda_mpi): the processes whose emulated
 * NCCL carries copies between ranks, in the world's rank order (default
 * MPI_COMM_WORLD); set before the context is created. */
void fake_cuda_set_mpi_comm(MPI_Comm comm);
/* From now on this process's emulated NCCL sends to other processes never
 * go out (a peer that stalls mid-step): its peers' receives time out. */
void fake_cuda_drop_sends(int yes);
#endif

fake_cuda_stats fake_cuda_get_stats(void);
void fake_cuda_reset_counters(void);

/* The k-th live arena (in allocation order) on fake GPU gpu: its device
 * address (not host-addressable) and size; NULL when there is none. */
void *fake_cuda_arena(int gpu, int k, size_t *bytes);
/* Host access to fake device memory, the way a test (never lib/) may:
 * [dev, dev + bytes) must lie in one live arena. DP_ERR_INVALID otherwise. */
dp_status fake_cuda_poke(void *dev, const void *src, size_t bytes);
dp_status fake_cuda_peek(void *dst, const void *dev, size_t bytes);
/* 1 when p lies in a live arena (device memory), else 0. */
int fake_cuda_is_device(const void *p);

#endif
