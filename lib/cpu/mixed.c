/* bf16 mixed precision on the cpu backend (config.precision DP_PRECISION_BF16,
 * docs/PRECISION.md). The activations between layers and their gradients are
 * bf16 in the ACTIVATIONS region (dp_span.esz 2); the model's inputs, outputs,
 * output gradients, statistics, parameters and gradients stay fp32.
 *
 * A linear layer multiplies bf16 operands with fp32 accumulation (cpu/bf16.h:
 * the AVX512-BF16 dot product's arithmetic on every tier): its weights and
 * bias rounded from the fp32 masters as it reads them, its output rounded to
 * bf16, its weight and bias gradients rounded to bf16 and kept in fp32, as
 * torch.autocast's bf16 linear and the cast back to the fp32 parameter give.
 * Every other layer runs its fp32 op (lib/cpu/backend.c) on fp32 copies of its
 * bf16 operands in the workspace's shadow area and rounds what it writes back
 * to bf16 (round to nearest even), but for gelu, layernorm and the residual
 * blocks' adds, which run on the bf16 tensors with the same bits (below:
 * "the bf16 tensors themselves"); conv2d reads its weights rounded to bf16
 * and rounds its weight gradients, as autocast's bf16 convolution. Batchnorm
 * keeps its weight gradients fp32 (autocast's batch_norm on a bf16 input with
 * fp32 weights: an fp32 computation, a bf16 output), and its sync statistics
 * ops read fp32 copies too (dp__mixed_bn_sums).
 *
 * WORKSPACE of a bf16 plan (ws_layout): the GEMMs' packing and the fp32 ops'
 * own workspace from offset 0; the forward's packed bf16 weights (several
 * micro-batches, for the layers whose segment is one layer); the shadow area,
 * one layer op's fp32 copies. The planner sizes the shadow area exactly: the
 * most any of the device's layer ops takes, found by running each op's takes
 * without data on the operands the core gives it (shadow_need), so the
 * arena's high water is the plan's end (docs/PLANNER.md). */
#include "cpu/bf16.h"
#include "cpu/gelu.h"
#include "cpu/gemm.h"
#include "cpu/layer.h"
#include "util/bf16.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

typedef struct {
  size_t gemm;      /* [0, gemm): packing buffers, conv's and attention's workspace */
  size_t packed_at; /* the forward's packed weights, packed bytes */
  size_t below;     /* the end of what comes before the shadow area */
  size_t shadow_at; /* the shadow area to the end (total) */
  size_t total;     /* the region's size (planned: below, or shadow_at + the need) */
} ws_layout;

static size_t up64(size_t b) { return (b + 63) / 64 * 64; }
static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

/* The bf16 GEMMs of a linear layer on micro-batches of up to mb_rows rows. */
static size_t linear_gemm_bytes(const dp_layer *l, int mb_rows, bool training) {
  int n = mb_rows * dp__positions(l), in = dp__pos_in(l), out = dp__pos_out(l);
  size_t w = dp__gemm_bf16_workspace_bytes(n, out, in);
  if (training) {
    w = max_z(w, dp__gemm_bf16_workspace_bytes(out, in, n));
    w = max_z(w, dp__gemm_bf16_workspace_bytes(n, in, out));
  }
  return w;
}

/* A layer without parameters runs its shadowed op on chunks of rows of at most
 * this many bytes of fp32 copies (its rows are independent; a layer with
 * parameters writes their gradients for all its rows at once, so runs whole). */
#define SHADOW_CHUNK_BYTES ((size_t)256 << 10)

/* fp32 bytes of one row's copies: input and input gradient, output, output
 * gradient and skip (forward: input, skip and output). */
static size_t shadow_row_bytes(const dp_layer *l, bool training) {
  size_t in = (size_t)l->in * 4, out = (size_t)l->out * 4;
  return training ? 2 * in + 3 * out : in + 2 * out;
}

/* The rows of one chunk of layer l's shadowed op (<= rows); batchnorm's
 * statistics are the whole micro-batch's. */
static int shadow_chunk_rows(const dp_layer *l, int rows, bool training) {
  if (l->n_params > 0 || l->kind == DP_LAYER_BATCHNORM) return rows;
  size_t r = SHADOW_CHUNK_BYTES / shadow_row_bytes(l, training);
  return r < 1 ? 1 : r < (size_t)rows ? (int)r : rows;
}

static size_t packed_wt_bytes(const dp_layer *l) {
  return dp__gemm_bf16_packed_b_bytes(dp__pos_in(l), dp__pos_out(l));
}

/* Device d's layout up to the shadow area: the packed weights' room only with
 * several micro-batches, for the layers whose forward packs them (packed_wt:
 * a segment of one layer). total is left to the caller. */
static ws_layout layout_of(const dp_plan *p, int d) {
  const dp_model *m = &p->model;
  int mb_rows = p->act[d].mb_rows, n_mb = p->split.dev_mb0[d + 1] - p->split.dev_mb0[d];
  bool training = !p->cfg.inference;
  size_t gemm = dp__model_workspace_bytes(m, mb_rows, training);
  for (int i = 0; i < m->n_layers; i++) {
    const dp_layer *l = &m->layers[i];
    if (l->kind == DP_LAYER_LINEAR)
      gemm = max_z(gemm, linear_gemm_bytes(l, mb_rows, training));
  }
  size_t packed = n_mb > 1 ? dp__layer_major_linear_max(p, packed_wt_bytes) : 0;
  ws_layout L = {.gemm = gemm, .packed_at = up64(gemm)};
  L.below = packed ? L.packed_at + packed : gemm;
  L.shadow_at = up64(L.below);
  return L;
}

