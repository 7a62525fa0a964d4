/* The one resolved operand view (lib/core/operands.c): every tensor an op
 * touches, as (region, offset, bytes) of the op's device, computed from the
 * plan in one place. Both backends take their pointers from it and compute no
 * offset of their own; dp__plan_verify checks every op's operands against the
 * plan's regions and buffers. Not installed. */
#ifndef DP_OPERANDS_H
#define DP_OPERANDS_H

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes [off, off + bytes) of region `region` of a device; region < 0: no
 * tensor (nothing needs it, or the plan keeps none: a linear fused with its
 * relu has no output of its own). */
typedef struct {
  int region;
  size_t off, bytes;
  int esz; /* bytes per element: 4 (fp32), or 2 (bf16: dp__act_esz) */
} dp_span;

#define DP_SPAN_NONE ((dp_span){.region = -1, .esz = 4})

/* A layer op's operands: layer `layer` of micro-batch op->micro_batch on
 * op->device (the op's own layer, or a fused neighbour's). */
typedef struct {
  int layer, device;
  int mb;    /* the micro-batch's index among the device's */
  int local; /* its first row within the device's rows (dropout keys rows by it) */
  int rows;
  dp_span in;  /* (rows, in): the output of layer - 1 (its owner's for a view), or INPUTS */
  dp_span out; /* (rows, out): ACTIVATIONS, or OUTPUTS for the last layer */
  dp_span din; /* (rows, in): the gradient of the input; none for the model's input */
  dp_span dout;    /* (rows, out): the gradient of the output; OUTPUT_GRADS for the last */
  dp_span params;  /* the layer's parameters (n_params floats) in PARAMS */
  dp_span stats;   /* layernorm: (rows, 2) mean and rstd saved by the forward */
  dp_span bn_area; /* batchnorm: the whole statistics area on the device (per
                      micro-batch dp__bn_stats each, or dp__bn_sync_floats) */
  dp_span bn_buffers; /* batchnorm: running_mean (c), running_var (c), the count */
  dp_span workspace;  /* the device's WORKSPACE region */
  /* a residual block's end: (rows, out) its input x (the forward adds it);
   * its begin: (rows, in) the gradient of the end's output, which the begin's
   * backward adds to din (din and dout are one buffer there: a view); with a
   * shortcut the end's skip is f's output, and the begin's the shortcut's
   * gradient (g's input's) */
  dp_span skip;
  /* a residual end with a shortcut: (rows, out) f's output gradient, which its
   * backward writes (dout, as din) */
  dp_span dskip;
} dp_layer_operands;

/* The operands of layer `layer` for op (a layer op: forward or backward of a
 * micro-batch). Pure: reads the plan only. */
void dp__layer_operands(const dp_plan *p, const dp_op *op, int layer, dp_layer_operands *o);

/* A loss op's operands: its rows' outputs, output gradients and targets, the
 * op's first row first (classic: device 0's gathered batch; allreduce: a run of
 * the device's micro-batches whose slices lie back to back, dp__slice_stride).
 * Targets are packed: (rows, out) floats for mse, (rows) int32 labels. `sums`:
 * one float per micro-batch of the op, in the device's LOSS region (device 0's
 * indexed by global micro-batch, the others' by their own). */
typedef struct {
  dp_span out, dout, targets, sums;
} dp_loss_operands;

void dp__loss_operands(const dp_plan *p, const dp_op *op, dp_loss_operands *o);

/* An optimizer-range op's operands (check, update, accumulate, clip), for
 * parameters [first, first + n) (floats) on device d: the parameters, the
 * gradients at grad (region, byte offset) as the op names them, and the
 * optimizer state the device holds for them (momentum's buffer; Adam(W)'s m then
 * v, then amsgrad's v_hat: state[0], state[1], state[2]; none for SGD). The state region
 * holds the device's range [opt_off[d], +opt_len[d]) only, one vector after the other.
 * DP_ERR_INVALID when the range has no state on the device. */
typedef struct {
  dp_span params, grads;
  dp_span state[3];
} dp_opt_operands;

dp_status dp__opt_operands(const dp_plan *p, int d, size_t first, size_t n, int grad_region,
                           size_t grad_off, dp_opt_operands *o);

/* The span's address in env (NULL for none). */
static inline float *dp__span_ptr(const dp_exec_env *e, int d, dp_span s) {
  return s.region < 0 ? NULL
                      : (float *)((unsigned char *)dp__region_ptr(e, d, s.region) + s.off);
}

/* Checks the plan (TFLite Micro's DoAnyBuffersOverlap): the regions of every
 * device lie inside its arena without overlapping; the activation buffers live
 * at the same time do not overlap and lie inside ACTIVATIONS; every op's
 * operands lie inside their regions (and, for activations, inside their
 * buffers). DP_ERR_INVALID ("plan verification: ...") naming the first
 * violation. */
dp_status dp__plan_verify(const dp_plan *p);
/* One op's operands inside the regions of its devices (k: its schedule index
 * for the message, -1 when it has none): what a checking backend asks before
 * it runs an op. */
dp_status dp__op_verify(const dp_plan *p, int k, const dp_op *op);

#ifdef __cplusplus
}
#endif

#endif
