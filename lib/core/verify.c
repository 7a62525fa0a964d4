/* dp__plan_verify: the plan checked against itself before any arena exists
 * (dp_ctx_create* run it): regions inside the arena and apart, activation
 * buffers live at the same time apart, and every op's operands inside the
 * regions and buffers the plan gave them. The planner computes offsets one
 * way; this reads them back another, so an overlap or a stray offset is a
 * refused plan, not a silent overwrite. */
#include "core/operands.h"

#include <stdio.h>
#include <stdlib.h>

#define BAD(...) DP_FAIL(DP_ERR_INVALID, "plan verification: " __VA_ARGS__)

static dp_status verify_regions(const dp_plan *p, int d) {
  const dp_region_info *r = p->regions[d];
  for (int a = 0; a < DP_REGION_COUNT; a++) {
    size_t end;
    if (!dp__add(r[a].offset, r[a].size, &end) || end > p->dev_bytes[d])
      return BAD("device %d: region %s [%zu, +%zu) is outside the arena (%zu bytes)", d,
                 dp_region_name((dp_region)a), r[a].offset, r[a].size, p->dev_bytes[d]);
    if (r[a].size && p->align && r[a].offset % p->align)
      return BAD("device %d: region %s at %zu is not aligned to %zu", d,
                 dp_region_name((dp_region)a), r[a].offset, p->align);
    for (int b = 0; b < a; b++)
      if (r[a].size && r[b].size && r[a].offset < r[b].offset + r[b].size &&
          r[b].offset < r[a].offset + r[a].size)
        return BAD("device %d: regions %s and %s overlap", d, dp_region_name((dp_region)a),
                   dp_region_name((dp_region)b));
  }
  return DP_OK;
}

typedef struct {
  dp_live_buf b[DP_ACT_BUFS];
  int who[DP_ACT_BUFS], n;
} act_set;

static const char *const buf_kind[] = {"output", "statistics", "output gradient",
                                       "recomputed output", "recomputed statistics"};

/* The device's activation buffers, with the offsets the plan placed them at. */
static dp_status placed_buffers(const dp_plan *p, int d, act_set *s) {
  dp_status st = dp__act_buffers(p, d, s->b, s->who, &s->n);
  if (st) return st;
  int L = p->model.n_layers;
  const dp_act_layout *a = &p->act[d];
  size_t cap = p->regions[d][DP_REGION_ACTIVATIONS].size;
  for (int k = 0; k < s->n; k++) {
    int kind = s->who[k] / L, i = s->who[k] % L;
    const size_t *at = kind == 0   ? a->act
                       : kind == 1 ? a->stats
                       : kind == 2 ? a->dact
                       : kind == 3 ? a->rc_act
                                   : a->rc_stats;
    s->b[k].offset = at[i];
    if (s->b[k].offset == SIZE_MAX || s->b[k].offset > cap ||
        s->b[k].size > cap - s->b[k].offset)
      return BAD("device %d: the %s buffer of layer %d [%zu, +%zu) is outside ACTIVATIONS "
                 "(%zu bytes)",
                 d, buf_kind[kind], i, s->b[k].offset, s->b[k].size, cap);
  }
  for (int k = 0; k < s->n; k++)
    for (int j = 0; j < k; j++) {
      const dp_live_buf *x = &s->b[k], *y = &s->b[j];
      bool live = x->first <= y->last && y->first <= x->last;
      bool apart = x->offset + x->size <= y->offset || y->offset + y->size <= x->offset;
      if (live && !apart && x->size && y->size)
        return BAD("device %d: the %s buffer of layer %d and the %s buffer of layer %d are "
                   "live at the same time and overlap",
                   d, buf_kind[s->who[k] / L], s->who[k] % L, buf_kind[s->who[j] / L],
                   s->who[j] % L);
    }
  return DP_OK;
}

