// ferry — the host arena: pinned host memory taken from the backend rarely, in
// large chunks, and reused in stream order (docs/spec.md I2, I6).
//
// Why: report 000 saw copies out of freshly pinned memory silently do nothing
// after heavy pinned alloc/free churn. The arena removes the churn: it pins
// chunks (64 MiB by default) up to a budget and sub-allocates them, so steady
// state makes zero pinned allocations or frees in the driver.
//
// Allocation: exact best fit over every chunk, from one index of free extents
// ordered by size (a std::set of (bytes, unit, offset)), with each unit's free
// extents in an offset-ordered map that coalesces neighbours on free. Blocks are
// 256-byte aligned and sized to the request rounded up to 256 — never to a power
// of two. Why not the pool's offset allocator (core/offset_allocator.hpp): its
// size classes round a search up to the next bin, while a pinned budget of a few
// chunks wants the smallest hole that fits across all of them, and allocations
// here are per transfer (thousands per second), not per kernel, so an O(log n)
// search costs nothing that shows. Bookkeeping lives outside the pinned memory
// (offsets, not pointers into it).
//
// Reuse: a block carries a UseSet (stream_order.hpp). Transfers lease their
// source block for the ticket that reads it (lease_source, from a submit()
// prepare callback). free() of a block whose UseSet has not retired makes it
// *pending*; it rejoins the free space only once every reading transfer has
// completed, checked at allocate time. Nothing here reimplements "is this work
// done yet".
//
// Pinned units: every chunk and every registered piece is a "pinned unit" with a
// stable id (never renumbered). The transfer engine canaries and retires units:
// a retired chunk takes no new blocks and is released to the backend once nothing
// uses it; a retired registered piece stays registered (it is the caller's
// memory) but is flagged so that the engine stages copies out of it.
//
// Per chunk (validate()):
//   chunk.bytes == kCanaryBytes + live + pending + free + dead
//   dead == 0 unless the chunk is retired (its free extents are withdrawn)
// Arena-wide:
//   reserved_bytes == sum of chunk bytes == in_use + pending + free + overhead
//   reserved_bytes <= budget (a single request larger than chunk_bytes gets a
//   chunk of its own, still within the budget)
//
// Thread safety: every method may be called from any thread; one mutex guards
// the bookkeeping. allocate() may block (bounded by the StreamOrder's timeout)
// waiting for pending blocks when the budget is exhausted; it never holds the
// mutex while it waits or while the backend pins memory. unregister_host() and
// the destructor wait (bounded) for transfers still reading. Everything else
// never blocks on the device. Lock order: a stream's submission lock (held while
// a prepare callback calls lease_source/lease_unit) before the arena's mutex;
// the arena never enqueues, so the reverse never happens.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <memory_resource>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/validation.hpp"

namespace ferry FERRY_API {

inline constexpr std::uint64_t kArenaAlignment = 256;
// Every chunk starts with this many bytes of constant canary pattern that the
// transfer engine copies to check the chunk's pinned mapping (report 000's probe).
inline constexpr std::uint64_t kCanaryBytes = 256;

using PinnedUnitId = std::uint32_t;
using RegionId = std::uint64_t;  // 0 is never a region

struct ArenaOptions {
  // Size of each pinned chunk. Larger requests get a chunk of their own.
  std::uint64_t chunk_bytes = std::uint64_t{64} << 20;
  // Most pinned bytes the arena holds from Backend::allocate_pinned at once.
  std::uint64_t budget_bytes = std::uint64_t{1} << 30;
  // register_host() registers an existing range in pieces of at most this size.
  std::uint64_t register_piece_bytes = std::uint64_t{64} << 20;
  // With the budget exhausted, allocate() waits (bounded) for pending blocks
  // before answering out_of_memory.
  bool wait_for_pending = true;
  // Run validate() after every operation (validation.hpp; the dev preset's default).
  bool validate_each_op = heavy_validation_default();
};

// A value handle to a live block. The null block has serial 0. Copying the
// handle does not copy ownership: free it once.
struct HostBlock {
  std::byte* data = nullptr;   // 256-byte aligned (or the requested alignment)
  std::uint64_t bytes = 0;     // as requested
  PinnedUnitId chunk = 0;
  std::uint64_t offset = 0;    // within the chunk
  std::uint64_t serial = 0;    // unique per allocation; 0 = null

