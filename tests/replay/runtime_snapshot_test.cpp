// One snapshot of every device of a Runtime (runtime_snapshot.hpp): each device's
// pool under its index with its own blocks and owners, the totals summed, the JSON
// of several devices, and the one-device JSON byte for byte the pool's.
#include "ferry/runtime_snapshot.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <set>
#include <string>

#include "ferry/runtime.hpp"

namespace ferry {
namespace {

std::unique_ptr<Runtime> make(std::uint32_t devices) {
  RuntimeOptions o;
  o.backend.profile = "tiny";
  o.devices.count = devices;
  auto rt = Runtime::create(std::move(o));
  EXPECT_TRUE(rt.ok()) << rt.error().message;
  return rt.ok() ? std::move(rt).value() : nullptr;
}

TEST(RuntimeSnapshot, EachDeviceUnderItsIndexWithItsOwnBlocksAndTheTotals) {
  auto rt = make(2);
  ASSERT_TRUE(rt);
  auto a = rt->device(0).pool().allocate(4096, 0);
  auto b = rt->device(1).pool().allocate(8192, 0);
  auto c = rt->device(1).pool().allocate(3 << 20, 1);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const NamedHandle owners[] = {{"a", *a}, {"b", *b}, {"c", *c}};
  const RuntimeSnapshot s = take_snapshot(*rt, owners);

  ASSERT_EQ(s.devices.size(), 2u);
  ASSERT_EQ(s.devices[0].blocks.size(), 1u);
  EXPECT_EQ(s.devices[0].owners[0], "a");
  ASSERT_EQ(s.devices[1].blocks.size(), 2u);
  EXPECT_EQ((std::set<std::string>(s.devices[1].owners.begin(), s.devices[1].owners.end())),
            (std::set<std::string>{"b", "c"}));
  EXPECT_EQ(s.capacity, rt->device(0).pool().capacity() + rt->device(1).pool().capacity());
  EXPECT_EQ(s.stats.allocated_bytes, s.devices[0].stats.allocated_bytes + s.devices[1].stats.allocated_bytes);
  EXPECT_EQ(s.stats.allocs, 3u);
  EXPECT_EQ(s.stats.reserved_bytes, rt->total_pool_stats().reserved_bytes);

  const auto j = nlohmann::json::parse(snapshot_json(s));
  EXPECT_EQ(j["capacity"].get<std::uint64_t>(), s.capacity);
  EXPECT_EQ(j["stats"]["allocated_bytes"].get<std::uint64_t>(), s.stats.allocated_bytes);
  EXPECT_EQ(j["stats"]["allocs"].get<std::uint64_t>(), 3u);
  ASSERT_EQ(j["devices"].size(), 2u);
  for (std::size_t d = 0; d < 2; ++d) {
    nlohmann::json one = j["devices"][d];
    EXPECT_EQ(one["device"].get<std::size_t>(), d);
    one.erase("device");
    EXPECT_EQ(one, nlohmann::json::parse(snapshot_json(s.devices[d]))) << "device " << d;
  }
  std::set<std::string> named;
  for (const auto& block : j["devices"][1]["blocks"]) named.insert(block.value("owner", ""));
  EXPECT_EQ(named, (std::set<std::string>{"b", "c"}));

  ASSERT_TRUE(rt->device(0).pool().free(*a).ok());
  ASSERT_TRUE(rt->device(1).pool().free(*b).ok());
  ASSERT_TRUE(rt->device(1).pool().free(*c).ok());
}

TEST(RuntimeSnapshot, OneDevicesJsonIsItsPoolsByteForByte) {
  auto rt = make(1);
  ASSERT_TRUE(rt);
  auto a = rt->pool().allocate(4096, 0);
  ASSERT_TRUE(a.ok());
  const NamedHandle owners[] = {{"a", *a}};
  const std::string whole = snapshot_json(take_snapshot(*rt, owners));
  EXPECT_EQ(whole, snapshot_json(take_snapshot(rt->pool(), owners)));
  EXPECT_EQ(nlohmann::json::parse(whole).count("devices"), 0u);
  ASSERT_TRUE(rt->pool().free(*a).ok());
}

}  // namespace
}  // namespace ferry
