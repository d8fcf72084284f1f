// The trace recorder: what a real program does through a RecordingPool replays
// with `ferry replay` and exit 0, with the same checks and expected errors.
#include "ferry/trace_recorder.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.hpp"
#include "ferry/replay.hpp"
#include "transfer_fixture.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

using testing::Rig;
using testing::RigOptions;

// The device the recorded program runs on, and the replay options that match it.
RigOptions h200_at(std::uint64_t capacity) {
  RigOptions o;
  o.profile = "h200";
  o.pool.capacity = capacity;
  return o;
}
ReplayOptions replay_at(std::uint64_t capacity) {
  ReplayOptions o;
  o.backend.profile = "h200";
  o.capacity = capacity;
  return o;
}

std::vector<nlohmann::json> lines_of(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::size_t count_op(const std::vector<nlohmann::json>& lines, const std::string& op) {
  std::size_t n = 0;
  for (const auto& l : lines) n += l.at("op") == op ? 1 : 0;
  return n;
}

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           (std::string("ferry_observe_") + info->name() + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

// A program that uses every kind of call: fills, an upload through the engine,
// a kernel queued on a held stream whose input is freed while it waits (report
// 003's order), read-backs, a device copy, an input-less kernel, an OOM, a
// double free and a trim.
void run_program(Rig& rig, RecordingPool& rec) {
  auto w = rec.allocate(8 * kMiB, 0, "weights");
  ASSERT_TRUE(w.ok()) << w.error().message;
  ASSERT_TRUE(rec.fill(0, *w, 7).ok());

  auto staged = rec.allocate(4 * kMiB, 1);
  ASSERT_TRUE(staged.ok());
  HostBlock block = rig.block_with(11, 4 * kMiB);
  TransferPlan plan;
  plan.add(block, *staged);
  ASSERT_TRUE(rec.upload(1, plan).ok());
  ASSERT_TRUE(rig.arena->free(block).ok());

  ASSERT_TRUE(rec.synchronize(0).ok());  // the program orders stream 1 after the fill
  ASSERT_TRUE(rec.hold(1).ok());
  auto out = rec.allocate(256 * 1024, 1, "out");
  ASSERT_TRUE(out.ok());
  const DeviceHandle inputs[] = {*w, *staged};
  ASSERT_TRUE(rec.compute(1, inputs, *out).ok());
  ASSERT_TRUE(rec.free(*staged).ok());  // while the held kernel still reads it
  ASSERT_TRUE(rec.release(1).ok());
  ASSERT_TRUE(rec.synchronize().ok());

  std::vector<std::byte> host(256 * 1024);
  ASSERT_TRUE(rec.copy_to_host(1, *out, host).ok());
  ASSERT_TRUE(rec.synchronize(1).ok());
  std::vector<std::byte> back(8 * kMiB);
  ASSERT_TRUE(rec.download(0, *w, 0, back).ok());
  EXPECT_EQ(back, testing::pattern(7, 8 * kMiB)) << "the program's own bytes are untouched";

  auto copy = rec.allocate(8 * kMiB, 0, "copy");
  ASSERT_TRUE(copy.ok());
  ASSERT_TRUE(rec.copy_on_device(0, *copy, 0, *w, 0, 8 * kMiB).ok());
  auto scratch = rec.allocate(1 * kMiB, 0);
  ASSERT_TRUE(scratch.ok());
  ASSERT_TRUE(rec.compute(0, {}, *scratch).ok());
  ASSERT_TRUE(rec.copy_to_host(0, *scratch, back).ok());
  ASSERT_TRUE(rec.synchronize(0).ok());

  auto huge = rec.allocate(std::uint64_t{1} << 40, 0, "huge");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().code, ErrorCode::out_of_memory);
  auto twice = rec.free(*staged);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().code, ErrorCode::stale_handle);

  ASSERT_TRUE(rec.free(*out).ok());
  ASSERT_TRUE(rec.trim().ok());
  ASSERT_TRUE(rec.free(*w).ok());
  ASSERT_TRUE(rec.free(*copy).ok());
  ASSERT_TRUE(rec.free(*scratch).ok());
}

