// Graph capture and replay (graph.hpp): recorded calls run only when launched,
// a replay reads and writes the right bytes every time, a block freed outside a
// graph refuses its replay, the graph's own blocks are reused by no one until
// it is destroyed and its last replay completed, and what cannot be captured is
// refused naming why. Written once, run on every backend (cuda SKIPs without a GPU).
#include "ferry/graph.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "graph_fixture.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/pool_calls.hpp"
#include "ferry/runtime.hpp"
#include "pool_helpers.hpp"
#include "program_kernels.hpp"

namespace ferry {
namespace {

using testing::mix_bytes;
using testing::pattern;

constexpr std::uint64_t KiB = 1024;
using testing::kSimGraphs;

class GraphTest : public testing::GraphFixture {};

TEST_P(GraphTest, AGraphReplayedAThousandTimesReadsAndWritesTheRightBytes) {
  constexpr std::uint64_t n = 4 * KiB;
  const DeviceHandle in = alloc(n, 1), out = alloc(n, 1);
  ASSERT_TRUE(calls().fill(1, out, 5).ok());
  ASSERT_TRUE(calls().synchronize(1).ok());
  std::vector<std::byte> host(n);

  ASSERT_TRUE(rt_->begin_capture(1).ok());
  const Ticket before = rt_->backend().submitted(1);
  auto t = calls().compute(1, std::span<const DeviceHandle>(&in, 1), out);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(*t, 0u);  // recorded, not enqueued
  ASSERT_TRUE(calls().copy_to_host(1, out, host).ok());
  // Another stream is not captured: its work runs at once.
  const DeviceHandle other = alloc(n, 2);
  ASSERT_TRUE(calls().fill(2, other, 8).ok());
  ASSERT_TRUE(calls().synchronize(2).ok());
  EXPECT_EQ(bytes_of(other, 2), pattern(8, n));
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  EXPECT_EQ(rt_->backend().submitted(1), before);
  EXPECT_EQ(bytes_of(out), pattern(5, n));  // nothing recorded has run
  EXPECT_EQ(graph->stats().ops, 2u);
  EXPECT_EQ(graph->stats().blocks, 2u);

  for (std::uint64_t i = 0; i < 1000; ++i) {
    ASSERT_TRUE(calls().fill(1, in, 100 + i).ok());
    ASSERT_TRUE(rt_->launch(*graph, 1).ok());
    ASSERT_TRUE(calls().synchronize(1).ok());
    ASSERT_EQ(host, mix_bytes({pattern(100 + i, n)}, n)) << "replay " << i;
  }
  EXPECT_EQ(graph->stats().launches, 1000u);
  ASSERT_TRUE(graph->destroy().ok());
  for (DeviceHandle h : {in, out, other}) EXPECT_TRUE(calls().free(h).ok());
}

TEST_P(GraphTest, ABlockFreedOutsideTheGraphRefusesTheReplay) {
  const DeviceHandle a = alloc(4 * KiB, 0), b = alloc(4 * KiB, 0);
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  ASSERT_TRUE(calls().fill(1, b, 1).ok());
  ASSERT_TRUE(calls().fill(1, a, 2).ok());
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  ASSERT_TRUE(rt_->launch(*graph, 1).ok());

  ASSERT_TRUE(calls().free(a).ok());
  const Ticket before = rt_->backend().submitted(1);
  Result<void> r = rt_->launch(*graph, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::stale_handle);
  EXPECT_NE(r.error().message.find("freed outside"), std::string::npos) << r.error().message;
  // Nothing of the replay ran, not even the op on the block still alive.
  EXPECT_EQ(rt_->backend().submitted(1), before);
  // The memory is handed to someone else: the graph still never writes it.
  const DeviceHandle c = alloc(4 * KiB, 1);
  ASSERT_TRUE(calls().fill(1, c, 9).ok());
  EXPECT_FALSE(rt_->launch(*graph, 1).ok());
  EXPECT_EQ(bytes_of(c), pattern(9, 4 * KiB));
  EXPECT_TRUE(calls().free(b).ok());
  EXPECT_TRUE(calls().free(c).ok());
}

TEST_P(GraphTest, ABlockFreedInsideTheCaptureIsTheGraphsUntilDestroyAndItsLastReplay) {
  constexpr std::uint64_t n = 64 * KiB;
  const DeviceHandle out = alloc(n, 1);
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  const DeviceHandle tmp = alloc(n, 1);  // the graph's own
  const auto tmp_span = rt_->pool().resolve(tmp);
  ASSERT_TRUE(tmp_span.ok());
  ASSERT_TRUE(calls().fill(1, tmp, 7).ok());
  ASSERT_TRUE(calls().compute(1, std::span<const DeviceHandle>(&tmp, 1), out).ok());
  ASSERT_TRUE(calls().free(tmp).ok());  // deferred: the graph's ops were recorded with its address
  EXPECT_EQ(rt_->pool().resolve(tmp).error().code, ErrorCode::stale_handle);  // I1 all the same
  EXPECT_EQ(calls().free(tmp).error().code, ErrorCode::stale_handle);
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  const GraphPoolStats ps = graph->pool().stats();
  EXPECT_EQ(ps.blocks, 1u);
  EXPECT_EQ(ps.reserved_bytes, n);
  EXPECT_EQ(ps.allocated_bytes, 0u);  // the program freed it
  EXPECT_EQ(ps.graphs, 1u);

  // Not reused outside the graph while it lives, whatever stream asks.
  for (StreamId s : {StreamId{1}, StreamId{2}}) {
    const DeviceHandle o = alloc(n, s);
    EXPECT_NE(rt_->pool().resolve(o)->addr, tmp_span->addr);
    EXPECT_TRUE(calls().free(o).ok());
  }

  // The last replay is held in the host queue when the graph is destroyed.
  ASSERT_TRUE(calls().hold(1).ok());
  ASSERT_TRUE(rt_->launch(*graph, 1).ok());
  const std::uint64_t live_before = rt_->pool().stats().allocated_bytes;
  ASSERT_TRUE(graph->destroy().ok());
  EXPECT_EQ(rt_->pool().stats().allocated_bytes, live_before - n);
  EXPECT_GE(rt_->pool().stats().pending_free_bytes, n);  // freed, not yet reusable elsewhere
  const DeviceHandle later = alloc(n, 2);
  ASSERT_TRUE(calls().fill(2, later, 99).ok());
  ASSERT_TRUE(calls().release(1).ok());
  ASSERT_TRUE(calls().synchronize().ok());
  EXPECT_EQ(bytes_of(out), mix_bytes({pattern(7, n)}, n));
  EXPECT_EQ(bytes_of(later, 2), pattern(99, n));
  EXPECT_EQ(rt_->pool().stats().pending_free_bytes, 0u);
  EXPECT_TRUE(calls().free(later).ok());
  EXPECT_TRUE(calls().free(out).ok());
}

TEST_P(GraphTest, ABlockFreedInsideTheCaptureIsReusedInsideItUnderANewHandle) {
  constexpr std::uint64_t n = 16 * KiB;
  const DeviceHandle out = alloc(n, 1);
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  const DeviceHandle first = alloc(n, 1);
  ASSERT_TRUE(calls().fill(1, first, 11).ok());
  ASSERT_TRUE(calls().compute(1, std::span<const DeviceHandle>(&first, 1), out).ok());
  const std::uint64_t first_addr = rt_->pool().resolve(first)->addr;
  ASSERT_TRUE(calls().free(first).ok());
  const DeviceHandle second = alloc(n, 1);  // the same bytes, a new handle
  EXPECT_NE(second, first);
  EXPECT_EQ(rt_->pool().resolve(second)->addr, first_addr);
  EXPECT_EQ(rt_->pool().resolve(first).error().code, ErrorCode::stale_handle);  // I1
  ASSERT_TRUE(calls().fill(1, second, 12).ok());
  const DeviceHandle both[] = {out, second};
  ASSERT_TRUE(calls().compute(1, both, out).ok());
  ASSERT_TRUE(calls().free(second).ok());
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  EXPECT_EQ(graph->pool().stats().blocks, 1u);
  EXPECT_EQ(graph->pool().stats().reserved_bytes, n);

  // Not outside: no allocation elsewhere lands on it while the graph lives.
  const DeviceHandle outside = alloc(n, 1);
  EXPECT_NE(rt_->pool().resolve(outside)->addr, first_addr);
  ASSERT_TRUE(calls().fill(1, outside, 77).ok());

  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(rt_->launch(*graph, 1).ok());
    ASSERT_TRUE(calls().synchronize(1).ok());
    const std::vector<std::byte> a = mix_bytes({pattern(11, n)}, n);
    EXPECT_EQ(bytes_of(out), mix_bytes({a, pattern(12, n)}, n));
  }
  EXPECT_EQ(bytes_of(outside), pattern(77, n));
  ASSERT_TRUE(graph->destroy().ok());
  for (DeviceHandle h : {out, outside}) EXPECT_TRUE(calls().free(h).ok());
}

TEST_P(GraphTest, TwoGraphsCapturedOneAfterAnotherShareAPool) {
  constexpr std::uint64_t n = 16 * KiB;
  const DeviceHandle out1 = alloc(n, 1), out2 = alloc(n, 1);
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  const DeviceHandle t1 = alloc(n, 1);
  ASSERT_TRUE(calls().fill(1, t1, 21).ok());
  ASSERT_TRUE(calls().compute(1, std::span<const DeviceHandle>(&t1, 1), out1).ok());
  ASSERT_TRUE(calls().free(t1).ok());
  auto g1 = rt_->end_capture(1);
  ASSERT_TRUE(g1.ok()) << g1.error().message;
  const std::uint64_t reserved_before = rt_->pool().stats().allocated_bytes;

  ASSERT_TRUE(rt_->begin_capture(1, CaptureOptions{g1->pool()}).ok());
  // A second capture cannot take the pool while this one has it.
  EXPECT_EQ(rt_->begin_capture(2, CaptureOptions{g1->pool()}).error().code, ErrorCode::invalid_argument);
  const DeviceHandle t2 = alloc(n, 1);  // g1's freed block, reused
  EXPECT_EQ(rt_->pool().stats().allocated_bytes, reserved_before);
  ASSERT_TRUE(calls().fill(1, t2, 22).ok());
  ASSERT_TRUE(calls().compute(1, std::span<const DeviceHandle>(&t2, 1), out2).ok());
  ASSERT_TRUE(calls().free(t2).ok());
  auto g2 = rt_->end_capture(1);
  ASSERT_TRUE(g2.ok()) << g2.error().message;
  EXPECT_EQ(g2->pool().stats().blocks, 1u);
  EXPECT_EQ(g2->pool().stats().graphs, 2u);
  ASSERT_EQ(GraphPool::all(*rt_).size(), 1u);
  EXPECT_EQ(GraphPool::all(*rt_)[0].reserved_bytes, n);
  EXPECT_NE(graph_pools_summary(*rt_).find("graph pool 1: 1 block(s), reserved 16.00 KiB, allocated 0 B, 2 graph(s)"),
            std::string::npos)
      << graph_pools_summary(*rt_);

  // Replayed one after another, each on the shared bytes.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(rt_->launch(*g1, 1).ok());
    ASSERT_TRUE(rt_->launch(*g2, 1).ok());
    ASSERT_TRUE(calls().synchronize(1).ok());
    EXPECT_EQ(bytes_of(out1), mix_bytes({pattern(21, n)}, n));
    EXPECT_EQ(bytes_of(out2), mix_bytes({pattern(22, n)}, n));
  }
  // The pool lives until its last graph goes.
  ASSERT_TRUE(g1->destroy().ok());
  EXPECT_EQ(g2->pool().stats().blocks, 1u);
  ASSERT_TRUE(rt_->launch(*g2, 1).ok());
  ASSERT_TRUE(g2->destroy().ok());
  EXPECT_TRUE(GraphPool::all(*rt_).empty());
  EXPECT_EQ(graph_pools_summary(*rt_), "");
  ASSERT_TRUE(calls().synchronize(1).ok());
  EXPECT_EQ(rt_->pool().stats().allocated_bytes, reserved_before - n);
  EXPECT_EQ(bytes_of(out2), mix_bytes({pattern(22, n)}, n));
  for (DeviceHandle h : {out1, out2}) EXPECT_TRUE(calls().free(h).ok());
}

