// ferry — the device pool: handles that never go stale, stream-ordered free,
// reclaim under pressure that never frees memory queued work still touches.
//
// Invariants (docs/spec.md §2):
//   I1  handles are (pool, slot, generation); slots are never renumbered or moved;
//       freeing a slot bumps its generation (a slot at the last generation is
//       retired, never reused, so no generation comes round); resolving a stale,
//       foreign or forged handle returns stale_handle.
//   I2  a block is not reused, unmapped or released while a lease on it (an
//       enqueued operation, held in a host queue or on the device) is open.
//   I3  free() is stream-ordered: the block is reusable at once by later work on
//       the stream that last used it, by other streams once that work completed.
//   I4  a failed fit runs the reclaim sequence before out_of_memory.
//
// Layout: one reserved address range per size class (small requests are sliced
// from shared granules, large ones take extents of their own); physical granules
// are mapped on demand and unmapped when no block touches them, so reserved
// memory follows live memory instead of ratcheting (report 003). Bookkeeping
// lives outside device memory.
//
// Monotone in capacity: where a block lands depends on the blocks and the free
// address space only (the ranges are sized by the device, not the capacity, and
// cached granules are unmapped on demand), so the capacity decides only whether a
// placement fits: a trace that replays at capacity C replays at every C' > C.
//
//   reserved == mapped granules;  live + pending_free <= reserved <= capacity
//   referenced == reserved - cached <= capacity  (what a placement is checked against)
//
// Thread safety: every method may be called from any thread. allocate() may block
// (bounded) in the reclaim sequence, waiting for in-flight frees; it holds no
// lock while it waits. Other calls do not block on the device.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/backend.hpp"
#include "ferry/content.hpp"
#include "ferry/device_handle.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/validation.hpp"

namespace ferry FERRY_API {

struct PoolOptions {
  // Bytes the pool may map; 0 means what the device has available
  // (DeviceInfo::available: on cuda the free memory at start, less a margin).
  // Larger than the device's capacity is clamped to it; without virtual memory
  // (the whole capacity one allocation) to what is available.
  std::uint64_t capacity = 0;
  // Mapped granules that no block uses are kept (cached) up to this many bytes
  // and unmapped beyond it. trim() and pressure release them all.
  std::uint64_t release_threshold = std::uint64_t{256} << 20;
  // Requests up to this size are sliced from the shared small-block range.
  std::uint64_t small_limit = std::uint64_t{1} << 20;
  // Run validate() after every operation (validation.hpp; the dev preset's default).
  bool validate_each_op = heavy_validation_default();
  // Which of a Runtime's devices the pool serves (RuntimeOptions::devices): named
  // in the stale_handle answer to another device's handle. Runtime sets it.
  std::uint32_t device = 0;
  // How many devices that Runtime has: with more than one, the out_of_memory
  // diagnostic names the device ("out of memory on device 1: ..."). Runtime sets it.
  std::uint32_t device_count = 1;
};

struct PoolStats {
  std::uint64_t allocated_bytes = 0, peak_allocated_bytes = 0;  // live blocks (rounded)
  std::uint64_t requested_bytes = 0, peak_requested_bytes = 0;  // live, as requested
  std::uint64_t reserved_bytes = 0, peak_reserved_bytes = 0;    // mapped granules
  std::uint64_t active_bytes = 0, peak_active_bytes = 0;        // live + pending free
  std::uint64_t pending_free_bytes = 0;
  std::uint64_t cached_bytes = 0;     // mapped but touched by no block
  std::uint64_t allocs = 0, frees = 0;  // the program's: allocate() and its frees
  // ferry's own buffers, which never hold program data (allocate_internal: the
  // transfer engine's probe and canary scratch); their bytes count above as any block's
  std::uint64_t internal_allocs = 0, internal_frees = 0;
  std::uint64_t ooms = 0;             // out_of_memory answers
  std::uint64_t reclaims = 0;         // reclaim sequences run (pressure or trim)
  std::uint64_t ooms_survived = 0;    // failed fits that a reclaim turned into success
  std::uint64_t same_stream_reuses = 0;  // allocations over freed memory only their own
                                         // stream's queued work still touches
  std::uint64_t tight_fits = 0;          // placed by the granule-aware scan: the quick fit
                                         // would have touched more unused granules
  std::uint64_t maps = 0, unmaps = 0;    // backend map/unmap calls
};

// A resolved, leased view of a block for one operation.
struct DeviceSpan {
  std::uint64_t addr = 0;
  std::uint64_t bytes = 0;  // the requested size
};

// A live block and the handle that names it (live_blocks()).
struct LiveBlock {
  DeviceHandle handle;
  std::uint64_t bytes = 0;  // the requested size
  StreamId stream = 0;      // the stream it was allocated on
};

// One block in a snapshot (observability).
struct BlockInfo {
  std::uint64_t addr = 0;
  std::uint64_t bytes = 0;
  enum class State : std::uint8_t { live, pending_free, free } state = State::free;
  StreamId stream = 0;
};

// One reserved address range of the pool (observability). Only `mapped` costs
// memory:  mapped_bytes == sum of mapped[].bytes;  cached_bytes <= mapped_bytes.
struct SegmentInfo {
  enum class Kind : std::uint8_t {
    small,   // requests up to PoolOptions::small_limit
    large,   // larger requests
    shared,  // every request (a backend without virtual memory has one range)
  } kind = Kind::shared;
  std::uint64_t base = 0;
  std::uint64_t bytes = 0;         // address space reserved
  std::uint64_t granule = 0;       // unit of mapping
  std::uint64_t mapped_bytes = 0;  // granules mapped under the range
  std::uint64_t cached_bytes = 0;  // mapped granules that no block touches
  std::vector<DeviceRange> mapped;  // runs of adjacent mapped granules, by address
  std::vector<DeviceRange> cached;  // runs of adjacent cached granules, by address
};

namespace detail {
struct FERRY_HIDDEN PoolTestAccess;  // tests only (src/pool/pool_test_access.hpp); not exported
}  // namespace detail

class DevicePool {
 public:
  // The pool reserves its address ranges at construction; check ok() after.
  DevicePool(StreamOrder& order, PoolOptions options = {});
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // Construction failure (address reservation refused), if any.
  const Result<void>& status() const noexcept;

