// The CLI on PyTorch snapshots: `ferry import torch-snapshot`, and replay,
// snapshot and bench fragmentation taking a snapshot directly; every malformed
// or hostile file exits 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "app.hpp"

namespace ferry::cli {
namespace {

const std::string kDir = FERRY_SNAPSHOTS_DIR;

struct CliRun {
  int code = 0;
  std::string out, err;
};

CliRun ferry(std::vector<std::string> args) {
  args.insert(args.begin(), "ferry");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int code = run_cli(static_cast<int>(argv.size()), argv.data(), out, err);
  return {code, out.str(), err.str()};
}

std::string snap(const std::string& name) { return kDir + "/" + name + ".pickle"; }

std::string temp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ferry-import-test-" + name)).string();
}

TEST(ImportCli, WritesATraceThatReplays) {
  const std::string out = temp("moe.jsonl");
  CliRun r = ferry({"import", "torch-snapshot", snap("moe-record-stream"), "-o", out});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("device 0 of 1"), std::string::npos) << r.out;
  CliRun replay = ferry({"replay", out, "--quiet"});
  EXPECT_EQ(replay.code, 0) << replay.out << replay.err;
  std::filesystem::remove(out);
}

TEST(ImportCli, DeviceOptionPicksTheHistory) {
  CliRun r = ferry({"import", "torch-snapshot", snap("two-devices"), "--device", "0", "-o", temp("dev0.jsonl")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("device 0 of 2"), std::string::npos) << r.out;
  EXPECT_EQ(ferry({"import", "torch-snapshot", snap("two-devices"), "--device", "5"}).code, 2);
  std::filesystem::remove(temp("dev0.jsonl"));
}

TEST(ImportCli, ReplayReportsTheSourceBesideFerrysFigures) {
  CliRun r = ferry({"replay", snap("training"), "--json", "--quiet"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto expect = nlohmann::json::parse(std::ifstream(kDir + "/training.expect.json"));
  EXPECT_EQ(j.at("source").at("format"), "torch-snapshot");
  EXPECT_EQ(j.at("source").at("peak_reserved_bytes"), expect.at("peak_reserved_bytes"));
  EXPECT_EQ(j.at("peak_live_bytes"), expect.at("peak_requested_bytes"));
  CliRun summary = ferry({"replay", snap("training"), "--quiet"});
  EXPECT_NE(summary.out.find("PyTorch reserved"), std::string::npos) << summary.out;
}

TEST(ImportCli, BenchFragmentationSaysWhatFerryNeeds) {
  CliRun r = ferry({"bench", "fragmentation", snap("layer-streaming-cut"), "--json", "--quiet"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto expect = nlohmann::json::parse(std::ifstream(kDir + "/layer-streaming-cut.expect.json"));
  EXPECT_EQ(j.at("peak_live_bytes"), expect.at("peak_requested_bytes"));
  EXPECT_EQ(j.at("source").at("reconstructed_blocks"), expect.at("reconstructed_blocks"));
  EXPECT_GE(j.at("min_capacity_bytes").get<std::uint64_t>(), j.at("peak_live_bytes").get<std::uint64_t>());
}

TEST(ImportCli, SnapshotPageNamesTheProgramsLines) {
  const std::string page = temp("decode.html");
  CliRun r = ferry({"snapshot", snap("decode-kv-cache"), "--out", page, "--quiet"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::stringstream s;
  s << std::ifstream(page).rdbuf();
  EXPECT_NE(s.str().find("generate.py:71:torch.cat"), std::string::npos);
  std::filesystem::remove(page);
}

TEST(ImportCli, MalformedAndHostileFilesExitTwo) {
  std::filesystem::remove("ferry-hostile-ran");
  const std::string empty = temp("empty.pickle");
  std::ofstream(empty).flush();
  std::vector<std::string> files = {snap("hostile-reduce-top"), snap("hostile-reduce-frame")};
  const auto malformed = nlohmann::json::parse(std::ifstream(kDir + "/malformed.json"));
  for (const auto& [name, words] : malformed.items()) {
    files.push_back(snap(name));
  }
  for (const std::string& f : files) {
    EXPECT_EQ(ferry({"import", "torch-snapshot", f, "-o", temp("x.jsonl")}).code, 2) << f;
    EXPECT_EQ(ferry({"replay", f, "--quiet"}).code, 2) << f;
    EXPECT_EQ(ferry({"bench", "fragmentation", f, "--quiet"}).code, 2) << f;
    EXPECT_EQ(ferry({"snapshot", f, "--out", temp("x.html"), "--quiet"}).code, 2) << f;
  }
  CliRun r = ferry({"import", "torch-snapshot", empty});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("empty"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists("ferry-hostile-ran"));
  std::filesystem::remove(empty);
}

}  // namespace
}  // namespace ferry::cli
