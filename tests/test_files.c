/* Files that libdp and the dp tool write (issue 26): only a regular file or a
 * missing path is ever written; a FIFO, a device or a directory at the path is
 * refused, before any work, and left as it was; the temporary file is new
 * (O_EXCL | O_NOFOLLOW, an unpredictable name, mode 0600 until the rename),
 * so a link planted at a name is never opened; an output that is one of the
 * command's inputs is refused. The public dp_file_* calls first, then every
 * writing command of the tool end to end. (dp_ckpt_save and
 * dp_ckpt_export_safetensors: expect_write_keeps_nodes in their suites.) */
#include "capture.h"
#include "cli.h"
#include "helpers.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define RUN(cmd, ...) capture_cmd((cmd), ARGC(__VA_ARGS__), ARGV(__VA_ARGS__))

static const char PRECIOUS[] = "precious\n";

/* dir/name in a buffer of the caller's. */
static char *at(char *buf, size_t cap, const char *dir, const char *name) {
  snprintf(buf, cap, "%s/%s", dir, name);
  return buf;
}

static void put(const char *path, const char *text) {
  file_write(path, text, strlen(text));
}

/* 1 when path holds exactly text. */
static int holds(const char *path, const char *text) {
  size_t n;
  unsigned char *b = file_read(path, &n);
  int same = n == strlen(text) && memcmp(b, text, n) == 0;
  free(b);
  return same;
}

static mode_t lmode(const char *path) {
  struct stat st;
  ck_assert_msg(lstat(path, &st) == 0, "%s: %s", path, strerror(errno));
  return st.st_mode;
}

/* The nodes a writer must refuse and keep: kind for make_node (or 'l': a
 * symbolic link to a FIFO, 'L' to a directory), what the refusal says. */
typedef struct {
  char kind;
  const char *says, *says_in_place;
} node_case;

static const node_case NODES[] = {
    {'p', "is a FIFO (named pipe), not a regular file", NULL},
    {'c', "is a character device, not a regular file", NULL},
    {'d', "is a directory", NULL},
    {'l', "is a symbolic link to a FIFO (named pipe)",
     "is a symbolic link (it is written in place"},
    {'L', "is a symbolic link to a directory",
     "is a symbolic link (it is written in place"},
};
#define N_NODES (int)(sizeof NODES / sizeof NODES[0])

/* Makes node case k at path (its target, for a link, at path + "-target"):
 * false when this process may not (a device without CAP_MKNOD). */
static bool node_make(const char *path, const node_case *k) {
  if (k->kind != 'l' && k->kind != 'L') return make_node(path, k->kind);
  char target[440];
  snprintf(target, sizeof target, "%s-target", path);
  ck_assert(make_node(target, k->kind == 'l' ? 'p' : 'd'));
  ck_assert_int_eq(symlink(target, path), 0);
  return true;
}

static void node_remove(const char *path, const node_case *k) {
  char target[440];
  snprintf(target, sizeof target, "%s-target", path);
  ck_assert_int_eq(k->kind == 'd' ? rmdir(path) : unlink(path), 0);
  if (k->kind == 'l') ck_assert_int_eq(unlink(target), 0);
  if (k->kind == 'L') ck_assert_int_eq(rmdir(target), 0);
}

/* A refusal naming what is at path, and the node as it was. */
static void refused(dp_status s, const char *path, mode_t was, const char *says) {
  ck_assert_msg(s == DP_ERR_IO, "%s: %s", path, dp_status_name(s));
  ck_assert_msg(strstr(dp_last_error(), says) && strstr(dp_last_error(), path),
                "'%s' lacks '%s'", dp_last_error(), says);
  ck_assert_uint_eq(lmode(path), was);
}

/* ---- the library's calls ---- */

START_TEST(create_refuses_what_is_not_a_regular_file) {
  tmpdir t;
  tmp_make(&t, "dp_files", "out.bin");
  for (int i = 0; i < N_NODES; i++) {
    const node_case *k = &NODES[i];
    if (!node_make(t.path, k)) continue;
    mode_t was = lmode(t.path);
    int n = dir_entries(t.dir);
    static int sentinel;
    dp_file *f = (dp_file *)&sentinel;
    alarm(10); /* an open that waits on a FIFO: a failure, not a hang */
    refused(dp_file_create(t.path, "test file", &f), t.path, was, k->says);
    ck_assert_ptr_null(f);
    refused(dp_file_check(t.path, "test file", 0), t.path, was, k->says);
    const char *in_place = k->says_in_place ? k->says_in_place : k->says;
    refused(dp_file_check(t.path, "test file", 1), t.path, was, in_place);
    FILE *out = stdin;
    refused(dp_file_append(t.path, "test file", 1, &out), t.path, was, in_place);
    alarm(0);
    ck_assert_ptr_null(out);
    ck_assert_msg(strstr(dp_last_error(), "cannot write test file '"), "%s",
                  dp_last_error());
    ck_assert_int_eq(dir_entries(t.dir), n); /* no temporary file left */
    node_remove(t.path, k);
  }
  ck_assert_int_eq(dir_entries(t.dir), 0);
  dp_file *f;
  ck_assert_int_eq(dp_file_create("", "x", &f), DP_ERR_INVALID);
  ck_assert_int_eq(dp_file_create(NULL, "x", &f), DP_ERR_INVALID);
  ck_assert_int_eq(dp_file_check("", "x", 1), DP_ERR_INVALID);
  FILE *out;
  ck_assert_int_eq(dp_file_append(NULL, "x", 0, &out), DP_ERR_INVALID);
  ck_assert_int_eq(dp_file_commit(NULL), DP_ERR_INVALID);
  dp_file_discard(NULL);
  tmp_done(&t);
}
END_TEST

