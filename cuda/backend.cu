/* The CUDA backend and transport: the vtables the executor calls
 * (lib/core/backend.h), the per-device state, the stage hooks and the step's one
 * host synchronisation. docs/GPU.md describes the design; dp_cuda.h the
 * calls and their order.
 *
 * Ordering model. Each logical device d has one stream; its ops and the
 * copies its thread issues run on it in list order, as the executor issues
 * them. The executor's barrier orders stages on the host only, so the device
 * side is ordered with events: at the end of stage s every device records
 * ev[s & 1] on its stream (dp__cuda_stage_end). A device's stream waits, at
 * the start of stage s (dp__cuda_stage_begin), for every device whose stream
 * touched (read or wrote) its arena in stage s - 1, and a copy in stage s
 * waits for stage s - 1 of the other endpoint's device before it reads or
 * writes there. That is exactly the happens-before the CPU's barrier gives,
 * edge for edge, without waiting on devices that share nothing. Two events
 * per device suffice: ev[(s - 1) & 1] is re-recorded only at the end of stage
 * s + 1, after the barrier that ends stage s, by which time every wait on it
 * has been enqueued (a wait binds to the record that precedes it).
 *
 * NCCL pairs (DP_CUDA_NCCL: a copy between the arenas of two logical devices,
 * one GPU each). The executing device's thread calls copy(), the other
 * endpoint's thread peer(), in the same stage and both in list order; the
 * side that owns src enqueues ncclSend on its own stream, the side that owns
 * dst ncclRecv on its own. Such a pair needs no cross-device event wait and
 * no touched mark: each side reads or writes only its own arena, on its own
 * stream, so stream order already puts its part after what the device did
 * to that buffer in earlier stages and before what it does later; and NCCL's
 * completion semantics (a send is complete on its stream once src may be
 * reused, a receive once dst holds the data) carry the data across. The
 * barrier-equivalent edges the events give one-sided copies come here from
 * the rendezvous itself. (The optimizer's status-word copies stay one-sided
 * peer copies, ordered by events as before.)
 * Deadlock freedom: every device issues its NCCL operations, like everything
 * else, in the global list order, and the two sides of a pair issue it at the
 * same list position. An operation waits only for its own stream's earlier
 * work, for stage events of earlier stages, and for its partner to reach the
 * same list position; by induction over list positions every one completes.
 * No stage is wrapped in ncclGroupStart/End: kernels are not deferred by a
 * group, so a receive followed by an add of its data in the same stage (the
 * reduce stages) would be reordered. Since a one-sided failure would leave a
 * partner waiting forever, dp__cuda_step_end checks, before waiting on any
 * stream, that every send has its receive, and aborts the communicators when
 * not. */
#include "backend.cuh"
#include "layer.cuh"
#include "core/operands.h"
#include "batchnorm.cuh"
#include "conv.cuh"
#include "sequence.cuh"
#include "util/expf.h" /* dp__lanes_total: the class weights' sum as the cpu's */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

thread_local cuda_ctx *dp__cuda_tl_ctx = nullptr;
thread_local int dp__cuda_tl_dev = -1;

static float *reg(const dp_exec_env *e, int d, int r, size_t off) {
  return (float *)((unsigned char *)dp__region_ptr(e, d, r) + off);
}

/* batchnorm: its statistics area on the device, from float `at` (per_replica:
 * micro-batch mb's at mb * dp__bn_stats(c); sync: the whole batch's at 0, then
 * the backward sums at dp__bn_sync_bwd(c)). */
static float *bn_area(const lay &c, size_t at) { return ptr(c, c.o.bn_area) + at; }

/* batchnorm's buffers on the device: running_mean (c), running_var (c), the count. */
static float *bn_buffers(const lay &c) { return ptr(c, c.o.bn_buffers); }

static int bn_positions(const dp_layer *l) { return l->h ? l->h * l->w : 1; }

/* conv2d's COL and T, or the attention backward's scratch: the WORKSPACE region
 * after the header and cuBLAS's part. */
static void *conv_ws(const lay &c, size_t *bytes) {
  size_t all = c.o.workspace.bytes;
  *bytes = all > DP_CUDA_CONV_WS_OFFSET ? all - DP_CUDA_CONV_WS_OFFSET : 0;
  return (unsigned char *)ptr(c, c.o.workspace) + DP_CUDA_CONV_WS_OFFSET;
}

/* Attention dropout's keys for this op, the dropout layer's (training with
 * p > 0; NULL otherwise). */
static const dp_cuda_attn_drop *attn_drop(const dev_ctx *x, const lay &c, int global_row0,
                                          dp_cuda_attn_drop *d) {
  if (!c.e->training || !(c.l->p > 0.0f)) return NULL;
  *d = dp_cuda_attn_drop{c.p->cfg.seed, (uint64_t)c.i, (uint64_t)global_row0, x->hdr};
  return d;
}

dp_status dp__cuda_forward(dev_ctx *x, const lay &c, int global_row0) {
  const dp_layer *l = c.l;
  if (dp__layer_is_view(&c.p->model, c.i)) return DP_OK; /* flatten: nothing moves */
  const float *in = layer_in(c);
  float *y = layer_out(c);
  int n = c.rows;
  size_t count = (size_t)n * l->out;
  /* a linear or layernorm on a sequence: every position a row, the widths per
   * position (lib/cpu/backend.c's forward) */
  int rows = n * dp__positions(l), pin = dp__pos_in(l), pout = dp__pos_out(l);
  switch (l->kind) {
  case DP_LAYER_LINEAR: {
    const float *w = layer_params(c); /* (out, in) per position */
    const float *b = l->bias ? w + (size_t)pout * pin : NULL;
    bool relu = dp__relu_fused(c.p, c.i + 1);
    if (relu) /* the relu after it: in the bias kernel, into the relu's output */
      y = layer_out(at_layer(c, c.i + 1));
    return dp__cuda_linear_forward(x->blas, x->stream, rows, pin, pout, in, w, b, relu, y);
  }
  case DP_LAYER_RELU:
    if (dp__relu_fused(c.p, c.i)) return DP_OK; /* done by the linear before it */
    DP_CUDA_CHECK(dp_k_act_forward(x->stream, l->kind, in, y, count, 0.0f));
    return DP_OK;
  case DP_LAYER_TANH:
  case DP_LAYER_SIGMOID:
  case DP_LAYER_GELU:
  case DP_LAYER_GELU_ERF:
  case DP_LAYER_SILU:
  case DP_LAYER_LEAKY_RELU:
    DP_CUDA_CHECK(dp_k_act_forward(x->stream, l->kind, in, y, count, l->slope));
    return DP_OK;
  case DP_LAYER_LAYERNORM: {
    const float *g = layer_params(c);
    DP_CUDA_CHECK(dp_k_layernorm_forward(x->stream, in, g, g + pout, y, layer_stats(c),
                                         rows, pout, l->eps));
    return DP_OK;
  }
  case DP_LAYER_DROPOUT:
    if (!c.e->training || l->p == 0.0f) {
      DP_CUDA_CHECK(cudaMemcpyAsync(y, in, count * 4, cudaMemcpyDeviceToDevice, x->stream));
      return DP_OK;
    }
    /* key (seed, DP_RNG_DROPOUT, (step << 16) | layer, global row, element);
     * the kernel reads the step from the header */
    DP_CUDA_CHECK(dp_k_dropout(x->stream, in, y, n, l->out, c.p->cfg.seed, x->hdr,
                               (uint64_t)c.i, (uint64_t)global_row0, l->p,
                               1.0f / (1.0f - l->p)));
    return DP_OK;
  case DP_LAYER_CONV2D: {
    size_t wsb;
    void *ws = conv_ws(c, &wsb);
    dp_status s =
        dp__cuda_conv_forward(x->blas, x->stream, l, n, in, layer_params(c), y, ws, wsb);
    return s == DP_OK ? s : DP_FAIL(s, "layer %d: %s", c.i, dp_last_error());
  }
  case DP_LAYER_MAXPOOL2D:
  case DP_LAYER_AVGPOOL2D:
    DP_CUDA_CHECK(dp_k_pool_forward(x->stream, l, n, in, y));
    return DP_OK;
  case DP_LAYER_FLATTEN: /* a view, but the last layer's output is OUTPUTS: a copy */
    if (count)
      DP_CUDA_CHECK(cudaMemcpyAsync(y, in, count * 4, cudaMemcpyDeviceToDevice, x->stream));
    return DP_OK;
  case DP_LAYER_BATCHNORM: { /* cuda/batchnorm.cu */
    const float *g = layer_params(c);
    int C = l->c, S = bn_positions(l), nb = dp__bn_rows(l, n);
    if (!c.e->training) /* eval: the running statistics */
      DP_CUDA_CHECK(dp_k_bn_apply(x->stream, in, g, g + C, y, bn_buffers(c), NULL,
                                  bn_buffers(c) + C, nb, C, S, l->eps));
    else if (dp__bn_sync(c.p, c.i)) /* the whole batch's, from DP_OP_BN_FINAL */
      DP_CUDA_CHECK(dp_k_bn_apply(x->stream, in, g, g + C, y, bn_area(c, 0),
                                  bn_area(c, (size_t)C), NULL, nb, C, S, l->eps));
    else /* the micro-batch's own, saved in its slot */
      DP_CUDA_CHECK(dp_k_bn_forward_train(x->stream, in, g, g + C, y,
                                          bn_area(c, (size_t)c.mb * dp__bn_stats(C)),
                                          dp_cuda_bn_scratch(x->hdr), nb, C, S, l->eps));
    return DP_OK;
  }
  case DP_LAYER_INPUT: return DP_OK;
  case DP_LAYER_EMBEDDING: /* cuda/sequence.cu */
    DP_CUDA_CHECK(dp_k_embed_forward(x->stream, l, n, in, layer_params(c), y));
    return DP_OK;
  case DP_LAYER_ATTENTION: { /* the probabilities saved in the layer's stats */
    dp_cuda_attn_drop keys;
    const dp_cuda_attn_drop *drop = attn_drop(x, c, global_row0, &keys);
    size_t wsb = 0;
    void *ws = drop ? conv_ws(c, &wsb) : NULL; /* the kept probabilities */
    dp_status s = dp__cuda_attention_forward(x->blas, x->stream, l, n, in, layer_stats(c),
                                             y, drop, ws, wsb);
    return s == DP_OK ? s : DP_FAIL(s, "layer %d: %s", c.i, dp_last_error());
  }
  case DP_LAYER_RESIDUAL_END: /* x + f(x): the block's input (the skip operand), then f's */
    DP_CUDA_CHECK(dp_k_residual_add(x->stream, ptr(c, c.o.skip), in, y, count));
    return DP_OK;
  case DP_LAYER_RESIDUAL:
  case DP_LAYER_SHORTCUT: return DP_OK; /* views (above) */
  }
  return DP_FAIL(DP_ERR_BACKEND, "cuda backend: layer kind %d has no forward",
                 (int)l->kind);
}

/* Parameter gradients are written (not accumulated) at grads, a slot of the
 * canonical tree. */
