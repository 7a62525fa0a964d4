/* Tests of the packed SGEMM (lib/cpu/gemm.c): results against a double-precision
 * reference, the determinism contract (every element is one fma chain over k
 * ascending: the same bits on every tier, for every M and N, with any row or
 * column subset), the epilogue, and that the workspace is the only scratch.
 *
 *   DP_GEMM_BENCH=1 CK_RUN_CASE=bench build/test_dp gemm
 * prints GFLOP/s per tier and shape, the naive loops, and the FMA peak. */
#include "cpu/gemm.h"
#include "helpers.h"

#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

/* Assertions for hot loops: only talk to Check when they fail. */
#define REQ(expr, ...)                                                                   \
  do {                                                                                   \
    if (!(expr)) ck_assert_msg(expr, __VA_ARGS__);                                       \
  } while (0)

static const char *const TIERS[] = {"scalar", "avx2", "avx512"};
#define N_TIERS 3

/* ---- helpers ----------------------------------------------------------------- */

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t rnd(uint32_t n) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33) % n;
}
/* In [-1, 1), with an occasional larger or tiny magnitude so that rounding
 * differs between summation orders. */
static float rndf(void) {
  float v = (float)rnd(1u << 24) / (float)(1u << 23) - 1.0f;
  uint32_t r = rnd(16);
  return r == 0 ? v * 64.0f : r == 1 ? v / 64.0f : v;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  ck_assert_ptr_nonnull(p);
  return p;
}

typedef struct {
  int tA, tB, M, N, K, lda, ldb, ldc;
  float *A, *B, *bias;
  size_t a_len, b_len, c_len;
} prob;

/* Random operands; leading dimensions padded by `pad` floats. */
static prob prob_make(int tA, int tB, int M, int N, int K, int pad) {
  prob p = {.tA = tA, .tB = tB, .M = M, .N = N, .K = K};
  p.lda = (tA ? M : K) + pad;
  p.ldb = (tB ? K : N) + pad;
  p.ldc = N + pad;
  p.a_len = (size_t)(tA ? K : M) * p.lda;
  p.b_len = (size_t)(tB ? N : K) * p.ldb;
  p.c_len = (size_t)M * p.ldc;
  p.A = xmalloc(p.a_len * sizeof(float));
  p.B = xmalloc(p.b_len * sizeof(float));
  p.bias = xmalloc((size_t)(N ? N : 1) * sizeof(float));
  for (size_t i = 0; i < p.a_len; i++) p.A[i] = rndf();
  for (size_t i = 0; i < p.b_len; i++) p.B[i] = rndf();
  for (int j = 0; j < N; j++) p.bias[j] = rndf();
  return p;
}

static void prob_free(prob *p) {
  free(p->A);
  free(p->B);
  free(p->bias);
}

static float opA(const prob *p, int i, int k) {
  return p->tA ? p->A[(size_t)k * p->lda + i] : p->A[(size_t)i * p->lda + k];
}
static float opB(const prob *p, int k, int j) {
  return p->tB ? p->B[(size_t)j * p->ldb + k] : p->B[(size_t)k * p->ldb + j];
}

/* The contract, written independently: one fmaf per k, k ascending, from +0;
 * then bias, then relu. Result (M, N) densely. */
static void contract_ref(const prob *p, const dp_gemm_epilogue *ep, float *out) {
  for (int i = 0; i < p->M; i++)
    for (int j = 0; j < p->N; j++) {
      float acc = 0.0f;
      for (int k = 0; k < p->K; k++) acc = fmaf(opA(p, i, k), opB(p, k, j), acc);
      if (ep && ep->bias) acc = acc + ep->bias[j];
      if (ep && ep->act == DP_GEMM_ACT_RELU) acc = acc <= 0.0f ? 0.0f : acc;
      out[(size_t)i * p->N + j] = acc;
    }
}

/* Runs dp__sgemm with a workspace of exactly the size it asks for; returns C
 * densely (M, N). */
static float *run_gemm(const prob *p, const dp_gemm_epilogue *ep) {
  size_t wsb = dp__gemm_workspace_bytes(p->M, p->N, p->K);
  void *ws = wsb ? xmalloc(wsb) : NULL;
  float *C = xmalloc(p->c_len * sizeof(float) + 4), *out = xmalloc((size_t)p->M * p->N * 4 + 4);
  for (size_t i = 0; i < p->c_len; i++) C[i] = NAN;
  dp__sgemm(p->tA, p->tB, p->M, p->N, p->K, p->A, p->lda, p->B, p->ldb, C, p->ldc, ep, ws);
  for (int i = 0; i < p->M; i++)
    memcpy(out + (size_t)i * p->N, C + (size_t)i * p->ldc, (size_t)p->N * 4);
  free(C);
  free(ws);
  return out;
}

static bool use_tier(const char *name, const char *test) {
  if (dp__gemm_force_tier(name) == 0) return true;
  fprintf(stderr, "SKIP gemm: %s: tier %s: this CPU lacks it\n", test, name);
  return false;
}

/* First differing element, or -1. */
static long first_diff(const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], 4) != 0) return (long)i;
  return -1;
}

/* Interesting sizes: around every tier's MR and NR (4, 6, 12; 8, 16, 32) and
 * the blocking (MC 96, KC 256, NC 1024). */
static const int EDGE[] = {1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 15, 16, 17, 23, 24, 25,
                           31, 32, 33, 47, 48, 63, 64, 65, 95, 96, 97, 127, 191, 255, 256, 257};
#define N_EDGE ((int)(sizeof EDGE / sizeof *EDGE))

static int rnd_dim(int max) {
  int d = rnd(2) ? EDGE[rnd(N_EDGE)] : 1 + (int)rnd((uint32_t)max);
  return d > max ? max : d;
}

/* ---- correctness --------------------------------------------------------------- */

