/* Tests of the bf16 conversions and the bf16 GEMM (lib/cpu/bf16.c): the
 * conversions against a reference written the straightforward way, and the
 * GEMM against the contract of bf16.h implemented literally here (DAZ and FTZ
 * in software, tininess after rounding; not MXCSR), bit for bit, on every tier
 * the CPU has, plus the avx512bf16 tier's pair packing through a kernel
 * written here (any CPU) and its self-check.
 *
 *   DP_GEMM_BENCH=1 CK_RUN_CASE=bench build/test_dp bf16
 * prints GFLOP/s of the linear layer's products, bf16 against fp32, per tier. */
#include "cpu/bf16.h"
#include "util/expf.h"

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
#define REQ(expr, ...)                                                                     \
  do {                                                                                     \
    if (!(expr)) ck_assert_msg(expr, __VA_ARGS__);                                         \
  } while (0)

/* ---- helpers ----------------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33) % n;
}
static uint32_t rnd32(void) { return rnd(1u << 16) << 16 | rnd(1u << 16); }

/* bit casts: util/expf.h's */
static uint32_t f2u(float x) { return dp__f32_bits(x); }
static float u2f(uint32_t u) { return dp__f32_of(u); }

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  ck_assert_ptr_nonnull(p);
  return p;
}

/* ---- the references ------------------------------------------------------------ */

/* from_f32: keep the upper half, then look at the dropped one. */
static uint16_t ref_from(float x) {
  uint32_t u = f2u(x);
  if (isnan(x)) return (uint16_t)((u >> 16 & 0x8000u) | 0x7fc0u);
  uint32_t hi = u >> 16, lo = u & 0xffffu;
  if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) hi++;
  return (uint16_t)hi;
}
static float ref_to(uint16_t h) { return u2f((uint32_t)h << 16); }

static float ref_daz(float x) {
  return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x;
}

/* How the arithmetic may go wrong: the test kernels of the self-check. */
enum { OK, NO_DAZ, NO_FTZ, FTZ_BEFORE_ROUNDING, FTZ_OF_DENORMALS, EVEN_FIRST, NO_LOAD };

/* fma_d: x y + z rounded once to nearest even, DAZ on the inputs, FTZ on
 * the output when it is tiny after rounding to 24 bits with an unbounded
 * exponent (decided on the same sum scaled by 2^40 into the normal range). */
static float fma_v(float x, float y, float z, int how) {
  if (how != NO_DAZ) x = ref_daz(x), y = ref_daz(y), z = ref_daz(z);
  float r = fmaf(x, y, z);
  if (how == NO_FTZ || isnan(r) || r == 0.0f || fabsf(r) >= 0x1p-125f) return r;
  bool tiny;
  if (x == 0.0f || y == 0.0f) /* z + 0: exact, and z is not denormal */
    tiny = fabsf(r) < FLT_MIN;
  else if (how == FTZ_BEFORE_ROUNDING)
    tiny = fabs((double)x * y + z) < FLT_MIN;
  else if (how == FTZ_OF_DENORMALS)
    tiny = fabsf(r) < FLT_MIN;
  else
    tiny = fabsf(fmaf(x * 0x1p40f, y, z * 0x1p40f)) < 0x1p-86f;
  return tiny ? copysignf(0.0f, r) : r;
}

typedef struct {
  int tA, tB, M, N, K, lda, ldb, ldc;
  dp_bf16_store as, bs, cs;
  void *A, *B;
  float *bias;
  dp_gemm_epilogue ep;
} prob;

/* op(A)[i][k] and op(B)[k][j] as the bf16 values the contract reads. */
static float opel(const void *p, dp_bf16_store s, size_t at) {
  return s == DP_BF16_STORE_BF16 ? ref_to(((const dp_bf16 *)p)[at])
                                 : ref_to(ref_from(((const float *)p)[at]));
}
static float opA(const prob *p, int i, int k) {
  return opel(p->A, p->as, p->tA ? (size_t)k * p->lda + i : (size_t)i * p->lda + k);
}
static float opB(const prob *p, int k, int j) {
  return opel(p->B, p->bs, p->tB ? (size_t)j * p->ldb + k : (size_t)k * p->ldb + j);
}

/* The contract, literally: the element before its store. */
static float contract(const prob *p, int i, int j, int how) {
  float acc = 0.0f;
  for (int q = 0; 2 * q < p->K; q++) {
    int k1 = how == EVEN_FIRST ? 2 * q : 2 * q + 1,
        k0 = how == EVEN_FIRST ? 2 * q + 1 : 2 * q;
    if (k1 < p->K) acc = fma_v(opA(p, i, k1), opB(p, k1, j), acc, how);
    if (k0 < p->K) acc = fma_v(opA(p, i, k0), opB(p, k0, j), acc, how);
  }
  if (p->ep.bias) acc = fma_v(acc, 1.0f, p->ep.bias[j], how); /* add_d */
  if (p->ep.act == DP_GEMM_ACT_RELU) acc = acc <= 0.0f ? 0.0f : acc;
  return isnan(acc) ? u2f(0x7fc00000u) : acc;
}

/* The stored bits of a result (BF16 in the low half). */
static uint32_t stored(float c, dp_bf16_store s) {
  if (s == DP_BF16_STORE_BF16) return ref_from(c);
  return s == DP_BF16_STORE_F32_ROUNDED ? f2u(ref_to(ref_from(c))) : f2u(c);
}
static uint32_t c_bits(const void *C, dp_bf16_store s, size_t at) {
  return s == DP_BF16_STORE_BF16 ? ((const dp_bf16 *)C)[at] : f2u(((const float *)C)[at]);
}
static size_t c_size(dp_bf16_store s) { return s == DP_BF16_STORE_BF16 ? 2 : 4; }

/* ---- operands ------------------------------------------------------------------ */

/* An fp32 value of a class: zeros, fp32 denormals, tiny normals (products land
 * near FLT_MIN), moderate, large, huge (products overflow now and then). Mode
 * 1 (rows of A) and 2 (columns of B) make products that underflow: FTZ and
 * DAZ decide many bits then. */
static float rnd_value(int mode) {
  uint32_t sign = rnd(2) << 31, man = rnd(1u << 23), c = rnd(100), e;
  if (c < 8) return u2f(sign);
  if (c < 16) return u2f(sign | (man | 1));
  if (mode == 1)
    e = 1 + rnd(14);
  else if (mode == 2)
    e = 112 + rnd(16);
  else if (c < 30)
    e = 1 + rnd(16);
  else if (c < 85)
    e = 120 + rnd(12);
  else if (c < 97)
    e = 131 + rnd(16);
  else
    e = 185 + rnd(6);
  return u2f(sign | e << 23 | man);
}

