/* The static schedule of one step: an ordered op list, grouped in stages.
 * Ops of one stage on different devices may run in parallel; a device runs
 * its ops of a stage in list order; stage boundaries order everything else.
 *
 * Gradients combine in one canonical pairwise tree over the global
 * micro-batch index, splitting [lo, hi) at mid = (lo + hi + 1) / 2: each
 * device sums its own block as a subtree, then devices combine pairwise at
 * distance 1, 2, 4, ... toward device 0 (device r with r mod 2^(k+1) = 2^k
 * sends to r - 2^k at level k). */
#include "internal.h"

typedef struct {
  dp_op *ops;
  int cap, n;
  int stage;      /* current stage number */
  bool used;      /* the current stage has an op */
  dp_status err;
} builder;

static void emit(builder *b, dp_op op) {
  op.stage = b->stage;
  b->used = true;
  if (b->ops) {
    if (b->n >= b->cap) {
      if (!b->err) b->err = DP_FAIL(DP_ERR_INVALID, "schedule: more than %d ops", b->cap);
      return;
    }
    b->ops[b->n] = op;
  }
  b->n++;
}

static void next_stage(builder *b) {
  if (b->used) b->stage++;
  b->used = false;
}

static dp_op copy_op(dp_phase ph, int exec, int sd, int sr, size_t so, int dd, int dr, size_t doff,
                     size_t bytes, int row0, int rows) {
  return (dp_op){.phase = (uint8_t)ph, .kind = DP_OP_COPY, .device = (int16_t)exec, .layer = -1,
                 .micro_batch = -1, .src_dev = (int16_t)sd, .dst_dev = (int16_t)dd,
                 .src_region = (uint8_t)sr, .dst_region = (uint8_t)dr, .src_offset = so,
                 .dst_offset = doff, .bytes = bytes, .row0 = row0, .rows = rows};
}

/* A grad slot: 0 = GRADS, k >= 1 = partial k of GRAD_PARTIALS. */
static void slot_place(const dp_plan *p, int slot, uint8_t *region, size_t *off) {
  *region = slot ? DP_REGION_GRAD_PARTIALS : DP_REGION_GRADS;
  *off = slot ? (size_t)(slot - 1) * p->model.n_params * 4 : 0;
}

/* Backward of micro-batches [lo, hi) on device d into `slot`, as the
 * canonical subtree. */
static void backward_tree(builder *b, const dp_plan *p, const dp_mb *mbs, int d, int lo, int hi,
                          int slot) {
  if (hi - lo == 1) {
    uint8_t r;
    size_t off;
    slot_place(p, slot, &r, &off);
    for (int i = p->model.n_layers - 1; i >= 0; i--)
      emit(b, (dp_op){.phase = DP_PHASE_BACKWARD, .kind = DP_OP_BACKWARD, .device = (int16_t)d,
                      .layer = (int16_t)i, .micro_batch = lo, .src_dev = (int16_t)d,
                      .dst_dev = (int16_t)d, .dst_region = r, .dst_offset = off,
                      .bytes = p->model.layers[i].n_params * 4, .row0 = mbs[lo].row0,
                      .rows = mbs[lo].rows});
    return;
  }
  int mid = (lo + hi + 1) / 2;
  backward_tree(b, p, mbs, d, lo, mid, slot);
  backward_tree(b, p, mbs, d, mid, hi, slot + 1);
  dp_op add = {.phase = DP_PHASE_BACKWARD, .kind = DP_OP_GRAD_ADD, .device = (int16_t)d,
               .layer = -1, .micro_batch = -1, .src_dev = (int16_t)d, .dst_dev = (int16_t)d,
               .bytes = p->model.n_params * 4};
  slot_place(p, slot, &add.dst_region, &add.dst_offset);
  slot_place(p, slot + 1, &add.src_region, &add.src_offset);
  emit(b, add);
}

int dp__schedule_cap(const dp_plan *p) {
  int n = 0, st = 0;
  dp__schedule_build(p, p->mbs, !p->cfg.inference, NULL, 0, &n, &st);
  return n > 0 ? n : 1;
}

