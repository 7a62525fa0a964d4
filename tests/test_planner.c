/* Tests of the planner: the seed example's exact arena layout (hand-computed),
 * region invariants and activation liveness over many random models and
 * configurations, the budget search, the static schedule, the CUDA layout
 * rules and configuration errors. */
#include "core/backend.h"
#include "core/operands.h"

#include <check.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "req.h"
#include "specs.h"

/* ---- helpers ------------------------------------------------------------------ */

static const char SEED[] = "input 5\nlinear 2\nloss mse\n";

static size_t max_device_bytes(const dp_plan *p) {
  size_t mx = 0;
  for (int d = 0; d < dp_plan_n_devices(p); d++)
    if (dp_plan_device_bytes(p, d) > mx) mx = dp_plan_device_bytes(p, d);
  return mx;
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* xorshift64*: the tests' own seeded generator */
static uint64_t rng_state;
static uint32_t rnd(uint32_t n) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32) % n;
}

/* A random model: 1..max_layers layers of random kinds and widths 1..48;
 * with bn, a quarter of them batchnorm (BatchNorm1d over the features; the
 * draws without bn are those of before). */
static dp_model *random_flat_model(int max_layers, int with_loss, int bn) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_new(1 + (int)rnd(48), &m), DP_OK);
  int L = 1 + (int)rnd((uint32_t)max_layers);
  for (int i = 0; i < L; i++) {
    if (bn && rnd(4) == 0) {
      ck_assert_int_eq(dp_model_add(m, DP_LAYER_BATCHNORM), DP_OK);
      continue;
    }
    switch (rnd(7)) {
    case 0:
    case 1:
      ck_assert_int_eq(dp_model_add_linear(m, 1 + (int)rnd(48), (int)rnd(4) != 0), DP_OK);
      break;
    case 2: ck_assert_int_eq(dp_model_add(m, DP_LAYER_RELU), DP_OK); break;
    case 3: {
      static const dp_layer_kind acts[] = {DP_LAYER_GELU, DP_LAYER_TANH, DP_LAYER_SILU,
                                           DP_LAYER_LEAKY_RELU};
      dp_layer_kind k = acts[rnd(4)];
      if (k == DP_LAYER_LEAKY_RELU) /* both ways of its backward: y's sign or x's */
        ck_assert_int_eq(dp_model_add_leaky_relu(m, rnd(2) ? 0.25f : -0.5f), DP_OK);
      else
        ck_assert_int_eq(dp_model_add(m, k), DP_OK);
      break;
    }
    case 4: ck_assert_int_eq(dp_model_add(m, DP_LAYER_SIGMOID), DP_OK); break;
    case 5: ck_assert_int_eq(dp_model_add(m, DP_LAYER_LAYERNORM), DP_OK); break;
    default:
      ck_assert_int_eq(dp_model_add_dropout(m, 0.125f * (float)rnd(8)), DP_OK);
      break;
    }
  }
  if (with_loss)
    ck_assert_int_eq(dp_model_set_loss(m, rnd(2) ? DP_LOSS_MSE : DP_LOSS_SOFTMAX_CE),
                     DP_OK);
  return m;
}

static dp_model *random_model(int max_layers, int with_loss) {
  return random_flat_model(max_layers, with_loss, 0);
}

/* A random image model: C x H x W input, conv2d / pools / elementwise layers
 * while the shape allows, flatten (sometimes first, sometimes last), then
 * flat layers. bn: more batchnorm (2d, and 1d after the flatten; the draws
 * without bn are those of before). */
static dp_model *random_image_model(int max_layers, int with_loss, int bn) {
  dp_model *m = NULL;
  int c = 1 + (int)rnd(3), h = 2 + (int)rnd(9), w = 2 + (int)rnd(9);
  ck_assert_int_eq(dp_model_new_image(c, h, w, &m), DP_OK);
  int L = 1 + (int)rnd((uint32_t)max_layers), flat = rnd(6) == 0;
  if (flat)
    ck_assert_int_eq(dp_model_add(m, DP_LAYER_FLATTEN), DP_OK); /* right after input */
  for (int i = 0; i < L; i++) {
    if (flat) {
      if (bn && rnd(4) == 0)
        ck_assert_int_eq(dp_model_add(m, DP_LAYER_BATCHNORM), DP_OK);
      else if (rnd(3) == 0)
        ck_assert_int_eq(dp_model_add(m, DP_LAYER_FLATTEN), DP_OK); /* flatten of flat */
      else if (rnd(2))
        ck_assert_int_eq(dp_model_add_linear(m, 1 + (int)rnd(24), 1), DP_OK);
      else
        ck_assert_int_eq(dp_model_add(m, DP_LAYER_RELU), DP_OK);
      continue;
    }
    int k = 1 + (int)rnd(3), st = 1 + (int)rnd(2), pad = (int)rnd(2);
    switch (rnd(6)) {
    case 0:
    case 1:
      if (k <= h + 2 * pad && k <= w + 2 * pad && pad < k) {
        ck_assert_int_eq(
            dp_model_add_conv2d(m, 1 + (int)rnd(5), k, st, pad, (int)rnd(3) != 0), DP_OK);
        h = (h + 2 * pad - k) / st + 1, w = (w + 2 * pad - k) / st + 1;
      }
      break;
    case 2: {
      /* padded where PyTorch allows it (pad <= k / 2), from the same draws */
      int pp = pad <= k / 2 ? pad : 0;
      if (k <= h + 2 * pp && k <= w + 2 * pp) {
        dp_layer_kind kind = rnd(2) ? DP_LAYER_MAXPOOL2D : DP_LAYER_AVGPOOL2D;
        ck_assert_int_eq(dp_model_add_pool2d_padded(m, kind, k, st, pp,
                                                    kind == DP_LAYER_AVGPOOL2D && st == 1),
                         DP_OK);
        h = (h + 2 * pp - k) / st + 1, w = (w + 2 * pp - k) / st + 1;
      }
      break;
    }
    case 3:
      ck_assert_int_eq(dp_model_add(m, rnd(bn ? 2 : 3) == 0 ? DP_LAYER_BATCHNORM
                                       : rnd(2)             ? DP_LAYER_RELU
                                                            : DP_LAYER_TANH),
                       DP_OK);
      break;
    case 4: ck_assert_int_eq(dp_model_add_dropout(m, 0.25f), DP_OK); break;
    default:
      ck_assert_int_eq(dp_model_add(m, DP_LAYER_FLATTEN), DP_OK);
      flat = 1;
      break;
    }
  }
  if (with_loss) {
    if (dp_model_n_layers(m) == 0)
      ck_assert_int_eq(dp_model_add(m, DP_LAYER_FLATTEN), DP_OK);
    ck_assert_int_eq(
        dp_model_set_loss(m, flat && rnd(2) ? DP_LOSS_SOFTMAX_CE : DP_LOSS_MSE), DP_OK);
  }
  return m;
}

static dp_config random_config(int max_batch, int max_devices) {
  dp_config c = config_of(1 + (int)rnd((uint32_t)max_batch),
                          1 + (int)rnd((uint32_t)max_devices), DP_OPT_SGD);
  c.split = (dp_split)rnd(2);
  c.micro_batch = rnd(2) ? 0 : 1 + (int)rnd((uint32_t)c.batch);
  dp_config_set_optimizer(&c, (dp_optimizer)rnd(3));
  c.inference = rnd(3) == 0;
  /* the same draws in every build; cuda only where this build has it */
  c.backend = rnd(4) == 0 && dp_cuda_available() ? DP_BACKEND_CUDA : DP_BACKEND_CPU;
  return c;
}

/* ---- the seed example: exact layout ---------------------------------------- */

typedef struct {
  size_t offset, size;
} region_want;

static void expect_layout(const dp_plan *p, int d, const region_want *want, size_t total) {
  for (int r = 0; r < DP_REGION_COUNT; r++) {
    dp_region_info ri = dp_plan_region(p, d, (dp_region)r);
    ck_assert_msg(ri.offset == want[r].offset && ri.size == want[r].size,
                  "device %d region %s: (offset %zu, size %zu), want (%zu, %zu)", d,
                  dp_region_name((dp_region)r), ri.offset, ri.size, want[r].offset,
                  want[r].size);
    ck_assert_uint_eq(ri.align, 64);
  }
  ck_assert_uint_eq(dp_plan_device_bytes(p, d), total);
}

/* Device 1 of the seed plan is the same for every optimizer: params 48 at 0,
 * grads 48 at 64 (48 -> 64), partials and optimizer state 0 at 128 (112 ->
 * 128), inputs 15*5*4 = 300 at 128 (-> 428), targets 0 at 448 (428 -> 448),
 * activations 0 at 448 (a one-layer model has no intermediate buffers),
 * outputs 15*2*4 = 120 at 448 (-> 568), output_grads 120 at 576 (568 -> 576;
 * -> 696), and the device-0-only regions all 0 at 704 (696 -> 704).
 * Total: 704. */
static const region_want SEED_DEV1[DP_REGION_COUNT] = {
    [DP_REGION_PARAMS] = {0, 48},          [DP_REGION_GRADS] = {64, 48},
    [DP_REGION_GRAD_PARTIALS] = {128, 0},  [DP_REGION_OPT_STATE] = {128, 0},
    [DP_REGION_INPUTS] = {128, 300},       [DP_REGION_TARGETS] = {448, 0},
    [DP_REGION_ACTIVATIONS] = {448, 0},    [DP_REGION_OUTPUTS] = {448, 120},
    [DP_REGION_OUTPUT_GRADS] = {576, 120}, [DP_REGION_GATHERED_OUTPUTS] = {704, 0},
    [DP_REGION_GATHERED_GRADS] = {704, 0}, [DP_REGION_LOSS] = {704, 0},
    [DP_REGION_COMM] = {704, 0},           [DP_REGION_WORKSPACE] = {704, 0}};
#define SEED_DEV1_TOTAL 704

START_TEST(seed_splits_thirty_rows_into_two_chunks_of_fifteen) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  dp_plan *p = plan_of(m, &c);
  ck_assert_int_eq(dp_plan_n_devices(p), 2);
  ck_assert_int_eq(dp_plan_device_rows(p, 0), 15);
  ck_assert_int_eq(dp_plan_device_rows(p, 1), 15);
  ck_assert_int_eq(dp_plan_device_micro_batches(p, 0), 1);
  ck_assert_int_eq(dp_plan_device_micro_batches(p, 1), 1);
  ck_assert_uint_eq(dp_plan_host_bytes(p),
                    0); /* cpu: the caller's memory is read directly */
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(seed_region_sizes_match_the_seed_document) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  dp_plan *p = plan_of(m, &c);
  for (int d = 0; d < 2; d++) {
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_PARAMS).size,
                      48); /* 12 floats, replicated */
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_GRADS).size, 48);
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_INPUTS).size, 300);  /* 15 x 5 x 4 */
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_OUTPUTS).size, 120); /* 15 x 2 x 4 */
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_OUTPUT_GRADS).size, 120);
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_OPT_STATE).size, 0); /* plain SGD */
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_GRAD_PARTIALS).size, 0);
  }
  /* the output device holds the whole batch's targets, outputs and their grads */
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_TARGETS).size, 240); /* 30 x 2 x 4 */
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_GATHERED_OUTPUTS).size, 240);
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_GATHERED_GRADS).size, 240);
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_LOSS).size, 8); /* 2 micro-batches x 4 */
  /* device 1's gradients are added into device 0's in place (the cpu
   * transport's copy_add): no receive buffer; the cuda plan has one of 48 */
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_COMM).size, 0);
  static const dp_region dev0_only[] = {DP_REGION_TARGETS, DP_REGION_GATHERED_OUTPUTS,
                                        DP_REGION_GATHERED_GRADS, DP_REGION_LOSS,
                                        DP_REGION_COMM};
  for (size_t i = 0; i < sizeof dev0_only / sizeof *dev0_only; i++)
    ck_assert_msg(dp_plan_region(p, 1, dev0_only[i]).size == 0, "device 1 has %s",
                  dp_region_name(dev0_only[i]));
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(seed_sgd_layout_is_exact) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  dp_plan *p = plan_of(m, &c);
  /* Device 0, regions in enum order, each offset aligned up to 64:
   *   params            0 + 48  =  48
   *   grads            64 + 48  = 112
   *   grad_partials   128 + 0        (one micro-batch per device: no partials)
   *   optimizer_state 128 + 0        (plain SGD)
   *   inputs          128 + 300 = 428   (15 x 5 x 4)
   *   targets         448 + 240 = 688   (30 x 2 x 4)
   *   activations     704 + 0
   *   outputs         704 + 120 = 824   (15 x 2 x 4)
   *   output_grads    832 + 120 = 952
   *   gathered_outputs 960 + 240 = 1200 (30 x 2 x 4)
   *   gathered_grads 1216 + 240 = 1456
   *   loss           1472 + 8   = 1480  (2 micro-batches x 4)
   *   comm           1536 + 0       (the cpu transport adds device 1's grads
   *                                      into device 0's in place: no receive
   *                                      buffer; on cuda it is 48)
   *   workspace      1536 + 0
   *   total = 1536 */
  static const region_want dev0[DP_REGION_COUNT] = {
      [DP_REGION_PARAMS] = {0, 48},
      [DP_REGION_GRADS] = {64, 48},
      [DP_REGION_GRAD_PARTIALS] = {128, 0},
      [DP_REGION_OPT_STATE] = {128, 0},
      [DP_REGION_INPUTS] = {128, 300},
      [DP_REGION_TARGETS] = {448, 240},
      [DP_REGION_ACTIVATIONS] = {704, 0},
      [DP_REGION_OUTPUTS] = {704, 120},
      [DP_REGION_OUTPUT_GRADS] = {832, 120},
      [DP_REGION_GATHERED_OUTPUTS] = {960, 240},
      [DP_REGION_GATHERED_GRADS] = {1216, 240},
      [DP_REGION_LOSS] = {1472, 8},
      [DP_REGION_COMM] = {1536, 0},
      [DP_REGION_WORKSPACE] = {1536, 0}};
  expect_layout(p, 0, dev0, 1536);
  expect_layout(p, 1, SEED_DEV1, SEED_DEV1_TOTAL);
  ck_assert_uint_gt(dp_plan_device_bytes(p, 0),
                    dp_plan_device_bytes(p, 1)); /* GPU 0 needs more */
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(seed_momentum_layout_is_exact) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  dp_config_set_optimizer(&c, DP_OPT_MOMENTUM);
  dp_plan *p = plan_of(m, &c);
  /* Device 0: the momentum buffer (12 floats = 48) shifts everything after it:
   *   params 0+48, grads 64+48=112, partials 128+0,
   *   optimizer_state 128 + 48 = 176
   *   inputs          192 + 300 = 492
   *   targets         512 + 240 = 752
   *   activations     768 + 0
   *   outputs         768 + 120 = 888
   *   output_grads    896 + 120 = 1016
   *   gathered_outputs 1024 + 240 = 1264
   *   gathered_grads 1280 + 240 = 1520
   *   loss           1536 + 8   = 1544
   *   comm           1600 + 0    (no receive buffer on the cpu backend)
   *   workspace      1600 + 0;   total 1600 */
  static const region_want dev0[DP_REGION_COUNT] = {
      [DP_REGION_PARAMS] = {0, 48},
      [DP_REGION_GRADS] = {64, 48},
      [DP_REGION_GRAD_PARTIALS] = {128, 0},
      [DP_REGION_OPT_STATE] = {128, 48},
      [DP_REGION_INPUTS] = {192, 300},
      [DP_REGION_TARGETS] = {512, 240},
      [DP_REGION_ACTIVATIONS] = {768, 0},
      [DP_REGION_OUTPUTS] = {768, 120},
      [DP_REGION_OUTPUT_GRADS] = {896, 120},
      [DP_REGION_GATHERED_OUTPUTS] = {1024, 240},
      [DP_REGION_GATHERED_GRADS] = {1280, 240},
      [DP_REGION_LOSS] = {1536, 8},
      [DP_REGION_COMM] = {1600, 0},
      [DP_REGION_WORKSPACE] = {1600, 0}};
  expect_layout(p, 0, dev0, 1600);
  expect_layout(p, 1, SEED_DEV1,
                SEED_DEV1_TOTAL); /* optimizer state lives on device 0 only */
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(seed_adamw_layout_is_exact) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  dp_config_set_optimizer(&c, DP_OPT_ADAMW);
  dp_plan *p = plan_of(m, &c);
  /* Device 0: AdamW keeps m and v (2 x 48 = 96):
   *   params 0+48, grads 64+48=112, partials 128+0,
   *   optimizer_state 128 + 96 = 224
   *   inputs          256 + 300 = 556
   *   targets         576 + 240 = 816
   *   activations     832 + 0
   *   outputs         832 + 120 = 952
   *   output_grads    960 + 120 = 1080
   *   gathered_outputs 1088 + 240 = 1328
   *   gathered_grads 1344 + 240 = 1584
   *   loss           1600 + 8   = 1608
   *   comm           1664 + 0    (no receive buffer on the cpu backend)
   *   workspace      1664 + 0;   total 1664 */
  static const region_want dev0[DP_REGION_COUNT] = {
      [DP_REGION_PARAMS] = {0, 48},
      [DP_REGION_GRADS] = {64, 48},
      [DP_REGION_GRAD_PARTIALS] = {128, 0},
      [DP_REGION_OPT_STATE] = {128, 96},
      [DP_REGION_INPUTS] = {256, 300},
      [DP_REGION_TARGETS] = {576, 240},
      [DP_REGION_ACTIVATIONS] = {832, 0},
      [DP_REGION_OUTPUTS] = {832, 120},
      [DP_REGION_OUTPUT_GRADS] = {960, 120},
      [DP_REGION_GATHERED_OUTPUTS] = {1088, 240},
      [DP_REGION_GATHERED_GRADS] = {1344, 240},
      [DP_REGION_LOSS] = {1600, 8},
      [DP_REGION_COMM] = {1664, 0},
      [DP_REGION_WORKSPACE] = {1664, 0}};
  expect_layout(p, 0, dev0, 1664);
  expect_layout(p, 1, SEED_DEV1, SEED_DEV1_TOTAL);
  ck_assert(dp_plan_config(p)->weight_decay == 0.01f); /* AdamW's default, resolved */
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(seed_inference_layout_is_exact) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  c.inference = 1;
  dp_plan *p = plan_of(m, &c);
  /* Every device: params 0+48, grads/partials/opt 0 at 64, inputs 64+300 = 364,
   * targets and activations 0 at 384, outputs 384+120 = 504, the rest 0 at 512.
   * Total 512 on both: inference has no output device extras. */
  for (int d = 0; d < 2; d++) {
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_INPUTS).offset, 64);
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_OUTPUTS).offset, 384);
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_OUTPUTS).size, 120);
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_GRADS).size, 0);
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_GATHERED_OUTPUTS).size, 0);
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_WORKSPACE).offset, 512);
    ck_assert_uint_eq(dp_plan_device_bytes(p, d), 512);
  }
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* The cuda backend plans attention dropout: its training WORKSPACE holds a
 * second (n, T, T) block per micro-batch of n rows (a head's kept
 * probabilities, beside the backward's d(scores)) after what the same model
 * without the dropout reserves. */
START_TEST(cuda_plans_attention_dropout_with_its_scratch) {
  if (!cuda_or_skip("planner", "cuda_plans_attention_dropout_with_its_scratch")) return;
  static const char *const specs[2] = {
      "input tokens 4\nembed 9 6\nlinear 18\nattention 2\nlinear 9\n"
      "loss softmax_cross_entropy\n",
      "input tokens 4\nembed 9 6\nlinear 18\nattention 2 dropout 0.1\nlinear 9\n"
      "loss softmax_cross_entropy\n"};
  size_t ws[2][2]; /* [dropout][inference] */
  for (int k = 0; k < 2; k++)
    for (int inf = 0; inf < 2; inf++) {
      dp_model *m = model_of(specs[k]);
      dp_config c = config_of(12, 1, DP_OPT_SGD);
      c.backend = DP_BACKEND_CUDA;
      c.micro_batch = 3;
      c.inference = inf;
      dp_plan *p = plan_of(m, &c);
      ck_assert_int_eq(p->act[0].mb_rows, 3);
      ws[k][inf] = p->regions[0][DP_REGION_WORKSPACE].size;
      dp_plan_free(p);
      dp_model_free(m);
    }
  ck_assert_uint_eq(ws[1][0], ws[0][0] + 256); /* 3 x 4 x 4 floats, rounded up */
  ck_assert_uint_eq(ws[1][1], ws[0][1]);       /* no dropout in inference */
}
END_TEST

/* A backend without the capability (here the cpu backend's vtable registered
 * again with attention_dropout false) refuses a training plan with attention
 * dropout, naming the layer and what to do; inference (no dropout) and
 * attention without dropout plan. */
START_TEST(backend_without_attention_dropout_refuses_it_naming_the_layer) {
  static dp_backend_ops lacking;
  lacking = *dp__backend_ops(DP_BACKEND_CPU);
  lacking.name = "no_adrop";
  lacking.attention_dropout = false;
  dp_backend kind = DP_BACKEND_CPU;
  ck_assert_int_eq(dp__backend_register(&lacking, &kind), DP_OK);
  dp_model *m = model_of("input tokens 4\nembed 9 6\nlinear 18\nattention 2 dropout 0.1\n"
                         "linear 9\nloss softmax_cross_entropy\n");
  dp_config c = config_of(4, 1, DP_OPT_SGD);
  c.backend = kind;
  dp_plan *p = NULL;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(dp_last_error(), "the no_adrop backend does not run attention "
                                        "dropout yet (layer 2); use the cpu backend"),
                "%s", dp_last_error());
  c.inference = 1;
  dp_plan_free(plan_of(m, &c));
  dp_model_free(m);
  m = model_of("input tokens 4\nembed 9 6\nlinear 18\nattention 2\nlinear 9\n"
               "loss softmax_cross_entropy\n");
  c.inference = 0;
  dp_plan_free(plan_of(m, &c));
  dp_model_free(m);
}
END_TEST

START_TEST(seed_on_cuda_aligns_to_256_and_stages_on_the_host) {
  if (!cuda_or_skip("planner", "seed_on_cuda_aligns_to_256_and_stages_on_the_host")) return;
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  c.backend = DP_BACKEND_CUDA;
  dp_plan *p = plan_of(m, &c);
  /* Device 0 with 256-byte alignment:
   *   params 0+48, grads 256+48, partials/opt 512+0, inputs 512+300 = 812,
   *   targets 1024+240 = 1264, activations/outputs 1280 (+120 = 1400),
   *   output_grads 1536+120 = 1656, gathered_outputs 1792+240 = 2032,
   *   gathered_grads 2048+240 = 2288, loss 2304+8 = 2312, comm 2560+48 = 2608,
   *   workspace 2816 + 16384 (status words, loss and batchnorm scratch) + 32 MiB (cuBLAS)
   *   = 33,573,632.
   * Host staging: x 30*5*4 = 600 at 0, targets 240 at 768, y 240 at 1024 (-> 1264);
   * total 1280. */
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_TARGETS).offset, 1024);
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_COMM).offset, 2560);
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_COMM).size, 48);
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_WORKSPACE).offset, 2816);
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_WORKSPACE).size, 16384 + (32u << 20));
  ck_assert_uint_eq(dp_plan_device_bytes(p, 0), 2816 + 16384 + (32u << 20));
  for (int d = 0; d < 2; d++)
    for (int r = 0; r < DP_REGION_COUNT; r++) {
      dp_region_info ri = dp_plan_region(p, d, (dp_region)r);
      ck_assert_uint_eq(ri.align, 256);
      ck_assert_uint_eq(ri.offset % 256, 0);
    }
  ck_assert_uint_eq(dp_plan_device_bytes(p, 1) % 256, 0);
  ck_assert_uint_eq(dp_plan_host_bytes(p), 1280);
  dp_plan_free(p);
  c.inference = 1; /* x 600 at 0, no targets, y 240 at 768 (-> 1008): 1024 */
  p = plan_of(m, &c);
  ck_assert_uint_eq(dp_plan_host_bytes(p), 1024);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(cpu_plans_need_no_host_staging) {
  rng_state = 77;
  for (int it = 0; it < 50; it++) {
    dp_model *m = random_model(6, 1);
    dp_config c = random_config(40, 6);
    c.backend = DP_BACKEND_CPU;
    dp_plan *p = plan_of(m, &c);
    ck_assert_uint_eq(dp_plan_host_bytes(p), 0);
    c.backend = dp_cuda_available() ? DP_BACKEND_CUDA : DP_BACKEND_CPU;
    dp_plan *q = plan_of(m, &c);
    if (c.backend == DP_BACKEND_CUDA) {
      ck_assert_uint_gt(dp_plan_host_bytes(q), 0);
      ck_assert_uint_eq(dp_plan_host_bytes(q) % 256, 0);
    }
    dp_plan_free(p);
    dp_plan_free(q);
    dp_model_free(m);
  }
}
END_TEST

/* The cpu backend's params=shared: device 0 alone holds the parameters (and
 * batchnorm buffers), the replicas' arenas are smaller by exactly that region,
 * nothing is broadcast; the other regions are those of copies. Allreduce
 * training is refused (each replica updates its own copy); an allreduce
 * inference plan shares. */
START_TEST(shared_params_are_planned_once) {
  dp_model *m = model_of("input 6\nlinear 40\nbatchnorm\nrelu\nlinear 3\n"
                         "loss softmax_cross_entropy\n");
  size_t pb = (size_t)(dp_model_n_params(m) + 2 * 40 + 1) * 4; /* and the buffers */
  for (int inf = 0; inf < 2; inf++) {
    dp_config c = config_of(24, 3, DP_OPT_MOMENTUM);
    c.inference = inf;
    c.mode = inf ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC;
    dp_plan *copies = plan_of(m, &c);
    snprintf(c.backend_options, sizeof c.backend_options, "params=shared");
    dp_plan *p = plan_of(m, &c);
    for (int d = 0; d < 3; d++) {
      size_t a = dp_plan_region(copies, d, DP_REGION_PARAMS).size;
      ck_assert_uint_eq(a, pb);
      ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_PARAMS).size, d ? 0 : pb);
      size_t aligned = (a + 63) / 64 * 64;
      ck_assert_uint_eq(dp_plan_device_bytes(p, d),
                        dp_plan_device_bytes(copies, d) - (d ? aligned : 0));
      for (int r = 1; r < DP_REGION_COUNT; r++)
        ck_assert_uint_eq(dp_plan_region(p, d, (dp_region)r).size,
                          dp_plan_region(copies, d, (dp_region)r).size);
    }
    int bc[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
      const dp_plan *q = k ? p : copies;
      for (int i = 0; i < dp_plan_n_ops(q); i++)
        bc[k] += dp_plan_ops(q)[i].phase == DP_PHASE_BROADCAST;
    }
    ck_assert_int_eq(bc[0], 2);
    ck_assert_int_eq(bc[1], 0);
    /* a transfer into a replica's parameters (it has none) fails verification,
     * as the copies' broadcast passes it */
    for (int i = 0; i < dp_plan_n_ops(copies); i++) {
      const dp_op *op = &dp_plan_ops(copies)[i];
      if (op->phase != DP_PHASE_BROADCAST) continue;
      ck_assert_int_eq(dp__op_verify(copies, i, op), DP_OK);
      ck_assert_int_eq(dp__op_verify(p, i, op), DP_ERR_INVALID);
      ck_assert_msg(strstr(dp_last_error(), "the destination is device") &&
                        strstr(dp_last_error(), "reads from device 0"),
                    "%s", dp_last_error());
    }
    dp_plan_free(p);
    dp_plan_free(copies);
  }
  dp_config c = config_of(24, 3, DP_OPT_MOMENTUM);
  c.mode = DP_MODE_ALLREDUCE;
  snprintf(c.backend_options, sizeof c.backend_options, "params=shared");
  dp_plan *p = NULL;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_ERR_INVALID);
  ck_assert_ptr_null(p);
  ck_assert_msg(strstr(dp_last_error(), "params=shared") &&
                    strstr(dp_last_error(), "classic mode"),
                "%s", dp_last_error());
  dp_model_free(m);
}
END_TEST

START_TEST(unused_devices_have_no_arena) {
  dp_model *m = model_of(SEED);
  /* torch.chunk: 1+1+1, the fourth device idles */
  dp_config c = config_of(3, 4, DP_OPT_SGD);
  dp_plan *p = plan_of(m, &c);
  ck_assert_int_eq(dp_plan_n_devices(p), 3);
  ck_assert_uint_eq(dp_plan_device_bytes(p, 3), 0);
  ck_assert_int_eq(dp_plan_device_rows(p, 3), 0);
  ck_assert_int_eq(dp_plan_device_micro_batches(p, 3), 0);
  ck_assert_uint_eq(dp_plan_region(p, 3, DP_REGION_PARAMS).size, 0);
  ck_assert_uint_eq(dp_plan_region(p, -1, DP_REGION_PARAMS).size, 0);
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_COUNT).size, 0);
  ck_assert_uint_eq(dp_plan_device_bytes(p, -1), 0);
  for (int i = 0; i < dp_plan_n_ops(p); i++) ck_assert_int_lt(dp_plan_ops(p)[i].device, 3);
  dp_plan_free(p);
  ck_assert_int_eq(dp_plan_n_devices(NULL), 0);
  ck_assert_uint_eq(dp_plan_device_bytes(NULL, 0), 0);
  ck_assert_int_eq(dp_plan_n_ops(NULL), 0);
  dp_plan_free(NULL);
  dp_model_free(m);
}
END_TEST

/* ---- invariants of any plan ------------------------------------------------- */

static int layer_reads_input(const dp_layer *l) {
  dp_layer_kind k = l->kind;
  return k == DP_LAYER_LINEAR || k == DP_LAYER_GELU || k == DP_LAYER_GELU_ERF ||
         k == DP_LAYER_SILU || k == DP_LAYER_LAYERNORM || k == DP_LAYER_CONV2D ||
         k == DP_LAYER_MAXPOOL2D || k == DP_LAYER_BATCHNORM || k == DP_LAYER_ATTENTION ||
         (k == DP_LAYER_LEAKY_RELU && l->slope < 0.0f); /* its sign is not y's */
}

