/* Tests of dp__split: cutting a batch along dim 0 (torch.chunk and
 * torch.tensor_split semantics), fixed micro-batches dealt to devices in
 * contiguous blocks, and the invariants every split keeps. */
#include "core/backend.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "req.h"

typedef struct {
  dp_split_info s;
  dp_mb *mbs;
  int n_cap;
} split_result;

static dp_config cfg(int B, int N, int m, dp_split pol) {
  dp_config c = config_of(B, N, DP_OPT_SGD);
  c.micro_batch = m;
  c.split = pol;
  return c;
}

static split_result do_split(int B, int N, int m, dp_split pol) {
  dp_config c = cfg(B, N, m, pol);
  split_result r;
  r.n_cap = dp__split_max_mbs(&c);
  ck_assert_int_ge(r.n_cap, 1);
  r.mbs = malloc((size_t)r.n_cap * sizeof *r.mbs);
  ck_assert_ptr_nonnull(r.mbs);
  dp_status st = dp__split(&c, B, 0, &r.s, r.mbs);
  ck_assert_msg(st == DP_OK, "B=%d N=%d m=%d: %s", B, N, m, dp_last_error());
  ck_assert_int_le(r.s.n_mb, r.n_cap);
  return r;
}

/* Rows of device d. */
static int dev_rows(const split_result *r, int d) {
  int n = 0;
  for (int k = r->s.dev_mb0[d]; k < r->s.dev_mb0[d + 1]; k++) n += r->mbs[k].rows;
  return n;
}

/* Without a micro-batch size: device d has one micro-batch of want[d] rows
 * (0 = none), and exactly n_used devices have rows. */
static void expect_devices(int B, int N, dp_split pol, const int *want, int n_used) {
  split_result r = do_split(B, N, 0, pol);
  ck_assert_msg(r.s.n_used == n_used, "B=%d N=%d: n_used %d, want %d", B, N, r.s.n_used, n_used);
  ck_assert_int_eq(r.s.n_mb, n_used);
  int row = 0, mx = 0;
  for (int d = 0; d < N; d++) {
    int got = dev_rows(&r, d);
    ck_assert_msg(got == want[d], "B=%d N=%d: device %d has %d rows, want %d", B, N, d, got, want[d]);
    ck_assert_int_eq(r.s.dev_mb0[d + 1] - r.s.dev_mb0[d], want[d] ? 1 : 0);
    ck_assert_int_eq(r.s.dev_row0[d], row);
    if (want[d]) ck_assert_int_eq(r.mbs[r.s.dev_mb0[d]].row0, row);
    row += want[d];
    if (want[d] > mx) mx = want[d];
  }
  ck_assert_int_eq(row, B);
  ck_assert_int_eq(r.s.dev_row0[N], B);
  ck_assert_int_eq(r.s.mb_rows, mx);
  free(r.mbs);
}

/* ---- chunk (torch.chunk) ---- */

START_TEST(chunk_b30_n2_is_15_15) { expect_devices(30, 2, DP_SPLIT_CHUNK, (int[]){15, 15}, 2); }
END_TEST

START_TEST(chunk_b31_n2_is_16_15) { expect_devices(31, 2, DP_SPLIT_CHUNK, (int[]){16, 15}, 2); }
END_TEST

START_TEST(chunk_b3_n4_uses_three_devices) {
  expect_devices(3, 4, DP_SPLIT_CHUNK, (int[]){1, 1, 1, 0}, 3);
}
END_TEST

START_TEST(chunk_b5_n4_is_2_2_1) { expect_devices(5, 4, DP_SPLIT_CHUNK, (int[]){2, 2, 1, 0}, 3); }
END_TEST

START_TEST(chunk_b6_n4_is_2_2_2) { expect_devices(6, 4, DP_SPLIT_CHUNK, (int[]){2, 2, 2, 0}, 3); }
END_TEST

START_TEST(chunk_b36_n7_is_six_chunks_of_6) {
  expect_devices(36, 7, DP_SPLIT_CHUNK, (int[]){6, 6, 6, 6, 6, 6, 0}, 6);
}
END_TEST

START_TEST(chunk_single_device_takes_everything) {
  expect_devices(17, 1, DP_SPLIT_CHUNK, (int[]){17}, 1);
  expect_devices(1, 1, DP_SPLIT_CHUNK, (int[]){1}, 1);
}
END_TEST

START_TEST(chunk_one_row_uses_one_device) {
  expect_devices(1, 8, DP_SPLIT_CHUNK, (int[]){1, 0, 0, 0, 0, 0, 0, 0}, 1);
}
END_TEST

