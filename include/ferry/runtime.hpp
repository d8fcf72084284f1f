// ferry — Runtime: everything a program needs from ferry, made from one options
// struct and owned by one object.
//
// Runtime::create builds, in this order, each on top of the one before:
//
//   backend (make_backend)  ->  backend adaptor (only when RuntimeOptions::backend_adaptor
//     is set)  ->  StreamOrder  ->  DevicePool  ->  HostArena  ->  TransferEngine
//     ->  OffloadCache (only when RuntimeOptions::cache is set)
//
// It is the one place that builds this stack: the C ABI, the workloads and the
// replay runner each make a Runtime.
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
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>

#include "ferry/api.hpp"
#include "ferry/allocation.hpp"
#include "ferry/backend.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/graph.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/offload_cache.hpp"
#include "ferry/pool_calls.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"

namespace ferry FERRY_API {

namespace detail {
class FERRY_HIDDEN GraphCapture;  // src/runtime/graph.cpp
}  // namespace detail

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
  // The backend adaptor slot (a policy that wraps the backend, e.g. the workloads'
  // busy meter): when set, called once with the backend make_backend built; what
  // it returns (a ForwardingBackend over `made`) is the backend everything above
  // sits on and backend() returns. It is destroyed before `made`. Called once,
  // inside create(), which then drops it (options() holds it no longer). An
  // error it returns fails create(), its message prefixed "backend adaptor: ".
  std::function<Result<std::unique_ptr<Backend>>(Backend& made)> backend_adaptor;
};

class Runtime {
 public:
  // Builds every component (see above). Nothing is left behind on error: what
  // was built is taken down again in reverse order.
  // Errors: invalid_argument (wait_timeout <= 0; what check_spec refuses, e.g. an
  // unknown sim profile; a pool capacity below one granule; an engine stream out
  // of range; cache slots == 0 or a cache stream out of range), unsupported (a
  // backend this build or machine lacks: cuda without the toolkit, driver or
  // device; the message begins "the KIND backend is not available: "),
  // backend_error (the device failed to initialize), what the backend adaptor
  // returns, and whatever a component's status() reports, its message prefixed
  // with the component.
  // Blocks while the device initializes and the engine's start-up probe runs
  // (bounded).
  static Result<std::unique_ptr<Runtime>> create(RuntimeOptions options);

  // Synchronizes the backend (a failure cannot be reported here and is ignored:
  // the arena and the pool still wait, bounded, for work that leased their memory,
  // and leak rather than free memory the device may touch), then destroys cache,
  // engine, arena, pool, stream order, backend adaptor and backend, in that order.
  // Blocks.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  Runtime(Runtime&&) = delete;
  Runtime& operator=(Runtime&&) = delete;

  // The components. Never fail, never block. backend() is the backend adaptor
  // when one is set (Backend::innermost() reaches the one make_backend built).
  Backend& backend() noexcept { return adaptor_ ? *adaptor_ : *backend_; }
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

  // The pool adaptor slot. calls() is what a program's calls on the pool, the
  // engine and the streams go through (pool_calls.hpp): the adaptor set last, or
  // the direct calls, whose synchronize() is Runtime::synchronize, behind the
  // graph capture's front (graph.hpp): calls() always returns that front, which
  // records the calls on capturing streams and forwards every other call to
  // what sits in the slot when it runs, so a pointer taken before a capture
  // begins is captured too. The pointer it
  // returns keeps that adaptor alive while the caller uses it, even once another
  // replaces it. Never blocks.
  std::shared_ptr<PoolCalls> calls() const;
  // Puts `adaptor` in the slot (null: the direct calls again) and returns the one
  // it replaced (null when none was set). An adaptor wraps direct_calls() (or an
  // adaptor over them) and must not outlive the Runtime; the slot drops its
  // reference before any component goes. Never blocks.
  std::shared_ptr<PoolCalls> set_pool_adaptor(std::shared_ptr<PoolCalls> adaptor);
  // The end of the chain: the calls made straight on the components.
  PoolCalls& direct_calls() noexcept { return *direct_; }

  // Allocation::allocate(pool(), bytes, stream): an owned block, freed
  // (stream-ordered) when the Allocation goes, which must be before the Runtime.
  // Errors: those of DevicePool::allocate; invalid_argument on a capturing
  // stream (an Allocation frees through the pool, past the graph: allocate
  // through calls() there). May block (bounded) in the reclaim.
  Result<Allocation> allocate(std::uint64_t bytes, StreamId stream);

  // Graph capture (graph.hpp says what is recorded and what is refused). From
  // begin_capture(stream), the calls made through calls() on `stream` are
  // recorded, not run, until end_capture(stream) returns them as a Graph; calls()
  // on other streams run as before. Allocations on `stream` come from the
  // capture's private pool (options.pool, or one of its own). Errors:
  // invalid_argument (a stream out of range, one capturing already, a pool
  // another capture is using or another Runtime's, or inside a user kernel).
  // Never blocks.
  Result<void> begin_capture(StreamId stream, CaptureOptions options = {});
  // Ends the capture on `stream`. Errors: invalid_argument (the stream is not
  // capturing; the first refused call of the capture, its message prefixed
  // "capture on stream S spoiled: ": no graph then, and blocks the capture
  // allocated that the program freed are freed). Never blocks.
  Result<Graph> end_capture(StreamId stream);
  // Enqueues the graph's ops on `stream`, in order, through the calls in the
  // pool adaptor slot, then a record_use of every block it touches (each is
  // leased until this replay has completed). Errors, before anything is
  // enqueued: invalid_argument (an empty graph or another Runtime's, a stream out
  // of range or capturing), stale_handle (a block the graph touches was freed
  // outside it: the message names the op). After: what an op's enqueue returns
  // (the replay stops there; its message names the op). Never blocks on the
  // device.
  Result<void> launch(const Graph& graph, StreamId stream);

 private:
  friend class detail::GraphCapture;
  friend class Graph;
  friend class GraphPool;
  // The calls in the pool adaptor slot, or the direct ones: what calls() returns
  // when no graph intercepts them.
  std::shared_ptr<PoolCalls> slot_calls() const;
  // invalid_argument, naming `call`, when `stream` is capturing.
  Result<void> refuse_if_capturing(StreamId stream, std::string_view call) const;

  explicit Runtime(RuntimeOptions options) : options_(std::move(options)) {}

  RuntimeOptions options_;
  // Declared in the order they are built; the destructor resets them in reverse.
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Backend> adaptor_;  // wraps backend_; null without a backend adaptor
  std::unique_ptr<StreamOrder> order_;
  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<HostArena> arena_;
  std::unique_ptr<TransferEngine> engine_;
  std::unique_ptr<OffloadCache> cache_;
  std::unique_ptr<PoolCalls> direct_;  // over pool_ and engine_

  mutable std::mutex calls_mu_;  // guards pool_adaptor_ and capture_ (their copy and swap, never a call's run)
  std::shared_ptr<PoolCalls> pool_adaptor_;
  // What calls() returns (made by create, a detail::GraphCapture): it records
  // capturing streams' calls and defers frees of private pools' blocks.
  std::shared_ptr<PoolCalls> capture_;

  mutable std::mutex fault_mu_;  // guards first_fault_
  std::optional<Error> first_fault_;
};

}  // namespace ferry
