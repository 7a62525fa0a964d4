/* Arena guards (config.guards): the layout they add (and, off, the exact
 * unguarded layout), that no op of any mode writes a guard, and that a write
 * one float outside a region is caught and named: device, region, direction. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/ctx.h"
#include "helpers.h"

static const char SEED[] = "input 5\nlinear 2\nloss mse\n";
static const char MLP[] = "input 6\nlinear 10\ngelu\ndropout 0.2\nlayernorm\nlinear 5\n"
                          "loss softmax_cross_entropy\n";

/* The default config of that batch and device count, with `guards`. */
static dp_config guarded(int batch, int n_devices, int guards) {
  dp_config c = config_of(batch, n_devices, DP_OPT_SGD);
  c.guards = guards;
  return c;
}

typedef struct {
  float x[64 * 8];
  float tf[64 * 8];
  int32_t ti[64];
} batch;

static void batch_fill(batch *b, uint64_t seed, int classes) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int i = 0; i < 64 * 8; i++) {
    b->x[i] = (float)(rng_next(&s) >> 40) / 8388608.0f - 1.0f;
    b->tf[i] = (float)(rng_next(&s) >> 40) / 16777216.0f;
  }
  for (int i = 0; i < 64; i++) b->ti[i] = (int32_t)(rng_next(&s) % (uint64_t)classes);
}

static dp_status step(dp_ctx *c, const dp_model *m, const batch *b, int rows, float *loss) {
  const void *t = dp_model_loss(m) == DP_LOSS_MSE ? (const void *)b->tf : (const void *)b->ti;
  return dp_train_step(c, rows, dp_model_input_width(m), b->x, t, loss);
}

/* ---- layout ------------------------------------------------------------------- */

START_TEST(guards_off_leave_the_seed_layout_exact) {
  /* tests/test_planner.c pins the seed plan's bytes (device 0: 1600, device
   * 1: 704 at the time of writing) with dp_config_default; guards = 0 must be
   * that very layout, and guards = 1 that layout plus 15 guards. */
  dp_model *m = model_of(SEED);
  dp_config d = guarded(30, 2, 0), c = d;
  ck_assert_int_eq(d.guards, 0); /* the default, in every build */
  for (int cuda = 0; cuda <= 1; cuda++) {
    if (cuda && !cuda_or_skip("guards", "guards_off_leave_the_seed_layout_exact (cuda)"))
      break;
    c.backend = d.backend = cuda ? DP_BACKEND_CUDA : DP_BACKEND_CPU;
    c.guards = 0;
    dp_plan *pd = plan_of(m, &d), *p0 = plan_of(m, &c);
    c.guards = 1;
    dp_plan *p1 = plan_of(m, &c);
    size_t A = cuda ? 256 : 64;
    for (int dev = 0; dev < 2; dev++) {
      ck_assert_uint_eq(dp_plan_device_bytes(p0, dev), dp_plan_device_bytes(pd, dev));
      ck_assert_uint_eq(dp_plan_device_bytes(p1, dev), dp_plan_device_bytes(pd, dev) + 15 * A);
      for (int r = 0; r < DP_REGION_COUNT; r++) {
        dp_region_info a = dp_plan_region(pd, dev, (dp_region)r);
        dp_region_info b = dp_plan_region(p0, dev, (dp_region)r);
        ck_assert(a.offset == b.offset && a.size == b.size && a.align == b.align);
      }
    }
    ck_assert_int_eq(dp_plan_config(p0)->guards, 0);
    ck_assert_int_eq(dp_plan_config(p1)->guards, 1);
    ck_assert_uint_eq(dp_plan_region(p1, 0, DP_REGION_PARAMS).offset, A);
    if (!cuda) { /* the seed document's numbers, as test_planner pins them */
      ck_assert_uint_eq(dp_plan_device_bytes(p0, 0), 1536);
      ck_assert_uint_eq(dp_plan_device_bytes(p0, 1), 704);
      ck_assert_uint_eq(dp_plan_device_bytes(p1, 0), 2496);
      ck_assert_uint_eq(dp_plan_device_bytes(p1, 1), 1664);
    }
    dp_plan_free(pd);
    dp_plan_free(p0);
    dp_plan_free(p1);
  }
  dp_model_free(m);
}
END_TEST

/* Guards on: one alignment unit before the first region and after each of
 * the DP_REGION_COUNT regions, so every offset moves by align * (r + 1) and
 * the total by align * (DP_REGION_COUNT + 1); sizes do not change. */
