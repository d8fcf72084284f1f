#include "ferry/stream_order.hpp"

#include <algorithm>

namespace ferry {

std::span<StreamPoint> UseSet::mutable_points() noexcept {
  if (!overflow_.empty()) return overflow_;
  return {points_.data(), count_};
}

void UseSet::add(StreamPoint point) {
  // One point per stream is enough: a stream completes its tickets in order.
  for (StreamPoint& p : mutable_points()) {
    if (p.stream == point.stream) {
      p.ticket = std::max(p.ticket, point.ticket);
      return;
    }
  }
  if (overflow_.empty() && count_ < points_.size()) {
    points_[count_++] = point;
    return;
  }
  if (overflow_.empty()) overflow_.assign(points_.begin(), points_.begin() + count_);
  overflow_.push_back(point);
  count_ = overflow_.size();
}

void UseSet::merge(const UseSet& other) {
  for (const StreamPoint& p : other.points()) add(p);
}

bool UseSet::retire(StreamOrder& order) {
  auto pts = mutable_points();
  auto end = std::remove_if(pts.begin(), pts.end(),
                            [&](const StreamPoint& p) { return order.is_complete(p); });
  count_ = static_cast<std::size_t>(end - pts.begin());
  if (!overflow_.empty()) {
    overflow_.resize(count_);
    if (count_ <= points_.size()) {
      std::copy(overflow_.begin(), overflow_.end(), points_.begin());
      overflow_.clear();
    }
  }
  return count_ == 0;
}

std::optional<StreamId> UseSet::single_stream() const noexcept {
  auto pts = points();
  if (pts.size() != 1) return std::nullopt;
  return pts[0].stream;
}

StreamOrder::StreamOrder(Backend& backend, std::chrono::nanoseconds wait_timeout)
    : backend_(backend), wait_timeout_(wait_timeout) {}

Ticket StreamOrder::completed(StreamId stream) {
  if (stream >= kMaxStreams) return 0;
  const Ticket polled = backend_.completed(stream);
  // Completion is monotone; a stale cached value is only ever too low.
  Ticket cached = completed_[stream].load(std::memory_order_acquire);
  while (polled > cached &&
         !completed_[stream].compare_exchange_weak(cached, polled, std::memory_order_acq_rel,
                                                   std::memory_order_acquire)) {
  }
  return std::max(polled, cached);
}

bool StreamOrder::is_complete(StreamPoint point) {
  if (point.ticket == 0) return true;
  if (point.stream >= kMaxStreams) return false;
  // Acquire pairs with completed()'s release: a cached ticket carries what its ops wrote (hashes, downloads).
  if (completed_[point.stream].load(std::memory_order_acquire) >= point.ticket) return true;
  return completed(point.stream) >= point.ticket;
}

bool StreamOrder::known_complete(StreamPoint point) const noexcept {
  if (point.ticket == 0) return true;
  return point.stream < kMaxStreams && completed_[point.stream].load(std::memory_order_acquire) >= point.ticket;
}

Result<void> StreamOrder::wait(StreamPoint point) {
  if (is_complete(point)) return {};
  Result<void> waited = backend_.wait(point, wait_timeout_);
  // A stream's sticky fault (a failed user kernel) is the op's error, not this
  // wait's: the point completed, so leases on it retire.
  if (!waited.ok() && !is_complete(point)) return waited;
  completed(point.stream);
  return {};
}

Result<void> StreamOrder::wait_for_result(StreamPoint point) {
  FERRY_TRY(wait(point));
  return backend_.wait(point, wait_timeout_);  // complete: answers the stream's fault at once
}

Result<void> StreamOrder::wait(const UseSet& uses) {
  Result<void> first;  // every point is waited for, even after one failed
  for (const StreamPoint& p : uses.points()) {
    Result<void> r = wait(p);
    if (!r.ok() && first.ok()) first = std::move(r);
  }
  return first;
}

Result<Ticket> StreamOrder::order_after(StreamId stream, StreamPoint point, HeldWork held) {
  if (point.stream == stream || point.ticket == 0) return Ticket{0};
  // A point that completed with its stream's failure still gets its wait: the wait
  // is how the failure passes on to `stream` (StreamFault::passed_on).
  const auto done_cleanly = [&] { return is_complete(point) && backend_.wait(point, wait_timeout_).ok(); };
  if (done_cleanly()) return Ticket{0};
  if (held == HeldWork::dispatch) {
    FERRY_TRY(backend_.flush(point.stream));
    if (done_cleanly()) return Ticket{0};
  }
  return submit(stream, [&](Ticket) -> Result<Op> { return Op{WaitOp{point}}; });
}

Result<Ticket> StreamOrder::order_after(StreamId stream, NativeEvent event, Backend* peer) {
  return submit(stream, [&](Ticket) -> Result<Op> { return Op{NativeWaitOp{event, peer}}; });
}

Result<void> StreamOrder::fill_lost_ticket(StreamId stream) {
  Result<Ticket> nop = backend_.enqueue(stream, NopOp{});
  if (!nop.ok()) {
    return make_error(ErrorCode::backend_error,
                      "stream " + std::to_string(stream) +
                          " lost a ticket and could not fill it: " + nop.error().message);
  }
  return {};
}

}  // namespace ferry
