// Runtime (one object owning backend, order, pool, arena, engine, cache), the
// RAII Allocation, DevicePool::reset_peak_stats and memory_summary. Written
// once, run on every backend (cuda SKIPs without a GPU); the refusals of bad
// options run without a device.
#include "ferry/runtime.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "backend_fixture.hpp"
#include "core/text.hpp"
#include "ferry/allocation.hpp"
#include "ferry/forwarding_backend.hpp"
#include "ferry/pool_calls.hpp"
#include "ferry/user_op.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

using testing::pattern;
using testing::read_back;

constexpr std::uint64_t KiB = 1024, MiB = 1024 * 1024;

RuntimeOptions options_on(const std::string& backend) {
  RuntimeOptions o;
  o.backend = testing::backend_spec(backend);  // the sim's "tiny" profile: 64 MiB
  return o;
}

// Makes a Runtime, or skips the test when the machine lacks the backend.
#define FERRY_MAKE_RUNTIME(var, opts, name)                                                  \
  auto var##_made = Runtime::create(opts);                                                   \
  if (!var##_made.ok() && !testing::backend_skip_reason(name).empty()) {                    \
    GTEST_SKIP() << "backend " << (name) << " unavailable: " << testing::backend_skip_reason(name); \
  }                                                                                          \
  ASSERT_TRUE(var##_made.ok()) << var##_made.error().message;                               \
  std::unique_ptr<Runtime> var = std::move(var##_made).value()

class RuntimeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    FERRY_MAKE_RUNTIME(made, options_on(GetParam()), GetParam());
    rt_ = std::move(made);
  }
  DevicePool& pool() { return rt_->pool(); }

  std::unique_ptr<Runtime> rt_;
};

// --- Runtime ------------------------------------------------------------------

TEST_P(RuntimeTest, BuildsEveryComponentOnOneStreamOrderAndIsHealthy) {
  Runtime& rt = *rt_;
  EXPECT_TRUE(rt.status().ok());
  EXPECT_EQ(rt.cache(), nullptr);
  EXPECT_EQ(&rt.order().backend(), &rt.backend());
  EXPECT_EQ(&rt.pool().order(), &rt.order());
  EXPECT_EQ(&rt.arena().order(), &rt.order());
  EXPECT_EQ(&rt.engine().pool(), &rt.pool());
  EXPECT_EQ(&rt.engine().arena(), &rt.arena());
  EXPECT_EQ(rt.order().wait_timeout(), RuntimeOptions{}.wait_timeout);
  EXPECT_EQ(rt.backend().info().backend, rt.options().backend.kind);
  EXPECT_EQ(rt.engine().policy(), EngineOptions{}.policy);

  // The pieces work together: a fill through the pool, read back.
  Result<Allocation> a = rt.allocate(64 * KiB + 3, 0);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(enqueue_fill(rt.pool(), 0, a->handle(), 41).ok());
  ASSERT_TRUE(rt.synchronize().ok());
  auto got = read_back(rt.pool(), a->handle(), 0);
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ(*got, pattern(41, 64 * KiB + 3));
  EXPECT_TRUE(rt.status().ok());
}

