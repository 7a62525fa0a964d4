/* dp_plan_fit: the configuration that fits a memory budget and runs fastest.
 *
 * Every candidate is a real plan (dp_plan_create), so "fits" is exact: its
 * largest arena, device or host staging, is at most the budget. Speed is an
 * estimate, a cost model over the plan's schedule: each device's ops cost
 *   GEMM flops / (gflops * r / (r + half_rows))   r: the GEMM's rows
 *   bytes streamed / mem_gbs                       copies, adds, updates, checks,
 *                                                  elementwise layers
 *   op_us                                          per op (launch, barrier)
 * and the step takes as long as the slowest device (the devices run in
 * parallel and meet at the schedule's barriers). docs/PLANNER.md says how
 * `dp bench` calibrates the four numbers. */
#include "core/exec.h" /* dp__exec_share_kind; backend.h: dp__fit_backend_options */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dp_fit_costs_default(dp_fit_costs *k) {
  if (!k) return;
  /* one core of the AVX-512 machine of docs/PERFORMANCE.md: libdp's SGEMM at
   * ~80% of 117.6 GFLOP/s, half of it at 8 rows; a core's streaming bandwidth;
   * the executor's cost per op */
  k->gflops = 90.0;
  k->half_rows = 8.0;
  k->mem_gbs = 10.0;
  k->op_us = 1.0;
  k->bf16_gflops = 0.0; /* as gflops: the emulated bf16 GEMM runs the fp32 kernel */
}

/* A layer's forward GEMM flops and GEMM rows for `rows` rows of the batch; 0
 * flops for a layer without a GEMM. */
static double gemm_flops(const dp_layer *l, int rows, double *gemm_rows) {
  double r = rows > 0 ? rows : 0;
  switch (l->kind) {
  case DP_LAYER_LINEAR: {
    double pos = dp__positions(l);
    *gemm_rows = r * pos;
    return 2.0 * r * pos * dp__pos_in(l) * dp__pos_out(l);
  }
  case DP_LAYER_CONV2D: {
    double P = (double)l->h * l->w;
    *gemm_rows = r * P;
    return 2.0 * r * P * ((double)l->ic * l->k * l->k) * l->c;
  }
  case DP_LAYER_ATTENTION: { /* q k^T and p v on the causal half, per head */
    double T = l->t, D = l->c;
    *gemm_rows = T;
    return 2.0 * r * T * T * D;
  }
  default: *gemm_rows = 0; return 0.0;
  }
}

/* Bytes an update streams per parameter byte: p, g and the state read, p and
 * the state written (amsgrad's v_hat: one more vector each way). */
static double update_factor(const dp_config *c) {
  if (c->optimizer == DP_OPT_ADAMW || c->optimizer == DP_OPT_ADAM)
    return c->amsgrad ? 9.0 : 7.0;
  return c->momentum > 0.0f || c->optimizer == DP_OPT_MOMENTUM ? 5.0 : 3.0;
}

/* The cost model's step time of plan p, in milliseconds. */
static double estimate_ms(const dp_plan *p, const dp_fit_costs *k) {
  double t[DP_MAX_DEVICES] = {0};
  /* bf16 (lib/cpu/mixed.c): the GEMMs at bf16_gflops; an elementwise layer
   * widens its bf16 input (2 B read, 4 written), runs in fp32 (8) and rounds
   * its output back (4 read, 2 written): 20 bytes an element instead of 8 */
  bool bf16 = dp_plan_config(p)->precision == DP_PRECISION_BF16;
  double gf = bf16 && k->bf16_gflops > 0 ? k->bf16_gflops : k->gflops;
  double elt = bf16 ? 20.0 : 8.0;
  const dp_model *m = dp_plan_model(p);
  const dp_op *ops = dp_plan_ops(p);
  /* a host-memory backend's executor shares elementwise ops among the device
   * threads of a one-process job (lib/core/exec.c; a job of several processes
   * moves its bytes through the world's transport and shares none): their cost
   * falls on every device */
  const dp_config *c = dp_plan_config(p);
  const dp_backend_ops *be = dp__backend_ops(c->backend);
  int nd = c->n_devices;
  bool share = be && be->host_memory && dp__ranks(c) == 1 && nd > 1;
  for (int i = 0; i < dp_plan_n_ops(p); i++) {
    const dp_op *op = &ops[i];
    if (op->device < 0 || op->device >= DP_MAX_DEVICES) continue;
    double s = k->op_us * 1e-6, bytes = (double)op->bytes;
    if ((op->kind == DP_OP_FORWARD || op->kind == DP_OP_BACKWARD) && op->layer >= 0) {
      const dp_layer *l = &m->layers[op->layer];
      double gr = 0, f = gemm_flops(l, op->rows, &gr);
      if (op->kind == DP_OP_BACKWARD) f *= 2.0; /* the input's and the weights' gradients */
      if (f > 0)
        s += f / (gf * 1e9 * (gr / (gr + k->half_rows)));
      else /* elementwise: the input read, the output written */
        s += elt * op->rows * (double)l->out / (k->mem_gbs * 1e9);
    } else {
      if (op->kind == DP_OP_OPTIMIZER) bytes *= update_factor(c);
      s += bytes / (k->mem_gbs * 1e9);
    }
    if (share && dp__exec_share_kind(op, c->mode == DP_MODE_CLASSIC)) {
      for (int d = 0; d < nd && d < DP_MAX_DEVICES; d++) t[d] += s / nd;
      continue;
    }
    t[op->device] += s;
  }
  double worst = 0;
  for (int d = 0; d < DP_MAX_DEVICES; d++) worst = t[d] > worst ? t[d] : worst;
  return worst * 1e3;
}

