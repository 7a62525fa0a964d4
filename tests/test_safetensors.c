/* safetensors tests: dp_ckpt_export_safetensors / dp_ckpt_import_safetensors
 * (the parameters as PyTorch's state_dict of the equivalent nn.Sequential).
 *
 *   round_trip  export, then import into a fresh context of the same model
 *               (another seed, another device count or an inference context):
 *               bit-identical parameters; import is dp_set_params (step counter
 *               and optimizer state kept); the file does not depend on the
 *               device count or mode
 *   format      the file's bytes read back by hand: u64 header length, the JSON
 *               entries (PyTorch's names and shapes, F32, contiguous
 *               data_offsets), padding to 8, the data little-endian; the seed
 *               example (examples/seed.dpm)
 *   hand_built  files written here as PyTorch / safetensors would write them
 *               (other tensor order, data in another order, metadata, white
 *               space) are taken
 *   hostile     malformed files of every kind are refused with their status
 *               and a message naming the fault, every arena byte, the step
 *               counter and the parameters' hash unchanged (offsets that do not
 *               tile the data, a header length a few bytes off, keys twice, bad
 *               UTF-8 or JSON, impossible running statistics); every mutation
 *               of a real export refused or read exactly; a directory or a
 *               FIFO is DP_ERR_IO at once; NULL and empty arguments
 *   export_io   exporting into a missing directory or over a directory:
 *               DP_ERR_IO and no file (temporary or not) left behind */
#include "dp.h"
#include "helpers.h"

#include <check.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Every kind of layer: linear with and without a bias, layernorm, the
 * activations and dropout (which have no tensors but take module indices). */
static const char MIX_SPEC[] = "input 12\n"
                               "linear 16\nlayernorm\ngelu\ndropout 0.2\n"
                               "linear 16 nobias\ntanh\n"
                               "linear 8\nrelu\nsigmoid\n"
                               "linear 5\n"
                               "loss softmax_cross_entropy\n";
/* The same with another width: every tensor after the first misshapen. */
static const char MIX17_SPEC[] = "input 12\n"
                                 "linear 17\nlayernorm\ngelu\ndropout 0.2\n"
                                 "linear 16 nobias\ntanh\n"
                                 "linear 8\nrelu\nsigmoid\n"
                                 "linear 5\n"
                                 "loss softmax_cross_entropy\n";
/* PyTorch's state_dict of MIX_SPEC's nn.Sequential, in its order. */
static const struct {
  const char *name, *shape;
  size_t numel;
} MIX_TENSORS[] = {
    {"0.weight", "16,12", 192}, {"0.bias", "16", 16},       {"1.weight", "16", 16},
    {"1.bias", "16", 16},       {"4.weight", "16,16", 256}, {"6.weight", "8,16", 128},
    {"6.bias", "8", 8},         {"9.weight", "5,8", 40},    {"9.bias", "5", 5},
};
#define N_MIX ((int)(sizeof MIX_TENSORS / sizeof MIX_TENSORS[0]))

/* The hostile files' model: 0.weight [4,3] 0.bias [4] 1.weight [4] 1.bias [4]
 * 3.weight [2,4] (no bias): 32 floats, 128 bytes. */
static const char SMALL_SPEC[] =
    "input 3\nlinear 4\nlayernorm\ngelu\nlinear 2 nobias\nloss mse\n";
#define SMALL_NP 32

#define BATCH 16
/* The configs here: AdamW at 0.003 on 16 rows in fixed micro-batches of 4 (the
 * same bits for every device count). */
#define ST_CFG(...)                                                                        \
  CFG(.batch = BATCH, .opt = DP_OPT_ADAMW, .micro_batch = 4, .lr = 0.003f, __VA_ARGS__)

/* ---- helpers ------------------------------------------------------------------ */

static void export_ok(rig *r, const char *path) {
  dp_status s = dp_ckpt_export_safetensors(r->c, path);
  ck_assert_msg(s == DP_OK, "export %s: %s: %s", path, dp_status_name(s),
                dp_ctx_error(r->c));
}

static void import_ok(rig *r, const char *path) {
  dp_status s = dp_ckpt_import_safetensors(r->c, path);
  ck_assert_msg(s == DP_OK, "import %s: %s: %s", path, dp_status_name(s),
                dp_ctx_error(r->c));
}

static void put_le64(unsigned char *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}
static void put_f32(unsigned char *b, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  for (int i = 0; i < 4; i++) b[i] = (unsigned char)(u >> (8 * i));
}

/* What the refusal tests start from: a context of SMALL_SPEC on two devices
 * (mode, seed) after `steps` steps, a fresh directory and a snapshot of the
 * context; refusal_close frees them. */
static void refusal_open(rig *r, tmpdir *t, ctx_snap *sn, dp_mode mode, uint64_t seed,
                         int steps) {
  dp_config cfg = ST_CFG(.n_devices = 2, .mode = mode, .seed = seed);
  rig_open(r, SMALL_SPEC, &cfg);
  tmp_make(t, "dp_st", "model.safetensors");
  run_steps(r, 0, steps);
  ctx_snap_take(sn, r->c);
}

static void refusal_close(rig *r, tmpdir *t, ctx_snap *sn) {
  ctx_snap_free(sn);
  tmp_done(t);
  rig_close(r);
}

/* A safetensors file: the 8-byte length `hlen` (the header's own length when
 * hlen is UINT64_MAX), the header text and the data. */
static void st_write(const char *path, uint64_t hlen, const char *hdr, const void *data,
                     size_t dlen) {
  size_t n = strlen(hdr);
  unsigned char *b = malloc(8 + n + dlen);
  ck_assert_ptr_nonnull(b);
  put_le64(b, hlen == UINT64_MAX ? n : hlen);
  memcpy(b + 8, hdr, n);
  if (dlen) memcpy(b + 8 + n, data, dlen);
  file_write(path, b, 8 + n + dlen);
  free(b);
}

/* ---- round trip -------------------------------------------------------------------- */

/* Export from a trained context, import into a fresh one of the same model with
 * another seed (same or another device count, or an inference context): the
 * very same bits. */
START_TEST(test_export_import_is_bit_identical) {
  static const struct {
    int n_dev;
    dp_mode mode;
    int inference;
  } TO[] = {{1, DP_MODE_CLASSIC, 0}, {3, DP_MODE_ALLREDUCE, 0}, {1, DP_MODE_CLASSIC, 1}};
  dp_config ca = ST_CFG(.n_devices = 2, .mode = DP_MODE_CLASSIC, .seed = 5),
            cb = ST_CFG(.n_devices = TO[_i].n_dev, .mode = TO[_i].mode, .seed = 6);
  cb.inference = TO[_i].inference;
  rig a, b;
  rig_open(&a, MIX_SPEC, &ca);
  rig_open(&b, MIX_SPEC, &cb);
  tmpdir t;
  tmp_make(&t, "dp_st", "model.safetensors");
  run_steps(&a, 0, 3);
  float *pa = params_of(&a), *pb = params_of(&b);
  ck_assert_msg(memcmp(pa, pb, a.np * 4) != 0,
                "the two contexts start equal: a vacuous test");
  export_ok(&a, t.path);
  import_ok(&b, t.path);
  assert_same_params(&a, &b, "exported then imported");
  ck_assert_uint_eq(dp_ctx_step(b.c), 0);
  /* importing its own export changes nothing */
  uint64_t h = dp_params_hash(a.c);
  import_ok(&a, t.path);
  ck_assert_uint_eq(dp_params_hash(a.c), h);
  ck_assert_uint_eq(dp_ctx_step(a.c), 3);
  free(pa);
  free(pb);
  tmp_done(&t);
  rig_close(&a);
  rig_close(&b);
}
END_TEST

/* Import sets the parameters as dp_set_params does: on a trained context the
 * step counter and optimizer state stay, so training on from there gives the
 * bits of a twin given the same parameters by dp_set_params. */
START_TEST(test_import_is_set_params) {
  dp_config c = ST_CFG(.n_devices = 2, .mode = DP_MODE_ALLREDUCE, .seed = 5),
            co = ST_CFG(.n_devices = 1, .mode = DP_MODE_CLASSIC, .seed = 9);
  rig a, b, other;
  rig_open(&a, MIX_SPEC, &c);
  rig_open(&b, MIX_SPEC, &c);
  rig_open(&other, MIX_SPEC, &co);
  tmpdir t;
  tmp_make(&t, "dp_st", "model.safetensors");
  run_steps(&a, 0, 4);
  run_steps(&b, 0, 4);
  run_steps(&other, 50, 52);
  export_ok(&other, t.path);
  float *po = params_of(&other);
  import_ok(&a, t.path);
  ck_assert_int_eq(dp_set_params(b.c, po, b.np), DP_OK);
  ck_assert_uint_eq(dp_ctx_step(a.c), 4);
  assert_same_params(&a, &other, "imported");
  run_steps(&a, 4, 8);
  run_steps(&b, 4, 8);
  assert_same_params(&a, &b, "import vs dp_set_params, then 4 steps");
  free(po);
  tmp_done(&t);
  rig_close(&a);
  rig_close(&b);
  rig_close(&other);
}
END_TEST

/* The file is the same bytes whatever the device count or mode. */
START_TEST(test_file_independent_of_devices_and_mode) {
  dp_config c1 = ST_CFG(.n_devices = 1, .mode = DP_MODE_CLASSIC, .seed = 5),
            c4 = ST_CFG(.n_devices = 4, .mode = DP_MODE_ALLREDUCE, .seed = 5);
  c4.shard_optimizer = 1;
  rig a, b;
  rig_open(&a, MIX_SPEC, &c1);
  if (!rig_try(&b, MIX_SPEC, &c4)) {
    printf("skipped: 4 devices, allreduce: %s\n", dp_last_error());
    rig_close(&a);
    return;
  }
  tmpdir t;
  tmp_make(&t, "dp_st", "model.safetensors");
  run_steps(&a, 0, 3);
  run_steps(&b, 0, 3);
  char pb[400];
  snprintf(pb, sizeof pb, "%s/b.safetensors", t.dir);
  export_ok(&a, t.path);
  export_ok(&b, pb);
  size_t la, lb;
  unsigned char *fa = file_read(t.path, &la), *fb = file_read(pb, &lb);
  ck_assert_uint_eq(la, lb);
  ck_assert(memcmp(fa, fb, la) == 0);
  free(fa);
  free(fb);
  tmp_done(&t);
  rig_close(&a);
  rig_close(&b);
}
END_TEST

