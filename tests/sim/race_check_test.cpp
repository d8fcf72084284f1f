// The sim's race checker (race.hpp): each kind of race is found with both sides
// named, and the orderings that make work safe (stream order, event waits, host
// waits and polls, the pool's make_ready, the engine's and a program's waits)
// leave nothing to report.
#include <gtest/gtest.h>

#include <vector>

#include "backend_fixture.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/transfer_engine.hpp"
#include "ferry/user_op.hpp"
#include "program_kernels.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t KiB = 1024;

class RaceCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendSpec spec = testing::backend_spec("sim");
    spec.race_check = true;
    auto made = make_backend(spec);
    ASSERT_TRUE(made.ok()) << made.error().message;
    backend_ = std::move(made).value();
    order_ = std::make_unique<StreamOrder>(*backend_);
    pool_ = std::make_unique<DevicePool>(*order_);
  }
  RaceLog log() const { return *backend_->race_log(); }
  DeviceSpan block(std::uint64_t bytes, StreamId stream = 0) {
    auto h = pool_->allocate(bytes, stream);
    EXPECT_TRUE(h.ok());
    handles_.push_back(*h);
    return *pool_->resolve(*h);
  }
  Result<Ticket> raw(StreamId s, Op op) { return order_->submit(s, [&](Ticket) -> Result<Op> { return op; }); }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StreamOrder> order_;
  std::unique_ptr<DevicePool> pool_;
  std::vector<DeviceHandle> handles_;
};

TEST_F(RaceCheck, WriteWriteOnTwoStreamsIsARaceNamingBothSides) {
  const DeviceSpan a = block(64 * KiB);
  auto first = raw(0, FillOp{{a.addr, a.bytes}, 1});
  auto second = raw(1, FillOp{{a.addr + 4 * KiB, 8 * KiB}, 2});
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(backend_->synchronize().ok());
  const RaceLog l = log();
  ASSERT_EQ(l.count, 1u);
  const Race& r = l.kept.at(0);
  EXPECT_EQ(r.earlier.op, (StreamPoint{0, *first}));
  EXPECT_EQ(r.later.op, (StreamPoint{1, *second}));
  EXPECT_EQ(r.earlier.kind, "fill");
  EXPECT_EQ(r.later.access, Access::write);
  EXPECT_EQ(r.addr, a.addr + 4 * KiB);
  EXPECT_EQ(r.bytes, 8 * KiB);
  EXPECT_EQ(r.earlier.block.handle, handles_.at(0)) << "the block the bytes belong to";
  EXPECT_EQ(r.later.block.handle, handles_.at(0));
  EXPECT_FALSE(r.reuse) << "one allocation on both sides";
}

TEST_F(RaceCheck, ReadAfterWriteNeedsAWaitOrAHostWait) {
  const DeviceSpan a = block(64 * KiB);
  std::vector<std::byte> out(a.bytes);
  auto fill = raw(0, FillOp{{a.addr, a.bytes}, 1});
  ASSERT_TRUE(raw(1, CopyToHostOp{out.data(), {a.addr, a.bytes}}).ok());  // no wait: a race
  ASSERT_TRUE(backend_->synchronize().ok());
  ASSERT_EQ(log().count, 1u);
  EXPECT_EQ(log().kept[0].later.kind, "copy_to_host");
  EXPECT_EQ(log().kept[0].later.access, Access::read);

  auto again = raw(0, FillOp{{a.addr, a.bytes}, 2});
  ASSERT_TRUE(raw(2, WaitOp{{0, *again}}).ok());  // an event wait orders stream 2
  std::vector<std::byte> out2(a.bytes), out3(a.bytes);  // one host buffer per copy: no host race
  ASSERT_TRUE(raw(2, CopyToHostOp{out2.data(), {a.addr, a.bytes}}).ok());
  const DeviceSpan b = block(64 * KiB);  // (a again would race with stream 2's read)
  auto third = raw(0, FillOp{{b.addr, b.bytes}, 3});
  ASSERT_TRUE(backend_->wait({0, *third}, std::chrono::seconds(1)).ok());  // so does a host wait
  ASSERT_TRUE(raw(3, CopyToHostOp{out3.data(), {b.addr, b.bytes}}).ok());
  ASSERT_TRUE(backend_->synchronize().ok());
  EXPECT_EQ(log().count, 1u) << "an ordered access was reported";
  (void)fill;
}

TEST_F(RaceCheck, AWriteAfterAnotherStreamsReadIsARace) {
  const DeviceSpan a = block(64 * KiB);
  std::uint64_t hash = 0;
  ASSERT_TRUE(raw(0, FillOp{{a.addr, a.bytes}, 1}).ok());
  ASSERT_TRUE(backend_->synchronize().ok());
  ASSERT_TRUE(raw(1, HashOp{{a.addr, a.bytes}, &hash}).ok());
  ASSERT_TRUE(raw(2, FillOp{{a.addr, 256}, 5}).ok());  // overwrites what stream 1 may still read
  ASSERT_TRUE(backend_->synchronize().ok());
  ASSERT_EQ(log().count, 1u);
  EXPECT_EQ(log().kept[0].earlier.kind, "hash");
  EXPECT_EQ(log().kept[0].earlier.access, Access::read);
  EXPECT_EQ(log().kept[0].bytes, 256u);
}

