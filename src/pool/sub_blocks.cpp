// DevicePool: sub-blocks. A sub record is a handle over part of a live block
// (a graph's private pool carves the blocks it keeps into them, graph.hpp). It
// has a slot and a generation of its own, so I1 holds for it as for a block; it
// owns no memory, so its leases and stream order are its parent's, and nothing
// of the pool's placement, granules or stats sees it.
//   state sub  <=>  leases.parent is a live block with has_subs, listed in subs_of
//   a sub's bytes [addr, addr + span_of) lie inside its parent's block
#include <algorithm>

#include "core/invariant.hpp"
#include "pool/device_pool_impl.hpp"

namespace ferry {

std::uint32_t DevicePool::Impl::find_sub(DeviceHandle h) const {
  if (h.pool != id || h.slot >= blocks.size()) return kNoBlock;
  const Block& blk = blocks[h.slot];
  if (blk.generation != h.generation || blk.state != BlockState::sub) return kNoBlock;
  return h.slot;
}

void DevicePool::Impl::drop_sub(std::uint32_t s) {
  Block& blk = blocks[s];
  leases[s].parent = kNoBlock;
  blk.requested = 0;
  blk.addr = 0;
  // I1: as at a free, every copy of the handle goes stale; a slot that would wrap retires.
  if (blk.generation == kLastGeneration) {
    blk.state = BlockState::retired;
    ++retired_slots;
    return;
  }
  ++blk.generation;
  blk.state = BlockState::spare;
  spare.emplace_back(s);
}

void DevicePool::Impl::free_sub(std::uint32_t s) {
  const std::uint32_t b = leases[s].parent;
  auto it = subs_of.find(b);
  std::erase(it->second, s);
  if (it->second.empty()) {
    subs_of.erase(it);
    blocks[b].has_subs = false;
  }
  drop_sub(s);
}

void DevicePool::Impl::drop_subs(std::uint32_t b) {
  auto it = subs_of.find(b);
  if (it != subs_of.end()) {
    for (std::uint32_t s : it->second) drop_sub(s);
    subs_of.erase(it);
  }
  blocks[b].has_subs = false;
}

bool DevicePool::Impl::validate_subs(std::string* why) const {
  std::size_t listed = 0;
  for (const auto& [b, subs] : subs_of) {
    if (b >= blocks.size() || blocks[b].state != BlockState::live || !blocks[b].has_subs || subs.empty())
      return fail(why, "a sub-block list names no live block marked as having them");
    for (std::uint32_t s : subs) {
      if (s >= blocks.size() || blocks[s].state != BlockState::sub || leases[s].parent != b)
        return fail(why, "a listed sub-block is not a sub record of its block");
      const Block& parent = blocks[b];
      if (blocks[s].addr < parent.addr || blocks[s].addr + span_of(s) > parent.addr + size_of(parent))
        return fail(why, "a sub-block lies outside its block");
    }
    listed += subs.size();
  }
  std::size_t subs = 0;
  for (std::uint32_t b = 0; b < blocks.size(); ++b) {
    const bool sub = blocks[b].state == BlockState::sub;
    if (sub != (leases[b].parent != kNoBlock)) return fail(why, "a record's parent disagrees with its state");
    if (blocks[b].has_subs && subs_of.count(b) == 0) return fail(why, "a block marked with sub-blocks lists none");
    subs += sub;
  }
  if (subs != listed) return fail(why, "sub records and sub-block lists disagree in number");
  return true;
}

Result<DeviceHandle> DevicePool::sub_block(DeviceHandle parent, std::uint64_t offset, std::uint64_t bytes) {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  const std::uint32_t b = p.find_block(parent);
  if (b == Impl::kNoBlock) {
    if (p.find_sub(parent) != Impl::kNoBlock) {
      return make_error(ErrorCode::invalid_argument,
                        "sub_block of " + text::handle(parent) + ": it is a sub-block; name its block");
    }
    return p.stale(parent);
  }
  const std::uint64_t size = p.size_of(p.blocks[b]);
  if (bytes == 0 || offset % Impl::kAlign != 0 || offset > size || bytes > size - offset) {
    return make_error(ErrorCode::invalid_argument,
                      "sub_block [" + std::to_string(offset) + ", +" + std::to_string(bytes) + ") of block " +
                          text::handle(parent) + " of " + std::to_string(size) +
                          " bytes: it must be non-empty, start on a multiple of " + std::to_string(Impl::kAlign) +
                          " and lie inside the block");
  }
  const std::uint32_t s = p.new_block();
  Impl::Block& sub = p.blocks[s];
  sub.state = Impl::BlockState::sub;
  sub.addr = p.blocks[b].addr + offset;
  sub.requested = bytes;
  sub.stream = p.blocks[b].stream;
  p.leases[s].parent = b;
  p.subs_of[b].push_back(s);
  p.blocks[b].has_subs = true;
  const DeviceHandle h{p.id, s, sub.generation};
  if (p.note_blocks) p.backend.note_block(sub.addr, p.span_of(s), h, {});
  p.check();
  return h;
}

}  // namespace ferry
