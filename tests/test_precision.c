/* bf16 mixed precision (config.precision, docs/PRECISION.md): what it computes
 * (a linear layer's forward against the bf16 dot product's definition, written
 * out here), that it gives one set of bits for every device count, mode and
 * recompute setting, that it stays close to fp32 without being fp32, that it
 * halves the activation bytes, and what it refuses. */
#include "helpers.h"
#include "cpu/bf16.h"
#include "cpu/gemm.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the arithmetic, written out from its definition (not the library's) ---- */

static uint16_t to_bf16(float x) { /* round to nearest even; a NaN stays a NaN */
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float of_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}
static float rnd(float x) { return of_bf16(to_bf16(x)); }
static float ftz(float x) { return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x; }

/* VDPBF16PS's dot product of bf16 vectors a and b of length k: pairs in order,
 * the odd element of a pair first, each an fma with denormals flushed. */
static float dot_bf16(const float *a, const float *b, int k) {
  float acc = 0.0f;
  for (int p = 0; p < k; p += 2) {
    if (p + 1 < k) acc = ftz(fmaf(ftz(rnd(a[p + 1])), ftz(rnd(b[p + 1])), ftz(acc)));
    acc = ftz(fmaf(ftz(rnd(a[p])), ftz(rnd(b[p])), ftz(acc)));
  }
  return acc;
}

static dp_config bf16_cfg(int batch, int devices, int micro_batch) {
  dp_config c = CFG(.batch = batch, .n_devices = devices, .opt = DP_OPT_ADAMW,
                    .micro_batch = micro_batch, .seed = 5);
  c.precision = DP_PRECISION_BF16;
  return c;
}

/* input 7 / linear 5 / relu / linear 3 in bf16: the hidden layer is the bf16 of
 * relu(dot + bf16(bias)), the output the same without the relu, stored as fp32;
 * every bit as the definition gives it. */
START_TEST(linear_forward_is_the_bf16_dot_product) {
  enum { B = 6, IN = 7, H = 5, OUT = 3 };
  dp_config c = bf16_cfg(B, 2, 0);
  rig r;
  rig_open(&r, "input 7\nlinear 5\nrelu\nlinear 3\nloss mse\n", &c);
  ck_assert_uint_eq(r.np, (size_t)H * IN + H + OUT * H + OUT);
  float *w = params_of(&r);
  for (size_t k = 0; k < r.np; k++) w[k] = (float)((int)((k * 37 + 11) % 101) - 50) / 37.0f;
  ck_assert_int_eq(dp_set_params(r.c, w, r.np), DP_OK);
  float x[B * IN], y[B * OUT];
  for (int k = 0; k < B * IN; k++) x[k] = (float)((k * 53 + 7) % 97 - 48) / 13.0f;
  ck_assert_msg(dp_forward(r.c, B, IN, x, y) == DP_OK, "%s", dp_ctx_error(r.c));
  const float *w1 = w, *b1 = w + H * IN, *w2 = b1 + H, *b2 = w2 + OUT * H;
  for (int i = 0; i < B; i++) {
    float h[H];
    for (int j = 0; j < H; j++) {
      float v = dot_bf16(x + i * IN, w1 + j * IN, IN) + rnd(b1[j]);
      h[j] = rnd(v <= 0.0f ? 0.0f : v);
    }
    for (int j = 0; j < OUT; j++) {
      float want = rnd(dot_bf16(h, w2 + j * H, H) + rnd(b2[j]));
      ck_assert_msg(memcmp(&want, &y[i * OUT + j], 4) == 0, "row %d output %d: %a, want %a",
                    i, j, (double)y[i * OUT + j], (double)want);
    }
  }
  free(w);
  rig_close(&r);
}
END_TEST

/* Batchnorm's running statistics (all of the model's batchnorms, mean, var
 * and count) folded into h. */
static uint64_t running_stats_hash(rig *r, uint64_t h) {
  for (int i = 0; i < dp_model_n_layers(r->m); i++) {
    if (dp_model_layer_kind(r->m, i) != DP_LAYER_BATCHNORM) continue;
    float mean[64] = {0}, var[64] = {0}; /* the test models' C <= 64 */
    int64_t count = 0;
    ck_assert_msg(dp_get_running_stats(r->c, i, mean, var, &count) == DP_OK, "%s",
                  dp_last_error());
    uint64_t part[3] = {dp_hash_bytes(mean, sizeof mean), dp_hash_bytes(var, sizeof var),
                        (uint64_t)count};
    h ^= dp_hash_bytes(part, sizeof part) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  }
  return h;
}

