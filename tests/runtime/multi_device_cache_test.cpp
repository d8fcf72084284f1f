// One offload cache across two sim devices (multi_device_cache.hpp): each
// placement policy, a peer fill over an NVLink-class link, the host upload when
// the pair has no link or the link is no faster, a link a backend reports read
// by the cost model as the model's, a peer fill whose copy arrives
// wrong and is caught (I5), and the refusals. Every acquire's bytes are read back
// from the device that holds them and compared with the host pieces.
#include <gtest/gtest.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "ferry/devices.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/multi_device_cache.hpp"
#include "ferry/runtime.hpp"
#include "link_reporting_backend.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t KiB = 1024;
constexpr StreamId kStream = 0;

RuntimeOptions two_devices(PeerLink link, double peer_noop = 0) {
  RuntimeOptions o;
  o.backend.profile = "tiny";
  o.devices.count = 2;
  if (link != PeerLink::none) o.devices.links = {PeerLinkSpec{0, 1, link}};
  o.engine.policy = IntegrityPolicy::verify;
  SimFaults faulty;
  faulty.peer_noop = peer_noop;
  o.devices.faults = {SimFaults{}, faulty};  // device 1 pulls its peer fills, so its fault bites
  return o;
}

struct Fixture {
  std::unique_ptr<Runtime> rt;
  std::unique_ptr<MultiDeviceCache> cache;
  std::vector<std::vector<std::byte>> gate, down;  // each entry's two host pieces
};

// Four entries of two pieces each (a layer's two tensors), defined in order.
Fixture make(RuntimeOptions o, DevicePlacement placement, std::uint32_t slots = 4) {
  Fixture f;
  auto rt = Runtime::create(std::move(o));
  EXPECT_TRUE(rt.ok()) << rt.error().message;
  if (!rt.ok()) return f;
  f.rt = std::move(rt).value();
  MultiDeviceCacheOptions mo;
  mo.cache.slots = slots;
  mo.placement = placement;
  auto cache = MultiDeviceCache::create(*f.rt, mo);
  EXPECT_TRUE(cache.ok()) << cache.error().message;
  if (!cache.ok()) return f;
  f.cache = std::move(cache).value();
  for (std::uint64_t k = 0; k < 4; ++k) {
    f.gate.push_back(testing::pattern(100 + k, 96 * KiB));
    f.down.push_back(testing::pattern(200 + k, 40 * KiB));
  }
  for (std::uint64_t k = 0; k < 4; ++k) {
    EXPECT_TRUE(f.cache->define(k, {f.gate[k], f.down[k]}).ok());
  }
  return f;
}

// The entry's pieces as the device holding `ref` has them equal the host's.
void expect_bytes(Fixture& f, const DeviceCacheRef& ref) {
  DevicePool& pool = f.rt->device(ref.device).pool();
  Result<std::vector<std::byte>> got = testing::read_back(pool, ref.ref.slot, kStream);
  ASSERT_TRUE(got.ok()) << got.error().message;
  const std::uint64_t k = ref.ref.key;
  ASSERT_EQ(ref.ref.pieces.size(), 2u);
  const DeviceSlice& g = ref.ref.pieces[0];
  const DeviceSlice& d = ref.ref.pieces[1];
  EXPECT_EQ(std::vector<std::byte>(got->begin() + g.offset, got->begin() + g.offset + g.bytes), f.gate[k])
      << "entry " << k << " on device " << ref.device;
  EXPECT_EQ(std::vector<std::byte>(got->begin() + d.offset, got->begin() + d.offset + d.bytes), f.down[k])
      << "entry " << k << " on device " << ref.device;
}

void expect_valid(const MultiDeviceCache& cache) {
  std::string why;
  EXPECT_TRUE(cache.validate(&why)) << why;
}

TEST(MultiDeviceCache, RoundRobinAlternatesEntriesInDefinitionOrder) {
  Fixture f = make(two_devices(PeerLink::none), DevicePlacement::round_robin);
  ASSERT_TRUE(f.cache);
  for (std::uint64_t k = 0; k < 4; ++k) {
    ASSERT_EQ(*f.cache->placed(k), k % 2);
    Result<DeviceCacheRef> r = f.cache->acquire(k, kStream);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->device, k % 2);
    EXPECT_FALSE(r->from_peer);
    expect_bytes(f, *r);
    EXPECT_TRUE(f.cache->release(k, r->device).ok());
  }
  const MultiDeviceCacheStats s = f.cache->stats();
  EXPECT_EQ(s.host_fills, 4u);
  EXPECT_EQ(s.devices[0].uploads, 2u);
  EXPECT_EQ(s.devices[1].uploads, 2u);
  expect_valid(*f.cache);
}

TEST(MultiDeviceCache, MostRoomPlacesOnTheDeviceWithTheMostFreeSlotsAndKeepsAResidentEntryThere) {
  Fixture f = make(two_devices(PeerLink::none), DevicePlacement::most_room);
  ASSERT_TRUE(f.cache);
  std::vector<std::uint32_t> where;
  for (std::uint64_t k = 0; k < 3; ++k) {
    Result<DeviceCacheRef> r = f.cache->acquire(k, kStream);
    ASSERT_TRUE(r.ok()) << r.error().message;
    where.push_back(r->device);
    expect_bytes(f, *r);
  }
  EXPECT_EQ(where, (std::vector<std::uint32_t>{0, 1, 0}));  // a tie goes to the lowest index
  EXPECT_EQ(*f.cache->placed(1), 1u) << "a resident entry stays where it is";
  Result<DeviceCacheRef> again = f.cache->acquire(1, kStream);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->device, 1u);
  EXPECT_TRUE(again->ref.hit);
  expect_valid(*f.cache);
}