// Issue 24 item 6: a download ordered after a failed kernel on its stream
// reports the kernel's fault, never the pre-kernel bytes as success.
TEST_P(RuntimeTest, ADownloadAfterAFailedKernelReportsTheFault) {
  Runtime& rt = *rt_;
  Result<Allocation> a = rt.allocate(64 * KiB, 0);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(enqueue_fill(rt.pool(), 0, a->handle(), 7).ok());
  const Operand ops[] = {{a->handle(), Access::write}};
  auto failed = enqueue_user(
      rt.pool(), 0, ops,
      [](const KernelLaunch&) -> Result<void> { return make_error(ErrorCode::invalid_argument, "kernel failed"); },
      {}, "doomed");
  ASSERT_TRUE(failed.ok());
  std::vector<std::byte> back(64 * KiB);
  auto d = rt.engine().download(0, a->handle(), 0, back);
  ASSERT_FALSE(d.ok()) << "the pre-kernel bytes were downloaded as a success";
  EXPECT_EQ(d.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(d.error().message.find("kernel failed"), std::string::npos) << d.error().message;
  // Sticky: a second download says so too.
  EXPECT_FALSE(rt.engine().download(0, a->handle(), 0, back).ok());
}

// Issue 41 item 10: a download on a stream ordered (by a wait) after another
// stream's failed kernel reports that fault, whether the wait was enqueued before
// the kernel ran or after it had failed.
TEST_P(RuntimeTest, ADownloadOrderedAfterAnotherStreamsFailedKernelReportsTheFault) {
  Runtime& rt = *rt_;
  for (const bool wait_after_failure : {false, true}) {
    SCOPED_TRACE(wait_after_failure ? "wait enqueued after the failure" : "wait enqueued before it ran");
    Result<Allocation> a = rt.allocate(64 * KiB, 0);
    ASSERT_TRUE(a.ok()) << a.error().message;
    const StreamId producer = wait_after_failure ? 3 : 1, consumer = wait_after_failure ? 4 : 2;
    ASSERT_TRUE(enqueue_fill(rt.pool(), consumer, a->handle(), 7).ok());
    ASSERT_TRUE(rt.synchronize().ok());
    const Operand ops[] = {{a->handle(), Access::write}};
    auto failed = enqueue_user(
        rt.pool(), producer, ops,
        [](const KernelLaunch&) -> Result<void> { return make_error(ErrorCode::invalid_argument, "kernel failed"); },
        {}, "doomed");
    ASSERT_TRUE(failed.ok()) << failed.error().message;
    // The kernel has run (and failed) before the wait is asked for: its point is complete.
    if (wait_after_failure) ASSERT_TRUE(rt.order().wait({producer, *failed}).ok());
    auto ordered = rt.order().order_after(consumer, {producer, *failed}, StreamOrder::HeldWork::dispatch);
    ASSERT_TRUE(ordered.ok()) << ordered.error().message;
    std::vector<std::byte> back(64 * KiB);
    auto d = rt.engine().download(consumer, a->handle(), 0, back);
    ASSERT_FALSE(d.ok()) << "the bytes the failed kernel left were downloaded as a success";
    EXPECT_NE(d.error().message.find("kernel failed"), std::string::npos) << d.error().message;
  }
}

// Issue 24 item 5: a kernel's callable that calls ferry is refused with
// invalid_argument naming the rule, never a self-deadlock on the backend's lock.
TEST_P(RuntimeTest, AKernelThatCallsFerryIsRefusedNotDeadlocked) {
  Runtime& rt = *rt_;
  Result<Allocation> a = rt.allocate(64 * KiB, 0);
  ASSERT_TRUE(a.ok()) << a.error().message;
  const DeviceHandle other = *rt.pool().allocate(4 * KiB, 0);
  std::vector<Error> refusals;
  std::vector<std::string> calls;
  const auto note = [&](const char* call, const Result<void>& r) {
    calls.emplace_back(call);
    refusals.push_back(r.ok() ? Error{} : r.error());
  };
  const Operand ops[] = {{a->handle(), Access::read}};
  auto t = enqueue_user(rt.pool(), 0, ops, [&](const KernelLaunch&) -> Result<void> {
    EXPECT_TRUE(inside_user_kernel());
    note("free", rt.pool().free(other));
    auto h = rt.pool().allocate(4 * KiB, 1);
    note("allocate", h.ok() ? Result<void>() : Result<void>(h.error()));
    note("trim", rt.pool().trim());
    note("synchronize", rt.synchronize());
    note("backend synchronize", rt.backend().synchronize());
    note("backend wait", rt.backend().wait({1, 1}, std::chrono::seconds(1)));
    note("flush", rt.backend().flush(1));
    auto e = rt.backend().enqueue(1, Op{NopOp{}});
    note("enqueue", e.ok() ? Result<void>() : Result<void>(e.error()));
    return {};
  });
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_TRUE(rt.synchronize().ok());
  EXPECT_FALSE(inside_user_kernel());
  ASSERT_EQ(refusals.size(), 8u);
  for (std::size_t i = 0; i < refusals.size(); ++i) {
    EXPECT_EQ(refusals[i].code, ErrorCode::invalid_argument) << calls[i];
    EXPECT_NE(refusals[i].message.find("inside a user kernel"), std::string::npos) << calls[i];
  }
  EXPECT_TRUE(rt.pool().free(other).ok()) << "the refused free freed nothing";
}

TEST_P(RuntimeTest, UploadsFromTheArenaThroughTheEngine) {
  Runtime& rt = *rt_;
  const std::uint64_t n = 300 * KiB + 17;
  const std::vector<std::byte> bytes = pattern(7, n);
  Result<HostBlock> block = rt.arena().allocate(n);
  ASSERT_TRUE(block.ok()) << block.error().message;
  std::memcpy(block->data, bytes.data(), n);
  Result<Allocation> dst = rt.allocate(n, 1);
  ASSERT_TRUE(dst.ok()) << dst.error().message;
  TransferPlan plan;
  plan.add(*block, dst->handle());
  Result<TransferReceipt> done = rt.engine().upload(1, plan);
  ASSERT_TRUE(done.ok()) << done.error().message;
  EXPECT_TRUE(done->verified);
  ASSERT_TRUE(rt.arena().free(*block).ok());
  auto got = read_back(rt.pool(), dst->handle(), 1);
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ(*got, bytes);
}

// Two blocks of the program's, one freed, around a verified upload: the engine's
// own scratch (its start-up probe, its canaries) shows as internal, not as the
// program's allocs and frees.
TEST_P(RuntimeTest, CountsFerrysOwnBuffersApartFromTheProgramsBlocks) {
  Runtime& rt = *rt_;
  const PoolStats before = pool().stats();
  EXPECT_EQ(before.allocs, 0u);
  EXPECT_EQ(before.frees, 0u);
  // The engine's start-up probe of batched copies ran on a scratch block of its own.
  if (rt.backend().info().batched_copy) {
    EXPECT_GE(before.internal_allocs, 1u);
  }
  const std::uint64_t n = 64 * KiB;
  const std::vector<std::byte> bytes = pattern(5, n);
  Result<HostBlock> block = rt.arena().allocate(n);
  ASSERT_TRUE(block.ok()) << block.error().message;
  std::memcpy(block->data, bytes.data(), n);
  Result<Allocation> a = rt.allocate(n, 1);
  Result<Allocation> b = rt.allocate(n, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(rt.engine().upload(1, TransferPlan().add(*block, a->handle())).ok());
  ASSERT_TRUE(rt.arena().free(*block).ok());
  { const Allocation freed = std::move(a).value(); }
  ASSERT_TRUE(rt.synchronize().ok());
  const PoolStats s = pool().stats();
  EXPECT_EQ(s.allocs, before.allocs + 2);
  EXPECT_EQ(s.frees, before.frees + 1);
  EXPECT_EQ(s.internal_allocs, s.internal_frees);

  Result<DeviceHandle> own = pool().allocate_internal(4 * KiB, 0);
  ASSERT_TRUE(own.ok()) << own.error().message;
  EXPECT_EQ(pool().stats().internal_allocs, s.internal_allocs + 1);
  EXPECT_EQ(pool().stats().allocated_bytes, s.allocated_bytes + 4 * KiB);
  ASSERT_TRUE(pool().free(*own).ok());
  const PoolStats after = pool().stats();
  EXPECT_EQ(after.internal_frees, s.internal_frees + 1);
  EXPECT_EQ(after.allocs, s.allocs);
  EXPECT_EQ(after.frees, s.frees);
}

TEST_P(RuntimeTest, CacheOptionsBuildACacheOnTheEngine) {
  const std::vector<std::byte> weights = pattern(3, 96 * KiB);  // outlives the cache
  RuntimeOptions o = options_on(GetParam());
  o.cache = CacheOptions{};
  o.cache->slots = 2;
  FERRY_MAKE_RUNTIME(rt, o, GetParam());
  ASSERT_NE(rt->cache(), nullptr);
  EXPECT_EQ(rt->cache()->options().slots, 2u);
  ASSERT_TRUE(rt->cache()->define(5, {std::span<const std::byte>(weights)}).ok());
  Result<CacheRef> ref = rt->cache()->acquire(5, 0);
  ASSERT_TRUE(ref.ok()) << ref.error().message;
  auto got = read_back(rt->pool(), ref->slot, 0);
  ASSERT_TRUE(got.ok()) << got.error().message;
  got->resize(weights.size());
  EXPECT_EQ(*got, weights);
  ASSERT_TRUE(rt->cache()->release(5).ok());
  EXPECT_TRUE(rt->status().ok());
}

// The destructor synchronizes before the pool and arena go: work still queued
// (on a held stream, so surely not run yet) must neither hang teardown nor touch
// freed memory (ASan would say so).
TEST_P(RuntimeTest, DestroyingWithWorkInFlightIsSafe) {
  RuntimeOptions o = options_on(GetParam());
  o.engine.policy = IntegrityPolicy::off;  // upload() returns once enqueued
  FERRY_MAKE_RUNTIME(rt, o, GetParam());
  constexpr StreamId kHeld = 2;
  rt->backend().set_hold(kHeld, true);
  Ticket last = 0;
  {
    Result<Allocation> a = rt->allocate(1 * MiB, kHeld);
    ASSERT_TRUE(a.ok()) << a.error().message;
    Result<Ticket> fill = enqueue_fill(rt->pool(), kHeld, a->handle(), 9);
    ASSERT_TRUE(fill.ok()) << fill.error().message;

    Result<HostBlock> block = rt->arena().allocate(256 * KiB);
    ASSERT_TRUE(block.ok()) << block.error().message;
    TransferPlan plan;
    plan.add(*block, a->handle());
    Result<TransferReceipt> up = rt->engine().upload(kHeld, plan);
    ASSERT_TRUE(up.ok()) << up.error().message;
    last = up->done.ticket;
    ASSERT_TRUE(rt->arena().free(*block).ok());  // pending: the copy still reads it
  }  // the Allocation's free is stream-ordered: the block stays pending too
  EXPECT_FALSE(rt->order().is_complete({kHeld, last}));
  EXPECT_GT(rt->pool().stats().pending_free_bytes, 0u);
  rt.reset();
}

TEST_P(RuntimeTest, SynchronizeWaitsForHeldWork) {
  constexpr StreamId kHeld = 3;
  rt_->backend().set_hold(kHeld, true);
  Result<Allocation> a = rt_->allocate(4 * KiB, kHeld);
  ASSERT_TRUE(a.ok());
  Result<Ticket> t = enqueue_fill(pool(), kHeld, a->handle(), 2);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(rt_->order().is_complete({kHeld, *t}));
  ASSERT_TRUE(rt_->synchronize().ok());
  EXPECT_TRUE(rt_->order().is_complete({kHeld, *t}));
}

// --- Runtime: refusals, as values -----------------------------------------------

Error create_error(RuntimeOptions o) {
  Result<std::unique_ptr<Runtime>> r = Runtime::create(std::move(o));
  EXPECT_FALSE(r.ok());
  return r.ok() ? Error{ErrorCode::backend_error, "created"} : std::move(r).error();
}

// --- the adaptor slots ------------------------------------------------------------

// A backend adaptor that counts the operations enqueued through it.
class CountingBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  Result<Ticket> enqueue(StreamId stream, Op op) override {
    ++enqueued;
    return ForwardingBackend::enqueue(stream, std::move(op));
  }
  std::uint64_t enqueued = 0;
};

TEST(RuntimeSlots, TheBackendAdaptorIsWhatTheStackSitsOn) {
  RuntimeOptions o = options_on("sim");
  CountingBackend* counting = nullptr;
  Backend* made_backend = nullptr;
  o.backend_adaptor = [&](Backend& made) -> Result<std::unique_ptr<Backend>> {
    made_backend = &made;
    auto adaptor = std::make_unique<CountingBackend>(made);
    counting = adaptor.get();
    return std::unique_ptr<Backend>(std::move(adaptor));
  };
  FERRY_MAKE_RUNTIME(rt, o, "sim");
  ASSERT_NE(counting, nullptr);
  EXPECT_EQ(&rt->backend(), counting);
  EXPECT_EQ(&rt->order().backend(), counting);
  EXPECT_EQ(&rt->backend().innermost(), made_backend);
  EXPECT_FALSE(rt->options().backend_adaptor);  // called once, then dropped
  const std::uint64_t before = counting->enqueued;
  Result<DeviceHandle> h = rt->pool().allocate(64 * KiB, 0);
  ASSERT_TRUE(h.ok()) << h.error().message;
  ASSERT_TRUE(enqueue_fill(rt->pool(), 0, *h, 7).ok());
  EXPECT_GT(counting->enqueued, before);
  ASSERT_TRUE(rt->pool().free(*h).ok());
  EXPECT_TRUE(rt->synchronize().ok());
}

TEST(RuntimeSlots, AFailingBackendAdaptorFailsCreateNamingIt) {
  RuntimeOptions o = options_on("sim");
  o.backend_adaptor = [](Backend&) -> Result<std::unique_ptr<Backend>> {
    return make_error(ErrorCode::unsupported, "no meter here");
  };
  const Error e = create_error(o);
  EXPECT_EQ(e.code, ErrorCode::unsupported);
  EXPECT_EQ(e.message, "backend adaptor: no meter here");
}

// A pool adaptor that counts allocations and forwards everything to its upstream.
class CountingCalls final : public DirectPoolCalls {
 public:
  explicit CountingCalls(PoolCalls& up) : DirectPoolCalls(up.pool(), up.engine()), up_(up) {}
  Result<DeviceHandle> allocate(std::uint64_t bytes, StreamId stream, std::string_view tag) override {
    ++allocations;
    return up_.allocate(bytes, stream, tag);
  }
  std::uint64_t allocations = 0;

 private:
  PoolCalls& up_;
};

TEST(RuntimeSlots, CallsGoThroughThePoolAdaptorWhileItIsSet) {
  FERRY_MAKE_RUNTIME(rt, options_on("sim"), "sim");
  // calls() is the graph capture's front (graph.hpp), the same object throughout:
  // it forwards to whatever sits in the slot when each call runs.
  const std::shared_ptr<PoolCalls> held = rt->calls();
  auto counting = std::make_shared<CountingCalls>(rt->direct_calls());
  EXPECT_EQ(rt->set_pool_adaptor(counting), nullptr);
  EXPECT_EQ(rt->calls(), held);
  Result<DeviceHandle> h = held->allocate(64 * KiB, 0);
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(counting->allocations, 1u);
  EXPECT_EQ(rt->set_pool_adaptor(nullptr), counting);
  ASSERT_TRUE(held->free(*h).ok());
  EXPECT_EQ(counting->allocations, 1u);
  EXPECT_TRUE(rt->calls()->synchronize().ok());
}

TEST(RuntimeCreate, DefaultsMakeASimRuntime) {
  Result<std::unique_ptr<Runtime>> r = Runtime::create({});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)->backend().info().backend, BackendKind::sim);
  EXPECT_TRUE((*r)->status().ok());
  EXPECT_TRUE((*r)->synchronize().ok());
}

