// Runs a validated trace against a backend, a StreamOrder, a DevicePool, a
// HostArena and a TransferEngine, keeping the host reference model beside it
// (replay.hpp states the semantics).
#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <new>
#include <iterator>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "core/input_file.hpp"
#include "core/testing_hooks.hpp"
#include "core/text.hpp"
#include "ferry/content.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/replay.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"
#include "ferry/user_op.hpp"
#include "replay/reference.hpp"
#include "replay/trace.hpp"

namespace ferry {
namespace {

using replay::ExpectedBytes;
using replay::IdIndex;
using replay::OpKind;
using replay::Trace;
using replay::TraceOp;

// A check copies a buffer back in pieces of at most this many bytes.
constexpr std::uint64_t kCheckPiece = std::uint64_t{64} << 20;

// What the replay knows about one id.
struct Buffer {
  DeviceHandle handle;         // kept after free, so later uses meet stale_handle
  bool allocated = false;      // the latest alloc succeeded
  bool failed = false;         // the latest alloc failed: later ops are skipped
  ExpectedBytes expected = ExpectedBytes::unknown(0);
  // Hazard tracking across streams: the op that last wrote the bytes, and the
  // ops that read them since.
  std::optional<StreamPoint> last_write;
  UseSet reads;
};

class Replayer {
  struct WorkRun {
    Ticket first;        // the first ticket of the run
    const TraceOp* op;   // the trace op that enqueued it
  };

 public:
  Replayer(const Trace& trace, Backend& backend, ReplayReport& report, bool strict)
      : trace_(trace), backend_(backend), order_(backend), report_(report), strict_(strict),
        buffers_(trace.ids.size()), racing_(backend.race_log() != nullptr) {}

  Result<void> setup(std::uint64_t capacity, IntegrityPolicy policy) {
    PoolOptions po;
    po.capacity = capacity;
    pool_ = std::make_unique<DevicePool>(order_, po);
    if (!pool_->status().ok()) {
      Error e = pool_->status().error();
      e.message = "the device pool could not be set up: " + e.message;
      return e;
    }
    arena_ = std::make_unique<HostArena>(order_);
    EngineOptions eo;
    eo.policy = policy;
    // Runs the batched-copy start-up probe (a capability check, every policy).
    engine_ = std::make_unique<TransferEngine>(*pool_, *arena_, eo);
    if (!engine_->status().ok()) {
      Error e = engine_->status().error();
      e.message = "the transfer engine could not be set up: " + e.message;
      return e;
    }
    pool_->reset_peak_stats();  // the engine's start-up probe is not the trace's
    return {};
  }

