#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ferry/fault_spec.hpp"
#include "ferry/integrity.hpp"

namespace ferry {
namespace {

TEST(FaultSpec, PinnedNoopDefaultsToOne) {
  auto f = parse_fault_spec("pinned-noop");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->pinned_noop, 1.0);
  EXPECT_FALSE(f->batch_broken);
}

TEST(FaultSpec, PinnedNoopWithProbability) {
  auto f = parse_fault_spec("pinned-noop:0.3");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_DOUBLE_EQ(f->pinned_noop, 0.3);
}

TEST(FaultSpec, CommaSeparatedAndRepeated) {
  auto f = parse_fault_spec("batch-broken, fail-map:3,delay:500");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_TRUE(f->batch_broken);
  EXPECT_EQ(f->fail_map_call, 3u);
  EXPECT_EQ(f->max_completion_delay_ns, 500u);

  const std::vector<std::string> specs = {"pinned-noop:0.5", "batch-missing", "pinned-noop:0.25"};
  auto g = parse_fault_specs(specs);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_DOUBLE_EQ(g->pinned_noop, 0.25);  // the later item wins
  EXPECT_TRUE(g->batch_missing);
}

TEST(FaultSpec, BadSpecsAreInvalidArgumentWithTheItem) {
  for (const char* bad : {"", "pinned-noop:1.5", "pinned-noop:-0.1", "pinned-noop:abc",
                          "pinned-noop:1e-3", "pinned-noop:", "batch-broken:1", "fail-map",
                          "fail-map:0", "fail-map:x", "delay:-5", "delay:99999999999999999999999",
                          "warp-drive", "batch-broken,,", "pinned-noop:nan", "pinned-noop:inf"}) {
    auto f = parse_fault_spec(bad);
    ASSERT_FALSE(f.ok()) << "accepted '" << bad << "'";
    EXPECT_EQ(f.error().code, ErrorCode::invalid_argument) << bad;
    EXPECT_NE(f.error().message.find("expected"), std::string::npos) << f.error().message;
  }
  auto f = parse_fault_spec("batch-broken,warp-drive");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("warp-drive"), std::string::npos) << f.error().message;
}

TEST(FaultSpec, DescribeRoundTrips) {
  for (const char* spec : {"none", "pinned-noop", "pinned-noop:0.3,batch-broken",
                           "batch-missing,fail-map:7,delay:1000", "pinned-noop:0.000001"}) {
    auto f = parse_fault_spec(spec);
    ASSERT_TRUE(f.ok()) << spec << ": " << f.error().message;
    auto g = parse_fault_spec(describe(*f));
    ASSERT_TRUE(g.ok()) << describe(*f) << ": " << g.error().message;
    EXPECT_EQ(g->pinned_noop, f->pinned_noop) << spec;
    EXPECT_EQ(g->batch_broken, f->batch_broken);
    EXPECT_EQ(g->batch_missing, f->batch_missing);
    EXPECT_EQ(g->fail_map_call, f->fail_map_call);
    EXPECT_EQ(g->max_completion_delay_ns, f->max_completion_delay_ns);
  }
  EXPECT_EQ(describe(SimFaults{}), "none");
}

TEST(IntegrityPolicy, ParsesTheThreeNames) {
  for (IntegrityPolicy p : {IntegrityPolicy::off, IntegrityPolicy::probe, IntegrityPolicy::verify}) {
    auto parsed = parse_integrity_policy(to_string(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  for (const char* bad : {"", "Verify", "verify ", "on", "full"}) {
    auto parsed = parse_integrity_policy(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(parsed.error().message.find("off, probe or verify"), std::string::npos);
  }
}

}  // namespace
}  // namespace ferry