/* A flatten before the last layer is a view: its output is its input's
 * buffer (the model's input when it has no layer before it: -1). */
static int is_view(const dp_model *m, int i) {
  return (m->layers[i].kind == DP_LAYER_FLATTEN && i < m->n_layers - 1) ||
         m->layers[i].kind == DP_LAYER_RESIDUAL || /* a residual's start: its input */
         m->layers[i].kind == DP_LAYER_SHORTCUT;   /* its block's input */
}
static int owner_of(const dp_model *m, int i) {
  while (i >= 0 && is_view(m, i))
    i = m->layers[i].kind == DP_LAYER_SHORTCUT ? m->layers[i].link : i - 1;
  return i;
}
/* Where the gradient of layer i's output lives: its owner's, but a shortcut
 * keeps g's input gradient apart (the begin adds it to x's after f's) */
static int grad_owner_of(const dp_model *m, int i) {
  while (i >= 0 && is_view(m, i) && m->layers[i].kind != DP_LAYER_SHORTCUT) i--;
  return i;
}
/* The shortcut of the block that starts at layer r, or -1. */
static int shortcut_of(const dp_model *m, int r) {
  for (int i = r + 1; i < m->layers[r].link; i++)
    if (m->layers[i].kind == DP_LAYER_SHORTCUT && m->layers[i].link == r) return i;
  return -1;
}
/* The gradient of layer o's output (o its grad_owner_of) holds all of a
 * device's rows where a sync batchnorm lies between the layer that writes it
 * (the first that is no view above it; past a shortcut, f's output's: the
 * block's end) and the last that reads it (o; a plain block's end's and a
 * shortcut's: the block's begin, which adds it to x's): the backward runs a
 * segment's micro-batches all through before the batchnorm's sums, so it
 * holds them all from one segment to the next. */
static int is_sync_bn(const dp_plan *p, int i);
static int dact_all_rows(const dp_plan *p, int o) {
  const dp_model *m = &p->model;
  int L = m->n_layers, w = o + 1, r = o;
  if (o < 0 || o >= L - 1) return 0;
  while (w < L - 1 && is_view(m, w) && m->layers[w].kind != DP_LAYER_SHORTCUT) w++;
  if (m->layers[w].kind == DP_LAYER_SHORTCUT) w = m->layers[m->layers[w].link].link;
  if ((m->layers[o].kind == DP_LAYER_RESIDUAL_END &&
       shortcut_of(m, m->layers[o].link) < 0) ||
      m->layers[o].kind == DP_LAYER_SHORTCUT)
    r = m->layers[o].link;
  for (int b = r; b < w; b++)
    if (is_sync_bn(p, b)) return 1;
  return 0;
}
static int layer_reads_output(const dp_layer *l) {
  dp_layer_kind k = l->kind;
  return k == DP_LAYER_RELU || k == DP_LAYER_TANH || k == DP_LAYER_SIGMOID ||
         (k == DP_LAYER_LEAKY_RELU && l->slope >= 0.0f);
}

/* Bytes of device d's row tensor of width w: one slice per micro-batch, each
 * but the last padded to the backend's slice alignment (256 B for cuda, whose
 * GEMMs choose kernels by alignment; packed for cpu), so a micro-batch's rows
 * start at the same alignment on any number of devices. */
static size_t slices_bytes(const dp_plan *p, int d, int w) {
  int mb0 = p->split.dev_mb0[d], mb1 = p->split.dev_mb0[d + 1];
  size_t sa = dp_plan_config(p)->backend == DP_BACKEND_CUDA ? 256 : 0, n = 0;
  for (int k = mb0; k < mb1; k++) {
    size_t b = (size_t)p->mbs[k].rows * (size_t)w * 4;
    size_t full = (size_t)p->split.mb_rows * (size_t)w * 4;
    n += k == mb1 - 1 ? b : sa ? align_up(full, sa) : full;
  }
  return n;
}

/* Where on device d the slice of the micro-batch that starts at row `row0`
 * begins, in a row tensor of width w; SIZE_MAX when no micro-batch of d starts
 * there. */
static size_t slice_offset(const dp_plan *p, int d, int row0, int w) {
  size_t sa = dp_plan_config(p)->backend == DP_BACKEND_CUDA ? 256 : 0;
  size_t full = (size_t)p->split.mb_rows * (size_t)w * 4,
         stride = sa ? align_up(full, sa) : full;
  for (int k = p->split.dev_mb0[d]; k < p->split.dev_mb0[d + 1]; k++)
    if (p->mbs[k].row0 == row0) return (size_t)(k - p->split.dev_mb0[d]) * stride;
  return SIZE_MAX;
}

/* Regions: sizes from the model and config, aligned, in enum order, tight,
 * not overlapping, total = end of the last region aligned up. */
static void check_regions(const dp_plan *p) {
  const dp_model *m = dp_plan_model(p);
  const dp_config *c = dp_plan_config(p);
  size_t A = c->backend == DP_BACKEND_CUDA ? 256 : 64, P = m->n_params * 4;
  size_t in = (size_t)m->input_width, out = (size_t)dp_model_output_width(m),
         B = (size_t)c->batch;
  int train = !c->inference, rows_total = 0;
  for (int d = 0; d < dp_plan_n_devices(p); d++) {
    size_t end = 0, rows = (size_t)dp_plan_device_rows(p, d);
    REQ_GE(dp_plan_device_rows(p, d), 1);
    rows_total += (int)rows;
    for (int r = 0; r < DP_REGION_COUNT; r++) {
      dp_region_info ri = dp_plan_region(p, d, (dp_region)r);
      REQ_EQ(ri.align, A);
      REQ(ri.offset % A == 0, "device %d %s at %zu", d, dp_region_name((dp_region)r),
          ri.offset);
      REQ(ri.offset >= end, "device %d %s overlaps the region before", d,
          dp_region_name((dp_region)r));
      REQ_EQ(ri.offset, align_up(end, A)); /* enum order, no slack */
      end = ri.offset + ri.size;
    }
    REQ_GE(dp_plan_device_bytes(p, d), end);
    REQ_EQ(dp_plan_device_bytes(p, d), align_up(end, A));
#define SZ(r) dp_plan_region(p, d, r).size
    REQ_EQ(SZ(DP_REGION_PARAMS),
           P + p->model.n_buffers * 4); /* batchnorm's buffers after */
    REQ_EQ(SZ(DP_REGION_INPUTS), slices_bytes(p, d, (int)in));
    REQ_EQ(SZ(DP_REGION_OUTPUTS), slices_bytes(p, d, (int)out));
    if (c->backend != DP_BACKEND_CUDA) REQ_EQ(SZ(DP_REGION_INPUTS), rows * in * 4);
    REQ_EQ(SZ(DP_REGION_GRADS), train ? P : 0);
    REQ_EQ(SZ(DP_REGION_OUTPUT_GRADS), train ? slices_bytes(p, d, (int)out) : 0);
    int k = c->optimizer == DP_OPT_ADAMW || c->optimizer == DP_OPT_ADAM
                ? (c->amsgrad ? 3 : 2)
            : c->optimizer == DP_OPT_MOMENTUM ? 1
                                              : 0;
    int out_dev = train && d == 0;
    REQ_EQ(SZ(DP_REGION_OPT_STATE), out_dev ? (size_t)k * P : 0);
    REQ_EQ(SZ(DP_REGION_TARGETS), out_dev ? B * (size_t)dp_model_target_width(m) * 4 : 0);
    REQ_EQ(SZ(DP_REGION_GATHERED_OUTPUTS), out_dev ? B * out * 4 : 0);
    REQ_EQ(SZ(DP_REGION_GATHERED_GRADS), out_dev ? B * out * 4 : 0);
    REQ_EQ(SZ(DP_REGION_LOSS), out_dev ? (size_t)p->split.n_mb * 4 : 0);
    if (!train) {
      REQ_EQ(SZ(DP_REGION_GRAD_PARTIALS), 0);
      REQ_EQ(SZ(DP_REGION_COMM), 0);
    }
#undef SZ
  }
  REQ_EQ(rows_total, c->batch);
}

/* ---- sync batchnorm, as these tests see it ---- */

/* Layer i normalises with the whole batch's statistics: config.batchnorm
 * sync, in a training plan (an inference plan normalises with the running
 * statistics). */
static int is_sync_bn(const dp_plan *p, int i) {
  return !p->cfg.inference && p->cfg.batchnorm == DP_BN_SYNC &&
         p->model.layers[i].kind == DP_LAYER_BATCHNORM;
}

static int dev_mbs(const dp_plan *p, int d) {
  return p->split.dev_mb0[d + 1] - p->split.dev_mb0[d];
}

/* The parts of a sync batchnorm's statistics area on a device, in floats
 * from its offset, computed here from the layout lib/core/backend.h describes:
 * the whole batch's mean, rstd and unbiased variance (c each) and rows (one
 * slot); the device's backward sums (sum dy x-hat, sum dy: 2 c) and another
 * device's, received; a forward partial (rows, mean, sum of squared
 * deviations: 1 + 2 c) received, then one per planned micro-batch of the
 * device (part SB_SLOT + j). */
enum { SB_FINAL, SB_SUMS, SB_SUMS_RECV, SB_PART_RECV, SB_SLOT };

static size_t sb_at(int c, int part) {
  size_t C = (size_t)c;
  if (part == SB_FINAL) return 0;
  if (part == SB_SUMS) return 3 * C + 1;
  if (part == SB_SUMS_RECV) return 5 * C + 1;
  return 7 * C + 1 + (size_t)(part - SB_PART_RECV) * (2 * C + 1);
}

static size_t sb_len(int c, int part) {
  size_t C = (size_t)c;
  return part == SB_FINAL ? 3 * C + 1 : part < SB_PART_RECV ? 2 * C : 2 * C + 1;
}

/* The whole area's floats on a device with n_mb planned micro-batches. */
static size_t sb_floats(int c, int n_mb) { return sb_at(c, SB_SLOT + n_mb); }

/* Which part of which sync batchnorm's statistics area the bytes [off,
 * +bytes) of device d's activations are, exactly: 1 with *layer and *part,
 * 0 when they are none. */
static int sync_part(const dp_plan *p, int d, size_t off, size_t bytes, int *layer,
                     int *part) {
  if (d < 0 || d >= dp_plan_n_devices(p)) return 0;
  for (int i = 0; i < p->model.n_layers; i++) {
    size_t at = p->act[d].stats[i];
    if (!is_sync_bn(p, i) || at == SIZE_MAX || off < at) continue;
    int c = p->model.layers[i].c;
    for (int q = 0; q < SB_SLOT + dev_mbs(p, d); q++)
      if (off == at + sb_at(c, q) * 4 && bytes == sb_len(c, q) * 4) {
        *layer = i;
        *part = q;
        return 1;
      }
  }
  return 0;
}

/* The fusions of a plan's backend, restated from plan.h (not its code): the
 * relu at i is computed by the layer before it, a linear (fuses_linear_relu)
 * or, in fp32 plans, a conv2d (fuses_conv_relu); and its backward by the
 * layer after it too, a linear or, in fp32, a maxpool2d (fuses_relu_maxpool). */
static int relu_fwd_fused(const dp_plan *p, int i) {
  const dp_model *m = &p->model;
  const dp_backend_ops *be = dp__backend_ops(p->cfg.backend);
  if (i < 1 || i >= m->n_layers || m->layers[i].kind != DP_LAYER_RELU) return 0;
  dp_layer_kind k = m->layers[i - 1].kind;
  int fp32 = p->cfg.precision == DP_PRECISION_FP32;
  return (k == DP_LAYER_LINEAR && be->fuses_linear_relu) ||
         (k == DP_LAYER_CONV2D && be->fuses_conv_relu && fp32);
}
static int relu_bwd_fused(const dp_plan *p, int i) {
  const dp_model *m = &p->model;
  if (!relu_fwd_fused(p, i) || i + 1 >= m->n_layers) return 0;
  dp_layer_kind k = m->layers[i + 1].kind;
  return k == DP_LAYER_LINEAR ||
         (k == DP_LAYER_MAXPOOL2D && dp__backend_ops(p->cfg.backend)->fuses_relu_maxpool &&
          p->cfg.precision == DP_PRECISION_FP32);
}

/* Activation layout: which buffers exist, their sizes, aligned, inside the
 * region; the sizes add up to what dp plan reports unshared. */
static void check_act_layout(const dp_plan *p, int d) {
  const dp_model *m = &p->model;
  const dp_act_layout *a = &p->act[d];
  dp_region_info ar = p->regions[d][DP_REGION_ACTIVATIONS];
  int L = m->n_layers, train = !p->cfg.inference, n_mb = dp_plan_device_micro_batches(p, d);
  REQ_EQ(a->rows, dp_plan_device_rows(p, d));
  int mb_rows = 0;
  for (int k = p->split.dev_mb0[d]; k < p->split.dev_mb0[d + 1]; k++)
    if (p->mbs[k].rows > mb_rows) mb_rows = p->mbs[k].rows;
  REQ_EQ(a->mb_rows, mb_rows);
  size_t unshared = 0;
  for (int i = 0; i < L; i++) {
    const dp_layer *l = &m->layers[i];
    if (is_view(m, i)) { /* no buffers of its own */
      int o = owner_of(m, i), g = grad_owner_of(m, i);
      REQ(a->act[i] == (o >= 0 ? a->act[o] : SIZE_MAX),
          "device %d act[%d] is not layer %d's", d, i, o);
      REQ(a->stats[i] == SIZE_MAX, "device %d stats[%d] of a view", d, i);
      if (g ==
          i) { /* a shortcut: g's input gradient, one micro-batch, unless x is the input */
        size_t size = dact_all_rows(p, i) ? slices_bytes(p, d, l->out)
                                          : (size_t)a->mb_rows * (size_t)l->out * 4;
        if (!train || o < 0) {
          REQ(a->dact[i] == SIZE_MAX, "device %d dact[%d] should not exist", d, i);
          continue;
        }
        REQ(a->dact[i] != SIZE_MAX && a->dact[i] % p->align == 0 &&
                a->dact[i] + size <= ar.size,
            "device %d: the shortcut's dact[%d] at %zu", d, i, a->dact[i]);
        unshared += align_up(size, p->align);
        continue;
      }
      REQ(a->dact[i] == (g >= 0 ? a->dact[g] : SIZE_MAX),
          "device %d dact[%d] is not layer %d's", d, i, g);
      continue;
    }
    int sync = is_sync_bn(p, i);
    /* a backend that fuses a relu after a linear or a conv2d: that layer
     * keeps no output; and with a layer after the relu that runs its backward,
     * the relu no output gradient */
    size_t C = (size_t)l->c, out = (size_t)l->out;
    /* config.recompute: a recomputed output (and statistics) holds one
     * micro-batch, twice: the forward's and the recompute's */
    int rc = p->rc[i], sw = l->kind == DP_LAYER_LAYERNORM   ? 2 * (l->t ? l->t : 1)
                            : l->kind == DP_LAYER_ATTENTION ? l->heads * l->t * l->t
                                                            : 0;
    size_t one = (size_t)a->mb_rows * 4;
    REQ(!rc || (train && p->cfg.recompute > 0 && i < L - 1), "layer %d recomputed", i);
    struct {
      size_t off;
      int present;
      size_t size;
      const char *what;
    } b[5] = {
        /* none for a linear whose relu the backend runs in its epilogue */
        {a->act[i], i < L - 1 && !relu_fwd_fused(p, i + 1),
         rc ? one * out : slices_bytes(p, d, (int)out), "act"},
        /* layernorm: mean and rstd per row; batchnorm (training): per
           replica, mean, rstd and the unbiased variance per channel, per
           micro-batch of the device; sync, the whole batch's statistics,
           the backward sums and the partials (sb_floats) */
        {a->stats[i],
         l->kind == DP_LAYER_LAYERNORM || l->kind == DP_LAYER_ATTENTION ||
             (l->kind == DP_LAYER_BATCHNORM && train),
         sw && rc ? one * (size_t)sw
         : sw     ? slices_bytes(p, d, sw)
         : sync   ? sb_floats(l->c, n_mb) * 4
                  : (size_t)n_mb * 3 * C * 4,
         "stats"},
        /* the gradient of the output: one micro-batch's, or all of the
           device's rows where the backward waits for a sync batchnorm's
           sums between its writer and its last reader */
        {a->dact[i], train && i < L - 1 && !relu_bwd_fused(p, i),
         dact_all_rows(p, i) ? slices_bytes(p, d, (int)out) : (size_t)a->mb_rows * out * 4,
         "dact"},
        {a->rc_act[i], rc == 1, one * out, "rc_act"},
        {a->rc_stats[i], rc == 1 && sw, one * (size_t)sw, "rc_stats"}};
    for (int j = 0; j < 5; j++) {
      if (!b[j].present) {
        REQ(b[j].off == SIZE_MAX, "device %d %s[%d] should not exist", d, b[j].what, i);
        continue;
      }
      REQ(b[j].off != SIZE_MAX, "device %d %s[%d] missing", d, b[j].what, i);
      REQ(b[j].off % p->align == 0, "device %d %s[%d] at %zu is not aligned", d, b[j].what,
          i, b[j].off);
      REQ(b[j].off + b[j].size <= ar.size,
          "device %d %s[%d] [%zu, %zu) outside the activations region (%zu)", d, b[j].what,
          i, b[j].off, b[j].off + b[j].size, ar.size);
      unshared += align_up(b[j].size, p->align);
    }
  }
  REQ(dp_plan_activation_bytes_unshared(p, d) == unshared,
      "device %d: %zu activation bytes unshared, the buffers' sizes add up to %zu", d,
      dp_plan_activation_bytes_unshared(p, d), unshared);
}

/* A schedule to check: the plan's own, or one rebuilt for fewer rows. */
typedef struct {
  const dp_op *ops;
  int n_ops;
  const dp_mb *mbs; /* (split.n_mb), truncated to rows */
  int rows;
  int train;
} sched_view;

static sched_view plan_view(const dp_plan *p) {
  return (sched_view){dp_plan_ops(p), dp_plan_n_ops(p), p->mbs, p->cfg.batch,
                      !p->cfg.inference};
}

/* One piece of an activation-region buffer (a micro-batch's rows or buffer,
 * or a part of a sync batchnorm's statistics), with its use interval in the
 * device's op order. */
typedef struct {
  size_t lo, hi;
  int first, last, seen, first_write;
} piece;

enum { K_ACT = 0, K_STATS = 1, K_DACT = 2, K_RC_ACT = 3, K_RC_STATS = 4, K_KINDS = 5 };

/* The walk over device d's ops: its pieces are (kind, layer, sub), sub a
 * micro-batch (its index among the device's) or, for a sync batchnorm's
 * statistics, a part (slot j: sub j; the other parts after the micro-batches). */
typedef struct {
  const dp_plan *p;
  const sched_view *v;
  const dp_act_layout *a;
  piece *pcs;
  int d, L, W, mb0, nmb;
  int t0, t1; /* the op's interval: its time, or for an op of another device
                 on this one's bytes, all of its stage's times here */
  int op;     /* its index */
} sim;

static void touch(sim *s, int kind, int layer, int sub, size_t lo, size_t hi, int write) {
  REQ(sub >= 0 && sub < s->W, "op %d: device %d kind %d layer %d piece %d", s->op, s->d,
      kind, layer, sub);
  piece *pc = &s->pcs[(kind * s->L + layer) * s->W + sub];
  if (!pc->seen) {
    *pc = (piece){
        .lo = lo, .hi = hi, .first = s->t0, .last = s->t1, .seen = 1, .first_write = write};
    return;
  }
  REQ(pc->lo == lo && pc->hi == hi,
      "op %d: device %d kind %d layer %d piece %d accessed at [%zu, %zu) and [%zu, %zu)",
      s->op, s->d, kind, layer, sub, pc->lo, pc->hi, lo, hi);
  if (s->t0 < pc->first) pc->first = s->t0;
  if (s->t1 > pc->last) pc->last = s->t1;
}

static size_t op_local(const sim *s, const dp_op *op) {
  return (size_t)(op->row0 - s->p->split.dev_row0[s->d]);
}

/* The op's micro-batch's rows of layer o's output (stats: its statistics;
 * width floats a row): all of the device's micro-batches, or for a recomputed
 * layer (config.recompute) one micro-batch, in the forward the forward's
 * buffer, in the backward the recompute's. */
static void sim_rows(sim *s, const dp_op *op, int o, int stats, size_t width, int write) {
  const dp_act_layout *a = s->a;
  size_t at = (stats ? a->stats[o] : a->act[o]) + op_local(s, op) * width * 4;
  int kind = stats ? K_STATS : K_ACT;
  if (s->p->rc[o] && op->phase == DP_PHASE_FORWARD) {
    at = stats ? a->stats[o] : a->act[o];
  } else if (s->p->rc[o] == 1) {
    at = stats ? a->rc_stats[o] : a->rc_act[o];
    kind = stats ? K_RC_STATS : K_RC_ACT;
  }
  touch(s, kind, o, op->micro_batch - s->mb0, at, at + (size_t)op->rows * width * 4, write);
}

static void sim_act(sim *s, const dp_op *op, int o, size_t width, int write) {
  sim_rows(s, op, o, 0, width, write);
}

/* The gradient of layer o's output for the op's micro-batch: a buffer of one
 * micro-batch, or its rows of all of the device's (dact_all_rows). */
static void sim_dact(sim *s, const dp_op *op, int o, size_t width, int write) {
  size_t at = s->a->dact[o] + (dact_all_rows(s->p, o) ? op_local(s, op) * width * 4 : 0);
  touch(s, K_DACT, o, op->micro_batch - s->mb0, at, at + (size_t)op->rows * width * 4,
        write);
}

/* Part q of sync batchnorm b's statistics area. */
static void sim_part(sim *s, int b, int q, int write) {
  int c = s->p->model.layers[b].c;
  size_t at = s->a->stats[b] + sb_at(c, q) * 4;
  touch(s, K_STATS, b, q >= SB_SLOT ? q - SB_SLOT : s->nmb + q, at, at + sb_len(c, q) * 4,
        write);
}

/* Slot j of a per-replica batchnorm's statistics: mean, rstd, variance. */
static void sim_bn_slot(sim *s, int b, int j, int write) {
  size_t len = 3 * (size_t)s->p->model.layers[b].c * 4,
         at = s->a->stats[b] + (size_t)j * len;
  touch(s, K_STATS, b, j, at, at + len, write);
}

/* The sync batchnorm part the op names in its (region, offset) on device dev,
 * which must be one, of layer `want` unless that is -1. */
static int op_part(const sim *s, int dev, int region, size_t off, size_t bytes,
                   const dp_op *op, int want, int *layer) {
  int b = -1, q = -1;
  REQ(region == DP_REGION_ACTIVATIONS && sync_part(s->p, dev, off, bytes, &b, &q) &&
          (want < 0 || b == want),
      "op %d (%s, layer %d): device %d %s [%zu, +%zu) is no sync batchnorm statistics "
      "part%s",
      s->op, dp_op_kind_name(op->kind), op->layer, dev, dp_region_name(region), off, bytes,
      want >= 0 ? " of its layer" : "");
  if (layer) *layer = b;
  return q;
}

/* What the op reads and writes of device d's activations, as the CPU backend
 * does (lib/cpu/backend.c). */
static void sim_op(sim *s, const dp_op *op) {
  const dp_plan *p = s->p;
  const dp_model *m = &p->model;
  int L = s->L, d = s->d, train = s->v->train, b, q;
  switch ((dp_op_kind)op->kind) {
  case DP_OP_FORWARD:
  case DP_OP_BACKWARD:
  case DP_OP_BN_STATS:
  case DP_OP_BN_BWD_STATS: {
    int i = op->layer, k = op->micro_batch;
    REQ(i >= 0 && i < L, "op %d: layer %d", s->op, i);
    REQ_GE(k, s->mb0);
    REQ_LT(k, s->mb0 + s->nmb);
    REQ_EQ(op->row0, s->v->mbs[k].row0);
    REQ_EQ(op->rows, s->v->mbs[k].rows);
    REQ_GT(op->rows, 0);
    const dp_layer *l = &m->layers[i];
    int o = owner_of(m, i - 1); /* where this layer's input lives (-1: INPUTS) */
    int bn = l->kind == DP_LAYER_BATCHNORM, sync = train && is_sync_bn(p, i);
    size_t in = (size_t)l->in, out = (size_t)l->out;
    if (op->kind == DP_OP_BN_STATS || op->kind == DP_OP_BN_BWD_STATS)
      REQ(sync, "op %d: %s of layer %d", s->op, dp_op_kind_name(op->kind), i);
    /* a residual's start is a view, but its backward adds its end's output
     * gradient into its input's: that gradient must still be live there (the
     * last layer's is OUTPUT_GRADS, no activation) */
    int sc = l->kind == DP_LAYER_RESIDUAL       ? shortcut_of(m, i)
             : l->kind == DP_LAYER_RESIDUAL_END ? shortcut_of(m, l->link)
                                                : -1;
    /* ... with a shortcut, g's input gradient instead (the shortcut's) */
    if (l->kind == DP_LAYER_RESIDUAL && op->kind == DP_OP_BACKWARD && o >= 0 &&
        l->link > 0 && (sc >= 0 || l->link < L - 1))
      sim_dact(s, op, sc >= 0 ? sc : l->link, out, 0);
    if (is_view(m, i)) break; /* a view runs nothing */
    /* a residual's end reads its block's input, written long before (with a
     * shortcut: f's output, the layer before it); its backward copies its
     * output gradient to f's output's then */
    int skip = l->kind != DP_LAYER_RESIDUAL_END ? -1
               : sc >= 0                        ? owner_of(m, sc - 1)
                                                : owner_of(m, l->link - 1);
    if (skip >= 0 && op->kind == DP_OP_FORWARD) sim_act(s, op, skip, out, 0);
    if (sc >= 0 && op->kind == DP_OP_BACKWARD && train)
      sim_dact(s, op, grad_owner_of(m, sc - 1), out, 1);
    /* the statistics a layer's forward saves for its backward, per row */
    size_t stats_w = l->kind == DP_LAYER_LAYERNORM   ? 2 * (size_t)(l->t ? l->t : 1)
                     : l->kind == DP_LAYER_ATTENTION ? (size_t)l->heads * l->t * l->t
                                                     : 0;
    /* A backend that fuses (the CPU backend) runs a relu right after a
     * linear (or a conv2d) in that layer's stores: it writes the relu's
     * output, the relu's forward runs nothing. */
    int fused_relu = relu_fwd_fused(p, i + 1);
    if (op->kind == DP_OP_FORWARD && relu_fwd_fused(p, i)) break;
    /* ... and with a linear (or a maxpool2d) after such a relu, that layer's
     * backward masks by its input (the relu's output) and writes the relu's
     * input gradient; the relu's backward runs nothing */
    int masks = i > 1 && relu_bwd_fused(p, i - 1);
    if (op->kind == DP_OP_BACKWARD && relu_bwd_fused(p, i)) break;
    if (op->kind == DP_OP_FORWARD) {
      if (o >= 0) sim_act(s, op, o, in, 0);
      if (fused_relu && i + 1 < L - 1)
        sim_act(s, op, i + 1, out, 1);
      else if (!fused_relu && i < L - 1)
        sim_act(s, op, i, out, 1);
      if (stats_w) /* layernorm: mean, rstd; attention: the probabilities */
        sim_rows(s, op, i, 1, stats_w, 1);
      if (bn && train) { /* eval: the running statistics, in PARAMS */
        if (sync)        /* the whole batch's, device 0's sent here */
          sim_part(s, i, SB_FINAL, 0);
        else /* its own */
          sim_bn_slot(s, i, k - s->mb0, 1);
      }
    } else if (op->kind == DP_OP_BACKWARD) {
      if (i < L - 1) sim_dact(s, op, i, out, 0);
      if (o >= 0 && layer_reads_input(l)) sim_act(s, op, o, in, 0);
      if (i < L - 1 && layer_reads_output(l)) sim_act(s, op, i, out, 0);
      if (stats_w) sim_rows(s, op, i, 1, stats_w, 0);
      if (bn && !sync) sim_bn_slot(s, i, k - s->mb0, 0);
      if (sync && o >= 0) { /* dx from the whole batch's statistics and sums */
        sim_part(s, i, SB_FINAL, 0);
        sim_part(s, i, SB_SUMS, 0);
      }
      if (masks)
        sim_dact(s, op, grad_owner_of(m, i - 2), in, 1);
      else if (o >= 0) /* after a shortcut: its own */
        sim_dact(s, op, grad_owner_of(m, i - 1), in, 1);
    } else if (op->kind == DP_OP_BN_STATS) { /* its partial from its input rows */
      if (o >= 0) sim_act(s, op, o, in, 0);
      q = op_part(s, d, op->dst_region, op->dst_offset, op->bytes, op, i, NULL);
      REQ(q == SB_SLOT + k - s->mb0, "op %d: bn_stats of micro-batch %d into part %d",
          s->op, k, q);
      sim_part(s, i, q, 1);
    } else { /* BN_BWD_STATS: sums of dy x-hat and dy, into its gradient slot */
      if (o >= 0) sim_act(s, op, o, in, 0);
      if (i < L - 1) sim_dact(s, op, i, out, 0);
      sim_part(s, i, SB_FINAL, 0);
    }
    break;
  }
  case DP_OP_BN_MERGE: /* dst's partial merged with src's, on this device */
    q = op_part(s, d, op->src_region, op->src_offset, op->bytes, op, op->layer, NULL);
    REQ(q >= SB_PART_RECV, "op %d: merges part %d", s->op, q);
    sim_part(s, op->layer, q, 0);
    q = op_part(s, d, op->dst_region, op->dst_offset, op->bytes, op, op->layer, NULL);
    REQ(q >= SB_PART_RECV, "op %d: merges into part %d", s->op, q);
    sim_part(s, op->layer, q, 0);
    break;
  case DP_OP_BN_FINAL: /* the whole batch's statistics from the tree's root */
    q = op_part(s, d, op->src_region, op->src_offset,
                sb_len(m->layers[op->layer].c, SB_SLOT) * 4, op, op->layer, NULL);
    REQ_EQ(q, SB_SLOT);
    sim_part(s, op->layer, q, 0);
    q = op_part(s, d, op->dst_region, op->dst_offset, op->bytes, op, op->layer, NULL);
    REQ_EQ(q, SB_FINAL);
    sim_part(s, op->layer, q, 1);
    break;
  case DP_OP_COPY: /* only statistics parts cross between activations */
    if (op->src_dev == d && op->src_region == DP_REGION_ACTIVATIONS) {
      q = op_part(s, d, op->src_region, op->src_offset, op->bytes, op, -1, &b);
      sim_part(s, b, q, 0);
    }
    if (op->dst_dev == d && op->dst_region == DP_REGION_ACTIVATIONS) {
      q = op_part(s, d, op->dst_region, op->dst_offset, op->bytes, op, -1, &b);
      sim_part(s, b, q, 1);
    }
    break;
  case DP_OP_GRAD_ADD: /* the backward sums' tree adds in the statistics area */
    if (op->src_region == DP_REGION_ACTIVATIONS) {
      q = op_part(s, d, op->src_region, op->src_offset, op->bytes, op, -1, &b);
      sim_part(s, b, q, 0);
    }
    if (op->dst_region == DP_REGION_ACTIVATIONS) {
      q = op_part(s, d, op->dst_region, op->dst_offset, op->bytes, op, -1, &b);
      sim_part(s, b, q, 0);
    }
    break;
  case DP_OP_BN_UPDATE: /* device 0's running statistics from micro-batch 0's (sync:
                           the whole batch's) */
    REQ(op->layer >= 0 && op->layer < L, "op %d: layer %d", s->op, op->layer);
    if (is_sync_bn(p, op->layer))
      sim_part(s, op->layer, SB_FINAL, 0);
    else
      sim_bn_slot(s, op->layer, 0, 0);
    break;
  default: break;
  }
}

