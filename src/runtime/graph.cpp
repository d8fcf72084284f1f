#include "ferry/graph.hpp"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/text.hpp"
#include "ferry/pool_calls.hpp"
#include "ferry/runtime.hpp"
#include "ferry/user_kernel.hpp"

namespace ferry {
namespace detail {
namespace {

using HandleKey = std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>;
HandleKey key_of(DeviceHandle h) { return {h.pool, h.slot, h.generation}; }

Error refused(std::string_view call, StreamId stream, std::string_view why) {
  return make_error(ErrorCode::invalid_argument, std::string(call) + " on capturing stream " +
                                                     std::to_string(stream) + " is refused: " + std::string(why));
}

// The handle a block has now, for one the capture recorded (a pool block may have
// been reissued since).
using Remap = std::function<DeviceHandle(DeviceHandle)>;
// What a replay enqueues for one recorded call, on the stream the graph is launched on.
using Replay = std::function<Result<void>(PoolCalls&, StreamId, const Remap&)>;

struct RecordedOp {
  std::string what;
  Replay run;
};

template <class T>
Result<void> as_void(Result<T> r) {
  if (!r.ok()) return std::move(r).error();
  return {};
}

}  // namespace

// A private pool: blocks allocated on its capturing streams, kept until its last
// graph goes. Guarded by the GraphCapture's mutex.
struct GraphPoolState {
  struct Block {
    DeviceHandle current;    // its handle now (reissued when reused)
    std::uint64_t bytes = 0;  // as requested
    bool held = false;        // the program holds `current`; else freed, the pool's to reuse
  };
  Runtime* runtime = nullptr;
  std::vector<Block> blocks;
  std::map<HandleKey, std::size_t> alias;  // every handle a block has had -> its index
  std::uint64_t users = 0;                 // graphs and open captures
  bool capturing = false;
};

struct GraphState {
  Runtime* runtime = nullptr;
  StreamId captured_on = 0;
  std::shared_ptr<GraphPoolState> pool;
  std::vector<RecordedOp> ops;
  std::vector<DeviceHandle> blocks;  // every block an op touches, each once, as recorded
  std::optional<Error> spoiled;      // the first refused call of the capture
  std::atomic<std::uint64_t> launches{0};

  void touch(DeviceHandle h) {
    if (std::find(blocks.begin(), blocks.end(), h) == blocks.end()) blocks.push_back(h);
  }
};

// What Runtime::calls() returns once a capture has begun: records the calls on
// capturing streams, defers the program's frees of private pools' blocks, and
// forwards everything else to the slot's calls.
class GraphCapture final : public PoolCalls {
 public:
  explicit GraphCapture(Runtime& rt) noexcept : rt_(rt) {}

  DevicePool& pool() noexcept override { return rt_.pool(); }
  TransferEngine& engine() noexcept override { return rt_.engine(); }

  Result<void> begin(StreamId stream, std::shared_ptr<GraphPoolState> pool) {
    std::lock_guard lock(mu_);
    if (open_.count(stream) != 0) {
      return make_error(ErrorCode::invalid_argument,
                        "begin_capture: stream " + std::to_string(stream) + " is capturing already");
    }
    if (pool && pool->runtime != &rt_) {
      return make_error(ErrorCode::invalid_argument, "begin_capture: the pool belongs to another Runtime");
    }
    if (pool && pool->capturing) {
      return make_error(ErrorCode::invalid_argument,
                        "begin_capture: the pool is in use by another capture (captures share a pool one "
                        "after another)");
    }
    if (!pool) {
      pool = std::make_shared<GraphPoolState>();
      pool->runtime = &rt_;
      std::erase_if(pools_, [](const std::weak_ptr<GraphPoolState>& p) { return p.expired(); });
      pools_.push_back(pool);
    }
    pool->capturing = true;
    ++pool->users;
    auto state = std::make_shared<GraphState>();
    state->runtime = &rt_;
    state->captured_on = stream;
    state->pool = std::move(pool);
    open_.emplace(stream, std::move(state));
    return {};
  }

  Result<std::shared_ptr<GraphState>> end(StreamId stream) {
    std::shared_ptr<GraphState> state;
    {
      std::lock_guard lock(mu_);
      auto it = open_.find(stream);
      if (it == open_.end()) {
        return make_error(ErrorCode::invalid_argument,
                          "end_capture: stream " + std::to_string(stream) + " is not capturing");
      }
      state = std::move(it->second);
      open_.erase(it);
      state->pool->capturing = false;
    }
    if (state->spoiled) {
      Error why = *state->spoiled;
      (void)release(*state);
      why.message = "capture on stream " + std::to_string(stream) + " spoiled: " + why.message;
      return why;
    }
    return state;
  }

