// The CUDA backend's host-side copy jobs (src/cuda/host_jobs.hpp), on the host: the
// test thread plays the stream, calling the host functions in the order the stream
// would (gate, the DMA as a memcpy out of the staging buffer, finish), while the
// registry's worker fills the staging buffers. A job whose host function never runs
// (a sticky device error) is freed at teardown, not leaked: LeakSanitizer in the
// dev preset fails these tests if one is lost.
#include "cuda/host_jobs.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace ferry {
namespace {

using cuda_detail::HostJobs;

// The buffer is free again: the next upload into it (from `src`, 16 bytes) copies,
// passes its gate and finishes, and nothing is left pending.
void expect_the_next_upload_runs(HostJobs& jobs, HostJobs::Lane& lane, std::uint8_t* staging,
                                 const std::array<std::uint8_t, 16>& src) {
  HostJobs::Job* next = jobs.add_upload(lane, 0, staging, src.data(), 16);
  jobs.submit(next);
  HostJobs::gate(next);
  EXPECT_EQ(staging[0], src[0]);
  HostJobs::finish(next);
  EXPECT_EQ(jobs.pending(), 0u);
}

TEST(CudaHostJobs, JobsThatNeverRanAreFreedAtTeardown) {
  std::array<std::uint8_t, 64> src{};
  std::array<std::uint8_t, 64> dst{};
  std::array<std::uint8_t, 64> staging{};
  src.fill(7);
  HostJobs jobs;
  HostJobs::Job* ran = jobs.add_copy(dst.data(), src.data(), 16);
  HostJobs::Job* refused = jobs.add_copy(dst.data() + 16, src.data(), 16);
  (void)jobs.add_copy(dst.data() + 32, src.data(), 16);  // queued behind a sticky error: never run
  (void)jobs.add_copy(dst.data() + 48, src.data(), 16);
  HostJobs::Lane lane;
  (void)jobs.add_upload(lane, 0, staging.data(), src.data(), 16);  // its gate never ran
  EXPECT_EQ(jobs.pending(), 5u);

  HostJobs::run(ran);  // what the driver calls
  EXPECT_EQ(dst[0], 7);
  EXPECT_EQ(dst[15], 7);
  EXPECT_EQ(dst[16], 0);
  jobs.cancel(refused);  // cudaLaunchHostFunc failed
  EXPECT_EQ(jobs.pending(), 3u);

  EXPECT_EQ(jobs.release_all(), 3u);
  EXPECT_EQ(jobs.pending(), 0u);
  EXPECT_EQ(dst[32], 0);  // released, not run
}

TEST(CudaHostJobs, AnUploadChunkIsCopiedOnTheWorkerThreadWhileThePreviousChunksDmaRuns) {
  constexpr std::size_t kChunk = 4096;
  constexpr std::size_t kChunks = 7;
  std::vector<std::uint8_t> src(kChunk * kChunks);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 131 + i / kChunk);
  std::vector<std::uint8_t> device(src.size());
  std::array<std::vector<std::uint8_t>, 2> staging{std::vector<std::uint8_t>(kChunk),
                                                   std::vector<std::uint8_t>(kChunk)};
  HostJobs jobs;
  ASSERT_TRUE(jobs.start_worker());
  HostJobs::Lane lane;
  std::vector<HostJobs::Job*> chunk;
  for (std::size_t k = 0; k < kChunks; ++k) {  // the issue: every chunk enqueued at once
    chunk.push_back(jobs.add_upload(lane, k % 2, staging[k % 2].data(), src.data() + k * kChunk, kChunk));
    jobs.submit(chunk.back());
  }
  // The stream, with the gate of chunk k + 1 passed while the DMA of chunk k has not
  // finished: it returns only because the worker copied k + 1 into the other buffer
  // without waiting for that DMA (two buffers taking turns would hang here).
  HostJobs::gate(chunk[0]);
  for (std::size_t k = 0; k < kChunks; ++k) {
    if (k + 1 < kChunks) HostJobs::gate(chunk[k + 1]);
    std::memcpy(device.data() + k * kChunk, staging[k % 2].data(), kChunk);  // DMA k
    HostJobs::finish(chunk[k]);  // frees buffer k % 2 for chunk k + 2
  }
  EXPECT_EQ(device, src);  // no chunk was overwritten before its DMA read it
  EXPECT_EQ(jobs.pending(), 0u);
  EXPECT_EQ(lane.finished, (std::array<std::uint64_t, 2>{4, 3}));
}

