/* A layer op on the cpu backend (lib/cpu/backend.c runs it in fp32,
 * lib/cpu/mixed.c in bf16 mixed precision): its context and the pointers the
 * core's operand view gives it. Not installed. */
#ifndef DP_CPU_LAYER_H
#define DP_CPU_LAYER_H

#include "core/operands.h"
#include "cpu/cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A layer op's context: its layer, device and micro-batch, and the operands
 * the core resolved for it (lib/core/operands.c: every pointer below). */
typedef struct {
  const dp_exec_env *e;
  const dp_plan *p;
  const dp_layer *l;
  int d, i, L;
  int local; /* first row of the micro-batch within the device's chunk */
  int mb;    /* the micro-batch's index among the device's */
  int rows;
  const dp_op *op;
  dp_layer_operands o;
} lctx;

static inline float *region(const dp_exec_env *e, int d, int r, size_t off) {
  return (float *)((unsigned char *)dp__region_ptr(e, d, r) + off);
}

/* The context of op at layer i (its own, or a fused neighbour's buffers). */
static inline lctx lctx_at(const dp_exec_env *e, const dp_op *op, int i) {
  const dp_plan *p = e->plan;
  lctx c = {
      .e = e, .p = p, .l = &p->model.layers[i], .i = i, .L = p->model.n_layers, .op = op};
  dp__layer_operands(p, op, i, &c.o);
  c.d = c.o.device;
  c.local = c.o.local;
  c.mb = c.o.mb;
  c.rows = c.o.rows;
  return c;
}

static inline lctx op_lctx(const dp_exec_env *e, const dp_op *op) {
  return lctx_at(e, op, op->layer);
}

/* The same micro-batch's context at layer i (a fused neighbour's buffers). */
static inline lctx at_layer(const lctx *c, int i) { return lctx_at(c->e, c->op, i); }

static inline float *ptr(const lctx *c, dp_span s) { return dp__span_ptr(c->e, c->d, s); }
/* (rows, in); NULL for a linear fused with its relu, which keeps no output */
static inline float *layer_in(const lctx *c) { return ptr(c, c->o.in); }
static inline float *layer_out(const lctx *c) { return ptr(c, c->o.out); }
static inline float *layer_stats(const lctx *c) { return ptr(c, c->o.stats); }
/* d(loss)/d(output of layer i) for this micro-batch: (rows, out) */
static inline float *layer_dout(const lctx *c) { return ptr(c, c->o.dout); }
/* NULL when nothing needs it (the model's input, or a view of it) */
static inline float *layer_din(const lctx *c) { return ptr(c, c->o.din); }
static inline size_t ws_bytes(const lctx *c) { return c->o.workspace.bytes; }
static inline float *layer_params(const lctx *c) { return ptr(c, c->o.params); }

/* One layer op in fp32 (lib/cpu/backend.c): the forward, and the backward
 * with the parameter gradients written (not accumulated) at grads. */
dp_status dp__cpu_forward(const lctx *c);
dp_status dp__cpu_backward(const lctx *c, float *grads);
/* A sync batchnorm's sums of a micro-batch (DP_OP_BN_STATS, DP_OP_BN_BWD_STATS)
 * from c's operands: its input, and output gradient. */
dp_status dp__cpu_bn_sums(const lctx *c, const dp_op *op);

/* The same in bf16 mixed precision (lib/cpu/mixed.c, config.precision). */
dp_status dp__mixed_forward(const lctx *c);
dp_status dp__mixed_backward(const lctx *c, float *grads);
dp_status dp__mixed_bn_sums(const lctx *c, const dp_op *op);
/* The WORKSPACE bytes of a bf16 plan (the cpu backend's workspace_bytes then). */
size_t dp__mixed_workspace_bytes(const dp_plan *p, int d);

#ifdef __cplusplus
}
#endif

#endif