/* 4 AdamW steps; the parameters' hash, with every batchnorm's running statistics
 * and the eval-mode outputs after the steps. */
static uint64_t train_hash(const char *spec, dp_config c, int cols, bool tokens) {
  rig r;
  rig_open(&r, spec, &c);
  int B = c.batch, T = tokens ? GPT_T : 1;
  float *x = malloc(sizeof(float) * (size_t)B * cols);
  int32_t *t = malloc(sizeof(int32_t) * (size_t)B * T);
  for (int s = 0; s < 4; s++) {
    for (int k = 0; k < B * cols; k++)
      x[k] = tokens ? (float)((k * 7 + s * 3) % GPT_V)
                    : (float)((k * 29 + s * 11) % 61 - 30) / 17.0f;
    for (int k = 0; k < B * T; k++) t[k] = (k * 5 + s) % (tokens ? GPT_V : 5);
    ck_assert_msg(dp_train_step(r.c, B, cols, x, t, NULL) == DP_OK, "%s",
                  dp_ctx_error(r.c));
  }
  uint64_t h = running_stats_hash(&r, dp_params_hash(r.c));
  size_t n_out = (size_t)B * dp_model_output_width(r.m);
  float *y = malloc(sizeof(float) * n_out);
  ck_assert_msg(dp_forward(r.c, B, cols, x, y) == DP_OK, "%s", dp_ctx_error(r.c));
  h ^= dp_hash_bytes(y, sizeof(float) * n_out);
  free(y);
  free(x);
  free(t);
  rig_close(&r);
  return h;
}

static const char CNN_SPEC[] = "input 2 6 6\nconv2d 4 3 padding 1\nrelu\nmaxpool2d 2\n"
                               "conv2d 3 3\navgpool2d 1\nflatten\nlinear 5\n"
                               "loss softmax_cross_entropy\n";

/* Batchnorm on the model's fp32 input, after a linear (then a relu the next
 * linear's backward masks) and after a gelu. */
static const char BN_MLP_SPEC[] = "input 12\nbatchnorm\nlinear 16 nobias\nbatchnorm\nrelu\n"
                                  "linear 16\ngelu\nbatchnorm\ntanh\nlinear 5\n"
                                  "loss softmax_cross_entropy\n";
/* 2d batchnorms after convolutions, and a 1d one as the last layer (its
 * output and gradient are the loss's fp32 tensors). */
static const char BN_CNN_SPEC[] =
    "input 2 6 6\nconv2d 4 3 padding 1 nobias\nbatchnorm\nrelu\n"
    "maxpool2d 2\nconv2d 3 3\nbatchnorm\nflatten\nlinear 5\n"
    "batchnorm\nloss softmax_cross_entropy\n";

typedef struct {
  const char *name, *spec;
  int cols;
  bool tokens;
  dp_bn_mode bn;
} model_case;
static const model_case MODELS[] = {
    {"mlp", MLP_EVERY_KIND_SPEC, 12, false, DP_BN_PER_REPLICA},
    {"cnn", CNN_SPEC, 72, false, DP_BN_PER_REPLICA},
    {"gpt", GPT_SPEC, GPT_T, true, DP_BN_PER_REPLICA},
    {"gpt, attention dropout, tied head", GPT_ADROP_SPEC, GPT_T, true, DP_BN_PER_REPLICA},
    {"mlp, batchnorm per_replica", BN_MLP_SPEC, 12, false, DP_BN_PER_REPLICA},
    {"mlp, batchnorm sync", BN_MLP_SPEC, 12, false, DP_BN_SYNC},
    {"cnn, batchnorm per_replica", BN_CNN_SPEC, 72, false, DP_BN_PER_REPLICA},
    {"cnn, batchnorm sync", BN_CNN_SPEC, 72, false, DP_BN_SYNC},
    {"resnet, projection shortcut", RESNET_PROJ_SPEC, 192, false, DP_BN_PER_REPLICA},
};
#define N_MODELS ((int)(sizeof MODELS / sizeof MODELS[0]))

static dp_config model_cfg(const model_case *mc, int devices) {
  dp_config c = bf16_cfg(8, devices, 2);
  c.batchnorm = mc->bn;
  return c;
}

/* One hash for 1, 2 and 4 devices in classic, allreduce and sharded allreduce,
 * with micro-batches of 2 rows (batchnorm's running statistics and eval
 * outputs too); the bf16 bits are not the fp32 ones. */
