// Randomized model test: long seeded sequences of alloc / free / fill / compute /
// user op (random access marks) / hold / release / sync / trim on several streams
// under pool pressure. A host
// reference model predicts every buffer's bytes; after every sync the device
// bytes are compared with it, and validate() runs after every operation.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>

#include "backend_fixture.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/user_op.hpp"
#include "pool_helpers.hpp"
#include "program_kernels.hpp"

namespace ferry {
namespace {

using testing::mix_bytes;
using testing::pattern;

constexpr StreamId kStreams = 3;

struct Buffer {
  DeviceHandle handle;
  std::uint64_t bytes = 0;
  StreamId owner = 0;
  std::optional<std::vector<std::byte>> expect;  // nullopt: never written
  UseSet touched;  // enqueued work on it, for the model's own hazard rules
};

class Model {
 public:
  Model(Backend& backend, std::uint64_t seed, std::uint64_t capacity)
      : backend_(backend), order_(backend), pool_(order_, options(capacity)), rng_(seed) {}

  static PoolOptions options(std::uint64_t capacity) {
    PoolOptions o;
    o.capacity = capacity;
    o.release_threshold = 1 << 20;
    return o;
  }

  void step() {
    const auto dice = static_cast<unsigned>(rng_() % 100);
    if (dice < 22) alloc();
    else if (dice < 40) free_one();
    else if (dice < 58) fill();
    else if (dice < 66) compute();
    else if (dice < 74) user_op();
    else if (dice < 82) hold_or_release();
    else if (dice < 95) sync();
    else trim();
    std::string why;
    ASSERT_TRUE(pool_.validate(&why)) << why;
  }

  void finish() {
    for (StreamId s = 0; s < kStreams; ++s) backend_.set_hold(s, false);
    ASSERT_TRUE(backend_.synchronize().ok());
    check_all();
    for (auto& [id, b] : buffers_) ASSERT_TRUE(pool_.free(b.handle).ok());
    buffers_.clear();
    ASSERT_TRUE(backend_.synchronize().ok());
    ASSERT_TRUE(pool_.trim().ok());
    const PoolStats s = pool_.stats();
    EXPECT_EQ(s.allocated_bytes, 0u);
    EXPECT_EQ(s.pending_free_bytes, 0u);
    EXPECT_EQ(s.reserved_bytes, 0u);
  }

  std::uint64_t checks() const { return checks_; }
  std::uint64_t user_ops() const { return user_ops_; }
  PoolStats stats() const { return pool_.stats(); }

 private:
  StreamId any_stream() { return static_cast<StreamId>(rng_() % kStreams); }

  Buffer* pick() {
    if (buffers_.empty()) return nullptr;
    auto it = buffers_.begin();
    std::advance(it, static_cast<long>(rng_() % buffers_.size()));
    return &it->second;
  }

  // The model's hazard rule (not the pool's): work on stream s may touch a buffer
  // only when everything other streams enqueued on it has completed, so the
  // reference order is the device order.
  bool usable_on(Buffer& b, StreamId s) {
    for (const StreamPoint& p : b.touched.points())
      if (p.stream != s && !order_.is_complete(p)) return false;
    return true;
  }

  void alloc() {
    const std::uint64_t bytes = 256 + rng_() % (rng_() % 4 == 0 ? 3 << 20 : 96 << 10);
    auto h = pool_.allocate(bytes, any_stream());
    if (!h.ok()) {
      ASSERT_EQ(h.error().code, ErrorCode::out_of_memory) << h.error().message;
      return;
    }
    buffers_[next_id_++] = Buffer{*h, bytes, 0, std::nullopt, {}};
  }

  void free_one() {
    if (buffers_.empty()) return;
    auto it = buffers_.begin();
    std::advance(it, static_cast<long>(rng_() % buffers_.size()));
    ASSERT_TRUE(pool_.free(it->second.handle).ok());  // legal with work in flight (I3)
    buffers_.erase(it);
  }

  void fill() {
    Buffer* b = pick();
    if (!b) return;
    const StreamId s = any_stream();
    if (!usable_on(*b, s)) return;
    const std::uint64_t seed = rng_();
    auto t = enqueue_fill(pool_, s, b->handle, seed);
    ASSERT_TRUE(t.ok()) << t.error().message;
    b->touched.add({s, *t});
    b->expect = pattern(seed, b->bytes);
  }

  void compute() {
    const StreamId s = any_stream();
    Buffer* out = pick();
    if (!out || !usable_on(*out, s)) return;
    std::vector<Buffer*> ins;
    for (unsigned k = 0, n = 1 + static_cast<unsigned>(rng_() % 3); k < n; ++k) {
      Buffer* in = pick();
      if (!in || in == out || !usable_on(*in, s)) return;
      ins.push_back(in);
    }
    std::vector<DeviceHandle> handles;
    for (Buffer* in : ins) handles.push_back(in->handle);
    auto t = enqueue_compute(pool_, s, handles, out->handle);
    ASSERT_TRUE(t.ok()) << t.error().message;
    bool known = true;
    std::vector<std::vector<std::byte>> in_bytes;
    for (Buffer* in : ins) {
      in->touched.add({s, *t});
      if (!in->expect) known = false;
      else in_bytes.push_back(*in->expect);
    }
    out->touched.add({s, *t});
    if (known) out->expect = mix_bytes(in_bytes, out->bytes);
    else out->expect.reset();
  }

