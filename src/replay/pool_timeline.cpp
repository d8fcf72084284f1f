// Sampling a replay: the observer, the peak's second replay, the JSON form.
#include "ferry/pool_timeline.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <tuple>
#include <utility>

#include "observe/snapshot_json.hpp"

namespace ferry {
namespace {

using observe::Json;

PoolSample sample_of(const ReplayStep& step) {
  const PoolStats st = step.pool->stats();
  PoolSample s;
  s.index = step.index;
  s.line = step.line;
  s.op = std::string(step.op);
  s.now_ns = step.now_ns;
  s.requested_bytes = st.requested_bytes;
  s.allocated_bytes = st.allocated_bytes;
  s.reserved_bytes = st.reserved_bytes;
  s.pending_free_bytes = st.pending_free_bytes;
  s.cached_bytes = st.cached_bytes;
  s.ooms = st.ooms;
  s.reclaims = st.reclaims;
  return s;
}

std::string where(const PoolSample& s) {
  if (s.op == "start") return "before the first op";
  if (s.op == "end") return "after the replay's end";
  return "after line " + std::to_string(s.line) + " (" + s.op + ", op " + std::to_string(s.index) + ")";
}

PoolLayout layout_of(const ReplayStep& step, const PoolSample& sample, std::string moment,
                     std::string title) {
  std::vector<ReplayLiveId> live = step.live_ids ? step.live_ids() : std::vector<ReplayLiveId>{};
  std::vector<NamedHandle> named;
  named.reserve(live.size());
  for (const ReplayLiveId& l : live) named.push_back({l.id, l.handle});
  PoolLayout layout;
  layout.moment = std::move(moment);
  layout.title = std::move(title) + ": " + where(sample);
  layout.at = sample;
  layout.snapshot = take_snapshot(*step.pool, named);
  return layout;
}

// The step whose layout shows the trace as it ends: after its last op (the
// start, for a trace without ops).
bool is_end_of_trace(const ReplayStep& step) { return step.index == step.total; }

// The first op after which (reserved, allocated) was highest.
std::size_t peak_index(const std::vector<PoolSample>& samples) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < samples.size(); ++i) {
    if (samples[i].op == "end") break;
    const auto key = std::tie(samples[i].reserved_bytes, samples[i].allocated_bytes);
    if (best == 0 || key > std::tie(samples[best].reserved_bytes, samples[best].allocated_bytes)) best = i;
  }
  return best;
}