static size_t largest_arena(const dp_plan *p) {
  size_t b = dp_plan_host_bytes(p);
  for (int d = 0; d < dp_plan_n_devices(p); d++)
    if (dp_plan_device_bytes(p, d) > b) b = dp_plan_device_bytes(p, d);
  return b;
}

/* The micro-batch sizes to try: the config's own, and with DP_FIT_MICRO_BATCH
 * every power of two below the rows of a device's chunk. */
static int micro_batches(const dp_config *c, unsigned allow, int *mb, int cap) {
  int n = 0;
  mb[n++] = c->micro_batch;
  if (!(allow & DP_FIT_MICRO_BATCH)) return n;
  int chunk = (c->batch + c->n_devices - 1) / (c->n_devices > 0 ? c->n_devices : 1);
  for (int r = 1; r < chunk && n < cap; r *= 2)
    if (r != c->micro_batch) mb[n++] = r;
  return n;
}

/* The recompute settings to try: the config's own, and with DP_FIT_RECOMPUTE
 * segments of a few lengths shorter than the model (training plans only). */
static int recomputes(const dp_model *m, const dp_config *c, unsigned allow, int *rc,
                      int cap) {
  static const int K[] = {2, 3, 4, 6, 8, 12, 16, 24, 32};
  int n = 0;
  rc[n++] = c->recompute;
  if (!(allow & DP_FIT_RECOMPUTE) || c->inference) return n;
  for (size_t i = 0; i < sizeof K / sizeof K[0] && n < cap; i++)
    if (K[i] < m->n_layers && K[i] != c->recompute) rc[n++] = K[i];
  return n;
}

typedef struct {
  dp_fit *out;
  int cap, n;
  dp_fit smallest; /* the smallest plan found, fitting or not */
  int planned;     /* candidates that planned */
  int fitting;     /* and of them fit */
  dp_status first_error;
  char first_msg[256];
} search;

/* a before b: faster, or as fast with fewer bytes */
static bool better(const dp_fit *a, const dp_fit *b) {
  return a->est_ms < b->est_ms || (a->est_ms == b->est_ms && a->bytes < b->bytes);
}

/* Keeps the fitting candidate f among the cap best in out, best first. */
static void keep(search *s, const dp_fit *f) {
  int i;
  if (s->n < s->cap)
    i = s->n++;
  else if (s->cap > 0 && better(f, &s->out[s->cap - 1]))
    i = s->cap - 1;
  else
    return;
  for (; i > 0 && better(f, &s->out[i - 1]); i--) s->out[i] = s->out[i - 1];
  s->out[i] = *f;
}

static void try_config(search *s, const dp_model *m, const dp_config *c, size_t budget,
                       const dp_fit_costs *k) {
  dp_plan *p = NULL;
  dp_status st = dp_plan_create(m, c, &p);
  if (st != DP_OK) {
    if (!s->first_error) {
      s->first_error = st;
      snprintf(s->first_msg, sizeof s->first_msg, "%s", dp_last_error());
    }
    return;
  }
  dp_fit f = {.config = *c, .bytes = largest_arena(p), .est_ms = estimate_ms(p, k)};
  dp_plan_free(p);
  if (!s->planned++ || f.bytes < s->smallest.bytes) s->smallest = f;
  if (f.bytes <= budget) {
    s->fitting++;
    keep(s, &f);
  }
}

