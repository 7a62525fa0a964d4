/* libdp across processes and hosts, on MPI (libdp_mpi.a; pkg-config dp-mpi).
 * docs/DISTRIBUTED.md shows how to launch a job. Includes <mpi.h>; dp.h
 * does not. */
#ifndef DP_MPI_H
#define DP_MPI_H

#include <mpi.h>

#include "dp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The context of this process's rank in a job of config.ranks processes:
 * collective over comm, whose size must be the plan's ranks; every rank
 * calls it with a plan of the same model, config and build (the ranks
 * compare dp_plan_hash, and a rank that differs is refused on every rank,
 * naming it and what differs). Allocates the arenas of this rank's devices
 * only, and makes the persistent MPI requests of the schedule's cross-rank
 * transfers: a step starts and completes them and sets up no communication
 * (a new batch size rebuilds them once, like the schedule).
 *
 * MPI must be initialised; with more than one device per rank, with
 * MPI_THREAD_MULTIPLE (each device's thread moves its own bytes). The
 * context keeps duplicates of comm (freed with the context).
 *
 * Then every call that touches the job's state is collective (dp_train_step,
 * dp_forward, dp_get_params, dp_set_params, dp_get_grads, dp_params_hash,
 * dp_ckpt_save, dp_ckpt_load): every rank calls it, in the same order, with
 * the same arguments but its own rows: `rows` is the whole batch's count, x
 * and targets (and outputs) hold only the rows dp_plan_rank_rows gives the
 * rank. Every rank gets the same status, loss and parameters; a step refused
 * on one rank is refused on all of them before any commits. A rank that
 * stops answering for config.timeout_ms fails the call on the others with
 * DP_ERR_BACKEND naming it, and leaves their contexts unusable. */
dp_status dp_ctx_create_mpi(const dp_plan *p, MPI_Comm comm, dp_ctx **out);
/* The same with the caller's memory: arenas indexed by global device (only
 * this rank's are read; see dp_ctx_create_static). */
dp_status dp_ctx_create_static_mpi(const dp_plan *p, MPI_Comm comm, void *const arenas[],
                                   void *host, dp_ctx **out);

/* dp bench comm: on every rank of comm (collective), `iters` allreduces of
 * `bytes` of floats by the library's canonical tree (a step's reduce phase of
 * an allreduce plan, one device per rank, through the MPI transport) and by
 * MPI_Allreduce, timed on rank 0: seconds per allreduce of each. */
dp_status dp_mpi_bench_allreduce(MPI_Comm comm, size_t bytes, int iters, double *tree_s,
                                 double *mpi_s);

#ifdef __cplusplus
}
#endif

#endif