  bool capturing(StreamId stream) const {
    std::lock_guard lock(mu_);
    return open_.count(stream) != 0;
  }

  // One user of the pool fewer; the last one frees the blocks the program freed
  // and hands the others back to the program.
  Result<void> release(GraphState& state) {
    std::vector<DeviceHandle> to_free;
    {
      std::lock_guard lock(mu_);
      GraphPoolState& pool = *state.pool;
      if (--pool.users == 0) {
        for (const GraphPoolState::Block& b : pool.blocks) {
          if (b.held) owners_.erase(key_of(b.current));
          else to_free.push_back(b.current);
        }
        pool.blocks.clear();
        pool.alias.clear();
      }
    }
    const std::shared_ptr<PoolCalls> calls = rt_.slot_calls();
    Result<void> first;
    for (DeviceHandle h : to_free) {
      Result<void> r = calls->free(h);
      if (!r.ok() && first.ok()) first = std::move(r);
    }
    return first;
  }

  GraphPoolStats pool_stats(const GraphPoolState& pool) const {
    GraphPoolStats s;
    std::lock_guard lock(mu_);
    s.blocks = pool.blocks.size();
    s.graphs = pool.users;
    for (const GraphPoolState::Block& b : pool.blocks) {
      s.reserved_bytes += b.bytes;
      if (b.held) s.allocated_bytes += b.bytes;
    }
    return s;
  }

  // Every pool in use (a graph or a capture holds it), oldest first.
  std::vector<GraphPoolStats> all_pools() const {
    std::vector<std::shared_ptr<GraphPoolState>> live;
    {
      std::lock_guard lock(mu_);
      for (const std::weak_ptr<GraphPoolState>& p : pools_) {
        if (std::shared_ptr<GraphPoolState> pool = p.lock(); pool && pool->users > 0) live.push_back(std::move(pool));
      }
    }
    std::vector<GraphPoolStats> out;
    for (const auto& pool : live) out.push_back(pool_stats(*pool));
    return out;
  }

  // The handles the recorded blocks of `state` have now, in the order of state.blocks.
  std::vector<DeviceHandle> current_blocks(const GraphState& state) const {
    std::vector<DeviceHandle> now = state.blocks;
    std::lock_guard lock(mu_);
    for (DeviceHandle& h : now) {
      if (auto it = state.pool->alias.find(key_of(h)); it != state.pool->alias.end()) {
        h = state.pool->blocks[it->second].current;
      }
    }
    return now;
  }

  GraphStats stats(const GraphState& state) const {
    GraphStats s;
    s.ops = state.ops.size();
    s.blocks = state.blocks.size();
    s.launches = state.launches.load(std::memory_order_relaxed);
    return s;
  }

  // --- the calls ---------------------------------------------------------------

  Result<DeviceHandle> allocate(std::uint64_t bytes, StreamId stream, std::string_view tag) override {
    std::shared_ptr<GraphState> state = open_on(stream);
    if (!state) return rt_.slot_calls()->allocate(bytes, stream, tag);
    // The pool rounds to 256; a request that does not fit now runs the reclaim
    // ladder, whose last rung waits for in-flight frees: a host wait.
    const std::uint64_t rounded = bytes > UINT64_MAX - 255 ? UINT64_MAX : (bytes + 255) / 256 * 256;
    const std::uint64_t fits = rt_.pool().largest_free_extent();
    if (bytes != 0 && rounded > fits) {
      return spoil(*state, refused("allocate(" + std::to_string(bytes) + " bytes)", stream,
                                   "it does not fit now (largest free extent " + std::to_string(fits) +
                                       " bytes) and the reclaim ladder would wait for in-flight frees"));
    }
    {
      std::lock_guard lock(mu_);
      GraphPoolState& pool = *state->pool;
      for (std::size_t i = 0; i < pool.blocks.size(); ++i) {
        GraphPoolState::Block& b = pool.blocks[i];
        // The same size only: the ops recorded over the block's old handle keep
        // their ranges when they follow it.
        if (b.held || b.bytes != bytes) continue;
        Result<DeviceHandle> again = rt_.pool().reissue(b.current, bytes);
        if (!again.ok()) continue;  // its slot at its last generation: allocate anew
        b.current = *again;
        b.held = true;
        pool.alias[key_of(*again)] = i;
        owners_[key_of(*again)] = state->pool;
        return again;
      }
    }
    Result<DeviceHandle> h = rt_.slot_calls()->allocate(bytes, stream, tag);
    if (!h.ok()) return h;
    std::lock_guard lock(mu_);
    GraphPoolState& pool = *state->pool;
    pool.alias[key_of(*h)] = pool.blocks.size();
    pool.blocks.push_back({*h, bytes, true});
    owners_[key_of(*h)] = state->pool;
    return h;
  }