/* ---- format ------------------------------------------------------------------------- */

/* The spec text as a JSON string body (what the exporter writes as metadata). */
static void json_escape(const char *s, char *out, size_t cap) {
  size_t n = 0;
  for (; *s && n + 8 < cap; s++) {
    if (*s == '\n') {
      out[n++] = '\\';
      out[n++] = 'n';
    } else if (*s == '"' || *s == '\\') {
      out[n++] = '\\';
      out[n++] = *s;
    } else {
      out[n++] = *s;
    }
  }
  out[n] = '\0';
}

/* The file's bytes, read back by hand, for a model with every kind of layer. */
START_TEST(test_file_layout) {
  dp_config cfg = ST_CFG(.n_devices = 2, .mode = DP_MODE_CLASSIC, .seed = 5);
  rig r;
  rig_open(&r, MIX_SPEC, &cfg);
  tmpdir t;
  tmp_make(&t, "dp_st", "model.safetensors");
  run_steps(&r, 0, 2);
  export_ok(&r, t.path);
  size_t len;
  unsigned char *b = file_read(t.path, &len);
  ck_assert_uint_ge(len, 8);
  uint64_t hlen = le64(b);
  ck_assert_uint_le(hlen, len - 8);
  ck_assert_msg(hlen % 8 == 0, "the header is %llu bytes: the data is not 8-aligned",
                (unsigned long long)hlen);
  char *hdr = malloc(hlen + 1);
  ck_assert_ptr_nonnull(hdr);
  memcpy(hdr, b + 8, hlen);
  hdr[hlen] = '\0';
  ck_assert_msg(strlen(hdr) == hlen, "a NUL byte in the header");
  /* a JSON object, padded with spaces (safetensors pads with spaces) */
  ck_assert_msg(hdr[0] == '{', "%s", hdr);
  size_t close = hlen;
  while (close > 0 && hdr[close - 1] == ' ') close--;
  ck_assert_msg(close > 0 && hdr[close - 1] == '}', "%s", hdr);
  ck_assert_uint_lt(hlen - close, 8);

  /* PyTorch's names and shapes, F32, data contiguous in state_dict order */
  ck_assert_int_eq(dp_model_n_tensors(r.m), N_MIX);
  size_t off = 0;
  for (int i = 0; i < N_MIX; i++) {
    char want[200];
    snprintf(want, sizeof want,
             "\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
             MIX_TENSORS[i].name, MIX_TENSORS[i].shape, off * 4,
             (off + MIX_TENSORS[i].numel) * 4);
    ck_assert_msg(strstr(hdr, want) != NULL, "the header lacks %s:\n%s", want, hdr);
    off += MIX_TENSORS[i].numel;
  }
  ck_assert_uint_eq(off, r.np);
  int entries = 0;
  for (const char *p = hdr; (p = strstr(p, "\"dtype\"")); p++) entries++;
  ck_assert_int_eq(entries, N_MIX);
  /* metadata: the format safetensors.torch expects and the spec text */
  ck_assert_msg(strncmp(hdr, "{\"__metadata__\":{\"format\":\"pt\",", 31) == 0, "%s", hdr);
  char text[1024], esc[2048], want[2100];
  ck_assert_uint_lt(dp_model_format(r.m, text, sizeof text), sizeof text);
  json_escape(text, esc, sizeof esc);
  snprintf(want, sizeof want, "\"libdp_model\":\"%s\"}", esc);
  ck_assert_msg(strstr(hdr, want) != NULL, "the header lacks %s:\n%s", want, hdr);

  /* the data: the parameters, little-endian, to the file's end */
  ck_assert_uint_eq(len - 8 - hlen, r.np * 4);
  float *p = params_of(&r);
  for (size_t e = 0; e < r.np; e++) {
    uint32_t u;
    memcpy(&u, &p[e], 4);
    ck_assert_msg(le32(b + 8 + hlen + 4 * e) == u, "float %zu differs", e);
  }
  free(p);
  free(hdr);
  free(b);
  tmp_done(&t);
  rig_close(&r);
}
END_TEST

/* examples/seed.dpm, Linear(5, 2): "0.weight" [2, 5] and "0.bias" [2]. */
START_TEST(test_seed_example) {
  size_t tl;
  ck_assert_msg(access("examples/seed.dpm", R_OK) == 0,
                "examples/seed.dpm: %s (test_dp runs from the repository root)",
                strerror(errno));
  unsigned char *spec = file_read("examples/seed.dpm", &tl);
  spec[tl] = '\0';
  dp_config cfg = config_of(30, 1, DP_OPT_SGD);
  rig r;
  rig_open(&r, (const char *)spec, &cfg);
  tmpdir t;
  tmp_make(&t, "dp_st", "model.safetensors");
  export_ok(&r, t.path);
  size_t len;
  unsigned char *b = file_read(t.path, &len);
  uint64_t hlen = le64(b);
  ck_assert_uint_eq(len, 8 + hlen + 12 * 4);
  char *hdr = strndup((const char *)b + 8, hlen);
  ck_assert_msg(
      strstr(hdr,
             "\"0.weight\":{\"dtype\":\"F32\",\"shape\":[2,5],\"data_offsets\":[0,40]}"),
      "%s", hdr);
  ck_assert_msg(
      strstr(hdr, "\"0.bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[40,48]}"),
      "%s", hdr);
  /* and the example's own file round-trips */
  rig r2;
  dp_config c2 = cfg;
  c2.seed = 99;
  rig_open(&r2, (const char *)spec, &c2);
  import_ok(&r2, t.path);
  assert_same_params(&r, &r2, "seed example");
  free(hdr);
  free(b);
  free(spec);
  tmp_done(&t);
  rig_close(&r);
  rig_close(&r2);
}
END_TEST

/* ---- files written by hand ----------------------------------------------------------- */

/* A safetensors entry of an F32 tensor, its data_offsets [b, e]; SMALL_SPEC's entries. */
#define ENT(name, shape, b, e)                                                             \
  "\"" name "\":{\"dtype\":\"F32\",\"shape\":[" shape "],"                                 \
  "\"data_offsets\":[" #b "," #e "]}"
#define W0 ENT("0.weight", "4,3", 0, 48)
#define B0 ENT("0.bias", "4", 48, 64)
#define W1 ENT("1.weight", "4", 64, 80)
#define B1 ENT("1.bias", "4", 80, 96)
#define W3 ENT("3.weight", "2,4", 96, 128)
#define ALL W0 "," B0 "," W1 "," B1 "," W3
/* The same sorted by name, data too, as safetensors.torch.save_file writes them. */
#define SORTED                                                                             \
  ENT("0.bias", "4", 0, 16)                                                                \
  "," ENT("0.weight", "4,3", 16, 64) "," ENT("1.bias", "4", 64, 80) "," ENT(               \
      "1.weight", "4", 80, 96) "," ENT("3.weight", "2,4", 96, 128)

/* Parameter e's value in the hand-built files. */
static float small_value(size_t e) { return (float)e * 0.125f - 1.5f; }

static void small_data(unsigned char *d) {
  for (size_t e = 0; e < SMALL_NP; e++) put_f32(d + 4 * e, small_value(e));
}

/* Files as PyTorch and the safetensors package write them: tensors in another
 * order (save_file sorts them by name, data too), metadata anywhere, white
 * space, any metadata values. Each is taken, with exactly its values. */
static const char *const GOOD[] = {
    /* libdp's order */
    "{" ALL "}",
    /* sorted by name, as safetensors.torch.save_file writes them, data in
     * that order too: 0.bias 0.weight 1.bias 1.weight 3.weight */
    "{\"__metadata__\":{\"format\":\"pt\"}," SORTED "}",
    /* reversed, metadata last, extra metadata keys, escapes, white space */
    "{ \n\t" W3 " ,\r\n " B1 "," W1 "," B0 "," W0
    " , \"__metadata__\" : { \"format\" : \"pt\", \"who\": \"\\u0041\\\"\\\\\\/\\n\", "
    "\"x\":\"\" } }       ",
    /* metadata first and with values that are not strings (skipped) */
    "{\"__metadata__\":{\"a\":[1,2,{\"b\":null}],\"c\":true,\"d\":-1.5e3,\"e\":{}}," ALL
    "}",
    /* empty metadata, shuffled, and unknown fields inside an entry */
    "{\"__metadata__\":{}," B0 "," W3 ","
    "\"0.weight\":{\"shape\":[4,3],\"extra\":[[1],{}],\"data_offsets\":[0,48],\"dtype\":"
    "\"F32\"},"
    "" B1 "," W1 "}",
    /* UTF-8 in metadata (raw, and escaped with a surrogate pair), JSON numbers of
     * every form, white space of every kind after the object */
    "{\"__metadata__\":{\"\xc3\xa9\":\"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\","
    "\"s\":\"\\ud83d\\ude00 \\u00e9\",\"n\":[0,-0,-0.5e+3,1E-2,12.25,7e9]}," ALL
    "} \t\r\n      ",
};
#define N_GOOD ((int)(sizeof GOOD / sizeof GOOD[0]))

/* Where parameter e's value lies in GOOD[1]'s data (sorted by name). */
static size_t sorted_pos(size_t e) {
  /* libdp order: 0.weight [0,12) 0.bias [12,16) 1.weight [16,20) 1.bias [20,24) 3.weight
   * [24,32) sorted:      0.bias [0,4) 0.weight [4,16) 1.bias [16,20) 1.weight
   * [20,24) 3.weight [24,32) */
  if (e < 12) return e + 4;
  if (e < 16) return e - 12;
  if (e < 20) return e + 4;
  if (e < 24) return e - 4;
  return e;
}

