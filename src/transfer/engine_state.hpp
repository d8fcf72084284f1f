// The state every job of the transfer engine shares (the opaque
// detail::EngineState behind TransferEngine): the pool, arena and StreamOrder
// it works on, its counters and batching verdict under one mutex, what the
// device may still touch after a call gave up waiting, the event waits on the
// verify streams, the source hash cache, and the few operations every job
// enqueues with: submit, the device-range leases and checks, parking.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ferry/transfer_engine.hpp"
#include "transfer/source_hash_cache.hpp"

namespace ferry::detail {

using Bytes = std::vector<std::byte>;

// [offset, offset + bytes) lies inside [0, size), without overflow.
inline bool fits(std::uint64_t offset, std::uint64_t bytes, std::uint64_t size) {
  return offset <= size && bytes <= size - offset;
}

struct EngineState {
  // `options` is the engine's own EngineOptions, normalized by its constructor.
  EngineState(DevicePool& device_pool, HostArena& host_arena, const EngineOptions& options)
      : pool(device_pool), arena(host_arena), order(device_pool.order()), opt(options) {}

  DevicePool& pool;
  HostArena& arena;
  StreamOrder& order;
  const EngineOptions& opt;
  Result<void> status;  // set by the constructor only
  std::atomic<bool> batching{false};
  SourceHashCache source_hashes;  // has its own lock

  struct UnitProbe {
    bool probed = false;
    std::uint32_t transfers = 0;
    std::uint64_t bytes = 0;
  };

  mutable std::mutex mu;  // guards everything below; never held while waiting
  IntegrityCounters counters;
  std::string batch_reason;
  BatchProbeReport probe_report;
  std::unordered_map<PinnedUnitId, UnitProbe> unit_probe;
  // What the device may still write into or read from after a call gave up
  // waiting (hash results, pageable copies, bounce buffers): kept until done.
  std::vector<std::pair<StreamPoint, std::shared_ptr<void>>> keepalive;
  // Event waits on the verify streams not yet known complete: (the wait's own
  // point, the copy it waits for). A hash can only finish once every wait ahead
  // of it on its verify stream has, so finish() dispatches held copies named here.
  std::deque<std::pair<StreamPoint, StreamPoint>> verify_waits;
  std::uint64_t canary_seed = 0x9e3779b97f4a7c15ull;

  void count(auto&& f) {
    std::lock_guard lock(mu);
    f(counters);
  }

  // Keeps `what` alive until `point` completed (nothing when null).
  void park(StreamPoint point, std::shared_ptr<void> what);
  // Drops what parked work has completed, and the verify waits known complete.
  void prune();

  // Submits the op that build(point) returns. A build error after some leases
  // were recorded still consumes the ticket with a no-op, so those leases name a
  // ticket that completes (StreamOrder's contract: a failed prepare records nothing).
  template <class Build>
  Result<StreamPoint> submit(StreamId stream, Build&& build) {
    std::optional<Error> failed;
    Result<Ticket> t = order.submit(stream, [&](Ticket ticket) -> Result<Op> {
      Result<Op> op = build(StreamPoint{stream, ticket});
      if (!op.ok()) {
        failed = std::move(op).error();
        return Op{NopOp{}};
      }
      return op;
    });
    if (!t.ok()) return std::move(t).error();
    if (failed) return std::move(*failed);
    return StreamPoint{stream, *t};
  }

  // Leases [off, off + bytes) of `h` for the op at `point` (from a submit()
  // build callback). Errors: those of DevicePool::lease, invalid_argument (the
  // range lies outside the allocation).
  Result<DeviceRange> lease_dst(DeviceHandle h, std::uint64_t off, std::uint64_t bytes,
                                StreamPoint point);
  // Checks [off, off + bytes) of `h` before anything is enqueued; an error's
  // message starts with "what: ". Also orders `stream` after the block's
  // allocation point when it reused memory still in use on another stream
  // (DevicePool::make_ready, I3).
  Result<void> check_dst(const std::string& what, DeviceHandle h, std::uint64_t off,
                         std::uint64_t bytes, StreamId stream);

  // The verify stream that hashes uploads on `stream` (EngineOptions).
  StreamId verify_stream_of(StreamId stream) const {
    return opt.verify_stream - stream % opt.verify_streams;
  }
  // Before a wait for `point`: the copies that event waits on a verify stream at
  // or before `point` name, where their streams are held, are waited for (which
  // dispatches them), since `point` could never complete otherwise — as a sync
  // dispatches what it waits for. Blocks (bounded).
  Result<void> dispatch_awaited_copies(StreamPoint point);

  // Too many retired units: retries skip pinned memory (EngineOptions::distrust_pinned_after).
  bool distrusted();
  void disable_batching(const std::string& why);
};

}  // namespace ferry::detail
