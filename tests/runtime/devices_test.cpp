// Several devices in one Runtime (devices.hpp): a stack per device, handles that
// name their device, the figures per device and in total, the device selection's
// refusals. On two sim devices; the selection of cuda devices without a GPU.
#include "ferry/devices.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "ferry/allocation.hpp"
#include "ferry/runtime.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

using testing::pattern;
using testing::read_back;

constexpr std::uint64_t KiB = 1024, MiB = 1024 * 1024;

RuntimeOptions two_sim_devices() {
  RuntimeOptions o;
  o.backend.profile = "tiny";
  o.devices.count = 2;
  return o;
}

std::unique_ptr<Runtime> make(RuntimeOptions o) {
  auto made = Runtime::create(std::move(o));
  EXPECT_TRUE(made.ok()) << made.error().message;
  return made.ok() ? std::move(made).value() : nullptr;
}

TEST(Devices, OneDeviceByDefaultAndItsAccessorsAreDeviceZeros) {
  RuntimeOptions o;
  o.backend.profile = "tiny";
  auto rt = make(o);
  ASSERT_TRUE(rt);
  EXPECT_EQ(rt->device_count(), 1u);
  EXPECT_EQ(&rt->pool(), &rt->device(0).pool());
  EXPECT_EQ(&rt->engine(), &rt->device(0).engine());
  EXPECT_EQ(&rt->backend(), &rt->device(0).backend());
  EXPECT_EQ(rt->find_device(1).error().code, ErrorCode::invalid_argument);
}

TEST(Devices, EachDeviceHasItsOwnStackAndProfile) {
  RuntimeOptions o = two_sim_devices();
  o.devices.profiles = {"tiny", "rtx3090"};
  auto rt = make(o);
  ASSERT_TRUE(rt);
  ASSERT_EQ(rt->device_count(), 2u);
  RuntimeDevice& d0 = rt->device(0);
  RuntimeDevice& d1 = rt->device(1);
  EXPECT_EQ(d0.index(), 0u);
  EXPECT_EQ(d1.index(), 1u);
  EXPECT_NE(&d0.backend(), &d1.backend());
  EXPECT_NE(&d0.pool(), &d1.pool());
  EXPECT_NE(&d0.arena(), &d1.arena());
  EXPECT_EQ(&d1.pool().order(), &d1.order());
  EXPECT_EQ(d0.backend().info().device, "tiny");
  EXPECT_EQ(d1.backend().info().device, "rtx3090");
  EXPECT_LT(d0.pool().capacity(), d1.pool().capacity());
  ASSERT_TRUE(rt->find_device(1).ok());
  EXPECT_EQ(*rt->find_device(1), &d1);
  auto none = rt->find_device(2);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("2 device(s)"), std::string::npos) << none.error().message;
}

