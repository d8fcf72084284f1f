// HostArena::Impl (internal): the arena's state. Its parts live in files named
// after their job:
//   host_arena.cpp          blocks: allocate, free, chunks, reclaim, trim, stats
//   host_arena_regions.cpp  registered regions, locate, leases, canaries, retire
//   host_arena_validate.cpp validate()
// A chunk's free space is the pool's placement core (pool/placement_core.hpp),
// without granules: the arena places by aligned best fit over its chunks. Its
// pending blocks are filed as the pool's are (pool/pending_blocks.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/text.hpp"
#include "ferry/host_arena.hpp"
#include "pool/pending_blocks.hpp"
#include "pool/placement_core.hpp"

namespace ferry {
namespace detail {

inline std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
inline std::string mib(std::uint64_t bytes) { return text::human_bytes(bytes, 1, text::ByteUnit::MiB); }

struct ArenaBlock {
  std::uint64_t extent = 0;  // bytes occupied in the chunk, a multiple of 256: its node's size
  std::uint64_t requested = 0;
  std::uint64_t serial = 0;
  std::uint32_t node = PlacementCore::kNone;  // its node in the chunk's free space
  bool pending = false;
  std::uint32_t pending_id = 0;  // its entry in HostArena::Impl::pending, while pending
  UseSet uses;
};

struct ArenaUnit {
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
  // Chunk: [base, base + bytes) carved into the canary (a node at offset 0), blocks,
  // free extents and, once retired, dead ones (withdrawn: nodes no block owns).
  // Offsets are relative to base. Empty once released.
  std::unique_ptr<PlacementCore> space;
  std::map<std::uint64_t, ArenaBlock> blocks;  // offset -> live or pending block
  std::uint64_t live = 0, requested = 0, pending = 0, dead = 0;

  std::uint64_t free_bytes() const { return space ? space->space().free_units() * PlacementCore::kAlign : 0; }
};

struct ArenaRegion {
  std::byte* ptr = nullptr;
  std::uint64_t bytes = 0;
  PinnedUnitId first = 0, last = 0;
  bool closing = false;  // unregister_host() in progress: no new leases
  UseSet uses;
};

}  // namespace detail

struct HostArena::Impl {
  using Unit = detail::ArenaUnit;
  using Region = detail::ArenaRegion;
  using LiveBlock = detail::ArenaBlock;

  mutable std::mutex mu;
  std::mutex register_mu;  // serializes register/unregister (backend calls run unlocked)

  std::vector<Unit> units;                             // index = PinnedUnitId
  std::map<std::uintptr_t, PinnedUnitId> by_addr;      // live units by start address
  std::map<RegionId, Region> regions;
  RegionId next_region = 1;
  // Pending blocks by (chunk, offset): freed while a transfer still reads them (I6).
  using BlockKey = std::pair<PinnedUnitId, std::uint64_t>;
  detail::PendingBlocks<BlockKey> pending;
  std::vector<PinnedUnitId> retired_chunks;             // retired, not yet released
  std::uint64_t next_serial = 1;
  std::uint64_t reserving = 0;  // budget promised to allocate_pinned calls in flight
  ArenaStats st;

  // --- everything below runs with mu held

  std::optional<HostBlock> try_fit(std::uint64_t need, std::uint64_t alignment);
  HostBlock place(PinnedUnitId id, detail::PlacementCore::Allocation a, std::uint64_t need);
  PinnedUnitId add_chunk(std::byte* raw, std::uint64_t size);
  void drop_block(PinnedUnitId id, std::map<std::uint64_t, LiveBlock>::iterator it);
  void withdraw_free(Unit& u);
  void reclaim(StreamOrder& order, std::vector<std::byte*>* release);
  LiveBlock& block_at(const BlockKey& k) { return units[k.first].blocks.at(k.second); }
  const LiveBlock& block_at(const BlockKey& k) const { return units[k.first].blocks.at(k.second); }
  bool release_if_idle(PinnedUnitId id, StreamOrder& order, std::vector<std::byte*>* release);
  void release_idle(StreamOrder& order, std::vector<std::byte*>* release);
  std::uint64_t idle_bytes() const;
  std::uint64_t largest_free() const;
  // The unit whose [start, start + size) holds p, or nullptr.
  const Unit* unit_at(std::uintptr_t p, PinnedUnitId* id_out) const;
  std::optional<HostRangeInfo> locate(const std::byte* ptr, std::uint64_t bytes) const;
  ArenaStats snapshot() const;
  bool validate_pending(std::uint64_t count, std::string* why) const;
};

}  // namespace ferry
