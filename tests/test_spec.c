/* Tests of the model: the .dpm text parser (every error names "name:line:col"),
 * the builder API, inferred shapes and parameter counts in state_dict order,
 * format/parse round trips, loading from files, and absurd dimensions that
 * must end in DP_ERR_OVERFLOW rather than a wrapped size. */
#include "core/backend.h"
#include "helpers.h"
#include "specs.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------ */

/* Parsing `text` as "m.dpm" fails with `want` and a message that starts with
 * "m.dpm:LINE:COL: " and contains `needle`. */
static void parse_bad_as(const char *text, dp_status want, int line, int col,
                         const char *needle) {
  dp_model *m = (dp_model *)(uintptr_t)1;
  dp_status s = dp_model_parse(text, "m.dpm", &m);
  ck_assert_msg(s == want, "'%s': status %s, want %s (error: %s)", text, dp_status_name(s),
                dp_status_name(want), dp_last_error());
  ck_assert_msg(m == NULL, "'%s': *out not NULL on error", text);
  char prefix[64];
  snprintf(prefix, sizeof prefix, "m.dpm:%d:%d: ", line, col);
  const char *e = dp_last_error();
  ck_assert_msg(strncmp(e, prefix, strlen(prefix)) == 0,
                "'%s': error '%s' does not start with '%s'", text, e, prefix);
  ck_assert_msg(strstr(e, needle) != NULL, "'%s': error '%s' lacks '%s'", text, e, needle);
}

static void parse_bad(const char *text, int line, int col, const char *needle) {
  parse_bad_as(text, DP_ERR_PARSE, line, col, needle);
}

static void assert_same_model(const dp_model *a, const dp_model *b) {
  ck_assert_int_eq(a->input_width, b->input_width);
  ck_assert_int_eq(a->n_layers, b->n_layers);
  ck_assert_int_eq(a->loss, b->loss);
  ck_assert_uint_eq(a->n_params, b->n_params);
  for (int i = 0; i < a->n_layers; i++) {
    const dp_layer *x = &a->layers[i], *y = &b->layers[i];
    ck_assert_int_eq(x->kind, y->kind);
    ck_assert_int_eq(x->in, y->in);
    ck_assert_int_eq(x->out, y->out);
    ck_assert_int_eq(x->bias, y->bias);
    ck_assert_msg(x->p == y->p, "layer %d: dropout p %.9g != %.9g", i, (double)x->p,
                  (double)y->p);
    ck_assert_uint_eq(x->param_off, y->param_off);
    ck_assert_uint_eq(x->n_params, y->n_params);
    ck_assert_int_eq(x->t, y->t); /* sequences */
    ck_assert_int_eq(x->vocab, y->vocab);
    ck_assert_int_eq(x->heads, y->heads);
    ck_assert_int_eq(x->link, y->link);
    ck_assert_msg(x->eps == y->eps, "layer %d: eps %.9g != %.9g", i, (double)x->eps,
                  (double)y->eps);
    ck_assert_msg(x->momentum == y->momentum, "layer %d: momentum %.17g != %.17g", i,
                  x->momentum, y->momentum);
    ck_assert_int_eq(x->k, y->k); /* image layers */
    ck_assert_int_eq(x->stride, y->stride);
    ck_assert_int_eq(x->pad, y->pad);
    ck_assert_int_eq(x->exclude_pad, y->exclude_pad);
  }
}

static dp_plan *plan_of_spec(const char *spec) {
  dp_model *m = model_of(spec);
  dp_config c = config_of(4, 1, DP_OPT_SGD);
  dp_plan *p = plan_of(m, &c);
  dp_model_free(m);
  return p;
}

/* The plans of the NULL-terminated specs (on 1 device) hash differently: what
 * tells them apart is in the plan's hash, so ranks that differ in it do not
 * agree to run. */
static void hashes_differ(const char *const *specs) {
  uint64_t seen[16];
  for (int i = 0; specs[i]; i++) {
    ck_assert_int_lt(i, 16);
    dp_plan *p = plan_of_spec(specs[i]);
    seen[i] = dp_plan_hash(p);
    for (int j = 0; j < i; j++)
      ck_assert_msg(seen[i] != seen[j], "'%s' and '%s' hash alike", specs[i], specs[j]);
    dp_plan_free(p);
  }
}

/* ---- errors: layers ---------------------------------------------------------------- */

START_TEST(unknown_layer_is_named_with_its_position) {
  parse_bad("input 4\nconv 3\n", 2, 1, "unknown layer 'conv'");
  parse_bad("input 4\nlinear 3\n\n    softmax\n", 4, 5, "unknown layer 'softmax'");
  parse_bad("input 4\nLinear 3\n", 2, 1,
            "unknown layer 'Linear'"); /* keywords are lowercase */
}
END_TEST

START_TEST(missing_width_points_after_the_keyword) {
  parse_bad("input\n", 1, 7,
            "expected a width (or channels, height and width) after 'input'");
  parse_bad("input 4\nlinear\n", 2, 8, "expected a width after 'linear'");
  parse_bad("input 4\n  linear   # no width\n", 2, 10, "expected a width after 'linear'");
}
END_TEST

START_TEST(invalid_width_is_refused_at_its_column) {
  parse_bad("input 4\nlinear abc\n", 2, 8,
            "linear: expected a positive integer, got 'abc'");
  parse_bad("input 4\nlinear 3.5\n", 2, 8, "expected a positive integer, got '3.5'");
  parse_bad("input 4\nlinear +3\n", 2, 8, "expected a positive integer, got '+3'");
  parse_bad("input 4\nlinear 0x10\n", 2, 8, "expected a positive integer");
  parse_bad("input four\n", 1, 7, "input: expected a positive integer, got 'four'");
}
END_TEST

START_TEST(zero_width_is_out_of_range) {
  parse_bad("input 0\n", 1, 7, "input: width 0 is out of range");
  parse_bad("input 3\nlinear 0\n", 2, 8, "linear: width 0 is out of range");
  /* a UTF-8 byte-order mark first is skipped (columns count from after it) */
  {
    dp_model *m = NULL;
    ck_assert_int_eq(dp_model_parse("\xef\xbb\xbfinput 3\nlinear 2\n", "bom", &m), DP_OK);
    ck_assert_int_eq(dp_model_input_width(m), 3);
    dp_model_free(m);
  }
  parse_bad("\xef\xbb\xbfinput 3\nlinear 0\n", 2, 8, "linear: width 0 is out of range");
  /* each number named for what it is */
  parse_bad("input 0 8 8\n", 1, 7, "input: channels 0 is out of range");
  parse_bad("input 1 0 8\n", 1, 9, "input: height 0 is out of range");
  parse_bad("input 1 8 8\nconv2d 0 3\n", 2, 8, "conv2d: output channels 0 is out of range");
  parse_bad("input 1 8 8\nconv2d 4 0\n", 2, 10, "conv2d: kernel size 0 is out of range");
  parse_bad("input 1 8 8\nconv2d 4 3 stride 0\n", 2, 19,
            "conv2d: stride 0 is out of range");
  parse_bad("input 1 8 8\nmaxpool2d 0\n", 2, 11,
            "maxpool2d: kernel size 0 is out of range");
  parse_bad("input tokens 0\n", 1, 14, "input tokens: context 0 is out of range");
  parse_bad("input tokens 8\nembed 0 4\n", 2, 7, "embed: vocabulary 0 is out of range");
  parse_bad("input tokens 8\nembed 9 4\nattention 0\n", 3, 11,
            "attention: head count 0 is out of range");
  parse_bad("input 3\nlinear 000\n", 2, 8, "out of range");
}
END_TEST

START_TEST(negative_width_is_refused) {
  parse_bad("input -3\n", 1, 7, "input: expected a positive integer, got '-3'");
  parse_bad("input 3\nlinear -1\n", 2, 8, "linear: expected a positive integer, got '-1'");
}
END_TEST

START_TEST(huge_width_is_out_of_range_not_wrapped) {
  parse_bad("input 2147483648\n", 1, 7, "width '2147483648' is too large (max 2147483647)");
  parse_bad("input 3\nlinear 4294967297\n", 2, 8,
            "too large (max 2147483647)"); /* u32 wrap */
  parse_bad(
      "input 3\nlinear 99999999999999999999\n", 2, 8,
      "linear: width '99999999999999999999' is too large (max 2147483647)"); /* > LONG_MAX
                                                                              */

  dp_model *m = model_of("input 2147483647\nlinear 1\n");
  ck_assert_int_eq(dp_model_input_width(m), 2147483647);
  dp_model_free(m);
}
END_TEST

/* Issue 12: a width longer than any int said "expected a positive integer" and
 * cut its echo without the closing quote. It is too large, and the echo is
 * shortened with "..." inside its quotes. */
START_TEST(overlong_width_is_too_large_and_its_echo_is_closed) {
  parse_bad("input 3\nlinear 1234567890123456789012345678901234567890\n", 2, 8,
            "linear: width '1234567890123456789012345678901234567890' is too large (max "
            "2147483647)");
  char text[4200] = "input 3\nlinear ";
  size_t n = strlen(text);
  memset(text + n, '9', 4000);
  strcpy(text + n + 4000, "\n");
  parse_bad(text, 2, 8,
            "linear: width '99999999999999999999999999999999...' is too large (max "
            "2147483647)");
  ck_assert_msg(strlen(dp_last_error()) < 200, "%s", dp_last_error());
  /* a long token that is not a number: echoed shortened, quote closed */
  memset(text + n, 'x', 4000);
  parse_bad(text, 2, 8,
            "expected a positive integer, got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'");
  /* leading zeros are still a width */
  dp_model *m = model_of("input 3\nlinear 00000000000000000000000000000000000000000007\n");
  ck_assert_int_eq(dp_model_output_width(m), 7);
  dp_model_free(m);
}
END_TEST

START_TEST(long_unknown_words_are_echoed_with_a_closing_quote) {
  char text[2100] = "input 3\n";
  size_t n = strlen(text);
  memset(text + n, 'q', 2000);
  strcpy(text + n + 2000, "\n");
  parse_bad(text, 2, 1, "unknown layer 'qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq...' (expected");
  strcpy(text, "input 3\nloss ");
  n = strlen(text);
  memset(text + n, 'q', 2000);
  strcpy(text + n + 2000, "\n");
  parse_bad(text, 2, 6, "unknown loss 'qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq...' (expected");
}
END_TEST

START_TEST(first_line_must_be_input) {
  parse_bad("linear 3\n", 1, 1, "expected 'input N' or 'input C H W' first, got 'linear'");
  parse_bad("# a comment\n\n   relu\ninput 3\n", 3, 4, "first, got 'relu'");
  parse_bad("loss mse\n", 1, 1, "first, got 'loss'");
}
END_TEST

START_TEST(duplicate_input_is_refused) {
  parse_bad("input 3\ninput 4\n", 2, 1, "'input' may appear only once");
  parse_bad("input 3\nlinear 2\n  input 2\n", 3, 3, "'input' may appear only once");
}
END_TEST

START_TEST(misspelt_nobias_is_named) {
  parse_bad("input 3\nlinear 4 nobais\n", 2, 10,
            "expected 'nobias', 'tied' or end of line, got 'nobais'");
  parse_bad("input 3\nlinear 4 bias\n", 2, 10, "got 'bias'");
  parse_bad("input 3\nlinear 4 NOBIAS\n", 2, 10, "got 'NOBIAS'");
}
END_TEST

START_TEST(trailing_tokens_are_refused) {
  parse_bad("input 3 4\n", 1, 9, "'input C H W' three; got two");
  parse_bad("input 3\nrelu x\n", 2, 6, "unexpected 'x' after 'relu'");
  parse_bad("input 3\nlayernorm 3\n", 2, 11,
            "layernorm: expected 'eps E' or end of line, got '3'");
  parse_bad("input 3\nlinear 4 nobias x\n", 2, 17, "unexpected 'x' after 'linear'");
  parse_bad("input 3\ndropout 0.5 0.2\n", 2, 13, "unexpected '0.2' after 'dropout'");
  parse_bad("input 3\nlinear 2\nloss mse mean\n", 3, 10, "unexpected 'mean' after 'loss'");
  /* more tokens than the tokenizer keeps: the first extra one is still named */
  parse_bad("input 3\ntanh a b c d e f g h i j\n", 2, 6, "unexpected 'a' after 'tanh'");
}
END_TEST

START_TEST(dropout_probability_out_of_range) {
  parse_bad("input 3\ndropout 1\n", 2, 9,
            "dropout: expected a probability in [0, 1), got '1'");
  parse_bad("input 3\ndropout 1.5\n", 2, 9, "got '1.5'");
  parse_bad("input 3\ndropout -0.1\n", 2, 9, "got '-0.1'");
  parse_bad("input 3\ndropout inf\n", 2, 9, "got 'inf'");
  dp_model *m = model_of("input 3\ndropout 0\ndropout 0.999\n");
  ck_assert(m->layers[0].p == 0.0f);
  ck_assert(m->layers[1].p == 0.999f);
  dp_model_free(m);
}
END_TEST

START_TEST(dropout_probability_not_a_number) {
  parse_bad("input 3\ndropout abc\n", 2, 9,
            "dropout: expected a probability in [0, 1), got 'abc'");
  parse_bad("input 3\ndropout 0.5x\n", 2, 9, "got '0.5x'");
  parse_bad("input 3\ndropout nan\n", 2, 9, "got 'nan'");
  /* hexadecimal, which strtod takes (an outside check, session 23) */
  parse_bad("input 3\ndropout 0x0.8p0\n", 2, 9, "got '0x0.8p0'");
  parse_bad("input 3\ndropout\n", 2, 9, "expected a probability after 'dropout'");
  parse_bad("input 3\ndropout 0.12345678901234567890123456789012345\n", 2, 9,
            "expected a probability in [0, 1)");
}
END_TEST

START_TEST(unknown_loss_is_named) {
  parse_bad("input 3\nlinear 2\nloss l2\n", 3, 6,
            "unknown loss 'l2' (expected mse, l1, smooth_l1, huber, bce_with_logits or "
            "softmax_cross_entropy)");
  parse_bad("input 3\nlinear 2\nloss   cross_entropy\n", 3, 8,
            "unknown loss 'cross_entropy'");
}
END_TEST

