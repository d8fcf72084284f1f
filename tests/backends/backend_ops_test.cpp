// What a backend's operations write, checked against the host definitions in
// content.hpp and gemm.hpp (the GEMM is a user op: make_gemm_op). Written once,
// run on every backend (cuda SKIPs without a GPU): sim and a real device must
// produce the same bytes.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "backend_fixture.hpp"
#include "expected_bytes.hpp"
#include "ferry/content.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/gemm.hpp"

namespace ferry {
namespace {

using namespace ferry::testing;  // NOLINT: the test helpers

constexpr auto kForever = std::chrono::nanoseconds::max();

std::vector<GemmShape> with_every_transpose(std::initializer_list<GemmShape> bases) {
  std::vector<GemmShape> out;
  for (GemmShape s : bases) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        s.trans_a = ta;
        s.trans_b = tb;
        out.push_back(s);
      }
    }
  }
  return out;
}

class BackendOpsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = testing::make_backend(GetParam());
    FERRY_REQUIRE_BACKEND(backend_, GetParam());
  }

  void TearDown() override {
    if (!backend_) return;
    EXPECT_TRUE(backend_->synchronize().ok());
    for (const DeviceRange& r : buffers_) {
      EXPECT_TRUE(backend_->unmap(r.addr, r.bytes).ok());
      EXPECT_TRUE(backend_->release_address(r.addr, r.bytes).ok());
    }
  }

  // A mapped device buffer of at least `bytes`, its own reservation.
  std::uint64_t buffer(std::uint64_t bytes) {
    const std::uint64_t g = backend_->info().granularity;
    const std::uint64_t size = (bytes + g - 1) / g * g;
    auto base = backend_->reserve_address(size);
    EXPECT_TRUE(base.ok()) << base.error().message;
    if (!base.ok()) return 0;
    auto m = backend_->map(*base, size);
    EXPECT_TRUE(m.ok()) << m.error().message;
    if (!m.ok()) {
      EXPECT_TRUE(backend_->release_address(*base, size).ok());
      return 0;
    }
    buffers_.push_back({*base, size});
    return *base;
  }

  // Enqueues on stream 0 and waits; false (with a test failure) on any error.
  bool run(Op op) {
    auto t = backend_->enqueue(0, std::move(op));
    EXPECT_TRUE(t.ok()) << t.error().message;
    if (!t.ok()) return false;
    auto w = backend_->wait({0, *t}, kForever);
    EXPECT_TRUE(w.ok()) << w.error().message;
    return w.ok();
  }

  // The GEMM user op over a, b, c, enqueued on stream 0 and waited for.
  bool run_gemm(DeviceRange a, DeviceRange b, DeviceRange c, const GemmShape& s) {
    Result<UserOp> op = make_gemm_op(*backend_, 0, a, b, c, s);
    EXPECT_TRUE(op.ok()) << op.error().message;
    return op.ok() && run(std::move(op).value());
  }

  std::vector<std::byte> read(std::uint64_t addr, std::uint64_t bytes) {
    std::vector<std::byte> out(bytes);
    run(CopyToHostOp{out.data(), {addr, bytes}});
    return out;
  }

  void write(std::uint64_t addr, const std::vector<std::byte>& bytes) {
    run(CopyToDeviceOp{{addr, bytes.size()}, bytes.data()});
  }

  std::unique_ptr<Backend> backend_;
  std::vector<DeviceRange> buffers_;
};

TEST_P(BackendOpsTest, FillWritesSmallBf16AtAnyOffsetAndLength) {
  const std::uint64_t n = 3 * 65536 + 11;  // odd, several hash chunks
  const std::uint64_t base = buffer(n + 16);
  ASSERT_NE(base, 0u);
  ASSERT_TRUE(run(FillOp{{base, n + 16}, 1}));
  ASSERT_TRUE(run(FillOp{{base + 3, n}, 77, Pattern::small_bf16}));
  const std::vector<std::byte> got = read(base, n + 16);
  const std::vector<std::byte> around = pattern(1, n + 16);
  // The range holds small_bf16(77) from its own first byte; its neighbours are untouched.
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + 3, around.begin()));
  const std::vector<std::byte> want = small_bf16(77, n);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + 3));
  EXPECT_TRUE(std::equal(got.begin() + 3 + n, got.end(), around.begin() + 3 + n));

  // One byte: the low byte of element 0.
  ASSERT_TRUE(run(FillOp{{base + 1, 1}, 5, Pattern::small_bf16}));
  EXPECT_EQ(read(base + 1, 1), small_bf16(5, 1));
  // The default pattern is still bytes.
  ASSERT_TRUE(run(FillOp{{base, 4097}, 9}));
  EXPECT_EQ(read(base, 4097), pattern(9, 4097));
}

