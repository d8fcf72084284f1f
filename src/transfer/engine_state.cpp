// The operations of the transfer engine's shared state (engine_state.hpp):
// parking what the device may still touch, the device-range leases and checks
// every job enqueues with, the dispatch of copies a verify stream waits for,
// and the pinned-memory and batching verdicts.
#include "transfer/engine_state.hpp"

#include "core/text.hpp"

namespace ferry::detail {
namespace {

Result<void> within_allocation(DeviceHandle h, std::uint64_t off, std::uint64_t bytes,
                               std::uint64_t size) {
  if (fits(off, bytes, size)) return {};
  return make_error(ErrorCode::invalid_argument,
                    "device range [" + std::to_string(off) + ", +" + std::to_string(bytes) +
                        ") lies outside allocation " + text::handle(h) + " of " +
                        std::to_string(size) + " bytes");
}

}  // namespace

void EngineState::park(StreamPoint point, std::shared_ptr<void> what) {
  if (!what) return;
  std::lock_guard lock(mu);
  keepalive.emplace_back(point, std::move(what));
}

void EngineState::prune() {
  std::vector<std::shared_ptr<void>> dead;  // destroyed outside the lock
  std::lock_guard lock(mu);
  std::size_t keep = 0;
  for (auto& k : keepalive) {
    if (order.is_complete(k.first)) {
      dead.push_back(std::move(k.second));
    } else {
      keepalive[keep++] = std::move(k);
    }
  }
  keepalive.resize(keep);
  std::erase_if(verify_waits, [&](const auto& w) { return order.is_complete(w.second); });
}

Result<DeviceRange> EngineState::lease_dst(DeviceHandle h, std::uint64_t off, std::uint64_t bytes,
                                           StreamPoint point) {
  auto span = pool.lease(h, point);
  if (!span.ok()) return std::move(span).error();
  FERRY_TRY(within_allocation(h, off, bytes, span->bytes));
  return DeviceRange{span->addr + off, bytes};
}

Result<void> EngineState::check_dst(const std::string& what, DeviceHandle h, std::uint64_t off,
                                    std::uint64_t bytes, StreamId stream) {
  Result<void> checked = [&]() -> Result<void> {
    FERRY_TRY(pool.make_ready(h, stream));
    auto span = pool.resolve(h);
    if (!span.ok()) return std::move(span).error();
    return within_allocation(h, off, bytes, span->bytes);
  }();
  if (checked.ok()) return checked;
  Error e = std::move(checked).error();
  e.message = what + ": " + e.message;
  return e;
}

Result<void> EngineState::dispatch_awaited_copies(StreamPoint point) {
  std::vector<StreamPoint> ahead;
  {
    std::lock_guard lock(mu);
    for (const auto& [wait, copy] : verify_waits) {
      if (wait.stream == point.stream && wait.ticket <= point.ticket) ahead.push_back(copy);
    }
  }
  for (const StreamPoint& p : ahead) {
    if (!order.is_complete(p) && order.backend().held(p.stream)) FERRY_TRY(order.wait(p));
  }
  return {};
}

bool EngineState::distrusted() {
  std::lock_guard lock(mu);
  return counters.pinned_distrusted;
}

void EngineState::disable_batching(const std::string& why) {
  std::lock_guard lock(mu);
  if (batching.exchange(false)) batch_reason = why;
  if (batch_reason.empty()) batch_reason = why;
  counters.batched_disabled = true;
}

}  // namespace ferry::detail
