/* Rank agreement for dp train under mpirun (tools/agree.h). Each rank reads
 * its own model, data and options; a rank given another data file of the
 * same row count, or other --epochs, would otherwise train on silently or
 * hang until the library's timeout. So before anything runs, rank 0 gathers
 * every rank's digests, compares them with its own and broadcasts the
 * verdict: one message, printed once, and every rank leaves. */
#include "agree.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The settings text under construction: words appended, cut at the last
 * whole word when full (the digest of the whole text still tells). */
typedef struct {
  char *text;
  size_t len, cap;
  uint64_t h; /* FNV-1a 64 of every word, cut or not */
} words;

static void add_word(words *w, const char *word) {
  size_t n = strlen(word);
  w->h = dp_hash_bytes(&(uint64_t[2]){w->h, dp_hash_bytes(word, n)}, 16);
  if (w->len + n + 2 > w->cap) {
    w->cap = w->len; /* nothing more fits: the words stay whole */
    return;
  }
  if (w->len) w->text[w->len++] = ' ';
  memcpy(w->text + w->len, word, n + 1);
  w->len += n;
}

static void add_int(words *w, const char *name, long long v) {
  char b[96];
  snprintf(b, sizeof b, "%s=%lld", name, v);
  add_word(w, b);
}

/* The shortest decimal that reads back as v: "0.003", for people. */
static void add_float(words *w, const char *name, float v) {
  char b[96], num[32];
  snprintf(b, sizeof b, "%s=%s", name, dpt_float_text(v, num, sizeof num));
  add_word(w, b);
}

static void add_text(words *w, const char *name, const char *v) {
  char b[DPT_AGREE_TEXT];
  snprintf(b, sizeof b, "%s=%s", name, v);
  add_word(w, b);
}

static void add_flag(words *w, const char *name, int on) {
  char b[96];
  snprintf(b, sizeof b, "%c%s", on ? '+' : '-', name);
  add_word(w, b);
}

/* dp train's options as words named as on the command line: the tool's
 * own, then the config's (the plan hash would catch those later, at
 * dp_ctx_create_mpi, but could not name the option). */
static void settings(const dpt_train_inputs *in, words *w) {
  const dp_config *c = in->cfg;
  if (in->steps)
    add_int(w, "steps", in->steps);
  else
    add_int(w, "epochs", in->epochs);
  add_float(w, "test-fraction", in->test_fraction);
  add_int(w, "eval-every", in->eval_every);
  add_int(w, "patience", in->patience);
  static const char *const std_words[] = {"none", "feature", "channel"};
  add_text(w, "standardize",
           std_words[in->standardize >= 0 && in->standardize < 3 ? in->standardize : 0]);
  add_flag(w, "resume", in->resume);
  /* a save is collective (every rank gathers the state, rank 0 writes it): a rank
   * that saves when another does not waits for it until the timeout */
  add_flag(w, "save", in->save);
  add_flag(w, "save-best", in->save_best);
  add_text(w, "save-every", in->save_every ? in->save_every : "(none)");
  add_int(w, "data-seed", (long long)in->data_seed);
  add_flag(w, "no-shuffle", in->no_shuffle);
  add_flag(w, "header", in->header);
  add_text(w, "lr-schedule", in->schedule ? in->schedule : "constant");
  add_int(w, "batch", c->batch);
  /* --devices N, or the GPU ids when they are not 0..N-1 (--devices 1,0) */
  char ids[DP_MAX_DEVICES * 12 + 8];
  int nd = c->n_devices < DP_MAX_DEVICES ? c->n_devices : DP_MAX_DEVICES, identity = 1;
  for (int i = 0; i < nd; i++) identity &= c->device_ids[i] == i;
  snprintf(ids, sizeof ids, "%d", c->n_devices);
  for (int i = 0, n = 0; !identity && i < nd; i++) /* 12 bytes hold any int and a comma */
    n += snprintf(ids + n, sizeof ids - (size_t)n, "%s%d", i ? "," : "", c->device_ids[i]);
  add_text(w, "devices", ids);
  add_int(w, "ranks", c->ranks);
  add_text(w, "split", dp_split_name(c->split));
  add_int(w, "micro-batch", c->micro_batch);
  add_text(w, "mode", dp_mode_name(c->mode));
  add_flag(w, "shard-optimizer", c->shard_optimizer);
  add_text(w, "optimizer", dp_optimizer_name(c->optimizer));
  add_float(w, "lr", c->lr);
  add_float(w, "momentum", c->momentum);
  add_float(w, "dampening", c->dampening);
  add_flag(w, "nesterov", c->nesterov);
  add_float(w, "weight-decay", c->weight_decay);
  add_float(w, "beta1", c->beta1);
  add_float(w, "beta2", c->beta2);
  add_float(w, "eps", c->eps);
  add_flag(w, "amsgrad", c->amsgrad);
  add_int(w, "seed", (long long)c->seed);
  add_float(w, "clip-grad-norm", c->clip_grad_norm);
  add_float(w, "clip-grad-value", c->clip_grad_value);
  add_int(w, "accumulate", c->accumulate);
  add_int(w, "recompute", c->recompute);
  add_text(w, "precision", dp_precision_name(c->precision));
  add_text(w, "reduce-precision", dp_precision_name(c->reduce_precision));
  add_text(w, "batchnorm", dp_bn_mode_name(c->batchnorm));
  add_text(w, "backend", dp_backend_name(c->backend));
  add_text(w, "transport", dp_transport_name(c->transport));
  /* the backend's own options (--graph, --tf32, --fast-collectives,
   * --backend-option) as one word: items joined by commas */
  char bo[DP_BACKEND_OPTIONS_CAP];
  snprintf(bo, sizeof bo, "%s", c->backend_options[0] ? c->backend_options : "(none)");
  for (char *q = bo; *q; q++)
    if (*q == ' ' || *q == '\t') *q = ',';
  add_text(w, "backend-options", bo);
  for (const char *e = in->extra; e && *e;) {
    size_t n = strcspn(e, " ");
    if (n) {
      char word[DPT_AGREE_TEXT];
      snprintf(word, sizeof word, "%.*s", (int)n, e);
      add_word(w, word);
    }
    e += n + (e[n] == ' ');
  }
}