TEST_P(BackendOpsTest, ComputeWritesTheHostMixInEitherPattern) {
  const std::uint64_t na = 65536 + 5000, nb = 777, nout = 4098;
  const std::uint64_t a = buffer(na), b = buffer(nb), out = buffer(nout);
  ASSERT_TRUE(a != 0 && b != 0 && out != 0);
  ASSERT_TRUE(run(FillOp{{a, na}, 5}));
  ASSERT_TRUE(run(FillOp{{b, nb}, 6, Pattern::small_bf16}));
  std::uint64_t mix = kMixStart;
  mix = mix_step(mix, 0, content_hash(pattern(5, na)));
  mix = mix_step(mix, 1, content_hash(small_bf16(6, nb)));

  ASSERT_TRUE(run(ComputeOp{{{a, na}, {b, nb}}, {out, nout}, 0, 0, Pattern::small_bf16}));
  EXPECT_EQ(read(out, nout), small_bf16(mix, nout));
  ASSERT_TRUE(run(ComputeOp{{{a, na}, {b, nb}}, {out, nout}}));
  EXPECT_EQ(read(out, nout), pattern(mix, nout));
}

TEST_P(BackendOpsTest, ComputeInPlaceSeesTheOldInput) {
  const std::uint64_t n = 2 * 65536 + 3;
  const std::uint64_t a = buffer(n), b = buffer(n);
  ASSERT_TRUE(a != 0 && b != 0);
  ASSERT_TRUE(run(FillOp{{a, n}, 21, Pattern::small_bf16}));
  ASSERT_TRUE(run(FillOp{{b, n}, 22}));
  std::uint64_t mix = kMixStart;
  mix = mix_step(mix, 0, content_hash(small_bf16(21, n)));
  mix = mix_step(mix, 1, content_hash(pattern(22, n)));
  // The output is input 1 itself: an in-place epilogue.
  ASSERT_TRUE(run(ComputeOp{{{a, n}, {b, n}}, {b, n}, 0, 0, Pattern::small_bf16}));
  EXPECT_EQ(read(b, n), small_bf16(mix, n));
  EXPECT_EQ(read(a, n), small_bf16(21, n));
}

TEST_P(BackendOpsTest, GemmOnSmallBf16EqualsTheHostBitForBit) {
  // Non-multiples of 8, single rows and columns, and a long k.
  const std::vector<GemmShape> shapes = with_every_transpose(
      {{8, 8, 8}, {1, 3, 5}, {13, 7, 29}, {64, 40, 72}, {33, 17, 200}, {5, 3, 16384}});
  std::uint64_t most = 0;
  for (const GemmShape& s : shapes) most = std::max({most, s.a_bytes(), s.b_bytes(), s.c_bytes()});
  const std::uint64_t a = buffer(most), b = buffer(most), c = buffer(most);
  ASSERT_TRUE(a != 0 && b != 0 && c != 0);
  std::uint64_t seed = 100;
  for (const GemmShape& s : shapes) {
    const std::uint64_t sa = seed++, sb = seed++;
    ASSERT_TRUE(run(FillOp{{a, s.a_bytes()}, sa, Pattern::small_bf16}));
    ASSERT_TRUE(run(FillOp{{b, s.b_bytes()}, sb, Pattern::small_bf16}));
    ASSERT_TRUE(run(FillOp{{c, s.c_bytes()}, 1}));  // stale bytes the product must replace
    ASSERT_TRUE(run_gemm({a, s.a_bytes()}, {b, s.b_bytes()}, {c, s.c_bytes()}, s));
    const std::vector<std::byte> want = host_gemm(s, small_bf16(sa, s.a_bytes()), small_bf16(sb, s.b_bytes()));
    EXPECT_EQ(plus_zeros(read(c, s.c_bytes())), want) << s.text();
  }
}

TEST_P(BackendOpsTest, GemmOnModerateValuesIsWithinRoundingOfTheHost) {
  const std::vector<GemmShape> shapes = with_every_transpose({{64, 48, 96}, {3, 5, 1000}, {17, 31, 9}});
  std::uint64_t most = 0;
  for (const GemmShape& s : shapes) most = std::max({most, s.a_bytes(), s.b_bytes(), s.c_bytes()});
  const std::uint64_t a = buffer(most), b = buffer(most), c = buffer(most);
  ASSERT_TRUE(a != 0 && b != 0 && c != 0);
  std::uint64_t seed = 500;
  for (const GemmShape& s : shapes) {
    const std::vector<std::byte> ha = random_bf16(seed++, s.a_bytes());
    const std::vector<std::byte> hb = random_bf16(seed++, s.b_bytes());
    write(a, ha);
    write(b, hb);
    ASSERT_TRUE(run_gemm({a, s.a_bytes()}, {b, s.b_bytes()}, {c, s.c_bytes()}, s));
    const std::vector<std::byte> got = read(c, s.c_bytes());
    const std::vector<std::byte> want = host_gemm(s, ha, hb);
    EXPECT_LE(gemm_bf16_max_error(got, want), 1e-2) << s.text();
    if (GetParam() == "sim") {
      EXPECT_EQ(got, want) << s.text();  // sim runs the definition itself
    }
  }
}

