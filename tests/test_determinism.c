/* Bit-for-bit reproducibility: run to run, across device counts and across
 * modes (classic, allreduce, allreduce with a sharded optimizer). */
#include "core/backend.h" /* dp__backend_register: the unfused cpu backend */
#include "core/exec.h"    /* a shared op, its chunks taken by the device on time */
#include "cpu/cpu.h"
#include "dp.h"
#include "helpers.h"

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The image layers on a 1 x 3 x 4 input (the same 12 floats per row):
 * conv2d with padding, an overlapping maxpool, dropout on an image, conv2d,
 * avgpool, flatten, linear. */
static const char CNN_SPEC[] =
    "input 1 3 4\nconv2d 4 2 padding 1\nrelu\nmaxpool2d 2 stride 1\n"
    "dropout 0.2\nconv2d 3 2\ntanh\navgpool2d 1\nflatten\nlinear 5\n"
    "loss softmax_cross_entropy\n";
/* The pools' padding on the same input: maxpool 3 stride 2 padding 1 after a
 * relu (fused: the masked backward), avgpool 2 stride 1 padding 1 exclude_pad
 * (4 x 3 x 3: every window has 1, 2 or 4 real cells), avgpool 3 padding 1. */
static const char CNN_PAD_SPEC[] =
    "input 1 3 4\nconv2d 4 3 padding 1\nrelu\nmaxpool2d 3 stride 2 padding 1\n"
    "avgpool2d 2 stride 1 padding 1 exclude_pad\navgpool2d 3 stride 1 padding 1\n"
    "flatten\nlinear 5\nloss softmax_cross_entropy\n";
/* MLP_EVERY_KIND_SPEC (tests/specs.h, every layer kind, dropout included: its
 * masks are keyed by global row) unless a test sets it */
static const char *spec_in_use;
/* config.recompute and config.batchnorm of every run (0 and per replica unless
 * a test sets them) */
static int recompute_in_use;
/* The GPT gpt_run trains: GPT_SPEC, or GPT_ADROP_SPEC. */
static const char *gpt_in_use = GPT_SPEC;
static dp_bn_mode bn_in_use = DP_BN_PER_REPLICA;
/* config.backend of every run (the cpu backend unless a test sets it) */
static dp_backend backend_in_use = DP_BACKEND_CPU;
/* config.precision and config.backend_options of every run (fp32 and none
 * unless a test sets them) */
static dp_precision precision_in_use = DP_PRECISION_FP32;
static const char *options_in_use = "";
/* config.clip_grad_value of every run (0 unless a test sets it) */
static float clip_value_in_use = 0.0f;
enum { B = 64, IN = 12, CLASSES = 5, MB = 8 };

typedef struct {
  float x[B * IN];
  int32_t y[B];
} batch;

/* A deterministic batch per step (an LCG of our own). */
static void make_batch(batch *b, int step) {
  uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(step + 1);
  for (int i = 0; i < B * IN; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    b->x[i] = (float)((s >> 40) & 0xffff) / 32768.0f - 1.0f;
  }
  for (int r = 0; r < B; r++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    b->y[r] = (int32_t)((s >> 33) % CLASSES);
  }
}

typedef struct {
  int devices;
  dp_mode mode;
  int shard;
} setup;

/* Trains `steps` steps; returns the parameter hash (0 on failure). rows < B
 * every fifth step exercises the smaller-batch path too. */
static uint64_t run(setup su, dp_optimizer opt, int steps, int micro_batch) {
  dp_config c = config_of(B, su.devices, opt);
  c.mode = su.mode;
  c.shard_optimizer = su.shard;
  c.micro_batch = micro_batch;
  c.lr = opt == DP_OPT_ADAMW || opt == DP_OPT_ADAM ? 0.01f : 0.05f;
  if (opt == DP_OPT_ADAM) c.weight_decay = 0.01f; /* Adam's L2 term in play */
  c.clip_grad_value = clip_value_in_use;
  c.seed = 7;
  c.recompute = recompute_in_use;
  c.guards = recompute_in_use > 0; /* and nothing it writes leaves its regions */
  c.batchnorm = bn_in_use;
  c.backend = backend_in_use;
  c.precision = precision_in_use;
  snprintf(c.backend_options, sizeof c.backend_options, "%s", options_in_use);
  rig r;
  rig_open(&r, spec_in_use ? spec_in_use : MLP_EVERY_KIND_SPEC, &c);
  dp_ctx *x = r.c;
  batch b;
  for (int s = 0; s < steps; s++) {
    make_batch(&b, s);
    int rows = s % 5 == 4 ? B - 3 * MB - 5 : B;
    float loss;
    ck_assert_msg(dp_train_step(x, rows, IN, b.x, b.y, &loss) == DP_OK, "%s",
                  dp_ctx_error(x));
  }
  uint64_t h = dp_params_hash(x);
  rig_close(&r);
  return h;
}

static const setup SETUPS[] = {
    {1, DP_MODE_CLASSIC, 0},   {2, DP_MODE_CLASSIC, 0},   {4, DP_MODE_CLASSIC, 0},
    {8, DP_MODE_CLASSIC, 0},   {1, DP_MODE_ALLREDUCE, 0}, {2, DP_MODE_ALLREDUCE, 0},
    {4, DP_MODE_ALLREDUCE, 0}, {8, DP_MODE_ALLREDUCE, 0}, {1, DP_MODE_ALLREDUCE, 1},
    {2, DP_MODE_ALLREDUCE, 1}, {4, DP_MODE_ALLREDUCE, 1}, {8, DP_MODE_ALLREDUCE, 1},
};
enum { N_SETUPS = sizeof SETUPS / sizeof *SETUPS };

static const char *mode_name(setup s) {
  return s.mode == DP_MODE_CLASSIC ? "classic"
         : s.shard                 ? "allreduce+sharded"
                                   : "allreduce";
}

/* The check: N in {1,2,4,8} x {classic, allreduce, sharded}, 50
 * steps, with dropout: twelve runs, one hash. */
static void all_setups_agree(dp_optimizer opt) {
  uint64_t ref = run(SETUPS[0], opt, 50, MB);
  ck_assert_uint_ne(ref, 0);
  for (int i = 1; i < N_SETUPS; i++) {
    uint64_t h = run(SETUPS[i], opt, 50, MB);
    ck_assert_msg(h == ref, "%d devices, %s: hash %016llx, 1 device classic: %016llx",
                  SETUPS[i].devices, mode_name(SETUPS[i]), (unsigned long long)h,
                  (unsigned long long)ref);
  }
}

START_TEST(twelve_setups_same_bits_sgd_momentum) { all_setups_agree(DP_OPT_MOMENTUM); }
END_TEST

