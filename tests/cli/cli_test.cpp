// The ferry CLI: exit codes, --help/--version, `ferry replay`'s options and
// outputs. Mostly in-process through run_cli; a few through the real binary.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <pty.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "app.hpp"
#include "cli_run.hpp"
#include "ferry/cuda_backend.hpp"
#include "ferry/replay.hpp"
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
      {"--capacity", "1.5B"},   {"--capacity", "64 M"},     {"--capacity", "99999999999999TiB"},
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

// A mistyped option or command gets the known name it is a typo of; a word
// nowhere near any gets no guess.
TEST_F(CliTest, AMistypedFlagOrCommandGetsADidYouMean) {
  CliRun flag = ferry({"replay", trace("report003.jsonl"), "--race-chek"});
  EXPECT_EQ(flag.code, 2) << flag.err;
  EXPECT_NE(flag.err.find("--race-chek"), std::string::npos) << flag.err;
  EXPECT_NE(flag.err.find("ferry: '--race-chek' is not an option of ferry replay: did you mean '--race-check'?"),
            std::string::npos) << flag.err;
  EXPECT_EQ(flag.err.find("not expected"), std::string::npos) << "the fix, not CLI11's symptom first:\n" << flag.err;
  CliRun valued_run = ferry({"run", "moe-offload", "--device", "2"});
  EXPECT_EQ(valued_run.code, 2);
  EXPECT_EQ(valued_run.err, "ferry: '--device' is not an option of ferry run: did you mean '--devices'?\n");
  CliRun valued = ferry({"replay", trace("report003.jsonl"), "--capcity=64MiB"});
  EXPECT_NE(valued.err.find("did you mean '--capacity'?"), std::string::npos) << valued.err;
  CliRun command = ferry({"repaly", trace("report003.jsonl")});
  EXPECT_EQ(command.code, 2) << command.err;
  EXPECT_NE(command.err.find("did you mean 'replay'?"), std::string::npos) << command.err;
  CliRun far = ferry({"replay", trace("report003.jsonl"), "--zzzzzzzz"});
  EXPECT_EQ(far.code, 2);
  EXPECT_EQ(far.err.find("did you mean"), std::string::npos) << far.err;
  EXPECT_NE(far.err.find("--zzzzzzzz"), std::string::npos) << "CLI11's message then: " << far.err;
}

// Issue 46 item 9: a command that needs a subcommand names them.
TEST_F(CliTest, ACommandWithoutItsSubcommandNamesThem) {
  CliRun bench = ferry({"bench"});
  EXPECT_EQ(bench.code, 2);
  EXPECT_EQ(bench.err, "ferry bench needs a subcommand: pool or fragmentation (run 'ferry bench --help')\n");
}

TEST_F(CliTest, CapacitySuffixesAreAccepted) {
  for (const char* cap : {"67108864", "65536KiB", "64MiB", "64mib", "0.0625GiB", "67.108864MB"}) {
    CliRun r = ferry({"replay", trace("report003.jsonl"), "--capacity", cap, "--json"});
    EXPECT_EQ(r.code, 0) << cap << "\n" << r.out << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out, nullptr, false).value("capacity", 0ull), 64ull << 20) << cap;
  }
}