  Result<void> free(DeviceHandle handle) override {
    {
      std::lock_guard lock(mu_);
      auto it = owners_.find(key_of(handle));
      if (it != owners_.end()) {
        // Graphs' ops were recorded with this block's address: it stays the
        // pool's, reused by none but its captures, until its last graph goes.
        GraphPoolState& pool = *it->second;
        const std::size_t i = pool.alias.at(key_of(handle));
        GraphPoolState::Block& b = pool.blocks[i];
        // I1: the program's handle goes stale now, as at any free; the pool keeps
        // the block under a handle only it knows (at a slot's last generation it
        // keeps the old one).
        if (Result<DeviceHandle> again = rt_.pool().reissue(handle, b.bytes); again.ok()) {
          b.current = *again;
          pool.alias[key_of(*again)] = i;
        }
        b.held = false;
        owners_.erase(it);
        return {};
      }
    }
    return rt_.slot_calls()->free(handle);
  }

  Result<void> trim() override { return rt_.slot_calls()->trim(); }

  Result<Ticket> fill(StreamId stream, DeviceHandle dst, std::uint64_t seed) override {
    std::shared_ptr<GraphState> state = open_on(stream);
    if (!state) return rt_.slot_calls()->fill(stream, dst, seed);
    return record(*state, "fill", {dst}, [=](PoolCalls& c, StreamId s, const Remap& now) { return as_void(c.fill(s, now(dst), seed)); });
  }

  Result<Ticket> compute(StreamId stream, std::span<const DeviceHandle> inputs, DeviceHandle output, double flops,
                         std::uint64_t mem_bytes) override {
    std::shared_ptr<GraphState> state = open_on(stream);
    if (!state) return rt_.slot_calls()->compute(stream, inputs, output, flops, mem_bytes);
    std::vector<DeviceHandle> in(inputs.begin(), inputs.end());
    std::vector<DeviceHandle> touched = in;
    touched.push_back(output);
    return record(*state, "compute", touched, [=](PoolCalls& c, StreamId s, const Remap& now) {
      std::vector<DeviceHandle> in_now = in;
      for (DeviceHandle& h : in_now) h = now(h);
      return as_void(c.compute(s, in_now, now(output), flops, mem_bytes));
    });
  }

  Result<Ticket> copy_to_host(StreamId stream, DeviceHandle src, std::span<std::byte> dst) override {
    std::shared_ptr<GraphState> state = open_on(stream);
    if (!state) return rt_.slot_calls()->copy_to_host(stream, src, dst);
    return record(*state, "copy_to_host", {src},
                  [=](PoolCalls& c, StreamId s, const Remap& now) { return as_void(c.copy_to_host(s, now(src), dst)); });
  }

  Result<Ticket> user(StreamId stream, std::span<const Operand> operands, UserKernel kernel, UserCost cost,
                      std::string tag) override {
    std::shared_ptr<GraphState> state = open_on(stream);
    if (!state) return rt_.slot_calls()->user(stream, operands, std::move(kernel), cost, std::move(tag));
    if (!kernel) return spoil(*state, refused("user op", stream, "its kernel is empty"));
    std::vector<Operand> ops(operands.begin(), operands.end());
    std::vector<DeviceHandle> touched;
    for (const Operand& o : ops) touched.push_back(o.handle);
    return record(*state, tag.empty() ? std::string("user op") : "user op " + tag, touched,
                  [ops, kernel = std::move(kernel), cost, tag](PoolCalls& c, StreamId s, const Remap& now) {
                    std::vector<Operand> ops_now = ops;
                    for (Operand& o : ops_now) o.handle = now(o.handle);
                    return as_void(c.user(s, ops_now, kernel, cost, tag));
                  });
  }

