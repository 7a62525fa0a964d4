/* libFuzzer harness: the .dpm model spec parser (lib/model/spec.c, lib/model/model.c).
 *
 * For arbitrary bytes (made a C string: the parser takes text up to the first
 * NUL), dp_model_parse must either
 *   - fail with a parse-family status, leave *out NULL, and name the place as
 *     "fuzz.dpm:LINE:COL: ..."; or
 *   - succeed, and then:
 *     - dp_model_format's length query equals what it writes, and a short
 *       buffer gets a NUL-terminated prefix;
 *     - the formatted text parses again to the same shapes and formats to the
 *       identical text (a fixed point);
 *     - planning it with a small configuration (derived from the input's hash:
 *       batch 1..9, 1..4 devices, split, micro-batch, mode, optimizer) either
 *       succeeds with a consistent plan or fails cleanly with a message;
 *     - when the model is small, a context is made and one training step (or
 *       an inference pass) runs on fixed inputs (on 1 or 2 devices, arena guards
 *       on or off, either non-finite policy): the result is DP_OK or
 *       DP_ERR_NONFINITE (never DP_ERR_CORRUPT: no op writes outside its
 *       region), and a refused or skipped step changes no parameter. */
#include "dp.h"
#include "fuzz_util.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#define NAME "fuzz.dpm"

static void check_same_shapes(const dp_model *a, const dp_model *b) {
  FUZZ_CHECK(dp_model_input_width(a) == dp_model_input_width(b), "input width %d vs %d",
             dp_model_input_width(a), dp_model_input_width(b));
  FUZZ_CHECK(dp_model_n_layers(a) == dp_model_n_layers(b), "layers %d vs %d",
             dp_model_n_layers(a), dp_model_n_layers(b));
  FUZZ_CHECK(dp_model_output_width(a) == dp_model_output_width(b), "output width");
  FUZZ_CHECK(dp_model_loss(a) == dp_model_loss(b), "loss");
  dp_bce_options pa, pb; /* bce_with_logits' pos_weight survives the round trip */
  FUZZ_CHECK(!dp_model_bce_options(a, &pa) && !dp_model_bce_options(b, &pb) &&
                 pa.n_pos_weights == pb.n_pos_weights &&
                 (!pa.n_pos_weights || !memcmp(pa.pos_weights, pb.pos_weights,
                                               (size_t)pa.n_pos_weights * sizeof(float))),
             "pos_weight");
  FUZZ_CHECK(dp_model_n_params(a) == dp_model_n_params(b), "params %zu vs %zu",
             dp_model_n_params(a), dp_model_n_params(b));
  for (int i = 0; i < dp_model_n_layers(a); i++) {
    FUZZ_CHECK(dp_model_layer_kind(a, i) == dp_model_layer_kind(b, i), "layer %d kind", i);
    dp_layer_info x, y; /* image shapes, kernel, stride, padding too */
    FUZZ_CHECK(!dp_model_layer(a, i, &x) && !dp_model_layer(b, i, &y), "layer %d info", i);
    FUZZ_CHECK(x.in == y.in && x.out == y.out && x.channels == y.channels &&
                   x.height == y.height && x.width == y.width && x.kernel == y.kernel &&
                   x.stride == y.stride && x.padding == y.padding && x.bias == y.bias &&
                   x.exclude_pad == y.exclude_pad,
               "layer %d shape", i);
  }
}

static char *format_checked(const dp_model *m) {
  size_t len = dp_model_format(m, NULL, 0);
  FUZZ_CHECK(len > 0, "a parsed model formats to nothing");
  char *buf = malloc(len + 1);
  FUZZ_CHECK(buf != NULL, "out of memory");
  size_t len2 = dp_model_format(m, buf, len + 1);
  FUZZ_CHECK(len2 == len && strlen(buf) == len, "format: %zu, then %zu, strlen %zu", len,
             len2, strlen(buf));
  /* A short buffer: a NUL-terminated prefix, the same needed length. */
  char small[8];
  memset(small, 'x', sizeof small);
  FUZZ_CHECK(dp_model_format(m, small, sizeof small) == len,
             "short buffer changes the length");
  FUZZ_CHECK(memchr(small, '\0', sizeof small) != NULL, "short buffer not terminated");
  FUZZ_CHECK(strncmp(small, buf, strlen(small)) == 0, "short buffer is not a prefix");
  return buf;
}

/* Small enough to allocate and run a step on in well under a millisecond. */
static int runnable(const dp_model *m) {
  if (dp_model_n_params(m) > 4096 || dp_model_input_width(m) > 64) return 0;
  /* widths are bounded by the parameter count except between linears
   * (activations keep the width): bound the output too */
  return dp_model_output_width(m) <= 64;
}

