// ferry replay --strict --race-check: the trace's own order stands, and a missing
// wait is a race naming both trace lines; the same trace with its `wait` passes.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.hpp"
#include "ferry/replay.hpp"

namespace ferry {
namespace {

using cli::testing::run_ferry;

// A producer on stream 1, a consumer on stream 0: line 3 fills, line 5 reads.
std::string producer_consumer(bool with_wait) {
  std::string t =
      "{\"op\":\"alloc\",\"id\":\"w\",\"bytes\":1048576,\"stream\":0}\n"
      "{\"op\":\"alloc\",\"id\":\"out\",\"bytes\":4096,\"stream\":0}\n"
      "{\"op\":\"fill\",\"id\":\"w\",\"stream\":1,\"seed\":7}\n";
  t += with_wait ? "{\"op\":\"wait\",\"stream\":0,\"for\":1}\n" : "{\"op\":\"trim\"}\n";
  t += "{\"op\":\"compute\",\"inputs\":[\"w\"],\"output\":\"out\",\"stream\":0}\n"
       "{\"op\":\"sync\"}\n"
       "{\"op\":\"check\",\"id\":\"out\"}\n";
  return t;
}

std::string write_trace(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ReplayRace, AMissingWaitUnderStrictIsARaceNamingBothLines) {
  const std::string path = write_trace("missing_wait.jsonl", producer_consumer(false));
  const auto r = run_ferry({"replay", path, "--capacity", "64MiB", "--strict", "--race-check"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("race: line 3 (fill"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("line 5 (compute"), std::string::npos) << r.out;
  // One race, in the singular everywhere it is counted.
  EXPECT_NE(r.out.find("races          1 race (unordered"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("race: 1 unordered conflicting access; the first"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verdict: FAIL - 1 race\n"), std::string::npos) << r.out;

  const auto j = run_ferry({"replay", path, "--capacity", "64MiB", "--strict", "--race-check", "--json"});
  const auto report = nlohmann::json::parse(j.out);
  ASSERT_TRUE(report.contains("races")) << j.out;
  EXPECT_GE(report["races"]["count"].get<int>(), 1);
  EXPECT_EQ(report["races"]["list"][0]["earlier"]["line"], 3);
  EXPECT_EQ(report["races"]["list"][0]["later"]["line"], 5);
  EXPECT_EQ(report["races"]["list"][0]["earlier"]["id"], "w");
}

// Issue 46 item 5: a verified upload blocks the host, which orders the next op;
// --strict races by stream order alone, so the missing wait is still a race, marked
// as one only verification ordered.
TEST(ReplayRace, AnUploadsMissingWaitIsARaceUnderStrictWhateverThePolicy) {
  std::string t = producer_consumer(false);
  const std::string fill = "{\"op\":\"fill\",\"id\":\"w\",\"stream\":1,\"seed\":7}\n";
  t.replace(t.find(fill), fill.size(), "{\"op\":\"upload\",\"id\":\"w\",\"stream\":1,\"seed\":7}\n");
  const std::string path = write_trace("upload_missing_wait.jsonl", t);
  const auto r = run_ferry({"replay", path, "--capacity", "64MiB", "--strict", "--race-check"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("race: line 3 (upload"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ordered here only by a verified upload's host wait"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checks         1 compared, 0 corrupt"), std::string::npos) << "verification kept the bytes";
  const auto j = nlohmann::json::parse(
      run_ferry({"replay", path, "--capacity", "64MiB", "--strict", "--race-check", "--json"}).out);
  EXPECT_EQ(j["races"]["count"], 1);
  EXPECT_EQ(j["races"]["list"][0]["ordered_by_verification"], true);
  // Without --strict the replay's own waits order the streams: nothing to report.
  EXPECT_EQ(run_ferry({"replay", path, "--capacity", "64MiB", "--race-check"}).code, 0);
  // Under integrity off the race is the plain kind.
  const auto off = run_ferry({"replay", path, "--capacity", "64MiB", "--strict", "--race-check", "--integrity", "off"});
  EXPECT_EQ(off.code, 1);
  EXPECT_EQ(off.out.find("ordered here only"), std::string::npos) << off.out;
}

TEST(ReplayRace, TheSameTraceWithItsWaitPasses) {
  const std::string path = write_trace("with_wait.jsonl", producer_consumer(true));
  const auto r = run_ferry({"replay", path, "--capacity", "64MiB", "--strict", "--race-check"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("0 races"), std::string::npos) << r.out;
}

TEST(ReplayRace, WithoutStrictTheReplayOrdersTheStreamsItself) {
  const std::string path = write_trace("no_strict.jsonl", producer_consumer(false));
  const auto r = run_ferry({"replay", path, "--capacity", "64MiB", "--race-check"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

TEST(ReplayRace, AFreedBlockReusedOnAnotherStreamIsOrderedByThePool) {
  // `a` is written on stream 1 and freed; `b` on stream 0 may reuse its memory.
  // The trace orders nothing, so what keeps them apart is the pool's: a host wait
  // it saw complete, or make_ready's wait.
  const std::string text =
      "{\"op\":\"alloc\",\"id\":\"a\",\"bytes\":65536,\"stream\":1}\n"
      "{\"op\":\"fill\",\"id\":\"a\",\"stream\":1,\"seed\":1}\n"
      "{\"op\":\"check\",\"id\":\"a\"}\n"
      "{\"op\":\"free\",\"id\":\"a\"}\n"
      "{\"op\":\"alloc\",\"id\":\"b\",\"bytes\":65536,\"stream\":0}\n"
      "{\"op\":\"fill\",\"id\":\"b\",\"stream\":0,\"seed\":2}\n"
      "{\"op\":\"sync\"}\n"
      "{\"op\":\"check\",\"id\":\"b\"}\n";
  ReplayOptions o;
  o.capacity = 64 << 20;
  o.strict = true;
  o.backend.race_check = true;
  auto r = replay_trace_text(text, "reuse.jsonl", o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->races, 0u) << "the pool's own orderings (make_ready, host waits) make reuse safe\n"
                          << report_summary(*r);
}

// The program's own kernels, as `user` ops with their marks: the stand-in kernel
// writes what the reference model predicts, so checks compare bytes; a user op
// reading what another stream wrote, with no wait, is a race naming both lines.
std::string user_ops(bool with_wait) {
  std::string t =
      "{\"op\":\"alloc\",\"id\":\"x\",\"bytes\":65536,\"stream\":0}\n"
      "{\"op\":\"alloc\",\"id\":\"y\",\"bytes\":65536,\"stream\":0}\n"
      "{\"op\":\"fill\",\"id\":\"x\",\"stream\":1,\"seed\":3}\n";
  t += with_wait ? "{\"op\":\"wait\",\"stream\":0,\"for\":1}\n" : "{\"op\":\"trim\"}\n";
  t += "{\"op\":\"user\",\"stream\":0,\"tag\":\"scale\",\"operands\":[{\"id\":\"x\",\"access\":\"read\"},"
       "{\"id\":\"y\",\"access\":\"write\"}]}\n"
       "{\"op\":\"user\",\"stream\":0,\"operands\":[{\"id\":\"y\",\"access\":\"read_write\"}]}\n"
       "{\"op\":\"sync\"}\n"
       "{\"op\":\"check\",\"id\":\"y\"}\n"
       "{\"op\":\"user\",\"stream\":0,\"operands\":[{\"id\":\"y\",\"access\":\"write\",\"offset\":65280,"
       "\"bytes\":512}],\"expect\":\"invalid_argument\"}\n";
  return t;
}

TEST(ReplayRace, UserOpsReplayByTheirMarksAndTheirBytesAreChecked) {
  ReplayOptions o;
  o.capacity = 64 << 20;
  o.strict = true;
  o.backend.race_check = true;
  auto r = replay_trace_text(user_ops(true), "user.jsonl", o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r);
  EXPECT_EQ(r->checks, 1u) << "the stand-in kernels' bytes were compared";
  EXPECT_EQ(r->expected_errors, 1u) << "an operand range outside its block";
}

TEST(ReplayRace, AUserOpMissingItsWaitIsARaceNamingBothLines) {
  const std::string path = write_trace("user_race.jsonl", user_ops(false));
  const auto r = run_ferry({"replay", path, "--capacity", "64MiB", "--strict", "--race-check", "--json"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  const auto report = nlohmann::json::parse(r.out);
  ASSERT_GE(report["races"]["count"].get<int>(), 1) << r.out;
  const auto& first = report["races"]["list"][0];
  EXPECT_EQ(first["earlier"]["line"], 3);
  EXPECT_EQ(first["later"]["line"], 5);
  EXPECT_EQ(first["later"]["op"], "user");
  EXPECT_EQ(first["earlier"]["id"], "x");
  EXPECT_EQ(first["reuse"], false);
}

TEST(ReplayRace, RaceCheckOnCudaIsABadOption) {
  const std::string path = write_trace("cuda.jsonl", "{\"op\":\"trim\"}\n");
  const auto r = run_ferry({"replay", path, "--backend", "cuda", "--race-check"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
}

// A trace over two devices (docs/spec.md §3) without its wait across devices:
// the race names each side's device, in the summary and the JSON.
TEST(ReplayRace, AMissingWaitAcrossDevicesNamesEachSidesDevice) {
  const std::string path = write_trace("two_devices_no_wait.jsonl",
      "{\"op\":\"meta\",\"capacity\":67108864,\"devices\":2,\"links\":\"0-1:pcie\"}\n"
      "{\"op\":\"alloc\",\"id\":\"x\",\"bytes\":65536,\"stream\":0}\n"
      "{\"op\":\"fill\",\"id\":\"x\",\"stream\":0,\"seed\":1}\n"
      "{\"op\":\"alloc\",\"id\":\"y\",\"bytes\":65536,\"stream\":0,\"device\":1}\n"
      "{\"op\":\"copy_peer\",\"src\":\"x\",\"dst\":\"y\",\"stream\":0,\"bytes\":65536}\n"
      "{\"op\":\"fill\",\"id\":\"x\",\"stream\":1,\"seed\":2}\n"
      "{\"op\":\"check\",\"id\":\"y\",\"device\":1}\n");
  const auto r = run_ferry({"replay", path, "--strict", "--race-check", "--integrity", "off"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("x 2 devices, pool capacity 128.0 MiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("line 5 (copy_peer: copy_peer read on stream 0 of device 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("line 6 (fill: fill write on stream 1 of device 0"), std::string::npos) << r.out;

  const auto j = run_ferry({"replay", path, "--strict", "--race-check", "--integrity", "off", "--json"});
  const auto report = nlohmann::json::parse(j.out);
  EXPECT_EQ(report["devices"], 2);
  bool across = false;
  for (const auto& race : report["races"]["list"]) {
    across = across || (race["earlier"]["device"] == 1 && race["later"]["device"] == 0 && race["later"]["line"] == 6);
  }
  EXPECT_TRUE(across) << j.out;

  // With the wait across devices the program needs, no race.
  std::string fixed;
  {
    std::ifstream in(path);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      if (++n == 6) fixed += "{\"op\":\"wait\",\"stream\":1,\"for\":0,\"for_device\":1}\n";
      fixed += line + "\n";
    }
  }
  const auto ok = run_ferry({"replay", write_trace("two_devices_wait.jsonl", fixed), "--strict", "--race-check",
                             "--integrity", "off"});
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
}

}  // namespace
}  // namespace ferry
