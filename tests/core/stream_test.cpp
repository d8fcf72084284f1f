// The one stream-range refusal (stream.hpp): every layer that takes a stream id refuses
// it with these words, so a user reads one message whichever call they made.
#include <gtest/gtest.h>

#include <string>

#include "ferry/stream.hpp"

namespace ferry {
namespace {

TEST(CheckStream, AcceptsEveryStreamBelowTheLimit) {
  for (StreamId s = 0; s < kMaxStreams; ++s) EXPECT_TRUE(check_stream(s, "x").ok()) << s;
}

TEST(CheckStream, RefusesTheFirstStreamPastTheLimitAndAHugeOneWithTheSameWords) {
  for (std::uint64_t s : {std::uint64_t{kMaxStreams}, std::uint64_t{1} << 40}) {
    Result<void> r = check_stream(s, "ferry_hold");
    ASSERT_FALSE(r.ok()) << s;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(r.error().message, "ferry_hold: stream " + std::to_string(s) + " is out of range (streams are 0.." +
                                     std::to_string(kMaxStreams - 1) + ")");
  }
}

}  // namespace
}  // namespace ferry
