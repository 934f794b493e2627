// The status assertion of every GoogleTest suite: fails the test (and
// returns) unless expr is DT_OK, printing the call, the status,
// dt_last_error() and where it arose.
#ifndef DT_TESTS_DT_ASSERT_H
#define DT_TESTS_DT_ASSERT_H

#include <gtest/gtest.h>

#include "core/status.h"

#define ASSERT_DT_OK(expr)                                                                         \
  do {                                                                                             \
    dt_status s_ = (expr);                                                                         \
    ASSERT_EQ(s_, DT_OK) << #expr << ": " << dt_status_name(s_) << ": " << dt_last_error() << " [" \
                         << dt_last_error_location() << "]";                                       \
  } while (0)

#endif