// What code above the backends asks instead of the kind: a made backend's info()
// says what capabilities_of its kind says before one exists.
TEST_P(RuntimeTest, TheBackendsCapabilitiesAreThoseOfItsKind) {
  const DeviceInfo& info = rt_->backend().info();
  const DeviceInfo can = capabilities_of(info.backend);
  EXPECT_EQ(info.modeled_time, can.modeled_time);
  EXPECT_EQ(info.host_visible, can.host_visible);
  EXPECT_EQ(info.race_checking, can.race_checking);
  EXPECT_EQ(info.fault_injection, can.fault_injection);
  EXPECT_EQ(info.lazy_host_ranges, can.lazy_host_ranges);
  EXPECT_EQ(info.profiled, can.profiled);
  // A backend that injects faults is refused none, and one that does not is refused any.
  BackendSpec spec = options_on(GetParam()).backend;
  spec.faults.batch_broken = true;
  EXPECT_EQ(check_spec(spec).ok(), can.fault_injection);
}

TEST(RuntimeCreate, AnUnknownProfileIsAnErrorValue) {
  RuntimeOptions o;
  o.backend.profile = "no-such-gpu";
  const Error e = create_error(o);
  EXPECT_EQ(e.code, ErrorCode::invalid_argument);
  EXPECT_NE(e.message.find("no-such-gpu"), std::string::npos) << e.message;
}

