// The placement core on its own: no pool, no device. Placements are made the way
// the pool makes them (the quick fit, kept when it touches no fresh granule, else
// the granule-aware scan) and checked against a reference that tracks every unit
// and every granule by brute force.
#include "pool/placement_core.hpp"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <random>

namespace ferry::detail {

// Plants corruptions validate() must catch.
struct PlacementCoreTestAccess {
  static std::vector<std::uint32_t>& refs(PlacementCore& c) { return c.refs_; }
};

namespace {

constexpr std::uint64_t kAlign = PlacementCore::kAlign;

struct Placed {
  std::uint32_t node = PlacementCore::kNone;
  std::uint64_t offset = 0;  // units
  std::uint64_t units = 0;
  std::uint64_t fresh = 0;   // granules it was the first live placement to touch
};

// The granule counts cover the whole range, as the pool's cover() grows them.
PlacementCore make_core(std::uint64_t granules, unsigned shift) {
  PlacementCore c(std::uint64_t{1} << 30, granules << shift, shift);
  c.reserve_granules(granules);
  c.cover_granules(granules);
  return c;
}

// The pool's order: the quick fit when it lands on granules in use, else the scan.
std::optional<Placed> place(PlacementCore& c, std::uint64_t units) {
  const std::uint64_t size = units * kAlign;
  std::optional<PlacementCore::Allocation> a = c.allocate(units);
  std::uint64_t fresh = a ? c.new_granules(c.addr_of(a->offset), size) : UINT64_MAX;
  if (!a || fresh > 0) {
    if (a) c.free(a->node);
    PlacementCore::Candidate best;
    c.scan(size, best);
    if (best.node == PlacementCore::kNone) return std::nullopt;
    a = c.allocate_range(best.node, best.offset, units);
    fresh = best.fresh;
  }
  const auto [first, last] = c.granule_span(c.addr_of(a->offset), size);
  c.take_refs(first, last);
  return Placed{a->node, a->offset, units, fresh};
}

void release(PlacementCore& c, const Placed& p) {
  const auto [first, last] = c.granule_span(c.addr_of(p.offset), p.units * kAlign);
  for (std::uint64_t g = first; g <= last; ++g) c.drop_ref(g);
  c.free(p.node);
}

TEST(PlacementCore, ScatteredAndAdjacentFreesThenOneFullSizePlacementLandsAtOffsetZero) {
  PlacementCore c = make_core(16, 16);  // 16 granules of 64 KiB: 4096 units
  const std::uint64_t units = c.bytes() / kAlign;
  std::vector<Placed> got;
  for (int i = 0; i < 64; ++i) {
    auto p = place(c, units / 64);
    ASSERT_TRUE(p) << "placement " << i;
    got.push_back(*p);
  }
  EXPECT_FALSE(place(c, 1));
  std::string why;
  ASSERT_TRUE(c.validate(&why)) << why;
  for (std::size_t i = 0; i < got.size(); i += 2) release(c, got[i]);  // scattered
  ASSERT_TRUE(c.validate(&why)) << why;
  for (std::size_t i = 1; i < got.size(); i += 2) release(c, got[i]);  // then adjacent
  ASSERT_TRUE(c.validate(&why)) << why;
  for (std::uint64_t g = 0; g < c.granules(); ++g) EXPECT_EQ(c.ref_at(g), 0u) << "granule " << g;
  auto all = place(c, units);
  ASSERT_TRUE(all);
  EXPECT_EQ(all->offset, 0u);
  EXPECT_EQ(all->fresh, 16u);
  ASSERT_TRUE(c.validate(&why)) << why;
}

TEST(PlacementCore, ASmallPlacementFillsAGranuleInUseBeforeAFreshOne) {
  PlacementCore c = make_core(8, 12);  // granules of 16 units
  auto a = place(c, 4);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->fresh, 1u);
  auto b = place(c, 4);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->fresh, 0u);
  EXPECT_EQ(b->offset / 16, a->offset / 16) << "the second lands in the first's granule";
  // A placement of one granule or less does not straddle two when it need not.
  auto g = place(c, 16);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->offset % 16, 0u);
  EXPECT_EQ(g->fresh, 1u);
}

// The reference: every unit's owner and every granule's count, by brute force.
class Reference {
 public:
  Reference(std::uint64_t units, std::uint64_t granule_units)
      : used_(units, false), refs_(units / granule_units, 0), gu_(granule_units) {}

  bool range_free(std::uint64_t off, std::uint64_t n) const {
    for (std::uint64_t u = off; u < off + n; ++u)
      if (used_[u]) return false;
    return true;
  }
  std::uint64_t fresh_at(std::uint64_t off, std::uint64_t n) const {
    std::uint64_t fresh = 0;
    for (std::uint64_t g = off / gu_; g <= (off + n - 1) / gu_; ++g) fresh += refs_[g] == 0 ? 1 : 0;
    return fresh;
  }
  // The fewest fresh granules over every free place of n units; nullopt when none fits.
  std::optional<std::uint64_t> min_fresh(std::uint64_t n) const {
    std::optional<std::uint64_t> best;
    std::uint64_t run = 0;
    for (std::uint64_t u = 0; u < used_.size(); ++u) {
      run = used_[u] ? 0 : run + 1;
      if (run < n) continue;
      const std::uint64_t f = fresh_at(u + 1 - n, n);
      if (!best || f < *best) best = f;
    }
    return best;
  }
  void mark(std::uint64_t off, std::uint64_t n, bool used) {
    for (std::uint64_t u = off; u < off + n; ++u) used_[u] = used;
    for (std::uint64_t g = off / gu_; g <= (off + n - 1) / gu_; ++g) {
      if (used) ++refs_[g];
      else --refs_[g];
    }
  }
  std::uint32_t ref(std::uint64_t g) const { return refs_[g]; }
  std::uint64_t granules() const { return refs_.size(); }