/* The layout this op's device was planned with, the shadow area to the
 * region's end; a region without room for what comes before the shadow area
 * fails the op (the shadow area's own takes are checked as they are made). */
static dp_status op_layout(const lctx *c, ws_layout *L) {
  const dp_plan *p = c->p;
  *L = layout_of(p, c->d);
  L->total = p->regions[c->d][DP_REGION_WORKSPACE].size;
  if (L->total < L->below)
    return DP_FAIL(DP_ERR_BACKEND,
                   "layer %d: the plan's workspace (%zu bytes) is too small for bf16 "
                   "(%zu needed)",
                   c->i, L->total, L->below);
  return DP_OK;
}

/* ---- the shadow area: fp32 copies of one op's bf16 operands ---- */

#define SHADOW_MAX 8
typedef struct {
  size_t at, end;
  size_t hi; /* the end of the last take: what the op's copies reach */
  bool dry;  /* sizing (shadow_need): takes without data */
  dp_span from[SHADOW_MAX], to[SHADOW_MAX];
  int n;
} shadow;

static shadow shadow_begin(const ws_layout *L) {
  return (shadow){.at = L->shadow_at, .end = L->total, .hi = L->shadow_at};
}

/* bytes of the shadow area, as a WORKSPACE span (region -1: no room). Each
 * take starts at 64 bytes; the area ends where the last one does. */
static dp_span shadow_take(shadow *sh, size_t bytes) {
  if (sh->at + bytes > sh->end) return DP_SPAN_NONE;
  dp_span s = {.region = DP_REGION_WORKSPACE, .off = sh->at, .bytes = bytes, .esz = 4};
  sh->hi = sh->at + bytes;
  sh->at += up64(bytes);
  return s;
}

static bool same_span(dp_span a, dp_span b) {
  return a.region == b.region && a.off == b.off && a.bytes == b.bytes;
}

/* The fp32 copy of operand s (none for none); fill: with its values (bf16
 * widened exactly; an fp32 operand copied, and rounded to bf16 when `round`).
 * One copy per buffer: a span the op names twice (a view's input and output
 * gradient) maps to one copy. */
static bool widen(const lctx *c, shadow *sh, dp_span s, bool fill, bool round,
                  dp_span *out) {
  *out = s;
  if (s.region < 0) return true;
  for (int k = 0; k < sh->n; k++)
    if (same_span(sh->from[k], s)) {
      *out = sh->to[k];
      return true;
    }
  size_t n = s.bytes / (size_t)s.esz;
  dp_span w = shadow_take(sh, n * 4);
  if (w.region < 0 || sh->n == SHADOW_MAX) return false;
  if (sh->dry) fill = false;
  if (fill && s.esz == 2)
    dp__bf16_to_f32_n((const dp_bf16 *)ptr(c, s), ptr(c, w), n);
  else if (fill)
    memcpy(ptr(c, w), ptr(c, s), n * 4);
  if (fill && round && s.esz == 4) dp__bf16_round_f32_n(ptr(c, w), n);
  sh->from[sh->n] = s;
  sh->to[sh->n++] = w;
  *out = w;
  return true;
}

/* What the op wrote to copy w goes back to s, rounded to bf16 (stored as bf16,
 * or as fp32 values for an fp32 tensor: the model's output). */
static void narrow(const lctx *c, dp_span w, dp_span s) {
  if (s.region < 0) return;
  size_t n = s.bytes / (size_t)s.esz;
  if (s.esz == 2) {
    dp__bf16_from_f32_n(ptr(c, w), (dp_bf16 *)ptr(c, s), n);
    return;
  }
  memcpy(ptr(c, s), ptr(c, w), n * 4);
  dp__bf16_round_f32_n(ptr(c, s), n);
}

static dp_status no_room(const lctx *c) {
  return DP_FAIL(DP_ERR_BACKEND, "layer %d: the bf16 shadow area is too small", c->i);
}

/* Rows [r0, r0 + n) of a span of `rows` rows (none stays none). */
static dp_span rows_of(dp_span s, int rows, int r0, int n) {
  if (s.region < 0 || rows <= 0) return s;
  size_t rb = s.bytes / (size_t)rows;
  s.off += (size_t)r0 * rb;
  s.bytes = (size_t)n * rb;
  return s;
}

/* The context of rows [r0, r0 + n) of c's micro-batch (dropout keys its rows
 * by local). */
static lctx chunk_of(const lctx *c, int r0, int n) {
  lctx k = *c;
  dp_layer_operands *o = &k.o;
  o->in = rows_of(c->o.in, c->rows, r0, n);
  o->out = rows_of(c->o.out, c->rows, r0, n);
  o->din = rows_of(c->o.din, c->rows, r0, n);
  o->dout = rows_of(c->o.dout, c->rows, r0, n);
  o->stats = rows_of(c->o.stats, c->rows, r0, n);
  o->skip = rows_of(c->o.skip, c->rows, r0, n);
  o->rows = k.rows = n;
  o->local = k.local = c->local + r0;
  return k;
}

/* The copies of layer c's operands in sh, their spans into *s (filled unless
 * sh is dry): what shadow_one runs the fp32 op on. */
