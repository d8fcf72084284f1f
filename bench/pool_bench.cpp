// Device pool benchmarks: host-side alloc+free cost, and the fragmentation
// ratio (smallest capacity at which a trace replays without OOM / its peak live
// bytes) found by binary search over the pool capacity.
//
//   build/release/bench/pool_bench --benchmark_format=json
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/offset_allocator.hpp"
#include "replay/synthetic_traces.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/forwarding_backend.hpp"
#include "ferry/replay.hpp"
#include "ferry/sim_backend.hpp"

namespace ferry {
namespace {

using synthetic::log_uniform_sizes;

// One alloc+free pair per iteration, with a few blocks kept live so the
// allocator is not trivially empty. Arg 0: max size, arg 1: streams.
void BM_AllocFreePair(benchmark::State& state) {
  const auto max_size = static_cast<std::uint64_t>(state.range(0));
  const auto streams = static_cast<StreamId>(state.range(1));
  auto sim = make_sim_backend({*find_profile("h200"), 1, {}});
  StreamOrder order(*sim);
  DevicePool pool(order);
  const auto sizes = log_uniform_sizes(256, max_size, 4096, 42);
  std::vector<DeviceHandle> keep;
  for (std::size_t i = 0; i < 64; ++i) keep.push_back(*pool.allocate(sizes[i], 0));
  std::size_t i = 0;
  for (auto _ : state) {
    const StreamId s = static_cast<StreamId>(i % streams);
    auto h = pool.allocate(sizes[i++ & 4095], s);
    benchmark::DoNotOptimize(h);
    (void)pool.free(*h);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["maps"] = double(pool.stats().maps);
  for (auto h : keep) (void)pool.free(h);
}
BENCHMARK(BM_AllocFreePair)
    ->ArgNames({"max_bytes", "streams"})
    ->Args({1 << 20, 1})     // sliced sizes, 256 B - 1 MiB
    ->Args({1 << 20, 4})
    ->Args({64 << 20, 1})    // mixed sizes, 256 B - 64 MiB
    ->Args({64 << 20, 4});

// --- the soak (issue 15 item 17) ---------------------------------------------

// A random trace of `ops` operations (synthetic::soak_trace) replayed once on
// the sim in a 64 MiB pool: s_per_op should not grow with the trace (linear
// time); max_rss_mib is the process's peak so far (getrusage).
void BM_ReplaySoak(benchmark::State& state) {
  const auto ops = static_cast<std::size_t>(state.range(0));
  const std::string trace = synthetic::soak_trace(ops, 17);
  ReplayOptions o;
  o.capacity = 64 << 20;
  bool passed = false;
  for (auto _ : state) {
    auto r = replay_trace_text(trace, "soak", o);
    passed = r.ok() && r->passed() && r->ops == ops;
  }
  if (!passed) state.SkipWithError("the soak replay did not pass");
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * ops));
  state.counters["s_per_op"] = benchmark::Counter(double(state.iterations() * ops),
                                                   benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  state.counters["max_rss_mib"] = double(usage.ru_maxrss) / 1024.0;
}
BENCHMARK(BM_ReplaySoak)->ArgName("ops")->Arg(100'000)->Arg(1'000'000)->Iterations(1)->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// --- the churn loop (issue 14) -----------------------------------------------

// 1,000 blocks live; each iteration frees one at random and allocates its
// replacement (log-uniform 256 B - 1 MiB, one stream, no work in flight): one
// iteration is one free + allocate pair. BM_ChurnOffsetAllocator runs the same
// sequence on the bare offset allocator the pool carves its ranges with, the
// floor the pool's bookkeeping (handles, stream order, stats, granules) adds to.
constexpr std::size_t kChurnLive = 1000;
constexpr std::int64_t kChurnIterations = 1'000'000;

// One churn pair: frees a random live block and allocates its replacement.
[[gnu::always_inline]] inline bool churn_step(DevicePool& pool, synthetic::Churn& churn,
                                              std::vector<DeviceHandle>& live, benchmark::State& state) {
  const synthetic::Churn::Step step = churn.next();
  (void)pool.free(live[step.victim]);
  Result<DeviceHandle> h = pool.allocate(step.bytes, 0);
  if (!h.ok()) {
    state.SkipWithError(h.error().message.c_str());
    return false;
  }
  live[step.victim] = *h;
  return true;
}

void BM_ChurnDevicePool(benchmark::State& state) {
  auto sim = make_sim_backend({*find_profile("h200"), 1, {}});
  StreamOrder order(*sim);
  DevicePool pool(order);
  synthetic::Churn churn(kChurnLive, 256, 1 << 20, 42);
  std::vector<DeviceHandle> live(kChurnLive);
  for (std::size_t i = 0; i < kChurnLive; ++i) live[i] = *pool.allocate(churn.initial(i), 0);
  for (auto _ : state) {
    if (!churn_step(pool, churn, live, state)) break;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["maps"] = double(pool.stats().maps);
  for (DeviceHandle h : live) (void)pool.free(h);
}
BENCHMARK(BM_ChurnDevicePool)->Iterations(kChurnIterations);

void BM_ChurnOffsetAllocator(benchmark::State& state) {
  detail::OffsetAllocator space(find_profile("h200")->capacity / 256);
  synthetic::Churn churn(kChurnLive, 256, 1 << 20, 42);
  std::vector<std::uint32_t> live(kChurnLive);
  auto units = [](std::uint64_t bytes) { return (bytes + 255) / 256; };
  for (std::size_t i = 0; i < kChurnLive; ++i) live[i] = space.allocate(units(churn.initial(i)))->node;
  for (auto _ : state) {
    const synthetic::Churn::Step step = churn.next();
    space.free(live[step.victim]);
    auto a = space.allocate(units(step.bytes));
    if (!a) {
      state.SkipWithError("offset allocator ran out of space");
      break;
    }
    live[step.victim] = a->node;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ChurnOffsetAllocator)->Iterations(kChurnIterations);

// The churn loop beside a thread that maps: it allocates and frees a 16 MiB block on
// a pool that caches nothing (release threshold 0), so every cycle maps eight fresh
// granules in one call and unmaps them, through a device
// whose maps of 8 MiB or more take arg 0 µs (a stand-in for cuMemCreate + cuMemMap +
// cuMemSetAccess of a run on a GPU; the churn's own maps of a granule or two stay as
// fast as the sim's). With the driver calls under the pool lock (before issue 13)
// the churn thread waited for each of them. Real time per churn pair; counter
// `mapper_cycles_per_s`.
class SlowDriver final : public ForwardingBackend {
 public:
  SlowDriver(Backend& inner, std::chrono::microseconds delay) : ForwardingBackend(inner), delay_(delay) {}
  Result<void> map(std::uint64_t addr, std::uint64_t bytes) override {
    if (bytes >= (std::uint64_t{8} << 20)) std::this_thread::sleep_for(delay_);
    return inner_.map(addr, bytes);
  }

 private:
  std::chrono::microseconds delay_;
};

void BM_ChurnBesideSlowMaps(benchmark::State& state) {
  auto sim = make_sim_backend({*find_profile("h200"), 1, {}});
  SlowDriver slow(*sim, std::chrono::microseconds(state.range(0)));
  StreamOrder order(slow);
  PoolOptions o;
  o.release_threshold = 0;
  DevicePool pool(order, o);
  synthetic::Churn churn(kChurnLive, 256, 1 << 20, 42);
  std::vector<DeviceHandle> live(kChurnLive);
  for (std::size_t i = 0; i < kChurnLive; ++i) live[i] = *pool.allocate(churn.initial(i), 0);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> cycles{0};
  std::thread mapper([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      Result<DeviceHandle> h = pool.allocate(std::uint64_t{16} << 20, 1);
      if (h.ok()) (void)pool.free(*h);
      cycles.fetch_add(1, std::memory_order_relaxed);
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (!churn_step(pool, churn, live, state)) break;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  mapper.join();
  state.SetItemsProcessed(state.iterations());
  state.counters["mapper_cycles_per_s"] = double(cycles.load()) / seconds;
  state.counters["maps"] = double(pool.stats().maps);
  for (DeviceHandle h : live) (void)pool.free(h);
}
BENCHMARK(BM_ChurnBesideSlowMaps)->ArgName("driver_us")->Arg(0)->Arg(20)->Arg(100)->Iterations(200'000)->UseRealTime();

// --- costs that must stay linear in the work (issue 15) ----------------------

// With stream 1 held, N x {allocate on stream 0, fill on stream 1, free}: every free
// stays pending behind held work. Per-op cost must not grow with N (allocate once
// swept every pending block: quadratic).
void BM_PendingBehindAHeldStream(benchmark::State& state) {
  const auto n = static_cast<std::uint64_t>(state.range(0));
  for (auto _ : state) {
    auto sim = make_sim_backend({*find_profile("h200"), 1, {}});
    StreamOrder order(*sim);
    DevicePool pool(order);
    sim->set_hold(1, true);
    for (std::uint64_t i = 0; i < n; ++i) {
      Result<DeviceHandle> h = pool.allocate(4096, 0);
      if (!h.ok() || !enqueue_fill(pool, 1, *h, i).ok() || !pool.free(*h).ok()) {
        state.SkipWithError("allocate, fill or free failed");
        return;
      }
    }
    state.PauseTiming();
    sim->set_hold(1, false);
    (void)sim->synchronize();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_PendingBehindAHeldStream)->Arg(5000)->Arg(10000)->Arg(20000)->Arg(40000)
    ->Unit(benchmark::kMillisecond);

// trim() on a pool of the whole h200 (141 GB, 2 MiB granules) with one cached
// granule to release: the cost of a trim must follow what it releases, not the
// capacity (it once scanned every granule of the address ranges).
void BM_TrimWholeDevice(benchmark::State& state) {
  auto sim = make_sim_backend({*find_profile("h200"), 1, {}});
  StreamOrder order(*sim);
  DevicePool pool(order);
  for (auto _ : state) {
    Result<DeviceHandle> h = pool.allocate(1 << 20, 0);
    if (!h.ok() || !pool.free(*h).ok() || !pool.trim().ok()) {
      state.SkipWithError("allocate, free or trim failed");
      return;
    }
  }
  state.counters["unmaps"] = double(pool.stats().unmaps);
}
BENCHMARK(BM_TrimWholeDevice);

// --- min capacity ratio (a trace's fragmentation cost) ------------------------

// Smallest capacity (to one granule) at which `trace` replays with no OOM, over its peak
// live bytes (the traces and the search: replay/synthetic_traces.hpp, shared with cuda_bench).
void fragmentation(benchmark::State& state, const std::string& trace) {
  synthetic::MinCapacity found;
  for (auto _ : state) {
    ReplayOptions o;
    o.backend.profile = "h200";
    found = synthetic::min_capacity(trace, o);
    if (!found.error.empty()) {
      state.SkipWithError(found.error.c_str());
      return;
    }
  }
  state.counters["peak_live_MiB"] = double(found.peak_live) / double(1 << 20);
  state.counters["min_capacity_MiB"] = double(found.min_capacity) / double(1 << 20);
  state.counters["min_capacity_ratio"] = found.ratio();
  // 1 when the replay also passed at min_capacity + 1..16 granules.
  state.counters["monotone"] = found.monotone ? 1 : 0;
}

void BM_FragmentationDequant(benchmark::State& state) {
  fragmentation(state, synthetic::dequant_trace(1));
}
// Arg: the trace's seed (the figure of docs/performance.md is seed 2; 1..5 show the spread).
void BM_FragmentationMixed(benchmark::State& state) {
  fragmentation(state, synthetic::mixed_trace(static_cast<std::uint64_t>(state.range(0))));
}
BENCHMARK(BM_FragmentationDequant)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FragmentationMixed)->DenseRange(1, 5)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ferry

BENCHMARK_MAIN();