TEST(RuntimeCreate, FaultsAskedOfARealDeviceAreRefusedBeforeTouchingIt) {
  RuntimeOptions o;
  o.backend.kind = BackendKind::cuda;
  o.backend.faults.batch_broken = true;
  const Error e = create_error(o);
  EXPECT_EQ(e.code, ErrorCode::invalid_argument);
  EXPECT_NE(e.message.find("batch-broken"), std::string::npos) << e.message;
}

TEST(RuntimeCreate, CudaWithoutADeviceIsAnErrorValue) {
  if (testing::backend_skip_reason("cuda").empty()) GTEST_SKIP() << "this machine has a cuda device";
  RuntimeOptions o;
  o.backend.kind = BackendKind::cuda;
  const Error e = create_error(o);
  EXPECT_EQ(e.code, ErrorCode::unsupported) << e.message;
}

TEST(RuntimeCreate, ANonPositiveWaitTimeoutIsRefused) {
  RuntimeOptions o;
  o.wait_timeout = std::chrono::nanoseconds::zero();
  const Error e = create_error(o);
  EXPECT_EQ(e.code, ErrorCode::invalid_argument);
  EXPECT_NE(e.message.find("wait_timeout"), std::string::npos) << e.message;
}

TEST(RuntimeCreate, AComponentsFailureNamesTheComponent) {
  RuntimeOptions pool = options_on("sim");
  pool.pool.capacity = 1;  // below one granule
  Error e = create_error(pool);
  EXPECT_EQ(e.code, ErrorCode::invalid_argument);
  EXPECT_EQ(e.message.rfind("device pool: ", 0), 0u) << e.message;

  RuntimeOptions engine = options_on("sim");
  engine.engine.verify_stream = kMaxStreams;
  e = create_error(engine);
  EXPECT_EQ(e.code, ErrorCode::invalid_argument);
  EXPECT_EQ(e.message.rfind("transfer engine: ", 0), 0u) << e.message;

  RuntimeOptions cache = options_on("sim");
  cache.cache = CacheOptions{};
  cache.cache->slots = 0;
  e = create_error(cache);
  EXPECT_EQ(e.message.rfind("offload cache: ", 0), 0u) << e.message;
}