/* Fills n elements (stored as s) with values of the mode. */
static void fill(void *p, dp_bf16_store s, size_t n, int mode) {
  for (size_t i = 0; i < n; i++) {
    float v = rnd_value(mode);
    if (s == DP_BF16_STORE_BF16)
      ((dp_bf16 *)p)[i] = ref_from(v);
    else
      ((float *)p)[i] = v;
  }
}

static prob prob_make(int tA, int tB, int M, int N, int K, int pad, dp_bf16_store as,
                      dp_bf16_store bs, dp_bf16_store cs, int mode) {
  prob p = {.tA = tA, .tB = tB, .M = M, .N = N, .K = K, .as = as, .bs = bs, .cs = cs};
  p.lda = (tA ? M : K) + pad;
  p.ldb = (tB ? K : N) + pad;
  p.ldc = N + pad;
  size_t na = (size_t)(tA ? K : M) * p.lda, nb = (size_t)(tB ? N : K) * p.ldb;
  p.A = xmalloc(na * 4);
  p.B = xmalloc(nb * 4);
  p.bias = xmalloc((size_t)(N ? N : 1) * 4);
  fill(p.A, as, na, mode == 1 ? 1 : 0);
  fill(p.B, bs, nb, mode == 1 ? 2 : 0);
  for (int j = 0; j < N; j++) p.bias[j] = rnd(8) ? rnd_value(0) : u2f(rnd(2) << 31 | 5);
  return p;
}

static void prob_free(prob *p) {
  free(p->A);
  free(p->B);
  free(p->bias);
}

/* The contract's stored bits of the whole result, densely (M, N). */
static uint32_t *prob_ref(const prob *p) {
  uint32_t *r = xmalloc((size_t)p->M * p->N * 4);
  for (int i = 0; i < p->M; i++)
    for (int j = 0; j < p->N; j++)
      r[(size_t)i * p->N + j] = stored(contract(p, i, j, OK), p->cs);
  return r;
}

enum { WS, NO_WS, PACKED_B, PACKED_B_NO_WS };

/* Runs the product one way (workspace of exactly the size asked for or none;
 * B prepacked or not) with C's padding set to a marker; returns the first
 * element that differs from ref, or -1 (also -2 when C's padding changed). */
static long run_check(const prob *p, int way, const uint32_t *ref) {
  size_t cz = c_size(p->cs), nc = (size_t)p->M * p->ldc;
  size_t wsb =
      way == WS || way == PACKED_B ? dp__gemm_bf16_workspace_bytes(p->M, p->N, p->K) : 0;
  void *ws = wsb ? xmalloc(wsb) : NULL;
  unsigned char *C = xmalloc(nc * cz);
  memset(C, 0xa7, nc * cz);
  if (way == PACKED_B || way == PACKED_B_NO_WS) {
    void *bp = xmalloc(dp__gemm_bf16_packed_b_bytes(p->K, p->N) + 64);
    dp__gemm_bf16_pack_b(p->tB, p->K, p->N, p->B, p->ldb, p->bs, bp);
    dp__gemm_bf16_pb(p->tA, p->tB, p->M, p->N, p->K, p->A, p->lda, p->as, bp, C, p->ldc,
                     p->cs, &p->ep, ws);
    free(bp);
  } else {
    dp__gemm_bf16(p->tA, p->tB, p->M, p->N, p->K, p->A, p->lda, p->as, p->B, p->ldb, p->bs,
                  C, p->ldc, p->cs, &p->ep, ws);
  }
  long bad = -1;
  for (int i = 0; i < p->M && bad == -1; i++) {
    for (int j = 0; j < p->N && bad == -1; j++)
      if (c_bits(C, p->cs, (size_t)i * p->ldc + j) != ref[(size_t)i * p->N + j])
        bad = (long)i * p->N + j;
    for (int j = p->N; j < p->ldc && bad == -1; j++)
      for (size_t b = 0; b < cz; b++)
        if (C[((size_t)i * p->ldc + j) * cz + b] != 0xa7) bad = -2;
  }
  free(C);
  free(ws);
  return bad;
}

/* ---- tiers ----------------------------------------------------------------------- */

/* The self-check's and the pair tier's kernels, written here: VDPBF16PS lane
 * by lane with the arithmetic `how` (OK: the contract). */
static int kern_how = OK;
static void test_kern(int kc, const uint32_t *a, const uint32_t *b, float *c, size_t ldc,
                      int flags, const float *bias) {
#if HAVE_X86
  /* the library runs it under its MXCSR (DAZ, FTZ): the arithmetic here is
   * software's, under the default */
  unsigned csr = _mm_getcsr();
  _mm_setcsr(0x1f80u);
#endif
  for (int i = 0; i < 12; i++)
    for (int j = 0; j < 32; j++) {
      float acc = flags & 1 && kern_how != NO_LOAD ? c[i * ldc + j] : 0.0f;
      for (int q = 0; q < kc / 2; q++) {
        uint32_t wa = a[q * 12 + i], wb = b[q * 32 + j];
        float ah = u2f(wa & 0xffff0000u), al = u2f(wa << 16);
        float bh = u2f(wb & 0xffff0000u), bl = u2f(wb << 16);
        if (kern_how == EVEN_FIRST) {
          acc = fma_v(al, bl, acc, OK);
          acc = fma_v(ah, bh, acc, OK);
        } else {
          acc = fma_v(ah, bh, acc, kern_how);
          acc = fma_v(al, bl, acc, kern_how);
        }
      }
      if (flags & 2) acc = fma_v(acc, 1.0f, bias[j], kern_how);
      if (flags & 4) acc = acc <= 0.0f ? 0.0f : acc;
      c[i * ldc + j] = acc;
    }
#if HAVE_X86
  _mm_setcsr(csr);
#endif
}

/* The tiers to run: every fp32 GEMM tier the CPU has, the instruction where
 * it has that, and "pairs": the avx512bf16 tier's packing with test_kern. */
static const char *const TIERS[] = {"scalar", "avx2", "avx512", "avx512bf16", "pairs"};
#define N_TIERS 5

static bool use_tier(int ti) {
  dp__gemm_bf16_hw_override(-1, NULL);
  if (ti == 4) {
    kern_how = OK;
    dp__gemm_bf16_hw_override(1, test_kern);
    if (dp__gemm_force_tier("avx512bf16") != 0) return false;
    ck_assert_str_eq(dp__gemm_bf16_tier_name(), "avx512bf16");
    return true;
  }
  if (dp__gemm_force_tier(TIERS[ti]) != 0) return false;
  ck_assert_str_eq(dp__gemm_bf16_tier_name(), TIERS[ti]);
  return true;
}

