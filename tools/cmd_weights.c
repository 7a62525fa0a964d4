/* `dp export` and `dp import`: weights between libdp checkpoints and
 * PyTorch's safetensors files (the state_dict of the model's nn.Sequential). */
#include "cli.h"
#include "data.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OPT_SAFETENSORS = DPT_OPT_USER, OPT_MODEL, OPT_OUT, OPT_PYTORCH, OPT_CHECKPOINT };

/* A command's command line: its own options, the config and common options
 * (dpt_parse_args) and its one input file. */
typedef struct {
  const char *safetensors, *model, *out, *pytorch;
  const char
      *checkpoint; /* dp export --checkpoint F: F as the argument, as predict takes it */
  dp_config cfg;
  dpt_common common;
  const char *in;
} weights_opts;

static int on_option(void *user, int code, const char *arg, char *err, size_t errcap) {
  weights_opts *o = user;
  (void)err, (void)errcap;
  switch (code) {
  case OPT_SAFETENSORS: o->safetensors = arg; return 0;
  case OPT_MODEL: o->model = arg; return 0;
  case OPT_OUT: o->out = arg; return 0;
  case OPT_PYTORCH: o->pytorch = arg; return 0;
  case OPT_CHECKPOINT: o->checkpoint = arg; return 0;
  }
  return -1;
}

static void export_usage(FILE *f) {
  fputs(
      "usage: dp export CHECKPOINT [--safetensors FILE] [--pytorch FILE.py]\n"
      "       (or --checkpoint CHECKPOINT, as dp predict and dp generate take it)\n"
      "       dp export --model M.dpm --pytorch FILE.py\n"
      "\n"
      "Writes the parameters of a libdp checkpoint (dp train --save, dp_ckpt_save) as\n"
      "a safetensors file that PyTorch loads into the model's nn.Sequential:\n"
      "\n"
      "  model.load_state_dict(safetensors.torch.load_file(FILE))\n"
      "\n"
      "Tensors are named and shaped as that state_dict: \"0.weight\" (out, in) and\n"
      "\"0.bias\" (out) for a linear layer at index 0 (layers counted after `input`),\n"
      "\"k.weight\" and \"k.bias\" (width) for a layernorm at k; F32. The model comes\n"
      "from the checkpoint itself; its spec text is in the file's metadata\n"
      "(\"libdp_model\"). Any checkpoint works, whatever device count or mode saved it.\n"
      "The input standardisation of its dp train run (dp train --standardize) goes\n"
      "into the metadata too: \"dp.standardize\" (none, feature or channel), \"dp.mean\"\n"
      "and \"dp.std\" (comma-separated decimals, exact); dp import reads them back, and\n"
      "dp export prints a summary of them.\n"
      "\n"
      "--pytorch FILE.py writes the model as PyTorch source: build() returns an\n"
      "nn.Module with those tensor names (each layer registered under its index;\n"
      "residual blocks, embeddings and attention included) whose forward is the\n"
      "spec's, so that m = build(); m.load_state_dict(load_file(FILE), strict=True)\n"
      "gives libdp's outputs (a token model: (B, T) ids to (B, T, V) logits). With a\n"
      "standardisation, the module's first step applies it: it takes raw rows, as\n"
      "dp predict does.\n"
      "At least one of --safetensors and --pytorch. With --model M.dpm and no\n"
      "checkpoint, the source of that spec's model alone (PyTorch initialises it;\n"
      "dp import takes its weights back).\n"
      "\n"
      "Exit status: 0 written, 1 the checkpoint could not be read or the file written,\n"
      "2 usage error.\n",
      f);
}