START_TEST(twelve_setups_same_bits_adamw) { all_setups_agree(DP_OPT_ADAMW); }
END_TEST

START_TEST(twelve_setups_same_bits_adam) { all_setups_agree(DP_OPT_ADAM); }
END_TEST

/* clip_grad_value at 0.002 changes the bits (not vacuously) and keeps them the
 * same everywhere, for Adam and momentum SGD. */
START_TEST(twelve_setups_same_bits_clip_grad_value) {
  setup one = {1, DP_MODE_CLASSIC, 0};
  uint64_t plain = run(one, DP_OPT_ADAM, 50, MB);
  clip_value_in_use = 0.002f;
  ck_assert_uint_ne(run(one, DP_OPT_ADAM, 50, MB), plain);
  all_setups_agree(DP_OPT_ADAM);
  all_setups_agree(DP_OPT_MOMENTUM);
  clip_value_in_use = 0.0f;
}
END_TEST

/* Three devices (not a power of two: the classic tree, then each device's range
 * from device 0) give the same bits in every mode, Adam and clip_grad_value
 * included. */
START_TEST(three_devices_same_bits_in_every_mode_adam_clip_grad_value) {
  const setup three[] = {
      {3, DP_MODE_CLASSIC, 0}, {3, DP_MODE_ALLREDUCE, 0}, {3, DP_MODE_ALLREDUCE, 1}};
  for (int clip = 0; clip < 2; clip++) {
    clip_value_in_use = clip ? 0.002f : 0.0f;
    uint64_t ref = run(three[0], DP_OPT_ADAM, 30, MB);
    for (int i = 1; i < 3; i++)
      ck_assert_msg(run(three[i], DP_OPT_ADAM, 30, MB) == ref, "%s, clip %d",
                    mode_name(three[i]), clip);
  }
  clip_value_in_use = 0.0f;
}
END_TEST

START_TEST(twelve_setups_same_bits_cnn) {
  spec_in_use = CNN_SPEC;
  all_setups_agree(DP_OPT_ADAMW);
  setup one = {1, DP_MODE_CLASSIC,
               0}; /* and not vacuously: other micro-batches, other bits */
  ck_assert_uint_ne(run(one, DP_OPT_ADAMW, 20, MB), run(one, DP_OPT_ADAMW, 20, 2 * MB));
  spec_in_use = NULL;
}
END_TEST

START_TEST(twelve_setups_same_bits_padded_pools) {
  spec_in_use = CNN_PAD_SPEC;
  all_setups_agree(DP_OPT_MOMENTUM);
  spec_in_use = NULL;
}
END_TEST

/* A ResNet downsampling block (torchvision's: a projection shortcut, conv1x1
 * stride 2 and batchnorm per replica, f(x) + g(x)) on the 12 inputs as 1 x 3
 * x 4, in fp32 and in bf16: twelve runs, one hash each. */
static const char RESNET_SPEC[] = "input 1 3 4\n"
                                  "conv2d 4 3 padding 1 nobias\nbatchnorm\nrelu\n"
                                  "residual\n"
                                  "conv2d 6 3 stride 2 padding 1 nobias\nbatchnorm\nrelu\n"
                                  "conv2d 6 3 padding 1 nobias\nbatchnorm\n"
                                  "shortcut\n"
                                  "conv2d 6 1 stride 2 nobias\nbatchnorm\n"
                                  "end\n"
                                  "relu\nflatten\nlinear 5\nloss softmax_cross_entropy\n";

START_TEST(twelve_setups_same_bits_resnet_shortcut) {
  spec_in_use = RESNET_SPEC;
  all_setups_agree(DP_OPT_MOMENTUM);
  precision_in_use = DP_PRECISION_BF16;
  all_setups_agree(DP_OPT_MOMENTUM);
  precision_in_use = DP_PRECISION_FP32;
  spec_in_use = NULL;
}
END_TEST

/* torchvision's identity block twice, the second nested in the first (conv2d,
 * batchnorm and relu inside; the end's output gradient passes two
 * batchnorms on its way to the begin), on RESNET_SPEC's input. */
static const char RESNET_NESTED_SPEC[] =
    "input 1 3 4\n"
    "conv2d 4 3 padding 1 nobias\nbatchnorm\nrelu\n"
    "residual\n"
    "conv2d 4 3 padding 1 nobias\nbatchnorm\nrelu\n"
    "residual\n"
    "conv2d 4 3 padding 1 nobias\nbatchnorm\n"
    "end\n"
    "end\n"
    "relu\nflatten\nlinear 5\nloss softmax_cross_entropy\n";

/* Sync batchnorm inside residual blocks (the backward stops at each
 * batchnorm for the whole batch's sums, while a block's skip gradient waits
 * for its begin, below): the projection block, the nested identity blocks
 * and the residual MLP (tests/specs.h), 10 steps (two short batches among
 * them) of SGD with momentum, fp32 and bf16: one hash on 1, 2, 4 and 8
 * devices, classic, allreduce and sharded; other than per replica's. */
START_TEST(sync_bn_residual_same_bits_everywhere) {
  static const char *const specs[] = {RESNET_SPEC, RESNET_NESTED_SPEC, RESNET_MLP_SPEC};
  for (size_t k = 0; k < 3; k++)
    for (int bf = 0; bf < 2; bf++) {
      spec_in_use = specs[k];
      precision_in_use = bf ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
      bn_in_use = DP_BN_PER_REPLICA;
      uint64_t per_replica = run(SETUPS[0], DP_OPT_MOMENTUM, 10, MB);
      bn_in_use = DP_BN_SYNC;
      uint64_t ref = run(SETUPS[0], DP_OPT_MOMENTUM, 10, MB);
      ck_assert_uint_ne(ref, 0);
      ck_assert_uint_ne(ref, per_replica);
      for (int i = 1; i < N_SETUPS; i++) {
        uint64_t h = run(SETUPS[i], DP_OPT_MOMENTUM, 10, MB);
        ck_assert_msg(h == ref, "spec %zu, %s, %d devices, %s: %016llx, 1 device: %016llx",
                      k, bf ? "bf16" : "fp32", SETUPS[i].devices, mode_name(SETUPS[i]),
                      (unsigned long long)h, (unsigned long long)ref);
      }
    }
  precision_in_use = DP_PRECISION_FP32;
  bn_in_use = DP_BN_PER_REPLICA;
  spec_in_use = NULL;
}
END_TEST

/* The GPT (tests/specs.h: residual blocks, attention, dropout), 3 AdamW steps
 * with micro-batches of 2 rows: one parameter hash on 1, 2 and 4 devices in
 * classic, allreduce and allreduce with a sharded optimizer (4 devices: one
 * micro-batch each; 1 device: all 8 in a row). */
