// A graph's private pool reuses what its captures freed for any later allocation
// of them that fits (graph.hpp): a smaller one gets a part of a freed block (a
// sub-block, DevicePool::sub_block), several pack into one, a larger one does
// not take it, nothing outside the pool ever does, a later capture sharing the
// pool reuses it, a freed part's handle is stale, the race checker sees parts as
// their ranges, and the pool's stats follow. Written once, run on every backend
// (cuda SKIPs without a GPU) and on the sim with native graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "graph_fixture.hpp"
#include "ferry/graph.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/pool_calls.hpp"
#include "ferry/runtime.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

using testing::mix_bytes;
using testing::pattern;

constexpr std::uint64_t KiB = 1024;
using testing::kSimGraphs;

class GraphPoolTest : public testing::GraphFixture {
 protected:
  void TearDown() override {
    if (!rt_) return;
    std::string why;
    EXPECT_TRUE(rt_->pool().validate(&why)) << why;
  }

  std::uint64_t addr(DeviceHandle h) {
    auto s = rt_->pool().resolve(h);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return s.ok() ? s->addr : 0;
  }
  // [addr(h), +bytes) lies inside [base, +range).
  static bool inside(std::uint64_t a, std::uint64_t bytes, std::uint64_t base, std::uint64_t range) {
    return a >= base && a + bytes <= base + range;
  }
  // A capture's temporary: allocated, filled with `seed`, mixed into `out`, freed.
  void temporary(std::uint64_t bytes, std::uint64_t seed, DeviceHandle out, std::uint64_t* at = nullptr) {
    const DeviceHandle t = alloc(bytes, 1);
    if (at) *at = addr(t);
    ASSERT_TRUE(calls().fill(1, t, seed).ok());
    ASSERT_TRUE(calls().compute(1, std::span<const DeviceHandle>(&t, 1), out).ok());
    ASSERT_TRUE(calls().free(t).ok());
  }
};

TEST_P(GraphPoolTest, ASmallerAllocationReusesPartOfABlockFreedInTheCapture) {
  constexpr std::uint64_t big = 64 * KiB, small = 16 * KiB;
  const DeviceHandle out1 = alloc(big, 1), out2 = alloc(small, 1);
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  std::uint64_t base = 0;
  temporary(big, 5, out1, &base);
  const DeviceHandle part = alloc(small, 1);  // inside the freed block
  EXPECT_TRUE(inside(addr(part), small, base, big));
  ASSERT_TRUE(calls().fill(1, part, 6).ok());
  const DeviceHandle in[] = {out1, part};
  ASSERT_TRUE(calls().compute(1, in, out2).ok());
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  const GraphPoolStats ps = graph->pool().stats();
  EXPECT_EQ(ps.blocks, 1u);
  EXPECT_EQ(ps.reserved_bytes, big);
  EXPECT_EQ(ps.allocated_bytes, small);  // the part the program holds

  // Never outside the pool: no allocation elsewhere lands in the block.
  for (StreamId s : {StreamId{1}, StreamId{2}}) {
    for (std::uint64_t n : {small, 4 * KiB, big}) {
      const DeviceHandle o = alloc(n, s);
      EXPECT_FALSE(inside(addr(o), 1, base, big)) << n << " bytes on stream " << s;
      EXPECT_TRUE(calls().free(o).ok());
    }
  }

  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(rt_->launch(*graph, 1).ok()) << "replay " << i;
  ASSERT_TRUE(calls().synchronize(1).ok());
  const std::vector<std::byte> first = mix_bytes({pattern(5, big)}, big);
  EXPECT_EQ(bytes_of(out1), first);
  EXPECT_EQ(bytes_of(part), pattern(6, small));  // its bytes, after the whole block's fill of every replay
  EXPECT_EQ(bytes_of(out2), mix_bytes({first, pattern(6, small)}, small));
  EXPECT_EQ(graph->stats().launches, 1000u);
  ASSERT_TRUE(graph->destroy().ok());
  for (DeviceHandle h : {out1, out2, part}) EXPECT_TRUE(calls().free(h).ok());
}

