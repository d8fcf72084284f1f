// ferry replay over several devices (docs/spec.md §3, issue 27): the committed
// two-device trace, its wait across devices under the race checker, and the
// validator's refusals of device fields.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/replay.hpp"
#include "test_paths.hpp"

namespace ferry {
namespace {

std::string read_trace(const std::string& name) {
  std::ifstream in(::ferry::testing::traces_dir() + "/" + name, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The trace without its lines that hold `needle`.
std::string without(const std::string& text, const std::string& needle) {
  std::string out, line;
  std::istringstream in(text);
  while (std::getline(in, line)) {
    if (line.find(needle) == std::string::npos) out += line + "\n";
  }
  return out;
}

ReplayOptions strict_race_check(IntegrityPolicy policy) {
  ReplayOptions o;
  o.strict = true;
  o.backend.race_check = true;
  o.integrity = policy;
  return o;
}

constexpr const char* kCrossDeviceWaitOnStream2 = R"({"op":"wait","stream":2,"for":0,"for_device":1})";

TEST(ReplayDevices, TheTwoDeviceTracePassesUnderEveryPolicyWithNoRace) {
  const std::string text = read_trace("two-devices.jsonl");
  for (IntegrityPolicy p : {IntegrityPolicy::off, IntegrityPolicy::probe, IntegrityPolicy::verify}) {
    Result<ReplayReport> r = replay_trace_text(text, "two-devices.jsonl", strict_race_check(p));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->devices, 2u);
    EXPECT_EQ(r->checks, 6u) << to_string(p);
    EXPECT_EQ(r->corrupt, 0u) << to_string(p);
    EXPECT_EQ(r->unexpected_errors, 0u) << to_string(p);
    EXPECT_TRUE(r->race_checked);
    EXPECT_EQ(r->races, 0u) << to_string(p);
    EXPECT_EQ(r->capacity, 2 * (std::uint64_t{64} << 20)) << "each device's pool has the meta capacity";
  }
}

TEST(ReplayDevices, WithoutALinkThePeerCopiesGoThroughTheHostAndStillMatch) {
  const std::string text = read_trace("two-devices.jsonl");
  const std::string no_link = text.substr(0, text.find(",\"links\"")) + "}" + text.substr(text.find('\n'));
  ASSERT_NE(no_link, text);
  Result<ReplayReport> linked = replay_trace_text(text, "linked.jsonl", strict_race_check(IntegrityPolicy::verify));
  Result<ReplayReport> staged = replay_trace_text(no_link, "staged.jsonl", strict_race_check(IntegrityPolicy::verify));
  ASSERT_TRUE(linked.ok() && staged.ok());
  EXPECT_EQ(staged->checks, 6u);
  EXPECT_EQ(staged->corrupt, 0u);
  EXPECT_EQ(staged->races, 0u);
  // The staged legs are the engines' uploads and downloads: more bytes through them.
  EXPECT_GT(staged->integrity.bytes_moved, linked->integrity.bytes_moved);
}

TEST(ReplayDevices, RemovingTheWaitAcrossDevicesIsARaceNamingBothDevicesLines) {
  const std::string text = read_trace("two-devices.jsonl");
  ASSERT_NE(text.find(kCrossDeviceWaitOnStream2), std::string::npos);
  const std::string mutant = without(text, kCrossDeviceWaitOnStream2);
  // off: no host wait inside copy_peer orders the pull before the overwrite.
  Result<ReplayReport> r = replay_trace_text(mutant, "mutant.jsonl", strict_race_check(IntegrityPolicy::off));
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_GE(r->races, 1u);
  bool peer_read_vs_fill = false;
  for (const ReplayRace& race : r->race_list) {
    if (race.earlier.op == "copy_peer" && race.earlier.device == 1 && race.later.op == "fill" &&
        race.later.device == 0 && race.later.id == "x") {
      peer_read_vs_fill = true;
    }
  }
  EXPECT_TRUE(peer_read_vs_fill) << "device 1's pull of x and device 0's overwrite of it";

  // Not strict, the replay writes the wait a correct program would: no race.
  ReplayOptions lenient = strict_race_check(IntegrityPolicy::off);
  lenient.strict = false;
  Result<ReplayReport> fixed = replay_trace_text(mutant, "mutant.jsonl", lenient);
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->races, 0u);
  EXPECT_EQ(fixed->corrupt, 0u);
}

struct BadDevices {
  const char* rule;
  std::string text;
  std::size_t line;
  const char* says;
};

void PrintTo(const BadDevices& b, std::ostream* os) { *os << b.rule; }

class DeviceFieldsRefused : public ::testing::TestWithParam<BadDevices> {};

TEST_P(DeviceFieldsRefused, NamingTheLine) {
  const BadDevices& b = GetParam();
  Result<ReplayReport> r = replay_trace_text(b.text, "bad.jsonl", ReplayOptions{});
  ASSERT_FALSE(r.ok()) << b.rule << " was accepted";
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(r.error().message.rfind("bad.jsonl:" + std::to_string(b.line) + ": ", 0), 0u) << r.error().message;
  EXPECT_NE(r.error().message.find(b.says), std::string::npos) << r.error().message;
}

const std::string kMeta2 = R"({"op":"meta","devices":2})" "\n";
const std::string kAlloc1 = R"({"op":"alloc","id":"a","bytes":4096,"stream":0,"device":1})" "\n";

INSTANTIATE_TEST_SUITE_P(
    Rules, DeviceFieldsRefused,
    ::testing::Values(
        BadDevices{"wait_across_devices_on_one_device", "{\"op\":\"wait\",\"stream\":0,\"for\":1,\"for_device\":1}\n", 1,
                   "field \"for_device\" is device 1, but the trace has 1 device"},
        BadDevices{"device_out_of_range", kMeta2 + R"({"op":"alloc","id":"a","bytes":4096,"stream":0,"device":2})", 2,
                   "field \"device\" is device 2, but the trace has 2 devices"},
        BadDevices{"device_not_an_integer", kMeta2 + R"({"op":"trim","device":"1"})", 2,
                   "field \"device\" must be a non-negative integer"},
        BadDevices{"devices_zero", R"({"op":"meta","devices":0})", 1, "field \"devices\" must be 1 to 64"},
        BadDevices{"devices_too_many", R"({"op":"meta","devices":65})", 1, "field \"devices\" must be 1 to 64"},
        BadDevices{"link_beyond_the_devices", R"({"op":"meta","devices":2,"links":"0-2:pcie"})", 1,
                   "field \"links\" names device 2"},
        BadDevices{"link_unknown_kind", R"({"op":"meta","devices":2,"links":"0-1:wifi"})", 1, "field \"links\""},
        BadDevices{"id_of_another_device", kMeta2 + kAlloc1 + R"({"op":"fill","id":"a","stream":0,"seed":1})", 3,
                   "id \"a\" was allocated on device 1 (line 2), used on device 0"},
        BadDevices{"capture_on_device_1", kMeta2 + R"({"op":"capture","phase":"begin","graph":"g","stream":1,"device":1})",
                   2, "a capture op runs on device 0 only"},
        BadDevices{"copy_peer_of_an_unknown_id", kMeta2 + kAlloc1 + R"({"op":"copy_peer","src":"b","dst":"a","stream":0,"bytes":1})",
                   3, "id \"b\" was not allocated by an earlier line"}));

TEST(ReplayDevices, AOneDeviceTraceReportsNoDevicesKey) {
  Result<ReplayReport> r = replay_trace_text(R"({"op":"alloc","id":"a","bytes":4096,"stream":0})", "one.jsonl", ReplayOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->devices, 1u);
  EXPECT_EQ(report_json(*r).find("\"devices\""), std::string::npos);
}

}  // namespace
}  // namespace ferry