// More than the device is clamped to it, and said so (it was silent).
TEST_F(CliTest, ACapacityBeyondTheDeviceIsClampedWithAWarning) {
  CliRun r = ferry({"replay", trace("report003.jsonl"), "--capacity", "99999TiB"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("warning: --capacity"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("clamped"), std::string::npos) << r.err;
  CliRun fits = ferry({"replay", trace("report003.jsonl"), "--capacity", "64MiB"});
  EXPECT_TRUE(fits.err.empty()) << fits.err;
}

// --- unreadable, special and oversized inputs (issue 15, items 9 and 10) ----------

// A read error part-way is bad input, never a PASS on what was read before it.
TEST_F(CliTest, ATraceThatCannotBeReadIsExitTwoNeverAPass) {
  for (const std::string sub : {"replay", "snapshot"}) {
    CliRun r = ferry({sub, "/proc/self/mem", "--json", sub == "replay" ? "--quiet" : "-"});
    EXPECT_EQ(r.code, 2) << sub << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("/proc/self/mem: read failed"), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("PASS"), std::string::npos) << r.out;
  }
  CliRun b = ferry({"bench", "fragmentation", "/proc/self/mem"});
  EXPECT_EQ(b.code, 2) << b.out << b.err;
}

// What is not a regular file is refused at once: a FIFO with no writer used to
// hang in open(), /dev/zero used to be read until memory ran out.
TEST_F(CliTest, SpecialFilesAreRefusedAtOnceSayingWhatTheyAre) {
  const std::string fifo = path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  CliRun f = ferry({"replay", fifo});
  EXPECT_EQ(f.code, 2);
  EXPECT_NE(f.err.find(fifo + ": is a FIFO"), std::string::npos) << f.err;
  CliRun z = ferry({"replay", "/dev/zero"});
  EXPECT_EQ(z.code, 2);
  EXPECT_NE(z.err.find("/dev/zero: is a character device"), std::string::npos) << z.err;
  CliRun d = ferry({"replay", dir_.string()});
  EXPECT_EQ(d.code, 2);
  EXPECT_NE(d.err.find("is a directory"), std::string::npos) << d.err;
  EXPECT_EQ(d.err.find("ioctl"), std::string::npos) << "no stale errno: " << d.err;
}

// The JSON parser ends at a NUL: what follows it must not pass unread.
TEST_F(CliTest, ANulByteInATraceLineIsMalformed) {
  const std::string t = write("nul.jsonl", std::string("{\"op\":\"trim\"}") + '\0' + "garbage\n");
  CliRun r = ferry({"replay", t});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(t + ":1: a NUL byte at column 14"), std::string::npos) << r.err;
}

TEST_F(CliTest, OverlongLinesAndTracesAreRefusedNamingTheLimit) {
  const std::string note(kMaxTraceLineBytes, 'x');
  const std::string t = write("long.jsonl", "{\"op\":\"trim\"}\n{\"op\":\"trim\",\"note\":\"" + note + "\"}\n");
  CliRun r = ferry({"replay", t});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(t + ":2: the line is"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("limit of 1048576 bytes"), std::string::npos) << r.err;
  // A sparse file past the trace limit: refused from its size, nothing read.
  const std::string big = path("big.jsonl");
  {
    std::ofstream(big, std::ios::binary) << "{}";
  }
  std::filesystem::resize_file(big, kMaxTraceBytes + 1);
  CliRun b = ferry({"replay", big});
  EXPECT_EQ(b.code, 2) << b.out << b.err;
  EXPECT_NE(b.err.find("is larger than the 1 GiB limit on a trace"), std::string::npos) << b.err;
}

// --- the meta line (item 18) ---------------------------------------------------------