static void tiers_reset(void) {
  dp__gemm_bf16_hw_override(-1, NULL);
  dp__gemm_force_tier("auto");
}

static int n_skipped;
static void skip_tier(const char *test, int ti) {
  if (n_skipped++ < N_TIERS)
    fprintf(stderr, "SKIP bf16: %s: tier %s: this CPU lacks it\n", test, TIERS[ti]);
}

/* Interesting sizes: around every tier's MR and NR (4, 6, 12; 8, 16, 32), the
 * blocking (MC 96, KC 256: K' = 256 and 258), odd K. */
static const int EDGE[] = {1,  2,  3,  4,  5,  6,  7,   8,   11,  12,  13,
                           15, 16, 17, 23, 24, 25, 31,  32,  33,  47,  48,
                           63, 64, 65, 95, 96, 97, 127, 129, 255, 256, 257};
#define N_EDGE ((int)(sizeof EDGE / sizeof *EDGE))
static int rnd_dim(int max) {
  int d = rnd(2) ? EDGE[rnd(N_EDGE)] : 1 + (int)rnd((uint32_t)max);
  return d > max ? max : d;
}

/* ---- conversions ------------------------------------------------------------------- */

START_TEST(every_bf16_round_trips) {
  for (uint32_t h = 0; h < 65536; h++) {
    float x = dp__bf16_to_f32((dp_bf16)h);
    REQ(f2u(x) == h << 16, "to_f32(%04x) = %08x", h, f2u(x));
    uint16_t want =
        (h & 0x7fffu) > 0x7f80u ? (uint16_t)((h & 0x8000u) | 0x7fc0u) : (uint16_t)h;
    REQ(dp__bf16_from_f32(x) == want, "from_f32(to_f32(%04x)) = %04x", h,
        dp__bf16_from_f32(x));
  }
}
END_TEST

static void check_from(uint32_t u) {
  uint16_t got = dp__bf16_from_f32(u2f(u)), want = ref_from(u2f(u));
  REQ(got == want, "from_f32(%08x) = %04x, want %04x", u, got, want);
}

START_TEST(from_f32_rounds_to_nearest_even) {
  /* the cases by name */
  static const struct {
    uint32_t in;
    uint16_t out;
  } named[] = {
      {0x3f800000u, 0x3f80},
      {0x3f808000u, 0x3f80}, /* tie, even stays */
      {0x3f818000u, 0x3f82},
      {0x3f808001u, 0x3f81}, /* tie, odd goes up; above half */
      {0x3f807fffu, 0x3f80},
      {0x3fffffffu, 0x4000}, /* below half; carry into exponent */
      {0x7f7fffffu, 0x7f80},
      {0xff7fffffu, 0xff80}, /* the largest floats: to inf */
      {0x7f7f7fffu, 0x7f7f},
      {0x7f800000u, 0x7f80}, /* stays finite; inf */
      {0xff800000u, 0xff80},
      {0x7f800001u, 0x7fc0}, /* -inf; signalling NaN: quiet */
      {0xffc12345u, 0xffc0},
      {0x7fffffffu, 0x7fc0}, /* NaNs keep only their sign */
      {0x00000000u, 0x0000},
      {0x80000000u, 0x8000}, /* signed zeros */
      {0x00018000u, 0x0002},
      {0x00008000u, 0x0000}, /* denormals: tie up to even, tie down */
      {0x007fffffu, 0x0080},
      {0x80010000u, 0x8001}, /* carry to FLT_MIN; exact denormal */
  };
  for (size_t i = 0; i < sizeof named / sizeof *named; i++) {
    ck_assert_uint_eq(dp__bf16_from_f32(u2f(named[i].in)), named[i].out);
    ck_assert_uint_eq(ref_from(u2f(named[i].in)), named[i].out);
  }
  /* around every bf16: the lower half at its edges and the tie */
  static const uint32_t lows[] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff};
  for (uint32_t h = 0; h < 65536; h++)
    for (size_t l = 0; l < sizeof lows / sizeof *lows; l++) check_from(h << 16 | lows[l]);
  /* a stride through every bit pattern, and random ones */
  for (uint64_t u = 0; u < (1ull << 32); u += 4093) check_from((uint32_t)u);
  for (int i = 0; i < 1000000; i++) check_from(rnd32());
}
END_TEST

/* The vector copies against the scalar functions, on every tier (the copies
 * follow the fp32 GEMM's tier: AVX2 or baseline; from_f32_n on the AVX-512 tier its own
 * 16-lane loop), lengths and offsets. */
START_TEST(vector_copies_give_the_scalar_bits) {
  enum { LEN = 300 };
  float x[LEN + 8], r[LEN + 8], y[LEN + 8];
  dp_bf16 h[LEN + 8], hv[LEN + 8];
  for (int ti = 0; ti < 3; ti++) {
    if (!use_tier(ti)) {
      skip_tier("vector_copies_give_the_scalar_bits", ti);
      continue;
    }
    for (int t = 0; t < 200; t++) {
      int n = t < 40 ? t : (int)rnd(LEN), off = (int)rnd(8);
      for (int i = 0; i < LEN + 8; i++) {
        uint32_t u = rnd32();
        x[i] = rnd(4) ? u2f(u) : rnd(2) ? u2f((u & 0xffff0000u) | 0x8000u) : rnd_value(0);
        h[i] = (dp_bf16)rnd32();
      }
      dp__bf16_from_f32_n(x + off, hv + off, (size_t)n);
      dp__bf16_to_f32_n(h + off, y + off, (size_t)n);
      memcpy(r, x, sizeof r);
      dp__bf16_round_f32_n(r + off, (size_t)n);
      for (int i = off; i < off + n; i++) {
        REQ(hv[i] == dp__bf16_from_f32(x[i]), "tier %s n %d: from_f32_n[%d]", TIERS[ti], n,
            i);
        REQ(f2u(y[i]) == f2u(dp__bf16_to_f32(h[i])), "tier %s: to_f32_n[%d]", TIERS[ti], i);
        uint32_t want = f2u(dp__bf16_to_f32(dp__bf16_from_f32(x[i])));
        REQ(f2u(r[i]) == want, "tier %s: round_f32_n[%d] of %08x", TIERS[ti], i, f2u(x[i]));
      }
    }
  }
  tiers_reset();
}
END_TEST

/* ---- the GEMM against the contract -------------------------------------------------- */

/* Shapes across every edge: K = 1, 2, odd, K' = KC and past it (two K slices),
 * tiles of every size, several MC blocks; N past NC (once with several MC
 * blocks and K slices). */