dp_status dp__cuda_backward(dev_ctx *x, const lay &c, float *grads, int global_row0) {
  const dp_layer *l = c.l;
  if (l->kind == DP_LAYER_RESIDUAL) { /* dx (its input's gradient, in place) += dskip */
    float *dx = layer_din(c);
    const float *ds = ptr(c, c.o.skip);
    if (dx && ds) DP_CUDA_CHECK(dp_k_add(x->stream, dx, ds, (size_t)c.rows * l->out));
    return DP_OK;
  }
  if (dp__layer_is_view(&c.p->model, c.i)) return DP_OK;
  /* a relu before a linear: done by the linear's backward (dp__relu_bwd_fused) */
  if (dp__relu_bwd_fused(c.p, c.i)) return DP_OK;
  int n = c.rows;
  size_t count = (size_t)n * l->out;
  const float *dy = layer_dout(c);
  /* a linear after such a relu writes the relu's input gradient, masked */
  bool masked = c.i > 0 && dp__relu_bwd_fused(c.p, c.i - 1);
  float *dx = layer_din(masked ? at_layer(c, c.i - 1) : c); /* NULL: not needed */
  int rows = n * dp__positions(l), pin = dp__pos_in(l),
      pout = dp__pos_out(l); /* forward's */
  switch (l->kind) {
  case DP_LAYER_LINEAR: {
    float *dw = grads + l->param_off, *db = l->bias ? dw + (size_t)pout * pin : NULL;
    const float *xin = layer_in(c);
    return dp__cuda_linear_backward(x->blas, x->stream, rows, pin, pout, xin,
                                    layer_params(c), dy, dw, db, masked ? xin : NULL, dx);
  }
  case DP_LAYER_RELU:
  case DP_LAYER_TANH:
  case DP_LAYER_SIGMOID:
  case DP_LAYER_LEAKY_RELU: { /* a negative slope's sign is the input's */
    const float *xy = dp__layer_needs_input(l) ? layer_in(c) : layer_out(c);
    if (dx)
      DP_CUDA_CHECK(dp_k_act_backward(x->stream, l->kind, xy, dy, dx, count, l->slope));
    return DP_OK;
  }
  case DP_LAYER_GELU:
  case DP_LAYER_GELU_ERF:
  case DP_LAYER_SILU:
    if (dx)
      DP_CUDA_CHECK(
          dp_k_act_backward(x->stream, l->kind, layer_in(c), dy, dx, count, 0.0f));
    return DP_OK;
  case DP_LAYER_LAYERNORM: {
    float *dg = grads + l->param_off;
    DP_CUDA_CHECK(dp_k_layernorm_backward(x->stream, layer_in(c), layer_stats(c),
                                          layer_params(c), dy, dx, dg, dg + pout, rows,
                                          pout));
    return DP_OK;
  }
  case DP_LAYER_DROPOUT:
    if (!dx) return DP_OK;
    if (l->p == 0.0f) {
      DP_CUDA_CHECK(
          cudaMemcpyAsync(dx, dy, count * 4, cudaMemcpyDeviceToDevice, x->stream));
      return DP_OK;
    }
    DP_CUDA_CHECK(dp_k_dropout(x->stream, dy, dx, n, l->out, c.p->cfg.seed, x->hdr,
                               (uint64_t)c.i, (uint64_t)global_row0, l->p,
                               1.0f / (1.0f - l->p)));
    return DP_OK;
  case DP_LAYER_CONV2D: {
    float *dw = grads + l->param_off;
    float *db = l->bias ? dw + (l->n_params - (size_t)l->c) : NULL;
    size_t wsb;
    void *ws = conv_ws(c, &wsb);
    dp_status s = dp__cuda_conv_backward(x->blas, x->stream, l, n, layer_in(c),
                                         layer_params(c), dy, dw, db, dx, ws, wsb);
    return s == DP_OK ? s : DP_FAIL(s, "layer %d: %s", c.i, dp_last_error());
  }
  case DP_LAYER_MAXPOOL2D:
  case DP_LAYER_AVGPOOL2D:
    if (dx)
      DP_CUDA_CHECK(dp_k_pool_backward(
          x->stream, l, n, l->kind == DP_LAYER_MAXPOOL2D ? layer_in(c) : NULL, dy, dx));
    return DP_OK;
  case DP_LAYER_FLATTEN: /* a view; the last layer's gradient comes in OUTPUT_GRADS */
    if (dx && count)
      DP_CUDA_CHECK(
          cudaMemcpyAsync(dx, dy, count * 4, cudaMemcpyDeviceToDevice, x->stream));
    return DP_OK;
  case DP_LAYER_BATCHNORM: { /* cuda/batchnorm.cu */
    const float *g = layer_params(c);
    int C = l->c, S = bn_positions(l), nb = dp__bn_rows(l, n);
    if (dp__bn_sync(c.p, c.i)) /* dx only: DP_OP_BN_BWD_STATS wrote the gradients */
      DP_CUDA_CHECK(dp_k_bn_sync_dx(x->stream, layer_in(c), bn_area(c, 0),
                                    bn_area(c, dp__bn_sync_bwd(C)), g, dy, dx, nb, C, S));
    else
      DP_CUDA_CHECK(dp_k_bn_backward(x->stream, layer_in(c),
                                     bn_area(c, (size_t)c.mb * dp__bn_stats(C)), g, dy, dx,
                                     grads + l->param_off, grads + l->param_off + C,
                                     dp_cuda_bn_scratch(x->hdr), nb, C, S));
    return DP_OK;
  }
  case DP_LAYER_INPUT: return DP_OK;
  case DP_LAYER_EMBEDDING: /* cuda/sequence.cu */
    DP_CUDA_CHECK(
        dp_k_embed_backward(x->stream, l, n, layer_in(c), dy, grads + l->param_off));
    return DP_OK;
  case DP_LAYER_ATTENTION: {
    if (!dx) return DP_OK;
    size_t wsb;
    void *ws = conv_ws(c, &wsb); /* the (n, T, T) scratch (two with dropout) */
    dp_cuda_attn_drop keys;
    dp_status s =
        dp__cuda_attention_backward(x->blas, x->stream, l, n, layer_in(c), layer_stats(c),
                                    dy, dx, attn_drop(x, c, global_row0, &keys), ws, wsb);
    return s == DP_OK ? s : DP_FAIL(s, "layer %d: %s", c.i, dp_last_error());
  }
  case DP_LAYER_RESIDUAL_END: {    /* the block's output gets dy; x gets it at the begin */
    float *df = ptr(c, c.o.dskip); /* with a shortcut: f's output, g's is dx */
    if (dx && count)
      DP_CUDA_CHECK(
          cudaMemcpyAsync(dx, dy, count * 4, cudaMemcpyDeviceToDevice, x->stream));
    if (df && count)
      DP_CUDA_CHECK(
          cudaMemcpyAsync(df, dy, count * 4, cudaMemcpyDeviceToDevice, x->stream));
    return DP_OK;
  }
  case DP_LAYER_RESIDUAL:
  case DP_LAYER_SHORTCUT: return DP_OK; /* above; a view */
  }
  return DP_FAIL(DP_ERR_BACKEND, "cuda backend: layer kind %d has no backward",
                 (int)l->kind);
}

/* ---- loss, checks, optimizer ------------------------------------------------------ */

/* The op's micro-batches [mb0, mb0 + n) as rows relative to row0: contiguous;
 * listed when few, else of one size but the last. */
static dp_status mb_span(const dp_mb *mbs, int mb0, int n, int row0, dp_cuda_mb_span *s) {
  memset(s, 0, sizeof *s);
  s->n = n;
  if (n <= 0) return DP_OK;
  s->end = mbs[mb0 + n - 1].row0 + mbs[mb0 + n - 1].rows - row0;
  s->m = mbs[mb0].rows;
  for (int i = 0; i < n; i++) {
    const dp_mb *b = &mbs[mb0 + i];
    int lo = b->row0 - row0;
    bool contiguous =
        i == 0 ? lo == 0 : lo == mbs[mb0 + i - 1].row0 + mbs[mb0 + i - 1].rows - row0;
    bool uniform = lo == i * s->m && (b->rows == s->m || (i == n - 1 && b->rows < s->m));
    if (!contiguous || b->rows <= 0 || (n > DP_CUDA_MB_LIST && !uniform))
      return DP_FAIL(
          DP_ERR_BACKEND,
          "cuda backend: loss micro-batches %d..%d are not contiguous runs of one "
          "size (micro-batch %d: rows %d..%d)",
          mb0, mb0 + n - 1, mb0 + i, b->row0, b->row0 + b->rows - 1);
    if (n <= DP_CUDA_MB_LIST) s->bound[i] = lo;
  }
  if (n <= DP_CUDA_MB_LIST) s->bound[n] = s->end;
  return DP_OK;
}

/* The optimizer's constants, computed on the host exactly as
 * lib/cpu/backend.c's opt_consts_of does; the per-step scalars are in the
 * header (dp__cuda_host_step). */
static dp_cuda_opt opt_of(const dp_config *cf) {
  dp_cuda_opt o;
  memset(&o, 0, sizeof o);
  o.kind = (int)cf->optimizer;
  o.nesterov = cf->nesterov;
  o.wd = cf->weight_decay;
  o.keep = 1.0f - cf->dampening;
  if (cf->optimizer == DP_OPT_ADAMW || cf->optimizer == DP_OPT_ADAM) {
    o.b2 = cf->beta2;
    o.one_minus_b2 = 1.0f - cf->beta2;
    o.eps = cf->eps;
    o.amsgrad = dp__amsgrad(cf);
  }
  return o;
}

/* The cross-entropy options as k_loss_ce takes them (lib/cpu/softmax.c's
 * constants, computed the same way: sum_c w_c in its 16 lanes). The scale and
 * the denominator are per step, in the header's scalars (a graph replays). */
static dp_cuda_ce ce_of(const dp_model *m, dp_cuda_header *hdr) {
  dp_cuda_ce ce;
  memset(&ce, 0, sizeof ce);
  if (!dp__ce_has_opts(m)) return ce;
  const dp_ce_opts *o = &m->ce;
  int classes = dp_model_output_width(m) / dp_model_positions(m);
  ce.on = 1;
  ce.ignore = o->ignore;
  ce.ignore_index = o->ignore_index;
  ce.smooth = o->smoothing;
  ce.keep = 1.0f - o->smoothing;
  ce.per = o->smoothing / (float)classes;
  ce.w = o->n_weights ? dp_cuda_ce_weights(hdr) : NULL;
  if (!o->n_weights) {
    ce.wall = (float)classes;
    return ce;
  }
  float a[DP_SUM_LANES];
  for (int l = 0; l < DP_SUM_LANES; l++) a[l] = 0.0f;
  for (int j = 0; j < classes; j++) a[j % DP_SUM_LANES] += o->weights[j];
  ce.wall = dp__lanes_total(a);
  return ce;
}

/* As lib/cpu/backend.c's loss_op: the operands from dp__loss_operands, one sum
 * per micro-batch. */
