/* Opening a file the library reads (a model spec, a checkpoint) without ever
 * blocking on it. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
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
