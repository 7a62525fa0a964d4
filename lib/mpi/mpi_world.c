/* The MPI world (libdp_mpi.a): a job's ranks as MPI processes. It moves the
 * bytes of the schedule's cross-rank copies with persistent point-to-point
 * requests (MPI_Send_init / MPI_Recv_init, made when a schedule is built and
 * only started and completed in a step: never MPI_Allreduce, whose summation
 * order depends on the rank count), agrees each step's outcome over a
 * binomial tree of persistent requests, and bounds every wait by the
 * config's timeout. Two duplicates of the caller's communicator keep its
 * traffic apart from the caller's and the data apart from the control. */
#include "dp_mpi.h"

#include "core/ctx.h"

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_CHILDREN 32
#define NCACHE 3 /* the context's schedules: training, inference, an accumulating call */

typedef struct {
  int peer, dev;
  bool send;
  size_t bytes;
  MPI_Request req; /* persistent; MPI_REQUEST_NULL when none */
} xfer;

typedef struct {
  dp_world_ops ops; /* first: the core sees this */
  MPI_Comm data, ctl;
  int timeout_ms, tag_ub, dev0, local, cap;
  bool lost;
  char lost_msg[DP_ERRMSG_CAP / 2];
  xfer *x[NCACHE]; /* per cache: (n[cache]) */
  int n[NCACHE];
  int *slot[NCACHE]; /* per cache: (cap) schedule index -> x index, -1 none */
  /* per local device: the transfers it started and has not completed */
  int *pend[DP_MAX_DEVICES]; /* (NCACHE * cap) entries: cache * cap + x index */
  int npend[DP_MAX_DEVICES];
  unsigned char *bounce; /* a host source's bytes while its send is in flight */
  size_t bounce_bytes;
  /* the agreement tree */
  int parent, n_children, children[MAX_CHILDREN];
  dp_agreement mine, from_child[MAX_CHILDREN];
  MPI_Request up_recv[MAX_CHILDREN], up_send, down_recv, down_send[MAX_CHILDREN];
} mpi_world;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static const char *mpi_text(int rc, char *buf) {
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) snprintf(buf, 64, "MPI error %d", rc);
  return buf;
}

