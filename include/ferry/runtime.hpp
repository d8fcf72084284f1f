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
// With several devices (RuntimeOptions::devices) it builds the stack up to the
// TransferEngine once per device, device 0 first; the cache sits on device 0.
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
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/allocation.hpp"
#include "ferry/backend.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/devices.hpp"
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
class FERRY_HIDDEN GraphCapture;  // src/runtime/graph_capture.hpp
class FERRY_HIDDEN SlotFront;     // src/runtime/runtime.cpp
}  // namespace detail

struct RuntimeOptions {
  // Which backend and its settings. The default is the sim modelling an H200;
  // ask for BackendKind::cuda for a real device.
  BackendSpec backend;
  // How many devices, and which (devices.hpp): one by default. Each gets a stack
  // of its own from `backend` (its profile or ordinal replaced), `pool`, `arena`
  // and `engine`; the cache sits on device 0.
  DevicesOptions devices;
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
  // sits on and backend() returns. It is destroyed before `made`. Called once per
  // device, in device order, inside create(), which then drops it (options() holds it no longer). An
  // error it returns fails create(), its message prefixed "backend adaptor: ".
  std::function<Result<std::unique_ptr<Backend>>(Backend& made)> backend_adaptor;
};

class Runtime {
 public:
  // Builds every component (see above). Nothing is left behind on error: what
  // was built is taken down again in reverse order.
  // Errors: invalid_argument (wait_timeout <= 0; a device selection that names
  // none, more than kMaxDevices, an ordinal twice, or lists more profiles or
  // ordinals than `count`; what check_spec refuses, e.g. an
  // unknown sim profile; a pool capacity below one granule; an engine stream out
  // of range; cache slots == 0 or a cache stream out of range), unsupported (a
  // backend this build or machine lacks: cuda without the toolkit, driver or
  // device; the message begins "the KIND backend is not available: "),
  // backend_error (the device failed to initialize), what the backend adaptor
  // returns, and whatever a component's status() reports, its message prefixed
  // with the component (and, with several devices, the device: "device 1: ...").
  // Blocks while the device initializes and the engine's start-up probe runs
  // (bounded).
  static Result<std::unique_ptr<Runtime>> create(RuntimeOptions options);

  // Synchronizes the backend (a failure cannot be reported here and is ignored:
  // the arena and the pool still wait, bounded, for work that leased their memory,
  // and leak rather than free memory the device may touch), then destroys cache,
  // engine, arena, pool, stream order, backend adaptor and backend, in that order,
  // the last device's first. Blocks.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  Runtime(Runtime&&) = delete;
  Runtime& operator=(Runtime&&) = delete;

  // The components of device 0. Never fail, never block. backend() is the backend
  // adaptor when one is set (Backend::innermost() reaches the one make_backend built).
  Backend& backend() noexcept { return devices_.front()->backend(); }
  StreamOrder& order() noexcept { return devices_.front()->order(); }
  DevicePool& pool() noexcept { return devices_.front()->pool(); }
  HostArena& arena() noexcept { return devices_.front()->arena(); }
  TransferEngine& engine() noexcept { return devices_.front()->engine(); }

  // The devices (devices.hpp). device(i) needs i < device_count(); find_device
  // answers invalid_argument, naming the count, for any other i. Never block.
  std::uint32_t device_count() const noexcept { return static_cast<std::uint32_t>(devices_.size()); }
  RuntimeDevice& device(std::uint32_t i) noexcept { return *devices_[i]; }
  const RuntimeDevice& device(std::uint32_t i) const noexcept { return *devices_[i]; }
  Result<RuntimeDevice*> find_device(std::uint32_t i) noexcept;
  // Each device's pool figures, by device, and their sum (total_pool_stats).
  // Never fail, never block on the device.
  std::vector<PoolStats> pool_stats() const;
  PoolStats total_pool_stats() const;
  // The link between devices a and b, the one answer every caller asks
  // (copy_peer's choice of path, MultiDeviceCache's cost model, the C ABI's
  // ferry_device_link): what the two backends answered at create
  // (Backend::connect_peer; cuda: the driver), the weaker answer when they
  // differ, or where neither has a driver to ask (the sim) the model of
  // DevicesOptions::links. none for a == b or a device beyond the count.
  // Never fails, never blocks.
  PeerLink link_between(std::uint32_t a, std::uint32_t b) const noexcept;
  // memory_summary of each device's pool under a heading naming the device
  // ("device 1 (rtx3090)"), then, with several devices, the summed figures.
  // Never fails, never blocks on the device.
  std::string memory_summary() const;