static const int SHAPES[][3] = {
    {1, 1, 1},       {1, 7, 1},    {3, 5, 2},     {12, 32, 1},   {12, 32, 255},
    {13, 33, 256},   {6, 16, 257}, {25, 17, 300}, {97, 5, 33},   {100, 65, 129},
    {7, 1030, 3},    {30, 10, 64}, {4, 48, 258},  {193, 40, 17}, {11, 45, 299},
    {1, 1, 512},     {1, 1, 513},  {2, 16, 16},   {47, 63, 95},  {129, 31, 3},
    {200, 1040, 300}};
#define N_SHAPES ((int)(sizeof SHAPES / sizeof *SHAPES))

static const dp_bf16_store IN_STORES[] = {DP_BF16_STORE_BF16, DP_BF16_STORE_F32};
static const dp_bf16_store OUT_STORES[] = {DP_BF16_STORE_BF16, DP_BF16_STORE_F32,
                                           DP_BF16_STORE_F32_ROUNDED};

/* One problem on every tier and every way of running it, against the
 * contract. */
static void check_everywhere(prob *p, const char *test) {
  uint32_t *ref = prob_ref(p);
  for (int ti = 0; ti < N_TIERS; ti++) {
    if (!use_tier(ti)) {
      skip_tier(test, ti);
      continue;
    }
    for (int way = WS; way <= PACKED_B_NO_WS; way++) {
      long d = run_check(p, way, ref);
      REQ(d == -1,
          "%s: tier %s way %d: tA %d tB %d M %d N %d K %d stores %d %d %d bias %d relu %d: "
          "element %ld%s",
          test, TIERS[ti], way, p->tA, p->tB, p->M, p->N, p->K, p->as, p->bs, p->cs,
          p->ep.bias != NULL, p->ep.act, d, d == -2 ? " (C's padding written)" : "");
    }
  }
  tiers_reset();
  free(ref);
}

START_TEST(every_tier_follows_the_contract) {
  for (int s = 0; s < N_SHAPES + 24; s++) {
    int M, N, K;
    if (s < N_SHAPES) {
      M = SHAPES[s][0], N = SHAPES[s][1], K = SHAPES[s][2];
    } else {
      M = rnd_dim(130), N = rnd_dim(140), K = rnd_dim(s % 4 ? 130 : 300);
    }
    for (int v = 0; v < 2; v++) {
      int lay = (int)rnd(4);
      prob p = prob_make(lay & 1, lay >> 1, M, N, K, (int)rnd(3), IN_STORES[rnd(2)],
                         IN_STORES[rnd(2)], OUT_STORES[rnd(3)], (s + v) % 2);
      p.ep.bias = rnd(2) ? p.bias : NULL;
      p.ep.act = rnd(3) ? DP_GEMM_ACT_NONE : DP_GEMM_ACT_RELU;
      check_everywhere(&p, "every_tier_follows_the_contract");
      prob_free(&p);
    }
  }
}
END_TEST

/* The linear layer's three products with bf16 activations, weights stored
 * either way, outputs as mixed precision stores them. */
START_TEST(linear_layer_products_follow_the_contract) {
  const int rows = 37, in = 301, out = 45;
  for (int w = 0; w < 2; w++) {
    prob fw = prob_make(0, 1, rows, out, in, 0, DP_BF16_STORE_BF16, IN_STORES[w],
                        DP_BF16_STORE_BF16, w);
    fw.ep.bias = fw.bias;
    fw.ep.act = DP_GEMM_ACT_RELU;
    check_everywhere(&fw, "forward");
    prob gi = prob_make(0, 0, rows, in, out, 0, DP_BF16_STORE_BF16, IN_STORES[w],
                        DP_BF16_STORE_BF16, w);
    check_everywhere(&gi, "grad-input");
    prob gw = prob_make(1, 0, out, in, rows, 0, DP_BF16_STORE_BF16, DP_BF16_STORE_BF16,
                        DP_BF16_STORE_F32, w);
    check_everywhere(&gw, "grad-weight");
    prob_free(&fw);
    prob_free(&gi);
    prob_free(&gw);
  }
}
END_TEST

/* Results stored as bf16 with two K slices and more rows than one pass of
 * partial sums holds (384), with N past NC: the scratch's passes. */
START_TEST(bf16_results_with_long_k_and_many_rows) {
  prob p = prob_make(0, 1, 400, 1030, 260, 1, DP_BF16_STORE_BF16, DP_BF16_STORE_F32,
                     DP_BF16_STORE_BF16, 0);
  p.ep.bias = p.bias;
  uint32_t *ref = prob_ref(&p);
  static const int tiers[] = {2, 3};
  for (int t = 0; t < 2; t++) {
    if (!use_tier(tiers[t])) {
      skip_tier("bf16_results_with_long_k_and_many_rows", tiers[t]);
      continue;
    }
    REQ(run_check(&p, WS, ref) == -1, "tier %s", TIERS[tiers[t]]);
    REQ(run_check(&p, PACKED_B, ref) == -1, "tier %s prepacked", TIERS[tiers[t]]);
  }
  tiers_reset();
  free(ref);
  prob_free(&p);
}
END_TEST

/* A weight gradient larger than L2 (fp32 rounded, one K slice): the
 * AVX-512 tiers store it past the caches, aligned vectors streamed and the
 * rest masked (rows of 523 floats start at every alignment); the same bits,
 * the padding untouched. */
START_TEST(large_weight_gradients_are_streamed_with_the_same_bits) {
  for (int pad = 0; pad < 2; pad++) {
    prob p = prob_make(1, 0, 1030, 520, 70, pad * 3, DP_BF16_STORE_BF16,
                       pad ? DP_BF16_STORE_F32 : DP_BF16_STORE_BF16,
                       DP_BF16_STORE_F32_ROUNDED, 0);
    uint32_t *ref = prob_ref(&p);
    static const int tiers[] = {2, 3, 4};
    for (int t = 0; t < 3; t++) {
      if (!use_tier(tiers[t])) {
        skip_tier("large_weight_gradients_are_streamed_with_the_same_bits", tiers[t]);
        continue;
      }
      long d = run_check(&p, WS, ref);
      REQ(d == -1, "tier %s pad %d: element %ld", TIERS[tiers[t]], pad * 3, d);
    }
    tiers_reset();
    free(ref);
    prob_free(&p);
  }
}
END_TEST

/* ---- the arithmetic's edges, one element at a time ------------------------------------
 */

/* C (24 x 40) of K steps whose every row of A is a[] and every column of B is
 * b[] (so that every tile, full or not, computes the same element), with a
 * bias of `bias` (NAN: none): every element, on every tier, in every layout
 * and as a 1 x 1 product (unpacked), must be `want` (fp32 bits). */
