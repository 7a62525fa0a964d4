/* Helpers shared by the test suites: see helpers.h. */
#include "helpers.h"
#include "core/ctx.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

dp_config cfg_make(cfg_args a) {
  dp_config c;
  dp_config_default(&c);
  c.batch = a.batch;
  c.n_devices = a.n_devices;
  dp_config_set_optimizer(&c, a.opt);
  c.mode = a.mode;
  c.shard_optimizer = a.shard;
  c.micro_batch = a.micro_batch;
  c.seed = a.seed;
  if (a.lr != 0.0f) c.lr = a.lr;
  return c;
}

dp_config config_of(int batch, int n_devices, dp_optimizer opt) {
  return CFG(.batch = batch, .n_devices = n_devices, .opt = opt);
}

dp_model *model_of_at(const char *spec, const char *file, int line) {
  dp_model *m = NULL;
  dp_status s = dp_model_parse(spec, "test", &m);
  ck_assert_msg(s == DP_OK && m, "%s:%d: parse: %s: %s\nspec:\n%s", file, line,
                dp_status_name(s), dp_last_error(), spec ? spec : "(null)");
  return m;
}

dp_plan *plan_of_at(const dp_model *m, const dp_config *cfg, const char *file, int line) {
  dp_plan *p = NULL;
  dp_status s = dp_plan_create(m, cfg, &p);
  ck_assert_msg(s == DP_OK && p, "%s:%d: plan: %s: %s", file, line, dp_status_name(s),
                dp_last_error());
  return p;
}

dp_ctx *ctx_of_at(const dp_plan *p, const char *file, int line) {
  dp_ctx *c = NULL;
  dp_status s = dp_ctx_create(p, &c);
  ck_assert_msg(s == DP_OK && c, "%s:%d: ctx: %s: %s", file, line, dp_status_name(s),
                dp_last_error());
  return c;
}

bool rig_try_at(rig *r, const char *spec, const dp_config *cfg, const char *file,
                int line) {
  memset(r, 0, sizeof *r);
  r->m = model_of_at(spec, file, line);
  dp_status s = dp_plan_create(r->m, cfg, &r->p);
  if (s == DP_ERR_UNSUPPORTED) {
    dp_model_free(r->m);
    memset(r, 0, sizeof *r);
    return false;
  }
  ck_assert_msg(s == DP_OK && r->p, "%s:%d: plan: %s: %s", file, line, dp_status_name(s),
                dp_last_error());
  r->c = ctx_of_at(r->p, file, line);
  r->np = dp_model_n_params(r->m);
  return true;
}

void rig_open_at(rig *r, const char *spec, const dp_config *cfg, const char *file,
                 int line) {
  memset(r, 0, sizeof *r);
  r->m = model_of_at(spec, file, line);
  r->p = plan_of_at(r->m, cfg, file, line);
  r->c = ctx_of_at(r->p, file, line);
  r->np = dp_model_n_params(r->m);
}

void rig_close(rig *r) {
  dp_ctx_free(r->c);
  dp_plan_free(r->p);
  dp_model_free(r->m);
  memset(r, 0, sizeof *r);
}

float *params_of(rig *r) {
  float *p = malloc((r->np ? r->np : 1) * sizeof *p);
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(dp_get_params(r->c, p, r->np), DP_OK);
  return p;
}

void assert_same_params(rig *a, rig *b, const char *what) {
  ck_assert_msg(a->np == b->np, "%s: parameter counts differ", what);
  float *pa = params_of(a), *pb = params_of(b);
  ck_assert_msg(memcmp(pa, pb, a->np * 4) == 0, "%s: parameters differ", what);
  ck_assert_msg(dp_params_hash(a->c) == dp_params_hash(b->c), "%s: hashes differ", what);
  free(pa);
  free(pb);
}

void ctx_snap_take(ctx_snap *s, dp_ctx *c) {
  memset(s, 0, sizeof *s);
  s->n_dev = dp_plan_n_devices(c->plan);
  for (int d = 0; d < s->n_dev; d++) {
    s->bytes[d] = dp_plan_device_bytes(c->plan, d);
    s->arena[d] = malloc(s->bytes[d] ? s->bytes[d] : 1);
    ck_assert_ptr_nonnull(s->arena[d]);
    memcpy(s->arena[d], c->arena[d], s->bytes[d]);
  }
  s->step = c->step;
  s->hash = dp_params_hash(c);
  s->stale = c->replicas_stale;
}

