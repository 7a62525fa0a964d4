/* The static schedule of one step: an ordered op list, grouped in stages.
 * Ops of one stage on different devices may run in parallel; a device runs
 * its ops of a stage in list order; stage boundaries order everything else.
 *
 * Gradients combine in one canonical pairwise tree over the global
 * micro-batch index, splitting [lo, hi) at mid = (lo + hi + 1) / 2: each
 * device sums its own block as a subtree, then devices combine pairwise at
 * distance 1, 2, 4, ... toward device 0 (device r with r mod 2^(k+1) = 2^k
 * sends to r - 2^k at level k).
 *
 * A sync batchnorm (whole-batch statistics) needs the whole batch in the
 * middle of the step: the forward stops before it for its statistics' tree
 * (the same tree, with Chan's merge) and the backward runs in segments that
 * end at it, for its sums' tree; each segment's gradient adds cover only its
 * layers' parameters, so every parameter's sum is still the one tree. */
#include "core/backend.h"

typedef struct {
  dp_op *ops;
  int cap, n;
  int stage; /* current stage number */
  bool used; /* the current stage has an op */
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

/* A copy's ends, a device (or DP_HOST), a region and a byte offset: two types,
 * so that a copy written with its source and destination swapped does not
 * compile. */
typedef struct {
  int dev, region;
  size_t off;
} from_end;
typedef struct {
  int dev, region;
  size_t off;
} to_end;
#define FROM(dev, region, off) ((from_end){(dev), (region), (off)})
#define TO(dev, region, off) ((to_end){(dev), (region), (off)})

/* A copy run by device `exec` (its stream, its transport call). */
static dp_op copy_op(dp_phase ph, int exec, from_end s, to_end t, size_t bytes, int row0,
                     int rows) {
  return (dp_op){.phase = (uint8_t)ph,
                 .kind = DP_OP_COPY,
                 .device = (int16_t)exec,
                 .layer = -1,
                 .micro_batch = -1,
                 .src_dev = (int16_t)s.dev,
                 .dst_dev = (int16_t)t.dev,
                 .src_region = (uint8_t)s.region,
                 .dst_region = (uint8_t)t.region,
                 .src_offset = s.off,
                 .dst_offset = t.off,
                 .bytes = bytes,
                 .row0 = row0,
                 .rows = rows};
}

/* The end of the run of micro-batches from k (before `end`) whose slices of a
 * width-w row tensor lie back to back (dp__slice_stride): each but the last fills
 * its slice. */
static int slice_run_end(const dp_plan *p, const dp_mb *mbs, int k, int end, int w) {
  size_t S = dp__slice_stride(p, w, 4);
  int j = k + 1;
  while (j < end && (size_t)mbs[j - 1].rows * w * 4 == S) j++;
  return j;
}

/* The rows of micro-batches [k, j) (consecutive: they are). */
static int run_rows(const dp_mb *mbs, int k, int j) {
  return mbs[j - 1].row0 + mbs[j - 1].rows - mbs[k].row0;
}

/* A device's rows copied between a packed tensor (row after row; `packed` is
 * where the device's first row goes) and the device's sliced one (one slice per
 * micro-batch, dp__slice_stride): micro-batches dev_mb0[d] .. mb_end of device d,
 * width w floats, run by device d; the sliced end is at offset 0 of its region. */
typedef struct {
  dp_phase ph;
  int d, mb_end, w;
  bool to_slices; /* packed -> slices (scatter), else slices -> packed (gather) */
  from_end from;
  to_end to;
} rows_copy;

/* One copy per run of back-to-back slices. */
static void rows_copies(builder *b, const dp_plan *p, const dp_mb *mbs,
                        const rows_copy *c) {
  int k0 = p->split.dev_mb0[c->d], row0 = p->split.dev_row0[c->d];
  bool to_slices = c->to_slices;
  size_t S = dp__slice_stride(p, c->w, 4), rb = (size_t)c->w * 4;
  for (int k = k0, j; k < c->mb_end; k = j) {
    j = slice_run_end(p, mbs, k, c->mb_end, c->w);
    int rows = run_rows(mbs, k, j);
    size_t sliced = (size_t)(k - k0) * S, packed = (size_t)(mbs[k].row0 - row0) * rb;
    from_end f = c->from;
    to_end t = c->to;
    f.off += to_slices ? packed : sliced;
    t.off += to_slices ? sliced : packed;
    emit(b, copy_op(c->ph, c->d, f, t, (size_t)rows * rb, mbs[k].row0, rows));
  }
}

/* An op of device d on its own memory; the caller sets what else it needs. */
static dp_op device_op(dp_phase ph, dp_op_kind kind, int d, size_t bytes) {
  return (dp_op){.phase = (uint8_t)ph,
                 .kind = (uint8_t)kind,
                 .device = (int16_t)d,
                 .layer = -1,
                 .micro_batch = -1,
                 .src_dev = (int16_t)d,
                 .dst_dev = (int16_t)d,
                 .bytes = bytes};
}

/* A layer op of micro-batch k (rows mbs[k]) on device d. */
static dp_op layer_op(dp_phase ph, dp_op_kind kind, int d, int layer, int k,
                      const dp_mb *mbs, size_t bytes) {
  dp_op op = device_op(ph, kind, d, bytes);
  op.layer = (int16_t)layer;
  op.micro_batch = k;
  op.row0 = mbs[k].row0;
  op.rows = mbs[k].rows;
  return op;
}

/* A grad slot: 0 = GRADS, k >= 1 = partial k of GRAD_PARTIALS. */
static void slot_place(const dp_plan *p, int slot, uint8_t *region, size_t *off) {
  *region = slot ? DP_REGION_GRAD_PARTIALS : DP_REGION_GRADS;
  *off = slot ? (size_t)(slot - 1) * dp__partial_stride(p) : 0;
}

/* config.reduce_precision bf16 (docs/PRECISION.md, "Gradient reduction"):
 * each micro-batch's gradient and every sum of the tree rounded to bf16 */
static uint8_t sum_flags(const dp_plan *p) {
  return p->cfg.reduce_precision == DP_PRECISION_BF16 ? DP_OPF_ROUND_BF16 : 0;
}

/* One segment of the backward: layers top .. bot+1, then, when bot >= 0, the
 * sums of sync batchnorm bot (which the layers below wait for: its backward
 * is the next segment's top); the segment's gradients are bytes [p0, p1).
 * Without sync batchnorm the backward is one segment (top = L - 1, bot = -1). */
typedef struct {
  int top, bot;
  size_t p0, p1;
} bwd_seg;

/* Backward of micro-batches [lo, hi) on device d into `slot`, as the
 * canonical subtree, for the segment's layers and gradients. The tree is
 * always the planned one: a smaller batch empties micro-batches from the end,
 * and an empty subtree is left out (its sibling passes through unchanged), so
 * the tree does not depend on how the micro-batches are dealt to devices.
 * mbs[lo] is not empty. The segments' gradients are disjoint, so each
 * parameter's sum is the same tree whatever the segments. */
static void backward_tree(builder *b, const dp_plan *p, const dp_mb *mbs, int d, int lo,
                          int hi, int slot, const bwd_seg *sg) {
  if (hi - lo == 1) {
    uint8_t r;
    size_t off;
    slot_place(p, slot, &r, &off);
    for (int i = sg->top; i > sg->bot; i--) {
      /* config.recompute: the segment's forward again, from its kept input
       * into its recompute buffers, before its backward (dp__layer_operands
       * gives a backward-phase op those) */
      if (i == p->seg_hi[i] || i == sg->top)
        for (int j = p->seg_lo[i]; j <= i; j++)
          if (dp__recompute_op(p, j))
            emit(b, layer_op(DP_PHASE_BACKWARD, DP_OP_FORWARD, d, j, lo, mbs,
                             (size_t)mbs[lo].rows * p->model.layers[j].out * 4));
      dp_op op = layer_op(DP_PHASE_BACKWARD, DP_OP_BACKWARD, d, i, lo, mbs,
                          p->model.layers[i].n_params * 4);
      op.flags = sum_flags(p); /* the micro-batch's gradient is a leaf of the tree */
      op.dst_region = r;
      op.dst_offset = off;
      emit(b, op);
    }
    if (sg->bot >= 0) {
      const dp_layer *l = &p->model.layers[sg->bot];
      dp_op op = layer_op(DP_PHASE_BACKWARD, DP_OP_BN_BWD_STATS, d, sg->bot, lo, mbs,
                          l->n_params * 4);
      op.flags = sum_flags(p);
      op.dst_region = r;
      op.dst_offset = off;
      emit(b, op);
    }
    return;
  }
  int mid = (lo + hi + 1) / 2;
  /* the right subtree's slot: the next level's, or (dp__leaf_slots) its first
   * micro-batch's own */
  int right = dp__leaf_slots(p) ? slot + (mid - lo) : slot + 1;
  backward_tree(b, p, mbs, d, lo, mid, slot, sg);
  if (mbs[mid].rows == 0) return;
  backward_tree(b, p, mbs, d, mid, hi, right, sg);
  if (sg->p1 == sg->p0) return;
  dp_op add = device_op(DP_PHASE_BACKWARD, DP_OP_GRAD_ADD, d, sg->p1 - sg->p0);
  add.flags = sum_flags(p);
  slot_place(p, slot, &add.dst_region, &add.dst_offset);
  slot_place(p, right, &add.src_region, &add.src_offset);
  add.dst_offset += sg->p0;
  add.src_offset += sg->p0;
  emit(b, add);
}

/* ---- sync batchnorm: whole-batch statistics in the canonical tree ---- */

/* Byte offset of float `at` of batchnorm i's statistics area on device d. */
static size_t bn_at(const dp_plan *p, int d, int i, size_t at) {
  return p->act[d].stats[i] + at * 4;
}

static dp_op bn_op(dp_phase ph, dp_op_kind kind, int d, int i, size_t dst, size_t src,
                   size_t bytes) {
  dp_op op = device_op(ph, kind, d, bytes);
  op.layer = (int16_t)i;
  op.dst_region = op.src_region = DP_REGION_ACTIVATIONS;
  op.dst_offset = dst;
  op.src_offset = src;
  return op;
}

/* The forward partials of micro-batches [lo, hi) (local slots from mb0) merged
 * into slot lo - mb0, as the canonical subtree. */
static void bn_merge_tree(builder *b, const dp_plan *p, const dp_mb *mbs, int d, int i,
                          int mb0, int lo, int hi) {
  if (hi - lo == 1) return;
  int mid = (lo + hi + 1) / 2, c = p->model.layers[i].c;
  bn_merge_tree(b, p, mbs, d, i, mb0, lo, mid);
  if (mbs[mid].rows == 0) return;
  bn_merge_tree(b, p, mbs, d, i, mb0, mid, hi);
  emit(b, bn_op(DP_PHASE_FORWARD, DP_OP_BN_MERGE, d, i,
                bn_at(p, d, i, dp__bn_sync_fwd(c, lo - mb0)),
                bn_at(p, d, i, dp__bn_sync_fwd(c, mid - mb0)), dp__bn_sync_part(c) * 4));
}

/* Devices 0..n-1's sums (at `mine` of each) combined toward device 0 at
 * distance 1, 2, 4, ..., as the gradients: a copy into device r's `recv`,
 * then `kind` (merge or add); the stage stays open after the last level. */
static void bn_tree_to_0(builder *b, const dp_plan *p, int n, int i, dp_phase ph,
                         dp_op_kind kind, size_t mine, size_t recv, size_t floats) {
  for (int dist = 1; dist < n; dist *= 2) {
    if (dist > 1) next_stage(b);
    for (int r = 0; r + dist < n; r += 2 * dist) {
      emit(b, copy_op(
                  ph, r, FROM(r + dist, DP_REGION_ACTIVATIONS, bn_at(p, r + dist, i, mine)),
                  TO(r, DP_REGION_ACTIVATIONS, bn_at(p, r, i, recv)), floats * 4, 0, 0));
      dp_op op =
          bn_op(ph, kind, r, i, bn_at(p, r, i, mine), bn_at(p, r, i, recv), floats * 4);
      if (kind == DP_OP_GRAD_ADD) { /* the batchnorm's gradients: sums of the tree */
        op.layer = -1;
        op.flags = sum_flags(p);
      }
      emit(b, op);
    }
  }
}

/* Device 0's `floats` at `at` to devices 1..n-1 (their own offsets), each
 * pulled by its device; the stage stays open: what the devices run next
 * reads it after the copy, in list order, so no barrier is needed. */
static void bn_bcast(builder *b, const dp_plan *p, int n, int i, dp_phase ph, size_t at,
                     size_t floats) {
  for (int d = 1; d < n; d++)
    emit(b, copy_op(ph, d, FROM(0, DP_REGION_ACTIVATIONS, bn_at(p, 0, i, at)),
                    TO(d, DP_REGION_ACTIVATIONS, bn_at(p, d, i, at)), floats * 4, 0, 0));
}

/* Loss terms of micro-batches [mb0, mb1), rows [row0, +rows), on device d. */
static dp_op loss_op(int d, int mb0, int mb1, int row0, int rows, int out) {
  dp_op op = device_op(DP_PHASE_LOSS, DP_OP_LOSS, d, (size_t)rows * out * 4);
  op.micro_batch = mb0;
  op.n_mb = mb1 - mb0;
  op.row0 = row0;
  op.rows = rows;
  return op;
}

static dp_op loss_sum_op(int n_mb, int rows) {
  return (dp_op){.phase = DP_PHASE_LOSS,
                 .kind = DP_OP_LOSS_SUM,
                 .layer = -1,
                 .micro_batch = 0,
                 .n_mb = n_mb,
                 .src_region = DP_REGION_LOSS,
                 .bytes = (size_t)n_mb * 4,
                 .rows = rows};
}

static dp_op grad_add_op(int d, int dst_region, size_t dst_off, int src_region,
                         size_t src_off, size_t bytes) {
  dp_op op = device_op(DP_PHASE_REDUCE, DP_OP_GRAD_ADD, d, bytes);
  op.src_region = (uint8_t)src_region;
  op.dst_region = (uint8_t)dst_region;
  op.src_offset = src_off;
  op.dst_offset = dst_off;
  return op;
}

/* config.reduce_precision bf16 across a copy (dp__wire_bf16): device d's
 * gradients [off, +bytes) rounded to bf16 into its send area (plan.c:
 * wire_send) at `at` bytes of bf16, in a stage before the copies that read
 * them. */
static void pack(builder *b, const dp_plan *p, int d, size_t off, size_t bytes, size_t at) {
  dp_op op = device_op(DP_PHASE_REDUCE, DP_OP_GRAD_PACK, d, bytes);
  op.src_region = DP_REGION_GRADS;
  op.src_offset = off;
  op.dst_region = DP_REGION_COMM;
  op.dst_offset = p->wire_send[d] + at;
  emit(b, op);
}

/* The reverse on device d: the bf16 values received at comm 0 widened into
 * its gradients [off, +bytes). */
static void unpack(builder *b, int d, size_t off, size_t bytes) {
  dp_op op = device_op(DP_PHASE_REDUCE, DP_OP_GRAD_UNPACK, d, bytes);
  op.src_region = DP_REGION_COMM;
  op.dst_region = DP_REGION_GRADS;
  op.dst_offset = off;
  emit(b, op);
}

/* Device dst's copy of what device src packed at `at` (bytes / 2 of bf16 for
 * bytes of gradients) into its comm region. */
static dp_op wire_copy(const dp_plan *p, int dst, int src, size_t at, size_t bytes) {
  return copy_op(DP_PHASE_REDUCE, dst, FROM(src, DP_REGION_COMM, p->wire_send[src] + at),
                 TO(dst, DP_REGION_COMM, 0), bytes / 2, 0, 0);
}

/* Device dst's gradients [off, +bytes) += device src's, on dst: in one pass
 * when the transport adds in place (dp__copy_adds), else its first half, the
 * copy into dst's comm region (the add follows: reduce_add), of bf16 values
 * that src packed (dp__wire_bf16). */
static void reduce_copy(builder *b, const dp_plan *p, int dst, int src, size_t off,
                        size_t bytes) {
  if (dp__wire_bf16(&p->cfg, dst, src)) {
    emit(b, wire_copy(p, dst, src, 0, bytes));
    return;
  }
  dp_op op = copy_op(DP_PHASE_REDUCE, dst, FROM(src, DP_REGION_GRADS, off),
                     TO(dst, DP_REGION_COMM, 0), bytes, 0, 0);
  if (dp__copy_adds(&p->cfg, dst, src)) {
    op.kind = DP_OP_COPY_ADD;
    op.flags = sum_flags(p);
    op.dst_region = DP_REGION_GRADS;
    op.dst_offset = off;
  }
  emit(b, op);
}

static void reduce_add(builder *b, const dp_plan *p, int dst, int src, size_t off,
                       size_t bytes) {
  if (dp__copy_adds(&p->cfg, dst, src)) return;
  dp_op op = grad_add_op(dst, DP_REGION_GRADS, off, DP_REGION_COMM, 0, bytes);
  if (dp__wire_bf16(&p->cfg, dst, src)) op.flags = DP_OPF_ROUND_BF16 | DP_OPF_SRC_BF16;
  emit(b, op);
}

/* The canonical tree continued across devices 0..n-1: at distance 1, 2, 4,
 * ... device r (r mod 2*dist == 0) adds device r + dist's sum (packed first
 * when it crosses in bf16, in a stage of its own). */
static void reduce_to_0(builder *b, const dp_plan *p, int n, size_t P) {
  for (int dist = 1; dist < n; dist *= 2) {
    for (int r = 0; r + dist < n; r += 2 * dist)
      if (dp__wire_bf16(&p->cfg, r, r + dist)) pack(b, p, r + dist, 0, P, 0);
    next_stage(b);
    for (int r = 0; r + dist < n; r += 2 * dist) {
      reduce_copy(b, p, r, r + dist, 0, P);
      reduce_add(b, p, r, r + dist, 0, P);
    }
    next_stage(b);
  }
}

/* The gradient check of every device's reduced segment. Each device applies
 * the whole update, but the replicas are identical (parameters, optimizer
 * state, and after the all-gather the gradients), so the update of a segment
 * is finite everywhere if it is on the segment's owner: one pass over the
 * parameters in all instead of one per device. In ascending order of the
 * segments, so that the first failure in the schedule names the first bad
 * element, as one whole check would. */
static void check_segments(builder *b, const dp_plan *p, int n, int levels) {
  /* the segments tile [0, P); with fewer parameters than devices some are
   * empty, and those check nothing */
  for (size_t at = 0; at < p->model.n_params;) {
    int owner = -1;
    size_t next = at;
    for (int r = 0; r < n && owner < 0; r++) {
      size_t lo, hi;
      dp__ar_segment(p->model.n_params, levels, r, &lo, &hi);
      if (lo == at && hi > lo) owner = r, next = hi;
    }
    if (owner < 0) { /* cannot happen: the segments tile [0, P) */
      if (!b->err) b->err = DP_FAIL(DP_ERR_INVALID, "schedule: no segment at %zu", at);
      return;
    }
    dp_op chk = device_op(DP_PHASE_OPTIMIZER, DP_OP_GRAD_CHECK, owner, (next - at) * 4);
    chk.src_region = DP_REGION_GRADS;
    chk.src_offset = at * 4;
    emit(b, chk);
    at = next;
  }
}

/* Whether allreduce mode checks the reduced segments (check_segments) rather
 * than every device its whole gradient: not when the gradient changes after
 * the reduction (accumulated partial sums, clipping). */
static bool checks_segments(const dp_plan *p, int n) {
  return p->cfg.mode != DP_MODE_CLASSIC && !p->cfg.shard_optimizer &&
         !(p->features & DP_FEATURE_COLLECTIVE) && dp__is_pow2(n) &&
         dp__accumulate(&p->cfg) <= 1 && !(p->cfg.clip_grad_norm > 0) &&
         !(p->cfg.clip_grad_value > 0);
}

/* Every updating device checks its range, in ascending order of the ranges
 * (a sharded optimizer's are not in device order), so that the first failure
 * in the schedule names the first bad element. */
static void check_ranges(builder *b, const dp_plan *p, int n_opt) {
  int order[DP_MAX_DEVICES]; /* the devices by the start of their range */
  for (int k = 0; k < n_opt; k++) {
    int j = k;
    for (; j > 0 && p->opt_off[order[j - 1]] > p->opt_off[k]; j--) order[j] = order[j - 1];
    order[j] = k;
  }
  for (int k = 0; k < n_opt; k++) {
    int d = order[k];
    dp_op chk = device_op(DP_PHASE_OPTIMIZER, DP_OP_GRAD_CHECK, d, p->opt_len[d] * 4);
    chk.src_region = DP_REGION_GRADS;
    chk.src_offset = p->opt_off[d] * 4;
    emit(b, chk);
  }
}

/* Reduce-scatter by recursive halving (distance 1 first, so the first sums
 * are of neighbouring blocks: the canonical tree's lower levels), then, unless
 * the optimizer is sharded, all-gather by recursive doubling, with the
 * segments' checks (checks_segments) in its last stage. n is a power of
 * two. */
static void allreduce_halving(builder *b, const dp_plan *p, int n) {
  size_t P = p->model.n_params;
  int levels = 0;
  while ((1 << levels) < n) levels++;
  for (int l = 0; l < levels; l++) {
    for (int r = 0; r < n; r++) { /* what partner q sends r in bf16, packed on q */
      size_t lo, hi;
      int q = r ^ (1 << l);
      dp__ar_segment(P, l + 1, r, &lo, &hi);
      if (dp__wire_bf16(&p->cfg, r, q)) pack(b, p, q, lo * 4, (hi - lo) * 4, 0);
    }
    next_stage(b);
    /* the level's copies first, then its adds: on each device's thread the two
     * directions of an exchange are adjacent (its own copy and its partner's),
     * so a two-sided transport can issue them together (NCCL: one group, both
     * directions at once) before the add that needs them */
    for (int r = 0; r < n; r++) {
      size_t lo, hi;
      dp__ar_segment(P, l + 1, r, &lo, &hi); /* the half r keeps */
      reduce_copy(b, p, r, r ^ (1 << l), lo * 4, (hi - lo) * 4);
    }
    for (int r = 0; r < n; r++) {
      size_t lo, hi;
      dp__ar_segment(P, l + 1, r, &lo, &hi);
      reduce_add(b, p, r, r ^ (1 << l), lo * 4, (hi - lo) * 4);
    }
    next_stage(b);
  }
  if (p->cfg.shard_optimizer) return;
  for (int l = levels - 1; l >= 0; l--) {
    for (int r = 0; r < n; r++) {
      size_t lo, hi;
      int q = r ^ (1 << l);
      dp__ar_segment(P, l + 1, q, &lo, &hi); /* what the partner holds */
      if (dp__wire_bf16(&p->cfg, r, q)) pack(b, p, q, lo * 4, (hi - lo) * 4, 0);
    }
    next_stage(b);
    for (int r = 0; r < n; r++) {
      size_t lo, hi;
      int q = r ^ (1 << l);
      dp__ar_segment(P, l + 1, q, &lo, &hi);
      emit(b, dp__wire_bf16(&p->cfg, r, q)
                  ? wire_copy(p, r, q, 0, (hi - lo) * 4)
                  : copy_op(DP_PHASE_REDUCE, r, FROM(q, DP_REGION_GRADS, lo * 4),
                            TO(r, DP_REGION_GRADS, lo * 4), (hi - lo) * 4, 0, 0));
    }
    for (int r = 0; r < n; r++) {
      size_t lo, hi;
      int q = r ^ (1 << l);
      dp__ar_segment(P, l + 1, q, &lo, &hi);
      if (dp__wire_bf16(&p->cfg, r, q)) unpack(b, r, lo * 4, (hi - lo) * 4);
    }
    /* the last level's copies write the half of the gradient a device's own
     * segment is not in: its check can share their stage */
    if (l == 0 && checks_segments(p, n)) check_segments(b, p, n, levels);
    next_stage(b);
  }
  if (levels == 0 && checks_segments(p, n)) {
    check_segments(b, p, n, levels);
    next_stage(b);
  }
}

/* Allreduce mode with a device count not a power of two, after the tree to
 * device 0: every device takes its range of the sum (bf16 ones from a pack of
 * the whole gradient on device 0). */
static void ranges_from_0(builder *b, const dp_plan *p, int n, size_t P) {
  bool wire = false;
  for (int d = 1; d < n; d++) wire |= dp__wire_bf16(&p->cfg, d, 0);
  if (wire) pack(b, p, 0, 0, P, 0);
  next_stage(b);
  for (int d = 1; d < n; d++) {
    size_t off = p->opt_off[d] * 4, bytes = p->opt_len[d] * 4;
    emit(b, dp__wire_bf16(&p->cfg, d, 0)
                ? wire_copy(p, d, 0, off / 2, bytes)
                : copy_op(DP_PHASE_REDUCE, d, FROM(0, DP_REGION_GRADS, off),
                          TO(d, DP_REGION_GRADS, off), bytes, 0, 0));
    if (dp__wire_bf16(&p->cfg, d, 0)) unpack(b, d, off, bytes);
  }
  next_stage(b);
}

/* Sharded optimizer: every device updated its shard; gather the parameters. */
static void allgather_params(builder *b, const dp_plan *p, int n) {
  if (dp__is_pow2(n)) {
    int levels = 0;
    while ((1 << levels) < n) levels++;
    for (int l = levels - 1; l >= 0; l--) {
      for (int r = 0; r < n; r++) {
        size_t lo, hi;
        dp__ar_segment(p->model.n_params, l + 1, r ^ (1 << l), &lo, &hi);
        emit(b, copy_op(DP_PHASE_OPTIMIZER, r, FROM(r ^ (1 << l), DP_REGION_PARAMS, lo * 4),
                        TO(r, DP_REGION_PARAMS, lo * 4), (hi - lo) * 4, 0, 0));
      }
      next_stage(b);
    }
    return;
  }
  for (int r = 0; r < n; r++)
    for (int q = 0; q < n; q++)
      if (q != r)
        emit(b,
             copy_op(DP_PHASE_OPTIMIZER, r, FROM(q, DP_REGION_PARAMS, p->opt_off[q] * 4),
                     TO(r, DP_REGION_PARAMS, p->opt_off[q] * 4), p->opt_len[q] * 4, 0, 0));
  next_stage(b);
}

/* config.accumulate: an op on device d's updating range of GRADS and its
 * partial sums in OPT_STATE (after the optimizer's state vectors). */
static dp_op accum_op(const dp_plan *p, dp_op_kind kind, int d) {
  dp_op op = device_op(DP_PHASE_OPTIMIZER, kind, d, p->opt_len[d] * 4);
  op.dst_region = DP_REGION_GRADS;
  op.dst_offset = p->opt_off[d] * 4;
  op.src_region = DP_REGION_OPT_STATE;
  op.src_offset = (size_t)dp__cfg_state_vectors(&p->cfg) * p->opt_len[d] * 4;
  if (kind == DP_OP_GRAD_ACCUM) op.flags = sum_flags(p);
  return op;
}

/* config.clip_grad_norm, after the reduction: every device that updates a
 * range sums its squares (exactly, by exponent) into its slot of the comm
 * region; with a sharded optimizer the slots are exchanged so that every
 * device holds all of them; then every device takes the norm from the slots
 * and scales its range. The sums are exact, so the norm does not depend on
 * how the ranges are cut. */
static void clip_ops(builder *b, const dp_plan *p, int n_opt) {
  bool sharded = p->cfg.mode != DP_MODE_CLASSIC && p->cfg.shard_optimizer;
  int slots = sharded ? n_opt : 1;
  for (int d = 0; d < n_opt; d++) {
    dp_op nm = device_op(DP_PHASE_OPTIMIZER, DP_OP_GRAD_NORM, d, p->opt_len[d] * 4);
    nm.src_region = DP_REGION_GRADS;
    nm.src_offset = p->opt_off[d] * 4;
    nm.dst_region = DP_REGION_COMM;
    nm.dst_offset = (size_t)(sharded ? d : 0) * DP_NORM_BINS_BYTES;
    emit(b, nm);
  }
  next_stage(b);
  if (slots > 1) {
    for (int r = 0; r < n_opt; r++)
      for (int q = 0; q < n_opt; q++)
        if (q != r)
          emit(b, copy_op(DP_PHASE_OPTIMIZER, r,
                          FROM(q, DP_REGION_COMM, (size_t)q * DP_NORM_BINS_BYTES),
                          TO(r, DP_REGION_COMM, (size_t)q * DP_NORM_BINS_BYTES),
                          DP_NORM_BINS_BYTES, 0, 0));
    next_stage(b);
  }
  for (int d = 0; d < n_opt; d++) {
    dp_op cl = device_op(DP_PHASE_OPTIMIZER, DP_OP_GRAD_CLIP, d, p->opt_len[d] * 4);
    cl.src_region = DP_REGION_COMM;
    cl.n_mb = slots;
    cl.dst_region = DP_REGION_GRADS;
    cl.dst_offset = p->opt_off[d] * 4;
    emit(b, cl);
  }
  next_stage(b);
}

/* config.clip_grad_value, after the reduction (and accumulate's sum): every
 * device that updates clamps the gradients of its range, elementwise, so the
 * bits do not depend on how the ranges are cut. */
static void clamp_ops(builder *b, const dp_plan *p, int n_opt) {
  for (int d = 0; d < n_opt; d++) {
    dp_op cl = device_op(DP_PHASE_OPTIMIZER, DP_OP_GRAD_CLAMP, d, p->opt_len[d] * 4);
    cl.src_region = cl.dst_region = DP_REGION_GRADS;
    cl.src_offset = cl.dst_offset = p->opt_off[d] * 4;
    emit(b, cl);
  }
  next_stage(b);
}

void dp__ar_segment(size_t n, int levels, int r, size_t *lo, size_t *hi) {
  *lo = 0;
  *hi = n;
  for (int l = 0; l < levels; l++) {
    size_t mid = *lo + (*hi - *lo) / 2;
    if (r & (1 << l))
      *lo = mid;
    else
      *hi = mid;
  }
}

/* batchnorm's running statistics, in the commit phase: device 0's, from
 * micro-batch 0 (sync: from the whole batch's; the replicas get them with
 * the next broadcast). */
static void bn_updates(builder *b, const dp_plan *p) {
  const dp_model *m = &p->model;
  for (int i = 0; i < m->n_layers; i++)
    if (m->layers[i].kind == DP_LAYER_BATCHNORM) {
      const dp_layer *l = &m->layers[i];
      dp_op bn =
          device_op(DP_PHASE_OPTIMIZER, DP_OP_BN_UPDATE, 0, dp__bn_buffers(l->c) * 4);
      bn.layer = (int16_t)i;
      bn.micro_batch = 0;
      bn.dst_region = DP_REGION_PARAMS;
      bn.dst_offset = (m->n_params + l->buf_off) * 4;
      emit(b, bn);
    }
}

int dp__schedule_cap(const dp_plan *p) {
  int n = 0, st = 0;
  dp__schedule_build(p, p->mbs, p->cfg.inference ? DP_SCHED_INFER : DP_SCHED_TRAIN, NULL, 0,
                     &n, &st);
  return n > 0 ? n : 1;
}

/* ---- the step, phase by phase ---- */

/* What a step's schedule is built from: the plan, the step's micro-batches
 * (a prefix of the planned ones has rows), and what follows from them. */
typedef struct {
  builder *b;
  const dp_plan *p;
  const dp_mb *mbs;
  bool training, classic;
  int n_act;          /* devices with rows (a prefix) */
  int rows, n_mb;     /* the step's rows, its non-empty micro-batches */
  size_t tw;          /* target bytes per row */
  int drows[DP_MAX_DEVICES], dlast[DP_MAX_DEVICES]; /* rows, end of non-empty mbs */
} step_view;

static step_view step_view_of(builder *b, const dp_plan *p, const dp_mb *mbs, int kind) {
  const dp_split_info *sp = &p->split;
  step_view v = {.b = b, .p = p, .mbs = mbs, .training = kind != DP_SCHED_INFER,
                 .classic = p->cfg.mode == DP_MODE_CLASSIC};
  for (int d = 0; d < sp->n_used; d++) {
    v.drows[d] = 0;
    v.dlast[d] = sp->dev_mb0[d];
    for (int k = sp->dev_mb0[d]; k < sp->dev_mb0[d + 1]; k++)
      if (mbs[k].rows > 0) {
        v.drows[d] += mbs[k].rows;
        v.dlast[d] = k + 1;
      }
    if (v.drows[d]) v.n_act = d + 1;
    v.rows += v.drows[d];
  }
  v.tw = (size_t)dp_model_target_width(&p->model) * 4;
  v.n_mb = v.n_act ? v.dlast[v.n_act - 1] : 0;
  return v;
}

/* The replicas' parameters, then every device's inputs (and targets). */
static void broadcast_and_scatter(const step_view *v) {
  builder *b = v->b;
  const dp_plan *p = v->p;
  const dp_split_info *sp = &p->split;
  int in = p->model.input_width;
  size_t tw = v->tw;
  /* Allreduce keeps every replica current; it broadcasts only after the
   * parameters were set from outside (the executor skips it otherwise). */
  int n_bcast = v->classic || !v->training ? v->n_act : sp->n_used;
  for (int d = 1; d < n_bcast; d++) /* the parameters and the buffers after them */
    if (dp__param_home(p, d) == d)  /* shared: to each rank's first device only */
      emit(b, copy_op(DP_PHASE_BROADCAST, d, FROM(0, DP_REGION_PARAMS, 0),
                      TO(d, DP_REGION_PARAMS, 0), dp__param_floats(&p->model) * 4, 0, 0));
  next_stage(b);
  for (int d = 0; d < v->n_act; d++) {
    int r0 = sp->dev_row0[d];
    rows_copies(b, p, v->mbs,
                &(rows_copy){DP_PHASE_SCATTER, d, v->dlast[d], in, true,
                             FROM(DP_HOST, DP_REGION_INPUTS, (size_t)r0 * in * 4),
                             TO(d, DP_REGION_INPUTS, 0)});
    if (v->training && !v->classic)
      emit(b, copy_op(DP_PHASE_SCATTER, d, FROM(DP_HOST, DP_REGION_TARGETS, (size_t)r0 * tw),
                      TO(d, DP_REGION_TARGETS, 0), (size_t)v->drows[d] * tw, r0,
                      v->drows[d]));
  }
  if (v->training && v->classic) {
    /* Every target to device 0, from the host of the rank that holds its rows
     * (each rank is fed its own rows; one process: one copy), pushed by that
     * rank's first device. */
    int L = p->cfg.n_devices / dp__ranks(&p->cfg);
    for (int d0 = 0; d0 < v->n_act; d0 += L) {
      int nr = 0;
      for (int d = d0; d < d0 + L && d < v->n_act; d++) nr += v->drows[d];
      int r0 = sp->dev_row0[d0];
      emit(b, copy_op(DP_PHASE_SCATTER, d0, FROM(DP_HOST, DP_REGION_TARGETS, (size_t)r0 * tw),
                      TO(0, DP_REGION_TARGETS, (size_t)r0 * tw), (size_t)nr * tw, r0, nr));
    }
  }
  next_stage(b);
}

/* The forward, layer by layer on each device; a sync batchnorm (training)
 * splits it: each micro-batch's statistics, merged in the canonical tree
 * over the micro-batches and then the devices, and device 0's result for
 * the whole batch sent to every device before the layer runs. */
static void forward(const step_view *v) {
  builder *b = v->b;
  const dp_plan *p = v->p;
  const dp_model *m = &p->model;
  const dp_split_info *sp = &p->split;
  int L = m->n_layers;
  for (int i0 = 0, i1 = 0; i1 <= L; i1++) {
    if (i1 < L && !(v->training && dp__bn_sync(p, i1))) continue;
    for (int d = 0; d < v->n_act; d++) {
      /* segment by segment (config.recompute; else layer by layer), each
       * micro-batch through the segment's layers before the next: what the
       * segment does not keep holds one micro-batch */
      for (int s0 = i0, s1; s0 < i1; s0 = s1 + 1) {
        s1 = p->seg_hi[s0] < i1 ? p->seg_hi[s0] : i1 - 1;
        for (int k = sp->dev_mb0[d]; k < v->dlast[d]; k++)
          for (int i = s0; i <= s1; i++)
            emit(b, layer_op(DP_PHASE_FORWARD, DP_OP_FORWARD, d, i, k, v->mbs,
                             (size_t)v->mbs[k].rows * m->layers[i].out * 4));
      }
      if (i1 == L) continue;
      int c = m->layers[i1].c;
      for (int k = sp->dev_mb0[d]; k < v->dlast[d]; k++) {
        dp_op st = layer_op(DP_PHASE_FORWARD, DP_OP_BN_STATS, d, i1, k, v->mbs,
                            dp__bn_sync_part(c) * 4);
        st.dst_region = DP_REGION_ACTIVATIONS;
        st.dst_offset = bn_at(p, d, i1, dp__bn_sync_fwd(c, k - sp->dev_mb0[d]));
        emit(b, st);
      }
      bn_merge_tree(b, p, v->mbs, d, i1, sp->dev_mb0[d], sp->dev_mb0[d], sp->dev_mb0[d + 1]);
    }
    next_stage(b);
    if (i1 == L) break;
    int c = m->layers[i1].c;
    if (v->n_act > 1)
      bn_tree_to_0(b, p, v->n_act, i1, DP_PHASE_FORWARD, DP_OP_BN_MERGE,
                   dp__bn_sync_fwd(c, 0), dp__bn_sync_recv(c), dp__bn_sync_part(c));
    emit(b, bn_op(DP_PHASE_FORWARD, DP_OP_BN_FINAL, 0, i1, bn_at(p, 0, i1, 0),
                  bn_at(p, 0, i1, dp__bn_sync_fwd(c, 0)), dp__bn_sync_final(c) * 4));
    next_stage(b);
    if (v->n_act > 1) bn_bcast(b, p, v->n_act, i1, DP_PHASE_FORWARD, 0, dp__bn_sync_final(c));
    i0 = i1;
  }
}

/* The outputs gathered (classic training, inference), then the loss and the
 * output gradients back on the devices (training). */
static void gather_and_loss(const step_view *v) {
  builder *b = v->b;
  const dp_plan *p = v->p;
  const dp_mb *mbs = v->mbs;
  const dp_split_info *sp = &p->split;
  int out = dp_model_output_width(&p->model);
  if (!v->training || v->classic) {
    /* Each device pushes its chunk: the gather runs in parallel. */
    for (int d = 0; d < v->n_act; d++) {
      size_t at = (size_t)sp->dev_row0[d] * out * 4;
      /* training: to device 0's gathered outputs; inference: to the host's */
      to_end to = v->training ? TO(0, DP_REGION_GATHERED_OUTPUTS, at)
                              : TO(DP_HOST, DP_REGION_OUTPUTS, at);
      rows_copies(b, p, mbs,
                  &(rows_copy){DP_PHASE_GATHER, d, v->dlast[d], out, false,
                               FROM(d, DP_REGION_OUTPUTS, 0), to});
    }
    next_stage(b);
  }
  if (!v->training) return;
  if (v->classic) {
    emit(b, loss_op(0, 0, v->n_mb, 0, v->rows, out));
    emit(b, loss_sum_op(sp->n_mb, v->rows));
    next_stage(b);
    for (int d = 0; d < v->n_act; d++)
      rows_copies(b, p, mbs,
                  &(rows_copy){DP_PHASE_SCATTER_GRADS, d, v->dlast[d], out, true,
                               FROM(0, DP_REGION_GATHERED_GRADS,
                                    (size_t)sp->dev_row0[d] * out * 4),
                               TO(d, DP_REGION_OUTPUT_GRADS, 0)});
    next_stage(b);
    return;
  }
  /* Each device: its own loss terms and output gradients; device 0 collects
   * the per-micro-batch sums. */
  for (int d = 0; d < v->n_act; d++)
    for (int k = sp->dev_mb0[d], j; k < v->dlast[d]; k = j) {
      j = slice_run_end(p, mbs, k, v->dlast[d], out);
      emit(b, loss_op(d, k, j, mbs[k].row0, run_rows(mbs, k, j), out));
    }
  next_stage(b);
  for (int d = 1; d < v->n_act; d++)
    emit(b, copy_op(DP_PHASE_LOSS, d, FROM(d, DP_REGION_LOSS, 0),
                    TO(0, DP_REGION_LOSS, (size_t)sp->dev_mb0[d] * 4),
                    (size_t)(v->dlast[d] - sp->dev_mb0[d]) * 4, 0, 0));
  next_stage(b);
  emit(b, loss_sum_op(sp->n_mb, v->rows));
  next_stage(b);
}

/* The backward in segments, from the top: each ends at a sync batchnorm,
 * whose sums over the whole batch the layers below it wait for (each
 * device's sums are its gradients of the batchnorm's weight and bias). */
static void backward(const step_view *v) {
  builder *b = v->b;
  const dp_plan *p = v->p;
  const dp_model *m = &p->model;
  const dp_split_info *sp = &p->split;
  size_t P = m->n_params * 4;
  bwd_seg sg = {.top = m->n_layers - 1, .p1 = P};
  for (bool first = true;; first = false) {
    sg.bot = -1;
    for (int i = first ? sg.top : sg.top - 1; i >= 0 && sg.bot < 0; i--)
      if (dp__bn_sync(p, i)) sg.bot = i;
    sg.p0 = sg.bot >= 0 ? m->layers[sg.bot].param_off * 4 : 0;
    for (int d = 0; d < v->n_act; d++) {
      backward_tree(b, p, v->mbs, d, sp->dev_mb0[d], sp->dev_mb0[d + 1], 0, &sg);
      if (sg.bot >= 0)
        emit(b, copy_op(DP_PHASE_BACKWARD, d, FROM(d, DP_REGION_GRADS, sg.p0),
                        TO(d, DP_REGION_ACTIVATIONS,
                           bn_at(p, d, sg.bot, dp__bn_sync_bwd(m->layers[sg.bot].c))),
                        m->layers[sg.bot].n_params * 4, 0, 0));
    }
    if (sg.bot < 0) break;
    next_stage(b);
    int c = m->layers[sg.bot].c;
    if (v->n_act > 1) {
      bn_tree_to_0(b, p, v->n_act, sg.bot, DP_PHASE_BACKWARD, DP_OP_GRAD_ADD,
                   dp__bn_sync_bwd(c), dp__bn_sync_bwd(c) + 2 * (size_t)c, 2 * (size_t)c);
      next_stage(b);
      bn_bcast(b, p, v->n_act, sg.bot, DP_PHASE_BACKWARD, dp__bn_sync_bwd(c), 2 * (size_t)c);
    }
    sg = (bwd_seg){.top = sg.bot, .p1 = sg.p0};
  }
  if (!v->classic) /* devices without rows add -0.0, which leaves every sum as it is */
    for (int d = v->n_act; d < sp->n_used; d++) {
      dp_op z = device_op(DP_PHASE_BACKWARD, DP_OP_ZERO, d, P);
      z.dst_region = DP_REGION_GRADS;
      emit(b, z);
    }
  next_stage(b);
}

/* The gradients summed (the canonical tree continued across devices), then
 * accumulated, clipped, checked and applied; a call that only accumulates
 * stops after keeping its sum. */
static void reduce_and_update(const step_view *v, int kind) {
  builder *b = v->b;
  const dp_plan *p = v->p;
  const dp_split_info *sp = &p->split;
  size_t P = p->model.n_params * 4;
  if (v->classic) {
    reduce_to_0(b, p, v->n_act, P);
  } else if (p->features & DP_FEATURE_COLLECTIVE) {
    if (sp->n_used > 1) {
      for (int d = 0; d < sp->n_used; d++) {
        dp_op ar = device_op(DP_PHASE_REDUCE, DP_OP_ALLREDUCE, d, P);
        ar.src_region = ar.dst_region = DP_REGION_GRADS;
        emit(b, ar);
      }
      next_stage(b);
    }
  } else if (dp__is_pow2(sp->n_used)) {
    allreduce_halving(b, p, sp->n_used);
  } else {
    /* No halving for other counts: the classic tree to device 0, then
     * every device takes what it updates. */
    reduce_to_0(b, p, sp->n_used, P);
    ranges_from_0(b, p, sp->n_used, P);
  }
  int n_opt = v->classic ? 1 : sp->n_used;
  if (dp__accumulate(&p->cfg) > 1) {
    /* the earlier calls' partial sums added to this call's gradient */
    for (int d = 0; d < n_opt; d++) emit(b, accum_op(p, DP_OP_GRAD_ACCUM, d));
    next_stage(b);
    if (kind == DP_SCHED_ACCUM) { /* no update: keep the sum for the next call */
      for (int d = 0; d < n_opt; d++) emit(b, accum_op(p, DP_OP_GRAD_STASH, d));
      bn_updates(b, p); /* every training forward moves them, as in PyTorch */
      next_stage(b);
      return;
    }
  }
  if (p->cfg.clip_grad_norm > 0) clip_ops(b, p, n_opt);
  if (p->cfg.clip_grad_value > 0) clamp_ops(b, p, n_opt);
  /* Every device checks what it will apply before any device applies it
   * (allreduce: the owner of each reduced segment checked it already) */
  if (!checks_segments(p, sp->n_used)) check_ranges(b, p, n_opt);
  next_stage(b);
  for (int d = 0; d < n_opt; d++) {
    dp_op upd = device_op(DP_PHASE_OPTIMIZER, DP_OP_OPTIMIZER, d, p->opt_len[d] * 4);
    upd.dst_region = DP_REGION_PARAMS;
    upd.dst_offset = p->opt_off[d] * 4;
    emit(b, upd);
  }
  bn_updates(b, p);
  next_stage(b);
  if (!v->classic && p->cfg.shard_optimizer) allgather_params(b, p, sp->n_used);
}

dp_status dp__schedule_build(const dp_plan *p, const dp_mb *mbs, int kind, dp_op *ops,
                             int cap, int *n_ops, int *n_stages) {
  builder b = {.ops = ops, .cap = cap};
  step_view v = step_view_of(&b, p, mbs, kind);
  broadcast_and_scatter(&v);
  forward(&v);
  gather_and_loss(&v);
  if (v.training) {
    backward(&v);
    reduce_and_update(&v, kind);
  }
  *n_ops = b.n;
  *n_stages = b.stage;
  return b.err;
}

static const char *const phase_names[DP_PHASE_COUNT] = {
    "broadcast",     "scatter",  "forward", "gather",   "loss",
    "scatter_grads", "backward", "reduce",  "optimizer"};

const char *dp_phase_name(dp_phase ph) {
  return (unsigned)ph < DP_PHASE_COUNT ? phase_names[ph] : "?";
}

const char *dp_op_kind_name(dp_op_kind k) {
  static const char *const names[] = {
      "copy",         "forward",    "backward",  "grad_add",    "zero",      "loss",
      "loss_sum",     "grad_check", "optimizer", "allreduce",   "grad_norm", "grad_clip",
      "grad_accum",   "grad_stash", "bn_update", "bn_stats",    "bn_merge",  "bn_final",
      "bn_bwd_stats", "copy_add",   "grad_pack", "grad_unpack", "grad_clamp"};
  return (unsigned)k < sizeof names / sizeof *names ? names[k] : "?";
}