static void import_usage(FILE *f) {
  fputs(
      "usage: dp import SAFETENSORS --model M.dpm --out CHECKPOINT [options]\n"
      "\n"
      "Makes a libdp checkpoint at step 0 from PyTorch weights: the safetensors file\n"
      "must hold exactly the model's tensors (the state_dict of its nn.Sequential, F32;\n"
      "see dp export --help), e.g. a PyTorch-initialised model saved with\n"
      "safetensors.torch.save_file(model.state_dict(), FILE). Train from it with\n"
      "\n"
      "  dp train --resume CHECKPOINT --model M.dpm ... (the same --optimizer and --seed)\n"
      "\n"
      "The optimizer, its hyper-parameters and the seed are the common options below;\n"
      "the checkpoint records them, and a resume checks the optimizer and seed match.\n"
      "A standardisation in the file's metadata (dp export's dp.standardize, dp.mean,\n"
      "dp.std) is kept in the checkpoint, for dp predict and dp train --resume.\n"
      "\n",
      f);
  dpt_print_common_help(f);
  fputs("\nExit status: 0 written, 1 the weights do not fit the model or a file could not\n"
        "be read or written, 2 usage error.\n",
        f);
}

/* Parses the command line into *o; --help prints usage(stdout). Returns -1 to
 * go on, else the exit status. */
static int parse(int argc, char **argv, const char *cmd, void (*usage)(FILE *),
                 int need_model, weights_opts *o) {
  memset(o, 0, sizeof *o);
  dpt_common *common = &o->common;
  static const struct option extra[] = {
      {"safetensors", required_argument, NULL, OPT_SAFETENSORS},
      {"model", required_argument, NULL, OPT_MODEL},
      {"out", required_argument, NULL, OPT_OUT},
      {"pytorch", required_argument, NULL, OPT_PYTORCH},
      {"checkpoint", required_argument, NULL, OPT_CHECKPOINT},
      {0, 0, 0, 0}};
  char err[512];
  int r = dpt_parse_args(argc, argv, extra, on_option, o, &o->cfg, common, err, sizeof err);
  if (r == DPT_ARGS_HELP) {
    usage(stdout);
    return DPT_EXIT_OK;
  }
  /* dp export --model M.dpm --pytorch F.py: the source alone, from a spec */
  bool spec_only =
      !need_model && o->model && o->pytorch && !o->safetensors && !o->out && !o->checkpoint;
  if (r == DPT_ARGS_OK && spec_only && common->n_args == 0) return -1;
  if (r == DPT_ARGS_OK && o->checkpoint && (need_model || common->n_args)) {
    snprintf(err, sizeof err, "%s",
             need_model ? "--checkpoint is dp export's (dp import reads a safetensors file)"
                        : "the checkpoint twice: as an argument and with --checkpoint");
    r = DPT_ARGS_ERROR;
  }
  if (r == DPT_ARGS_OK && o->checkpoint) {
    o->in = o->checkpoint;
    common->n_args = 1;
  }
  if (r == DPT_ARGS_OK && common->n_args != 1) {
    snprintf(err, sizeof err, "%s",
             common->n_args ? "one input file, please"
             : need_model   ? "which safetensors file?"
                            : "which checkpoint?");
    r = DPT_ARGS_ERROR;
  }
  if (r == DPT_ARGS_OK && !need_model &&
      ((!o->safetensors && !o->pytorch) || o->model || o->out)) {
    /* --out beside an output: not "--safetensors is required" when it was given (an
     * outside check) */
    snprintf(err, sizeof err, "%s",
             o->model ? "--model goes with --pytorch alone and no checkpoint (dp export "
                        "--model M.dpm --pytorch F.py)"
             : o->out && (o->safetensors || o->pytorch)
                 ? "--out is dp import's; dp export writes to --safetensors FILE and "
                   "--pytorch FILE.py: leave --out out"
                 : "--safetensors FILE or --pytorch FILE.py is required (--out is "
                   "dp import's)");
    r = DPT_ARGS_ERROR;
  }
  if (r == DPT_ARGS_OK && need_model && (o->safetensors || o->pytorch)) {
    snprintf(err, sizeof err,
             "--safetensors is dp export's; dp import reads the safetensors file named "
             "as its argument");
    r = DPT_ARGS_ERROR;
  }
  if (r == DPT_ARGS_OK && need_model && (!o->model || !o->out)) {
    snprintf(err, sizeof err, "--model and --out are required");
    r = DPT_ARGS_ERROR;
  }
  if (r != DPT_ARGS_OK) {
    char hint[48];
    snprintf(hint, sizeof hint, "(see dp %s --help)", cmd);
    return dpt_usage_error(cmd, err, hint);
  }
  if (!o->checkpoint) o->in = argv[common->first_arg];
  return -1;
}