TEST(TraceRecorder, ARecordedProgramReplaysWithEveryCheckMatchingAndTheSameErrors) {
  Rig rig(h200_at(64 * kMiB));
  std::ostringstream trace;
  DirectPoolCalls direct(*rig.pool, *rig.engine);
  RecordingPool rec(direct, trace);
  run_program(rig, rec);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ASSERT_TRUE(rec.flush().ok());

  const std::vector<nlohmann::json> lines = lines_of(trace.str());
  EXPECT_EQ(rec.stats().lines, lines.size());
  EXPECT_EQ(rec.stats().unrecorded, 0u);
  EXPECT_EQ(rec.stats().failed_calls, 2u);
  EXPECT_EQ(count_op(lines, "check"), 3u);
  EXPECT_EQ(count_op(lines, "upload"), 1u);
  EXPECT_EQ(count_op(lines, "compute"), 1u) << "the kernel (the input-less one is a fill)";
  EXPECT_EQ(count_op(lines, "copy"), 1u) << "the device copy";
  EXPECT_EQ(count_op(lines, "hold"), 1u);
  EXPECT_EQ(count_op(lines, "release"), 1u);
  EXPECT_EQ(count_op(lines, "trim"), 1u);
  EXPECT_EQ(trace.str().substr(0, trace.str().find('\n')), R"({"op":"meta","capacity":67108864})");
  EXPECT_EQ(lines.at(1), nlohmann::json::parse(R"({"op":"alloc","id":"weights#1","bytes":8388608,"stream":0})"));
  for (const auto& l : lines) {
    if (l.contains("expect")) {
      EXPECT_TRUE(l["expect"] == "out_of_memory" || l["expect"] == "stale_handle") << l;
    }
  }

  Result<ReplayReport> r = replay_trace_text(trace.str(), "recorded.jsonl", replay_at(64 * kMiB));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r) << "\n" << trace.str();
  EXPECT_EQ(r->ops, lines.size() - 1) << "every line but the meta line is an op";
  EXPECT_EQ(r->checks, 3u) << "every recorded read-back compared bytes";
  EXPECT_EQ(r->corrupt, 0u);
  EXPECT_EQ(r->unexpected_errors, 0u);
  EXPECT_EQ(r->expected_errors, 2u);
  EXPECT_EQ(r->errors["out_of_memory"], 1u);
  EXPECT_EQ(r->errors["stale_handle"], 1u);
  EXPECT_EQ(r->skipped, 0u);
}

// A program's own cross-stream wait is recorded, so its recording replays under
// --strict with the program's ordering: race-free with the wait, a race without.
std::uint64_t strict_races_of_a_recording(bool with_wait) {
  Rig rig(h200_at(64 * kMiB));
  std::ostringstream trace;
  {
    DirectPoolCalls direct(*rig.pool, *rig.engine);
    RecordingPool rec(direct, trace);
    auto w = rec.allocate(1 * kMiB, 0, "w");
    auto out = rec.allocate(64 * 1024, 0, "out");
    EXPECT_TRUE(w.ok() && out.ok());
    EXPECT_TRUE(rec.fill(1, *w, 5).ok());
    if (with_wait) {
      EXPECT_TRUE(rec.wait(0, 1).ok());
    }
    const DeviceHandle in[] = {*w};
    EXPECT_TRUE(rec.compute(0, in, *out).ok());
    EXPECT_TRUE(rec.synchronize().ok());
    EXPECT_TRUE(rec.flush().ok());
  }
  EXPECT_EQ(trace.str().find(R"("op":"wait")") != std::string::npos, with_wait) << trace.str();
  ReplayOptions o = replay_at(64 * kMiB);
  o.strict = true;
  o.backend.race_check = true;
  Result<ReplayReport> r = replay_trace_text(trace.str(), "recorded.jsonl", o);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? r->races : 0;
}

TEST(TraceRecorder, AProgramsWaitIsRecordedAndReplaysUnderStrict) {
  EXPECT_EQ(strict_races_of_a_recording(true), 0u);
  EXPECT_GT(strict_races_of_a_recording(false), 0u);
}

// A program's own kernels are recorded with their operand marks and ranges: the
// replay stands its kernel in for them, so the recording replays under --strict
// with the same accesses — a race where the program forgot a wait, checks that
// match where it did not.
struct UserRecording {
  std::string trace;
  ReplayReport report;
};
UserRecording record_user_ops(bool with_wait) {
  Rig rig(h200_at(64 * kMiB));
  std::ostringstream trace;
  {
    DirectPoolCalls direct(*rig.pool, *rig.engine);
    RecordingPool rec(direct, trace);
    auto w = rec.allocate(256 * 1024, 0, "w");
    auto out = rec.allocate(64 * 1024, 0, "out");
    EXPECT_TRUE(w.ok() && out.ok());
    const Operand produce[] = {{*w, Access::write}};
    const auto seven = [](const KernelLaunch& l) -> Result<void> {
      for (std::byte& b : l.args[0].out) b = std::byte{7};
      return {};
    };
    EXPECT_TRUE(rec.user(1, produce, seven, {}, "produce").ok());
    if (with_wait) {
      EXPECT_TRUE(rec.wait(0, 1).ok());
    }
    // Reads the first 4 KiB of w, writes all of out: a range and a whole block.
    const Operand consume[] = {{*w, Access::read, 0, 4096}, {*out, Access::write}};
    EXPECT_TRUE(rec.user(0, consume, [](const KernelLaunch&) -> Result<void> { return {}; }, {}, "consume").ok());
    std::vector<std::byte> back(64 * 1024);
    EXPECT_TRUE(rec.copy_to_host(0, *out, back).ok());
    EXPECT_TRUE(rec.synchronize().ok());
    EXPECT_TRUE(rec.flush().ok());
  }
  ReplayOptions o = replay_at(64 * kMiB);
  o.strict = true;
  o.backend.race_check = true;
  Result<ReplayReport> r = replay_trace_text(trace.str(), "recorded.jsonl", o);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return {trace.str(), r.ok() ? *r : ReplayReport{}};
}

TEST(TraceRecorder, UserOpsAreRecordedWithTheirMarksAndReplayUnderStrict) {
  const UserRecording ok = record_user_ops(true);
  const auto lines = lines_of(ok.trace);
  ASSERT_EQ(count_op(lines, "user"), 2u) << ok.trace;
  const auto& consume = lines.at(5);  // meta, alloc, alloc, user, wait, user
  ASSERT_EQ(consume.at("op"), "user") << ok.trace;
  EXPECT_EQ(consume.at("tag"), "consume");
  EXPECT_EQ(consume.at("operands").at(0).at("access"), "read");
  EXPECT_EQ(consume.at("operands").at(0).at("bytes"), 4096);
  EXPECT_FALSE(consume.at("operands").at(1).contains("bytes")) << "a whole block carries no range";
  EXPECT_EQ(ok.report.races, 0u) << report_summary(ok.report);
  EXPECT_TRUE(ok.report.passed()) << report_summary(ok.report);

  const UserRecording bad = record_user_ops(false);
  ASSERT_GE(bad.report.races, 1u) << report_summary(bad.report);
  const ReplayRace& race = bad.report.race_list.at(0);
  EXPECT_EQ(race.earlier.line, 4u);  // after the meta line and the two allocs
  EXPECT_EQ(race.later.line, 5u);
  EXPECT_EQ(race.earlier.id, "w#1");
  EXPECT_EQ(race.bytes, 4096u) << "only the range the consumer read";
}

TEST(TraceRecorder, ARecordedFileReplaysThroughTheCliWithExitZero) {
  TempDir dir;
  const std::string path = dir.path("recorded.jsonl");
  {
    Rig rig(h200_at(64 * kMiB));
    DirectPoolCalls direct(*rig.pool, *rig.engine);
    Result<std::unique_ptr<RecordingPool>> rec = RecordingPool::to_file(direct, path);
    ASSERT_TRUE(rec.ok()) << rec.error().message;
    run_program(rig, **rec);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
  }  // the recorder flushes as it goes
  const auto run = cli::testing::run_ferry({"replay", path, "--capacity", "64MiB", "--json"});
  EXPECT_EQ(run.code, 0) << run.out << run.err;
  const auto report = nlohmann::json::parse(run.out);
  EXPECT_EQ(report["checks"], 3);
  EXPECT_EQ(report["corrupt"], 0);
  EXPECT_EQ(report["unexpected_errors"], 0);
}

// The meta line carries the recorded capacity: without --capacity the replay
// runs at it (not at the device's), so pressure is as it was recorded.
TEST(TraceRecorder, ARecordedFileReplaysAtItsRecordedCapacityWithoutTheOption) {
  TempDir dir;
  const std::string path = dir.path("recorded.jsonl");
  {
    Rig rig(h200_at(64 * kMiB));
    DirectPoolCalls direct(*rig.pool, *rig.engine);
    Result<std::unique_ptr<RecordingPool>> rec = RecordingPool::to_file(direct, path);
    ASSERT_TRUE(rec.ok()) << rec.error().message;
    run_program(rig, **rec);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
  }
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(nlohmann::json::parse(first), nlohmann::json::parse(R"({"op":"meta","capacity":67108864})"));
  const auto run = cli::testing::run_ferry({"replay", path, "--json"});
  EXPECT_EQ(run.code, 0) << run.out << run.err;
  const auto report = nlohmann::json::parse(run.out);
  EXPECT_EQ(report["capacity"], 64 * kMiB);
  EXPECT_EQ(report["unexpected_errors"], 0);
}

TEST(TraceRecorder, IdsAreStablePerAllocationAndNeverReused) {
  Rig rig(h200_at(64 * kMiB));
  std::ostringstream trace;
  DirectPoolCalls direct(*rig.pool, *rig.engine);
  RecordingPool rec(direct, trace);
  auto a = rec.allocate(1024, 0, "act");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(rec.id_of(*a), "act#1");
  ASSERT_TRUE(rec.free(*a).ok());
  EXPECT_EQ(rec.id_of(*a), "act#1") << "a freed handle is remembered, for double frees";
  auto b = rec.allocate(1024, 0);  // may take a's slot; gets a new id
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(rec.id_of(*b), "b2");
  EXPECT_EQ(rec.id_of(DeviceHandle{}), std::nullopt);
  ASSERT_TRUE(rec.free(*b).ok());
}

TEST(TraceRecorder, CallsTheFormatCannotExpressAreForwardedButNotRecorded) {
  Rig rig(h200_at(64 * kMiB));
  Rig other(h200_at(64 * kMiB));
  std::ostringstream trace;
  DirectPoolCalls direct(*rig.pool, *rig.engine);
  RecordingPool rec(direct, trace);
  auto mine = rec.allocate(4096, 0);
  ASSERT_TRUE(mine.ok());
  const std::uint64_t lines_before = rec.stats().lines;

  auto foreign = other.pool->allocate(4096, 0);
  ASSERT_TRUE(foreign.ok());
  auto r = rec.free(*foreign);  // another pool's handle
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::stale_handle);
  auto bad_stream = rec.allocate(4096, kMaxStreams);
  ASSERT_FALSE(bad_stream.ok());
  EXPECT_EQ(bad_stream.error().code, ErrorCode::invalid_argument);
  EXPECT_FALSE(rec.hold(kMaxStreams).ok());
  EXPECT_FALSE(rec.fill(kMaxStreams, *mine, 1).ok());

  EXPECT_EQ(rec.stats().lines, lines_before);
  EXPECT_EQ(rec.stats().unrecorded, 4u);
  ASSERT_TRUE(rec.free(*mine).ok());
  ASSERT_TRUE(other.pool->free(*foreign).ok());
  Result<ReplayReport> replayed = replay_trace_text(trace.str(), "t.jsonl", replay_at(64 * kMiB));
  ASSERT_TRUE(replayed.ok()) << replayed.error().message;
  EXPECT_TRUE(replayed->passed());
}

