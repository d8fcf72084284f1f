// ferry — Runtime: everything a program needs from ferry, made from one options
// struct and owned by one object.
//
// Runtime::create builds, in this order, each on top of the one before:
//
//   backend (make_backend)  ->  StreamOrder  ->  DevicePool  ->  HostArena
//     ->  TransferEngine  ->  OffloadCache (only when RuntimeOptions::cache is set)
//
// and the destructor takes them down in the reverse order, after synchronizing
// the backend, so that no enqueued work is in flight when the arena and the
// pool hand their memory back.
//
// Lifetime: every Allocation, HostBlock, PendingUpload and CacheRef obtained
// through a Runtime must be gone (or never used again) before the Runtime is
// destroyed; the references its accessors return live as long as it does.
//
// Thread safety: create() is reentrant. Every accessor, status() and
// synchronize() may be called from any thread, and the components are as
// thread-safe as their headers say. The destructor must not race with any other
// use of the Runtime or of its components.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "ferry/api.hpp"
#include "ferry/allocation.hpp"
#include "ferry/backend.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/offload_cache.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"

namespace ferry FERRY_API {

struct RuntimeOptions {
  // Which backend and its settings. The default is the sim modelling an H200;
  // ask for BackendKind::cuda for a real device.
  BackendSpec backend;
  // The device pool: by default the whole device (capacity 0), 256 MiB of
  // unused mapped memory kept cached.
  PoolOptions pool;
  // The pinned host arena: 64 MiB chunks up to 1 GiB, pinned on first use.
  ArenaOptions arena;
  // The transfer engine: every upload verified; start-up probe on stream 0,
  // device hashes on streams 63..60 (keep the program's own work off them).
  EngineOptions engine;
  // The offload cache, made only when set (uploads on stream 1 by default).
  std::optional<CacheOptions> cache;
  // Bounds every wait of the stream order, hence of the pool's reclaim, the
  // arena's waits and the engine's verification (backend time). > 0.
  std::chrono::nanoseconds wait_timeout = std::chrono::seconds(30);
};

class Runtime {
 public:
  // Builds every component (see above). Nothing is left behind on error: what
  // was built is taken down again in reverse order.
  // Errors: invalid_argument (wait_timeout <= 0; what check_spec refuses, e.g. an
  // unknown sim profile; a pool capacity below one granule; an engine stream out
  // of range; cache slots == 0 or a cache stream out of range), unsupported (a
  // backend this build or machine lacks: cuda without the toolkit, driver or
  // device), backend_error (the device failed to initialize), and whatever a
  // component's status() reports, its message prefixed with the component.
  // Blocks while the device initializes and the engine's start-up probe runs
  // (bounded).
  static Result<std::unique_ptr<Runtime>> create(RuntimeOptions options);

  // Synchronizes the backend (a failure cannot be reported here and is ignored:
  // the arena and the pool still wait, bounded, for work that leased their memory,
  // and leak rather than free memory the device may touch), then destroys cache,
  // engine, arena, pool, stream order and backend, in that order. Blocks.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  Runtime(Runtime&&) = delete;
  Runtime& operator=(Runtime&&) = delete;

  // The components. Never fail, never block.
  Backend& backend() noexcept { return *backend_; }
  StreamOrder& order() noexcept { return *order_; }
  DevicePool& pool() noexcept { return *pool_; }
  HostArena& arena() noexcept { return *arena_; }
  TransferEngine& engine() noexcept { return *engine_; }
  // Null unless RuntimeOptions::cache was set.
  OffloadCache* cache() noexcept { return cache_.get(); }
  const RuntimeOptions& options() const noexcept { return options_; }

  // Health: ok, or the first sticky device fault known. That is the first
  // backend_error synchronize() answered (a device fault is sticky on every
  // backend: a CUDA context error, the sim's access to unmapped memory), else a
  // backend_error when the backend counted device operations that touched
  // unmapped memory (FaultCounters::illegal_accesses; the sim then fails every
  // later operation). A failed construction never yields a Runtime, so the
  // components' own status() is always ok here. Never blocks on the device.
  Result<void> status() const;

  // Dispatches held work and waits for every stream (Backend::synchronize).
  // Errors: backend_error (a device fault: status() reports it from then on),
  // timeout. Blocks.
  Result<void> synchronize();

  // Allocation::allocate(pool(), bytes, stream): an owned block, freed
  // (stream-ordered) when the Allocation goes, which must be before the Runtime.
  // Errors: those of DevicePool::allocate. May block (bounded) in the reclaim.
  Result<Allocation> allocate(std::uint64_t bytes, StreamId stream);

 private:
  explicit Runtime(RuntimeOptions options) : options_(std::move(options)) {}

  RuntimeOptions options_;
  // Declared in the order they are built; the destructor resets them in reverse.
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StreamOrder> order_;
  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<HostArena> arena_;
  std::unique_ptr<TransferEngine> engine_;
  std::unique_ptr<OffloadCache> cache_;

  mutable std::mutex fault_mu_;  // guards first_fault_
  std::optional<Error> first_fault_;
};

}  // namespace ferry
