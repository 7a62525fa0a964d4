/* Tests of dp.h's inspection, naming and diagnostic functions (the ones the
 * `dp` tool needs so that it uses dp.h alone): dp_model_layer, the state_dict
 * tensor list, dp_hash_bytes, the enum names, the GEMM tier, dp_bench_sgemm and
 * dp_cuda_device_info, what a backend reports of itself (dp_backend_caps); and
 * checks that tools/ includes nothing but dp.h and its own headers and names
 * no backend. */
#include "core/backend.h" /* dp__backend_ops / dp__backend_register: the pass-through test */

#include <check.h>
#include <ctype.h>
#include <math.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Every layer kind, and a linear without a bias:
 *   index: 0 linear 8, 1 relu, 2 gelu, 3 tanh, 4 sigmoid, 5 layernorm,
 *          6 dropout 0.25, 7 linear 3 nobias
 * = nn.Sequential(Linear(5, 8), ReLU(), GELU('tanh'), Tanh(), Sigmoid(),
 *                 LayerNorm(8), Dropout(0.25), Linear(8, 3, bias=False)) */
static const char EVERY_KIND[] = "input 5\nlinear 8\nrelu\ngelu\ntanh\nsigmoid\nlayernorm\n"
                                 "dropout 0.25\nlinear 3 nobias\nloss mse\n";

static dp_model *parse(const char *text) {
  dp_model *m = NULL;
  ck_assert_msg(dp_model_parse(text, "test", &m) == DP_OK, "%s", dp_last_error());
  return m;
}

/* ---- names ---------------------------------------------------------------------- */

/* Names of values 0..last: non-empty, not "?", distinct; "?" past both ends. */
#define CHECK_NAMES(fn, type, last)                                                        \
  do {                                                                                     \
    for (int i_ = 0; i_ <= (int)(last); i_++) {                                            \
      const char *n_ = fn((type)i_);                                                       \
      ck_assert_msg(n_ &&n_[0] && strcmp(n_, "?") != 0, #fn "(%d) = '%s'", i_,             \
                    n_ ? n_ : "(null)");                                                   \
      for (int j_ = 0; j_ < i_; j_++)                                                      \
        ck_assert_msg(strcmp(n_, fn((type)j_)) != 0, #fn ": %d and %d are both '%s'", j_,  \
                      i_, n_);                                                             \
    }                                                                                      \
    ck_assert_str_eq(fn((type)((int)(last) + 1)), "?");                                    \
    ck_assert_str_eq(fn((type)-1), "?");                                                   \
    ck_assert_str_eq(fn((type)1000), "?");                                                 \
  } while (0)

START_TEST(every_enum_value_has_a_name) {
  CHECK_NAMES(dp_layer_kind_name, dp_layer_kind, DP_LAYER_SHORTCUT);
  CHECK_NAMES(dp_loss_name, dp_loss_kind, DP_LOSS_BCE_LOGITS);
  CHECK_NAMES(dp_split_name, dp_split, DP_SPLIT_MEMORY);
  CHECK_NAMES(dp_mode_name, dp_mode, DP_MODE_ALLREDUCE);
  CHECK_NAMES(dp_optimizer_name, dp_optimizer, DP_OPT_ADAM);
  CHECK_NAMES(dp_transport_name, dp_transport, DP_TRANSPORT_NCCL);
  CHECK_NAMES(dp_backend_name, dp_backend, DP_BACKEND_CUDA);
  CHECK_NAMES(dp_region_name, dp_region, DP_REGION_COUNT - 1);
  CHECK_NAMES(dp_phase_name, dp_phase, DP_PHASE_COUNT - 1);
  CHECK_NAMES(dp_op_kind_name, dp_op_kind, DP_OP_GRAD_CLAMP);
  CHECK_NAMES(dp_bn_mode_name, dp_bn_mode, DP_BN_SYNC);
}
END_TEST

START_TEST(names_are_the_spec_and_command_line_words) {
  ck_assert_str_eq(dp_layer_kind_name(DP_LAYER_LINEAR), "linear");
  ck_assert_str_eq(dp_layer_kind_name(DP_LAYER_LAYERNORM), "layernorm");
  ck_assert_str_eq(dp_loss_name(DP_LOSS_NONE), "none");
  ck_assert_str_eq(dp_loss_name(DP_LOSS_MSE), "mse");
  ck_assert_str_eq(dp_loss_name(DP_LOSS_SOFTMAX_CE), "softmax_cross_entropy");
  ck_assert_str_eq(dp_split_name(DP_SPLIT_CHUNK), "chunk");
  ck_assert_str_eq(dp_mode_name(DP_MODE_CLASSIC), "classic");
  ck_assert_str_eq(dp_bn_mode_name(DP_BN_SYNC), "sync");
  ck_assert_str_eq(dp_bn_mode_name(DP_BN_PER_REPLICA), "per_replica");
  ck_assert_str_eq(dp_optimizer_name(DP_OPT_MOMENTUM), "momentum");
  ck_assert_str_eq(dp_transport_name(DP_TRANSPORT_AUTO), "auto");
  /* the layer and loss names are the spec's: a spec written with them parses
   * back to the same layers */
  char spec[512];
  int len = snprintf(spec, sizeof spec, "input 4\n");
  for (int k = DP_LAYER_RELU; k <= DP_LAYER_LAYERNORM; k++)
    len += snprintf(spec + len, sizeof spec - (size_t)len, "%s\n",
                    dp_layer_kind_name((dp_layer_kind)k));
  snprintf(spec + len, sizeof spec - (size_t)len, "loss %s\n",
           dp_loss_name(DP_LOSS_SOFTMAX_CE));
  dp_model *m = parse(spec);
  ck_assert_int_eq(dp_model_n_layers(m), DP_LAYER_LAYERNORM - DP_LAYER_RELU + 1);
  for (int i = 0; i < dp_model_n_layers(m); i++)
    ck_assert_int_eq(dp_model_layer_kind(m, i), DP_LAYER_RELU + i);
  ck_assert_int_eq(dp_model_loss(m), DP_LOSS_SOFTMAX_CE);
  dp_model_free(m);
}
END_TEST

/* ---- layers and tensors ------------------------------------------------------------ */

