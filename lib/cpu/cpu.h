/* The cpu backend (lib/cpu/): its vtable and the image layers on the CPU.
 * Not installed. */
#ifndef DP_CPU_H
#define DP_CPU_H

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* lib/conv.c: the image layers on the CPU, on n images of a micro-batch.
 * conv2d's workspace (im2col, the transposed output, the GEMMs' packing):
 * dp__conv_workspace_bytes, 0 for other layers; forward and backward return
 * false when ws_bytes is short (nothing written). w: (out, in, k, k) then the
 * bias; dw, db: written, not accumulated; dx may be NULL. */
size_t dp__conv_workspace_bytes(const dp_layer *l, int mb_rows, bool training);
/* relu: y is relu(conv(x)), the relu's forward applied as y is written
 * (dp__relu_fused) */
bool dp__conv_forward(const dp_layer *l, int n, const float *x, const float *w, float *y,
                      bool relu, void *ws, size_t ws_bytes);
bool dp__conv_backward(const dp_layer *l, int n, const float *x, const float *w,
                       const float *dy, float *dw, float *db, float *dx, void *ws,
                       size_t ws_bytes);
/* maxpool2d, avgpool2d; dx is written (maxpool needs x: where the max was).
 * masked (maxpool): x is a relu's output and dx that relu's input gradient,
 * the relu's backward applied (x <= 0 gives +0; dp__relu_bwd_fused). */
void dp__pool_forward(const dp_layer *l, int n, const float *x, float *y);
void dp__pool_backward(const dp_layer *l, int n, const float *x, const float *dy, float *dx,
                       bool masked);
/* The relu's backward in place on its input gradient dx: where y, its
 * output, is <= 0, +0 (lib/cpu/backend.c). */
void dp__relu_mask(const float *y, float *dx, size_t n);

/* lib/cpu/layernorm.c: layernorm over n rows of width D (PyTorch's):
 * y = (x - mean) rstd g + b, rstd = 1 / sqrt(var + eps), st (n, 2) the rows' mean and rstd;
 * the backward writes dg and db (not accumulated) and, when dx is not NULL, dx. The same
 * bits on every tier. */
void dp__layernorm_forward(int n, int D, float eps, const float *x, const float *g,
                           const float *b, float *st, float *y);
void dp__layernorm_backward(int n, int D, const float *x, const float *st, const float *g,
                            const float *dy, float *dg, float *db, float *dx);
/* The backward adding its rows' terms to dg and db: called on consecutive
 * blocks of the rows in order, it gives the whole call's bits (each row's
 * sums are its own; dg and db take the rows in order). */
void dp__layernorm_backward_add(int n, int D, const float *x, const float *st,
                                const float *g, const float *dy, float *dg, float *db,
                                float *dx);

/* lib/cpu/sequence.c. The embedding: y (n, T, D) from ids (n, T) (checked
 * integers below the vocabulary) and w (tokens (V, D), then positions (T, D));
 * dw written, not accumulated. */
void dp__embed_forward(const dp_layer *l, int n, const float *ids, const float *w,
                       float *y);
void dp__embed_backward(const dp_layer *l, int n, const float *ids, const float *dy,
                        float *dw);
/* Causal self-attention: qkv (n, T, 3D) -> y (n, T, D), the probabilities p
 * (n, H, T, T) saved by the forward for the backward, which writes dqkv.
 * Workspace: dp__attention_workspace_bytes (the backward returns false when
 * short; the forward runs unpacked GEMMs then, with the same bits). */
size_t dp__attention_workspace_bytes(const dp_layer *l, bool training);
/* Attention dropout's keys (on: training with l->p > 0): the probability (h, i, j)
 * of the micro-batch's row r is kept, times 1 / (1 - p), when
 * u(seed, DP_RNG_DROPOUT, key, row0 + r, h T T + i T + j) >= p. */
typedef struct {
  bool on;
  uint64_t seed, key, row0;
} dp_attn_drop;
bool dp__attention_forward(const dp_layer *l, int n, const float *qkv, float *p, float *y,
                           const dp_attn_drop *drop, void *ws, size_t ws_bytes);
bool dp__attention_backward(const dp_layer *l, int n, const float *qkv, const float *p,
                            const float *dy, float *dqkv, const dp_attn_drop *drop,
                            void *ws, size_t ws_bytes);

/* lib/cpu/softmax.c: an attention head's causal softmax in place on s (T, T):
 * row i's columns j <= i scaled, then e^(s - max) / sum (dp__expf, the sums in
 * util/expf.h's 16 lanes), +0 above the diagonal; its backward, in place on
 * ds (T, T) holding d(probabilities): p (ds - sum_j p ds) scale, +0 above.
 * The same bits on every tier and in cuda/sequence.cu. */
void dp__causal_softmax(float *s, int T, float scale);
void dp__causal_softmax_backward(const float *p, float *ds, int T, float scale);
/* Softmax cross-entropy of rows [r0, r1) of z (rows, out) against the labels
 * t (checked: 0 .. out - 1): returns the sum of the rows' losses, max +
 * log(sum e^(z - max)) - z[t], added in row order from +0, and writes g =
 * (softmax - onehot) inv, the sums in util/expf.h's 16 lanes. */
/* The same with the cross-entropy options o (PyTorch's weight, ignore_index,
 * label_smoothing): row r's loss is (1 - S) w_t (lse - z_t) + S / out
 * sum_c w_c (lse - z_c) (w: 1 without weights; 0 for an ignored row), and g =
 * (p a - (1 - S) w_t onehot - S / out w) inv with a = (1 - S) w_t + S / out
 * sum_c w_c; an ignored row's g is +0. inv: 1 / (the denominator times the
 * accumulation). */
float dp__softmax_xent_opts(const float *z, const int32_t *t, float *g, size_t r0,
                            size_t r1, int out, const dp_ce_opts *o, float inv);
float dp__softmax_xent(const float *z, const int32_t *t, float *g, size_t r0, size_t r1,
                       int out, float inv);
/* The element-wise losses but mse (dp__loss_on_targets): l1, smooth_l1 (param:
 * beta), huber (param: delta), bce_with_logits (o: the logits; pw: its pos_weight, one
 * per column of rows cols wide, or NULL for none) on elements [i0, i1) of o and t:
 * returns the sum of their terms, in element order from +0, and writes g = d term /
 * d o times inv. */
float dp__elem_loss(dp_loss_kind k, float param, const float *pw, size_t cols,
                    const float *o, const float *t, float *g, size_t i0, size_t i1,
                    float inv);

extern const dp_backend_ops dp__cpu_backend;

#ifdef __cplusplus
}
#endif

#endif
