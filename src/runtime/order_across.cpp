// Runtime::order_after: a stream of one device ordered after a point of another
// (runtime.hpp), through an event of the point's device.
#include <string>
#include <utility>
#include <vector>

#include "core/text.hpp"
#include "ferry/runtime.hpp"
#include "ferry/user_kernel.hpp"
#include "runtime/graph_capture.hpp"

namespace ferry {

Result<Ticket> Runtime::order_after(std::uint32_t device, StreamId stream, std::uint32_t from_device,
                                    StreamPoint point) {
  FERRY_TRY(refuse_inside_user_kernel("Runtime::order_after"));
  const auto prefixed = [](Error e) {
    e.message = "order_after: " + e.message;
    return e;
  };
  Result<RuntimeDevice*> to = find_device(device);
  if (!to.ok()) return prefixed(std::move(to).error());
  Result<RuntimeDevice*> from = find_device(from_device);
  if (!from.ok()) return prefixed(std::move(from).error());
  FERRY_TRY(check_stream(stream, "order_after"));
  FERRY_TRY(check_stream(point.stream, "order_after: the point"));
  const Ticket handed_out = (*from)->backend().submitted(point.stream);
  if (point.ticket > handed_out) {
    return make_error(ErrorCode::invalid_argument, "order_after: " + text::point(point) + " of device " +
                                                       std::to_string(from_device) + " was not handed out (its stream has " +
                                                       std::to_string(handed_out) + " tickets)");
  }
  if (device == 0 && graph_capture()->capturing(stream)) {
    return detail::refused("order_after", stream, "a wait across devices is not recorded in a graph");
  }
  if (device == from_device) return (*to)->order().order_after(stream, point);
  Result<Ticket> waited = wait_across(**to, stream, **from, point, nullptr);
  if (!waited.ok()) return prefixed(std::move(waited).error());
  return waited;
}

Result<Ticket> Runtime::wait_across(RuntimeDevice& to, StreamId stream, RuntimeDevice& from, StreamPoint point,
                                    const DeviceHandle* lease) {
  if (point.ticket == 0 || from.order().is_complete(point)) return Ticket{0};
  release_cross_waits(0);
  Result<NativeEvent> exported = from.backend().export_event(point);
  if (!exported.ok()) return std::move(exported).error();
  const NativeEvent event = *exported;
  Result<Ticket> waited = to.order().submit(stream, [&](Ticket ticket) -> Result<Op> {
    if (lease != nullptr) {
      Result<DeviceSpan> leased = to.pool().lease(*lease, StreamPoint{stream, ticket});
      if (!leased.ok()) return std::move(leased).error();
    }
    return Op{NativeWaitOp{event, &from.backend()}};
  });
  if (!waited.ok()) {
    (void)from.backend().release_event(event);  // nothing waits on it
    return waited;
  }
  std::lock_guard lock(cross_mu_);
  cross_waits_.push_back({to.index(), from.index(), StreamPoint{stream, *waited}, event, cross_seq_++});
  return waited;
}

void Runtime::release_cross_waits(std::uint64_t settled) {
  std::vector<CrossWait> done;
  {
    std::lock_guard lock(cross_mu_);
    // The cached cursor only: a poll would tell a race checker the host saw the wait complete.
    const auto finished = [&](const CrossWait& w) {
      return w.seq < settled || devices_[w.to]->order().known_complete(w.wait);
    };
    for (const CrossWait& w : cross_waits_) {
      if (finished(w)) done.push_back(w);
    }
    std::erase_if(cross_waits_, finished);
  }
  // An event a wait still queued in a host-side queue needs stays until that wait completed.
  for (const CrossWait& w : done) (void)devices_[w.from]->backend().release_event(w.event);
}

}  // namespace ferry
