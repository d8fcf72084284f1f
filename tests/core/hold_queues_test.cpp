// The hold layer (holding_backend.hpp) against a scripted device: held ops keep
// their tickets, a wait on held work blocks its stream without breaking the hold,
// a held op that fails when issued still takes its ticket (a no-op stands in) and
// becomes the stream's fault, and a device that fails even the no-op breaks only
// that stream.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "ferry/holding_backend.hpp"
#include "ferry/op_contract.hpp"

namespace ferry {
namespace {

constexpr auto kForever = std::chrono::nanoseconds::max();

// Issues go into a log; work completes the moment it is issued. fail_issues
// makes that many of the next issues fail.
class ScriptedDevice final : public HoldQueues::Device {
 public:
  struct Issued {
    StreamId stream;
    Ticket ticket;
    std::string kind;
  };
  std::vector<Issued> log;
  int fail_issues = 0;
  Ticket skew = 0;  // added to every ticket the device returns: a misnumbering device
  std::array<Ticket, kMaxStreams> issued{};

  Result<void> admit(StreamId, const Op&) override { return {}; }
  Result<Ticket> issue(StreamId stream, Op op) override {
    if (fail_issues > 0) {
      --fail_issues;
      return make_error(ErrorCode::backend_error, "scripted failure of " + std::string(op_name(op)));
    }
    log.push_back({stream, ++issued[stream], std::string(op_name(op))});
    return issued[stream] + skew;
  }
  Ticket issued_completed(StreamId stream) override { return issued[stream]; }
  Result<void> wait_issued(StreamPoint, std::chrono::nanoseconds) override { return {}; }
  Result<void> synchronize_issued() override { return {}; }
  Result<NativeStream> native_of(StreamId stream) override { return static_cast<NativeStream>(&issued[stream]); }
  Result<void> bind_stream(StreamId stream, NativeStream native) override {
    bound[stream] = native;
    return {};
  }
  Result<void> unbind_stream(StreamId stream) override {
    bound[stream] = nullptr;
    return {};
  }
  Result<NativeEvent> export_issued(StreamPoint point) override {
    exports.push_back(point);
    return static_cast<NativeEvent>(&exports.back());
  }
  Result<void> release_export(NativeEvent) override { return {}; }

  std::array<NativeStream, kMaxStreams> bound{};
  std::deque<StreamPoint> exports;
};

class HoldQueuesTest : public ::testing::Test {
 protected:
  ScriptedDevice device;
  DeviceInfo info;
  HoldQueues queues{device, info};

