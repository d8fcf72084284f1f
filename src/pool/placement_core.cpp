#include "pool/placement_core.hpp"

namespace ferry::detail {

// Candidates: both ends of each free extent, and the first granule boundary in
// it and the last one a placement can end on. Over all places in an extent these
// reach the fewest fresh granules: only the extent's end granules can be in use.
bool PlacementCore::scan(std::uint64_t size, Candidate& best) const {
  const std::uint64_t units = size / kAlign;
  const std::uint64_t granule_units = (std::uint64_t{1} << shift_) / kAlign;
  const bool within_one = size <= (std::uint64_t{1} << shift_);  // only such a placement can avoid straddling
  bool improved = false;
  space_.for_each_free_from(units, [&](std::uint32_t node, std::uint64_t off, std::uint64_t n) {
    const std::uint64_t up = (off + granule_units - 1) / granule_units * granule_units;
    const std::uint64_t down = (off + n) / granule_units * granule_units;
    // The extent's end last: on a tie the lower place wins, so the free tail of
    // a range is used from its start and the granule counts stay a short prefix.
    const std::uint64_t candidates[] = {off, up + units <= off + n ? up : off,
                                        down >= off + units ? down - units : off, off + n - units};
    for (std::uint64_t at : candidates) {
      const std::uint64_t addr = addr_of(at);
      const std::uint64_t fresh = new_granules(addr, size);
      const auto [first, last] = granule_span(addr, size);
      if (fresh < best.fresh || (fresh == best.fresh && within_one && last - first < best.span)) {
        best = {node, at, fresh, last - first};
        improved = true;
      }
    }
    return best.fresh > 0;
  });
  return improved;
}

std::optional<PlacementCore::Fit> PlacementCore::best_fit(std::uint64_t units, std::uint64_t alignment) const {
  std::optional<Fit> best;
  space_.for_each_free_from(units, [&](std::uint32_t node, std::uint64_t off, std::uint64_t n) {
    const std::uint64_t at = ((addr_of(off) + alignment - 1) / alignment * alignment - base_) / kAlign;
    if (at + units > off + n) return true;  // the padding to the boundary leaves too little
    // Extents are disjoint, so of two equal ones the lower holds the lower place.
    if (!best || n < best->extent || (n == best->extent && at < best->offset)) best = Fit{node, at, n};
    return true;
  });
  return best;
}

bool PlacementCore::validate(std::string* why) const {
  auto fail = [&](std::string what) {
    if (why) *why = std::move(what);
    return false;
  };
  std::string inner;
  if (!space_.validate(&inner)) return fail("offset allocator: " + inner);
  if (bytes_ % kAlign != 0 || space_.capacity() != bytes_ / kAlign) return fail("range and allocator disagree");
  if (shift_ == kNoGranules) return refs_.empty() ? true : fail("granule counts in a range without granules");
  if (refs_.size() > (bytes_ >> shift_)) return fail("granule counts run past the range");
  // refs[g] == #{used node n : g in granule_span(n)}
  std::vector<std::uint32_t> counted(refs_.size(), 0);
  for (std::uint32_t n = 0; n < space_.node_count(); ++n) {
    if (!space_.is_used(n)) continue;
    const auto [first, last] = granule_span(addr_of(space_.offset_of(n)), bytes_of(n));
    if (last >= refs_.size()) return fail("a used node lies beyond the granule counts");
    for (std::uint64_t g = first; g <= last; ++g) ++counted[g];
  }
  for (std::uint64_t g = 0; g < refs_.size(); ++g)
    if (refs_[g] != counted[g])
      return fail("granule " + std::to_string(g) + ": " + std::to_string(refs_[g]) + " references, " +
                  std::to_string(counted[g]) + " used nodes touch it");
  return true;
}

}  // namespace ferry::detail
