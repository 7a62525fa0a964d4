/* cuBLAS in the CUDA simulation: a handle (stream, workspace, math, pointer and
 * atomics modes), SGEMM with cuBLAS's column-major semantics, and its strided
 * batched form (matrix i of A, B and C at a + i strideA, b + i strideB,
 * c + i strideC, each computed as one SGEMM).
 *
 * The product's order is fixed and documented (docs/GPU.md): each C element is
 * sum over p of op(A)[i,p] op(B)[p,j], accumulated with fmaf from +0 in ascending
 * p, then alpha * sum (+ beta * C when beta != 0; C is not read when beta == 0,
 * as cuBLAS). Like the real library, whose kernel choice depends on alignment,
 * the result depends on it: when A, B and C are 16-byte aligned (in a batched
 * call: every matrix, so the strides count too) and every leading
 * dimension is a multiple of 4, p runs in one pass; otherwise it runs as two
 * parts added at the end, split at k/2 when the addresses are aligned and at
 * k/3 when they are not — so bits that depend on where a slice starts show up
 * here as they would on a GPU. With CUBLAS_TF32_TENSOR_OP_MATH the inputs are
 * rounded to TF32 (10 mantissa bits, to nearest even) first. Each call scribbles on
 * the handle's workspace, as a real kernel may, so data kept there is lost. */
#include "cublas_v2.h"
#include "sim.h"

#include <stdlib.h>

/* Lazy loading: a real cuBLAS loads a kernel at its first launch, which can deadlock
 * while an NCCL kernel of the same device spins. Each device's first use of a call's
 * kernel-choosing parameters is noted; one on a stream that has carried NCCL
 * operations (a context's stream once its NCCL is connected: libdp issues its GEMMs
 * and its NCCL calls on one stream per replica) is counted and reported
 * (dp_sim_cold_gemms). Another context's warm-up on its own fresh streams is not:
 * the first context is idle then, no NCCL kernel of it in flight. */
#define MAX_KEYS 16384 /* a power of two: an open-addressing set */
struct gemm_kind {
  int dev, ta, tb, m, n, k, lda, ldb, ldc, aligned, math;
  int batch; /* 0: cublasSgemm; -1: cublasGemmEx (bf16); else the batched call's count */
};
static gemm_kind kinds[MAX_KEYS];
static bool used[MAX_KEYS];
static int n_kinds, n_cold;

/* Whether g was seen before; notes it. With the lock held. */
static bool seen_before(const gemm_kind &g) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char *b = (const unsigned char *)&g;
  for (size_t i = 0; i < sizeof g; i++) h = (h ^ b[i]) * 1099511628211ull;
  for (size_t i = h & (MAX_KEYS - 1);; i = (i + 1) & (MAX_KEYS - 1)) {
    if (!used[i]) {
      if (n_kinds == MAX_KEYS - 1) return true; /* full: reported once below */
      used[i] = true;
      kinds[i] = g;
      n_kinds++;
      return false;
    }
    if (!memcmp(&kinds[i], &g, sizeof g)) return true;
  }
}

extern "C" int dp_sim_cold_gemms(void) {
  pthread_mutex_lock(&dp_sim_mu);
  int n = n_cold;
  pthread_mutex_unlock(&dp_sim_mu);
  return n;
}

static void note_kind(const gemm_kind &g, const dp_sim_stream *st) {
  pthread_mutex_lock(&dp_sim_mu);
  bool full = n_kinds == MAX_KEYS - 1;
  bool cold = !seen_before(g) && st && __atomic_load_n(&st->nccl, __ATOMIC_RELAXED);
  if (cold) n_cold++;
  bool now_full = !full && n_kinds == MAX_KEYS - 1;
  pthread_mutex_unlock(&dp_sim_mu);
  if (now_full)
    dp_sim_report("cublasSgemm: more than %d kinds of call; the lazy-load check stops "
                  "here",
                  MAX_KEYS - 2);
  if (cold)
    dp_sim_report(
        "%s on device %d: a kernel first needed on a stream that carries NCCL "
        "(m %d, n %d, k %d, lda %d, ldb %d, ldc %d, batch %d): a real cuBLAS loads it "
        "now, which can deadlock with a spinning NCCL kernel",
        g.batch < 0 ? "cublasGemmEx" : g.batch ? "cublasSgemmStridedBatched" : "cublasSgemm",
        g.dev, g.m, g.n, g.k, g.lda,
        g.ldb, g.ldc, g.batch);
}