// The pool suite's basics, on each of two devices at once: bytes written on one
// device are read back from it, a stream-ordered free is reused, and a failed
// fit on one device leaves the other's blocks and figures untouched.
TEST(Devices, PoolBasicsHoldOnEachOfTwoDevices) {
  auto rt = make(two_sim_devices());
  ASSERT_TRUE(rt);
  std::vector<DeviceHandle> blocks;
  for (std::uint32_t d = 0; d < 2; ++d) {
    DevicePool& p = rt->device(d).pool();
    auto h = p.allocate(64 * KiB, 0);
    ASSERT_TRUE(h.ok()) << h.error().message;
    ASSERT_TRUE(enqueue_fill(p, 0, *h, 100 + d).ok());
    blocks.push_back(*h);
  }
  for (std::uint32_t d = 0; d < 2; ++d) {
    auto back = read_back(rt->device(d).pool(), blocks[d], 0);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(*back, pattern(100 + d, 64 * KiB)) << "device " << d;
  }

  // Stream-ordered free and reuse on device 1 (I3): the next block on the same
  // stream may land on the freed bytes at once.
  DevicePool& p1 = rt->device(1).pool();
  const std::uint64_t addr = p1.resolve(blocks[1])->addr;
  ASSERT_TRUE(p1.free(blocks[1]).ok());
  auto again = p1.allocate(64 * KiB, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(p1.resolve(*again)->addr, addr);
  EXPECT_EQ(p1.free(blocks[1]).error().code, ErrorCode::stale_handle);  // double free (I1)

  // Out of memory on device 1 only (I4): device 0's block and figures stay.
  const PoolStats before0 = rt->device(0).pool().stats();
  auto huge = p1.allocate(p1.capacity() + MiB, 0);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().code, ErrorCode::out_of_memory);
  EXPECT_EQ(p1.stats().ooms, 1u);
  EXPECT_EQ(rt->device(0).pool().stats().ooms, 0u);
  EXPECT_EQ(rt->device(0).pool().stats().allocated_bytes, before0.allocated_bytes);
  auto back0 = read_back(rt->device(0).pool(), blocks[0], 0);
  ASSERT_TRUE(back0.ok());
  EXPECT_EQ(*back0, pattern(100, 64 * KiB));

  ASSERT_TRUE(p1.free(*again).ok());
  ASSERT_TRUE(rt->device(0).pool().free(blocks[0]).ok());
  ASSERT_TRUE(rt->synchronize().ok());
  EXPECT_TRUE(rt->status().ok());
}

TEST(Devices, UploadsRunThroughEachDevicesOwnEngine) {
  auto rt = make(two_sim_devices());
  ASSERT_TRUE(rt);
  for (std::uint32_t d = 0; d < 2; ++d) {
    RuntimeDevice& dev = rt->device(d);
    auto h = dev.pool().allocate(32 * KiB, 1);
    ASSERT_TRUE(h.ok());
    const std::vector<std::byte> src = pattern(7 + d, 32 * KiB);
    auto receipt = dev.engine().upload(1, TransferPlan().add(std::span<const std::byte>(src), *h));
    ASSERT_TRUE(receipt.ok()) << receipt.error().message;
    EXPECT_TRUE(receipt->verified);
    auto back = read_back(dev.pool(), *h, 1);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, src) << "device " << d;
    EXPECT_EQ(dev.engine().counters().bytes_verified, 32 * KiB) << "device " << d;
    ASSERT_TRUE(dev.pool().free(*h).ok());
  }
}

// I1 across devices: a handle of device 1 used on device 0's pool never resolves
// there, and the refusal names both devices.
TEST(Devices, AHandleOfAnotherDeviceIsRefusedNamingBoth) {
  auto rt = make(two_sim_devices());
  ASSERT_TRUE(rt);
  DevicePool& p0 = rt->device(0).pool();
  DevicePool& p1 = rt->device(1).pool();
  auto mine = p0.allocate(4 * KiB, 0);
  auto theirs = p1.allocate(4 * KiB, 0);
  ASSERT_TRUE(mine.ok() && theirs.ok());

  for (Result<DeviceSpan> r : {p0.resolve(*theirs), p0.lease(*theirs, {0, 1})}) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::stale_handle);
    EXPECT_NE(r.error().message.find("device 1"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("device 0"), std::string::npos) << r.error().message;
  }
  auto fill = enqueue_fill(p0, 0, *theirs, 1);
  ASSERT_FALSE(fill.ok());
  EXPECT_EQ(fill.error().code, ErrorCode::stale_handle);
  auto freed = p0.free(*theirs);
  ASSERT_FALSE(freed.ok());
  EXPECT_EQ(freed.error().code, ErrorCode::stale_handle);
  EXPECT_NE(freed.error().message.find("device 1's pool"), std::string::npos) << freed.error().message;
  // The refused free touched neither pool: both blocks are still live.
  EXPECT_TRUE(p1.resolve(*theirs).ok());
  EXPECT_TRUE(p0.resolve(*mine).ok());
  EXPECT_EQ(p0.stats().frees, 0u);
  ASSERT_TRUE(p0.free(*mine).ok());
  ASSERT_TRUE(p1.free(*theirs).ok());
}

