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
#include "ferry/device_pool.hpp"
#include "ferry/gemm.hpp"
#include "ferry/op_contract.hpp"
#include "ferry/stream_order.hpp"

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
      {"user op negative flops", 0,
       Op{UserOp{{{{base, 64}, Access::read}}, [](const KernelLaunch&) { return Result<void>(); }, -5, 0, "k"}},
       ErrorCode::invalid_argument},
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

// The GEMM is a user op (gemm.hpp): its rules are make_gemm_op's, the same on
// every backend, checked before anything is enqueued, so such a refusal takes no
// ticket. What only the op contract refuses (the cost's flops) is refused at
// enqueue, where StreamOrder::submit fills the lost ticket with a no-op.
TEST_P(OpContractTest, EveryBackendRefusesAMalformedGemmAtEnqueueGemm) {
  auto backend = testing::make_backend(GetParam());
  FERRY_REQUIRE_BACKEND(backend, GetParam());
  StreamOrder order(*backend);
  DevicePool pool(order);
  const GemmShape g{8, 8, 8};
  const std::uint64_t m = g.a_bytes();  // 128 B, as b and c
  // Allocated on the GEMM's stream, so that no enqueue orders it after them
  // (make_ready): every ticket of stream 2 is the GEMM's own.
  constexpr StreamId s = 2;
  const DeviceHandle a = pool.allocate(m, s).value_or(DeviceHandle{});
  const DeviceHandle b = pool.allocate(m, s).value_or(DeviceHandle{});
  const DeviceHandle c = pool.allocate(m, s).value_or(DeviceHandle{});
  const DeviceHandle short_a = pool.allocate(m - 2, s).value_or(DeviceHandle{});
  const DeviceHandle wide = pool.allocate(3 * m + 2, s).value_or(DeviceHandle{});  // a, b, c side by side
  const DeviceHandle freed = pool.allocate(m, s).value_or(DeviceHandle{});
  ASSERT_TRUE(pool.free(freed).ok());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    const char* name;
    MatrixSlice a, b, c;
    GemmShape shape;
    UserCost cost;
    ErrorCode code;
    bool by_check_op = false;
  };
  const std::vector<Case> cases = {
      {"gemm shape and blocks disagree", short_a, b, c, g, {}, ErrorCode::invalid_argument},
      {"gemm of an empty shape", a, b, c, GemmShape{8, 8, 0}, {}, ErrorCode::invalid_argument},
      {"gemm at an odd address", {wide, 1, m}, {wide, 1 + m, m}, {wide, 1 + 2 * m, m}, g, {},
       ErrorCode::invalid_argument},
      {"gemm output overlaps an input", {wide, 0, m}, {wide, m, m}, {wide, m / 2, m}, g, {},
       ErrorCode::invalid_argument},
      {"gemm output is an input", a, b, b, g, {}, ErrorCode::invalid_argument},
      {"gemm slice outside its block", {a, 2, m}, b, c, g, {}, ErrorCode::invalid_argument},
      {"gemm negative flops", a, b, c, g, {-5, 0}, ErrorCode::invalid_argument, true},
      {"gemm non-finite flops", a, b, c, g, {nan, 0}, ErrorCode::invalid_argument, true},
      {"gemm on a freed block", a, b, freed, g, {}, ErrorCode::stale_handle},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const Ticket before = backend->submitted(s);
    const Result<Ticket> got = enqueue_gemm(pool, s, k.a, k.b, k.c, k.shape, k.cost);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.error().code, k.code) << got.error().message;
    if (k.by_check_op) {
      EXPECT_NE(got.error().message.find("enqueue(user) on stream 2: flops"), std::string::npos)
          << got.error().message;
      EXPECT_EQ(backend->submitted(s), before + 1) << "the lost ticket is filled, once";
    } else {
      EXPECT_NE(got.error().message.find("gemm 8 x "), std::string::npos) << got.error().message;
      EXPECT_EQ(backend->submitted(s), before) << "a GEMM refused before enqueue took a ticket";
    }
  }
  const Ticket fillers = backend->submitted(s);
  // Out of range streams are refused as every op's are.
  const Result<Ticket> bad_stream = enqueue_gemm(pool, kMaxStreams, a, b, c, g);
  ASSERT_FALSE(bad_stream.ok());
  EXPECT_EQ(bad_stream.error().code, ErrorCode::invalid_argument) << bad_stream.error().message;
  // The same operands, well formed, are accepted: the refusals above are the flaws'.
  ASSERT_TRUE(enqueue_gemm(pool, s, a, b, c, g).ok());
  ASSERT_TRUE(enqueue_gemm(pool, s, {wide, 0, m}, {wide, m, m}, {wide, 2 * m, m}, g).ok());
  EXPECT_EQ(backend->submitted(s), fillers + 2);
  EXPECT_TRUE(backend->synchronize().ok());
  for (DeviceHandle h : {a, b, c, short_a, wide}) EXPECT_TRUE(pool.free(h).ok());
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

