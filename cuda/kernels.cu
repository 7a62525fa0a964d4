/* Device kernels of the CUDA backend: every layer's forward and backward but
 * the linear layer's GEMMs (cuda/gemm.cu), the losses, the loss sum, gradient
 * add/zero/check and the optimizers. The math is lib/cpu/backend.c's, formula
 * for formula; see cuda/kernels.cuh for the determinism rules. */
#include "batchnorm.cuh" /* dp_k_bn_preload */
#include "conv.cuh"      /* dp_k_conv_preload */
#include "sequence.cuh"  /* dp_k_sequence_preload */
#include "kernels.cuh"
#include "grid.cuh"
#include "rng.cuh"
#include "util/bf16.h" /* config.reduce_precision bf16: the cpu backend's rounding */
#include "util/erf.h"  /* dp__gelu_erf(_grad): the cpu backend's */
#include "util/expf.h" /* dp__expf: the cpu backend's */
#include "util/tanh.h" /* dp__tanhf: the cpu backend's */

#include <math.h>

/* Blocks of the reductions whose order is fixed per block (column sums, the CE
 * loss): many threads, since a column tile or a micro-batch is one block. */
#define RED_THREADS 1024
#define FULL_MASK 0xffffffffu

constexpr float GELU_C = 0.7978845608028654f; /* sqrt(2/pi), as lib/cpu/backend.c */
constexpr float GELU_A = 0.044715f;

/* Sum over a warp by a fixed xor butterfly: every lane ends with the same bits
 * (a + b == b + a), and the association depends only on the lane layout. All 32
 * lanes must be active. */
static __device__ __forceinline__ float warp_sum(float v) {
  for (int m = 16; m >= 1; m >>= 1) v = fa(v, __shfl_xor_sync(FULL_MASK, v, m));
  return v;
}

/* Lanes given to one row (CE loss) or columns in one tile (column sums): the
 * smallest power of two >= cols, at most 32. A function of cols alone, so the
 * reduction orders built on it depend on the shape only. */
static __host__ __device__ __forceinline__ int lanes_for(int cols) {
  int w = 1;
  while (w < cols && w < 32) w <<= 1;
  return w;
}

/* Sum of THREADS per-thread values in shared memory by a fixed tree; the
 * result is in sh[0] for every thread after the call. */
static __device__ __forceinline__ void block_tree_sum(float *sh) {
  for (int w = THREADS / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) sh[threadIdx.x] = fa(sh[threadIdx.x], sh[threadIdx.x + w]);
    __syncthreads();
  }
}

/* ---- activations --------------------------------------------------------------- */

static __global__ void k_act_forward(int kind, const float *x, float *y, size_t n,
                                     float slope) {
  const float C = GELU_C, A = GELU_A;
  GRID_STRIDE(i, n) {
    float v = x[i], r;
    switch (kind) {
    case DP_LAYER_RELU: r = v <= 0.0f ? 0.0f : v; break; /* NaN passes through */
    case DP_LAYER_TANH: r = dp__tanhf(v); break;
    case DP_LAYER_SIGMOID: r = fd(1.0f, fa(1.0f, dp__expf(-v))); break;
    case DP_LAYER_GELU_ERF: r = dp__gelu_erf(v); break;
    case DP_LAYER_SILU: r = fd(v, fa(1.0f, dp__expf(-v))); break;
    case DP_LAYER_LEAKY_RELU: r = v > 0.0f ? v : fm(v, slope); break;
    default: /* DP_LAYER_GELU: 0.5 v (1 + tanh(C (v + A v^3))) */
      r = fm(fm(0.5f, v), fa(1.0f, dp__tanhf(fm(C, fa(v, fm(fm(fm(A, v), v), v))))));
      break;
    }
    y[i] = r;
  }
}

static __global__ void k_act_backward(int kind, const float *xy, const float *dy, float *dx,
                                      size_t n, float slope) {
  const float C = GELU_C, A = GELU_A;
  GRID_STRIDE(i, n) {
    float v = xy[i], g = dy[i], r;
    switch (kind) {
    case DP_LAYER_RELU: r = v <= 0.0f ? 0.0f : g; break;         /* v = y */
    case DP_LAYER_TANH: r = fm(g, fs(1.0f, fm(v, v))); break;    /* v = y */
    case DP_LAYER_SIGMOID: r = fm(fm(g, v), fs(1.0f, v)); break; /* v = y */
    case DP_LAYER_GELU_ERF: r = dp__gelu_erf_grad(v, g); break;  /* v = x */
    case DP_LAYER_SILU: {                                        /* v = x */
      float s = fd(1.0f, fa(1.0f, dp__expf(-v)));
      r = fm(fm(g, s), fa(1.0f, fm(v, fs(1.0f, s))));
      break;
    }
    case DP_LAYER_LEAKY_RELU:
      r = v > 0.0f ? g : fm(g, slope);
      break;                                                     /* y, x if slope < 0 */
    default: {                                                   /* DP_LAYER_GELU, v = x */
      float t = dp__tanhf(fm(C, fa(v, fm(fm(fm(A, v), v), v))));
      float dt = fm(fm(fs(1.0f, fm(t, t)), C), fa(1.0f, fm(fm(fm(3.0f, A), v), v)));
      r = fm(g, fa(fm(0.5f, fa(1.0f, t)), fm(fm(0.5f, v), dt)));
      break;
    }
    }
    dx[i] = r;
  }
}

cudaError_t dp_k_act_forward(cudaStream_t st, dp_layer_kind kind, const float *x, float *y,
                             size_t n, float slope) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_act_forward, blocks_for(n), THREADS, 0, st)((int)kind, x, y, n, slope);
  return cudaGetLastError();
}

cudaError_t dp_k_act_backward(cudaStream_t st, dp_layer_kind kind, const float *xy,
                              const float *dy, float *dx, size_t n, float slope) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_act_backward, blocks_for(n), THREADS, 0, st)((int)kind, xy, dy, dx, n, slope);
  return cudaGetLastError();
}

/* ---- dropout ------------------------------------------------------------------- */

/* The step comes from the header (written by the step's first copy), so that
 * a graph captured at one step replays the next with the next step's mask. */
static __global__ void k_dropout(const float *x, float *y, int rows, int cols,
                                 uint64_t seed, const dp_cuda_header *hdr, uint64_t layer,
                                 uint64_t row0, float p, float scale) {
  const uint64_t key_a = (hdr->sc.step << 16) | layer;
  size_t n = (size_t)rows * (size_t)cols;
  GRID_STRIDE(i, n) {
    size_t r = i / (size_t)cols, j = i % (size_t)cols;
    float u = dp_d_rng_uniform(seed, DP_RNG_DROPOUT, key_a, row0 + r, j);
    y[i] = fm(x[i], u >= p ? scale : 0.0f);
  }
}

