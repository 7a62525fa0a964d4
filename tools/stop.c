/* Stopping dp train safely (cli.h, "stopping dp train safely"). The handlers only set a
 * flag and write a line (both async-signal-safe); the training loop reads the flag after
 * each step. */
#include "cli.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The first signal's number; 0: none. */
static volatile sig_atomic_t g_stop;
static struct sigaction g_old_int, g_old_term;
static int g_installed;
/* the handlers' lines, made before any signal (the handler formats nothing) */
static char g_first[2][192], g_second[192];
static size_t g_first_n[2], g_second_n;

static void say(const char *s, size_t n) {
  ssize_t w = write(STDERR_FILENO, s, n);
  (void)w; /* nothing to do about a failed write in a handler */
}

static void on_signal(int sig) {
  if (g_stop) { /* the second: at once; the writer's rename is atomic */
    say(g_second, g_second_n);
    _exit(128 + sig);
  }
  g_stop = sig;
  int k = sig == SIGTERM;
  say(g_first[k], g_first_n[k]);
}

const char *dpt_signal_name(int sig) {
  static char other[32];
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  snprintf(other, sizeof other, "signal %d", sig);
  return other;
}

void dpt_stop_install(const char *cmd) {
  int quiet = dpt_world_rank() != 0; /* rank 0 speaks for the job */
  for (int k = 0; k < 2; k++) {
    int n = snprintf(g_first[k], sizeof g_first[k],
                     "\n%s: %s: stopping after this step (another signal stops at once)\n",
                     cmd, k ? "SIGTERM" : "SIGINT");
    g_first_n[k] = quiet || n < 0 ? 0 : (size_t)n;
  }
  int n = snprintf(g_second, sizeof g_second,
                   "\n%s: second signal: stopped at once; a checkpoint file is the last "
                   "one written whole\n",
                   cmd);
  g_second_n = quiet || n < 0 ? 0 : (size_t)n;
  g_stop = 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART; /* a read or write in progress goes on */
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
  g_installed = 1;
}

void dpt_stop_restore(void) {
  if (!g_installed) return;
  sigaction(SIGINT, &g_old_int, NULL);
  sigaction(SIGTERM, &g_old_term, NULL);
  g_installed = 0;
}

int dpt_stop_requested(void) { return g_stop; }

int dpt_stop_agreed(void) {
  int s = g_stop;
  return dpt_world_size() > 1 ? dpt_world_max_int(s) : s;
}

/* 1 when the argument names option `name` (a unique prefix of it, as getopt
 * takes, "--epo" or "--epo=4"); *inline_value: it carries its value. */
static int names(const char *arg, const char *name, int *inline_value) {
  if (strncmp(arg, "--", 2) || !arg[2]) return 0;
  size_t n = strcspn(arg + 2, "=");
  *inline_value = arg[2 + n] == '=';
  return n <= strlen(name) && !strncmp(arg + 2, name, n);
}

/* Appends word to buf (at *len of cap), quoted for a shell when it needs it. */
static void add_word(char *buf, size_t *len, size_t cap, const char *w) {
  int plain = *w != '\0';
  for (const char *p = w; *p; p++)
    if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=,+-@%",
                *p))
      plain = 0;
  if (*len && *len < cap) buf[(*len)++] = ' ';
  if (plain) {
    *len += (size_t)snprintf(buf + *len, *len < cap ? cap - *len : 0, "%s", w);
    return;
  }
  if (*len < cap) buf[(*len)++] = '\'';
  for (const char *p = w; *p && *len < cap; p++)
    *len += (size_t)snprintf(buf + *len, cap - *len, "%s",
                             *p == '\'' ? "'\\''" : (char[]){*p, 0});
  if (*len < cap) buf[(*len)++] = '\'';
  if (*len < cap) buf[*len] = '\0';
}

char *dpt_resume_command(const char *prefix, int argc, char **argv, const char *path,
                         int epochs) {
  size_t cap = strlen(prefix) + strlen(path) + 64;
  for (int i = 1; i < argc; i++) cap += 4 * strlen(argv[i]) + 3;
  char *buf = malloc(cap), num[16];
  if (!buf) return NULL;
  size_t len = (size_t)snprintf(buf, cap, "%s", prefix);
  for (int i = 1; i < argc; i++) {
    int inl = 0;
    if (!strcmp(argv[i], "--")) break; /* dp train takes no arguments after it */
    if (names(argv[i], "resume", &inl) || names(argv[i], "epochs", &inl)) {
      i += !inl; /* and its value */
      continue;
    }
    add_word(buf, &len, cap, argv[i]);
  }
  snprintf(num, sizeof num, "%d", epochs);
  add_word(buf, &len, cap, "--resume");
  add_word(buf, &len, cap, path);
  add_word(buf, &len, cap, "--epochs");
  add_word(buf, &len, cap, num);
  return buf;
}
