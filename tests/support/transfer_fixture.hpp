// Shared set-up for the arena and transfer tests: a backend (the sim, or any
// backend for the per-backend suites; optionally wrapped), its StreamOrder, a
// pool, an arena and an engine, plus byte helpers.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend_fixture.hpp"
#include "ferry/forwarding_backend.hpp"
#include "expected_bytes.hpp"
#include "ferry/content.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/sim_backend.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"

namespace ferry::testing {

struct RigOptions {
  SimFaults faults{};  // faults, seed and profile: the sim Rig(RigOptions) builds
  std::uint64_t seed = 1;
  const char* profile = "tiny";
  // Explicit, so that no suite assumes a device's size; the sim clamps it to its
  // profile (tiny: 64 MiB), and without VMM cuda backs it all at construction.
  PoolOptions pool{.capacity = std::uint64_t{256} << 20};
  ArenaOptions arena{};
  EngineOptions engine{};
  bool with_engine = true;
};

// Owns everything in construction order. `backend()` is what the StreamOrder
// talks to: the backend, or a test double in front of it. `sim` is null on
// every backend but the sim.
class Rig {
 public:
  using Wrap = std::function<std::unique_ptr<Backend>(Backend&)>;

  // On a sim built from o.faults, o.seed and o.profile.
  explicit Rig(RigOptions o = {}) : Rig(make_backend("sim", o.faults, o.seed, o.profile), o) {}

  Rig(std::unique_ptr<Backend> backend, RigOptions o, const Wrap& wrap = {})
      : options(o), owned(std::move(backend)), sim(dynamic_cast<SimBackend*>(owned.get())) {
    if (wrap) wrapped = wrap(*owned);
    order = std::make_unique<StreamOrder>(this->backend(), std::chrono::seconds(30));
    pool = std::make_unique<DevicePool>(*order, o.pool);
    EXPECT_TRUE(pool->status().ok()) << pool->status().error().message;
    arena = std::make_unique<HostArena>(*order, o.arena);
    if (o.with_engine) engine = std::make_unique<TransferEngine>(*pool, *arena, o.engine);
  }

  ~Rig() {
    engine.reset();
    arena.reset();
    pool.reset();
    order.reset();
    wrapped.reset();
  }

  Backend& backend() { return wrapped ? *wrapped : *owned; }

  DeviceHandle device(std::uint64_t bytes, StreamId stream = 0) {
    auto h = pool->allocate(bytes, stream);
    EXPECT_TRUE(h.ok()) << h.error().message;
    return h.value_or(DeviceHandle{});
  }

  // Device bytes [offset, offset + n) of `h`, copied back through the pool on
  // `stream` (the whole block) and waited for.
  std::vector<std::byte> device_bytes(DeviceHandle h, std::uint64_t offset, std::uint64_t n,
                                      StreamId stream = 0) {
    auto span = pool->resolve(h);
    EXPECT_TRUE(span.ok());
    if (!span.ok() || offset + n > span->bytes) return std::vector<std::byte>(n);
    std::vector<std::byte> block(span->bytes);
    auto t = enqueue_copy_to_host(*pool, stream, h, block);
    EXPECT_TRUE(t.ok()) << t.error().message;
    if (!t.ok()) return std::vector<std::byte>(n);
    auto w = order->wait({stream, *t});
    EXPECT_TRUE(w.ok()) << w.error().message;
    const auto first = block.begin() + static_cast<std::ptrdiff_t>(offset);
    return {first, first + static_cast<std::ptrdiff_t>(n)};
  }

  HostBlock block_with(std::uint64_t seed, std::uint64_t n) {
    auto b = arena->allocate(n);
    EXPECT_TRUE(b.ok()) << b.error().message;
    if (!b.ok()) return {};
    fill_pattern(seed, 0, b->span());
    return *b;
  }

  void sync() {
    auto r = backend().synchronize();
    ASSERT_TRUE(r.ok()) << r.error().message;
  }

  RigOptions options;
  std::unique_ptr<Backend> owned;
  SimBackend* sim = nullptr;
  std::unique_ptr<Backend> wrapped;
  std::unique_ptr<StreamOrder> order;
  std::unique_ptr<DevicePool> pool;
  std::unique_ptr<HostArena> arena;
  std::unique_ptr<TransferEngine> engine;
};

// The per-backend arena and transfer suites: GetParam() names the backend, and a
// backend this machine lacks makes the test SKIP. make_rig() builds a Rig on it.
class BackendRigTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    first_ = make_backend(GetParam());
    FERRY_REQUIRE_BACKEND(first_, GetParam());
  }
  // The first rig takes the backend SetUp made; later ones make their own.
  Rig make_rig(RigOptions o = {}, const Rig::Wrap& wrap = {}) {
    return Rig(first_ ? std::move(first_) : make_backend(GetParam()), o, wrap);
  }

 private:
  std::unique_ptr<Backend> first_;
};


// Every host->device copy — pinned, registered, pageable, batched — silently does
// nothing: the "every path is broken" double.
class DropAllHostToDevice final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  Result<Ticket> enqueue(StreamId stream, Op op) override {
    if (std::holds_alternative<CopyToDeviceOp>(op) || std::holds_alternative<BatchCopyToDeviceOp>(op)) {
      ++dropped;
      op = NopOp{};
    }
    return inner_.enqueue(stream, std::move(op));
  }
  std::uint64_t dropped = 0;
};

}  // namespace ferry::testing
