#include "ferry/host_arena.hpp"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <tuple>
#include <utility>

#include "core/invariant.hpp"
#include "core/testing_hooks.hpp"
#include "core/text.hpp"
#include "ferry/content.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kPage = 4096;
// Seed of the constant canary pattern; mixed with the unit id so that two chunks
// never hold the same canary bytes.
constexpr std::uint64_t kCanarySeed = 0xc0ffee5eedull;

constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
constexpr std::uint64_t align_down(std::uint64_t v, std::uint64_t a) { return v / a * a; }

std::string mib(std::uint64_t bytes) { return text::human_bytes(bytes, 1, text::ByteUnit::MiB); }

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

struct LiveBlock {
  std::uint64_t extent = 0;     // bytes occupied in the chunk, a multiple of 256
  std::uint64_t requested = 0;
  std::uint64_t serial = 0;
  bool pending = false;
  UseSet uses;
};

struct Unit {
  enum class Kind : std::uint8_t { chunk, piece } kind = Kind::chunk;
  std::byte* raw = nullptr;      // what allocate_pinned returned / the piece start
  std::uint64_t raw_bytes = 0;   // pinned or registered size
  std::byte* base = nullptr;     // chunk: 256-aligned start of the managed bytes
  std::uint64_t bytes = 0;       // chunk: managed bytes (multiple of 256)
  bool retired = false;
  bool released = false;         // chunk freed / piece unregistered: a tombstone
  std::string retire_reason;
  UseSet canary_uses;            // canary copies still reading the unit
  RegionId region = 0;           // piece: its region
  // Chunk allocator state. Offsets are relative to base.
  std::map<std::uint64_t, std::uint64_t> free;    // offset -> bytes, coalesced
  std::map<std::uint64_t, LiveBlock> blocks;      // offset -> live or pending block
  std::uint64_t live = 0, requested = 0, pending = 0, free_total = 0, dead = 0;
};

struct Region {
  std::byte* ptr = nullptr;
  std::uint64_t bytes = 0;
  PinnedUnitId first = 0, last = 0;
  bool closing = false;  // unregister_host() in progress: no new leases
  UseSet uses;
};

}  // namespace

struct HostArena::Impl {
  mutable std::mutex mu;
  std::mutex register_mu;  // serializes register/unregister (backend calls run unlocked)

  std::vector<Unit> units;                             // index = PinnedUnitId
  std::set<std::tuple<std::uint64_t, PinnedUnitId, std::uint64_t>> by_size;  // free extents
  std::map<std::uintptr_t, PinnedUnitId> by_addr;      // live units by start address
  std::map<RegionId, Region> regions;
  RegionId next_region = 1;
  std::vector<std::pair<PinnedUnitId, std::uint64_t>> pending;  // pending blocks
  std::vector<PinnedUnitId> retired_chunks;             // retired, not yet released
  std::uint64_t next_serial = 1;
  std::uint64_t reserving = 0;  // budget promised to allocate_pinned calls in flight
  ArenaStats st;

  // --- everything below runs with mu held