/* ---- balanced (torch.tensor_split) ---- */

START_TEST(balanced_b31_n2_is_16_15) {
  expect_devices(31, 2, DP_SPLIT_BALANCED, (int[]){16, 15}, 2);
}
END_TEST

START_TEST(balanced_b5_n4_is_2_1_1_1) {
  expect_devices(5, 4, DP_SPLIT_BALANCED, (int[]){2, 1, 1, 1}, 4);
}
END_TEST

START_TEST(balanced_b3_n4_is_1_1_1) {
  expect_devices(3, 4, DP_SPLIT_BALANCED, (int[]){1, 1, 1, 0}, 3);
}
END_TEST

START_TEST(balanced_b36_n7_is_6_then_5s) {
  expect_devices(36, 7, DP_SPLIT_BALANCED, (int[]){6, 5, 5, 5, 5, 5, 5}, 7);
}
END_TEST

START_TEST(balanced_even_batch_matches_chunk) {
  expect_devices(30, 2, DP_SPLIT_BALANCED, (int[]){15, 15}, 2);
  expect_devices(32, 4, DP_SPLIT_BALANCED, (int[]){8, 8, 8, 8}, 4);
}
END_TEST

/* ---- fixed micro-batches ---- */

START_TEST(micro_batch_b64_m8_n4_gives_two_per_device) {
  split_result r = do_split(64, 4, 8, DP_SPLIT_CHUNK);
  ck_assert_int_eq(r.s.n_mb, 8);
  ck_assert_int_eq(r.s.mb_rows, 8);
  ck_assert_int_eq(r.s.n_used, 4);
  for (int k = 0; k < 8; k++) {
    ck_assert_int_eq(r.mbs[k].row0, 8 * k);
    ck_assert_int_eq(r.mbs[k].rows, 8);
  }
  for (int d = 0; d <= 4; d++) {
    ck_assert_int_eq(r.s.dev_mb0[d], 2 * d);
    ck_assert_int_eq(r.s.dev_row0[d], 16 * d);
  }
  free(r.mbs);
}
END_TEST

START_TEST(micro_batch_last_one_may_be_short) {
  split_result r = do_split(30, 2, 8, DP_SPLIT_CHUNK); /* 8 8 8 6 -> 2 + 2 */
  ck_assert_int_eq(r.s.n_mb, 4);
  ck_assert_int_eq(r.mbs[3].row0, 24);
  ck_assert_int_eq(r.mbs[3].rows, 6);
  ck_assert_int_eq(r.s.dev_mb0[1], 2);
  ck_assert_int_eq(dev_rows(&r, 0), 16);
  ck_assert_int_eq(dev_rows(&r, 1), 14);
  free(r.mbs);
}
END_TEST

START_TEST(micro_batch_dealing_follows_the_policy) {
  /* 5 micro-batches on 4 devices: chunk 2,2,1,0; balanced 2,1,1,1 */
  split_result r = do_split(10, 4, 2, DP_SPLIT_CHUNK);
  int want_c[] = {0, 2, 4, 5, 5};
  for (int d = 0; d <= 4; d++) ck_assert_int_eq(r.s.dev_mb0[d], want_c[d]);
  ck_assert_int_eq(r.s.n_used, 3);
  ck_assert_int_eq(r.s.dev_row0[3], 10);
  free(r.mbs);
  r = do_split(10, 4, 2, DP_SPLIT_BALANCED);
  int want_b[] = {0, 2, 3, 4, 5};
  for (int d = 0; d <= 4; d++) ck_assert_int_eq(r.s.dev_mb0[d], want_b[d]);
  ck_assert_int_eq(r.s.n_used, 4);
  free(r.mbs);
}
END_TEST

START_TEST(micro_batch_larger_than_the_batch_is_one_micro_batch) {
  split_result r = do_split(5, 4, 64, DP_SPLIT_BALANCED);
  ck_assert_int_eq(r.s.n_mb, 1);
  ck_assert_int_eq(r.mbs[0].rows, 5);
  ck_assert_int_eq(r.s.n_used, 1);
  ck_assert_int_eq(r.s.mb_rows, 5);
  free(r.mbs);
}
END_TEST

START_TEST(micro_batches_do_not_depend_on_the_device_count) {
  /* the cut points are a function of (B, m) only */
  split_result a = do_split(37, 1, 4, DP_SPLIT_CHUNK);
  for (int N = 2; N <= 12; N++)
    for (int pol = 0; pol < 2; pol++) {
      split_result b = do_split(37, N, 4, (dp_split)pol);
      ck_assert_int_eq(a.s.n_mb, b.s.n_mb);
      ck_assert_int_eq(memcmp(a.mbs, b.mbs, (size_t)a.s.n_mb * sizeof *a.mbs), 0);
      free(b.mbs);
    }
  free(a.mbs);
}
END_TEST