  void expect_valid() {
    std::string why;
    EXPECT_TRUE(queues.validate(&why)) << why;
  }
};

TEST_F(HoldQueuesTest, HeldOpsKeepTheirTicketsAndIssueInOrder) {
  queues.set_hold(0, true);
  EXPECT_EQ(queues.enqueue(0, NopOp{}).value_or(0), 1u);
  EXPECT_EQ(queues.enqueue(0, NopOp{}).value_or(0), 2u);
  EXPECT_EQ(queues.submitted(0), 2u);
  EXPECT_TRUE(device.log.empty());
  EXPECT_EQ(queues.completed(0), 0u);
  expect_valid();
  ASSERT_TRUE(queues.wait({0, 1}, kForever).ok());  // dispatches through the point only
  ASSERT_EQ(device.log.size(), 1u);
  EXPECT_EQ(queues.completed(0), 1u);
  queues.set_hold(0, false);
  ASSERT_EQ(device.log.size(), 2u);
  EXPECT_EQ(device.log[1].ticket, 2u);
  EXPECT_EQ(queues.enqueue(0, NopOp{}).value_or(0), 3u);  // unheld: issued at once
  EXPECT_EQ(device.log.size(), 3u);
  expect_valid();
}

TEST_F(HoldQueuesTest, AWaitOnHeldWorkBlocksItsStreamAndNeverBreaksTheHold) {
  queues.set_hold(0, true);
  const Ticket point = queues.enqueue(0, NopOp{}).value_or(0);
  ASSERT_TRUE(queues.enqueue(1, WaitOp{{0, point}}).ok());
  const Ticket after = queues.enqueue(1, NopOp{}).value_or(0);
  EXPECT_TRUE(device.log.empty()) << "stream 0's hold was broken, or the wait was issued before its point";
  const Result<void> r = queues.wait({1, after}, kForever);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::timeout);
  EXPECT_NE(r.error().message.find("stream 0 ticket 1 is held"), std::string::npos) << r.error().message;
  expect_valid();
  ASSERT_TRUE(queues.flush(0).ok());  // the point goes out, then what waited for it
  ASSERT_EQ(device.log.size(), 3u);
  EXPECT_EQ(device.log[0].stream, 0u);
  EXPECT_EQ(device.log[1].kind, "wait");
  EXPECT_TRUE(queues.wait({1, after}, kForever).ok());
  expect_valid();
}

TEST_F(HoldQueuesTest, AHeldOpThatFailsWhenIssuedTakesItsTicketAndFaultsItsStream) {
  queues.set_hold(2, true);
  ASSERT_TRUE(queues.enqueue(2, NopOp{}).ok());
  ASSERT_TRUE(queues.enqueue(2, NopOp{}).ok());
  device.fail_issues = 1;
  const Result<void> flushed = queues.flush(2);
  ASSERT_FALSE(flushed.ok());
  EXPECT_EQ(flushed.error().code, ErrorCode::backend_error);
  ASSERT_EQ(device.log.size(), 2u);  // a no-op in the failed op's place, then ticket 2
  EXPECT_EQ(queues.completed(2), 2u) << "leases on the failed ticket could never retire";
  EXPECT_FALSE(queues.wait({2, 2}, kForever).ok()) << "the fault must reach waits on later points";
  EXPECT_TRUE(queues.wait({3, 0}, kForever).ok()) << "other streams are not affected";
  expect_valid();
}

TEST_F(HoldQueuesTest, ADeviceThatFailsEvenTheNoOpBreaksOnlyThatStream) {
  queues.set_hold(4, true);
  ASSERT_TRUE(queues.enqueue(4, NopOp{}).ok());
  ASSERT_TRUE(queues.enqueue(5, WaitOp{{4, 1}}).ok());  // blocked behind the held point
  device.fail_issues = 2;
  EXPECT_FALSE(queues.flush(4).ok());
  EXPECT_FALSE(queues.enqueue(4, NopOp{}).ok()) << "a broken stream takes no more work";
  EXPECT_FALSE(queues.wait({4, 1}, kForever).ok());
  EXPECT_FALSE(queues.wait({5, 1}, kForever).ok()) << "a wait on a lost point fails, never hangs";
  EXPECT_TRUE(queues.enqueue(6, NopOp{}).ok());
  expect_valid();
}

// Stream 0 comes first in any sweep, yet waits for held stream 1: flush_all and
// synchronize still issue everything.
TEST_F(HoldQueuesTest, FlushAllIssuesAWaitOnAnotherHeldStreamWhateverTheOrder) {
  queues.set_hold(0, true);
  queues.set_hold(1, true);
  const Ticket x = queues.enqueue(1, NopOp{}).value_or(0);
  ASSERT_TRUE(queues.enqueue(0, WaitOp{{1, x}}).ok());
  ASSERT_TRUE(queues.flush_all().ok());
  EXPECT_EQ(device.log.size(), 2u);
  EXPECT_EQ(queues.completed(0), 1u);
  const Ticket y = queues.enqueue(1, NopOp{}).value_or(0);
  ASSERT_TRUE(queues.enqueue(0, WaitOp{{1, y}}).ok());
  ASSERT_TRUE(queues.synchronize().ok());
  EXPECT_EQ(queues.completed(0), 2u);
  EXPECT_TRUE(queues.held(0) && queues.held(1)) << "flushing dispatches; the holds stay";
  expect_valid();
}

TEST_F(HoldQueuesTest, ADeviceThatNumbersOpsOtherwiseStopsTheProcess) {
  device.skew = 1;
  EXPECT_DEATH((void)queues.enqueue(0, NopOp{}), "HoldQueues invariant broken");
}

TEST_F(HoldQueuesTest, MalformedOpsAreRefusedBeforeAnyTicket) {
  queues.set_hold(0, true);
  EXPECT_FALSE(queues.enqueue(0, WaitOp{{1, 1}}).ok());  // stream 1 has handed out nothing
  EXPECT_FALSE(queues.enqueue(kMaxStreams, NopOp{}).ok());
  EXPECT_EQ(queues.submitted(0), 0u);
  EXPECT_FALSE(queues.wait({0, 1}, kForever).ok());  // never handed out
}

// Adopted streams are the program's: never held, ids from kFirstAdoptedStream up
// among those no ferry work used, released only once their work has completed.
TEST_F(HoldQueuesTest, AdoptedStreamsAreNeverHeldAndTakeUnusedIds) {
  int program_stream = 0;
  int another = 0;
  constexpr StreamId first = kFirstAdoptedStream;
  ASSERT_TRUE(queues.enqueue(first, NopOp{}).ok());       // ferry work: not adoptable
  ASSERT_TRUE(queues.native_stream(first + 1).ok());      // handed out: not adoptable
  auto s = queues.adopt_stream(&program_stream);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(*s, first + 2);
  EXPECT_EQ(device.bound[*s], &program_stream);
  EXPECT_EQ(queues.native_stream(*s).value_or(nullptr), &program_stream);
  auto twice = queues.adopt_stream(&program_stream);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message.find(std::to_string(*s)), std::string::npos);
  EXPECT_FALSE(queues.adopt_stream(nullptr).ok());