  // Allocates `bytes` (rounded up to 256), stream-ordered on `stream`: work
  // enqueued on `stream` after the call may use it. When it lands on freed
  // memory that queued work of other streams still touches, an event wait on
  // that work is enqueued on `stream` (held work it names is dispatched first).
  // Errors: invalid_argument (0 bytes, bad stream), out_of_memory (after the I4
  // sequence; message carries the diagnostic; every live block is untouched),
  // backend_error (nothing allocated). May block (bounded) waiting for in-flight frees.
  // The backend's map and unmap calls run with no pool lock held, so other
  // threads' calls go on meanwhile; an allocation that needs a granule another
  // thread is mapping or unmapping waits for that call (it is never handed out
  // before its memory is there).
  Result<DeviceHandle> allocate(std::uint64_t bytes, StreamId stream);
  // As allocate, for ferry's own buffers: counted in internal_allocs and (at its
  // free) internal_frees instead of allocs and frees.
  Result<DeviceHandle> allocate_internal(std::uint64_t bytes, StreamId stream);

  // Drops the handle. Legal with work in flight (I3). Errors: stale_handle
  // (double free, foreign, forged). Never blocks on the device; runs the unmap of
  // granules beyond the release threshold (no pool lock held).
  Result<void> free(DeviceHandle handle);

  // Resolves without leasing (for inspection). Errors: stale_handle.
  Result<DeviceSpan> resolve(DeviceHandle handle) const;

  // A free and an allocation of the same block in one step, for an owner that
  // keeps the memory while the handle changes hands (a graph's private pool,
  // graph.hpp): `handle` goes stale (I1: the slot's generation changes) and the
  // returned handle names the same bytes, with its leases and stream order, now
  // `bytes` long as requested. The block stays live: allocs and frees do not
  // count it, requested_bytes follows `bytes`. Errors:
  // stale_handle; invalid_argument (bytes 0 or beyond the block's rounded size,
  // or the slot at its last generation: allocate anew then). Never blocks.
  Result<DeviceHandle> reissue(DeviceHandle handle, std::uint64_t bytes);
  // A handle over bytes [offset, offset + bytes) of the live block `parent`, for
  // an owner that carves a block it keeps into parts (a graph's private pool,
  // graph.hpp). It has a slot and generation of its own and resolves to that
  // range (DeviceSpan::bytes is `bytes`); a lease on it, and its stream order,
  // are its parent's (I2: an op on it holds the whole block). free() of it drops
  // the handle, never memory; reissue() of it gives the same range a new handle
  // (bytes up to its own rounded size). It goes stale when freed, and when its
  // parent is freed or reissued (I1: no sub-block outlives the handle it was cut
  // from). The pool's stats, snapshot and live_blocks() count its parent only.
  // Errors: stale_handle (parent); invalid_argument (parent a sub-block itself,
  // bytes 0, offset not a multiple of 256, or the range beyond the parent's
  // rounded size). Never blocks.
  Result<DeviceHandle> sub_block(DeviceHandle parent, std::uint64_t offset, std::uint64_t bytes);
  // Names the block for diagnostics: the race checker's reports (race.hpp) carry
  // `tag` for it. Errors: stale_handle. Never blocks.
  Result<void> set_tag(DeviceHandle handle, std::string_view tag);

