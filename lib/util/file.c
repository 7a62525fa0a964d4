/* Files the library reads (a model spec, a checkpoint), opened without ever
 * blocking on them, and files it writes (checkpoints, safetensors; the dp
 * tool's outputs too, through the public dp_file_* calls), written so that a
 * crash leaves the old file or the new one, never a mix, and so that nothing
 * but a regular file at the path is ever replaced or opened for writing. */
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

const char *dp__file_kind(mode_t mode) {
  return S_ISDIR(mode)    ? "a directory"
         : S_ISFIFO(mode) ? "a FIFO"
         : S_ISSOCK(mode) ? "a socket"
         : S_ISREG(mode)  ? "a regular file"
         : S_ISLNK(mode)  ? "a symbolic link"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
                          : "not a file";
}

int dp__open_regular(const char *path, struct stat *st, const char **failed) {
  /* O_NONBLOCK: the open of a FIFO without a writer returns at once (a plain
   * open would wait for one for ever), so that the type check refuses it;
   * cleared before reading. */
  *failed = "open";
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return -1;
  int err, fl;
  if (fstat(fd, st) != 0) {
    *failed = "stat";
  } else if (!S_ISREG(st->st_mode)) {
    close(fd);
    return -2;
  } else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
    *failed = "read";
  } else {
    return fd;
  }
  err = errno;
  close(fd);
  errno = err;
  return -1;
}

dp_status dp__read_fd(int fd, void *b, size_t n, size_t *got, const char *what,
                      const char *path) {
  *got = 0;
  while (*got < n) {
    ssize_t r = read(fd, (unsigned char *)b + *got, n - *got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return dp__io_fail(what, path, "read", path, errno);
    if (r == 0) break; /* the file ended first (it shrank) */
    *got += (size_t)r;
  }
  return DP_OK;
}

dp_status dp__io_fail(const char *what, const char *path, const char *failed,
                      const char *file, int err) {
  if (strcmp(path, file) == 0)
    return DP_FAIL(DP_ERR_IO, "%s '%s': cannot %s it: %s", what, path, failed,
                   strerror(err));
  return DP_FAIL(DP_ERR_IO, "%s '%s': cannot %s '%s': %s", what, path, failed, file,
                 strerror(err));
}

/* ---- files written (dp_file_*) ------------------------------------------------ */

struct dp_file {
  FILE *f; /* over fd through write_out, which keeps the first error */
  int fd;  /* the temporary file */
  int err; /* errno of the first write that failed (0: none) */
  char *path, *tmp, *what;
};

/* DP_ERR_IO "cannot write <what> '<path>': [cannot <op>: ]<strerror>"
 * (DP_ERR_NOMEM when err is ENOMEM: a stream could not get its buffer). The
 * temporary file's name is left out: it is random, and removed again. */
static dp_status write_fail(const char *what, const char *path, const char *op, int err) {
  dp_status s = err == ENOMEM ? DP_ERR_NOMEM : DP_ERR_IO;
  if (!op) return DP_FAIL(s, "cannot write %s '%s': %s", what, path, strerror(err));
  return DP_FAIL(s, "cannot write %s '%s': cannot %s: %s", what, path, op, strerror(err));
}

/* What a node is, in the words of the dp tool's refusals of inputs. */
static const char *kind_of(mode_t mode) {
  return S_ISFIFO(mode) ? "a FIFO (named pipe)" : dp__file_kind(mode);
}

/* The name of the process's standard stream (fd 0, 1 or 2) that is the file
 * st, or NULL. */
static const char *std_stream(const struct stat *st) {
  static const char *const name[3] = {"input", "output", "error"};
  for (int fd = 0; fd < 3; fd++) {
    struct stat s;
    if (fstat(fd, &s) == 0 && s.st_dev == st->st_dev && s.st_ino == st->st_ino)
      return name[fd];
  }
  return NULL;
}

/* Whether path's directory is under /proc, reached through links (/dev/fd/3 is
 * /proc/self/fd/3: an outside check, session 24, found it refused as "No such
 * file or directory", the temporary file's, not as the link it is). */
static bool in_proc_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return false;
  size_t n = slash == path ? 1 : (size_t)(slash - path);
  char *dir = strndup(path, n), *real = dir ? realpath(dir, NULL) : NULL;
  bool in = real && (!strcmp(real, "/proc") || !strncmp(real, "/proc/", 6));
  free(real);
  free(dir);
  return in;
}