/* A span of an op on device d lies inside its region, and an ACTIVATIONS span
 * inside one of the device's buffers (s; NULL: not checked). */
static dp_status check_span(const dp_plan *p, const act_set *s, const char *k, int d,
                            dp_span sp, const char *what) {
  if (sp.region < 0 || d < 0 || !sp.bytes) return DP_OK; /* DP_HOST: the caller's */
  if (sp.region >= DP_REGION_COUNT)
    return BAD("%s: %s names region %d", k, what, sp.region);
  if (sp.region == DP_REGION_PARAMS) d = dp__param_home(p, d); /* as dp__region_ptr */
  size_t cap = p->regions[d][sp.region].size;
  if (sp.off > cap || sp.bytes > cap - sp.off)
    return BAD("%s (device %d): %s [%zu, +%zu) is outside region %s (%zu bytes)", k, d,
               what, sp.off, sp.bytes, dp_region_name((dp_region)sp.region), cap);
  if (sp.region != DP_REGION_ACTIVATIONS || !s) return DP_OK;
  for (int j = 0; j < s->n; j++)
    if (sp.off >= s->b[j].offset && sp.off + sp.bytes <= s->b[j].offset + s->b[j].size)
      return DP_OK;
  return BAD("%s (device %d): %s [%zu, +%zu) is in no activation buffer", k, d, what,
             sp.off, sp.bytes);
}

static dp_status verify_layer_op(const dp_plan *p, const act_set *s, const char *k,
                                 const dp_op *op) {
  dp_layer_operands o;
  dp__layer_operands(p, op, op->layer, &o);
  bool fwd = op->kind == DP_OP_FORWARD;
  const struct {
    dp_span sp;
    const char *what;
  } t[] = {{o.in, "the input"},
           {o.out, "the output"},
           {fwd ? DP_SPAN_NONE : o.din, "the input gradient"},
           {fwd ? DP_SPAN_NONE : o.dout, "the output gradient"},
           {o.params, "the parameters"},
           {o.stats, "the statistics"},
           {o.bn_area, "the batchnorm statistics"},
           {o.bn_buffers, "the batchnorm buffers"},
           {o.skip, "the residual operand"},
           {fwd ? DP_SPAN_NONE : o.dskip, "the residual's f output gradient"}};
  for (size_t j = 0; j < sizeof t / sizeof *t; j++) {
    dp_status st = check_span(p, s, k, op->device, t[j].sp, t[j].what);
    if (st) return st;
  }
  return DP_OK;
}

static dp_status verify_loss_op(const dp_plan *p, const char *k, const dp_op *op) {
  dp_loss_operands o;
  dp__loss_operands(p, op, &o);
  dp_status st = check_span(p, NULL, k, op->device, o.out, "the outputs");
  if (!st) st = check_span(p, NULL, k, op->device, o.dout, "the output gradients");
  if (!st) st = check_span(p, NULL, k, op->device, o.targets, "the targets");
  if (!st) st = check_span(p, NULL, k, op->device, o.sums, "the loss sums");
  return st;
}

