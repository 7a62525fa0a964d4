/* CUDA graphs of whole steps (dp_cuda.h gives the call order).
 *
 * Capture. Device 0's stream starts a capture in relaxed mode: the executor's
 * worker threads enqueue on their own streams while it is open and call
 * cudaSetDevice and friends, which the stricter modes forbid to other threads
 * of the process. Every other device's stream joins the capture by waiting on
 * an event recorded in it (ev_fork); from then on everything enqueued on any
 * device's stream, by any thread, becomes a node: the header reset and the
 * scalar copy of dp__cuda_step_begin, kernels, cuBLAS calls (capturable: each
 * handle has a workspace of its own from the arena), copies, NCCL send/recv
 * (capturable since NCCL 2.9 with CUDA >= 11.3). The stage events of
 * dp__cuda_stage_begin/end and the transport's copies become edges between
 * the devices' node chains, edge for edge the ordering of a plain step. A
 * graph with nodes on several GPUs is a host-launched multi-device graph
 * (only device-launched graphs must stay on one device).
 *
 * End. Each other stream records ev_join and device 0's stream waits for it
 * (a capture with an unjoined fork cannot end), then the capture ends, the
 * graph is instantiated (flags 0) and uploaded, so that the first launch
 * allocates nothing either.
 *
 * Launch. The step's scalars go to the pinned block the captured scalar copy
 * reads when it runs (dp__cuda_host_step, as in a plain step). Device 0's
 * stream first waits for whatever is still queued on the others, the graph
 * is launched on it, and then every other stream waits for device 0's: the
 * graph's work on device d is ordered after the launch stream only, and
 * dp__cuda_step_end reads device d's header back on device d's stream.
 *
 * Events reused here (ev_fork, ev_join, the stage events) were last recorded
 * in the capture; every wait outside a capture is on a record made just
 * before it outside the capture, which CUDA allows (waiting on an event whose
 * last record was captured is not). */
#include "backend.cuh"

#include <stdio.h>
#include <string.h>

static bool slot_ok(int slot) { return slot >= 0 && slot < DP_CUDA_GRAPH_SLOTS; }

/* Makes every other device's stream wait for device 0's: ev_fork recorded on
 * device 0 (`what` names the purpose in errors). */
static dp_status fan_out(cuda_ctx *c, const char *what) {
  dev_ctx *x0 = &c->dev[0];
  dp_status s = use_device(x0->phys);
  if (s != DP_OK) return s;
  cudaError_t e = cudaEventRecord(c->ev_fork, x0->stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaEventRecord(fork)", "%s: device 0", what);
  }
  for (int d = 1; d < c->n; d++) {
    dev_ctx *x = &c->dev[d];
    if ((s = use_device(x->phys)) != DP_OK) return s;
    e = cudaStreamWaitEvent(x->stream, c->ev_fork, 0);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaStreamWaitEvent(fork)", "%s: device %d",
                          what, d);
    }
  }
  return use_device(x0->phys);
}

/* Makes device 0's stream wait for every other device's: ev_join of each. */
static dp_status fan_in(cuda_ctx *c, const char *what) {
  dev_ctx *x0 = &c->dev[0];
  for (int d = 1; d < c->n; d++) {
    dev_ctx *x = &c->dev[d];
    dp_status s = use_device(x->phys);
    if (s != DP_OK) return s;
    cudaError_t e = cudaEventRecord(x->ev_join, x->stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(x0->stream, x->ev_join, 0);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaEventRecord/cudaStreamWaitEvent(join)",
                          "%s: device %d", what, d);
    }
  }
  return use_device(x0->phys);
}

/* Fails with s after dropping the open capture; the message recorded first
 * stays the thread's last error. */
static dp_status fail_and_abort(cuda_ctx *c, dp_status s) {
  char msg[DP_ERRMSG_CAP];
  snprintf(msg, sizeof msg, "%s", dp_last_error());
  dp__cuda_capture_abort(c);
  return DP_FAIL(s, "%s (the capture was dropped)", msg);
}

extern "C" dp_status dp__cuda_capture_begin(void *bctx) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_capture_begin: no context");
  if (c->capturing)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_capture_begin: a capture is already open");
  /* the backend itself refuses what cuda/vtable.c refuses at plan time: a graph
   * whose NCCL sends and receives replay as one dependency chain can wait for
   * itself (the CUDA simulation hangs on exactly that) */
  if (c->nccl)
    return DP_FAIL(DP_ERR_UNSUPPORTED,
                   "dp__cuda_capture_begin: the context moves data with NCCL, and one "
                   "graph across several GPUs with NCCL inside can deadlock");
  dev_ctx *x0 = &c->dev[0];
  dp_status s = use_device(x0->phys);
  if (s != DP_OK) return s;
  DP_CUDA_CHECK_D(0, cudaStreamBeginCapture(x0->stream, cudaStreamCaptureModeRelaxed));
  c->capturing = true;
  if ((s = fan_out(c, "dp__cuda_capture_begin")) != DP_OK) return fail_and_abort(c, s);
  return DP_OK;
}