/* The op runs on device d or moves bytes of its activations. */
static int op_reaches(const dp_op *op, int d) {
  return op->device == d ||
         (op->kind == DP_OP_COPY &&
          ((op->src_dev == d && op->src_region == DP_REGION_ACTIVATIONS) ||
           (op->dst_dev == d && op->dst_region == DP_REGION_ACTIVATIONS)));
}

/* Walks device d's ops in order, recording which activation-region bytes each
 * op reads and writes (as the CPU backend does), and checks that no two
 * pieces in use at the same time share a byte, and that every piece is
 * written before it is read. A copy that another device runs on this
 * device's bytes may run at any time of its stage here. Independent of
 * plan.c's lifetime rules. */
static void check_liveness_by_simulation(const dp_plan *p, const sched_view *v, int d) {
  sim s = {.p = p,
           .v = v,
           .a = &p->act[d],
           .d = d,
           .L = p->model.n_layers,
           .mb0 = p->split.dev_mb0[d],
           .nmb = dev_mbs(p, d)};
  s.W = s.nmb + SB_SLOT;
  int n = K_KINDS * s.L * s.W, n_st = 1;
  s.pcs = calloc((size_t)n, sizeof *s.pcs);
  ck_assert_ptr_nonnull(s.pcs);
  for (int oi = 0; oi < v->n_ops; oi++) {
    REQ_GE(v->ops[oi].stage, 0);
    if (v->ops[oi].stage >= n_st) n_st = v->ops[oi].stage + 1;
  }
  int *st_lo = malloc((size_t)n_st * sizeof *st_lo),
      *st_hi = malloc((size_t)n_st * sizeof *st_hi);
  for (int x = 0; x < n_st; x++) st_lo[x] = INT_MAX, st_hi[x] = 0;
  for (int oi = 0, t = 0; oi < v->n_ops; oi++) {
    const dp_op *op = &v->ops[oi];
    if (!op_reaches(op, d)) continue;
    t++;
    if (t < st_lo[op->stage]) st_lo[op->stage] = t;
    if (t > st_hi[op->stage]) st_hi[op->stage] = t;
  }
  for (int oi = 0, t = 0; oi < v->n_ops; oi++) {
    const dp_op *op = &v->ops[oi];
    if (!op_reaches(op, d)) continue;
    t++;
    s.op = oi;
    s.t0 = op->device == d ? t : st_lo[op->stage];
    s.t1 = op->device == d ? t : st_hi[op->stage];
    sim_op(&s, op);
  }
  size_t region = p->regions[d][DP_REGION_ACTIVATIONS].size;
  int *seen = malloc((size_t)n * sizeof *seen), n_seen = 0;
  for (int x = 0; x < n; x++)
    if (s.pcs[x].seen) {
      REQ(s.pcs[x].first_write, "device %d: piece %d is read before it is written", d, x);
      REQ(s.pcs[x].hi <= region, "device %d: piece %d [%zu, %zu) beyond the region (%zu)",
          d, x, s.pcs[x].lo, s.pcs[x].hi, region);
      if (s.pcs[x].lo < s.pcs[x].hi) seen[n_seen++] = x;
    }
  for (int ix = 0; ix < n_seen; ix++)
    for (int iy = ix + 1; iy < n_seen; iy++) {
      int x = seen[ix], y = seen[iy];
      const piece *a = &s.pcs[x], *b = &s.pcs[y];
      int together = a->first <= b->last && b->first <= a->last;
      int overlap = a->lo < b->hi && b->lo < a->hi;
      REQ(!(together && overlap),
          "device %d: pieces (kind %d layer %d sub %d, t %d..%d, [%zu,%zu)) and (kind %d "
          "layer %d sub %d, t %d..%d, [%zu,%zu)) are live together and overlap",
          d, x / s.W / s.L, x / s.W % s.L, x % s.W, a->first, a->last, a->lo, a->hi,
          y / s.W / s.L, y / s.W % s.L, y % s.W, b->first, b->last, b->lo, b->hi);
    }
  free(seen);
  free(st_lo);
  free(st_hi);
  free(s.pcs);
}

/* The bytes an op names lie inside the regions it names. */
static size_t host_bytes_of(const dp_plan *p, int region) {
  const dp_model *m = &p->model;
  size_t B = (size_t)p->cfg.batch, out = (size_t)dp_model_output_width(m);
  if (region == DP_REGION_INPUTS) return B * (size_t)m->input_width * 4;
  if (region == DP_REGION_TARGETS) return B * (size_t)dp_model_target_width(m) * 4;
  return B * out * 4;
}

static void check_op_bounds(const dp_plan *p, const sched_view *v) {
  size_t P = p->model.n_params * 4;
  const dp_op *ops = v->ops;
  for (int i = 0; i < v->n_ops; i++) {
    const dp_op *op = &ops[i];
    REQ_GE(op->device, 0);
    REQ_LT(op->device, dp_plan_n_devices(p));
    const dp_region_info *rg = p->regions[op->device];
    if (op->kind == DP_OP_COPY) {
      size_t scap = op->src_dev == DP_HOST ? host_bytes_of(p, op->src_region)
                                           : p->regions[op->src_dev][op->src_region].size;
      size_t dcap = op->dst_dev == DP_HOST ? host_bytes_of(p, op->dst_region)
                                           : p->regions[op->dst_dev][op->dst_region].size;
      REQ(op->src_offset + op->bytes <= scap, "op %d (%s): source [%zu, +%zu) beyond %zu",
          i, dp_phase_name(op->phase), op->src_offset, op->bytes, scap);
      REQ(op->dst_offset + op->bytes <= dcap, "op %d (%s): dest [%zu, +%zu) beyond %zu", i,
          dp_phase_name(op->phase), op->dst_offset, op->bytes, dcap);
    } else if (op->kind == DP_OP_GRAD_PACK || op->kind == DP_OP_GRAD_UNPACK) {
      /* reduce_precision bf16: gradients <-> their bf16 values in comm */
      bool pack = op->kind == DP_OP_GRAD_PACK;
      REQ_EQ(pack ? op->src_region : op->dst_region, DP_REGION_GRADS);
      REQ_EQ(pack ? op->dst_region : op->src_region, DP_REGION_COMM);
      REQ_LE((pack ? op->src_offset : op->dst_offset) + op->bytes, P);
      REQ_LE((pack ? op->dst_offset : op->src_offset) + op->bytes / 2,
             rg[DP_REGION_COMM].size);
    } else if (op->kind == DP_OP_BACKWARD || op->kind == DP_OP_BN_BWD_STATS) {
      /* a whole gradient slot, its layer's part written */
      REQ1(op->dst_region == DP_REGION_GRADS || op->dst_region == DP_REGION_GRAD_PARTIALS);
      REQ(op->dst_offset + P <= rg[op->dst_region].size, "op %d: %s grads slot beyond %s",
          i, dp_op_kind_name(op->kind), dp_region_name(op->dst_region));
    } else if (op->kind == DP_OP_GRAD_ADD || op->kind == DP_OP_BN_MERGE ||
               op->kind == DP_OP_BN_FINAL || op->kind == DP_OP_BN_STATS) {
      /* bytes [offset, +bytes) of the op's device's regions: gradients (a
       * segment's range of a slot, or all of it) or a sync batchnorm's
       * statistics */
      REQ_LT(op->dst_region, DP_REGION_COUNT);
      REQ(op->dst_offset + op->bytes <= rg[op->dst_region].size,
          "op %d (%s): dest [%zu, +%zu) beyond %s (%zu)", i, dp_op_kind_name(op->kind),
          op->dst_offset, op->bytes, dp_region_name(op->dst_region),
          rg[op->dst_region].size);
      if (op->kind == DP_OP_BN_FINAL)
        REQ(op->layer >= 0 && op->layer < p->model.n_layers, "op %d: bn_final of layer %d",
            i, op->layer);
      if (op->kind != DP_OP_BN_STATS) { /* which reads its layer's input rows */
        /* bn_final's bytes are its result's; it reads the root's partial */
        size_t sb = op->kind == DP_OP_BN_FINAL
                        ? sb_len(p->model.layers[op->layer].c, SB_SLOT) * 4
                    : (op->flags & DP_OPF_SRC_BF16) ? op->bytes / 2 /* packed gradients */
                                                    : op->bytes;
        REQ_LT(op->src_region, DP_REGION_COUNT);
        REQ(op->src_offset + sb <= rg[op->src_region].size,
            "op %d (%s): source [%zu, +%zu) beyond %s (%zu)", i, dp_op_kind_name(op->kind),
            op->src_offset, sb, dp_region_name(op->src_region), rg[op->src_region].size);
      }
      if (op->kind == DP_OP_GRAD_ADD && op->dst_region != DP_REGION_ACTIVATIONS) {
        REQ_LE(op->bytes, P);
        size_t S = op->dst_region == DP_REGION_GRAD_PARTIALS ? dp__partial_stride(p) : P;
        REQ_LE(op->dst_offset % (S ? S : 1) + op->bytes, P); /* inside one slot */
      }
    }
  }
}

/* Regions sized exactly to what the schedule uses: the partial-grad slots
 * and the comm buffer a device never touches would be bytes planned for
 * nothing. */
static void check_grad_memory_is_exact(const dp_plan *p) {
  size_t P = p->model.n_params * 4;
  if (p->cfg.inference || P == 0) return;
  size_t partials[DP_MAX_DEVICES] = {0}, comm[DP_MAX_DEVICES] = {0};
  const dp_op *ops = dp_plan_ops(p);
  for (int i = 0; i < dp_plan_n_ops(p); i++) {
    const dp_op *op = &ops[i];
    if (op->kind == DP_OP_GRAD_PACK) { /* reduce_precision bf16: the send area last */
      size_t end = op->dst_offset + op->bytes / 2;
      if (end > comm[op->device]) comm[op->device] = end;
      continue;
    }
    if (op->kind == DP_OP_BACKWARD || op->kind == DP_OP_BN_BWD_STATS ||
        op->kind == DP_OP_GRAD_ADD || op->kind == DP_OP_COPY) {
      /* the whole slot a segment's gradients are in */
      size_t S = op->dst_region == DP_REGION_GRAD_PARTIALS ? dp__partial_stride(p) : P;
      size_t end = S ? (op->dst_offset / S + 1) * S : 0;
      if (op->dst_dev >= 0 && op->dst_region == DP_REGION_GRAD_PARTIALS &&
          end > partials[op->dst_dev])
        partials[op->dst_dev] = end;
      if (op->dst_dev >= 0 && op->dst_region == DP_REGION_COMM &&
          op->bytes > comm[op->dst_dev])
        comm[op->dst_dev] = op->bytes; /* P, or P / 2 of bf16 */
    }
  }
  for (int d = 0; d < dp_plan_n_devices(p); d++) {
    REQ(p->regions[d][DP_REGION_GRAD_PARTIALS].size == partials[d],
        "device %d (%d micro-batches): grad_partials %zu bytes, the schedule uses %zu", d,
        dp_plan_device_micro_batches(p, d), p->regions[d][DP_REGION_GRAD_PARTIALS].size,
        partials[d]);
    REQ(p->regions[d][DP_REGION_COMM].size == comm[d],
        "device %d: comm %zu bytes, the schedule uses %zu", d,
        p->regions[d][DP_REGION_COMM].size, comm[d]);
  }
}

/* A contiguous range of global micro-batches (or devices) whose sum a slot
 * holds. */
typedef struct {
  int lo, hi; /* hi == lo: empty */
} mbrange;

/* Merges src into dst; the canonical tree only ever adds a range to the
 * range that ends where it starts. */
static void merge(mbrange *dst, const mbrange *src, int i) {
  REQ(dst->hi > dst->lo && src->hi > src->lo, "op %d adds an empty slot", i);
  REQ(dst->hi == src->lo, "op %d adds micro-batches [%d,%d) to [%d,%d): not the tree", i,
      src->lo, src->hi, dst->lo, dst->hi);
  dst->hi = src->hi;
}

static int covers(const mbrange *r, int lo, int hi) { return r->lo == lo && r->hi == hi; }

/* The additions a training step performs, as (lo, mid, hi): the sum over
 * micro-batches [lo, mid) gets the sum over [mid, hi) added. */
typedef struct {
  int lo, mid, hi;
} merge3;

static int cmp_merge3(const void *a, const void *b) {
  const merge3 *x = a, *y = b;
  if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
  return x->hi < y->hi ? -1 : x->hi > y->hi;
}

/* The backward's segments (sync batchnorm), from the model, on their own:
 * segment s runs layers top[s] .. bot[s] + 1 of a micro-batch, then when
 * bot[s] >= 0 that batchnorm's sums (BN_BWD_STATS, which writes its weight's
 * and bias's gradients); its gradients are the bytes [p0[s], p1[s]). The
 * layers below wait for the whole batch's sums: segment s + 1 starts with
 * bot[s]'s backward (dx only). Without sync batchnorm: one segment, all
 * layers, all bytes. */
typedef struct {
  int n;
  int top[DP_MAX_LAYERS + 1], bot[DP_MAX_LAYERS + 1];
  size_t p0[DP_MAX_LAYERS + 1], p1[DP_MAX_LAYERS + 1];
  int of_layer[DP_MAX_LAYERS]; /* the segment whose backward ops run layer i */
} segments;

static void segments_of(const dp_plan *p, segments *sg) {
  const dp_model *m = &p->model;
  int L = m->n_layers, top = L - 1;
  size_t p1 = m->n_params * 4;
  sg->n = 0;
  for (int i = L - 1;; i--) {
    if (i >= 0 && !is_sync_bn(p, i)) continue;
    int s = sg->n++;
    sg->top[s] = top;
    sg->bot[s] = i;
    sg->p0[s] = i >= 0 ? m->layers[i].param_off * 4 : 0;
    sg->p1[s] = p1;
    for (int j = i + 1; j <= top; j++) sg->of_layer[j] = s;
    if (i < 0) break;
    top = i;
    p1 = sg->p0[s];
  }
}

/* The segment whose leaves end with batchnorm b's sums. */
static int segment_ending_at(const segments *sg, int b) {
  for (int s = 0; s < sg->n; s++)
    if (sg->bot[s] == b) return s;
  return -1;
}

/* What a slot (a gradient slot's segment, or a part of a sync batchnorm's
 * statistics) holds: the micro-batches (or devices) summed; for a leaf of
 * the backward, the layer it runs next; and who wrote it last. A slot
 * written by one device is read by another only in a later stage. */
typedef struct {
  mbrange r;
  int next;
  int wdev, wstage;
} held;

static void written(held *h, const dp_op *op) {
  h->wdev = op->device;
  h->wstage = op->stage;
}

static void read_after_write(const held *h, const dp_op *op, int i) {
  REQ(h->wdev == op->device || h->wstage < op->stage,
      "op %d (%s, device %d, stage %d) reads what device %d wrote in stage %d", i,
      dp_op_kind_name(op->kind), op->device, op->stage, h->wdev, h->wstage);
}

/* A leaf of segment s has run all its layers (and its batchnorm's sums). */
static int leaf_done(const held *h, const segments *sg, int s) {
  return h->next == (sg->bot[s] >= 0 ? sg->bot[s] - 1 : -1);
}

/* A sync batchnorm's parts on a device. */
typedef struct {
  held *part; /* [0]: the partial received, [1 + j]: micro-batch slot j */
  held fin, sums, sums_recv;
} bnstate;

/* What check_schedule tracks. */
typedef struct {
  const dp_plan *p;
  const sched_view *v;
  segments sg;
  int L, nmb, n_act, dlast[DP_MAX_DEVICES];
  held *slots[DP_MAX_DEVICES]; /* [slot * sg.n + segment]; slot 0 GRADS, 1 COMM,
                                  2 + k partial k */
  int n_slots[DP_MAX_DEVICES];
  bnstate *bn; /* [device * L + layer] */
  /* the additions of each tree: the gradients' of segment s (tree s), the
   * statistics' of sync batchnorm b (tree sg.n + b) */
  merge3 *adds;
  int *n_adds, cap;
} sched_state;

/* A gradient offset within its slot: slots are n_params * 4 bytes (GRADS, COMM) or
 * dp__partial_stride apart (GRAD_PARTIALS, each slot aligned). */
static size_t in_slot(const dp_plan *p, int region, size_t off) {
  size_t S =
      region == DP_REGION_GRAD_PARTIALS ? dp__partial_stride(p) : p->model.n_params * 4;
  return S ? off % S : 0;
}

static held *grad_slot(sched_state *st, int dev, int region, size_t off, int seg, int i) {
  int k = region == DP_REGION_GRADS ? 0 : region == DP_REGION_COMM ? 1 : -1;
  if (k < 0) {
    REQ(region == DP_REGION_GRAD_PARTIALS, "op %d: gradients in %s", i,
        dp_region_name(region));
    k = 2 + (int)(off / dp__partial_stride(st->p));
  }
  REQ(k < st->n_slots[dev], "op %d: device %d slot %d beyond its %d", i, dev, k,
      st->n_slots[dev]);
  return &st->slots[dev][k * st->sg.n + seg];
}

static held *bn_part(sched_state *st, int dev, int b, int q) {
  bnstate *bs = &st->bn[dev * st->L + b];
  if (q == SB_FINAL) return &bs->fin;
  if (q == SB_SUMS) return &bs->sums;
  if (q == SB_SUMS_RECV) return &bs->sums_recv;
  return &bs->part[q - SB_PART_RECV];
}

/* The sync batchnorm part of device dev that the op names, of layer `want`
 * unless that is -1. */
static int sched_part(sched_state *st, int dev, int region, size_t off, size_t bytes,
                      const dp_op *op, int i, int want, int *layer) {
  int b = -1, q = -1;
  REQ(region == DP_REGION_ACTIVATIONS && sync_part(st->p, dev, off, bytes, &b, &q) &&
          (want < 0 || b == want),
      "op %d (%s %s, layer %d): device %d %s [%zu, +%zu) is no sync batchnorm statistics "
      "part%s",
      i, dp_phase_name(op->phase), dp_op_kind_name(op->kind), op->layer, dev,
      dp_region_name(region), off, bytes, want >= 0 ? " of its layer" : "");
  if (layer) *layer = b;
  return q;
}

/* dst += src in tree t, recorded. */
static void tree_add(sched_state *st, int t, held *dst, const held *src, const dp_op *op,
                     int i) {
  read_after_write(dst, op, i);
  read_after_write(src, op, i);
  merge3 a = {dst->r.lo, dst->r.hi, src->r.hi};
  merge(&dst->r, &src->r, i);
  REQ(st->n_adds[t] < st->cap, "op %d: more than %d additions in tree %d", i, st->cap, t);
  st->adds[t * st->cap + st->n_adds[t]++] = a;
  written(dst, op);
}

/* A copy whose ends are activations: a part of a sync batchnorm's statistics
 * (the forward's partials up the tree and the whole batch's statistics down;
 * the backward's sums the same way), or a device's sums from its gradients. */
static void check_bn_copy(sched_state *st, const dp_op *op, int i) {
  const dp_plan *p = st->p;
  int b, sb;
  REQ(st->v->train, "op %d: statistics copied in a forward", i);
  int q =
      sched_part(st, op->dst_dev, op->dst_region, op->dst_offset, op->bytes, op, i, -1, &b);
  held *dst = bn_part(st, op->dst_dev, b, q);
  if (op->src_region == DP_REGION_GRADS) {
    /* the device's sums of dy x-hat and dy: its gradient of b's weight and bias,
     * summed over all of its micro-batches */
    int d = op->device, s = segment_ending_at(&st->sg, b);
    REQ_EQ(op->phase, DP_PHASE_BACKWARD);
    REQ(op->src_dev == d && op->dst_dev == d, "op %d: sums of device %d copied by %d", i,
        op->src_dev, d);
    REQ_EQ(q, SB_SUMS);
    REQ_EQ(op->src_offset, p->model.layers[b].param_off * 4);
    REQ_GE(s, 0);
    held *g = grad_slot(st, d, DP_REGION_GRADS, 0, s, i);
    read_after_write(g, op, i);
    REQ(leaf_done(g, &st->sg, s) && covers(&g->r, p->split.dev_mb0[d], st->dlast[d]),
        "op %d: device %d's sums of layer %d from the gradients of micro-batches [%d,%d), "
        "want [%d,%d)",
        i, d, b, g->r.lo, g->r.hi, p->split.dev_mb0[d], st->dlast[d]);
    REQ(dst->r.hi == dst->r.lo, "op %d: device %d's sums of layer %d copied twice", i, d,
        b);
    dst->r = (mbrange){d, d + 1};
  } else {
    int sq = sched_part(st, op->src_dev, op->src_region, op->src_offset, op->bytes, op, i,
                        b, &sb);
    held *src = bn_part(st, op->src_dev, b, sq);
    REQ_NE(op->src_dev, op->dst_dev);
    read_after_write(src, op, i);
    REQ(src->r.hi > src->r.lo, "op %d: copies an empty part %d of layer %d", i, sq, b);
    int up = sq == SB_SLOT && q == SB_PART_RECV, fin = sq == SB_FINAL && q == SB_FINAL,
        sums_up = sq == SB_SUMS && q == SB_SUMS_RECV,
        sums_down = sq == SB_SUMS && q == SB_SUMS;
    REQ(up || fin || sums_up || sums_down,
        "op %d: copies part %d of layer %d's statistics to part %d", i, sq, b, q);
    REQ_EQ(op->phase, up || fin ? DP_PHASE_FORWARD : DP_PHASE_BACKWARD);
    if (fin || sums_down) { /* device 0's result for the whole batch, to every device */
      REQ_EQ(op->src_dev, 0);
      REQ(covers(&src->r, 0, fin ? st->nmb : st->n_act),
          "op %d: sends layer %d's %s of [%d,%d)", i, b, fin ? "statistics" : "sums",
          src->r.lo, src->r.hi);
    }
    dst->r = src->r;
    if (up || sums_up) src->r = (mbrange){0, 0}; /* handed over */
  }
  written(dst, op);
}

/* Phases in order, stages non-decreasing, every row scattered and gathered
 * once, every layer run once per micro-batch, and the gradients of every
 * micro-batch summed into device 0 exactly once along the canonical tree:
 * with sync batchnorm, for each segment of the backward its own, and the
 * statistics of each sync batchnorm (the forward's over the micro-batches,
 * the backward's sums over the devices) too, all the same tree. */