START_TEST(model_layer_describes_every_kind) {
  dp_model *m = parse(EVERY_KIND);
  static const struct {
    dp_layer_kind kind;
    int in, out, bias;
    float p;
    size_t off, n;
  } want[] = {
      {DP_LAYER_LINEAR, 5, 8, 1, 0, 0, 48},      {DP_LAYER_RELU, 8, 8, 0, 0, 48, 0},
      {DP_LAYER_GELU, 8, 8, 0, 0, 48, 0},        {DP_LAYER_TANH, 8, 8, 0, 0, 48, 0},
      {DP_LAYER_SIGMOID, 8, 8, 0, 0, 48, 0},     {DP_LAYER_LAYERNORM, 8, 8, 0, 0, 48, 16},
      {DP_LAYER_DROPOUT, 8, 8, 0, 0.25f, 64, 0}, {DP_LAYER_LINEAR, 8, 3, 0, 0, 64, 24},
  };
  int n = (int)(sizeof want / sizeof *want);
  ck_assert_int_eq(dp_model_n_layers(m), n);
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    dp_layer_info l;
    memset(&l, 0xa5, sizeof l);
    ck_assert_int_eq(dp_model_layer(m, i, &l), DP_OK);
    ck_assert_int_eq(l.kind, want[i].kind);
    ck_assert_int_eq(l.kind, dp_model_layer_kind(m, i));
    ck_assert_int_eq(l.in, want[i].in);
    ck_assert_int_eq(l.out, want[i].out);
    ck_assert_int_eq(l.bias, want[i].bias);
    ck_assert_float_eq(l.p, want[i].p);
    ck_assert_uint_eq(l.param_offset, want[i].off);
    ck_assert_uint_eq(l.n_params, want[i].n);
    ck_assert_int_eq(l.exclude_pad, 0); /* written (0xa5 before): not a pool */
    total += l.n_params;
  }
  ck_assert_uint_eq(total, dp_model_n_params(m));
  dp_layer_info l;
  memset(&l, 0xa5, sizeof l);
  ck_assert_int_eq(dp_model_layer(m, n, &l), DP_ERR_RANGE);
  ck_assert_msg(strstr(dp_last_error(), "layer 8 out of range"), "%s", dp_last_error());
  ck_assert_int_eq(l.kind, 0);
  ck_assert_uint_eq(l.n_params, 0);
  ck_assert_int_eq(dp_model_layer(m, -1, &l), DP_ERR_RANGE);
  ck_assert_int_eq(dp_model_layer(NULL, 0, &l), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_layer(m, 0, NULL), DP_ERR_INVALID);
  dp_model_free(m);
}
END_TEST

START_TEST(tensors_are_the_state_dict_of_the_sequential) {
  dp_model *m = parse(EVERY_KIND);
  static const struct {
    const char *name;
    int ndim, d0, d1;
  } want[] = {{"0.weight", 2, 8, 5},
              {"0.bias", 1, 8, 0},
              {"5.weight", 1, 8, 0},
              {"5.bias", 1, 8, 0},
              {"7.weight", 2, 3, 8}};
  int n = (int)(sizeof want / sizeof *want);
  ck_assert_int_eq(dp_model_n_tensors(m), n);
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    dp_tensor_info t;
    ck_assert_int_eq(dp_model_tensor(m, i, &t), DP_OK);
    ck_assert_str_eq(t.name, want[i].name);
    ck_assert_int_eq(t.ndim, want[i].ndim);
    ck_assert_int_eq(t.dims[0], want[i].d0);
    ck_assert_int_eq(t.dims[1], want[i].d1);
    ck_assert_uint_eq(t.numel, (size_t)want[i].d0 * (size_t)(want[i].d1 ? want[i].d1 : 1));
    ck_assert_uint_eq(t.offset, off); /* the tensors tile the flat array in order */
    off += t.numel;
  }
  ck_assert_uint_eq(off, dp_model_n_params(m));
  dp_tensor_info t;
  ck_assert_int_eq(dp_model_tensor(m, n, &t), DP_ERR_RANGE);
  ck_assert_str_eq(t.name, "");
  ck_assert_int_eq(dp_model_tensor(m, -1, &t), DP_ERR_RANGE);
  ck_assert_int_eq(dp_model_tensor(NULL, 0, &t), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_n_tensors(NULL), 0);
  dp_model_free(m);

  /* no parameters at all; and the seed document's Linear(5, 2) */
  m = parse("input 3\nrelu\n");
  ck_assert_int_eq(dp_model_n_tensors(m), 0);
  ck_assert_int_eq(dp_model_tensor(m, 0, &t), DP_ERR_RANGE);
  dp_model_free(m);
  m = parse("input 5\nlinear 2\nloss mse\n");
  ck_assert_int_eq(dp_model_n_tensors(m), 2);
  ck_assert_int_eq(dp_model_tensor(m, 1, &t), DP_OK);
  ck_assert_str_eq(t.name, "0.bias");
  ck_assert_uint_eq(t.offset, 10);
  dp_model_free(m);
}
END_TEST

/* Layer widths past 2^16 and the largest layer index still fit the name. */
START_TEST(tensor_names_fit_at_the_limits) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_new(3, &m), DP_OK);
  for (int i = 0; i < DP_MAX_LAYERS - 1; i++)
    ck_assert_int_eq(dp_model_add(m, DP_LAYER_RELU), DP_OK);
  ck_assert_int_eq(dp_model_add_linear(m, 100000, 1), DP_OK);
  ck_assert_int_eq(dp_model_n_tensors(m), 2);
  dp_tensor_info t;
  ck_assert_int_eq(dp_model_tensor(m, 1, &t), DP_OK);
  ck_assert_str_eq(t.name, "255.bias");
  ck_assert_int_eq(t.dims[0], 100000);
  ck_assert_uint_eq(t.offset, 300000);
  dp_model_free(m);
}
END_TEST

/* ---- hash ---------------------------------------------------------------------------- */

