#include "core/offset_allocator.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace ferry::detail {
namespace {

TEST(OffsetAllocator, ScatteredAndAdjacentFreesCoalesceBackToOneBlock) {
  OffsetAllocator a(1024);
  std::vector<OffsetAllocator::Allocation> got;
  for (int i = 0; i < 64; ++i) {
    auto r = a.allocate(16);
    ASSERT_TRUE(r);
    got.push_back(*r);
  }
  EXPECT_FALSE(a.allocate(1));
  // Free every other block first (scattered), then the rest (adjacent).
  for (std::size_t i = 0; i < got.size(); i += 2) a.free(got[i].node);
  ASSERT_TRUE(a.validate());
  for (std::size_t i = 1; i < got.size(); i += 2) a.free(got[i].node);
  std::string why;
  ASSERT_TRUE(a.validate(&why)) << why;
  auto all = a.allocate(1024);
  ASSERT_TRUE(all);
  EXPECT_EQ(all->offset, 0u);
}

TEST(OffsetAllocator, NeverOverlapsAndStaysValidUnderRandomTraffic) {
  OffsetAllocator a(1 << 20);
  std::mt19937_64 rng(7);
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint32_t>> live;  // offset -> (size, node)
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      const std::uint64_t size = 1 + rng() % (rng() % 8 == 0 ? 40000 : 600);
      auto r = a.allocate(size);
      if (!r) continue;
      ASSERT_GE(a.size_of(r->node), size);
      auto next = live.lower_bound(r->offset);
      if (next != live.end()) {
        ASSERT_LE(r->offset + size, next->first);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.first, r->offset);
      }
      live[r->offset] = {size, r->node};
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      a.free(it->second.second);
      live.erase(it);
    }
    if (step % 97 == 0) {
      std::string why;
      ASSERT_TRUE(a.validate(&why)) << why << " at step " << step;
    }
  }
  for (auto& [off, v] : live) a.free(v.second);
  ASSERT_TRUE(a.validate());
  EXPECT_EQ(a.free_units(), a.capacity());
  EXPECT_EQ(a.largest_free(), a.capacity());
}

TEST(OffsetAllocator, SplitKeepsBothHalvesAllocated) {
  OffsetAllocator a(100);
  auto r = a.allocate(60);
  ASSERT_TRUE(r);
  const std::uint32_t tail = a.split(r->node, 20);
  EXPECT_EQ(a.size_of(r->node), 20u);
  EXPECT_EQ(a.offset_of(tail), 20u);
  EXPECT_EQ(a.size_of(tail), 40u);
  ASSERT_TRUE(a.validate());
  a.free(tail);
  a.free(r->node);
  ASSERT_TRUE(a.validate());
  EXPECT_EQ(a.largest_free(), 100u);
}

TEST(OffsetAllocator, RefusesWhatDoesNotFit) {
  OffsetAllocator a(10);
  EXPECT_FALSE(a.allocate(0));
  EXPECT_FALSE(a.allocate(11));
  EXPECT_FALSE(a.allocate(UINT64_MAX));
  EXPECT_TRUE(a.allocate(10));
}

}  // namespace
}  // namespace ferry::detail

namespace ferry::detail {
namespace {

TEST(OffsetAllocator, AllocateRangeCarvesExactlyTheAskedPlace) {
  OffsetAllocator a(1000);
  std::uint32_t node = OffsetAllocator::kNone;
  a.for_each_free([&](std::uint32_t n, std::uint64_t off, std::uint64_t size) {
    EXPECT_EQ(off, 0u);
    EXPECT_EQ(size, 1000u);
    node = n;
  });
  auto mid = a.allocate_range(node, 300, 100);
  EXPECT_EQ(mid.offset, 300u);
  std::string why;
  ASSERT_TRUE(a.validate(&why)) << why;
  EXPECT_EQ(a.free_units(), 900u);
  std::uint64_t extents = 0;
  a.for_each_free([&](std::uint32_t, std::uint64_t, std::uint64_t) { ++extents; });
  EXPECT_EQ(extents, 2u);
  a.free(mid.node);
  ASSERT_TRUE(a.validate(&why)) << why;
  EXPECT_EQ(a.largest_free(), 1000u);
}

}  // namespace
}  // namespace ferry::detail