START_TEST(same_bits_on_every_device_count_and_mode) {
  const model_case *mc = &MODELS[_i];
  uint64_t ref = train_hash(mc->spec, model_cfg(mc, 1), mc->cols, mc->tokens);
  const int devs[] = {2, 4};
  for (int k = 0; k < 2; k++)
    for (int mode = 0; mode < 3; mode++) {
      dp_config c = model_cfg(mc, devs[k]);
      c.mode = mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC;
      c.shard_optimizer = mode == 2;
      uint64_t h = train_hash(mc->spec, c, mc->cols, mc->tokens);
      ck_assert_msg(h == ref, "%s: %d devices, mode %d: %016llx, 1 device: %016llx",
                    mc->name, devs[k], mode, (unsigned long long)h,
                    (unsigned long long)ref);
    }
  dp_config f = model_cfg(mc, 1);
  f.precision = DP_PRECISION_FP32;
  ck_assert_msg(train_hash(mc->spec, f, mc->cols, mc->tokens) != ref,
                "%s: bf16 gave the fp32 bits", mc->name);
}
END_TEST

/* Activation recompute in bf16 recomputes the same bf16 values (and updates
 * batchnorm's running statistics once). */
START_TEST(recompute_gives_the_same_bits) {
  const model_case *mc = &MODELS[_i];
  uint64_t ref = train_hash(mc->spec, model_cfg(mc, 2), mc->cols, mc->tokens);
  for (int k = 1; k <= 3; k++) {
    dp_config c = model_cfg(mc, 2);
    c.recompute = k;
    c.guards = 1;
    ck_assert_msg(train_hash(mc->spec, c, mc->cols, mc->tokens) == ref,
                  "%s: recompute %d changed the bits", mc->name, k);
  }
}
END_TEST

/* input 6 / linear 5 nobias / batchnorm / linear 3 in bf16, one micro-batch:
 * the batchnorm's running statistics after a step are fp32 mode's (0.1 times
 * the mean and unbiased variance) over the bf16 values of the linear's output,
 * written out here from the bf16 dot product, not over its fp32 values; the
 * batchnorm's weight and bias gradients are fp32 (autocast keeps them so),
 * the linear layers' bf16 values. Per_replica (_i 0, one micro-batch) and sync
 * (_i 1, four). */
START_TEST(batchnorm_statistics_over_the_bf16_values) {
  enum { B = 16, IN = 6, H = 5, OUT = 3 };
  dp_config c = bf16_cfg(B, 2, 0);
  c.batchnorm = _i ? DP_BN_SYNC : DP_BN_PER_REPLICA;
  c.micro_batch = _i ? 4 : B; /* sync: the whole batch's over 4 micro-batches */
  rig r;
  rig_open(&r, "input 6\nlinear 5 nobias\nbatchnorm\nlinear 3\nloss mse\n", &c);
  ck_assert_uint_eq(r.np, (size_t)H * IN + 2 * H + OUT * H + OUT);
  float *w = params_of(&r), x[B * IN], t[B * OUT];
  for (int k = 0; k < H * IN; k++) w[k] = (float)((k * 37 + 11) % 101 - 50) / 37.0f;
  ck_assert_int_eq(dp_set_params(r.c, w, r.np), DP_OK);
  for (int k = 0; k < B * IN; k++) x[k] = (float)((k * 53 + 7) % 97 - 48) / 13.0f;
  for (int k = 0; k < B * OUT; k++) t[k] = (float)(k % 7) / 7.0f;
  ck_assert_msg(dp_train_step(r.c, B, IN, x, t, NULL) == DP_OK, "%s", dp_ctx_error(r.c));
  float mean[H], var[H];
  int64_t count = 0;
  ck_assert_int_eq(dp_get_running_stats(r.c, 1, mean, var, &count), DP_OK);
  ck_assert_int_eq(count, 1);
  for (int j = 0; j < H; j++) {
    double h[B], hf[B], m = 0, mf = 0, v = 0, vf = 0;
    for (int i = 0; i < B; i++) {
      hf[i] = 0;
      for (int k = 0; k < IN; k++) hf[i] += (double)rnd(x[i * IN + k]) * rnd(w[j * IN + k]);
      h[i] = rnd(dot_bf16(x + i * IN, w + j * IN, IN));
      m += h[i] / B;
      mf += hf[i] / B;
    }
    for (int i = 0; i < B; i++) {
      v += (h[i] - m) * (h[i] - m) / (B - 1);
      vf += (hf[i] - mf) * (hf[i] - mf) / (B - 1);
    }
    double want_m = 0.1 * m, want_v = 0.9 + 0.1 * v, tol = 2e-6 * (fabs(want_m) + 1.0);
    ck_assert_msg(fabs(mean[j] - want_m) <= tol && fabs(var[j] - want_v) <= 2e-6 * want_v,
                  "channel %d: running mean %.9g var %.9g, want %.9g %.9g", j,
                  (double)mean[j], (double)var[j], want_m, want_v);
    /* the bf16 rounding shows: fp32's values give other statistics */
    ck_assert_msg(fabs(0.1 * mf - want_m) > 4 * tol || fabs(0.9 + 0.1 * vf - want_v) > 4e-6,
                  "channel %d: the unrounded values give the same statistics", j);
  }
  float *g = malloc(sizeof(float) * r.np);
  ck_assert_int_eq(dp_get_grads(r.c, g, r.np), DP_OK);
  int bn_fp32 = 0;
  for (size_t k = 0; !_i && k < r.np; k++) { /* sync's 4 micro-batches' are fp32 sums */
    bool bn = k >= (size_t)H * IN && k < (size_t)H * IN + 2 * H;
    ck_assert_msg(bn || rnd(g[k]) == g[k], "gradient %zu of a linear: %a, not bf16", k,
                  (double)g[k]);
    bn_fp32 += bn && rnd(g[k]) != g[k];
  }
  ck_assert_msg(_i || bn_fp32 > 0, "the batchnorm's gradients are all bf16 values");
  free(g);
  free(w);
  rig_close(&r);
}
END_TEST

