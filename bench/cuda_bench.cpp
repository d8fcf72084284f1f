// CUDA benchmarks (issue 4, item 8): ferry on a real device, side by side with what
// CUDA itself offers for the same job. Built only with the CUDA backend; on a machine
// without a GPU or driver every benchmark is skipped with the reason and the binary
// exits 0. Every figure is wall-clock time (UseRealTime): device work and the host
// waiting for it are part of the cost.
//
//   BM_FerryPoolAllocFree        DevicePool::allocate + free on stream 0, one pair per
//                                iteration, 64 blocks kept live; sizes log-uniform over
//                                256 B - max_bytes, as pool_bench on sim. keep_all=1 sets
//                                the pool's release threshold to the maximum, like the
//                                cudaMallocAsync pool below; keep_all=0 is ferry's default
//                                (256 MiB). Counters: driver maps/unmaps in the timed loop.
//   BM_FerryPoolChurnBesideMaps  the same pairs on stream 0 while (mapper=1) a second
//                                thread allocates and frees a 16 MiB block on stream 1,
//                                with nothing cached (release threshold 0): every cycle of
//                                it maps eight 2 MiB granules (cuMemCreate, cuMemMap,
//                                cuMemSetAccess) and unmaps them, outside the pool lock.
//                                Counters: map_cycle_us (one cycle, the mapper's time),
//                                and the churn pair's real time against mapper=0.
//   BM_CudaMallocAsyncAllocFree  the same pairs through cudaMallocFromPoolAsync /
//                                cudaFreeAsync from a pool of its own (release threshold
//                                UINT64_MAX) on a non-blocking stream
//   BM_CudaMallocAllocFree       the same pairs through plain cudaMalloc / cudaFree
//   BM_H2DArena                  TransferEngine::upload (policy off) out of a HostArena
//                                block into a pool block, `depth` uploads back to back,
//                                then a wait for the last; `ranges` ranges per plan (>= 2
//                                takes the batched path when the backend's start-up probe
//                                passed). Counters: which path the copies took.
//   BM_H2DPinnedPlain            the same bytes with cudaMemcpyAsync (one per range) out
//                                of cudaHostAlloc memory into cudaMalloc memory, then
//                                cudaStreamSynchronize
//   BM_VerifyOverhead            the BM_H2DArena upload under off, probe and verify in
//                                turn on the same blocks; counters: each policy's GB/s and
//                                probe_ratio / verify_ratio = time under it / time under off
//   BM_DeviceHash                the content-hash kernel (HashOp) over `bytes` of device
//                                memory, `depth` hashes back to back on one stream, then a
//                                wait for the last; counters: GBps, hbm_fraction (of the
//                                device's nominal memory bandwidth). depth 16 is the
//                                kernel's rate, depth 1 adds one round trip. The first
//                                hash is checked against the host's content_hash: a
//                                mismatch skips the benchmark with the two values.
//   BM_WaitDepth1                one 4 KiB fill, then Backend::wait for it: the time from
//                                enqueue to the waiting thread noticing completion
//   BM_FragmentationCuda*        pool_bench's min capacity ratio (smallest capacity with
//                                no OOM / peak live, to 1 %) on the same traces
//                                (replay/synthetic_traces.hpp), replayed with the cuda backend
//
// Sized for about a minute on one H200, well inside the 120 s that tools/gpu-check gives
// each benchmark binary (MinTime per case; the fragmentation searches run ~9 replays each).
// Run: build/release/bench/cuda_bench --benchmark_format=json
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "replay/synthetic_traces.hpp"
#include "ferry/content.hpp"
#include "ferry/cuda_backend.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/replay.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr int kDevice = 0;
constexpr std::size_t kKeepLive = 64;
constexpr std::size_t kSizes = 4096;  // a power of two: indexed with & (kSizes - 1)
constexpr double kMinSeconds = 0.25;

// The backend, or nullptr after skipping the benchmark with the reason there is none.
std::unique_ptr<Backend> open_cuda(benchmark::State& state) {
  auto backend = make_cuda_backend(CudaOptions{kDevice});
  if (!backend.ok()) {
    state.SkipWithError(("no CUDA device: " + backend.error().message).c_str());
    return nullptr;
  }
  return std::move(backend).value();
}

