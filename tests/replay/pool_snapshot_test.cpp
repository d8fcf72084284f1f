// Pool snapshots (segments, blocks, stats) and the timeline of a replay: the
// live blocks are there, under their ids, and the sums match the statistics.
#include "ferry/pool_snapshot.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <numeric>
#include <stdexcept>
#include <string>

#include "ferry/pool_timeline.hpp"
#include "page_traces.hpp"
#include "replay/timeline_page.hpp"
#include "transfer_fixture.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
using testing::Rig;
using testing::RigOptions;

RigOptions h200_at(std::uint64_t capacity) {
  RigOptions o;
  o.profile = "h200";
  o.pool.capacity = capacity;
  return o;
}

std::uint64_t sum_of(const std::vector<BlockInfo>& blocks, BlockInfo::State state) {
  std::uint64_t n = 0;
  for (const BlockInfo& b : blocks) n += b.state == state ? b.bytes : 0;
  return n;
}

// The snapshot's equations (pool_snapshot.hpp) on a quiet pool.
void expect_consistent(const PoolSnapshot& s) {
  std::uint64_t mapped = 0, cached = 0;
  for (const SegmentInfo& g : s.segments) {
    std::uint64_t runs = 0, cached_runs = 0;
    for (const DeviceRange& r : g.mapped) runs += r.bytes;
    for (const DeviceRange& r : g.cached) cached_runs += r.bytes;
    EXPECT_EQ(runs, g.mapped_bytes);
    EXPECT_EQ(cached_runs, g.cached_bytes);
    EXPECT_LE(g.cached_bytes, g.mapped_bytes);
    mapped += g.mapped_bytes;
    cached += g.cached_bytes;
  }
  EXPECT_EQ(mapped, s.stats.reserved_bytes);
  EXPECT_EQ(cached, s.stats.cached_bytes);
  EXPECT_EQ(sum_of(s.blocks, BlockInfo::State::live), s.stats.allocated_bytes);
  EXPECT_EQ(sum_of(s.blocks, BlockInfo::State::pending_free), s.stats.pending_free_bytes);
  EXPECT_EQ(s.owners.size(), s.blocks.size());
}

TEST(PoolSnapshot, ShowsEverySegmentAndEveryLiveAndPendingBlock) {
  Rig rig(h200_at(64 * kMiB));
  DevicePool& pool = *rig.pool;
  auto small = pool.allocate(4096, 0);
  auto big = pool.allocate(6 * kMiB, 1);
  auto doomed = pool.allocate(3 * kMiB, 2);
  ASSERT_TRUE(small.ok() && big.ok() && doomed.ok());
  // A kernel held on stream 2 keeps `doomed` pending after its free (I2).
  rig.backend().set_hold(2, true);
  ASSERT_TRUE(enqueue_fill(pool, 2, *doomed, 5).ok());
  ASSERT_TRUE(pool.free(*doomed).ok());

  const NamedHandle owners[] = {{"small", *small}, {"big", *big}, {"doomed", *doomed}};
  PoolSnapshot s = take_snapshot(pool, owners);
  expect_consistent(s);
  EXPECT_EQ(s.capacity, 64 * kMiB);
  ASSERT_EQ(s.segments.size(), 2u) << "sim has virtual memory: a small and a large range";
  EXPECT_EQ(s.segments[0].kind, SegmentInfo::Kind::small);
  EXPECT_EQ(s.segments[1].kind, SegmentInfo::Kind::large);
  EXPECT_EQ(s.segments[0].granule, 2 * kMiB);
  ASSERT_EQ(s.blocks.size(), 3u);
  int live = 0, pending = 0;
  for (std::size_t i = 0; i < s.blocks.size(); ++i) {
    const BlockInfo& b = s.blocks[i];
    if (b.state == BlockInfo::State::live) {
      ++live;
      EXPECT_TRUE(s.owners[i] == "small" || s.owners[i] == "big") << s.owners[i];
      EXPECT_EQ(b.stream, s.owners[i] == "small" ? 0u : 1u);
    } else {
      ++pending;
      EXPECT_EQ(b.state, BlockInfo::State::pending_free);
      EXPECT_EQ(s.owners[i], "") << "a freed handle names no block";
      EXPECT_EQ(b.bytes, 3 * kMiB);
    }
  }
  EXPECT_EQ(live, 2);
  EXPECT_EQ(pending, 1);

  const auto j = nlohmann::json::parse(snapshot_json(s));
  EXPECT_EQ(j["capacity"], 64 * kMiB);
  EXPECT_EQ(j["stats"]["allocated_bytes"], s.stats.allocated_bytes);
  ASSERT_EQ(j["segments"].size(), 2u);
  EXPECT_EQ(j["segments"][0]["kind"], "small");
  ASSERT_EQ(j["blocks"].size(), 3u);
  int json_live = 0;
  for (const auto& b : j["blocks"]) {
    if (b["state"] == "live") {
      ++json_live;
      EXPECT_TRUE(b.contains("owner"));
    } else {
      EXPECT_EQ(b["state"], "pending_free");
    }
  }
  EXPECT_EQ(json_live, 2);

  rig.backend().set_hold(2, false);
  rig.sync();
  ASSERT_TRUE(pool.free(*small).ok());
  ASSERT_TRUE(pool.free(*big).ok());
}