static void check_schedule(const dp_plan *p, const sched_view *v) {
  const dp_model *m = &p->model;
  int train = v->train, N = dp_plan_n_devices(p), L = m->n_layers, nmb = 0;
  while (nmb < p->split.n_mb && v->mbs[nmb].rows > 0) nmb++; /* non-empty micro-batches */
  sched_state *st = calloc(1, sizeof *st);
  ck_assert_ptr_nonnull(st);
  st->p = p;
  st->v = v;
  st->L = L;
  st->nmb = nmb;
  segments_of(p, &st->sg);
  int S = st->sg.n, drows[DP_MAX_DEVICES] = {0};
  for (int d = 0; d < N; d++) {
    st->dlast[d] = p->split.dev_mb0[d];
    for (int k = p->split.dev_mb0[d]; k < p->split.dev_mb0[d + 1]; k++)
      if (v->mbs[k].rows > 0) {
        drows[d] += v->mbs[k].rows;
        st->dlast[d] = k + 1;
      }
    if (drows[d]) st->n_act = d + 1;
  }
  size_t P = m->n_params * 4;
  const dp_op *ops = v->ops;
  int n_mb = p->split.n_mb;
  int *fwd = calloc((size_t)(n_mb * L), sizeof *fwd);
  int *rcmp = calloc((size_t)(n_mb * L), sizeof *rcmp); /* config.recompute */
  int *bwd = calloc((size_t)(n_mb * L), sizeof *bwd);
  int *bn_stats = calloc((size_t)(n_mb * L), sizeof *bn_stats);
  int *bn_bwd = calloc((size_t)(n_mb * L), sizeof *bn_bwd);
  int *bn_final = calloc((size_t)L, sizeof *bn_final);
  int scattered = 0, gathered = 0, n_loss = 0, n_opt = 0;
  for (int d = 0; d < N; d++) {
    size_t ps = p->regions[d][DP_REGION_GRAD_PARTIALS].size;
    st->n_slots[d] = 2 + (P ? (int)(ps / P) : 0);
    st->slots[d] = calloc((size_t)(st->n_slots[d] * S), sizeof(held));
  }
  st->bn = calloc((size_t)(N * L), sizeof *st->bn);
  for (int d = 0; d < N; d++)
    for (int b = 0; b < L; b++)
      if (is_sync_bn(p, b))
        st->bn[d * L + b].part = calloc((size_t)dev_mbs(p, d) + 1, sizeof(held));
  st->cap = 2 * n_mb + 2 * N;
  st->adds = calloc((size_t)((S + L) * st->cap), sizeof *st->adds);
  st->n_adds = calloc((size_t)(S + L), sizeof *st->n_adds);
  for (int i = 0; i < v->n_ops; i++) {
    const dp_op *op = &ops[i];
    if (i > 0) {
      REQ(op->phase >= ops[i - 1].phase, "op %d: phase %s after %s", i,
          dp_phase_name(op->phase), dp_phase_name(ops[i - 1].phase));
      REQ(op->stage >= ops[i - 1].stage, "op %d: stage decreases", i);
      if (op->phase != ops[i - 1].phase) REQ_GT(op->stage, ops[i - 1].stage);
    }
    if (!train)
      REQ(op->phase <= DP_PHASE_GATHER, "inference op %d in phase %s", i,
          dp_phase_name(op->phase));
    int d = op->device, k = op->micro_batch, b = op->layer, q, sq;
    { /* config.reduce_precision bf16: every sum of the tree and every leaf rounds */
      bool rb = p->cfg.reduce_precision == DP_PRECISION_BF16;
      bool sum = op->kind == DP_OP_GRAD_ADD || op->kind == DP_OP_COPY_ADD ||
                 op->kind == DP_OP_GRAD_ACCUM || op->kind == DP_OP_BN_BWD_STATS ||
                 (op->kind == DP_OP_BACKWARD && op->phase == DP_PHASE_BACKWARD);
      REQ(!!(op->flags & DP_OPF_ROUND_BF16) == (rb && sum), "op %d (%s): flags %#x", i,
          dp_op_kind_name(op->kind), op->flags);
      REQ(!!(op->flags & DP_OPF_SRC_BF16) ==
              (op->kind == DP_OP_GRAD_ADD && op->src_region == DP_REGION_COMM && rb),
          "op %d (%s): flags %#x", i, dp_op_kind_name(op->kind), op->flags);
    }
    int mb_op = op->kind == DP_OP_FORWARD || op->kind == DP_OP_BACKWARD ||
                op->kind == DP_OP_BN_STATS || op->kind == DP_OP_BN_BWD_STATS;
    if (mb_op) { /* a layer's op on one of the device's micro-batches */
      REQ(b >= 0 && b < L, "op %d: layer %d", i, b);
      REQ_GE(k, p->split.dev_mb0[d]);
      REQ_LT(k, p->split.dev_mb0[d + 1]);
      REQ_EQ(op->row0, v->mbs[k].row0);
      REQ_EQ(op->rows, v->mbs[k].rows);
    }
    if (op->kind >= DP_OP_BN_STATS && op->kind <= DP_OP_BN_BWD_STATS) {
      /* sync batchnorm's ops: its layers' only, in a training step */
      REQ(train && b >= 0 && b < L && is_sync_bn(p, b), "op %d: %s of layer %d", i,
          dp_op_kind_name(op->kind), b);
      REQ_EQ(op->phase,
             op->kind == DP_OP_BN_BWD_STATS ? DP_PHASE_BACKWARD : DP_PHASE_FORWARD);
    }
    switch ((dp_op_kind)op->kind) {
    case DP_OP_COPY:
      if (op->phase == DP_PHASE_SCATTER && op->src_region == DP_REGION_INPUTS) {
        /* a run of the device's micro-batches whose slices lie back to back */
        int dd = op->dst_dev;
        REQ_EQ(op->src_dev, DP_HOST);
        REQ_GE(op->row0, p->split.dev_row0[dd]);
        REQ_LE(op->row0 + op->rows, p->split.dev_row0[dd] + drows[dd]);
        REQ_EQ(op->bytes, (size_t)op->rows * m->input_width * 4);
        REQ_EQ(op->src_offset, (size_t)op->row0 * m->input_width * 4);
        REQ_EQ(op->dst_offset, slice_offset(p, dd, op->row0, m->input_width));
        REQ(op->row0 + op->rows == p->split.dev_row0[dd] + drows[dd] ||
                slice_offset(p, dd, op->row0 + op->rows, m->input_width) != SIZE_MAX,
            "op %d: a scatter ends inside a micro-batch", i);
        REQ_EQ(op->row0, scattered);
        scattered += op->rows;
      }
      if (op->phase == DP_PHASE_GATHER) {
        REQ_EQ(op->src_region, DP_REGION_OUTPUTS);
        REQ_EQ(op->dst_dev, train ? 0 : DP_HOST);
        REQ_EQ(op->src_offset,
               slice_offset(p, op->src_dev, op->row0, dp_model_output_width(m)));
        REQ_EQ(op->row0, gathered);
        gathered += op->rows;
      }
      if (op->phase == DP_PHASE_REDUCE && P) { /* a device's whole sum, every segment */
        /* config.reduce_precision bf16 across a copy: what the sender packed */
        bool wire = dp__wire_bf16(&p->cfg, op->dst_dev, op->src_dev);
        REQ_EQ(op->src_region, wire ? DP_REGION_COMM : DP_REGION_GRADS);
        REQ_EQ(op->dst_region, DP_REGION_COMM);
        REQ_EQ(op->src_offset, wire ? p->wire_send[op->src_dev] : 0);
        REQ_EQ(op->dst_offset, 0);
        REQ_EQ(op->bytes, wire ? P / 2 : P);
        for (int s = 0; s < S; s++) {
          held *src = grad_slot(st, op->src_dev, op->src_region, 0, s, i),
               *dst = grad_slot(st, op->dst_dev, DP_REGION_COMM, 0, s, i);
          read_after_write(src, op, i);
          *dst = *src;
          written(dst, op);
          src->r = (mbrange){0, 0}; /* handed over */
        }
      }
      if (op->src_region == DP_REGION_ACTIVATIONS ||
          op->dst_region == DP_REGION_ACTIVATIONS)
        check_bn_copy(st, op, i);
      break;
    case DP_OP_FORWARD:
      if (op->phase == DP_PHASE_BACKWARD) { /* config.recompute's, in the backward */
        REQ(train && dp__recompute_op(p, b), "op %d: recompute of layer %d", i, b);
        rcmp[k * L + b]++;
        break;
      }
      REQ_EQ(op->phase, DP_PHASE_FORWARD);
      fwd[k * L + b]++;
      if (train && is_sync_bn(p, b)) { /* after the whole batch's statistics are here */
        held *f = bn_part(st, d, b, SB_FINAL);
        read_after_write(f, op, i);
        REQ(covers(&f->r, 0, nmb),
            "op %d: forward of layer %d on device %d with statistics of [%d,%d)", i, b, d,
            f->r.lo, f->r.hi);
      }
      break;
    case DP_OP_BACKWARD: {
      REQ_EQ(op->phase, DP_PHASE_BACKWARD);
      bwd[k * L + b]++;
      if (train && is_sync_bn(p, b)) { /* dx: after the whole batch's sums are here */
        held *f = bn_part(st, d, b, SB_FINAL), *sums = bn_part(st, d, b, SB_SUMS);
        read_after_write(f, op, i);
        REQ(covers(&f->r, 0, nmb), "op %d: backward of layer %d without the statistics", i,
            b);
        if (owner_of(m, b - 1) >= 0) {
          read_after_write(sums, op, i);
          REQ(covers(&sums->r, 0, st->n_act),
              "op %d: backward of layer %d on device %d with the sums of devices [%d,%d)",
              i, b, d, sums->r.lo, sums->r.hi);
        }
      }
      if (!P) break; /* a model without parameters has no gradients to sum */
      REQ_EQ(op->dst_offset %
                 (op->dst_region == DP_REGION_GRAD_PARTIALS ? dp__partial_stride(p) : P),
             0);
      int s = st->sg.of_layer[b];
      held *h = grad_slot(st, d, op->dst_region, op->dst_offset, s, i);
      if (b == st->sg.top[s]) /* a leaf of the segment starts at its top layer */
        h->r = (mbrange){k, k + 1};
      else
        REQ(covers(&h->r, k, k + 1) && h->next == b,
            "op %d: backward of layer %d micro-batch %d into a slot of segment %d holding "
            "[%d,%d) at layer %d",
            i, b, k, s, h->r.lo, h->r.hi, h->next);
      h->next = b - 1;
      written(h, op);
      break;
    }
    case DP_OP_BN_BWD_STATS: { /* the leaf's last op: b's weight and bias gradients */
      held *f = bn_part(st, d, b, SB_FINAL);
      read_after_write(f, op, i);
      REQ(covers(&f->r, 0, nmb), "op %d: bn_bwd_stats of layer %d without the statistics",
          i, b);
      bn_bwd[k * L + b]++;
      int s = segment_ending_at(&st->sg, b);
      REQ_GE(s, 0);
      REQ_EQ(in_slot(st->p, op->dst_region, op->dst_offset), 0);
      held *h = grad_slot(st, d, op->dst_region, op->dst_offset, s, i);
      if (b == st->sg.top[s]) /* a segment without layers of its own */
        h->r = (mbrange){k, k + 1};
      else
        REQ(covers(&h->r, k, k + 1) && h->next == b,
            "op %d: bn_bwd_stats of layer %d micro-batch %d into a slot holding [%d,%d) at "
            "layer %d",
            i, b, k, h->r.lo, h->r.hi, h->next);
      h->next = b - 1;
      written(h, op);
      break;
    }
    case DP_OP_BN_STATS: { /* the micro-batch's partial into its slot */
      q = sched_part(st, d, op->dst_region, op->dst_offset, op->bytes, op, i, b, NULL);
      REQ(q == SB_SLOT + k - p->split.dev_mb0[d],
          "op %d: bn_stats of micro-batch %d into part %d", i, k, q);
      REQ_GT(op->rows, 0);
      held *h = bn_part(st, d, b, q);
      h->r = (mbrange){k, k + 1};
      written(h, op);
      bn_stats[k * L + b]++;
      break;
    }
    case DP_OP_BN_MERGE: /* partials of adjacent micro-batches, on one device */
      q = sched_part(st, d, op->dst_region, op->dst_offset, op->bytes, op, i, b, NULL);
      sq = sched_part(st, d, op->src_region, op->src_offset, op->bytes, op, i, b, NULL);
      REQ(q >= SB_PART_RECV && sq >= SB_PART_RECV, "op %d: merges part %d into part %d", i,
          sq, q);
      tree_add(st, S + b, bn_part(st, d, b, q), bn_part(st, d, b, sq), op, i);
      break;
    case DP_OP_BN_FINAL: { /* device 0's, from the root: after every merge */
      REQ_EQ(d, 0);
      sq = sched_part(st, d, op->src_region, op->src_offset,
                      sb_len(m->layers[b].c, SB_SLOT) * 4, op, i, b, NULL);
      q = sched_part(st, d, op->dst_region, op->dst_offset, op->bytes, op, i, b, NULL);
      REQ_EQ(sq, SB_SLOT);
      REQ_EQ(q, SB_FINAL);
      held *root = bn_part(st, d, b, sq), *f = bn_part(st, d, b, q);
      read_after_write(root, op, i);
      REQ(covers(&root->r, 0, nmb), "op %d: layer %d's statistics from [%d,%d) of %d", i, b,
          root->r.lo, root->r.hi, nmb);
      f->r = root->r;
      written(f, op);
      bn_final[b]++;
      break;
    }
    case DP_OP_GRAD_ADD:
      if (op->src_region == DP_REGION_ACTIVATIONS ||
          op->dst_region == DP_REGION_ACTIVATIONS) {
        /* the backward sums of a sync batchnorm, over the devices */
        REQ(train, "op %d: sums added in a forward", i);
        REQ_EQ(op->phase, DP_PHASE_BACKWARD);
        q = sched_part(st, d, op->dst_region, op->dst_offset, op->bytes, op, i, -1, &b);
        sq = sched_part(st, d, op->src_region, op->src_offset, op->bytes, op, i, b, NULL);
        REQ(q == SB_SUMS && sq == SB_SUMS_RECV, "op %d: adds part %d to part %d", i, sq, q);
        held *dh = bn_part(st, d, b, q), *sh = bn_part(st, d, b, sq);
        read_after_write(dh, op, i);
        read_after_write(sh, op, i);
        merge(&dh->r, &sh->r, i);
        written(dh, op);
        break;
      }
      if (P) {
        /* a segment's range of two slots (the backward), or all of it (the
         * reduction): the segments it covers, each its own tree */
        size_t off = in_slot(st->p, op->dst_region, op->dst_offset);
        REQ_EQ(in_slot(st->p, op->src_region, op->src_offset), off);
        int n_seg = 0;
        size_t covered = 0;
        for (int s = 0; s < S; s++) {
          if (st->sg.p1[s] == st->sg.p0[s] || st->sg.p0[s] < off ||
              st->sg.p1[s] > off + op->bytes)
            continue;
          held *dh = grad_slot(st, d, op->dst_region, op->dst_offset, s, i),
               *sh = grad_slot(st, d, op->src_region, op->src_offset, s, i);
          REQ(leaf_done(dh, &st->sg, s) && leaf_done(sh, &st->sg, s),
              "op %d: adds segment %d's gradients before its layers ran", i, s);
          tree_add(st, s, dh, sh, op, i);
          covered += st->sg.p1[s] - st->sg.p0[s];
          n_seg++;
        }
        REQ(covered == op->bytes,
            "op %d: adds bytes [%zu, +%zu) of the gradients: not whole segments", i, off,
            op->bytes);
        if (op->phase == DP_PHASE_BACKWARD)
          REQ(n_seg == 1, "op %d: a backward addition over %d segments", i, n_seg);
        else
          REQ_EQ(op->bytes, P);
      }
      break;
    case DP_OP_GRAD_PACK: /* a sender's whole sum, rounded to bf16 for the copy */
      REQ(p->cfg.reduce_precision == DP_PRECISION_BF16, "op %d: a pack in fp32", i);
      REQ_EQ(op->phase, DP_PHASE_REDUCE);
      REQ_EQ(op->src_region, DP_REGION_GRADS);
      REQ_EQ(op->src_offset, 0);
      REQ_EQ(op->dst_region, DP_REGION_COMM);
      REQ_EQ(op->dst_offset, p->wire_send[d]);
      REQ_EQ(op->bytes, P);
      for (int s = 0; P && s < S; s++) {
        held *src = grad_slot(st, d, DP_REGION_GRADS, 0, s, i),
             *dst = grad_slot(st, d, DP_REGION_COMM, 0, s, i);
        read_after_write(src, op, i);
        *dst = *src;
        written(dst, op);
        src->r = (mbrange){0, 0}; /* handed over */
      }
      break;
    case DP_OP_GRAD_UNPACK: REQ(0, "op %d: classic mode unpacks nothing", i); break;
    case DP_OP_COPY_ADD: /* a reduction step in one pass, between devices of one process */
      REQ_EQ(op->phase, DP_PHASE_REDUCE);
      REQ_EQ(op->device, op->dst_dev);
      REQ_EQ(op->src_region, DP_REGION_GRADS);
      REQ_EQ(op->dst_region, DP_REGION_GRADS);
      REQ_EQ(op->src_offset, op->dst_offset);
      REQ(op->src_dev != op->dst_dev && dp__copy_adds(&p->cfg, op->dst_dev, op->src_dev),
          "op %d: adds device %d's gradients into device %d's in place", i, op->src_dev,
          op->dst_dev);
      if (P) { /* whole segments, each its own tree */
        size_t covered = 0;
        for (int s = 0; s < S; s++) {
          if (st->sg.p1[s] == st->sg.p0[s] || st->sg.p0[s] < op->dst_offset ||
              st->sg.p1[s] > op->dst_offset + op->bytes)
            continue;
          held *dh = grad_slot(st, op->dst_dev, DP_REGION_GRADS, 0, s, i),
               *sh = grad_slot(st, op->src_dev, DP_REGION_GRADS, 0, s, i);
          REQ(leaf_done(dh, &st->sg, s) && leaf_done(sh, &st->sg, s),
              "op %d: adds segment %d's gradients before its layers ran", i, s);
          tree_add(st, s, dh, sh, op, i);
          sh->r = (mbrange){0, 0}; /* handed over */
          covered += st->sg.p1[s] - st->sg.p0[s];
        }
        REQ(covered == op->bytes,
            "op %d: adds bytes [%zu, +%zu) of the gradients: not whole segments", i,
            op->dst_offset, op->bytes);
      }
      break;
    case DP_OP_LOSS:
      REQ_EQ(op->device, 0);
      REQ_EQ(op->rows, v->rows);
      REQ_EQ(op->n_mb, nmb);
      n_loss++;
      break;
    case DP_OP_LOSS_SUM: /* over the planned micro-batches; empty ones are left out */
      REQ_EQ(op->device, 0);
      REQ_EQ(op->n_mb, p->split.n_mb);
      REQ_EQ(op->rows, v->rows);
      break;
    case DP_OP_GRAD_CHECK:
      REQ_EQ(op->device, 0);
      REQ_EQ(op->bytes, P);
      break;
    case DP_OP_ZERO: REQ(0, "op %d: classic mode zeroes nothing", i); break;
    case DP_OP_ALLREDUCE: REQ(0, "op %d: classic mode has no collective", i); break;
    case DP_OP_OPTIMIZER:
      REQ_EQ(op->device, 0);
      REQ_EQ(op->phase, DP_PHASE_OPTIMIZER);
      /* the last op, but for batchnorm's running-statistics updates after it */
      for (int j = i + 1; j < v->n_ops; j++) REQ_EQ(v->ops[j].kind, DP_OP_BN_UPDATE);
      /* device 0 now holds the sum over every micro-batch, in every segment */
      for (int s = 0; P && s < S; s++) {
        if (st->sg.p1[s] == st->sg.p0[s]) continue;
        held *h = grad_slot(st, 0, DP_REGION_GRADS, 0, s, i);
        read_after_write(h, op, i);
        REQ(covers(&h->r, 0, nmb) && leaf_done(h, &st->sg, s),
            "segment %d (layers %d..%d): device 0 holds the gradients of [%d,%d) of %d", s,
            st->sg.top[s], st->sg.bot[s] + 1, h->r.lo, h->r.hi, nmb);
      }
      n_opt++;
      break;
    case DP_OP_BN_UPDATE: /* batchnorm: device 0's buffers, in the optimizer stage */
      REQ_EQ(op->device, 0);
      REQ_EQ(op->phase, DP_PHASE_OPTIMIZER);
      REQ(b >= 0 && b < L && p->model.layers[b].kind == DP_LAYER_BATCHNORM,
          "op %d: bn_update of layer %d", i, b);
      if (is_sync_bn(p, b)) /* from the whole batch's statistics */
        REQ(covers(&bn_part(st, 0, b, SB_FINAL)->r, 0, nmb), "op %d: bn_update of layer %d",
            i, b);
      break;
    case DP_OP_GRAD_ACCUM: /* accumulate: device 0's whole gradient, classic */
    case DP_OP_GRAD_STASH:
      REQ_EQ(op->device, 0);
      REQ(p->cfg.accumulate > 1, "op %d: accumulation without accumulate", i);
      break;
    case DP_OP_GRAD_NORM: /* clip_grad_norm: device 0's whole gradient, classic */
    case DP_OP_GRAD_CLIP:
      REQ_EQ(op->device, 0);
      REQ_EQ(op->phase, DP_PHASE_OPTIMIZER);
      REQ(p->cfg.clip_grad_norm > 0, "op %d: clipping without clip_grad_norm", i);
      break;
    case DP_OP_GRAD_CLAMP: /* clip_grad_value: device 0's whole gradient, classic */
      REQ_EQ(op->device, 0);
      REQ_EQ(op->phase, DP_PHASE_OPTIMIZER);
      REQ_EQ(op->bytes, P);
      REQ(p->cfg.clip_grad_value > 0, "op %d: clamping without clip_grad_value", i);
      break;
    }
  }
  REQ_EQ(scattered, v->rows);
  REQ_EQ(gathered, v->rows);
  for (int k = 0; k < n_mb * L; k++) {
    int sync = train && is_sync_bn(p, k % L);
    if (k >= nmb * L) {
      REQ_EQ(fwd[k], 0); /* empty micro-batches are skipped */
      REQ_EQ(rcmp[k], 0);
      REQ_EQ(bwd[k], 0);
      REQ_EQ(bn_stats[k], 0);
      REQ_EQ(bn_bwd[k], 0);
      continue;
    }
    REQ_EQ(fwd[k], 1);
    /* config.recompute: once per micro-batch, in the backward, where recomputed */
    REQ(rcmp[k] == (train && dp__recompute_op(p, k % L)),
        "micro-batch %d layer %d: recomputed %d times", k / L, k % L, rcmp[k]);
    REQ_EQ(bwd[k], train ? 1 : 0);
    /* sync batchnorm: each micro-batch's statistics once, and its sums once */
    REQ(bn_stats[k] == sync && bn_bwd[k] == sync,
        "micro-batch %d layer %d: %d bn_stats, %d bn_bwd_stats", k / L, k % L, bn_stats[k],
        bn_bwd[k]);
  }
  for (int b = 0; b < L; b++) REQ_EQ(bn_final[b], train && is_sync_bn(p, b));
  REQ_EQ(n_loss, train);
  REQ_EQ(n_opt, train);
  /* one tree: every segment's gradients and every sync batchnorm's statistics
   * summed with the same additions */
  int ref = -1;
  for (int t = 0; t < S + L; t++) {
    if (t < S ? !P || st->sg.p1[t] == st->sg.p0[t] : !(train && is_sync_bn(p, t - S)))
      continue;
    merge3 *a = st->adds + t * st->cap;
    qsort(a, (size_t)st->n_adds[t], sizeof *a, cmp_merge3);
    if (!train) continue;
    REQ(st->n_adds[t] == nmb - 1, "tree %d: %d additions over %d micro-batches", t,
        st->n_adds[t], nmb);
    if (ref < 0) {
      ref = t;
      continue;
    }
    const merge3 *r = st->adds + ref * st->cap;
    for (int j = 0; j < st->n_adds[t]; j++)
      REQ(a[j].lo == r[j].lo && a[j].mid == r[j].mid && a[j].hi == r[j].hi,
          "tree %d addition %d is [%d,%d)+[%d,%d), tree %d's [%d,%d)+[%d,%d)", t, j,
          a[j].lo, a[j].mid, a[j].mid, a[j].hi, ref, r[j].lo, r[j].mid, r[j].mid, r[j].hi);
  }
  for (int d = 0; d < N; d++) {
    free(st->slots[d]);
    for (int b = 0; b < L; b++) free(st->bn[d * L + b].part);
  }
  free(st->bn);
  free(st->adds);
  free(st->n_adds);
  free(st);
  free(fwd);
  free(rcmp);
  free(bwd);
  free(bn_stats);
  free(bn_bwd);
  free(bn_final);
}

static void check_view(const dp_plan *p, const sched_view *v) {
  for (int d = 0; d < dp_plan_n_devices(p); d++) check_liveness_by_simulation(p, v, d);
  check_op_bounds(p, v);
  check_schedule(p, v);
}

static void check_plan(const dp_plan *p) {
  check_regions(p);
  for (int d = 0; d < dp_plan_n_devices(p); d++) check_act_layout(p, d);
  sched_view v = plan_view(p);
  check_view(p, &v);
  check_grad_memory_is_exact(p);
}

/* The schedule of a step with `rows` <= the planned batch, as a context
 * builds it: the planned cut points, micro-batches truncated, empty ones
 * skipped. It must fit the plan's op capacity and arenas. */
static void check_smaller_batch(const dp_plan *p, int rows, int train) {
  dp_mb *mbs = malloc((size_t)p->split.n_mb * sizeof *mbs);
  dp_op *ops = malloc((size_t)p->ops_cap * sizeof *ops);
  for (int k = 0; k < p->split.n_mb; k++) {
    int r = rows - p->mbs[k].row0;
    mbs[k] = (dp_mb){p->mbs[k].row0, r <= 0 ? 0 : r < p->mbs[k].rows ? r : p->mbs[k].rows};
  }
  int n_ops = -1, n_stages = -1;
  dp_status s = dp__schedule_build(p, mbs, train, ops, p->ops_cap, &n_ops, &n_stages);
  REQ(s == DP_OK, "rows %d: %s", rows, dp_last_error());
  REQ_LE(n_ops, p->ops_cap);
  REQ_GE(n_stages, 1);
  sched_view v = {ops, n_ops, mbs, rows, train};
  check_view(p, &v);
  free(ops);
  free(mbs);
}

START_TEST(the_seed_plan_keeps_every_invariant) {
  dp_model *m = model_of(SEED);
  for (int opt = 0; opt < 3; opt++)
    for (int inf = 0; inf < 2; inf++) {
      dp_config c = config_of(30, 2, DP_OPT_SGD);
      dp_config_set_optimizer(&c, (dp_optimizer)opt);
      c.inference = inf;
      dp_plan *p = plan_of(m, &c);
      check_plan(p);
      dp_plan_free(p);
    }
  dp_model_free(m);
}
END_TEST

/* config.recompute through every plan invariant, the liveness simulation
 * included (each recomputed piece is written by its micro-batch's recompute
 * before the backward reads it, and no pieces live together share a byte):
 * the MLP of every kind, a CNN with batchnorm per replica and sync, the GPT,
 * and a ResNet with projection shortcuts (x read past f by g, f's output by the
 * end; batchnorm per replica and sync), residual MLP blocks with sync
 * batchnorm, segments of 2, 3 and 5 layers, on 1 to 3 devices with 1 to 6
 * micro-batches each, at the planned batch and smaller ones; and every one of
 * them recomputes something. Its training runs are in the determinism suite. */
/* A block whose f starts with tanh (its backward reads its output, not x), so
 * that g's conv past the shortcut is the one backward of the block that reads
 * x, and f's first recompute the other reader. */
static const char SHORTCUT_ONLY_READER[] =
    "input 1 4 4\nconv2d 4 3 padding 1\nrelu\nconv2d 4 3 padding 1\nresidual\ntanh\n"
    "conv2d 4 3 stride 2 padding 1\ntanh\nshortcut\nconv2d 4 1 stride 2\nend\nrelu\n"
    "flatten\nlinear 8\ntanh\nlinear 6\nrelu\nlinear 3\nloss mse\n";

START_TEST(recompute_plans_keep_every_invariant) {
  static const char BN_CNN[] =
      "input 1 3 4\nconv2d 3 2 padding 1\nbatchnorm\nrelu\nmaxpool2d 2 stride 1\n"
      "flatten\nlinear 8\nbatchnorm\ntanh\ndropout 0.1\nlinear 6\nrelu\nlinear 5\n"
      "loss softmax_cross_entropy\n";
  const struct {
    const char *spec;
    dp_bn_mode bn;
  } cs[] = {{MLP_EVERY_KIND_SPEC, DP_BN_PER_REPLICA},
            {BN_CNN, DP_BN_PER_REPLICA},
            {BN_CNN, DP_BN_SYNC},
            {GPT_SPEC, DP_BN_PER_REPLICA},
            {RESNET_PROJ_SPEC, DP_BN_PER_REPLICA},
            {RESNET_PROJ_SPEC, DP_BN_SYNC},
            {RESNET_MLP_SPEC, DP_BN_SYNC},
            {SHORTCUT_ONLY_READER, DP_BN_PER_REPLICA}};
  static const int devs[][2] = {{1, 0}, {1, 2}, {2, 3}, {3, 1}}; /* devices, micro-batch */
  for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
    dp_model *m = model_of(cs[c].spec);
    for (int k = 2; k <= 5; k += k == 3 ? 2 : 1)
      for (size_t v = 0; v < sizeof devs / sizeof *devs; v++) {
        dp_config cfg = config_of(11, devs[v][0], DP_OPT_ADAMW);
        cfg.micro_batch = devs[v][1];
        cfg.recompute = k;
        cfg.batchnorm = cs[c].bn;
        dp_plan *p = plan_of(m, &cfg);
        int n_rc = 0;
        for (int i = 0; i < dp_plan_n_ops(p); i++)
          n_rc += p->ops[i].kind == DP_OP_FORWARD && p->ops[i].phase == DP_PHASE_BACKWARD;
        ck_assert_msg(n_rc > 0, "spec %zu, recompute %d: nothing recomputed", c, k);
        check_plan(p);
        for (int rows = 1; rows < 11; rows += 3) check_smaller_batch(p, rows, 1);
        ck_assert_int_eq(dp__plan_verify(p), DP_OK);
        dp_plan_free(p);
      }
    dp_model_free(m);
  }
}
END_TEST

/* config.recompute: out of range refused naming the field; in inference
 * (nothing to recompute) the plan is the one without it. */
START_TEST(recompute_values_are_checked) {
  dp_model *m = model_of(MLP_EVERY_KIND_SPEC);
  static const int bad[] = {-1, 257, INT_MIN, INT_MAX};
  for (int i = 0; i < 4; i++) {
    dp_config c = config_of(8, 1, DP_OPT_SGD);
    c.recompute = bad[i];
    dp_plan *p = NULL;
    ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_ERR_INVALID);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(dp_last_error(), "recompute must be 0 (off) or a segment length"),
                  "%s", dp_last_error());
  }
  dp_config c = config_of(8, 2, DP_OPT_SGD);
  c.inference = 1;
  c.micro_batch = 2;
  dp_plan *a = plan_of(m, &c);
  c.recompute = 3;
  dp_plan *b = plan_of(m, &c);
  ck_assert_int_eq(dp_plan_n_ops(a), dp_plan_n_ops(b));
  for (int d = 0; d < 2; d++)
    ck_assert_uint_eq(dp_plan_device_bytes(a, d), dp_plan_device_bytes(b, d));
  dp_plan_free(a);
  dp_plan_free(b);
  dp_model_free(m);
}
END_TEST

/* The issue's figure: a 5-layer 1024-wide MLP at batch 1024 in micro-batches
 * of 64 needs at most half the activation bytes with recompute (segments of
 * 5, 6 or 8 layers: one or two kept outputs instead of four), from the
 * plans' own numbers; segments of one layer recompute nothing and change no
 * byte; and without micro-batches (one per device) the recompute buffers are
 * whole-batch too, so there is nothing to save. */
START_TEST(recompute_halves_the_activations_of_a_wide_mlp) {
  dp_model *m = model_of("input 1024\nlinear 1024\nrelu\nlinear 1024\nrelu\nlinear 1024\n"
                         "relu\nlinear 1024\nrelu\nlinear 1024\nloss mse\n");
  dp_config c = config_of(1024, 1, DP_OPT_SGD);
  c.micro_batch = 64;
  dp_plan *p = plan_of(m, &c);
  size_t off = dp_plan_region(p, 0, DP_REGION_ACTIVATIONS).size;
  dp_plan_free(p);
  ck_assert_uint_ge(off, (size_t)16 << 20); /* four 4 MiB outputs kept */
  static const int ks[] = {5, 6, 8};
  for (int j = 0; j < 3; j++) {
    c.recompute = ks[j];
    p = plan_of(m, &c);
    size_t on = dp_plan_region(p, 0, DP_REGION_ACTIVATIONS).size;
    ck_assert_msg(2 * on <= off, "recompute %d: %zu activation bytes, %zu without", ks[j],
                  on, off);
    check_plan(p);
    dp_plan_free(p);
  }
  c.recompute = 1;
  p = plan_of(m, &c);
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_ACTIVATIONS).size, off);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* The GPT (residual blocks, attention, per-position layernorm) through every
 * plan invariant, the liveness simulation included (a residual's input stays
 * live to its end's forward; the end's output gradient to the begin's
 * backward), with guards and several micro-batches per device, in training
 * and inference; attention keeps its (H, T, T) probabilities per row as its
 * statistics buffer; and a guarded context trains with its guards intact. */
/* config.reduce_precision bf16 (docs/PRECISION.md, "Gradient reduction"):
 * classic plans through every invariant (check_schedule follows each sum
 * through the packs and bf16 copies between processes, and checks every leaf
 * and every sum of the tree is flagged to round), in one process (in-place
 * adds that round) and across 2 or every rank (packs), with several
 * micro-batches and sync batchnorm. */
START_TEST(reduce_bf16_plans_keep_every_invariant) {
  static const char *const specs[] = {
      GPT_SPEC, MLP_EVERY_KIND_SPEC,
      "input 12\nlinear 16\nbatchnorm\nrelu\nlinear 5\nloss softmax_cross_entropy\n"};
  static const struct {
    int n_dev, ranks, mb;
  } cs[] = {{1, 1, 2}, {2, 1, 0}, {2, 2, 2}, {3, 3, 0},
            {4, 2, 1}, {4, 4, 2}, {8, 8, 1}, {8, 2, 0}};
  for (int k = 0; k < 3; k++) {
    dp_model *m = model_of(specs[k]);
    for (size_t j = 0; j < sizeof cs / sizeof *cs; j++)
      for (int rb = 0; rb < 2; rb++) {
        dp_config c = config_of(16, cs[j].n_dev, DP_OPT_ADAMW);
        c.ranks = cs[j].ranks;
        c.micro_batch = cs[j].mb;
        c.batchnorm = k == 2 ? DP_BN_SYNC : DP_BN_PER_REPLICA;
        c.reduce_precision = rb ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
        dp_plan *p = plan_of(m, &c);
        check_plan(p);
        dp_plan_free(p);
      }
    dp_model_free(m);
  }
}
END_TEST

/* Bytes of the reduction's copies between processes (the gradients' bytes on
 * the wire; ranks == devices: every copy crosses). */
static size_t wire_bytes(const dp_plan *p) {
  size_t total = 0;
  const dp_op *ops = dp_plan_ops(p);
  for (int i = 0; i < dp_plan_n_ops(p); i++)
    if (ops[i].phase == DP_PHASE_REDUCE && ops[i].kind == DP_OP_COPY &&
        dp__rank_of(&p->cfg, ops[i].src_dev) != dp__rank_of(&p->cfg, ops[i].dst_dev))
      total += ops[i].bytes;
  return total;
}

/* reduce_precision bf16 halves the gradient bytes that cross processes, in
 * every mode and device count (the halving and doubling, the tree to device 0,
 * and its ranges for a count not a power of two), and the arenas stay exact:
 * creating a context verifies every op against its regions. */