  void add_free(PinnedUnitId id, std::uint64_t off, std::uint64_t len) {
    Unit& u = units[id];
    if (u.retired) {  // a retired chunk's space is withdrawn for good
      u.dead += len;
      return;
    }
    u.free_total += len;
    auto next = u.free.lower_bound(off);
    if (next != u.free.end() && off + len == next->first) {
      by_size.erase({next->second, id, next->first});
      len += next->second;
      next = u.free.erase(next);
    }
    if (next != u.free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        by_size.erase({prev->second, id, prev->first});
        off = prev->first;
        len += prev->second;
        u.free.erase(prev);
      }
    }
    u.free.emplace(off, len);
    by_size.insert({len, id, off});
  }

  void take_free(PinnedUnitId id, std::uint64_t off, std::uint64_t len) {
    Unit& u = units[id];
    by_size.erase({len, id, off});
    u.free.erase(off);
    u.free_total -= len;
  }

  std::optional<HostBlock> try_fit(std::uint64_t need, std::uint64_t alignment) {
    for (auto it = by_size.lower_bound({need, 0, 0}); it != by_size.end(); ++it) {
      const auto [len, id, off] = *it;
      Unit& u = units[id];
      const std::uint64_t at = align_up(addr(u.base) + off, alignment) - addr(u.base);
      const std::uint64_t pad = at - off;
      if (pad + need > len) continue;
      take_free(id, off, len);
      if (pad > 0) add_free(id, off, pad);
      if (len > pad + need) add_free(id, at + need, len - pad - need);
      return place(id, at, need);
    }
    return std::nullopt;
  }

  HostBlock place(PinnedUnitId id, std::uint64_t at, std::uint64_t need) {
    Unit& u = units[id];
    LiveBlock b;
    b.extent = need;
    b.serial = next_serial++;
    u.blocks.emplace(at, std::move(b));
    u.live += need;
    st.in_use_bytes += need;
    st.peak_in_use_bytes = std::max(st.peak_in_use_bytes, st.in_use_bytes);
    ++st.allocs;
    return HostBlock{u.base + at, 0, id, at, u.blocks.at(at).serial};
  }

  // Returns a freed (or retired pending) block's extent to the chunk.
  void drop_block(PinnedUnitId id, std::map<std::uint64_t, LiveBlock>::iterator it) {
    Unit& u = units[id];
    const std::uint64_t off = it->first, extent = it->second.extent;
    if (it->second.pending) {
      u.pending -= extent;
      st.pending_bytes -= extent;
    } else {
      u.live -= extent;
      u.requested -= it->second.requested;
      st.in_use_bytes -= extent;
      st.requested_bytes -= it->second.requested;
    }
    u.blocks.erase(it);
    add_free(id, off, extent);
  }

  // Pending blocks whose transfers completed rejoin the free space; retired chunks
  // nothing uses any more are handed back in *release (freed after unlocking).
  void reclaim(StreamOrder& order, std::vector<std::byte*>* release) {
    std::size_t keep = 0;
    for (std::size_t i = 0; i < pending.size(); ++i) {
      const auto [id, off] = pending[i];
      Unit& u = units[id];
      auto it = u.blocks.find(off);
      if (it == u.blocks.end() || !it->second.pending) continue;  // already gone
      if (it->second.uses.retire(order)) {
        drop_block(id, it);
      } else {
        pending[keep++] = pending[i];
      }
    }
    pending.resize(keep);
    std::size_t rkeep = 0;
    for (std::size_t i = 0; i < retired_chunks.size(); ++i) {
      const PinnedUnitId id = retired_chunks[i];
      if (!release_if_idle(id, order, release)) retired_chunks[rkeep++] = id;
    }
    retired_chunks.resize(rkeep);
  }

  bool release_if_idle(PinnedUnitId id, StreamOrder& order, std::vector<std::byte*>* release) {
    Unit& u = units[id];
    if (u.released) return true;
    if (!u.blocks.empty() || !u.canary_uses.retire(order)) return false;
    for (const auto& [off, len] : u.free) by_size.erase({len, id, off});
    u.free.clear();
    u.free_total = 0;
    u.released = true;
    by_addr.erase(addr(u.base));
    st.reserved_bytes -= u.raw_bytes;
    --st.chunks;
    ++st.pinned_frees;
    release->push_back(u.raw);
    return true;
  }

  std::uint64_t largest_free() const {
    return by_size.empty() ? 0 : std::get<0>(*by_size.rbegin());
  }

  // The unit whose [start, start + size) holds p, or nullptr.
  const Unit* unit_at(std::uintptr_t p, PinnedUnitId* id_out) const {
    auto it = by_addr.upper_bound(p);
    if (it == by_addr.begin()) return nullptr;
    --it;
    const Unit& u = units[it->second];
    const std::uintptr_t start = u.kind == Unit::Kind::chunk ? addr(u.base) : addr(u.raw);
    const std::uint64_t size = u.kind == Unit::Kind::chunk ? u.bytes : u.raw_bytes;
    if (p - start >= size) return nullptr;
    *id_out = it->second;
    return &u;
  }

  std::optional<HostRangeInfo> locate(const std::byte* ptr, std::uint64_t bytes) const {
    if (ptr == nullptr || bytes == 0 || addr(ptr) > UINTPTR_MAX - bytes) return std::nullopt;
    PinnedUnitId id = 0;
    const Unit* u = unit_at(addr(ptr), &id);
    if (u == nullptr) return std::nullopt;
    HostRangeInfo info;
    if (u->kind == Unit::Kind::chunk) {
      const std::uint64_t off = addr(ptr) - addr(u->base);
      auto it = u->blocks.upper_bound(off);
      if (it == u->blocks.begin()) return std::nullopt;
      --it;
      const LiveBlock& b = it->second;
      if (b.pending || off - it->first >= b.requested || bytes > b.requested - (off - it->first)) {
        return std::nullopt;
      }
      info.kind = HostRangeInfo::Kind::block;
      info.first_unit = info.last_unit = id;
      info.retired = u->retired;
      info.block = HostBlock{u->base + it->first, b.requested, id, it->first, b.serial};
      return info;
    }
    const Region& r = regions.at(u->region);
    if (r.closing || addr(ptr) + bytes > addr(r.ptr) + r.bytes) return std::nullopt;
    info.kind = HostRangeInfo::Kind::registered;
    info.region = u->region;
    info.first_unit = id;
    PinnedUnitId last = id;
    while (last < r.last) {
      const Unit& nxt = units[last + 1];
      if (addr(nxt.raw) >= addr(ptr) + bytes) break;
      ++last;
    }
    info.last_unit = last;
    for (PinnedUnitId k = id; k <= last; ++k) info.retired = info.retired || units[k].retired;
    return info;
  }

  ArenaStats snapshot() const {
    ArenaStats s = st;
    s.free_bytes = 0;
    for (const Unit& u : units) {
      if (u.kind == Unit::Kind::chunk && !u.released) s.free_bytes += u.free_total;
    }
    s.overhead_bytes = s.reserved_bytes - s.in_use_bytes - s.pending_bytes - s.free_bytes;
    s.largest_free_bytes = largest_free();
    s.regions = regions.size();
    return s;
  }
};

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
  if (bytes == 0) return make_error(ErrorCode::invalid_argument, request + ": size 0");
  if (alignment < kArenaAlignment) alignment = kArenaAlignment;
  if (!std::has_single_bit(alignment) || alignment > options_.chunk_bytes) {
    return make_error(ErrorCode::invalid_argument,
                      request + ": alignment " + std::to_string(alignment) +
                          " is not a power of two up to the chunk size");
  }
  const std::uint64_t budget = options_.budget_bytes;
  const std::uint64_t extra = alignment > kArenaAlignment ? alignment : 0;
  if (bytes > budget || align_up(bytes, kArenaAlignment) + kCanaryBytes + extra > budget) {
    std::lock_guard lock(m.mu);
    ++m.st.failed_allocs;
    return make_error(ErrorCode::out_of_memory,
                      request + ": larger than the arena's whole pinned budget of " + mib(budget));
  }
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
      const auto id = static_cast<PinnedUnitId>(m.units.size());
      Unit u;
      u.kind = Unit::Kind::chunk;
      u.raw = *raw;
      u.raw_bytes = size;
      const std::uint64_t shift = align_up(addr(u.raw), kArenaAlignment) - addr(u.raw);
      u.base = u.raw + shift;
      u.bytes = align_down(size - shift, kArenaAlignment);
      fill_pattern(kCanarySeed ^ splitmix64(id), 0, {u.base, kCanaryBytes});
      m.units.push_back(std::move(u));
      m.by_addr.emplace(addr(m.units[id].base), id);
      m.st.reserved_bytes += size;
      m.st.peak_reserved_bytes = std::max(m.st.peak_reserved_bytes, m.st.reserved_bytes);
      ++m.st.chunks;
      ++m.st.pinned_allocs;
      // The alignment shift and the tail below 256 bytes lie outside
      // [base, base + bytes): overhead, not dead space.
      m.add_free(id, kCanaryBytes, m.units[id].bytes - kCanaryBytes);
      continue;
    }
    // Budget exhausted. First, empty chunks too small for this request give their
    // budget back (rare: only a request larger than what is free triggers it).
    std::uint64_t idle = 0;
    for (const Unit& u : m.units) {
      if (u.kind == Unit::Kind::chunk && !u.released && !u.retired && u.blocks.empty()) {
        idle += u.raw_bytes;
      }
    }
    if (idle > 0 && min_chunk <= room + idle) {
      for (PinnedUnitId id = 0; id < m.units.size(); ++id) {
        Unit& u = m.units[id];
        if (u.kind == Unit::Kind::chunk && !u.released && !u.retired && u.blocks.empty()) {
          m.release_if_idle(id, order_, &release);
        }
      }
      continue;
    }
    if (options_.wait_for_pending && !waited && !m.pending.empty()) {
      UseSet uses;
      for (const auto& [id, off] : m.pending) uses.merge(m.units[id].blocks.at(off).uses);
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
      m.pending.emplace_back(block.chunk, block.offset);
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

Result<RegionId> HostArena::register_host(std::byte* ptr, std::uint64_t bytes) {
  Impl& m = *impl_;
  const std::string request = "host arena register_host(" + std::to_string(bytes) + " bytes)";
  if (ptr == nullptr || bytes == 0 || addr(ptr) > UINTPTR_MAX - bytes) {
    return make_error(ErrorCode::invalid_argument, request + ": needs a non-null, non-wrapping range");
  }
  std::lock_guard reg(m.register_mu);
  {
    std::lock_guard lock(m.mu);
    // Overlap with any live unit (chunks included: their memory is ours).
    auto it = m.by_addr.lower_bound(addr(ptr));
    bool overlap = it != m.by_addr.end() && it->first - addr(ptr) < bytes;
    if (!overlap && it != m.by_addr.begin()) {
      --it;
      const Unit& u = m.units[it->second];
      const std::uintptr_t start = u.kind == Unit::Kind::chunk ? addr(u.base) : addr(u.raw);
      const std::uint64_t size = u.kind == Unit::Kind::chunk ? u.bytes : u.raw_bytes;
      overlap = addr(ptr) - start < size;
    }
    if (overlap) {
      return make_error(ErrorCode::invalid_argument,
                        request + ": overlaps a registered region or an arena chunk");
    }
  }
  // Pin in pieces without the arena lock: registering is slow on real drivers.
  Backend& backend = order_.backend();
  const std::uint64_t piece = options_.register_piece_bytes;
  std::vector<std::pair<std::byte*, std::uint64_t>> done;
  for (std::uint64_t off = 0; off < bytes; off += piece) {
    const std::uint64_t len = std::min(piece, bytes - off);
    auto r = backend.register_host(ptr + off, len);
    if (!r.ok()) {
      for (const auto& [p, l] : done) (void)backend.unregister_host(p);
      std::lock_guard lock(m.mu);
      m.st.registrations += done.size();
      m.st.unregistrations += done.size();
      Error e = std::move(r).error();
      e.message = request + ": piece at offset " + std::to_string(off) + ": " + e.message;
      return e;
    }
    done.emplace_back(ptr + off, len);
  }
  std::lock_guard lock(m.mu);
  const RegionId rid = m.next_region++;
  Region region;
  region.ptr = ptr;
  region.bytes = bytes;
  region.first = static_cast<PinnedUnitId>(m.units.size());
  for (const auto& [p, l] : done) {
    Unit u;
    u.kind = Unit::Kind::piece;
    u.raw = p;
    u.raw_bytes = l;
    u.region = rid;
    const auto id = static_cast<PinnedUnitId>(m.units.size());
    m.units.push_back(std::move(u));
    m.by_addr.emplace(addr(p), id);
  }
  region.last = static_cast<PinnedUnitId>(m.units.size() - 1);
  m.regions.emplace(rid, std::move(region));
  m.st.registrations += done.size();
  m.st.registered_bytes += bytes;
  return rid;
}

Result<void> HostArena::unregister_host(RegionId region) {
  Impl& m = *impl_;
  std::lock_guard reg(m.register_mu);
  UseSet uses;
  {
    std::lock_guard lock(m.mu);
    auto it = m.regions.find(region);
    if (it == m.regions.end()) {
      return make_error(ErrorCode::stale_handle,
                        "host arena unregister_host(region " + std::to_string(region) +
                            "): no such region");
    }
    it->second.closing = true;  // refuse new leases from here on
    uses = it->second.uses;
    for (PinnedUnitId k = it->second.first; k <= it->second.last; ++k) {
      uses.merge(m.units[k].canary_uses);
    }
  }
  auto w = order_.wait(uses);
  if (!w.ok()) {
    std::lock_guard lock(m.mu);
    m.regions.at(region).closing = false;
    Error e = std::move(w).error();
    e.message = "host arena unregister_host(region " + std::to_string(region) +
                "): transfers still read it: " + e.message;
    return e;
  }
  std::vector<std::byte*> pieces;
  {
    std::lock_guard lock(m.mu);
    Region& r = m.regions.at(region);
    for (PinnedUnitId k = r.first; k <= r.last; ++k) {
      Unit& u = m.units[k];
      u.released = true;
      m.by_addr.erase(addr(u.raw));
      pieces.push_back(u.raw);
    }
    m.st.registered_bytes -= r.bytes;
    m.st.unregistrations += pieces.size();
    m.regions.erase(region);
  }
  Result<void> result;
  for (std::byte* p : pieces) {
    auto r = order_.backend().unregister_host(p);
    if (!r.ok() && result.ok()) result = std::move(r).error();
  }
  return result;
}

std::optional<HostRangeInfo> HostArena::locate(const std::byte* ptr, std::uint64_t bytes) const {
  std::lock_guard lock(impl_->mu);
  return impl_->locate(ptr, bytes);
}

Result<void> HostArena::lease_source(const std::byte* ptr, std::uint64_t bytes, StreamPoint point) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  auto info = m.locate(ptr, bytes);
  if (!info) {
    return make_error(ErrorCode::stale_handle,
                      "host arena lease of " + std::to_string(bytes) +
                          " bytes: not inside a live block or registered region");
  }
  if (info->kind == HostRangeInfo::Kind::block) {
    m.units[info->block.chunk].blocks.at(info->block.offset).uses.add(point);
  } else {
    m.regions.at(info->region).uses.add(point);
  }
  return {};
}

