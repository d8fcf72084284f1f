// The graph capture (graph.hpp): the end of a Runtime's chain of calls
// (Runtime::direct_calls), behind the adaptor in its slot. It records the calls
// made on capturing streams, keeps each graph's private pool and defers the
// program's frees of that pool's blocks; every other call, a launch's ops and
// a pool's last frees go straight to the direct calls it wraps.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "ferry/forwarding_pool_calls.hpp"
#include "ferry/graph.hpp"
#include "ferry/pool_calls.hpp"
#include "ferry/runtime.hpp"

namespace ferry::detail {

using HandleKey = std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>;
inline HandleKey key_of(DeviceHandle h) { return {h.pool, h.slot, h.generation}; }

// invalid_argument: `call` on capturing stream `stream` is refused, and why.
Error refused(std::string_view call, StreamId stream, std::string_view why);

// The handle a block has now, for one the capture recorded (a pool block may have
// been reissued since).
using Remap = std::function<DeviceHandle(DeviceHandle)>;
// What a replay enqueues for one recorded call, on the stream the graph is launched on.
using Replay = std::function<Result<void>(PoolCalls&, StreamId, const Remap&)>;

struct RecordedOp {
  std::string what;
  Replay run;
  // Device work on pool memory alone (fill, compute, user op, record_use): it may
  // go in the device's native graph. The transfer engine's calls never do: each
  // is counted and checked by the engine at its enqueue, replay after replay.
  bool device_only = false;
};

// A private pool: blocks allocated on its capturing streams, kept until its last
// graph goes, and the parts later allocations of its captures cut from the
// blocks the program freed (graph_pool.cpp). Guarded by the GraphCapture's mutex.
//   a block holds a part  =>  the block is not held whole
//   the held parts of a block are disjoint, inside [0, its rounded bytes)
//   while a block is kept, every part of it has a handle that resolves
struct GraphPoolState {
  struct Block {
    DeviceHandle current;    // its handle now (reissued when reused)
    std::uint64_t bytes = 0;  // as requested
    bool held = false;        // the program holds `current`: the whole block
    bool kept = true;         // the pool's (false: freed, or the program's again)
  };
  // A sub-block (DevicePool::sub_block) of a block the program freed, for a
  // smaller allocation of a capture: the recorded ops follow it as they follow
  // a block, through every handle it has had.
  struct Part {
    std::size_t block = 0;
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;  // as requested
    DeviceHandle current;     // its handle now (the pool's own once the program freed it)
    bool held = true;         // the program holds `current`
  };
  Runtime* runtime = nullptr;
  std::uint64_t id = 0;  // GraphEvent::pool
  std::vector<Block> blocks;
  std::vector<Part> parts;
  std::map<HandleKey, std::size_t> alias;       // every handle a block has had -> its index
  std::map<HandleKey, std::size_t> part_alias;  // every handle a part has had -> its index
  std::uint64_t users = 0;                      // graphs and open captures
  bool capturing = false;

  bool holds_part(std::size_t block) const {
    return std::any_of(parts.begin(), parts.end(), [&](const Part& p) { return p.held && p.block == block; });
  }
  bool keeps_any() const {
    return std::any_of(blocks.begin(), blocks.end(), [](const Block& b) { return b.kept; });
  }
  // Once no block is kept, no handle the pool has known names its memory.
  void forget_if_empty() {
    if (keeps_any()) return;
    blocks.clear();
    parts.clear();
    alias.clear();
    part_alias.clear();
  }
  // The handle a recorded handle's memory has now (h itself: not the pool's).
  DeviceHandle now(DeviceHandle h) const;
  // The whole block under a recorded handle now: a part's block (h itself: not the pool's).
  DeviceHandle whole(DeviceHandle h) const;
};

struct GraphState {
  Runtime* runtime = nullptr;
  std::uint64_t id = 0;  // GraphEvent::graph
  StreamId captured_on = 0;
  std::shared_ptr<GraphPoolState> pool;
  std::vector<RecordedOp> ops;
  std::vector<DeviceHandle> blocks;  // every block an op touches, each once, as recorded
  std::optional<Error> spoiled;      // the first refused call of the capture
  // The last uses of the pool memory the capture was handed back (the program's
  // work before it freed it): every replay is ordered after them (I3).
  UseSet inherited;
  std::atomic<std::uint64_t> launches{0};
  // Set at end_capture, then constant. The device's graph of the ops, when it made
  // one: a launch is then one user op over every block; else why not (GraphStats).
  std::optional<NativeGraph> native;
  std::string per_op_reason;

  void touch(DeviceHandle h) {
    if (std::find(blocks.begin(), blocks.end(), h) == blocks.end()) blocks.push_back(h);
  }
};

// The calls it does not override (pool, engine, trim) go straight to `direct`.
class GraphCapture final : public ForwardingPoolCalls {
 public:
  // `direct` (the Runtime's own calls on its components) must outlive it.
  GraphCapture(Runtime& rt, PoolCalls& direct) noexcept : ForwardingPoolCalls(direct), rt_(rt), direct_(direct) {}