static bool shadow_setup(const lctx *c, shadow *sh, lctx *s, bool bwd) {
  bool ok = true, conv = c->l->kind == DP_LAYER_CONV2D;
  /* a residual block's begin adds to its input's gradient in place */
  bool din_read = c->l->kind == DP_LAYER_RESIDUAL;
  /* autocast's bf16 convolution rounds the model's fp32 input; the loss's fp32
   * gradient reaches a layer's bf16 output rounded (the cast's backward), and
   * so the begin of a block that ends the model (its skip: that gradient) */
  ok &= widen(c, sh, c->o.in, true, conv, &s->o.in);
  ok &= widen(c, sh, c->o.skip, true, bwd, &s->o.skip);
  s->o.dskip = DP_SPAN_NONE; /* a block end's: copied from din after (dp__mixed_backward) */
  /* the backward reads its output only for these (dp__cpu_backward); else it
   * has none: its bytes may be the output gradient's by then (the planner
   * reuses dead activations), whose copy must not be the output's */
  if (!bwd || dp__layer_needs_output(c->l))
    ok &= widen(c, sh, c->o.out, bwd, false, &s->o.out);
  else
    s->o.out = DP_SPAN_NONE;
  if (bwd) {
    ok &= widen(c, sh, c->o.din, din_read, false, &s->o.din);
    ok &= widen(c, sh, c->o.dout, true, true, &s->o.dout);
  }
  if (conv) { /* autocast's bf16 convolution: the weights rounded */
    s->o.params = shadow_take(sh, c->o.params.bytes);
    ok &= s->o.params.region >= 0;
    if (ok && !sh->dry) {
      memcpy(ptr(c, s->o.params), ptr(c, c->o.params), c->o.params.bytes);
      dp__bf16_round_f32_n(ptr(c, s->o.params), c->o.params.bytes / 4);
    }
  }
  return ok;
}

/* Layer c's fp32 op on fp32 copies of its bf16 operands (forward, or backward
 * with grads), then its outputs rounded back. */
static dp_status shadow_one(const lctx *c, const ws_layout *L, float *grads) {
  shadow sh = shadow_begin(L);
  lctx s = *c;
  bool bwd = grads != NULL, conv = c->l->kind == DP_LAYER_CONV2D;
  if (!shadow_setup(c, &sh, &s, bwd)) return no_room(c);
  s.o.workspace.bytes = L->gemm;
  dp_status st = bwd ? dp__cpu_backward(&s, grads) : dp__cpu_forward(&s);
  if (st) return st;
  if (!bwd) {
    narrow(c, s.o.out, c->o.out);
    return DP_OK;
  }
  narrow(c, s.o.din, c->o.din);
  if (conv) dp__bf16_round_f32_n(grads + c->l->param_off, c->l->n_params);
  return DP_OK;
}

/* shadow_one on chunks of rows (a layer with parameters: all at once). */
static dp_status shadow_run(const lctx *c, float *grads) {
  ws_layout L;
  dp_status st = op_layout(c, &L);
  int n = shadow_chunk_rows(c->l, c->rows, !c->p->cfg.inference);
  for (int r0 = 0; !st && r0 < c->rows; r0 += n) {
    lctx k = chunk_of(c, r0, c->rows - r0 < n ? c->rows - r0 : n);
    st = shadow_one(&k, &L, grads);
  }
  return st;
}

/* ---- linear: bf16 GEMMs ---- */

/* How an operand span is read (bf16, or fp32 rounded as it is read) and how a
 * result is stored (bf16, or fp32 holding the bf16 value). */
static dp_bf16_store operand_store(dp_span s) {
  return s.esz == 2 ? DP_BF16_STORE_BF16 : DP_BF16_STORE_F32;
}
static dp_bf16_store result_store(dp_span s) {
  return s.esz == 2 ? DP_BF16_STORE_BF16 : DP_BF16_STORE_F32_ROUNDED;
}

static void *gemm_ws(const lctx *c, const ws_layout *L, int M, int N, int K) {
  size_t need = dp__gemm_bf16_workspace_bytes(M, N, K);
  if (need == 0 || need > L->gemm) return NULL;
  return dp__region_ptr(c->e, c->d, DP_REGION_WORKSPACE);
}

/* W^T packed once per step for all of the device's micro-batches (the forward
 * runs layer by layer: one buffer serves every layer; micro-batch 0 packs it),
 * rounded to bf16 from the fp32 masters; NULL with one micro-batch, or when
 * the forward goes micro-batch by micro-batch (a segment, a recompute). */
static const void *packed_wt(const lctx *c, const ws_layout *L, const float *w) {
  const dp_plan *p = c->p;
  int in = dp__pos_in(c->l), out = dp__pos_out(c->l);
  if (p->split.dev_mb0[c->d + 1] - p->split.dev_mb0[c->d] < 2) return NULL;
  if (!dp__forward_layer_major(p, c->op)) return NULL;
  void *dst =
      (unsigned char *)dp__region_ptr(c->e, c->d, DP_REGION_WORKSPACE) + L->packed_at;
  if (c->mb == 0) dp__gemm_bf16_pack_b(1, in, out, w, in, DP_BF16_STORE_F32, dst);
  return dst;
}