TEST(Devices, StatsArePerDeviceAndSummedInTotal) {
  auto rt = make(two_sim_devices());
  ASSERT_TRUE(rt);
  const PoolStats start = rt->total_pool_stats();  // the engines' own probe buffers
  auto a = Allocation::allocate(rt->device(0).pool(), 1 * MiB, 0);
  auto b = Allocation::allocate(rt->device(1).pool(), 3 * MiB, 0);
  auto c = Allocation::allocate(rt->device(1).pool(), 256, 0);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());

  const std::vector<PoolStats> each = rt->pool_stats();
  ASSERT_EQ(each.size(), 2u);
  EXPECT_EQ(each[0].allocs, 1u);
  EXPECT_EQ(each[1].allocs, 2u);
  EXPECT_EQ(each[0].requested_bytes, 1 * MiB);
  EXPECT_EQ(each[1].requested_bytes, 3 * MiB + 256);
  const PoolStats total = rt->total_pool_stats();
  EXPECT_EQ(total.allocs, 3u);
  EXPECT_EQ(total.requested_bytes, 4 * MiB + 256);
  EXPECT_EQ(total.allocated_bytes, each[0].allocated_bytes + each[1].allocated_bytes);
  EXPECT_EQ(total.reserved_bytes, each[0].reserved_bytes + each[1].reserved_bytes);
  EXPECT_EQ(total.peak_requested_bytes, each[0].peak_requested_bytes + each[1].peak_requested_bytes);
  EXPECT_EQ(total.internal_allocs, start.internal_allocs);

  const std::string summary = rt->memory_summary();
  EXPECT_NE(summary.find("device 0 (tiny)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("device 1 (tiny)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("all 2 devices"), std::string::npos) << summary;
  EXPECT_NE(summary.find(std::to_string(4 * MiB + 256) + " B"), std::string::npos) << summary;
}

DevicesOptions select(std::uint32_t count, std::vector<std::string> profiles, std::vector<int> ordinals = {}) {
  DevicesOptions d;
  d.count = count;
  d.profiles = std::move(profiles);
  d.ordinals = std::move(ordinals);
  return d;
}

TEST(Devices, TheSelectionRefusesWhatNamesNoDeviceOrOneTwice) {
  BackendSpec sim;
  sim.profile = "tiny";
  const auto refused = [](const BackendSpec& b, DevicesOptions d, ErrorCode code, const std::string& says) {
    auto specs = device_specs(b, d);
    ASSERT_FALSE(specs.ok());
    EXPECT_EQ(specs.error().code, code);
    EXPECT_NE(specs.error().message.find(says), std::string::npos) << specs.error().message;
  };
  refused(sim, select(0, {}), ErrorCode::invalid_argument, "none is");
  refused(sim, select(kMaxDevices + 1, {}), ErrorCode::invalid_argument, "at most");
  refused(sim, select(1, {"tiny", "tiny"}), ErrorCode::invalid_argument, "2 profiles listed for 1");
  refused(sim, select(2, {"tiny", "gpu-of-dreams"}), ErrorCode::invalid_argument, "device 1");
  refused(sim, select(2, {}, {0, 1}), ErrorCode::invalid_argument, "do not apply");
  BackendSpec cuda;
  cuda.kind = BackendKind::cuda;
  refused(cuda, select(2, {}, {1, 1}), ErrorCode::invalid_argument, "listed twice");
  refused(cuda, select(1, {}, {-1}), ErrorCode::invalid_argument, "< 0");

  auto listed = device_specs(sim, select(0, {"tiny", "rtx4090", "tiny"}));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_EQ((*listed)[1].profile, "rtx4090");
  EXPECT_EQ((*listed)[2].seed, sim.seed + 2);
  // Past the list, device i is backend.device + i.
  auto ordinals = device_specs(cuda, select(3, {}, {5}));
  ASSERT_TRUE(ordinals.ok()) << ordinals.error().message;
  EXPECT_EQ((*ordinals)[0].device, 5);
  EXPECT_EQ((*ordinals)[1].device, 1);
  EXPECT_EQ((*ordinals)[2].device, 2);
  refused(cuda, select(3, {}, {2}), ErrorCode::invalid_argument, "listed twice");
}


