// ferry — the placement core (internal): where a block goes in one address range.
//
// Pure: no locks, no device, no backend. One range [base, base + bytes), carved in
// units of kAlign bytes by an offset allocator, and per granule (a power of two
// of at least kAlign bytes) the number of live placements that touch it. The
// granule-aware scan reads those two only, so a placement depends on the live
// placements and the free space, never on what is mapped or what work completed.
// The device pool's regions use all of it; the host arena's chunks, which map
// nothing, use the free space and the aligned best fit (kNoGranules).
//
// Invariants (validate()):
//   the offset allocator is sound (OffsetAllocator::validate)
//   refs[g] == #{used node n : g in granule_span(n)}   for g < granules()
//   no used node reaches granule granules() or beyond
//   granules() <= bytes >> granule_shift
//   without granules: granules() == 0, and the allocator alone is checked
// So a granule strictly inside a free extent has refs 0: only a free extent's end
// granules can be touched by a live placement (new_granules counts on it).
//
// A caller takes a node (allocate, allocate_range), then its granules' references
// (take_refs), and drops both when the placement ends (drop_ref, free). Between
// two such steps the equation above may be off; validate() is for when it is not.
// Not thread-safe: the owner serializes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/offset_allocator.hpp"
#include "core/align.hpp"

namespace ferry::detail {

class PlacementCore {
 public:
  static constexpr std::uint64_t kAlign = kBlockAlign;  // every placement starts and ends on this
  static constexpr std::uint32_t kNone = OffsetAllocator::kNone;
  using Allocation = OffsetAllocator::Allocation;
  // A range whose placements have no granules: no references are counted.
  static constexpr unsigned kNoGranules = 0;

  // `bytes` a multiple of kAlign; a granule is 1 << granule_shift bytes, at least
  // kAlign, or kNoGranules.
  PlacementCore(std::uint64_t base, std::uint64_t bytes, unsigned granule_shift)
      : base_(base), bytes_(bytes), shift_(granule_shift), space_(bytes / kAlign) {}

  std::uint64_t base() const noexcept { return base_; }
  std::uint64_t bytes() const noexcept { return bytes_; }
  const OffsetAllocator& space() const noexcept { return space_; }

  // --- the free space ---------------------------------------------------------

  // The offset allocator's quick fit: a node of exactly `units`, or nullopt.
  std::optional<Allocation> allocate(std::uint64_t units) { return space_.allocate(units); }
  // Exactly [offset, offset + units) of free node `node`, which contains it.
  Allocation allocate_range(std::uint32_t node, std::uint64_t offset, std::uint64_t units) {
    return space_.allocate_range(node, offset, units);
  }
  void free(std::uint32_t node) { space_.free(node); }
  std::uint64_t addr_of(std::uint64_t offset) const { return base_ + offset * kAlign; }
  // A used node's size in bytes.
  std::uint64_t bytes_of(std::uint32_t node) const { return space_.size_of(node) * kAlign; }

  // --- granules ---------------------------------------------------------------

  // The first and last granule (indices from base) under [addr, addr+size).
  std::pair<std::uint64_t, std::uint64_t> granule_span(std::uint64_t addr, std::uint64_t size) const {
    // A power of two: shifts keep divisions off the hot path.
    return {(addr - base_) >> shift_, (addr - base_ + size - 1) >> shift_};
  }
  // Granules the reference counts cover so far: a prefix of the range.
  std::uint64_t granules() const noexcept { return refs_.size(); }
  // Live placements touching granule g; 0 beyond the counts.
  std::uint32_t ref(std::uint64_t g) const { return g < refs_.size() ? refs_[g] : 0; }
  // The same, for g < granules().
  std::uint32_t ref_at(std::uint64_t g) const { return refs_[g]; }
  // Grows the counts to cover n granules (zeros); reserve first where a throw must change nothing.
  void reserve_granules(std::uint64_t n) { refs_.reserve(n); }
  void cover_granules(std::uint64_t n) {
    if (n > refs_.size()) refs_.resize(n, 0);
  }
  void take_refs(std::uint64_t first, std::uint64_t last) {
    for (std::uint64_t g = first; g <= last; ++g) ++refs_[g];
  }
  // Drops one reference of granule g; returns what is left.
  std::uint32_t drop_ref(std::uint64_t g) { return --refs_[g]; }

  // Granules a placement at [addr, addr+size) would be the first live one to
  // touch, when the range lies in free space: a granule strictly inside a free
  // extent is touched by no live placement, so only the two end granules can be.
  std::uint64_t new_granules(std::uint64_t addr, std::uint64_t size) const {
    auto [first, last] = granule_span(addr, size);
    std::uint64_t n = last - first + 1;
    if (ref(first) > 0) --n;
    if (last != first && ref(last) > 0) --n;
    return n;
  }

  // --- the granule-aware scan -------------------------------------------------

  // A place in the free space: at `offset` (units) of free node `node`.
  struct Candidate {
    std::uint32_t node = kNone;
    std::uint64_t offset = 0;
    std::uint64_t fresh = UINT64_MAX;  // granules no live placement touches yet
    std::uint64_t span = UINT64_MAX;   // last granule - first granule
  };

  // Improves `best` with the place in this range that touches the fewest fresh
  // granules (for a placement of at most one granule, among those the one that
  // spans the fewest); returns whether it did. Stops at a place with no fresh
  // granule. The choice reads the live placements and the free space only.
  bool scan(std::uint64_t size, Candidate& best) const;

  // The smallest free extent that holds `units` from an `alignment`-byte boundary
  // of the address (a power of two, at least kAlign); of equal ones the lowest.
  // At `offset` (units) of free node `node`, whose extent is `extent` units.
  struct Fit {
    std::uint32_t node = kNone;
    std::uint64_t offset = 0;
    std::uint64_t extent = 0;
  };
  std::optional<Fit> best_fit(std::uint64_t units, std::uint64_t alignment) const;

  bool validate(std::string* why = nullptr) const;

 private:
  friend struct PlacementCoreTestAccess;

  std::uint64_t base_;
  std::uint64_t bytes_;
  unsigned shift_;
  OffsetAllocator space_;
  std::vector<std::uint32_t> refs_;  // per granule from base: live placements touching it
};

}  // namespace ferry::detail