START_TEST(hash_bytes_is_the_params_hash) {
  /* FNV-1a 64's published values */
  ck_assert_uint_eq(dp_hash_bytes(NULL, 0), 0xcbf29ce484222325ull);
  ck_assert_uint_eq(dp_hash_bytes("a", 1), 0xaf63dc4c8601ec8cull);
  ck_assert_uint_eq(dp_hash_bytes("foobar", 6), 0x85944171f73967e8ull);

  dp_model *m = parse(EVERY_KIND);
  dp_config c;
  dp_config_default(&c);
  c.batch = 6;
  c.n_devices = 2;
  dp_plan *p = NULL;
  dp_ctx *ctx = NULL;
  ck_assert_msg(dp_plan_create(m, &c, &p) == DP_OK, "%s", dp_last_error());
  ck_assert_msg(dp_ctx_create(p, &ctx) == DP_OK, "%s", dp_last_error());
  size_t np = dp_model_n_params(m);
  float *w = malloc(np * sizeof *w), x[6 * 5], t[6 * 3];
  ck_assert_ptr_nonnull(w);
  for (int i = 0; i < 6 * 5; i++) x[i] = (float)(i % 7) * 0.25f - 0.5f;
  for (int i = 0; i < 6 * 3; i++) t[i] = (float)(i % 3) * 0.5f;
  for (int step = 0; step < 3; step++) {
    ck_assert_int_eq(dp_get_params(ctx, w, np), DP_OK);
    ck_assert_uint_eq(dp_hash_bytes(w, np * sizeof *w), dp_params_hash(ctx));
    float loss;
    ck_assert_msg(dp_train_step(ctx, 6, 5, x, t, &loss) == DP_OK, "%s", dp_ctx_error(ctx));
  }
  free(w);
  dp_ctx_free(ctx);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* ---- GEMM tier and benchmarks -------------------------------------------------------- */

START_TEST(gemm_tier_switches_and_refuses_nonsense) {
  const char *start = dp_gemm_tier();
  ck_assert_msg(!strcmp(start, "avx512") || !strcmp(start, "avx2") ||
                    !strcmp(start, "scalar"),
                "%s", start);
  ck_assert_int_eq(dp_gemm_set_tier("auto"), DP_OK);
  const char *best = dp_gemm_tier();
  ck_assert_int_eq(dp_gemm_set_tier("scalar"), DP_OK);
  ck_assert_str_eq(dp_gemm_tier(), "scalar");
  ck_assert_int_eq(dp_gemm_set_tier("nonsense"), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_last_error(), "'nonsense'"), "%s", dp_last_error());
  ck_assert_str_eq(dp_gemm_tier(), "scalar"); /* unchanged */
  ck_assert_int_eq(dp_gemm_set_tier(""), DP_ERR_INVALID);
  static const char *const fast[] = {"avx2", "avx512"};
  for (int i = 0; i < 2; i++) {
    dp_status s = dp_gemm_set_tier(fast[i]);
    ck_assert_msg(s == DP_OK || s == DP_ERR_UNSUPPORTED, "%s: %s", fast[i],
                  dp_status_name(s));
    ck_assert_str_eq(dp_gemm_tier(), s == DP_OK ? fast[i] : "scalar");
    if (s == DP_OK) ck_assert_int_eq(dp_gemm_set_tier("scalar"), DP_OK);
  }
  /* the bf16 GEMM on its instruction: the avx512 tier, by another name */
  dp_status s = dp_gemm_set_tier("avx512bf16");
  ck_assert_msg(s == DP_OK || s == DP_ERR_UNSUPPORTED, "%s", dp_status_name(s));
  ck_assert_str_eq(dp_gemm_tier(), s == DP_OK ? "avx512" : "scalar");
  ck_assert_int_eq(dp_gemm_set_tier(NULL), DP_OK);
  ck_assert_str_eq(dp_gemm_tier(), best);
}
END_TEST

START_TEST(bench_sgemm_on_the_cpu) {
  double ms = -1.0;
  ck_assert_msg(dp_bench_sgemm(DP_BACKEND_CPU, 0, 48, 40, 33, 3, 0, &ms) == DP_OK, "%s",
                dp_last_error());
  ck_assert_msg(ms > 0.0, "%g ms", ms);
  ck_assert_int_eq(dp_bench_sgemm(DP_BACKEND_CPU, 0, 1, 1, 1, 1, 0, &ms), DP_OK);
  /* refused, *ms = 0 */
  ck_assert_int_eq(dp_bench_sgemm(DP_BACKEND_CPU, 0, 0, 4, 4, 1, 0, &ms), DP_ERR_INVALID);
  ck_assert_msg(ms == 0.0, "%g", ms);
  ck_assert_int_eq(dp_bench_sgemm(DP_BACKEND_CPU, 0, 4, 4, 4, 0, 0, &ms), DP_ERR_INVALID);
  ck_assert_int_eq(dp_bench_sgemm(DP_BACKEND_CPU, 0, 4, 4, 4, 1, 0, NULL), DP_ERR_INVALID);
  ck_assert_int_eq(dp_bench_sgemm(DP_BACKEND_CPU, 1, 4, 4, 4, 1, 0, &ms), DP_ERR_INVALID);
  ck_assert_int_eq(dp_bench_sgemm(DP_BACKEND_CPU, 0, 4, 4, 4, 1, 1, &ms), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_last_error(), "TF32"), "%s", dp_last_error());
  ck_assert_int_eq(dp_bench_sgemm((dp_backend)7, 0, 4, 4, 4, 1, 0, &ms), DP_ERR_INVALID);
}
END_TEST

/* Without the CUDA backend: DP_ERR_UNSUPPORTED naming why. With it (test_dp
 * registers it in a CUDA build): a time, or the CUDA error when there is no
 * GPU. */
START_TEST(bench_sgemm_and_device_info_on_cuda) {
  double ms = -1.0;
  char name[128] = "unchanged";
  size_t total = 0, free_mem = 0;
  dp_status s = dp_bench_sgemm(DP_BACKEND_CUDA, 0, 64, 64, 64, 2, 0, &ms);
  dp_status si = dp_cuda_device_info(0, name, sizeof name, &total, &free_mem);
  if (!dp_cuda_available()) {
    ck_assert_int_eq(s, DP_ERR_UNSUPPORTED);
    ck_assert_int_eq(si, DP_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(dp_last_error(), "not registered"), "%s", dp_last_error());
    ck_assert_str_eq(name, "");
    return;
  }
  if (s == DP_OK)
    ck_assert_msg(ms > 0.0, "%g ms", ms);
  else
    ck_assert_msg(ms == 0.0 && dp_last_error()[0], "%s: ms %g, '%s'", dp_status_name(s), ms,
                  dp_last_error());
  if (si == DP_OK)
    ck_assert_msg(name[0] && total > 0 && free_mem <= total, "'%s' %zu %zu", name, total,
                  free_mem);
  else
    ck_assert_msg(dp_cuda_device_info(0, NULL, 0, NULL, NULL) != DP_OK &&
                      dp_last_error()[0],
                  "%s", dp_last_error());
  ck_assert_int_eq(dp_bench_sgemm(DP_BACKEND_CUDA, 0, 64, 0, 64, 2, 0, &ms),
                   DP_ERR_INVALID);
}
END_TEST

/* A registered backend's diagnostic slots are what dp_bench_sgemm and
 * dp_cuda_device_info call, with the caller's arguments. (Registers a double
 * for DP_BACKEND_CUDA and puts the real one back; skipped under CK_FORK=no in a
 * build without CUDA, where nothing could be put back.) */
static struct {
  int dev, m, n, k, iters, tf32;
  size_t cap;
} seen;

