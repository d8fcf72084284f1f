// Under verify the device hashes run on the engine's verify stream, behind an
// event wait for their copy, not on the upload stream: the next upload never
// waits for a hash (nor for the kernel that holds the engine a hash runs on),
// the hash still leases what it reads (I2), and a receipt's `done` still covers
// every copy and hash. Sim-only: the tests read the virtual clock.
#include <gtest/gtest.h>

#include <array>
#include <utility>
#include <vector>

#include "transfer_fixture.hpp"

namespace ferry::testing {
namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * 1024;

RigOptions verify_rig() {
  RigOptions o;
  o.engine.policy = IntegrityPolicy::verify;
  o.arena.chunk_bytes = kMiB;
  o.arena.validate_each_op = true;
  return o;
}

// Occupies the sim's one compute engine (the one hashes run on) for ~1 ms of
// virtual time from now, on stream 0. Returns when that kernel completes.
std::uint64_t busy_compute_engine(Rig& rig) {
  const DeviceHandle in = rig.device(64 * kKiB, 0), out = rig.device(64 * kKiB, 0);
  const std::array<DeviceHandle, 1> inputs{in};
  const std::uint64_t start = rig.backend().now_ns();
  auto t = enqueue_compute(*rig.pool, 0, inputs, out, /*flops=*/1e10);  // 1 ms on tiny
  EXPECT_TRUE(t.ok()) << t.error().message;
  EXPECT_TRUE(rig.pool->free(in).ok());
  EXPECT_TRUE(rig.pool->free(out).ok());
  return start + 1'000'000;
}

TEST(VerifyStream, UploadsOnOneStreamDoNotWaitForEachOthersHashes) {
  Rig rig(verify_rig());
  ASSERT_TRUE(rig.engine->status().ok());
  const StreamId vs = kMaxStreams - 2;  // uploads on stream 1, by default
  const std::uint64_t n = 64 * kKiB;
  const DeviceHandle a = rig.device(n, 1), b = rig.device(n, 1);
  const HostBlock ha = rig.block_with(1, n), hb = rig.block_with(2, n);
  const std::uint64_t kernel_done = busy_compute_engine(rig);

  auto pa = rig.engine->begin_upload(1, TransferPlan{}.add(ha, a));
  ASSERT_TRUE(pa.ok()) << pa.error().message;
  auto pb = rig.engine->begin_upload(1, TransferPlan{}.add(hb, b));
  ASSERT_TRUE(pb.ok()) << pb.error().message;
  // The upload stream holds the two copies and nothing else.
  const StreamPoint copies{1, rig.backend().submitted(1)};
  ASSERT_TRUE(rig.order->wait(copies).ok());
  EXPECT_LT(rig.backend().now_ns(), kernel_done)
      << "the second copy waited for the first one's hash, queued behind the kernel";
  EXPECT_EQ(pa->point().stream, vs);
  EXPECT_FALSE(rig.order->is_complete(pa->point()))
      << "a hash ran while the kernel held the engine";

  auto ra = rig.engine->finish(std::move(*pa));
  ASSERT_TRUE(ra.ok()) << ra.error().message;
  auto rb = rig.engine->finish(std::move(*pb));
  ASSERT_TRUE(rb.ok()) << rb.error().message;
  EXPECT_GE(rig.backend().now_ns(), kernel_done);
  for (const TransferReceipt* r : {&*ra, &*rb}) {
    EXPECT_TRUE(r->verified);
    EXPECT_EQ(r->done.stream, vs);
    EXPECT_TRUE(rig.order->is_complete(r->done)) << "done covers the copies and the hashes";
  }
  EXPECT_EQ(rig.device_bytes(a, 0, n, 1), pattern(1, n));
  EXPECT_EQ(rig.device_bytes(b, 0, n, 1), pattern(2, n));
  EXPECT_EQ(rig.engine->counters().bytes_verified, 2 * n);
  EXPECT_TRUE(rig.arena->free(ha).ok());
  EXPECT_TRUE(rig.arena->free(hb).ok());
}

// The hash on the verify stream reads the destination after the copy completed:
// its own leases keep the device block and the arena source from being handed
// out again until it has run, though the upload stream is long past the copy.
TEST(VerifyStream, TheHashLeasesDestinationAndSourceUntilItRan) {
  Rig rig(verify_rig());
  const std::uint64_t n = 64 * kKiB;
  const DeviceHandle dst = rig.device(n, 1);
  const HostBlock src = rig.block_with(7, n);
  const std::uint64_t dst_addr = rig.pool->resolve(dst)->addr;
  const std::uint64_t kernel_done = busy_compute_engine(rig);

  auto pending = rig.engine->begin_upload(1, TransferPlan{}.add(src, dst));
  ASSERT_TRUE(pending.ok()) << pending.error().message;
  ASSERT_TRUE(rig.order->wait({1, rig.backend().submitted(1)}).ok());
  ASSERT_LT(rig.backend().now_ns(), kernel_done);
  ASSERT_FALSE(rig.order->is_complete(pending->point()));

  // Both dropped while only the hash still reads them (legal: frees are
  // stream-ordered; no retry will need the source, nothing is corrupted).
  ASSERT_TRUE(rig.pool->free(dst).ok());
  ASSERT_TRUE(rig.arena->free(src).ok());
  // The pool hands the destination's memory out again at once, but behind an
  // event wait for the hash: the fill below runs after it (else the hash mismatches).
  auto again = rig.pool->allocate(n, 1);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(rig.pool->resolve(*again)->addr, dst_addr) << "not the reuse this test is about";
  ASSERT_TRUE(enqueue_fill(*rig.pool, 1, *again, 99).ok());
  auto host_again = rig.arena->allocate(n);
  ASSERT_TRUE(host_again.ok()) << host_again.error().message;
  EXPECT_NE(host_again->data, src.data) << "the source block was reused under its hash";

  auto r = rig.engine->finish(std::move(*pending));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->verified);
  EXPECT_EQ(rig.engine->counters().mismatches, 0u);
  EXPECT_TRUE(rig.arena->free(*host_again).ok());
  EXPECT_TRUE(rig.pool->free(*again).ok());
  std::string why;
  EXPECT_TRUE(rig.pool->validate(&why)) << why;
  EXPECT_TRUE(rig.arena->validate(&why)) << why;
}