/* What may be at a path that is written: nothing, a regular file or (when it
 * is replaced by a rename, which never follows it) a symbolic link to a
 * regular file or to nothing. A device, FIFO, socket or directory (or a link
 * to one) is refused: a rename would destroy the node, an open for writing
 * could block or act on a device. So is the file that is one of the
 * process's standard streams (`--out /dev/stdout > f`: the rename would
 * replace the system's /dev/stdout link, and the stream would go on writing
 * to the replaced file), and a link into /proc (a process's open file). An
 * in-place write (dp_file_append) takes no link at all, since opening one
 * follows it. */
static dp_status check_target(const char *path, const char *what, bool in_place) {
  struct stat st, to;
  if (lstat(path, &st) != 0)
    return errno == ENOENT ? DP_OK : write_fail(what, path, NULL, errno);
  /* (a device or pipe that is a stream is refused below as what it is; an
   * in-place write replaces nothing) */
  const char *stream =
      !in_place && stat(path, &to) == 0 && S_ISREG(to.st_mode) ? std_stream(&to) : NULL;
  if (stream)
    return DP_FAIL(DP_ERR_IO,
                   "cannot write %s '%s': it is this process's standard %s (a file "
                   "written here replaces it by a rename, which the stream would not "
                   "follow): name another file",
                   what, path, stream);
  if (S_ISREG(st.st_mode)) return DP_OK;
  if (S_ISDIR(st.st_mode))
    return DP_FAIL(DP_ERR_IO, "cannot write %s '%s': is a directory", what, path);
  if (!S_ISLNK(st.st_mode))
    return DP_FAIL(DP_ERR_IO, "cannot write %s '%s': is %s, not a regular file", what, path,
                   kind_of(st.st_mode));
  if (in_place)
    return DP_FAIL(DP_ERR_IO,
                   "cannot write %s '%s': is a symbolic link (it is written in place, "
                   "never through a link: name the file itself)",
                   what, path);
  char text[8] = {0};
  if ((readlink(path, text, sizeof text - 1) >= 6 && strncmp(text, "/proc/", 6) == 0) ||
      in_proc_dir(path))
    return DP_FAIL(DP_ERR_IO,
                   "cannot write %s '%s': is a symbolic link into /proc (a process's "
                   "open file, not a file to replace): name the file itself",
                   what, path);
  if (stat(path, &to) != 0 || S_ISREG(to.st_mode)) return DP_OK; /* dangling: replaced */
  return DP_FAIL(DP_ERR_IO, "cannot write %s '%s': is a symbolic link to %s", what, path,
                 kind_of(to.st_mode));
}

/* 0666 less the process's umask: the mode fopen would give a new file. Read
 * from /proc (umask() sets it too, which another thread could observe);
 * 0644 where /proc cannot say. */
static mode_t new_file_mode(void) {
  unsigned mask = 022;
  FILE *f = fopen("/proc/self/status", "re");
  if (f) {
    char line[128];
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "Umask: %o", &mask) == 1) break;
    fclose(f);
  }
  return (mode_t)(0666 & ~mask);
}

/* 64 unpredictable bits: getrandom, or (where it fails) the clock, the pid,
 * a counter and an address, mixed (splitmix64). */
static uint64_t random_bits(void) {
  uint64_t v;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) == (ssize_t)sizeof v) return v;
  static _Atomic uint64_t counter;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  v = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 30 ^ (uint64_t)getpid() << 40 ^
      (uint64_t)(uintptr_t)&v ^ ++counter * 0x9e3779b97f4a7c15ull;
  v = (v ^ v >> 30) * 0xbf58476d1ce4e5b9ull;
  v = (v ^ v >> 27) * 0x94d049bb133111ebull;
  return v ^ v >> 31;
}

/* Creates "<path>.tmp.<12 random hex digits>", O_EXCL | O_NOFOLLOW, mode 0600:
 * never an existing file nor a link planted at a name, and no other user
 * can open it while it is written. A new name on EEXIST. A file name too long
 * for the suffix (more than NAME_MAX - 17 bytes: an outside check, session
 * 24, found names of 241-255 bytes unsaveable) is cut to leave room for it. */