static uint64_t gpt_run(setup su, int micro_batch) {
  enum { R = 16 };
  dp_config c = config_of(R, su.devices, DP_OPT_ADAMW);
  c.mode = su.mode;
  c.shard_optimizer = su.shard;
  c.micro_batch = micro_batch;
  c.lr = 0.01f;
  c.seed = 7;
  c.recompute = recompute_in_use;
  c.guards = recompute_in_use > 0;
  c.precision = precision_in_use;
  c.batchnorm = bn_in_use;
  snprintf(c.backend_options, sizeof c.backend_options, "%s", options_in_use);
  rig r;
  rig_open(&r, gpt_in_use, &c);
  float x[R * GPT_T];
  int32_t y[R * GPT_T];
  for (int s = 0; s < 3; s++) {
    for (int i = 0; i < R * GPT_T; i++) {
      x[i] = (float)((i * 7 + s * 3) % GPT_V);
      y[i] = (i * 5 + s) % GPT_V;
    }
    float loss;
    ck_assert_msg(dp_train_step(r.c, R, GPT_T, x, y, &loss) == DP_OK, "%s",
                  dp_ctx_error(r.c));
  }
  uint64_t h = dp_params_hash(r.c);
  rig_close(&r);
  return h;
}

START_TEST(gpt_same_bits_on_1_2_4_devices_in_every_mode) {
  uint64_t ref = gpt_run(SETUPS[0], 2);
  for (int i = 1; i < N_SETUPS; i++) {
    if (SETUPS[i].devices == 8) continue;
    uint64_t h = gpt_run(SETUPS[i], 2);
    ck_assert_msg(h == ref, "GPT, %d devices, %s: hash %016llx, 1 device classic: %016llx",
                  SETUPS[i].devices, mode_name(SETUPS[i]), (unsigned long long)h,
                  (unsigned long long)ref);
  }
  /* and not vacuously: other micro-batches, other bits */
  ck_assert_uint_ne(gpt_run(SETUPS[0], 4), ref);
}
END_TEST

START_TEST(same_run_twice_same_bits_after_100_steps) {
  for (int i = 0; i < N_SETUPS; i += 3) {
    uint64_t a = run(SETUPS[i], DP_OPT_ADAMW, 100, MB),
             b = run(SETUPS[i], DP_OPT_ADAMW, 100, MB);
    ck_assert_msg(a == b, "%d devices %s: %016llx then %016llx", SETUPS[i].devices,
                  mode_name(SETUPS[i]), (unsigned long long)a, (unsigned long long)b);
  }
  /* and without a fixed micro-batch (one per device), on a non-power-of-two count */
  setup three = {3, DP_MODE_CLASSIC, 0}, three_ar = {3, DP_MODE_ALLREDUCE, 1};
  ck_assert_uint_eq(run(three, DP_OPT_MOMENTUM, 100, 0),
                    run(three, DP_OPT_MOMENTUM, 100, 0));
  ck_assert_uint_eq(run(three_ar, DP_OPT_ADAMW, 100, 0),
                    run(three_ar, DP_OPT_ADAMW, 100, 0));
}
END_TEST

/* The guarantee is not vacuous: changing the micro-batch partition changes
 * the reduction tree, and that shows in the bits. */
START_TEST(different_micro_batch_changes_the_bits) {
  setup one = {1, DP_MODE_CLASSIC, 0};
  ck_assert_uint_ne(run(one, DP_OPT_ADAMW, 20, MB), run(one, DP_OPT_ADAMW, 20, 2 * MB));
}
END_TEST

/* Large enough (74k parameters, 295 KB of gradients) that the executor shares
 * its elementwise ops across the device threads (exec.c: work sharing), with
 * several micro-batches per device, so the backward's own gradient adds come
 * right after the device's layer ops in their stage. */
START_TEST(shared_ops_keep_the_bits_with_many_micro_batches) {
  spec_in_use = "input 12\nlinear 4096\nrelu\nlinear 5\nloss softmax_cross_entropy\n";
  uint64_t ref = run((setup){1, DP_MODE_CLASSIC, 0}, DP_OPT_MOMENTUM, 6, MB);
  static const setup more[] = {{2, DP_MODE_CLASSIC, 0},
                               {4, DP_MODE_CLASSIC, 0},
                               {2, DP_MODE_ALLREDUCE, 0},
                               {4, DP_MODE_ALLREDUCE, 1}};
  for (int i = 0; i < 4; i++) {
    uint64_t h = run(more[i], DP_OPT_MOMENTUM, 6, MB);
    ck_assert_msg(h == ref, "%d devices %s: %016llx, 1 device %016llx", more[i].devices,
                  mode_name(more[i]), (unsigned long long)h, (unsigned long long)ref);
  }
  spec_in_use = NULL;
}
END_TEST

/* Across instruction sets: every CPU tier this machine has (the GEMM's and the
 * elementwise loops', which follow it) gives the reference's bits, for each
 * optimizer, the CNN, and both batchnorm modes, and a CNN on the AVX-512 tier's
 * own conv2d and maxpool2d kernels. */
START_TEST(every_cpu_tier_gives_the_same_bits) {
  static const char *const tiers[] = {"scalar", "avx2", "avx512"};
  static const char *const specs[] = {
      NULL,
      "input 1 3 4\nconv2d 4 2 padding 1 nobias\nbatchnorm\nrelu\nmaxpool2d 2 "
      "stride 1\nflatten\nlinear 7 nobias\nbatchnorm\nlinear 5\n"
      "loss softmax_cross_entropy\n",
      /* gelu and tanh: loops with an AVX-512 copy of their own (DP_SIMD_FN512) */
      "input 12\nlinear 40\ngelu\nlinear 24\ntanh\nlinear 24\ngelu approximate none\n"
      "linear 5\nloss softmax_cross_entropy\n",
      /* conv2d 3 padding 1 with 16 outputs and maxpool2d 2 to rows of 1: the
       * AVX-512 tier runs them without im2col (lib/cpu/conv_fast.c) */
      "input 3 2 2\nconv2d 16 3 padding 1\nrelu\nmaxpool2d 2\nconv2d 16 3 padding 1\n"
      "relu\nflatten\nlinear 5\nloss softmax_cross_entropy\n"};
  setup two = {2, DP_MODE_ALLREDUCE, 0};
  for (int sp = 0; sp < 4; sp++)
    for (int opt = 0; opt < 3; opt++) {
      spec_in_use = specs[sp];
      uint64_t ref = 0;
      int ran = 0;
      for (int t = 0; t < 3; t++) {
        if (dp_gemm_set_tier(tiers[t]) != DP_OK) continue; /* not on this CPU */
        uint64_t h = run(two, (dp_optimizer)opt, 12, MB);
        if (!ran++) ref = h;
        ck_assert_msg(h == ref, "spec %d, optimizer %d: tier %s gives %016llx, %s %016llx",
                      sp, opt, tiers[t], (unsigned long long)h, tiers[0],
                      (unsigned long long)ref);
      }
      ck_assert_int_ge(ran, 1);
      if (ran < 2) printf("SKIP determinism: only the scalar CPU tier here\n");
    }
  dp_gemm_set_tier("auto");
  spec_in_use = NULL;
}
END_TEST

