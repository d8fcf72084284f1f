// DevicePool: the granule map. Which granules each block touches (refs, pending_refs),
// which are mapped or cached, and the driver calls that map and unmap them outside the lock.
#include "pool/device_pool_impl.hpp"

namespace ferry {

void DevicePool::Impl::cover(Region& r, std::uint64_t last) {
  if (last < r.place.granules()) return;
  // Growth is geometric, so steady-state work never allocates here.
  const std::uint64_t n = std::min<std::uint64_t>(std::max<std::uint64_t>(last + 1, 2 * r.place.granules()),
                                                  r.place.bytes() >> granule_shift);
  // Every array is reserved before any grows, so a throw leaves their lengths
  // equal; the cached list holds a granule at most once (kListed), so no push
  // to it allocates after this.
  r.place.reserve_granules(n);
  r.pending_refs.reserve(n);
  r.flags.reserve(n);
  r.cached_list.reserve(n);
  r.place.cover_granules(n);
  r.pending_refs.resize(n, 0);
  r.flags.resize(n, 0);
}

// Takes references on the granules under [addr, addr+size), mapping the ones
// that are not mapped; `fresh` granules of them are touched by no live block yet.
// Refuses (no_room, nothing changed) when the granules in use would exceed the
// capacity; cached granules elsewhere are unmapped to make room, so whether a
// placement fits depends on the blocks alone, never on what is cached.
// The driver calls run without the lock: the caller holds the allocator node at
// `addr`, so nobody places over it, and its fresh granules stay kBusy until the
// maps return, so nobody else uses them before they are mapped.
DevicePool::Impl::Referenced DevicePool::Impl::reference_granules(Region& r, std::uint64_t addr, std::uint64_t size, std::uint64_t fresh) {
  auto [first, last] = r.place.granule_span(addr, size);
  cover(r, last);
  if (span_busy(r, first, last)) return Referenced::busy;
  if (fresh == 0) {  // every granule is in use, so mapped already
    r.place.take_refs(first, last);
    return Referenced::yes;
  }
  std::uint64_t unused = 0;  // granules no block, live or pending, touches
  for (std::uint64_t g = first; g <= last; ++g) unused += r.in_use(g) ? 0 : 1;
  if (referenced_bytes() + unused * granule > capacity) return Referenced::no_room;
  // Runs of unmapped granules, mapped with one call each. Collected before
  // anything changes, so that an allocation that throws leaves no trace.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;  // first granule, count
  for (std::uint64_t g = first; g <= last;) {
    if (r.flags[g] & kMapped) { ++g; continue; }
    std::uint64_t end = g;
    while (end <= last && !(r.flags[end] & kMapped)) ++end;
    runs.emplace_back(g, end - g);
    g = end;
  }
  const auto ri = static_cast<std::uint8_t>(&r - regions.data());
  if (!runs.empty()) mapping.push_back({ri, addr, size});
  // The runs count as reserved from here, so no other placement counts on their room.
  for (const auto& [g, n] : runs) {
    for (std::uint64_t u = g; u < g + n; ++u) r.flags[u] |= kMapped | kFresh | kBusy;
    busy_granules += n;
    st.reserved_bytes += n * granule;
  }
  for (std::uint64_t g = first; g <= last; ++g) {
    if (!(r.flags[g] & kFresh) && !r.in_use(g)) st.cached_bytes -= granule;  // a cached granule is back in use
  }
  r.place.take_refs(first, last);
  if (runs.empty()) return Referenced::yes;
  std::size_t runs_mapped = 0;
  Referenced outcome = Referenced::no_room;
  // An eviction whose unmap fails leaves its granule cached, at the front of the
  // list, so the next round evicts others first; a round per granule cached now
  // bounds the rounds (and ends in no_room).
  std::uint64_t rounds = st.cached_bytes / granule + 1;
  try {
    for (; rounds > 0; --rounds) {
      // Memory on its way out is on the device until its unmap returns: the
      // caller's own queued unmaps run before its maps, other callers' are in flight.
      const std::uint64_t others = unmapping_bytes - queued.size() * granule;
      const std::uint64_t need = st.reserved_bytes + others;
      // Cached granules elsewhere make the room.
      if (need > capacity && !evict_cached(need - capacity, r, first, last)) {
        if (others > 0) outcome = Referenced::busy;  // their unmaps return room: wait for them
        break;
      }
      bool unmapped_all = false;
      without_lock([&](bool all) {
        unmapped_all = all;
        if (!all) return;  // the room counted on an unmap that failed: make it again
        for (; runs_mapped < runs.size(); ++runs_mapped) {
          const std::uint64_t at = r.place.base() + runs[runs_mapped].first * granule;
          const std::uint64_t bytes = runs[runs_mapped].second * granule;
          if (!driver_ok([&] { return backend.map(at, bytes); })) {
            for (std::size_t k = 0; k < runs_mapped; ++k)  // all or nothing
              (void)driver_ok([&] { return backend.unmap(r.place.base() + runs[k].first * granule, runs[k].second * granule); });
            return;
          }
        }
      });
      if (unmapped_all) {
        if (runs_mapped == runs.size()) outcome = Referenced::yes;
        break;
      }
    }
  } catch (const std::bad_alloc&) {  // queueing an eviction: the placement fails and rolls back
    outcome = Referenced::no_room;
  }
  st.maps += runs_mapped;  // successful calls, as counted before a rollback too
  mapping.erase(std::find_if(mapping.begin(), mapping.end(),
                             [&](const Mapping& m) { return m.region == ri && m.addr == addr; }));
  const bool mapped = outcome == Referenced::yes;
  for (std::uint64_t g = first; g <= last; ++g) {
    if (!(r.flags[g] & kFresh)) {
      if (!mapped) drop_ref(r, g);
      continue;
    }
    --busy_granules;
    if (mapped) {
      r.flags[g] &= static_cast<std::uint8_t>(~(kFresh | kBusy));
    } else {
      r.flags[g] &= static_cast<std::uint8_t>(~(kMapped | kFresh | kBusy));
      st.reserved_bytes -= granule;
      r.place.drop_ref(g);
    }
  }
  driver_done();
  if (mapped) st.peak_reserved_bytes = std::max(st.peak_reserved_bytes, st.reserved_bytes);
  return outcome;
}

// Queues the unmap of cached granules until `bytes` are released (true) or none
// is left (false), except granules [keep_first, keep_last] of `keep` (the
// placement under way). From the back of the list: the most recently cached first.
bool DevicePool::Impl::evict_cached(std::uint64_t bytes, const Region& keep, std::uint64_t keep_first,
                  std::uint64_t keep_last) {
  std::uint64_t released = 0;
  for (Region& r : regions) {
    auto& list = r.cached_list;
    for (std::size_t i = list.size(); i-- > 0 && released < bytes;) {
      const std::uint32_t g = list[i];
      const bool cached = (r.flags[g] & kMapped) && !r.in_use(g);
      if (cached && &r == &keep && g >= keep_first && g <= keep_last) continue;
      if (cached) {
        queue_unmap(r, g);
        released += granule;
      }
      r.flags[g] &= static_cast<std::uint8_t>(~kListed);
      list[i] = list.back();
      list.pop_back();
    }
  }
  return released >= bytes;
}

// Queues the unmap of every mapped granule that no block touches (or, unless
// `all`, only down to the release threshold). O(granules that became cached
// since the last call), not O(capacity).
void DevicePool::Impl::unmap_unused(bool all) {
  for (Region& r : regions) {
    auto& list = r.cached_list;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::uint32_t g = list[i];
      const bool cached = (r.flags[g] & kMapped) && !r.in_use(g);
      const bool wanted = all || st.cached_bytes > options.release_threshold;
      if (cached && !wanted) {
        list[kept++] = g;  // stays cached, stays listed
        continue;
      }
      if (cached) queue_unmap(r, g);
      r.flags[g] &= static_cast<std::uint8_t>(~kListed);
    }
    list.resize(kept);
  }
}