static dp_status loss_op(dev_ctx *x, const dp_exec_env *e, const dp_op *op) {
  const dp_plan *p = e->plan;
  int d = op->device, out = dp_model_output_width(&p->model);
  /* cross-entropy over a sequence: positions, (B, T) labels; 1 otherwise */
  int P = dp__loss_on_targets(p->model.loss) ? 1 : dp_model_positions(&p->model);
  dp_loss_operands lo;
  dp__loss_operands(p, op, &lo);
  const float *o = dp__span_ptr(e, d, lo.out);
  float *g = dp__span_ptr(e, d, lo.dout), *part = dp__span_ptr(e, d, lo.sums);
  const void *t = dp__span_ptr(e, d, lo.targets);
  /* At most DP_CUDA_MB_LIST micro-batches per launch, listed: any sizes. A
   * micro-batch's sum comes from blocks of its own, cut by its shape alone
   * (cuda/kernels.cu, loss_chunks), so the grouping does not change a bit. */
  for (int g0 = 0; g0 < op->n_mb; g0 += DP_CUDA_MB_LIST) {
    int gn = op->n_mb - g0 < DP_CUDA_MB_LIST ? op->n_mb - g0 : DP_CUDA_MB_LIST;
    int r0 = e->mbs[op->micro_batch + g0].row0 - op->row0; /* the group's first row */
    dp_cuda_mb_span span;
    dp_status s = mb_span(e->mbs, op->micro_batch + g0, gn, op->row0 + r0, &span);
    if (s != DP_OK) return s;
    size_t ro = (size_t)r0 * (size_t)out;
    if (P > 1) { /* a sequence's every position is a row of out / P classes */
      for (int i = 0; i <= gn; i++) span.bound[i] *= P; /* gn <= DP_CUDA_MB_LIST */
      span.m *= P;
      span.end *= P;
    }
    if (dp__loss_on_targets(p->model.loss)) {
      /* the mean over the whole accumulation (loss_rows: rows * accumulate) */
      float n = (float)e->loss_rows * (float)out;
      float scale = p->model.loss == DP_LOSS_MSE ? 2.0f / n : 1.0f / n;
      DP_CUDA_CHECK(dp_k_loss_mse(
          x->stream, o + ro, (const float *)t + ro, g + ro, part + g0,
          dp_cuda_loss_chunks(x->hdr), &span, out, scale, p->model.loss,
          p->model.loss_param, p->model.n_pos_weight ? dp_cuda_ce_weights(x->hdr) : NULL));
    } else { /* the mean over every position: lib/cpu/backend.c's loss_rows */
      float inv = 1.0f / ((float)e->loss_rows * (float)P);
      dp_cuda_ce ce = ce_of(&p->model, x->hdr);
      DP_CUDA_CHECK(dp_k_loss_ce(x->stream, o + ro, (const int32_t *)t + (size_t)r0 * P,
                                 g + ro, part + g0, dp_cuda_loss_chunks(x->hdr), &span,
                                 out / P, inv, (op->row0 + r0) * P, x->hdr, d, &ce));
    }
  }
  return DP_OK;
}

static dp_status loss_sum_op(dev_ctx *x, const dp_exec_env *e, const dp_op *op) {
  const dp_plan *p = e->plan;
  /* The empty micro-batches of a smaller batch are a suffix (ctx.c truncates
   * the planned ones); the tree leaves them out. */
  int n_ne = 0;
  while (n_ne < op->n_mb && e->mbs[n_ne].rows > 0) n_ne++;
  for (int k = n_ne; k < op->n_mb; k++)
    if (e->mbs[k].rows > 0)
      return DP_FAIL(DP_ERR_BACKEND, "cuda backend: micro-batch %d is empty but %d is not",
                     n_ne, k);
  if (n_ne == 0) return DP_FAIL(DP_ERR_BACKEND, "cuda backend: loss sum of an empty batch");
  float denom = (float)op->rows * (dp__loss_on_targets(p->model.loss)
                                       ? (float)dp_model_output_width(&p->model)
                                       : (float)dp_model_positions(&p->model));
  DP_CUDA_CHECK(dp_k_loss_sum(x->stream, reg(e, 0, DP_REGION_LOSS, 0), op->n_mb, n_ne,
                              denom, dp__ce_has_opts(&p->model), x->hdr, op->device));
  return DP_OK;
}

static dp_status copy_on(cuda_ctx *c, int D, void *dst, const void *src, size_t bytes);
static dp_status close_group(cuda_ctx *c, int d);

/* The optimizer state of parameters [off, off + bytes) (byte offsets) on device d:
 * the device keeps state for [opt_off[d], +opt_len[d]) only, one vector after
 * the other (momentum's buffer; AdamW's m, then v, then amsgrad's v_hat), as
 * lib/cpu/backend.c reads it. A segment outside that range is refused, not read
 * out of place. */
static dp_status opt_state_of(const dp_exec_env *e, int d, size_t off, size_t bytes,
                              float **m, float **v, float **vh) {
  dp_opt_operands o;
  dp_status st = dp__opt_operands(e->plan, d, off / 4, bytes / 4, DP_REGION_GRADS, off, &o);
  *m = st ? NULL : dp__span_ptr(e, d, o.state[0]);
  *v = st ? NULL : dp__span_ptr(e, d, o.state[1]);
  *vh = st ? NULL : dp__span_ptr(e, d, o.state[2]);
  return st;
}

/* Before a commit-phase kernel that must refuse with every check (the
 * optimizer, GRAD_STASH): allreduce copies the other devices' status words
 * into device d's header; *n_check: how many words the kernel reads. */
static dp_status gather_status(cuda_ctx *c, dev_ctx *x, const dp_exec_env *e, int d,
                               int *n_check) {
  *n_check = 1;
  if (e->plan->cfg.mode == DP_MODE_CLASSIC || c->n <= 1) return DP_OK;
  *n_check = c->n; /* another rank's words stay 0: its verdict came by agreement */
  for (int X = c->d0; X < c->d1; X++) {
    if (X == d) continue;
    dp_status s =
        copy_on(c, d, &x->hdr->status[X], &c->dev[X].hdr->status[X], sizeof(uint32_t));
    if (s != DP_OK) return s;
  }
  return DP_OK;
}

/* ---- config.clip_grad_norm and config.accumulate (lib/cpu/backend.c's
 * grad_norm_op, grad_clip_op, grad_accum_op, grad_stash_op) ---- */
static dp_status grad_norm_op(dev_ctx *x, const dp_exec_env *e, const dp_op *op) {
  int d = op->device;
  DP_CUDA_CHECK(dp_k_grad_norm(
      x->stream, reg(e, d, op->src_region, op->src_offset), op->bytes / 4,
      (unsigned long long *)(void *)reg(e, d, op->dst_region, op->dst_offset)));
  return DP_OK;
}

/* The norm and coefficient on the device (its header: a graph replays them),
 * then the scaling. */
static dp_status grad_clip_op(dev_ctx *x, const dp_exec_env *e, const dp_op *op) {
  int d = op->device;
  DP_CUDA_CHECK(dp_k_clip_coef(
      x->stream,
      (const unsigned long long *)(void *)reg(e, d, op->src_region, op->src_offset),
      op->n_mb, e->plan->cfg.clip_grad_norm, x->hdr));
  DP_CUDA_CHECK(dp_k_clip_scale(x->stream, reg(e, d, op->dst_region, op->dst_offset),
                                op->bytes / 4, x->hdr));
  return DP_OK;
}

/* config.clip_grad_value: the clamp is a kernel argument (fixed by the plan, so
 * a graph replays it). */
static dp_status grad_clamp_op(dev_ctx *x, const dp_exec_env *e, const dp_op *op) {
  int d = op->device;
  DP_CUDA_CHECK(dp_k_clip_value(x->stream, reg(e, d, op->dst_region, op->dst_offset),
                                op->bytes / 4, e->plan->cfg.clip_grad_value));
  return DP_OK;
}

/* dst += src, rounded to bf16 and src bf16 as the op's flags say
 * (config.reduce_precision bf16). */
static dp_status grad_add_op(dev_ctx *x, const dp_exec_env *e, const dp_op *op) {
  int d = op->device;
  float *dst = reg(e, d, op->dst_region, op->dst_offset);
  void *src = reg(e, d, op->src_region, op->src_offset);
  size_t n = op->bytes / 4;
  if (op->flags & DP_OPF_SRC_BF16)
    DP_CUDA_CHECK(dp_k_add_bf16(x->stream, dst, NULL, (const uint16_t *)src, n));
  else if (op->flags & DP_OPF_ROUND_BF16)
    DP_CUDA_CHECK(dp_k_add_bf16(x->stream, dst, (const float *)src, NULL, n));
  else
    DP_CUDA_CHECK(dp_k_add(x->stream, dst, (const float *)src, n));
  return DP_OK;
}

/* A leaf of the bf16 tree (DP_OPF_ROUND_BF16 on a backward or batchnorm's
 * sums): the layer's gradients in the slot rounded, unless its backward wrote
 * bf16 values already (precision bf16's linear and conv2d: cuda/mixed.cu). */
static dp_status round_leaf(dev_ctx *x, const dp_plan *p, const dp_op *op, float *grads) {
  const dp_layer *l = &p->model.layers[op->layer];
  if (!(op->flags & DP_OPF_ROUND_BF16) || !l->n_params || !grads) return DP_OK;
  if (p->cfg.precision == DP_PRECISION_BF16 && op->kind == DP_OP_BACKWARD &&
      (l->kind == DP_LAYER_LINEAR || l->kind == DP_LAYER_CONV2D))
    return DP_OK;
  float *g = grads + l->param_off;
  DP_CUDA_CHECK(dp_k_round_bf16(x->stream, g, g, l->n_params));
  return DP_OK;
}

/* The slots of the set bits of k added to this call's gradient, lowest first
 * (each the left operand: the sum is commutative bit for bit). k comes from
 * the host: only the updating call, whose k is always accumulate - 1, is
 * ever captured in a graph. */
static dp_status grad_accum_op(cuda_ctx *c, dev_ctx *x, const dp_exec_env *e,
                               const dp_op *op) {
  int d = op->device, k = e->accum_k, A = dp__accumulate(&e->plan->cfg);
  size_t n = op->bytes / 4;
  if (k < 0 || k >= A || (c->capturing && k + 1 != A))
    return DP_FAIL(DP_ERR_BACKEND, "cuda backend: call %d of an accumulation of %d%s", k, A,
                   c->capturing ? " in a graph capture (only the last is captured)" : "");
  float *g = reg(e, d, op->dst_region, op->dst_offset);
  const float *slots = reg(e, d, op->src_region, op->src_offset);
  for (int l = 0; (k >> l) & 1; l++)
    DP_CUDA_CHECK((op->flags & DP_OPF_ROUND_BF16) /* config.reduce_precision bf16 */
                      ? dp_k_add_bf16(x->stream, g, slots + (size_t)l * n, NULL, n)
                      : dp_k_add(x->stream, g, slots + (size_t)l * n, n));
  if (k + 1 == A) return DP_OK; /* the update's check follows */
  /* a call that only accumulates: its gradients must be finite to be kept */
  x->accum_call = true;
  DP_CUDA_CHECK(dp_k_grad_check(x->stream, g, n, op->dst_offset / 4, x->hdr, d));
  return DP_OK;
}

static dp_status grad_stash_op(cuda_ctx *c, dev_ctx *x, const dp_exec_env *e,
                               const dp_op *op) {
  int d = op->device, l = 0, n_check;
  size_t n = op->bytes / 4;
  while ((e->accum_k >> l) & 1) l++;
  dp_status s = gather_status(c, x, e, d, &n_check);
  if (s != DP_OK) return s;
  DP_CUDA_CHECK(dp_k_checked_copy(
      x->stream, reg(e, d, op->src_region, op->src_offset) + (size_t)l * n,
      reg(e, d, op->dst_region, op->dst_offset), n, x->hdr, n_check));
  return DP_OK;
}