START_TEST(missing_loss_kind_points_after_loss) {
  parse_bad("input 3\nlinear 2\nloss\n", 3, 6,
            "expected 'mse', 'l1', 'smooth_l1', 'huber', 'bce_with_logits' or "
            "'softmax_cross_entropy' after 'loss'");
  parse_bad("input 3\nlinear 2\n  loss # none\n", 3, 8, "after 'loss'");
}
END_TEST

START_TEST(a_layer_after_the_loss_is_refused) {
  parse_bad("input 3\nlinear 2\nloss mse\nrelu\n", 4, 1,
            "unexpected 'relu': the loss must be the last line");
  parse_bad("input 3\nlinear 2\nloss mse\n\n# more\n  linear 4\n", 6, 3,
            "unexpected 'linear'");
  parse_bad("input 3\nlinear 2\nloss mse\nloss mse\n", 4, 1,
            "the loss must be the last line");
}
END_TEST

START_TEST(a_loss_without_layers_is_refused_at_its_line) {
  parse_bad("input 3\nloss mse\n", 2, 1, "a loss needs at least one layer");
}
END_TEST

START_TEST(too_many_layers_is_refused_at_the_extra_line) {
  size_t cap = 16 + 6 * (DP_MAX_LAYERS + 2);
  char *t = malloc(cap), *p = t;
  p += sprintf(p, "input 2\n");
  for (int i = 0; i < DP_MAX_LAYERS + 1; i++) p += sprintf(p, "relu\n");
  parse_bad(t, DP_MAX_LAYERS + 2, 1, "too many layers");
  /* exactly DP_MAX_LAYERS is fine */
  p = t + strlen("input 2\n") + 5 * DP_MAX_LAYERS;
  *p = '\0';
  dp_model *m = model_of(t);
  ck_assert_int_eq(dp_model_n_layers(m), DP_MAX_LAYERS);
  dp_model_free(m);
  free(t);
}
END_TEST

START_TEST(empty_text_is_refused) {
  parse_bad("", 1, 1, "empty model: expected 'input N'");
  parse_bad("\n", 1, 1, "empty model");
}
END_TEST

START_TEST(comment_only_text_is_refused) {
  parse_bad("# nothing here\n", 1, 1, "empty model");
  parse_bad("# a\n\n   \t\n# b", 4, 1, "empty model");
}
END_TEST

START_TEST(errors_name_the_source) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse("relu\n", NULL, &m), DP_ERR_PARSE);
  ck_assert_msg(strncmp(dp_last_error(), "<spec>:1:1: ", 12) == 0, "%s", dp_last_error());
  ck_assert_int_eq(dp_model_parse("relu\n", "nets/a.dpm", &m), DP_ERR_PARSE);
  ck_assert_msg(strncmp(dp_last_error(), "nets/a.dpm:1:1: ", 16) == 0, "%s",
                dp_last_error());
}
END_TEST

START_TEST(null_arguments_are_invalid) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_parse("input 3\n", "x", NULL), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_parse(NULL, "x", &m), DP_ERR_INVALID);
  ck_assert_ptr_null(m);
  ck_assert_int_eq(dp_model_load("/nonexistent", NULL), DP_ERR_INVALID);
}
END_TEST

/* ---- accepted forms ------------------------------------------------------------ */

START_TEST(comments_and_blank_lines_are_accepted) {
  dp_model *m = model_of("# header\n\n   \ninput 5   # five features\n  linear 2 # out\n\n"
                         "\t relu#glued comment\nlinear 3#x\nloss mse # end");
  ck_assert_int_eq(dp_model_input_width(m), 5);
  ck_assert_int_eq(dp_model_n_layers(m), 3);
  ck_assert_int_eq(dp_model_layer_kind(m, 1), DP_LAYER_RELU);
  ck_assert_int_eq(dp_model_output_width(m), 3);
  ck_assert_int_eq(dp_model_loss(m), DP_LOSS_MSE);
  dp_model_free(m);
}
END_TEST

START_TEST(crlf_line_ends_are_accepted) {
  dp_model *m = model_of("input 5\r\nlinear 2 nobias\r\n\r\n# c\r\nloss mse\r\n");
  ck_assert_int_eq(dp_model_n_layers(m), 1);
  ck_assert_int_eq(m->layers[0].bias, 0);
  ck_assert_uint_eq(dp_model_n_params(m), 10);
  dp_model_free(m);
  /* and errors on CRLF lines keep their line and column */
  parse_bad("input 5\r\nlinear x\r\n", 2, 8, "got 'x'");
  parse_bad("input 5\r\nlinear\r\n", 2, 8, "expected a width after 'linear'");
}
END_TEST

START_TEST(last_line_without_newline_is_accepted) {
  dp_model *m = model_of("input 5\nlinear 2\nloss softmax_cross_entropy");
  ck_assert_int_eq(dp_model_loss(m), DP_LOSS_SOFTMAX_CE);
  dp_model_free(m);
}
END_TEST

START_TEST(a_model_without_loss_is_accepted) {
  dp_model *m = model_of("input 5\nlinear 2\n");
  ck_assert_int_eq(dp_model_loss(m), DP_LOSS_NONE);
  dp_model_free(m);
  m = model_of("input 5\n"); /* no layers: parses, planning refuses it */
  ck_assert_int_eq(dp_model_n_layers(m), 0);
  ck_assert_int_eq(dp_model_output_width(m), 5);
  dp_model_free(m);
}
END_TEST

/* ---- shapes ------------------------------------------------------------------ */

START_TEST(widths_are_inferred_layer_by_layer) {
  dp_model *m =
      model_of("input 5\nlinear 8\nrelu\nlayernorm\nlinear 3 nobias\ngelu\n"
               "dropout 0.25\ntanh\nsigmoid\nlinear 2\nloss softmax_cross_entropy\n");
  static const struct {
    dp_layer_kind k;
    int in, out;
  } want[] = {{DP_LAYER_LINEAR, 5, 8}, {DP_LAYER_RELU, 8, 8},    {DP_LAYER_LAYERNORM, 8, 8},
              {DP_LAYER_LINEAR, 8, 3}, {DP_LAYER_GELU, 3, 3},    {DP_LAYER_DROPOUT, 3, 3},
              {DP_LAYER_TANH, 3, 3},   {DP_LAYER_SIGMOID, 3, 3}, {DP_LAYER_LINEAR, 3, 2}};
  ck_assert_int_eq(dp_model_n_layers(m), 9);
  for (int i = 0; i < 9; i++) {
    ck_assert_int_eq(dp_model_layer_kind(m, i), want[i].k);
    ck_assert_int_eq(m->layers[i].in, want[i].in);
    ck_assert_int_eq(m->layers[i].out, want[i].out);
  }
  ck_assert_int_eq(dp_model_input_width(m), 5);
  ck_assert_int_eq(dp_model_output_width(m), 2);
  ck_assert_int_eq(dp_model_loss(m), DP_LOSS_SOFTMAX_CE);
  ck_assert(m->layers[5].p == 0.25f);
  ck_assert_int_eq(dp_model_layer_kind(m, 9), DP_LAYER_INPUT); /* out of range */
  ck_assert_int_eq(dp_model_layer_kind(m, -1), DP_LAYER_INPUT);
  dp_model_free(m);
}
END_TEST

START_TEST(n_params_follow_state_dict_order) {
  dp_model *m =
      model_of("input 5\nlinear 8\nrelu\nlayernorm\nlinear 3 nobias\ngelu\n"
               "dropout 0.25\ntanh\nsigmoid\nlinear 2\nloss softmax_cross_entropy\n");
  /* linear 5->8: weight 8*5 + bias 8 = 48 at 0
   * layernorm 8: weight 8 + bias 8 = 16 at 48
   * linear 8->3 nobias: weight 3*8 = 24 at 64
   * linear 3->2: weight 2*3 + bias 2 = 8 at 88; total 96 */
  static const struct {
    size_t off, n;
  } want[] = {{0, 48}, {48, 0}, {48, 16}, {64, 24}, {88, 0},
              {88, 0}, {88, 0}, {88, 0},  {88, 8}};
  for (int i = 0; i < 9; i++) {
    ck_assert_uint_eq(m->layers[i].n_params, want[i].n);
    if (want[i].n) ck_assert_uint_eq(m->layers[i].param_off, want[i].off);
  }
  ck_assert_uint_eq(dp_model_n_params(m), 96);
  dp_model_free(m);
}
END_TEST

START_TEST(layernorm_has_two_n_params) {
  dp_model *m = model_of("input 7\nlayernorm\nlayernorm\n");
  ck_assert_uint_eq(dp_model_n_params(m), 28);
  ck_assert_uint_eq(m->layers[1].param_off, 14);
  dp_model_free(m);
}
END_TEST

START_TEST(nobias_drops_the_bias) {
  dp_model *a = model_of("input 5\nlinear 2\n"),
           *b = model_of("input 5\nlinear 2 nobias\n");
  ck_assert_uint_eq(dp_model_n_params(a), 12);
  ck_assert_uint_eq(dp_model_n_params(b), 10);
  ck_assert_int_eq(a->layers[0].bias, 1);
  ck_assert_int_eq(b->layers[0].bias, 0);
  dp_model_free(a);
  dp_model_free(b);
}
END_TEST

START_TEST(the_seed_model_has_twelve_params) {
  dp_model *m = model_of("input 5\nlinear 2\nloss mse\n");
  ck_assert_uint_eq(dp_model_n_params(m), 12);
  ck_assert_int_eq(dp_model_n_layers(m), 1);
  dp_model_free(m);
}
END_TEST

START_TEST(accessors_tolerate_null) {
  ck_assert_int_eq(dp_model_input_width(NULL), 0);
  ck_assert_int_eq(dp_model_output_width(NULL), 0);
  ck_assert_int_eq(dp_model_n_layers(NULL), 0);
  ck_assert_int_eq(dp_model_loss(NULL), DP_LOSS_NONE);
  ck_assert_uint_eq(dp_model_n_params(NULL), 0);
  ck_assert_int_eq(dp_model_layer_kind(NULL, 0), DP_LAYER_INPUT);
  dp_model_free(NULL);
}
END_TEST

/* ---- format ------------------------------------------------------------------ */

static char *format_alloc(const dp_model *m) {
  size_t n = dp_model_format(m, NULL, 0);
  char *s = malloc(n + 1);
  ck_assert_uint_eq(dp_model_format(m, s, n + 1), n);
  ck_assert_uint_eq(strlen(s), n);
  return s;
}

START_TEST(format_writes_the_canonical_text) {
  dp_model *m = model_of("  input 5 # x\n\nlinear 8 nobias\nrelu\nlayernorm\ndropout 0.5\n"
                         "linear 2\nloss softmax_cross_entropy\n");
  char *s = format_alloc(m);
  ck_assert_str_eq(s, "input 5\nlinear 8 nobias\nrelu\nlayernorm\ndropout 0.5\nlinear 2\n"
                      "loss softmax_cross_entropy\n");
  free(s);
  dp_model_free(m);
}
END_TEST

/* A GPT with nested blocks in dp_model_format's form: each block's layers
 * indented by its depth. */
static const char GPT_NESTED[] = "input tokens 6\n"
                                 "embed 11 8\n"
                                 "residual\n"
                                 "  layernorm\n"
                                 "  linear 24\n"
                                 "  attention 2\n"
                                 "  linear 8\n"
                                 "end\n"
                                 "residual\n"
                                 "  residual\n"
                                 "    gelu\n"
                                 "  end\n"
                                 "  dropout 0.1\n"
                                 "end\n"
                                 "linear 11\n"
                                 "loss softmax_cross_entropy\n";

START_TEST(format_round_trips_through_parse) {
  const char *texts[] = {
      "input 5\nlinear 2\nloss mse\n",
      "input 5\nlinear 2\n",
      "input 3\nrelu\n",
      ("input 64\nlinear 128\ngelu\nlayernorm\ndropout 0.1\nlinear 10 "
       "nobias\ntanh\nsigmoid\n"
       "linear 4\nloss softmax_cross_entropy\n"),
      "input 2147483647\nlinear 1 nobias\n",
      GPT_NESTED,
      GPT_SPEC,
      RESNET_PROJ_SPEC,
      "input tokens 4\nembed 9 6\nlayernorm\nlinear 9 tied\nloss softmax_cross_entropy\n",
      "input tokens 4\nembed 9 6\nlinear 18\nattention 2 dropout 0.15\nlinear 9\n",
  };
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
    dp_model *a = model_of(texts[i]);
    char *s = format_alloc(a);
    dp_model *b = model_of(s);
    assert_same_model(a, b);
    char *s2 = format_alloc(b);
    ck_assert_str_eq(s, s2);
    free(s);
    free(s2);
    dp_model_free(a);
    dp_model_free(b);
  }
}
END_TEST

/* PyTorch's nn.GELU(approximate=...): `gelu approximate none` is the exact
 * form, its own kind, formatted back as such; `gelu approximate tanh` is
 * plain `gelu` (and formats as that: the spelling saved models have). */
START_TEST(gelu_approximate_parses_and_round_trips) {
  dp_model *m = model_of("input 4\ngelu approximate none\ngelu approximate tanh\ngelu\n"
                         "residual\n  gelu approximate none\nend\n");
  static const dp_layer_kind want[] = {DP_LAYER_GELU_ERF, DP_LAYER_GELU,
                                       DP_LAYER_GELU,     DP_LAYER_RESIDUAL,
                                       DP_LAYER_GELU_ERF, DP_LAYER_RESIDUAL_END};
  ck_assert_int_eq(dp_model_n_layers(m), 6);
  for (int i = 0; i < 6; i++) {
    dp_layer_info l;
    ck_assert_int_eq(dp_model_layer(m, i, &l), DP_OK);
    ck_assert_int_eq(l.kind, want[i]);
    ck_assert_int_eq(l.in, 4);
    ck_assert_int_eq(l.out, 4);
    ck_assert_uint_eq(l.n_params, 0);
  }
  char *s = format_alloc(m);
  ck_assert_str_eq(s, "input 4\ngelu approximate none\ngelu\ngelu\nresidual\n"
                      "  gelu approximate none\nend\n");
  dp_model *b = model_of(s);
  assert_same_model(m, b);
  ck_assert_str_eq(dp_layer_kind_name(DP_LAYER_GELU_ERF), "gelu_erf");
  /* the builder's spelling of the same layer */
  dp_model *c = NULL;
  ck_assert_int_eq(dp_model_new(4, &c), DP_OK);
  ck_assert_int_eq(dp_model_add(c, DP_LAYER_GELU_ERF), DP_OK);
  dp_model *d = model_of("input 4\ngelu approximate none\n");
  assert_same_model(c, d);
  free(s);
  dp_model_free(m);
  dp_model_free(b);
  dp_model_free(c);
  dp_model_free(d);
}
END_TEST