void DevicePool::Impl::commit_unmaps(const std::vector<Unmap>& jobs) {
  for (const Unmap& u : jobs) {
    Region& r = regions[u.region];
    r.flags[u.granule] &= static_cast<std::uint8_t>(~kBusy);
    unmapping_bytes -= granule;
    --busy_granules;
    if (u.ok) {
      ++st.unmaps;
      continue;
    }
    r.flags[u.granule] |= kMapped;  // still mapped: cached again, evicted last
    st.reserved_bytes += granule;
    st.cached_bytes += granule;
    if (!(r.flags[u.granule] & kListed)) {
      r.flags[u.granule] |= kListed;
      r.cached_list.insert(r.cached_list.begin(), u.granule);  // no allocation: reserved in cover()
    }
  }
  driver_done();
}

void DevicePool::Impl::await_driver() {
  if (!queued.empty()) {  // this caller's unmaps first, committed: others may need their room
    settle();
    return;
  }
  const std::uint32_t seen = driver_epoch.load(std::memory_order_relaxed);
  ++driver_waiters;
  without_lock([&](bool) { driver_epoch.wait(seen, std::memory_order_acquire); });
  --driver_waiters;
}

// Each region's allocator is sound and its granule arrays agree in length; sizes t's counts.
bool DevicePool::Impl::validate_regions(std::string* why, ValidateTally& t) const {
  for (const Region& r : regions) {
    std::string inner;
    if (!r.place.validate(&inner)) return fail(why, "region placement: " + inner);
    if (r.place.granules() != r.flags.size() || r.pending_refs.size() != r.flags.size())
      return fail(why, "granule arrays disagree in length");
    t.refs.emplace_back(r.place.granules(), 0);
    t.pending_refs.emplace_back(r.place.granules(), 0);
  }
  return true;
}

