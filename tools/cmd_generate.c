/* `dp generate`: a sequence model's checkpoint continues a prompt, one token at
 * a time, on an inference plan made once (batch = the samples, the planned
 * context): nothing is allocated per token. Past the context the window
 * slides: the model sees the last T tokens. */
#include "cli.h"
#include "svg.h" /* dpt_format_bytes */

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  OPT_CHECKPOINT = DPT_OPT_USER,
  OPT_PROMPT,
  OPT_PROMPT_IDS,
  OPT_TOKENS,
  OPT_GREEDY,
  OPT_TEMPERATURE,
  OPT_TOP_K,
  OPT_IDS,
  OPT_SAMPLES,
};

typedef struct {
  const char *checkpoint, *prompt, *prompt_ids;
  int tokens, greedy, top_k, ids, samples;
  float temperature; /* 0: not given */
} generate_opts;

static int on_option(void *user, int code, const char *arg, char *err, size_t errcap) {
  generate_opts *o = user;
  switch (code) {
  case OPT_CHECKPOINT: o->checkpoint = arg; return 0;
  case OPT_PROMPT: o->prompt = arg; return 0;
  case OPT_PROMPT_IDS: o->prompt_ids = arg; return 0;
  case OPT_TOKENS:
    return dpt_parse_int(arg, 0, 1 << 24, "--tokens", &o->tokens, err, errcap);
  case OPT_GREEDY: o->greedy = 1; return 0;
  case OPT_TEMPERATURE:
    /* the range said as it is, (0, 1e6] (an outside check: "[0, 1e+06]" for
     * -1, while 0 is refused too) */
    if (dpt_parse_float(arg, -FLT_MAX, FLT_MAX, "--temperature", &o->temperature, err,
                        errcap))
      return -1;
    return o->temperature > 0 && o->temperature <= 1e6f
               ? 0
               : dpt_fail(err, errcap, "--temperature: %s is out of range (0, 1e6]%s", arg,
                          o->temperature > 0 ? ""
                                             : " (for the most likely token every time: "
                                               "--greedy)");
  case OPT_TOP_K: return dpt_parse_int(arg, 1, 1 << 30, "--top-k", &o->top_k, err, errcap);
  case OPT_IDS: o->ids = 1; return 0;
  case OPT_SAMPLES:
    return dpt_parse_int(arg, 1, 4096, "--samples", &o->samples, err, errcap);
  }
  return -1;
}

static void usage(FILE *f) {
  fputs("usage: dp generate --checkpoint F.ckpt (--prompt TEXT | --prompt-ids IDS)\n"
        "                   [--tokens N] [--greedy | --temperature X] [--top-k K]\n"
        "                   [--seed S] [--samples K] [--ids] [--devices N]\n"
        "\n"
        "Continues the prompt with a sequence model's checkpoint (input tokens T, embed V\n"
        "D, ...; dp train --save), one token at a time, and prints the text: the prompt,\n"
        "then what the model wrote. Each next token is drawn from the model's\n"
        "distribution at the last position (softmax of the logits / X), among the K most\n"
        "likely ones with --top-k (ties: the lower id), by a generator keyed by the seed,\n"
        "the sample and the position: the same command prints the same text. The model\n"
        "sees at most its context of T tokens: past it, the window slides and the oldest\n"
        "tokens drop out. Inference runs on one plan made at the start (batch = the\n"
        "samples); nothing is allocated per token.\n"
        "\n"
        "  --checkpoint FILE     the model and its parameters\n"
        "  --prompt TEXT         the start, as bytes (ids 0..255: a byte-level model, as\n"
        "                        dp train --text trains)\n"
        "  --prompt-ids IDS      the start as token ids, e.g. \"464,3290,318\" (commas or\n"
        "                        spaces): a model with its own tokenizer; the output is\n"
        "                        then ids too\n"
        "  --tokens N            tokens to generate (default 200)\n"
        "  --greedy              always the most likely token (ties: the lower id)\n"
        "  --temperature X       sample from softmax(logits / X) (default 1)\n"
        "  --top-k K             sample among the K most likely tokens only\n"
        "  --seed S              the generator's seed (default 0)\n"
        "  --samples K           K continuations of the prompt, side by side in one batch\n"
        "                        (--devices splits them)\n"
        "  --ids                 print token ids (one line per sample) instead of text\n"
        "\n"
        "Exit status: 0 generated, 1 the checkpoint cannot be read or is not a sequence\n"
        "model, or the prompt does not fit its vocabulary, 2 usage error.\n\n",
        f);
  dpt_print_common_help(f);
}

