// DevicePool: statistics, snapshots, the OOM diagnostic, and validate().
#include "pool/device_pool_impl.hpp"

namespace ferry {

// The largest request that would fit now without reclaiming anything: a run of
// free address space whose granules are in use already, or that capacity left
// unreferenced can map (cached granules count as room: they are unmapped on
// demand). Scans every free extent: for diagnostics, not for hot paths.
std::uint64_t DevicePool::Impl::largest_free_extent() const {
  const std::uint64_t room = (capacity - referenced_bytes()) >> granule_shift;  // granules
  std::uint64_t best = 0;
  for (const Region& r : regions) {
    r.place.space().for_each_free([&](std::uint32_t, std::uint64_t off, std::uint64_t n) {
      const std::uint64_t addr = r.place.addr_of(off), bytes = n * kAlign;
      auto [first, last] = r.place.granule_span(addr, bytes);
      // Only the end granules can be in use by a neighbour; the rest would be fresh.
      const std::uint64_t lead = r.place.ref(first) > 0 ? std::min(bytes, ((first + 1) << granule_shift) - (addr - r.place.base())) : 0;
      const std::uint64_t trail = last != first && r.place.ref(last) > 0 ? (addr - r.place.base() + bytes) - (last << granule_shift) : 0;
      const std::uint64_t fresh = r.place.new_granules(addr, bytes);
      std::uint64_t fits = bytes;
      if (fresh > room) fits = std::min(bytes, std::max(lead, trail) + (room << granule_shift));
      best = std::max(best, fits);
    });
  }
  return best;
}

std::string DevicePool::Impl::diagnostic(std::uint64_t bytes, StreamId stream) const {
  const std::uint64_t held = st.allocated_bytes + st.pending_free_bytes;
  // Past the capacity the rounding (and held + size) would wrap: a request that
  // large is named as such, never as fragmentation.
  const std::uint64_t size = bytes > capacity ? 0 : detail::align_up(bytes, kAlign);
  const std::string cause =
      bytes > capacity ? std::string("capacity: the request is larger than the whole capacity")
      : held + size > capacity
          ? "capacity: live + pending-free + the request exceed the capacity by " +
                bytes_str(held + size - capacity)
          : "fragmentation: " + bytes_str(capacity - held) +
                " are not held by any block, but no free extent can take the request";
  const std::string on =
      options.device_count > 1 ? " on device " + std::to_string(options.device) + " of " +
                                     std::to_string(options.device_count)
                               : std::string();
  return "out of memory" + on + ": request of " + bytes_str(bytes) + " (" + std::to_string(bytes) +
         " B) on stream " + std::to_string(stream) + "; capacity " + bytes_str(capacity) +
         ", reserved " + bytes_str(st.reserved_bytes) + ", live " + bytes_str(st.allocated_bytes) +
         ", pending-free " + bytes_str(st.pending_free_bytes) + ", cached " +
         bytes_str(st.cached_bytes) + ", largest free extent " + bytes_str(largest_free_extent()) +
         "; cause: " + cause;
}

Error DevicePool::Impl::too_large(std::uint64_t bytes, StreamId stream) {
  ++st.ooms;
  return make_error(ErrorCode::out_of_memory, diagnostic(bytes, stream));
}

bool DevicePool::Impl::validate_locked(std::string* why) const {
  ValidateTally t;
  std::vector<std::uint8_t> is_spare, filed;
  return validate_regions(why, t) && validate_lists(why, is_spare, filed) &&
         validate_blocks(why, is_spare, filed, t) && validate_granules(why, t) && validate_subs(why);
}

// Reads retire the frees whose work completed first, so an idle device shows no
// pending free (retiring never blocks; the pool is logically unchanged).
PoolStats DevicePool::stats() const {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  p.retire_pending();
  p.settle();
  p.st.active_bytes = p.st.allocated_bytes + p.st.pending_free_bytes;
  return p.st;
}

void DevicePool::reset_peak_stats() {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  p.note_peaks();  // active_bytes current before it becomes the peak
  p.st.peak_allocated_bytes = p.st.allocated_bytes;
  p.st.peak_requested_bytes = p.st.requested_bytes;
  p.st.peak_reserved_bytes = p.st.reserved_bytes;
  p.st.peak_active_bytes = p.st.active_bytes;
  p.check();
}

std::uint64_t DevicePool::largest_free_extent() const {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  p.retire_pending();
  p.settle();
  return p.largest_free_extent();
}

std::vector<BlockInfo> DevicePool::snapshot() const {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  p.retire_pending();
  p.settle();
  std::vector<BlockInfo> out;
  for (const Impl::Block& blk : p.blocks) {
    if (!Impl::has_block(blk)) continue;
    const auto b = static_cast<std::uint32_t>(&blk - p.blocks.data());
    out.push_back(BlockInfo{blk.addr, p.block_size(b),
                            blk.state == Impl::BlockState::live ? BlockInfo::State::live
                                                                : BlockInfo::State::pending_free,
                            blk.stream});
  }
  std::sort(out.begin(), out.end(), [](const BlockInfo& a, const BlockInfo& b) { return a.addr < b.addr; });
  return out;
}

std::vector<LiveBlock> DevicePool::live_blocks() const {
  const Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  std::vector<LiveBlock> out;
  for (std::size_t b = 0; b < p.blocks.size(); ++b) {
    const Impl::Block& blk = p.blocks[b];
    if (blk.state != Impl::BlockState::live) continue;
    out.push_back(LiveBlock{DeviceHandle{p.id, static_cast<std::uint32_t>(b), blk.generation}, blk.requested,
                            blk.stream});
  }
  return out;
}

std::vector<SegmentInfo> DevicePool::segments() const {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  p.retire_pending();
  p.settle();
  std::vector<SegmentInfo> out;
  for (std::size_t ri = 0; ri < p.regions.size(); ++ri) {
    const Impl::Region& r = p.regions[ri];
    SegmentInfo seg;
    seg.kind = p.regions.size() == 1 ? SegmentInfo::Kind::shared
               : ri == 0             ? SegmentInfo::Kind::small
                                     : SegmentInfo::Kind::large;
    seg.base = r.place.base();
    seg.bytes = r.place.bytes();
    seg.granule = p.granule;
    // Adjacent granules in the same state extend the last run.
    auto extend = [&](std::vector<DeviceRange>& runs, std::uint64_t addr) {
      if (!runs.empty() && runs.back().addr + runs.back().bytes == addr) {
        runs.back().bytes += p.granule;
      } else {
        runs.push_back(DeviceRange{addr, p.granule});
      }
    };
    for (std::uint64_t g = 0; g < r.map.granules(); ++g) {
      if (!r.map.mapped(g)) continue;
      const std::uint64_t addr = r.place.base() + g * p.granule;
      extend(seg.mapped, addr);
      seg.mapped_bytes += p.granule;
      if (!r.in_use(g)) {
        extend(seg.cached, addr);
        seg.cached_bytes += p.granule;
      }
    }
    out.push_back(std::move(seg));
  }
  std::sort(out.begin(), out.end(),
            [](const SegmentInfo& a, const SegmentInfo& b) { return a.base < b.base; });
  return out;
}

bool DevicePool::validate(std::string* why) const {
  std::lock_guard lock(impl_->mu);
  return impl_->validate_locked(why);
}

}  // namespace ferry
