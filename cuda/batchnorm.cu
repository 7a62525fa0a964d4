/* Batch normalisation kernels: lib/cpu/backend.c's bn_forward, bn_backward,
 * bn_update and the sync ops (bn_stats_op, bn_merge_op, bn_final_op,
 * bn_bwd_stats_op, bn_sync_backward), the same quantities from the same
 * formulas, one IEEE operation at a time (__fmul_rn and friends: nvcc
 * contracts nothing).
 *
 * Channel reductions: lib/model/model.h's order (dp__bn_chunks), which
 * lib/cpu/backend.c's bn_sums takes too: the channel's M = n S elements in
 * (row, position) order, j = r S + k, are cut into K = dp__bn_chunks(M, C)
 * chunks of L = dp__bn_chunk_len(M, K), one block of BN_THREADS = DP_BN_LANES
 * threads each. In chunk c, thread t sums j = c L + t, c L + t + T, ...
 * ascending from +0 (chan_walk), then the T thread sums are added by a
 * halving tree in shared memory (thread t += thread t + T/2, then t + T/4,
 * ..., 1; block_sum); the chunk sums are added in ascending c from chunk 0's.
 * The order depends on (n, C, S) alone, never on the launch, the device or
 * the device count; every pass over the channel (the mean, then the squared
 * deviations; the backward's sums) takes it, and the float expressions are
 * the CPU's, so the sums are the cpu backend's bits. With K = 1 (at most
 * DP_BN_CHUNK values per channel, or C > DP_BN_SLOTS / 2) one kernel does a
 * channel's whole op in its block; with K > 1 the chunks' blocks
 * (k_bn_chunks) write their sums to the workspace header's batchnorm scratch
 * (dp_cuda_bn_scratch: DP_BN_SLOTS floats per sum, K C <= DP_BN_SLOTS), one
 * thread per channel adds them (k_bn_combine) and finishes the statistics,
 * and the element-wise kernels normalise (k_bn_apply) or write dx (k_bn_dx).
 * Element-wise kernels (eval and sync normalisation, the sync backward's dx)
 * write each element from one thread. The merge, the final statistics and the
 * running-statistics update are a handful of double operations per channel,
 * written as lib/'s (__dmul_rn, __dadd_rn, __ddiv_rn, __dsqrt_rn: the CPU's
 * rounding), in one block, which also writes the partial's count word after
 * every thread has read it. */
#include "batchnorm.cuh"
#include "grid.cuh"
#include "model/model.h"

#include <math.h>

#define BN_THREADS                                                                         \
  DP_BN_LANES /* a chunk's block; element-wise kernels and the per-channel                 \
                 double loops take grid.cuh's THREADS */
static __device__ __forceinline__ double dm(double a, double b) { return __dmul_rn(a, b); }
static __device__ __forceinline__ double da(double a, double b) { return __dadd_rn(a, b); }
static __device__ __forceinline__ double ds(double a, double b) { return __dsub_rn(a, b); }
static __device__ __forceinline__ double dd(double a, double b) { return __ddiv_rn(a, b); }

static __device__ __forceinline__ uint32_t word(const float *at) {
  return *(const uint32_t *)at;
}

/* f(i) for thread t's elements of channel ch's values [j0, j1), in its
 * order: j = j0 + t, j0 + t + T, ... of the channel's (row, position) index
 * j = r S + k, element ((r C + ch) S + k). (r, k) advance by T without a
 * division per element. */
template <typename F>
static __device__ __forceinline__ void chan_walk(size_t j0, size_t j1, int C, int S, int ch,
                                                 F f) {
  const size_t s = (size_t)S, dr = BN_THREADS / s, dk = BN_THREADS % s;
  size_t j = j0 + threadIdx.x, r = j / s, k = j % s;
  for (; j < j1; j += BN_THREADS) {
    f((r * (size_t)C + (size_t)ch) * s + k);
    r += dr;
    k += dk;
    if (k >= s) {
      k -= s;
      r++;
    }
  }
}