/* The loss of a bf16 step is within bf16's precision of the fp32 step's. */
START_TEST(loss_close_to_fp32) {
  enum { B = 16 };
  float loss[2];
  for (int p = 0; p < 2; p++) {
    dp_config c = bf16_cfg(B, 2, 0);
    c.precision = p ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
    rig r;
    rig_open(&r, MLP_EVERY_KIND_SPEC, &c);
    float x[B * 12];
    int32_t t[B];
    for (int k = 0; k < B * 12; k++) x[k] = (float)((k * 29) % 61 - 30) / 17.0f;
    for (int k = 0; k < B; k++) t[k] = k % 5;
    ck_assert_int_eq(dp_train_step(r.c, B, 12, x, t, &loss[p]), DP_OK);
    rig_close(&r);
  }
  ck_assert_msg(fabsf(loss[1] - loss[0]) <= 2e-2f * fabsf(loss[0]), "bf16 %g, fp32 %g",
                (double)loss[1], (double)loss[0]);
  ck_assert_msg(loss[1] != loss[0], "bf16 gave the fp32 loss");
}
END_TEST

/* Five 1024-wide linear layers with relus at batch 1024 (micro-batch 64): the
 * activations take at most 0.55 of fp32's, and the plan holds exactly what the
 * bf16 tensors need (the region is the sum of what liveness placed). */
START_TEST(activation_bytes_at_most_055_of_fp32) {
  const char *spec = "input 1024\nlinear 1024\nrelu\nlinear 1024\nrelu\nlinear 1024\n"
                     "relu\nlinear 1024\nrelu\nlinear 10\nloss softmax_cross_entropy\n";
  size_t act[2];
  for (int p = 0; p < 2; p++) {
    dp_config c = bf16_cfg(1024, 1, 64);
    c.precision = p ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
    dp_model *m = model_of(spec);
    dp_plan *pl = plan_of(m, &c);
    act[p] = dp_plan_region(pl, 0, DP_REGION_ACTIVATIONS).size;
    dp_plan_free(pl);
    dp_model_free(m);
  }
  ck_assert_msg((double)act[1] <= 0.55 * (double)act[0], "bf16 %zu B, fp32 %zu B", act[1],
                act[0]);
}
END_TEST

/* Unknown precisions: refused by name (the cuda backend's refusals:
 * tests/test_cuda.c, bf16_refuses_nccl); batchnorm is planned. */
