// The CUDA backend on a real device. Every test that needs a GPU reports SKIP when
// make_cuda_backend() answers `unsupported` (no device, no driver, or no backend in
// this build). Each runs twice: with virtual memory management and with the plain
// allocation fallback (forced by FERRY_CUDA_VMM=0).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include "ferry/content.hpp"
#include "ferry/cuda_backend.hpp"

namespace ferry {
namespace {

constexpr auto kForever = std::chrono::nanoseconds::max();

std::vector<std::byte> pattern(std::uint64_t seed, std::size_t n) {
  std::vector<std::byte> v(n);
  fill_pattern(seed, 0, v);
  return v;
}

TEST(CudaBackendFactory, IsBuiltAndAnswersPlainlyWithoutADevice) {
  auto r = make_cuda_backend({});
  if (r.ok()) {
    EXPECT_EQ(r.value()->info().backend, "cuda");
    return;
  }
  // Without the backend in the build the answer is also `unsupported`.
  EXPECT_EQ(r.error().code, ErrorCode::unsupported) << r.error().message;
  if (cuda_backend_built()) {
    EXPECT_NE(r.error().message.find("no CUDA device or driver found"), std::string::npos)
        << r.error().message;
  }
}

TEST(CudaBackendFactory, RejectsADeviceThatDoesNotExist) {
  auto r = make_cuda_backend({.device = 4096});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.error().code == ErrorCode::unsupported ||
              r.error().code == ErrorCode::invalid_argument)
      << r.error().message;
}

class CudaBackendTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!GetParam()) setenv("FERRY_CUDA_VMM", "0", 1);
    auto r = make_cuda_backend({});
    unsetenv("FERRY_CUDA_VMM");
    if (!r.ok()) {
      if (r.error().code == ErrorCode::unsupported) GTEST_SKIP() << r.error().message;
      FAIL() << r.error().message;
    }
    backend_ = std::move(r).value();
  }

  void TearDown() override {
    if (!backend_) return;
    EXPECT_TRUE(backend_->synchronize().ok());
    for (const DeviceRange& r : reservations_) {
      EXPECT_TRUE(backend_->release_address(r.addr, r.bytes).ok());
    }
    for (std::byte* p : pinned_) EXPECT_TRUE(backend_->free_pinned(p).ok());
  }

  std::uint64_t granule() const { return backend_->info().granularity; }

  // A mapped device buffer of at least `bytes`.
  std::uint64_t device_buffer(std::uint64_t bytes) {
    const std::uint64_t size = (bytes + granule() - 1) / granule() * granule();
    auto base = backend_->reserve_address(size);
    EXPECT_TRUE(base.ok()) << base.error().message;
    if (!base.ok()) return 0;
    reservations_.push_back({*base, size});
    auto m = backend_->map(*base, size);
    EXPECT_TRUE(m.ok()) << m.error().message;
    return *base;
  }

  std::byte* pinned(std::uint64_t bytes) {
    auto p = backend_->allocate_pinned(bytes);
    EXPECT_TRUE(p.ok()) << p.error().message;
    if (!p.ok()) return nullptr;
    pinned_.push_back(*p);
    return *p;
  }

  // Enqueues and waits; false (with a test failure) on any error.
  bool run(StreamId s, Op op) {
    auto t = backend_->enqueue(s, std::move(op));
    EXPECT_TRUE(t.ok()) << t.error().message;
    if (!t.ok()) return false;
    auto w = backend_->wait({s, *t}, kForever);
    EXPECT_TRUE(w.ok()) << w.error().message;
    return w.ok();
  }

  std::vector<std::byte> read(std::uint64_t addr, std::uint64_t bytes, StreamId s = 0) {
    std::vector<std::byte> out(bytes);
    run(s, CopyToHostOp{out.data(), {addr, bytes}});
    return out;
  }

  std::unique_ptr<Backend> backend_;
  std::vector<DeviceRange> reservations_;
  std::vector<std::byte*> pinned_;
};