/* The model, plan and context a command makes. */
typedef struct {
  dp_model *m;
  dp_plan *p;
  dp_ctx *c;
} weights_rig;

/* Frees what w holds; returns rc. */
static int finish(weights_rig *w, int rc) {
  dp_ctx_free(w->c);
  dp_plan_free(w->p);
  dp_model_free(w->m);
  return rc;
}

/* "dp <cmd>: <libdp's message>" (the context's once there is one), then finish. */
static int lib_fail(const char *cmd, weights_rig *w) {
  fprintf(stderr, "dp %s: %s\n", cmd,
          dpt_user_msg(w->c ? dp_ctx_error(w->c) : dp_last_error()));
  return finish(w, DPT_EXIT_FAIL);
}

/* Outputs that are not the input (nor a link to it) and can be written; 0, or
 * -1 (said). */
static int check_outputs(const dpt_file_role *outs, int n_out, const dpt_file_role *in) {
  char err[512];
  int bad = dpt_check_distinct(outs, n_out, in, 1, err, sizeof err);
  for (int k = 0; k < n_out && !bad; k++)
    bad = dpt_check_writable(outs[k].path, outs[k].what, 1, err, sizeof err);
  if (bad) fprintf(stderr, "dp export: %s\n", err);
  return bad ? -1 : 0;
}

/* dp export --model M.dpm --pytorch F.py */
static int export_spec(const weights_opts *o) {
  dp_model *m = NULL;
  dp_file *f = NULL;
  /* an outside check (session 24): --pytorch naming the spec itself, or a link
   * to it, replaced the spec */
  dpt_file_role out = {o->pytorch, "PyTorch source"}, in = {o->model, "model"};
  if (check_outputs(&out, 1, &in)) return DPT_EXIT_FAIL;
  if (dp_model_load(o->model, &m) || dp_file_create(o->pytorch, "PyTorch source", &f)) {
    fprintf(stderr, "dp export: %s\n", dpt_user_msg(dp_last_error()));
    dp_model_free(m);
    return DPT_EXIT_FAIL;
  }
  int bad = dpt_write_pytorch(m, NULL, dp_file_stream(f));
  if (bad) dp_file_discard(f);
  if (bad || dp_file_commit(f)) {
    fprintf(stderr, "dp export: %s\n",
            bad ? "cannot write the source (out of memory)"
                : dpt_user_msg(dp_last_error()));
    dp_model_free(m);
    return DPT_EXIT_FAIL;
  }
  printf("dp export: %s as PyTorch source -> %s (build())\n", o->model, o->pytorch);
  dp_model_free(m);
  return DPT_EXIT_OK;
}

/* The checkpoint's parameters to the safetensors file, with the
 * standardisation of its dp train record in the metadata. 0, or -1 (said). */