static void run_small(const dp_plan *p, const dp_model *m, uint64_t h) {
  dp_ctx *c = NULL;
  dp_status s = dp_ctx_create(p, &c);
  if (s != DP_OK) {
    FUZZ_CHECK(c == NULL && (s == DP_ERR_NOMEM || s == DP_ERR_UNSUPPORTED),
               "dp_ctx_create: %s: %s", dp_status_name(s), dp_last_error());
    return;
  }
  const dp_config *cfg = dp_plan_config(p);
  int rows = cfg->batch, in = dp_model_input_width(m), out = dp_model_output_width(m);
  /* a sequence model: token ids in (below the embedding's vocabulary), a
   * class label per position out */
  int T = dp_model_positions(m), classes = out / T;
  dp_layer_info first;
  int vocab = dp_model_layer(m, 0, &first) == DP_OK ? first.vocab : 0;
  float x[9 * 64], y[9 * 64], t[9 * 64];
  int32_t labels[9 * 64];
  for (int i = 0; i < rows * in; i++)
    x[i] = vocab ? (float)((h >> (i % 60)) % (uint64_t)vocab)
                 : (float)((int)((h >> (i % 60)) & 15) - 7) * 0.25f;
  for (int i = 0; i < rows * out; i++) t[i] = (float)(i % 3) - 1.0f;
  for (int r = 0; r < rows * T; r++)
    labels[r] = (int32_t)((h + (uint64_t)r) % (uint64_t)classes);
  size_t np = dp_model_n_params(m);
  if (!cfg->inference) {
    uint64_t before = dp_params_hash(c);
    float loss = 0.0f;
    s = dp_train_step(
        c, rows, in, x,
        dp_model_loss(m) == DP_LOSS_MSE ? (const void *)t : (const void *)labels, &loss);
    bool bn = false; /* batchnorm refuses a micro-batch of one value per channel */
    for (int i = 0; i < dp_model_n_layers(m); i++)
      bn |= dp_model_layer_kind(m, i) == DP_LAYER_BATCHNORM;
    FUZZ_CHECK(s == DP_OK || s == DP_ERR_NONFINITE || (bn && s == DP_ERR_SHAPE),
               "dp_train_step: %s: %s", dp_status_name(s), dp_ctx_error(c));
    fuzz_count(s == DP_OK              ? "trained a step"
               : s == DP_ERR_NONFINITE ? "step refused (non-finite)"
                                       : "step refused (batchnorm, one row)");
    if (s == DP_OK && isfinite(loss)) {
      FUZZ_CHECK(dp_ctx_step(c) == 1, "step counter %llu",
                 (unsigned long long)dp_ctx_step(c));
    } else if (s == DP_OK) { /* skipped: on_nonfinite = DP_NONFINITE_SKIP */
      FUZZ_CHECK(cfg->on_nonfinite == DP_NONFINITE_SKIP,
                 "a step returned DP_OK and loss %g", (double)loss);
      FUZZ_CHECK(dp_params_hash(c) == before && dp_ctx_step(c) == 0 &&
                     dp_ctx_skipped_steps(c) == 1,
                 "a skipped step changed the parameters or the counters");
    } else {
      FUZZ_CHECK(dp_params_hash(c) == before && dp_ctx_step(c) == 0,
                 "a refused step changed the parameters or the step counter");
    }
  }
  s = dp_forward(c, rows, in, x, y);
  fuzz_count("ran a forward");
  FUZZ_CHECK(s == DP_OK, "dp_forward: %s: %s", dp_status_name(s), dp_ctx_error(c));
  if (np > 0) {
    float *params = malloc(np * sizeof *params);
    FUZZ_CHECK(params != NULL, "out of memory");
    FUZZ_CHECK(dp_get_params(c, params, np) == DP_OK, "dp_get_params: %s", dp_ctx_error(c));
    FUZZ_CHECK(dp_set_params(c, params, np) == DP_OK, "dp_set_params: %s", dp_ctx_error(c));
    free(params);
  }
  for (int d = 0; d < dp_plan_n_devices(p); d++)
    FUZZ_CHECK(dp_ctx_high_water(c, d) <= dp_plan_device_bytes(p, d),
               "device %d: high water %zu above the plan's %zu", d, dp_ctx_high_water(c, d),
               dp_plan_device_bytes(p, d));
  dp_ctx_free(c);
}

