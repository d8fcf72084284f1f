// The transfer engine under every integrity policy and every fault of report
// 000 (docs/spec.md I5): the fault bites when unguarded, verify recovers every copy,
// the batch probe disables a broken batch, and a copy that never arrives is
// transfer_corrupt — never success. What needs no injected fault is written once
// and run on every backend (cuda SKIPs without a GPU); the rest is sim-only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/fault_spec.hpp"
#include "transfer_fixture.hpp"

namespace ferry::testing {
namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * 1024;

RigOptions with(IntegrityPolicy policy, const char* inject = "none", std::uint64_t seed = 1) {
  RigOptions o;
  auto f = parse_fault_spec(inject);
  EXPECT_TRUE(f.ok());
  o.faults = f.value_or(SimFaults{});
  o.seed = seed;
  o.engine.policy = policy;
  o.arena.chunk_bytes = kMiB;
  o.arena.budget_bytes = 32 * kMiB;
  o.arena.validate_each_op = true;
  return o;
}

// A workload of plans of several ranges, with virtual time passing between
// rounds on sim (report 000: a delay after pinning is when copies go stale).
struct Workload {
  int rounds = 30;
  int ranges = 4;
  std::uint64_t bytes = 48 * kKiB;
  std::uint64_t idle_ns = 2'000'000;
  StreamId stream = 0;
};

struct Outcome {
  int wrong_ranges = 0;       // device bytes differ from the source after the round
  int errors = 0;
  std::string first_error;
};

Outcome run(Rig& rig, const Workload& w) {
  Outcome out;
  std::vector<DeviceHandle> dst;
  for (int k = 0; k < w.ranges; ++k) dst.push_back(rig.device(w.bytes, w.stream));
  for (int round = 0; round < w.rounds; ++round) {
    TransferPlan plan;
    std::vector<HostBlock> blocks;
    for (int k = 0; k < w.ranges; ++k) {
      const std::uint64_t seed = static_cast<std::uint64_t>(round * 100 + k);
      blocks.push_back(rig.block_with(seed, w.bytes));
      plan.add(blocks.back(), dst[static_cast<std::size_t>(k)]);
    }
    if (rig.sim != nullptr) rig.sim->advance(w.idle_ns);
    auto up = rig.engine->upload(w.stream, plan);
    if (!up.ok()) {
      if (out.errors++ == 0) out.first_error = up.error().message;
    }
    rig.sync();
    for (int k = 0; k < w.ranges; ++k) {
      const std::uint64_t seed = static_cast<std::uint64_t>(round * 100 + k);
      if (rig.device_bytes(dst[static_cast<std::size_t>(k)], 0, w.bytes, w.stream) !=
          pattern(seed, w.bytes)) {
        ++out.wrong_ranges;
      }
    }
    for (const HostBlock& b : blocks) EXPECT_TRUE(rig.arena->free(b).ok());
  }
  return out;
}

class TransferEngineTest : public BackendRigTest {};

TEST_P(TransferEngineTest, CleanVerifyHasNoFalsePositives) {
  Rig rig = make_rig(with(IntegrityPolicy::verify));
  ASSERT_TRUE(rig.engine->status().ok());
  const bool batched = rig.backend().info().batched_copy;  // the sim's profiles have it
  EXPECT_EQ(rig.engine->batching_enabled(), batched) << rig.engine->batching_disabled_reason();
  Workload w;
  w.rounds = 100;
  const Outcome out = run(rig, w);
  EXPECT_EQ(out.errors, 0) << out.first_error;
  EXPECT_EQ(out.wrong_ranges, 0);
  const IntegrityCounters c = rig.engine->counters();
  EXPECT_EQ(c.mismatches, 0u);
  EXPECT_EQ(c.retries, 0u);
  EXPECT_EQ(c.fallbacks, 0u);
  EXPECT_EQ(c.bytes_verified, 100u * 4 * w.bytes);
  EXPECT_EQ(c.bytes_moved, c.bytes_verified);
  EXPECT_EQ(c.batches, batched ? 100u : 0u);
  EXPECT_EQ(c.batched_disabled, !batched);
}

// The opt-in long run of issue 3 item 11: FERRY_LONG_TESTS=1.
TEST_P(TransferEngineTest, LongCleanVerifyRunHasZeroMismatches) {
  if (std::getenv("FERRY_LONG_TESTS") == nullptr) GTEST_SKIP() << "set FERRY_LONG_TESTS=1";
  Rig rig = make_rig(with(IntegrityPolicy::verify));
  Workload w;
  w.rounds = 5000;
  w.ranges = 8;
  w.bytes = 16 * kKiB + 64;
  const Outcome out = run(rig, w);
  EXPECT_EQ(out.errors, 0) << out.first_error;
  EXPECT_EQ(out.wrong_ranges, 0);
  EXPECT_EQ(rig.engine->counters().mismatches, 0u);
  RecordProperty("verified_transfers", 5000 * 8);
}

// Sim-only: injects the pinned-noop fault (SimFaults) and counts swallowed copies.
TEST(TransferEngine, PinnedNoopUnderOffCorruptsSilently) {
  Rig rig(with(IntegrityPolicy::off, "pinned-noop:1"));
  const Outcome out = run(rig, Workload{});
  EXPECT_EQ(out.errors, 0) << "off reports success";
  EXPECT_GT(out.wrong_ranges, 0) << "the fault must bite, or the verify tests prove nothing";
  EXPECT_GT(rig.sim->swallowed_copies(), 0u);
  EXPECT_EQ(rig.engine->counters().mismatches, 0u) << "nothing detected under off";
}

// Sim-only: injects the pinned-noop fault (SimFaults) and counts swallowed copies.
TEST(TransferEngine, VerifyRecoversEveryCopyUnderPinnedNoop) {
  for (const char* inject : {"pinned-noop:1", "pinned-noop:0.3"}) {
    for (std::uint64_t seed : {1, 2, 3}) {
      SCOPED_TRACE(std::string(inject) + " seed " + std::to_string(seed));
      Rig rig(with(IntegrityPolicy::verify, inject, seed));
      const Outcome out = run(rig, Workload{});
      EXPECT_EQ(out.errors, 0) << out.first_error;
      EXPECT_EQ(out.wrong_ranges, 0);
      const IntegrityCounters c = rig.engine->counters();
      EXPECT_EQ(c.corrupt, 0u);
      EXPECT_EQ(c.recovered + 0, c.recovered);
      if (rig.sim->swallowed_copies() > 0) {
        EXPECT_GT(c.mismatches, 0u);
        EXPECT_GT(c.recovered, 0u);
        EXPECT_GT(c.retries, 0u);
      }
      std::string why;
      EXPECT_TRUE(rig.arena->validate(&why)) << why;
    }
  }
  // And at P = 1 the fault certainly bit.
  Rig rig(with(IntegrityPolicy::verify, "pinned-noop:1"));
  (void)run(rig, Workload{});
  EXPECT_GT(rig.sim->swallowed_copies(), 0u);
  EXPECT_GT(rig.engine->counters().mismatches, 0u);
  EXPECT_GT(rig.engine->counters().units_retired, 0u);
}

// Sim-only: injects the pinned-noop fault (SimFaults) over seeded schedules.
TEST(TransferEngine, PinnedNoopAtThirtyPercentBitesForSomeSeed) {
  std::uint64_t mismatches = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    Rig rig(with(IntegrityPolicy::verify, "pinned-noop:0.3", seed));
    const Outcome out = run(rig, Workload{});
    EXPECT_EQ(out.wrong_ranges, 0);
    EXPECT_EQ(out.errors, 0) << out.first_error;
    mismatches += rig.engine->counters().mismatches;
  }
  EXPECT_GT(mismatches, 0u);
}