static dp_status optimizer_op(cuda_ctx *c, dev_ctx *x, const dp_exec_env *e,
                              const dp_op *op) {
  const dp_plan *p = e->plan;
  const dp_config *cf = &p->cfg;
  int d = op->device;
  size_t n = op->bytes / 4;
  /* Which status words refuse this update: classic runs the loss, the check
   * and the optimizer on device 0 alone; allreduce has every device check its
   * part and device 0 the loss, and every replica must refuse together, so
   * the others' words are copied in first (ordered like any copy). */
  int n_check;
  dp_status cs = gather_status(c, x, e, d, &n_check);
  if (cs != DP_OK) return cs;
  dp_cuda_opt o = opt_of(cf);
  float *m, *v, *vh;
  dp_status ss = opt_state_of(e, d, op->dst_offset, op->bytes, &m, &v, &vh);
  if (ss != DP_OK) return ss;
  DP_CUDA_CHECK(dp_k_optimizer(x->stream, &o, reg(e, d, DP_REGION_PARAMS, op->dst_offset),
                               reg(e, d, DP_REGION_GRADS, op->dst_offset), m, v, vh, n,
                               x->hdr, n_check));
  return DP_OK;
}

/* config.fast_collectives: this device's gradients summed in place with every
 * other device's by NCCL (its order, not the canonical tree's). Every device
 * runs one in the same stage; the executor keeps them paired after a failure
 * and dp__cuda_step_end checks the counts before it waits. */
static dp_status allreduce_op(cuda_ctx *c, dev_ctx *x, const dp_exec_env *e,
                              const dp_op *op) {
#ifdef DP_HAVE_NCCL
  if (!c->nccl || !x->comm)
    return DP_FAIL(DP_ERR_BACKEND,
                   "cuda backend: device %d: fast_collectives needs the NCCL "
                   "communicators, which this context %s",
                   op->device,
                   c->nccl ? "aborted after an unmatched transfer" : "does not have");
  float *g = reg(e, op->device, op->dst_region, op->dst_offset);
  size_t n = op->bytes / 4;
  if (n == 0) return DP_OK;
  x->coll_n++;
  return dp__cuda_nccl_issued(
      c, op->device, ncclAllReduce(g, g, n, ncclFloat32, ncclSum, x->comm, x->stream),
      "ncclAllReduce");
#else
  (void)c, (void)x, (void)e;
  return DP_FAIL(DP_ERR_UNSUPPORTED,
                 "cuda backend: device %d: fast_collectives needs NCCL, "
                 "which this build does not have",
                 op->device);
#endif
}

/* The batchnorm ops of lib/core/schedule.c, addressed as lib/cpu/backend.c's
 * bn_update, bn_stats_op, bn_merge_op, bn_final_op and bn_bwd_stats_op. */
static dp_status bn_op(cuda_ctx *c, dev_ctx *x, const dp_exec_env *e, const dp_op *op) {
  const dp_plan *p = e->plan;
  int d = op->device;
  if (op->layer < 0 || op->layer >= p->model.n_layers ||
      p->model.layers[op->layer].kind != DP_LAYER_BATCHNORM)
    return DP_FAIL(DP_ERR_INVALID, "cuda backend: op kind %d on layer %d, not a batchnorm",
                   op->kind, op->layer);
  const dp_layer *l = &p->model.layers[op->layer];
  int C = l->c, S = bn_positions(l);
  lay ly = lay_of(e, op, op->layer);
  bool sums = op->kind == DP_OP_BN_STATS || op->kind == DP_OP_BN_BWD_STATS;
  if (sums && p->cfg.precision == DP_PRECISION_BF16) { /* bf16 activations, widened */
    dp_status s = dp__cuda_mixed_bn_operands(x, &ly, op->kind == DP_OP_BN_BWD_STATS);
    if (s) return s;
  }
  float *dst = reg(e, d, op->dst_region, op->dst_offset);
  const float *src = reg(e, d, op->src_region, op->src_offset);
  switch ((dp_op_kind)op->kind) {
  case DP_OP_BN_UPDATE: {
    /* Device 0's running statistics from its micro-batch 0's (sync: the whole
     * batch's, in the same place), in the commit phase: refused with the
     * step, like the optimizer, by the status words the optimizer op before
     * it on this stream copied in (allreduce: every device's). */
    int n_check = p->cfg.mode != DP_MODE_CLASSIC && c->n > 1 ? c->n : 1;
    DP_CUDA_CHECK(dp_k_bn_update(x->stream, bn_area(ly, 0), bn_buffers(ly), C, x->hdr,
                                 n_check, l->momentum));
    return DP_OK;
  }
  case DP_OP_BN_STATS:
    DP_CUDA_CHECK(dp_k_bn_part(x->stream, layer_in(ly), dst, dp_cuda_bn_scratch(x->hdr),
                               dp__bn_rows(l, op->rows), C, S));
    return DP_OK;
  case DP_OP_BN_MERGE:
    DP_CUDA_CHECK(dp_k_bn_merge(x->stream, dst, src, C, S));
    return DP_OK;
  case DP_OP_BN_FINAL:
    DP_CUDA_CHECK(dp_k_bn_final(x->stream, dst, src, C, S, l->eps));
    return DP_OK;
  case DP_OP_BN_BWD_STATS:
    DP_CUDA_CHECK(dp_k_bn_bwd_sums(x->stream, layer_in(ly), bn_area(ly, 0), layer_dout(ly),
                                   dst + l->param_off, dst + l->param_off + C,
                                   dp_cuda_bn_scratch(x->hdr), dp__bn_rows(l, op->rows), C,
                                   S));
    return DP_OK;
  default: break;
  }
  return DP_FAIL(DP_ERR_BACKEND, "cuda backend: op kind %d is not a batchnorm op",
                 op->kind);
}

/* ---- cuBLAS warm-up (issue 28, finding 4) ------------------------------------------
 * cuBLAS loads a kernel lazily at its first launch; a load while an NCCL kernel of
 * the same context spins waiting for its peer can deadlock. So at context creation,
 * before any NCCL call, every cuBLAS call a step of the plan can make runs once: the
 * same handle, shapes, leading dimensions and transposes, and operands with the same
 * alignment within 256 bytes (cuBLAS picks kernels by alignment), in scratch memory
 * (freed again) so that no region's content changes. A batch smaller than planned
 * keeps each micro-batch's slot but gives the last ones fewer rows, so with NCCL
 * every row count up to the planned one runs too (conv2d: every image count). */
namespace {
struct gemm_use {
  int dir, in, out, masked;
  int attention; /* an attention's layer + 1 (its batched GEMMs); 0: a linear's or conv's */
  unsigned ax, aw, ay, ad; /* offsets mod 256 of the operands (ad: dx, 256 when none) */
  unsigned ag;             /* and of the weight gradient (backward; 256 in a forward) */
  int step;                /* rows per sample: 1, or a conv2d's output positions */
  int rows;                /* the most rows a step gives it (a multiple of step) */
};
} // namespace

static unsigned mod256(const void *p) { return (unsigned)((uintptr_t)p & 255u); }

/* The layer kinds whose ops call cuBLAS. */
static bool gemm_layer(const dp_layer *l) {
  return l->kind == DP_LAYER_LINEAR || l->kind == DP_LAYER_CONV2D ||
         l->kind == DP_LAYER_ATTENTION;
}

/* The cuBLAS use of a forward or backward op at its planned rows; false when the
 * op makes no cuBLAS call. */
static bool gemm_use_of(const dp_exec_env *e, const dp_op *op, gemm_use *u) {
  const dp_plan *p = e->plan;
  if ((op->kind != DP_OP_FORWARD && op->kind != DP_OP_BACKWARD) || op->layer < 0 ||
      op->rows <= 0)
    return false;
  const dp_layer *l = &p->model.layers[op->layer];
  if (!gemm_layer(l)) return false;
  lay c0 = lay_of(e, op, op->layer);
  bool fwd = op->kind == DP_OP_FORWARD;
  if (l->kind == DP_LAYER_ATTENTION) { /* x: qkv, w: p, y: y or dy, d: dqkv, g: scratch */
    size_t wsb;
    /* a training forward with dropout multiplies the scratch's kept probabilities */
    bool drop = fwd && !p->cfg.inference && l->p > 0.0f;
    *u = gemm_use{};
    u->dir = op->kind;
    u->attention = op->layer + 1;
    u->ax = mod256(layer_in(c0));
    u->aw = mod256(layer_stats(c0));
    u->ay = mod256(fwd ? layer_out(c0) : layer_dout(c0));
    u->ad = fwd || !layer_din(c0) ? 256u : mod256(layer_din(c0));
    u->ag = fwd && !drop ? 256u : mod256(conv_ws(c0, &wsb));
    u->step = 1;
    u->rows = op->rows;
    return fwd || u->ad < 256u; /* backward() skips it without dqkv */
  }
  /* the weight gradient where backward() writes it: a slot of the canonical tree */
  const float *dw =
      fwd ? NULL : reg(e, c0.d, op->dst_region, op->dst_offset) + l->param_off;
  *u = gemm_use{};
  u->dir = op->kind;
  u->aw = mod256(layer_params(c0));
  u->ag = dw ? mod256(dw) : 256u;
  if (l->kind == DP_LAYER_CONV2D) { /* im2col rows: COL and T at 256-byte offsets */
    size_t wsb;
    unsigned a = mod256(conv_ws(c0, &wsb));
    u->step = l->h * l->w;
    u->in = l->ic * l->k * l->k;
    u->out = l->c;
    u->ax = u->ay = a;
    u->ad = fwd || !layer_din(c0) ? 256u : a;
    u->rows = op->rows * u->step;
    return true;
  }
  const float *y =
      fwd ? layer_out(dp__relu_fused(p, op->layer + 1) ? at_layer(c0, op->layer + 1) : c0)
          : layer_dout(c0);
  /* the input gradient as backward() writes it: the relu's before it when fused */
  u->masked = !fwd && op->layer > 0 && dp__relu_bwd_fused(p, op->layer - 1);
  const float *dx = fwd ? NULL : layer_din(u->masked ? at_layer(c0, op->layer - 1) : c0);
  u->step = dp__positions(l); /* a sequence's positions are rows (forward()) */
  u->in = dp__pos_in(l);
  u->out = dp__pos_out(l);
  u->ax = mod256(layer_in(c0));
  u->ay = mod256(y);
  u->ad = dx ? mod256(dx) : 256u;
  u->rows = op->rows * u->step;
  return true;
}

/* The same call but for the row count (gemm_use has no padding: ints and unsigneds). */
static bool same_call(const gemm_use &a, gemm_use b) {
  b.rows = a.rows;
  return !memcmp(&a, &b, sizeof b);
}

/* Device d's distinct uses, each with the most rows any of its ops has. */
enum { MAX_USES = 128 };
static dp_status gemm_uses(const dp_exec_env *e, int d, gemm_use *uses, int *n_uses) {
  const dp_op *ops = dp_plan_ops(e->plan);
  int n = 0;
  for (int k = 0; k < dp_plan_n_ops(e->plan); k++) {
    gemm_use u;
    if (ops[k].device != d || !gemm_use_of(e, &ops[k], &u)) continue;
    int i = 0;
    while (i < n && !same_call(uses[i], u)) i++;
    if (i < n) {
      uses[i].rows = u.rows > uses[i].rows ? u.rows : uses[i].rows;
      continue;
    }
    if (n == MAX_USES)
      return DP_FAIL(DP_ERR_BACKEND,
                     "cuda backend: device %d makes more than %d distinct cuBLAS calls; "
                     "the warm-up before NCCL cannot cover them",
                     d, MAX_USES);
    uses[n++] = u;
  }
  *n_uses = n;
  return DP_OK;
}