START_TEST(every_layout_matches_a_double_reference) {
  for (int t = 0; t < 120; t++) {
    int tA = t & 1, tB = (t >> 1) & 1;
    int M = rnd_dim(130), N = t % 17 == 0 ? 1025 + (int)rnd(80) : rnd_dim(140);
    int K = rnd_dim(t % 5 ? 300 : 600);
    prob p = prob_make(tA, tB, M, N, K, (int)rnd(3));
    dp_gemm_epilogue ep = {.bias = rnd(2) ? p.bias : NULL, .act = DP_GEMM_ACT_NONE};
    float *C = run_gemm(&p, &ep);
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        double ref = 0.0, mag = 0.0;
        for (int k = 0; k < K; k++) {
          double v = (double)opA(&p, i, k) * opB(&p, k, j);
          ref += v;
          mag += fabs(v);
        }
        if (ep.bias) {
          ref += ep.bias[j];
          mag += fabs(ep.bias[j]);
        }
        double got = C[(size_t)i * N + j], tol = (K + 2) * (double)FLT_EPSILON * mag + 1e-30;
        REQ(fabs(got - ref) <= tol, "tA %d tB %d M %d N %d K %d: C[%d][%d] = %.9g, want %.9g (tol %g)",
            tA, tB, M, N, K, i, j, got, ref, tol);
      }
    free(C);
    prob_free(&p);
  }
}
END_TEST

/* Shapes that reach every edge: M = 1, odd N, K = 1, K not a multiple of KC,
 * several MC blocks, several NC panels (once with several MC blocks and K
 * slices: A packed again for the second panel); narrow products (N <= 32: A read in
 * place) with partial row slivers, several MC blocks and K slices. */
static const int SHAPES[][3] = {
    {1, 1, 1},     {1, 7, 1},       {1, 33, 5},    {2, 3, 300},    {5, 2, 15},
    {13, 17, 257}, {12, 32, 256},   {6, 16, 255},  {97, 5, 33},    {100, 100, 513},
    {7, 1030, 3},  {30, 10, 64},    {8, 1029, 40}, {193, 65, 129}, {11, 45, 700},
    {1, 1, 513},   {1, 1, 512},     {2, 16, 16},   {257, 10, 600}, {101, 32, 520},
    {200, 31, 17}, {200, 1040, 300}};
#define N_SHAPES ((int)(sizeof SHAPES / sizeof *SHAPES))

START_TEST(every_tier_follows_the_fma_sequence) {
  for (int ti = 0; ti < N_TIERS; ti++) {
    if (!use_tier(TIERS[ti], "every_tier_follows_the_fma_sequence")) continue;
    for (int s = 0; s < N_SHAPES + 16; s++) {
      int M, N, K;
      if (s < N_SHAPES) {
        M = SHAPES[s][0], N = SHAPES[s][1], K = SHAPES[s][2];
      } else {
        M = 1 + (int)rnd(70), N = 1 + (int)rnd(90), K = 1 + (int)rnd(400);
      }
      for (int lay = 0; lay < 4; lay++) {
        prob p = prob_make(lay & 1, lay >> 1, M, N, K, (int)rnd(2));
        dp_gemm_epilogue ep = {.bias = (s + lay) % 2 ? p.bias : NULL,
                               .act = (s + lay) % 3 == 0 ? DP_GEMM_ACT_RELU : DP_GEMM_ACT_NONE};
        float *C = run_gemm(&p, &ep), *R = xmalloc((size_t)M * N * 4);
        contract_ref(&p, &ep, R);
        long d = first_diff(C, R, (size_t)M * N);
        REQ(d < 0, "tier %s, tA %d tB %d M %d N %d K %d: element %ld = %a, the fma sequence gives %a",
            TIERS[ti], p.tA, p.tB, M, N, K, d, (double)C[d < 0 ? 0 : d], (double)R[d < 0 ? 0 : d]);
        free(C);
        free(R);
        prob_free(&p);
      }
    }
  }
  dp__gemm_force_tier("auto");
}
END_TEST

START_TEST(tiers_give_identical_bits) {
  bool have[N_TIERS];
  int n_have = 0;
  for (int ti = 0; ti < N_TIERS; ti++) n_have += have[ti] = use_tier(TIERS[ti], "tiers_give_identical_bits");
  ck_assert(have[0]);
  if (n_have < 2) fprintf(stderr, "SKIP gemm: tiers_give_identical_bits: only one tier here\n");
  for (int s = 0; s < 40; s++) {
    int M = s < N_SHAPES ? SHAPES[s][0] : 1 + (int)rnd(100);
    int N = s < N_SHAPES ? SHAPES[s][1] : 1 + (int)rnd(100);
    int K = s < N_SHAPES ? SHAPES[s][2] : 1 + (int)rnd(600);
    prob p = prob_make(s & 1, (s >> 1) & 1, M, N, K, 1);
    dp_gemm_epilogue ep = {.bias = p.bias, .act = s % 3 ? DP_GEMM_ACT_NONE : DP_GEMM_ACT_RELU};
    float *ref = NULL;
    for (int ti = 0; ti < N_TIERS; ti++) {
      if (!have[ti]) continue;
      ck_assert_int_eq(dp__gemm_force_tier(TIERS[ti]), 0);
      float *C = run_gemm(&p, &ep);
      if (!ref) {
        ref = C;
        continue;
      }
      long d = first_diff(C, ref, (size_t)M * N);
      REQ(d < 0, "M %d N %d K %d: tier %s differs from scalar at element %ld", M, N, K,
          TIERS[ti], d);
      free(C);
    }
    free(ref);
    prob_free(&p);
  }
  dp__gemm_force_tier("auto");
}
END_TEST

/* B packed once (dp__gemm_pack_b) and read by dp__sgemm_pb: dp__sgemm's bits,
 * on every tier, for shapes across the blocking (K past KC, N past NC), both
 * layouts of B, with and without workspace. */
