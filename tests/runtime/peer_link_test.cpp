// Peer copies over a modeled link (devices.hpp: DevicesOptions::links): the
// selection's refusals, the direct path and its cost on each link, the injected
// peer no-op caught under each integrity policy that checks (I5), a held
// destination, and a direct copy's source, that keep the source's bytes after
// the source is freed (I2), and the source's held work ordered before the copy.
// On two sim devices.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ferry/devices.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/runtime.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

using testing::pattern;
using testing::read_back;

constexpr std::uint64_t KiB = 1024, MiB = 1024 * 1024;
constexpr StreamId kStream = 1;

RuntimeOptions linked(PeerLink link, IntegrityPolicy policy = IntegrityPolicy::verify, double peer_noop = 0) {
  RuntimeOptions o;
  o.backend.profile = "tiny";
  o.devices.count = 2;
  o.devices.links = {PeerLinkSpec{0, 1, link}};
  o.engine.policy = policy;
  SimFaults faulty;
  faulty.peer_noop = peer_noop;
  o.devices.faults = {SimFaults{}, faulty};  // the destination's device pulls, so its fault bites
  return o;
}

std::unique_ptr<Runtime> make(RuntimeOptions o) {
  auto made = Runtime::create(std::move(o));
  EXPECT_TRUE(made.ok()) << made.error().message;
  return made.ok() ? std::move(made).value() : nullptr;
}

void refused(RuntimeOptions o, const std::string& says) {
  auto made = Runtime::create(std::move(o));
  ASSERT_FALSE(made.ok()) << "expected a refusal saying: " << says;
  EXPECT_EQ(made.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(made.error().message.find(says), std::string::npos) << made.error().message;
}

// A block on each device: the source filled with `seed`, the destination with
// other bytes.
struct Pair {
  DeviceHandle src, dst;
};
Pair filled_pair(Runtime& rt, std::uint64_t bytes, std::uint64_t seed) {
  DevicePool& p0 = rt.device(0).pool();
  DevicePool& p1 = rt.device(1).pool();
  auto src = p0.allocate(bytes, kStream);
  auto dst = p1.allocate(bytes, kStream);
  EXPECT_TRUE(src.ok() && dst.ok());
  if (!src.ok() || !dst.ok()) return {};
  EXPECT_TRUE(enqueue_fill(p0, kStream, *src, seed).ok());
  EXPECT_TRUE(enqueue_fill(p1, kStream, *dst, seed + 1000).ok());
  return {*src, *dst};
}

TEST(PeerLinks, TheSelectionRefusesLinksThatNameNoPairOrNoLink) {
  RuntimeOptions o = linked(PeerLink::pcie);
  o.devices.links = {PeerLinkSpec{0, 2, PeerLink::pcie}};
  refused(o, "beyond the 2 asked for");
  o.devices.links = {PeerLinkSpec{1, 1, PeerLink::pcie}};
  refused(o, "joins a device to itself");
  o.devices.links = {PeerLinkSpec{0, 1, PeerLink::pcie}, PeerLinkSpec{1, 0, PeerLink::nvlink}};
  refused(o, "listed twice");
  o.devices.links = {PeerLinkSpec{0, 1, PeerLink::none}};
  refused(o, "neither pcie nor nvlink");
  o.devices.links = {PeerLinkSpec{0, 1, PeerLink::nvlink}};
  o.devices.profiles = {"tiny", "rtx4090"};
  refused(o, "device 1's profile rtx4090 has none");
  o.devices.links = {PeerLinkSpec{0, 1, PeerLink::pcie}};
  EXPECT_TRUE(make(o));

  BackendSpec cuda;
  cuda.kind = BackendKind::cuda;
  DevicesOptions two;
  two.count = 2;
  two.links = {PeerLinkSpec{0, 1, PeerLink::nvlink}};
  auto real = device_specs(cuda, two);
  ASSERT_FALSE(real.ok());
  EXPECT_NE(real.error().message.find("sim's model"), std::string::npos) << real.error().message;

  EXPECT_EQ(link_between(two, 1, 0), PeerLink::nvlink);
  EXPECT_EQ(link_between(two, 0, 2), PeerLink::none);
}

TEST(PeerLinks, LinksParseFromTextAndTheirNamesReadBack) {
  Result<std::vector<PeerLinkSpec>> links = parse_peer_links(" 0-1:nvlink ,2-1:pcie");
  ASSERT_TRUE(links.ok()) << links.error().message;
  ASSERT_EQ(links->size(), 2u);
  EXPECT_EQ((*links)[0].a, 0u);
  EXPECT_EQ((*links)[0].b, 1u);
  EXPECT_EQ((*links)[0].link, PeerLink::nvlink);
  EXPECT_EQ((*links)[1].a, 2u);
  EXPECT_EQ((*links)[1].link, PeerLink::pcie);
  ASSERT_TRUE(parse_peer_links("").ok());
  EXPECT_TRUE(parse_peer_links("  ")->empty());
  for (const PeerLink l : {PeerLink::none, PeerLink::pcie, PeerLink::nvlink}) {
    EXPECT_EQ(*parse_peer_link(to_string(l)), l);
  }
  for (const char* bad : {"0-1", "0:nvlink", "0-1:warp", "a-1:pcie", "0-64:pcie", "0-1:pcie,", ",0-1:pcie",
                          "0-1:pcie,,1-2:pcie", "-1-0:pcie", "0-1:NVLINK"}) {
    Result<std::vector<PeerLinkSpec>> r = parse_peer_links(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument) << bad;
    EXPECT_NE(r.error().message.find("expected A-B:KIND"), std::string::npos) << r.error().message;
  }
}

TEST(PeerLinks, ThePeerNoopFaultParsesAndReadsBack) {
  auto f = parse_fault_spec("peer-noop:0.25,pinned-noop");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->peer_noop, 0.25);
  EXPECT_EQ(f->pinned_noop, 1.0);
  EXPECT_EQ(describe(*f), "pinned-noop,peer-noop:0.25");
  auto whole = parse_fault_spec("peer-noop");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->peer_noop, 1.0);
  auto bad = parse_fault_spec("peer-noop:1.5");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("outside [0, 1]"), std::string::npos) << bad.error().message;
}

