/* Shared command-line helpers of the `dp` tool: value parsers, byte formatting,
 * JSON string output, and the common option set that fills a dp_config, so that
 * every command (`dp plan`, `dp train`, ...) parses those options identically.
 *
 * Conventions: parsers return 0 on success and -1 on failure; on failure they
 * write a one-line message (no trailing newline) into err[errcap] and leave *out
 * unchanged. err may be NULL when errcap is 0. Nothing here prints or exits,
 * except the dpt_print_* functions, which write to the FILE they are given. */
#ifndef DPT_CLI_H
#define DPT_CLI_H

#include "dp.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct dpt_scaler; /* data.h */

/* ---- commands (each returns the process exit status) ------------------------ */
/* argv[0] is the command name ("plan"); the rest are its arguments. */
int dpt_cmd_plan(int argc, char **argv);     /* tools/cmd_plan.c */
int dpt_cmd_train(int argc, char **argv);    /* tools/cmd_train.c */
int dpt_cmd_repro(int argc, char **argv);    /* tools/cmd_repro.c */
int dpt_cmd_bench(int argc, char **argv);    /* tools/cmd_bench.c */
int dpt_cmd_predict(int argc, char **argv);  /* tools/cmd_predict.c */
int dpt_cmd_generate(int argc, char **argv); /* tools/cmd_generate.c */
int dpt_cmd_export(int argc, char **argv);  /* tools/cmd_weights.c */
/* The model as PyTorch source (tools/pytorch.c): 0, or -1 on a write error.
 * sc (NULL or n 0: none): dp train's standardisation (data.h), the module's
 * first step, so that raw rows give dp predict's outputs. */
int dpt_write_pytorch(const dp_model *m, const struct dpt_scaler *sc, FILE *f);
int dpt_cmd_import(int argc, char **argv); /* tools/cmd_weights.c */

/* The per-device arena table of a plan, as `dp plan` prints it (tools/cmd_plan.c):
 * a column per device with rows, micro-batches, the bytes of every non-empty
 * region, the padded total; then a line saying how much more device 0 holds
 * and which regions make the difference; then the host staging bytes; with
 * several ranks (config.ranks), a rank row and what each rank's process holds
 * (its devices, rows of the batch and arena bytes). */
void dpt_print_plan(FILE *f, const dp_plan *p);

/* Exit statuses shared by all commands. */
enum {
  DPT_EXIT_OK = 0,
  DPT_EXIT_FAIL = 1,  /* planning, model, run-time or I/O error */
  DPT_EXIT_USAGE = 2, /* bad command line */
  /* dp predict: the predictions were written, but some are not finite (inf,
   * nan), so that a script does not take them for good ones */
  DPT_EXIT_NONFINITE = 3,
};

/* Room for one library error message (dp_last_error, dp_ctx_error). */
#define DPT_MSG_CAP 512

/* Writes the message (printf-style) into err[errcap] (nothing when err is NULL
 * or errcap 0) and returns -1 (== DPT_ARGS_ERROR); dpt_fail_status returns s. */
