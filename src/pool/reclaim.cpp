// DevicePool: the reclaim ladder (I4: survive pressure before reporting it), and trim.
#include "pool/device_pool_impl.hpp"

namespace ferry {

// allocate() after a failed fit (`size`: the rounded request).
Result<DeviceHandle> DevicePool::Impl::survive_pressure(std::uint64_t bytes, std::uint64_t size, StreamId stream,
                                                        bool internal) {
  // I4: survive pressure before reporting it.
  ++st.reclaims;
  auto succeed = [&](std::uint32_t b) {
    ++st.ooms_survived;
    return bind_ordered(b, size, bytes, stream, internal);
  };
  // 1. Dispatch held commands, so held work can complete and release its leases.
  //    No pool lock while the backend works (queued unmaps are committed first,
  //    so their room does not wait for the flush).
  settle();
  Result<void> flushed;
  without_lock([&](bool) { flushed = backend.flush_all(); });
  if (!flushed.ok()) return std::move(flushed).error();
  // 2. Reuse frees whose work has completed; then, if other callers' maps are in
  //    flight, wait for them once: a map that fails gives its room back.
  retire_pending();
  if (const std::uint32_t b = fit(size); b != kNoFit) return succeed(b);
  settle();
  if (busy_granules() * granule > unmapping_bytes()) {
    await_driver();
    retire_pending();
    if (const std::uint32_t b = fit(size); b != kNoFit) return succeed(b);
  }
  // 3. Cached free memory is released by every fit as it needs the room
  //    (reference_granules), so no retry here could place differently.
  // 4. Wait (bounded) for in-flight frees, then retry.
  for (int round = 0; round < 2; ++round) {
    UseSet in_flight;
    pending.for_each([&](std::uint32_t b) { in_flight.merge(leases[b].uses); });
    if (in_flight.empty()) break;
    settle();
    Result<void> waited;  // waiting holds no lock another caller needs
    without_lock([&](bool) { waited = order.wait(in_flight); });
    retire_pending();
    if (const std::uint32_t b = fit(size); b != kNoFit) return succeed(b);
    if (!waited.ok()) break;
  }
  ++st.ooms;
  settle();
  check();
  return make_error(ErrorCode::out_of_memory, diagnostic(bytes, stream));
}

Result<void> DevicePool::trim() {
  FERRY_TRY(refuse_inside_user_kernel("trim"));
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  ++p.st.reclaims;
  p.retire_pending();
  p.unmap_unused(/*all=*/true);
  p.settle();
  p.check();
  return {};
}

}  // namespace ferry