static void check_element(int K, const float *a, const float *b, float bias, uint32_t want,
                          const char *what) {
  for (int ti = 0; ti < N_TIERS; ti++) {
    if (!use_tier(ti)) continue;
    for (int lay = 0; lay < 4; lay++)
      for (int shape = 0; shape < 2; shape++) {
        int M = shape ? 1 : 24, N = shape ? 1 : 40, tA = lay & 1, tB = lay >> 1;
        prob p = prob_make(tA, tB, M, N, K, 0, DP_BF16_STORE_F32, DP_BF16_STORE_F32,
                           DP_BF16_STORE_F32, 0);
        for (int i = 0; i < M; i++)
          for (int k = 0; k < K; k++)
            ((float *)p.A)[tA ? (size_t)k * p.lda + i : (size_t)i * p.lda + k] = a[k];
        for (int j = 0; j < N; j++) {
          for (int k = 0; k < K; k++)
            ((float *)p.B)[tB ? (size_t)j * p.ldb + k : (size_t)k * p.ldb + j] = b[k];
          p.bias[j] = bias;
        }
        p.ep.bias = isnan(bias) ? NULL : p.bias;
        uint32_t *ref = xmalloc((size_t)M * N * 4);
        for (int e = 0; e < M * N; e++) ref[e] = want;
        ck_assert_msg(f2u(contract(&p, 0, 0, OK)) == want, "%s: the reference gives %a",
                      what, (double)contract(&p, 0, 0, OK));
        long d = run_check(&p, WS, ref);
        ck_assert_msg(d == -1, "%s: tier %s layout %d, %d x %d: element %ld", what,
                      TIERS[ti], lay, M, N, d);
        free(ref);
        prob_free(&p);
      }
  }
  tiers_reset();
}

/* The same element with the arithmetic done wrong: the case tells them apart. */
static void check_wrong(int K, const float *a, const float *b, float bias, int how) {
  prob p = {.M = 1,
            .N = 1,
            .K = K,
            .lda = K,
            .ldb = 1,
            .A = (void *)a,
            .B = (void *)b,
            .as = DP_BF16_STORE_F32,
            .bs = DP_BF16_STORE_F32};
  p.ep.bias = isnan(bias) ? NULL : &bias;
  float right = contract(&p, 0, 0, OK), wrong = contract(&p, 0, 0, how);
  ck_assert_msg(f2u(right) != f2u(wrong), "arithmetic %d gives the same %a", how,
                (double)right);
}

START_TEST(pair_order_daz_and_ftz_decide_the_bits) {
  const float FM = FLT_MIN;
  /* odd element first: 1, then 2^-24 (a tie: stays 1), 2^-24 again, then -1:
   * +0; ascending k: 2^-24 */
  float a1[] = {0x1p-24f, 1.0f, -1.0f, 0x1p-24f}, b1[] = {1, 1, 1, 1};
  check_element(4, a1, b1, NAN, 0, "pair order");
  check_wrong(4, a1, b1, NAN, EVEN_FIRST);
  /* FTZ's edge: 2^-126 first, then -m 2^-152 (m = 1: FLT_MIN - 2^-152 is not
   * tiny after rounding, though it is before; m = 2: the tie goes up to even
   * FLT_MIN; m = 3: rounds to FLT_MIN - 2^-150, tiny (FLT_MIN on the denormal
   * grid); m = 4: exactly FLT_MIN - 2^-150, tiny) */
  static const struct {
    float a0;
    uint32_t want;
    int wrong;
  } edge[] = {{0x1p-76f, 0x00800000u, FTZ_BEFORE_ROUNDING},
              {0x1p-75f, 0x00800000u, FTZ_BEFORE_ROUNDING},
              {0x1.8p-75f, 0, FTZ_OF_DENORMALS},
              {0x1p-74f, 0, FTZ_OF_DENORMALS}};
  for (int e = 0; e < 4; e++)
    for (int sign = 0; sign < 2; sign++) {
      float s = sign ? -1.0f : 1.0f, a[] = {edge[e].a0, 0x1p-63f},
            b[] = {-0x1p-76f * s, 0x1p-63f * s};
      check_element(2, a, b, NAN, edge[e].want | (uint32_t)sign << 31, "FTZ's edge");
      check_wrong(2, a, b, NAN, edge[e].wrong);
      if (edge[e].want == 0) check_wrong(2, a, b, NAN, NO_FTZ);
    }
  /* DAZ: a denormal bf16 (2^-127) times 2^60 counts as 0; an fp32 operand
   * that rounds to a denormal bf16 too */
  float a2[] = {0x1p-127f}, b2[] = {0x1p60f};
  check_element(1, a2, b2, NAN, 0, "DAZ of A");
  check_wrong(1, a2, b2, NAN, NO_DAZ);
  float a3[] = {0x1p60f, 1.0f}, b3[] = {0x1.fep-130f, 0.0f}; /* rounds to 2^-129 */
  check_element(2, a3, b3, NAN, 0, "DAZ of B, rounded from fp32");
  check_wrong(2, a3, b3, NAN, NO_DAZ);
  /* the bias: a denormal one counts as 0; a tiny sum flushes */
  float a4[] = {1.5f * FM}, b4[] = {1.0f};
  check_element(1, a4, b4, 0x1p-149f, 0x00c00000u, "DAZ of the bias");
  check_wrong(1, a4, b4, 0x1p-149f, NO_DAZ);
  check_element(1, a4, b4, -FM, 0, "FTZ of the bias add");
  check_wrong(1, a4, b4, -FM, NO_FTZ);
  /* odd K: the pad leaves acc alone, signed zeros included: -2^-140 flushes
   * to -0, -0 * 1 keeps it, 0 * -1 = -0 adds -0 (+0 had the pad added +0) */
  float a5[] = {-0.0f, -0x1p-70f, 0.0f}, b5[] = {1.0f, 0x1p-70f, -1.0f};
  check_element(3, a5, b5, NAN, 0x80000000u, "odd K keeps -0");
  /* cancellation to an exact zero is +0; K = 0 is the epilogue of +0 */
  float a6[] = {3.0f, -3.0f}, b6[] = {1.0f, 1.0f};
  check_element(2, a6, b6, NAN, 0, "cancellation");
}
END_TEST

