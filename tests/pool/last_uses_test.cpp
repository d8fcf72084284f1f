// DevicePool::last_uses: what a reader of a block on another device must follow
// (I3; Runtime::copy_peer orders its pull after it): the latest lease of each
// stream, the old work of pending memory a block was placed over among them. On
// the sim, its streams held so that nothing completes.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "backend_fixture.hpp"
#include "ferry/device_pool.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t KiB = 1024;

std::vector<StreamPoint> sorted(const UseSet& uses) {
  std::vector<StreamPoint> v(uses.points().begin(), uses.points().end());
  std::sort(v.begin(), v.end(), [](StreamPoint a, StreamPoint b) { return a.stream < b.stream; });
  return v;
}

class LastUses : public ::testing::Test {
 protected:
  void SetUp() override {
    for (StreamId s : {0u, 1u, 2u}) sim->set_hold(s, true);
  }
  void TearDown() override {
    for (StreamId s : {0u, 1u, 2u}) sim->set_hold(s, false);
    EXPECT_TRUE(sim->synchronize().ok());
  }
  std::unique_ptr<Backend> sim = testing::make_backend("sim");
  StreamOrder order{*sim};
  DevicePool pool{order};
};

TEST_F(LastUses, AreTheLatestLeaseOfEachStream) {
  auto a = pool.allocate(64 * KiB, 0);
  auto out = pool.allocate(64 * KiB, 1);
  ASSERT_TRUE(a.ok() && out.ok());
  Result<UseSet> none = pool.last_uses(*a);
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_TRUE(none->empty()) << "a block nothing was enqueued on";

  ASSERT_TRUE(enqueue_fill(pool, 0, *a, 1).ok());
  auto second = enqueue_fill(pool, 0, *a, 2);
  const DeviceHandle in[] = {*a};
  auto read = enqueue_compute(pool, 1, in, *out);
  auto other = enqueue_fill(pool, 0, *out, 3);  // later work on stream 0, not on the block
  ASSERT_TRUE(second.ok() && read.ok() && other.ok());
  Result<UseSet> uses = pool.last_uses(*a);
  ASSERT_TRUE(uses.ok()) << uses.error().message;
  const std::vector<StreamPoint> expected = {{0, *second}, {1, *read}};
  EXPECT_EQ(sorted(*uses), expected);
  EXPECT_LT(*second, *other);
}

TEST_F(LastUses, IncludeTheWorkOfThePendingMemoryABlockWasPlacedOver) {
  auto a = pool.allocate(64 * KiB, 2);
  ASSERT_TRUE(a.ok());
  const std::uint64_t addr = pool.resolve(*a)->addr;
  auto filled = enqueue_fill(pool, 2, *a, 1);  // held: still pending at the free
  ASSERT_TRUE(filled.ok());
  ASSERT_TRUE(pool.free(*a).ok());
  auto b = pool.allocate(64 * KiB, 2);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(pool.resolve(*b)->addr, addr) << "the test needs the freed memory reused";
  Result<UseSet> uses = pool.last_uses(*b);
  ASSERT_TRUE(uses.ok()) << uses.error().message;
  const std::vector<StreamPoint> expected = {{2, *filled}};
  EXPECT_EQ(sorted(*uses), expected) << "the old fill, which a reader elsewhere must follow";
}

TEST_F(LastUses, OfAStaleHandleAreRefused) {
  auto a = pool.allocate(64 * KiB, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(pool.free(*a).ok());
  Result<UseSet> uses = pool.last_uses(*a);
  ASSERT_FALSE(uses.ok());
  EXPECT_EQ(uses.error().code, ErrorCode::stale_handle);
}

}  // namespace
}  // namespace ferry
