// ferry replay, the library function: the committed traces, the reference
// model's verdicts, and what never crashes.
#include "ferry/replay.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "backend_fixture.hpp"
#include "ferry/cuda_backend.hpp"
#include "replay/synthetic_traces.hpp"
#include "test_paths.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

std::string trace_path(const std::string& name) { return ::ferry::testing::traces_dir() + "/" + name; }

ReplayOptions with_capacity(std::uint64_t capacity) {
  ReplayOptions o;
  o.capacity = capacity;
  return o;
}

ReplayReport replay_ok(std::string_view text, const ReplayOptions& options = with_capacity(64 * kMiB)) {
  Result<ReplayReport> r = replay_trace_text(text, "test.jsonl", options);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? std::move(r).value() : ReplayReport{};
}

// Issue 24 item 1's reproducer (also fuzz/corpus/replay/issue24-check-after-failed-wait.jsonl).
constexpr std::string_view kCheckAfterAFailedWaitTrace = R"({"op":"hold","stream":1}
{"op":"alloc","id":"b","bytes":4096,"stream":1}
{"op":"fill","id":"b","stream":1,"seed":1}
{"op":"wait","stream":0,"for":1}
{"op":"alloc","id":"a","bytes":4096,"stream":0}
{"op":"fill","id":"a","stream":0,"seed":2}
{"op":"check","id":"a"}
)";

// --- the committed traces (capacities as in tests/traces/README.md) -------------

struct TraceCase {
  const char* file;
  std::uint64_t capacity;
};

// One suite, every backend: the cuda instances SKIP without a GPU.
class CommittedTrace : public ::testing::TestWithParam<std::tuple<TraceCase, std::string>> {};

TEST_P(CommittedTrace, ReplaysWithEveryCheckMatching) {
  const auto& [c, backend] = GetParam();
  if (std::string why = testing::backend_skip_reason(backend); !why.empty()) {
    GTEST_SKIP() << "backend " << backend << " unavailable: " << why;
  }
  ReplayOptions options = with_capacity(c.capacity);
  options.backend = testing::backend_spec(backend);
  options.backend.profile = "h200";
  // The sim checks races too: the replay's own orderings must leave none.
  options.backend.race_check = options.backend.kind == BackendKind::sim;
  Result<ReplayReport> r = replay_trace_file(trace_path(c.file), options);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r);
  EXPECT_EQ(r->races, 0u) << report_summary(*r);
  EXPECT_EQ(r->corrupt, 0u);
  EXPECT_EQ(r->unexpected_errors, 0u) << report_summary(*r);
  EXPECT_EQ(r->unexpected_successes, 0u);
  EXPECT_EQ(r->illegal_accesses, 0u);
  EXPECT_GT(r->checks, 0u);
  EXPECT_GT(r->ops, 0u);
  EXPECT_LE(r->peak_reserved_bytes, c.capacity);
  EXPECT_GE(r->peak_reserved_bytes, r->peak_live_bytes);
}

INSTANTIATE_TEST_SUITE_P(Traces, CommittedTrace,
                         ::testing::Combine(::testing::Values(TraceCase{"report003.jsonl", 64 * kMiB},
                                                              TraceCase{"oom-expected.jsonl", 32 * kMiB},
                                                              TraceCase{"dequant-pattern.jsonl", 128 * kMiB},
                                                              TraceCase{"mixed-random.jsonl", 128 * kMiB},
                                                              TraceCase{"decode-graph.jsonl", 64 * kMiB}),
                                            FERRY_BACKEND_NAMES),
                         [](const auto& p) {
                           std::string n = std::get<0>(p.param).file;
                           n = n.substr(0, n.find('.')) + "_" + std::get<1>(p.param);
                           for (char& ch : n) {
                             if (ch == '-') ch = '_';
                           }
                           return n;
                         });

// Report 003: the allocation on stream 2 fits only in the memory of the
// transient that a held kernel still reads. It must succeed (the pool places it
// there at once, behind an event wait that dispatches the held kernel), and the
// kernel must read the transient's bytes (the checks of out0..out2).
TEST(Report003Trace, AllocationSucceedsByReclaimingAndTheHeldKernelReadsTheRightBytes) {
  Result<ReplayReport> r = replay_trace_file(trace_path("report003.jsonl"), with_capacity(64 * kMiB));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->errors.empty()) << report_summary(*r);
  EXPECT_EQ(r->ooms, 0u);
  EXPECT_EQ(r->checks, 18u);
  EXPECT_EQ(r->corrupt, 0u);
  // The transient stayed live while the kernel was queued: live peaked above
  // resident + the allocation that displaced it.
  EXPECT_GE(r->peak_live_bytes, 60 * kMiB);
}

