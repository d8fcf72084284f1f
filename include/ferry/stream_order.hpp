// ferry — stream ordering, written once (docs/spec.md I2, I3).
//
// The pool, the host arena, the transfer engine and the offload cache all ask the
// same two questions — "which enqueued work may still touch this?" and "has it
// finished?" — and answer them here, with leases:
//
//   * Every operation is enqueued through StreamOrder::submit. Its `prepare`
//     callback runs under the stream's submission lock, knows the ticket the
//     operation will get, and records that ticket on every resource the operation
//     touches (a UseSet). Leases are taken at enqueue, not at dispatch, so work
//     held in a host-side queue holds its operands too (report 003).
//   * A resource whose UseSet has not retired must not be reused, unmapped or
//     released — except by later work on the one stream that still uses it,
//     which the FIFO orders after the old work (I3).
//
// Thread safety: all methods may be called from any thread. submit() holds the
// stream's submission lock while it calls `prepare` and Backend::enqueue (which
// never blocks on device work). wait() blocks and holds no lock of ferry's.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/backend.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"
#include "ferry/user_kernel.hpp"

namespace ferry FERRY_API {

class StreamOrder;

// The positions on streams that may still touch one resource: at most one point
// per stream (the latest ticket), since a stream completes in order.
// Not thread-safe: the resource's owner guards it (the pool's or arena's lock).
class UseSet {
 public:
  void add(StreamPoint point);
  void merge(const UseSet& other);
  // Drops the points that have completed. Returns true when none remain.
  bool retire(StreamOrder& order);
  bool empty() const noexcept { return count_ == 0; }
  // The only stream still using the resource, if exactly one is.
  std::optional<StreamId> single_stream() const noexcept;
  std::span<const StreamPoint> points() const noexcept {
    if (!overflow_.empty()) return overflow_;
    return {points_.data(), count_};
  }
  void clear() noexcept {
    count_ = 0;
    overflow_.clear();
  }

 private:
  // Inline for the common case; more streams than this spill into overflow_.
  std::array<StreamPoint, 4> points_{};
  std::size_t count_ = 0;
  std::vector<StreamPoint> overflow_;  // used only when count_ would exceed 4
  friend class StreamOrder;
  std::span<StreamPoint> mutable_points() noexcept;
};

class StreamOrder {
 public:
  // `wait_timeout` bounds every wait this object performs (backend time).
  explicit StreamOrder(Backend& backend,
                       std::chrono::nanoseconds wait_timeout = std::chrono::seconds(30));

  Backend& backend() noexcept { return backend_; }

  // Enqueues on `stream` the op returned by prepare(ticket). prepare runs under
  // the stream's submission lock; it records leases for `ticket` and returns the
  // Op, or an Error (then a no-op takes the ticket, so leases it recorded retire).
  // Errors: invalid_argument (stream out of range), what prepare returns,
  // backend_error.
  template <class Prepare>
  Result<Ticket> submit(StreamId stream, Prepare&& prepare);

  // True when `point` has completed. Polls the backend only when the cached
  // completion cursor is behind. Non-blocking.
  bool is_complete(StreamPoint point);
  Ticket completed(StreamId stream);
  // True when `point` is known to have completed from what earlier calls polled
  // or waited for: it never polls, so a race checker learns nothing from it.
  // Non-blocking.
  bool known_complete(StreamPoint point) const noexcept;

  // Blocks (bounded) until `point`, or every point of `uses`, has completed.
  // Dispatches held work it waits for. A completed point is success even when its
  // stream carries a fault (Backend::wait reports that). Errors: timeout,
  // backend_error (a device fault).
  Result<void> wait(StreamPoint point);
  Result<void> wait(const UseSet& uses);
  // wait(point), then the fault of point's stream at or before it (a failed user
  // kernel: Backend::wait's answer) is this wait's error too: for a host that
  // reads what the point produced, so stale bytes never read as success.
  // Errors: timeout, backend_error, the fault's code.
  Result<void> wait_for_result(StreamPoint point);

  // What order_after does with work of point's stream still held in its
  // host-side queue: leave it there (a wait behind held work stays queued on
  // `stream` until that work dispatches), or dispatch it first, for a caller that
  // orders after work it did not enqueue and so would never flush (the pool,
  // reusing a block whose old work sits in a held queue).
  enum class HeldWork : std::uint8_t { stays, dispatch };

  // Orders later work on `stream` after `point` (an event wait on the device):
  // enqueues a WaitOp unless the point is on `stream` itself or has completed
  // (with HeldWork::dispatch, also when the flush completed it).
  // Returns the wait's ticket, or 0 when none was needed. Never blocks.
  // Errors: invalid_argument (bad stream, a point not handed out), backend_error
  // (the flush's too).
  Result<Ticket> order_after(StreamId stream, StreamPoint point, HeldWork held = HeldWork::stays);
  // The same after a native event of the program's (or one export_event made;
  // `peer`: the other device's backend that made it, NativeWaitOp::peer):
  // enqueues a NativeWaitOp. Errors: invalid_argument (bad stream, null event, an
  // event the peer did not make), backend_error.
  Result<Ticket> order_after(StreamId stream, NativeEvent event, Backend* peer = nullptr);

  std::chrono::nanoseconds wait_timeout() const noexcept { return wait_timeout_; }

 private:
  Result<void> fill_lost_ticket(StreamId stream);

  Backend& backend_;
  std::chrono::nanoseconds wait_timeout_;
  std::array<std::mutex, kMaxStreams> submit_mutex_;
  std::array<std::atomic<Ticket>, kMaxStreams> completed_{};
};

template <class Prepare>
Result<Ticket> StreamOrder::submit(StreamId stream, Prepare&& prepare) {
  FERRY_TRY(check_stream(stream, "submit"));
  // Before prepare() leases anything: a refused enqueue could not even fill its ticket.
  FERRY_TRY(refuse_inside_user_kernel("submit"));
  // The submission lock makes the ticket that prepare() records equal to the one
  // the backend hands out: nothing else enqueues on this stream meanwhile.
  std::lock_guard<std::mutex> lock(submit_mutex_[stream]);
  const Ticket ticket = backend_.submitted(stream) + 1;
  Result<Op> op = std::forward<Prepare>(prepare)(ticket);
  if (!op.ok()) {
    FERRY_TRY(fill_lost_ticket(stream));
    return std::move(op).error();
  }
  Result<Ticket> got = backend_.enqueue(stream, std::move(op).value());
  if (!got.ok()) {
    // Leases already name `ticket`; fill it with a no-op so it still completes.
    FERRY_TRY(fill_lost_ticket(stream));
    return std::move(got).error();
  }
  return got;
}

}  // namespace ferry