TEST(TraceRecorder, AZeroByteAllocationIsRecordedAsExpectingInvalidArgument) {
  Rig rig(h200_at(64 * kMiB));
  std::ostringstream trace;
  DirectPoolCalls direct(*rig.pool, *rig.engine);
  RecordingPool rec(direct, trace);
  EXPECT_FALSE(rec.allocate(0, 0).ok());
  const auto lines = lines_of(trace.str());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1]["expect"], "invalid_argument");
  Result<ReplayReport> r = replay_trace_text(trace.str(), "t.jsonl", replay_at(64 * kMiB));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->passed());
}

// Threads each work on their own stream; every line lands whole, and the trace
// replays (each thread's order is kept).
TEST(TraceRecorder, IsSafeToCallFromSeveralThreads) {
  Rig rig(h200_at(128 * kMiB));
  std::ostringstream trace;
  DirectPoolCalls direct(*rig.pool, *rig.engine);
  RecordingPool rec(direct, trace);
  constexpr int kThreads = 4, kRounds = 25;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const auto stream = static_cast<StreamId>(t);
      std::vector<std::byte> host(64 * 1024);
      for (int i = 0; i < kRounds; ++i) {
        auto h = rec.allocate(64 * 1024, stream, "t" + std::to_string(t));
        if (!h.ok()) continue;
        (void)rec.fill(stream, *h, static_cast<std::uint64_t>(t * 1000 + i));
        (void)rec.copy_to_host(stream, *h, host);
        (void)rec.synchronize(stream);
        (void)rec.free(*h);
      }
    });
  }
  for (auto& th : threads) th.join();
  const auto lines = lines_of(trace.str());  // each parses: no torn lines
  EXPECT_EQ(lines.size(), static_cast<std::size_t>(kThreads * kRounds * 5) + 1) << "and the meta line";
  EXPECT_EQ(rec.stats().lines, lines.size());
  Result<ReplayReport> r = replay_trace_text(trace.str(), "threads.jsonl", replay_at(128 * kMiB));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r);
  EXPECT_EQ(r->checks, static_cast<std::uint64_t>(kThreads * kRounds));
}

