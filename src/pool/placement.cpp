// DevicePool: placement off the hot path, the granule-aware scan of the offset
// allocator's free space.
#include "pool/device_pool_impl.hpp"

namespace ferry {

// The place, in either region, that touches the fewest granules no live block
// uses, so small blocks fill partly used granules instead of holding fresh
// ones; for a block that fits in one granule, among those the one spanning the
// fewest, so that it does not straddle two (a granule under two blocks stays
// mapped while either lives). Candidates: both ends of each free extent,
// and the first granule boundary in it and the last one a block can end on.
// The choice reads the live blocks and the free space only, never the
// capacity, what is mapped or what work completed: only whether the place fits
// depends on the capacity, which keeps the pool monotone in capacity.
DevicePool::Impl::Placement DevicePool::Impl::scan_placement(std::uint8_t own, std::uint64_t size) const {
  const std::uint64_t units = size / kAlign;
  const std::uint64_t granule_units = granule / kAlign;
  const bool within_one = size <= granule;  // only a block that fits one granule can avoid straddling
  Placement best;
  // The quick fit's own region first, so a tie keeps the block in its class.
  for (std::uint8_t k = 0; k < regions.size() && best.fresh > 0; ++k) {
    const auto rk = static_cast<std::uint8_t>(k == 0 ? own : (own == 0 ? k : k - 1));
    const Region& r = regions[rk];
    r.space.for_each_free_from(units, [&](std::uint32_t node, std::uint64_t off, std::uint64_t n) {
      const std::uint64_t up = (off + granule_units - 1) / granule_units * granule_units;
      const std::uint64_t down = (off + n) / granule_units * granule_units;
      // The extent's end last: on a tie the lower place wins, so the free tail of
      // a range is used from its start and the granule arrays stay a short prefix.
      const std::uint64_t candidates[] = {off, up + units <= off + n ? up : off,
                                          down >= off + units ? down - units : off, off + n - units};
      for (std::uint64_t at : candidates) {
        const std::uint64_t addr = r.base + at * kAlign;
        const std::uint64_t fresh = new_granules(r, addr, size);
        const auto [first, last] = granule_span(r, addr, size);
        if (fresh < best.fresh || (fresh == best.fresh && within_one && last - first < best.span))
          best = {rk, node, at, fresh, last - first};
      }
      return best.fresh > 0;
    });
  }
  return best;
}

// The quick fit's node `quick` of region `ri` (kNone: there was none) would
// touch `fresh` unused granules: place the block by scan_placement instead.
// Scalar arguments only, so the hot path that calls it builds no argument frame.
std::uint32_t DevicePool::Impl::fit_scan(std::uint64_t size, std::uint8_t ri, std::uint32_t quick,
                                         std::uint64_t fresh) {
  if (quick != detail::OffsetAllocator::kNone) regions[ri].space.free(quick);
  // Unmaps queued in this critical section run before any map: the capacity counts on them.
  settle();
  const Placement best = scan_placement(ri, size);
  if (best.node == detail::OffsetAllocator::kNone) return kNoFit;
  ri = best.region;
  const auto a = regions[ri].space.allocate_range(best.node, best.offset, size / kAlign);
  Region& r = regions[ri];
  const std::uint64_t addr = r.base + a.offset * kAlign;
  const Referenced referenced = reference_granules(r, addr, size, best.fresh);
  if (referenced != Referenced::busy && best.fresh < fresh) ++st.tight_fits;  // once per placement tried
  if (referenced != Referenced::yes) {
    r.space.free(a.node);
    return referenced == Referenced::busy ? kRetry : kNoFit;
  }
  return place(ri, a, addr, size);
}

}  // namespace ferry
