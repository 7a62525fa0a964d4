/* The sequence layers on the GPU, lib/cpu/sequence.c's math and orders on the
 * n rows of a micro-batch, each row (T, width) position-major.
 *
 * Embedding: y = token row + position row (one add per element). Its
 * backward writes every gradient element from one thread, from +0 (or, tied to
 * the output head, from the head's gradient already there), in
 * dp__embed_backward's order: a token row's element adds dy's rows of that
 * id in (r, t) ascending order (one block per vocabulary row; the ids come
 * through shared memory a chunk at a time), a position row's element adds
 * dy's rows at that position, r ascending. No atomics: the CPU's bits.
 *
 * Attention, head h of row r (hd = D / H; q, k, v at columns h hd, D + h hd,
 * 2D + h hd of the (T, 3D) row): row-major matrices seen by cuBLAS as their
 * column-major transposes (cuda/gemm.cu), one cublasSgemmStridedBatched per
 * head over the n rows:
 *   S  (T, T) = q k^T        (T, N, m T,  n T, k hd)  into p's (r, h) matrix
 *   p         = causal softmax of S / sqrt(hd)        (k_causal_softmax)
 *   y  (T, hd) = p v         (N, N, m hd, n T, k T)
 * backward, the d(scores) of one head at a time in the scratch (n, T, T):
 *   dv = p^T dy              (N, T, m hd, n T, k T)
 *   dp = dy v^T              (T, N, m T,  n T, k hd)  into the scratch
 *   ds = p (dp - sum_j p dp) / sqrt(hd), 0 above the diagonal (in place)
 *   dq = ds k                (N, N, m hd, n T, k T)
 *   dk = ds^T q              (N, T, m hd, n T, k T)
 * Every product runs over the full dimension; the CPU computes only the
 * causal triangle, whose elements have the full product's bits, and its
 * chains over zeros above the diagonal keep their +0 start, so where
 * cuBLAS's order is one fma chain ascending from +0 (the simulation's one-pass
 * kernel) these are the CPU's bits. The softmax and its backward: one thread
 * per row, the CPU's expressions unfused (scale, max, dp__expf, the sum in
 * util/expf.h's 16 lanes, divide; the dot in those lanes, p (dp - dot) scale),
 * zeros above the diagonal.
 *
 * Dropout on the probabilities (training, l->p > 0): a head's kept ones, pd
 * (n, T, T), go in a second scratch block (k_attention_drop: the mask from
 * the dropout layer's keys, times 1 / (1 - p), as lib/cpu/sequence.c's
 * drop_probs), and y = pd v, dv = pd^T dy take pd for p. The backward makes
 * pd again from the keys (nothing is kept between the passes, as on the CPU)
 * and puts dp through the dropout (times the scale where pd is not 0) before
 * the softmax's backward, which still takes the saved p. */
#include "grid.cuh"
#include "rng.cuh"
#include "sequence.cuh"
#include "util/expf.h" /* dp__expf, the 16 lanes: lib/cpu/softmax.c's */

#include <math.h>

/* ---- embedding ----------------------------------------------------------------- */

/* An id as a row index; -1 when it is none (the host checked them: a second line). */
static __device__ __forceinline__ int id_of(float f, int V) {
  return f >= 0.0f && f < (float)V ? (int)f : -1;
}

static __global__ void k_embed_forward(const float *ids, const float *w, float *y, size_t N,
                                       int T, int D, int V) {
  const float *pos = w + (size_t)V * D; /* (T, D) after the tokens' (V, D) */
  GRID_STRIDE(i, N * (size_t)D) {
    size_t j = i / (size_t)D; /* the (row, position) */
    int k = (int)(i % (size_t)D), v = id_of(ids[j], V);
    float tok = v >= 0 ? w[(size_t)v * D + k] : 0.0f;
    y[i] = fa(tok, pos[(j % (size_t)T) * D + k]);
  }
}

/* Block b: vocabulary rows b, b + gridDim.x, ...; its threads the columns. keep: a
 * tied output head's gradient is there already, and the rows add to it. */