Result<void> HostArena::lease_unit(PinnedUnitId unit, StreamPoint point) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  if (unit >= m.units.size() || m.units[unit].released) {
    return make_error(ErrorCode::stale_handle,
                      "host arena: pinned unit " + std::to_string(unit) + " is not live");
  }
  Unit& u = m.units[unit];
  if (u.kind == Unit::Kind::piece && m.regions.at(u.region).closing) {
    return make_error(ErrorCode::stale_handle,
                      "host arena: pinned unit " + std::to_string(unit) + " is being unregistered");
  }
  u.canary_uses.add(point);
  return {};
}

std::optional<CanarySpan> HostArena::canary(PinnedUnitId unit) const {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  if (unit >= m.units.size() || m.units[unit].released) return std::nullopt;
  const Unit& u = m.units[unit];
  CanarySpan span;
  span.data = u.kind == Unit::Kind::chunk ? u.base : u.raw;
  span.bytes = u.kind == Unit::Kind::chunk ? kCanaryBytes : std::min(u.raw_bytes, kCanaryBytes);
  std::memcpy(span.expected.data(), span.data, span.bytes);
  return span;
}

Result<bool> HostArena::retire(PinnedUnitId unit, std::string_view why) {
  Impl& m = *impl_;
  std::vector<std::byte*> release;
  {
    std::lock_guard lock(m.mu);
    if (unit >= m.units.size() || m.units[unit].released) {
      return make_error(ErrorCode::stale_handle,
                        "host arena retire: pinned unit " + std::to_string(unit) + " is not live");
    }
    Unit& u = m.units[unit];
    if (u.retired) return false;
    u.retired = true;
    u.retire_reason = std::string(why);
    ++m.st.retired_units;
    if (u.kind == Unit::Kind::chunk) {
      for (const auto& [off, len] : u.free) m.by_size.erase({len, unit, off});
      u.dead += u.free_total;
      u.free.clear();
      u.free_total = 0;
      m.retired_chunks.push_back(unit);
      m.reclaim(order_, &release);
    }
  }
  for (std::byte* p : release) (void)order_.backend().free_pinned(p);
  return true;
}