START_TEST(gelu_approximate_refusals_name_the_options) {
  parse_bad("input 4\ngelu approximate foo\n", 2, 18,
            "unknown gelu approximation 'foo' (expected none");
  parse_bad("input 4\ngelu approximate foo\n", 2, 18, "or tanh");
  parse_bad("input 4\n  gelu approximate\n", 2, 20,
            "expected 'none' or 'tanh' after 'approximate'");
  parse_bad("input 4\ngelu exact\n", 2, 6,
            "expected 'approximate' or end of line after 'gelu', got 'exact'");
  parse_bad("input 4\ngelu approximate none x\n", 2, 23,
            "unexpected 'x' after 'gelu approximate'");
  parse_bad("input 4\ngelu approximate NONE\n", 2, 18, "'NONE'");
}
END_TEST

/* nn.LayerNorm(eps=...) and nn.BatchNorm(eps=..., momentum=...|None): read,
 * kept (the momentum as the double of its decimal), shown by dp_model_layer,
 * formatted only when not the default (saved specs keep their text) and
 * round-tripped; the builder gives the same model; the plan's hash sees them. */
START_TEST(norm_eps_and_momentum_parse_and_round_trip) {
  dp_model *m = model_of("input 2 4 4\nbatchnorm momentum 0.01 eps 1e-3\nflatten\n"
                         "batchnorm momentum none\nlayernorm eps 1e-6\nlayernorm\n"
                         "batchnorm eps 0.00001 momentum 0.1\n");
  static const float eps[] = {1e-3f, 0.0f, 1e-5f, 1e-6f, 1e-5f, 1e-5f};
  static const float mom[] = {0.01f, 0.0f, DP_BN_MOMENTUM_NONE, 0.0f, 0.0f, 0.1f};
  for (int i = 0; i < 6; i++) {
    dp_layer_info l;
    ck_assert_int_eq(dp_model_layer(m, i, &l), DP_OK);
    ck_assert_msg(l.eps == eps[i] && l.momentum == mom[i], "layer %d: eps %g momentum %g",
                  i, (double)l.eps, (double)l.momentum);
  }
  ck_assert(m->layers[0].momentum == 0.01); /* the decimal's double, not 0.01f's */
  ck_assert(m->layers[2].momentum == DP_BN_CUMULATIVE);
  char *s = format_alloc(m);
  ck_assert_str_eq(s,
                   "input 2 4 4\nbatchnorm eps 0.001 momentum 0.01\nflatten\n"
                   "batchnorm momentum none\nlayernorm eps 1e-06\nlayernorm\nbatchnorm\n");
  dp_model *b = model_of(s);
  assert_same_model(m, b);
  /* the builder's spelling */
  dp_model *c = NULL;
  ck_assert_int_eq(dp_model_new_image(2, 4, 4, &c), DP_OK);
  ck_assert_int_eq(dp_model_add_batchnorm(c, 1e-3f, 0.01f), DP_OK);
  ck_assert_int_eq(dp_model_add(c, DP_LAYER_FLATTEN), DP_OK);
  ck_assert_int_eq(dp_model_add_batchnorm(c, 1e-5f, DP_BN_MOMENTUM_NONE), DP_OK);
  ck_assert_int_eq(dp_model_add_layernorm(c, 1e-6f), DP_OK);
  ck_assert_int_eq(dp_model_add(c, DP_LAYER_LAYERNORM), DP_OK);
  ck_assert_int_eq(dp_model_add(c, DP_LAYER_BATCHNORM), DP_OK);
  assert_same_model(m, c);
  /* refusals change nothing */
  ck_assert_int_eq(dp_model_add_batchnorm(c, 0.0f, 0.1f), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "eps must be in (0, 1]"));
  ck_assert_int_eq(dp_model_add_batchnorm(c, 1e-5f, 1.5f), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "momentum must be in [0, 1]"));
  ck_assert_int_eq(dp_model_add_batchnorm(c, 1e-5f, NAN), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add_layernorm(c, INFINITY), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add_layernorm(NULL, 1e-5f), DP_ERR_INVALID);
  assert_same_model(m, c);
  static const char *const specs[] = {
      "input 3\nlinear 4\nbatchnorm\nlinear 2\nloss mse\n",
      "input 3\nlinear 4\nbatchnorm momentum 0.2\nlinear 2\nloss mse\n",
      "input 3\nlinear 4\nbatchnorm momentum none\nlinear 2\nloss mse\n",
      "input 3\nlinear 4\nbatchnorm eps 1e-4\nlinear 2\nloss mse\n",
      "input 3\nlinear 4\nlayernorm\nlinear 2\nloss mse\n",
      "input 3\nlinear 4\nlayernorm eps 1e-4\nlinear 2\nloss mse\n",
      NULL};
  hashes_differ(specs);
  free(s);
  dp_model_free(m);
  dp_model_free(b);
  dp_model_free(c);
}
END_TEST

/* nn.SiLU and nn.LeakyReLU(negative_slope): `silu`, `leaky_relu [S]` (0.01
 * unsaid, any finite S, -0 as 0), the builder's spelling, the slope in
 * dp_layer_info and the plan's hash, refusals. */
/* batchnorm on a sequence: BatchNorm1d over each position's D features (2 D
 * parameters, D running means and variances), the sequence's shape kept. */
START_TEST(batchnorm_on_a_sequence_parses) {
  dp_model *m = model_of("input tokens 4\nembed 5 6\nbatchnorm momentum 0.2\nlinear 5\n"
                         "loss softmax_cross_entropy\n");
  dp_layer_info l;
  ck_assert_int_eq(dp_model_layer(m, 1, &l), DP_OK);
  ck_assert_int_eq(l.kind, DP_LAYER_BATCHNORM);
  ck_assert_int_eq(l.channels, 6);
  ck_assert_int_eq(l.positions, 4);
  ck_assert_int_eq(l.in, 24);
  ck_assert_int_eq(l.out, 24);
  ck_assert_uint_eq(l.n_params, 12);
  ck_assert_uint_eq(dp_model_n_params(m), 5 * 6 + 4 * 6 + 12 + 6 * 5 + 5);
  dp_tensor_info t;
  ck_assert_int_eq(dp_model_tensor(m, 2, &t), DP_OK);
  ck_assert_str_eq(t.name, "1.weight");
  ck_assert_int_eq(t.ndim, 1);
  ck_assert_int_eq(t.dims[0], 6);
  char *s = format_alloc(m);
  ck_assert_str_eq(s, "input tokens 4\nembed 5 6\nbatchnorm momentum 0.2\nlinear 5\n"
                      "loss softmax_cross_entropy\n");
  free(s);
  dp_model_free(m);
}
END_TEST

START_TEST(silu_and_leaky_relu_parse_and_round_trip) {
  dp_model *m = model_of("input 4\nsilu\nleaky_relu\nleaky_relu 0.2\nleaky_relu 0\n"
                         "leaky_relu -1.5\nleaky_relu -0\n");
  static const dp_layer_kind kind[] = {DP_LAYER_SILU,       DP_LAYER_LEAKY_RELU,
                                       DP_LAYER_LEAKY_RELU, DP_LAYER_LEAKY_RELU,
                                       DP_LAYER_LEAKY_RELU, DP_LAYER_LEAKY_RELU};
  static const float slope[] = {0.0f, 0.01f, 0.2f, 0.0f, -1.5f, 0.0f};
  for (int i = 0; i < 6; i++) {
    dp_layer_info l;
    ck_assert_int_eq(dp_model_layer(m, i, &l), DP_OK);
    ck_assert_int_eq(l.kind, kind[i]);
    ck_assert_msg(l.negative_slope == slope[i], "layer %d: slope %g", i,
                  (double)l.negative_slope);
    ck_assert_uint_eq(l.n_params, 0);
  }
  ck_assert_str_eq(dp_layer_kind_name(DP_LAYER_SILU), "silu");
  ck_assert_str_eq(dp_layer_kind_name(DP_LAYER_LEAKY_RELU), "leaky_relu");
  char *s = format_alloc(m);
  ck_assert_str_eq(s, "input 4\nsilu\nleaky_relu\nleaky_relu 0.2\nleaky_relu 0\n"
                      "leaky_relu -1.5\nleaky_relu 0\n");
  dp_model *b = model_of(s);
  assert_same_model(m, b);
  for (int i = 0; i < 6; i++) ck_assert(m->layers[i].slope == b->layers[i].slope);
  ck_assert(!signbit(m->layers[5].slope)); /* one spelling of 0 */
  dp_model *c = NULL;
  ck_assert_int_eq(dp_model_new(4, &c), DP_OK);
  ck_assert_int_eq(dp_model_add(c, DP_LAYER_SILU), DP_OK);
  ck_assert_int_eq(dp_model_add(c, DP_LAYER_LEAKY_RELU), DP_OK);
  ck_assert_int_eq(dp_model_add_leaky_relu(c, 0.2f), DP_OK);
  ck_assert_int_eq(dp_model_add_leaky_relu(c, 0.0f), DP_OK);
  ck_assert_int_eq(dp_model_add_leaky_relu(c, -1.5f), DP_OK);
  ck_assert_int_eq(dp_model_add_leaky_relu(c, -0.0f), DP_OK);
  ck_assert(!signbit(c->layers[5].slope));
  assert_same_model(m, c);
  for (int i = 0; i < 6; i++) ck_assert(m->layers[i].slope == c->layers[i].slope);
  ck_assert_int_eq(dp_model_add_leaky_relu(c, INFINITY), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "negative_slope must be finite"));
  ck_assert_int_eq(dp_model_add_leaky_relu(c, -INFINITY), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add_leaky_relu(c, NAN), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_n_layers(c), 6);
  static const char *const specs[] = {
      "input 3\nlinear 4\nleaky_relu\nlinear 2\nloss mse\n",
      "input 3\nlinear 4\nleaky_relu 0.3\nlinear 2\nloss mse\n",
      "input 3\nlinear 4\nleaky_relu -0.3\nlinear 2\nloss mse\n",
      "input 3\nlinear 4\nsilu\nlinear 2\nloss mse\n", NULL};
  hashes_differ(specs);
  parse_bad("input 4\nleaky_relu inf\n", 2, 12,
            "leaky_relu: negative_slope: expected a finite number, got 'inf'");
  parse_bad("input 4\nleaky_relu -1e39\n", 2, 12, "got '-1e39'");
  parse_bad("input 4\nleaky_relu 0.1 0.2\n", 2, 16, "unexpected '0.2' after 'leaky_relu'");
  parse_bad("input 4\nsilu 1\n", 2, 6, "unexpected '1' after 'silu'");
  free(s);
  dp_model_free(m);
  dp_model_free(b);
  dp_model_free(c);
}
END_TEST

/* nn.L1Loss, nn.SmoothL1Loss(beta), nn.HuberLoss(delta): `loss l1`, `loss
 * smooth_l1 [beta B]`, `loss huber [delta D]` (1, the default, unsaid); float
 * targets of the output's width; the parameter in the plan's hash; refusals;
 * -0 slopes and momenta read as 0 (one spelling). */
START_TEST(element_losses_parse_and_round_trip) {
  static const struct {
    const char *spec, *formatted;
    dp_loss_kind k;
    float param;
  } cases[] = {
      {"input 3\nlinear 2\nloss l1\n", "input 3\nlinear 2\nloss l1\n", DP_LOSS_L1, 0.0f},
      {"input 3\nlinear 2\nloss smooth_l1\n", "input 3\nlinear 2\nloss smooth_l1\n",
       DP_LOSS_SMOOTH_L1, 1.0f},
      {"input 3\nlinear 2\nloss smooth_l1 beta 0.25\n",
       "input 3\nlinear 2\nloss smooth_l1 beta 0.25\n", DP_LOSS_SMOOTH_L1, 0.25f},
      {"input 3\nlinear 2\nloss huber delta 2e0\n",
       "input 3\nlinear 2\nloss huber delta 2\n", DP_LOSS_HUBER, 2.0f},
      {"input 3\nlinear 2\nloss huber delta 1\n", "input 3\nlinear 2\nloss huber\n",
       DP_LOSS_HUBER, 1.0f},
      {"input 3\nlinear 2\nloss bce_with_logits\n",
       "input 3\nlinear 2\nloss bce_with_logits\n", DP_LOSS_BCE_LOGITS, 0.0f},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    dp_model *m = model_of(cases[i].spec);
    ck_assert_int_eq(dp_model_loss(m), cases[i].k);
    ck_assert(dp_model_loss_param(m) == cases[i].param);
    ck_assert_int_eq(dp_model_target_width(m), 2);
    char *s = format_alloc(m);
    ck_assert_str_eq(s, cases[i].formatted);
    dp_model *b = model_of(s);
    ck_assert(dp_model_loss(b) == cases[i].k && dp_model_loss_param(b) == cases[i].param);
    free(s);
    dp_model_free(b);
    dp_model_free(m);
  }
  ck_assert_str_eq(dp_loss_name(DP_LOSS_HUBER), "huber");
  dp_model *d = model_of("input 3\nlinear 2\nloss huber\n");
  dp_model *e = model_of("input 3\nlinear 2\nloss huber delta 0.5\n");
  ck_assert_int_eq(dp_model_set_loss_param(d, -1.0f), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_set_loss_param(d, INFINITY), DP_ERR_INVALID);
  ck_assert(dp_model_loss_param(d) == 1.0f);
  static const char *const specs[] = {"input 3\nlinear 2\nloss huber\n",
                                      "input 3\nlinear 2\nloss huber delta 0.5\n",
                                      "input 3\nlinear 2\nloss smooth_l1\n",
                                      "input 3\nlinear 2\nloss smooth_l1 beta 0.5\n",
                                      "input 3\nlinear 2\nloss l1\n",
                                      "input 3\nlinear 2\nloss bce_with_logits\n",
                                      NULL};
  hashes_differ(specs);
  dp_model *f = model_of("input 3\nlinear 2\nloss mse\n");
  ck_assert_int_eq(dp_model_set_loss_param(f, 0.5f), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "smooth_l1's beta or huber's delta"));
  dp_model_free(d), dp_model_free(e), dp_model_free(f);
  parse_bad("input 3\nlinear 2\nloss huber beta 0.5\n", 3, 12,
            "loss huber: expected 'delta V' or end of line, got 'beta'");
  parse_bad("input 3\nlinear 2\nloss smooth_l1 beta\n", 3, 21,
            "loss smooth_l1: expected a number > 0 after 'beta'");
  parse_bad("input 3\nlinear 2\nloss smooth_l1 beta 0\n", 3, 21,
            "loss smooth_l1: beta: expected a number > 0, got '0'");
  parse_bad("input 3\nlinear 2\nloss l1 beta 1\n", 3, 9, "unexpected 'beta' after 'loss'");
  parse_bad("input 3\nlinear 2\nloss huber delta 1 x\n", 3, 20,
            "unexpected 'x' after 'loss'");
  /* -0 is 0 */
  dp_model *z = model_of("input 3\nleaky_relu -0\nbatchnorm momentum -0\n");
  dp_model *y = model_of("input 3\nleaky_relu 0\nbatchnorm momentum 0\n");
  char *zs = format_alloc(z), *ys = format_alloc(y);
  ck_assert_str_eq(zs, ys);
  free(zs), free(ys);
  dp_model_free(z), dp_model_free(y);
}
END_TEST