cudaError_t dp_k_dropout(cudaStream_t st, const float *x, float *y, int rows, int cols,
                         uint64_t seed, const dp_cuda_header *hdr, uint64_t layer,
                         uint64_t row0, float p, float scale) {
  size_t n = (size_t)rows * (size_t)cols;
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_dropout, blocks_for(n), THREADS, 0, st)
  (x, y, rows, cols, seed, hdr, layer, row0, p, scale);
  return cudaGetLastError();
}

/* ---- bias ---------------------------------------------------------------------- */

static __global__ void k_bias_add(float *y, const float *b, int rows, int cols, int relu) {
  size_t n = (size_t)rows * (size_t)cols;
  GRID_STRIDE(i, n) {
    float v = b ? fa(y[i], b[i % (size_t)cols]) : y[i];
    y[i] = relu && v <= 0.0f ? 0.0f : v; /* NaN passes through */
  }
}

cudaError_t dp_k_bias_add(cudaStream_t st, float *y, const float *b, int rows, int cols,
                          bool relu) {
  size_t n = (size_t)rows * (size_t)cols;
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_bias_add, blocks_for(n), THREADS, 0, st)(y, b, rows, cols, relu ? 1 : 0);
  return cudaGetLastError();
}

/* Column sums (bias gradients) of a (rows, cols) matrix. A block is a tile of
 * W = lanes_for(cols) columns by L = RED_THREADS / W row lanes (thread t:
 * column t % W of the tile, row lane t / W), so a warp reads 32 consecutive
 * floats of a row (W = 32) or of consecutive rows (narrow matrices), and a
 * column gets L threads, not one. The fixed order, a function of (rows, cols)
 * alone: row lane y sums rows y, y + L, y + 2L, ... ascending from +0; then the
 * L lane sums of a column are added by a halving tree in shared memory (lane y
 * += lane y + L/2, then y + L/4, ..., 1). Not the CPU's rows-ascending order:
 * the bits differ from it in the last places. */
static __device__ __forceinline__ void column_tree_sum(float *sh, int W, int L) {
  const int t = (int)threadIdx.x;
  for (int w = L / 2; w > 0; w >>= 1) {
    if (t / W < w) sh[t] = fa(sh[t], sh[t + w * W]);
    __syncthreads();
  }
}

static __global__ void __launch_bounds__(RED_THREADS)
    k_colsum(const float *a, int rows, int cols, float *out) {
  __shared__ float sh[RED_THREADS];
  const int W = lanes_for(cols), L = RED_THREADS / W;
  const int x = (int)threadIdx.x % W, y = (int)threadIdx.x / W;
  const int j = (int)blockIdx.x * W + x;
  float s = 0.0f;
  if (j < cols)
    for (int r = y; r < rows; r += L) s = fa(s, a[(size_t)r * cols + j]);
  sh[threadIdx.x] = s;
  __syncthreads();
  column_tree_sum(sh, W, L);
  if (y == 0 && j < cols) out[j] = sh[x];
}

cudaError_t dp_k_colsum(cudaStream_t st, const float *a, int rows, int cols, float *out) {
  if (cols <= 0) return cudaSuccess;
  const int w = lanes_for(cols);
  DP_LAUNCH(k_colsum, (unsigned)((cols + w - 1) / w), RED_THREADS, 0, st)
  (a, rows, cols, out);
  return cudaGetLastError();
}

/* ---- layernorm (the layer's eps, affine) ---------------------------------------- */
/* One warp per row: lane l sums columns l, l + 32, ... ascending, then the
 * butterfly. */

#define ROWS_PER_BLOCK (THREADS / 32)

static __global__ void k_layernorm_forward(const float *x, const float *g, const float *b,
                                           float *y, float *stats, int rows, int cols,
                                           float eps) {
  int row = (int)(blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32), lane = threadIdx.x & 31;
  if (row >= rows) return; /* the whole warp */
  const float *xr = x + (size_t)row * cols;
  float *yr = y + (size_t)row * cols;
  float s = 0.0f;
  for (int k = lane; k < cols; k += 32) s = fa(s, xr[k]);
  float mean = fd(warp_sum(s), (float)cols), v = 0.0f;
  for (int k = lane; k < cols; k += 32) {
    float d = fs(xr[k], mean);
    v = fa(v, fm(d, d));
  }
  float rstd = fd(1.0f, __fsqrt_rn(fa(fd(warp_sum(v), (float)cols), eps)));
  if (lane == 0) {
    stats[2 * (size_t)row] = mean;
    stats[2 * (size_t)row + 1] = rstd;
  }
  for (int k = lane; k < cols; k += 32)
    yr[k] = fa(fm(fm(fs(xr[k], mean), rstd), g[k]), b[k]);
}

/* dx = rstd (dy g - s1 / n - xh s2 / n), s1 = sum dy g, s2 = sum dy g xh. */
static __global__ void k_layernorm_dx(const float *x, const float *stats, const float *g,
                                      const float *dy, float *dx, int rows, int cols) {
  int row = (int)(blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32), lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float *xr = x + (size_t)row * cols, *dyr = dy + (size_t)row * cols;
  float *dxr = dx + (size_t)row * cols;
  float mean = stats[2 * (size_t)row], rstd = stats[2 * (size_t)row + 1], s1 = 0.0f,
        s2 = 0.0f;
  for (int k = lane; k < cols; k += 32) {
    float xh = fm(fs(xr[k], mean), rstd), dxh = fm(dyr[k], g[k]);
    s1 = fa(s1, dxh);
    s2 = fa(s2, fm(dxh, xh));
  }
  s1 = warp_sum(s1);
  s2 = warp_sum(s2);
  float n = (float)cols;
  for (int k = lane; k < cols; k += 32) {
    float xh = fm(fs(xr[k], mean), rstd);
    dxr[k] = fm(rstd, fs(fs(fm(dyr[k], g[k]), fd(s1, n)), fd(fm(xh, s2), n)));
  }
}

/* dg[k] = sum_r dy xh, db[k] = sum_r dy: k_colsum's tiles and fixed order
 * (row lane y: rows y, y + L, ... ascending; then the halving tree over the L
 * lanes), both sums side by side. */
static __global__ void __launch_bounds__(RED_THREADS)
    k_layernorm_dparams(const float *x, const float *stats, const float *dy, float *dg,
                        float *db, int rows, int cols) {
  __shared__ float shg[RED_THREADS], shb[RED_THREADS];
  const int W = lanes_for(cols), L = RED_THREADS / W;
  const int c = (int)threadIdx.x % W, y = (int)threadIdx.x / W;
  const int k = (int)blockIdx.x * W + c;
  float sg = 0.0f, sb = 0.0f;
  if (k < cols)
    for (int r = y; r < rows; r += L) {
      size_t i = (size_t)r * cols + k;
      float xh = fm(fs(x[i], stats[2 * (size_t)r]), stats[2 * (size_t)r + 1]);
      sg = fa(sg, fm(dy[i], xh));
      sb = fa(sb, dy[i]);
    }
  shg[threadIdx.x] = sg;
  shb[threadIdx.x] = sb;
  __syncthreads();
  for (int w = L / 2; w > 0; w >>= 1) { /* column_tree_sum on both */
    if (y < w) {
      shg[threadIdx.x] = fa(shg[threadIdx.x], shg[threadIdx.x + w * W]);
      shb[threadIdx.x] = fa(shb[threadIdx.x], shb[threadIdx.x + w * W]);
    }
    __syncthreads();
  }
  if (y == 0 && k < cols) {
    dg[k] = shg[c];
    db[k] = shb[c];
  }
}

