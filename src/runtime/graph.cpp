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
  GraphEvent event{GraphEvent::Kind::destroy};
  event.graph = state->id;
  Result<void> r = state->runtime->graph_capture()->release(*state);
  if (!r.ok()) event.error = &r.error();
  state->runtime->note_graph(event);
  return r;
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

template <class R>
R Runtime::told(GraphEvent event, R result) const {
  if (!result.ok()) event.error = &result.error();
  note_graph(event);
  return result;
}

Result<void> Runtime::begin_capture(StreamId stream, CaptureOptions options) {
  FERRY_TRY(refuse_inside_user_kernel("Runtime::begin_capture"));
  FERRY_TRY(check_stream(stream, "begin_capture"));
  GraphEvent event{GraphEvent::Kind::begin_capture, stream};
  if (options.pool.state_) event.pool = options.pool.state_->id;
  return told(event, graph_capture()->begin(stream, std::move(options.pool.state_)));
}

Result<Graph> Runtime::end_capture(StreamId stream) {
  FERRY_TRY(refuse_inside_user_kernel("Runtime::end_capture"));
  FERRY_TRY(check_stream(stream, "end_capture"));
  GraphEvent event{GraphEvent::Kind::end_capture, stream};
  Result<std::shared_ptr<detail::GraphState>> state = graph_capture()->end(stream);
  if (!state.ok()) return told<Result<Graph>>(event, std::move(state).error());
  event.graph = (*state)->id;
  event.pool = (*state)->pool->id;
  return told<Result<Graph>>(event, Graph(std::move(state).value()));
}

bool Runtime::capturing(StreamId stream) const { return graph_capture()->capturing(stream); }

Result<void> Runtime::refuse_if_capturing(StreamId stream, std::string_view call) const {
  if (graph_capture()->capturing(stream)) {
    return detail::refused(call, stream, "an Allocation frees through the pool, past the graph; allocate through calls()");
  }
  return {};
}

Result<void> Runtime::launch(const Graph& graph, StreamId stream) {
  FERRY_TRY(refuse_inside_user_kernel("Runtime::launch"));
  FERRY_TRY(check_stream(stream, "launch"));
  GraphEvent event{GraphEvent::Kind::launch, stream};
  if (!graph.state_) return told<Result<void>>(event, make_error(ErrorCode::invalid_argument, "launch: the graph is empty"));
  event.graph = graph.state_->id;
  if (graph.state_->runtime != this) {
    return told<Result<void>>(event,
                              make_error(ErrorCode::invalid_argument, "launch: the graph was captured on another Runtime"));
  }
  if (Result<void> r = refuse_if_capturing(stream, "launch"); !r.ok()) {
    return told<Result<void>>(event,
                              make_error(ErrorCode::invalid_argument, "launch: stream " + std::to_string(stream) +
                                                                          " is capturing (a graph in a graph is not recorded)"));
  }
  return told(event, graph_capture()->launch(*graph.state_, stream));
}

}  // namespace ferry