START_TEST(refusals_name_the_options) {
  dp_precision p = DP_PRECISION_FP32;
  ck_assert_int_eq(dp_precision_parse("fp16", &p), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "fp32"));
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "bf16"));
  ck_assert_int_eq(p, DP_PRECISION_FP32);
  ck_assert_int_eq(dp_precision_parse("bf16", &p), DP_OK);
  ck_assert_int_eq(p, DP_PRECISION_BF16);
  ck_assert_str_eq(dp_precision_name(DP_PRECISION_BF16), "bf16");
  ck_assert_str_eq(dp_precision_name((dp_precision)9), "?");

  dp_model *m = model_of("input 4\nlinear 3\nloss mse\n");
  dp_config c = bf16_cfg(4, 1, 0);
  c.precision = (dp_precision)3;
  dp_plan *pl = NULL;
  ck_assert_int_eq(dp_plan_create(m, &c, &pl), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "fp32 and bf16"));
  dp_model_free(m);

  m = model_of("input 4\nlinear 3\nbatchnorm\nlinear 2\nloss mse\n");
  for (int bn = 0; bn < 2; bn++) { /* batchnorm runs in bf16, in both modes */
    c = bf16_cfg(4, 1, 0);
    c.batchnorm = bn ? DP_BN_SYNC : DP_BN_PER_REPLICA;
    ck_assert_msg(dp_plan_create(m, &c, &pl) == DP_OK, "%s", dp_last_error());
    dp_plan_free(pl);
  }
  dp_model_free(m);
}
END_TEST

/* dp_bench_gemm_bf16 times the bf16 GEMM on the cpu backend (what dp bench
 * fit-costs calibrates bf16_gflops with) and refuses bad arguments. */
START_TEST(bench_gemm_bf16_times_and_refuses) {
  dp_config c;
  dp_config_default(&c);
  double ms = -1;
  ck_assert_msg(dp_bench_gemm_bf16(c.backend, 0, 64, 48, 40, 2, &ms) == DP_OK, "%s",
                dp_last_error());
  ck_assert(ms > 0);
  ck_assert_int_eq(dp_bench_gemm_bf16(c.backend, 0, 0, 48, 40, 2, &ms), DP_ERR_INVALID);
  ck_assert(ms == 0);
  ck_assert_int_eq(dp_bench_gemm_bf16(c.backend, 1, 8, 8, 8, 1, &ms), DP_ERR_INVALID);
  ck_assert_int_eq(dp_bench_gemm_bf16(c.backend, 0, 8, 8, 8, 1, NULL), DP_ERR_INVALID);
}
END_TEST

/* ---- config.reduce_precision bf16: the gradient reduction in bf16 ---- */

/* One hash for 1, 2, 4 and 8 devices (8: devices without rows) in classic,
 * allreduce and sharded allreduce, in either precision, with recompute too;
 * not the hash of the fp32 reduction. Sync batchnorm's sums go through the
 * same rounded tree. */
START_TEST(reduce_bf16_same_bits_on_every_device_count_and_mode) {
  const model_case *mc = &MODELS[_i];
  for (int prec = 0; prec < 2; prec++) {
    dp_config base = model_cfg(mc, 1);
    base.precision = prec ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
    base.reduce_precision = DP_PRECISION_BF16;
    uint64_t ref = train_hash(mc->spec, base, mc->cols, mc->tokens);
    const int devs[] = {2, 4, 8};
    for (int k = 0; k < 3; k++)
      for (int mode = 0; mode < 3; mode++) {
        dp_config c = base;
        c.n_devices = devs[k];
        c.mode = mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC;
        c.shard_optimizer = mode == 2;
        c.recompute = k == 1 ? 2 : 0;
        uint64_t h = train_hash(mc->spec, c, mc->cols, mc->tokens);
        ck_assert_msg(h == ref, "%s, %s: %d devices, mode %d: %016llx, 1 device: %016llx",
                      mc->name, dp_precision_name(base.precision), devs[k], mode,
                      (unsigned long long)h, (unsigned long long)ref);
      }
    dp_config f = base;
    f.reduce_precision = DP_PRECISION_FP32;
    ck_assert_msg(train_hash(mc->spec, f, mc->cols, mc->tokens) != ref,
                  "%s: the bf16 reduction gave the fp32 reduction's bits", mc->name);
  }
}
END_TEST

/* Gradient accumulation's sums round too: 2 calls per update on 1 device and
 * on 4 in allreduce give one hash. */
START_TEST(reduce_bf16_accumulation_same_bits) {
  dp_config c = bf16_cfg(8, 1, 2);
  c.precision = DP_PRECISION_FP32;
  c.reduce_precision = DP_PRECISION_BF16;
  c.accumulate = 2;
  uint64_t ref = train_hash(MLP_EVERY_KIND_SPEC, c, 12, false);
  c.n_devices = 4;
  c.mode = DP_MODE_ALLREDUCE;
  ck_assert_uint_eq(train_hash(MLP_EVERY_KIND_SPEC, c, 12, false), ref);
  c.reduce_precision = DP_PRECISION_FP32;
  ck_assert_uint_ne(train_hash(MLP_EVERY_KIND_SPEC, c, 12, false), ref);
}
END_TEST