// False (and the benchmark skipped, naming the call) when err is not cudaSuccess.
bool cuda_ok(benchmark::State& state, cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  state.SkipWithError((std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                       cudaGetErrorString(err) + ")")
                          .c_str());
  (void)cudaGetLastError();
  return false;
}

void skip(benchmark::State& state, const std::string& what, const Error& error) {
  state.SkipWithError((what + ": " + error.message).c_str());
}

// --- alloc+free --------------------------------------------------------------------

// The kKeepLive blocks kept live beside the pairs; false (and the benchmark skipped) on failure.
bool keep_live(benchmark::State& state, DevicePool& pool, const std::vector<std::uint64_t>& sizes,
               std::vector<DeviceHandle>& keep) {
  for (std::size_t i = 0; i < kKeepLive; ++i) {
    auto h = pool.allocate(sizes[i], 0);
    if (!h.ok()) {
      skip(state, "allocating the live set", h.error());
      return false;
    }
    keep.push_back(*h);
  }
  return true;
}

// The timed loop: one allocate + free pair on stream 0 per iteration.
void alloc_free_pairs(benchmark::State& state, DevicePool& pool, const std::vector<std::uint64_t>& sizes) {
  std::size_t i = 0;
  for (auto _ : state) {
    auto h = pool.allocate(sizes[i++ & (kSizes - 1)], 0);
    if (!h.ok()) {
      skip(state, "DevicePool::allocate", h.error());
      break;
    }
    benchmark::DoNotOptimize(h);
    (void)pool.free(*h);
  }
}

void BM_FerryPoolAllocFree(benchmark::State& state) {
  const auto max_size = static_cast<std::uint64_t>(state.range(0));
  const bool keep_all = state.range(1) != 0;
  auto backend = open_cuda(state);
  if (!backend) return;
  StreamOrder order(*backend);
  PoolOptions options;
  if (keep_all) options.release_threshold = std::numeric_limits<std::uint64_t>::max();
  DevicePool pool(order, options);
  if (!pool.status().ok()) return skip(state, "DevicePool", pool.status().error());
  const auto sizes = synthetic::log_uniform_sizes(256, max_size, kSizes, 42);
  std::vector<DeviceHandle> keep;
  if (!keep_live(state, pool, sizes, keep)) return;
  const PoolStats before = pool.stats();
  alloc_free_pairs(state, pool, sizes);
  const PoolStats after = pool.stats();
  state.SetItemsProcessed(state.iterations());
  state.counters["maps"] = double(after.maps - before.maps);
  state.counters["unmaps"] = double(after.unmaps - before.unmaps);
  state.counters["peak_reserved_MiB"] = double(after.peak_reserved_bytes) / double(kMiB);
  for (DeviceHandle h : keep) (void)pool.free(h);
}
BENCHMARK(BM_FerryPoolAllocFree)
    ->ArgNames({"max_bytes", "keep_all"})
    ->ArgsProduct({{1 << 20, 64 << 20}, {0, 1}})
    ->MinTime(kMinSeconds)
    ->UseRealTime();

