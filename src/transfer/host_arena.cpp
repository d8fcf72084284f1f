// HostArena: blocks. Allocate and free over the chunks' free space (the placement
// core, best fit), pinning chunks within the budget, pending blocks until their
// transfers complete (I6), reclaim, trim and stats.
#include <algorithm>
#include <bit>
#include <cassert>
#include <cstring>
#include <new>

#include "core/testing_hooks.hpp"
#include "core/align.hpp"
#include "ferry/content.hpp"
#include "transfer/host_arena_impl.hpp"

namespace ferry {
namespace {

using detail::addr;
using detail::mib;
using detail::PlacementCore;
using Unit = detail::ArenaUnit;
using Region = detail::ArenaRegion;
using LiveBlock = detail::ArenaBlock;

constexpr std::uint64_t kPage = 4096;
// Seed of the constant canary pattern; mixed with the unit id so that two chunks
// never hold the same canary bytes.
constexpr std::uint64_t kCanarySeed = 0xc0ffee5eedull;

using detail::align_down;
using detail::align_up;

// What no state of the arena could serve (`alignment` at least kArenaAlignment):
// invalid_argument, or out_of_memory for a request larger than the whole budget.
std::optional<Error> refuse_request(std::uint64_t bytes, std::uint64_t alignment, const ArenaOptions& options,
                                    const std::string& request) {
  if (bytes == 0) return make_error(ErrorCode::invalid_argument, request + ": size 0");
  if (!std::has_single_bit(alignment) || alignment > options.chunk_bytes) {
    return make_error(ErrorCode::invalid_argument,
                      request + ": alignment " + std::to_string(alignment) +
                          " is not a power of two up to the chunk size");
  }
  const std::uint64_t budget = options.budget_bytes;
  const std::uint64_t extra = alignment > kArenaAlignment ? alignment : 0;
  if (bytes > budget || align_up(bytes, kArenaAlignment) + kCanaryBytes + extra > budget) {
    return make_error(ErrorCode::out_of_memory,
                      request + ": larger than the arena's whole pinned budget of " + mib(budget));
  }
  return std::nullopt;
}

}  // namespace

// Best fit over the usable chunks: the smallest free extent that holds the
// request at its alignment, of equal ones the lowest chunk, then the lowest offset.
std::optional<HostBlock> HostArena::Impl::try_fit(std::uint64_t need, std::uint64_t alignment) {
  std::optional<PlacementCore::Fit> best;
  PinnedUnitId best_id = 0;
  for (PinnedUnitId id = 0; id < units.size(); ++id) {
    const Unit& u = units[id];
    if (u.kind != Unit::Kind::chunk || u.released || u.retired) continue;
    auto fit = u.space->best_fit(need / PlacementCore::kAlign, alignment);
    if (fit && (!best || fit->extent < best->extent)) {
      best = fit;
      best_id = id;
    }
  }
  if (!best) return std::nullopt;
  return place(best_id, units[best_id].space->allocate_range(best->node, best->offset, need / PlacementCore::kAlign),
               need);
}

HostBlock HostArena::Impl::place(PinnedUnitId id, PlacementCore::Allocation a, std::uint64_t need) {
  Unit& u = units[id];
  const std::uint64_t at = a.offset * PlacementCore::kAlign;
  LiveBlock b;
  b.extent = need;
  b.serial = next_serial++;
  b.node = a.node;
  const std::uint64_t serial = b.serial;
  u.blocks.emplace(at, std::move(b));
  u.live += need;
  st.in_use_bytes += need;
  st.peak_in_use_bytes = std::max(st.peak_in_use_bytes, st.in_use_bytes);
  ++st.allocs;
  return HostBlock{u.base + at, 0, id, at, serial};
}

// A new chunk over the pinned memory `raw` of `size` bytes: its canary written,
// the rest free.
PinnedUnitId HostArena::Impl::add_chunk(std::byte* raw, std::uint64_t size) {
  const auto id = static_cast<PinnedUnitId>(units.size());
  Unit u;
  u.kind = Unit::Kind::chunk;
  u.raw = raw;
  u.raw_bytes = size;
  const std::uint64_t shift = align_up(addr(u.raw), kArenaAlignment) - addr(u.raw);
  u.base = u.raw + shift;
  // The alignment shift and the tail below 256 bytes lie outside
  // [base, base + bytes): overhead, not dead space.
  u.bytes = align_down(size - shift, kArenaAlignment);
  u.space = std::make_unique<PlacementCore>(addr(u.base), u.bytes, PlacementCore::kNoGranules);
  [[maybe_unused]] const auto canary = u.space->allocate(kCanaryBytes / PlacementCore::kAlign);
  assert(canary && canary->offset == 0 && "a fresh range's first node starts it");
  fill_pattern(kCanarySeed ^ splitmix64(id), 0, {u.base, kCanaryBytes});
  units.push_back(std::move(u));
  by_addr.emplace(addr(units[id].base), id);
  st.reserved_bytes += size;
  st.peak_reserved_bytes = std::max(st.peak_reserved_bytes, st.reserved_bytes);
  ++st.chunks;
  ++st.pinned_allocs;
  return id;
}

// Returns a freed (or retired pending) block's extent to the chunk; a retired
// chunk's space is withdrawn for good, so there its node stays, dead.
void HostArena::Impl::drop_block(PinnedUnitId id, std::map<std::uint64_t, LiveBlock>::iterator it) {
  Unit& u = units[id];
  const LiveBlock& b = it->second;
  if (b.pending) {
    u.pending -= b.extent;
    st.pending_bytes -= b.extent;
  } else {
    u.live -= b.extent;
    u.requested -= b.requested;
    st.in_use_bytes -= b.extent;
    st.requested_bytes -= b.requested;
  }
  if (u.retired) u.dead += b.extent;
  else u.space->free(b.node);
  u.blocks.erase(it);
}

// A retiring chunk's free extents become dead: nodes that no block owns.
void HostArena::Impl::withdraw_free(Unit& u) {
  std::vector<std::pair<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>>> extents;
  u.space->space().for_each_free(
      [&](std::uint32_t node, std::uint64_t off, std::uint64_t n) { extents.push_back({node, {off, n}}); });
  for (const auto& [node, range] : extents) {
    (void)u.space->allocate_range(node, range.first, range.second);
    u.dead += range.second * PlacementCore::kAlign;
  }
}

// Pending blocks whose transfers completed rejoin the free space; retired chunks
// nothing uses any more are handed back in *release (freed after unlocking).
void HostArena::Impl::reclaim(StreamOrder& order, std::vector<std::byte*>* release) {
  pending.retire(
      order, [&](const BlockKey& k) -> UseSet& { return block_at(k).uses; },
      [&](const BlockKey& k) { drop_block(k.first, units[k.first].blocks.find(k.second)); });
  std::size_t rkeep = 0;
  for (std::size_t i = 0; i < retired_chunks.size(); ++i) {
    const PinnedUnitId id = retired_chunks[i];
    if (!release_if_idle(id, order, release)) retired_chunks[rkeep++] = id;
  }
  retired_chunks.resize(rkeep);
}

bool HostArena::Impl::release_if_idle(PinnedUnitId id, StreamOrder& order, std::vector<std::byte*>* release) {
  Unit& u = units[id];
  if (u.released) return true;
  if (!u.blocks.empty() || !u.canary_uses.retire(order)) return false;
  u.space.reset();
  u.released = true;
  by_addr.erase(addr(u.base));
  st.reserved_bytes -= u.raw_bytes;
  --st.chunks;
  ++st.pinned_frees;
  release->push_back(u.raw);
  return true;
}

// Releases every usable chunk that holds no block (into *release, freed after unlocking).
void HostArena::Impl::release_idle(StreamOrder& order, std::vector<std::byte*>* release) {
  for (PinnedUnitId id = 0; id < units.size(); ++id) {
    const Unit& u = units[id];
    if (u.kind == Unit::Kind::chunk && !u.released && !u.retired && u.blocks.empty()) release_if_idle(id, order, release);
  }
}

// Pinned bytes of usable chunks that hold no block.
std::uint64_t HostArena::Impl::idle_bytes() const {
  std::uint64_t idle = 0;
  for (const Unit& u : units) {
    if (u.kind == Unit::Kind::chunk && !u.released && !u.retired && u.blocks.empty()) idle += u.raw_bytes;
  }
  return idle;
}

std::uint64_t HostArena::Impl::largest_free() const {
  std::uint64_t best = 0;
  for (const Unit& u : units) {
    if (u.kind == Unit::Kind::chunk && !u.released && !u.retired)
      best = std::max(best, u.space->space().largest_free() * PlacementCore::kAlign);
  }
  return best;
}

ArenaStats HostArena::Impl::snapshot() const {
  ArenaStats s = st;
  s.free_bytes = 0;
  for (const Unit& u : units) {
    if (u.kind == Unit::Kind::chunk && !u.released) s.free_bytes += u.free_bytes();
  }
  s.overhead_bytes = s.reserved_bytes - s.in_use_bytes - s.pending_bytes - s.free_bytes;
  s.largest_free_bytes = largest_free();
  s.regions = regions.size();
  return s;
}

HostArena::HostArena(StreamOrder& order, ArenaOptions options)
    : order_(order), options_(options), impl_(std::make_unique<Impl>()) {
  if (options_.chunk_bytes < 2 * kCanaryBytes) options_.chunk_bytes = 2 * kCanaryBytes;
  options_.chunk_bytes = align_up(options_.chunk_bytes, kArenaAlignment);
  if (options_.register_piece_bytes == 0) options_.register_piece_bytes = std::uint64_t{64} << 20;
  impl_->st.budget_bytes = options_.budget_bytes;
}

HostArena::~HostArena() {
  // Wait for every reader, then hand everything back. A reader that never
  // completes (the wait timed out) keeps its memory pinned: leaking beats
  // releasing memory a copy still reads (I2).
  Impl& m = *impl_;
  UseSet all;
  {
    std::lock_guard lock(m.mu);
    for (const Unit& u : m.units) {
      all.merge(u.canary_uses);
      for (const auto& [off, b] : u.blocks) all.merge(b.uses);
    }
    for (const auto& [id, r] : m.regions) all.merge(r.uses);
  }
  const bool drained = order_.wait(all).ok();
  Backend& backend = order_.backend();
  std::lock_guard lock(m.mu);
  if (!drained) return;
  for (Unit& u : m.units) {
    if (u.released) continue;
    if (u.kind == Unit::Kind::chunk) {
      (void)backend.free_pinned(u.raw);
    } else {
      (void)backend.unregister_host(u.raw);
    }
    u.released = true;
  }
}

Result<HostBlock> HostArena::allocate(std::uint64_t bytes, std::uint64_t alignment) {
  Impl& m = *impl_;
  const std::string request = "host arena allocate(" + std::to_string(bytes) + " bytes)";
  if (alignment < kArenaAlignment) alignment = kArenaAlignment;
  if (auto refused = refuse_request(bytes, alignment, options_, request)) {
    if (refused->code == ErrorCode::out_of_memory) {
      std::lock_guard lock(m.mu);
      ++m.st.failed_allocs;
    }
    return *std::move(refused);
  }
  const std::uint64_t budget = options_.budget_bytes;
  const std::uint64_t extra = alignment > kArenaAlignment ? alignment : 0;
  const std::uint64_t need = align_up(bytes, kArenaAlignment);
  // A chunk that can hold the request whatever its alignment.
  const std::uint64_t min_chunk = align_up(need + kCanaryBytes + extra, kPage);
  Backend& backend = order_.backend();
  bool waited = false;
  std::vector<std::byte*> release;
  auto release_now = [&] {
    for (std::byte* p : release) (void)backend.free_pinned(p);
    release.clear();
  };

  for (int round = 0; round < 8; ++round) {
    std::unique_lock lock(m.mu);
    m.reclaim(order_, &release);
    if (auto b = m.try_fit(need, alignment)) {
      Unit& u = m.units[b->chunk];
      LiveBlock& lb = u.blocks.at(b->offset);
      lb.requested = bytes;
      u.requested += bytes;
      m.st.requested_bytes += bytes;
      b->bytes = bytes;
      check();
      lock.unlock();
      release_now();
      // The program writes its block next: a copy that still reads it would race.
      backend.note_host_access(b->data, bytes, Access::write);
      return *b;
    }
    const std::uint64_t held = m.st.reserved_bytes + m.reserving;
    const std::uint64_t room = budget > held ? budget - held : 0;
    std::uint64_t size = std::min(options_.chunk_bytes, room);
    size = std::max(size, min_chunk);
    if (size <= room) {
      m.reserving += size;
      lock.unlock();
      release_now();
      Result<std::byte*> raw = backend.allocate_pinned(size);
      lock.lock();
      m.reserving -= size;
      if (!raw.ok()) {
        ++m.st.failed_allocs;
        Error e = std::move(raw).error();
        e.message = request + ": the backend refused a " + mib(size) + " pinned chunk: " + e.message;
        return e;
      }
      m.add_chunk(*raw, size);
      continue;
    }
    // Budget exhausted. First, empty chunks too small for this request give their
    // budget back (rare: only a request larger than what is free triggers it).
    const std::uint64_t idle = m.idle_bytes();
    if (idle > 0 && min_chunk <= room + idle) {
      m.release_idle(order_, &release);
      continue;
    }
    if (options_.wait_for_pending && !waited && !m.pending.empty()) {
      UseSet uses;
      m.pending.for_each([&](const Impl::BlockKey& k) { uses.merge(m.block_at(k).uses); });
      ++m.st.waits;
      waited = true;
      lock.unlock();
      release_now();
      // Waiting without the lock: frees and leases on other blocks go on meanwhile.
      auto w = order_.wait(uses);
      if (!w.ok()) {
        std::lock_guard relock(m.mu);
        ++m.st.failed_allocs;
        Error e = std::move(w).error();
        e.message = request + ": waiting for pending blocks: " + e.message;
        return e;
      }
      continue;
    }
    break;
  }
  std::unique_lock lock(m.mu);
  ++m.st.failed_allocs;
  const ArenaStats s = m.snapshot();
  lock.unlock();
  release_now();
  return make_error(ErrorCode::out_of_memory,
                    request + ": no room in the pinned budget: budget " + mib(s.budget_bytes) +
                        ", reserved " + mib(s.reserved_bytes) + ", in use " +
                        mib(s.in_use_bytes) + ", pending " + mib(s.pending_bytes) +
                        ", largest free " + mib(s.largest_free_bytes));
}

Result<void> HostArena::free(const HostBlock& block) {
  Impl& m = *impl_;
  std::vector<std::byte*> release;
  {
    std::lock_guard lock(m.mu);
    auto stale = [&] {
      return make_error(ErrorCode::stale_handle,
                        "host arena free(chunk " + std::to_string(block.chunk) + ", offset " +
                            std::to_string(block.offset) + ", serial " +
                            std::to_string(block.serial) +
                            "): not a live block (double free, or forged)");
    };
    if (block.serial == 0 || block.chunk >= m.units.size()) return stale();
    Unit& u = m.units[block.chunk];
    if (u.kind != Unit::Kind::chunk || u.released) return stale();
    auto it = u.blocks.find(block.offset);
    if (it == u.blocks.end() || it->second.serial != block.serial || it->second.pending) {
      return stale();
    }
    ++m.st.frees;
    if (it->second.uses.retire(order_) || testing_hooks::dropped(testing_hooks::WaitSite::arena_lease)) {
      m.drop_block(block.chunk, it);
    } else {
      // A transfer still reads it: park it until that transfer completed (I6).
      LiveBlock& b = it->second;
      b.pending = true;
      u.live -= b.extent;
      u.requested -= b.requested;
      u.pending += b.extent;
      m.st.in_use_bytes -= b.extent;
      m.st.requested_bytes -= b.requested;
      m.st.pending_bytes += b.extent;
      ++m.st.pending_frees;
      b.pending_id = m.pending.file({block.chunk, block.offset}, b.uses);
    }
    if (u.retired && u.blocks.empty()) m.reclaim(order_, &release);
    check();
  }
  for (std::byte* p : release) (void)order_.backend().free_pinned(p);
  return {};
}

Result<void> HostArena::free_ptr(const void* data) {
  HostBlock block;
  {
    Impl& m = *impl_;
    std::lock_guard lock(m.mu);
    PinnedUnitId id = 0;
    const Unit* u = m.unit_at(addr(data), &id);
    bool found = false;
    if (u != nullptr && u->kind == Unit::Kind::chunk) {
      auto it = u->blocks.find(addr(data) - addr(u->base));
      if (it != u->blocks.end() && !it->second.pending) {
        block = HostBlock{u->base + it->first, it->second.requested, id, it->first,
                          it->second.serial};
        found = true;
      }
    }
    if (!found) {
      return make_error(ErrorCode::stale_handle,
                        "host arena free_ptr: no live block starts at that address");
    }
  }
  return free(block);
}

Result<std::uint64_t> HostArena::trim() {
  Impl& m = *impl_;
  std::vector<std::byte*> release;
  std::uint64_t bytes = 0;
  {
    std::lock_guard lock(m.mu);
    m.reclaim(order_, &release);
    for (PinnedUnitId id = 0; id < m.units.size(); ++id) {
      Unit& u = m.units[id];
      if (u.kind != Unit::Kind::chunk || u.released || u.retired || !u.blocks.empty()) continue;
      if (m.release_if_idle(id, order_, &release)) bytes += u.raw_bytes;
    }
  }
  Result<void> first;
  for (std::byte* p : release) {
    auto r = order_.backend().free_pinned(p);
    if (!r.ok() && first.ok()) first = std::move(r).error();
  }
  if (!first.ok()) return std::move(first).error();
  return bytes;
}

ArenaStats HostArena::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->snapshot();
}

void* HostArenaResource::do_allocate(std::size_t bytes, std::size_t alignment) {
  auto b = arena_.allocate(bytes == 0 ? 1 : bytes, alignment);
  if (!b.ok()) throw std::bad_alloc();  // pmr's contract (see the header)
  return b->data;
}

void HostArenaResource::do_deallocate(void* p, std::size_t, std::size_t) {
  [[maybe_unused]] auto r = arena_.free_ptr(p);
  assert(r.ok() && "pmr deallocate of a pointer this arena did not hand out");
}

bool HostArenaResource::do_is_equal(const std::pmr::memory_resource& other) const noexcept {
  return this == &other;
}

}  // namespace ferry