// A device fault is sticky: status() reports it, first from the backend's
// counters, then as the error synchronize() answered.
TEST(RuntimeStatus, ReportsAStickyDeviceFault) {
  Result<std::unique_ptr<Runtime>> made = Runtime::create(options_on("sim"));
  ASSERT_TRUE(made.ok()) << made.error().message;
  Runtime& rt = **made;
  Backend& b = rt.backend();
  const std::uint64_t g = b.info().granularity;
  Result<std::uint64_t> base = b.reserve_address(2 * g);
  ASSERT_TRUE(base.ok());
  ASSERT_TRUE(b.map(*base, 2 * g).ok());
  constexpr StreamId kStream = 7;
  Result<Ticket> t = rt.order().submit(kStream, [&](Ticket) -> Result<Op> {
    return Op{FillOp{{*base, 2 * g}, 1}};
  });
  ASSERT_TRUE(t.ok()) << t.error().message;
  // Unmapped under the queued fill: the I2 violation the pool never commits.
  ASSERT_TRUE(b.unmap(*base + g, g).ok());
  EXPECT_TRUE(rt.status().ok());  // nothing has run yet

  EXPECT_FALSE(b.synchronize().ok());  // behind the Runtime's back
  Result<void> s = rt.status();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::backend_error);
  EXPECT_NE(s.error().message.find("unmapped"), std::string::npos) << s.error().message;

  Result<void> sync = rt.synchronize();
  ASSERT_FALSE(sync.ok());
  EXPECT_EQ(sync.error().code, ErrorCode::backend_error);
  s = rt.status();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message, sync.error().message);
  EXPECT_NE(s.error().message.find(text::point({kStream, *t})), std::string::npos) << s.error().message;
  (void)b.release_address(*base, 2 * g);  // may fail now; the sim goes with the Runtime
}

// --- Allocation -------------------------------------------------------------------

using AllocationTest = RuntimeTest;

TEST_P(AllocationTest, OwnsItsBlockAndFreesItOnDestruction) {
  const PoolStats before = pool().stats();
  DeviceHandle h;
  {
    Result<Allocation> a = rt_->allocate(4 * KiB + 1, 2);
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_TRUE(static_cast<bool>(*a));
    EXPECT_EQ(a->bytes(), 4 * KiB + 1);
    EXPECT_EQ(a->stream(), 2u);
    EXPECT_EQ(a->pool(), &pool());
    h = a->handle();
    Result<DeviceSpan> span = pool().resolve(h);
    ASSERT_TRUE(span.ok());
    EXPECT_EQ(span->bytes, 4 * KiB + 1);
    EXPECT_EQ(pool().stats().allocs, before.allocs + 1);
    EXPECT_EQ(pool().stats().frees, before.frees);
  }
  EXPECT_EQ(pool().stats().frees, before.frees + 1);
  EXPECT_EQ(pool().resolve(h).error().code, ErrorCode::stale_handle);
  EXPECT_EQ(pool().stats().allocated_bytes, before.allocated_bytes);
}