START_TEST(prepacked_b_gives_the_same_bits) {
  for (int ti = 0; ti < N_TIERS; ti++) {
    if (!use_tier(TIERS[ti], "prepacked_b_gives_the_same_bits")) continue;
    for (int s = 0; s < 24; s++) {
      int M = 1 + (int)rnd(s % 4 ? 70 : 260), N = 1 + (int)rnd(s % 5 ? 90 : 1100);
      int K = 1 + (int)rnd(s % 3 ? 90 : 600);
      prob p = prob_make(s & 1, (s >> 1) & 1, M, N, K, 1);
      dp_gemm_epilogue ep = {.bias = p.bias, .act = s % 3 ? DP_GEMM_ACT_NONE : DP_GEMM_ACT_RELU};
      float *ref = run_gemm(&p, &ep);
      float *bp = xmalloc(dp__gemm_packed_b_bytes(K, N) + 64);
      dp__gemm_pack_b(p.tB, K, N, p.B, p.ldb, bp);
      size_t wsb = dp__gemm_workspace_bytes(M, N, K);
      void *ws = wsb ? xmalloc(wsb) : NULL;
      float *C = xmalloc(p.c_len * sizeof(float) + 4);
      for (size_t i = 0; i < p.c_len; i++) C[i] = NAN;
      dp__sgemm_pb(p.tA, p.tB, M, N, K, p.A, p.lda, p.B, p.ldb, bp, C, p.ldc, &ep, ws);
      for (int i = 0; i < M; i++)
        REQ(memcmp(C + (size_t)i * p.ldc, ref + (size_t)i * N, (size_t)N * 4) == 0,
            "tier %s, M %d N %d K %d tB %d: row %d differs", TIERS[ti], M, N, K, p.tB, i);
      free(C);
      free(ws);
      free(bp);
      free(ref);
      prob_free(&p);
    }
  }
  dp__gemm_force_tier("auto");
}
END_TEST

/* A pack of op(B) (K, N) read on its first n columns, where
 * dp__gemm_packed_b_prefix allows it (the attention's row blocks): dp__sgemm's
 * bits on those n columns, on every tier, for any n up to N; refused for n out
 * of range, and allowed for the attention's shapes. */
START_TEST(prepacked_b_prefix_gives_the_first_columns) {
  ck_assert(dp__gemm_packed_b_prefix(64, 256, 32) &&
            dp__gemm_packed_b_prefix(64, 256, 256));
  ck_assert(dp__gemm_packed_b_prefix(64, 250, 250) &&
            dp__gemm_packed_b_prefix(64, 256, 33));
  ck_assert(!dp__gemm_packed_b_prefix(64, 256, 0) &&
            !dp__gemm_packed_b_prefix(64, 256, 288));
  int checked = 0;
  for (int ti = 0; ti < N_TIERS; ti++) {
    if (!use_tier(TIERS[ti], "prepacked_b_prefix_gives_the_first_columns")) continue;
    for (int s = 0; s < 16; s++) {
      int M = 1 + (int)rnd(70), N = 1 + (int)rnd(s % 4 ? 300 : 1100), K = 1 + (int)rnd(300);
      prob p = prob_make(s & 1, (s >> 1) & 1, M, N, K, 1);
      float *bp = xmalloc(dp__gemm_packed_b_bytes(K, N) + 64);
      dp__gemm_pack_b(p.tB, K, N, p.B, p.ldb, bp);
      void *ws = xmalloc(dp__gemm_workspace_bytes(M, N, K) + 64);
      float *C = xmalloc((size_t)M * N * 4), *R = xmalloc((size_t)M * N * 4);
      for (int n = 1; n <= N; n += n % 32 ? 1 + (int)rnd(40) : 32) {
        if (!dp__gemm_packed_b_prefix(K, N, n)) continue;
        dp__sgemm(p.tA, p.tB, M, n, K, p.A, p.lda, p.B, p.ldb, R, n, NULL, ws);
        for (size_t i = 0; i < (size_t)M * n; i++) C[i] = NAN;
        dp__sgemm_pb(p.tA, p.tB, M, n, K, p.A, p.lda, p.B, p.ldb, bp, C, n, NULL, ws);
        REQ(memcmp(C, R, (size_t)M * n * 4) == 0, "tier %s, M %d N %d K %d tB %d: n %d",
            TIERS[ti], M, N, K, p.tB, n);
        checked++;
      }
      free(C), free(R), free(ws), free(bp);
      prob_free(&p);
    }
  }
  dp__gemm_force_tier("auto");
  ck_assert_int_ge(checked, 20);
}
END_TEST

/* Rows [r0, r1) computed on their own equal the same rows of the whole
 * problem; the same for columns [c0, c1) (with the bias slice). */
START_TEST(rows_and_columns_do_not_depend_on_the_problem_size) {
  for (int t = 0; t < 24; t++) {
    int M = 1 + (int)rnd(t % 4 ? 60 : 230), N = 1 + (int)rnd(t % 6 ? 80 : 1100);
    int K = 1 + (int)rnd(t % 3 ? 80 : 600);
    prob p = prob_make(t & 1, (t >> 1) & 1, M, N, K, 0);
    dp_gemm_epilogue ep = {.bias = p.bias, .act = t % 5 == 0 ? DP_GEMM_ACT_RELU : DP_GEMM_ACT_NONE};
    float *full = run_gemm(&p, &ep);
    size_t wsb = dp__gemm_workspace_bytes(M, N, K);
    void *ws = wsb ? xmalloc(wsb) : NULL;
    /* row subsets */
    float *part = xmalloc((size_t)M * N * 4);
    for (int r0 = 0; r0 < M;) {
      int r1 = r0 + 1 + (int)rnd((uint32_t)(M - r0));
      const float *A = p.tA ? p.A + r0 : p.A + (size_t)r0 * p.lda;
      dp__sgemm(p.tA, p.tB, r1 - r0, N, K, A, p.lda, p.B, p.ldb, part + (size_t)r0 * N, N, &ep,
                ws);
      r0 = r1;
    }
    long d = first_diff(part, full, (size_t)M * N);
    REQ(d < 0, "tA %d tB %d M %d N %d K %d: row-split result differs at %ld", p.tA, p.tB, M, N,
        K, d);
    /* column subsets, written into the full-width output */
    for (int c0 = 0; c0 < N;) {
      int c1 = c0 + 1 + (int)rnd((uint32_t)(N - c0));
      const float *B = p.tB ? p.B + (size_t)c0 * p.ldb : p.B + c0;
      dp_gemm_epilogue e2 = {.bias = p.bias + c0, .act = ep.act};
      dp__sgemm(p.tA, p.tB, M, c1 - c0, K, p.A, p.lda, B, p.ldb, part + c0, N, &e2, ws);
      c0 = c1;
    }
    d = first_diff(part, full, (size_t)M * N);
    REQ(d < 0, "tA %d tB %d M %d N %d K %d: column-split result differs at %ld", p.tA, p.tB, M,
        N, K, d);
    free(part);
    free(ws);
    free(full);
    prob_free(&p);
  }
}
END_TEST