/* ---- the warm-up in bf16 (config.precision): the layer ops themselves ----
 * cuda/mixed.cu's cuBLAS calls (cublasGemmEx on bf16 operands, the fp32 calls
 * on shadow copies) take their operands from the arena and its shadow area, at
 * offsets of their own. So with NCCL the warm-up runs each distinct forward
 * and backward op of the device itself, at every row count up to its planned
 * one, on the context's arena, and then puts back what those ops can write
 * (lib/core/ctx.c's fill: the canary, gradients zeroed); the parameters and
 * optimizer state, which they only read, stay. */
namespace {
struct mixed_use {
  const dp_op *op; /* the one with the most rows */
  unsigned at[7];  /* in, out, din, dout, stats, params, grads: offsets mod 256 */
};
} // namespace

static unsigned mod256_of(const lay &c, dp_span s) {
  return s.region < 0 ? 256u : mod256(ptr(c, s));
}

static mixed_use mixed_use_of(const dp_exec_env *e, const dp_op *op) {
  lay c = lay_of(e, op, op->layer);
  mixed_use u = {};
  u.op = op;
  const dp_span sp[6] = {c.o.in, c.o.out, c.o.din, c.o.dout, c.o.stats, c.o.params};
  for (int i = 0; i < 6; i++) u.at[i] = mod256_of(c, sp[i]);
  u.at[6] = op->kind == DP_OP_BACKWARD
                ? mod256(reg(e, c.d, op->dst_region, op->dst_offset) + c.l->param_off)
                : 256u;
  return u;
}

/* What device d's layer ops can write, as the context left it before. */
static dp_status refill(dev_ctx *x, const dp_exec_env *e, int d) {
  static const dp_region written[] = {DP_REGION_ACTIVATIONS,  DP_REGION_OUTPUTS,
                                      DP_REGION_OUTPUT_GRADS, DP_REGION_GRAD_PARTIALS,
                                      DP_REGION_WORKSPACE,    DP_REGION_GRADS};
  for (dp_region r : written) {
    size_t n = e->plan->regions[d][r].size / 4;
    DP_CUDA_CHECK(dp_k_fill(x->stream, (uint32_t *)dp__region_ptr(e, d, r),
                            r == DP_REGION_GRADS ? 0u : DP_CANARY, n));
  }
  return DP_OK;
}

static dp_status warm_mixed(cuda_ctx *c, int d) {
  dev_ctx *x = &c->dev[d];
  if (!(c->flags & DP_CUDA_NCCL)) return DP_OK; /* a step's own loads cannot deadlock */
  dp_exec_env e = {};
  e.plan = c->plan;
  for (int k = c->d0; k < c->d1; k++) e.arena[k] = c->dev[k].arena;
  const dp_op *ops = dp_plan_ops(c->plan);
  mixed_use uses[MAX_USES];
  int n = 0;
  for (int k = 0; k < dp_plan_n_ops(c->plan); k++) {
    const dp_op *op = &ops[k];
    if (op->device != d || (op->kind != DP_OP_FORWARD && op->kind != DP_OP_BACKWARD) ||
        op->layer < 0 || op->rows <= 0 || !gemm_layer(&c->plan->model.layers[op->layer]))
      continue;
    mixed_use u = mixed_use_of(&e, op);
    int i = 0;
    while (i < n && (uses[i].op->kind != op->kind || uses[i].op->layer != op->layer ||
                     memcmp(uses[i].at, u.at, sizeof u.at)))
      i++;
    if (i < n) {
      if (op->rows > uses[i].op->rows) uses[i].op = op;
      continue;
    }
    if (n == MAX_USES)
      return DP_FAIL(DP_ERR_BACKEND,
                     "cuda backend: device %d has more than %d distinct bf16 layer ops; "
                     "the warm-up before NCCL cannot cover them",
                     d, MAX_USES);
    uses[n++] = u;
  }
  dp_status s = DP_OK;
  for (int i = 0; i < n && s == DP_OK; i++) {
    const dp_op *op = uses[i].op;
    for (int r = 1; r <= op->rows && s == DP_OK; r++) {
      lay l = lay_of(&e, op, op->layer);
      l.rows = r;
      if (op->kind == DP_OP_BACKWARD) {
        s = dp__cuda_mixed_backward(x, l, reg(&e, d, op->dst_region, op->dst_offset), 0);
        continue;
      }
      for (int training = 1; training >= 0 && s == DP_OK; training--) {
        e.training = training; /* attention dropout's forward, and evaluation's */
        s = dp__cuda_mixed_forward(x, l, 0);
      }
    }
  }
  if (s == DP_OK) s = refill(x, &e, d);
  return s;
}

dp_status dp__cuda_warm_device(cuda_ctx *c, int d, unsigned char *scratch, size_t each) {
  if (c->plan->cfg.precision == DP_PRECISION_BF16) {
    dp_status s = warm_mixed(c, d);
    if (s != DP_OK) return s;
    DP_CUDA_CHECK_D(d, cudaStreamSynchronize(c->dev[d].stream));
    return DP_OK;
  }
  dev_ctx *x = &c->dev[d];
  dp_exec_env e = {};
  e.plan = c->plan;
  for (int k = c->d0; k < c->d1; k++) e.arena[k] = c->dev[k].arena;
  gemm_use uses[MAX_USES];
  int n = 0;
  dp_status s = gemm_uses(&e, d, uses, &n);
  for (int i = 0; i < n && s == DP_OK; i++) {
    const gemm_use &u = uses[i];
    /* scratch operands at the real ones' alignment; contents do not matter */
    float *sx = (float *)(scratch + u.ax), *sw = (float *)(scratch + each + u.aw),
          *sy = (float *)(scratch + 2 * each + u.ay),
          *sd = (float *)(scratch + 3 * each + (u.ad & 255u)),
          *sg = (float *)(scratch + 4 * each + (u.ag & 255u));
    /* without NCCL a lazy load cannot deadlock: the planned rows only, which a
     * context's first step would load anyway */
    int r0 = c->flags & DP_CUDA_NCCL ? u.step : u.rows;
    const dp_layer *al = u.attention ? &c->plan->model.layers[u.attention - 1] : NULL;
    /* attention dropout's keys (a training forward with a scratch: dropout) */
    dp_cuda_attn_drop keys = {0, 0, 0, x->hdr};
    const dp_cuda_attn_drop *drop =
        al && al->p > 0.0f && !c->plan->cfg.inference ? &keys : NULL;
    for (int r = r0; r <= u.rows && s == DP_OK; r += u.step)
      if (al && u.dir == DP_OP_FORWARD) { /* and the same forward without (evaluation) */
        s = dp__cuda_attention_forward(x->blas, x->stream, al, r, sx, sw, sy, NULL, NULL,
                                       0);
        if (s == DP_OK && drop) /* the scratch: `each` less the offset's room */
          s = dp__cuda_attention_forward(x->blas, x->stream, al, r, sx, sw, sy, drop, sg,
                                         each - 256);
      } else if (al) {
        s = dp__cuda_attention_backward(x->blas, x->stream, al, r, sx, sw, sy, sd, drop, sg,
                                        each - 256);
      } else
        s = u.dir == DP_OP_FORWARD
                ? dp__cuda_linear_forward(x->blas, x->stream, r, u.in, u.out, sx, sw, NULL,
                                          false, sy)
                : dp__cuda_linear_backward(x->blas, x->stream, r, u.in, u.out, sx, sw, sy,
                                           sg, NULL, u.masked ? sx : NULL,
                                           u.ad < 256u ? sd : NULL);
  }
  if (s != DP_OK) return s;
  DP_CUDA_CHECK_D(d, cudaStreamSynchronize(x->stream));
  return DP_OK;
}

/* The largest operand of a cuBLAS call in the plan, in bytes, + 256. */
size_t dp__cuda_warm_bytes(const dp_plan *p) {
  size_t r = 0, m = 0;
  for (int d = 0; d < p->split.n_used; d++)
    if ((size_t)p->act[d].mb_rows > r) r = (size_t)p->act[d].mb_rows;
  for (int i = 0; i < p->model.n_layers; i++) {
    const dp_layer *l = &p->model.layers[i];
    size_t rows = r, in = (size_t)l->in, out = (size_t)l->out;
    if (l->kind == DP_LAYER_CONV2D) {
      rows = r * (size_t)l->h * (size_t)l->w;
      in = (size_t)l->ic * l->k * l->k;
      out = (size_t)l->c;
    } else if (l->kind == DP_LAYER_ATTENTION) { /* qkv (r, T, 3D); p (r, H, T, T) */
      size_t pr = r * (size_t)l->heads * l->t * l->t;
      size_t ws = dp__cuda_attention_ws_bytes(l, (int)r) / 4;
      size_t big = rows * in > pr ? rows * in : pr;
      big = big > ws ? big : ws;
      if (big * 4 > m) m = big * 4;
      continue;
    } else if (l->kind != DP_LAYER_LINEAR) {
      continue;
    } else { /* on a sequence: positions are rows, the widths per position */
      rows = r * (size_t)dp__positions(l);
      in = (size_t)dp__pos_in(l);
      out = (size_t)dp__pos_out(l);
    }
    size_t a = rows * in, b = in * out, y = rows * out;
    size_t big = a > b ? a : b;
    big = big > y ? big : y;
    if (big * 4 > m) m = big * 4;
  }
  return m + 256;
}