TEST_P(AllocationTest, AMovedFromAllocationFreesNothing) {
  const std::uint64_t frees = pool().stats().frees;
  Result<Allocation> made = rt_->allocate(8 * KiB, 0);
  ASSERT_TRUE(made.ok());
  Allocation a = std::move(made).value();
  const DeviceHandle h = a.handle();

  Allocation b = std::move(a);
  EXPECT_FALSE(static_cast<bool>(a));  // NOLINT(bugprone-use-after-move): the point of the test
  EXPECT_EQ(a.handle(), DeviceHandle{});
  EXPECT_EQ(a.bytes(), 0u);
  EXPECT_EQ(b.handle(), h);
  EXPECT_EQ(b.bytes(), 8 * KiB);
  { Allocation gone = std::move(a); }  // NOLINT: destroying an empty one frees nothing
  EXPECT_EQ(pool().stats().frees, frees);
  EXPECT_TRUE(pool().resolve(h).ok());

  // Move-assignment frees what the target held, then takes the source's block.
  Result<Allocation> other = rt_->allocate(8 * KiB, 0);
  ASSERT_TRUE(other.ok());
  Allocation c = std::move(other).value();
  const DeviceHandle replaced = c.handle();
  c = std::move(b);
  EXPECT_EQ(pool().stats().frees, frees + 1);
  EXPECT_EQ(pool().resolve(replaced).error().code, ErrorCode::stale_handle);
  EXPECT_EQ(c.handle(), h);
  EXPECT_TRUE(pool().resolve(h).ok());
  EXPECT_FALSE(static_cast<bool>(b));  // NOLINT(bugprone-use-after-move)
}

TEST_P(AllocationTest, MovesThroughAContainer) {
  const std::uint64_t frees = pool().stats().frees;
  std::vector<Allocation> all;
  for (int i = 0; i < 17; ++i) {  // the vector grows and moves them several times
    Result<Allocation> a = rt_->allocate(1 * KiB, 0);
    ASSERT_TRUE(a.ok());
    all.push_back(std::move(a).value());
  }
  EXPECT_EQ(pool().stats().frees, frees);
  for (const Allocation& a : all) EXPECT_TRUE(pool().resolve(a.handle()).ok());
  all.clear();
  EXPECT_EQ(pool().stats().frees, frees + 17);
}

TEST_P(AllocationTest, ALaterAllocationReusesTheFreedBlock) {
  constexpr StreamId kHeld = 5;  // held: the fill surely still uses the block when it is freed
  rt_->backend().set_hold(kHeld, true);
  Result<Allocation> first = rt_->allocate(64 * KiB, kHeld);
  ASSERT_TRUE(first.ok());
  const DeviceHandle old = first->handle();
  const std::uint64_t addr = pool().resolve(old)->addr;
  ASSERT_TRUE(enqueue_fill(pool(), kHeld, old, 5).ok());
  ASSERT_TRUE(first->reset().ok());
  const std::uint64_t reuses = pool().stats().same_stream_reuses;

  // Later work on the same stream may take it at once: the FIFO orders it (I3).
  Result<Allocation> second = rt_->allocate(64 * KiB, kHeld);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(pool().stats().same_stream_reuses, reuses + 1);
  // The old slot's record still holds the pending block, so the slot may differ; the old handle is stale.
  EXPECT_EQ(pool().resolve(old).error().code, ErrorCode::stale_handle);
  EXPECT_EQ(pool().resolve(second->handle())->addr, addr);
  ASSERT_TRUE(enqueue_fill(pool(), kHeld, second->handle(), 6).ok());
  auto got = read_back(pool(), second->handle(), kHeld);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, pattern(6, 64 * KiB));
}

TEST_P(AllocationTest, ResetTwiceFreesOnce) {
  const std::uint64_t frees = pool().stats().frees;
  Result<Allocation> a = rt_->allocate(2 * KiB, 1);
  ASSERT_TRUE(a.ok());
  const DeviceHandle h = a->handle();
  ASSERT_TRUE(a->reset().ok());
  EXPECT_FALSE(static_cast<bool>(*a));
  EXPECT_EQ(pool().stats().frees, frees + 1);
  EXPECT_EQ(pool().resolve(h).error().code, ErrorCode::stale_handle);
  EXPECT_TRUE(a->reset().ok());  // empty: nothing to do
  EXPECT_EQ(pool().stats().frees, frees + 1);
}

TEST_P(AllocationTest, ResetReportsAHandleFreedBehindItsBack) {
  Result<Allocation> a = rt_->allocate(2 * KiB, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(pool().free(a->handle()).ok());
  const std::uint64_t frees = pool().stats().frees;
  Result<void> r = a->reset();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::stale_handle);
  EXPECT_FALSE(static_cast<bool>(*a));
  EXPECT_EQ(pool().stats().frees, frees);
}

