// ferry — held streams (report 003's lazy dispatch), written once as a layer
// over any backend's primitives.
//
// A backend implements HoldQueues::Device: issue an op on a device stream (the
// next ticket), report what completed, wait, synchronize. HoldingBackend<Base>
// gives it the rest of the Backend interface: tickets handed out at enqueue, the
// one op contract (check_op) before any ticket, host-side queues for held
// streams, and dispatch of held work when something needs it:
//
//   * set_hold(s, false), flush(s), flush_all() and synchronize() dispatch what
//     the queues hold (flush keeps the hold on for later ops);
//   * wait(point) dispatches the held ops of point.stream up to the point;
//   * a WaitOp is never issued before the point it waits for: a native wait on
//     work that is not on the device yet would wait for nothing (a silent race).
//     Until that point is dispatched the waiting stream is blocked: its WaitOp
//     and everything after it stay in its queue, even when the stream is not
//     held. A hold is never broken by another stream's wait; a host wait that
//     needs held work answers timeout at once, naming the held point.
//
// Tickets: the device numbers a stream's issued ops 1, 2, ... in the order they
// are issued, and ops are issued in ticket order, so the device's tickets are the
// layer's. An op that fails when it is issued later (it was held) still takes
// its ticket: a no-op is issued in its place and the failure becomes the
// stream's fault, returned by the flush that issued it (when it was a flush) and
// by every wait on that point or a later one. If even the no-op fails the stream
// is broken: nothing more is issued on it.
//
// Adopted streams (Backend::adopt_stream) are the program's native streams: the
// layer never holds them (set_hold does nothing there), and picks their ids among
// those no ferry work has used.
//
// Thread safety: every method may be called from any thread. Lock order: the
// layer's lock, then the device's own; the device never calls back into the
// layer. Device::issue runs under the layer's lock; Device::admit, waits and
// synchronize run with no lock of the layer's held.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/backend.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"

namespace ferry FERRY_API {

// The first failure of a stream's operations, sticky: every wait on its ticket or
// a later one of the stream returns it. Not thread-safe: the owner's lock guards it.
struct StreamFault {
  std::optional<Error> error;
  Ticket ticket = 0;
  void record(Ticket at, Error e) {
    if (error) return;
    error = std::move(e);
    ticket = at;
  }
  Result<void> check(Ticket through) const {
    if (error && ticket <= through) return *error;
    return {};
  }
  // A stream that waits on `waited` (a point of this stream) is ordered after this
  // failure when it came at or before the point (I3): the waiter takes it on as its
  // own, so a download there never reads what the failed op left as a success.
  Result<void> passed_on(StreamPoint waited) const {
    if (!error || ticket > waited.ticket) return {};
    Error e = *error;
    e.message = "ordered by a wait after stream " + std::to_string(waited.stream) + " ticket " +
                std::to_string(ticket) + ", which failed: " + e.message;
    return e;
  }
};

class HoldQueues {
 public:
  // The primitives a backend implements.
  class Device {
   public:
    virtual ~Device() = default;
    // The backend's own refusals of an op that meets the contract (memory not
    // mapped, a library it lacks), before the op gets a ticket.
    virtual Result<void> admit(StreamId stream, const Op& op) = 0;
    // Issues `op` (it met check_op and admit) as the stream's next ticket;
    // never blocks on device work.
    virtual Result<Ticket> issue(StreamId stream, Op op) = 0;
    // The last issued ticket of `stream` that has completed. Polls; non-blocking.
    virtual Ticket issued_completed(StreamId stream) = 0;
    // Blocks until the issued `point` has completed. Errors: timeout, backend_error.
    virtual Result<void> wait_issued(StreamPoint point, std::chrono::nanoseconds timeout) = 0;
    // Blocks until every issued op has completed.
    virtual Result<void> synchronize_issued() = 0;
    // The native stream behind `stream` (made on first use).
    virtual Result<NativeStream> native_of(StreamId stream) = 0;
    // From now on `stream` issues on the program's `native` (it met the layer's
    // checks: no ferry work of `stream` is in flight). Refuses one of the
    // device's own streams with invalid_argument.
    virtual Result<void> bind_stream(StreamId stream, NativeStream native) = 0;
    // Forgets the adopted native stream; every issued op of it has completed.
    virtual Result<void> unbind_stream(StreamId stream) = 0;
    // An event that completes when the issued `point` has.
    virtual Result<NativeEvent> export_issued(StreamPoint point) = 0;
    virtual Result<void> release_export(NativeEvent event) = 0;
    // Makes `ops` (the device work begin_graph kept, in enqueue order; each met
    // check_op and admit) one native graph (Backend::end_graph says the errors).
    // Runs with no lock of the layer's held. The default: unsupported.
    virtual Result<NativeGraph> build_graph(StreamId stream, std::vector<Op> ops);
  };

  // `info` is the device's (check_op reads its capabilities); both outlive this.
  HoldQueues(Device& device, const DeviceInfo& info) : device_(device), info_(info) {}