/* A FIFO made at the path while the file was being written is not renamed
 * over either: the check runs again just before the rename. */
START_TEST(commit_checks_the_path_again_before_the_rename) {
  tmpdir t;
  tmp_make(&t, "dp_files", "out.bin");
  dp_file *f;
  ck_assert_int_eq(dp_file_create(t.path, "test file", &f), DP_OK);
  fputs("content\n", dp_file_stream(f));
  ck_assert(make_node(t.path, 'p'));
  refused(dp_file_commit(f), t.path, lmode(t.path), "is a FIFO (named pipe)");
  ck_assert_int_eq(dir_entries(t.dir), 1); /* the temporary file removed */
  tmp_done(&t);
}
END_TEST

/* Names in dir that start with prefix and end in 12 hex digits (the one
 * named `except` aside), each a new regular file of mode 0600. */
static int temp_names(const char *dir, const char *prefix, const char *except) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) || !strcmp(e->d_name, except)) continue;
    const char *suffix = e->d_name + strlen(prefix);
    ck_assert_msg(strlen(suffix) == 12 && strspn(suffix, "0123456789abcdef") == 12, "%s",
                  e->d_name);
    char p[600];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    ck_assert_int_eq(lstat(p, &st), 0);
    ck_assert(S_ISREG(st.st_mode) && st.st_nlink == 1);
    ck_assert_uint_eq(st.st_mode & 0777, 0600);
    n++;
  }
  closedir(d);
  return n;
}

START_TEST(temporary_file_is_new_private_and_unpredictable) {
  tmpdir t;
  tmp_make(&t, "dp_files", "victim");
  put(t.path, PRECIOUS);
  char p[400], planted[440], name[64];
  at(p, sizeof p, t.dir, "out.bin");
  snprintf(planted, sizeof planted, "%s.tmp.%ld", p, (long)getpid());
  snprintf(name, sizeof name, "out.bin.tmp.%ld", (long)getpid());
  ck_assert_int_eq(symlink(t.path, planted), 0);
  /* two at once: two new files of their own, mode 0600, random names */
  dp_file *a, *b;
  ck_assert_int_eq(dp_file_create(p, "test file", &a), DP_OK);
  ck_assert_int_eq(dp_file_create(p, "test file", &b), DP_OK);
  ck_assert_int_eq(temp_names(t.dir, "out.bin.tmp.", name), 2);
  fputs("one\n", dp_file_stream(a));
  fputs("two\n", dp_file_stream(b));
  mode_t mask = umask(022);
  ck_assert_int_eq(dp_file_commit(a), DP_OK);
  ck_assert_int_eq(dp_file_commit(b), DP_OK);
  umask(mask);
  ck_assert(holds(p, "two\n"));
  ck_assert_uint_eq(lmode(p) & 0777, 0644); /* 0666 less the umask */
  ck_assert(holds(t.path, PRECIOUS));
  ck_assert(S_ISLNK(lmode(planted)));
  /* discarded: the temporary file removed, the path untouched */
  ck_assert_int_eq(dp_file_create(p, "test file", &a), DP_OK);
  fputs("three\n", dp_file_stream(a));
  dp_file_discard(a);
  ck_assert(holds(p, "two\n"));
  ck_assert_int_eq(temp_names(t.dir, "out.bin.tmp.", name), 0);
  ck_assert_int_eq(dir_entries(t.dir), 3); /* victim, planted link, out.bin */
  tmp_done(&t);
}
END_TEST

/* A file name of up to NAME_MAX bytes is written, though "<name>.tmp.<12 hex>"
 * would pass NAME_MAX: the temporary name is cut to fit (an outside check,
 * session 24: names of 241-255 bytes failed with "File name too long"). */
