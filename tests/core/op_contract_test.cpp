// The one op contract (op_contract.hpp), run on every backend: each malformed
// op is refused at enqueue with the code and the very message check_op gives,
// and takes no ticket. A backend that checked ops its own way (as the sim and
// cuda once did, and disagreed) fails here.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend_fixture.hpp"
#include "ferry/op_contract.hpp"

namespace ferry {
namespace {

struct MalformedOp {
  const char* name;
  StreamId stream;
  Op op;
  ErrorCode code;
};

// Every flaw is the op's own: the device ranges are mapped and large enough, the
// host buffers exist, so a backend's own checks (admit) have nothing to refuse.
std::vector<MalformedOp> malformed_ops(std::uint64_t base, std::byte* host) {
  const GemmShape g{8, 8, 8};
  const std::uint64_t m = g.a_bytes();
  const DeviceRange a{base, m}, b{base + m, m}, c{base + 2 * m, m};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  return {
      {"stream out of range", kMaxStreams, Op{NopOp{}}, ErrorCode::invalid_argument},
      {"device range at 0", 0, Op{FillOp{{0, 64}, 1}}, ErrorCode::invalid_argument},
      {"device range wraps", 0, Op{FillOp{{UINT64_MAX - 10, 64}, 1}}, ErrorCode::invalid_argument},
      {"unknown pattern", 0, Op{FillOp{{base, 64}, 1, static_cast<Pattern>(7)}}, ErrorCode::invalid_argument},
      {"null upload source", 0, Op{CopyToDeviceOp{{base, 64}, nullptr}}, ErrorCode::invalid_argument},
      {"null download destination", 0, Op{CopyToHostOp{nullptr, {base, 64}}}, ErrorCode::invalid_argument},
      {"overlapping device copy", 0, Op{CopyOnDeviceOp{{base + 32, 64}, base}}, ErrorCode::invalid_argument},
      {"null copy in a batch", 0,
       Op{BatchCopyToDeviceOp{{CopyToDeviceOp{{base, 64}, host}, CopyToDeviceOp{{base + 64, 64}, nullptr}}}},
       ErrorCode::invalid_argument},
      {"non-finite flops", 0, Op{ComputeOp{{{base, 64}}, {base + 64, 64}, nan}}, ErrorCode::invalid_argument},
      {"negative flops", 0, Op{ComputeOp{{{base, 64}}, {base + 64, 64}, -1}}, ErrorCode::invalid_argument},
      {"gemm shape and ranges disagree", 0, Op{GemmOp{{base, m - 2}, b, c, g}}, ErrorCode::invalid_argument},
      {"gemm at an odd address", 0, Op{GemmOp{{base + 1, m}, {base + 1 + m, m}, {base + 1 + 2 * m, m}, g}},
       ErrorCode::invalid_argument},
      {"gemm output overlaps an input", 0, Op{GemmOp{a, b, {base + m / 2, m}, g}}, ErrorCode::invalid_argument},
      {"gemm negative flops", 0, Op{GemmOp{a, b, c, g, -5}}, ErrorCode::invalid_argument},
      {"hash without a result", 0, Op{HashOp{{base, 64}, nullptr}}, ErrorCode::invalid_argument},
      {"wait on a stream out of range", 0, Op{WaitOp{{kMaxStreams + 3, 1}}}, ErrorCode::invalid_argument},
      {"wait on a ticket never handed out", 0, Op{WaitOp{{5, 1}}}, ErrorCode::invalid_argument},
  };
}

class OpContractTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OpContractTest, EveryBackendRefusesWhatCheckOpRefusesWithItsMessage) {
  auto backend = testing::make_backend(GetParam());
  FERRY_REQUIRE_BACKEND(backend, GetParam());
  const std::uint64_t size = backend->info().granularity;
  auto base = backend->reserve_address(size);
  ASSERT_TRUE(base.ok()) << base.error().message;
  ASSERT_TRUE(backend->map(*base, size).ok());
  std::vector<std::byte> host(4096);
  const auto none_submitted = [](StreamId) { return Ticket{0}; };
  for (MalformedOp& m : malformed_ops(*base, host.data())) {
    SCOPED_TRACE(m.name);
    const Result<void> expected = check_op(m.stream, m.op, backend->info(), none_submitted);
    ASSERT_FALSE(expected.ok()) << "check_op accepts the case: it tests nothing";
    EXPECT_EQ(expected.error().code, m.code);
    const Result<Ticket> got = backend->enqueue(m.stream, m.op);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.error().code, expected.error().code);
    EXPECT_EQ(got.error().message, expected.error().message);
    if (m.stream < kMaxStreams) {
      EXPECT_EQ(backend->submitted(m.stream), 0u) << "a refused op took a ticket";
    }
  }
  // Memory not mapped at enqueue is each backend's own check (admit), with the
  // same code on every backend: past the reservation's end, nothing is mapped.
  const Result<Ticket> unmapped = backend->enqueue(0, FillOp{{*base + size, 64}, 1});
  ASSERT_FALSE(unmapped.ok());
  EXPECT_EQ(unmapped.error().code, ErrorCode::invalid_argument) << unmapped.error().message;
  EXPECT_EQ(backend->submitted(0), 0u);
  // The same ops, well formed, are accepted: the refusals above are the flaws'.
  const Ticket fill = backend->enqueue(0, FillOp{{*base, 64}, 1}).value_or(0);
  EXPECT_EQ(fill, 1u);
  EXPECT_TRUE(backend->enqueue(1, WaitOp{{0, fill}}).ok());
  EXPECT_TRUE(backend->enqueue(0, CopyOnDeviceOp{{*base, 64}, *base}).ok()) << "the same range is a no-op";
  EXPECT_TRUE(backend->synchronize().ok());
  EXPECT_TRUE(backend->unmap(*base, size).ok());
  EXPECT_TRUE(backend->release_address(*base, size).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, OpContractTest, FERRY_BACKENDS);

// A batched copy on a device without one is unsupported, on any backend (the sim
// models the missing call with the batch-missing fault).
TEST(OpContract, BatchedCopyOnADeviceWithoutOneIsUnsupported) {
  DeviceInfo info;
  info.batched_copy = false;
  std::byte byte{};
  const Op batch{BatchCopyToDeviceOp{{CopyToDeviceOp{{4096, 1}, &byte}}}};
  const auto none = [](StreamId) { return Ticket{0}; };
  const Result<void> r = check_op(0, batch, info, none);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::unsupported);
  info.batched_copy = true;
  EXPECT_TRUE(check_op(0, batch, info, none).ok());
}

}  // namespace
}  // namespace ferry
