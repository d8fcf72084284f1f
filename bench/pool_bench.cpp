// Device pool benchmarks: host-side alloc+free cost, and the fragmentation
// ratio (smallest capacity at which a trace replays without OOM / its peak live
// bytes) found by binary search over the pool capacity.
//
//   build/release/bench/pool_bench --benchmark_format=json
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <string>
#include <vector>

#include "replay/synthetic_traces.hpp"
#include "ferry/device_pool.hpp"
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

// --- fragmentation ratio ---------------------------------------------------

// Smallest capacity (to 1%) at which `trace` replays with no OOM, over its peak
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
  state.counters["fragmentation_ratio"] = found.ratio();
}

void BM_FragmentationDequant(benchmark::State& state) {
  fragmentation(state, synthetic::dequant_trace(1));
}
void BM_FragmentationMixed(benchmark::State& state) { fragmentation(state, synthetic::mixed_trace(2)); }
BENCHMARK(BM_FragmentationDequant)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FragmentationMixed)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ferry

BENCHMARK_MAIN();
