/* The dp tool as one rank of a job under mpirun (docs/DISTRIBUTED.md): joins
 * the job, creates the rank's context, gathers rows to rank 0. Without MPI in
 * the build, or when not launched by mpirun or srun, a job of one. */
#include "cli.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DP_HAVE_MPI
#include "dp_mpi.h"
#endif

static int g_rank, g_size = 1, g_mpi;
/* every rank knows the job failed and leaves by itself: no MPI_Abort */
static int g_together;

int dpt_world_rank(void) { return g_rank; }
int dpt_world_size(void) { return g_size; }
int dpt_world_launched(void) { return g_mpi; }

#ifdef DP_HAVE_MPI
/* Launched by a process manager that MPI_Init can join (Open MPI's mpirun,
 * Slurm's srun --mpi=pmix, a PMI launcher); a plain run never starts MPI. */
static int launched(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK",
                                     "PMI_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
    if (getenv(vars[i])) return 1;
  return 0;
}
#endif

void dpt_world_init(int *argc, char ***argv) {
#ifdef DP_HAVE_MPI
  if (!launched()) return;
  int level = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &level) != MPI_SUCCESS) return;
  g_mpi = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  /* people read rank 0; the others' standard output would repeat it */
  if (g_rank != 0) {
    FILE *f = freopen("/dev/null", "w", stdout);
    (void)f; /* failing, the output repeats: harmless */
  }
#else
  (void)argc;
  (void)argv;
#endif
}

int dpt_usage_error(const char *cmd, const char *err, const char *hint) {
  if (g_rank == 0)
    fprintf(stderr, "dp%s%s: %s\n%s%s", cmd ? " " : "", cmd ? cmd : "", err,
            hint ? hint : "", hint ? "\n" : "");
  dpt_world_failed_together();
  return DPT_EXIT_USAGE;
}

int dpt_world_exit(int status) {
#ifdef DP_HAVE_MPI
  if (g_mpi) {
    fflush(stdout);
    fflush(stderr);
    /* a rank that fails alone would leave the others waiting for it */
    if (status && g_size > 1 && !g_together) MPI_Abort(MPI_COMM_WORLD, status);
    MPI_Finalize();
  }
#endif
  return status;
}

dp_status dpt_ctx_create(const dp_plan *p, dp_ctx **out) {
  if (dp_plan_ranks(p) == 1 && g_size == 1) return dp_ctx_create(p, out);
#ifdef DP_HAVE_MPI
  if (g_mpi) return dp_ctx_create_mpi(p, MPI_COMM_WORLD, out);
  *out = NULL;
  /* the library's own message says how to launch */
  return dp_ctx_create(p, out);
#else
  return dp_ctx_create(p, out); /* refuses a plan of several ranks, saying why */
#endif
}

dp_status dpt_ctx_create_part(const dp_plan *p, dp_ctx **out, int *here) {
  int R = dp_plan_ranks(p);
  *out = NULL;
  *here = g_rank < R;
  if (R == 1) return *here ? dp_ctx_create(p, out) : DP_OK;
#ifdef DP_HAVE_MPI
  if (g_mpi && R <= g_size) {
    MPI_Comm sub;
    if (MPI_Comm_split(MPI_COMM_WORLD, *here ? 0 : MPI_UNDEFINED, g_rank, &sub) !=
        MPI_SUCCESS) {
      *here = 1; /* the failure is this process's */
      return dp_ctx_create(p, out);
    }
    if (!*here) return DP_OK;
    dp_status s = dp_ctx_create_mpi(p, sub, out); /* keeps duplicates of sub */
    MPI_Comm_free(&sub);
    return s;
  }
#endif
  *here = 1;
  return dp_ctx_create(p, out); /* refuses it, saying how to launch */
}

int dpt_world_bcast_int(int v) {
#ifdef DP_HAVE_MPI
  if (g_mpi) MPI_Bcast(&v, 1, MPI_INT, 0, MPI_COMM_WORLD);
#endif
  return v;
}