/* The rows as read, bit for bit, with their shape (a binary file's features
 * as they are in it; a sequence's windows: T labels a row; 0 for none). */
static uint64_t data_digest(const dpt_dataset *d) {
  if (!d) return 0;
  size_t rows = (size_t)d->n_rows, nf = (size_t)d->n_features;
  size_t lw = d->label_width > 1 ? (size_t)d->label_width : 1;
  size_t w = d->x ? 4 : d->xtype == DPT_X_F64 ? 8 : d->xtype == DPT_X_U8 ? 1 : 4;
  uint64_t h[7] = {
      (uint64_t)d->n_rows,
      (uint64_t)d->n_features,
      (uint64_t)d->n_targets,
      (uint64_t)d->n_classes,
      dp_hash_bytes(d->x ? (const void *)d->x : (const void *)d->xmap, rows * nf * w),
      d->label ? dp_hash_bytes(d->label, rows * lw * sizeof *d->label)
               : dp_hash_bytes(d->y, rows * (size_t)d->n_targets * 4),
      (uint64_t)d->xtype};
  return dp_hash_bytes(h, d->xtype ? sizeof h : sizeof h - 8); /* CSV: as before */
}

int dpt_agree_record(const dpt_train_inputs *in, dpt_agree_rec *r) {
  memset(r, 0, sizeof *r);
  size_t n = dp_model_format(in->model, NULL, 0);
  char *spec = malloc(n + 1);
  if (!spec) return -1;
  dp_model_format(in->model, spec, n + 1);
  r->model = dp_hash_bytes(spec, n);
  free(spec);
  if (in->model_more) {
    uint64_t both[2] = {r->model, in->model_more};
    r->model = dp_hash_bytes(both, sizeof both);
  }
  r->data = data_digest(in->data);
  if (in->val) { /* the validation set is data too */
    uint64_t both[2] = {r->data, data_digest(in->val)};
    r->data = dp_hash_bytes(both, sizeof both);
  }
  r->rows = in->data->n_rows;
  r->predict = in->predict;
  words w = {.text = r->text, .cap = sizeof r->text};
  settings(in, &w);
  r->settings = w.h;
  return 0;
}

/* The first word of a's settings that differs from b's, as "--name value"
 * (valued), "--name" / "no --name" (flags), into x and y. 0: no word differs
 * (the difference lies past the text kept). */