  void run(const std::function<void(const ReplayStep&)>& on_step) {
    const std::uint64_t start_ns = backend_.now_ns();
    ReplayStep step;
    step.total = trace_.ops.size();
    step.pool = pool_.get();
    if (on_step) {
      step.live_ids = [this] { return live_ids(); };
      step.owner_at = [this](std::uint64_t addr) -> std::string_view {
        auto it = owners_.upper_bound(addr);
        if (it == owners_.begin() || (--it)->second.first <= addr) return {};
        return trace_.ids[it->second.second];
      };
      naming_owners_ = true;
    }
    bool observing = static_cast<bool>(on_step);
    auto observe = [&](std::size_t line, std::string_view name) {
      if (!observing) return;
      step.line = line;
      step.op = name;
      step.now_ns = backend_.now_ns();
      try {
        on_step(step);
      } catch (const std::exception& e) {
        // The replay itself goes on (and still cleans up); the observer stops.
        observing = false;
        ++report_.errors[std::string(to_string(ErrorCode::backend_error))];
        ++report_.unexpected_errors;
        add_problem(line, std::string(name), "backend_error",
                    std::string("the replay's observer failed: ") + e.what());
      }
      ++step.index;
    };
    observe(0, "start");
    for (const TraceOp& op : trace_.ops) {
      ++report_.ops;
      const std::array<Ticket, kMaxStreams> before = submitted();
      try {
        execute(op);
      } catch (const std::bad_alloc&) {
        record(op, make_error(ErrorCode::out_of_memory, "the host's memory is exhausted: this op's host "
                                                        "buffers could not be allocated"));
      } catch (const std::exception& e) {
        record(op, make_error(ErrorCode::backend_error, std::string("internal error: ") + e.what()));
      }
      note_work(before, op);
      observe(op.line, replay::to_string(op.kind));
    }
    finish();
    fill_races();
    observe(0, "end");
    report_.device_time_ns = backend_.now_ns() - start_ns;
    const PoolStats st = pool_->stats();
    report_.capacity = pool_->capacity();
    report_.peak_live_bytes = st.peak_requested_bytes;
    report_.peak_allocated_bytes = st.peak_allocated_bytes;
    report_.peak_reserved_bytes = st.peak_reserved_bytes;
    report_.ooms = st.ooms;
    report_.reclaims = st.reclaims;
    report_.ooms_survived = st.ooms_survived;
    fill_integrity();
    report_.illegal_accesses = backend_.fault_counters().illegal_accesses;
    if (report_.illegal_accesses > 0) {
      add_problem(0, "end", "illegal_access",
                  std::to_string(report_.illegal_accesses) +
                      " device operations touched unmapped memory");
    }
  }

  // The engine goes before the arena and the pool it uses; all of them before the
  // StreamOrder and the backend.
  ~Replayer() {
    engine_.reset();
    arena_.reset();
    pool_.reset();
  }

 private:
  void execute(const TraceOp& op) {
    switch (op.kind) {
      case OpKind::alloc: return alloc(op);
      case OpKind::free: return free(op);
      case OpKind::fill: return fill(op);
      case OpKind::upload: return upload(op);
      case OpKind::compute: return compute(op);
      case OpKind::user: return user(op);
      case OpKind::hold:
        backend_.set_hold(op.stream, true);
        return expect_success(op);
      case OpKind::release:
        backend_.set_hold(op.stream, false);
        if (!outcome(op, backend_.flush(op.stream))) return;
        return expect_success(op);
      case OpKind::sync: return sync(op);
      case OpKind::trim:
        if (!outcome(op, pool_->trim())) return;
        return expect_success(op);
      case OpKind::check: return check(op);
      case OpKind::wait: {
        // An event recorded on `for` now, waited on by `stream`.
        const StreamPoint point{op.waits_for, backend_.submitted(op.waits_for)};
        if (!outcome(op, order_.order_after(op.stream, point))) return;
        return expect_success(op);
      }
      case OpKind::meta: return;  // never among ops: parse_trace keeps it in Trace
    }
  }

  // --- which trace line each device op came from (for race reports) -----------

  std::array<Ticket, kMaxStreams> submitted() const {
    std::array<Ticket, kMaxStreams> out{};
    if (!racing_) return out;
    for (StreamId s = 0; s < kMaxStreams; ++s) out[s] = backend_.submitted(s);
    return out;
  }

  void note_work(const std::array<Ticket, kMaxStreams>& before, const TraceOp& op) {
    if (!racing_) return;
    const std::array<Ticket, kMaxStreams> after = submitted();
    for (StreamId s = 0; s < kMaxStreams; ++s) {
      if (after[s] > before[s]) work_[s].push_back({before[s] + 1, &op});
    }
  }

  const TraceOp* op_of(StreamPoint p) const {
    const auto& runs = work_[p.stream];
    auto it = std::upper_bound(runs.begin(), runs.end(), p.ticket,
                               [](Ticket t, const WorkRun& r) { return t < r.first; });
    if (it == runs.begin()) return nullptr;
    return std::prev(it)->op;
  }