START_TEST(test_hand_built_file_is_taken) {
  dp_config cfg = ST_CFG(.n_devices = 2, .mode = DP_MODE_CLASSIC, .seed = 3);
  rig r;
  rig_open(&r, SMALL_SPEC, &cfg);
  ck_assert_uint_eq(r.np, SMALL_NP);
  tmpdir t;
  tmp_make(&t, "dp_st", "model.safetensors");
  run_steps(&r, 0, 2);
  unsigned char d[4 * SMALL_NP];
  if (_i == 1)
    for (size_t e = 0; e < SMALL_NP; e++) put_f32(d + 4 * sorted_pos(e), small_value(e));
  else
    small_data(d);
  st_write(t.path, UINT64_MAX, GOOD[_i], d, sizeof d);
  import_ok(&r, t.path);
  ck_assert_uint_eq(dp_ctx_step(r.c), 2);
  float *p = params_of(&r);
  for (size_t e = 0; e < SMALL_NP; e++)
    ck_assert_msg(p[e] == small_value(e), "file %d: parameter %zu is %g, want %g", _i, e,
                  (double)p[e], (double)small_value(e));
  free(p);
  tmp_done(&t);
  rig_close(&r);
}
END_TEST

/* ---- hostile files ------------------------------------------------------------------- */

static char *nested(const char *prefix, int depth, const char *suffix) {
  size_t n = strlen(prefix) + 2 * (size_t)depth + strlen(suffix) + 1;
  char *s = malloc(n);
  ck_assert_ptr_nonnull(s);
  strcpy(s, prefix);
  size_t k = strlen(s);
  for (int i = 0; i < depth; i++) s[k++] = '[';
  for (int i = 0; i < depth; i++) s[k++] = ']';
  strcpy(s + k, suffix);
  return s;
}

typedef enum {
  RAW_NONE,
  RAW_EMPTY,
  RAW_7,
  RAW_HLEN_PAST_END,
  RAW_HLEN_2_63,
  RAW_HLEN_MAX,
  RAW_NAN,
  RAW_INF,
  RAW_SHORT_DATA,
  RAW_NESTED_META,
  RAW_NESTED_FIELD,
  RAW_TRAIL1, /* 1, 4 zero bytes after the data */
  RAW_TRAIL4,
  RAW_HLEN_M1, /* the header padded with 8 spaces, its length 1, 4, 8 short, 4 long */
  RAW_HLEN_M4,
  RAW_HLEN_M8,
  RAW_HLEN_P4
} raw_kind;