static __global__ void __launch_bounds__(THREADS)
    k_embed_dtok(const float *ids, const float *dy, float *dw, size_t N, int D, int V,
                 int keep) {
  __shared__ int sid[THREADS];
  for (int v = (int)blockIdx.x; v < V; v += (int)gridDim.x) { /* block-uniform */
    float *row = dw + (size_t)v * D;
    if (!keep) /* block-uniform */
      for (int k = (int)threadIdx.x; k < D; k += THREADS) row[k] = 0.0f;
    for (size_t j0 = 0; j0 < N; j0 += THREADS) {
      __syncthreads(); /* the last chunk's ids are read */
      if (j0 + threadIdx.x < N) sid[threadIdx.x] = id_of(ids[j0 + threadIdx.x], V);
      __syncthreads();
      size_t m = N - j0 < THREADS ? N - j0 : THREADS;
      for (size_t j = 0; j < m; j++) /* (r, t) ascending */
        if (sid[j] == v)
          for (int k = (int)threadIdx.x; k < D; k += THREADS)
            row[k] = fa(row[k], dy[(j0 + j) * D + k]);
    }
  }
}

/* Element (t, k) of the position rows: dy's rows at position t, r ascending. */
static __global__ void k_embed_dpos(const float *dy, float *dpos, int n, int T, int D) {
  GRID_STRIDE(i, (size_t)T * D) {
    float s = 0.0f;
    for (int r = 0; r < n; r++) s = fa(s, dy[(size_t)r * T * D + i]);
    dpos[i] = s;
  }
}

cudaError_t dp_k_embed_forward(cudaStream_t st, const dp_layer *l, int n, const float *ids,
                               const float *w, float *y) {
  size_t N = (size_t)n * l->t, count = N * (size_t)l->c;
  if (count == 0) return cudaSuccess;
  DP_LAUNCH(k_embed_forward, blocks_for(count), THREADS, 0, st)
  (ids, w, y, N, l->t, l->c, l->vocab);
  return cudaGetLastError();
}

cudaError_t dp_k_embed_backward(cudaStream_t st, const dp_layer *l, int n, const float *ids,
                                const float *dy, float *dw) {
  int T = l->t, D = l->c, V = l->vocab;
  if (D <= 0 || V <= 0 || T <= 0) return cudaSuccess;
  unsigned grid = (unsigned)V < MAX_BLOCKS ? (unsigned)V : MAX_BLOCKS;
  DP_LAUNCH(k_embed_dtok, grid, THREADS, 0, st)(ids, dy, dw, (size_t)n * T, D, V, l->tied);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  DP_LAUNCH(k_embed_dpos, blocks_for((size_t)T * D), THREADS, 0, st)
  (dy, dw + (size_t)V * D, n, T, D);
  return cudaGetLastError();
}

static __global__ void k_residual_add(const float *skip, const float *x, float *y,
                                      size_t n) {
  GRID_STRIDE(i, n) y[i] = fa(skip[i], x[i]);
}

cudaError_t dp_k_residual_add(cudaStream_t st, const float *skip, const float *x, float *y,
                              size_t count) {
  if (count == 0) return cudaSuccess;
  DP_LAUNCH(k_residual_add, blocks_for(count), THREADS, 0, st)(skip, x, y, count);
  return cudaGetLastError();
}

/* ---- the causal softmax and its backward ------------------------------------------ */

/* lib/cpu/softmax.c's order: the max and the sum of exps in util/expf.h's 16
 * lanes (lane l: columns l, l + 16, ... ascending; then dp__lanes_total), e^x
 * by dp__expf. The lanes' loops are unrolled so their arrays stay in
 * registers. */