  // The program's kernel: every writable operand but the first readable one gets
  // that one's bytes (or `value` when none is readable). Operands are [0, len) of
  // distinct buffers.
  static Result<void> kernel(const KernelLaunch& l, unsigned char value) {
    std::optional<std::size_t> src;
    for (std::size_t i = 0; i < l.args.size() && !src; ++i) {
      if (reads(l.args[i].access)) src = i;
    }
    for (std::size_t i = 0; i < l.args.size(); ++i) {
      if (!writes(l.args[i].access) || i == src) continue;
      FERRY_TRY(src ? testing::copy_operand(l, i, *src) : testing::set_operand(l, i, value));
    }
    return {};
  }

  void user_op() {
    const StreamId s = any_stream();
    std::vector<Buffer*> bufs;
    for (unsigned k = 0, n = 1 + static_cast<unsigned>(rng_() % 3); k < n; ++k) {
      Buffer* b = pick();
      if (!b || !usable_on(*b, s) || std::find(bufs.begin(), bufs.end(), b) != bufs.end()) return;
      bufs.push_back(b);
    }
    std::uint64_t len = UINT64_MAX;
    for (Buffer* b : bufs) len = std::min(len, b->bytes);
    std::vector<Operand> operands;
    for (Buffer* b : bufs) operands.push_back({b->handle, static_cast<Access>(rng_() % 3), 0, len});
    const auto value = static_cast<unsigned char>(rng_());
    auto t = enqueue_user(pool_, s, operands, [value](const KernelLaunch& l) { return kernel(l, value); });
    ASSERT_TRUE(t.ok()) << t.error().message;
    // The reference: the same rule on the expected bytes.
    std::optional<std::size_t> src;
    for (std::size_t i = 0; i < operands.size() && !src; ++i) {
      if (reads(operands[i].access)) src = i;
    }
    std::optional<std::vector<std::byte>> written = std::vector<std::byte>(len, std::byte{value});
    if (src) {
      written = bufs[*src]->expect ? std::optional(std::vector<std::byte>(bufs[*src]->expect->begin(),
                                                                          bufs[*src]->expect->begin() + len))
                                   : std::nullopt;
    }
    for (std::size_t i = 0; i < operands.size(); ++i) {
      Buffer& b = *bufs[i];
      b.touched.add({s, *t});
      if (!writes(operands[i].access) || i == src) continue;
      if (!written || (!b.expect && len < b.bytes)) {
        b.expect.reset();  // part or all of it is not known any more
      } else if (!b.expect) {
        b.expect = *written;
      } else {
        std::copy(written->begin(), written->end(), b.expect->begin());
      }
    }
    ++user_ops_;
  }

  void hold_or_release() {
    const StreamId s = any_stream();
    backend_.set_hold(s, !backend_.held(s));
  }

  void sync() {
    if (rng_() % 3 == 0) {
      ASSERT_TRUE(backend_.synchronize().ok());
      check_all();
    } else {
      const StreamId s = any_stream();
      ASSERT_TRUE(order_.wait({s, backend_.submitted(s)}).ok());
    }
  }

  void trim() { ASSERT_TRUE(pool_.trim().ok()); }

  void check_all() {
    for (auto& [id, b] : buffers_) {
      if (!b.expect) continue;
      auto got = testing::read_back(pool_, b.handle, 0);
      ASSERT_TRUE(got.ok()) << got.error().message;
      ASSERT_EQ(*got, *b.expect) << "buffer " << id << " (" << b.bytes << " B) holds wrong bytes";
      b.touched.add({0, backend_.submitted(0)});
      ++checks_;
    }
  }

  Backend& backend_;
  StreamOrder order_;
  DevicePool pool_;
  std::mt19937_64 rng_;
  std::map<int, Buffer> buffers_;
  int next_id_ = 0;
  std::uint64_t checks_ = 0;
  std::uint64_t user_ops_ = 0;
};

class DevicePoolModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DevicePoolModelTest, RandomTrafficUnderPressureKeepsEveryByte) {
  std::uint64_t tight_fits = 0;
  for (std::uint64_t seed : {1u, 2u, 3u, 4u}) {
    // On sim the race checker watches too: the model's hazard rule and the pool's
    // orderings must leave no unordered conflicting access.
    BackendSpec spec = testing::backend_spec(GetParam(), {}, seed);
    spec.race_check = spec.kind == BackendKind::sim;
    auto made = make_backend(spec);
    if (!made.ok()) testing::last_backend_error() = made.error();  // what FERRY_REQUIRE_BACKEND reads
    std::unique_ptr<Backend> backend = made.ok() ? std::move(made).value() : nullptr;
    FERRY_REQUIRE_BACKEND(backend, GetParam());
    Model m(*backend, seed, 12 << 20);
    for (int i = 0; i < 1500; ++i) {
      ASSERT_NO_FATAL_FAILURE(m.step()) << "seed " << seed << " step " << i;
    }
    ASSERT_NO_FATAL_FAILURE(m.finish());
    if (::testing::Test::HasFailure()) return;
    EXPECT_GT(m.checks(), 100u) << "seed " << seed;
    if (const auto races = backend->race_log()) {
      EXPECT_EQ(races->count, 0u) << "seed " << seed << ": "
                                  << (races->kept.empty() ? std::string()
                                                          : std::string(races->kept[0].earlier.kind) + " vs " +
                                                                std::string(races->kept[0].later.kind));
    }
    EXPECT_GT(m.user_ops(), 30u) << "seed " << seed;
    EXPECT_GT(m.stats().reclaims, 0u) << "seed " << seed << ": the run never met pressure";
    tight_fits += m.stats().tight_fits;
  }
  EXPECT_GT(tight_fits, 0u) << "the runs never took the placement-under-pressure path";
}

INSTANTIATE_TEST_SUITE_P(Backends, DevicePoolModelTest, FERRY_BACKENDS);

}  // namespace
}  // namespace ferry