/* The activation bytes of device 0 in a plan of spec on backend b. */
static size_t act_bytes(const char *spec, dp_backend b) {
  dp_config c = config_of(B, 2, DP_OPT_ADAMW);
  c.backend = b;
  dp_model *m = NULL;
  dp_plan *p = NULL;
  ck_assert_int_eq(dp_model_parse(spec, "fused", &m), DP_OK);
  ck_assert_msg(dp_plan_create(m, &c, &p) == DP_OK, "%s", dp_last_error());
  size_t n = dp_plan_activation_bytes_unshared(p, 0);
  dp_plan_free(p);
  dp_model_free(m);
  return n;
}

/* The cpu backend's fusions (dp__relu_fused, dp__relu_bwd_fused: a relu in
 * the linear's or the conv's stores, its backward in the maxpool's or the
 * linear's) give the bits of the same backend with none: a copy of its vtable
 * registered without them. On every CPU tier here (the conv and pool kernels
 * of each: AVX-512's own, AVX2's maxpool, conv.c's im2col, the overlapping
 * maxpool's loop), 1 and 2 devices, with recompute (the cuts move), and the
 * fused plans keep fewer activation bytes. */
START_TEST(fused_relu_gives_the_unfused_bits) {
  static dp_backend_ops unfused;
  unfused = *dp__backend_ops(DP_BACKEND_CPU);
  unfused.name = "cpu-unfused";
  unfused.fuses_linear_relu = unfused.fuses_conv_relu = unfused.fuses_relu_maxpool = false;
  dp_backend kind;
  ck_assert_int_eq(dp__backend_register(&unfused, &kind), DP_OK);
  static const char *const tiers[] = {"scalar", "avx2", "avx512"};
  const char *const specs[] = {
      CNN_SPEC, /* conv2d 2 padding 1, relu, maxpool2d 2 stride 1 */
      /* conv2d 3 padding 1 (16 outputs), relu, maxpool2d 2 to rows of 1: the
       * AVX-512 tier's own kernels, AVX2's maxpool */
      "input 3 2 2\nconv2d 16 3 padding 1\nrelu\nmaxpool2d 2\nflatten\nlinear 8\n"
      "relu\nlinear 5\nloss softmax_cross_entropy\n",
      "input 3 2 2\nconv2d 16 3 padding 1 nobias\nrelu\nconv2d 16 3 padding 1\nrelu\n"
      "flatten\nlinear 5\nloss softmax_cross_entropy\n"};
  const setup setups[] = {{1, DP_MODE_CLASSIC, 0}, {2, DP_MODE_ALLREDUCE, 0}};
  for (int sp = 0; sp < 3; sp++) {
    spec_in_use = specs[sp];
    ck_assert_uint_lt(act_bytes(specs[sp], DP_BACKEND_CPU), act_bytes(specs[sp], kind));
    for (int t = 0; t < 3; t++) {
      if (dp_gemm_set_tier(tiers[t]) != DP_OK) continue; /* not on this CPU */
      for (int su = 0; su < 2; su++)
        for (int rc = 0; rc <= 2; rc += 2) {
          recompute_in_use = rc;
          backend_in_use = DP_BACKEND_CPU;
          uint64_t fused = run(setups[su], DP_OPT_ADAMW, 8, MB);
          backend_in_use = kind;
          uint64_t plain = run(setups[su], DP_OPT_ADAMW, 8, MB);
          ck_assert_msg(fused == plain,
                        "spec %d, tier %s, %d devices, recompute %d: fused %016llx, "
                        "unfused %016llx",
                        sp, tiers[t], setups[su].devices, rc, (unsigned long long)fused,
                        (unsigned long long)plain);
        }
    }
  }
  dp_gemm_set_tier("auto");
  backend_in_use = DP_BACKEND_CPU;
  recompute_in_use = 0;
  spec_in_use = NULL;
}
END_TEST

/* Classic mode's loss op (the whole batch gathered on device 0) is shared by
 * micro-batches between the device threads when its outputs are large
 * (lib/core/exec.c): the parameters and every step's loss of a 300-class
 * model are the bits of one device (no sharing) on 2, 4 and 8, and the
 * profile shows the loss run on both threads of 2 devices. */
static uint64_t wide_run(int devices, dp_mode mode, float *losses, bool profile) {
  static const char WIDE_SPEC[] =
      "input 12\nlinear 40\nrelu\nlinear 300\nloss softmax_cross_entropy\n";
  dp_config c = config_of(B, devices, DP_OPT_ADAMW);
  c.mode = mode;
  c.micro_batch = MB;
  c.lr = 0.01f;
  c.seed = 7;
  rig r;
  rig_open(&r, WIDE_SPEC, &c);
  dp_prof_event ev[512];
  if (profile) ck_assert_int_eq(dp_ctx_profile(r.c, ev, 512), DP_OK);
  batch b;
  for (int s = 0; s < 6; s++) {
    make_batch(&b, s);
    int rows = s == 4 ? B - 3 * MB - 5 : B; /* a short batch: empty micro-batches */
    ck_assert_msg(dp_train_step(r.c, rows, IN, b.x, b.y, &losses[s]) == DP_OK, "%s",
                  dp_ctx_error(r.c));
    if (profile && s == 0) {
      size_t n = dp_ctx_profile_count(r.c, NULL);
      int threads = 0;
      for (size_t i = 0; i < n; i++)
        if (ev[i].what == DP_PROF_EVENT_OP && ev[i].kind == DP_OP_LOSS && ev[i].shared)
          threads |= 1 << ev[i].thread;
      ck_assert_int_eq(threads, 3);
      ck_assert_int_eq(dp_ctx_profile(r.c, NULL, 0), DP_OK);
    }
  }
  uint64_t h = dp_params_hash(r.c);
  rig_close(&r);
  return h;
}

