#include "ferry/result.hpp"

#include <gtest/gtest.h>

#include <string>

namespace ferry {
namespace {

Result<std::string> failed() {
  return make_error(ErrorCode::timeout, "wait for stream 1 ticket 3: not complete after 30 s");
}

TEST(ResultDeathTest, ValueOfAnErrorTerminatesWithTheErrorsMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Result<std::string> r = failed();
  EXPECT_DEATH((void)r.value(), "Result::value\\(\\) on an error: timeout: wait for stream 1 ticket 3");
  EXPECT_DEATH((void)failed().value(), "on an error: timeout: wait for stream 1 ticket 3");
  EXPECT_DEATH((void)r->size(), "on an error: timeout");
}

TEST(ResultDeathTest, ErrorOfAValueTerminatesSayingSo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Result<int> r = 7;
  EXPECT_DEATH((void)r.error(), "Result::error\\(\\) on a result that holds no error");
  Result<void> done;
  EXPECT_DEATH((void)done.error(), "Result::error\\(\\) on a result that holds no error");
}

TEST(Result, ValueAndErrorReadWhatTheyHold) {
  Result<std::string> ok = std::string("bytes");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.value(), "bytes");
  EXPECT_EQ(ok->size(), 5u);
  Result<std::string> bad = failed();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::timeout);
  EXPECT_EQ(bad.value_or("fallback"), "fallback");
}

}  // namespace
}  // namespace ferry