/* The linear layer's three products on a micro-batch of rows, as the CPU
 * backend calls them, against the contract. */
START_TEST(linear_layer_products_follow_the_contract) {
  const int rows = 37, in = 300, out = 45;
  prob fw = prob_make(0, 1, rows, out, in, 0); /* X (rows, in), W (out, in) */
  dp_gemm_epilogue ep = {.bias = fw.bias};
  float *y = run_gemm(&fw, &ep), *r = xmalloc((size_t)out * in * 4); /* the largest */
  contract_ref(&fw, &ep, r);
  ck_assert_int_lt(first_diff(y, r, (size_t)rows * out), 0);
  /* grad-input: dY (rows, out) · W (out, in) */
  prob gi = prob_make(0, 0, rows, in, out, 0);
  float *dx = run_gemm(&gi, NULL);
  contract_ref(&gi, NULL, r);
  ck_assert_int_lt(first_diff(dx, r, (size_t)rows * in), 0);
  /* grad-weight: dY^T (out, rows) · X (rows, in), K = rows */
  prob gw = prob_make(1, 0, out, in, rows, 0);
  float *dw = run_gemm(&gw, NULL);
  contract_ref(&gw, NULL, r);
  ck_assert_int_lt(first_diff(dw, r, (size_t)out * in), 0);
  free(y);
  free(dx);
  free(dw);
  free(r);
  prob_free(&fw);
  prob_free(&gi);
  prob_free(&gw);
}
END_TEST

/* ---- epilogue ----------------------------------------------------------------- */

START_TEST(bias_is_added_once_after_the_whole_sum) {
  /* k order matters: 1e8 + 1 - 1e8 is 0 in float; the bias comes after. */
  for (int ti = 0; ti < N_TIERS; ti++) {
    if (!use_tier(TIERS[ti], "bias_is_added_once_after_the_whole_sum")) continue;
    for (int K = 3; K <= 600; K += 597) { /* also across a KC block boundary */
      float *A = xmalloc((size_t)K * 4), *B = xmalloc((size_t)K * 4);
      for (int k = 0; k < K; k++) A[k] = B[k] = 0.0f;
      A[0] = 1e8f, A[K / 2] = 1.0f, A[K - 1] = -1e8f;
      B[0] = B[K / 2] = B[K - 1] = 1.0f;
      float bias = 0.5f, c = -1.0f;
      dp_gemm_epilogue ep = {.bias = &bias};
      size_t wsb = dp__gemm_workspace_bytes(1, 1, K);
      void *ws = wsb ? xmalloc(wsb) : NULL;
      dp__sgemm(0, 0, 1, 1, K, A, K, B, 1, &c, 1, &ep, ws);
      free(ws);
      ck_assert_msg(c == 0.5f, "tier %s K %d: %.9g, want 0.5", TIERS[ti], K, (double)c);
      free(A);
      free(B);
    }
  }
  dp__gemm_force_tier("auto");
}
END_TEST

START_TEST(relu_zeroes_negatives_and_signed_zeros_and_passes_nan) {
  /* C = A (1 x 1 per column) with A's values in the columns: K = 1, B = 1. */
  const float v[] = {-2.0f, -0.0f, 0.0f, 3.0f, NAN, -INFINITY, INFINITY, 1e-40f, -1e-40f};
  const int N = (int)(sizeof v / sizeof *v);
  for (int ti = 0; ti < N_TIERS; ti++) {
    if (!use_tier(TIERS[ti], "relu_zeroes_negatives_and_signed_zeros_and_passes_nan")) continue;
    for (int pad = 0; pad < 40; pad += 39) { /* short and full tiles */
      int n = N + pad;
      float *B = xmalloc((size_t)n * 4), *C = xmalloc((size_t)n * 4), *bias = xmalloc((size_t)n * 4);
      for (int j = 0; j < n; j++) B[j] = v[j % N], bias[j] = -0.0f;
      float one = 1.0f;
      dp_gemm_epilogue ep = {.bias = bias, .act = DP_GEMM_ACT_RELU};
      dp__sgemm(0, 0, 1, n, 1, &one, 1, B, n, C, n, &ep, NULL);
      for (int j = 0; j < n; j++) {
        float x = v[j % N], want = (x + -0.0f) <= 0.0f ? 0.0f : x + -0.0f;
        REQ(isnan(want) ? isnan(C[j]) : memcmp(&C[j], &want, 4) == 0,
            "tier %s: relu(%g) = %g (bits %08x)", TIERS[ti], (double)x, (double)C[j],
            *(uint32_t *)(void *)&C[j]);
      }
      free(B);
      free(C);
      free(bias);
    }
  }
  dp__gemm_force_tier("auto");
}
END_TEST

START_TEST(k_zero_gives_the_epilogue_of_zero) {
  float bias[3] = {1.5f, -2.0f, -0.0f}, C[6];
  dp_gemm_epilogue ep = {.bias = bias, .act = DP_GEMM_ACT_NONE};
  dp__sgemm(0, 1, 2, 3, 0, NULL, 1, NULL, 1, C, 3, &ep, NULL);
  for (int i = 0; i < 6; i++) {
    float want = 0.0f + bias[i % 3];
    ck_assert(memcmp(&C[i], &want, 4) == 0);
  }
  ep.act = DP_GEMM_ACT_RELU;
  dp__sgemm(0, 1, 2, 3, 0, NULL, 1, NULL, 1, C, 3, &ep, NULL);
  ck_assert(C[0] == 1.5f && C[1] == 0.0f && !signbit(C[1]) && !signbit(C[2]));
  dp__sgemm(0, 1, 2, 3, 0, NULL, 1, NULL, 1, C, 3, NULL, NULL);
  for (int i = 0; i < 6; i++) ck_assert(C[i] == 0.0f && !signbit(C[i]));
}
END_TEST