TEST_P(CudaBackendTest, DescribesTheDevice) {
  const DeviceInfo& info = backend_->info();
  EXPECT_EQ(info.backend, "cuda");
  EXPECT_FALSE(info.device.empty());
  EXPECT_GT(info.capacity, 0u);
  EXPECT_GT(info.granularity, 0u);
  EXPECT_EQ(info.granularity & (info.granularity - 1), 0u);
  EXPECT_GT(info.h2d_bytes_per_s, 0);
  EXPECT_GT(info.mem_bytes_per_s, 0);
  EXPECT_GT(info.flops_per_s, 0);
  if (!GetParam()) {
    EXPECT_FALSE(info.virtual_memory);
  }
  RecordProperty("device", info.device);
  RecordProperty("virtual_memory", info.virtual_memory ? "yes" : "no");
  RecordProperty("batched_copy", info.batched_copy ? "yes" : "no");
}

TEST_P(CudaBackendTest, ReservesMapsAndUnmapsGranules) {
  const std::uint64_t g = granule();
  auto base = backend_->reserve_address(3 * g - 1);  // rounded up to three granules
  ASSERT_TRUE(base.ok()) << base.error().message;
  EXPECT_NE(*base, 0u);
  EXPECT_EQ(*base % g, 0u);
  const std::uint64_t before = backend_->mapped_bytes();

  ASSERT_TRUE(backend_->map(*base + g, g).ok());
  EXPECT_EQ(backend_->mapped_bytes(), before + g);
  EXPECT_EQ(backend_->map(*base + g, g).error().code, ErrorCode::invalid_argument);  // twice
  EXPECT_EQ(backend_->map(*base + 1, g).error().code, ErrorCode::invalid_argument);  // unaligned
  EXPECT_EQ(backend_->map(*base + 2 * g, 2 * g).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(backend_->unmap(*base, g).error().code, ErrorCode::invalid_argument);  // not mapped

  // The mapped granule holds bytes; its unmapped neighbour is refused to operations.
  ASSERT_TRUE(run(0, FillOp{{*base + g, g}, 11}));
  EXPECT_EQ(read(*base + g, g), pattern(11, g));
  EXPECT_EQ(backend_->enqueue(0, FillOp{{*base, 16}, 1}).error().code, ErrorCode::invalid_argument);

  // Unmap one granule while its neighbour stays mapped and keeps its bytes.
  ASSERT_TRUE(backend_->map(*base + 2 * g, g).ok());
  ASSERT_TRUE(run(0, FillOp{{*base + 2 * g, g}, 12}));
  ASSERT_TRUE(backend_->unmap(*base + g, g).ok());
  EXPECT_EQ(backend_->mapped_bytes(), before + g);
  EXPECT_EQ(read(*base + 2 * g, g), pattern(12, g));
  ASSERT_TRUE(backend_->map(*base + g, g).ok());  // and again

  EXPECT_EQ(backend_->release_address(*base + g, 3 * g).error().code, ErrorCode::invalid_argument);
  ASSERT_TRUE(backend_->release_address(*base, 3 * g).ok());  // unmaps what is left
  EXPECT_EQ(backend_->mapped_bytes(), before);
  EXPECT_EQ(backend_->reserve_address(0).error().code, ErrorCode::invalid_argument);
}

TEST_P(CudaBackendTest, MappingBeyondPhysicalMemoryIsOutOfMemory) {
  const std::uint64_t g = granule();
  const std::uint64_t size = (backend_->info().capacity / g + 1) * g;
  const std::uint64_t before = backend_->mapped_bytes();
  auto base = backend_->reserve_address(size);
  if (!base.ok()) {  // the fallback allocates at reserve time
    EXPECT_FALSE(backend_->info().virtual_memory);
    EXPECT_EQ(base.error().code, ErrorCode::out_of_memory) << base.error().message;
    return;
  }
  ASSERT_TRUE(backend_->info().virtual_memory);
  auto m = backend_->map(*base, size);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code, ErrorCode::out_of_memory) << m.error().message;
  EXPECT_EQ(backend_->mapped_bytes(), before);  // all or nothing
  ASSERT_TRUE(backend_->map(*base, g).ok());    // the memory went back to the driver
  ASSERT_TRUE(backend_->release_address(*base, size).ok());
}