START_TEST(norm_option_refusals_name_line_and_column) {
  parse_bad("input 4\nbatchnorm eps 0\n", 2, 15,
            "batchnorm: eps: expected a number in (0, 1]");
  parse_bad("input 4\nbatchnorm eps -1e-5\n", 2, 15, "got '-1e-5'");
  parse_bad("input 4\nbatchnorm eps nan\n", 2, 15, "got 'nan'");
  parse_bad("input 4\nbatchnorm eps 0x1p-10\n", 2, 15, "got '0x1p-10'");
  parse_bad("input 4\nbatchnorm eps 1e-50\n", 2, 15, "got '1e-50'"); /* 0 as a float */
  parse_bad("input 4\nbatchnorm momentum 1.5\n", 2, 20,
            "batchnorm: momentum: expected a number in [0, 1] or 'none' (PyTorch's "
            "momentum=None), got '1.5'");
  /* PyTorch's spelling of momentum=None says how libdp's spec writes it */
  parse_bad("input 4\nbatchnorm momentum None\n", 2, 20,
            "batchnorm: momentum: expected a number in [0, 1] or 'none' (PyTorch's "
            "momentum=None), got 'None'");
  parse_bad("input 4\nbatchnorm momentum=None\n", 2, 11,
            "batchnorm: expected 'eps E' or 'momentum M|none' or end of line, got "
            "'momentum=None' (an option is two words: 'eps 1e-3', not 'eps=1e-3')");
  parse_bad("input 4\nlayernorm eps=1e-3\n", 2, 11,
            "layernorm: expected 'eps E' or end of line, got 'eps=1e-3' (an option is two "
            "words: 'eps 1e-3', not 'eps=1e-3')");
  parse_bad("input 4\nbatchnorm momentum\n", 2, 20,
            "batchnorm: expected a number in [0, 1] or 'none' after 'momentum'");
  parse_bad("input 4\nbatchnorm eps\n", 2, 15, "expected a number in (0, 1] after 'eps'");
  parse_bad("input 4\nbatchnorm eps 1e-3 eps 1e-3\n", 2, 20, "'eps' given twice");
  parse_bad(
      "input 4\nbatchnorm affine\n", 2, 11,
      "batchnorm: expected 'eps E' or 'momentum M|none' or end of line, got 'affine'");
  parse_bad("input 4\nlayernorm momentum 0.1\n", 2, 11,
            "layernorm: expected 'eps E' or end of line, got 'momentum'");
  parse_bad("input 4\n  layernorm eps 2\n", 2, 17, "layernorm: eps: expected");
}
END_TEST

/* `linear V tied`: no parameters of its own, its weight the token table (the layer
 * info and state_dict say so: one tensor named after the head, at the table). */
START_TEST(tied_head_shares_the_token_table) {
  dp_model *m = model_of("input tokens 4\nembed 9 6\nlayernorm\nlinear 9 tied\n"
                         "loss softmax_cross_entropy\n");
  dp_layer_info e, h;
  ck_assert_int_eq(dp_model_layer(m, 0, &e), DP_OK);
  ck_assert_int_eq(dp_model_layer(m, 2, &h), DP_OK);
  ck_assert_int_eq(h.tied, 1);
  ck_assert_int_eq(e.tied, 1);
  ck_assert_uint_eq(h.n_params, 0);
  ck_assert_uint_eq(h.param_offset, e.param_offset);
  ck_assert_uint_eq(dp_model_n_params(m), 9 * 6 + 4 * 6 + 12);
  ck_assert_int_eq(dp_model_n_tensors(m), 5); /* tok, pos, ln weight, ln bias, head */
  dp_tensor_info t;
  ck_assert_int_eq(dp_model_tensor(m, 4, &t), DP_OK);
  ck_assert_str_eq(t.name, "2.weight");
  ck_assert_int_eq(t.dims[0], 9);
  ck_assert_int_eq(t.dims[1], 6);
  ck_assert_uint_eq(t.offset, e.param_offset);
  ck_assert_int_eq(dp_model_output_width(m), 4 * 9);
  dp_model_free(m);
}
END_TEST

/* A GPT with nested blocks: the format indents each block's layers by its
 * depth, and parsing the text gives the same model and the same text. */
START_TEST(format_round_trips_a_gpt_with_indented_blocks) {
  dp_model *a = model_of(GPT_NESTED);
  char *s = format_alloc(a);
  ck_assert_str_eq(s, GPT_NESTED); /* and format_round_trips_through_parse parses it */
  ck_assert_int_eq(dp_model_positions(a), 6);
  ck_assert_int_eq(dp_model_input_width(a), 6);
  ck_assert_int_eq(dp_model_output_width(a), 6 * 11);
  ck_assert_int_eq(dp_model_target_width(a), 6);
  free(s);
  dp_model_free(a);
}
END_TEST

START_TEST(format_round_trips_any_dropout_probability) {
  /* A probability that six significant digits cannot carry must survive
   * format -> parse bit for bit. */
  const float ps[] = {1.0f / 3.0f, 0.1f, 0.123456789f, 1e-7f, 0.99999994f, 0.3f, 0.0f};
  for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) {
    dp_model *a = NULL;
    ck_assert_int_eq(dp_model_new(4, &a), DP_OK);
    ck_assert_int_eq(dp_model_add_dropout(a, ps[i]), DP_OK);
    char *s = format_alloc(a);
    dp_model *b = model_of(s);
    ck_assert_msg(b->layers[0].p == ps[i], "p %.9g formatted as '%s' parses to %.9g",
                  (double)ps[i], s, (double)b->layers[0].p);
    free(s);
    dp_model_free(a);
    dp_model_free(b);
  }
}
END_TEST

START_TEST(format_short_dropout_probabilities_stay_short) {
  dp_model *a = NULL;
  ck_assert_int_eq(dp_model_new(4, &a), DP_OK);
  ck_assert_int_eq(dp_model_add_dropout(a, 0.1f), DP_OK);
  ck_assert_int_eq(dp_model_add_dropout(a, 0.25f), DP_OK);
  char *s = format_alloc(a);
  ck_assert_str_eq(s, "input 4\ndropout 0.1\ndropout 0.25\n");
  free(s);
  dp_model_free(a);
}
END_TEST

START_TEST(format_truncates_and_reports_the_needed_length) {
  dp_model *m = model_of("input 5\nlinear 2\nloss mse\n");
  const char *full = "input 5\nlinear 2\nloss mse\n";
  ck_assert_uint_eq(dp_model_format(m, NULL, 0), strlen(full));
  char buf[10];
  memset(buf, 'Z', sizeof buf);
  ck_assert_uint_eq(dp_model_format(m, buf, sizeof buf), strlen(full));
  ck_assert_str_eq(buf, "input 5\nl"); /* NUL-terminated within cap */
  char one[1] = {'Z'};
  ck_assert_uint_eq(dp_model_format(m, one, 1), strlen(full));
  ck_assert_int_eq(one[0], '\0');
  ck_assert_uint_eq(dp_model_format(NULL, buf, sizeof buf), 0);
  ck_assert_str_eq(buf, "");
  dp_model_free(m);
}
END_TEST

/* ---- load ------------------------------------------------------------------ */

static void write_file(const char *path, const char *data, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  fclose(f);
}

START_TEST(load_of_a_missing_file_is_an_io_error) {
  dp_model *m = (dp_model *)(uintptr_t)1;
  ck_assert_int_eq(dp_model_load("/nonexistent/dir/model.dpm", &m), DP_ERR_IO);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(dp_last_error(), "/nonexistent/dir/model.dpm") != NULL, "%s",
                dp_last_error());
}
END_TEST

START_TEST(load_of_a_directory_is_an_io_error) {
  dp_model *m = (dp_model *)(uintptr_t)1;
  ck_assert_int_eq(dp_model_load("/tmp", &m), DP_ERR_IO);
  ck_assert_ptr_null(m);
  /* issue 12: it said only "read error" */
  ck_assert_msg(strstr(dp_last_error(), "/tmp: is a directory, not a model spec") != NULL,
                "%s", dp_last_error());
}
END_TEST

/* Issue 12: a FIFO with no writer blocked dp_model_load for ever. It is
 * refused at once as not a regular file (the alarm turns a regression into a
 * failure instead of a hang). */
START_TEST(load_of_a_fifo_without_writer_does_not_block) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/dp_test_spec_fifo_%ld", (long)getpid());
  unlink(path);
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  alarm(10);
  dp_model *m = (dp_model *)(uintptr_t)1;
  dp_status s = dp_model_load(path, &m);
  alarm(0);
  unlink(path);
  ck_assert_int_eq(s, DP_ERR_IO);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(dp_last_error(), "not a regular file (a FIFO)"), "%s",
                dp_last_error());
  /* a character device is not a spec either */
  ck_assert_int_eq(dp_model_load("/dev/null", &m), DP_ERR_IO);
  ck_assert_msg(
      strstr(dp_last_error(), "/dev/null: not a regular file (a character device)"), "%s",
      dp_last_error());
}
END_TEST

START_TEST(load_of_a_null_path_is_invalid) {
  dp_model *m = (dp_model *)(uintptr_t)1;
  ck_assert_int_eq(dp_model_load(NULL, &m), DP_ERR_INVALID);
  ck_assert_ptr_null(m);
}
END_TEST

START_TEST(load_reads_a_file_and_names_it_in_errors) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/dp_test_spec_%ld.dpm", (long)getpid());
  const char *good = "# seed\ninput 5\nlinear 2\nloss mse\n";
  write_file(path, good, strlen(good));
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_load(path, &m), DP_OK);
  ck_assert_uint_eq(dp_model_n_params(m), 12);
  dp_model_free(m);

  const char *bad = "input 5\n\nlinar 2\n";
  write_file(path, bad, strlen(bad));
  ck_assert_int_eq(dp_model_load(path, &m), DP_ERR_PARSE);
  char prefix[96];
  snprintf(prefix, sizeof prefix, "%s:3:1: unknown layer 'linar'", path);
  ck_assert_msg(strncmp(dp_last_error(), prefix, strlen(prefix)) == 0, "%s",
                dp_last_error());

  const char nul[] = "input 5\n\0linear 2\n";
  write_file(path, nul, sizeof nul - 1);
  ck_assert_int_eq(dp_model_load(path, &m), DP_ERR_PARSE);
  ck_assert_ptr_null(m);
  /* issue 12: the NUL byte has a line and column, like every spec error */
  snprintf(prefix, sizeof prefix, "%s:2:1: NUL byte", path);
  ck_assert_msg(strncmp(dp_last_error(), prefix, strlen(prefix)) == 0, "%s",
                dp_last_error());
  const char nul2[] = "input 5\nlinear 2\nre\0lu\n";
  write_file(path, nul2, sizeof nul2 - 1);
  ck_assert_int_eq(dp_model_load(path, &m), DP_ERR_PARSE);
  snprintf(prefix, sizeof prefix, "%s:3:3: NUL byte", path);
  ck_assert_msg(strncmp(dp_last_error(), prefix, strlen(prefix)) == 0, "%s",
                dp_last_error());
  unlink(path);
}
END_TEST

START_TEST(load_reads_files_larger_than_its_first_buffer) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/dp_test_spec_big_%ld.dpm", (long)getpid());
  /* 20000 bytes of comments, then the model: several buffer growths */
  size_t n = 20000;
  char *t = malloc(n + 64);
  for (size_t i = 0; i < n; i++) t[i] = (i % 50 == 49) ? '\n' : (i % 50 == 0 ? '#' : 'c');
  strcpy(t + n, "\ninput 5\nlinear 2\nloss mse\n");
  write_file(path, t, strlen(t));
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_load(path, &m), DP_OK);
  ck_assert_uint_eq(dp_model_n_params(m), 12);
  dp_model_free(m);
  free(t);
  unlink(path);
}
END_TEST

/* ---- builder ------------------------------------------------------------------ */

START_TEST(builder_matches_the_parser) {
  dp_model *a = NULL;
  ck_assert_int_eq(dp_model_new(5, &a), DP_OK);
  ck_assert_int_eq(dp_model_add_linear(a, 8, 1), DP_OK);
  ck_assert_int_eq(dp_model_add(a, DP_LAYER_RELU), DP_OK);
  ck_assert_int_eq(dp_model_add(a, DP_LAYER_LAYERNORM), DP_OK);
  ck_assert_int_eq(dp_model_add_dropout(a, 0.5f), DP_OK);
  ck_assert_int_eq(dp_model_add_linear(a, 2, 0), DP_OK);
  ck_assert_int_eq(dp_model_set_loss(a, DP_LOSS_MSE), DP_OK);
  dp_model *b =
      model_of("input 5\nlinear 8\nrelu\nlayernorm\ndropout 0.5\nlinear 2 nobias\n"
               "loss mse\n");
  assert_same_model(a, b);
  dp_model_free(a);
  dp_model_free(b);
}
END_TEST