TEST(PoolSnapshot, CachedGranulesShowUntilTrim) {
  Rig rig(h200_at(64 * kMiB));
  DevicePool& pool = *rig.pool;
  auto h = pool.allocate(8 * kMiB, 0);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(pool.free(*h).ok());
  PoolSnapshot s = take_snapshot(pool);
  expect_consistent(s);
  EXPECT_TRUE(s.blocks.empty());
  EXPECT_GE(s.stats.cached_bytes, 8 * kMiB) << "below the release threshold, freed granules stay mapped";
  ASSERT_TRUE(pool.trim().ok());
  s = take_snapshot(pool);
  expect_consistent(s);
  EXPECT_EQ(s.stats.reserved_bytes, 0u);
  for (const SegmentInfo& g : s.segments) EXPECT_TRUE(g.mapped.empty());
}

// --- the timeline of a replay -----------------------------------------------------

constexpr const char* kTrace =
    R"({"op":"alloc","id":"a","bytes":4194304,"stream":0}
{"op":"fill","id":"a","stream":0,"seed":1}
{"op":"alloc","id":"big","bytes":16777216,"stream":1}
{"op":"upload","id":"big","stream":1,"seed":2}
{"op":"alloc","id":"c","bytes":1024,"stream":0}
{"op":"compute","inputs":["a"],"output":"c","stream":0}
{"op":"free","id":"big"}
{"op":"sync"}
{"op":"alloc","id":"d","bytes":2097152,"stream":2}
{"op":"check","id":"c"}
)";

// The JSON a timeline page embeds.
nlohmann::json page_data(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"ferry-data\">";
  const std::size_t from = html.find(open) + open.size();
  return nlohmann::json::parse(html.substr(from, html.find("</script>", from) - from));
}

TimelineOptions at_64mib() {
  TimelineOptions o;
  o.replay.backend.profile = "h200";
  o.replay.capacity = 64 * kMiB;
  return o;
}

// A peak that rises at every one of 1,000 allocations would cost a layout per op:
// past the budget the peak is taken by a second replay, and it is the same state.
TEST(PoolTimeline, APeakRisingAtEveryOpTakesASecondReplayForItsLayout) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += R"({"op":"alloc","id":"b)" + std::to_string(i) + R"(","bytes":4096,"stream":0})" "\n";
  text += R"({"op":"free","id":"b0"})" "\n";
  Result<PoolTimeline> t = observe_replay_text(text, "rising.jsonl", at_64mib());
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->replays, 2u);
  ASSERT_FALSE(t->layouts.empty());
  const PoolLayout& peak = t->layouts[0];
  EXPECT_EQ(peak.moment, "peak");
  EXPECT_EQ(peak.at.index, 1000u) << "after the last allocation";
  std::size_t live = 0;
  for (const BlockInfo& b : peak.snapshot.blocks) live += b.state == BlockInfo::State::live ? 1 : 0;
  EXPECT_EQ(live, 1000u);
  EXPECT_EQ(t->note, "");
}