START_TEST(reduce_bf16_halves_the_bytes_between_processes) {
  dp_model *m = model_of(MLP_EVERY_KIND_SPEC);
  for (int n = 2; n <= 8; n++)
    for (int mode = 0; mode < 3; mode++) {
      size_t bytes[2];
      for (int rb = 0; rb < 2; rb++) {
        dp_config c = config_of(16, n, DP_OPT_ADAMW);
        c.ranks = n;
        c.mode = mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC;
        c.shard_optimizer = mode == 2;
        c.reduce_precision = rb ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
        dp_plan *p = plan_of(m, &c);
        bytes[rb] = wire_bytes(p);
        dp_plan_free(p);
      }
      ck_assert_uint_gt(bytes[0], 0);
      ck_assert_msg(bytes[1] * 2 == bytes[0],
                    "%d devices, mode %d: %zu bf16 bytes, %zu fp32", n, mode, bytes[1],
                    bytes[0]);
    }
  dp_model_free(m);
}
END_TEST

/* Bad values are refused by name; so is a reduction in bf16 with a backend's
 * own collectives (tested with the cuda backend in test_cuda.c). */
START_TEST(reduce_precision_refuses_unknown_values) {
  dp_model *m = model_of(MLP_EVERY_KIND_SPEC);
  dp_config c = config_of(16, 2, DP_OPT_ADAMW);
  c.reduce_precision = (dp_precision)7;
  dp_plan *p = NULL;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_ERR_INVALID);
  ck_assert_ptr_null(p);
  ck_assert_msg(strstr(dp_last_error(), "reduce_precision 7") &&
                    strstr(dp_last_error(), "fp32 and bf16"),
                "%s", dp_last_error());
  dp_model_free(m);
}
END_TEST

/* The layouts the GPT and shortcut plan tests go through, 11 rows each:
 * devices, mode, sharded optimizer, micro-batch, inference. */
static const struct {
  int n_dev, mode, shard, mb, inf;
} LAYOUTS[] = {{1, DP_MODE_CLASSIC, 0, 2, 0},   {2, DP_MODE_CLASSIC, 0, 3, 0},
               {3, DP_MODE_ALLREDUCE, 0, 1, 0}, {4, DP_MODE_ALLREDUCE, 1, 2, 0},
               {2, DP_MODE_CLASSIC, 0, 0, 0},   {2, DP_MODE_CLASSIC, 0, 2, 1}};
enum { N_LAYOUTS = sizeof LAYOUTS / sizeof *LAYOUTS };

static dp_config layout_config(size_t k, dp_optimizer opt) {
  dp_config c = config_of(11, LAYOUTS[k].n_dev, opt);
  c.mode = (dp_mode)LAYOUTS[k].mode;
  c.shard_optimizer = LAYOUTS[k].shard;
  c.micro_batch = LAYOUTS[k].mb;
  c.inference = LAYOUTS[k].inf;
  return c;
}

START_TEST(gpt_plans_keep_every_invariant_with_guards_and_micro_batches) {
  dp_model *m = model_of(GPT_SPEC);
  int att = -1;
  for (int i = 0; i < dp_model_n_layers(m); i++)
    if (dp_model_layer_kind(m, i) == DP_LAYER_ATTENTION) att = i;
  ck_assert_int_ge(att, 0);
  for (size_t k = 0; k < N_LAYOUTS; k++) {
    dp_config c = layout_config(k, DP_OPT_ADAMW);
    dp_plan *p = plan_of(m, &c); /* check_regions's layout has no guards */
    if (c.mode == DP_MODE_CLASSIC) {
      check_plan(p);
    } else { /* check_regions and the gradient memory check know classic's layout */
      for (int d = 0; d < dp_plan_n_devices(p); d++) check_act_layout(p, d);
      sched_view v = plan_view(p); /* and check_schedule classic's schedule */
      for (int d = 0; d < dp_plan_n_devices(p); d++) check_liveness_by_simulation(p, &v, d);
    }
    for (int d = 0; d < dp_plan_n_devices(p); d++) {
      const dp_layer *l = &p->model.layers[att];
      ck_assert_int_eq(l->heads * l->t * l->t, 2 * GPT_T * GPT_T);
      ck_assert_uint_ne(p->act[d].stats[att], SIZE_MAX);
    }
    for (int rows = 1; rows < 11 && c.mode == DP_MODE_CLASSIC; rows += 4)
      check_smaller_batch(p, rows, !LAYOUTS[k].inf);
    dp_plan_free(p);
    c.guards = 1; /* the same plan with guards: what the runtime touches stays inside */
    p = plan_of(m, &c);
    dp_ctx *x = ctx_of(p);
    float in[11 * GPT_T], out[11 * GPT_T * GPT_V];
    int32_t t[11 * GPT_T];
    for (int i = 0; i < 11 * GPT_T; i++) {
      in[i] = (float)((i * 7) % GPT_V);
      t[i] = (i * 4) % GPT_V;
    }
    for (int st = 0; st < 2 && !LAYOUTS[k].inf; st++)
      ck_assert_msg(dp_train_step(x, 11, GPT_T, in, t, NULL) == DP_OK, "%s",
                    dp_ctx_error(x));
    ck_assert_int_eq(dp_forward(x, 11, GPT_T, in, out), DP_OK);
    ck_assert_msg(dp_ctx_check_guards(x) == DP_OK, "case %zu: %s", k, dp_ctx_error(x));
    dp_ctx_free(x);
    dp_plan_free(p);
  }
  dp_model_free(m);
}
END_TEST

START_TEST(random_plans_keep_every_invariant) {
  rng_state = 0xD1B54A32D192ED03ull;
  for (int it = 0; it < 400; it++) {
    dp_model *m = random_model(8, 1);
    dp_config c = random_config(48, 8);
    dp_plan *p = plan_of(m, &c);
    check_plan(p);
    dp_plan_free(p);
    dp_model_free(m);
  }
}
END_TEST

START_TEST(random_image_plans_keep_every_invariant) {
  rng_state = 0x5EED1317;
  for (int it = 0; it < 300; it++) {
    dp_model *m = random_image_model(9, 1, 0);
    dp_config c = random_config(24, 6);
    c.backend = DP_BACKEND_CPU; /* batchnorm is the cpu backend's so far */
    if (rnd(3) == 0) c.micro_batch = 1 + (int)rnd(4);
    /* batchnorm per replica or over the whole batch (training: the forward
     * and backward wait for the statistics and the sums of every device) */
    c.batchnorm = rnd(2) ? DP_BN_SYNC : DP_BN_PER_REPLICA;
    dp_plan *p = plan_of(m, &c);
    check_plan(p);
    dp_plan_free(p);
    dp_model_free(m);
  }
}
END_TEST

/* check_plan of m's plan for c, and of its steps at a random smaller batch and
 * one row short (training and forward); frees m. */
static void check_plan_and_smaller_batches(dp_model *m, const dp_config *c) {
  dp_plan *p = plan_of(m, c);
  check_plan(p);
  int B = c->batch, rows[] = {1 + (int)rnd((uint32_t)B), B > 1 ? B - 1 : 1};
  for (size_t j = 0; j < sizeof rows / sizeof *rows; j++) {
    if (!c->inference) check_smaller_batch(p, rows[j], 1);
    check_smaller_batch(p, rows[j], 0);
  }
  dp_plan_free(p);
  dp_model_free(m);
}

/* A random model with at least one batchnorm: flat (BatchNorm1d) or image
 * (BatchNorm2d, and 1d after a flatten). */
static dp_model *random_bn_model(void) {
  for (;;) {
    dp_model *m = rnd(2) ? random_image_model(9, 1, 1) : random_flat_model(8, 1, 1);
    for (int i = 0; i < m->n_layers; i++)
      if (m->layers[i].kind == DP_LAYER_BATCHNORM) return m;
    dp_model_free(m);
  }
}

/* Sync batchnorm: the statistics and sums trees, the backward in segments
 * and the gradient buffers that hold all of a device's rows, on 1..6 devices
 * with several micro-batches each, at the planned batch and smaller ones,
 * training and inference plans (and forwards of training plans). */
START_TEST(random_sync_batchnorm_plans_keep_every_invariant) {
  rng_state = 0xB47C4;
  for (int it = 0; it < 150; it++) {
    dp_model *m = random_bn_model();
    dp_config c = random_config(32, 6);
    c.backend = DP_BACKEND_CPU;
    c.batchnorm = DP_BN_SYNC;
    if (rnd(3)) c.micro_batch = 1 + (int)rnd(4);
    c.inference = rnd(4) == 0;
    check_plan_and_smaller_batches(m, &c);
  }
}
END_TEST

/* A random flat model of residual blocks (nested up to 3 deep, some with a
 * shortcut, empty of nothing) around linear, batchnorm, relu and tanh layers
 * of one width, with at least one batchnorm. */
static dp_model *random_residual_bn_model(void) {
  for (;;) {
    dp_model *m = NULL;
    ck_assert_int_eq(dp_model_new(2 + (int)rnd(10), &m), DP_OK);
    int w = m->input_width, n = 4 + (int)rnd(14), depth = 0, n_bn = 0;
    int part[4] = {0}, sc[4] = {0}; /* layers in f (or g) of each open block, a shortcut */
    for (int i = 0; i < n || depth > 0; i++) {
      int r = (int)rnd(8);
      if (i < n && r == 0 && depth < 3) {
        ck_assert_int_eq(dp_model_begin_residual(m), DP_OK);
        depth++;
        part[depth] = sc[depth] = 0;
        continue;
      }
      if (depth > 0 && part[depth] > 0 && (i >= n || r == 1)) {
        if (!sc[depth] && rnd(3) == 0) {
          ck_assert_int_eq(dp_model_begin_shortcut(m), DP_OK);
          sc[depth] = 1;
          part[depth] = 0;
          continue;
        }
        ck_assert_int_eq(dp_model_end_residual(m), DP_OK);
        part[--depth]++;
        continue;
      }
      switch (rnd(4)) {
      case 0: ck_assert_int_eq(dp_model_add_linear(m, w, (int)rnd(2)), DP_OK); break;
      case 1:
        ck_assert_int_eq(dp_model_add(m, DP_LAYER_BATCHNORM), DP_OK);
        n_bn++;
        break;
      case 2: ck_assert_int_eq(dp_model_add(m, DP_LAYER_RELU), DP_OK); break;
      default: ck_assert_int_eq(dp_model_add(m, DP_LAYER_TANH), DP_OK); break;
      }
      part[depth]++;
    }
    ck_assert_int_eq(dp_model_add_linear(m, 1 + (int)rnd(5), 1), DP_OK);
    ck_assert_int_eq(dp_model_set_loss(m, DP_LOSS_MSE), DP_OK);
    if (n_bn) return m;
    dp_model_free(m);
  }
}

/* Sync batchnorm in random residual blocks (a batchnorm anywhere in f, in g,
 * nested, right after a begin, before an end): every plan invariant and the
 * liveness simulation, with recompute or without, on 1..6 devices with
 * several micro-batches each, at the planned batch and smaller ones. */
START_TEST(random_residual_sync_batchnorm_plans_keep_every_invariant) {
  rng_state = 0x5EB10C;
  for (int it = 0; it < 150; it++) {
    dp_model *m = random_residual_bn_model();
    dp_config c = random_config(24, 6);
    c.backend = DP_BACKEND_CPU;
    c.batchnorm = DP_BN_SYNC;
    if (rnd(3)) c.micro_batch = 1 + (int)rnd(4);
    c.recompute = rnd(3) ? 0 : 2 + (int)rnd(3);
    check_plan_and_smaller_batches(m, &c);
  }
}
END_TEST

/* Allreduce mode checks each device's reduced segment: the checks, in
 * schedule order, tile [0, P) in ascending order, each on the device that
 * reduced it, in one stage before the update's; also with fewer parameters
 * than devices (empty segments check nothing; the fuzzer found a schedule
 * that never ended there). */
START_TEST(allreduce_checks_tile_the_parameters_in_order) {
  for (int k = 1; k <= 9; k++)
    for (int n = 1; n <= 8; n *= 2) {
      char spec[64];
      snprintf(spec, sizeof spec, "input %d\nlinear 1%s\nloss mse\n", k,
               k % 2 ? "" : " nobias");
      dp_model *m = model_of(spec);
      dp_config c = config_of(16, n, DP_OPT_ADAMW);
      c.mode = DP_MODE_ALLREDUCE;
      dp_plan *p = plan_of(m, &c);
      size_t P = m->n_params, at = 0;
      const dp_op *ops = dp_plan_ops(p);
      int stage = -1, upd = -1;
      for (int i = 0; i < dp_plan_n_ops(p); i++) {
        if (ops[i].kind == DP_OP_OPTIMIZER && upd < 0) upd = ops[i].stage;
        if (ops[i].kind != DP_OP_GRAD_CHECK) continue;
        REQ(ops[i].src_offset == at * 4 && ops[i].bytes > 0,
            "P %zu, %d devices: check at %zu of %zu bytes, want one at %zu", P, n,
            ops[i].src_offset / 4, ops[i].bytes, at);
        REQ(stage < 0 || stage == ops[i].stage, "P %zu, %d devices: checks in two stages",
            P, n);
        stage = ops[i].stage;
        at += ops[i].bytes / 4;
      }
      REQ(at == P, "P %zu, %d devices: the checks cover %zu parameters", P, n, at);
      REQ(upd > stage, "P %zu, %d devices: the update is not after the checks", P, n);
      dp_plan_free(p);
      dp_model_free(m);
    }
}
END_TEST

/* flatten costs nothing: the same plan with and without it, to the byte */
START_TEST(flatten_is_a_view_without_memory) {
  /* tanh: a relu would be written by the conv (dp__relu_fused), a buffer less */
  dp_model *a = model_of("input 2 6 6\nconv2d 4 3\ntanh\nflatten\nlinear 5\nloss mse\n");
  dp_config c = config_of(16, 2, DP_OPT_ADAMW);
  dp_plan *p = plan_of(a, &c);
  for (int d = 0; d < dp_plan_n_devices(p); d++) {
    REQ_EQ(p->act[d].act[2], p->act[d].act[1]); /* the flatten's output is tanh's buffer */
    REQ_EQ(p->act[d].dact[2], p->act[d].dact[1]);
  }
  check_plan(p);
  dp_model *f = model_of("input 1 4 4\nflatten\nlinear 3\nloss mse\n");
  dp_model *g = model_of("input 16\nlinear 3\nloss mse\n");
  dp_plan *pf = plan_of(f, &c), *pg = plan_of(g, &c);
  for (int d = 0; d < dp_plan_n_devices(pf); d++)
    REQ_EQ(dp_plan_device_bytes(pf, d), dp_plan_device_bytes(pg, d));
  REQ_EQ(pf->act[0].act[0], SIZE_MAX); /* a view of the input: no buffer */
  /* liveness reuse, as dp plan reports it: the buffers one by one take more */
  for (int d = 0; d < dp_plan_n_devices(p); d++)
    REQ(dp_plan_activation_bytes_unshared(p, d) >
            dp_plan_region(p, d, DP_REGION_ACTIVATIONS).size,
        "device %d: %zu unshared, %zu placed", d, dp_plan_activation_bytes_unshared(p, d),
        dp_plan_region(p, d, DP_REGION_ACTIVATIONS).size);
  REQ_EQ(dp_plan_activation_bytes_unshared(p, 99), 0);
  check_plan(pf);
  /* the cuda backend runs the image layers too: flatten is a view there as
   * well, and WORKSPACE is the fixed 8 KiB header + 32 MiB of cuBLAS, then
   * conv2d's COL (n P, CKK) and T (n P, OUT), each 256-aligned (dp_cuda.h) */
  if (dp_cuda_available()) {
    dp_config cc = c;
    cc.backend = DP_BACKEND_CUDA;
    dp_plan *q = NULL;
    REQ(dp_plan_create(a, &cc, &q) == DP_OK, "%s", dp_last_error());
    for (int d = 0; d < dp_plan_n_devices(q); d++) {
      REQ_EQ(q->act[d].act[2], q->act[d].act[1]);
      REQ_EQ(q->act[d].dact[2], q->act[d].dact[1]);
      size_t np = (size_t)q->act[d].mb_rows * 4 * 4;       /* conv2d 4 3 on 6 x 6: 4 x 4 */
      size_t col = (np * 2 * 3 * 3 * 4 + 255) / 256 * 256; /* CKK = 2 x 3 x 3 */
      size_t t = (np * 4 * 4 + 255) / 256 * 256;           /* OUT = 4 */
      REQ_EQ(dp_plan_region(q, d, DP_REGION_WORKSPACE).size,
             (size_t)16384 + ((size_t)32 << 20) + col + t);
    }
    check_plan(q);
    dp_plan_free(q);
  }
  dp_plan_free(p);
  dp_plan_free(pf);
  dp_plan_free(pg);
  dp_model_free(a);
  dp_model_free(f);
  dp_model_free(g);
}
END_TEST

/* A residual block may end a model: its begin's skip, the loss's output
 * gradient, is the backward's alone, and an inference plan has none (its
 * context failed verification); in fp32 and bf16, training and inference, the
 * context opens and a forward runs. */
START_TEST(a_residual_block_may_end_the_model) {
  dp_model *m = model_of("input 12\nlinear 16\ngelu\nlinear 5\nresidual\nlayernorm\n"
                         "linear 5\nend\nloss softmax_cross_entropy\n");
  float x[4 * 12], y[4 * 5];
  for (int k = 0; k < 4 * 12; k++) x[k] = (float)(k % 7) - 3.0f;
  for (int v = 0; v < 4; v++) {
    dp_config c = config_of(4, 2, DP_OPT_SGD);
    c.inference = v & 1;
    c.precision = v & 2 ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
    dp_plan *p = plan_of(m, &c);
    if (!(v & 2)) check_plan(p); /* its byte counts are fp32's */
    dp_ctx *ctx = ctx_of(p);
    REQ(dp_forward(ctx, 4, 12, x, y) == DP_OK, "%s", dp_ctx_error(ctx));
    for (int k = 0; k < 4 * 5; k++) REQ(isfinite(y[k]), "variant %d: output %d", v, k);
    dp_ctx_free(ctx);
    dp_plan_free(p);
  }
  dp_model_free(m);
}
END_TEST

START_TEST(random_inference_plans_without_loss_keep_every_invariant) {
  rng_state = 0x1234567;
  for (int it = 0; it < 150; it++) {
    dp_model *m = random_model(10, 0);
    dp_config c = random_config(40, 6);
    c.inference = 1;
    dp_plan *p = plan_of(m, &c);
    check_plan(p);
    dp_plan_free(p);
    dp_model_free(m);
  }
}
END_TEST

START_TEST(deep_models_with_many_micro_batches_keep_every_invariant) {
  rng_state = 99;
  for (int it = 0; it < 40; it++) {
    dp_model *m = random_model(24, 1);
    dp_config c = config_of(64, 1 << rnd(4), DP_OPT_SGD);
    c.micro_batch = 1 + (int)rnd(8);
    c.split = (dp_split)rnd(2);
    dp_plan *p = plan_of(m, &c);
    check_plan(p);
    dp_plan_free(p);
    dp_model_free(m);
  }
}
END_TEST

START_TEST(smaller_batches_keep_the_planned_cut_points_and_fit) {
  rng_state = 0xC0FFEE;
  for (int it = 0; it < 200; it++) {
    dp_model *m = random_model(6, 1);
    dp_config c = random_config(40, 8);
    dp_plan *p = plan_of(m, &c);
    int B = c.batch,
        rows[] = {1, B / 2 + 1, B > 1 ? B - 1 : 1, 1 + (int)rnd((uint32_t)B), B};
    for (size_t j = 0; j < sizeof rows / sizeof *rows; j++) {
      if (!c.inference) check_smaller_batch(p, rows[j], 1);
      check_smaller_batch(p, rows[j], 0); /* dp_forward on any context */
    }
    dp_plan_free(p);
    dp_model_free(m);
  }
}
END_TEST

START_TEST(grad_partials_hold_only_the_slots_the_tree_uses) {
  /* 3 micro-batches on one device: the tree is ((0, 1), 2), which needs one
   * partial slot besides the grads, not two. */
  dp_model *m = model_of("input 4\nlinear 3\nloss mse\n");
  for (int n_mb = 1; n_mb <= 17; n_mb++) {
    dp_config c = config_of(2 * n_mb, 1, DP_OPT_SGD);
    c.micro_batch = 2;
    dp_plan *p = plan_of(m, &c);
    int levels = 0; /* floor(log2(n_mb)): the right spine of the canonical tree */
    while ((2 << levels) <= n_mb) levels++;
    ck_assert_msg(dp_plan_region(p, 0, DP_REGION_GRAD_PARTIALS).size ==
                      (size_t)levels * dp__partial_stride(p),
                  "%d micro-batches: grad_partials %zu bytes, want %d slots", n_mb,
                  dp_plan_region(p, 0, DP_REGION_GRAD_PARTIALS).size, levels);
    check_grad_memory_is_exact(p);
    dp_plan_free(p);
  }
  dp_model_free(m);
}
END_TEST

START_TEST(inference_plans_are_smaller_than_training_plans) {
  rng_state = 4242;
  for (int it = 0; it < 200; it++) {
    dp_model *m = random_model(8, 1);
    dp_config c = random_config(48, 8);
    c.inference = 0;
    dp_plan *t = plan_of(m, &c);
    c.inference = 1;
    dp_plan *i = plan_of(m, &c);
    ck_assert_int_eq(dp_plan_n_devices(t), dp_plan_n_devices(i));
    for (int d = 0; d < dp_plan_n_devices(t); d++) {
      ck_assert_msg(dp_plan_device_bytes(i, d) < dp_plan_device_bytes(t, d),
                    "device %d: inference %zu >= training %zu", d,
                    dp_plan_device_bytes(i, d), dp_plan_device_bytes(t, d));
      ck_assert_uint_le(dp_plan_region(i, d, DP_REGION_ACTIVATIONS).size,
                        dp_plan_region(t, d, DP_REGION_ACTIVATIONS).size);
    }
    dp_plan_free(t);
    dp_plan_free(i);
    dp_model_free(m);
  }
}
END_TEST

START_TEST(inference_reuses_activation_memory) {
  /* A chain of equal-width layers: inference needs two live buffers at a time,
   * so its activations take two slots however deep the model. */
  dp_model *m = model_of("input 16\nlinear 16\nrelu\nlinear 16\ntanh\nlinear 16\nsigmoid\n"
                         "linear 16\ngelu\nlinear 16\nloss mse\n");
  dp_config c = config_of(8, 1, DP_OPT_SGD);
  c.inference = 1;
  dp_plan *p = plan_of(m, &c);
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_ACTIVATIONS).size, 2 * 8 * 16 * 4);
  dp_plan_free(p);
  c.inference = 0;
  p = plan_of(m, &c);
  ck_assert_uint_gt(dp_plan_region(p, 0, DP_REGION_ACTIVATIONS).size, 2 * 8 * 16 * 4);
  check_plan(p);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* ---- the liveness placer itself ---------------------------------------------- */

static void check_placement(const dp_live_buf *b, int n, size_t total) {
  size_t end = 0;
  for (int i = 0; i < n; i++) {
    if (b[i].size == 0) continue;
    REQ(b[i].offset % b[i].align == 0, "buffer %d at %zu, align %zu", i, b[i].offset,
        b[i].align);
    if (b[i].offset + b[i].size > end) end = b[i].offset + b[i].size;
    for (int j = i + 1; j < n; j++) {
      if (b[j].size == 0) continue;
      int together = b[i].first <= b[j].last && b[j].first <= b[i].last;
      int overlap =
          b[i].offset < b[j].offset + b[j].size && b[j].offset < b[i].offset + b[i].size;
      REQ(!(together && overlap), "buffers %d and %d are live together and overlap", i, j);
    }
  }
  REQ_EQ(total, end);
}

START_TEST(live_place_separates_buffers_live_together) {
  rng_state = 2024;
  for (int it = 0; it < 2000; it++) {
    int n = 1 + (int)rnd(40);
    dp_live_buf b[40], again[40];
    static const size_t aligns[] = {1, 4, 16, 64, 256};
    for (int i = 0; i < n; i++) {
      int f = (int)rnd(20);
      b[i] = (dp_live_buf){.size = rnd(8) ? 1 + rnd(5000) : 0,
                           .align = aligns[rnd(5)],
                           .first = f,
                           .last = f + (int)rnd(6)};
    }
    memcpy(again, b, sizeof b);
    size_t total = 0, total2 = 0;
    ck_assert_int_eq(dp__live_place(b, n, &total), DP_OK);
    check_placement(b, n, total);
    /* a pure function of its input */
    ck_assert_int_eq(dp__live_place(again, n, &total2), DP_OK);
    ck_assert_uint_eq(total, total2);
    for (int i = 0; i < n; i++) ck_assert_uint_eq(b[i].offset, again[i].offset);
    /* never worse than every buffer in its own slot with worst-case padding */
    size_t bound = 0;
    for (int i = 0; i < n; i++) bound += b[i].size ? b[i].size + b[i].align - 1 : 0;
    ck_assert_uint_le(total, bound);
  }
}
END_TEST

START_TEST(live_place_reuses_memory_of_dead_buffers) {
  /* A [0,1] 100 B and B [2,3] 50 B never meet: both at 0. C [1,2] 10 B meets
   * both: placed after A (the larger, placed first), at 100. */
  dp_live_buf b[3] = {{.size = 100, .align = 1, .first = 0, .last = 1},
                      {.size = 50, .align = 1, .first = 2, .last = 3},
                      {.size = 10, .align = 1, .first = 1, .last = 2}};
  size_t total = 0;
  ck_assert_int_eq(dp__live_place(b, 3, &total), DP_OK);
  ck_assert_uint_eq(b[0].offset, 0);
  ck_assert_uint_eq(b[1].offset, 0);
  ck_assert_uint_eq(b[2].offset, 100);
  ck_assert_uint_eq(total, 110);
  /* with 64-byte alignment C moves to 128 */
  for (int i = 0; i < 3; i++) b[i].align = 64;
  ck_assert_int_eq(dp__live_place(b, 3, &total), DP_OK);
  ck_assert_uint_eq(b[2].offset, 128);
  ck_assert_uint_eq(total, 138);
  /* a gap between two live buffers is reused when it is large enough */
  dp_live_buf g[4] = {{.size = 64, .align = 64, .first = 0, .last = 9},
                      {.size = 64, .align = 64, .first = 0, .last = 1},
                      {.size = 64, .align = 64, .first = 0, .last = 9},
                      {.size = 32, .align = 64, .first = 5, .last = 6}};
  ck_assert_int_eq(dp__live_place(g, 4, &total), DP_OK);
  ck_assert_uint_eq(g[0].offset, 0);
  ck_assert_uint_eq(g[1].offset, 64);
  ck_assert_uint_eq(g[2].offset, 128);
  ck_assert_uint_eq(g[3].offset, 64); /* g[1] is dead by then */
  ck_assert_uint_eq(total, 192);
}
END_TEST

START_TEST(live_place_handles_empty_and_refuses_too_many) {
  size_t total = 7;
  ck_assert_int_eq(dp__live_place(NULL, 0, &total), DP_OK);
  ck_assert_uint_eq(total, 0);
  static dp_live_buf many[DP_ACT_BUFS + 9];
  ck_assert_int_eq(dp__live_place(many, DP_ACT_BUFS + 9, &total), DP_ERR_INVALID);
}
END_TEST

START_TEST(live_place_overflow_is_reported) {
  dp_live_buf b[2] = {{.size = SIZE_MAX - 10, .align = 1, .first = 0, .last = 1},
                      {.size = 100, .align = 1, .first = 0, .last = 1}};
  size_t total = 0;
  ck_assert_int_eq(dp__live_place(b, 2, &total), DP_ERR_OVERFLOW);
}
END_TEST

/* ---- budget ---------------------------------------------------------------- */

/* Largest device arena of the plan at `batch`; SIZE_MAX when it cannot be planned. */
static size_t need_at(const dp_model *m, dp_config c, int batch) {
  c.batch = batch;
  dp_plan *p = NULL;
  if (dp_plan_create(m, &c, &p) != DP_OK) return SIZE_MAX;
  size_t need = max_device_bytes(p);
  dp_plan_free(p);
  return need;
}

static int max_batch_of(const dp_model *m, const dp_config *c, size_t budget, int cap) {
  int b = -1;
  dp_status s = dp_plan_max_batch(m, c, budget, cap, &b);
  ck_assert_msg(s == DP_OK, "%s", dp_last_error());
  ck_assert_int_ge(b, 0);
  ck_assert_int_le(b, cap);
  return b;
}

/* ---- dp_plan_fit ---- */

static const char FIT_SPEC[] = "input 64\nlinear 128\nrelu\nlinear 10\n"
                               "loss softmax_cross_entropy\n";

static size_t plan_bytes_of(const dp_model *m, const dp_config *c) {
  dp_plan *p = NULL;
  ck_assert_msg(dp_plan_create(m, c, &p) == DP_OK, "%s", dp_last_error());
  size_t b = max_device_bytes(p);
  if (dp_plan_host_bytes(p) > b) b = dp_plan_host_bytes(p);
  dp_plan_free(p);
  return b;
}

/* Classic AdamW on 4 devices needs more than 150 KiB on device 0; allreduce with
 * a sharded optimizer fits. Every candidate returned fits, as its own plan says,
 * they come fastest first, and the fields --fit may not change stay the caller's. */
START_TEST(fit_returns_fitting_configurations_fastest_first) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse(FIT_SPEC, "fit", &m), DP_OK);
  dp_config c = config_of(48, 4, DP_OPT_ADAMW);
  c.lr = 0.003f;
  const size_t budget = 150 * 1024;
  ck_assert_uint_gt(plan_bytes_of(m, &c), budget);
  dp_fit f[8];
  int n = -1;
  dp_status s =
      dp_plan_fit(m, &c, budget, DP_FIT_MODE | DP_FIT_SHARD | DP_FIT_SPLIT, NULL, f, 8, &n);
  ck_assert_msg(s == DP_OK, "%s", dp_last_error());
  ck_assert_int_ge(n, 1);
  for (int i = 0; i < n; i++) {
    ck_assert_uint_le(f[i].bytes, budget);
    ck_assert_uint_eq(plan_bytes_of(m, &f[i].config), f[i].bytes);
    ck_assert(f[i].est_ms > 0);
    if (i) ck_assert(f[i - 1].est_ms <= f[i].est_ms);
    ck_assert_int_eq(f[i].config.batch, 48);
    ck_assert(f[i].config.lr == 0.003f && f[i].config.optimizer == DP_OPT_ADAMW);
    ck_assert_int_eq(f[i].config.micro_batch, c.micro_batch);
  }
  ck_assert_int_eq(f[0].config.mode, DP_MODE_ALLREDUCE);
  ck_assert_int_eq(f[0].config.shard_optimizer, 1);
  /* without the shard, nothing fits */
  s = dp_plan_fit(m, &c, budget, DP_FIT_MODE | DP_FIT_SPLIT, NULL, f, 8, &n);
  ck_assert_int_eq(s, DP_ERR_RANGE);
  ck_assert_int_eq(n, 0);
  dp_model_free(m);
}
END_TEST