  queues.set_hold(*s, true);
  EXPECT_FALSE(queues.held(*s)) << "an adopted stream was held";
  ASSERT_TRUE(queues.enqueue(*s, NopOp{}).ok());
  EXPECT_EQ(device.log.back().stream, *s) << "an op on an adopted stream waited in the queue";

  auto second = queues.adopt_stream(&another);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, first + 3);
  ASSERT_TRUE(queues.release_stream(*s, kForever).ok());
  EXPECT_EQ(device.bound[*s], nullptr);
  EXPECT_FALSE(queues.release_stream(*s, kForever).ok()) << "released twice";
  // A released id is free again: the next adoption may take it.
  auto third = queues.adopt_stream(&program_stream);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(*third, *s);
  expect_valid();
}

TEST_F(HoldQueuesTest, ReleasingAnAdoptedStreamBlockedOnHeldWorkTimesOutAndKeepsIt) {
  int program_stream = 0;
  auto s = queues.adopt_stream(&program_stream);
  ASSERT_TRUE(s.ok());
  queues.set_hold(0, true);
  const Ticket held = queues.enqueue(0, NopOp{}).value_or(0);
  ASSERT_TRUE(queues.enqueue(*s, WaitOp{{0, held}}).ok());
  auto r = queues.release_stream(*s, kForever);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::timeout);
  EXPECT_NE(r.error().message.find("held"), std::string::npos) << r.error().message;
  EXPECT_EQ(device.bound[*s], &program_stream) << "released with work still queued";
  queues.set_hold(0, false);
  EXPECT_TRUE(queues.release_stream(*s, kForever).ok());
  expect_valid();
}

TEST_F(HoldQueuesTest, ExportingAnEventDispatchesHeldWorkUpToThePoint) {
  queues.set_hold(0, true);
  const Ticket a = queues.enqueue(0, NopOp{}).value_or(0);
  ASSERT_TRUE(queues.enqueue(0, NopOp{}).ok());
  auto e = queues.export_event({0, a});
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(device.issued[0], a) << "held work up to the point, and only that, is dispatched";
  EXPECT_TRUE(queues.held(0));
  EXPECT_FALSE(queues.export_event({0, 9}).ok());
  expect_valid();
}

}  // namespace
}  // namespace ferry