TEST_P(AllocationTest, ReleaseGivesUpOwnership) {
  const std::uint64_t frees = pool().stats().frees;
  DeviceHandle h;
  {
    Result<Allocation> a = rt_->allocate(2 * KiB, 0);
    ASSERT_TRUE(a.ok());
    const DeviceHandle owned = a->handle();
    h = a->release();
    EXPECT_EQ(h, owned);
    EXPECT_FALSE(static_cast<bool>(*a));
    EXPECT_EQ(a->handle(), DeviceHandle{});
    EXPECT_EQ(a->release(), DeviceHandle{});  // empty: the null handle
  }
  EXPECT_EQ(pool().stats().frees, frees);
  EXPECT_TRUE(pool().resolve(h).ok());
  ASSERT_TRUE(pool().free(h).ok());
}

TEST_P(AllocationTest, BadRequestsAreErrorValues) {
  Result<Allocation> zero = rt_->allocate(0, 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().code, ErrorCode::invalid_argument);
  Result<Allocation> huge = rt_->allocate(pool().capacity() + 1, 0);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().code, ErrorCode::out_of_memory);
  EXPECT_TRUE(Allocation{}.reset().ok());
}

// --- DevicePool: peaks and the stats they come from ----------------------------------

using DevicePoolStats = RuntimeTest;

TEST_P(DevicePoolStats, ResetPeakStatsLowersEveryPeakToItsCurrentValue) {
  Result<Allocation> big = rt_->allocate(8 * MiB, 0);
  Result<Allocation> small = rt_->allocate(1 * MiB, 0);
  ASSERT_TRUE(big.ok() && small.ok());
  ASSERT_TRUE(big->reset().ok());
  ASSERT_TRUE(pool().trim().ok());
  PoolStats s = pool().stats();
  ASSERT_GT(s.peak_allocated_bytes, s.allocated_bytes);
  ASSERT_GT(s.peak_requested_bytes, s.requested_bytes);

  pool().reset_peak_stats();
  const PoolStats r = pool().stats();
  EXPECT_EQ(r.peak_allocated_bytes, r.allocated_bytes);
  EXPECT_EQ(r.peak_requested_bytes, r.requested_bytes);
  EXPECT_EQ(r.peak_reserved_bytes, r.reserved_bytes);
  EXPECT_EQ(r.peak_active_bytes, r.active_bytes);
  EXPECT_EQ(r.allocated_bytes, s.allocated_bytes);
  EXPECT_EQ(r.allocs, s.allocs);  // counters keep counting
  EXPECT_EQ(r.frees, s.frees);

  // Peaks follow new growth from the reset value.
  Result<Allocation> more = rt_->allocate(2 * MiB, 0);
  ASSERT_TRUE(more.ok());
  ASSERT_TRUE(more->reset().ok());
  s = pool().stats();
  EXPECT_EQ(s.peak_requested_bytes, r.requested_bytes + 2 * MiB);
  EXPECT_LT(s.peak_allocated_bytes, 8 * MiB + 1 * MiB);
  std::string why;
  EXPECT_TRUE(pool().validate(&why)) << why;
}

// active == allocated + pending free, also after a reclaim retired pending frees.
TEST_P(DevicePoolStats, ActiveBytesFollowRetiredFrees) {
  Result<Allocation> a = rt_->allocate(1 * MiB, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(enqueue_fill(pool(), 0, a->handle(), 1).ok());
  ASSERT_TRUE(a->reset().ok());
  PoolStats s = pool().stats();
  EXPECT_EQ(s.active_bytes, s.allocated_bytes + s.pending_free_bytes);
  ASSERT_TRUE(rt_->synchronize().ok());
  ASSERT_TRUE(pool().trim().ok());
  s = pool().stats();
  EXPECT_EQ(s.pending_free_bytes, 0u);
  EXPECT_EQ(s.active_bytes, s.allocated_bytes);
}

// --- memory_summary -------------------------------------------------------------------

// The text after `label` on the row that starts with it, runs of spaces made one.
std::string row(const std::string& summary, const std::string& label) {
  std::istringstream in(summary);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(" " + label + " ", 0) != 0) continue;
    std::istringstream words(line.substr(label.size() + 1));
    std::string out;
    for (std::string w; words >> w;) out += (out.empty() ? "" : " ") + w;
    return out;
  }
  ADD_FAILURE() << "no row '" << label << "' in\n" << summary;
  return {};
}

std::string two(std::uint64_t current, std::uint64_t peak) {
  return text::human_bytes(current, 2) + " " + text::human_bytes(peak, 2);
}

