/* Set-up and tear-down of the CUDA backend: per device one stream, events, a
 * cuBLAS handle and the status header (in the arena's WORKSPACE), peer access,
 * and the pinned header the step's one synchronisation reads back. Runs at
 * context creation only: the step (backend.cu) allocates nothing. */
#include "backend.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- context ----------------------------------------------------------------------- */

extern "C" void dp__cuda_ctx_free(void *bctx) {
  cuda_ctx *c = (cuda_ctx *)bctx;
  if (!c) return;
  for (int d = 0; d < c->n; d++) {
    dev_ctx *x = &c->dev[d];
    if (!x->stream && !x->blas && !x->ev[0] && !x->ev[1]) continue;
    dp_cuda_device_scope scope;
    if (scope.enter(x->phys) != DP_OK) continue;
    if (x->stream) DP_CUDA_TRY(cudaStreamSynchronize(x->stream));
    if (x->blas) (void)cublasDestroy(x->blas);
    for (int i = 0; i < 2; i++)
      if (x->ev[i]) DP_CUDA_TRY(cudaEventDestroy(x->ev[i]));
    if (x->stream) DP_CUDA_TRY(cudaStreamDestroy(x->stream));
  }
  if (c->host_hdr) DP_CUDA_TRY(cudaFreeHost(c->host_hdr));
  if (tl_ctx == c) {
    tl_ctx = nullptr;
    tl_dev = -1;
  }
  free(c);
}

static dp_status init_device(cuda_ctx *c, int d) {
  const dp_plan *p = c->plan;
  dev_ctx *x = &c->dev[d];
  dp_cuda_device_scope scope;
  dp_status s = scope.enter(x->phys);
  if (s != DP_OK) return DP_FAIL(s, "device %d: %s", d, dp_last_error());
  cudaPointerAttributes a;
  DP_CUDA_CHECK_D(d, cudaPointerGetAttributes(&a, x->arena));
  if ((a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) || a.device != x->phys)
    return DP_FAIL(DP_ERR_INVALID, "device %d: its arena %p is not memory of GPU %d", d,
                   (void *)x->arena, x->phys);
  DP_CUDA_CHECK_D(d, cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking));
  for (int i = 0; i < 2; i++)
    DP_CUDA_CHECK_D(d, cudaEventCreateWithFlags(&x->ev[i], cudaEventDisableTiming));
  unsigned char *ws = x->arena + p->regions[d][DP_REGION_WORKSPACE].offset;
  x->hdr = (dp_cuda_header *)ws;
  s = dp__cuda_blas_create(x->stream, ws + DP_CUDA_WS_HEADER_BYTES, DP_CUDA_BLAS_WS_BYTES,
                           (c->flags & DP_CUDA_TF32) != 0, &x->blas);
  if (s != DP_OK) return DP_FAIL(s, "device %d: %s", d, dp_last_error());
  return DP_OK;
}

/* Peer access between the distinct GPUs in use, where the hardware has it.
 * Only a speed-up: cudaMemcpyPeerAsync works without it (through host
 * memory), so a refusal (cudaErrorTooManyPeers, say) is not an error. Each
 * ordered pair of GPUs is visited once: at the first logical devices that
 * have them. */
static dp_status enable_peers(cuda_ctx *c) {
  for (int a = 0; a < c->n; a++)
    for (int b = 0; b < c->n; b++) {
      int pa = c->dev[a].phys, pb = c->dev[b].phys;
      if (pa == pb) continue;
      bool seen = false;
      for (int k = 0; k < a && !seen; k++) seen = c->dev[k].phys == pa;
      for (int k = 0; k < b && !seen; k++) seen = c->dev[k].phys == pb;
      if (seen) continue;
      int can = 0;
      DP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, pa, pb));
      if (!can) continue;
      dp_cuda_device_scope scope;
      dp_status s = scope.enter(pa);
      if (s != DP_OK) return s;
      if (cudaDeviceEnablePeerAccess(pb, 0) != cudaSuccess) (void)cudaGetLastError();
    }
  return DP_OK;
}

