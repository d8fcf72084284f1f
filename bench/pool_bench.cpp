// Device pool benchmarks: host-side alloc+free cost, and the fragmentation
// ratio (smallest capacity at which a trace replays without OOM / its peak live
// bytes) found by binary search over the pool capacity.
//
//   build/release/bench/pool_bench --benchmark_format=json
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/device_pool.hpp"
#include "ferry/replay.hpp"
#include "ferry/sim_backend.hpp"

namespace ferry {
namespace {

std::vector<std::uint64_t> log_uniform_sizes(std::uint64_t lo, std::uint64_t hi, std::size_t n,
                                             std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(std::log2(double(lo)), std::log2(double(hi)));
  std::vector<std::uint64_t> out(n);
  for (auto& s : out) s = static_cast<std::uint64_t>(std::exp2(d(rng)));
  return out;
}

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

// --- fragmentation ratio ---------------------------------------------------

// Report 003's dequantize pattern: a resident set, then frozen quantized
// weights uploaded, dequantized into a transient, used by one matmul and dropped,
// forward and backward.
std::string dequant_trace(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::ostringstream t;
  int id = 0;
  auto alloc = [&](std::uint64_t bytes, int stream) {
    t << R"({"op":"alloc","id":"b)" << id << R"(","bytes":)" << bytes << R"(,"stream":)" << stream
      << "}\n";
    return id++;
  };
  auto name = [](int i) { return "\"b" + std::to_string(i) + "\""; };
  std::vector<int> resident;
  for (int i = 0; i < 24; ++i) {
    resident.push_back(alloc((2 + rng() % 6) << 20, 0));
    t << R"({"op":"fill","id":)" << name(resident.back()) << R"(,"stream":0,"seed":)" << i << "}\n";
  }
  const int act = alloc(4 << 20, 0);
  t << R"({"op":"fill","id":)" << name(act) << R"(,"stream":0,"seed":7})" << "\n";
  for (int pass = 0; pass < 2; ++pass) {
    for (int w = 0; w < 130; ++w) {
      const std::uint64_t q_bytes = (1 + rng() % 8) << 19;  // 0.5 - 4 MiB int8
      const int q = alloc(q_bytes, 1);
      t << R"({"op":"upload","id":)" << name(q) << R"(,"stream":1,"seed":)" << w << "}\n";
      const int d = alloc(q_bytes * 2, 0);  // bf16 dequantized transient
      t << R"({"op":"compute","inputs":[)" << name(q) << R"(],"output":)" << name(d)
        << R"(,"stream":0})" << "\n";
      t << R"({"op":"free","id":)" << name(q) << "}\n";
      t << R"({"op":"compute","inputs":[)" << name(act) << "," << name(d) << R"(],"output":)"
        << name(act) << R"(,"stream":0})" << "\n";
      t << R"({"op":"free","id":)" << name(d) << "}\n";
    }
  }
  t << R"({"op":"sync"})" << "\n" << R"({"op":"check","id":)" << name(act) << "}\n";
  return t.str();
}

// Random mixed-size traffic, 256 B - 24 MiB, on three streams.
std::string mixed_trace(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto sizes = log_uniform_sizes(256, 24 << 20, 1200, seed);
  std::ostringstream t;
  std::vector<std::pair<int, int>> live;  // id, stream
  std::uint64_t live_bytes = 0;
  std::vector<std::uint64_t> bytes_of;
  int id = 0;
  for (std::uint64_t size : sizes) {
    while (live_bytes > (96u << 20) || (!live.empty() && rng() % 3 == 0)) {
      const std::size_t k = rng() % live.size();
      t << R"({"op":"free","id":"b)" << live[k].first << "\"}\n";
      live_bytes -= bytes_of[static_cast<std::size_t>(live[k].first)];
      live.erase(live.begin() + static_cast<long>(k));
    }
    const int s = static_cast<int>(rng() % 3);
    t << R"({"op":"alloc","id":"b)" << id << R"(","bytes":)" << size << R"(,"stream":)" << s << "}\n";
    if (rng() % 4 == 0)
      t << R"({"op":"fill","id":"b)" << id << R"(","stream":)" << s << R"(,"seed":)" << id << "}\n";
    bytes_of.push_back(size);
    live.emplace_back(id++, s);
    live_bytes += size;
  }
  return t.str();
}

// Smallest capacity (to 1%) at which `trace` replays with no OOM.
void fragmentation(benchmark::State& state, const std::string& trace) {
  double ratio = 0;
  std::uint64_t peak_live = 0, best = 0;
  for (auto _ : state) {
    ReplayOptions o;
    o.profile = "h200";
    o.capacity = 0;
    auto full = replay_trace_text(trace, "bench", o);
    if (!full.ok() || !full->passed()) {
      state.SkipWithError(full.ok() ? "replay failed at full capacity" : full.error().message.c_str());
      return;
    }
    peak_live = full->peak_live_bytes;
    std::uint64_t lo = peak_live, hi = peak_live * 3;
    while (hi - lo > peak_live / 100) {
      o.capacity = lo + (hi - lo) / 2;
      auto r = replay_trace_text(trace, "bench", o);
      const bool fits = r.ok() && r->ooms == 0 && r->passed();
      (fits ? hi : lo) = o.capacity;
    }
    best = hi;
    ratio = double(best) / double(peak_live);
  }
  state.counters["peak_live_MiB"] = double(peak_live) / double(1 << 20);
  state.counters["min_capacity_MiB"] = double(best) / double(1 << 20);
  state.counters["fragmentation_ratio"] = ratio;
}

void BM_FragmentationDequant(benchmark::State& state) { fragmentation(state, dequant_trace(1)); }
void BM_FragmentationMixed(benchmark::State& state) { fragmentation(state, mixed_trace(2)); }
BENCHMARK(BM_FragmentationDequant)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FragmentationMixed)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ferry

BENCHMARK_MAIN();