TEST(TraceRecorder, AFileThatCannotBeOpenedIsAnError) {
  Rig rig(h200_at(64 * kMiB));
  DirectPoolCalls direct(*rig.pool, *rig.engine);
  auto rec = RecordingPool::to_file(direct, "/nonexistent-dir/x/trace.jsonl");
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(rec.error().message.find("/nonexistent-dir/x/trace.jsonl"), std::string::npos);
}

TEST(TraceRecorder, AFailingOutputIsReportedButNeverFailsTheProgram) {
  Rig rig(h200_at(64 * kMiB));
  std::ostringstream trace;
  trace.setstate(std::ios::badbit);
  DirectPoolCalls direct(*rig.pool, *rig.engine);
  RecordingPool rec(direct, trace);
  auto h = rec.allocate(4096, 0);
  ASSERT_TRUE(h.ok()) << "the call still runs";
  EXPECT_TRUE(rec.free(*h).ok());
  EXPECT_FALSE(rec.status().ok());
  EXPECT_FALSE(rec.flush().ok());
  EXPECT_EQ(rec.stats().lines, 0u);
}

// Device copies are recorded as `copy` lines with their ranges: two copies into
// disjoint halves of one block on two streams replay race-free under --strict
// (integrity off: no host compare orders them); had the recorder written them
// as whole-block writes, the replay would report a race.
TEST(TraceRecorder, DeviceCopiesOfDisjointRangesOnTwoStreamsReplayWithoutARace) {
  Rig rig(h200_at(64 * kMiB));
  std::ostringstream trace;
  {
    DirectPoolCalls direct(*rig.pool, *rig.engine);
    RecordingPool rec(direct, trace);
    auto src = rec.allocate(2 * kMiB, 0, "src");
    auto dst = rec.allocate(2 * kMiB, 0, "dst");
    ASSERT_TRUE(src.ok() && dst.ok());
    ASSERT_TRUE(rec.fill(0, *src, 3).ok());
    ASSERT_TRUE(rec.synchronize().ok());
    ASSERT_TRUE(rec.copy_on_device(0, *dst, 0, *src, 0, kMiB).ok());
    ASSERT_TRUE(rec.copy_on_device(1, *dst, kMiB, *src, kMiB, kMiB).ok());
    ASSERT_TRUE(rec.synchronize().ok());
    std::vector<std::byte> back(2 * kMiB);
    ASSERT_TRUE(rec.copy_to_host(0, *dst, back).ok());
    ASSERT_TRUE(rec.synchronize().ok());
    EXPECT_EQ(back, testing::pattern(3, 2 * kMiB)) << "the program's copies moved its bytes";
    auto none = rec.copy_on_device(0, *dst, 0, *src, 0, 0);
    ASSERT_FALSE(none.ok()) << "a 0-byte copy is refused";
    EXPECT_EQ(none.error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(rec.stats().unrecorded, 0u) << "and recorded, expecting the refusal";
    ASSERT_TRUE(rec.flush().ok());
  }
  const std::vector<nlohmann::json> lines = lines_of(trace.str());
  ASSERT_EQ(count_op(lines, "copy"), 3u) << trace.str();
  EXPECT_EQ(lines.at(5), nlohmann::json::parse(
                             R"({"op":"copy","src":"src#1","dst":"dst#2","stream":0,"bytes":1048576})"));
  EXPECT_EQ(lines.at(6), nlohmann::json::parse(R"({"op":"copy","src":"src#1","dst":"dst#2","stream":1,)"
                                               R"("bytes":1048576,"src_offset":1048576,"dst_offset":1048576})"));
  EXPECT_EQ(lines.back().at("expect"), "invalid_argument") << trace.str();
  ReplayOptions o = replay_at(64 * kMiB);
  o.integrity = IntegrityPolicy::off;
  o.strict = true;
  o.backend.race_check = true;
  Result<ReplayReport> r = replay_trace_text(trace.str(), "recorded.jsonl", o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r) << "\n" << trace.str();
  EXPECT_EQ(r->races, 0u) << report_summary(*r);
  // What a partial copy leaves is not modeled: the check reads, but compares
  // nothing (a whole-block copy, as in run_program, is compared).
  EXPECT_EQ(r->checks, 0u);
  EXPECT_EQ(r->unwritten_checks, 1u);
  EXPECT_EQ(r->expected_errors, 1u);
}


// --- issue 24: what to_file opens, and blocks live before recording ------------

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("ferry-" + name + "-" + std::to_string(::getpid())))
      .string();
}

}  // namespace

