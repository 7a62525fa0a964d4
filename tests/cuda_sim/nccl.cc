/* NCCL in the CUDA simulation, between the devices of one process and, built with
 * DP_SIM_MPI, across processes over MPI: communicators
 * (a clique per unique id), point-to-point send/receive matched in order per pair
 * of ranks, groups, a sum all-reduce in rank order, asynchronous errors and abort.
 *
 * A group becomes one op per stream. When the op runs it posts its sends, takes
 * its receives in order (each waits for the peer's matching send to be posted and
 * copies from the peer's buffer, so the peer's stream must have reached it), then
 * waits until each of its sends was taken — the sender's buffer is in use until
 * then, as on a GPU. A receive whose size differs from the send is an error of
 * both communicators. Abort ends every wait of the communicator's clique. */
#include "nccl.h"
#include "sim.h"

#include <stdlib.h>
#include <unistd.h>

#ifdef DP_SIM_MPI
/* Across processes: NCCL rank g lives in MPI_COMM_WORLD rank g / L, L being the ranks
 * a process holds (libdp's layout: rank * local devices + device). A pair's bytes go
 * as one MPI message, tagged by (sender, receiver) so that MPI's order per tag is
 * NCCL's order per pair; the all-reduce sends every local rank's buffer to every
 * other process and sums all of them in rank order, as in one process. */
#define OMPI_SKIP_MPICXX 1 /* the C API only */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#define TAG_P2P 1000
#define TAG_AR 20000
#endif

#define MAX_RANKS 16
#define CHANNEL 64
#define GROUP_ITEMS 24

struct posted {
  const void *buf;
  size_t bytes;
};
struct channel {
  uint64_t sent, taken;
  posted q[CHANNEL];
};
struct clique {
  ncclUniqueId id;
  int nranks;
  dp_sim_comm *rank[MAX_RANKS];
  channel ch[MAX_RANKS][MAX_RANKS]; /* [from][to] */
  /* all-reduce: the last rank to arrive reduces for all */
  int ar_arrived;
  uint64_t ar_gen;
  const float *ar_send[MAX_RANKS];
  float *ar_recv[MAX_RANKS];
  size_t ar_count[MAX_RANKS];
  bool aborted;
  bool linked[2][MAX_RANKS][MAX_RANKS]; /* [send, receive][rank][peer]: note_link */
  bool ar_linked[MAX_RANKS];
  int local_n; /* ranks held by this process (counted at the first transfer) */
  clique *next;
};
struct dp_sim_comm {
  clique *cl;
  int rank, dev;
  ncclResult_t async;
  bool in_progress; /* a non-blocking init answers ncclInProgress once */
  bool destroyed;
};

enum { ITEM_SEND, ITEM_RECV, ITEM_ALLREDUCE };
struct item {
  int kind, peer;
  dp_sim_comm *comm;
  const void *src;
  void *dst;
  size_t bytes;
};
struct group_args {
  int n;
  item it[GROUP_ITEMS];
};
static_assert(sizeof(group_args) <= DP_SIM_ARG_BYTES, "group too large");

static clique *cliques;

/* tests/mpi/test_mpi.c --drop-rank: this process's sends to other processes stop
 * going out (each completes here as if sent); its peers' receives wait until the
 * backend's step timeout aborts their communicators. */
static int drop_remote_sends;
extern "C" void dp_sim_nccl_drop_sends(int yes) {
  __atomic_store_n(&drop_remote_sends, yes != 0, __ATOMIC_RELAXED);
}

static char last_error[512];
static thread_local int group_depth;
static thread_local item pending[256];
static thread_local cudaStream_t pending_stream[256];
static thread_local int n_pending;

static ncclResult_t fail(ncclResult_t r, const char *msg) {
  pthread_mutex_lock(&dp_sim_mu);
  snprintf(last_error, sizeof last_error, "%s", msg);
  pthread_mutex_unlock(&dp_sim_mu);
  return r;
}

extern "C" const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}
extern "C" const char *ncclGetLastError(ncclComm_t) { return last_error; }

extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return ncclInvalidArgument;
  static uint64_t counter;
  memset(id, 0, sizeof *id);
  uint64_t v[3] = {(uint64_t)getpid(), dp_sim_now_ns(),
                   __atomic_add_fetch(&counter, 1, __ATOMIC_SEQ_CST)};
  memcpy(id->internal, v, sizeof v);
  return ncclSuccess;
}