/* None fits: DP_ERR_RANGE naming the smallest configuration and the bytes it
 * misses by; out[0] is that configuration. */
START_TEST(fit_none_fits_names_the_smallest_and_the_shortfall) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse(FIT_SPEC, "fit", &m), DP_OK);
  dp_config c = config_of(64, 4, DP_OPT_ADAMW);
  dp_fit f[4];
  int n = -1;
  dp_status s =
      dp_plan_fit(m, &c, 150 * 1024, DP_FIT_ALL & ~DP_FIT_PRECISION, NULL, f, 4, &n);
  ck_assert_int_eq(s, DP_ERR_RANGE);
  ck_assert_int_eq(n, 0);
  size_t need = plan_bytes_of(m, &f[0].config);
  ck_assert_uint_eq(need, f[0].bytes);
  ck_assert_uint_gt(need, 150 * 1024);
  char want[64];
  snprintf(want, sizeof want, "%zu over", need - 150 * 1024);
  ck_assert_msg(strstr(dp_last_error(), "the smallest found needs") &&
                    strstr(dp_last_error(), want),
                "%s", dp_last_error());
  /* and the smallest is the smallest: no candidate needs less */
  for (int mode = 0; mode < 2; mode++)
    for (int sh = 0; sh < 2; sh++) {
      dp_config t = c;
      t.mode = mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC;
      t.shard_optimizer = sh && mode;
      ck_assert_uint_ge(plan_bytes_of(m, &t), need);
    }
  dp_model_free(m);
}
END_TEST

/* allow 0 tries the caller's configuration alone; micro-batches come in only when
 * allowed, and a smaller micro-batch is estimated slower (more ops, shorter GEMMs). */
START_TEST(fit_searches_only_what_it_is_allowed) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse(FIT_SPEC, "fit", &m), DP_OK);
  dp_config c = config_of(64, 2, DP_OPT_SGD);
  dp_fit f[64];
  int n = -1;
  ck_assert_int_eq(dp_plan_fit(m, &c, SIZE_MAX, 0, NULL, f, 64, &n), DP_OK);
  ck_assert_int_eq(n, 1);
  ck_assert_int_eq(f[0].config.mode, c.mode);
  ck_assert_int_eq(f[0].config.split, c.split);
  ck_assert_int_eq(dp_plan_fit(m, &c, SIZE_MAX, DP_FIT_MICRO_BATCH, NULL, f, 64, &n),
                   DP_OK);
  ck_assert_int_eq(n, 6); /* the chunk's 32 rows, and 1, 2, 4, 8, 16 */
  ck_assert_int_eq(f[0].config.micro_batch, 0);
  for (int i = 1; i < n; i++) {
    ck_assert_int_gt(f[i].config.micro_batch, 0);
    if (i > 1) ck_assert_int_lt(f[i].config.micro_batch, f[i - 1].config.micro_batch);
  }
  dp_model_free(m);
}
END_TEST

/* A GPT whose activations do not fit at any layout: recompute makes it fit, and the
 * chosen plan says so. */
START_TEST(fit_turns_to_recompute_when_nothing_else_fits) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse(GPT_SPEC, "gpt", &m), DP_OK);
  dp_config c = config_of(16, 2, DP_OPT_ADAMW);
  dp_fit f[4];
  int n = -1;
  dp_config r = c;
  r.mode = DP_MODE_ALLREDUCE;
  r.shard_optimizer = 1;
  r.recompute = 2;
  size_t with = plan_bytes_of(m, &r);
  r.recompute = 0;
  size_t without = plan_bytes_of(m, &r);
  ck_assert_uint_lt(with, without);
  size_t budget = (with + without) / 2;
  ck_assert_int_eq(
      dp_plan_fit(m, &c, budget, DP_FIT_MODE | DP_FIT_SHARD | DP_FIT_SPLIT, NULL, f, 4, &n),
      DP_ERR_RANGE);
  dp_status s = dp_plan_fit(
      m, &c, budget, DP_FIT_ALL & ~(DP_FIT_MICRO_BATCH | DP_FIT_PRECISION), NULL, f, 4, &n);
  ck_assert_msg(s == DP_OK, "%s", dp_last_error());
  ck_assert_int_ge(n, 1);
  ck_assert_int_gt(f[0].config.recompute, 0);
  ck_assert_uint_le(plan_bytes_of(m, &f[0].config), budget);
  dp_model_free(m);
}
END_TEST

/* A budget between the bf16 plan's bytes and the fp32 plan's: with
 * DP_FIT_PRECISION the fit is bf16 (and fits), without it none fits. */
START_TEST(fit_chooses_bf16_when_only_it_fits) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse(FIT_SPEC, "fit", &m), DP_OK);
  dp_config c = config_of(256, 2, DP_OPT_SGD);
  dp_config b = c;
  b.precision = DP_PRECISION_BF16;
  size_t fp32 = plan_bytes_of(m, &c), bf16 = plan_bytes_of(m, &b);
  ck_assert_uint_lt(bf16, fp32);
  size_t budget = (bf16 + fp32) / 2;
  dp_fit f[4];
  int n = -1;
  ck_assert_int_eq(dp_plan_fit(m, &c, budget, 0, NULL, f, 4, &n), DP_ERR_RANGE);
  dp_status s = dp_plan_fit(m, &c, budget, DP_FIT_PRECISION, NULL, f, 4, &n);
  ck_assert_msg(s == DP_OK, "%s", dp_last_error());
  ck_assert_int_eq(n, 1);
  ck_assert_int_eq(f[0].config.precision, DP_PRECISION_BF16);
  ck_assert_uint_eq(f[0].bytes, bf16);
  ck_assert_uint_le(plan_bytes_of(m, &f[0].config), budget);
  dp_model_free(m);
}
END_TEST

/* DP_FIT_BACKEND tries the backend's options that keep the results: with the
 * cpu backend's params=shared the replicas hold no parameters, so the memory
 * split moves rows to them and device 0's arena shrinks below a budget that
 * copies miss. An option the config names is the caller's: not varied. */
START_TEST(fit_tries_the_backends_options_that_keep_the_results) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse(FIT_SPEC, "fit", &m), DP_OK);
  dp_config c = config_of(64, 2, DP_OPT_SGD), sh = c;
  c.split = sh.split = DP_SPLIT_MEMORY;
  snprintf(sh.backend_options, sizeof sh.backend_options, "params=shared");
  size_t copies = plan_bytes_of(m, &c), shared = plan_bytes_of(m, &sh);
  ck_assert_uint_lt(shared, copies);
  c.split = DP_SPLIT_CHUNK;
  dp_fit f[8];
  int n = -1;
  ck_assert_int_eq(dp_plan_fit(m, &c, shared, DP_FIT_SPLIT, NULL, f, 8, &n), DP_ERR_RANGE);
  dp_status st = dp_plan_fit(m, &c, shared, DP_FIT_SPLIT | DP_FIT_BACKEND, NULL, f, 8, &n);
  ck_assert_msg(st == DP_OK, "%s", dp_last_error());
  ck_assert_int_ge(n, 1);
  for (int i = 0; i < n; i++) {
    ck_assert_str_eq(f[i].config.backend_options, "params=shared");
    ck_assert_uint_le(plan_bytes_of(m, &f[i].config), shared);
  }
  dp_config given = c;
  snprintf(given.backend_options, sizeof given.backend_options, "params=copy");
  ck_assert_int_eq(
      dp_plan_fit(m, &given, shared, DP_FIT_SPLIT | DP_FIT_BACKEND, NULL, f, 8, &n),
      DP_ERR_RANGE);
  ck_assert_msg(strstr(dp_last_error(), "params=copy"), "%s", dp_last_error());
  /* room for everything: allreduce with shared parameters does not plan, and
   * classic with them is estimated no slower than with copies (no broadcast) */
  st = dp_plan_fit(m, &c, SIZE_MAX / 2, DP_FIT_MODE | DP_FIT_BACKEND, NULL, f, 8, &n);
  ck_assert_msg(st == DP_OK, "%s", dp_last_error());
  ck_assert_int_eq(n, 3);
  double est[2] = {-1, -1};
  for (int i = 0; i < n; i++)
    if (f[i].config.mode == DP_MODE_CLASSIC)
      est[f[i].config.backend_options[0] != 0] = f[i].est_ms;
  ck_assert(est[0] > 0 && est[1] > 0 && est[1] <= est[0]);
  /* options not terminated within their array are refused, as dp_plan_create
   * refuses them (an outside check: the search read past the array and fitted
   * a copy cut to 127 bytes) */
  dp_config bad = c;
  memset(bad.backend_options, ' ', sizeof bad.backend_options);
  memcpy(bad.backend_options, "params=shared", 13);
  bad.backend_options[sizeof bad.backend_options - 1] = 'x';
  for (unsigned allow = 0; allow <= DP_FIT_BACKEND; allow += DP_FIT_BACKEND) {
    n = -1;
    ck_assert_int_eq(dp_plan_fit(m, &bad, SIZE_MAX / 2, allow, NULL, f, 8, &n),
                     DP_ERR_INVALID);
    ck_assert_msg(strstr(dp_last_error(), "not terminated") && n == 0, "%s",
                  dp_last_error());
  }
  dp_model_free(m);
}
END_TEST

/* The cost model follows the cpu backend's executor, which runs the large
 * elementwise passes (reduction, check, update) on every device thread: with a
 * batch of 2 rows and 1 MB of parameters, the classic step on 2 devices is
 * estimated faster than on 1 (counted on device 0 alone, the reduction and
 * broadcast would make it slower). */
START_TEST(fit_estimates_count_shared_passes_on_every_thread) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse("input 512\nlinear 512\nrelu\nlinear 4\n"
                                  "loss softmax_cross_entropy\n",
                                  "fit", &m),
                   DP_OK);
  double est[2];
  for (int k = 0; k < 2; k++) {
    dp_config c = config_of(2, k + 1, DP_OPT_MOMENTUM);
    dp_fit f[1];
    int n = 0;
    ck_assert_int_eq(dp_plan_fit(m, &c, SIZE_MAX / 2, 0, NULL, f, 1, &n), DP_OK);
    ck_assert_int_eq(n, 1);
    est[k] = f[0].est_ms;
  }
  ck_assert_msg(est[1] < est[0], "2 devices %g ms, 1 device %g ms", est[1], est[0]);
  dp_model_free(m);
}
END_TEST

START_TEST(fit_refuses_bad_arguments) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse(FIT_SPEC, "fit", &m), DP_OK);
  dp_config c = config_of(8, 2, DP_OPT_SGD);
  dp_fit f[2];
  int n = 0;
  ck_assert_int_eq(dp_plan_fit(NULL, &c, 1024, 0, NULL, f, 2, &n), DP_ERR_INVALID);
  ck_assert_int_eq(dp_plan_fit(m, &c, 1024, 1u << 20, NULL, f, 2, &n), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "unknown bits"));
  dp_fit_costs k;
  dp_fit_costs_default(&k);
  k.gflops = 0;
  ck_assert_int_eq(dp_plan_fit(m, &c, 1024, 0, &k, f, 2, &n), DP_ERR_INVALID);
  dp_fit_costs_default(&k);
  k.mem_gbs = NAN;
  ck_assert_int_eq(dp_plan_fit(m, &c, 1024, 0, &k, f, 2, &n), DP_ERR_INVALID);
  /* finite costs are taken however large, though their sum is not finite (an
   * outside check, session 24) */
  dp_fit_costs_default(&k);
  k.gflops = k.mem_gbs = 1e308;
  ck_assert_msg(dp_plan_fit(m, &c, SIZE_MAX, DP_FIT_MODE, &k, f, 2, &n) == DP_OK, "%s",
                dp_last_error());
  ck_assert_int_gt(n, 0);
  k.op_us = INFINITY;
  ck_assert_int_eq(dp_plan_fit(m, &c, 1024, 0, &k, f, 2, &n), DP_ERR_INVALID);
  c.batch = 0; /* the planner's own refusal comes through */
  ck_assert_int_eq(dp_plan_fit(m, &c, SIZE_MAX, 0, NULL, f, 2, &n), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "no configuration could be planned"));
  dp_model_free(m);
}
END_TEST

START_TEST(max_batch_is_exact) {
  rng_state = 31337;
  for (int it = 0; it < 60; it++) {
    dp_model *m = random_model(6, 1);
    dp_config c = random_config(32, 6);
    c.backend = DP_BACKEND_CPU;
    if (c.micro_batch > 4) c.micro_batch = 4;
    int cap = 1 + (int)rnd(48);
    size_t lo = need_at(m, c, 1), hi = need_at(m, c, cap);
    size_t budget = lo + (hi > lo ? (size_t)rnd((uint32_t)(hi - lo + 1)) : 0);
    if (rnd(8) == 0) budget = hi + 1000;
    int b = max_batch_of(m, &c, budget, cap);
    ck_assert_int_ge(b, 1);
    ck_assert_msg(need_at(m, c, b) <= budget, "batch %d does not fit %zu", b, budget);
    if (b < cap)
      ck_assert_msg(need_at(m, c, b + 1) > budget, "batch %d fits %zu too", b + 1, budget);
    /* and no larger batch fits either: the search assumes monotonic sizes */
    for (int bb = b + 1; bb <= cap; bb++)
      ck_assert_msg(need_at(m, c, bb) > budget, "batch %d fits %zu but max_batch said %d",
                    bb, budget, b);
    dp_model_free(m);
  }
}
END_TEST

/* Allreduce plans can shrink as the batch grows (more devices in use: smaller
 * optimizer shards, receive buffers and trees), so the largest batch that fits
 * is not found by bisection over the whole range. Checked against every batch. */
START_TEST(max_batch_is_the_largest_that_fits_when_sizes_dip) {
  rng_state = 4242;
  for (int it = 0; it < 80; it++) {
    dp_model *m = random_model(5, 1);
    dp_config c = config_of(1, 1 + (int)rnd(8), DP_OPT_SGD);
    c.mode = DP_MODE_ALLREDUCE;
    c.shard_optimizer = (int)rnd(2);
    c.split = (dp_split)rnd(3);
    c.micro_batch = rnd(2) ? 0 : 1 + (int)rnd(5);
    dp_config_set_optimizer(&c, (dp_optimizer)rnd(3));
    int cap = 1 + (int)rnd(90);
    size_t need[91], lo = SIZE_MAX, hi = 0;
    for (int b = 1; b <= cap; b++) {
      need[b] = need_at(m, c, b);
      lo = need[b] < lo ? need[b] : lo;
      hi = need[b] > hi ? need[b] : hi;
    }
    size_t budget = lo + (size_t)rnd((uint32_t)(hi - lo + 1)) - (rnd(8) == 0);
    int want = 0;
    for (int b = 1; b <= cap; b++)
      if (need[b] <= budget) want = b;
    ck_assert_int_eq(max_batch_of(m, &c, budget, cap), want);
    dp_model_free(m);
  }
}
END_TEST

/* The two cases of the report that found the dip (issue 12). */
START_TEST(max_batch_finds_batches_beyond_a_dip) {
  dp_model *m = model_of("input 1000\nlinear 1000\nrelu\nlinear 10\n"
                         "loss softmax_cross_entropy\n");
  dp_config c = config_of(1, 4, DP_OPT_SGD);
  c.mode = DP_MODE_ALLREDUCE;
  c.shard_optimizer = 1;
  dp_config_set_optimizer(&c, DP_OPT_ADAMW);
  /* the report's budget, 13209600, was batch 4's plan; now 2,026,112 B less:
   * the relu's output gradient has no buffer (its backward runs in the next
   * linear's grad-input product: 4032 B), and neither has the reduction (the
   * cpu transport adds the partner's half in place: 2,022,080 B) */
  ck_assert_uint_eq(need_at(m, c, 4), 11183488);
  ck_assert_uint_gt(need_at(m, c, 1), 13209600); /* batch 1 uses one device: all state */
  int b = max_batch_of(m, &c, 13209600, 200);
  ck_assert_int_ge(b, 4);
  ck_assert_uint_le(need_at(m, c, b), 13209600);
  for (int bb = b + 1; bb <= 200; bb++) ck_assert_uint_gt(need_at(m, c, bb), 13209600);
  c.n_devices = 8;
  c.micro_batch = 4;
  /* (a device with two micro-batches also holds the forward's packed weights,
   * 4 MB here: cpu_backend.c packed_wt) */
  ck_assert_uint_eq(need_at(m, c, 96), 18413376);
  ck_assert_uint_gt(need_at(m, c, 40), 18413376); /* the dip: a smaller batch needs more */
  b = max_batch_of(m, &c, 18413376, 200);
  ck_assert_int_ge(b, 96);
  for (int bb = b + 1; bb <= 200; bb++) ck_assert_uint_gt(need_at(m, c, bb), 18413376);
  dp_model_free(m);
}
END_TEST

START_TEST(plan_size_grows_with_the_batch) {
  rng_state = 5150;
  for (int it = 0; it < 40; it++) {
    dp_model *m = random_model(8, 1);
    dp_config c = random_config(8, 8);
    if (c.micro_batch > 6) c.micro_batch = 6;
    size_t prev = 0;
    for (int b = 1; b <= 48; b++) {
      size_t need = need_at(m, c, b);
      ck_assert_msg(need >= prev, "batch %d needs %zu < %zu at batch %d", b, need, prev,
                    b - 1);
      prev = need;
    }
    dp_model_free(m);
  }
}
END_TEST

START_TEST(max_batch_grows_with_the_budget) {
  dp_model *m = model_of("input 32\nlinear 64\nlayernorm\ngelu\nlinear 10\n"
                         "loss softmax_cross_entropy\n");
  dp_config c = config_of(1, 4, DP_OPT_SGD);
  dp_config_set_optimizer(&c, DP_OPT_ADAMW);
  int prev = 0;
  for (size_t budget = 0; budget < 200000; budget += 1777) {
    int b = max_batch_of(m, &c, budget, 512);
    ck_assert_int_ge(b, prev);
    prev = b;
  }
  ck_assert_int_gt(prev, 1);
  dp_model_free(m);
}
END_TEST

START_TEST(max_batch_is_zero_below_the_smallest_plan) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(1, 2, DP_OPT_SGD);
  size_t one = need_at(m, c, 1);
  ck_assert_int_eq(max_batch_of(m, &c, one - 1, 100), 0);
  ck_assert_int_eq(max_batch_of(m, &c, 0, 100), 0);
  ck_assert_int_ge(max_batch_of(m, &c, one, 100), 1);
  ck_assert_int_eq(max_batch_of(m, &c, SIZE_MAX, 100), 100); /* capped by max_batch */
  dp_model_free(m);
}
END_TEST

START_TEST(max_batch_of_the_seed_budget) {
  /* 1536 B per device is the seed plan's device 0 (batch 30, 2 devices);
   * batch 30 must fit and the answer must be the largest that does. */
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  int b = max_batch_of(m, &c, 1536, 1000);
  ck_assert_int_ge(b, 30);
  ck_assert_uint_le(need_at(m, c, b), 1536);
  ck_assert_uint_gt(need_at(m, c, b + 1), 1536);
  ck_assert_int_eq(max_batch_of(m, &c, 1535, 1000) < 30, 1);
  dp_model_free(m);
}
END_TEST

START_TEST(max_batch_refuses_bad_arguments) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(1, 2, DP_OPT_SGD);
  int b = 5;
  ck_assert_int_eq(dp_plan_max_batch(m, &c, 4096, 0, &b), DP_ERR_INVALID);
  ck_assert_int_eq(dp_plan_max_batch(NULL, &c, 4096, 10, &b), DP_ERR_INVALID);
  ck_assert_int_eq(dp_plan_max_batch(m, NULL, 4096, 10, &b), DP_ERR_INVALID);
  ck_assert_int_eq(dp_plan_max_batch(m, &c, 4096, 10, NULL), DP_ERR_INVALID);
  c.shard_optimizer = 1; /* classic mode: refused */
  ck_assert_int_eq(dp_plan_max_batch(m, &c, 4096, 10, &b), DP_ERR_INVALID);
  c = config_of(1, 0, DP_OPT_SGD);
  ck_assert_int_eq(dp_plan_max_batch(m, &c, 4096, 10, &b), DP_ERR_INVALID);
  dp_model_free(m);
}
END_TEST

/* ---- schedule ---------------------------------------------------------------- */

typedef struct {
  dp_phase phase;
  dp_op_kind kind;
  int device, layer, mb;
  int src_dev, src_region;
  size_t src_offset;
  int dst_dev, dst_region;
  size_t dst_offset, bytes;
  int row0, rows;
} op_want;

START_TEST(seed_schedule_is_exact) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  dp_plan *p = plan_of(m, &c);
  enum { H = DP_HOST, X = -2 }; /* X: not checked */
  static const op_want want[] = {
      /* replicas refreshed from device 0: 12 floats */
      {DP_PHASE_BROADCAST, DP_OP_COPY, X, -1, -1, 0, DP_REGION_PARAMS, 0, 1,
       DP_REGION_PARAMS, 0, 48, X, X},
      /* x rows 0..14 and 15..29, 15 x 5 x 4 = 300 B each; targets 30 x 2 x 4 */
      {DP_PHASE_SCATTER, DP_OP_COPY, X, -1, -1, H, DP_REGION_INPUTS, 0, 0, DP_REGION_INPUTS,
       0, 300, 0, 15},
      {DP_PHASE_SCATTER, DP_OP_COPY, X, -1, -1, H, DP_REGION_INPUTS, 300, 1,
       DP_REGION_INPUTS, 0, 300, 15, 15},
      {DP_PHASE_SCATTER, DP_OP_COPY, X, -1, -1, H, DP_REGION_TARGETS, 0, 0,
       DP_REGION_TARGETS, 0, 240, 0, 30},
      {DP_PHASE_FORWARD, DP_OP_FORWARD, 0, 0, 0, X, X, X, X, X, X, 120, 0, 15},
      {DP_PHASE_FORWARD, DP_OP_FORWARD, 1, 0, 1, X, X, X, X, X, X, 120, 15, 15},
      /* outputs 15 x 2 x 4 = 120 B each, concatenated on device 0 */
      {DP_PHASE_GATHER, DP_OP_COPY, X, -1, -1, 0, DP_REGION_OUTPUTS, 0, 0,
       DP_REGION_GATHERED_OUTPUTS, 0, 120, 0, 15},
      {DP_PHASE_GATHER, DP_OP_COPY, X, -1, -1, 1, DP_REGION_OUTPUTS, 0, 0,
       DP_REGION_GATHERED_OUTPUTS, 120, 120, 15, 15},
      /* loss terms over the gathered rows, then the sum of the 2 micro-batches' sums */
      {DP_PHASE_LOSS, DP_OP_LOSS, 0, -1, 0, X, X, X, X, X, X, 240, 0, 30},
      {DP_PHASE_LOSS, DP_OP_LOSS_SUM, 0, -1, 0, X, DP_REGION_LOSS, X, X, X, X, 8, X, 30},
      {DP_PHASE_SCATTER_GRADS, DP_OP_COPY, X, -1, -1, 0, DP_REGION_GATHERED_GRADS, 0, 0,
       DP_REGION_OUTPUT_GRADS, 0, 120, 0, 15},
      {DP_PHASE_SCATTER_GRADS, DP_OP_COPY, X, -1, -1, 0, DP_REGION_GATHERED_GRADS, 120, 1,
       DP_REGION_OUTPUT_GRADS, 0, 120, 15, 15},
      {DP_PHASE_BACKWARD, DP_OP_BACKWARD, 0, 0, 0, X, X, X, 0, DP_REGION_GRADS, 0, 48, 0,
       15},
      {DP_PHASE_BACKWARD, DP_OP_BACKWARD, 1, 0, 1, X, X, X, 1, DP_REGION_GRADS, 0, 48, 15,
       15},
      /* device 1's 48 B of grads added into device 0's in one pass (the cpu
       * transport reads them in place; cuda copies them into a comm buffer
       * and adds there) */
      {DP_PHASE_REDUCE, DP_OP_COPY_ADD, 0, -1, -1, 1, DP_REGION_GRADS, 0, 0,
       DP_REGION_GRADS, 0, 48, X, X},
      {DP_PHASE_OPTIMIZER, DP_OP_GRAD_CHECK, 0, -1, -1, X, DP_REGION_GRADS, 0, X, X, X, 48,
       X, X},
      {DP_PHASE_OPTIMIZER, DP_OP_OPTIMIZER, 0, -1, -1, X, X, X, X, DP_REGION_PARAMS, 0, 48,
       X, X},
  };
  int n = (int)(sizeof want / sizeof *want);
  ck_assert_int_eq(dp_plan_n_ops(p), n);
  const dp_op *ops = dp_plan_ops(p);
  for (int i = 0; i < n; i++) {
    const dp_op *o = &ops[i];
    const op_want *w = &want[i];
#define EQ(field, v)                                                                       \
  do {                                                                                     \
    if ((long long)(v) != (long long)X)                                                    \
      ck_assert_msg((long long)o->field == (long long)(v),                                 \
                    "op %d (%s %s): " #field " %lld, want %lld", i,                        \
                    dp_phase_name(o->phase), dp_op_kind_name(o->kind),                     \
                    (long long)o->field, (long long)(v));                                  \
  } while (0)
    EQ(phase, w->phase);
    EQ(kind, w->kind);
    EQ(device, w->device);
    EQ(layer, w->layer);
    EQ(micro_batch, w->mb);
    EQ(src_dev, w->src_dev);
    EQ(src_region, w->src_region);
    EQ(src_offset, (long long)w->src_offset);
    EQ(dst_dev, w->dst_dev);
    EQ(dst_region, w->dst_region);
    EQ(dst_offset, (long long)w->dst_offset);
    EQ(bytes, (long long)w->bytes);
    EQ(row0, w->row0);
    EQ(rows, w->rows);
#undef EQ
    if (i > 0) ck_assert_int_ge(o->stage, ops[i - 1].stage);
  }
  /* one stage per phase, except that the gradient check gets a stage of its
   * own before the update: ten stages */
  ck_assert_int_eq(ops[0].stage, 0);
  ck_assert_int_eq(ops[n - 1].stage, DP_PHASE_COUNT);
  for (int i = 0; i < n; i++)
    ck_assert_int_eq(ops[i].stage, ops[i].phase + (ops[i].kind == DP_OP_OPTIMIZER));
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* The reduction of a 4-device classic plan: device 1 into 0 and 3 into 2
 * (distance 1), then 2 into 0. Between devices of one process the cpu
 * transport adds in place (COPY_ADD, no receive buffer); across processes
 * (ranks) a copy into the receiver's comm region and a GRAD_ADD there. */
static void expect_reduce_pairs(int ranks, const bool *fused_at_level) {
  dp_model *m = model_of("input 6\nlinear 5\nrelu\nlinear 3\nloss mse\n");
  dp_config c = config_of(32, 4, DP_OPT_SGD);
  c.micro_batch = 2; /* 16 micro-batches, 4 per device */
  c.ranks = ranks;
  dp_plan *p = plan_of(m, &c);
  if (ranks > 1) { /* a plan of several processes: dp_ctx_create refuses it, *out NULL */
    dp_ctx *ctx = (dp_ctx *)(uintptr_t)1;
    ck_assert_int_eq(dp_ctx_create(p, &ctx), DP_ERR_INVALID);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(strstr(dp_last_error(), "dp_ctx_create_mpi"), "%s", dp_last_error());
  }
  size_t P = (6 * 5 + 5 + 5 * 3 + 3) * 4; /* 53 params */
  const dp_op *ops = dp_plan_ops(p);
  int n_pair = 0, first_stage = -1;
  static const int want_src[] = {1, 3, 2}, want_dst[] = {0, 2, 0}, want_level[] = {0, 0, 1};
  size_t comm[4] = {0};
  for (int i = 0; i < dp_plan_n_ops(p); i++) {
    const dp_op *o = &ops[i];
    if (o->phase != DP_PHASE_REDUCE || (o->kind != DP_OP_COPY && o->kind != DP_OP_COPY_ADD))
      continue;
    ck_assert_int_lt(n_pair, 3);
    int lv = want_level[n_pair];
    ck_assert_int_eq(o->kind, fused_at_level[lv] ? DP_OP_COPY_ADD : DP_OP_COPY);
    ck_assert_int_eq(o->device, want_dst[n_pair]);
    ck_assert_int_eq(o->src_dev, want_src[n_pair]);
    ck_assert_int_eq(o->dst_dev, want_dst[n_pair]);
    ck_assert_int_eq(o->src_region, DP_REGION_GRADS);
    ck_assert_uint_eq(o->bytes, P);
    if (first_stage < 0) first_stage = o->stage;
    ck_assert_int_eq(o->stage, first_stage + lv); /* distance 1, then 2 */
    if (o->kind == DP_OP_COPY_ADD) {
      ck_assert_int_eq(o->dst_region, DP_REGION_GRADS);
    } else { /* the next op adds the received grads on the receiver */
      ck_assert_int_eq(o->dst_region, DP_REGION_COMM);
      ck_assert_int_eq(ops[i + 1].kind, DP_OP_GRAD_ADD);
      ck_assert_int_eq(ops[i + 1].device, want_dst[n_pair]);
      ck_assert_int_eq(ops[i + 1].src_region, DP_REGION_COMM);
      ck_assert_int_eq(ops[i + 1].dst_region, DP_REGION_GRADS);
      comm[want_dst[n_pair]] = P;
    }
    n_pair++;
  }
  ck_assert_int_eq(n_pair, 3);
  /* comm buffers only where something is received through a copy */
  for (int d = 0; d < 4; d++)
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_COMM).size, comm[d]);
  check_plan(p);
  dp_plan_free(p);
  dp_model_free(m);
}