static int fake_count(void) { return 3; }
static dp_status fake_info(int dev, char *name, size_t cap, size_t *total,
                           size_t *free_mem) {
  seen.dev = dev;
  seen.cap = cap;
  if (name && cap) snprintf(name, cap, "fake %d", dev);
  if (total) *total = 1000;
  if (free_mem) *free_mem = 600;
  return DP_OK;
}
static dp_status fake_bench(int dev, int m, int n, int k, int iters, int tf32, double *ms,
                            double *tflops) {
  seen.dev = dev, seen.m = m, seen.n = n, seen.k = k, seen.iters = iters, seen.tf32 = tf32;
  *ms = 2.5;
  *tflops = 1.0;
  return DP_OK;
}
START_TEST(diagnostics_go_through_the_backend_slots) {
  const dp_backend_ops *real = dp__backend_ops(DP_BACKEND_CUDA);
  const char *fork = getenv("CK_FORK");
  if (!real && fork && strcmp(fork, "no") == 0) {
    fprintf(stderr,
            "NOTE api: backend pass-through skipped (CK_FORK=no, no CUDA backend)\n");
    return;
  }
  /* the cpu backend's vtable (complete, whatever slots it grows) with the
   * diagnostic slots replaced */
  static dp_backend_ops fake;
  fake = *dp__backend_ops(DP_BACKEND_CPU);
  fake.name = "cuda"; /* in the cuda backend's place: its kind */
  fake.device_count = fake_count;
  fake.device_info = fake_info;
  fake.bench_sgemm = fake_bench;
  dp_backend kind = DP_BACKEND_CPU;
  ck_assert_int_eq(dp__backend_register(&fake, &kind), DP_OK);
  ck_assert_int_eq(kind, DP_BACKEND_CUDA);
  double ms = 0.0;
  ck_assert_int_eq(dp_bench_sgemm(DP_BACKEND_CUDA, 2, 7, 9, 11, 13, 1, &ms), DP_OK);
  ck_assert(ms == 2.5);
  ck_assert_int_eq(seen.dev, 2);
  ck_assert_int_eq(seen.m, 7);
  ck_assert_int_eq(seen.n, 9);
  ck_assert_int_eq(seen.k, 11);
  ck_assert_int_eq(seen.iters, 13);
  ck_assert_int_eq(seen.tf32, 1);
  char name[16];
  size_t total = 0, free_mem = 0;
  ck_assert_int_eq(dp_cuda_device_info(1, name, sizeof name, &total, &free_mem), DP_OK);
  ck_assert_str_eq(name, "fake 1");
  ck_assert_uint_eq(seen.cap, sizeof name);
  ck_assert_uint_eq(total, 1000);
  ck_assert_uint_eq(free_mem, 600);
  ck_assert_int_eq(dp_cuda_device_count(), 3);
  /* the same through the backend-neutral queries, and what it reports of itself */
  ck_assert_uint_eq(dp_backend_caps(DP_BACKEND_CUDA),
                    DP_BACKEND_CAP_DEVICES | DP_BACKEND_CAP_GEMM_BENCH);
  dp_backend found = DP_BACKEND_CPU;
  ck_assert_int_eq(dp_backend_find_caps(DP_BACKEND_CAP_DEVICES, &found), DP_OK);
  ck_assert_int_eq(found, DP_BACKEND_CUDA);
  ck_assert_int_eq(dp_backend_device_count(DP_BACKEND_CUDA), 3);
  ck_assert_int_eq(
      dp_backend_device_info(DP_BACKEND_CUDA, 2, name, sizeof name, NULL, NULL), DP_OK);
  ck_assert_str_eq(name, "fake 2");
  if (real) ck_assert_int_eq(dp__backend_register(real, NULL), DP_OK);
}
END_TEST

/* What a backend reports of itself: the cpu backend has virtual devices (none
 * to count or query) and a GEMM benchmark; an unknown kind reports nothing;
 * dp_backend_find_caps picks the lowest kind with every cap asked for, or
 * says what is registered and why a reserved backend is not. */
START_TEST(backend_caps_describe_the_backends) {
  ck_assert_uint_eq(dp_backend_caps(DP_BACKEND_CPU), DP_BACKEND_CAP_GEMM_BENCH);
  ck_assert_uint_eq(dp_backend_caps((dp_backend)99), 0);
  ck_assert_int_eq(dp_backend_device_count(DP_BACKEND_CPU), 0);
  ck_assert_msg(strstr(dp_last_error(), "virtual"), "%s", dp_last_error());
  char name[16] = "unchanged";
  ck_assert_int_eq(dp_backend_device_info(DP_BACKEND_CPU, 0, name, sizeof name, NULL, NULL),
                   DP_ERR_UNSUPPORTED);
  ck_assert_str_eq(name, "");
  ck_assert_int_eq(dp_backend_device_count((dp_backend)99), 0);
  ck_assert_msg(strstr(dp_last_error(), "not registered"), "%s", dp_last_error());
  dp_backend k = DP_BACKEND_CUDA;
  ck_assert_int_eq(dp_backend_find_caps(DP_BACKEND_CAP_GEMM_BENCH, &k), DP_OK);
  ck_assert_int_eq(k, DP_BACKEND_CPU);
  ck_assert_int_eq(dp_backend_find_caps(0, &k), DP_OK);
  ck_assert_int_eq(k, DP_BACKEND_CPU);
  dp_status s = dp_backend_find_caps(DP_BACKEND_CAP_DEVICES, &k);
  if (dp_cuda_available()) {
    ck_assert_int_eq(s, DP_OK);
    ck_assert_int_eq(k, DP_BACKEND_CUDA);
  } else {
    ck_assert_int_eq(s, DP_ERR_UNSUPPORTED);
    ck_assert_int_eq(k, (dp_backend)-1);
    ck_assert_msg(strstr(dp_last_error(), "devices of its own (registered: cpu") &&
                      strstr(dp_last_error(), "the CUDA backend is not registered"),
                  "%s", dp_last_error());
  }
  ck_assert_int_eq(dp_backend_find_caps(1u << 30, &k), DP_ERR_UNSUPPORTED);
  ck_assert_int_eq(dp_backend_find_caps(DP_BACKEND_CAP_DEVICES, NULL), DP_ERR_INVALID);
}
END_TEST

/* Backends register by name: a new name gets a kind of its own that a plan can
 * name and the registry lists; the built-in cpu backend cannot be replaced; an
 * incomplete vtable is refused. */
