#include "runtime/graph_capture.hpp"

#include <string>
#include <utility>
#include <vector>

#include "core/text.hpp"
#include "ferry/user_kernel.hpp"

namespace ferry::detail {
namespace {

template <class T>
Result<void> as_void(Result<T> r) {
  if (!r.ok()) return std::move(r).error();
  return {};
}

}  // namespace

Error refused(std::string_view call, StreamId stream, std::string_view why) {
  return make_error(ErrorCode::invalid_argument, std::string(call) + " on capturing stream " +
                                                     std::to_string(stream) + " is refused: " + std::string(why));
}

Result<void> GraphCapture::begin(StreamId stream, std::shared_ptr<GraphPoolState> pool) {
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
    pool->id = ++made_;
    std::erase_if(pools_, [](const std::weak_ptr<GraphPoolState>& p) { return p.expired(); });
    pools_.push_back(pool);
  }
  pool->capturing = true;
  ++pool->users;
  auto state = std::make_shared<GraphState>();
  state->runtime = &rt_;
  state->id = ++made_;
  state->captured_on = stream;
  state->pool = std::move(pool);
  open_.emplace(stream, std::move(state));
  return {};
}

Result<std::shared_ptr<GraphState>> GraphCapture::end(StreamId stream) {
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
  build_native(*state);
  return state;
}

bool GraphCapture::capturing(StreamId stream) const {
  std::lock_guard lock(mu_);
  return open_.count(stream) != 0;
}

Result<void> GraphCapture::refuse_on(StreamId stream, std::string_view call, std::string_view why) {
  if (std::shared_ptr<GraphState> state = open_on(stream)) return spoil(*state, refused(call, stream, why));
  return {};
}

GraphStats GraphCapture::stats(const GraphState& state) const {
  GraphStats s;
  s.ops = state.ops.size();
  s.blocks = state.blocks.size();
  s.launches = state.launches.load(std::memory_order_relaxed);
  s.native = state.native.has_value();
  s.per_op_reason = state.per_op_reason;
  return s;
}


Result<Ticket> GraphCapture::fill(StreamId stream, DeviceHandle dst, std::uint64_t seed) {
  std::shared_ptr<GraphState> state = open_on(stream);
  if (!state) return direct_.fill(stream, dst, seed);
  return record(
      *state, "fill", {dst},
      [=](PoolCalls& c, StreamId s, const Remap& now) { return as_void(c.fill(s, now(dst), seed)); }, true);
}

Result<Ticket> GraphCapture::compute(StreamId stream, std::span<const DeviceHandle> inputs, DeviceHandle output,
                                     double flops, std::uint64_t mem_bytes) {
  std::shared_ptr<GraphState> state = open_on(stream);
  if (!state) return direct_.compute(stream, inputs, output, flops, mem_bytes);
  std::vector<DeviceHandle> in(inputs.begin(), inputs.end());
  std::vector<DeviceHandle> touched = in;
  touched.push_back(output);
  return record(*state, "compute", touched, [=](PoolCalls& c, StreamId s, const Remap& now) {
    std::vector<DeviceHandle> in_now = in;
    for (DeviceHandle& h : in_now) h = now(h);
    return as_void(c.compute(s, in_now, now(output), flops, mem_bytes));
  }, true);
}

Result<Ticket> GraphCapture::copy_to_host(StreamId stream, DeviceHandle src, std::span<std::byte> dst) {
  std::shared_ptr<GraphState> state = open_on(stream);
  if (!state) return direct_.copy_to_host(stream, src, dst);
  return record(*state, "copy_to_host", {src},
                [=](PoolCalls& c, StreamId s, const Remap& now) { return as_void(c.copy_to_host(s, now(src), dst)); });
}

Result<Ticket> GraphCapture::user(StreamId stream, std::span<const Operand> operands, UserKernel kernel,
                                  UserCost cost, std::string tag) {
  std::shared_ptr<GraphState> state = open_on(stream);
  if (!state) return direct_.user(stream, operands, std::move(kernel), cost, std::move(tag));
  if (!kernel) return spoil(*state, refused("user op", stream, "its kernel is empty"));
  std::vector<Operand> ops(operands.begin(), operands.end());
  std::vector<DeviceHandle> touched;
  for (const Operand& o : ops) touched.push_back(o.handle);
  return record(*state, tag.empty() ? std::string("user op") : "user op " + tag, touched,
                [ops, kernel = std::move(kernel), cost, tag](PoolCalls& c, StreamId s, const Remap& now) {
                  std::vector<Operand> ops_now = ops;
                  for (Operand& o : ops_now) o.handle = now(o.handle);
                  return as_void(c.user(s, ops_now, kernel, cost, tag));
                },
                true);
}