/* The state of one `dp generate` run. */
typedef struct {
  generate_opts o;
  dp_config cfg;
  dpt_common common;
  char err[512];
  dp_model *m;
  dp_plan *p;
  dp_ctx *c;
  int T, V;            /* the context and the vocabulary: the ids it reads and writes */
  int L;               /* logits per position (V, or more than the embedding reads) */
  int n_prompt;        /* ids of the prompt */
  int *seq;            /* (samples, n_prompt + tokens): every sample's ids */
  float *x, *y, *prob; /* (samples, T) ids; (samples, T, V) logits; (V) */
  int *top;            /* (top_k): the heap of the K largest */
} generate_run;

/* The command line into t. -1 to go on, else the exit status. */
static int parse_generate(int argc, char **argv, generate_run *t) {
  static const struct option extra[] = {
      {"checkpoint", required_argument, NULL, OPT_CHECKPOINT},
      {"prompt", required_argument, NULL, OPT_PROMPT},
      {"prompt-ids", required_argument, NULL, OPT_PROMPT_IDS},
      {"tokens", required_argument, NULL, OPT_TOKENS},
      {"greedy", no_argument, NULL, OPT_GREEDY},
      {"temperature", required_argument, NULL, OPT_TEMPERATURE},
      {"top-k", required_argument, NULL, OPT_TOP_K},
      {"ids", no_argument, NULL, OPT_IDS},
      {"samples", required_argument, NULL, OPT_SAMPLES},
      {0, 0, 0, 0}};
  generate_opts *o = &t->o;
  o->tokens = 200;
  o->samples = 1;
  int r = dpt_parse_command(argc, argv, extra, on_option, o, usage, &t->cfg, &t->common,
                            t->err, sizeof t->err);
  if (r == DPT_ARGS_HELP) return DPT_EXIT_OK;
  if (r == DPT_ARGS_OK && !o->checkpoint)
    r = dpt_fail(t->err, sizeof t->err, "--checkpoint is required");
  else if (r == DPT_ARGS_OK && !o->prompt == !o->prompt_ids)
    r = dpt_fail(t->err, sizeof t->err,
                 "give the start of the text: --prompt TEXT or --prompt-ids IDS (one)");
  else if (r == DPT_ARGS_OK && o->greedy && (o->temperature > 0 || o->top_k))
    r = dpt_fail(t->err, sizeof t->err,
                 "--greedy takes the most likely token; --temperature and --top-k are for "
                 "sampling: give one or the other");
  else if (r == DPT_ARGS_OK && dpt_world_size() > 1)
    r = dpt_fail(t->err, sizeof t->err,
                 "dp generate runs in one process: run it without mpirun (--devices "
                 "splits the samples)");
  if (r != DPT_ARGS_OK) {
    return dpt_usage_error("generate", t->err, "(see dp generate --help)");
  }
  if (o->temperature == 0) o->temperature = 1.0f;
  return -1;
}