static dp_status linear_forward(const lctx *c) {
  const dp_layer *l = c->l;
  int n = c->rows * dp__positions(l), in = dp__pos_in(l), out = dp__pos_out(l);
  ws_layout L;
  dp_status st = op_layout(c, &L);
  if (st) return st;
  shadow sh = shadow_begin(&L);
  const float *w = layer_params(c); /* (out, in), then the bias */
  dp_gemm_epilogue ep = {.act = DP_GEMM_ACT_NONE};
  if (l->bias) { /* autocast casts the bias too */
    dp_span b = shadow_take(&sh, (size_t)out * 4);
    if (b.region < 0) return no_room(c);
    memcpy(ptr(c, b), w + (size_t)out * in, (size_t)out * 4);
    dp__bf16_round_f32_n(ptr(c, b), (size_t)out);
    ep.bias = ptr(c, b);
  }
  dp_span ys = c->o.out;
  if (dp__relu_fused(c->p, c->i + 1)) { /* straight into the relu's output */
    lctx r = at_layer(c, c->i + 1);
    ys = r.o.out;
    ep.act = DP_GEMM_ACT_RELU;
  }
  const void *x = ptr(c, c->o.in), *pk = packed_wt(c, &L, w);
  void *ws = gemm_ws(c, &L, n, out, in);
  if (pk)
    dp__gemm_bf16_pb(0, 1, n, out, in, x, in, operand_store(c->o.in), pk, ptr(c, ys), out,
                     result_store(ys), &ep, ws);
  else
    dp__gemm_bf16(0, 1, n, out, in, x, in, operand_store(c->o.in), w, in, DP_BF16_STORE_F32,
                  ptr(c, ys), out, result_store(ys), &ep, ws);
  return DP_OK;
}

/* The relu's backward in place on a bf16 gradient: its output y <= 0 gives 0.
 * Branch-free with the inline widening, so it vectorises (gemm.h: DP_SIMD_FN). */
static inline DP_SIMD_BODY int relu_mask_bf16_body(const dp_bf16 *restrict y,
                                                   dp_bf16 *restrict dx, size_t n) {
  for (size_t k = 0; k < n; k++) {
    dp_bf16 g = dx[k];
    dx[k] = dp__bf16_widen(y[k]) <= 0.0f ? 0 : g;
  }
  return 0;
}
DP_SIMD_FN(relu_mask_bf16, (const dp_bf16 *restrict y, dp_bf16 *restrict dx, size_t n),
           (y, dx, n))

static dp_status linear_backward(const lctx *c, float *grads) {
  const dp_layer *l = c->l;
  int n = c->rows * dp__positions(l), in = dp__pos_in(l), out = dp__pos_out(l);
  ws_layout L;
  dp_status st = op_layout(c, &L);
  if (st) return st;
  shadow sh = shadow_begin(&L);
  shadow_take(&sh, (size_t)out * 4); /* the forward's bias slot: same layout */
  /* the last layer's output gradient is fp32 (the loss's): autocast rounds it
   * to bf16 as it flows into the bf16 output */
  const dp_bf16 *dy = (const dp_bf16 *)ptr(c, c->o.dout);
  if (c->o.dout.esz == 4) {
    dp_span t = shadow_take(&sh, (size_t)n * out * 2);
    if (t.region < 0) return no_room(c);
    dp__bf16_from_f32_n(ptr(c, c->o.dout), (dp_bf16 *)ptr(c, t), (size_t)n * out);
    dy = (const dp_bf16 *)ptr(c, t);
  }
  const float *w = layer_params(c);
  const void *x = ptr(c, c->o.in);
  float *dw = grads + l->param_off, *db = l->bias ? dw + (size_t)out * in : NULL;
  /* dw (out, in) = dy^T (out, n) · x (n, in), rounded to bf16 */
  dp__gemm_bf16(1, 0, out, in, n, dy, out, DP_BF16_STORE_BF16, x, in,
                operand_store(c->o.in), dw, in, DP_BF16_STORE_F32_ROUNDED, NULL,
                gemm_ws(c, &L, out, in, n));
  if (db) {
    dp__gemm_bf16_colsum(n, out, dy, out, db);
    dp__bf16_round_f32_n(db, (size_t)out);
  }
  /* a linear after a fused relu writes the relu's input gradient, masked */
  bool masked = c->i > 0 && dp__relu_bwd_fused(c->p, c->i - 1);
  lctx dc = masked ? at_layer(c, c->i - 1) : *c;
  dp_span dxs = dc.o.din;
  if (dxs.region < 0) return DP_OK;
  /* dx (n, in) = dy (n, out) · w (out, in) */
  dp__gemm_bf16(0, 0, n, in, out, dy, out, DP_BF16_STORE_BF16, w, in, DP_BF16_STORE_F32,
                ptr(c, dxs), in, result_store(dxs), NULL, gemm_ws(c, &L, n, in, out));
  if (!masked) return DP_OK;
  if (c->o.in.esz != 2 || dxs.esz != 2) /* a relu's output and input gradient are bf16 */
    return DP_FAIL(DP_ERR_BACKEND, "layer %d: a fused relu's tensors are not bf16", c->i);
  relu_mask_bf16((const dp_bf16 *)x, (dp_bf16 *)ptr(c, dxs), (size_t)n * in);
  return DP_OK;
}

/* ---- sync batchnorm's sums ---- */

/* DP_OP_BN_STATS and DP_OP_BN_BWD_STATS read the micro-batch's input (and
 * output gradient) as the batchnorm's forward and backward do: fp32 copies,
 * the loss's fp32 gradient rounded, so the statistics are fp32 mode's over
 * the bf16 values. What they write is fp32 (the statistics area, the
 * gradients' slot). */
