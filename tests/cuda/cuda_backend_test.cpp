// The CUDA backend on a real device. Every test that needs a GPU reports SKIP when
// make_cuda_backend() answers `unsupported` (no device, no driver, or no backend in
// this build). Each runs twice: with virtual memory management and with the plain
// allocation fallback (forced by FERRY_CUDA_VMM=0).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "expected_bytes.hpp"
#include "ferry/content.hpp"
#include "ferry/cuda_backend.hpp"
#include "ferry/gemm.hpp"

namespace ferry {
namespace {

using namespace ferry::testing;  // NOLINT: the test helpers

constexpr auto kForever = std::chrono::nanoseconds::max();

// The four combinations of transposes for one m x n x k.
std::vector<GemmShape> all_transposes(std::uint32_t m, std::uint32_t n, std::uint32_t k) {
  return {{m, n, k, false, false}, {m, n, k, true, false}, {m, n, k, false, true},
          {m, n, k, true, true}};
}

TEST(CudaBackendFactory, IsBuiltAndAnswersPlainlyWithoutADevice) {
  auto r = make_cuda_backend({});
  if (r.ok()) {
    EXPECT_EQ(r.value()->info().backend, BackendKind::cuda);
    return;
  }
  // Without the backend in the build the answer is also `unsupported`.
  EXPECT_EQ(r.error().code, ErrorCode::unsupported) << r.error().message;
  if (cuda_backend_built()) {
    EXPECT_NE(r.error().message.find("no CUDA device or driver found"), std::string::npos)
        << r.error().message;
    // Not the runtime's "driver version is insufficient", which sends people to
    // upgrade a driver that is not there.
    EXPECT_EQ(r.error().message.find("insufficient"), std::string::npos) << r.error().message;
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
    // Each variant proves the path it is named after: /vmm must really map granules
    // through the driver, /plain must really be the cudaMalloc fallback.
    if (GetParam()) {
      ASSERT_TRUE(backend_->info().virtual_memory)
          << "the /vmm variant runs without virtual memory management (FERRY_CUDA_VERBOSE=1 says why)";
    } else {
      ASSERT_FALSE(backend_->info().virtual_memory) << "FERRY_CUDA_VMM=0 did not select the fallback";
    }
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

  // a, b and c of `g` one after another from `base`, each 256-byte aligned.
  static std::array<DeviceRange, 3> gemm_ranges(std::uint64_t base, const GemmShape& g) {
    const auto up = [](std::uint64_t x) { return (x + 255) / 256 * 256; };
    const DeviceRange a{base, g.a_bytes()};
    const DeviceRange b{up(a.addr + a.bytes), g.b_bytes()};
    const DeviceRange c{up(b.addr + b.bytes), g.c_bytes()};
    return {a, b, c};
  }
  static std::uint64_t gemm_span(const GemmShape& g) {
    const auto r = gemm_ranges(0, g);
    return r[2].addr + r[2].bytes;
  }

  // The GEMM user op (gemm.hpp) for stream s; a NopOp, and a failure, if refused.
  Op gemm(StreamId s, const std::array<DeviceRange, 3>& r, const GemmShape& g) {
    Result<UserOp> op = make_gemm_op(*backend_, s, r[0], r[1], r[2], g);
    EXPECT_TRUE(op.ok()) << op.error().message;
    if (!op.ok()) return NopOp{};
    return std::move(op).value();
  }

  // Fills a and b with small_bf16 (seeds sa, sb) and c with bytes, then runs the
  // GEMM, all on stream s; false (with a failure) on any error.
  bool gemm_small_bf16(StreamId s, const std::array<DeviceRange, 3>& r, const GemmShape& g,
                       std::uint64_t sa, std::uint64_t sb) {
    return run(s, FillOp{r[0], sa, Pattern::small_bf16}) &&
           run(s, FillOp{r[1], sb, Pattern::small_bf16}) && run(s, FillOp{r[2], 1}) &&
           run(s, gemm(s, r, g));
  }

  std::unique_ptr<Backend> backend_;
  std::vector<DeviceRange> reservations_;
  std::vector<std::byte*> pinned_;
};

TEST_P(CudaBackendTest, DescribesTheDevice) {
  const DeviceInfo& info = backend_->info();
  EXPECT_EQ(info.backend, BackendKind::cuda);
  EXPECT_FALSE(info.modeled_time);
  EXPECT_FALSE(info.device.empty());
  EXPECT_GT(info.capacity, 0u);
  EXPECT_GT(info.granularity, 0u);
  EXPECT_EQ(info.granularity & (info.granularity - 1), 0u);
  EXPECT_GT(info.h2d_bytes_per_s, 0);
  EXPECT_GT(info.mem_bytes_per_s, 0);
  EXPECT_GT(info.flops_per_s, 0);
  EXPECT_EQ(info.virtual_memory, GetParam());
  // The pool's default capacity: free memory at start, less a margin, never the card.
  EXPECT_GT(info.available, 0u);
  EXPECT_LT(info.available, info.capacity);
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

// Bounded on a 141 GB device: the run past the device's memory is refused before a
// granule is created (tests/cuda/address_space_test.cpp checks that no driver call is
// made, and that a run the driver fails part-way leaves nothing behind); the address
// space past the end is still usable, granule by granule.
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
  ASSERT_TRUE(backend_->map(*base, g).ok());             // nothing was taken from the driver
  ASSERT_TRUE(backend_->map(*base + size - g, g).ok());  // one granule past the device's size
  EXPECT_EQ(backend_->mapped_bytes(), before + 2 * g);
  ASSERT_TRUE(backend_->release_address(*base, size).ok());
  EXPECT_EQ(backend_->mapped_bytes(), before);
}

TEST_P(CudaBackendTest, FillWritesThePatternAndNothingElse) {
  const std::uint64_t buf = device_buffer(8 << 20);
  for (const Pattern p : {Pattern::bytes, Pattern::small_bf16}) {
    for (const std::uint64_t offset : {0ull, 2ull, 3ull}) {
      for (const std::uint64_t n : {1ull, 2ull, 7ull, 8ull, 9ull, 4099ull, (3ull << 20) + 5}) {
        ASSERT_TRUE(run(0, FillOp{{buf, 8 << 20}, 1}));
        ASSERT_TRUE(run(0, FillOp{{buf + offset, n}, 77, p}));
        const auto got = read(buf, offset + n + 64);
        const auto background = pattern(1, offset + n + 64);
        const auto expected = p == Pattern::bytes ? pattern(77, n) : small_bf16(77, n);
        ASSERT_TRUE(std::equal(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(offset),
                               background.begin()));
        ASSERT_TRUE(std::equal(expected.begin(), expected.end(),
                               got.begin() + static_cast<std::ptrdiff_t>(offset)))
            << "pattern " << static_cast<int>(p) << " offset " << offset << " n " << n;
        ASSERT_TRUE(std::equal(got.end() - 64, got.end(), background.end() - 64));
      }
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

// The native batched path (cudaMemcpyBatchAsync): fails when the start-up probe
// disabled it or when the device refused a batch and the copies went one by one.
TEST_P(CudaBackendTest, BatchedCopyMovesEveryPiece) {
  ASSERT_TRUE(backend_->info().batched_copy)
      << "the batched-copy probe failed at start-up (FERRY_CUDA_VERBOSE=1 says why)";
  const std::uint64_t fallbacks = backend_->fault_counters().batch_fallbacks;
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
  EXPECT_EQ(backend_->fault_counters().batch_fallbacks, fallbacks)
      << "cudaMemcpyBatchAsync refused the batch: the bytes came per copy, not batched";
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

// A WaitOp on a held point blocks its stream until the point is dispatched; it
// never breaks the hold (holding_backend.hpp), and a host wait that needs the
// held work answers at once.
TEST_P(CudaBackendTest, WaitOpOrdersStreamsAndBlocksBehindAHeldPoint) {
  const std::uint64_t n = 8 << 20;
  const std::uint64_t buf = device_buffer(n);

  backend_->set_hold(7, true);
  auto fill = backend_->enqueue(7, FillOp{{buf, n}, 51});
  ASSERT_TRUE(fill.ok());
  ASSERT_TRUE(backend_->enqueue(8, WaitOp{{7, *fill}}).ok());
  std::uint64_t h = 0;
  auto hashed = backend_->enqueue(8, HashOp{{buf, n}, &h});
  ASSERT_TRUE(hashed.ok());
  const auto blocked = backend_->wait({8, *hashed}, kForever);
  ASSERT_FALSE(blocked.ok());
  EXPECT_EQ(blocked.error().code, ErrorCode::timeout);
  EXPECT_NE(blocked.error().message.find("held"), std::string::npos) << blocked.error().message;
  EXPECT_EQ(backend_->completed(7), 0u);
  backend_->set_hold(7, false);
  ASSERT_TRUE(backend_->wait({8, *hashed}, kForever).ok());
  EXPECT_EQ(h, content_hash(pattern(51, n)));

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

// A zero-timeout wait on work that cannot have finished answers `timeout` at once
// (the hash waits on a held point of another stream, so it cannot have run), and a
// finite wait on the same work, once released, succeeds well inside its timeout.
TEST_P(CudaBackendTest, WaitWithZeroTimeoutOnUnfinishedWorkTimesOutAtOnce) {
  const std::uint64_t n = 64 << 20;
  const std::uint64_t buf = device_buffer(n);
  backend_->set_hold(13, true);
  auto gate = backend_->enqueue(13, NopOp{});
  ASSERT_TRUE(gate.ok());
  ASSERT_TRUE(backend_->enqueue(12, WaitOp{{13, *gate}}).ok());
  auto t = backend_->enqueue(12, HashOp{{buf, n}, reinterpret_cast<std::uint64_t*>(pinned(8))});
  ASSERT_TRUE(t.ok());
  const auto started = std::chrono::steady_clock::now();
  auto w = backend_->wait({12, *t}, std::chrono::nanoseconds(0));
  ASSERT_FALSE(w.ok()) << "a wait on work behind a held point succeeded";
  EXPECT_EQ(w.error().code, ErrorCode::timeout) << w.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(1));
  EXPECT_EQ(backend_->wait({12, *t + 5}, std::chrono::milliseconds(1)).error().code,
            ErrorCode::invalid_argument);  // never enqueued, as on sim
  EXPECT_TRUE(backend_->wait({12, 0}, std::chrono::nanoseconds(0)).ok());
  backend_->set_hold(13, false);
  const Result<void> done = backend_->wait({12, *t}, std::chrono::seconds(30));
  EXPECT_TRUE(done.ok()) << done.error().message;  // the device's own wait, not the hold layer's
  EXPECT_EQ(backend_->completed(12), *t);
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

TEST_P(CudaBackendTest, ComputeWritesEitherPatternAndMayWriteOverAnInput) {
  const std::uint64_t buf = device_buffer(4 << 20);
  const DeviceRange in0{buf, 70000};
  const DeviceRange in1{buf + (1 << 20), (1 << 20) + 3};
  const DeviceRange out{buf + (3 << 20), 12345};
  for (const Pattern p : {Pattern::bytes, Pattern::small_bf16}) {
    ASSERT_TRUE(run(4, FillOp{in0, 200}));
    ASSERT_TRUE(run(4, FillOp{in1, 201, Pattern::small_bf16}));
    std::uint64_t acc = kMixStart;
    acc = mix_step(acc, 0, content_hash(pattern(200, in0.bytes)));
    acc = mix_step(acc, 1, content_hash(small_bf16(201, in1.bytes)));
    std::vector<std::byte> expected(out.bytes);
    fill_with(p, acc, 0, expected);
    ASSERT_TRUE(run(4, ComputeOp{{in0, in1}, out, 0, 0, p}));
    EXPECT_EQ(read(out.addr, out.bytes), expected) << static_cast<int>(p);

    // In place: the output is the second input, then the tail of the first. The
    // inputs are hashed as they were before the kernel writes.
    ASSERT_TRUE(run(4, ComputeOp{{in0, in1}, in1, 0, 0, p}));
    std::vector<std::byte> whole(in1.bytes);
    fill_with(p, acc, 0, whole);
    EXPECT_EQ(read(in1.addr, in1.bytes), whole) << static_cast<int>(p);
    ASSERT_TRUE(run(4, FillOp{in1, 201, Pattern::small_bf16}));
    const DeviceRange part{in0.addr + 60000, 10000};
    std::vector<std::byte> tail(part.bytes);
    fill_with(p, acc, 0, tail);
    ASSERT_TRUE(run(4, ComputeOp{{in0, in1}, part, 0, 0, p}));
    EXPECT_EQ(read(part.addr, part.bytes), tail) << static_cast<int>(p);
  }
}

// small_bf16 operands sum exactly in FP32, so cuBLAS must match the host to the bit
// whatever order it sums in (content.hpp), k = 16384 and split-k included.
TEST_P(CudaBackendTest, GemmOfSmallBf16EqualsTheHostBitForBit) {
  const std::vector<std::array<std::uint32_t, 3>> sizes = {
      {1, 1, 1},    {7, 9, 13},  {8, 8, 8},      {33, 17, 65},    {1, 300, 77},
      {128, 96, 256}, {300, 200, 1030}, {5, 3, 16384}, {72, 40, 16384}};
  const std::uint64_t buf = device_buffer(16 << 20);
  std::uint64_t seed = 300;
  for (const auto& [m, n, k] : sizes) {
    for (const GemmShape& g : all_transposes(m, n, k)) {
      ASSERT_LE(gemm_span(g), 16u << 20);
      const auto r = gemm_ranges(buf, g);
      seed += 2;
      ASSERT_TRUE(gemm_small_bf16(14, r, g, seed, seed + 1)) << g.text();
      const auto expected = host_gemm(g, small_bf16(seed, g.a_bytes()), small_bf16(seed + 1, g.b_bytes()));
      const auto got = plus_zeros(read(r[2].addr, r[2].bytes, 14));
      ASSERT_EQ(got, expected) << first_difference(g, got, expected);
    }
  }
}

// Arbitrary values round in FP32 in cuBLAS's order: equal to the host up to one bf16
// rounding step of the result.
TEST_P(CudaBackendTest, GemmOfRandomBf16IsCloseToTheHost) {
  const std::uint64_t buf = device_buffer(16 << 20);
  std::uint64_t seed = 400;
  for (const auto& [m, n, k] :
       std::vector<std::array<std::uint32_t, 3>>{{64, 48, 512}, {257, 129, 4096}, {3, 500, 9}}) {
    for (const GemmShape& g : all_transposes(m, n, k)) {
      const auto r = gemm_ranges(buf, g);
      const auto a = random_bf16(++seed, g.a_bytes());
      const auto b = random_bf16(++seed, g.b_bytes());
      ASSERT_TRUE(run(15, CopyToDeviceOp{r[0], a.data()}));
      ASSERT_TRUE(run(15, CopyToDeviceOp{r[1], b.data()}));
      ASSERT_TRUE(run(15, gemm(15, r, g)));
      const auto expected = host_gemm(g, a, b);
      const auto got = read(r[2].addr, r[2].bytes, 15);
      EXPECT_LE(gemm_bf16_max_error(got, expected), 1e-2) << first_difference(g, got, expected);
      EXPECT_NE(std::count(got.begin(), got.end(), std::byte{0}),
                static_cast<std::ptrdiff_t>(got.size()));
    }
  }
}

// Each stream has its own cuBLAS handle and workspace: GEMMs enqueued from two
// threads on two streams, all in flight together, each equal to the host.
TEST_P(CudaBackendTest, GemmsOnTwoStreamsAtOnceAreBothRight) {
  constexpr int kRounds = 3;
  const GemmShape shapes[2] = {{384, 320, 2048, false, true}, {320, 384, 2048, true, false}};
  std::array<std::uint64_t, 2> base{};
  for (int t = 0; t < 2; ++t) base[t] = device_buffer(kRounds * gemm_span(shapes[t]));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      const auto s = static_cast<StreamId>(16 + t);
      const GemmShape& g = shapes[t];
      Ticket last = 0;
      for (int round = 0; round < kRounds; ++round) {
        const auto r = gemm_ranges(base[t] + round * gemm_span(g), g);
        const std::uint64_t seed = 500 + 10 * t + 2 * round;
        for (Op op : {Op{FillOp{r[0], seed, Pattern::small_bf16}},
                      Op{FillOp{r[1], seed + 1, Pattern::small_bf16}},
                      gemm(s, r, g)}) {
          auto ticket = backend_->enqueue(s, std::move(op));
          if (!ticket.ok()) {
            ADD_FAILURE() << ticket.error().message;
            ++failures;
            return;
          }
          last = *ticket;
        }
      }
      if (!backend_->wait({s, last}, kForever).ok()) ++failures;
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  for (int t = 0; t < 2; ++t) {
    const GemmShape& g = shapes[t];
    for (int round = 0; round < kRounds; ++round) {
      const auto r = gemm_ranges(base[t] + round * gemm_span(g), g);
      const std::uint64_t seed = 500 + 10 * t + 2 * round;
      const auto expected = host_gemm(g, small_bf16(seed, g.a_bytes()), small_bf16(seed + 1, g.b_bytes()));
      const auto got = plus_zeros(read(r[2].addr, r[2].bytes));
      ASSERT_EQ(got, expected) << "stream " << t << " round " << round << ": "
                               << first_difference(g, got, expected);
    }
  }
}

TEST_P(CudaBackendTest, HeldGemmRunsOnlyAfterAFlush) {
  const GemmShape g{96, 80, 4096, true, true};
  const std::uint64_t buf = device_buffer(gemm_span(g));
  const auto r = gemm_ranges(buf, g);
  ASSERT_TRUE(run(18, FillOp{r[0], 600, Pattern::small_bf16}));
  ASSERT_TRUE(run(18, FillOp{r[1], 601, Pattern::small_bf16}));
  ASSERT_TRUE(run(18, FillOp{r[2], 602}));

  backend_->set_hold(18, true);
  auto t = backend_->enqueue(18, gemm(18, r, g));
  ASSERT_TRUE(t.ok()) << t.error().message;
  // A device round trip on another stream: an issued GEMM would have run meanwhile.
  EXPECT_EQ(read(r[2].addr, r[2].bytes, 19), pattern(602, r[2].bytes));
  EXPECT_LT(backend_->completed(18), *t);

  ASSERT_TRUE(backend_->flush(18).ok());
  ASSERT_TRUE(backend_->wait({18, *t}, kForever).ok());
  backend_->set_hold(18, false);
  const auto expected = host_gemm(g, small_bf16(600, g.a_bytes()), small_bf16(601, g.b_bytes()));
  const auto got = plus_zeros(read(r[2].addr, r[2].bytes, 18));
  EXPECT_EQ(got, expected) << first_difference(g, got, expected);
}

TEST_P(CudaBackendTest, BadGemmsAreRejectedAtEnqueue) {
  const GemmShape g{16, 24, 40};
  const std::uint64_t buf = device_buffer(1 << 16);
  const auto r = gemm_ranges(buf, g);
  const auto [a, b, c] = r;
  // make_gemm_op's refusals, or the backend's at enqueue (memory not mapped).
  const auto rejected = [&](DeviceRange ga, DeviceRange gb, DeviceRange gc, const GemmShape& shape) {
    Result<UserOp> op = make_gemm_op(*backend_, 20, ga, gb, gc, shape);
    const Result<Ticket> t = op.ok() ? backend_->enqueue(20, std::move(op).value()) : Result<Ticket>(op.error());
    return t.ok() ? std::string("accepted")
                  : t.error().code == ErrorCode::invalid_argument ? std::string()
                                                                   : t.error().message;
  };
  EXPECT_EQ(rejected({a.addr, a.bytes - 2}, b, c, g), "");  // a's size is not the shape's
  EXPECT_EQ(rejected(a, {b.addr, b.bytes + 2}, c, g), "");
  EXPECT_EQ(rejected(a, b, {c.addr, c.bytes - 2}, g), "");
  EXPECT_EQ(rejected(a, b, c, GemmShape{0, 24, 40}), "");  // an empty shape
  EXPECT_EQ(rejected(a, b, {a.addr + 64, c.bytes}, g), "");  // c overlaps a
  EXPECT_EQ(rejected(a, b, {b.addr + b.bytes - 2, c.bytes}, g), "");  // c overlaps b
  EXPECT_EQ(rejected(a, b, {buf + granule(), c.bytes}, g), "");  // c is not mapped
  EXPECT_EQ(rejected({a.addr + 1, a.bytes}, b, c, g), "");  // a is misaligned
  EXPECT_EQ(backend_->submitted(20), 0u);  // no ticket was spent

  ASSERT_TRUE(gemm_small_bf16(20, r, g, 700, 701));
  EXPECT_EQ(plus_zeros(read(c.addr, c.bytes, 20)),
            host_gemm(g, small_bf16(700, g.a_bytes()), small_bf16(701, g.b_bytes())));
}

// cublasGemmEx takes int dimensions: a wider m or n is refused before anything is
// enqueued (the ranges need not exist: nothing reads them).
TEST_P(CudaBackendTest, GemmWithMOrNOf2To31IsUnsupported) {
  const std::uint64_t buf = device_buffer(1 << 16);
  for (const GemmShape& g : {GemmShape{1u << 31, 1, 1}, GemmShape{1, 1u << 31, 1}}) {
    const DeviceRange a{buf, g.a_bytes()}, b{buf, g.b_bytes()}, c{buf + (8ull << 32), g.c_bytes()};
    const Result<UserOp> op = make_gemm_op(*backend_, 21, a, b, c, g);
    ASSERT_FALSE(op.ok()) << g.text();
    EXPECT_EQ(op.error().code, ErrorCode::unsupported) << op.error().message;
    EXPECT_NE(op.error().message.find("below 2^31"), std::string::npos) << op.error().message;
  }
  EXPECT_EQ(backend_->submitted(21), 0u);
}

// The cuBLAS handle is made for the stream's native stream at make_gemm_op and
// dropped when an adopted stream is released: a GEMM made for it and run after
// fails as a value (its ticket completes with the error), never on a stale handle.
TEST_P(CudaBackendTest, GemmOnAnAdoptedStreamUsesItsHandleUntilReleased) {
  // A program's stream: one that a second backend made (this test has no CUDA headers).
  auto other = make_cuda_backend({});
  ASSERT_TRUE(other.ok()) << other.error().message;
  auto mine = (*other)->native_stream(0);
  ASSERT_TRUE(mine.ok()) << mine.error().message;
  const GemmShape g{32, 16, 64};
  const auto r = gemm_ranges(device_buffer(gemm_span(g)), g);
  auto id = backend_->adopt_stream(*mine);
  ASSERT_TRUE(id.ok()) << id.error().message;
  ASSERT_TRUE(gemm_small_bf16(*id, r, g, 800, 801));
  EXPECT_EQ(plus_zeros(read(r[2].addr, r[2].bytes, *id)),
            host_gemm(g, small_bf16(800, g.a_bytes()), small_bf16(801, g.b_bytes())));
  Op stale = gemm(*id, r, g);  // its handle is bound to `mine`
  ASSERT_TRUE(backend_->release_stream(*id, std::chrono::seconds(10)).ok());
  auto t = backend_->enqueue(*id, std::move(stale));  // now on a ferry stream of its own
  ASSERT_TRUE(t.ok()) << t.error().message;
  const Result<void> w = backend_->wait({*id, *t}, kForever);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code, ErrorCode::backend_error) << w.error().message;
  EXPECT_NE(w.error().message.find("no cuBLAS handle"), std::string::npos) << w.error().message;
  // The stream's fault is sticky (user_kernel.hpp): end with this backend here.
  for (const DeviceRange& res : reservations_) EXPECT_TRUE(backend_->release_address(res.addr, res.bytes).ok());
  reservations_.clear();
  backend_.reset();
}

INSTANTIATE_TEST_SUITE_P(Memory, CudaBackendTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("vmm") : std::string("plain");
                         });

}  // namespace
}  // namespace ferry
