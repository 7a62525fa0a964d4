/* The image layers' AVX-512 kernels (lib/cpu/conv_fast.c) against conv.c's
 * im2col + GEMM path: conv2d 3 x 3 stride 1 padding 1 (forward, weight and
 * bias gradients, input gradient) and maxpool2d 2 stride 2 give the same bits
 * on random shapes, with NaNs, infinities, signed zeros, subnormals and ties
 * (where NaNs meet in an fma, any NaN for a NaN: same_bits_nan); the same
 * bits as the scalar and AVX2 tiers on finite data; they stay in their
 * workspace and write nothing past their outputs; and they take only the
 * shapes they claim. Skipped without AVX-512. And the pools' padding
 * (PyTorch's, every tier) against a plain reference. */
#include "cpu/conv_fast.h"
#include "cpu/gemm.h"
#include "model/model.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CANARY 64 /* floats past every output, filled with a pattern */

static uint64_t rng = 0x3243f6a8885a308dull;
static uint32_t rnd(uint32_t n) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33) % n;
}

/* Mostly in [-1, 1); special: one in 12 a NaN, an infinity, a signed zero, a
 * subnormal or a huge value. ties: small integers. */
static float val(bool special, bool ties) {
  static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-40f, -3e38f};
  if (special && rnd(12) == 0) return sp[rnd(8)];
  if (ties) return (float)rnd(7) - 3.0f;
  return (float)rnd(1u << 20) / (float)(1u << 19) - 1.0f;
}

static float *filled(size_t n, bool special, bool ties) {
  float *p = malloc((n + CANARY) * 4);
  ck_assert_ptr_nonnull(p);
  for (size_t i = 0; i < n; i++) p[i] = val(special, ties);
  return p;
}

static float *blank(size_t n) {
  float *p = malloc((n + CANARY) * 4);
  ck_assert_ptr_nonnull(p);
  memset(p, 0x5b, (n + CANARY) * 4); /* 0x5b5b5b5b: a pattern, not a result */
  return p;
}

static bool have_avx512(const char *test) {
  if (dp__gemm_force_tier("avx512") == 0) return true;
  fprintf(stderr, "SKIP conv: %s: this CPU lacks the avx512 tier\n", test);
  return false;
}

static void restore(void) {
  dp__convx_off = false;
  dp__gemm_force_tier("auto");
}

static const dp_layer *layer_of(const dp_model *m, dp_layer_kind k) {
  for (int i = 0; i < m->n_layers; i++)
    if (m->layers[i].kind == k) return &m->layers[i];
  ck_abort_msg("no such layer");
  return NULL;
}

static dp_model *model_of(const char *spec) {
  dp_model *m = NULL;
  ck_assert_msg(dp_model_parse(spec, "conv", &m) == DP_OK, "%s: %s", spec, dp_last_error());
  return m;
}

/* One conv2d layer's operands and the outputs of one run. */
typedef struct {
  const dp_layer *l;
  int n;
  size_t in, out, np;
  const float *x, *w, *dy;
} conv_case;

typedef struct {
  float *y, *dw, *dx;
} conv_out;

static void same_bits_nan(const char *what, const float *a, const float *b, size_t n,
                          const char *spec, int rows, bool any_nan);

/* backend.c's relu_forward in place: <= 0 gives +0, a NaN passes */
static void relu_of(float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = y[i] <= 0.0f ? 0.0f : y[i];
}

