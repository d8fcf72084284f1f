// Peer access on the CUDA backend (docs/scale.md): the link of a pair is the
// driver's (Runtime::link_between), a direct copy reaches granules mapped after
// the access was opened (each later map grants the peer too), and a source freed
// while its direct copy is queued keeps its bytes (I2). One device: no link, and
// a peer copy from itself is refused as an error. Skips without a device or
// driver; the two-device tests skip on a machine with one.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "ferry/devices.hpp"
#include "ferry/runtime.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

using testing::pattern;
using testing::read_back;

constexpr std::uint64_t MiB = 1024 * 1024;
constexpr StreamId kStream = 1;

RuntimeOptions cuda_devices(std::uint32_t count, IntegrityPolicy policy = IntegrityPolicy::verify) {
  RuntimeOptions o;
  o.backend.kind = BackendKind::cuda;
  o.devices.count = count;
  o.engine.policy = policy;
  return o;
}

std::unique_ptr<Runtime> make(RuntimeOptions o) {
  auto made = Runtime::create(std::move(o));
  EXPECT_TRUE(made.ok()) << made.error().message;
  return made.ok() ? std::move(made).value() : nullptr;
}

// Why this machine cannot run a test that needs `n` CUDA devices; empty when it can.
std::string missing_devices(std::uint32_t n) {
  const std::uint32_t visible = visible_devices(BackendKind::cuda);
  if (visible == 0) return "no CUDA device or driver";
  if (visible < n) return "needs " + std::to_string(n) + " CUDA devices; this machine has " + std::to_string(visible);
  return {};
}

TEST(CudaPeer, OneDeviceHasNoLinkAndAPeerCopyFromItselfIsRefused) {
  if (const std::string why = missing_devices(1); !why.empty()) GTEST_SKIP() << why;
  auto rt = make(cuda_devices(1));
  ASSERT_TRUE(rt);
  EXPECT_EQ(rt->link_between(0, 0), PeerLink::none);
  if (visible_devices(BackendKind::cuda) == 1) {
    EXPECT_FALSE(rt->backend().info().peer_copy) << "no other device to reach";
  }
  DevicePool& pool = rt->pool();
  auto h = pool.allocate(MiB, kStream);
  ASSERT_TRUE(h.ok()) << h.error().message;
  Result<DeviceSpan> span = pool.resolve(*h);
  ASSERT_TRUE(span.ok());
  Result<Ticket> t = rt->order().submit(kStream, [&](Ticket) -> Result<Op> {
    return Op{PeerCopyOp{DeviceRange{span->addr, MiB}, &rt->backend(), span->addr, PeerLink::pcie}};
  });
  ASSERT_FALSE(t.ok()) << "a device is not its own peer";
  EXPECT_TRUE(t.error().code == ErrorCode::unsupported || t.error().code == ErrorCode::invalid_argument)
      << t.error().message;
  // Refused at admission: the device has no fault and its work goes on.
  ASSERT_TRUE(enqueue_fill(pool, kStream, *h, 5).ok());
  auto back = read_back(pool, *h, kStream);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, pattern(5, MiB));
  ASSERT_TRUE(pool.free(*h).ok());
}

TEST(CudaPeer, ThePairsLinkIsTheDriversAndTheSameBothWays) {
  if (const std::string why = missing_devices(2); !why.empty()) GTEST_SKIP() << why;
  auto rt = make(cuda_devices(2));
  ASSERT_TRUE(rt);
  const PeerLink link = rt->link_between(0, 1);
  EXPECT_EQ(rt->link_between(1, 0), link);
  if (link != PeerLink::none) {
    EXPECT_TRUE(rt->device(0).backend().info().peer_copy);
    EXPECT_TRUE(rt->device(1).backend().info().peer_copy);
  }
  std::printf("ferry cuda: devices 0 and 1 (%s, %s): link %s\n", rt->device(0).backend().info().device.c_str(),
              rt->device(1).backend().info().device.c_str(), std::string(to_string(link)).c_str());
}

