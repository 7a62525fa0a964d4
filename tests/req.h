/* Fast assertions for the test suites (header only). */
#ifndef DP_TEST_REQ_H
#define DP_TEST_REQ_H

#include <check.h>

/* Assertions for hot loops: Check's ck_assert_* talk to the parent process on
 * every pass, these only when they fail. */
#define REQ(expr, ...)                                                                   \
  do {                                                                                   \
    if (!(expr)) ck_assert_msg(expr, __VA_ARGS__);                                       \
  } while (0)
#define REQ1(expr)                                                                       \
  do {                                                                                   \
    if (!(expr)) ck_assert(expr);                                                        \
  } while (0)
#define REQ_CMP(a, op, b)                                                                \
  do {                                                                                   \
    long long a_ = (long long)(a), b_ = (long long)(b);                                  \
    if (!(a_ op b_))                                                                     \
      ck_assert_msg(a_ op b_, "%s %s %s: %lld vs %lld", #a, #op, #b, a_, b_);            \
  } while (0)
#define REQ_EQ(a, b) REQ_CMP(a, ==, b)
#define REQ_NE(a, b) REQ_CMP(a, !=, b)
#define REQ_LT(a, b) REQ_CMP(a, <, b)
#define REQ_LE(a, b) REQ_CMP(a, <=, b)
#define REQ_GT(a, b) REQ_CMP(a, >, b)
#define REQ_GE(a, b) REQ_CMP(a, >=, b)

#endif