static ncclResult_t join(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
                         int dev, bool blocking) {
  if (!out) return ncclInvalidArgument;
  *out = NULL;
  if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "nranks or rank out of range");
  pthread_mutex_lock(&dp_sim_mu);
  clique *c = cliques;
  while (c && memcmp(&c->id, id, sizeof *id)) c = c->next;
  if (!c) {
    c = (clique *)calloc(1, sizeof *c);
    if (!c) {
      pthread_mutex_unlock(&dp_sim_mu);
      return ncclSystemError;
    }
    c->id = *id;
    c->nranks = nranks;
    c->next = cliques;
    cliques = c;
  }
  char msg[160] = "";
  if (c->nranks != nranks)
    snprintf(msg, sizeof msg, "rank %d: nranks %d, but the communicator has %d", rank,
             nranks, c->nranks);
  else if (c->rank[rank])
    snprintf(msg, sizeof msg, "rank %d joined twice", rank);
  for (int r = 0; r < MAX_RANKS && !*msg; r++)
    if (c->rank[r] && c->rank[r]->dev == dev)
      snprintf(msg, sizeof msg,
               "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d", rank,
               r, dev);
  if (*msg) {
    snprintf(last_error, sizeof last_error, "%s", msg);
    pthread_mutex_unlock(&dp_sim_mu);
    return ncclInvalidUsage;
  }
  dp_sim_comm *m = (dp_sim_comm *)calloc(1, sizeof *m);
  if (!m) {
    pthread_mutex_unlock(&dp_sim_mu);
    return ncclSystemError;
  }
  m->cl = c;
  m->rank = rank;
  m->dev = dev;
  m->in_progress = !blocking;
  c->rank[rank] = m;
  pthread_mutex_unlock(&dp_sim_mu);
  *out = m;
  return blocking ? ncclSuccess : ncclInProgress;
}

extern "C" ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks,
                                               ncclUniqueId id, int rank,
                                               ncclConfig_t *cfg) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return ncclUnhandledCudaError;
  return join(comm, nranks, &id, rank, dev, !cfg || cfg->blocking);
}
extern "C" ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id,
                                         int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}
extern "C" ncclResult_t ncclCommInitAll(ncclComm_t *comms, int n, const int *devs) {
  if (!comms || n < 1) return ncclInvalidArgument;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return ncclUnhandledCudaError;
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  for (int i = 0; i < n; i++) {
    int dev = devs ? devs[i] : i;
    if (dev < 0 || dev >= count) return fail(ncclInvalidArgument, "invalid device");
    ncclResult_t r = join(&comms[i], n, &id, i, dev, true);
    if (r != ncclSuccess) {
      for (int j = 0; j < i; j++) ncclCommAbort(comms[j]);
      return r;
    }
  }
  return ncclSuccess;
}

extern "C" ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *r) {
  if (!comm || !r) return ncclInvalidArgument;
  pthread_mutex_lock(&dp_sim_mu);
  *r = comm->in_progress ? ncclInProgress : comm->async;
  comm->in_progress = false;
  pthread_mutex_unlock(&dp_sim_mu);
  return ncclSuccess;
}
extern "C" ncclResult_t ncclCommCount(ncclComm_t comm, int *n) {
  if (!comm || !n) return ncclInvalidArgument;
  *n = comm->cl->nranks;
  return ncclSuccess;
}
extern "C" ncclResult_t ncclCommUserRank(ncclComm_t comm, int *rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

/* Ends every wait of the clique; the communicator is gone (its memory stays, so that
 * a stream op still holding it ends cleanly). */
static ncclResult_t leave(ncclComm_t comm, bool abort) {
  if (!comm) return ncclInvalidArgument;
  pthread_mutex_lock(&dp_sim_mu);
  if (abort) comm->cl->aborted = true;
  comm->destroyed = true;
  if (comm->cl->rank[comm->rank] == comm) comm->cl->rank[comm->rank] = NULL;
  pthread_cond_broadcast(&dp_sim_cv);
  pthread_mutex_unlock(&dp_sim_mu);
  return ncclSuccess;
}
extern "C" ncclResult_t ncclCommAbort(ncclComm_t comm) { return leave(comm, true); }
extern "C" ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  /* as NCCL: the communicator's queued work finishes first */
  cudaError_t e = cudaDeviceSynchronize();
  (void)e;
  return leave(comm, false);
}

/* ---- running a group (on a stream's worker) -------------------------------------------
 */

static void comm_error(dp_sim_comm *m, ncclResult_t r, const char *what) {
  if (m->async == ncclSuccess) m->async = r;
  snprintf(last_error, sizeof last_error, "%s", what);
}