TEST(CudaHostJobs, AnUploadWaitsForTheDownloadThatLastUsedItsBuffer) {
  std::array<std::uint8_t, 32> staging0{}, staging1{}, downloaded{}, up0{}, up1{};
  staging0.fill(1);  // what the download's DMA put there
  up0.fill(2);
  up1.fill(3);
  HostJobs jobs;
  ASSERT_TRUE(jobs.start_worker());
  HostJobs::Lane lane;
  HostJobs::Job* download = jobs.add_copy(downloaded.data(), staging0.data(), 32, &lane, 0);
  HostJobs::Job* first = jobs.add_upload(lane, 0, staging0.data(), up0.data(), 32);  // after the download
  HostJobs::Job* second = jobs.add_upload(lane, 1, staging1.data(), up1.data(), 32);  // free buffer
  jobs.submit(first);
  jobs.submit(second);
  // The worker has copied `second`, which it would not have reached before `first`
  // had it taken them in order; `first` must still wait for the download.
  HostJobs::gate(second);
  EXPECT_EQ(staging1[0], 3);
  HostJobs::run(download);  // the stream reaches the download's host function
  EXPECT_EQ(downloaded[0], 1) << "the upload overwrote the buffer before the download copied it out";
  EXPECT_EQ(downloaded[31], 1);
  HostJobs::gate(first);
  EXPECT_EQ(staging0[0], 2);
  HostJobs::finish(first);
  HostJobs::finish(second);
  EXPECT_EQ(jobs.pending(), 0u);
}

TEST(CudaHostJobs, AnUploadWhoseDmaNeverGotOnTheStreamStillOpensItsGate) {
  std::array<std::uint8_t, 16> staging{}, src{}, more{};
  src.fill(5);
  more.fill(6);
  HostJobs jobs;
  ASSERT_TRUE(jobs.start_worker());
  HostJobs::Lane lane;
  HostJobs::Job* failed = jobs.add_upload(lane, 0, staging.data(), src.data(), 16);
  jobs.submit(failed);          // right after its gate was enqueued
  jobs.end_on_copy(failed);     // its DMA could not be: perhaps before the worker copied
  HostJobs::gate(failed);
  // Its use of the buffer ended with the copy: the next upload of that buffer runs.
  expect_the_next_upload_runs(jobs, lane, staging.data(), more);
  // A gate that could not be enqueued gives its use back: the one after starts at once.
  HostJobs::Job* refused = jobs.add_upload(lane, 1, staging.data(), src.data(), 16);
  jobs.cancel(refused);
  HostJobs::Job* after = jobs.add_upload(lane, 1, staging.data(), src.data(), 16);
  jobs.submit(after);
  HostJobs::gate(after);
  HostJobs::finish(after);
  EXPECT_EQ(jobs.pending(), 0u);
}

TEST(CudaHostJobs, AnUploadCopiedOnTheWorkerThreadBeforeItsDmaFailedEndsWhenToldSo) {
  // submit() comes right after the gate is enqueued, so the worker may copy and the
  // stream pass the gate before the DMA's enqueue fails.
  std::array<std::uint8_t, 16> staging{}, src{}, more{};
  src.fill(5);
  more.fill(6);
  HostJobs jobs;
  ASSERT_TRUE(jobs.start_worker());
  HostJobs::Lane lane;
  HostJobs::Job* failed = jobs.add_upload(lane, 0, staging.data(), src.data(), 16);
  jobs.submit(failed);
  HostJobs::gate(failed);  // returns once copied
  EXPECT_EQ(staging[0], 5);
  EXPECT_EQ(lane.finished[0], 0u);  // no finish() and no end_on_copy yet: the buffer is still in use
  jobs.end_on_copy(failed);
  EXPECT_EQ(lane.finished[0], 1u);
  EXPECT_EQ(jobs.pending(), 0u);  // copied and gated: nothing else will free it
  expect_the_next_upload_runs(jobs, lane, staging.data(), more);
}

TEST(CudaHostJobs, AfterAbandonTheWorkerThreadReadsNoSourceAgain) {
  std::array<std::uint8_t, 16> staging{}, first_src{};
  first_src.fill(4);
  auto second_src = std::make_unique<std::array<std::uint8_t, 16>>();
  second_src->fill(9);
  HostJobs jobs;
  ASSERT_TRUE(jobs.start_worker());
  HostJobs::Lane lane;
  HostJobs::Job* first = jobs.add_upload(lane, 0, staging.data(), first_src.data(), 16);
  HostJobs::Job* second = jobs.add_upload(lane, 0, staging.data(), second_src->data(), 16);
  jobs.submit(first);
  jobs.submit(second);  // waits for first's finish()
  HostJobs::gate(first);
  EXPECT_EQ(staging[0], 4);
  jobs.abandon();       // the device faulted: the error is about to be returned
  second_src.reset();   // the caller frees its memory (AddressSanitizer: a read after this fails)
  HostJobs::finish(first);  // the buffer is free: a worker that still ran would copy `second` now
  HostJobs::gate(second);   // opens without its bytes instead of waiting for a copy
  EXPECT_EQ(staging[0], 4) << "the worker copied from the caller's memory after abandon()";
  // Abandoned jobs are not submitted again, and go at teardown.
  HostJobs::Job* late = jobs.add_upload(lane, 1, staging.data(), first_src.data(), 16);
  jobs.submit(late);
  HostJobs::gate(late);
  EXPECT_EQ(jobs.release_all(), 2u);
}

}  // namespace
}  // namespace ferry