  // Copies bytes [src_offset, src_offset + bytes) of `src` to [dst_offset, ...) of
  // `dst`, whichever devices' pools the handles name (devices.hpp). On one device:
  // the engine's copy_on_device (device 0's through calls(): a capture records it,
  // graph.hpp; across devices a capturing stream of device 0 refuses it). Across
  // two linked devices (link_between) whose destination `stream` is not
  // held: direct, the destination's device
  // pulling over the link (PeerCopyOp) on its `stream`, ordered by waits across
  // devices (order_after) after the source block's last uses on every stream of
  // its device (DevicePool::last_uses: every op enqueued on it before the call,
  // writes included; not the rest of the source's `stream`, so prefetches queued
  // there do not delay the pull; work of the program's own on the block counts
  // only when declared, record_use), and the
  // source's `stream` ordered after the pull by another, which leases the source
  // until the pull completed (I2: freeing it meanwhile is safe; later work on
  // that stream follows the pull). Integrity off, that blocks on nothing (receipt.done
  // says when the pull completes); under probe and verify both sides are hashed
  // on their devices (a link has no pinned unit for probe's canary; the source's
  // hash on an idle verify stream of its engine, after those uses, the pull after
  // the hash), the call
  // returns once both hashes completed, and a mismatch is redone through the host
  // (I5). Otherwise (no link, a held destination stream, a mismatch): through a pinned block of the
  // destination's arena, downloaded from the source on the source device's `stream`
  // (ordered after the source's last uses on its other streams too)
  // and uploaded on the destination device's `stream`, each leg under its engine's
  // integrity policy (verify: device hash of the source == host bytes == device
  // hash of the destination; a mismatch retries the leg through another path, I5).
  // Each leg leases its block while it is queued (I2), so freeing either handle
  // from another thread meanwhile is safe. Returns once the bytes are on the
  // destination (off/probe: enqueued there; receipt.done says when complete).
  // Errors: invalid_argument (0 bytes, a range outside its block, a bad stream),
  // stale_handle (a handle no device's pool knows), out_of_memory (no pinned
  // staging), transfer_corrupt (a leg never verified; names it), timeout,
  // backend_error. Blocks (bounded) while the staged source leg or the direct
  // copy's hashes complete. A free of `src` on another thread racing the direct
  // path's enqueue (before its source wait leases it) is the program's race.
  Result<PeerCopyReceipt> copy_peer(DeviceHandle dst, std::uint64_t dst_offset, DeviceHandle src,
                                    std::uint64_t src_offset, std::uint64_t bytes, StreamId stream);
  // Orders later work on `stream` of device `device` after `point` of device
  // `from_device`, without the host: an event of the source's device (export_event)
  // waited on by the stream (a NativeWaitOp; cuda: cudaStreamWaitEvent across
  // devices; the sim's wait completes no earlier than the point did on the
  // source's clock, and its race checker joins the two devices' clocks). On one
  // device it is StreamOrder::order_after. Enqueues nothing, returning 0, when the
  // point has completed (or is ticket 0). Dispatches held work of the point's
  // stream up to it, as export_event does; the wait itself stays queued behind a
  // hold of `stream`, and the event lives until the wait is known complete (the
  // Runtime releases it at a later order_after, synchronize or its destruction).
  // Returns the wait's ticket on `stream`. Errors: invalid_argument (a device
  // beyond device_count(), naming it; a bad stream; a point not handed out on
  // its device; a stream of device 0 that is capturing), timeout (the point waits
  // for held work of another stream, which is named), backend_error. Never blocks
  // on device work (the sim runs the source's model: virtual time only).
  Result<Ticket> order_after(std::uint32_t device, StreamId stream, std::uint32_t from_device, StreamPoint point);
  // The program's own native stream as a stream id of device `device`
  // (Backend::adopt_stream of its backend; device 0's is the C ABI's
  // ferry_adopt_stream). A native stream adopted through this call on one device is
  // refused on every other until released: two devices' ferry streams would be one
  // native stream (cuda: a stream belongs to one device's context). Errors:
  // invalid_argument (no such device, named; a null native stream, one of the
  // device's own streams, one adopted already on this device or, naming it,
  // another), out_of_memory (every adoptable id of the device is in use). Never
  // blocks on the device.
  Result<StreamId> adopt_stream(std::uint32_t device, NativeStream native);
  // Backend::release_stream of device `device`: waits (bounded by `timeout`) for the
  // adopted stream's work, then forgets it. Errors: invalid_argument (no such
  // device; `stream` is not adopted on that device, as a stream adopted on another
  // device is not), timeout, backend_error. Blocks.
  Result<void> release_stream(std::uint32_t device, StreamId stream, std::chrono::nanoseconds timeout);
  // Null unless RuntimeOptions::cache was set.
  OffloadCache* cache() noexcept { return cache_.get(); }
  const RuntimeOptions& options() const noexcept { return options_; }