// With one verify stream, a transfer's hashes queue behind another transfer's
// event wait for a copy still held in a host-side queue: finishing the later
// transfer dispatches that copy rather than waiting forever.
TEST(VerifyStream, AHeldUploadDoesNotBlockAnotherTransfersHashes) {
  RigOptions o = verify_rig();
  o.engine.verify_streams = 1;
  Rig rig(o);
  const std::uint64_t n = 16 * kKiB;
  const DeviceHandle a = rig.device(n, 2), b = rig.device(n, 1);
  const HostBlock ha = rig.block_with(3, n), hb = rig.block_with(4, n);
  rig.backend().set_hold(2, true);
  auto pa = rig.engine->begin_upload(2, TransferPlan{}.add(ha, a));
  ASSERT_TRUE(pa.ok()) << pa.error().message;
  auto rb = rig.engine->upload(1, TransferPlan{}.add(hb, b));
  ASSERT_TRUE(rb.ok()) << rb.error().message;
  EXPECT_TRUE(rb->verified);
  auto ra = rig.engine->finish(std::move(*pa));
  ASSERT_TRUE(ra.ok()) << ra.error().message;
  EXPECT_TRUE(ra->verified);
  rig.backend().set_hold(2, false);
  EXPECT_EQ(rig.device_bytes(a, 0, n, 2), pattern(3, n));
  EXPECT_EQ(rig.device_bytes(b, 0, n, 1), pattern(4, n));
  EXPECT_TRUE(rig.arena->free(ha).ok());
  EXPECT_TRUE(rig.arena->free(hb).ok());
}

// Uploads on different streams hash on different verify streams, so one never
// waits for the copies another stream queued: here the other stream is held,
// and its copy stays held (and unverified) while this upload completes.
TEST(VerifyStream, UploadsOnDifferentStreamsHashOnDifferentVerifyStreams) {
  Rig rig(verify_rig());
  const std::uint64_t n = 16 * kKiB;
  const DeviceHandle a = rig.device(n, 2), b = rig.device(n, 1);
  const HostBlock ha = rig.block_with(5, n), hb = rig.block_with(6, n);
  rig.backend().set_hold(2, true);
  auto pa = rig.engine->begin_upload(2, TransferPlan{}.add(ha, a));
  ASSERT_TRUE(pa.ok()) << pa.error().message;
  auto rb = rig.engine->upload(1, TransferPlan{}.add(hb, b));
  ASSERT_TRUE(rb.ok()) << rb.error().message;
  EXPECT_EQ(pa->point().stream, kMaxStreams - 3);
  EXPECT_EQ(rb->done.stream, kMaxStreams - 2);
  EXPECT_EQ(rig.backend().completed(2), 0u)
      << "the held stream was dispatched for another's hashes";
  EXPECT_FALSE(rig.order->is_complete(pa->point()));
  rig.backend().set_hold(2, false);
  auto ra = rig.engine->finish(std::move(*pa));
  ASSERT_TRUE(ra.ok()) << ra.error().message;
  EXPECT_TRUE(ra->verified);
  EXPECT_EQ(rig.device_bytes(a, 0, n, 2), pattern(5, n));
  EXPECT_EQ(rig.device_bytes(b, 0, n, 1), pattern(6, n));
  EXPECT_TRUE(rig.arena->free(ha).ok());
  EXPECT_TRUE(rig.arena->free(hb).ok());
}

