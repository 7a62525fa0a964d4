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
bool dp__conv_forward(const dp_layer *l, int n, const float *x, const float *w, float *y,
                      void *ws, size_t ws_bytes);
bool dp__conv_backward(const dp_layer *l, int n, const float *x, const float *w,
                       const float *dy, float *dw, float *db, float *dx, void *ws,
                       size_t ws_bytes);
/* maxpool2d, avgpool2d; dx is written (maxpool needs x: where the max was). */
void dp__pool_forward(const dp_layer *l, int n, const float *x, float *y);
void dp__pool_backward(const dp_layer *l, int n, const float *x, const float *dy,
                       float *dx);

extern const dp_backend_ops dp__cpu_backend;

#ifdef __cplusplus
}
#endif

#endif