static const struct {
  const char *what;
  raw_kind raw;    /* a case built in code */
  const char *hdr; /* otherwise: this header, SMALL_SPEC's data */
  dp_status want;
  const char *needle; /* in the message */
} HOSTILE[] = {
    {"empty file", RAW_EMPTY, NULL, DP_ERR_PARSE, "too short"},
    {"7 bytes", RAW_7, NULL, DP_ERR_PARSE, "too short"},
    {"header length past the end", RAW_HLEN_PAST_END, NULL, DP_ERR_PARSE, "runs past"},
    {"header length 2^63", RAW_HLEN_2_63, NULL, DP_ERR_PARSE, "runs past"},
    {"header length 2^64-1", RAW_HLEN_MAX, NULL, DP_ERR_PARSE, "runs past"},
    {"empty header", RAW_NONE, "", DP_ERR_PARSE, "JSON object"},
    {"not JSON", RAW_NONE, "hello, world", DP_ERR_PARSE, "JSON object"},
    {"an array", RAW_NONE, "[" ALL "]", DP_ERR_PARSE, "JSON object"},
    {"no tensors", RAW_NONE, "{}", DP_ERR_INVALID, "no tensor '0.weight'"},
    {"metadata only", RAW_NONE, "{\"__metadata__\":{\"format\":\"pt\"}}", DP_ERR_INVALID,
     "no tensor '0.weight'"},
    {"missing tensor", RAW_NONE, "{" W0 "," B0 "," W1 "," W3 "}", DP_ERR_INVALID,
     "no tensor '1.bias'"},
    {"extra tensor", RAW_NONE, "{" ALL "," ENT("3.bias", "2", 0, 8) "}", DP_ERR_INVALID,
     "'3.bias'"},
    {"extra tensor first", RAW_NONE, "{" ENT("2.weight", "4", 0, 16) "," ALL "}",
     DP_ERR_INVALID, "'2.weight'"},
    {"duplicate tensor", RAW_NONE, "{" ALL "," B0 "}", DP_ERR_PARSE, "'0.bias' twice"},
    {"transposed weight", RAW_NONE,
     "{" ENT("0.weight", "3,4", 0, 48) "," B0 "," W1 "," B1 "," W3 "}", DP_ERR_SHAPE,
     "'0.weight'"},
    {"flattened weight", RAW_NONE,
     "{" W0 "," B0 "," W1 "," B1 "," ENT("3.weight", "8", 96, 128) "}", DP_ERR_SHAPE,
     "'3.weight'"},
    {"3-d weight", RAW_NONE,
     "{" ENT("0.weight", "4,3,1", 0, 48) "," B0 "," W1 "," B1 "," W3 "}", DP_ERR_SHAPE,
     "'0.weight'"},
    {"scalar bias", RAW_NONE, "{" W0 "," ENT("0.bias", "", 48, 64) "," W1 "," B1 "," W3 "}",
     DP_ERR_SHAPE, "'0.bias'"},
    {"wrong width", RAW_NONE,
     "{" W0 "," B0 "," ENT("1.weight", "5", 64, 80) "," B1 "," W3 "}", DP_ERR_SHAPE,
     "'1.weight'"},
    {"9 dimensions", RAW_NONE,
     "{" ENT("0.weight", "1,1,1,1,1,1,1,4,3", 0, 48) "," B0 "," W1 "," B1 "," W3 "}",
     DP_ERR_PARSE, "8 dimensions"},
    {"negative dimension", RAW_NONE,
     "{" ENT("0.weight", "-4,3", 0, 48) "," B0 "," W1 "," B1 "," W3 "}", DP_ERR_PARSE,
     "integer"},
    {"huge dimension", RAW_NONE,
     "{" ENT("0.weight", "99999999999999999999,3", 0, 48) "," B0 "," W1 "," B1 "," W3 "}",
     DP_ERR_PARSE, "too large"},
    {"dtype F16", RAW_NONE,
     "{\"0.weight\":{\"dtype\":\"F16\",\"shape\":[4,3],\"data_offsets\":[0,24]}," B0 "," W1
     "," B1 "," W3 "}",
     DP_ERR_INVALID, "'0.weight' is F16"},
    {"dtype BF16", RAW_NONE,
     "{" W0 "," B0 "," W1 "," B1 ",\"3.weight\":{\"dtype\":\"BF16\",\"shape\":[2,4],"
     "\"data_offsets\":[96,112]}}",
     DP_ERR_INVALID, "'3.weight' is BF16"},
    {"dtype F64", RAW_NONE,
     "{" W0 ",\"0.bias\":{\"dtype\":\"F64\",\"shape\":[4],\"data_offsets\":[48,80]}," W1
     "," B1 "," W3 "}",
     DP_ERR_INVALID, "'0.bias' is F64"},
    {"dtype a number", RAW_NONE,
     "{\"0.weight\":{\"dtype\":32,\"shape\":[4,3],\"data_offsets\":[0,48]}," B0 "," W1
     "," B1 "," W3 "}",
     DP_ERR_PARSE, "string"},
    {"no dtype", RAW_NONE,
     "{\"0.weight\":{\"shape\":[4,3],\"data_offsets\":[0,48]}," B0 "," W1 "," B1 "," W3 "}",
     DP_ERR_PARSE, "lacks"},
    {"no data_offsets", RAW_NONE,
     "{" W0 "," B0 "," W1 "," B1 ",\"3.weight\":{\"dtype\":\"F32\",\"shape\":[2,4]}}",
     DP_ERR_PARSE, "lacks"},
    {"entry not an object", RAW_NONE, "{" W0 ",\"0.bias\":[48,64]," W1 "," B1 "," W3 "}",
     DP_ERR_PARSE, "object"},
    {"offsets past the data", RAW_NONE,
     "{" W0 "," B0 "," W1 "," B1 "," ENT("3.weight", "2,4", 100, 132) "}", DP_ERR_PARSE,
     "'3.weight' has data_offsets [100, 132]"},
    {"offsets far past the data", RAW_NONE,
     "{" W0 "," B0 "," W1 "," B1
     "," ENT("3.weight", "2,4", 9007199254740960, 9007199254740992) "}",
     DP_ERR_PARSE, "too large"},
    {"offsets of the wrong size", RAW_NONE,
     "{" ENT("0.weight", "4,3", 0, 44) "," B0 "," W1 "," B1 "," W3 "}", DP_ERR_PARSE,
     "'0.weight' has data_offsets [0, 44]"},
    {"end before begin", RAW_NONE,
     "{" W0 "," ENT("0.bias", "4", 64, 48) "," W1 "," B1 "," W3 "}", DP_ERR_PARSE,
     "'0.bias' has data_offsets [64, 48]"},
    {"negative offset", RAW_NONE,
     "{" W0 "," ENT("0.bias", "4", -16, 0) "," W1 "," B1 "," W3 "}", DP_ERR_PARSE,
     "non-negative integer"},
    {"three offsets", RAW_NONE,
     "{" W0 ",\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[48,64,80]}," W1
     "," B1 "," W3 "}",
     DP_ERR_PARSE, "data_offsets"},
    {"fractional offset", RAW_NONE,
     "{" W0 "," ENT("0.bias", "4", 48.0, 64) "," W1 "," B1 "," W3 "}", DP_ERR_PARSE,
     "data_offsets"},
    {"truncated string", RAW_NONE, "{\"0.weigh", DP_ERR_PARSE, "past the header's end"},
    {"truncated in a value", RAW_NONE, "{" W0 ",\"0.bias\":{\"dtype\":\"F3", DP_ERR_PARSE,
     "past the header's end"},
    {"no closing brace", RAW_NONE, "{" ALL, DP_ERR_PARSE, "'}' or ','"},
    {"missing comma", RAW_NONE, "{" W0 " " B0 "," W1 "," B1 "," W3 "}", DP_ERR_PARSE,
     "'}' or ','"},
    {"trailing comma", RAW_NONE, "{" ALL ",}", DP_ERR_PARSE, "string"},
    {"something after the object", RAW_NONE, "{" ALL "}x", DP_ERR_PARSE, "follows"},
    {"two objects", RAW_NONE, "{" ALL "}{}", DP_ERR_PARSE, "follows"},
    {"a NUL in the header", RAW_NONE, "{" ALL "}\0   ", DP_ERR_PARSE, "follows"},
    {"control character in a name", RAW_NONE, "{\"0.we\night\":{}}", DP_ERR_PARSE,
     "control character"},
    {"bad escape", RAW_NONE, "{\"0.we\\qight\":{}}", DP_ERR_PARSE, "escape"},
    {"non-ASCII \\u escape", RAW_NONE, "{\"0.weigh\\u00e9\":{}}", DP_ERR_PARSE, "escape"},
    {"bad hex in \\u escape", RAW_NONE,
     "{" W0 "," B0 "," W1 "," B1 ",\"3.weigh\\u000g\":{\"dtype\":\"F32\",\"shape\":[2,4],"
     "\"data_offsets\":[96,128]}}",
     DP_ERR_PARSE, "escape"},
    {"NUL \\u escape ending a name early", RAW_NONE,
     "{" W0 "," B0 "," W1 "," B1
     ",\"3.weight\\u0000junk\":{\"dtype\":\"F32\",\"shape\":[2,4],"
     "\"data_offsets\":[96,128]}}",
     DP_ERR_PARSE, "escape"},
    {"short \\u escape", RAW_NONE, "{\"0.weight\\u00", DP_ERR_PARSE, "escape"},
    {"very long name", RAW_NONE,
     "{\"0."
     "weightttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttt"
     "tttttttt\":{}}",
     DP_ERR_PARSE, "too long"},
    {"name not a string", RAW_NONE, "{0:{}}", DP_ERR_PARSE, "string"},
    {"metadata unterminated", RAW_NONE, "{\"__metadata__\":{\"format\":\"pt\"," ALL "}",
     DP_ERR_PARSE, "header"},
    {"deeply nested metadata", RAW_NESTED_META, NULL, DP_ERR_PARSE, "nested too deep"},
    {"deeply nested unknown field", RAW_NESTED_FIELD, NULL, DP_ERR_PARSE,
     "nested too deep"},
    {"NaN value", RAW_NAN, "{" ALL "}", DP_ERR_NONFINITE, "1.bias[2] is not finite"},
    {"Inf value", RAW_INF, "{" ALL "}", DP_ERR_NONFINITE, "3.weight[7] is not finite"},
    {"data cut short", RAW_SHORT_DATA, "{" ALL "}", DP_ERR_PARSE,
     "'3.weight' has data_offsets"},
    /* the tensors must tile the data: no overlap, no gap, nothing after */
    {"overlapping tensors", RAW_NONE,
     "{" W0 "," ENT("0.bias", "4", 44, 60) "," W1 "," B1 "," W3 "}", DP_ERR_PARSE,
     "tensor '0.bias' [44, 60] overlaps tensor '0.weight' (which ends at 48)"},
    {"two tensors on the same bytes", RAW_NONE,
     "{" W0 "," B0 "," ENT("1.weight", "4", 48, 64) "," B1 "," W3 "}", DP_ERR_PARSE,
     "[48, 64] overlaps tensor '0."},
    {"a gap between tensors", RAW_TRAIL4,
     "{" W0 "," ENT("0.bias", "4", 52, 68) "," ENT("1.weight", "4", 68, 84) "," ENT(
         "1.bias", "4", 84, 100) "," ENT("3.weight", "2,4", 100, 132) "}",
     DP_ERR_PARSE,
     "tensor '0.bias' starts at byte 52 of the data, after a gap of 4 bytes after tensor "
     "'0.weight'"},
    {"a gap at the start", RAW_TRAIL4,
     "{" ENT("0.weight", "4,3", 4, 52) "," ENT("0.bias", "4", 52, 68) "," ENT(
         "1.weight", "4", 68, 84) "," ENT("1.bias", "4", 84, 100) "," ENT("3.weight", "2,4",
                                                                          100, 132) "}",
     DP_ERR_PARSE,
     "tensor '0.weight' starts at byte 4 of the data, after a gap of 4 bytes at "
     "its start"},
    {"trailing data", RAW_TRAIL4, "{" ALL "}", DP_ERR_PARSE,
     "4 bytes follow the last tensor '3.weight'"},
    {"one trailing byte", RAW_TRAIL1, "{" ALL "}", DP_ERR_PARSE,
     "1 byte follows the last tensor '3.weight'"},
    /* the data's start moved into the padding: every value shifted (issue 26) */
    {"header length 4 short", RAW_HLEN_M4, "{" ALL "}", DP_ERR_PARSE,
     "4 bytes follow the last tensor"},
    {"header length 1 short", RAW_HLEN_M1, "{" ALL "}", DP_ERR_PARSE,
     "1 byte follows the last tensor"},
    {"header length 8 short", RAW_HLEN_M8, "{" ALL "}", DP_ERR_PARSE,
     "8 bytes follow the last tensor"},
    {"header length 4 long", RAW_HLEN_P4, "{" ALL "}", DP_ERR_PARSE, "follows the object"},
    /* duplicate keys: a second value would replace the first */
    {"dtype twice", RAW_NONE,
     "{\"0.weight\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[4,3],"
     "\"data_offsets\":[0,48]}," B0 "," W1 "," B1 "," W3 "}",
     DP_ERR_PARSE, "tensor '0.weight' has its field \"dtype\" twice"},
    {"shape twice", RAW_NONE,
     "{" W0 ",\"0.bias\":{\"shape\":[4],\"dtype\":\"F32\",\"shape\":[4],"
     "\"data_offsets\":[48,64]}," W1 "," B1 "," W3 "}",
     DP_ERR_PARSE, "tensor '0.bias' has its field \"shape\" twice"},
    {"data_offsets twice", RAW_NONE,
     "{" W0 "," B0 "," W1 "," B1 ",\"3.weight\":{\"dtype\":\"F32\",\"shape\":[2,4],"
     "\"data_offsets\":[0,32],\"data_offsets\":[96,128]}}",
     DP_ERR_PARSE, "tensor '3.weight' has its field \"data_offsets\" twice"},
    {"__metadata__ twice", RAW_NONE,
     "{\"__metadata__\":{},\"__metadata__\":{\"format\":\"pt\"}," ALL "}", DP_ERR_PARSE,
     "\"__metadata__\" appears twice"},
    {"__metadata__ a string", RAW_NONE, "{\"__metadata__\":\"pt\"," ALL "}", DP_ERR_PARSE,
     "__metadata__ must be an object"},
    /* the header starts with '{' */
    {"a space before the object", RAW_NONE, " {" ALL "}", DP_ERR_PARSE,
     "starting with '{'"},
    {"a newline before the object", RAW_NONE, "\n{" ALL "}", DP_ERR_PARSE,
     "starting with '{'"},
    /* UTF-8 and JSON's own grammar */
    {"a byte 0xff in metadata", RAW_NONE, "{\"__metadata__\":{\"a\":\"\xff\"}," ALL "}",
     DP_ERR_PARSE, "not valid UTF-8 (byte 0xff"},
    {"a stray continuation byte", RAW_NONE, "{\"__metadata__\":{\"a\":\"x\x80\"}," ALL "}",
     DP_ERR_PARSE, "not valid UTF-8"},
    {"an overlong '/'", RAW_NONE, "{\"__metadata__\":{\"a\":\"\xc0\xaf\"}," ALL "}",
     DP_ERR_PARSE, "not valid UTF-8"},
    {"an overlong 3-byte form", RAW_NONE,
     "{\"__metadata__\":{\"a\":\"\xe0\x80\xaf\"}," ALL "}", DP_ERR_PARSE,
     "not valid UTF-8"},
    {"a UTF-8 surrogate", RAW_NONE, "{\"__metadata__\":{\"a\":\"\xed\xa0\x80\"}," ALL "}",
     DP_ERR_PARSE, "not valid UTF-8"},
    {"above U+10FFFF", RAW_NONE, "{\"__metadata__\":{\"a\":\"\xf4\x90\x80\x80\"}," ALL "}",
     DP_ERR_PARSE, "not valid UTF-8"},
    {"a cut UTF-8 sequence", RAW_NONE, "{\"__metadata__\":{\"a\":\"\xe2\x82\"}," ALL "}",
     DP_ERR_PARSE, "not valid UTF-8"},
    {"bad UTF-8 in a name", RAW_NONE, "{\"0.weight\xc3\":{}}", DP_ERR_PARSE,
     "not valid UTF-8"},
    {"a control character in metadata", RAW_NONE,
     "{\"__metadata__\":{\"a\":\"\x1f\"}," ALL "}", DP_ERR_PARSE, "control character"},
    {"a lone high surrogate escape", RAW_NONE,
     "{\"__metadata__\":{\"a\":\"\\ud800\"}," ALL "}", DP_ERR_PARSE,
     "high surrogate without its low half"},
    {"a lone low surrogate escape", RAW_NONE,
     "{\"__metadata__\":{\"a\":\"\\udc00x\"}," ALL "}", DP_ERR_PARSE, "lone low surrogate"},
    {"a bare word in metadata", RAW_NONE, "{\"__metadata__\":{\"a\":tru}," ALL "}",
     DP_ERR_PARSE, "a value was expected"},
    {"a number with a leading zero", RAW_NONE, "{\"__metadata__\":{\"a\":01}," ALL "}",
     DP_ERR_PARSE, "a bad number"},
    {"a number without digits after '.'", RAW_NONE, "{\"__metadata__\":{\"a\":1.}," ALL "}",
     DP_ERR_PARSE, "a bad number"},
    {"a number without an exponent", RAW_NONE, "{\"__metadata__\":{\"a\":1e}," ALL "}",
     DP_ERR_PARSE, "a bad number"},
    {"a minus alone", RAW_NONE, "{\"__metadata__\":{\"a\":-}," ALL "}", DP_ERR_PARSE,
     "a bad number"},
    {"two numbers run together", RAW_NONE, "{\"__metadata__\":{\"a\":1-2}," ALL "}",
     DP_ERR_PARSE, "closing bracket"},
    {"an offset with a leading zero", RAW_NONE,
     "{" W0 "," ENT("0.bias", "4", 048, 064) "," W1 "," B1 "," W3 "}", DP_ERR_PARSE,
     "leading zero"},
};
#define N_HOSTILE ((int)(sizeof HOSTILE / sizeof HOSTILE[0]))