  // Resolves `handle` and records a lease for `point` (called from a
  // StreamOrder::submit prepare callback). Errors: stale_handle.
  // Before the first use of a block on a stream other than the one it was
  // allocated on, call make_ready() (the enqueue_* helpers below do).
  Result<DeviceSpan> lease(DeviceHandle handle, StreamPoint point);

  // The points a reader of the block on another device must follow (I3): the
  // latest lease of each stream (every enqueued op that touched the block, the
  // writes among them; some may have completed) and the point where the block
  // became this allocation's, when make_ready would wait for one. Leases do not
  // say read from write, so reads count too. Errors: stale_handle. Never blocks.
  Result<UseSet> last_uses(DeviceHandle handle) const;

  // Orders `stream` after the point where the block became this allocation's.
  // That point is pending only when the allocation reused memory that earlier
  // work still touches (I3); then a wait on that point is enqueued on `stream`
  // (and held work it names is dispatched, so the wait can finish). Otherwise
  // does nothing. Never blocks.
  // Errors: stale_handle, backend_error.
  Result<void> make_ready(DeviceHandle handle, StreamId stream);

  // Releases every cached granule and every completed pending free. Never blocks.
  Result<void> trim();

  // Reads retire the frees whose work has completed first (stats, snapshot,
  // segments, largest_free_extent), so an idle device shows no pending free.
  PoolStats stats() const;
  // Sets every peak of stats() to its current value (torch.cuda.reset_peak_memory_stats),
  // so that the peak of one phase can be read on its own; the counters (allocs,
  // frees, ooms, ...) keep counting. Never fails, never blocks on the device.
  void reset_peak_stats();
  // The largest request that fits now without reclaiming: a run of free address
  // space inside granules already in use, extended by as many unused granules as
  // the capacity left unreferenced (capacity - reserved + cached) can map. 0 when
  // the pool is full. The figure the out_of_memory message reports, beside whether
  // the failure is capacity (live + pending-free + request > capacity) or
  // fragmentation. Scans every free extent. Never blocks on the device.
  std::uint64_t largest_free_extent() const;
  std::uint64_t capacity() const noexcept;
  std::vector<BlockInfo> snapshot() const;
  // Every live block with its handle, by handle slot (a recorder names what was
  // allocated before it started). Never fails, never blocks on the device.
  std::vector<LiveBlock> live_blocks() const;
  // Every reserved range, by address. Scans every granule of the ranges (for
  // inspection, not for hot paths). Never blocks on the device.
  std::vector<SegmentInfo> segments() const;

  // Checks every internal invariant; false (with a reason in *why) when broken.
  bool validate(std::string* why = nullptr) const;

  StreamOrder& order() noexcept;

 private:
  friend struct detail::PoolTestAccess;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Convenience: enqueue common device operations on pooled memory. Each resolves
// its handles under a lease for the ticket it will get (I2).
// Errors: stale_handle, invalid_argument (range outside the block), backend_error.
Result<Ticket> enqueue_fill(DevicePool& pool, StreamId stream, DeviceHandle dst, std::uint64_t seed,
                            Pattern pattern = Pattern::bytes);
Result<Ticket> enqueue_compute(DevicePool& pool, StreamId stream,
                               std::span<const DeviceHandle> inputs, DeviceHandle output,
                               double flops = 0, std::uint64_t mem_bytes = 0,
                               Pattern pattern = Pattern::bytes);
Result<Ticket> enqueue_copy_to_host(DevicePool& pool, StreamId stream, DeviceHandle src,
                                    std::span<std::byte> dst);
// Bytes [offset, offset + dst.size()) of the block, which must lie inside it.
Result<Ticket> enqueue_copy_to_host(DevicePool& pool, StreamId stream, DeviceHandle src,
                                    std::uint64_t offset, std::span<std::byte> dst);

// A multi-line table of the pool's memory, in the manner of PyTorch's
// torch.cuda.memory_summary(): allocated, requested, reserved and active bytes
// (current and peak), pending free, cached, the largest free extent, capacity;
// the allocs and frees (the program's, then ferry's own), ooms, reclaims and
// ooms_survived counters; and the live and
// pending-free blocks by (rounded) size class:
//   <= 1 KiB, <= 64 KiB, <= 1 MiB, <= 16 MiB, > 16 MiB.
// It sits here rather than with Allocation because it reads only the pool.
// stats(), snapshot() and largest_free_extent() are read one after another, each
// under the pool's lock: with other threads allocating meanwhile, the sections
// may describe slightly different moments. Never fails, never blocks on the device.
std::string memory_summary(const DevicePool& pool);

}  // namespace ferry