START_TEST(backends_register_by_name) {
  static dp_backend_ops other;
  other = *dp__backend_ops(DP_BACKEND_CPU);
  other.name = "other";
  int before = dp_backend_count();
  dp_backend kind = DP_BACKEND_CPU, found = DP_BACKEND_CPU;
  ck_assert_int_eq(dp_backend_find("other", &found), DP_ERR_UNSUPPORTED);
  ck_assert_int_eq(dp__backend_register(&other, &kind), DP_OK);
  ck_assert_int_ge(kind, 2);
  ck_assert_int_eq(dp_backend_count(), before + 1);
  ck_assert_str_eq(dp_backend_name(kind), "other");
  ck_assert_int_eq(dp_backend_find("other", &found), DP_OK);
  ck_assert_int_eq(found, kind);
  ck_assert(dp_backend_available(kind));
  /* again: the same kind, no new slot */
  ck_assert_int_eq(dp__backend_register(&other, &found), DP_OK);
  ck_assert_int_eq(found, kind);
  ck_assert_int_eq(dp_backend_count(), before + 1);
  /* a plan names it like any backend and runs on it */
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse("input 5\nlinear 2\nloss mse\n", "other", &m), DP_OK);
  dp_config c;
  dp_config_default(&c);
  c.backend = kind;
  c.n_devices = 2;
  c.batch = 4;
  dp_plan *p = NULL;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_OK);
  dp_ctx *x = NULL;
  ck_assert_int_eq(dp_ctx_create(p, &x), DP_OK);
  dp_ctx_free(x);
  dp_plan_free(p);
  dp_model_free(m);
  static dp_backend_ops cpu2;
  cpu2 = *dp__backend_ops(DP_BACKEND_CPU);
  ck_assert_int_eq(dp__backend_register(&cpu2, NULL), DP_ERR_INVALID);
  ck_assert_ptr_eq(dp__backend_ops(DP_BACKEND_CPU), dp__backend_ops(DP_BACKEND_CPU));
  static dp_backend_ops bad;
  bad = other;
  bad.name = "bad";
  bad.run = NULL;
  ck_assert_int_eq(dp__backend_register(&bad, NULL), DP_ERR_INVALID);
  ck_assert_int_eq(dp_backend_find("bad", &found), DP_ERR_UNSUPPORTED);
  ck_assert_str_eq(dp_backend_name((dp_backend)99), "?");
}
END_TEST

/* The core's own guard on DP_FEATURE_SHARED_PARAMS, for a backend whose
 * check_config does not refuse it: no plan in allreduce training, nor on a
 * backend without host memory; classic mode plans. */
START_TEST(shared_params_are_guarded_by_the_core) {
  static dp_backend_ops sharer;
  sharer = *dp__backend_ops(DP_BACKEND_CPU);
  sharer.name = "sharer";
  sharer.check_config = NULL;
  dp_backend kind;
  ck_assert_int_eq(dp__backend_register(&sharer, &kind), DP_OK);
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse("input 5\nlinear 2\nloss mse\n", "sharer", &m), DP_OK);
  for (int k = 0; k < 3; k++) {
    dp_config c;
    dp_config_default(&c);
    c.backend = kind;
    c.n_devices = 2;
    c.batch = 4;
    c.mode = k == 1 ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC;
    snprintf(c.backend_options, sizeof c.backend_options, "params=shared");
    sharer.host_memory = k != 2;
    ck_assert_int_eq(dp__backend_register(&sharer, NULL), DP_OK);
    dp_plan *p = NULL;
    dp_status s = dp_plan_create(m, &c, &p);
    if (k == 0) {
      ck_assert_msg(s == DP_OK, "%s", dp_last_error());
      ck_assert_uint_eq(dp_plan_region(p, 1, DP_REGION_PARAMS).size, 0);
      dp_plan_free(p);
      continue;
    }
    ck_assert_int_eq(s, DP_ERR_INVALID);
    ck_assert_ptr_null(p);
    ck_assert_msg(
        strstr(dp_last_error(), "the sharer backend's options share the parameters"), "%s",
        dp_last_error());
  }
  dp_model_free(m);
}
END_TEST

/* ---- tools/ includes dp.h and its own headers, nothing else of the project --------- */

/* The project's headers a tool may include ("..." form); any other "..."
 * include, and any <...> include of a header of lib/, cuda/ or tests/, is
 * refused. */
/* dp_mpi.h: the public MPI entry points (tools/ranks.c, under DP_HAVE_MPI) */
static const char *const TOOL_HEADERS[] = {"dp.h",   "dp_mpi.h", "cli.h",
                                           "data.h", "svg.h",    "agree.h"};

static int project_header(const char *name) {
  static const char *const dirs[] = {"lib",     "lib/util",   "lib/model", "lib/core",
                                     "lib/cpu", "lib/format", "lib/mpi",   "cuda",
                                     "tests",   "tests/emul", "include"};
  for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dirs[d], name);
    FILE *f = fopen(path, "r");
    if (f) {
      fclose(f);
      return strcmp(dirs[d], "include") != 0;
    }
  }
  return 0;
}

/* Appends "file:line: #include X" to bad for each forbidden include of path. */
static void check_tool_file(const char *path, char *bad, size_t cap) {
  FILE *f = fopen(path, "r");
  ck_assert_msg(f, "cannot read %s (tests run from the repository root)", path);
  char line[1024];
  for (int ln = 1; fgets(line, sizeof line, f); ln++) {
    const char *p = line;
    while (isspace((unsigned char)*p)) p++;
    if (*p++ != '#') continue;
    while (*p == ' ' || *p == '\t') p++;
    if (strncmp(p, "include", 7) != 0) continue;
    p += 7;
    while (*p == ' ' || *p == '\t') p++;
    char close = *p == '"' ? '"' : *p == '<' ? '>' : 0;
    const char *end = close ? strchr(p + 1, close) : NULL;
    int ok = 0;
    char name[256] = "";
    if (end && (size_t)(end - p - 1) < sizeof name) {
      memcpy(name, p + 1, (size_t)(end - p - 1));
      name[end - p - 1] = '\0';
      if (close == '"') {
        for (size_t i = 0; i < sizeof TOOL_HEADERS / sizeof *TOOL_HEADERS; i++)
          ok |= strcmp(name, TOOL_HEADERS[i]) == 0;
      } else {
        ok = !project_header(name);
      }
    }
    if (!ok) {
      size_t len = strlen(bad);
      snprintf(bad + len, cap - len, "\n  %s:%d: %.*s", path, ln,
               (int)strcspn(line, "\r\n"), line);
    }
  }
  fclose(f);
}

/* Runs check on every .c and .h file of tools/; returns how many. */
static int scan_tools(void (*check)(const char *path, char *bad, size_t cap), char *bad,
                      size_t cap) {
  DIR *d = opendir("tools");
  ck_assert_msg(d, "cannot open tools/ (tests run from the repository root)");
  int n_files = 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    if (len < 3 || e->d_name[0] == '.' ||
        (strcmp(e->d_name + len - 2, ".c") != 0 && strcmp(e->d_name + len - 2, ".h") != 0))
      continue;
    char path[512];
    snprintf(path, sizeof path, "tools/%s", e->d_name);
    check(path, bad, cap);
    n_files++;
  }
  closedir(d);
  return n_files;
}