START_TEST(test_hostile_file_is_refused) {
  rig r;
  tmpdir t;
  ctx_snap sn;
  refusal_open(&r, &t, &sn, DP_MODE_ALLREDUCE, 3, 2);
  ck_assert_uint_eq(r.np, SMALL_NP);
  unsigned char d[4 * SMALL_NP];
  small_data(d);
  const char *what = HOSTILE[_i].what;
  char *h = NULL;
  switch (HOSTILE[_i].raw) {
  case RAW_EMPTY: file_write(t.path, "", 0); break;
  case RAW_7: file_write(t.path, "\x10\0\0\0\0\0\0", 7); break;
  case RAW_HLEN_PAST_END:
    st_write(t.path, strlen("{" ALL "}") + sizeof d + 1, "{" ALL "}", d, sizeof d);
    break;
  case RAW_HLEN_2_63: st_write(t.path, 1ull << 63, "{" ALL "}", d, sizeof d); break;
  case RAW_HLEN_MAX: st_write(t.path, UINT64_MAX - 1, "{" ALL "}", d, sizeof d); break;
  case RAW_NESTED_META:
    h = nested("{\"__metadata__\":{\"a\":", 100, "}," ALL "}");
    st_write(t.path, UINT64_MAX, h, d, sizeof d);
    break;
  case RAW_NESTED_FIELD:
    h = nested("{" W0 "," B0 "," W1 "," B1 ",\"3.weight\":{\"x\":", 100,
               ",\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[96,128]}}");
    st_write(t.path, UINT64_MAX, h, d, sizeof d);
    break;
  case RAW_NAN:
    put_f32(d + 4 * 22, NAN); /* 1.bias[2] */
    goto plain;
  case RAW_INF:
    put_f32(d + 4 * 31, -INFINITY); /* 3.weight[7] */
    goto plain;
  case RAW_SHORT_DATA:
    st_write(t.path, UINT64_MAX, HOSTILE[_i].hdr, d, sizeof d - 4);
    break;
  case RAW_HLEN_M1:
  case RAW_HLEN_M4:
  case RAW_HLEN_M8:
  case RAW_HLEN_P4: { /* valid with its own length: 8 spaces of padding */
    char hd[512];
    snprintf(hd, sizeof hd, "%s        ", HOSTILE[_i].hdr);
    raw_kind k = HOSTILE[_i].raw;
    size_t n = strlen(hd);
    st_write(t.path,
             k == RAW_HLEN_P4 ? n + 4
                              : n - (k == RAW_HLEN_M1   ? 1
                                     : k == RAW_HLEN_M4 ? 4
                                                        : 8),
             hd, d, sizeof d);
    break;
  }
  case RAW_TRAIL1:
  case RAW_TRAIL4: {
    unsigned char more[4 * SMALL_NP + 4] = {0};
    memcpy(more, d, sizeof d);
    st_write(t.path, UINT64_MAX, HOSTILE[_i].hdr, more,
             sizeof d + (HOSTILE[_i].raw == RAW_TRAIL1 ? 1 : 4));
    break;
  }
  case RAW_NONE:
  plain:
    if (strcmp(what, "a NUL in the header") == 0) {
      /* the header's own length covers the NUL and the spaces after it */
      const char *hd = HOSTILE[_i].hdr;
      size_t n = strlen(hd) + 4;
      unsigned char *b = malloc(8 + n + sizeof d);
      put_le64(b, n);
      memcpy(b + 8, hd, n);
      memcpy(b + 8 + n, d, sizeof d);
      file_write(t.path, b, 8 + n + sizeof d);
      free(b);
    } else {
      st_write(t.path, UINT64_MAX, HOSTILE[_i].hdr, d, sizeof d);
    }
    break;
  }
  free(h);
  dp_status s = dp_ckpt_import_safetensors(r.c, t.path);
  ck_assert_msg(s == HOSTILE[_i].want, "%s: %s (%s), want %s", what, dp_status_name(s),
                dp_ctx_error(r.c), dp_status_name(HOSTILE[_i].want));
  ck_assert_msg(strstr(dp_ctx_error(r.c), HOSTILE[_i].needle) != NULL,
                "%s: message '%s' lacks '%s'", what, dp_ctx_error(r.c), HOSTILE[_i].needle);
  ck_assert_msg(strstr(dp_ctx_error(r.c), t.path) != NULL,
                "%s: message '%s' lacks the path", what, dp_ctx_error(r.c));
  ctx_snap_check(&sn, r.c, what);
  /* the context still works, and the same data in a good file is taken */
  run_steps(&r, 2, 3);
  st_write(t.path, UINT64_MAX, "{" ALL "}", d, sizeof d);
  if (HOSTILE[_i].raw != RAW_NAN && HOSTILE[_i].raw != RAW_INF) import_ok(&r, t.path);
  refusal_close(&r, &t, &sn);
}
END_TEST

/* Another model's export: the first tensor whose shape differs is named. */
START_TEST(test_other_models_file_is_refused) {
  dp_config cfg = ST_CFG(.n_devices = 1, .mode = DP_MODE_CLASSIC, .seed = 5);
  rig a, b, small;
  rig_open(&a, MIX_SPEC, &cfg);
  rig_open(&b, MIX17_SPEC, &cfg);
  rig_open(&small, SMALL_SPEC, &cfg);
  tmpdir t;
  tmp_make(&t, "dp_st", "model.safetensors");
  export_ok(&b, t.path);
  ctx_snap sn;
  ctx_snap_take(&sn, a.c);
  ck_assert_int_eq(dp_ckpt_import_safetensors(a.c, t.path), DP_ERR_SHAPE);
  ck_assert_msg(
      strstr(dp_ctx_error(a.c), "tensor '0.weight' is [17, 12]; the model's is [16, 12]"),
      "%s", dp_ctx_error(a.c));
  ctx_snap_check(&sn, a.c, "MIX17 into MIX");
  /* a model with other tensor names: the first unknown one is named */
  ck_assert_int_eq(dp_ckpt_import_safetensors(small.c, t.path), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_ctx_error(small.c), "'4.weight' that the model does not"), "%s",
                dp_ctx_error(small.c));
  export_ok(&small, t.path);
  ck_assert_int_eq(dp_ckpt_import_safetensors(a.c, t.path), DP_ERR_INVALID);
  ctx_snap_check(&sn, a.c, "SMALL into MIX");
  ctx_snap_free(&sn);
  tmp_done(&t);
  rig_close(&a);
  rig_close(&b);
  rig_close(&small);
}
END_TEST

/* A FIFO without a writer, a directory, a missing file: DP_ERR_IO at once (the
 * alarm turns a hang into a failure). NULL and empty arguments: DP_ERR_INVALID. */
START_TEST(test_not_a_file_and_bad_arguments) {
  rig r;
  tmpdir t;
  ctx_snap sn;
  refusal_open(&r, &t, &sn, DP_MODE_CLASSIC, 5, 1);
  expect_not_a_file_refused(r.c, dp_ckpt_import_safetensors, t.dir, "fifo.safetensors");
  char p[400];
  snprintf(p, sizeof p, "%s/missing.safetensors", t.dir);
  ck_assert_int_eq(dp_ckpt_import_safetensors(r.c, p), DP_ERR_IO);
  ck_assert_msg(strstr(dp_ctx_error(r.c), p) && strstr(dp_ctx_error(r.c), strerror(ENOENT)),
                "%s", dp_ctx_error(r.c));
  ck_assert_int_eq(dp_ckpt_import_safetensors(r.c, "/dev/null"), DP_ERR_IO);
  /* a libdp checkpoint is named as such (not a header length past the file) */
  snprintf(p, sizeof p, "%s/model.ckpt", t.dir);
  ck_assert_int_eq(dp_ckpt_save(r.c, p), DP_OK);
  ck_assert_int_eq(dp_ckpt_import_safetensors(r.c, p), DP_ERR_PARSE);
  ck_assert_msg(strstr(dp_ctx_error(r.c), "is a libdp checkpoint, not a safetensors file"),
                "%s", dp_ctx_error(r.c));
  dp_meta *meta = NULL;
  int n_meta = 0;
  ck_assert_int_eq(dp_safetensors_read_meta(p, &meta, &n_meta), DP_ERR_PARSE);
  ck_assert_msg(strstr(dp_last_error(), "is a libdp checkpoint"), "%s", dp_last_error());
  ck_assert_int_eq(remove(p), 0);

  ck_assert_int_eq(dp_ckpt_import_safetensors(NULL, t.path), DP_ERR_INVALID);
  ck_assert_int_eq(dp_ckpt_export_safetensors(NULL, t.path), DP_ERR_INVALID);
  ck_assert_int_eq(dp_ckpt_import_safetensors(r.c, NULL), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_ctx_error(r.c), "NULL"), "%s", dp_ctx_error(r.c));
  ck_assert_int_eq(dp_ckpt_export_safetensors(r.c, NULL), DP_ERR_INVALID);
  ck_assert_int_eq(dp_ckpt_import_safetensors(r.c, ""), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_ctx_error(r.c), "empty"), "%s", dp_ctx_error(r.c));
  ck_assert_int_eq(dp_ckpt_export_safetensors(r.c, ""), DP_ERR_INVALID);
  ctx_snap_check(&sn, r.c, "not a file, bad arguments");
  ck_assert_int_eq(dir_entries(t.dir), 0);
  /* a regular file still works (O_NONBLOCK is cleared before reading) */
  export_ok(&r, t.path);
  import_ok(&r, t.path);
  ctx_snap_check(&sn, r.c, "own export imported");
  refusal_close(&r, &t, &sn);
}
END_TEST