  Result<Ticket> record_use(StreamId stream, std::span<const DeviceHandle> handles) override {
    std::shared_ptr<GraphState> state = open_on(stream);
    if (!state) return rt_.slot_calls()->record_use(stream, handles);
    std::vector<DeviceHandle> hs(handles.begin(), handles.end());
    return record(*state, "record_use", hs, [hs](PoolCalls& c, StreamId s, const Remap& now) {
      std::vector<DeviceHandle> hs_now = hs;
      for (DeviceHandle& h : hs_now) h = now(h);
      return as_void(c.record_use(s, hs_now));
    });
  }

  Result<TransferReceipt> upload(StreamId stream, const TransferPlan& plan) override {
    std::shared_ptr<GraphState> state = open_on(stream);
    if (!state) return rt_.slot_calls()->upload(stream, plan);
    const IntegrityPolicy policy = rt_.engine().policy();
    if (policy != IntegrityPolicy::off) {
      return spoil(*state, refused("upload", stream,
                                   std::string("the integrity policy is ") + std::string(to_string(policy)) +
                                       ": its compare of device and host bytes needs the host"));
    }
    std::vector<DeviceHandle> touched;
    for (const TransferRange& r : plan.ranges()) touched.push_back(r.dst);
    FERRY_TRY(record(*state, "upload", touched,
                     [plan](PoolCalls& c, StreamId s, const Remap& now) {
                       TransferPlan plan_now;
                       for (const TransferRange& r : plan.ranges()) {
                         if (r.host != nullptr) plan_now.add(r.host, now(r.dst), r.dst_offset, r.bytes);
                         else plan_now.add(r.block, r.block_offset, now(r.dst), r.dst_offset, r.bytes);
                       }
                       return as_void(c.upload(s, plan_now));
                     }));
    return recorded_receipt(stream);
  }

  Result<TransferReceipt> download(StreamId stream, DeviceHandle src, std::uint64_t src_offset,
                                   std::span<std::byte> dst) override {
    std::shared_ptr<GraphState> state = open_on(stream);
    if (!state) return rt_.slot_calls()->download(stream, src, src_offset, dst);
    return spoil(*state, refused("download", stream,
                                 "it waits on the host for the copy (record copy_to_host instead)"));
  }

  Result<TransferReceipt> copy_on_device(StreamId stream, DeviceHandle dst, std::uint64_t dst_offset,
                                         DeviceHandle src, std::uint64_t src_offset, std::uint64_t bytes) override {
    std::shared_ptr<GraphState> state = open_on(stream);
    if (!state) return rt_.slot_calls()->copy_on_device(stream, dst, dst_offset, src, src_offset, bytes);
    if (rt_.engine().policy() == IntegrityPolicy::verify) {
      return spoil(*state, refused("copy_on_device", stream,
                                   "the integrity policy is verify: its hash compare waits on the host"));
    }
    FERRY_TRY(record(*state, "copy_on_device", {dst, src}, [=](PoolCalls& c, StreamId s, const Remap& now) {
      return as_void(c.copy_on_device(s, now(dst), dst_offset, now(src), src_offset, bytes));
    }));
    return recorded_receipt(stream);
  }

  Result<void> hold(StreamId stream) override {
    if (std::shared_ptr<GraphState> state = open_on(stream)) {
      return spoil(*state, refused("hold", stream, "a graph is replayed whole; a held part would run apart from it"));
    }
    return rt_.slot_calls()->hold(stream);
  }

  Result<void> release(StreamId stream) override {
    if (std::shared_ptr<GraphState> state = open_on(stream)) {
      return spoil(*state, refused("release", stream, "a graph is replayed whole; nothing of it is held"));
    }
    return rt_.slot_calls()->release(stream);
  }

  Result<void> wait(StreamId stream, StreamId for_stream) override {
    if (stream != for_stream) {
      for (StreamId s : {stream, for_stream}) {
        if (std::shared_ptr<GraphState> state = open_on(s)) {
          return spoil(*state, refused("wait(" + std::to_string(stream) + " for " + std::to_string(for_stream) + ")",
                                       s, "a capture records one stream; a wait across streams would join another"));
        }
      }
    }
    return rt_.slot_calls()->wait(stream, for_stream);
  }

  Result<void> synchronize(StreamId stream) override {
    if (std::shared_ptr<GraphState> state = open_on(stream)) {
      return spoil(*state, refused("synchronize(stream)", stream, "a host wait: nothing recorded has run"));
    }
    return rt_.slot_calls()->synchronize(stream);
  }