START_TEST(reduce_pairs_devices_at_distance_one_then_two) {
  expect_reduce_pairs(1, (const bool[]){true, true});  /* one process: all in place */
  expect_reduce_pairs(2, (const bool[]){true, false}); /* 0-1 | 2-3: level 1 crosses */
  expect_reduce_pairs(4, (const bool[]){false, false});
}
END_TEST

START_TEST(backward_sums_each_device_block_as_a_subtree) {
  dp_model *m = model_of("input 6\nlinear 5\nrelu\nlinear 3\nloss mse\n");
  dp_config c = config_of(32, 4, DP_OPT_SGD);
  c.micro_batch = 2;
  dp_plan *p = plan_of(m, &c);
  ck_assert_uint_eq(p->model.n_params, 53);
  const dp_op *ops = dp_plan_ops(p);
  /* Device d owns micro-batches 4d..4d+3. Its tree over [lo, lo+4) splits at
   * lo+2, then at lo+1 and lo+3: slot 0 = grads, slot k = partial k-1.
   *   mb lo -> slot 0; mb lo+1 -> slot 1; slot 0 += slot 1;
   *   mb lo+2 -> slot 1; mb lo+3 -> slot 2; slot 1 += slot 2; slot 0 += slot 1 */
  for (int d = 0; d < 4; d++) {
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_GRAD_PARTIALS).size,
                      2 * dp__partial_stride(p));
    struct {
      int kind, mb, slot, src_slot;
    } want[] = {{DP_OP_BACKWARD, 0, 0, 0},  {DP_OP_BACKWARD, 1, 1, 0},
                {DP_OP_GRAD_ADD, -1, 0, 1}, {DP_OP_BACKWARD, 2, 1, 0},
                {DP_OP_BACKWARD, 3, 2, 0},  {DP_OP_GRAD_ADD, -1, 1, 2},
                {DP_OP_GRAD_ADD, -1, 0, 1}};
    int w = 0, layer_next = 2;
    for (int i = 0; i < dp_plan_n_ops(p); i++) {
      const dp_op *o = &ops[i];
      if (o->phase != DP_PHASE_BACKWARD || o->device != d) continue;
      ck_assert_int_lt(w, 7);
      ck_assert_int_eq(o->kind, want[w].kind);
      int slot = o->dst_region == DP_REGION_GRADS
                     ? 0
                     : (int)(o->dst_offset / dp__partial_stride(p)) + 1;
      ck_assert_int_eq(slot, want[w].slot);
      if (o->kind == DP_OP_BACKWARD) {
        ck_assert_int_eq(o->micro_batch, 4 * d + want[w].mb);
        ck_assert_int_eq(o->layer, layer_next); /* layers last to first */
        ck_assert_int_eq(o->rows, 2);
        if (--layer_next < 0) {
          layer_next = 2;
          w++;
        }
      } else {
        int src = o->src_region == DP_REGION_GRADS
                      ? 0
                      : (int)(o->src_offset / dp__partial_stride(p)) + 1;
        ck_assert_int_eq(src, want[w].src_slot);
        w++;
      }
    }
    ck_assert_int_eq(w, 7);
  }
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(backward_tree_splits_three_micro_batches_as_01_then_2) {
  /* [0, 3) splits at mid = (0 + 3 + 1) / 2 = 2: ((0, 1), 2), the larger half left */
  dp_model *m = model_of(SEED);
  dp_config c = config_of(6, 1, DP_OPT_SGD);
  c.micro_batch = 2;
  dp_plan *p = plan_of(m, &c);
  struct {
    int kind, mb, dst_region;
  } want[] = {{DP_OP_BACKWARD, 0, DP_REGION_GRADS},
              {DP_OP_BACKWARD, 1, DP_REGION_GRAD_PARTIALS},
              {DP_OP_GRAD_ADD, -1, DP_REGION_GRADS},
              {DP_OP_BACKWARD, 2, DP_REGION_GRAD_PARTIALS},
              {DP_OP_GRAD_ADD, -1, DP_REGION_GRADS}};
  const dp_op *ops = dp_plan_ops(p);
  int w = 0;
  for (int i = 0; i < dp_plan_n_ops(p); i++) {
    if (ops[i].phase != DP_PHASE_BACKWARD) continue;
    ck_assert_int_lt(w, 5);
    ck_assert_int_eq(ops[i].kind, want[w].kind);
    ck_assert_int_eq(ops[i].micro_batch, want[w].mb);
    ck_assert_int_eq(ops[i].dst_region, want[w].dst_region);
    ck_assert_uint_eq(ops[i].dst_offset, 0);
    if (ops[i].kind == DP_OP_GRAD_ADD) {
      ck_assert_int_eq(ops[i].src_region, DP_REGION_GRAD_PARTIALS);
      ck_assert_uint_eq(ops[i].src_offset, 0);
    }
    w++;
  }
  ck_assert_int_eq(w, 5);
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_GRAD_PARTIALS).size,
                    dp__partial_stride(p)); /* one slot: 48 bytes, aligned up */
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

static int collect_merges(const dp_plan *p, merge3 *out) {
  size_t P = p->model.n_params * 4;
  int n = 0, L = p->model.n_layers;
  mbrange slots[DP_MAX_DEVICES][8], comm[DP_MAX_DEVICES];
  memset(slots, 0, sizeof slots);
  const dp_op *ops = dp_plan_ops(p);
  for (int i = 0; i < dp_plan_n_ops(p); i++) {
    const dp_op *o = &ops[i];
#define SLOT(region, off)                                                                  \
  ((region) == DP_REGION_COMM                                                              \
       ? &comm[o->device]                                                                  \
       : &slots[o->device][(region) == DP_REGION_GRADS ? 0 : 1 + (off) / P])
    if (o->kind == DP_OP_BACKWARD && o->layer == L - 1)
      *SLOT(o->dst_region, o->dst_offset) = (mbrange){o->micro_batch, o->micro_batch + 1};
    if (o->kind == DP_OP_COPY && o->phase == DP_PHASE_REDUCE)
      comm[o->dst_dev] = slots[o->src_dev][0];
    if (o->kind == DP_OP_GRAD_ADD) {
      mbrange *d = SLOT(o->dst_region, o->dst_offset),
              *s = SLOT(o->src_region, o->src_offset);
      ck_assert_int_eq(d->hi, s->lo);
      out[n++] = (merge3){d->lo, d->hi, s->hi};
      d->hi = s->hi;
    }
    if (o->kind == DP_OP_COPY_ADD) { /* the other device's sum, in place */
      mbrange *d = &slots[o->dst_dev][0], *s = &slots[o->src_dev][0];
      ck_assert_int_eq(d->hi, s->lo);
      out[n++] = (merge3){d->lo, d->hi, s->hi};
      d->hi = s->hi;
    }
#undef SLOT
  }
  qsort(out, (size_t)n, sizeof *out, cmp_merge3);
  return n;
}

START_TEST(gradient_tree_is_the_same_for_1_2_4_8_devices) {
  /* Fixed micro-batches, N a power of two dividing their count: every device
   * count must perform exactly the same additions (the canonical tree), which
   * is what makes the results bit-identical across device counts. */
  dp_model *m = model_of("input 3\nlinear 4\nrelu\nlinear 2\nloss mse\n");
  static const int Ms[] = {8, 16, 24, 64};
  for (size_t j = 0; j < sizeof Ms / sizeof *Ms; j++) {
    int M = Ms[j];
    merge3 ref[128], got[128];
    int n_ref = -1;
    for (int N = 1; N <= 8; N *= 2) {
      dp_config c = config_of(2 * M, N, DP_OPT_SGD);
      c.micro_batch = 2;
      dp_plan *p = plan_of(m, &c);
      int n = collect_merges(p, got);
      ck_assert_int_eq(n, M - 1); /* a binary tree over M leaves */
      if (n_ref < 0) {
        memcpy(ref, got, sizeof got);
        n_ref = n;
        /* and it is the canonical tree: [lo, hi) splits at (lo + hi + 1) / 2 */
        for (int k = 0; k < n; k++)
          ck_assert_int_eq(got[k].mid, (got[k].lo + got[k].hi + 1) / 2);
      } else {
        ck_assert_int_eq(n, n_ref);
        for (int k = 0; k < n; k++)
          ck_assert_msg(
              got[k].lo == ref[k].lo && got[k].mid == ref[k].mid && got[k].hi == ref[k].hi,
              "M=%d N=%d: addition %d is [%d,%d)+[%d,%d), with one device [%d,%d)+[%d,%d)",
              M, N, k, got[k].lo, got[k].mid, got[k].mid, got[k].hi, ref[k].lo, ref[k].mid,
              ref[k].mid, ref[k].hi);
      }
      dp_plan_free(p);
    }
  }
  dp_model_free(m);
}
END_TEST

START_TEST(inference_schedule_has_no_training_phases) {
  dp_model *m = model_of("input 6\nlinear 5\nlayernorm\nrelu\nlinear 3\nloss mse\n");
  dp_config c = config_of(32, 4, DP_OPT_SGD);
  c.micro_batch = 2;
  c.inference = 1;
  dp_plan *p = plan_of(m, &c);
  const dp_op *ops = dp_plan_ops(p);
  int n_fwd = 0;
  for (int i = 0; i < dp_plan_n_ops(p); i++) {
    ck_assert_int_ne(ops[i].kind, DP_OP_LOSS);
    ck_assert_int_ne(ops[i].kind, DP_OP_BACKWARD);
    ck_assert_int_ne(ops[i].kind, DP_OP_GRAD_ADD);
    ck_assert_int_ne(ops[i].kind, DP_OP_OPTIMIZER);
    ck_assert_int_ne(ops[i].phase, DP_PHASE_REDUCE);
    ck_assert_int_ne(ops[i].phase, DP_PHASE_SCATTER_GRADS);
    if (ops[i].kind == DP_OP_COPY) ck_assert_int_ne(ops[i].src_region, DP_REGION_TARGETS);
    if (ops[i].phase == DP_PHASE_GATHER) ck_assert_int_eq(ops[i].dst_dev, DP_HOST);
    n_fwd += ops[i].kind == DP_OP_FORWARD;
  }
  ck_assert_int_eq(n_fwd, 16 * 4);
  check_plan(p);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(single_device_plans_have_no_transfers_between_devices) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 1, DP_OPT_SGD);
  dp_plan *p = plan_of(m, &c);
  const dp_op *ops = dp_plan_ops(p);
  for (int i = 0; i < dp_plan_n_ops(p); i++) {
    ck_assert_int_ne(ops[i].phase, DP_PHASE_BROADCAST);
    ck_assert_int_ne(ops[i].phase, DP_PHASE_REDUCE);
  }
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_COMM).size, 0);
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_LOSS).size, 4);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* ---- configuration errors ------------------------------------------------------- */

static void plan_refused(const dp_model *m, const dp_config *c, dp_status want,
                         const char *needle) {
  dp_plan *p = (dp_plan *)(uintptr_t)1;
  dp_status s = dp_plan_create(m, c, &p);
  ck_assert_msg(s == want, "status %s (%s), want %s", dp_status_name(s), dp_last_error(),
                dp_status_name(want));
  ck_assert_ptr_null(p);
  ck_assert_msg(strstr(dp_last_error(), needle) != NULL, "'%s' lacks '%s'", dp_last_error(),
                needle);
}

/* Projection shortcuts (f(x) + g(x)) through every plan invariant, the
 * liveness simulation included: x lives to g's first layer, f's output to the
 * end's forward, the shortcut's own gradient (g's input's) from g's first
 * backward to the begin's; with a plain block nested in f and in g, several
 * micro-batches, training and inference; a guarded context trains with its
 * guards intact; a block on the model's input keeps no shortcut gradient
 * (recompute: recompute_plans_keep_every_invariant; sync batchnorm:
 * sync_bn_residual_plans_keep_every_invariant). */
START_TEST(shortcut_plans_keep_every_invariant_with_guards_and_micro_batches) {
  dp_model *m = model_of(RESNET_PROJ_SPEC);
  int s = 16, x = 7; /* the shortcut, the owner of its block's input */
  ck_assert_int_eq(m->layers[s].kind, DP_LAYER_SHORTCUT);
  for (size_t k = 0; k < N_LAYOUTS; k++) {
    dp_config c = layout_config(k, DP_OPT_MOMENTUM);
    dp_plan *p = plan_of(m, &c);
    if (c.mode == DP_MODE_CLASSIC) {
      check_plan(p);
    } else {
      for (int d = 0; d < dp_plan_n_devices(p); d++) check_act_layout(p, d);
      sched_view v = plan_view(p);
      for (int d = 0; d < dp_plan_n_devices(p); d++) check_liveness_by_simulation(p, &v, d);
    }
    for (int d = 0; d < dp_plan_n_devices(p); d++) {
      ck_assert_uint_eq(p->act[d].act[s], p->act[d].act[x]); /* a view of x */
      if (LAYOUTS[k].inf)
        ck_assert_uint_eq(p->act[d].dact[s], SIZE_MAX);
      else
        ck_assert_uint_ne(p->act[d].dact[s], p->act[d].dact[x]); /* its own */
    }
    for (int rows = 1; rows < 11 && c.mode == DP_MODE_CLASSIC; rows += 4)
      check_smaller_batch(p, rows, !LAYOUTS[k].inf);
    dp_plan_free(p);
    c.guards = 1;
    p = plan_of(m, &c);
    dp_ctx *ctx = ctx_of(p);
    float in[11 * 192], out[11 * 5];
    int32_t t[11];
    for (int i = 0; i < 11 * 192; i++) in[i] = (float)((i * 7) % 13) / 6.0f - 1.0f;
    for (int i = 0; i < 11; i++) t[i] = (i * 3) % 5;
    for (int st = 0; st < 2 && !LAYOUTS[k].inf; st++)
      ck_assert_msg(dp_train_step(ctx, 11, 192, in, t, NULL) == DP_OK, "%s",
                    dp_ctx_error(ctx));
    ck_assert_int_eq(dp_forward(ctx, 11, 192, in, out), DP_OK);
    for (int i = 0; i < 11 * 5; i++) ck_assert(isfinite(out[i]));
    ck_assert_msg(dp_ctx_check_guards(ctx) == DP_OK, "case %zu: %s", k, dp_ctx_error(ctx));
    dp_ctx_free(ctx);
    dp_plan_free(p);
  }
  dp_model_free(m);
  dp_config c;
  /* on the model's input: g's first layer has no input gradient to write */
  m = model_of("input 1 4 4\nresidual\nconv2d 2 3 padding 1\nrelu\nshortcut\n"
               "conv2d 2 1\nend\nflatten\nlinear 3\nloss mse\n");
  for (int inf = 0; inf < 2; inf++) {
    c = config_of(6, 2, DP_OPT_SGD);
    c.micro_batch = 2;
    c.inference = inf;
    dp_plan *p = plan_of(m, &c);
    check_plan(p);
    ck_assert_uint_eq(p->act[0].dact[3], SIZE_MAX);
    dp_plan_free(p);
  }
  dp_model_free(m);
}
END_TEST

/* Sync batchnorm inside residual blocks through every plan invariant, the
 * liveness simulation included: the backward stops at each batchnorm for the
 * whole batch's sums, so a block's skip gradient (a plain block's end's
 * output gradient, a shortcut's, f's output's) that a batchnorm's segments
 * cut holds all of the device's micro-batches from its writer's segment to
 * its reader's, as the batchnorm's own does; the ResNet (identity block,
 * projection block with batchnorm in f and g, nested blocks) and the MLP of
 * RESNET_MLP_SPEC, in every layout, with and without recompute, at the
 * planned batch and smaller ones. */
START_TEST(sync_bn_residual_plans_keep_every_invariant) {
  static const char *const specs[] = {RESNET_PROJ_SPEC, RESNET_MLP_SPEC};
  for (size_t sp = 0; sp < 2; sp++) {
    dp_model *m = model_of(specs[sp]);
    int n_all = 0; /* skip gradients that hold every micro-batch */
    for (size_t k = 0; k < N_LAYOUTS; k++)
      for (int rc = 0; rc <= 3; rc += rc ? 1 : 2) {
        dp_config c = layout_config(k, DP_OPT_MOMENTUM);
        c.batchnorm = DP_BN_SYNC;
        c.recompute = LAYOUTS[k].inf ? 0 : rc;
        dp_plan *p = plan_of(m, &c);
        if (c.mode == DP_MODE_CLASSIC) {
          check_plan(p);
          for (int rows = 1; rows < 11; rows += 4)
            check_smaller_batch(p, rows, !c.inference);
        } else {
          for (int d = 0; d < dp_plan_n_devices(p); d++) check_act_layout(p, d);
          sched_view v = plan_view(p);
          for (int d = 0; d < dp_plan_n_devices(p); d++)
            check_liveness_by_simulation(p, &v, d);
        }
        ck_assert_int_eq(dp__plan_verify(p), DP_OK);
        for (int i = 0; i < m->n_layers; i++)
          n_all +=
              !is_sync_bn(p, i) && dact_all_rows(p, i) && p->act[0].dact[i] != SIZE_MAX;
        dp_plan_free(p);
      }
    ck_assert_int_gt(n_all, 0);
    dp_model_free(m);
  }
}
END_TEST

/* A tied head with sync batchnorm on the sequence (dp__leaf_slots): every
 * micro-batch of a device has a gradient slot of its own, n_mb - 1 partials
 * (not one per level of the tree), sized exactly, in every layout; per
 * replica keeps the tree's levels. */
START_TEST(tied_head_with_sync_batchnorm_gives_each_micro_batch_a_slot) {
  dp_model *m = model_of("input tokens 6\nembed 11 8\nresidual\nlinear 24 nobias\n"
                         "attention 2\nlinear 8 nobias\nbatchnorm\nend\nbatchnorm\n"
                         "linear 11 tied\nloss softmax_cross_entropy\n");
  int wide = 0; /* devices with 3 or more micro-batches, where the two differ */
  for (size_t k = 0; k < N_LAYOUTS; k++)
    for (int bn = 0; bn < 2; bn++) {
      dp_config c = layout_config(k, DP_OPT_ADAMW);
      c.batchnorm = bn ? DP_BN_SYNC : DP_BN_PER_REPLICA;
      dp_plan *p = plan_of(m, &c);
      if (c.mode == DP_MODE_CLASSIC) { /* as the GPT's: check_plan knows classic's */
        check_plan(p);
      } else {
        sched_view v = plan_view(p);
        for (int d = 0; d < dp_plan_n_devices(p); d++)
          check_liveness_by_simulation(p, &v, d);
      }
      ck_assert_int_eq(dp__plan_verify(p), DP_OK);
      for (int d = 0; d < dp_plan_n_devices(p) && !c.inference; d++) {
        int n = dp_plan_device_micro_batches(p, d), levels = 0;
        while ((2 << levels) <= n) levels++;
        size_t want = (size_t)(bn ? (n > 1 ? n - 1 : 0) : levels) * dp__partial_stride(p);
        ck_assert_msg(dp_plan_region(p, d, DP_REGION_GRAD_PARTIALS).size == want,
                      "layout %zu, %s, device %d (%d micro-batches): %zu bytes, want %zu",
                      k, bn ? "sync" : "per_replica", d, n,
                      dp_plan_region(p, d, DP_REGION_GRAD_PARTIALS).size, want);
        wide += bn && n >= 3;
      }
      dp_plan_free(p);
    }
  ck_assert_int_gt(wide, 0);
  dp_model_free(m);
}
END_TEST

/* The cuda-only options are refused on the cpu backend, and NCCL needs a GPU
 * per replica; the refusal names the option. */
START_TEST(cuda_options_are_checked_at_plan_time) {
  if (!cuda_or_skip("planner", "cuda_options_are_checked_at_plan_time")) return;
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  c.cuda_graph = 1;
  plan_refused(m, &c, DP_ERR_INVALID, "cuda_graph is a cuda backend option");
  c.cuda_graph = 0;
  c.tf32 = 1;
  plan_refused(m, &c, DP_ERR_INVALID, "tf32 is a cuda backend option");
  c.tf32 = 0;
  c.transport = DP_TRANSPORT_NCCL;
  plan_refused(m, &c, DP_ERR_INVALID, "transport is a cuda backend option");
  c.backend = DP_BACKEND_CUDA;
  c.device_ids[1] = 0; /* two replicas on GPU 0 */
  plan_refused(m, &c, DP_ERR_INVALID, "replicas 0 and 1 are both on GPU 0");
  c.transport = (dp_transport)7;
  plan_refused(m, &c, DP_ERR_INVALID,
               "config.transport is 7; the cuda backend's option transport takes "
               "auto|copy|nccl");
  c.transport = DP_TRANSPORT_AUTO;
  c.device_ids[1] = -2;
  plan_refused(m, &c, DP_ERR_INVALID, "device_ids[1] is -2");
  c.device_ids[1] = 0; /* replicas sharing a GPU plan fine with copies */
  c.cuda_graph = c.tf32 = 1;
  dp_plan *p = plan_of(m, &c);
  ck_assert_int_eq(dp_plan_n_devices(p), 2);
  dp_plan_free(p);
  c.cuda_graph = 2;
  plan_refused(m, &c, DP_ERR_INVALID, "config.cuda_graph is 2");
  c.cuda_graph = 0;
  c.fast_collectives = 1; /* classic mode */
  plan_refused(m, &c, DP_ERR_INVALID, "fast_collectives needs allreduce mode");
  c.mode = DP_MODE_ALLREDUCE; /* replicas 0 and 1 share GPU 0 */
  plan_refused(m, &c, DP_ERR_INVALID, "replicas 0 and 1 are both on GPU 0");
  c.device_ids[1] = 1;
  c.transport = DP_TRANSPORT_COPY;
  plan_refused(m, &c, DP_ERR_INVALID, "and the NCCL transport");
  c.transport = DP_TRANSPORT_AUTO;
  c.backend = DP_BACKEND_CPU;
  c.tf32 = 0;
  plan_refused(m, &c, DP_ERR_INVALID, "fast_collectives is a cuda backend option");
  dp_model_free(m);
}
END_TEST

/* Backend options as text (dp_config.backend_options): parsed against the
 * backend's own table, refused with the backend's list when unknown, printed
 * back with every default, hashed like the deprecated fields they replace. */
START_TEST(backend_options_are_the_backends_own) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  snprintf(c.backend_options, sizeof c.backend_options, "graph=1");
  plan_refused(m, &c, DP_ERR_INVALID,
               "backend option 'graph': the cpu backend has the option params");
  const char *name = "x", *values = "x", *help = "x";
  ck_assert_int_eq(dp_backend_option_info(DP_BACKEND_CPU, 0, &name, &values, &help), DP_OK);
  ck_assert_str_eq(name, "params");
  ck_assert_str_eq(values, "copy|shared");
  ck_assert_int_eq(dp_backend_option_info(DP_BACKEND_CPU, 1, &name, &values, &help),
                   DP_ERR_RANGE);
  ck_assert_ptr_null(name);
  c.backend_options[0] = '\0';
  dp_plan *p = plan_of(m, &c);
  char text[DP_BACKEND_OPTIONS_CAP] = "junk";
  ck_assert_int_eq(dp_plan_backend_options(p, text, sizeof text), DP_OK);
  ck_assert_str_eq(text, "params=copy");
  dp_plan_free(p);
  if (!cuda_or_skip("planner", "backend_options_are_the_backends_own")) {
    dp_model_free(m);
    return;
  }
  c.backend = DP_BACKEND_CUDA;
  int n = 0;
  while (dp_backend_option_info(DP_BACKEND_CUDA, n, &name, &values, &help) == DP_OK) n++;
  ck_assert_int_eq(n, 4);
  ck_assert_int_eq(dp_backend_option_info(DP_BACKEND_CUDA, 2, &name, &values, &help),
                   DP_OK);
  ck_assert_str_eq(name, "transport");
  ck_assert_str_eq(values, "auto|copy|nccl");
  ck_assert_ptr_nonnull(help);
  snprintf(c.backend_options, sizeof c.backend_options, " tf32=1, graph=1 ");
  p = plan_of(m, &c);
  ck_assert_int_eq(dp_plan_backend_options(p, text, sizeof text), DP_OK);
  ck_assert_str_eq(text, "graph=1 tf32=1 transport=auto fast_collectives=0");
  ck_assert_int_eq(dp_plan_backend_options(p, text, 0), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_last_error(), "cap is 0"), "%s", dp_last_error());
  uint64_t h = dp_plan_hash(p);
  dp_plan_free(p);
  c.backend_options[0] = '\0';
  c.cuda_graph = c.tf32 = 1; /* the deprecated fields: the same plan */
  p = plan_of(m, &c);
  ck_assert_uint_eq(dp_plan_hash(p), h);
  dp_plan_free(p);
  snprintf(c.backend_options, sizeof c.backend_options, "tf32=0");
  plan_refused(m, &c, DP_ERR_INVALID, "config.tf32 (1) and backend option tf32 disagree");
  c.cuda_graph = c.tf32 = 0;
  static const struct {
    const char *text, *needle;
  } bad[] = {
      {"graph=2", "backend option 'graph=2': graph takes 0|1"},
      {"nope=1",
       "the cuda backend has the options graph, tf32, transport, fast_collectives"},
      {"graph", "backend option 'graph' is not name=value"},
      {"=1", "backend option '=1' is not name=value"},
      {"graph=1,graph=0", "backend option graph is given twice"},
      {"transport=nccl,graph=1", "cuda_graph with the NCCL transport is refused"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    snprintf(c.backend_options, sizeof c.backend_options, "%s", bad[i].text);
    plan_refused(m, &c, DP_ERR_INVALID, bad[i].needle);
  }
  memset(c.backend_options, 'a', sizeof c.backend_options); /* no NUL */
  plan_refused(m, &c, DP_ERR_INVALID, "not terminated");
  dp_model_free(m);
}
END_TEST

/* fast_collectives: the reduction is one ALLREDUCE op per device in a stage of
 * its own, in place (no COMM buffer), and nothing else moves gradients. */
START_TEST(fast_collectives_schedule_one_allreduce_per_device) {
  if (!cuda_or_skip("planner", "fast_collectives_schedule_one_allreduce_per_device"))
    return;
  dp_model *m = model_of(SEED);
  for (int n = 2; n <= 3; n++) {
    dp_config c = config_of(30, n, DP_OPT_SGD);
    c.backend = DP_BACKEND_CUDA;
    c.mode = DP_MODE_ALLREDUCE;
    c.fast_collectives = 1;
    dp_plan *p = plan_of(m, &c);
    int n_ar = 0, stage = -1;
    for (int k = 0; k < dp_plan_n_ops(p); k++) {
      dp_op op = dp_plan_ops(p)[k];
      if (op.kind == DP_OP_ALLREDUCE) {
        ck_assert_int_eq(op.device, n_ar);
        ck_assert_uint_eq(op.bytes, 48);
        ck_assert(op.dst_region == DP_REGION_GRADS && op.dst_offset == 0);
        if (stage < 0) stage = op.stage;
        ck_assert_int_eq(op.stage, stage);
        n_ar++;
      }
      ck_assert(op.phase != DP_PHASE_REDUCE || op.kind == DP_OP_ALLREDUCE);
    }
    ck_assert_int_eq(n_ar, n);
    for (int d = 0; d < n; d++)
      ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_COMM).size, 0);
    ck_assert_str_eq(dp_op_kind_name(DP_OP_ALLREDUCE), "allreduce");
    dp_plan_free(p);
  }
  dp_model_free(m);
}
END_TEST

START_TEST(batch_zero_is_refused) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(0, 2, DP_OPT_SGD);
  plan_refused(m, &c, DP_ERR_INVALID, "batch");
  c.batch = -3;
  plan_refused(m, &c, DP_ERR_INVALID, "batch");
  dp_model_free(m);
}
END_TEST

START_TEST(device_count_out_of_range_is_refused) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 0, DP_OPT_SGD);
  plan_refused(m, &c, DP_ERR_INVALID, "device count 0");
  c.n_devices = DP_MAX_DEVICES + 1;
  plan_refused(m, &c, DP_ERR_INVALID, "device count 65");
  c.n_devices = DP_MAX_DEVICES; /* 64 is fine */
  c.batch = 64;
  dp_plan *p = plan_of(m, &c);
  ck_assert_int_eq(dp_plan_n_devices(p), 64);
  check_plan(p);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(sharded_optimizer_needs_allreduce) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  c.shard_optimizer = 1;
  plan_refused(m, &c, DP_ERR_INVALID, "allreduce");
  dp_model_free(m);
}
END_TEST

START_TEST(training_without_a_loss_is_refused) {
  dp_model *m = model_of("input 5\nlinear 2\n");
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  plan_refused(m, &c, DP_ERR_INVALID, "loss");
  c.inference = 1;
  dp_plan *p = plan_of(m, &c);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* torch.optim.Adam keeps AdamW's two moments: the same layout, exactly; PyTorch's
 * defaults (weight_decay 0), and its own rules: no lr * weight_decay bound (the
 * decay is an L2 term in the gradient), eps > 0, no SGD settings. A sharded
 * optimizer gives each device two vectors of its shard. */
START_TEST(adam_layout_and_rules) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  dp_config_set_optimizer(&c, DP_OPT_ADAM);
  ck_assert(c.weight_decay == 0.0f && c.beta1 == 0.9f && c.beta2 == 0.999f &&
            c.eps == 1e-8f);
  ck_assert(c.momentum == 0.0f && c.dampening == 0.0f && c.nesterov == 0);
  c.weight_decay = 50.0f; /* lr 0.01: lr * wd = 0.5, and 5 for AdamW below */
  c.lr = 0.1f;
  dp_plan *p = plan_of(m, &c);
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_OPT_STATE).size, 96); /* 2 x 12 x 4 */
  ck_assert_uint_eq(dp_plan_region(p, 1, DP_REGION_OPT_STATE).size, 0);
  ck_assert_int_eq(dp_plan_config(p)->optimizer, DP_OPT_ADAM);
  dp_plan_free(p);
  c.optimizer = DP_OPT_ADAMW;
  plan_refused(m, &c, DP_ERR_INVALID, "lr * weight_decay is 5");
  c = config_of(30, 2, DP_OPT_SGD);
  dp_config_set_optimizer(&c, DP_OPT_ADAM);
  c.momentum = 0.9f;
  plan_refused(m, &c, DP_ERR_INVALID, "SGD settings; Adam takes beta1");
  c.momentum = 0.0f;
  c.eps = 0.0f;
  plan_refused(m, &c, DP_ERR_INVALID, "Adam needs eps > 0");
  c = config_of(30, 4, DP_OPT_SGD);
  dp_config_set_optimizer(&c, DP_OPT_ADAM);
  c.mode = DP_MODE_ALLREDUCE;
  c.shard_optimizer = 1;
  p = plan_of(m, &c);
  for (int d = 0; d < 4; d++) /* 12 parameters in shards of 3 */
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_OPT_STATE).size, 2 * 3 * 4);
  dp_plan_free(p);
  c.optimizer = (dp_optimizer)(DP_OPT_ADAM + 1);
  plan_refused(m, &c, DP_ERR_INVALID, "unknown optimizer 4");
  dp_model_free(m);
}
END_TEST