/* ---- batchnorm's running statistics and mutated files --------------------------- */

/* A batchnorm at module 1 (its running_mean, running_var, num_batches_tracked
 * after the parameters) and a layernorm: 50 floats and a count. */
static const char BN_SPEC[] =
    "input 3\nlinear 4\nbatchnorm\nlayernorm\nlinear 2\nloss mse\n";

/* The state an import sets, as the export's data holds it: the parameters,
 * then running_mean, running_var (4 floats each) and the count (int64). */
static unsigned char *bn_state(rig *r, size_t *n) {
  *n = r->np * 4 + 8 * 4 + 8;
  unsigned char *b = malloc(*n);
  float *p = params_of(r), mv[8];
  int64_t count = 0;
  ck_assert_ptr_nonnull(b);
  ck_assert_int_eq(dp_get_running_stats(r->c, 1, mv, mv + 4, &count), DP_OK);
  for (size_t e = 0; e < r->np; e++) put_f32(b + 4 * e, p[e]);
  for (int e = 0; e < 8; e++) put_f32(b + 4 * (r->np + (size_t)e), mv[e]);
  put_le64(b + 4 * r->np + 32, (uint64_t)count);
  free(p);
  return b;
}

/* An exported file's bytes and where its parts are. */
typedef struct {
  unsigned char *b;
  size_t len, hlen; /* the file; its header's length */
  char *hdr;        /* the header as a string */
  const unsigned char *data;
  size_t dlen;
} st_file;

static void st_file_read(st_file *f, const char *path) {
  f->b = file_read(path, &f->len);
  f->hlen = (size_t)le64(f->b);
  ck_assert_uint_le(8 + f->hlen, f->len);
  f->hdr = strndup((const char *)f->b + 8, f->hlen);
  ck_assert_ptr_nonnull(f->hdr);
  f->data = f->b + 8 + f->hlen;
  f->dlen = f->len - 8 - f->hlen;
}

static void st_file_free(st_file *f) {
  free(f->b);
  free(f->hdr);
}

/* The data offset of a tensor, read from the header. */
static size_t begin_of(const st_file *f, const char *name) {
  char key[80];
  snprintf(key, sizeof key, "\"%s\":{", name);
  const char *at = strstr(f->hdr, key);
  ck_assert_msg(at, "no %s in %s", name, f->hdr);
  at = strstr(at, "\"data_offsets\":[");
  ck_assert_ptr_nonnull(at);
  return (size_t)strtoull(at + strlen("\"data_offsets\":["), NULL, 10);
}

/* A tied output head (GPT-2's): the state_dict names the token table twice, the
 * second a copy after the rest of the data (the tensors tile it); import takes the
 * file back bit for bit and refuses a file whose two copies differ, unchanged. */
START_TEST(test_tied_head_is_two_names_of_one_tensor) {
  static const char SPEC[] = "input tokens 4\nembed 10 6\nlayernorm\nlinear 10 tied\n"
                             "loss softmax_cross_entropy\n";
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse(SPEC, "tied", &m), DP_OK);
  dp_config c;
  dp_config_default(&c);
  c.batch = 4;
  dp_plan *p = NULL;
  dp_ctx *a = NULL, *b = NULL;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_OK);
  ck_assert_int_eq(dp_ctx_create(p, &a), DP_OK);
  ck_assert_int_eq(dp_ctx_create(p, &b), DP_OK);
  size_t np = dp_model_n_params(m); /* 10 x 6 tokens, 4 x 6 positions, layernorm 12 */
  ck_assert_uint_eq(np, 60 + 24 + 12);
  float *w = malloc(np * 4), *got = malloc(np * 4);
  ck_assert(w && got);
  for (size_t k = 0; k < np; k++) w[k] = (float)k * 0.25f - 3.0f;
  ck_assert_int_eq(dp_set_params(a, w, np), DP_OK);
  tmpdir t;
  tmp_make(&t, "dp_st", "tied.safetensors");
  ck_assert_msg(dp_ckpt_export_safetensors(a, t.path) == DP_OK, "%s", dp_ctx_error(a));
  st_file f;
  st_file_read(&f, t.path);
  size_t tok = begin_of(&f, "0.tok.weight"), head = begin_of(&f, "2.weight");
  ck_assert_uint_eq(tok, 0);
  ck_assert_uint_eq(head, np * 4); /* after the state bytes */
  ck_assert_uint_eq(f.dlen, np * 4 + 60 * 4);
  ck_assert_int_eq(memcmp(f.data + tok, f.data + head, 60 * 4), 0);
  ck_assert_int_eq(dp_ckpt_import_safetensors(b, t.path), DP_OK);
  ck_assert_int_eq(dp_get_params(b, got, np), DP_OK);
  ck_assert_int_eq(memcmp(w, got, np * 4), 0);
  /* one name of the two (safetensors.torch.save_model's file, without the copy):
   * the same parameters, whichever name it keeps (an outside check: it was
   * refused as a missing tensor) */
  {
    char hdr[512];
    const char *cut = strstr(f.hdr, ",\"2.weight\"");
    ck_assert_ptr_nonnull(cut);
    snprintf(hdr, sizeof hdr, "%.*s}", (int)(cut - f.hdr), f.hdr);
    st_write(t.path, UINT64_MAX, hdr, f.data, np * 4);
    float zero = 0.0f;
    for (size_t k = 0; k < np; k++) got[k] = zero;
    ck_assert_int_eq(dp_set_params(b, got, np), DP_OK);
    ck_assert_msg(dp_ckpt_import_safetensors(b, t.path) == DP_OK, "%s", dp_ctx_error(b));
    ck_assert_int_eq(dp_get_params(b, got, np), DP_OK);
    ck_assert_int_eq(memcmp(w, got, np * 4), 0);
  }
  /* the head's copy changed: refused, b as it was */
  f.b[8 + f.hlen + head + 4] ^= 0x40;
  file_write(t.path, f.b, f.len);
  uint64_t h = dp_params_hash(b);
  ck_assert_int_eq(dp_ckpt_import_safetensors(b, t.path), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_ctx_error(b), "'0.tok.weight' and '2.weight' are one tensor"),
                "%s", dp_ctx_error(b));
  ck_assert_uint_eq(dp_params_hash(b), h);
  st_file_free(&f);
  tmp_done(&t);
  free(w);
  free(got);
  dp_ctx_free(a);
  dp_ctx_free(b);
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

/* Running statistics no batchnorm can have are refused, naming the tensor and
 * the element, with the context unchanged (every arena byte, the parameters'
 * hash); the file as exported is taken with exactly its values. */