  std::span<std::byte> span() const noexcept { return {data, bytes}; }
  explicit operator bool() const noexcept { return serial != 0; }
};

struct ArenaStats {
  std::uint64_t in_use_bytes = 0, peak_in_use_bytes = 0;  // live blocks (256-rounded)
  std::uint64_t requested_bytes = 0;  // live blocks, as requested
  std::uint64_t pending_bytes = 0;    // freed, still read by transfers in flight
  std::uint64_t free_bytes = 0;       // free extents of usable chunks
  std::uint64_t overhead_bytes = 0;   // canary areas + withdrawn space of retired chunks
  std::uint64_t reserved_bytes = 0, peak_reserved_bytes = 0;  // pinned chunk bytes held
  std::uint64_t largest_free_bytes = 0;
  std::uint64_t budget_bytes = 0;
  std::uint64_t chunks = 0;           // chunks held (usable + retired not yet released)
  std::uint64_t retired_units = 0;    // chunks and registered pieces retired, ever
  std::uint64_t allocs = 0, frees = 0, failed_allocs = 0;
  std::uint64_t pending_frees = 0;    // frees that had to wait for transfers
  std::uint64_t waits = 0;            // allocate() calls that waited for pending blocks
  // The arena's own calls into the backend (Backend::host_stats() counts the whole
  // process, the churn probe included).
  std::uint64_t pinned_allocs = 0, pinned_frees = 0;
  std::uint64_t registrations = 0, unregistrations = 0;  // pieces
  std::uint64_t registered_bytes = 0;
  std::uint64_t regions = 0;          // registered regions live
};

// Where a host range lives, for the transfer engine.
struct HostRangeInfo {
  enum class Kind : std::uint8_t { block, registered } kind = Kind::block;
  PinnedUnitId first_unit = 0;  // the chunk, or the first registered piece it touches
  PinnedUnitId last_unit = 0;   // == first_unit for a block
  bool retired = false;         // some unit it touches is retired
  HostBlock block;              // kind == block
  RegionId region = 0;          // kind == registered
};

// The bytes a canary copies out of a unit: the chunk's canary area, or the
// first min(piece, kCanaryBytes) bytes of a registered piece. Constant while
// the unit lives (registered data is treated as immutable while registered).
// `data` may be read by a device copy only under lease_unit(); `expected` is a
// copy taken under the arena's lock, safe to compare with after the unit is gone.
struct CanarySpan {
  const std::byte* data = nullptr;
  std::uint64_t bytes = 0;
  std::array<std::byte, kCanaryBytes> expected{};
};

class HostArena {
 public:
  // Pins nothing until the first allocate(). `order` must outlive the arena and
  // be the one every transfer out of it is submitted through.
  explicit HostArena(StreamOrder& order, ArenaOptions options = {});
  // Waits (bounded) for transfers still reading any block or region, then
  // unregisters every region and releases every chunk. Blocks.
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // A block of `bytes` (> 0), aligned to `alignment` (a power of two; values below
  // 256 mean 256). Best fit over the usable chunks; pins a new chunk within the
  // budget when nothing fits; with the budget exhausted, releases empty chunks
  // that cannot hold the request and waits (bounded) for pending blocks.
  // Errors: invalid_argument (0 bytes, bad alignment), out_of_memory (larger than
  // the budget — the message says so — or nothing fits after waiting; the message
  // carries budget, reserved, in use, pending, largest free and the request),
  // backend_error / timeout from the backend or the wait. Nothing changes on error.
  // May block (bounded).
  Result<HostBlock> allocate(std::uint64_t bytes, std::uint64_t alignment = kArenaAlignment);