START_TEST(tools_include_only_dp_h) {
  char bad[4096] = "";
  int n_files = scan_tools(check_tool_file, bad, sizeof bad);
  ck_assert_int_ge(n_files, 8); /* dp.c, cli.c, cmd_*.c, ...: the folder was read */
  ck_assert_msg(bad[0] == '\0',
                "tools/ may include only dp.h, dp_mpi.h and its own headers (cli.h, "
                "data.h, svg.h, agree.h):%s",
                bad);
}
END_TEST

/* tools/ names no backend: it asks the library what a backend has
 * (dp_backend_caps, dp_backend_find_caps, dp_backend_device_count) instead of
 * comparing kinds, so it has no DP_BACKEND_CPU, DP_BACKEND_CUDA or dp_cuda_*
 * but the registration of the backends it links (tools/dp.c). */
static void check_tool_names(const char *path, char *bad, size_t cap) {
  static const char *const named[] = {"DP_BACKEND_CPU", "DP_BACKEND_CUDA", "dp_cuda_"};
  FILE *f = fopen(path, "r");
  ck_assert_msg(f, "cannot read %s", path);
  char line[1024];
  for (int ln = 1; fgets(line, sizeof line, f); ln++)
    for (size_t i = 0; i < sizeof named / sizeof *named; i++)
      if (strstr(line, named[i]) && !strstr(line, "dp_cuda_register()")) {
        size_t at = strlen(bad);
        snprintf(bad + at, cap - at, "\n  %s:%d: %.*s", path, ln,
                 (int)strcspn(line, "\r\n"), line);
        break;
      }
  fclose(f);
}

START_TEST(tools_name_no_backend) {
  char bad[4096] = "";
  ck_assert_int_ge(scan_tools(check_tool_names, bad, sizeof bad), 8);
  ck_assert_msg(bad[0] == '\0', "tools/ names a backend (ask dp_backend_caps):%s", bad);
}
END_TEST

/* The check itself: it catches each forbidden form. */
START_TEST(include_check_catches_internal_headers) {
  char path[] = "/tmp/dp_test_api_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  FILE *f = fdopen(fd, "w");
  ck_assert_ptr_nonnull(f);
  fputs("#include \"cli.h\"\n#include \"core/ctx.h\"\n#  include <gemm.h>\n"
        "#include <stdio.h>\n  #include \"dp_cuda.h\" /* x */\n#include \"dp.h\"\n",
        f);
  fclose(f);
  char bad[2048] = "";
  check_tool_file(path, bad, sizeof bad);
  unlink(path);
  ck_assert_msg(strstr(bad, ":2: #include \"core/ctx.h\""), "%s", bad);
  ck_assert_msg(strstr(bad, ":3: #  include <gemm.h>"), "%s", bad);
  ck_assert_msg(strstr(bad, ":5:   #include \"dp_cuda.h\""), "%s", bad);
  ck_assert_msg(!strstr(bad, ":1:") && !strstr(bad, ":4:") && !strstr(bad, ":6:"), "%s",
                bad);
}
END_TEST

/* ---- learning-rate schedules (issue 16, item 1) ---------------------------------- */

/* dp_lr_at against torch.optim.lr_scheduler (tests/golden/lr_schedules.txt, written by
 * tests/fixtures/golden/make_lr_golden.py): constant, StepLR, CosineAnnealingLR and
 * LinearLR warm-up then cosine, within 1e-5 relative (PyTorch's recursive forms round
 * differently from the closed forms); OneCycleLR (its lines have fields of their
 * own: onecycle_line). */
static void onecycle_line(const char *line, dp_lr_schedule *sc, unsigned long long *t,
                          double *want) {
  float max_lr, pct, div, final_div;
  int total, anneal, three;
  ck_assert_int_eq(sscanf(line, "%*d %f %d %f %d %f %f %d %llu %lf", &max_lr, &total, &pct,
                          &anneal, &div, &final_div, &three, t, want),
                   9);
  *sc = (dp_lr_schedule){.kind = DP_LR_ONECYCLE,
                         .base_lr = max_lr,
                         .total_steps = total,
                         .pct_start = pct,
                         .anneal_linear = anneal,
                         .div_factor = div,
                         .final_div_factor = final_div,
                         .three_phase = three};
}

/* OneCycleLR with cycle_momentum (kind 8): the rate and the momentum, SGD's or
 * Adam's beta1 (the same schedule either way). */
static void onecycle_momentum_line(const char *line, dp_lr_schedule *sc,
                                   unsigned long long *t, double *lr, double *mom) {
  float max_lr, pct, div, final_div, base_m, max_m;
  int total, anneal, three, adam;
  ck_assert_int_eq(sscanf(line, "%*d %f %d %f %d %f %f %d %f %f %d %llu %lf %lf", &max_lr,
                          &total, &pct, &anneal, &div, &final_div, &three, &base_m, &max_m,
                          &adam, t, lr, mom),
                   13);
  dp_lr_schedule_onecycle(sc, max_lr, total);
  sc->pct_start = pct;
  sc->anneal_linear = anneal;
  sc->div_factor = div;
  sc->final_div_factor = final_div;
  sc->three_phase = three;
  sc->base_momentum = base_m;
  sc->max_momentum = max_m;
}