// Sim-only: injects the pinned-noop fault (SimFaults).
TEST(TransferEngine, ProbeEveryTransferRedoesCopiesOfAStaleChunk) {
  RigOptions o = with(IntegrityPolicy::probe, "pinned-noop:1");
  o.engine.probe_every_transfers = 1;
  Rig rig(o);
  const Outcome out = run(rig, Workload{});
  EXPECT_EQ(out.errors, 0) << out.first_error;
  EXPECT_EQ(out.wrong_ranges, 0);
  const IntegrityCounters c = rig.engine->counters();
  EXPECT_GT(c.canary_failures, 0u);
  EXPECT_GT(c.units_retired, 0u);
  EXPECT_GT(c.retries, 0u);
  EXPECT_TRUE(c.probe_escalated);
}

// With the default interval the first canary failure escalates probe to every
// transfer; this workload's copies then all arrive (seeded, deterministic).
// Sim-only: injects the pinned-noop fault (SimFaults) on a seeded schedule.
TEST(TransferEngine, ProbeEscalatesAfterTheFirstFailedCanary) {
  Rig rig(with(IntegrityPolicy::probe, "pinned-noop:0.3"));
  const Outcome out = run(rig, Workload{});
  EXPECT_EQ(out.errors, 0) << out.first_error;
  const IntegrityCounters c = rig.engine->counters();
  if (c.canary_failures > 0) {
    EXPECT_TRUE(c.probe_escalated);
    EXPECT_GE(c.canaries, 20u) << "every transfer after the failure was canaried";
  }
  EXPECT_EQ(out.wrong_ranges, 0);
}