  // Returns a block. Legal while transfers still read it: it turns pending and
  // is reused only after they completed (I6). Errors: stale_handle (a null,
  // freed or forged block: nothing changes). Never blocks.
  Result<void> free(const HostBlock& block);
  // free() by the block's data pointer (the pmr face). Errors: stale_handle.
  Result<void> free_ptr(const void* data);

  // Registers [ptr, ptr + bytes) in place, in pieces of register_piece_bytes,
  // so copies out of it run at pinned speed without copying it. The caller keeps
  // the memory alive and unchanged until unregister_host() returns. On error no
  // piece stays registered. Errors: invalid_argument (null, 0 bytes, wraps,
  // overlaps a registered region or a chunk), what Backend::register_host says.
  // Never blocks on the device.
  Result<RegionId> register_host(std::byte* ptr, std::uint64_t bytes);
  // Waits (bounded) until no transfer reads the region, then unregisters every
  // piece. Errors: stale_handle (unknown region), timeout, backend_error (the
  // region is forgotten either way once the wait succeeded). Blocks.
  Result<void> unregister_host(RegionId region);

  // --- For the transfer engine (called from StreamOrder::submit prepare callbacks).

  // Where [ptr, ptr + bytes) lives: inside one live block, inside one registered
  // region, or nowhere the arena knows (plain host memory: nullopt). Never blocks.
  std::optional<HostRangeInfo> locate(const std::byte* ptr, std::uint64_t bytes) const;
  // Records that the operation at `point` reads [ptr, ptr + bytes), which must lie
  // in one live block or one registered region. Errors: stale_handle (neither).
  Result<void> lease_source(const std::byte* ptr, std::uint64_t bytes, StreamPoint point);
  // Records that the operation at `point` reads the unit's canary span.
  // Errors: stale_handle (no such unit, or released).
  Result<void> lease_unit(PinnedUnitId unit, StreamPoint point);
  // The canary span of a live unit, or nullopt.
  std::optional<CanarySpan> canary(PinnedUnitId unit) const;
  // Marks a unit bad (report 000): a chunk takes no new blocks and is released
  // once nothing uses it; a registered piece is flagged. Idempotent. Returns true
  // when this call retired it. Errors: stale_handle (no such unit). Never blocks.
  Result<bool> retire(PinnedUnitId unit, std::string_view why);
  bool retired(PinnedUnitId unit) const;

  // Releases every usable chunk that holds no block (pinned frees: churn, so only
  // on request). Returns the bytes released. Never blocks.
  Result<std::uint64_t> trim();

  ArenaStats stats() const;
  const ArenaOptions& options() const noexcept { return options_; }
  StreamOrder& order() noexcept { return order_; }

  // Checks every invariant above; false with a reason in *why when broken.
  bool validate(std::string* why = nullptr) const;

 private:
  struct Impl;
  // With validate_each_op, validate_locked() after an operation; aborts with the reason.
  void check() const;
  bool validate_locked(std::string* why) const;

  StreamOrder& order_;
  ArenaOptions options_;
  std::unique_ptr<Impl> impl_;
};

// The std::pmr::memory_resource face of a HostArena, for host code that wants
// pinned memory in standard containers (std::pmr::vector<T> v(&resource)).
//
// This face follows pmr's contract, not ferry's: do_allocate throws
// std::bad_alloc when the arena answers an error (errors-as-values stops at this
// boundary because pmr containers require it); do_deallocate never throws
// (a stale pointer is our caller's bug and is ignored in release builds,
// asserted in debug builds). Zero-byte requests get a 1-byte block. Power-of-two
// alignments up to ArenaOptions::chunk_bytes are honoured. Thread safety
// and blocking as for HostArena::allocate / free.
class HostArenaResource final : public std::pmr::memory_resource {
 public:
  explicit HostArenaResource(HostArena& arena) noexcept : arena_(arena) {}
  HostArena& arena() noexcept { return arena_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override;
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override;

  HostArena& arena_;
};

}  // namespace ferry
