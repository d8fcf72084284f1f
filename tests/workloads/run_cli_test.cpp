// `ferry run`: options, exit codes, JSON and summary, progress lines, reports.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>

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
                          "--prefetch", "--host-exec", "--matmul", "--weights", "--seed", "--json", "--report"}) {
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
  EXPECT_EQ(ferry({"run", "dense-stream", "--capacity", "12MB"}).code, 2);
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

TEST(RunCli, GemmMatmulsOnSim) {
  const CliRun r = ferry({"run", "moe-offload", "--scale", "0.0625", "--matmul", "gemm", "--quiet"});
  EXPECT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("matmuls: host GEMM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verdict: MATCHED"), std::string::npos) << r.out;
}

TEST(RunCli, CudaIsAClearNotAvailable) {
  if (make_cuda_backend({}).ok()) GTEST_SKIP() << "this machine has a CUDA device";  // runs in every build without one
  const CliRun r = ferry({"run", "dense-stream", "--backend", "cuda"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("backend cuda is not available"), std::string::npos) << r.err;
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