// --- Each integrity policy, with and without the injected no-op -------------------

struct Case {
  IntegrityPolicy policy;
  PeerLink link;
};

class PeerLinkCopy : public ::testing::TestWithParam<Case> {};

TEST_P(PeerLinkCopy, ADirectCopyMovesTheBytesWithoutTheHost) {
  auto rt = make(linked(GetParam().link, GetParam().policy));
  ASSERT_TRUE(rt);
  constexpr std::uint64_t n = 96 * KiB;
  const Pair pr = filled_pair(*rt, n, 7);
  const ArenaStats arena_before = rt->device(1).arena().stats();
  auto copied = rt->copy_peer(pr.dst, 0, pr.src, 0, n, kStream);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  EXPECT_TRUE(copied->direct);
  EXPECT_EQ(copied->link, GetParam().link);
  EXPECT_EQ(copied->verified, GetParam().policy != IntegrityPolicy::off);
  EXPECT_EQ(copied->recovered, 0u);
  ASSERT_TRUE(rt->device(1).order().wait(copied->done).ok());
  auto back = read_back(rt->device(1).pool(), pr.dst, kStream);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, pattern(7, n));
  // Nothing went through the host: no engine transfer, no arena block.
  EXPECT_EQ(rt->device(0).engine().counters().transfers, 0u);
  EXPECT_EQ(rt->device(1).engine().counters().transfers, 0u);
  EXPECT_EQ(rt->device(1).arena().stats().allocs, arena_before.allocs);
}