TEST(OomExpectedTrace, CountsTheExpectedErrorsAndSkipsTheFailedIds) {
  Result<ReplayReport> r = replay_trace_file(trace_path("oom-expected.jsonl"), with_capacity(32 * kMiB));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->errors["out_of_memory"], 2u);
  EXPECT_EQ(r->errors["invalid_argument"], 1u);
  EXPECT_EQ(r->expected_errors, 3u);
  EXPECT_EQ(r->unexpected_errors, 0u);
  EXPECT_EQ(r->skipped, 3u);  // fill d, check d, free d
  EXPECT_EQ(r->checks, 9u);
  EXPECT_GE(r->ooms, 2u);
  EXPECT_TRUE(r->passed());
}

TEST(Replay, IsDeterministicForASeed) {
  ReplayOptions o = with_capacity(64 * kMiB);
  o.backend.seed = 7;
  Result<ReplayReport> a = replay_trace_file(trace_path("report003.jsonl"), o);
  Result<ReplayReport> b = replay_trace_file(trace_path("report003.jsonl"), o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(report_json(*a), report_json(*b));
}

// --- semantics --------------------------------------------------------------------

TEST(Replay, ZeroAndHugeAllocationsAreErrorsNotCrashes) {
  ReplayReport r = replay_ok(
      R"({"op":"alloc","id":"zero","bytes":0,"stream":0}
{"op":"alloc","id":"huge","bytes":4611686018427387904,"stream":0}
{"op":"alloc","id":"max","bytes":18446744073709551615,"stream":3}
{"op":"fill","id":"zero","stream":0,"seed":1}
{"op":"check","id":"huge"}
{"op":"free","id":"max"}
{"op":"alloc","id":"ok","bytes":4096,"stream":0}
{"op":"fill","id":"ok","stream":0,"seed":1}
{"op":"check","id":"ok"}
)");
  // 0 bytes is invalid_argument, more than the capacity is out_of_memory (the
  // pool may call 2^64-1 either: rounding it up overflows).
  EXPECT_GE(r.errors["invalid_argument"], 1u);
  EXPECT_GE(r.errors["out_of_memory"], 1u);
  EXPECT_EQ(r.errors["invalid_argument"] + r.errors["out_of_memory"], 3u);
  EXPECT_EQ(r.unexpected_errors, 3u);
  EXPECT_EQ(r.skipped, 3u);
  EXPECT_EQ(r.checks, 1u);
  EXPECT_EQ(r.corrupt, 0u);
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.problems.size(), 3u);
  EXPECT_EQ(r.problems[0].line, 1u);
}

TEST(Replay, AnExpectedErrorThatDoesNotHappenFailsTheVerdict) {
  ReplayReport r = replay_ok(R"({"op":"alloc","id":"a","bytes":4096,"stream":0,"expect":"oom"})");
  EXPECT_EQ(r.unexpected_successes, 1u);
  EXPECT_EQ(r.unexpected_errors, 0u);
  EXPECT_FALSE(r.passed());
}

TEST(Replay, StaleHandleUsesAreErrorsAndCanBeExpected) {
  const char* trace = R"({"op":"alloc","id":"a","bytes":4096,"stream":0}
{"op":"free","id":"a"}
{"op":"free","id":"a"%s}
{"op":"fill","id":"a","stream":0,"seed":3%s}
{"op":"check","id":"a"%s}
)";
  auto with = [&](const char* expect) {
    char buf[512];
    std::snprintf(buf, sizeof buf, trace, expect, expect, expect);
    return std::string(buf);
  };
  ReplayReport unexpected = replay_ok(with(""));
  EXPECT_EQ(unexpected.errors["stale_handle"], 3u);
  EXPECT_EQ(unexpected.unexpected_errors, 3u);
  EXPECT_FALSE(unexpected.passed());

  ReplayReport expected = replay_ok(with(R"(,"expect":"stale_handle")"));
  EXPECT_EQ(expected.errors["stale_handle"], 3u);
  EXPECT_EQ(expected.expected_errors, 3u);
  EXPECT_TRUE(expected.passed()) << report_summary(expected);
}

