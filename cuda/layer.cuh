/* A layer op on the cuda backend (cuda/backend.cu runs it in fp32, cuda/mixed.cu
 * in bf16 mixed precision): its context and the pointers the core's operand view
 * gives it. C++, internal. */
#ifndef DP_CUDA_LAYER_CUH
#define DP_CUDA_LAYER_CUH

#include "backend.cuh"
#include "core/operands.h"

/* ---- layers: the operands the core resolved (lib/core/operands.c) ---------------- */

struct lay {
  const dp_exec_env *e;
  const dp_plan *p;
  const dp_layer *l;
  const dp_op *op;
  int d, i, L;
  int local; /* first row of the micro-batch within the device's chunk */
  int rows;
  int mb; /* the micro-batch's index among the device's */
  dp_layer_operands o;
};

/* Op's context at layer i (its own, or a fused neighbour's buffers). */
static inline lay lay_of(const dp_exec_env *e, const dp_op *op, int i) {
  lay c = {};
  c.e = e;
  c.p = e->plan;
  c.l = &c.p->model.layers[i];
  c.op = op;
  c.i = i;
  c.L = c.p->model.n_layers;
  dp__layer_operands(c.p, op, i, &c.o);
  c.d = c.o.device;
  c.local = c.o.local;
  c.rows = c.o.rows;
  c.mb = c.o.mb;
  return c;
}

static inline lay at_layer(const lay &c, int i) { return lay_of(c.e, c.op, i); }

static inline float *ptr(const lay &c, dp_span s) { return dp__span_ptr(c.e, c.d, s); }
/* (rows, in); NULL for a linear fused with its relu, which keeps no output */
static inline float *layer_in(const lay &c) { return ptr(c, c.o.in); }
static inline float *layer_out(const lay &c) { return ptr(c, c.o.out); }
static inline float *layer_stats(const lay &c) { return ptr(c, c.o.stats); }
static inline float *layer_dout(const lay &c) { return ptr(c, c.o.dout); }
/* NULL when nothing needs it (the model's input, or a view of it) */
static inline float *layer_din(const lay &c) { return ptr(c, c.o.din); }
static inline float *layer_params(const lay &c) { return ptr(c, c.o.params); }

/* One layer op in fp32 (cuda/backend.cu): the forward, and the backward with the
 * parameter gradients written (not accumulated) at grads; global_row0 keys
 * dropout. */
dp_status dp__cuda_forward(dev_ctx *x, const lay &c, int global_row0);
dp_status dp__cuda_backward(dev_ctx *x, const lay &c, float *grads, int global_row0);
/* The same in bf16 mixed precision (cuda/mixed.cu, config.precision). */
dp_status dp__cuda_mixed_forward(dev_ctx *x, const lay &c, int global_row0);
dp_status dp__cuda_mixed_backward(dev_ctx *x, const lay &c, float *grads, int global_row0);
/* A sync batchnorm's sums op in bf16: c's input (and with dout its output
 * gradient) replaced by fp32 copies. */
dp_status dp__cuda_mixed_bn_operands(dev_ctx *x, lay *c, bool dout);

#endif