static __global__ void k_causal_softmax(float *s, size_t rows, int T, float scale) {
  GRID_STRIDE(row, rows) {
    float *r = s + row * (size_t)T, m[DP_SUM_LANES], a[DP_SUM_LANES];
    int len = (int)(row % (size_t)T) + 1; /* the query position i: keys 0..i */
    DP_UNROLL
    for (int l = 0; l < DP_SUM_LANES; l++) m[l] = -INFINITY, a[l] = 0.0f;
    for (int j0 = 0; j0 < len; j0 += DP_SUM_LANES) {
      DP_UNROLL
      for (int l = 0; l < DP_SUM_LANES; l++)
        if (j0 + l < len) {
          float v = fm(r[j0 + l], scale);
          r[j0 + l] = v;
          m[l] = v > m[l] ? v : m[l];
        }
    }
    float mx = m[0];
    DP_UNROLL
    for (int l = 1; l < DP_SUM_LANES; l++) mx = m[l] > mx ? m[l] : mx;
    for (int j0 = 0; j0 < len; j0 += DP_SUM_LANES) {
      DP_UNROLL
      for (int l = 0; l < DP_SUM_LANES; l++)
        if (j0 + l < len) {
          float e = dp__expf(fs(r[j0 + l], mx));
          r[j0 + l] = e;
          a[l] = fa(a[l], e);
        }
    }
    float sum = dp__lanes_total(a);
    for (int j = 0; j < len; j++) r[j] = fd(r[j], sum);
    for (int j = len; j < T; j++) r[j] = 0.0f;
  }
}

/* Row (b, i) of ds (n, T, T): ds = p (dp - sum_j<=i p dp) scale, 0 above; with
 * the kept probabilities pd, dp through the dropout first. */
static __global__ void k_causal_softmax_bwd(const float *p, size_t p_stride, float *ds,
                                            size_t rows, int T, float scale,
                                            const float *pd, float keep) {
  GRID_STRIDE(row, rows) {
    size_t b = row / (size_t)T;
    int i = (int)(row % (size_t)T);
    const float *pr = p + b * p_stride + (size_t)i * T;
    float *dr = ds + row * (size_t)T, dot = 0.0f;
    if (pd) /* dropped: 0 (also where p is 0, which the softmax's backward zeroes anyway) */
      for (int j = 0; j <= i; j++)
        dr[j] = pd[row * (size_t)T + j] != 0.0f ? fm(dr[j], keep) : 0.0f;
    float a[DP_SUM_LANES]; /* the dot in lib/cpu/softmax.c's 16 lanes */
    DP_UNROLL
    for (int l = 0; l < DP_SUM_LANES; l++) a[l] = 0.0f;
    for (int j0 = 0; j0 <= i; j0 += DP_SUM_LANES) {
      DP_UNROLL
      for (int l = 0; l < DP_SUM_LANES; l++)
        if (j0 + l <= i) a[l] = fa(a[l], fm(pr[j0 + l], dr[j0 + l]));
    }
    dot = dp__lanes_total(a);
    for (int j = 0; j <= i; j++) dr[j] = fm(fm(pr[j], fs(dr[j], dot)), scale);
    for (int j = i + 1; j < T; j++) dr[j] = 0.0f;
  }
}

cudaError_t dp_k_causal_softmax(cudaStream_t st, float *s, int rows, int T, float scale) {
  if (rows <= 0 || T <= 0) return cudaSuccess;
  DP_LAUNCH(k_causal_softmax, blocks_for((size_t)rows), THREADS, 0, st)
  (s, (size_t)rows, T, scale);
  return cudaGetLastError();
}

cudaError_t dp_k_causal_softmax_backward(cudaStream_t st, const float *p, size_t p_stride,
                                         float *ds, int n, int T, float scale,
                                         const float *pd, float keep) {
  size_t rows = (size_t)(n > 0 ? n : 0) * (size_t)(T > 0 ? T : 0);
  if (rows == 0) return cudaSuccess;
  DP_LAUNCH(k_causal_softmax_bwd, blocks_for(rows), THREADS, 0, st)
  (p, p_stride, ds, rows, T, scale, pd, keep);
  return cudaGetLastError();
}

/* Element (b, i, j) of pd (n, T, T): head h's probability kept times keep, or 0
 * (dropped, or above the diagonal). e0 = h T T: the element key's head part. */