// Sim-only: injects the batch-broken fault (SimFaults), under every policy.
class BatchBroken : public ::testing::TestWithParam<IntegrityPolicy> {};

TEST_P(BatchBroken, TheStartupProbeDisablesBatchingAndBytesAreRight) {
  Rig rig(with(GetParam(), "batch-broken"));
  const BatchProbeReport probe = rig.engine->startup_probe();
  EXPECT_TRUE(probe.ran);
  EXPECT_FALSE(probe.passed) << probe.detail;
  EXPECT_FALSE(rig.engine->batching_enabled());
  EXPECT_NE(rig.engine->batching_disabled_reason().find("probe"), std::string::npos);
  const Outcome out = run(rig, Workload{});
  EXPECT_EQ(out.errors, 0) << out.first_error;
  EXPECT_EQ(out.wrong_ranges, 0);
  const IntegrityCounters c = rig.engine->counters();
  EXPECT_TRUE(c.batched_disabled);
  EXPECT_EQ(c.batches, 0u);
  EXPECT_GT(c.per_copy, 0u);
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, BatchBroken,
                         ::testing::Values(IntegrityPolicy::off, IntegrityPolicy::probe,
                                           IntegrityPolicy::verify),
                         [](const auto& p) { return std::string(to_string(p.param)); });

// Sim-only: injects the batch-missing fault (SimFaults).
TEST(TransferEngine, MissingBatchedCopyMeansPerCopyWithoutAProbe) {
  Rig rig(with(IntegrityPolicy::verify, "batch-missing"));
  EXPECT_FALSE(rig.engine->startup_probe().ran);
  EXPECT_FALSE(rig.engine->batching_enabled());
  EXPECT_NE(rig.engine->batching_disabled_reason().find("no native batched copy"), std::string::npos);
  const Outcome out = run(rig, Workload{});
  EXPECT_EQ(out.errors, 0) << out.first_error;
  EXPECT_EQ(out.wrong_ranges, 0);
}

// A batch that passes the start-up probe but breaks later: verify convicts the
// batch (the chunk's canary passes) and turns batching off.
class BreaksBatchesLater final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  Result<Ticket> enqueue(StreamId stream, Op op) override {
    if (auto* b = std::get_if<BatchCopyToDeviceOp>(&op); b != nullptr && ++batches > 2 &&
                                                        b->copies.size() > 1) {
      b->copies.resize(1);  // silently drop all but the first copy
    }
    return inner_.enqueue(stream, std::move(op));
  }
  int batches = 0;
};

TEST_P(TransferEngineTest, VerifyConvictsABatchThatBreaksAfterTheProbe) {
  Rig rig = make_rig(with(IntegrityPolicy::verify), [](Backend& inner) {
    return std::unique_ptr<Backend>(new BreaksBatchesLater(inner));
  });
  if (!rig.backend().info().batched_copy) GTEST_SKIP() << "the device has no native batched copy";
  EXPECT_TRUE(rig.engine->batching_enabled());
  const Outcome out = run(rig, Workload{});
  EXPECT_EQ(out.errors, 0) << out.first_error;
  EXPECT_EQ(out.wrong_ranges, 0);
  const IntegrityCounters c = rig.engine->counters();
  EXPECT_GT(c.mismatches, 0u);
  EXPECT_TRUE(c.batched_disabled);
  EXPECT_EQ(c.units_retired, 0u) << "the chunks were fine; the batch was not";
  EXPECT_NE(rig.engine->batching_disabled_reason().find("canary passed"), std::string::npos);
}

