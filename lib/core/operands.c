/* The one resolved operand view: where each tensor of an op lies, from the
 * plan alone. The backends (lib/cpu/backend.c, cuda/backend.cu) take every
 * pointer from here; the plan is checked against the same view
 * (dp__plan_verify), so an op can only reach bytes the plan gave it. */
#include "core/operands.h"

#include <stdlib.h>

static dp_span span(int region, size_t off, size_t bytes) {
  return (dp_span){.region = region, .off = off, .bytes = bytes, .esz = 4};
}

/* Micro-batch slice j's rows (rows, width) of a row tensor of esz-byte elements
 * at byte `at` of region r; none when the plan keeps no buffer (at == SIZE_MAX). */
static dp_span slice_at(const dp_plan *p, int r, size_t at, int j, int rows, int width,
                        size_t esz) {
  if (at == SIZE_MAX) return DP_SPAN_NONE;
  dp_span s =
      span(r, at + (size_t)j * dp__slice_stride(p, width, esz), (size_t)rows * width * esz);
  s.esz = (int)esz;
  return s;
}

/* The micro-batch's rows of the gradient of layer o's output (o owns its
 * buffer): the buffer holds one micro-batch, or all of the device's micro-batches
 * where sync batchnorm's backward segments cut its use (dp__dact_all). */
static dp_span dact_rows(const dp_plan *p, int d, int o, int j, int rows, int width) {
  return slice_at(p, DP_REGION_ACTIVATIONS, p->act[d].dact[o], dp__dact_all(p, o) ? j : 0,
                  rows, width, dp__act_esz(p));
}

/* Layer o's output (stats: its statistics, width w floats a row) for op's
 * micro-batch (slice j): a kept one holds all of the device's micro-batches;
 * a recomputed one (config.recompute) one micro-batch, the forward's in the
 * forward phase and the recompute's in the backward phase, whose recompute
 * writes it before the backward reads it. */
static dp_span act_rows(const dp_plan *p, const dp_op *op, int o, bool stats, int j,
                        int rows, int w) {
  const dp_act_layout *a = &p->act[op->device];
  size_t at = stats ? a->stats[o] : a->act[o];
  if (p->rc[o]) {
    j = 0;
    if (op->phase != DP_PHASE_FORWARD && p->rc[o] == 1)
      at = stats ? a->rc_stats[o] : a->rc_act[o];
  }
  return slice_at(p, DP_REGION_ACTIVATIONS, at, j, rows, w, stats ? 4 : dp__act_esz(p));
}

void dp__layer_operands(const dp_plan *p, const dp_op *op, int i, dp_layer_operands *o) {
  const dp_model *m = &p->model;
  const dp_layer *l = &m->layers[i];
  const dp_act_layout *a = &p->act[op->device];
  int d = op->device, L = m->n_layers, rows = op->rows;
  int local = op->row0 - p->split.dev_row0[d];
  *o = (dp_layer_operands){.layer = i,
                           .device = d,
                           .mb = op->micro_batch - p->split.dev_mb0[d],
                           .local = local,
                           .rows = rows};
  int own = i ? dp__act_owner(m, i - 1) : -1; /* whose buffer holds the input */
  int j = o->mb;
  o->in = own < 0 ? slice_at(p, DP_REGION_INPUTS, 0, j, rows, l->in, 4)
                  : act_rows(p, op, own, false, j, rows, l->in);
  /* after a shortcut: g's input gradient, the shortcut's own buffer */
  o->din =
      own < 0 ? DP_SPAN_NONE : dact_rows(p, d, dp__grad_owner(m, i - 1), j, rows, l->in);
  if (i == L - 1) {
    o->out = slice_at(p, DP_REGION_OUTPUTS, 0, j, rows, l->out, 4);
    o->dout = slice_at(p, DP_REGION_OUTPUT_GRADS, 0, j, rows, l->out, 4);
  } else {
    int oo = dp__act_owner(m, i); /* a view's output is its owner's */
    o->out = oo < 0 ? DP_SPAN_NONE : act_rows(p, op, oo, false, j, rows, l->out);
    o->dout = dact_rows(p, d, i, j, rows, l->out);
  }
  o->params = span(DP_REGION_PARAMS, l->param_off * 4, dp__param_span(l) * 4);
  o->stats = DP_SPAN_NONE;
  o->bn_area = o->bn_buffers = DP_SPAN_NONE;
  if (dp__layer_stats_width(l))
    o->stats = act_rows(p, op, i, true, j, rows, dp__layer_stats_width(l));
  o->skip = o->dskip = DP_SPAN_NONE;
  int sc = l->kind == DP_LAYER_RESIDUAL_END || l->kind == DP_LAYER_RESIDUAL
               ? dp__block_shortcut(m, l->kind == DP_LAYER_RESIDUAL ? i : l->link)
               : -1;
  if (l->kind == DP_LAYER_RESIDUAL_END) { /* x, the block's input (or f's output) */
    int so = dp__skip_owner(m, i);
    o->skip = so < 0 ? slice_at(p, DP_REGION_INPUTS, 0, j, rows, l->out, 4)
                     : act_rows(p, op, so, false, j, rows, l->out);
    if (sc >= 0 && !p->cfg.inference) /* f's output gradient, a copy of dout */
      o->dskip = dact_rows(p, d, dp__grad_owner(m, sc - 1), j, rows, l->out);
  } else if (l->kind == DP_LAYER_RESIDUAL && own >= 0 && l->link > 0 && !p->cfg.inference) {
    /* the gradient that reaches x past f: the block's output's, or g's input's
     * with a shortcut (an inference plan has none: a block ending the model
     * named the 0 bytes of OUTPUT_GRADS, and its context failed verification) */
    int e = l->link;
    o->skip = sc >= 0      ? dact_rows(p, d, sc, j, rows, l->out)
              : e == L - 1 ? slice_at(p, DP_REGION_OUTPUT_GRADS, 0, j, rows, l->out, 4)
                           : dact_rows(p, d, e, j, rows, l->out);
  }
  if (l->kind == DP_LAYER_BATCHNORM) {
    int n_mb = p->split.dev_mb0[d + 1] - p->split.dev_mb0[d];
    size_t floats = dp__bn_sync(p, i) ? dp__bn_sync_floats(l->c, n_mb)
                                      : (size_t)n_mb * dp__bn_stats(l->c);
    if (a->stats[i] != SIZE_MAX)
      o->bn_area = span(DP_REGION_ACTIVATIONS, a->stats[i], floats * 4);
    o->bn_buffers =
        span(DP_REGION_PARAMS, (m->n_params + l->buf_off) * 4, dp__bn_buffers(l->c) * 4);
  }
  o->workspace = span(DP_REGION_WORKSPACE, 0, p->regions[d][DP_REGION_WORKSPACE].size);
}

