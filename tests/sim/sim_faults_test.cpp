// The sim's fault models: report 000's silent pinned copies, the broken and the
// missing batched copy, and delayed completions.
#include <cmath>
#include <cstring>

#include "sim_fixture.hpp"

namespace ferry::testing {
namespace {

constexpr std::uint64_t kBlock = 64 * 1024;
constexpr std::uint64_t kLongAfterPinning = 1'000'000'000;  // 1 s of virtual time

SimFaults pinned_noop(double p) {
  SimFaults f;
  f.pinned_noop = p;
  return f;
}

class SimPinnedNoop : public SimTest {
 protected:
  // Copies src into the device at `base` and reports whether the bytes arrived.
  bool copy_lands(const std::byte* src) {
    EXPECT_TRUE(sim->enqueue(0, FillOp{{base, kBlock}, 0xdead}).ok());
    EXPECT_TRUE(sim->enqueue(0, CopyToDeviceOp{{base, kBlock}, src}).ok());
    const auto r = sim->synchronize();
    EXPECT_TRUE(r.ok());  // a swallowed copy still reports success
    std::vector<std::byte> want(kBlock);
    std::memcpy(want.data(), src, kBlock);
    return device_bytes(base, kBlock) == want;
  }
};

TEST_F(SimPinnedNoop, StalePinnedBuffersSwallowCopiesAndReportSuccess) {
  start(tiny_options(1, pinned_noop(1.0)));
  std::byte* buf = sim->allocate_pinned(kBlock).value();
  std::memcpy(buf, pattern(5, kBlock).data(), kBlock);
  std::vector<std::byte> pageable = pattern(5, kBlock);
  sim->advance(kLongAfterPinning);

  EXPECT_FALSE(copy_lands(buf));
  EXPECT_EQ(device_bytes(base, kBlock), pattern(0xdead, kBlock));  // destination unchanged
  EXPECT_EQ(sim->swallowed_copies(), 1u);
  // The host still reads the source fine, and pageable copies are never swallowed.
  EXPECT_EQ(std::memcmp(buf, pageable.data(), kBlock), 0);
  EXPECT_TRUE(copy_lands(pageable.data()));
  EXPECT_EQ(sim->swallowed_copies(), 1u);
  // Once stale, always stale, batched copies included.
  ASSERT_TRUE(sim->enqueue(0, BatchCopyToDeviceOp{{{{base, 100}, buf}, {{base + kBlock, 100}, buf}}}).ok());
  ASSERT_TRUE(sim->synchronize().ok());
  EXPECT_EQ(sim->swallowed_copies(), 3u);
  EXPECT_EQ(sim->illegal_accesses(), 0u);
  ASSERT_TRUE(sim->free_pinned(buf).ok());
}

TEST_F(SimPinnedNoop, RegisteredRangesGoStaleToo) {
  start(tiny_options(3, pinned_noop(1.0)));
  std::vector<std::byte> range = pattern(8, kBlock);
  ASSERT_TRUE(sim->register_host(range.data(), range.size()).ok());
  sim->advance(kLongAfterPinning);
  EXPECT_FALSE(copy_lands(range.data()));
  ASSERT_TRUE(sim->unregister_host(range.data()).ok());
  EXPECT_TRUE(copy_lands(range.data()));  // pageable again
}

TEST_F(SimPinnedNoop, ProbabilityZeroNeverSwallows) {
  start(tiny_options(1, pinned_noop(0.0)));
  std::byte* buf = sim->allocate_pinned(kBlock).value();
  std::memcpy(buf, pattern(5, kBlock).data(), kBlock);
  for (int i = 0; i < 20; ++i) {
    sim->advance(kLongAfterPinning);
    EXPECT_TRUE(copy_lands(buf));
  }
  EXPECT_EQ(sim->swallowed_copies(), 0u);
  ASSERT_TRUE(sim->free_pinned(buf).ok());
}

// Fraction of seeds for which one copy from a freshly pinned buffer is swallowed,
// after `churn` pin/unpin pairs and `delay_ns` between pinning and copying.
double swallow_rate(std::uint64_t churn, std::uint64_t delay_ns) {
  constexpr int kSeeds = 100;
  int swallowed = 0;
  for (int seed = 1; seed <= kSeeds; ++seed) {
    auto sim = make_sim_backend(tiny_options(static_cast<std::uint64_t>(seed), pinned_noop(1.0)));
    const std::uint64_t base = sim->reserve_address(kBlock).value();
    EXPECT_TRUE(sim->map(base, kBlock).ok());
    for (std::uint64_t i = 0; i < churn; ++i) EXPECT_TRUE(sim->free_pinned(sim->allocate_pinned(4096).value()).ok());
    std::byte* buf = sim->allocate_pinned(kBlock).value();
    sim->advance(delay_ns);
    EXPECT_TRUE(sim->enqueue(0, CopyToDeviceOp{{base, kBlock}, buf}).ok());
    EXPECT_TRUE(sim->synchronize().ok());
    swallowed += static_cast<int>(sim->swallowed_copies());
    EXPECT_TRUE(sim->free_pinned(buf).ok());
  }
  return swallowed / static_cast<double>(kSeeds);
}

TEST(SimPinnedNoopModel, DelayAfterPinningAndChurnMakeItWorse) {
  const double fresh = swallow_rate(0, 0);
  const double delayed = swallow_rate(0, 200'000);
  const double churned = swallow_rate(100, 0);
  const double both = swallow_rate(100, 200'000);
  EXPECT_LT(fresh, 0.10);
  EXPECT_GT(delayed, fresh + 0.15);
  EXPECT_GT(churned, fresh + 0.15);
  EXPECT_GT(both, std::max(delayed, churned));
}

TEST(SimPinnedNoopModel, AReallocatedBufferGetsAFreshDraw) {
  int fresh_ok = 0;
  constexpr int kSeeds = 50;
  for (int seed = 1; seed <= kSeeds; ++seed) {
    auto sim = make_sim_backend(tiny_options(static_cast<std::uint64_t>(seed), pinned_noop(1.0)));
    const std::uint64_t base = sim->reserve_address(kBlock).value();
    ASSERT_TRUE(sim->map(base, kBlock).ok());
    std::byte* old = sim->allocate_pinned(kBlock).value();
    sim->advance(kLongAfterPinning);
    ASSERT_TRUE(sim->enqueue(0, CopyToDeviceOp{{base, kBlock}, old}).ok());
    ASSERT_TRUE(sim->synchronize().ok());
    ASSERT_EQ(sim->swallowed_copies(), 1u);
    ASSERT_TRUE(sim->free_pinned(old).ok());
    std::byte* again = sim->allocate_pinned(kBlock).value();  // often the same address
    ASSERT_TRUE(sim->enqueue(0, CopyToDeviceOp{{base, kBlock}, again}).ok());
    ASSERT_TRUE(sim->synchronize().ok());
    fresh_ok += sim->swallowed_copies() == 1u ? 1 : 0;
    ASSERT_TRUE(sim->free_pinned(again).ok());
  }
  EXPECT_GE(fresh_ok, kSeeds * 8 / 10);
}

TEST(SimPinnedNoopModel, SameSeedSameVictims) {
  const auto victims = [](std::uint64_t seed) {
    auto sim = make_sim_backend(tiny_options(seed, pinned_noop(0.5)));
    const std::uint64_t base = sim->reserve_address(kBlock).value();
    EXPECT_TRUE(sim->map(base, kBlock).ok());
    std::vector<std::uint64_t> counts;
    for (int i = 0; i < 30; ++i) {
      std::byte* buf = sim->allocate_pinned(4096).value();
      sim->advance(100'000);
      EXPECT_TRUE(sim->enqueue(0, CopyToDeviceOp{{base, 4096}, buf}).ok());
      EXPECT_TRUE(sim->synchronize().ok());
      EXPECT_TRUE(sim->free_pinned(buf).ok());
      counts.push_back(sim->swallowed_copies());
    }
    return counts;
  };
  EXPECT_EQ(victims(9), victims(9));
  EXPECT_GT(victims(9).back(), 0u);
  EXPECT_LT(victims(9).back(), 30u);  // with P = 0.5 some buffers are spared
}

using SimBatch = SimTest;

BatchCopyToDeviceOp three_copies(std::uint64_t base, const std::vector<std::byte>& src) {
  return BatchCopyToDeviceOp{{{{base, 1000}, src.data()},
                              {{base + kBlock, 1000}, src.data() + 1000},
                              {{base + 2 * kBlock, 1000}, src.data() + 2000}}};
}

TEST_F(SimBatch, AWorkingBatchAppliesEveryCopy) {
  const std::vector<std::byte> src = pattern(4, 3000);
  ASSERT_TRUE(sim->enqueue(0, three_copies(base, src)).ok());
  ASSERT_TRUE(sim->synchronize().ok());
  for (std::uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(device_bytes(base + i * kBlock, 1000),
              std::vector<std::byte>(src.begin() + static_cast<std::ptrdiff_t>(i * 1000),
                                     src.begin() + static_cast<std::ptrdiff_t>(i * 1000 + 1000)));
  }
}

TEST_F(SimBatch, ABrokenBatchAppliesOnlyItsFirstCopy) {
  SimFaults f;
  f.batch_broken = true;
  start(tiny_options(1, f));
  EXPECT_TRUE(sim->info().batched_copy);  // the breakage is silent
  const std::vector<std::byte> src = pattern(4, 3000);
  ASSERT_TRUE(sim->enqueue(0, three_copies(base, src)).ok());
  ASSERT_TRUE(sim->synchronize().ok());
  EXPECT_EQ(device_bytes(base, 1000), std::vector<std::byte>(src.begin(), src.begin() + 1000));
  EXPECT_EQ(device_bytes(base + kBlock, 1000), zeros(1000));
  EXPECT_EQ(device_bytes(base + 2 * kBlock, 1000), zeros(1000));
  // Single copies are unaffected.
  ASSERT_TRUE(sim->enqueue(0, CopyToDeviceOp{{base + kBlock, 1000}, src.data() + 1000}).ok());
  ASSERT_TRUE(sim->synchronize().ok());
  EXPECT_EQ(device_bytes(base + kBlock, 1000),
            std::vector<std::byte>(src.begin() + 1000, src.begin() + 2000));
}

TEST_F(SimBatch, AMissingBatchIsUnsupported) {
  SimFaults f;
  f.batch_missing = true;
  start(tiny_options(1, f));
  EXPECT_FALSE(sim->info().batched_copy);
  const std::vector<std::byte> src = pattern(4, 3000);
  const auto r = sim->enqueue(0, three_copies(base, src));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::unsupported);
  EXPECT_EQ(sim->submitted(0), 0u);  // no ticket consumed
  EXPECT_EQ(sim->enqueue(0, CopyToDeviceOp{{base, 1000}, src.data()}).value_or(0), 1u);
}

TEST(SimDelays, CompletionDelaysStayWithinTheirBound) {
  const DeviceProfile p = *find_profile("tiny");
  const auto fill_ns = static_cast<std::uint64_t>(
      std::ceil(p.kernel_latency_ns + static_cast<double>(kBlock) / p.mem_bytes_per_s * 1e9));
  SimFaults f;
  f.max_completion_delay_ns = 10'000;
  bool delayed = false;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    auto sim = make_sim_backend(tiny_options(seed, f));
    const std::uint64_t base = sim->reserve_address(kBlock).value();
    ASSERT_TRUE(sim->map(base, kBlock).ok());
    ASSERT_TRUE(sim->enqueue(0, FillOp{{base, kBlock}, 1}).ok());
    ASSERT_TRUE(sim->synchronize().ok());
    EXPECT_GE(sim->now_ns(), fill_ns);
    EXPECT_LE(sim->now_ns(), fill_ns + f.max_completion_delay_ns);
    delayed = delayed || sim->now_ns() > fill_ns;
  }
  EXPECT_TRUE(delayed);
}

}  // namespace
}  // namespace ferry::testing
