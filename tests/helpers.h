/* Helpers shared by the test suites (tests/helpers.c, built into libdptest.a,
 * which test_dp and the standalone tests link; test_cuda_emul does not).
 *
 * Each one that builds something fails the running test, with libdp's message,
 * when libdp refuses; the file helpers fail it when a call fails. ctx_snap
 * reads a context's arenas through lib/core/ctx.h. */
#ifndef DP_TEST_HELPERS_H
#define DP_TEST_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dp.h"

/* A test's config, the fields it sets named: dp_config_default with batch and
 * n_devices as given, opt's hyper-parameters (dp_config_set_optimizer), mode,
 * shard_optimizer, micro_batch (0: = chunk) and seed as given, and lr when it
 * is not 0 (0: dp_config_default's 0.01). A field left out is 0: the default
 * (classic, SGD, seed 0). The one config helper of the suites:
 *   dp_config c = CFG(.batch = 32, .n_devices = 2, .opt = DP_OPT_ADAMW, .seed = 7); */
typedef struct {
  int batch, n_devices;
  dp_optimizer opt;
  dp_mode mode;
  bool shard;
  int micro_batch;
  uint64_t seed;
  float lr;
} cfg_args;
dp_config cfg_make(cfg_args a);
#define CFG(...) cfg_make((cfg_args){__VA_ARGS__})
/* CFG(.batch = batch, .n_devices = n_devices, .opt = opt): everything else, seed
 * 0 included, as the default. */
dp_config config_of(int batch, int n_devices, dp_optimizer opt);

/* MLP_EVERY_KIND_SPEC */
#include "specs.h"

/* `spec` parsed, named "test". */
dp_model *model_of_at(const char *spec, const char *file, int line);
/* The plan of `m` under `cfg`. */
dp_plan *plan_of_at(const dp_model *m, const dp_config *cfg, const char *file, int line);
/* A context of `p` (library arenas). */
dp_ctx *ctx_of_at(const dp_plan *p, const char *file, int line);

/* A model, its plan and a context; np: the model's parameter count. */
typedef struct {
  dp_model *m;
  dp_plan *p;
  dp_ctx *c;
  size_t np;
} rig;

/* model_of, plan_of and ctx_of in one. */
void rig_open_at(rig *r, const char *spec, const dp_config *cfg, const char *file,
                 int line);
/* rig_open, except that DP_ERR_UNSUPPORTED from the planner (a mode this build
 * lacks) returns false with *r zeroed. */
bool rig_try_at(rig *r, const char *spec, const dp_config *cfg, const char *file, int line);
/* Frees what rig_open made and zeroes *r. */
void rig_close(rig *r);

/* The calls: a failure message names the caller's file and line. */
#define model_of(spec) model_of_at((spec), __FILE__, __LINE__)
#define plan_of(m, cfg) plan_of_at((m), (cfg), __FILE__, __LINE__)
#define ctx_of(p) ctx_of_at((p), __FILE__, __LINE__)
#define rig_open(r, spec, cfg) rig_open_at((r), (spec), (cfg), __FILE__, __LINE__)
#define rig_try(r, spec, cfg) rig_try_at((r), (spec), (cfg), __FILE__, __LINE__)

/* Steps [from, to) of r's context, step k on a batch that is a function of k
 * only: config.batch rows of inputs U(-1, 1) and targets, labels or (mse) U(0,
 * 1). try_steps makes no Check calls (a forked child may run it): DP_OK, or the
 * first failure's status with its step in *failed_at. run_steps fails the test
 * there, with the context's message. */
dp_status try_steps(rig *r, int from, int to, int *failed_at);
void run_steps(rig *r, int from, int to);

/* dp_get_params of r's context: r->np floats (malloc'd). */
float *params_of(rig *r);
/* Fails the test, naming `what`, unless a and b hold the same parameter bits
 * (and so the same dp_params_hash). */
void assert_same_params(rig *a, rig *b, const char *what);

/* Every arena byte of a context, its step counter, its parameters' hash and
 * whether its replicas must be refreshed: what a refused call leaves alone. */
typedef struct {
  int n_dev;
  unsigned char *arena[DP_MAX_DEVICES];
  size_t bytes[DP_MAX_DEVICES];
  uint64_t step, hash;
  bool stale;
} ctx_snap;

