// Several devices in one Runtime (issue 27): the figures docs/scale.md quotes.
//
//   BM_CreateRuntime    a Runtime over N sim devices (h200), built and taken down;
//                       counters per device: reserved_bytes and internal_allocs after
//                       create (the pool's and the engine's fixed overhead)
//   BM_PeerCopy         copy_peer of N MiB from device 0 to device 1 (h200) by
//                       integrity policy and link (none: staged through the host;
//                       pcie, nvlink: direct); counter modeled_us = the virtual time
//                       the two devices' clocks moved, summed (the device model)
//
// Run: build/release/bench/devices_bench --benchmark_format=json
#include <benchmark/benchmark.h>

#include <memory>

#include "ferry/runtime.hpp"

namespace {

using namespace ferry;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

RuntimeOptions on_h200(std::uint32_t devices, IntegrityPolicy policy = IntegrityPolicy::verify) {
  RuntimeOptions o;
  o.backend.profile = "h200";
  o.devices.count = devices;
  o.engine.policy = policy;
  o.pool.validate_each_op = false;
  return o;
}

void BM_CreateRuntime(benchmark::State& state) {
  const auto n = static_cast<std::uint32_t>(state.range(0));
  PoolStats total{};
  for (auto _ : state) {
    auto rt = Runtime::create(on_h200(n));
    if (!rt.ok()) {
      state.SkipWithError(rt.error().message.c_str());
      return;
    }
    total = (*rt)->total_pool_stats();
  }
  state.counters["reserved_bytes_per_device"] = static_cast<double>(total.reserved_bytes) / n;
  state.counters["internal_allocs_per_device"] = static_cast<double>(total.internal_allocs) / n;
}
BENCHMARK(BM_CreateRuntime)->Arg(1)->Arg(2)->Arg(8)->Unit(benchmark::kMillisecond);

void BM_PeerCopy(benchmark::State& state) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0)) * kMiB;
  const auto policy = static_cast<IntegrityPolicy>(state.range(1));
  RuntimeOptions o = on_h200(2, policy);
  const auto link = static_cast<PeerLink>(state.range(2));
  if (link != PeerLink::none) o.devices.links = {PeerLinkSpec{0, 1, link}};
  auto made = Runtime::create(std::move(o));
  if (!made.ok()) {
    state.SkipWithError(made.error().message.c_str());
    return;
  }
  Runtime& rt = **made;
  auto src = rt.device(0).pool().allocate(bytes, 1);
  auto dst = rt.device(1).pool().allocate(bytes, 1);
  if (!src.ok() || !dst.ok() || !enqueue_fill(rt.device(0).pool(), 1, *src, 7).ok()) {
    state.SkipWithError("setup failed");
    return;
  }
  (void)rt.synchronize();
  double modeled_ns = 0;
  for (auto _ : state) {
    const std::uint64_t t0 = rt.device(0).backend().now_ns() + rt.device(1).backend().now_ns();
    auto r = rt.copy_peer(*dst, 0, *src, 0, bytes, 1);
    if (!r.ok() || !rt.synchronize().ok()) {
      state.SkipWithError("copy_peer failed");
      return;
    }
    modeled_ns += static_cast<double>(rt.device(0).backend().now_ns() + rt.device(1).backend().now_ns() - t0);
  }
  state.counters["modeled_us"] = modeled_ns / 1e3 / static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  (void)rt.device(0).pool().free(*src);
  (void)rt.device(1).pool().free(*dst);
}
BENCHMARK(BM_PeerCopy)
    ->ArgsProduct({{1, 64},
                   {static_cast<int>(IntegrityPolicy::off), static_cast<int>(IntegrityPolicy::verify)},
                   {static_cast<int>(PeerLink::none), static_cast<int>(PeerLink::pcie),
                    static_cast<int>(PeerLink::nvlink)}})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