START_TEST(longest_file_names_are_written) {
  tmpdir t;
  tmp_make(&t, "dp_files", "x");
  static const int lens[] = {200, 238, 239, 241, 250, 255};
  for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
    char name[256], p[600];
    memset(name, 'a' + (int)i, (size_t)lens[i]);
    name[lens[i]] = '\0';
    at(p, sizeof p, t.dir, name);
    dp_file *f;
    ck_assert_msg(dp_file_create(p, "test file", &f) == DP_OK, "%d bytes: %s", lens[i],
                  dp_last_error());
    fputs("long\n", dp_file_stream(f));
    ck_assert_msg(dp_file_commit(f) == DP_OK, "%d bytes: %s", lens[i], dp_last_error());
    ck_assert(holds(p, "long\n"));
    /* written again over it: the rename replaces it */
    ck_assert_int_eq(dp_file_create(p, "test file", &f), DP_OK);
    fputs("again\n", dp_file_stream(f));
    ck_assert_int_eq(dp_file_commit(f), DP_OK);
    ck_assert(holds(p, "again\n"));
    ck_assert_int_eq(unlink(p), 0);
  }
  ck_assert_int_eq(dir_entries(t.dir), 0);
  tmp_done(&t);
}
END_TEST

/* A write that fails (here: past the file size limit, as a full disk would)
 * is reported with the system's reason, and the old file stays. */
START_TEST(failed_write_leaves_the_old_file) {
  tmpdir t;
  tmp_make(&t, "dp_files", "out.bin");
  put(t.path, "old\n");
  struct rlimit was, small = {.rlim_cur = 4096, .rlim_max = RLIM_INFINITY};
  ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &was), 0);
  small.rlim_max = was.rlim_max;
  signal(SIGXFSZ, SIG_IGN); /* EFBIG instead of the signal */
  dp_file *f;
  ck_assert_int_eq(dp_file_create(t.path, "test file", &f), DP_OK);
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
  static char big[65536];
  fwrite(big, 1, sizeof big, dp_file_stream(f));
  dp_status s = dp_file_commit(f);
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &was), 0);
  ck_assert_int_eq(s, DP_ERR_IO);
  ck_assert_msg(strstr(dp_last_error(), strerror(EFBIG)), "%s", dp_last_error());
  ck_assert(holds(t.path, "old\n"));
  ck_assert_int_eq(dir_entries(t.dir), 1);
  tmp_done(&t);
}
END_TEST

START_TEST(symlink_at_the_path_is_replaced_not_followed) {
  tmpdir t;
  tmp_make(&t, "dp_files", "victim");
  put(t.path, PRECIOUS);
  char p[400], gone[400];
  at(p, sizeof p, t.dir, "out.bin");
  ck_assert_int_eq(symlink(t.path, p), 0);
  dp_file *f;
  ck_assert_int_eq(dp_file_create(p, "test file", &f), DP_OK);
  fputs("new\n", dp_file_stream(f));
  ck_assert_int_eq(dp_file_commit(f), DP_OK);
  ck_assert(S_ISREG(lmode(p)) && holds(p, "new\n"));
  ck_assert(holds(t.path, PRECIOUS));
  /* a dangling link: replaced too */
  ck_assert_int_eq(unlink(p), 0);
  ck_assert_int_eq(symlink(at(gone, sizeof gone, t.dir, "gone"), p), 0);
  ck_assert_int_eq(dp_file_create(p, "test file", &f), DP_OK);
  ck_assert_int_eq(dp_file_commit(f), DP_OK);
  ck_assert(S_ISREG(lmode(p)));
  ck_assert_int_ne(access(gone, F_OK), 0);
  tmp_done(&t);
}
END_TEST

/* `dp plan --svg /dev/stdout > f`, as root, replaced the system's /dev/stdout
 * link with the SVG. The regular file that is one of the process's standard
 * streams, by any name (itself, a link to it, /proc/self/fd/1, a link to
 * that), is refused by the writers that replace a file and left as it was, and
 * so is any link into /proc; an in-place writer (a log appended to) replaces
 * nothing and takes the file itself (it refuses every link). */
