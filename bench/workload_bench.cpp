// Workload benchmarks: sim-model figures of the three seed workloads.
//
//   build/<dir>/bench/workload_bench --benchmark_format=json
//
// Every figure is computed on the sim's virtual clock, so it is deterministic
// and independent of the build type and of the machine running it; the
// benchmark's own wall time is only how long the simulation took. Each run is
// one iteration. Counters:
//   BM_Overlap       overlap efficiency = max(transfer busy, compute busy) / wall,
//                    tokens/s at full shape, fragmentation (peak reserved / peak
//                    live), with prefetch on (1) and off (0), integrity verify (2),
//                    probe (1) and off (0)
//   BM_MinCapacity   the smallest pool capacity at which the run still completes
//                    and matches (binary search to 1% of peak live), over peak live
//   BM_MoePolicy     expert-cache hit rate of LRU / LFU / optimal, per slot count
//                    and prefetch setting
//   BM_MoeMisses     fetching misses vs executing them on the host
//   BM_HostGemm      the host bf16 GEMM (gemm.hpp) that --matmul gemm runs on sim
//                    and in every gemm reference: real time on this CPU, FLOP/s,
//                    for shapes of the default-scale workloads and a square one
// FERRY_BENCH_SCALE (a number in (0, 1]) replaces every workload's default scale.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "ferry/content.hpp"
#include "ferry/gemm.hpp"
#include "ferry/workload.hpp"