START_TEST(test_running_stats_are_checked) {
  dp_config cfg = ST_CFG(.n_devices = 2, .mode = DP_MODE_ALLREDUCE, .seed = 3);
  rig src, dst;
  rig_open(&src, BN_SPEC, &cfg);
  cfg.seed = 4;
  rig_open(&dst, BN_SPEC, &cfg);
  tmpdir t;
  tmp_make(&t, "dp_st", "bn.safetensors");
  run_steps(&src, 0, 3);
  run_steps(&dst, 0, 1);
  export_ok(&src, t.path);
  st_file f;
  st_file_read(&f, t.path);
  size_t mean = begin_of(&f, "1.running_mean"), var = begin_of(&f, "1.running_var"),
         count = begin_of(&f, "1.num_batches_tracked");
  ctx_snap sn;
  ctx_snap_take(&sn, dst.c);
  static const struct {
    int which, at; /* 0 mean, 1 var, 2 count */
    float v;
    dp_status want;
    const char *needle;
  } bad[] = {
      {1, 1, -0.5f, DP_ERR_INVALID,
       "1.running_var[1] is -0.5; a variance is never negative"},
      {1, 3, -FLT_MIN, DP_ERR_INVALID, "1.running_var[3] is -1.17549e-38"},
      {1, 0, NAN, DP_ERR_NONFINITE, "1.running_var[0] is not finite"},
      {0, 3, INFINITY, DP_ERR_NONFINITE, "1.running_mean[3] is not finite"},
      {2, 0, 0, DP_ERR_INVALID, "1.num_batches_tracked is -1; libdp counts up to"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    unsigned char *b = malloc(f.len);
    ck_assert_ptr_nonnull(b);
    memcpy(b, f.b, f.len);
    unsigned char *d = b + 8 + f.hlen;
    if (bad[i].which == 2)
      put_le64(d + count, UINT64_MAX);
    else
      put_f32(d + (bad[i].which ? var : mean) + 4 * (size_t)bad[i].at, bad[i].v);
    file_write(t.path, b, f.len);
    free(b);
    dp_status s = dp_ckpt_import_safetensors(dst.c, t.path);
    ck_assert_msg(s == bad[i].want, "case %zu: %s (%s)", i, dp_status_name(s),
                  dp_ctx_error(dst.c));
    ck_assert_msg(strstr(dp_ctx_error(dst.c), bad[i].needle) &&
                      strstr(dp_ctx_error(dst.c), t.path),
                  "case %zu: %s", i, dp_ctx_error(dst.c));
    ctx_snap_check(&sn, dst.c, bad[i].needle);
  }
  /* a zero variance, and -0, are variances; the file as exported is taken exactly */
  unsigned char *b = malloc(f.len);
  memcpy(b, f.b, f.len);
  put_f32(b + 8 + f.hlen + var, 0.0f);
  put_f32(b + 8 + f.hlen + var + 4, -0.0f);
  file_write(t.path, b, f.len);
  import_ok(&dst, t.path);
  free(b);
  file_write(t.path, f.b, f.len);
  import_ok(&dst, t.path);
  size_t n1, n2;
  unsigned char *a = bn_state(&src, &n1), *c = bn_state(&dst, &n2);
  ck_assert(n1 == n2 && n1 == f.dlen && memcmp(a, c, n1) == 0 &&
            memcmp(a, f.data, n1) == 0);
  free(a);
  free(c);
  ctx_snap_free(&sn);
  st_file_free(&f);
  tmp_done(&t);
  rig_close(&src);
  rig_close(&dst);
}
END_TEST

/* The hostile user's attack on a real export: a target context (another
 * state) imports each mutated file. A refusal must leave every arena byte as
 * it was; an acceptance must give exactly the values the data holds where the
 * exported header says (a mutation of the header, the data's bytes as they
 * were; of the data, the mutated bytes: safetensors has no checksum, so a
 * changed finite value is another valid file). Nothing may read the data
 * shifted, from other offsets or with another meaning. */
typedef struct {
  rig src, dst;
  tmpdir t;
  char own[320]; /* the target's own export: restores it after an acceptance */
  st_file f;
  ctx_snap sn;
  int refused, accepted;
} attack_rig;

static void attack(attack_rig *a, const unsigned char *b, size_t len,
                   const unsigned char *want, const char *what, size_t where) {
  file_write(a->t.path, b, len);
  dp_status s = dp_ckpt_import_safetensors(a->dst.c, a->t.path);
  if (s != DP_OK) {
    if (!strstr(dp_ctx_error(a->dst.c), a->t.path))
      ck_abort_msg("%s at %zu: %s: message '%s' lacks the path", what, where,
                   dp_status_name(s), dp_ctx_error(a->dst.c));
    ctx_snap_check(&a->sn, a->dst.c, what);
    a->refused++;
    return;
  }
  size_t n;
  unsigned char *got = bn_state(&a->dst, &n);
  if (!want || n != a->f.dlen || memcmp(got, want, n) != 0)
    ck_abort_msg("%s at %zu: accepted, %s", what, where,
                 want ? "with values other than the data's" : "but it must be refused");
  free(got);
  import_ok(&a->dst, a->own);
  ctx_snap_check(&a->sn, a->dst.c, "restored");
  a->accepted++;
}

/* The file with header h (its own length + `dh`) and the exported data. */
static void attack_header(attack_rig *a, const char *h, long dh, const char *what,
                          size_t where, bool may_accept) {
  size_t n = strlen(h);
  unsigned char *b = malloc(8 + n + a->f.dlen);
  ck_assert_ptr_nonnull(b);
  put_le64(b, (uint64_t)((long)n + dh));
  memcpy(b + 8, h, n);
  memcpy(b + 8 + n, a->f.data, a->f.dlen);
  attack(a, b, 8 + n + a->f.dlen, may_accept ? a->f.data : NULL, what, where);
  free(b);
}

/* s with [at, at + cut) replaced by ins (malloc'd). */
static char *splice(const char *s, size_t at, size_t cut, const char *ins) {
  size_t n = strlen(s), k = strlen(ins);
  char *r = malloc(n - cut + k + 1);
  ck_assert_ptr_nonnull(r);
  memcpy(r, s, at);
  memcpy(r + at, ins, k);
  strcpy(r + at + k, s + at + cut);
  return r;
}

/* Every tensor's entry duplicated, each of its fields duplicated, its
 * offsets moved by 4 either way; the metadata duplicated. */
static void attack_structure(attack_rig *a) {
  const char *h = a->f.hdr;
  for (int i = 0; i < dp_model_n_tensors(a->src.m) + 3; i++) {
    char name[64], key[80];
    if (i < dp_model_n_tensors(a->src.m)) {
      dp_tensor_info ti;
      dp_model_tensor(a->src.m, i, &ti);
      snprintf(name, sizeof name, "%s", ti.name);
    } else {
      static const char *const buf[] = {"running_mean", "running_var",
                                        "num_batches_tracked"};
      snprintf(name, sizeof name, "1.%s", buf[i - dp_model_n_tensors(a->src.m)]);
    }
    snprintf(key, sizeof key, "\"%s\":{", name);
    const char *e = strstr(h, key), *close = e ? strchr(e, '}') : NULL;
    ck_assert_msg(e && close, "no entry %s in %s", name, h);
    size_t at = (size_t)(e - h), elen = (size_t)(close + 1 - e);
    char entry[256], ins[300];
    snprintf(entry, sizeof entry, "%.*s", (int)elen, e);
    snprintf(ins, sizeof ins, "%s,", entry); /* the entry twice */
    char *m = splice(h, at, 0, ins);
    attack_header(a, m, 0, "entry twice", (size_t)i, false);
    free(m);
    static const char *const fields[] = {"\"dtype\":", "\"shape\":", "\"data_offsets\":"};
    for (int k = 0; k < 3; k++) { /* the field twice, first with its own value */
      const char *fld = strstr(entry, fields[k]);
      ck_assert_ptr_nonnull(fld);
      size_t flen = strcspn(fld + strlen(fields[k]), "]\"") + strlen(fields[k]) + 1;
      if (fld[strlen(fields[k])] == '"') /* a string: up to its closing quote */
        flen = (size_t)(strchr(fld + strlen(fields[k]) + 1, '"') + 1 - fld);
      snprintf(ins, sizeof ins, "%.*s,", (int)flen, fld);
      m = splice(h, at + strlen(key), 0, ins);
      attack_header(a, m, 0, "field twice", (size_t)(3 * i + k), false);
      free(m);
    }
    const char *off = strstr(entry, "\"data_offsets\":[");
    unsigned long long b0, b1;
    ck_assert_int_eq(sscanf(off, "\"data_offsets\":[%llu,%llu]", &b0, &b1), 2);
    for (int dir = -1; dir <= 1; dir += 2) { /* moved by 4: an overlap and a gap */
      if (dir < 0 && b0 < 4) continue;
      char moved[80];
      snprintf(moved, sizeof moved, "\"data_offsets\":[%llu,%llu]",
               b0 + 4ull * (unsigned)dir, b1 + 4ull * (unsigned)dir);
      size_t olen = strcspn(off, "]") + 1;
      m = splice(h, at + (size_t)(off - entry), olen, moved);
      attack_header(a, m, 0, "offsets moved", (size_t)i, false);
      free(m);
    }
  }
  char *m = splice(h, 1, 0, "\"__metadata__\":{},");
  attack_header(a, m, 0, "metadata twice", 0, false);
  free(m);
}

START_TEST(test_mutated_files_are_refused_or_exact) {
  attack_rig a = {0};
  dp_config cfg = ST_CFG(.n_devices = 2, .mode = DP_MODE_ALLREDUCE, .seed = 3);
  rig_open(&a.src, BN_SPEC, &cfg);
  cfg.seed = 4;
  rig_open(&a.dst, BN_SPEC, &cfg);
  tmp_make(&a.t, "dp_st", "mutated.safetensors");
  snprintf(a.own, sizeof a.own, "%s/own.safetensors", a.t.dir);
  run_steps(&a.src, 0, 3);
  run_steps(&a.dst, 0, 1);
  export_ok(&a.dst, a.own);
  export_ok(&a.src, a.t.path);
  st_file_read(&a.f, a.t.path);
  ctx_snap_take(&a.sn, a.dst.c);
  unsigned char *b = malloc(a.f.len + 16);
  ck_assert_ptr_nonnull(b);
  attack(&a, a.f.b, a.f.len, a.f.data, "the export itself", 0);
  ck_assert_int_eq(a.accepted, 1);
  /* a flipped bit in every byte: the length and header, then the data */
  for (size_t at = 0; at < a.f.len; at++)
    for (int bit = 0; bit < 8; bit++) {
      memcpy(b, a.f.b, a.f.len);
      b[at] ^= (unsigned char)(1u << bit);
      attack(&a, b, a.f.len, at < 8 + a.f.hlen ? a.f.data : b + 8 + a.f.hlen, "bit flip",
             at);
    }
  /* every truncation, and bytes after the data */
  for (size_t len = 0; len < a.f.len; len++) attack(&a, a.f.b, len, NULL, "truncated", len);
  memcpy(b, a.f.b, a.f.len);
  memset(b + a.f.len, 0, 16);
  for (size_t k = 1; k <= 16; k++) attack(&a, b, a.f.len + k, NULL, "trailing", k);
  /* the header length moved, with the export's padding and with 8 more spaces
   * (so that a shorter length still ends on a whole object) */
  char *padded = malloc(a.f.hlen + 9);
  snprintf(padded, a.f.hlen + 9, "%s        ", a.f.hdr);
  attack_header(&a, padded, 0, "padded", 0, true);
  for (long dh = -9; dh <= 9; dh++) {
    if (!dh) continue;
    attack_header(&a, a.f.hdr, dh, "header length moved", (size_t)(dh + 9), false);
    attack_header(&a, padded, dh, "padded header length moved", (size_t)(dh + 9), false);
  }
  free(padded);
  attack_structure(&a);
  /* metadata flips are the header mutations that may be taken */
  ck_assert_int_gt(a.refused, 5000);
  if (getenv("DP_ATTACK_REPORT"))
    fprintf(stderr, "safetensors attack: %d refused, %d accepted\n", a.refused, a.accepted);
  free(b);
  ctx_snap_free(&a.sn);
  st_file_free(&a.f);
  tmp_done(&a.t);
  rig_close(&a.src);
  rig_close(&a.dst);
}
END_TEST

/* ---- export I/O ------------------------------------------------------------------------
 */

START_TEST(test_export_io_errors) {
  rig r;
  tmpdir t;
  ctx_snap sn;
  refusal_open(&r, &t, &sn, DP_MODE_CLASSIC, 5, 0);
  expect_write_refused(r.c, dp_ckpt_export_safetensors, t.dir, "x.safetensors");
  expect_write_keeps_nodes(r.c, dp_ckpt_export_safetensors, t.dir, "x.safetensors");
  /* over an existing file: replaced whole, no temporary file left */
  file_write(t.path, "old contents", 12);
  export_ok(&r, t.path);
  ck_assert_int_eq(dir_entries(t.dir), 1);
  import_ok(&r, t.path);
  ctx_snap_check(&sn, r.c, "export errors");
  refusal_close(&r, &t, &sn);
}
END_TEST

/* ---- metadata ------------------------------------------------------------------------ */

/* A program's pairs ride after libdp's, in order, strings exact (quotes,
 * backslashes, newlines, UTF-8); dp_safetensors_read_meta gives them back,
 * the import still takes the file, and no pairs is the plain export's bytes. */
START_TEST(test_metadata_round_trip) {
  dp_config cfg = ST_CFG(.n_devices = 1, .seed = 3);
  rig r;
  rig_open(&r, SMALL_SPEC, &cfg);
  tmpdir t;
  tmp_make(&t, "dp_st", "model.safetensors");
  run_steps(&r, 0, 1);
  static const dp_meta pairs[] = {
      {"dp.standardize", "feature"},
      {"dp.mean", "0.5,-1e-07,3"},
      {"odd \"key\"\\", "line\none\ttab caf\xc3\xa9 \xf0\x9f\x98\x80"},
      {"empty", ""}};
  ck_assert_int_eq(dp_ckpt_export_safetensors_meta(r.c, t.path, pairs, 4), DP_OK);
  dp_meta *m = NULL;
  int n = -1;
  ck_assert_int_eq(dp_safetensors_read_meta(t.path, &m, &n), DP_OK);
  ck_assert_int_eq(n, 6);
  ck_assert_str_eq(m[0].key, "format");
  ck_assert_str_eq(m[0].value, "pt");
  ck_assert_str_eq(m[1].key, "libdp_model");
  ck_assert_str_eq(m[1].value, SMALL_SPEC);
  for (int i = 0; i < 4; i++) {
    ck_assert_str_eq(m[2 + i].key, pairs[i].key);
    ck_assert_str_eq(m[2 + i].value, pairs[i].value);
  }
  free(m);
  float *before = params_of(&r);
  import_ok(&r, t.path);
  float *after = params_of(&r);
  ck_assert_mem_eq(before, after, SMALL_NP * 4);
  free(before);
  free(after);
  /* no pairs: the plain export, byte for byte */
  char *plain = strdup(tmp_path(&t, "plain.safetensors")),
       *none = strdup(tmp_path(&t, "none.safetensors"));
  export_ok(&r, plain);
  ck_assert_int_eq(dp_ckpt_export_safetensors_meta(r.c, none, NULL, 0), DP_OK);
  size_t la, lb;
  unsigned char *a = file_read(plain, &la), *b = file_read(none, &lb);
  ck_assert_uint_eq(la, lb);
  ck_assert_mem_eq(a, b, la);
  free(a);
  free(b);
  free(plain);
  free(none);
  tmp_done(&t);
  rig_close(&r);
}
END_TEST

/* Pairs the format or libdp cannot carry: refused before anything is written. */
START_TEST(test_metadata_bad_pairs_refused) {
  dp_config cfg = ST_CFG(.n_devices = 1, .seed = 3);
  rig r;
  rig_open(&r, SMALL_SPEC, &cfg);
  tmpdir t;
  tmp_make(&t, "dp_st", "model.safetensors");
  static const struct {
    dp_meta m[2];
    int n;
    const char *why;
  } bad[] = {
      {{{"format", "x"}}, 1, "libdp's own"},
      {{{"libdp_model", "x"}}, 1, "libdp's own"},
      {{{"a", "1"}, {"a", "2"}}, 2, "given twice"},
      {{{"", "1"}}, 1, "key is empty"},
      {{{NULL, "1"}}, 1, "key is NULL"},
      {{{"a", NULL}}, 1, "value is NULL"},
      {{{"a", "caf\xe9"}}, 1, "value of key \"a\" is not valid UTF-8"},
      {{{"\xc0\x80", "x"}}, 1, "name of key"},
      {{{"a", "x"}}, -1, "pairs"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    dp_status s = dp_ckpt_export_safetensors_meta(r.c, t.path, bad[i].m, bad[i].n);
    ck_assert_msg(s == DP_ERR_INVALID, "case %zu: %s", i, dp_status_name(s));
    ck_assert_msg(strstr(dp_ctx_error(r.c), bad[i].why), "case %zu: %s", i,
                  dp_ctx_error(r.c));
    ck_assert_int_eq(access(t.path, F_OK), -1);
    ck_assert_int_eq(dir_entries(t.dir), 0);
  }
  ck_assert_int_eq(dp_ckpt_export_safetensors_meta(r.c, t.path, NULL, 1), DP_ERR_INVALID);
  tmp_done(&t);
  rig_close(&r);
}
END_TEST

/* Files of other writers: escapes decoded (a surrogate pair to one UTF-8
 * character), no metadata at all; and every file another reader would take
 * otherwise refused with its reason. */
START_TEST(test_metadata_read_hand_built) {
  tmpdir t;
  tmp_make(&t, "dp_st", "m.safetensors");
  st_write(t.path, UINT64_MAX,
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
           " \"__metadata__\" : {\"k\\u00e9\":\"\\ud83d\\ude00\\n\\\"\\/\", \"x\":\"\"}}  ",
           "\0\0\0\0", 4);
  dp_meta *m = NULL;
  int n = 0;
  ck_assert_int_eq(dp_safetensors_read_meta(t.path, &m, &n), DP_OK);
  ck_assert_int_eq(n, 2);
  ck_assert_str_eq(m[0].key, "k\xc3\xa9");
  ck_assert_str_eq(m[0].value, "\xf0\x9f\x98\x80\n\"/");
  ck_assert_str_eq(m[1].key, "x");
  ck_assert_str_eq(m[1].value, "");
  free(m);
  st_write(t.path, UINT64_MAX, "{}", "", 0);
  m = (dp_meta *)&n;
  ck_assert_int_eq(dp_safetensors_read_meta(t.path, &m, &n), DP_OK);
  ck_assert_ptr_null(m);
  ck_assert_int_eq(n, 0);
  static const struct {
    const char *hdr, *why;
  } bad[] = {
      {"{\"__metadata__\":{\"k\":1}}", "not a string"},
      {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", "the key \"k\" twice"},
      {"{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", "NUL"},
      {"{\"__metadata__\":[]}", "must be an object"},
      {"{\"__metadata__\":{},\"__metadata__\":{}}", "appears twice"},
      {"{\"__metadata__\":{\"k\":\"\\ud83d\"}}", "high surrogate"},
      {"{\"__metadata__\":{\"k\":\"v\"}", "'}' or ',' was expected"},
      {"{\"__metadata__\":{\"k\":\"v\"}} x", "something follows"},
      {"[]", "starting with '{'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    st_write(t.path, UINT64_MAX, bad[i].hdr, "", 0);
    dp_status s = dp_safetensors_read_meta(t.path, &m, &n);
    ck_assert_msg(s == DP_ERR_PARSE, "case %zu: %s", i, dp_status_name(s));
    ck_assert_msg(strstr(dp_last_error(), bad[i].why) && strstr(dp_last_error(), t.path),
                  "case %zu: %s", i, dp_last_error());
    ck_assert_ptr_null(m);
    ck_assert_int_eq(n, 0);
  }
  st_write(t.path, 1000, "{}", "", 0); /* a header length past the end */
  ck_assert_int_eq(dp_safetensors_read_meta(t.path, &m, &n), DP_ERR_PARSE);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "runs past"));
  file_write(t.path, "\2\0\0", 3);
  ck_assert_int_eq(dp_safetensors_read_meta(t.path, &m, &n), DP_ERR_PARSE);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "too short"));
  ck_assert_int_eq(dp_safetensors_read_meta(t.dir, &m, &n), DP_ERR_IO);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "directory"));
  ck_assert_int_eq(dp_safetensors_read_meta(NULL, &m, &n), DP_ERR_INVALID);
  ck_assert_int_eq(dp_safetensors_read_meta(t.path, NULL, &n), DP_ERR_INVALID);
  tmp_done(&t);
}
END_TEST

