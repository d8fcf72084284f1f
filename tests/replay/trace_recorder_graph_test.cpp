// The trace recorder and graph capture (trace_recorder.hpp, graph.hpp): a
// program that captures a decode step, launches it and destroys it is written
// as the `capture` and `replay` lines it made (not as the launches' unrolled
// ops), and the trace replays to the program's bytes and pool figures; a
// refused capture is written as the refusals the replay meets again.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/graph.hpp"
#include "ferry/replay.hpp"
#include "ferry/runtime.hpp"
#include "ferry/trace_recorder.hpp"
#include "ferry/transfer_engine.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kCapacity = std::uint64_t{64} << 20;

using testing::mix_bytes;
using testing::pattern;

std::vector<nlohmann::json> lines_of(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<std::string> ops_of(const std::vector<nlohmann::json>& lines) {
  std::vector<std::string> out;
  for (const auto& l : lines) {
    std::string op = l.at("op");
    if (op == "capture") op += " " + l.at("phase").get<std::string>();
    out.push_back(std::move(op));
  }
  return out;
}

// A sim Runtime at kCapacity with a recorder in its slot, writing to `trace`.
struct Recorded {
  std::ostringstream trace;
  std::unique_ptr<Runtime> rt;
  std::shared_ptr<RecordingPool> rec;
  std::shared_ptr<PoolCalls> calls;

  explicit Recorded(IntegrityPolicy integrity = IntegrityPolicy::verify) {
    RuntimeOptions o;
    o.backend.profile = "h200";
    o.pool.capacity = kCapacity;
    o.engine.policy = integrity;
    auto made = Runtime::create(o);
    EXPECT_TRUE(made.ok()) << made.error().message;
    if (!made.ok()) return;
    rt = std::move(made).value();
    rt->pool().reset_peak_stats();  // the engine's start-up probe is not the program's
    rec = std::make_shared<RecordingPool>(rt->direct_calls(), trace);
    rt->set_pool_adaptor(rec);
    calls = rt->calls();
  }
  ~Recorded() {
    calls.reset();
    if (rt) rt->set_pool_adaptor(nullptr);
  }
  DeviceHandle alloc(std::uint64_t bytes, StreamId stream, std::string_view tag) {
    auto h = calls->allocate(bytes, stream, tag);
    EXPECT_TRUE(h.ok()) << h.error().message;
    return h.ok() ? *h : DeviceHandle{};
  }
  std::vector<std::byte> download(DeviceHandle h, std::uint64_t bytes, StreamId stream) {
    std::vector<std::byte> out(bytes);
    auto r = calls->download(stream, h, 0, out);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return out;
  }
};

Result<ReplayReport> replay_of(const std::string& trace, IntegrityPolicy integrity = IntegrityPolicy::verify) {
  ReplayOptions o;
  o.integrity = integrity;
  o.backend.profile = "h200";
  o.backend.race_check = true;
  return replay_trace_text(trace, "recorded.jsonl", o);
}

// A decode step captured once and launched four times: the weights and the KV
// cache are the program's, the activations the graph's private pool's (one freed
// inside the capture, so the pool reuses it). The program's own kernel appends
// to the KV cache, which no compute reads, so the bytes of the logits are the
// content definitions' in the program and in the replay alike.
TEST(TraceRecorderGraph, ACapturedDecodeStepIsWrittenAsCaptureAndReplayLinesAndReplaysToTheSameBytes) {
  constexpr std::uint64_t kW = 256 * kKiB, kAct = 64 * kKiB, kLogits = 16 * kKiB;
  Recorded p;
  ASSERT_TRUE(p.rt);
  const DeviceHandle w = p.alloc(kW, 0, "w");
  ASSERT_TRUE(p.calls->fill(0, w, 7).ok());
  const DeviceHandle kv = p.alloc(kAct, 0, "kv");
  ASSERT_TRUE(p.calls->fill(0, kv, 9).ok());
  const DeviceHandle logits = p.alloc(kLogits, 1, "logits");
  ASSERT_TRUE(p.calls->wait(1, 0).ok());

  ASSERT_TRUE(p.rt->begin_capture(1).ok());
  const DeviceHandle act = p.alloc(kAct, 1, "act");
  const DeviceHandle w_in[] = {w};
  ASSERT_TRUE(p.calls->compute(1, w_in, act).ok());
  const DeviceHandle tmp = p.alloc(kAct, 1, "tmp");
  const DeviceHandle act_in[] = {act};
  ASSERT_TRUE(p.calls->compute(1, act_in, tmp).ok());
  ASSERT_TRUE(p.calls->free(tmp).ok());  // the pool's again: the next one of its size reuses it
  const DeviceHandle tmp2 = p.alloc(kAct, 1, "tmp");
  ASSERT_TRUE(p.calls->compute(1, act_in, tmp2).ok());
  const Operand append[] = {{kv, Access::read_write}, {tmp2, Access::read}};
  const auto add_one = [](const KernelLaunch& l) -> Result<void> {
    for (std::byte& b : l.args[0].out) b = static_cast<std::byte>(static_cast<unsigned>(b) + 1);
    return {};
  };
  ASSERT_TRUE(p.calls->user(1, append, add_one, {}, "kv-append").ok());
  const DeviceHandle last[] = {tmp2, w};
  ASSERT_TRUE(p.calls->compute(1, last, logits).ok());
  ASSERT_TRUE(p.calls->free(tmp2).ok());
  std::vector<std::byte> in_graph(kLogits);
  ASSERT_TRUE(p.calls->copy_to_host(1, logits, in_graph).ok());  // recorded there: a check naming its stream
  Result<Graph> graph = p.rt->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;

  const std::vector<std::byte> act_bytes = mix_bytes({pattern(7, kW)}, kAct);
  const std::vector<std::byte> tmp_bytes = mix_bytes({act_bytes}, kAct);
  const std::vector<std::byte> want = mix_bytes({tmp_bytes, pattern(7, kW)}, kLogits);
  for (int step = 0; step < 4; ++step) {
    ASSERT_TRUE(p.rt->launch(*graph, 1).ok());
    EXPECT_EQ(p.download(logits, kLogits, 1), want) << "step " << step;
  }
  ASSERT_TRUE(graph->destroy().ok());
  ASSERT_TRUE(p.calls->free(act).ok());
  for (DeviceHandle h : {w, kv, logits}) ASSERT_TRUE(p.calls->free(h).ok());
  ASSERT_TRUE(p.calls->synchronize().ok());
  const PoolStats live = p.rt->pool().stats();
  ASSERT_TRUE(p.rec->flush().ok());

  const std::string trace = p.trace.str();
  const std::vector<nlohmann::json> lines = lines_of(trace);
  const std::vector<std::string> want_ops = {
      "meta",  "alloc", "fill",  "alloc",   "fill",  "alloc", "wait",          "capture begin",
      "alloc", "compute", "alloc", "compute", "free", "alloc", "compute", "user", "compute", "free", "check",
      "capture end",
      "replay", "check", "replay", "check", "replay", "check", "replay", "check", "capture destroy",
      "free",  "free",  "free",  "free",    "sync"};
  EXPECT_EQ(ops_of(lines), want_ops) << trace;
  EXPECT_EQ(lines.at(7), nlohmann::json::parse(R"({"op":"capture","phase":"begin","graph":"g1","stream":1})"));
  EXPECT_EQ(lines.at(18), nlohmann::json::parse(R"({"op":"check","id":"logits#3","stream":1})"));
  EXPECT_EQ(lines.at(19), nlohmann::json::parse(R"({"op":"capture","phase":"end","graph":"g1","stream":1})"));
  EXPECT_EQ(lines.at(20), nlohmann::json::parse(R"({"op":"replay","graph":"g1","stream":1})"));
  EXPECT_EQ(lines.at(28), nlohmann::json::parse(R"({"op":"capture","phase":"destroy","graph":"g1"})"));
  EXPECT_EQ(lines.at(15).at("tag"), "kv-append");
  EXPECT_EQ(lines.at(16), nlohmann::json::parse(
                              R"({"op":"compute","inputs":["tmp#6","w#1"],"output":"logits#3","stream":1})"));
  EXPECT_EQ(p.rec->stats().unrecorded, 0u);
  EXPECT_EQ(in_graph, want) << "the graph's own copy to the host, at its last launch";
  EXPECT_EQ(p.rec->stats().failed_calls, 0u);

  Result<ReplayReport> r = replay_of(trace);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r) << "\n" << trace;
  EXPECT_EQ(r->checks, 5u) << "every launch's logits compared with the content definitions, as the program did, "
                              "and the graph's own copy of its last launch at the final sync";
  EXPECT_EQ(r->corrupt, 0u);
  EXPECT_EQ(r->races, 0u);
  EXPECT_EQ(r->peak_live_bytes, live.peak_requested_bytes);
  EXPECT_EQ(r->peak_allocated_bytes, live.peak_allocated_bytes);
  EXPECT_EQ(r->peak_reserved_bytes, live.peak_reserved_bytes);
}

// A capture sharing another graph's private pool names that graph, so the
// replay's capture shares it too: the second graph's block is the first's.
TEST(TraceRecorderGraph, ACaptureSharingAPoolNamesTheGraphWhosePoolItShares) {
  constexpr std::uint64_t n = 64 * kKiB;
  Recorded p;
  ASSERT_TRUE(p.rt);
  ASSERT_TRUE(p.rt->begin_capture(2).ok());
  const DeviceHandle a = p.alloc(n, 2, "a");
  ASSERT_TRUE(p.calls->fill(2, a, 1).ok());
  ASSERT_TRUE(p.calls->free(a).ok());
  Result<Graph> first = p.rt->end_capture(2);
  ASSERT_TRUE(first.ok()) << first.error().message;
  CaptureOptions shared;
  shared.pool = first->pool();
  ASSERT_TRUE(p.rt->begin_capture(2, shared).ok());
  const DeviceHandle b = p.alloc(n, 2, "b");
  ASSERT_TRUE(p.calls->fill(2, b, 2).ok());
  Result<Graph> second = p.rt->end_capture(2);
  ASSERT_TRUE(second.ok()) << second.error().message;
  ASSERT_TRUE(p.rt->launch(*first, 2).ok());
  ASSERT_TRUE(p.rt->launch(*second, 2).ok());
  EXPECT_EQ(p.download(b, n, 2), pattern(2, n));
  ASSERT_TRUE(second->destroy().ok());
  ASSERT_TRUE(first->destroy().ok());
  ASSERT_TRUE(p.calls->free(b).ok());
  ASSERT_TRUE(p.calls->synchronize().ok());
  const PoolStats live = p.rt->pool().stats();
  ASSERT_TRUE(p.rec->flush().ok());

  const std::string trace = p.trace.str();
  const std::vector<nlohmann::json> lines = lines_of(trace);
  ASSERT_EQ(ops_of(lines), (std::vector<std::string>{"meta", "capture begin", "alloc", "fill", "free", "capture end",
                                                     "capture begin", "alloc", "fill", "capture end", "replay",
                                                     "replay", "check", "capture destroy", "capture destroy", "free",
                                                     "sync"}))
      << trace;
  EXPECT_EQ(lines.at(6), nlohmann::json::parse(
                             R"({"op":"capture","phase":"begin","graph":"g2","stream":2,"pool":"g1"})"));
  Result<ReplayReport> r = replay_of(trace);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r) << "\n" << trace;
  EXPECT_EQ(r->checks, 1u);
  EXPECT_EQ(live.peak_requested_bytes, n) << "the second capture reused the first's block";
  EXPECT_EQ(r->peak_live_bytes, live.peak_requested_bytes);
  EXPECT_EQ(r->peak_reserved_bytes, live.peak_reserved_bytes);
}

// A capture the Runtime refused (a host wait in it) makes no graph: the trace
// holds the refusals the replay's capture meets again (a download, which the
// format cannot write in a capture, as its stream's sync) and no replay line.
TEST(TraceRecorderGraph, ARefusedCaptureIsWrittenAsTheRefusalsTheReplayMeetsAgain) {
  constexpr std::uint64_t n = 64 * kKiB;
  Recorded p;
  ASSERT_TRUE(p.rt);
  ASSERT_TRUE(p.rt->begin_capture(2).ok());
  const DeviceHandle scratch = p.alloc(n, 2, "scratch");
  ASSERT_TRUE(p.calls->fill(2, scratch, 3).ok());
  std::vector<std::byte> host(n);
  Result<TransferReceipt> down = p.calls->download(2, scratch, 0, host);
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.error().code, ErrorCode::invalid_argument);
  Result<void> sync = p.calls->synchronize(2);
  ASSERT_FALSE(sync.ok());
  Result<Graph> spoiled = p.rt->end_capture(2);
  ASSERT_FALSE(spoiled.ok());
  EXPECT_EQ(spoiled.error().code, ErrorCode::invalid_argument);
  ASSERT_TRUE(p.calls->free(scratch).ok());
  Graph empty;
  EXPECT_FALSE(p.rt->launch(empty, 2).ok());  // no graph to name: not written
  ASSERT_TRUE(p.calls->synchronize().ok());
  ASSERT_TRUE(p.rec->flush().ok());

  const std::string trace = p.trace.str();
  const std::vector<nlohmann::json> lines = lines_of(trace);
  ASSERT_EQ(ops_of(lines), (std::vector<std::string>{"meta", "capture begin", "alloc", "fill", "sync", "sync",
                                                     "capture end", "free", "sync"}))
      << trace;
  EXPECT_EQ(lines.at(4), nlohmann::json::parse(R"({"op":"sync","stream":2,"expect":"invalid_argument"})"));
  EXPECT_EQ(lines.at(5), lines.at(4));
  EXPECT_EQ(lines.at(6), nlohmann::json::parse(
                             R"({"op":"capture","phase":"end","graph":"g1","stream":2,"expect":"invalid_argument"})"));
  EXPECT_EQ(p.rec->stats().unrecorded, 1u) << "the empty graph's launch";
  Result<ReplayReport> r = replay_of(trace);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r) << "\n" << trace;
  EXPECT_EQ(r->expected_errors, 3u);
  EXPECT_EQ(r->unexpected_errors, 0u);
  EXPECT_EQ(r->unexpected_successes, 0u);
}

// A device copy in a capture (integrity off: no host compare) is written as a
// `copy` line there, and the replay's launches copy the bytes the reference
// follows; under verify the capture refuses it, written as its stream's sync.
TEST(TraceRecorderGraph, ACapturedDeviceCopyIsWrittenAsACopyLineAndReplaysItsBytes) {
  constexpr std::uint64_t n = 64 * kKiB;
  for (const IntegrityPolicy policy : {IntegrityPolicy::off, IntegrityPolicy::verify}) {
    SCOPED_TRACE(std::string(to_string(policy)));
    const bool refused = policy == IntegrityPolicy::verify;
    Recorded p(policy);
    ASSERT_TRUE(p.rt);
    const DeviceHandle a = p.alloc(n, 0, "a");
    ASSERT_TRUE(p.calls->fill(0, a, 4).ok());
    const DeviceHandle b = p.alloc(n, 1, "b");
    ASSERT_TRUE(p.calls->wait(1, 0).ok());
    ASSERT_TRUE(p.rt->begin_capture(1).ok());
    EXPECT_EQ(p.calls->copy_on_device(1, b, 0, a, 0, n).ok(), !refused);
    Result<Graph> graph = p.rt->end_capture(1);
    ASSERT_EQ(graph.ok(), !refused);
    if (!refused) {
      ASSERT_TRUE(p.rt->launch(*graph, 1).ok());
      EXPECT_EQ(p.download(b, n, 1), pattern(4, n));
      ASSERT_TRUE(graph->destroy().ok());
    }
    ASSERT_TRUE(p.calls->synchronize().ok());
    ASSERT_TRUE(p.rec->flush().ok());

    const std::string trace = p.trace.str();
    const std::vector<nlohmann::json> lines = lines_of(trace);
    const std::vector<std::string> want =
        refused ? std::vector<std::string>{"meta", "alloc", "fill", "alloc", "wait", "capture begin", "sync",
                                           "capture end", "sync"}
                : std::vector<std::string>{"meta", "alloc", "fill", "alloc", "wait", "capture begin", "copy",
                                           "capture end", "replay", "check", "capture destroy", "sync"};
    ASSERT_EQ(ops_of(lines), want) << trace;
    if (!refused) {
      EXPECT_EQ(lines.at(6), nlohmann::json::parse(R"({"op":"copy","src":"a#1","dst":"b#2","stream":1,"bytes":65536})"));
    }
    Result<ReplayReport> r = replay_of(trace, policy);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_TRUE(r->passed()) << report_summary(*r) << "\n" << trace;
    EXPECT_EQ(r->checks, refused ? 0u : 1u) << "the launch's copy compared with the reference";
    EXPECT_EQ(r->expected_errors, refused ? 2u : 0u);
  }
}

// An upload and a copy to the host in a capture (integrity off: no host compare)
// are written there, the check naming its stream; the replay's graph uploads the
// line's pattern and copies back at every launch, and the latest copy is
// compared at the sync that covers its stream, with no host wait of its own (the
// race checker sees the program's order only).
TEST(TraceRecorderGraph, ACapturedUploadAndCopyToHostAreWrittenAndReplayed) {
  constexpr std::uint64_t n = 64 * kKiB;
  Recorded p(IntegrityPolicy::off);
  ASSERT_TRUE(p.rt);
  const DeviceHandle a = p.alloc(n, 1, "a");
  const DeviceHandle b = p.alloc(n, 1, "b");
  std::vector<std::byte> host = pattern(3, n), back(n);
  ASSERT_TRUE(p.rt->begin_capture(1).ok());
  ASSERT_TRUE(p.calls->upload(1, TransferPlan().add(host, a)).ok());
  const DeviceHandle in[] = {a};
  ASSERT_TRUE(p.calls->compute(1, in, b).ok());
  ASSERT_TRUE(p.calls->copy_to_host(1, b, back).ok());
  Result<Graph> graph = p.rt->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(p.rt->launch(*graph, 1).ok());
  ASSERT_TRUE(p.calls->synchronize(1).ok());
  EXPECT_EQ(back, mix_bytes({pattern(3, n)}, n));
  ASSERT_TRUE(graph->destroy().ok());
  for (DeviceHandle h : {a, b}) ASSERT_TRUE(p.calls->free(h).ok());
  ASSERT_TRUE(p.rec->flush().ok());

  const std::string trace = p.trace.str();
  const std::vector<nlohmann::json> lines = lines_of(trace);
  ASSERT_EQ(ops_of(lines), (std::vector<std::string>{"meta", "alloc", "alloc", "capture begin", "upload", "compute",
                                                      "check", "capture end", "replay", "replay", "replay", "sync",
                                                      "capture destroy", "free", "free"}))
      << trace;
  EXPECT_EQ(lines.at(6), nlohmann::json::parse(R"({"op":"check","id":"b#2","stream":1})"));
  EXPECT_EQ(p.rec->stats().unrecorded, 0u);

  Result<ReplayReport> r = replay_of(trace, IntegrityPolicy::off);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r) << "\n" << trace;
  EXPECT_EQ(r->checks, 1u) << "the last launch's copy, compared at the sync";
  EXPECT_EQ(r->unwritten_checks, 0u);
  EXPECT_EQ(r->races, 0u);
  // Under verify the replay's capture refuses the upload (a host compare), as a program's would be.
  Result<ReplayReport> verified = replay_of(trace, IntegrityPolicy::verify);
  ASSERT_TRUE(verified.ok()) << verified.error().message;
  EXPECT_FALSE(verified->passed());
}

}  // namespace
}  // namespace ferry