TEST_P(GraphPoolTest, TwoSmallerAllocationsPackIntoOneFreedBlockAndALargerOneDoesNotTakeIt) {
  constexpr std::uint64_t big = 64 * KiB;
  const DeviceHandle out = alloc(big, 1);
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  std::uint64_t base = 0;
  temporary(big, 1, out, &base);
  const DeviceHandle a = alloc(20 * KiB, 1), b = alloc(30 * KiB, 1);
  EXPECT_TRUE(inside(addr(a), 20 * KiB, base, big));
  EXPECT_TRUE(inside(addr(b), 30 * KiB, base, big));
  EXPECT_TRUE(addr(a) + 20 * KiB <= addr(b) || addr(b) + 30 * KiB <= addr(a));  // apart
  const DeviceHandle larger = alloc(big + 4 * KiB, 1);  // fits no free range of the block
  EXPECT_FALSE(inside(addr(larger), 1, base, big));
  const DeviceHandle rest = alloc(20 * KiB, 1);  // 14 KiB are left in the block: elsewhere
  EXPECT_FALSE(inside(addr(rest), 1, base, big));
  const DeviceHandle fits = alloc(14 * KiB, 1);  // exactly what is left
  EXPECT_TRUE(inside(addr(fits), 14 * KiB, base, big));
  ASSERT_TRUE(calls().fill(1, a, 2).ok());
  ASSERT_TRUE(calls().fill(1, b, 3).ok());
  ASSERT_TRUE(calls().fill(1, fits, 4).ok());
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  const GraphPoolStats ps = graph->pool().stats();
  EXPECT_EQ(ps.blocks, 3u);  // the freed one, the larger one, the rest
  EXPECT_EQ(ps.reserved_bytes, big + (big + 4 * KiB) + 20 * KiB);
  EXPECT_EQ(ps.allocated_bytes, 20 * KiB + 30 * KiB + 14 * KiB + (big + 4 * KiB) + 20 * KiB);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(rt_->launch(*graph, 1).ok());
  ASSERT_TRUE(calls().synchronize(1).ok());
  EXPECT_EQ(bytes_of(a), pattern(2, 20 * KiB));
  EXPECT_EQ(bytes_of(b), pattern(3, 30 * KiB));
  EXPECT_EQ(bytes_of(fits), pattern(4, 14 * KiB));
  ASSERT_TRUE(graph->destroy().ok());
  for (DeviceHandle h : {out, a, b, larger, rest, fits}) EXPECT_TRUE(calls().free(h).ok());
}

TEST_P(GraphPoolTest, AFreedPartIsStaleAndItsRangeIsTheCapturesAgain) {
  constexpr std::uint64_t big = 32 * KiB, small = 8 * KiB;
  const DeviceHandle out = alloc(big, 1);
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  std::uint64_t base = 0;
  temporary(big, 1, out, &base);
  const DeviceHandle part = alloc(small, 1);
  const std::uint64_t at = addr(part);
  ASSERT_TRUE(calls().fill(1, part, 2).ok());
  ASSERT_TRUE(calls().free(part).ok());
  EXPECT_EQ(rt_->pool().resolve(part).error().code, ErrorCode::stale_handle);  // I1
  EXPECT_EQ(calls().free(part).error().code, ErrorCode::stale_handle);
  const DeviceHandle again = alloc(small, 1);  // the best fit is the range just freed
  EXPECT_NE(again, part);
  EXPECT_EQ(addr(again), at);
  EXPECT_EQ(rt_->pool().resolve(part).error().code, ErrorCode::stale_handle);
  ASSERT_TRUE(calls().fill(1, again, 3).ok());
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  ASSERT_TRUE(rt_->launch(*graph, 1).ok());  // the first part's fill follows its range
  ASSERT_TRUE(calls().synchronize(1).ok());
  EXPECT_EQ(bytes_of(again), pattern(3, small));

  // The pool's last graph goes while the program holds a part: the block stays
  // until the part is freed, then goes with it.
  const std::uint64_t live = rt_->pool().stats().allocated_bytes;
  ASSERT_TRUE(graph->destroy().ok());
  EXPECT_EQ(rt_->pool().stats().allocated_bytes, live);
  ASSERT_EQ(GraphPool::all(*rt_).size(), 1u);
  EXPECT_EQ(GraphPool::all(*rt_)[0].allocated_bytes, small);
  EXPECT_EQ(bytes_of(again), pattern(3, small));
  ASSERT_TRUE(calls().free(again).ok());
  EXPECT_EQ(rt_->pool().resolve(again).error().code, ErrorCode::stale_handle);
  EXPECT_EQ(rt_->pool().stats().allocated_bytes, live - big);
  EXPECT_TRUE(GraphPool::all(*rt_).empty());
  EXPECT_TRUE(calls().free(out).ok());
}