void ctx_snap_check(const ctx_snap *s, dp_ctx *c, const char *what) {
  ck_assert_msg(dp_params_hash(c) == s->hash, "%s: the parameters' hash changed", what);
  ck_assert_msg(c->step == s->step, "%s: the step counter changed", what);
  for (int d = 0; d < s->n_dev; d++)
    ck_assert_msg(memcmp(s->arena[d], c->arena[d], s->bytes[d]) == 0,
                  "%s: device %d's arena changed", what, d);
}

void ctx_snap_free(ctx_snap *s) {
  for (int d = 0; d < s->n_dev; d++) free(s->arena[d]);
}

void tmp_make(tmpdir *t, const char *prefix, const char *name) {
  const char *base = getenv("TMPDIR");
  snprintf(t->dir, sizeof t->dir, "%s/%s_XXXXXX", base && *base ? base : "/tmp", prefix);
  ck_assert_msg(mkdtemp(t->dir) != NULL, "mkdtemp: %s", strerror(errno));
  t->path[0] = '\0';
  if (name) tmp_path(t, name);
}

const char *tmp_path(tmpdir *t, const char *name) {
  snprintf(t->path, sizeof t->path, "%s/%s", t->dir, name);
  return t->path;
}

void tmp_done(tmpdir *t) {
  remove_prefixed(t->dir, "");
  rmdir(t->dir);
}

int dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

float *floats_blank(size_t n, size_t past) {
  float *p = malloc((n + past) * 4);
  ck_assert_ptr_nonnull(p);
  memset(p, 0x5b, (n + past) * 4);
  return p;
}

int remove_prefixed(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  char p[600];
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (unlink(p) == 0) n++;
  }
  closedir(d);
  return n;
}

unsigned char *file_read(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "open %s: %s", path, strerror(errno));
  ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
  long n = ftell(f);
  ck_assert_int_ge(n, 0);
  rewind(f);
  unsigned char *b = malloc((size_t)n + 1);
  ck_assert_ptr_nonnull(b);
  ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return b;
}

/* A new file each time: rewriting one in place makes some file systems (ext4's
 * auto_da_alloc) flush it on close, which is slow. */