TEST(Replay, ACheckOfANeverWrittenBufferComparesNothing) {
  ReplayReport r = replay_ok(R"({"op":"alloc","id":"a","bytes":4096,"stream":0}
{"op":"check","id":"a"})");
  EXPECT_EQ(r.checks, 0u);
  EXPECT_EQ(r.unwritten_checks, 1u);
  EXPECT_TRUE(r.passed());
}

TEST(Replay, ComputeOfAnUnwrittenInputLeavesTheOutputUnknown) {
  ReplayReport r = replay_ok(R"({"op":"alloc","id":"a","bytes":4096,"stream":0}
{"op":"alloc","id":"b","bytes":4096,"stream":0}
{"op":"compute","inputs":["a"],"output":"b","stream":0}
{"op":"check","id":"b"})");
  EXPECT_EQ(r.unwritten_checks, 1u);
  EXPECT_TRUE(r.passed());
}

// Producers and consumers on different streams, one of them held: the replay
// orders them as the trace does, so the bytes match and nothing times out.
TEST(Replay, CrossStreamDependenciesAreOrderedEvenWhenTheProducerIsHeld) {
  ReplayReport r = replay_ok(R"({"op":"alloc","id":"a","bytes":3000000,"stream":0}
{"op":"alloc","id":"b","bytes":1000,"stream":1}
{"op":"alloc","id":"c","bytes":5000000,"stream":2}
{"op":"hold","stream":0}
{"op":"upload","id":"a","stream":0,"seed":1}
{"op":"fill","id":"b","stream":1,"seed":2}
{"op":"compute","inputs":["a","b"],"output":"c","stream":2}
{"op":"fill","id":"a","stream":1,"seed":3}
{"op":"compute","inputs":["c","a"],"output":"b","stream":0}
{"op":"check","id":"c"}
{"op":"sync","stream":2}
{"op":"check","id":"b"}
{"op":"check","id":"a"}
{"op":"compute","inputs":["b","b"],"output":"b","stream":1}
{"op":"release","stream":0}
{"op":"check","id":"b"}
{"op":"sync"}
)");
  EXPECT_TRUE(r.errors.empty()) << report_summary(r);
  EXPECT_EQ(r.checks, 4u);
  EXPECT_EQ(r.corrupt, 0u);
  EXPECT_TRUE(r.passed()) << report_summary(r);
}

// Issue 24 item 1: the check's wait fails (its stream waits on a held one) with
// its copy still queued; the copy runs at the final synchronize, into a buffer
// that must still be there (ASan sees the use after free otherwise).
TEST(Replay, ACheckWhoseWaitFailsKeepsItsBufferUntilItsCopyRan) {
  ReplayReport r = replay_ok(kCheckAfterAFailedWaitTrace);
  EXPECT_FALSE(r.passed());
  ASSERT_EQ(r.errors.count("timeout"), 1u) << report_summary(r);
  ASSERT_FALSE(r.problems.empty());
  EXPECT_EQ(r.problems.front().line, 7u);
  EXPECT_EQ(r.problems.front().what, "timeout");
  EXPECT_EQ(r.checks, 0u);
}

TEST(Replay, SyncOfAHeldStreamDispatchesWhatItHoldsAndTheHoldStays) {
  ReplayReport r = replay_ok(R"({"op":"alloc","id":"a","bytes":100000,"stream":1}
{"op":"hold","stream":1}
{"op":"fill","id":"a","stream":1,"seed":9}
{"op":"sync","stream":1}
{"op":"check","id":"a"}
{"op":"compute","inputs":["a"],"output":"a","stream":1}
{"op":"sync","stream":1}
{"op":"check","id":"a"}
{"op":"release","stream":1})");
  EXPECT_EQ(r.checks, 2u);
  EXPECT_TRUE(r.passed()) << report_summary(r);
}

TEST(Replay, DeeplyNestedOrHugeLinesAreMalformedNotFatal) {
  const std::string deep = "{\"op\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  Result<ReplayReport> r = replay_trace_text(deep, "deep.jsonl", ReplayOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("deep.jsonl:1: "), std::string::npos);
  const std::string wide = "{\"op\":\"check\",\"id\":\"" + std::string(1 << 20, 'x') + "\"}";
  r = replay_trace_text(wide, "wide.jsonl", ReplayOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.error().message.size(), 400u) << "messages stay short";
}

TEST(Replay, HeldStreamsLeftHeldAtTheEndAreDrained) {
  ReplayReport r = replay_ok(R"({"op":"alloc","id":"a","bytes":65536,"stream":5}
{"op":"hold","stream":5}
{"op":"fill","id":"a","stream":5,"seed":1}
{"op":"free","id":"a"})");
  EXPECT_TRUE(r.passed()) << report_summary(r);
}