dp_status dp__mixed_bn_sums(const lctx *c, const dp_op *op) {
  ws_layout L;
  dp_status st = op_layout(c, &L);
  if (st) return st;
  shadow sh = shadow_begin(&L);
  lctx s = *c;
  bool ok = widen(c, &sh, c->o.in, true, false, &s.o.in);
  if (op->kind == DP_OP_BN_BWD_STATS) ok &= widen(c, &sh, c->o.dout, true, true, &s.o.dout);
  if (!ok) return no_room(c);
  return dp__cpu_bn_sums(&s, op);
}

/* ---- layers on the bf16 tensors themselves ---- */

/* gelu and a residual block's add (its end's forward, its begin's backward)
 * and copy (its end's backward), when every tensor they touch is bf16: each
 * element widened as it is read, then the fp32 op's operations (cpu/gelu.h,
 * one add) and the store's rounding: the shadowed op's operations on the same
 * values, so its bits, without the passes of the fp32 copies (through them a
 * gelu took 1.3x its fp32 time, a residual add 3x). */
static _Atomic bool force_shadow, counting;
/* the ops that ran below, counted only for a test: no shared counter's cache
 * line passes between the devices' threads in a step */
static _Atomic unsigned long own_runs;
void dp__mixed_force_shadow(bool on) { force_shadow = on; }
unsigned long dp__mixed_own_runs(void) {
  counting = true;
  return own_runs;
}
static void count_own(void) {
  if (atomic_load_explicit(&counting, memory_order_relaxed))
    atomic_fetch_add_explicit(&own_runs, 1, memory_order_relaxed);
}

/* gelu's loops go through a block of fp32 values on the stack: a loop that
 * converts and computes at once vectorises at half the width here (8 lanes,
 * as the 16-bit lanes take), a third slower on gelu's arithmetic */
#define BLOCK 256

static inline DP_SIMD_BODY int gelu_bf16_body(const dp_bf16 *restrict x,
                                              dp_bf16 *restrict y, size_t n, bool exact) {
  float t[BLOCK];
  for (size_t k0 = 0; k0 < n; k0 += BLOCK) {
    size_t m = n - k0 < BLOCK ? n - k0 : BLOCK;
    for (size_t k = 0; k < m; k++) t[k] = dp__bf16_widen(x[k0 + k]);
    if (exact) /* DP_LAYER_GELU_ERF */
      for (size_t k = 0; k < m; k++) t[k] = dp__gelu_erf(t[k]);
    else
      for (size_t k = 0; k < m; k++) t[k] = dp__gelu(t[k]);
    for (size_t k = 0; k < m; k++) y[k0 + k] = dp__bf16_rne_sel(t[k]);
  }
  return 0;
}
DP_SIMD_FN512(gelu_bf16,
              (const dp_bf16 *restrict x, dp_bf16 *restrict y, size_t n, bool exact),
              (x, y, n, exact))

static inline DP_SIMD_BODY int gelu_grad_bf16_body(const dp_bf16 *restrict x,
                                                   const dp_bf16 *restrict dy,
                                                   dp_bf16 *restrict dx, size_t n,
                                                   bool exact) {
  float t[BLOCK], g[BLOCK];
  for (size_t k0 = 0; k0 < n; k0 += BLOCK) {
    size_t m = n - k0 < BLOCK ? n - k0 : BLOCK;
    for (size_t k = 0; k < m; k++) t[k] = dp__bf16_widen(x[k0 + k]);
    for (size_t k = 0; k < m; k++) g[k] = dp__bf16_widen(dy[k0 + k]);
    if (exact)
      for (size_t k = 0; k < m; k++) t[k] = dp__gelu_erf_grad(t[k], g[k]);
    else
      for (size_t k = 0; k < m; k++) t[k] = dp__gelu_grad(t[k], g[k]);
    for (size_t k = 0; k < m; k++) dx[k0 + k] = dp__bf16_rne_sel(t[k]);
  }
  return 0;
}
DP_SIMD_FN512(gelu_grad_bf16,
              (const dp_bf16 *restrict x, const dp_bf16 *restrict dy, dp_bf16 *restrict dx,
               size_t n, bool exact),
              (x, dy, dx, n, exact))

/* y = a + b; y += b. (Of two NaNs, which one's sign the sum keeps is the
 * instruction's choice of operand: not pinned, as nowhere else.) */
static inline DP_SIMD_BODY int add_bf16_body(const dp_bf16 *restrict a,
                                             const dp_bf16 *restrict b, dp_bf16 *restrict y,
                                             size_t n) {
  for (size_t k = 0; k < n; k++)
    y[k] = dp__bf16_rne_sel(dp__bf16_widen(a[k]) + dp__bf16_widen(b[k]));
  return 0;
}
DP_SIMD_FN(add_bf16,
           (const dp_bf16 *restrict a, const dp_bf16 *restrict b, dp_bf16 *restrict y,
            size_t n),
           (a, b, y, n))

static inline DP_SIMD_BODY int add_to_bf16_body(dp_bf16 *restrict y,
                                                const dp_bf16 *restrict b, size_t n) {
  for (size_t k = 0; k < n; k++)
    y[k] = dp__bf16_rne_sel(dp__bf16_widen(y[k]) + dp__bf16_widen(b[k]));
  return 0;
}
DP_SIMD_FN(add_to_bf16, (dp_bf16 *restrict y, const dp_bf16 *restrict b, size_t n),
           (y, b, n))

/* y = x widened and rounded back: x, a NaN made the quiet NaN of its sign */
static inline DP_SIMD_BODY int copy_bf16_body(const dp_bf16 *restrict x,
                                              dp_bf16 *restrict y, size_t n) {
  for (size_t k = 0; k < n; k++) y[k] = dp__bf16_rne_sel(dp__bf16_widen(x[k]));
  return 0;
}
DP_SIMD_FN(copy_bf16, (const dp_bf16 *restrict x, dp_bf16 *restrict y, size_t n), (x, y, n))