// --- Peer copies ------------------------------------------------------------------

std::unique_ptr<Runtime> peer_runtime(IntegrityPolicy policy, double pinned_noop_on_device_1) {
  RuntimeOptions o = two_sim_devices();
  o.engine.policy = policy;
  SimFaults faulty;
  faulty.pinned_noop = pinned_noop_on_device_1;
  o.devices.faults = {SimFaults{}, faulty};
  return make(o);
}

struct PeerTally {
  int right = 0;    // copy_peer ok, destination == source
  int wrong = 0;    // copy_peer ok, destination != source: silent corruption
  int refused = 0;  // copy_peer answered transfer_corrupt
  int other = 0;    // any other answer
};

// `rounds` copies of 64 KiB from device 0 to device 1 over blocks holding other
// bytes, the devices' clocks moved on between rounds (report 000's fault grows
// with the time since pinning).
PeerTally copy_rounds(Runtime& rt, int rounds) {
  constexpr std::uint64_t n = 64 * KiB;
  constexpr StreamId s = 2;
  PeerTally t;
  DevicePool& p0 = rt.device(0).pool();
  DevicePool& p1 = rt.device(1).pool();
  for (int r = 0; r < rounds; ++r) {
    auto src = p0.allocate(n, s);
    auto dst = p1.allocate(n, s);
    if (!src.ok() || !dst.ok() || !enqueue_fill(p0, s, *src, 10 + r).ok() ||
        !enqueue_fill(p1, s, *dst, 5000 + r).ok()) {
      ++t.other;
      continue;
    }
    auto copied = rt.copy_peer(*dst, 0, *src, 0, n, s);
    if (copied.ok()) {
      EXPECT_FALSE(copied->direct);
      EXPECT_EQ(copied->src_device, 0u);
      EXPECT_EQ(copied->dst_device, 1u);
      EXPECT_EQ(copied->verified, rt.device(1).engine().policy() == IntegrityPolicy::verify);
      auto back = read_back(p1, *dst, s);
      if (back.ok() && *back == pattern(10 + r, n)) ++t.right;
      else ++t.wrong;
    } else if (copied.error().code == ErrorCode::transfer_corrupt) {
      ++t.refused;
    } else {
      ADD_FAILURE() << copied.error().message;
      ++t.other;
    }
    (void)p0.free(*src);
    (void)p1.free(*dst);
    rt.device(0).backend().advance(200'000);
    rt.device(1).backend().advance(200'000);
  }
  return t;
}

class PeerCopy : public ::testing::TestWithParam<IntegrityPolicy> {};

TEST_P(PeerCopy, MovesTheBytesBetweenTwoDevices) {
  auto rt = peer_runtime(GetParam(), 0);
  ASSERT_TRUE(rt);
  const PeerTally t = copy_rounds(*rt, 6);
  EXPECT_EQ(t.right, 6);
  EXPECT_EQ(rt->device(1).backend().fault_counters().swallowed_copies, 0u);
}

// Report 000's pinned no-op on the destination's staging path. verify catches
// every one and retries it through another path (I5); off lets it through
// silently, which is what shows the fault fired; probe never does worse than off.
TEST_P(PeerCopy, AnInjectedNoopOnTheDestinationsPinnedPathIsCaughtByVerify) {
  auto rt = peer_runtime(GetParam(), 1.0);
  ASSERT_TRUE(rt);
  const PeerTally t = copy_rounds(*rt, 24);
  EXPECT_EQ(t.other, 0);
  EXPECT_GT(rt->device(1).backend().fault_counters().swallowed_copies, 0u) << "the fault must have fired";
  EXPECT_EQ(rt->device(0).backend().fault_counters().swallowed_copies, 0u) << "device 0 has no fault";
  switch (GetParam()) {
    case IntegrityPolicy::verify:
      EXPECT_EQ(t.wrong, 0);
      EXPECT_EQ(t.right, 24);
      EXPECT_GT(rt->device(1).engine().counters().mismatches, 0u);
      EXPECT_GT(rt->device(1).engine().counters().recovered, 0u);
      break;
    case IntegrityPolicy::probe:
      EXPECT_EQ(t.right + t.wrong + t.refused, 24);
      break;
    case IntegrityPolicy::off:
      EXPECT_GT(t.wrong, 0) << "without verify the no-op is silent";
      break;
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, PeerCopy,
                         ::testing::Values(IntegrityPolicy::off, IntegrityPolicy::probe, IntegrityPolicy::verify),
                         [](const auto& p) { return std::string(to_string(p.param)); });

TEST(Devices, APeerCopyOnOneDeviceIsDirectAndBadArgumentsAreRefused) {
  auto rt = make(two_sim_devices());
  ASSERT_TRUE(rt);
  DevicePool& p1 = rt->device(1).pool();
  auto a = p1.allocate(8 * KiB, 0);
  auto b = p1.allocate(8 * KiB, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(enqueue_fill(p1, 0, *a, 3).ok());
  auto same = rt->copy_peer(*b, 4 * KiB, *a, 0, 4 * KiB, 0);
  ASSERT_TRUE(same.ok()) << same.error().message;
  EXPECT_TRUE(same->direct);
  EXPECT_EQ(same->dst_device, 1u);
  auto back = read_back(p1, *b, 0);
  ASSERT_TRUE(back.ok());
  const std::vector<std::byte> want = pattern(3, 8 * KiB);
  EXPECT_TRUE(std::equal(back->begin() + 4 * KiB, back->end(), want.begin()));

  auto zero = rt->copy_peer(*b, 0, *a, 0, 0, 0);
  EXPECT_EQ(zero.error().code, ErrorCode::invalid_argument);
  auto outside = rt->copy_peer(*b, 4 * KiB + 1, *a, 0, 4 * KiB, 0);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(outside.error().message.find("device 1"), std::string::npos) << outside.error().message;
  ASSERT_TRUE(p1.free(*a).ok());
  auto stale = rt->copy_peer(*b, 0, *a, 0, 256, 0);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code, ErrorCode::stale_handle);
  EXPECT_NE(stale.error().message.find("2 device(s)"), std::string::npos) << stale.error().message;
  ASSERT_TRUE(p1.free(*b).ok());
}

// The out_of_memory diagnostic says which device ran out; one device's pool
// says nothing of devices (its text is as before there were several).
TEST(Devices, AnOutOfMemoryNamesItsDevice) {
  auto rt = make(two_sim_devices());
  ASSERT_TRUE(rt);
  auto big = rt->device(1).pool().allocate(rt->device(1).pool().capacity() + 1, 0);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(big.error().message.find("out of memory on device 1 of 2: request of"), std::string::npos)
      << big.error().message;
  RuntimeOptions one;
  one.backend.profile = "tiny";
  auto single = make(one);
  ASSERT_TRUE(single);
  auto alone = single->pool().allocate(single->pool().capacity() + 1, 0);
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.error().message.rfind("out of memory: request of", 0), 0u) << alone.error().message;
}


// --- cuda: every visible device, or skip -------------------------------------------

TEST(Devices, CudaCountZeroTakesEveryVisibleDevice) {
  const std::uint32_t visible = visible_devices(BackendKind::cuda);
  if (visible == 0) GTEST_SKIP() << "no CUDA device visible";
  RuntimeOptions o;
  o.backend.kind = BackendKind::cuda;
  o.devices.count = 0;
  auto rt = make(o);
  ASSERT_TRUE(rt);
  EXPECT_EQ(rt->device_count(), visible);
  for (std::uint32_t d = 0; d < visible; ++d) {
    auto h = rt->device(d).pool().allocate(64 * KiB, 0);
    ASSERT_TRUE(h.ok()) << "device " << d << ": " << h.error().message;
    ASSERT_TRUE(enqueue_fill(rt->device(d).pool(), 0, *h, 40 + d).ok());
    auto back = read_back(rt->device(d).pool(), *h, 0);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(*back, pattern(40 + d, 64 * KiB)) << "device " << d;
    ASSERT_TRUE(rt->device(d).pool().free(*h).ok());
  }
}

TEST(Devices, CudaPeerCopyBetweenTwoDevicesIsVerified) {
  const std::uint32_t visible = visible_devices(BackendKind::cuda);
  if (visible < 2) GTEST_SKIP() << "needs two CUDA devices; this machine has " << visible;
  RuntimeOptions o;
  o.backend.kind = BackendKind::cuda;
  o.devices.count = 2;
  auto rt = make(o);
  ASSERT_TRUE(rt);
  constexpr std::uint64_t n = 4 * MiB;
  auto src = rt->device(0).pool().allocate(n, 1);
  auto dst = rt->device(1).pool().allocate(n, 1);
  ASSERT_TRUE(src.ok() && dst.ok());
  ASSERT_TRUE(enqueue_fill(rt->device(0).pool(), 1, *src, 77).ok());
  auto copied = rt->copy_peer(*dst, 0, *src, 0, n, 1);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  EXPECT_TRUE(copied->verified);
  // Direct over the link the driver reports, staged through the host without one.
  EXPECT_EQ(copied->link, rt->link_between(0, 1));
  EXPECT_EQ(copied->direct, copied->link != PeerLink::none);
  auto back = read_back(rt->device(1).pool(), *dst, 1);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, pattern(77, n));
  ASSERT_TRUE(rt->device(0).pool().free(*src).ok());
  ASSERT_TRUE(rt->device(1).pool().free(*dst).ok());
}


// A program's own native stream adopted on device 1 (Runtime::adopt_stream): its
// work is ordered there; device 0 refuses the same native stream and does not know
// the id (the message names device 1); released, device 0 may adopt it.
TEST(Devices, ANativeStreamAdoptedOnOneDeviceIsRefusedOnTheOtherUntilReleased) {
  RuntimeOptions o;
  o.backend.profile = "tiny";
  o.devices.count = 2;
  auto made = Runtime::create(std::move(o));
  ASSERT_TRUE(made.ok()) << made.error().message;
  Runtime& rt = **made;
  int program_stream = 0;
  Result<StreamId> s = rt.adopt_stream(1, &program_stream);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(*rt.device(1).backend().native_stream(*s), static_cast<NativeStream>(&program_stream));

  DevicePool& pool = rt.device(1).pool();
  auto h = pool.allocate(4096, *s);
  ASSERT_TRUE(h.ok());
  const std::vector<std::byte> bytes = testing::pattern(5, 4096);
  TransferPlan plan;
  plan.add(bytes.data(), *h, 0, bytes.size());
  ASSERT_TRUE(rt.device(1).engine().upload(*s, plan).ok());
  Result<std::vector<std::byte>> back = testing::read_back(pool, *h, *s);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, bytes);

  Result<StreamId> twice = rt.adopt_stream(0, &program_stream);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message.find("adopted already on device 1"), std::string::npos) << twice.error().message;
  Result<void> wrong = rt.release_stream(0, *s, std::chrono::seconds(1));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(wrong.error().message.find("device 1's"), std::string::npos) << wrong.error().message;
  EXPECT_FALSE(rt.adopt_stream(2, &program_stream).ok());
  EXPECT_FALSE(rt.release_stream(2, *s, std::chrono::seconds(1)).ok());

  ASSERT_TRUE(pool.free(*h).ok());
  ASSERT_TRUE(rt.release_stream(1, *s, std::chrono::seconds(10)).ok());
  EXPECT_FALSE(rt.release_stream(1, *s, std::chrono::seconds(1)).ok());
  Result<StreamId> now = rt.adopt_stream(0, &program_stream);
  ASSERT_TRUE(now.ok()) << now.error().message;
  EXPECT_TRUE(rt.release_stream(0, *now, std::chrono::seconds(10)).ok());
}

}  // namespace
}  // namespace ferry
