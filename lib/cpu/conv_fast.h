/* conv2d 3 x 3 stride 1 padding 1 and maxpool2d 2 stride 2 on the AVX-512
 * tier without im2col (lib/cpu/conv_fast.c). Internal to lib/cpu; conv.c
 * calls them where they apply and runs its im2col + GEMM path elsewhere.
 *
 * Same bits as conv.c's path, on purpose: every output element is the same
 * fma chain (taps in (channel, ky, kx) order from +0, padding taps as fmas
 * with +0, then + bias), every weight gradient the same chain over the
 * micro-batch's (image, position) pairs, every input gradient the same sum
 * over positions ascending of chains over the output channels, and the pools
 * move the same elements. (Where the kernels skip padding taps, they prove
 * the skip changes nothing or redo the chain: conv_fast.c.) So the choice
 * between the two paths (the tier, the workspace at hand) never changes a
 * bit; tests/test_conv.c compares them on random shapes with NaNs,
 * infinities, signed zeros and underflows. */
#ifndef DP_CONV_FAST_H
#define DP_CONV_FAST_H

#include "cpu/cpu.h"

#include <stdbool.h>
#include <stddef.h>

/* Whether the kernels below take this conv2d (or maxpool2d) layer: the
 * AVX-512 tier in use and the shape (3 x 3, stride 1, padding 1, output
 * channels a multiple of 16, at most 64 input channels, planes of at most
 * 4096 floats; pools: 2 x 2, stride 2, even input sides, output rows of 1, 2
 * or 4 floats). */
bool dp__convx_takes(const dp_layer *l);
/* Tests: true sends every layer to conv.c's im2col path (set it while no
 * step runs). */
extern bool dp__convx_off;
bool dp__poolx_takes(const dp_layer *l);

/* conv.c's dp__conv_forward and dp__conv_backward, ws 64-byte aligned. The
 * forward needs no workspace (a tile's weights are packed on the stack); with
 * images in the lanes, which small planes take when ws_bytes holds x^T, y^T
 * and W^T, it skips padding taps. The backward needs dp__convx_bwd_bytes
 * (dY^T; with C 9 OUT floats more the weight gradient runs in blocks of
 * images that stay in L1, and dx with images in the lanes when ws_bytes
 * holds dy^T and dx^T). It returns false, having written only the
 * workspace, when dy holds a NaN or an infinity: its weight gradient skips
 * the padding taps, which is exact only for finite dy; conv.c's path runs
 * then. */
size_t dp__convx_bwd_bytes(const dp_layer *l, int n);
void dp__convx_forward(const dp_layer *l, int n, const float *x, const float *w, float *y,
                       bool relu, void *ws, size_t ws_bytes);
bool dp__convx_backward(const dp_layer *l, int n, const float *x, const float *w,
                        const float *dy, float *dw, float *db, float *dx, void *ws,
                        size_t ws_bytes);

void dp__poolx_forward(const dp_layer *l, int n, const float *x, float *y);
void dp__poolx_backward(const dp_layer *l, int n, const float *x, const float *dy,
                        float *dx, bool masked);

/* conv.c's transpose (moves only): dst[j * ldd + i] = src[i * lds + j]. */
void dp__conv_transpose(const float *src, size_t rows, size_t cols, size_t lds, float *dst,
                        size_t ldd);

#endif