TEST_P(GraphTest, ABlockAllocatedInTheCaptureAndKeptIsTheProgramsAgainAfterDestroy) {
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  const DeviceHandle kept = alloc(4 * KiB, 1);
  ASSERT_TRUE(calls().fill(1, kept, 3).ok());
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  ASSERT_TRUE(rt_->launch(*graph, 1).ok());
  ASSERT_TRUE(graph->destroy().ok());
  EXPECT_EQ(bytes_of(kept), pattern(3, 4 * KiB));
  EXPECT_TRUE(calls().free(kept).ok());
  EXPECT_EQ(calls().free(kept).error().code, ErrorCode::stale_handle);
}

TEST_P(GraphTest, MisuseIsAnErrorValue) {
  Graph empty;
  EXPECT_EQ(rt_->launch(empty, 0).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(rt_->end_capture(1).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(rt_->begin_capture(kMaxStreams).error().code, ErrorCode::invalid_argument);
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  EXPECT_EQ(rt_->begin_capture(1).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(rt_->allocate(4 * KiB, 1).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(rt_->end_capture(2).error().code, ErrorCode::invalid_argument);
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok());
  ASSERT_TRUE(rt_->begin_capture(2).ok());
  EXPECT_EQ(rt_->launch(*graph, 2).error().code, ErrorCode::invalid_argument);
  ASSERT_TRUE(rt_->end_capture(2).ok());
  EXPECT_TRUE(rt_->launch(*graph, 2).ok());  // an empty graph replays nothing
  EXPECT_EQ(empty.stats().ops, 0u);
}

// --- what cannot be captured ------------------------------------------------------

struct Refusal {
  const char* name;
  const char* says;  // in the message
  std::function<Result<void>(PoolCalls&, DeviceHandle)> call;  // on capturing stream 1
};

template <class T>
Result<void> as_void(Result<T> r) {
  if (!r.ok()) return std::move(r).error();
  return {};
}

std::vector<Refusal> refusals() {
  static std::vector<std::byte> host(4 * KiB);
  return {
      {"verified_upload", "verify",
       [](PoolCalls& c, DeviceHandle h) { return as_void(c.upload(1, TransferPlan().add(host, h))); }},
      {"host_wait", "host wait", [](PoolCalls& c, DeviceHandle) { return c.synchronize(1); }},
      {"download", "host", [](PoolCalls& c, DeviceHandle h) { return as_void(c.download(1, h, 0, host)); }},
      {"synchronize", "synchronize()", [](PoolCalls& c, DeviceHandle) { return c.synchronize(); }},
      {"hold", "hold", [](PoolCalls& c, DeviceHandle) { return c.hold(1); }},
      {"wait_across_streams", "wait", [](PoolCalls& c, DeviceHandle) { return c.wait(1, 2); }},
      {"allocation_that_needs_the_reclaim_ladder", "reclaim ladder",
       [](PoolCalls& c, DeviceHandle) { return as_void(c.allocate(std::uint64_t{1} << 40, 1)); }},
  };
}

TEST_P(GraphTest, WhatCannotBeCapturedIsRefusedNamingWhyAndSpoilsTheCapture) {
  const DeviceHandle h = alloc(4 * KiB, 1);
  for (const Refusal& r : refusals()) {
    SCOPED_TRACE(r.name);
    ASSERT_TRUE(rt_->begin_capture(1).ok());
    ASSERT_TRUE(calls().fill(1, h, 1).ok());
    const Ticket before = rt_->backend().submitted(1);
    Result<void> got = r.call(calls(), h);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(got.error().message.find("capturing stream 1"), std::string::npos) << got.error().message;
    EXPECT_NE(got.error().message.find(r.says), std::string::npos) << got.error().message;
    EXPECT_EQ(rt_->backend().submitted(1), before);
    auto graph = rt_->end_capture(1);
    ASSERT_FALSE(graph.ok());
    EXPECT_NE(graph.error().message.find("spoiled"), std::string::npos) << graph.error().message;
    EXPECT_NE(graph.error().message.find(r.says), std::string::npos) << graph.error().message;
  }
  // Every refusal left the streams usable.
  ASSERT_TRUE(calls().fill(1, h, 4).ok());
  EXPECT_EQ(bytes_of(h), pattern(4, 4 * KiB));
  EXPECT_TRUE(calls().free(h).ok());
}

TEST_P(GraphTest, AnUploadIsRecordedWhenNoCompareNeedsTheHost) {
  make([](RuntimeOptions& o) { o.engine.policy = IntegrityPolicy::off; });
  if (!rt_) return;
  constexpr std::uint64_t n = 4 * KiB;
  const DeviceHandle h = alloc(n, 1);
  std::vector<std::byte> host = pattern(1, n);
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  auto rec = calls().upload(1, TransferPlan().add(host, h));
  ASSERT_TRUE(rec.ok()) << rec.error().message;
  EXPECT_EQ(rec->done.ticket, 0u);
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  for (std::uint64_t seed : {2, 3}) {
    const std::vector<std::byte> want = pattern(seed, n);
    std::copy(want.begin(), want.end(), host.begin());  // read when the graph is launched
    ASSERT_TRUE(rt_->launch(*graph, 1).ok());
    ASSERT_TRUE(calls().synchronize(1).ok());
    EXPECT_EQ(bytes_of(h), pattern(seed, n));
  }
  ASSERT_TRUE(graph->destroy().ok());
  EXPECT_TRUE(calls().free(h).ok());
}

TEST_P(GraphTest, ACopyPeerWithinTheDeviceIsRecorded) {
  make([](RuntimeOptions& o) { o.engine.policy = IntegrityPolicy::off; });  // verify's compare is refused
  if (!rt_) return;
  constexpr std::uint64_t n = 4 * KiB;
  const DeviceHandle src = alloc(n, 1), dst = alloc(n, 1);
  ASSERT_TRUE(calls().fill(1, dst, 1).ok());
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  ASSERT_TRUE(calls().fill(1, src, 2).ok());
  auto copied = rt_->copy_peer(dst, 0, src, 0, n, 1);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  EXPECT_EQ(copied->done.ticket, 0u);  // recorded, not enqueued
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  EXPECT_EQ(bytes_of(dst), pattern(1, n));
  ASSERT_TRUE(calls().fill(1, src, 3).ok());
  ASSERT_TRUE(rt_->launch(*graph, 1).ok());
  EXPECT_EQ(bytes_of(dst), pattern(2, n));
  ASSERT_TRUE(graph->destroy().ok());
}

// --- the race checker follows replays ----------------------------------------------

TEST_P(GraphTest, TheRaceCheckerSeesAReplayRacingAnUncapturedOp) {
  make([](RuntimeOptions& o) { o.backend.race_check = true; });
  if (!rt_) return;
  if (!rt_->backend().info().race_checking) GTEST_SKIP() << "this backend checks no races";
  constexpr std::uint64_t n = 4 * KiB;
  const DeviceHandle a = alloc(n, 0), b = alloc(n, 0);
  ASSERT_TRUE(calls().synchronize().ok());
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  ASSERT_TRUE(calls().fill(1, a, 1).ok());
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;

  // Ordered: stream 2 waits for the replay before it reads.
  ASSERT_TRUE(rt_->launch(*graph, 1).ok());
  ASSERT_TRUE(calls().wait(2, 1).ok());
  ASSERT_TRUE(calls().compute(2, std::span<const DeviceHandle>(&a, 1), b).ok());
  ASSERT_TRUE(calls().synchronize().ok());
  EXPECT_EQ(rt_->backend().race_log()->count, 0u);

  // Unordered: the second replay writes what stream 2 reads meanwhile.
  ASSERT_TRUE(rt_->launch(*graph, 1).ok());
  ASSERT_TRUE(calls().compute(2, std::span<const DeviceHandle>(&a, 1), b).ok());
  ASSERT_TRUE(calls().synchronize().ok());
  auto log = rt_->backend().race_log();
  ASSERT_GE(log->count, 1u);
  EXPECT_EQ(log->kept.front().earlier.block.handle, a);
  ASSERT_TRUE(graph->destroy().ok());
}

// --- native graphs: a replay as one op (DeviceInfo::native_graphs) -----------------

TEST_P(GraphTest, AReplayIsOneOpWhereTheDeviceMakesNativeGraphs) {
  constexpr std::uint64_t n = 16 * KiB;
  const DeviceHandle in = alloc(n, 1), out = alloc(n, 1), copy = alloc(n, 1);
  ASSERT_TRUE(calls().synchronize(1).ok());
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  const DeviceHandle tmp = alloc(n, 1);  // the graph's own
  ASSERT_TRUE(calls().fill(1, tmp, 40).ok());
  const DeviceHandle both[] = {in, tmp};
  ASSERT_TRUE(calls().compute(1, both, out).ok());
  ASSERT_TRUE(calls().user(1, std::vector<Operand>{{out, Access::read}, {copy, Access::write}},
                           [](const KernelLaunch& l) { return testing::copy_operand(l, 1, 0); }, {}, "copy")
                  .ok());
  ASSERT_TRUE(calls().record_use(1, std::span<const DeviceHandle>(&out, 1)).ok());
  ASSERT_TRUE(calls().free(tmp).ok());
  const Ticket before_end = rt_->backend().submitted(1);
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  const bool native = rt_->backend().info().native_graphs;
  EXPECT_EQ(graph->stats().native, native) << graph->stats().per_op_reason;
  if (!native) {
    EXPECT_NE(graph->stats().per_op_reason.find("no native graphs"), std::string::npos);
    EXPECT_EQ(rt_->backend().submitted(1), before_end);
  } else {
    EXPECT_EQ(graph->stats().per_op_reason, "");
    // Built by enqueueing the ops once: a no-op ran in each one's place.
    EXPECT_GE(rt_->backend().submitted(1), before_end + graph->stats().ops);
  }
  ASSERT_TRUE(calls().synchronize(1).ok());
  EXPECT_EQ(bytes_of(out), std::vector<std::byte>(n));  // nothing recorded has run

  for (std::uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(calls().fill(1, in, 300 + i).ok());
    const Ticket before = rt_->backend().submitted(1);
    ASSERT_TRUE(rt_->launch(*graph, 1).ok());
    if (native) EXPECT_EQ(rt_->backend().submitted(1), before + 1) << "one op per replay";
    else EXPECT_GT(rt_->backend().submitted(1), before + 1);
    ASSERT_TRUE(calls().synchronize(1).ok());
    const std::vector<std::byte> want = mix_bytes({pattern(300 + i, n), pattern(40, n)}, n);
    ASSERT_EQ(bytes_of(out), want) << "replay " << i;
    ASSERT_EQ(bytes_of(copy), want) << "replay " << i;
  }
  // The graph's memory is leased by its one op as by the ops one by one: a
  // held replay keeps the pool's block from anyone else after destroy.
  ASSERT_TRUE(calls().hold(1).ok());
  ASSERT_TRUE(rt_->launch(*graph, 1).ok());
  ASSERT_TRUE(graph->destroy().ok());
  EXPECT_GE(rt_->pool().stats().pending_free_bytes, n);
  ASSERT_TRUE(calls().release(1).ok());
  ASSERT_TRUE(calls().synchronize().ok());
  EXPECT_EQ(rt_->pool().stats().pending_free_bytes, 0u);
  for (DeviceHandle h : {in, out, copy}) EXPECT_TRUE(calls().free(h).ok());
}

TEST_P(GraphTest, AGraphWithATransferReplaysOpByOpAndSaysWhy) {
  constexpr std::uint64_t n = 4 * KiB;
  const DeviceHandle a = alloc(n, 1);
  std::vector<std::byte> host(n);
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  ASSERT_TRUE(calls().fill(1, a, 6).ok());
  ASSERT_TRUE(calls().copy_to_host(1, a, host).ok());
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  EXPECT_FALSE(graph->stats().native);
  const std::string& why = graph->stats().per_op_reason;
  if (rt_->backend().info().native_graphs) {
    EXPECT_NE(why.find("op 2 (copy_to_host)"), std::string::npos) << why;
  } else {
    EXPECT_NE(why.find("no native graphs"), std::string::npos) << why;
  }
  ASSERT_TRUE(rt_->launch(*graph, 1).ok());
  ASSERT_TRUE(calls().synchronize(1).ok());
  EXPECT_EQ(host, pattern(6, n));
  ASSERT_TRUE(graph->destroy().ok());
  EXPECT_TRUE(calls().free(a).ok());
}

TEST_P(GraphTest, AFailedNativeBuildKeepsPerOpReplay) {
  if (!rt_->backend().info().native_graphs) GTEST_SKIP() << "this device makes no native graphs";
  // A kernel that fails when its graph is built (on sim, when it is applied): on
  // cuda the build calls it, on the sim only a launch does.
  constexpr std::uint64_t n = 4 * KiB;
  const DeviceHandle a = alloc(n, 1);
  int calls_made = 0;
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  ASSERT_TRUE(calls().user(1, std::vector<Operand>{{a, Access::write}},
                           [&calls_made](const KernelLaunch&) -> Result<void> {
                             ++calls_made;
                             return make_error(ErrorCode::backend_error, "this kernel cannot be captured");
                           },
                           {}, "refuses")
                  .ok());
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  if (!rt_->backend().info().host_visible) {
    EXPECT_FALSE(graph->stats().native);
    EXPECT_NE(graph->stats().per_op_reason.find("cannot be captured"), std::string::npos)
        << graph->stats().per_op_reason;
  }
  ASSERT_TRUE(rt_->launch(*graph, 1).ok());
  Result<void> r = calls().synchronize(1);
  (void)r;
  EXPECT_GE(calls_made, 1);
  auto w = rt_->backend().wait(StreamPoint{1, rt_->backend().submitted(1)}, std::chrono::seconds(10));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().message.find("cannot be captured"), std::string::npos) << w.error().message;
  ASSERT_TRUE(graph->destroy().ok());
  EXPECT_TRUE(calls().free(a).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, GraphTest, FERRY_BACKENDS);
INSTANTIATE_TEST_SUITE_P(NativeGraphs, GraphTest, ::testing::Values(std::string(kSimGraphs)),
                         testing::backend_name);

// --- the hold layer's part: ops kept for a graph, no-ops in their place -----------

TEST(NativeGraphHoldLayer, KeptOpsTakeTicketsRunNothingAndBuildOneGraph) {
  BackendSpec spec = testing::backend_spec("sim");
  spec.sim_native_graphs = true;
  auto made = make_backend(spec);
  ASSERT_TRUE(made.ok()) << made.error().message;
  Backend& b = **made;
  ASSERT_TRUE(b.info().native_graphs);
  auto base = b.reserve_address(1 << 20);
  ASSERT_TRUE(base.ok());
  ASSERT_TRUE(b.map(*base, 1 << 20).ok());
  const DeviceRange r{*base, 4 * KiB};

  EXPECT_EQ(b.end_graph(1).error().code, ErrorCode::invalid_argument);  // keeps nothing
  EXPECT_EQ(b.begin_graph(kMaxStreams).error().code, ErrorCode::invalid_argument);
  ASSERT_TRUE(b.begin_graph(1).ok());
  EXPECT_EQ(b.begin_graph(1).error().code, ErrorCode::invalid_argument);
  auto t = b.enqueue(1, FillOp{r, 7});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, 1u);
  ASSERT_TRUE(b.wait({1, *t}, std::chrono::seconds(1)).ok());  // a no-op carried its ticket
  auto g = b.end_graph(1);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g->ops, 1u);
  EXPECT_EQ(g->mem_bytes, r.bytes);  // a fill states no cost: one pass
  std::vector<std::byte> host(r.bytes);
  ASSERT_TRUE(b.enqueue(1, CopyToHostOp{host.data(), r}).ok());  // runs again: not kept
  ASSERT_TRUE(b.synchronize().ok());
  EXPECT_EQ(host, std::vector<std::byte>(r.bytes));  // the fill did not run

  // The graph's launch: one user op over the range.
  ASSERT_TRUE(b.enqueue(1, UserOp{{UserOperand{r, Access::read_write}}, g->launch, 0, 0, "graph"}).ok());
  ASSERT_TRUE(b.enqueue(1, CopyToHostOp{host.data(), r}).ok());
  ASSERT_TRUE(b.synchronize().ok());
  EXPECT_EQ(host, pattern(7, r.bytes));

  // Host memory is refused, naming the op; the stream runs its ops after.
  ASSERT_TRUE(b.begin_graph(1).ok());
  ASSERT_TRUE(b.enqueue(1, CopyToHostOp{host.data(), r}).ok());
  auto refused = b.end_graph(1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::unsupported);
  EXPECT_NE(refused.error().message.find("copy_to_host"), std::string::npos) << refused.error().message;
  ASSERT_TRUE(b.enqueue(1, FillOp{r, 8}).ok());
  ASSERT_TRUE(b.enqueue(1, CopyToHostOp{host.data(), r}).ok());
  ASSERT_TRUE(b.synchronize().ok());
  EXPECT_EQ(host, pattern(8, r.bytes));
}

TEST(NativeGraphHoldLayer, ADeviceWithoutNativeGraphsSaysSo) {
  auto made = make_backend(testing::backend_spec("sim"));
  ASSERT_TRUE(made.ok());
  EXPECT_FALSE((*made)->info().native_graphs);
  Result<void> r = (*made)->begin_graph(1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::unsupported);
}

}  // namespace
}  // namespace ferry
