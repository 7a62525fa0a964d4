/* CUDA backend entry points, callable from C. Internal: not installed.
 *
 * cuda/NAME.cu implements them, and cuda/vtable.c turns them into the
 * backend's vtable; the emulated GPU (tests/emul/fake_cuda.c) implements the
 * same calls on the CPU. A build without nvcc has none of it (libdp.a never
 * calls them).
 * Include it as "dp_cuda.h" (build.ninja passes -iquote cuda), never <cuda.h>,
 * which is the CUDA driver API. Errors are recorded with DP_FAIL and read
 * back with dp_last_error(). */
#ifndef DP_CUDA_H
#define DP_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "dp.h"
#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Name (NUL-terminated, cut to cap), memory and compute capability of GPU
 * `dev`. Any output pointer may be NULL. free_mem is read on the device, so
 * the call creates the device's primary context. */
dp_status dp__cuda_device_info(int dev, char *name, size_t cap, size_t *total_mem,
                               size_t *free_mem, int *sm_major, int *sm_minor);

/* One cudaMalloc of `bytes` on GPU `dev`: a device arena (aligned to at least
 * 256 bytes). Refuses with DP_ERR_NOMEM, naming the device, the bytes planned
 * and the bytes free, when `bytes` exceeds the free memory cudaMemGetInfo
 * reports. bytes == 0 gives *out = NULL and DP_OK. The calling thread's
 * current device is left as it was. */
dp_status dp__cuda_arena_alloc(int dev, size_t bytes, void **out);
void dp__cuda_arena_free(int dev, void *p); /* p may be NULL */

/* Pinned host staging memory (cudaHostAlloc, portable to every device).
 * bytes == 0 gives *out = NULL and DP_OK. */
dp_status dp__cuda_host_alloc(size_t bytes, void **out);
void dp__cuda_host_free(void *p); /* p may be NULL */

/* ==== The CUDA backend (cuda/backend.cu, cuda/kernels.cu, cuda/gemm.cu) ==========
 * Design and the executor's obligations: docs/GPU.md. Summary:
 *   - one stream per logical device (replicas may share a GPU: device_ids 0,0,0,0),
 *     a cuBLAS handle bound to it, two events (stage parity);
 *   - ops only enqueue work; the one host synchronisation of a step is
 *     dp__cuda_step_end;
 *   - non-finite loss/gradients set a status word in the device's WORKSPACE
 *     region; every optimizer kernel reads the status words first and changes
 *     nothing when one is set, so a refused step is refused without a host sync.
 *
 * Call order for one dp_train_step / dp_forward (what lib/core/ctx.c and lib/core/exec.c
 * must do):
 *   dp__cuda_step_begin(bctx)                     calling thread, before dp__exec_run
 *   dp__exec_run(...), where every device's thread, for EVERY stage s of the run
 *   (also stages in which it has no op, also after a failure):
 *       dp__cuda_stage_begin(bctx, dev, s)        before the device's first op of s
 *       ... the device's ops of s (backend run, transport copy) ...
 *       dp__cuda_stage_end(bctx, dev, s)          after its last op of s, before the
 * barrier dp__cuda_step_end(bctx, &loss)                calling thread, after the last run,
 *                                                 also when a run failed
 * Several dp__exec_run calls may make up one step (the commit split) as long as
 * their stages are consecutive and the first starts at stage 0. */

/* WORKSPACE bytes a CUDA plan must reserve on every device (the planner is
 * pure C and must not need CUDA to size it): a header of DP_CUDA_WS_HEADER_BYTES
 * (status words, the loss; the loss and batchnorm ops' scratch) followed by the cuBLAS
 * workspace. 32 MiB is NVIDIA's recommended cublasSetWorkspace size for Hopper (4 MiB for
 * older GPUs); the size is fixed so that GEMM algorithm choice, and with it the bits, does
 * not depend on the plan. */
#define DP_CUDA_WS_HEADER_BYTES ((size_t)16384)
#define DP_CUDA_BLAS_WS_BYTES ((size_t)32 << 20)
static inline size_t dp__cuda_workspace_bytes(void) {
  return DP_CUDA_WS_HEADER_BYTES + DP_CUDA_BLAS_WS_BYTES;
}

/* conv2d's buffers follow the cuBLAS workspace, at DP_CUDA_CONV_WS_OFFSET of
 * the WORKSPACE region (256-aligned, as the region's header end is): for n
 * images of a micro-batch, P = h * w output positions, CKK = ic * k * k taps,
 *   COL (n P, CKK)   im2col, later dCOL     dp__cuda_conv_col_bytes(l, n)
 *   T   (n P, OUT)   the GEMM's output, later dY^T
 * each rounded up to 256 bytes (cuda/conv.cu). The cuBLAS part stays fixed;
 * only this tail depends on the model and the micro-batch rows. Sizes
 * saturate at SIZE_MAX, which the planner reports as an overflow. */