static bool gone(const dp_sim_comm *m) { return m->cl->aborted || m->destroyed; }

/* The MPI process and the count of ranks of this process (cl->local_n). */
static int local_ranks(clique *cl) {
  if (!cl->local_n)
    for (int r = 0; r < MAX_RANKS; r++) cl->local_n += cl->rank[r] != NULL;
  return cl->local_n ? cl->local_n : 1;
}
static bool remote(const item *it) {
  if (it->kind == ITEM_ALLREDUCE) return false;
  int L = local_ranks(it->comm->cl);
  return it->peer / L != it->comm->rank / L;
}

#ifdef DP_SIM_MPI
/* Waits for n requests without the lock held; false if the communicator went away
 * (the requests are left: the job is ending). */
static bool mpi_wait(MPI_Request *rq, int n, const dp_sim_comm *m) {
  for (;;) {
    int done = 0;
    MPI_Testall(n, rq, &done, MPI_STATUSES_IGNORE);
    if (done) return true;
    pthread_mutex_lock(&dp_sim_mu);
    bool g = gone(m);
    pthread_mutex_unlock(&dp_sim_mu);
    if (g) return false;
    dp_sim_nanosleep(20000);
  }
}

/* The all-reduce's exchange with the other processes, by the last local rank to
 * arrive (lock held on entry and exit): every rank's buffer, in rank order. */
static void allreduce_across(clique *cl, const dp_sim_comm *m, size_t n) {
  int L = local_ranks(cl), me = m->rank / L, procs = cl->nranks / L;
  float *far = (float *)malloc(sizeof(float) * n * (size_t)cl->nranks + 1);
  MPI_Request *rq =
      (MPI_Request *)malloc(sizeof(MPI_Request) * (size_t)(2 * cl->nranks * procs + 1));
  if (!far || !rq) {
    comm_error((dp_sim_comm *)m, ncclSystemError, "all-reduce: out of memory");
    free(far), free(rq);
    return;
  }
  int k = 0;
  for (int q = 0; q < cl->nranks; q++) {
    if (q / L == me)
      for (int P = 0; P < procs; P++) {
        if (P != me)
          MPI_Isend(cl->ar_send[q], (int)n, MPI_FLOAT, P, TAG_AR + q, MPI_COMM_WORLD,
                    &rq[k++]);
      }
    else
      MPI_Irecv(far + (size_t)q * n, (int)n, MPI_FLOAT, q / L, TAG_AR + q, MPI_COMM_WORLD,
                &rq[k++]);
  }
  pthread_mutex_unlock(&dp_sim_mu);
  bool ok = mpi_wait(rq, k, m);
  pthread_mutex_lock(&dp_sim_mu);
  if (ok)
    for (size_t e = 0; e < n; e++) {
      float v = 0.0f;
      for (int q = 0; q < cl->nranks; q++) {
        float x = q / L == me ? cl->ar_send[q][e] : far[(size_t)q * n + e];
        v = q ? v + x : x;
      }
      for (int q = me * L; q < (me + 1) * L; q++) cl->ar_recv[q][e] = v;
    }
  free(far);
  free(rq);
}
#endif

/* The in-process all-reduce (and across processes with DP_SIM_MPI); lock held. */
static void allreduce(const item *it) {
  clique *cl = it->comm->cl;
  int r = it->comm->rank;
  uint64_t gen = cl->ar_gen;
  cl->ar_send[r] = (const float *)it->src;
  cl->ar_recv[r] = (float *)it->dst;
  cl->ar_count[r] = it->bytes / 4;
  if (++cl->ar_arrived < local_ranks(cl)) {
    while (cl->ar_gen == gen && !gone(it->comm)) pthread_cond_wait(&dp_sim_cv, &dp_sim_mu);
    return;
  }
  size_t n = it->bytes / 4;
  int L = local_ranks(cl), me = r / L;
  for (int q = me * L; q < (me + 1) * L; q++)
    if (cl->ar_count[q] != n)
      comm_error(it->comm, ncclInvalidUsage, "all-reduce sizes differ");
  if (L < cl->nranks) {
#ifdef DP_SIM_MPI
    allreduce_across(cl, it->comm, n);
#else
    comm_error(it->comm, ncclSystemError, "all-reduce across processes needs DP_SIM_MPI");
#endif
  } else {
    for (size_t e = 0; e < n; e++) { /* rank order; in place is safe element by element */
      float v = cl->ar_send[0][e];
      for (int q = 1; q < cl->nranks; q++) v += cl->ar_send[q][e];
      for (int q = 0; q < cl->nranks; q++) cl->ar_recv[q][e] = v;
    }
  }
  cl->ar_arrived = 0;
  cl->ar_gen++;
  pthread_cond_broadcast(&dp_sim_cv);
}

