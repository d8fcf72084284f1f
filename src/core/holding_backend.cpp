#include <limits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/invariant.hpp"
#include "core/text.hpp"
#include "ferry/holding_backend.hpp"
#include "ferry/op_contract.hpp"
#include "ferry/user_kernel.hpp"
#include "ferry/validation.hpp"

namespace ferry {
namespace {

constexpr Ticket kAll = std::numeric_limits<Ticket>::max();

Error bad_stream(const char* what, StreamId stream) { return check_stream(stream, what).error(); }

}  // namespace

Result<Ticket> HoldQueues::enqueue(StreamId stream, Op op) {
  FERRY_TRY(refuse_inside_user_kernel("enqueue"));
  {
    std::lock_guard lock(mu_);
    FERRY_TRY(check_op(stream, op, info_, [&](StreamId s) { return queues_[s].submitted; }));
  }
  // A backend's own checks may be slow (cuda makes a stream's cuBLAS handle):
  // they run with no lock of the layer's. check_op's verdict stands meanwhile,
  // since tickets only grow.
  FERRY_TRY(device_.admit(stream, op));
  std::lock_guard lock(mu_);
  Queue& q = queues_[stream];
  if (q.broken) return *q.fault.error;
  if (q.graphing && !std::holds_alternative<WaitOp>(op) && !std::holds_alternative<NativeWaitOp>(op)) {
    // Kept for the graph; the no-op carries its ticket, so its leases retire.
    q.graphing->push_back(std::move(op));
    op = NopOp{};
  }
  if (q.hold || !q.queued.empty() || blocked(op)) {  // behind a hold, or a wait on held work
    q.queued.push_back(std::move(op));
    const Ticket ticket = ++q.submitted;
    check();
    return ticket;
  }
  if (const auto* w = std::get_if<WaitOp>(&op); w != nullptr && w->point.ticket > queues_[w->point.stream].issued) {
    return *queues_[w->point.stream].fault.error;  // the point was lost on a broken stream
  }
  // Nothing of this stream waits in the queue: issued at once, and on failure
  // the ticket is not handed out.
  Result<Ticket> got = device_.issue(stream, std::move(op));
  if (!got.ok()) return std::move(got).error();
  expect_numbered(stream, *got, q.submitted + 1);
  q.issued = q.submitted = *got;
  check();
  return *got;
}

Result<NativeGraph> HoldQueues::Device::build_graph(StreamId stream, std::vector<Op> ops) {
  (void)ops;
  return make_error(ErrorCode::unsupported,
                    "end_graph on stream " + std::to_string(stream) + ": this device makes no native graphs");
}

Result<void> HoldQueues::begin_graph(StreamId stream) {
  FERRY_TRY(refuse_inside_user_kernel("begin_graph"));
  if (stream >= kMaxStreams) return bad_stream("begin_graph", stream);
  if (!info_.native_graphs) {
    return make_error(ErrorCode::unsupported, "begin_graph: this device makes no native graphs");
  }
  std::lock_guard lock(mu_);
  Queue& q = queues_[stream];
  if (q.graphing) {
    return make_error(ErrorCode::invalid_argument,
                      "begin_graph: stream " + std::to_string(stream) + " keeps ops for a graph already");
  }
  q.graphing.emplace();
  return {};
}

Result<NativeGraph> HoldQueues::end_graph(StreamId stream) {
  FERRY_TRY(refuse_inside_user_kernel("end_graph"));
  if (stream >= kMaxStreams) return bad_stream("end_graph", stream);
  std::vector<Op> ops;
  {
    std::lock_guard lock(mu_);
    Queue& q = queues_[stream];
    if (!q.graphing) {
      return make_error(ErrorCode::invalid_argument,
                        "end_graph: stream " + std::to_string(stream) + " keeps no ops for a graph");
    }
    ops = std::move(*q.graphing);
    q.graphing.reset();
  }
  if (ops.empty()) {
    return make_error(ErrorCode::invalid_argument,
                      "end_graph: no device work was enqueued on stream " + std::to_string(stream));
  }
  return device_.build_graph(stream, std::move(ops));
}

Ticket HoldQueues::submitted(StreamId stream) const {
  if (stream >= kMaxStreams) return 0;
  std::lock_guard lock(mu_);
  return queues_[stream].submitted;
}

Ticket HoldQueues::completed(StreamId stream) {
  if (stream >= kMaxStreams) return 0;
  return device_.issued_completed(stream);
}

void HoldQueues::set_hold(StreamId stream, bool hold) {
  if (inside_user_kernel()) return;  // refused (refuse_inside_user_kernel): it would deadlock
  if (stream >= kMaxStreams) return;
  std::lock_guard lock(mu_);
  if (queues_[stream].adopted != nullptr) return;  // the program's stream: never held
  // A failure is kept as the stream's fault, reported by flush and by waits.
  queues_[stream].hold = hold;
  if (!hold) {
    (void)dispatch_through(stream, kAll);
    unblock();
  }
  check();
}

bool HoldQueues::held(StreamId stream) const {
  if (stream >= kMaxStreams) return false;
  std::lock_guard lock(mu_);
  return queues_[stream].hold;
}

Result<void> HoldQueues::flush(StreamId stream) {
  FERRY_TRY(refuse_inside_user_kernel("flush"));
  if (stream >= kMaxStreams) return bad_stream("flush", stream);
  std::lock_guard lock(mu_);
  Result<void> r = dispatch_through(stream, kAll);
  unblock();
  check();
  return r;
}

Result<void> HoldQueues::flush_all() {
  FERRY_TRY(refuse_inside_user_kernel("flush"));
  std::lock_guard lock(mu_);
  Result<void> first;
  // Rounds until nothing moves: a stream blocked on another's held work goes
  // out once that work has, whatever order the streams come in.
  for (bool moved = true; moved;) {
    moved = false;
    for (StreamId s = 0; s < kMaxStreams; ++s) {
      const Ticket before = queues_[s].issued;
      Result<void> r = dispatch_through(s, kAll);
      if (!r.ok() && first.ok()) first = std::move(r);
      moved = moved || queues_[s].issued != before;
    }
  }
  check();
  return first;
}

Result<void> HoldQueues::issue_for_host(StreamPoint point, std::string_view what) {
  Queue& q = queues_[point.stream];
  if (point.ticket > q.submitted) {
    return make_error(ErrorCode::invalid_argument, std::string(what) + " " + text::point(point) +
                                                       ": that stream has only " + std::to_string(q.submitted) +
                                                       " tickets");
  }
  (void)dispatch_through(point.stream, point.ticket);  // a failure becomes the stream's fault
  unblock();
  check();
  if (point.ticket > q.issued) {
    if (q.broken) return *q.fault.error;
    return make_error(ErrorCode::timeout,
                      std::string(what) + " " + text::point(point) + " can never complete: " + describe_blockage(point));
  }
  return {};
}

Result<void> HoldQueues::wait(StreamPoint point, std::chrono::nanoseconds timeout) {
  FERRY_TRY(refuse_inside_user_kernel("wait"));
  if (point.stream >= kMaxStreams) return bad_stream("wait", point.stream);
  {
    std::lock_guard lock(mu_);
    FERRY_TRY(issue_for_host(point, "wait for"));
  }
  FERRY_TRY(device_.wait_issued(point, timeout));
  std::lock_guard lock(mu_);
  const Queue& q = queues_[point.stream];
  return q.fault.check(point.ticket);
}

Result<void> HoldQueues::synchronize() {
  FERRY_TRY(refuse_inside_user_kernel("synchronize"));
  Result<void> first = flush_all();
  Result<void> done = device_.synchronize_issued();
  return first.ok() ? done : first;
}

bool HoldQueues::validate(std::string* why) const {
  std::lock_guard lock(mu_);
  return validate_locked(why);
}

void HoldQueues::check() const {
  detail::check_invariants(heavy_validation_default(), "HoldQueues",
                           [&](std::string* why) { return validate_locked(why); });
}

void HoldQueues::expect_numbered(StreamId stream, Ticket got, Ticket expected) const {
  // A device that numbers its ops otherwise would make every later wait name the
  // wrong work (a silent race): our bug, stopped in every build type.
  if (got == expected) return;
  detail::invariant_broken("HoldQueues", "the device issued " + text::point({stream, got}) + " as " +
                                             text::point({stream, expected}));
}

bool HoldQueues::validate_locked(std::string* why) const {
  for (StreamId s = 0; s < kMaxStreams; ++s) {
    const Queue& q = queues_[s];
    const auto fail = [&](const char* what) {
      if (why != nullptr) *why = "hold queue of stream " + std::to_string(s) + ": " + what;
      return false;
    };
    if (q.issued > q.submitted) return fail("issued past submitted");
    if (!q.broken && q.queued.size() != q.submitted - q.issued) return fail("held ops != submitted - issued");
    if (!q.hold && !q.broken && !q.queued.empty() && !blocked(q.queued.front())) {
      return fail("neither held nor blocked, yet ops wait in the queue");
    }
    if (q.broken && !q.fault.error) return fail("broken without a fault");
    if (q.adopted != nullptr && q.hold) return fail("an adopted stream is held");
  }
  return true;
}

Result<void> HoldQueues::dispatch_through(StreamId stream, Ticket ticket) {
  Queue& q = queues_[stream];
  Result<void> first;
  while (!q.broken && !q.queued.empty() && q.issued < ticket && !blocked(q.queued.front())) {
    Result<void> r = issue_next(stream);
    if (!r.ok() && first.ok()) first = std::move(r);
  }
  if (q.broken && first.ok() && q.issued < std::min(ticket, q.submitted)) first = *q.fault.error;
  return first;
}

void HoldQueues::unblock() {
  for (bool moved = true; moved;) {
    moved = false;
    for (StreamId s = 0; s < kMaxStreams; ++s) {
      Queue& q = queues_[s];
      if (q.hold || q.broken || q.queued.empty()) continue;
      const Ticket before = q.issued;
      (void)dispatch_through(s, kAll);  // a failure becomes the stream's fault
      moved = moved || q.issued != before;
    }
  }
}

// A WaitOp for a point still held (not issued, on a stream that is not broken:
// a broken stream's point fails the wait instead).
bool HoldQueues::blocked(const Op& op) const {
  const auto* w = std::get_if<WaitOp>(&op);
  if (w == nullptr) return false;
  const Queue& other = queues_[w->point.stream];
  return w->point.ticket > other.issued && !other.broken;
}

std::string HoldQueues::describe_blockage(StreamPoint point) const {
  std::string why;
  StreamPoint p = point;
  // Each hop follows a wait to a point enqueued earlier, so the chain is short
  // and acyclic; the bound only guards against a bug.
  for (std::size_t hop = 0; hop <= kMaxStreams; ++hop) {
    const Queue& q = queues_[p.stream];
    if (q.issued >= p.ticket || q.queued.empty()) break;
    const StreamPoint front{p.stream, q.issued + 1};
    const auto* w = std::get_if<WaitOp>(&q.queued.front());
    if (q.hold || w == nullptr) {
      return why + text::point(front) + " is held in the stream's host-side queue (flush the stream or release its hold)";
    }
    why += "stream " + std::to_string(p.stream) + " is blocked at ticket " + std::to_string(front.ticket) +
           ", a wait for " + text::point(w->point) + "; ";
    p = w->point;
  }
  return why + "no operation can make progress";
}

std::optional<StreamPoint> HoldQueues::held_user(const std::byte* begin, std::uint64_t bytes) const {
  std::lock_guard lock(mu_);
  for (StreamId s = 0; s < kMaxStreams; ++s) {
    const Queue& q = queues_[s];
    for (std::size_t i = 0; i < q.queued.size(); ++i) {
      if (touches_host(q.queued[i], begin, bytes)) return StreamPoint{s, q.issued + 1 + i};
    }
  }
  return std::nullopt;
}

Result<void> HoldQueues::issue_next(StreamId stream) {
  Queue& q = queues_[stream];
  const Ticket ticket = q.issued + 1;
  Op op = std::move(q.queued.front());
  q.queued.pop_front();
  Result<void> ready;  // a wait on a broken stream's lost point fails with that stream's fault
  if (const auto* w = std::get_if<WaitOp>(&op); w != nullptr && w->point.ticket > queues_[w->point.stream].issued) {
    ready = *queues_[w->point.stream].fault.error;
  }
  Result<Ticket> got = ready.ok() ? device_.issue(stream, std::move(op)) : Result<Ticket>(ready.error());
  if (got.ok()) {
    expect_numbered(stream, *got, ticket);
    q.issued = *got;
    return {};
  }
  Error error = std::move(got).error();
  q.fault.record(ticket, error);
  // The ticket still completes in order, so leases on it retire.
  Result<Ticket> nop = device_.issue(stream, NopOp{});
  if (nop.ok()) {
    expect_numbered(stream, *nop, ticket);
    q.issued = *nop;
  } else {
    q.broken = true;
    q.queued.clear();
  }
  return error;
}

bool HoldQueues::adoptable(const Queue& q) const {
  return q.adopted == nullptr && !q.hold && !q.native_given && q.queued.empty() && q.submitted == q.released_at;
}

Result<NativeStream> HoldQueues::native_stream(StreamId stream) {
  if (stream >= kMaxStreams) return bad_stream("native_stream", stream);
  std::lock_guard lock(mu_);
  Queue& q = queues_[stream];
  if (q.adopted != nullptr) return q.adopted;
  Result<NativeStream> native = device_.native_of(stream);
  if (native.ok()) q.native_given = true;  // the program may use it: never given away
  return native;
}

Result<StreamId> HoldQueues::adopt_stream(NativeStream native) {
  FERRY_TRY(refuse_inside_user_kernel("adopt_stream"));
  if (native == nullptr) return make_error(ErrorCode::invalid_argument, "adopt_stream: the native stream is null");
  std::lock_guard lock(mu_);
  for (StreamId s = 0; s < kMaxStreams; ++s) {
    if (queues_[s].adopted == native) {
      return make_error(ErrorCode::invalid_argument, "adopt_stream(" + text::hex(native) +
                                                         "): adopted already, as stream " + std::to_string(s));
    }
  }
  // kFirstAdoptedStream up, then below it from the top: away from the ids a
  // program numbers its own ferry streams with (stream.hpp).
  constexpr StreamId kUpward = kLastAdoptedStream - kFirstAdoptedStream + 1;
  for (StreamId i = 0; i < kLastAdoptedStream + 1; ++i) {
    const StreamId s = i < kUpward ? kFirstAdoptedStream + i : kFirstAdoptedStream - 1 - (i - kUpward);
    Queue& q = queues_[s];
    if (!adoptable(q)) continue;
    FERRY_TRY(device_.bind_stream(s, native));
    q.adopted = native;
    check();
    return s;
  }
  return make_error(ErrorCode::out_of_memory, "adopt_stream(" + text::hex(native) + "): all " +
                                                  std::to_string(kLastAdoptedStream + 1) +
                                                  " adoptable stream ids carry ferry work or an adopted stream");
}

Result<void> HoldQueues::release_stream(StreamId stream, std::chrono::nanoseconds timeout) {
  FERRY_TRY(refuse_inside_user_kernel("release_stream"));
  if (stream >= kMaxStreams) return bad_stream("release_stream", stream);
  const auto not_adopted = [&] {
    return make_error(ErrorCode::invalid_argument,
                      "release_stream(" + std::to_string(stream) + "): not an adopted stream");
  };
  for (;;) {
    Ticket last = 0;
    {
      std::lock_guard lock(mu_);
      Queue& q = queues_[stream];
      if (q.adopted == nullptr) return not_adopted();
      (void)dispatch_through(stream, kAll);  // never held; a wait on held work may block it
      unblock();
      if (q.issued < q.submitted && !q.broken) {
        return make_error(ErrorCode::timeout, "release_stream(" + std::to_string(stream) + "): " +
                                                  describe_blockage({stream, q.submitted}));
      }
      last = q.issued;
    }
    Result<void> waited = device_.wait_issued({stream, last}, timeout);
    // A stream fault is not a reason to keep the stream: its tickets completed.
    if (device_.issued_completed(stream) < last) {
      return waited.ok() ? make_error(ErrorCode::backend_error, "release_stream: the wait ended early") : waited;
    }
    std::lock_guard lock(mu_);
    Queue& q = queues_[stream];
    if (q.adopted == nullptr) return not_adopted();  // released by another thread meanwhile
    if (!q.broken && q.submitted != last) continue;  // work enqueued meanwhile: wait for it too
    FERRY_TRY(device_.unbind_stream(stream));
    q.adopted = nullptr;
    q.released_at = q.submitted;
    check();
    return {};
  }
}

Result<NativeEvent> HoldQueues::export_event(StreamPoint point) {
  if (point.stream >= kMaxStreams) return bad_stream("export_event", point.stream);
  std::lock_guard lock(mu_);
  FERRY_TRY(issue_for_host(point, "export_event for"));
  return device_.export_issued(point);
}

Result<void> HoldQueues::release_event(NativeEvent event) {
  std::lock_guard lock(mu_);
  // A queued native wait binds to the event only when it is issued: released now,
  // the event could be recycled for another point and the wait wait for that.
  for (StreamId s = 0; s < kMaxStreams; ++s) {
    const Queue& q = queues_[s];
    for (std::size_t i = 0; i < q.queued.size(); ++i) {
      const auto* w = std::get_if<NativeWaitOp>(&q.queued[i]);
      if (w != nullptr && w->event == event) {
        return make_error(ErrorCode::invalid_argument,
                          "release_event(" + text::hex(event) + "): " + text::point({s, q.issued + 1 + i}) +
                              " still waits on it in the host-side queue; release it once that is dispatched");
      }
    }
  }
  return device_.release_export(event);
}

}  // namespace ferry
