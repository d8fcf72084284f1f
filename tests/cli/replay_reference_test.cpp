// The replay's host reference model agrees with the device's definitions
// (content.hpp) and finds the first differing byte.
#include <gtest/gtest.h>

#include <vector>

#include "expected_bytes.hpp"
#include "ferry/content.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/sim_backend.hpp"
#include "ferry/stream_order.hpp"
#include "replay/reference.hpp"

namespace ferry::replay {
namespace {

using ferry::testing::pattern;

TEST(ExpectedBytes, FindsTheFirstDifferingByte) {
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{65536}, std::size_t{200003}}) {
    const ExpectedBytes e = ExpectedBytes::pattern(n, 42);
    std::vector<std::byte> b = pattern(42, n);
    EXPECT_FALSE(e.first_mismatch(b).has_value()) << n;
    const std::size_t at = n * 2 / 3;
    b[at] ^= std::byte{1};
    if (at + 1 < n) b[n - 1] ^= std::byte{0x80};
    ASSERT_TRUE(e.first_mismatch(b).has_value()) << n;
    EXPECT_EQ(*e.first_mismatch(b), at) << n;
  }
}

TEST(ExpectedBytes, HashAndMixFollowContentDefinitions) {
  ExpectedBytes a = ExpectedBytes::pattern(300000, 1);
  ExpectedBytes b = ExpectedBytes::pattern(4096, 2);
  EXPECT_EQ(a.hash(), content_hash(pattern(1, 300000)));
  ExpectedBytes* inputs[] = {&a, &b, &a};
  const ExpectedBytes out = ExpectedBytes::mixed(inputs, 1000);
  std::uint64_t acc = kMixStart;
  acc = mix_step(acc, 0, a.hash());
  acc = mix_step(acc, 1, b.hash());
  acc = mix_step(acc, 2, a.hash());
  EXPECT_FALSE(out.first_mismatch(pattern(acc, 1000)).has_value());

  ExpectedBytes unknown = ExpectedBytes::unknown(64);
  ExpectedBytes* with_unknown[] = {&a, &unknown};
  EXPECT_FALSE(ExpectedBytes::mixed(with_unknown, 10).known());
}

// The sim's compute kernel writes what the reference says it writes.
TEST(ExpectedBytes, MatchesTheSimKernel) {
  SimOptions so;
  so.profile = *find_profile("tiny");
  std::unique_ptr<SimBackend> sim = make_sim_backend(so);
  StreamOrder order(*sim);
  DevicePool pool(order);
  ASSERT_TRUE(pool.status().ok());
  auto x = pool.allocate(100000, 0);
  auto y = pool.allocate(3000, 1);
  auto z = pool.allocate(70000, 0);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  ASSERT_TRUE(enqueue_fill(pool, 0, *x, 11).ok());
  ASSERT_TRUE(enqueue_fill(pool, 1, *y, 12).ok());
  ASSERT_TRUE(sim->synchronize().ok());
  const DeviceHandle in[] = {*x, *y};
  auto t = enqueue_compute(pool, 0, in, *z);
  ASSERT_TRUE(t.ok());
  std::vector<std::byte> host(70000);
  auto c = enqueue_copy_to_host(pool, 0, *z, host);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(order.wait({0, *c}).ok());

  ExpectedBytes ex = ExpectedBytes::pattern(100000, 11);
  ExpectedBytes ey = ExpectedBytes::pattern(3000, 12);
  ExpectedBytes* inputs[] = {&ex, &ey};
  EXPECT_FALSE(ExpectedBytes::mixed(inputs, 70000).first_mismatch(host).has_value());
}

}  // namespace
}  // namespace ferry::replay