cudaError_t dp_k_layernorm_forward(cudaStream_t st, const float *x, const float *g,
                                   const float *b, float *y, float *stats, int rows,
                                   int cols, float eps) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  DP_LAUNCH(k_layernorm_forward, (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK),
            THREADS, 0, st)
  (x, g, b, y, stats, rows, cols, eps);
  return cudaGetLastError();
}

cudaError_t dp_k_layernorm_backward(cudaStream_t st, const float *x, const float *stats,
                                    const float *g, const float *dy, float *dx, float *dg,
                                    float *db, int rows, int cols) {
  if (cols <= 0) return cudaSuccess;
  const int w = lanes_for(cols);
  DP_LAUNCH(k_layernorm_dparams, (unsigned)((cols + w - 1) / w), RED_THREADS, 0, st)
  (x, stats, dy, dg, db, rows, cols);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || !dx || rows <= 0) return e;
  DP_LAUNCH(k_layernorm_dx, (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK),
            THREADS, 0, st)
  (x, stats, g, dy, dx, rows, cols);
  return cudaGetLastError();
}

/* ---- gradient add, fill --------------------------------------------------------- */

static __global__ void k_add(float *dst, const float *src, size_t n) {
  GRID_STRIDE(i, n) dst[i] = fa(dst[i], src[i]);
}

static __global__ void k_add_bf16(float *dst, const float *src, const uint16_t *src16,
                                  size_t n) {
  GRID_STRIDE(i, n) {
    float b = src ? src[i] : dp__bf16_widen(src16[i]);
    dst[i] = dp__bf16_roundf(fa(dst[i], b));
  }
}

static __global__ void k_round_bf16(const float *x, float *y, size_t n) {
  GRID_STRIDE(i, n) y[i] = dp__bf16_roundf(x[i]);
}

static __global__ void k_pack_bf16(const float *x, uint16_t *y, size_t n) {
  GRID_STRIDE(i, n) y[i] = dp__bf16_rne(x[i]);
}

static __global__ void k_unpack_bf16(const uint16_t *x, float *y, size_t n) {
  GRID_STRIDE(i, n) y[i] = dp__bf16_widen(x[i]);
}

static __global__ void k_fill(uint32_t *dst, uint32_t value, size_t n) {
  GRID_STRIDE(i, n) dst[i] = value;
}

cudaError_t dp_k_add(cudaStream_t st, float *dst, const float *src, size_t n) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_add, blocks_for(n), THREADS, 0, st)(dst, src, n);
  return cudaGetLastError();
}

cudaError_t dp_k_add_bf16(cudaStream_t st, float *dst, const float *src,
                          const uint16_t *src16, size_t n) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_add_bf16, blocks_for(n), THREADS, 0, st)(dst, src, src16, n);
  return cudaGetLastError();
}

cudaError_t dp_k_round_bf16(cudaStream_t st, const float *x, float *y, size_t n) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_round_bf16, blocks_for(n), THREADS, 0, st)(x, y, n);
  return cudaGetLastError();
}

cudaError_t dp_k_pack_bf16(cudaStream_t st, const float *x, uint16_t *y, size_t n) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_pack_bf16, blocks_for(n), THREADS, 0, st)(x, y, n);
  return cudaGetLastError();
}

cudaError_t dp_k_unpack_bf16(cudaStream_t st, const uint16_t *x, float *y, size_t n) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_unpack_bf16, blocks_for(n), THREADS, 0, st)(x, y, n);
  return cudaGetLastError();
}

cudaError_t dp_k_fill(cudaStream_t st, uint32_t *dst, uint32_t value, size_t n) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_fill, blocks_for(n), THREADS, 0, st)(dst, value, n);
  return cudaGetLastError();
}

/* ---- losses -------------------------------------------------------------------- */

static __device__ __forceinline__ void mb_rows(const dp_cuda_mb_span &s, int i, int *lo,
                                               int *hi) {
  if (s.n <= DP_CUDA_MB_LIST) {
    *lo = s.bound[i];
    *hi = s.bound[i + 1];
  } else {
    *lo = i * s.m;
    *hi = *lo + s.m < s.end ? *lo + s.m : s.end;
  }
}

/* Blocks per micro-batch (issue 28, finding 5: one block per micro-batch put
 * a replica's loss on one SM). A micro-batch of n rows, `pass` rows per block
 * pass, is cut into loss_chunks(n, pass) chunks of ceil(n / chunks) rows, a
 * block each, at least 4 passes per block, at most DP_CUDA_LOSS_CHUNKS: from
 * its shape alone, so its bits do not depend on which launch, device or span
 * list it is in. Each block's sum goes to chunk slot (i, c) of the loss
 * scratch; k_loss_chunks adds a micro-batch's chunk sums from +0 in
 * ascending c. When every micro-batch of a launch has one chunk, its block
 * writes part[i] itself (+0 + s is s: the same bits) and k_loss_chunks is not
 * launched. */
static __host__ __device__ __forceinline__ int loss_chunks(int n, int pass) {
  int c = (n + 4 * pass - 1) / (4 * pass);
  return c < 1 ? 1 : c > DP_CUDA_LOSS_CHUNKS ? DP_CUDA_LOSS_CHUNKS : c;
}
static __host__ __device__ __forceinline__ int mse_pass(int cols) {
  return cols >= THREADS ? 1 : THREADS / cols;
}
static __host__ __device__ __forceinline__ int ce_pass(int cols) {
  return RED_THREADS / lanes_for(cols);
}

/* Block b of a launch over `per` chunk slots per micro-batch: micro-batch
 * b / per, its chunk b % per; rows [*lo, *hi) of the chunk. false: no such
 * chunk (the micro-batch has fewer), the block does nothing. */
static __device__ __forceinline__ bool
loss_chunk(const dp_cuda_mb_span &s, int per, int pass, int *i, int *c, int *lo, int *hi) {
  int m0, m1;
  *i = (int)blockIdx.x / per;
  *c = (int)blockIdx.x % per;
  mb_rows(s, *i, &m0, &m1);
  int n = m1 - m0, C = loss_chunks(n, pass);
  if (*c >= C) return false;
  int R = (n + C - 1) / C;
  *lo = m0 + *c * R < m1 ? m0 + *c * R : m1;
  *hi = *lo + R < m1 ? *lo + R : m1;
  return true;
}

/* A chunk's block: thread t sums elements t, t + THREADS, ... of its rows
 * ascending; then the fixed block tree. */
