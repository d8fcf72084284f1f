// The trace ops `capture` and `replay` (docs/spec.md §3): graphs captured and
// launched through the Runtime, the reference following each launch, the race
// checker seeing a launch's ops, and the lines the validator refuses.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/replay.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

Result<ReplayReport> replay(std::string_view text, bool strict = false) {
  ReplayOptions o;
  o.capacity = 64 * kMiB;
  o.strict = strict;
  o.backend.race_check = true;
  return replay_trace_text(text, "graph.jsonl", o);
}

// A graph filled `b` once when captured (nothing ran then), and each launch
// writes it: the check after the launch compares bytes, the one before it none.
TEST(ReplayGraph, ALaunchRunsTheRecordedOpsAndTheReferenceFollowsIt) {
  Result<ReplayReport> r = replay(R"({"op":"alloc","id":"a","bytes":65536,"stream":0}
{"op":"fill","id":"a","stream":0,"seed":7}
{"op":"alloc","id":"b","bytes":65536,"stream":0}
{"op":"capture","phase":"begin","graph":"g","stream":0}
{"op":"compute","inputs":["a"],"output":"b","stream":0}
{"op":"capture","phase":"end","graph":"g","stream":0}
{"op":"check","id":"b"}
{"op":"replay","graph":"g","stream":0}
{"op":"check","id":"b"}
{"op":"fill","id":"a","stream":0,"seed":8}
{"op":"replay","graph":"g","stream":0}
{"op":"check","id":"b"}
)");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r);
  EXPECT_EQ(r->unwritten_checks, 1u);  // before the first launch
  EXPECT_EQ(r->checks, 2u);
  EXPECT_EQ(r->corrupt, 0u);
}

// Under --strict the runner orders nothing: a launch on stream 1 reading what
// stream 0 is writing races it, and the race names the replay line.
TEST(ReplayGraph, TheRaceCheckerSeesALaunchRacingAnUncapturedOp) {
  constexpr std::string_view kTrace = R"({"op":"alloc","id":"a","bytes":65536,"stream":0}
{"op":"alloc","id":"b","bytes":65536,"stream":1}
{"op":"capture","phase":"begin","graph":"g","stream":1}
{"op":"compute","inputs":["a"],"output":"b","stream":1}
{"op":"capture","phase":"end","graph":"g","stream":1}
{"op":"hold","stream":0}
{"op":"fill","id":"a","stream":0,"seed":7}
{"op":"replay","graph":"g","stream":1}
{"op":"release","stream":0}
)";
  Result<ReplayReport> strict = replay(kTrace, true);
  ASSERT_TRUE(strict.ok()) << strict.error().message;
  ASSERT_GT(strict->races, 0u) << report_summary(*strict);
  ASSERT_FALSE(strict->race_list.empty());
  const ReplayRace& race = strict->race_list.front();
  EXPECT_TRUE(race.earlier.line == 8 || race.later.line == 8) << race.earlier.line << " / " << race.later.line;
  EXPECT_TRUE(race.earlier.op == "replay" || race.later.op == "replay") << race.earlier.op << " / " << race.later.op;

  // Without --strict the runner orders the launch after the fill, as a program would.
  Result<ReplayReport> ordered = replay(kTrace);
  ASSERT_TRUE(ordered.ok()) << ordered.error().message;
  EXPECT_EQ(ordered->races, 0u) << report_summary(*ordered);
}

// The capture front refuses a host wait on the capturing stream and spoils the
// capture; a launch after a block it touches was freed outside it is stale_handle.
TEST(ReplayGraph, RefusedCapturesAndStaleLaunchesAreTheRuntimesErrors) {
  Result<ReplayReport> r = replay(R"({"op":"alloc","id":"a","bytes":4096,"stream":0}
{"op":"capture","phase":"begin","graph":"bad","stream":0}
{"op":"fill","id":"a","stream":0,"seed":1}
{"op":"sync","stream":0,"expect":"invalid_argument"}
{"op":"capture","phase":"end","graph":"bad","stream":0,"expect":"invalid_argument"}
{"op":"capture","phase":"begin","graph":"g","stream":0}
{"op":"fill","id":"a","stream":0,"seed":1}
{"op":"capture","phase":"end","graph":"g","stream":0}
{"op":"free","id":"a"}
{"op":"replay","graph":"g","stream":0,"expect":"stale_handle"}
{"op":"capture","phase":"destroy","graph":"g"}
)");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r);
  EXPECT_EQ(r->expected_errors, 3u);
  EXPECT_EQ(r->unexpected_errors, 0u);
}