static int export_weights(weights_rig *w, const char *ckpt, const char *path,
                          const dpt_scaler *sc, int has_record) {
  dp_meta pairs[3];
  char *text = NULL;
  int n = has_record ? dpt_scaler_meta(sc, pairs, &text) : 0;
  if (n < 0) {
    fprintf(stderr, "dp export: out of memory\n");
    return -1;
  }
  dp_status s = dp_ckpt_export_safetensors_meta(w->c, path, pairs, n);
  free(text);
  if (s) {
    fprintf(stderr, "dp export: %s\n", dpt_user_msg(dp_ctx_error(w->c)));
    return -1;
  }
  /* the file's tensors: the parameters', and batchnorm's running_mean,
   * running_var and num_batches_tracked */
  int bufs = 0;
  for (int i = 0; i < dp_model_n_layers(w->m); i++)
    bufs += dp_model_layer_kind(w->m, i) == DP_LAYER_BATCHNORM ? 3 : 0;
  int nt = dp_model_n_tensors(w->m);
  printf("dp export: %s (%d tensors", ckpt, nt + bufs);
  if (bufs) printf(": %d of parameters, %d batchnorm buffers", nt, bufs);
  printf("; %zu parameters) -> %s\n", dp_model_n_params(w->m), path);
  return 0;
}

int dpt_cmd_export(int argc, char **argv) {
  weights_opts o;
  int r = parse(argc, argv, "export", export_usage, 0, &o);
  if (r >= 0) return r;
  if (!o.in) return export_spec(&o);
  const char *ckpt = o.in;
  char err[512];
  dpt_file_role outs[2], in = {ckpt, "checkpoint"};
  int n_out = 0;
  if (o.safetensors) outs[n_out++] = (dpt_file_role){o.safetensors, "safetensors file"};
  if (o.pytorch) outs[n_out++] = (dpt_file_role){o.pytorch, "PyTorch source"};
  if (check_outputs(outs, n_out, &in)) return DPT_EXIT_FAIL;
  weights_rig w = {0};
  dp_ckpt_summary info;
  /* the parameters only: an inference context of one device takes any checkpoint */
  dp_config cfg;
  dp_config_default(&cfg);
  cfg.batch = 1;
  cfg.inference = 1;
  if (dp_ckpt_info(ckpt, &w.m, &info) || dp_plan_create(w.m, &cfg, &w.p) ||
      dp_ctx_create(w.p, &w.c) || dp_ckpt_load(w.c, ckpt))
    return lib_fail("export", &w);
  /* dp train's standardisation travels with the weights */
  dpt_scaler sc;
  int has_record = 0, rc = DPT_EXIT_FAIL;
  if (dpt_ckpt_scaler(ckpt, &sc, &has_record, err, sizeof err)) {
    fprintf(stderr, "dp export: %s\n", err);
    return finish(&w, DPT_EXIT_FAIL);
  }
  if (o.safetensors && export_weights(&w, ckpt, o.safetensors, &sc, has_record)) goto done;
  if (o.pytorch) {
    dp_file *f = NULL;
    if (dp_file_create(o.pytorch, "PyTorch source", &f)) {
      fprintf(stderr, "dp export: %s\n", dpt_user_msg(dp_last_error()));
      goto done;
    }
    if (dpt_write_pytorch(w.m, &sc, dp_file_stream(f))) {
      dp_file_discard(f);
      fprintf(stderr, "dp export: cannot write %s (out of memory or disk)\n", o.pytorch);
      goto done;
    }
    if (dp_file_commit(f)) { /* it frees f either way */
      fprintf(stderr, "dp export: %s\n", dpt_user_msg(dp_last_error()));
      goto done;
    }
    printf("dp export: %s's model as PyTorch source -> %s (build()%s)\n", ckpt, o.pytorch,
           sc.n ? ", which standardises its input first" : "");
  }
  char text[256];
  dpt_scaler_summary(&sc, text, sizeof text);
  if (has_record)
    printf("standardisation: %s%s\n", text,
           !o.safetensors ? ""
           : sc.n         ? " (in the metadata: dp.standardize, dp.mean, dp.std)"
                          : " (in the metadata: dp.standardize)");
  else
    printf("standardisation: none recorded (no dp train run in %s): the model takes the "
           "features as they are\n",
           ckpt);
  rc = DPT_EXIT_OK;
done:
  dpt_scaler_free(&sc);
  return finish(&w, rc);
}