static void run_group(dp_sim_op *op, dp_sim_stream *s) {
  const group_args *g = (const group_args *)op->args;
  uint64_t mine[GROUP_ITEMS];
  pthread_mutex_lock(&dp_sim_mu);
#ifdef DP_SIM_MPI
  MPI_Request rq[GROUP_ITEMS];
  int n_rq = 0;
  const dp_sim_comm *any = g->n ? g->it[0].comm : NULL;
  for (int i = 0; i < g->n; i++) { /* the other processes' halves, posted first */
    const item *it = &g->it[i];
    if (!remote(it)) continue;
    int L = local_ranks(it->comm->cl),
        tag = TAG_P2P + it->comm->rank * MAX_RANKS + it->peer;
    if (it->kind == ITEM_SEND && __atomic_load_n(&drop_remote_sends, __ATOMIC_RELAXED))
      continue; /* dropped: never goes out */
    if (it->kind == ITEM_SEND)
      MPI_Isend(it->src, (int)it->bytes, MPI_BYTE, it->peer / L, tag, MPI_COMM_WORLD,
                &rq[n_rq++]);
    else
      MPI_Irecv(it->dst, (int)it->bytes, MPI_BYTE, it->peer / L,
                TAG_P2P + it->peer * MAX_RANKS + it->comm->rank, MPI_COMM_WORLD,
                &rq[n_rq++]);
  }
#endif
  for (int i = 0; i < g->n; i++) { /* post the sends */
    const item *it = &g->it[i];
    if (it->kind != ITEM_SEND || remote(it)) continue;
    channel *ch = &it->comm->cl->ch[it->comm->rank][it->peer];
    while (ch->sent - ch->taken >= CHANNEL && !gone(it->comm))
      pthread_cond_wait(&dp_sim_cv, &dp_sim_mu);
    ch->q[ch->sent % CHANNEL] = posted{it->src, it->bytes};
    mine[i] = ++ch->sent;
    pthread_cond_broadcast(&dp_sim_cv);
  }
  for (int i = 0; i < g->n; i++) { /* take the receives, in order */
    const item *it = &g->it[i];
    if (it->kind != ITEM_RECV || remote(it)) continue;
    clique *cl = it->comm->cl;
    channel *ch = &cl->ch[it->peer][it->comm->rank];
    /* the sender's stream must get there: release what it has queued */
    if (ch->sent <= ch->taken) dp_sim_release_all_locked();
    while (ch->sent <= ch->taken && !gone(it->comm))
      pthread_cond_wait(&dp_sim_cv, &dp_sim_mu);
    if (gone(it->comm)) break;
    posted p = ch->q[ch->taken % CHANNEL];
    if (p.bytes != it->bytes) {
      char msg[200];
      snprintf(msg, sizeof msg,
               "rank %d received %zu bytes from rank %d, which sent %zu: the pair does not "
               "match",
               it->comm->rank, it->bytes, it->peer, p.bytes);
      comm_error(it->comm, ncclInvalidUsage, msg);
      if (cl->rank[it->peer]) comm_error(cl->rank[it->peer], ncclRemoteError, msg);
    }
    pthread_mutex_unlock(&dp_sim_mu);
    memcpy(it->dst, p.buf, p.bytes < it->bytes ? p.bytes : it->bytes);
    pthread_mutex_lock(&dp_sim_mu);
    ch->taken++;
    pthread_cond_broadcast(&dp_sim_cv);
  }
  for (int i = 0; i < g->n; i++) { /* the send buffers are free once taken */
    const item *it = &g->it[i];
    if (it->kind != ITEM_SEND || remote(it)) continue;
    channel *ch = &it->comm->cl->ch[it->comm->rank][it->peer];
    while (ch->taken < mine[i] && !gone(it->comm))
      pthread_cond_wait(&dp_sim_cv, &dp_sim_mu);
  }
#ifdef DP_SIM_MPI
  if (n_rq) {
    pthread_mutex_unlock(&dp_sim_mu);
    (void)mpi_wait(rq, n_rq, any);
    pthread_mutex_lock(&dp_sim_mu);
  }
#endif
  for (int i = 0; i < g->n; i++)
    if (g->it[i].kind == ITEM_ALLREDUCE) allreduce(&g->it[i]);
  pthread_mutex_unlock(&dp_sim_mu);
  (void)s;
}

