/* The sequence layers on the CPU: the embedding and causal self-attention, on
 * the n rows of a micro-batch, each row (T, width) position-major. Every
 * product runs through the packed GEMM (gemm.h: one fma chain per element,
 * ascending over the reduced dimension, the same bits on every instruction
 * set); every other sum has a fixed order. */
#include "cpu/cpu.h"
#include "cpu/gemm.h"

#include <math.h>
#include <string.h>

void dp__embed_forward(const dp_layer *l, int n, const float *ids, const float *w,
                       float *y) {
  int T = l->t, D = l->c;
  const float *pos = w + (size_t)l->vocab * D; /* (T, D) after the tokens' (V, D) */
  for (int r = 0; r < n; r++)
    for (int t = 0; t < T; t++) {
      /* the ids were checked before the step (integers in 0 .. V-1) */
      const float *tok = w + (size_t)ids[(size_t)r * T + t] * D;
      const float *pt = pos + (size_t)t * D;
      float *yr = y + ((size_t)r * T + t) * D;
      for (int k = 0; k < D; k++) yr[k] = tok[k] + pt[k];
    }
}

void dp__embed_backward(const dp_layer *l, int n, const float *ids, const float *dy,
                        float *dw) {
  int T = l->t, D = l->c;
  float *dpos = dw + (size_t)l->vocab * D;
  /* tied to the output head: the token rows hold the head's gradient already, and
   * the embedding's adds to it (model.h, dp_layer.tied) */
  if (l->tied)
    memset(dpos, 0, (size_t)T * D * 4);
  else
    memset(dw, 0, l->n_params * 4);
  /* rows, then positions, ascending: each gradient row's sum has one order */
  for (int r = 0; r < n; r++)
    for (int t = 0; t < T; t++) {
      const float *g = dy + ((size_t)r * T + t) * D;
      float *dt = dw + (size_t)ids[(size_t)r * T + t] * D, *dp = dpos + (size_t)t * D;
      for (int k = 0; k < D; k++) {
        dt[k] += g[k];
        dp[k] += g[k];
      }
    }
}

/* The attention's workspace: the (T, T) scratches (scratches()), then the
 * GEMMs', then the packed keys (packed_bytes). */
static size_t scratch_bytes(const dp_layer *l) {
  return ((size_t)l->t * (size_t)l->t * 4 + 63) / 64 * 64;
}

static size_t gemm_bytes(const dp_layer *l) {
  int T = l->t, hd = l->c / l->heads;
  size_t a = dp__gemm_workspace_bytes(T, T, hd), b = dp__gemm_workspace_bytes(T, hd, T);
  return a > b ? a : b;
}

/* The scores' B (a head's keys, or values in the backward) packed once for
 * all of its row blocks (scores), after the GEMMs' part; none where one pack
 * cannot serve the blocks (dp__gemm_packed_b_prefix), so the plan keeps no
 * byte it does not use. */
static size_t packed_bytes(const dp_layer *l) {
  int T = l->t, hd = l->c / l->heads;
  if (!dp__gemm_packed_b_prefix(hd, T, T)) return 0;
  return (dp__gemm_packed_b_bytes(hd, T) + 63) / 64 * 64;
}

/* Training: the backward's d(scores), and with dropout the kept probabilities
 * (the forward's too). */
static int scratches(const dp_layer *l, bool training) {
  return training ? (l->p > 0.0f ? 2 : 1) : 0;
}

size_t dp__attention_workspace_bytes(const dp_layer *l, bool training) {
  if (l->kind != DP_LAYER_ATTENTION) return 0;
  return (size_t)scratches(l, training) * scratch_bytes(l) + gemm_bytes(l) +
         packed_bytes(l);
}

/* pd (T, T) = p with dropout: element (i, j <= i) of head h of row r kept, times
 * 1 / (1 - p), as dp_attn_drop says; zeros above the diagonal, as p's. */
static void drop_probs(const dp_layer *l, const dp_attn_drop *d, int r, int h,
                       const float *ph, float *pd) {
  int T = l->t;
  float keep = 1.0f / (1.0f - l->p);
  uint64_t row = d->row0 + (uint64_t)r, e0 = (uint64_t)h * T * T;
  for (int i = 0; i < T; i++) {
    for (int j = 0; j <= i; j++) {
      uint64_t e = e0 + (uint64_t)i * T + (uint64_t)j;
      float u = dp__rng_uniform(d->seed, DP_RNG_DROPOUT, d->key, row, e);
      pd[(size_t)i * T + j] = u >= l->p ? ph[(size_t)i * T + j] * keep : 0.0f;
    }
    for (int j = i + 1; j < T; j++) pd[(size_t)i * T + j] = 0.0f;
  }
}

