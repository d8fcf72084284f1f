// Mutation: each cross-stream wait the transfer engine, the cache, the replay
// runner and the pool insert is needed, and the race checker proves it. With one
// of them dropped (a test-only switch, src/core/testing_hooks.hpp) a race is
// reported; with all of them in place, none.
#include <gtest/gtest.h>

#include <vector>

#include "backend_fixture.hpp"
#include "core/testing_hooks.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/offload_cache.hpp"
#include "ferry/replay.hpp"
#include "ferry/transfer_engine.hpp"
#include "ferry/user_op.hpp"
#include "program_kernels.hpp"

namespace ferry {
namespace {

using testing_hooks::WaitSite;

constexpr std::uint64_t KiB = 1024, MiB = 1024 * KiB;

struct Dropping {  // drops one site's waits for a scope
  explicit Dropping(WaitSite site) { testing_hooks::drop_waits(site); }
  ~Dropping() { testing_hooks::drop_waits(WaitSite::none); }
};

struct Rig {
  Rig(IntegrityPolicy policy) {
    BackendSpec spec = testing::backend_spec("sim");
    spec.race_check = true;
    backend = std::move(make_backend(spec)).value();
    order = std::make_unique<StreamOrder>(*backend);
    pool = std::make_unique<DevicePool>(*order);
    arena = std::make_unique<HostArena>(*order);
    EngineOptions eo;
    eo.policy = policy;
    engine = std::make_unique<TransferEngine>(*pool, *arena, eo);
  }
  ~Rig() {
    (void)backend->synchronize();
    engine.reset();
    arena.reset();
    pool.reset();
  }
  std::uint64_t races() const { return backend->race_log()->count; }

