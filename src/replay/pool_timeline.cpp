// Sampling a replay: the observer, the peak's layout (a second replay only past its
// budget), the JSON form.
#include "ferry/pool_timeline.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <tuple>
#include <utility>

#include "observe/snapshot_json.hpp"
#include "replay/timeline_page.hpp"

namespace ferry {
namespace {

using observe::Json;

// A graph's private pool held a block at some step (its figures are shown then).
bool graph_pools_used(const PoolTimeline& t) {
  return std::any_of(t.samples.begin(), t.samples.end(),
                     [](const PoolSample& s) { return s.graph_pool_reserved_bytes > 0; });
}

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
  s.graph_pool_reserved_bytes = step.graph_pool_reserved_bytes;
  s.graph_pool_allocated_bytes = step.graph_pool_allocated_bytes;
  return s;
}

std::string where(const PoolSample& s) {
  if (s.op == "start") return "before the first op";
  if (s.op == "end") return "after the replay's end";
  return "after line " + std::to_string(s.line) + " (" + s.op + ", op " + std::to_string(s.index) + ")";
}

PoolLayout layout_of(const ReplayStep& step, const PoolSample& sample, std::string moment,
                     std::string title) {
  PoolLayout layout;
  layout.moment = std::move(moment);
  layout.title = std::move(title) + ": " + where(sample);
  layout.at = sample;
  layout.snapshot = take_snapshot(*step.pool);
  // Every block, live or pending free, is named after the allocation it began as:
  // O(blocks), where matching live ids would be O(ids).
  for (std::size_t i = 0; i < layout.snapshot.blocks.size(); ++i) {
    if (step.owner_at) layout.snapshot.owners[i] = std::string(step.owner_at(layout.snapshot.blocks[i].addr));
  }
  return layout;
}

// What a layout adds to the page: one entry per block and per mapped or cached run.
std::size_t weight(const PoolLayout& l) {
  std::size_t w = l.snapshot.blocks.size();
  for (const SegmentInfo& g : l.snapshot.segments) w += g.mapped.size() + g.cached.size();
  return w;
}

// Keyframes: a layout every `stride` steps from the start, and after the last op.
// Past the weight budget every other one goes and the stride doubles, so their
// number and size stay bounded whatever the trace's length.
class Keyframes {
 public:
  void maybe_take(const ReplayStep& step, const PoolSample& sample) {
    // floor(total / stride) + 2 <= kMaxKeyframes: the multiples of stride up to total, and total.
    if (step.index == 0) stride_ = std::max<std::size_t>(1, (step.total + kMaxKeyframes - 3) / (kMaxKeyframes - 2));
    if (step.index > step.total || (step.index % stride_ != 0 && step.index != step.total)) return;
    frames_.push_back(layout_of(step, sample, "keyframe", "keyframe"));
    weight_ += weight(frames_.back());
    total_ = step.total;
    while (weight_ > kKeyframeWeight && frames_.size() > 2) thin();
  }
  std::vector<PoolLayout> take() { return std::move(frames_); }

 private:
  void thin() {
    stride_ *= 2;
    std::vector<PoolLayout> kept;
    weight_ = 0;
    for (PoolLayout& f : frames_) {
      if (f.at.index % stride_ != 0 && f.at.index != total_) continue;
      weight_ += weight(f);
      kept.push_back(std::move(f));
    }
    frames_ = std::move(kept);
  }

  std::size_t stride_ = 1, weight_ = 0, total_ = 0;
  std::vector<PoolLayout> frames_;
};

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
  std::optional<PoolLayout> end, at_line, first_oom;
  Keyframes keyframes;
  // The layout at the highest (reserved, allocated) so far, retaken as it rises;
  // `rising_late` when a rise went untaken (over budget): the layout is then stale.
  std::optional<PoolLayout> rising;
  bool rising_late = false;
  std::size_t spent = 0;