static __global__ void __launch_bounds__(THREADS)
    k_loss_mse(const float *o, const float *t, float *g, float *sums, dp_cuda_mb_span span,
               int cols, float scale, int per, int ld, int kind, float param,
               const float *pw) {
  __shared__ float sh[THREADS];
  int i, c, lo, hi;
  if (!loss_chunk(span, per, mse_pass(cols), &i, &c, &lo, &hi)) return;
  size_t e1 = (size_t)hi * cols;
  float s = 0.0f;
  for (size_t k = (size_t)lo * cols + threadIdx.x; k < e1; k += THREADS) {
    float d = fs(o[k], t[k]);
    if (kind == DP_LOSS_MSE) {
      s = fa(s, fm(d, d));
      g[k] = fm(scale, d);
      continue;
    }
    /* lib/cpu/loss.c's dp__elem_loss (scale: 1 / the mean's count) */
    float z = fabsf(d), term, dd;
    if (kind == DP_LOSS_L1) {
      term = z;
      dd = d > 0.0f ? 1.0f : d < 0.0f ? -1.0f : d;
    } else if (kind == DP_LOSS_BCE_LOGITS && pw) {
      float x = o[k], m = x < 0.0f ? -x : 0.0f, p = pw[k % (size_t)cols], pt = fm(p, t[k]);
      float lw = fa(fm(fs(p, 1.0f), t[k]), 1.0f);
      term = fa(fm(fs(1.0f, t[k]), x),
                fm(lw, fa(logf(fa(dp__expf(-m), dp__expf(fs(-x, m)))), m)));
      dd = fs(fm(fs(fa(pt, 1.0f), t[k]), fd(1.0f, fa(1.0f, dp__expf(-x)))), pt);
    } else if (kind == DP_LOSS_BCE_LOGITS) {
      float z0 = o[k], m = z0 < 0.0f ? -z0 : 0.0f;
      term =
          fa(fa(fm(fs(1.0f, t[k]), z0), m), logf(fa(dp__expf(-m), dp__expf(fs(-z0, m)))));
      dd = fs(fd(1.0f, fa(1.0f, dp__expf(-z0))), t[k]);
    } else if (kind == DP_LOSS_SMOOTH_L1) {
      term = z < param ? fd(fm(fm(0.5f, z), z), param) : fs(z, fm(0.5f, param));
      dd = d <= -param ? -1.0f : d >= param ? 1.0f : fd(d, param);
    } else { /* DP_LOSS_HUBER */
      term = z < param ? fm(fm(0.5f, z), z) : fm(param, fs(z, fm(0.5f, param)));
      dd = d <= -param ? -param : d >= param ? param : d;
    }
    s = fa(s, term);
    g[k] = fm(dd, scale);
  }
  sh[threadIdx.x] = s;
  __syncthreads();
  block_tree_sum(sh);
  if (threadIdx.x == 0) sums[i * ld + c] = sh[0];
}

/* A chunk's block, its rows handled G = lanes_for(cols) lanes at a time (a
 * warp per row for cols > 16; 32 / G rows per warp for narrow logits), so
 * reads and gradient writes are coalesced. The block's Q = RED_THREADS / G
 * lane groups take rows q, q + Q, q + 2Q, ... of the chunk (relative to its
 * first row). Per row, the loss's math in orders of its own (not the CPU's
 * bits): max (exact in any order), sum of dp__expf(z - max) (lane c: columns
 * c, c + G, ... ascending, then the xor butterfly over the group's G lanes),
 * lse = max + log(sum), loss = (max - z[t]) + log(sum), gradient (e^(z - lse) - [j == t]) /
 * rows. The fixed order of the chunk's sum: group q adds its rows' losses
 * ascending from +0, then a halving tree over the Q group sums in shared
 * memory; with loss_chunks it depends on the
 * micro-batch's row count and cols only, never on where its rows sit or which
 * other micro-batches share the launch, so classic and allreduce give the same
 * bits. A label out of range is flagged (DP_CUDA_ST_LABEL; integer atomics,
 * order-independent), its row's gradient zeroed and its loss left out;
 * lib/core/ctx.c checks labels on the host before a step, so this is a second
 * line. */