/* Whether the spans given are all present and bf16. */
static bool bf16_spans(int n, const dp_span *s) {
  for (int k = 0; k < n; k++)
    if (s[k].region < 0 || s[k].esz != 2) return false;
  return true;
}

static dp_bf16 *bptr(const lctx *c, dp_span s) { return (dp_bf16 *)(void *)ptr(c, s); }

/* layernorm on the bf16 tensors: blocks of rows (positions) widened into the
 * shadow area, the fp32 op on them (its statistics and weight gradients are
 * fp32 anyway), its results rounded back, while the block is in the caches
 * (the shadowed op makes fp32 copies of the whole micro-batch: a layernorm
 * had 1.4x its fp32 time). Block by block, the fp32 op gives the whole
 * call's bits (cpu.h); blocks of a multiple of 16 rows fill the AVX-512
 * tier's 16-row groups. */
#define LN_BLOCK_BYTES ((size_t)64 << 10)

/* The rows of one block of n rows of width D. */
static int ln_rows(int n, int D) {
  size_t r = LN_BLOCK_BYTES / ((size_t)D * 4) / 16 * 16;
  r = r < 16 ? 16 : r;
  return (int)(r < (size_t)n ? r : (size_t)n);
}

/* The shadow area's bytes that `nbuf` blocks reach: the last one is written
 * whole by the first block. */
static size_t ln_need(const lctx *c, int nbuf) {
  int n = c->rows * dp__positions(c->l), D = dp__pos_out(c->l);
  size_t b = (size_t)ln_rows(n, D) * D * 4;
  return (size_t)(nbuf - 1) * up64(b) + b;
}

/* The rows of one block of width D, and the fp32 buffers of `nbuf` blocks at
 * *buf; false when the shadow area cannot hold them. */
static bool ln_blocks(const lctx *c, int n, int D, int nbuf, int *rows, float **buf) {
  ws_layout L;
  if (op_layout(c, &L)) return false;
  *rows = ln_rows(n, D);
  *buf =
      (float *)(void *)((unsigned char *)dp__region_ptr(c->e, c->d, DP_REGION_WORKSPACE) +
                        L.shadow_at);
  return L.shadow_at + ln_need(c, nbuf) <= L.total;
}

/* layernorm's own loops take its bf16 tensors (and its statistics) */
static bool ln_own(const lctx *c, bool bwd) {
  const dp_layer_operands *o = &c->o;
  if (o->stats.region < 0) return false;
  if (!bwd) return bf16_spans(2, (dp_span[]){o->in, o->out});
  return bf16_spans(2, (dp_span[]){o->in, o->dout}) &&
         (o->din.region < 0 || o->din.esz == 2);
}

static dp_status ln_forward_bf16(const lctx *c) {
  const dp_layer_operands *o = &c->o;
  int n = c->rows * dp__positions(c->l), D = dp__pos_out(c->l), R;
  float *xb;
  if (!ln_blocks(c, n, D, 2, &R, &xb)) return no_room(c);
  float *yb = xb + up64((size_t)R * D * 4) / 4, *st = layer_stats(c);
  const float *g = layer_params(c), *b = g + D;
  const dp_bf16 *x = bptr(c, o->in);
  dp_bf16 *y = bptr(c, o->out);
  for (int r0 = 0; r0 < n; r0 += R) {
    int m = n - r0 < R ? n - r0 : R;
    size_t at = (size_t)r0 * D, cnt = (size_t)m * D;
    dp__bf16_to_f32_n(x + at, xb, cnt);
    dp__layernorm_forward(m, D, c->l->eps, xb, g, b, st + 2 * (size_t)r0, yb);
    dp__bf16_from_f32_n(yb, y + at, cnt);
  }
  return DP_OK;
}

static dp_status ln_backward_bf16(const lctx *c, float *grads) {
  const dp_layer_operands *o = &c->o;
  bool dx = o->din.region >= 0;
  int n = c->rows * dp__positions(c->l), D = dp__pos_out(c->l), R;
  float *xb; /* x, dy and (dx) dx blocks */
  if (!ln_blocks(c, n, D, dx ? 3 : 2, &R, &xb)) return no_room(c);
  size_t stride = up64((size_t)R * D * 4) / 4;
  float *dyb = xb + stride, *dxb = dyb + stride, *dg = grads + c->l->param_off,
        *db = dg + D;
  const float *st = layer_stats(c), *g = layer_params(c);
  const dp_bf16 *x = bptr(c, o->in), *dy = bptr(c, o->dout);
  for (int k = 0; k < D; k++) dg[k] = db[k] = 0.0f;
  for (int r0 = 0; r0 < n; r0 += R) {
    int m = n - r0 < R ? n - r0 : R;
    size_t at = (size_t)r0 * D, cnt = (size_t)m * D;
    dp__bf16_to_f32_n(x + at, xb, cnt);
    dp__bf16_to_f32_n(dy + at, dyb, cnt);
    dp__layernorm_backward_add(m, D, xb, st + 2 * (size_t)r0, g, dyb, dg, db,
                               dx ? dxb : NULL);
    if (dx) dp__bf16_from_f32_n(dxb, bptr(c, o->din) + at, cnt);
  }
  return DP_OK;
}

