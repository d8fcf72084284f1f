// `ferry run`: options, exit codes, JSON and summary, progress lines, reports.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "cli_run.hpp"
#include "ferry/cuda_backend.hpp"

namespace ferry::cli {
namespace {

using testing::CliRun;

CliRun ferry(std::initializer_list<std::string> args) { return testing::run_ferry(args); }

std::string temp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ferry_run_cli_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

const std::string kSmall = "0.03125";

TEST(RunCli, HelpListsTheOptions) {
  const CliRun r = ferry({"run", "--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* opt : {"--profile", "--scale", "--capacity", "--integrity", "--inject", "--policy",
                          "--prefetch", "--host-exec", "--matmul", "--weights", "--seed", "--json", "--report",
                          "--devices", "--inject-device", "--links"}) {
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt;
  }
  EXPECT_NE(ferry({"--help"}).out.find("run"), std::string::npos);
}

TEST(RunCli, SummaryAndProgressLines) {
  const CliRun r = ferry({"run", "dense-stream", "--scale", kSmall});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("verdict: MATCHED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("overlap"), std::string::npos);
  EXPECT_NE(r.out.find("peak live"), std::string::npos);
  // Not a terminal: plain lines, one per tenth, ending at the total.
  EXPECT_NE(r.err.find("dense-stream: layers 36/36\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos);
  const CliRun quiet = ferry({"run", "dense-stream", "--scale", kSmall, "--quiet"});
  EXPECT_EQ(quiet.code, 0);
  EXPECT_TRUE(quiet.err.empty()) << quiet.err;
}

TEST(RunCli, JsonReport) {
  const CliRun r = ferry({"run", "moe-offload", "--scale", "0.0625", "--json", "--quiet", "--policy", "lfu"});
  EXPECT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["workload"], "moe-offload");
  EXPECT_EQ(j["matched"], true);
  EXPECT_EQ(j["cache"]["policy"], "lfu");
  for (const char* k : {"throughput", "time", "memory", "integrity", "cache"}) EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_GT(j["time"]["overlap_efficiency"].get<double>(), 0);
  EXPECT_GT(j["memory"]["peak_live_bytes"].get<double>(), 0);
  EXPECT_EQ(j["matmul"], "mix") << "auto is mix on sim";

  const std::string file = temp("report.json");
  const CliRun f = ferry({"run", "dense-stream", "--scale", kSmall, "--quiet", "--report", file});
  EXPECT_EQ(f.code, 0);
  std::ifstream in(file);
  const auto k = nlohmann::json::parse(in);
  EXPECT_EQ(k["matched"], true);
  std::filesystem::remove(file);
  const CliRun dash = ferry({"run", "dense-stream", "--scale", kSmall, "--quiet", "--report", "-"});
  EXPECT_EQ(nlohmann::json::parse(dash.out)["matched"], true);
}

TEST(RunCli, BadUsageExitsTwo) {
  EXPECT_EQ(ferry({"run"}).code, 2);
  EXPECT_EQ(ferry({"run", "sparse-stream"}).code, 2);
  EXPECT_EQ(ferry({"run", "dense-stream", "--scale", "0"}).code, 2);
  EXPECT_EQ(ferry({"run", "dense-stream", "--scale", "1.5"}).code, 2);
  EXPECT_EQ(ferry({"run", "dense-stream", "--scale", "abc"}).code, 2);
  EXPECT_EQ(ferry({"run", "dense-stream", "--capacity", "12XB"}).code, 2);
  EXPECT_EQ(ferry({"run", "dense-stream", "--integrity", "paranoid"}).code, 2);
  EXPECT_EQ(ferry({"run", "dense-stream", "--inject", "gremlins"}).code, 2);
  EXPECT_EQ(ferry({"run", "dense-stream", "--policy", "fifo"}).code, 2);
  EXPECT_EQ(ferry({"run", "dense-stream", "--prefetch", "maybe"}).code, 2);
  EXPECT_EQ(ferry({"run", "dense-stream", "--profile", "a100"}).code, 2);
  EXPECT_EQ(ferry({"run", "dense-stream", "--matmul", "cublas"}).code, 2);
  const CliRun host = ferry({"run", "dense-stream", "--host-exec"});
  EXPECT_EQ(host.code, 2);
  EXPECT_NE(host.err.find("moe-offload only"), std::string::npos);
  const CliRun missing = ferry({"run", "dense-stream", "--scale", kSmall, "--weights", "/nonexistent/w.safetensors"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("/nonexistent/w.safetensors"), std::string::npos);
  EXPECT_EQ(ferry({"run", "dense-stream", "--report", "/nonexistent/dir/r.json"}).code, 2);
}

// --devices N: a "devices" entry per device in the JSON, their counters summing
// to the totals; counts it cannot run and a fault device beyond them are refused.
TEST(RunCli, TwoDevicesReportEachDevice) {
  const CliRun r = ferry({"run", "moe-offload", "--scale", "0.0625", "--devices", "2", "--json", "--quiet",
                          "--inject", "pinned-noop", "--inject-device", "1"});
  EXPECT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["matched"], true);
  ASSERT_TRUE(j.contains("devices"));
  ASSERT_EQ(j["devices"].size(), 2u);
  std::uint64_t moved = 0, swallowed = 0, capacity = 0;
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& d = j["devices"][i];
    EXPECT_EQ(d["index"], i);
    for (const char* k : {"device", "memory", "integrity", "time", "throughput", "cache"}) {
      EXPECT_TRUE(d.contains(k)) << k;
    }
    EXPECT_GT(d["throughput"]["tokens_per_s"].get<double>(), 0);
    moved += d["integrity"]["bytes_moved"].get<std::uint64_t>();
    swallowed += d["integrity"]["swallowed_copies"].get<std::uint64_t>();
    capacity += d["memory"]["capacity_bytes"].get<std::uint64_t>();
  }
  EXPECT_EQ(moved, j["integrity"]["bytes_moved"].get<std::uint64_t>());
  EXPECT_EQ(swallowed, j["integrity"]["swallowed_copies"].get<std::uint64_t>());
  EXPECT_EQ(capacity, j["memory"]["capacity_bytes"].get<std::uint64_t>());
  EXPECT_EQ(j["links"], "0-1:nvlink");
  // A device's rate is of token-expert passes, not the run's tokens: labelled so.
  EXPECT_EQ(j["devices"][0]["throughput"]["tokens_unit"], "token-expert passes");
  EXPECT_EQ(j["devices"][1]["integrity"]["peer_direct_in"], j["devices"][1]["integrity"]["peer_copies_in"]);
  EXPECT_EQ(j["devices"][0]["integrity"]["swallowed_copies"], 0);
  EXPECT_GT(j["devices"][1]["integrity"]["swallowed_copies"].get<std::uint64_t>(), 0u);
  const CliRun moe_text = ferry({"run", "moe-offload", "--scale", "0.0625", "--devices", "2", "--quiet"});
  EXPECT_NE(moe_text.out.find(" token-expert passes/s, overlap"), std::string::npos) << moe_text.out;
  const CliRun text = ferry({"run", "dense-stream", "--scale", kSmall, "--devices", "2", "--quiet"});
  EXPECT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("device 1"), std::string::npos) << text.out;

  for (const char* n : {"0", "9", "99999999999999999999", "-1", "two"}) {
    const CliRun bad = ferry({"run", "moe-offload", "--devices", n});
    EXPECT_EQ(bad.code, 2) << n;
    EXPECT_NE(bad.err.find("1 to 8 devices"), std::string::npos) << n << ": " << bad.err;
  }
  const CliRun beyond = ferry({"run", "moe-offload", "--devices", "2", "--inject", "pinned-noop", "--inject-device", "2"});
  EXPECT_EQ(beyond.code, 2);
  EXPECT_NE(beyond.err.find("devices 0 to 1"), std::string::npos) << beyond.err;
  EXPECT_EQ(ferry({"run", "moe-offload", "--inject-device", "0"}).code, 2) << "nothing to inject";
  const CliRun staged = ferry({"run", "dense-stream", "--scale", kSmall, "--devices", "2", "--links", "none", "--json",
                               "--quiet"});
  EXPECT_EQ(staged.code, 0) << staged.err;
  const auto s = nlohmann::json::parse(staged.out);
  EXPECT_EQ(s["links"], "none");
  EXPECT_EQ(s["devices"][1]["integrity"]["peer_direct_in"], 0);
  EXPECT_EQ(s["devices"][1]["integrity"]["peer_copies_in"], 1);
  const CliRun malformed = ferry({"run", "dense-stream", "--devices", "2", "--links", "0-1"});
  EXPECT_EQ(malformed.code, 2);
  EXPECT_NE(malformed.err.find("A-B:KIND"), std::string::npos) << malformed.err;
  const CliRun unlinkable = ferry({"run", "dense-stream", "--devices", "2", "--links", "0-3:pcie", "--quiet"});
  EXPECT_EQ(unlinkable.code, 2) << "device 3 of 2";
  const CliRun dq = ferry({"run", "dequant-train", "--devices", "2"});
  EXPECT_EQ(dq.code, 2);
  EXPECT_NE(dq.err.find("one device"), std::string::npos) << dq.err;
}

TEST(RunCli, GemmMatmulsOnSim) {
  const CliRun r = ferry({"run", "moe-offload", "--scale", "0.0625", "--matmul", "gemm", "--quiet"});
  EXPECT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("matmuls: host GEMM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" fetched; "), std::string::npos) << "the cache line shows bytes fetched:\n" << r.out;
  EXPECT_NE(r.out.find("verdict: MATCHED"), std::string::npos) << r.out;
}

TEST(RunCli, CudaIsAClearNotAvailable) {
  if (make_cuda_backend({}).ok()) GTEST_SKIP() << "this machine has a CUDA device";  // runs in every build without one
  const CliRun r = ferry({"run", "dense-stream", "--backend", "cuda"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("the cuda backend is not available"), std::string::npos) << r.err;
}

// Issue 46 item 4: the main job ends with what it proved, its counts reconciled
// (every swallowed copy caught as a transfer's mismatch or a failed canary), and
// says how to see the same run fail.
TEST(RunCli, TheMainJobEndsWithWhatItProved) {
  const CliRun r = ferry({"run", "moe-offload", "--inject", "pinned-noop", "--quiet", "--report", "-"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& c = j["integrity"];
  const std::uint64_t swallowed = c["swallowed_copies"].get<std::uint64_t>();
  ASSERT_GT(swallowed, 0u) << "the main job must exercise the fault";
  EXPECT_EQ(c["mismatches"].get<std::uint64_t>() + c["canary_failures"].get<std::uint64_t>(), swallowed);
  const std::string closing = j["conclusion"].get<std::string>();
  EXPECT_NE(closing.find("swallowed " + std::to_string(swallowed) + " copies; verification caught every one"),
            std::string::npos) << closing;
  EXPECT_NE(closing.find("still matched"), std::string::npos) << closing;
  EXPECT_NE(closing.find("--integrity off"), std::string::npos) << closing;
  const CliRun text = ferry({"run", "moe-offload", "--inject", "pinned-noop", "--quiet"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_EQ(text.out.substr(text.out.rfind("verdict: MATCHED\n") + 17), closing + "\n") << "the last line";
  const CliRun off = ferry({"run", "moe-offload", "--inject", "pinned-noop", "--integrity", "off", "--quiet"});
  EXPECT_EQ(off.code, 1);
  EXPECT_NE(off.out.find("which checks nothing: 0 were caught; the output did not match"), std::string::npos)
      << off.out;
  const CliRun clean = ferry({"run", "dense-stream", "--scale", kSmall, "--quiet", "--json"});
  ASSERT_EQ(clean.code, 0) << clean.err;
  EXPECT_TRUE(nlohmann::json::parse(clean.out)["conclusion"].is_null()) << "nothing injected, nothing to conclude";
}

TEST(RunCli, FailedChecksExitOne) {
  // Report 000's fault with the guard off: the digest check catches it.
  const CliRun r = ferry({"run", "dense-stream", "--scale", kSmall, "--quiet", "--inject", "pinned-noop",
                          "--integrity", "off"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("DID NOT MATCH"), std::string::npos);
  // A pool far too small: out_of_memory is reported, not a crash.
  const CliRun oom = ferry({"run", "dense-stream", "--scale", kSmall, "--quiet", "--capacity", "64KiB"});
  EXPECT_EQ(oom.code, 1);
  EXPECT_NE(oom.out.find("out_of_memory"), std::string::npos) << oom.out;
}

// Item 5: a run that stopped says where and what it needs, and reports no performance.
TEST(RunCli, AFailedRunSaysWhereItStoppedAndReportsNoThroughput) {
  const CliRun r = ferry({"run", "dense-stream", "--capacity", "1MiB", "--quiet"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out.find("throughput"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("tokens/s"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("DID NOT MATCH"), std::string::npos) << "nothing was compared:\n" << r.out;
  EXPECT_NE(r.out.find("not compared: the run stopped in layers 1/36"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("needs       capacity >= 4.58 MiB (the schedule's planned peak live)"), std::string::npos)
      << r.out;
  const CliRun j = ferry({"run", "dense-stream", "--capacity", "1MiB", "--quiet", "--json"});
  const auto report = nlohmann::json::parse(j.out);
  EXPECT_TRUE(report["throughput"]["tokens_per_s"].is_null()) << j.out;
  EXPECT_EQ(report["completed"], false);
  EXPECT_EQ(report["stopped_at"], "layers 1/36");
  // A run that completes reports both.
  const auto ok = nlohmann::json::parse(ferry({"run", "dense-stream", "--scale", kSmall, "--json", "--quiet"}).out);
  EXPECT_GT(ok["throughput"]["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(ok["completed"], true);
  EXPECT_TRUE(ok["stopped_at"].is_null());
}

// Item 8: --report over the --weights file would truncate the input before it is read.
TEST(RunCli, AReportOverTheWeightsFileIsRefusedAndTheFileKept) {
  const std::string file = temp("keep.safetensors");
  ASSERT_EQ(ferry({"run", "dense-stream", "--scale", kSmall, "--save-weights", file}).code, 0);
  const auto size = std::filesystem::file_size(file);
  const CliRun r = ferry({"run", "dense-stream", "--scale", kSmall, "--weights", file, "--report", file});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("would overwrite the --weights file"), std::string::npos) << r.err;
  EXPECT_EQ(std::filesystem::file_size(file), size);
  const CliRun s = ferry({"run", "dense-stream", "--scale", kSmall, "--weights", file, "--save-weights", file});
  EXPECT_EQ(s.code, 2) << s.out << s.err;
  EXPECT_EQ(std::filesystem::file_size(file), size);
  std::filesystem::remove(file);
}

// Item 12: scales and slots the planner cannot honour are refused before anything runs.
TEST(RunCli, ScalesAndSlotsThatCannotBeServedAreRefusedNamingWhatWorks) {
  for (const char* s : {"0.004", "1e-14", "4.9e-324"}) {
    const CliRun r = ferry({"run", "dense-stream", "--scale", s, "--quiet"});
    EXPECT_EQ(r.code, 2) << s << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("dense-stream's smallest, 0.007812"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  for (const char* w : {"moe-offload", "dequant-train"}) {
    const CliRun r = ferry({"run", w, "--scale", "0.01", "--quiet"});
    EXPECT_EQ(r.code, 2) << w << ": " << r.err;
    EXPECT_NE(r.err.find("smallest, 0.015625"), std::string::npos) << r.err;
  }
  const CliRun smallest = ferry({"run", "dense-stream", "--scale", "0.0078125", "--quiet"});
  EXPECT_EQ(smallest.code, 0) << "the smallest scale named works:\n" << smallest.out << smallest.err;
  const CliRun slots = ferry({"run", "moe-offload", "--slots", "1", "--quiet"});
  EXPECT_EQ(slots.code, 2) << slots.out << slots.err;
  EXPECT_NE(slots.err.find("--slots 1: step "), std::string::npos) << slots.err;
  EXPECT_NE(slots.err.find("moe-offload needs --slots "), std::string::npos) << slots.err;
  EXPECT_NE(ferry({"run", "--help"}).out.find("smallest: dense-stream 0.0078125"), std::string::npos);
}

// Item 21: an option the workload does not read is refused, as --host-exec was.
TEST(RunCli, OptionsTheWorkloadDoesNotUseAreRefused) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--policy", "optimal"}, {"--slots", "4"}, {"--host-exec"}}) {
    std::vector<std::string> args{"run", "dense-stream", "--scale", kSmall, "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliRun r = testing::run_ferry(args);
    EXPECT_EQ(r.code, 2) << extra[0] << ": " << r.out << r.err;
    EXPECT_NE(r.err.find(extra[0] + " applies to moe-offload only"), std::string::npos) << r.err;
  }
  const CliRun p = ferry({"run", "dense-stream", "--scale", kSmall, "--capacity", "64MiB", "--pressure", "0.5"});
  EXPECT_EQ(p.code, 2);
  EXPECT_NE(p.err.find("--pressure"), std::string::npos) << p.err;
  const CliRun inject = ferry({"run", "dense-stream", "--inject", "gremlins"});
  EXPECT_EQ(inject.code, 2);
  EXPECT_EQ(inject.err.find("--inject: --inject"), std::string::npos) << "the prefix once:\n" << inject.err;
  const CliRun dir = ferry({"run", "dense-stream", "--weights", std::filesystem::temp_directory_path().string()});
  EXPECT_EQ(dir.code, 2);
  EXPECT_NE(dir.err.find("is a directory"), std::string::npos) << dir.err;
  EXPECT_EQ(dir.err.find("ioctl"), std::string::npos) << dir.err;
  EXPECT_NE(ferry({"run", "--help"}).out.find("in place of"), std::string::npos) << "--report - replaces the summary";
}

// Item 19: the summary says what the JSON knows.
TEST(RunCli, TheSummaryShowsBatchingInjectedMapFailuresAndWhatProbeChecks) {
  const CliRun b = ferry({"run", "dense-stream", "--scale", kSmall, "--quiet", "--inject", "batch-broken"});
  EXPECT_NE(b.out.find("batching    off"), std::string::npos) << b.out;
  const CliRun m = ferry({"run", "dense-stream", "--scale", kSmall, "--quiet", "--inject", "fail-map:2"});
  EXPECT_NE(m.out.find("fail-map:2: 0 copies silently swallowed, 1 map calls failed"), std::string::npos) << m.out;
  EXPECT_EQ(nlohmann::json::parse(ferry({"run", "dense-stream", "--scale", kSmall, "--quiet", "--json", "--inject",
                                         "fail-map:2"}).out)["integrity"]["failed_maps"],
            1);
  const CliRun p = ferry({"run", "dense-stream", "--scale", kSmall, "--quiet", "--integrity", "probe"});
  EXPECT_NE(p.out.find("(probe: only canaried transfers are checked)"), std::string::npos) << p.out;
  // The tiny profile: clamped to a small device, the run stays quick.
  const CliRun c =
      ferry({"run", "dense-stream", "--scale", kSmall, "--quiet", "--profile", "tiny", "--capacity", "99999TiB"});
  EXPECT_NE(c.err.find("warning: --capacity 97.7 PiB is more than the tiny's"), std::string::npos) << c.err;
}

TEST(RunCli, SavedWeightsRunBack) {
  const std::string file = temp("dense.safetensors");
  const CliRun save = ferry({"run", "dense-stream", "--scale", kSmall, "--save-weights", file});
  EXPECT_EQ(save.code, 0) << save.err;
  const CliRun r = ferry({"run", "dense-stream", "--scale", kSmall, "--quiet", "--weights", file, "--bank", "arena"});
  EXPECT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find(file), std::string::npos);
  // The same file at another scale does not fit: bad input, exit 2.
  const CliRun other = ferry({"run", "dense-stream", "--scale", "0.0625", "--quiet", "--weights", file});
  EXPECT_EQ(other.code, 2);
  EXPECT_NE(other.err.find("expected BF16"), std::string::npos) << other.err;
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace ferry::cli