/* on every tier, with widths of one vector to several */
START_TEST(colsum_is_an_ascending_row_sum) {
  for (int t = 0; t < 20; t++) {
    int M = 1 + (int)rnd(200), N = t < 3 ? 64 * (t + 1) : 1 + (int)rnd(200),
        lda = N + (int)rnd(3);
    float *A = xmalloc((size_t)M * lda * 4), *out = xmalloc((size_t)(N + 1) * 4);
    for (int i = 0; i < M * lda; i++) A[i] = rndf();
    for (int ti = 0; ti < N_TIERS; ti++) {
      if (!use_tier(TIERS[ti], "colsum_is_an_ascending_row_sum")) continue;
      out[N] = 12345.0f;
      dp__gemm_colsum(M, N, A, lda, out);
      for (int j = 0; j < N; j++) {
        float s = 0.0f;
        for (int i = 0; i < M; i++) s += A[(size_t)i * lda + j];
        REQ(memcmp(&s, &out[j], 4) == 0, "%s, M %d N %d: column %d", TIERS[ti], M, N, j);
      }
      REQ(out[N] == 12345.0f, "%s, M %d N %d: wrote past the sums", TIERS[ti], M, N);
    }
    free(A);
    free(out);
  }
  dp__gemm_force_tier("auto");
}
END_TEST

/* ---- memory -------------------------------------------------------------------- */

/* The call writes only C's M x N block and the workspace's first
 * dp__gemm_workspace_bytes bytes, the last of which it does write; it does not
 * write A or B. */
START_TEST(workspace_is_the_only_scratch) {
  const size_t slack = 4096;
  for (int ti = 0; ti < N_TIERS; ti++) {
    if (!use_tier(TIERS[ti], "workspace_is_the_only_scratch")) continue;
    for (int t = 0; t < 24; t++) {
      int M = t < N_SHAPES ? SHAPES[t][0] : 1 + (int)rnd(150);
      int N = t < N_SHAPES ? SHAPES[t][1] : 1 + (int)rnd(150);
      int K = t < N_SHAPES ? SHAPES[t][2] : 1 + (int)rnd(400);
      prob p = prob_make(t & 1, (t >> 1) & 1, M, N, K, 3);
      float *a0 = xmalloc(p.a_len * 4), *b0 = xmalloc(p.b_len * 4);
      memcpy(a0, p.A, p.a_len * 4);
      memcpy(b0, p.B, p.b_len * 4);
      size_t need = dp__gemm_workspace_bytes(M, N, K);
      unsigned char *ws = xmalloc(need + slack);
      memset(ws, 0xa5, need + slack);
      float *C = xmalloc(p.c_len * 4);
      for (size_t i = 0; i < p.c_len; i++) C[i] = -7.0f;
      dp_gemm_epilogue ep = {.bias = p.bias};
      dp__sgemm(p.tA, p.tB, M, N, K, p.A, p.lda, p.B, p.ldb, C, p.ldc, &ep, ws);
      for (size_t b = need; b < need + slack; b++)
        REQ(ws[b] == 0xa5, "tier %s M %d N %d K %d: workspace byte %zu of %zu written", TIERS[ti],
            M, N, K, b, need);
      if (need) {
        static const unsigned char pat[4] = {0xa5, 0xa5, 0xa5, 0xa5};
        REQ(memcmp(ws + need - 4, pat, 4) != 0,
            "tier %s M %d N %d K %d: the workspace's last word (%zu) is not written", TIERS[ti],
            M, N, K, need);
      }
      for (int i = 0; i < M; i++)
        for (int j = N; j < p.ldc; j++)
          REQ(C[(size_t)i * p.ldc + j] == -7.0f, "C padding [%d][%d] written", i, j);
      ck_assert(memcmp(a0, p.A, p.a_len * 4) == 0 && memcmp(b0, p.B, p.b_len * 4) == 0);
      free(C);
      free(ws);
      free(a0);
      free(b0);
      prob_free(&p);
    }
  }
  dp__gemm_force_tier("auto");
}
END_TEST

START_TEST(workspace_size_rules) {
  /* nothing to pack */
  ck_assert_uint_eq(dp__gemm_workspace_bytes(0, 5, 5), 0);
  ck_assert_uint_eq(dp__gemm_workspace_bytes(5, 0, 5), 0);
  ck_assert_uint_eq(dp__gemm_workspace_bytes(5, 5, 0), 0);
  /* the seed example's Linear(5, 2) on 15 rows packs on the stack */
  ck_assert_uint_eq(dp__gemm_workspace_bytes(15, 2, 5), 0);
  ck_assert_uint_eq(dp__gemm_workspace_bytes(2, 5, 15), 0);
  /* tiny problems run unpacked, whatever their panels would take */
  ck_assert_uint_eq(dp__gemm_workspace_bytes(1, 1, 512), 0);
  ck_assert_uint_gt(dp__gemm_workspace_bytes(1, 1, 513), 0);
  /* large problems need some; bounded by the blocking */
  ck_assert_uint_gt(dp__gemm_workspace_bytes(512, 512, 512), 0);
  ck_assert_uint_eq(dp__gemm_workspace_bytes(4096, 4096, 4096),
                    dp__gemm_workspace_bytes(100000, 100000, 100000));
  ck_assert_uint_le(dp__gemm_workspace_bytes(100000, 100000, 100000), 4u << 20);
  /* non-decreasing in each dimension */
  const int d[] = {1, 7, 12, 33, 96, 97, 255, 256, 257, 1000, 1024, 1025, 3000};
  const int nd = (int)(sizeof d / sizeof *d);
  for (int a = 0; a < nd; a++)
    for (int b = 0; b < nd; b++)
      for (int c = 0; c + 1 < nd; c++) {
        REQ(dp__gemm_workspace_bytes(d[c], d[a], d[b]) <= dp__gemm_workspace_bytes(d[c + 1], d[a], d[b]), "M");
        REQ(dp__gemm_workspace_bytes(d[a], d[c], d[b]) <= dp__gemm_workspace_bytes(d[a], d[c + 1], d[b]), "N");
        REQ(dp__gemm_workspace_bytes(d[a], d[b], d[c]) <= dp__gemm_workspace_bytes(d[a], d[b], d[c + 1]), "K");
      }
}
END_TEST