extern "C" dp_status dp__cuda_run(void *bctx, dp_exec_env *e, const dp_op *op) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  int d = op->device;
  if (!c || !is_local(c, d))
    return DP_FAIL(DP_ERR_INVALID,
                   "cuda backend: op on device %d, but this process has devices %d..%d", d,
                   c ? c->d0 : 0, c ? c->d1 - 1 : -1);
  dev_ctx *x = &c->dev[d];
  dp_status s = use_device(x->phys);
  if (s == DP_OK) s = close_group(c, d); /* its transfers go first */
  if (s != DP_OK) return s;
  const dp_plan *p = e->plan;
  /* The kernels take the step from the header, which dp__cuda_step_begin
   * filled; an env that disagrees would silently use another dropout mask
   * and bias correction than the CPU backend. */
  bool masks = (op->kind == DP_OP_BACKWARD || (op->kind == DP_OP_FORWARD && e->training)) &&
               op->layer >= 0 && op->layer < p->model.n_layers &&
               (p->model.layers[op->layer].kind == DP_LAYER_DROPOUT ||
                p->model.layers[op->layer].kind == DP_LAYER_ATTENTION) &&
               p->model.layers[op->layer].p != 0.0f;
  bool uses_step = op->kind == DP_OP_OPTIMIZER || masks;
  if (uses_step && e->step != c->step)
    return DP_FAIL(
        DP_ERR_BACKEND,
        "cuda backend: the op runs at step %llu but dp__cuda_step_begin was given "
        "step %llu",
        (unsigned long long)e->step, (unsigned long long)c->step);
  switch ((dp_op_kind)op->kind) {
  case DP_OP_FORWARD:
  case DP_OP_BACKWARD: {
    if (op->layer < 0 || op->layer >= p->model.n_layers)
      return DP_FAIL(DP_ERR_INVALID, "cuda backend: no layer %d", op->layer);
    lay l = lay_of(e, op, op->layer);
    /* dropout's rows: of the accumulation's concatenation (row_base) */
    int row0 = e->row_base + op->row0;
    float *grads = reg(e, d, op->dst_region, op->dst_offset);
    if (p->cfg.precision == DP_PRECISION_BF16) /* cuda/mixed.cu */
      s = op->kind == DP_OP_FORWARD ? dp__cuda_mixed_forward(x, l, row0)
                                    : dp__cuda_mixed_backward(x, l, grads, row0);
    else if (op->kind == DP_OP_FORWARD)
      s = dp__cuda_forward(x, l, row0);
    else
      s = dp__cuda_backward(x, l, grads, row0);
    return s != DP_OK || op->kind == DP_OP_FORWARD ? s : round_leaf(x, p, op, grads);
  }
  case DP_OP_GRAD_ADD: return grad_add_op(x, e, op);
  case DP_OP_GRAD_PACK:
    DP_CUDA_CHECK(dp_k_pack_bf16(x->stream, reg(e, d, op->src_region, op->src_offset),
                                 (uint16_t *)reg(e, d, op->dst_region, op->dst_offset),
                                 op->bytes / 4));
    return DP_OK;
  case DP_OP_GRAD_UNPACK:
    DP_CUDA_CHECK(dp_k_unpack_bf16(
        x->stream, (const uint16_t *)reg(e, d, op->src_region, op->src_offset),
        reg(e, d, op->dst_region, op->dst_offset), op->bytes / 4));
    return DP_OK;
  case DP_OP_ZERO: /* -0.0: x + -0.0 == x for every x, +0.0 and -0.0 included */
    DP_CUDA_CHECK(dp_k_fill(x->stream,
                            (uint32_t *)reg(e, d, op->dst_region, op->dst_offset),
                            0x80000000u, op->bytes / 4));
    return DP_OK;
  case DP_OP_LOSS: return loss_op(x, e, op);
  case DP_OP_LOSS_SUM: return loss_sum_op(x, e, op);
  case DP_OP_GRAD_CHECK: {
    const float *g = (const float *)reg(e, d, op->src_region, op->src_offset);
    dp_cuda_opt o = opt_of(&e->plan->cfg);
    float *m, *v, *vh;
    dp_status ss = opt_state_of(e, d, op->src_offset, op->bytes, &m, &v, &vh);
    if (ss != DP_OK) return ss;
    DP_CUDA_CHECK(dp_k_step_check(
        x->stream, &o, (const float *)reg(e, d, DP_REGION_PARAMS, op->src_offset), g, m, v,
        vh, op->bytes / 4, op->src_offset / 4, x->hdr, d));
    return DP_OK;
  }
  case DP_OP_OPTIMIZER: return optimizer_op(c, x, e, op);
  case DP_OP_ALLREDUCE: /* the transport's: dp__cuda_collective */
  case DP_OP_COPY_ADD:  /* the transport's (not this one's: never planned here) */
  case DP_OP_COPY: break;
  case DP_OP_GRAD_NORM: return grad_norm_op(x, e, op);
  case DP_OP_GRAD_CLIP: return grad_clip_op(x, e, op);
  case DP_OP_GRAD_CLAMP: return grad_clamp_op(x, e, op);
  case DP_OP_GRAD_ACCUM: return grad_accum_op(c, x, e, op);
  case DP_OP_GRAD_STASH: return grad_stash_op(c, x, e, op);
  case DP_OP_BN_UPDATE:
  case DP_OP_BN_STATS:
  case DP_OP_BN_MERGE:
  case DP_OP_BN_FINAL:
  case DP_OP_BN_BWD_STATS:
    s = bn_op(c, x, e, op);
    if (s == DP_OK && op->kind == DP_OP_BN_BWD_STATS)
      s = round_leaf(x, p, op, reg(e, d, op->dst_region, op->dst_offset));
    return s;
  }
  return DP_FAIL(DP_ERR_BACKEND, "cuda backend: op kind %d is not a compute op", op->kind);
}

/* ---- transport ------------------------------------------------------------------- */

/* The logical device whose arena holds [p, p + bytes): -1 = none (host
 * memory), -2 = it runs past an arena's end. */
static int owner(const cuda_ctx *c, const void *ptr, size_t bytes) {
  uintptr_t a = (uintptr_t)ptr;
  for (int d = c->d0; d < c->d1; d++) {
    uintptr_t lo = (uintptr_t)c->dev[d].arena, hi = lo + c->dev[d].bytes;
    if (a >= lo && a < hi) return bytes <= hi - a ? d : -2;
  }
  return -1;
}

/* Enqueues a copy on device D's stream, after stage s - 1 of the other
 * endpoint's device, and notes the touch for dp__cuda_stage_begin. */
static dp_status copy_on(cuda_ctx *c, int D, void *dst, const void *src, size_t bytes) {
  dp_status gs = close_group(c, D);
  if (gs != DP_OK) return gs;
  int sd = owner(c, src, bytes), dd = owner(c, dst, bytes);
  if (sd == -2 || dd == -2)
    return DP_FAIL(DP_ERR_INVALID,
                   "cuda transport: a copy of %zu bytes runs past the end of "
                   "device %d's arena",
                   bytes, sd == -2 ? owner(c, src, 0) : owner(c, dst, 0));
  dev_ctx *x = &c->dev[D];
  int s = x->stage, ends[2] = {sd, dd};
  if (s < 0)
    return DP_FAIL(DP_ERR_BACKEND,
                   "cuda transport: device %d copies outside a stage "
                   "(dp__cuda_stage_begin was not called)",
                   D);
  for (int k = 0; k < 2; k++) {
    int X = ends[k];
    if (X < 0 || X == D) continue;
    x->touched[s & 1] |= 1ull << X;
    if (s > 0)
      DP_CUDA_CHECK_D(D, cudaStreamWaitEvent(x->stream, c->dev[X].ev[(s - 1) & 1], 0));
  }
  if (bytes == 0) return DP_OK;
  if (sd < 0 && dd < 0)
    DP_CUDA_CHECK_D(D, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToHost, x->stream));
  else if (sd < 0)
    DP_CUDA_CHECK_D(D, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, x->stream));
  else if (dd < 0)
    DP_CUDA_CHECK_D(D, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, x->stream));
  else if (c->dev[sd].phys == c->dev[dd].phys) /* replicas sharing a GPU */
    DP_CUDA_CHECK_D(D,
                    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, x->stream));
  else /* distinct GPUs: over NVLink/PCIe peer access when enabled, else staged by the
          driver */
    DP_CUDA_CHECK_D(D, cudaMemcpyPeerAsync(dst, c->dev[dd].phys, src, c->dev[sd].phys,
                                           bytes, x->stream));
  return DP_OK;
}

/* Ends device d's open NCCL group, if any: its sends and receives are enqueued
 * now, before whatever the thread enqueues next on the device's stream. */
static dp_status close_group(cuda_ctx *c, int d) {
#ifdef DP_HAVE_NCCL
  dev_ctx *x = &c->dev[d];
  if (!x->group_open) return DP_OK;
  x->group_open = false;
  return dp__cuda_nccl_issued(c, d, ncclGroupEnd(), "ncclGroupEnd");
#else
  (void)c, (void)d;
#endif
  return DP_OK;
}

/* One side of an NCCL pair on device `self`'s stream: the send when self
 * owns src, else the receive (ranks are logical devices). Both sides skip an
 * empty copy, so the counts stay matched. */
static dp_status nccl_side(cuda_ctx *c, int self, void *dst, const void *src, size_t bytes,
                           int sd, int dd) {
#ifdef DP_HAVE_NCCL
  dev_ctx *x = &c->dev[self];
  if (x->stage < 0)
    return DP_FAIL(DP_ERR_BACKEND,
                   "cuda transport: device %d moves data outside a stage "
                   "(dp__cuda_stage_begin was not called)",
                   self);
  if (!x->comm)
    return DP_FAIL(DP_ERR_BACKEND,
                   "cuda transport: device %d: the NCCL communicators were "
                   "aborted after an unmatched transfer; the context is unusable",
                   self);
  if (bytes == 0) return DP_OK;
  if (!x->group_open) {
    DP_NCCL_CHECK_D(self, x->comm, ncclGroupStart());
    x->group_open = true;
  }
  if (self == sd) {
    DP_NCCL_CHECK_D(self, x->comm, ncclSend(src, bytes, ncclUint8, dd, x->comm, x->stream));
    x->sent_n[dd]++;
    x->sent_b[dd] += bytes;
  } else {
    DP_NCCL_CHECK_D(self, x->comm, ncclRecv(dst, bytes, ncclUint8, sd, x->comm, x->stream));
    x->recv_n[sd]++;
    x->recv_b[sd] += bytes;
  }
  return DP_OK;
#else
  (void)dst, (void)src, (void)bytes, (void)sd, (void)dd;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda transport: device %d: this build has no NCCL",
                 self);
#endif
}

/* An NCCL pair: both endpoints in arenas of two different logical devices
 * (with DP_CUDA_NCCL every logical device has a GPU of its own). */
static bool nccl_pair(const cuda_ctx *c, int sd, int dd) {
  return c->nccl && sd >= 0 && dd >= 0 && sd != dd;
}

/* Across processes (c->world), the NCCL ranks (global devices) that send and
 * receive a copy's bytes: a device end's own, a host end's that of the device
 * executing the copy (each rank's host feeds its own devices). true when one
 * of them is another process's: the copy is an NCCL pair across processes,
 * this process's half enqueued by its end's thread (copy or peer). */
static bool cross_process(const cuda_ctx *c, const dp_op *op, int *from, int *to) {
  if (!c->world) return false;
  *from = op->src_dev >= 0 ? op->src_dev : op->device;
  *to = op->dst_dev >= 0 ? op->dst_dev : op->device;
  return *from != *to && (!is_local(c, *from) || !is_local(c, *to));
}

/* This process's half of a cross-process pair, on device dev's stream: only
 * the local end is resolved (the other is not in this address space). A host
 * end is the pinned staging arena, which NCCL accepts (device-accessible). */
static dp_status remote_side(cuda_ctx *c, dp_exec_env *e, int dev, const dp_op *op,
                             int from, int to) {
  dp_status s = use_device(c->dev[dev].phys);
  if (s != DP_OK) return s;
  if (dev == from)
    return nccl_side(c, dev, NULL,
                     dp__endpoint(e, op->src_dev, op->src_region, op->src_offset),
                     op->bytes, from, to);
  return nccl_side(c, dev, dp__endpoint(e, op->dst_dev, op->dst_region, op->dst_offset),
                   NULL, op->bytes, from, to);
}

/* A COPY op on device dev's thread (dev == op->device). The op names both
 * ends as (device, region, offset); they are resolved here, in this
 * process's arenas and staging memory. */
extern "C" dp_status dp__cuda_copy(void *tctx, dp_exec_env *e, int dev, const dp_op *op) {
  cuda_ctx *c = (cuda_ctx *)tctx;
  if (!c || dp__cuda_tl_ctx != c || dp__cuda_tl_dev != dev || !is_local(c, dev))
    return DP_FAIL(DP_ERR_BACKEND,
                   "cuda transport: copy for device %d on a thread that began no stage "
                   "of it: the executor must call dp__cuda_stage_begin first",
                   dev);
  int from, to;
  if (cross_process(c, op, &from, &to)) {
    if (dev != from && dev != to)
      return DP_FAIL(DP_ERR_INVALID,
                     "cuda transport: device %d executes a copy from device %d to device "
                     "%d of another process; it must be one of its ends",
                     dev, from, to);
    return remote_side(c, e, dev, op, from, to);
  }
  void *dst = dp__endpoint(e, op->dst_dev, op->dst_region, op->dst_offset);
  const void *src = dp__endpoint(e, op->src_dev, op->src_region, op->src_offset);
  dp_status s = use_device(c->dev[dev].phys);
  if (s != DP_OK) return s;
  int sd = op->src_dev, dd = op->dst_dev; /* DP_HOST (-1): the host */
  if (!nccl_pair(c, sd, dd)) return copy_on(c, dev, dst, src, op->bytes);
  /* peer() would have no side to play */
  if (dev != sd && dev != dd)
    return DP_FAIL(DP_ERR_INVALID,
                   "cuda transport: device %d executes a copy from device %d to "
                   "device %d; with NCCL a copy must be executed by an endpoint",
                   dev, sd, dd);
  return nccl_side(c, dev, dst, src, op->bytes, sd, dd);
}

