// ferry — the offload cache: weights live in host banks; the hot ones stay
// resident in device slots; the rest are fetched on demand or prefetched ahead
// of use.
//
// Model:
//   * An entry (CacheKey) is a list of host pieces (e.g. one MoE expert's
//     gate_up and down tensors) uploaded back to back into one slot; piece j
//     lands at the offset given by CacheRef::pieces.
//   * A slot is one fixed-size DevicePool allocation (slot_bytes). At most
//     `slots` entries are resident or in flight at once.
//   * Every upload goes through the TransferEngine, under its integrity policy
//     (I5): a demand miss with upload() on upload_stream, a prefetch with
//     begin_upload() on prefetch_stream whose finish() runs when the entry is
//     first acquired.
//   * Eviction frees the victim's DeviceHandle: the pool's stream-ordered free
//     keeps the memory until every operation that leased it — a kernel still
//     queued (even held in a host-side queue) that reads the old entry — has
//     completed (I2). The replacement gets a fresh allocation; under pressure the
//     pool's reclaim waits for those operations (the shared lease mechanism of
//     stream_order.hpp). The cache never asks "is this work done" itself.
//   * acquire() orders the caller's stream after the upload (a WaitOp when it is
//     still in flight; DevicePool::make_ready for the block) and pins the entry:
//     a pinned entry is never evicted. release() unpins; work already enqueued
//     holds its own leases, so releasing right after enqueueing is safe.
//
// Policies (which unpinned resident entry to evict):
//   lru      least recently acquired (a prefetch counts as a use)
//   lfu      fewest acquires since the cache was made (counts survive eviction),
//            ties broken by LRU
//   optimal  Belady's rule with the future known: the entry whose next acquire in
//            the access plan (set_access_plan) is farthest away, or never. For
//            evaluation; a prefetch under optimal only evicts an entry needed
//            later than the one it brings in.
// A prefetch never evicts a pinned entry, an entry still in flight, or an entry
// a prefetch brought in that has not been acquired yet; with no such victim the
// hint is dropped (counted). A demand miss may, as a last resort, evict an entry
// still in flight from a prefetch (counted as wasted).
//
// Thread safety: every method may be called from any thread. One mutex guards
// the bookkeeping; it is never held while the pool allocates, the engine
// uploads or a wait runs. acquire() blocks (bounded) while it fetches or
// finishes an upload, and while another thread is loading the same entry.
// prefetch() may block (bounded) in the pool's reclaim and, under the probe
// policy, for canaries. Everything else never blocks on the device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"

namespace ferry FERRY_API {

class TransferEngine;

enum class EvictionPolicy : std::uint8_t { lru, lfu, optimal };
std::string_view to_string(EvictionPolicy policy) noexcept;
// "lru" | "lfu" | "optimal". Errors: invalid_argument.
Result<EvictionPolicy> parse_eviction_policy(std::string_view text);

using CacheKey = std::uint64_t;

// A byte range of a device allocation.
struct DeviceSlice {
  DeviceHandle handle{};
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

struct CacheOptions {
  std::uint32_t slots = 8;       // entries resident or in flight at once; >= 1
  std::uint64_t slot_bytes = 0;  // 0: the largest entry defined before the first fill
  EvictionPolicy policy = EvictionPolicy::lru;
  StreamId upload_stream = 1;    // demand fetches run here
  StreamId prefetch_stream = 1;  // prefetches run here (another stream lets a second
                                 // copy engine overlap them with demand fetches)
};

struct CacheStats {
  std::uint64_t hits = 0;             // acquires served without a demand fetch
  std::uint64_t misses = 0;           // acquires that fetched, or acquire_if_resident that found nothing
  std::uint64_t prefetches = 0;       // prefetch uploads issued
  std::uint64_t prefetch_hits = 0;    // hits on an entry a prefetch brought in, first use
  std::uint64_t prefetch_wasted = 0;  // prefetched entries evicted before any use
  std::uint64_t prefetch_dropped = 0; // hints skipped: no victim allowed, or no device memory
  std::uint64_t evictions = 0;
  std::uint64_t uploads = 0;          // demand + prefetch uploads
  std::uint64_t bytes_uploaded = 0;
  std::uint64_t waited_uploads = 0;   // acquires that had to finish an in-flight prefetch
  std::uint64_t fills = 0;            // misses a SlotFill filled (acquire_filled), not an upload
  std::uint64_t bytes_filled = 0;
  double hit_rate() const noexcept {
    const std::uint64_t n = hits + misses;
    return n == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(n);
  }
};

// A pinned, resident entry. Valid until release(key); the slot handle must not
// be freed by the caller.
struct CacheRef {
  CacheKey key = 0;
  DeviceHandle slot{};
  std::vector<DeviceSlice> pieces;  // where each piece of the entry lies in the slot
  bool hit = false;
  bool prefetched = false;          // brought in by a prefetch (first use)
};

class OffloadCache {
 public:
  // Allocates nothing until the first fill. `engine` must outlive the cache.
  OffloadCache(TransferEngine& engine, CacheOptions options);
  // Frees every slot (stream-ordered: queued work that reads one keeps it alive);
  // drops unfinished prefetches (the engine keeps their buffers alive).
  ~OffloadCache();
  OffloadCache(const OffloadCache&) = delete;
  OffloadCache& operator=(const OffloadCache&) = delete;

