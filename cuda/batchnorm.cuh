/* Batch normalisation on the GPU (cuda/batchnorm.cu): lib/cpu/backend.c's
 * bn_* functions, quantity for quantity, on channels-first rows: element
 * (r, ch, k) of n rows at ((r C + ch) S + k), S = H W (1 for a flat
 * batchnorm). C++, internal.
 *
 * Launchers enqueue on `st` and return cudaGetLastError(); nothing is
 * enqueued when there is nothing to do (C == 0). No atomics: a channel's
 * sums are taken by K = dp__bn_chunks(n S, C) blocks (lib/model/model.h) in
 * a fixed order that depends on (n, C, S) only and is the CPU's
 * (lib/cpu/backend.c, bn_sums), so the bits are the same run to run, for
 * every device count and on both backends. With K > 1 the chunk sums go
 * through `scratch`, the workspace header's batchnorm scratch
 * (dp_cuda_bn_scratch; 4 DP_BN_SLOTS floats). The merge, the final
 * statistics and the running-statistics update are lib/'s double-precision
 * expressions, one IEEE operation at a time: from the same inputs, the CPU's
 * bits. */
#ifndef DP_CUDA_BATCHNORM_CUH
#define DP_CUDA_BATCHNORM_CUH

#include "kernels.cuh"

/* Training, per_replica: the micro-batch's own statistics. Per channel the
 * mean, then the sum of squared deviations (two passes); st: mean (C), rstd
 * (C), unbiased variance (C; NaN for one value); y = (x - mean) rstd g + b. */
cudaError_t dp_k_bn_forward_train(cudaStream_t st, const float *x, const float *g,
                                  const float *b, float *y, float *stats, float *scratch,
                                  int n, int C, int S, float eps);
/* y = (x - mean) rstd g + b with given statistics: eval (mean = running_mean,
 * var = running_var: rstd = 1 / sqrt(var + eps)) when rstd is NULL, or sync
 * training (the whole batch's mean and rstd) when var is NULL. */
cudaError_t dp_k_bn_apply(cudaStream_t st, const float *x, const float *g, const float *b,
                          float *y, const float *mean, const float *rstd, const float *var,
                          int n, int C, int S, float eps);
/* Training backward, per_replica, with the micro-batch's saved statistics:
 * dg = sum dy xh, db = sum dy (written, not accumulated); dx (NULL: not
 * needed) = rstd (dy g - s1 / M - xh s2 / M), s1 = sum dy g, s2 = sum dy g xh. */
cudaError_t dp_k_bn_backward(cudaStream_t st, const float *x, const float *stats,
                             const float *g, const float *dy, float *dx, float *dg,
                             float *db, float *scratch, int n, int C, int S);

/* ---- sync (config.batchnorm sync): the whole batch's statistics ---- */
/* DP_OP_BN_STATS: part = rows (uint32 word), mean (C), sum of squared
 * deviations (C) of the micro-batch's n rows. */
cudaError_t dp_k_bn_part(cudaStream_t st, const float *x, float *part, float *scratch,
                         int n, int C, int S);
/* DP_OP_BN_MERGE: partial a merged with b in place (Chan et al., in double). */
cudaError_t dp_k_bn_merge(cudaStream_t st, float *a, const float *b, int C, int S);
/* DP_OP_BN_FINAL: f = mean (C), rstd (C), unbiased variance (C), rows (uint32
 * word) from the tree's root partial. */
cudaError_t dp_k_bn_final(cudaStream_t st, float *f, const float *root, int C, int S,
                          float eps);
/* DP_OP_BN_BWD_STATS: dg = sum dy xh, db = sum dy over the micro-batch's n
 * rows, with the whole batch's statistics f (final's layout). */
cudaError_t dp_k_bn_bwd_sums(cudaStream_t st, const float *x, const float *f,
                             const float *dy, float *dg, float *db, float *scratch, int n,
                             int C, int S);
/* The backward of a sync batchnorm: dx = rstd (dy g - g sb / M - xh g sg / M)
 * with the whole batch's statistics f and sums (sg (C), sb (C)); M = rows S,
 * the rows read from f. */
cudaError_t dp_k_bn_sync_dx(cudaStream_t st, const float *x, const float *f,
                            const float *sums, const float *g, const float *dy, float *dx,
                            int n, int C, int S);

/* DP_OP_BN_UPDATE: running statistics buf (mean (C), var (C), count (uint32
 * word)) from saved statistics stats (mean (C), rstd (C), unbiased variance
 * (C)): r = 0.1 stat + 0.9 r in double, count + 1. Nothing is written when
 * one of hdr->status[0..n_check) is set (the step is refused). */
cudaError_t dp_k_bn_update(cudaStream_t st, const float *stats, float *buf, int C,
                           const dp_cuda_header *hdr, int n_check, double momentum);

/* Loads this file's kernels on the current device (dp_k_preload calls it). */
cudaError_t dp_k_bn_preload(void);

#endif