/* The other endpoint's side of a copy (lib/core/backend.h): the NCCL send or
 * receive of an NCCL pair; nothing for any other copy, which copy() moves
 * one-sided. */
extern "C" dp_status dp__cuda_peer(void *tctx, dp_exec_env *e, int dev, const dp_op *op) {
  cuda_ctx *c = (cuda_ctx *)tctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "cuda transport: peer: no context");
  if (!is_local(c, dev))
    return DP_FAIL(DP_ERR_INVALID,
                   "cuda transport: peer on device %d, but this process has devices %d..%d",
                   dev, c->d0, c->d1 - 1);
  int sd = op->src_dev, dd = op->dst_dev, from = sd, to = dd;
  bool remote = cross_process(c, op, &from, &to);
  if (!remote && !nccl_pair(c, sd, dd)) return DP_OK;
  if (dev != from && dev != to)
    return DP_FAIL(DP_ERR_INVALID,
                   "cuda transport: peer on device %d for a copy from device %d "
                   "to device %d",
                   dev, from, to);
  if (dp__cuda_tl_ctx != c || dp__cuda_tl_dev != dev)
    return DP_FAIL(DP_ERR_BACKEND,
                   "cuda transport: peer for device %d on a thread that began "
                   "no stage of it (dp__cuda_stage_begin)",
                   dev);
  if (remote) return remote_side(c, e, dev, op, from, to);
  dp_status s = use_device(c->dev[dev].phys);
  if (s != DP_OK) return s;
  return nccl_side(c, dev, dp__endpoint(e, op->dst_dev, op->dst_region, op->dst_offset),
                   dp__endpoint(e, op->src_dev, op->src_region, op->src_offset), op->bytes,
                   sd, dd);
}

/* DP_OP_ALLREDUCE (config.fast_collectives) on device dev's thread. */
extern "C" dp_status dp__cuda_collective(void *tctx, dp_exec_env *e, int dev,
                                         const dp_op *op) {
  cuda_ctx *c = (cuda_ctx *)tctx;
  if (!c || !is_local(c, dev))
    return DP_FAIL(DP_ERR_INVALID,
                   "cuda transport: collective on device %d, but this process has "
                   "devices %d..%d",
                   dev, c ? c->d0 : 0, c ? c->d1 - 1 : -1);
  dp_status s = use_device(c->dev[dev].phys);
  if (s == DP_OK) s = close_group(c, dev);
  if (s != DP_OK) return s;
  return allreduce_op(c, &c->dev[dev], e, op);
}

/* ---- stage and step hooks -------------------------------------------------------- */

static dp_status check_dev(const cuda_ctx *c, int dev, const char *who) {
  if (!c) return DP_FAIL(DP_ERR_INVALID, "%s: no context", who);
  if (!is_local(c, dev))
    return DP_FAIL(DP_ERR_INVALID, "%s: device %d, but this process has devices %d..%d",
                   who, dev, c->d0, c->d1 - 1);
  return DP_OK;
}

extern "C" dp_status dp__cuda_stage_begin(void *bctx, int dev, int stage) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  dp_status s = check_dev(c, dev, "dp__cuda_stage_begin");
  if (s != DP_OK) return s;
  if (stage < 0) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_stage_begin: stage %d", stage);
  dev_ctx *x = &c->dev[dev];
  if ((s = use_device(x->phys)) != DP_OK) return s;
  dp__cuda_tl_ctx = c;
  dp__cuda_tl_dev = dev;
  x->stage = stage;
  x->touched[stage & 1] = 0;
  if (c->debug_delay_us && (uint64_t)dev == c->step % (uint64_t)c->n)
    DP_CUDA_CHECK_D(dev, dp_k_debug_spin(x->stream, c->debug_delay_us));
  if (stage == 0) return DP_OK;
  int q = (stage - 1) & 1;
  for (int X = c->d0; X < c->d1; X++)
    if (X != dev && ((c->dev[X].touched[q] >> dev) & 1))
      DP_CUDA_CHECK_D(dev, cudaStreamWaitEvent(x->stream, c->dev[X].ev[q], 0));
  return DP_OK;
}

extern "C" dp_status dp__cuda_stage_end(void *bctx, int dev, int stage) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  dp_status s = check_dev(c, dev, "dp__cuda_stage_end");
  if (s != DP_OK) return s;
  dev_ctx *x = &c->dev[dev];
  if (x->stage != stage)
    return DP_FAIL(DP_ERR_BACKEND,
                   "dp__cuda_stage_end: device %d ends stage %d but began %d", dev, stage,
                   x->stage);
  if ((s = use_device(x->phys)) != DP_OK) return s;
  if ((s = close_group(c, dev)) != DP_OK) return s; /* before the stage's event */
  DP_CUDA_CHECK_D(dev, cudaEventRecord(x->ev[stage & 1], x->stream));
  return DP_OK;
}

void dp__cuda_host_step(cuda_ctx *c, uint64_t step) {
  const dp_config *cf = &c->plan->cfg;
  dp_cuda_step_scalars sc;
  memset(&sc, 0, sizeof sc);
  sc.step = step;
  sc.first = step == 0;
  /* lib/cpu/backend.c's opt_consts_of, the same way, with the rate in effect */
  float lr = c->lr;
  sc.lr = lr;
  sc.decay = 1.0f - lr * cf->weight_decay;
  sc.loss_denom = c->loss_denom;
  sc.loss_inv = c->loss_inv;
  sc.mu = c->momentum; /* dp_set_momentum's, the config's at first */
  sc.one_minus_mu = 1.0f - c->momentum;
  if (cf->optimizer == DP_OPT_ADAMW || cf->optimizer == DP_OPT_ADAM) {
    double t = (double)step + 1.0;
    double bc1 = 1.0 - pow(c->momentum, t), bc2 = 1.0 - pow(cf->beta2, t);
    sc.step_size = (float)(lr / bc1);
    sc.bc2_sqrt = (float)sqrt(bc2);
  }
  /* The previous step was synchronised by dp__cuda_step_end: no copy reads
   * the block while it is written. */
  *c->host_sc = sc;
  c->step = step;
  c->grad_norm = NAN;
  dp__cuda_tl_ctx = nullptr;
  dp__cuda_tl_dev = -1;
  for (int d = c->d0; d < c->d1; d++) {
    dev_ctx *x = &c->dev[d];
    x->touched[0] = x->touched[1] = 0;
    x->stage = -1;
    x->accum_call = false;
  }
  dp__cuda_reset_counts(c);
}

void dp__cuda_reset_counts(cuda_ctx *c) {
  for (int d = c->d0; d < c->d1; d++) {
    dev_ctx *x = &c->dev[d];
    memset(x->sent_n, 0, sizeof x->sent_n);
    memset(x->sent_b, 0, sizeof x->sent_b);
    memset(x->recv_n, 0, sizeof x->recv_n);
    memset(x->recv_b, 0, sizeof x->recv_b);
    x->coll_n = 0;
  }
}

bool dp__cuda_unmatched(const cuda_ctx *c, int *from, int *to) {
  /* pairs within this process; one with another rank's device is paired by
   * NCCL there, and a lost half ends in the step's timeout */
  for (int a = c->d0; a < c->d1; a++)
    for (int b = c->d0; b < c->d1; b++) {
      const dev_ctx *x = &c->dev[a], *y = &c->dev[b];
      if (x->sent_n[b] != y->recv_n[a] || x->sent_b[b] != y->recv_b[a]) {
        *from = a;
        *to = b;
        return true;
      }
    }
  return false;
}

extern "C" dp_status dp__cuda_step_begin(void *bctx, uint64_t step) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_step_begin: no context");
  dp__cuda_host_step(c, step);
  for (int d = c->d0; d < c->d1; d++) {
    dev_ctx *x = &c->dev[d];
    dp_status s = use_device(x->phys);
    if (s != DP_OK) return s;
    DP_CUDA_CHECK_D(d, dp_k_reset_header(x->stream, x->hdr));
    /* From pinned memory: in a capture this becomes a copy node that reads
     * the block when the graph runs, which dp__cuda_graph_launch refills. */
    DP_CUDA_CHECK_D(d,
                    cudaMemcpyAsync(&x->hdr->sc, c->host_sc, sizeof(dp_cuda_step_scalars),
                                    cudaMemcpyHostToDevice, x->stream));
  }
  if (c->debug_fault_step && step + 1 == c->debug_fault_step && c->d1 > c->d0)
    DP_CUDA_CHECK_D(c->d0, dp_k_debug_fault(c->dev[c->d0].stream));
  return DP_OK;
}

#ifdef DP_HAVE_NCCL
/* Before waiting on any stream: an NCCL send without its receive (or the
 * reverse) never completes, and neither would the wait. That happens when a
 * run stopped on one side of a pair (a failed op). Then the communicators are
 * aborted, which ends their kernels, and the context can no longer move data
 * between GPUs. */
static void nccl_abort_all(cuda_ctx *c) {
  for (int d = c->d0; d < c->d1; d++) /* NCCL aborts a clique from one thread */
    if (c->dev[d].comm && ncclCommAbort(c->dev[d].comm) != ncclSuccess)
      (void)cudaGetLastError();
  for (int d = c->d0; d < c->d1; d++) c->dev[d].comm = NULL;
}

static dp_status nccl_settle(cuda_ctx *c) {
  int a = 0, b = 0;
  if (!c->nccl) return DP_OK;
  for (int d = c->d0 + 1; d < c->d1; d++) /* a collective waits for every rank */
    if (c->dev[d].coll_n != c->dev[c->d0].coll_n) {
      nccl_abort_all(c);
      return DP_FAIL(
          DP_ERR_BACKEND,
          "NCCL: device %d entered %llu all-reduces and device %d %llu: a run stopped "
          "part way through a collective; the NCCL communicators were aborted so "
          "that nothing waits forever, and the context can no longer move data "
          "between GPUs",
          c->d0, (unsigned long long)c->dev[c->d0].coll_n, d,
          (unsigned long long)c->dev[d].coll_n);
    }
  if (!dp__cuda_unmatched(c, &a, &b)) return DP_OK;
  const dev_ctx *x = &c->dev[a], *y = &c->dev[b];
  nccl_abort_all(c);
  return DP_FAIL(
      DP_ERR_BACKEND,
      "NCCL: device %d sent %llu transfers (%llu bytes) to device %d, which received "
      "%llu (%llu bytes): a run stopped between the two sides of a copy; the NCCL "
      "communicators were aborted so that nothing waits forever, and the context can "
      "no longer move data between GPUs",
      a, (unsigned long long)x->sent_n[b], (unsigned long long)x->sent_b[b], b,
      (unsigned long long)y->recv_n[a], (unsigned long long)y->recv_b[a]);
}

static void nccl_abort_one(cuda_ctx *c, int d) {
  if (c->dev[d].comm && ncclCommAbort(c->dev[d].comm) != ncclSuccess)
    (void)cudaGetLastError();
  c->dev[d].comm = NULL;
}