  std::size_t best_sample = 0;
  ReplayOptions first = options.replay;
  first.on_step = [&](const ReplayStep& step) {
    if (options.progress) options.progress("replay", step.index + 1, step.total + 2);
    t.samples.push_back(sample_of(step));
    const PoolSample& s = t.samples.back();
    if (t.granule == 0) {
      for (const SegmentInfo& g : step.pool->segments()) t.granule = g.granule;
    }
    keyframes.maybe_take(step, s);
    const bool an_op = step.index >= 1 && step.index <= step.total;
    const bool rises = an_op && (!rising && !rising_late ? true
                                 : std::tie(s.reserved_bytes, s.allocated_bytes) >
                                       std::tie(t.samples[best_sample].reserved_bytes,
                                                t.samples[best_sample].allocated_bytes));
    if (rises) {
      best_sample = t.samples.size() - 1;
      const std::size_t cost = rising ? weight(*rising) : 0;
      if (spent + cost <= kPeakLayoutWeightPerStep * step.index) {
        rising = layout_of(step, s, "peak", "peak reserved");
        spent += weight(*rising);
        rising_late = false;
      } else {
        rising_late = true;
      }
    }
    if (!first_oom && s.ooms > 0) first_oom = layout_of(step, s, "oom", "first out_of_memory");
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
  } else if (first_oom && first_oom->at.index == peak) {
    peak_layout = as_peak(*first_oom);
  } else if (rising && !rising_late && rising->at.index == peak) {
    peak_layout = std::move(*rising);
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
    t.replays = 2;
    if (again != t.samples) {
      t.note = "the second replay (for the peak's layout) did not repeat the first one; the peak "
               "layout may not match the samples";
    }
  }
  if (peak_layout) t.layouts.push_back(std::move(*peak_layout));
  if (first_oom) t.layouts.push_back(std::move(*first_oom));
  if (end) t.layouts.push_back(std::move(*end));
  if (at_line) t.layouts.push_back(std::move(*at_line));
  t.keyframes = keyframes.take();
  return t;
}

}  // namespace

namespace {

Json layout_json(const PoolLayout& l) {
  return Json{{"moment", l.moment},   {"title", l.title},   {"index", l.at.index},
              {"line", l.at.line},     {"op", l.at.op},      {"now_ns", l.at.now_ns},
              {"snapshot", observe::snapshot_to_json(l.snapshot)}};
}

// What both JSON forms of a timeline open with: the run, its settings and report.
Json timeline_head(const PoolTimeline& t) {
  return Json{{"trace", t.trace},       {"backend", t.backend}, {"device", t.device},
              {"capacity", t.capacity}, {"granule", t.granule}, {"seed", t.seed},
              {"note", t.note},         {"report", Json::parse(report_json(t.report))}};
}

// ... and close with: the chosen layouts and the keyframes.
void add_layouts(Json& j, const PoolTimeline& t) {
  Json layouts = Json::array(), keyframes = Json::array();
  for (const PoolLayout& l : t.layouts) layouts.push_back(layout_json(l));
  for (const PoolLayout& l : t.keyframes) keyframes.push_back(layout_json(l));
  j["layouts"] = std::move(layouts);
  j["keyframes"] = std::move(keyframes);
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
  if (graph_pools_used(t)) {
    for (const PoolSample& s : t.samples) {
      samples["graph_pool_reserved_bytes"].push_back(s.graph_pool_reserved_bytes);
      samples["graph_pool_allocated_bytes"].push_back(s.graph_pool_allocated_bytes);
    }
  }
  Json j = timeline_head(t);
  j["samples"] = std::move(samples);
  add_layouts(j, t);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ferry

namespace ferry::replay {

// The largest live blocks at the peak layout, largest first (ties by address),
// named by their owners: an imported snapshot's ids carry the program's frame.
static Json largest_at_peak(const PoolTimeline& t) {
  Json out = Json::array();
  const auto peak = std::find_if(t.layouts.begin(), t.layouts.end(), [](const PoolLayout& l) { return l.moment == "peak"; });
  if (peak == t.layouts.end()) return out;
  const PoolSnapshot& snap = peak->snapshot;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < snap.blocks.size(); ++i) {
    if (snap.blocks[i].state == BlockInfo::State::live) order.push_back(i);
  }
  const std::size_t shown = std::min(order.size(), kLargestBlocks);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown), order.end(),
                    [&](std::size_t a, std::size_t b) {
                      return std::tie(snap.blocks[b].bytes, snap.blocks[a].addr) <
                             std::tie(snap.blocks[a].bytes, snap.blocks[b].addr);
                    });
  for (std::size_t k = 0; k < shown; ++k) {
    const BlockInfo& b = snap.blocks[order[k]];
    out.push_back({{"owner", order[k] < snap.owners.size() ? snap.owners[order[k]] : std::string()},
                   {"bytes", b.bytes},
                   {"stream", b.stream},
                   {"addr", b.addr}});
  }
  return out;
}

