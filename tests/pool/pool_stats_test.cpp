// The pool's statistics and the end of its reclaim ladder, on the sim (tiny
// profile: 64 KiB granules): every figure followed through a block's life (live,
// pending, cached, trimmed), every view of it agreeing (stats, snapshot, segments),
// and an out-of-memory answer that changes nothing but its own counters.
#include "ferry/device_pool.hpp"

#include <gtest/gtest.h>

#include "backend_fixture.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t kGranule = 64 * KiB;

struct Views {
  std::uint64_t mapped = 0, cached = 0, live = 0, pending = 0;
};

// What the snapshot and the segments say, to hold against stats().
Views views(const DevicePool& p) {
  Views v;
  for (const SegmentInfo& s : p.segments()) {
    v.mapped += s.mapped_bytes;
    v.cached += s.cached_bytes;
  }
  for (const BlockInfo& b : p.snapshot()) {
    if (b.state == BlockInfo::State::live) v.live += b.bytes;
    if (b.state == BlockInfo::State::pending_free) v.pending += b.bytes;
  }
  return v;
}

void expect_agree(const DevicePool& p) {
  const PoolStats s = p.stats();
  const Views v = views(p);
  EXPECT_EQ(v.mapped, s.reserved_bytes);
  EXPECT_EQ(v.cached, s.cached_bytes);
  EXPECT_EQ(v.pending, s.pending_free_bytes);
  EXPECT_EQ(s.active_bytes, s.allocated_bytes + s.pending_free_bytes);
  EXPECT_LE(s.allocated_bytes + s.pending_free_bytes, s.reserved_bytes);
  std::string why;
  EXPECT_TRUE(p.validate(&why)) << why;
}

class PoolStatsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> sim = testing::make_backend("sim");
  StreamOrder order{*sim};
};

TEST_F(PoolStatsTest, EveryFigureFollowsABlockFromLiveThroughPendingToCachedAndTrimmed) {
  PoolOptions o;
  o.capacity = 16 * kGranule;
  o.release_threshold = UINT64_MAX;  // freed granules stay cached until trim
  DevicePool p(order, o);
  auto a = p.allocate(1000, 0);  // 1,024 bytes as placed
  auto b = p.allocate(kGranule, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  PoolStats s = p.stats();
  EXPECT_EQ(s.allocated_bytes, 1024 + kGranule);
  EXPECT_EQ(s.requested_bytes, 1000 + kGranule);
  EXPECT_EQ(s.allocs, 2u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_GE(s.reserved_bytes, 2 * kGranule);
  expect_agree(p);

  // a is freed while a held fill still writes it: pending, its bytes still active.
  sim->set_hold(0, true);
  ASSERT_TRUE(enqueue_fill(p, 0, *a, 7).ok());
  ASSERT_TRUE(p.free(*a).ok());
  s = p.stats();
  EXPECT_EQ(s.allocated_bytes, kGranule);
  EXPECT_EQ(s.requested_bytes, kGranule);
  EXPECT_EQ(s.pending_free_bytes, 1024u);
  EXPECT_EQ(s.active_bytes, kGranule + 1024);
  EXPECT_EQ(s.frees, 1u);
  expect_agree(p);

  // The fill completes: the pending block retires when stats are read.
  sim->set_hold(0, false);
  ASSERT_TRUE(order.wait({0, sim->submitted(0)}).ok());
  s = p.stats();
  EXPECT_EQ(s.pending_free_bytes, 0u);
  EXPECT_EQ(s.active_bytes, kGranule);
  expect_agree(p);

  ASSERT_TRUE(p.free(*b).ok());
  s = p.stats();
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.cached_bytes, s.reserved_bytes);  // every mapped granule is cached
  EXPECT_EQ(s.peak_allocated_bytes, 1024 + kGranule);
  EXPECT_EQ(s.peak_requested_bytes, 1000 + kGranule);
  EXPECT_EQ(s.peak_active_bytes, 1024 + kGranule);
  EXPECT_GE(s.peak_reserved_bytes, s.reserved_bytes);
  expect_agree(p);

  const std::uint64_t unmaps = s.unmaps;
  ASSERT_TRUE(p.trim().ok());
  s = p.stats();
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.reclaims, 1u);  // trim counts as one
  EXPECT_GT(s.unmaps, unmaps);
  expect_agree(p);
}

// The ladder's last rung: nothing to flush, retire or wait for, so the request is
// refused with the diagnostic, and nothing but the refusal's counters moved.
TEST_F(PoolStatsTest, AnOutOfMemoryAtTheEndOfTheLadderChangesNothingButItsCounters) {
  PoolOptions o;
  o.capacity = 4 * kGranule;
  o.release_threshold = 0;
  DevicePool p(order, o);
  auto full = p.allocate(3 * kGranule + kGranule / 2, 0);
  ASSERT_TRUE(full.ok());
  const PoolStats before = p.stats();
  auto refused = p.allocate(kGranule, 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::out_of_memory);
  for (const char* field : {"request of 64.00 KiB", "capacity", "largest free extent"})
    EXPECT_NE(refused.error().message.find(field), std::string::npos) << field << " in: " << refused.error().message;
  PoolStats after = p.stats();
  EXPECT_EQ(after.ooms, before.ooms + 1);
  EXPECT_EQ(after.reclaims, before.reclaims + 1);
  EXPECT_EQ(after.ooms_survived, before.ooms_survived);
  after.ooms = before.ooms;
  after.reclaims = before.reclaims;
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(after.cached_bytes, before.cached_bytes);
  EXPECT_EQ(after.allocs, before.allocs);
  EXPECT_EQ(after.maps, before.maps);
  EXPECT_EQ(after.unmaps, before.unmaps);
  expect_agree(p);
  // What fits is still placed: the rest of the last granule.
  auto rest = p.allocate(kGranule / 2, 1);
  ASSERT_TRUE(rest.ok()) << rest.error().message;
  EXPECT_EQ(p.stats().ooms_survived, before.ooms_survived);  // it fit at once: no ladder
  expect_agree(p);
}

}  // namespace
}  // namespace ferry