static conv_out conv_run(const conv_case *c, bool with_dx) {
  conv_out o = {blank(c->out), blank(c->np), blank(c->in)};
  /* room for either path (conv.c takes the fast one only when the workspace
   * it is given holds it) */
  size_t wsb = dp__conv_workspace_bytes(c->l, c->n, true),
         b = dp__convx_bwd_bytes(c->l, c->n);
  /* and, in one case of two, room for dW's blocks */
  b += rnd(2) ? (size_t)c->l->ic * 9 * (size_t)c->l->c * 4 : 0;
  wsb = wsb > b ? wsb : b;
  void *ws = aligned_alloc(64, (wsb + 63) / 64 * 64 + 64);
  ck_assert_ptr_nonnull(ws);
  ck_assert(dp__conv_forward(c->l, c->n, c->x, c->w, o.y, false, ws, wsb));
  /* with the relu after it fused (dp__relu_fused): relu's bits of that y */
  float *yr = blank(c->out);
  ck_assert(dp__conv_forward(c->l, c->n, c->x, c->w, yr, true, ws, wsb));
  relu_of(o.y, c->out);
  same_bits_nan("relu(y)", yr, o.y, c->out, "a conv2d", c->n, false);
  free(yr);
  ck_assert(dp__conv_forward(c->l, c->n, c->x, c->w, o.y, false, ws, wsb));
  float *db = c->l->bias ? o.dw + c->np - (size_t)c->l->c : NULL;
  ck_assert(dp__conv_backward(c->l, c->n, c->x, c->w, c->dy, o.dw, db,
                              with_dx ? o.dx : NULL, ws, wsb));
  free(ws);
  return o;
}

static void conv_free(conv_out *o) {
  free(o->y);
  free(o->dw);
  free(o->dx);
}

/* Bit for bit; with any_nan, two NaNs match whatever their signs and
 * payloads: which NaN an fma returns when NaNs meet depends on the operand
 * order of the instruction form the compiler picks (vfmadd231ps or 132ps),
 * which differs between the tiers' GEMM kernels and between -O1 and -O3
 * builds of the same kernel; the fast paths pin the -O3 AVX-512 kernel's. */
static void same_bits_nan(const char *what, const float *a, const float *b, size_t n,
                          const char *spec, int rows, bool any_nan) {
  for (size_t i = 0; i < n + CANARY; i++)
    if (memcmp(a + i, b + i, 4) != 0 && !(any_nan && i < n && isnan(a[i]) && isnan(b[i])))
      ck_abort_msg("%s of %s on %d rows: element %zu: %a against %a%s", what, spec, rows, i,
                   (double)a[i], (double)b[i], i >= n ? " (past the output)" : "");
}

static void same_bits(const char *what, const float *a, const float *b, size_t n,
                      const char *spec, int rows) {
  same_bits_nan(what, a, b, n, spec, rows, true);
}

/* A random conv2d 3 padding 1 the fast path takes (the digits CNN's two
 * first), run fast (on the tier in use) and by `other` (the im2col path, on
 * tier other_tier), compared bit for bit. */
static void conv_cases(int cases, bool special, const char *other_tier) {
  for (int k = 0; k < cases; k++) {
    int C = k == 0 ? 1 : k == 1 ? 16 : 1 + (int)rnd(20);
    int H = k == 0 ? 8 : k == 1 ? 4 : 1 + (int)rnd(14), W = k < 2 ? H : 1 + (int)rnd(14);
    if (k >= 2 && rnd(8) == 0) H = W = 16 + 16 * (int)rnd(2); /* CIFAR's planes */
    int OUT = k == 0 ? 16 : k == 1 ? 32 : 16 * (1 + (int)rnd(4));
    int n = k < 2 ? 128 : 1 + (int)rnd(9), bias = k < 2 || rnd(2);
    char spec[160];
    snprintf(spec, sizeof spec,
             "input %d %d %d\nconv2d %d 3 padding 1%s\nflatten\nloss mse\n", C, H, W, OUT,
             bias ? "" : " nobias");
    dp_model *m = model_of(spec);
    conv_case c = {.l = layer_of(m, DP_LAYER_CONV2D), .n = n};
    c.in = (size_t)n * c.l->in, c.out = (size_t)n * c.l->out, c.np = c.l->n_params;
    bool sp = special && rnd(2);
    float *x = filled(c.in, sp, false), *w = filled(c.np, sp, false),
          *dy = filled(c.out, sp, false);
    c.x = x, c.w = w, c.dy = dy;
    bool with_dx = rnd(4) != 0;
    ck_assert_int_eq(dp__gemm_force_tier("avx512"), 0);
    dp__convx_off = false;
    ck_assert_msg(dp__convx_takes(c.l), "%s", spec);
    conv_out f = conv_run(&c, with_dx);
    ck_assert_int_eq(dp__gemm_force_tier(other_tier), 0);
    dp__convx_off = true;
    conv_out g = conv_run(&c, with_dx);
    same_bits("y", f.y, g.y, c.out, spec, n);
    same_bits("dw", f.dw, g.dw, c.np, spec, n);
    same_bits("dx", f.dx, g.dx, with_dx ? c.in : 0, spec, n);
    conv_free(&f);
    conv_free(&g);
    free(x), free(w), free(dy);
    dp_model_free(m);
  }
  restore();
}

