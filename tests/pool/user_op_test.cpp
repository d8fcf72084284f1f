// A program's own work on pool memory (user_op.hpp, user_kernel.hpp): user
// operations hold their operands through holds and reclaim (I2), their writes
// are visible to later work, a failing kernel is a value, stale operands are
// refused; record_use keeps blocks alive for work ferry did not enqueue; native
// events order streams. Written once, run on every backend (cuda SKIPs without a GPU).
#include "ferry/user_op.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "backend_fixture.hpp"
#include "pool_helpers.hpp"
#include "program_kernels.hpp"

namespace ferry {
namespace {

using testing::copy_operand;
using testing::pattern;
using testing::read_back;
using testing::set_operand;

constexpr std::uint64_t KiB = 1024, MiB = 1024 * 1024;

class UserOpTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = testing::make_backend(GetParam());
    FERRY_REQUIRE_BACKEND(backend_, GetParam());
    order_ = std::make_unique<StreamOrder>(*backend_);
  }
  DevicePool& pool(std::uint64_t capacity = 0, std::uint64_t small_limit = PoolOptions{}.small_limit) {
    if (!pool_) {
      PoolOptions o;
      o.capacity = capacity;
      o.small_limit = small_limit;
      pool_ = std::make_unique<DevicePool>(*order_, o);
      EXPECT_TRUE(pool_->status().ok());
    }
    return *pool_;
  }
  void expect_valid() {
    std::string why;
    EXPECT_TRUE(pool_->validate(&why)) << why;
  }
  Result<void> sync(StreamId s) { return order_->wait({s, backend_->submitted(s)}); }
  std::uint64_t granule() const { return backend_->info().granularity; }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StreamOrder> order_;
  std::unique_ptr<DevicePool> pool_;
};

UserKernel copier() {
  return [](const KernelLaunch& l) { return copy_operand(l, 1, 0); };
}

// Report 003's four steps with the program's own kernel.
TEST_P(UserOpTest, HeldUserOpKeepsItsFreedOperandThroughReclaim) {
  // In units of four granules (256 KiB at 64 KiB): the operand takes granules of its
  // own, so freeing it is what lets the big request fit, on every granule.
  const std::uint64_t u = 4 * granule();
  DevicePool& p = pool(8 * u, u);
  auto resident = p.allocate(6 * u, 0);
  auto transient = p.allocate(u, 0);
  auto out = p.allocate(64 * KiB, 0);
  ASSERT_TRUE(resident.ok() && transient.ok() && out.ok());
  ASSERT_TRUE(enqueue_fill(p, 0, *resident, 1).ok());
  ASSERT_TRUE(enqueue_fill(p, 0, *transient, 2).ok());
  ASSERT_TRUE(sync(0).ok());

  backend_->set_hold(0, true);  // 1. the program's kernel is queued and held
  const Operand ops[] = {{*transient, Access::read, 0, 64 * KiB}, {*out, Access::write}};
  auto t = enqueue_user(p, 0, ops, copier(), {}, "copy");
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_TRUE(p.free(*transient).ok());  // 2. its operand's handle is dropped
  // 3. an allocation on another stream that only fits by reclaiming
  auto big = p.allocate(u + u / 2, 1);
  ASSERT_TRUE(big.ok()) << big.error().message;
  EXPECT_GE(p.stats().reclaims, 1u);
  EXPECT_GE(p.stats().ooms_survived, 1u);
  ASSERT_TRUE(enqueue_fill(p, 1, *big, 3).ok());
  ASSERT_TRUE(sync(1).ok());
  // 4. dispatch: the kernel reads the right bytes
  backend_->set_hold(0, false);
  ASSERT_TRUE(order_->wait({0, *t}).ok());
  auto got = read_back(p, *out, 0);
  ASSERT_TRUE(got.ok()) << got.error().message;
  const std::vector<std::byte> transient_bytes = pattern(2, 64 * KiB);
  EXPECT_EQ(*got, transient_bytes) << "the held kernel read memory that stream 1 reused";
  auto big_bytes = read_back(p, *big, 1);
  ASSERT_TRUE(big_bytes.ok());
  EXPECT_EQ(*big_bytes, pattern(3, u + u / 2));
  auto resident_bytes = read_back(p, *resident, 0);
  ASSERT_TRUE(resident_bytes.ok());
  EXPECT_EQ(*resident_bytes, pattern(1, 6 * u));
  expect_valid();
}