START_TEST(a_standard_stream_is_never_replaced) {
  tmpdir t;
  tmp_make(&t, "dp_files", "stream");
  put(t.path, PRECIOUS);
  char link[400], proc[400], other[400];
  ck_assert_int_eq(symlink(t.path, at(link, sizeof link, t.dir, "to-stream")), 0);
  ck_assert_int_eq(symlink("/proc/self/fd/1", at(proc, sizeof proc, t.dir, "stdout")), 0);
  ck_assert_int_eq(symlink("/proc/self/fd/97", at(other, sizeof other, t.dir, "fd97")), 0);
  fflush(stdout);
  int saved = dup(1), fd = open(t.path, O_WRONLY | O_APPEND);
  ck_assert(saved >= 0 && fd >= 0 && dup2(fd, 1) == 1);
  close(fd);
  const char *paths[] = {t.path, link, proc, "/proc/self/fd/1", other};
  char says[5][200];
  mode_t was[5];
  dp_status got[5][3];
  dp_file *f[5] = {NULL};
  for (int i = 0; i < 5; i++) {
    was[i] = lmode(paths[i]);
    got[i][0] = dp_file_create(paths[i], "test file", &f[i]);
    got[i][1] = dp_file_check(paths[i], "test file", 0);
    snprintf(says[i], sizeof says[i], "%s", dp_last_error());
    got[i][2] = dp_file_check(paths[i], "test file", 1);
  }
  ck_assert_int_eq(dup2(saved, 1), 1); /* stdout back before any assertion */
  close(saved);
  for (int i = 0; i < 5; i++) {
    for (int w = 0; w < 3; w++)
      ck_assert_msg(got[i][w] == (i == 0 && w == 2 ? DP_OK : DP_ERR_IO),
                    "%s, writer %d: %s", paths[i], w, dp_status_name(got[i][w]));
    ck_assert(f[i] == NULL);
    ck_assert_msg(strstr(says[i], i < 4 ? "standard output" : "into /proc"), "%s", says[i]);
    ck_assert_uint_eq(lmode(paths[i]), was[i]);
  }
  ck_assert(holds(t.path, PRECIOUS));
  /* /dev/fd/N: a file descriptor through /dev/fd's link to /proc/self/fd (an
   * outside check, session 24: refused as the temporary file's "No such file or
   * directory") */
  int fd3 = open(t.path, O_WRONLY | O_APPEND);
  ck_assert(fd3 >= 0);
  char devfd[64];
  snprintf(devfd, sizeof devfd, "/dev/fd/%d", fd3);
  dp_file *g = NULL;
  if (access("/dev/fd", F_OK) == 0) {
    ck_assert_int_eq(dp_file_create(devfd, "test file", &g), DP_ERR_IO);
    ck_assert_msg(strstr(dp_last_error(), "is a symbolic link into /proc"), "%s",
                  dp_last_error());
    ck_assert_ptr_null(g);
  }
  close(fd3);
  ck_assert(holds(t.path, PRECIOUS));
  tmp_done(&t);
}
END_TEST

START_TEST(append_writes_in_place_and_never_through_a_link) {
  tmpdir t;
  tmp_make(&t, "dp_files", "victim");
  put(t.path, PRECIOUS);
  char p[400], link[400];
  at(p, sizeof p, t.dir, "run.jsonl");
  FILE *f;
  mode_t mask = umask(022);
  ck_assert_int_eq(dp_file_append(p, "log", 0, &f), DP_OK); /* created */
  umask(mask);
  ck_assert_uint_eq(lmode(p) & 0777, 0644);
  fputs("a\n", f);
  ck_assert_int_eq(fclose(f), 0);
  ck_assert_int_eq(dp_file_append(p, "log", 0, &f), DP_OK); /* appended to */
  fputs("b\n", f);
  ck_assert_int_eq(fclose(f), 0);
  ck_assert(holds(p, "a\nb\n"));
  ck_assert_int_eq(dp_file_append(p, "log", 1, &f), DP_OK); /* written anew */
  fputs("c\n", f);
  ck_assert_int_eq(fclose(f), 0);
  ck_assert(holds(p, "c\n"));
  /* a link, to a file or to nothing: refused, nothing written or created */
  ck_assert_int_eq(symlink(t.path, at(link, sizeof link, t.dir, "link.jsonl")), 0);
  ck_assert_int_eq(dp_file_append(link, "log", 1, &f), DP_ERR_IO);
  ck_assert_msg(strstr(dp_last_error(), "is a symbolic link"), "%s", dp_last_error());
  ck_assert(holds(t.path, PRECIOUS));
  ck_assert_int_eq(unlink(t.path), 0);
  ck_assert_int_eq(dp_file_append(link, "log", 0, &f), DP_ERR_IO);
  ck_assert_int_ne(access(t.path, F_OK), 0);
  ck_assert_int_eq(dir_entries(t.dir), 2);
  tmp_done(&t);
}
END_TEST