dp_status dp__schedule_build(const dp_plan *p, const dp_mb *mbs, bool training, dp_op *ops,
                             int cap, int *n_ops, int *n_stages) {
  builder b = {.ops = ops, .cap = cap};
  const dp_model *m = &p->model;
  const dp_split_info *sp = &p->split;
  int in = m->input_width, out = dp_model_output_width(m), L = m->n_layers;
  size_t P = m->n_params * 4;
  /* Devices and rows this step actually has (a prefix of the planned ones). */
  int n_act = 0, rows = 0, drows[DP_MAX_DEVICES], dlast[DP_MAX_DEVICES];
  for (int d = 0; d < sp->n_used; d++) {
    drows[d] = 0;
    dlast[d] = sp->dev_mb0[d];
    for (int k = sp->dev_mb0[d]; k < sp->dev_mb0[d + 1]; k++)
      if (mbs[k].rows > 0) {
        drows[d] += mbs[k].rows;
        dlast[d] = k + 1;
      }
    if (drows[d]) n_act = d + 1;
    rows += drows[d];
  }
  size_t tw = m->loss == DP_LOSS_MSE ? (size_t)out * 4 : 4; /* target bytes per row */

  for (int d = 1; d < n_act; d++)
    emit(&b, copy_op(DP_PHASE_BROADCAST, d, 0, DP_REGION_PARAMS, 0, d, DP_REGION_PARAMS, 0, P,
                     0, 0));
  next_stage(&b);
  for (int d = 0; d < n_act; d++) {
    int r0 = sp->dev_row0[d];
    emit(&b, copy_op(DP_PHASE_SCATTER, d, DP_HOST, DP_REGION_INPUTS, (size_t)r0 * in * 4, d, DP_REGION_INPUTS,
                     0, (size_t)drows[d] * in * 4, r0, drows[d]));
  }
  if (training)
    emit(&b, copy_op(DP_PHASE_SCATTER, 0, DP_HOST, DP_REGION_TARGETS, 0, 0, DP_REGION_TARGETS, 0,
                     (size_t)rows * tw, 0, rows));
  next_stage(&b);
  for (int d = 0; d < n_act; d++)
    for (int i = 0; i < L; i++)
      for (int k = sp->dev_mb0[d]; k < dlast[d]; k++)
        emit(&b, (dp_op){.phase = DP_PHASE_FORWARD, .kind = DP_OP_FORWARD, .device = (int16_t)d,
                         .layer = (int16_t)i, .micro_batch = k, .src_dev = (int16_t)d,
                         .dst_dev = (int16_t)d, .bytes = (size_t)mbs[k].rows * m->layers[i].out * 4,
                         .row0 = mbs[k].row0, .rows = mbs[k].rows});
  next_stage(&b);
  /* Each device pushes its chunk: the gather runs in parallel. */
  for (int d = 0; d < n_act; d++) {
    int r0 = sp->dev_row0[d];
    size_t bytes = (size_t)drows[d] * out * 4, at = (size_t)r0 * out * 4;
    if (training)
      emit(&b, copy_op(DP_PHASE_GATHER, d, d, DP_REGION_OUTPUTS, 0, 0,
                       DP_REGION_GATHERED_OUTPUTS, at, bytes, r0, drows[d]));
    else
      emit(&b, copy_op(DP_PHASE_GATHER, d, d, DP_REGION_OUTPUTS, 0, DP_HOST, DP_REGION_OUTPUTS, at, bytes, r0,
                       drows[d]));
  }
  next_stage(&b);
  if (training) {
    emit(&b, (dp_op){.phase = DP_PHASE_LOSS, .kind = DP_OP_LOSS, .layer = -1, .micro_batch = -1,
                     .bytes = (size_t)rows * out * 4, .rows = rows});
    next_stage(&b);
    for (int d = 0; d < n_act; d++) {
      int r0 = sp->dev_row0[d];
      emit(&b, copy_op(DP_PHASE_SCATTER_GRADS, d, 0, DP_REGION_GATHERED_GRADS,
                       (size_t)r0 * out * 4, d, DP_REGION_OUTPUT_GRADS, 0,
                       (size_t)drows[d] * out * 4, r0, drows[d]));
    }
    next_stage(&b);
    for (int d = 0; d < n_act; d++) backward_tree(&b, p, mbs, d, sp->dev_mb0[d], dlast[d], 0);
    next_stage(&b);
    for (int dist = 1; dist < n_act; dist *= 2) {
      for (int r = 0; r + dist < n_act; r += 2 * dist) {
        emit(&b, copy_op(DP_PHASE_REDUCE, r, r + dist, DP_REGION_GRADS, 0, r, DP_REGION_COMM, 0,
                         P, 0, 0));
        emit(&b, (dp_op){.phase = DP_PHASE_REDUCE, .kind = DP_OP_GRAD_ADD, .device = (int16_t)r,
                         .layer = -1, .micro_batch = -1, .src_dev = (int16_t)r,
                         .dst_dev = (int16_t)r, .src_region = DP_REGION_COMM,
                         .dst_region = DP_REGION_GRADS, .bytes = P});
      }
      next_stage(&b);
    }
    emit(&b, (dp_op){.phase = DP_PHASE_OPTIMIZER, .kind = DP_OP_OPTIMIZER, .layer = -1,
                     .micro_batch = -1, .bytes = P});
    next_stage(&b);
  }
  *n_ops = b.n;
  *n_stages = b.stage;
  return b.err;
}

static const char *const phase_names[DP_PHASE_COUNT] = {
    "broadcast", "scatter", "forward", "gather", "loss",
    "scatter_grads", "backward", "reduce", "optimizer"};

const char *dp_phase_name(dp_phase ph) {
  return (unsigned)ph < DP_PHASE_COUNT ? phase_names[ph] : "?";
}

const char *dp_op_kind_name(dp_op_kind k) {
  static const char *const names[] = {"copy", "forward", "backward", "grad_add", "loss",
                                      "optimizer"};
  return (unsigned)k < sizeof names / sizeof *names ? names[k] : "?";
}
