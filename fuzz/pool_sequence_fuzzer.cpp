// Fuzzes the device pool with a sequence of calls decoded from the input, on the
// sim (tiny profile, race checker on) with four streams: allocate, free, fill,
// compute, check (copy back and compare), hold, release, make_ready, trim,
// advance, synchronize, forged handles. The program it plays is a correct one:
// it orders every cross-stream use of a block after the block's last write (and a
// write after its reads), as replay does, and calls make_ready before a block's
// first use on another stream. After every call:
//   * validate() holds, and the stats agree with the live blocks
//     (requested == their sum, allocated <= reserved <= capacity);
//   * every handle freed so far resolves to stale_handle (I1), and a forged
//     handle resolves only where it equals a live one;
//   * live blocks resolve to their own size, and no two overlap;
//   * the race checker found no race (I2, I3: a reused block's new work is
//     ordered after its old work);
// and every check reads the bytes its block's last write made. Any other error
// code than the ones a call documents is a finding.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ferry/content.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/race.hpp"
#include "ferry/stream_order.hpp"

#include "fuzz_input.hpp"

namespace {

using ferry::DeviceHandle;
using ferry::ErrorCode;
using ferry::StreamId;
using ferry::StreamPoint;

constexpr StreamId kStreams = 4;
constexpr std::uint64_t kCapacity = std::uint64_t{4} << 20;
constexpr std::size_t kMaxOps = 200;
constexpr std::size_t kMaxStale = 64;  // freed handles re-resolved after every call

using ferry_fuzz::Input;
[[noreturn]] void finding(const std::string& what) { ferry_fuzz::finding("fuzz_pool", what); }

// One block the program holds, and what it knows of its bytes and its users.
struct Block {
  DeviceHandle handle;
  std::uint64_t bytes = 0;
  std::optional<std::uint64_t> seed;  // its bytes are fill_pattern(seed); unknown when empty
  std::optional<StreamPoint> last_write;
  std::array<ferry::Ticket, kStreams> reads{};  // latest read per stream (0: none)
};

std::string handle_text(DeviceHandle h) {
  return "{" + std::to_string(h.pool) + "," + std::to_string(h.slot) + "," + std::to_string(h.generation) + "}";
}

std::vector<std::byte> pattern_bytes(std::uint64_t seed, std::uint64_t bytes) {
  std::vector<std::byte> out(bytes);
  ferry::fill_pattern(seed, 0, out);
  return out;
}

class Harness {
 public:
  Harness(ferry::Backend& backend, ferry::PoolOptions options)
      : backend_(backend), order_(backend), pool_(order_, options) {
    if (!pool_.status().ok()) finding("the pool could not be set up: " + pool_.status().error().message);
  }

  ~Harness() {
    // Every block goes back before the pool does, as a program's would.
    for (const Block& b : live_) (void)pool_.free(b.handle);
    (void)backend_.synchronize();
  }

  void step(Input& in) {
    const std::uint8_t op = in.byte() % 13;
    const StreamId s = in.byte() % kStreams;
    switch (op) {
      case 0: case 1: allocate(in, s); break;
      case 2: free(in); break;
      case 3: case 4: fill(in, s); break;
      case 5: compute(in, s); break;
      case 6: check(in, s); break;
      case 7: backend_.set_hold(s, true); break;
      case 8: release(s); break;
      case 9: make_ready(in, s); break;
      case 10: expect_ok(pool_.trim(), "trim"); break;
      case 11: backend_.advance(in.u64(2) * 1000); break;
      case 12: forged(in); break;
    }
    audit();
  }

 private:
  Block* pick(Input& in) { return live_.empty() ? nullptr : &live_[in.byte() % live_.size()]; }

  template <class T>
  void expect_ok(const ferry::Result<T>& r, const std::string& what) {
    if (!r.ok()) finding(what + " failed: " + r.error().message);
  }

  // Orders stream `s` after `point`, dispatching a held producer first so the
  // wait can finish (the hold stays on), as a program that holds streams must.
  void order_after(StreamId s, StreamPoint point) {
    if (point.stream == s) return;
    if (backend_.held(point.stream)) expect_ok(backend_.flush(point.stream), "flush");
    expect_ok(order_.order_after(s, point), "order_after");
  }
  void before_read(Block& b, StreamId s) {
    if (b.last_write) order_after(s, *b.last_write);
  }
  void before_write(Block& b, StreamId s) {
    before_read(b, s);
    for (StreamId r = 0; r < kStreams; ++r) {
      if (b.reads[r] != 0) order_after(s, {r, b.reads[r]});
    }
  }