TEST_P(CudaBackendTest, FillWritesThePatternAndNothingElse) {
  const std::uint64_t buf = device_buffer(8 << 20);
  for (const std::uint64_t offset : {0ull, 3ull}) {
    for (const std::uint64_t n : {1ull, 7ull, 8ull, 9ull, 4099ull, (3ull << 20) + 5}) {
      ASSERT_TRUE(run(0, FillOp{{buf, 8 << 20}, 1}));
      ASSERT_TRUE(run(0, FillOp{{buf + offset, n}, 77}));
      const auto got = read(buf, offset + n + 64);
      const auto background = pattern(1, offset + n + 64);
      const auto expected = pattern(77, n);
      ASSERT_TRUE(std::equal(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(offset),
                             background.begin()));
      ASSERT_TRUE(std::equal(expected.begin(), expected.end(),
                             got.begin() + static_cast<std::ptrdiff_t>(offset)))
          << "offset " << offset << " n " << n;
      ASSERT_TRUE(std::equal(got.end() - 64, got.end(), background.end() - 64));
    }
  }
}

TEST_P(CudaBackendTest, CopiesRoundTripFromPageablePinnedAndRegisteredMemory) {
  const std::uint64_t n = (9ull << 20) + 7;  // more than two staging buffers
  const std::uint64_t a = device_buffer(n);
  const std::uint64_t b = device_buffer(n);
  const auto src = pattern(5, n);

  // Pageable (staged through pinned buffers by host functions).
  ASSERT_TRUE(run(1, CopyToDeviceOp{{a, n}, src.data()}));
  EXPECT_EQ(read(a, n, 1), src);

  // Pinned.
  std::byte* p = pinned(n);
  ASSERT_NE(p, nullptr);
  fill_pattern(6, 0, {p, n});
  ASSERT_TRUE(run(1, CopyToDeviceOp{{a, n}, p}));
  std::fill(p, p + n, std::byte{0});
  ASSERT_TRUE(run(1, CopyToHostOp{p, {a, n}}));
  EXPECT_EQ(std::vector<std::byte>(p, p + n), pattern(6, n));

  // Registered in place.
  std::vector<std::byte> reg = pattern(7, n);
  ASSERT_TRUE(backend_->register_host(reg.data(), n).ok());
  ASSERT_TRUE(run(1, CopyToDeviceOp{{a, n}, reg.data()}));
  ASSERT_TRUE(run(1, CopyOnDeviceOp{{b, n}, a}));
  std::fill(reg.begin(), reg.end(), std::byte{0});
  ASSERT_TRUE(run(1, CopyToHostOp{reg.data(), {b, n}}));
  EXPECT_EQ(reg, pattern(7, n));
  ASSERT_TRUE(backend_->unregister_host(reg.data()).ok());

  // A stream-ordered round trip through the same host buffer.
  std::vector<std::byte> host(n);
  ASSERT_TRUE(run(2, FillOp{{a, n}, 8}));
  auto t1 = backend_->enqueue(2, CopyToHostOp{host.data(), {a, n}});
  auto t2 = backend_->enqueue(2, CopyToDeviceOp{{b, n}, host.data()});
  ASSERT_TRUE(t1.ok() && t2.ok());
  ASSERT_TRUE(backend_->wait({2, *t2}, kForever).ok());
  EXPECT_EQ(read(b, n), pattern(8, n));
}

TEST_P(CudaBackendTest, DeviceHashEqualsContentHash) {
  const std::uint64_t buf = device_buffer(6 << 20);
  ASSERT_TRUE(run(0, FillOp{{buf, 6 << 20}, 21}));
  const auto host = pattern(21, 6 << 20);
  std::uint64_t* pinned_result = reinterpret_cast<std::uint64_t*>(pinned(64));
  for (const std::uint64_t offset : {0ull, 5ull}) {
    for (const std::uint64_t n : {0ull, 1ull, 31ull, 32ull, 33ull, 65535ull, 65536ull, 65537ull,
                                  (5ull << 20) + 13}) {
      const std::uint64_t expected = content_hash({host.data() + offset, n});
      std::uint64_t pageable_result = 0;
      ASSERT_TRUE(run(3, HashOp{{buf + offset, n}, &pageable_result}));
      EXPECT_EQ(pageable_result, expected) << "offset " << offset << " n " << n;
      *pinned_result = 0;
      ASSERT_TRUE(run(3, HashOp{{buf + offset, n}, pinned_result}));
      EXPECT_EQ(*pinned_result, expected) << "offset " << offset << " n " << n;
    }
  }
}

