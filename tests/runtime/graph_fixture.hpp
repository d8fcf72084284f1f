// The fixture of the graph suites (graph_test, graph_pool_test): a Runtime on
// the backend of the test's parameter, or on the sim with native graphs
// (kSimGraphs: every replay one op, as on cuda, where the ops allow); SKIP only
// when the backend is unavailable on this machine.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend_fixture.hpp"
#include "ferry/pool_calls.hpp"
#include "ferry/runtime.hpp"
#include "pool_helpers.hpp"

namespace ferry::testing {

constexpr const char* kSimGraphs = "sim_graphs";

class GraphFixture : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { make({}); }

  void make(const std::function<void(RuntimeOptions&)>& tweak) {
    rt_.reset();
    RuntimeOptions o;
    const bool sim_graphs = GetParam() == kSimGraphs;
    o.backend = backend_spec(sim_graphs ? "sim" : GetParam());  // the sim's "tiny" profile: 64 MiB
    o.backend.sim_native_graphs = sim_graphs;
    if (tweak) tweak(o);
    auto made = Runtime::create(o);
    if (!made.ok() && !backend_skip_reason(GetParam()).empty()) {
      GTEST_SKIP() << "backend " << GetParam() << " unavailable: " << backend_skip_reason(GetParam());
    }
    ASSERT_TRUE(made.ok()) << made.error().message;
    rt_ = std::move(made).value();
  }

  PoolCalls& calls() {
    calls_ = rt_->calls();
    return *calls_;
  }
  DeviceHandle alloc(std::uint64_t bytes, StreamId stream) {
    auto h = calls().allocate(bytes, stream);
    EXPECT_TRUE(h.ok()) << h.error().message;
    return h.ok() ? *h : DeviceHandle{};
  }
  // Read on the stream that wrote it (1 unless said).
  std::vector<std::byte> bytes_of(DeviceHandle h, StreamId stream = 1) {
    auto got = read_back(rt_->pool(), h, stream);
    EXPECT_TRUE(got.ok()) << got.error().message;
    return got.ok() ? *got : std::vector<std::byte>{};
  }

  std::unique_ptr<Runtime> rt_;
  std::shared_ptr<PoolCalls> calls_;
};

}  // namespace ferry::testing