static __global__ void __launch_bounds__(RED_THREADS)
    k_loss_ce(const float *z, const int32_t *labels, float *g, float *sums,
              dp_cuda_mb_span span, int cols, float inv, int row0, dp_cuda_header *hdr,
              int dev, int per, int ld, dp_cuda_ce ce) {
  __shared__ float sh[RED_THREADS];
  int i, ch, lo, hi;
  if (!loss_chunk(span, per, ce_pass(cols), &i, &ch, &lo, &hi)) return;
  const int G = lanes_for(cols), Q = RED_THREADS / G, n = hi - lo;
  const int q = (int)threadIdx.x / G, c = (int)threadIdx.x % G;
  const int first = (int)(threadIdx.x & 31u) & ~(G - 1); /* the group's lane 0 */
  float s = 0.0f; /* the group's loss sum (kept by lane 0 of the group) */
  /* Uniform trip count over the block: every lane reaches every shuffle. */
  for (int base = 0; base < n; base += Q) {
    const bool on = base + q < n;
    const int r = lo + base + q;
    const float *zr = z + (size_t)r * cols; /* read only when on */
    float mx = -INFINITY;
    if (on)
      for (int j = c; j < cols; j += G) mx = zr[j] > mx ? zr[j] : mx;
    for (int m = G / 2; m >= 1; m >>= 1) {
      float o = __shfl_xor_sync(FULL_MASK, mx, m);
      mx = o > mx ? o : mx;
    }
    mx = __shfl_sync(FULL_MASK, mx, first); /* one value per group (+-0, NaN) */
    float se = 0.0f;
    if (on)
      for (int j = c; j < cols; j += G) se = fa(se, dp__expf(fs(zr[j], mx)));
    for (int m = G / 2; m >= 1; m >>= 1) se = fa(se, __shfl_xor_sync(FULL_MASK, se, m));
    /* label smoothing: sum_c w_c (mx - z_c), the same lanes and butterfly */
    float sm = 0.0f;
    if (ce.smooth > 0.0f) { /* uniform over the launch */
      if (on)
        for (int j = c; j < cols; j += G)
          sm = fa(sm, ce.w ? fm(ce.w[j], fs(mx, zr[j])) : fs(mx, zr[j]));
      for (int m = G / 2; m >= 1; m >>= 1) sm = fa(sm, __shfl_xor_sync(FULL_MASK, sm, m));
    }
    if (!on) continue; /* no shuffle below */
    const float lse = fa(mx, logf(se));
    const int t = labels[r];
    float *gr = g + (size_t)r * cols;
    if (ce.on && ce.ignore && t == ce.ignore_index) { /* no loss, no gradient */
      for (int j = c; j < cols; j += G) gr[j] = 0.0f;
      continue;
    }
    if (t < 0 || t >= cols) {
      if (c == 0) {
        atomicOr(&hdr->status[dev], (uint32_t)DP_CUDA_ST_LABEL);
        atomicMin(&hdr->bad_label_row, (unsigned int)(row0 + r));
      }
      for (int j = c; j < cols; j += G) gr[j] = 0.0f;
      continue;
    }
    if (ce.on) { /* lib/cpu/softmax.c's dp__softmax_xent_opts, term by term */
      const float inv_s = hdr->sc.loss_inv, wt = ce.w ? ce.w[t] : 1.0f;
      const float a = fa(fm(ce.keep, wt), fm(ce.per, ce.wall));
      for (int j = c; j < cols; j += G) {
        float v = fs(fm(dp__expf(fs(zr[j], lse)), a), fm(ce.per, ce.w ? ce.w[j] : 1.0f));
        gr[j] = fm(j == t ? fs(v, fm(ce.keep, wt)) : v, inv_s);
      }
      if (c == 0) {
        float l = fm(fm(ce.keep, wt), fa(fs(mx, zr[t]), logf(se)));
        if (ce.smooth > 0.0f) l = fa(l, fm(ce.per, fa(sm, fm(ce.wall, logf(se)))));
        s = fa(s, l);
      }
      continue;
    }
    for (int j = c; j < cols; j += G)
      gr[j] = fm(fs(dp__expf(fs(zr[j], lse)), j == t ? 1.0f : 0.0f), inv);
    /* (mx - z_t) + log se, the cpu's order (lib/cpu/softmax.c) */
    if (c == 0) s = fa(s, fa(fs(mx, zr[t]), logf(se)));
  }
  if (c == 0) sh[q] = s;
  __syncthreads();
  for (int w = Q / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) sh[threadIdx.x] = fa(sh[threadIdx.x], sh[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) sums[i * ld + ch] = sh[0];
}

/* part[i]: micro-batch i's chunk sums added from +0 in ascending chunk order. */
static __global__ void k_loss_chunks(const float *chunks, float *part, dp_cuda_mb_span span,
                                     int pass) {
  int i = (int)(blockIdx.x * blockDim.x + threadIdx.x), lo, hi;
  if (i >= span.n) return;
  mb_rows(span, i, &lo, &hi);
  int C = loss_chunks(hi - lo, pass);
  float s = 0.0f;
  for (int c = 0; c < C; c++) s = fa(s, chunks[i * DP_CUDA_LOSS_CHUNKS + c]);
  part[i] = s;
}

/* The most chunks any micro-batch of the span has (its largest: the listed
 * bounds, or the uniform size m). */
static int span_chunks(const dp_cuda_mb_span *s, int pass) {
  int rows = s->m;
  if (s->n <= DP_CUDA_MB_LIST)
    for (int i = 0; i < s->n; i++)
      rows = s->bound[i + 1] - s->bound[i] > rows ? s->bound[i + 1] - s->bound[i] : rows;
  return loss_chunks(rows, pass);
}

cudaError_t dp_k_loss_mse(cudaStream_t st, const float *o, const float *t, float *g,
                          float *part, float *chunks, const dp_cuda_mb_span *span, int cols,
                          float scale, dp_loss_kind kind, float param, const float *pw) {
  if (span->n <= 0) return cudaSuccess;
  if (span->n > DP_CUDA_MB_LIST) return cudaErrorInvalidValue; /* the scratch's size */
  int per = span_chunks(span, mse_pass(cols));
  DP_LAUNCH(k_loss_mse, (unsigned)(span->n * per), THREADS, 0, st)
  (o, t, g, per == 1 ? part : chunks, *span, cols, scale, per,
   per == 1 ? 1 : DP_CUDA_LOSS_CHUNKS, (int)kind, param, pw);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || per == 1) return e; /* one chunk each: its sum is part[i] */
  DP_LAUNCH(k_loss_chunks, 1, DP_CUDA_MB_LIST, 0, st)(chunks, part, *span, mse_pass(cols));
  return cudaGetLastError();
}

cudaError_t dp_k_loss_ce(cudaStream_t st, const float *z, const int32_t *labels, float *g,
                         float *part, float *chunks, const dp_cuda_mb_span *span, int cols,
                         float inv_rows, int row0, dp_cuda_header *hdr, int dev,
                         const dp_cuda_ce *ce) {
  if (span->n <= 0) return cudaSuccess;
  if (span->n > DP_CUDA_MB_LIST) return cudaErrorInvalidValue;
  int per = span_chunks(span, ce_pass(cols));
  DP_LAUNCH(k_loss_ce, (unsigned)(span->n * per), RED_THREADS, 0, st)
  (z, labels, g, per == 1 ? part : chunks, *span, cols, inv_rows, row0, hdr, dev, per,
   per == 1 ? 1 : DP_CUDA_LOSS_CHUNKS, *ce);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || per == 1) return e;
  DP_LAUNCH(k_loss_chunks, 1, DP_CUDA_MB_LIST, 0, st)(chunks, part, *span, ce_pass(cols));
  return cudaGetLastError();
}

/* ---- the loss sum: lib/cpu/backend.c's tree_sum, bit for bit --------------------- */
/* tree_sum(v, lo, hi): v[lo] when hi - lo == 1; else, with mid = (lo + hi + 1) / 2,
 * tree_sum(lo, mid) + tree_sum(mid, hi) when mid < n_ne, and tree_sum(lo, mid)
 * alone when the right part is empty (micro-batches >= n_ne are the empty ones,
 * a suffix). k_loss_sum evaluates exactly that expression tree, in parallel:
 * node (e, j) is the node at depth e whose path from the root spells j's e low
 * bits, most significant first (0 left, 1 right); its range comes from the same
 * midpoint descent (tree_node), so its children are (e + 1, 2j) and
 * (e + 1, 2j + 1). Thread j first evaluates the subtree at node (LS_DEPTH, j)
 * (subtree_sum: tree_sum's own calls, as a loop), then the top LS_DEPTH levels
 * are evaluated level by level in shared memory, each node from its children
 * with tree_sum's rule. By induction from the bottom every node evaluated
 * holds tree_sum(lo, hi) of its range, so the root has tree_sum(0, n_mb)'s
 * bits. A node is evaluated iff its lo < n_ne, as in the recursion (left
 * children share their parent's lo; a right child is entered iff mid < n_ne). */
#define LS_DEPTH 8 /* 2^LS_DEPTH == THREADS subtrees */
static_assert((1 << LS_DEPTH) == THREADS, "a thread per subtree");

/* The range [lo, hi) of node (e, j) of the tree over [0, n); false when an
 * ancestor is a leaf (the node does not exist). */
static __device__ bool tree_node(int n, int e, int j, int *lo, int *hi) {
  int l = 0, h = n;
  for (int b = e - 1; b >= 0; b--) {
    if (h - l == 1) return false;
    int mid = (l + h + 1) / 2;
    if ((j >> b) & 1)
      l = mid;
    else
      h = mid;
  }
  *lo = l;
  *hi = h;
  return true;
}