/* config.amsgrad: v_hat is a third state vector (Adam and AdamW, whole and
 * sharded, before accumulate's partial sums), 0 or 1, refused for SGD and
 * momentum (PyTorch's SGD has none), ignored by an inference plan; reset by
 * dp_config_set_optimizer (PyTorch's default), and in the plan's hash. */
START_TEST(amsgrad_layout_and_rules) {
  dp_model *m = model_of(SEED); /* 12 parameters */
  for (int o = DP_OPT_ADAMW; o <= DP_OPT_ADAM; o++) {
    dp_config c = config_of(30, 2, DP_OPT_SGD);
    c.amsgrad = 1;
    dp_config_set_optimizer(&c, (dp_optimizer)o);
    ck_assert_int_eq(c.amsgrad, 0);
    dp_plan *p = plan_of(m, &c);
    uint64_t plain = dp_plan_hash(p);
    ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_OPT_STATE).size, 2 * 12 * 4);
    dp_plan_free(p);
    c.amsgrad = 1;
    p = plan_of(m, &c);
    ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_OPT_STATE).size, 3 * 12 * 4);
    ck_assert_uint_eq(dp_plan_region(p, 1, DP_REGION_OPT_STATE).size, 0);
    ck_assert_int_eq(dp_plan_config(p)->amsgrad, 1);
    ck_assert_uint_ne(dp_plan_hash(p), plain);
    dp_plan_free(p);
    c.accumulate = 4; /* two partial-sum levels after the three vectors */
    p = plan_of(m, &c);
    ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_OPT_STATE).size, 5 * 12 * 4);
    dp_plan_free(p);
    c = config_of(30, 4, (dp_optimizer)o);
    c.mode = DP_MODE_ALLREDUCE;
    c.shard_optimizer = 1;
    c.amsgrad = 1;
    p = plan_of(m, &c);
    for (int d = 0; d < 4; d++) /* 12 parameters in shards of 3 */
      ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_OPT_STATE).size, 3 * 3 * 4);
    dp_plan_free(p);
    c.amsgrad = 2;
    plan_refused(m, &c, DP_ERR_INVALID, "amsgrad must be 0 or 1, got 2");
  }
  static const dp_optimizer others[] = {DP_OPT_SGD, DP_OPT_MOMENTUM};
  for (int i = 0; i < 2; i++) {
    dp_config c = config_of(30, 2, others[i]);
    c.amsgrad = 1;
    plan_refused(m, &c, DP_ERR_INVALID, "amsgrad is an Adam and AdamW setting");
    c.inference = 1; /* an inference plan ignores the optimizer's settings */
    dp_plan *p = plan_of(m, &c);
    ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_OPT_STATE).size, 0);
    dp_plan_free(p);
  }
  dp_model_free(m);
}
END_TEST

/* config.clip_grad_value: finite and >= 0, not with clip_grad_norm; one clamp
 * of each updating device's range after the reduction, before the check. */
START_TEST(clip_grad_value_rules_and_ops) {
  dp_model *m = model_of(SEED);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  const float bad[] = {-1.0f, NAN, INFINITY};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    c.clip_grad_value = bad[i];
    plan_refused(m, &c, DP_ERR_INVALID, "clip_grad_value must be finite and >= 0");
  }
  c.clip_grad_value = 0.5f;
  c.clip_grad_norm = 1.0f;
  plan_refused(m, &c, DP_ERR_INVALID, "clip_grad_norm 1 and clip_grad_value 0.5: give one");
  c.clip_grad_norm = 0.0f;
  const struct {
    dp_mode mode;
    int shard, n_dev, clamps;
  } lay[] = {{DP_MODE_CLASSIC, 0, 2, 1},
             {DP_MODE_ALLREDUCE, 0, 2, 2},
             {DP_MODE_ALLREDUCE, 1, 2, 2},
             {DP_MODE_ALLREDUCE, 0, 3, 3}};
  for (size_t l = 0; l < sizeof lay / sizeof *lay; l++) {
    c.mode = lay[l].mode;
    c.shard_optimizer = lay[l].shard;
    c.n_devices = lay[l].n_dev;
    dp_plan *p = plan_of(m, &c);
    int n_ops = 0, clamps = 0, first_check = -1, last_clamp = -1;
    const dp_op *ops = dp_plan_ops(p);
    n_ops = dp_plan_n_ops(p);
    size_t bytes = 0;
    for (int k = 0; k < n_ops; k++) {
      if (ops[k].kind == DP_OP_GRAD_CLAMP) {
        clamps++;
        last_clamp = k;
        bytes += ops[k].bytes;
        ck_assert_int_eq(ops[k].dst_region, DP_REGION_GRADS);
      }
      if (ops[k].kind == DP_OP_GRAD_CHECK && first_check < 0) first_check = k;
    }
    ck_assert_int_eq(clamps, lay[l].clamps);
    ck_assert_uint_eq(bytes, (lay[l].shard || lay[l].mode == DP_MODE_CLASSIC ? 1 : clamps) *
                                 12 * 4);
    ck_assert_int_lt(last_clamp, first_check);
    dp_plan_free(p);
  }
  c.clip_grad_value = 0.0f;
  dp_plan *p = plan_of(m, &c);
  int n_ops = 0;
  const dp_op *ops = dp_plan_ops(p);
  n_ops = dp_plan_n_ops(p);
  for (int k = 0; k < n_ops; k++) ck_assert_int_ne(ops[k].kind, DP_OP_GRAD_CLAMP);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(other_bad_configs_are_refused) {
  dp_model *m = model_of(SEED), *empty = model_of("input 5\n");
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  c.micro_batch = -1;
  plan_refused(m, &c, DP_ERR_INVALID, "micro-batch");
  c = config_of(30, 2, DP_OPT_SGD);
  dp_config_set_optimizer(&c, (dp_optimizer)9);
  plan_refused(m, &c, DP_ERR_INVALID, "optimizer");
  c = config_of(30, 2, DP_OPT_SGD);
  c.backend = (dp_backend)9;
  plan_refused(m, &c, DP_ERR_INVALID, "backend");
  c = config_of(30, 2, DP_OPT_SGD);
  c.mode = (dp_mode)9;
  plan_refused(m, &c, DP_ERR_INVALID, "mode");
  c = config_of(30, 2, DP_OPT_SGD);
  c.split = (dp_split)9;
  plan_refused(m, &c, DP_ERR_INVALID, "split");
  c = config_of(30, 2, DP_OPT_SGD);
  c.lr = 0.0f;
  plan_refused(m, &c, DP_ERR_INVALID, "learning rate");
  c.lr = NAN;
  plan_refused(m, &c, DP_ERR_INVALID, "learning rate");
  c = config_of(30, 2, DP_OPT_SGD);
  dp_config_set_optimizer(&c, DP_OPT_MOMENTUM);
  c.momentum = 1.0f;
  plan_refused(m, &c, DP_ERR_INVALID, "momentum");
  c = config_of(30, 2, DP_OPT_SGD);
  dp_config_set_optimizer(&c, DP_OPT_ADAMW);
  c.beta2 = 1.0f;
  plan_refused(m, &c, DP_ERR_INVALID, "Adam(W) beta2");
  c = config_of(30, 2, DP_OPT_SGD);
  c.inference = 1;
  plan_refused(empty, &c, DP_ERR_INVALID, "no layers");
  dp_plan *p = (dp_plan *)(uintptr_t)1;
  ck_assert_int_eq(dp_plan_create(NULL, &c, &p), DP_ERR_INVALID);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(dp_plan_create(m, NULL, &p), DP_ERR_INVALID);
  ck_assert_int_eq(dp_plan_create(m, &c, NULL), DP_ERR_INVALID);
  dp_model_free(m);
  dp_model_free(empty);
}
END_TEST

/* Hyper-parameters: finite, in PyTorch's ranges, and none the optimizer would
 * silently ignore; each refusal names the setting (issue 12, items 3 and 8). */
START_TEST(hyper_parameters_are_refused_when_not_finite_or_contradictory) {
  dp_model *m = model_of(SEED);
  const struct {
    dp_optimizer opt;
    int field; /* 0 lr, 1 weight_decay, 2 momentum, 3 dampening, 4 eps */
    float v;
    const char *needle;
  } bad[] = {
      {DP_OPT_SGD, 0, INFINITY, "learning rate"},
      {DP_OPT_ADAMW, 0, NAN, "learning rate"},
      {DP_OPT_SGD, 0, -1.0f, "learning rate"},
      {DP_OPT_SGD, 1, NAN, "weight_decay"},
      {DP_OPT_SGD, 1, INFINITY, "weight_decay"},
      {DP_OPT_SGD, 1, -1.0f, "weight_decay"},
      {DP_OPT_ADAMW, 1, -1.0f, "weight_decay"},
      {DP_OPT_ADAMW, 1, 3e38f, "weight_decay"},
      {DP_OPT_MOMENTUM, 2, NAN, "momentum"},
      {DP_OPT_MOMENTUM, 2, 0.0f, "momentum > 0"},
      {DP_OPT_SGD, 3, 0.5f, "dampening"},
      {DP_OPT_MOMENTUM, 3, 1.5f, "dampening"},
      {DP_OPT_ADAMW, 2, 0.9f, "SGD settings"},
      {DP_OPT_ADAMW, 4, 0.0f, "eps"},
      {DP_OPT_ADAMW, 4, -INFINITY, "eps"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    dp_config c = config_of(30, 2, DP_OPT_SGD);
    dp_config_set_optimizer(&c, bad[i].opt);
    float *f[] = {&c.lr, &c.weight_decay, &c.momentum, &c.dampening, &c.eps};
    *f[bad[i].field] = bad[i].v;
    plan_refused(m, &c, DP_ERR_INVALID, bad[i].needle);
  }
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  c.inference = 7; /* the flags are 0 or 1 */
  plan_refused(m, &c, DP_ERR_INVALID, "inference must be 0 or 1, got 7");
  c.inference = -1;
  plan_refused(m, &c, DP_ERR_INVALID, "inference must be 0 or 1, got -1");
  c.inference = 0;
  c.shard_optimizer = 2;
  plan_refused(m, &c, DP_ERR_INVALID, "shard_optimizer must be 0 or 1, got 2");
  c.shard_optimizer = 0;
  c.nesterov = 1; /* needs momentum */
  plan_refused(m, &c, DP_ERR_INVALID, "nesterov");
  c.momentum = 0.9f;
  c.dampening = 0.1f; /* and no dampening */
  plan_refused(m, &c, DP_ERR_INVALID, "nesterov");
  c.dampening = 0.0f;
  dp_plan *p = plan_of(m, &c); /* SGD with momentum: a momentum buffer */
  ck_assert_int_eq(dp_plan_config(p)->optimizer, DP_OPT_MOMENTUM);
  ck_assert_uint_eq(dp_plan_region(p, 0, DP_REGION_OPT_STATE).size,
                    dp_model_n_params(m) * 4);
  dp_plan_free(p);
  c.inference = 1; /* an inference plan has no optimizer: nothing to check */
  c.lr = NAN;
  p = plan_of(m, &c);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(config_defaults_are_as_documented) {
  dp_config c;
  memset(&c, 0x5a, sizeof c);
  dp_config_default(&c);
  ck_assert_int_eq(c.batch, 0);
  ck_assert_int_eq(c.n_devices, 1);
  ck_assert_int_eq(c.split, DP_SPLIT_CHUNK);
  ck_assert_int_eq(c.mode, DP_MODE_CLASSIC);
  ck_assert_int_eq(c.optimizer, DP_OPT_SGD);
  ck_assert_int_eq(c.inference, 0);
  ck_assert_int_eq(c.backend, DP_BACKEND_CPU);
  ck_assert_int_eq(c.micro_batch, 0);
  for (int i = 0; i < DP_MAX_DEVICES; i++) ck_assert_int_eq(c.device_ids[i], i);
  /* torch.optim.SGD's defaults, plain values (no sentinels) */
  ck_assert(c.lr == 0.01f && c.momentum == 0.0f && c.dampening == 0.0f && c.nesterov == 0 &&
            c.weight_decay == 0.0f && c.beta1 == 0.9f && c.beta2 == 0.999f &&
            c.eps == 1e-8f);
  /* dp_config_set_optimizer: PyTorch's defaults of the optimizer it selects */
  dp_config a = c;
  dp_config_set_optimizer(&a, DP_OPT_ADAMW);
  ck_assert(a.optimizer == DP_OPT_ADAMW && a.weight_decay == 0.01f && a.momentum == 0.0f &&
            a.lr == 0.01f);
  dp_config_set_optimizer(&a, DP_OPT_MOMENTUM);
  ck_assert(a.momentum == 0.9f && a.weight_decay == 0.0f);
  dp_config_set_optimizer(&a, DP_OPT_SGD);
  ck_assert(a.momentum == 0.0f && a.weight_decay == 0.0f);
  dp_model *m = model_of(SEED);
  c.batch = 4;
  dp_plan *p = plan_of(m, &c);
  ck_assert(dp_plan_config(p)->weight_decay == 0.0f);
  ck_assert_int_eq(dp_plan_model(p)->layers[0].kind, DP_LAYER_LINEAR);
  ck_assert_uint_eq(dp_plan_alignment(p), 64); /* cpu; every region starts on it */
  for (int r = 0; r < DP_REGION_COUNT; r++)
    ck_assert_uint_eq(dp_plan_region(p, 0, (dp_region)r).offset % 64, 0);
  ck_assert_uint_eq(dp_plan_alignment(NULL), 0);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(names_cover_every_enum) {
  for (int r = 0; r < DP_REGION_COUNT; r++)
    ck_assert_str_ne(dp_region_name((dp_region)r), "?");
  ck_assert_str_eq(dp_region_name(DP_REGION_COUNT), "?");
  ck_assert_str_eq(dp_region_name(DP_REGION_OPT_STATE), "optimizer_state");
  for (int ph = 0; ph < DP_PHASE_COUNT; ph++)
    ck_assert_str_ne(dp_phase_name((dp_phase)ph), "?");
  ck_assert_str_eq(dp_phase_name(DP_PHASE_SCATTER_GRADS), "scatter_grads");
  ck_assert_str_eq(dp_op_kind_name(DP_OP_GRAD_ADD), "grad_add");
  ck_assert_str_eq(dp_op_kind_name((dp_op_kind)99), "?");
}
END_TEST

/* ---- memory split, allreduce, sharded optimizer ------------------------------------ */

static const char MLP[] =
    "input 64\nlinear 128\nrelu\nlinear 10\nloss softmax_cross_entropy\n";

static size_t peak_bytes(const dp_plan *p) {
  size_t mx = 0;
  for (int d = 0; d < dp_plan_n_devices(p); d++)
    if (dp_plan_device_bytes(p, d) > mx) mx = dp_plan_device_bytes(p, d);
  return mx;
}

START_TEST(memory_split_gives_device_0_fewer_rows_and_a_lower_peak) {
  /* Wide outputs make device 0's gathered buffers matter. */
  dp_model *m = model_of("input 32\nlinear 512\nloss mse\n");
  for (int N = 2; N <= 4; N++) {
    dp_config c = config_of(96, N, DP_OPT_SGD);
    dp_plan *chunk = plan_of(m, &c);
    c.split = DP_SPLIT_BALANCED;
    dp_plan *bal = plan_of(m, &c);
    c.split = DP_SPLIT_MEMORY;
    dp_plan *mem = plan_of(m, &c);
    int rows = 0;
    for (int d = 0; d < dp_plan_n_devices(mem); d++) rows += dp_plan_device_rows(mem, d);
    ck_assert_int_eq(rows, 96);
    ck_assert_int_lt(dp_plan_device_rows(mem, 0), dp_plan_device_rows(mem, 1));
    ck_assert_uint_lt(peak_bytes(mem), peak_bytes(chunk));
    ck_assert_uint_le(peak_bytes(mem), peak_bytes(bal));
    /* the arenas come out more even than under an even split of rows */
    size_t gap_mem = dp_plan_device_bytes(mem, 0) > dp_plan_device_bytes(mem, 1)
                         ? dp_plan_device_bytes(mem, 0) - dp_plan_device_bytes(mem, 1)
                         : dp_plan_device_bytes(mem, 1) - dp_plan_device_bytes(mem, 0);
    ck_assert_uint_lt(gap_mem, dp_plan_device_bytes(bal, 0) - dp_plan_device_bytes(bal, 1));
    dp_plan_free(chunk);
    dp_plan_free(bal);
    dp_plan_free(mem);
  }
  dp_model_free(m);
}
END_TEST

START_TEST(memory_split_with_fixed_micro_batches_deals_whole_micro_batches) {
  dp_model *m = model_of("input 32\nlinear 512\nloss mse\n");
  dp_config c = config_of(128, 4, DP_OPT_SGD);
  c.split = DP_SPLIT_MEMORY;
  c.micro_batch = 8;
  dp_plan *p = plan_of(m, &c);
  for (int d = 0; d < dp_plan_n_devices(p); d++)
    ck_assert_int_eq(dp_plan_device_rows(p, d) % 8, 0);
  ck_assert_int_lt(dp_plan_device_micro_batches(p, 0), dp_plan_device_micro_batches(p, 1));
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(allreduce_balances_memory_and_scatters_targets) {
  dp_model *m = model_of(MLP);
  dp_config c = config_of(64, 4, DP_OPT_SGD);
  c.mode = DP_MODE_ALLREDUCE;
  dp_config_set_optimizer(&c, DP_OPT_ADAMW);
  dp_plan *p = plan_of(m, &c);
  size_t P = dp_model_n_params(m) * 4;
  for (int d = 0; d < 4; d++) {
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_GATHERED_OUTPUTS).size, 0);
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_GATHERED_GRADS).size, 0);
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_TARGETS).size,
                      16 * 4); /* its labels */
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_OPT_STATE).size,
                      2 * P); /* full copy */
    /* one process: the partner's half is added in place, no receive buffer */
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_COMM).size, 0);
  }
  /* device 0 only adds the other devices' loss sums: within one alignment unit */
  ck_assert_uint_le(dp_plan_device_bytes(p, 0) - dp_plan_device_bytes(p, 3), 64);
  dp_plan_free(p);
  /* one device per process: every level crosses, so each device receives the
   * half it keeps at the first level, lower (even d) or upper; two per
   * process (0-1 | 2-3): only the second level crosses, a quarter */
  size_t n = P / 4;
  for (int ranks = 2; ranks <= 4; ranks += 2) {
    c.ranks = ranks;
    p = plan_of(m, &c);
    for (int d = 0; d < 4; d++) {
      size_t lo, hi;
      dp__ar_segment(n, ranks == 4 ? 1 : 2, d, &lo, &hi);
      ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_COMM).size, (hi - lo) * 4);
      if (ranks == 4) ck_assert_uint_eq(hi - lo, d % 2 ? n - n / 2 : n / 2);
    }
    dp_plan_free(p);
  }
  dp_model_free(m);
}
END_TEST

START_TEST(sharded_optimizer_keeps_one_shard_per_device) {
  dp_model *m = model_of(MLP);
  size_t n = dp_model_n_params(m);
  for (int N = 1; N <= 8; N++) {
    dp_config c = config_of(64, N, DP_OPT_SGD);
    c.mode = DP_MODE_ALLREDUCE;
    dp_config_set_optimizer(&c, DP_OPT_ADAMW);
    c.shard_optimizer = 1;
    dp_plan *p = plan_of(m, &c);
    dp_config full = c;
    full.shard_optimizer = 0;
    dp_plan *q = plan_of(m, &full);
    size_t sum = 0;
    for (int d = 0; d < N; d++) {
      size_t st = dp_plan_region(p, d, DP_REGION_OPT_STATE).size;
      ck_assert_uint_le(st, 2 * 4 * (n / N + 1));
      ck_assert_uint_ge(st, 2 * 4 * (n / N));
      sum += st;
      if (N > 1) ck_assert_uint_lt(dp_plan_device_bytes(p, d), dp_plan_device_bytes(q, d));
    }
    ck_assert_uint_eq(sum, 2 * 4 * n); /* the shards cover the state exactly once */
    dp_plan_free(p);
    dp_plan_free(q);
  }
  dp_model_free(m);
}
END_TEST

/* Recursive halving pairs devices at distance 1 first, then 2: the first sums
 * are of neighbouring blocks, as in the canonical tree. */
/* A sequence model's batch of tokens past INT_MAX (the ops count rows x
 * positions in int) is refused as an overflow, naming the product, and one
 * row fewer plans (an outside check: it planned, and would have wrapped). */
START_TEST(tokens_per_batch_past_int_max_are_refused) {
  dp_model *m = model_of("input tokens 65536\nembed 2 1\nlinear 2\n"
                         "loss softmax_cross_entropy\n");
  dp_config c = CFG(.batch = 32768, .n_devices = 1, .opt = DP_OPT_SGD);
  c.inference = 1;
  dp_plan *p = NULL;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_ERR_OVERFLOW);
  ck_assert_ptr_null(p);
  ck_assert_msg(
      strstr(dp_last_error(), "batch 32768 x 65536 positions is 2147483648 tokens"), "%s",
      dp_last_error());
  c.batch = 32767;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_OK);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(allreduce_halves_at_distance_one_then_two) {
  dp_model *m = model_of(MLP);
  dp_config c = config_of(64, 4, DP_OPT_SGD);
  c.mode = DP_MODE_ALLREDUCE;
  dp_plan *p = plan_of(m, &c);
  const dp_op *ops = dp_plan_ops(p);
  int first_stage = -1, seen = 0;
  for (int i = 0; i < dp_plan_n_ops(p); i++) {
    const dp_op *o = &ops[i];
    if (o->phase != DP_PHASE_REDUCE ||
        !(o->kind == DP_OP_COPY_ADD ||
          (o->kind == DP_OP_COPY && o->dst_region == DP_REGION_COMM)))
      continue;
    ck_assert_int_eq(o->kind, DP_OP_COPY_ADD); /* one process: added in place */
    if (first_stage < 0) first_stage = o->stage;
    int dist = o->stage == first_stage ? 1 : 2;
    ck_assert_int_eq(o->src_dev ^ o->dst_dev, dist);
    ck_assert_int_eq(o->device, o->dst_dev);
    seen++;
  }
  ck_assert_int_eq(seen, 8); /* 4 devices x 2 levels */
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

Suite *planner_suite(void) {
  Suite *s = suite_create("planner");
  TCase *tc = tcase_create("seed");
  tcase_add_test(tc, seed_splits_thirty_rows_into_two_chunks_of_fifteen);
  tcase_add_test(tc, seed_region_sizes_match_the_seed_document);
  tcase_add_test(tc, seed_sgd_layout_is_exact);
  tcase_add_test(tc, seed_momentum_layout_is_exact);
  tcase_add_test(tc, seed_adamw_layout_is_exact);
  tcase_add_test(tc, adam_layout_and_rules);
  tcase_add_test(tc, clip_grad_value_rules_and_ops);
  tcase_add_test(tc, amsgrad_layout_and_rules);
  tcase_add_test(tc, seed_inference_layout_is_exact);
  tcase_add_test(tc, unused_devices_have_no_arena);
  tcase_add_test(tc, shared_params_are_planned_once);
  suite_add_tcase(s, tc);

  tc = tcase_create("backend");
  tcase_add_test(tc, seed_on_cuda_aligns_to_256_and_stages_on_the_host);
  tcase_add_test(tc, cuda_plans_attention_dropout_with_its_scratch);
  tcase_add_test(tc, backend_without_attention_dropout_refuses_it_naming_the_layer);
  tcase_add_test(tc, cpu_plans_need_no_host_staging);
  tcase_add_test(tc, cuda_options_are_checked_at_plan_time);
  tcase_add_test(tc, backend_options_are_the_backends_own);
  tcase_add_test(tc, fast_collectives_schedule_one_allreduce_per_device);
  suite_add_tcase(s, tc);

  tc = tcase_create("invariants");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, the_seed_plan_keeps_every_invariant);
  tcase_add_test(tc, random_plans_keep_every_invariant);
  tcase_add_test(tc, gpt_plans_keep_every_invariant_with_guards_and_micro_batches);
  tcase_add_test(tc, shortcut_plans_keep_every_invariant_with_guards_and_micro_batches);
  tcase_add_test(tc, sync_bn_residual_plans_keep_every_invariant);
  tcase_add_test(tc, tied_head_with_sync_batchnorm_gives_each_micro_batch_a_slot);
  tcase_add_test(tc, random_residual_sync_batchnorm_plans_keep_every_invariant);
  tcase_add_test(tc, reduce_bf16_plans_keep_every_invariant);
  tcase_add_test(tc, reduce_bf16_halves_the_bytes_between_processes);
  tcase_add_test(tc, reduce_precision_refuses_unknown_values);
  tcase_add_test(tc, recompute_plans_keep_every_invariant);
  tcase_add_test(tc, recompute_halves_the_activations_of_a_wide_mlp);
  tcase_add_test(tc, recompute_values_are_checked);
  tcase_add_test(tc, random_inference_plans_without_loss_keep_every_invariant);
  tcase_add_test(tc, a_residual_block_may_end_the_model);
  tcase_add_test(tc, deep_models_with_many_micro_batches_keep_every_invariant);
  tcase_add_test(tc, smaller_batches_keep_the_planned_cut_points_and_fit);
  tcase_add_test(tc, grad_partials_hold_only_the_slots_the_tree_uses);
  tcase_add_test(tc, inference_plans_are_smaller_than_training_plans);
  tcase_add_test(tc, inference_reuses_activation_memory);
  tcase_add_test(tc, random_sync_batchnorm_plans_keep_every_invariant);
  suite_add_tcase(s, tc);

  tc = tcase_create("liveness");
  tcase_add_test(tc, live_place_separates_buffers_live_together);
  tcase_add_test(tc, live_place_reuses_memory_of_dead_buffers);
  tcase_add_test(tc, live_place_handles_empty_and_refuses_too_many);
  tcase_add_test(tc, live_place_overflow_is_reported);
  suite_add_tcase(s, tc);

  tc = tcase_create("budget");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, max_batch_is_exact);
  tcase_add_test(tc, max_batch_is_the_largest_that_fits_when_sizes_dip);
  tcase_add_test(tc, max_batch_finds_batches_beyond_a_dip);
  tcase_add_test(tc, plan_size_grows_with_the_batch);
  tcase_add_test(tc, max_batch_grows_with_the_budget);
  tcase_add_test(tc, max_batch_is_zero_below_the_smallest_plan);
  tcase_add_test(tc, max_batch_of_the_seed_budget);
  tcase_add_test(tc, max_batch_refuses_bad_arguments);
  tcase_add_test(tc, fit_returns_fitting_configurations_fastest_first);
  tcase_add_test(tc, fit_none_fits_names_the_smallest_and_the_shortfall);
  tcase_add_test(tc, fit_searches_only_what_it_is_allowed);
  tcase_add_test(tc, fit_refuses_bad_arguments);
  tcase_add_test(tc, fit_estimates_count_shared_passes_on_every_thread);
  tcase_add_test(tc, fit_tries_the_backends_options_that_keep_the_results);
  tcase_add_test(tc, fit_chooses_bf16_when_only_it_fits);
  tcase_add_test(tc, fit_turns_to_recompute_when_nothing_else_fits);
  suite_add_tcase(s, tc);

  tc = tcase_create("schedule");
  tcase_add_test(tc, seed_schedule_is_exact);
  tcase_add_test(tc, reduce_pairs_devices_at_distance_one_then_two);
  tcase_add_test(tc, backward_sums_each_device_block_as_a_subtree);
  tcase_add_test(tc, backward_tree_splits_three_micro_batches_as_01_then_2);
  tcase_add_test(tc, gradient_tree_is_the_same_for_1_2_4_8_devices);
  tcase_add_test(tc, inference_schedule_has_no_training_phases);
  tcase_add_test(tc, single_device_plans_have_no_transfers_between_devices);
  suite_add_tcase(s, tc);

  tc = tcase_create("modes_and_splits");
  tcase_add_test(tc, memory_split_gives_device_0_fewer_rows_and_a_lower_peak);
  tcase_add_test(tc, memory_split_with_fixed_micro_batches_deals_whole_micro_batches);
  tcase_add_test(tc, allreduce_balances_memory_and_scatters_targets);
  tcase_add_test(tc, sharded_optimizer_keeps_one_shard_per_device);
  tcase_add_test(tc, allreduce_halves_at_distance_one_then_two);
  tcase_add_test(tc, tokens_per_batch_past_int_max_are_refused);
  suite_add_tcase(s, tc);

  tc = tcase_create("config");
  tcase_add_test(tc, batch_zero_is_refused);
  tcase_add_test(tc, device_count_out_of_range_is_refused);
  tcase_add_test(tc, sharded_optimizer_needs_allreduce);
  tcase_add_test(tc, training_without_a_loss_is_refused);
  tcase_add_test(tc, other_bad_configs_are_refused);
  tcase_add_test(tc, hyper_parameters_are_refused_when_not_finite_or_contradictory);
  tcase_add_test(tc, config_defaults_are_as_documented);
  tcase_add_test(tc, names_cover_every_enum);
  tcase_add_test(tc, random_image_plans_keep_every_invariant);
  tcase_add_test(tc, flatten_is_a_view_without_memory);
  tcase_add_test(tc, allreduce_checks_tile_the_parameters_in_order);
  suite_add_tcase(s, tc);
  return s;
}