  void fill_races() {
    const std::shared_ptr<const RaceLog> log = backend_.race_log();
    if (!log) return;
    report_.race_checked = true;
    report_.races = log->count;
    for (const Race& r : log->kept) {
      ReplayRace rr;
      rr.addr = r.addr;
      rr.bytes = r.bytes;
      rr.reuse = r.reuse;
      for (auto [side, out] : {std::pair{&r.earlier, &rr.earlier}, std::pair{&r.later, &rr.later}}) {
        const TraceOp* op = op_of(side->op);
        out->line = op != nullptr ? op->line : 0;
        out->op = op != nullptr ? std::string(replay::to_string(op->kind)) : "end";
        out->kind = std::string(side->kind);
        out->access = std::string(to_string(side->access));
        out->point = side->op;
        out->id = side->block.tag;  // the trace's id (alloc() tags each block with it)
      }
      report_.race_list.push_back(std::move(rr));
    }
    if (report_.races > 0) {
      const ReplayRace& first = report_.race_list.front();
      add_problem(first.later.line, first.later.op, "race",
                  text::count(report_.races, "unordered conflicting access", "unordered conflicting accesses") +
                      "; the first: line " +
                      std::to_string(first.earlier.line) + " and line " + std::to_string(first.later.line));
    }
  }

  void alloc(const TraceOp& op) {
    Buffer& b = buffers_[op.id];
    // Only an alloc that carried `expect` and succeeded anyway leaves a live
    // handle behind under the same id (the validator rejects the rest).
    if (b.allocated) (void)pool_->free(b.handle);
    b = Buffer{};
    Result<DeviceHandle> h = pool_->allocate(op.bytes, op.stream);
    if (!h.ok()) {
      b.failed = true;
      record(op, std::move(h).error());
      return;
    }
    b.handle = *h;
    b.allocated = true;
    b.expected = ExpectedBytes::unknown(op.bytes);
    if (racing_) (void)pool_->set_tag(*h, trace_.ids[op.id]);  // the handle is live: cannot fail
    if (naming_owners_) {
      const DeviceSpan span = *pool_->resolve(*h);
      name_owner(span.addr, span.addr + (span.bytes + 255) / 256 * 256, op.id);
    }
    expect_success(op);
  }

  void free(const TraceOp& op) {
    Buffer& b = buffers_[op.id];
    if (skip(b)) return;
    b.allocated = false;
    if (!outcome(op, pool_->free(b.handle))) return;
    expect_success(op);
  }

  void fill(const TraceOp& op) {
    Buffer& b = buffers_[op.id];
    if (skip(b)) return;
    if (!outcome(op, order_after_writers_and_readers(op.stream, b))) return;
    Result<Ticket> t = enqueue_fill(*pool_, op.stream, b.handle, op.seed);
    if (!outcome(op, t)) return;
    wrote(b, {op.stream, *t}, ExpectedBytes::pattern(b.expected.size(), op.seed));
    expect_success(op);
  }

  // Host->device copy of fill_pattern(seed): out of an arena block, through the
  // transfer engine and its integrity policy (I5, I6). The one place uploads
  // are routed.
  void upload(const TraceOp& op) {
    Buffer& b = buffers_[op.id];
    if (skip(b)) return;
    if (!outcome(op, order_after_writers_and_readers(op.stream, b))) return;
    const std::uint64_t size = b.expected.size();
    TransferPlan plan;
    Result<HostBlock> block = arena_->allocate(size);
    std::vector<std::byte> unpinned;
    if (block.ok()) {
      fill_pattern(op.seed, 0, block->span());
      plan.add(*block, b.handle);
    } else if (block.error().code == ErrorCode::out_of_memory) {
      // Larger than the arena's pinned budget: plain host memory, which the
      // engine copies before upload() returns (pageable, still verified).
      unpinned.resize(static_cast<std::size_t>(size));
      fill_pattern(op.seed, 0, unpinned);
      plan.add(std::span<const std::byte>(unpinned), b.handle);
    } else {
      record(op, std::move(block).error());
      return;
    }
    Result<TransferReceipt> receipt = engine_->upload(op.stream, plan);
    // Legal with the copy in flight: the engine leased the block for it.
    if (block.ok()) (void)arena_->free(*block);
    if (!receipt.ok()) {
      // Whatever the engine enqueued before it gave up may still write the
      // buffer: order later users after all of it, and trust none of the bytes.
      if (receipt.error().code == ErrorCode::transfer_corrupt) {
        wrote(b, {op.stream, backend_.submitted(op.stream)}, ExpectedBytes::unknown(size));
      }
      record(op, receipt.error());
      return;
    }
    wrote(b, receipt->done, ExpectedBytes::pattern(size, op.seed));
    expect_success(op);
  }