// The no-op on the destination device's peer copies: probe and verify hash both
// sides, catch it and redo the copy through the host (I5); off lets it through
// silently, which shows the fault fired.
TEST_P(PeerLinkCopy, AnInjectedPeerNoopIsCaughtAndRedoneThroughTheHost) {
  auto rt = make(linked(GetParam().link, GetParam().policy, 1.0));
  ASSERT_TRUE(rt);
  constexpr std::uint64_t n = 64 * KiB;
  for (std::uint64_t round = 0; round < 3; ++round) {
    const Pair pr = filled_pair(*rt, n, 20 + round);
    auto copied = rt->copy_peer(pr.dst, 0, pr.src, 0, n, kStream);
    ASSERT_TRUE(copied.ok()) << copied.error().message;
    auto back = read_back(rt->device(1).pool(), pr.dst, kStream);
    ASSERT_TRUE(back.ok()) << back.error().message;
    if (GetParam().policy == IntegrityPolicy::off) {
      EXPECT_TRUE(copied->direct);
      EXPECT_EQ(*back, pattern(20 + round + 1000, n)) << "off: the destination keeps its old bytes";
    } else {
      EXPECT_FALSE(copied->direct) << "redone through the host";
      EXPECT_EQ(copied->recovered, 1u);
      EXPECT_EQ(*back, pattern(20 + round, n));
    }
    ASSERT_TRUE(rt->device(0).pool().free(pr.src).ok());
    ASSERT_TRUE(rt->device(1).pool().free(pr.dst).ok());
  }
  EXPECT_EQ(rt->device(1).backend().fault_counters().swallowed_peer_copies, 3u);
  EXPECT_EQ(rt->device(0).backend().fault_counters().swallowed_peer_copies, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Policies, PeerLinkCopy,
    ::testing::Values(Case{IntegrityPolicy::off, PeerLink::pcie}, Case{IntegrityPolicy::probe, PeerLink::pcie},
                      Case{IntegrityPolicy::verify, PeerLink::pcie}, Case{IntegrityPolicy::off, PeerLink::nvlink},
                      Case{IntegrityPolicy::probe, PeerLink::nvlink}, Case{IntegrityPolicy::verify, PeerLink::nvlink}),
    [](const auto& p) { return std::string(to_string(p.param.policy)) + "_" + std::string(to_string(p.param.link)); });

// --- The link model ---------------------------------------------------------------

// The virtual time one copy of `bytes` costs the destination's device.
std::uint64_t copy_ns(PeerLink link, std::uint64_t bytes) {
  RuntimeOptions o = linked(link, IntegrityPolicy::off);
  if (link == PeerLink::none) o.devices.links.clear();
  auto rt = make(o);
  if (!rt) return 0;
  const Pair pr = filled_pair(*rt, bytes, 3);
  if (!rt->device(1).order().wait({kStream, rt->device(1).backend().submitted(kStream)}).ok()) return 0;
  const std::uint64_t before = rt->device(1).backend().now_ns();
  auto copied = rt->copy_peer(pr.dst, 0, pr.src, 0, bytes, kStream);
  EXPECT_TRUE(copied.ok()) << copied.error().message;
  if (!copied.ok()) return 0;
  EXPECT_EQ(copied->direct, link != PeerLink::none);
  if (!rt->device(1).order().wait(copied->done).ok()) return 0;
  return rt->device(1).backend().now_ns() - before;
}

TEST(PeerLinks, EachLinkCostsItsProfileFigures) {
  constexpr std::uint64_t n = 4 * MiB;
  const std::uint64_t nvlink = copy_ns(PeerLink::nvlink, n);
  const std::uint64_t pcie = copy_ns(PeerLink::pcie, n);
  const std::uint64_t staged = copy_ns(PeerLink::none, n);
  // tiny: NVLink-class 40 GB/s + 1 us, PCIe 10 GB/s + 1 us.
  EXPECT_EQ(nvlink, 1000 + (n * 1'000'000'000 + 40'000'000'000 - 1) / 40'000'000'000);
  EXPECT_EQ(pcie, 1000 + (n * 1'000'000'000 + 10'000'000'000 - 1) / 10'000'000'000);
  EXPECT_LT(nvlink, pcie);
  EXPECT_GT(staged, 0u);
}

// --- Leases and order across the two devices -------------------------------------

// A held destination stream takes the staged path; the source is then freed and
// its memory reused and overwritten before the held upload dispatches: the
// destination still gets the source's bytes as they were at the copy (I2). Under
// off, so that nothing waits for the upload (verify's hash would dispatch it).
TEST(PeerLinks, ASourceFreedWhileItsCopyIsHeldKeepsTheBytesTheCopyRead) {
  auto rt = make(linked(PeerLink::nvlink, IntegrityPolicy::off));
  ASSERT_TRUE(rt);
  constexpr std::uint64_t n = 128 * KiB;
  DevicePool& p0 = rt->device(0).pool();
  const Pair pr = filled_pair(*rt, n, 41);
  ASSERT_TRUE(rt->device(1).order().wait({kStream, rt->device(1).backend().submitted(kStream)}).ok());
  rt->device(1).backend().set_hold(kStream, true);
  auto copied = rt->copy_peer(pr.dst, 0, pr.src, 0, n, kStream);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  EXPECT_FALSE(copied->direct) << "a held destination goes through the host";
  EXPECT_FALSE(rt->device(1).order().is_complete(copied->done)) << "the upload leg is held";
  ASSERT_TRUE(p0.free(pr.src).ok());
  auto reuse = p0.allocate(n, kStream);
  ASSERT_TRUE(reuse.ok());
  ASSERT_TRUE(enqueue_fill(p0, kStream, *reuse, 99).ok());
  auto overwritten = read_back(p0, *reuse, kStream);
  ASSERT_TRUE(overwritten.ok());
  EXPECT_EQ(*overwritten, pattern(99, n));
  rt->device(1).backend().set_hold(kStream, false);
  ASSERT_TRUE(rt->device(1).order().wait(copied->done).ok());
  auto back = read_back(rt->device(1).pool(), pr.dst, kStream);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, pattern(41, n));
  EXPECT_EQ(rt->device(0).backend().fault_counters().illegal_accesses, 0u);
  EXPECT_EQ(rt->device(1).backend().fault_counters().illegal_accesses, 0u);
}

// The direct path: the source's stream is held, so the source's wait for the
// pull (which leases the source) stays in its host queue and nothing runs the
// pull; copy_peer returns with the pull queued. The source is freed and its
// memory, the only room on device 0, asked for again: the pool dispatches the
// held wait, which runs the pull, and reuses the block only once the pull read
// it (I2 across devices), so the destination gets the source's bytes, not the
// reuse's.
TEST(PeerLinks, ASourceFreedWhileItsDirectCopyIsQueuedKeepsItsBytes) {
  constexpr std::uint64_t n = 128 * KiB;
  RuntimeOptions o = linked(PeerLink::nvlink, IntegrityPolicy::off);
  o.pool.capacity = 2 * n;
  auto rt = make(o);
  ASSERT_TRUE(rt);
  DevicePool& p0 = rt->device(0).pool();
  const Pair pr = filled_pair(*rt, n, 43);
  auto filler = p0.allocate(n, kStream);  // device 0 is full
  ASSERT_TRUE(filler.ok()) << filler.error().message;
  ASSERT_TRUE(rt->synchronize().ok());
  const std::uint64_t src_addr = p0.resolve(pr.src)->addr;
  rt->device(0).backend().set_hold(kStream, true);
  auto copied = rt->copy_peer(pr.dst, 0, pr.src, 0, n, kStream);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  EXPECT_TRUE(copied->direct);
  EXPECT_FALSE(rt->device(1).order().is_complete(copied->done)) << "copy_peer returned before the pull ran";
  ASSERT_TRUE(p0.free(pr.src).ok());
  auto reuse = p0.allocate(n, kStream + 1);
  ASSERT_TRUE(reuse.ok()) << reuse.error().message;
  EXPECT_EQ(p0.resolve(*reuse)->addr, src_addr) << "the test needs the source's memory reused";
  ASSERT_TRUE(enqueue_fill(p0, kStream + 1, *reuse, 99).ok());
  auto overwritten = read_back(p0, *reuse, kStream + 1);
  ASSERT_TRUE(overwritten.ok()) << overwritten.error().message;
  EXPECT_EQ(*overwritten, pattern(99, n));
  ASSERT_TRUE(rt->device(1).order().wait(copied->done).ok());
  auto back = read_back(rt->device(1).pool(), pr.dst, kStream);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, pattern(43, n));
  rt->device(0).backend().set_hold(kStream, false);
  ASSERT_TRUE(rt->synchronize().ok());
  EXPECT_EQ(rt->device(0).backend().fault_counters().illegal_accesses, 0u);
  EXPECT_EQ(rt->device(1).backend().fault_counters().illegal_accesses, 0u);
}

// The source's writes still held in its stream's queue are dispatched and
// completed before the destination's device pulls: the copy reads them.
TEST(PeerLinks, TheSourcesHeldWorkIsOrderedBeforeTheDirectCopy) {
  auto rt = make(linked(PeerLink::pcie, IntegrityPolicy::off));
  ASSERT_TRUE(rt);
  constexpr std::uint64_t n = 32 * KiB;
  const Pair pr = filled_pair(*rt, n, 5);
  rt->device(0).backend().set_hold(kStream, true);
  ASSERT_TRUE(enqueue_fill(rt->device(0).pool(), kStream, pr.src, 77).ok());
  auto copied = rt->copy_peer(pr.dst, 0, pr.src, 0, n, kStream);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  EXPECT_TRUE(copied->direct);
  auto back = read_back(rt->device(1).pool(), pr.dst, kStream);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, pattern(77, n));
  rt->device(0).backend().set_hold(kStream, false);
}

