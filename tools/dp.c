/* `dp`: the libdp command-line tool. Dispatches `dp <command> [options]` to
 * the command's function (tools/cmd_*.c); each returns the exit status. */
#include "cli.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
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
    {"predict", dpt_cmd_predict,
     "run a checkpoint's model over a CSV, .npy or IDX file and write the\n"
     "            predictions (the path a service takes)"},
    {"generate", dpt_cmd_generate,
     "continue a prompt with a sequence model's checkpoint (a GPT), token by\n"
     "            token: greedy or sampled (temperature, top-k, seed)"},
    {"export", dpt_cmd_export,
     "write a checkpoint's weights as a safetensors file PyTorch loads into\n"
     "            the model's nn.Sequential (model.load_state_dict)"},
    {"import", dpt_cmd_import,
     "make a checkpoint from PyTorch weights (a safetensors state_dict) to\n"
     "            train from with dp train --resume"},
    {"bench", dpt_cmd_bench,
     "measure: one core's FMA peak, GEMM GFLOP/s, ms per training step,\n"
     "            the allreduce and step time across MPI ranks (comm, under\n"
     "            mpirun), scaling with batch, width and devices; on a GPU, the\n"
     "            cuda step with and without CUDA graphs (gpu-step) and its GEMMs\n"
     "            alone (gpu-gemm)"},
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
  for (int i = 0; i < N_COMMANDS; i++)
    fprintf(f, "  %-8s  %s\n", commands[i].name, commands[i].summary);
  fputs("\n"
        "Every command takes the same configuration options (--batch, --devices,\n"
        "--split, --micro-batch, --mode, --optimizer, --inference, --backend, --lr,\n"
        "--momentum, --weight-decay, --seed, --graph, --tf32, --transport, ...) with\n"
        "the same meaning.\n"
        "\n"
        "Exit status: 0 ok, 1 failure (model, planning, run-time, I/O), 2 usage error;\n"
        "dp predict: 3 when some predictions written are not finite; dp train: 130\n"
        "after SIGINT, 143 after SIGTERM (saved where --save says, the command that\n"
        "goes on printed).\n"
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

/* "dp: unknown command 'trian'; did you mean 'train'?" and a one-line hint. */
static int unknown(const char *name) {
  const command *best = NULL;
  int bd = 3; /* at most two edits away */
  for (int i = 0; i < N_COMMANDS; i++) {
    int d = dpt_distance(name, commands[i].name);
    if (d < bd) {
      bd = d;
      best = &commands[i];
    }
  }
  char err[256];
  if (best)
    snprintf(err, sizeof err, "unknown command '%s'; did you mean '%s'?", name, best->name);
  else
    snprintf(err, sizeof err, "unknown command '%s'", name);
  return dpt_usage_error(NULL, err, "run 'dp --help' for the commands");
}

static int run(int argc, char **argv) {
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
    char err[256];
    snprintf(err, sizeof err, "unknown option '%s' (options go after the command)", cmd);
    return dpt_usage_error(NULL, err, "run 'dp --help' for the commands");
  }
  const command *c = find(cmd);
  if (!c) return unknown(cmd);
  return c->run(argc - 1, argv + 1);
}

/* DP_GEMM_TIER, which the library reads at its first GEMM and ignores when it
 * names no tier this CPU has (it cannot say so): said here, once (an outside
 * check, session 23: a typo went unnoticed). */
static void check_gemm_tier(void) {
  const char *want = getenv("DP_GEMM_TIER");
  if (!want || dpt_world_rank() != 0) return; /* said once, by rank 0 */
  dp_status s = dp_gemm_set_tier(want);
  if (s == DP_ERR_INVALID)
    fprintf(stderr,
            "dp: warning: DP_GEMM_TIER=%s is not a tier (avx512, avx2, scalar, auto, "
            "avx512bf16); the best this CPU has runs (%s)\n",
            want, dp_gemm_tier());
  else if (s)
    fprintf(stderr, "dp: warning: DP_GEMM_TIER=%s: this CPU lacks it; %s runs\n", want,
            dp_gemm_tier());
}

int main(int argc, char **argv) {
  /* a file-size limit (ulimit -f) makes a write fail with EFBIG, said as a full
   * disk is, instead of killing the tool mid-file (an outside check, session 24:
   * exit 153, a temporary file left, the report lost) */
  signal(SIGXFSZ, SIG_IGN);
#ifdef DP_HAVE_CUDA
  dp_cuda_register(); /* libdp_cuda.a: --backend cuda (a GPU is needed only to run) */
#endif
  dpt_world_init(&argc, &argv); /* under mpirun: one rank of the job */
  check_gemm_tier();
  int rc = run(argc, argv);
  /* what a command printed (a report, a hash, a table): written, or said with a
   * failing status (an outside check, session 24: dp train > /dev/full exited 0
   * with its report lost) */
  errno = 0;
  if ((fflush(stdout) || ferror(stdout)) && rc == DPT_EXIT_OK) {
    fprintf(stderr, "dp: error writing standard output%s%s\n", errno ? ": " : "",
            errno ? strerror(errno) : "");
    rc = DPT_EXIT_FAIL;
  }
  return dpt_world_exit(rc);
}
