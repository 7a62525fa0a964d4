/* The CUDA entry points of a build without CUDA (configure.py --cpu-only, or no
 * nvcc): nothing is available and every call says why. */
#include "dp_cuda.h"

#include "internal.h"

#define NO_CUDA "built without CUDA"

int dp_cuda_available(void) { return 0; }

int dp_cuda_device_count(void) {
  DP_FAIL(DP_ERR_UNSUPPORTED, NO_CUDA);
  return 0;
}

dp_status dp__cuda_device_info(int dev, char *name, size_t cap, size_t *total_mem,
                               size_t *free_mem, int *sm_major, int *sm_minor) {
  (void)name, (void)cap, (void)total_mem, (void)free_mem, (void)sm_major, (void)sm_minor;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda device %d: " NO_CUDA, dev);
}

dp_status dp__cuda_arena_alloc(int dev, size_t bytes, void **out) {
  if (out) *out = NULL;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda device %d: arena of %zu bytes: " NO_CUDA, dev,
                 bytes);
}

void dp__cuda_arena_free(int dev, void *p) { (void)dev, (void)p; }

dp_status dp__cuda_host_alloc(size_t bytes, void **out) {
  if (out) *out = NULL;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "pinned host staging arena of %zu bytes: " NO_CUDA,
                 bytes);
}

void dp__cuda_host_free(void *p) { (void)p; }

/* ---- the backend (cuda/backend.cu, cuda/selftest.cu) ---- */

static dp_status no_run(void *bctx, dp_exec_env *env, const dp_op *op) {
  (void)bctx, (void)env, (void)op;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda backend: " NO_CUDA);
}

static dp_status no_copy(void *tctx, void *dst, const void *src, size_t bytes) {
  (void)tctx, (void)dst, (void)src, (void)bytes;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda transport: " NO_CUDA);
}

static dp_status no_peer(void *tctx, int dev, void *dst, const void *src, size_t bytes) {
  (void)tctx, (void)dst, (void)src, (void)bytes;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda transport: device %d: " NO_CUDA, dev);
}

/* The stage hooks are the real entry points below (they fail the same way),
 * so that this vtable has the CUDA build's shape. */
/* dp_cuda.h's WORKSPACE size, as cuda/backend.cu's vtable gives it. */
static size_t cuda_workspace_bytes(const dp_model *m, int mb_rows, bool training) {
  (void)m, (void)mb_rows, (void)training;
  return dp__cuda_workspace_bytes();
}

const dp_backend_ops dp__cuda_backend = {.name = "cuda",
                                         .run = no_run,
                                         .stage_begin = dp__cuda_stage_begin,
                                         .stage_end = dp__cuda_stage_end,
                                         .align = 256,
                                         .workspace_bytes = cuda_workspace_bytes,
                                         .host_staging = true};
const dp_transport_ops dp__cuda_transport = {
    .name = "cuda", .copy = no_copy, .peer = no_peer};

int dp__cuda_have_nccl(void) { return 0; }

dp_status dp__cuda_ctx_init(const dp_plan *p, void *const arenas[], unsigned flags,
                            void **bctx_out) {
  (void)p, (void)arenas, (void)flags;
  if (bctx_out) *bctx_out = NULL;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda backend: " NO_CUDA);
}

void dp__cuda_ctx_free(void *bctx) { (void)bctx; }

dp_status dp__cuda_step_begin(void *bctx, uint64_t step) {
  (void)bctx, (void)step;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda backend: " NO_CUDA);
}

dp_status dp__cuda_stage_begin(void *bctx, int dev, int stage) {
  (void)bctx, (void)dev, (void)stage;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda backend: " NO_CUDA);
}

dp_status dp__cuda_stage_end(void *bctx, int dev, int stage) {
  (void)bctx, (void)dev, (void)stage;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda backend: " NO_CUDA);
}

dp_status dp__cuda_step_end(void *bctx, float *loss) {
  (void)bctx;
  if (loss) *loss = 0.0f;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda backend: " NO_CUDA);
}

/* ---- CUDA graphs (cuda/graph.cu) ---- */

dp_status dp__cuda_capture_begin(void *bctx) {
  (void)bctx;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda graphs: " NO_CUDA);
}

dp_status dp__cuda_capture_end(void *bctx, int slot) {
  (void)bctx;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda graph slot %d: " NO_CUDA, slot);
}

void dp__cuda_capture_abort(void *bctx) { (void)bctx; }

int dp__cuda_graph_ready(const void *bctx, int slot) {
  (void)bctx, (void)slot;
  return 0;
}

dp_status dp__cuda_graph_launch(void *bctx, int slot, uint64_t step) {
  (void)bctx, (void)step;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda graph slot %d: " NO_CUDA, slot);
}

dp_status dp__cuda_memcpy(void *dst, const void *src, size_t bytes) {
  (void)dst, (void)src;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "copy of %zu bytes: " NO_CUDA, bytes);
}

dp_status dp__cuda_check_pinned(const void *p) {
  return DP_FAIL(DP_ERR_UNSUPPORTED, "staging %p: " NO_CUDA, p);
}

dp_status dp__cuda_fill_u32(int dev, void *dst, uint32_t value, size_t count) {
  (void)dst, (void)value, (void)count;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda device %d: " NO_CUDA, dev);
}

dp_status dp__cuda_rng_table(uint64_t seed, uint64_t stream, const uint64_t *abc, int n,
                             uint64_t *u64, float *uniform) {
  (void)seed, (void)stream, (void)abc, (void)n, (void)u64, (void)uniform;
  return DP_FAIL(DP_ERR_UNSUPPORTED, NO_CUDA);
}

dp_status dp__cuda_bench_sgemm(int dev, int m, int n, int k, int iters, int tf32,
                               double *ms, double *tflops) {
  (void)m, (void)n, (void)k, (void)iters, (void)tf32;
  if (ms) *ms = 0.0;
  if (tflops) *tflops = 0.0;
  return DP_FAIL(DP_ERR_UNSUPPORTED, "cuda device %d: " NO_CUDA, dev);
}