/* The GEMMs' part of a workspace of ws_bytes at ws (NULL: too small, and the
 * GEMM runs unpacked with the same bits). */
static void *gemm_ws(const dp_layer *l, void *ws, size_t ws_bytes, size_t at) {
  size_t need = gemm_bytes(l);
  return need && ws && ws_bytes >= at + need ? (unsigned char *)ws + at : NULL;
}

/* The packed B's place after the GEMMs' part at `at` (NULL: too small). */
static float *packed_ws(const dp_layer *l, void *ws, size_t ws_bytes, size_t at) {
  size_t from = at + gemm_bytes(l), need = packed_bytes(l);
  return need && ws && ws_bytes >= from + need ? (float *)((unsigned char *)ws + from)
                                               : NULL;
}

/* Causal products by blocks of rows, computing only what the mask keeps. Each
 * element computed has the bits of the full (T, T) product: gemm.h gives a
 * sub-problem's element the whole problem's bits, and a chain whose leading
 * products are by exact zeros keeps its +0 start through them. */
static int causal_rows(int T) {
  /* 48 = 4 row tiles of the AVX-512 tier (12 rows): no edge tile; on short
   * contexts the columns a bigger block computes past the diagonal cost more
   * (gpt_wide's T 256: forward 3%, backward 6% less time than 32 rows; T 64:
   * 32 rows 5% faster; docs/PERFORMANCE.md, session 22) */
  return T < 128 ? 32 : 48;
}

/* s (T, T) = a (T, hd) b (T, hd)^T for the columns j <= i of each row i (up to
 * its block's last row); the rest is left unwritten: the softmax and its
 * backward read j <= i only. */
static void scores(int T, int hd, const float *a, int lda, const float *b, int ldb,
                   float *s, void *gw, float *bp) {
  /* b^T packed once, each block reading its first i1 columns: the same bits
   * as packing per block (gemm.h). bp is NULL where one pack cannot serve the
   * blocks (packed_bytes) or the workspace is short. */
  bool pre = bp != NULL;
  if (pre) dp__gemm_pack_b(1, hd, T, b, ldb, bp);
  const int R = causal_rows(T);
  for (int i0 = 0; i0 < T; i0 += R) {
    int i1 = i0 + R < T ? i0 + R : T;
    dp__sgemm_pb(0, 1, i1 - i0, i1, hd, a + (size_t)i0 * lda, lda, b, ldb, pre ? bp : NULL,
                 s + (size_t)i0 * T, T, NULL, gw);
  }
}

/* o (T, hd) = l b for l (T, T) lower triangular (zeros above the diagonal), b
 * (T, hd): row i of o sums rows j <= i of b only (up to its block's last row),
 * o's rows ldo apart. The products left out are by exact zeros at the end of
 * each row's chain: x + (+-0 * b) is x for every x the chain can hold (a sum
 * that includes a positive probability times a finite b). */
static void lower(int T, int hd, const float *l, const float *b, int ldb, float *o, int ldo,
                  void *gw) {
  const int R = causal_rows(T);
  for (int i0 = 0; i0 < T; i0 += R) {
    int i1 = i0 + R < T ? i0 + R : T;
    dp__sgemm(0, 0, i1 - i0, hd, i1, l + (size_t)i0 * T, T, b, ldb, o + (size_t)i0 * ldo,
              ldo, NULL, gw);
  }
}

/* o (T, hd) = l^T b for l (T, T) lower triangular (zeros above the diagonal),
 * b (T, hd): row j of o sums rows i >= j only, o's rows ldo apart. */
static void lower_t(int T, int hd, const float *l, const float *b, int ldb, float *o,
                    int ldo, void *gw) {
  const int R = causal_rows(T);
  for (int j0 = 0; j0 < T; j0 += R) {
    int j1 = j0 + R < T ? j0 + R : T;
    dp__sgemm(1, 0, j1 - j0, hd, T - j0, l + (size_t)j0 * T + j0, T, b + (size_t)j0 * ldb,
              ldb, o + (size_t)j0 * ldo, ldo, NULL, gw);
  }
}