// The committed trace carries the capacity it is meant for: no --capacity needed.
TEST_F(CliTest, ATracesMetaCapacityIsUsedWhenNoneIsGiven) {
  CliRun r = ferry({"replay", trace("oom-expected.jsonl"), "--json"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_EQ(j.value("capacity", 0ull), 32ull << 20);
  CliRun given = ferry({"replay", trace("oom-expected.jsonl"), "--json", "--capacity", "64MiB"});
  EXPECT_EQ(given.code, 1) << "--capacity wins: the expected OOM does not happen at 64 MiB";
  EXPECT_EQ(nlohmann::json::parse(given.out, nullptr, false).value("capacity", 0ull), 64ull << 20);

  const std::string late = write("late.jsonl", "{\"op\":\"trim\"}\n{\"op\":\"meta\",\"capacity\":4194304}\n");
  CliRun l = ferry({"replay", late});
  EXPECT_EQ(l.code, 2);
  EXPECT_NE(l.err.find(late + ":2: a meta op may only be the trace's first line"), std::string::npos) << l.err;
  const std::string zero = write("zero-meta.jsonl", "\n{\"op\":\"meta\",\"capacity\":0}\n");
  CliRun z = ferry({"replay", zero});
  EXPECT_EQ(z.code, 2);
  EXPECT_NE(z.err.find(zero + ":2: field \"capacity\" must be above 0"), std::string::npos) << z.err;
}

// --- small lies (item 14) -------------------------------------------------------------

// The engine's start-up probe is not the trace's: a trace that allocates nothing peaks at nothing.
TEST_F(CliTest, ATraceWithoutAllocationsPeaksAtZeroLiveBytes) {
  const std::string t = write("trim.jsonl", "{\"op\":\"trim\"}\n");
  CliRun r = ferry({"replay", t, "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_EQ(j.value("peak_live_bytes", 1ull), 0u) << r.out;
  CliRun s = ferry({"replay", t});
  EXPECT_EQ(s.out.find("x live"), std::string::npos) << s.out;
  EXPECT_EQ(s.out.find("fragmentation ratio"), std::string::npos) << s.out;
}

// A run that checked nothing must not pass (issue 41, item 9): every command that reads a trace refuses it.
TEST_F(CliTest, AnEmptyTraceIsExitTwoNeverAPass) {
  for (const auto& [name, text] : {std::pair<std::string, std::string>{"zero.jsonl", ""},
                                   {"blank.jsonl", "\n  \n\t\r\n"},
                                   {"meta.jsonl", "{\"op\":\"meta\",\"capacity\":4194304}\n\n"}}) {
    const std::string t = write(name, text);
    for (const std::vector<std::string>& args : {std::vector<std::string>{"replay", t, "--quiet"},
                                                 {"bench", "fragmentation", t, "--quiet"},
                                                 {"snapshot", t, "--json", "-"}}) {
      CliRun r = testing::run_ferry(args);
      EXPECT_EQ(r.code, 2) << args[0] << " " << name << ": " << r.out << r.err;
      EXPECT_NE(r.err.find(t + ": the trace is empty"), std::string::npos) << args[0] << ": " << r.err;
      EXPECT_EQ(r.out.find("PASS"), std::string::npos) << r.out;
    }
  }
}

// One name per quantity (item 24): the run report's ooms_survived, not "recoveries".
TEST_F(CliTest, TheReplayReportNamesOomsSurvivedAsTheRunReportDoes) {
  CliRun r = ferry({"replay", trace("report003.jsonl"), "--json"});
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.contains("recoveries"));
  EXPECT_TRUE(j.contains("ooms_survived")) << r.out;
  CliRun s = ferry({"replay", trace("report003.jsonl")});
  EXPECT_NE(s.out.find(" survived (failed fits a reclaim turned into success)"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("fragmentation ratio"), std::string::npos) << s.out;
}

// --- ferry replay -----------------------------------------------------------------

TEST_F(CliTest, Report003PassesWithAReadableSummary) {
  CliRun r = ferry({"replay", trace("report003.jsonl"), "--capacity", "64MiB", "--profile", "h200",
                 "--seed", "1"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (const char* word : {"ops", "checks", "corrupt", "errors", "peak", "reclaim", "verdict: PASS"}) {
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

// What the binary writes to a terminal: runs it on a pseudo-terminal (stdout and
// stderr both) and returns everything it wrote, or "" when it did not exit 0.
std::string on_a_terminal(const std::vector<std::string>& args) {
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  if (pid < 0) return "";
  if (pid == 0) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;  // EIO once the child has exited and closed the terminal
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? text : "";
}

// replay, snapshot and bench fragmentation draw ferry run's progress bar on a
// terminal (item 23), and nothing with --quiet.
TEST_F(CliTest, LongCommandsDrawAProgressBarOnATerminal) {
  const std::string bin = FERRY_CLI_BINARY;
  const std::string t = trace("report003.jsonl");
  const std::vector<std::vector<std::string>> commands = {
      {bin, "replay", t},
      {bin, "snapshot", t, "--out", path("page.html")},
      {bin, "bench", "fragmentation", t},
  };
  for (const auto& command : commands) {
    const std::string text = on_a_terminal(command);
    EXPECT_NE(text.find("] "), std::string::npos) << command[1] << " drew no bar:\n" << text;
    EXPECT_NE(text.find("[##############################]"), std::string::npos) << command[1] << ":\n" << text;
    EXPECT_NE(text.find("\r\033[K"), std::string::npos) << command[1] << " left its bar on the screen";
    std::vector<std::string> quiet = command;
    quiet.push_back("--quiet");
    EXPECT_EQ(on_a_terminal(quiet).find("[#"), std::string::npos) << command[1] << " --quiet";
  }
}

}  // namespace
}  // namespace ferry::cli