static int create_temp(const char *path, char *tmp, size_t cap) {
  enum { SUFFIX = 17, KEEP = 255 - SUFFIX }; /* ".tmp." + 12 digits; NAME_MAX */
  const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
  size_t blen = strlen(base), keep = (size_t)(base - path) + (blen > KEEP ? KEEP : blen);
  for (int tries = 0; tries < 100; tries++) {
    snprintf(tmp, cap, "%.*s.tmp.%012llx", (int)keep, path,
             (unsigned long long)(random_bits() & 0xffffffffffffull));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

/* The stream's writes (fopencookie): all of b, or 0 with the reason kept in
 * f->err, so that a full disk is named as such however much later the
 * buffered write is flushed. */
static ssize_t write_out(void *cookie, const char *b, size_t n) {
  dp_file *f = cookie;
  for (size_t done = 0; done < n;) {
    ssize_t w = write(f->fd, b + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (!f->err) f->err = w < 0 ? errno : EIO;
      return 0;
    }
    done += (size_t)w;
  }
  return (ssize_t)n;
}

static void file_free(dp_file *f) {
  if (f->fd >= 0) close(f->fd);
  free(f->path);
  free(f->tmp);
  free(f->what);
  free(f);
}

dp_status dp_file_create(const char *path, const char *what, dp_file **out) {
  if (!out) return DP_FAIL(DP_ERR_INVALID, "dp_file_create: out is NULL");
  *out = NULL;
  if (!what) what = "file";
  if (!path || !*path)
    return DP_FAIL(DP_ERR_INVALID, "cannot write %s: %s file name", what,
                   path ? "an empty" : "no");
  dp_status s = check_target(path, what, false);
  if (s) return s;
  size_t n = strlen(path);
  dp_file *f = calloc(1, sizeof *f);
  if (f) {
    f->fd = -1;
    f->path = strdup(path);
    f->what = strdup(what);
    f->tmp = malloc(n + 32);
  }
  if (!f || !f->path || !f->what || !f->tmp) {
    if (f) file_free(f);
    return DP_FAIL(DP_ERR_NOMEM, "cannot write %s '%s': out of memory", what, path);
  }
  if ((f->fd = create_temp(path, f->tmp, n + 32)) < 0) {
    s = write_fail(what, path, NULL, errno);
    file_free(f);
    return s;
  }
  if (!(f->f = fopencookie(f, "w", (cookie_io_functions_t){.write = write_out}))) {
    s = write_fail(what, path, NULL, errno);
    unlink(f->tmp);
    file_free(f);
    return s;
  }
  *out = f;
  return DP_OK;
}

FILE *dp_file_stream(dp_file *f) { return f ? f->f : NULL; }

void dp_file_discard(dp_file *f) {
  if (!f) return;
  fclose(f->f);
  unlink(f->tmp);
  file_free(f);
}

/* path's directory (".": none named), from malloc; NULL when out of memory. */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  size_t n = !slash ? 0 : slash == path ? 1 : (size_t)(slash - path);
  char *dir = malloc(n + 2);
  if (!dir) return NULL;
  if (n)
    memcpy(dir, path, n);
  else
    dir[n++] = '.';
  dir[n] = 0;
  return dir;
}

/* fsyncs path's directory, which makes a rename in it durable. */
static dp_status sync_dir(const char *what, const char *path) {
  char *dir = dir_of(path);
  if (!dir) return DP_FAIL(DP_ERR_NOMEM, "cannot write %s '%s': out of memory", what, path);
  dp_status s = DP_OK;
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    s = write_fail(what, path, "open its directory", errno);
  else if (fsync(dfd) != 0 && errno != EINVAL) /* EINVAL: it cannot sync directories */
    s = write_fail(what, path, "sync its directory", errno);
  if (dfd >= 0) close(dfd);
  free(dir);
  return s;
}

dp_status dp_file_commit(dp_file *f) {
  if (!f) return DP_FAIL(DP_ERR_INVALID, "dp_file_commit: no file");
  const char *what = f->what, *path = f->path;
  dp_status s = DP_OK;
  int bad = fclose(f->f) != 0 || f->err; /* flushes; fd stays open */
  f->f = NULL;
  if (bad)
    s = write_fail(what, path, NULL, f->err ? f->err : EIO);
  else if (fchmod(f->fd, new_file_mode()) != 0) /* 0600 while it was written */
    s = write_fail(what, path, "set its mode", errno);
  else if (fsync(f->fd) != 0)
    s = write_fail(what, path, NULL, errno);
  if (close(f->fd) != 0 && !s) s = write_fail(what, path, NULL, errno);
  f->fd = -1;
  /* again just before the rename: a node made at the path since the create
   * must not be destroyed either */
  if (!s) s = check_target(path, what, false);
  if (!s && rename(f->tmp, path) != 0) s = write_fail(what, path, "rename", errno);
  if (s)
    unlink(f->tmp);
  else
    s = sync_dir(what, path);
  file_free(f);
  return s;
}

dp_status dp__write_atomic(const char *path, const char *what,
                           dp_status (*fill)(FILE *f, void *arg), void *arg) {
  dp_file *f;
  dp_status s = dp_file_create(path, what, &f);
  if (s) return s;
  s = fill(dp_file_stream(f), arg);
  if (s == DP_ERR_IO) s = write_fail(what, path, NULL, f->err ? f->err : EIO);
  if (s) {
    dp_file_discard(f);
    return s;
  }
  return dp_file_commit(f);
}

/* Opens path for writing in place, O_NOFOLLOW and without blocking (a FIFO
 * without a reader fails at once), and refuses it unless it is a regular
 * file: what check_target said before the open, now about the file opened.
 * *created: the open made it. */
static dp_status open_in_place(const char *path, const char *what, int *fd, int *created) {
  dp_status s = check_target(path, what, true);
  if (s) return s;
  int fl = O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  *created = 1;
  *fd = open(path, fl | O_CREAT | O_EXCL, 0666);
  if (*fd < 0 && errno == EEXIST) {
    *created = 0;
    *fd = open(path, fl);
  }
  if (*fd < 0) { /* ELOOP: a link made since the check; say so */
    int e = errno;
    if (e == ELOOP && (s = check_target(path, what, true))) return s;
    return write_fail(what, path, NULL, e);
  }
  struct stat st;
  int e = fstat(*fd, &st) != 0 ? errno : 0;
  if (!e && !S_ISREG(st.st_mode)) {
    close(*fd);
    return DP_FAIL(DP_ERR_IO, "cannot write %s '%s': is %s, not a regular file", what, path,
                   kind_of(st.st_mode));
  }
  if (!e && (fl = fcntl(*fd, F_GETFL)) >= 0 && fcntl(*fd, F_SETFL, fl & ~O_NONBLOCK) >= 0)
    return DP_OK;
  e = e ? e : errno;
  close(*fd);
  if (*created) unlink(path);
  return write_fail(what, path, NULL, e);
}

dp_status dp_file_append(const char *path, const char *what, int truncate, FILE **out) {
  if (!out) return DP_FAIL(DP_ERR_INVALID, "dp_file_append: out is NULL");
  *out = NULL;
  if (!what) what = "file";
  if (!path || !*path)
    return DP_FAIL(DP_ERR_INVALID, "cannot write %s: %s file name", what,
                   path ? "an empty" : "no");
  int fd, created;
  dp_status s = open_in_place(path, what, &fd, &created);
  if (s) return s;
  if (truncate && ftruncate(fd, 0) != 0) { /* after the check: only a regular file */
    s = write_fail(what, path, NULL, errno);
  } else if (!(*out = fdopen(fd, "ab"))) {
    s = write_fail(what, path, NULL, errno);
  } else {
    return DP_OK;
  }
  close(fd);
  if (created) unlink(path);
  return s;
}

dp_status dp_file_check(const char *path, const char *what, int in_place) {
  if (!in_place) { /* the temporary file a dp_file_create makes, removed again */
    dp_file *f;
    dp_status s = dp_file_create(path, what, &f);
    dp_file_discard(f);
    return s;
  }
  if (!what) what = "file";
  if (!path || !*path)
    return DP_FAIL(DP_ERR_INVALID, "cannot write %s: %s file name", what,
                   path ? "an empty" : "no");
  int fd, created;
  dp_status s = open_in_place(path, what, &fd, &created);
  if (s) return s;
  close(fd);
  if (created) unlink(path); /* made by the check: removed again */
  return DP_OK;
}

/* Decimal megabytes with enough digits to tell two sizes apart. */
static void say_bytes(char *b, size_t cap, unsigned long long n) {
  if (n < 1000000ull)
    snprintf(b, cap, "%llu bytes", n);
  else
    snprintf(b, cap, "%.1f MB", (double)n / 1e6);
}

dp_status dp_file_room(const char *path, const char *what, size_t bytes) {
  if (!what) what = "file";
  if (!path || !*path)
    return DP_FAIL(DP_ERR_INVALID, "cannot write %s: %s file name", what,
                   path ? "an empty" : "no");
  char *dir = dir_of(path);
  if (!dir) return DP_FAIL(DP_ERR_NOMEM, "cannot write %s '%s': out of memory", what, path);
  struct statvfs v;
  int rc = statvfs(dir, &v), err = errno;
  free(dir);
  if (rc != 0) return write_fail(what, path, "find its file system's free space", err);
  /* what this process may fill: root also the blocks kept for it */
  unsigned long long blocks = geteuid() == 0 ? v.f_bfree : v.f_bavail;
  unsigned long long unit = v.f_frsize ? v.f_frsize : v.f_bsize;
  unsigned long long room = unit && blocks > ULLONG_MAX / unit ? ULLONG_MAX : blocks * unit;
  if (room >= bytes) return DP_OK;
  char have[32], need[32];
  say_bytes(have, sizeof have, room);
  say_bytes(need, sizeof need, bytes);
  return DP_FAIL(DP_ERR_IO,
                 "no room for %s '%s': its file system has %s free, and it takes %s; "
                 "free some space or write it elsewhere",
                 what, path, have, need);
}