START_TEST(conv_fast_path_gives_the_im2col_bits) {
  if (!have_avx512("conv_fast_path_gives_the_im2col_bits")) return;
  conv_cases(300, true, "avx512");
}
END_TEST

START_TEST(conv_fast_path_gives_every_tiers_bits) {
  if (!have_avx512("conv_fast_path_gives_every_tiers_bits")) return;
  conv_cases(60, false, "scalar");
  conv_cases(60, false, "avx2");
}
END_TEST

/* The fast path's weight gradient, and its forward on small planes, skip the
 * padding taps, which changes a chain only when it is -0 there (+0 after an
 * fma with +0 and a positive factor): products that underflow to -0 and
 * padding taps late in the chain make the im2col chain end at +0 where the
 * skipping one ends at -0, and the fast path must sum it again. Forward: x
 * -1e-30, w +1e-30 (the bottom right position's last taps read padding);
 * dW: x 1e-30, dy -1e-30 but +1e-30 on each image's last row (whose taps
 * ky = 2 read padding). Also a NaN or an infinity in w or dy (the paths that
 * keep the padding taps run then). */
START_TEST(conv_fast_skips_keep_the_padding_taps_zeros) {
  if (!have_avx512("conv_fast_skips_keep_the_padding_taps_zeros")) return;
  for (int k = 0; k < 8; k++) {
    int H = k % 4 < 2 ? 4 : 3, W = k % 2 ? 3 : 4, n = 2 + k, C = k < 4 ? 2 : 5;
    char spec[128];
    snprintf(spec, sizeof spec,
             "input %d %d %d\nconv2d 16 3 padding 1 nobias\nflatten\nloss mse\n", C, H, W);
    dp_model *m = model_of(spec);
    conv_case c = {.l = layer_of(m, DP_LAYER_CONV2D), .n = n};
    c.in = (size_t)n * c.l->in, c.out = (size_t)n * c.l->out, c.np = c.l->n_params;
    float *x = filled(c.in, false, false), *w = filled(c.np, false, false),
          *dy = filled(c.out, false, false);
    bool fwd = k % 3 == 0;
    for (size_t i = 0; i < c.in; i++) x[i] = fwd ? -1e-30f : 1e-30f;
    for (size_t i = 0; fwd && i < c.np; i++) w[i] = 1e-30f;
    for (size_t i = 0; !fwd && i < c.out; i++) {
      size_t p = i % ((size_t)H * W);
      dy[i] = p / (size_t)W == (size_t)H - 1 ? 1e-30f : -1e-30f;
    }
    if (k == 5) dy[0] = INFINITY; /* a corner: taps that read padding */
    if (k == 7) w[3] = NAN;
    c.x = x, c.w = w, c.dy = dy;
    conv_out f[2];
    for (int r = 0; r < 2; r++) {
      dp__convx_off = r == 1;
      f[r] = conv_run(&c, true);
    }
    same_bits("y", f[0].y, f[1].y, c.out, spec, n);
    same_bits("dw", f[0].dw, f[1].dw, c.np, spec, n);
    same_bits("dx", f[0].dx, f[1].dx, c.in, spec, n);
    /* and not vacuous: some results are +0, which skipping would make -0 */
    const float *r = fwd ? f[1].y : f[1].dw;
    size_t len = fwd ? c.out : c.np, pos0 = 0;
    for (size_t i = 0; i < len; i++) pos0 += r[i] == 0.0f && !signbit(r[i]);
    ck_assert_msg(pos0 > 0 || k == 5 || k == 7, "%s", spec);
    for (int q = 0; q < 2; q++) conv_free(&f[q]);
    free(x), free(w), free(dy);
    dp_model_free(m);
  }
  restore();
}
END_TEST