START_TEST(linear_workspace_is_the_largest_product) {
  dp_layer l = {.kind = DP_LAYER_LINEAR, .in = 300, .out = 700, .bias = 1};
  int rows = 64;
  size_t fw = dp__gemm_workspace_bytes(rows, 700, 300), gw = dp__gemm_workspace_bytes(700, 300, rows);
  size_t gi = dp__gemm_workspace_bytes(rows, 300, 700);
  size_t all = fw > gw ? fw : gw;
  all = gi > all ? gi : all;
  ck_assert_uint_eq(dp__linear_workspace_bytes(&l, rows, false, true), fw);
  ck_assert_uint_eq(dp__linear_workspace_bytes(&l, rows, true, true), all);
  size_t no_gi = fw > gw ? fw : gw;
  ck_assert_uint_eq(dp__linear_workspace_bytes(&l, rows, true, false), no_gi);
  dp_layer relu = {.kind = DP_LAYER_RELU, .in = 700, .out = 700};
  ck_assert_uint_eq(dp__linear_workspace_bytes(&relu, rows, true, true), 0);
}
END_TEST

START_TEST(without_workspace_the_unpacked_path_gives_the_same_bits) {
  for (int t = 0; t < 8; t++) {
    int M = 20 + (int)rnd(100), N = 40 + (int)rnd(100), K = 100 + (int)rnd(400);
    prob p = prob_make(t & 1, (t >> 1) & 1, M, N, K, 0);
    ck_assert_uint_gt(dp__gemm_workspace_bytes(M, N, K), 0);
    dp_gemm_epilogue ep = {.bias = p.bias, .act = t % 3 == 0 ? DP_GEMM_ACT_RELU : DP_GEMM_ACT_NONE};
    float *C = run_gemm(&p, &ep), *U = xmalloc((size_t)M * N * 4);
    dp__sgemm(p.tA, p.tB, M, N, K, p.A, p.lda, p.B, p.ldb, U, N, &ep, NULL);
    ck_assert_int_lt(first_diff(C, U, (size_t)M * N), 0);
    free(C);
    free(U);
    prob_free(&p);
  }
}
END_TEST

START_TEST(tier_selection) {
  ck_assert_int_eq(dp__gemm_force_tier("sse9"), -1);
  ck_assert(!dp__gemm_tier_supported("sse9"));
  ck_assert(dp__gemm_tier_supported("scalar"));
  ck_assert_int_eq(dp__gemm_force_tier("scalar"), 0);
  ck_assert_str_eq(dp__gemm_tier_name(), "scalar");
  ck_assert_int_eq(dp__gemm_force_tier("auto"), 0);
  const char *best = dp__gemm_tier_name();
#if HAVE_X86
  __builtin_cpu_init();
  const char *want = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")
                         ? "avx512"
                     : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "avx2"
                                                                                         : "scalar";
  ck_assert_str_eq(best, want);
#endif
  ck_assert_int_eq(dp__gemm_force_tier(NULL), 0);
  ck_assert_str_eq(dp__gemm_tier_name(), best);
  for (int ti = 0; ti < N_TIERS; ti++)
    ck_assert_int_eq(dp__gemm_force_tier(TIERS[ti]), dp__gemm_tier_supported(TIERS[ti]) ? 0 : -1);
  dp__gemm_force_tier("auto");
}
END_TEST

/* ---- in the CPU backend ----------------------------------------------------------- */

/* A model wide enough that its GEMMs need planned workspace: the planner
 * reserves dp__model_workspace_bytes (then, on a device with several
 * micro-batches, 64-byte aligned, the forward's packed weights: the largest
 * layer's dp__gemm_packed_b_bytes), a training step and a forward write its last
 * byte (the arena's high-water mark is the plan's end), and the bits do not
 * depend on the device count. */
static const char WIDE_SPEC[] = "input 64\nlinear 160\nrelu\nlinear 96\ntanh\nlinear 10\n"
                                "loss softmax_cross_entropy\n";

static uint64_t wide_run(int n_dev, int inference, bool check_high_water) {
  enum { BATCH = 64, IN = 64, OUT = 10 };
  dp_config c = config_of(BATCH, n_dev, DP_OPT_SGD);
  c.micro_batch = 16;
  c.inference = inference;
  c.seed = 3;
  rig r;
  rig_open(&r, WIDE_SPEC, &c);
  dp_plan *p = r.p;
  dp_ctx *x = r.c;
  static float in[BATCH * IN], y[BATCH * OUT];
  static int32_t t[BATCH];
  for (int i = 0; i < BATCH * IN; i++) in[i] = rndf();
  for (int r = 0; r < BATCH; r++) t[r] = (int32_t)(r % OUT);
  if (inference) {
    ck_assert_msg(dp_forward(x, BATCH, IN, in, y) == DP_OK, "%s", dp_last_error());
  } else {
    float loss;
    for (int s = 0; s < 2; s++)
      ck_assert_msg(dp_train_step(x, BATCH, IN, in, t, &loss) == DP_OK, "%s", dp_last_error());
  }
  for (int d = 0; d < dp_plan_n_devices(p); d++) {
    dp_region_info ws = dp_plan_region(p, d, DP_REGION_WORKSPACE);
    const dp_model *pm = dp_plan_model(p);
    size_t gemm = dp__model_workspace_bytes(pm, 16, !inference);
    int n_mb = dp_plan_device_micro_batches(p, d);
    size_t packed = 0; /* every layer packs: no recompute */
    for (int i = 0; i < pm->n_layers; i++)
      if (pm->layers[i].kind == DP_LAYER_LINEAR) {
        size_t b = dp__gemm_packed_b_bytes(pm->layers[i].in, pm->layers[i].out);
        packed = b > packed ? b : packed;
      }
    ck_assert_uint_eq(ws.size, n_mb > 1 ? (gemm + 63) / 64 * 64 + packed : gemm);
    ck_assert_uint_gt(ws.size, 0);
    if (!check_high_water) continue;
    size_t end = 0;
    for (int r = 0; r < DP_REGION_COUNT; r++) {
      dp_region_info ri = dp_plan_region(p, d, (dp_region)r);
      if (ri.size && ri.offset + ri.size > end) end = ri.offset + ri.size;
    }
    ck_assert_msg(dp_ctx_high_water(x, d) == end, "%d devices, %s: device %d high water %zu, plan end %zu",
                  n_dev, inference ? "inference" : "training", d, dp_ctx_high_water(x, d), end);
  }
  uint64_t h = inference ? dp_hash_bytes(y, sizeof y) : dp_params_hash(x);
  rig_close(&r);
  return h;
}