START_TEST(builder_refuses_bad_widths) {
  dp_model *m = (dp_model *)(uintptr_t)1;
  ck_assert_int_eq(dp_model_new(0, &m), DP_ERR_INVALID);
  ck_assert_ptr_null(m);
  ck_assert_int_eq(dp_model_new(-4, &m), DP_ERR_INVALID);
  ck_assert_ptr_null(m);
  ck_assert_int_eq(dp_model_new(3, NULL), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_new(3, &m), DP_OK);
  ck_assert_int_eq(dp_model_add_linear(m, 0, 1), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add_linear(m, -7, 1), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_last_error(), "-7") != NULL, "%s", dp_last_error());
  ck_assert_int_eq(dp_model_n_layers(m), 0); /* nothing was added */
  ck_assert_uint_eq(dp_model_n_params(m), 0);
  dp_model_free(m);
}
END_TEST

START_TEST(builder_refuses_layers_after_the_loss) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_new(3, &m), DP_OK);
  ck_assert_int_eq(dp_model_add_linear(m, 2, 1), DP_OK);
  ck_assert_int_eq(dp_model_set_loss(m, DP_LOSS_MSE), DP_OK);
  ck_assert_int_eq(dp_model_add_linear(m, 2, 1), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add(m, DP_LAYER_RELU), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add_dropout(m, 0.5f), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_set_loss(m, DP_LOSS_SOFTMAX_CE), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_n_layers(m), 1);
  ck_assert_uint_eq(dp_model_n_params(m), 8);
  ck_assert_int_eq(dp_model_loss(m), DP_LOSS_MSE);
  dp_model_free(m);
}
END_TEST

START_TEST(builder_refuses_bad_kinds_and_probabilities) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_new(3, &m), DP_OK);
  ck_assert_int_eq(dp_model_add(m, DP_LAYER_LINEAR), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add(m, DP_LAYER_DROPOUT), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add(m, DP_LAYER_INPUT), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add(m, (dp_layer_kind)99), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add_dropout(m, 1.0f), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add_dropout(m, -0.01f), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add_dropout(m, NAN), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_set_loss(m, DP_LOSS_MSE), DP_ERR_INVALID); /* no layers yet */
  ck_assert_int_eq(dp_model_add(m, DP_LAYER_TANH), DP_OK);
  ck_assert_int_eq(dp_model_set_loss(m, DP_LOSS_NONE), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_set_loss(m, (dp_loss_kind)7), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_n_layers(m), 1);
  ck_assert_int_eq(dp_model_add_linear(NULL, 2, 1), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add(NULL, DP_LAYER_RELU), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add_dropout(NULL, 0.1f), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_set_loss(NULL, DP_LOSS_MSE), DP_ERR_INVALID);
  dp_model_free(m);
}
END_TEST

START_TEST(builder_refuses_too_many_layers) {
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_new(3, &m), DP_OK);
  for (int i = 0; i < DP_MAX_LAYERS; i++)
    ck_assert_int_eq(dp_model_add(m, DP_LAYER_RELU), DP_OK);
  ck_assert_int_eq(dp_model_add(m, DP_LAYER_RELU), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_n_layers(m), DP_MAX_LAYERS);
  dp_model_free(m);
}
END_TEST

/* ---- absurd dimensions --------------------------------------------------------- */

static void plan_overflows(const dp_model *m, const dp_config *c) {
  dp_plan *p = (dp_plan *)(uintptr_t)1;
  dp_status s = dp_plan_create(m, c, &p);
  ck_assert_msg(s == DP_ERR_OVERFLOW, "status %s (%s), want overflow", dp_status_name(s),
                dp_last_error());
  ck_assert_ptr_null(p);
  ck_assert_msg(strstr(dp_last_error(), "overflow") != NULL, "%s", dp_last_error());
}

/* ---- image layers (conv2d, pools, flatten) ---------------------------------------- */

static dp_model *parse_ok(const char *text) {
  dp_model *m = NULL;
  ck_assert_msg(dp_model_parse(text, "m.dpm", &m) == DP_OK, "'%s': %s", text,
                dp_last_error());
  return m;
}

START_TEST(image_layers_infer_shapes_and_params) {
  dp_model *m = parse_ok("input 3 9 7\n"
                         "conv2d 4 3 stride 2 padding 1\n" /* 4 x 5 x 4 */
                         "relu\n"
                         "maxpool2d 2 stride 1\n" /* 4 x 4 x 3 */
                         "conv2d 5 2 nobias\n"    /* 5 x 3 x 2 */
                         "avgpool2d 2\n"          /* 5 x 1 x 1 */
                         "flatten\n"
                         "linear 6\n"
                         "loss softmax_cross_entropy\n");
  ck_assert_int_eq(dp_model_input_width(m), 3 * 9 * 7);
  static const struct {
    int c, h, w, out;
    size_t params;
  } want[] = {{4, 5, 4, 80, 4 * 3 * 3 * 3 + 4}, {4, 5, 4, 80, 0}, {4, 4, 3, 48, 0},
              {5, 3, 2, 30, 5 * 4 * 2 * 2},     {5, 1, 1, 5, 0},  {5, 0, 0, 5, 0},
              {6, 0, 0, 6, 6 * 5 + 6}};
  ck_assert_int_eq(dp_model_n_layers(m), 7);
  for (int i = 0; i < 7; i++) {
    dp_layer_info li;
    ck_assert_int_eq(dp_model_layer(m, i, &li), DP_OK);
    ck_assert_msg(li.channels == want[i].c && li.height == want[i].h &&
                      li.width == want[i].w && li.out == want[i].out &&
                      li.n_params == want[i].params,
                  "layer %d: %d x %d x %d (%d), %zu params", i, li.channels, li.height,
                  li.width, li.out, li.n_params);
  }
  /* state_dict tensors: 0.weight (4, 3, 3, 3), 0.bias, 3.weight (5, 4, 2,
   * 2), 6.weight, 6.bias */
  ck_assert_int_eq(dp_model_n_tensors(m), 5);
  dp_tensor_info t;
  ck_assert_int_eq(dp_model_tensor(m, 0, &t), DP_OK);
  ck_assert_msg(!strcmp(t.name, "0.weight") && t.ndim == 4 && t.dims[0] == 4 &&
                    t.dims[1] == 3 && t.dims[2] == 3 && t.dims[3] == 3 && t.numel == 108,
                "%s ndim %d", t.name, t.ndim);
  ck_assert_int_eq(dp_model_tensor(m, 2, &t), DP_OK);
  ck_assert_msg(!strcmp(t.name, "3.weight") && t.ndim == 4 && t.offset == 112, "%s %zu",
                t.name, t.offset);
  ck_assert_int_eq(dp_model_tensor(m, 3, &t), DP_OK);
  ck_assert_msg(!strcmp(t.name, "6.weight") && t.ndim == 2 && t.dims[1] == 5, "%s", t.name);
  dp_model_free(m);
}
END_TEST

START_TEST(image_layers_format_round_trips) {
  const char *text = "input 2 11 11\n"
                     "conv2d 3 5 stride 3 padding 2\n"
                     "sigmoid\n"
                     "maxpool2d 2\n"
                     "conv2d 4 1 nobias\n"
                     "avgpool2d 1 stride 2\n"
                     "flatten\n"
                     "linear 4\n"
                     "loss mse\n";
  dp_model *m = parse_ok(text), *back = NULL;
  char buf[512];
  dp_model_format(m, buf, sizeof buf);
  ck_assert_str_eq(buf, text);
  ck_assert_int_eq(dp_model_parse(buf, "again", &back), DP_OK);
  assert_same_model(m, back);
  dp_model_free(back);
  dp_model_free(m);
  /* options in any order, defaults spelt out or not */
  m = parse_ok("input 1 6 6\nconv2d 2 3 nobias padding 0 stride 1\nmaxpool2d 3 stride 3\n");
  dp_model_format(m, buf, sizeof buf);
  ck_assert_str_eq(buf, "input 1 6 6\nconv2d 2 3 nobias\nmaxpool2d 3\n");
  dp_model_free(m);
  /* padding 00 is padding 0, as width 008 is 8 (an outside check, session 23: it
   * was "out of range (1..)") */
  m = parse_ok("input 1 6 6\nconv2d 2 3 padding 00\n");
  dp_model_format(m, buf, sizeof buf);
  ck_assert_str_eq(buf, "input 1 6 6\nconv2d 2 3\n");
  dp_model_free(m);
}
END_TEST

START_TEST(image_layer_errors_name_line_and_column) {
  parse_bad("input 1 8\n", 1, 9, "input C H W");
  parse_bad("input 1 8 8 8\n", 1, 13, "unexpected '8'");
  parse_bad("input 1 8 0\n", 1, 11, "out of range");
  parse_bad("input 1 8 8\nconv2d\n", 2, 8, "output channels");
  parse_bad("input 1 8 8\nconv2d 4\n", 2, 10, "kernel size");
  parse_bad("input 1 8 8\nconv2d 4 3 strides 2\n", 2, 12, "'stride S'");
  parse_bad("input 1 8 8\nconv2d 4 3 stride\n", 2, 19, "a number after 'stride'");
  parse_bad("input 1 8 8\nconv2d 4 3 stride 2 stride 1\n", 2, 21, "given twice");
  parse_bad("input 1 8 8\nconv2d 4 3 stride -1\n", 2, 19, "positive integer");
  parse_bad("input 1 8 8\nconv2d 4 9\n", 2, 1, "does not fit the 8 x 8 input");
  parse_bad("input 1 8 8\nmaxpool2d 2 nobias\n", 2, 13, "'stride S' or 'padding P'");
  parse_bad("input 1 2 2\navgpool2d 3\n", 2, 1, "does not fit the 2 x 2 input");
  /* shapes: image layers need an image, linear and layernorm a flat input */
  parse_bad("input 64\nconv2d 4 3\n", 2, 1, "needs an image input");
  parse_bad("input 64\nmaxpool2d 2\n", 2, 1, "needs an image input");
  parse_bad("input 1 8 8\nlinear 10\n", 2, 1, "add flatten first");
  parse_bad("input 1 8 8\nconv2d 2 3\nrelu\nlayernorm\n", 4, 1, "add flatten first");
  parse_bad("input 1 8 8\nflatten\nconv2d 2 3\n", 3, 1, "needs an image input");
  parse_bad("input 1 8 8\nconv2d 4 3 stride 2 padding 1 nobias x\n", 2, 38, "got 'x'");
}
END_TEST

/* Sequence errors name the line and column of the layer at fault (an
 * unclosed residual: its own line). */