/* The workspace it is given is all the fast path writes: a canary right
 * after it stays. */
START_TEST(conv_fast_path_stays_in_its_workspace) {
  if (!have_avx512("conv_fast_path_stays_in_its_workspace")) return;
  static const char *const specs[] = {
      "input 1 8 8\nconv2d 16 3 padding 1\nflatten\nloss mse\n",
      "input 16 4 4\nconv2d 32 3 padding 1\nflatten\nloss mse\n",
      "input 5 7 3\nconv2d 48 3 padding 1 nobias\nflatten\nloss mse\n"};
  for (int s = 0; s < 3; s++)
    for (int n = 1; n <= 17; n += 8) {
      dp_model *m = model_of(specs[s]);
      const dp_layer *l = layer_of(m, DP_LAYER_CONV2D);
      ck_assert(dp__convx_takes(l));
      size_t in = (size_t)n * l->in, out = (size_t)n * l->out;
      float *x = filled(in, false, false), *w = filled(l->n_params, false, false);
      float *dy = filled(out, false, false), *y = blank(out), *dw = blank(l->n_params),
            *dx = blank(in);
      /* the least it takes, then room for dW's partial sums */
      size_t bb = dp__convx_bwd_bytes(l, n), part = (size_t)l->ic * 9 * l->c * 4;
      size_t big = bb + part + 4096;
      unsigned char *ws = aligned_alloc(64, big);
      ck_assert_ptr_nonnull(ws);
      dp__convx_forward(l, n, x, w, y, rnd(2), ws, big);
      for (int r = 0; r < 2; r++) {
        size_t have = bb + (r ? part : 0);
        memset(ws, 0xa7, big);
        dp__convx_backward(l, n, x, w, dy, dw, l->bias ? dw + l->n_params - l->c : NULL, dx,
                           ws, have);
        for (size_t i = have; i < big; i++)
          ck_assert_msg(ws[i] == 0xa7, "backward wrote byte %zu of %zu", i, have);
      }
      free(ws), free(x), free(w), free(dy), free(y), free(dw), free(dx);
      dp_model_free(m);
    }
  restore();
}
END_TEST

/* Random maxpool2d 2 layers (fast: rows of 1, 2 or 4 windows; others too, which
 * conv.c runs either way), ties, NaNs of both signs, infinities and zeros;
 * element counts that are not a multiple of 16. */
START_TEST(pool_fast_path_moves_the_same_elements) {
  if (!have_avx512("pool_fast_path_moves_the_same_elements")) return;
  static const int ows[] = {1, 2, 4, 8, 3, 16};
  int fast = 0;
  for (int k = 0; k < 600; k++) {
    int C = 1 + (int)rnd(5), OH = 1 + (int)rnd(6), OW = ows[rnd(6)], n = 1 + (int)rnd(7);
    char spec[128];
    snprintf(spec, sizeof spec, "input %d %d %d\nmaxpool2d 2\nflatten\nloss mse\n", C,
             2 * OH, 2 * OW + (k % 5 == 0));
    dp_model *m = model_of(spec);
    const dp_layer *l = layer_of(m, DP_LAYER_MAXPOOL2D);
    size_t in = (size_t)n * l->in, out = (size_t)n * l->out;
    bool sp = rnd(2);
    float *x = filled(in, sp, true), *dy = filled(out, sp, false);
    float *y[2], *dx[2], *dxm[2];
    for (int f = 0; f < 2; f++) {
      dp__convx_off = f == 1;
      fast += f == 0 && dp__poolx_takes(l);
      y[f] = blank(out), dx[f] = blank(in);
      dp__pool_forward(l, n, x, y[f]);
      dp__pool_backward(l, n, x, dy, dx[f], false);
      /* after a fused relu (x its output): the relu's backward of that dx */
      dxm[f] = blank(in);
      dp__pool_backward(l, n, x, dy, dxm[f], true);
      for (size_t i = 0; i < in; i++)
        if (x[i] <= 0.0f) dx[f][i] = 0.0f;
      same_bits_nan("masked maxpool dx", dxm[f], dx[f], in, spec, n, false);
    }
    same_bits_nan("maxpool y", y[0], y[1], out, spec, n, false); /* moves: every bit */
    same_bits_nan("maxpool dx", dx[0], dx[1], in, spec, n, false);
    for (int f = 0; f < 2; f++) free(y[f]), free(dx[f]), free(dxm[f]);
    free(x), free(dy);
    dp_model_free(m);
  }
  ck_assert_int_gt(fast, 200);
  restore();
}
END_TEST

