// HostArena: validate(), every invariant of the chunks, the stats and the regions.
#include "core/invariant.hpp"
#include "transfer/host_arena_impl.hpp"

namespace ferry {

using Unit = detail::ArenaUnit;
using Region = detail::ArenaRegion;

bool HostArena::validate(std::string* why) const {
  std::lock_guard lock(impl_->mu);
  return validate_locked(why);
}

void HostArena::check() const {
  detail::check_invariants(options_.validate_each_op, "HostArena",
                           [&](std::string* why) { return validate_locked(why); });
}

bool HostArena::validate_locked(std::string* why) const {
  const Impl& m = *impl_;
  auto fail = [&](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  std::uint64_t reserved = 0, in_use = 0, requested = 0, pending = 0;
  std::uint64_t chunks = 0, pending_blocks = 0;
  for (PinnedUnitId id = 0; id < m.units.size(); ++id) {
    const Unit& u = m.units[id];
    if (u.kind != Unit::Kind::chunk || u.released) continue;
    const std::string name = "chunk " + std::to_string(id);
    ++chunks;
    reserved += u.raw_bytes;
    std::uint64_t live = 0, req = 0, pend = 0;
    std::string inner;
    if (!u.space || !u.space->validate(&inner)) return fail(name + ": free space: " + inner);
    const detail::OffsetAllocator& space = u.space->space();
    if (u.space->base() != detail::addr(u.base) || u.space->bytes() != u.bytes)
      return fail(name + ": free space and chunk disagree");
    // Every block owns the node at its offset, of its extent; the canary precedes them.
    for (const auto& [off, b] : u.blocks) {
      const std::string at = name + ": block at " + std::to_string(off);
      if (b.extent == 0 || b.extent % kArenaAlignment != 0 || off % kArenaAlignment != 0) return fail(at + " is misaligned");
      if (b.requested > b.extent || (b.requested + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment != b.extent)
        return fail(at + " is not its request rounded to 256");
      if (off < kCanaryBytes) return fail(at + " overlaps the canary");
      if (b.node >= space.node_count() || !space.is_used(b.node) ||
          space.offset_of(b.node) * detail::PlacementCore::kAlign != off || u.space->bytes_of(b.node) != b.extent)
        return fail(at + " disagrees with its node");
      (b.pending ? pend : live) += b.extent;
      pending_blocks += b.pending ? 1 : 0;
      if (!b.pending) req += b.requested;
    }
    std::uint64_t used = 0;  // the canary, the blocks, the dead extents
    for (std::uint32_t n = 0; n < space.node_count(); ++n)
      if (space.is_used(n)) used += u.space->bytes_of(n);
    const std::uint64_t fre = u.free_bytes();
    if (u.retired && fre != 0) return fail(name + ": retired but holds free extents");
    if (live != u.live || pend != u.pending || req != u.requested) {
      return fail(name + ": cached sums disagree with its blocks");
    }
    // used == canary + live + pending + dead, and the allocator tiles the rest:
    // bytes == canary + live + pending + free + dead
    if (used != kCanaryBytes + live + pend + u.dead) return fail(name + ": used space != canary + live + pending + dead");
    if (u.bytes != used + fre) return fail(name + ": bytes != canary + live + pending + free + dead");
    if (!u.retired && u.dead != 0) return fail(name + ": usable chunk with dead bytes");
    in_use += live;
    requested += req;
    pending += pend;
  }
  if (reserved != m.st.reserved_bytes) return fail("reserved_bytes != sum of chunk sizes");
  if (in_use != m.st.in_use_bytes || pending != m.st.pending_bytes ||
      requested != m.st.requested_bytes) {
    return fail("in_use/pending/requested totals disagree with the chunks");
  }
  if (chunks != m.st.chunks) return fail("chunk count disagrees");
  // Every pending block is filed once, under its own entry, by its open leases.
  if (pending_blocks != m.pending.size()) return fail("pending blocks and the pending list disagree");
  bool filed = true;
  m.pending.for_each([&](const Impl::BlockKey& k) {
    if (k.first >= m.units.size()) {
      filed = false;
      return;
    }
    const Unit& u = m.units[k.first];
    auto it = u.blocks.find(k.second);
    filed &= it != u.blocks.end() && it->second.pending && !it->second.uses.empty();
  });
  if (!filed) return fail("the pending list names a block that is not pending");
  std::string inner;
  if (!m.pending.validate([&](const Impl::BlockKey& k) -> const UseSet& { return m.block_at(k).uses; },
                          [&](const Impl::BlockKey& k) { return m.block_at(k).pending_id; }, &inner))
    return fail("pending blocks: " + inner);
  if (m.st.reserved_bytes > options_.budget_bytes) return fail("reserved exceeds the budget");
  if (m.st.pinned_allocs - m.st.pinned_frees != chunks) {
    return fail("pinned_allocs - pinned_frees != chunks held");
  }
  std::uint64_t registered = 0;
  for (const auto& [rid, r] : m.regions) {
    registered += r.bytes;
    std::uint64_t sum = 0;
    for (PinnedUnitId k = r.first; k <= r.last; ++k) {
      const Unit& u = m.units[k];
      if (u.kind != Unit::Kind::piece || u.region != rid || u.released) {
        return fail("region " + std::to_string(rid) + ": broken piece list");
      }
      if (u.raw != r.ptr + sum) return fail("region " + std::to_string(rid) + ": pieces not contiguous");
      sum += u.raw_bytes;
    }
    if (sum != r.bytes) return fail("region " + std::to_string(rid) + ": pieces do not cover it");
  }
  if (registered != m.st.registered_bytes) return fail("registered_bytes disagrees with the regions");
  return true;
}

}  // namespace ferry