/* ---- invariants ---- */

static uint64_t rng_state;
static uint32_t rnd(uint32_t n) { /* xorshift64*, uniform enough for tests */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32) % n;
}

static void check_invariants(int B, int N, int m, dp_split pol) {
  split_result r = do_split(B, N, m, pol);
  const dp_split_info *s = &r.s;
  /* rows cover [0, B) exactly once, in order, with no empty micro-batch */
  int row = 0, mx = 0;
  for (int k = 0; k < s->n_mb; k++) {
    REQ(r.mbs[k].row0 == row, "B=%d N=%d m=%d pol=%d: mb %d starts at %d, want %d", B, N,
                  m, pol, k, r.mbs[k].row0, row);
    REQ(r.mbs[k].rows > 0, "B=%d N=%d m=%d pol=%d: mb %d is empty", B, N, m, pol, k);
    if (m > 0) REQ_LE(r.mbs[k].rows, m);
    if (m > 0 && k < s->n_mb - 1) REQ_EQ(r.mbs[k].rows, m);
    row += r.mbs[k].rows;
    if (r.mbs[k].rows > mx) mx = r.mbs[k].rows;
  }
  REQ(row == B, "B=%d N=%d m=%d pol=%d: rows sum to %d", B, N, m, pol, row);
  REQ_EQ(s->mb_rows, mx);
  if (m > 0) REQ_EQ(s->n_mb, (int)(((long long)B + m - 1) / m));
  else REQ_EQ(s->n_mb, s->n_used);
  /* devices own contiguous, monotone blocks; used devices form a prefix */
  REQ_EQ(s->dev_mb0[0], 0);
  REQ_EQ(s->dev_mb0[N], s->n_mb);
  REQ_GE(s->n_used, 1);
  REQ_LE(s->n_used, N);
  int cnt[DP_MAX_DEVICES];
  for (int d = 0; d < N; d++) {
    cnt[d] = s->dev_mb0[d + 1] - s->dev_mb0[d];
    REQ(cnt[d] >= 0, "B=%d N=%d m=%d pol=%d: dev_mb0 decreases at %d", B, N, m, pol, d);
    REQ((cnt[d] > 0) == (d < s->n_used), "B=%d N=%d m=%d pol=%d: device %d", B, N, m, pol,
                  d);
    int want_row0 = s->dev_mb0[d] < s->n_mb ? r.mbs[s->dev_mb0[d]].row0 : B;
    REQ_EQ(s->dev_row0[d], want_row0);
  }
  REQ_EQ(s->dev_row0[N], B);
  /* the dealing policy over items (rows, or micro-batches) */
  int items = m > 0 ? s->n_mb : B;
  for (int d = 0; d < N; d++) {
    int got = m > 0 ? cnt[d] : dev_rows(&r, d), want;
    if (pol == DP_SPLIT_BALANCED) {
      want = items / N + (d < items % N);
    } else {
      long long per = ((long long)items + N - 1) / N, left = items - d * per;
      want = left <= 0 ? 0 : left < per ? (int)left : (int)per;
    }
    REQ(got == want, "B=%d N=%d m=%d pol=%d: device %d has %d, want %d", B, N, m, pol, d,
                  got, want);
  }
  free(r.mbs);
}

START_TEST(every_split_covers_the_batch_in_order) {
  for (int B = 1; B <= 70; B++)
    for (int N = 1; N <= 9; N++)
      for (int m = 0; m <= 9; m++)
        for (int pol = 0; pol < 2; pol++) check_invariants(B, N, m, (dp_split)pol);
}
END_TEST

START_TEST(random_splits_keep_the_invariants) {
  rng_state = 0x9E3779B97F4A7C15ull;
  for (int it = 0; it < 3000; it++) {
    int B = 1 + (int)rnd(it % 3 ? 600 : 100000);
    int N = 1 + (int)rnd(DP_MAX_DEVICES);
    int m = rnd(3) == 0 ? 0 : 1 + (int)rnd(it % 2 ? 64 : (uint32_t)B + 8);
    check_invariants(B, N, m, (dp_split)rnd(2));
  }
  check_invariants(64, DP_MAX_DEVICES, 0, DP_SPLIT_CHUNK);
  check_invariants(63, DP_MAX_DEVICES, 1, DP_SPLIT_BALANCED);
  check_invariants(1000000, DP_MAX_DEVICES, 0, DP_SPLIT_CHUNK);
}
END_TEST