START_TEST(lr_schedules_match_pytorch) {
  FILE *f = fopen("tests/golden/lr_schedules.txt", "r");
  ck_assert_msg(f, "tests/golden/lr_schedules.txt: run the tests from the repository root");
  char line[256];
  int n = 0, kinds = 0, n_momentum = 0;
  while (fgets(line, sizeof line, f)) {
    if (line[0] == '#') continue;
    if (line[0] == '8' && line[1] == ' ') {
      dp_lr_schedule sc;
      unsigned long long t;
      double lr, mom;
      onecycle_momentum_line(line, &sc, &t, &lr, &mom);
      ck_assert_msg(dp_lr_schedule_check(&sc) == DP_OK, "%s: %s", line, dp_last_error());
      double got = dp_lr_at(&sc, t), got_m = dp_momentum_at(&sc, t);
      ck_assert_msg(fabs(got - lr) <= 1e-5 * fabs(lr) + 1e-12,
                    "onecycle, t %llu: libdp %.9g, PyTorch %.9g (%s)", t, got, lr, line);
      /* the float nearest PyTorch's double momentum */
      ck_assert_msg(fabs(got_m - mom) <= 1e-7 * fabs(mom) + 1e-12,
                    "onecycle momentum, t %llu: libdp %.9g, PyTorch %.17g (%s)", t, got_m,
                    mom, line);
      n_momentum++;
      continue;
    }
    if (line[0] == '0' + DP_LR_ONECYCLE && line[1] == ' ') {
      dp_lr_schedule sc;
      unsigned long long t;
      double want;
      onecycle_line(line, &sc, &t, &want);
      ck_assert_msg(dp_lr_schedule_check(&sc) == DP_OK, "%s: %s", line, dp_last_error());
      double got = dp_lr_at(&sc, t);
      ck_assert_msg(fabs(got - want) <= 1e-5 * fabs(want) + 1e-12,
                    "onecycle, t %llu: libdp %.9g, PyTorch %.9g (%s)", t, got, want, line);
      kinds |= 1 << DP_LR_ONECYCLE;
      n++;
      continue;
    }
    int kind, step_size, warmup, t_max;
    float base, gamma, start, eta_min;
    char ms[64];
    unsigned long long t;
    double want;
    ck_assert_int_eq(sscanf(line, "%d %f %d %f %d %f %d %f %63s %llu %lf", &kind, &base,
                            &step_size, &gamma, &warmup, &start, &t_max, &eta_min, ms, &t,
                            &want),
                     11);
    dp_lr_schedule sc = {.kind = (dp_lr_kind)kind,
                         .base_lr = base,
                         .step_size = step_size,
                         .gamma = gamma,
                         .warmup = warmup,
                         .start_factor = start,
                         .t_max = t_max,
                         .eta_min = eta_min};
    for (char *p = ms; strcmp(ms, "-") && *p; p += *p == ',')
      sc.milestones[sc.n_milestones++] = (int)strtol(p, &p, 10);
    ck_assert_msg(dp_lr_schedule_check(&sc) == DP_OK, "%s: %s", line, dp_last_error());
    double got = dp_lr_at(&sc, t);
    ck_assert_msg(fabs(got - want) <= 1e-5 * fabs(want) + 1e-12,
                  "kind %d, t %llu: libdp %.9g, PyTorch %.9g", kind, t, got, want);
    kinds |= 1 << kind;
    n++;
  }
  fclose(f);
  ck_assert_int_ge(n, 440);
  ck_assert_int_ge(n_momentum, 300);
  ck_assert_int_eq(kinds, 255); /* every kind */
}
END_TEST

/* A gamma decays the rate t times: PyTorch's gamma is the decimal the script writes
 * (0.99999), the float's is 1.3e-8 below it, and base_lr * gamma^t drifted 1.4e-3
 * relative from ExponentialLR by step 100000 (an outside check). PyTorch's rates:
 * ExponentialLR(SGD(lr=0.1), gamma=0.99999) after 100000 steps, (0.003, 0.9999) after
 * 20000; StepLR(0.1, step_size=10, gamma=0.95) after 5000 (500 decays). */
START_TEST(lr_schedules_decay_by_the_written_gamma) {
  const struct {
    dp_lr_kind kind;
    float base, gamma;
    int step_size;
    uint64_t t;
    double want;
  } c[] = {{DP_LR_EXPONENTIAL, 0.1f, 0.99999f, 0, 100000, 0.03678776017682495},
           {DP_LR_EXPONENTIAL, 0.003f, 0.9999f, 0, 20000, 0.00040596524844827855},
           {DP_LR_STEP, 0.1f, 0.95f, 10, 5000, 7.274491561439042e-13}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    dp_lr_schedule s = {.kind = c[i].kind,
                        .base_lr = c[i].base,
                        .gamma = c[i].gamma,
                        .step_size = c[i].step_size};
    double got = dp_lr_at(&s, c[i].t);
    ck_assert_msg(fabs(got - c[i].want) <= 2e-7 * c[i].want,
                  "case %zu: libdp %.9g, PyTorch %.9g", i, got, c[i].want);
  }
}
END_TEST

START_TEST(lr_schedules_refuse_bad_fields) {
  const dp_lr_schedule bad[] = {
      {.kind = DP_LR_CONSTANT, .base_lr = 0.0f},
      {.kind = DP_LR_CONSTANT, .base_lr = NAN},
      {.kind = DP_LR_STEP, .base_lr = 0.1f, .gamma = 0.5f},
      {.kind = DP_LR_STEP, .base_lr = 0.1f, .step_size = 3, .gamma = 1.5f},
      {.kind = DP_LR_COSINE, .base_lr = 0.1f},
      {.kind = DP_LR_COSINE, .base_lr = 0.1f, .t_max = 5, .eta_min = 0.2f},
      {.kind = DP_LR_WARMUP_COSINE, .base_lr = 0.1f, .start_factor = 0.1f, .t_max = 5},
      {.kind = DP_LR_WARMUP_COSINE,
       .base_lr = 0.1f,
       .warmup = 2,
       .start_factor = 0.0f,
       .t_max = 5},
      {.kind = (dp_lr_kind)9, .base_lr = 0.1f},
      {.kind = DP_LR_EXPONENTIAL, .base_lr = 0.1f, .gamma = 0.0f},
      {.kind = DP_LR_EXPONENTIAL, .base_lr = 0.1f, .gamma = 1.5f},
      {.kind = DP_LR_MULTISTEP, .base_lr = 0.1f, .gamma = 0.5f},
      {.kind = DP_LR_MULTISTEP,
       .base_lr = 0.1f,
       .gamma = 0.5f,
       .n_milestones = DP_LR_MAX_MILESTONES + 1,
       .milestones = {1}},
      {.kind = DP_LR_MULTISTEP,
       .base_lr = 0.1f,
       .gamma = 0.5f,
       .n_milestones = 2,
       .milestones = {3, 3}},
      {.kind = DP_LR_MULTISTEP, .base_lr = 0.1f, .gamma = 0.5f, .n_milestones = 1},
      {.kind = DP_LR_MULTISTEP,
       .base_lr = 0.1f,
       .gamma = 0.0f,
       .n_milestones = 1,
       .milestones = {2}},
      {.kind = DP_LR_WARMUP, .base_lr = 0.1f, .start_factor = 0.5f},
      {.kind = DP_LR_WARMUP, .base_lr = 0.1f, .warmup = 3, .start_factor = 1.5f},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(dp_lr_schedule_check(&bad[i]), DP_ERR_INVALID);
    ck_assert(isnan(dp_lr_at(&bad[i], 0)));
  }
  ck_assert_int_eq(dp_lr_schedule_check(NULL), DP_ERR_INVALID);
  ck_assert(isnan(dp_lr_at(NULL, 3)));
}
END_TEST

/* OneCycleLR: PyTorch's defaults from dp_lr_schedule_onecycle (cycle_momentum
 * between 0.85 and 0.95); each field out of range refused naming it, a phase of
 * no steps (PyTorch divides by its length) refused; NaN past total_steps, where
 * PyTorch raises; no momentum from a schedule that does not cycle it. */