Suite *safetensors_suite(void) {
  Suite *s = suite_create("safetensors");
  TCase *tc = tcase_create("round_trip");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_export_import_is_bit_identical, 0, 3);
  tcase_add_test(tc, test_import_is_set_params);
  tcase_add_test(tc, test_file_independent_of_devices_and_mode);
  suite_add_tcase(s, tc);

  tc = tcase_create("format");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_file_layout);
  tcase_add_test(tc, test_seed_example);
  tcase_add_test(tc, test_tied_head_is_two_names_of_one_tensor);
  suite_add_tcase(s, tc);

  tc = tcase_create("hand_built");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_hand_built_file_is_taken, 0, N_GOOD);
  suite_add_tcase(s, tc);

  tc = tcase_create("hostile");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_hostile_file_is_refused, 0, N_HOSTILE);
  tcase_add_test(tc, test_other_models_file_is_refused);
  tcase_add_test(tc, test_not_a_file_and_bad_arguments);
  tcase_add_test(tc, test_running_stats_are_checked);
  tcase_add_test(tc, test_mutated_files_are_refused_or_exact);
  suite_add_tcase(s, tc);

  tc = tcase_create("metadata");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_metadata_round_trip);
  tcase_add_test(tc, test_metadata_bad_pairs_refused);
  tcase_add_test(tc, test_metadata_read_hand_built);
  suite_add_tcase(s, tc);

  tc = tcase_create("export_io");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_export_io_errors);
  suite_add_tcase(s, tc);
  return s;
}