void expect_summary_matches(const DevicePool& pool) {
  const std::string summary = memory_summary(pool);
  const PoolStats s = pool.stats();
  EXPECT_NE(summary.find("capacity " + text::human_bytes(pool.capacity(), 2)), std::string::npos)
      << summary;
  EXPECT_EQ(row(summary, "Allocated"), two(s.allocated_bytes, s.peak_allocated_bytes));
  EXPECT_EQ(row(summary, "Requested"), two(s.requested_bytes, s.peak_requested_bytes));
  EXPECT_EQ(row(summary, "Reserved"), two(s.reserved_bytes, s.peak_reserved_bytes));
  EXPECT_EQ(row(summary, "Active"), two(s.active_bytes, s.peak_active_bytes));
  EXPECT_EQ(row(summary, "Pending free"), text::human_bytes(s.pending_free_bytes, 2) + " -");
  EXPECT_EQ(row(summary, "Cached"), text::human_bytes(s.cached_bytes, 2) + " -");
  EXPECT_EQ(row(summary, "Largest free extent"), text::human_bytes(pool.largest_free_extent(), 2) + " -");
  EXPECT_EQ(row(summary, "Allocs"), std::to_string(s.allocs));
  EXPECT_EQ(row(summary, "Frees"), std::to_string(s.frees));
  EXPECT_EQ(row(summary, "Internal allocs"), std::to_string(s.internal_allocs));
  EXPECT_EQ(row(summary, "Internal frees"), std::to_string(s.internal_frees));
  EXPECT_EQ(row(summary, "OOMs"), std::to_string(s.ooms));
  EXPECT_EQ(row(summary, "Reclaims"), std::to_string(s.reclaims));
  EXPECT_EQ(row(summary, "OOMs survived"), std::to_string(s.ooms_survived));

  // The buckets device_pool.hpp states, counted here from the snapshot.
  const std::vector<std::pair<std::string, std::uint64_t>> classes = {
      {"<= 1 KiB", KiB}, {"<= 64 KiB", 64 * KiB}, {"<= 1 MiB", MiB}, {"<= 16 MiB", 16 * MiB},
      {"> 16 MiB", UINT64_MAX}};
  std::vector<std::uint64_t> live(classes.size()), pending(classes.size());
  std::uint64_t live_all = 0, pending_all = 0;
  for (const BlockInfo& b : pool.snapshot()) {
    std::size_t c = 0;
    while (b.bytes > classes[c].second) ++c;
    const bool is_live = b.state == BlockInfo::State::live;
    ++(is_live ? live : pending)[c];
    ++(is_live ? live_all : pending_all);
  }
  for (std::size_t c = 0; c < classes.size(); ++c) {
    EXPECT_EQ(row(summary, classes[c].first), std::to_string(live[c]) + " " + std::to_string(pending[c]))
        << classes[c].first;
  }
  EXPECT_EQ(row(summary, "All"), std::to_string(live_all) + " " + std::to_string(pending_all));
}

using MemorySummary = RuntimeTest;

TEST_P(MemorySummary, AnEmptyPoolShowsZeros) {
  DevicePool empty(rt_->order());
  ASSERT_TRUE(empty.status().ok());
  const std::string summary = memory_summary(empty);
  EXPECT_EQ(row(summary, "Allocated"), "0 B 0 B");
  EXPECT_EQ(row(summary, "Allocs"), "0");
  EXPECT_EQ(row(summary, "All"), "0 0");
  EXPECT_GT(empty.largest_free_extent(), 0u);
  expect_summary_matches(empty);
}

TEST_P(MemorySummary, ShowsTheFiguresAndEverySizeClass) {
  std::vector<Allocation> live;
  for (std::uint64_t bytes : {std::uint64_t{512}, 1 * KiB, 32 * KiB, 40 * KiB, 512 * KiB, 4 * MiB, 20 * MiB}) {
    Result<Allocation> a = rt_->allocate(bytes, 0);
    ASSERT_TRUE(a.ok()) << a.error().message;
    live.push_back(std::move(a).value());
  }
  // One block freed with its fill still queued on a held stream: pending free.
  constexpr StreamId kHeld = 4;
  rt_->backend().set_hold(kHeld, true);
  Result<Allocation> busy = rt_->allocate(48 * KiB, kHeld);
  ASSERT_TRUE(busy.ok());
  ASSERT_TRUE(enqueue_fill(pool(), kHeld, busy->handle(), 1).ok());
  ASSERT_TRUE(busy->reset().ok());
  live.pop_back();  // and a large one freed at once
  pool().reset_peak_stats();
  Result<Allocation> peak = rt_->allocate(2 * MiB, 0);
  ASSERT_TRUE(peak.ok());
  ASSERT_TRUE(peak->reset().ok());

  const PoolStats s = pool().stats();
  ASSERT_GT(s.pending_free_bytes, 0u);
  ASSERT_GT(s.peak_allocated_bytes, s.allocated_bytes);
  expect_summary_matches(pool());
  ASSERT_TRUE(rt_->synchronize().ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, RuntimeTest, FERRY_BACKENDS);
INSTANTIATE_TEST_SUITE_P(Backends, AllocationTest, FERRY_BACKENDS);
INSTANTIATE_TEST_SUITE_P(Backends, DevicePoolStats, FERRY_BACKENDS);
INSTANTIATE_TEST_SUITE_P(Backends, MemorySummary, FERRY_BACKENDS);

}  // namespace
}  // namespace ferry
