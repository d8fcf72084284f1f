// ferry — the C ABI's graph capture (ferry.h "Graph capture") over Runtime's
// begin_capture / end_capture / launch and Graph (graph.hpp).
#include "ferry/ferry.h"

#include <new>
#include <utility>

#include "capi/boundary.hpp"
#include "ferry/graph.hpp"
#include "ferry/runtime.hpp"

struct ferry_graph_s {
  ferry::Graph graph;
};

using ferry::capi::done;
using ferry::capi::null_argument;
using ferry::capi::guarded;

ferry_status ferry_begin_capture(ferry_runtime rt, uint32_t stream, ferry_graph share_pool_of) {
  return guarded("ferry_begin_capture", [&] {
    if (rt == nullptr) return null_argument("ferry_begin_capture", "rt");
    ferry::CaptureOptions options;
    if (share_pool_of != nullptr) options.pool = share_pool_of->graph.pool();
    return done(rt->runtime->begin_capture(stream, std::move(options)));
  });
}

ferry_status ferry_end_capture(ferry_runtime rt, uint32_t stream, ferry_graph* out) {
  return guarded("ferry_end_capture", [&] {
    if (out == nullptr) return null_argument("ferry_end_capture", "out");
    *out = nullptr;
    if (rt == nullptr) return null_argument("ferry_end_capture", "rt");
    ferry::Result<ferry::Graph> graph = rt->runtime->end_capture(stream);
    if (!graph.ok()) return ferry::capi::fail(graph.error());
    // Allocated before the graph leaves its Result: a failed new destroys it.
    *out = new ferry_graph_s{std::move(graph).value()};
    return ferry::capi::ok();
  });
}

ferry_status ferry_graph_launch(ferry_runtime rt, ferry_graph graph, uint32_t stream) {
  return guarded("ferry_graph_launch", [&] {
    if (rt == nullptr) return null_argument("ferry_graph_launch", "rt");
    if (graph == nullptr) return null_argument("ferry_graph_launch", "graph");
    return done(rt->runtime->launch(graph->graph, stream));
  });
}

ferry_status ferry_graph_destroy(ferry_graph graph) {
  return guarded("ferry_graph_destroy", [&] {
    if (graph == nullptr) return ferry::capi::ok();
    ferry::Result<void> r = graph->graph.destroy();
    delete graph;
    return done(r);
  });
}