  void compute(const TraceOp& op) {
    Buffer& out = buffers_[op.id];
    for (IdIndex in : op.inputs) {
      if (buffers_[in].failed) return skipped();
    }
    if (skip(out)) return;
    std::vector<DeviceHandle> handles;
    std::vector<ExpectedBytes*> inputs;
    std::uint64_t mem_bytes = out.expected.size();
    for (IdIndex in : op.inputs) {
      Buffer& b = buffers_[in];
      if (!outcome(op, order_after_writer(op.stream, b))) return;
      handles.push_back(b.handle);
      inputs.push_back(&b.expected);
      mem_bytes += b.expected.size();
    }
    if (!outcome(op, order_after_writers_and_readers(op.stream, out))) return;
    // The reference of the output is computed before it changes (the output may
    // also be an input).
    ExpectedBytes result = ExpectedBytes::mixed(inputs, out.expected.size());
    Result<Ticket> t = enqueue_compute(*pool_, op.stream, handles, out.handle, 0.0, mem_bytes);
    if (!outcome(op, t)) return;
    for (IdIndex in : op.inputs) buffers_[in].reads.add({op.stream, *t});
    wrote(out, {op.stream, *t}, std::move(result));
    expect_success(op);
  }

  // A program's own kernel, replayed by its operand marks: on sim the stand-in
  // kernel writes into every writable operand fill_pattern(mix of its readable
  // operands' hashes, in order), so later checks compare bytes as for compute; on
  // a real device it touches nothing, and what it writes is unknown from then on.
  void user(const TraceOp& op) {
    for (const replay::TraceOperand& o : op.operands) {
      if (buffers_[o.id].failed) return skipped();
    }
    std::vector<Operand> operands;
    std::vector<ExpectedBytes*> inputs;
    bool whole_inputs = true;
    for (const replay::TraceOperand& o : op.operands) {
      Buffer& b = buffers_[o.id];
      const bool whole = o.offset == 0 && (o.bytes == kRestOfBlock || o.bytes == b.expected.size());
      if (writes(o.access)) {
        if (!outcome(op, order_after_writers_and_readers(op.stream, b))) return;
      } else if (!outcome(op, order_after_writer(op.stream, b))) {
        return;
      }
      if (reads(o.access)) {
        inputs.push_back(&b.expected);
        whole_inputs = whole_inputs && whole;
      }
      operands.push_back({b.handle, o.access, o.offset, o.bytes});
    }
    const bool modeled = backend_.info().backend == BackendKind::sim;
    const auto stand_in = [](const KernelLaunch& launch) -> Result<void> {
      std::uint64_t acc = kMixStart, k = 0;
      for (const KernelArg& a : launch.args) {
        if (reads(a.access)) acc = mix_step(acc, k++, content_hash(a.in));
      }
      for (const KernelArg& a : launch.args) {
        if (writes(a.access)) fill_pattern(acc, 0, a.out);  // empty on a real device
      }
      return {};
    };
    // The references of the outputs are computed before they change (an operand
    // may be read and written).
    std::vector<ExpectedBytes> results;
    for (const replay::TraceOperand& o : op.operands) {
      const Buffer& b = buffers_[o.id];
      const bool whole = o.offset == 0 && (o.bytes == kRestOfBlock || o.bytes == b.expected.size());
      if (!writes(o.access)) continue;
      results.push_back(modeled && whole && whole_inputs ? ExpectedBytes::mixed(inputs, b.expected.size())
                                                         : ExpectedBytes::unknown(b.expected.size()));
    }
    Result<Ticket> t = enqueue_user(*pool_, op.stream, operands, stand_in, {}, op.tag);
    if (!outcome(op, t)) return;
    std::size_t out = 0;
    for (const replay::TraceOperand& o : op.operands) {
      Buffer& b = buffers_[o.id];
      if (writes(o.access)) {
        wrote(b, {op.stream, *t}, std::move(results[out++]));
        if (reads(o.access)) b.reads.add({op.stream, *t});
      } else {
        b.reads.add({op.stream, *t});
      }
    }
    expect_success(op);
  }