/* The sum over micro-batches lo..hi-1 of the canonical tree (split at
 * (lo + hi + 1) / 2), every sum rounded to bf16, written out here. */
static void tree_bf16(float *const *leaf, int lo, int hi, size_t n, float *out) {
  if (hi - lo == 1) {
    memcpy(out, leaf[lo], n * 4);
    return;
  }
  int mid = (lo + hi + 1) / 2;
  float *right = malloc(n * 4);
  tree_bf16(leaf, lo, mid, n, out);
  tree_bf16(leaf, mid, hi, n, right);
  for (size_t i = 0; i < n; i++) out[i] = rnd(out[i] + right[i]);
  free(right);
}

/* What the bf16 reduction computes, against its definition: each of the M
 * micro-batches' gradients (taken alone, a step of its rows: the whole
 * batch's mean loss scales it by rows / B, a power of two, exactly) rounded
 * to bf16, then summed in the canonical tree with every sum rounded: the
 * gradients dp_get_grads reads after a step on 1, 2 and 4 devices, classic
 * and allreduce, bit for bit (M = 4 and M = 8: trees of 2 and 3 levels). */
START_TEST(reduce_bf16_sums_the_rounded_micro_batch_gradients_in_the_tree) {
  static const char *spec = "input 12\nlinear 16\nlayernorm\ngelu\nlinear 16\ntanh\n"
                            "linear 5 nobias\nloss softmax_cross_entropy\n";
  enum { MB = 2, COLS = 12 };
  int M = _i ? 8 : 4, B = M * MB;
  float *x = malloc(sizeof(float) * (size_t)B * COLS);
  int32_t *t = malloc(sizeof(int32_t) * (size_t)B);
  for (int k = 0; k < B * COLS; k++) x[k] = (float)((k * 29 + 3) % 61 - 30) / 17.0f;
  for (int k = 0; k < B; k++) t[k] = (k * 3 + 1) % 5;
  dp_config a = CFG(.batch = MB, .n_devices = 1, .opt = DP_OPT_SGD, .seed = 5);
  float *leaf[8], *want = NULL, *got = NULL;
  size_t n = 0;
  for (int k = 0; k < M; k++) { /* each from the initial parameters */
    rig alone;
    rig_open(&alone, spec, &a);
    n = alone.np;
    leaf[k] = malloc(n * 4);
    ck_assert_int_eq(dp_train_step(alone.c, MB, COLS, x + k * MB * COLS, t + k * MB, NULL),
                     DP_OK);
    ck_assert_int_eq(dp_get_grads(alone.c, leaf[k], n), DP_OK);
    for (size_t i = 0; i < n; i++) leaf[k][i] = rnd(leaf[k][i] * ((float)MB / (float)B));
    rig_close(&alone);
  }
  want = malloc(n * 4);
  got = malloc(n * 4);
  tree_bf16(leaf, 0, M, n, want);
  for (int devs = 1; devs <= 4; devs *= 2)
    for (int mode = 0; mode < 2; mode++) {
      dp_config c = CFG(.batch = B, .n_devices = devs, .opt = DP_OPT_SGD, .micro_batch = MB,
                        .seed = 5);
      c.mode = mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC;
      c.reduce_precision = DP_PRECISION_BF16;
      rig r;
      rig_open(&r, spec, &c);
      ck_assert_int_eq(dp_train_step(r.c, B, COLS, x, t, NULL), DP_OK);
      ck_assert_int_eq(dp_get_grads(r.c, got, n), DP_OK);
      for (size_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&got[i], &want[i], 4) == 0,
                      "M %d, %d devices, mode %d: gradient %zu is %a, the tree gives %a", M,
                      devs, mode, i, (double)got[i], (double)want[i]);
      rig_close(&r);
    }
  for (int k = 0; k < M; k++) free(leaf[k]);
  free(want);
  free(got);
  free(x);
  free(t);
}
END_TEST

/* ---- gelu, layernorm and the residual adds on the bf16 tensors ---- */

/* A GPT of width 264 (not a multiple of 16): its layernorms run on blocks of
 * 48 positions, two per micro-batch of 16 rows; and one of width 520 (blocks
 * of 16). */