// Offsets on both sides, and the sim refusing a peer copy whose peer is itself.
TEST(PeerLinks, OffsetsAreHonouredAndAPeerOfItselfIsRefused) {
  auto rt = make(linked(PeerLink::nvlink));
  ASSERT_TRUE(rt);
  constexpr std::uint64_t n = 16 * KiB;
  const Pair pr = filled_pair(*rt, n, 11);
  auto copied = rt->copy_peer(pr.dst, 4 * KiB, pr.src, 8 * KiB, 8 * KiB, kStream);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  EXPECT_TRUE(copied->direct && copied->verified);
  auto back = read_back(rt->device(1).pool(), pr.dst, kStream);
  ASSERT_TRUE(back.ok());
  const std::vector<std::byte> src = pattern(11, n), old = pattern(1011, n);
  EXPECT_TRUE(std::equal(back->begin(), back->begin() + 4 * KiB, old.begin()));
  EXPECT_TRUE(std::equal(back->begin() + 4 * KiB, back->begin() + 12 * KiB, src.begin() + 8 * KiB));
  EXPECT_TRUE(std::equal(back->begin() + 12 * KiB, back->end(), old.begin() + 12 * KiB));

  Backend& b1 = rt->device(1).backend();
  auto span = rt->device(1).pool().resolve(pr.dst);
  ASSERT_TRUE(span.ok());
  auto self = b1.enqueue(kStream, PeerCopyOp{DeviceRange{span->addr, 256}, &b1, span->addr + 4096, PeerLink::pcie});
  ASSERT_FALSE(self.ok());
  EXPECT_EQ(self.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(self.error().message.find("not another sim device"), std::string::npos) << self.error().message;
}

}  // namespace
}  // namespace ferry