#define DP_CUDA_CONV_WS_OFFSET (DP_CUDA_WS_HEADER_BYTES + DP_CUDA_BLAS_WS_BYTES)
static inline size_t dp__cuda_mul_sat(size_t a, size_t b) {
  return a && b > SIZE_MAX / a ? SIZE_MAX : a * b;
}
static inline size_t dp__cuda_up256(size_t x) {
  return x > SIZE_MAX - 255 ? SIZE_MAX : (x + 255) / 256 * 256;
}
static inline size_t dp__cuda_conv_np(const dp_layer *l, int n) { /* n P */
  size_t imgs = n > 0 ? (size_t)n : 0;
  return dp__cuda_mul_sat(imgs, dp__cuda_mul_sat((size_t)l->h, (size_t)l->w));
}
static inline size_t dp__cuda_conv_col_bytes(const dp_layer *l, int n) {
  size_t kk = dp__cuda_mul_sat((size_t)l->k, (size_t)l->k);
  size_t ckk = dp__cuda_mul_sat((size_t)l->ic, kk);
  size_t floats = dp__cuda_mul_sat(dp__cuda_conv_np(l, n), ckk);
  return dp__cuda_up256(dp__cuda_mul_sat(floats, 4));
}
static inline size_t dp__cuda_conv_t_bytes(const dp_layer *l, int n) {
  size_t floats = dp__cuda_mul_sat(dp__cuda_conv_np(l, n), (size_t)l->c);
  return dp__cuda_up256(dp__cuda_mul_sat(floats, 4));
}
/* COL + T of one conv2d layer (0 for any other kind). */
static inline size_t dp__cuda_conv_workspace_bytes(const dp_layer *l, int n) {
  if (l->kind != DP_LAYER_CONV2D || n <= 0) return 0;
  size_t a = dp__cuda_conv_col_bytes(l, n), b = dp__cuda_conv_t_bytes(l, n);
  return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}
/* The attention's scratch at the same place (cuda/sequence.cu), for training:
 * the backward's d(scores) of one head of n rows, (n, T, T), 256-rounded, and
 * with dropout (l->p > 0) a second such block after it for the head's kept
 * probabilities (forward and backward); 0 for any other layer. */
static inline size_t dp__cuda_attention_scratch_bytes(const dp_layer *l, int n) {
  if (l->kind != DP_LAYER_ATTENTION || n <= 0) return 0;
  size_t tt = dp__cuda_mul_sat((size_t)l->t, (size_t)l->t);
  return dp__cuda_up256(dp__cuda_mul_sat(dp__cuda_mul_sat((size_t)n, tt), 4));
}
static inline size_t dp__cuda_attention_ws_bytes(const dp_layer *l, int n) {
  return dp__cuda_mul_sat(dp__cuda_attention_scratch_bytes(l, n),
                          l->kind == DP_LAYER_ATTENTION && l->p > 0.0f ? 2 : 1);
}
/* The WORKSPACE a CUDA plan reserves per device: the fixed part above, then
 * the largest conv2d tail at mb_rows rows (training or not: forward and
 * backward use the same COL and T) or, training, attention tail.
 * cuda/vtable.c's workspace_bytes. */
static inline size_t dp__cuda_model_tail_bytes(const dp_model *m, int mb_rows,
                                               bool training) {
  size_t tail = 0;
  for (int i = 0; i < m->n_layers; i++) {
    size_t t = dp__cuda_conv_workspace_bytes(&m->layers[i], mb_rows);
    size_t a = training ? dp__cuda_attention_ws_bytes(&m->layers[i], mb_rows) : 0;
    t = a > t ? a : t;
    tail = t > tail ? t : tail;
  }
  return tail;
}
static inline size_t dp__cuda_model_workspace_bytes(const dp_model *m, int mb_rows,
                                                    bool training) {
  size_t tail = dp__cuda_model_tail_bytes(m, mb_rows, training);
  size_t fixed = DP_CUDA_CONV_WS_OFFSET;
  return tail > SIZE_MAX - fixed ? SIZE_MAX : fixed + tail;
}

