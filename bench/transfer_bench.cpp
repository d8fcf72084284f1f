// Host arena and transfer engine benchmarks (issue 3, item 12).
//
//   BM_ArenaAllocFree        host cost of one allocate + free (steady state, no pinning)
//   BM_ArenaMixedChurn       64 mixed-size blocks allocated then freed, per iteration
//   BM_ModeledUpload         copy throughput by policy on the sim h200 profile: counter
//                            modeled_GBps = bytes / virtual seconds (the device model),
//                            host_GBps = bytes / host seconds (the engine's own cost)
//   BM_ContentHash           real host-side content_hash throughput on this CPU
//   BM_ContentHashWordLoop   its word loop alone, portable and AVX-512, one thread
//   BM_VerifyOverhead        modeled upload time under verify / under off, as a ratio
//
// Run: build/release/bench/transfer_bench --benchmark_format=json
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "core/content_words.hpp"
#include "ferry/content.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/sim_backend.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"

namespace {

using namespace ferry;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

struct BenchRig {
  explicit BenchRig(IntegrityPolicy policy, const char* profile = "h200") {
    sim = make_sim_backend({*find_profile(profile), 1, {}});
    order = std::make_unique<StreamOrder>(*sim);
    pool = std::make_unique<DevicePool>(*order);
    ArenaOptions ao;
    ao.chunk_bytes = 64 * kMiB;
    ao.budget_bytes = 1024 * kMiB;
    arena = std::make_unique<HostArena>(*order, ao);
    EngineOptions eo;
    eo.policy = policy;
    engine = std::make_unique<TransferEngine>(*pool, *arena, eo);
  }
  ~BenchRig() {
    engine.reset();
    arena.reset();
    pool.reset();
    order.reset();
  }
  std::unique_ptr<SimBackend> sim;
  std::unique_ptr<StreamOrder> order;
  std::unique_ptr<DevicePool> pool;
  std::unique_ptr<HostArena> arena;
  std::unique_ptr<TransferEngine> engine;
};

void BM_ArenaAllocFree(benchmark::State& state) {
  BenchRig rig(IntegrityPolicy::off, "tiny");
  const auto bytes = static_cast<std::uint64_t>(state.range(0));
  // Warm: the chunk is pinned once, outside the timed loop.
  (void)rig.arena->free(*rig.arena->allocate(bytes));
  for (auto _ : state) {
    auto b = rig.arena->allocate(bytes);
    benchmark::DoNotOptimize(b->data);
    (void)rig.arena->free(*b);
  }
  state.counters["pinned_allocs"] = static_cast<double>(rig.arena->stats().pinned_allocs);
}
BENCHMARK(BM_ArenaAllocFree)->Arg(256)->Arg(64 << 10)->Arg(1 << 20)->Arg(24 << 20);

void BM_ArenaMixedChurn(benchmark::State& state) {
  BenchRig rig(IntegrityPolicy::off, "tiny");
  std::vector<std::uint64_t> sizes;
  std::uint64_t x = 12345;
  for (int i = 0; i < 64; ++i) {
    x = splitmix64(x);
    sizes.push_back(256 + x % (512 << 10));
  }
  std::vector<HostBlock> blocks(sizes.size());
  for (auto _ : state) {
    for (std::size_t i = 0; i < sizes.size(); ++i) blocks[i] = *rig.arena->allocate(sizes[i]);
    for (std::size_t i = 0; i < sizes.size(); i += 2) (void)rig.arena->free(blocks[i]);
    for (std::size_t i = 1; i < sizes.size(); i += 2) (void)rig.arena->free(blocks[i]);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(sizes.size()));
  state.counters["pinned_allocs"] = static_cast<double>(rig.arena->stats().pinned_allocs);
  state.counters["reserved_MiB"] = static_cast<double>(rig.arena->stats().reserved_bytes) / kMiB;
}
BENCHMARK(BM_ArenaMixedChurn);

// One upload of `ranges` ranges of `bytes` each, synchronized; returns virtual ns.
std::uint64_t upload_once(BenchRig& rig, const std::vector<HostBlock>& src,
                          const std::vector<DeviceHandle>& dst) {
  TransferPlan plan;
  for (std::size_t i = 0; i < src.size(); ++i) plan.add(src[i], dst[i]);
  const std::uint64_t t0 = rig.sim->now_ns();
  auto r = rig.engine->upload(0, plan);
  if (!r.ok()) return 0;
  (void)rig.sim->synchronize();
  return rig.sim->now_ns() - t0;
}

struct UploadSetup {
  std::vector<HostBlock> src;
  std::vector<DeviceHandle> dst;
};

UploadSetup setup(BenchRig& rig, int ranges, std::uint64_t bytes) {
  UploadSetup s;
  for (int i = 0; i < ranges; ++i) {
    auto b = rig.arena->allocate(bytes);
    fill_pattern(static_cast<std::uint64_t>(i), 0, b->span());
    s.src.push_back(*b);
    s.dst.push_back(*rig.pool->allocate(bytes, 0));
  }
  return s;
}

void BM_ModeledUpload(benchmark::State& state) {
  const auto policy = static_cast<IntegrityPolicy>(state.range(0));
  const int ranges = static_cast<int>(state.range(1));
  const auto bytes = static_cast<std::uint64_t>(state.range(2));
  BenchRig rig(policy);
  UploadSetup s = setup(rig, ranges, bytes);
  std::uint64_t virtual_ns = 0;
  for (auto _ : state) virtual_ns += upload_once(rig, s.src, s.dst);
  const double total = static_cast<double>(state.iterations()) * ranges * static_cast<double>(bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(total));  // host-side rate
  state.counters["modeled_GBps"] = virtual_ns ? total / static_cast<double>(virtual_ns) : 0;
  state.counters["mismatches"] = static_cast<double>(rig.engine->counters().mismatches);
  state.SetLabel(std::string(to_string(policy)));
}
BENCHMARK(BM_ModeledUpload)
    ->ArgsProduct({{0, 1, 2}, {8}, {1 << 20, 8 << 20}})
    ->ArgNames({"policy", "ranges", "bytes"})
    ->Unit(benchmark::kMillisecond);

void BM_ContentHash(benchmark::State& state) {
  std::vector<std::byte> data(static_cast<std::size_t>(state.range(0)));
  fill_pattern(7, 0, data);
  for (auto _ : state) benchmark::DoNotOptimize(content_hash(data));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_ContentHash)->Arg(64 << 10)->Arg(8 << 20)->Arg(64 << 20);

// The word loop a CPU without AVX-512 runs (one thread), and the AVX-512 one.
void BM_ContentHashWordLoop(benchmark::State& state) {
  const bool avx512 = state.range(1) != 0;
  const detail::SumWords loop = avx512 ? detail::sum_words_avx512() : &detail::sum_words_portable;
  if (loop == nullptr) {
    state.SkipWithError("this CPU has no AVX-512");
    return;
  }
  state.SetLabel(avx512 ? "avx512" : "portable");
  std::vector<std::byte> data(static_cast<std::size_t>(state.range(0)));
  fill_pattern(7, 0, data);
  for (auto _ : state) benchmark::DoNotOptimize(loop(data.data(), data.size() / 8, 0));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_ContentHashWordLoop)->Args({8 << 20, 0})->Args({8 << 20, 1});

void BM_VerifyOverhead(benchmark::State& state) {
  const int ranges = 8;
  const auto bytes = static_cast<std::uint64_t>(state.range(0));
  BenchRig off(IntegrityPolicy::off), verify(IntegrityPolicy::verify);
  UploadSetup so = setup(off, ranges, bytes), sv = setup(verify, ranges, bytes);
  std::uint64_t t_off = 0, t_verify = 0;
  std::chrono::steady_clock::duration h_off{}, h_verify{};
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    t_off += upload_once(off, so.src, so.dst);
    auto t1 = std::chrono::steady_clock::now();
    t_verify += upload_once(verify, sv.src, sv.dst);
    auto t2 = std::chrono::steady_clock::now();
    h_off += t1 - t0;
    h_verify += t2 - t1;
  }
  // Device-side cost (the HashOps on the modeled device) and host-side cost
  // (source hashing plus the engine's bookkeeping; the sim's own work included).
  state.counters["modeled_ratio"] = t_off ? static_cast<double>(t_verify) / static_cast<double>(t_off) : 0;
  state.counters["host_ratio"] =
      h_off.count() ? static_cast<double>(h_verify.count()) / static_cast<double>(h_off.count()) : 0;
}
BENCHMARK(BM_VerifyOverhead)->Arg(1 << 20)->Arg(8 << 20)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