TEST_P(UserOpTest, WritesAreVisibleToLaterOpsAndDownloads) {
  DevicePool& p = pool();
  auto a = p.allocate(64 * KiB, 0);
  auto b = p.allocate(64 * KiB, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(enqueue_fill(p, 0, *a, 9).ok());
  const Operand first[] = {{*a, Access::read_write, 4 * KiB, 8 * KiB}};
  ASSERT_TRUE(enqueue_user(p, 0, first, [](const KernelLaunch& l) { return set_operand(l, 0, 0xAB); }).ok());
  const Operand second[] = {{*a, Access::read}, {*b, Access::write}};
  ASSERT_TRUE(enqueue_user(p, 0, second, copier()).ok());
  std::vector<std::byte> expected = pattern(9, 64 * KiB);
  std::fill(expected.begin() + 4 * KiB, expected.begin() + 12 * KiB, std::byte{0xAB});
  auto got = read_back(p, *b, 0);
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ(*got, expected);
  // A later built-in op reads the kernel's bytes too.
  std::uint64_t hash = 0;
  auto h = order_->submit(0, [&](Ticket t) -> Result<Op> {
    auto s = p.lease(*b, {0, t});
    if (!s.ok()) return std::move(s).error();
    return Op{HashOp{{s->addr, s->bytes}, &hash}};
  });
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(order_->wait({0, *h}).ok());
  EXPECT_EQ(hash, content_hash(expected));
  expect_valid();
}

TEST_P(UserOpTest, AFailingKernelIsAValueAndAStickyStreamFault) {
  DevicePool& p = pool();
  auto a = p.allocate(64 * KiB, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(enqueue_fill(p, 0, *a, 4).ok());
  const Operand ops[] = {{*a, Access::write}};
  auto bad = enqueue_user(
      p, 0, ops, [](const KernelLaunch&) -> Result<void> { return make_error(ErrorCode::invalid_argument, "no luck"); },
      {}, "failing");
  ASSERT_TRUE(bad.ok()) << "a kernel's failure is the op's, not the enqueue's";
  auto waited = backend_->wait({0, *bad}, std::chrono::seconds(10));
  ASSERT_FALSE(waited.ok());
  EXPECT_EQ(waited.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(waited.error().message.find("no luck"), std::string::npos) << waited.error().message;
  EXPECT_NE(waited.error().message.find("failing"), std::string::npos) << waited.error().message;
  // Sticky: a later point of the stream reports it too; the ticket completed, so
  // the lease retired and the block can go.
  auto later = enqueue_fill(p, 0, *a, 5);
  ASSERT_TRUE(later.ok());
  EXPECT_FALSE(backend_->wait({0, *later}, std::chrono::seconds(10)).ok());
  EXPECT_TRUE(order_->wait({0, *later}).ok()) << "completion, which leases ask for, is not the fault";
  EXPECT_GE(backend_->completed(0), *bad);
  ASSERT_TRUE(p.free(*a).ok());
  // Other streams are unaffected; a thrown exception is caught, never an abort.
  auto c = p.allocate(64 * KiB, 1);
  ASSERT_TRUE(c.ok());
  const Operand c_ops[] = {{*c, Access::read}};
  auto threw = enqueue_user(p, 1, c_ops, [](const KernelLaunch&) -> Result<void> { throw std::runtime_error("boom"); });
  ASSERT_TRUE(threw.ok());
  auto w = backend_->wait({1, *threw}, std::chrono::seconds(10));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code, ErrorCode::backend_error);
  EXPECT_NE(w.error().message.find("boom"), std::string::npos);
  auto ok_on_2 = enqueue_fill(p, 2, *c, 1);
  ASSERT_TRUE(ok_on_2.ok());
  EXPECT_TRUE(sync(2).ok());
  expect_valid();
}

TEST_P(UserOpTest, BadOperandsAreRefusedAtEnqueue) {
  DevicePool& p = pool();
  auto a = p.allocate(4 * KiB, 0);
  ASSERT_TRUE(a.ok());
  const DeviceHandle stale = *a;
  ASSERT_TRUE(p.free(stale).ok());
  const Ticket before = backend_->submitted(0);
  const Operand ops[] = {{stale, Access::read}};
  auto r = enqueue_user(p, 0, ops, copier());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::stale_handle);
  EXPECT_EQ(backend_->submitted(0), before) << "a refused op took a ticket";

  auto b = p.allocate(4 * KiB, 0);
  ASSERT_TRUE(b.ok());
  const Operand outside[] = {{*b, Access::read, 1 * KiB, 4 * KiB}};
  auto o = enqueue_user(p, 0, outside, copier());
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.error().code, ErrorCode::invalid_argument);
  const Operand fine[] = {{*b, Access::read}};
  auto empty = enqueue_user(p, 0, fine, UserKernel{});
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().code, ErrorCode::invalid_argument);
  auto nan = enqueue_user(p, 0, fine, copier(), UserCost{-1.0, 0});
  ASSERT_FALSE(nan.ok());
  EXPECT_EQ(nan.error().code, ErrorCode::invalid_argument);
  ASSERT_TRUE(sync(0).ok());
  expect_valid();
}

