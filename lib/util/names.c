/* Names of the configuration's enums: the words of the `dp` command line and
 * of its reports, one table per enum. (The other enums are named where they
 * are defined: layers and losses in model.c, regions in plan.c, phases and op
 * kinds in schedule.c, backends in backend.c, statuses in error.c.) */
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const split_names[] = {
    [DP_SPLIT_CHUNK] = "chunk",
    [DP_SPLIT_BALANCED] = "balanced",
    [DP_SPLIT_MEMORY] = "memory",
};
static const char *const mode_names[] = {
    [DP_MODE_CLASSIC] = "classic",
    [DP_MODE_ALLREDUCE] = "allreduce",
};
static const char *const optimizer_names[] = {
    [DP_OPT_SGD] = "sgd",
    [DP_OPT_MOMENTUM] = "momentum",
    [DP_OPT_ADAMW] = "adamw",
    [DP_OPT_ADAM] = "adam",
};
static const char *const bn_mode_names[] = {
    [DP_BN_PER_REPLICA] = "per_replica",
    [DP_BN_SYNC] = "sync",
};
static const char *const precision_names[] = {
    [DP_PRECISION_FP32] = "fp32",
    [DP_PRECISION_BF16] = "bf16",
};
static const char *const transport_names[] = {
    [DP_TRANSPORT_AUTO] = "auto",
    [DP_TRANSPORT_COPY] = "copy",
    [DP_TRANSPORT_NCCL] = "nccl",
};

#define NAME_OF(table, v) ((unsigned)(v) < sizeof table / sizeof *table ? table[v] : "?")

const char *dp_split_name(dp_split s) { return NAME_OF(split_names, s); }
const char *dp_mode_name(dp_mode m) { return NAME_OF(mode_names, m); }
const char *dp_optimizer_name(dp_optimizer o) { return NAME_OF(optimizer_names, o); }
const char *dp_transport_name(dp_transport t) { return NAME_OF(transport_names, t); }
const char *dp_bn_mode_name(dp_bn_mode m) { return NAME_OF(bn_mode_names, m); }
const char *dp_precision_name(dp_precision p) { return NAME_OF(precision_names, p); }

dp_status dp_precision_parse(const char *name, dp_precision *out) {
  if (!name || !out)
    return DP_FAIL(DP_ERR_INVALID, "dp_precision_parse: %s is NULL", name ? "out" : "name");
  for (unsigned i = 0; i < sizeof precision_names / sizeof *precision_names; i++)
    if (strcmp(name, precision_names[i]) == 0) {
      *out = (dp_precision)i;
      return DP_OK;
    }
  return DP_FAIL(DP_ERR_INVALID, "unknown precision '%s': the options are fp32 and bf16",
                 name);
}

const char *dp__shortest_float(float v, char *num, size_t cap) {
  for (int digits = 1; digits <= 9; digits++) {
    snprintf(num, cap, "%.*g", digits, (double)v);
    if ((float)strtod(num, NULL) == v) break;
  }
  return num;
}
