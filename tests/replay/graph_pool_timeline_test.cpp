// The snapshot page's graph-pool figures: a trace with graphs carries its private
// pools' bytes per step (samples, chart and page series); one without carries none.
#include "ferry/pool_timeline.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "replay/timeline_page.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

TimelineOptions at_64mib() {
  TimelineOptions o;
  o.replay.capacity = 64 * kMiB;
  return o;
}

constexpr const char* kGraphTrace = R"({"op":"capture","phase":"begin","graph":"g","stream":0}
{"op":"alloc","id":"t","bytes":1048576,"stream":0}
{"op":"fill","id":"t","stream":0,"seed":1}
{"op":"free","id":"t"}
{"op":"alloc","id":"u","bytes":2097152,"stream":0}
{"op":"fill","id":"u","stream":0,"seed":2}
{"op":"capture","phase":"end","graph":"g","stream":0}
{"op":"replay","graph":"g","stream":0}
{"op":"capture","phase":"destroy","graph":"g"}
)";

TEST(GraphPoolTimeline, SamplesCarryThePrivatePoolsBytes) {
  Result<PoolTimeline> t = observe_replay_text(kGraphTrace, "graph.jsonl", at_64mib());
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_TRUE(t->report.passed()) << report_summary(t->report);
  ASSERT_EQ(t->samples.size(), 11u);  // start, 9 ops, end
  EXPECT_EQ(t->samples[0].graph_pool_reserved_bytes, 0u);
  EXPECT_EQ(t->samples[2].graph_pool_reserved_bytes, 1 * kMiB);   // after the alloc of t
  EXPECT_EQ(t->samples[4].graph_pool_allocated_bytes, 0u);        // t freed: the pool keeps it
  EXPECT_EQ(t->samples[4].graph_pool_reserved_bytes, 1 * kMiB);
  EXPECT_EQ(t->samples[8].graph_pool_reserved_bytes, 3 * kMiB);   // after the replay
  EXPECT_EQ(t->samples[8].graph_pool_allocated_bytes, 2 * kMiB);  // u is the program's
  EXPECT_EQ(t->samples[9].graph_pool_reserved_bytes, 0u);         // destroyed

  const auto j = nlohmann::json::parse(timeline_json(*t));
  EXPECT_EQ(j["samples"]["graph_pool_reserved_bytes"].size(), 11u);
  const auto page = nlohmann::json::parse(replay::timeline_page_json(*t));
  EXPECT_TRUE(page["chart"].contains("graph_pool_reserved_bytes_max"));
  EXPECT_NE(timeline_html(*t).find("graph pools (kept for graphs)"), std::string::npos);
}

TEST(GraphPoolTimeline, ATraceWithoutGraphsCarriesNone) {
  Result<PoolTimeline> t = observe_replay_text(
      "{\"op\":\"alloc\",\"id\":\"a\",\"bytes\":4096,\"stream\":0}\n", "plain.jsonl", at_64mib());
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_FALSE(nlohmann::json::parse(timeline_json(*t))["samples"].contains("graph_pool_reserved_bytes"));
  EXPECT_FALSE(nlohmann::json::parse(replay::timeline_page_json(*t))["chart"].contains("graph_pool_reserved_bytes"));
}

}  // namespace
}  // namespace ferry