/* The checkpoint's model, which must be a sequence model: 0, or -1 (said). */
static int load_model(generate_run *t) {
  dp_layer_info l0;
  if (dp_ckpt_info(t->o.checkpoint, &t->m, NULL)) {
    fprintf(stderr, "dp generate: %s\n", dpt_user_msg(dp_last_error()));
    return -1;
  }
  if (dp_model_n_layers(t->m) < 1 || dp_model_layer(t->m, 0, &l0) ||
      l0.kind != DP_LAYER_EMBEDDING || dp_model_output_width(t->m) % l0.positions) {
    fprintf(stderr,
            "dp generate: %s is not a sequence model (its spec starts `input tokens T`, "
            "`embed V D`); for other models: dp predict\n",
            t->o.checkpoint);
    return -1;
  }
  t->T = l0.positions;
  t->L = dp_model_output_width(t->m) / l0.positions;
  /* an id past the embedding's vocabulary cannot be fed back: the draw is among
   * the ids both ends know (an outside check: a model of embed 64 and 256
   * logits, as dp train takes it, drew 68 and failed in the next forward) */
  t->V = t->L < l0.vocab ? t->L : l0.vocab;
  if (t->o.top_k > t->V) {
    fprintf(stderr, "dp generate: --top-k %d: the model has %d tokens\n", t->o.top_k, t->V);
    return -1;
  }
  if (t->o.prompt && t->V > 256) {
    fprintf(stderr,
            "dp generate: %s has a vocabulary of %d tokens, not bytes: give the prompt as "
            "ids (--prompt-ids)\n",
            t->o.checkpoint, t->V);
    return -1;
  }
  return 0;
}

/* The prompt's ids into ids[cap] (NULL: count only). Their count, or -1 (said). */
static int prompt_ids(const generate_run *t, int *ids, int cap) {
  const generate_opts *o = &t->o;
  int n = 0;
  if (o->prompt) {
    for (const unsigned char *s = (const unsigned char *)o->prompt; *s; s++, n++) {
      if (*s >= t->V) {
        fprintf(stderr,
                "dp generate: byte %d of the prompt is %d; the model's vocabulary has %d "
                "ids (0 to %d)\n",
                n + 1, *s, t->V, t->V - 1);
        return -1;
      }
      if (ids && n < cap) ids[n] = *s;
    }
  } else {
    bool entry = false; /* an id since the last comma */
    for (const char *s = o->prompt_ids; *s;) {
      /* a comma after nothing, or last: an entry left out */
      if (*s == ',' && (!entry || s[1 + strspn(s + 1, " ")] == '\0')) {
        fprintf(stderr,
                "dp generate: --prompt-ids: an empty entry %s (ids separated by commas or "
                "spaces, e.g. 464,3290,318)\n",
                !entry ? (n ? "between two commas" : "before the first comma")
                       : "after the last comma");
        return -1;
      }
      if (*s == ',' || *s == ' ') {
        entry = *s == ' ' && entry;
        s++;
        continue;
      }
      entry = true;
      char *end;
      /* digits alone: strtol's sign and leading blanks are not an id's (an
       * outside check: "+5,-0" was taken) */
      long v = *s >= '0' && *s <= '9' ? strtol(s, &end, 10) : (end = (char *)s, -1);
      if (end == s || (*end && *end != ',' && *end != ' ') || v < 0 || v >= t->V) {
        /* a separator other than a comma or a space (a tab) is named as such (an
         * outside check, session 24); control bytes escaped by dpt_fail */
        char msg[DPT_MSG_CAP];
        bool sep = end > s && *end && *end != ',' && *end != ' ' && v >= 0 && v < t->V;
        dpt_fail(msg, sizeof msg,
                 "--prompt-ids: '%.*s' (entry %d) is not an id of the model (0 to %d)%s",
                 (int)strcspn(s, ", "), s, n + 1, t->V - 1,
                 sep ? ": ids are separated by commas or spaces" : "");
        fprintf(stderr, "dp generate: %s\n", msg);
        return -1;
      }
      if (ids && n < cap) ids[n] = (int)v;
      n++;
      s = end;
    }
  }
  if (n == 0)
    fprintf(stderr, "dp generate: the prompt is empty: give at least one token\n");
  return n ? n : -1;
}

/* The plan (batch = samples), the context with the checkpoint, the buffers,
 * the prompt in every sample. 0, or -1 (said). */