START_TEST(guards_on_add_one_alignment_unit_per_region_and_one_before) {
  const char *specs[] = {SEED, MLP};
  bool with_cuda = cuda_or_skip("guards", "guards_on_add_one_alignment_unit_per_region_and_"
                                          "one_before (cuda)");
  for (int k = 0; k < 2; k++)
    for (int cuda = 0; cuda <= with_cuda; cuda++)
      for (int mode = 0; mode < 3; mode++)
        for (int n = 1; n <= 4; n++) {
          dp_model *m = model_of(specs[k]);
          dp_config c0 = guarded(30, n, 0);
          c0.backend = cuda ? DP_BACKEND_CUDA : DP_BACKEND_CPU;
          c0.mode = mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC;
          c0.shard_optimizer = mode == 2;
          dp_config_set_optimizer(&c0, DP_OPT_ADAMW);
          c0.micro_batch = k ? 3 : 0;
          dp_config c1 = c0;
          c1.guards = 1;
          dp_plan *a = plan_of(m, &c0), *b = plan_of(m, &c1);
          size_t A = cuda ? 256 : 64;
          ck_assert_int_eq(dp_plan_n_devices(a), dp_plan_n_devices(b));
          ck_assert_uint_eq(dp_plan_host_bytes(a), dp_plan_host_bytes(b));
          for (int d = 0; d < dp_plan_n_devices(a); d++) {
            ck_assert_uint_eq(dp_plan_device_bytes(b, d),
                              dp_plan_device_bytes(a, d) + A * (DP_REGION_COUNT + 1));
            size_t prev_end = 0;
            for (int r = 0; r < DP_REGION_COUNT; r++) {
              dp_region_info ra = dp_plan_region(a, d, (dp_region)r);
              dp_region_info rb = dp_plan_region(b, d, (dp_region)r);
              ck_assert_uint_eq(rb.size, ra.size);
              ck_assert_uint_eq(rb.offset, ra.offset + A * (size_t)(r + 1));
              ck_assert_uint_eq(rb.offset % A, 0);
              ck_assert_uint_ge(rb.offset - prev_end, A); /* a whole guard in between */
              prev_end = rb.offset + rb.size;
            }
            ck_assert_uint_ge(dp_plan_device_bytes(b, d) - prev_end, A);
          }
          dp_plan_free(a);
          dp_plan_free(b);
          dp_model_free(m);
        }
}
END_TEST

START_TEST(max_batch_counts_the_guards) {
  dp_model *m = model_of(MLP);
  dp_config c = guarded(1, 2, 1);
  size_t budget = 6000;
  int best = 0, plain = 0;
  ck_assert_int_eq(dp_plan_max_batch(m, &c, budget, 1000, &best), DP_OK);
  c.guards = 0;
  ck_assert_int_eq(dp_plan_max_batch(m, &c, budget, 1000, &plain), DP_OK);
  ck_assert_int_gt(best, 0);
  ck_assert_int_lt(best, plain);
  c.guards = 1;
  for (int batch = best; batch <= best + 1; batch++) {
    c.batch = batch;
    dp_plan *p = plan_of(m, &c);
    size_t mx = 0;
    for (int d = 0; d < dp_plan_n_devices(p); d++)
      if (dp_plan_device_bytes(p, d) > mx) mx = dp_plan_device_bytes(p, d);
    ck_assert(batch == best ? mx <= budget : mx > budget);
    dp_plan_free(p);
  }
  c.guards = 2;
  dp_plan *p = NULL;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_ERR_INVALID);
  dp_model_free(m);
}
END_TEST

/* ---- no op writes a guard; guards change no result ------------------------- */

