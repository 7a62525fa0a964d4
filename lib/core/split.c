/* Cutting a batch along dim 0 into micro-batches and assigning contiguous
 * blocks of micro-batches to devices.
 *
 * Without a fixed micro-batch size each device gets one micro-batch, its whole
 * chunk: `chunk` is torch.chunk (chunk = ceil(B/N), the last may be short, fewer
 * devices may be used), `balanced` is torch.tensor_split (the first B%N devices
 * get one more row). With a fixed size m the batch is cut into ceil(B/m)
 * micro-batches first, and the same two policies deal micro-batches to devices. */
#include "core/plan.h"

#include <limits.h>

int dp__split_max_mbs(const dp_config *c) {
  if (c->micro_batch > 0) return (int)(((long long)c->batch + c->micro_batch - 1) / c->micro_batch);
  return c->n_devices < c->batch ? c->n_devices : c->batch;
}

/* Deals `n` items to `N` devices: counts into cnt[0..N). `first` is device
 * 0's share under the memory policy. */
static void deal(dp_split pol, int n, int N, int first, int *cnt) {
  if (pol == DP_SPLIT_MEMORY && N > 1) {
    cnt[0] = first < n ? first : n;
    deal(DP_SPLIT_BALANCED, n - cnt[0], N - 1, 0, cnt + 1);
    return;
  }
  if (pol == DP_SPLIT_BALANCED) {
    for (int d = 0; d < N; d++) cnt[d] = n / N + (d < n % N);
    return;
  }
  int per = n / N + (n % N != 0); /* ceil(n/N); n + N - 1 could overflow */
  for (int d = 0, left = n; d < N; d++) {
    cnt[d] = left < per ? left : per;
    left -= cnt[d];
  }
}

int dp__split_items(const dp_config *c, int rows) {
  return c->micro_batch > 0 ? rows / c->micro_batch + (rows % c->micro_batch != 0) : rows;
}

dp_status dp__split(const dp_config *c, int rows, int first, dp_split_info *s, dp_mb *mbs) {
  int N = c->n_devices;
  if (N < 1 || N > DP_MAX_DEVICES)
    return DP_FAIL(DP_ERR_INVALID, "device count %d is out of range (1..%d)", N,
                   DP_MAX_DEVICES);
  if (rows < 1) return DP_FAIL(DP_ERR_INVALID, "batch must be at least 1 row, got %d", rows);
  if (c->micro_batch < 0)
    return DP_FAIL(DP_ERR_INVALID, "micro-batch size must be >= 0, got %d", c->micro_batch);
  if (c->split != DP_SPLIT_CHUNK && c->split != DP_SPLIT_BALANCED && c->split != DP_SPLIT_MEMORY)
    return DP_FAIL(DP_ERR_INVALID, "unknown split policy %d", (int)c->split);
  int cnt[DP_MAX_DEVICES];
  *s = (dp_split_info){0};
  if (c->micro_batch > 0) {
    int m = c->micro_batch;
    s->n_mb = (int)(((long long)rows + m - 1) / m);
    for (int k = 0; k < s->n_mb; k++) {
      mbs[k].row0 = k * m;
      mbs[k].rows = rows - k * m < m ? rows - k * m : m;
    }
    deal(c->split, s->n_mb, N, first, cnt);
  } else {
    deal(c->split, rows, N, first, cnt);
    for (int d = 0, r = 0; d < N; d++) {
      if (!cnt[d]) continue;
      mbs[s->n_mb++] = (dp_mb){r, cnt[d]};
      r += cnt[d];
    }
    for (int d = 0; d < N; d++) cnt[d] = cnt[d] ? 1 : 0;
  }
  for (int k = 0; k < s->n_mb; k++)
    if (mbs[k].rows > s->mb_rows) s->mb_rows = mbs[k].rows;
  /* Devices with nothing sit at the end under both policies. */
  for (int d = 0, k = 0; d <= N; d++) {
    s->dev_mb0[d] = k;
    s->dev_row0[d] = k < s->n_mb ? mbs[k].row0 : rows;
    if (d < N) {
      k += cnt[d];
      if (cnt[d]) s->n_used = d + 1;
    }
  }
  return DP_OK;
}

/* Batches [rows, end] deal their items to the same number of devices; the
 * planner relies on a plan not shrinking as the batch grows inside such a run
 * (dp_plan_max_batch). chunk: ceil(I/N) items per device and u = ceil(I/per)
 * devices are both constant up to I = u * per; once per > N every I uses all N
 * devices (I/per > N - N/per > N - 1). balanced: fewer than N items use one
 * device each; from N on, all N. memory: device 0's share is at most
 * ceil(I/N), so from 2N items on all N devices have some. */
int dp__split_run_end(const dp_config *c, int rows) {
  int N = c->n_devices, I = dp__split_items(c, rows);
  long long m = c->micro_batch > 0 ? c->micro_batch : 1, end = LLONG_MAX;
  if (c->split == DP_SPLIT_CHUNK) {
    long long per = I / N + (I % N != 0);
    if (per <= N) end = per * (I / per + (I % per != 0));
  } else if (I < (c->split == DP_SPLIT_BALANCED ? N : 2 * N)) {
    end = I;
  }
  return end >= INT_MAX / m ? INT_MAX : (int)(end * m);
}