/* tree_sum(v, lo, hi) (lo < n_ne) without recursion: descend left parts to a
 * leaf, pushing a frame per split; on the way back a frame either enters its
 * right part (mid < n_ne), or returns its left sum, or returns left + right.
 * Ranges are < 2^31, so at most 31 frames. */
static __device__ float subtree_sum(const float *v, int lo, int hi, int n_ne) {
  int flo[32], fhi[32];
  float fleft[32];
  bool fright[32]; /* frame is summing its right part */
  int sp = 0;
  for (;;) {
    while (hi - lo > 1) { /* descend into the left part */
      flo[sp] = lo;
      fhi[sp] = hi;
      fright[sp] = false;
      sp++;
      hi = (lo + hi + 1) / 2;
    }
    float val = v[lo];
    for (;;) { /* return val to the frames above */
      if (sp == 0) return val;
      int f = sp - 1, mid = (flo[f] + fhi[f] + 1) / 2;
      if (fright[f]) {
        val = fa(fleft[f], val); /* left + right */
        sp--;
      } else if (mid < n_ne) { /* enter the right part */
        fleft[f] = val;
        fright[f] = true;
        lo = mid;
        hi = fhi[f];
        break;
      } else {
        sp--; /* empty right part: the left sum alone */
      }
    }
  }
}

static __global__ void __launch_bounds__(THREADS)
    k_loss_sum(const float *part, int n_mb, int n_ne, float denom, bool step_denom,
               dp_cuda_header *hdr, int dev) {
  __shared__ float sh[THREADS];
  const int j = (int)threadIdx.x;
  int lo, hi;
  sh[j] = tree_node(n_mb, LS_DEPTH, j, &lo, &hi) && lo < n_ne
              ? subtree_sum(part, lo, hi, n_ne)
              : 0.0f; /* never read */
  __syncthreads();
  for (int e = LS_DEPTH - 1; e >= 0; e--) {
    const bool mine = j < (1 << e) && tree_node(n_mb, e, j, &lo, &hi) && lo < n_ne;
    float v = 0.0f;
    if (mine) {
      int mid = (lo + hi + 1) / 2;
      v = hi - lo == 1 ? part[lo]                     /* a leaf above the cut */
          : mid < n_ne ? fa(sh[2 * j], sh[2 * j + 1]) /* left + right */
                       : sh[2 * j];                   /* empty right part */
    }
    __syncthreads(); /* every read of level e + 1 before the writes of level e */
    if (mine) sh[j] = v;
    __syncthreads();
  }
  if (j == 0) {
    float loss = fd(sh[0], step_denom ? hdr->sc.loss_denom : denom);
    hdr->loss = loss;
    if (!isfinite(loss)) hdr->status[dev] |= DP_CUDA_ST_LOSS;
  }
}

cudaError_t dp_k_loss_sum(cudaStream_t st, const float *part, int n_mb, int n_ne,
                          float denom, bool step_denom, dp_cuda_header *hdr, int dev) {
  if (n_mb <= 0 || n_ne <= 0) return cudaErrorInvalidValue;
  DP_LAUNCH(k_loss_sum, 1, THREADS, 0, st)(part, n_mb, n_ne, denom, step_denom, hdr, dev);
  return cudaGetLastError();
}

/* ---- gradient check, optimizers --------------------------------------------------- */

/* Flag and min are order-independent: the same result whatever the thread
 * order, so these integer atomics do not cost determinism. */
static __global__ void k_grad_check(const float *g, size_t n, size_t base,
                                    dp_cuda_header *hdr, int dev) {
  GRID_STRIDE(i, n) {
    float v = g[i];
    if (!isfinite(v)) {
      atomicOr(&hdr->status[dev], (uint32_t)DP_CUDA_ST_GRAD);
      atomicMin(&hdr->bad_grad,
                ((unsigned long long)(base + i) << 1) | (isinf(v) ? 1ull : 0ull));
    }
  }
}

cudaError_t dp_k_grad_check(cudaStream_t st, const float *g, size_t n, size_t base,
                            dp_cuda_header *hdr, int dev) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_grad_check, blocks_for(n), THREADS, 0, st)(g, n, base, hdr, dev);
  return cudaGetLastError();
}

/* PyTorch's element rules, as lib/cpu/backend.c's (sgd_w, mom_*, adam_*), one
 * IEEE operation at a time: the new parameter, and the new state words (s0:
 * momentum buffer or Adam(W)'s m; s1: Adam(W)'s v; s2: amsgrad's v_hat). Used by
 * the update and by the check that refuses an update whose result is not finite. */
struct upd_out {
  float w, s0, s1, s2;
};

/* amsgrad: torch.maximum(v_hat, v) (lib/cpu/backend.c's adam_vhat), the
 * denominator's v; without it, v itself. */
static __device__ __forceinline__ float den_v(const dp_cuda_opt &o, const float *h0,
                                              size_t k, float v) {
  if (!o.amsgrad) return v;
  float vh = h0[k];
  return v > vh ? v : vh;
}

static __device__ __forceinline__ upd_out upd_elem(const dp_cuda_opt &o,
                                                   const dp_cuda_header *hdr, float wk,
                                                   float gk, const float *m0,
                                                   const float *v0, const float *h0,
                                                   size_t k) {
  upd_out r = {0.0f, 0.0f, 0.0f, 0.0f};
  switch (o.kind) {
  case DP_OPT_SGD:                                      /* w -= lr (g + wd w) */
    r.w = fs(wk, fm(hdr->sc.lr, fa(gk, fm(o.wd, wk)))); /* the step's lr (dp_set_lr) */
    break;
  case DP_OPT_MOMENTUM: { /* buf = first ? g' : mu buf + (1 - damp) g'; w -= lr step */
    float gd = o.wd != 0.0f ? fa(gk, fm(o.wd, wk)) : gk;
    float b = hdr->sc.first != 0 ? gd : fa(fm(hdr->sc.mu, m0[k]), fm(o.keep, gd));
    r.s0 = b;
    r.w = fs(wk, fm(hdr->sc.lr, o.nesterov ? fa(gd, fm(hdr->sc.mu, b)) : b));
    break;
  }
  case DP_OPT_ADAM: { /* L2 into the gradient first (mom_g), no decay factor */
    float gd = o.wd != 0.0f ? fa(gk, fm(o.wd, wk)) : gk;
    float m = fa(fm(hdr->sc.mu, m0[k]), fm(hdr->sc.one_minus_mu, gd));
    float v = fa(fm(o.b2, v0[k]), fm(fm(o.one_minus_b2, gd), gd));
    float vd = den_v(o, h0, k, v);
    float denom = fa(fd(__fsqrt_rn(vd), hdr->sc.bc2_sqrt), o.eps);
    r.s0 = m;
    r.s1 = v;
    r.s2 = vd;
    r.w = fs(wk, fm(hdr->sc.step_size, fd(m, denom)));
    break;
  }
  default: { /* DP_OPT_ADAMW: m0[k] and v0[k] are the element's two moments */
    float m = fa(fm(hdr->sc.mu, m0[k]), fm(hdr->sc.one_minus_mu, gk));
    float v = fa(fm(o.b2, v0[k]), fm(fm(o.one_minus_b2, gk), gk));
    float vd = den_v(o, h0, k, v);
    float denom = fa(fd(__fsqrt_rn(vd), hdr->sc.bc2_sqrt), o.eps);
    r.s0 = m;
    r.s1 = v;
    r.s2 = vd;
    r.w = fs(fm(wk, hdr->sc.decay), fm(hdr->sc.step_size, fd(m, denom)));
    break;
  }
  }
  return r;
}