TEST_P(TransferEngineTest, EveryPathBrokenIsTransferCorruptNamingTheRange) {
  DropAllHostToDevice* dropper = nullptr;
  Rig rig = make_rig(with(IntegrityPolicy::verify), [&](Backend& inner) {
    auto d = std::make_unique<DropAllHostToDevice>(inner);
    dropper = d.get();
    return std::unique_ptr<Backend>(std::move(d));
  });
  const std::uint64_t n = 10 * kKiB + 3;
  DeviceHandle dst = rig.device(2 * n);
  HostBlock src = rig.block_with(5, n);
  TransferPlan plan;
  plan.add(src, 0, dst, n, n);
  auto up = rig.engine->upload(0, plan);
  ASSERT_FALSE(up.ok()) << "a copy that never verified must not be success";
  EXPECT_EQ(up.error().code, ErrorCode::transfer_corrupt);
  const std::string& msg = up.error().message;
  const std::vector<std::string> parts = {"range 0", "slot " + std::to_string(dst.slot),
                                          "offset " + std::to_string(n),
                                          std::to_string(n) + " bytes", "pageable", "source hash"};
  for (const std::string& part : parts) {
    EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
  }
  const IntegrityCounters c = rig.engine->counters();
  EXPECT_EQ(c.corrupt, 1u);
  EXPECT_EQ(c.mismatches, rig.engine->options().max_attempts);
  EXPECT_EQ(c.retries, rig.engine->options().max_attempts - 1);
  EXPECT_GT(dropper->dropped, 0u);
  EXPECT_TRUE(rig.arena->free(src).ok());
}

TEST_P(TransferEngineTest, PlainHostMemoryIsStagedAndTheCallerMayReuseItAtOnce) {
  Rig rig = make_rig(with(IntegrityPolicy::off));
  const std::uint64_t n = 20 * kKiB;
  DeviceHandle dst = rig.device(n, 3);
  std::vector<std::byte> host = pattern(9, n);
  rig.backend().set_hold(3, true);
  TransferPlan plan;
  plan.add(std::span<const std::byte>(host), dst);
  auto up = rig.engine->upload(3, plan);
  ASSERT_TRUE(up.ok()) << up.error().message;
  std::memset(host.data(), 0, n);  // the copy is still held: the engine staged the bytes
  rig.backend().set_hold(3, false);
  ASSERT_TRUE(rig.backend().flush(3).ok());
  rig.sync();
  EXPECT_EQ(rig.device_bytes(dst, 0, n, 3), pattern(9, n));
  EXPECT_EQ(rig.engine->counters().staged, 1u);
}

TEST_P(TransferEngineTest, ImmutableRegisteredRangesAreReadInPlaceAndVerified) {
  Rig rig = make_rig(with(IntegrityPolicy::verify));
  if (!rig.backend().info().host_register) GTEST_SKIP() << "the device cannot register host memory";
  std::vector<std::byte> bank = pattern(21, 3 * kMiB);
  auto region = rig.engine->register_immutable(bank.data(), bank.size());
  ASSERT_TRUE(region.ok()) << region.error().message;
  const std::uint64_t expert = 256 * kKiB;
  for (int e = 0; e < 12; ++e) {
    ASSERT_TRUE(rig.engine->precompute_hash(bank.data() + e * expert, expert).ok());
  }
  EXPECT_EQ(rig.engine->precompute_hash(bank.data() + bank.size() - 8, 16).error().code,
            ErrorCode::invalid_argument);
  DeviceHandle dst = rig.device(4 * expert);
  TransferPlan plan;
  for (int k = 0; k < 4; ++k) plan.add(bank.data() + (k * 3) * expert, dst, k * expert, expert);
  auto up = rig.engine->upload(0, plan);
  ASSERT_TRUE(up.ok()) << up.error().message;
  EXPECT_TRUE(up->verified);
  for (int k = 0; k < 4; ++k) {
    const auto want = std::vector<std::byte>(bank.begin() + (k * 3) * expert,
                                             bank.begin() + (k * 3 + 1) * expert);
    EXPECT_EQ(rig.device_bytes(dst, k * expert, expert), want);
  }
  EXPECT_EQ(rig.engine->counters().staged, 0u) << "read in place, not copied";
  ASSERT_TRUE(rig.engine->unregister(*region).ok());
}