static int make_context(generate_run *t) {
  dp_config *cfg = &t->cfg;
  int K = t->o.samples, n = prompt_ids(t, NULL, 0);
  if (n < 0) return -1;
  t->n_prompt = n;
  cfg->batch = K;
  cfg->inference = 1;
  if (!dpt_given(&t->common, DPT_OPT_DEVICES)) cfg->n_devices = 1;
  if (dpt_require_backend(cfg, t->err, sizeof t->err)) {
    fprintf(stderr, "dp generate: %s\n", t->err);
    return -1;
  }
  if (dp_plan_create(t->m, cfg, &t->p) || dpt_ctx_create(t->p, &t->c) ||
      dp_ckpt_load(t->c, t->o.checkpoint)) {
    fprintf(stderr, "dp generate: %s\n",
            dpt_user_msg(t->c ? dp_ctx_error(t->c) : dp_last_error()));
    return -1;
  }
  size_t len = (size_t)n + t->o.tokens;
  t->seq = malloc((size_t)K * len * sizeof *t->seq);
  t->x = calloc((size_t)K * t->T, 4);
  t->y = malloc((size_t)K * t->T * t->L * 4);
  t->prob = malloc((size_t)t->V * sizeof *t->prob);
  t->top = malloc((size_t)(t->o.top_k ? t->o.top_k : 1) * sizeof *t->top);
  if (!t->seq || !t->x || !t->y || !t->prob || !t->top) {
    /* what to change (an outside check, session 23: "out of memory" alone) */
    char b[32];
    fprintf(stderr,
            "dp generate: out of memory for %d sample%s of %zu ids (the prompt's %d and "
            "--tokens %d): %s; give fewer --samples or --tokens\n",
            K, K == 1 ? "" : "s", len, n, t->o.tokens,
            dpt_format_bytes((double)K * (double)len * sizeof *t->seq +
                                 (double)K * t->T * (t->L + 1) * 4.0,
                             b, sizeof b));
    return -1;
  }
  for (int k = 0; k < K; k++) prompt_ids(t, t->seq + (size_t)k * len, n);
  return 0;
}

/* A uniform draw in [0, 1) keyed by (seed, sample, position): splitmix64's
 * finaliser over the three, 53 bits. */
static double uniform(uint64_t seed, int sample, size_t pos) {
  uint64_t z = seed ^ (0x9e3779b97f4a7c15ull * ((uint64_t)sample + 1)) ^
               (0xbf58476d1ce4e5b9ull * ((uint64_t)pos + 1));
  for (int i = 0; i < 2; i++) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
  }
  return (double)(z >> 11) * 0x1.0p-53;
}

/* z[a] ranks below z[b]: smaller, or equal with the higher id. */
static int below(const float *z, int a, int b) {
  return z[a] < z[b] || (z[a] == z[b] && a > b);
}

/* The smallest of the K largest logits (by `below`), through a min-heap. */
static int kth_largest(const float *z, int V, int K, int *heap) {
  int n = 0;
  for (int i = 0; i < V; i++) {
    if (n == K && !below(z, heap[0], i)) continue;
    int at;
    if (n < K) { /* sift up */
      at = n++;
      while (at && below(z, i, heap[(at - 1) / 2])) {
        heap[at] = heap[(at - 1) / 2];
        at = (at - 1) / 2;
      }
    } else { /* replace the root, sift down */
      at = 0;
      for (;;) {
        int c = 2 * at + 1;
        if (c >= n) break;
        if (c + 1 < n && below(z, heap[c + 1], heap[c])) c++;
        if (!below(z, heap[c], i)) break;
        heap[at] = heap[c];
        at = c;
      }
    }
    heap[at] = i;
  }
  return heap[0];
}

/* The next token from logits z (V): the most likely one (greedy), or a draw
 * u from softmax(z / temperature) over the K most likely (all V without
 * --top-k), ids in ascending order. -1: the logits are not finite. */
