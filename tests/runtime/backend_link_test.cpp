// A pair's link is asked of its backends (Backend::connect_peer), once per
// ordered pair at create, and Runtime::link_between is the one answer copy_peer,
// MultiDeviceCache and the C ABI read: a backend's answer wins over
// DevicesOptions::links, the weaker direction's answer is the pair's, a backend
// without an answer (the sim) leaves the model's, and a refused connection
// fails create naming the pair. On two or three sim devices behind a test double
// that answers as a driver would (link_reporting_backend.hpp).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ferry/devices.hpp"
#include "ferry/runtime.hpp"
#include "link_reporting_backend.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

using testing::pattern;
using testing::read_back;
using testing::report_links;
using Answer = Result<std::optional<PeerLink>>;

constexpr std::uint64_t KiB = 1024;
constexpr StreamId kStream = 1;

RuntimeOptions tiny_devices(std::uint32_t count) {
  RuntimeOptions o;
  o.backend.profile = "tiny";
  o.devices.count = count;
  o.engine.policy = IntegrityPolicy::verify;
  return o;
}

std::unique_ptr<Runtime> make(RuntimeOptions o) {
  auto made = Runtime::create(std::move(o));
  EXPECT_TRUE(made.ok()) << made.error().message;
  return made.ok() ? std::move(made).value() : nullptr;
}

// Copies a filled block of device 0 into one of device 1 and reads it back there.
Result<PeerCopyReceipt> copy_across(Runtime& rt, std::uint64_t bytes, std::uint64_t seed) {
  auto src = rt.device(0).pool().allocate(bytes, kStream);
  auto dst = rt.device(1).pool().allocate(bytes, kStream);
  EXPECT_TRUE(src.ok() && dst.ok());
  if (!src.ok() || !dst.ok()) return make_error(ErrorCode::out_of_memory, "test blocks");
  EXPECT_TRUE(enqueue_fill(rt.device(0).pool(), kStream, *src, seed).ok());
  Result<PeerCopyReceipt> copied = rt.copy_peer(*dst, 0, *src, 0, bytes, kStream);
  auto back = read_back(rt.device(1).pool(), *dst, kStream);
  EXPECT_TRUE(back.ok() && *back == pattern(seed, bytes)) << "the destination's bytes";
  EXPECT_TRUE(rt.device(0).pool().free(*src).ok());
  EXPECT_TRUE(rt.device(1).pool().free(*dst).ok());
  return copied;
}

TEST(BackendLinks, EachOrderedPairIsAskedOnceAndTheBackendsAnswerIsThePairsLink) {
  RuntimeOptions o = tiny_devices(2);  // no model links: the pair would be unlinked
  auto answers = report_links(o, [](std::uint32_t, std::uint32_t) -> Answer { return std::optional(PeerLink::pcie); });
  auto rt = make(std::move(o));
  ASSERT_TRUE(rt);
  using Asked = std::vector<std::pair<std::uint32_t, std::uint32_t>>;
  EXPECT_EQ(answers->asked, (Asked{{0, 1}, {1, 0}}));
  EXPECT_EQ(rt->link_between(0, 1), PeerLink::pcie);
  EXPECT_EQ(rt->link_between(1, 0), PeerLink::pcie);
  EXPECT_EQ(rt->link_between(0, 0), PeerLink::none);
  EXPECT_EQ(rt->link_between(0, 2), PeerLink::none) << "a device beyond the count";
  Result<PeerCopyReceipt> copied = copy_across(*rt, 64 * KiB, 11);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  EXPECT_TRUE(copied->direct) << "the link the backend reported is taken";
  EXPECT_EQ(copied->link, PeerLink::pcie);
  EXPECT_TRUE(copied->verified);
  EXPECT_EQ(answers->asked.size(), 2u) << "asked at create only";
}

TEST(BackendLinks, ABackendsAnswerOverridesTheModel) {
  RuntimeOptions o = tiny_devices(2);
  o.devices.links = {PeerLinkSpec{0, 1, PeerLink::nvlink}};
  report_links(o, [](std::uint32_t, std::uint32_t) -> Answer { return std::optional(PeerLink::none); });
  auto rt = make(std::move(o));
  ASSERT_TRUE(rt);
  EXPECT_EQ(rt->link_between(0, 1), PeerLink::none);
  Result<PeerCopyReceipt> copied = copy_across(*rt, 64 * KiB, 12);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  EXPECT_FALSE(copied->direct) << "an unlinked pair stages through the host";
  EXPECT_EQ(copied->link, PeerLink::none);
}

TEST(BackendLinks, ThePairsLinkIsTheWeakerDirectionsAnswer) {
  for (const bool one_silent : {false, true}) {
    SCOPED_TRACE(one_silent ? "device 1 has no answer" : "device 1 answers pcie");
    RuntimeOptions o = tiny_devices(2);
    report_links(o, [one_silent](std::uint32_t reader, std::uint32_t) -> Answer {
      if (reader == 0) return std::optional(PeerLink::nvlink);
      return one_silent ? std::optional<PeerLink>() : std::optional(PeerLink::pcie);
    });
    auto rt = make(std::move(o));
    ASSERT_TRUE(rt);
    const PeerLink expected = one_silent ? PeerLink::none : PeerLink::pcie;
    EXPECT_EQ(rt->link_between(0, 1), expected);
    EXPECT_EQ(rt->link_between(1, 0), expected);
  }
}

TEST(BackendLinks, WithoutAnAnswerTheModelIsThePairsLink) {
  RuntimeOptions o = tiny_devices(3);
  o.devices.links = {PeerLinkSpec{2, 0, PeerLink::nvlink}};
  auto answers = report_links(o, [](std::uint32_t, std::uint32_t) -> Answer { return std::optional<PeerLink>(); });
  auto rt = make(std::move(o));
  ASSERT_TRUE(rt);
  EXPECT_EQ(answers->asked.size(), 6u) << "every ordered pair of three devices";
  EXPECT_EQ(rt->link_between(0, 2), PeerLink::nvlink);
  EXPECT_EQ(rt->link_between(2, 0), PeerLink::nvlink);
  EXPECT_EQ(rt->link_between(0, 1), PeerLink::none);
  EXPECT_EQ(rt->link_between(1, 2), PeerLink::none);
  // The sim itself has no driver to ask: the same without the test double.
  RuntimeOptions plain = tiny_devices(2);
  plain.devices.links = {PeerLinkSpec{0, 1, PeerLink::pcie}};
  auto sim = make(std::move(plain));
  ASSERT_TRUE(sim);
  EXPECT_EQ(sim->link_between(1, 0), PeerLink::pcie);
}

TEST(BackendLinks, AConnectionTheBackendRefusesFailsCreateNamingThePair) {
  RuntimeOptions o = tiny_devices(2);
  report_links(o, [](std::uint32_t reader, std::uint32_t) -> Answer {
    if (reader == 1) return make_error(ErrorCode::backend_error, "the driver refused peer access");
    return std::optional(PeerLink::pcie);
  });
  auto made = Runtime::create(std::move(o));
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.error().code, ErrorCode::backend_error);
  EXPECT_NE(made.error().message.find("device 1 reading device 0: the driver refused peer access"), std::string::npos)
      << made.error().message;
}

}  // namespace
}  // namespace ferry
