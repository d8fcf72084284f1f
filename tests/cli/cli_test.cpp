// The ferry CLI: exit codes, --help/--version, `ferry replay`'s options and
// outputs. Mostly in-process through run_cli; a few through the real binary.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "app.hpp"
#include "cli_run.hpp"
#include "ferry/cuda_backend.hpp"
#include "test_paths.hpp"

namespace ferry::cli {
namespace {

using testing::CliRun;

CliRun ferry(std::initializer_list<std::string> args) { return testing::run_ferry(args); }

std::string trace(const std::string& name) { return ::ferry::testing::traces_dir() + "/" + name; }

// A file in the test's temporary directory, removed with the fixture.
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           (std::string("ferry_cli_test_") + info->name() + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

// --- the top level --------------------------------------------------------------

TEST_F(CliTest, VersionAndHelp) {
  CliRun v = ferry({"--version"});
  EXPECT_EQ(v.code, 0);
  EXPECT_NE(v.out.find("ferry "), std::string::npos);

  CliRun h = ferry({"--help"});
  EXPECT_EQ(h.code, 0);
  EXPECT_NE(h.out.find("replay"), std::string::npos);

  CliRun rh = ferry({"replay", "--help"});
  EXPECT_EQ(rh.code, 0);
  for (const char* opt : {"FILE", "--backend", "--profile", "--capacity", "--seed", "--report", "--json"}) {
    EXPECT_NE(rh.out.find(opt), std::string::npos) << opt << " missing from\n" << rh.out;
  }
}

TEST_F(CliTest, BadUsageExitsTwo) {
  EXPECT_EQ(ferry({}).code, 2);
  EXPECT_EQ(ferry({"frobnicate"}).code, 2);
  EXPECT_EQ(ferry({"--frobnicate"}).code, 2);
  EXPECT_EQ(ferry({"replay"}).code, 2);  // FILE is required
  EXPECT_EQ(ferry({"replay", trace("report003.jsonl"), "extra"}).code, 2);
  EXPECT_EQ(ferry({"replay", trace("report003.jsonl"), "--frobnicate"}).code, 2);
}

TEST_F(CliTest, BadReplayOptionsExitTwoNamingTheOption) {
  const std::string t = trace("report003.jsonl");
  const std::vector<std::vector<std::string>> bad = {
      {"--capacity", "12XB"},   {"--capacity", "0"},        {"--capacity", "-5"},
      {"--capacity", "1.5GiB"}, {"--capacity", "64MB"},     {"--capacity", "99999999999999TiB"},
      {"--capacity", ""},       {"--capacity"},             {"--backend", "opencl"},
      {"--profile", "gtx480"},  {"--seed", "-1"},           {"--seed", "abc"},
      {"--seed", "18446744073709551616"},                   {"--report"},
  };
  for (const auto& opts : bad) {
    std::vector<std::string> storage{"ferry", "replay", t};
    storage.insert(storage.end(), opts.begin(), opts.end());
    std::vector<const char*> argv;
    for (const std::string& a : storage) argv.push_back(a.c_str());
    std::ostringstream out, err;
    const int code = run_cli(static_cast<int>(argv.size()), argv.data(), out, err);
    std::string shown;
    for (const auto& o : opts) shown += o + " ";
    EXPECT_EQ(code, 2) << shown << "\n" << err.str();
    EXPECT_NE(err.str().find(opts[0]), std::string::npos) << shown << ": " << err.str();
  }
}

TEST_F(CliTest, CapacitySuffixesAreAccepted) {
  for (const char* cap : {"67108864", "65536KiB", "64MiB"}) {
    CliRun r = ferry({"replay", trace("report003.jsonl"), "--capacity", cap});
    EXPECT_EQ(r.code, 0) << cap << "\n" << r.out << r.err;
  }
}

// --- ferry replay -----------------------------------------------------------------

TEST_F(CliTest, Report003PassesWithAReadableSummary) {
  CliRun r = ferry({"replay", trace("report003.jsonl"), "--capacity", "64MiB", "--profile", "h200",
                 "--seed", "1"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (const char* word : {"ops", "checks", "corrupt", "errors", "peak", "reclaims", "verdict: PASS"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word << " missing from\n" << r.out;
  }
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST_F(CliTest, ReportToStdoutIsOneJsonObjectWithTheSpecKeys) {
  for (const char* flag : {"--report=-", "--json"}) {
    CliRun r = ferry({"replay", trace("oom-expected.jsonl"), "--capacity", "32MiB", flag});
    EXPECT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << flag << " printed:\n" << r.out;
    ASSERT_TRUE(j.is_object());
    for (const char* key : {"ops", "checks", "corrupt", "errors", "unexpected_errors", "peak_live_bytes",
                            "peak_reserved_bytes", "ooms", "reclaims", "integrity"}) {
      EXPECT_TRUE(j.contains(key)) << key;
    }
    for (const char* key : {"bytes_moved", "bytes_verified", "mismatches", "retries", "fallbacks"}) {
      EXPECT_TRUE(j["integrity"].contains(key)) << key;
    }
    EXPECT_EQ(j["errors"]["out_of_memory"], 2);
    EXPECT_EQ(j["corrupt"], 0);
  }
}

TEST_F(CliTest, ReportFileIsWrittenBesideTheSummary) {
  const std::string out = path("report.json");
  CliRun r = ferry({"replay", trace("report003.jsonl"), "--capacity", "64MiB", "--report", out});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("verdict: PASS"), std::string::npos);
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << text.str();
  EXPECT_GT(j["reclaims"].get<std::uint64_t>(), 0u);
}

TEST_F(CliTest, UnwritableReportIsBadUsage) {
  CliRun r = ferry({"replay", trace("report003.jsonl"), "--report", "/nonexistent-dir/r.json"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--report"), std::string::npos) << r.err;
}

TEST_F(CliTest, AReportOverTheTraceIsRefused) {
  const std::string t = write("t.jsonl", "{\"op\":\"trim\"}\n");
  CliRun r = ferry({"replay", t, "--report", t});
  EXPECT_EQ(r.code, 2);
  std::ifstream in(t);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, "{\"op\":\"trim\"}");
}

TEST_F(CliTest, MalformedTraceExitsTwoWithFileAndLine) {
  const std::string bad = write("bad.jsonl", "{\"op\":\"trim\"}\n\n{\"op\":\"alloc\",\"id\":\"a\",\"bytes\":-1,\"stream\":0}\n");
  CliRun r = ferry({"replay", bad});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(bad + ":3: "), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << "nothing may run: " << r.out;
}

TEST_F(CliTest, MissingTraceFileExitsTwo) {
  CliRun r = ferry({"replay", path("absent.jsonl")});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("absent.jsonl"), std::string::npos);
}

TEST_F(CliTest, UnexpectedErrorsAndCorruptionExitOne) {
  const std::string t = write("zero.jsonl", R"({"op":"alloc","id":"a","bytes":0,"stream":0}
{"op":"alloc","id":"b","bytes":4611686018427387904,"stream":1}
)");
  CliRun r = ferry({"replay", t});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("verdict: FAIL"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("line 1"), std::string::npos) << r.out;
}

TEST_F(CliTest, CudaWhereThereIsNoneExitsTwoWithAPlainMessage) {
  if (make_cuda_backend({}).ok()) GTEST_SKIP() << "this machine has a CUDA device";  // runs in every build without one
  CliRun r = ferry({"replay", trace("report003.jsonl"), "--backend", "cuda"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("cuda backend is not available"), std::string::npos) << r.err;
}

// --- the real binary ---------------------------------------------------------------

int exit_status(const std::string& command) {
  const int raw = std::system((command + " >/dev/null 2>&1").c_str());
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

TEST_F(CliTest, TheBinaryExitsWithTheDocumentedCodes) {
  const std::string bin = FERRY_CLI_BINARY;
  EXPECT_EQ(exit_status(bin + " --version"), 0);
  EXPECT_EQ(exit_status(bin + " replay --help"), 0);
  EXPECT_EQ(exit_status(bin + " replay '" + trace("report003.jsonl") + "' --capacity 64MiB"), 0);
  EXPECT_EQ(exit_status(bin + " replay '" + trace("report003.jsonl") + "' --capacity 64XB"), 2);
  const std::string bad = write("bad.jsonl", "not json\n");
  EXPECT_EQ(exit_status(bin + " replay '" + bad + "'"), 2);
  const std::string zero = write("zero.jsonl", "{\"op\":\"alloc\",\"id\":\"a\",\"bytes\":0,\"stream\":0}\n");
  EXPECT_EQ(exit_status(bin + " replay '" + zero + "'"), 1);
}

}  // namespace
}  // namespace ferry::cli
