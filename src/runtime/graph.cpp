#include "ferry/graph.hpp"

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/text.hpp"
#include "ferry/pool_calls.hpp"
#include "ferry/runtime.hpp"
#include "runtime/graph_capture.hpp"

namespace ferry {

std::shared_ptr<detail::GraphCapture> Runtime::graph_capture() const {
  std::lock_guard lock(calls_mu_);
  // create makes capture_ a GraphCapture, and nothing else is ever put there.
  return std::static_pointer_cast<detail::GraphCapture>(capture_);
}

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
  return state->runtime->graph_capture()->release(*state);
}

GraphStats Graph::stats() const {
  if (!state_) return {};
  return state_->runtime->graph_capture()->stats(*state_);
}

GraphPool Graph::pool() const {
  if (!state_) return {};
  return GraphPool(state_->pool);
}

GraphPoolStats GraphPool::stats() const {
  if (!state_) return {};
  return state_->runtime->graph_capture()->pool_stats(*state_);
}

std::vector<GraphPoolStats> GraphPool::all(const Runtime& rt) {
  return rt.graph_capture()->all_pools();
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
  return graph_capture()->begin(stream, std::move(options.pool.state_));
}

Result<Graph> Runtime::end_capture(StreamId stream) {
  FERRY_TRY(refuse_inside_user_kernel("Runtime::end_capture"));
  FERRY_TRY(check_stream(stream, "end_capture"));
  Result<std::shared_ptr<detail::GraphState>> state = graph_capture()->end(stream);
  if (!state.ok()) return std::move(state).error();
  return Graph(std::move(state).value());
}

Result<void> Runtime::refuse_if_capturing(StreamId stream, std::string_view call) const {
  if (graph_capture()->capturing(stream)) {
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
  const std::vector<DeviceHandle> now = graph_capture()->current_blocks(state);
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