/* ---- issuing --------------------------------------------------------------------------
 */

static ncclResult_t flush(void) {
  ncclResult_t r = ncclSuccess;
  bool used[256] = {false};
  for (int i = 0; i < n_pending; i++) {
    if (used[i]) continue;
    dp_sim_op op;
    op.kind = SIM_EXT;
    op.u.x.run = run_group;
    group_args *g = (group_args *)op.args;
    g->n = 0;
    cudaStream_t st = pending_stream[i];
    for (int j = i; j < n_pending; j++) {
      if (used[j] || pending_stream[j] != st) continue;
      used[j] = true;
      g->it[g->n++] = pending[j];
      if (g->n == GROUP_ITEMS) {
        if (dp_sim_enqueue(st, &op) != cudaSuccess) r = ncclUnhandledCudaError;
        g->n = 0;
      }
    }
    if (g->n && dp_sim_enqueue(st, &op) != cudaSuccess) r = ncclUnhandledCudaError;
  }
  n_pending = 0;
  return r;
}

/* Lazy connection, as a real NCCL makes it: a rank's first send to a peer, first
 * receive from one and first all-reduce each set up a link (buffers allocated,
 * a handshake). Counted, so a test can see that every link was made before the
 * first step (dp_sim_nccl_links). */
static long n_links;
extern "C" long dp_sim_nccl_links(void) {
  return __atomic_load_n(&n_links, __ATOMIC_RELAXED);
}

static void note_link(const item &it) {
  clique *cl = it.comm->cl;
  int me = it.comm->rank, k = it.kind == ITEM_SEND ? 0 : it.kind == ITEM_RECV ? 1 : 2;
  bool *l = k == 2 ? &cl->ar_linked[me] : &cl->linked[k][me][it.peer];
  if (!__atomic_exchange_n(l, true, __ATOMIC_RELAXED))
    __atomic_add_fetch(&n_links, 1, __ATOMIC_RELAXED);
}

static ncclResult_t issue(const item &it, cudaStream_t s) {
  if (!it.comm || gone(it.comm)) return fail(ncclInvalidArgument, "invalid communicator");
  if (it.kind != ITEM_ALLREDUCE && (it.peer < 0 || it.peer >= it.comm->cl->nranks))
    return fail(ncclInvalidArgument, "peer out of range");
#ifndef DP_SIM_MPI
  if (it.kind != ITEM_ALLREDUCE && !it.comm->cl->rank[it.peer])
    return fail(ncclSystemError,
                "the simulated NCCL reaches only the devices of this process");
#endif
  if (it.bytes && ((it.src && !dp_sim_lookup(it.src, it.bytes, NULL, NULL)) ||
                   (it.dst && !dp_sim_lookup(it.dst, it.bytes, NULL, NULL))))
    return fail(ncclInvalidArgument, "a buffer is not device memory of the simulation");
  if (n_pending == 256) return fail(ncclInvalidUsage, "too many operations in one group");
  note_link(it);
  /* from now on a cuBLAS kernel first loaded on this stream may meet a spinning
   * NCCL kernel of the same context (cublas.cc) */
  if (dp_sim_stream *st = dp_sim_stream_of(s))
    __atomic_store_n(&st->nccl, true, __ATOMIC_RELAXED);

  pending[n_pending] = it;
  pending_stream[n_pending++] = s;
  return group_depth ? ncclSuccess : flush();
}

static size_t type_bytes(ncclDataType_t t) {
  return t == ncclInt8 || t == ncclUint8 ? 1 : 4;
}

extern "C" ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}
extern "C" ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0)
    return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth) return ncclSuccess;
  return flush();
}
extern "C" ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer,
                                 ncclComm_t comm, cudaStream_t s) {
  return issue(item{ITEM_SEND, peer, comm, buf, NULL, count * type_bytes(t)}, s);
}
extern "C" ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer,
                                 ncclComm_t comm, cudaStream_t s) {
  return issue(item{ITEM_RECV, peer, comm, NULL, buf, count * type_bytes(t)}, s);
}
extern "C" ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count,
                                      ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t s) {
  if (t != ncclFloat32 || op != ncclSum)
    return fail(ncclInvalidArgument, "the simulation's all-reduce sums float32 only");
  return issue(item{ITEM_ALLREDUCE, 0, comm, send, recv, count * 4}, s);
}
