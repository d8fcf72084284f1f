/* The C tests' checks: CHECK counts a failed condition and prints it with
 * ferry_last_error(); each test's main returns failures != 0. */
#ifndef FERRY_TESTS_C_CHECK_H
#define FERRY_TESTS_C_CHECK_H

#include <stdio.h>

#include "ferry/ferry.h"

static int failures = 0;
#define CHECK(cond)                                                                \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__,       \
              __LINE__, #cond, ferry_last_error());                                \
      ++failures;                                                                  \
    }                                                                              \
  } while (0)
#define OK(call) CHECK((call) == FERRY_OK)

#endif