  // Construction problems (slots == 0, bad stream): acquire etc. return it too.
  const Result<void>& status() const noexcept;

  // Declares an entry: its host pieces, uploaded in order, back to back. The
  // bytes must stay valid and unchanged while the cache lives (a WeightBank's).
  // Errors: invalid_argument (duplicate key, no piece, an empty piece, sizes
  // that sum past 2^64, larger than the device pool's capacity, larger than
  // slot_bytes when that is fixed or slots already filled). Never blocks.
  Result<void> define(CacheKey key, std::vector<std::span<const std::byte>> pieces);

  // The future acquires, in order (acquire and acquire_if_resident consume it).
  // Required by `optimal`; ignored by the other policies. A call that deviates
  // from the plan re-synchronizes at the key's next occurrence.
  void set_access_plan(std::vector<CacheKey> plan);

  // Makes `key` resident (hit; a prefetched entry is finished; a miss fetches it,
  // evicting by policy), orders `use_stream` after its upload, pins it.
  // Errors: invalid_argument (undefined key; optimal without a plan),
  // out_of_memory (every slot pinned; or the pool has no room for a slot even
  // after its reclaim), transfer_corrupt (the upload never verified: the entry
  // is dropped), stale_handle/backend_error/timeout from below. On error nothing
  // stays pinned. Blocks (bounded).
  Result<CacheRef> acquire(CacheKey key, StreamId use_stream);

  // Writes an entry's bytes, laid out as its pieces, into `slot` from somewhere
  // other than its host pieces (another device's copy of it: multi_device_cache.hpp),
  // enqueued on `stream`; returns a point after which they are there. It runs
  // without the cache's lock.
  using SlotFill = std::function<Result<StreamPoint>(DeviceHandle slot, StreamId stream)>;
  // As acquire(), but a miss fills the slot with `fill` on upload_stream instead
  // of uploading the host pieces (counted in fills, not uploads); a resident or
  // in-flight entry is served as acquire() serves it and `fill` is not called.
  // Errors: as acquire(), and fill's (the entry is dropped, nothing pinned).
  Result<CacheRef> acquire_filled(CacheKey key, StreamId use_stream, const SlotFill& fill);
  // As acquire() when `key` is resident or in flight; otherwise counts a miss and
  // returns nullopt without fetching (the caller handles the miss, e.g. on the
  // host). Errors: as acquire(), minus out_of_memory from fetching.
  Result<std::optional<CacheRef>> acquire_if_resident(CacheKey key, StreamId use_stream);

  // Unpins one acquire of `key`. Errors: invalid_argument (not pinned). Never blocks.
  Result<void> release(CacheKey key);

  // Hints: starts uploads of the keys that are neither resident nor in flight,
  // as free slots and the eviction rules above allow. Returns how many uploads
  // started. Errors: invalid_argument (undefined key); device-memory shortage is
  // not an error (the hint is dropped). May block (bounded, see above).
  Result<std::uint32_t> prefetch(std::span<const CacheKey> keys);

  bool resident(CacheKey key) const;  // resident or in flight
  std::uint32_t occupied() const;     // slots resident or in flight
  std::uint64_t slot_bytes() const;   // 0 until fixed
  CacheStats stats() const;
  const CacheOptions& options() const noexcept;

  // Checks the bookkeeping: occupied <= slots, every occupied entry owns a live
  // slot handle, pins only on resident entries, the LRU/LFU/plan state is sane.
  bool validate(std::string* why = nullptr) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