static void plan_small(const dp_model *m, uint64_t h) {
  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = 1 + (int)(h % 9);
  cfg.n_devices = 1 + (int)((h >> 4) % 4);
  cfg.split = (dp_split)((h >> 8) % 3);
  cfg.micro_batch = (int)((h >> 12) % 4);
  cfg.mode = (dp_mode)((h >> 16) % 2);
  dp_config_set_optimizer(&cfg, (dp_optimizer)((h >> 20) % 3));
  cfg.shard_optimizer = cfg.mode == DP_MODE_ALLREDUCE && ((h >> 24) & 1);
  cfg.inference = dp_model_loss(m) == DP_LOSS_NONE;
  cfg.guards = (int)((h >> 28) & 1); /* a write outside its region fails the step */
  cfg.on_nonfinite = (dp_nonfinite_policy)((h >> 29) & 1);
  cfg.seed = h >> 32;
  dp_plan *p = NULL;
  dp_status s = dp_plan_create(m, &cfg, &p);
  fuzz_count(s == DP_OK ? "planned" : "plan refused");
  if (s != DP_OK) {
    FUZZ_CHECK(p == NULL, "failed plan returned an object");
    FUZZ_CHECK(s == DP_ERR_OVERFLOW || s == DP_ERR_NOMEM || s == DP_ERR_INVALID,
               "dp_plan_create: unexpected %s: %s", dp_status_name(s), dp_last_error());
    FUZZ_CHECK(dp_last_error()[0] != '\0', "dp_plan_create failed without a message");
    return;
  }
  int nd = dp_plan_n_devices(p), rows = 0;
  FUZZ_CHECK(nd >= 1 && nd <= cfg.n_devices, "%d devices used of %d", nd, cfg.n_devices);
  for (int d = 0; d < nd; d++) {
    rows += dp_plan_device_rows(p, d);
    size_t end = 0;
    for (int r = 0; r < DP_REGION_COUNT; r++) {
      dp_region_info ri = dp_plan_region(p, d, (dp_region)r);
      FUZZ_CHECK(ri.offset >= end, "device %d region %d overlaps the previous", d, r);
      end = ri.offset + ri.size;
    }
    FUZZ_CHECK(end <= dp_plan_device_bytes(p, d), "device %d: regions end past the total",
               d);
  }
  FUZZ_CHECK(rows == cfg.batch, "devices hold %d rows of %d", rows, cfg.batch);
  const dp_op *ops = dp_plan_ops(p);
  for (int i = 0; i < dp_plan_n_ops(p); i++)
    FUZZ_CHECK(ops[i].device >= 0 && ops[i].device < nd, "op %d on device %d", i,
               ops[i].device);
  if (runnable(m)) {
    /* the run on at most 2 devices: threads are the cost here, and the
     * executor has its own tests; the plan above took up to 4 */
    if (cfg.n_devices > 2) {
      dp_plan_free(p);
      p = NULL;
      cfg.n_devices -= 2;
      s = dp_plan_create(m, &cfg, &p);
      FUZZ_CHECK(s == DP_OK, "the same model on fewer devices: %s", dp_last_error());
    }
    run_small(p, m, h);
  }
  dp_plan_free(p);

  int best = -1;
  s = dp_plan_max_batch(m, &cfg, (size_t)1 << 20, 16, &best);
  FUZZ_CHECK(s != DP_OK || (best >= 0 && best <= 16), "max batch %d", best);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  dp_model *m = (dp_model *)(uintptr_t)1;
  dp_status s = dp_model_parse(text, NAME, &m);
  free(text);
  fuzz_count(s == DP_OK ? "parsed" : "refused");
  if (s != DP_OK) {
    FUZZ_CHECK(m == NULL, "failed parse left *out set");
    FUZZ_CHECK(s == DP_ERR_PARSE || s == DP_ERR_OVERFLOW || s == DP_ERR_NOMEM,
               "unexpected status %s: %s", dp_status_name(s), dp_last_error());
    FUZZ_CHECK(strncmp(dp_last_error(), NAME ":", strlen(NAME) + 1) == 0,
               "error does not name the place: '%s'", dp_last_error());
    return 0;
  }
  FUZZ_CHECK(m != NULL, "parse succeeded without a model");
  char *f1 = format_checked(m);
  dp_model *m2 = NULL;
  s = dp_model_parse(f1, "formatted", &m2);
  FUZZ_CHECK(s == DP_OK, "the formatted model does not parse: %s\n%s", dp_last_error(), f1);
  check_same_shapes(m, m2);
  char *f2 = format_checked(m2);
  FUZZ_CHECK(strcmp(f1, f2) == 0, "format is not a fixed point:\n%s---\n%s", f1, f2);
  free(f1);
  free(f2);
  dp_model_free(m2);
  plan_small(m, fuzz_hash(data, size));
  dp_model_free(m);
  return 0;
}
