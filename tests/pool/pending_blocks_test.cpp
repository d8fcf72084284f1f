// Pending blocks on their own: keys filed with open leases, retired as the work
// they name completes. No pool and no arena; the leases are real stream points of
// a sim device whose streams hold their work until a test waits for it.
#include "pool/pending_blocks.hpp"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "ferry/sim_backend.hpp"

namespace ferry::detail {
namespace {

class PendingBlocksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = sim->reserve_address(1 << 20);
    ASSERT_TRUE(b.ok());
    base = *b;
    ASSERT_TRUE(sim->map(base, 1 << 20).ok());
    for (StreamId s = 0; s < 4; ++s) sim->set_hold(s, true);
  }

  // Work on stream s, held until a wait for it: not complete before.
  StreamPoint work(StreamId s) {
    auto t = order.submit(s, [&](Ticket) -> Result<Op> { return Op{FillOp{{base, 4096}, 1}}; });
    EXPECT_TRUE(t.ok());
    return {s, t.ok() ? *t : 0};
  }
  void complete(StreamPoint p) { ASSERT_TRUE(order.wait(p).ok()); }

  PendingBlocks<int>::Id file(int key, std::initializer_list<StreamPoint> points) {
    for (const StreamPoint& p : points) uses[key].add(p);
    const auto id = pending.file(key, uses[key]);
    ids[key] = id;
    return id;
  }
  std::vector<int> retire() {
    std::vector<int> out;
    pending.retire(order, [&](int k) -> UseSet& { return uses.at(k); }, [&](int k) {
      out.push_back(k);
      ids.erase(k);
    });
    return out;
  }
  bool valid(std::string* why) const {
    return pending.validate([&](int k) -> const UseSet& { return uses.at(k); },
                            [&](int k) { return ids.at(k); }, why);
  }
  void check() const {
    std::string why;
    EXPECT_TRUE(valid(&why)) << why;
  }

  std::unique_ptr<SimBackend> sim = make_sim_backend({*find_profile("tiny"), 1, {}});
  StreamOrder order{*sim};
  std::uint64_t base = 0;
  PendingBlocks<int> pending;
  std::map<int, UseSet> uses;  // the owner's leases, by key
  std::map<int, PendingBlocks<int>::Id> ids;
};

TEST_F(PendingBlocksTest, RetiresWhatCompletedInTicketOrderAndKeepsTheRest) {
  const StreamPoint a = work(1), b = work(1);
  complete(b);  // a and b
  const StreamPoint c = work(1);
  file(3, {c});
  file(2, {b});
  file(1, {a});
  EXPECT_FALSE(pending.empty());
  EXPECT_EQ(pending.size(), 3u);
  check();
  EXPECT_EQ(retire(), (std::vector<int>{1, 2}));
  EXPECT_EQ(pending.size(), 1u);
  check();
  EXPECT_TRUE(retire().empty());
  complete(c);
  EXPECT_EQ(retire(), (std::vector<int>{3}));
  EXPECT_TRUE(pending.empty());
  check();
}

// Each stream is its own heap: one stream's completion retires nothing on another.
TEST_F(PendingBlocksTest, StreamsRetireApart) {
  const StreamPoint a = work(1), b = work(2);
  file(1, {a});
  file(2, {b});
  complete(b);
  EXPECT_EQ(retire(), (std::vector<int>{2}));
  complete(a);
  EXPECT_EQ(retire(), (std::vector<int>{1}));
}

// A block leased on two streams retires once both completed; when one did, it
// narrows to the other stream's heap (validate checks it is filed there).
TEST_F(PendingBlocksTest, ABlockLeasedOnSeveralStreamsNarrowsThenRetires) {
  const StreamPoint a = work(1), b = work(2);
  file(7, {a, b});
  check();
  EXPECT_TRUE(retire().empty());
  complete(a);
  EXPECT_TRUE(retire().empty());
  ASSERT_EQ(uses.at(7).points().size(), 1u);  // pruned to stream 2's lease
  check();
  complete(b);
  EXPECT_EQ(retire(), (std::vector<int>{7}));
  check();
}

TEST_F(PendingBlocksTest, RemoveTakesAKeyOutBeforeItsLeasesRetire) {
  const StreamPoint a = work(1), b = work(2), c = work(3);
  file(1, {a});
  file(2, {a});
  file(3, {b, c});
  pending.remove(ids.at(1));
  ids.erase(1);
  pending.remove(ids.at(3));
  ids.erase(3);
  EXPECT_EQ(pending.size(), 1u);
  check();
  const auto reused = file(4, {b});  // a removed entry is handed out again
  EXPECT_TRUE(reused == 0 || reused == 2);
  complete(a);
  complete(b);
  complete(c);
  const std::vector<int> retired = retire();
  EXPECT_EQ(retired.size(), 2u);
  EXPECT_TRUE(pending.empty());
  std::vector<int> seen;
  pending.for_each([&](int k) { seen.push_back(k); });
  EXPECT_TRUE(seen.empty());
}

TEST_F(PendingBlocksTest, ValidateCatchesLeasesThatChangedBehindItsBack) {
  const StreamPoint a = work(1), b = work(2);
  file(1, {a});
  file(2, {a, b});
  check();
  std::vector<int> seen;
  pending.for_each([&](int k) { seen.push_back(k); });
  EXPECT_EQ(seen, (std::vector<int>{2, 1}));  // multi-stream first
  std::string why;
  uses.at(1).add(b);  // filed on stream 1's heap, now leased on stream 2 too
  EXPECT_FALSE(valid(&why));
  EXPECT_EQ(why, "block pending on one stream holds a lease on another, or its key is stale");
  uses.at(1) = UseSet{};
  uses.at(1).add(a);
  std::swap(ids.at(1), ids.at(2));  // the owner recorded the wrong entries
  EXPECT_FALSE(valid(&why));
  EXPECT_EQ(why, "a pending block's entry is not its own");
}

}  // namespace
}  // namespace ferry::detail