/* The whole channel: its one chunk (K = 1). */
template <typename F>
static __device__ __forceinline__ void chan_walk(int n, int C, int S, int ch, F f) {
  chan_walk(0, (size_t)n * (size_t)S, C, S, ch, f);
}

/* The K block-wide sums of v[0..K) by the fixed halving tree, returned in v
 * to every thread; sh: K x BN_THREADS floats, free again on return. */
template <int K>
static __device__ __forceinline__ void block_sum(float (&v)[K], float (*sh)[BN_THREADS]) {
  const int t = (int)threadIdx.x;
  for (int q = 0; q < K; q++) sh[q][t] = v[q];
  __syncthreads();
  for (int w = BN_THREADS / 2; w > 0; w >>= 1) {
    if (t < w)
      for (int q = 0; q < K; q++) sh[q][t] = fa(sh[q][t], sh[q][t + w]);
    __syncthreads();
  }
  for (int q = 0; q < K; q++) v[q] = sh[q][0];
  __syncthreads();
}

/* The channel's mean and sum of squared deviations (two passes). */
static __device__ __forceinline__ void chan_moments(const float *x, int n, int C, int S,
                                                    int ch, float (*sh)[BN_THREADS],
                                                    float *mean, float *m2) {
  const float M = (float)((size_t)n * (size_t)S);
  float v[1] = {0.0f};
  chan_walk(n, C, S, ch, [&](size_t i) { v[0] = fa(v[0], x[i]); });
  block_sum<1>(v, sh);
  const float mu = fd(v[0], M);
  v[0] = 0.0f;
  chan_walk(n, C, S, ch, [&](size_t i) {
    float d = fs(x[i], mu);
    v[0] = fa(v[0], fm(d, d));
  });
  block_sum<1>(v, sh);
  *mean = mu;
  *m2 = v[0];
}

/* ---- per_replica and eval ----------------------------------------------------------- */

static __global__ void __launch_bounds__(BN_THREADS)
    k_bn_forward_train(const float *x, const float *g, const float *b, float *y,
                       float *stats, int n, int C, int S, float eps) {
  __shared__ float sh[1][BN_THREADS];
  const int ch = (int)blockIdx.x;
  const size_t Mi = (size_t)n * (size_t)S;
  const float M = (float)Mi;
  float mean, var;
  chan_moments(x, n, C, S, ch, sh, &mean, &var);
  const float rstd = fd(1.0f, __fsqrt_rn(fa(fd(var, M), eps)));
  if (threadIdx.x == 0) {
    stats[ch] = mean;
    stats[C + ch] = rstd;
    stats[2 * C + ch] = Mi > 1 ? fd(var, (float)(Mi - 1)) : NAN; /* refused before */
  }
  const float gg = g[ch], bb = b[ch];
  chan_walk(n, C, S, ch,
            [&](size_t i) { y[i] = fa(fm(fm(fs(x[i], mean), rstd), gg), bb); });
}

static __global__ void k_bn_apply(const float *x, const float *g, const float *b, float *y,
                                  const float *mean, const float *rstd, const float *var,
                                  int C, int S, size_t total, float eps) {
  GRID_STRIDE(i, total) {
    const int ch = (int)((i / (size_t)S) % (size_t)C);
    const float r = rstd ? rstd[ch] : fd(1.0f, __fsqrt_rn(fa(var[ch], eps)));
    y[i] = fa(fm(fm(fs(x[i], mean[ch]), r), g[ch]), b[ch]);
  }
}

