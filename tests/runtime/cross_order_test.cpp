// Cross-device order (Runtime::order_after, runtime.hpp): a stream of one device
// waits for a point of another without the host. On two sim devices linked over
// PCIe, integrity off, so that a direct peer copy's read of its source is the only
// access of the source device's bytes from the other device: device 0 fills the
// source on one stream, device 1 pulls it on another.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "ferry/content.hpp"
#include "ferry/devices.hpp"
#include "ferry/runtime.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

using testing::pattern;
using testing::read_back;

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t kBytes = 512 * KiB;
constexpr StreamId kWriter = 2;  // device 0's stream that fills the source
constexpr StreamId kPull = 1;    // device 1's stream (copy_peer's) that waits and pulls
constexpr std::uint64_t kSeed = 7;

RuntimeOptions two_devices(bool race_check) {
  RuntimeOptions o;
  o.backend.profile = "tiny";
  o.backend.race_check = race_check;
  o.devices.count = 2;
  o.devices.links = {PeerLinkSpec{0, 1, PeerLink::pcie}};
  o.engine.policy = IntegrityPolicy::off;
  return o;
}

// The source on device 0, its fill enqueued (not run: no clock has moved since
// the start-up, the same on both devices), and a destination on device 1.
struct Scene {
  std::unique_ptr<Runtime> rt;
  DeviceHandle src, dst;
  StreamPoint filled;
};

Scene make_scene(bool race_check = false) {
  Scene s;
  auto made = Runtime::create(two_devices(race_check));
  EXPECT_TRUE(made.ok()) << made.error().message;
  if (!made.ok()) return s;
  s.rt = std::move(made).value();
  DevicePool& p0 = s.rt->device(0).pool();
  DevicePool& p1 = s.rt->device(1).pool();
  auto src = p0.allocate(kBytes, kWriter);
  auto dst = p1.allocate(kBytes, kPull);
  EXPECT_TRUE(src.ok() && dst.ok());
  if (!src.ok() || !dst.ok()) return s;
  s.src = *src, s.dst = *dst;
  auto fill = enqueue_fill(p0, kWriter, s.src, kSeed);
  EXPECT_TRUE(fill.ok());
  if (fill.ok()) s.filled = StreamPoint{kWriter, *fill};
  return s;
}

// Device 1 pulls the source on kPull with no order of its own: a bare
// PeerCopyOp (copy_peer would order it after the source's uses, peer_order_test).
Result<Ticket> bare_pull(Scene& s) {
  Runtime& rt = *s.rt;
  Result<DeviceSpan> from = rt.device(0).pool().resolve(s.src);
  if (!from.ok()) return std::move(from).error();
  return rt.device(1).order().submit(kPull, [&](Ticket t) -> Result<Op> {
    Result<DeviceSpan> to = rt.device(1).pool().lease(s.dst, StreamPoint{kPull, t});
    if (!to.ok()) return std::move(to).error();
    return Op{PeerCopyOp{DeviceRange{to->addr, kBytes}, &rt.device(0).backend(), from->addr, PeerLink::pcie}};
  });
}

// What one run of the waited pull shows: the two clocks and the bytes.
struct Outcome {
  Ticket wait = 0;
  std::uint64_t source_done_ns = 0;  // device 0's clock once the fill completed
  std::uint64_t waited_ns = 0;       // device 1's clock once its wait completed
  std::vector<std::byte> pulled;
};

Outcome waited_pull() {
  Scene s = make_scene();
  Outcome out;
  if (!s.rt) return out;
  Runtime& rt = *s.rt;
  Result<Ticket> wait = rt.order_after(1, kPull, 0, s.filled);
  EXPECT_TRUE(wait.ok()) << wait.error().message;
  if (!wait.ok()) return out;
  out.wait = *wait;
  out.source_done_ns = rt.device(0).backend().now_ns();
  EXPECT_TRUE(rt.device(1).order().wait({kPull, *wait}).ok());
  out.waited_ns = rt.device(1).backend().now_ns();
  auto copied = rt.copy_peer(s.dst, 0, s.src, 0, kBytes, kPull);
  EXPECT_TRUE(copied.ok()) << copied.error().message;
  if (copied.ok()) {
    EXPECT_TRUE(copied->direct);
  }
  auto back = read_back(rt.device(1).pool(), s.dst, kPull);
  EXPECT_TRUE(back.ok());
  if (back.ok()) out.pulled = *back;
  return out;
}

