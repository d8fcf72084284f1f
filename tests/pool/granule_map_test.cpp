// The granule map on its own: no pool, no device, no lock. The live references
// come from a placement core, as in the pool; the driver calls are the test's.
#include "pool/granule_map.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace ferry::detail {
namespace {

constexpr unsigned kShift = 16;  // 64 KiB granules
constexpr std::uint64_t kGranules = 16;

struct Range {
  PlacementCore live{std::uint64_t{1} << 30, kGranules << kShift, kShift};
  GranuleMap map;
  std::vector<std::uint32_t> pending = std::vector<std::uint32_t>(kGranules, 0);  // the test's own count

  Range() {
    live.reserve_granules(kGranules);
    live.cover_granules(kGranules);
    map.reserve(kGranules);
    map.cover(kGranules);
  }
  // A placement over [first, last] whose maps all succeed, as the pool runs it.
  void place(std::uint64_t first, std::uint64_t last) {
    std::vector<GranuleMap::Run> runs;
    map.unmapped_runs(first, last, runs);
    map.begin_map(runs);
    live.take_refs(first, last);
    map.end_map(live, first, last, /*mapped=*/true);
  }
  // Drops a live placement's references; returns the granules that became cached.
  std::uint64_t release(std::uint64_t first, std::uint64_t last) {
    std::uint64_t cached = 0;
    for (std::uint64_t g = first; g <= last; ++g) {
      if (live.drop_ref(g) == 0 && map.pending_ref(g) == 0) {
        map.list_cached(g);
        ++cached;
      }
    }
    return cached;
  }
  GranuleMap::Tally check() {
    GranuleMap::Tally t;
    std::string why;
    EXPECT_TRUE(map.validate(live, pending, t, &why)) << why;
    return t;
  }
};

TEST(GranuleMap, FindsTheUnmappedRuns) {
  Range r;
  r.place(2, 3);
  r.place(6, 6);
  std::vector<GranuleMap::Run> runs;
  r.map.unmapped_runs(0, 9, runs);
  EXPECT_EQ(runs, (std::vector<GranuleMap::Run>{{0, 2}, {4, 2}, {7, 3}}));
  runs.clear();
  r.map.unmapped_runs(2, 3, runs);
  EXPECT_TRUE(runs.empty());
  EXPECT_EQ(r.check().mapped, 3u);
}

TEST(GranuleMap, AMapUnderWayIsBusyAndFreshUntilItEnds) {
  Range r;
  std::vector<GranuleMap::Run> runs;
  r.map.unmapped_runs(4, 6, runs);
  r.map.begin_map(runs);
  r.live.take_refs(4, 6);
  EXPECT_EQ(r.map.busy_count(), 3u);
  EXPECT_EQ(r.map.unmapping_count(), 0u);
  EXPECT_TRUE(r.map.span_busy(6, 9));
  EXPECT_FALSE(r.map.span_busy(7, 9));
  EXPECT_TRUE(r.map.flags(5) & GranuleMap::kFresh);
  r.check();  // busy and mapped for the placement that holds the references
  const auto end = r.map.end_map(r.live, 4, 6, /*mapped=*/true);
  EXPECT_EQ(end.fresh, 3u);
  EXPECT_EQ(end.to_cached, 0u);
  EXPECT_EQ(r.map.busy_count(), 0u);
  EXPECT_EQ(r.map.flags(5), GranuleMap::kMapped);
  EXPECT_EQ(r.check().mapped, 3u);
}

// A failed map leaves nothing mapped that was not, and what the placement reused
// from the cache is cached again.
TEST(GranuleMap, AFailedMapRollsBackItsGranulesAndReferences) {
  Range r;
  r.place(3, 3);
  EXPECT_EQ(r.release(3, 3), 1u);  // granule 3: mapped, cached
  std::vector<GranuleMap::Run> runs;
  r.map.unmapped_runs(2, 4, runs);
  EXPECT_EQ(runs, (std::vector<GranuleMap::Run>{{2, 1}, {4, 1}}));
  r.map.begin_map(runs);
  EXPECT_EQ(r.map.reused_cached(r.live, 2, 4), 1u);
  r.live.take_refs(2, 4);
  const auto end = r.map.end_map(r.live, 2, 4, /*mapped=*/false);
  EXPECT_EQ(end.fresh, 2u);
  EXPECT_EQ(end.to_cached, 1u);
  for (std::uint64_t g = 2; g <= 4; ++g) EXPECT_EQ(r.live.ref_at(g), 0u);
  EXPECT_FALSE(r.map.mapped(2));
  EXPECT_TRUE(r.map.cached(r.live, 3));
  EXPECT_FALSE(r.map.mapped(4));
  const auto t = r.check();
  EXPECT_EQ(t.mapped, 1u);
  EXPECT_EQ(t.cached, 1u);
}

// A pending reference keeps a granule in use (I2): it never becomes cached while
// a pending placement touches it.
TEST(GranuleMap, PendingReferencesKeepAGranuleInUse) {
  Range r;
  r.place(0, 1);
  r.map.take_pending(1, 1);
  ++r.pending[1];
  EXPECT_EQ(r.release(0, 1), 1u);  // granule 0 only
  EXPECT_TRUE(r.map.in_use(r.live, 1));
  EXPECT_EQ(r.map.unused_in(r.live, 0, 2), 2u);
  EXPECT_EQ(r.check().cached, 1u);
  EXPECT_EQ(r.map.drop_pending(1), 0u);
  --r.pending[1];
  r.map.list_cached(1);
  r.map.list_cached(1);  // listed once
  EXPECT_EQ(r.map.cached_list().size(), 2u);
  EXPECT_EQ(r.check().cached, 2u);
}

TEST(GranuleMap, EvictsTheMostRecentlyCachedFirstAndKeepsThePlacementUnderWay) {
  Range r;
  for (std::uint64_t g = 0; g < 6; ++g) r.place(g, g);
  for (std::uint64_t g : {2u, 0u, 4u, 5u}) r.release(g, g);  // cached list: 2 0 4 5
  std::vector<std::uint64_t> unmapped;
  const std::uint64_t picked = r.map.evict(r.live, 2, /*keep*/ 5, 5, [&](std::uint64_t g) { unmapped.push_back(g); });
  EXPECT_EQ(picked, 2u);
  EXPECT_EQ(unmapped, (std::vector<std::uint64_t>{4, 0}));
  EXPECT_EQ(r.map.busy_count(), 2u);
  EXPECT_EQ(r.map.unmapping_count(), 2u);
  EXPECT_TRUE(r.map.span_busy(4, 4));
  r.check();
  for (std::uint64_t g : unmapped) r.map.end_unmap(g, /*ok=*/true);
  EXPECT_FALSE(r.map.mapped(4));
  EXPECT_EQ(r.map.busy_count(), 0u);
  const auto t = r.check();
  EXPECT_EQ(t.mapped, 4u);
  EXPECT_EQ(t.cached, 2u);  // 2 and 5 (kept)
}

// A failed unmap leaves its granule mapped and cached, at the front of the list:
// the next eviction takes the others first.
TEST(GranuleMap, AFailedUnmapIsCachedAgainAndEvictedLast) {
  Range r;
  for (std::uint64_t g = 0; g < 3; ++g) r.place(g, g);
  for (std::uint64_t g = 0; g < 3; ++g) r.release(g, g);
  std::vector<std::uint64_t> unmapped;
  r.map.evict(r.live, 1, 1, 0, [&](std::uint64_t g) { unmapped.push_back(g); });
  ASSERT_EQ(unmapped, (std::vector<std::uint64_t>{2}));
  r.map.end_unmap(2, /*ok=*/false);
  EXPECT_TRUE(r.map.cached(r.live, 2));
  EXPECT_EQ(r.map.cached_list().front(), 2u);
  EXPECT_EQ(r.check().cached, 3u);
  unmapped.clear();
  r.map.evict(r.live, 2, 1, 0, [&](std::uint64_t g) { unmapped.push_back(g); });
  EXPECT_EQ(unmapped, (std::vector<std::uint64_t>{1, 0}));
}

// A stale entry (cached, then back in use) leaves the list without an unmap.
TEST(GranuleMap, SweepUnmapsWhileWantedAndDropsStaleEntries) {
  Range r;
  for (std::uint64_t g = 0; g < 4; ++g) r.place(g, g);
  for (std::uint64_t g = 0; g < 4; ++g) r.release(g, g);
  r.live.take_refs(1, 1);  // granule 1 is back in use
  std::uint64_t budget = 1;
  std::vector<std::uint64_t> unmapped;
  r.map.sweep(r.live, [&] { return budget > 0; }, [&](std::uint64_t g) {
    unmapped.push_back(g);
    --budget;
  });
  EXPECT_EQ(unmapped, (std::vector<std::uint64_t>{0}));
  EXPECT_EQ(r.map.cached_list(), (std::vector<std::uint32_t>{2, 3}));
  for (std::uint64_t g : unmapped) r.map.end_unmap(g, true);
  r.check();
  r.map.sweep(r.live, [] { return true; }, [&](std::uint64_t g) { r.map.end_unmap(g, true); });
  EXPECT_TRUE(r.map.cached_list().empty());
  const auto t = r.check();
  EXPECT_EQ(t.mapped, 1u);
  EXPECT_EQ(t.cached, 0u);
}

TEST(GranuleMap, ValidateCatchesCountsAndFlagsThatDisagree) {
  Range r;
  r.place(0, 0);
  GranuleMap::Tally t;
  std::string why;
  r.pending[0] = 1;  // the owner counts a pending placement the map does not
  EXPECT_FALSE(r.map.validate(r.live, r.pending, t, &why));
  EXPECT_EQ(why, "granule pending reference count wrong");
  r.pending[0] = 0;
  r.live.take_refs(5, 5);  // a live reference on a granule nobody mapped
  EXPECT_FALSE(r.map.validate(r.live, r.pending, t, &why));
  EXPECT_EQ(why, "a block touches an unmapped granule");
  r.live.drop_ref(5);
  r.release(0, 0);
  r.live.take_refs(0, 0);
  r.live.drop_ref(0);
  EXPECT_TRUE(r.map.validate(r.live, r.pending, t, &why)) << why;
  std::vector<std::uint32_t> short_count(kGranules - 1, 0);
  EXPECT_FALSE(r.map.validate(r.live, short_count, t, &why));
}

}  // namespace
}  // namespace ferry::detail