TEST_P(CudaBackendTest, ComputeEqualsTheHostMix) {
  const std::uint64_t buf = device_buffer(4 << 20);
  const std::vector<std::uint64_t> sizes = {100, 70000, 0, (1 << 20) + 3};
  std::vector<DeviceRange> inputs;
  std::uint64_t acc = kMixStart;
  std::uint64_t at = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const DeviceRange r{buf + at, sizes[k]};
    ASSERT_TRUE(run(4, FillOp{r, 100 + k}));
    acc = mix_step(acc, k, content_hash(pattern(100 + k, sizes[k])));
    inputs.push_back(r);
    at += sizes[k] + 1;
  }
  const DeviceRange out{buf + (3 << 20), 12345};
  ASSERT_TRUE(run(4, ComputeOp{inputs, out, 0, 0}));
  EXPECT_EQ(read(out.addr, out.bytes), pattern(acc, out.bytes));

  // No inputs: the seed is kMixStart itself.
  ASSERT_TRUE(run(4, ComputeOp{{}, out, 0, 0}));
  EXPECT_EQ(read(out.addr, out.bytes), pattern(kMixStart, out.bytes));
}

TEST_P(CudaBackendTest, BatchedCopyMovesEveryPiece) {
  const std::uint64_t n = 1 << 20;
  const std::uint64_t dst = device_buffer(8 * n);
  std::byte* src = pinned(6 * n);
  ASSERT_NE(src, nullptr);
  fill_pattern(31, 0, {src, 6 * n});
  const auto pageable = pattern(32, n);
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(run(5, FillOp{{dst, 8 * n}, 0}));
    BatchCopyToDeviceOp batch;
    for (std::uint64_t i = 0; i < 6; ++i) {
      batch.copies.push_back({{dst + (5 - i) * n, n - i}, src + (5 - i) * n});
    }
    batch.copies.push_back({{dst + 6 * n, 0}, src});  // empty entries are skipped
    batch.copies.push_back({{dst + 7 * n, n}, pageable.data()});
    ASSERT_TRUE(run(5, std::move(batch)));
    const auto got = read(dst, 8 * n);
    for (std::uint64_t i = 0; i < 6; ++i) {
      const auto piece = i * n;
      ASSERT_TRUE(std::equal(src + piece, src + piece + (n - (5 - i)),
                             got.begin() + static_cast<std::ptrdiff_t>(piece)))
          << "round " << round << " piece " << i;
    }
    ASSERT_TRUE(std::equal(pageable.begin(), pageable.end(),
                           got.begin() + static_cast<std::ptrdiff_t>(7 * n)));
  }
  RecordProperty("batched_copy", backend_->info().batched_copy ? "native" : "per-copy fallback");
}

TEST_P(CudaBackendTest, HeldOperationsWaitForAFlush) {
  const std::uint64_t n = 1 << 16;
  const std::uint64_t buf = device_buffer(n);
  std::byte* host = pinned(n);
  ASSERT_NE(host, nullptr);
  std::fill(host, host + n, std::byte{0});

  backend_->set_hold(6, true);
  EXPECT_TRUE(backend_->held(6));
  auto t1 = backend_->enqueue(6, FillOp{{buf, n}, 41});
  auto t2 = backend_->enqueue(6, CopyToHostOp{host, {buf, n}});
  ASSERT_TRUE(t1.ok() && t2.ok());
  EXPECT_EQ(*t1, 1u);
  EXPECT_EQ(*t2, 2u);
  EXPECT_EQ(backend_->submitted(6), 2u);
  // A full device round trip on another stream: had the held ops been issued,
  // they would have run meanwhile. (No sleeping in tests.)
  const std::uint64_t other = device_buffer(n);
  auto probe = backend_->enqueue(7, FillOp{{other, n}, 1});
  ASSERT_TRUE(probe.ok());
  ASSERT_TRUE(backend_->wait({7, *probe}, kForever).ok());
  EXPECT_EQ(backend_->completed(6), 0u);  // never issued
  EXPECT_EQ(std::count(host, host + n, std::byte{0}), static_cast<std::ptrdiff_t>(n));

  ASSERT_TRUE(backend_->flush(6).ok());
  ASSERT_TRUE(backend_->wait({6, 2}, kForever).ok());
  EXPECT_EQ(std::vector<std::byte>(host, host + n), pattern(41, n));
  EXPECT_TRUE(backend_->held(6));  // the hold stays on

  auto t3 = backend_->enqueue(6, FillOp{{buf, n}, 42});
  ASSERT_TRUE(t3.ok());
  EXPECT_EQ(backend_->completed(6), 2u);
  ASSERT_TRUE(backend_->wait({6, 3}, kForever).ok());  // wait dispatches up to its point
  backend_->set_hold(6, false);
  EXPECT_FALSE(backend_->held(6));
  EXPECT_EQ(read(buf, n, 6), pattern(42, n));
}