  // Health: ok, or the first sticky device fault known (of any device). That is the first
  // backend_error synchronize() answered (a device fault is sticky on every
  // backend: a CUDA context error, the sim's access to unmapped memory), else a
  // backend_error when the backend counted device operations that touched
  // unmapped memory (FaultCounters::illegal_accesses; the sim then fails every
  // later operation). A failed construction never yields a Runtime, so the
  // components' own status() is always ok here. Never blocks on the device.
  Result<void> status() const;

  // Dispatches held work and waits for every stream of every device
  // (Backend::synchronize, device by device).
  // Errors: backend_error (a device fault: status() reports it from then on),
  // timeout. Blocks.
  Result<void> synchronize();

  // The pool adaptor slot. calls() is what a program's calls on the pool, the
  // engine and the streams go through (pool_calls.hpp): a front that forwards
  // each call, when it runs, to the adaptor set last, or to direct_calls() when
  // none is set; so a pointer taken before an adaptor is set goes through it
  // too. The pointer it returns keeps that adaptor alive while the caller uses
  // it, even once another replaces it. Never blocks.
  std::shared_ptr<PoolCalls> calls() const;
  // Puts `adaptor` in the slot (null: the direct calls again) and returns the one
  // it replaced (null when none was set). An adaptor wraps direct_calls() (or an
  // adaptor over them), forwards every call it does not answer itself (record_use
  // and note_graph included), and must not outlive the Runtime; the slot drops
  // its reference before any component goes. Never blocks.
  std::shared_ptr<PoolCalls> set_pool_adaptor(std::shared_ptr<PoolCalls> adaptor);
  // The end of the chain: the graph capture's calls (graph.hpp), which record
  // the calls made on capturing streams and make every other one straight on
  // the components (Runtime::synchronize for synchronize()).
  PoolCalls& direct_calls() noexcept;

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
  // Whether `stream` is between begin_capture and end_capture (false for a stream
  // out of range). Never fails, never blocks.
  bool capturing(StreamId stream) const;
  // Enqueues the graph's ops on `stream`, in order, on the direct calls behind
  // the adaptor in the slot (which is told of the launch, not of its ops:
  // PoolCalls::note_graph), then a record_use of every block it touches (each is
  // leased until this replay has completed). Errors, before anything is
  // enqueued: invalid_argument (an empty graph or another Runtime's, a stream out
  // of range or capturing), stale_handle (a block the graph touches was freed
  // outside it: the message names the op). After: what an op's enqueue returns
  // (the replay stops there; its message names the op). Never blocks on the
  // device.
  Result<void> launch(const Graph& graph, StreamId stream);