START_TEST(check_creates_nothing_and_follows_no_link) {
  tmpdir t;
  tmp_make(&t, "dp_files", "victim");
  put(t.path, PRECIOUS);
  char p[400], planted[440], missing[400];
  at(p, sizeof p, t.dir, "out.bin");
  snprintf(planted, sizeof planted, "%s.tmp.%ld", p, (long)getpid());
  ck_assert_int_eq(symlink(t.path, planted), 0);
  ck_assert_int_eq(dp_file_check(p, "test file", 0), DP_OK);
  ck_assert_int_eq(dp_file_check(p, "test file", 1), DP_OK);
  ck_assert(holds(t.path, PRECIOUS));
  ck_assert_int_ne(access(p, F_OK), 0);
  ck_assert_int_eq(dir_entries(t.dir), 2);
  /* an existing file: checked, not truncated */
  put(p, "kept\n");
  ck_assert_int_eq(dp_file_check(p, "test file", 0), DP_OK);
  ck_assert_int_eq(dp_file_check(p, "test file", 1), DP_OK);
  ck_assert(holds(p, "kept\n"));
  /* a missing directory: the system's reason */
  at(missing, sizeof missing, t.dir, "no/such/out.bin");
  for (int in_place = 0; in_place < 2; in_place++) {
    ck_assert_int_eq(dp_file_check(missing, "test file", in_place), DP_ERR_IO);
    ck_assert_msg(strstr(dp_last_error(), strerror(ENOENT)), "%s", dp_last_error());
  }
  ck_assert_int_eq(dir_entries(t.dir), 3);
  tmp_done(&t);
}
END_TEST

/* dp_file_room: the directory's file system against a size. A directory that
 * does not exist, and an empty name, are refused naming them. */
START_TEST(room_is_the_file_systems_free_space) {
  tmpdir t;
  tmp_make(&t, "dp_files_room", "x.ckpt");
  ck_assert_int_eq(dp_file_room(t.path, "checkpoint", 1), DP_OK);
  ck_assert_int_eq(dp_file_room("relative.ckpt", "checkpoint", 1), DP_OK); /* "." */
  ck_assert_int_eq(dp_file_room(t.path, "checkpoint", SIZE_MAX), DP_ERR_IO);
  ck_assert_msg(strstr(dp_last_error(), "no room for checkpoint '") &&
                    strstr(dp_last_error(), t.path) && strstr(dp_last_error(), "free"),
                "%s", dp_last_error());
  char gone[400];
  snprintf(gone, sizeof gone, "%s/no/such/dir/x.ckpt", t.dir);
  ck_assert_int_eq(dp_file_room(gone, "checkpoint", 1), DP_ERR_IO);
  ck_assert_msg(strstr(dp_last_error(), "No such file"), "%s", dp_last_error());
  ck_assert_int_eq(dp_file_room("", "checkpoint", 1), DP_ERR_INVALID);
  ck_assert_int_eq(dp_file_room(NULL, NULL, 1), DP_ERR_INVALID);
  ck_assert_int_eq(dir_entries(t.dir), 0); /* nothing created */
  tmp_done(&t);
}
END_TEST

/* ---- the dp tool, end to end ---- */

static const char SPEC[] =
    "input 4\nlinear 8\nrelu\nlinear 3\nloss softmax_cross_entropy\n";

/* A directory with a model, 40 rows of data, a checkpoint trained on them
 * and its safetensors export. */
typedef struct {
  tmpdir t;
  char model[400], data[400], ckpt[400], st[400];
} cli_rig;

static void cli_open(cli_rig *r) {
  tmp_make(&r->t, "dp_files_cli", NULL);
  put(at(r->model, sizeof r->model, r->t.dir, "m.dpm"), SPEC);
  char csv[4096];
  size_t len = 0;
  for (int i = 0; i < 40; i++)
    len += (size_t)snprintf(csv + len, sizeof csv - len, "%d,%d.5,%d,-%d.25,0.%d\n", i % 3,
                            i, i % 7, i % 5, i);
  put(at(r->data, sizeof r->data, r->t.dir, "d.csv"), csv);
  at(r->ckpt, sizeof r->ckpt, r->t.dir, "m.ckpt");
  at(r->st, sizeof r->st, r->t.dir, "m.safetensors");
  cmd_result c = RUN(dpt_cmd_train, "--model", r->model, "--data", r->data, "--batch", "8",
                     "--epochs", "1", "--quiet", "--save", r->ckpt);
  ck_assert_msg(c.rc == DPT_EXIT_OK, "%s", c.err);
  cmd_result_free(&c);
  c = RUN(dpt_cmd_export, r->ckpt, "--safetensors", r->st);
  ck_assert_msg(c.rc == DPT_EXIT_OK, "%s", c.err);
  cmd_result_free(&c);
}

/* Every command that writes a file, writing `out`: 0-2 train (--save,
 * --plot, --log), 3 import, 4 export, 5 predict, 6 plan --svg. */
#define N_WRITERS 7
static const char *const WRITER[N_WRITERS] = {"train --save", "train --plot", "train --log",
                                              "import",       "export",       "predict",
                                              "plan --svg"};