START_TEST(classic_loss_shared_by_micro_batches_keeps_the_bits) {
  float ref[6], got[6];
  uint64_t h1 = wide_run(1, DP_MODE_CLASSIC, ref, false);
  static const int counts[] = {2, 4, 8};
  for (int i = 0; i < 3; i++)
    for (int mode = 0; mode < 2; mode++) {
      dp_mode m = mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC;
      uint64_t h = wide_run(counts[i], m, got, counts[i] == 2 && !mode);
      ck_assert_msg(h == h1, "%d devices, mode %d: hash %016llx, 1 device %016llx",
                    counts[i], mode, (unsigned long long)h, (unsigned long long)h1);
      ck_assert_msg(memcmp(ref, got, sizeof ref) == 0, "%d devices, mode %d: the losses",
                    counts[i], mode);
    }
}
END_TEST

/* config.recompute: the backward's recomputed forward ops in a plan of spec. */
static int recompute_ops(const char *spec, int devices, int micro_batch, int k) {
  dp_config c = config_of(spec == GPT_SPEC ? 16 : B, devices, DP_OPT_ADAMW);
  c.micro_batch = micro_batch;
  c.recompute = k;
  c.batchnorm = bn_in_use;
  dp_model *m = NULL;
  dp_plan *p = NULL;
  ck_assert_int_eq(dp_model_parse(spec, "rc", &m), DP_OK);
  ck_assert_msg(dp_plan_create(m, &c, &p) == DP_OK, "%s", dp_last_error());
  int n = 0;
  for (int i = 0; i < dp_plan_n_ops(p); i++)
    n += dp_plan_ops(p)[i].phase == DP_PHASE_BACKWARD &&
         dp_plan_ops(p)[i].kind == DP_OP_FORWARD;
  dp_plan_free(p);
  dp_model_free(m);
  return n;
}

/* Recompute (config.recompute, segments of 2, 3 and 4 layers) gives the bits
 * of the run without it: the MLP of every layer kind (dropout: the recomputed
 * masks are the forward's), the CNN, a CNN with batchnorm per replica and
 * sync (statistics of the same rows; running statistics updated once), on
 * 1, 2 and 4 devices, classic and allreduce, 6 steps (a short batch among
 * them), with arena guards intact; and the plans do recompute. */
static const setup RC_SETUPS[] = {{1, DP_MODE_CLASSIC, 0},
                                  {2, DP_MODE_CLASSIC, 0},
                                  {4, DP_MODE_CLASSIC, 0},
                                  {2, DP_MODE_ALLREDUCE, 0},
                                  {4, DP_MODE_ALLREDUCE, 1}};
enum { N_RC_SETUPS = sizeof RC_SETUPS / sizeof *RC_SETUPS };

static const char BN_CNN_SPEC[] =
    "input 1 3 4\nconv2d 3 2 padding 1\nbatchnorm\nrelu\nmaxpool2d 2 stride 1\n"
    "flatten\nlinear 8\nbatchnorm\ntanh\ndropout 0.1\nlinear 6\nrelu\nlinear 5\n"
    "loss softmax_cross_entropy\n";

/* The models and batchnorm modes of the bit-identity checks below: the MLP of
 * every layer kind, the CNN, a CNN with batchnorm per replica and sync, the
 * ResNet block with its projection shortcut (per replica and sync), the
 * residual MLP with sync batchnorm. */
static const struct {
  const char *spec;
  dp_bn_mode bn;
} MODEL_CASES[] = {{MLP_EVERY_KIND_SPEC, DP_BN_PER_REPLICA},
                   {CNN_SPEC, DP_BN_PER_REPLICA},
                   {BN_CNN_SPEC, DP_BN_PER_REPLICA},
                   {BN_CNN_SPEC, DP_BN_SYNC},
                   {RESNET_SPEC, DP_BN_PER_REPLICA},
                   {RESNET_SPEC, DP_BN_SYNC},
                   {RESNET_MLP_SPEC, DP_BN_SYNC}};
enum { N_MODEL_CASES = sizeof MODEL_CASES / sizeof *MODEL_CASES };

START_TEST(recompute_gives_the_same_bits) {
  for (size_t c = 0; c < N_MODEL_CASES; c++) {
    spec_in_use = MODEL_CASES[c].spec;
    bn_in_use = MODEL_CASES[c].bn;
    recompute_in_use = 0;
    uint64_t ref = run(RC_SETUPS[0], DP_OPT_ADAMW, 6, MB);
    int n_rc = 0;
    for (int k = 2; k <= 4; k++) {
      recompute_in_use = k;
      n_rc += recompute_ops(MODEL_CASES[c].spec, 2, MB, k);
      for (int i = 0; i < N_RC_SETUPS; i++) {
        uint64_t h = run(RC_SETUPS[i], DP_OPT_ADAMW, 6, MB);
        ck_assert_msg(h == ref,
                      "spec %zu, recompute %d, %d devices %s: %016llx, without %016llx", c,
                      k, RC_SETUPS[i].devices, mode_name(RC_SETUPS[i]),
                      (unsigned long long)h, (unsigned long long)ref);
      }
    }
    ck_assert_msg(n_rc > 0, "spec %zu: nothing recomputed", c);
  }
  recompute_in_use = 0;
  bn_in_use = DP_BN_PER_REPLICA;
  spec_in_use = NULL;
}
END_TEST

/* Attention dropout (keyed by the global row) and a tied head: one hash on 1, 2
 * and 4 devices in every mode, the same with recompute, another without the
 * dropout. */
START_TEST(gpt_attention_dropout_same_bits_everywhere) {
  uint64_t plain = gpt_run(SETUPS[0], 2);
  gpt_in_use = GPT_ADROP_SPEC;
  uint64_t ref = gpt_run(SETUPS[0], 2);
  ck_assert_uint_ne(ref, plain);
  for (int i = 1; i < N_SETUPS; i++) {
    if (SETUPS[i].devices == 8) continue;
    uint64_t h = gpt_run(SETUPS[i], 2);
    ck_assert_msg(h == ref, "%d devices, %s: hash %016llx, 1 device classic: %016llx",
                  SETUPS[i].devices, mode_name(SETUPS[i]), (unsigned long long)h,
                  (unsigned long long)ref);
  }
  recompute_in_use = 2;
  uint64_t h = gpt_run(SETUPS[1], 2);
  recompute_in_use = 0;
  gpt_in_use = GPT_SPEC;
  ck_assert_msg(h == ref, "recompute 2: %016llx, without: %016llx", (unsigned long long)h,
                (unsigned long long)ref);
}
END_TEST

/* The same for the GPT: residual blocks (a block's input kept past a cut),
 * attention's probabilities and layernorm's statistics recomputed. */