/* _i: mode (0 classic, 1 allreduce, 2 sharded) * 4 + devices - 1 */
START_TEST(training_and_inference_leave_every_guard_intact) {
  int mode = _i / 4, n = _i % 4 + 1;
  const char *specs[] = {SEED, MLP};
  for (int k = 0; k < 2; k++)
    for (int mb = 0; mb <= 2; mb += 2)
      for (int opt = 0; opt < 3; opt++) {
        dp_model *m = model_of(specs[k]);
        dp_config c0 = guarded(29, n, 0);
        c0.mode = mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC;
        c0.shard_optimizer = mode == 2;
        c0.micro_batch = mb;
        dp_config_set_optimizer(&c0, (dp_optimizer)opt);
        dp_config c1 = c0;
        c1.guards = 1;
        dp_plan *pa = plan_of(m, &c0), *pb = plan_of(m, &c1);
        dp_ctx *a = ctx_of(pa), *b = ctx_of(pb);
        ck_assert_int_eq(dp_ctx_check_guards(b), DP_OK);
        batch bt;
        int out = dp_model_output_width(m);
        float ya[64 * 8], yb[64 * 8];
        for (int s = 0; s < 4; s++) {
          batch_fill(&bt, (uint64_t)s, out);
          int rows = s == 2 ? 7 : 29; /* a short batch too */
          float la, lb;
          ck_assert_int_eq(step(a, m, &bt, rows, &la), DP_OK);
          dp_status st = step(b, m, &bt, rows, &lb);
          ck_assert_msg(st == DP_OK, "mode %d, %d devices: %s", mode, n, dp_ctx_error(b));
          ck_assert(memcmp(&la, &lb, sizeof la) == 0);
          ck_assert_int_eq(dp_forward(a, rows, dp_model_input_width(m), bt.x, ya), DP_OK);
          ck_assert_msg(dp_forward(b, rows, dp_model_input_width(m), bt.x, yb) == DP_OK, "%s",
                        dp_ctx_error(b));
          ck_assert(memcmp(ya, yb, (size_t)rows * out * sizeof *ya) == 0);
        }
        ck_assert_int_eq(dp_ctx_check_guards(b), DP_OK);
        ck_assert(dp_params_hash(a) == dp_params_hash(b));
        /* the high-water mark counts content, not guards: the same word as
         * without guards, moved with its region */
        for (int d = 0; d < dp_plan_n_devices(pb); d++) {
          size_t hw = dp_ctx_high_water(a, d);
          ck_assert_uint_gt(hw, 0);
          int r = DP_REGION_COUNT - 1;
          while (r > 0 && dp_plan_region(pa, d, (dp_region)r).offset >= hw) r--;
          ck_assert_uint_eq(dp_ctx_high_water(b, d), hw + 64 * (size_t)(r + 1));
        }
        dp_ctx_free(a);
        dp_ctx_free(b);
        dp_plan_free(pa);
        dp_plan_free(pb);
        dp_model_free(m);
      }
}
END_TEST

/* ---- a stray write is caught and named ------------------------------------ */

typedef struct {
  int mode, n_devices, dev;
  dp_region region;
  int before; /* 1: the float just before the region's start; 0: just past its end */
  int via;    /* 0: dp_train_step, 1: dp_forward, 2: dp_ctx_check_guards */
  const char *want;
} stray_case;

static const stray_case STRAYS[] = {
    {0, 2, 0, DP_REGION_PARAMS, 0, 0, "device 0: a write ran past the end of region 'params'"},
    {0, 2, 0, DP_REGION_PARAMS, 1, 0, "device 0: a write ran before the start of region 'params'"},
    {0, 2, 1, DP_REGION_ACTIVATIONS, 0, 0,
     "device 1: a write ran past the end of region 'activations'"},
    {0, 3, 2, DP_REGION_OUTPUTS, 1, 0, "device 2: a write ran before the start of region 'outputs'"},
    {1, 4, 3, DP_REGION_OPT_STATE, 0, 0,
     "device 3: a write ran past the end of region 'optimizer_state'"},
    {2, 4, 1, DP_REGION_GRADS, 0, 0, "device 1: a write ran past the end of region 'grads'"},
    {1, 2, 1, DP_REGION_WORKSPACE, 0, 0, "device 1: a write ran past the end of region 'workspace'"},
    /* an empty region: anything written there is outside it */
    {0, 2, 1, DP_REGION_GATHERED_OUTPUTS, 0, 0,
     "device 1: a write ran past the end of region 'gathered_outputs'"},
    {0, 3, 1, DP_REGION_INPUTS, 0, 1, "device 1: a write ran past the end of region 'inputs'"},
    {1, 3, 2, DP_REGION_COMM, 0, 2, "device 2: a write ran past the end of region 'comm'"},
};
#define N_STRAYS (int)(sizeof STRAYS / sizeof *STRAYS)

