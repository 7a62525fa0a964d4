/* CUDA backend: device queries and arena allocation.
 *
 * The "gpu" test case needs a GPU. Where dp_cuda_device_count() is 0 (no GPU,
 * no driver, or a build without CUDA) each of its tests prints
 *   SKIP cuda: <test>: no GPU (<reason>)
 * to stderr and passes; CK_EXCLUDE_TAGS=gpu leaves them out altogether.
 * CUDA is touched only inside tests, which Check runs in forked children. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_cuda.h"

#define MIB ((size_t)1 << 20)

/* Number of GPUs, or 0 after printing the visible skip line. */
static int gpus_or_skip(const char *test) {
  int n = dp_cuda_device_count();
  if (n > 0) return n;
  fprintf(stderr, "SKIP cuda: %s: no GPU (%s)\n", test, dp_last_error());
  return 0;
}

#define REQUIRE_GPUS(n, test)                                                              \
  int n = gpus_or_skip(test);                                                              \
  if (n == 0) return

/* ---- everywhere ---- */

START_TEST(device_count_never_fails_hard) {
  int n = dp_cuda_device_count();
  ck_assert_int_ge(n, 0);
  if (n == 0) ck_assert_msg(dp_last_error()[0] != '\0', "no GPU, yet no reason recorded");
  ck_assert_int_eq(dp_cuda_device_count(), n); /* stable across calls */
}
END_TEST

START_TEST(availability_matches_build) {
#ifdef DP_HAVE_CUDA
  ck_assert_int_eq(dp_cuda_available(), 1);
#else
  ck_assert_int_eq(dp_cuda_available(), 0);
  ck_assert_int_eq(dp_cuda_device_count(), 0);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "built without CUDA"));
#endif
}
END_TEST

START_TEST(without_cuda_everything_is_unsupported) {
  if (dp_cuda_available()) return; /* the CUDA build's behaviour is tested below */
  void *p = &p;
  ck_assert_int_eq(dp__cuda_arena_alloc(0, MIB, &p), DP_ERR_UNSUPPORTED);
  ck_assert_ptr_null(p);
  ck_assert_ptr_nonnull(strstr(dp_last_error(), "built without CUDA"));
  p = &p;
  ck_assert_int_eq(dp__cuda_host_alloc(MIB, &p), DP_ERR_UNSUPPORTED);
  ck_assert_ptr_null(p);
  size_t total = 0;
  ck_assert_int_eq(dp__cuda_device_info(0, NULL, 0, &total, NULL, NULL, NULL),
                   DP_ERR_UNSUPPORTED);
  dp__cuda_arena_free(0, NULL);
  dp__cuda_host_free(NULL);
}
END_TEST

/* ---- with a GPU ---- */

START_TEST(device_info_describes_each_gpu) {
  REQUIRE_GPUS(n, "device_info_describes_each_gpu");
  for (int dev = 0; dev < n; dev++) {
    char name[256] = "";
    size_t total = 0, free_b = 0;
    int major = -1, minor = -1;
    ck_assert_msg(dp__cuda_device_info(dev, name, sizeof name, &total, &free_b, &major,
                                       &minor) == DP_OK,
                  "device %d: %s", dev, dp_last_error());
    fprintf(stderr, "cuda device %d: %s, sm_%d%d, %zu of %zu bytes free\n", dev, name,
            major, minor, free_b, total);
    ck_assert_str_ne(name, "");
    ck_assert_uint_gt(total, 0);
    ck_assert_uint_gt(free_b, 0);
    ck_assert_uint_le(free_b, total);
    ck_assert_int_ge(major, 3);
    ck_assert_int_ge(minor, 0);
    /* every output is optional; a short name buffer is cut, not overrun */
    char small[4] = "xxx";
    ck_assert_int_eq(dp__cuda_device_info(dev, small, sizeof small, NULL, NULL, NULL, NULL),
                     DP_OK);
    ck_assert_uint_le(strlen(small), 3);
  }
}
END_TEST