/* The step's check in one pass over the parameters (issue 28, finding 5: a
 * pass of its own for the gradients read them twice): flags a non-finite
 * gradient (DP_CUDA_ST_GRAD, as k_grad_check) and an update that would write a
 * non-finite parameter or state word (DP_CUDA_ST_UPDATE; parameter index
 * base + k). The flags and the mins are order-independent. */
static __global__ void k_step_check(dp_cuda_opt o, const float *w, const float *g,
                                    const float *m, const float *v, const float *vh,
                                    size_t n, size_t base, dp_cuda_header *hdr, int dev) {
  GRID_STRIDE(k, n) {
    float gk = g[k];
    if (!isfinite(gk)) {
      atomicOr(&hdr->status[dev], (uint32_t)DP_CUDA_ST_GRAD);
      atomicMin(&hdr->bad_grad,
                ((unsigned long long)(base + k) << 1) | (isinf(gk) ? 1ull : 0ull));
    }
    upd_out r = upd_elem(o, hdr, w[k], gk, m, v, vh, k);
    if (!isfinite(r.w) || !isfinite(r.s0) || !isfinite(r.s1) || !isfinite(r.s2)) {
      atomicOr(&hdr->status[dev], (uint32_t)DP_CUDA_ST_UPDATE);
      atomicMin(&hdr->bad_update, (unsigned long long)(base + k));
    }
  }
}

cudaError_t dp_k_step_check(cudaStream_t st, const dp_cuda_opt *o, const float *w,
                            const float *g, const float *m, const float *v, const float *vh,
                            size_t n, size_t base, dp_cuda_header *hdr, int dev) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_step_check, blocks_for(n), THREADS, 0, st)
  (*o, w, g, m, v, vh, n, base, hdr, dev);
  return cudaGetLastError();
}

/* Nothing at all is written when a check of this step failed. The per-step
 * scalars are read from the header (see k_dropout for why). */
static __global__ void k_optimizer(dp_cuda_opt o, float *w, const float *g, float *m,
                                   float *v, float *vh, size_t n, const dp_cuda_header *hdr,
                                   int n_check) {
  if (block_refused(hdr->status, n_check)) return;
  GRID_STRIDE(k, n) {
    upd_out r = upd_elem(o, hdr, w[k], g[k], m, v, vh, k);
    if (o.kind != DP_OPT_SGD) m[k] = r.s0;
    if (o.kind == DP_OPT_ADAMW || o.kind == DP_OPT_ADAM) v[k] = r.s1;
    if (o.amsgrad) vh[k] = r.s2;
    w[k] = r.w;
  }
}

cudaError_t dp_k_optimizer(cudaStream_t st, const dp_cuda_opt *o, float *w, const float *g,
                           float *m, float *v, float *vh, size_t n,
                           const dp_cuda_header *hdr, int n_check) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_optimizer, blocks_for(n), THREADS, 0, st)
  (*o, w, g, m, v, vh, n, hdr, n_check);
  return cudaGetLastError();
}

/* ---- gradient clipping, accumulation ------------------------------------------------ */

#define NORM_THREADS 1024
#define DP_K_NORM_CHUNK 65536 /* 2^16 squares below 2^48: a uint64 sum cannot overflow */

/* Integer sums do not depend on the order the threads add in: the bins are
 * lib/cpu/backend.c's grad_norm_op's, bit for bit. */
static __global__ void __launch_bounds__(NORM_THREADS)
    k_grad_norm(const float *g, size_t n, unsigned long long *bins) {
  __shared__ unsigned long long sq[DP_NORM_BINS];
  __shared__ unsigned long long cnt[2]; /* inf, NaN */
  const unsigned t = threadIdx.x;
  for (unsigned i = t; i < 2 * DP_NORM_BINS; i += blockDim.x) bins[i] = 0;
  for (size_t c0 = 0; c0 < n; c0 += DP_K_NORM_CHUNK) {
    for (unsigned i = t; i < DP_NORM_BINS; i += blockDim.x) sq[i] = 0;
    if (t < 2) cnt[t] = 0;
    __syncthreads(); /* the zeroes (and the last chunk's folds) before any add */
    size_t end = n - c0 < DP_K_NORM_CHUNK ? n : c0 + DP_K_NORM_CHUNK;
    for (size_t k = c0 + t; k < end; k += blockDim.x) {
      uint32_t u = __float_as_uint(g[k]);
      uint32_t E = (u >> 23) & 0xffu, m = u & 0x7fffffu;
      if (E == 0xffu) { /* inf (lo) or NaN (hi): counted */
        atomicAdd(&cnt[m != 0], 1ull);
        continue;
      }
      if (E)
        m |= 0x800000u;
      else
        E = 1; /* subnormal: no implicit bit */
      unsigned long long s = (unsigned long long)m * m;
      if (s) atomicAdd(&sq[E], s);
    }
    __syncthreads(); /* every add of the chunk before the fold */
    for (unsigned i = t; i < DP_NORM_BINS; i += blockDim.x) {
      unsigned long long lo = bins[2 * i], hi = bins[2 * i + 1];
      if (i == DP_NORM_BINS - 1) {
        lo += cnt[0];
        hi += cnt[1];
      } else {
        lo += sq[i];
        hi += lo < sq[i]; /* the carry */
      }
      bins[2 * i] = lo;
      bins[2 * i + 1] = hi;
    }
    __syncthreads(); /* the fold reads sq before the next chunk zeroes it */
  }
}

cudaError_t dp_k_grad_norm(cudaStream_t st, const float *g, size_t n,
                           unsigned long long *bins) {
  DP_LAUNCH(k_grad_norm, 1, NORM_THREADS, 0, st)(g, n, bins);
  return cudaGetLastError();
}

/* grad_clip_op's arithmetic, one IEEE operation at a time: the slots summed
 * per exponent (the largest first) into a double, its square root as a
 * float, PyTorch's coefficient. */
