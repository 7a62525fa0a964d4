/* Learning-rate schedules as torch.optim.lr_scheduler computes them, for a
 * caller that sets the rate between steps (dp_set_lr). Pure arithmetic in
 * double, like PyTorch's Python floats; t counts scheduler steps. */
#include "core/plan.h"

#include <math.h>
#include <stdlib.h>

static const double PI = 3.14159265358979323846;

/* gamma, pct_start and the div factors as the decimal a PyTorch script writes:
 * the shortest (up to 9 digits) that rounds to the float (0.99999f as 0.99999).
 * The float itself is up to 3e-8 relative off that decimal, and gamma^t
 * multiplies the error by t: 1.4e-3 relative from ExponentialLR(gamma=0.99999)
 * by step 100000. */
static double written(float v) {
  char num[32];
  return strtod(dp__shortest_float(v, num, sizeof num), NULL);
}

/* OneCycleLR's phases: where each ends (end[i], a step in double as PyTorch
 * computes it) and the values it goes between: the rates, or (momentum) the
 * momenta, which run against them. Returns the count, 2 or 3. */
static int onecycle_phases(const dp_lr_schedule *s, bool momentum, double end[3],
                           double from[3], double to[3]) {
  double T = s->total_steps, pct = written(s->pct_start);
  double max = s->base_lr, initial = max / written(s->div_factor);
  double min = initial / written(s->final_div_factor);
  if (momentum) { /* max_momentum -> base -> max (three phases: then max -> max) */
    initial = min = written(s->max_momentum);
    max = written(s->base_momentum);
  }
  end[0] = pct * T - 1.0;
  from[0] = initial;
  to[0] = max;
  if (!s->three_phase) {
    end[1] = T - 1.0;
    from[1] = max;
    to[1] = min;
    return 2;
  }
  end[1] = 2.0 * pct * T - 2.0;
  from[1] = max;
  to[1] = initial;
  end[2] = T - 1.0;
  from[2] = initial;
  to[2] = min;
  return 3;
}

static dp_status check_onecycle(const dp_lr_schedule *s) {
  if (s->total_steps < 1)
    return DP_FAIL(DP_ERR_INVALID, "onecycle schedule: total_steps must be >= 1, got %d",
                   s->total_steps);
  if (!(s->pct_start >= 0.0f && s->pct_start <= 1.0f))
    return DP_FAIL(DP_ERR_INVALID, "onecycle schedule: pct_start must be in [0, 1], got %g",
                   (double)s->pct_start);
  if (!(s->div_factor > 0.0f && s->div_factor <= 3.4e38f) ||
      !(s->final_div_factor > 0.0f && s->final_div_factor <= 3.4e38f))
    return DP_FAIL(DP_ERR_INVALID,
                   "onecycle schedule: div_factor and final_div_factor must be finite and "
                   "> 0, got %g and %g",
                   (double)s->div_factor, (double)s->final_div_factor);
  if ((s->anneal_linear != 0 && s->anneal_linear != 1) ||
      (s->three_phase != 0 && s->three_phase != 1))
    return DP_FAIL(
        DP_ERR_INVALID,
        "onecycle schedule: anneal_linear and three_phase must be 0 or 1, got %d "
        "and %d",
        s->anneal_linear, s->three_phase);
  if (s->cycle_momentum != 0 && s->cycle_momentum != 1)
    return DP_FAIL(DP_ERR_INVALID,
                   "onecycle schedule: cycle_momentum must be 0 or 1, got %d",
                   s->cycle_momentum);
  /* a momentum dp_set_momentum takes (PyTorch does not check them) */
  if (s->cycle_momentum && !(s->base_momentum >= 0.0f && s->base_momentum < 1.0f &&
                             s->max_momentum >= 0.0f && s->max_momentum < 1.0f))
    return DP_FAIL(DP_ERR_INVALID,
                   "onecycle schedule: base_momentum and max_momentum must be in [0, 1), "
                   "got %g and %g",
                   (double)s->base_momentum, (double)s->max_momentum);
  double end[3], from[3], to[3], start = 0.0;
  int n = onecycle_phases(s, false, end, from, to);
  for (int i = 0; i < n; start = end[i++])
    if (end[i] == start) /* PyTorch divides by the phase's length */
      return DP_FAIL(DP_ERR_INVALID,
                     "onecycle schedule: phase %d of %d has no steps (pct_start %g of "
                     "total_steps %d); change pct_start or total_steps",
                     i + 1, n, (double)s->pct_start, s->total_steps);
  return DP_OK;
}

void dp_lr_schedule_onecycle(dp_lr_schedule *s, float max_lr, int total_steps) {
  if (!s) return;
  *s = (dp_lr_schedule){.kind = DP_LR_ONECYCLE,
                        .base_lr = max_lr,
                        .total_steps = total_steps,
                        .pct_start = 0.3f,
                        .div_factor = 25.0f,
                        .final_div_factor = 1e4f,
                        .cycle_momentum = 1,
                        .base_momentum = 0.85f,
                        .max_momentum = 0.95f};
}

/* OneCycleLR's rate (or momentum) at step t <= total_steps: the phase that
 * holds t (the last one past its end), annealed from its start to its end. */
static double onecycle(const dp_lr_schedule *s, bool momentum, uint64_t t) {
  double end[3], from[3], to[3], start = 0.0, x = (double)t;
  int n = onecycle_phases(s, momentum, end, from, to), i = 0;
  while (i < n - 1 && x > end[i]) start = end[i++];
  double pct = (x - start) / (end[i] - start);
  if (s->anneal_linear) return (to[i] - from[i]) * pct + from[i];
  return to[i] + (from[i] - to[i]) / 2.0 * (cos(PI * pct) + 1.0);
}