START_TEST(planned_workspace_is_used_to_its_last_byte) {
  for (int inference = 0; inference <= 1; inference++) {
    uint64_t h1 = 0;
    for (int n_dev = 1; n_dev <= 4; n_dev *= 2) {
      rng = 0x243f6a8885a308d3ull; /* the same batch for every device count */
      uint64_t h = wide_run(n_dev, inference, true);
      if (n_dev == 1) h1 = h;
      ck_assert_msg(h == h1, "%s: %d devices give other bits than 1",
                    inference ? "inference" : "training", n_dev);
    }
  }
}
END_TEST

/* ---- benchmark (DP_GEMM_BENCH=1) ---------------------------------------------- */

/* CPU time of this thread: other processes on a shared machine do not count. */
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#if HAVE_X86
/* FMA throughput: 12 independent chains of n fused multiply-adds each. */
#define PEAK_BODY(V, SET1, FMA, ADD, LANES)                                                 \
  V x = SET1(0.5f), y = SET1(0.25f), a0 = SET1(0.f), a1 = SET1(1.f), a2 = SET1(2.f),       \
    a3 = SET1(3.f), a4 = SET1(4.f), a5 = SET1(5.f), a6 = SET1(6.f), a7 = SET1(7.f),        \
    a8 = SET1(8.f), a9 = SET1(9.f), a10 = SET1(10.f), a11 = SET1(11.f);                    \
  for (long k = 0; k < n; k++) {                                                           \
    __asm__ volatile("" : "+v"(x), "+v"(y));                                               \
    a0 = FMA(a0, x, y), a1 = FMA(a1, x, y), a2 = FMA(a2, x, y), a3 = FMA(a3, x, y);        \
    a4 = FMA(a4, x, y), a5 = FMA(a5, x, y), a6 = FMA(a6, x, y), a7 = FMA(a7, x, y);        \
    a8 = FMA(a8, x, y), a9 = FMA(a9, x, y), a10 = FMA(a10, x, y), a11 = FMA(a11, x, y);    \
  }                                                                                        \
  V s = ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7)));                 \
  s = ADD(s, ADD(ADD(a8, a9), ADD(a10, a11)));                                             \
  float o[LANES];                                                                          \
  memcpy(o, &s, sizeof o);                                                                 \
  return o[0];

__attribute__((target("avx2,fma"), noinline)) static float peak_avx2(long n) {
  PEAK_BODY(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, 8)
}
__attribute__((target("avx512f,fma"), noinline)) static float peak_avx512(long n) {
  PEAK_BODY(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, 16)
}
#endif

static volatile float sink;

/* Best GFLOP/s of the tier's FMA loop (0 when the CPU lacks it). */
static double peak_gflops(const char *tier) {
#if HAVE_X86
  if (!dp__gemm_tier_supported(tier) || strcmp(tier, "scalar") == 0) return 0.0;
  bool wide = strcmp(tier, "avx512") == 0;
  long n = 200000;
  double best = 0.0;
  for (int r = 0; r < 40; r++) {
    double t = now_s();
    sink = wide ? peak_avx512(n) : peak_avx2(n);
    t = now_s() - t;
    double g = (double)n * 12 * (wide ? 32 : 16) / t * 1e-9;
    best = g > best ? g : best;
  }
  return best;
#else
  (void)tier;
  return 0.0;
#endif
}

/* The linear layer's loops before the packed GEMM (lib/cpu/backend.c). */
static void naive_forward(int n, int in, int out, const float *x, const float *w, float *y) {
  for (int r = 0; r < n; r++)
    for (int o = 0; o < out; o++) {
      float acc = 0.0f;
      for (int k = 0; k < in; k++) acc += x[(size_t)r * in + k] * w[(size_t)o * in + k];
      y[(size_t)r * out + o] = acc;
    }
}
static void naive_grad_weight(int n, int in, int out, const float *dy, const float *x, float *dw) {
  for (int o = 0; o < out; o++) {
    float *d = dw + (size_t)o * in;
    for (int k = 0; k < in; k++) d[k] = 0.0f;
    for (int r = 0; r < n; r++) {
      float g = dy[(size_t)r * out + o];
      for (int k = 0; k < in; k++) d[k] += g * x[(size_t)r * in + k];
    }
  }
}
static void naive_grad_input(int n, int in, int out, const float *dy, const float *w, float *dx) {
  for (int r = 0; r < n; r++) {
    float *d = dx + (size_t)r * in;
    for (int k = 0; k < in; k++) d[k] = 0.0f;
    for (int o = 0; o < out; o++) {
      float g = dy[(size_t)r * out + o];
      for (int k = 0; k < in; k++) d[k] += g * w[(size_t)o * in + k];
    }
  }
}

/* Seconds per call of product `which` (0 forward, 1 grad-input, 2 grad-weight),
 * packed (naive = false) or the old loops: the best of many short batches (a
 * shared machine gives noisy long ones). */