int dpt_fail(char *err, size_t errcap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
dp_status dpt_fail_status(dp_status s, char *err, size_t errcap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- values ------------------------------------------------------------------- */

/* Byte sizes: a non-negative decimal number, optional spaces, optional unit.
 *   B (or none) = 1; kB KB k = 1000; MB M = 1000^2; GB G; TB T; PB P (powers of 1000)
 *   KiB Ki = 1024; MiB Mi = 1024^2; GiB Gi; TiB Ti; PiB Pi (powers of 1024)
 * Units are case-insensitive ("gib", "GB", "mb" all work). A fraction ("1.5GB")
 * is allowed with a unit above bytes and is computed exactly, rounded down to a
 * whole byte. Refused: empty text, signs, junk, unknown units, a fraction of
 * plain bytes, and any value above SIZE_MAX. */
int dpt_parse_size(const char *s, size_t *out, char *err, size_t errcap);

/* A decimal integer in [min, max]; `what` names the value in messages
 * ("--batch"). Leading/trailing junk and whitespace are refused. */
int dpt_parse_int(const char *s, long min, long max, const char *what, int *out, char *err,
                  size_t errcap);
/* Whether the len bytes at s are a decimal number's characters (digits, '.', an
 * exponent, signs): strtod alone takes hexadecimal, inf and nan too. */
bool dpt_decimal(const char *s, size_t len);
/* A finite decimal number in [min, max] (inclusive) that a float32 holds (not
 * one that rounds to 0). */
int dpt_parse_float(const char *s, double min, double max, const char *what, float *out,
                    char *err, size_t errcap);
/* An unsigned 64-bit decimal integer (no sign). */
int dpt_parse_u64(const char *s, const char *what, uint64_t *out, char *err, size_t errcap);

/* --devices: either a count ("4": devices 0..3) or a comma list of physical
 * device ids, one per replica ("0,0,1,1": 4 replicas, two per GPU). A list
 * needs at least one comma; ids are in [0, 1023]; at most DP_MAX_DEVICES
 * replicas. Writes *n_devices and ids[0..n-1] (ids must hold DP_MAX_DEVICES). */
int dpt_parse_devices(const char *s, int *n_devices, int ids[DP_MAX_DEVICES], char *err,
                      size_t errcap);

/* Enumerations, case-insensitive; the words are the library's names of the
 * values (dp_mode_name, dp_optimizer_name, ...); the messages list them. */
int dpt_parse_mode(const char *s, dp_mode *out, char *err,
                   size_t errcap); /* classic|allreduce */
int dpt_parse_optimizer(const char *s, dp_optimizer *out, char *err,
                        size_t errcap); /* sgd|momentum|adamw */
int dpt_parse_split(const char *s, dp_split *out, char *err,
                    size_t errcap); /* chunk|balanced|memory */
int dpt_parse_backend(const char *s, dp_backend *out, char *err,
                      size_t errcap); /* cpu|cuda */
int dpt_parse_transport(const char *s, dp_transport *out, char *err,
                        size_t errcap); /* auto|copy|nccl */
int dpt_parse_bn_mode(const char *s, dp_bn_mode *out, char *err,
                      size_t errcap); /* per_replica|sync */

/* ---- backend options (dp_config.backend_options) ---------------------------------- */

/* Appends the item "name=value" to c->backend_options (items separated by
 * commas), unless that very item is there already. The names and values are
 * the backend's to check, at plan time. -1 with a message when the text would
 * not fit (DP_BACKEND_OPTIONS_CAP). */
int dpt_backend_option_add(dp_config *c, const char *name, const char *value, char *err,
                           size_t errcap);
/* Every item named `name` removed from c->backend_options, then, unless value
 * is NULL, "name=value" appended. 0, or -1 as dpt_backend_option_add. */
int dpt_backend_option_set(dp_config *c, const char *name, const char *value, char *err,
                           size_t errcap);
/* --backend-option NAME=VALUE: one item, checked for its form (a name, '=',
 * a value; no comma or space), then appended as dpt_backend_option_add does. */
int dpt_parse_backend_option(const char *s, dp_config *c, char *err, size_t errcap);
/* c's backend options checked as the plan will check them (dp_backend_options_check),
 * for a command to refuse a wrong one before it reads data. 0, or -1 with the
 * library's message; an unregistered backend is left for where it is used. */
int dpt_check_backend_options(const dp_config *c, char *err, size_t errcap);
/* The value of option `name` in a list of items ("graph=1,tf32=1" or the
 * plan's "graph=0 tf32=1 ..."), the last one given, into val[cap]: 1, or 0
 * (val "") when the list has no such item. */
int dpt_backend_option_get(const char *options, const char *name, char *val, size_t cap);
/* 1 when the list sets option `name` to 1. */
int dpt_backend_option_on(const char *options, const char *name);

/* ---- formatting ----------------------------------------------------------------- */

/* Human-readable, binary units, two decimals above bytes: "832 B", "1.50 KiB",
 * "80.00 GiB". Returns buf. cap >= 16 always suffices. */
char *dpt_bytes_human(size_t n, char *buf, size_t cap);
/* Exact with thousands separators: "0", "832", "1,536", "85,899,345,920".
 * Returns buf. cap >= 32 always suffices. */
char *dpt_bytes_exact(size_t n, char *buf, size_t cap);
/* The shortest decimal (%g, 6 to 9 digits) that reads back as v: "0.01", not
 * "0.00999999978". Returns buf. cap >= 32 always suffices. */
const char *dpt_float_text(float v, char *buf, size_t cap);

/* Monotonic clock, in seconds (timing for progress lines and benchmarks). */
double dpt_now_s(void);

/* Writes s as a JSON string literal (quotes included), escaping ", \ and
 * control characters; NULL is written as null. */
void dpt_json_string(FILE *f, const char *s);

/* ---- common options ----------------------------------------------------------- */

/* Codes (struct option .val) of the common options. A command numbers its own
 * long options from DPT_OPT_USER upwards (or uses a plain character for a short
 * form other than 'h'). */
enum {
  DPT_OPT_BATCH = 0x100,
  DPT_OPT_DEVICES,
  DPT_OPT_SPLIT,
  DPT_OPT_MICRO_BATCH,
  DPT_OPT_MODE,
  DPT_OPT_OPTIMIZER,
  DPT_OPT_INFERENCE,
  DPT_OPT_BACKEND,
  DPT_OPT_LR,
  DPT_OPT_MOMENTUM,
  DPT_OPT_WEIGHT_DECAY,
  DPT_OPT_BETA1,
  DPT_OPT_BETA2,
  DPT_OPT_EPS,
  DPT_OPT_SEED,
  DPT_OPT_SHARD_OPTIMIZER, /* no value: cfg.shard_optimizer = 1 */
  DPT_OPT_GRAPH,           /* no value: backend option graph=1 */
  DPT_OPT_TF32,            /* no value: backend option tf32=1 */
  DPT_OPT_TRANSPORT,
  DPT_OPT_FAST_COLLECTIVES, /* no value: backend option fast_collectives=1 */
  DPT_OPT_DAMPENING,
  DPT_OPT_NESTEROV, /* no value: cfg.nesterov = 1 */
  DPT_OPT_RANKS,
  DPT_OPT_CLIP_GRAD_NORM,
  DPT_OPT_ACCUMULATE,
  DPT_OPT_RECOMPUTE,
  DPT_OPT_PRECISION,
  DPT_OPT_REDUCE_PRECISION,
  DPT_OPT_BATCHNORM,
  DPT_OPT_BACKEND_OPTION, /* NAME=VALUE, repeatable: appended to cfg.backend_options */
  DPT_OPT_CLIP_GRAD_VALUE,
  DPT_OPT_AMSGRAD, /* no value: cfg.amsgrad = 1 */
  DPT_OPT_COMMON_END,
  DPT_OPT_USER = 0x200,
};

/* What the parse saw besides the config. */
typedef struct {
  unsigned long given; /* bit (code - DPT_OPT_BATCH) per common option present */
  int first_arg;       /* index in argv of the first positional argument */
  int n_args;          /* number of positional arguments (argv[first_arg..]) */
} dpt_common;

/* 1 when the common option `code` (DPT_OPT_*) appeared on the command line. */
int dpt_given(const dpt_common *c, int code);

/* Called for each of the command's own options; arg is NULL for options
 * without an argument. Returns 0, or -1 with a message in err. */
typedef int (*dpt_option_fn)(void *user, int code, const char *arg, char *err,
                             size_t errcap);

enum { DPT_ARGS_ERROR = -1, DPT_ARGS_OK = 0, DPT_ARGS_HELP = 1 };

/* Parses argv[1..argc-1] with getopt_long: the common options (which fill *cfg,
 * starting from dp_config_default), -h/--help, and the command's own `extra`
 * options (terminated by a zero entry; may be NULL; at most 48), each handed to
 * fn(user, ...). Both "--opt value" and "--opt=value" work; positional
 * arguments may appear anywhere (glibc permutes argv) and are counted in
 * *common, not refused — the command decides. "--" ends the options.
 *
 * An option that takes a value given twice (common or the command's own) is
 * refused: "--lr given twice"; a flag without a value may repeat (-v -v).
 *
 * The optimizer is PyTorch's: without --optimizer the config is
 * dp_config_default's (SGD, momentum 0, dampening 0, nesterov off, weight decay
 * 0); --optimizer applies dp_config_set_optimizer (momentum: momentum 0.9;
 * adamw: weight decay 0.01) before every other option, wherever it stands on
 * the command line, so that the explicit hyper-parameter options always
 * override the optimizer's defaults. Values are checked in command-line order.
 *
 * getopt state: this function RESETS getopt (optind = 0, which makes glibc
 * reinitialise fully) before parsing, and sets opterr = 0 (getopt prints
 * nothing; messages go to err). It may be called any number of times, with
 * different argv arrays, in one process. It is not thread-safe (getopt is not).
 *
 * Returns DPT_ARGS_OK; DPT_ARGS_HELP when -h/--help was met (parsing stops
 * there); DPT_ARGS_ERROR with a message in err (unknown option, missing or bad
 * value, an option given twice). `common` may be NULL. */
int dpt_parse_args(int argc, char **argv, const struct option *extra, dpt_option_fn fn,
                   void *user, dp_config *cfg, dpt_common *common, char *err,
                   size_t errcap);

/* Under mpirun, whether the job's devices (--devices counts them all) can be
 * shared by its processes, said before any data is read (the planner says it
 * later). 0, or -1 with the message in err. */
int dpt_job_devices(const dp_config *cfg, const dpt_common *common, char *err,
                    size_t errcap);
/* The preamble of a command without positional arguments: dpt_parse_args;
 * on -h/--help, usage(stdout) (usage may be NULL) and DPT_ARGS_HELP; a
 * positional argument is refused ("unexpected argument 'x'"). */
int dpt_parse_command(int argc, char **argv, const struct option *extra, dpt_option_fn fn,
                      void *user, void (*usage)(FILE *), dp_config *cfg, dpt_common *common,
                      char *err, size_t errcap);

/* Same, with only the common options and no positional arguments allowed. */
int dpt_config_from_args(int argc, char **argv, dp_config *cfg, dpt_common *common,
                         char *err, size_t errcap);

/* The help text of the common options, identical in every command. */
void dpt_print_common_help(FILE *f);

/* One line describing a config, e.g.
 * "batch 30 on 2 devices (chunk split, micro-batch = chunk), classic mode, sgd (lr 0.01),
 *  training, cpu backend, seed 0"; "allreduce mode with sharded optimizer state" when
 *  shard_optimizer is set; the backend options (config.backend_options, and a
 *  transport other than auto) after the backend, when any is set:
 *  "cuda backend (transport auto, cuda graph, tf32)"; graph=1, tf32=1 and
 *  fast_collectives=1 read "cuda graph", "tf32", "fast collectives", an item
 *  set to 0 is left out, any other reads "name=value". */
void dpt_print_config(FILE *f, const dp_config *c);

/* For the commands that create a context: 0 when c's backend is registered
 * with virtual devices (the cpu backend), or has devices of its own
 * (DP_BACKEND_CAP_DEVICES) and one is visible; else -1 with one line in err
 * saying why there is none ("--backend cuda: no usable GPU ..."), so that a
 * command fails before allocating anything, whatever the library would have
 * said. Asks for devices (dp_backend_device_count) only of such a backend. */
int dpt_require_backend(const dp_config *c, char *err, size_t errcap);

/* ---- the job's processes (tools/ranks.c) ------------------------------------
 * Under mpirun (a build with MPI), dp runs as one rank of a job: --ranks
 * defaults to the number of processes, each rank creates its context with
 * dp_ctx_create_mpi, reads the data but feeds its own rows, and only rank 0
 * prints to stdout and writes files. Elsewhere: one process, rank 0 of 1. */
/* Called first by main: joins the job when launched by mpirun/srun. */
void dpt_world_init(int *argc, char ***argv);
/* Called by main with the exit status: leaves the job (a failure on one rank
 * ends the whole job: MPI_Abort). Returns status. */
int dpt_world_exit(int status);
int dpt_world_rank(void);
int dpt_world_size(void); /* 1 when not under mpirun */
/* 1 under a launcher (mpirun, srun), even of one rank: its terminal, if any, is the
 * launcher's pseudo-terminal, not the person's (no progress drawing there) */
int dpt_world_launched(void);
/* dp_ctx_create, or dp_ctx_create_mpi for a plan of several ranks. */
dp_status dpt_ctx_create(const dp_plan *p, dp_ctx **out);
/* For a job that runs several configurations in turn (dp repro --layouts):
 * the context of a plan of R = dp_plan_ranks(p) ranks, run by the job's first
 * R processes (a plan of one rank: by rank 0 alone, in one process).
 * Collective: every process of the job calls it for every plan, in the same
 * order. *here = 0: this process has no part in it (*out NULL, DP_OK). */
dp_status dpt_ctx_create_part(const dp_plan *p, dp_ctx **out, int *here);
/* Rank 0's v, on every rank (v itself in one process). */
int dpt_world_bcast_int(int v);
/* The largest of every rank's v, on every rank (v itself in one process).
 * Collective. dp train agrees on a stop signal with it after every step. */
int dpt_world_max_int(int v);
/* Rank 0 gets every rank's n bytes of `mine`, in rank order, in all (size()
 * x n bytes; NULL on the other ranks); one process: a copy. Collective.
 * 0, or -1 (the exchange failed). */
int dpt_world_gather(const void *mine, size_t n, void *all);
/* The failure at hand is known to every rank (agreed on): dpt_world_exit
 * leaves without MPI_Abort, each rank with its own exit status. */
void dpt_world_failed_together(void);
/* The device (st_dev) of the file system that holds path's directory; 0 when
 * it cannot be said. */
unsigned long long dpt_dir_device(const char *path);
/* A bad command line of `dp cmd` (cmd NULL: of dp itself), said as "dp cmd:
 * err" and `hint` on the next line. Found from the arguments and the job's
 * size alone, before anything is read, so every rank of a job finds the same
 * one: rank 0 alone says it, and the job ends without Open MPI's abort
 * banner (dpt_world_failed_together). Returns DPT_EXIT_USAGE. */
int dpt_usage_error(const char *cmd, const char *err, const char *hint);
/* dp_ckpt_read_app on rank 0, its bytes sent to every rank (the ranks need
 * not share a file system: the others never open path). Collective. 0, or -1
 * with rank 0's message in err on rank 0 and err empty elsewhere (a failure
 * every rank knows of), or -1 with this rank's own failure in err. */
int dpt_world_read_app(const char *path, void **app, size_t *n, char *err, size_t errcap);
/* A job layout of `ranks` processes against the job's size: 0 when it fits,
 * else -1 with "this layout needs 8 processes, the job has 2: run it under
 * mpirun -np 8" (or how to get MPI) in msg. */
int dpt_world_layout_msg(int ranks, char *msg, size_t cap);
/* Rank 0 gets every rank's rows of a batch of `rows` (each rank's `mine`:
 * its dp_plan_rank_rows, `width` floats each) into all (rows, width); one
 * process: a copy. 0 or -1 with a message in err. */
int dpt_world_gather_rows(const dp_plan *p, int rows, const float *mine, int width,
                          float *all, char *err, size_t errcap);

/* ---- stopping dp train safely (tools/stop.c) --------------------------------
 * The first SIGINT or SIGTERM only asks the training loop to stop after the
 * step at hand, so that it saves its checkpoint and says how to resume; a
 * second one ends the process at once (the checkpoint writer is atomic: the
 * file at the path is the old one or a whole new one). The tool's, never the
 * library's: the library installs no handler and never exits. Nothing here
 * prints, but for the handlers' one line each (write(2), async-signal-safe). */

/* Installs the handlers of SIGINT and SIGTERM (sigaction), keeping the old
 * ones, and clears a stop asked before. `cmd` names the tool in the
 * handlers' lines ("dp train"). */
void dpt_stop_install(const char *cmd);
/* Puts the old handlers back; nothing when none are installed. */
void dpt_stop_restore(void);
/* The signal that asked this process to stop (SIGINT or SIGTERM), or 0. */
int dpt_stop_requested(void);
/* The same, agreed by every rank under mpirun: the largest of the ranks'
 * (a collective: every rank calls it after the same steps), so that all
 * stop after the same step. In one process: dpt_stop_requested(). */
int dpt_stop_agreed(void);
/* "SIGINT", "SIGTERM" (or "signal N"). */
const char *dpt_signal_name(int sig);

/* The command line that continues a run: `prefix` (the program as it was
 * run, e.g. "build/dp train" or "mpirun -np 2 build/dp train"), then the
 * command's arguments argv[1..argc) without --resume and --epochs (any of
 * their forms: "--epochs 4", "--epochs=4", a unique prefix "--epo 4"), then
 * "--resume PATH --epochs N"; each word quoted for a POSIX shell when it
 * needs it. malloc'd (NULL: out of memory). */
char *dpt_resume_command(const char *prefix, int argc, char **argv, const char *path,
                         int epochs);

/* ---- messages and files for people -------------------------------------------- */

/* A library message (dp_last_error, dp_ctx_error) for a person: every library
 * source location (" [spec.c:240]") removed. Returns a static buffer that the
 * next call overwrites (the tool is single-threaded). */
const char *dpt_user_msg(const char *lib_msg);

/* Opens path for reading without blocking on a FIFO (O_NONBLOCK, cleared after
 * the type check) and refuses anything but a regular file. Returns the file
 * descriptor, or -1 with "cannot read <what> '<path>': <why>" in err, <why>
 * being the system's text ("No such file or directory"), "is a directory" or
 * "not a regular file (a FIFO)". */
int dpt_open_regular(const char *path, const char *what, char *err, size_t errcap);

/* dp_model_load with messages for people: "cannot read model 'x.dpm': No such
 * file or directory", "is a directory", ...; a parse error keeps its
 * "x.dpm:3:5: " location and loses the library's. 0, or -1 with err. */
int dpt_load_model(const char *path, dp_model **out, char *err, size_t errcap);

/* A sequence model's context T (its spec starts `input tokens T`, `embed V D`) and
 * its vocabulary in *vocab (may be NULL); 0 for any other model. */
int dpt_model_sequence(const dp_model *m, int *vocab);

/* Refuses a training plan of a model without a loss, naming the file: 0, or -1
 * with "model 'x.dpm' has no loss line; ..." in err. c: the config of a command
 * that can plan inference (a config with inference set passes; the message
 * mentions --inference); NULL for a command that only trains. */
int dpt_require_loss(const char *path, const dp_model *m, const dp_config *c, char *err,
                     size_t errcap);

/* Checks, before any work, that `path` can be written by the tool later, as
 * dp_file_check does (dp.h): replace = 1 (a file written whole to a temporary
 * file and renamed over path: a checkpoint, a chart, predictions) creates and
 * removes such a temporary file; replace = 0 (a log, appended in place) opens
 * path for writing without truncating it (removing it again when this call
 * created it). Either refuses a path that is a directory, FIFO, socket or
 * device (and, in place, a symbolic link), never creating, truncating or
 * following anything there. 0, or -1 with "cannot write <what> '<path>': ...". */
int dpt_check_writable(const char *path, const char *what, int replace, char *err,
                       size_t errcap);

/* A file a command reads or writes, for dpt_check_distinct (path NULL: not
 * given). what names it in messages ("checkpoint"). */
typedef struct {
  const char *path, *what;
} dpt_file_role;

/* Refuses an output that is one of the command's inputs, so that a write never
 * destroys what the command reads, or that is another of its outputs. Files
 * are compared by device and inode, not by name: an output is an input when
 * it is the same file, a hard link to it or a symbolic link to it; two
 * outputs are one when they are the same file, or the same name. 0, or -1
 * with "cannot write <what> '<out>': it is the <what> '<in>' it reads" in err. */
int dpt_check_distinct(const dpt_file_role *outs, int n_outs, const dpt_file_role *ins,
                       int n_ins, char *err, size_t errcap);

/* The CPUs this process may run on (sched_getaffinity; sysconf as fallback). */
int dpt_cpu_count(void);

/* Levenshtein distance of a and b; strings longer than 31 bytes are "far" (99). */
int dpt_distance(const char *a, const char *b);
/* The message for an unknown or ambiguous long option tok ("--name" or
 * "--name=value") among opts, to err: the options it is a prefix of, or the
 * nearest name ("did you mean '--epochs'?"). Returns -1. */
int dpt_unknown_option(const struct option *opts, const char *tok, char *err,
                       size_t errcap);

/* A backend of virtual devices (the cpu backend: no DP_BACKEND_CAP_DEVICES)
 * runs one thread per device: with more devices than CPUs (n_cpus) they take
 * turns and every step is many times slower. Writes one warning line ("dp
 * train: warning: ...\n") to f and returns 1 when backend is such a registered
 * backend and this process's devices (n_devices: the job's; under mpirun each
 * process runs its share) outnumber n_cpus (the CPUs it may use); else 0 and
 * nothing. */
int dpt_warn_oversubscribed(FILE *f, const char *cmd, int n_devices, dp_backend backend,
                            int n_cpus);

#endif