TEST(CrossDeviceOrder, AStreamWaitsForAnotherDevicesPointAndSeesItsBytes) {
  Scene s = make_scene();
  ASSERT_TRUE(s.rt);
  Runtime& rt = *s.rt;
  const Ticket before = rt.device(1).backend().submitted(kPull);
  const std::uint64_t start = rt.device(1).backend().now_ns();
  Result<Ticket> wait = rt.order_after(1, kPull, 0, s.filled);
  ASSERT_TRUE(wait.ok()) << wait.error().message;
  EXPECT_EQ(*wait, before + 1);
  // Issuing the wait ran device 0's model to the fill's completion.
  const std::uint64_t source_done = rt.device(0).backend().now_ns();
  EXPECT_TRUE(rt.device(0).order().is_complete(s.filled));
  ASSERT_LT(start, source_done) << "the scene needs the fill to end after device 1's clock now";
  // Device 1's wait completes when the fill did on device 0's clock, not before.
  ASSERT_TRUE(rt.device(1).order().wait({kPull, *wait}).ok());
  EXPECT_EQ(rt.device(1).backend().now_ns(), source_done);
  auto copied = rt.copy_peer(s.dst, 0, s.src, 0, kBytes, kPull);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  EXPECT_TRUE(copied->direct);
  auto back = read_back(rt.device(1).pool(), s.dst, kPull);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, pattern(kSeed, kBytes));
}

// A bare pull with no wait reads the source before its fill ran (the peer copy
// reads it when it runs, which nothing orders after the fill): what the wait above is for.
TEST(CrossDeviceOrder, WithoutTheWaitThePullReadsTheSourceBeforeItsFill) {
  Scene s = make_scene();
  ASSERT_TRUE(s.rt);
  auto pulled = bare_pull(s);
  ASSERT_TRUE(pulled.ok()) << pulled.error().message;
  auto back = read_back(s.rt->device(1).pool(), s.dst, kPull);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_NE(*back, pattern(kSeed, kBytes));
}

TEST(CrossDeviceOrder, ACompletedPointEnqueuesNothing) {
  Scene s = make_scene();
  ASSERT_TRUE(s.rt);
  Runtime& rt = *s.rt;
  const Ticket before = rt.device(1).backend().submitted(kPull);
  Result<Ticket> none = rt.order_after(1, kPull, 0, StreamPoint{kWriter, 0});
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_EQ(*none, 0u);
  ASSERT_TRUE(rt.device(0).order().wait(s.filled).ok());
  Result<Ticket> done = rt.order_after(1, kPull, 0, s.filled);
  ASSERT_TRUE(done.ok()) << done.error().message;
  EXPECT_EQ(*done, 0u);
  EXPECT_EQ(rt.device(1).backend().submitted(kPull), before);
}

TEST(CrossDeviceOrder, OnOneDeviceItIsThatDevicesOwnWait) {
  Scene s = make_scene();
  ASSERT_TRUE(s.rt);
  Runtime& rt = *s.rt;
  Result<Ticket> wait = rt.order_after(0, kPull, 0, s.filled);
  ASSERT_TRUE(wait.ok()) << wait.error().message;
  EXPECT_EQ(*wait, rt.device(0).backend().submitted(kPull));
  ASSERT_TRUE(rt.device(0).order().wait({kPull, *wait}).ok());
  EXPECT_TRUE(rt.device(0).order().is_complete(s.filled));
}

TEST(CrossDeviceOrder, BadDevicesStreamsAndPointsAreRefusedNamingThem) {
  Scene s = make_scene();
  ASSERT_TRUE(s.rt);
  Runtime& rt = *s.rt;
  const auto refused = [](const Result<Ticket>& r, const std::string& says) {
    ASSERT_FALSE(r.ok()) << "expected a refusal saying: " << says;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message.find(says), std::string::npos) << r.error().message;
  };
  const Ticket before = rt.device(1).backend().submitted(kPull);
  refused(rt.order_after(2, kPull, 0, s.filled), "no device 2");
  refused(rt.order_after(1, kPull, 5, s.filled), "no device 5");
  refused(rt.order_after(1, kMaxStreams, 0, s.filled), "order_after");
  refused(rt.order_after(1, kPull, 0, StreamPoint{kMaxStreams, 1}), "the point");
  refused(rt.order_after(1, kPull, 0, StreamPoint{kWriter, s.filled.ticket + 1}), "was not handed out");
  EXPECT_EQ(rt.device(1).backend().submitted(kPull), before) << "a refusal enqueues nothing";
}