  Result<void> begin(StreamId stream, std::shared_ptr<GraphPoolState> pool);
  Result<std::shared_ptr<GraphState>> end(StreamId stream);
  bool capturing(StreamId stream) const;
  // invalid_argument, spoiling the capture, when `stream` captures: `call` cannot be recorded.
  Result<void> refuse_on(StreamId stream, std::string_view call, std::string_view why);
  // One user of the pool fewer; the last one frees the blocks the program freed
  // and hands the others back to the program.
  Result<void> release(GraphState& state);
  GraphPoolStats pool_stats(const GraphPoolState& pool) const;
  // Every pool in use (a graph or a capture holds it), oldest first.
  std::vector<GraphPoolStats> all_pools() const;
  // The handles the recorded blocks of `state` have now, in the order of state.blocks.
  std::vector<DeviceHandle> current_blocks(const GraphState& state) const;
  GraphStats stats(const GraphState& state) const;
  // Enqueues the graph's ops on `stream`, then a record_use of its blocks
  // (Runtime::launch says when, and its errors).
  Result<void> launch(GraphState& state, StreamId stream);

  Result<DeviceHandle> allocate(std::uint64_t bytes, StreamId stream, std::string_view tag) override;
  Result<void> free(DeviceHandle handle) override;
  Result<Ticket> fill(StreamId stream, DeviceHandle dst, std::uint64_t seed) override;
  Result<Ticket> compute(StreamId stream, std::span<const DeviceHandle> inputs, DeviceHandle output, double flops,
                         std::uint64_t mem_bytes) override;
  Result<Ticket> copy_to_host(StreamId stream, DeviceHandle src, std::span<std::byte> dst) override;
  Result<Ticket> user(StreamId stream, std::span<const Operand> operands, UserKernel kernel, UserCost cost,
                      std::string tag) override;
  Result<Ticket> record_use(StreamId stream, std::span<const DeviceHandle> handles) override;
  Result<TransferReceipt> upload(StreamId stream, const TransferPlan& plan) override;
  Result<TransferReceipt> download(StreamId stream, DeviceHandle src, std::uint64_t src_offset,
                                   std::span<std::byte> dst) override;
  Result<TransferReceipt> copy_on_device(StreamId stream, DeviceHandle dst, std::uint64_t dst_offset,
                                         DeviceHandle src, std::uint64_t src_offset, std::uint64_t bytes) override;
  Result<void> hold(StreamId stream) override;
  Result<void> release(StreamId stream) override;
  Result<void> wait(StreamId stream, StreamId for_stream) override;
  Result<void> synchronize(StreamId stream) override;
  Result<void> synchronize() override;

 private:
  std::shared_ptr<GraphState> open_on(StreamId stream) const;
  // The handle each recorded block has now: `now` is current_blocks(state).
  static Remap remap_to(const GraphState& state, const std::vector<DeviceHandle>& now);
  // end_capture on a device with native graphs: replays the ops once into
  // Backend::begin_graph / end_graph. Sets state.native, or state.per_op_reason.
  void build_native(GraphState& state);
  Result<void> launch_native(GraphState& state, StreamId stream, const std::vector<DeviceHandle>& now);
  Error spoil(GraphState& state, Error e);
  // Ticket 0: nothing was enqueued (graph.hpp).
  Result<Ticket> record(GraphState& state, std::string what, std::vector<DeviceHandle> touched, Replay run,
                        bool device_only = false);
  static TransferReceipt recorded_receipt(StreamId stream);

  // graph_pool.cpp, under mu_. A later allocation of a capture of `pool` from
  // the memory the program freed in it: the same size whole, else the best fit
  // among the free ranges of its blocks; nullopt when none fits.
  std::optional<DeviceHandle> reuse(const std::shared_ptr<GraphPoolState>& pool, std::uint64_t bytes);
  // After block i got a new handle (reissue drops its sub-blocks): every part of
  // it is cut again, under a handle only the pool knows.
  void recut_parts(GraphPoolState& pool, std::size_t i);
  // The program's free of a pool block or part: deferred, its handle stale (I1).
  // Returns a block to free now (a part's block once its pool's graphs are gone
  // and its last part is freed).
  std::optional<DeviceHandle> defer_free(GraphPoolState& pool, DeviceHandle handle);
  // One op of a native launch over every block: each part's whole block instead
  // of it (two overlapping operands would copy back over each other on the sim).
  std::vector<DeviceHandle> native_operands(const GraphState& state, const std::vector<DeviceHandle>& now) const;

  Runtime& rt_;
  PoolCalls& direct_;
  mutable std::mutex mu_;  // guards open_, owners_, the open states' ops and every pool's state
  std::map<StreamId, std::shared_ptr<GraphState>> open_;
  std::vector<std::weak_ptr<GraphPoolState>> pools_;  // every pool made, for all_pools
  // Pool blocks the program holds, by their handle now: its free() of one is deferred.
  std::map<HandleKey, std::shared_ptr<GraphPoolState>> owners_;
  std::uint64_t made_ = 0;  // graphs and pools made so far: their ids
};

}  // namespace ferry::detail