static const char WIDE_GPT_SPEC[] =
    "input tokens 6\nembed 11 264\n"
    "residual\nlayernorm\nlinear 792\nattention 2\nlinear 264\nend\n"
    "residual\nlayernorm\nlinear 528\ngelu\nlinear 264\nend\n"
    "layernorm\nlinear 11\nloss softmax_cross_entropy\n";
static const char WIDER_GPT_SPEC[] =
    "input tokens 6\nembed 11 520\n"
    "residual\nlayernorm\nlinear 1560\nattention 4\nlinear 520\nend\n"
    "layernorm\nlinear 11\nloss softmax_cross_entropy\n";
/* a gelu, and a residual block, as the last layer: its output is the model's
 * fp32 output (the shadowed ops run there: the end's add, and the begin's,
 * whose skip is the loss's fp32 gradient) */
static const char LAST_LAYERS_SPEC[] =
    "input 12\nlinear 16\nresidual\nlayernorm\nlinear 16\ngelu\nlinear 16\nend\n"
    "residual\ngelu\nend\nlinear 5\ngelu\nloss softmax_cross_entropy\n";
/* the exact gelu (`gelu approximate none`) in the middle, in a block and
 * last: its own bf16 loops and the shadowed fp32 op */
static const char GELU_ERF_SPEC[] =
    "input 12\nlinear 40\ngelu approximate none\nresidual\nlayernorm\nlinear 40\n"
    "gelu approximate none\nend\nlinear 5\ngelu approximate none\n"
    "loss softmax_cross_entropy\n";
static const char RESIDUAL_LAST_SPEC[] =
    "input 12\nlinear 16\ngelu\nlinear 5\nresidual\nlayernorm\nlinear 5\nend\n"
    "loss softmax_cross_entropy\n";

/* A projection shortcut: the end's backward copies its gradient to f's output
 * too (own loop or shadowed, the same bits). */
static const char SHORTCUT_SPEC[] =
    "input 12\nlinear 16\ngelu\nresidual\nlinear 8\ngelu\nshortcut\nlinear 8\nend\n"
    "linear 5\nloss softmax_cross_entropy\n";

static const struct {
  const char *spec;
  int cols;
  bool tokens;
} OWN_LOOPS[] = {{WIDE_GPT_SPEC, GPT_T, true},    {WIDER_GPT_SPEC, GPT_T, true},
                 {GPT_SPEC, GPT_T, true},         {MLP_EVERY_KIND_SPEC, 12, false},
                 {BN_MLP_SPEC, 12, false},        {LAST_LAYERS_SPEC, 12, false},
                 {RESIDUAL_LAST_SPEC, 12, false}, {GELU_ERF_SPEC, 12, false},
                 {SHORTCUT_SPEC, 12, false}};

/* The forward's outputs on rows with NaNs of both signs (and payloads),
 * infinities and denormals in their inputs. */
static void special_forward(const char *spec, dp_config c, float *y, size_t n_out) {
  rig r;
  rig_open(&r, spec, &c);
  const uint32_t sp[] = {0x7fc00001u, 0xffc00000u, 0x7f800000u, 0xff800000u,
                         0x00000003u, 0x80400000u, 0x7f7fffffu, 0x3f800001u};
  float x[16 * 12];
  for (int k = 0; k < 16 * 12; k++) {
    x[k] = (float)((k * 29) % 61 - 30) / 17.0f;
    if (k % 7 == 3) memcpy(&x[k], &sp[(k / 7) % 8], 4);
  }
  ck_assert_msg(dp_forward(r.c, 16, 12, x, y) == DP_OK, "%s", dp_ctx_error(r.c));
  ck_assert_uint_eq((size_t)16 * dp_model_output_width(r.m), n_out);
  rig_close(&r);
}

/* The own loops (lib/cpu/mixed.c) against the generic way (fp32 copies of the
 * operands, the fp32 op, the results rounded), on every tier: the same bits
 * after 4 steps (parameters, then the eval forward's outputs), on 1 and 2
 * devices; and the same outputs of a forward on NaNs, infinities and
 * denormals (the NaNs made quiet NaNs of their sign, as the rounding does). */