/* How a layer op runs in bf16: no work (a view, the input, a relu its linear
 * fuses, an input gradient nobody asks for), a linear's bf16 GEMMs, an own loop
 * on the bf16 tensors, layernorm's blocks, or the fp32 op on shadow copies.
 * The ops and the planner's sizing (shadow_need) ask the same functions. */
typedef enum { WAY_NONE, WAY_LINEAR, WAY_OWN, WAY_LN, WAY_SHADOW } op_way;

static op_way forward_way(const lctx *c) {
  const dp_layer_operands *o = &c->o;
  dp_layer_kind k = c->l->kind;
  if (dp__layer_is_view(&c->p->model, c->i) || k == DP_LAYER_INPUT) return WAY_NONE;
  if (k == DP_LAYER_LINEAR) return WAY_LINEAR;
  if (k == DP_LAYER_RELU && dp__relu_fused(c->p, c->i)) return WAY_NONE; /* the linear's */
  if (force_shadow) return WAY_SHADOW;
  if ((k == DP_LAYER_GELU || k == DP_LAYER_GELU_ERF) &&
      bf16_spans(2, (dp_span[]){o->in, o->out}))
    return WAY_OWN;
  if (k == DP_LAYER_LAYERNORM && ln_own(c, false)) return WAY_LN;
  if (k == DP_LAYER_RESIDUAL_END && bf16_spans(3, (dp_span[]){o->skip, o->in, o->out}))
    return WAY_OWN;
  return WAY_SHADOW;
}

/* The own loops of the backward: gelu, a block end's copy, a block begin's
 * add in place; WAY_SHADOW when they do not apply. */
static op_way backward_own_way(const lctx *c) {
  const dp_layer_operands *o = &c->o;
  switch (c->l->kind) {
  case DP_LAYER_GELU:
  case DP_LAYER_GELU_ERF:
    if (o->din.region < 0) return WAY_NONE;
    return bf16_spans(3, (dp_span[]){o->in, o->dout, o->din}) ? WAY_OWN : WAY_SHADOW;
  case DP_LAYER_LAYERNORM: return ln_own(c, true) ? WAY_LN : WAY_SHADOW;
  case DP_LAYER_RESIDUAL_END:
    if (o->din.region < 0) return WAY_NONE;
    return bf16_spans(2, (dp_span[]){o->dout, o->din}) ? WAY_OWN : WAY_SHADOW;
  case DP_LAYER_RESIDUAL: /* its input's gradient, in place, += the block output's */
    if (o->din.region < 0 || o->skip.region < 0) return WAY_NONE;
    return bf16_spans(2, (dp_span[]){o->din, o->skip}) ? WAY_OWN : WAY_SHADOW;
  default: return WAY_SHADOW;
  }
}

static op_way backward_way(const lctx *c) {
  dp_layer_kind k = c->l->kind;
  op_way w = force_shadow ? WAY_SHADOW : backward_own_way(c);
  if (w != WAY_SHADOW || k == DP_LAYER_RESIDUAL) return w;
  if (dp__layer_is_view(&c->p->model, c->i) || k == DP_LAYER_INPUT) return WAY_NONE;
  if (dp__relu_bwd_fused(c->p, c->i)) return WAY_NONE; /* the linear after it does it */
  if (k == DP_LAYER_LINEAR) return WAY_LINEAR;
  return WAY_SHADOW;
}

static void own_forward(const lctx *c) {
  const dp_layer_operands *o = &c->o;
  size_t n = (size_t)c->rows * c->l->out;
  dp_layer_kind k = c->l->kind;
  if (k == DP_LAYER_GELU || k == DP_LAYER_GELU_ERF)
    gelu_bf16(bptr(c, o->in), bptr(c, o->out), n, k == DP_LAYER_GELU_ERF);
  else /* a block's end: x + f(x) */
    add_bf16(bptr(c, o->skip), bptr(c, o->in), bptr(c, o->out), n);
}

static void own_backward(const lctx *c) {
  const dp_layer_operands *o = &c->o;
  size_t n = (size_t)c->rows * c->l->out;
  dp_layer_kind k = c->l->kind;
  if (k == DP_LAYER_GELU || k == DP_LAYER_GELU_ERF)
    gelu_grad_bf16(bptr(c, o->in), bptr(c, o->dout), bptr(c, o->din), n,
                   k == DP_LAYER_GELU_ERF);
  else if (c->l->kind == DP_LAYER_RESIDUAL_END)
    copy_bf16(bptr(c, o->dout), bptr(c, o->din), n);
  else
    add_to_bf16(bptr(c, o->din), bptr(c, o->skip), n);
}

/* ---- the layer ops ---- */

dp_status dp__mixed_forward(const lctx *c) {
  switch (forward_way(c)) {
  case WAY_NONE: return DP_OK;
  case WAY_LINEAR: return linear_forward(c);
  case WAY_OWN: own_forward(c); break;
  case WAY_LN: {
    dp_status st = ln_forward_bf16(c);
    if (st) return st;
    break;
  }
  case WAY_SHADOW: return shadow_run(c, NULL);
  }
  count_own();
  return DP_OK;
}

static dp_status backward_of(const lctx *c, float *grads) {
  op_way w = backward_way(c);
  switch (w) {
  case WAY_NONE: break;
  case WAY_LINEAR: return linear_backward(c, grads);
  case WAY_OWN: own_backward(c); break;
  case WAY_LN: {
    dp_status st = ln_backward_bf16(c, grads);
    if (st) return st;
    break;
  }
  case WAY_SHADOW: return shadow_run(c, grads);
  }
  /* the own loops' runs, and (as before) an own-loop kind with no work */
  if (w != WAY_NONE || backward_own_way(c) == WAY_NONE) count_own();
  return DP_OK;
}

