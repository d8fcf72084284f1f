// The backend fixture (tests/support/backend_fixture.hpp) skips a suite only when the
// machine lacks the backend; any other start-up error fails it, so a cuda backend
// that breaks on a GPU machine can never pass as "skipped".
#include "backend_fixture.hpp"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

namespace ferry {
namespace {

void require_after(const Error& e) {
  testing::last_backend_error() = e;
  std::unique_ptr<Backend> none;
  FERRY_REQUIRE_BACKEND(none, "cuda");
}

TEST(BackendFixture, SkipsOnlyWhenTheBackendIsUnsupported) {
  EXPECT_TRUE(testing::is_unavailable(make_error(ErrorCode::unsupported, "no CUDA device or driver found")));
  EXPECT_FALSE(testing::is_unavailable(make_error(ErrorCode::backend_error, "cudaHostAlloc failed")));
  EXPECT_FALSE(testing::is_unavailable(make_error(ErrorCode::out_of_memory, "cudaMalloc failed")));
}

TEST(BackendFixture, AStartUpErrorOtherThanUnsupportedFailsTheTest) {
  EXPECT_FATAL_FAILURE(require_after(make_error(ErrorCode::backend_error, "cudaHostAlloc of the result slots failed")),
                       "backend cuda failed to start (backend_error): cudaHostAlloc of the result slots");
}

// The real thing: on a machine without a GPU cuda is unavailable (a skip) and says why
// in words; where it starts, the fixture hands it out.
TEST(BackendFixture, CudaIsEitherMadeOrPlainlyUnavailable) {
  auto cuda = testing::make_backend("cuda");
  if (cuda) return;
  const Error& e = testing::last_backend_error();
  EXPECT_TRUE(testing::is_unavailable(e)) << to_string(e.code) << ": " << e.message;
  EXPECT_EQ(testing::backend_skip_reason("cuda"), e.message);
}

}  // namespace
}  // namespace ferry