// A dropped PendingUpload whose copy is still held: the engine's destructor
// waits for the hash that writes into engine memory, which needs the held copy
// dispatched first (else it would give up and leak the result buffer).
TEST(VerifyStream, TheEngineWaitsForTheHashesOfADroppedHeldUpload) {
  Rig rig(verify_rig());
  const std::uint64_t n = 16 * kKiB;
  const DeviceHandle d = rig.device(n, 2);
  const HostBlock h = rig.block_with(8, n);
  rig.backend().set_hold(2, true);
  {
    auto p = rig.engine->begin_upload(2, TransferPlan{}.add(h, d));
    ASSERT_TRUE(p.ok()) << p.error().message;
  }
  const StreamId vs = kMaxStreams - 3;
  const Ticket hashes = rig.backend().submitted(vs);
  EXPECT_EQ(rig.backend().completed(vs), 0u);
  rig.engine.reset();
  EXPECT_EQ(rig.backend().completed(vs), hashes);
  EXPECT_EQ(rig.backend().completed(2), rig.backend().submitted(2));
  rig.backend().set_hold(2, false);
  EXPECT_EQ(rig.device_bytes(d, 0, n, 2), pattern(8, n));
  EXPECT_TRUE(rig.arena->free(h).ok());
}

// An upload on its own verify stream hashes in line behind its copies.
TEST(VerifyStream, AnUploadOnItsOwnVerifyStreamHashesInLine) {
  RigOptions o = verify_rig();
  o.engine.verify_stream = 5;
  o.engine.verify_streams = 1;
  Rig rig(o);
  ASSERT_TRUE(rig.engine->status().ok());
  const std::uint64_t n = 16 * kKiB;
  const DeviceHandle d = rig.device(n, 5);
  const std::vector<std::byte> host = pattern(11, n);
  auto r = rig.engine->upload(5, TransferPlan{}.add(std::span<const std::byte>(host), d));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->verified);
  EXPECT_EQ(r->done.stream, 5u);
  EXPECT_TRUE(rig.order->is_complete(r->done));
  EXPECT_EQ(rig.device_bytes(d, 0, n, 5), host);
}

// Retries after a mismatch still work with the hashes off the upload stream:
// every copy out of stale pinned memory is caught and redone (report 000).
TEST(VerifyStream, MismatchesAreRetriedAndTheReceiptCoversTheRetries) {
  RigOptions o = verify_rig();
  o.faults.pinned_noop = 1.0;
  Rig rig(o);
  const std::uint64_t n = 32 * kKiB;
  const DeviceHandle d = rig.device(2 * n, 1);
  for (std::uint64_t round = 0; round < 6; ++round) {
    const HostBlock h0 = rig.block_with(100 + round, n), h1 = rig.block_with(200 + round, n);
    rig.sim->advance(5'000'000);  // report 000: a delay after pinning
    auto r = rig.engine->upload(1, TransferPlan{}.add(h0, d, 0).add(h1, d, n));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_TRUE(r->verified);
    EXPECT_TRUE(rig.order->is_complete(r->done));
    EXPECT_EQ(rig.device_bytes(d, 0, n, 1), pattern(100 + round, n)) << "round " << round;
    EXPECT_EQ(rig.device_bytes(d, n, n, 1), pattern(200 + round, n)) << "round " << round;
    EXPECT_TRUE(rig.arena->free(h0).ok());
    EXPECT_TRUE(rig.arena->free(h1).ok());
  }
  const IntegrityCounters c = rig.engine->counters();
  EXPECT_GT(c.mismatches, 0u) << "the fault never bit: the test proves nothing";
  EXPECT_EQ(c.corrupt, 0u);
  EXPECT_GT(c.recovered, 0u);
  EXPECT_GT(c.retries, 0u);
}

TEST(VerifyStream, OutOfRangeVerifyStreamsAreAnError) {
  for (const auto& [first, count] : {std::pair<StreamId, std::uint32_t>{kMaxStreams, 1},
                                     std::pair<StreamId, std::uint32_t>{2, 4}}) {
    RigOptions o = verify_rig();
    o.engine.verify_stream = first;
    o.engine.verify_streams = count;
    Rig rig(o);
    ASSERT_FALSE(rig.engine->status().ok()) << first << " " << count;
    EXPECT_EQ(rig.engine->status().error().code, ErrorCode::invalid_argument);
    EXPECT_NE(rig.engine->status().error().message.find("verify_stream"), std::string::npos);
  }
  RigOptions o = verify_rig();
  o.engine.verify_stream = 3;
  o.engine.verify_streams = 4;  // streams 3, 2, 1, 0: legal, if unwise
  Rig rig(o);
  EXPECT_TRUE(rig.engine->status().ok());
}

}  // namespace
}  // namespace ferry::testing