void file_write(const char *path, const void *b, size_t len) {
  unlink(path);
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "open %s: %s", path, strerror(errno));
  ck_assert_uint_eq(fwrite(b, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
}

void expect_write_refused(dp_ctx *c, dp_status (*write)(dp_ctx *, const char *),
                          const char *dir, const char *name) {
  char p[400];
  /* into a directory that does not exist: nothing is created */
  snprintf(p, sizeof p, "%s/no/such/dir/%s", dir, name);
  ck_assert_int_eq(write(c, p), DP_ERR_IO);
  ck_assert_msg(strstr(dp_ctx_error(c), p) && strstr(dp_ctx_error(c), strerror(ENOENT)),
                "%s", dp_ctx_error(c));
  struct stat st;
  ck_assert_int_ne(stat(p, &st), 0);
  ck_assert_int_eq(dir_entries(dir), 0);
  /* over a directory: refused, and the temporary file removed */
  snprintf(p, sizeof p, "%s/adir", dir);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  ck_assert_int_eq(write(c, p), DP_ERR_IO);
  ck_assert_int_eq(dir_entries(dir), 1);
  ck_assert_int_eq(dir_entries(p), 0);
  ck_assert_int_eq(rmdir(p), 0);
}

bool make_node(const char *path, char kind) {
  int rc = kind == 'p'   ? mkfifo(path, 0600)
           : kind == 'd' ? mkdir(path, 0700)
                         : mknod(path, S_IFCHR | 0600, makedev(1, 3));
  if (rc == 0) return true;
  ck_assert_msg(kind == 'c' && (errno == EPERM || errno == EACCES), "make %c %s: %s", kind,
                path, strerror(errno));
  return false;
}

/* The write is refused, naming `kind`, and the node at p is as it was. */
static void refused_untouched(dp_ctx *c, dp_status (*write)(dp_ctx *, const char *),
                              const char *p, const char *kind) {
  struct stat before, after;
  ck_assert_int_eq(lstat(p, &before), 0);
  alarm(10); /* a write that opened a FIFO would block: a failure, not a hang */
  dp_status s = write(c, p);
  alarm(0);
  ck_assert_msg(s == DP_ERR_IO, "%s: %s", p, dp_status_name(s));
  ck_assert_msg(strstr(dp_ctx_error(c), kind) && strstr(dp_ctx_error(c), p), "%s",
                dp_ctx_error(c));
  ck_assert_int_eq(lstat(p, &after), 0);
  ck_assert_uint_eq(after.st_mode, before.st_mode);
  ck_assert_uint_eq(after.st_ino, before.st_ino);
  ck_assert_uint_eq(after.st_rdev, before.st_rdev);
}

void expect_write_keeps_nodes(dp_ctx *c, dp_status (*write)(dp_ctx *, const char *),
                              const char *dir, const char *name) {
  char p[400], node[400], victim[400], tmp[440];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  snprintf(node, sizeof node, "%s/node", dir);
  snprintf(victim, sizeof victim, "%s/victim", dir);
  ck_assert_int_eq(dir_entries(dir), 0);
  /* a FIFO, a device, a link to a FIFO: refused, kept, no temporary file left */
  ck_assert(make_node(p, 'p'));
  refused_untouched(c, write, p, "is a FIFO (named pipe), not a regular file");
  ck_assert_int_eq(dir_entries(dir), 1);
  ck_assert_int_eq(unlink(p), 0);
  if (make_node(p, 'c')) {
    refused_untouched(c, write, p, "is a character device, not a regular file");
    ck_assert_int_eq(dir_entries(dir), 1);
    ck_assert_int_eq(unlink(p), 0);
  }
  ck_assert(make_node(node, 'p'));
  ck_assert_int_eq(symlink(node, p), 0);
  refused_untouched(c, write, p, "is a symbolic link to a FIFO");
  ck_assert_int_eq(dir_entries(dir), 2);
  ck_assert_int_eq(unlink(p), 0);
  ck_assert_int_eq(unlink(node), 0);
  /* a link planted at the temporary name of old: never opened */
  file_write(victim, "precious\n", 9);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());
  ck_assert_int_eq(symlink(victim, tmp), 0);
  mode_t mask = umask(027);
  dp_status s = write(c, p);
  umask(mask);
  ck_assert_msg(s == DP_OK, "%s", dp_ctx_error(c));
  size_t n;
  unsigned char *b = file_read(victim, &n);
  ck_assert_msg(n == 9 && memcmp(b, "precious\n", 9) == 0, "the victim was written");
  free(b);
  struct stat st;
  ck_assert_int_eq(lstat(tmp, &st), 0);
  ck_assert(S_ISLNK(st.st_mode));
  ck_assert_int_eq(lstat(p, &st), 0);
  ck_assert(S_ISREG(st.st_mode));
  ck_assert_uint_eq(st.st_mode & 0777, 0640); /* 0666 less the umask */
  ck_assert_int_eq(dir_entries(dir), 3);
  ck_assert_int_eq(unlink(tmp), 0);
  /* a link at the path itself: replaced by the new file, its target kept */
  ck_assert_int_eq(unlink(p), 0);
  ck_assert_int_eq(symlink(victim, p), 0);
  ck_assert_msg(write(c, p) == DP_OK, "%s", dp_ctx_error(c));
  ck_assert_int_eq(lstat(p, &st), 0);
  ck_assert(S_ISREG(st.st_mode));
  b = file_read(victim, &n);
  ck_assert_msg(n == 9 && memcmp(b, "precious\n", 9) == 0, "the link's target was written");
  free(b);
  ck_assert_int_eq(dir_entries(dir), 2);
  ck_assert_int_eq(unlink(p), 0);
  ck_assert_int_eq(unlink(victim), 0);
}

void expect_not_a_file_refused(dp_ctx *c, dp_status (*read)(dp_ctx *, const char *),
                               const char *dir, const char *name) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  ck_assert_int_eq(mkfifo(p, 0600), 0);
  alarm(10);
  dp_status s = read(c, p);
  alarm(0);
  ck_assert_int_eq(s, DP_ERR_IO);
  ck_assert_msg(strstr(dp_ctx_error(c), "is not a regular file (a FIFO)"), "%s",
                dp_ctx_error(c));
  ck_assert_int_eq(unlink(p), 0);
  ck_assert_int_eq(read(c, dir), DP_ERR_IO);
  ck_assert_msg(strstr(dp_ctx_error(c), "is not a regular file (a directory)"), "%s",
                dp_ctx_error(c));
}

uint32_t le32(const unsigned char *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

uint64_t le64(const unsigned char *b) { return le32(b) | (uint64_t)le32(b + 4) << 32; }

uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1Dull;
}