START_TEST(a_write_one_float_outside_a_region_is_caught_and_named) {
  const stray_case *sc = &STRAYS[_i];
  dp_model *m = model_of(MLP);
  dp_config c = guarded(24, sc->n_devices, 1);
  c.mode = sc->mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC;
  c.shard_optimizer = sc->mode == 2;
  dp_config_set_optimizer(&c, DP_OPT_MOMENTUM);
  dp_plan *p = plan_of(m, &c);
  dp_ctx *ctx = ctx_of(p);
  batch bt;
  batch_fill(&bt, 5, dp_model_output_width(m));
  ck_assert_int_eq(step(ctx, m, &bt, 24, NULL), DP_OK);
  size_t np = dp_model_n_params(m);
  float *before = malloc(np * sizeof *before), *after = malloc(np * sizeof *after);
  ck_assert(before && after);
  ck_assert_int_eq(dp_get_params(ctx, before, np), DP_OK);
  /* the stray write */
  dp_region_info ri = dp_plan_region(p, sc->dev, sc->region);
  size_t at = sc->before ? ri.offset - 4 : ri.offset + ri.size;
  float one = 1.0f;
  memcpy(ctx->arena[sc->dev] + at, &one, sizeof one);
  float y[24 * 5], loss = 7.0f;
  dp_status s = sc->via == 0   ? step(ctx, m, &bt, 24, &loss)
                : sc->via == 1 ? dp_forward(ctx, 24, dp_model_input_width(m), bt.x, y)
                               : dp_ctx_check_guards(ctx);
  ck_assert_msg(s == DP_ERR_CORRUPT, "case %d: got %s", _i, dp_status_name(s));
  ck_assert_msg(strstr(dp_ctx_error(ctx), sc->want), "case %d: %s", _i, dp_ctx_error(ctx));
  char off[64];
  snprintf(off, sizeof off, "the first at offset %zu", at);
  ck_assert_msg(strstr(dp_ctx_error(ctx), off), "case %d: %s", _i, dp_ctx_error(ctx));
  /* caught before the update: nothing was applied */
  ck_assert(loss == 7.0f);
  ck_assert_uint_eq(dp_ctx_step(ctx), 1);
  ck_assert_int_eq(dp_get_params(ctx, after, np), DP_OK);
  ck_assert(memcmp(before, after, np * sizeof *after) == 0);
  /* and the context refuses to go on */
  ck_assert_int_eq(step(ctx, m, &bt, 24, NULL), DP_ERR_CORRUPT);
  ck_assert_msg(strstr(dp_ctx_error(ctx), "unusable") && strstr(dp_ctx_error(ctx), sc->want),
                "%s", dp_ctx_error(ctx));
  ck_assert_int_eq(dp_forward(ctx, 24, dp_model_input_width(m), bt.x, y), DP_ERR_CORRUPT);
  ck_assert_uint_eq(dp_ctx_step(ctx), 1);
  free(before);
  free(after);
  dp_ctx_free(ctx);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(several_damaged_guards_are_counted) {
  dp_model *m = model_of(MLP);
  dp_config c = guarded(24, 2, 1);
  dp_plan *p = plan_of(m, &c);
  dp_ctx *ctx = ctx_of(p);
  float one = 1.0f;
  dp_region_info a = dp_plan_region(p, 1, DP_REGION_LOSS), b = dp_plan_region(p, 0, DP_REGION_GRADS);
  memcpy(ctx->arena[1] + a.offset + a.size, &one, 4);
  memcpy(ctx->arena[0] + b.offset + b.size + 8, &one, 4);
  ck_assert_int_eq(dp_ctx_check_guards(ctx), DP_ERR_CORRUPT);
  /* the first in device order is named, the rest counted */
  ck_assert_msg(strstr(dp_ctx_error(ctx), "device 0: a write ran past the end of region 'grads'") &&
                    strstr(dp_ctx_error(ctx), "1 more guards damaged"),
                "%s", dp_ctx_error(ctx));
  dp_ctx_free(ctx);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(without_guards_there_is_nothing_to_check) {
  dp_model *m = model_of(SEED);
  dp_config c = guarded(30, 2, 0);
  dp_plan *p = plan_of(m, &c);
  dp_ctx *ctx = ctx_of(p);
  ck_assert_int_eq(dp_ctx_check_guards(ctx), DP_ERR_UNSUPPORTED);
  ck_assert_int_eq(dp_ctx_check_guards(NULL), DP_ERR_INVALID);
  ck_assert_str_eq(dp_status_name(DP_ERR_CORRUPT), "arena corrupted");
  dp_ctx_free(ctx);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* Caller-provided arenas get their guards filled too. */
START_TEST(static_arenas_are_guarded) {
  dp_model *m = model_of(MLP);
  dp_config c = guarded(24, 3, 1);
  dp_plan *p = plan_of(m, &c);
  void *arenas[DP_MAX_DEVICES] = {0};
  for (int d = 0; d < dp_plan_n_devices(p); d++) {
    arenas[d] = aligned_alloc(64, dp_plan_device_bytes(p, d));
    ck_assert_ptr_nonnull(arenas[d]);
    memset(arenas[d], 0xab, dp_plan_device_bytes(p, d)); /* whatever was there */
  }
  dp_ctx *ctx = NULL;
  /* a misaligned arena: the message gives the alignment (session 24) */
  void *kept = arenas[1];
  arenas[1] = (char *)kept + 8;
  ck_assert_int_eq(dp_ctx_create_static(p, arenas, NULL, &ctx), DP_ERR_INVALID);
  char want[96];
  snprintf(want, sizeof want, "is not aligned to %zu bytes, the plan's alignment",
           dp_plan_alignment(p));
  ck_assert_msg(strstr(dp_last_error(), "arena of device 1 (") &&
                    strstr(dp_last_error(), want),
                "%s", dp_last_error());
  arenas[1] = kept;
  ck_assert_int_eq(dp_ctx_create_static(p, arenas, NULL, &ctx), DP_OK);
  batch bt;
  batch_fill(&bt, 9, dp_model_output_width(m));
  ck_assert_int_eq(step(ctx, m, &bt, 24, NULL), DP_OK);
  dp_region_info ri = dp_plan_region(p, 2, DP_REGION_OUTPUT_GRADS);
  ((unsigned char *)arenas[2])[ri.offset + ri.size] ^= 1;
  ck_assert_int_eq(step(ctx, m, &bt, 24, NULL), DP_ERR_CORRUPT);
  ck_assert_msg(strstr(dp_ctx_error(ctx), "device 2: a write ran past the end of region "
                                          "'output_grads'"),
                "%s", dp_ctx_error(ctx));
  dp_ctx_free(ctx);
  for (int d = 0; d < dp_plan_n_devices(p); d++) free(arenas[d]);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* The documented way back from a hit guard: a successful dp_ckpt_load makes
 * the context usable again, its guards refilled (else the next step fails on
 * the same damaged guard). */
START_TEST(a_checkpoint_load_recovers_from_a_hit_guard) {
  dp_model *m = model_of(MLP);
  dp_config c = guarded(24, 2, 1);
  dp_plan *p = plan_of(m, &c);
  dp_ctx *ctx = ctx_of(p), *ref = ctx_of(p);
  batch bt;
  batch_fill(&bt, 5, dp_model_output_width(m));
  ck_assert_int_eq(step(ctx, m, &bt, 24, NULL), DP_OK);
  ck_assert_int_eq(step(ref, m, &bt, 24, NULL), DP_OK);
  char path[64];
  snprintf(path, sizeof path, "/tmp/dp_guard_recover_%d.ckpt", (int)getpid());
  ck_assert_int_eq(dp_ckpt_save(ctx, path), DP_OK);
  dp_region_info pr = dp_plan_region(p, 1, DP_REGION_PARAMS);
  ctx->arena[1][pr.offset + pr.size + 1] ^= 0x5a;
  ck_assert_int_eq(step(ctx, m, &bt, 24, NULL), DP_ERR_CORRUPT);
  ck_assert_int_eq(dp_ckpt_load(ctx, path), DP_OK);
  ck_assert_int_eq(dp_ctx_check_guards(ctx), DP_OK);
  float la, lb;
  ck_assert_msg(step(ctx, m, &bt, 24, &la) == DP_OK, "%s", dp_ctx_error(ctx));
  ck_assert_int_eq(step(ref, m, &bt, 24, &lb), DP_OK);
  ck_assert(memcmp(&la, &lb, sizeof la) == 0);
  ck_assert(dp_params_hash(ctx) == dp_params_hash(ref));
  remove(path);
  dp_ctx_free(ctx);
  dp_ctx_free(ref);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

Suite *guards_suite(void) {
  Suite *s = suite_create("guards");
  TCase *tc = tcase_create("layout");
  tcase_add_test(tc, guards_off_leave_the_seed_layout_exact);
  tcase_add_test(tc, guards_on_add_one_alignment_unit_per_region_and_one_before);
  tcase_add_test(tc, max_batch_counts_the_guards);
  suite_add_tcase(s, tc);
  tc = tcase_create("intact");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, training_and_inference_leave_every_guard_intact, 0, 12);
  suite_add_tcase(s, tc);
  tc = tcase_create("detect");
  tcase_add_loop_test(tc, a_write_one_float_outside_a_region_is_caught_and_named, 0, N_STRAYS);
  tcase_add_test(tc, several_damaged_guards_are_counted);
  tcase_add_test(tc, without_guards_there_is_nothing_to_check);
  tcase_add_test(tc, static_arenas_are_guarded);
  tcase_add_test(tc, a_checkpoint_load_recovers_from_a_hit_guard);
  suite_add_tcase(s, tc);
  return s;
}
