/* dp bench comm's measurement: the library's canonical-tree allreduce (the
 * reduce phase of a real allreduce step, through the MPI world) against
 * MPI_Allreduce on the same bytes, in the same run. */
#include "dp_mpi.h"

#include "core/ctx.h"

#include <stdlib.h>

dp_status dp_mpi_bench_allreduce(MPI_Comm comm, size_t bytes, int iters, double *tree_s,
                                 double *mpi_s) {
  if (!tree_s || !mpi_s || iters < 1 || bytes < 8 || bytes / 4 > INT32_MAX)
    return DP_FAIL(DP_ERR_INVALID, "dp_mpi_bench_allreduce: bad arguments");
  int ranks = 0;
  if (MPI_Comm_size(comm, &ranks) != MPI_SUCCESS)
    return DP_FAIL(DP_ERR_INVALID, "dp_mpi_bench_allreduce: not a communicator");
  /* Linear(P - 1 -> 1) with a bias: P parameters, one row per rank */
  size_t P = bytes / 4;
  dp_model *m = NULL;
  dp_plan *p = NULL;
  dp_ctx *c = NULL;
  dp_status s = dp_model_new((int)(P - 1), &m);
  if (!s) s = dp_model_add_linear(m, 1, 1);
  if (!s) s = dp_model_set_loss(m, DP_LOSS_MSE);
  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = ranks;
  cfg.n_devices = ranks;
  cfg.ranks = ranks;
  cfg.mode = DP_MODE_ALLREDUCE;
  if (!s) s = dp_plan_create(m, &cfg, &p);
  if (!s) s = dp_ctx_create_mpi(p, comm, &c);
  float *buf = NULL, *sum = NULL;
  if (!s && (!(buf = calloc(P, 4)) || !(sum = calloc(P, 4))))
    s = DP_FAIL(DP_ERR_NOMEM, "bench: out of memory");
  /* warm-up: the transfers exist and have run once */
  if (!s) s = dp__ctx_run_phase(c, ranks, DP_PHASE_REDUCE, 1);
  if (!s) {
    MPI_Barrier(comm);
    double t0 = MPI_Wtime();
    s = dp__ctx_run_phase(c, ranks, DP_PHASE_REDUCE, iters);
    MPI_Barrier(comm);
    *tree_s = (MPI_Wtime() - t0) / iters;
  }
  if (!s) {
    MPI_Allreduce(buf, sum, (int)P, MPI_FLOAT, MPI_SUM, comm);
    MPI_Barrier(comm);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
      MPI_Allreduce(buf, sum, (int)P, MPI_FLOAT, MPI_SUM, comm);
    MPI_Barrier(comm);
    *mpi_s = (MPI_Wtime() - t0) / iters;
  }
  free(buf);
  free(sum);
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
  return s;
}