START_TEST(nan_results_are_the_default_nan) {
  static const float nans[] = {0.0f, 1.0f, INFINITY};
  for (int t = 0; t < 12; t++) {
    prob p = prob_make(t & 1, t >> 1 & 1, 20, 40, 7, 0, DP_BF16_STORE_F32,
                       DP_BF16_STORE_F32, OUT_STORES[t % 3], 0);
    /* NaNs of both signs and other payloads in A, inf * 0 in B */
    float *A = p.A, *B = p.B;
    A[3] = u2f(0xffc01234u), A[60] = u2f(0x7f800001u), A[100] = nans[t % 3] * 0.0f;
    B[5] = INFINITY, B[11] = -INFINITY, B[20] = u2f(0xff812345u);
    p.ep.bias = t & 4 ? p.bias : NULL;
    if (t & 8) p.bias[7] = u2f(0xfff00000u);
    check_everywhere(&p, "nan_results_are_the_default_nan");
    uint32_t *ref = prob_ref(&p);
    int n_nan = 0;
    for (int e = 0; e < 20 * 40; e++) n_nan += ref[e] == stored(u2f(0x7fc00000u), p.cs);
    ck_assert_int_gt(n_nan, 0);
    free(ref);
    prob_free(&p);
  }
}
END_TEST

START_TEST(k_zero_gives_the_epilogue_of_zero) {
  float bias[3] = {1.5f, -0x1p-140f, -0.0f}, C[6];
  dp_bf16 H[6];
  dp_gemm_epilogue ep = {.bias = bias};
  dp__gemm_bf16(0, 1, 2, 3, 0, NULL, 1, DP_BF16_STORE_BF16, NULL, 1, DP_BF16_STORE_BF16, C,
                3, DP_BF16_STORE_F32, &ep, NULL);
  for (int i = 0; i < 6; i++) ck_assert_uint_eq(f2u(C[i]), i % 3 == 0 ? f2u(1.5f) : 0u);
  ep.act = DP_GEMM_ACT_RELU;
  bias[0] = -2.0f;
  dp__gemm_bf16(0, 1, 2, 3, 0, NULL, 1, DP_BF16_STORE_BF16, NULL, 1, DP_BF16_STORE_BF16, H,
                3, DP_BF16_STORE_BF16, &ep, NULL);
  for (int i = 0; i < 6; i++) ck_assert_uint_eq(H[i], 0);
  dp__gemm_bf16_pb(0, 1, 2, 3, 0, NULL, 1, DP_BF16_STORE_BF16, NULL, C, 3,
                   DP_BF16_STORE_F32, NULL, NULL);
  for (int i = 0; i < 6; i++) ck_assert_uint_eq(f2u(C[i]), 0);
}
END_TEST

#if HAVE_X86
/* The caller's MXCSR (rounding mode, DAZ, FTZ, masks, flags) neither changes
 * the bits nor is changed. */
START_TEST(mxcsr_is_left_as_it_was_and_does_not_matter) {
  static const unsigned csrs[] = {0x1f80u, 0x7f80u, 0x3f80u, 0x9fc0u, 0x1f83u, 0x5fa1u};
  prob p = prob_make(0, 1, 30, 50, 41, 0, DP_BF16_STORE_BF16, DP_BF16_STORE_F32,
                     DP_BF16_STORE_F32, 1);
  p.ep.bias = p.bias;
  uint32_t *ref = prob_ref(&p);
  unsigned saved = _mm_getcsr();
  for (int ti = 0; ti < N_TIERS; ti++) {
    if (!use_tier(ti)) continue;
    for (size_t c = 0; c < sizeof csrs / sizeof *csrs; c++)
      for (int way = WS; way <= PACKED_B_NO_WS; way++) {
        _mm_setcsr(csrs[c]);
        long d = run_check(&p, way, ref);
        unsigned after = _mm_getcsr();
        _mm_setcsr(saved);
        ck_assert_msg(after == csrs[c], "tier %s: MXCSR %04x became %04x", TIERS[ti],
                      csrs[c], after);
        ck_assert_msg(d == -1, "tier %s way %d under MXCSR %04x: element %ld", TIERS[ti],
                      way, csrs[c], d);
      }
  }
  /* K = 0: the epilogue alone, of a NaN and a denormal bias, raises no flag */
  float bias[2] = {NAN, 0x1p-140f}, C[2];
  dp_gemm_epilogue ep = {.bias = bias, .act = DP_GEMM_ACT_RELU};
  _mm_setcsr(0x1f80u);
  dp__gemm_bf16(0, 1, 1, 2, 0, NULL, 1, DP_BF16_STORE_BF16, NULL, 1, DP_BF16_STORE_BF16, C,
                2, DP_BF16_STORE_F32, &ep, NULL);
  unsigned after = _mm_getcsr();
  _mm_setcsr(saved);
  ck_assert_uint_eq(after, 0x1f80u);
  ck_assert(f2u(C[0]) == 0x7fc00000u && f2u(C[1]) == 0);
  tiers_reset();
  free(ref);
  prob_free(&p);
}
END_TEST
#endif

START_TEST(colsum_is_an_ascending_row_sum) {
  for (int t = 0; t < 30; t++) {
    /* widths of one vector to several */
    int M = 1 + (int)rnd(200), N = t < 3 ? 64 * (t + 1) : 1 + (int)rnd(200),
        lda = N + (int)rnd(3);
    dp_bf16 *A = xmalloc((size_t)M * lda * 2);
    float *out = xmalloc((size_t)N * 4);
    fill(A, DP_BF16_STORE_BF16, (size_t)M * lda, t % 2);
    for (int ti = 0; ti < 3; ti++) {
      if (!use_tier(ti)) continue;
      dp__gemm_bf16_colsum(M, N, A, lda, out);
      for (int j = 0; j < N; j++) {
        float s = 0.0f;
        for (int i = 0; i < M; i++) s += ref_to(A[(size_t)i * lda + j]);
        REQ(f2u(s) == f2u(out[j]), "tier %s M %d N %d: column %d", TIERS[ti], M, N, j);
      }
    }
    free(A);
    free(out);
  }
  tiers_reset();
}
END_TEST

/* ---- memory ------------------------------------------------------------------------ */

/* The call writes only C's M x N block and the workspace's first
 * dp__gemm_bf16_workspace_bytes bytes; it reads nothing past them. */