START_TEST(fast_paths_take_only_their_shapes) {
  if (!have_avx512("fast_paths_take_only_their_shapes")) return;
  static const struct {
    const char *spec;
    bool conv, pool;
  } t[] = {
      {"input 1 8 8\nconv2d 16 3 padding 1\nmaxpool2d 2\nflatten\nloss mse\n", true, true},
      {"input 3 32 32\nconv2d 32 3 padding 1\nmaxpool2d 2\nflatten\nloss mse\n", true,
       false},
      {"input 1 8 8\nconv2d 8 3 padding 1\nmaxpool2d 2 stride 1\nflatten\nloss mse\n",
       false, false},
      {"input 1 8 8\nconv2d 16 3\nmaxpool2d 3\nflatten\nloss mse\n", false, false},
      {"input 1 8 8\nconv2d 16 3 stride 2 padding 1\nflatten\nloss mse\n", false, false},
      {"input 1 8 8\nconv2d 16 5 padding 2\nflatten\nloss mse\n", false, false},
      {"input 1 66 66\nconv2d 16 3 padding 1\nflatten\nloss mse\n", false, false},
      {"input 2 4 6\nconv2d 16 3 padding 1\nmaxpool2d 2\nflatten\nloss mse\n", true, false},
  };
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    dp_model *m = model_of(t[i].spec);
    ck_assert_msg(dp__convx_takes(layer_of(m, DP_LAYER_CONV2D)) == t[i].conv, "%s",
                  t[i].spec);
    bool pool = false;
    for (int k = 0; k < m->n_layers; k++)
      if (m->layers[k].kind == DP_LAYER_MAXPOOL2D) pool = dp__poolx_takes(&m->layers[k]);
    ck_assert_msg(pool == t[i].pool, "%s", t[i].spec);
    dp__convx_off = true;
    ck_assert(!dp__convx_takes(layer_of(m, DP_LAYER_CONV2D)));
    dp__convx_off = false;
    dp_model_free(m);
  }
  restore();
}
END_TEST

/* ---- the pools' padding against a reference ----------------------------------------
 * PyTorch's padded pools written out plainly: window (oy, ox) covers input
 * rows oy S - P .. oy S - P + K - 1 (columns alike), and only the cells inside
 * the plane take part. maxpool: the first largest real cell in row-major
 * order, a NaN at once (-inf padding never wins, so a window of -infs picks
 * its first real cell); dx sums dy at each window's pick in (oy, ox) order.
 * avgpool: the real cells' sum from +0, / K K or (exclude) / their count; dx
 * gathers dy / divisor in (oy, ox) order. */
typedef struct {
  int C, H, W, K, S, P, OH, OW;
  bool max, exclude;
} pool_ref;

static void ref_cells(const pool_ref *r, int o, int n_in, int *lo, int *hi) {
  *lo = o * r->S - r->P;
  *hi = *lo + r->K; /* exclusive */
  if (*lo < 0) *lo = 0;
  if (*hi > n_in) *hi = n_in;
}