// Blocks allocated after create map fresh granules; a trim unmaps them and the
// next allocation maps them again: each must be readable by the peer.
TEST(CudaPeer, ADirectCopyReachesGranulesMappedAfterTheAccessWasOpened) {
  if (const std::string why = missing_devices(2); !why.empty()) GTEST_SKIP() << why;
  for (const IntegrityPolicy policy : {IntegrityPolicy::off, IntegrityPolicy::verify}) {
    SCOPED_TRACE(std::string(to_string(policy)));
    auto rt = make(cuda_devices(2, policy));
    ASSERT_TRUE(rt);
    const bool linked = rt->link_between(0, 1) != PeerLink::none;
    for (int round = 0; round < 2; ++round) {
      for (const std::uint32_t from : {0u, 1u}) {
        const std::uint32_t to = 1 - from;
        constexpr std::uint64_t n = 64 * MiB;
        const std::uint64_t seed = 300 + 10 * static_cast<std::uint64_t>(round) + from;
        auto src = rt->device(from).pool().allocate(n, kStream);
        auto dst = rt->device(to).pool().allocate(n, kStream);
        ASSERT_TRUE(src.ok() && dst.ok());
        ASSERT_TRUE(enqueue_fill(rt->device(from).pool(), kStream, *src, seed).ok());
        auto copied = rt->copy_peer(*dst, 0, *src, 0, n, kStream);
        ASSERT_TRUE(copied.ok()) << copied.error().message;
        EXPECT_EQ(copied->direct, linked) << "device " << from << " to " << to;
        EXPECT_EQ(copied->recovered, 0u);
        auto back = read_back(rt->device(to).pool(), *dst, kStream);
        ASSERT_TRUE(back.ok()) << back.error().message;
        EXPECT_EQ(*back, pattern(seed, n)) << "device " << from << " to " << to << ", round " << round;
        ASSERT_TRUE(rt->device(from).pool().free(*src).ok());
        ASSERT_TRUE(rt->device(to).pool().free(*dst).ok());
      }
      for (std::uint32_t d = 0; d < 2; ++d) {
        ASSERT_TRUE(rt->device(d).backend().synchronize().ok());
        ASSERT_TRUE(rt->device(d).pool().trim().ok());
      }
    }
  }
}

TEST(CudaPeer, ASourceFreedWhileItsDirectCopyIsQueuedKeepsItsBytes) {
  if (const std::string why = missing_devices(2); !why.empty()) GTEST_SKIP() << why;
  auto rt = make(cuda_devices(2, IntegrityPolicy::off));
  ASSERT_TRUE(rt);
  if (rt->link_between(0, 1) == PeerLink::none) GTEST_SKIP() << "devices 0 and 1 have no peer link";
  constexpr std::uint64_t n = 32 * MiB;
  DevicePool& p0 = rt->device(0).pool();
  auto src = p0.allocate(n, kStream);
  auto dst = rt->device(1).pool().allocate(n, kStream);
  ASSERT_TRUE(src.ok() && dst.ok());
  ASSERT_TRUE(enqueue_fill(p0, kStream, *src, 41).ok());
  auto copied = rt->copy_peer(*dst, 0, *src, 0, n, kStream);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  ASSERT_TRUE(copied->direct);
  ASSERT_TRUE(p0.free(*src).ok());
  // Reuses the freed block on the source's stream: ordered after the pull (its lease).
  auto reuse = p0.allocate(n, kStream);
  ASSERT_TRUE(reuse.ok());
  ASSERT_TRUE(enqueue_fill(p0, kStream, *reuse, 42).ok());
  auto back = read_back(rt->device(1).pool(), *dst, kStream);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, pattern(41, n));
  ASSERT_TRUE(p0.free(*reuse).ok());
  ASSERT_TRUE(rt->device(1).pool().free(*dst).ok());
}

}  // namespace
}  // namespace ferry