 private:
  std::vector<bool> used_;
  std::vector<std::uint32_t> refs_;
  std::uint64_t gu_;
};

TEST(PlacementCore, RandomTrafficMatchesABruteForceReference) {
  constexpr unsigned kShift = 12;  // 16 units a granule
  constexpr std::uint64_t kGranules = 48;
  const std::uint64_t gu = (std::uint64_t{1} << kShift) / kAlign;
  PlacementCore c = make_core(kGranules, kShift);
  Reference ref(kGranules * gu, gu);
  std::mt19937_64 rng(22);
  std::vector<Placed> live;
  std::string why;
  for (int step = 0; step < 6000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      const std::uint64_t n = 1 + (rng() % 4 == 0 ? rng() % (4 * gu) : rng() % gu);
      const std::optional<std::uint64_t> expect = ref.min_fresh(n);
      auto p = place(c, n);
      ASSERT_EQ(p.has_value(), expect.has_value()) << "step " << step << ": " << n << " units";
      if (!p) continue;
      ASSERT_TRUE(ref.range_free(p->offset, n)) << "step " << step << ": placed over a live one";
      ASSERT_EQ(p->fresh, ref.fresh_at(p->offset, n)) << "step " << step;
      // The quick fit is kept only at no fresh granule; the scan finds the fewest.
      ASSERT_EQ(p->fresh, *expect) << "step " << step << ": " << n << " units";
      ref.mark(p->offset, n, true);
      live.push_back(*p);
    } else {
      const std::size_t i = rng() % live.size();
      release(c, live[i]);
      ref.mark(live[i].offset, live[i].units, false);
      live[i] = live.back();
      live.pop_back();
    }
    for (std::uint64_t g = 0; g < ref.granules(); ++g) ASSERT_EQ(c.ref_at(g), ref.ref(g)) << "step " << step;
    ASSERT_TRUE(c.validate(&why)) << why << " at step " << step;
  }
}

TEST(PlacementCore, BestFitTakesTheSmallestExtentThatHoldsTheAlignedRequest) {
  PlacementCore c(std::uint64_t{1} << 30, 64 * kAlign, PlacementCore::kNoGranules);
  std::vector<PlacementCore::Allocation> unit;  // 64 one-unit nodes, in order
  for (int i = 0; i < 64; ++i) unit.push_back(*c.allocate(1));
  for (int i = 0; i < 64; ++i) ASSERT_EQ(unit[static_cast<std::size_t>(i)].offset, static_cast<std::uint64_t>(i));
  auto free_run = [&](std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i) c.free(unit[i].node);
  };
  free_run(2, 8);    // 6 units
  free_run(10, 30);  // 20
  free_run(40, 44);  // 4
  free_run(50, 56);  // 6 again, higher
  std::string why;
  ASSERT_TRUE(c.validate(&why)) << why;
  auto offset_of = [&](std::uint64_t units, std::uint64_t alignment) -> std::optional<std::uint64_t> {
    auto f = c.best_fit(units, alignment);
    if (!f) return std::nullopt;
    return f->offset;
  };
  EXPECT_EQ(offset_of(4, kAlign), 40u);
  EXPECT_EQ(offset_of(5, kAlign), 2u) << "of two equal extents, the lower";
  EXPECT_EQ(offset_of(7, kAlign), 10u);
  // At 16 units (4 KiB) the 6-unit extents cannot hold 5 past their boundary.
  EXPECT_EQ(offset_of(5, 16 * kAlign), 16u);
  EXPECT_EQ(offset_of(21, kAlign), std::nullopt);
  auto f = c.best_fit(4, kAlign);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->extent, 4u);
  const auto a = c.allocate_range(f->node, f->offset, 4);
  EXPECT_EQ(a.offset, 40u);
  ASSERT_TRUE(c.validate(&why)) << why;
  EXPECT_EQ(c.best_fit(4, kAlign)->offset, 2u);
}

TEST(PlacementCore, ValidateCatchesAPlantedReferenceCount) {
  PlacementCore c = make_core(8, 12);
  auto a = place(c, 20);  // two granules
  ASSERT_TRUE(a);
  std::string why;
  ASSERT_TRUE(c.validate(&why)) << why;
  auto& refs = PlacementCoreTestAccess::refs(c);
  const std::uint64_t g = a->offset / 16;
  ++refs[g];
  EXPECT_FALSE(c.validate(&why));
  EXPECT_NE(why.find("granule " + std::to_string(g)), std::string::npos) << why;
  --refs[g];
  ASSERT_TRUE(c.validate(&why)) << why;
  // A granule strictly inside free space with a reference: new_granules would undercount.
  ++refs[7];
  EXPECT_FALSE(c.validate(&why));
  --refs[7];
  // Counts that stop short of a used node.
  refs.resize(a->offset / 16);
  EXPECT_FALSE(c.validate(&why));
  EXPECT_NE(why.find("beyond"), std::string::npos) << why;
}

}  // namespace
}  // namespace ferry::detail
