/* Offsets for buffers with known lifetimes (TFLite Micro's greedy planner):
 * place the largest first, each at the lowest offset where it overlaps no
 * placed buffer whose use interval intersects its own. Ties break by index,
 * so the layout is a pure function of the input. */
#include "core/plan.h"

#include <stdlib.h>

static bool live_together(const dp_live_buf *a, const dp_live_buf *b) {
  return a->first <= b->last && b->first <= a->last;
}

dp_status dp__live_place(dp_live_buf *b, int n, size_t *total) {
  enum { CAP = DP_ACT_BUFS + 8 };
  if (n > CAP) return DP_FAIL(DP_ERR_INVALID, "too many buffers to place (%d)", n);
  int order[CAP], placed[CAP], n_placed = 0;
  for (int i = 0; i < n; i++) order[i] = i;
  /* insertion sort: size descending, then index */
  for (int i = 1; i < n; i++) {
    int v = order[i], j = i;
    while (j > 0 && b[order[j - 1]].size < b[v].size) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = v;
  }
  *total = 0;
  for (int oi = 0; oi < n; oi++) {
    dp_live_buf *x = &b[order[oi]];
    size_t off = 0;
    if (x->size == 0) {
      x->offset = 0;
      continue;
    }
    /* Try candidate offsets: 0 and the aligned end of every conflicting buffer;
     * take the lowest that fits. */
    size_t best = SIZE_MAX;
    for (int ci = -1; ci < n_placed; ci++) {
      size_t cand = 0;
      if (ci >= 0) {
        const dp_live_buf *y = &b[placed[ci]];
        if (!live_together(x, y)) continue;
        if (!dp__add(y->offset, y->size, &cand) || !dp__align_up(cand, x->align, &cand))
          return DP_FAIL(DP_ERR_OVERFLOW, "activation arena size overflows size_t");
      }
      if (cand >= best) continue;
      size_t end;
      if (!dp__add(cand, x->size, &end))
        return DP_FAIL(DP_ERR_OVERFLOW, "activation arena size overflows size_t");
      bool ok = true;
      for (int pj = 0; pj < n_placed && ok; pj++) {
        const dp_live_buf *y = &b[placed[pj]];
        if (live_together(x, y) && cand < y->offset + y->size && y->offset < end) ok = false;
      }
      if (ok) best = cand;
    }
    off = best;
    x->offset = off;
    placed[n_placed++] = order[oi];
    size_t end = off + x->size;
    if (end > *total) *total = end;
  }
  return DP_OK;
}