/* precision bf16 (cuda/mixed.cu): a shadow area after the tail, at
 * dp__cuda_mixed_at, of the largest of its layers' needs at mb_rows rows: a
 * linear layer's bf16 copies of its input (when fp32), weights and output
 * gradient (when fp32), the output gradient widened for the bias gradient, and
 * an fp32 product; any other layer's fp32 copies of its input, input gradient,
 * output, output gradient and skip, and conv2d's rounded weights (a sync
 * batchnorm's sums ops copy its input and output gradient: within that). Each
 * part 256-rounded (cuBLAS's alignment). */
static inline size_t dp__cuda_sat_add(size_t a, size_t b) {
  return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}
static inline size_t dp__cuda_mixed_layer_bytes(const dp_layer *l, int mb_rows,
                                                bool training) {
  size_t r = mb_rows > 0 ? (size_t)mb_rows : 0, s = 0;
  if (l->kind == DP_LAYER_LINEAR) {
    size_t t = l->t ? (size_t)l->t : 1, n = dp__cuda_mul_sat(r, t);
    size_t pin = (size_t)l->in / t, pout = (size_t)l->out / t,
           wide = pin > pout ? pin : pout;
    s = dp__cuda_up256(dp__cuda_mul_sat(dp__cuda_mul_sat(n, pin), 2));
    s = dp__cuda_sat_add(s,
                         dp__cuda_up256(dp__cuda_mul_sat(dp__cuda_mul_sat(pin, pout), 2)));
    s = dp__cuda_sat_add(s, dp__cuda_up256(dp__cuda_mul_sat(dp__cuda_mul_sat(n, wide), 4)));
    if (training)
      s = dp__cuda_sat_add(s,
                           dp__cuda_up256(dp__cuda_mul_sat(dp__cuda_mul_sat(n, pout), 6)));
    return s;
  }
  size_t in = dp__cuda_up256(dp__cuda_mul_sat(dp__cuda_mul_sat(r, (size_t)l->in), 4));
  size_t out = dp__cuda_up256(dp__cuda_mul_sat(dp__cuda_mul_sat(r, (size_t)l->out), 4));
  s = dp__cuda_sat_add(dp__cuda_mul_sat(in, training ? 2 : 1),
                       dp__cuda_mul_sat(out, training ? 3 : 2));
  if (l->kind == DP_LAYER_CONV2D)
    s = dp__cuda_sat_add(s, dp__cuda_up256(dp__cuda_mul_sat(l->n_params, 4)));
  return s;
}
static inline size_t dp__cuda_mixed_at(const dp_model *m, int mb_rows, bool training) {
  return dp__cuda_sat_add(DP_CUDA_CONV_WS_OFFSET,
                          dp__cuda_up256(dp__cuda_model_tail_bytes(m, mb_rows, training)));
}
static inline size_t dp__cuda_mixed_workspace_bytes(const dp_model *m, int mb_rows,
                                                    bool training) {
  size_t most = 0;
  for (int i = 0; i < m->n_layers; i++) {
    size_t b = dp__cuda_mixed_layer_bytes(&m->layers[i], mb_rows, training);
    most = b > most ? b : most;
  }
  return dp__cuda_sat_add(dp__cuda_mixed_at(m, mb_rows, training), most);
}

/* Flags of dp__cuda_ctx_init. */
enum {
  DP_CUDA_TF32 = 1, /* let cuBLAS use TF32 tensor cores for the FP32 GEMMs
                       (faster, ~1e-3 relative; off by default: FP32 math, reduced-
                       precision reductions disallowed) */
  DP_CUDA_NCCL = 2, /* copies between replicas on distinct GPUs go through NCCL
                       send/recv (ncclCommInitAll over device_ids, which must then be
                       distinct): dp__cuda_transport.peer takes part; init fails with
                       DP_ERR_UNSUPPORTED in a build without NCCL */
};

/* 1 when this build has NCCL (configure.py found nccl.h and libnccl). */
int dp__cuda_have_nccl(void);

/* The backend's and transport's slots (lib/core/backend.h; cuda/vtable.c puts
 * them in the vtables). run() enqueues one compute op on the op's device
 * stream; copy() enqueues one transfer on the stream of the executing device
 * dev (whose thread calls it, after dp__cuda_stage_begin), the op naming both
 * ends as (device, region, offset): a device arena of the context, or host
 * memory (the pinned staging arena; pageable memory works, slower); peer()
 * is the other endpoint's half of an NCCL pair; collective() is
 * DP_OP_ALLREDUCE. The tctx of the transport is the same bctx. */
dp_status dp__cuda_run(void *bctx, dp_exec_env *e, const dp_op *op);
dp_status dp__cuda_copy(void *tctx, dp_exec_env *e, int dev, const dp_op *op);
dp_status dp__cuda_peer(void *tctx, dp_exec_env *e, int dev, const dp_op *op);
dp_status dp__cuda_collective(void *tctx, dp_exec_env *e, int dev, const dp_op *op);
/* Number of visible GPUs; 0 with the reason as the last error. */
int dp__cuda_device_count(void);