static int next_token(generate_run *t, const float *z, double u) {
  int V = t->V, best = 0;
  for (int i = 1; i < V; i++)
    if (below(z, best, i)) best = i;
  if (!isfinite(z[best])) return -1;
  if (t->o.greedy) return best;
  int cut = t->o.top_k && t->o.top_k < V ? kth_largest(z, V, t->o.top_k, t->top) : -1;
  double sum = 0, inv = 1.0 / t->o.temperature;
  for (int i = 0; i < V; i++) {
    int keep = cut < 0 || !below(z, i, cut);
    t->prob[i] = keep ? (float)exp(((double)z[i] - z[best]) * inv) : 0.0f;
    sum += t->prob[i];
  }
  double target = u * sum, acc = 0;
  int last = best;
  for (int i = 0; i < V; i++) {
    if (t->prob[i] == 0.0f) continue;
    acc += t->prob[i];
    last = i;
    if (acc > target) return i;
  }
  return last; /* rounding left target at the end */
}

/* One id of sample k's output: a byte as text, or the id. */
static void put_token(const generate_run *t, int id, int first) {
  if (t->o.ids || t->o.prompt_ids)
    printf(first ? "%d" : " %d", id);
  else
    putchar(id);
}

/* Tokens one at a time for every sample: the window (the last T ids) in x,
 * one forward, the next ids from the last position's logits. With one
 * sample the text appears as it is made. 0, or -1 (said). */
static int generate(generate_run *t) {
  int K = t->o.samples, T = t->T, L = t->L, n = t->n_prompt;
  size_t len = (size_t)n + t->o.tokens;
  int stream = K == 1;
  if (stream)
    for (int i = 0; i < n; i++) put_token(t, t->seq[i], i == 0);
  for (size_t have = (size_t)n; have < len; have++) {
    int w = have < (size_t)T ? (int)have : T; /* the window: ids have-w .. have-1 */
    for (int k = 0; k < K; k++)
      for (int i = 0; i < w; i++)
        t->x[(size_t)k * T + i] = (float)t->seq[(size_t)k * len + have - w + i];
    if (dp_forward(t->c, K, T, t->x, t->y)) {
      fprintf(stderr, "\ndp generate: %s\n", dpt_user_msg(dp_ctx_error(t->c)));
      return -1;
    }
    for (int k = 0; k < K; k++) {
      const float *z = t->y + ((size_t)k * T + (w - 1)) * L;
      int id = next_token(t, z, uniform(t->cfg.seed, k, have));
      if (id < 0) {
        fprintf(stderr,
                "\ndp generate: sample %d, token %zu: the model's logits are not finite "
                "(inf or nan): the checkpoint's weights overflow\n",
                k + 1, have + 1);
        return -1;
      }
      t->seq[(size_t)k * len + have] = id;
      if (stream) {
        put_token(t, id, 0);
        fflush(stdout);
      }
    }
  }
  for (int k = 0; !stream && k < K; k++) {
    if (k && !(t->o.ids || t->o.prompt_ids)) printf("\n--- sample %d ---\n", k + 1);
    for (size_t i = 0; i < len; i++) put_token(t, t->seq[(size_t)k * len + i], i == 0);
    if (t->o.ids || t->o.prompt_ids) putchar('\n');
  }
  if (!(t->o.ids || t->o.prompt_ids) || stream) putchar('\n');
  return fflush(stdout) ? -1 : 0;
}

int dpt_cmd_generate(int argc, char **argv) {
  generate_run t = {.o = {0}};
  int rc = parse_generate(argc, argv, &t);
  if (rc >= 0) return rc;
  rc = DPT_EXIT_FAIL;
  if (!load_model(&t) && !make_context(&t) && !generate(&t)) rc = DPT_EXIT_OK;
  free(t.seq);
  free(t.x);
  free(t.y);
  free(t.prob);
  free(t.top);
  dp_ctx_free(t.c);
  dp_plan_free(t.p);
  dp_model_free(t.m);
  return rc;
}
