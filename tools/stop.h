/* tools/stop.h — stopping `dp train` safely (tools/stop.c). The first SIGINT
 * or SIGTERM only asks the training loop to stop after the step at hand, so
 * that it saves its checkpoint and says how to resume; a second one ends the
 * process at once (the checkpoint writer is atomic: the file at the path is
 * the old one or a whole new one). The tool's, never the library's: the
 * library installs no handler and never exits.
 *
 * Tool-side code: nothing here prints, but for the handlers' one line each
 * (write(2), async-signal-safe). */
#ifndef DPT_STOP_H
#define DPT_STOP_H

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

#endif