START_TEST(sequence_errors_name_line_and_column) {
  static const struct {
    const char *text;
    int line, col;
    const char *needle;
  } bad[] = {
      {"input tokens 4\nlinear 3\n", 2, 1, "must be followed by 'embed V D'"},
      {"input tokens 4\nrelu\nembed 5 6\n", 2, 1, "must be followed by 'embed V D'"},
      {"input 4\nembed 5 6\n", 2, 1, "embed must come right after 'input tokens T'"},
      {"input tokens 4\nembed 5 6\nlinear 6\nembed 5 6\n", 4, 1,
       "embed must come right after"},
      {"input tokens 4\nembed 5 6\nlinear 16\nattention 2\n", 4, 1, "3 D wide"},
      {"input tokens 4\nembed 5 6\nlinear 15\nattention 2\n", 4, 1,
       "divisible by the heads"},
      {"input tokens 4\nembed 5 6\nlinear 18\nattention 4\n", 4, 1,
       "divisible by the heads"},
      {"input tokens 4\nembed 5 6\nlinear 18\nattention 0\n", 4, 11, "out of range"},
      {"input tokens 4\nembed 5 6\nend\n", 3, 1, "'end' without a 'residual'"},
      {"input tokens 4\nembed 5 6\nresidual\nend\n", 4, 1, "is empty"},
      {"input tokens 4\nembed 5 6\nresidual\nlinear 7\nend\n", 5, 1,
       "output (4 x 7 (T x D) per row) must have the shape of its input (4 x 6 (T x D),"},
      /* the same size, another shape: said in shapes (session 24) */
      {"input 1 4 4\nresidual\nflatten\nend\n", 4, 1,
       "output (16 floats, flat per row) must have the shape of its input (1 x 4 x 4 (C x "
       "H x W), at layer 0)"},
      {"input tokens 4\nembed 5 6\nresidual\nlinear 6\n", 3, 1, "has no 'end'"},
      {"input tokens 4\nembed 5 6\n# c\nresidual\nresidual\nrelu\nend\nrelu\n", 4, 1,
       "has no 'end'"},
      {"input tokens 4\nembed 5 6\nresidual\nlinear 6\nloss softmax_cross_entropy\n", 5, 1,
       "has no 'end'"},
      {"input tokens 4\nembed 5 6\nlinear 4 tied\n", 3, 10,
       "maps width 6 to the vocabulary 5"},
      {"input tokens 4\nembed 5 6\nlinear 7\nlinear 5 tied\n", 4, 10,
       "maps width 6 to the vocabulary 5"},
      {"input tokens 4\nembed 5 6\nlinear 5 tied\nlinear 6\nlinear 5 tied\n", 5, 10,
       "tied to a linear already"},
      {"input 6\nlinear 5 tied\n", 2, 10, "needs a sequence model"},
      {"input tokens 4\nembed 5 6\nlinear 18\nattention 2 dropout\n", 4, 21,
       "expected a probability after 'dropout'"},
      {"input tokens 4\nembed 5 6\nlinear 18\nattention 2 dropout 1.5\n", 4, 21,
       "expected a probability in [0, 1), got '1.5'"},
      {"input tokens 4\nembed 5 6\nlinear 18\nattention 2 heads\n", 4, 13, "unexpected"},
      {"input tokens 4\nembed 5 6\nlinear 5 tied nobias\n", 3, 15, "unexpected"},
      {"input tokens 0\n", 1, 14, "out of range"},
      {"input tokens\n", 1, 14, "expected the context"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    parse_bad(bad[i].text, bad[i].line, bad[i].col, bad[i].needle);
}
END_TEST

/* `shortcut`: its shapes and links, the builder's model, dp_model_format's
 * text back, and its refusals at line:col. */
START_TEST(shortcut_parses_builds_refuses_and_round_trips) {
  dp_model *m = parse_ok(RESNET_PROJ_SPEC);
  int r = 8, s = 16, e = 22;
  ck_assert_int_eq(m->layers[r].kind, DP_LAYER_RESIDUAL);
  ck_assert_int_eq(m->layers[s].kind, DP_LAYER_SHORTCUT);
  ck_assert_int_eq(m->layers[e].kind, DP_LAYER_RESIDUAL_END);
  ck_assert_int_eq(m->layers[r].link, e);
  ck_assert_int_eq(m->layers[s].link, r);
  ck_assert_int_eq(m->layers[e].link, r);
  /* its input f's output (6 x 4 x 4), its output x (4 x 8 x 8), which g reads */
  ck_assert_int_eq(m->layers[s].in, 96);
  ck_assert_int_eq(m->layers[s].out, 256);
  ck_assert_int_eq(m->layers[s].c, 4);
  ck_assert_int_eq(m->layers[s].h, 8);
  ck_assert_int_eq(m->layers[e].out, 96);
  ck_assert_int_eq(m->layers[e].h, 4);
  ck_assert_int_eq(dp__block_shortcut(m, r), s);
  ck_assert_int_eq(dp__block_shortcut(m, 3), -1);
  ck_assert_int_eq(dp__act_owner(m, s), 7); /* x: the relu before the block */
  ck_assert_int_eq(dp__grad_owner(m, s), s);
  ck_assert_int_eq(dp__grad_owner(m, s + 1), s); /* the block nested in g views it */
  ck_assert_int_eq(dp__skip_owner(m, e), 15);    /* f's output: its nested end */
  dp_layer_info li;
  ck_assert_int_eq(dp_model_layer(m, s, &li), DP_OK);
  ck_assert_int_eq(li.link, r);
  char *t = format_alloc(m);
  ck_assert_str_eq(t, RESNET_PROJ_SPEC);
  free(t);

  dp_model *b = NULL; /* the builder: the same model */
  ck_assert_int_eq(dp_model_new_image(3, 8, 8, &b), DP_OK);
  for (int i = 0; i < m->n_layers; i++) {
    const dp_layer *l = &m->layers[i];
    dp_status st = DP_OK;
    switch (l->kind) {
    case DP_LAYER_CONV2D:
      st = dp_model_add_conv2d(b, l->c, l->k, l->stride, l->pad, l->bias);
      break;
    case DP_LAYER_AVGPOOL2D: st = dp_model_add_pool2d(b, l->kind, l->k, l->stride); break;
    case DP_LAYER_LINEAR: st = dp_model_add_linear(b, l->out, l->bias); break;
    case DP_LAYER_RESIDUAL: st = dp_model_begin_residual(b); break;
    case DP_LAYER_SHORTCUT: st = dp_model_begin_shortcut(b); break;
    case DP_LAYER_RESIDUAL_END: st = dp_model_end_residual(b); break;
    default: st = dp_model_add(b, l->kind);
    }
    ck_assert_msg(st == DP_OK, "layer %d: %s", i, dp_last_error());
  }
  ck_assert_int_eq(dp_model_set_loss(b, DP_LOSS_SOFTMAX_CE), DP_OK);
  assert_same_model(m, b);
  ck_assert_int_eq(dp_model_begin_shortcut(b), DP_ERR_INVALID);
  dp_model_free(b);
  dp_model_free(m);

  static const struct {
    const char *text;
    int line, col;
    const char *needle;
  } bad[] = {
      {"input 4\nlinear 4\nshortcut\n", 3, 1, "'shortcut' outside a residual block"},
      {"input 4\nresidual\nlinear 4\nend\nshortcut\nlinear 4\nend\n", 5, 1,
       "outside a residual block"},
      {"input 4\nresidual\nshortcut\nlinear 4\nend\n", 3, 1,
       "has no layers before 'shortcut'"},
      {"input 4\nresidual\nlinear 4\nshortcut\nlinear 4\nshortcut\nend\n", 6, 1,
       "has a shortcut already (layer 2): one per block"},
      {"input 4\nresidual\nlinear 4\nshortcut\nend\n", 5, 1,
       "the shortcut (layer 2) has no layers"},
      {"input 4\nresidual\nlinear 3\nshortcut\nlinear 2\nend\n", 6, 1,
       "the shortcut's output (2 floats, flat per row) must have the shape of the block's "
       "output before 'shortcut' (3 floats, flat, at layer 1)"},
      {"input 1 4 4\nresidual\nconv2d 2 1 stride 2\nshortcut\nconv2d 2 1\nend\n", 6, 1,
       "(2 x 4 x 4 (C x H x W) per row) must have the shape of the block's output before "
       "'shortcut' (2 x 2 x 2 (C x H x W), at layer 1)"},
      {"input 4\nresidual\nlinear 4\nshortcut\nlinear 4\n", 2, 1, "has no 'end'"},
      {"input 4\nresidual\nlinear 4\nshortcut extra\nlinear 4\nend\n", 4, 10, "unexpected"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    parse_bad(bad[i].text, bad[i].line, bad[i].col, bad[i].needle);
}
END_TEST

START_TEST(image_builder_matches_the_parser) {
  dp_model *b = NULL, *p = parse_ok("input 2 7 5\nconv2d 3 3 stride 2 padding 1\ntanh\n"
                                    "avgpool2d 2 stride 1\nflatten\nlinear 2\n");
  ck_assert_int_eq(dp_model_new_image(2, 7, 5, &b), DP_OK);
  ck_assert_int_eq(dp_model_add_conv2d(b, 3, 3, 2, 1, 1), DP_OK);
  ck_assert_int_eq(dp_model_add(b, DP_LAYER_TANH), DP_OK);
  ck_assert_int_eq(dp_model_add_pool2d(b, DP_LAYER_AVGPOOL2D, 2, 1), DP_OK);
  ck_assert_int_eq(dp_model_add(b, DP_LAYER_FLATTEN), DP_OK);
  ck_assert_int_eq(dp_model_add_linear(b, 2, 1), DP_OK);
  assert_same_model(b, p);
  /* refusals change nothing */
  int n = dp_model_n_layers(b);
  ck_assert_int_eq(dp_model_add_conv2d(b, 3, 3, 1, 0, 1), DP_ERR_INVALID); /* flat now */
  ck_assert_int_eq(dp_model_add_pool2d(b, DP_LAYER_RELU, 2, 0), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_n_layers(b), n);
  dp_model_free(b);
  ck_assert_int_eq(dp_model_new_image(0, 7, 5, &b), DP_ERR_INVALID);
  ck_assert_ptr_null(b);
  ck_assert_int_eq(dp_model_new_image(1, 7, 5, &b), DP_OK);
  ck_assert_int_eq(dp_model_add_conv2d(b, 0, 3, 1, 0, 1), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add_conv2d(b, 2, 3, 1, -1, 1), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add_pool2d(b, DP_LAYER_MAXPOOL2D, 8, 0), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_n_layers(b), 0);
  dp_model_free(b);
  dp_model_free(p);
}
END_TEST

/* The pools' padding (nn.MaxPool2d(K, S, P), nn.AvgPool2d(K, S, P,
 * count_include_pad)): shapes floor((n + 2P - K) / S) + 1, read back through
 * dp_layer_info, formatted only when set (options in any order come back in
 * one), and the builder's the same model. */
START_TEST(pool_padding_parses_and_round_trips) {
  const char *text = "input 3 9 8\n"
                     "maxpool2d 3 stride 2 padding 1\n"    /* 3 x 5 x 4 */
                     "avgpool2d 3 stride 1 padding 1\n"    /* 3 x 5 x 4 */
                     "avgpool2d 2 padding 1 exclude_pad\n" /* 3 x 3 x 3 */
                     "avgpool2d 2 stride 1 exclude_pad\n"  /* 3 x 2 x 2 */
                     "flatten\n";
  dp_model *m = parse_ok(text), *back = NULL, *b = NULL;
  static const int want[][5] = {/* h, w, padding, exclude_pad, stride */
                                {5, 4, 1, 0, 2},
                                {5, 4, 1, 0, 1},
                                {3, 3, 1, 1, 2},
                                {2, 2, 0, 1, 1}};
  for (int i = 0; i < 4; i++) {
    dp_layer_info li;
    ck_assert_int_eq(dp_model_layer(m, i, &li), DP_OK);
    ck_assert_msg(li.channels == 3 && li.height == want[i][0] && li.width == want[i][1] &&
                      li.padding == want[i][2] && li.exclude_pad == want[i][3] &&
                      li.stride == want[i][4] && li.out == 3 * want[i][0] * want[i][1],
                  "layer %d: %d x %d x %d, padding %d, exclude_pad %d, stride %d", i,
                  li.channels, li.height, li.width, li.padding, li.exclude_pad, li.stride);
  }
  char buf[512];
  dp_model_format(m, buf, sizeof buf);
  ck_assert_str_eq(buf, text);
  ck_assert_int_eq(dp_model_parse(buf, "again", &back), DP_OK);
  assert_same_model(m, back);
  dp_model_free(back);
  /* the builder */
  ck_assert_int_eq(dp_model_new_image(3, 9, 8, &b), DP_OK);
  ck_assert_int_eq(dp_model_add_pool2d_padded(b, DP_LAYER_MAXPOOL2D, 3, 2, 1, 0), DP_OK);
  ck_assert_int_eq(dp_model_add_pool2d_padded(b, DP_LAYER_AVGPOOL2D, 3, 1, 1, 0), DP_OK);
  ck_assert_int_eq(dp_model_add_pool2d_padded(b, DP_LAYER_AVGPOOL2D, 2, 0, 1, 1), DP_OK);
  ck_assert_int_eq(dp_model_add_pool2d_padded(b, DP_LAYER_AVGPOOL2D, 2, 1, 0, 1), DP_OK);
  ck_assert_int_eq(dp_model_add(b, DP_LAYER_FLATTEN), DP_OK);
  assert_same_model(b, m);
  dp_model_free(b);
  dp_model_free(m);
  /* any order; the defaults (padding 0) unsaid */
  m = parse_ok("input 1 6 6\navgpool2d 2 exclude_pad padding 1 stride 3\n"
               "maxpool2d 2 padding 0\n");
  dp_model_format(m, buf, sizeof buf);
  ck_assert_str_eq(buf, "input 1 6 6\navgpool2d 2 stride 3 padding 1 exclude_pad\n"
                        "maxpool2d 2\n");
  dp_model_free(m);
}
END_TEST

/* PyTorch's refusals and the spec's own, at the line and column at fault. */
START_TEST(pool_padding_refusals_name_line_and_column) {
  parse_bad("input 1 8 8\nmaxpool2d 3 padding 2\n", 2, 21,
            "padding 2 is more than half the kernel size 3");
  parse_bad("input 1 8 8\navgpool2d 2 stride 1 padding 2\n", 2, 30,
            "padding 2 is more than half the kernel size 2");
  parse_bad("input 1 8 8\nmaxpool2d 1 padding 1\n", 2, 21, "half the kernel size 1");
  parse_bad("input 1 8 8\navgpool2d 2 padding 1 padding 1\n", 2, 23, "given twice");
  parse_bad("input 1 8 8\navgpool2d 2 exclude_pad exclude_pad\n", 2, 25, "given twice");
  parse_bad("input 1 8 8\nmaxpool2d 2 exclude_pad\n", 2, 13,
            "expected 'stride S' or 'padding P', got 'exclude_pad'");
  parse_bad("input 1 8 8\navgpool2d 2 nobias\n", 2, 13,
            "expected 'stride S', 'padding P' or 'exclude_pad'");
  parse_bad("input 1 8 8\nconv2d 2 3 exclude_pad\n", 2, 12,
            "expected 'stride S', 'padding P' or 'nobias'");
  parse_bad("input 1 8 8\nmaxpool2d 2 padding\n", 2, 21, "a number after 'padding'");
  parse_bad("input 1 8 8\nmaxpool2d 2 padding -1\n", 2, 21, "positive integer");
  parse_bad("input 1 1 1\navgpool2d 4 padding 1\n", 2, 1,
            "a 4 x 4 window with padding 1 does not fit the 1 x 1 input");
  /* the builder: the same rules, nothing added */
  dp_model *b = NULL;
  ck_assert_int_eq(dp_model_new_image(1, 8, 8, &b), DP_OK);
  ck_assert_int_eq(dp_model_add_pool2d_padded(b, DP_LAYER_MAXPOOL2D, 3, 0, 2, 0),
                   DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_last_error(), "padding must be in 0..1") &&
                    strstr(dp_last_error(), "kernel 3") && strstr(dp_last_error(), "got 2"),
                "%s", dp_last_error());
  ck_assert_int_eq(dp_model_add_pool2d_padded(b, DP_LAYER_AVGPOOL2D, 3, 0, -1, 0),
                   DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add_pool2d_padded(b, DP_LAYER_MAXPOOL2D, 2, 0, 1, 1),
                   DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_last_error(), "exclude_pad is avgpool2d's"), "%s",
                dp_last_error());
  ck_assert_int_eq(dp_model_add_pool2d_padded(b, DP_LAYER_CONV2D, 2, 0, 1, 0),
                   DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_add_pool2d_padded(NULL, DP_LAYER_MAXPOOL2D, 2, 0, 1, 0),
                   DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_n_layers(b), 0);
  dp_model_free(b);
}
END_TEST

/* Padding and exclude_pad are in the plan's hash; an unpadded pool's spec
 * keeps the hash it had before they existed (OLD_POOL_H0: the model hash of
 * OLD_POOL_SPEC computed by the library of the commit before them). */
#define OLD_POOL_SPEC                                                                      \
  "input 2 9 8\nconv2d 3 3 padding 1\nmaxpool2d 3 stride 2\navgpool2d 2 stride 1\n"        \
  "flatten\nlinear 4\nloss softmax_cross_entropy\n"
#define OLD_POOL_H0 UINT64_C(0x2725a718235d0a74)
START_TEST(pool_padding_changes_the_hash_and_old_specs_keep_theirs) {
  dp_plan *p = plan_of_spec(OLD_POOL_SPEC);
  uint64_t h[DP_PLAN_HASHES];
  dp__plan_hashes(p, h);
  ck_assert_msg(h[0] == OLD_POOL_H0, "model hash %016llx", (unsigned long long)h[0]);
  dp_plan_free(p);
  static const char *const specs[] = {
      "input 1 6 6\nmaxpool2d 2\nflatten\nloss mse\n",
      "input 1 6 6\nmaxpool2d 2 padding 1\nflatten\nloss mse\n",
      "input 1 6 6\navgpool2d 2\nflatten\nloss mse\n",
      "input 1 6 6\navgpool2d 2 exclude_pad\nflatten\nloss mse\n",
      "input 1 6 6\navgpool2d 2 padding 1\nflatten\nloss mse\n",
      "input 1 6 6\navgpool2d 2 padding 1 exclude_pad\nflatten\nloss mse\n",
      NULL};
  hashes_differ(specs);
}
END_TEST

START_TEST(absurd_dims_parse_but_planning_overflows) {
  /* n_params = 2e9 * 2e9 + 2e9 = 4.000000002e18 fits; the params alone take
   * 1.6000000008e19 bytes, and params + grads do not fit in 64 bits. */
  dp_model *m = model_of("input 2000000000\nlinear 2000000000\nloss mse\n");
  ck_assert_uint_eq(dp_model_n_params(m), (size_t)4000000002000000000ull);
  dp_config c = config_of(30, 2, DP_OPT_SGD);
  plan_overflows(m, &c);
  dp_config_set_optimizer(&c, DP_OPT_ADAMW);
  plan_overflows(m, &c);
  c.backend = DP_BACKEND_CUDA;
  if (dp_cuda_available()) plan_overflows(m, &c);
  dp_model_free(m);
}
END_TEST

START_TEST(absurd_dims_inference_plans_without_wrapping) {
  /* Inference needs only the params (1.6000000008e19 B) plus small chunks: it
   * fits in 64 bits, so the plan exists and its sizes are the true ones. */
  dp_model *m = model_of("input 2000000000\nlinear 2000000000\n");
  dp_config c = config_of(2, 2, DP_OPT_SGD);
  c.inference = 1;
  dp_plan *p = NULL;
  ck_assert_int_eq(dp_plan_create(m, &c, &p), DP_OK);
  for (int d = 0; d < dp_plan_n_devices(p); d++) {
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_PARAMS).size,
                      (size_t)16000000008000000000ull);
    ck_assert_uint_eq(dp_plan_region(p, d, DP_REGION_INPUTS).size, (size_t)8000000000ull);
    ck_assert(dp_plan_device_bytes(p, d) >= (size_t)16000000024000000000ull);
  }
  dp_plan_free(p);
  dp_model_free(m);
}
END_TEST