TEST_P(TransferEngineTest, DownloadAndDeviceCopyVerify) {
  Rig rig = make_rig(with(IntegrityPolicy::verify));
  const std::uint64_t n = 40 * kKiB + 8;
  DeviceHandle a = rig.device(n), b = rig.device(n + 512);
  ASSERT_TRUE(enqueue_fill(*rig.pool, 0, a, 77).ok());
  auto copy = rig.engine->copy_on_device(0, b, 512, a, 0, n);
  ASSERT_TRUE(copy.ok()) << copy.error().message;
  EXPECT_TRUE(copy->verified);
  std::vector<std::byte> host(n);
  auto down = rig.engine->download(0, b, 512, host);
  ASSERT_TRUE(down.ok()) << down.error().message;
  EXPECT_TRUE(down->verified);
  EXPECT_EQ(host, pattern(77, n));
  // Into an arena block, in place.
  auto blk = rig.arena->allocate(n);
  ASSERT_TRUE(blk.ok());
  ASSERT_TRUE(rig.engine->download(1, a, 0, blk->span()).ok());
  EXPECT_EQ(std::vector<std::byte>(blk->data, blk->data + n), pattern(77, n));
  EXPECT_EQ(rig.engine->counters().mismatches, 0u);
}

// begin_upload on four streams, finish() later: every upload verifies.
void expect_async_uploads_resolve_later(Rig& rig) {
  const std::uint64_t n = 32 * kKiB;
  std::vector<PendingUpload> pending;
  std::vector<HostBlock> blocks;
  std::vector<DeviceHandle> dsts;
  if (rig.sim != nullptr) rig.sim->advance(3'000'000);
  for (StreamId s = 0; s < 4; ++s) {
    dsts.push_back(rig.device(n, s));
    blocks.push_back(rig.block_with(500 + s, n));
    TransferPlan plan;
    plan.add(blocks.back(), dsts.back());
    auto p = rig.engine->begin_upload(s, plan);
    ASSERT_TRUE(p.ok()) << p.error().message;
    pending.push_back(std::move(*p));
  }
  if (rig.sim != nullptr) rig.sim->advance(3'000'000);
  for (auto& p : pending) {
    auto r = rig.engine->finish(std::move(p));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_TRUE(r->verified);
  }
  for (StreamId s = 0; s < 4; ++s) {
    EXPECT_EQ(rig.device_bytes(dsts[s], 0, n, s), pattern(500 + s, n));
  }
  for (const HostBlock& b : blocks) EXPECT_TRUE(rig.arena->free(b).ok());
  PendingUpload moved_from;
  EXPECT_EQ(rig.engine->finish(std::move(moved_from)).error().code, ErrorCode::invalid_argument);
}

TEST_P(TransferEngineTest, AsyncUploadsOnSeveralStreamsResolveLater) {
  Rig rig = make_rig(with(IntegrityPolicy::verify));
  expect_async_uploads_resolve_later(rig);
}

// Sim-only: the same with the pinned-noop fault (SimFaults), stale by virtual time.
TEST(TransferEngine, AsyncUploadsResolveLaterUnderPinnedNoop) {
  Rig rig(with(IntegrityPolicy::verify, "pinned-noop:1"));
  expect_async_uploads_resolve_later(rig);
}