// A block freed inside a capture is the pool's: the next allocation of the same
// size in a capture of that pool gets it, and outside the capture it is not reused.
TEST(ReplayGraph, ABlockFreedInACaptureIsReusedInsideIt) {
  Result<ReplayReport> r = replay(R"({"op":"capture","phase":"begin","graph":"g","stream":0}
{"op":"alloc","id":"t","bytes":1048576,"stream":0}
{"op":"fill","id":"t","stream":0,"seed":1}
{"op":"free","id":"t"}
{"op":"alloc","id":"u","bytes":1048576,"stream":0}
{"op":"fill","id":"u","stream":0,"seed":2}
{"op":"capture","phase":"end","graph":"g","stream":0}
{"op":"alloc","id":"v","bytes":1048576,"stream":0}
{"op":"replay","graph":"g","stream":0}
{"op":"check","id":"u"}
)");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r);
  EXPECT_EQ(r->checks, 1u);
  // t and u share one block; v (outside the capture) has a block of its own.
  EXPECT_EQ(r->peak_live_bytes, 2 * kMiB);
}

// A smaller allocation of the capture gets a part of the freed block; the
// reference follows the part through the launch (the whole block's fill first).
TEST(ReplayGraph, ABlockFreedInACaptureIsReusedInsideItByASmallerAllocation) {
  Result<ReplayReport> r = replay(R"({"op":"capture","phase":"begin","graph":"g","stream":0}
{"op":"alloc","id":"t","bytes":1048576,"stream":0}
{"op":"fill","id":"t","stream":0,"seed":1}
{"op":"free","id":"t"}
{"op":"alloc","id":"u","bytes":262144,"stream":0}
{"op":"alloc","id":"w","bytes":524288,"stream":0}
{"op":"fill","id":"u","stream":0,"seed":2}
{"op":"fill","id":"w","stream":0,"seed":3}
{"op":"capture","phase":"end","graph":"g","stream":0}
{"op":"alloc","id":"v","bytes":262144,"stream":0}
{"op":"replay","graph":"g","stream":0}
{"op":"replay","graph":"g","stream":0}
{"op":"check","id":"u"}
{"op":"check","id":"w"}
)");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r);
  EXPECT_EQ(r->checks, 2u);
  // u and w are parts of t's block; v (outside the capture) has a block of its own.
  EXPECT_EQ(r->peak_live_bytes, kMiB + 256 * 1024);
}

// A `copy` in a capture is recorded (integrity off) and each launch copies: the
// reference follows the whole-block copy, so the check compares bytes; a
// partial one leaves the destination unknown. Under verify the capture refuses
// the copy (a host compare) and is spoiled.
TEST(ReplayGraph, ACopyInACaptureRunsAtEachLaunchAndIsRefusedUnderVerify) {
  constexpr std::string_view kTrace = R"({"op":"alloc","id":"a","bytes":65536,"stream":0}
{"op":"fill","id":"a","stream":0,"seed":5}
{"op":"alloc","id":"b","bytes":65536,"stream":0}
{"op":"alloc","id":"c","bytes":65536,"stream":0}
{"op":"capture","phase":"begin","graph":"g","stream":0}
{"op":"copy","src":"a","dst":"b","stream":0,"bytes":65536}
{"op":"copy","src":"a","dst":"c","stream":0,"bytes":4096,"src_offset":4096,"dst_offset":8192}
{"op":"capture","phase":"end","graph":"g","stream":0}
{"op":"check","id":"b"}
{"op":"replay","graph":"g","stream":0}
{"op":"check","id":"b"}
{"op":"check","id":"c"}
)";
  ReplayOptions o;
  o.capacity = 64 * kMiB;
  o.integrity = IntegrityPolicy::off;
  o.backend.race_check = true;
  Result<ReplayReport> r = replay_trace_text(kTrace, "graph.jsonl", o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r);
  EXPECT_EQ(r->checks, 1u) << "b after the launch; b before it and the partial c compare nothing";
  EXPECT_EQ(r->unwritten_checks, 2u);

  Result<ReplayReport> verified = replay(R"({"op":"alloc","id":"a","bytes":65536,"stream":0}
{"op":"alloc","id":"b","bytes":65536,"stream":0}
{"op":"capture","phase":"begin","graph":"g","stream":0}
{"op":"copy","src":"a","dst":"b","stream":0,"bytes":65536,"expect":"invalid_argument"}
{"op":"capture","phase":"end","graph":"g","stream":0,"expect":"invalid_argument"}
)");
  ASSERT_TRUE(verified.ok()) << verified.error().message;
  EXPECT_TRUE(verified->passed()) << report_summary(*verified);
  EXPECT_EQ(verified->expected_errors, 2u);
}