  void sync(const TraceOp& op) {
    if (op.all_streams) {
      if (!outcome(op, backend_.synchronize())) return;
    } else {
      const Ticket last = backend_.submitted(op.stream);
      if (!outcome(op, order_.wait(StreamPoint{op.stream, last}))) return;
    }
    expect_success(op);
  }

  void check(const TraceOp& op) {
    Buffer& b = buffers_[op.id];
    if (skip(b)) return;
    Result<DeviceSpan> span = pool_->resolve(b.handle);
    if (!outcome(op, span)) return;
    if (!b.expected.known()) {
      ++report_.unwritten_checks;
      return expect_success(op);
    }
    // Copy on the stream that wrote last: the FIFO orders the copy after it.
    // In pieces, so a check of gigabytes needs little host memory.
    const StreamId stream = b.last_write ? b.last_write->stream : 0;
    const std::uint64_t size = b.expected.size();
    // The copy's host buffer is a copy target of the runner's; it leaves them only
    // once its copies completed, so an error return leaves it to finish().
    std::vector<std::byte>& host = copy_targets_.emplace_back(static_cast<std::size_t>(std::min(size, kCheckPiece)));
    std::optional<std::uint64_t> at;
    for (std::uint64_t off = 0; off < size && !at; off += kCheckPiece) {
      const std::span<std::byte> piece(host.data(), static_cast<std::size_t>(std::min(kCheckPiece, size - off)));
      Result<Ticket> t = enqueue_copy_to_host(*pool_, stream, b.handle, off, piece);
      if (!outcome(op, t)) return;
      b.reads.add({stream, *t});
      if (!outcome(op, order_.wait_for_result(StreamPoint{stream, *t}))) return;
      at = b.expected.first_mismatch(piece, off);
    }
    copy_targets_.pop_back();
    ++report_.checks;
    if (at) {
      ++report_.corrupt;
      add_problem(op.line, op, "corrupt",
                  "check of " + replay::quoted_id(trace_.ids[op.id]) + ": byte " + std::to_string(*at) + " of " +
                      std::to_string(size) + " differs from the reference");
      return;
    }
    expect_success(op);
  }

  std::vector<ReplayLiveId> live_ids() const {
    std::vector<ReplayLiveId> out;
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      if (buffers_[i].allocated) out.push_back({trace_.ids[i], buffers_[i].handle});
    }
    return out;
  }

  // --- cross-stream ordering the program would have written -------------------

  Result<void> order_after_writer(StreamId stream, Buffer& b) {
    if (strict_ || !b.last_write) return {};
    return wait_on(stream, *b.last_write);
  }

  Result<void> order_after_writers_and_readers(StreamId stream, Buffer& b) {
    if (strict_) return {};  // the trace's own waits order the streams
    FERRY_TRY(order_after_writer(stream, b));
    b.reads.retire(order_);
    std::vector<StreamPoint> reads(b.reads.points().begin(), b.reads.points().end());
    for (const StreamPoint& p : reads) FERRY_TRY(wait_on(stream, p));
    return {};
  }