  void allocate(Input& in, StreamId s) {
    // Mostly up to 64 KiB, now and then 0, up to 1.5 x the capacity, or any u64.
    const std::uint8_t kind = in.byte() % 8;
    const std::uint64_t bytes = kind == 0 ? in.u64(1) : kind < 6 ? 1 + in.u64(2)
                                : kind == 6 ? 1 + in.u64(3) % (3 * kCapacity / 2) : in.u64(8);
    auto h = pool_.allocate(bytes, s);
    if (!h.ok()) {
      const ErrorCode c = h.error().code;
      if (bytes == 0 && c == ErrorCode::invalid_argument) return;
      if (c == ErrorCode::out_of_memory) {
        if (h.error().message.empty()) finding("out_of_memory without a diagnostic");
        return;
      }
      finding("allocate(" + std::to_string(bytes) + ") failed with " + std::string(ferry::to_string(c)) + ": " +
              h.error().message);
    }
    if (bytes == 0) finding("allocate(0) succeeded");
    if (live_.size() >= 64) {  // keeps audit() cheap; the block goes back at once
      expect_ok(pool_.free(*h), "free");
      remember_stale(*h);
      return;
    }
    // A fresh block has no writes to order after: make_ready (called by every
    // enqueue helper) orders other streams after its allocation point (I3).
    live_.push_back(Block{*h, bytes, std::nullopt, std::nullopt, {}});
  }

  void free(Input& in) {
    if (live_.empty()) return;
    const std::size_t i = in.byte() % live_.size();
    const DeviceHandle h = live_[i].handle;
    expect_ok(pool_.free(h), "free " + handle_text(h));
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
    remember_stale(h);
    if (pool_.free(h).ok()) finding("a double free of " + handle_text(h) + " succeeded");
  }

  void remember_stale(DeviceHandle h) {
    if (stale_.size() == kMaxStale) stale_.erase(stale_.begin());
    stale_.push_back(h);
  }

  void fill(Input& in, StreamId s) {
    Block* b = pick(in);
    if (b == nullptr) return;
    const std::uint64_t seed = in.u64(2);
    before_write(*b, s);
    auto t = ferry::enqueue_fill(pool_, s, b->handle, seed);
    expect_ok(t, "fill " + handle_text(b->handle));
    b->seed = seed;
    b->last_write = StreamPoint{s, *t};
    b->reads = {};
  }

  void compute(Input& in, StreamId s) {
    Block* out = pick(in);
    if (out == nullptr || live_.size() < 2) return;
    const std::size_t n = 1 + in.byte() % 3;
    std::vector<Block*> inputs;
    for (std::size_t k = 0; k < n; ++k) {
      Block* b = pick(in);
      if (b != out && std::find(inputs.begin(), inputs.end(), b) == inputs.end()) inputs.push_back(b);
    }
    if (inputs.empty()) return;
    std::vector<DeviceHandle> handles;
    std::optional<std::uint64_t> seed = ferry::kMixStart;
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      before_read(*inputs[k], s);
      handles.push_back(inputs[k]->handle);
      if (seed && inputs[k]->seed) {
        const auto bytes = pattern_bytes(*inputs[k]->seed, inputs[k]->bytes);
        seed = ferry::mix_step(*seed, k, ferry::content_hash(bytes));
      } else {
        seed.reset();
      }
    }
    before_write(*out, s);
    auto t = ferry::enqueue_compute(pool_, s, handles, out->handle);
    expect_ok(t, "compute into " + handle_text(out->handle));
    for (Block* b : inputs) b->reads[s] = *t;
    out->seed = seed;
    out->last_write = StreamPoint{s, *t};
    out->reads = {};
  }