START_TEST(huge_batches_split_without_overflow) {
  check_invariants(2147483647, 2, 0, DP_SPLIT_CHUNK);
  check_invariants(2147483647, 64, 0, DP_SPLIT_BALANCED);
  check_invariants(2147483647, 7, 1 << 28, DP_SPLIT_CHUNK);
  check_invariants(2147483647, 3, 2147483647, DP_SPLIT_BALANCED);
  check_invariants(2147483647, 3, 2147483646, DP_SPLIT_CHUNK);
}
END_TEST

START_TEST(max_mbs_bounds_every_split) {
  for (int B = 1; B <= 40; B++)
    for (int N = 1; N <= 6; N++)
      for (int m = 0; m <= 5; m++) {
        dp_config c = cfg(B, N, m, DP_SPLIT_CHUNK);
        int want = m > 0 ? (B + m - 1) / m : (N < B ? N : B);
        ck_assert_int_eq(dp__split_max_mbs(&c), want);
      }
}
END_TEST

/* ---- errors ---- */

static void split_bad(dp_config c, int rows, const char *needle) {
  dp_split_info s;
  dp_mb mbs[128];
  ck_assert_int_eq(dp__split(&c, rows, 0, &s, mbs), DP_ERR_INVALID);
  ck_assert_msg(strstr(dp_last_error(), needle) != NULL, "'%s' lacks '%s'", dp_last_error(), needle);
}

START_TEST(split_refuses_bad_arguments) {
  split_bad(cfg(8, 0, 0, DP_SPLIT_CHUNK), 8, "device count 0");
  split_bad(cfg(8, -1, 0, DP_SPLIT_CHUNK), 8, "device count -1");
  split_bad(cfg(8, DP_MAX_DEVICES + 1, 0, DP_SPLIT_CHUNK), 8, "device count 65");
  split_bad(cfg(8, 2, 0, DP_SPLIT_CHUNK), 0, "at least 1 row");
  split_bad(cfg(8, 2, 0, DP_SPLIT_CHUNK), -5, "at least 1 row");
  split_bad(cfg(8, 2, -1, DP_SPLIT_CHUNK), 8, "micro-batch");
  split_bad(cfg(8, 2, 0, (dp_split)7), 8, "split policy 7");
}
END_TEST

Suite *split_suite(void) {
  Suite *s = suite_create("split");
  TCase *tc = tcase_create("chunk");
  tcase_add_test(tc, chunk_b30_n2_is_15_15);
  tcase_add_test(tc, chunk_b31_n2_is_16_15);
  tcase_add_test(tc, chunk_b3_n4_uses_three_devices);
  tcase_add_test(tc, chunk_b5_n4_is_2_2_1);
  tcase_add_test(tc, chunk_b6_n4_is_2_2_2);
  tcase_add_test(tc, chunk_b36_n7_is_six_chunks_of_6);
  tcase_add_test(tc, chunk_single_device_takes_everything);
  tcase_add_test(tc, chunk_one_row_uses_one_device);
  suite_add_tcase(s, tc);

  tc = tcase_create("balanced");
  tcase_add_test(tc, balanced_b31_n2_is_16_15);
  tcase_add_test(tc, balanced_b5_n4_is_2_1_1_1);
  tcase_add_test(tc, balanced_b3_n4_is_1_1_1);
  tcase_add_test(tc, balanced_b36_n7_is_6_then_5s);
  tcase_add_test(tc, balanced_even_batch_matches_chunk);
  suite_add_tcase(s, tc);

  tc = tcase_create("micro_batch");
  tcase_add_test(tc, micro_batch_b64_m8_n4_gives_two_per_device);
  tcase_add_test(tc, micro_batch_last_one_may_be_short);
  tcase_add_test(tc, micro_batch_dealing_follows_the_policy);
  tcase_add_test(tc, micro_batch_larger_than_the_batch_is_one_micro_batch);
  tcase_add_test(tc, micro_batches_do_not_depend_on_the_device_count);
  suite_add_tcase(s, tc);

  tc = tcase_create("invariants");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, every_split_covers_the_batch_in_order);
  tcase_add_test(tc, random_splits_keep_the_invariants);
  tcase_add_test(tc, huge_batches_split_without_overflow);
  tcase_add_test(tc, max_mbs_bounds_every_split);
  suite_add_tcase(s, tc);

  tc = tcase_create("errors");
  tcase_add_test(tc, split_refuses_bad_arguments);
  suite_add_tcase(s, tc);
  return s;
}