TEST_P(GraphPoolTest, PartsHeldPastThePoolsLastGraphKeepItsBlockForALaterCaptureOfThePool) {
  constexpr std::uint64_t big = 32 * KiB, small = 8 * KiB;
  const DeviceHandle out = alloc(big, 1);
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  std::uint64_t base = 0;
  temporary(big, 1, out, &base);
  const DeviceHandle a = alloc(small, 1), b = alloc(small, 1);
  auto g1 = rt_->end_capture(1);
  ASSERT_TRUE(g1.ok()) << g1.error().message;
  const GraphPool pool = g1->pool();
  ASSERT_TRUE(g1->destroy().ok());
  ASSERT_EQ(GraphPool::all(*rt_).size(), 1u);  // the program holds two parts of its block
  ASSERT_TRUE(calls().free(a).ok());
  EXPECT_EQ(rt_->pool().resolve(a).error().code, ErrorCode::stale_handle);

  ASSERT_TRUE(rt_->begin_capture(1, CaptureOptions{pool}).ok());
  const DeviceHandle c = alloc(small, 1);  // where a was
  EXPECT_TRUE(inside(addr(c), small, base, big));
  EXPECT_NE(c, a);
  ASSERT_TRUE(calls().fill(1, c, 7).ok());
  auto g2 = rt_->end_capture(1);
  ASSERT_TRUE(g2.ok()) << g2.error().message;
  ASSERT_TRUE(rt_->launch(*g2, 1).ok());
  ASSERT_TRUE(calls().synchronize(1).ok());
  EXPECT_EQ(bytes_of(c), pattern(7, small));
  ASSERT_TRUE(g2->destroy().ok());
  const std::uint64_t live = rt_->pool().stats().allocated_bytes;
  ASSERT_TRUE(calls().free(b).ok());
  EXPECT_EQ(rt_->pool().stats().allocated_bytes, live);  // c still holds the block
  ASSERT_TRUE(calls().free(c).ok());
  EXPECT_EQ(rt_->pool().stats().allocated_bytes, live - big);
  EXPECT_TRUE(GraphPool::all(*rt_).empty());
  EXPECT_TRUE(calls().free(out).ok());
}

TEST_P(GraphPoolTest, ALaterCaptureSharingThePoolReusesPartOfIt) {
  constexpr std::uint64_t big = 64 * KiB, small = 24 * KiB;
  const DeviceHandle out1 = alloc(big, 1), out2 = alloc(small, 1);
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  std::uint64_t base = 0;
  temporary(big, 31, out1, &base);
  auto g1 = rt_->end_capture(1);
  ASSERT_TRUE(g1.ok()) << g1.error().message;

  ASSERT_TRUE(rt_->begin_capture(1, CaptureOptions{g1->pool()}).ok());
  std::uint64_t at = 0;
  temporary(small, 32, out2, &at);  // a decode graph of a smaller batch
  EXPECT_TRUE(inside(at, small, base, big));
  auto g2 = rt_->end_capture(1);
  ASSERT_TRUE(g2.ok()) << g2.error().message;
  const GraphPoolStats ps = g2->pool().stats();
  EXPECT_EQ(ps.blocks, 1u);
  EXPECT_EQ(ps.reserved_bytes, big);
  EXPECT_EQ(ps.allocated_bytes, 0u);
  EXPECT_EQ(ps.graphs, 2u);

  for (int i = 0; i < 3; ++i) {  // one after another, each on the shared bytes
    ASSERT_TRUE(rt_->launch(*g1, 1).ok());
    ASSERT_TRUE(rt_->launch(*g2, 1).ok());
  }
  ASSERT_TRUE(calls().synchronize(1).ok());
  EXPECT_EQ(bytes_of(out1), mix_bytes({pattern(31, big)}, big));
  EXPECT_EQ(bytes_of(out2), mix_bytes({pattern(32, small)}, small));
  ASSERT_TRUE(g1->destroy().ok());
  ASSERT_TRUE(rt_->launch(*g2, 1).ok());  // the part still resolves: its block is the pool's
  ASSERT_TRUE(g2->destroy().ok());
  EXPECT_TRUE(GraphPool::all(*rt_).empty());
  ASSERT_TRUE(calls().synchronize(1).ok());
  EXPECT_EQ(bytes_of(out2), mix_bytes({pattern(32, small)}, small));
  for (DeviceHandle h : {out1, out2}) EXPECT_TRUE(calls().free(h).ok());
}