static __global__ void __launch_bounds__(BN_THREADS)
    k_bn_backward(const float *x, const float *stats, const float *g, const float *dy,
                  float *dx, float *dg, float *db, int n, int C, int S) {
  __shared__ float sh[4][BN_THREADS];
  const int ch = (int)blockIdx.x;
  const float M = (float)((size_t)n * (size_t)S);
  const float mean = stats[ch], rstd = stats[C + ch], gg = g[ch];
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* sum dy xh, sum dy, s1, s2 */
  chan_walk(n, C, S, ch, [&](size_t i) {
    float xh = fm(fs(x[i], mean), rstd), dxh = fm(dy[i], gg);
    v[0] = fa(v[0], fm(dy[i], xh));
    v[1] = fa(v[1], dy[i]);
    v[2] = fa(v[2], dxh);
    v[3] = fa(v[3], fm(dxh, xh));
  });
  block_sum<4>(v, sh);
  if (threadIdx.x == 0) {
    dg[ch] = v[0];
    db[ch] = v[1];
  }
  if (!dx) return;
  const float s1 = fd(v[2], M);
  chan_walk(n, C, S, ch, [&](size_t i) {
    float xh = fm(fs(x[i], mean), rstd);
    dx[i] = fm(rstd, fs(fs(fm(dy[i], gg), s1), fd(fm(xh, v[3]), M)));
  });
}

/* ---- sync --------------------------------------------------------------------------- */

static __global__ void __launch_bounds__(BN_THREADS)
    k_bn_part(const float *x, float *part, int n, int C, int S) {
  __shared__ float sh[1][BN_THREADS];
  const int ch = (int)blockIdx.x;
  float mean, m2;
  chan_moments(x, n, C, S, ch, sh, &mean, &m2);
  if (threadIdx.x == 0) {
    part[1 + ch] = mean;
    part[1 + C + ch] = m2;
    if (ch == 0) *(uint32_t *)part = (uint32_t)n;
  }
}

static __global__ void k_bn_merge(float *a, const float *b, int C, int S) {
  const uint32_t ca = word(a), cb = word(b);
  const double na = dm((double)ca, (double)S), nb = dm((double)cb, (double)S),
               nn = da(na, nb);
  for (int ch = (int)threadIdx.x; ch < C; ch += (int)blockDim.x) {
    const double am = (double)a[1 + ch], delta = ds((double)b[1 + ch], am);
    a[1 + ch] = (float)da(am, dm(delta, dd(nb, nn)));
    a[1 + C + ch] = (float)da(da((double)a[1 + C + ch], (double)b[1 + C + ch]),
                              dm(dm(delta, delta), dd(dm(na, nb), nn)));
  }
  __syncthreads(); /* every thread has read a's count */
  if (threadIdx.x == 0) *(uint32_t *)a = ca + cb;
}

static __global__ void k_bn_final(float *f, const float *root, int C, int S, float eps) {
  const uint32_t rows = word(root);
  const double M = dm((double)rows, (double)S);
  for (int ch = (int)threadIdx.x; ch < C; ch += (int)blockDim.x) {
    const double m2 = (double)root[1 + C + ch];
    f[ch] = root[1 + ch];
    f[C + ch] = (float)dd(1.0, __dsqrt_rn(da(dd(m2, M), (double)eps)));
    f[2 * C + ch] = M > 1 ? (float)dd(m2, ds(M, 1.0)) : NAN; /* refused before */
  }
  if (threadIdx.x == 0) *(uint32_t *)(f + 3 * (size_t)C) = rows;
}

static __global__ void __launch_bounds__(BN_THREADS)
    k_bn_bwd_sums(const float *x, const float *f, const float *dy, float *dg, float *db,
                  int n, int C, int S) {
  __shared__ float sh[2][BN_THREADS];
  const int ch = (int)blockIdx.x;
  const float mean = f[ch], rstd = f[C + ch];
  float v[2] = {0.0f, 0.0f}; /* sum dy xh, sum dy */
  chan_walk(n, C, S, ch, [&](size_t i) {
    v[0] = fa(v[0], fm(dy[i], fm(fs(x[i], mean), rstd)));
    v[1] = fa(v[1], dy[i]);
  });
  block_sum<2>(v, sh);
  if (threadIdx.x == 0) {
    dg[ch] = v[0];
    db[ch] = v[1];
  }
}