#define MPI_CHECK(call)                                                                    \
  do {                                                                                     \
    int rc_ = (call);                                                                      \
    if (rc_ != MPI_SUCCESS) {                                                              \
      char t_[MPI_MAX_ERROR_STRING];                                                       \
      return DP_FAIL(DP_ERR_BACKEND, "%s: %s", #call, mpi_text(rc_, t_));                  \
    }                                                                                      \
  } while (0)

static dp_status lost(mpi_world *w) { return DP_FAIL(DP_ERR_BACKEND, "%s", w->lost_msg); }

/* Completes reqs[0..n) (those not yet done), polling: spins first, then
 * yields the core (several ranks may share one), up to the timeout. On a
 * timeout the world is lost: *late names the first request not done. */
static dp_status wait_all(mpi_world *w, MPI_Request **reqs, const int *peers, int n,
                          const char *what) {
  double t0 = 0;
  for (long it = 0;; it++) {
    int left = 0, late = -1;
    for (int i = 0; i < n; i++) {
      if (!reqs[i]) continue;
      int done = 0, rc = MPI_Test(reqs[i], &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        char t[MPI_MAX_ERROR_STRING];
        w->lost = true;
        snprintf(w->lost_msg, sizeof w->lost_msg, "rank %d: %s with rank %d failed: %.120s",
                 w->ops.rank, what, peers[i], mpi_text(rc, t));
        return lost(w);
      }
      if (done)
        reqs[i] = NULL;
      else if (left++ == 0)
        late = i;
    }
    if (!left) return DP_OK;
    if (it > 256) sched_yield();
    if ((it & 255) == 0) {
      double t = now_ms();
      if (it == 0)
        t0 = t;
      else if (t - t0 > w->timeout_ms) {
        w->lost = true;
        snprintf(w->lost_msg, sizeof w->lost_msg,
                 "rank %d of %d did not answer within %d ms (%s; it stopped, died or runs "
                 "another call); this job cannot go on",
                 peers[late], w->ops.size, w->timeout_ms, what);
        return lost(w);
      }
    }
  }
}

/* ---- the schedule's transfers ---- */

static void free_cache(mpi_world *w, int cache) {
  for (int i = 0; i < w->n[cache]; i++)
    if (w->x[cache][i].req != MPI_REQUEST_NULL) MPI_Request_free(&w->x[cache][i].req);
  for (int k = 0; k < w->cap; k++) w->slot[cache][k] = -1;
  w->n[cache] = 0;
}

static dp_status w_prepare(void *wv, int cache, const dp_world_xfer *xs, int n) {
  mpi_world *w = wv;
  if (w->lost) return lost(w);
  free_cache(w, cache);
  for (int i = 0; i < n; i++) {
    const dp_world_xfer *q = &xs[i];
    if (q->k >= w->cap) return DP_FAIL(DP_ERR_BACKEND, "world: schedule index %d", q->k);
    /* tags: the op's index, apart per cache */
    long tag = (long)NCACHE * q->k + cache;
    if (tag > w->tag_ub)
      return DP_FAIL(DP_ERR_UNSUPPORTED,
                     "this schedule has more ops (%d) than this MPI's tags can name (%d)",
                     q->k, w->tag_ub / NCACHE);
    /* counts are ints: bytes, or 4-byte words for larger transfers (floats) */
    MPI_Datatype type = MPI_BYTE;
    size_t count = q->bytes;
    if (count > INT_MAX && count % 4 == 0) {
      type = MPI_UINT32_T;
      count /= 4;
    }
    if (count > INT_MAX)
      return DP_FAIL(DP_ERR_UNSUPPORTED,
                     "a cross-rank transfer of %zu bytes is larger than MPI's counts reach",
                     q->bytes);
    void *buf = q->buf;
    if (!buf) { /* a host source: sent from the bounce buffer */
      if (q->bytes > w->bounce_bytes)
        return DP_FAIL(DP_ERR_BACKEND, "world: %zu host bytes, bounce of %zu", q->bytes,
                       w->bounce_bytes);
      buf = w->bounce;
    }
    xfer *x = &w->x[cache][w->n[cache]];
    *x = (xfer){.peer = q->peer,
                .dev = q->dev,
                .send = q->send,
                .bytes = q->bytes,
                .req = MPI_REQUEST_NULL};
    w->slot[cache][q->k] = w->n[cache]++;
    if (q->send)
      MPI_CHECK(MPI_Send_init(buf, (int)count, type, q->peer, (int)tag, w->data, &x->req));
    else
      MPI_CHECK(MPI_Recv_init(buf, (int)count, type, q->peer, (int)tag, w->data, &x->req));
  }
  return DP_OK;
}

static dp_status w_start(void *wv, int cache, int k, const void *host) {
  mpi_world *w = wv;
  if (w->lost) return lost(w);
  int i = k >= 0 && k < w->cap ? w->slot[cache][k] : -1;
  if (i < 0) return DP_FAIL(DP_ERR_BACKEND, "world: op %d has no transfer", k);
  xfer *x = &w->x[cache][i];
  if (host) memcpy(w->bounce, host, x->bytes);
  MPI_CHECK(MPI_Start(&x->req));
  int d = x->dev - w->dev0;
  w->pend[d][w->npend[d]++] = cache * w->cap + i;
  return DP_OK;
}

static dp_status w_wait(void *wv, int dev) {
  mpi_world *w = wv;
  int d = dev - w->dev0, n = w->npend[d];
  if (!n) return w->lost ? lost(w) : DP_OK;
  w->npend[d] = 0;
  if (w->lost) return lost(w);
  /* per device, at most the ops of one stage: a small fixed array suffices
   * in practice; larger stages complete in chunks */
  enum { CHUNK = 64 };
  MPI_Request *reqs[CHUNK];
  int peers[CHUNK];
  for (int at = 0; at < n; at += CHUNK) {
    int m = n - at < CHUNK ? n - at : CHUNK;
    for (int j = 0; j < m; j++) {
      int e = w->pend[d][at + j];
      xfer *x = &w->x[e / w->cap][e % w->cap];
      reqs[j] = &x->req;
      peers[j] = x->peer;
    }
    dp_status s = wait_all(w, reqs, peers, m, "a transfer");
    if (s) return s;
  }
  return DP_OK;
}

/* ---- agreement ---- */

static void combine(dp_agreement *a, const dp_agreement *b) {
  if (b->rows_min < a->rows_min) a->rows_min = b->rows_min;
  if (b->rows_max > a->rows_max) a->rows_max = b->rows_max;
  if (b->status &&
      (!a->status || b->order < a->order || (b->order == a->order && b->rank < a->rank))) {
    a->status = b->status;
    a->rank = b->rank;
    a->order = b->order;
    memcpy(a->msg, b->msg, sizeof a->msg);
  }
}

static dp_status w_agree(void *wv, dp_agreement *a) {
  mpi_world *w = wv;
  if (w->lost) return lost(w);
  w->mine = *a;
  MPI_Request *r[MAX_CHILDREN];
  int nc = w->n_children;
  /* up: every child's combination into mine, then mine to the parent */
  for (int i = 0; i < nc; i++) {
    MPI_CHECK(MPI_Start(&w->up_recv[i]));
    r[i] = &w->up_recv[i];
  }
  dp_status s = wait_all(w, r, w->children, nc, "the step's agreement");
  if (s) return s;
  for (int i = 0; i < nc; i++) combine(&w->mine, &w->from_child[i]);
  if (w->parent >= 0) {
    MPI_CHECK(MPI_Start(&w->up_send));
    r[0] = &w->up_send;
    if ((s = wait_all(w, r, &w->parent, 1, "the step's agreement"))) return s;
    /* down: the root's result, to the children */
    MPI_CHECK(MPI_Start(&w->down_recv));
    r[0] = &w->down_recv;
    if ((s = wait_all(w, r, &w->parent, 1, "the step's agreement"))) return s;
  }
  for (int i = 0; i < nc; i++) {
    MPI_CHECK(MPI_Start(&w->down_send[i]));
    r[i] = &w->down_send[i];
  }
  if ((s = wait_all(w, r, w->children, nc, "the step's agreement"))) return s;
  *a = w->mine;
  return DP_OK;
}

/* ---- between steps ---- */

static dp_status w_bcast(void *wv, int root, void *buf, size_t bytes) {
  mpi_world *w = wv;
  if (w->lost) return lost(w);
  for (size_t off = 0; off < bytes;) {
    int m = bytes - off > (1u << 30) ? 1 << 30 : (int)(bytes - off);
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast((unsigned char *)buf + off, m, MPI_BYTE, root, w->ctl, &req));
    MPI_Request *r = &req;
    dp_status s = wait_all(w, &r, &root, 1, "a broadcast");
    if (s) return s;
    off += (size_t)m;
  }
  return DP_OK;
}

