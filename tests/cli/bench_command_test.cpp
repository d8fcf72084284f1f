// `ferry bench pool|fragmentation`: runs, prints its keys, exits 2 on bad usage.
// A benchmark, not a test of speed: no timing threshold is checked here.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_run.hpp"
#include "test_paths.hpp"

namespace ferry::cli::testing {
namespace {

nlohmann::json parse_one_object(const CliRun& r) {
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_TRUE(j.is_object()) << "stdout is not one JSON object:\n" << r.out << r.err;
  return j.is_object() ? j : nlohmann::json::object();
}

std::string temp_trace(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

TEST(BenchPool, JsonHasEveryKey) {
  CliRun r = run_ferry({"bench", "pool", "--iterations", "2000", "--streams", "2", "--json"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = parse_one_object(r);
  for (const char* key : {"bench", "backend", "device", "streams", "max_bytes", "live_blocks",
                          "iterations", "repetitions", "median_ns", "p99_ns", "pairs_per_s",
                          "repetition_mean_ns", "maps"}) {
    EXPECT_TRUE(j.contains(key)) << key << " missing from " << r.out;
  }
  EXPECT_EQ(j["bench"], "pool");
  EXPECT_EQ(j["device"], "h200");
  EXPECT_EQ(j["streams"], 2);
  EXPECT_EQ(j["max_bytes"], 1u << 20);
  EXPECT_EQ(j["iterations"], 2000);
  EXPECT_EQ(j["repetition_mean_ns"].size(), j["repetitions"].get<std::size_t>());
  EXPECT_LE(j["median_ns"].get<std::uint64_t>(), j["p99_ns"].get<std::uint64_t>());
  EXPECT_GT(j["pairs_per_s"].get<double>(), 0.0);
}

// The churn loop of issue 14: --live blocks stay live, each pair frees one of them.
TEST(BenchPool, LiveSetsTheChurnLoopsLiveBlocks) {
  CliRun r = run_ferry({"bench", "pool", "--iterations", "1000", "--live", "1000", "--json"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = parse_one_object(r);
  EXPECT_EQ(j["live_blocks"], 1000);
  EXPECT_EQ(j["loop"], "churn");
  EXPECT_EQ(j["iterations"], 1000);
  EXPECT_EQ(run_ferry({"bench", "pool", "--live", "0"}).code, 2);
}

TEST(BenchPool, SummaryNamesTheFigures) {
  CliRun r = run_ferry({"bench", "pool", "--iterations", "500", "--max-bytes", "64KiB"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (const char* word : {"median", "p99", "pairs/s", "64.0 KiB"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word << " missing from\n" << r.out;
  }
}

TEST(BenchFragmentation, Report003RatioIsAtLeastOne) {
  CliRun r = run_ferry({"bench", "fragmentation", ::ferry::testing::traces_dir() + "/report003.jsonl", "--json"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = parse_one_object(r);
  const auto peak = j["peak_live_bytes"].get<std::uint64_t>();
  const auto smallest = j["min_capacity_bytes"].get<std::uint64_t>();
  EXPECT_GT(peak, 0u);
  EXPECT_GE(smallest, peak);
  EXPECT_FALSE(j.contains("ratio")) << "min_capacity_ratio, not the run report's fragmentation ratio";
  EXPECT_GE(j["min_capacity_ratio"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["min_capacity_ratio"].get<double>(), double(smallest) / double(peak));
  EXPECT_GE(j["replays"].get<int>(), 2);
  // Every capacity probed above the smallest passed, the 16 granules above it included.
  EXPECT_EQ(j["monotone"], true) << r.out;
  EXPECT_EQ(j["monotone_probes"], 16);
  EXPECT_EQ(j["step_bytes"], 2u << 20);
}

TEST(BenchFragmentation, SummaryNamesTheFigures) {
  const std::string path = temp_trace("ferry_bench_small.jsonl",
                                      R"({"op":"alloc","id":"a","bytes":3145728,"stream":0}
{"op":"alloc","id":"b","bytes":1048576,"stream":0}
{"op":"free","id":"a"}
{"op":"alloc","id":"c","bytes":4194304,"stream":0}
{"op":"free","id":"b"}
{"op":"free","id":"c"}
)");
  CliRun r = run_ferry({"bench", "fragmentation", path});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (const char* word : {"peak live", "5.0 MiB", "smallest capacity", "ratio", "monotone", "replays"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word << " missing from\n" << r.out;
  }
  std::filesystem::remove(path);
}

TEST(BenchFragmentation, MalformedTraceIsUsage) {
  const std::string path =
      temp_trace("ferry_bench_malformed.jsonl", R"({"op":"alloc","id":"a","bytes":-1})" "\n");
  CliRun r = run_ferry({"bench", "fragmentation", path});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(path + ":1"), std::string::npos) << r.err;
  std::filesystem::remove(path);
}

TEST(BenchFragmentation, TraceFailingAtFullCapacityFails) {
  // An alloc that claims to run out of memory but succeeds fails the verdict.
  const std::string path = temp_trace("ferry_bench_failing.jsonl",
                                      R"({"op":"alloc","id":"a","bytes":4096,"stream":0,"expect":"oom"})" "\n");
  CliRun r = run_ferry({"bench", "fragmentation", path});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("full capacity"), std::string::npos) << r.err;
  std::filesystem::remove(path);
}

TEST(Bench, BadUsageExits2) {
  EXPECT_EQ(run_ferry({"bench"}).code, 2);
  EXPECT_EQ(run_ferry({"bench", "nope"}).code, 2);
  EXPECT_EQ(run_ferry({"bench", "pool", "--iterations", "lots"}).code, 2);
  EXPECT_EQ(run_ferry({"bench", "pool", "--iterations", "3"}).code, 2);
  EXPECT_EQ(run_ferry({"bench", "pool", "--streams", "0"}).code, 2);
  EXPECT_EQ(run_ferry({"bench", "pool", "--max-bytes", "100"}).code, 2);
  EXPECT_EQ(run_ferry({"bench", "pool", "--profile", "nope"}).code, 2);
  EXPECT_EQ(run_ferry({"bench", "pool", "--frobnicate"}).code, 2);
  EXPECT_EQ(run_ferry({"bench", "fragmentation"}).code, 2);
  EXPECT_EQ(run_ferry({"bench", "fragmentation", "/nonexistent/trace.jsonl"}).code, 2);
}

TEST(Bench, HelpEverywhere) {
  for (auto args : {std::vector<std::string>{"bench", "--help"},
                    std::vector<std::string>{"bench", "pool", "--help"},
                    std::vector<std::string>{"bench", "fragmentation", "--help"}}) {
    CliRun r = run_ferry(args);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << r.out;
  }
  EXPECT_NE(run_ferry({"--help"}).out.find("bench"), std::string::npos);
}

}  // namespace
}  // namespace ferry::cli::testing
