/* Files the library reads (a model spec, a checkpoint), opened without ever
 * blocking on them, and files it writes (checkpoints, safetensors), written
 * so that a crash leaves the old file or the new one, never a mix. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *dp__file_kind(mode_t mode) {
  return S_ISDIR(mode)    ? "a directory"
         : S_ISFIFO(mode) ? "a FIFO"
         : S_ISSOCK(mode) ? "a socket"
         : S_ISREG(mode)  ? "a regular file"
                          : "a device";
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

/* The directory part of path ("." when none). */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  size_t n = !slash ? 0 : slash == path ? 1 : (size_t)(slash - path);
  char *d = malloc(n ? n + 1 : 2);
  if (!d) return NULL;
  if (n) {
    memcpy(d, path, n);
    d[n] = 0;
  } else {
    strcpy(d, ".");
  }
  return d;
}

dp_status dp__write_atomic(const char *path, const char *what,
                           dp_status (*fill)(FILE *f, void *arg), void *arg) {
  size_t plen = strlen(path), cap = plen + 32;
  char *tmp = malloc(cap), *dir = dir_of(path);
  dp_status s = DP_OK;
  if (!tmp || !dir) {
    free(tmp);
    free(dir);
    return DP_FAIL(DP_ERR_NOMEM, "%s: out of memory", what);
  }
  snprintf(tmp, cap, "%s.tmp.%ld", path, (long)getpid());

  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    s = dp__io_fail(what, path, "create", tmp, errno);
    goto out;
  }
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    int err = errno;
    close(fd);
    s = dp__io_fail(what, path, "write", tmp, err);
    goto remove_tmp;
  }
  errno = 0;
  s = fill(f, arg);
  if (s == DP_ERR_IO) {
    int err = errno ? errno : EIO;
    fclose(f);
    s = dp__io_fail(what, path, "write", tmp, err);
    goto remove_tmp;
  }
  if (s) {
    fclose(f);
    goto remove_tmp;
  }
  if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
    int err = errno;
    fclose(f);
    s = dp__io_fail(what, path, "write", tmp, err);
    goto remove_tmp;
  }
  if (fclose(f) != 0) {
    s = dp__io_fail(what, path, "write", tmp, errno);
    goto remove_tmp;
  }
  if (rename(tmp, path) != 0) {
    s = dp__io_fail(what, path, "rename", tmp, errno);
    goto remove_tmp;
  }
  /* The rename is durable once the directory is. */
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    s = dp__io_fail(what, path, "open its directory", dir, errno);
    goto out;
  }
  if (fsync(dfd) != 0 && errno != EINVAL) /* EINVAL: the file system cannot sync dirs */
    s = dp__io_fail(what, path, "sync its directory", dir, errno);
  close(dfd);
  goto out;

remove_tmp:
  unlink(tmp);
out:
  free(tmp);
  free(dir);
  return s;
}
