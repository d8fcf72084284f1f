#include "sim/sim_backend.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "core/invariant.hpp"
#include "core/text.hpp"
#include "ferry/op_contract.hpp"
#include "ferry/validation.hpp"

namespace ferry {

std::unique_ptr<SimBackend> make_sim_backend(const SimOptions& options) {
  return std::make_unique<sim::SimGpu>(options);
}

DeviceInfo sim_capabilities(DeviceInfo info) noexcept {
  info.modeled_time = true;
  info.host_visible = true;
  info.race_checking = true;
  info.fault_injection = true;
  info.lazy_host_ranges = true;
  info.peer_copy = true;
  info.profiled = true;
  return info;
}

namespace sim {
namespace {

static_assert(kMaxStreams <= 64, "SimGpu keeps the set of busy streams in one 64-bit mask");

using text::hex;

std::size_t link_index(Engine engine) { return engine == Engine::copy_h2d ? 0 : 1; }
bool is_copy(Engine engine) { return engine == Engine::copy_h2d || engine == Engine::copy_d2h; }

// The hold layer issues a WaitOp only after its point, so issued work always
// completes; a model that stops anyway is our bug, said so.
std::string stuck_reason() {
  return "no issued operation can make progress (the hold layer issues a wait only after its point: a bug)";
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

// Visits the set bits of a stream mask in ascending order: the tie-break order.
template <class Fn>
void for_each_stream(std::uint64_t mask, Fn&& fn) {
  while (mask != 0) {
    const auto s = static_cast<StreamId>(std::countr_zero(mask));
    mask &= mask - 1;
    fn(s);
  }
}

// An empty options.profile stands for "tiny"; a malformed one is made usable
// rather than refused, since make_sim_backend cannot fail.
DeviceProfile usable_profile(const DeviceProfile& given) {
  if (given.name.empty() && given.capacity == 0) return *find_profile("tiny");
  DeviceProfile p = given;
  p.granularity = std::bit_ceil(std::max<std::uint64_t>(p.granularity, 4096));
  p.copy_engines = std::max<std::uint32_t>(p.copy_engines, 1);
  return p;
}

}  // namespace

SimGpu::SimGpu(const SimOptions& options)
    : profile_(usable_profile(options.profile)),
      faults_(options.seed, options.faults),
      memory_(profile_.capacity, profile_.granularity, options.model_bytes_limit),
      streams_(kMaxStreams),
      compute_(1),
      copy_(profile_.copy_engines),
      races_(options.race_check ? std::make_shared<RaceChecker>(options.races_kept) : nullptr) {
  info_.backend = BackendKind::sim;
  info_.device = profile_.name;
  info_.capacity = profile_.capacity;
  info_.granularity = profile_.granularity;
  info_.virtual_memory = true;
  info_.batched_copy = !options.faults.batch_missing;
  info_.host_register = true;
  info_.h2d_bytes_per_s = profile_.h2d_bytes_per_s;
  info_.mem_bytes_per_s = profile_.mem_bytes_per_s;
  info_.flops_per_s = profile_.flops_per_s;
  info_ = sim_capabilities(std::move(info_));
  info_.native_graphs = options.native_graphs;
  start_queues();
}

// --- Device address space ---------------------------------------------------

Result<std::uint64_t> SimGpu::reserve_address(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  std::lock_guard memory(memory_mu_);
  return memory_.reserve(bytes);
}

Result<void> SimGpu::release_address(std::uint64_t base, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  std::lock_guard memory(memory_mu_);
  return memory_.release(base, bytes);
}

Result<void> SimGpu::map(std::uint64_t addr, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  ++map_calls_;
  if (faults_.fails_map_call(map_calls_)) {
    ++failed_maps_;
    return make_error(ErrorCode::out_of_memory,
                      "map(" + hex(addr) + ", " + text::exact_bytes(bytes) + "): injected failure of map "
                          "call " + std::to_string(map_calls_) + " (SimFaults::fail_map_call)");
  }
  Result<void> r = [&] {
    std::lock_guard memory(memory_mu_);
    return memory_.map(addr, bytes);
  }();
  heavy_check();
  return r;
}

Result<void> SimGpu::unmap(std::uint64_t addr, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  Result<void> r = [&] {
    std::lock_guard memory(memory_mu_);
    return memory_.unmap(addr, bytes);
  }();
  heavy_check();
  return r;
}

std::uint64_t SimGpu::mapped_bytes() const {
  std::lock_guard lock(mutex_);
  return memory_.mapped_bytes();
}

// --- Streams ----------------------------------------------------------------

Result<void> SimGpu::check_healthy() const {
  if (first_fault_.empty()) return {};
  return make_error(ErrorCode::backend_error,
                    "the simulated device has failed (sticky, like a CUDA illegal address): " +
                        first_fault_);
}

Result<void> SimGpu::admit(StreamId stream, const Op& op) {
  if (const auto* p = std::get_if<PeerCopyOp>(&op)) {
    // As on cuda, the source must be mapped on the peer when the copy is enqueued
    // (before mutex_: the peer's memory_mu_ is a leaf).
    Result<const SimGpu*> peer = peer_sim(stream, *p);
    if (!peer.ok()) return std::move(peer).error();
    if (Result<void> mapped = (*peer)->read_for_peer(p->src_addr, p->dst.bytes, {}); !mapped.ok()) {
      return make_error(ErrorCode::invalid_argument,
                        "enqueue(copy_peer) on stream " + std::to_string(stream) + ": " + mapped.error().message);
    }
  }
  const auto* wait = std::get_if<NativeWaitOp>(&op);
  if (wait != nullptr && wait->peer != nullptr) FERRY_TRY(peer_of(stream, *wait));  // before mutex_ (leaf locks)
  std::lock_guard lock(mutex_);
  FERRY_TRY(check_healthy());
  // As on cuda, memory must be mapped when its op is enqueued; memory unmapped
  // after that is the illegal access apply() detects (an I2 violation).
  std::optional<std::string> unmapped;
  for_each_device_range(op, [&](const DeviceOperand& d) {
    if (unmapped) return;
    if (const auto hole = memory_.first_unmapped(d.addr, d.bytes)) {
      unmapped = std::string(d.role) + " " + text::range(d.addr, d.bytes) + " is not mapped (at " + hex(*hole) + ")";
    }
  });
  if (wait != nullptr && wait->peer == nullptr && !events_.contains(wait->event)) {
    unmapped = "event " + hex(wait->event) + " is not one export_event made (the sim has no other native events)";
  }
  if (!unmapped) {
    Result<void> held = prepare_storage(op);
    if (held.ok()) return held;
    Error e = std::move(held).error();
    e.message = "enqueue(" + std::string(op_name(op)) + ") on stream " + std::to_string(stream) + ": " + e.message;
    return e;
  }
  return make_error(ErrorCode::invalid_argument, "enqueue(" + std::string(op_name(op)) + ") on stream " +
                                                     std::to_string(stream) + ": " + *unmapped);
}

Result<Ticket> SimGpu::issue(StreamId stream, Op op) {
  std::optional<RaceChecker::PeerSide> race_peer;  // the peer's device in races_, when they share it
  if (const auto* p = std::get_if<PeerCopyOp>(&op)) race_peer = races_shared_with(*p->peer, {});
  std::optional<PeerPoint> across;  // a wait across devices, resolved on the peer (see the header)
  if (const auto* w = std::get_if<NativeWaitOp>(&op); w != nullptr && w->peer != nullptr) {
    Result<SimGpu*> peer = peer_of(stream, *w);
    if (!peer.ok()) return std::move(peer).error();
    Result<PeerPoint> at = (*peer)->run_to_event(w->event);
    if (!at.ok()) {
      Error e = std::move(at).error();
      e.message = "native wait on stream " + std::to_string(stream) + " for another device's event: " + e.message;
      return e;
    }
    across = *at;
    race_peer = races_shared_with(*w->peer, at->point);
  }
  std::lock_guard lock(mutex_);
  FERRY_TRY(check_healthy());
  if (const auto* w = std::get_if<NativeWaitOp>(&op); w != nullptr && !across) {
    // The event stands for its point: from here on it is a wait like any other.
    const auto event = events_.find(w->event);
    if (event == events_.end()) {
      return make_error(ErrorCode::invalid_argument, "native wait on stream " + std::to_string(stream) + ": event " +
                                                         hex(w->event) + " was released before it was issued");
    }
    op = WaitOp{*event->second};
  }
  StreamState& st = streams_[stream];
  if (races_) races_->issue(race_device_, stream, st.submitted + 1, op, race_peer ? &*race_peer : nullptr);
  PendingOp pending;
  pending.ticket = ++st.submitted;
  pending.engine = engine_of(op);
  pending.issued_ns = now_;
  pending.op = std::move(op);
  if (across) pending.not_before_ns = across->done_ns;
  st.ops.push_back(std::move(pending));
  active_ |= std::uint64_t{1} << stream;
  start_ready_ops();
  return st.submitted;
}

Ticket SimGpu::issued_completed(StreamId stream) {
  std::lock_guard lock(mutex_);
  // A pure read: polling must not change the schedule it observes. What the
  // host learns orders its later enqueues, though (race_checker.hpp).
  if (stream >= kMaxStreams) return 0;
  if (races_) races_->host_waited(race_device_, {stream, streams_[stream].completed});
  return streams_[stream].completed;
}

bool SimGpu::point_complete(StreamPoint point) const {
  return streams_[point.stream].completed >= point.ticket;
}

Result<void> SimGpu::wait_issued(StreamPoint point, std::chrono::nanoseconds timeout) {
  std::lock_guard lock(mutex_);
  FERRY_TRY(check_healthy());
  const auto budget = static_cast<std::uint64_t>(std::max<std::int64_t>(timeout.count(), 0));
  const std::uint64_t deadline = saturating_add(now_, budget);
  const RunEnd end = run_until(deadline, [&] { return point_complete(point); });
  FERRY_TRY(check_healthy());
  switch (end) {
    case RunEnd::done:
      if (races_) races_->host_waited(race_device_, point);
      return streams_[point.stream].fault.check(point.ticket);
    case RunEnd::reached:
      return make_error(ErrorCode::timeout,
                        "wait for " + text::point(point) + ": not complete after " +
                            std::to_string(budget) + " ns of virtual time (completed through ticket " +
                            std::to_string(streams_[point.stream].completed) + ")");
    case RunEnd::stuck:
      break;
  }
  return make_error(ErrorCode::timeout, "wait for " + text::point(point) +
                                            " can never complete: " + stuck_reason());
}

Result<SimGpu::PeerPoint> SimGpu::run_to_event(NativeEvent event) {
  std::lock_guard lock(mutex_);
  const auto found = events_.find(event);
  if (found == events_.end()) {
    return make_error(ErrorCode::invalid_argument, "event " + hex(event) + " was released before the wait on it was issued");
  }
  const StreamPoint point = *found->second;
  FERRY_TRY(check_healthy());
  const RunEnd end = run_until(UINT64_MAX, [&] { return point_complete(point); });
  FERRY_TRY(check_healthy());
  if (end != RunEnd::done) {
    return make_error(ErrorCode::timeout, "the peer's " + text::point(point) + " can never complete: " + stuck_reason());
  }
  // The point completed at or before its stream's last completion (exactly then
  // when this run completed it).
  return PeerPoint{point, streams_[point.stream].last_completion_ns};
}

Result<void> SimGpu::synchronize_issued() {
  std::lock_guard lock(mutex_);
  const RunEnd end = run_until(UINT64_MAX, [&] { return active_ == 0; });
  if (races_ && end == RunEnd::done) {
    std::array<Ticket, kMaxStreams> issued{};
    for (StreamId s = 0; s < kMaxStreams; ++s) issued[s] = streams_[s].submitted;
    races_->host_synchronized(race_device_, issued);
  }
  FERRY_TRY(check_healthy());
  if (end != RunEnd::done) {
    const auto s = static_cast<StreamId>(std::countr_zero(active_));
    const StreamPoint front{s, streams_[s].completed + 1};
    return make_error(ErrorCode::timeout,
                      "synchronize can never finish at " + text::point(front) + ": " + stuck_reason());
  }
  return {};
}

// --- The event loop ---------------------------------------------------------

void SimGpu::settle() {
  for (;;) {
    start_ready_ops();
    const std::optional<std::uint64_t> next = next_completion();
    if (!next || *next > now_) return;
    complete_ops_at(now_);
  }
}

template <class Done>
SimGpu::RunEnd SimGpu::run_until(std::uint64_t until, Done&& done) {
  for (;;) {
    settle();
    if (done()) return RunEnd::done;
    const std::optional<std::uint64_t> next = next_completion();
    if (!next) return RunEnd::stuck;
    if (*next > until) {
      now_ = until;
      return RunEnd::reached;
    }
    now_ = *next;
    complete_ops_at(now_);
  }
}

void SimGpu::start_ready_ops() {
  struct Candidate {
    std::uint64_t ready_ns;
    StreamId stream;
  };
  std::array<Candidate, kMaxStreams> candidates;
  std::size_t count = 0;
  for_each_stream(active_, [&](StreamId s) {
    const StreamState& st = streams_[s];
    const PendingOp& op = st.ops.front();
    if (op.started) return;
    if (const auto* w = std::get_if<WaitOp>(&op.op); w != nullptr && !point_complete(w->point)) {
      return;
    }
    candidates[count++] = {std::max(op.issued_ns, st.last_completion_ns), s};
  });
  // Engines go to the op that has been ready longest; ties by stream (each
  // stream offers only its front ticket), so the schedule is deterministic.
  std::sort(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(count),
            [](const Candidate& a, const Candidate& b) {
              return a.ready_ns != b.ready_ns ? a.ready_ns < b.ready_ns : a.stream < b.stream;
            });
  for (std::size_t i = 0; i < count; ++i) {
    const StreamId s = candidates[i].stream;
    PendingOp& op = streams_[s].ops.front();
    if (op.engine != Engine::none) {
      auto& units = op.engine == Engine::compute ? compute_ : copy_;
      const auto free_unit = std::find(units.begin(), units.end(), std::nullopt);
      if (free_unit == units.end()) continue;
      // One copy per direction of the host link at a time (see the header).
      if (is_copy(op.engine)) {
        std::optional<StreamId>& link = link_[link_index(op.engine)];
        if (link.has_value()) continue;
        link = s;
      }
      *free_unit = s;
      op.unit = static_cast<std::uint32_t>(free_unit - units.begin());
    }
    op.started = true;
    op.finish_ns = std::max(op.not_before_ns, saturating_add(saturating_add(now_, duration_ns(op.op)),
                                                             faults_.completion_delay(s, op.ticket)));
  }
  heavy_check();
}

std::optional<std::uint64_t> SimGpu::next_completion() const {
  std::optional<std::uint64_t> next;
  for_each_stream(active_, [&](StreamId s) {
    const PendingOp& op = streams_[s].ops.front();
    if (op.started && (!next || op.finish_ns < *next)) next = op.finish_ns;
  });
  return next;
}

void SimGpu::complete_ops_at(std::uint64_t t) {
  for_each_stream(active_, [&](StreamId s) {
    StreamState& st = streams_[s];
    const PendingOp& op = st.ops.front();
    if (!op.started || op.finish_ns != t) return;
    apply(s, op);
    if (op.engine == Engine::compute) compute_[op.unit].reset();
    if (is_copy(op.engine)) {
      copy_[op.unit].reset();
      link_[link_index(op.engine)].reset();
    }
    if (op.engine == Engine::copy_peer) copy_[op.unit].reset();
    st.ops.pop_front();
    st.completed += 1;
    st.last_completion_ns = t;
    if (st.ops.empty()) active_ &= ~(std::uint64_t{1} << s);
  });
}

std::uint64_t SimGpu::duration_ns(const Op& op) const {
  return modeled_ns(op, profile_, [&](const std::byte* ptr, std::uint64_t bytes) {
    return host_.find(ptr, bytes) != nullptr;
  });
}

// --- Host memory ------------------------------------------------------------

std::optional<StreamPoint> SimGpu::host_pointer_user(const std::byte* begin,
                                                     std::uint64_t bytes) const {
  std::optional<StreamPoint> user;
  for_each_stream(active_, [&](StreamId s) {
    for (const PendingOp& op : streams_[s].ops) {
      if (!user && touches_host(op.op, begin, bytes)) user = StreamPoint{s, op.ticket};
    }
  });
  return user;
}

Result<std::byte*> SimGpu::allocate_pinned(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  return host_.allocate(bytes, faults_.pinned_stale_at(now_, host_.churn(), host_.pins()));
}

Result<void> SimGpu::free_pinned(std::byte* ptr) {
  // Freeing under queued work would leave the device reading freed memory; the
  // caller must wait first (the arena's leases do). Held work first: the hold
  // layer's lock is taken before mutex_, never inside it.
  std::uint64_t bytes = 0;
  {
    std::lock_guard lock(mutex_);
    if (const PinnedRange* range = host_.allocation_at(ptr)) bytes = range->bytes;
  }
  if (const auto user = bytes > 0 ? queues().held_user(ptr, bytes) : std::nullopt) {
    return make_error(ErrorCode::invalid_argument,
                      "free_pinned(" + hex(ptr) + "): " + text::point(*user) +
                          " is held in the host-side queue and still uses this buffer; wait for it first");
  }
  std::lock_guard lock(mutex_);
  if (const PinnedRange* range = host_.allocation_at(ptr)) {
    if (const auto user = host_pointer_user(ptr, range->bytes)) {
      return make_error(ErrorCode::invalid_argument,
                        "free_pinned(" + hex(ptr) + "): " + text::point(*user) +
                            " has not completed and still uses this buffer; wait for it first");
    }
  }
  return host_.free(ptr);
}

Result<void> SimGpu::register_host(std::byte* ptr, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  return host_.register_range(ptr, bytes,
                              faults_.pinned_stale_at(now_, host_.churn(), host_.pins()));
}

Result<void> SimGpu::unregister_host(std::byte* ptr) {
  std::lock_guard lock(mutex_);
  return host_.unregister(ptr);
}

HostMemoryStats SimGpu::host_stats() const {
  std::lock_guard lock(mutex_);
  return host_.stats();
}

// --- Time and sim-only controls ---------------------------------------------

std::uint64_t SimGpu::now_ns() const {
  std::lock_guard lock(mutex_);
  return now_;
}

void SimGpu::advance(std::uint64_t ns) {
  std::lock_guard lock(mutex_);
  const std::uint64_t target = saturating_add(now_, ns);
  run_until(target, [] { return false; });
  now_ = target;
}

std::shared_ptr<const RaceLog> SimGpu::race_log() const {
  std::lock_guard lock(mutex_);
  if (!races_) return nullptr;
  return std::make_shared<const RaceLog>(races_->log());  // a snapshot
}

void SimGpu::note_host_access(const std::byte* ptr, std::uint64_t bytes, Access access) {
  std::lock_guard lock(mutex_);
  if (races_) races_->host_access(ptr, bytes, access);
}

void SimGpu::note_block(std::uint64_t addr, std::uint64_t bytes, const DeviceHandle& handle, std::string_view tag) {
  if (races_) note_block_checked(addr, bytes, handle, tag);  // races_ is set before the first op
}

void SimGpu::note_block_checked(std::uint64_t addr, std::uint64_t bytes, const DeviceHandle& handle,
                                std::string_view tag) {
  std::lock_guard lock(mutex_);
  races_->block(race_device_, addr, bytes, handle, tag);
}

FaultCounters SimGpu::fault_counters() const {
  std::lock_guard lock(mutex_);
  return {illegal_accesses_, swallowed_copies_, 0, failed_maps_, swallowed_peer_copies_};
}

Result<void> SimGpu::peek(std::uint64_t addr, std::span<std::byte> out) const {
  std::lock_guard lock(mutex_);
  if (out.empty()) return {};
  if (addr == 0 || addr > UINT64_MAX - out.size()) {
    return make_error(ErrorCode::invalid_argument,
                      "peek " + text::range(addr, out.size()) + ": starts at 0 or wraps around");
  }
  if (const auto hole = memory_.first_unmapped(addr, out.size())) {
    return make_error(ErrorCode::invalid_argument,
                      "peek " + text::range(addr, out.size()) + ": " + hex(*hole) + " is not mapped");
  }
  memory_.read(addr, out);
  return {};
}

bool SimGpu::validate(std::string* why) const {
  // The layer's state, then the model's: two locks taken one after the other.
  if (!queues().validate(why)) return false;
  std::lock_guard lock(mutex_);
  return validate_locked(why);
}

void SimGpu::heavy_check() const {
  detail::check_invariants(heavy_validation_default(), "sim backend",
                           [&](std::string* why) { return validate_locked(why); });
}

bool SimGpu::validate_locked(std::string* why) const {
  const auto fail = [&](std::string what) {
    if (why != nullptr) *why = std::move(what);
    return false;
  };
  if (!memory_.validate()) return fail("device memory bookkeeping is inconsistent");
  if (!host_.validate()) return fail("pinned host memory bookkeeping is inconsistent");
  for (StreamId s = 0; s < kMaxStreams; ++s) {
    const StreamState& st = streams_[s];
    // Runs after every op under heavy validation: no text is built unless a check fails.
    const auto name = [s] { return "stream " + std::to_string(s) + ": "; };
    if (st.completed > st.submitted) return fail(name() + "expected completed <= submitted");
    if (st.ops.size() != st.submitted - st.completed) return fail(name() + "op count mismatch");
    if (((active_ >> s) & 1) != (st.ops.empty() ? 0u : 1u)) return fail(name() + "active mask wrong");
    std::uint64_t i = 0;
    for (const PendingOp& op : st.ops) {
      if (op.ticket != st.completed + 1 + i) return fail(name() + "tickets out of order");
      if (op.started && (i > 0 || op.finish_ns < now_)) {
        return fail(name() + "only the front op may run, and not in the past");
      }
      if (op.started && op.engine != Engine::none) {
        const auto& units = op.engine == Engine::compute ? compute_ : copy_;
        if (op.unit >= units.size() || units[op.unit] != s) return fail(name() + "engine not owned");
      }
      ++i;
    }
  }
  for (std::size_t d = 0; d < link_.size(); ++d) {
    const std::optional<StreamId> owner = link_[d];
    if (!owner) continue;
    const StreamState& st = streams_[*owner];
    if (st.ops.empty() || !st.ops.front().started || !is_copy(st.ops.front().engine) ||
        link_index(st.ops.front().engine) != d) {
      return fail("a host link direction is owned by a stream that runs no copy on it");
    }
  }
  for (StreamId s = 0; s < kMaxStreams; ++s) {
    const StreamState& st = streams_[s];
    if (st.ops.empty()) continue;
    const PendingOp& front = st.ops.front();
    if (!front.started || !is_copy(front.engine)) continue;
    if (link_[link_index(front.engine)] != s) {
      return fail("stream " + std::to_string(s) + ": a running copy does not own its link");
    }
  }
  for (const auto* units : {&compute_, &copy_}) {
    for (std::size_t u = 0; u < units->size(); ++u) {
      const std::optional<StreamId> owner = (*units)[u];
      if (!owner) continue;
      const StreamState& st = streams_[*owner];
      if (st.ops.empty() || !st.ops.front().started || st.ops.front().unit != u) {
        return fail("an engine is owned by a stream that runs nothing on it");
      }
    }
  }
  return true;
}

}  // namespace sim
}  // namespace ferry
