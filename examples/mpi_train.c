/* A job across processes in a few lines (docs/DISTRIBUTED.md): every rank
 * plans the same model for the whole job (8 devices in config.ranks ranks),
 * creates its context with dp_ctx_create_mpi, and feeds the rows of each
 * batch that its devices take. Every rank gets the same loss and parameters;
 * the bits are those of the same job in one process.
 *
 *   ninja build/examples/mpi_train             (a plain `ninja` builds it too)
 *   mpirun -np 2 build/examples/mpi_train      (also -np 1, 4 or 8)
 */
#include <dp_mpi.h>

#include <math.h>
#include <stdio.h>

enum { IN = 4, CLASSES = 3, BATCH = 32, STEPS = 50 };

int main(int argc, char **argv) {
  int level, rank, ranks;
  /* each device of a rank moves its own bytes on its own thread */
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (8 % ranks) {
    if (rank == 0) fprintf(stderr, "run with 1, 2, 4 or 8 processes\n");
    MPI_Finalize();
    return 2;
  }
  dp_model *m = NULL;
  dp_plan *p = NULL;
  dp_ctx *c = NULL;
  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = BATCH;
  cfg.n_devices = 8;   /* the whole job's */
  cfg.ranks = ranks;   /* each rank drives 8 / ranks of them */
  cfg.micro_batch = 4; /* fixed: the same bits for every layout */
  cfg.mode = DP_MODE_ALLREDUCE;
  cfg.lr = 0.1f;
  dp_status s = dp_model_parse("input 4\nlinear 16\nrelu\nlinear 3\n"
                               "loss softmax_cross_entropy\n",
                               "example", &m);
  if (!s) s = dp_plan_create(m, &cfg, &p);
  if (!s) s = dp_ctx_create_mpi(p, MPI_COMM_WORLD, &c);
  if (s) {
    fprintf(stderr, "rank %d: %s\n", rank, dp_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* every rank holds the batch here; it feeds only its own rows of it */
  float x[BATCH * IN];
  int32_t y[BATCH];
  int row0, rows;
  dp_plan_rank_rows(p, BATCH, rank, &row0, &rows);
  float loss = 0.0f;
  for (int step = 0; step < STEPS && !s; step++) {
    for (int r = 0; r < BATCH; r++) {
      y[r] = (r + step) % CLASSES;
      for (int j = 0; j < IN; j++)
        x[r * IN + j] = (float)(y[r] == j) + 0.1f * sinf((float)(r * IN + j + step));
    }
    s = dp_train_step(c, BATCH, IN, x + row0 * IN, y + row0, &loss);
  }
  /* collective: every rank calls it and gets the same hash */
  uint64_t hash = dp_params_hash(c);
  if (s)
    fprintf(stderr, "rank %d: %s\n", rank, dp_ctx_error(c));
  else if (rank == 0)
    printf("%d ranks x %d devices: loss %.6f after %d steps, parameter hash %016llx\n",
           ranks, 8 / ranks, (double)loss, STEPS, (unsigned long long)hash);
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
  MPI_Finalize();
  return s ? 1 : 0;
}