struct dp_sim_blas {
  cudaStream_t stream;
  void *ws;
  size_t ws_bytes;
  int math, pointer_mode, atomics;
};

struct gemm_args {
  cublasHandle_t h;
  int ta, tb, m, n, k, lda, ldb, ldc;
  float alpha, beta;
  const float *a, *b;
  float *c;
  void *ws;
  size_t ws_bytes;
  int math;
  int batch;            /* matrices; 1 for cublasSgemm */
  long long sa, sb, sc; /* their strides, in floats */
  int bf16;             /* cublasGemmEx: a and b are bf16 (uint16_t), c fp32 */
};
static_assert(sizeof(gemm_args) <= DP_SIM_ARG_BYTES, "gemm arguments too large");

extern "C" const char *cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  default: return "CUBLAS_STATUS_INTERNAL_ERROR";
  }
}
extern "C" const char *cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "success";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
  case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
  case CUBLAS_STATUS_INVALID_VALUE:
    return "an invalid numeric value was used as an argument";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
  default: return "an internal operation failed";
  }
}

extern "C" cublasStatus_t cublasCreate(cublasHandle_t *h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  *h = (dp_sim_blas *)calloc(1, sizeof(dp_sim_blas));
  return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
extern "C" cublasStatus_t cublasDestroy(cublasHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  free(h);
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  h->ws = NULL; /* as cuBLAS: a new stream means the default workspace pool again */
  h->ws_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if ((ws && (uintptr_t)ws % 256) || (bytes && !ws) ||
      (ws && !dp_sim_lookup(ws, bytes, NULL, NULL)))
    return CUBLAS_STATUS_INVALID_VALUE;
  h->ws = ws;
  h->ws_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  int base = (int)mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_TF32_TENSOR_OP_MATH &&
      base != CUBLAS_PEDANTIC_MATH && base != CUBLAS_TENSOR_OP_MATH)
    return CUBLAS_STATUS_INVALID_VALUE;
  h->math = base;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetAtomicsMode(cublasHandle_t h, cublasAtomicsMode_t mode) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->atomics = (int)mode;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t mode) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
    return CUBLAS_STATUS_INVALID_VALUE;
  h->pointer_mode = (int)mode;
  return CUBLAS_STATUS_SUCCESS;
}

static float tf32(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  memcpy(&x, &u, 4);
  return x;
}

static float at(const float *a, int ld, int trans, int row, int col, bool round) {
  float v = trans ? a[(size_t)row * ld + col] : a[(size_t)col * ld + row];
  return round ? tf32(v) : v;
}

static float bf16_at(const void *a, int ld, int trans, int row, int col) {
  const uint16_t *h = (const uint16_t *)a;
  uint32_t u = (uint32_t)(trans ? h[(size_t)row * ld + col] : h[(size_t)col * ld + row])
               << 16;
  float v;
  memcpy(&v, &u, 4);
  return v;
}

/* cublasGemmEx with bf16 a and b, fp32 c and compute: each product exact in
 * fp32, summed by fma in ascending p from +0 (the simulation's order, one pass;
 * not the cpu backend's pair order). */
static void gemm_bf16(const gemm_args *g) {
  for (int j = 0; j < g->n; j++)
    for (int i = 0; i < g->m; i++) {
      float acc = 0.0f;
      for (int p = 0; p < g->k; p++)
        acc = fmaf(bf16_at(g->a, g->lda, g->ta, i, p), bf16_at(g->b, g->ldb, g->tb, p, j),
                   acc);
      float *c = &g->c[(size_t)j * g->ldc + i];
      *c = g->beta != 0.0f ? fmaf(g->beta, *c, g->alpha * acc) : g->alpha * acc;
    }
}