std::string timeline_page_json(const PoolTimeline& t) {
  // The chart: samples in at most kChartColumns runs of consecutive ones, each
  // with its min, max and last value per series, so every peak survives.
  const std::size_t n = t.samples.size();
  const std::size_t columns = std::min(n, kChartColumns);
  constexpr const char* kSeries[] = {"requested_bytes", "allocated_bytes", "reserved_bytes", "pending_free_bytes",
                                     "cached_bytes"};
  const auto value = [](const PoolSample& s, int k) {
    switch (k) {
      case 0: return s.requested_bytes;
      case 1: return s.allocated_bytes;
      case 2: return s.reserved_bytes;
      case 3: return s.pending_free_bytes;
      default: return s.cached_bytes;
    }
  };
  Json chart{{"first", Json::array()}, {"count", Json::array()}, {"line", Json::array()},
             {"op", Json::array()},    {"now_ns", Json::array()}, {"ooms", Json::array()},
             {"reclaims", Json::array()}};
  for (const char* key : kSeries) {
    chart[key] = Json::array();
    chart[std::string(key) + "_min"] = Json::array();
    chart[std::string(key) + "_max"] = Json::array();
  }
  for (std::size_t c = 0; c < columns; ++c) {
    const std::size_t from = c * n / columns, to = (c + 1) * n / columns;
    const PoolSample& last = t.samples[to - 1];
    chart["first"].push_back(from);
    chart["count"].push_back(to - from);
    chart["line"].push_back(last.line);
    chart["op"].push_back(last.op);
    chart["now_ns"].push_back(t.samples[from].now_ns);
    chart["ooms"].push_back(last.ooms);
    chart["reclaims"].push_back(last.reclaims);
    for (int k = 0; k < 5; ++k) {
      std::uint64_t lo = value(t.samples[from], k), hi = lo;
      for (std::size_t i = from + 1; i < to; ++i) {
        lo = std::min(lo, value(t.samples[i], k));
        hi = std::max(hi, value(t.samples[i], k));
      }
      chart[kSeries[k]].push_back(value(last, k));
      chart[std::string(kSeries[k]) + "_min"].push_back(lo);
      chart[std::string(kSeries[k]) + "_max"].push_back(hi);
    }
  }
  // PyTorch's reserved line beside ferry's, when the trace is a snapshot's history.
  if (t.report.source) {
    const auto& steps = t.report.source->reserved_steps;
    std::vector<std::uint64_t> torch(n, 0);
    std::size_t k = 0;
    for (std::size_t i = 0; i < n && !steps.empty(); ++i) {
      // after op i its trace line is behind; the end sample stands after every line
      const std::uint64_t after = t.samples[i].op == "end" ? ~std::uint64_t{0} : t.samples[i].line;
      while (k + 1 < steps.size() && steps[k + 1].first <= after) ++k;
      torch[i] = steps[k].second;
    }
    Json last = Json::array(), lo = Json::array(), hi = Json::array();
    for (std::size_t c = 0; c < columns; ++c) {
      const std::size_t from = c * n / columns, to = (c + 1) * n / columns;
      last.push_back(torch[to - 1]);
      lo.push_back(*std::min_element(torch.begin() + static_cast<std::ptrdiff_t>(from), torch.begin() + static_cast<std::ptrdiff_t>(to)));
      hi.push_back(*std::max_element(torch.begin() + static_cast<std::ptrdiff_t>(from), torch.begin() + static_cast<std::ptrdiff_t>(to)));
    }
    chart["torch_reserved_bytes"] = std::move(last);
    chart["torch_reserved_bytes_min"] = std::move(lo);
    chart["torch_reserved_bytes_max"] = std::move(hi);
  }
  // The graphs' private pools, when the trace has any that held a block.
  if (graph_pools_used(t)) {
    for (const bool reserved : {true, false}) {
      const std::string key = reserved ? "graph_pool_reserved_bytes" : "graph_pool_allocated_bytes";
      const auto of = [&](const PoolSample& s) {
        return reserved ? s.graph_pool_reserved_bytes : s.graph_pool_allocated_bytes;
      };
      Json last = Json::array(), lo = Json::array(), hi = Json::array();
      for (std::size_t c = 0; c < columns; ++c) {
        const std::size_t from = c * n / columns, to = (c + 1) * n / columns;
        std::uint64_t min = of(t.samples[from]), max = min;
        for (std::size_t i = from + 1; i < to; ++i) {
          min = std::min(min, of(t.samples[i]));
          max = std::max(max, of(t.samples[i]));
        }
        last.push_back(of(t.samples[to - 1]));
        lo.push_back(min);
        hi.push_back(max);
      }
      chart[key] = std::move(last);
      chart[key + "_min"] = std::move(lo);
      chart[key + "_max"] = std::move(hi);
    }
  }
  // The steps where an OOM or a reclaim happened: the first kMaxEvents of each.
  Json oom = Json::array(), reclaim = Json::array();
  std::uint64_t ooms = 0, reclaims = 0;
  for (std::size_t i = 1; i < n; ++i) {
    if (t.samples[i].ooms > t.samples[i - 1].ooms && ooms++ < kMaxEvents) oom.push_back(i);
    if (t.samples[i].reclaims > t.samples[i - 1].reclaims && reclaims++ < kMaxEvents) reclaim.push_back(i);
  }
  Json j = timeline_head(t);
  j["samples"] = n;
  j["chart"] = std::move(chart);
  j["events"] = {{"oom", std::move(oom)}, {"oom_steps", ooms}, {"reclaim", std::move(reclaim)},
                 {"reclaim_steps", reclaims}};
  add_layouts(j, t);
  j["largest_at_peak"] = largest_at_peak(t);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ferry::replay