dp_status dp_lr_schedule_check(const dp_lr_schedule *s) {
  if (!s) return DP_FAIL(DP_ERR_INVALID, "dp_lr_schedule_check: schedule is NULL");
  if (!(s->base_lr > 0.0f && s->base_lr <= 3.4e38f))
    return DP_FAIL(DP_ERR_INVALID, "schedule: base_lr must be finite and positive, got %g",
                   (double)s->base_lr);
  switch (s->kind) {
  case DP_LR_CONSTANT: return DP_OK;
  case DP_LR_STEP:
    if (s->step_size < 1 || !(s->gamma > 0.0f && s->gamma <= 1.0f))
      return DP_FAIL(DP_ERR_INVALID,
                     "step schedule: step_size must be >= 1 and gamma in (0, 1], got %d "
                     "and %g",
                     s->step_size, (double)s->gamma);
    return DP_OK;
  case DP_LR_EXPONENTIAL:
  case DP_LR_MULTISTEP:
    if (!(s->gamma > 0.0f && s->gamma <= 1.0f))
      return DP_FAIL(DP_ERR_INVALID, "%s schedule: gamma must be in (0, 1], got %g",
                     s->kind == DP_LR_EXPONENTIAL ? "exponential" : "multistep",
                     (double)s->gamma);
    if (s->kind == DP_LR_EXPONENTIAL) return DP_OK;
    if (s->n_milestones < 1 || s->n_milestones > DP_LR_MAX_MILESTONES)
      return DP_FAIL(DP_ERR_INVALID, "multistep schedule: give 1 to %d milestones, got %d",
                     DP_LR_MAX_MILESTONES, s->n_milestones);
    for (int i = 0; i < s->n_milestones; i++)
      if (s->milestones[i] < 1 || (i && s->milestones[i] <= s->milestones[i - 1]))
        return DP_FAIL(DP_ERR_INVALID,
                       "multistep schedule: milestones must be increasing steps >= 1; "
                       "milestone %d is %d",
                       i, s->milestones[i]);
    return DP_OK;
  case DP_LR_WARMUP:
  case DP_LR_WARMUP_COSINE:
    if (s->warmup < 1 || !(s->start_factor > 0.0f && s->start_factor <= 1.0f))
      return DP_FAIL(DP_ERR_INVALID,
                     "warm-up: warmup must be >= 1 step and start_factor in (0, 1], got %d "
                     "and %g",
                     s->warmup, (double)s->start_factor);
    if (s->kind == DP_LR_WARMUP) return DP_OK;
    __attribute__((fallthrough)); /* the cosine after it */
  case DP_LR_COSINE:
    if (s->t_max < 1 || !(s->eta_min >= 0.0f && s->eta_min <= s->base_lr))
      return DP_FAIL(DP_ERR_INVALID,
                     "cosine schedule: t_max must be >= 1 and 0 <= eta_min <= base_lr, got "
                     "%d and %g",
                     s->t_max, (double)s->eta_min);
    return DP_OK;
  case DP_LR_ONECYCLE: return check_onecycle(s);
  }
  return DP_FAIL(DP_ERR_INVALID, "unknown schedule kind %d", (int)s->kind);
}

/* CosineAnnealingLR's closed form (it repeats after t_max, as PyTorch's does). */
static double cosine(const dp_lr_schedule *s, double t) {
  double base = s->base_lr, lo = s->eta_min;
  return lo + (base - lo) * (1.0 + cos(PI * t / s->t_max)) / 2.0;
}

/* LinearLR's factor at t < warmup */
static double warm(const dp_lr_schedule *s, uint64_t t) {
  return s->start_factor + (1.0 - s->start_factor) * (double)t / s->warmup;
}

static double gamma_of(const dp_lr_schedule *s) { return written(s->gamma); }

float dp_lr_at(const dp_lr_schedule *s, uint64_t t) {
  if (!s || dp_lr_schedule_check(s) != DP_OK) return NAN;
  double base = s->base_lr;
  switch (s->kind) {
  case DP_LR_CONSTANT: return s->base_lr;
  case DP_LR_STEP:
    return (float)(base * pow(gamma_of(s), (double)(t / (uint64_t)s->step_size)));
  case DP_LR_COSINE: return (float)cosine(s, (double)t);
  case DP_LR_WARMUP_COSINE: /* SequentialLR(LinearLR(start_factor, 1, warmup), cosine) */
    if (t < (uint64_t)s->warmup) return (float)(base * warm(s, t));
    return (float)cosine(s, (double)(t - (uint64_t)s->warmup));
  case DP_LR_EXPONENTIAL: return (float)(base * pow(gamma_of(s), (double)t));
  case DP_LR_MULTISTEP: { /* bisect_right(milestones, t) decays so far */
    int k = 0;
    while (k < s->n_milestones && (uint64_t)s->milestones[k] <= t) k++;
    return (float)(base * pow(gamma_of(s), k));
  }
  case DP_LR_WARMUP:
    return t < (uint64_t)s->warmup ? (float)(base * warm(s, t)) : s->base_lr;
  case DP_LR_ONECYCLE:
    return t > (uint64_t)s->total_steps ? NAN : (float)onecycle(s, false, t);
  }
  return NAN;
}

float dp_momentum_at(const dp_lr_schedule *s, uint64_t t) {
  if (!s || s->kind != DP_LR_ONECYCLE || s->cycle_momentum != 1 ||
      t > (uint64_t)s->total_steps || dp_lr_schedule_check(s) != DP_OK)
    return NAN;
  return (float)onecycle(s, true, t);
}