START_TEST(lr_onecycle_defaults_and_refusals) {
  dp_lr_schedule s;
  dp_lr_schedule_onecycle(&s, 0.1f, 100);
  ck_assert_int_eq(s.kind, DP_LR_ONECYCLE);
  ck_assert(s.pct_start == 0.3f && s.div_factor == 25.0f && s.final_div_factor == 1e4f);
  ck_assert(!s.anneal_linear && !s.three_phase && s.cycle_momentum == 1);
  ck_assert(s.base_momentum == 0.85f && s.max_momentum == 0.95f);
  ck_assert_int_eq(dp_lr_schedule_check(&s), DP_OK);
  ck_assert_float_eq_tol(dp_lr_at(&s, 0), 0.1f / 25.0f, 1e-9f);
  ck_assert_float_eq_tol(dp_lr_at(&s, 29), 0.1f, 1e-9f); /* the peak: pct_start * 100 - 1 */
  ck_assert(dp_lr_at(&s, 100) > 0.0f && !isnan(dp_lr_at(&s, 100)));
  ck_assert(isnan(dp_lr_at(&s, 101)));
  ck_assert(dp_momentum_at(&s, 0) == 0.95f && dp_momentum_at(&s, 29) == 0.85f);
  ck_assert(isnan(dp_momentum_at(&s, 101)));
  s.cycle_momentum = 0; /* the rate alone */
  ck_assert_int_eq(dp_lr_schedule_check(&s), DP_OK);
  ck_assert(isnan(dp_momentum_at(&s, 0)));
  dp_lr_schedule cos = {.kind = DP_LR_COSINE, .base_lr = 0.1f, .t_max = 5};
  ck_assert(isnan(dp_momentum_at(&cos, 0)) && isnan(dp_momentum_at(NULL, 0)));
  const struct {
    const char *field, *says;
  } bad[] = {
      {"total_steps", "total_steps must be >= 1, got 0"},
      {"pct_start", "pct_start must be in [0, 1], got 1.5"},
      {"div_factor",
       "div_factor and final_div_factor must be finite and > 0, got 0 and 10000"},
      {"final_div_factor", "finite and > 0, got 25 and -1"},
      {"anneal_linear", "anneal_linear and three_phase must be 0 or 1, got 2 and 0"},
      {"three_phase", "anneal_linear and three_phase must be 0 or 1, got 0 and 3"},
      {"phase", "phase 1 of 2 has no steps (pct_start 0.1 of total_steps 10)"},
      {"three-phase phase", "phase 3 of 3 has no steps (pct_start 0.6 of total_steps 5)"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    dp_lr_schedule_onecycle(&s, 0.1f, 100);
    switch (i) {
    case 0: s.total_steps = 0; break;
    case 1: s.pct_start = 1.5f; break;
    case 2: s.div_factor = 0.0f; break;
    case 3: s.final_div_factor = -1.0f; break;
    case 4: s.anneal_linear = 2; break;
    case 5: s.three_phase = 3; break;
    case 6: s.total_steps = 10, s.pct_start = 0.1f; break; /* ends at step 0 */
    default: s.total_steps = 5, s.pct_start = 0.6f, s.three_phase = 1; break; /* 4 to 4 */
    }
    ck_assert_int_eq(dp_lr_schedule_check(&s), DP_ERR_INVALID);
    ck_assert_msg(strstr(dp_last_error(), bad[i].says), "%s: %s", bad[i].field,
                  dp_last_error());
    ck_assert(isnan(dp_lr_at(&s, 0)));
  }
  const float bad_m[][2] = {{1.0f, 0.95f}, {0.85f, -0.1f}, {NAN, 0.95f}, {0.85f, INFINITY}};
  for (size_t i = 0; i < sizeof bad_m / sizeof bad_m[0]; i++) {
    dp_lr_schedule_onecycle(&s, 0.1f, 100);
    s.base_momentum = bad_m[i][0];
    s.max_momentum = bad_m[i][1];
    ck_assert_int_eq(dp_lr_schedule_check(&s), DP_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(dp_last_error(), "base_momentum and max_momentum"));
    ck_assert(isnan(dp_momentum_at(&s, 0)));
    s.cycle_momentum = 0; /* not used then */
    ck_assert_int_eq(dp_lr_schedule_check(&s), DP_OK);
  }
  dp_lr_schedule_onecycle(&s, 0.1f, 100);
  s.cycle_momentum = 2;
  ck_assert_int_eq(dp_lr_schedule_check(&s), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "cycle_momentum must be 0 or 1"));
  dp_lr_schedule_onecycle(&s, NAN, 100);
  ck_assert_int_eq(dp_lr_schedule_check(&s), DP_ERR_INVALID);
}
END_TEST

Suite *api_suite(void) {
  Suite *s = suite_create("api");
  TCase *tc = tcase_create("names");
  tcase_add_test(tc, every_enum_value_has_a_name);
  tcase_add_test(tc, names_are_the_spec_and_command_line_words);
  suite_add_tcase(s, tc);

  tc = tcase_create("model");
  tcase_add_test(tc, model_layer_describes_every_kind);
  tcase_add_test(tc, tensors_are_the_state_dict_of_the_sequential);
  tcase_add_test(tc, tensor_names_fit_at_the_limits);
  tcase_add_test(tc, hash_bytes_is_the_params_hash);
  suite_add_tcase(s, tc);

  tc = tcase_create("diagnostics");
  tcase_add_test(tc, gemm_tier_switches_and_refuses_nonsense);
  tcase_add_test(tc, bench_sgemm_on_the_cpu);
  tcase_add_test(tc, bench_sgemm_and_device_info_on_cuda);
  tcase_add_test(tc, diagnostics_go_through_the_backend_slots);
  tcase_add_test(tc, backends_register_by_name);
  tcase_add_test(tc, shared_params_are_guarded_by_the_core);
  tcase_add_test(tc, backend_caps_describe_the_backends);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);

  tc = tcase_create("lr_schedules");
  tcase_add_test(tc, lr_schedules_match_pytorch);
  tcase_add_test(tc, lr_schedules_refuse_bad_fields);
  tcase_add_test(tc, lr_onecycle_defaults_and_refusals);
  tcase_add_test(tc, lr_schedules_decay_by_the_written_gamma);
  suite_add_tcase(s, tc);

  tc = tcase_create("tools");
  tcase_add_test(tc, tools_include_only_dp_h);
  tcase_add_test(tc, tools_name_no_backend);
  tcase_add_test(tc, include_check_catches_internal_headers);
  suite_add_tcase(s, tc);
  return s;
}