// Every granule's counts and flags agree with the blocks (t) and with the stats.
bool DevicePool::Impl::validate_granules(std::string* why, const ValidateTally& t) const {
  std::uint64_t mapped = 0, cached = 0, busy = 0, unmapping = 0;
  for (std::size_t ri = 0; ri < regions.size(); ++ri) {
    const Region& r = regions[ri];
    std::uint64_t listed = 0;
    for (std::uint64_t g = 0; g < r.place.granules(); ++g) {
      const bool is_mapped = r.flags[g] & kMapped;
      if (r.place.ref_at(g) != t.refs[ri][g]) return fail(why, "granule reference count wrong");
      if (r.pending_refs[g] != t.pending_refs[ri][g]) return fail(why, "granule pending reference count wrong");
      if (r.in_use(g) && !is_mapped) return fail(why, "a block touches an unmapped granule");
      if ((r.flags[g] & kFresh) && !(r.flags[g] & kBusy)) return fail(why, "a granule is left marked fresh");
      if (r.flags[g] & kBusy) {
        ++busy;
        if (!is_mapped) unmapping += granule;
        if (is_mapped != r.in_use(g)) return fail(why, "a busy granule is unmapped in use, or mapped for nobody");
      }
      if (r.flags[g] & kListed) ++listed;
      if (is_mapped) mapped += granule;
      if (is_mapped && !r.in_use(g)) {
        cached += granule;
        if (!(r.flags[g] & kListed)) return fail(why, "a cached granule is not on the cached list");
      }
    }
    if (listed != r.cached_list.size()) return fail(why, "cached list and listed flags disagree");
  }
  if (mapped != st.reserved_bytes) return fail(why, "reserved_bytes disagrees with mapped granules");
  if (busy != busy_granules || unmapping != unmapping_bytes)
    return fail(why, "busy granule counts disagree with the busy flags");
  for (const Unmap& u : queued)
    if ((regions[u.region].flags[u.granule] & (kBusy | kMapped)) != kBusy) return fail(why, "a queued unmap is not busy");
  if (cached != st.cached_bytes) return fail(why, "cached_bytes disagrees with unused mapped granules");
  if (st.reserved_bytes > capacity) return fail(why, "reserved exceeds capacity");
  return true;
}

}  // namespace ferry