/* An op's source and destination as (region, offset, bytes) of their devices. */
static dp_status verify_op(const dp_plan *p, const act_set *sets, int i, const dp_op *op) {
  char k[96]; /* "op 17 (forward, layer 2)": the op in messages */
  int at = i >= 0 ? snprintf(k, sizeof k, "op %d (", i) : snprintf(k, sizeof k, "an op (");
  snprintf(k + at, sizeof k - (size_t)at, op->layer >= 0 ? "%s, layer %d)" : "%s)",
           dp_op_kind_name((dp_op_kind)op->kind), op->layer);
  if (op->device < 0 || op->device >= p->cfg.n_devices)
    return BAD("%s runs on device %d of %d", k, op->device, p->cfg.n_devices);
  if (op->kind == DP_OP_FORWARD || op->kind == DP_OP_BACKWARD) {
    if (op->layer < 0 || op->layer >= p->model.n_layers)
      return BAD("%s names layer %d of %d", k, op->layer, p->model.n_layers);
    return verify_layer_op(p, sets ? &sets[op->device] : NULL, k, op);
  }
  if (op->kind == DP_OP_LOSS) return verify_loss_op(p, k, op);
  bool local = op->kind == DP_OP_GRAD_ADD || op->kind == DP_OP_GRAD_PACK ||
               op->kind == DP_OP_GRAD_UNPACK;
  if (op->kind != DP_OP_COPY && op->kind != DP_OP_COPY_ADD && !local) return DP_OK;
  int sd = local ? op->device : op->src_dev;
  int dd = local ? op->device : op->dst_dev;
  /* bf16 sides (config.reduce_precision) hold half the bytes */
  bool src16 = op->kind == DP_OP_GRAD_UNPACK ||
               (op->kind == DP_OP_GRAD_ADD && (op->flags & DP_OPF_SRC_BF16));
  dp_span src = {.region = op->src_region,
                 .off = op->src_offset,
                 .bytes = src16 ? op->bytes / 2 : op->bytes};
  dp_span dst = {.region = op->dst_region,
                 .off = op->dst_offset,
                 .bytes = op->kind == DP_OP_GRAD_PACK ? op->bytes / 2 : op->bytes};
  /* a transfer names the memory of its two ends: never the parameters of a
   * device that reads another's (shared parameters: it has none) */
  const int ends[2] = {sd, dd}, regions[2] = {op->src_region, op->dst_region};
  for (int e = 0; e < 2; e++)
    if (ends[e] != DP_HOST && regions[e] == DP_REGION_PARAMS &&
        dp__param_home(p, ends[e]) != ends[e])
      return BAD("%s: %s is device %d's parameters, which it reads from device %d", k,
                 e ? "the destination" : "the source", ends[e], dp__param_home(p, ends[e]));
  dp_status st = sd == DP_HOST
                     ? DP_OK
                     : check_span(p, sets ? &sets[sd] : NULL, k, sd, src, "the source");
  if (!st && dd != DP_HOST)
    st = check_span(p, sets ? &sets[dd] : NULL, k, dd, dst, "the destination");
  return st;
}

dp_status dp__op_verify(const dp_plan *p, int k, const dp_op *op) {
  bool copy = op->kind == DP_OP_COPY || op->kind == DP_OP_COPY_ADD;
  int nd = p->cfg.n_devices;
  if (copy && (op->src_dev < DP_HOST || op->src_dev >= nd || op->dst_dev < DP_HOST ||
               op->dst_dev >= nd))
    return BAD("op %d (%s) copies between unknown devices (%d to %d)", k,
               dp_op_kind_name((dp_op_kind)op->kind), op->src_dev, op->dst_dev);
  return verify_op(p, NULL, k, op);
}

dp_status dp__plan_verify(const dp_plan *p) {
  int nd = p->cfg.n_devices;
  act_set *sets = calloc((size_t)(nd > 0 ? nd : 1), sizeof *sets);
  if (!sets) return DP_FAIL(DP_ERR_NOMEM, "plan verification: out of memory");
  dp_status st = DP_OK;
  for (int d = 0; d < nd && !st; d++) {
    st = verify_regions(p, d);
    if (!st) st = placed_buffers(p, d, &sets[d]);
  }
  for (int k = 0; k < p->n_ops && !st; k++) {
    const dp_op *op = &p->ops[k];
    bool copy = op->kind == DP_OP_COPY || op->kind == DP_OP_COPY_ADD;
    st = copy && (op->src_dev < DP_HOST || op->src_dev >= nd || op->dst_dev < DP_HOST ||
                  op->dst_dev >= nd)
             ? dp__op_verify(p, k, op)
             : verify_op(p, sets, k, op);
  }
  free(sets);
  return st;
}
