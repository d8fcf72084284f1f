// `ferry replay --integrity … --inject …` (issue 3, items 7 and 9): the sim's
// fault models bite when nothing guards the uploads, and the transfer engine's
// policies catch them. Every run replays report003.jsonl at its capacity
// (tests/traces/README.md): three 12 MiB uploads on a held stream, 18 checks.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "cli_run.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/replay.hpp"
#include "test_paths.hpp"

namespace ferry::cli::testing {
namespace {

constexpr std::uint64_t kReport003UploadBytes = 3 * (std::uint64_t{12} << 20);

std::string trace(const std::string& name) { return ::ferry::testing::traces_dir() + "/" + name; }

struct JsonRun {
  int code = -1;
  nlohmann::json report;
  std::string err;
};

// Replays report003 with `options` and --json; the report must parse.
JsonRun replay_report003(const std::vector<std::string>& options) {
  std::vector<std::string> args{"replay", trace("report003.jsonl"), "--capacity", "64MiB", "--json"};
  args.insert(args.end(), options.begin(), options.end());
  CliRun r = run_ferry(args);
  JsonRun j;
  j.code = r.code;
  j.err = r.err;
  j.report = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_TRUE(j.report.is_object()) << "stdout is not one JSON object:\n" << r.out << r.err;
  if (!j.report.is_object()) j.report = nlohmann::json::object();
  return j;
}

std::uint64_t u64(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number_unsigned() ? j[key].get<std::uint64_t>() : 0;
}

TEST(ReplayIntegrity, CleanRunVerifiesEveryUploadedByte) {
  JsonRun r = replay_report003({});
  EXPECT_EQ(r.code, 0) << r.report.dump(2);
  const nlohmann::json& in = r.report["integrity"];
  EXPECT_EQ(in["policy"], "verify");
  EXPECT_EQ(r.report["faults"], "none");
  EXPECT_EQ(u64(in, "bytes_verified"), kReport003UploadBytes);
  EXPECT_EQ(u64(in, "bytes_moved"), kReport003UploadBytes);
  EXPECT_EQ(u64(in, "mismatches"), 0u);
  EXPECT_EQ(u64(in, "retries"), 0u);
  EXPECT_EQ(u64(in, "fallbacks"), 0u);
  EXPECT_EQ(in["batched_disabled"], false);
  EXPECT_EQ(in["batch_probe"], "passed");
}

// Report 000's fault with no guard: the uploads silently do nothing and the
// checks of what the kernels computed from them come back corrupt.
TEST(ReplayIntegrity, PinnedNoopBitesWithIntegrityOff) {
  JsonRun r = replay_report003({"--inject", "pinned-noop:1", "--integrity", "off"});
  EXPECT_EQ(r.code, 1);
  EXPECT_GT(u64(r.report, "corrupt"), 0u) << r.report.dump(2);
  EXPECT_EQ(r.report["verdict"], "fail");
  EXPECT_EQ(r.report["faults"], "pinned-noop");
  const nlohmann::json& in = r.report["integrity"];
  EXPECT_EQ(in["policy"], "off");
  EXPECT_EQ(u64(in, "mismatches"), 0u) << "off checks nothing";
  EXPECT_EQ(u64(in, "bytes_verified"), 0u);
  EXPECT_TRUE(r.report["errors"].empty()) << "the copies reported success";
}

// verify catches every silent no-op and recovers each range through another
// path: no corrupt check, no corrupt transfer. Same trace, same seed as above.
class VerifyRecovers : public ::testing::TestWithParam<const char*> {};

TEST_P(VerifyRecovers, ZeroCorruptAndEveryMismatchRecovered) {
  JsonRun r = replay_report003({"--inject", GetParam(), "--integrity", "verify"});
  EXPECT_EQ(r.code, 0) << r.report.dump(2);
  EXPECT_EQ(u64(r.report, "corrupt"), 0u);
  EXPECT_EQ(u64(r.report, "checks"), 18u);
  EXPECT_FALSE(r.report["errors"].contains("transfer_corrupt"));
  const nlohmann::json& in = r.report["integrity"];
  EXPECT_GT(u64(in, "mismatches"), 0u) << "the fault must bite for this test to mean anything";
  // Every mismatched copy was re-issued (none ran out of attempts), each failed
  // range verified in the end, and every uploaded byte was verified once.
  EXPECT_EQ(u64(in, "retries"), u64(in, "mismatches"));
  EXPECT_GE(u64(in, "recovered"), 1u);
  EXPECT_LE(u64(in, "recovered"), u64(in, "mismatches"));
  EXPECT_EQ(u64(in, "corrupt"), 0u);
  EXPECT_GE(u64(in, "fallbacks"), 1u);
  EXPECT_GE(u64(in, "units_retired"), 1u);
  EXPECT_EQ(u64(in, "bytes_verified"), kReport003UploadBytes);
  EXPECT_GT(u64(in, "bytes_moved"), kReport003UploadBytes) << "retries move bytes again";
}

INSTANTIATE_TEST_SUITE_P(PinnedNoop, VerifyRecovers, ::testing::Values("pinned-noop:1", "pinned-noop:0.3"),
                         [](const auto& p) {
                           return std::string(p.param) == "pinned-noop:1" ? "always" : "p0_3";
                         });

// The batched copy's start-up probe is a capability check that runs whatever
// the policy: with batch-broken it disables batching, so nothing is lost.
TEST(ReplayIntegrity, BatchBrokenIsDisabledByTheStartUpProbeUnderEveryPolicy) {
  for (const char* policy : {"off", "probe", "verify"}) {
    SCOPED_TRACE(policy);
    JsonRun r = replay_report003({"--inject", "batch-broken", "--integrity", policy});
    EXPECT_EQ(r.code, 0) << r.report.dump(2);
    EXPECT_EQ(u64(r.report, "corrupt"), 0u);
    EXPECT_EQ(u64(r.report, "checks"), 18u);
    const nlohmann::json& in = r.report["integrity"];
    EXPECT_EQ(in["policy"], policy);
    EXPECT_EQ(in["batched_disabled"], true);
    EXPECT_EQ(in["batch_probe"], "failed");
    EXPECT_NE(in["batching_note"].get<std::string>().find("start-up probe failed"), std::string::npos)
        << in["batching_note"];
    EXPECT_EQ(u64(in, "mismatches"), 0u);
  }
}

TEST(ReplayIntegrity, InjectIsRepeatableAndCommaSeparatedAndMayPrecedeTheFile) {
  CliRun a = run_ferry({"replay", "--inject", "pinned-noop:1", "--inject", "batch-broken",
                        trace("oom-expected.jsonl"), "--capacity", "32MiB", "--json"});
  CliRun b = run_ferry({"replay", trace("oom-expected.jsonl"), "--capacity", "32MiB", "--json",
                        "--inject", "pinned-noop:1,batch-broken"});
  for (const CliRun* r : {&a, &b}) {
    EXPECT_EQ(r->code, 0) << r->out << r->err;
    const nlohmann::json j = nlohmann::json::parse(r->out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->out << r->err;
    EXPECT_EQ(j["faults"], "pinned-noop,batch-broken");
    EXPECT_EQ(j["integrity"]["batched_disabled"], true);
  }
}

TEST(ReplayIntegrity, BadInjectOrIntegrityIsBadUsageBeforeAnythingRuns) {
  const std::string t = trace("report003.jsonl");
  struct Case {
    std::vector<std::string> options;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{"--inject", "pinned-noop:2"}, "outside [0, 1]"},
      {{"--inject", "bogus"}, "unknown fault 'bogus'"},
      {{"--inject", "pinned-noop,fail-map:0"}, "fail-map"},
      {{"--inject"}, "--inject"},
      {{"--integrity", "paranoid"}, "--integrity"},
      {{"--backend", "cuda", "--inject", "pinned-noop"}, "needs the sim backend"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args{"replay", t};
    args.insert(args.end(), c.options.begin(), c.options.end());
    CliRun r = run_ferry(args);
    std::string shown;
    for (const std::string& o : c.options) shown += o + " ";
    EXPECT_EQ(r.code, 2) << shown << "\n" << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << shown << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << shown << ": nothing may run:\n" << r.out;
  }
}

// The library refuses faults outside the sim too, whatever the CLI checks.
TEST(ReplayIntegrity, TheLibraryRefusesFaultsOnAnotherBackend) {
  ReplayOptions o;
  o.backend.kind = BackendKind::cuda;
  o.backend.faults = *parse_fault_spec("pinned-noop:0.5");
  Result<ReplayReport> r = replay_trace_text("{\"op\":\"trim\"}", "t.jsonl", o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("pinned-noop:0.5"), std::string::npos) << r.error().message;
}

TEST(ReplayIntegrity, HelpNamesTheNewOptions) {
  CliRun r = run_ferry({"replay", "--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* word : {"--integrity", "off,probe,verify", "=verify", "--inject", "pinned-noop[:P]",
                           "batch-broken"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word << " missing from\n" << r.out;
  }
}

TEST(ReplayIntegrity, SummaryShowsTheFaultAndTheCounters) {
  CliRun r = run_ferry({"replay", trace("report003.jsonl"), "--capacity", "64MiB", "--inject",
                        "pinned-noop:1"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (const char* word : {"injecting pinned-noop", "integrity      verify", "mismatches caught", "recovered",
                           "verdict: PASS"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word << " missing from\n" << r.out;
  }
}

}  // namespace
}  // namespace ferry::cli::testing
