/* `dp export` and `dp import`: weights between libdp checkpoints and
 * PyTorch's safetensors files (the state_dict of the model's nn.Sequential). */
#include "cli.h"

#include <stdio.h>
#include <string.h>

enum { OPT_SAFETENSORS = DPT_OPT_USER, OPT_MODEL, OPT_OUT };

typedef struct {
  const char *safetensors, *model, *out;
} weights_opts;

static int on_option(void *user, int code, const char *arg, char *err, size_t errcap) {
  weights_opts *o = user;
  (void)err, (void)errcap;
  switch (code) {
  case OPT_SAFETENSORS: o->safetensors = arg; return 0;
  case OPT_MODEL: o->model = arg; return 0;
  case OPT_OUT: o->out = arg; return 0;
  }
  return -1;
}

static void export_usage(FILE *f) {
  fputs("usage: dp export CHECKPOINT --safetensors FILE\n"
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
      "\n",
      f);
  dpt_print_common_help(f);
  fputs("\nExit status: 0 written, 1 the weights do not fit the model or a file could not\n"
        "be read or written, 2 usage error.\n",
        f);
}

static int parse(int argc, char **argv, const char *cmd, weights_opts *o, dp_config *cfg,
                 dpt_common *common, int need_model) {
  static const struct option extra[] = {
      {"safetensors", required_argument, NULL, OPT_SAFETENSORS},
      {"model", required_argument, NULL, OPT_MODEL},
      {"out", required_argument, NULL, OPT_OUT},
      {0, 0, 0, 0}};
  char err[512];
  int r = dpt_parse_args(argc, argv, extra, on_option, o, cfg, common, err, sizeof err);
  if (r == DPT_ARGS_HELP) return DPT_ARGS_HELP;
  if (r == DPT_ARGS_OK && common->n_args != 1) {
    snprintf(err, sizeof err, "%s",
             common->n_args ? "one input file, please"
             : need_model   ? "which safetensors file?"
                            : "which checkpoint?");
    r = DPT_ARGS_ERROR;
  }
  if (r == DPT_ARGS_OK && !need_model && (!o->safetensors || o->model || o->out)) {
    snprintf(err, sizeof err,
             "--safetensors FILE is required (and --model, --out are "
             "dp import's)");
    r = DPT_ARGS_ERROR;
  }
  if (r == DPT_ARGS_OK && need_model && o->safetensors) {
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
    fprintf(stderr, "dp %s: %s\n(see dp %s --help)\n", cmd, err, cmd);
    return DPT_ARGS_ERROR;
  }
  return DPT_ARGS_OK;
}

int dpt_cmd_export(int argc, char **argv) {
  weights_opts o = {0};
  dp_config cfg;
  dpt_common common;
  int r = parse(argc, argv, "export", &o, &cfg, &common, 0);
  if (r == DPT_ARGS_HELP) {
    export_usage(stdout);
    return DPT_EXIT_OK;
  }
  if (r) return DPT_EXIT_USAGE;
  const char *ckpt = argv[common.first_arg];
  char err[512];
  dp_model *m = NULL;
  dp_plan *p = NULL;
  dp_ctx *c = NULL;
  int rc = DPT_EXIT_FAIL;
  if (dpt_check_writable(o.safetensors, "safetensors file", 1, err, sizeof err)) {
    fprintf(stderr, "dp export: %s\n", err);
    return DPT_EXIT_FAIL;
  }
  dp_ckpt_summary info;
  /* the parameters only: an inference context of one device takes any checkpoint */
  dp_config_default(&cfg);
  cfg.batch = 1;
  cfg.inference = 1;
  if (dp_ckpt_info(ckpt, &m, &info) || dp_plan_create(m, &cfg, &p) ||
      dp_ctx_create(p, &c) || dp_ckpt_load(c, ckpt) ||
      dp_ckpt_export_safetensors(c, o.safetensors)) {
    fprintf(stderr, "dp export: %s\n", dpt_user_msg(c ? dp_ctx_error(c) : dp_last_error()));
    goto out;
  }
  printf("dp export: %s (%d tensors, %zu parameters) -> %s\n", ckpt, dp_model_n_tensors(m),
         dp_model_n_params(m), o.safetensors);
  rc = DPT_EXIT_OK;
out:
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
  return rc;
}

int dpt_cmd_import(int argc, char **argv) {
  weights_opts o = {0};
  dp_config cfg;
  dpt_common common;
  int r = parse(argc, argv, "import", &o, &cfg, &common, 1);
  if (r == DPT_ARGS_HELP) {
    import_usage(stdout);
    return DPT_EXIT_OK;
  }
  if (r) return DPT_EXIT_USAGE;
  const char *st = argv[common.first_arg];
  char err[512];
  dp_model *m = NULL;
  dp_plan *p = NULL;
  dp_ctx *c = NULL;
  int rc = DPT_EXIT_FAIL;
  if (dpt_load_model(o.model, &m, err, sizeof err) ||
      dpt_require_loss(o.model, m, NULL, err, sizeof err) ||
      dpt_check_writable(o.out, "checkpoint", 1, err, sizeof err)) {
    fprintf(stderr, "dp import: %s\n", err);
    goto out;
  }
  /* the checkpoint is layout-free: one device plans it; the batch is any */
  cfg.n_devices = 1;
  cfg.ranks = 1;
  if (!cfg.batch) cfg.batch = 1;
  if (dp_plan_create(m, &cfg, &p) || dp_ctx_create(p, &c) ||
      dp_ckpt_import_safetensors(c, st) || dp_ckpt_save(c, o.out)) {
    fprintf(stderr, "dp import: %s\n", dpt_user_msg(c ? dp_ctx_error(c) : dp_last_error()));
    goto out;
  }
  printf("dp import: %s -> %s (step 0, %s, seed %llu)\n", st, o.out,
         dp_optimizer_name(dp_plan_config(p)->optimizer), (unsigned long long)cfg.seed);
  rc = DPT_EXIT_OK;
out:
  dp_ctx_free(c);
  dp_plan_free(p);
  dp_model_free(m);
  return rc;
}