static cmd_result run_writer(const cli_rig *r, int w, char *out) {
  char *m = (char *)r->model, *d = (char *)r->data, *ck = (char *)r->ckpt,
       *st = (char *)r->st;
  static const char *const opt[3] = {"--save", "--plot", "--log"};
  switch (w) {
  case 0:
  case 1:
  case 2:
    return RUN(dpt_cmd_train, "--model", m, "--data", d, "--batch", "8", "--epochs", "1",
               "--quiet", (char *)opt[w], out);
  case 3: return RUN(dpt_cmd_import, st, "--model", m, "--out", out);
  case 4: return RUN(dpt_cmd_export, ck, "--safetensors", out);
  case 5: return RUN(dpt_cmd_predict, "--checkpoint", ck, "--data", d, "--out", out);
  default: return RUN(dpt_cmd_plan, "--model", m, "--batch", "8", "--svg", out);
  }
}

/* The repro: `--save` over a device made it a regular file. Every
 * output refuses a FIFO, a device, a directory or a link to one, in one line
 * naming what it is, before any work (nothing trained or printed; dp plan,
 * which only plans, excepted), and leaves it as it was. */
START_TEST(cli_outputs_refuse_nodes_before_any_work) {
  cli_rig r;
  cli_open(&r);
  char p[400];
  at(p, sizeof p, r.t.dir, "out");
  for (int i = 0; i < N_NODES; i++) {
    const node_case *k = &NODES[i];
    if (!node_make(p, k)) continue;
    mode_t was = lmode(p);
    for (int w = 0; w < N_WRITERS; w++) {
      alarm(20);
      cmd_result c = run_writer(&r, w, p);
      alarm(0);
      const char *says = w == 2 && k->says_in_place ? k->says_in_place : k->says;
      ck_assert_msg(c.rc == DPT_EXIT_FAIL, "%s over %c: exit %d", WRITER[w], k->kind, c.rc);
      ck_assert_msg(strstr(c.err, says) && strstr(c.err, p) && strchr(c.err, '\n') &&
                        !strchr(c.err, '\n')[1] && !strstr(c.err, ".c:"),
                    "%s over %c: %s", WRITER[w], k->kind, c.err);
      ck_assert_msg(!c.out[0], "%s: %s", WRITER[w], c.out); /* plan: no table either */
      ck_assert_uint_eq(lmode(p), was);
      cmd_result_free(&c);
    }
    node_remove(p, k);
  }
  tmp_done(&r.t);
}
END_TEST

/* The second repro: a link planted at "<out>.tmp.<pid>" made
 * `dp import` truncate its target. Every output's temporary file is new, so
 * the link is never opened; --log, written in place, refuses a link at its
 * own path. */
START_TEST(cli_never_opens_a_planted_link) {
  cli_rig r;
  cli_open(&r);
  char victim[400], p[400], planted[440];
  at(victim, sizeof victim, r.t.dir, "victim");
  put(victim, PRECIOUS);
  for (int w = 0; w < N_WRITERS; w++) {
    snprintf(p, sizeof p, "%s/out%d", r.t.dir, w);
    snprintf(planted, sizeof planted, "%s.tmp.%ld", p, (long)getpid());
    ck_assert_int_eq(symlink(victim, w == 2 ? p : planted), 0);
    cmd_result c = run_writer(&r, w, p);
    ck_assert_msg(holds(victim, PRECIOUS), "%s wrote the link's target", WRITER[w]);
    if (w == 2) {
      ck_assert_int_eq(c.rc, DPT_EXIT_FAIL);
      ck_assert_msg(strstr(c.err, "is a symbolic link"), "%s", c.err);
      ck_assert(S_ISLNK(lmode(p)));
    } else {
      ck_assert_msg(c.rc == DPT_EXIT_OK, "%s: %s", WRITER[w], c.err);
      ck_assert(S_ISREG(lmode(p)) && S_ISLNK(lmode(planted)));
    }
    cmd_result_free(&c);
  }
  tmp_done(&r.t);
}
END_TEST

/* `dp export F --safetensors F` replaced the checkpoint it read. An output
 * that is an input (the same path, a hard link, a link to it) is refused, as
 * are two outputs that are one file; --save may be --resume. */
