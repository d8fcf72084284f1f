#include "sim/sim_backend.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "ferry/gemm.hpp"
#include "sim/diagnostics.hpp"

namespace ferry {

std::unique_ptr<SimBackend> make_sim_backend(const SimOptions& options) {
  return std::make_unique<sim::SimGpu>(options);
}

namespace sim {
namespace {

static_assert(kMaxStreams <= 64, "SimGpu keeps the set of busy streams in one 64-bit mask");

constexpr const char* kOpNames[] = {"fill", "copy_to_device", "copy_to_host", "copy_on_device",
                                    "batch_copy_to_device", "compute", "gemm", "hash",
                                    "wait", "nop"};
static_assert(std::variant_size_v<Op> == std::size(kOpNames));

const char* op_name(const Op& op) { return kOpNames[op.index()]; }

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

// Durations are rounded up so that any real work takes at least 1 ns, and capped
// so that absurd figures cannot overflow the clock.
std::uint64_t to_ns(double ns) {
  if (!(ns > 0)) return 0;
  if (ns >= 1e18) return 1'000'000'000'000'000'000ull;
  return static_cast<std::uint64_t>(std::ceil(ns));
}

// A profile figure of 0 (or nonsense) models that resource as instantaneous.
double transfer_ns(std::uint64_t bytes, double bytes_per_s) {
  return bytes_per_s > 0 ? static_cast<double>(bytes) / bytes_per_s * 1e9 : 0;
}

std::string point_text(StreamPoint p) {
  return "stream " + std::to_string(p.stream) + " ticket " + std::to_string(p.ticket);
}

std::string range_text(std::uint64_t addr, std::uint64_t bytes) {
  return "[" + hex(addr) + ", +" + std::to_string(bytes) + ")";
}

bool device_range_ok(std::uint64_t addr, std::uint64_t bytes) {
  return bytes == 0 || (addr != 0 && addr <= UINT64_MAX - bytes);
}

bool ranges_overlap(const DeviceRange& x, const DeviceRange& y) {
  return x.bytes > 0 && y.bytes > 0 && x.addr < y.addr + y.bytes && y.addr < x.addr + x.bytes;
}

bool host_range_ok(const void* ptr, std::uint64_t bytes) {
  return bytes == 0 ||
         (ptr != nullptr && reinterpret_cast<std::uintptr_t>(ptr) <= UINTPTR_MAX - bytes);
}

// Calls fn(first_byte, bytes) for each host range `op` reads or writes.
template <class Fn>
void for_each_host_range(const Op& op, Fn&& fn) {
  std::visit(Overloaded{
                 [&](const CopyToDeviceOp& c) { fn(c.src, c.dst.bytes); },
                 [&](const CopyToHostOp& c) { fn(c.dst, c.src.bytes); },
                 [&](const BatchCopyToDeviceOp& b) {
                   for (const CopyToDeviceOp& c : b.copies) fn(c.src, c.dst.bytes);
                 },
                 [&](const HashOp& h) {
                   fn(reinterpret_cast<const std::byte*>(h.result), sizeof(std::uint64_t));
                 },
                 [](const auto&) {},
             },
             op);
}

// Calls fn(addr, bytes, role) for each device range `op` reads or writes.
template <class Fn>
void for_each_device_range(const Op& op, Fn&& fn) {
  std::visit(Overloaded{
                 [&](const FillOp& f) { fn(f.dst.addr, f.dst.bytes, "dst"); },
                 [&](const CopyToDeviceOp& c) { fn(c.dst.addr, c.dst.bytes, "dst"); },
                 [&](const CopyToHostOp& c) { fn(c.src.addr, c.src.bytes, "src"); },
                 [&](const CopyOnDeviceOp& c) {
                   fn(c.src_addr, c.dst.bytes, "src");
                   fn(c.dst.addr, c.dst.bytes, "dst");
                 },
                 [&](const BatchCopyToDeviceOp& b) {
                   for (const CopyToDeviceOp& c : b.copies) fn(c.dst.addr, c.dst.bytes, "dst");
                 },
                 [&](const ComputeOp& c) {
                   for (const DeviceRange& in : c.inputs) fn(in.addr, in.bytes, "input");
                   fn(c.output.addr, c.output.bytes, "output");
                 },
                 [&](const GemmOp& g) {
                   fn(g.a.addr, g.a.bytes, "a");
                   fn(g.b.addr, g.b.bytes, "b");
                   fn(g.c.addr, g.c.bytes, "c");
                 },
                 [&](const HashOp& h) { fn(h.src.addr, h.src.bytes, "src"); },
                 [](const auto&) {},
             },
             op);
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
      memory_(profile_.capacity, profile_.granularity),
      streams_(kMaxStreams),
      compute_(1),
      copy_(profile_.copy_engines),
      hasher_(std::make_unique<ContentHasher>()) {
  info_.backend = "sim";
  info_.device = profile_.name;
  info_.capacity = profile_.capacity;
  info_.granularity = profile_.granularity;
  info_.virtual_memory = true;
  info_.batched_copy = !options.faults.batch_missing;
  info_.host_register = true;
  info_.h2d_bytes_per_s = profile_.h2d_bytes_per_s;
  info_.mem_bytes_per_s = profile_.mem_bytes_per_s;
  info_.flops_per_s = profile_.flops_per_s;
}

// --- Device address space ---------------------------------------------------

Result<std::uint64_t> SimGpu::reserve_address(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  return memory_.reserve(bytes);
}

Result<void> SimGpu::release_address(std::uint64_t base, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  return memory_.release(base, bytes);
}

Result<void> SimGpu::map(std::uint64_t addr, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  ++map_calls_;
  if (faults_.fails_map_call(map_calls_)) {
    return make_error(ErrorCode::out_of_memory,
                      "map(" + hex(addr) + ", " + bytes_text(bytes) + "): injected failure of map "
                          "call " + std::to_string(map_calls_) + " (SimFaults::fail_map_call)");
  }
  Result<void> r = memory_.map(addr, bytes);
  heavy_check();
  return r;
}

Result<void> SimGpu::unmap(std::uint64_t addr, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  Result<void> r = memory_.unmap(addr, bytes);
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

Result<void> SimGpu::check_op(StreamId stream, const Op& op) const {
  // Built only on failure: enqueue is on every hot path.
  const auto where = [&] {
    return std::string("enqueue(") + op_name(op) + ") on stream " + std::to_string(stream) + ": ";
  };
  const auto bad = [&](std::string why) {
    return Result<void>(make_error(ErrorCode::invalid_argument, where() + std::move(why)));
  };
  const auto device = [&](std::uint64_t addr, std::uint64_t bytes, const char* role) {
    return device_range_ok(addr, bytes)
               ? Result<void>()
               : bad(std::string(role) + " " + range_text(addr, bytes) +
                     " starts at address 0 or wraps around");
  };
  const auto host = [&](const void* ptr, std::uint64_t bytes, const char* role) {
    return host_range_ok(ptr, bytes)
               ? Result<void>()
               : bad(std::string("host ") + role + " " + hex(ptr) + " of " +
                     std::to_string(bytes) + " bytes is null or wraps around");
  };
  const auto copy_to_device = [&](const CopyToDeviceOp& c) -> Result<void> {
    FERRY_TRY(device(c.dst.addr, c.dst.bytes, "dst"));
    return host(c.src, c.dst.bytes, "src");
  };
  const auto pattern = [&](Pattern p) {
    return p == Pattern::bytes || p == Pattern::small_bf16
               ? Result<void>()
               : bad("unknown pattern " + std::to_string(static_cast<int>(p)));
  };
  return std::visit(
      Overloaded{
          [&](const FillOp& f) -> Result<void> {
            FERRY_TRY(pattern(f.pattern));
            return device(f.dst.addr, f.dst.bytes, "dst");
          },
          copy_to_device,
          [&](const CopyToHostOp& c) -> Result<void> {
            FERRY_TRY(device(c.src.addr, c.src.bytes, "src"));
            return host(c.dst, c.src.bytes, "dst");
          },
          [&](const CopyOnDeviceOp& c) -> Result<void> {
            FERRY_TRY(device(c.src_addr, c.dst.bytes, "src"));
            return device(c.dst.addr, c.dst.bytes, "dst");
          },
          [&](const BatchCopyToDeviceOp& b) -> Result<void> {
            if (faults_.faults().batch_missing) {
              return make_error(ErrorCode::unsupported,
                                where() + "this device has no batched copy "
                                        "(DeviceInfo::batched_copy is false)");
            }
            for (const CopyToDeviceOp& c : b.copies) FERRY_TRY(copy_to_device(c));
            return {};
          },
          [&](const ComputeOp& c) -> Result<void> {
            FERRY_TRY(pattern(c.pattern));
            for (const DeviceRange& in : c.inputs) FERRY_TRY(device(in.addr, in.bytes, "input"));
            FERRY_TRY(device(c.output.addr, c.output.bytes, "output"));
            if (!std::isfinite(c.flops) || c.flops < 0) {
              return bad("flops must be finite and >= 0");
            }
            return {};
          },
          [&](const GemmOp& g) -> Result<void> {
            FERRY_TRY(device(g.a.addr, g.a.bytes, "a"));
            FERRY_TRY(device(g.b.addr, g.b.bytes, "b"));
            FERRY_TRY(device(g.c.addr, g.c.bytes, "c"));
            if (Result<void> r = check_gemm(g.shape, g.a.bytes, g.b.bytes, g.c.bytes); !r.ok()) {
              return bad(std::move(r).error().message);
            }
            // As on cuda, where a bf16 load at an odd address is a device fault.
            if ((g.a.addr | g.b.addr | g.c.addr) % 2 != 0) return bad("a, b and c must be 2-byte aligned");
            // The product reads a and b while it writes c (on a real device, in
            // tiles), so an overlap would make the result depend on the order.
            for (const auto& [in, name] : {std::pair{&g.a, "a"}, std::pair{&g.b, "b"}}) {
              if (ranges_overlap(g.c, *in)) {
                return bad("c " + range_text(g.c.addr, g.c.bytes) + " overlaps " + name + " " +
                           range_text(in->addr, in->bytes) + "; the output must not overlap an input");
              }
            }
            if (!std::isfinite(g.flops) || g.flops < 0) return bad("flops must be finite and >= 0");
            return {};
          },
          [&](const HashOp& h) -> Result<void> {
            FERRY_TRY(device(h.src.addr, h.src.bytes, "src"));
            if (h.result == nullptr) return bad("result pointer is null");
            return {};
          },
          [&](const WaitOp& w) -> Result<void> {
            if (w.point.stream >= kMaxStreams) {
              return bad("waits for stream " + std::to_string(w.point.stream) +
                         ", out of range (streams are 0.." + std::to_string(kMaxStreams - 1) + ")");
            }
            // Only enqueued work can be waited for, which also rules out cycles.
            const Ticket last = streams_[w.point.stream].submitted;
            if (w.point.ticket > last) {
              return bad("waits for " + point_text(w.point) + ", but that stream has only " +
                         std::to_string(last) + " tickets");
            }
            return {};
          },
          [](const NopOp&) { return Result<void>(); },
      },
      op);
}

Result<Ticket> SimGpu::enqueue(StreamId stream, Op op) {
  std::lock_guard lock(mutex_);
  if (stream >= kMaxStreams) {
    return make_error(ErrorCode::invalid_argument,
                      "enqueue on stream " + std::to_string(stream) + ": out of range (streams are 0.." +
                          std::to_string(kMaxStreams - 1) + ")");
  }
  FERRY_TRY(check_healthy());
  FERRY_TRY(check_op(stream, op));

  StreamState& st = streams_[stream];
  PendingOp pending;
  pending.ticket = ++st.submitted;
  const auto runs_on = [&](EngineKind engine, LinkDir link = LinkDir::h2d) {
    pending.engine = engine;
    pending.link = link;
  };
  std::visit(Overloaded{
                 [&](const FillOp&) { runs_on(EngineKind::compute); },
                 [&](const CopyToDeviceOp&) { runs_on(EngineKind::copy, LinkDir::h2d); },
                 [&](const CopyToHostOp&) { runs_on(EngineKind::copy, LinkDir::d2h); },
                 [&](const CopyOnDeviceOp&) { runs_on(EngineKind::compute); },
                 [&](const BatchCopyToDeviceOp&) { runs_on(EngineKind::copy, LinkDir::h2d); },
                 [&](const ComputeOp&) { runs_on(EngineKind::compute); },
                 [&](const GemmOp&) { runs_on(EngineKind::compute); },
                 [&](const HashOp&) { runs_on(EngineKind::compute); },
                 [&](const WaitOp&) { runs_on(EngineKind::none); },
                 [&](const NopOp&) { runs_on(EngineKind::none); },
             },
             op);
  pending.op = std::move(op);
  st.ops.push_back(std::move(pending));
  active_ |= std::uint64_t{1} << stream;
  if (!st.held) {
    dispatch_through(stream, st.submitted);
    start_ready_ops();
  }
  return st.submitted;
}

Ticket SimGpu::submitted(StreamId stream) const {
  std::lock_guard lock(mutex_);
  return stream < kMaxStreams ? streams_[stream].submitted : 0;
}

Ticket SimGpu::completed(StreamId stream) {
  std::lock_guard lock(mutex_);
  // A pure read: polling must not change the schedule it observes.
  return stream < kMaxStreams ? streams_[stream].completed : 0;
}

void SimGpu::set_hold(StreamId stream, bool hold) {
  std::lock_guard lock(mutex_);
  if (stream >= kMaxStreams) return;
  if (!hold) {
    dispatch_through(stream, streams_[stream].submitted);
    start_ready_ops();
  }
  streams_[stream].held = hold;
}

bool SimGpu::held(StreamId stream) const {
  std::lock_guard lock(mutex_);
  return stream < kMaxStreams && streams_[stream].held;
}

Result<void> SimGpu::flush(StreamId stream) {
  std::lock_guard lock(mutex_);
  if (stream >= kMaxStreams) {
    return make_error(ErrorCode::invalid_argument,
                      "flush of stream " + std::to_string(stream) + ": out of range");
  }
  dispatch_through(stream, streams_[stream].submitted);
  start_ready_ops();
  return {};
}

Result<void> SimGpu::flush_all() {
  std::lock_guard lock(mutex_);
  for (StreamId s = 0; s < kMaxStreams; ++s) dispatch_through(s, streams_[s].submitted);
  start_ready_ops();
  return {};
}

void SimGpu::dispatch_through(StreamId stream, Ticket ticket) {
  StreamState& st = streams_[stream];
  const Ticket last = std::min(ticket, st.submitted);
  for (Ticket t = std::max(st.dispatched, st.completed) + 1; t <= last; ++t) {
    PendingOp& op = st.ops[t - st.completed - 1];
    op.dispatched = true;
    op.dispatched_ns = now_;
  }
  st.dispatched = std::max(st.dispatched, last);
}

bool SimGpu::point_complete(StreamPoint point) const {
  return streams_[point.stream].completed >= point.ticket;
}

Result<void> SimGpu::wait(StreamPoint point, std::chrono::nanoseconds timeout) {
  std::lock_guard lock(mutex_);
  if (point.stream >= kMaxStreams) {
    return make_error(ErrorCode::invalid_argument,
                      "wait for " + point_text(point) + ": stream out of range");
  }
  const Ticket last = streams_[point.stream].submitted;
  if (point.ticket > last) {
    return make_error(ErrorCode::invalid_argument,
                      "wait for " + point_text(point) + ": that stream has only " +
                          std::to_string(last) + " tickets");
  }
  FERRY_TRY(check_healthy());
  dispatch_through(point.stream, point.ticket);
  const auto budget = static_cast<std::uint64_t>(std::max<std::int64_t>(timeout.count(), 0));
  const std::uint64_t deadline = saturating_add(now_, budget);
  const RunEnd end = run_until(deadline, [&] { return point_complete(point); });
  FERRY_TRY(check_healthy());
  switch (end) {
    case RunEnd::done:
      return {};
    case RunEnd::reached:
      return make_error(ErrorCode::timeout,
                        "wait for " + point_text(point) + ": not complete after " +
                            std::to_string(budget) + " ns of virtual time (completed through ticket " +
                            std::to_string(streams_[point.stream].completed) + ")");
    case RunEnd::stuck:
      break;
  }
  return make_error(ErrorCode::timeout, "wait for " + point_text(point) +
                                            " can never complete: " + describe_blockage(point));
}

Result<void> SimGpu::synchronize() {
  std::lock_guard lock(mutex_);
  for (StreamId s = 0; s < kMaxStreams; ++s) dispatch_through(s, streams_[s].submitted);
  const RunEnd end = run_until(UINT64_MAX, [&] { return active_ == 0; });
  FERRY_TRY(check_healthy());
  if (end != RunEnd::done) {
    const auto s = static_cast<StreamId>(std::countr_zero(active_));
    const StreamPoint front{s, streams_[s].completed + 1};
    return make_error(ErrorCode::timeout,
                      "synchronize can never finish: " + describe_blockage(front));
  }
  return {};
}

std::string SimGpu::describe_blockage(StreamPoint point) const {
  std::string why;
  StreamPoint p = point;
  // Each hop follows a wait to a point enqueued earlier, so the chain is short
  // and acyclic; the bound only guards against a bug.
  for (std::size_t hop = 0; hop <= kMaxStreams; ++hop) {
    const StreamState& st = streams_[p.stream];
    if (st.completed >= p.ticket || st.ops.empty()) break;
    const PendingOp& front = st.ops.front();
    if (!front.dispatched) {
      return why + point_text({p.stream, front.ticket}) +
             " is held in the stream's host-side queue (flush the stream or release its hold)";
    }
    const auto* w = std::get_if<WaitOp>(&front.op);
    if (w == nullptr || point_complete(w->point)) break;
    why += "stream " + std::to_string(p.stream) + " is blocked at ticket " +
           std::to_string(front.ticket) + ", a wait for " + point_text(w->point) + "; ";
    p = w->point;
  }
  return why + "no operation can make progress";
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
    if (!op.dispatched || op.started) return;
    if (const auto* w = std::get_if<WaitOp>(&op.op); w != nullptr && !point_complete(w->point)) {
      return;
    }
    candidates[count++] = {std::max(op.dispatched_ns, st.last_completion_ns), s};
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
    if (op.engine != EngineKind::none) {
      auto& units = op.engine == EngineKind::compute ? compute_ : copy_;
      const auto free_unit = std::find(units.begin(), units.end(), std::nullopt);
      if (free_unit == units.end()) continue;
      // One copy per direction of the host link at a time (see the header).
      if (op.engine == EngineKind::copy) {
        std::optional<StreamId>& link = link_[static_cast<std::size_t>(op.link)];
        if (link.has_value()) continue;
        link = s;
      }
      *free_unit = s;
      op.unit = static_cast<std::uint32_t>(free_unit - units.begin());
    }
    op.started = true;
    op.finish_ns = saturating_add(saturating_add(now_, duration_ns(op.op)),
                                  faults_.completion_delay(s, op.ticket));
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
    if (op.engine == EngineKind::compute) compute_[op.unit].reset();
    if (op.engine == EngineKind::copy) {
      copy_[op.unit].reset();
      link_[static_cast<std::size_t>(op.link)].reset();
    }
    st.ops.pop_front();
    st.completed += 1;
    st.last_completion_ns = t;
    if (st.ops.empty()) active_ &= ~(std::uint64_t{1} << s);
  });
}

double SimGpu::host_link_ns(const std::byte* ptr, std::uint64_t bytes) const {
  const bool pinned = bytes > 0 && host_.find(ptr, bytes) != nullptr;
  return transfer_ns(bytes, pinned ? profile_.h2d_bytes_per_s : profile_.pageable_bytes_per_s);
}

std::uint64_t SimGpu::duration_ns(const Op& op) const {
  const double link = profile_.link_latency_ns;
  const double kernel = profile_.kernel_latency_ns;
  const double mem = profile_.mem_bytes_per_s;
  const auto math_ns = [&](double flops) {
    return profile_.flops_per_s > 0 ? flops / profile_.flops_per_s * 1e9 : 0;
  };
  return to_ns(std::visit(
      Overloaded{
          [&](const FillOp& f) { return kernel + transfer_ns(f.dst.bytes, mem); },
          [&](const CopyToDeviceOp& c) { return link + host_link_ns(c.src, c.dst.bytes); },
          [&](const CopyToHostOp& c) { return link + host_link_ns(c.dst, c.src.bytes); },
          [&](const CopyOnDeviceOp& c) {  // reads and writes every byte
            return kernel + 2 * transfer_ns(c.dst.bytes, mem);
          },
          [&](const BatchCopyToDeviceOp& b) {  // one submission: one latency
            double ns = link;
            for (const CopyToDeviceOp& c : b.copies) ns += host_link_ns(c.src, c.dst.bytes);
            return ns;
          },
          [&](const ComputeOp& c) {
            if (c.flops == 0 && c.mem_bytes == 0) {
              std::uint64_t touched = c.output.bytes;
              for (const DeviceRange& in : c.inputs) touched = saturating_add(touched, in.bytes);
              return kernel + transfer_ns(touched, mem);
            }
            return kernel + std::max(math_ns(c.flops), transfer_ns(c.mem_bytes, mem));
          },
          [&](const GemmOp& g) {  // 0 stands for the shape's own figure
            const double flops = g.flops > 0 ? g.flops : g.shape.flops();
            const std::uint64_t bytes =
                g.mem_bytes > 0 ? g.mem_bytes : saturating_add(saturating_add(g.a.bytes, g.b.bytes), g.c.bytes);
            return kernel + std::max(math_ns(flops), transfer_ns(bytes, mem));
          },
          [&](const HashOp& h) { return kernel + transfer_ns(h.src.bytes, mem); },
          [](const WaitOp&) { return 0.0; },
          [](const NopOp&) { return 0.0; },
      },
      op));
}

// --- Effects at completion --------------------------------------------------

std::optional<std::string> SimGpu::find_unmapped(const Op& op) const {
  std::optional<std::string> found;
  for_each_device_range(op, [&](std::uint64_t addr, std::uint64_t bytes, const char* role) {
    if (found) return;
    if (const auto hole = memory_.first_unmapped(addr, bytes)) {
      found = std::string(role) + " " + range_text(addr, bytes) +
              " touched unmapped device memory at " + hex(*hole);
    }
  });
  return found;
}

bool SimGpu::swallowed(const CopyToDeviceOp& copy) const {
  if (copy.dst.bytes == 0) return false;
  const PinnedRange* range = host_.find(copy.src, copy.dst.bytes);
  return range != nullptr && range->stale_at_ns <= now_;
}

void SimGpu::apply(StreamId stream, const PendingOp& pending) {
  if (const std::optional<std::string> bad = find_unmapped(pending.op)) {
    ++illegal_accesses_;
    if (first_fault_.empty()) {
      first_fault_ = point_text({stream, pending.ticket}) + " (" + op_name(pending.op) + ") " +
                     *bad + " at virtual time " + std::to_string(now_) + " ns";
    }
    return;
  }
  const auto copy_to_device = [&](const CopyToDeviceOp& c) {
    if (swallowed(c)) {
      ++swallowed_copies_;  // report 000: success, destination unchanged
      return;
    }
    memory_.write(c.dst.addr, std::span<const std::byte>(c.src, c.dst.bytes));
  };
  const auto hash = [&](const DeviceRange& r) {
    memory_.hash(r.addr, r.bytes, *hasher_);
    return hasher_->finish();
  };
  std::visit(Overloaded{
                 [&](const FillOp& f) { memory_.fill(f.dst.addr, f.dst.bytes, f.seed, f.pattern); },
                 copy_to_device,
                 [&](const CopyToHostOp& c) {
                   memory_.read(c.src.addr, std::span<std::byte>(c.dst, c.src.bytes));
                 },
                 [&](const CopyOnDeviceOp& c) { memory_.copy(c.dst.addr, c.src_addr, c.dst.bytes); },
                 [&](const BatchCopyToDeviceOp& b) {
                   for (std::size_t i = 0; i < b.copies.size(); ++i) {
                     if (i > 0 && faults_.faults().batch_broken) break;
                     copy_to_device(b.copies[i]);
                   }
                 },
                 [&](const ComputeOp& c) {
                   // All inputs are hashed before the output is written, so an
                   // output overlapping an input still sees the old input bytes.
                   std::uint64_t mix = kMixStart;
                   for (std::size_t k = 0; k < c.inputs.size(); ++k) {
                     mix = mix_step(mix, k, hash(c.inputs[k]));
                   }
                   memory_.fill(c.output.addr, c.output.bytes, mix, c.pattern);
                 },
                 [&](const GemmOp& g) {
                   std::vector<std::byte> a, b, c;
                   Result<void> done;
                   try {
                     a.resize(g.a.bytes);
                     b.resize(g.b.bytes);
                     c.resize(g.c.bytes);
                   } catch (const std::bad_alloc&) {
                     done = make_error(ErrorCode::out_of_memory, "no host memory for the operands");
                   }
                   if (done.ok()) {
                     memory_.read(g.a.addr, a);
                     memory_.read(g.b.addr, b);
                     // check_op ran check_gemm on these sizes at enqueue: only memory can fail.
                     done = gemm_bf16(g.shape, a, b, c);
                   }
                   if (done.ok()) {
                     memory_.write(g.c.addr, c);
                   } else if (first_fault_.empty()) {  // the simulated device fails, as a real one would
                     first_fault_ = point_text({stream, pending.ticket}) + " (gemm " + g.shape.text() +
                                    ") could not run: " + done.error().message;
                   }
                 },
                 [&](const HashOp& h) { *h.result = hash(h.src); },
                 [](const WaitOp&) {},
                 [](const NopOp&) {},
             },
             pending.op);
}

// --- Host memory ------------------------------------------------------------

std::optional<StreamPoint> SimGpu::host_pointer_user(const std::byte* begin,
                                                     std::uint64_t bytes) const {
  const auto lo = reinterpret_cast<std::uintptr_t>(begin);
  std::optional<StreamPoint> user;
  for_each_stream(active_, [&](StreamId s) {
    for (const PendingOp& op : streams_[s].ops) {
      if (user) return;
      for_each_host_range(op.op, [&](const std::byte* p, std::uint64_t n) {
        const auto a = reinterpret_cast<std::uintptr_t>(p);
        if (!user && n > 0 && a < lo + bytes && lo < a + n) user = StreamPoint{s, op.ticket};
      });
    }
  });
  return user;
}

Result<std::byte*> SimGpu::allocate_pinned(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  return host_.allocate(bytes, faults_.pinned_stale_at(now_, host_.churn(), host_.pins()));
}

Result<void> SimGpu::free_pinned(std::byte* ptr) {
  std::lock_guard lock(mutex_);
  // Freeing under queued work would leave the device reading freed memory; the
  // caller must wait first (the arena's leases do).
  if (const PinnedRange* range = host_.allocation_at(ptr)) {
    if (const auto user = host_pointer_user(ptr, range->bytes)) {
      return make_error(ErrorCode::invalid_argument,
                        "free_pinned(" + hex(ptr) + "): " + point_text(*user) +
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

std::uint64_t SimGpu::illegal_accesses() const {
  std::lock_guard lock(mutex_);
  return illegal_accesses_;
}

std::uint64_t SimGpu::swallowed_copies() const {
  std::lock_guard lock(mutex_);
  return swallowed_copies_;
}

Result<void> SimGpu::peek(std::uint64_t addr, std::span<std::byte> out) const {
  std::lock_guard lock(mutex_);
  if (out.empty()) return {};
  if (!device_range_ok(addr, out.size())) {
    return make_error(ErrorCode::invalid_argument,
                      "peek " + range_text(addr, out.size()) + ": starts at 0 or wraps around");
  }
  if (const auto hole = memory_.first_unmapped(addr, out.size())) {
    return make_error(ErrorCode::invalid_argument,
                      "peek " + range_text(addr, out.size()) + ": " + hex(*hole) + " is not mapped");
  }
  memory_.read(addr, out);
  return {};
}

bool SimGpu::validate(std::string* why) const {
  std::lock_guard lock(mutex_);
  return validate_locked(why);
}

void SimGpu::heavy_check() const {
#if FERRY_HEAVY_VALIDATE
  std::string why;
  if (!validate_locked(&why)) {
    std::fprintf(stderr, "ferry: sim backend invariant broken: %s\n", why.c_str());
    std::abort();
  }
#endif
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
    const std::string name = "stream " + std::to_string(s) + ": ";
    if (!(st.completed <= st.dispatched && st.dispatched <= st.submitted)) {
      return fail(name + "expected completed <= dispatched <= submitted");
    }
    if (st.ops.size() != st.submitted - st.completed) return fail(name + "op count mismatch");
    if (((active_ >> s) & 1) != (st.ops.empty() ? 0u : 1u)) return fail(name + "active mask wrong");
    if (!st.held && st.dispatched != st.submitted) return fail(name + "not held but ops undispatched");
    for (std::size_t i = 0; i < st.ops.size(); ++i) {
      const PendingOp& op = st.ops[i];
      if (op.ticket != st.completed + 1 + i) return fail(name + "tickets out of order");
      if (op.dispatched != (op.ticket <= st.dispatched)) return fail(name + "dispatch flag wrong");
      if (op.started && (i > 0 || !op.dispatched || op.finish_ns < now_)) {
        return fail(name + "only a dispatched front op may run, and not in the past");
      }
      if (op.started && op.engine != EngineKind::none) {
        const auto& units = op.engine == EngineKind::compute ? compute_ : copy_;
        if (op.unit >= units.size() || units[op.unit] != s) return fail(name + "engine not owned");
      }
    }
  }
  for (std::size_t d = 0; d < link_.size(); ++d) {
    const std::optional<StreamId> owner = link_[d];
    if (!owner) continue;
    const StreamState& st = streams_[*owner];
    if (st.ops.empty() || !st.ops.front().started || st.ops.front().engine != EngineKind::copy ||
        static_cast<std::size_t>(st.ops.front().link) != d) {
      return fail("a host link direction is owned by a stream that runs no copy on it");
    }
  }
  for (StreamId s = 0; s < kMaxStreams; ++s) {
    const StreamState& st = streams_[s];
    if (st.ops.empty()) continue;
    const PendingOp& front = st.ops.front();
    if (!front.started || front.engine != EngineKind::copy) continue;
    if (link_[static_cast<std::size_t>(front.link)] != s) {
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
