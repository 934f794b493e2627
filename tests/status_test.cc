// Errors as values (core/status.h): the message is for users, where it
// arose is kept apart (dtrain prints it with DT_DEBUG=1).
#include "core/status.h"

#include <gtest/gtest.h>

#include <string>

namespace {

dt_status FailHere() { return DT_ERROR(DT_ERR_INVALID_ARG, "bad value %d: use 1..3", 7); }

TEST(Status, MessageAndLocationAreApart) {
  dt_clear_error();
  EXPECT_STREQ(dt_last_error(), "");
  EXPECT_STREQ(dt_last_error_location(), "");
  EXPECT_EQ(DT_ERR_INVALID_ARG, FailHere());
  EXPECT_STREQ(dt_last_error(), "bad value 7: use 1..3");
  std::string where = dt_last_error_location();
  EXPECT_EQ(where.rfind("FailHere status_test.cc:", 0), 0u) << where;
}

TEST(Status, WrapKeepsTheLocation) {
  FailHere();
  std::string where = dt_last_error_location();
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_error_wrap(DT_ERR_INVALID_ARG, "reading %s", "x.idx"));
  EXPECT_STREQ(dt_last_error(), "reading x.idx: bad value 7: use 1..3");
  EXPECT_EQ(where, dt_last_error_location());
}

TEST(Status, TheLastMessageMayBeAnArgument) {
  FailHere();
  EXPECT_EQ(DT_ERR_STATE, DT_ERROR(DT_ERR_STATE, "step 3 failed (%s)", dt_last_error()));
  EXPECT_STREQ(dt_last_error(), "step 3 failed (bad value 7: use 1..3)");
}

TEST(Status, ClearForgetsBoth) {
  FailHere();
  dt_clear_error();
  EXPECT_STREQ(dt_last_error(), "");
  EXPECT_STREQ(dt_last_error_location(), "");
}

}  // namespace
