#include "ferry/stream_order.hpp"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ferry