START_TEST(cli_refuses_an_output_that_is_an_input) {
  cli_rig r;
  cli_open(&r);
  char hard[400], soft[400], log[400], fresh[400], fresh2[400];
  at(fresh, sizeof fresh, r.t.dir, "fresh.ckpt");
  at(fresh2, sizeof fresh2, r.t.dir, "./fresh.ckpt");
  at(hard, sizeof hard, r.t.dir, "hard.ckpt");
  at(soft, sizeof soft, r.t.dir, "soft.ckpt");
  at(log, sizeof log, r.t.dir, "run.jsonl");
  ck_assert_int_eq(link(r.ckpt, hard), 0);
  ck_assert_int_eq(symlink(r.ckpt, soft), 0);
  char *M = r.model, *D = r.data, *C = r.ckpt, *S = r.st, *inputs[4] = {M, D, C, S};
  size_t n[4];
  unsigned char *was[4];
  for (int i = 0; i < 4; i++) was[i] = file_read(inputs[i], &n[i]);
  struct {
    cmd_result c;
    const char *says;
  } cases[] = {
      {RUN(dpt_cmd_export, C, "--safetensors", C), "it is the checkpoint"},
      {RUN(dpt_cmd_export, C, "--safetensors", hard), "it is the checkpoint"},
      {RUN(dpt_cmd_export, C, "--safetensors", soft), "it is the checkpoint"},
      {RUN(dpt_cmd_import, S, "--model", M, "--out", S), "it is the safetensors file"},
      {RUN(dpt_cmd_import, S, "--model", M, "--out", M), "it is the model"},
      {RUN(dpt_cmd_train, "--model", M, "--data", D, "--batch", "8", "--save", D),
       "it is the data"},
      {RUN(dpt_cmd_train, "--model", M, "--data", D, "--batch", "8", "--save", M),
       "it is the model"},
      {RUN(dpt_cmd_train, "--model", M, "--data", D, "--batch", "8", "--resume", C,
           "--plot", C),
       "it is the checkpoint"},
      {RUN(dpt_cmd_train, "--model", M, "--data", D, "--batch", "8", "--log", D),
       "it is the data"},
      {RUN(dpt_cmd_train, "--model", M, "--data", D, "--batch", "8", "--log", log, "--plot",
           log),
       "it is also the"},
      /* one file not there yet, named two ways (an outside check: it trained) */
      {RUN(dpt_cmd_train, "--model", M, "--data", D, "--batch", "8", "--eval-every", "1",
           "--save", fresh, "--save-best", fresh2),
       "it is also the"},
      {RUN(dpt_cmd_predict, "--checkpoint", C, "--data", D, "--out", C),
       "it is the checkpoint"},
      {RUN(dpt_cmd_predict, "--checkpoint", C, "--data", D, "--out", D), "it is the data"},
      {RUN(dpt_cmd_plan, "--model", M, "--batch", "8", "--svg", M), "it is the model"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ck_assert_msg(cases[i].c.rc == DPT_EXIT_FAIL, "case %zu: exit %d", i, cases[i].c.rc);
    ck_assert_msg(strstr(cases[i].c.err, cases[i].says) && !cases[i].c.out[0],
                  "case %zu: %s", i, cases[i].c.err);
    cmd_result_free(&cases[i].c);
  }
  for (int i = 0; i < 4; i++) { /* every input as it was */
    size_t k;
    unsigned char *now = file_read(inputs[i], &k);
    ck_assert_msg(k == n[i] && memcmp(now, was[i], k) == 0, "%s changed", inputs[i]);
    free(now);
    free(was[i]);
  }
  ck_assert(S_ISLNK(lmode(soft)) && access(log, F_OK) != 0 && access(fresh, F_OK) != 0);
  /* resume and save to the one file: the save comes after the resume read it */
  cmd_result c = RUN(dpt_cmd_train, "--model", M, "--data", D, "--batch", "8", "--epochs",
                     "1", "--quiet", "--resume", C, "--save", C);
  ck_assert_msg(c.rc == DPT_EXIT_OK, "%s", c.err);
  ck_assert_msg(strstr(c.out, "(step 8)"), "%s", c.out);
  cmd_result_free(&c);
  tmp_done(&r.t);
}
END_TEST

/* --save on a file system without room for the checkpoint (a 64 KiB tmpfs,
 * where this test may mount one): refused before any training, the old file
 * kept; one that fits trains and saves. Skipped, saying why, where mounting
 * is not allowed. */
START_TEST(cli_save_without_room_is_refused_before_training) {
  tmpdir t;
  tmp_make(&t, "dp_files_full", "x.ckpt");
  if (mount("tmpfs", t.dir, "tmpfs", 0, "size=64k") != 0) {
    printf("skipped: files/cli_save_without_room_is_refused_before_training: cannot mount "
           "a tmpfs here (%s)\n",
           strerror(errno));
    tmp_done(&t);
    return;
  }
  char model[400], big[400], data[400];
  put(at(model, sizeof model, t.dir, "m.dpm"), SPEC);
  put(at(big, sizeof big, t.dir, "big.dpm"),
      "input 4\nlinear 4000\nrelu\nlinear 3\nloss softmax_cross_entropy\n");
  char csv[2048];
  size_t len = 0;
  for (int i = 0; i < 24; i++)
    len += (size_t)snprintf(csv + len, sizeof csv - len, "%d,%d.5,%d,-%d.25,0.%d\n", i % 3,
                            i, i % 7, i % 5, i);
  put(at(data, sizeof data, t.dir, "d.csv"), csv);
  cmd_result c = RUN(dpt_cmd_train, "--model", model, "--data", data, "--batch", "8",
                     "--epochs", "1", "--quiet", "--save", t.path);
  ck_assert_msg(c.rc == DPT_EXIT_OK, "%s", c.err);
  cmd_result_free(&c);
  size_t n;
  unsigned char *was = file_read(t.path, &n);
  /* 4000 x 4 + ... floats: 100 KB, more than the file system holds */
  c = RUN(dpt_cmd_train, "--model", big, "--data", data, "--batch", "8", "--epochs", "1",
          "--save", t.path);
  ck_assert_int_eq(c.rc, DPT_EXIT_FAIL);
  ck_assert_msg(strstr(c.err, "no room for checkpoint '") &&
                    strstr(c.err, "free some space") && !strstr(c.err, ".c:"),
                "%s", c.err);
  ck_assert_msg(!strstr(c.out, "epoch"), "trained before refusing: %s", c.out);
  size_t k;
  unsigned char *now = file_read(t.path, &k);
  ck_assert(k == n && memcmp(now, was, n) == 0);
  free(now);
  free(was);
  cmd_result_free(&c);
  /* a checkpoint (34 KB) that fits once but not beside itself: --save-best,
   * written again as the run improves, is refused; --save alone trains */
  unlink(t.path);
  put(big, "input 4\nlinear 1000\nrelu\nlinear 3\nloss softmax_cross_entropy\n");
  char best[420];
  at(best, sizeof best, t.dir, "best.ckpt");
  c = RUN(dpt_cmd_train, "--model", big, "--data", data, "--batch", "8", "--epochs", "1",
          "--eval-every", "1", "--save-best", best);
  ck_assert_int_eq(c.rc, DPT_EXIT_FAIL);
  ck_assert_msg(strstr(c.err, "no room for best checkpoint '") &&
                    strstr(c.err, "written beside the old one"),
                "%s", c.err);
  ck_assert_msg(access(best, F_OK) != 0 && !strstr(c.out, "epoch"), "%s", c.out);
  cmd_result_free(&c);
  /* what is at best now frees only its own bytes when replaced: an empty file,
   * or a link (replaced, its target kept) to a checkpoint elsewhere, is no
   * room for the run's second save (an outside check: both passed) */
  tmpdir far;
  tmp_make(&far, "dp_files_far", "far.ckpt");
  c = RUN(dpt_cmd_train, "--model", big, "--data", data, "--batch", "8", "--epochs", "1",
          "--quiet", "--save", far.path);
  ck_assert_msg(c.rc == DPT_EXIT_OK, "%s", c.err);
  cmd_result_free(&c);
  for (int k = 0; k < 2; k++) {
    if (k == 0)
      put(best, "");
    else
      ck_assert_int_eq(symlink(far.path, best), 0);
    c = RUN(dpt_cmd_train, "--model", big, "--data", data, "--batch", "8", "--epochs", "1",
            "--eval-every", "1", "--save-best", best);
    ck_assert_msg(c.rc == DPT_EXIT_FAIL && strstr(c.err, "no room for best checkpoint '"),
                  "case %d: exit %d: %s", k, c.rc, c.err);
    ck_assert_msg(!strstr(c.out, "epoch"), "%s", c.out);
    cmd_result_free(&c);
    unlink(best);
  }
  unlink(far.path);
  tmp_done(&far);
  c = RUN(dpt_cmd_train, "--model", big, "--data", data, "--batch", "8", "--epochs", "1",
          "--quiet", "--save", t.path);
  ck_assert_msg(c.rc == DPT_EXIT_OK, "%s", c.err);
  cmd_result_free(&c);
  umount(t.dir);
  tmp_done(&t);
}
END_TEST

Suite *files_suite(void) {
  Suite *s = suite_create("files");
  TCase *tc = tcase_create("library");
  tcase_add_test(tc, create_refuses_what_is_not_a_regular_file);
  tcase_add_test(tc, commit_checks_the_path_again_before_the_rename);
  tcase_add_test(tc, temporary_file_is_new_private_and_unpredictable);
  tcase_add_test(tc, longest_file_names_are_written);
  tcase_add_test(tc, failed_write_leaves_the_old_file);
  tcase_add_test(tc, symlink_at_the_path_is_replaced_not_followed);
  tcase_add_test(tc, a_standard_stream_is_never_replaced);
  tcase_add_test(tc, append_writes_in_place_and_never_through_a_link);
  tcase_add_test(tc, check_creates_nothing_and_follows_no_link);
  tcase_add_test(tc, room_is_the_file_systems_free_space);
  suite_add_tcase(s, tc);
  tc = tcase_create("tool");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, cli_outputs_refuse_nodes_before_any_work);
  tcase_add_test(tc, cli_never_opens_a_planted_link);
  tcase_add_test(tc, cli_refuses_an_output_that_is_an_input);
  tcase_add_test(tc, cli_save_without_room_is_refused_before_training);
  suite_add_tcase(s, tc);
  return s;
}