extern "C" dp_status dp__cuda_capture_end(void *bctx, int slot) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_capture_end: no context");
  if (!c->capturing)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_capture_end: no capture is open");
  if (!slot_ok(slot)) {
    DP_FAIL(DP_ERR_INVALID, "dp__cuda_capture_end: slot %d (0..%d)", slot,
            DP_CUDA_GRAPH_SLOTS - 1);
    return fail_and_abort(c, DP_ERR_INVALID);
  }
  int a = 0, b = 0;
  if (dp__cuda_unmatched(c, &a, &b)) { /* the graph would hang at every launch */
    DP_FAIL(DP_ERR_BACKEND,
            "dp__cuda_capture_end: device %d's NCCL sends to device %d do not match its "
            "receives",
            a, b);
    return fail_and_abort(c, DP_ERR_BACKEND);
  }
  dp_status s = fan_in(c, "dp__cuda_capture_end");
  if (s != DP_OK) return fail_and_abort(c, s);
  dev_ctx *x0 = &c->dev[0];
  cudaGraph_t g = NULL;
  cudaError_t e = cudaStreamEndCapture(x0->stream, &g);
  c->capturing = false;
  dp__cuda_reset_counts(c); /* the captured transfers did not run */
  if (e != cudaSuccess || !g) {
    (void)cudaGetLastError();
    if (g) (void)cudaGraphDestroy(g);
    if (e == cudaSuccess) e = cudaErrorStreamCaptureInvalidated;
    return DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaStreamEndCapture", "%s",
                        "dp__cuda_capture_end: device 0");
  }
  cudaGraphExec_t exec = NULL;
  e = cudaGraphInstantiate(&exec, g, 0);
  cudaError_t e2 = cudaGraphDestroy(g); /* the executable graph keeps what it needs */
  if (e == cudaSuccess && e2 != cudaSuccess) {
    e = e2;
    if (exec && cudaGraphExecDestroy(exec) != cudaSuccess) (void)cudaGetLastError();
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return DP_CUDA_FAIL(dp__cuda_status_of(e), e, "cudaGraphInstantiate", "%s",
                        "dp__cuda_capture_end");
  }
  e = cudaGraphUpload(exec, x0->stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (cudaGraphExecDestroy(exec) != cudaSuccess) (void)cudaGetLastError();
    return DP_CUDA_FAIL(dp__cuda_status_of(e), e, "cudaGraphUpload", "%s",
                        "dp__cuda_capture_end");
  }
  if (c->graph[slot]) {
    /* a launch of the old graph may still run: cudaGraphExecDestroy defers
     * the release until it completes (documented) */
    e = cudaGraphExecDestroy(c->graph[slot]);
    c->graph[slot] = NULL;
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      if (cudaGraphExecDestroy(exec) != cudaSuccess) (void)cudaGetLastError();
      return DP_CUDA_FAIL(DP_ERR_BACKEND, e, "cudaGraphExecDestroy",
                          "dp__cuda_capture_end: slot %d", slot);
    }
  }
  c->graph[slot] = exec;
  return DP_OK;
}

/* Silent: the failure that led here keeps its message. Works after an
 * invalidated capture too (the joins then fail and are ignored; ending the
 * capture on its origin stream is what leaves every stream usable). */
extern "C" void dp__cuda_capture_abort(void *bctx) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  if (!c || c->n < 1) return;
  dev_ctx *x0 = &c->dev[0];
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaSetDevice(x0->phys) != cudaSuccess ||
      cudaStreamIsCapturing(x0->stream, &st) != cudaSuccess)
    st = c->capturing ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusNone;
  if (st == cudaStreamCaptureStatusActive)
    for (int d = 1; d < c->n; d++) {
      dev_ctx *x = &c->dev[d];
      cudaStreamCaptureStatus sd = cudaStreamCaptureStatusNone;
      if (cudaSetDevice(x->phys) != cudaSuccess ||
          cudaStreamIsCapturing(x->stream, &sd) != cudaSuccess ||
          sd != cudaStreamCaptureStatusActive)
        continue;
      if (cudaEventRecord(x->ev_join, x->stream) == cudaSuccess)
        (void)cudaStreamWaitEvent(x0->stream, x->ev_join, 0);
    }
  if (st != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = NULL;
    (void)cudaSetDevice(x0->phys);
    (void)cudaStreamEndCapture(x0->stream, &g);
    if (g) (void)cudaGraphDestroy(g);
  }
  (void)cudaGetLastError(); /* capture errors are not sticky: clear them */
  (void)cudaSetDevice(x0->phys);
  (void)cudaGetLastError();
  c->capturing = false;
  dp__cuda_reset_counts(c);
}

extern "C" int dp__cuda_graph_ready(const void *bctx, int slot) {
  const cuda_ctx *c = (const cuda_ctx *)bctx;
  return c && slot_ok(slot) && c->graph[slot] != NULL;
}

extern "C" dp_status dp__cuda_graph_launch(void *bctx, int slot, uint64_t step) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  if (!c) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_graph_launch: no context");
  if (!slot_ok(slot) || !c->graph[slot])
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_graph_launch: slot %d holds no graph", slot);
  if (c->capturing)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_graph_launch: a capture is open");
  dp__cuda_host_step(c, step);
  dp_status s = fan_in(c, "dp__cuda_graph_launch");
  if (s != DP_OK) return s;
  DP_CUDA_CHECK_D(0, cudaGraphLaunch(c->graph[slot], c->dev[0].stream));
  /* the fault hook of dp__cuda_step_begin, which a replayed step does not call (the
   * CUDA simulation showed the graph variant of the fault test never faulting) */
  if (c->debug_fault_step && step + 1 == c->debug_fault_step && c->d1 > c->d0)
    DP_CUDA_CHECK_D(0, dp_k_debug_fault(c->dev[0].stream));
  return fan_out(c, "dp__cuda_graph_launch");
}