// Item 3: a FIFO (no reader) is refused at once, never a hang in open().
TEST(TraceRecorderFile, AFifoIsRefusedWithoutBlocking) {
  Rig rig(h200_at(64 * kMiB));
  const std::string fifo = temp_path("trace-fifo");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  DirectPoolCalls direct(*rig.pool, *rig.engine);
  auto rec = RecordingPool::to_file(direct, fifo);
  std::filesystem::remove(fifo);
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(rec.error().message.find(fifo), std::string::npos) << rec.error().message;
}

// Item 8: a path that opens but cannot be written fails at start, not at stop.
TEST(TraceRecorderFile, AnUnwritablePathIsRefusedAtStart) {
  Rig rig(h200_at(64 * kMiB));
  for (const char* path : {"/dev/full", "/proc/self/mem"}) {
    if (!std::filesystem::exists(path)) continue;
    DirectPoolCalls direct(*rig.pool, *rig.engine);
    auto rec = RecordingPool::to_file(direct, path);
    ASSERT_FALSE(rec.ok()) << path;
    EXPECT_EQ(rec.error().code, ErrorCode::invalid_argument) << path;
    EXPECT_NE(rec.error().message.find(path), std::string::npos) << rec.error().message;
  }
  const std::string fine = temp_path("trace-fine");
  DirectPoolCalls direct(*rig.pool, *rig.engine);
  auto rec = RecordingPool::to_file(direct, fine);
  ASSERT_TRUE(rec.ok()) << rec.error().message;
  std::ifstream in(fine);
  std::string first;
  ASSERT_TRUE(std::getline(in, first)) << "the meta line is on disk at start";
  EXPECT_NE(first.find("\"meta\""), std::string::npos);
  rec->reset();
  std::filesystem::remove(fine);
}