void BM_FerryPoolChurnBesideMaps(benchmark::State& state) {
  const bool mapper_on = state.range(0) != 0;
  auto backend = open_cuda(state);
  if (!backend) return;
  StreamOrder order(*backend);
  PoolOptions options;
  options.release_threshold = 0;
  DevicePool pool(order, options);
  if (!pool.status().ok()) return skip(state, "DevicePool", pool.status().error());
  const auto sizes = synthetic::log_uniform_sizes(256, 1 << 20, kSizes, 42);
  std::vector<DeviceHandle> keep;
  if (!keep_live(state, pool, sizes, keep)) return;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> cycles{0};
  std::atomic<bool> mapper_failed{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::thread mapper;
  if (mapper_on) {
    mapper = std::thread([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        auto h = pool.allocate(16 * kMiB, 1);
        if (!h.ok() || !pool.free(*h).ok()) {
          mapper_failed = true;
          return;
        }
        cycles.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  alloc_free_pairs(state, pool, sizes);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  if (mapper.joinable()) mapper.join();
  if (mapper_failed) state.SkipWithError("the mapper thread's allocate or free failed");
  state.SetItemsProcessed(state.iterations());
  const auto n = cycles.load();
  state.counters["map_cycles"] = double(n);
  if (n > 0) state.counters["map_cycle_us"] = seconds * 1e6 / double(n);
  for (DeviceHandle h : keep) (void)pool.free(h);
}
BENCHMARK(BM_FerryPoolChurnBesideMaps)->ArgName("mapper")->Arg(0)->Arg(1)->MinTime(kMinSeconds)->UseRealTime();

void BM_CudaMallocAsyncAllocFree(benchmark::State& state) {
  const auto max_size = static_cast<std::uint64_t>(state.range(0));
  auto backend = open_cuda(state);
  if (!backend) return;
  if (!cuda_ok(state, cudaSetDevice(kDevice), "cudaSetDevice")) return;
  int pools = 0;
  if (!cuda_ok(state, cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, kDevice),
               "cudaDeviceGetAttribute(MemoryPoolsSupported)")) {
    return;
  }
  if (pools == 0) {
    state.SkipWithError("the device does not support stream-ordered memory pools");
    return;
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = kDevice;
  cudaMemPool_t mem_pool = nullptr;
  if (!cuda_ok(state, cudaMemPoolCreate(&mem_pool, &props), "cudaMemPoolCreate")) return;
  // Keep everything it ever reserved: the pool's best case, and what a framework's
  // caching allocator does.
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  cudaStream_t stream = nullptr;
  bool ok = cuda_ok(state,
                    cudaMemPoolSetAttribute(mem_pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                    "cudaMemPoolSetAttribute(ReleaseThreshold)") &&
            cuda_ok(state, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                    "cudaStreamCreateWithFlags");
  const auto sizes = synthetic::log_uniform_sizes(256, max_size, kSizes, 42);
  std::vector<void*> keep;
  for (std::size_t i = 0; ok && i < kKeepLive; ++i) {
    void* p = nullptr;
    ok = cuda_ok(state, cudaMallocFromPoolAsync(&p, sizes[i], mem_pool, stream),
                 "cudaMallocFromPoolAsync (live set)");
    if (ok) keep.push_back(p);
  }
  ok = ok && cuda_ok(state, cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (ok) {
    std::size_t i = 0;
    for (auto _ : state) {
      void* p = nullptr;
      const std::uint64_t size = sizes[i++ & (kSizes - 1)];
      if (!cuda_ok(state, cudaMallocFromPoolAsync(&p, size, mem_pool, stream),
                   "cudaMallocFromPoolAsync")) {
        break;
      }
      benchmark::DoNotOptimize(p);
      if (!cuda_ok(state, cudaFreeAsync(p, stream), "cudaFreeAsync")) break;
    }
    state.SetItemsProcessed(state.iterations());
    std::uint64_t reserved_high = 0;
    if (cudaMemPoolGetAttribute(mem_pool, cudaMemPoolAttrReservedMemHigh, &reserved_high) ==
        cudaSuccess) {
      state.counters["peak_reserved_MiB"] = double(reserved_high) / double(kMiB);
    }
  }
  for (void* p : keep) (void)cudaFreeAsync(p, stream);
  if (stream != nullptr) {
    (void)cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
  }
  (void)cudaMemPoolDestroy(mem_pool);
  (void)cudaGetLastError();
}
BENCHMARK(BM_CudaMallocAsyncAllocFree)
    ->ArgNames({"max_bytes"})
    ->Arg(1 << 20)
    ->Arg(64 << 20)
    ->MinTime(kMinSeconds)
    ->UseRealTime();

void BM_CudaMallocAllocFree(benchmark::State& state) {
  const auto max_size = static_cast<std::uint64_t>(state.range(0));
  auto backend = open_cuda(state);
  if (!backend) return;
  if (!cuda_ok(state, cudaSetDevice(kDevice), "cudaSetDevice")) return;
  const auto sizes = synthetic::log_uniform_sizes(256, max_size, kSizes, 42);
  std::vector<void*> keep;
  bool ok = true;
  for (std::size_t i = 0; ok && i < kKeepLive; ++i) {
    void* p = nullptr;
    ok = cuda_ok(state, cudaMalloc(&p, sizes[i]), "cudaMalloc (live set)");
    if (ok) keep.push_back(p);
  }
  if (ok) {
    std::size_t i = 0;
    for (auto _ : state) {
      void* p = nullptr;
      if (!cuda_ok(state, cudaMalloc(&p, sizes[i++ & (kSizes - 1)]), "cudaMalloc")) break;
      benchmark::DoNotOptimize(p);
      if (!cuda_ok(state, cudaFree(p), "cudaFree")) break;
    }
    state.SetItemsProcessed(state.iterations());
  }
  for (void* p : keep) (void)cudaFree(p);
  (void)cudaGetLastError();
}
BENCHMARK(BM_CudaMallocAllocFree)
    ->ArgNames({"max_bytes"})
    ->Arg(1 << 20)
    ->Arg(64 << 20)
    ->MinTime(kMinSeconds)
    ->UseRealTime();

// --- device hash and wait latency ----------------------------------------------------

// A mapped device range of at least `bytes` straight from the backend, and a
// pinned word for hash results. False after skipping the benchmark.
struct DeviceRig {
  bool open(benchmark::State& state, std::uint64_t bytes) {
    backend = open_cuda(state);
    if (!backend) return false;
    const std::uint64_t g = backend->info().granularity;
    size = (bytes + g - 1) / g * g;
    auto b = backend->reserve_address(size);
    if (!b.ok()) {
      skip(state, "reserve_address", b.error());
      return false;
    }
    base = *b;
    if (auto m = backend->map(base, size); !m.ok()) {
      (void)backend->release_address(base, size);
      base = 0;
      skip(state, "map", m.error());
      return false;
    }
    auto p = backend->allocate_pinned(sizeof(std::uint64_t));
    if (!p.ok()) {
      skip(state, "allocate_pinned", p.error());
      return false;
    }
    pinned = *p;
    return true;
  }
  std::uint64_t* result() const { return reinterpret_cast<std::uint64_t*>(pinned); }
  // Enqueues `op` on stream 0 and waits for it. False after skipping the benchmark.
  bool run(benchmark::State& state, Op op) {
    auto t = backend->enqueue(0, std::move(op));
    if (!t.ok()) {
      skip(state, "enqueue", t.error());
      return false;
    }
    if (auto w = backend->wait({0, *t}, std::chrono::seconds(10)); !w.ok()) {
      skip(state, "wait", w.error());
      return false;
    }
    return true;
  }
  ~DeviceRig() {
    if (!backend) return;
    (void)backend->synchronize();
    if (pinned != nullptr) (void)backend->free_pinned(pinned);
    if (base != 0) {
      (void)backend->unmap(base, size);
      (void)backend->release_address(base, size);
    }
  }

  std::unique_ptr<Backend> backend;
  std::uint64_t base = 0;
  std::uint64_t size = 0;
  std::byte* pinned = nullptr;
};

void BM_DeviceHash(benchmark::State& state) {
  const auto bytes = static_cast<std::uint64_t>(state.range(0));
  const auto depth = state.range(1);
  DeviceRig rig;
  if (!rig.open(state, bytes)) return;
  const DeviceRange range{rig.base, bytes};
  if (!rig.run(state, FillOp{range, 3}) || !rig.run(state, HashOp{range, rig.result()})) return;
  std::vector<std::byte> expected(bytes);
  fill_pattern(3, 0, expected);
  if (const std::uint64_t want = content_hash(expected); *rig.result() != want) {
    state.SkipWithError(("device hash " + std::to_string(*rig.result()) + " differs from content_hash " +
                         std::to_string(want))
                            .c_str());
    return;
  }
  for (auto _ : state) {
    Result<Ticket> t = make_error(ErrorCode::invalid_argument, "depth 0");
    for (std::int64_t k = 0; k < depth; ++k) t = rig.backend->enqueue(0, HashOp{range, rig.result()});
    if (!t.ok()) return skip(state, "enqueue", t.error());
    if (auto w = rig.backend->wait({0, *t}, std::chrono::seconds(10)); !w.ok()) return skip(state, "wait", w.error());
  }
  const double hashed = double(state.iterations()) * double(depth) * double(bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(hashed));
  state.counters["GBps"] = benchmark::Counter(hashed / 1e9, benchmark::Counter::kIsRate);
  const double nominal = rig.backend->info().mem_bytes_per_s;
  if (nominal > 0) state.counters["hbm_fraction"] = benchmark::Counter(hashed / nominal, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DeviceHash)
    ->ArgNames({"bytes", "depth"})
    ->ArgsProduct({{1 << 20, 8 << 20, 64 << 20}, {1, 16}})
    ->MinTime(kMinSeconds)
    ->UseRealTime();

void BM_WaitDepth1(benchmark::State& state) {
  DeviceRig rig;
  if (!rig.open(state, 4096)) return;
  for (auto _ : state) {
    if (!rig.run(state, FillOp{{rig.base, 4096}, 5})) return;
  }
  state.counters["us_per_wait"] =
      benchmark::Counter(double(state.iterations()) / 1e6, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_WaitDepth1)->MinTime(kMinSeconds)->UseRealTime();

// --- host -> device ------------------------------------------------------------------

// A cuda backend with a pool, an arena and one transfer engine per policy, all on
// one StreamOrder, and one source block and one destination block of `bytes`.
struct CudaRig {
  static constexpr StreamId kStream = 0;

  // False after skipping the benchmark with the reason.
  bool open(benchmark::State& state, std::uint64_t bytes, std::uint64_t ranges) {
    backend = open_cuda(state);
    if (!backend) return false;
    order = std::make_unique<StreamOrder>(*backend);
    pool = std::make_unique<DevicePool>(*order);
    if (!pool->status().ok()) {
      skip(state, "DevicePool", pool->status().error());
      return false;
    }
    ArenaOptions ao;
    ao.chunk_bytes = 64 * kMiB;
    ao.budget_bytes = 1024 * kMiB;
    arena = std::make_unique<HostArena>(*order, ao);
    for (IntegrityPolicy p :
         {IntegrityPolicy::off, IntegrityPolicy::probe, IntegrityPolicy::verify}) {
      EngineOptions eo;
      eo.policy = p;
      auto& engine = engines[static_cast<std::size_t>(p)];
      engine = std::make_unique<TransferEngine>(*pool, *arena, eo);
      if (!engine->status().ok()) {
        skip(state, "TransferEngine", engine->status().error());
        return false;
      }
    }
    auto b = arena->allocate(bytes);
    if (!b.ok()) {
      skip(state, "HostArena::allocate", b.error());
      return false;
    }
    src = *b;
    fill_pattern(1, 0, src.span());
    auto d = pool->allocate(bytes, kStream);
    if (!d.ok()) {
      skip(state, "DevicePool::allocate", d.error());
      return false;
    }
    dst = *d;
    const std::uint64_t piece = bytes / ranges;
    for (std::uint64_t r = 0; r < ranges; ++r) plan.add(src, r * piece, dst, r * piece, piece);
    return true;
  }

  // `depth` uploads under `policy` back to back, then a wait for the last (stream
  // order makes it imply the others). False after skipping the benchmark.
  bool upload(benchmark::State& state, IntegrityPolicy policy, std::int64_t depth = 1,
              TransferReceipt* receipt = nullptr) {
    Result<TransferReceipt> r = make_error(ErrorCode::invalid_argument, "depth 0");
    for (std::int64_t k = 0; k < depth; ++k) {
      r = engines[static_cast<std::size_t>(policy)]->upload(kStream, plan);
      if (!r.ok()) {
        skip(state, "TransferEngine::upload", r.error());
        return false;
      }
    }
    if (auto w = order->wait(r->done); !w.ok()) {
      skip(state, "waiting for the upload", w.error());
      return false;
    }
    if (receipt != nullptr) *receipt = *r;
    return true;
  }

  IntegrityCounters counters(IntegrityPolicy policy) const {
    return engines[static_cast<std::size_t>(policy)]->counters();
  }

  ~CudaRig() {
    if (src) (void)arena->free(src);
    if (pool && dst != DeviceHandle{}) (void)pool->free(dst);
    for (auto& e : engines) e.reset();
    arena.reset();
    pool.reset();
    order.reset();
  }

  std::unique_ptr<Backend> backend;
  std::unique_ptr<StreamOrder> order;
  std::unique_ptr<DevicePool> pool;
  std::unique_ptr<HostArena> arena;
  std::array<std::unique_ptr<TransferEngine>, 3> engines;  // by IntegrityPolicy
  HostBlock src;
  DeviceHandle dst;
  TransferPlan plan;
};

// Arg 0: bytes per upload, arg 1: ranges it is cut into.
void upload_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bytes", "ranges"});
  b->Args({1 << 20, 1})->Args({8 << 20, 1})->Args({64 << 20, 1})->Args({64 << 20, 8});
}
// The same, and arg 2: uploads enqueued back to back before one wait for the last.
// depth 1 charges every upload a full round trip (enqueue, copy, the host noticing);
// depth 8 is the streaming rate, with the wait's latency spread over 8 copies.
void h2d_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bytes", "ranges", "depth"});
  b->Args({1 << 20, 1, 1})->Args({8 << 20, 1, 1})->Args({64 << 20, 1, 1})->Args({64 << 20, 8, 1});
  b->Args({1 << 20, 1, 8})->Args({8 << 20, 1, 8});
}

void BM_H2DArena(benchmark::State& state) {
  const auto bytes = static_cast<std::uint64_t>(state.range(0));
  const auto ranges = static_cast<std::uint64_t>(state.range(1));
  const std::int64_t depth = state.range(2);
  CudaRig rig;
  if (!rig.open(state, bytes, ranges)) return;
  TransferReceipt receipt;
  if (!rig.upload(state, IntegrityPolicy::off, 1, &receipt)) return;  // warm: first-use costs
  const IntegrityCounters before = rig.counters(IntegrityPolicy::off);
  for (auto _ : state) {
    if (!rig.upload(state, IntegrityPolicy::off, depth)) break;
  }
  const IntegrityCounters after = rig.counters(IntegrityPolicy::off);
  state.SetBytesProcessed(state.iterations() * depth * state.range(0));
  state.counters["batched"] = receipt.batched ? 1 : 0;
  state.counters["batches"] = double(after.batches - before.batches);
  state.counters["per_copy"] = double(after.per_copy - before.per_copy);
  state.counters["staged"] =
      double((after.staged - before.staged) + (after.pageable - before.pageable));
}
BENCHMARK(BM_H2DArena)->Apply(h2d_args)->MinTime(kMinSeconds)->UseRealTime();

void BM_H2DPinnedPlain(benchmark::State& state) {
  const auto bytes = static_cast<std::uint64_t>(state.range(0));
  const auto ranges = static_cast<std::uint64_t>(state.range(1));
  const std::int64_t depth = state.range(2);
  auto backend = open_cuda(state);
  if (!backend) return;
  if (!cuda_ok(state, cudaSetDevice(kDevice), "cudaSetDevice")) return;
  void* host = nullptr;
  void* dev = nullptr;
  cudaStream_t stream = nullptr;
  bool ok = cuda_ok(state, cudaHostAlloc(&host, bytes, cudaHostAllocPortable), "cudaHostAlloc") &&
            cuda_ok(state, cudaMalloc(&dev, bytes), "cudaMalloc") &&
            cuda_ok(state, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                    "cudaStreamCreateWithFlags");
  const std::uint64_t piece = bytes / ranges;
  auto copy = [&](std::int64_t uploads) {
    for (std::int64_t k = 0; k < uploads; ++k) {
      for (std::uint64_t r = 0; r < ranges; ++r) {
        const cudaError_t err = cudaMemcpyAsync(static_cast<std::byte*>(dev) + r * piece,
                                                static_cast<const std::byte*>(host) + r * piece,
                                                piece, cudaMemcpyHostToDevice, stream);
        if (!cuda_ok(state, err, "cudaMemcpyAsync")) return false;
      }
    }
    return cuda_ok(state, cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  };
  if (ok) {
    fill_pattern(1, 0, {static_cast<std::byte*>(host), bytes});
    ok = copy(1);  // warm, as BM_H2DArena
  }
  if (ok) {
    for (auto _ : state) {
      if (!copy(depth)) break;
    }
    state.SetBytesProcessed(state.iterations() * depth * state.range(0));
  }
  if (stream != nullptr) {
    (void)cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
  }
  if (dev != nullptr) (void)cudaFree(dev);
  if (host != nullptr) (void)cudaFreeHost(host);
  (void)cudaGetLastError();
}
BENCHMARK(BM_H2DPinnedPlain)->Apply(h2d_args)->MinTime(kMinSeconds)->UseRealTime();

// One iteration: the same upload under off, probe and verify, each timed alone.
void BM_VerifyOverhead(benchmark::State& state) {
  const auto bytes = static_cast<std::uint64_t>(state.range(0));
  const auto ranges = static_cast<std::uint64_t>(state.range(1));
  constexpr std::array<IntegrityPolicy, 3> kPolicies{IntegrityPolicy::off, IntegrityPolicy::probe,
                                                     IntegrityPolicy::verify};
  CudaRig rig;
  if (!rig.open(state, bytes, ranges)) return;
  for (IntegrityPolicy p : kPolicies) {
    if (!rig.upload(state, p)) return;  // warm: first-use canaries, hash scratch
  }
  std::array<std::chrono::steady_clock::duration, 3> spent{};
  for (auto _ : state) {
    bool ok = true;
    for (IntegrityPolicy p : kPolicies) {
      const auto t0 = std::chrono::steady_clock::now();
      ok = rig.upload(state, p);
      spent[static_cast<std::size_t>(p)] += std::chrono::steady_clock::now() - t0;
      if (!ok) break;
    }
    if (!ok) break;
  }
  if (state.error_occurred() || state.iterations() == 0) return;
  auto seconds = [&](IntegrityPolicy p) {
    return std::chrono::duration<double>(spent[static_cast<std::size_t>(p)]).count();
  };
  const double moved = double(state.iterations()) * double(bytes);
  const double off = seconds(IntegrityPolicy::off);
  for (IntegrityPolicy p : kPolicies) {
    state.counters[std::string(to_string(p)) + "_GBps"] = moved / seconds(p) / 1e9;
  }
  state.counters["probe_ratio"] = seconds(IntegrityPolicy::probe) / off;
  state.counters["verify_ratio"] = seconds(IntegrityPolicy::verify) / off;
  std::uint64_t mismatches = 0;
  for (IntegrityPolicy p : kPolicies) mismatches += rig.counters(p).mismatches;
  state.counters["mismatches"] = double(mismatches);
}
BENCHMARK(BM_VerifyOverhead)
    ->Apply(upload_args)
    ->MinTime(2 * kMinSeconds)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// --- min capacity ratio (a trace's fragmentation cost) ------------------------

// pool_bench's fragmentation(), with the cuda backend.
void fragmentation(benchmark::State& state, const std::string& trace) {
  if (!open_cuda(state)) return;  // the replays open their own backends
  synthetic::MinCapacity found;
  for (auto _ : state) {
    ReplayOptions o;
    o.backend.kind = BackendKind::cuda;
    found = synthetic::min_capacity(trace, o);
    if (!found.error.empty()) {
      state.SkipWithError(found.error.c_str());
      return;
    }
  }
  state.counters["peak_live_MiB"] = double(found.peak_live) / double(kMiB);
  state.counters["min_capacity_MiB"] = double(found.min_capacity) / double(kMiB);
  state.counters["min_capacity_ratio"] = found.ratio();
  state.counters["replays"] = found.replays;
}

void BM_FragmentationCudaDequant(benchmark::State& state) {
  fragmentation(state, synthetic::dequant_trace(1));
}
void BM_FragmentationCudaMixed(benchmark::State& state) {
  fragmentation(state, synthetic::mixed_trace(2));
}
BENCHMARK(BM_FragmentationCudaDequant)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FragmentationCudaMixed)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ferry

BENCHMARK_MAIN();