START_TEST(recompute_gives_the_same_bits_gpt) {
  recompute_in_use = 0;
  uint64_t ref = gpt_run(RC_SETUPS[0], 2);
  for (int k = 2; k <= 5; k++) {
    recompute_in_use = k;
    ck_assert_int_gt(recompute_ops(GPT_SPEC, 2, 2, k), 0);
    for (int i = 0; i < N_RC_SETUPS; i++) {
      uint64_t h = gpt_run(RC_SETUPS[i], 2);
      ck_assert_msg(h == ref, "GPT, recompute %d, %d devices %s: %016llx, without %016llx",
                    k, RC_SETUPS[i].devices, mode_name(RC_SETUPS[i]), (unsigned long long)h,
                    (unsigned long long)ref);
    }
  }
  recompute_in_use = 0;
}
END_TEST

/* Batchnorm on a sequence (each feature over the rows' T positions), in a
 * residual block and after it, per replica and sync, fp32 and bf16: one hash
 * on 1, 2 and 4 devices in every mode and with recompute 2 and 3; the
 * statistics are the micro-batch's or the batch's, so other micro-batches
 * give other bits. */
static const char GPT_BN_SPEC[] =
    "input tokens 6\nembed 11 8\nresidual\nlinear 24 nobias\nattention 2\n"
    "linear 8 nobias\nbatchnorm\nend\nbatchnorm momentum 0.3\nlinear 16\nrelu\n"
    "linear 11\nloss softmax_cross_entropy\n";
/* with GPT-2's tied head: in sync mode the head writes the table's gradient
 * in the backward's first segment and the embedding adds to it in the last
 * (dp__leaf_slots); 8 micro-batches on 1 device, 4 on 2 */
static const char GPT_BN_TIED_SPEC[] =
    "input tokens 6\nembed 11 8\nresidual\nlinear 24 nobias\nattention 2\n"
    "linear 8 nobias\nbatchnorm\nend\nbatchnorm\nlinear 11 tied\n"
    "loss softmax_cross_entropy\n";

START_TEST(gpt_batchnorm_same_bits_everywhere) {
  for (int k = 0; k < 6; k++) {
    gpt_in_use = k < 4 ? GPT_BN_SPEC : GPT_BN_TIED_SPEC;
    bn_in_use = k & 1 || k >= 4 ? DP_BN_SYNC : DP_BN_PER_REPLICA;
    precision_in_use = k & 2 || k == 5 ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
    uint64_t ref = gpt_run(SETUPS[0], 2);
    for (int i = 1; i < N_SETUPS; i++) {
      if (SETUPS[i].devices == 8) continue;
      uint64_t h = gpt_run(SETUPS[i], 2);
      ck_assert_msg(h == ref, "case %d, %d devices, %s: %016llx, 1 device: %016llx", k,
                    SETUPS[i].devices, mode_name(SETUPS[i]), (unsigned long long)h,
                    (unsigned long long)ref);
    }
    for (recompute_in_use = 2; recompute_in_use <= 3; recompute_in_use++) {
      uint64_t h = gpt_run(RC_SETUPS[4], 2);
      ck_assert_msg(h == ref, "case %d, recompute %d: %016llx, without %016llx", k,
                    recompute_in_use, (unsigned long long)h, (unsigned long long)ref);
    }
    recompute_in_use = 0;
    ck_assert_uint_ne(gpt_run(SETUPS[0], 4), ref);
  }
  gpt_in_use = GPT_SPEC;
  bn_in_use = DP_BN_PER_REPLICA;
  precision_in_use = DP_PRECISION_FP32;
}
END_TEST

/* Shared parameters (the cpu backend's params=shared): the replicas read
 * device 0's parameters and batchnorm buffers, and nothing is broadcast. The
 * bits of copies: the MLP of every layer kind (dropout), the CNN, a CNN with
 * batchnorm per replica and sync, in fp32 and bf16, on 2, 4 and 8 devices,
 * with recompute (and its arena guards) on 4; and the GPT. Its forward in
 * eval mode reads the shared running statistics. */
START_TEST(shared_params_give_the_bits_of_copies) {
  const setup classic[] = {
      {2, DP_MODE_CLASSIC, 0}, {4, DP_MODE_CLASSIC, 0}, {8, DP_MODE_CLASSIC, 0}};
  for (size_t c = 0; c < N_MODEL_CASES; c++)
    for (int bf = 0; bf < 2; bf++) {
      spec_in_use = MODEL_CASES[c].spec;
      bn_in_use = MODEL_CASES[c].bn;
      precision_in_use = bf ? DP_PRECISION_BF16 : DP_PRECISION_FP32;
      options_in_use = "";
      uint64_t ref = run(classic[0], DP_OPT_MOMENTUM, 8, MB);
      ck_assert_uint_ne(ref, 0);
      options_in_use = "params=shared";
      for (int i = 0; i < 3; i++) {
        uint64_t h = run(classic[i], DP_OPT_MOMENTUM, 8, MB);
        ck_assert_msg(h == ref, "spec %zu, %s, %d devices shared: %016llx, copies %016llx",
                      c, bf ? "bf16" : "fp32", classic[i].devices, (unsigned long long)h,
                      (unsigned long long)ref);
      }
      recompute_in_use = 2;
      uint64_t h = run(classic[1], DP_OPT_MOMENTUM, 8, MB);
      recompute_in_use = 0;
      ck_assert_msg(h == ref, "spec %zu, %s, recompute 2 shared: %016llx, copies %016llx",
                    c, bf ? "bf16" : "fp32", (unsigned long long)h,
                    (unsigned long long)ref);
    }
  precision_in_use = DP_PRECISION_FP32;
  options_in_use = "";
  uint64_t ref = gpt_run(SETUPS[1], 2);
  options_in_use = "params=shared";
  uint64_t h = gpt_run(SETUPS[2], 2);
  options_in_use = "";
  ck_assert_msg(h == ref, "GPT, 4 devices shared: %016llx, copies %016llx",
                (unsigned long long)h, (unsigned long long)ref);
  bn_in_use = DP_BN_PER_REPLICA;
  spec_in_use = NULL;
}
END_TEST

/* An eval-mode forward of a batchnorm CNN trained a few steps: the outputs of
 * 3 devices reading device 0's parameters and running statistics are those of
 * 3 devices with copies, bit for bit. */