static __global__ void k_attention_drop(const float *p, size_t p_stride, float *pd,
                                        size_t count, int T, uint64_t seed,
                                        const dp_cuda_header *hdr, uint64_t layer,
                                        uint64_t row0, uint64_t e0, float prob,
                                        float keep) {
  const uint64_t key = (hdr->sc.step << 16) | layer;
  const size_t tt = (size_t)T * (size_t)T;
  GRID_STRIDE(k, count) {
    size_t b = k / tt, e = k % tt;
    float v = 0.0f;
    if (e % (size_t)T <= e / (size_t)T) { /* j <= i */
      float u = dp_d_rng_uniform(seed, DP_RNG_DROPOUT, key, row0 + b, e0 + e);
      v = u >= prob ? fm(p[b * p_stride + e], keep) : 0.0f;
    }
    pd[k] = v;
  }
}

cudaError_t dp_k_attention_drop(cudaStream_t st, const dp_layer *l,
                                const dp_cuda_attn_drop *drop, int h, const float *p,
                                size_t p_stride, float *pd, int n, float keep) {
  size_t tt = (size_t)l->t * (size_t)l->t, count = (size_t)(n > 0 ? n : 0) * tt;
  if (count == 0) return cudaSuccess;
  DP_LAUNCH(k_attention_drop, blocks_for(count), THREADS, 0, st)
  (p, p_stride, pd, count, l->t, drop->seed, drop->hdr, drop->layer, drop->row0,
   (uint64_t)h * tt, l->p, keep);
  return cudaGetLastError();
}

/* ---- attention ------------------------------------------------------------------ */

namespace {
/* One head's strided-batched product over the n rows: C = op(A) op(B),
 * column-major (m, n) by k, each operand's matrices `s*` floats apart. */
struct bgemm {
  cublasOperation_t ta, tb;
  int m, n, k;
  const float *a;
  int lda;
  long long sa;
  const float *b;
  int ldb;
  long long sb;
  float *c;
  int ldc;
  long long sc;
};
} // namespace

static dp_status run_bgemm(cublasHandle_t h, const bgemm &g, int batch) {
  const float one = 1.0f, zero = 0.0f;
  DP_CUBLAS_CHECK(cublasSgemmStridedBatched(h, g.ta, g.tb, g.m, g.n, g.k, &one, g.a, g.lda,
                                            g.sa, g.b, g.ldb, g.sb, &zero, g.c, g.ldc, g.sc,
                                            batch));
  return DP_OK;
}

/* The scratch's second block: a head's kept probabilities (n, T, T). */
static float *kept_scratch(const dp_layer *l, int n, void *ws) {
  return (float *)((unsigned char *)ws + dp__cuda_attention_scratch_bytes(l, n));
}

static dp_status ws_short(const dp_layer *l, int n, size_t ws_bytes, const char *pass) {
  return DP_FAIL(DP_ERR_BACKEND,
                 "cuda attention: the workspace holds %zu bytes, the %s needs %zu",
                 ws_bytes, pass, dp__cuda_attention_ws_bytes(l, n));
}

dp_status dp__cuda_attention_forward(cublasHandle_t h, cudaStream_t st, const dp_layer *l,
                                     int n, const float *qkv, float *p, float *y,
                                     const dp_cuda_attn_drop *drop, void *ws,
                                     size_t ws_bytes) {
  if (n <= 0) return DP_OK;
  if (drop && (!ws || ws_bytes < dp__cuda_attention_ws_bytes(l, n)))
    return ws_short(l, n, ws_bytes, "forward with dropout");
  const int T = l->t, D = l->c, H = l->heads, hd = D / H;
  const long long row = (long long)T * 3 * D, tt = (long long)T * T;
  const float scale = 1.0f / sqrtf((float)hd);
  const cublasOperation_t N = CUBLAS_OP_N, Tr = CUBLAS_OP_T;
  for (int hh = 0; hh < H; hh++) { /* S (T, T) = q k^T into p's (r, hh) */
    const float *q = qkv + (size_t)hh * hd, *k = q + D;
    dp_status s = run_bgemm(
        h, bgemm{Tr, N, T, T, hd, k, 3 * D, row, q, 3 * D, row, p + hh * tt, T, H * tt}, n);
    if (s != DP_OK) return s;
  }
  DP_CUDA_CHECK(dp_k_causal_softmax(st, p, n * H * T, T, scale));
  float *pd = drop ? kept_scratch(l, n, ws) : NULL;
  const float keep = drop ? 1.0f / (1.0f - l->p) : 1.0f;
  for (int hh = 0; hh < H; hh++) { /* y (T, hd) = p v, or (kept p) v */
    const float *v = qkv + (size_t)hh * hd + 2 * D, *pk = p + hh * tt;
    long long ks = H * tt;
    if (drop) {
      DP_CUDA_CHECK(dp_k_attention_drop(st, l, drop, hh, pk, (size_t)ks, pd, n, keep));
      pk = pd;
      ks = tt;
    }
    dp_status s = run_bgemm(h,
                            bgemm{N, N, hd, T, T, v, 3 * D, row, pk, T, ks,
                                  y + (size_t)hh * hd, D, (long long)T * D},
                            n);
    if (s != DP_OK) return s;
  }
  return DP_OK;
}