static int first_setting(const char *a, const char *b, char *x, char *y, size_t cap) {
  while (*a || *b) {
    size_t la = strcspn(a, " "), lb = strcspn(b, " ");
    if (la != lb || memcmp(a, b, la)) {
      const char *v[2] = {a, b};
      size_t l[2] = {la, lb};
      char *out[2] = {x, y};
      for (int k = 0; k < 2; k++) {
        const char *eq = memchr(v[k], '=', l[k]);
        if (l[k] == 0)
          snprintf(out[k], cap, "(nothing)");
        else if (v[k][0] == '+' || v[k][0] == '-')
          snprintf(out[k], cap, "%s--%.*s", v[k][0] == '+' ? "" : "no ", (int)l[k] - 1,
                   v[k] + 1);
        else if (eq)
          snprintf(out[k], cap, "--%.*s %.*s", (int)(eq - v[k]), v[k],
                   (int)(l[k] - (size_t)(eq - v[k]) - 1), eq + 1);
        else
          snprintf(out[k], cap, "%.*s", (int)l[k], v[k]);
      }
      return 1;
    }
    a += la + (a[la] == ' ');
    b += lb + (b[lb] == ' ');
  }
  return 0;
}

/* What rank q's record r differs in from rank 0's r0, for people; 0: nothing. */
static int differs(int q, const dpt_agree_rec *r, const dpt_agree_rec *r0, char *err,
                   size_t errcap) {
  if (r->model != r0->model) {
    snprintf(err, errcap,
             "rank %d's model differs from rank 0's (spec digest %016llx; rank 0's "
             "%016llx): give every rank the same %s file",
             q, (unsigned long long)r->model, (unsigned long long)r0->model,
             r0->predict ? "--checkpoint" : "--model");
    return 1;
  }
  if (r->data != r0->data) {
    snprintf(err, errcap,
             "rank %d's %sdata differs from rank 0's (%lld rows, digest %016llx; "
             "rank 0's: %lld rows, digest %016llx): give every rank the same --data file",
             q, r0->predict ? "" : "training ", (long long)r->rows,
             (unsigned long long)r->data, (long long)r0->rows,
             (unsigned long long)r0->data);
    return 1;
  }
  if (r->settings != r0->settings) {
    char x[160], y[160];
    if (first_setting(r->text, r0->text, x, y, sizeof x))
      snprintf(err, errcap,
               "rank %d runs with %s, rank 0 with %s: give every rank the same options", q,
               x, y);
    else
      snprintf(err, errcap,
               "rank %d's options differ from rank 0's (digest %016llx; rank 0's %016llx): "
               "give every rank the same options",
               q, (unsigned long long)r->settings, (unsigned long long)r0->settings);
    return 1;
  }
  return 0;
}

int dpt_agree_compare(const dpt_agree_rec *recs, int n, char *err, size_t errcap) {
  int first = 0, others = 0;
  char msg[768];
  for (int q = 1; q < n; q++)
    if (differs(q, &recs[q], &recs[0], msg, first ? 0 : sizeof msg)) {
      if (!first)
        first = q;
      else
        others++;
    }
  if (first) {
    /* the first rank names what differs; how many more, so none is missed */
    char more[96] = "";
    if (others)
      snprintf(more, sizeof more, " (%d more rank%s differ%s from rank 0)", others,
               others == 1 ? "" : "s", others == 1 ? "s" : "");
    snprintf(err, errcap, "the ranks disagree: %s%s", msg, more);
  }
  return first;
}

int dpt_agree_train(const dpt_train_inputs *in, char *err, size_t errcap) {
  if (errcap) *err = '\0';
  int R = dpt_world_size(), me = dpt_world_rank();
  if (R == 1) return 0;
  dpt_agree_rec *mine = malloc(sizeof *mine),
                *all = me == 0 ? malloc((size_t)R * sizeof *all) : NULL;
  int oom = !mine || (me == 0 && !all) || dpt_agree_record(in, mine);
  /* agreed before the gather: a rank that could not make its record would
   * leave the others waiting in it (the review of session 25) */
  if (dpt_world_max_int(oom)) {
    free(mine);
    free(all);
    if (errcap) snprintf(err, errcap, "%s", oom ? "out of memory" : "");
    dpt_world_failed_together(); /* the failing rank says it */
    return -1;
  }
  int bad = 0;
  if (dpt_world_gather(mine, sizeof *mine, all)) {
    snprintf(err, errcap, "the ranks could not exchange their inputs' digests");
    bad = -1;
  }
  if (!bad && me == 0) bad = dpt_agree_compare(all, R, err, errcap);
  free(mine);
  free(all);
  if (bad < 0) return -1;
  if (!dpt_world_bcast_int(bad)) return 0;
  if (me != 0 && errcap) *err = '\0'; /* rank 0 says it, once */
  dpt_world_failed_together();
  return -1;
}