START_TEST(shared_params_forward_gives_the_outputs_of_copies) {
  float out[2][B * CLASSES];
  for (int sh = 0; sh < 2; sh++) {
    dp_config c = config_of(B, 3, DP_OPT_MOMENTUM);
    c.micro_batch = MB;
    c.seed = 3;
    c.guards = 1;
    if (sh) snprintf(c.backend_options, sizeof c.backend_options, "params=shared");
    rig r;
    rig_open(&r, BN_CNN_SPEC, &c);
    batch b;
    float loss;
    for (int s = 0; s < 3; s++) {
      make_batch(&b, s);
      ck_assert_msg(dp_train_step(r.c, B, IN, b.x, b.y, &loss) == DP_OK, "%s",
                    dp_ctx_error(r.c));
    }
    make_batch(&b, 9);
    ck_assert_msg(dp_forward(r.c, B, IN, b.x, out[sh]) == DP_OK, "%s", dp_ctx_error(r.c));
    rig_close(&r);
  }
  ck_assert_mem_eq(out[0], out[1], sizeof out[0]);
}
END_TEST

/* A shared elementwise op (exec.c) on 2 devices whose second thread is late:
 * held 200 ms in its first chunk, as when the core is taken for a moment. The
 * first thread does its own range, then takes the late one's chunks, so the op
 * waits for one chunk, not for half of it; every byte is done exactly once.
 * The backend is the cpu backend with a run() that only counts. */
enum { LATE_BYTES = 1 << 20, LATE_LINES = LATE_BYTES / 64 };
static pthread_t late_main;
static atomic_int late_slept, late_chunks[2], late_lines[LATE_LINES];

static dp_status late_run(void *bctx, dp_exec_env *env, const dp_op *op) {
  (void)bctx, (void)env;
  bool main = pthread_equal(pthread_self(), late_main);
  if (!main && atomic_exchange(&late_slept, 1) == 0) usleep(200 * 1000);
  atomic_fetch_add(&late_chunks[main ? 0 : 1], 1);
  for (size_t b = op->dst_offset; b < op->dst_offset + op->bytes; b += 64)
    atomic_fetch_add(&late_lines[b / 64], 1);
  return DP_OK;
}

START_TEST(shared_op_is_not_stalled_by_a_late_device) {
  dp_backend_ops be = dp__cpu_backend;
  be.run = late_run;
  late_main = pthread_self();
  static dp_exec x;
  ck_assert_int_eq(dp__exec_init(&x, 0, 2, &be, NULL, be.transport, NULL), DP_OK);
  ck_assert(x.share);
  dp_op op = {.kind = DP_OP_OPTIMIZER, .phase = DP_PHASE_OPTIMIZER, .bytes = LATE_BYTES};
  dp_exec_env env = {0};
  for (int run = 0; run < 2; run++) {    /* the claims start again from 0 */
    atomic_store(&late_slept, run == 1); /* the second run: nobody late */
    atomic_store(&late_chunks[0], 0);
    atomic_store(&late_chunks[1], 0);
    for (int i = 0; i < LATE_LINES; i++) atomic_store(&late_lines[i], 0);
    ck_assert_int_eq(dp__exec_run(&x, &env, &op, NULL, 1, 0, 1, -1), DP_OK);
    for (int i = 0; i < LATE_LINES; i++)
      ck_assert_msg(atomic_load(&late_lines[i]) == 1, "run %d: line %d done %d times", run,
                    i, atomic_load(&late_lines[i]));
    int c0 = atomic_load(&late_chunks[0]), c1 = atomic_load(&late_chunks[1]);
    /* 512 KiB a device, in 16 chunks */
    ck_assert_int_eq(c0 + c1, 32);
    /* (none at all when the late thread woke after the first had done them all) */
    if (run == 0) ck_assert_msg(c0 >= 31 && c1 <= 1, "on time %d, late %d chunks", c0, c1);
  }
  dp__exec_destroy(&x);
}
END_TEST

/* nn.CrossEntropyLoss's options: an MLP with label smoothing, class weights and
 * ignore_index -1 on about a third of the labels (a GPT with padding positions
 * below). The mean's denominator is the batch's weight sum of the non-ignored
 * labels, counted before the step: one hash on 1, 2 and 4 devices in every
 * mode, with and without accumulation; on 3 devices (no power of two: the
 * gradients' tree differs, docs/DETERMINISM.md) the same loss bits. */
static const char CE_OPTS_SPEC[] =
    "input 12\nlinear 16\nrelu\nlinear 5\n"
    "loss softmax_cross_entropy label_smoothing 0.1 ignore_index -1 weight 1,2,0.5,0,1.5\n";
static const char CE_GPT_SPEC[] =
    "input tokens 6\nembed 16 8\nresidual\nlayernorm\nlinear 24 nobias\nattention 2\n"
    "linear 8\nend\nlayernorm\nlinear 16\nloss softmax_cross_entropy ignore_index 15\n";

static uint64_t ce_run(const char *spec, setup su, int accumulate, int cols, int vocab,
                       float *first_loss) {
  enum { R = 24 };
  dp_config c = config_of(R, su.devices, DP_OPT_ADAMW);
  c.mode = su.mode;
  c.shard_optimizer = su.shard;
  c.micro_batch = 2;
  c.accumulate = accumulate;
  c.lr = 0.01f;
  c.seed = 7;
  c.backend = backend_in_use;
  rig r;
  rig_open(&r, spec, &c);
  int P = dp_model_positions(r.m);
  float x[R * 12];
  int32_t y[R * 6];
  uint64_t q = 12345;
  for (int s = 0; s < 4 * (accumulate ? accumulate : 1); s++) {
    for (int i = 0; i < R * cols; i++) {
      q = q * 6364136223846793005ull + 1442695040888963407ull;
      x[i] = vocab ? (float)((q >> 33) % (uint64_t)vocab)
                   : (float)((q >> 40) & 0xffff) / 32768.0f - 1.0f;
    }
    for (int i = 0; i < R * P; i++) {
      q = q * 6364136223846793005ull + 1442695040888963407ull;
      int k = (int)((q >> 33) % 3 == 0); /* ignored: about a third */
      y[i] = vocab ? (k ? 15 : (int32_t)((q >> 20) % 15))
                   : (k ? -1 : (int32_t)((q >> 20) % 5));
    }
    int rows = s % 3 == 2 ? R - 5 : R; /* a short batch too */
    float loss;
    ck_assert_msg(dp_train_step(r.c, accumulate ? R : rows, cols, x, y, &loss) == DP_OK,
                  "%s", dp_ctx_error(r.c));
    if (s == 0) *first_loss = loss;
  }
  uint64_t h = dp_params_hash(r.c);
  rig_close(&r);
  return h;
}