extern "C" dp_status dp__cuda_ctx_init(const dp_plan *p, void *const arenas[], unsigned flags,
                                       void **bctx_out) {
  if (!bctx_out) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init: out is NULL");
  *bctx_out = NULL;
  if (!p || !arenas) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init: plan or arenas is NULL");
  int n = p->split.n_used;
  if (n < 1 || n > DP_MAX_DEVICES)
    return DP_FAIL(DP_ERR_INVALID, "dp__cuda_ctx_init: %d devices", n);
  size_t need = dp__cuda_workspace_bytes();
  for (int d = 0; d < n; d++) {
    dp_region_info ws = p->regions[d][DP_REGION_WORKSPACE];
    if (ws.size < need)
      return DP_FAIL(DP_ERR_INVALID,
                     "device %d: the plan reserves %zu bytes of workspace; the CUDA backend "
                     "needs %zu (dp__cuda_workspace_bytes: %zu of status words + %zu for cuBLAS)",
                     d, ws.size, need, DP_CUDA_WS_HEADER_BYTES, DP_CUDA_BLAS_WS_BYTES);
    if (!arenas[d] || (uintptr_t)arenas[d] % 256 || (ws.offset + DP_CUDA_WS_HEADER_BYTES) % 256)
      return DP_FAIL(DP_ERR_INVALID, "device %d: arena %p or its workspace is not 256-aligned", d,
                     arenas[d]);
    if (p->cfg.device_ids[d] < 0)
      return DP_FAIL(DP_ERR_INVALID, "device %d: GPU id %d", d, p->cfg.device_ids[d]);
  }
  cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
  if (!c) return DP_FAIL(DP_ERR_NOMEM, "dp__cuda_ctx_init: out of memory");
  c->plan = p;
  c->n = n;
  c->flags = flags;
  for (int d = 0; d < n; d++) {
    c->dev[d].phys = p->cfg.device_ids[d];
    c->dev[d].arena = (unsigned char *)arenas[d];
    c->dev[d].bytes = p->dev_bytes[d];
    c->dev[d].stage = -1;
  }
  dp_status s = DP_OK;
  for (int d = 0; d < n && s == DP_OK; d++) s = init_device(c, d);
  if (s == DP_OK) s = enable_peers(c);
  if (s == DP_OK) {
    cudaError_t e = cudaHostAlloc((void **)&c->host_hdr, (size_t)n * sizeof(dp_cuda_header),
                                  cudaHostAllocPortable);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      c->host_hdr = NULL;
      s = DP_CUDA_FAIL(dp__cuda_status_of(e), e, "cudaHostAlloc", "%s",
                       "pinned status read-back block");
    }
  }
  if (s != DP_OK) {
    char msg[DP_ERRMSG_CAP];
    snprintf(msg, sizeof msg, "%s", dp_last_error());
    dp__cuda_ctx_free(c);
    return DP_FAIL(s, "%s", msg);
  }
  *bctx_out = c;
  return DP_OK;
}

/* ---- helpers for the context and tests --------------------------------------------- */

extern "C" dp_status dp__cuda_memcpy(void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return DP_OK;
  if (!dst || !src) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_memcpy: NULL pointer");
  DP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  return DP_OK;
}

extern "C" dp_status dp__cuda_fill_u32(int dev, void *dst, uint32_t value, size_t count) {
  if (count == 0) return DP_OK;
  if (!dst) return DP_FAIL(DP_ERR_INVALID, "dp__cuda_fill_u32: NULL pointer");
  dp_cuda_device_scope scope;
  dp_status s = scope.enter(dev);
  if (s != DP_OK) return s;
  DP_CUDA_CHECK(dp_k_fill(0, (uint32_t *)dst, value, count));
  DP_CUDA_CHECK(cudaStreamSynchronize(0));
  return DP_OK;
}