dp_status dp__cuda_attention_backward(cublasHandle_t h, cudaStream_t st, const dp_layer *l,
                                      int n, const float *qkv, const float *p,
                                      const float *dy, float *dqkv,
                                      const dp_cuda_attn_drop *drop, void *ws,
                                      size_t ws_bytes) {
  if (n <= 0) return DP_OK;
  if (!ws || ws_bytes < dp__cuda_attention_ws_bytes(l, n))
    return ws_short(l, n, ws_bytes, "backward");
  const int T = l->t, D = l->c, H = l->heads, hd = D / H;
  const long long row = (long long)T * 3 * D, tt = (long long)T * T,
                  yrow = (long long)T * D;
  const float scale = 1.0f / sqrtf((float)hd);
  const cublasOperation_t N = CUBLAS_OP_N, Tr = CUBLAS_OP_T;
  float *ds = (float *)ws; /* (n, T, T): d(probabilities), then d(scores) */
  float *pd = drop ? kept_scratch(l, n, ws) : NULL; /* (n, T, T): the kept ones */
  const float keep = drop ? 1.0f / (1.0f - l->p) : 1.0f;
  for (int hh = 0; hh < H; hh++) {
    size_t at = (size_t)hh * hd;
    const float *q = qkv + at, *k = q + D, *v = k + D, *ph = p + hh * tt, *g = dy + at;
    float *dq = dqkv + at, *dk = dq + D, *dv = dk + D;
    const float *pk = ph; /* what y = p v read */
    long long ks = H * tt;
    if (drop) {
      DP_CUDA_CHECK(dp_k_attention_drop(st, l, drop, hh, ph, (size_t)ks, pd, n, keep));
      pk = pd;
      ks = tt;
    }
    const bgemm steps[] = {
        {N, Tr, hd, T, T, g, D, yrow, pk, T, ks, dv, 3 * D, row}, /* dv = p^T dy */
        {Tr, N, T, T, hd, v, 3 * D, row, g, D, yrow, ds, T, tt},  /* dp = dy v^T */
    };
    for (const bgemm &b : steps) {
      dp_status s = run_bgemm(h, b, n);
      if (s != DP_OK) return s;
    }
    DP_CUDA_CHECK(
        dp_k_causal_softmax_backward(st, ph, (size_t)(H * tt), ds, n, T, scale, pd, keep));
    const bgemm after[] = {
        {N, N, hd, T, T, k, 3 * D, row, ds, T, tt, dq, 3 * D, row},  /* dq = ds k */
        {N, Tr, hd, T, T, q, 3 * D, row, ds, T, tt, dk, 3 * D, row}, /* dk = ds^T q */
    };
    for (const bgemm &b : after) {
      dp_status s = run_bgemm(h, b, n);
      if (s != DP_OK) return s;
    }
  }
  return DP_OK;
}

cudaError_t dp_k_sequence_preload(void) {
  const void *const kernels[] = {
      (const void *)k_embed_forward,  (const void *)k_embed_dtok,
      (const void *)k_embed_dpos,     (const void *)k_residual_add,
      (const void *)k_causal_softmax, (const void *)k_causal_softmax_bwd,
      (const void *)k_attention_drop,
  };
  return dp_k_load(kernels, sizeof kernels / sizeof kernels[0]);
}