static double time_product(int which, bool naive, int rows, int in, int out, const float *x,
                           const float *w, const float *dy, float *o, void *ws) {
  double flops = 2.0 * rows * in * out, best = 1e30;
  int reps = (int)(1e7 / flops / (naive ? 20 : 1)) + 1, trials = naive ? 5 : 25;
  for (int t = 0; t < trials; t++) {
    double t0 = now_s();
    for (int r = 0; r < reps; r++) {
      if (naive) {
        if (which == 0) naive_forward(rows, in, out, x, w, o);
        else if (which == 1) naive_grad_input(rows, in, out, dy, w, o);
        else naive_grad_weight(rows, in, out, dy, x, o);
      } else {
        if (which == 0) dp__sgemm(0, 1, rows, out, in, x, in, w, in, o, out, NULL, ws);
        else if (which == 1) dp__sgemm(0, 0, rows, in, out, dy, out, w, in, o, in, NULL, ws);
        else dp__sgemm(1, 0, out, in, rows, dy, out, x, in, o, in, NULL, ws);
      }
    }
    double d = (now_s() - t0) / reps;
    best = d < best ? d : best;
  }
  return best;
}

START_TEST(bench) {
  if (!getenv("DP_GEMM_BENCH")) return;
  /* (rows, in, out): square problems, then the models' shapes */
  static const int sh[][3] = {{512, 512, 512},  {1024, 1024, 1024}, {256, 256, 256},
                              {8, 1024, 1024},  {64, 1024, 1024},   {256, 784, 128},
                              {32, 64, 128},    {32, 128, 10},      {64, 256, 256},
                              {128, 512, 512},  {16, 12, 16},       {15, 5, 2}};
  const int ns = (int)(sizeof sh / sizeof *sh);
  printf("gemm bench: GFLOP/s, one thread, thread CPU time, best of many runs.\n"
         "A linear layer's products, rows x in -> out: fwd Y = X W^T, dX = dY W, dW = dY^T X.\n");
  double peak[N_TIERS] = {0};
  for (int ti = N_TIERS - 1; ti >= 0; ti--) {
    peak[ti] = peak_gflops(TIERS[ti]);
    if (peak[ti] > 0) printf("  %s FMA peak: %.1f GFLOP/s\n", TIERS[ti], peak[ti]);
  }
  for (int s = 0; s < ns; s++) {
    int rows = sh[s][0], in = sh[s][1], out = sh[s][2];
    float *x = xmalloc((size_t)rows * in * 4), *w = xmalloc((size_t)out * in * 4);
    float *dy = xmalloc((size_t)rows * out * 4);
    size_t big = (size_t)rows * in > (size_t)out * in ? (size_t)rows * in : (size_t)out * in;
    big = big > (size_t)rows * out ? big : (size_t)rows * out;
    float *o = xmalloc(big * 4);
    for (size_t i = 0; i < (size_t)rows * in; i++) x[i] = rndf();
    for (size_t i = 0; i < (size_t)out * in; i++) w[i] = rndf();
    for (size_t i = 0; i < (size_t)rows * out; i++) dy[i] = rndf();
    dp_layer l = {.kind = DP_LAYER_LINEAR, .in = in, .out = out};
    size_t wsb = dp__linear_workspace_bytes(&l, rows, true, true);
    void *ws = wsb ? xmalloc(wsb) : NULL;
    double fl = 2.0 * rows * in * out * 1e-9;
    printf("  %4d x %4d -> %4d  ", rows, in, out);
    for (int ti = N_TIERS - 1; ti >= 0; ti--) {
      if (dp__gemm_force_tier(TIERS[ti]) != 0) continue;
      if (ti == 0 && fl > 0.3) {
        printf("| %s   (skipped)        ", TIERS[ti]);
        continue;
      }
      printf("| %s", TIERS[ti]);
      double sum = 0.0;
      for (int p = 0; p < 3; p++) {
        double g = fl / time_product(p, false, rows, in, out, x, w, dy, o, ws);
        sum += g;
        printf(" %6.1f", g);
      }
      if (peak[ti] > 0) printf(" (%2.0f%%)", 100.0 * sum / 3 / peak[ti]);
      printf(" ");
    }
    printf("| naive");
    for (int p = 0; p < 3; p++) {
      if (fl > 0.6) printf("     -");
      else printf(" %5.2f", fl / time_product(p, true, rows, in, out, x, w, dy, o, ws));
    }
    printf("\n");
    fflush(stdout);
    free(x);
    free(w);
    free(dy);
    free(o);
    free(ws);
  }
  dp__gemm_force_tier("auto");
}
END_TEST

Suite *gemm_suite(void) {
  Suite *s = suite_create("gemm");
  TCase *tc = tcase_create("correctness");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, every_layout_matches_a_double_reference);
  tcase_add_test(tc, linear_layer_products_follow_the_contract);
  suite_add_tcase(s, tc);

  tc = tcase_create("determinism");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, every_tier_follows_the_fma_sequence);
  tcase_add_test(tc, tiers_give_identical_bits);
  tcase_add_test(tc, prepacked_b_gives_the_same_bits);
  tcase_add_test(tc, prepacked_b_prefix_gives_the_first_columns);
  tcase_add_test(tc, rows_and_columns_do_not_depend_on_the_problem_size);
  tcase_add_test(tc, without_workspace_the_unpacked_path_gives_the_same_bits);
  suite_add_tcase(s, tc);

  tc = tcase_create("epilogue");
  tcase_add_test(tc, bias_is_added_once_after_the_whole_sum);
  tcase_add_test(tc, relu_zeroes_negatives_and_signed_zeros_and_passes_nan);
  tcase_add_test(tc, k_zero_gives_the_epilogue_of_zero);
  tcase_add_test(tc, colsum_is_an_ascending_row_sum);
  suite_add_tcase(s, tc);

  tc = tcase_create("memory");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, workspace_is_the_only_scratch);
  tcase_add_test(tc, workspace_size_rules);
  tcase_add_test(tc, linear_workspace_is_the_largest_product);
  suite_add_tcase(s, tc);

  tc = tcase_create("tiers");
  tcase_add_test(tc, tier_selection);
  suite_add_tcase(s, tc);

  tc = tcase_create("backend");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, planned_workspace_is_used_to_its_last_byte);
  suite_add_tcase(s, tc);

  tc = tcase_create("bench");
  tcase_set_tags(tc, "bench");
  tcase_set_timeout(tc, 1200);
  tcase_add_test(tc, bench);
  suite_add_tcase(s, tc);
  return s;
}