static void ref_pool(const pool_ref *r, int n, const float *x, const float *dy, float *y,
                     float *dx) {
  size_t plane = (size_t)r->H * r->W, oplane = (size_t)r->OH * r->OW;
  for (size_t i = 0; i < (size_t)n * r->C * plane; i++) dx[i] = 0.0f;
  for (size_t sc = 0; sc < (size_t)n * r->C; sc++)
    for (int oy = 0; oy < r->OH; oy++)
      for (int ox = 0; ox < r->OW; ox++) {
        int y0, y1, x0, x1;
        ref_cells(r, oy, r->H, &y0, &y1);
        ref_cells(r, ox, r->W, &x0, &x1);
        ck_assert(y0 < y1 && x0 < x1); /* P <= K / 2: a real cell in every window */
        size_t o = sc * oplane + (size_t)oy * r->OW + ox, best = 0;
        float m = 0.0f, sum = 0.0f;
        bool any = false;
        for (int iy = y0; iy < y1; iy++)
          for (int ix = x0; ix < x1; ix++) {
            size_t at = sc * plane + (size_t)iy * r->W + ix;
            float v = x[at];
            sum = sum + v;
            if (!any || v > m || (isnan(v) && !isnan(m))) best = at, m = v, any = true;
          }
        float div = r->exclude ? (float)((y1 - y0) * (x1 - x0)) : (float)(r->K * r->K);
        if (r->max) {
          y[o] = x[best];
          dx[best] = dx[best] + dy[o];
          continue;
        }
        y[o] = sum / div;
        for (int iy = y0; iy < y1; iy++)
          for (int ix = x0; ix < x1; ix++) {
            size_t at = sc * plane + (size_t)iy * r->W + ix;
            dx[at] = dx[at] + dy[o] / div;
          }
      }
}

/* One pool layer of `spec` on x (n rows) by the library and by ref_pool;
 * bits the same (NaNs: any NaN, as the adds' operand order picks which). */
static void pool_vs_ref(const char *spec, int n, const float *x, const float *dy) {
  dp_model *m = model_of(spec);
  const dp_layer *l = &m->layers[0];
  pool_ref r = {l->ic,
                l->ih,
                l->iw,
                l->k,
                l->stride,
                l->pad,
                l->h,
                l->w,
                l->kind == DP_LAYER_MAXPOOL2D,
                l->exclude_pad != 0};
  size_t in = (size_t)n * l->in, out = (size_t)n * l->out;
  float *y = blank(out), *dx = blank(in), *yr = blank(out), *dxr = blank(in);
  ref_pool(&r, n, x, dy, yr, dxr);
  dp__pool_forward(l, n, x, y);
  dp__pool_backward(l, n, r.max ? x : NULL, dy, dx, false);
  same_bits_nan("pool y", y, yr, out, spec, n, true);
  same_bits_nan("pool dx", dx, dxr, in, spec, n, true);
  if (r.max) { /* after a fused relu (x its output): that relu's backward of dx */
    dp__pool_backward(l, n, x, dy, dx, true);
    for (size_t i = 0; i < in; i++)
      if (x[i] <= 0.0f) dxr[i] = 0.0f;
    same_bits_nan("masked pool dx", dx, dxr, in, spec, n, true);
  }
  free(y), free(dx), free(yr), free(dxr);
  dp_model_free(m);
}

/* Random padded pools (and unpadded ones, the same reference): kernels 1..5,
 * strides 1..4, every padding PyTorch allows, NaNs, infinities and ties. */
START_TEST(padded_pools_match_the_reference) {
  int padded = 0;
  for (int k = 0; k < 400; k++) {
    int K = 1 + (int)rnd(5), S = 1 + (int)rnd(4), P = (int)rnd((uint32_t)(K / 2 + 1));
    int C = 1 + (int)rnd(3), H = K + (int)rnd(6), W = K + (int)rnd(6), n = 1 + (int)rnd(4);
    bool max = rnd(2), excl = !max && rnd(2);
    char spec[160];
    snprintf(spec, sizeof spec, "input %d %d %d\n%s %d stride %d padding %d%s\nflatten\n",
             C, H, W, max ? "maxpool2d" : "avgpool2d", K, S, P, excl ? " exclude_pad" : "");
    size_t in = (size_t)n * C * H * W, out = (size_t)n * C * (H + 2 * P) * (W + 2 * P);
    bool sp = rnd(2);
    float *x = filled(in, sp, rnd(2)), *dy = filled(out, sp, false); /* out's bound */
    pool_vs_ref(spec, n, x, dy);
    padded += P > 0;
    free(x), free(dy);
  }
  ck_assert_int_gt(padded, 150);
}
END_TEST