  Result<void> wait_on(StreamId stream, StreamPoint point) {
    if (point.stream == stream || order_.is_complete(point)) return {};
    if (testing_hooks::dropped(testing_hooks::WaitSite::replay_runner)) return {};
    // A held producer would never reach the event: dispatch what it holds.
    if (backend_.held(point.stream)) FERRY_TRY(backend_.flush(point.stream));
    Result<Ticket> t = order_.order_after(stream, point);
    if (!t.ok()) return std::move(t).error();
    return {};
  }

  void wrote(Buffer& b, StreamPoint point, ExpectedBytes expected) {
    b.expected = std::move(expected);
    b.last_write = point;
    b.reads.clear();
  }

  // --- bookkeeping ---------------------------------------------------------------

  bool skip(const Buffer& b) {
    if (!b.failed) return false;
    skipped();
    return true;
  }
  void skipped() { ++report_.skipped; }

  template <class R>
  bool outcome(const TraceOp& op, const R& r) {
    if (r.ok()) return true;
    record(op, r.error());
    return false;
  }

  void record(const TraceOp& op, const Error& e) {
    const std::string code(to_string(e.code));
    ++report_.errors[code];
    if (e.code == ErrorCode::out_of_memory && report_.first_oom.line == 0) {
      report_.first_oom = {op.line, std::string(replay::to_string(op.kind)), code, e.message};
    }
    if (op.expect == e.code) {
      ++report_.expected_errors;
      return;
    }
    ++report_.unexpected_errors;
    add_problem(op.line, op, code, e.message);
  }

  void expect_success(const TraceOp& op) {
    if (!op.expect) return;
    ++report_.unexpected_successes;
    add_problem(op.line, op, "unexpected_success",
                "expected " + std::string(to_string(*op.expect)) + " but the op succeeded");
  }

  void add_problem(std::size_t line, const TraceOp& op, std::string what, std::string message) {
    add_problem(line, std::string(replay::to_string(op.kind)), std::move(what), std::move(message));
  }
  void add_problem(std::size_t line, std::string op, std::string what, std::string message) {
    if (report_.problems.size() >= ReplayReport::kMaxProblems) return;
    report_.problems.push_back({line, std::move(op), std::move(what), std::move(message)});
  }

  void fill_integrity() {
    const IntegrityCounters c = engine_->counters();
    ReplayIntegrity& i = report_.integrity;
    i.policy = engine_->policy();
    i.bytes_moved = c.bytes_moved;
    i.bytes_verified = c.bytes_verified;
    i.mismatches = c.mismatches;
    i.retries = c.retries;
    i.fallbacks = c.fallbacks;
    i.recovered = c.recovered;
    i.corrupt = c.corrupt;
    i.units_retired = c.units_retired;
    i.batched_disabled = c.batched_disabled;
    const BatchProbeReport probe = engine_->startup_probe();
    i.batch_probe = !probe.ran ? "not run" : probe.passed ? "passed" : "failed";
    i.batching_note = c.batched_disabled ? engine_->batching_disabled_reason() : probe.detail;
  }

  // Everything enqueued completes before the host buffers and the pool go away.
  void finish() {
    for (StreamId s = 0; s < kMaxStreams; ++s) {
      if (backend_.held(s)) backend_.set_hold(s, false);
    }
    if (Result<void> r = backend_.synchronize(); !r.ok()) {
      ++report_.errors[std::string(to_string(r.error().code))];
      ++report_.unexpected_errors;
      add_problem(0, "end", std::string(to_string(r.error().code)),
                  "synchronizing at the end of the trace: " + r.error().message);
    }
    for (Buffer& b : buffers_) {
      if (b.allocated) (void)pool_->free(b.handle);
      b.allocated = false;
    }
    copy_targets_.clear();
  }

