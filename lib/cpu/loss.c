/* The element-wise losses on float targets but mse (lib/cpu/backend.c's
 * loss_rows runs that one itself): l1, smooth_l1, huber and bce_with_logits,
 * one term and one gradient element each (cpu.h has the contract;
 * cuda/kernels.cu's k_loss_mse computes the same expressions). */
#include "cpu/cpu.h"
#include "util/expf.h"

#include <math.h>
#include <stddef.h>

/* nn.L1Loss, nn.SmoothL1Loss(beta), nn.HuberLoss(delta) (param: beta or delta),
 * nn.BCEWithLogitsLoss (o: the logits; pw: pos_weight by column of cols, or NULL) on
 * elements [i0, i1): the sum of their terms from +0 in element order, and g = the term's
 * derivative times inv (1 / the mean's count), as PyTorch's CPU kernels write them (L1's
 * at 0 is 0). */
float dp__elem_loss(dp_loss_kind k, float param, const float *pw, size_t cols,
                    const float *o, const float *t, float *g, size_t i0, size_t i1,
                    float inv) {
  float s = 0.0f;
  for (size_t i = i0; i < i1; i++) {
    float d = o[i] - t[i], z = fabsf(d), term, dd;
    if (k == DP_LOSS_L1) {
      term = z;
      dd = d > 0.0f ? 1.0f : d < 0.0f ? -1.0f : d; /* NaN stays NaN */
    } else if (k == DP_LOSS_BCE_LOGITS && pw) {
      /* aten's pos_weight form: (1 - t) x + lw (log(e^-m + e^(-x-m)) + m) with
       * lw = (p - 1) t + 1; the derivative ((p t + 1) - t) sigmoid(x) - p t */
      float x = o[i], m = x < 0.0f ? -x : 0.0f, p = pw[i % cols], pt = p * t[i];
      float lw = (p - 1.0f) * t[i] + 1.0f;
      term = (1.0f - t[i]) * x + lw * (logf(dp__expf(-m) + dp__expf(-x - m)) + m);
      dd = (pt + 1.0f - t[i]) * (1.0f / (1.0f + dp__expf(-x))) - pt;
    } else if (k == DP_LOSS_BCE_LOGITS) {
      /* (1 - t) z + log(1 + e^-z), written with m = max(-z, 0) so that no
       * exponent overflows; its derivative sigmoid(z) - t */
      float z0 = o[i], m = z0 < 0.0f ? -z0 : 0.0f;
      term = (1.0f - t[i]) * z0 + m + logf(dp__expf(-m) + dp__expf(-z0 - m));
      dd = 1.0f / (1.0f + dp__expf(-z0)) - t[i];
    } else if (k == DP_LOSS_SMOOTH_L1) {
      term = z < param ? 0.5f * z * z / param : z - 0.5f * param;
      dd = d <= -param ? -1.0f : d >= param ? 1.0f : d / param;
    } else { /* DP_LOSS_HUBER */
      term = z < param ? 0.5f * z * z : param * (z - 0.5f * param);
      dd = d <= -param ? -param : d >= param ? param : d;
    }
    s += term;
    g[i] = dd * inv;
  }
  return s;
}