static void w_free(void *wv) {
  mpi_world *w = wv;
  if (!w) return;
  /* A lost world leaves its requests: a peer that never comes would block
   * freeing them; the job is ending. */
  if (!w->lost) {
    for (int c = 0; c < NCACHE; c++)
      if (w->slot[c]) free_cache(w, c);
    MPI_Request *all[] = {&w->up_send, &w->down_recv};
    for (int i = 0; i < 2; i++)
      if (*all[i] != MPI_REQUEST_NULL) MPI_Request_free(all[i]);
    for (int i = 0; i < w->n_children; i++) {
      if (w->up_recv[i] != MPI_REQUEST_NULL) MPI_Request_free(&w->up_recv[i]);
      if (w->down_send[i] != MPI_REQUEST_NULL) MPI_Request_free(&w->down_send[i]);
    }
    if (w->data != MPI_COMM_NULL) MPI_Comm_free(&w->data);
    if (w->ctl != MPI_COMM_NULL) MPI_Comm_free(&w->ctl);
  }
  for (int c = 0; c < NCACHE; c++) {
    free(w->x[c]);
    free(w->slot[c]);
  }
  for (int d = 0; d < DP_MAX_DEVICES; d++) free(w->pend[d]);
  free(w->bounce);
  free(w);
}

/* The binomial tree over the ranks, rooted at 0: rank r's parent is r
 * without its lowest set bit; its children r + 2^j below that bit. */