dp_status dp__mixed_backward(const lctx *c, float *grads) {
  dp_status st = backward_of(c, grads);
  /* a block's end with a shortcut: f's output gradient is g's, the bf16 bits
   * din got (both activations) */
  const dp_layer_operands *o = &c->o;
  if (!st && o->dskip.region >= 0 && o->din.region >= 0)
    memcpy(ptr(c, o->dskip), ptr(c, o->din), o->din.bytes);
  return st;
}

/* ---- the plan's size of the workspace ---- */

/* The shadow area's bytes op c reaches (forward, or backward; bn: a sync
 * batchnorm's sums, kind DP_OP_BN_STATS or DP_OP_BN_BWD_STATS): the takes
 * of the way it runs, on each chunk of rows, without data. */
static size_t op_need(const lctx *c, bool bwd, int bn) {
  const dp_layer *l = c->l;
  shadow sh = {.at = 0, .end = SIZE_MAX, .hi = 0, .dry = true};
  lctx s = *c;
  if (bn) {
    widen(c, &sh, c->o.in, true, false, &s.o.in);
    if (bn == DP_OP_BN_BWD_STATS) widen(c, &sh, c->o.dout, true, true, &s.o.dout);
    return sh.hi;
  }
  switch (bwd ? backward_way(c) : forward_way(c)) {
  case WAY_NONE:
  case WAY_OWN: return 0;
  case WAY_LN: return ln_need(c, bwd && c->o.din.region >= 0 ? 3 : 2); /* x, y; x, dy, dx */
  case WAY_LINEAR: { /* its rounded bias; the last layer's gradient copy */
    size_t b = (size_t)dp__pos_out(l) * 4,
           n = (size_t)c->rows * dp__positions(l) * (size_t)dp__pos_out(l);
    if (!bwd) return l->bias ? b : 0;
    return c->o.dout.esz == 4 ? up64(b) + n * 2 : 0;
  }
  case WAY_SHADOW: break;
  }
  /* every chunk, as shadow_run cuts them: a chunk's copies can be more than
   * the first's where spans that coincide in one do not in another */
  size_t most = 0;
  int n = shadow_chunk_rows(l, c->rows, !c->p->cfg.inference);
  for (int r0 = 0; r0 < c->rows; r0 += n) {
    lctx k = chunk_of(c, r0, c->rows - r0 < n ? c->rows - r0 : n);
    shadow one = sh;
    shadow_setup(&k, &one, &s, bwd);
    most = max_z(most, one.hi);
  }
  return most;
}

/* The most any of device d's layer ops takes of the shadow area: every layer's
 * forward (and its recompute in the backward), backward and sync batchnorm
 * sums, on each of the device's micro-batches (the operands of the planned
 * ops: lib/core/operands.c; which of an op's spans coincide, and so how many
 * copies it makes, can differ between micro-batches). */
static size_t shadow_need(const dp_plan *p, int d) {
  const dp_model *m = &p->model;
  bool training = !p->cfg.inference;
  size_t most = 0;
  for (int k = p->split.dev_mb0[d]; k < p->split.dev_mb0[d + 1]; k++) {
    int rows = p->mbs[k].rows;
    if (rows <= 0) continue;
    for (int i = 0; i < m->n_layers; i++) {
      const struct {
        uint8_t phase, kind;
        bool on;
      } ops[] = {
          {DP_PHASE_FORWARD, DP_OP_FORWARD, true},
          {DP_PHASE_BACKWARD, DP_OP_FORWARD, training && dp__recompute_op(p, i)},
          {DP_PHASE_BACKWARD, DP_OP_BACKWARD, training},
          {DP_PHASE_FORWARD, DP_OP_BN_STATS, training && dp__bn_sync(p, i)},
          {DP_PHASE_BACKWARD, DP_OP_BN_BWD_STATS, training && dp__bn_sync(p, i)},
      };
      for (size_t q = 0; q < sizeof ops / sizeof ops[0]; q++) {
        if (!ops[q].on) continue;
        dp_op op = {.phase = ops[q].phase,
                    .kind = ops[q].kind,
                    .device = (int16_t)d,
                    .layer = (int16_t)i,
                    .micro_batch = k,
                    .row0 = p->mbs[k].row0,
                    .rows = rows};
        lctx c = {.p = p, .l = &m->layers[i], .i = i, .L = m->n_layers, .op = &op};
        dp__layer_operands(p, &op, i, &c.o);
        c.d = d, c.local = c.o.local, c.mb = c.o.mb, c.rows = c.o.rows;
        bool bn = op.kind == DP_OP_BN_STATS || op.kind == DP_OP_BN_BWD_STATS;
        most = max_z(most, op_need(&c, op.kind == DP_OP_BACKWARD, bn ? op.kind : 0));
      }
    }
  }
  return most;
}

/* The workspace: what comes before the shadow area, and the shadow area as
 * far as an op reaches into it (none: it ends before the area). */
size_t dp__mixed_workspace_bytes(const dp_plan *p, int d) {
  ws_layout L = layout_of(p, d);
  size_t need = shadow_need(p, d);
  /* to whole 4-byte words: a bf16 copy can end at 2 bytes past one, which the
   * high water (a word's canary) counts as the word */
  return need ? L.shadow_at + (need + 3) / 4 * 4 : L.below;
}