  Result<void> synchronize() override {
    std::vector<std::shared_ptr<GraphState>> open;
    {
      std::lock_guard lock(mu_);
      for (auto& [s, state] : open_) open.push_back(state);
    }
    if (!open.empty()) {
      Error e = refused("synchronize()", open.front()->captured_on, "a host wait for every stream while one captures");
      for (auto& state : open) (void)spoil(*state, e);
      return e;
    }
    return rt_.slot_calls()->synchronize();
  }

 private:
  std::shared_ptr<GraphState> open_on(StreamId stream) const {
    std::lock_guard lock(mu_);
    auto it = open_.find(stream);
    return it == open_.end() ? nullptr : it->second;
  }

  Error spoil(GraphState& state, Error e) {
    std::lock_guard lock(mu_);
    if (!state.spoiled) state.spoiled = e;
    return e;
  }

  // Ticket 0: nothing was enqueued (graph.hpp).
  Result<Ticket> record(GraphState& state, std::string what, std::vector<DeviceHandle> touched, Replay run) {
    for (DeviceHandle h : touched) {
      if (Result<DeviceSpan> span = rt_.pool().resolve(h); !span.ok()) {
        return spoil(state, make_error(ErrorCode::stale_handle, what + " on capturing stream " +
                                                                    std::to_string(state.captured_on) + ": " +
                                                                    span.error().message));
      }
    }
    std::lock_guard lock(mu_);
    for (DeviceHandle h : touched) state.touch(h);
    state.ops.push_back({std::move(what), std::move(run)});
    return Ticket{0};
  }

  static TransferReceipt recorded_receipt(StreamId stream) {
    TransferReceipt r;
    r.done = StreamPoint{stream, 0};
    return r;
  }

  Runtime& rt_;
  mutable std::mutex mu_;  // guards open_, owners_, the open states' ops and every pool's state
  std::map<StreamId, std::shared_ptr<GraphState>> open_;
  std::vector<std::weak_ptr<GraphPoolState>> pools_;  // every pool made, for all_pools
  // Pool blocks the program holds, by their handle now: its free() of one is deferred.
  std::map<HandleKey, std::shared_ptr<GraphPoolState>> owners_;
};

std::shared_ptr<PoolCalls> make_graph_capture(Runtime& rt) { return std::make_shared<GraphCapture>(rt); }

}  // namespace detail

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    (void)destroy();
    state_ = std::move(other.state_);
  }
  return *this;
}

Graph::~Graph() { (void)destroy(); }

Result<void> Graph::destroy() {
  if (!state_) return {};
  std::shared_ptr<detail::GraphState> state = std::move(state_);
  Runtime& rt = *state->runtime;
  std::shared_ptr<PoolCalls> capture;
  {
    std::lock_guard lock(rt.calls_mu_);
    capture = rt.capture_;
  }
  return static_cast<detail::GraphCapture&>(*capture).release(*state);
}

GraphStats Graph::stats() const {
  if (!state_) return {};
  std::shared_ptr<PoolCalls> capture;
  {
    std::lock_guard lock(state_->runtime->calls_mu_);
    capture = state_->runtime->capture_;
  }
  return static_cast<detail::GraphCapture&>(*capture).stats(*state_);
}

GraphPool Graph::pool() const {
  if (!state_) return {};
  return GraphPool(state_->pool);
}

GraphPoolStats GraphPool::stats() const {
  if (!state_) return {};
  std::shared_ptr<PoolCalls> capture;
  {
    std::lock_guard lock(state_->runtime->calls_mu_);
    capture = state_->runtime->capture_;
  }
  return static_cast<detail::GraphCapture&>(*capture).pool_stats(*state_);
}

std::vector<GraphPoolStats> GraphPool::all(const Runtime& rt) {
  std::shared_ptr<PoolCalls> capture;
  {
    std::lock_guard lock(rt.calls_mu_);
    capture = rt.capture_;
  }
  return static_cast<const detail::GraphCapture&>(*capture).all_pools();
}