// The op table (OpDescription): each op's operands, with the access the race
// checker and the sim read, and its engine. A description that named a range
// wrongly (a write as a read) would hide races and misplace the cost.
std::string described(const Op& op) {
  std::string out = std::string(op_name(op)) + " on " + std::to_string(static_cast<int>(engine_of(op))) + ":";
  for_each_device_range(op, [&](const DeviceOperand& d) {
    out += " " + std::string(d.role) + "@" + std::to_string(d.addr) + "+" + std::to_string(d.bytes) + ":" +
           std::string(to_string(d.access));
  });
  for_each_host_range(op, [&](const HostOperand& h) {
    out += " host " + std::string(h.role) + "+" + std::to_string(h.bytes) + ":" + std::string(to_string(h.access));
  });
  return out;
}

TEST(OpDescription, EveryOpNamesItsOperandsAndTheirAccess) {
  std::byte byte{};
  std::uint64_t result = 0;
  const auto kernel = [](const KernelLaunch&) { return Result<void>(); };
  const std::vector<std::pair<Op, std::string>> cases = {
      {FillOp{{100, 8}, 1}, "fill on 1: dst@100+8:write"},
      {CopyToDeviceOp{{100, 8}, &byte}, "copy_to_device on 2: dst@100+8:write host src+8:read"},
      {CopyToHostOp{&byte, {100, 8}}, "copy_to_host on 3: src@100+8:read host dst+8:write"},
      {CopyOnDeviceOp{{200, 8}, 100}, "copy_on_device on 1: src@100+8:read dst@200+8:write"},
      {BatchCopyToDeviceOp{{CopyToDeviceOp{{100, 8}, &byte}, CopyToDeviceOp{{200, 4}, &byte}}},
       "batch_copy_to_device on 2: dst@100+8:write dst@200+4:write host src+8:read host src+4:read"},
      {ComputeOp{{{100, 8}, {200, 8}}, {300, 8}}, "compute on 1: input@100+8:read input@200+8:read output@300+8:write"},
      {HashOp{{100, 8}, &result}, "hash on 1: src@100+8:read host result+8:write"},
      {WaitOp{{1, 1}}, "wait on 0:"},
      {NativeWaitOp{}, "native_wait on 0:"},
      {UserOp{{{{100, 8}, Access::read}, {{200, 8}, Access::write}, {{300, 8}, Access::read_write}}, kernel, 0, 0, "k"},
       "user on 1: read@100+8:read write@200+8:write read_write@300+8:read_write"},
      {NopOp{}, "nop on 0:"},
      // The source is the peer's memory, not an operand of this device.
      {PeerCopyOp{{100, 8}, nullptr, 500, PeerLink::nvlink}, "copy_peer on 4: dst@100+8:write"},
  };
  ASSERT_EQ(cases.size(), std::variant_size_v<Op>) << "an op without a case here";
  for (const auto& [op, expected] : cases) EXPECT_EQ(described(op), expected);
}

}  // namespace
}  // namespace ferry