/* Per logical device d < p->split.n_used: cudaSetDevice(p->cfg.device_ids[d]),
 * a non-blocking stream, two events, a cuBLAS handle (stream, workspace from
 * the arena's WORKSPACE region, math mode pinned: FP32 unless flags has
 * DP_CUDA_TF32, no atomics), and peer access between the distinct GPUs used
 * where the hardware allows it. arenas[d]: device memory of
 * dp_plan_device_bytes(p, d) bytes on that GPU, 256-aligned (checked). Needs
 * WORKSPACE >= dp__cuda_model_workspace_bytes(model, act[d].mb_rows, training) on every
 * device (DP_ERR_INVALID otherwise). Allocates (host: the context, a pinned
 * header block; CUDA: streams, events, handles); nothing after it does. The
 * calling thread's current device is left as it was. */
dp_status dp__cuda_ctx_init(const dp_plan *p, void *const arenas[], unsigned flags,
                            void **bctx_out);
void dp__cuda_ctx_free(void *bctx); /* NULL is fine; waits for queued work first */
/* The same for one rank of a job across processes (config.ranks > 1): only
 * devices [w->dev0, w->dev1) get streams, handles and arenas (arenas[] of the
 * others are not read); flags must have DP_CUDA_NCCL: one non-blocking NCCL
 * communicator per local device, rank = global device, over every rank's
 * devices (ncclCommInitRankConfig; rank 0's unique id through w->bcast, a
 * collective: every rank calls this). A copy with an end in another process
 * is an NCCL pair across processes: each process enqueues its half, the
 * executing device's thread in copy(), the other end's in peer() (a host end
 * belongs to the executing device: each rank feeds its own rows from its
 * pinned staging arena). No graphs. */
dp_status dp__cuda_ctx_init_world(const dp_plan *p, void *const arenas[], unsigned flags,
                                  const dp_backend_world *w, void **bctx_out);

/* Starts a step (or a forward): resets every device's status words and the
 * stage bookkeeping, and enqueues on every device a copy of this step's
 * scalars (the step counter that keys dropout, momentum's first-step flag,
 * AdamW's bias corrections, computed on the host as lib/cpu/backend.c does)
 * from a pinned block into the device's WORKSPACE header; kernels read them
 * there, never from their arguments, so that a captured graph replays any
 * step. Enqueues only. */
dp_status dp__cuda_step_begin(void *bctx, uint64_t step);
/* Stage hooks, called by the thread that runs device dev's ops (see above).
 * stage_begin makes that thread's current GPU device_ids[dev], makes dev's
 * stream wait for every device that wrote or read dev's arena in stage - 1,
 * and names dev as the executing device of the thread's transport copies.
 * stage_end records dev's stage event. Enqueue only. */
dp_status dp__cuda_stage_begin(void *bctx, int dev, int stage);
dp_status dp__cuda_stage_end(void *bctx, int dev, int stage);
/* The one host synchronisation of a step: waits for every stream, reads the
 * status words. DP_ERR_NONFINITE ("the loss is NaN; the step was not applied",
 * "gradient 17 is infinite; ...", the CPU backend's wording) when a check
 * failed: then no optimizer changed anything. DP_ERR_RANGE when a class label
 * was out of range. DP_ERR_BACKEND when CUDA reported an error (an
 * asynchronous fault; the CUDA context is then unusable). *loss (may be NULL)
 * gets the loss LOSS_SUM computed (0 in a forward; NaN/Inf when refused for
 * it). Leaves the calling thread on device_ids[0]. */
dp_status dp__cuda_step_end(void *bctx, float *loss);
/* Mid-step, across processes: waits for everything enqueued since
 * step_begin on this process's devices and reports it as step_end would
 * (the loss only on the rank that holds device 0), leaving the step open, so
 * that the ranks agree before the commit part is enqueued. */
dp_status dp__cuda_step_sync(void *bctx, float *loss);
/* Device 0's gradient norm (config.clip_grad_norm) of the step the last
 * step_end or step_sync reported; NaN when it did not reach its clipping
 * (refused for its loss or a label, failed) or device 0 is another rank's. */
float dp__cuda_grad_norm(const void *bctx);