std::string graph_pools_summary(const Runtime& rt) {
  std::string out;
  const std::vector<GraphPoolStats> pools = GraphPool::all(rt);
  for (std::size_t i = 0; i < pools.size(); ++i) {
    const GraphPoolStats& p = pools[i];
    out += "graph pool " + std::to_string(i + 1) + ": " + std::to_string(p.blocks) + " block(s), reserved " +
           text::human_bytes(p.reserved_bytes, 2) + ", allocated " + text::human_bytes(p.allocated_bytes, 2) +
           ", " + std::to_string(p.graphs) + " graph(s)\n";
  }
  return out;
}

Result<void> Runtime::begin_capture(StreamId stream, CaptureOptions options) {
  FERRY_TRY(refuse_inside_user_kernel("Runtime::begin_capture"));
  FERRY_TRY(check_stream(stream, "begin_capture"));
  std::shared_ptr<PoolCalls> capture;
  {
    std::lock_guard lock(calls_mu_);
    capture = capture_;
  }
  return static_cast<detail::GraphCapture&>(*capture).begin(stream, std::move(options.pool.state_));
}

Result<Graph> Runtime::end_capture(StreamId stream) {
  FERRY_TRY(refuse_inside_user_kernel("Runtime::end_capture"));
  FERRY_TRY(check_stream(stream, "end_capture"));
  std::shared_ptr<PoolCalls> capture;
  {
    std::lock_guard lock(calls_mu_);
    capture = capture_;
  }
  Result<std::shared_ptr<detail::GraphState>> state = static_cast<detail::GraphCapture&>(*capture).end(stream);
  if (!state.ok()) return std::move(state).error();
  return Graph(std::move(state).value());
}

Result<void> Runtime::refuse_if_capturing(StreamId stream, std::string_view call) const {
  std::shared_ptr<PoolCalls> capture;
  {
    std::lock_guard lock(calls_mu_);
    capture = capture_;
  }
  if (static_cast<const detail::GraphCapture&>(*capture).capturing(stream)) {
    return detail::refused(call, stream, "an Allocation frees through the pool, past the graph; allocate through calls()");
  }
  return {};
}

Result<void> Runtime::launch(const Graph& graph, StreamId stream) {
  FERRY_TRY(refuse_inside_user_kernel("Runtime::launch"));
  FERRY_TRY(check_stream(stream, "launch"));
  if (!graph.state_) return make_error(ErrorCode::invalid_argument, "launch: the graph is empty");
  const detail::GraphState& state = *graph.state_;
  if (state.runtime != this) {
    return make_error(ErrorCode::invalid_argument, "launch: the graph was captured on another Runtime");
  }
  if (Result<void> r = refuse_if_capturing(stream, "launch"); !r.ok()) {
    return make_error(ErrorCode::invalid_argument,
                      "launch: stream " + std::to_string(stream) + " is capturing (a graph in a graph is not recorded)");
  }
  std::shared_ptr<PoolCalls> capture;
  {
    std::lock_guard lock(calls_mu_);
    capture = capture_;
  }
  const std::vector<DeviceHandle> now = static_cast<detail::GraphCapture&>(*capture).current_blocks(state);
  const detail::Remap remap = [&](DeviceHandle h) {
    const auto it = std::find(state.blocks.begin(), state.blocks.end(), h);
    return it == state.blocks.end() ? h : now[static_cast<std::size_t>(it - state.blocks.begin())];
  };
  // Every block checked before anything is enqueued: a replay never runs half
  // on blocks freed outside the graph (I1).
  for (DeviceHandle h : now) {
    if (Result<DeviceSpan> span = pool().resolve(h); !span.ok()) {
      return make_error(ErrorCode::stale_handle,
                        "launch: block " + text::handle(h) +
                            " of the graph was freed outside it; nothing enqueued (" + span.error().message + ")");
    }
  }
  const std::shared_ptr<PoolCalls> calls = slot_calls();
  for (std::size_t i = 0; i < state.ops.size(); ++i) {
    if (Result<void> r = state.ops[i].run(*calls, stream, remap); !r.ok()) {
      Error e = std::move(r).error();
      e.message = "launch: op " + std::to_string(i + 1) + " of " + std::to_string(state.ops.size()) + " (" +
                  state.ops[i].what + ") stopped the replay: " + e.message;
      return e;
    }
  }
  if (!state.blocks.empty()) {
    // One lease on every block until this whole replay has completed (I2 across replays).
    if (Result<Ticket> t = calls->record_use(stream, now); !t.ok()) return std::move(t).error();
  }
  graph.state_->launches.fetch_add(1, std::memory_order_relaxed);
  return {};
}

}  // namespace ferry