  void check(Input& in, StreamId s) {
    Block* b = pick(in);
    if (b == nullptr) return;
    before_read(*b, s);
    std::vector<std::byte> got(b->bytes);
    auto t = ferry::enqueue_copy_to_host(pool_, s, b->handle, got);
    expect_ok(t, "copy back " + handle_text(b->handle));
    expect_ok(order_.wait(StreamPoint{s, *t}), "wait for the copy of " + handle_text(b->handle));
    b->reads[s] = *t;
    if (b->seed && std::memcmp(got.data(), pattern_bytes(*b->seed, b->bytes).data(), got.size()) != 0) {
      finding("block " + handle_text(b->handle) + " (" + std::to_string(b->bytes) +
              " B) does not hold the bytes of its last write");
    }
  }

  void release(StreamId s) {
    backend_.set_hold(s, false);
    expect_ok(backend_.flush(s), "flush");
  }

  void make_ready(Input& in, StreamId s) {
    Block* b = pick(in);
    if (b == nullptr) return;
    expect_ok(pool_.make_ready(b->handle, s), "make_ready " + handle_text(b->handle));
  }

  void forged(Input& in) {
    const DeviceHandle h{static_cast<std::uint32_t>(in.u64(1)), static_cast<std::uint32_t>(in.u64(1)),
                         static_cast<std::uint32_t>(in.u64(2))};
    auto r = pool_.resolve(h);
    const bool live = std::any_of(live_.begin(), live_.end(), [&](const Block& b) { return b.handle == h; });
    if (r.ok() && !live) finding("forged handle " + handle_text(h) + " resolved");
    if (!r.ok() && r.error().code != ErrorCode::stale_handle) finding("forged handle: not stale_handle");
    if (!live && pool_.free(h).ok()) finding("forged handle " + handle_text(h) + " was freed");
  }

  void audit() {
    std::string why;
    if (!pool_.validate(&why)) finding("validate(): " + why);
    for (DeviceHandle h : stale_) {
      auto r = pool_.resolve(h);
      if (r.ok()) finding("freed handle " + handle_text(h) + " resolves again");
      if (r.error().code != ErrorCode::stale_handle) finding("freed handle: not stale_handle");
    }
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    std::uint64_t requested = 0;
    for (const Block& b : live_) {
      auto r = pool_.resolve(b.handle);
      if (!r.ok()) finding("live handle " + handle_text(b.handle) + " does not resolve: " + r.error().message);
      if (r->bytes != b.bytes) finding("live handle " + handle_text(b.handle) + " resolves to another size");
      ranges.emplace_back(r->addr, r->addr + r->bytes);
      requested += b.bytes;
    }
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].first < ranges[i - 1].second) finding("two live blocks overlap");
    }
    const ferry::PoolStats st = pool_.stats();
    if (st.requested_bytes != requested) finding("stats: requested bytes differ from the live blocks'");
    if (st.allocated_bytes > st.reserved_bytes || st.reserved_bytes > pool_.capacity()) {
      finding("stats: allocated <= reserved <= capacity broken");
    }
    if (auto log = backend_.race_log(); log && log->count != 0) {
      const ferry::Race& r = log->kept.front();
      finding("race between stream " + std::to_string(r.earlier.op.stream) + " ticket " +
              std::to_string(r.earlier.op.ticket) + " (" + std::string(r.earlier.kind) + ") and stream " +
              std::to_string(r.later.op.stream) + " ticket " + std::to_string(r.later.op.ticket) + " (" +
              std::string(r.later.kind) + ")");
    }
  }

  ferry::Backend& backend_;
  ferry::StreamOrder order_;
  ferry::DevicePool pool_;
  std::vector<Block> live_;
  std::vector<DeviceHandle> stale_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  ferry::BackendSpec spec;
  spec.profile = "tiny";
  spec.race_check = true;
  auto backend = ferry::make_backend(spec);
  if (!backend.ok()) finding("the sim could not be made: " + backend.error().message);
  ferry::PoolOptions options;
  options.capacity = kCapacity;
  const std::uint8_t shape = in.byte();
  options.release_threshold = (shape & 1) ? 0 : options.release_threshold;  // unmap at once, or cache
  options.small_limit = (shape & 2) ? std::uint64_t{64} << 10 : options.small_limit;
  options.validate_each_op = true;
  Harness harness(**backend, options);
  for (std::size_t i = 0; i < kMaxOps && !in.empty(); ++i) harness.step(in);
  return 0;
}
