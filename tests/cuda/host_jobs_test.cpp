// The CUDA backend's host-function jobs (src/cuda/host_jobs.hpp), on the host: a job
// whose host function never runs (a sticky device error) is freed at teardown, not
// leaked. LeakSanitizer in the dev preset fails this test if one is lost.
#include "cuda/host_jobs.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>

namespace ferry {
namespace {

using cuda_detail::HostJobs;

TEST(CudaHostJobs, JobsThatNeverRanAreFreedAtTeardown) {
  std::array<std::uint8_t, 64> src{};
  std::array<std::uint8_t, 64> dst{};
  src.fill(7);
  HostJobs jobs;
  HostJobs::Job* ran = jobs.add(dst.data(), src.data(), 16);
  HostJobs::Job* refused = jobs.add(dst.data() + 16, src.data(), 16);
  (void)jobs.add(dst.data() + 32, src.data(), 16);  // queued behind a sticky error: never run
  (void)jobs.add(dst.data() + 48, src.data(), 16);
  EXPECT_EQ(jobs.pending(), 4u);

  HostJobs::run(ran);  // what the driver calls
  EXPECT_EQ(dst[0], 7);
  EXPECT_EQ(dst[15], 7);
  EXPECT_EQ(dst[16], 0);
  jobs.cancel(refused);  // cudaLaunchHostFunc failed
  EXPECT_EQ(jobs.pending(), 2u);

  EXPECT_EQ(jobs.release_all(), 2u);
  EXPECT_EQ(jobs.pending(), 0u);
  EXPECT_EQ(dst[32], 0);  // released, not run
}

}  // namespace
}  // namespace ferry