TEST(PoolTimeline, SamplesEveryOpAndSnapshotsThePeakAndTheEnd) {
  Result<PoolTimeline> t = observe_replay_text(kTrace, "small.jsonl", at_64mib());
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_TRUE(t->report.passed()) << report_summary(t->report);
  ASSERT_EQ(t->samples.size(), 10u + 2u) << "start, one per op, end";
  EXPECT_EQ(t->samples.front().op, "start");
  EXPECT_EQ(t->samples.back().op, "end");
  EXPECT_EQ(t->samples[3].op, "alloc");
  EXPECT_EQ(t->samples[3].line, 3u);
  EXPECT_EQ(t->granule, 2 * kMiB);
  EXPECT_EQ(t->note, "");
  for (const PoolSample& s : t->samples) {
    EXPECT_LE(s.allocated_bytes + s.pending_free_bytes, s.reserved_bytes);
    EXPECT_LE(s.reserved_bytes, 64 * kMiB);
  }
  EXPECT_EQ(t->samples.back().allocated_bytes, 0u) << "the replay frees what is left";

  ASSERT_EQ(t->layouts.size(), 2u);
  const PoolLayout& peak = t->layouts[0];
  const PoolLayout& end = t->layouts[1];
  EXPECT_EQ(peak.moment, "peak");
  EXPECT_EQ(end.moment, "end");
  EXPECT_EQ(end.at.index, 10u);
  std::uint64_t most = 0;
  for (const PoolSample& s : t->samples) most = std::max(most, s.reserved_bytes);
  EXPECT_EQ(peak.at.reserved_bytes, most);
  EXPECT_EQ(peak.snapshot.stats.reserved_bytes, most) << "the peak's layout is the peak's state";
  EXPECT_EQ(t->replays, 1u) << "issue 46 item 10: the page is drawn from one replay";
  expect_consistent(peak.snapshot);
  expect_consistent(end.snapshot);

  // At the end a, c and d are live (big was freed): exactly those blocks.
  std::vector<std::string> live;
  for (std::size_t i = 0; i < end.snapshot.blocks.size(); ++i) {
    if (end.snapshot.blocks[i].state == BlockInfo::State::live) live.push_back(end.snapshot.owners[i]);
  }
  std::sort(live.begin(), live.end());
  EXPECT_EQ(live, (std::vector<std::string>{"a", "c", "d"}));
}

TEST(PoolTimeline, JsonHasEqualColumnsAndTheLiveBlocks) {
  Result<PoolTimeline> t = observe_replay_text(kTrace, "small.jsonl", at_64mib());
  ASSERT_TRUE(t.ok()) << t.error().message;
  const auto j = nlohmann::json::parse(timeline_json(*t));
  EXPECT_EQ(j["trace"], "small.jsonl");
  EXPECT_EQ(j["capacity"], 64 * kMiB);
  EXPECT_EQ(j["report"]["verdict"], "pass");
  const auto& cols = j["samples"];
  for (const char* key : {"index", "line", "op", "now_ns", "requested_bytes", "allocated_bytes",
                          "reserved_bytes", "pending_free_bytes", "cached_bytes", "ooms", "reclaims"}) {
    ASSERT_TRUE(cols.contains(key)) << key;
    EXPECT_EQ(cols[key].size(), 12u) << key;
  }
  ASSERT_EQ(j["layouts"].size(), 2u);
  const auto& end = j["layouts"][1];
  EXPECT_EQ(end["moment"], "end");
  std::vector<std::string> owners;
  for (const auto& b : end["snapshot"]["blocks"]) {
    if (b["state"] == "live") owners.push_back(b.value("owner", ""));
  }
  std::sort(owners.begin(), owners.end());
  EXPECT_EQ(owners, (std::vector<std::string>{"a", "c", "d"}));
}