static __global__ void k_bn_sync_dx(const float *x, const float *f, const float *sums,
                                    const float *g, const float *dy, float *dx, int C,
                                    int S, size_t total) {
  const float M = (float)dm((double)word(f + 3 * (size_t)C), (double)S);
  GRID_STRIDE(i, total) {
    const int ch = (int)((i / (size_t)S) % (size_t)C);
    const float mean = f[ch], rstd = f[C + ch], gg = g[ch];
    const float s1 = fd(fm(gg, sums[C + ch]), M), s2 = fd(fm(gg, sums[ch]), M);
    const float xh = fm(fs(x[i], mean), rstd);
    dx[i] = fm(rstd, fs(fs(fm(dy[i], gg), s1), fm(xh, s2)));
  }
}

/* ---- several blocks per channel (K > 1) ------------------------------------------- */

/* Block b's chunk: c = b % K of channel ch = b / K, the channel's values
 * [j0, j1) (L = dp__bn_chunk_len(M, K)). */
static __device__ __forceinline__ void chunk_of(size_t M, size_t L, int K, int *ch, int *c,
                                                size_t *j0, size_t *j1) {
  *ch = (int)blockIdx.x / K;
  *c = (int)blockIdx.x % K;
  *j0 = (size_t)*c * L < M ? (size_t)*c * L : M;
  *j1 = *j0 + L < M ? *j0 + L : M;
}

/* Chunk (ch, c)'s sum of x (mean NULL) or of (x - mean[ch])^2, as
 * chan_moments' passes, to scratch[ch K + c]. */
static __global__ void __launch_bounds__(BN_THREADS)
    k_bn_chunks(const float *x, const float *mean, float *scratch, int C, int S, int K,
                size_t M, size_t L) {
  __shared__ float sh[1][BN_THREADS];
  int ch, c;
  size_t j0, j1;
  chunk_of(M, L, K, &ch, &c, &j0, &j1);
  float v[1] = {0.0f};
  if (!mean) {
    chan_walk(j0, j1, C, S, ch, [&](size_t i) { v[0] = fa(v[0], x[i]); });
  } else {
    const float mu = mean[ch];
    chan_walk(j0, j1, C, S, ch, [&](size_t i) {
      float d = fs(x[i], mu);
      v[0] = fa(v[0], fm(d, d));
    });
  }
  block_sum<1>(v, sh);
  if (threadIdx.x == 0) scratch[(size_t)ch * K + c] = v[0];
}

/* Chunk (ch, c)'s four backward sums, k_bn_backward's (sum dy xh, sum dy,
 * sum dy g, sum dy g xh; g NULL: 1, for sync's first two alone), to
 * scratch[q DP_BN_SLOTS + ch K + c]. */
static __global__ void __launch_bounds__(BN_THREADS)
    k_bn_grad_chunks(const float *x, const float *dy, const float *mean, const float *rstd,
                     const float *g, float *scratch, int C, int S, int K, size_t M,
                     size_t L) {
  __shared__ float sh[4][BN_THREADS];
  int ch, c;
  size_t j0, j1;
  chunk_of(M, L, K, &ch, &c, &j0, &j1);
  const float mu = mean[ch], rs = rstd[ch], gg = g ? g[ch] : 1.0f;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  chan_walk(j0, j1, C, S, ch, [&](size_t i) {
    float xh = fm(fs(x[i], mu), rs), dxh = fm(dy[i], gg);
    v[0] = fa(v[0], fm(dy[i], xh));
    v[1] = fa(v[1], dy[i]);
    v[2] = fa(v[2], dxh);
    v[3] = fa(v[3], fm(dxh, xh));
  });
  block_sum<4>(v, sh);
  if (threadIdx.x == 0)
    for (int q = 0; q < 4; q++)
      scratch[(size_t)q * DP_BN_SLOTS + (size_t)ch * K + c] = v[q];
}

/* What k_bn_combine finishes from a channel's sums:
 *   BN_MEAN   out[ch] = sum x / M (the mean, which the second pass reads);
 *   BN_STATS  out[C + ch] = rstd, out[2 C + ch] = the unbiased variance
 *             (per_replica's statistics, the mean already at out[ch]);
 *   BN_PART   out[1 + C + ch] = the sum of squared deviations, out[0] = n as a
 *             uint32 word (sync's partial, the mean already at out[1 + ch]);
 *   BN_GRADS  dg[ch] = sum dy xh, db[ch] = sum dy, and sum dy g, sum dy g xh
 *             back into their chunk-0 slots (k_bn_dx reads them). */
