// DevicePool: leases. A freed block whose work has not completed stays pending
// (its granules mapped, I2; filed in pending_blocks.hpp) until its leases retire;
// a block placed over it inherits them (I3).
#include "core/testing_hooks.hpp"
#include "pool/device_pool_impl.hpp"

namespace ferry {

void DevicePool::Impl::drop_marked(std::uint32_t b) {
  Block& blk = blocks[b];
  blk.pending_id = kNoBlock;
  leases[b].uses.clear();  // keeps its capacity: steady state allocates nothing
  leases[b].ready_after = {};
  leases[b].pending_size = 0;
  blk.leased = blk.ready_set = false;
  if (blk.slot_retired) {
    blk.state = BlockState::retired;
    ++retired_slots;
    return;
  }
  blk.state = BlockState::spare;
  spare.emplace_back(b);
}

void DevicePool::Impl::file_leased(std::uint32_t b, std::uint64_t size) {
  UseSet& uses = leases[b].uses;
  if (uses.empty() || uses.retire(order)) {
    release_block(b, size);
    return;
  }
  Block& blk = blocks[b];
  Region& r = regions[blk.region];
  r.place.free(blk.node);
  blk.node = detail::OffsetAllocator::kNone;
  // Its references move from the live count to the pending one: nothing unmaps.
  auto [first, last] = r.place.granule_span(blk.addr, size);
  for (std::uint64_t g = first; g <= last; ++g) r.place.drop_ref(g);
  r.map.take_pending(first, last);
  blk.state = BlockState::pending;
  leases[b].pending_size = size;
  file_pending(b);
}

// Enters pending block b in the address index and the retirement lists.
void DevicePool::Impl::file_pending(std::uint32_t b) {
  Block& blk = blocks[b];
  st.pending_free_bytes += leases[b].pending_size;
  regions[blk.region].pending_at.emplace(blk.addr, b);
  blk.pending_id = pending.file(b, leases[b].uses);
}

// Takes pending block b out of the retirement lists and the address index; the
// caller releases its granules or keeps them for what replaces it.
void DevicePool::Impl::unfile_pending(std::uint32_t b) {
  st.pending_free_bytes -= leases[b].pending_size;
  regions[blocks[b].region].pending_at.erase(blocks[b].addr);
  pending.remove(blocks[b].pending_id);
  blocks[b].pending_id = kNoBlock;
}

// A pending block whose leases all retired, out of its retirement list: its
// granules may unmap now (I2).
void DevicePool::Impl::retire_block(std::uint32_t b) {
  const std::uint64_t size = leases[b].pending_size;
  st.pending_free_bytes -= size;
  Region& r = regions[blocks[b].region];
  r.pending_at.erase(blocks[b].addr);
  release_granules</*pending=*/true>(r, blocks[b].addr, size);
  drop_record(b);
}

void DevicePool::Impl::retire_completed() {
  pending.retire(
      order, [&](std::uint32_t b) -> UseSet& { return leases[b].uses; },
      [&](std::uint32_t b) {
        blocks[b].pending_id = kNoBlock;
        retire_block(b);
      });
  // active_bytes follows pending_free_bytes, which the sweep lowered.
  note_peaks();
}

void DevicePool::Impl::take_over_pending(std::uint8_t ri, std::uint32_t nb, std::uint64_t addr,
                                         std::uint64_t size) {
  auto& index = regions[ri].pending_at;
  const std::uint64_t end = addr + size;
  auto it = index.upper_bound(addr);
  if (it != index.begin()) {
    auto prev = std::prev(it);
    if (prev->first + leases[prev->second].pending_size > addr) it = prev;
  }
  while (it != index.end() && it->first < end) {
    const std::uint32_t b = it->second;
    ++it;  // unfile_pending erases b's entry
    unfile_pending(b);
    const std::uint64_t b_addr = blocks[b].addr, b_end = b_addr + leases[b].pending_size;
    if (!leases[b].uses.retire(order)) {
      blocks[nb].leased = true;
      leases[nb].uses.merge(leases[b].uses);
      // The parts outside the new block stay pending under the same leases; their
      // references are taken before b's are dropped, so no granule unmaps between.
      if (b_addr < addr) split_pending(b, b_addr, addr - b_addr);
      if (b_end > end) split_pending(b, end, b_end - end);
    }
    release_granules</*pending=*/true>(regions[ri], b_addr, b_end - b_addr);
    drop_record(b);  // a slot retired at its last generation retires here (I1)
  }
}

// A new pending block over [addr, addr+size), part of pending block `from`, with its leases.
void DevicePool::Impl::split_pending(std::uint32_t from, std::uint64_t addr, std::uint64_t size) {
  const std::uint32_t p = new_block();  // may reallocate blocks: take references after
  Block& part = blocks[p];
  const Block& src = blocks[from];
  part.region = src.region;
  part.state = BlockState::pending;
  part.stream = src.stream;
  part.addr = addr;
  part.leased = true;
  leases[p].uses = leases[from].uses;
  leases[p].pending_size = size;
  Region& r = regions[part.region];
  auto [first, last] = r.place.granule_span(addr, size);
  r.map.take_pending(first, last);
  file_pending(p);
}

Result<Ticket> DevicePool::Impl::order_after(StreamId stream, StreamPoint after) {
  if (testing_hooks::dropped(testing_hooks::WaitSite::pool_reuse)) return Ticket{0};
  return order.order_after(stream, after, StreamOrder::HeldWork::dispatch);
}

// Orders the new block after the work it inherited: later work on `stream`
// follows it by FIFO for its own points and by event waits for the others
// (enqueued by allocate, outside the lock); other streams wait for `stream`
// past that point (make_ready). Returns the points `stream` must wait for.
UseSet DevicePool::Impl::foreign_points(std::uint32_t b, StreamId stream) {
  UseSet& uses = leases[b].uses;
  UseSet foreign;
  if (uses.empty() || uses.retire(order)) return foreign;
  bool own = false;
  for (const StreamPoint& p : uses.points()) {
    if (p.stream == stream) {
      blocks[b].ready_set = true;
      leases[b].ready_after = p;
      own = true;
    } else {
      foreign.add(p);
    }
  }
  if (own && foreign.empty()) ++st.same_stream_reuses;
  return foreign;
}

Result<DeviceHandle> DevicePool::Impl::order_inherited(DeviceHandle h, StreamId stream) {
  const UseSet foreign = blocks[h.slot].leased ? foreign_points(h.slot, stream) : UseSet{};
  if (foreign.empty()) {
    settle();
    check();
    return h;
  }
  check();
  Ticket last = 0;
  Result<void> ordered;
  without_lock([&](bool) {
    for (const StreamPoint& point : foreign.points()) {
      Result<Ticket> t = order_after(stream, point);
      if (!t.ok()) {
        ordered = std::move(t).error();
        break;
      }
      last = std::max(last, *t);
    }
  });
  // Only a forged copy of h can have freed the block meanwhile: then nothing is left to order.
  const std::uint32_t b = find_block(h);
  if (!ordered.ok()) {
    if (b != kNoBlock) {  // backend_error: nothing allocated, so neither an alloc nor a free is counted
      const bool internal = blocks[b].internal;
      release_handle(b);
      --(internal ? st.internal_allocs : st.allocs);
      --(internal ? st.internal_frees : st.frees);
    }
    settle();
    check();
    return std::move(ordered).error();
  }
  // Other streams wait for `stream` past these waits (make_ready).
  if (b != kNoBlock && last != 0) {
    blocks[b].ready_set = true;
    leases[b].ready_after = {stream, last};
  }
  return h;
}

// The spare list and the pending lists: each record listed where its state says.
// Marks each record in is_spare and filed.
bool DevicePool::Impl::validate_lists(std::string* why, std::vector<std::uint8_t>& is_spare,
                                      std::vector<std::uint8_t>& filed) const {
  if (leases.size() != blocks.size()) return fail(why, "lease records and blocks disagree in number");
  is_spare.assign(blocks.size(), 0);
  for (std::uint32_t b : spare) {
    if (b >= blocks.size() || is_spare[b]++) return fail(why, "spare record listed twice or out of range");
    if (blocks[b].state != BlockState::spare) return fail(why, "a listed spare record holds a block");
  }
  filed.assign(blocks.size(), 0);
  bool in_range = true;
  pending.for_each([&](std::uint32_t b) {
    if (b < blocks.size()) ++filed[b];
    else in_range = false;
  });
  if (!in_range) return fail(why, "a pending entry names no record");
  return pending.validate([&](std::uint32_t b) -> const UseSet& { return leases[b].uses; },
                          [&](std::uint32_t b) { return blocks[b].pending_id; }, why);
}

// Every record against its state, the address index of pending blocks, and the
// byte counts; counts each block's granule references into t.
bool DevicePool::Impl::validate_blocks(std::string* why, const std::vector<std::uint8_t>& is_spare,
                                       const std::vector<std::uint8_t>& filed, ValidateTally& t) const {
  std::uint64_t retired = 0;
  for (std::uint32_t b = 0; b < blocks.size(); ++b) {
    const Block& blk = blocks[b];
    if (blk.generation == 0) return fail(why, "slot generation 0");
    if (blk.state == BlockState::spare && !is_spare[b]) return fail(why, "a spare record is not listed");
    if (blk.state == BlockState::retired) ++retired;
    if (!has_block(blk)) {
      if (filed[b]) return fail(why, "a record without a block is on a pending list");
      if (blk.leased || blk.ready_set || !leases[b].uses.empty())
        return fail(why, "a record without a block keeps its leases");
      continue;
    }
    const Region& r = regions[blk.region];
    if (blk.slot_retired && (blk.state != BlockState::pending || blk.generation != kLastGeneration))
      return fail(why, "a slot retires with a block that is not pending at the last generation");
    if (!blk.leased && !leases[b].uses.empty()) return fail(why, "a block not marked leased holds a lease");
    if (!blk.ready_set && leases[b].ready_after != StreamPoint{}) return fail(why, "a ready point is set unmarked");
    if (blk.state == BlockState::live) {
      if (blk.node >= r.place.space().node_count() || !r.place.space().is_used(blk.node) ||
          r.place.addr_of(r.place.space().offset_of(blk.node)) != blk.addr)
        return fail(why, "block disagrees with its allocator node");
      if (leases[b].pending_size != 0) return fail(why, "a live block keeps a pending size");
    }
    const std::uint64_t size = block_size(b);
    if (blk.addr % kAlign || size % kAlign || size == 0) return fail(why, "misaligned block");
    if (blk.state == BlockState::live) {
      if (filed[b]) return fail(why, "live block is on a pending list");
      t.live += size;
      t.requested += blk.requested;
    } else {
      if (filed[b] != 1) return fail(why, "pending block not filed exactly once");
      if (leases[b].uses.empty()) return fail(why, "pending block has no open lease");
      if (blk.node != detail::OffsetAllocator::kNone) return fail(why, "a pending block holds an allocator node");
      auto at = r.pending_at.find(blk.addr);
      if (at == r.pending_at.end() || at->second != b) return fail(why, "a pending block is not in the address index");
      t.pending += size;
    }
    auto [first, last] = r.place.granule_span(blk.addr, size);
    if (last >= r.place.granules()) return fail(why, "a block lies beyond the granule arrays");
    auto& counts = blk.state == BlockState::live ? t.refs : t.pending_refs;
    for (std::uint64_t g = first; g <= last; ++g) ++counts[blk.region][g];
  }
  for (const Mapping& m : mapping) {  // a placement being mapped holds references, no block yet
    auto [first, last] = regions[m.region].place.granule_span(m.addr, m.size);
    for (std::uint64_t g = first; g <= last; ++g) ++t.refs[m.region][g];
  }
  // Pending blocks are disjoint from each other and from every live block: a
  // live block's range overlapping one would mean placement skipped inheriting it.
  std::uint64_t indexed = 0;
  for (const Region& r : regions) {
    std::uint64_t end = 0;
    for (const auto& [addr, b] : r.pending_at) {
      if (b >= blocks.size() || blocks[b].state != BlockState::pending || blocks[b].addr != addr)
        return fail(why, "address index is stale");
      if (addr < end) return fail(why, "two pending blocks overlap");
      end = addr + leases[b].pending_size;
      ++indexed;
    }
  }
  for (std::uint32_t b = 0; b < blocks.size(); ++b) {
    if (blocks[b].state != BlockState::live) continue;
    const auto& index = regions[blocks[b].region].pending_at;
    auto it = index.lower_bound(blocks[b].addr + size_of(blocks[b]));
    if (it != index.begin() && std::prev(it)->first + leases[std::prev(it)->second].pending_size > blocks[b].addr)
      return fail(why, "a live block overlaps a pending one");
  }
  if (indexed != pending.size()) return fail(why, "address index and pending lists disagree");
  if (retired != retired_slots) return fail(why, "retired slot count wrong");
  // live + pending_free <= reserved <= capacity
  if (t.live != st.allocated_bytes) return fail(why, "allocated_bytes disagrees with live blocks");
  if (t.requested != st.requested_bytes) return fail(why, "requested_bytes disagrees with live blocks");
  if (t.pending != st.pending_free_bytes) return fail(why, "pending_free_bytes disagrees with pending blocks");
  return true;
}

}  // namespace ferry
