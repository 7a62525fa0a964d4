/* The profile's classes and totals (dp bench step --profile). The events
 * themselves are recorded by the executor (exec.c) and the context (ctx.c). */
#include "core/plan.h"

#include <string.h>

const char *dp_prof_class_name(dp_prof_class k) {
  static const char *names[DP_PROF_CLASS_COUNT] = {
      "forward gemm", "forward other", "loss",     "backward",
      "reduce",       "transfer",      "optimizer"};
  return (unsigned)k < DP_PROF_CLASS_COUNT ? names[k] : "?";
}

static bool gemm_layer(const dp_plan *p, int layer) {
  if (layer < 0 || layer >= p->model.n_layers) return false;
  dp_layer_kind k = p->model.layers[layer].kind;
  return k == DP_LAYER_LINEAR || k == DP_LAYER_CONV2D || k == DP_LAYER_ATTENTION;
}

int dp_prof_class_of(const dp_plan *p, const dp_prof_event *ev) {
  if (!p || !ev || ev->what != DP_PROF_EVENT_OP) return -1;
  switch ((dp_op_kind)ev->kind) {
  case DP_OP_FORWARD:
    return gemm_layer(p, ev->layer) ? DP_PROF_FWD_GEMM : DP_PROF_FWD_OTHER;
  case DP_OP_BN_STATS:
  case DP_OP_BN_MERGE:
  case DP_OP_BN_FINAL: return DP_PROF_FWD_OTHER;
  case DP_OP_BACKWARD:
  case DP_OP_BN_BWD_STATS: return DP_PROF_BACKWARD;
  case DP_OP_LOSS:
  case DP_OP_LOSS_SUM: return DP_PROF_LOSS;
  case DP_OP_COPY:
    return ev->phase == DP_PHASE_REDUCE || ev->phase == DP_PHASE_BACKWARD ? DP_PROF_REDUCE
           : ev->phase == DP_PHASE_OPTIMIZER ? DP_PROF_OPTIMIZER
                                             : DP_PROF_TRANSFER;
  case DP_OP_COPY_ADD:
  case DP_OP_GRAD_ADD:
  case DP_OP_GRAD_PACK:
  case DP_OP_GRAD_UNPACK:
  case DP_OP_ZERO:
  case DP_OP_ALLREDUCE: return DP_PROF_REDUCE;
  case DP_OP_GRAD_CHECK:
  case DP_OP_OPTIMIZER:
  case DP_OP_GRAD_NORM:
  case DP_OP_GRAD_CLIP:
  case DP_OP_GRAD_CLAMP:
  case DP_OP_GRAD_ACCUM:
  case DP_OP_GRAD_STASH:
  case DP_OP_BN_UPDATE: return DP_PROF_OPTIMIZER;
  }
  return DP_PROF_OPTIMIZER;
}

static double clipped_ms(const dp_prof_event *ev, const dp_prof_event *step) {
  uint64_t a = ev->t0_ns > step->t0_ns ? ev->t0_ns : step->t0_ns;
  uint64_t b = ev->t1_ns < step->t1_ns ? ev->t1_ns : step->t1_ns;
  return b > a ? (double)(b - a) * 1e-6 : 0.0;
}

/* A call's events are all recorded before its step event (a worker writes
 * only before the run's last barrier, the call's event comes after it), and
 * after the previous call's: so, walking back from the end, each event
 * belongs to the step event seen last. */
dp_status dp_prof_summarize(const dp_plan *p, const dp_prof_event *ev, size_t n,
                            dp_prof_summary *out) {
  if (!p || !out || (!ev && n))
    return DP_FAIL(DP_ERR_INVALID, "dp_prof_summarize: a NULL argument");
  memset(out, 0, sizeof *out);
  const dp_prof_event *step = NULL;
  for (size_t i = n; i-- > 0;) {
    const dp_prof_event *e = &ev[i];
    if (e->what == DP_PROF_EVENT_STEP) {
      step = e;
      out->steps++;
      out->wall_ms += (double)(e->t1_ns - e->t0_ns) * 1e-6;
      continue;
    }
    if (!step || e->thread < 0 || e->thread >= DP_MAX_DEVICES) continue;
    if (e->thread + 1 > out->n_threads) out->n_threads = e->thread + 1;
    double ms = clipped_ms(e, step);
    int k = dp_prof_class_of(p, e);
    if (k >= 0) {
      out->busy_ms[e->thread][k] += ms;
      out->busy_cpu_ms[e->thread] += (double)e->cpu_ns * 1e-6;
      out->ops[k]++;
    } else {
      out->barrier_ms[e->thread] += ms;
    }
  }
  for (int t = 0; t < out->n_threads; t++) {
    double busy = 0.0;
    for (int k = 0; k < DP_PROF_CLASS_COUNT; k++) busy += out->busy_ms[t][k];
    out->other_ms[t] = out->wall_ms - busy - out->barrier_ms[t];
  }
  return DP_OK;
}
