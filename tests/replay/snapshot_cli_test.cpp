// `ferry snapshot`: the page and the JSON it writes, and its exit codes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli_run.hpp"
#include "test_paths.hpp"

namespace ferry::cli {
namespace {

using testing::run_ferry;

std::string committed(const std::string& name) { return ::ferry::testing::traces_dir() + "/" + name; }

constexpr const char* kTrace =
    R"({"op":"alloc","id":"keep","bytes":4194304,"stream":0}
{"op":"fill","id":"keep","stream":0,"seed":1}
{"op":"alloc","id":"gone","bytes":8388608,"stream":1}
{"op":"upload","id":"gone","stream":1,"seed":2}
{"op":"alloc","id":"also","bytes":65536,"stream":1}
{"op":"compute","inputs":["gone"],"output":"also","stream":1}
{"op":"free","id":"gone"}
{"op":"check","id":"also"}
)";

class SnapshotCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           (std::string("ferry_snapshot_cli_") + info->name() + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    trace_ = write("t.jsonl", kTrace);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string p = path(name);
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string read(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::filesystem::path dir_;
  std::string trace_;
};

TEST_F(SnapshotCli, WritesASelfContainedPageAndJsonWithTheLiveBlocks) {
  const std::string html = path("t.html"), json = path("t.json");
  const auto r = run_ferry({"snapshot", trace_, "--capacity", "64MiB", "--out", html, "--json", json});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("wrote " + html), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verdict: PASS"), std::string::npos) << r.out;

  const std::string page = read(html);
  ASSERT_GT(page.size(), 1000u);
  EXPECT_EQ(page.find("http://"), std::string::npos);
  EXPECT_EQ(page.find("https://"), std::string::npos);
  for (const char* s : {"<svg", "reserved (mapped)", "live (allocated)", "pending free", "reserved_bytes",
                        "allocated_bytes", "pending_free_bytes"}) {
    EXPECT_NE(page.find(s), std::string::npos) << s;
  }

  const auto j = nlohmann::json::parse(read(json));
  EXPECT_EQ(j["samples"]["reserved_bytes"].size(), 8u + 2u);
  ASSERT_EQ(j["layouts"].size(), 2u);
  const auto& end = j["layouts"][1];
  EXPECT_EQ(end["moment"], "end");
  std::map<std::string, std::uint64_t> live;
  for (const auto& b : end["snapshot"]["blocks"]) {
    if (b["state"] == "live") live[b.value("owner", "?")] = b["bytes"];
  }
  EXPECT_EQ(live, (std::map<std::string, std::uint64_t>{{"also", 65536}, {"keep", 4194304}}));
}

TEST_F(SnapshotCli, JsonOnStdoutWritesNoPageUnlessAsked) {
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir_);
  const auto r = run_ferry({"snapshot", trace_, "--capacity", "64MiB", "--json", "-"});
  std::filesystem::current_path(cwd);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["report"]["verdict"], "pass");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "t-snapshot.html"));
}

TEST_F(SnapshotCli, WithoutOutputOptionsThePageGoesToTheCurrentDirectory) {
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir_);
  const auto r = run_ferry({"snapshot", trace_, "--capacity", "64MiB", "--at", "5"});
  std::filesystem::current_path(cwd);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir_ / "t-snapshot.html"));
  EXPECT_NE(r.out.find("at line 5"), std::string::npos) << r.out;
}

TEST_F(SnapshotCli, ACommittedTraceProducesAPage) {
  const std::string html = path("r003.html");
  const auto r = run_ferry({"snapshot", committed("report003.jsonl"), "--capacity", "64MiB", "--out", html});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("layout peak reserved"), std::string::npos) << r.out;
  EXPECT_GT(std::filesystem::file_size(html), 10000u);
}

TEST_F(SnapshotCli, AFailedReplayStillWritesThePageAndExitsOne) {
  const std::string trace = write("fail.jsonl", R"({"op":"alloc","id":"x","bytes":4096,"stream":0,"expect":"oom"})"
                                                "\n");
  const std::string html = path("fail.html");
  const auto r = run_ferry({"snapshot", trace, "--capacity", "64MiB", "--out", html});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(std::filesystem::exists(html));
}

TEST_F(SnapshotCli, BadInputsExitTwoAndWriteNothing) {
  const std::string malformed = write("bad.jsonl", "{\"op\":\"alloc\",\"id\":\"a\",\"bytes\":-1,\"stream\":0}\n");
  const std::string html = path("x.html");
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"snapshot", malformed, "--out", html}, "bad.jsonl:1:"},
      {{"snapshot", path("missing.jsonl"), "--out", html}, "cannot open"},
      {{"snapshot", trace_, "--capacity", "12XB", "--out", html}, "--capacity"},
      {{"snapshot", "/proc/self/mem", "--out", html}, "/proc/self/mem: read failed"},
      {{"snapshot", "/dev/zero", "--out", html}, "is a character device"},
      {{"snapshot", trace_, "--capacity", "0", "--out", html}, "--capacity"},
      {{"snapshot", trace_, "--profile", "a100", "--out", html}, "a100"},
      {{"snapshot", trace_, "--seed", "-1", "--out", html}, "--seed"},
      {{"snapshot", trace_, "--at", "0", "--out", html}, "--at"},
      {{"snapshot", trace_, "--capacity", "64MiB", "--at", "99", "--out", html}, "--at 99"},
      {{"snapshot", trace_, "--out", path("no/such/dir/x.html")}, "does not exist"},
      {{"snapshot", trace_, "--out", trace_}, "overwrite the trace"},
      {{"snapshot", trace_, "--out", dir_.string()}, "is a directory"},
      {{"snapshot", trace_, "--json", trace_}, "overwrite the trace"},
      {{"snapshot"}, "TRACE"},
      {{"snapshot", trace_, "--bogus"}, "--bogus"},
  };
  for (const Case& c : cases) {
    const auto r = run_ferry(c.args);
    std::string shown;
    for (const auto& a : c.args) shown += a + " ";
    EXPECT_EQ(r.code, 2) << shown << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << shown << "\nstderr: " << r.err;
    EXPECT_FALSE(std::filesystem::exists(html)) << shown;
  }
  EXPECT_EQ(read(trace_), kTrace) << "the trace is never overwritten";
}

// Item 14: 2 means nothing ran. An output that fails to write after the replay
// ran (a full disk) is a failed run: exit 1.
TEST_F(SnapshotCli, AnOutputThatFailsAfterTheReplayRanExitsOne) {
  const auto j = run_ferry({"snapshot", trace_, "--capacity", "64MiB", "--json", "/dev/full"});
  EXPECT_EQ(j.code, 1) << j.out << j.err;
  EXPECT_NE(j.err.find("--json: cannot write /dev/full"), std::string::npos) << j.err;
  const auto h = run_ferry({"snapshot", trace_, "--capacity", "64MiB", "--out", "/dev/full"});
  EXPECT_EQ(h.code, 1) << h.out << h.err;
}

TEST_F(SnapshotCli, HelpListsTheOptions) {
  const auto r = run_ferry({"snapshot", "--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* s : {"TRACE", "--capacity", "--profile", "--seed", "--at", "--out", "--json", "Exit status"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  }
  const auto top = run_ferry({"--help"});
  EXPECT_NE(top.out.find("snapshot"), std::string::npos);
}

}  // namespace
}  // namespace ferry::cli