// Item 9: ops on blocks allocated before the recorder are recorded, after an
// alloc marked "existing" for each, and the trace replays.
TEST(TraceRecorder, BlocksLiveAtStartAreRecordedAsExisting) {
  Rig rig(h200_at(64 * kMiB));
  auto before = rig.pool->allocate(64 * 1024, 2);
  ASSERT_TRUE(before.ok());
  std::ostringstream trace;
  {
    DirectPoolCalls direct(*rig.pool, *rig.engine);
    RecordingPool rec(direct, trace);
    ASSERT_TRUE(rec.fill(0, *before, 5).ok());
    std::vector<std::byte> back(64 * 1024);
    ASSERT_TRUE(rec.download(0, *before, 0, back).ok());
    ASSERT_TRUE(rec.free(*before).ok());
    EXPECT_EQ(rec.stats().unrecorded, 0u);
    ASSERT_TRUE(rec.flush().ok());
  }
  const std::vector<nlohmann::json> lines = lines_of(trace.str());
  ASSERT_GE(lines.size(), 5u) << trace.str();
  EXPECT_EQ(lines[1]["op"], "alloc");
  EXPECT_EQ(lines[1]["existing"], true);
  EXPECT_EQ(lines[1]["bytes"], 64 * 1024);
  EXPECT_EQ(lines[1]["stream"], 2);
  EXPECT_EQ(count_op(lines, "fill"), 1u);
  EXPECT_EQ(count_op(lines, "check"), 1u);
  EXPECT_EQ(count_op(lines, "free"), 1u);
  Result<ReplayReport> replayed = replay_trace_text(trace.str(), "t.jsonl", replay_at(64 * kMiB));
  ASSERT_TRUE(replayed.ok()) << replayed.error().message;
  EXPECT_TRUE(replayed->passed()) << report_summary(*replayed);
  EXPECT_EQ(replayed->checks, 1u);
}

}  // namespace
}  // namespace ferry