TEST_P(GraphPoolTest, TheRaceCheckerSeesPartsAsTheirRanges) {
  make([](RuntimeOptions& o) { o.backend.race_check = true; });
  if (!rt_) return;
  if (!rt_->backend().info().race_checking) GTEST_SKIP() << "this backend checks no races";
  constexpr std::uint64_t big = 32 * KiB, half = 16 * KiB;
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  const DeviceHandle whole = alloc(big, 1);
  ASSERT_TRUE(calls().fill(1, whole, 1).ok());
  ASSERT_TRUE(calls().free(whole).ok());
  const DeviceHandle a = alloc(half, 1), b = alloc(half, 1);  // the two halves
  ASSERT_TRUE(calls().fill(1, a, 2).ok());  // over the whole block's range, as recorded
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  ASSERT_TRUE(rt_->launch(*graph, 1).ok());
  ASSERT_TRUE(rt_->launch(*graph, 1).ok());
  ASSERT_TRUE(calls().synchronize().ok());
  EXPECT_EQ(rt_->backend().race_log()->count, 0u);  // a replay's ops are ordered as recorded

  // Two parts of one block on two streams, unordered: apart, so no race.
  ASSERT_TRUE(calls().fill(1, a, 3).ok());
  ASSERT_TRUE(calls().fill(2, b, 4).ok());
  ASSERT_TRUE(calls().synchronize().ok());
  EXPECT_EQ(rt_->backend().race_log()->count, 0u);

  // A part against the block's replayed fill, unordered: a race on the part's range.
  ASSERT_TRUE(rt_->launch(*graph, 1).ok());
  ASSERT_TRUE(calls().fill(2, b, 5).ok());
  ASSERT_TRUE(calls().synchronize().ok());
  auto log = rt_->backend().race_log();
  ASSERT_GE(log->count, 1u);
  const auto span_b = rt_->pool().resolve(b);
  ASSERT_TRUE(span_b.ok());
  EXPECT_GE(log->kept.front().addr, span_b->addr);
  EXPECT_LE(log->kept.front().addr + log->kept.front().bytes, span_b->addr + half);
  ASSERT_TRUE(graph->destroy().ok());
  for (DeviceHandle h : {a, b}) EXPECT_TRUE(calls().free(h).ok());
}

// Issue 41 item 11: memory the program used on its own stream and then freed
// inside a capture is handed to a later capture of the pool; that capture's
// replay on another stream is ordered after the program's use (I2/I3), as a
// direct allocation reusing it would be. Whole blocks and parts alike.
TEST_P(GraphPoolTest, AReplayOnAnotherStreamFollowsTheProgramsUseOfMemoryItFreed) {
  make([](RuntimeOptions& o) { o.backend.race_check = true; });
  if (!rt_) return;
  if (!rt_->backend().info().race_checking) GTEST_SKIP() << "this backend checks no races";
  constexpr std::uint64_t big = 32 * KiB, half = 16 * KiB;
  for (const std::uint64_t later : {big, half}) {
    SCOPED_TRACE(later == big ? "reused whole" : "reused as a part");
    ASSERT_TRUE(rt_->begin_capture(1).ok());
    const DeviceHandle x = alloc(big, 1);  // the pool's, the program's until it frees it
    auto g1 = rt_->end_capture(1);
    ASSERT_TRUE(g1.ok()) << g1.error().message;
    const auto x_at = rt_->pool().resolve(x);
    ASSERT_TRUE(x_at.ok());
    ASSERT_TRUE(calls().fill(1, x, 2).ok());  // the program's own use, on its stream
    ASSERT_TRUE(rt_->begin_capture(1, CaptureOptions{g1->pool()}).ok());
    ASSERT_TRUE(calls().free(x).ok());  // freed inside a capture: the pool keeps it
    auto g2 = rt_->end_capture(1);
    ASSERT_TRUE(g2.ok()) << g2.error().message;

    ASSERT_TRUE(rt_->begin_capture(2, CaptureOptions{g1->pool()}).ok());
    const DeviceHandle y = alloc(later, 2);
    ASSERT_TRUE(calls().fill(2, y, 3).ok());
    auto g3 = rt_->end_capture(2);
    ASSERT_TRUE(g3.ok()) << g3.error().message;
    const auto y_at = rt_->pool().resolve(y);
    ASSERT_TRUE(y_at.ok());
    ASSERT_EQ(y_at->addr, x_at->addr) << "the later capture did not reuse the freed memory";

    const std::uint64_t before = rt_->backend().race_log()->count;
    ASSERT_TRUE(rt_->launch(*g3, 2).ok());
    ASSERT_TRUE(calls().synchronize().ok());
    EXPECT_EQ(rt_->backend().race_log()->count, before)
        << "the replay on stream 2 raced the program's fill on stream 1 of memory it had freed";
    EXPECT_EQ(bytes_of(y, 2), pattern(3, later));
    for (Graph* g : {&*g1, &*g2, &*g3}) ASSERT_TRUE(g->destroy().ok());
    EXPECT_TRUE(calls().free(y).ok());
    ASSERT_TRUE(calls().synchronize().ok());
  }
}

