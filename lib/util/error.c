/* Error recording: a thread-local last-error text with the library's file:line. */
#include "util/util.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[DP_ERRMSG_CAP];

/* in to out (cap bytes, NUL-terminated, cut short where it ends) with every
 * control byte as \xHH: a message quotes names and tokens from files (a spec's,
 * a safetensors tensor's), whose escape sequences would drive the terminal of
 * whoever prints it. */
static void escape_controls(const char *in, char *out, size_t cap) {
  size_t o = 0;
  for (; *in && o + 1 < cap; in++) {
    unsigned char c = (unsigned char)*in;
    if (c >= 0x20 && c != 0x7f) {
      out[o++] = (char)c;
    } else if (o + 5 <= cap) {
      snprintf(out + o, 5, "\\x%02x", c);
      o += 4;
    } else {
      break;
    }
  }
  out[o] = '\0';
}

dp_status dp__error(dp_status s, const char *file, int line, const char *fmt, ...) {
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  /* The message first (it is what a user reads), the library location last. */
  char msg[DP_ERRMSG_CAP - 64], safe[DP_ERRMSG_CAP - 64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  escape_controls(msg, safe, sizeof safe);
  snprintf(last_error, sizeof last_error, "%s [%s:%d]", safe, base, line);
  return s;
}

void dp__error_clear(void) { last_error[0] = '\0'; }

void dp__error_restore(const char *text) {
  snprintf(last_error, sizeof last_error, "%s", text);
}

const char *dp_last_error(void) { return last_error; }

const char *dp_status_name(dp_status s) {
  switch (s) {
  case DP_OK: return "ok";
  case DP_ERR_INVALID: return "invalid argument";
  case DP_ERR_PARSE: return "parse error";
  case DP_ERR_OVERFLOW: return "size overflow";
  case DP_ERR_NOMEM: return "out of memory";
  case DP_ERR_SHAPE: return "shape mismatch";
  case DP_ERR_RANGE: return "out of range";
  case DP_ERR_NONFINITE: return "non-finite value";
  case DP_ERR_IO: return "i/o error";
  case DP_ERR_BACKEND: return "backend error";
  case DP_ERR_UNSUPPORTED: return "unsupported";
  case DP_ERR_CORRUPT: return "arena corrupted";
  }
  return "unknown status";
}