// Issue 24 item 10: an operand at the block's end with the rest of the block
// (C's bytes 0) is empty, and refused like any range outside the block.
TEST_P(UserOpTest, AZeroLengthOperandIsRefused) {
  DevicePool& p = pool();
  auto b = p.allocate(4 * KiB, 0);
  ASSERT_TRUE(b.ok());
  const Ticket before = backend_->submitted(0);
  const Operand at_end[] = {{*b, Access::read, 4 * KiB, kRestOfBlock}};
  auto r = enqueue_user(p, 0, at_end, copier());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("empty range"), std::string::npos) << r.error().message;
  EXPECT_LE(backend_->submitted(0), before + 1) << "at most the no-op that fills a refused op's ticket";
  ASSERT_TRUE(p.free(*b).ok());
  expect_valid();
}

// record_use: work the pool did not enqueue (here enqueued on the backend
// directly, as a program enqueues on the native stream) keeps the block.
TEST_P(UserOpTest, RecordUseKeepsABlockAliveAcrossAFree) {
  DevicePool& p = pool();
  auto a = p.allocate(256 * KiB, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(enqueue_fill(p, 0, *a, 7).ok());
  ASSERT_TRUE(sync(0).ok());
  const DeviceSpan span = *p.resolve(*a);
  std::vector<std::byte> seen(span.bytes);
  backend_->set_hold(1, true);  // the program's read of the block has not run yet
  ASSERT_TRUE(backend_->enqueue(1, CopyToHostOp{seen.data(), {span.addr, span.bytes}}).ok());
  const DeviceHandle used[] = {*a};
  auto t = record_use(p, 1, used);
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_TRUE(p.free(*a).ok());
  // Same size on another stream lands on a at once, but only behind a wait for
  // the recorded use (which dispatches the held read): without it, the fill
  // below would overwrite the bytes before the program's read ran.
  auto other = p.allocate(256 * KiB, 2);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(p.resolve(*other)->addr, span.addr);
  ASSERT_TRUE(enqueue_fill(p, 2, *other, 8).ok());
  ASSERT_TRUE(sync(2).ok());
  backend_->set_hold(1, false);
  ASSERT_TRUE(order_->wait({1, *t}).ok());
  EXPECT_EQ(seen, pattern(7, 256 * KiB));
  // Once the stream's work completed the block is the pool's again.
  auto again = p.allocate(256 * KiB, 2);
  ASSERT_TRUE(again.ok());
  expect_valid();
}

TEST_P(UserOpTest, RecordUseOfAStaleOrForeignHandleIsStaleHandle) {
  DevicePool& p = pool();
  auto a = p.allocate(4 * KiB, 0);
  auto b = p.allocate(4 * KiB, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(p.free(*a).ok());
  const Ticket before = backend_->submitted(1);
  const DeviceHandle handles[] = {*b, *a};
  auto r = record_use(p, 1, handles);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::stale_handle);
  EXPECT_EQ(backend_->submitted(1), before);
  DevicePool other(*order_);
  auto foreign = other.allocate(4 * KiB, 0);
  ASSERT_TRUE(foreign.ok());
  const DeviceHandle foreign_only[] = {*foreign};
  EXPECT_EQ(record_use(p, 1, foreign_only).error().code, ErrorCode::stale_handle);
  ASSERT_TRUE(other.free(*foreign).ok());
  ASSERT_TRUE(backend_->synchronize().ok());
}

// An exported event orders another stream after the point, through a native wait.
TEST_P(UserOpTest, ExportedEventOrdersAnotherStream) {
  DevicePool& p = pool();
  auto a = p.allocate(1 * MiB, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(enqueue_fill(p, 0, *a, 3).ok());
  auto filled = enqueue_fill(p, 0, *a, 11);
  ASSERT_TRUE(filled.ok());
  auto event = backend_->export_event({0, *filled});
  ASSERT_TRUE(event.ok()) << event.error().message;
  ASSERT_TRUE(order_->order_after(1, *event).ok());
  std::vector<std::byte> seen(1 * MiB);
  const DeviceSpan span = *p.resolve(*a);
  ASSERT_TRUE(backend_->enqueue(1, CopyToHostOp{seen.data(), {span.addr, span.bytes}}).ok());
  ASSERT_TRUE(sync(1).ok());
  EXPECT_EQ(seen, pattern(11, 1 * MiB));
  EXPECT_TRUE(backend_->release_event(*event).ok());
  EXPECT_EQ(backend_->release_event(*event).error().code, ErrorCode::invalid_argument);
  // A point that waits for held work cannot be exported yet.
  backend_->set_hold(2, true);
  auto held = enqueue_fill(p, 2, *a, 1);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(order_->submit(3, [&](Ticket) -> Result<Op> { return Op{WaitOp{{2, *held}}}; }).ok());
  auto blocked = backend_->export_event({3, backend_->submitted(3)});
  ASSERT_FALSE(blocked.ok());
  EXPECT_EQ(blocked.error().code, ErrorCode::timeout);
  backend_->set_hold(2, false);
  auto now = backend_->export_event({3, backend_->submitted(3)});
  ASSERT_TRUE(now.ok()) << now.error().message;
  EXPECT_TRUE(backend_->release_event(*now).ok());
  ASSERT_TRUE(backend_->synchronize().ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, UserOpTest, FERRY_BACKENDS);
INSTANTIATE_TEST_SUITE_P(H200, UserOpTest, FERRY_SIM_H200);

// The sim names a program's stream by any pointer of the program's; it is adopted
// like a cudaStream_t (tests/cuda/adopted_stream_test.cpp runs a real one).
TEST(AdoptedSimStream, CannotBeHeldAndReleaseWaitsForItsTickets) {
  auto backend = testing::make_backend("sim");
  ASSERT_TRUE(backend);
  StreamOrder order(*backend);
  DevicePool pool(order);
  int program_stream = 0;
  auto s = backend->adopt_stream(&program_stream);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_GE(*s, kFirstAdoptedStream);
  EXPECT_EQ(backend->native_stream(*s).value_or(nullptr), &program_stream);
  auto own = backend->native_stream(0);
  ASSERT_TRUE(own.ok());
  EXPECT_FALSE(backend->adopt_stream(*own).ok()) << "one of the sim's own streams was adopted";
  backend->set_hold(*s, true);
  EXPECT_FALSE(backend->held(*s));

  auto a = pool.allocate(4 * MiB, *s);
  ASSERT_TRUE(a.ok());
  auto filled = enqueue_fill(pool, *s, *a, 1);  // 40 us of virtual time on tiny
  ASSERT_TRUE(filled.ok());
  EXPECT_LT(backend->completed(*s), *filled) << "the fill did not take virtual time";
  ASSERT_TRUE(backend->release_stream(*s, std::chrono::seconds(1)).ok());
  EXPECT_EQ(backend->completed(*s), *filled) << "released before its tickets completed";
  EXPECT_FALSE(backend->release_stream(*s, std::chrono::seconds(1)).ok());
  ASSERT_TRUE(pool.free(*a).ok());
}

}  // namespace
}  // namespace ferry