/* A call on an NCCL communicator: an error fails the context's transfers; on
 * a non-blocking communicator (across processes) ncclInProgress means the
 * call is still being issued (a connection to a peer being set up), and NCCL
 * must be polled until it is before anything else goes on the stream, within
 * the step's timeout: a peer that never comes then ends in an error, with the
 * communicators aborted, instead of a hang in the call. */
dp_status dp__cuda_nccl_issued(cuda_ctx *c, int d, ncclResult_t r, const char *call) {
  ncclComm_t comm = c->dev[d].comm;
  double deadline = dp__cuda_now() + 1e-3 * c->timeout_ms;
  for (long polls = 0; r == ncclInProgress; polls++) {
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) r = ncclSystemError;
    if (r != ncclInProgress) break;
    if ((polls & 255) == 255 && dp__cuda_now() > deadline) {
      nccl_abort_one(c, d); /* this thread's; the others' are in use (finish ends them) */
      c->failed = true;
      return DP_FAIL(DP_ERR_BACKEND,
                     "device %d: %s was still in progress after %d ms (a peer process "
                     "that never came?); the NCCL communicators were aborted and the "
                     "context is unusable",
                     d, call, c->timeout_ms);
    }
    struct timespec ts = {0, polls < 1000 ? 1000 : 100000};
    nanosleep(&ts, NULL);
  }
  if (r == ncclSuccess) return DP_OK;
  const char *l = ncclGetLastError(comm);
  (void)cudaGetLastError();
  if (c->world) { /* a peer process may wait on this one forever: end it */
    nccl_abort_one(c, d);
    c->failed = true;
  }
  return DP_FAIL(DP_ERR_BACKEND, "device %d: %s: %s (last NCCL error: %s)", d, call,
                 ncclGetErrorString(r), l && *l ? l : "none");
}

/* After the streams: errors NCCL found on its own (a peer that vanished). */
static dp_status nccl_async_errors(cuda_ctx *c) {
  if (!c->nccl) return DP_OK;
  for (int d = c->d0; d < c->d1; d++) {
    ncclComm_t comm = c->dev[d].comm;
    ncclResult_t r = ncclSuccess;
    if (!comm) continue;
    DP_NCCL_CHECK_D(d, comm, ncclCommGetAsyncError(comm, &r));
    if (r != ncclSuccess && r != ncclInProgress) {
      const char *l = ncclGetLastError(comm);
      return DP_FAIL(DP_ERR_BACKEND, "device %d: NCCL: %s (last NCCL error: %s)", d,
                     ncclGetErrorString(r), l && *l ? l : "none");
    }
  }
  return DP_OK;
}
#endif

/* Waits for device x's stream without blocking inside the driver: polls
 * cudaStreamQuery and, between polls, NCCL's asynchronous errors (a peer that
 * failed), until `deadline`. On an NCCL error or the deadline the
 * communicators are aborted, which ends any NCCL kernel still waiting for its
 * peer, so a lost or stalled peer becomes an error instead of a hang; a
 * stalled kernel of our own is reported at the deadline (the context is then
 * unusable, c->failed). */
static dp_status wait_stream(cuda_ctx *c, int d, double deadline) {
  dev_ctx *x = &c->dev[d];
  double spin_until = dp__cuda_now() + 2e-3 + 2.0 * c->last_wait_s;
  bool nap = false;
  for (long polls = 0;; polls++) {
    cudaError_t e = cudaStreamQuery(x->stream);
    if (e == cudaSuccess) return DP_OK;
    if (e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      c->failed = true;
      return DP_FAIL(DP_ERR_BACKEND, "device %d (GPU %d): cudaStreamQuery: %s: %s", d,
                     x->phys, cudaGetErrorName(e), cudaGetErrorString(e));
    }
#ifdef DP_HAVE_NCCL
    if (c->nccl && (polls & 63) == 63) {
      dp_status ns = nccl_async_errors(c);
      if (ns != DP_OK) {
        nccl_abort_all(c);
        c->failed = true;
        return ns;
      }
    }
#endif
    if ((polls & 1023) == 1023 && dp__cuda_now() > deadline) {
#ifdef DP_HAVE_NCCL
      if (c->nccl) nccl_abort_all(c);
#endif
      c->failed = true;
      return DP_FAIL(DP_ERR_BACKEND,
                     "device %d (GPU %d): the step did not finish within %d ms (a stalled "
                     "kernel, or a transfer whose other side never came)%s; the context is "
                     "unusable",
                     d, x->phys, c->timeout_ms,
                     c->nccl ? "; the NCCL communicators were aborted" : "");
    }
    /* past twice the last step's wait: a long stall, not a step's end */
    if (!nap && (polls & 63) == 63) nap = dp__cuda_now() > spin_until;
    if (nap) {
      struct timespec ts = {0, 50000};
      nanosleep(&ts, NULL);
    }
  }
}

/* Waits for everything enqueued so far on this process's devices and reads
 * their status words back: dp__cuda_step_end, and mid-step dp__cuda_step_sync
 * (which leaves the step open: the stage bookkeeping and NCCL counts go on). */
static dp_status finish(cuda_ctx *c, float *loss, dp_status first);

extern "C" float dp__cuda_grad_norm(const void *bctx) {
  return bctx ? ((const cuda_ctx *)bctx)->grad_norm : NAN;
}

extern "C" dp_status dp__cuda_step_sync(void *bctx, float *loss) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  if (loss) *loss = 0.0f;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_step_sync: no context");
  if (c->capturing)
    return DP_FAIL(DP_ERR_BACKEND, "dp__cuda_step_sync: a graph capture is open");
  return finish(c, loss, DP_OK);
}

extern "C" dp_status dp__cuda_step_end(void *bctx, float *loss) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  if (loss) *loss = 0.0f;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_step_end: no context");
  dp_status first = DP_OK; /* its text stays the thread's last error */
  if (c->capturing) {      /* a stream wait would invalidate the capture anyway */
    dp__cuda_capture_abort(c);
    first =
        DP_FAIL(DP_ERR_BACKEND, "dp__cuda_step_end: a graph capture was still open; it was "
                                "dropped (call dp__cuda_capture_end or _abort first)");
  }
  return finish(c, loss, first);
}

static dp_status finish(cuda_ctx *c, float *loss, dp_status first) {
  if (c->failed) { /* during the run (an NCCL call on a device's thread): end it all */
#ifdef DP_HAVE_NCCL
    nccl_abort_all(c);
#endif
    if (first == DP_OK)
      first =
          DP_FAIL(DP_ERR_BACKEND,
                  "the context failed (an NCCL transfer or the device did not complete; "
                  "the step's first error says which); it is unusable");
    return first;
  }
#ifdef DP_HAVE_NCCL
  dp_status ns = nccl_settle(c);
  if (ns != DP_OK && first == DP_OK) first = ns;
#endif
  /* Read every header back and wait for every stream, even after a failure,
   * so that nothing of this step is still running when we return. After a
   * graph launch the other streams wait for device 0's, which the graph ran
   * on (dp__cuda_graph_launch), so these read-backs come after the graph. */
  double t0 = dp__cuda_now(), deadline = t0 + 1e-3 * c->timeout_ms;
  for (int pass = 0; pass < 2; pass++)
    for (int d = c->d0; d < c->d1; d++) {
      dev_ctx *x = &c->dev[d];
      cudaError_t e = cudaSetDevice(x->phys);
      const char *call = "cudaSetDevice";
      if (e == cudaSuccess && pass == 0) {
        e = cudaMemcpyAsync(&c->host_hdr[d], x->hdr, sizeof(dp_cuda_header),
                            cudaMemcpyDeviceToHost, x->stream);
        call = "cudaMemcpyAsync(status words)";
      } else if (e == cudaSuccess) {
        /* after a timeout, the other streams get no more time either */
        dp_status ws = c->failed ? DP_OK : wait_stream(c, d, deadline);
        if (ws != DP_OK && first == DP_OK) first = ws;
        continue;
      }
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        c->failed = true;
        if (first == DP_OK) {
          first = DP_FAIL(DP_ERR_BACKEND, "device %d (GPU %d): %s: %s: %s", d, x->phys,
                          call, cudaGetErrorName(e), cudaGetErrorString(e));
        }
      }
    }
  if (c->d1 > c->d0 && cudaSetDevice(c->dev[c->d0].phys) != cudaSuccess)
    (void)cudaGetLastError();
#ifdef DP_HAVE_NCCL
  if (first == DP_OK) first = nccl_async_errors(c);
#endif
  if (first != DP_OK) return first;
  c->last_wait_s = dp__cuda_now() - t0; /* wait_stream's spin time next step */
  const dp_cuda_header *h = c->host_hdr;
  if (loss && c->d0 == 0) *loss = h[0].loss; /* another rank's comes by agreement */
  bool accum_call = false, bad_label = false;
  for (int d = c->d0; d < c->d1; d++) {
    accum_call |= c->dev[d].accum_call;
    bad_label |= (h[d].status[d] & DP_CUDA_ST_LABEL) != 0;
  }
  /* The norm as the cpu backend reports it: a step refused by its loss or a
   * label never reached its clipping there (NaN) */
  if (c->d0 == 0)
    c->grad_norm = (h[0].status[0] & DP_CUDA_ST_LOSS) || bad_label ? NAN : h[0].grad_norm;
  /* In schedule order: the loss (device 0), labels (the loss ops), then the
   * gradient checks (the lowest index of any device's shard). */
  if (c->d0 == 0 && (h[0].status[0] & DP_CUDA_ST_LOSS))
    return DP_FAIL(DP_ERR_NONFINITE, "the loss is %s; the step was not applied",
                   isnan(h[0].loss) ? "NaN" : "infinite");
  unsigned int bad_row = ~0u;
  unsigned long long bad_grad = ~0ull, bad_update = ~0ull;
  for (int d = c->d0; d < c->d1; d++) {
    if ((h[d].status[d] & DP_CUDA_ST_LABEL) && h[d].bad_label_row < bad_row)
      bad_row = h[d].bad_label_row;
    if ((h[d].status[d] & DP_CUDA_ST_GRAD) && h[d].bad_grad < bad_grad)
      bad_grad = h[d].bad_grad;
    if ((h[d].status[d] & DP_CUDA_ST_UPDATE) && h[d].bad_update < bad_update)
      bad_update = h[d].bad_update;
  }
  /* the kernels count a sequence's positions as rows */
  unsigned P = (unsigned)dp_model_positions(&c->plan->model);
  if (bad_row != ~0u && P > 1)
    return DP_FAIL(DP_ERR_RANGE,
                   "the label of row %u position %u is outside 0..%d; the step was not "
                   "applied",
                   bad_row / P, bad_row % P,
                   dp_model_output_width(&c->plan->model) / (int)P - 1);
  if (bad_row != ~0u)
    return DP_FAIL(DP_ERR_RANGE,
                   "the label of row %u is outside 0..%d; the step was not applied",
                   bad_row, dp_model_output_width(&c->plan->model) - 1);
  if (bad_grad != ~0ull)
    return DP_FAIL(DP_ERR_NONFINITE, "gradient %llu is %s; %s", bad_grad >> 1,
                   (bad_grad & 1) ? "infinite" : "NaN",
                   accum_call ? "the call was not accumulated"
                              : "the step was not applied");
  if (bad_update != ~0ull)
    return DP_FAIL(DP_ERR_NONFINITE,
                   "the update would make parameter %llu or its optimizer state "
                   "non-finite (lr %g, weight_decay %g); the step was not applied",
                   bad_update, (double)c->lr, (double)c->plan->cfg.weight_decay);
  return DP_OK;
}