// A held stream keeps the wait in its host-side queue; the event it waits on lives
// until the wait completed, through another order_after that releases what is done.
TEST(CrossDeviceOrder, AWaitHeldOnItsStreamKeepsItsEventUntilItRan) {
  Scene s = make_scene();
  ASSERT_TRUE(s.rt);
  Runtime& rt = *s.rt;
  rt.device(1).backend().set_hold(kPull, true);
  Result<Ticket> wait = rt.order_after(1, kPull, 0, s.filled);
  ASSERT_TRUE(wait.ok()) << wait.error().message;
  auto again = enqueue_fill(rt.device(0).pool(), kWriter, s.src, kSeed);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(rt.order_after(1, kPull + 1, 0, StreamPoint{kWriter, *again}).ok());
  rt.device(1).backend().set_hold(kPull, false);
  ASSERT_TRUE(rt.device(1).order().wait({kPull, *wait}).ok());
  ASSERT_TRUE(rt.synchronize().ok());
  auto copied = rt.copy_peer(s.dst, 0, s.src, 0, kBytes, kPull);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  auto back = read_back(rt.device(1).pool(), s.dst, kPull);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, pattern(kSeed, kBytes));
}

TEST(CrossDeviceOrder, TheScheduleAndTheBytesAreTheSameOnEveryRun) {
  const Outcome first = waited_pull();
  const Outcome second = waited_pull();
  EXPECT_GT(first.wait, 0u);
  EXPECT_EQ(first.wait, second.wait);
  EXPECT_GT(first.source_done_ns, 0u);
  EXPECT_EQ(first.source_done_ns, second.source_done_ns);
  EXPECT_EQ(first.waited_ns, second.waited_ns);
  EXPECT_EQ(first.pulled, pattern(kSeed, kBytes));
  EXPECT_EQ(first.pulled, second.pulled);
}

// Race checking over both devices (race.hpp; one checker for a Runtime's sims).
RaceLog races_of(Runtime& rt, std::uint32_t device) {
  std::shared_ptr<const RaceLog> log = rt.device(device).backend().race_log();
  EXPECT_TRUE(log);
  return log ? *log : RaceLog{};
}

TEST(CrossDeviceRaces, APullUnorderedAfterTheSourcesFillIsARaceNamingBothDevices) {
  Scene s = make_scene(true);
  ASSERT_TRUE(s.rt);
  Runtime& rt = *s.rt;
  const std::uint64_t src_addr = rt.device(0).pool().resolve(s.src)->addr;
  auto pulled = bare_pull(s);
  ASSERT_TRUE(pulled.ok()) << pulled.error().message;
  ASSERT_TRUE(rt.synchronize().ok());
  const RaceLog l = races_of(rt, 1);
  EXPECT_EQ(races_of(rt, 0).count, l.count) << "the devices share one log";
  ASSERT_EQ(l.count, 1u);
  const Race& r = l.kept.at(0);
  EXPECT_EQ(r.earlier.device, 0u);
  EXPECT_EQ(r.earlier.op, s.filled);
  EXPECT_EQ(r.earlier.kind, "fill");
  EXPECT_EQ(r.earlier.access, Access::write);
  EXPECT_EQ(r.earlier.block.handle, s.src);
  EXPECT_EQ(r.later.device, 1u);
  EXPECT_EQ(r.later.op.stream, kPull);
  EXPECT_EQ(r.later.kind, "copy_peer");
  EXPECT_EQ(r.later.access, Access::read);
  EXPECT_EQ(r.later.block.handle, s.src) << "the read is of the source's bytes, on device 0";
  EXPECT_EQ(r.addr, src_addr);
  EXPECT_EQ(r.bytes, kBytes);
}

TEST(CrossDeviceRaces, TheWaitAcrossDevicesOrdersThePullAndNoRaceIsFound) {
  Scene s = make_scene(true);
  ASSERT_TRUE(s.rt);
  Runtime& rt = *s.rt;
  ASSERT_TRUE(rt.order_after(1, kPull, 0, s.filled).ok());
  auto copied = rt.copy_peer(s.dst, 0, s.src, 0, kBytes, kPull);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  auto back = read_back(rt.device(1).pool(), s.dst, kPull);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, pattern(kSeed, kBytes));
  ASSERT_TRUE(rt.synchronize().ok());
  EXPECT_EQ(races_of(rt, 1).count, 0u);
}