static __global__ void k_clip_coef(const unsigned long long *slots, int n_slots, float clip,
                                   dp_cuda_header *hdr) {
  const int B = 2 * DP_NORM_BINS;
  unsigned long long infs = 0, nans = 0;
  for (int q = 0; q < n_slots; q++) {
    infs += slots[q * B + 2 * 255];
    nans += slots[q * B + 2 * 255 + 1];
  }
  double total = 0.0;
  for (int E = 254; E >= 1; E--) {
    unsigned long long lo = 0, hi = 0;
    for (int q = 0; q < n_slots; q++) {
      const unsigned long long *b = slots + q * B + 2 * E;
      lo += b[0];
      hi += b[1] + (lo < b[0]);
    }
    if (lo | hi)
      total = __dadd_rn(total,
                        ldexp(__dadd_rn(ldexp((double)hi, 64), (double)lo), 2 * E - 300));
  }
  float norm = nans   ? __uint_as_float(0x7fc00000u)
               : infs ? __uint_as_float(0x7f800000u)
                      : (float)__dsqrt_rn(total);
  hdr->grad_norm = norm;
  hdr->clip_coef = isfinite(norm) ? fd(clip, fa(norm, 1e-6f)) : 1.0f;
}

cudaError_t dp_k_clip_coef(cudaStream_t st, const unsigned long long *slots, int n_slots,
                           float clip, dp_cuda_header *hdr) {
  if (n_slots <= 0) return cudaErrorInvalidValue;
  DP_LAUNCH(k_clip_coef, 1, 1, 0, st)(slots, n_slots, clip, hdr);
  return cudaGetLastError();
}

static __global__ void k_clip_scale(float *g, size_t n, const dp_cuda_header *hdr) {
  const float c = hdr->clip_coef;
  if (!(c < 1.0f)) return;
  GRID_STRIDE(i, n) g[i] = fm(g[i], c);
}

cudaError_t dp_k_clip_scale(cudaStream_t st, float *g, size_t n,
                            const dp_cuda_header *hdr) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_clip_scale, blocks_for(n), THREADS, 0, st)(g, n, hdr);
  return cudaGetLastError();
}

static __global__ void k_clip_value(float *g, size_t n, float hi) {
  const float lo = -hi;
  GRID_STRIDE(i, n) {
    float v = g[i];
    g[i] = v > hi ? hi : v < lo ? lo : v;
  }
}

cudaError_t dp_k_clip_value(cudaStream_t st, float *g, size_t n, float clip) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_clip_value, blocks_for(n), THREADS, 0, st)(g, n, clip);
  return cudaGetLastError();
}

static __global__ void k_checked_copy(float *dst, const float *src, size_t n,
                                      const dp_cuda_header *hdr, int n_check) {
  if (block_refused(hdr->status, n_check)) return;
  GRID_STRIDE(i, n) dst[i] = src[i];
}

cudaError_t dp_k_checked_copy(cudaStream_t st, float *dst, const float *src, size_t n,
                              const dp_cuda_header *hdr, int n_check) {
  if (n == 0) return cudaSuccess;
  DP_LAUNCH(k_checked_copy, blocks_for(n), THREADS, 0, st)(dst, src, n, hdr, n_check);
  return cudaGetLastError();
}

static __global__ void k_reset_header(dp_cuda_header *hdr) {
  for (int d = 0; d < DP_MAX_DEVICES; d++) hdr->status[d] = 0;
  hdr->bad_grad = ~0ull;
  hdr->bad_update = ~0ull;
  hdr->bad_label_row = ~0u;
  hdr->loss = 0.0f;
  hdr->grad_norm = __uint_as_float(0x7fc00000u); /* NaN: not reached */
  hdr->clip_coef = 1.0f;
}

cudaError_t dp_k_reset_header(cudaStream_t st, dp_cuda_header *hdr) {
  DP_LAUNCH(k_reset_header, 1, 1, 0, st)(hdr);
  return cudaGetLastError();
}

/* ---- self-test ------------------------------------------------------------------ */

static __global__ void k_rng_table(uint64_t seed, uint64_t stream, const uint64_t *abc,
                                   int n, uint64_t *u64, float *uniform) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint64_t *k = abc + 3 * (size_t)i;
  u64[i] = dp_d_rng_u64(seed, stream, k[0], k[1], k[2]);
  uniform[i] = dp_d_rng_uniform(seed, stream, k[0], k[1], k[2]);
}

cudaError_t dp_k_rng_table(cudaStream_t st, uint64_t seed, uint64_t stream,
                           const uint64_t *abc, int n, uint64_t *u64, float *uniform) {
  if (n <= 0) return cudaSuccess;
  DP_LAUNCH(k_rng_table, (unsigned)((n + THREADS - 1) / THREADS), THREADS, 0, st)
  (seed, stream, abc, n, u64, uniform);
  return cudaGetLastError();
}

/* ---- debug hooks (tests/gpu/run.sh) ----------------------------------------------------
 */

static __global__ void k_debug_spin(unsigned us) {
  for (unsigned i = 0; i < us; i++) __nanosleep(1000);
}

cudaError_t dp_k_debug_spin(cudaStream_t st, unsigned us) {
  DP_LAUNCH(k_debug_spin, 1, 1, 0, st)(us);
  return cudaGetLastError();
}

static __global__ void k_debug_fault(float *p) { *p = 1.0f; }

cudaError_t dp_k_debug_fault(cudaStream_t st) {
  DP_LAUNCH(k_debug_fault, 1, 1, 0, st)((float *)(uintptr_t)0x10);
  return cudaGetLastError();
}

/* ---- eager loading ------------------------------------------------------------------ */

/* Loads every kernel of this file, cuda/conv.cu, cuda/sequence.cu and cuda/batchnorm.cu on
 * the current device: asking for a kernel's attributes loads its module, which lazy loading
 * (the default since CUDA 12.2) would otherwise do at its first launch, inside a step. */
cudaError_t dp_k_preload(void) {
  const void *const kernels[] = {
      (const void *)k_act_forward,  (const void *)k_act_backward,
      (const void *)k_dropout,      (const void *)k_bias_add,
      (const void *)k_colsum,       (const void *)k_layernorm_forward,
      (const void *)k_layernorm_dx, (const void *)k_layernorm_dparams,
      (const void *)k_add,          (const void *)k_fill,
      (const void *)k_add_bf16,     (const void *)k_round_bf16,
      (const void *)k_pack_bf16,    (const void *)k_unpack_bf16,
      (const void *)k_loss_mse,     (const void *)k_loss_ce,
      (const void *)k_loss_chunks,  (const void *)k_loss_sum,
      (const void *)k_grad_check,   (const void *)k_step_check,
      (const void *)k_optimizer,    (const void *)k_reset_header,
      (const void *)k_rng_table,    (const void *)k_grad_norm,
      (const void *)k_clip_coef,    (const void *)k_clip_scale,
      (const void *)k_checked_copy, (const void *)k_clip_value,
  };
  cudaError_t e = dp_k_load(kernels, sizeof kernels / sizeof kernels[0]);
  if (e == cudaSuccess) e = dp_k_conv_preload();
  if (e == cudaSuccess) e = dp_k_sequence_preload();
  return e != cudaSuccess ? e : dp_k_bn_preload();
}

cudaError_t dp_k_load(const void *const *kernels, size_t n) {
  for (size_t i = 0; i < n; i++) {
    cudaFuncAttributes a;
    cudaError_t e = cudaFuncGetAttributes(&a, kernels[i]);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