/* ---- CUDA graphs (cuda/graph.cu) ----
 * A step is captured once and replayed. Capture, instead of a plain step:
 *   dp__cuda_capture_begin(bctx)        device 0's stream starts a capture
 *                                       (relaxed mode: the executor's threads
 *                                       enqueue concurrently); every other
 *                                       device's stream joins it
 *   dp__cuda_step_begin(bctx, step)     captured like everything after it
 *   dp__exec_run(...)                   as in a plain step (stage hooks included)
 *   dp__cuda_capture_end(bctx, slot)    joins every stream back into device 0's,
 *                                       ends the capture, instantiates it into
 *                                       `slot` (replacing what was there);
 *                                       nothing ran yet
 * then, for this step and every later one of the same shape:
 *   dp__cuda_graph_launch(bctx, slot, step)   writes the step's scalars into the
 *                                       pinned block, launches the graph on
 *                                       device 0's stream
 *   dp__cuda_step_end(bctx, &loss)      the one synchronisation, as always
 * When a run fails during capture: dp__cuda_capture_abort(bctx) ends and drops
 * the capture (the slot keeps what it had), then dp__cuda_step_end as after
 * any failed step. Capture and instantiation allocate (driver memory for the
 * graph); launches do not. The executor must not run a plain step while a
 * capture is open. */
enum { DP_CUDA_GRAPH_SLOTS = 4 };
dp_status dp__cuda_capture_begin(void *bctx);
dp_status dp__cuda_capture_end(void *bctx, int slot);
void dp__cuda_capture_abort(void *bctx);
/* 1 when `slot` holds an instantiated graph. */
int dp__cuda_graph_ready(const void *bctx, int slot);
dp_status dp__cuda_graph_launch(void *bctx, int slot, uint64_t step);

/* Synchronous copy between any two of: host memory, device memory (UVA: the
 * direction comes from the pointers). For context set-up and parameter
 * get/set between steps, and tests. */
dp_status dp__cuda_memcpy(void *dst, const void *src, size_t bytes);
/* The learning rate of the steps from the next step_begin or graph_launch on
 * (a per-step scalar, so that graphs replay with it). */
dp_status dp__cuda_set_lr(void *bctx, float lr);
/* The same for the momentum (dp_set_momentum: SGD's momentum or Adam's beta1). */
dp_status dp__cuda_set_momentum(void *bctx, float momentum);
/* The next step's cross-entropy denominator and gradient scale (the model's
 * dp_ce_opts), kept in the per-step scalars a graph replays. */
dp_status dp__cuda_set_loss_norm(void *bctx, float denom, float inv);
/* Synchronous copy between host memory and device dev's arena of the context
 * (either direction): on dev's stream, through the context's pinned bounce
 * block, waiting for that stream only (not the whole GPU, not other
 * contexts). Between steps. */
dp_status dp__cuda_ctx_copy(void *bctx, int dev, void *dst, const void *src, size_t bytes);
/* DP_OK when p is pinned host memory (cudaHostAlloc/cudaMallocHost), as the
 * staging arena of dp_ctx_create_static must be; DP_ERR_INVALID otherwise. */
dp_status dp__cuda_check_pinned(const void *p);
/* dst[0..count) = value on GPU dev (dst: device memory), synchronously. */
dp_status dp__cuda_fill_u32(int dev, void *dst, uint32_t value, size_t count);

/* ---- self-tests (tests/test_cuda.c, tests/gpu/run.sh); these allocate ---- */
/* u64[i] = the counter-based generator of lib/util/rng.c computed on GPU 0 for key
 * (seed, stream, abc[3i], abc[3i+1], abc[3i+2]); uniform[i] its float. */
dp_status dp__cuda_rng_table(uint64_t seed, uint64_t stream, const uint64_t *abc, int n,
                             uint64_t *u64, float *uniform);
/* Times C (m, n) = A (m, k) . B (k, n) in FP32 through cuBLAS on GPU dev with
 * the backend's math mode (tf32: DP_CUDA_TF32's): *ms per GEMM (the mean of
 * iters after a warm-up) and *tflops. */
dp_status dp__cuda_bench_sgemm(int dev, int m, int n, int k, int iters, int tf32,
                               double *ms, double *tflops);
/* The layer GEMMs with operands at every 4-byte offset 0..128 B and leading
 * dimensions 7, 8 and 1024, each result compared by memcmp with the aligned
 * one: *checked results, *differ of them with other bits; `first` names the
 * first that differs. */
dp_status dp__cuda_gemm_alignment_sweep(int dev, int *checked, int *differ, char *first,
                                        size_t cap);
/* The sweep at 16-byte steps for widths 8 and 1024 only (every operand aligned). */
dp_status dp__cuda_gemm_alignment_sweep_aligned(int dev, int *checked, int *differ);

#ifdef __cplusplus
}
#endif
#endif