int dpt_world_max_int(int v) {
#ifdef DP_HAVE_MPI
  /* an integer maximum: the same on every rank whatever the reduction order */
  if (g_mpi && g_size > 1)
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
#endif
  return v;
}

int dpt_world_gather_rows(const dp_plan *p, int rows, const float *mine, int width,
                          float *all, char *err, size_t errcap) {
  int r0, n;
  if (dp_plan_rank_rows(p, rows, g_rank, &r0, &n)) {
    snprintf(err, errcap, "%s", dpt_user_msg(dp_last_error()));
    return -1;
  }
  if (g_size == 1 || !g_mpi) {
    memcpy(all, mine, (size_t)rows * width * 4);
    return 0;
  }
#ifdef DP_HAVE_MPI
  int counts[DP_MAX_DEVICES], displs[DP_MAX_DEVICES];
  for (int q = 0; q < g_size && q < DP_MAX_DEVICES; q++) {
    int q0, qn;
    dp_plan_rank_rows(p, rows, q, &q0, &qn);
    counts[q] = qn * width;
    displs[q] = q0 * width;
  }
  if (MPI_Gatherv(mine, n * width, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0,
                  MPI_COMM_WORLD) != MPI_SUCCESS) {
    snprintf(err, errcap, "gathering the outputs to rank 0 failed");
    return -1;
  }
#endif
  return 0;
}

void dpt_world_failed_together(void) { g_together = 1; }

int dpt_world_gather(const void *mine, size_t n, void *all) {
  if (g_size == 1 || !g_mpi) {
    memcpy(all, mine, n);
    return 0;
  }
#ifdef DP_HAVE_MPI
  if (n > INT_MAX || MPI_Gather(mine, (int)n, MPI_BYTE, all, (int)n, MPI_BYTE, 0,
                                MPI_COMM_WORLD) != MPI_SUCCESS)
    return -1;
#endif
  return 0;
}

int dpt_world_read_app(const char *path, void **app, size_t *n, char *err, size_t errcap) {
  *app = NULL;
  *n = 0;
  if (errcap) *err = '\0';
  dp_status s = DP_OK;
  if (g_rank == 0 && (s = dp_ckpt_read_app(path, app, n)))
    snprintf(err, errcap, "%s", dpt_user_msg(dp_last_error()));
  if (g_size == 1 || !g_mpi) return s ? -1 : 0;
#ifdef DP_HAVE_MPI
  /* rank 0's status and size, then its bytes (at most 16 MiB: an int count) */
  unsigned long long meta[2] = {(unsigned long long)s, *n};
  MPI_Bcast(meta, 2, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  if (meta[0]) {
    dpt_world_failed_together(); /* rank 0 says why; the others only leave */
    return -1;
  }
  if (g_rank != 0 && meta[1] && !(*app = malloc((size_t)meta[1]))) {
    snprintf(err, errcap, "out of memory for the checkpoint's run record");
    return -1; /* this rank alone: the job is aborted */
  }
  *n = (size_t)meta[1];
  if (*n && MPI_Bcast(*app, (int)*n, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
    snprintf(err, errcap, "the checkpoint's run record did not reach every rank");
    free(*app);
    *app = NULL;
    return -1;
  }
#endif
  return 0;
}

int dpt_world_layout_msg(int ranks, char *msg, size_t cap) {
  if (ranks <= g_size) return 0;
#ifdef DP_HAVE_MPI
  if (g_mpi)
    snprintf(msg, cap,
             "this layout needs %d processes, the job has %d: run it under mpirun -np %d",
             ranks, g_size, ranks);
  else
    snprintf(msg, cap,
             "this layout needs %d processes; this dp runs as one (not under mpirun): run "
             "it under mpirun -np %d",
             ranks, ranks);
#else
  snprintf(msg, cap,
           "this layout needs %d processes, and this dp was built without MPI "
           "(configure.py found no mpicc): install Open MPI and run configure.py again",
           ranks);
#endif
  return -1;
}