enum { BN_MEAN, BN_STATS, BN_PART, BN_GRADS };

/* One thread per channel (C <= DP_BN_SLOTS / 2 when K > 1): each sum's K
 * chunk sums added in ascending chunk order from chunk 0's, then `kind`. */
static __global__ void k_bn_combine(float *scratch, float *out, float *dg, float *db,
                                    int kind, int n, int C, int S, int K, float eps) {
  const size_t Mi = (size_t)n * (size_t)S;
  const float M = (float)Mi;
  const int Q = kind == BN_GRADS ? 4 : 1;
  for (int ch = (int)threadIdx.x; ch < C; ch += (int)blockDim.x) {
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int q = 0; q < Q; q++) {
      float *p = scratch + (size_t)q * DP_BN_SLOTS + (size_t)ch * K;
      v[q] = p[0];
      for (int c = 1; c < K; c++) v[q] = fa(v[q], p[c]);
    }
    if (kind == BN_MEAN) {
      out[ch] = fd(v[0], M);
    } else if (kind == BN_STATS) {
      out[C + ch] = fd(1.0f, __fsqrt_rn(fa(fd(v[0], M), eps)));
      out[2 * C + ch] = Mi > 1 ? fd(v[0], (float)(Mi - 1)) : NAN; /* refused before */
    } else if (kind == BN_PART) {
      out[1 + C + ch] = v[0];
      if (ch == 0) *(uint32_t *)out = (uint32_t)n;
    } else {
      dg[ch] = v[0];
      db[ch] = v[1];
      scratch[2 * (size_t)DP_BN_SLOTS + (size_t)ch * K] = v[2];
      scratch[3 * (size_t)DP_BN_SLOTS + (size_t)ch * K] = v[3];
    }
  }
}

/* k_bn_backward's dx, element-wise, with k_bn_combine's BN_GRADS sums. */
static __global__ void k_bn_dx(const float *x, const float *stats, const float *g,
                               const float *dy, float *dx, const float *scratch, int C,
                               int S, int K, float M, size_t total) {
  GRID_STRIDE(i, total) {
    const int ch = (int)((i / (size_t)S) % (size_t)C);
    const float mean = stats[ch], rstd = stats[C + ch], gg = g[ch];
    const float s1 = fd(scratch[2 * (size_t)DP_BN_SLOTS + (size_t)ch * K], M),
                s2 = scratch[3 * (size_t)DP_BN_SLOTS + (size_t)ch * K];
    const float xh = fm(fs(x[i], mean), rstd);
    dx[i] = fm(rstd, fs(fs(fm(dy[i], gg), s1), fd(fm(xh, s2), M)));
  }
}

/* ---- running statistics ------------------------------------------------------------- */

static __global__ void k_bn_update(const float *stats, float *buf, int C,
                                   const dp_cuda_header *hdr, int n_check,
                                   double momentum) {
  if (block_refused(hdr->status, n_check)) return;
  /* dp__bn_factor (momentum=None: 1 / num_batches_tracked after this step's
   * increment) */
  const uint32_t count = *(const uint32_t *)(buf + 2 * (size_t)C) + 1u;
  const double m = momentum == DP_BN_CUMULATIVE ? dd(1.0, (double)count) : momentum,
               keep = ds(1.0, m);
  for (int ch = (int)threadIdx.x; ch < C; ch += (int)blockDim.x) {
    buf[ch] = (float)da(dm(m, (double)stats[ch]), dm(keep, (double)buf[ch]));
    buf[C + ch] =
        (float)da(dm(m, (double)stats[2 * C + ch]), dm(keep, (double)buf[C + ch]));
  }
  __syncthreads(); /* every thread has read the count */
  if (threadIdx.x == 0) *(uint32_t *)(buf + 2 * (size_t)C) = count;
}