/* The standardisation in the safetensors file's metadata, checked against
 * the model: 1 found, 0 none there, -1 (err). */
static int read_standardize(const char *st, const dp_model *m, dpt_scaler *sc, char *err,
                            size_t errcap) {
  dp_meta *meta = NULL;
  int n = 0, c, h, w;
  memset(sc, 0, sizeof *sc);
  if (dp_safetensors_read_meta(st, &meta, &n))
    return dpt_fail(err, errcap, "%s", dpt_user_msg(dp_last_error()));
  int found = dpt_scaler_from_meta(meta, n, sc, err, errcap);
  free(meta);
  dpt_model_image(m, &c, &h, &w);
  if (found > 0 && dpt_scaler_fits(sc, dp_model_input_width(m), c, err, errcap)) {
    dpt_scaler_free(sc);
    return -1;
  }
  return found;
}

int dpt_cmd_import(int argc, char **argv) {
  weights_opts o;
  int r = parse(argc, argv, "import", import_usage, 1, &o);
  if (r >= 0) return r;
  const char *st = o.in;
  dp_config *cfg = &o.cfg;
  char err[512];
  weights_rig w = {0};
  dpt_file_role out = {o.out, "checkpoint"},
                ins[] = {{st, "safetensors file"}, {o.model, "model"}};
  if (dpt_check_distinct(&out, 1, ins, 2, err, sizeof err) ||
      dpt_load_model(o.model, &w.m, err, sizeof err) ||
      dpt_require_loss(o.model, w.m, NULL, err, sizeof err) ||
      dpt_check_writable(o.out, "checkpoint", 1, err, sizeof err)) {
    fprintf(stderr, "dp import: %s\n", err);
    return finish(&w, DPT_EXIT_FAIL);
  }
  /* the checkpoint is layout-free: one device plans it; the batch is any */
  cfg->n_devices = 1;
  cfg->ranks = 1;
  if (!cfg->batch) cfg->batch = 1;
  if (dp_plan_create(w.m, cfg, &w.p) || dp_ctx_create(w.p, &w.c) ||
      dp_ckpt_import_safetensors(w.c, st))
    return lib_fail("import", &w);
  /* the standardisation in the file's metadata (dp export's) becomes the
   * checkpoint's run record, so that dp predict and a resume use it */
  dpt_scaler sc;
  int found = read_standardize(st, w.m, &sc, err, sizeof err);
  if (found < 0) { /* the library's messages name the file already */
    bool named = strncmp(err, "safetensors file '", 18) == 0;
    fprintf(stderr, "dp import: %s%s%s%s\n", named ? "" : "safetensors file '",
            named ? "" : st, named ? "" : "': ", err);
    return finish(&w, DPT_EXIT_FAIL);
  }
  size_t n = 0;
  char *run = found ? dpt_run_text(0, 0, &sc, NULL, &n) : NULL;
  dp_status s = found && !run ? DP_ERR_NOMEM
                : found       ? dp_ckpt_save_app(w.c, o.out, run, n)
                              : dp_ckpt_save(w.c, o.out);
  free(run);
  char text[256];
  dpt_scaler_summary(&sc, text, sizeof text);
  dpt_scaler_free(&sc);
  if (s == DP_ERR_NOMEM && found && !run) {
    fprintf(stderr, "dp import: out of memory\n");
    return finish(&w, DPT_EXIT_FAIL);
  }
  if (s) return lib_fail("import", &w);
  printf("dp import: %s -> %s (step 0, %s, seed %llu)\n", st, o.out,
         dp_optimizer_name(dp_plan_config(w.p)->optimizer), (unsigned long long)cfg->seed);
  if (found) printf("standardisation: %s (from the file's metadata)\n", text);
  return finish(&w, DPT_EXIT_OK);
}