TEST_P(CudaBackendTest, WaitOpOrdersStreamsAndDispatchesAHeldPoint) {
  const std::uint64_t n = 8 << 20;
  const std::uint64_t buf = device_buffer(n);

  backend_->set_hold(7, true);
  auto fill = backend_->enqueue(7, FillOp{{buf, n}, 51});
  ASSERT_TRUE(fill.ok());
  ASSERT_TRUE(backend_->enqueue(8, WaitOp{{7, *fill}}).ok());
  std::uint64_t h = 0;
  auto hashed = backend_->enqueue(8, HashOp{{buf, n}, &h});
  ASSERT_TRUE(hashed.ok());
  ASSERT_TRUE(backend_->wait({8, *hashed}, kForever).ok());
  EXPECT_EQ(h, content_hash(pattern(51, n)));
  EXPECT_GE(backend_->completed(7), *fill);
  backend_->set_hold(7, false);

  // Without holds: many producer/consumer pairs across two streams.
  for (std::uint64_t i = 0; i < 20; ++i) {
    auto f = backend_->enqueue(9, FillOp{{buf, n}, 60 + i});
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(backend_->enqueue(10, WaitOp{{9, *f}}).ok());
    std::uint64_t got = 0;
    auto t = backend_->enqueue(10, HashOp{{buf, n}, &got});
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(backend_->wait({10, *t}, kForever).ok());
    ASSERT_EQ(got, content_hash(pattern(60 + i, n))) << i;
    // The next fill on stream 9 must not start before stream 10 has read the buffer.
    ASSERT_TRUE(backend_->enqueue(9, WaitOp{{10, *t}}).ok());
  }
}

TEST_P(CudaBackendTest, TicketsCountUpAndComplete) {
  const std::uint64_t buf = device_buffer(1 << 20);
  for (Ticket t = 1; t <= 200; ++t) {
    auto r = t % 2 == 0 ? backend_->enqueue(11, NopOp{}) : backend_->enqueue(11, FillOp{{buf, 1 << 20}, t});
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(*r, t);
  }
  EXPECT_EQ(backend_->submitted(11), 200u);
  ASSERT_TRUE(backend_->synchronize().ok());
  EXPECT_EQ(backend_->completed(11), 200u);
  EXPECT_EQ(read(buf, 1 << 20, 11), pattern(199, 1 << 20));
}

TEST_P(CudaBackendTest, WaitTimesOutOrSucceeds) {
  const std::uint64_t n = 64 << 20;
  const std::uint64_t buf = device_buffer(n);
  auto t = backend_->enqueue(12, HashOp{{buf, n}, reinterpret_cast<std::uint64_t*>(pinned(8))});
  ASSERT_TRUE(t.ok());
  auto w = backend_->wait({12, *t}, std::chrono::nanoseconds(0));
  EXPECT_TRUE(w.ok() || w.error().code == ErrorCode::timeout) << w.error().message;
  EXPECT_EQ(backend_->wait({12, *t + 5}, std::chrono::milliseconds(1)).error().code,
            ErrorCode::invalid_argument);  // never enqueued, as on sim
  EXPECT_TRUE(backend_->wait({12, 0}, std::chrono::nanoseconds(0)).ok());
  EXPECT_TRUE(backend_->wait({12, *t}, kForever).ok());
}