// A wait on another device's stream orders only that stream's work: a second
// writer of the source on device 0 still races with the pull.
TEST(CrossDeviceRaces, TheWaitOrdersOnlyThePointsStream) {
  Scene s = make_scene(true);
  ASSERT_TRUE(s.rt);
  Runtime& rt = *s.rt;
  auto other = enqueue_fill(rt.device(0).pool(), kWriter + 1, s.src, kSeed);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(rt.order_after(1, kPull, 0, s.filled).ok());
  ASSERT_TRUE(bare_pull(s).ok());
  ASSERT_TRUE(rt.synchronize().ok());
  const RaceLog l = races_of(rt, 0);
  bool pull_raced = false;
  for (const Race& r : l.kept) {
    pull_raced |= r.earlier.device == 0 && r.earlier.op == StreamPoint{kWriter + 1, *other} && r.later.device == 1 &&
                  r.later.kind == "copy_peer";
    EXPECT_FALSE(r.earlier.device == 0 && r.earlier.op == s.filled && r.later.device == 1)
        << "the waited fill raced with device 1's work";
  }
  EXPECT_TRUE(pull_raced);
}

// The direct copy orders the destination's stream after the source, and the
// source's stream after the pull, both without the host. The pulled scene:
// device 1 waits for the fill, then copy_peer.
Result<PeerCopyReceipt> pulled(Scene& s) {
  if (Result<Ticket> w = s.rt->order_after(1, kPull, 0, s.filled); !w.ok()) return std::move(w).error();
  return s.rt->copy_peer(s.dst, 0, s.src, 0, kBytes, kPull);
}

// A write of the source on the source's stream is ordered after the pull's read.
TEST(CrossDeviceRaces, TheSourcesStreamIsOrderedAfterTheDirectCopysRead) {
  Scene s = make_scene(true);
  ASSERT_TRUE(s.rt);
  auto copied = pulled(s);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  ASSERT_TRUE(copied->direct);
  ASSERT_TRUE(enqueue_fill(s.rt->device(0).pool(), kPull, s.src, 1).ok());
  auto back = read_back(s.rt->device(1).pool(), s.dst, kPull);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, pattern(kSeed, kBytes));
  ASSERT_TRUE(s.rt->synchronize().ok());
  EXPECT_EQ(races_of(*s.rt, 0).count, 0u);
}

// A write of the source on another stream of device 0 races with the pull's read
// (seen on device 0's bytes), and so does a write of the destination on another
// stream of device 1: copy_peer did not wait on the host for the pull, which
// would have ordered both.
TEST(CrossDeviceRaces, TheDirectCopyLeavesOtherStreamsAndTheHostUnordered) {
  Scene s = make_scene(true);
  ASSERT_TRUE(s.rt);
  Runtime& rt = *s.rt;
  auto copied = pulled(s);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  ASSERT_TRUE(copied->direct);
  auto src_other = enqueue_fill(rt.device(0).pool(), kWriter, s.src, 2);
  auto dst_other = enqueue_fill(rt.device(1).pool(), kPull + 1, s.dst, 3);
  ASSERT_TRUE(src_other.ok() && dst_other.ok());
  ASSERT_TRUE(rt.synchronize().ok());
  const RaceLog l = races_of(rt, 0);
  const auto raced_with_pull = [&](std::uint32_t device, StreamPoint later) {
    return std::any_of(l.kept.begin(), l.kept.end(), [&](const Race& r) {
      return r.earlier.device == 1 && r.earlier.op == copied->done && r.later.device == device && r.later.op == later;
    });
  };
  EXPECT_TRUE(raced_with_pull(0, {kWriter, *src_other}));
  EXPECT_TRUE(raced_with_pull(1, {kPull + 1, *dst_other}));
  EXPECT_EQ(l.count, 2u);
}

// Each device's own races name it: two unordered fills of a block on device 1.
TEST(CrossDeviceRaces, ARaceOnOneDeviceNamesThatDevice) {
  Scene s = make_scene(true);
  ASSERT_TRUE(s.rt);
  Runtime& rt = *s.rt;
  DevicePool& p1 = rt.device(1).pool();
  ASSERT_TRUE(enqueue_fill(p1, kPull, s.dst, 1).ok());
  ASSERT_TRUE(enqueue_fill(p1, kPull + 1, s.dst, 2).ok());
  ASSERT_TRUE(rt.synchronize().ok());
  const RaceLog l = races_of(rt, 0);
  ASSERT_EQ(l.count, 1u);
  EXPECT_EQ(l.kept.at(0).earlier.device, 1u);
  EXPECT_EQ(l.kept.at(0).later.device, 1u);
  EXPECT_EQ(l.kept.at(0).later.op.stream, kPull + 1);
}

}  // namespace
}  // namespace ferry