TEST_F(RaceCheck, AUserOpRacingACopyIsNamedWithItsTag) {
  auto h = pool_->allocate(64 * KiB, 0);
  auto dst = pool_->allocate(64 * KiB, 1);
  ASSERT_TRUE(h.ok() && dst.ok());
  const Operand ops[] = {{*h, Access::write}};
  ASSERT_TRUE(enqueue_user(*pool_, 0, ops, [](const KernelLaunch& l) { return testing::set_operand(l, 0, 7); }, {},
                           "my_kernel")
                  .ok());
  const DeviceSpan s = *pool_->resolve(*h);
  const DeviceSpan d = *pool_->resolve(*dst);
  ASSERT_TRUE(raw(1, CopyOnDeviceOp{{d.addr, d.bytes}, s.addr}).ok());
  ASSERT_TRUE(backend_->synchronize().ok());
  ASSERT_EQ(log().count, 1u);
  EXPECT_EQ(log().kept[0].earlier.kind, "user");
  EXPECT_EQ(log().kept[0].earlier.tag, "my_kernel");
  EXPECT_EQ(log().kept[0].later.kind, "copy_on_device");
}

TEST_F(RaceCheck, AnUploadReadOnAnotherStreamNeedsTheWaitOrderAfterMakes) {
  HostArena arena(*order_);
  EngineOptions eo;
  eo.policy = IntegrityPolicy::off;  // returns once the copies are enqueued
  TransferEngine engine(*pool_, arena, eo);
  ASSERT_TRUE(engine.status().ok());
  auto h = pool_->allocate(256 * KiB, 0);
  auto out = pool_->allocate(256 * KiB, 0);
  ASSERT_TRUE(h.ok() && out.ok());
  std::vector<std::byte> bytes(256 * KiB, std::byte{3});
  const auto copy = [](const KernelLaunch& l) { return testing::copy_operand(l, 1, 0); };
  const Operand ops[] = {{*h, Access::read}, {*out, Access::write}};

  auto up = engine.upload(1, TransferPlan().add(bytes, *h));
  ASSERT_TRUE(up.ok()) << up.error().message;
  ASSERT_TRUE(enqueue_user(*pool_, 0, ops, copy).ok());  // forgot to order after the upload
  ASSERT_TRUE(backend_->synchronize().ok());
  const std::uint64_t planted = log().count;
  EXPECT_GE(planted, 1u);

  auto again = engine.upload(1, TransferPlan().add(bytes, *h));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(order_->order_after(0, again->done).ok());
  ASSERT_TRUE(enqueue_user(*pool_, 0, ops, copy).ok());
  ASSERT_TRUE(backend_->synchronize().ok());
  EXPECT_EQ(log().count, planted) << "an upload ordered by order_after was reported";
}

TEST_F(RaceCheck, TwoDownloadsIntoOneHostBufferFromTwoStreamsRace) {
  const DeviceSpan a = block(4 * KiB);
  const DeviceSpan b = block(4 * KiB);
  std::vector<std::byte> host(4 * KiB);
  ASSERT_TRUE(raw(0, CopyToHostOp{host.data(), {a.addr, a.bytes}}).ok());
  ASSERT_TRUE(raw(1, CopyToHostOp{host.data(), {b.addr, b.bytes}}).ok());
  ASSERT_TRUE(backend_->synchronize().ok());
  ASSERT_EQ(log().count, 1u);
  EXPECT_EQ(log().kept[0].addr, reinterpret_cast<std::uintptr_t>(host.data())) << "a host range";
}

TEST_F(RaceCheck, TheCapKeepsTheFirstAndCountsAll) {
  const DeviceSpan a = block(64 * KiB);
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(raw(static_cast<StreamId>(i % 2), FillOp{{a.addr, 256}, static_cast<std::uint64_t>(i)}).ok());
  }
  ASSERT_TRUE(backend_->synchronize().ok());
  EXPECT_EQ(log().count, 99u);
  EXPECT_EQ(log().kept.size(), 64u);
}

TEST(RaceCheckSpec, ARealDeviceCannotCheckRaces) {
  BackendSpec spec;
  spec.kind = BackendKind::cuda;
  spec.race_check = true;
  auto made = make_backend(spec);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.error().code, ErrorCode::unsupported);
  auto plain = testing::make_backend("sim");
  EXPECT_EQ(plain->race_log(), nullptr) << "off by default";
}

}  // namespace
}  // namespace ferry
