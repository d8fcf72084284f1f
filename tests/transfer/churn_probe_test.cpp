// Report 000's churn probe as a library function: healthy on a clean sim,
// failing with the pinned-noop fault.
#include <gtest/gtest.h>

#include "ferry/churn_probe.hpp"
#include "ferry/fault_spec.hpp"
#include "transfer_fixture.hpp"

namespace ferry::testing {
namespace {

RigOptions probe_rig(const char* inject) {
  RigOptions o;
  o.faults = *parse_fault_spec(inject);
  o.with_engine = false;
  return o;
}

TEST(ChurnProbe, HealthyOnACleanBackend) {
  Rig rig(probe_rig("none"));
  auto v = run_churn_probe(*rig.pool);
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_TRUE(v->healthy) << v->verdict;
  EXPECT_EQ(v->copies, 8u);
  EXPECT_EQ(v->failures, 0u);
  EXPECT_TRUE(v->simulated_delays);
  EXPECT_EQ(v->churn_pins, 40u);
  EXPECT_EQ(v->verdict.rfind("healthy", 0), 0u) << v->verdict;
  const HostMemoryStats s = rig.backend().host_stats();
  EXPECT_EQ(s.pinned_allocs, s.pinned_frees) << "the probe frees what it pinned";
}

TEST(ChurnProbe, ReportsSilentCopyFailuresUnderPinnedNoop) {
  Rig rig(probe_rig("pinned-noop"));
  auto v = run_churn_probe(*rig.pool);
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_FALSE(v->healthy);
  EXPECT_GT(v->failures, 0u);
  EXPECT_EQ(v->arrived.size(), v->copies);
  EXPECT_EQ(v->verdict.rfind("FAILING", 0), 0u) << v->verdict;
  EXPECT_GT(rig.sim->swallowed_copies(), 0u);
}

TEST(ChurnProbe, RejectsEmptyOptions) {
  Rig rig(probe_rig("none"));
  ChurnProbeOptions o;
  o.copies = 0;
  auto v = run_churn_probe(*rig.pool, o);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.error().code, ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace ferry::testing