START_TEST(workspace_is_the_only_scratch) {
  const size_t slack = 4096;
  for (int ti = 0; ti < N_TIERS; ti++) {
    if (!use_tier(ti)) continue;
    for (int t = 0; t < 16; t++) {
      int M = 1 + (int)rnd(150), N = 1 + (int)rnd(150), K = 1 + (int)rnd(t % 3 ? 200 : 400);
      prob p =
          prob_make(t & 1, t >> 1 & 1, M, N, K, 3, IN_STORES[t % 2], IN_STORES[t / 2 % 2],
                    t % 3 ? DP_BF16_STORE_BF16 : DP_BF16_STORE_F32, 0);
      size_t need = dp__gemm_bf16_workspace_bytes(M, N, K);
      unsigned char *ws = xmalloc(need + slack);
      memset(ws, 0xa5, need + slack);
      uint32_t *ref = prob_ref(&p);
      size_t cz = c_size(p.cs);
      unsigned char *C = xmalloc((size_t)M * p.ldc * cz);
      dp__gemm_bf16(p.tA, p.tB, M, N, K, p.A, p.lda, p.as, p.B, p.ldb, p.bs, C, p.ldc, p.cs,
                    NULL, ws);
      for (size_t b = need; b < need + slack; b++)
        REQ(ws[b] == 0xa5, "tier %s M %d N %d K %d: workspace byte %zu of %zu written",
            TIERS[ti], M, N, K, b, need);
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
          REQ(c_bits(C, p.cs, (size_t)i * p.ldc + j) == ref[(size_t)i * N + j], "element");
      free(C);
      free(ref);
      free(ws);
      prob_free(&p);
    }
  }
  tiers_reset();
}
END_TEST

START_TEST(workspace_size_rules) {
  ck_assert_uint_eq(dp__gemm_bf16_workspace_bytes(0, 5, 5), 0);
  ck_assert_uint_eq(dp__gemm_bf16_workspace_bytes(5, 0, 5), 0);
  ck_assert_uint_eq(dp__gemm_bf16_workspace_bytes(5, 5, 0), 0);
  ck_assert_uint_eq(dp__gemm_bf16_workspace_bytes(1, 1, 512), 0);
  ck_assert_uint_gt(dp__gemm_bf16_workspace_bytes(1, 1, 513), 0);
  ck_assert_uint_eq(dp__gemm_bf16_workspace_bytes(15, 2, 5), 0);
  /* past the fp32 GEMM's by the partial sums of bf16 results, K > 256 only */
  ck_assert_uint_eq(dp__gemm_bf16_workspace_bytes(512, 512, 256),
                    dp__gemm_workspace_bytes(512, 512, 256));
  ck_assert_uint_eq(dp__gemm_bf16_workspace_bytes(512, 512, 512),
                    dp__gemm_workspace_bytes(512, 512, 512) + 384 * 512 * 4);
  ck_assert_uint_eq(dp__gemm_bf16_workspace_bytes(4096, 4096, 4096),
                    dp__gemm_bf16_workspace_bytes(100000, 100000, 100000));
  ck_assert_uint_le(dp__gemm_bf16_workspace_bytes(100000, 100000, 100000), 3u << 20);
  ck_assert_uint_eq(dp__gemm_bf16_packed_b_bytes(5, 33), 64 * 6 * 4);
  ck_assert_uint_eq(dp__gemm_bf16_packed_b_bytes(0, 33), 0);
  const int d[] = {1,   7,   12,  33,  96,   97,   255,  256,
                   257, 383, 384, 385, 1000, 1024, 1025, 3000};
  const int nd = (int)(sizeof d / sizeof *d);
  for (int a = 0; a < nd; a++)
    for (int b = 0; b < nd; b++)
      for (int c = 0; c + 1 < nd; c++) {
        REQ(dp__gemm_bf16_workspace_bytes(d[c], d[a], d[b]) <=
                dp__gemm_bf16_workspace_bytes(d[c + 1], d[a], d[b]),
            "M");
        REQ(dp__gemm_bf16_workspace_bytes(d[a], d[c], d[b]) <=
                dp__gemm_bf16_workspace_bytes(d[a], d[c + 1], d[b]),
            "N");
        REQ(dp__gemm_bf16_workspace_bytes(d[a], d[b], d[c]) <=
                dp__gemm_bf16_workspace_bytes(d[a], d[b], d[c + 1]),
            "K");
      }
}
END_TEST

/* ---- the avx512bf16 tier ------------------------------------------------------------- */

START_TEST(self_check_accepts_the_contract_and_rejects_the_rest) {
  kern_how = OK;
  ck_assert(dp__gemm_bf16_self_check(test_kern));
  static const int wrong[] = {NO_DAZ,           NO_FTZ,     FTZ_BEFORE_ROUNDING,
                              FTZ_OF_DENORMALS, EVEN_FIRST, NO_LOAD};
  for (size_t w = 0; w < sizeof wrong / sizeof *wrong; w++) {
    kern_how = wrong[w];
    ck_assert_msg(!dp__gemm_bf16_self_check(test_kern),
                  "a kernel with arithmetic %d passes", wrong[w]);
  }
  kern_how = OK;
#if HAVE_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    ck_assert_msg(dp__gemm_bf16_self_check(NULL), "the instruction fails the self-check");
  else
    fprintf(stderr, "SKIP bf16: self_check: the instruction: this CPU lacks AVX512_BF16\n");
#endif
}
END_TEST

/* avx512bf16 only with cpuid's yes and a passing check, and only on the
 * avx512 tier when "avx512" was not named. */
START_TEST(the_instruction_is_chosen_only_when_it_passes) {
  if (!dp__gemm_tier_supported("avx512")) {
    fprintf(stderr, "SKIP bf16: instruction choice: this CPU lacks AVX-512\n");
    return;
  }
  kern_how = OK;
  dp__gemm_bf16_hw_override(0, test_kern); /* no cpuid bit */
  ck_assert(!dp__gemm_tier_supported("avx512bf16"));
  ck_assert_int_eq(dp__gemm_force_tier("avx512bf16"), -1);
  ck_assert_int_eq(dp__gemm_force_tier("auto"), 0);
  ck_assert_str_eq(dp__gemm_bf16_tier_name(), "avx512");
  kern_how = EVEN_FIRST; /* a kernel that fails the check */
  dp__gemm_bf16_hw_override(1, test_kern);
  ck_assert_str_eq(dp__gemm_bf16_tier_name(), "avx512");
  ck_assert_int_eq(dp__gemm_force_tier("avx512bf16"), -1);
  kern_how = OK;
  dp__gemm_bf16_hw_override(1, test_kern);
  ck_assert_str_eq(dp__gemm_bf16_tier_name(), "avx512bf16");
  ck_assert_str_eq(dp__gemm_tier_name(), "avx512"); /* the fp32 GEMM's name */
  ck_assert_int_eq(dp__gemm_force_tier("avx512"), 0);
  ck_assert_str_eq(dp__gemm_bf16_tier_name(), "avx512");
  ck_assert_int_eq(dp__gemm_force_tier("avx512bf16"), 0);
  ck_assert_str_eq(dp__gemm_bf16_tier_name(), "avx512bf16");
  ck_assert_int_eq(dp__gemm_force_tier("avx2"), 0);
  ck_assert_str_eq(dp__gemm_bf16_tier_name(), "avx2");
  /* the CPU's own answer */
  dp__gemm_bf16_hw_override(-1, NULL);
  ck_assert_int_eq(dp__gemm_force_tier(NULL), 0);
#if HAVE_X86
  __builtin_cpu_init();
  bool has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
  ck_assert_str_eq(dp__gemm_bf16_tier_name(), has ? "avx512bf16" : "avx512");
  ck_assert(dp__gemm_tier_supported("avx512bf16") == has);
#endif
  tiers_reset();
}
END_TEST