dp_status dp_plan_fit(const dp_model *m, const dp_config *c, size_t budget, unsigned allow,
                      const dp_fit_costs *costs, dp_fit *out, int cap, int *n_out) {
  if (!m || !c || !n_out || (cap > 0 && !out) || cap < 0)
    return DP_FAIL(DP_ERR_INVALID, "dp_plan_fit: NULL argument or negative cap");
  *n_out = 0;
  if (allow & ~(unsigned)DP_FIT_ALL)
    return DP_FAIL(DP_ERR_INVALID, "dp_plan_fit: unknown bits 0x%x in allow",
                   allow & ~(unsigned)DP_FIT_ALL);
  /* as dp_plan_create refuses them: the search copies them with %s */
  if (strnlen(c->backend_options, sizeof c->backend_options) == sizeof c->backend_options)
    return DP_FAIL(DP_ERR_INVALID,
                   "dp_plan_fit: backend_options is not terminated within %d bytes",
                   (int)sizeof c->backend_options);
  dp_fit_costs k;
  dp_fit_costs_default(&k);
  if (costs) k = *costs;
  /* each finite on its own: their sum overflows for finite ones (session 24) */
  if (!(k.gflops > 0) || !(k.half_rows >= 0) || !(k.mem_gbs > 0) || !(k.op_us >= 0) ||
      !(k.bf16_gflops >= 0) || !isfinite(k.gflops) || !isfinite(k.half_rows) ||
      !isfinite(k.mem_gbs) || !isfinite(k.op_us) || !isfinite(k.bf16_gflops))
    return DP_FAIL(DP_ERR_INVALID,
                   "dp_plan_fit: costs need gflops > 0, half_rows >= 0, mem_gbs > 0, "
                   "op_us >= 0 and bf16_gflops >= 0, all finite");
  search s = {.out = out, .cap = cap};
  /* c's backend options, and with DP_FIT_BACKEND their variants */
  char bopts[8][DP_BACKEND_OPTIONS_CAP];
  int n_bo = allow & DP_FIT_BACKEND ? dp__fit_backend_options(c, bopts, 8) : 1;
  if (n_bo == 1) snprintf(bopts[0], sizeof bopts[0], "%s", c->backend_options);
  int mbs[32], n_mb = micro_batches(c, allow, mbs, 32);
  int rcs[16], n_rc = recomputes(m, c, allow, rcs, 16);
  /* the config's precision, and with DP_FIT_PRECISION bf16 too */
  dp_precision precs[2] = {c->precision, DP_PRECISION_BF16};
  int n_prec = (allow & DP_FIT_PRECISION) && c->precision != DP_PRECISION_BF16 ? 2 : 1;
  for (int pr = 0; pr < n_prec * n_bo; pr++)
    for (int mode = 0; mode < 2; mode++)
      for (int shard = 0; shard < 2; shard++)
        for (int split = 0; split < 3; split++)
          for (int i = 0; i < n_mb * n_rc; i++) {
            dp_config t = *c;
            if (allow & DP_FIT_MODE)
              t.mode = mode ? DP_MODE_ALLREDUCE : DP_MODE_CLASSIC;
            else if (mode)
              continue;
            if (allow & DP_FIT_SHARD)
              t.shard_optimizer = shard && t.mode == DP_MODE_ALLREDUCE;
            else if (shard)
              continue;
            if (shard && !t.shard_optimizer) continue; /* the same as shard 0 */
            if (allow & DP_FIT_SPLIT)
              t.split = split == 0   ? DP_SPLIT_CHUNK
                        : split == 1 ? DP_SPLIT_BALANCED
                                     : DP_SPLIT_MEMORY;
            else if (split)
              continue;
            t.micro_batch = mbs[i % n_mb];
            t.recompute = rcs[i / n_mb];
            t.precision = precs[pr % n_prec];
            snprintf(t.backend_options, sizeof t.backend_options, "%s", bopts[pr / n_prec]);
            try_config(&s, m, &t, budget, &k);
          }
  *n_out = s.n;
  if (s.fitting > 0) return DP_OK;
  if (!s.planned)
    return DP_FAIL(s.first_error, "no configuration could be planned: %s", s.first_msg);
  if (cap > 0) out[0] = s.smallest;
  char mb[32] = "the chunk";
  if (s.smallest.config.micro_batch > 0)
    snprintf(mb, sizeof mb, "%d rows", s.smallest.config.micro_batch);
  return DP_FAIL(DP_ERR_RANGE,
                 "no configuration fits %zu bytes per device: the smallest found needs %zu "
                 "(mode %s%s, split %s, micro-batch %s, recompute %d, precision %s%s%s), "
                 "%zu over",
                 budget, s.smallest.bytes, dp_mode_name(s.smallest.config.mode),
                 s.smallest.config.shard_optimizer ? ", sharded optimizer" : "",
                 dp_split_name(s.smallest.config.split), mb, s.smallest.config.recompute,
                 dp_precision_name(s.smallest.config.precision),
                 s.smallest.config.backend_options[0] ? ", " : "",
                 s.smallest.config.backend_options, s.smallest.bytes - budget);
}