TEST(MultiDeviceCache, AnNvlinkPairFillsFromThePeerInsteadOfTheHost) {
  Fixture f = make(two_devices(PeerLink::nvlink), DevicePlacement::round_robin);
  ASSERT_TRUE(f.cache);
  Result<DeviceCacheRef> first = f.cache->acquire(2, 0, kStream);
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_FALSE(first->from_peer) << "no device held it: the host uploads";
  ASSERT_TRUE(f.cache->release(2, 0).ok());

  Result<DeviceCacheRef> moved = f.cache->acquire(2, 1, kStream);
  ASSERT_TRUE(moved.ok()) << moved.error().message;
  EXPECT_TRUE(moved->from_peer);
  EXPECT_FALSE(moved->ref.hit);
  expect_bytes(f, *moved);
  const MultiDeviceCacheStats s = f.cache->stats();
  EXPECT_EQ(s.peer_fills, 1u);
  EXPECT_EQ(s.host_fills, 1u);
  EXPECT_EQ(s.devices[1].uploads, 0u);
  EXPECT_EQ(s.devices[1].fills, 1u);
  EXPECT_EQ(s.bytes_peer, s.devices[1].bytes_filled);
  EXPECT_GE(s.bytes_peer, (96 + 40) * KiB);
  EXPECT_TRUE(f.cache->resident(2, 0)) << "the source keeps its copy";
  expect_valid(*f.cache);
}

// The cost model reads the link the Runtime holds (Runtime::link_between): one a
// backend reports, with no model link given, fills from the peer as the model's does.
TEST(MultiDeviceCache, ALinkTheBackendReportsIsTheOneItsCostModelReads) {
  RuntimeOptions o = two_devices(PeerLink::none);
  testing::report_links(o, [](std::uint32_t, std::uint32_t) -> Result<std::optional<PeerLink>> {
    return std::optional(PeerLink::nvlink);
  });
  Fixture f = make(std::move(o), DevicePlacement::round_robin);
  ASSERT_TRUE(f.cache);
  ASSERT_TRUE(f.cache->acquire(2, 0, kStream).ok());
  ASSERT_TRUE(f.cache->release(2, 0).ok());
  Result<DeviceCacheRef> moved = f.cache->acquire(2, 1, kStream);
  ASSERT_TRUE(moved.ok()) << moved.error().message;
  EXPECT_TRUE(moved->from_peer);
  expect_bytes(f, *moved);
  EXPECT_EQ(f.cache->stats().peer_fills, 1u);
  expect_valid(*f.cache);
}

TEST(MultiDeviceCache, APairWithoutALinkOrWithAPcieLinkUploadsFromTheHost) {
  for (const PeerLink link : {PeerLink::none, PeerLink::pcie}) {
    SCOPED_TRACE(std::string(to_string(link)));
    Fixture f = make(two_devices(link), DevicePlacement::round_robin);
    ASSERT_TRUE(f.cache);
    ASSERT_TRUE(f.cache->acquire(0, 0, kStream).ok());
    // No link stages through the host (a download and an upload); PCIe's modeled
    // peer copy costs what the host link does: neither is faster.
    Result<DeviceCacheRef> other = f.cache->acquire(0, 1, kStream);
    ASSERT_TRUE(other.ok()) << other.error().message;
    EXPECT_FALSE(other->from_peer);
    expect_bytes(f, *other);
    EXPECT_EQ(f.cache->stats().peer_fills, 0u);
    EXPECT_EQ(f.cache->stats().devices[1].uploads, 1u);
  }
}

TEST(MultiDeviceCache, APeerFillThatArrivesWrongIsCaughtAndTheBytesAreRight) {
  Fixture f = make(two_devices(PeerLink::nvlink, /*peer_noop=*/1.0), DevicePlacement::round_robin);
  ASSERT_TRUE(f.cache);
  ASSERT_TRUE(f.cache->acquire(3, 0, kStream).ok());
  Result<DeviceCacheRef> moved = f.cache->acquire(3, 1, kStream);
  ASSERT_TRUE(moved.ok()) << moved.error().message;
  EXPECT_TRUE(moved->from_peer);
  expect_bytes(f, *moved);  // verify compared the hashes and redid the copy through the host
  EXPECT_GE(f.rt->device(1).backend().fault_counters().swallowed_peer_copies, 1u);
}

TEST(MultiDeviceCache, RefusesAnUnknownDeviceAndAnUndefinedKey) {
  Fixture f = make(two_devices(PeerLink::none), DevicePlacement::round_robin);
  ASSERT_TRUE(f.cache);
  Result<DeviceCacheRef> r = f.cache->acquire(0, 2, kStream);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("device 2 is not one of the runtime's 2"), std::string::npos)
      << r.error().message;
  EXPECT_EQ(f.cache->acquire(99, kStream).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(f.cache->release(0, 7).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(f.cache->release(0, 0).error().code, ErrorCode::invalid_argument) << "not pinned";
  EXPECT_EQ(f.cache->define(0, {f.gate[0]}).error().code, ErrorCode::invalid_argument) << "defined twice";
  expect_valid(*f.cache);
}

}  // namespace
}  // namespace ferry