// Several host threads, one stream each: the engine, the arena and the pool are
// shared; every byte arrives.
void expect_concurrent_uploads_arrive(Rig& rig) {
  constexpr int kThreads = 4, kRounds = 25;
  const std::uint64_t n = 24 * kKiB;
  std::vector<DeviceHandle> dst;
  for (int t = 0; t < kThreads; ++t) dst.push_back(rig.device(2 * n, static_cast<StreamId>(t)));
  std::vector<int> wrong(kThreads, 0), errors(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const auto stream = static_cast<StreamId>(t);
      for (int r = 0; r < kRounds; ++r) {
        const std::uint64_t seed = static_cast<std::uint64_t>(t * 1000 + r);
        auto a = rig.arena->allocate(n);
        if (!a.ok()) {
          ++errors[t];
          continue;
        }
        fill_pattern(seed, 0, a->span());
        std::vector<std::byte> plain = pattern(seed + 1, n);
        TransferPlan plan;
        plan.add(*a, dst[t]).add(std::span<const std::byte>(plain), dst[t], n);
        auto up = rig.engine->upload(stream, plan);
        if (!up.ok()) ++errors[t];
        if (!rig.arena->free(*a).ok()) ++errors[t];
        std::vector<std::byte> back(2 * n);
        if (!rig.engine->download(stream, dst[t], 0, back).ok()) ++errors[t];
        if (!std::equal(back.begin(), back.begin() + static_cast<std::ptrdiff_t>(n),
                        pattern(seed, n).begin()) ||
            !std::equal(back.begin() + static_cast<std::ptrdiff_t>(n), back.end(), plain.begin())) {
          ++wrong[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], 0) << "thread " << t;
    EXPECT_EQ(wrong[t], 0) << "thread " << t;
  }
  std::string why;
  EXPECT_TRUE(rig.arena->validate(&why)) << why;
}

TEST_P(TransferEngineTest, ConcurrentUploadsFromSeveralThreads) {
  Rig rig = make_rig(with(IntegrityPolicy::verify));
  expect_concurrent_uploads_arrive(rig);
}

// Sim-only: the same with the pinned-noop fault (SimFaults) active.
TEST(TransferEngine, ConcurrentUploadsFromSeveralThreadsUnderPinnedNoop) {
  Rig rig(with(IntegrityPolicy::verify, "pinned-noop:0.3", 4));
  expect_concurrent_uploads_arrive(rig);
}

TEST_P(TransferEngineTest, BadPlansAreErrorsBeforeAnythingIsEnqueued) {
  Rig rig = make_rig(with(IntegrityPolicy::verify));
  DeviceHandle dst = rig.device(4096);
  HostBlock blk = rig.block_with(1, 4096);
  const Ticket before = rig.backend().submitted(0);
  auto expect_code = [&](const TransferPlan& plan, ErrorCode code) {
    auto r = rig.engine->upload(0, plan);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, code) << r.error().message;
  };
  expect_code(TransferPlan{}.add(blk, 0, dst, 0, 0), ErrorCode::invalid_argument);
  expect_code(TransferPlan{}.add(blk, 0, dst, 1, 4096), ErrorCode::invalid_argument);
  expect_code(TransferPlan{}.add(blk, 1, dst, 0, 4096), ErrorCode::invalid_argument);
  expect_code(TransferPlan{}.add(blk, 0, dst, ~std::uint64_t{0}, 2), ErrorCode::invalid_argument);
  expect_code(TransferPlan{}.add(static_cast<const std::byte*>(nullptr), dst, 0, 16),
              ErrorCode::invalid_argument);
  expect_code(TransferPlan{}.add(blk, 0, DeviceHandle{9, 9, 9}, 0, 16), ErrorCode::stale_handle);
  HostBlock forged = blk;
  forged.serial += 1000;
  expect_code(TransferPlan{}.add(forged, dst), ErrorCode::stale_handle);
  EXPECT_EQ(rig.backend().submitted(0), before) << "nothing was enqueued";
  auto bad_stream = rig.engine->upload(kMaxStreams, TransferPlan{}.add(blk, dst));
  EXPECT_EQ(bad_stream.error().code, ErrorCode::invalid_argument);
  std::vector<std::byte> none;
  EXPECT_EQ(rig.engine->download(0, dst, 0, none).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(rig.engine->copy_on_device(0, dst, 1, dst, 0, 4096).error().code,
            ErrorCode::invalid_argument);
  EXPECT_TRUE(rig.arena->free(blk).ok());
}

TEST_P(TransferEngineTest, EngineRejectsAPoolAndArenaOnDifferentStreamOrders) {
  Rig rig = make_rig(with(IntegrityPolicy::verify));
  StreamOrder other(rig.backend());
  HostArena foreign(other);
  TransferEngine engine(*rig.pool, foreign);
  ASSERT_FALSE(engine.status().ok());
  EXPECT_EQ(engine.status().error().code, ErrorCode::invalid_argument);
  EXPECT_FALSE(engine.upload(0, TransferPlan{}).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, TransferEngineTest, FERRY_BACKENDS);

}  // namespace
}  // namespace ferry::testing