/* ---- launchers ---------------------------------------------------------------------- */

static size_t elems(int n, int C, int S) {
  return n > 0 && C > 0 && S > 0 ? (size_t)n * (size_t)C * (size_t)S : 0;
}

/* K > 1: the mean to mean[0..C) (BN_MEAN), then the squared deviations'
 * sums finished by `kind` into out. */
static cudaError_t chunk_moments(cudaStream_t st, const float *x, float *mean, float *out,
                                 int kind, float *scratch, int n, int C, int S, int K,
                                 float eps) {
  const size_t M = (size_t)n * (size_t)S, L = dp__bn_chunk_len(M, K);
  const unsigned blocks = (unsigned)C * (unsigned)K; /* <= DP_BN_SLOTS */
  for (int pass = 0; pass < 2; pass++) {
    DP_LAUNCH(k_bn_chunks, blocks, BN_THREADS, 0, st)
    (x, pass ? mean : NULL, scratch, C, S, K, M, L);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    DP_LAUNCH(k_bn_combine, 1, THREADS, 0, st)
    (scratch, pass ? out : mean, (float *)NULL, (float *)NULL, pass ? kind : (int)BN_MEAN,
     n, C, S, K, eps);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  return cudaSuccess;
}

/* K > 1: the four backward sums (g NULL: sync's two), dg and db written. */
static cudaError_t chunk_grads(cudaStream_t st, const float *x, const float *stats,
                               const float *g, const float *dy, float *dg, float *db,
                               float *scratch, int n, int C, int S, int K) {
  const size_t M = (size_t)n * (size_t)S, L = dp__bn_chunk_len(M, K);
  DP_LAUNCH(k_bn_grad_chunks, (unsigned)C * (unsigned)K, BN_THREADS, 0, st)
  (x, dy, stats, stats + C, g, scratch, C, S, K, M, L);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  DP_LAUNCH(k_bn_combine, 1, THREADS, 0, st)
  (scratch, (float *)NULL, dg, db, (int)BN_GRADS, n, C, S, K, 0.0f);
  return cudaGetLastError();
}

cudaError_t dp_k_bn_forward_train(cudaStream_t st, const float *x, const float *g,
                                  const float *b, float *y, float *stats, float *scratch,
                                  int n, int C, int S, float eps) {
  if (C <= 0 || S <= 0) return cudaSuccess;
  if (n < 0) n = 0;
  const int K = dp__bn_chunks((size_t)n * (size_t)S, C);
  if (K == 1) {
    DP_LAUNCH(k_bn_forward_train, (unsigned)C, BN_THREADS, 0, st)
    (x, g, b, y, stats, n, C, S, eps);
    return cudaGetLastError();
  }
  cudaError_t e = chunk_moments(st, x, stats, stats, BN_STATS, scratch, n, C, S, K, eps);
  if (e != cudaSuccess) return e;
  return dp_k_bn_apply(st, x, g, b, y, stats, stats + C, NULL, n, C, S, eps);
}

cudaError_t dp_k_bn_apply(cudaStream_t st, const float *x, const float *g, const float *b,
                          float *y, const float *mean, const float *rstd, const float *var,
                          int n, int C, int S, float eps) {
  size_t total = elems(n, C, S);
  if (total == 0) return cudaSuccess;
  DP_LAUNCH(k_bn_apply, blocks_for(total), THREADS, 0, st)
  (x, g, b, y, mean, rstd, var, C, S, total, eps);
  return cudaGetLastError();
}

cudaError_t dp_k_bn_backward(cudaStream_t st, const float *x, const float *stats,
                             const float *g, const float *dy, float *dx, float *dg,
                             float *db, float *scratch, int n, int C, int S) {
  if (C <= 0 || S <= 0) return cudaSuccess;
  if (n < 0) n = 0;
  const int K = dp__bn_chunks((size_t)n * (size_t)S, C);
  if (K == 1) {
    DP_LAUNCH(k_bn_backward, (unsigned)C, BN_THREADS, 0, st)
    (x, stats, g, dy, dx, dg, db, n, C, S);
    return cudaGetLastError();
  }
  cudaError_t e = chunk_grads(st, x, stats, g, dy, dg, db, scratch, n, C, S, K);
  if (e != cudaSuccess || !dx) return e;
  const size_t total = elems(n, C, S);
  DP_LAUNCH(k_bn_dx, blocks_for(total), THREADS, 0, st)
  (x, stats, g, dy, dx, scratch, C, S, K, (float)((size_t)n * (size_t)S), total);
  return cudaGetLastError();
}

cudaError_t dp_k_bn_part(cudaStream_t st, const float *x, float *part, float *scratch,
                         int n, int C, int S) {
  if (C <= 0 || S <= 0) return cudaSuccess;
  if (n < 0) n = 0;
  const int K = dp__bn_chunks((size_t)n * (size_t)S, C);
  if (K == 1) {
    DP_LAUNCH(k_bn_part, (unsigned)C, BN_THREADS, 0, st)(x, part, n, C, S);
    return cudaGetLastError();
  }
  return chunk_moments(st, x, part + 1, part, BN_PART, scratch, n, C, S, K, 0.0f);
}

cudaError_t dp_k_bn_merge(cudaStream_t st, float *a, const float *b, int C, int S) {
  if (C <= 0) return cudaSuccess;
  DP_LAUNCH(k_bn_merge, 1, THREADS, 0, st)(a, b, C, S);
  return cudaGetLastError();
}

cudaError_t dp_k_bn_final(cudaStream_t st, float *f, const float *root, int C, int S,
                          float eps) {
  if (C <= 0) return cudaSuccess;
  DP_LAUNCH(k_bn_final, 1, THREADS, 0, st)(f, root, C, S, eps);
  return cudaGetLastError();
}

cudaError_t dp_k_bn_bwd_sums(cudaStream_t st, const float *x, const float *f,
                             const float *dy, float *dg, float *db, float *scratch, int n,
                             int C, int S) {
  if (C <= 0 || S <= 0) return cudaSuccess;
  if (n < 0) n = 0;
  const int K = dp__bn_chunks((size_t)n * (size_t)S, C);
  if (K == 1) {
    DP_LAUNCH(k_bn_bwd_sums, (unsigned)C, BN_THREADS, 0, st)(x, f, dy, dg, db, n, C, S);
    return cudaGetLastError();
  }
  return chunk_grads(st, x, f, NULL, dy, dg, db, scratch, n, C, S, K);
}

cudaError_t dp_k_bn_sync_dx(cudaStream_t st, const float *x, const float *f,
                            const float *sums, const float *g, const float *dy, float *dx,
                            int n, int C, int S) {
  size_t total = elems(n, C, S);
  if (total == 0 || !dx) return cudaSuccess;
  DP_LAUNCH(k_bn_sync_dx, blocks_for(total), THREADS, 0, st)
  (x, f, sums, g, dy, dx, C, S, total);
  return cudaGetLastError();
}

cudaError_t dp_k_bn_update(cudaStream_t st, const float *stats, float *buf, int C,
                           const dp_cuda_header *hdr, int n_check, double momentum) {
  if (C <= 0) return cudaSuccess;
  DP_LAUNCH(k_bn_update, 1, THREADS, 0, st)(stats, buf, C, hdr, n_check, momentum);
  return cudaGetLastError();
}

cudaError_t dp_k_bn_preload(void) {
  const void *const kernels[] = {
      (const void *)k_bn_forward_train,
      (const void *)k_bn_apply,
      (const void *)k_bn_backward,
      (const void *)k_bn_part,
      (const void *)k_bn_merge,
      (const void *)k_bn_final,
      (const void *)k_bn_bwd_sums,
      (const void *)k_bn_sync_dx,
      (const void *)k_bn_update,
      (const void *)k_bn_chunks,
      (const void *)k_bn_grad_chunks,
      (const void *)k_bn_combine,
      (const void *)k_bn_dx,
  };
  return dp_k_load(kernels, sizeof kernels / sizeof kernels[0]);
}