bool cuda_or_skip(const char *suite, const char *test) {
  if (dp_cuda_available()) return true;
  fprintf(stderr, "SKIP %s: %s: the cuda backend is not in this build\n", suite, test);
  return false;
}

dp_status try_steps(rig *r, int from, int to, int *failed_at) {
  int rows = dp_plan_config(r->p)->batch;
  int in = dp_model_input_width(r->m), out = dp_model_output_width(r->m);
  /* a sequence model: token ids in, a class per position out */
  int T = dp_model_positions(r->m), classes = out / T;
  dp_layer_info first;
  int vocab = dp_model_layer(r->m, 0, &first) == DP_OK ? first.vocab : 0;
  float *x = malloc(sizeof(float) * (size_t)rows * (size_t)in);
  float *ty = malloc(sizeof(float) * (size_t)rows * (size_t)out);
  int32_t *t = malloc(sizeof(int32_t) * (size_t)rows * (size_t)T);
  bool ce = dp_model_loss(r->m) == DP_LOSS_SOFTMAX_CE;
  dp_status st = x && ty && t ? DP_OK : DP_ERR_NOMEM;
  *failed_at = from;
  for (int k = from; k < to && !st; k++) {
    uint64_t s = (uint64_t)k * 0x9E3779B97F4A7C15ull + 11;
    for (int i = 0; i < rows * in; i++)
      x[i] = vocab ? (float)(rng_next(&s) % (uint64_t)vocab)
                   : (float)(rng_next(&s) >> 40) * 0x1p-23f - 1.0f;
    for (int i = 0; i < rows * T; i++) t[i] = (int32_t)(rng_next(&s) % (uint64_t)classes);
    for (int i = 0; i < rows * out; i++) ty[i] = (float)(rng_next(&s) >> 40) * 0x1p-24f;
    st = dp_train_step(r->c, rows, in, x, ce ? (const void *)t : ty, NULL);
    *failed_at = k;
  }
  free(x);
  free(ty);
  free(t);
  return st;
}

void run_steps(rig *r, int from, int to) {
  int k = from;
  dp_status st = try_steps(r, from, to, &k);
  ck_assert_msg(st == DP_OK, "step %d: %s: %s", k, dp_status_name(st), dp_ctx_error(r->c));
}

/* ---- checkpoint files by hand (docs/CHECKPOINT.md) ----------------------------- */

static void put64le(unsigned char *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

void ckpt_reseal(unsigned char *b, size_t len) {
  size_t off = 16;
  while (off + 24 <= len) {
    uint64_t pl = le64(b + off + 8);
    if (pl > len - off - 24) return; /* a damaged length: nothing to follow */
    if (memcmp(b + off, "END ", 4) == 0) {
      put64le(b + off + 16, dp_hash_bytes(b, off + 16));
      return;
    }
    put64le(b + off + 16 + pl, dp_hash_bytes(b + off + 16, (size_t)pl));
    off += 24 + (size_t)pl;
  }
}

unsigned char *ckpt_as_version(const unsigned char *v4, size_t len, int version,
                               size_t *out_len) {
  ck_assert(version >= 1 && version <= 4 && len >= 16 && le32(v4 + 8) == 4);
  unsigned char *b = malloc(len);
  ck_assert_ptr_nonnull(b);
  size_t n = 0, off = 16;
  memcpy(b, v4, 16);
  b[8] = (unsigned char)version;
  b[12] = version >= 3 ? 6 : 5;
  n = 16;
  while (off + 24 <= len) { /* each section, as the version has it */
    const unsigned char *s = v4 + off;
    size_t pl = (size_t)le64(s + 8);
    ck_assert(pl <= len - off - 24);
    bool appd = memcmp(s, "APPD", 4) == 0, step = memcmp(s, "STEP", 4) == 0;
    if (!(appd && version < 3)) {
      size_t keep = step && version == 1 ? 8 : pl; /* version 1: the step alone */
      memcpy(b + n, s, 16 + keep);
      put64le(b + n + 8, keep);
      if (step && (version == 2 || version == 3)) /* a reserved 0, not the momentum */
        memset(b + n + 16 + 12, 0, 4);
      n += 24 + keep;
    }
    off += 24 + pl;
  }
  ck_assert_uint_eq(off, len);
  ckpt_reseal(b, n);
  *out_len = n;
  return b;
}
