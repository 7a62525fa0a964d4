/* The "checked" backend: wraps the cpu backend and, before each op, checks
 * that every operand the core's view gives it (lib/core/operands.c) lies
 * inside the plan's regions of its device (dp__op_verify). An op that would
 * reach outside is refused with the verification's message, before any byte
 * moves. Test-only: it shows that a backend is new files plus one
 * registration call. */
#include "checked.h"

#include "core/operands.h"

#include <stdatomic.h>

static atomic_long ops_run, ops_refused;
static const dp_backend_ops *cpu;

/* The op's operands checked; counts it as run or refused. */
static dp_status check(const dp_exec_env *e, const dp_op *op) {
  dp_status s = dp__op_verify(e->plan, -1, op); /* -1: the op may be a shared-out range */
  atomic_fetch_add(s ? &ops_refused : &ops_run, 1);
  return s;
}

static dp_status checked_run(void *bctx, dp_exec_env *e, const dp_op *op) {
  dp_status s = check(e, op);
  return s ? s : cpu->run(bctx, e, op);
}

static dp_status checked_copy(void *tctx, dp_exec_env *e, int dev, const dp_op *op) {
  dp_status s = check(e, op);
  return s ? s : cpu->transport->copy(tctx, e, dev, op);
}

static dp_status checked_copy_add(void *tctx, dp_exec_env *e, int dev, const dp_op *op) {
  dp_status s = check(e, op);
  return s ? s : cpu->transport->copy_add(tctx, e, dev, op);
}

static dp_transport_ops transport;
static dp_backend_ops backend;

dp_status dp_checked_register(dp_backend *kind) {
  cpu = dp__backend_ops(DP_BACKEND_CPU);
  transport = *cpu->transport;
  transport.name = "checked shm";
  transport.copy = checked_copy;
  transport.copy_add = cpu->transport->copy_add ? checked_copy_add : NULL;
  backend = *cpu;
  backend.name = "checked";
  /* cuda's slice layout on the cpu's kernels: the padded micro-batch slices
   * (dp_backend_ops.slice_align) must give the cpu's bits */
  backend.slice_align = 256;
  backend.run = checked_run;
  backend.transport = &transport;
  return dp__backend_register(&backend, kind);
}

long dp_checked_ops_run(void) { return atomic_load(&ops_run); }
long dp_checked_ops_refused(void) { return atomic_load(&ops_refused); }