START_TEST(two_absurd_layers_overflow_the_param_bytes) {
  dp_model *m = model_of("input 2000000000\nlinear 2000000000\nlinear 2000000000\n");
  dp_config c = config_of(1, 1, DP_OPT_SGD);
  c.inference = 1;
  plan_overflows(m, &c); /* 8e18 params * 4 bytes > 2^64 */
  dp_model_free(m);
}
END_TEST

START_TEST(absurd_param_count_overflows_in_the_parser) {
  /* each such layer has ~4e18 params; the fifth makes the total exceed 2^64 */
  parse_bad_as("input 2000000000\nlinear 2000000000\nlinear 2000000000\nlinear 2000000000\n"
               "linear 2000000000\nlinear 2000000000\n",
               DP_ERR_OVERFLOW, 6, 1, "overflow");
  dp_model *m = NULL;
  ck_assert_int_eq(dp_model_new(2000000000, &m), DP_OK);
  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(dp_model_add_linear(m, 2000000000, 1), DP_OK);
  ck_assert_int_eq(dp_model_add_linear(m, 2000000000, 1), DP_ERR_OVERFLOW);
  ck_assert_int_eq(dp_model_n_layers(m), 4);
  dp_model_free(m);
}
END_TEST

/* A tied head's row is V logits at each of T positions: V T past 2^31 - 1
 * wrapped the int width (T 257, V 2^24: a model of 16777216 outputs, planned
 * and run as 65281 classes a position; T 128: a negative width), where the
 * untied linear of the same shape is refused. */
START_TEST(tied_head_wider_than_an_int_is_refused) {
  parse_bad_as("input tokens 257\nembed 16777216 1\nlinear 16777216 tied\n",
               DP_ERR_OVERFLOW, 3, 17, "2^31 - 1");
  parse_bad_as("input tokens 128\nembed 16777216 1\nlinear 16777216 tied\n",
               DP_ERR_OVERFLOW, 3, 17, "2^31 - 1");
  parse_bad_as("input tokens 257\nembed 16777216 1\nlinear 16777216 nobias\n",
               DP_ERR_OVERFLOW, 3, 1, "2^31 - 1");
  /* 127 x 2^24 fits: planned with its true width */
  dp_model *m = model_of("input tokens 127\nembed 16777216 1\nlinear 16777216 tied\n");
  ck_assert_int_eq(dp_model_output_width(m), 127 * 16777216);
  dp_model_free(m);
}
END_TEST

START_TEST(huge_batch_with_big_widths_overflows) {
  /* rows * width * 4 <= (2^31)^2 * 4 = 2^64 is just representable per
   * region; the sum of inputs and outputs is not. */
  dp_model *m = model_of("input 2000000000\nlinear 2000000000 nobias\nrelu\n");
  dp_config c = config_of(2000000000, 1, DP_OPT_SGD);
  c.inference = 1;
  plan_overflows(m, &c);
  c.n_devices = 2; /* 2^30 rows * 2e9 * 4 B of inputs on top of 1.6e19 B of params */
  c.batch = 2147483647;
  plan_overflows(m, &c);
  dp_model_free(m);

  m = model_of("input 2147483647\nrelu\nloss mse\n");
  c = config_of(2147483647, 1, DP_OPT_SGD);
  plan_overflows(m, &c);
  c.micro_batch = 1 << 30;
  plan_overflows(m, &c);
  dp_model_free(m);
}
END_TEST

START_TEST(absurd_dims_max_batch_is_zero_not_an_error) {
  dp_model *m = model_of("input 2000000000\nlinear 2000000000\nloss mse\n");
  dp_config c = config_of(1, 2, DP_OPT_SGD);
  int b = -1;
  ck_assert_int_eq(dp_plan_max_batch(m, &c, SIZE_MAX, 1000, &b), DP_OK);
  ck_assert_int_eq(b, 0);
  dp_model_free(m);
}
END_TEST

/* ---- the cross-entropy's options (PyTorch's nn.CrossEntropyLoss) ---------------- */

START_TEST(ce_options_parse_read_back_and_round_trip) {
  const char *spec = "input 4\nlinear 3\n"
                     "loss softmax_cross_entropy weight 1,2.5,0 ignore_index -100 "
                     "label_smoothing 0.1\n";
  dp_model *m = model_of(spec);
  dp_ce_options o;
  ck_assert_int_eq(dp_model_ce_options(m, &o), DP_OK);
  ck_assert_float_eq(o.label_smoothing, 0.1f);
  ck_assert_int_eq(o.has_ignore_index, 1);
  ck_assert_int_eq(o.ignore_index, -100);
  ck_assert_int_eq(o.n_weights, 3);
  ck_assert_float_eq(o.weights[0], 1.0f);
  ck_assert_float_eq(o.weights[1], 2.5f);
  ck_assert_float_eq(o.weights[2], 0.0f);
  char *s = format_alloc(m); /* the options in a fixed order */
  ck_assert_str_eq(s, "input 4\nlinear 3\nloss softmax_cross_entropy label_smoothing 0.1 "
                      "ignore_index -100 weight 1,2.5,0\n");
  dp_model *b = model_of(s);
  char *t = format_alloc(b);
  ck_assert_str_eq(s, t);
  ck_assert_mem_eq(&m->ce, &b->ce, sizeof m->ce);
  /* the builder's spelling of the same model */
  dp_model *c = model_of("input 4\nlinear 3\nloss softmax_cross_entropy\n");
  ck_assert_int_eq(dp_model_ce_options(c, &o), DP_OK);
  ck_assert(o.label_smoothing == 0.0f && !o.has_ignore_index && !o.n_weights && !o.weights);
  float w[3] = {1.0f, 2.5f, 0.0f};
  dp_ce_options set = {.label_smoothing = 0.1f,
                       .has_ignore_index = 1,
                       .ignore_index = -100,
                       .n_weights = 3,
                       .weights = w};
  ck_assert_int_eq(dp_model_set_ce_options(c, &set), DP_OK);
  w[1] = 7.0f; /* the model keeps its own copy */
  char *u = format_alloc(c);
  ck_assert_str_eq(s, u);
  /* a single option, and an ignore_index of a real class (PyTorch allows it) */
  dp_model *d = model_of("input 4\nlinear 3\nloss softmax_cross_entropy ignore_index 2\n");
  char *v = format_alloc(d);
  ck_assert_str_eq(v, "input 4\nlinear 3\nloss softmax_cross_entropy ignore_index 2\n");
  free(s), free(t), free(u), free(v);
  dp_model_free(m), dp_model_free(b), dp_model_free(c), dp_model_free(d);
}
END_TEST

START_TEST(ce_option_errors_name_line_and_column) {
  const char *h = "input 4\nlinear 3\n";
  char buf[256];
#define BAD(tail, col, needle)                                                             \
  do {                                                                                     \
    snprintf(buf, sizeof buf, "%sloss softmax_cross_entropy%s\n", h, tail);                \
    parse_bad(buf, 3, col, needle);                                                        \
  } while (0)
  BAD(" label_smoothing", 44, "expected a number in [0, 1] after 'label_smoothing'");
  BAD(" label_smoothing 1.5", 44,
      "label_smoothing: expected a number in [0, 1], got '1.5'");
  BAD(" label_smoothing -0.1", 44, "got '-0.1'");
  BAD(" label_smoothing 0x0.1p0", 44, "got '0x0.1p0'");
  BAD(" label_smoothing nan", 44, "got 'nan'");
  BAD(" ignore_index x1", 41, "ignore_index: expected an integer (int32), got 'x1'");
  BAD(" ignore_index 2147483648", 41, "got '2147483648'");
  BAD(" weight 1,2", 35, "weight: 2 class weights for 3 classes");
  BAD(" weight 1,,3", 37, "expected a finite number >= 0 for class 1, got ''");
  BAD(" weight 1,2,-3", 39, "for class 2, got '-3'");
  BAD(" weight 1,2,inf", 39, "got 'inf'");
  BAD(" weight 1,2,3,", 41, "for class 3, got ''");
  BAD(" smoothing 0.1", 28, "expected 'label_smoothing S', 'ignore_index I' or");
  BAD(" ignore_index 1 ignore_index 2", 43, "'ignore_index' given twice");
#undef BAD
  parse_bad("input 4\nlinear 3\nloss mse label_smoothing 0.1\n", 3, 10,
            "unexpected 'label_smoothing' after 'loss'");
  /* the builder refuses what the parser does, and changes nothing */
  dp_model *m = model_of("input 4\nlinear 3\nloss softmax_cross_entropy\n");
  float w[3] = {1, NAN, 1};
  dp_ce_options o = {.n_weights = 3, .weights = w};
  ck_assert_int_eq(dp_model_set_ce_options(m, &o), DP_ERR_INVALID);
  o = (dp_ce_options){.label_smoothing = 1.01f};
  ck_assert_int_eq(dp_model_set_ce_options(m, &o), DP_ERR_INVALID);
  o = (dp_ce_options){.n_weights = 3};
  ck_assert_int_eq(dp_model_set_ce_options(m, &o), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_set_ce_options(m, NULL), DP_ERR_INVALID);
  char *s = format_alloc(m);
  ck_assert_str_eq(s, "input 4\nlinear 3\nloss softmax_cross_entropy\n");
  dp_model *e = model_of("input 4\nlinear 3\nloss mse\n");
  o = (dp_ce_options){.has_ignore_index = 1};
  ck_assert_int_eq(dp_model_set_ce_options(e, &o), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "options of loss softmax_cross_entropy"));
  free(s);
  dp_model_free(m), dp_model_free(e);
}
END_TEST

/* The largest weight the builder takes, FLT_MAX, formats as 3.4028235e+38: above
 * FLT_MAX as a double, it must still parse (a checkpoint holds the text), while
 * the next decimal up, which rounds to infinity, stays refused. */
START_TEST(ce_weight_flt_max_round_trips) {
  dp_model *m = model_of("input 4\nlinear 3\nloss softmax_cross_entropy\n");
  float w[3] = {1.0f, FLT_MAX, 2.0f};
  dp_ce_options o = {.n_weights = 3, .weights = w};
  ck_assert_int_eq(dp_model_set_ce_options(m, &o), DP_OK);
  char *s = format_alloc(m);
  dp_model *b = NULL;
  ck_assert_msg(dp_model_parse(s, "f", &b) == DP_OK, "%s", dp_last_error());
  char *t = format_alloc(b);
  ck_assert_str_eq(s, t);
  ck_assert_mem_eq(&m->ce, &b->ce, sizeof m->ce);
  parse_bad("input 4\nlinear 3\nloss softmax_cross_entropy weight 1,3.4028236e38,1\n", 3,
            37, "for class 1, got '3.4028236e38'");
  free(s), free(t);
  dp_model_free(m), dp_model_free(b);
}
END_TEST

/* The options enter the plan hash; a spec without them keeps the model hash
 * it had before they existed (pinned: computed by the code before them; the
 * sequence model's since its positions, vocabulary and heads entered it). */
START_TEST(ce_options_change_the_hash_and_old_specs_keep_theirs) {
  static const struct {
    const char *spec;
    uint64_t h0;
  } old[] = {
      {"input 5\nlinear 2\nloss mse\n", UINT64_C(0x522edfec59f69225)},
      {"input tokens 4\nembed 8 4\nlayernorm\nlinear 8\nloss softmax_cross_entropy\n",
       UINT64_C(0xb8179e4ff5d424c6)},
  };
  for (size_t i = 0; i < sizeof old / sizeof *old; i++) {
    dp_plan *p = plan_of_spec(old[i].spec);
    uint64_t h[DP_PLAN_HASHES];
    dp__plan_hashes(p, h);
    ck_assert_msg(h[0] == old[i].h0, "%zu: model hash %016llx", i,
                  (unsigned long long)h[0]);
    dp_plan_free(p);
  }
  static const char *const specs[] = {
      "input 4\nlinear 3\nloss softmax_cross_entropy\n",
      "input 4\nlinear 3\nloss softmax_cross_entropy label_smoothing 0.1\n",
      "input 4\nlinear 3\nloss softmax_cross_entropy ignore_index -100\n",
      "input 4\nlinear 3\nloss softmax_cross_entropy ignore_index 0\n",
      "input 4\nlinear 3\nloss softmax_cross_entropy weight 1,1,1\n",
      "input 4\nlinear 3\nloss softmax_cross_entropy weight 1,1,2\n",
      NULL};
  hashes_differ(specs);
}
END_TEST