/* ---- benchmark (DP_GEMM_BENCH=1) ------------------------------------------------------
 */

/* CPU time of this thread: other processes on a shared machine do not count. */
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* GFLOP/s of product `which` (0 forward Y = X W^T, 1 grad-input dX = dY W,
 * 2 grad-weight dW = dY^T X) on n x n x n, bf16 (stores: bf16 activations and
 * weights, bf16 Y and dX, fp32 dW) or fp32: the best of several runs. */
static double gflops(int which, bool bf16, int n, const void *x, const void *w,
                     const void *dy, void *o, void *ws) {
  const dp_bf16_store H = DP_BF16_STORE_BF16, F = DP_BF16_STORE_F32;
  double best = 1e30, fl = 2.0 * n * n * n;
  int reps = (int)(4e9 / fl) + 1, trials = 7;
  if (strcmp(dp__gemm_tier_name(), "scalar") == 0) reps = 1, trials = 1; /* slow */
  for (int t = 0; t < trials; t++) {
    double t0 = now_s();
    for (int r = 0; r < reps; r++) {
      if (bf16 && which == 0)
        dp__gemm_bf16(0, 1, n, n, n, x, n, H, w, n, H, o, n, H, NULL, ws);
      if (bf16 && which == 1)
        dp__gemm_bf16(0, 0, n, n, n, dy, n, H, w, n, H, o, n, H, NULL, ws);
      if (bf16 && which == 2)
        dp__gemm_bf16(1, 0, n, n, n, dy, n, H, x, n, H, o, n, F, NULL, ws);
      if (!bf16 && which == 0) dp__sgemm(0, 1, n, n, n, x, n, w, n, o, n, NULL, ws);
      if (!bf16 && which == 1) dp__sgemm(0, 0, n, n, n, dy, n, w, n, o, n, NULL, ws);
      if (!bf16 && which == 2) dp__sgemm(1, 0, n, n, n, dy, n, x, n, o, n, NULL, ws);
    }
    double d = (now_s() - t0) / reps;
    best = d < best ? d : best;
  }
  return fl / best * 1e-9;
}

START_TEST(bench) {
  if (!getenv("DP_GEMM_BENCH")) return;
  printf("bf16 gemm bench: GFLOP/s, one thread, thread CPU time, best of 7.\n"
         "n x n -> n linear layer: fwd Y = X W^T, dX = dY W, dW = dY^T X\n");
  static const char *const tiers[] = {"avx512bf16", "avx512", "avx2", "scalar"};
  for (int n = 512; n <= 1024; n *= 2) {
    size_t e = (size_t)n * n;
    float *xf = xmalloc(e * 4), *wf = xmalloc(e * 4), *dyf = xmalloc(e * 4),
          *of = xmalloc(e * 4);
    dp_bf16 *x = xmalloc(e * 2), *w = xmalloc(e * 2), *dy = xmalloc(e * 2);
    fill(xf, DP_BF16_STORE_F32, e, 0);
    fill(wf, DP_BF16_STORE_F32, e, 0);
    fill(dyf, DP_BF16_STORE_F32, e, 0);
    dp__bf16_from_f32_n(xf, x, e);
    dp__bf16_from_f32_n(wf, w, e);
    dp__bf16_from_f32_n(dyf, dy, e);
    size_t wsb = dp__gemm_bf16_workspace_bytes(n, n, n);
    void *ws = xmalloc(
        wsb > dp__gemm_workspace_bytes(n, n, n) ? wsb : dp__gemm_workspace_bytes(n, n, n));
    for (int t = 0; t < 4; t++) {
      if (dp__gemm_force_tier(tiers[t]) != 0 || strcmp(dp__gemm_bf16_tier_name(), tiers[t]))
        continue;
      if (t == 3 && n > 512) continue;
      printf("  n %4d %-10s bf16", n, tiers[t]);
      for (int p = 0; p < 3; p++) printf(" %6.1f", gflops(p, true, n, x, w, dy, of, ws));
      if (t > 0) {
        printf("   fp32");
        for (int p = 0; p < 3; p++)
          printf(" %6.1f", gflops(p, false, n, xf, wf, dyf, of, ws));
      }
      printf("\n");
      fflush(stdout);
    }
    free(xf), free(wf), free(dyf), free(of), free(x), free(w), free(dy), free(ws);
  }
  tiers_reset();
}
END_TEST

Suite *bf16_suite(void) {
  Suite *s = suite_create("bf16");
  TCase *tc = tcase_create("conversions");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, every_bf16_round_trips);
  tcase_add_test(tc, from_f32_rounds_to_nearest_even);
  tcase_add_test(tc, vector_copies_give_the_scalar_bits);
  suite_add_tcase(s, tc);

  tc = tcase_create("contract");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, every_tier_follows_the_contract);
  tcase_add_test(tc, linear_layer_products_follow_the_contract);
  tcase_add_test(tc, bf16_results_with_long_k_and_many_rows);
  tcase_add_test(tc, large_weight_gradients_are_streamed_with_the_same_bits);
  tcase_add_test(tc, pair_order_daz_and_ftz_decide_the_bits);
  tcase_add_test(tc, nan_results_are_the_default_nan);
  tcase_add_test(tc, k_zero_gives_the_epilogue_of_zero);
#if HAVE_X86
  tcase_add_test(tc, mxcsr_is_left_as_it_was_and_does_not_matter);
#endif
  tcase_add_test(tc, colsum_is_an_ascending_row_sum);
  suite_add_tcase(s, tc);

  tc = tcase_create("memory");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, workspace_is_the_only_scratch);
  tcase_add_test(tc, workspace_size_rules);
  suite_add_tcase(s, tc);

  tc = tcase_create("instruction");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, self_check_accepts_the_contract_and_rejects_the_rest);
  tcase_add_test(tc, the_instruction_is_chosen_only_when_it_passes);
  suite_add_tcase(s, tc);

  tc = tcase_create("bench");
  tcase_set_tags(tc, "bench");
  tcase_set_timeout(tc, 1200);
  tcase_add_test(tc, bench);
  suite_add_tcase(s, tc);
  return s;
}
