// DevicePool: placement off the hot path, the granule-aware scan over both regions.
#include "pool/device_pool_impl.hpp"

namespace ferry {

// The place, in either region, that touches the fewest granules no live block
// uses, so small blocks fill partly used granules instead of holding fresh
// ones; for a block that fits in one granule, among those the one spanning the
// fewest, so that it does not straddle two (a granule under two blocks stays
// mapped while either lives). The choice reads the live blocks and the free
// space only (PlacementCore::scan), never the capacity, what is mapped or what
// work completed: only whether the place fits depends on the capacity, which
// keeps the pool monotone in capacity.
DevicePool::Impl::Placement DevicePool::Impl::scan_placement(std::uint8_t own, std::uint64_t size) const {
  Placement best;
  // The quick fit's own region first, so a tie keeps the block in its class.
  for (std::uint8_t k = 0; k < regions.size() && best.at.fresh > 0; ++k) {
    const auto rk = static_cast<std::uint8_t>(k == 0 ? own : (own == 0 ? k : k - 1));
    if (regions[rk].place.scan(size, best.at)) best.region = rk;
  }
  return best;
}

// The quick fit's node `quick` of region `ri` (kNone: there was none) would
// touch `fresh` unused granules: place the block by scan_placement instead.
// Scalar arguments only, so the hot path that calls it builds no argument frame.
std::uint32_t DevicePool::Impl::fit_scan(std::uint64_t size, std::uint8_t ri, std::uint32_t quick,
                                         std::uint64_t fresh) {
  if (quick != detail::OffsetAllocator::kNone) regions[ri].place.free(quick);
  // Unmaps queued in this critical section run before any map: the capacity counts on them.
  settle();
  const Placement best = scan_placement(ri, size);
  if (best.at.node == detail::PlacementCore::kNone) return kNoFit;
  ri = best.region;
  Region& r = regions[ri];
  const auto a = r.place.allocate_range(best.at.node, best.at.offset, size / kAlign);
  const std::uint64_t addr = r.place.addr_of(a.offset);
  const Referenced referenced = reference_granules(r, addr, size, best.at.fresh);
  if (referenced != Referenced::busy && best.at.fresh < fresh) ++st.tight_fits;  // once per placement tried
  if (referenced != Referenced::yes) {
    r.place.free(a.node);
    return referenced == Referenced::busy ? kRetry : kNoFit;
  }
  return place(ri, a, addr, size);
}

}  // namespace ferry