TEST(PoolTimeline, AtLineAddsALayoutAndRejectsLinesOutsideTheTrace) {
  TimelineOptions o = at_64mib();
  o.at_line = 4;
  Result<PoolTimeline> t = observe_replay_text(kTrace, "small.jsonl", o);
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_EQ(t->layouts.size(), 3u);
  EXPECT_EQ(t->layouts[2].moment, "line");
  EXPECT_EQ(t->layouts[2].at.line, 4u);
  std::uint64_t live_big = 0;
  for (std::size_t i = 0; i < t->layouts[2].snapshot.blocks.size(); ++i) {
    if (t->layouts[2].snapshot.owners[i] == "big") live_big = t->layouts[2].snapshot.blocks[i].bytes;
  }
  EXPECT_EQ(live_big, 16 * kMiB);

  o.at_line = 11;
  Result<PoolTimeline> past = observe_replay_text(kTrace, "small.jsonl", o);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(past.error().message.find("line 10"), std::string::npos) << past.error().message;
  o.at_line = 0;
  EXPECT_FALSE(observe_replay_text(kTrace, "small.jsonl", o).ok());
}

TEST(PoolTimeline, AMalformedTraceRunsNothing) {
  Result<PoolTimeline> t = observe_replay_text("{\"op\":\"free\",\"id\":\"x\"}\n", "bad.jsonl", at_64mib());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(t.error().message.find("bad.jsonl:1:"), std::string::npos) << t.error().message;
}

// The smallest page: one op that allocates nothing.
TEST(PoolTimeline, ATraceOfOneTrimHasThreeSamplesAndPeakAndEndLayouts) {
  Result<PoolTimeline> t = observe_replay_text("{\"op\":\"trim\"}\n", "trim.jsonl", at_64mib());
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->samples.size(), 3u);
  ASSERT_EQ(t->layouts.size(), 2u);
  EXPECT_EQ(t->layouts[0].moment, "peak");
  EXPECT_EQ(t->layouts[1].moment, "end");
  EXPECT_FALSE(timeline_html(*t).empty());
}

// A page of a trace with no ops would show a pass that checked nothing.
TEST(PoolTimeline, AnEmptyTraceIsRefused) {
  Result<PoolTimeline> t = observe_replay_text("\n", "empty.jsonl", at_64mib());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(t.error().message.rfind("empty.jsonl: the trace is empty", 0), 0u) << t.error().message;
}