/* One column j of C's sums over p in [p0, p1): acc[i] = fma(a(i,p), b(p,j), acc[i]) in
 * ascending p, for rows [i0, i0 + n) — the documented order, loop-interchanged so that
 * the inner loop runs over rows. fmaf is exact, so the hardware instruction (when the
 * CPU has one) and libm give the same bits; the target attribute only makes it fast. */
#define GEMM_ROWS 256
template <bool T>
__attribute__((target("fma"))) static void column_sums(const gemm_args *g, int j, int i0,
                                                       int n, int p0, int p1, bool round,
                                                       float *acc) {
  for (int i = 0; i < n; i++) acc[i] = 0.0f;
  for (int p = p0; p < p1; p++) {
    float bv = at(g->b, g->ldb, g->tb, p, j, round);
    for (int i = 0; i < n; i++) {
      float av =
          T ? g->a[(size_t)(i0 + i) * g->lda + p] : g->a[(size_t)p * g->lda + i0 + i];
      acc[i] = fmaf(round ? tf32(av) : av, bv, acc[i]);
    }
  }
}

__attribute__((target("fma"))) static void gemm_fma(const gemm_args *g, int split,
                                                    bool round) {
  float lo[GEMM_ROWS], hi[GEMM_ROWS];
  for (int j = 0; j < g->n; j++)
    for (int i0 = 0; i0 < g->m; i0 += GEMM_ROWS) {
      int n = g->m - i0 < GEMM_ROWS ? g->m - i0 : GEMM_ROWS;
      if (g->ta) {
        column_sums<true>(g, j, i0, n, 0, split, round, lo);
        column_sums<true>(g, j, i0, n, split, g->k, round, hi);
      } else {
        column_sums<false>(g, j, i0, n, 0, split, round, lo);
        column_sums<false>(g, j, i0, n, split, g->k, round, hi);
      }
      for (int i = 0; i < n; i++) {
        float sum = split < g->k ? lo[i] + hi[i] : lo[i];
        float *c = &g->c[(size_t)j * g->ldc + i0 + i];
        *c = g->beta != 0.0f ? fmaf(g->beta, *c, g->alpha * sum) : g->alpha * sum;
      }
    }
}

static void gemm_plain(const gemm_args *g, int split, bool round) {
  for (int j = 0; j < g->n; j++)
    for (int i = 0; i < g->m; i++) {
      float lo = 0.0f, hi = 0.0f;
      for (int p = 0; p < split; p++)
        lo = fmaf(at(g->a, g->lda, g->ta, i, p, round),
                  at(g->b, g->ldb, g->tb, p, j, round), lo);
      for (int p = split; p < g->k; p++)
        hi = fmaf(at(g->a, g->lda, g->ta, i, p, round),
                  at(g->b, g->ldb, g->tb, p, j, round), hi);
      float sum = split < g->k ? lo + hi : lo;
      float *c = &g->c[(size_t)j * g->ldc + i];
      *c = g->beta != 0.0f ? fmaf(g->beta, *c, g->alpha * sum) : g->alpha * sum;
    }
}

/* Every matrix of the call 16-byte aligned: the addresses, and in a batch the
 * strides (in floats, a multiple of 4). */