bool dp__attention_forward(const dp_layer *l, int n, const float *qkv, float *p, float *y,
                           const dp_attn_drop *drop, void *ws, size_t ws_bytes) {
  int T = l->t, D = l->c, H = l->heads, hd = D / H;
  float scale = 1.0f / sqrtf((float)hd);
  bool dropping = drop && drop->on;
  if (dropping && (!ws || ws_bytes < scratch_bytes(l))) return false;
  float *pd = dropping ? ws : NULL; /* (T, T): the kept probabilities */
  size_t at = dropping ? scratch_bytes(l) : 0;
  void *gw = gemm_ws(l, ws, ws_bytes, at);
  float *bp = packed_ws(l, ws, ws_bytes, at);
  for (int r = 0; r < n; r++)
    for (int h = 0; h < H; h++) {
      const float *q = qkv + (size_t)r * T * 3 * D + (size_t)h * hd, *k = q + D, *v = k + D;
      float *ph = p + ((size_t)r * H + h) * T * T; /* (T, T) */
      scores(T, hd, q, 3 * D, k, 3 * D, ph, gw, bp); /* q k^T, the lower triangle */
      dp__causal_softmax(ph, T, scale);
      if (dropping) drop_probs(l, drop, r, h, ph, pd);
      lower(T, hd, dropping ? pd : ph, v, 3 * D, y + (size_t)r * T * D + (size_t)h * hd, D,
            gw); /* p v */
    }
  return true;
}

bool dp__attention_backward(const dp_layer *l, int n, const float *qkv, const float *p,
                            const float *dy, float *dqkv, const dp_attn_drop *drop,
                            void *ws, size_t ws_bytes) {
  int T = l->t, D = l->c, H = l->heads, hd = D / H;
  float scale = 1.0f / sqrtf((float)hd);
  bool dropping = drop && drop->on;
  size_t sb = scratch_bytes(l);
  if (!ws || ws_bytes < (dropping ? 2 : 1) * sb) return false;
  float *ds = ws; /* (T, T): d(probabilities), then d(scores) in place */
  float *pd = dropping ? (float *)((unsigned char *)ws + sb) : NULL; /* the kept ones */
  float keep = dropping ? 1.0f / (1.0f - l->p) : 1.0f;
  void *gw = gemm_ws(l, ws, ws_bytes, (dropping ? 2 : 1) * sb);
  float *bp = packed_ws(l, ws, ws_bytes, (dropping ? 2 : 1) * sb);
  for (int r = 0; r < n; r++)
    for (int h = 0; h < H; h++) {
      size_t at = (size_t)r * T * 3 * D + (size_t)h * hd;
      const float *q = qkv + at, *k = q + D, *v = k + D;
      float *dq = dqkv + at, *dk = dq + D, *dv = dk + D;
      const float *ph = p + ((size_t)r * H + h) * T * T;
      const float *g = dy + (size_t)r * T * D + (size_t)h * hd; /* (T, hd), ld D */
      if (dropping) drop_probs(l, drop, r, h, ph, pd);
      lower_t(T, hd, dropping ? pd : ph, g, D, dv, 3 * D, gw); /* dv = p^T dy (kept) */
      scores(T, hd, g, D, v, 3 * D, ds, gw, bp); /* dp = dy v^T, the lower triangle */
      if (dropping) /* through the dropout: the kept ones' gradient, scaled, 0 for the
                       dropped (pd is 0 exactly there, or where p is 0 and the
                       softmax's backward multiplies by p anyway) */
        for (int i = 0; i < T; i++)
          for (int j = 0; j <= i; j++)
            ds[(size_t)i * T + j] =
                pd[(size_t)i * T + j] != 0.0f ? ds[(size_t)i * T + j] * keep : 0.0f;
      dp__causal_softmax_backward(ph, ds, T, scale); /* ds = p (dp - sum p dp) scale */
      lower(T, hd, ds, k, 3 * D, dq, 3 * D, gw);                       /* dq = ds k */
      lower_t(T, hd, ds, q, 3 * D, dk, 3 * D, gw);                     /* dk = ds^T q */
    }
  return true;
}