TEST_P(CudaBackendTest, PinnedAndRegisteredMemoryIsCounted) {
  const HostMemoryStats s0 = backend_->host_stats();
  auto p = backend_->allocate_pinned(1 << 20);
  ASSERT_TRUE(p.ok());
  HostMemoryStats s1 = backend_->host_stats();
  EXPECT_EQ(s1.pinned_allocs, s0.pinned_allocs + 1);
  EXPECT_EQ(s1.pinned_bytes, s0.pinned_bytes + (1 << 20));
  ASSERT_TRUE(backend_->free_pinned(*p).ok());
  s1 = backend_->host_stats();
  EXPECT_EQ(s1.pinned_frees, s0.pinned_frees + 1);
  EXPECT_EQ(s1.pinned_bytes, s0.pinned_bytes);
  EXPECT_EQ(backend_->free_pinned(*p).error().code, ErrorCode::invalid_argument);  // double free
  EXPECT_EQ(backend_->allocate_pinned(0).error().code, ErrorCode::invalid_argument);

  std::vector<std::byte> range(1 << 20);
  ASSERT_TRUE(backend_->register_host(range.data(), range.size()).ok());
  EXPECT_EQ(backend_->register_host(range.data() + 4096, 4096).error().code,
            ErrorCode::invalid_argument);
  ASSERT_TRUE(backend_->unregister_host(range.data()).ok());
  EXPECT_EQ(backend_->unregister_host(range.data()).error().code, ErrorCode::invalid_argument);
  const HostMemoryStats s2 = backend_->host_stats();
  EXPECT_EQ(s2.registrations, s0.registrations + 1);
  EXPECT_EQ(s2.unregistrations, s0.unregistrations + 1);
}

TEST_P(CudaBackendTest, BadOperationsAreRejectedAndHarmNothing) {
  const std::uint64_t buf = device_buffer(1 << 16);
  EXPECT_EQ(backend_->enqueue(kMaxStreams, NopOp{}).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(backend_->enqueue(0, FillOp{{buf + granule(), 8}, 1}).error().code,
            ErrorCode::invalid_argument);  // not mapped
  EXPECT_EQ(backend_->enqueue(0, FillOp{{~0ull - 4, 8}, 1}).error().code,
            ErrorCode::invalid_argument);  // overflows
  EXPECT_EQ(backend_->enqueue(0, CopyToDeviceOp{{buf, 8}, nullptr}).error().code,
            ErrorCode::invalid_argument);
  EXPECT_EQ(backend_->enqueue(0, HashOp{{buf, 8}, nullptr}).error().code,
            ErrorCode::invalid_argument);
  EXPECT_EQ(backend_->enqueue(0, WaitOp{{13, 1}}).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(backend_->enqueue(0, CopyOnDeviceOp{{buf, 64}, buf + 32}).error().code,
            ErrorCode::invalid_argument);  // overlapping
  EXPECT_EQ(backend_->submitted(0), 0u);  // no ticket was spent
  ASSERT_TRUE(run(0, FillOp{{buf, 1 << 16}, 3}));
  EXPECT_EQ(read(buf, 1 << 16), pattern(3, 1 << 16));
}

TEST_P(CudaBackendTest, StreamsCanBeDrivenFromSeveralThreads) {
  constexpr int kThreads = 4;
  const std::uint64_t n = 1 << 20;
  const std::uint64_t buf = device_buffer(kThreads * n);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      const auto s = static_cast<StreamId>(20 + i);
      const DeviceRange r{buf + static_cast<std::uint64_t>(i) * n, n};
      for (std::uint64_t round = 0; round < 25; ++round) {
        std::uint64_t h = 0;
        const std::uint64_t seed = 1000 * static_cast<std::uint64_t>(i) + round;
        if (!backend_->enqueue(s, FillOp{r, seed}).ok()) ++wrong;
        auto t = backend_->enqueue(s, HashOp{r, &h});
        if (!t.ok() || !backend_->wait({s, *t}, kForever).ok()) {
          ++wrong;
          continue;
        }
        if (h != content_hash(pattern(seed, n))) ++wrong;
        (void)backend_->completed(static_cast<StreamId>(20 + (i + 1) % kThreads));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Memory, CudaBackendTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("vmm") : std::string("plain");
                         });

}  // namespace
}  // namespace ferry
