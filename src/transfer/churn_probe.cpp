#include "ferry/churn_probe.hpp"

#include <chrono>
#include <cstring>
#include <thread>

#include "ferry/content.hpp"

namespace ferry {
namespace {

// Frees a pinned buffer when the probe leaves, error or not. Only used after
// every copy out of it has been waited for.
struct PinnedBuffer {
  Backend& backend;
  std::byte* ptr = nullptr;
  ~PinnedBuffer() {
    if (ptr != nullptr) (void)backend.free_pinned(ptr);
  }
};

}  // namespace

Result<ChurnVerdict> run_churn_probe(DevicePool& pool, const ChurnProbeOptions& options) {
  if (options.copies == 0 || options.probe_bytes == 0 ||
      (options.churn_rounds > 0 && options.churn_bytes == 0)) {
    return make_error(ErrorCode::invalid_argument,
                      "churn probe: copies, probe_bytes and (with churn rounds) churn_bytes must be > 0");
  }
  StreamOrder& order = pool.order();
  Backend& backend = order.backend();
  ChurnVerdict out;
  out.simulated_delays = backend.info().modeled_time;
  const StreamId stream = options.stream;

  // 1. Churn, the way report 000's test suite did: big pinned buffers, filled
  //    and dropped, round after round.
  for (std::uint32_t round = 0; round < options.churn_rounds; ++round) {
    const std::uint64_t sizes[2] = {options.churn_bytes,
                                    options.churn_bytes / 2 + 4096 * (round % 7) + 1};
    for (std::uint64_t bytes : sizes) {
      auto p = backend.allocate_pinned(bytes);
      if (!p.ok()) {
        Error e = std::move(p).error();
        e.message = "churn probe: pinning " + std::to_string(bytes) + " bytes (round " +
                    std::to_string(round) + "): " + e.message;
        return e;
      }
      PinnedBuffer buf{backend, *p};
      std::memset(buf.ptr, static_cast<int>(round & 0xff), bytes);
      ++out.churn_pins;
    }
  }

  // 2. A fresh buffer with a known pattern.
  auto fresh = backend.allocate_pinned(options.probe_bytes);
  if (!fresh.ok()) return std::move(fresh).error();
  PinnedBuffer src{backend, *fresh};
  const std::uint64_t seed = 0x000f00d5eedull;
  fill_pattern(seed, 0, {src.ptr, options.probe_bytes});

  auto dst = pool.allocate_internal(options.probe_bytes, stream);
  if (!dst.ok()) return std::move(dst).error();
  std::vector<std::byte> readback(options.probe_bytes);

  // 3. Copies after growing delays.
  Result<void> failure;
  for (std::uint32_t i = 0; i < options.copies && failure.ok(); ++i) {
    const std::uint64_t delay = options.delay_step_ns * (i + 1);
    backend.advance(delay);  // virtual time on sim; a real sleep elsewhere (diagnostic only)
    // A different pattern first, so a copy that does nothing shows.
    auto f = enqueue_fill(pool, stream, *dst, seed ^ (0xdeadull + i));
    if (!f.ok()) {
      failure = std::move(f).error();
      break;
    }
    auto c = order.submit(stream, [&](Ticket t) -> Result<Op> {
      auto span = pool.lease(*dst, {stream, t});
      if (!span.ok()) return std::move(span).error();
      return Op{CopyToDeviceOp{DeviceRange{span->addr, options.probe_bytes}, src.ptr}};
    });
    if (!c.ok()) {
      failure = std::move(c).error();
      break;
    }
    auto back = enqueue_copy_to_host(pool, stream, *dst, readback);
    if (!back.ok()) {
      failure = std::move(back).error();
      break;
    }
    if (auto w = order.wait({stream, *back}); !w.ok()) {
      // The copies may still run: keep the buffers (leak) rather than free them
      // under the device.
      src.ptr = nullptr;
      new std::vector<std::byte>(std::move(readback));  // NOLINT: deliberate leak
      (void)pool.free(*dst);
      return std::move(w).error();
    }
    const bool ok = std::memcmp(readback.data(), src.ptr, options.probe_bytes) == 0;
    out.arrived.push_back(ok);
    ++out.copies;
    if (!ok) ++out.failures;
  }
  (void)pool.free(*dst);
  if (!failure.ok()) return std::move(failure).error();

  out.healthy = out.failures == 0;
  const std::string what = std::to_string(out.copies) + " copies from a freshly pinned buffer after " +
                           std::to_string(out.churn_pins) + " pinned allocations of churn";
  if (out.healthy) {
    out.verdict = "healthy: " + what + " all arrived intact";
  } else {
    out.verdict = "FAILING: " + std::to_string(out.failures) + " of " + what +
                  " reported success but left the device bytes unchanged (report 000: silent "
                  "pinned-copy failure); run transfers with --integrity verify";
  }
  return out;
}

}  // namespace ferry