static const setup CE_SETUPS[] = {{1, DP_MODE_CLASSIC, 0},   {2, DP_MODE_CLASSIC, 0},
                                  {3, DP_MODE_CLASSIC, 0},   {4, DP_MODE_CLASSIC, 0},
                                  {2, DP_MODE_ALLREDUCE, 0}, {3, DP_MODE_ALLREDUCE, 0},
                                  {4, DP_MODE_ALLREDUCE, 0}, {4, DP_MODE_ALLREDUCE, 1}};

START_TEST(ce_options_same_bits_on_1_2_3_4_devices_in_every_mode) {
  for (int a = 0; a <= 2; a += 2)
    for (int g = 0; g < 2; g++) {
      const char *spec = g ? CE_GPT_SPEC : CE_OPTS_SPEC;
      int cols = g ? 6 : 12, vocab = g ? 16 : 0;
      float l0, l;
      uint64_t ref = ce_run(spec, CE_SETUPS[0], a, cols, vocab, &l0);
      ck_assert_uint_ne(ref, 0);
      for (size_t i = 1; i < sizeof CE_SETUPS / sizeof *CE_SETUPS; i++) {
        uint64_t h = ce_run(spec, CE_SETUPS[i], a, cols, vocab, &l);
        if (CE_SETUPS[i].devices == 3) h = ref; /* the loss only */
        ck_assert_msg(
            h == ref && memcmp(&l, &l0, 4) == 0,
            "%s, accumulate %d, %d devices, %s: hash %016llx loss %.9g, 1 device: "
            "%016llx loss %.9g",
            g ? "gpt" : "mlp", a, CE_SETUPS[i].devices, mode_name(CE_SETUPS[i]),
            (unsigned long long)h, (double)l, (unsigned long long)ref, (double)l0);
      }
    }
  /* and not vacuously: without the options, other bits */
  float l;
  ck_assert_uint_ne(
      ce_run("input 12\nlinear 16\nrelu\nlinear 5\nloss softmax_cross_entropy "
             "ignore_index -1\n",
             CE_SETUPS[0], 0, 12, 0, &l),
      ce_run(CE_OPTS_SPEC, CE_SETUPS[0], 0, 12, 0, &l));
}
END_TEST

/* Every label ignore_index: PyTorch's mean is 0/0 (NaN). The step is refused
 * as a non-finite loss with nothing applied, or skipped and counted under
 * DP_NONFINITE_SKIP; a label outside the classes that is not ignore_index is
 * still refused. */
START_TEST(ce_all_ignored_is_a_nonfinite_loss_with_nothing_applied) {
  for (int skip = 0; skip < 2; skip++) {
    dp_config c = config_of(4, 2, DP_OPT_MOMENTUM);
    c.on_nonfinite = skip ? DP_NONFINITE_SKIP : DP_NONFINITE_ERROR;
    c.backend = backend_in_use;
    rig r;
    rig_open(&r, CE_OPTS_SPEC, &c);
    float x[4 * 12] = {0}, loss = 0.0f;
    int32_t y[4] = {-1, -1, -1, -1};
    uint64_t h = dp_params_hash(r.c);
    dp_status st = dp_train_step(r.c, 4, 12, x, y, &loss);
    ck_assert_int_eq(st, skip ? DP_OK : DP_ERR_NONFINITE);
    ck_assert_msg(strstr(dp_ctx_error(r.c), "every target is ignore_index") ||
                      strstr(dp_ctx_error(r.c), "ignored or of weight 0"),
                  "%s", dp_ctx_error(r.c));
    if (skip) ck_assert(isnan(loss));
    ck_assert_uint_eq(dp_ctx_skipped_steps(r.c), (uint64_t)skip);
    ck_assert_uint_eq(dp_params_hash(r.c), h);
    y[1] = 3; /* weight 0: still a zero denominator */
    ck_assert_int_eq(dp_train_step(r.c, 4, 12, x, y, &loss),
                     skip ? DP_OK : DP_ERR_NONFINITE);
    y[2] = 5; /* out of range, not ignore_index */
    ck_assert_int_eq(dp_train_step(r.c, 4, 12, x, y, &loss), DP_ERR_RANGE);
    ck_assert_uint_eq(dp_params_hash(r.c), h);
    y[2] = 1;
    ck_assert_int_eq(dp_train_step(r.c, 4, 12, x, y, &loss), DP_OK);
    ck_assert(isfinite(loss));
    ck_assert_uint_ne(dp_params_hash(r.c), h);
    rig_close(&r);
  }
}
END_TEST

Suite *determinism_suite(void) {
  Suite *s = suite_create("determinism");
  TCase *tc = tcase_create("across_devices_and_modes");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, twelve_setups_same_bits_sgd_momentum);
  tcase_add_test(tc, twelve_setups_same_bits_adamw);
  tcase_add_test(tc, twelve_setups_same_bits_adam);
  tcase_add_test(tc, twelve_setups_same_bits_clip_grad_value);
  tcase_add_test(tc, three_devices_same_bits_in_every_mode_adam_clip_grad_value);
  tcase_add_test(tc, twelve_setups_same_bits_cnn);
  tcase_add_test(tc, twelve_setups_same_bits_padded_pools);
  tcase_add_test(tc, twelve_setups_same_bits_resnet_shortcut);
  tcase_add_test(tc, sync_bn_residual_same_bits_everywhere);
  tcase_add_test(tc, shared_ops_keep_the_bits_with_many_micro_batches);
  tcase_add_test(tc, gpt_same_bits_on_1_2_4_devices_in_every_mode);
  tcase_add_test(tc, gpt_attention_dropout_same_bits_everywhere);
  tcase_add_test(tc, ce_options_same_bits_on_1_2_3_4_devices_in_every_mode);
  tcase_add_test(tc, ce_all_ignored_is_a_nonfinite_loss_with_nothing_applied);
  suite_add_tcase(s, tc);
  tc = tcase_create("recompute");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, recompute_gives_the_same_bits);
  tcase_add_test(tc, recompute_gives_the_same_bits_gpt);
  tcase_add_test(tc, gpt_batchnorm_same_bits_everywhere);
  tcase_add_test(tc, shared_params_give_the_bits_of_copies);
  tcase_add_test(tc, shared_params_forward_gives_the_outputs_of_copies);
  suite_add_tcase(s, tc);
  tc = tcase_create("run_to_run");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, same_run_twice_same_bits_after_100_steps);
  tcase_add_test(tc, different_micro_batch_changes_the_bits);
  tcase_add_test(tc, every_cpu_tier_gives_the_same_bits);
  tcase_add_test(tc, fused_relu_gives_the_unfused_bits);
  tcase_add_test(tc, classic_loss_shared_by_micro_batches_keeps_the_bits);
  tcase_add_test(tc, shared_op_is_not_stalled_by_a_late_device);
  suite_add_tcase(s, tc);
  return s;
}