static dp_status make_tree(mpi_world *w) {
  int r = w->ops.rank, n = w->ops.size;
  w->parent = r ? r - (r & -r) : -1;
  for (int b = 1; b < n && (r == 0 || b < (r & -r)); b <<= 1)
    if (r + b < n) {
      if (w->n_children == MAX_CHILDREN)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "too many ranks");
      w->children[w->n_children++] = r + b;
    }
  int bytes = (int)sizeof(dp_agreement);
  for (int i = 0; i < w->n_children; i++) {
    MPI_CHECK(MPI_Recv_init(&w->from_child[i], bytes, MPI_BYTE, w->children[i], 1, w->ctl,
                            &w->up_recv[i]));
    MPI_CHECK(MPI_Send_init(&w->mine, bytes, MPI_BYTE, w->children[i], 2, w->ctl,
                            &w->down_send[i]));
  }
  if (w->parent >= 0) {
    MPI_CHECK(MPI_Send_init(&w->mine, bytes, MPI_BYTE, w->parent, 1, w->ctl, &w->up_send));
    MPI_CHECK(
        MPI_Recv_init(&w->mine, bytes, MPI_BYTE, w->parent, 2, w->ctl, &w->down_recv));
  }
  return DP_OK;
}

static dp_status world_new(const dp_plan *p, MPI_Comm comm, mpi_world **out) {
  mpi_world *w = calloc(1, sizeof *w);
  if (!w) return DP_FAIL(DP_ERR_NOMEM, "world: out of memory");
  *out = w;
  w->data = w->ctl = MPI_COMM_NULL;
  w->up_send = w->down_recv = MPI_REQUEST_NULL;
  for (int i = 0; i < MAX_CHILDREN; i++) w->up_recv[i] = w->down_send[i] = MPI_REQUEST_NULL;
  w->ops = (dp_world_ops){.name = "mpi",
                          .prepare = w_prepare,
                          .start = w_start,
                          .wait = w_wait,
                          .agree = w_agree,
                          .bcast = w_bcast,
                          .free = w_free};
  MPI_CHECK(MPI_Comm_rank(comm, &w->ops.rank));
  MPI_CHECK(MPI_Comm_size(comm, &w->ops.size));
  MPI_CHECK(MPI_Comm_dup(comm, &w->data));
  MPI_CHECK(MPI_Comm_dup(comm, &w->ctl));
  int *ub, flag = 0;
  MPI_CHECK(MPI_Comm_get_attr(w->data, MPI_TAG_UB, &ub, &flag));
  w->tag_ub = flag ? *ub : 32767;
  const dp_config *c = dp_plan_config(p);
  w->timeout_ms = c->timeout_ms ? c->timeout_ms : 60000;
  w->local = dp_plan_local_devices(p);
  w->dev0 = w->ops.rank * w->local;
  w->cap = p->ops_cap;
  const dp_model *m = dp_plan_model(p);
  w->bounce_bytes = (size_t)c->batch * (size_t)dp_model_target_width(m) * 4;
  w->bounce = malloc(w->bounce_bytes ? w->bounce_bytes : 1);
  bool ok = w->bounce;
  for (int i = 0; i < NCACHE && ok; i++) {
    w->x[i] = malloc((size_t)w->cap * sizeof *w->x[i]);
    w->slot[i] = malloc((size_t)w->cap * sizeof *w->slot[i]);
    ok = w->x[i] && w->slot[i];
    for (int k = 0; ok && k < w->cap; k++) w->slot[i][k] = -1;
  }
  for (int d = 0; d < w->local && ok; d++)
    ok = (w->pend[d] = malloc(NCACHE * (size_t)w->cap * sizeof *w->pend[d])) != NULL;
  if (!ok) return DP_FAIL(DP_ERR_NOMEM, "world: out of memory");
  return make_tree(w);
}

/* Every rank's plan hashes, compared with rank 0's: a rank started with
 * another model, config or build is refused on every rank, named. */