  Result<Ticket> enqueue(StreamId stream, Op op);
  Ticket submitted(StreamId stream) const;
  Ticket completed(StreamId stream);
  void set_hold(StreamId stream, bool hold);
  bool held(StreamId stream) const;
  Result<void> flush(StreamId stream);
  Result<void> flush_all();
  Result<void> wait(StreamPoint point, std::chrono::nanoseconds timeout);
  Result<void> synchronize();
  Result<NativeStream> native_stream(StreamId stream);
  Result<StreamId> adopt_stream(NativeStream native);
  Result<void> release_stream(StreamId stream, std::chrono::nanoseconds timeout);
  Result<NativeEvent> export_event(StreamPoint point);
  Result<void> release_event(NativeEvent event);
  // Backend::begin_graph / end_graph: the layer keeps the ops, the device builds.
  Result<void> begin_graph(StreamId stream);
  Result<NativeGraph> end_graph(StreamId stream);
  // The first held op that reads or writes host bytes [begin, begin + bytes),
  // if any (such memory must not be freed yet).
  std::optional<StreamPoint> held_user(const std::byte* begin, std::uint64_t bytes) const;
  // Checks issued <= submitted, held ops == submitted - issued, an unheld healthy
  // stream holds nothing but a blocked wait. False means a bug of ours, in *why.
  bool validate(std::string* why = nullptr) const;

 private:
  // issued <= submitted; queued.size() == submitted - issued unless broken; the
  // op with ticket issued + 1 + i is queued[i].
  struct Queue {
    bool hold = false;
    Ticket submitted = 0;
    Ticket issued = 0;
    std::deque<Op> queued;  // not issued yet: behind the hold, or a wait on held work
    StreamFault fault;      // first failure of a held op issued later
    bool broken = false;    // even a no-op failed: nothing more is issued
    NativeStream adopted = nullptr;  // the program's stream, never held
    Ticket released_at = 0;          // `submitted` when it was last released
    bool native_given = false;       // native_stream() handed out ferry's own stream
    std::optional<std::vector<Op>> graphing;  // begin_graph: device work kept, a no-op issued instead
  };

  // Everything below runs with mu_ held.
  bool validate_locked(std::string* why) const;
  // With heavy validation on (validation.hpp), validate_locked() after a change.
  void check() const;
  // Stops the process when the device did not number an op as the layer did.
  void expect_numbered(StreamId stream, Ticket got, Ticket expected) const;
  // Issues held ops of `stream` through `ticket`, stopping early at a WaitOp
  // whose point is not issued yet (blocked).
  Result<void> dispatch_through(StreamId stream, Ticket ticket);
  // Issues held work of point.stream through the point, for the host to wait on
  // or export. Errors: invalid_argument (a point not handed out), timeout at once
  // when it waits for held work (named), the fault of a broken stream. `what`
  // starts the messages.
  Result<void> issue_for_host(StreamPoint point, std::string_view what);
  // Issues what unheld, blocked streams can issue now; repeats until nothing moves.
  void unblock();
  bool blocked(const Op& op) const;
  std::string describe_blockage(StreamPoint point) const;
  Result<void> issue_next(StreamId stream);
  // No ferry work in flight or queued, no native stream handed out: the id may
  // be given to a program's stream.
  bool adoptable(const Queue& q) const;

  Device& device_;
  const DeviceInfo& info_;
  mutable std::mutex mu_;
  std::array<Queue, kMaxStreams> queues_;
};

// Base: Backend, or an interface derived from it (SimBackend). A backend derives
// from HoldingBackend<Base> and from nothing else of the stream interface.
template <class Base>
class HoldingBackend : public Base, protected HoldQueues::Device {
 public:
  Result<Ticket> enqueue(StreamId stream, Op op) final { return queues_->enqueue(stream, std::move(op)); }
  Ticket submitted(StreamId stream) const final { return queues_->submitted(stream); }
  Ticket completed(StreamId stream) final { return queues_->completed(stream); }
  void set_hold(StreamId stream, bool hold) final { queues_->set_hold(stream, hold); }
  bool held(StreamId stream) const final { return queues_->held(stream); }
  Result<void> flush(StreamId stream) final { return queues_->flush(stream); }
  Result<void> flush_all() final { return queues_->flush_all(); }
  Result<void> wait(StreamPoint point, std::chrono::nanoseconds timeout) final {
    return queues_->wait(point, timeout);
  }
  Result<void> synchronize() final { return queues_->synchronize(); }
  Result<NativeStream> native_stream(StreamId stream) final { return queues_->native_stream(stream); }
  Result<StreamId> adopt_stream(NativeStream native) final { return queues_->adopt_stream(native); }
  Result<void> release_stream(StreamId stream, std::chrono::nanoseconds timeout) final {
    return queues_->release_stream(stream, timeout);
  }
  Result<NativeEvent> export_event(StreamPoint point) final { return queues_->export_event(point); }
  Result<void> release_event(NativeEvent event) final { return queues_->release_event(event); }
  Result<void> begin_graph(StreamId stream) final { return queues_->begin_graph(stream); }
  Result<NativeGraph> end_graph(StreamId stream) final { return queues_->end_graph(stream); }

 protected:
  // Call once the backend's DeviceInfo is final (the end of its constructor).
  void start_queues() { queues_.emplace(static_cast<HoldQueues::Device&>(*this), this->info()); }
  const HoldQueues& queues() const { return *queues_; }

 private:
  std::optional<HoldQueues> queues_;
};

}  // namespace ferry