bool HostArena::retired(PinnedUnitId unit) const {
  std::lock_guard lock(impl_->mu);
  return unit < impl_->units.size() && impl_->units[unit].retired;
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
  std::uint64_t reserved = 0, in_use = 0, requested = 0, pending = 0, free_extents = 0;
  std::uint64_t chunks = 0;
  for (PinnedUnitId id = 0; id < m.units.size(); ++id) {
    const Unit& u = m.units[id];
    if (u.kind != Unit::Kind::chunk || u.released) continue;
    const std::string name = "chunk " + std::to_string(id);
    ++chunks;
    reserved += u.raw_bytes;
    std::uint64_t live = 0, req = 0, pend = 0, fre = 0;
    // Blocks and free extents tile [kCanaryBytes, bytes) without overlap, free
    // extents never touch each other (coalesced).
    std::map<std::uint64_t, std::pair<std::uint64_t, bool>> tiles;  // off -> (len, is_free)
    for (const auto& [off, b] : u.blocks) {
      if (b.extent == 0 || b.extent % kArenaAlignment != 0 || off % kArenaAlignment != 0) {
        return fail(name + ": block at " + std::to_string(off) + " is misaligned");
      }
      if (b.requested > b.extent || align_up(b.requested, kArenaAlignment) != b.extent) {
        return fail(name + ": block at " + std::to_string(off) + " is not its request rounded to 256");
      }
      (b.pending ? pend : live) += b.extent;
      if (!b.pending) req += b.requested;
      tiles.emplace(off, std::make_pair(b.extent, false));
    }
    for (const auto& [off, len] : u.free) {
      if (u.retired) return fail(name + ": retired but holds free extents");
      fre += len;
      if (!m.by_size.count({len, id, off})) return fail(name + ": free extent missing from the size index");
      if (!tiles.emplace(off, std::make_pair(len, true)).second) return fail(name + ": extent overlaps a block");
    }
    std::uint64_t cursor = kCanaryBytes;
    bool prev_free = false;
    for (const auto& [off, t] : tiles) {
      if (off < cursor) return fail(name + ": overlapping extents at " + std::to_string(off));
      if (!u.retired && off != cursor) return fail(name + ": a gap at " + std::to_string(cursor));
      if (prev_free && t.second && off == cursor) return fail(name + ": adjacent free extents not coalesced");
      cursor = off + t.first;
      prev_free = t.second;
    }
    if (cursor > u.bytes) return fail(name + ": extents run past the chunk");
    if (live != u.live || pend != u.pending || fre != u.free_total || req != u.requested) {
      return fail(name + ": cached sums disagree with its blocks");
    }
    if (u.bytes != kCanaryBytes + live + pend + fre + u.dead) {
      return fail(name + ": bytes != canary + live + pending + free + dead");
    }
    if (!u.retired && u.dead != 0) return fail(name + ": usable chunk with dead bytes");
    in_use += live;
    requested += req;
    pending += pend;
    free_extents += fre;
  }
  std::uint64_t indexed = 0;
  for (const auto& [len, id, off] : m.by_size) {
    if (id >= m.units.size() || m.units[id].released || m.units[id].retired) {
      return fail("size index names a dead chunk");
    }
    indexed += len;
  }
  if (indexed != free_extents) return fail("size index disagrees with the chunks' free extents");
  if (reserved != m.st.reserved_bytes) return fail("reserved_bytes != sum of chunk sizes");
  if (in_use != m.st.in_use_bytes || pending != m.st.pending_bytes ||
      requested != m.st.requested_bytes) {
    return fail("in_use/pending/requested totals disagree with the chunks");
  }
  if (chunks != m.st.chunks) return fail("chunk count disagrees");
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
