// `ferry doctor` (issue 3, item 8): the device, its capabilities, and report
// 000's churn probe with a verdict — healthy on a clean sim, failing with the
// pinned-noop fault.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cli_run.hpp"
#include "ferry/cuda_backend.hpp"

namespace ferry::cli::testing {
namespace {

nlohmann::json parse_one_object(const CliRun& r) {
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_TRUE(j.is_object()) << "stdout is not one JSON object:\n" << r.out << r.err;
  return j.is_object() ? j : nlohmann::json::object();
}

bool cuda_device_here() { return make_cuda_backend({}).ok(); }

TEST(Doctor, HealthyOnACleanSim) {
  CliRun r = run_ferry({"doctor", "--backend", "sim"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (const char* word : {"sim h200", "memory", "granularity", "virtual memory", "batched copy",
                           "probe passed", "host register", "pinned arena", "budget", "chunks",
                           "churn probe", "verdict: healthy"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word << " missing from\n" << r.out;
  }
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(Doctor, ReportsSilentCopyFailuresUnderPinnedNoop) {
  CliRun r = run_ferry({"doctor", "--inject", "pinned-noop"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("injecting pinned-noop"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verdict: FAILING"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("report 000"), std::string::npos) << r.out;
}

TEST(Doctor, JsonIsOneObjectWithEveryPart) {
  CliRun r = run_ferry({"doctor", "--json", "--profile", "rtx4090", "--seed", "7"});
  EXPECT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = parse_one_object(r);
  EXPECT_EQ(j["backend"], "sim");
  EXPECT_EQ(j["device"], "rtx4090");
  EXPECT_EQ(j["seed"], 7);
  EXPECT_EQ(j["faults"], "none");
  EXPECT_GT(j["capacity"].get<std::uint64_t>(), 0u);
  EXPECT_GT(j["granularity"].get<std::uint64_t>(), 0u);
  const nlohmann::json& caps = j["capabilities"];
  for (const char* key : {"virtual_memory", "batched_copy", "batching_enabled", "host_register"}) {
    EXPECT_TRUE(caps.contains(key) && caps[key].is_boolean()) << key;
  }
  EXPECT_EQ(caps["batched_copy_probe"]["passed"], true);
  EXPECT_GT(j["arena"]["budget_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_GT(j["arena"]["chunk_bytes"].get<std::uint64_t>(), 0u);
  const nlohmann::json& probe = j["churn_probe"];
  EXPECT_EQ(probe["failures"], 0);
  EXPECT_GT(probe["copies"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(probe["arrived"].size(), probe["copies"].get<std::size_t>());
  EXPECT_EQ(j["healthy"], true);
  EXPECT_EQ(j["verdict"].get<std::string>().rfind("healthy", 0), 0u) << j["verdict"];
}

TEST(Doctor, JsonUnderPinnedNoopSaysUnhealthy) {
  CliRun r = run_ferry({"doctor", "--json", "--inject", "pinned-noop:1"});
  EXPECT_EQ(r.code, 1) << r.err;
  const nlohmann::json j = parse_one_object(r);
  EXPECT_EQ(j["healthy"], false);
  EXPECT_EQ(j["faults"], "pinned-noop");
  EXPECT_GT(j["churn_probe"]["failures"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(j["verdict"].get<std::string>().rfind("FAILING", 0), 0u) << j["verdict"];
  // ferry's own verified path still delivers the bytes.
  EXPECT_EQ(j["verified_upload"]["arrived"], true);
}

TEST(Doctor, BatchBrokenShowsTheProbeDisablingBatching) {
  CliRun r = run_ferry({"doctor", "--json", "--inject", "batch-broken"});
  EXPECT_EQ(r.code, 0) << r.err;  // the guard works: nothing is silently lost
  const nlohmann::json j = parse_one_object(r);
  EXPECT_EQ(j["capabilities"]["batched_copy"], true);
  EXPECT_EQ(j["capabilities"]["batched_copy_probe"]["ran"], true);
  EXPECT_EQ(j["capabilities"]["batched_copy_probe"]["passed"], false);
  EXPECT_EQ(j["capabilities"]["batching_enabled"], false);
}

// Runs in every build on a machine without a GPU (with or without the backend built).
TEST(Doctor, CudaWhereThereIsNoneExitsTwoWithAPlainMessage) {
  if (cuda_device_here()) GTEST_SKIP() << "this machine has a CUDA device";
  CliRun r = run_ferry({"doctor", "--backend", "cuda"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("cuda backend is not available"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("insufficient"), std::string::npos) << r.err;  // not "upgrade your driver"
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// Without --backend the doctor checks the GPU where there is one, and always says
// which backend it checked and why.
TEST(Doctor, WithoutABackendChecksTheGpuIfAnyAndSaysWhich) {
  CliRun r = run_ferry({"doctor"});
  const bool gpu = cuda_device_here();
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  const std::string expected = gpu ? "backend        cuda (the default: this machine has a CUDA device)"
                                   : "backend        sim (the default: no usable CUDA here: ";
  EXPECT_NE(r.out.find(expected), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(gpu ? "device         cuda " : "device         sim h200"), std::string::npos) << r.out;

  CliRun j = run_ferry({"doctor", "--json"});
  const nlohmann::json o = parse_one_object(j);
  EXPECT_EQ(o["backend"], gpu ? "cuda" : "sim");
  EXPECT_NE(o["backend_choice"].get<std::string>().find("the default"), std::string::npos) << o["backend_choice"];

  CliRun asked = run_ferry({"doctor", "--backend", "sim", "--json"});
  EXPECT_EQ(parse_one_object(asked)["backend_choice"], "--backend sim");
  CliRun injected = run_ferry({"doctor", "--json", "--inject", "batch-broken"});
  EXPECT_EQ(parse_one_object(injected)["backend"], "sim");
}

TEST(Doctor, BadUsageExitsTwo) {
  const std::vector<std::vector<std::string>> bad = {
      {"--inject", "bogus"},         {"--inject", "pinned-noop:1.5"}, {"--profile", "gtx480"},
      {"--backend", "opencl"},       {"--seed", "-1"},                 {"--frobnicate"},
      {"--backend", "cuda", "--inject", "pinned-noop"},
  };
  for (const auto& opts : bad) {
    std::vector<std::string> args{"doctor"};
    args.insert(args.end(), opts.begin(), opts.end());
    CliRun r = run_ferry(args);
    std::string shown;
    for (const auto& o : opts) shown += o + " ";
    EXPECT_EQ(r.code, 2) << shown << "\n" << r.err;
    EXPECT_FALSE(r.err.empty()) << shown;
  }
}

TEST(Doctor, HelpIsListedAndDescribesTheOptions) {
  CliRun top = run_ferry({"--help"});
  EXPECT_NE(top.out.find("doctor"), std::string::npos) << top.out;
  CliRun r = run_ferry({"doctor", "--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* opt : {"--backend", "--profile", "--seed", "--inject", "--json", "Exit status"}) {
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt << " missing from\n" << r.out;
  }
}

int exit_status(const std::string& command) {
  const int raw = std::system((command + " >/dev/null 2>&1").c_str());
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

TEST(Doctor, TheBinaryExitsWithTheDocumentedCodes) {
  const std::string bin = FERRY_CLI_BINARY;
  EXPECT_EQ(exit_status(bin + " doctor --backend sim"), 0);
  EXPECT_EQ(exit_status(bin + " doctor --inject pinned-noop"), 1);
  EXPECT_EQ(exit_status(bin + " doctor --inject nonsense"), 2);
}

}  // namespace
}  // namespace ferry::cli::testing
