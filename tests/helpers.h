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

/* dp_config_default with `batch`, `n_devices` and `opt` (dp_config_set_optimizer's
 * hyper-parameters); everything else, seed 0 included, as the default.
 * config_of(b, n, DP_OPT_SGD) is the plain default of that batch and device count. */
dp_config config_of(int batch, int n_devices, dp_optimizer opt);

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

/* Checkpoint files by hand: fnv1a_bytes, ckpt_reseal, ckpt_as_version. */
#include "ckpt_bytes.h"

/* 1 when this build has the cuda backend (registered by tests/check_main.c);
 * else 0 after printing "SKIP <suite>: <test>: ..." (a CPU-only build, such as
 * the sanitizer build, plans nothing for cuda). */
bool cuda_or_skip(const char *suite, const char *test);

/* xorshift64*: the tests' own seeded generator; *s must not be 0. */
uint64_t rng_next(uint64_t *s);

#endif