// What a pool that reuses a freed block only for the same size reserves for a
// capture's temporaries (each allocated, used, freed, in order): the rule this
// pool followed before parts, kept here as the baseline.
std::uint64_t same_size_only_reserved(const std::vector<std::uint64_t>& sizes) {
  std::vector<std::uint64_t> blocks;  // every size reserved; all freed again before the next
  for (std::uint64_t n : sizes) {
    if (std::find(blocks.begin(), blocks.end(), n) == blocks.end()) blocks.push_back(n);
  }
  std::uint64_t total = 0;
  for (std::uint64_t n : blocks) total += n;
  return total;
}

TEST_P(GraphPoolTest, ADecodeCaptureWithShrinkingTemporariesReservesItsLargestOnly) {
  // A decode step's temporaries: per layer an activation that shrinks as the
  // step goes (attention scratch, then the MLP's, then the logits' chunks).
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t n = 256 * KiB; n >= 16 * KiB; n = n * 3 / 4 / 256 * 256) sizes.push_back(n);
  const DeviceHandle out = alloc(16 * KiB, 1);
  ASSERT_TRUE(rt_->begin_capture(1).ok());
  for (std::size_t i = 0; i < sizes.size(); ++i) temporary(sizes[i], 40 + i, out);
  auto graph = rt_->end_capture(1);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  const std::uint64_t reserved = graph->pool().stats().reserved_bytes;
  const std::uint64_t baseline = same_size_only_reserved(sizes);
  EXPECT_EQ(reserved, sizes.front());  // every later temporary fits the first one's block
  EXPECT_LT(reserved, baseline);
  std::printf("graph pool reserved for %zu shrinking temporaries (%llu .. %llu bytes): %llu bytes with parts, "
              "%llu bytes same-size-only (%.1fx)\n",
              sizes.size(), static_cast<unsigned long long>(sizes.front()),
              static_cast<unsigned long long>(sizes.back()), static_cast<unsigned long long>(reserved),
              static_cast<unsigned long long>(baseline), static_cast<double>(baseline) / static_cast<double>(reserved));
  RecordProperty("reserved_bytes_with_parts", std::to_string(reserved));
  RecordProperty("reserved_bytes_same_size_only", std::to_string(baseline));

  ASSERT_TRUE(rt_->launch(*graph, 1).ok());
  ASSERT_TRUE(calls().synchronize(1).ok());
  EXPECT_EQ(bytes_of(out), mix_bytes({pattern(40 + sizes.size() - 1, sizes.back())}, 16 * KiB));
  ASSERT_TRUE(graph->destroy().ok());
  EXPECT_TRUE(calls().free(out).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, GraphPoolTest, FERRY_BACKENDS);
INSTANTIATE_TEST_SUITE_P(NativeGraphs, GraphPoolTest, ::testing::Values(std::string(kSimGraphs)),
                         testing::backend_name);

}  // namespace
}  // namespace ferry