void ctx_snap_take(ctx_snap *s, dp_ctx *c);
/* Fails the test, naming `what`, when c's parameters' hash, step counter or
 * an arena byte is not as in s (stale is the caller's to compare). */
void ctx_snap_check(const ctx_snap *s, dp_ctx *c, const char *what);
void ctx_snap_free(ctx_snap *s);

/* A fresh directory for a test's files, "$TMPDIR/<prefix>_XXXXXX" (/tmp
 * without TMPDIR), and path, a file in it; tmp_done removes the directory
 * with its files. */
typedef struct {
  char dir[256];
  char path[300];
} tmpdir;

/* Makes t->dir; t->path is the file `name` in it ("" when name is NULL). */
void tmp_make(tmpdir *t, const char *prefix, const char *name);
/* Sets t->path to the file `name` in t->dir and returns it. */
const char *tmp_path(tmpdir *t, const char *name);
void tmp_done(tmpdir *t);
/* How many names dir holds (not . and ..). */
int dir_entries(const char *dir);
/* Removes the files in dir whose name starts with prefix; returns how many. */
int remove_prefixed(const char *dir, const char *prefix);
/* n + past floats (malloc'd) filled with the byte 0x5b: a kernel's output must
 * replace the first n and leave the rest as they are. */
float *floats_blank(size_t n, size_t past);
/* The whole file (malloc'd with a byte to spare, for a terminating NUL): *len bytes. */
unsigned char *file_read(const char *path, size_t *len);
/* path made anew with len bytes of b. */
void file_write(const char *path, const void *b, size_t len);

/* A writer of files (dp_ckpt_save, dp_ckpt_export_safetensors) refused with
 * DP_ERR_IO, nothing left behind in dir (empty at first): into a directory of
 * dir that does not exist (the message names the path and ENOENT; the file is
 * `name`), and over a directory. */
void expect_write_refused(dp_ctx *c, dp_status (*write)(dp_ctx *, const char *),
                          const char *dir, const char *name);

/* Makes a node at path: 'p' a FIFO, 'c' a character device (1, 3: what
 * /dev/null is), 'd' a directory. false when the system does not let this
 * process make it (mknod needs CAP_MKNOD): the caller skips that case. */
bool make_node(const char *path, char kind);

/* A writer of files (as expect_write_refused) never destroys or follows what
 * is at the path (issue 26): a FIFO, a character device, a symbolic link to
 * a FIFO are refused with DP_ERR_IO naming what they are, and stay as they
 * were; a symbolic link planted at the old predictable temporary name
 * "<path>.tmp.<pid>" is never opened (its target keeps its bytes); a symbolic
 * link at the path to a regular file is replaced by the new file, its target
 * untouched; the file gets mode 0666 less the umask. dir is empty before and
 * after. */
void expect_write_keeps_nodes(dp_ctx *c, dp_status (*write)(dp_ctx *, const char *),
                              const char *dir, const char *name);

/* A reader of files (dp_ckpt_load, dp_ckpt_import_safetensors) refuses with
 * DP_ERR_IO, "is not a regular file (...)", a FIFO without a writer (at once:
 * an alarm turns a hang into a failure; the FIFO is `name` in dir, removed
 * after) and the directory dir itself. */
void expect_not_a_file_refused(dp_ctx *c, dp_status (*read)(dp_ctx *, const char *),
                               const char *dir, const char *name);

/* Little-endian integers in a byte buffer. */
uint32_t le32(const unsigned char *b);
uint64_t le64(const unsigned char *b);

/* Checkpoint files by hand: ckpt_reseal, ckpt_as_version (their checksum,
 * FNV-1a 64, is dp_hash_bytes). */
#include "ckpt_bytes.h"

/* 1 when this build has the cuda backend (registered by tests/check_main.c);
 * else 0 after printing "SKIP <suite>: <test>: ..." (a CPU-only build, such as
 * the sanitizer build, plans nothing for cuda). */
bool cuda_or_skip(const char *suite, const char *test);

/* xorshift64*: the tests' own seeded generator; *s must not be 0. */
uint64_t rng_next(uint64_t *s);

#endif