  const Trace& trace_;
  Backend& backend_;
  StreamOrder order_;
  ReplayReport& report_;
  const bool strict_;
  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<HostArena> arena_;
  std::unique_ptr<TransferEngine> engine_;
  std::vector<Buffer> buffers_;
  // Host buffers handed to enqueued copies to host: each lives until its copy
  // completed (the op that waited for it drops it) or finish() synchronized.
  std::deque<std::vector<std::byte>> copy_targets_;
  const bool racing_;  // the backend checks races: keep what names their sides
  std::array<std::vector<WorkRun>, kMaxStreams> work_;
  // For an observer: which id's allocation last covered each byte, as disjoint
  // ranges start -> (end, id), so a pending-free block (or the part of one that
  // a same-stream reuse left) is still named after its id was freed.
  void name_owner(std::uint64_t start, std::uint64_t end, IdIndex id) {
    auto it = owners_.lower_bound(start);
    if (it != owners_.begin()) {
      auto before = std::prev(it);
      if (before->second.first > start) {  // an older range reaching into [start, end): keep its ends
        const auto [old_end, old_id] = before->second;
        before->second.first = start;
        if (old_end > end) owners_[end] = {old_end, old_id};
      }
    }
    for (it = owners_.lower_bound(start); it != owners_.end() && it->first < end;) {
      const auto [old_end, old_id] = it->second;
      it = owners_.erase(it);
      if (old_end > end) {
        owners_[end] = {old_end, old_id};
        break;
      }
    }
    owners_[start] = {end, id};
  }
  bool naming_owners_ = false;
  std::map<std::uint64_t, std::pair<std::uint64_t, IdIndex>> owners_;
};

Result<ReplayReport> run(const Trace& trace, const ReplayOptions& options) {
  ReplayReport report;
  report.trace = trace.name;
  report.seed = options.backend.seed;
  report.faults = describe(options.backend.faults);

  Result<std::unique_ptr<Backend>> made = make_backend(options.backend);
  if (!made.ok()) {
    Error e = std::move(made).error();
    e.message = "the " + std::string(to_string(options.backend.kind)) + " backend is not available: " + e.message;
    return e;
  }
  std::unique_ptr<Backend> backend = std::move(made).value();
  report.backend = std::string(to_string(backend->info().backend));
  report.modeled_time = backend->info().modeled_time;
  report.device = backend->info().device;

  {
    Replayer r(trace, *backend, report, options.strict);
    const std::uint64_t capacity =
        options.capacity != 0 || !options.trace_capacity ? options.capacity : trace.capacity.value_or(0);
    if (Result<void> s = r.setup(capacity, options.integrity); !s.ok()) {
      return std::move(s).error();
    }
    r.run(options.on_step);
  }
  return report;
}

}  // namespace

Result<ReplayReport> replay_trace_text(std::string_view text, std::string_view name,
                                       const ReplayOptions& options) {
  try {
    FERRY_TRY(check_spec(options.backend));  // before anything is parsed or run
    if (is_torch_snapshot(text)) {
      Result<TorchSnapshotImport> imported = import_torch_snapshot(text, name, options.snapshot_device);
      if (!imported.ok()) return std::move(imported).error();
      Result<Trace> trace = replay::parse_trace(imported->trace, name);
      if (!trace.ok()) return std::move(trace).error();
      Result<ReplayReport> report = run(*trace, options);
      if (report.ok()) report->source = imported->source;
      return report;
    }
    Result<Trace> trace = replay::parse_trace(text, name);
    if (!trace.ok()) return std::move(trace).error();
    return run(*trace, options);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::backend_error, std::string("replay failed: ") + e.what());
  }
}

Result<std::string> read_trace_file(const std::string& path) {
  return read_input_file(path, kMaxTraceBytes, "a trace");
}

Result<ReplayReport> replay_trace_file(const std::string& path, const ReplayOptions& options) {
  try {
    FERRY_TRY(check_spec(options.backend));  // before anything is parsed or run
    Result<std::string> text = read_trace_file(path);
    if (!text.ok()) return std::move(text).error();
    return replay_trace_text(*text, path, options);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::backend_error, std::string("replay failed: ") + e.what());
  }
}

}  // namespace ferry