void dp__loss_operands(const dp_plan *p, const dp_op *op, dp_loss_operands *o) {
  int d = op->device, out = dp_model_output_width(&p->model);
  size_t tw = (size_t)dp_model_target_width(&p->model) * 4;
  size_t bytes = (size_t)op->rows * out * 4;
  /* device 0's sums are indexed by global micro-batch, the others' by their own */
  int j = op->micro_batch - p->split.dev_mb0[d];
  dp_span sums = span(DP_REGION_LOSS, (size_t)j * 4, (size_t)op->n_mb * 4);
  if (p->cfg.mode == DP_MODE_CLASSIC) { /* the whole batch, gathered on device 0 */
    *o = (dp_loss_operands){.out = span(DP_REGION_GATHERED_OUTPUTS, 0, bytes),
                            .dout = span(DP_REGION_GATHERED_GRADS, 0, bytes),
                            .targets = span(DP_REGION_TARGETS, 0, (size_t)op->rows * tw),
                            .sums = sums};
    return;
  }
  size_t at = (size_t)j * dp__slice_stride(p, out, 4);
  *o = (dp_loss_operands){.out = span(DP_REGION_OUTPUTS, at, bytes),
                          .dout = span(DP_REGION_OUTPUT_GRADS, at, bytes),
                          .targets = span(DP_REGION_TARGETS,
                                          (size_t)(op->row0 - p->split.dev_row0[d]) * tw,
                                          (size_t)op->rows * tw),
                          .sums = sums};
}

dp_status dp__opt_operands(const dp_plan *p, int d, size_t first, size_t n, int grad_region,
                           size_t grad_off, dp_opt_operands *o) {
  *o = (dp_opt_operands){.params = span(DP_REGION_PARAMS, first * 4, n * 4),
                         .grads = span(grad_region, grad_off, n * 4),
                         .state = {DP_SPAN_NONE, DP_SPAN_NONE, DP_SPAN_NONE}};
  int k = dp__cfg_state_vectors(&p->cfg);
  if (!k) return DP_OK;
  if (first < p->opt_off[d] || first + n > p->opt_off[d] + p->opt_len[d])
    return DP_FAIL(DP_ERR_INVALID,
                   "device %d: parameters %zu..%zu have no optimizer state here (it holds "
                   "%zu..%zu)",
                   d, first, first + n, p->opt_off[d], p->opt_off[d] + p->opt_len[d]);
  for (int v = 0; v < k; v++)
    o->state[v] =
        span(DP_REGION_OPT_STATE, (first - p->opt_off[d] + v * p->opt_len[d]) * 4, n * 4);
  return DP_OK;
}