static bool aligned_ptrs(const float *a, const float *b, const float *c, int batch,
                         long long sa, long long sb, long long sc) {
  bool ptrs = (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 && (uintptr_t)c % 16 == 0;
  return ptrs && (batch <= 1 || (sa % 4 == 0 && sb % 4 == 0 && sc % 4 == 0));
}

static void run_gemm(dp_sim_op *op, dp_sim_stream *s) {
  (void)s;
  const gemm_args *g0 = (const gemm_args *)op->args;
  if (g0->ws && g0->ws_bytes)
    memset(g0->ws, 0xa5, g0->ws_bytes < 4096 ? g0->ws_bytes : 4096);
  /* Three kernels, chosen as a real library weighs the operands' addresses and
   * their leading dimensions separately: one pass when both are 16-byte
   * aligned, else two sums split at k / 2 (aligned addresses) or k / 3. One
   * kernel for the whole of a batched call. */
  bool ptrs = aligned_ptrs(g0->a, g0->b, g0->c, g0->batch, g0->sa, g0->sb, g0->sc);
  bool lds = g0->lda % 4 == 0 && g0->ldb % 4 == 0 && g0->ldc % 4 == 0;
  int split = (ptrs && lds) || getenv("DP_SIM_GEMM_ONE_PASS") ? g0->k
              : ptrs                                          ? g0->k / 2
                                                              : g0->k / 3;
  bool round = g0->math == CUBLAS_TF32_TENSOR_OP_MATH;
  if (g0->bf16) {
    gemm_bf16(g0);
    return;
  }
  static const bool fma_hw = __builtin_cpu_supports("fma");
  for (int i = 0; i < g0->batch; i++) { /* matrix i, in order */
    gemm_args g = *g0;
    g.a += i * g0->sa;
    g.b += i * g0->sb;
    g.c += i * g0->sc;
    if (fma_hw)
      gemm_fma(&g, split, round);
    else
      gemm_plain(&g, split, round);
  }
}

/* Whether the column-major matrix (rows x cols, leading dimension ld) lies in one
 * allocation of the simulation. */
static bool inside(const void *p, int rows, int cols, int ld, size_t esz = sizeof(float)) {
  if (rows == 0 || cols == 0) return true;
  size_t bytes = ((size_t)(cols - 1) * ld + rows) * esz;
  return dp_sim_lookup(p, bytes, NULL, NULL);
}

/* Checks and enqueues one call: cublasSgemm (batch 0) or matrices
 * [0, batch) of cublasSgemmStridedBatched. */
static cublasStatus_t enqueue_gemm(cublasHandle_t h, cublasOperation_t ta,
                                   cublasOperation_t tb, int m, int n, int k,
                                   const float *alpha, const float *a, int lda,
                                   long long sa, const float *b, int ldb, long long sb,
                                   const float *beta, float *c, int ldc, long long sc,
                                   int batch) {
  const char *name = batch ? "cublasSgemmStridedBatched" : "cublasSgemm";
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (h->pointer_mode != CUBLAS_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
  int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
  int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || !alpha || !beta || lda < (ar > 1 ? ar : 1) ||
      ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1) ||
      (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
    return CUBLAS_STATUS_INVALID_VALUE;
  int count = batch ? batch : 1;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  for (int i = 0; i < count; i++)
    if ((k > 0 && (!inside(a + i * sa, ar, ac, lda) || !inside(b + i * sb, br, bc, ldb))) ||
        !inside(c + i * sc, m, n, ldc)) {
      dp_sim_report(
          "%s: an operand is not device memory of the simulation, or runs past the end "
          "of its allocation (m %d, n %d, k %d, lda %d, ldb %d, ldc %d, matrix %d)",
          name, m, n, k, lda, ldb, ldc, i);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  /* the kernel class run_gemm picks: addresses aligned (bit 1), leading dims (bit 0) */
  int aligned = aligned_ptrs(a, b, c, count, sa, sb, sc) * 2 +
                (lda % 4 == 0 && ldb % 4 == 0 && ldc % 4 == 0);
  dp_sim_stream *st = dp_sim_stream_of(h->stream);
  note_kind(gemm_kind{st ? st->dev : -1, (int)ta, (int)tb, m, n, k, lda, ldb, ldc, aligned,
                      h->math, batch},
            st);
  dp_sim_op op;
  op.kind = SIM_EXT;
  op.u.x.run = run_gemm;
  gemm_args *g = (gemm_args *)op.args;
  *g = gemm_args{h,
                 ta == CUBLAS_OP_T,
                 tb == CUBLAS_OP_T,
                 m,
                 n,
                 k,
                 lda,
                 ldb,
                 ldc,
                 *alpha,
                 *beta,
                 a,
                 b,
                 c,
                 h->ws,
                 h->ws_bytes,
                 h->math,
                 count,
                 sa,
                 sb,
                 sc,
                 0};
  cudaError_t e = dp_sim_enqueue(h->stream, &op);
  if (e != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta,
                                      cublasOperation_t tb, int m, int n, int k,
                                      const float *alpha, const float *a, int lda,
                                      const float *b, int ldb, const float *beta, float *c,
                                      int ldc) {
  return enqueue_gemm(h, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 0);
}

/* cuBLAS: batchCount 0 is valid and does nothing; the strides may be any
 * values (0 shares one matrix), the matrices are computed as if one after the
 * other (the output matrices must not overlap). */
extern "C" cublasStatus_t
cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                          int m, int n, int k, const float *alpha, const float *a, int lda,
                          long long int strideA, const float *b, int ldb,
                          long long int strideB, const float *beta, float *c, int ldc,
                          long long int strideC, int batchCount) {
  if (batchCount == 0) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    return batchCount < 0 ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
  }
  if (batchCount < 0) return CUBLAS_STATUS_INVALID_VALUE;
  return enqueue_gemm(h, ta, tb, m, n, k, alpha, a, lda, strideA, b, ldb, strideB, beta, c,
                      ldc, strideC, batchCount);
}

/* The one cublasGemmEx the cuda backend makes (precision bf16, cuda/mixed.cu):
 * bf16 a and b, fp32 c, fp32 compute; anything else is CUBLAS_STATUS_NOT_SUPPORTED
 * here. Checked and enqueued as cublasSgemm's calls are. */
extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta,
                                       cublasOperation_t tb, int m, int n, int k,
                                       const void *alpha, const void *a, cudaDataType_t atype,
                                       int lda, const void *b, cudaDataType_t btype, int ldb,
                                       const void *beta, void *c, cudaDataType_t ctype,
                                       int ldc, cublasComputeType_t compute,
                                       cublasGemmAlgo_t algo) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (atype != CUDA_R_16BF || btype != CUDA_R_16BF || ctype != CUDA_R_32F ||
      compute != CUBLAS_COMPUTE_32F || algo != CUBLAS_GEMM_DEFAULT)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (h->pointer_mode != CUBLAS_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
  int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
  int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
  if (m < 0 || n < 0 || k < 0 || !alpha || !beta || lda < (ar > 1 ? ar : 1) ||
      ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1) ||
      (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  if ((k > 0 && (!inside(a, ar, ac, lda, 2) || !inside(b, br, bc, ldb, 2))) ||
      !inside(c, m, n, ldc)) {
    dp_sim_report("cublasGemmEx: an operand is not device memory of the simulation, or runs "
                  "past the end of its allocation (m %d, n %d, k %d, lda %d, ldb %d, ldc %d)",
                  m, n, k, lda, ldb, ldc);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  dp_sim_stream *st = dp_sim_stream_of(h->stream);
  note_kind(gemm_kind{st ? st->dev : -1, (int)ta, (int)tb, m, n, k, lda, ldb, ldc, 4,
                      h->math, -1},
            st);
  dp_sim_op op;
  op.kind = SIM_EXT;
  op.u.x.run = run_gemm;
  gemm_args *g = (gemm_args *)op.args;
  *g = gemm_args{h,
                 ta == CUBLAS_OP_T,
                 tb == CUBLAS_OP_T,
                 m,
                 n,
                 k,
                 lda,
                 ldb,
                 ldc,
                 *(const float *)alpha,
                 *(const float *)beta,
                 (const float *)a,
                 (const float *)b,
                 (float *)c,
                 h->ws,
                 h->ws_bytes,
                 h->math,
                 1,
                 0,
                 0,
                 0,
                 1};
  return dp_sim_enqueue(h->stream, &op) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                        : CUBLAS_STATUS_EXECUTION_FAILED;
}
