/* The "checked" backend (test-only): the cpu backend with every op's operands
 * verified against the plan before it runs (tests/checked/backend.c). It is
 * the worked example of docs/ARCHITECTURE.md's "Adding a backend": new files,
 * one registration call, configure.py, nothing in the core or the tools. */
#ifndef DP_CHECKED_H
#define DP_CHECKED_H

#include "dp.h"

/* Registers the backend under the name "checked"; *kind (may be NULL) is
 * what a dp_config names it by. */
dp_status dp_checked_register(dp_backend *kind);
/* Ops run (and checked) since the process started, and ops refused. */
long dp_checked_ops_run(void);
long dp_checked_ops_refused(void);

#endif