  std::unique_ptr<Backend> backend;
  std::unique_ptr<StreamOrder> order;
  std::unique_ptr<DevicePool> pool;
  std::unique_ptr<HostArena> arena;
  std::unique_ptr<TransferEngine> engine;
};

// A verified upload on stream 1: the verify stream hashes the copy it waits for.
std::uint64_t races_of_a_verified_upload(bool drop) {
  Rig rig(IntegrityPolicy::verify);
  auto h = rig.pool->allocate(1 * MiB, 1);
  std::vector<std::byte> bytes(1 * MiB, std::byte{9});
  std::optional<Dropping> d;
  if (drop) d.emplace(WaitSite::engine_verify);
  (void)rig.engine->upload(1, TransferPlan().add(bytes, *h));  // may fail: the hash raced the copy
  (void)rig.backend->synchronize();
  return rig.races();
}

TEST(RaceMutation, TheEnginesVerifyWaitIsNeeded) {
  EXPECT_EQ(races_of_a_verified_upload(false), 0u);
  EXPECT_GT(races_of_a_verified_upload(true), 0u);
}

// An entry fetched on the cache's upload stream (1), used on stream 0.
std::uint64_t races_of_a_cache_use(bool drop) {
  Rig rig(IntegrityPolicy::off);  // off: the upload is still in flight when acquire returns
  CacheOptions co;
  co.slots = 2;
  OffloadCache cache(*rig.engine, co);
  std::vector<std::byte> expert(256 * KiB, std::byte{4});
  EXPECT_TRUE(cache.define(1, {std::span<const std::byte>(expert)}).ok());
  auto out = rig.pool->allocate(256 * KiB, 0);
  std::optional<Dropping> d;
  if (drop) d.emplace(WaitSite::cache_fetch);
  auto ref = cache.acquire(1, 0);
  EXPECT_TRUE(ref.ok());
  const Operand ops[] = {{ref->slot, Access::read, 0, 256 * KiB}, {*out, Access::write}};
  EXPECT_TRUE(enqueue_user(*rig.pool, 0, ops, [](const KernelLaunch& l) { return testing::copy_operand(l, 1, 0); })
                  .ok());
  EXPECT_TRUE(cache.release(1).ok());
  (void)rig.backend->synchronize();
  return rig.races();
}

TEST(RaceMutation, TheCachesFetchWaitIsNeeded) {
  EXPECT_EQ(races_of_a_cache_use(false), 0u);
  EXPECT_GT(races_of_a_cache_use(true), 0u);
}

// A block freed on stream 0 with a fill still in flight, reused at once on
// stream 0 (same-stream reuse), then used on stream 1: make_ready orders stream 1.
struct Reuse {
  std::uint64_t races = 0;
  std::vector<Race> kept;
  DeviceHandle freed, reused;
};
Reuse races_of_a_reuse(bool drop) {
  Rig rig(IntegrityPolicy::verify);
  auto a = rig.pool->allocate(64 * KiB, 0);
  EXPECT_TRUE(rig.pool->set_tag(*a, "weights").ok());
  const std::uint64_t a_addr = rig.pool->resolve(*a)->addr;
  EXPECT_TRUE(enqueue_fill(*rig.pool, 0, *a, 1).ok());
  EXPECT_TRUE(rig.pool->free(*a).ok());
  auto b = rig.pool->allocate(64 * KiB, 0);  // a's memory, pending behind the fill
  EXPECT_EQ(rig.pool->resolve(*b)->addr, a_addr) << "not the same-stream reuse this test is about";
  EXPECT_TRUE(rig.pool->set_tag(*b, "activations").ok());
  std::optional<Dropping> d;
  if (drop) d.emplace(WaitSite::pool_reuse);
  EXPECT_TRUE(enqueue_fill(*rig.pool, 1, *b, 2).ok());
  (void)rig.backend->synchronize();
  return {rig.races(), rig.backend->race_log()->kept, *a, *b};
}

TEST(RaceMutation, ThePoolsReuseWaitIsNeeded) {
  EXPECT_EQ(races_of_a_reuse(false).races, 0u);
  EXPECT_GT(races_of_a_reuse(true).races, 0u);
}

// A block freed on stream 0 with a fill in flight, whose memory a block allocated
// on stream 1 gets at once: the allocation's event wait orders stream 1 after it.
std::uint64_t races_of_a_cross_stream_reuse(bool drop) {
  Rig rig(IntegrityPolicy::verify);
  rig.backend->set_hold(0, true);  // the old fill cannot have completed by the allocation
  auto a = rig.pool->allocate(64 * KiB, 0);
  const std::uint64_t a_addr = rig.pool->resolve(*a)->addr;
  EXPECT_TRUE(enqueue_fill(*rig.pool, 0, *a, 1).ok());
  EXPECT_TRUE(rig.pool->free(*a).ok());
  std::optional<Dropping> d;
  if (drop) d.emplace(WaitSite::pool_reuse);
  auto b = rig.pool->allocate(64 * KiB, 1);
  EXPECT_EQ(rig.pool->resolve(*b)->addr, a_addr) << "not the cross-stream reuse this test is about";
  EXPECT_TRUE(enqueue_fill(*rig.pool, 1, *b, 2).ok());
  rig.backend->set_hold(0, false);
  (void)rig.backend->synchronize();
  return rig.races();
}

TEST(RaceMutation, ThePoolsCrossStreamReuseWaitIsNeeded) {
  EXPECT_EQ(races_of_a_cross_stream_reuse(false), 0u);
  EXPECT_GT(races_of_a_cross_stream_reuse(true), 0u);
}

TEST(RaceMutation, AnAllocatorReuseRaceNamesBothAllocations) {
  const Reuse r = races_of_a_reuse(true);
  ASSERT_EQ(r.kept.size(), 1u);
  const Race& race = r.kept[0];
  EXPECT_TRUE(race.reuse);
  EXPECT_EQ(race.earlier.block.handle, r.freed);
  EXPECT_EQ(race.earlier.block.tag, "weights");
  EXPECT_EQ(race.later.block.handle, r.reused);
  EXPECT_EQ(race.later.block.tag, "activations");
}

std::uint64_t races_of_the_mixed_trace(bool drop) {
  ReplayOptions o;
  o.capacity = 128 * MiB;
  o.backend.race_check = true;
  std::optional<Dropping> d;
  if (drop) d.emplace(WaitSite::replay_runner);
  auto r = replay_trace_file(std::string(FERRY_TRACES_DIR) + "/mixed-random.jsonl", o);
  EXPECT_TRUE(r.ok());
  return r.ok() ? r->races : 0;
}

TEST(RaceMutation, TheReplayRunnersWaitsAreNeeded) {
  EXPECT_EQ(races_of_the_mixed_trace(false), 0u);
  EXPECT_GT(races_of_the_mixed_trace(true), 0u);
}

// An arena block uploaded from (the copy still in flight), freed, and handed out
// again: the program's write into it races the copy unless the lease keeps it.
std::uint64_t races_of_an_arena_reuse(bool drop, std::vector<Race>* kept) {
  Rig rig(IntegrityPolicy::off);  // off: upload() returns with the copy in flight
  auto h = rig.pool->allocate(256 * KiB, 1);
  auto block = rig.arena->allocate(256 * KiB);
  EXPECT_TRUE(block.ok());
  EXPECT_TRUE(rig.engine->upload(1, TransferPlan().add(*block, *h)).ok());
  std::optional<Dropping> d;
  if (drop) d.emplace(WaitSite::arena_lease);
  EXPECT_TRUE(rig.arena->free(*block).ok());
  auto again = rig.arena->allocate(256 * KiB);  // the same bytes only when the lease is dropped
  EXPECT_TRUE(again.ok());
  (void)rig.backend->synchronize();
  *kept = rig.backend->race_log()->kept;
  EXPECT_TRUE(rig.arena->free(*again).ok());
  return rig.races();
}

TEST(RaceMutation, TheArenasLeaseIsNeeded) {
  std::vector<Race> kept;
  EXPECT_EQ(races_of_an_arena_reuse(false, &kept), 0u);
  EXPECT_GT(races_of_an_arena_reuse(true, &kept), 0u);
  ASSERT_FALSE(kept.empty());
  EXPECT_EQ(kept[0].earlier.kind, "copy_to_device");
  EXPECT_EQ(kept[0].earlier.access, Access::read);
  EXPECT_EQ(kept[0].later.op.stream, kHostSide) << "the host's write into the upload source";
  EXPECT_EQ(kept[0].later.access, Access::write);
}

}  // namespace
}  // namespace ferry