static dp_status compare_plans(mpi_world *w, const dp_plan *p) {
  enum { H = DP_PLAN_HASHES };
  uint64_t mine[H], *all = malloc((size_t)w->ops.size * sizeof mine);
  if (!all) return DP_FAIL(DP_ERR_NOMEM, "world: out of memory");
  dp__plan_hashes(p, mine);
  MPI_Request req;
  int rc = MPI_Iallgather(mine, H, MPI_UINT64_T, all, H, MPI_UINT64_T, w->ctl, &req);
  dp_status s = DP_OK;
  if (rc != MPI_SUCCESS) {
    char t[MPI_MAX_ERROR_STRING];
    s = DP_FAIL(DP_ERR_BACKEND, "MPI_Iallgather: %s", mpi_text(rc, t));
  } else {
    MPI_Request *r = &req;
    int root = 0;
    s = wait_all(w, &r, &root, 1, "comparing the ranks' plans");
  }
  static const char *const what[H] = {"model", "config", "schedule", "build of libdp"};
  for (int q = 1; q < w->ops.size && !s; q++)
    for (int i = 0; i < H && !s; i++)
      if (all[(size_t)q * H + i] != all[i])
        s = DP_FAIL(
            DP_ERR_INVALID,
            "rank %d of %d runs another %s than rank 0 (plan hash %016llx, rank 0's "
            "%016llx): every rank must plan the same model and config with the "
            "same build",
            q, w->ops.size, what[i], (unsigned long long)all[(size_t)q * H + i],
            (unsigned long long)all[i]);
  free(all);
  return s;
}

static dp_status create(const dp_plan *p, MPI_Comm comm, void *const arenas[], void *host,
                        dp_ctx **out) {
  if (out) *out = NULL;
  if (!p || !out) return DP_FAIL(DP_ERR_INVALID, "dp_ctx_create_mpi: NULL argument");
  int inited = 0, level = 0, size = 0;
  MPI_Initialized(&inited);
  if (!inited)
    return DP_FAIL(DP_ERR_INVALID, "dp_ctx_create_mpi: MPI is not initialised "
                                   "(MPI_Init_thread first)");
  MPI_CHECK(MPI_Comm_size(comm, &size));
  if (size != dp_plan_ranks(p))
    return DP_FAIL(DP_ERR_INVALID,
                   "the plan is for %d ranks (config.ranks) but the communicator has %d "
                   "processes (mpirun -np %d)",
                   dp_plan_ranks(p), size, dp_plan_ranks(p));
  MPI_Query_thread(&level);
  if (dp_plan_local_devices(p) > 1 && level < MPI_THREAD_MULTIPLE)
    return DP_FAIL(DP_ERR_INVALID,
                   "%d devices per rank move their bytes on threads of their own: "
                   "initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)",
                   dp_plan_local_devices(p));
  mpi_world *w = NULL;
  dp_status s = world_new(p, comm, &w);
  if (!s) s = compare_plans(w, p);
  if (s) {
    w_free(w);
    return s;
  }
  /* every rank made its context, or none keeps one */
  int rank = w->ops.rank;
  s = dp__ctx_create_world(p, arenas, host, &w->ops, w, out);
  int st = (int)s, worst = 0, rc = MPI_Allreduce(&st, &worst, 1, MPI_INT, MPI_MAX, comm);
  if (rc != MPI_SUCCESS || (!s && worst)) {
    dp_ctx_free(*out);
    *out = NULL;
    if (rc != MPI_SUCCESS) return DP_FAIL(DP_ERR_BACKEND, "MPI_Allreduce failed at create");
    return DP_FAIL((dp_status)worst,
                   "another rank could not create its context (its error names why); rank "
                   "%d made its own, now freed",
                   rank);
  }
  return s;
}

dp_status dp_ctx_create_mpi(const dp_plan *p, MPI_Comm comm, dp_ctx **out) {
  return create(p, comm, NULL, NULL, out);
}

dp_status dp_ctx_create_static_mpi(const dp_plan *p, MPI_Comm comm, void *const arenas[],
                                   void *host, dp_ctx **out) {
  if (!arenas) {
    if (out) *out = NULL;
    return DP_FAIL(DP_ERR_INVALID, "dp_ctx_create_static_mpi: arenas is NULL");
  }
  return create(p, comm, arenas, host, out);
}