TEST(Replay, ReportJsonHasEverySpecKey) {
  Result<ReplayReport> r = replay_trace_file(trace_path("oom-expected.jsonl"), with_capacity(32 * kMiB));
  ASSERT_TRUE(r.ok());
  const nlohmann::json j = nlohmann::json::parse(report_json(*r));
  for (const char* key : {"ops", "checks", "corrupt", "errors", "unexpected_errors", "peak_live_bytes",
                          "peak_reserved_bytes", "ooms", "reclaims", "integrity", "skipped"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  for (const char* key : {"bytes_moved", "bytes_verified", "mismatches", "retries", "fallbacks"}) {
    EXPECT_TRUE(j["integrity"].contains(key)) << key;
  }
  EXPECT_TRUE(j["errors"].is_object());
  EXPECT_EQ(j["errors"]["out_of_memory"], 2);
  EXPECT_EQ(j["ops"], r->ops);
}

TEST(Replay, UnknownProfileOrBackendIsABadOption) {
  ReplayOptions o;
  o.backend.profile = "gtx480";
  Result<ReplayReport> r = replay_trace_text("", "t", o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("gtx480"), std::string::npos);

  // A backend is a BackendKind: an unknown name is refused where it is parsed.
  Result<BackendKind> opencl = parse_backend_kind("opencl");
  ASSERT_FALSE(opencl.ok());
  EXPECT_EQ(opencl.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(opencl.error().message.find("sim or cuda"), std::string::npos) << opencl.error().message;
}

TEST(Replay, CudaWithoutCudaIsUnsupported) {
  if (make_cuda_backend({}).ok()) GTEST_SKIP() << "this machine has a CUDA device";  // runs in every build without one
  ReplayOptions o;
  o.backend.kind = BackendKind::cuda;
  Result<ReplayReport> r = replay_trace_text("{\"op\":\"trim\"}", "t", o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::unsupported);
  EXPECT_NE(r.error().message.find("cuda"), std::string::npos);
}

TEST(Replay, MissingFileAndDirectoryAreBadInput) {
  Result<ReplayReport> r = replay_trace_file("/nonexistent/trace.jsonl", ReplayOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  r = replay_trace_file(::ferry::testing::traces_dir(), ReplayOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
}

TEST(Replay, ACapacityBelowOneGranuleIsRefusedBeforeRunning) {
  Result<ReplayReport> r = replay_trace_text("{\"op\":\"trim\"}", "t", with_capacity(4096));
  ASSERT_FALSE(r.ok());
}

// Never crash on any input: mutated copies of a real trace either replay or are
// rejected as malformed.
TEST(Replay, MutatedTracesNeverCrash) {
  std::string base;
  {
    Result<ReplayReport> probe = replay_trace_file(trace_path("report003.jsonl"), with_capacity(64 * kMiB));
    ASSERT_TRUE(probe.ok());
  }
  FILE* f = std::fopen(trace_path("report003.jsonl").c_str(), "rb");
  ASSERT_NE(f, nullptr);
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) base.append(buf, n);
  std::fclose(f);

  std::mt19937_64 rng(2024);
  const std::string alphabet = "{}[]\":,-0123456789eE.aoz \n\\\x01\xff";
  int ran = 0, rejected = 0;
  for (int i = 0; i < 200; ++i) {
    std::string t = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = rng() % t.size();
      switch (rng() % 3) {
        case 0: t[at] = alphabet[rng() % alphabet.size()]; break;
        case 1: t.erase(at, 1 + rng() % 8); break;
        default: t.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
      }
      if (t.empty()) t = "x";
    }
    Result<ReplayReport> r = replay_trace_text(t, "mutant.jsonl", with_capacity(64 * kMiB));
    if (r.ok()) {
      ++ran;
      EXPECT_EQ(r->corrupt, 0u) << t;
    } else {
      ++rejected;
      EXPECT_EQ(r.error().code, ErrorCode::invalid_argument) << r.error().message;
    }
  }
  EXPECT_GT(rejected, 0);
}

// Issue 15 item 1: gigabytes of device memory on the h200 profile, on a host
// that could not hold them. A fill is kept as its pattern and the check reads
// back in pieces, so the replay passes inside a model limit far below the
// buffer (before: the sim stored every byte, and the check copied all of it).
TEST(Replay, GigabytesOfFilledDeviceMemoryNeedNoHostBytes) {
  ReplayOptions o;  // h200, the device's whole capacity
  o.backend.sim_model_bytes_limit = 16 * kMiB;
  const ReplayReport r = replay_ok(
      "{\"op\":\"alloc\",\"id\":\"a\",\"bytes\":1073741824,\"stream\":0}\n"
      "{\"op\":\"fill\",\"id\":\"a\",\"stream\":0,\"seed\":7}\n"
      "{\"op\":\"sync\"}\n"
      "{\"op\":\"check\",\"id\":\"a\"}\n",
      o);
  EXPECT_EQ(r.checks, 1u);
  EXPECT_EQ(r.corrupt, 0u);
  EXPECT_EQ(r.unexpected_errors, 0u);
  EXPECT_TRUE(r.passed());
}

// Where the model still cannot hold the bytes (an upload is bytes, not a
// pattern), the answer is out_of_memory, said plainly; never an abort.
TEST(Replay, AnUploadTheModelCannotHoldIsOutOfMemory) {
  ReplayOptions o;
  o.backend.sim_model_bytes_limit = 16 * kMiB;
  const ReplayReport r = replay_ok(
      "{\"op\":\"alloc\",\"id\":\"a\",\"bytes\":67108864,\"stream\":0}\n"
      "{\"op\":\"upload\",\"id\":\"a\",\"stream\":0,\"seed\":3}\n"
      "{\"op\":\"alloc\",\"id\":\"b\",\"bytes\":4096,\"stream\":1}\n"
      "{\"op\":\"fill\",\"id\":\"b\",\"stream\":1,\"seed\":4}\n"
      "{\"op\":\"check\",\"id\":\"b\"}\n",
      o);
  EXPECT_FALSE(r.passed());
  std::string problems;
  for (const ReplayProblem& p : r.problems) problems += p.what + ": " + p.message + "\n";
  ASSERT_EQ(r.errors.count("out_of_memory"), 1u) << problems;
  EXPECT_EQ(r.unexpected_errors, 1u);
  ASSERT_FALSE(r.problems.empty());
  EXPECT_NE(r.problems[0].message.find("host memory for the simulated device's bytes is exhausted"),
            std::string::npos)
      << r.problems[0].message;
  EXPECT_EQ(r.checks, 1u) << "the other stream goes on";
  EXPECT_EQ(r.corrupt, 0u);
}

// The process's resident bytes now (VmRSS), 0 where /proc cannot say.
std::uint64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// Issue 15 item 17, the soak (FERRY_LONG_TESTS=1): 10^6 random ops on three
// streams replay with every check passing, and the replay's memory stays flat —
// the last 90 % of the ops add almost nothing to what the first 10 % left.
// Its time per op, at 10^5 and 10^6 ops: BM_ReplaySoak (docs/performance.md).
TEST(ReplaySoak, AMillionRandomOpsReplayWithFlatMemory) {
  if (std::getenv("FERRY_LONG_TESTS") == nullptr) GTEST_SKIP() << "set FERRY_LONG_TESTS=1";
  constexpr std::size_t kOps = 1'000'000;
#if defined(__SANITIZE_ADDRESS__)
  constexpr std::uint64_t kAllocatorSlack = 320 * kMiB;  // ASan's quarantine fills as the run goes
#else
  constexpr std::uint64_t kAllocatorSlack = 0;
#endif
  const std::string trace = synthetic::soak_trace(kOps, 17);
  ReplayOptions o = with_capacity(64 * kMiB);
  std::uint64_t at_tenth = 0, highest = 0;
  o.on_step = [&](const ReplayStep& step) {
    if (step.index == 0 || step.index > step.total || step.index % 50'000 != 0) return;
    const std::uint64_t rss = resident_bytes();
    if (step.index == kOps / 10) at_tenth = rss;
    if (step.index > kOps / 10) highest = std::max(highest, rss);
  };
  const ReplayReport r = replay_ok(trace, o);
  EXPECT_EQ(r.ops, kOps);
  EXPECT_TRUE(r.passed());
  EXPECT_EQ(r.corrupt, 0u);
  EXPECT_GT(r.checks, kOps / 20);
  ASSERT_GT(at_tenth, 0u) << "no VmRSS in /proc/self/status";
  EXPECT_LE(highest, at_tenth + 32 * kMiB + kAllocatorSlack)
      << "resident " << at_tenth / kMiB << " MiB after 10^5 ops, up to " << highest / kMiB << " MiB later";
}

}  // namespace
}  // namespace ferry
