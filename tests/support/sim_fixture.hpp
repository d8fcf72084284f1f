// Shared set-up for the sim backend tests: a "tiny" device with one reserved and
// mapped region, and helpers that say what bytes should be where.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "expected_bytes.hpp"
#include "ferry/content.hpp"
#include "ferry/gemm.hpp"
#include "ferry/sim_backend.hpp"

namespace ferry::testing {

inline SimOptions tiny_options(std::uint64_t seed = 1, SimFaults faults = {}) {
  SimOptions o;
  o.profile = *find_profile("tiny");
  o.seed = seed;
  o.faults = faults;
  return o;
}

inline std::vector<std::byte> zeros(std::uint64_t bytes) { return std::vector<std::byte>(bytes); }

class SimTest : public ::testing::Test {
 protected:
  static constexpr std::uint64_t kRegion = 1 << 20;  // 16 granules of tiny
  static constexpr auto kLong = std::chrono::seconds(10);

  void SetUp() override { start(tiny_options()); }

  void TearDown() override {
    std::string why;
    EXPECT_TRUE(sim->validate(&why)) << why;
  }

  // (Re)creates the backend with `options` and maps a kRegion region at `base`.
  void start(const SimOptions& opts) {
    options = opts;
    sim = make_sim_backend(options);
    auto r = sim->reserve_address(kRegion);
    ASSERT_TRUE(r.ok()) << r.error().message;
    base = *r;
    auto m = sim->map(base, kRegion);
    ASSERT_TRUE(m.ok()) << m.error().message;
  }

  std::vector<std::byte> device_bytes(std::uint64_t addr, std::uint64_t bytes) {
    std::vector<std::byte> out(bytes);
    auto r = sim->peek(addr, out);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return out;
  }

  Ticket put(StreamId stream, Op op) {
    auto t = sim->enqueue(stream, std::move(op));
    EXPECT_TRUE(t.ok()) << t.error().message;
    return t.value_or(0);
  }

  // The GEMM user op (gemm.hpp) for `stream`; a NopOp, and a failure, if refused.
  Op gemm(StreamId stream, DeviceRange a, DeviceRange b, DeviceRange c, const GemmShape& shape, UserCost cost = {}) {
    Result<UserOp> op = make_gemm_op(*sim, stream, a, b, c, shape, cost);
    EXPECT_TRUE(op.ok()) << op.error().message;
    if (!op.ok()) return NopOp{};
    return std::move(op).value();
  }

  void wait_for(StreamId stream, Ticket ticket) {
    auto r = sim->wait({stream, ticket}, kLong);
    ASSERT_TRUE(r.ok()) << r.error().message;
  }

  const DeviceProfile& sim_profile() const { return options.profile; }

  SimOptions options;
  std::unique_ptr<SimBackend> sim;
  std::uint64_t base = 0;
};

}  // namespace ferry::testing