TEST(ReplayObserver, AThrowingObserverStopsButTheReplayRunsToTheEnd) {
  ReplayOptions o = at_64mib().replay;
  int calls = 0;
  o.on_step = [&](const ReplayStep& step) {
    ++calls;
    if (step.index == 3) throw std::runtime_error("observer gave up");
  };
  Result<ReplayReport> r = replay_trace_text(kTrace, "small.jsonl", o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(calls, 4) << "start, ops 1..3; none after the throw";
  EXPECT_EQ(r->ops, 10u);
  EXPECT_EQ(r->checks, 1u) << "the ops after it still ran";
  EXPECT_EQ(r->unexpected_errors, 1u);
  EXPECT_FALSE(r->passed());
  ASSERT_FALSE(r->problems.empty());
  EXPECT_NE(r->problems[0].message.find("observer gave up"), std::string::npos);
}

// --- the page -------------------------------------------------------------------

TEST(TimelineHtml, IsSelfContainedAndCarriesTheSeries) {
  // An id that tries to close the script element, and a trace name with markup.
  const std::string trace = std::string(kTrace) +
                            R"({"op":"alloc","id":"</script><img src=x>","bytes":4096,"stream":0})" + "\n";
  Result<PoolTimeline> t = observe_replay_text(trace, "<b>name</b>.jsonl", at_64mib());
  ASSERT_TRUE(t.ok()) << t.error().message;
  const std::string html = timeline_html(*t);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos) << "no external stylesheet";
  for (const char* series : {"reserved_bytes", "allocated_bytes", "pending_free_bytes", "cached_bytes",
                             "reserved (mapped)", "live (allocated)", "pending free"}) {
    EXPECT_NE(html.find(series), std::string::npos) << series;
  }
  // The page's own two script elements close; the id's "</script>" does not.
  std::size_t closes = 0;
  for (std::size_t at = html.find("</script>"); at != std::string::npos; at = html.find("</script>", at + 1)) ++closes;
  EXPECT_EQ(closes, 2u);
  EXPECT_NE(html.find("&lt;b&gt;name&lt;/b&gt;.jsonl"), std::string::npos);
  EXPECT_EQ(html.find("<b>name</b>"), std::string::npos);
  // The embedded data is the page's JSON: every sample (a short trace needs no
  // folding), the layouts and the keyframes.
  const auto data = page_data(html);
  EXPECT_EQ(data["samples"], t->samples.size());
  EXPECT_EQ(data["chart"]["reserved_bytes"].size(), t->samples.size());
  EXPECT_EQ(data["layouts"].size(), t->layouts.size());
  EXPECT_EQ(data["keyframes"].size(), t->keyframes.size());
}

TEST(PoolTimeline, APendingFreeBlockKeepsItsOwnersName) {
  // "gone" is freed while its fill is held on stream 0: pending free, still "gone".
  constexpr const char* kHeld = R"({"op":"hold","stream":0}
{"op":"alloc","id":"kept","bytes":4096,"stream":0}
{"op":"alloc","id":"gone","bytes":65536,"stream":0}
{"op":"fill","id":"gone","stream":0,"seed":5}
{"op":"free","id":"gone"}
{"op":"alloc","id":"late","bytes":1024,"stream":1}
)";
  TimelineOptions o = at_64mib();
  o.at_line = 6;
  Result<PoolTimeline> t = observe_replay_text(kHeld, "held.jsonl", o);
  ASSERT_TRUE(t.ok()) << t.error().message;
  const PoolLayout& at = t->layouts.back();
  ASSERT_EQ(at.moment, "line");
  std::map<std::string, BlockInfo::State> owners;
  for (std::size_t i = 0; i < at.snapshot.blocks.size(); ++i) owners[at.snapshot.owners[i]] = at.snapshot.blocks[i].state;
  ASSERT_EQ(owners.count("gone"), 1u) << "the pending-free block lost its name";
  EXPECT_EQ(owners["gone"], BlockInfo::State::pending_free);
  EXPECT_EQ(owners["kept"], BlockInfo::State::live);
  EXPECT_EQ(owners["late"], BlockInfo::State::live);
  EXPECT_EQ(owners.count(""), 0u) << "every block is named";
}