/* The edges by hand: a 3 x 3 plane, window 2 stride 2 padding 1 (windows of
 * 1, 2, 2 and 4 real cells). All -inf: each window's pick is its first real
 * cell, (0,0) (0,1) (1,0) (1,1); a NaN after a larger value wins, and of two
 * NaNs the first; avgpool divides by 4, or by 1, 2, 2, 4 with exclude_pad. */
START_TEST(padded_pool_edges) {
  const char *mx = "input 1 3 3\nmaxpool2d 2 stride 2 padding 1\nflatten\n";
  dp_model *m = model_of(mx);
  const dp_layer *l = &m->layers[0];
  ck_assert_int_eq(l->h, 2);
  ck_assert_int_eq(l->w, 2);
  float x[9], y[4], dx[9], dy[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  for (int i = 0; i < 9; i++) x[i] = -INFINITY;
  dp__pool_forward(l, 1, x, y);
  dp__pool_backward(l, 1, x, dy, dx, false);
  for (int i = 0; i < 4; i++) ck_assert(y[i] == -INFINITY);
  static const int pick[4] = {0, 1, 3, 4}; /* (0,0) (0,1) (1,0) (1,1) */
  for (int i = 0, j = 0; i < 9; i++)
    ck_assert_msg(dx[i] == (j < 4 && pick[j] == i ? dy[j++] : 0.0f), "dx[%d] = %g", i,
                  (double)dx[i]);
  /* window (1,1) holds cells 4 5 7 8: 5 then a NaN at 7, another at 8 */
  x[4] = 1.0f, x[5] = 5.0f, x[7] = NAN, x[8] = NAN;
  dp__pool_forward(l, 1, x, y);
  dp__pool_backward(l, 1, x, dy, dx, false);
  ck_assert(isnan(y[3]));
  ck_assert(dx[7] == 4.0f && dx[8] == 0.0f && dx[5] == 0.0f && dx[4] == 0.0f);
  dp_model_free(m);
  for (int e = 0; e < 2; e++) {
    m = model_of(e ? "input 1 3 3\navgpool2d 2 padding 1 exclude_pad\nflatten\n"
                   : "input 1 3 3\navgpool2d 2 padding 1\nflatten\n");
    l = &m->layers[0];
    for (int i = 0; i < 9; i++) x[i] = (float)(i + 1);
    dp__pool_forward(l, 1, x, y);
    dp__pool_backward(l, 1, NULL, dy, dx, false);
    const float sums[4] = {1.0f, 2.0f + 3.0f, 4.0f + 7.0f, 5.0f + 6.0f + 8.0f + 9.0f};
    const float cells[4] = {1.0f, 2.0f, 2.0f, 4.0f};
    for (int i = 0; i < 4; i++) {
      float div = e ? cells[i] : 4.0f;
      ck_assert_msg(y[i] == sums[i] / div, "%s: y[%d] = %g", e ? "exclude" : "include", i,
                    (double)y[i]);
    }
    /* cell 8 (2,2) is in window (1,1) alone */
    ck_assert(dx[8] == dy[3] / (e ? 4.0f : 4.0f) && dx[0] == dy[0] / (e ? 1.0f : 4.0f));
    ck_assert(dx[2] == dy[1] / (e ? 2.0f : 4.0f) && dx[6] == dy[2] / (e ? 2.0f : 4.0f));
    dp_model_free(m);
  }
}
END_TEST

Suite *conv_suite(void) {
  Suite *s = suite_create("conv");
  TCase *tc = tcase_create("fast");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, conv_fast_path_gives_the_im2col_bits);
  tcase_add_test(tc, conv_fast_path_gives_every_tiers_bits);
  tcase_add_test(tc, conv_fast_skips_keep_the_padding_taps_zeros);
  tcase_add_test(tc, conv_fast_path_stays_in_its_workspace);
  tcase_add_test(tc, pool_fast_path_moves_the_same_elements);
  tcase_add_test(tc, fast_paths_take_only_their_shapes);
  suite_add_tcase(s, tc);
  tc = tcase_create("pool_padding");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, padded_pools_match_the_reference);
  tcase_add_test(tc, padded_pool_edges);
  suite_add_tcase(s, tc);
  return s;
}