namespace ferry {
namespace {

constexpr WorkloadKind kKinds[] = {WorkloadKind::dense_stream, WorkloadKind::moe_offload,
                                   WorkloadKind::dequant_train};

WorkloadOptions base() {
  WorkloadOptions o;
  if (const char* s = std::getenv("FERRY_BENCH_SCALE")) o.scale = std::atof(s);
  return o;
}

bool run(benchmark::State& state, WorkloadKind kind, const WorkloadOptions& o, WorkloadReport* out) {
  auto r = run_workload(kind, o);
  if (!r.ok()) {
    state.SkipWithError(r.error().message.c_str());
    return false;
  }
  *out = *r;
  return true;
}

void BM_Overlap(benchmark::State& state) {
  const WorkloadKind kind = kKinds[state.range(0)];
  WorkloadOptions o = base();
  o.prefetch = state.range(1) != 0;
  o.integrity = static_cast<IntegrityPolicy>(state.range(2));
  WorkloadReport r;
  for (auto _ : state) {
    if (!run(state, kind, o, &r)) return;
  }
  state.SetLabel(std::string(to_string(kind)) + (o.prefetch ? " prefetch on, " : " prefetch off, ") +
                 std::string(to_string(o.integrity)));
  state.counters["matched"] = r.matched ? 1 : 0;
  state.counters["overlap_efficiency"] = r.overlap_efficiency;
  state.counters["tokens_per_s"] = r.tokens_per_s;
  state.counters["transfer_ms"] = double(r.transfer_busy_ns) / 1e6;
  state.counters["compute_ms"] = double(r.compute_busy_ns) / 1e6;
  state.counters["wall_ms"] = double(r.wall_ns) / 1e6;
  state.counters["fragmentation_ratio"] = r.fragmentation_ratio;
  state.counters["peak_live_MiB"] = double(r.peak_live_bytes) / double(1 << 20);
  state.counters["peak_reserved_MiB"] = double(r.peak_reserved_bytes) / double(1 << 20);
  state.counters["pressure"] = r.pressure;
  state.counters["ooms_survived"] = double(r.ooms_survived);
  state.counters["scale"] = r.scale;
  if (r.has_cache) state.counters["hit_rate"] = r.cache.hit_rate();
}
BENCHMARK(BM_Overlap)
    ->ArgNames({"workload", "prefetch", "integrity"})
    ->ArgsProduct({{0, 1, 2}, {1, 0}, {2, 1, 0}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

void BM_MinCapacity(benchmark::State& state) {
  const WorkloadKind kind = kKinds[state.range(0)];
  WorkloadOptions o = base();
  WorkloadReport first;
  std::uint64_t lo = 0, hi = 0, probes = 0;
  for (auto _ : state) {
    if (!run(state, kind, o, &first)) return;
    // The default capacity (peak / 0.83) passes; below peak live nothing can.
    lo = first.peak_live_bytes;
    hi = first.capacity;
    const std::uint64_t step = std::max<std::uint64_t>(first.peak_live_bytes / 100, 4096);
    while (hi - lo > step) {
      const std::uint64_t mid = lo + (hi - lo) / 2;
      WorkloadOptions p = o;
      p.capacity = mid;
      WorkloadReport r;
      if (!run(state, kind, p, &r)) return;
      ++probes;
      (r.matched ? hi : lo) = mid;
    }
  }
  state.SetLabel(std::string(to_string(kind)));
  state.counters["peak_live_MiB"] = double(first.peak_live_bytes) / double(1 << 20);
  state.counters["min_capacity_MiB"] = double(hi) / double(1 << 20);
  state.counters["min_capacity_over_live"] = double(hi) / double(first.peak_live_bytes);
  state.counters["fragmentation_ratio"] = first.fragmentation_ratio;
  state.counters["probes"] = double(probes);
}
BENCHMARK(BM_MinCapacity)->ArgNames({"workload"})->DenseRange(0, 2)->Iterations(1)->Unit(benchmark::kMillisecond);

void BM_MoePolicy(benchmark::State& state) {
  WorkloadOptions o = base();
  o.policy = static_cast<EvictionPolicy>(state.range(0));
  o.cache_slots = static_cast<std::uint32_t>(state.range(1));
  o.prefetch = state.range(2) != 0;
  WorkloadReport r;
  for (auto _ : state) {
    if (!run(state, WorkloadKind::moe_offload, o, &r)) return;
  }
  state.SetLabel(std::string(to_string(o.policy)) + " " + std::to_string(o.cache_slots) + " slots" +
                 (o.prefetch ? " prefetch on" : " prefetch off"));
  state.counters["matched"] = r.matched ? 1 : 0;
  state.counters["hit_rate"] = r.cache.hit_rate();
  state.counters["tokens_per_s"] = r.tokens_per_s;
  state.counters["overlap_efficiency"] = r.overlap_efficiency;
  state.counters["uploaded_MiB"] = double(r.cache.bytes_uploaded) / double(1 << 20);
  state.counters["prefetch_hits"] = double(r.cache.prefetch_hits);
}
BENCHMARK(BM_MoePolicy)
    ->ArgNames({"policy", "slots", "prefetch"})
    ->ArgsProduct({{0, 1, 2}, {16, 32, 48}, {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

void BM_MoeMisses(benchmark::State& state) {
  WorkloadOptions o = base();
  o.host_exec = state.range(0) != 0;
  o.cache_slots = static_cast<std::uint32_t>(state.range(1));
  o.policy = EvictionPolicy::lfu;
  WorkloadReport r;
  for (auto _ : state) {
    if (!run(state, WorkloadKind::moe_offload, o, &r)) return;
  }
  state.SetLabel(std::string(o.host_exec ? "host-exec misses" : "fetch misses") + ", lfu, " +
                 std::to_string(o.cache_slots) + " slots");
  state.counters["matched"] = r.matched ? 1 : 0;
  state.counters["tokens_per_s"] = r.tokens_per_s;
  state.counters["hit_rate"] = r.cache.hit_rate();
  state.counters["host_executed"] = double(r.host_executed);
  state.counters["host_ms"] = double(r.host_busy_ns) / 1e6;
  state.counters["transfer_ms"] = double(r.transfer_busy_ns) / 1e6;
  state.counters["wall_ms"] = double(r.wall_ns) / 1e6;
}
BENCHMARK(BM_MoeMisses)
    ->ArgNames({"host_exec", "slots"})
    ->ArgsProduct({{0, 1}, {16, 32, 48}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

void BM_HostGemm(benchmark::State& state) {
  const GemmShape g{static_cast<std::uint32_t>(state.range(0)), static_cast<std::uint32_t>(state.range(1)),
                    static_cast<std::uint32_t>(state.range(2)), false, true};
  std::vector<std::byte> a(g.a_bytes()), b(g.b_bytes()), c(g.c_bytes());
  fill_small_bf16(1, 0, a);
  fill_small_bf16(2, 0, b);
  for (auto _ : state) {
    if (!gemm_bf16(g, a, b, c).ok()) {
      state.SkipWithError("gemm_bf16 failed");
      return;
    }
    benchmark::DoNotOptimize(c.data());
  }
  state.SetLabel(g.text());
  state.counters["flops"] =
      benchmark::Counter(g.flops() * double(state.iterations()), benchmark::Counter::kIsRate);
}
// dense-stream's gate_up, dequant-train's up and moe-offload's gate_up at the
// default scales, a square 1024.
BENCHMARK(BM_HostGemm)
    ->ArgNames({"m", "n", "k"})
    ->Args({256, 1216, 160})
    ->Args({256, 1024, 256})
    ->Args({4, 128, 128})
    ->Args({1024, 1024, 1024})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ferry

BENCHMARK_MAIN();