START_TEST(own_loops_give_the_shadowed_ops_bits) {
  static const char *const tiers[] = {"avx512", "avx2", "scalar"};
  int ran = 0;
  for (int t = 0; t < 3; t++) {
    if (dp__gemm_force_tier(tiers[t]) != 0) continue; /* not on this CPU */
    ran++;
    const char *spec = OWN_LOOPS[_i].spec;
    for (int devs = 1; devs <= 2; devs++) {
      dp_config c = bf16_cfg(32, devs, 16);
      dp__mixed_force_shadow(true);
      uint64_t want = train_hash(spec, c, OWN_LOOPS[_i].cols, OWN_LOOPS[_i].tokens);
      dp__mixed_force_shadow(false);
      unsigned long runs = dp__mixed_own_runs();
      uint64_t got = train_hash(spec, c, OWN_LOOPS[_i].cols, OWN_LOOPS[_i].tokens);
      ck_assert_msg(dp__mixed_own_runs() > runs, "spec %d: no op ran on bf16 tensors", _i);
      ck_assert_msg(got == want, "spec %d, tier %s, %d devices: %016llx, shadowed %016llx",
                    _i, tiers[t], devs, (unsigned long long)got, (unsigned long long)want);
    }
    if (OWN_LOOPS[_i].tokens) continue;
    dp_config c = bf16_cfg(16, 1, 16);
    c.inference = true;
    float want[16 * 5], got[16 * 5];
    dp__mixed_force_shadow(true);
    special_forward(spec, c, want, 16 * 5);
    dp__mixed_force_shadow(false);
    special_forward(spec, c, got, 16 * 5);
    for (int k = 0; k < 16 * 5; k++)
      ck_assert_msg(memcmp(&got[k], &want[k], 4) == 0,
                    "spec %d, tier %s: output %d is %a, shadowed %a", _i, tiers[t], k,
                    (double)got[k], (double)want[k]);
  }
  dp__gemm_force_tier("auto");
  ck_assert_int_ge(ran, 1);
}
END_TEST

/* The loss's fp32 gradient reaches a model's last layer rounded to bf16, as
 * autocast's cast of the bf16 output gives it: a residual block ending the
 * model included, on both of its paths (the block's begin adds it to its
 * input's gradient): the same bits as with a dropout of 0 after the block,
 * whose input gradient is that gradient rounded. */
START_TEST(a_residual_block_ending_the_model_gets_the_rounded_gradient) {
  static const char body[] = "input 12\nlinear 16\ngelu\nlinear 5\n"
                             "residual\nlayernorm\nlinear 5\nend\n";
  char a[256], b[256];
  snprintf(a, sizeof a, "%sloss softmax_cross_entropy\n", body);
  snprintf(b, sizeof b, "%sdropout 0\nloss softmax_cross_entropy\n", body);
  for (int devs = 1; devs <= 2; devs++) {
    dp_config c = bf16_cfg(32, devs, 16);
    uint64_t ha = train_hash(a, c, 12, false), hb = train_hash(b, c, 12, false);
    ck_assert_msg(ha == hb, "%d devices: %016llx, with a dropout of 0 after: %016llx", devs,
                  (unsigned long long)ha, (unsigned long long)hb);
  }
}
END_TEST

Suite *precision_suite(void) {
  Suite *s = suite_create("precision");
  TCase *tc = tcase_create("bf16");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, linear_forward_is_the_bf16_dot_product);
  tcase_add_loop_test(tc, same_bits_on_every_device_count_and_mode, 0, N_MODELS);
  tcase_add_loop_test(tc, recompute_gives_the_same_bits, 0, N_MODELS);
  tcase_add_loop_test(tc, batchnorm_statistics_over_the_bf16_values, 0, 2);
  tcase_add_test(tc, loss_close_to_fp32);
  tcase_add_test(tc, activation_bytes_at_most_055_of_fp32);
  tcase_add_test(tc, refusals_name_the_options);
  tcase_add_test(tc, bench_gemm_bf16_times_and_refuses);
  tcase_add_loop_test(tc, own_loops_give_the_shadowed_ops_bits, 0,
                      (int)(sizeof OWN_LOOPS / sizeof OWN_LOOPS[0]));
  tcase_add_test(tc, a_residual_block_ending_the_model_gets_the_rounded_gradient);
  suite_add_tcase(s, tc);
  tc = tcase_create("reduce_bf16");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, reduce_bf16_same_bits_on_every_device_count_and_mode, 0,
                      N_MODELS);
  tcase_add_test(tc, reduce_bf16_accumulation_same_bits);
  tcase_add_loop_test(tc, reduce_bf16_sums_the_rounded_micro_batch_gradients_in_the_tree, 0,
                      2);
  suite_add_tcase(s, tc);
  return s;
}
