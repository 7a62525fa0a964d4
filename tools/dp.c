/* `dp`: the libdp command-line tool. Dispatches `dp <command> [options]` to
 * the command's function (tools/cmd_*.c); each returns the exit status. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

typedef struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} command;

static const command commands[] = {
    {"plan", dpt_cmd_plan,
     "plan a step without running it: every byte of every device's arena\n"
     "            (per region, per device), the largest batch that fits a memory\n"
     "            budget (--budget), the static schedule (--schedule); table,\n"
     "            --json or --svg"},
    {"train", dpt_cmd_train,
     "train a model with data parallelism on the cpu or cuda backend, in\n"
     "            the planned arenas (no allocation after start-up)"},
    {"repro", dpt_cmd_repro,
     "check that training gives the same bits for several device counts and\n"
     "            modes (classic, allreduce, sharded); names the first step and\n"
     "            tensor where two configurations differ"},
    {"bench", dpt_cmd_bench,
     "measure: one core's FMA peak, GEMM GFLOP/s, ms per training step,\n"
     "            transport bytes/s, scaling with batch, width and devices; on a\n"
     "            GPU, the cuda step with and without CUDA graphs (gpu-step) and\n"
     "            its GEMMs alone (gpu-gemm)"},
};
#define N_COMMANDS ((int)(sizeof commands / sizeof *commands))

static void usage(FILE *f) {
  fprintf(f,
          "usage: dp <command> [options]\n"
          "       dp <command> --help     the command's options\n"
          "       dp help [<command>]     this text, or the command's\n"
          "       dp --version\n"
          "\n"
          "libdp %d.%d: data-parallel training and inference (like PyTorch's\n"
          "nn.DataParallel) with every byte of memory planned into fixed per-device\n"
          "arenas.\n"
          "\n"
          "Commands:\n",
          DP_VERSION_MAJOR, DP_VERSION_MINOR);
  for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-8s  %s\n", commands[i].name, commands[i].summary);
  fputs("\n"
        "Every command takes the same configuration options (--batch, --devices,\n"
        "--split, --micro-batch, --mode, --optimizer, --inference, --backend, --lr,\n"
        "--momentum, --weight-decay, --seed, --graph, --tf32, --transport, ...) with\n"
        "the same meaning.\n"
        "\n"
        "Exit status: 0 ok, 1 failure (model, planning, run-time, I/O), 2 usage error.\n"
        "\n"
        "Example:\n"
        "  dp plan --model examples/seed.dpm --batch 30 --devices 2\n",
        f);
}

static const command *find(const char *name) {
  for (int i = 0; i < N_COMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0) return &commands[i];
  return NULL;
}

static int unknown(const char *name) {
  fprintf(stderr, "dp: unknown command '%s'\n\n", name);
  usage(stderr);
  return DPT_EXIT_USAGE;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return DPT_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
    usage(stdout);
    return DPT_EXIT_OK;
  }
  if (strcmp(cmd, "help") == 0) {
    if (argc == 2) {
      usage(stdout);
      return DPT_EXIT_OK;
    }
    const command *c = find(argv[2]);
    if (!c) return unknown(argv[2]);
    char help[] = "--help";
    char *args[] = {argv[2], help, NULL};
    return c->run(2, args);
  }
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
    printf("dp (libdp) %d.%d\n", DP_VERSION_MAJOR, DP_VERSION_MINOR);
    return DPT_EXIT_OK;
  }
  if (cmd[0] == '-') {
    fprintf(stderr, "dp: unknown option '%s' (options go after the command)\n\n", cmd);
    usage(stderr);
    return DPT_EXIT_USAGE;
  }
  const command *c = find(cmd);
  if (!c) return unknown(cmd);
  return c->run(argc - 1, argv + 1);
}