TEST(PoolTimeline, TheFirstOomHasItsLayoutAndItsDiagnostic) {
  constexpr const char* kOom = R"({"op":"alloc","id":"a","bytes":33554432,"stream":0}
{"op":"alloc","id":"b","bytes":50331648,"stream":0,"expect":"oom"}
{"op":"alloc","id":"c","bytes":50331648,"stream":0,"expect":"oom"}
{"op":"free","id":"a"}
)";
  Result<PoolTimeline> t = observe_replay_text(kOom, "oom.jsonl", at_64mib());
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_TRUE(t->report.passed()) << report_summary(t->report);
  EXPECT_EQ(t->report.first_oom.line, 2u);
  EXPECT_EQ(t->report.first_oom.op, "alloc");
  EXPECT_NE(t->report.first_oom.message.find("50331648"), std::string::npos)
      << "the pool's diagnostic names the request: " << t->report.first_oom.message;
  const PoolLayout* oom = nullptr;
  for (const PoolLayout& l : t->layouts) oom = l.moment == "oom" ? &l : oom;
  ASSERT_NE(oom, nullptr);
  EXPECT_EQ(oom->at.index, 2u) << "after the first failing op, not the second";
  ASSERT_EQ(oom->snapshot.owners, (std::vector<std::string>{"a"}));
  EXPECT_EQ(nlohmann::json::parse(report_json(t->report))["first_oom"]["line"], 2);

  const std::string html = timeline_html(*t);
  const auto data = page_data(html);
  EXPECT_EQ(data["report"]["first_oom"]["message"], t->report.first_oom.message);
  EXPECT_EQ(data["events"]["oom"], nlohmann::json::parse("[2, 3]"));
  EXPECT_NE(html.find("First out of memory"), std::string::npos);
}

TEST(PoolTimeline, KeyframesAndTheChartStayBoundedAndKeepEveryPeak) {
  TimelineOptions o;
  o.replay.backend.profile = "tiny";
  o.replay.capacity = 16 * kMiB;
  const std::size_t ops = 6000;
  Result<PoolTimeline> t = observe_replay_text(testing::page_trace(ops), "long.jsonl", o);
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_EQ(t->samples.size(), ops + 2);
  const auto& k = t->keyframes;
  ASSERT_GE(k.size(), 2u);
  EXPECT_LE(k.size(), kMaxKeyframes);
  EXPECT_EQ(k.front().at.index, 0u);
  EXPECT_EQ(k.back().at.index, ops) << "the last keyframe is after the trace's last op";
  std::size_t weight = 0, heaviest = 0;
  for (std::size_t i = 0; i < k.size(); ++i) {
    if (i > 0) {
      EXPECT_LT(k[i - 1].at.index, k[i].at.index);
    }
    EXPECT_EQ(k[i].at, t->samples[k[i].at.index]) << "a keyframe is the layout of its own sample";
    std::size_t w = k[i].snapshot.blocks.size();
    for (const SegmentInfo& g : k[i].snapshot.segments) w += g.mapped.size() + g.cached.size();
    weight += w;
    heaviest = std::max(heaviest, w);
    for (std::size_t b = 0; b < k[i].snapshot.blocks.size(); ++b) {
      EXPECT_FALSE(k[i].snapshot.owners[b].empty()) << "block " << b << " at " << k[i].snapshot.blocks[b].addr << " of the keyframe at " << k[i].at.index;
    }
  }
  EXPECT_LE(weight, kKeyframeWeight + heaviest);

  const std::string html = timeline_html(*t);
  const auto data = page_data(html);
  const auto& chart = data["chart"];
  ASSERT_EQ(chart["first"].size(), replay::kChartColumns);
  std::uint64_t most = 0, least = UINT64_MAX, drawn_most = 0, drawn_least = UINT64_MAX;
  for (const PoolSample& s : t->samples) {
    most = std::max(most, s.reserved_bytes);
    least = std::min(least, s.reserved_bytes);
  }
  for (std::size_t c = 0; c < replay::kChartColumns; ++c) {
    const std::uint64_t lo = chart["reserved_bytes_min"][c], hi = chart["reserved_bytes_max"][c], last = chart["reserved_bytes"][c];
    EXPECT_LE(lo, last);
    EXPECT_LE(last, hi);
    drawn_most = std::max(drawn_most, hi);
    drawn_least = std::min(drawn_least, lo);
  }
  EXPECT_EQ(drawn_most, most) << "the highest sample survives the folding";
  EXPECT_EQ(drawn_least, least);
  EXPECT_EQ(data["events"]["oom_steps"], (ops + 4500) / 5000);
  EXPECT_LT(html.size(), std::size_t{6} << 20) << "the page is bounded";
}

}  // namespace
}  // namespace ferry