template <class Replay>
Result<PoolTimeline> sample_replay(Replay replay, const TimelineOptions& options) {
  if (options.at_line && *options.at_line == 0) {
    return make_error(ErrorCode::invalid_argument, "--at: trace lines count from 1");
  }
  PoolTimeline t;
  std::optional<PoolLayout> end, at_line;

  ReplayOptions first = options.replay;
  first.on_step = [&](const ReplayStep& step) {
    if (options.progress) options.progress("replay", step.index + 1, step.total + 2);
    t.samples.push_back(sample_of(step));
    const PoolSample& s = t.samples.back();
    if (t.granule == 0) {
      for (const SegmentInfo& g : step.pool->segments()) t.granule = g.granule;
    }
    if (is_end_of_trace(step)) end = layout_of(step, s, "end", "end of trace");
    if (options.at_line && !at_line && step.index >= 1 && step.index <= step.total &&
        step.line >= *options.at_line) {
      at_line = layout_of(step, s, "line", "at line " + std::to_string(*options.at_line));
    }
  };
  Result<ReplayReport> report = replay(first);
  if (!report.ok()) return std::move(report).error();
  t.report = std::move(report).value();
  t.trace = t.report.trace;
  t.backend = t.report.backend;
  t.device = t.report.device;
  t.capacity = t.report.capacity;
  t.seed = t.report.seed;
  if (options.at_line && !at_line) {
    std::size_t last = 0;
    for (const PoolSample& s : t.samples) last = std::max(last, s.line);
    return make_error(ErrorCode::invalid_argument,
                      "--at " + std::to_string(*options.at_line) + ": " + t.trace +
                          " has no op on or after that line (its last op is on line " +
                          std::to_string(last) + ")");
  }

  const std::size_t peak = peak_index(t.samples);
  std::optional<PoolLayout> peak_layout;
  auto as_peak = [&](const PoolLayout& other) {
    PoolLayout p = other;
    p.moment = "peak";
    p.title = "peak reserved: " + where(other.at);
    return p;
  };
  if (peak == 0) {
    // No ops: nothing peaks.
  } else if (end && end->at.index == peak) {
    peak_layout = as_peak(*end);
  } else if (at_line && at_line->at.index == peak) {
    peak_layout = as_peak(*at_line);
  } else {
    // Replay again to stop at the peak: same seed, same schedule.
    std::vector<PoolSample> again;
    ReplayOptions second = options.replay;
    second.on_step = [&](const ReplayStep& step) {
      if (options.progress) options.progress("peak layout", step.index + 1, step.total + 2);
      again.push_back(sample_of(step));
      if (step.index == peak) peak_layout = layout_of(step, again.back(), "peak", "peak reserved");
    };
    Result<ReplayReport> r2 = replay(second);
    if (!r2.ok()) return std::move(r2).error();
    if (again != t.samples) {
      t.note = "the second replay (for the peak's layout) did not repeat the first one; the peak "
               "layout may not match the samples";
    }
  }
  if (peak_layout) t.layouts.push_back(std::move(*peak_layout));
  if (end) t.layouts.push_back(std::move(*end));
  if (at_line) t.layouts.push_back(std::move(*at_line));
  return t;
}

}  // namespace

Result<PoolTimeline> observe_replay(const std::string& path, const TimelineOptions& options) {
  return sample_replay([&](const ReplayOptions& o) { return replay_trace_file(path, o); }, options);
}

Result<PoolTimeline> observe_replay_text(std::string_view text, std::string_view name,
                                         const TimelineOptions& options) {
  return sample_replay([&](const ReplayOptions& o) { return replay_trace_text(text, name, o); }, options);
}

std::string timeline_json(const PoolTimeline& t) {
  Json samples{{"index", Json::array()},           {"line", Json::array()},
               {"op", Json::array()},              {"now_ns", Json::array()},
               {"requested_bytes", Json::array()}, {"allocated_bytes", Json::array()},
               {"reserved_bytes", Json::array()},  {"pending_free_bytes", Json::array()},
               {"cached_bytes", Json::array()},    {"ooms", Json::array()},
               {"reclaims", Json::array()}};
  for (const PoolSample& s : t.samples) {
    samples["index"].push_back(s.index);
    samples["line"].push_back(s.line);
    samples["op"].push_back(s.op);
    samples["now_ns"].push_back(s.now_ns);
    samples["requested_bytes"].push_back(s.requested_bytes);
    samples["allocated_bytes"].push_back(s.allocated_bytes);
    samples["reserved_bytes"].push_back(s.reserved_bytes);
    samples["pending_free_bytes"].push_back(s.pending_free_bytes);
    samples["cached_bytes"].push_back(s.cached_bytes);
    samples["ooms"].push_back(s.ooms);
    samples["reclaims"].push_back(s.reclaims);
  }
  Json layouts = Json::array();
  for (const PoolLayout& l : t.layouts) {
    layouts.push_back(Json{{"moment", l.moment},
                           {"title", l.title},
                           {"index", l.at.index},
                           {"line", l.at.line},
                           {"op", l.at.op},
                           {"now_ns", l.at.now_ns},
                           {"snapshot", observe::snapshot_to_json(l.snapshot)}});
  }
  Json j{{"trace", t.trace},
         {"backend", t.backend},
         {"device", t.device},
         {"capacity", t.capacity},
         {"granule", t.granule},
         {"seed", t.seed},
         {"note", t.note},
         {"report", Json::parse(report_json(t.report))},
         {"samples", std::move(samples)},
         {"layouts", std::move(layouts)}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ferry
