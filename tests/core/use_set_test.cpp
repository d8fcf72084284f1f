#include "ferry/stream_order.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "ferry/content.hpp"

#include "ferry/sim_backend.hpp"

namespace ferry {
namespace {

TEST(UseSet, KeepsTheLatestTicketPerStream) {
  UseSet u;
  u.add({0, 3});
  u.add({0, 1});
  u.add({2, 5});
  ASSERT_EQ(u.points().size(), 2u);
  EXPECT_EQ(u.points()[0], (StreamPoint{0, 3}));
  EXPECT_FALSE(u.single_stream());
}

TEST(UseSet, SpillsBeyondInlineStorage) {
  UseSet u;
  for (StreamId s = 0; s < 10; ++s) u.add({s, s + 1});
  EXPECT_EQ(u.points().size(), 10u);
  u.add({7, 100});
  EXPECT_EQ(u.points().size(), 10u);
}

TEST(StreamOrder, RetiresOnlyCompletedWork) {
  auto sim = make_sim_backend({*find_profile("tiny"), 1, {}});
  StreamOrder order(*sim);
  auto base = sim->reserve_address(1 << 20);
  ASSERT_TRUE(base.ok());
  ASSERT_TRUE(sim->map(*base, 1 << 20).ok());
  sim->set_hold(1, true);
  auto t = order.submit(1, [&](Ticket) -> Result<Op> { return Op{FillOp{{*base, 4096}, 1}}; });
  ASSERT_TRUE(t.ok());
  UseSet u;
  u.add({1, *t});
  EXPECT_FALSE(u.retire(order));  // held in the host queue: not complete (I2)
  ASSERT_TRUE(order.wait(u).ok());  // wait dispatches held work it waits for
  EXPECT_TRUE(u.retire(order));
  EXPECT_TRUE(u.empty());
}

// order_after leaves a point's held work in its queue unless asked to dispatch it
// (HeldWork::dispatch, the pool's reuse of a block whose old work is held): a
// wait behind held work cannot finish, so waiting on it is refused at once.
TEST(StreamOrder, OrderAfterDispatchesHeldWorkOnlyWhenAsked) {
  for (const StreamOrder::HeldWork held : {StreamOrder::HeldWork::stays, StreamOrder::HeldWork::dispatch}) {
    auto sim = make_sim_backend({*find_profile("tiny"), 1, {}});
    StreamOrder order(*sim);
    auto base = sim->reserve_address(1 << 20);
    ASSERT_TRUE(base.ok());
    ASSERT_TRUE(sim->map(*base, 1 << 20).ok());
    sim->set_hold(1, true);
    auto t = order.submit(1, [&](Ticket) -> Result<Op> { return Op{FillOp{{*base, 4096}, 1}}; });
    ASSERT_TRUE(t.ok());
    auto w = order.order_after(0, {1, *t}, held);
    ASSERT_TRUE(w.ok());
    ASSERT_NE(*w, 0u);  // the fill is not complete: a wait was needed either way
    const Result<void> waited = order.wait({0, *w});
    if (held == StreamOrder::HeldWork::dispatch) {
      EXPECT_TRUE(waited.ok()) << waited.error().message;
      EXPECT_TRUE(order.is_complete({1, *t}));
    } else {
      ASSERT_FALSE(waited.ok());
      EXPECT_EQ(waited.error().code, ErrorCode::timeout);
      EXPECT_FALSE(order.is_complete({1, *t}));
    }
    EXPECT_EQ(order.order_after(0, {0, *t}, held).value_or(1), 0u);  // own stream: never a wait
  }
}

TEST(StreamOrder, AFailedPrepareStillConsumesItsTicket) {
  auto sim = make_sim_backend({*find_profile("tiny"), 1, {}});
  StreamOrder order(*sim);
  auto bad = order.submit(0, [&](Ticket) -> Result<Op> {
    return make_error(ErrorCode::stale_handle, "test");
  });
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::stale_handle);
  EXPECT_EQ(sim->submitted(0), 1u);
  EXPECT_TRUE(order.wait({0, 1}).ok());
  EXPECT_FALSE(order.submit(kMaxStreams, [](Ticket) -> Result<Op> { return Op{NopOp{}}; }).ok());
}

// Issue 15 item 6, a test for ThreadSanitizer (tools/ci-tsan): one thread waits
// for a hash and so caches its completion; another learns of it only through the
// cached cursor (the flag below is relaxed: it orders nothing) and reads the
// result. The cursor's release/acquire is the only happens-before between the
// sim's write and that read; with relaxed there, TSan reports the race.
TEST(StreamOrder, ACompletionSeenOnAnotherThreadCarriesWhatItsOpWrote) {
  auto sim = make_sim_backend({*find_profile("tiny"), 1, {}});
  StreamOrder order(*sim);
  auto base = sim->reserve_address(1 << 20);
  ASSERT_TRUE(base.ok());
  ASSERT_TRUE(sim->map(*base, 1 << 20).ok());
  std::vector<std::byte> expected(4096);
  fill_pattern(9, 0, expected);
  for (int round = 0; round < 20; ++round) {
    auto result = std::make_unique<std::uint64_t>(0);
    ASSERT_TRUE(order.submit(0, [&](Ticket) -> Result<Op> { return Op{FillOp{{*base, 4096}, 9}}; }).ok());
    auto t = order.submit(0, [&](Ticket) -> Result<Op> { return Op{HashOp{{*base, 4096}, result.get()}}; });
    ASSERT_TRUE(t.ok());
    std::atomic<bool> waited{false};
    std::uint64_t seen = 0;
    std::thread reader([&] {
      while (!waited.load(std::memory_order_relaxed)) std::this_thread::yield();
      if (order.is_complete({0, *t})) seen = *result;
    });
    ASSERT_TRUE(order.wait({0, *t}).ok());
    waited.store(true, std::memory_order_relaxed);
    reader.join();
    EXPECT_EQ(seen, content_hash(expected)) << "round " << round;
  }
}

}  // namespace
}  // namespace ferry