TEST(ReplayGraph, TheValidatorNamesABadCaptureLine) {
  for (const auto& [text, want] : {
           std::pair<std::string_view, std::string_view>{R"({"op":"replay","graph":"g","stream":0})",
                                                         "graph.jsonl:1: graph \"g\" was not captured by an earlier line"},
           {R"({"op":"capture","phase":"start","graph":"g","stream":0})",
            "graph.jsonl:1: field \"phase\" must be \"begin\", \"end\" or \"destroy\""},
           {R"({"op":"capture","phase":"begin","graph":"g"})", "graph.jsonl:1: missing field \"stream\""},
           {R"({"op":"capture","phase":"begin","graph":"g","stream":0,"pool":"h"})",
            "graph.jsonl:1: graph \"h\" was not captured by an earlier line"},
           // Two captures under one name (issue 41, item 8): the replay kept one record for both.
           {R"({"op":"capture","phase":"begin","graph":"g","stream":1}
{"op":"capture","phase":"begin","graph":"g","stream":2})",
            "graph.jsonl:2: graph \"g\" is already capturing (begun at line 1 on stream 1)"},
           {R"({"op":"capture","phase":"begin","graph":"g","stream":1}
{"op":"capture","phase":"begin","graph":"g","stream":1,"expect":"invalid_argument"})",
            "graph.jsonl:2: graph \"g\" is already capturing (begun at line 1 on stream 1)"},
           // A pool the replay could not share, which it used to drop unseen.
           {R"({"op":"capture","phase":"begin","graph":"g","stream":1}
{"op":"capture","phase":"begin","graph":"h","stream":2,"pool":"g"})",
            "graph.jsonl:2: field \"pool\": graph \"g\" is still capturing (begun at line 1); its pool is shared "
            "once it ends"},
           {R"({"op":"capture","phase":"begin","graph":"g","stream":1}
{"op":"capture","phase":"end","graph":"g","stream":1}
{"op":"capture","phase":"destroy","graph":"g"}
{"op":"capture","phase":"begin","graph":"h","stream":1,"pool":"g"})",
            "graph.jsonl:4: field \"pool\": graph \"g\" was destroyed at line 3"},
           {R"({"op":"capture","phase":"begin","graph":"g","stream":1}
{"op":"capture","phase":"end","graph":"g","stream":1}
{"op":"capture","phase":"begin","graph":"g","stream":1}
{"op":"capture","phase":"begin","graph":"h","stream":2,"pool":"g"})",
            "graph.jsonl:4: field \"pool\": graph \"g\" is still capturing (begun at line 3); its pool is shared "
            "once it ends"},
           {R"({"op":"capture","phase":"begin","graph":"g","stream":1}
{"op":"capture","phase":"end","graph":"g","stream":1,"expect":"invalid_argument"}
{"op":"capture","phase":"begin","graph":"h","stream":1,"pool":"g"})",
            "graph.jsonl:3: field \"pool\": graph \"g\" was never made (line 2 carried \"expect\")"},
           // An end that would file another stream's capture under its name: a false corrupt.
           {R"({"op":"capture","phase":"begin","graph":"g","stream":1}
{"op":"capture","phase":"begin","graph":"h","stream":2}
{"op":"capture","phase":"end","graph":"g","stream":2})",
            "graph.jsonl:3: graph \"g\" is capturing on stream 1 (begun at line 1), not on stream 2"},
           {R"({"op":"capture","phase":"begin","graph":"g","stream":1}
{"op":"capture","phase":"end","graph":"g","stream":1}
{"op":"capture","phase":"end","graph":"g","stream":1})",
            "graph.jsonl:3: graph \"g\" is not capturing: no begin of it is open"},
       }) {
    Result<ReplayReport> r = replay(text);
    if (r.ok()) {
      ADD_FAILURE() << "accepted: " << text;
      continue;
    }
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(r.error().message, want);
  }
}

// What the refusals above leave alone: a name captured again after its end, a
// pool shared from a made graph, and a capture on each of two streams at once.
TEST(ReplayGraph, ANameCapturedAgainAfterItsEndAndAPoolOfAMadeGraphReplay) {
  Result<ReplayReport> r = replay(R"({"op":"alloc","id":"a","bytes":65536,"stream":1}
{"op":"alloc","id":"b","bytes":65536,"stream":2}
{"op":"capture","phase":"begin","graph":"g","stream":1}
{"op":"fill","id":"a","stream":1,"seed":1}
{"op":"capture","phase":"end","graph":"g","stream":1}
{"op":"capture","phase":"begin","graph":"g","stream":1}
{"op":"capture","phase":"begin","graph":"h","stream":2}
{"op":"fill","id":"a","stream":1,"seed":2}
{"op":"fill","id":"b","stream":2,"seed":3}
{"op":"capture","phase":"end","graph":"g","stream":1}
{"op":"capture","phase":"end","graph":"h","stream":2}
{"op":"capture","phase":"begin","graph":"k","stream":1,"pool":"g"}
{"op":"fill","id":"a","stream":1,"seed":4}
{"op":"capture","phase":"end","graph":"k","stream":1}
{"op":"replay","graph":"g","stream":1}
{"op":"replay","graph":"h","stream":2}
{"op":"sync"}
{"op":"check","id":"a"}
{"op":"check","id":"b"}
)");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r);
  EXPECT_EQ(r->checks, 2u) << report_summary(*r);
  EXPECT_EQ(r->corrupt, 0u);
}

}  // namespace
}  // namespace ferry
