// What a direct peer copy's pull is ordered after (Runtime::copy_peer,
// DevicePool::last_uses): the source block's own uses on every stream of its
// device (I3), not the rest of the source's stream. On two sim devices linked
// over NVLink, the race checker on: integrity off and verify (whose source hash
// is one more reader ordered the same way).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "ferry/devices.hpp"
#include "ferry/runtime.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

using testing::pattern;
using testing::read_back;

constexpr std::uint64_t KiB = 1024, MiB = 1024 * 1024;
constexpr StreamId kStream = 1;  // copy_peer's stream on both devices
constexpr StreamId kOther = 2;   // another stream of the source's device

std::unique_ptr<Runtime> make(IntegrityPolicy policy) {
  RuntimeOptions o;
  o.backend.profile = "tiny";
  o.backend.race_check = true;
  o.devices.count = 2;
  o.devices.links = {PeerLinkSpec{0, 1, PeerLink::nvlink}};
  o.engine.policy = policy;
  auto made = Runtime::create(std::move(o));
  EXPECT_TRUE(made.ok()) << made.error().message;
  return made.ok() ? std::move(made).value() : nullptr;
}

std::uint64_t races(Runtime& rt) {
  std::shared_ptr<const RaceLog> log = rt.device(0).backend().race_log();
  EXPECT_TRUE(log);
  return log ? log->count : 0;
}

class PeerOrder : public ::testing::TestWithParam<IntegrityPolicy> {};

// The source is written on the copy's stream, then long work on another block
// is queued there (off: a compute of 1 ms; verify: a download of 4 MiB, 0.4 ms,
// since a compute would hold the one compute engine the source's hash needs).
// The pull completes on the modeled clock before that work does.
TEST_P(PeerOrder, ThePullDoesNotWaitForUnrelatedWorkQueuedOnTheSourceStream) {
  auto rt = make(GetParam());
  ASSERT_TRUE(rt);
  constexpr std::uint64_t n = 64 * KiB, big = 4 * MiB;
  DevicePool& p0 = rt->device(0).pool();
  auto src = p0.allocate(n, kStream);
  auto other = p0.allocate(big, kStream);
  auto dst = rt->device(1).pool().allocate(n, kStream);
  ASSERT_TRUE(src.ok() && other.ok() && dst.ok());
  ASSERT_TRUE(enqueue_fill(p0, kStream, *src, 5).ok());
  std::vector<std::byte> host(big);
  const bool off = GetParam() == IntegrityPolicy::off;
  Result<Ticket> unrelated = off ? enqueue_compute(p0, kStream, {}, *other, 1e10, 0)
                                 : enqueue_copy_to_host(p0, kStream, *other, host);
  ASSERT_TRUE(unrelated.ok()) << unrelated.error().message;

  auto copied = rt->copy_peer(*dst, 0, *src, 0, n, kStream);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  EXPECT_TRUE(copied->direct);
  EXPECT_EQ(copied->verified, !off);
  ASSERT_TRUE(rt->device(1).order().wait(copied->done).ok());
  const std::uint64_t pulled_ns = rt->device(1).backend().now_ns();
  ASSERT_TRUE(rt->device(0).order().wait({kStream, *unrelated}).ok());
  const std::uint64_t unrelated_ns = rt->device(0).backend().now_ns();
  EXPECT_LT(pulled_ns, unrelated_ns) << "the pull waited for the source stream's later work";
  EXPECT_LT(pulled_ns * 2, unrelated_ns) << "the pull took half the unrelated work's time or more";

  auto back = read_back(rt->device(1).pool(), *dst, kStream);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, pattern(5, n));
  ASSERT_TRUE(rt->synchronize().ok());
  EXPECT_EQ(races(*rt), 0u);
}

// The source is written on another stream of its device than the copy's, and
// nothing orders the copy's stream after it: the pull still follows the write
// (its bytes arrive, no race), and later work on the copy's stream does not
// wait for the write.
TEST_P(PeerOrder, ThePullWaitsForAWriteOnAnotherStreamOfTheSource) {
  auto rt = make(GetParam());
  ASSERT_TRUE(rt);
  constexpr std::uint64_t n = 2 * MiB;
  DevicePool& p0 = rt->device(0).pool();
  auto src = p0.allocate(n, kOther);
  auto dst = rt->device(1).pool().allocate(n, kStream);
  ASSERT_TRUE(src.ok() && dst.ok());
  ASSERT_TRUE(enqueue_fill(p0, kOther, *src, 77).ok());
  ASSERT_TRUE(enqueue_fill(p0, kOther, *src, 78).ok());  // two writes: the pull follows the last

  auto copied = rt->copy_peer(*dst, 0, *src, 0, n, kStream);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  EXPECT_TRUE(copied->direct);
  EXPECT_EQ(copied->verified, GetParam() != IntegrityPolicy::off);
  EXPECT_EQ(copied->recovered, 0u);
  auto back = read_back(rt->device(1).pool(), *dst, kStream);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, pattern(78, n));
  ASSERT_TRUE(rt->synchronize().ok());
  EXPECT_EQ(races(*rt), 0u);
  EXPECT_EQ(rt->device(0).backend().fault_counters().illegal_accesses, 0u);
  EXPECT_EQ(rt->device(1).backend().fault_counters().illegal_accesses, 0u);
}

INSTANTIATE_TEST_SUITE_P(Policies, PeerOrder, ::testing::Values(IntegrityPolicy::off, IntegrityPolicy::verify),
                         [](const auto& p) { return std::string(to_string(p.param)); });

}  // namespace
}  // namespace ferry