 private:
  friend class detail::GraphCapture;
  friend class detail::SlotFront;
  friend class Graph;
  friend class GraphPool;
  // The calls in the pool adaptor slot, or direct_calls(): where calls() forwards.
  std::shared_ptr<PoolCalls> slot_calls() const;
  // The graph capture (capture_, copied under calls_mu_). Never blocks.
  std::shared_ptr<detail::GraphCapture> graph_capture() const;
  // Tells the calls in the slot (PoolCalls::note_graph); told() also sets the
  // event's error from `result`, and returns it.
  void note_graph(const GraphEvent& event) const;
  template <class R>
  R told(GraphEvent event, R result) const;
  // invalid_argument, naming `call`, when `stream` is capturing.
  Result<void> refuse_if_capturing(StreamId stream, std::string_view call) const;

  explicit Runtime(RuntimeOptions options) : options_(std::move(options)) {}
  // Builds device `index` from `spec` and appends it to devices_ (partly built on error).
  Result<void> build_device(const BackendSpec& spec, std::uint32_t index);
  // Asks every ordered pair of devices for its link (Backend::connect_peer) and
  // fills links_. Once, in create, after every device is built.
  Result<void> connect_devices();

  RuntimeOptions options_;
  // Built in index order; the destructor resets them in reverse. Never empty once built.
  std::vector<std::unique_ptr<RuntimeDevice>> devices_;
  // links_[a * n + b] == links_[b * n + a], n = devices_.size(); written only by create.
  std::vector<PeerLink> links_;
  std::unique_ptr<OffloadCache> cache_;
  std::unique_ptr<PoolCalls> direct_;  // over device 0's pool and engine: behind the capture

  mutable std::mutex calls_mu_;  // guards front_, pool_adaptor_ and capture_ (their copy and swap, never a call's run)
  std::shared_ptr<PoolCalls> front_;  // what calls() returns: forwards to slot_calls()
  std::shared_ptr<PoolCalls> pool_adaptor_;
  // The end of the chain (made by create, a detail::GraphCapture over direct_):
  // it records capturing streams' calls and defers frees of private pools' blocks.
  std::shared_ptr<PoolCalls> capture_;

  mutable std::mutex fault_mu_;  // guards first_fault_
  std::optional<Error> first_fault_;

  // An event order_after exported on device `from`, waited on by `wait` of device
  // `to`; `seq` numbers them in the order they were made.
  struct CrossWait {
    std::uint32_t to = 0, from = 0;
    StreamPoint wait;
    NativeEvent event = nullptr;
    std::uint64_t seq = 0;
  };
  // order_after across two devices: a NativeWaitOp on `to`'s `stream` for an
  // event of `from` at `point` (none when the point completed: returns 0), kept
  // in cross_waits_. With `lease`, the wait's prepare leases that block of `to`'s
  // pool for the wait's ticket, so it stays leased until `point` completed (I2
  // across devices). Errors: those of export_event, the lease and the enqueue.
  Result<Ticket> wait_across(RuntimeDevice& to, StreamId stream, RuntimeDevice& from, StreamPoint point,
                             const DeviceHandle* lease);
  // Releases the events whose waits are known complete, and every one numbered
  // below `settled` (made before a synchronize that succeeded). Never blocks.
  void release_cross_waits(std::uint64_t settled);
  std::mutex cross_mu_;  // guards cross_waits_ and cross_seq_ (released outside it)
  std::vector<CrossWait> cross_waits_;
  std::uint64_t cross_seq_ = 0;  // the next CrossWait's seq

  // The native streams adopt_stream adopted, by device, until release_stream.
  struct Adoption {
    std::uint32_t device = 0;
    StreamId stream = 0;
    NativeStream native = nullptr;
  };
  std::mutex adopt_mu_;  // guards adoptions_; held across a backend's adopt_stream (which never blocks), never across a release's wait
  std::vector<Adoption> adoptions_;
};

}  // namespace ferry