TEST_P(BackendOpsTest, MalformedGemmIsRefusedBeforeEnqueueAndHarmsNothing) {
  const GemmShape s{16, 8, 32};
  const std::uint64_t base = buffer(s.a_bytes() + s.b_bytes() + s.c_bytes());
  ASSERT_NE(base, 0u);
  const DeviceRange a{base, s.a_bytes()}, b{base + s.a_bytes(), s.b_bytes()};
  const DeviceRange c{b.addr + b.bytes, s.c_bytes()};
  ASSERT_TRUE(run(FillOp{a, 1, Pattern::small_bf16}));
  ASSERT_TRUE(run(FillOp{b, 2, Pattern::small_bf16}));
  ASSERT_TRUE(run(FillOp{c, 3}));
  const std::vector<std::byte> before = read(base, c.addr + c.bytes - base);
  const Ticket submitted = backend_->submitted(0);

  const auto refused = [&](DeviceRange ga, DeviceRange gb, DeviceRange gc, const GemmShape& g, const char* what) {
    auto t = make_gemm_op(*backend_, 0, ga, gb, gc, g);
    ASSERT_FALSE(t.ok()) << what;
    EXPECT_EQ(t.error().code, ErrorCode::invalid_argument) << what << ": " << t.error().message;
    EXPECT_FALSE(t.error().message.empty()) << what;
  };
  refused({a.addr, a.bytes - 2}, b, c, s, "a too small");
  refused(a, {b.addr, b.bytes + 2}, c, s, "b too large");
  refused(a, b, {c.addr, c.bytes - 1}, s, "c of odd size");
  refused(a, b, c, GemmShape{16, 8, 0}, "k == 0");
  refused(a, b, c, GemmShape{8, 16, 32}, "m and n swapped");
  // c overlapping a or b: the shape fits, the placement does not.
  const GemmShape square{8, 8, 8};
  const DeviceRange sa{base, square.a_bytes()}, sb{base + 1024, square.b_bytes()};  // 128 B each
  refused(sa, sb, sa, square, "c is a");
  refused(sa, sb, sb, square, "c is b");
  refused(sa, sb, {base + 64, square.c_bytes()}, square, "c overlaps the end of a");
  refused(sa, sb, {base + 1024 - 64, square.c_bytes()}, square, "c overlaps the start of b");
  refused({base + 1, square.a_bytes()}, sb, {base + 2048, square.c_bytes()}, square, "a at an odd address");
  refused(sa, sb, {base + 2049, square.c_bytes()}, square, "c at an odd address");

  EXPECT_EQ(backend_->submitted(0), submitted);  // no ticket consumed
  ASSERT_TRUE(backend_->synchronize().ok());
  EXPECT_EQ(read(base, c.addr + c.bytes - base), before);
  // The backend still works.
  ASSERT_TRUE(run_gemm(a, b, c, s));
  EXPECT_EQ(read(c.addr, c.bytes), host_gemm(s, small_bf16(1, a.bytes), small_bf16(2, b.bytes)));
}

TEST_P(BackendOpsTest, PoolEnqueuesCarryThePattern) {
  StreamOrder order(*backend_);
  DevicePool pool(order);
  const std::uint64_t n = 10'001;
  auto in = pool.allocate(n, 0);
  auto out = pool.allocate(n, 0);
  ASSERT_TRUE(in.ok() && out.ok());
  ASSERT_TRUE(enqueue_fill(pool, 0, *in, 31, Pattern::small_bf16).ok());
  const DeviceHandle inputs[] = {*in};
  ASSERT_TRUE(enqueue_compute(pool, 0, inputs, *out, 0, 0, Pattern::small_bf16).ok());
  std::vector<std::byte> got_in(n), got_out(n);
  ASSERT_TRUE(enqueue_copy_to_host(pool, 0, *in, got_in).ok());
  auto t = enqueue_copy_to_host(pool, 0, *out, got_out);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(order.wait({0, *t}).ok());
  EXPECT_EQ(got_in, small_bf16(31, n));
  EXPECT_EQ(got_out, small_bf16(mix_step(kMixStart, 0, content_hash(small_bf16(31, n))), n));
  ASSERT_TRUE(pool.free(*in).ok());
  ASSERT_TRUE(pool.free(*out).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendOpsTest, FERRY_BACKENDS);

}  // namespace
}  // namespace ferry