START_TEST(device_info_rejects_bad_device) {
  REQUIRE_GPUS(n, "device_info_rejects_bad_device");
  ck_assert_int_eq(dp__cuda_device_info(n, NULL, 0, NULL, NULL, NULL, NULL),
                   DP_ERR_INVALID);
  ck_assert_int_eq(dp__cuda_device_info(-1, NULL, 0, NULL, NULL, NULL, NULL),
                   DP_ERR_INVALID);
  void *p = &p;
  ck_assert_int_eq(dp__cuda_arena_alloc(n, MIB, &p), DP_ERR_INVALID);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(dp__cuda_arena_alloc(0, MIB, NULL), DP_ERR_INVALID);
}
END_TEST

START_TEST(arena_of_one_mib_allocates_and_frees) {
  REQUIRE_GPUS(n, "arena_of_one_mib_allocates_and_frees");
  for (int dev = 0; dev < n; dev++) {
    void *p = NULL;
    ck_assert_msg(dp__cuda_arena_alloc(dev, MIB, &p) == DP_OK, "device %d: %s", dev,
                  dp_last_error());
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq((uintptr_t)p % 256, 0);
    dp__cuda_arena_free(dev, p);
  }
  void *p = &p;
  ck_assert_int_eq(dp__cuda_arena_alloc(0, 0, &p), DP_OK); /* empty arena: no allocation */
  ck_assert_ptr_null(p);
  dp__cuda_arena_free(0, NULL);
}
END_TEST

START_TEST(arena_larger_than_free_memory_is_refused) {
  REQUIRE_GPUS(n, "arena_larger_than_free_memory_is_refused");
  int dev = n - 1;
  size_t total = 0, free_b = 0;
  ck_assert_int_eq(dp__cuda_device_info(dev, NULL, 0, &total, &free_b, NULL, NULL), DP_OK);
  size_t want = free_b + 64 * MIB; /* free memory only shrinks while the process runs */
  void *p = &p;
  ck_assert_int_eq(dp__cuda_arena_alloc(dev, want, &p), DP_ERR_NOMEM);
  ck_assert_ptr_null(p);
  const char *msg = dp_last_error();
  char expect[64];
  snprintf(expect, sizeof expect, "device %d", dev);
  ck_assert_msg(strstr(msg, expect) != NULL, "no '%s' in: %s", expect, msg);
  snprintf(expect, sizeof expect, "%zu bytes", want);
  ck_assert_msg(strstr(msg, expect) != NULL, "no '%s' in: %s", expect, msg);
  ck_assert_msg(strstr(msg, "free") != NULL, "no free byte count in: %s", msg);
  /* the refusal leaves the device usable */
  ck_assert_int_eq(dp__cuda_arena_alloc(dev, MIB, &p), DP_OK);
  dp__cuda_arena_free(dev, p);
}
END_TEST

START_TEST(pinned_host_staging_allocates_and_frees) {
  REQUIRE_GPUS(n, "pinned_host_staging_allocates_and_frees");
  (void)n;
  void *p = NULL;
  ck_assert_msg(dp__cuda_host_alloc(MIB, &p) == DP_OK, "%s", dp_last_error());
  ck_assert_ptr_nonnull(p);
  memset(p, 0xab, MIB); /* host-visible */
  ck_assert_uint_eq(((unsigned char *)p)[MIB - 1], 0xab);
  dp__cuda_host_free(p);
  ck_assert_int_eq(dp__cuda_host_alloc(0, &p), DP_OK);
  ck_assert_ptr_null(p);
}
END_TEST

Suite *cuda_suite(void) {
  Suite *s = suite_create("cuda");

  TCase *any = tcase_create("any_machine");
  tcase_add_test(any, device_count_never_fails_hard);
  tcase_add_test(any, availability_matches_build);
  tcase_add_test(any, without_cuda_everything_is_unsupported);
  tcase_set_timeout(any, 60); /* CUDA runtime start-up, driver probing */
  suite_add_tcase(s, any);

  TCase *gpu = tcase_create("gpu");
  tcase_set_tags(gpu, "gpu");
  tcase_add_test(gpu, device_info_describes_each_gpu);
  tcase_add_test(gpu, device_info_rejects_bad_device);
  tcase_add_test(gpu, arena_of_one_mib_allocates_and_frees);
  tcase_add_test(gpu, arena_larger_than_free_memory_is_refused);
  tcase_add_test(gpu, pinned_host_staging_allocates_and_frees);
  tcase_set_timeout(gpu, 120); /* first context creation on every device */
  suite_add_tcase(s, gpu);
  return s;
}