Result<Ticket> GraphCapture::record_use(StreamId stream, std::span<const DeviceHandle> handles) {
  std::shared_ptr<GraphState> state = open_on(stream);
  if (!state) return direct_.record_use(stream, handles);
  std::vector<DeviceHandle> hs(handles.begin(), handles.end());
  return record(*state, "record_use", hs, [hs](PoolCalls& c, StreamId s, const Remap& now) {
    std::vector<DeviceHandle> hs_now = hs;
    for (DeviceHandle& h : hs_now) h = now(h);
    return as_void(c.record_use(s, hs_now));
  }, true);
}

Result<TransferReceipt> GraphCapture::upload(StreamId stream, const TransferPlan& plan) {
  std::shared_ptr<GraphState> state = open_on(stream);
  if (!state) return direct_.upload(stream, plan);
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

Result<TransferReceipt> GraphCapture::download(StreamId stream, DeviceHandle src, std::uint64_t src_offset,
                                               std::span<std::byte> dst) {
  std::shared_ptr<GraphState> state = open_on(stream);
  if (!state) return direct_.download(stream, src, src_offset, dst);
  return spoil(*state, refused("download", stream,
                               "it waits on the host for the copy (record copy_to_host instead)"));
}

Result<TransferReceipt> GraphCapture::copy_on_device(StreamId stream, DeviceHandle dst, std::uint64_t dst_offset,
                                                     DeviceHandle src, std::uint64_t src_offset,
                                                     std::uint64_t bytes) {
  std::shared_ptr<GraphState> state = open_on(stream);
  if (!state) return direct_.copy_on_device(stream, dst, dst_offset, src, src_offset, bytes);
  if (rt_.engine().policy() == IntegrityPolicy::verify) {
    return spoil(*state, refused("copy_on_device", stream,
                                 "the integrity policy is verify: its hash compare waits on the host"));
  }
  FERRY_TRY(record(*state, "copy_on_device", {dst, src}, [=](PoolCalls& c, StreamId s, const Remap& now) {
    return as_void(c.copy_on_device(s, now(dst), dst_offset, now(src), src_offset, bytes));
  }));
  return recorded_receipt(stream);
}

Result<void> GraphCapture::hold(StreamId stream) {
  if (std::shared_ptr<GraphState> state = open_on(stream)) {
    return spoil(*state, refused("hold", stream, "a graph is replayed whole; a held part would run apart from it"));
  }
  return direct_.hold(stream);
}

Result<void> GraphCapture::release(StreamId stream) {
  if (std::shared_ptr<GraphState> state = open_on(stream)) {
    return spoil(*state, refused("release", stream, "a graph is replayed whole; nothing of it is held"));
  }
  return direct_.release(stream);
}

Result<void> GraphCapture::wait(StreamId stream, StreamId for_stream) {
  if (stream != for_stream) {
    for (StreamId s : {stream, for_stream}) {
      if (std::shared_ptr<GraphState> state = open_on(s)) {
        return spoil(*state, refused("wait(" + std::to_string(stream) + " for " + std::to_string(for_stream) + ")",
                                     s, "a capture records one stream; a wait across streams would join another"));
      }
    }
  }
  return direct_.wait(stream, for_stream);
}

Result<void> GraphCapture::synchronize(StreamId stream) {
  if (std::shared_ptr<GraphState> state = open_on(stream)) {
    return spoil(*state, refused("synchronize(stream)", stream, "a host wait: nothing recorded has run"));
  }
  return direct_.synchronize(stream);
}

Result<void> GraphCapture::synchronize() {
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
  return direct_.synchronize();
}

std::shared_ptr<GraphState> GraphCapture::open_on(StreamId stream) const {
  std::lock_guard lock(mu_);
  auto it = open_.find(stream);
  return it == open_.end() ? nullptr : it->second;
}

Error GraphCapture::spoil(GraphState& state, Error e) {
  std::lock_guard lock(mu_);
  if (!state.spoiled) state.spoiled = e;
  return e;
}

Result<Ticket> GraphCapture::record(GraphState& state, std::string what, std::vector<DeviceHandle> touched, Replay run,
                                    bool device_only) {
  for (DeviceHandle h : touched) {
    if (Result<DeviceSpan> span = rt_.pool().resolve(h); !span.ok()) {
      return spoil(state, make_error(ErrorCode::stale_handle, what + " on capturing stream " +
                                                                  std::to_string(state.captured_on) + ": " +
                                                                  span.error().message));
    }
  }
  std::lock_guard lock(mu_);
  for (DeviceHandle h : touched) state.touch(h);
  state.ops.push_back({std::move(what), std::move(run), device_only});
  return Ticket{0};
}

TransferReceipt GraphCapture::recorded_receipt(StreamId stream) {
  TransferReceipt r;
  r.done = StreamPoint{stream, 0};
  return r;
}

Remap GraphCapture::remap_to(const GraphState& state, const std::vector<DeviceHandle>& now) {
  return [&state, &now](DeviceHandle h) {
    const auto it = std::find(state.blocks.begin(), state.blocks.end(), h);
    return it == state.blocks.end() ? h : now[static_cast<std::size_t>(it - state.blocks.begin())];
  };
}

void GraphCapture::build_native(GraphState& state) {
  Backend& device = rt_.backend();
  if (!device.info().native_graphs) {
    state.per_op_reason = "the device makes no native graphs";
    return;
  }
  if (state.ops.empty()) {
    state.per_op_reason = "nothing was captured";
    return;
  }
  for (std::size_t i = 0; i < state.ops.size(); ++i) {
    if (!state.ops[i].device_only) {
      state.per_op_reason = "op " + std::to_string(i + 1) + " (" + state.ops[i].what +
                            ") is a transfer engine call, which counts and checks each of its replays";
      return;
    }
  }
  const StreamId stream = state.captured_on;
  if (Result<void> r = device.begin_graph(stream); !r.ok()) {
    state.per_op_reason = r.error().message;
    return;
  }
  // The ops enqueued once more, on the capture stream: the device keeps their work
  // for its graph and runs a no-op in each one's place (Backend::begin_graph), so
  // their leases and the waits that order them after their blocks' users retire.
  const std::vector<DeviceHandle> now = current_blocks(state);
  const Remap remap = remap_to(state, now);
  for (std::size_t i = 0; i < state.ops.size(); ++i) {
    if (Result<void> r = state.ops[i].run(direct_, stream, remap); !r.ok()) {
      (void)device.end_graph(stream);
      state.per_op_reason = "op " + std::to_string(i + 1) + " (" + state.ops[i].what + "): " + r.error().message;
      return;
    }
  }
  Result<NativeGraph> graph = device.end_graph(stream);
  if (!graph.ok()) {
    state.per_op_reason = graph.error().message;
    return;
  }
  state.native = std::move(graph).value();
}

Result<void> GraphCapture::launch_native(GraphState& state, StreamId stream, const std::vector<DeviceHandle>& now) {
  // One op over every block, read and written: it leases them until the whole
  // replay has completed (I2) and is ordered after each block's earlier users (I3).
  std::vector<Operand> operands;
  for (DeviceHandle h : native_operands(state, now)) operands.push_back(Operand{h, Access::read_write});
  const NativeGraph& g = *state.native;
  Result<Ticket> t = direct_.user(stream, operands, g.launch, UserCost{g.flops, g.mem_bytes},
                                  "graph " + std::to_string(state.id));
  if (!t.ok()) {
    Error e = std::move(t).error();
    e.message = "launch: the graph's native launch was refused: " + e.message;
    return e;
  }
  state.launches.fetch_add(1, std::memory_order_relaxed);
  return {};
}

Result<void> GraphCapture::launch(GraphState& state, StreamId stream) {
  const std::vector<DeviceHandle> now = current_blocks(state);
  const Remap remap = remap_to(state, now);
  // Every block checked before anything is enqueued: a replay never runs half
  // on blocks freed outside the graph (I1).
  for (DeviceHandle h : now) {
    if (Result<DeviceSpan> span = rt_.pool().resolve(h); !span.ok()) {
      return make_error(ErrorCode::stale_handle,
                        "launch: block " + text::handle(h) +
                            " of the graph was freed outside it; nothing enqueued (" + span.error().message + ")");
    }
  }
  // I3 for memory the pool took back from the program: a replay on any stream
  // follows the program's work on it before its free (a no-op once that completed).
  for (const StreamPoint& p : state.inherited.points()) {
    if (Result<Ticket> t = rt_.order().order_after(stream, p, StreamOrder::HeldWork::dispatch); !t.ok()) {
      return std::move(t).error();
    }
  }
  if (state.native) return launch_native(state, stream, now);
  // Straight on the components: the adaptors in the slot saw the capture's calls
  // and see the launch (note_graph), not its ops again.
  for (std::size_t i = 0; i < state.ops.size(); ++i) {
    if (Result<void> r = state.ops[i].run(direct_, stream, remap); !r.ok()) {
      Error e = std::move(r).error();
      e.message = "launch: op " + std::to_string(i + 1) + " of " + std::to_string(state.ops.size()) + " (" +
                  state.ops[i].what + ") stopped the replay: " + e.message;
      return e;
    }
  }
  if (!state.blocks.empty()) {
    // One lease on every block until this whole replay has completed (I2 across replays).
    if (Result<Ticket> t = direct_.record_use(stream, now); !t.ok()) return std::move(t).error();
  }
  state.launches.fetch_add(1, std::memory_order_relaxed);
  return {};
}

std::shared_ptr<PoolCalls> make_graph_capture(Runtime& rt, PoolCalls& direct) {
  return std::make_shared<GraphCapture>(rt, direct);
}

}  // namespace ferry::detail