/* bce_with_logits' pos_weight: parsed, read back, formatted only when set (a
 * spec without it keeps its text), a copy in the model, the builder's refusals
 * those of the parser, and in the plan hash only when set. */
START_TEST(bce_pos_weight_parses_formats_and_round_trips) {
  dp_model *m = model_of("input 4\nlinear 3\nloss bce_with_logits pos_weight 2.5e0,-0,1\n");
  dp_bce_options o;
  ck_assert_int_eq(dp_model_bce_options(m, &o), DP_OK);
  ck_assert_int_eq(o.n_pos_weights, 3);
  ck_assert(o.pos_weights[0] == 2.5f && o.pos_weights[2] == 1.0f);
  ck_assert(!signbit(o.pos_weights[1]) && o.pos_weights[1] == 0.0f); /* -0 as 0 */
  char *s = format_alloc(m);
  ck_assert_str_eq(s, "input 4\nlinear 3\nloss bce_with_logits pos_weight 2.5,0,1\n");
  dp_model *b = model_of(s);
  char *t = format_alloc(b);
  ck_assert_str_eq(s, t);
  ck_assert_int_eq(b->n_pos_weight, 3);
  ck_assert_mem_eq(b->pos_weight, m->pos_weight, 3 * sizeof(float));
  /* the builder: the same model, its own copy of the weights */
  dp_model *c = model_of("input 4\nlinear 3\nloss bce_with_logits\n");
  ck_assert_int_eq(dp_model_bce_options(c, &o), DP_OK);
  ck_assert(o.n_pos_weights == 0 && o.pos_weights == NULL);
  char *u = format_alloc(c);
  ck_assert_str_eq(u, "input 4\nlinear 3\nloss bce_with_logits\n");
  float w[3] = {2.5f, 0.0f, 1.0f};
  o = (dp_bce_options){.n_pos_weights = 3, .pos_weights = w};
  ck_assert_int_eq(dp_model_set_bce_options(c, &o), DP_OK);
  w[0] = 9.0f;
  char *v = format_alloc(c);
  ck_assert_str_eq(v, s);
  /* set back to none: the plain text again */
  o = (dp_bce_options){0};
  ck_assert_int_eq(dp_model_set_bce_options(c, &o), DP_OK);
  free(u);
  u = format_alloc(c);
  ck_assert_str_eq(u, "input 4\nlinear 3\nloss bce_with_logits\n");
  /* another loss reads back none */
  dp_model *e = model_of("input 4\nlinear 3\nloss softmax_cross_entropy weight 1,2,3\n");
  ck_assert_int_eq(dp_model_bce_options(e, &o), DP_OK);
  ck_assert(o.n_pos_weights == 0 && o.pos_weights == NULL);
  ck_assert_int_eq(dp_model_bce_options(NULL, &o), DP_ERR_INVALID);
  free(s), free(t), free(u), free(v);
  dp_model_free(m), dp_model_free(b), dp_model_free(c), dp_model_free(e);
}
END_TEST

START_TEST(bce_pos_weight_errors_name_line_and_column) {
  const char *h = "input 4\nlinear 2\n";
  char buf[4096];
#define BAD(tail, col, needle)                                                             \
  do {                                                                                     \
    snprintf(buf, sizeof buf, "%sloss bce_with_logits%s\n", h, tail);                      \
    parse_bad(buf, 3, col, needle);                                                        \
  } while (0)
  BAD(" pos_weight", 33,
      "loss bce_with_logits: expected one weight per output, commas between after "
      "'pos_weight'");
  BAD(" pos_weight 1", 33, "pos_weight: 1 weights for 2 outputs");
  BAD(" pos_weight 1,2,3", 33, "pos_weight: 3 weights for 2 outputs");
  BAD(" pos_weight 1,", 35,
      "pos_weight: expected a finite number >= 0 for output 1, got ''");
  BAD(" pos_weight ,1", 33, "for output 0, got ''");
  BAD(" pos_weight 1,-2", 35, "for output 1, got '-2'");
  BAD(" pos_weight 1,nan", 35, "got 'nan'");
  BAD(" pos_weight 1,3.4028236e38", 35, "got '3.4028236e38'");
  BAD(" pos_weight 1 2", 35, "unexpected '2' after 'loss'");
  BAD(" weight 1,2", 22,
      "loss bce_with_logits: expected 'pos_weight P0,P1,...' or end of line, got 'weight'");
#undef BAD
  /* more than DP_MAX_CLASS_WEIGHTS: refused at the first one too many */
  int len = snprintf(buf, sizeof buf, "%sloss bce_with_logits pos_weight ", h);
  for (int i = 0; i <= DP_MAX_CLASS_WEIGHTS; i++)
    len += snprintf(buf + len, sizeof buf - (size_t)len, "%s1", i ? "," : "");
  snprintf(buf + len, sizeof buf - (size_t)len, "\n");
  parse_bad(buf, 3, 33 + 2 * DP_MAX_CLASS_WEIGHTS, "loss: at most 1024 output weights");
  parse_bad("input 4\nlinear 2\nloss mse pos_weight 1,1\n", 3, 10,
            "unexpected 'pos_weight' after 'loss'");
  /* the builder refuses what the parser does, and changes nothing */
  dp_model *m = model_of("input 4\nlinear 2\nloss bce_with_logits pos_weight 3,4\n");
  float w[2] = {1.0f, NAN};
  dp_bce_options o = {.n_pos_weights = 2, .pos_weights = w};
  ck_assert_int_eq(dp_model_set_bce_options(m, &o), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "output 1's weight nan is not finite"));
  w[1] = -1.0f;
  ck_assert_int_eq(dp_model_set_bce_options(m, &o), DP_ERR_INVALID);
  w[1] = INFINITY;
  ck_assert_int_eq(dp_model_set_bce_options(m, &o), DP_ERR_INVALID);
  o = (dp_bce_options){.n_pos_weights = 2};
  ck_assert_int_eq(dp_model_set_bce_options(m, &o), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "pos_weights is NULL"));
  o = (dp_bce_options){.n_pos_weights = 1, .pos_weights = w};
  ck_assert_int_eq(dp_model_set_bce_options(m, &o), DP_ERR_INVALID);
  ck_assert_int_eq(dp_model_set_bce_options(m, NULL), DP_ERR_INVALID);
  char *s = format_alloc(m);
  ck_assert_str_eq(s, "input 4\nlinear 2\nloss bce_with_logits pos_weight 3,4\n");
  dp_model *e = model_of("input 4\nlinear 2\nloss mse\n");
  o = (dp_bce_options){0};
  ck_assert_int_eq(dp_model_set_bce_options(e, &o), DP_ERR_INVALID);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "an option of loss bce_with_logits"));
  free(s);
  dp_model_free(m), dp_model_free(e);
}
END_TEST

START_TEST(bce_pos_weight_changes_the_hash_only_when_set) {
  /* a spec without it keeps the model hash it had before pos_weight existed
   * (pinned: computed by the code before it) */
  dp_plan *p = plan_of_spec("input 4\nlinear 2\nloss bce_with_logits\n");
  uint64_t h[DP_PLAN_HASHES];
  dp__plan_hashes(p, h);
  ck_assert_msg(h[0] == UINT64_C(0xf2f5c838ad0d22e2), "model hash %016llx",
                (unsigned long long)h[0]);
  dp_plan_free(p);
  static const char *const specs[] = {
      "input 4\nlinear 2\nloss bce_with_logits\n",
      "input 4\nlinear 2\nloss bce_with_logits pos_weight 1,1\n",
      "input 4\nlinear 2\nloss bce_with_logits pos_weight 1,2\n",
      "input 4\nlinear 2\nloss bce_with_logits pos_weight 2,1\n", NULL};
  hashes_differ(specs);
}
END_TEST

Suite *spec_suite(void) {
  Suite *s = suite_create("spec");
  TCase *tc = tcase_create("errors");
  tcase_add_test(tc, unknown_layer_is_named_with_its_position);
  tcase_add_test(tc, missing_width_points_after_the_keyword);
  tcase_add_test(tc, invalid_width_is_refused_at_its_column);
  tcase_add_test(tc, zero_width_is_out_of_range);
  tcase_add_test(tc, negative_width_is_refused);
  tcase_add_test(tc, huge_width_is_out_of_range_not_wrapped);
  tcase_add_test(tc, overlong_width_is_too_large_and_its_echo_is_closed);
  tcase_add_test(tc, long_unknown_words_are_echoed_with_a_closing_quote);
  tcase_add_test(tc, first_line_must_be_input);
  tcase_add_test(tc, duplicate_input_is_refused);
  tcase_add_test(tc, misspelt_nobias_is_named);
  tcase_add_test(tc, trailing_tokens_are_refused);
  tcase_add_test(tc, dropout_probability_out_of_range);
  tcase_add_test(tc, dropout_probability_not_a_number);
  tcase_add_test(tc, unknown_loss_is_named);
  tcase_add_test(tc, missing_loss_kind_points_after_loss);
  tcase_add_test(tc, a_layer_after_the_loss_is_refused);
  tcase_add_test(tc, a_loss_without_layers_is_refused_at_its_line);
  tcase_add_test(tc, too_many_layers_is_refused_at_the_extra_line);
  tcase_add_test(tc, empty_text_is_refused);
  tcase_add_test(tc, comment_only_text_is_refused);
  tcase_add_test(tc, errors_name_the_source);
  tcase_add_test(tc, null_arguments_are_invalid);
  suite_add_tcase(s, tc);

  tc = tcase_create("accepted");
  tcase_add_test(tc, comments_and_blank_lines_are_accepted);
  tcase_add_test(tc, crlf_line_ends_are_accepted);
  tcase_add_test(tc, last_line_without_newline_is_accepted);
  tcase_add_test(tc, a_model_without_loss_is_accepted);
  suite_add_tcase(s, tc);

  tc = tcase_create("shapes");
  tcase_add_test(tc, widths_are_inferred_layer_by_layer);
  tcase_add_test(tc, n_params_follow_state_dict_order);
  tcase_add_test(tc, layernorm_has_two_n_params);
  tcase_add_test(tc, nobias_drops_the_bias);
  tcase_add_test(tc, the_seed_model_has_twelve_params);
  tcase_add_test(tc, accessors_tolerate_null);
  suite_add_tcase(s, tc);

  tc = tcase_create("format");
  tcase_add_test(tc, format_writes_the_canonical_text);
  tcase_add_test(tc, format_round_trips_through_parse);
  tcase_add_test(tc, gelu_approximate_parses_and_round_trips);
  tcase_add_test(tc, gelu_approximate_refusals_name_the_options);
  tcase_add_test(tc, norm_eps_and_momentum_parse_and_round_trip);
  tcase_add_test(tc, norm_option_refusals_name_line_and_column);
  tcase_add_test(tc, silu_and_leaky_relu_parse_and_round_trip);
  tcase_add_test(tc, batchnorm_on_a_sequence_parses);
  tcase_add_test(tc, element_losses_parse_and_round_trip);
  tcase_add_test(tc, format_round_trips_a_gpt_with_indented_blocks);
  tcase_add_test(tc, tied_head_shares_the_token_table);
  tcase_add_test(tc, format_round_trips_any_dropout_probability);
  tcase_add_test(tc, format_short_dropout_probabilities_stay_short);
  tcase_add_test(tc, format_truncates_and_reports_the_needed_length);
  tcase_add_test(tc, ce_options_parse_read_back_and_round_trip);
  tcase_add_test(tc, ce_option_errors_name_line_and_column);
  tcase_add_test(tc, ce_options_change_the_hash_and_old_specs_keep_theirs);
  tcase_add_test(tc, bce_pos_weight_parses_formats_and_round_trips);
  tcase_add_test(tc, bce_pos_weight_errors_name_line_and_column);
  tcase_add_test(tc, bce_pos_weight_changes_the_hash_only_when_set);
  tcase_add_test(tc, ce_weight_flt_max_round_trips);
  suite_add_tcase(s, tc);

  tc = tcase_create("load");
  tcase_add_test(tc, load_of_a_missing_file_is_an_io_error);
  tcase_add_test(tc, load_of_a_directory_is_an_io_error);
  tcase_add_test(tc, load_of_a_fifo_without_writer_does_not_block);
  tcase_add_test(tc, load_of_a_null_path_is_invalid);
  tcase_add_test(tc, load_reads_a_file_and_names_it_in_errors);
  tcase_add_test(tc, load_reads_files_larger_than_its_first_buffer);
  suite_add_tcase(s, tc);

  tc = tcase_create("builder");
  tcase_add_test(tc, builder_matches_the_parser);
  tcase_add_test(tc, builder_refuses_bad_widths);
  tcase_add_test(tc, builder_refuses_layers_after_the_loss);
  tcase_add_test(tc, builder_refuses_bad_kinds_and_probabilities);
  tcase_add_test(tc, builder_refuses_too_many_layers);
  suite_add_tcase(s, tc);

  tc = tcase_create("overflow");
  tcase_add_test(tc, absurd_dims_parse_but_planning_overflows);
  tcase_add_test(tc, image_layers_infer_shapes_and_params);
  tcase_add_test(tc, image_layers_format_round_trips);
  tcase_add_test(tc, image_layer_errors_name_line_and_column);
  tcase_add_test(tc, pool_padding_parses_and_round_trips);
  tcase_add_test(tc, pool_padding_refusals_name_line_and_column);
  tcase_add_test(tc, pool_padding_changes_the_hash_and_old_specs_keep_theirs);
  tcase_add_test(tc, sequence_errors_name_line_and_column);
  tcase_add_test(tc, image_builder_matches_the_parser);
  tcase_add_test(tc, shortcut_parses_builds_refuses_and_round_trips);
  tcase_add_test(tc, absurd_dims_inference_plans_without_wrapping);
  tcase_add_test(tc, two_absurd_layers_overflow_the_param_bytes);
  tcase_add_test(tc, absurd_param_count_overflows_in_the_parser);
  tcase_add_test(tc, tied_head_wider_than_an_int_is_refused);
  tcase_add_test(tc, huge_batch_with_big_widths_overflows);
  tcase_add_test(tc, absurd_dims_max_batch_is_zero_not_an_error);
  suite_add_tcase(s, tc);
  return s;
}
